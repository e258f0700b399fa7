//! Rate limits shared through the store: one row per limit holding its
//! theoretical arrival time (GCRA, see [`rota_model::rate`]), taken by
//! [`Tasks::take_rate_slot`](crate::Tasks::take_rate_slot) in one
//! compare-and-set statement, so every process sharing the store draws
//! from the same budget.
//!
//! Deliberately left out: what a limit's key names (the engine's
//! business: `endpoint:…`, `queue:…`) and removing rows of limits no
//! longer used (a row is two columns; the set of endpoints and queues is
//! small).

use std::time::Duration;

use rota_model::Timestamp;
use rota_model::rate::{self, RateLimit, RateTake};

use crate::{Error, Result};

/// The longest key of a rate limit, in bytes.
pub const RATE_KEY_BYTES_MAX: usize = 512;
/// The longest a caller may offer to wait for a slot.
pub const RATE_WAIT_MAX_LIMIT: Duration = Duration::from_secs(3_600);

/// The answer of a take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateSlot {
    /// The call may start at `start` (now, or within the offered wait).
    Granted {
        /// When the call may start.
        start: Timestamp,
    },
    /// No slot within the offered wait; ask again at `retry_at`.
    Refused {
        /// When a take with the same wait would be granted if nobody else
        /// took meanwhile.
        retry_at: Timestamp,
    },
}

/// A request for a slot, checked before anything is written.
#[derive(Debug, Clone)]
pub struct RateRequest {
    /// The limit's name, shared by every caller of the same target.
    pub key: String,
    /// The rate and burst this caller applies.
    pub limit: RateLimit,
    /// How long the caller is ready to wait for its slot.
    pub wait_max: Duration,
}

impl RateRequest {
    /// Refuses an empty or oversized key and an out-of-bounds wait.
    pub fn check(&self) -> Result<()> {
        if self.key.is_empty() || self.key.len() > RATE_KEY_BYTES_MAX {
            return Err(Error::Invalid(format!("rate limit key must be 1 to {RATE_KEY_BYTES_MAX} bytes, got {}", self.key.len())));
        }
        if self.wait_max > RATE_WAIT_MAX_LIMIT {
            return Err(Error::Invalid(format!("rate limit wait must be at most {RATE_WAIT_MAX_LIMIT:?}, got {:?}", self.wait_max)));
        }
        Ok(())
    }

    /// The parameters a backend binds: now, the interval, the tolerance
    /// and the wait, all in microseconds.
    pub fn micros(&self, now: Timestamp) -> (i64, i64, i64, i64) {
        let limit = &self.limit;
        (rate::micros_of(now), limit.interval_us(), limit.tolerance_us(), rate::micros_of_duration(self.wait_max))
    }

    /// The slot of a granted take whose statement stored `tat_us` at `now`.
    pub fn granted(&self, tat_us: i64, now: Timestamp) -> RateSlot {
        let start_us = (tat_us - self.limit.tolerance_us()).max(rate::micros_of(now));
        RateSlot::Granted { start: rate::timestamp_at_or_after(start_us) }
    }

    /// The answer to a refused take, from the stored `tat_us` read after it.
    pub fn refused(&self, tat_us: Option<i64>, now: Timestamp) -> RateSlot {
        let (now_us, _, _, wait_us) = self.micros(now);
        let retry_us = match self.limit.take(tat_us, now_us, wait_us) {
            RateTake::Refused { retry_us } => retry_us,
            // Someone's slot came free between the two statements.
            RateTake::Granted { .. } => now_us,
        };
        RateSlot::Refused { retry_at: rate::timestamp_at_or_after(retry_us) }
    }
}
