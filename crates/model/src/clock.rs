//! Time as rota sees it: milliseconds since the Unix epoch, read through an
//! injected [`Clock`] so that tests can move time by hand.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A point in time, in whole milliseconds since the Unix epoch (UTC).
///
/// Stores persist this integer as is, so both backends compare and index
/// times the same way and SQL never needs its own notion of "now".
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// A timestamp from milliseconds since the epoch.
    pub const fn from_millis(millis: i64) -> Self {
        Timestamp(millis)
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// `self + duration`, saturating instead of overflowing.
    #[allow(clippy::should_implement_trait)]
    pub fn add(self, duration: Duration) -> Self {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_add(millis))
    }

    /// `self - duration`, saturating instead of overflowing.
    #[allow(clippy::should_implement_trait)]
    pub fn sub(self, duration: Duration) -> Self {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        Timestamp(self.0.saturating_sub(millis))
    }

    /// The time from `earlier` to `self`, or zero when `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
}

impl std::ops::Add<Duration> for Timestamp {
    type Output = Timestamp;
    fn add(self, duration: Duration) -> Timestamp {
        Timestamp::add(self, duration)
    }
}

impl std::ops::Sub<Duration> for Timestamp {
    type Output = Timestamp;
    fn sub(self, duration: Duration) -> Timestamp {
        Timestamp::sub(self, duration)
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({})", self.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The source of "now" for every component. Nothing in rota reads the system
/// time except [`SystemClock`].
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The real wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        Timestamp(i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX))
    }
}

/// A clock that only moves when told to. Shared between a test and the
/// components under test through an `Arc`.
#[derive(Debug)]
pub struct ManualClock {
    millis: AtomicI64,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock { millis: AtomicI64::new(start.0) }
    }

    /// Moves the clock forward by `duration`.
    pub fn advance(&self, duration: Duration) {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        self.millis.fetch_add(millis, Ordering::SeqCst);
    }

    /// Sets the clock to `to`. Time may go backwards: tests of clock skew need it.
    pub fn set(&self, to: Timestamp) {
        self.millis.store(to.0, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    /// A clock at 2026-01-01T00:00:00Z, so that stored times look plausible.
    fn default() -> Self {
        ManualClock::new(Timestamp::from_millis(1_767_225_600_000))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.millis.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(Timestamp::from_millis(1_000));
        assert_eq!(clock.now(), Timestamp::from_millis(1_000));
        clock.advance(Duration::from_millis(250));
        assert_eq!(clock.now(), Timestamp::from_millis(1_250));
        clock.set(Timestamp::from_millis(10));
        assert_eq!(clock.now(), Timestamp::from_millis(10));
    }

    #[test]
    fn timestamp_arithmetic_saturates() {
        let far = Timestamp::from_millis(i64::MAX - 1);
        assert_eq!(far.add(Duration::from_secs(10)), Timestamp::from_millis(i64::MAX));
        assert_eq!(Timestamp::from_millis(5).since(Timestamp::from_millis(9)), Duration::ZERO);
        assert_eq!(Timestamp::from_millis(9).since(Timestamp::from_millis(5)), Duration::from_millis(4));
    }
}
