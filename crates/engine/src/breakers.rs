//! Circuit breakers shared through the store, as the agents use them: one
//! [`SharedBreakers`] per engine asks and reports to the store's breaker
//! rows ([`rota_store::breaker`]) and caches each endpoint's row for a
//! short while, so that calls to a healthy endpoint cost no store round
//! trip.
//!
//! - Asking: while a fresh cached row (read within
//!   [`SharedBreakerConfig::cache_for`]) shows the breaker closed, the call
//!   goes; while it shows it open, the call is held until `open_until`.
//!   Otherwise the store is asked, in one statement, and may make the call
//!   the breaker's probe.
//! - Reporting: a transient failure is always written (failures from every
//!   process add up); a success only when the cached row shows something
//!   to reset (failures, open, half-open) or the call was the probe; a
//!   probe cut short hands its lease back.
//! - A held call behind a probe asks again every
//!   [`SharedBreakerConfig::recheck`] (or when the probe's lease ends, if
//!   sooner), so held work is released soon after the probe closes the
//!   breaker.
//!
//! With shared breakers on, the agents' own in-process breakers are not
//! used (the retry loop calls [`rota_agent::Agent::call_unguarded`]):
//! an in-process breaker would fail calls fast, spending tries and
//! counting failures, which is what holding avoids.
//!
//! Deliberately left out: a count of the requests held (each held request
//! is a delayed message of the agent's queue; counting them per endpoint
//! would mean reading every body).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rota_agent::{Health, Hold};
use rota_model::{Clock, InstanceId, Timestamp};
use rota_store::breaker::{BREAKER_FAILURES_TO_OPEN_LIMIT, BREAKER_OPEN_FOR_LIMIT, BREAKER_PROBE_LEASE_LIMIT};
use rota_store::{BreakerAdmission, BreakerAsk, BreakerReport, BreakerResult, SharedBreaker, SharedBreakerState, SharedStore};

use crate::{Error, Result};

/// The default of [`SharedBreakerConfig::cache_for`].
pub const CACHE_FOR_DEFAULT: Duration = Duration::from_secs(1);
/// The longest [`SharedBreakerConfig::cache_for`] accepted.
pub const CACHE_FOR_MAX: Duration = Duration::from_secs(60);
/// The default of [`SharedBreakerConfig::recheck`].
pub const RECHECK_DEFAULT: Duration = Duration::from_secs(1);
/// The shortest [`SharedBreakerConfig::recheck`] accepted: a held request
/// is written again at every recheck.
pub const RECHECK_MIN: Duration = Duration::from_millis(10);
/// The longest [`SharedBreakerConfig::recheck`] accepted.
pub const RECHECK_MAX: Duration = Duration::from_secs(60);
/// The most endpoints whose rows one process caches; past it, rows read
/// longer ago than `cache_for` are dropped first.
pub const CACHED_ENDPOINTS_MAX: usize = 10_000;

/// When shared breakers open, for how long, and how a process uses them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedBreakerConfig {
    /// Transient failures in a row, from every process, that open a
    /// breaker (1..1000).
    pub failures_to_open: u32,
    /// How long an open breaker holds calls before one probe may go
    /// (1 ms..24 h).
    pub open_for: Duration,
    /// How long a probe keeps the right to decide; after it, another
    /// process may probe (1 ms..1 h). Longer than a call takes.
    pub probe_lease: Duration,
    /// How long a process trusts its copy of a row (0..1 m): the longest a
    /// process goes on calling after another opened the breaker, and how
    /// often a closed breaker costs a store round trip.
    pub cache_for: Duration,
    /// How often a call held behind another process's probe asks again
    /// (10 ms..1 m).
    pub recheck: Duration,
}

impl Default for SharedBreakerConfig {
    /// Open after 5 failures for 10 s (as the in-process default), a 30 s
    /// probe lease, rows cached for 1 s, held calls rechecking every 1 s.
    fn default() -> Self {
        SharedBreakerConfig {
            failures_to_open: 5,
            open_for: Duration::from_secs(10),
            probe_lease: Duration::from_secs(30),
            cache_for: CACHE_FOR_DEFAULT,
            recheck: RECHECK_DEFAULT,
        }
    }
}

impl SharedBreakerConfig {
    /// Checks every bound; the error names the field.
    pub fn validate(&self) -> Result<()> {
        let human = humantime::format_duration;
        let out = |field: &'static str, why: String| Err(Error::OutOfBounds { field, why });
        if !(1..=BREAKER_FAILURES_TO_OPEN_LIMIT).contains(&self.failures_to_open) {
            return out(
                "breakers.failures_to_open",
                format!("must be between 1 and {BREAKER_FAILURES_TO_OPEN_LIMIT}, got {}", self.failures_to_open),
            );
        }
        if self.open_for.is_zero() || self.open_for > BREAKER_OPEN_FOR_LIMIT {
            return out(
                "breakers.open_for",
                format!("must be between 1ms and {}, got {}", human(BREAKER_OPEN_FOR_LIMIT), human(self.open_for)),
            );
        }
        if self.probe_lease.is_zero() || self.probe_lease > BREAKER_PROBE_LEASE_LIMIT {
            let why = format!("must be between 1ms and {}, got {}", human(BREAKER_PROBE_LEASE_LIMIT), human(self.probe_lease));
            return out("breakers.probe_lease", why);
        }
        if self.cache_for > CACHE_FOR_MAX {
            return out("breakers.cache_for", format!("must be at most {}, got {}", human(CACHE_FOR_MAX), human(self.cache_for)));
        }
        if !(RECHECK_MIN..=RECHECK_MAX).contains(&self.recheck) {
            let why = format!("must be between {} and {}, got {}", human(RECHECK_MIN), human(RECHECK_MAX), human(self.recheck));
            return out("breakers.recheck", why);
        }
        Ok(())
    }
}

/// A process's view of the shared breakers: asks, reports and a short
/// cache of rows.
pub struct SharedBreakers {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    config: SharedBreakerConfig,
    instance: InstanceId,
    // A std mutex: held for a map lookup, never across an await.
    cache: Mutex<HashMap<String, Cached>>,
}

impl std::fmt::Debug for SharedBreakers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBreakers").field("config", &self.config).field("instance", &self.instance).finish_non_exhaustive()
    }
}

/// A row as last read (`None`: no row, a clean closed breaker), and when.
#[derive(Debug, Clone)]
struct Cached {
    row: Option<SharedBreaker>,
    read_at: Timestamp,
}

/// What an ask let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// An ordinary call of a closed breaker.
    Call,
    /// The breaker's one probe.
    Probe,
}

impl SharedBreakers {
    /// Shared breakers of `instance`'s calls, in `store`.
    pub fn new(store: SharedStore, clock: Arc<dyn Clock>, config: SharedBreakerConfig, instance: InstanceId) -> Self {
        SharedBreakers { store, clock, config, instance, cache: Mutex::new(HashMap::new()) }
    }

    /// The configuration.
    pub fn config(&self) -> &SharedBreakerConfig {
        &self.config
    }

    /// The holder name of one call: this instance and the call, so that
    /// two calls of one process are told apart.
    pub fn holder(&self, call: &str) -> String {
        let mut holder = format!("{} {call}", self.instance);
        if holder.len() > rota_store::breaker::BREAKER_HOLDER_BYTES_MAX {
            let mut end = rota_store::breaker::BREAKER_HOLDER_BYTES_MAX;
            while !holder.is_char_boundary(end) {
                end -= 1;
            }
            holder.truncate(end);
        }
        holder
    }

    /// Asks the breaker `key` for one call by `holder`: a permit, or the
    /// hold (until when to ask again). A store that does not answer lets
    /// the call go: a breaker protects the endpoint, and the call's reply
    /// needs the store anyway.
    pub async fn admit(&self, key: &str, holder: &str) -> std::result::Result<Permit, Hold> {
        let now = self.clock.now();
        if let Some(cached) = self.cached(key, now) {
            match &cached {
                None => return Ok(Permit::Call),
                Some(row) if row.state == SharedBreakerState::Closed => return Ok(Permit::Call),
                Some(row) => {
                    if let Some(until) = row.open_until.filter(|until| *until > now) {
                        return Err(self.hold(key, row, until, now));
                    }
                    if let Some(until) = row.probe_until.filter(|until| *until > now && row.probe_holder.as_deref() != Some(holder)) {
                        return Err(self.hold(key, row, until, now));
                    }
                }
            }
        }
        let ask = BreakerAsk { key: key.to_owned(), holder: holder.to_owned(), probe_lease: self.config.probe_lease };
        let (admission, row) = match self.store.admit_breaker(&ask).await {
            Ok(answer) => answer,
            Err(err) => {
                tracing::warn!(key, "the shared circuit breaker could not be read; the call goes: {err}");
                return Ok(Permit::Call);
            }
        };
        self.remember(key, row.clone(), now);
        match admission {
            BreakerAdmission::Go => Ok(Permit::Call),
            BreakerAdmission::Probe { .. } => {
                tracing::info!(key, holder, "circuit breaker half-open: this call is the probe");
                Ok(Permit::Probe)
            }
            BreakerAdmission::Hold { until } => match row {
                Some(row) => Err(self.hold(key, &row, until, now)),
                None => Ok(Permit::Call),
            },
        }
    }

    /// Reports a call's `health` to the breaker `key`, writing only what
    /// changes something.
    pub async fn report(&self, key: &str, holder: &str, permit: Permit, health: Health) {
        let now = self.clock.now();
        let probe = permit == Permit::Probe;
        let result = match health {
            Health::Failing => BreakerResult::Failure,
            Health::Up => {
                let cached_clean = self.cached(key, now).is_some_and(|row| row.as_ref().is_none_or(SharedBreaker::is_clean));
                if cached_clean && !probe {
                    return;
                }
                BreakerResult::Success
            }
            Health::Unknown if probe => BreakerResult::Abandoned,
            Health::Unknown => return,
        };
        let report = BreakerReport {
            key: key.to_owned(),
            holder: holder.to_owned(),
            probe,
            result,
            failures_to_open: self.config.failures_to_open,
            open_for: self.config.open_for,
        };
        match self.store.report_breaker(&report).await {
            Ok(row) => {
                if row
                    .as_ref()
                    .is_some_and(|row| row.state == SharedBreakerState::Open && row.updated_at == now && result == BreakerResult::Failure)
                {
                    tracing::warn!(key, until = ?row.as_ref().and_then(|r| r.open_until), "shared circuit breaker open");
                } else if probe && result == BreakerResult::Success {
                    tracing::info!(key, "shared circuit breaker closed after a successful probe");
                }
                self.remember(key, row, now);
            }
            Err(err) => tracing::warn!(key, "could not report to the shared circuit breaker: {err}"),
        }
    }

    /// The hold of a call that found `row` not letting it through until
    /// `until`: behind another's probe, ask again within a recheck.
    fn hold(&self, key: &str, row: &SharedBreaker, until: Timestamp, now: Timestamp) -> Hold {
        let recheck = now + self.config.recheck;
        let until = if until <= now {
            recheck
        } else if row.state == SharedBreakerState::HalfOpen {
            until.min(recheck)
        } else {
            until
        };
        Hold { until, reason: format!("circuit breaker {key} is {}", row.state) }
    }

    /// The fresh cached row of `key`, if any (`Some(None)`: known to have
    /// no row).
    fn cached(&self, key: &str, now: Timestamp) -> Option<Option<SharedBreaker>> {
        let cache = self.lock();
        let cached = cache.get(key)?;
        (cached.read_at <= now && now.since(cached.read_at) < self.config.cache_for).then(|| cached.row.clone())
    }

    fn remember(&self, key: &str, row: Option<SharedBreaker>, now: Timestamp) {
        let mut cache = self.lock();
        if cache.len() >= CACHED_ENDPOINTS_MAX && !cache.contains_key(key) {
            let cache_for = self.config.cache_for;
            cache.retain(|_, cached| now.since(cached.read_at) < cache_for);
        }
        if cache.len() < CACHED_ENDPOINTS_MAX || cache.contains_key(key) {
            cache.insert(key.to_owned(), Cached { row, read_at: now });
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cached>> {
        // Each change is one insert: a poisoned map is still sound.
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The shared breaker of one request's tries: asks before each try and
/// reports after it, remembering whether the try was the probe.
pub(crate) struct BreakerGate<'a> {
    pub(crate) breakers: &'a SharedBreakers,
    pub(crate) key: String,
    pub(crate) holder: String,
    /// Whether the current try is the breaker's probe.
    pub(crate) probe: AtomicBool,
}

impl BreakerGate<'_> {
    pub(crate) async fn admit(&self) -> std::result::Result<(), Hold> {
        let permit = self.breakers.admit(&self.key, &self.holder).await?;
        self.probe.store(permit == Permit::Probe, Ordering::Relaxed);
        Ok(())
    }

    pub(crate) async fn report(&self, health: Health) {
        let permit = if self.probe.swap(false, Ordering::Relaxed) { Permit::Probe } else { Permit::Call };
        self.breakers.report(&self.key, &self.holder, permit, health).await;
    }

    /// The try this gate let through will not go (another gate held it):
    /// a probe hands its lease back.
    pub(crate) async fn withdraw(&self) {
        if self.probe.load(Ordering::Relaxed) {
            self.report(Health::Unknown).await;
        }
    }
}
