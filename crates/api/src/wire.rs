//! The wire types: what requests carry and responses return. Only this
//! crate defines wire types; the domain types stay free to change, and each
//! conversion here is the one place where a field's public name is chosen.
//!
//! Times are integers: milliseconds since the Unix epoch (UTC), as the
//! stores keep them.

use std::collections::BTreeMap;

use rota_engine::ops::TaskDetail;
use rota_model::{Step, StepState, Task, TaskState, Timestamp};
use rota_store::{ComponentStatus, DeadLetter, Event, QueueStats, SharedBreaker, WorkflowEntry};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

/// A request to run a workflow.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The workflow to run.
    #[schema(example = "order", pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub workflow: String,
    /// Its version; the latest registered when absent.
    #[schema(minimum = 1)]
    #[serde(default, deserialize_with = "whole_number")]
    pub version: Option<u32>,
    /// The task's input (any JSON); `{}` when absent.
    #[serde(default)]
    pub input: Option<Value>,
    /// The task id, which doubles as the idempotency key: submitting an id
    /// that exists creates nothing and returns the existing task (200
    /// instead of 201). A fresh UUID when absent. Up to 200 bytes of UTF-8
    /// text (so fewer characters when some take several bytes), without
    /// control characters or surrounding whitespace.
    #[schema(
        example = "order-17",
        pattern = r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$",
        max_length = 50
    )]
    pub id: Option<String>,
    /// Where to POST the task's status events (a webhook): an http or https
    /// URL of at most 2048 bytes. Each POST is signed (`Rota-Signature`),
    /// retried with backoff, and dead-lettered in queue `rota.webhooks` when
    /// it keeps failing. Kept with the task; a second submit with the same id
    /// does not change it.
    #[schema(example = "https://shop.example/hooks/rota", max_length = 2048)]
    pub callback_url: Option<String>,
    /// A durable queue of this server's store to send the task's status
    /// events to (a response queue): `received`, `step_completed`,
    /// `processed`, `error`, `compensated` and `cancelled`, each sent in the
    /// commit that records it, with the task id as `correlation_id` and as
    /// ordering key, so a reader gets one task's events in order. Read them
    /// from the store with peek-lock receives (`rota queue receive QUEUE`, or
    /// the store's `receive` in a Rust program). Created with default settings
    /// when it does not exist. A queue name (letters, digits, `.-_:`, at
    /// most 100 bytes) not starting with `rota.` or `agent.`. Kept with
    /// the task; a second submit with the same id does not change it.
    #[schema(example = "shop.replies", max_length = 100)]
    pub reply_queue: Option<String>,
    /// Start no earlier than this time (RFC 3339, with `Z` or an offset):
    /// the task waits Pending until then, its `not_before` says when. At
    /// most a year and a day ahead; a time already past starts now. Not
    /// with `delay`.
    #[schema(example = "2026-12-01T02:00:00Z", max_length = 64)]
    pub start_at: Option<String>,
    /// Start no earlier than this long after the server receives the
    /// submission (`90s`, `10m`, `2h 30m`). Not with `start_at`.
    #[schema(example = "10m", max_length = 64)]
    pub delay: Option<String>,
    /// Labels to find the task by (`GET /v1/tasks?tag=customer=c-42`): at
    /// most 16, keys of 1 to 64 characters of `A-Z a-z 0-9 _ - . / :`,
    /// values of at most 256 bytes without control characters. Kept with
    /// the task, never changed; a second submit with the same id does not
    /// change them.
    #[schema(example = json!({"customer": "c-42", "region": "eu"}))]
    #[serde(default)]
    pub tags: Option<BTreeMap<String, String>>,
    /// Schedulers claim higher priorities first, then in submission order;
    /// one claimed task in eight (`--claim-oldest-every`) is the oldest
    /// waiting, whatever its priority, so low priorities still progress.
    /// An integer from -100 to 100; the workflow's `priority:` (0 by
    /// default) when absent. Kept with the task, never changed.
    #[schema(example = 10, minimum = -100, maximum = 100)]
    #[serde(default)]
    pub priority: Option<i64>,
}

/// A JSON number that is a whole `u32`, written `1` or `1.0` (JSON does not
/// tell the two apart, and JSON Schema calls both integers).
fn whole_number<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<u32>, D::Error> {
    let Some(number) = Option::<serde_json::Number>::deserialize(deserializer)? else { return Ok(None) };
    let whole = match number.as_u64() {
        Some(n) => u32::try_from(n).ok(),
        None => number.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= f64::from(u32::MAX)).map(|f| f as u32),
    };
    whole.map(Some).ok_or_else(|| serde::de::Error::custom(format!("expected a whole number from 1 to {}, got {number}", u32::MAX)))
}

/// A task's state (`pending`, `processing`, `processed`, `error`, `compensating`, `compensated`, `cancelled`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskStateView {
    /// Waiting for a Scheduler.
    Pending,
    /// Held by a Scheduler.
    Processing,
    /// Every step completed (terminal).
    Processed,
    /// Failed for good (terminal until resubmitted).
    Error,
    /// Undoing completed steps.
    Compensating,
    /// Undone (terminal).
    Compensated,
    /// Cancelled (terminal).
    Cancelled,
}

impl From<TaskState> for TaskStateView {
    fn from(state: TaskState) -> Self {
        match state {
            TaskState::Pending => TaskStateView::Pending,
            TaskState::Processing => TaskStateView::Processing,
            TaskState::Processed => TaskStateView::Processed,
            TaskState::Error => TaskStateView::Error,
            TaskState::Compensating => TaskStateView::Compensating,
            TaskState::Compensated => TaskStateView::Compensated,
            TaskState::Cancelled => TaskStateView::Cancelled,
        }
    }
}

impl From<TaskStateView> for TaskState {
    fn from(view: TaskStateView) -> Self {
        match view {
            TaskStateView::Pending => TaskState::Pending,
            TaskStateView::Processing => TaskState::Processing,
            TaskStateView::Processed => TaskState::Processed,
            TaskStateView::Error => TaskState::Error,
            TaskStateView::Compensating => TaskState::Compensating,
            TaskStateView::Compensated => TaskState::Compensated,
            TaskStateView::Cancelled => TaskState::Cancelled,
        }
    }
}

/// A step's state.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepStateView {
    /// Not sent yet, or waiting for its next attempt.
    NotStarted,
    /// With an agent.
    Running,
    /// Done.
    Completed,
    /// Failed for good.
    Failed,
    /// Its compensation is with an agent.
    Compensating,
    /// Undone.
    Compensated,
    /// Its `when` condition was false: it never ran and has no output.
    Skipped,
}

impl From<StepState> for StepStateView {
    fn from(state: StepState) -> Self {
        match state {
            StepState::NotStarted => StepStateView::NotStarted,
            StepState::Running => StepStateView::Running,
            StepState::Completed => StepStateView::Completed,
            StepState::Failed => StepStateView::Failed,
            StepState::Compensating => StepStateView::Compensating,
            StepState::Compensated => StepStateView::Compensated,
            StepState::Skipped => StepStateView::Skipped,
        }
    }
}

impl From<StepStateView> for StepState {
    fn from(view: StepStateView) -> Self {
        match view {
            StepStateView::NotStarted => StepState::NotStarted,
            StepStateView::Running => StepState::Running,
            StepStateView::Completed => StepState::Completed,
            StepStateView::Failed => StepState::Failed,
            StepStateView::Compensating => StepState::Compensating,
            StepStateView::Compensated => StepState::Compensated,
            StepStateView::Skipped => StepState::Skipped,
        }
    }
}

/// A task without its input, output and steps, as listings show it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TaskSummary {
    /// The task id.
    pub id: String,
    /// The workflow.
    pub workflow: String,
    /// The workflow version it runs.
    pub version: u32,
    /// Where it is.
    pub state: TaskStateView,
    /// The Scheduler holding it (the pattern's LockedBy).
    pub locked_by: Option<String>,
    /// When the holder's time runs out (the pattern's CompleteBy), epoch ms.
    pub complete_by: Option<i64>,
    /// No Scheduler claims it before this time, epoch ms: a delayed start,
    /// or the backoff after a failure.
    pub not_before: i64,
    /// How many times its deadline passed.
    pub failure_count: u32,
    /// When the Supervisor first raised a deadline warning (of the task or
    /// one of its steps) during its current lease, epoch ms: the task is
    /// at risk. Absent when it is not (no warning, or not held).
    pub at_risk_since: Option<i64>,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// Who submitted it (the API token's id), when known.
    pub submitter: Option<String>,
    /// Whether an operator paused it: it starts no new step until resumed.
    #[serde(default)]
    pub paused: bool,
    /// Its labels, by key (empty when it has none).
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Its priority: Schedulers claim higher priorities first.
    #[serde(default)]
    pub priority: i32,
    /// When it was created, epoch ms.
    pub created_at: i64,
    /// When it last changed, epoch ms.
    pub updated_at: i64,
}

impl From<&Task> for TaskSummary {
    fn from(task: &Task) -> Self {
        TaskSummary {
            id: task.id.to_string(),
            workflow: task.workflow.to_string(),
            version: task.workflow_version,
            state: task.state.into(),
            locked_by: task.locked_by.as_ref().map(ToString::to_string),
            complete_by: task.complete_by.map(|t| t.as_millis()),
            not_before: task.not_before.as_millis(),
            failure_count: task.failure_count,
            at_risk_since: task.at_risk_since.map(|t| t.as_millis()),
            error: task.error.clone(),
            submitter: task.submitter.clone(),
            paused: task.paused,
            tags: tags_of(task),
            priority: task.priority.get(),
            created_at: task.created_at.as_millis(),
            updated_at: task.updated_at.as_millis(),
        }
    }
}

/// A task's tags as the API shows them.
fn tags_of(task: &Task) -> BTreeMap<String, String> {
    task.tags.iter().map(|(key, value)| (key.to_owned(), value.to_owned())).collect()
}

/// A task with its input, output and steps.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TaskView {
    /// The task id.
    pub id: String,
    /// The workflow.
    pub workflow: String,
    /// The workflow version it runs.
    pub version: u32,
    /// Where it is.
    pub state: TaskStateView,
    /// The Scheduler holding it (the pattern's LockedBy).
    pub locked_by: Option<String>,
    /// Bumped by every move; the task's version.
    pub lease_epoch: u64,
    /// When the holder's time runs out (CompleteBy), epoch ms.
    pub complete_by: Option<i64>,
    /// When the current lease is at risk (the workflow's `warn_after` past
    /// the claim), epoch ms; absent without a warning point.
    pub warn_at: Option<i64>,
    /// When the Supervisor first raised a deadline warning (of the task or
    /// one of its steps) during its current lease, epoch ms: the task is
    /// at risk. Absent when it is not (no warning, or not held).
    pub at_risk_since: Option<i64>,
    /// The earliest time a Scheduler may claim it, epoch ms.
    pub not_before: i64,
    /// How many times its deadline passed.
    pub failure_count: u32,
    /// The failure count at which it ends (its workflow's `max_failures`;
    /// absent when the definition cannot be read).
    pub max_failures: Option<u32>,
    /// The submitted input.
    pub input: Value,
    /// The result, once processed.
    pub output: Option<Value>,
    /// Why it failed, if it did.
    pub error: Option<String>,
    /// Where its status events are POSTed, if it was submitted with a callback URL.
    pub callback_url: Option<String>,
    /// The queue its status events are sent to, if it was submitted with one.
    pub reply_queue: Option<String>,
    /// Who submitted it: the id of the API token (its name, or `token:` and
    /// the start of its digest); absent when not known (authentication off,
    /// the CLI on a store, a schedule).
    pub submitter: Option<String>,
    /// Whether an operator paused it: no Scheduler claims it and it starts
    /// no new step until resumed (steps in flight finish).
    #[serde(default)]
    pub paused: bool,
    /// Its labels, by key (empty when it has none).
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Its priority: Schedulers claim higher priorities first.
    #[serde(default)]
    pub priority: i32,
    /// Whether its workflow is paused: no Scheduler claims it while it
    /// waits (only a task's own view says; listings leave it false).
    #[serde(default)]
    pub workflow_paused: bool,
    /// Its concurrency key (`NAME=VALUE`, or `max_in_flight`), when its
    /// workflow has `concurrency:` or `max_in_flight:`: at most the
    /// workflow's limit of its tasks with this key run at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// Why a Pending task has not started, when its concurrency key holds
    /// it back: `waiting for concurrency key customer=c1 (1/1 in use)`
    /// (only a task's own view says; listings leave it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// The task whose `workflow:` step started it, when it is a child
    /// workflow.
    #[serde(default)]
    pub parent: Option<ParentView>,
    /// The child workflows its `workflow:` steps started, newest first (at
    /// most 100; only a task's own view lists them, listings leave it
    /// empty).
    #[serde(default)]
    pub children: Vec<ChildView>,
    /// When it was created, epoch ms.
    pub created_at: i64,
    /// When it last changed, epoch ms.
    pub updated_at: i64,
    /// Its steps, in definition order.
    pub steps: Vec<StepView>,
}

/// Where a child workflow's task comes from.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ParentView {
    /// The parent task.
    pub task: String,
    /// Its step that started the child.
    pub step: String,
    /// That step's attempt.
    pub attempt: u32,
    /// How many parents are above the child (1: its parent is a top-level task).
    pub depth: u32,
}

/// One child workflow of a task.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ChildView {
    /// The child task's id.
    pub id: String,
    /// Its workflow.
    pub workflow: String,
    /// Where it is.
    pub state: TaskStateView,
    /// The parent's step that started it.
    pub step: String,
    /// That step's attempt.
    pub attempt: u32,
}

impl TaskView {
    /// A task and its steps; `definition` (the version the task runs) names
    /// each step's agent.
    pub fn new(task: &Task, steps: &[Step], definition: Option<&rota_workflow::Workflow>) -> Self {
        TaskView {
            id: task.id.to_string(),
            workflow: task.workflow.to_string(),
            version: task.workflow_version,
            state: task.state.into(),
            locked_by: task.locked_by.as_ref().map(ToString::to_string),
            lease_epoch: task.lease_epoch,
            complete_by: task.complete_by.map(|t| t.as_millis()),
            warn_at: task.warn_at.map(|t| t.as_millis()),
            at_risk_since: task.at_risk_since.map(|t| t.as_millis()),
            not_before: task.not_before.as_millis(),
            failure_count: task.failure_count,
            max_failures: definition.map(rota_workflow::Workflow::max_failures),
            input: task.input.clone(),
            output: task.output.clone(),
            error: task.error.clone(),
            callback_url: task.reply_to.clone(),
            reply_queue: task.reply_queue.as_ref().map(ToString::to_string),
            submitter: task.submitter.clone(),
            paused: task.paused,
            tags: tags_of(task),
            priority: task.priority.get(),
            workflow_paused: false,
            concurrency_key: task.concurrency.as_ref().map(|c| c.key.clone()),
            waiting_for: None,
            parent: task.parent.as_ref().map(|p| ParentView {
                task: p.task.to_string(),
                step: p.step.to_string(),
                attempt: p.attempt,
                depth: p.depth,
            }),
            children: Vec::new(),
            created_at: task.created_at.as_millis(),
            updated_at: task.updated_at.as_millis(),
            steps: steps
                .iter()
                .map(|step| {
                    let mut view = StepView::from(step);
                    let def = definition.and_then(|d| d.step(&step.name));
                    view.agent = def.and_then(|def| def.agent()).map(ToString::to_string);
                    view.waits_for = def.and_then(|def| def.waits_for()).map(ToString::to_string);
                    view.workflow = def.and_then(|def| def.child()).map(|child| child.name().to_string());
                    view.when = def.and_then(|def| def.when()).map(|c| c.source().to_owned());
                    view.callback = def.is_some_and(|def| def.completes_by_callback());
                    let in_flight = matches!(step.state, StepState::Running | StepState::Compensating);
                    view.owner = task.locked_by.as_ref().filter(|_| in_flight).map(ToString::to_string);
                    view
                })
                .collect(),
        }
    }
}

impl From<&TaskDetail> for TaskView {
    fn from(detail: &TaskDetail) -> Self {
        let mut view = TaskView::new(&detail.record.task, &detail.record.steps, detail.definition.as_deref());
        view.children = detail
            .children
            .iter()
            .map(|child| ChildView {
                id: child.id.to_string(),
                workflow: child.workflow.to_string(),
                state: child.state.into(),
                step: child.parent.as_ref().map_or_else(String::new, |p| p.step.to_string()),
                attempt: child.parent.as_ref().map_or(0, |p| p.attempt),
            })
            .collect();
        view
    }
}

/// One step of a task.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StepView {
    /// Its name in the workflow.
    pub name: String,
    /// Its position in the definition.
    pub position: u32,
    /// The agent that runs it (absent when the definition cannot be read,
    /// and for a step that waits for a signal).
    pub agent: Option<String>,
    /// The signal it waits for (absent for a step that calls an agent, and
    /// when the definition cannot be read). Its `input` is the signal once
    /// it arrived, even before the step started.
    pub waits_for: Option<String>,
    /// The child workflow it runs (`workflow:`; absent for the other steps,
    /// and when the definition cannot be read).
    #[serde(default)]
    pub workflow: Option<String>,
    /// Its `when` condition as written (absent without one, and when the
    /// definition cannot be read); false skips it.
    pub when: Option<String>,
    /// Whether a callback completes it (`callback: true`): while it runs,
    /// its agent's request was sent and the remote service calls back.
    #[serde(default)]
    pub callback: bool,
    /// Where it is.
    pub state: StepStateView,
    /// The current attempt (0 before the first).
    pub attempt: u32,
    /// The Scheduler holding its task while the step is in flight.
    pub owner: Option<String>,
    /// When the current attempt's time runs out, epoch ms.
    pub complete_by: Option<i64>,
    /// When the current attempt is at risk (the step's `warn_after` past
    /// its start), epoch ms; absent without a warning point or once the
    /// attempt ended.
    pub warn_at: Option<i64>,
    /// The earliest time the next attempt may start, epoch ms.
    pub not_before: i64,
    /// The request sent to the agent, once rendered.
    pub input: Option<Value>,
    /// The agent's output, once completed.
    pub output: Option<Value>,
    /// The last error, if an attempt failed.
    pub last_error: Option<String>,
    /// When it last changed, epoch ms.
    pub updated_at: i64,
}

impl From<&Step> for StepView {
    fn from(step: &Step) -> Self {
        StepView {
            name: step.name.to_string(),
            position: step.position,
            agent: None,
            waits_for: None,
            workflow: None,
            when: None,
            callback: false,
            state: step.state.into(),
            attempt: step.attempt,
            owner: None,
            complete_by: step.complete_by.map(|t| t.as_millis()),
            warn_at: step.warn_at.map(|t| t.as_millis()),
            not_before: step.not_before.as_millis(),
            input: step.input.clone(),
            output: step.output.clone(),
            last_error: step.last_error.clone(),
            updated_at: step.updated_at.as_millis(),
        }
    }
}

/// One entry of a task's history (also the data of a server-sent event).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventView {
    /// Its position in the store's global event order (the SSE event id).
    pub seq: i64,
    /// The task.
    pub task_id: String,
    /// When it happened, epoch ms.
    pub at: i64,
    /// What happened: received, claimed, step_started, step_completed,
    /// step_failed, expired, processed, error, compensation_started,
    /// step_compensated, step_skipped, compensated, cancelled, resubmitted, released, alert,
    /// signal, at_risk (a deadline warning: `detail` has its `reason`, `warn_at`,
    /// `complete_by` and `remaining_ms`), callback (`detail.outcome`: `accepted`,
    /// `succeeded` or `failed`), paused and resumed (an operator's: `detail`
    /// has `by` and `reason`), call_stopped (an agent stopped a call in
    /// progress because its task had finished: `detail` has `agent` and
    /// `reason`).
    #[schema(example = "step_completed")]
    pub kind: String,
    /// The step concerned, if any.
    pub step: Option<String>,
    /// The step's attempt, if any.
    pub attempt: Option<u32>,
    /// Details.
    pub detail: Value,
}

impl From<&Event> for EventView {
    fn from(event: &Event) -> Self {
        EventView {
            seq: event.seq,
            task_id: event.task_id.to_string(),
            at: event.at.as_millis(),
            kind: event.kind.as_str().to_owned(),
            step: event.step.as_ref().map(ToString::to_string),
            attempt: event.attempt,
            detail: event.detail.clone(),
        }
    }
}

/// An operator alert.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AlertView {
    /// The event's position in the global order.
    pub seq: i64,
    /// The task.
    pub task_id: String,
    /// When it was raised, epoch ms.
    pub at: i64,
    /// Why.
    pub reason: String,
    /// The step concerned, if any.
    pub step: Option<String>,
    /// Details.
    pub detail: Value,
}

impl From<&Event> for AlertView {
    fn from(event: &Event) -> Self {
        AlertView {
            seq: event.seq,
            task_id: event.task_id.to_string(),
            at: event.at.as_millis(),
            reason: event.detail["reason"].as_str().map_or_else(|| event.detail.to_string(), str::to_owned),
            step: event.step.as_ref().map(ToString::to_string),
            detail: event.detail.clone(),
        }
    }
}

/// An operator's pause or resume of a task; the body may be left out.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    /// Why, kept in the task's history with who did it (at most 1000
    /// characters).
    #[serde(default)]
    pub reason: Option<String>,
}

/// Why an operator acts (a task's cancel, a queue's pause, a purge…);
/// the body may be left out.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorRequest {
    /// Why, kept with who did it: in the task's history, or in the audit
    /// log for an action on no task (at most 1000 characters).
    #[serde(default)]
    pub reason: Option<String>,
}

/// The state a task moved to.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TaskStateChange {
    /// The task.
    pub id: String,
    /// Its state now.
    pub state: TaskStateView,
}

/// The optional body of a step's resubmit.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResubmitRequest {
    /// A new input for the task (any JSON), replacing the one it has: the
    /// step and every step that depends on it then run again from the
    /// start, on the new input. The history's `resubmitted` event records
    /// the old and the new input (each as a SHA-256 digest and size when
    /// over 4 KiB) and who asked. Without it, only the failed step runs
    /// again, on the input the task has.
    pub input: Option<Value>,
    /// Why, kept in the task's history with who asked (at most 1000
    /// characters).
    #[serde(default)]
    pub reason: Option<String>,
}

/// What a signal did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SignalDelivery {
    /// The task.
    pub id: String,
    /// The signal.
    pub signal: String,
    /// The step that waits for it.
    pub step: String,
    /// Whether it completed the step now (`true`: the step was waiting), or
    /// is kept until the task reaches the step (`false`).
    pub completed: bool,
}

/// A callback's outcome: `output` for a success, `error` (and
/// `retryable`) for a failure.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CallbackRequest {
    /// The step's output (a success; absent or `null`: a `null` output).
    #[serde(default)]
    pub output: Option<Value>,
    /// What went wrong (a failure).
    #[serde(default)]
    pub error: Option<String>,
    /// Whether another attempt may succeed (a failure only; default false).
    #[serde(default)]
    pub retryable: Option<bool>,
}

/// What a callback did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CallbackAccepted {
    /// The task.
    pub task_id: String,
    /// The step.
    pub step: String,
    /// The attempt the token was for.
    pub attempt: u32,
    /// Whether it completed the step (a success), rather than failing the
    /// attempt.
    pub completed: bool,
}

/// A callback token, in the path.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct CallbackPath {
    /// The token the step's request carried (`Rota-Callback-Token`, or
    /// `{{ callback.token }}` in its input).
    pub token: String,
}

/// A signal sent to a task, in the path.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SignalPath {
    /// The task id, URL-encoded.
    #[param(pattern = r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$", max_length = 200)]
    pub id: String,
    /// The signal's name.
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub name: String,
}

/// Counts of one queue.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QueueView {
    /// The queue.
    pub queue: String,
    /// Visible, waiting for a consumer.
    pub ready: u64,
    /// Leased by a consumer.
    pub leased: u64,
    /// Sent with a delay that has not passed.
    pub delayed: u64,
    /// In the dead-letter queue.
    pub dead_lettered: u64,
    /// Whether deliveries are paused.
    pub paused: bool,
    /// When the oldest ready message was sent, epoch ms.
    pub oldest_ready_at: Option<i64>,
}

impl From<&QueueStats> for QueueView {
    fn from(stats: &QueueStats) -> Self {
        QueueView {
            queue: stats.queue.to_string(),
            ready: stats.ready,
            leased: stats.leased,
            delayed: stats.delayed,
            dead_lettered: stats.dead_lettered,
            paused: stats.paused,
            oldest_ready_at: stats.oldest_ready_at.map(|t| t.as_millis()),
        }
    }
}

/// A dead-lettered message.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeadLetterView {
    /// The queue it came from.
    pub queue: String,
    /// Its message id.
    pub id: String,
    /// Its body.
    pub body: Value,
    /// Its ordering key, if any.
    pub ordering_key: Option<String>,
    /// How many times it was delivered.
    pub delivery_count: u32,
    /// When it was first sent, epoch ms.
    pub enqueued_at: i64,
    /// When it was dead-lettered, epoch ms.
    pub dead_lettered_at: i64,
    /// Why it was dead-lettered.
    pub reason: String,
    /// Where its sender wanted the answer, if it said (kept by a redrive).
    pub reply_to: Option<String>,
    /// What the answer should carry, if the sender said (kept by a redrive).
    pub correlation_id: Option<String>,
}

impl From<&DeadLetter> for DeadLetterView {
    fn from(letter: &DeadLetter) -> Self {
        DeadLetterView {
            queue: letter.queue.to_string(),
            id: letter.id.to_string(),
            // A body is validated JSON when sent; a null stands in should a
            // backend ever hand back something else.
            body: serde_json::from_str(letter.body.get()).unwrap_or(Value::Null),
            ordering_key: letter.ordering_key.clone(),
            delivery_count: letter.delivery_count,
            enqueued_at: letter.enqueued_at.as_millis(),
            dead_lettered_at: letter.dead_lettered_at.as_millis(),
            reason: letter.reason.clone(),
            reply_to: letter.reply_to.as_ref().map(ToString::to_string),
            correlation_id: letter.correlation_id.clone(),
        }
    }
}

/// How many messages an operation moved or deleted.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Count {
    /// How many.
    pub count: u64,
}

/// A circuit breaker: shared through the store by every process (the
/// default), or kept in one `rota serve` process, as it reported it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BreakerView {
    /// The endpoint it guards.
    pub endpoint: String,
    /// The agent using it (absent for a shared breaker).
    pub agent: Option<String>,
    /// `closed`, `open` or `half_open` (`unknown` if the report has none).
    pub state: String,
    /// Failures in a row (of every process, for a shared breaker).
    pub consecutive_failures: Option<u64>,
    /// Until when it stays open, epoch ms.
    pub open_until: Option<i64>,
    /// The instance that reported it; for a shared breaker, the instance
    /// holding the probe, if one is out.
    pub instance: Option<String>,
    /// When it was reported (a shared breaker: when it last changed),
    /// epoch ms.
    pub reported_at: i64,
    /// Whether it is shared through the store: while open it holds the
    /// requests of its endpoint instead of failing them.
    #[serde(default)]
    pub shared: bool,
    /// The call holding the probe of a half-open shared breaker
    /// (`INSTANCE TASK/STEP#ATTEMPT`).
    #[serde(default)]
    pub probe_holder: Option<String>,
    /// When that probe's lease ends, epoch ms: then another process may
    /// probe.
    #[serde(default)]
    pub probe_until: Option<i64>,
}

impl From<&SharedBreaker> for BreakerView {
    fn from(breaker: &SharedBreaker) -> Self {
        BreakerView {
            endpoint: breaker.key.strip_prefix("endpoint:").unwrap_or(&breaker.key).to_owned(),
            agent: None,
            state: breaker.state.as_str().to_owned(),
            consecutive_failures: Some(u64::from(breaker.consecutive_failures)),
            open_until: breaker.open_until.map(Timestamp::as_millis),
            instance: breaker.probe_holder.as_deref().and_then(|holder| holder.split(' ').next()).map(str::to_owned),
            reported_at: breaker.updated_at.as_millis(),
            shared: true,
            probe_holder: breaker.probe_holder.clone(),
            probe_until: breaker.probe_until.map(Timestamp::as_millis),
        }
    }
}

impl BreakerView {
    /// Every breaker: the shared ones and those processes reported, sorted
    /// by endpoint (a shared breaker first).
    pub fn all(shared: &[SharedBreaker], reported: &[ComponentStatus]) -> Vec<BreakerView> {
        let mut views: Vec<BreakerView> = shared.iter().map(BreakerView::from).chain(reported.iter().map(BreakerView::from)).collect();
        views.sort_by(|a, b| a.endpoint.cmp(&b.endpoint).then(b.shared.cmp(&a.shared)));
        views
    }
}

impl From<&ComponentStatus> for BreakerView {
    fn from(status: &ComponentStatus) -> Self {
        let text = |field: &str| status.value[field].as_str().map(str::to_owned);
        BreakerView {
            endpoint: text("endpoint").unwrap_or_else(|| rota_engine::status::breaker_endpoint(&status.key).to_owned()),
            agent: text("agent"),
            state: text("state").unwrap_or_else(|| "unknown".to_owned()),
            consecutive_failures: status.value["consecutive_failures"].as_u64(),
            open_until: status.value["open_until"].as_i64(),
            instance: text("instance"),
            reported_at: status.reported_at.as_millis(),
            shared: false,
            probe_holder: None,
            probe_until: None,
        }
    }
}

/// One step of a workflow definition, in a summary.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkflowStepView {
    /// The step's name.
    pub name: String,
    /// The agent that runs it (absent for a step that waits for a signal).
    pub agent: Option<String>,
    /// The signal it waits for (absent for a step that calls an agent).
    pub waits_for: Option<String>,
    /// Its `when` condition as written (absent without one).
    pub when: Option<String>,
    /// Whether a callback completes it.
    #[serde(default)]
    pub callback: bool,
    /// The steps it waits for.
    pub depends_on: Vec<String>,
    /// Whether it has a compensation.
    pub compensated: bool,
}

/// A registered workflow version.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkflowView {
    /// Its name.
    pub name: String,
    /// The version.
    pub version: u32,
    /// When it was registered, epoch ms (absent for a definition that was only validated).
    pub registered_at: Option<i64>,
    /// Its steps.
    pub steps: Vec<WorkflowStepView>,
    /// The resolved definition, in its canonical JSON form.
    pub definition: Value,
    /// Whether an operator paused the workflow: no Scheduler claims its
    /// tasks until it is resumed.
    #[serde(default)]
    pub paused: bool,
    /// The latest pause or resume of the workflow, with who, why and when;
    /// absent when it was never paused.
    #[serde(default)]
    pub pause: Option<WorkflowPauseView>,
}

/// An operator's pause or resume of a workflow.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkflowPauseView {
    /// The workflow.
    pub workflow: String,
    /// Whether it is paused (the change was a pause) or not (a resume).
    pub paused: bool,
    /// Who made the change (as a task's pause records it).
    pub by: String,
    /// Why, when given.
    pub reason: Option<String>,
    /// When, epoch ms.
    pub at: i64,
}

impl From<&rota_store::WorkflowPause> for WorkflowPauseView {
    fn from(pause: &rota_store::WorkflowPause) -> Self {
        WorkflowPauseView {
            workflow: pause.workflow.to_string(),
            paused: pause.paused,
            by: pause.by.clone(),
            reason: pause.reason.clone(),
            at: pause.at.as_millis(),
        }
    }
}

impl WorkflowView {
    /// The view of a definition, registered at `registered_at` if it was.
    pub fn new(workflow: &rota_workflow::Workflow, registered_at: Option<i64>) -> Self {
        WorkflowView {
            name: workflow.name().to_string(),
            version: workflow.version(),
            registered_at,
            steps: workflow
                .steps()
                .iter()
                .map(|step| WorkflowStepView {
                    name: step.name().to_string(),
                    agent: step.agent().map(ToString::to_string),
                    waits_for: step.waits_for().map(ToString::to_string),
                    when: step.when().map(|c| c.source().to_owned()),
                    callback: step.completes_by_callback(),
                    depends_on: step.depends_on().iter().map(ToString::to_string).collect(),
                    compensated: step.compensate().is_some(),
                })
                .collect(),
            definition: serde_json::to_value(workflow).unwrap_or(Value::Null),
            paused: false,
            pause: None,
        }
    }

    /// The view with the workflow's latest pause or resume, found among
    /// `pauses` by name.
    pub fn with_pause(mut self, pauses: &[rota_store::WorkflowPause]) -> Self {
        if let Some(pause) = pauses.iter().find(|p| p.workflow.as_str() == self.name) {
            self.paused = pause.paused;
            self.pause = Some(WorkflowPauseView::from(pause));
        }
        self
    }

    /// The view of a registry entry; `None` when the stored definition is unreadable.
    pub fn from_entry(entry: &WorkflowEntry) -> Option<Self> {
        let workflow: rota_workflow::Workflow = serde_json::from_value(entry.definition.clone()).ok()?;
        Some(WorkflowView::new(&workflow, Some(entry.registered_at.as_millis())))
    }
}

/// One problem of a workflow definition.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProblemView {
    /// 1-based line, 0 when there is no position.
    pub line: u32,
    /// 1-based column, 0 when there is no position.
    pub column: u32,
    /// What is wrong.
    pub message: String,
}

/// The outcome of validating a definition.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ValidationView {
    /// Whether it is valid.
    pub valid: bool,
    /// The resolved definition, when valid.
    pub workflow: Option<WorkflowView>,
    /// Every problem, in source order (empty when valid).
    pub problems: Vec<ProblemView>,
}

/// The body of a refused registration: the error and every problem.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct InvalidWorkflowBody {
    /// The error (`invalid_workflow`).
    pub error: crate::error::ErrorDetail,
    /// Every problem, in source order.
    pub problems: Vec<ProblemView>,
}

/// Liveness or readiness.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok`, or `unavailable` (readiness only).
    pub status: String,
    /// The store's backend, for `/readyz`.
    pub store: Option<String>,
}

/// Filters of `GET /v1/tasks`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TaskListQuery {
    /// Only tasks in this state.
    #[param(value_type = Option<TaskStateView>)]
    pub state: Option<String>,
    /// Only tasks of this workflow.
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub workflow: Option<String>,
    /// Only tasks held by this Scheduler instance.
    #[param(pattern = r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$", max_length = 200)]
    pub locked_by: Option<String>,
    /// `true`: only tasks at risk, that is held (so unfinished) tasks for
    /// which the Supervisor raised a deadline warning (`at_risk`) during
    /// their current lease, of the task or of one of its steps; they stay
    /// listed until the lease ends (finished, failed, expired, released).
    /// `false` or absent: no such filter.
    pub at_risk: Option<bool>,
    /// Only tasks with this tag, written `key=value`; repeat the parameter
    /// for tasks having every one given.
    #[param(value_type = Option<Vec<String>>, max_items = 16, explode = true, style = Form)]
    #[serde(default)]
    pub tag: Vec<String>,
    /// Only tasks created at or after this time (RFC 3339).
    #[param(example = "2026-11-28T00:00:00Z", max_length = 64)]
    pub created_after: Option<String>,
    /// Only tasks created strictly before this time (RFC 3339).
    #[param(example = "2026-11-29T00:00:00Z", max_length = 64)]
    pub created_before: Option<String>,
    /// Only finished tasks (processed, error, compensated, cancelled) that
    /// ended at or after this time (RFC 3339).
    #[param(example = "2026-11-28T00:00:00Z", max_length = 64)]
    pub ended_after: Option<String>,
    /// Only finished tasks that ended strictly before this time (RFC 3339).
    #[param(example = "2026-11-29T00:00:00Z", max_length = 64)]
    pub ended_before: Option<String>,
    /// Only tasks whose id starts with this text.
    #[param(max_length = 200)]
    pub id_prefix: Option<String>,
    /// Only the children of this task: the tasks its `workflow:` steps
    /// started.
    #[param(pattern = r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$", max_length = 200)]
    pub parent: Option<String>,
    /// Only tasks created before this task: the cursor of keyset paging
    /// (pass the id of the last task of a page to get the next page). An id
    /// that names no task is refused (400 `invalid_query`).
    #[param(pattern = r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$", max_length = 200)]
    pub before: Option<String>,
    /// The most tasks to return, newest first (default 100, at most the configured maximum, 1000 by default).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// Filters of `GET /v1/tasks/counts`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TaskCountsQuery {
    /// Only tasks of this workflow.
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub workflow: Option<String>,
    /// Only tasks with this tag, written `key=value`; repeat the parameter
    /// for tasks having every one given.
    #[param(value_type = Option<Vec<String>>, max_items = 16, explode = true, style = Form)]
    #[serde(default)]
    pub tag: Vec<String>,
    /// Only tasks created at or after this time (RFC 3339).
    #[param(example = "2026-11-28T00:00:00Z", max_length = 64)]
    pub created_after: Option<String>,
    /// Only tasks created strictly before this time (RFC 3339).
    #[param(example = "2026-11-29T00:00:00Z", max_length = 64)]
    pub created_before: Option<String>,
    /// Only finished tasks (processed, error, compensated, cancelled) that
    /// ended at or after this time (RFC 3339).
    #[param(example = "2026-11-28T00:00:00Z", max_length = 64)]
    pub ended_after: Option<String>,
    /// Only finished tasks that ended strictly before this time (RFC 3339).
    #[param(example = "2026-11-29T00:00:00Z", max_length = 64)]
    pub ended_before: Option<String>,
    /// Only tasks whose id starts with this text.
    #[param(max_length = 200)]
    pub id_prefix: Option<String>,
    /// Only the children of this task: the tasks its `workflow:` steps
    /// started.
    #[param(pattern = r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$", max_length = 200)]
    pub parent: Option<String>,
}

/// How many tasks are in each state: every state, zeros included.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct TaskCountsByState {
    /// Waiting for a Scheduler.
    pub pending: u64,
    /// Held by a Scheduler.
    pub processing: u64,
    /// Every step completed.
    pub processed: u64,
    /// Failed for good.
    pub error: u64,
    /// Undoing completed steps.
    pub compensating: u64,
    /// Undone.
    pub compensated: u64,
    /// Cancelled.
    pub cancelled: u64,
}

/// Exact task counts by state, and their total.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TaskCounts {
    /// Every state, by the names `state` takes in a task.
    pub counts: TaskCountsByState,
    /// Every task counted.
    pub total: u64,
}

impl From<&[(TaskState, u64)]> for TaskCounts {
    fn from(counted: &[(TaskState, u64)]) -> Self {
        let mut counts = TaskCountsByState::default();
        for (state, count) in counted {
            let slot = match state {
                TaskState::Pending => &mut counts.pending,
                TaskState::Processing => &mut counts.processing,
                TaskState::Processed => &mut counts.processed,
                TaskState::Error => &mut counts.error,
                TaskState::Compensating => &mut counts.compensating,
                TaskState::Compensated => &mut counts.compensated,
                TaskState::Cancelled => &mut counts.cancelled,
            };
            *slot += count;
        }
        TaskCounts { total: counted.iter().map(|(_, count)| count).sum(), counts }
    }
}

impl TaskCounts {
    /// How many are in `state`.
    pub fn of(&self, state: TaskState) -> u64 {
        let counts = &self.counts;
        match state {
            TaskState::Pending => counts.pending,
            TaskState::Processing => counts.processing,
            TaskState::Processed => counts.processed,
            TaskState::Error => counts.error,
            TaskState::Compensating => counts.compensating,
            TaskState::Compensated => counts.compensated,
            TaskState::Cancelled => counts.cancelled,
        }
    }
}

/// Why an operator acts, where the request has no body (a DELETE).
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReasonQuery {
    /// Why, kept in the audit log with who did it (at most 1000
    /// characters).
    pub reason: Option<String>,
}

/// A listing's bound.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LimitQuery {
    /// The most items to return (default 100, at most the configured maximum, 1000 by default).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// Filters of `GET /v1/events`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only events of tasks of this workflow.
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub workflow: Option<String>,
    /// Only events of these kinds, comma-separated (`step_completed,processed`).
    #[param(
        pattern = r"^(received|claimed|step_started|step_completed|step_skipped|step_failed|expired|processed|error|compensation_started|step_compensated|compensated|cancelled|resubmitted|released|alert|signal|at_risk|callback|paused|resumed|call_stopped)(,(received|claimed|step_started|step_completed|step_skipped|step_failed|expired|processed|error|compensation_started|step_compensated|compensated|cancelled|resubmitted|released|alert|signal|at_risk|callback|paused|resumed|call_stopped))*$"
    )]
    pub kind: Option<String>,
    /// Start after this event seq (as `Last-Event-ID` does; the header wins).
    #[param(minimum = 0)]
    pub after: Option<i64>,
}

/// Where a per-task event stream starts.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TaskEventsQuery {
    /// Start after this event seq (as `Last-Event-ID` does; the header wins).
    #[param(minimum = 0)]
    pub after: Option<i64>,
}

/// A task in the path.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TaskPath {
    /// The task id, URL-encoded (up to 200 bytes; see `SubmitRequest.id`).
    #[param(pattern = r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$", max_length = 200)]
    pub id: String,
}

/// A step of a task in the path.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct StepPath {
    /// The task id, URL-encoded.
    #[param(pattern = r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$", max_length = 200)]
    pub id: String,
    /// The step's name.
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub step: String,
}

/// A queue in the path.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct QueuePath {
    /// The queue's name.
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub queue: String,
}

/// A dead letter in the path.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct DeadLetterPath {
    /// The queue's name.
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub queue: String,
    /// The message id, URL-encoded.
    #[param(pattern = r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$", max_length = 200)]
    pub id: String,
}

/// A workflow in the path.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct WorkflowPath {
    /// The workflow's name.
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub name: String,
}

/// A workflow version in the path.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct WorkflowVersionPath {
    /// The workflow's name.
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub name: String,
    /// The version (read as text here, so that a bad one gets this API's error).
    #[param(value_type = u32, minimum = 1)]
    pub version: String,
}

/// An agent in the path of a worker-protocol endpoint.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct AgentPath {
    /// The agent's name, as workflow steps name it in `agent:` (one of the
    /// remote agents the server is configured with).
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,94}$")]
    pub agent: String,
}

/// A worker asks for step requests (a long poll).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReceiveRequest {
    /// The most requests to lease (default 1; at most the server's
    /// `WorkerConfig::receive_max`).
    #[schema(minimum = 1)]
    pub max: Option<u32>,
    /// How long to wait for a first request when none is ready, in ms
    /// (default and most: the server's `WorkerConfig::receive_wait_max`).
    /// 0 answers at once.
    #[schema(minimum = 0)]
    pub wait_ms: Option<u64>,
    /// The worker's name, recorded as the owner of its leases (for
    /// operators; it grants nothing).
    #[schema(pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub worker: Option<String>,
}

/// The step requests leased to a worker (none when the wait ended first).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReceiveResponse {
    /// The requests, oldest first.
    pub requests: Vec<WorkRequest>,
}

/// One attempt of one step, for an external worker to run before
/// `complete_by`, exactly as a built-in agent receives it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkRequest {
    /// The proof of this lease: pass it to `renew`, `complete` or `fail`.
    /// Opaque; signed by the server.
    pub lease_token: String,
    /// When the lease runs out unless renewed (ms since the epoch).
    pub lease_until: i64,
    /// The task.
    pub task_id: String,
    /// The workflow and its version (`name@version`).
    pub workflow: String,
    /// The step (or the step whose compensation this is).
    pub step: String,
    /// The Scheduler's attempt number of the step (1-based).
    pub attempt: u32,
    /// Whether this is the step's compensating action.
    pub compensate: bool,
    /// The step's input, templates resolved.
    pub input: Value,
    /// The key the remote side uses to apply the effect once: the same for
    /// every attempt of the step (`<task>/<step>`, `/compensate` appended
    /// for the compensation).
    pub idempotency_key: String,
    /// The deadline (ms since the epoch): past it, stop and send nothing;
    /// a reply after it is dropped.
    pub complete_by: i64,
    /// For a step completed by a callback: the attempt's one-time token.
    /// Pass it to the remote service, which completes the step with
    /// `POST /v1/callbacks/{token}`; the worker's own `complete` then only
    /// says that the request was accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_token: Option<String>,
    /// How many times this request has been delivered, this time included.
    pub delivery_count: u32,
    /// The retry policy for transient faults within the deadline.
    pub retry: RetryView,
}

/// The retry policy an agent follows within one attempt's deadline.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RetryView {
    /// The most tries within the attempt.
    pub attempts_max: u32,
    /// The first backoff, in ms.
    pub backoff_initial_ms: u64,
    /// The longest backoff, in ms.
    pub backoff_max_ms: u64,
    /// The classes of transient failure not to retry but to fail at once
    /// (the step's `retry.non_retryable`): HTTP statuses (`"503"`) and
    /// kinds (`"timeout"`, `"connection"`, ...). A `fail` naming one of them
    /// as its `class` fails the step for good.
    #[serde(default)]
    pub non_retryable: Vec<String>,
}

/// Extend a lease.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewRequest {
    /// The lease token from `receive`.
    pub lease_token: String,
    /// The new lease length from now, in ms (default: the server's
    /// `WorkerConfig::lease`); cut at the step's deadline.
    #[schema(minimum = 1)]
    pub lease_ms: Option<u64>,
}

/// A renewed lease.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RenewResponse {
    /// When the lease runs out now (ms since the epoch); never after `complete_by`.
    pub lease_until: i64,
}

/// A step request succeeded.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    /// The lease token from `receive`.
    pub lease_token: String,
    /// The step's output (any JSON; `null` when absent).
    #[serde(default)]
    pub output: Value,
}

/// A step request failed.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    /// The lease token from `receive`.
    pub lease_token: String,
    /// What went wrong (kept in the step's history).
    pub message: String,
    /// `true`: a transient fault (the worker gave up its tries within the
    /// deadline; the step stays recoverable and is retried after a backoff).
    /// `false`: a permanent fault (the task goes to `error` or compensates).
    pub retryable: bool,
    /// What the fault was, in the words of `retry.non_retryable`: an HTTP
    /// status (`"503"`) or a kind (`"timeout"`). A retryable fault whose
    /// class the step's policy lists fails the step at once, its message
    /// saying so.
    #[serde(default)]
    pub class: Option<String>,
}

/// The reply that was committed for a request.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReplyView {
    /// The task.
    pub task_id: String,
    /// The step.
    pub step: String,
    /// The attempt answered.
    pub attempt: u32,
    /// `succeeded` or `failed`.
    pub status: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rota_model::{StepName, TaskId, Timestamp};
    use rota_store::EventKind;

    /// Webhook receivers and event-stream readers parse one shape.
    #[test]
    fn webhook_bodies_have_the_shape_of_stream_events() {
        let task = TaskId::new("t-1").unwrap();
        let mut event =
            Event::task(&task, Timestamp::from_millis(1_795_000_000_000), EventKind::StepFailed, serde_json::json!({ "error": "x" }));
        event.seq = 42;
        event.step = Some(StepName::new("charge").unwrap());
        event.attempt = Some(2);
        let streamed = serde_json::to_value(EventView::from(&event)).unwrap();
        let posted = serde_json::to_value(rota_engine::webhooks::WebhookEvent::from(&event)).unwrap();
        assert_eq!(streamed, posted);
    }
}

/// A workflow version an instance registered.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct InstanceWorkflowView {
    /// The workflow.
    pub name: String,
    /// The version.
    pub version: u64,
}

/// A process, as its last heartbeat shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct InstanceView {
    /// Its instance id.
    pub instance: String,
    /// The roles it runs (`scheduler`, `agent`, `supervisor`).
    pub roles: Vec<String>,
    /// The agents it runs.
    pub agents: Vec<String>,
    /// When it last reported, epoch ms (every 2 s while it runs).
    pub last_heartbeat: i64,
    /// Whether it runs: its last heartbeat is recent (three report
    /// intervals) and does not say it stopped.
    pub live: bool,
    /// Whether it holds the Supervisors' leader lease now.
    pub supervisor_leader: bool,
    /// Whether its last heartbeat said it stopped cleanly.
    pub stopped: bool,
    /// When it started, epoch ms.
    pub started_at: Option<i64>,
    /// Its process id, on its own machine.
    pub pid: Option<u64>,
    /// The workflow versions it registered when it started.
    pub workflows: Vec<InstanceWorkflowView>,
}

/// The Supervisors' leader lease.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LeaderView {
    /// The instance that holds it.
    pub holder: String,
    /// When it runs out unless renewed, epoch ms.
    pub until: i64,
    /// Raised at every change of holder.
    pub epoch: u64,
}

/// The running processes and the Supervisors' leader.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct InstancesView {
    /// Every instance that reported a heartbeat to this store in the last
    /// 24 hours, live or not, sorted by id.
    pub instances: Vec<InstanceView>,
    /// Who leads the Supervisors now; null when nobody does.
    pub supervisor_leader: Option<LeaderView>,
}

impl InstancesView {
    /// The view of `instances` and the running leader lease.
    pub fn new(instances: &[rota_engine::status::Instance], leader: Option<&rota_store::LeaderLease>) -> Self {
        let leads = |instance: &str| leader.is_some_and(|lease| lease.holder.as_str() == instance);
        InstancesView {
            instances: instances
                .iter()
                .map(|instance| InstanceView {
                    instance: instance.instance.clone(),
                    roles: instance.roles.clone(),
                    agents: instance.agents.clone(),
                    last_heartbeat: instance.last_heartbeat.as_millis(),
                    live: instance.live,
                    supervisor_leader: leads(&instance.instance),
                    stopped: instance.stopped,
                    started_at: instance.started_at.map(|at| at.as_millis()),
                    pid: instance.pid,
                    workflows: instance
                        .workflows
                        .iter()
                        .map(|(name, version)| InstanceWorkflowView { name: name.clone(), version: *version })
                        .collect(),
                })
                .collect(),
            supervisor_leader: leader.map(|lease| LeaderView {
                holder: lease.holder.to_string(),
                until: lease.until.as_millis(),
                epoch: lease.epoch,
            }),
        }
    }
}

/// The window of `GET /v1/activity`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ActivityQuery {
    /// How many minutes, up to the current one (default 15, at most 60).
    #[param(minimum = 1, maximum = 60)]
    pub minutes: Option<u32>,
}

/// One minute of activity.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ActivityMinuteView {
    /// When the minute starts, epoch ms (a whole minute).
    pub start: i64,
    /// Tasks submitted.
    pub received: u64,
    /// Tasks that ended processed.
    pub processed: u64,
    /// Tasks that ended in error.
    pub errors: u64,
    /// Steps completed.
    pub steps_completed: u64,
    /// Median time from a step attempt's start to its completion, of the
    /// steps completed in this minute; null when none.
    pub step_latency_p50_ms: Option<f64>,
    /// Its 99th percentile.
    pub step_latency_p99_ms: Option<f64>,
}

/// Throughput and step latency per minute, from the newest events.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ActivityView {
    /// Every minute of the window, oldest first; the last is the current one.
    pub minutes: Vec<ActivityMinuteView>,
    /// How many events were read (the newest ones, at most 20000).
    pub events_read: u64,
    /// Whether every event of the window was read; false when the window
    /// held more events than the bound, so its oldest minutes count too few.
    pub complete: bool,
}

impl From<&rota_engine::activity::Activity> for ActivityView {
    fn from(activity: &rota_engine::activity::Activity) -> Self {
        ActivityView {
            minutes: activity
                .minutes
                .iter()
                .map(|minute| ActivityMinuteView {
                    start: minute.start.as_millis(),
                    received: minute.received,
                    processed: minute.processed,
                    errors: minute.errors,
                    steps_completed: minute.steps_completed,
                    step_latency_p50_ms: minute.step_latency_p50_ms,
                    step_latency_p99_ms: minute.step_latency_p99_ms,
                })
                .collect(),
            events_read: activity.events_read as u64,
            complete: activity.complete,
        }
    }
}

/// A request to create a schedule (`POST /v1/schedules`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    /// The schedule's name: ASCII letters, digits, `-`, `_`, `.`, `:`.
    #[schema(example = "nightly-report", pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub name: String,
    /// The workflow each fire submits (its latest version at the fire).
    #[schema(example = "report", pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub workflow: String,
    /// A cron expression: five fields, or six with seconds first
    /// (`0 30 2 * * *`); croner's syntax (`L`, `W`, `#`, `@daily`…).
    #[schema(example = "0 30 2 * * *")]
    pub cron: String,
    /// The IANA time zone the expression is read in; `UTC` when absent.
    #[schema(example = "Europe/Paris")]
    #[serde(default)]
    pub timezone: Option<String>,
    /// The input of every task it starts (any JSON); `{}` when absent.
    #[serde(default)]
    pub input: Option<Value>,
    /// While the last fire's task runs: `skip` (the default), `allow`, or `buffer-one`.
    #[schema(example = "skip")]
    #[serde(default)]
    pub overlap: Option<String>,
    /// After a time nobody fired it: `none`, `latest` (the default), or `all`.
    #[schema(example = "latest")]
    #[serde(default)]
    pub catch_up: Option<String>,
}

impl ScheduleRequest {
    /// The schedule this asks for, the defaults filled in; an error starts
    /// with the field at fault. The API and the CLI on a local store both
    /// read a request through this.
    pub fn to_new_schedule(&self) -> Result<rota_store::NewSchedule, String> {
        let name = rota_model::ScheduleName::new(self.name.as_str()).map_err(|err| format!("name: {err}"))?;
        let workflow = rota_model::WorkflowName::new(self.workflow.as_str()).map_err(|err| format!("workflow: {err}"))?;
        let policy = |err: rota_model::ScheduleError| format!("{}: {err}", err.field());
        let overlap = self.overlap.as_deref().map(str::parse).transpose().map_err(policy)?.unwrap_or_default();
        let catch_up = self.catch_up.as_deref().map(str::parse).transpose().map_err(policy)?.unwrap_or_default();
        let spec = rota_store::ScheduleSpec {
            workflow,
            cron: self.cron.trim().to_owned(),
            timezone: self.timezone.as_deref().map_or("UTC", str::trim).to_owned(),
            input: self.input.clone().unwrap_or_else(|| serde_json::json!({})),
            overlap,
            catch_up,
        };
        spec.parse_cron().map_err(policy)?;
        Ok(rota_store::NewSchedule { name, spec, source: rota_store::ScheduleSource::Api })
    }
}

/// A schedule, with its next fire time and its progress.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScheduleView {
    /// Its name.
    pub name: String,
    /// The workflow each fire submits.
    pub workflow: String,
    /// The cron expression.
    pub cron: String,
    /// The IANA time zone the expression is read in.
    pub timezone: String,
    /// The input of every task it starts.
    pub input: Value,
    /// `skip`, `allow` or `buffer-one`.
    pub overlap: String,
    /// `none`, `latest` or `all`.
    pub catch_up: String,
    /// `api` (created by an operator) or `file` (declared in a workflow file).
    pub source: String,
    /// Whether it is paused.
    pub paused: bool,
    /// The next fire time the leader will handle, epoch ms: in the past when
    /// a fire is due and not handled yet; absent when paused.
    pub next_fire_at: Option<i64>,
    /// Every fire time up to this one has been handled, epoch ms.
    pub fired_through: i64,
    /// The fire time of the last task a cron fire started, epoch ms.
    pub last_fire_at: Option<i64>,
    /// That task's id.
    pub last_task: Option<String>,
    /// A fire waiting for the last task to finish (`buffer-one`), epoch ms.
    pub buffered_fire_at: Option<i64>,
    /// How many fires the overlap policy skipped.
    pub skipped: u64,
    /// The fire time of the last skipped fire, epoch ms.
    pub last_skipped_at: Option<i64>,
    /// When it was created, epoch ms.
    pub created_at: i64,
    /// When it was last changed, epoch ms.
    pub updated_at: i64,
}

impl From<&rota_engine::schedules::ScheduleDetail> for ScheduleView {
    fn from(detail: &rota_engine::schedules::ScheduleDetail) -> Self {
        let record = &detail.record;
        let progress = &record.progress;
        let millis = |at: Option<rota_model::Timestamp>| at.map(rota_model::Timestamp::as_millis);
        ScheduleView {
            name: record.name.to_string(),
            workflow: record.spec.workflow.to_string(),
            cron: record.spec.cron.clone(),
            timezone: record.spec.timezone.clone(),
            input: record.spec.input.clone(),
            overlap: record.spec.overlap.as_str().to_owned(),
            catch_up: record.spec.catch_up.as_str().to_owned(),
            source: record.source.as_str().to_owned(),
            paused: record.paused,
            next_fire_at: millis(detail.next_fire),
            fired_through: progress.fired_through.as_millis(),
            last_fire_at: millis(progress.last_fire_at),
            last_task: progress.last_task.as_ref().map(ToString::to_string),
            buffered_fire_at: millis(progress.buffered_fire_at),
            skipped: progress.skipped,
            last_skipped_at: millis(progress.last_skipped_at),
            created_at: record.created_at.as_millis(),
            updated_at: record.updated_at.as_millis(),
        }
    }
}

/// A schedule in the path.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SchedulePath {
    /// The schedule's name.
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub name: String,
}

/// A bulk action to start: `POST /v1/batches`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// What to do: `cancel` or `resubmit` (tasks in Error) each task
    /// `filter` selects, or `redrive` each dead letter `dead_letters`
    /// selects.
    #[schema(value_type = String, example = "resubmit")]
    pub action: String,
    /// Which tasks (cancel, resubmit): the filters of `GET /v1/tasks`,
    /// every one given must match; at least one is required. A resubmit
    /// without `state` selects the tasks in Error. Not with `redrive`.
    #[serde(default)]
    pub filter: BatchFilterView,
    /// Which dead letters (`redrive`, which requires it; not with the
    /// other actions).
    #[serde(default)]
    pub dead_letters: Option<DeadLetterFilterView>,
    /// Why (at most 1000 characters), kept with the batch.
    #[schema(max_length = 1000)]
    pub reason: Option<String>,
}

/// The filters of a batch, as `GET /v1/tasks` takes them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchFilterView {
    /// Only tasks in this state.
    #[schema(value_type = Option<TaskStateView>)]
    pub state: Option<String>,
    /// Only tasks of this workflow.
    #[schema(pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub workflow: Option<String>,
    /// Only tasks having every one of these tags (`key=value`).
    #[serde(default)]
    #[schema(max_items = 16)]
    pub tag: Vec<String>,
    /// Only tasks created at or after this time (RFC 3339).
    #[schema(max_length = 64)]
    pub created_after: Option<String>,
    /// Only tasks created strictly before this time (RFC 3339).
    #[schema(max_length = 64)]
    pub created_before: Option<String>,
    /// Only finished tasks that ended at or after this time (RFC 3339).
    #[schema(max_length = 64)]
    pub ended_after: Option<String>,
    /// Only finished tasks that ended strictly before this time (RFC 3339).
    #[schema(max_length = 64)]
    pub ended_before: Option<String>,
    /// Only tasks whose id starts with this text.
    #[schema(max_length = 200)]
    pub id_prefix: Option<String>,
    /// Only the children of this task.
    #[schema(pattern = r"^[^\s\x00-\x1f\x7f-\x9f](?:[^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$", max_length = 200)]
    pub parent: Option<String>,
}

/// The dead letters of one queue a redrive batch sends back: those
/// matching every condition given.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterFilterView {
    /// The queue whose dead letters (required).
    #[schema(pattern = r"^[A-Za-z0-9._:-]{1,100}$")]
    pub queue: String,
    /// Only dead letters whose reason contains this text (case-sensitive).
    #[schema(max_length = 1000)]
    pub reason_contains: Option<String>,
    /// Only dead letters dead-lettered at or after this time (RFC 3339).
    #[schema(max_length = 64)]
    pub dead_lettered_after: Option<String>,
    /// Only dead letters dead-lettered strictly before this time (RFC 3339).
    #[schema(max_length = 64)]
    pub dead_lettered_before: Option<String>,
}

impl From<&rota_store::DeadLetterFilter> for DeadLetterFilterView {
    fn from(filter: &rota_store::DeadLetterFilter) -> Self {
        DeadLetterFilterView {
            queue: filter.queue.to_string(),
            reason_contains: filter.reason_contains.clone(),
            dead_lettered_after: filter.dead_lettered.from.map(rfc3339),
            dead_lettered_before: filter.dead_lettered.until.map(rfc3339),
        }
    }
}

/// A bulk action and how far it got.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BatchView {
    /// Its id.
    pub id: String,
    /// `cancel`, `resubmit` or `redrive`.
    pub action: String,
    /// The tasks it acts on (closed at its creation: later tasks are not
    /// selected); empty for a redrive.
    pub filter: BatchFilterView,
    /// The dead letters a redrive sends back (closed at its creation:
    /// later dead letters are not selected); absent for the other actions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letters: Option<DeadLetterFilterView>,
    /// `running` (a runner holds it or the next takes it), `stopped` (by
    /// an operator), `done`.
    pub state: String,
    /// How many tasks (dead letters) the filter selected when it was made.
    pub total: u64,
    /// Tasks (dead letters) acted on.
    pub done: u64,
    /// Tasks the action no longer applied to (already finished, no longer
    /// in Error, deleted); dead letters no longer there (redriven before a
    /// restart, purged).
    pub skipped: u64,
    /// Tasks it failed on; `last_error` says the latest.
    pub failed: u64,
    /// The latest failure, naming its task.
    pub last_error: Option<String>,
    /// Who asked (the token's name, or the OS user of a local CLI).
    pub requested_by: String,
    /// Why, if they said.
    pub reason: Option<String>,
    /// The runner holding it.
    pub locked_by: Option<String>,
    /// Until when the runner holds it, epoch ms.
    pub lease_until: Option<i64>,
    /// When it was made, epoch ms.
    pub created_at: i64,
    /// When it last changed, epoch ms.
    pub updated_at: i64,
}

fn rfc3339(at: rota_model::Timestamp) -> String {
    let millis = u64::try_from(at.as_millis()).unwrap_or(0);
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_millis(millis)).to_string()
}

impl From<&rota_store::TaskFilter> for BatchFilterView {
    fn from(filter: &rota_store::TaskFilter) -> Self {
        BatchFilterView {
            state: filter.state.map(|s| s.as_str().to_owned()),
            workflow: filter.workflow.as_ref().map(ToString::to_string),
            tag: filter.tags.iter().map(|(key, value)| format!("{key}={value}")).collect(),
            created_after: filter.created.from.map(rfc3339),
            created_before: filter.created.until.map(rfc3339),
            ended_after: filter.ended.from.map(rfc3339),
            ended_before: filter.ended.until.map(rfc3339),
            id_prefix: filter.id_prefix.clone(),
            parent: filter.parent.as_ref().map(ToString::to_string),
        }
    }
}

impl From<&rota_store::BatchRecord> for BatchView {
    fn from(batch: &rota_store::BatchRecord) -> Self {
        BatchView {
            id: batch.id.clone(),
            action: batch.action.to_string(),
            filter: match &batch.filter {
                rota_store::BatchFilter::Tasks(filter) => BatchFilterView::from(filter),
                rota_store::BatchFilter::DeadLetters(_) => BatchFilterView::default(),
            },
            dead_letters: match &batch.filter {
                rota_store::BatchFilter::Tasks(_) => None,
                rota_store::BatchFilter::DeadLetters(filter) => Some(DeadLetterFilterView::from(filter)),
            },
            state: batch.state.to_string(),
            total: batch.total,
            done: batch.done,
            skipped: batch.skipped,
            failed: batch.failed,
            last_error: batch.last_error.clone(),
            requested_by: batch.requested_by.clone(),
            reason: batch.reason.clone(),
            locked_by: batch.locked_by.as_ref().map(ToString::to_string),
            lease_until: batch.lease_until.map(|t| t.as_millis()),
            created_at: batch.created_at.as_millis(),
            updated_at: batch.updated_at.as_millis(),
        }
    }
}

/// A batch's id in a path.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct BatchPath {
    /// The batch id.
    #[param(max_length = 200)]
    pub id: String,
}

/// Filters of `GET /v1/audit`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Only actions at or after this time (RFC 3339).
    #[param(example = "2026-11-28T00:00:00Z", max_length = 64)]
    pub since: Option<String>,
    /// Only this action (`task.cancel`, `task.resubmit`, `task.pause`,
    /// `task.resume`, `task.signal`, `queue.pause`, `queue.resume`,
    /// `dlq.redrive`, `dlq.purge`, `prune`, `workflow.pause`,
    /// `workflow.resume`, `schedule.pause`, `schedule.resume`,
    /// `schedule.trigger`, `schedule.delete`, `batch.create`, `batch.stop`,
    /// `batch.resume`).
    #[param(max_length = 32)]
    pub action: Option<String>,
    /// Only actions by exactly this name (a token's name, `cli, user NAME`).
    #[param(max_length = 200)]
    pub by: Option<String>,
    /// Only actions older than this one: the `cursor` of the last entry
    /// of the previous page.
    #[param(example = "1764300000000.h42", max_length = 64)]
    pub after: Option<String>,
    /// The most entries to return, newest first (default 100, at most the configured maximum, 1000 by default).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// One operator action.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditEntryView {
    /// Its place in the listing: pass it as `after` for the next page.
    pub cursor: String,
    /// When, epoch ms.
    pub at: i64,
    /// What (`task.cancel`, `dlq.redrive`…).
    pub action: String,
    /// Who: the token's name, the OS user of a local CLI
    /// (`cli, user NAME`), or the Supervisor's retention.
    pub by: String,
    /// Why, if they said.
    pub reason: Option<String>,
    /// What it was done to: a task id, a queue, a workflow, a schedule, a
    /// batch id.
    pub target: String,
    /// What it did: counts (`moved`, `purged`, `tasks`), a task action's
    /// history detail (with its `step`).
    pub detail: Value,
}

impl From<&rota_store::AuditEntry> for AuditEntryView {
    fn from(entry: &rota_store::AuditEntry) -> Self {
        AuditEntryView {
            cursor: entry.cursor.to_string(),
            at: entry.at().as_millis(),
            action: entry.action.as_str().to_owned(),
            by: entry.by.clone(),
            reason: entry.reason.clone(),
            target: entry.target.clone(),
            detail: entry.detail.clone(),
        }
    }
}
