//! The retry policy: how many attempts a step gets and how long to wait
//! between them (exponential backoff with a cap and seeded jitter).
//!
//! The base delay and the jitter are separate functions so that tests can
//! check each alone, and so that the randomness always comes from an
//! injected, seedable RNG.

use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// The most attempts any policy may allow. A bound keeps a misconfigured
/// policy from retrying forever.
pub const ATTEMPTS_MAX_LIMIT: u32 = 1_000;

/// Why a retry policy was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RetryPolicyError {
    /// `attempts_max` was 0 or above [`ATTEMPTS_MAX_LIMIT`].
    #[error("attempts must be between 1 and {ATTEMPTS_MAX_LIMIT}, got {0}")]
    Attempts(u32),
    /// The cap is below the first delay.
    #[error("max backoff ({max:?}) is shorter than the initial backoff ({initial:?})")]
    CapBelowInitial {
        /// The initial backoff.
        initial: Duration,
        /// The cap.
        max: Duration,
    },
    /// The multiplier is below 1 or not a number.
    #[error("backoff multiplier must be a number >= 1, got {0}")]
    Multiplier(f64),
    /// The jitter fraction is outside 0..=1.
    #[error("jitter must be between 0 and 1, got {0}")]
    Jitter(f64),
}

/// How often to try, and how long to wait between tries.
///
/// Attempt numbers start at 1. The wait before attempt `n + 1` is
/// `min(backoff_initial * multiplier^(n-1), backoff_max)`, then jittered
/// down by up to `jitter` of itself ("equal jitter": with the default 0.5 the
/// delay lands in `[base/2, base]`), which spreads retries of many tasks that
/// failed together without ever exceeding the cap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RetryPolicyFields", into = "RetryPolicyFields")]
pub struct RetryPolicy {
    attempts_max: u32,
    backoff_initial: Duration,
    backoff_max: Duration,
    multiplier: f64,
    jitter: f64,
}

/// The serialized shape of a [`RetryPolicy`]; deserializing validates it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RetryPolicyFields {
    attempts_max: u32,
    backoff_initial_ms: u64,
    backoff_max_ms: u64,
    multiplier: f64,
    jitter: f64,
}

impl TryFrom<RetryPolicyFields> for RetryPolicy {
    type Error = RetryPolicyError;
    fn try_from(f: RetryPolicyFields) -> Result<Self, RetryPolicyError> {
        RetryPolicy::new(f.attempts_max, Duration::from_millis(f.backoff_initial_ms), Duration::from_millis(f.backoff_max_ms))?
            .with_multiplier(f.multiplier)?
            .with_jitter_fraction(f.jitter)
    }
}

impl From<RetryPolicy> for RetryPolicyFields {
    fn from(p: RetryPolicy) -> Self {
        RetryPolicyFields {
            attempts_max: p.attempts_max,
            backoff_initial_ms: u64::try_from(p.backoff_initial.as_millis()).unwrap_or(u64::MAX),
            backoff_max_ms: u64::try_from(p.backoff_max.as_millis()).unwrap_or(u64::MAX),
            multiplier: p.multiplier,
            jitter: p.jitter,
        }
    }
}

impl Default for RetryPolicy {
    /// 5 attempts, 100 ms doubling up to 10 s, half jitter.
    fn default() -> Self {
        RetryPolicy {
            attempts_max: 5,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            multiplier: 2.0,
            jitter: 0.5,
        }
    }
}

impl RetryPolicy {
    /// A policy with the default multiplier (2) and jitter (0.5).
    pub fn new(attempts_max: u32, backoff_initial: Duration, backoff_max: Duration) -> Result<Self, RetryPolicyError> {
        if attempts_max == 0 || attempts_max > ATTEMPTS_MAX_LIMIT {
            return Err(RetryPolicyError::Attempts(attempts_max));
        }
        if backoff_max < backoff_initial {
            return Err(RetryPolicyError::CapBelowInitial { initial: backoff_initial, max: backoff_max });
        }
        Ok(RetryPolicy { attempts_max, backoff_initial, backoff_max, ..RetryPolicy::default() })
    }

    /// The same policy with another growth factor per attempt.
    pub fn with_multiplier(mut self, multiplier: f64) -> Result<Self, RetryPolicyError> {
        if !multiplier.is_finite() || multiplier < 1.0 {
            return Err(RetryPolicyError::Multiplier(multiplier));
        }
        self.multiplier = multiplier;
        Ok(self)
    }

    /// The same policy with another jitter fraction (0 = none, 1 = "full jitter").
    pub fn with_jitter_fraction(mut self, jitter: f64) -> Result<Self, RetryPolicyError> {
        if !(0.0..=1.0).contains(&jitter) {
            return Err(RetryPolicyError::Jitter(jitter));
        }
        self.jitter = jitter;
        Ok(self)
    }

    /// The most attempts, the first included.
    pub fn attempts_max(&self) -> u32 {
        self.attempts_max
    }

    /// The first delay.
    pub fn backoff_initial(&self) -> Duration {
        self.backoff_initial
    }

    /// The cap on any delay.
    pub fn backoff_max(&self) -> Duration {
        self.backoff_max
    }

    /// Whether another attempt may follow attempt number `attempt` (1-based).
    pub fn allows_after(&self, attempt: u32) -> bool {
        attempt < self.attempts_max
    }

    /// The delay before the attempt after `attempt`, before jitter.
    pub fn backoff_base(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(1_000) as i32;
        let initial = self.backoff_initial.as_secs_f64();
        let grown = initial * self.multiplier.powi(exponent);
        let capped = grown.min(self.backoff_max.as_secs_f64());
        // `capped` is finite and within [initial, max] here, so the conversion cannot fail.
        Duration::try_from_secs_f64(capped).unwrap_or(self.backoff_max)
    }

    /// `delay` shortened by a random part of up to `jitter` of itself.
    pub fn with_jitter(&self, delay: Duration, rng: &mut impl Rng) -> Duration {
        if self.jitter == 0.0 || delay.is_zero() {
            return delay;
        }
        let cut: f64 = rng.random_range(0.0..=self.jitter);
        delay.mul_f64(1.0 - cut)
    }

    /// The jittered delay before the attempt after `attempt`.
    pub fn delay_after(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        self.with_jitter(self.backoff_base(attempt), rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn policy(attempts: u32, initial_ms: u64, max_ms: u64) -> RetryPolicy {
        RetryPolicy::new(attempts, Duration::from_millis(initial_ms), Duration::from_millis(max_ms)).unwrap()
    }

    #[test]
    fn backoff_doubles_then_caps() {
        let p = policy(10, 100, 1_000);
        let delays: Vec<u128> = (1..=6).map(|a| p.backoff_base(a).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1_000, 1_000]);
    }

    #[test]
    fn invalid_policies_are_refused_with_a_reason() {
        assert_eq!(RetryPolicy::new(0, Duration::ZERO, Duration::ZERO), Err(RetryPolicyError::Attempts(0)));
        assert!(matches!(
            RetryPolicy::new(3, Duration::from_secs(2), Duration::from_secs(1)),
            Err(RetryPolicyError::CapBelowInitial { .. })
        ));
        assert!(RetryPolicy::default().with_multiplier(0.5).is_err());
        assert!(RetryPolicy::default().with_multiplier(f64::NAN).is_err());
        assert!(RetryPolicy::default().with_jitter_fraction(1.5).is_err());
    }

    #[test]
    fn serde_round_trip_validates() {
        let p = policy(4, 50, 800);
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<RetryPolicy>(&json).unwrap(), p);
        let bad = r#"{"attempts_max":0,"backoff_initial_ms":1,"backoff_max_ms":2,"multiplier":2.0,"jitter":0.5}"#;
        assert!(serde_json::from_str::<RetryPolicy>(bad).is_err());
    }

    #[test]
    fn jitter_is_reproducible_from_a_seed() {
        let p = RetryPolicy::default();
        let a: Vec<Duration> = (1..10)
            .map({
                let mut rng = StdRng::seed_from_u64(7);
                move |n| p.delay_after(n, &mut rng)
            })
            .collect();
        let b: Vec<Duration> = (1..10)
            .map({
                let mut rng = StdRng::seed_from_u64(7);
                let p = RetryPolicy::default();
                move |n| p.delay_after(n, &mut rng)
            })
            .collect();
        assert_eq!(a, b);
    }

    proptest! {
        #[test]
        fn backoff_stays_within_bounds(
            attempts in 1u32..50,
            initial_ms in 0u64..5_000,
            extra_ms in 0u64..100_000,
            multiplier in 1.0f64..10.0,
            jitter in 0.0f64..=1.0,
            attempt in 0u32..10_000,
            seed in any::<u64>(),
        ) {
            let p = policy(attempts, initial_ms, initial_ms + extra_ms)
                .with_multiplier(multiplier).unwrap()
                .with_jitter_fraction(jitter).unwrap();
            let base = p.backoff_base(attempt);
            prop_assert!(base >= p.backoff_initial(), "base {base:?} below initial");
            prop_assert!(base <= p.backoff_max(), "base {base:?} above cap");
            let mut rng = StdRng::seed_from_u64(seed);
            let delay = p.with_jitter(base, &mut rng);
            prop_assert!(delay <= base);
            prop_assert!(delay.as_secs_f64() >= base.as_secs_f64() * (1.0 - jitter) - 1e-9);
        }

        #[test]
        fn backoff_never_shrinks_as_attempts_grow(attempt in 1u32..200, initial_ms in 1u64..1_000) {
            let p = policy(10, initial_ms, initial_ms * 1_000);
            prop_assert!(p.backoff_base(attempt + 1) >= p.backoff_base(attempt));
        }
    }
}
