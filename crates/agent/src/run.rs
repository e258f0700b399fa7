//! The Agent's retry loop: call, classify, back off, call again, all inside
//! the step's complete-by window, and silence once the window has closed.
//!
//! Before every try, a [`Gate`] may hold the call back: the engine's rate
//! limits and circuit breakers, shared through the store. A call the gate
//! holds ends the loop with [`Outcome::Held`], spending no try. A gate that
//! keeps breakers is told each try's health after it.
//!
//! Deliberately left out: the reply. [`run_until_deadline`] returns an
//! [`Outcome`]; the engine turns it into a reply message (or, for
//! [`Outcome::DeadlinePassed`], into no message at all; for
//! [`Outcome::Held`], into the request given back for later).

use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use rota_model::{Clock, RetryPolicy, Timestamp};
use serde_json::Value;

use crate::breaker::Health;
use crate::{Agent, Request, StepError};

/// How one attempt of a step ended, as seen by the agent.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The call succeeded before the deadline: reply with this output.
    Succeeded(Value),
    /// The agent gave up before the deadline: reply with an error.
    ///
    /// `retryable: false` is a permanent fault (the first one stops the
    /// loop): the Scheduler sets the task to Error or compensates.
    ///
    /// `retryable: true` means every try allowed by the policy failed with a
    /// transient fault while time was left. The pattern leaves this case
    /// open; rota reports it rather than staying silent, so that the
    /// Scheduler learns of it at once instead of at the complete-by time, and
    /// it must *not* treat it as permanent: the step stays recoverable and
    /// the Supervisor handles it as it would a timed-out step (counting a
    /// failure, then retrying after a backoff or escalating at the
    /// threshold).
    Failed {
        /// The last error's message.
        message: String,
        /// How many tries were made.
        attempts: u32,
        /// Whether the last fault was transient.
        retryable: bool,
    },
    /// The complete-by time passed (or would pass before another try could
    /// start). The caller must send **nothing**, not even an error: the
    /// Scheduler already considers the step failed and the Supervisor may
    /// have handed it to another agent instance.
    DeadlinePassed {
        /// How many tries were started, the cut one included.
        attempts: u32,
        /// The last classified error before the deadline, if any.
        last_error: Option<StepError>,
    },
    /// The [`Gate`] held the call back until `until`: no try was spent on
    /// it. The caller sends no reply; it gives the request back to be
    /// handled again then, with its complete-by moved by the time held.
    Held(Hold),
}

impl Outcome {
    /// Whether the caller may send a reply. False for
    /// [`Outcome::DeadlinePassed`] and [`Outcome::Held`].
    pub fn should_reply(&self) -> bool {
        !matches!(self, Outcome::DeadlinePassed { .. } | Outcome::Held(_))
    }
}

/// Why and until when a [`Gate`] holds a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// When the call may be asked for again.
    pub until: Timestamp,
    /// What holds it, for logs: `rate limit endpoint:http://a:80 (20/s)`.
    pub reason: String,
}

/// What lets each try of a call start: the caller's rate limits and
/// circuit breakers. It may wait a little before letting a try start (that
/// wait is part of the request's complete-by: `admit` is given the time
/// left and must not wait longer than half of it), or hold the call for
/// longer.
#[async_trait]
pub trait Gate: Send + Sync {
    /// Called before every try, with the time left before the deadline;
    /// returns when the try may start, or the [`Hold`] that stops the loop.
    async fn admit(&self, request: &Request, remaining: Duration) -> Result<(), Hold>;

    /// Whether this gate keeps the circuit breakers of the calls' targets.
    /// Then each try is made with [`Agent::call_unguarded`] (the agent's own
    /// breaker would refuse calls fast, spending tries) and its health is
    /// [reported](Gate::report). False by default.
    fn keeps_breakers(&self) -> bool {
        false
    }

    /// Called after every try the gate admitted, with what the try said
    /// about its target's health ([`Health::Unknown`] for a try cut by the
    /// deadline). Does nothing by default.
    async fn report(&self, _request: &Request, _health: Health) {}
}

/// The gate that lets every try through at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct Open;

#[async_trait]
impl Gate for Open {
    async fn admit(&self, _request: &Request, _remaining: Duration) -> Result<(), Hold> {
        Ok(())
    }
}

/// Runs `request` on `agent` until it succeeds, fails permanently, uses up
/// `policy.attempts_max()` tries, or reaches `request.complete_by`.
///
/// - A transient error whose class the policy lists as `non_retryable`
///   counts as permanent: the loop stops at once with a failure that is not
///   retryable, its message naming the class.
/// - Each try is wrapped in a timeout of the time left before the deadline,
///   read from `clock`, so a hanging call is cancelled (its future dropped)
///   at the deadline.
/// - A retryable error waits `max(retry_after, policy.delay_after(try, rng))`
///   before the next try: a server's `Retry-After` is a minimum, and the
///   jitter from `rng` spreads out retries of steps that failed together.
/// - If that wait would reach the deadline, the loop stops at once with
///   [`Outcome::DeadlinePassed`] instead of sleeping until it: no try could
///   start in time, and returning early frees the agent's slot.
/// - A result that arrives when the clock already reads `complete_by` or
///   later is dropped too: replying late would race the Supervisor.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use rand::SeedableRng;
/// use rota_agent::{DelayAgent, Outcome, Request, run_until_deadline};
/// use rota_model::{Clock, RetryPolicy, StepName, SystemClock, TaskId};
/// use serde_json::json;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let clock = SystemClock;
/// let (task_id, step) = (TaskId::new("t-1").unwrap(), StepName::new("wait").unwrap());
/// let request = Request {
///     idempotency_key: Request::idempotency_key_for(&task_id, &step, false),
///     task_id,
///     workflow: "demo".into(),
///     step,
///     attempt: 1,
///     compensate: false,
///     input: json!({ "ms": 5 }),
///     complete_by: clock.now() + Duration::from_secs(5),
///     callback_token: None,
/// };
/// let mut rng = rand::rngs::StdRng::seed_from_u64(1);
/// let outcome = run_until_deadline(&DelayAgent::new(), &request, &RetryPolicy::default(), &clock, &mut rng).await;
/// assert_eq!(outcome, Outcome::Succeeded(json!({ "slept_ms": 5 })));
/// # });
/// ```
pub async fn run_until_deadline(
    agent: &dyn Agent,
    request: &Request,
    policy: &RetryPolicy,
    clock: &dyn Clock,
    rng: &mut (impl Rng + Send),
) -> Outcome {
    run_gated(agent, request, policy, clock, rng, &Open).await
}

/// [`run_until_deadline`] with every try admitted by `gate` first. A try
/// the gate holds back ends the loop with [`Outcome::Held`]: the tries
/// made before it are forgotten with it, since the request is handled
/// again from the start.
pub async fn run_gated(
    agent: &dyn Agent,
    request: &Request,
    policy: &RetryPolicy,
    clock: &dyn Clock,
    rng: &mut (impl Rng + Send),
    gate: &dyn Gate,
) -> Outcome {
    let mut attempts: u32 = 0;
    let mut last_error: Option<StepError> = None;
    loop {
        let remaining = request.remaining(clock.now());
        if remaining.is_zero() {
            return Outcome::DeadlinePassed { attempts, last_error };
        }
        if let Err(hold) = gate.admit(request, remaining).await {
            return Outcome::Held(hold);
        }
        let remaining = request.remaining(clock.now());
        if remaining.is_zero() {
            return Outcome::DeadlinePassed { attempts, last_error };
        }
        attempts += 1;
        let call = async {
            if gate.keeps_breakers() { agent.call_unguarded(request).await } else { (agent.call(request).await, Health::Unknown) }
        };
        let result = match tokio::time::timeout(remaining, call).await {
            Ok((result, health)) => {
                gate.report(request, health).await;
                result
            }
            Err(_elapsed) => {
                gate.report(request, Health::Unknown).await;
                tracing::debug!(task = %request.task_id, step = %request.step, attempts, "deadline cut the call; going silent");
                return Outcome::DeadlinePassed { attempts, last_error };
            }
        };
        // The call may have finished on tokio's timer yet after the deadline
        // on the injected clock; the clock is the authority.
        if request.remaining(clock.now()).is_zero() {
            return Outcome::DeadlinePassed { attempts, last_error: result.err().or(last_error) };
        }
        let error = match result {
            Ok(output) => return Outcome::Succeeded(output),
            Err(StepError::Permanent { message }) => return Outcome::Failed { message, attempts, retryable: false },
            Err(error) => error,
        };
        if let Some(class) = error.class().filter(|class| policy.is_non_retryable(*class)) {
            // The policy says this failure will not pass: fail now, and say
            // why, so that the history explains the missing retries.
            let message = format!("{}; not retried: {class} is listed in retry.non_retryable", error.message());
            return Outcome::Failed { message, attempts, retryable: false };
        }
        if !policy.allows_after(attempts) {
            return Outcome::Failed { message: error.message().to_owned(), attempts, retryable: true };
        }
        let wait = retry_wait(policy, attempts, error.retry_after(), rng);
        tracing::debug!(task = %request.task_id, step = %request.step, attempts, ?wait, error = %error, "retryable error; backing off");
        last_error = Some(error);
        if wait >= request.remaining(clock.now()) {
            return Outcome::DeadlinePassed { attempts, last_error };
        }
        tokio::time::sleep(wait).await;
    }
}

/// The wait before the try after `attempts`: the jittered backoff, raised to
/// what the remote side asked for.
fn retry_wait(policy: &RetryPolicy, attempts: u32, retry_after: Option<Duration>, rng: &mut impl Rng) -> Duration {
    // Draw the jitter even when `retry_after` wins, so that the random
    // sequence, and with it a seeded test, does not depend on the server.
    let backoff = policy.delay_after(attempts, rng);
    retry_after.map_or(backoff, |asked| asked.max(backoff))
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use async_trait::async_trait;
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use rota_model::{FailureClass, FailureKind, StepName, TaskId, Timestamp};
    use serde_json::json;
    use tokio::time::Instant;

    use super::*;

    /// A clock that follows tokio's (paused) time, so that the injected
    /// clock and `tokio::time` agree inside a test.
    #[derive(Debug)]
    struct TokioClock {
        start: Instant,
        base: Timestamp,
    }

    impl TokioClock {
        fn new() -> Self {
            TokioClock { start: Instant::now(), base: Timestamp::from_millis(1_000_000) }
        }
    }

    impl Clock for TokioClock {
        fn now(&self) -> Timestamp {
            self.base + self.start.elapsed()
        }
    }

    /// What a fake call does.
    #[derive(Debug, Clone)]
    enum Script {
        Ok(Value),
        Fail(StepError),
        Hang,
    }

    /// An agent that plays a script, one entry per call (the last entry
    /// repeats), and records when each call started.
    struct Fake {
        script: Mutex<VecDeque<Script>>,
        starts: Mutex<Vec<Instant>>,
    }

    impl Fake {
        fn new(script: impl IntoIterator<Item = Script>) -> Self {
            Fake { script: Mutex::new(script.into_iter().collect()), starts: Mutex::new(Vec::new()) }
        }

        /// The gaps between consecutive call starts.
        fn gaps(&self) -> Vec<Duration> {
            let starts = self.starts.lock().unwrap();
            starts.windows(2).map(|w| w[1] - w[0]).collect()
        }
    }

    #[async_trait]
    impl Agent for Fake {
        fn name(&self) -> &str {
            "fake"
        }

        async fn call(&self, _request: &Request) -> Result<Value, StepError> {
            self.starts.lock().unwrap().push(Instant::now());
            let next = {
                let mut script = self.script.lock().unwrap();
                if script.len() > 1 { script.pop_front() } else { script.front().cloned() }
            };
            match next.expect("empty script") {
                Script::Ok(v) => Ok(v),
                Script::Fail(e) => Err(e),
                Script::Hang => std::future::pending().await,
            }
        }
    }

    fn retryable() -> Script {
        Script::Fail(StepError::retryable("503 from upstream"))
    }

    fn request(clock: &dyn Clock, window: Duration) -> Request {
        let task_id = TaskId::new("t-1").unwrap();
        let step = StepName::new("charge").unwrap();
        Request {
            idempotency_key: Request::idempotency_key_for(&task_id, &step, false),
            task_id,
            workflow: "order".into(),
            step,
            attempt: 1,
            compensate: false,
            input: json!({}),
            complete_by: clock.now() + window,
            callback_token: None,
        }
    }

    fn policy(attempts: u32) -> RetryPolicy {
        RetryPolicy::new(attempts, Duration::from_millis(100), Duration::from_secs(1)).unwrap()
    }

    /// Runs `fake` with `policy` in a `window` and a seeded RNG; returns the
    /// outcome. One place to change when the signature changes.
    async fn check(fake: &Fake, policy: &RetryPolicy, window: Duration, seed: u64) -> Outcome {
        let clock = TokioClock::new();
        let request = request(&clock, window);
        let mut rng = StdRng::seed_from_u64(seed);
        run_until_deadline(fake, &request, policy, &clock, &mut rng).await
    }

    #[tokio::test(start_paused = true)]
    async fn transient_errors_are_retried_until_success() {
        let fake = Fake::new([retryable(), retryable(), Script::Ok(json!({"paid": true}))]);
        let outcome = check(&fake, &policy(5), Duration::from_secs(30), 1).await;
        assert_eq!(outcome, Outcome::Succeeded(json!({"paid": true})));
        let gaps = fake.gaps();
        assert_eq!(gaps.len(), 2);
        // Equal jitter keeps each wait in [base/2, base]: 100 ms, then 200 ms.
        assert!(gaps[0] >= Duration::from_millis(50) && gaps[0] <= Duration::from_millis(100), "{gaps:?}");
        assert!(gaps[1] >= Duration::from_millis(100) && gaps[1] <= Duration::from_millis(200), "{gaps:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_permanent_error_fails_at_once() {
        let fake = Fake::new([Script::Fail(StepError::permanent("card declined")), Script::Ok(json!(1))]);
        let outcome = check(&fake, &policy(5), Duration::from_secs(30), 1).await;
        assert_eq!(outcome, Outcome::Failed { message: "card declined".into(), attempts: 1, retryable: false });
        assert!(outcome.should_reply());
    }

    #[tokio::test(start_paused = true)]
    async fn a_non_retryable_class_fails_at_once_and_says_why() {
        let unavailable = || Script::Fail(StepError::retryable("503 from upstream").with_class(FailureClass::Status(503)));
        let listed = policy(5).with_non_retryable([FailureClass::Status(503)]);
        let fake = Fake::new([unavailable(), Script::Ok(json!(1))]);
        let outcome = check(&fake, &listed, Duration::from_secs(30), 1).await;
        assert_eq!(
            outcome,
            Outcome::Failed {
                message: "503 from upstream; not retried: HTTP status 503 is listed in retry.non_retryable".into(),
                attempts: 1,
                retryable: false
            }
        );
        // Another class, or none, is retried as before.
        let other = policy(5).with_non_retryable([FailureClass::Status(404), FailureClass::Kind(FailureKind::Timeout)]);
        let fake = Fake::new([unavailable(), retryable(), Script::Ok(json!(1))]);
        assert_eq!(check(&fake, &other, Duration::from_secs(30), 1).await, Outcome::Succeeded(json!(1)));
        assert_eq!(fake.gaps().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn exhausted_attempts_report_a_retryable_failure() {
        let fake = Fake::new([retryable()]);
        let outcome = check(&fake, &policy(3), Duration::from_secs(30), 1).await;
        assert_eq!(outcome, Outcome::Failed { message: "503 from upstream".into(), attempts: 3, retryable: true });
        assert_eq!(fake.gaps().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_call_is_cut_at_the_deadline_and_nothing_is_reported() {
        let fake = Fake::new([retryable(), Script::Hang]);
        let started = Instant::now();
        let outcome = check(&fake, &policy(5), Duration::from_secs(2), 1).await;
        assert_eq!(outcome, Outcome::DeadlinePassed { attempts: 2, last_error: Some(StepError::retryable("503 from upstream")) });
        assert!(!outcome.should_reply());
        // The clock counts whole milliseconds, so the cut lands within one of the deadline.
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_secs(2) && elapsed < Duration::from_millis(2_001), "cut at {elapsed:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_a_minimum_wait() {
        let slow_down = Script::Fail(StepError::retryable_after("429", Duration::from_millis(700)));
        let fake = Fake::new([slow_down, Script::Ok(json!(null))]);
        let outcome = check(&fake, &policy(5), Duration::from_secs(30), 1).await;
        assert_eq!(outcome, Outcome::Succeeded(json!(null)));
        assert_eq!(fake.gaps(), [Duration::from_millis(700)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_would_reach_the_deadline_ends_the_attempt_silently() {
        let slow_down = Script::Fail(StepError::retryable_after("circuit open", Duration::from_secs(10)));
        let fake = Fake::new([slow_down, Script::Ok(json!(null))]);
        let started = Instant::now();
        let outcome = check(&fake, &policy(5), Duration::from_secs(3), 1).await;
        assert!(matches!(outcome, Outcome::DeadlinePassed { attempts: 1, last_error: Some(_) }), "{outcome:?}");
        assert_eq!(started.elapsed(), Duration::ZERO, "no point sleeping until the deadline");
        assert_eq!(fake.gaps().len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_already_passed_means_no_call() {
        let fake = Fake::new([Script::Ok(json!(1))]);
        let outcome = check(&fake, &policy(5), Duration::ZERO, 1).await;
        assert_eq!(outcome, Outcome::DeadlinePassed { attempts: 0, last_error: None });
        assert!(fake.starts.lock().unwrap().is_empty());
    }

    /// A gate that keeps breakers: admits every try and notes each report.
    #[derive(Default)]
    struct Reports(Mutex<Vec<Health>>);

    #[async_trait]
    impl Gate for Reports {
        async fn admit(&self, _request: &Request, _remaining: Duration) -> Result<(), Hold> {
            Ok(())
        }

        fn keeps_breakers(&self) -> bool {
            true
        }

        async fn report(&self, _request: &Request, health: Health) {
            self.0.lock().unwrap().push(health);
        }
    }

    /// [`Fake`] as an agent with a breaker: its unguarded tries say the
    /// target is up when they succeed and failing when they do not.
    struct Guarded(Fake);

    #[async_trait]
    impl Agent for Guarded {
        fn name(&self) -> &str {
            "guarded"
        }

        async fn call(&self, _request: &Request) -> Result<Value, StepError> {
            Err(StepError::retryable("circuit open: the agent's own breaker must not be used"))
        }

        async fn call_unguarded(&self, request: &Request) -> (Result<Value, StepError>, Health) {
            let result = self.0.call(request).await;
            let health = if result.is_ok() { Health::Up } else { Health::Failing };
            (result, health)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_keeping_breakers_gets_every_tries_health_and_unguarded_calls() {
        let agent = Guarded(Fake::new([retryable(), retryable(), Script::Ok(json!(1))]));
        let clock = TokioClock::new();
        let gate = Reports::default();
        let mut rng = StdRng::seed_from_u64(1);
        let outcome = run_gated(&agent, &request(&clock, Duration::from_secs(30)), &policy(5), &clock, &mut rng, &gate).await;
        assert_eq!(outcome, Outcome::Succeeded(json!(1)));
        assert_eq!(*gate.0.lock().unwrap(), [Health::Failing, Health::Failing, Health::Up]);
        // A try cut by the deadline says nothing about the target.
        let agent = Guarded(Fake::new([Script::Hang]));
        let gate = Reports::default();
        let outcome = run_gated(&agent, &request(&clock, Duration::from_secs(2)), &policy(5), &clock, &mut rng, &gate).await;
        assert!(matches!(outcome, Outcome::DeadlinePassed { attempts: 1, .. }), "{outcome:?}");
        assert_eq!(*gate.0.lock().unwrap(), [Health::Unknown]);
    }

    #[tokio::test(start_paused = true)]
    async fn seeded_jitter_is_reproducible() {
        let mut runs = Vec::new();
        for _ in 0..2 {
            let fake = Fake::new([retryable(), retryable(), retryable(), Script::Ok(json!(1))]);
            check(&fake, &policy(5), Duration::from_secs(30), 42).await;
            runs.push(fake.gaps());
        }
        assert_eq!(runs[0], runs[1]);
        let fake = Fake::new([retryable(), retryable(), retryable(), Script::Ok(json!(1))]);
        check(&fake, &policy(5), Duration::from_secs(30), 43).await;
        assert_ne!(fake.gaps(), runs[0], "another seed, other waits");
    }
}
