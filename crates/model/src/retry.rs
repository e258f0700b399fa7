//! The retry policy: how many attempts a step gets, how long to wait
//! between them (exponential backoff with a cap and seeded jitter), and
//! which failures are not worth another attempt at all
//! ([`FailureClass`], `non_retryable`).
//!
//! The base delay and the jitter are separate functions so that tests can
//! check each alone, and so that the randomness always comes from an
//! injected, seedable RNG.

use std::fmt;
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
    /// A `non_retryable` status outside [`HTTP_STATUS_RANGE`].
    #[error("non_retryable: HTTP status must be between 100 and 599, got {0}")]
    Status(u16),
}

/// The lowest and highest HTTP status a [`FailureClass::Status`] may name.
pub const HTTP_STATUS_RANGE: std::ops::RangeInclusive<u16> = 100..=599;

/// A transient failure an agent reports, besides an HTTP status: the words
/// a policy's `non_retryable` list may use.
///
/// Only failures the agents would otherwise retry carry a kind: a permanent
/// failure (a bad input, a 404, an exit code other than 75) fails at once
/// whatever the policy says, so naming it would change nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The call or the command did not finish within its own timeout.
    Timeout,
    /// The connection failed: refused, reset, a DNS failure, a body cut off.
    Connection,
    /// The endpoint's circuit breaker refused the call (open or probing).
    CircuitOpen,
    /// A command exited 75 (`EX_TEMPFAIL`, "try again later").
    ExitTempfail,
    /// A command was killed by a signal.
    Killed,
    /// A command could not start for a reason that may pass (`EAGAIN`…).
    StartFailed,
}

impl FailureKind {
    /// Every kind, in the order the docs list them.
    pub const ALL: [FailureKind; 6] = [
        FailureKind::Timeout,
        FailureKind::Connection,
        FailureKind::CircuitOpen,
        FailureKind::ExitTempfail,
        FailureKind::Killed,
        FailureKind::StartFailed,
    ];

    /// The kind's name in workflow files and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Timeout => "timeout",
            FailureKind::Connection => "connection",
            FailureKind::CircuitOpen => "circuit_open",
            FailureKind::ExitTempfail => "exit_tempfail",
            FailureKind::Killed => "killed",
            FailureKind::StartFailed => "start_failed",
        }
    }

    /// The kind named `name`, if there is one.
    pub fn parse(name: &str) -> Option<FailureKind> {
        FailureKind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

/// What a transient failure was, for matching against a policy's
/// `non_retryable` list: an HTTP status (written as a number) or a
/// [`FailureKind`] (written as its name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged, try_from = "FailureClassField")]
pub enum FailureClass {
    /// The response's HTTP status, within [`HTTP_STATUS_RANGE`].
    Status(u16),
    /// A failure other than a status.
    Kind(FailureKind),
}

/// The serialized shape of a [`FailureClass`]; deserializing checks the
/// status range.
#[derive(Deserialize)]
#[serde(untagged)]
enum FailureClassField {
    Status(u16),
    Kind(FailureKind),
}

impl TryFrom<FailureClassField> for FailureClass {
    type Error = RetryPolicyError;
    fn try_from(field: FailureClassField) -> Result<Self, RetryPolicyError> {
        match field {
            FailureClassField::Status(status) => FailureClass::status(status),
            FailureClassField::Kind(kind) => Ok(FailureClass::Kind(kind)),
        }
    }
}

impl FailureClass {
    /// An HTTP status, refused outside [`HTTP_STATUS_RANGE`].
    pub fn status(status: u16) -> Result<FailureClass, RetryPolicyError> {
        if HTTP_STATUS_RANGE.contains(&status) { Ok(FailureClass::Status(status)) } else { Err(RetryPolicyError::Status(status)) }
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureClass::Status(status) => write!(f, "HTTP status {status}"),
            FailureClass::Kind(kind) => write!(f, "`{}`", kind.as_str()),
        }
    }
}

/// How often to try, and how long to wait between tries.
///
/// Attempt numbers start at 1. The wait before attempt `n + 1` is
/// `min(backoff_initial * multiplier^(n-1), backoff_max)`, then jittered
/// down by up to `jitter` of itself ("equal jitter": with the default 0.5 the
/// delay lands in `[base/2, base]`), which spreads retries of many tasks that
/// failed together without ever exceeding the cap.
///
/// A transient failure whose [`FailureClass`] the policy lists as
/// `non_retryable` is treated as permanent: the agent stops at once and the
/// step fails without a further attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RetryPolicyFields", into = "RetryPolicyFields")]
pub struct RetryPolicy {
    attempts_max: u32,
    backoff_initial: Duration,
    backoff_max: Duration,
    multiplier: f64,
    jitter: f64,
    non_retryable: Vec<FailureClass>,
}

/// The serialized shape of a [`RetryPolicy`]; deserializing validates it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RetryPolicyFields {
    attempts_max: u32,
    backoff_initial_ms: u64,
    backoff_max_ms: u64,
    multiplier: f64,
    jitter: f64,
    // Left out when empty, so that the stored form of a definition without
    // it (and with it its version's canonical text) stays as it was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    non_retryable: Vec<FailureClass>,
}

impl TryFrom<RetryPolicyFields> for RetryPolicy {
    type Error = RetryPolicyError;
    fn try_from(f: RetryPolicyFields) -> Result<Self, RetryPolicyError> {
        RetryPolicy::new(f.attempts_max, Duration::from_millis(f.backoff_initial_ms), Duration::from_millis(f.backoff_max_ms))?
            .with_multiplier(f.multiplier)?
            .with_jitter_fraction(f.jitter)
            .map(|policy| policy.with_non_retryable(f.non_retryable))
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
            non_retryable: p.non_retryable,
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
            non_retryable: Vec::new(),
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

    /// The same policy with the failures that must not be retried
    /// (duplicates dropped, order kept).
    pub fn with_non_retryable(mut self, classes: impl IntoIterator<Item = FailureClass>) -> Self {
        self.non_retryable.clear();
        for class in classes {
            if !self.non_retryable.contains(&class) {
                self.non_retryable.push(class);
            }
        }
        self
    }

    /// The failures that fail a step at once.
    pub fn non_retryable(&self) -> &[FailureClass] {
        &self.non_retryable
    }

    /// Whether a transient failure of class `class` must not be retried.
    pub fn is_non_retryable(&self, class: FailureClass) -> bool {
        self.non_retryable.contains(&class)
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
    fn non_retryable_classes_are_numbers_and_names() {
        let p = RetryPolicy::default().with_non_retryable([
            FailureClass::Status(404),
            FailureClass::Kind(FailureKind::Timeout),
            FailureClass::Status(404),
        ]);
        assert_eq!(p.non_retryable(), [FailureClass::Status(404), FailureClass::Kind(FailureKind::Timeout)], "duplicates dropped");
        assert!(p.is_non_retryable(FailureClass::Status(404)));
        assert!(!p.is_non_retryable(FailureClass::Status(503)));
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["non_retryable"], serde_json::json!([404, "timeout"]));
        assert_eq!(serde_json::from_value::<RetryPolicy>(json.clone()).unwrap(), p);
        let mut bad = json.clone();
        bad["non_retryable"] = serde_json::json!([700]);
        assert!(serde_json::from_value::<RetryPolicy>(bad).is_err(), "a status out of range");
        bad = json;
        bad["non_retryable"] = serde_json::json!(["teapot"]);
        assert!(serde_json::from_value::<RetryPolicy>(bad).is_err(), "an unknown kind");
        assert!(!serde_json::to_string(&RetryPolicy::default()).unwrap().contains("non_retryable"), "left out when empty");
        assert_eq!(FailureClass::status(99), Err(RetryPolicyError::Status(99)));
        for kind in FailureKind::ALL {
            assert_eq!(FailureKind::parse(kind.as_str()), Some(kind));
            assert_eq!(serde_json::to_value(kind).unwrap(), serde_json::json!(kind.as_str()));
        }
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
