//! What the Scheduler asks an Agent to do: one [`Request`] per attempt of a
//! step, carried in a queue message.
//!
//! Deliberately left out: the queue message around it (ids, leases, reply
//! channel), which belongs to the engine.

use std::time::Duration;

use rota_model::{StepName, TaskId, Timestamp};
use serde::{Deserialize, Serialize};

/// One attempt of one step of one task, as an agent receives it.
///
/// The engine serializes this into the agent's queue message; the agent
/// serializes nothing back from it except through its output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The task this step belongs to.
    pub task_id: TaskId,
    /// The workflow's name, for logs and for agents that serve several.
    pub workflow: String,
    /// The step to perform (or to compensate).
    pub step: StepName,
    /// The Scheduler's attempt number for this step (1-based). Replies carry
    /// it back so that a late reply from an earlier attempt is fenced out.
    /// It counts Scheduler attempts, not the agent's own retries inside one
    /// attempt.
    pub attempt: u32,
    /// Whether this is the step's compensating action rather than the step.
    pub compensate: bool,
    /// The step's input, templates already resolved by the Scheduler.
    pub input: serde_json::Value,
    /// The key the remote side uses to apply the effect at most once. It
    /// is the same for every attempt of the step, see
    /// [`Request::idempotency_key_for`].
    pub idempotency_key: String,
    /// The step's complete-by time. Past it the agent stops and sends nothing.
    pub complete_by: Timestamp,
    /// For a step completed by a callback: the attempt's one-time token,
    /// which the remote service presents to complete the step
    /// (`POST /v1/callbacks/{token}`). The `http` agent sends it as the
    /// `Rota-Callback-Token` header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_token: Option<String>,
}

impl Request {
    /// The idempotency key of a step: `<task id>/<step>`, with `/compensate`
    /// appended for the compensating action.
    ///
    /// It deliberately leaves out the attempt number: recovery is
    /// at-least-once, so the Supervisor may have the same step sent again,
    /// and the remote side must see the repeat as the same operation. The
    /// compensation gets its own key because it is a different operation
    /// whose effect must also apply once.
    ///
    /// ```
    /// use rota_agent::Request;
    /// use rota_model::{StepName, TaskId};
    ///
    /// let task = TaskId::new("order-17").unwrap();
    /// let step = StepName::new("charge").unwrap();
    /// assert_eq!(Request::idempotency_key_for(&task, &step, false), "order-17/charge");
    /// assert_eq!(Request::idempotency_key_for(&task, &step, true), "order-17/charge/compensate");
    /// ```
    pub fn idempotency_key_for(task_id: &TaskId, step: &StepName, compensate: bool) -> String {
        if compensate { format!("{task_id}/{step}/compensate") } else { format!("{task_id}/{step}") }
    }

    /// The time left before `complete_by`, zero once it has passed.
    pub fn remaining(&self, now: Timestamp) -> Duration {
        self.complete_by.since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request() -> Request {
        let task_id = TaskId::new("t-1").unwrap();
        let step = StepName::new("reserve").unwrap();
        Request {
            idempotency_key: Request::idempotency_key_for(&task_id, &step, false),
            task_id,
            workflow: "order".into(),
            step,
            attempt: 2,
            compensate: false,
            input: json!({"order": 7}),
            complete_by: Timestamp::from_millis(10_000),
            callback_token: None,
        }
    }

    #[test]
    fn requests_round_trip_through_json() {
        let r = request();
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), r);
    }

    #[test]
    fn remaining_time_never_goes_negative() {
        let r = request();
        assert_eq!(r.remaining(Timestamp::from_millis(9_000)), Duration::from_secs(1));
        assert_eq!(r.remaining(Timestamp::from_millis(11_000)), Duration::ZERO);
    }
}
