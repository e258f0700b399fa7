//! Rate limits: how many calls may start per unit of time, shared by every
//! process that calls the same target.
//!
//! A [`RateLimit`] is written `N/s`, `N/m` or `N/h` with an optional burst
//! (how many calls may start at once after a quiet spell; 1 by default).
//! It is enforced as GCRA (the generic cell rate algorithm, a token bucket
//! kept as one time): the store keeps each limit's *theoretical arrival
//! time* `tat` in microseconds and [`RateLimit::take`] is the whole rule,
//! which both store backends apply in one compare-and-set statement.
//!
//! The guarantee: over any window of length `t`, at most
//! `t / interval + burst` calls start, that is `rate × t + burst`.
//!
//! Deliberately left out: which calls share a limit (the engine names it:
//! an endpoint, an agent queue) and what a caller does while it waits.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Timestamp;

/// The most calls per unit a limit may allow.
pub const CALLS_PER_UNIT_MAX: u32 = 1_000_000;
/// The largest burst a limit may allow.
pub const BURST_MAX: u32 = 100_000;

/// A rate limit: `calls` per `unit`, with `burst` calls allowed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RateLimitParts", into = "RateLimitParts")]
pub struct RateLimit {
    calls: u32,
    unit: RateUnit,
    burst: u32,
}

/// The unit of a rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RateUnit {
    /// Per second (`/s`).
    Second,
    /// Per minute (`/m`).
    Minute,
    /// Per hour (`/h`).
    Hour,
}

impl RateUnit {
    fn micros(self) -> u64 {
        match self {
            RateUnit::Second => 1_000_000,
            RateUnit::Minute => 60_000_000,
            RateUnit::Hour => 3_600_000_000,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            RateUnit::Second => "s",
            RateUnit::Minute => "m",
            RateUnit::Hour => "h",
        }
    }
}

/// Why a rate limit was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateLimitError {
    /// Not `N/s`, `N/m` or `N/h`.
    #[error("expected a rate such as \"20/s\", \"100/m\" or \"500/h\", got {0:?}")]
    Syntax(String),
    /// The count is 0 or too large.
    #[error("the rate must allow between 1 and {CALLS_PER_UNIT_MAX} calls per unit, got {0}")]
    Calls(u64),
    /// The burst is 0 or too large.
    #[error("the burst must be between 1 and {BURST_MAX}, got {0}")]
    Burst(u64),
}

impl RateLimit {
    /// `calls` per `unit`, one call at a time after a quiet spell.
    pub fn new(calls: u32, unit: RateUnit) -> Result<Self, RateLimitError> {
        if calls == 0 || calls > CALLS_PER_UNIT_MAX {
            return Err(RateLimitError::Calls(calls.into()));
        }
        Ok(RateLimit { calls, unit, burst: 1 })
    }

    /// The same rate allowing `burst` calls at once.
    pub fn with_burst(mut self, burst: u32) -> Result<Self, RateLimitError> {
        if burst == 0 || burst > BURST_MAX {
            return Err(RateLimitError::Burst(burst.into()));
        }
        self.burst = burst;
        Ok(self)
    }

    /// How many calls may start at once.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// The time between two calls at the steady rate, in microseconds,
    /// rounded up so that rounding never lets more calls through.
    pub fn interval_us(&self) -> i64 {
        self.unit.micros().div_ceil(u64::from(self.calls)) as i64
    }

    /// How far ahead of now the theoretical arrival time may run: `burst`
    /// intervals.
    pub fn tolerance_us(&self) -> i64 {
        self.interval_us() * i64::from(self.burst)
    }

    /// GCRA: a call asking at `now_us` whose caller would wait at most
    /// `wait_max_us`, against the stored theoretical arrival time `tat_us`
    /// (`None`: never taken). Granted: the new `tat_us` to store and when
    /// the call may start (at most `wait_max_us` from now). Refused: when a
    /// call could next be granted with the same wait.
    ///
    /// The store backends write this same rule in SQL; the conformance
    /// suite checks that they agree with it.
    pub fn take(&self, tat_us: Option<i64>, now_us: i64, wait_max_us: i64) -> RateTake {
        let base = tat_us.map_or(now_us, |tat| tat.max(now_us));
        let tat = base + self.interval_us();
        let start = (tat - self.tolerance_us()).max(now_us);
        if start - now_us <= wait_max_us {
            RateTake::Granted { tat_us: tat, start_us: start }
        } else {
            RateTake::Refused { retry_us: start - wait_max_us }
        }
    }
}

/// The result of [`RateLimit::take`], in microseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateTake {
    /// The call may start at `start_us`; `tat_us` is stored.
    Granted {
        /// The limit's new theoretical arrival time.
        tat_us: i64,
        /// When the call may start.
        start_us: i64,
    },
    /// No slot within the wait; ask again at `retry_us`.
    Refused {
        /// When a take with the same wait would be granted, if nobody else
        /// takes meanwhile.
        retry_us: i64,
    },
}

/// Microseconds since the epoch of a [`Timestamp`].
pub fn micros_of(at: Timestamp) -> i64 {
    at.as_millis().saturating_mul(1_000)
}

/// The first [`Timestamp`] (whole milliseconds) at or after `micros`.
pub fn timestamp_at_or_after(micros: i64) -> Timestamp {
    Timestamp::from_millis(micros.div_euclid(1_000) + i64::from(micros.rem_euclid(1_000) != 0))
}

/// A wait as microseconds, saturating.
pub fn micros_of_duration(wait: Duration) -> i64 {
    i64::try_from(wait.as_micros()).unwrap_or(i64::MAX)
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.calls, self.unit.suffix())
    }
}

impl FromStr for RateLimit {
    type Err = RateLimitError;

    /// `N/s`, `N/m` or `N/h` (also `second`, `minute`, `hour`), burst 1.
    fn from_str(text: &str) -> Result<Self, RateLimitError> {
        let syntax = || RateLimitError::Syntax(text.to_owned());
        let (count, unit) = text.trim().split_once('/').ok_or_else(syntax)?;
        let unit = match unit.trim() {
            "s" | "sec" | "second" => RateUnit::Second,
            "m" | "min" | "minute" => RateUnit::Minute,
            "h" | "hour" => RateUnit::Hour,
            _ => return Err(syntax()),
        };
        let count: u64 = count.trim().parse().map_err(|_| syntax())?;
        let calls = u32::try_from(count).map_err(|_| RateLimitError::Calls(count))?;
        RateLimit::new(calls, unit)
    }
}

/// The stored form: `{"rate": "20/s", "burst": 5}`.
#[derive(Serialize, Deserialize)]
struct RateLimitParts {
    rate: String,
    burst: u32,
}

impl TryFrom<RateLimitParts> for RateLimit {
    type Error = RateLimitError;
    fn try_from(parts: RateLimitParts) -> Result<Self, RateLimitError> {
        parts.rate.parse::<RateLimit>()?.with_burst(parts.burst)
    }
}

impl From<RateLimit> for RateLimitParts {
    fn from(limit: RateLimit) -> Self {
        RateLimitParts { rate: limit.to_string(), burst: limit.burst }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn check(text: &str) -> Result<(i64, u32), RateLimitError> {
        text.parse::<RateLimit>().map(|limit| (limit.interval_us(), limit.burst()))
    }

    #[test]
    fn rates_parse_and_print() {
        assert_eq!(check("20/s"), Ok((50_000, 1)));
        assert_eq!(check(" 3 / second"), Ok((333_334, 1)), "rounded up: never faster than asked");
        assert_eq!(check("100/m"), Ok((600_000, 1)));
        assert_eq!(check("1/h"), Ok((3_600_000_000, 1)));
        assert_eq!("20/sec".parse::<RateLimit>().unwrap().to_string(), "20/s");
        assert_eq!(check("0/s"), Err(RateLimitError::Calls(0)));
        assert_eq!(check("20"), Err(RateLimitError::Syntax("20".into())));
        assert_eq!(check("20/d"), Err(RateLimitError::Syntax("20/d".into())));
        assert!(check("99999999999/s").is_err());
        assert!("20/s".parse::<RateLimit>().unwrap().with_burst(0).is_err());
        let limit = "20/s".parse::<RateLimit>().unwrap().with_burst(5).unwrap();
        let json = serde_json::to_string(&limit).unwrap();
        assert_eq!(json, r#"{"rate":"20/s","burst":5}"#);
        assert_eq!(serde_json::from_str::<RateLimit>(&json).unwrap(), limit);
        assert!(serde_json::from_str::<RateLimit>(r#"{"rate":"20/s","burst":0}"#).is_err());
    }

    #[test]
    fn a_burst_goes_at_once_then_the_steady_rate() {
        let limit = "10/s".parse::<RateLimit>().unwrap().with_burst(3).unwrap();
        let mut tat = None;
        let mut starts = Vec::new();
        for _ in 0..5 {
            match limit.take(tat, 0, 1_000_000) {
                RateTake::Granted { tat_us, start_us } => {
                    tat = Some(tat_us);
                    starts.push(start_us);
                }
                RateTake::Refused { .. } => panic!("a second's wait covers five calls at 10/s"),
            }
        }
        assert_eq!(starts, [0, 0, 0, 100_000, 200_000]);
        assert_eq!(limit.take(tat, 0, 0), RateTake::Refused { retry_us: 300_000 });
    }

    proptest! {
        /// Whatever the order and timing of takes, the starts in any window
        /// of length `t` number at most `t / interval + burst`.
        #[test]
        fn no_window_holds_more_than_rate_times_t_plus_burst(
            calls in 1u32..50, burst in 1u32..6, gaps in proptest::collection::vec(0i64..80_000, 1..200), wait_max in 0i64..300_000,
        ) {
            let limit = RateLimit::new(calls, RateUnit::Second).unwrap().with_burst(burst).unwrap();
            let (mut now, mut tat, mut starts) = (0i64, None, Vec::new());
            for gap in gaps {
                now += gap;
                if let RateTake::Granted { tat_us, start_us } = limit.take(tat, now, wait_max) {
                    prop_assert!(start_us >= now && start_us - now <= wait_max);
                    tat = Some(tat_us);
                    starts.push(start_us);
                }
            }
            starts.sort_unstable();
            let interval = limit.interval_us();
            for (i, first) in starts.iter().enumerate() {
                for window in [interval, 10 * interval, 1_000_000] {
                    let inside = starts[i..].iter().take_while(|s| **s < first + window).count() as i64;
                    prop_assert!(inside <= window / interval + i64::from(burst), "{inside} starts in {window} us");
                }
            }
        }
    }
}
