//! The messages that pass between the roles, and the queues they pass on.
//!
//! ```text
//!  submit ──Doorbell──► rota.tasks ──► any Scheduler: claim_tasks
//!  Scheduler ──StepRequest──► agent.<name> ──► any Agent of that name
//!  Agent ──Reply──► rota.inbox.<scheduler instance> (ordering key: task id)
//!  Supervisor ──StepExpired──► rota.inbox.<owner>   Scheduler ──Retry──► its own inbox (delayed)
//!  signal (API, CLI) ──Signalled──► rota.inbox.<owner> (ordering key: task id)
//!  Scheduler ──StartChild──► its own inbox (a `workflow:` step's attempt started)
//!  a child's end ──ChildEnded──► rota.children ──► any Scheduler ──Reply──► rota.inbox.<parent's owner>
//! ```
//!
//! Replies carry the task id as their ordering key, so one task's replies
//! are handled one at a time even by many inbox consumers: the fan-in
//! decision ("are all of C's dependencies done?") never races with itself.
//! Delayed messages (Retry) carry no key: a delayed message at the head of a
//! key would hold back every reply behind it. Their races are settled by the
//! store's compare-and-set instead.
//!
//! Every message may carry the W3C trace context of the span that sent it
//! (`traceparent`, see [`crate::telemetry`]): a doorbell the submit's, a
//! request the Scheduler decision's, a reply the agent call's. The field is
//! optional and left out when tracing is off, so messages written before it
//! existed, or by a process that does not trace, read the same.

use rota_agent::Request;
use std::time::Duration;

use rota_model::{InstanceId, MessageId, QueueName, RateLimit, RetryPolicy, StepName, TaskId, Timestamp, WorkflowName};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The queue of doorbells that wake Schedulers to claim Pending tasks.
pub const TASKS_QUEUE: &str = "rota.tasks";

/// The queue of doorbells.
pub fn tasks_queue() -> QueueName {
    QueueName::new(TASKS_QUEUE).expect("a valid queue name")
}

/// The queue of child workflows' ends ([`ChildEnded`]), sent by the
/// commit that ends each child and taken by any Scheduler.
pub const CHILDREN_QUEUE: &str = "rota.children";

/// The queue of child workflows' ends.
pub fn children_queue() -> QueueName {
    QueueName::new(CHILDREN_QUEUE).expect("a valid queue name")
}

/// A child workflow's task ended (Processed, Error, Compensated or
/// Cancelled): sent by the commit that ended it, so the parent's wakeup is
/// as durable as the end itself. Whoever takes it reads the child and hands
/// its outcome to the parent's holder as the reply of the step's attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildEnded {
    /// The child task.
    pub child: TaskId,
    /// Its parent.
    pub parent: TaskId,
    /// The parent's step that started it.
    pub step: StepName,
    /// That step's attempt.
    pub attempt: u32,
}

/// The inbox of one Scheduler instance: replies to the requests it sent and
/// the Supervisor's requests about the tasks it holds.
pub fn inbox(instance: &InstanceId) -> QueueName {
    let safe: String = instance
        .as_str()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':') { c } else { '_' })
        .take(80)
        .collect();
    QueueName::new(format!("rota.inbox.{safe}")).expect("sanitized instance ids make valid queue names")
}

/// The queue an agent consumes.
pub fn agent_queue(agent: &str) -> QueueName {
    QueueName::new(format!("agent.{agent}")).expect("agent names are valid queue name parts")
}

/// Whether `queue` is an agent's (see [`agent_queue`]).
pub fn is_agent_queue(queue: &QueueName) -> bool {
    queue.as_str().starts_with("agent.")
}

/// A message id, when the parts fit the id length bound (else none: the
/// message is then sent without duplicate detection).
pub(crate) fn message_id(parts: std::fmt::Arguments<'_>) -> Option<MessageId> {
    MessageId::new(parts.to_string()).ok()
}

/// Wakes a Scheduler: a task became claimable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Doorbell {
    /// The task that became claimable.
    pub task_id: TaskId,
    /// The trace context of the span that rang it (the submit's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl Doorbell {
    /// A doorbell for `task_id`, carrying the current span's trace context.
    pub fn new(task_id: TaskId) -> Self {
        Doorbell { task_id, traceparent: crate::telemetry::current_traceparent() }
    }
}

/// A request from the Scheduler to an Agent: run one attempt of one step
/// (or of its compensation) before `complete_by`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRequest {
    /// The call itself, as the agent crate sees it.
    #[serde(flatten)]
    pub call: Request,
    /// The agent's retry policy within the deadline.
    pub retry: RetryPolicy,
    /// Where to send the reply.
    pub reply_to: QueueName,
    /// The trace context of the Scheduler decision that sent it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The step's rate limit (`rate_limit:`), applied by the agent per
    /// target (see `agent_worker`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// The step's timeout, in milliseconds: how long the call has from when
    /// it starts. A held request gets it again from when it comes back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl StepRequest {
    /// The request's deadline.
    pub fn complete_by(&self) -> Timestamp {
        self.call.complete_by
    }

    /// The step's timeout, when the request says it (those sent before
    /// rate limits existed do not).
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout_ms.map(Duration::from_millis)
    }
}

/// What an agent reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ReplyOutcome {
    /// The call succeeded with this output.
    Succeeded {
        /// The step's output.
        output: Value,
    },
    /// The call failed. `retryable` says whether the failure was transient
    /// (the agent used up its attempts) or permanent.
    Failed {
        /// What went wrong.
        error: String,
        /// Whether a later attempt may succeed.
        retryable: bool,
    },
}

/// An agent's reply to one attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// The task.
    pub task_id: TaskId,
    /// The step.
    pub step: StepName,
    /// The attempt it answers: the fence.
    pub attempt: u32,
    /// Whether it answers the step's compensation.
    pub compensate: bool,
    /// The result.
    pub outcome: ReplyOutcome,
}

/// A message in a Scheduler's inbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InboxMessage {
    /// An agent's reply.
    Reply(Reply),
    /// A step's backoff has passed: start it (or its compensation) again.
    Retry {
        /// The task.
        task_id: TaskId,
        /// The step.
        step: StepName,
    },
    /// The Supervisor found this attempt's complete-by passed with no reply.
    StepExpired {
        /// The task.
        task_id: TaskId,
        /// The step.
        step: StepName,
        /// The attempt that timed out.
        attempt: u32,
    },
    /// A signal completed a step that was waiting for it: move the task on.
    /// The signal's commit already recorded the step's completion (and
    /// bumped the task's epoch); this only wakes the holder.
    Signalled {
        /// The task.
        task_id: TaskId,
        /// The step the signal completed.
        step: StepName,
    },
    /// A `workflow:` step's attempt was recorded as running: create its
    /// child task (an id derived from the task, step and attempt, so doing
    /// it twice creates one). Sent by the commit that starts the attempt,
    /// to the Scheduler's own inbox, and again by a Scheduler taking the
    /// task over.
    StartChild {
        /// The parent task.
        task_id: TaskId,
        /// Its `workflow:` step.
        step: StepName,
        /// The attempt the child belongs to.
        attempt: u32,
    },
}

/// An [`InboxMessage`] as sent: the message and, beside its fields, the
/// trace context of the span that sent it. Kept out of the message itself
/// so that the message's shape (matched on by the Scheduler and the
/// simulation) does not change; a message sent without it parses as an
/// envelope without a trace context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InboxEnvelope {
    /// The message.
    #[serde(flatten)]
    pub message: InboxMessage,
    /// The trace context of the span that sent it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl InboxEnvelope {
    /// `message` with the current span's trace context.
    pub fn traced(message: InboxMessage) -> Self {
        InboxEnvelope { message, traceparent: crate::telemetry::current_traceparent() }
    }
}

impl InboxMessage {
    /// The task the message is about.
    pub fn task_id(&self) -> &TaskId {
        match self {
            InboxMessage::Reply(reply) => &reply.task_id,
            InboxMessage::Retry { task_id, .. }
            | InboxMessage::StepExpired { task_id, .. }
            | InboxMessage::Signalled { task_id, .. }
            | InboxMessage::StartChild { task_id, .. } => task_id,
        }
    }
}

/// The workflow a request belongs to, for logs and agents.
pub fn workflow_label(name: &WorkflowName, version: u32) -> String {
    format!("{name}@{version}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn messages_without_a_trace_context_still_parse_and_none_is_left_out() {
        let doorbell: Doorbell = serde_json::from_str(r#"{"task_id":"t-1"}"#).unwrap();
        assert_eq!(doorbell, Doorbell { task_id: TaskId::new("t-1").unwrap(), traceparent: None });
        assert_eq!(serde_json::to_string(&doorbell).unwrap(), r#"{"task_id":"t-1"}"#, "the same bytes as before");
        let traced: Doorbell = serde_json::from_str(&format!(r#"{{"task_id":"t-1","traceparent":"{TRACEPARENT}"}}"#)).unwrap();
        assert_eq!(traced.traceparent.as_deref(), Some(TRACEPARENT));

        let old_request = r#"{"task_id":"t-1","workflow":"w@1","step":"s","attempt":1,"compensate":false,"input":{},
            "idempotency_key":"t-1/s","complete_by":1000,"reply_to":"rota.inbox.a",
            "retry":{"attempts_max":3,"backoff_initial_ms":100,"backoff_max_ms":1000,"multiplier":2.0,"jitter":0.5}}"#;
        let request: StepRequest = serde_json::from_str(old_request).unwrap();
        assert_eq!(request.traceparent, None);
        assert!(!serde_json::to_string(&request).unwrap().contains("traceparent"));
        let traced = StepRequest { traceparent: Some(TRACEPARENT.into()), ..request };
        let text = serde_json::to_string(&traced).unwrap();
        assert_eq!(serde_json::from_str::<StepRequest>(&text).unwrap(), traced);

        let reply = InboxMessage::Reply(Reply {
            task_id: TaskId::new("t-1").unwrap(),
            step: StepName::new("s").unwrap(),
            attempt: 2,
            compensate: false,
            outcome: ReplyOutcome::Failed { error: "boom".into(), retryable: true },
        });
        let retry = InboxMessage::Retry { task_id: TaskId::new("t-1").unwrap(), step: StepName::new("s").unwrap() };
        for message in [reply, retry] {
            // As sent before the envelope existed (and by the Supervisor now).
            let old = serde_json::to_string(&message).unwrap();
            let envelope: InboxEnvelope = serde_json::from_str(&old).unwrap();
            assert_eq!(envelope, InboxEnvelope { message: message.clone(), traceparent: None });
            assert_eq!(serde_json::to_string(&envelope).unwrap(), old, "an envelope without a context is the message itself");
            // A traced envelope still reads as the bare message.
            let traced = InboxEnvelope { message: message.clone(), traceparent: Some(TRACEPARENT.into()) };
            let text = serde_json::to_string(&traced).unwrap();
            assert_eq!(serde_json::from_str::<InboxMessage>(&text).unwrap(), message);
            assert_eq!(serde_json::from_str::<InboxEnvelope>(&text).unwrap(), traced);
        }
    }
}
