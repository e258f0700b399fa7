//! What the agent's integration tests share: a step request of the order
//! workflow, as the Scheduler would send it.

use rota_agent::Request;
use rota_model::{StepName, TaskId, Timestamp};
use serde_json::Value;

/// Attempt `attempt` of step `step` of task `order-17`, due by `complete_by`.
pub fn request(step: &str, attempt: u32, input: Value, complete_by: Timestamp) -> Request {
    let task_id = TaskId::new("order-17").unwrap();
    let step = StepName::new(step).unwrap();
    Request {
        idempotency_key: Request::idempotency_key_for(&task_id, &step, false),
        task_id,
        workflow: "order".into(),
        step,
        attempt,
        compensate: false,
        input,
        complete_by,
        callback_token: None,
    }
}
