//! The messages that pass between the roles, and the queues they pass on.
//!
//! ```text
//!  submit ──Doorbell──► rota.tasks ──► any Scheduler: claim_tasks
//!  Scheduler ──StepRequest──► agent.<name> ──► any Agent of that name
//!  Agent ──Reply──► rota.inbox.<scheduler instance> (ordering key: task id)
//!  Supervisor ──StepExpired──► rota.inbox.<owner>   Scheduler ──Retry──► its own inbox (delayed)
//! ```
//!
//! Replies carry the task id as their ordering key, so one task's replies
//! are handled one at a time even by many inbox consumers: the fan-in
//! decision ("are all of C's dependencies done?") never races with itself.
//! Delayed messages (Retry) carry no key: a delayed message at the head of a
//! key would hold back every reply behind it. Their races are settled by the
//! store's compare-and-set instead.

use rota_agent::Request;
use rota_model::{InstanceId, MessageId, QueueName, RetryPolicy, StepName, TaskId, Timestamp, WorkflowName};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The queue of doorbells that wake Schedulers to claim Pending tasks.
pub const TASKS_QUEUE: &str = "rota.tasks";

/// The queue of doorbells.
pub fn tasks_queue() -> QueueName {
    QueueName::new(TASKS_QUEUE).expect("a valid queue name")
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
}

impl StepRequest {
    /// The request's deadline.
    pub fn complete_by(&self) -> Timestamp {
        self.call.complete_by
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
}

impl InboxMessage {
    /// The task the message is about.
    pub fn task_id(&self) -> &TaskId {
        match self {
            InboxMessage::Reply(reply) => &reply.task_id,
            InboxMessage::Retry { task_id, .. } | InboxMessage::StepExpired { task_id, .. } => task_id,
        }
    }
}

/// The workflow a request belongs to, for logs and agents.
pub fn workflow_label(name: &WorkflowName, version: u32) -> String {
    format!("{name}@{version}")
}
