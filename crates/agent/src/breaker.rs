//! Circuit breakers: one small state machine per downstream endpoint that
//! stops an agent from hammering a service that keeps failing.
//!
//! [`CircuitBreaker`] is the lifecycle, with pure transitions that take `now`
//! and return the next state, so it is tested with a `ManualClock` and could
//! be persisted as is. [`Breakers`] keeps one per endpoint behind a mutex and
//! reads the injected [`Clock`]; [`Pass`] is the right to make one call,
//! which reports the call's result back (or, if the call is cancelled, hands
//! the probe slot back).
//!
//! Deliberately left out: what counts as a failure. The agent decides (for
//! HTTP: 5xx, timeouts and connection errors count; a 4xx means the endpoint
//! answered) and reports only transient failures. Also left out: sharing
//! breaker state between processes; [`BreakerSnapshot`] is what the engine
//! may persist or show.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rota_model::{Clock, Timestamp};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The most consecutive failures a breaker may be configured to tolerate.
pub const FAILURES_TO_OPEN_LIMIT: u32 = 1_000;
/// The longest a breaker may be configured to stay open.
pub const OPEN_FOR_LIMIT: Duration = Duration::from_secs(24 * 60 * 60);

/// When a breaker opens, how long it stays open, and how many endpoints are
/// tracked. Validated when built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerConfig {
    failures_to_open: u32,
    open_for: Duration,
    endpoints_max: usize,
}

impl Default for BreakerConfig {
    /// Open after 5 consecutive failures, for 10 s; track up to 10 000
    /// endpoints.
    fn default() -> Self {
        BreakerConfig { failures_to_open: 5, open_for: Duration::from_secs(10), endpoints_max: 10_000 }
    }
}

impl BreakerConfig {
    /// A breaker that opens after `failures_to_open` consecutive transient
    /// failures and lets a probe through `open_for` later.
    pub fn new(failures_to_open: u32, open_for: Duration) -> Result<Self> {
        if failures_to_open == 0 || failures_to_open > FAILURES_TO_OPEN_LIMIT {
            return Err(Error::Config(format!(
                "breaker.failures_to_open must be between 1 and {FAILURES_TO_OPEN_LIMIT}, got {failures_to_open}"
            )));
        }
        if open_for.is_zero() || open_for > OPEN_FOR_LIMIT {
            return Err(Error::Config(format!("breaker.open_for must be between 1 ms and 24 h, got {open_for:?}")));
        }
        Ok(BreakerConfig { failures_to_open, open_for, ..BreakerConfig::default() })
    }

    /// The same configuration tracking at most `endpoints_max` endpoints.
    /// Past the bound, endpoints with a clean record are forgotten first;
    /// if none is clean, a new endpoint's calls go through untracked.
    pub fn with_endpoints_max(mut self, endpoints_max: usize) -> Result<Self> {
        if endpoints_max == 0 {
            return Err(Error::Config("breaker.endpoints_max must be at least 1".into()));
        }
        self.endpoints_max = endpoints_max;
        Ok(self)
    }

    /// Consecutive transient failures that open the breaker.
    pub fn failures_to_open(&self) -> u32 {
        self.failures_to_open
    }

    /// How long an open breaker refuses calls before letting a probe through.
    pub fn open_for(&self) -> Duration {
        self.open_for
    }

    /// The most endpoints tracked at once.
    pub fn endpoints_max(&self) -> usize {
        self.endpoints_max
    }
}

/// What one finished call says about the endpoint's health: what a
/// breaker, in-process or shared through the store, counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// The endpoint answered (a success, a 4xx, a 429).
    Up,
    /// A transient failure of the endpoint (5xx, timeout, connection):
    /// counts towards opening.
    Failing,
    /// Nothing is known (the step's own deadline cut the call, the input
    /// was bad, the call never went).
    Unknown,
}

/// The lifecycle of one endpoint's breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitBreaker {
    /// Calls go through. A transient failure counts up; a success resets
    /// the count. [`CircuitBreaker::on_failure`] moves it to `Open` when the
    /// count reaches `failures_to_open`.
    Closed {
        /// Transient failures since the last success.
        consecutive_failures: u32,
    },
    /// Calls fail fast without touching the network. The first
    /// [`CircuitBreaker::admit`] at or after `until` moves it to `HalfOpen`.
    Open {
        /// When the next probe may go through.
        until: Timestamp,
    },
    /// One probe call decides: its success moves the breaker to `Closed`,
    /// its failure back to `Open`. Other calls are refused meanwhile.
    HalfOpen {
        /// Whether the probe is out. If it is cancelled, the [`Pass`]
        /// carrying it clears this flag so that another probe can go.
        probe_in_flight: bool,
    },
}

/// What a breaker let through: an ordinary call, or the one probe of a
/// half-open breaker. Results are reported with it, so that a late result of
/// an ordinary call cannot close (or re-open) a half-open breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// A call made while the breaker was closed.
    Call,
    /// The probe of a half-open breaker.
    Probe,
}

/// Why a breaker refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The breaker is open until this time.
    Open {
        /// When a probe may go through.
        until: Timestamp,
    },
    /// The breaker is half-open and its probe is still out.
    ProbeInFlight,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker::Closed { consecutive_failures: 0 }
    }
}

impl CircuitBreaker {
    /// Asks to make a call at `now`: the next state and either a permit or
    /// the reason for refusing.
    pub fn admit(self, now: Timestamp) -> (Self, Result<Permit, Refusal>) {
        match self {
            CircuitBreaker::Closed { .. } => (self, Ok(Permit::Call)),
            CircuitBreaker::Open { until } if now < until => (self, Err(Refusal::Open { until })),
            CircuitBreaker::Open { .. } | CircuitBreaker::HalfOpen { probe_in_flight: false } => {
                (CircuitBreaker::HalfOpen { probe_in_flight: true }, Ok(Permit::Probe))
            }
            CircuitBreaker::HalfOpen { probe_in_flight: true } => (self, Err(Refusal::ProbeInFlight)),
        }
    }

    /// The call made under `permit` succeeded, or failed in a way that shows
    /// the endpoint is up (a 4xx).
    pub fn on_success(self, permit: Permit) -> Self {
        match (self, permit) {
            (CircuitBreaker::Closed { .. }, _) | (CircuitBreaker::HalfOpen { .. }, Permit::Probe) => CircuitBreaker::default(),
            // A result of a call let through before the breaker opened says
            // nothing about the endpoint now; only the probe decides.
            (CircuitBreaker::Open { .. } | CircuitBreaker::HalfOpen { .. }, _) => self,
        }
    }

    /// The call made under `permit` failed transiently at `now`.
    pub fn on_failure(self, permit: Permit, now: Timestamp, config: &BreakerConfig) -> Self {
        match (self, permit) {
            (CircuitBreaker::Closed { consecutive_failures }, _) => {
                let consecutive_failures = consecutive_failures.saturating_add(1);
                if consecutive_failures >= config.failures_to_open {
                    CircuitBreaker::Open { until: now + config.open_for }
                } else {
                    CircuitBreaker::Closed { consecutive_failures }
                }
            }
            (CircuitBreaker::HalfOpen { .. }, Permit::Probe) => CircuitBreaker::Open { until: now + config.open_for },
            // Late failures of earlier calls neither extend an open breaker
            // nor re-open a half-open one.
            (CircuitBreaker::Open { .. } | CircuitBreaker::HalfOpen { .. }, _) => self,
        }
    }

    /// The call made under `permit` was cancelled before it had a result
    /// (the deadline passed). A cancelled probe hands its slot back.
    pub fn on_abandoned(self, permit: Permit) -> Self {
        match (self, permit) {
            (CircuitBreaker::HalfOpen { probe_in_flight: true }, Permit::Probe) => CircuitBreaker::HalfOpen { probe_in_flight: false },
            _ => self,
        }
    }

    /// Whether the breaker holds no information (closed, no failures), so
    /// forgetting it changes nothing.
    fn is_clean(&self) -> bool {
        *self == CircuitBreaker::default()
    }

    /// The breaker as the engine shows and stores it.
    pub fn snapshot(&self, endpoint: &str) -> BreakerSnapshot {
        let (state, consecutive_failures, open_until) = match *self {
            CircuitBreaker::Closed { consecutive_failures } => (BreakerState::Closed, consecutive_failures, None),
            CircuitBreaker::Open { until } => (BreakerState::Open, 0, Some(until)),
            CircuitBreaker::HalfOpen { .. } => (BreakerState::HalfOpen, 0, None),
        };
        BreakerSnapshot { endpoint: endpoint.to_owned(), state, consecutive_failures, open_until }
    }
}

/// The state of a breaker, as shown in `rota status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Calls fail fast.
    Open,
    /// One probe decides.
    HalfOpen,
}

impl BreakerState {
    /// `"closed"`, `"open"` or `"half_open"`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One endpoint's breaker, flattened for display and storage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BreakerSnapshot {
    /// `scheme://host:port`.
    pub endpoint: String,
    /// Closed, open or half-open.
    pub state: BreakerState,
    /// Transient failures since the last success (closed breakers only).
    pub consecutive_failures: u32,
    /// When an open breaker lets its probe through.
    pub open_until: Option<Timestamp>,
}

/// One breaker per endpoint, shared by every call of an agent.
#[derive(Debug)]
pub struct Breakers {
    config: BreakerConfig,
    clock: Arc<dyn Clock>,
    // A std mutex: it is held for a map lookup and a state change, never
    // across an await.
    by_endpoint: Mutex<HashMap<String, CircuitBreaker>>,
}

impl Breakers {
    /// An empty set of breakers reading time from `clock`.
    pub fn new(config: BreakerConfig, clock: Arc<dyn Clock>) -> Self {
        Breakers { config, clock, by_endpoint: Mutex::new(HashMap::new()) }
    }

    /// The configuration.
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// Asks `endpoint`'s breaker for a call. The returned [`Pass`] must be
    /// settled with the call's result; dropping it unsettled counts as
    /// abandoned.
    pub fn admit(&self, endpoint: &str) -> Result<Pass<'_>, Refusal> {
        let now = self.clock.now();
        let mut map = self.lock();
        if !map.contains_key(endpoint) && map.len() >= self.config.endpoints_max {
            map.retain(|_, breaker| !breaker.is_clean());
        }
        let permit = if map.len() < self.config.endpoints_max || map.contains_key(endpoint) {
            let breaker = map.entry(endpoint.to_owned()).or_default();
            let (next, admission) = breaker.admit(now);
            *breaker = next;
            admission?
        } else {
            tracing::warn!(
                endpoint,
                endpoints_max = self.config.endpoints_max,
                "too many endpoints with open or failing breakers; not tracking this one"
            );
            Permit::Call
        };
        Ok(Pass { breakers: self, endpoint: endpoint.to_owned(), permit, settled: false })
    }

    /// Every tracked endpoint's breaker, sorted by endpoint.
    pub fn snapshots(&self) -> Vec<BreakerSnapshot> {
        let map = self.lock();
        let mut snapshots: Vec<BreakerSnapshot> = map.iter().map(|(endpoint, breaker)| breaker.snapshot(endpoint)).collect();
        snapshots.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
        snapshots
    }

    /// The breaker of `endpoint`, if tracked.
    pub fn get(&self, endpoint: &str) -> Option<CircuitBreaker> {
        self.lock().get(endpoint).copied()
    }

    fn update(&self, endpoint: &str, change: impl FnOnce(CircuitBreaker) -> CircuitBreaker) {
        let mut map = self.lock();
        if let Some(breaker) = map.get_mut(endpoint) {
            let before = *breaker;
            *breaker = change(before);
            if matches!(*breaker, CircuitBreaker::Open { .. }) && !matches!(before, CircuitBreaker::Open { .. }) {
                tracing::warn!(endpoint, ?before, after = ?*breaker, "circuit breaker opened");
            } else if matches!(before, CircuitBreaker::HalfOpen { .. }) && breaker.is_clean() {
                tracing::info!(endpoint, "circuit breaker closed after a successful probe");
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, CircuitBreaker>> {
        // A panic while holding the lock cannot leave a breaker half-written
        // (each change is one assignment), so a poisoned map is still sound.
        self.by_endpoint.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The right to make one call through a breaker. Settle it with the call's
/// result; if it is dropped unsettled (the call was cancelled), a probe slot
/// is handed back.
#[derive(Debug)]
pub struct Pass<'a> {
    breakers: &'a Breakers,
    endpoint: String,
    permit: Permit,
    settled: bool,
}

impl Pass<'_> {
    /// Whether this call is the probe of a half-open breaker.
    pub fn permit(&self) -> Permit {
        self.permit
    }

    /// The endpoint answered: the call succeeded, or failed in a way that is
    /// not the endpoint's fault.
    pub fn succeeded(mut self) {
        self.settled = true;
        let permit = self.permit;
        self.breakers.update(&self.endpoint, |b| b.on_success(permit));
    }

    /// The call failed transiently (5xx, timeout, connection error).
    pub fn failed(mut self) {
        self.settled = true;
        let (permit, now) = (self.permit, self.breakers.clock.now());
        let config = &self.breakers.config;
        self.breakers.update(&self.endpoint, |b| b.on_failure(permit, now, config));
    }

    /// The call ended without saying anything about the endpoint (it was
    /// cut short by the step's own deadline). A probe hands its slot back.
    pub fn abandoned(mut self) {
        self.settled = true;
        let permit = self.permit;
        self.breakers.update(&self.endpoint, |b| b.on_abandoned(permit));
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if !self.settled {
            let permit = self.permit;
            self.breakers.update(&self.endpoint, |b| b.on_abandoned(permit));
        }
    }
}

#[cfg(test)]
mod tests {
    use rota_model::ManualClock;

    use super::*;

    const OPEN_FOR: Duration = Duration::from_secs(10);

    fn config() -> BreakerConfig {
        BreakerConfig::new(3, OPEN_FOR).unwrap()
    }

    /// The three inputs of the state machine, as a test script.
    #[derive(Debug, Clone, Copy)]
    enum Event {
        Admit,
        Success(Permit),
        Failure(Permit),
        Abandon(Permit),
    }

    /// Applies `event` at `now`; returns the next state and, for `Admit`,
    /// the admission.
    fn check(state: CircuitBreaker, event: Event, now: Timestamp) -> (CircuitBreaker, Option<Result<Permit, Refusal>>) {
        match event {
            Event::Admit => {
                let (next, admission) = state.admit(now);
                (next, Some(admission))
            }
            Event::Success(p) => (state.on_success(p), None),
            Event::Failure(p) => (state.on_failure(p, now, &config()), None),
            Event::Abandon(p) => (state.on_abandoned(p), None),
        }
    }

    #[test]
    fn opens_after_consecutive_failures_and_a_success_resets_the_count() {
        let clock = ManualClock::default();
        let mut state = CircuitBreaker::default();
        for _ in 0..2 {
            state = check(state, Event::Failure(Permit::Call), clock.now()).0;
        }
        assert_eq!(state, CircuitBreaker::Closed { consecutive_failures: 2 });
        state = check(state, Event::Success(Permit::Call), clock.now()).0;
        assert_eq!(state, CircuitBreaker::Closed { consecutive_failures: 0 });
        for _ in 0..3 {
            state = check(state, Event::Failure(Permit::Call), clock.now()).0;
        }
        assert_eq!(state, CircuitBreaker::Open { until: clock.now() + OPEN_FOR });
    }

    #[test]
    fn open_refuses_until_the_time_then_lets_one_probe_through() {
        let clock = ManualClock::default();
        let until = clock.now() + OPEN_FOR;
        let open = CircuitBreaker::Open { until };
        assert_eq!(check(open, Event::Admit, clock.now()), (open, Some(Err(Refusal::Open { until }))));
        clock.advance(OPEN_FOR - Duration::from_millis(1));
        assert_eq!(check(open, Event::Admit, clock.now()).1, Some(Err(Refusal::Open { until })));
        clock.advance(Duration::from_millis(1));
        let (half, admission) = check(open, Event::Admit, clock.now());
        assert_eq!((half, admission), (CircuitBreaker::HalfOpen { probe_in_flight: true }, Some(Ok(Permit::Probe))));
        assert_eq!(check(half, Event::Admit, clock.now()).1, Some(Err(Refusal::ProbeInFlight)), "one probe at a time");
    }

    #[test]
    fn the_probe_decides() {
        let clock = ManualClock::default();
        let half = CircuitBreaker::HalfOpen { probe_in_flight: true };
        assert_eq!(check(half, Event::Success(Permit::Probe), clock.now()).0, CircuitBreaker::default());
        assert_eq!(check(half, Event::Failure(Permit::Probe), clock.now()).0, CircuitBreaker::Open { until: clock.now() + OPEN_FOR });
        assert_eq!(check(half, Event::Abandon(Permit::Probe), clock.now()).0, CircuitBreaker::HalfOpen { probe_in_flight: false });
        let (again, admission) = check(CircuitBreaker::HalfOpen { probe_in_flight: false }, Event::Admit, clock.now());
        assert_eq!((again, admission), (half, Some(Ok(Permit::Probe))), "a cancelled probe's slot is reused");
    }

    #[test]
    fn late_results_of_ordinary_calls_do_not_move_an_open_or_half_open_breaker() {
        let clock = ManualClock::default();
        let open = CircuitBreaker::Open { until: clock.now() + OPEN_FOR };
        let half = CircuitBreaker::HalfOpen { probe_in_flight: true };
        for state in [open, half] {
            for event in [Event::Success(Permit::Call), Event::Failure(Permit::Call), Event::Abandon(Permit::Call)] {
                clock.advance(Duration::from_secs(1));
                assert_eq!(check(state, event, clock.now()).0, state, "{event:?} moved {state:?}");
            }
        }
    }

    #[test]
    fn a_seeded_walk_keeps_the_invariants() {
        // Drive the machine with a pseudo-random script (xorshift, seeded) and
        // check after every step: a closed breaker's count stays below the
        // threshold, an open breaker never opens for longer than open_for,
        // and at most one probe is out.
        for seed in 1..200u64 {
            let mut x = seed;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let clock = ManualClock::default();
            let mut state = CircuitBreaker::default();
            let mut probes_out = 0;
            for _ in 0..200 {
                clock.advance(Duration::from_millis(next() % 4_000));
                let permit = if probes_out > 0 && next() % 2 == 0 { Permit::Probe } else { Permit::Call };
                let event = match next() % 4 {
                    0 => Event::Admit,
                    1 => Event::Success(permit),
                    2 => Event::Failure(permit),
                    _ => Event::Abandon(permit),
                };
                let (after, admission) = check(state, event, clock.now());
                if let Some(Ok(Permit::Probe)) = admission {
                    probes_out += 1;
                }
                if permit == Permit::Probe && !matches!(event, Event::Admit) {
                    probes_out -= 1;
                }
                match after {
                    CircuitBreaker::Closed { consecutive_failures } => assert!(consecutive_failures < 3, "seed {seed}"),
                    CircuitBreaker::Open { until } => assert!(until <= clock.now() + OPEN_FOR, "seed {seed}"),
                    CircuitBreaker::HalfOpen { probe_in_flight } => {
                        assert!(probes_out <= 1, "seed {seed}: {probes_out} probes out");
                        assert_eq!(probe_in_flight, probes_out == 1, "seed {seed}");
                    }
                }
                if !matches!(after, CircuitBreaker::HalfOpen { .. }) {
                    // Leaving half-open settles the probe: any later report of
                    // it is stale and treated as an ordinary call's.
                    probes_out = 0;
                }
                state = after;
            }
        }
    }

    #[test]
    fn configs_are_validated() {
        assert!(BreakerConfig::new(0, OPEN_FOR).is_err());
        assert!(BreakerConfig::new(3, Duration::ZERO).is_err());
        assert!(BreakerConfig::new(FAILURES_TO_OPEN_LIMIT + 1, OPEN_FOR).is_err());
        assert!(BreakerConfig::default().with_endpoints_max(0).is_err());
        let err = BreakerConfig::new(0, OPEN_FOR).unwrap_err();
        assert!(err.to_string().contains("failures_to_open"), "{err}");
    }

    #[test]
    fn breakers_track_endpoints_and_hand_back_cancelled_probes() {
        let clock = Arc::new(ManualClock::default());
        let breakers = Breakers::new(BreakerConfig::new(2, OPEN_FOR).unwrap(), clock.clone());
        let a = "http://a:80";
        breakers.admit(a).unwrap().failed();
        breakers.admit(a).unwrap().failed();
        assert!(matches!(breakers.admit(a), Err(Refusal::Open { .. })));
        assert!(breakers.admit("http://b:80").is_ok(), "other endpoints are unaffected");
        clock.advance(OPEN_FOR);
        let probe = breakers.admit(a).unwrap();
        assert_eq!(probe.permit(), Permit::Probe);
        assert_eq!(breakers.admit(a).unwrap_err(), Refusal::ProbeInFlight);
        drop(probe);
        let probe = breakers.admit(a).unwrap();
        assert_eq!(probe.permit(), Permit::Probe, "the dropped probe's slot came back");
        probe.succeeded();
        assert_eq!(breakers.get(a), Some(CircuitBreaker::default()));
        let snapshots = breakers.snapshots();
        assert_eq!(snapshots.iter().map(|s| s.endpoint.as_str()).collect::<Vec<_>>(), [a, "http://b:80"]);
        assert_eq!(snapshots[0].state.as_str(), "closed");
    }

    #[test]
    fn the_endpoint_bound_forgets_clean_breakers_first() {
        let clock = Arc::new(ManualClock::default());
        let config = BreakerConfig::new(1, OPEN_FOR).unwrap().with_endpoints_max(2).unwrap();
        let breakers = Breakers::new(config, clock);
        breakers.admit("http://failing:80").unwrap().failed();
        breakers.admit("http://fine:80").unwrap().succeeded();
        breakers.admit("http://new:80").unwrap().succeeded();
        let endpoints: Vec<String> = breakers.snapshots().into_iter().map(|s| s.endpoint).collect();
        assert_eq!(endpoints, ["http://failing:80", "http://new:80"]);
        assert_eq!(serde_json::to_value(breakers.snapshots()[0].state).unwrap(), "open");
    }
}
