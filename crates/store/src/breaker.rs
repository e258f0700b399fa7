//! Circuit breakers shared through the store: one row per breaker key
//! (`endpoint:scheme://host:port`) holding its state, its consecutive
//! transient failures, until when it stays open, and the lease of the one
//! probe call of a half-open breaker. Every process calling the endpoint
//! reads and moves the same row, each move one compare-and-set statement:
//!
//! - [`Tasks::admit_breaker`](crate::Tasks::admit_breaker): closed (or no
//!   row) → go; open before `open_until` → hold until then; open after it
//!   → take the probe lease if it is free or expired (go as the probe),
//!   else hold until the lease ends. At most one probe per breaker holds a
//!   live lease at a time.
//! - [`Tasks::report_breaker`](crate::Tasks::report_breaker): a success
//!   closes a closed breaker's count, or the whole breaker when it is the
//!   current probe's; a transient failure counts up a closed breaker and
//!   opens it at `failures_to_open`, and re-opens a half-open breaker when
//!   it is the current probe's; an abandoned probe hands its lease back.
//!   Results of calls let through before the breaker opened change nothing
//!   (only the probe decides).
//!
//! Deliberately left out: what counts as a failure (the agent's
//! classification) and caching (the engine reads a row at most once per
//! short interval while it is closed).

use std::fmt;
use std::time::Duration;

use rota_model::Timestamp;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The longest key of a shared breaker, in bytes.
pub const BREAKER_KEY_BYTES_MAX: usize = 512;
/// The longest probe holder name, in bytes.
pub const BREAKER_HOLDER_BYTES_MAX: usize = 512;
/// The most consecutive failures a shared breaker may be set to tolerate.
pub const BREAKER_FAILURES_TO_OPEN_LIMIT: u32 = 1_000;
/// The longest a shared breaker may be set to stay open.
pub const BREAKER_OPEN_FOR_LIMIT: Duration = Duration::from_secs(24 * 3600);
/// The longest probe lease accepted.
pub const BREAKER_PROBE_LEASE_LIMIT: Duration = Duration::from_secs(3600);

/// The state of a shared breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SharedBreakerState {
    /// Calls go through.
    Closed,
    /// Calls are held until `open_until`.
    Open,
    /// One probe decides; the other calls are held.
    HalfOpen,
}

impl SharedBreakerState {
    /// `"closed"`, `"open"` or `"half_open"`, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            SharedBreakerState::Closed => "closed",
            SharedBreakerState::Open => "open",
            SharedBreakerState::HalfOpen => "half_open",
        }
    }

    /// The state a stored text names.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "closed" => Ok(SharedBreakerState::Closed),
            "open" => Ok(SharedBreakerState::Open),
            "half_open" => Ok(SharedBreakerState::HalfOpen),
            other => Err(Error::Backend(format!("stored breaker state is invalid: {other:?}"))),
        }
    }
}

impl fmt::Display for SharedBreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One shared breaker's row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedBreaker {
    /// `endpoint:scheme://host:port`.
    pub key: String,
    /// Closed, open or half-open.
    pub state: SharedBreakerState,
    /// Transient failures in a row, from every process (kept while open).
    pub consecutive_failures: u32,
    /// When an open breaker lets a probe through.
    pub open_until: Option<Timestamp>,
    /// Who holds the probe lease of a half-open breaker.
    pub probe_holder: Option<String>,
    /// When that lease ends (another process may take the probe then).
    pub probe_until: Option<Timestamp>,
    /// When the row last changed.
    pub updated_at: Timestamp,
}

impl SharedBreaker {
    /// Whether the row says nothing a closed, clean breaker would not: a
    /// success need not be reported to it.
    pub fn is_clean(&self) -> bool {
        self.state == SharedBreakerState::Closed && self.consecutive_failures == 0
    }
}

/// A request to make one call through a shared breaker.
#[derive(Debug, Clone)]
pub struct BreakerAsk {
    /// The breaker's key.
    pub key: String,
    /// Who asks (the probe holder if it becomes the probe): the instance
    /// and the call, so that two calls of one process are told apart.
    pub holder: String,
    /// How long a probe lease lasts: after it, another process may probe.
    pub probe_lease: Duration,
}

impl BreakerAsk {
    /// Refuses an empty or oversized key or holder and an unbounded lease.
    pub fn check(&self) -> Result<()> {
        check_key_and_holder(&self.key, &self.holder)?;
        if self.probe_lease.is_zero() || self.probe_lease > BREAKER_PROBE_LEASE_LIMIT {
            return Err(Error::Invalid(format!(
                "breaker probe lease must be between 1 ms and {BREAKER_PROBE_LEASE_LIMIT:?}, got {:?}",
                self.probe_lease
            )));
        }
        Ok(())
    }

    /// The answer to this ask, from the row as it was before the ask
    /// (`None`: no row) and whether the ask took the probe lease.
    pub fn answer(&self, before: Option<&SharedBreaker>, took_probe: bool, now: Timestamp) -> BreakerAdmission {
        if took_probe {
            return BreakerAdmission::Probe { lease_until: now + self.probe_lease };
        }
        let Some(row) = before else { return BreakerAdmission::Go };
        match row.state {
            SharedBreakerState::Closed => BreakerAdmission::Go,
            _ => match (row.open_until, row.probe_until) {
                (Some(until), _) if now < until => BreakerAdmission::Hold { until },
                (_, Some(until)) if now < until => BreakerAdmission::Hold { until },
                // Another ask took the probe between our read and our
                // write: ask again soon.
                _ => BreakerAdmission::Hold { until: now },
            },
        }
    }
}

/// What a shared breaker answered to an ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerAdmission {
    /// Closed: the call may go.
    Go,
    /// The call may go as the breaker's one probe; its result decides.
    Probe {
        /// When the probe lease ends.
        lease_until: Timestamp,
    },
    /// Open, or a probe is out: hold the call until `until`.
    Hold {
        /// When to ask again.
        until: Timestamp,
    },
}

/// What one call said about the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerResult {
    /// The endpoint answered (a success, or a 4xx).
    Success,
    /// A transient failure of the endpoint (5xx, timeout, connection).
    Failure,
    /// The call said nothing about the endpoint (its own deadline cut it,
    /// or it was held before it went): a probe hands its lease back.
    Abandoned,
}

/// A call's result, reported to its breaker.
#[derive(Debug, Clone)]
pub struct BreakerReport {
    /// The breaker's key.
    pub key: String,
    /// Who made the call (as asked with).
    pub holder: String,
    /// Whether the call was the breaker's probe.
    pub probe: bool,
    /// What the call said.
    pub result: BreakerResult,
    /// Consecutive failures that open a closed breaker.
    pub failures_to_open: u32,
    /// How long a breaker that opens stays open.
    pub open_for: Duration,
}

impl BreakerReport {
    /// Refuses out-of-bounds settings.
    pub fn check(&self) -> Result<()> {
        check_key_and_holder(&self.key, &self.holder)?;
        if self.failures_to_open == 0 || self.failures_to_open > BREAKER_FAILURES_TO_OPEN_LIMIT {
            return Err(Error::Invalid(format!(
                "breaker failures_to_open must be between 1 and {BREAKER_FAILURES_TO_OPEN_LIMIT}, got {}",
                self.failures_to_open
            )));
        }
        if self.open_for.is_zero() || self.open_for > BREAKER_OPEN_FOR_LIMIT {
            return Err(Error::Invalid(format!("breaker open_for must be between 1 ms and 24 h, got {:?}", self.open_for)));
        }
        Ok(())
    }

    /// `open_for` in whole milliseconds, at least one.
    pub fn open_for_ms(&self) -> i64 {
        i64::try_from(self.open_for.as_millis()).unwrap_or(i64::MAX).max(1)
    }
}

fn check_key_and_holder(key: &str, holder: &str) -> Result<()> {
    if key.is_empty() || key.len() > BREAKER_KEY_BYTES_MAX {
        return Err(Error::Invalid(format!("breaker key must be 1 to {BREAKER_KEY_BYTES_MAX} bytes, got {}", key.len())));
    }
    if holder.is_empty() || holder.len() > BREAKER_HOLDER_BYTES_MAX {
        return Err(Error::Invalid(format!("breaker holder must be 1 to {BREAKER_HOLDER_BYTES_MAX} bytes, got {}", holder.len())));
    }
    Ok(())
}

/// Milliseconds of a lease, at least one.
pub fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX).max(1)
}
