//! The built-in `delay` agent: waits, then succeeds. Useful to model a slow
//! step, to space steps out, and in tests and demos of deadlines.
//!
//! The step input is `{ "for": "2s" }` (any humantime duration) or
//! `{ "ms": 2000 }`; the output is `{ "slept_ms": 2000 }`.
//!
//! Deliberately left out: waiting until a wall-clock time, and any bound of
//! its own. The step's deadline bounds the wait:
//! [`run_until_deadline`](crate::run_until_deadline) cancels a sleep that
//! outlasts it, and nothing is reported.

use std::time::Duration;

use async_trait::async_trait;
use rota_model::json;
use serde_json::{Value, json};

use crate::input;
use crate::{Agent, Request, StepError};

/// The built-in `delay` agent.
#[derive(Debug, Default, Clone, Copy)]
pub struct DelayAgent;

impl DelayAgent {
    /// A delay agent. It holds no state: it sleeps on tokio's timer.
    pub fn new() -> Self {
        DelayAgent
    }
}

#[async_trait]
impl Agent for DelayAgent {
    fn name(&self) -> &str {
        "delay"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        let wait = parse_input(&request.input)?;
        tokio::time::sleep(wait).await;
        let slept_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        Ok(json!({ "slept_ms": slept_ms }))
    }
}

/// Reads `for` or `ms`, exactly one of them.
fn parse_input(value: &Value) -> Result<Duration, StepError> {
    let fields = input::object(value, &["for", "ms"])?;
    match (fields.get("for"), fields.get("ms")) {
        (Some(_), Some(_)) => Err(StepError::permanent("input: give either `for` or `ms`, not both")),
        (Some(text @ Value::String(_)), None) => {
            input::parse_duration(text).map_err(|why| StepError::permanent(format!("input.for: {why}")))
        }
        (Some(other), None) => {
            Err(StepError::permanent(format!("input.for: expected a duration such as \"2s\", got {}", json::kind(other))))
        }
        (None, Some(Value::Number(n))) => n
            .as_u64()
            .map(Duration::from_millis)
            .ok_or_else(|| StepError::permanent(format!("input.ms: expected whole milliseconds, got {n}"))),
        (None, Some(other)) => Err(StepError::permanent(format!("input.ms: expected a number, got {}", json::kind(other)))),
        (None, None) => Err(StepError::permanent("input.for: missing (or give `ms`)")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use rota_model::{Clock, ManualClock, RetryPolicy, StepName, TaskId};

    use super::*;
    use crate::{Outcome, run_until_deadline};

    fn request(input: Value, clock: &dyn Clock, window: Duration) -> Request {
        let task_id = TaskId::new("t").unwrap();
        let step = StepName::new("wait").unwrap();
        Request {
            idempotency_key: Request::idempotency_key_for(&task_id, &step, false),
            task_id,
            workflow: "w".into(),
            step,
            attempt: 1,
            compensate: false,
            input,
            complete_by: clock.now() + window,
            callback_token: None,
        }
    }

    #[test]
    fn inputs_take_a_duration_or_milliseconds() {
        assert_eq!(parse_input(&json!({"for": "1.5s"})), Ok(Duration::from_millis(1_500)));
        assert_eq!(parse_input(&json!({"ms": 20})), Ok(Duration::from_millis(20)));
        assert!(parse_input(&json!({"for": "2s", "ms": 1})).is_err());
        assert_eq!(parse_input(&json!({})).unwrap_err().message(), "input.for: missing (or give `ms`)");
        assert!(parse_input(&json!({"ms": -3})).unwrap_err().message().starts_with("input.ms"));
        assert!(parse_input(&json!({"for": 3})).unwrap_err().message().starts_with("input.for"));
    }

    #[tokio::test(start_paused = true)]
    async fn sleeps_then_reports_how_long() {
        let clock = ManualClock::default();
        let request = request(json!({"for": "2s"}), &clock, Duration::from_secs(60));
        let started = tokio::time::Instant::now();
        assert_eq!(DelayAgent.call(&request).await, Ok(json!({"slept_ms": 2000})));
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleep_past_the_deadline_is_cut_and_reports_nothing() {
        // The manual clock stands still, so the cut comes from the timeout
        // run_until_deadline puts around the call: 5 s after the start.
        let clock = Arc::new(ManualClock::default());
        let request = request(json!({"ms": 60_000}), clock.as_ref(), Duration::from_secs(5));
        let started = tokio::time::Instant::now();
        let mut rng = StdRng::seed_from_u64(0);
        let outcome = run_until_deadline(&DelayAgent, &request, &RetryPolicy::default(), clock.as_ref(), &mut rng).await;
        assert_eq!(outcome, Outcome::DeadlinePassed { attempts: 1, last_error: None });
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }
}
