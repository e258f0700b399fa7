//! The state store: tasks, their steps, their history, and the leader
//! lease that elects one Supervisor.
//!
//! Writes other than creation and claiming go through [`Tasks::commit`]: a
//! set of fenced compare-and-set updates plus the messages to send and
//! complete, applied atomically. That is how the Scheduler records a state
//! change *before* acting on it (the next step's request is sent in the same
//! commit that records the previous step's completion) and how a reply
//! message is consumed exactly when its effect is recorded.

use std::time::Duration;

use async_trait::async_trait;
use rota_model::{
    InstanceId, LeaseToken, QueueName, ScheduleName, Step, StepName, StepState, Task, TaskId, TaskState, Timestamp, WorkflowName,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Result;
use crate::audit::{AuditEntry, AuditFilter, NewAudit};
use crate::batch::{BatchProgress, BatchRecord, NewBatch};
use crate::breaker::{BreakerAdmission, BreakerAsk, BreakerReport, SharedBreaker};
use crate::claim::Claim;
use crate::prune::{InstanceSweep, Prune, Pruned, Swept};
use crate::queue::Outgoing;
use crate::rate::{RateRequest, RateSlot};
use crate::schedule::{NewSchedule, ScheduleProgress, ScheduleRecord};

/// A task with its steps, ordered by position.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskRecord {
    /// The task.
    pub task: Task,
    /// Its steps.
    pub steps: Vec<Step>,
}

/// Everything a submission creates, in one transaction: the task, its steps,
/// the first messages (for instance the Scheduler's wake-up), and the first
/// history events.
#[derive(Debug, Clone)]
pub struct NewTask {
    /// The task, Pending.
    pub task: Task,
    /// Its steps, NotStarted.
    pub steps: Vec<Step>,
    /// Messages to send in the same transaction.
    pub messages: Vec<(QueueName, Outgoing)>,
    /// History events to append (for instance `Received`).
    pub events: Vec<Event>,
}

impl NewTask {
    /// Refuses, as every backend does before writing anything, a message
    /// that [`Outgoing::check`] refuses and a step of another task.
    pub fn check(&self, body_bytes_max: usize) -> Result<()> {
        for (_, message) in &self.messages {
            message.check(body_bytes_max)?;
        }
        for step in &self.steps {
            if step.task_id != self.task.id {
                return Err(crate::Error::Invalid(format!("step {} belongs to task {}, not {}", step.name, step.task_id, self.task.id)));
            }
        }
        Ok(())
    }
}

/// The outcome of [`Tasks::create_task`].
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// The task was created.
    New,
    /// A task with that id already existed; nothing was written. The task id
    /// is the submission's idempotency key.
    Existing(Box<TaskRecord>),
}

/// A filter for [`Tasks::list_tasks`] and [`Tasks::count_tasks`]: a task
/// is selected when it matches every condition set. Serialised as a
/// batch keeps it ([`crate::batch`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskFilter {
    /// Only tasks in this state.
    pub state: Option<TaskState>,
    /// Only tasks of this workflow.
    pub workflow: Option<WorkflowName>,
    /// Only tasks whose lease this instance holds.
    pub locked_by: Option<InstanceId>,
    /// Only tasks this caller submitted ([`rota_model::Task::submitter`]).
    pub submitter: Option<String>,
    /// Only tasks at risk: leased (so unfinished), with a warning raised
    /// during their current lease, for the task or one of its steps
    /// (`at_risk_since` set). Served by an index of those tasks alone.
    pub at_risk: bool,
    /// Only tasks having every one of these tags (key, value).
    pub tags: Vec<(String, String)>,
    /// Only tasks created in this range.
    pub created: TimeRange,
    /// Only finished tasks that ended in this range (a finished task's
    /// `updated_at`: only a resubmit writes it again, and that unfinishes it).
    pub ended: TimeRange,
    /// Only tasks whose id starts with this text.
    pub id_prefix: Option<String>,
    /// Only the children of this task (the tasks its `workflow:` steps
    /// started: [`rota_model::Task::parent`]).
    pub parent: Option<TaskId>,
    /// Only tasks created strictly before this one (keyset paging: pass the
    /// last task of a page to get the next). A task id that names no task
    /// selects nothing: the listing is empty, not an error, so that a
    /// backend answers in one statement; callers that must tell the two
    /// apart look the task up when the page comes back empty.
    pub before: Option<TaskId>,
    /// At most this many, newest first.
    pub limit: u32,
}

impl Default for TaskFilter {
    fn default() -> Self {
        TaskFilter {
            state: None,
            workflow: None,
            locked_by: None,
            submitter: None,
            at_risk: false,
            tags: Vec::new(),
            created: TimeRange::default(),
            ended: TimeRange::default(),
            id_prefix: None,
            parent: None,
            before: None,
            limit: 100,
        }
    }
}

impl TaskFilter {
    /// Whether it names what to select (a state, workflow, tag, time range
    /// or id prefix) rather than every task: a bulk action must.
    pub fn selects_something(&self) -> bool {
        self.state.is_some()
            || self.workflow.is_some()
            || !self.tags.is_empty()
            || self.created.is_set()
            || self.ended.is_set()
            || self.id_prefix.is_some()
            || self.parent.is_some()
    }
}

/// A half-open range of times, `[from, until)`; an unset end is open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeRange {
    /// At or after this time.
    pub from: Option<Timestamp>,
    /// Strictly before this time.
    pub until: Option<Timestamp>,
}

impl TimeRange {
    /// Whether either end is set.
    pub fn is_set(&self) -> bool {
        self.from.is_some() || self.until.is_some()
    }

    /// Whether `at` is in the range.
    pub fn contains(&self, at: Timestamp) -> bool {
        self.from.is_none_or(|from| at >= from) && self.until.is_none_or(|until| at < until)
    }
}

/// The exclusive upper bound of the texts starting with `prefix` in byte
/// order: `prefix` followed by the greatest character sorts after every
/// such text, so `prefix <= id < bound` selects them on an ordered index.
pub fn prefix_upper_bound(prefix: &str) -> String {
    format!("{prefix}\u{10FFFF}")
}

/// A fenced task update: written only if the stored task still has
/// `expected_state` and `expected_epoch`.
#[derive(Debug, Clone)]
pub struct TaskWrite {
    /// The new record (its id names the row).
    pub task: Task,
    /// The state the writer read.
    pub expected_state: TaskState,
    /// The lease epoch the writer read.
    pub expected_epoch: u64,
}

impl TaskWrite {
    /// An update of `before` to `after`, fenced on what `before` says.
    pub fn replacing(before: &Task, after: Task) -> Self {
        debug_assert_eq!(before.id, after.id);
        TaskWrite { expected_state: before.state, expected_epoch: before.lease_epoch, task: after }
    }
}

/// A fenced step update: written only if the stored step still has
/// `expected_state` and `expected_attempt`.
#[derive(Debug, Clone)]
pub struct StepWrite {
    /// The new record (task id and name name the row).
    pub step: Step,
    /// The state the writer read.
    pub expected_state: StepState,
    /// The attempt the writer read.
    pub expected_attempt: u32,
}

impl StepWrite {
    /// An update of `before` to `after`, fenced on what `before` says.
    pub fn replacing(before: &Step, after: Step) -> Self {
        debug_assert_eq!((&before.task_id, &before.name), (&after.task_id, &after.name));
        StepWrite { expected_state: before.state, expected_attempt: before.attempt, step: after }
    }
}

/// The answer of [`Tasks::count_tasks`] from a backend's grouped counts:
/// every state in [`TaskState::ALL`] order, zero where none was counted.
pub fn counts_of_every_state(counted: impl IntoIterator<Item = (TaskState, u64)>) -> Vec<(TaskState, u64)> {
    let mut counts: Vec<(TaskState, u64)> = TaskState::ALL.iter().map(|state| (*state, 0)).collect();
    for (state, count) in counted {
        if let Some(entry) = counts.iter_mut().find(|(s, _)| *s == state) {
            entry.1 += count;
        }
    }
    counts
}

/// A set of changes applied atomically by [`Tasks::commit`]: if any fenced
/// write finds its record changed, or any lease token is lost, nothing is
/// written and the error names what conflicted.
#[derive(Debug, Clone, Default)]
pub struct Changes {
    /// Fenced task updates.
    pub tasks: Vec<TaskWrite>,
    /// Fenced step updates.
    pub steps: Vec<StepWrite>,
    /// Steps the commit creates: the instances of a `for_each` step, each
    /// created as it starts (`NAME[i]`). A step that exists already
    /// refuses the whole commit (`Conflict`), so two decisions can never
    /// both start the same instance.
    pub new_steps: Vec<Step>,
    /// Messages to send.
    pub send: Vec<(QueueName, Outgoing)>,
    /// Leased messages to complete (for instance the reply being handled).
    pub complete: Vec<(QueueName, LeaseToken)>,
    /// History events to append.
    pub events: Vec<Event>,
}

impl Changes {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
            && self.steps.is_empty()
            && self.new_steps.is_empty()
            && self.send.is_empty()
            && self.complete.is_empty()
            && self.events.is_empty()
    }
}

/// What happened to a task, in its append-only history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The task was submitted.
    Received,
    /// A Scheduler claimed it.
    Claimed,
    /// A step's attempt was sent to its agent.
    StepStarted,
    /// A step completed.
    StepCompleted,
    /// A step's `when` condition was false: it will not run (the detail
    /// has the condition).
    StepSkipped,
    /// A step's attempt failed (retried or not; the detail says).
    StepFailed,
    /// The Supervisor found a deadline passed and reset or ended the task.
    Expired,
    /// The task was processed.
    Processed,
    /// The task ended in Error.
    Error,
    /// Compensation began.
    CompensationStarted,
    /// A step's effect was undone.
    StepCompensated,
    /// Every completed step was compensated.
    Compensated,
    /// An operator cancelled the task.
    Cancelled,
    /// An operator resubmitted the task or a step.
    Resubmitted,
    /// A Scheduler gave the task back (shutdown).
    Released,
    /// An operator alert was raised.
    Alert,
    /// A signal arrived for the task (its detail names the signal, who sent
    /// it, and the step it went to).
    Signal,
    /// A step's attempt or the task's lease passed its warning point
    /// (`warn_after`) with its complete-by still ahead.
    AtRisk,
    /// A callback step's callback arrived (its detail says whether it
    /// succeeded or failed, and who sent it), or its agent's request was
    /// accepted and the step now waits for its callback (`accepted`).
    Callback,
    /// An operator paused the task (its detail says who, and why when
    /// given): it starts no new step until resumed.
    Paused,
    /// An operator resumed the paused task (its detail says who, and why
    /// when given).
    Resumed,
    /// An agent stopped a step's call in progress because its task had
    /// finished (cancelled, or ended otherwise): nobody would read the
    /// reply. Its detail names the agent and the reason; no reply was sent.
    CallStopped,
}

impl EventKind {
    /// The kind's name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Received => "received",
            EventKind::Claimed => "claimed",
            EventKind::StepStarted => "step_started",
            EventKind::StepCompleted => "step_completed",
            EventKind::StepSkipped => "step_skipped",
            EventKind::StepFailed => "step_failed",
            EventKind::Expired => "expired",
            EventKind::Processed => "processed",
            EventKind::Error => "error",
            EventKind::CompensationStarted => "compensation_started",
            EventKind::StepCompensated => "step_compensated",
            EventKind::Compensated => "compensated",
            EventKind::Cancelled => "cancelled",
            EventKind::Resubmitted => "resubmitted",
            EventKind::Released => "released",
            EventKind::Alert => "alert",
            EventKind::Signal => "signal",
            EventKind::AtRisk => "at_risk",
            EventKind::Callback => "callback",
            EventKind::Paused => "paused",
            EventKind::Resumed => "resumed",
            EventKind::CallStopped => "call_stopped",
        }
    }

    /// Every kind.
    pub const ALL: [EventKind; 22] = [
        EventKind::Received,
        EventKind::Claimed,
        EventKind::StepStarted,
        EventKind::StepCompleted,
        EventKind::StepFailed,
        EventKind::Expired,
        EventKind::Processed,
        EventKind::Error,
        EventKind::CompensationStarted,
        EventKind::StepCompensated,
        EventKind::Compensated,
        EventKind::Cancelled,
        EventKind::Resubmitted,
        EventKind::Released,
        EventKind::Alert,
        EventKind::Signal,
        EventKind::AtRisk,
        EventKind::StepSkipped,
        EventKind::Callback,
        EventKind::Paused,
        EventKind::Resumed,
        EventKind::CallStopped,
    ];

    /// The kind named `name`, if any.
    pub fn parse(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

/// One entry of a task's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Its position in the store's global event order (0 before it is stored).
    pub seq: i64,
    /// The task it is about.
    pub task_id: TaskId,
    /// When it happened.
    pub at: Timestamp,
    /// What happened.
    pub kind: EventKind,
    /// The step concerned, if any.
    pub step: Option<StepName>,
    /// The step's attempt concerned, if any.
    pub attempt: Option<u32>,
    /// Details (an error message, an output summary, who acted).
    pub detail: Value,
    /// Its link in the task's hash chain (see [`crate::chain`]), in
    /// lower-case hex, as the store computed it when appending the row:
    /// `None` before it is stored, and for rows written before the chain.
    #[serde(default)]
    pub hash: Option<String>,
}

impl Event {
    /// A new event about the task as a whole.
    pub fn task(task_id: &TaskId, at: Timestamp, kind: EventKind, detail: Value) -> Self {
        Event { seq: 0, task_id: task_id.clone(), at, kind, step: None, attempt: None, detail, hash: None }
    }

    /// A new event about one attempt of a step.
    pub fn step(step: &Step, at: Timestamp, kind: EventKind, detail: Value) -> Self {
        Event {
            seq: 0,
            task_id: step.task_id.clone(),
            at,
            kind,
            step: Some(step.name.clone()),
            attempt: Some(step.attempt),
            detail,
            hash: None,
        }
    }
}

/// A record whose `complete_by` has passed, as the Supervisor finds it.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant, reason = "items of one Supervisor scan, short-lived and few: a box would add an allocation each")]
pub enum Expired {
    /// A leased task (Processing or Compensating) whose lease ran out.
    Task(Task),
    /// A step in flight (Running or Compensating) whose attempt ran out.
    Step(Step),
}

/// A record whose warning point (`warn_at`) has passed with no warning
/// raised yet for its current attempt or lease, as the Supervisor finds it.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant, reason = "items of one Supervisor scan, short-lived and few: a box would add an allocation each")]
pub enum Warning {
    /// A leased task whose lease passed the workflow's `warn_after`.
    Task(Task),
    /// A running step whose attempt passed the step's `warn_after`.
    Step(Step),
}

impl Warning {
    /// The task it is about.
    pub fn task_id(&self) -> &TaskId {
        match self {
            Warning::Task(task) => &task.id,
            Warning::Step(step) => &step.task_id,
        }
    }

    /// The warning point that passed.
    pub fn warn_at(&self) -> Option<Timestamp> {
        match self {
            Warning::Task(task) => task.warn_at,
            Warning::Step(step) => step.warn_at,
        }
    }
}

/// A named lease that elects one holder among many instances (the
/// Supervisor's leader election).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaderLease {
    /// The lease's name (`supervisor`).
    pub name: String,
    /// Who holds it.
    pub holder: InstanceId,
    /// When it runs out unless renewed.
    pub until: Timestamp,
    /// Bumped whenever the holder changes; fences out a deposed leader.
    pub epoch: u64,
}

/// One registered version of a workflow definition.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkflowEntry {
    /// The workflow's name.
    pub name: WorkflowName,
    /// The version.
    pub version: u32,
    /// The resolved definition, as the engine serialized it.
    pub definition: Value,
    /// When it was registered.
    pub registered_at: Timestamp,
}

/// An operator's latest pause or resume of a workflow (by name, every
/// version): while `paused`, no claim takes a task of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowPause {
    /// The workflow.
    pub workflow: WorkflowName,
    /// Whether it is paused (the change was a pause) or not (a resume).
    pub paused: bool,
    /// Who made the change (a token's name, an OS user).
    pub by: String,
    /// Why, when given.
    pub reason: Option<String>,
    /// When.
    pub at: Timestamp,
}

/// The last reported status of a component (a circuit breaker, an instance).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComponentStatus {
    /// What it is about, namespaced (`breaker/http://127.0.0.1:9100`).
    pub key: String,
    /// The status document.
    pub value: Value,
    /// When it was reported.
    pub reported_at: Timestamp,
}

/// The durable state store.
#[async_trait]
pub trait Tasks: Send + Sync {
    /// Creates a task with its steps, messages and events in one transaction.
    /// If a task with that id exists, writes nothing and returns it.
    ///
    /// A task created already claimed (`locked_by` set: its submitter's own
    /// Scheduler takes it in the creating commit) is refused with
    /// `Conflict`, writing nothing, when its workflow is paused: a paused
    /// workflow's new tasks wait Pending, and only a claim may take them.
    async fn create_task(&self, new: NewTask) -> Result<Created>;

    /// A task and its steps, or `None`.
    async fn task(&self, id: &TaskId) -> Result<Option<TaskRecord>>;

    /// Several tasks with their steps, in the order of `ids`; ids that name
    /// no task are left out. A backend reads them at once where it can (a
    /// Scheduler reads every task a claim gave it).
    async fn tasks(&self, ids: &[TaskId]) -> Result<Vec<TaskRecord>> {
        let mut records = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(record) = self.task(id).await? {
                records.push(record);
            }
        }
        Ok(records)
    }

    /// Tasks matching `filter`, newest first.
    async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<Task>>;

    /// Up to `limit` children (tasks with a [`rota_model::Task::parent`])
    /// still Pending or Processing that their parent no longer waits for:
    /// the parent is gone or neither Pending nor Processing, or the
    /// parent's step is not Running at the child's attempt (it timed out,
    /// was retried, or the parent was cancelled). The Supervisor cancels
    /// them. Read through the partial index of unfinished children, so it
    /// costs what runs, not what is stored.
    async fn stale_children(&self, limit: u32) -> Result<Vec<TaskId>>;

    /// How many tasks matching `filter` (its `before` and `limit` aside)
    /// are in each state: every state of [`TaskState::ALL`], in that order,
    /// zeros included. Exact, read from an index where one serves the
    /// filter: its cost grows with the tasks counted.
    async fn count_tasks(&self, filter: &TaskFilter) -> Result<Vec<(TaskState, u64)>>;

    /// Atomically claims up to `max` claimable tasks, highest priority
    /// first, then oldest `not_before` first: [`Tasks::claim_tasks_by`]
    /// with no share taken oldest-first.
    async fn claim_tasks(&self, owner: &InstanceId, lease: Duration, max: u32) -> Result<Vec<Task>> {
        self.claim_tasks_by(owner, lease, Claim::by_priority(max)).await
    }

    /// Atomically claims up to `claim.max` claimable tasks (as
    /// [`Task::claim`] decides: Pending or unleased Compensating,
    /// `not_before` passed, not paused, not of a paused workflow) for
    /// `owner` until now + `lease`, and records a `Claimed` event for each,
    /// returned in `not_before` order. The `claim.oldest_first` claimable
    /// tasks with the oldest `not_before` are taken whatever their
    /// priority, the rest highest priority first, then oldest first; only
    /// when fewer tasks are claimable are fewer returned. Two concurrent
    /// claims never return the same task.
    ///
    /// A task with a concurrency key ([`Task::concurrency`]) holds one of
    /// its key's `limit` slots from its first claim until it ends (the
    /// write that ends it frees the slot, whoever makes it), also while it
    /// waits Pending for a new holder. One without a slot is claimed only
    /// when a slot is free for it after the claimable tasks of its key
    /// submitted before it (submission order within a key); tasks of a key
    /// at its limit are passed over, not returned, and do not hold back
    /// other keys. Never do more than `limit` tasks of a key hold a slot,
    /// however many claims run at once.
    ///
    /// A store that makes commits durable after committing them may return
    /// a claim before it is durable: the holder of a task acts on it only
    /// through this store's commits, each durable only with every commit
    /// before it, so no effect of the claim outlives the claim.
    async fn claim_tasks_by(&self, owner: &InstanceId, lease: Duration, claim: Claim) -> Result<Vec<Task>> {
        Ok(self.claim_records_by(owner, lease, claim).await?.into_iter().map(|record| record.task).collect())
    }

    /// [`Tasks::claim_tasks_by`], each claimed task with its steps as the
    /// claim left them: what its new holder decides the start on, without
    /// a read of its own.
    async fn claim_records_by(&self, owner: &InstanceId, lease: Duration, claim: Claim) -> Result<Vec<TaskRecord>>;

    /// The tasks holding a slot of concurrency key `key` of `workflow`
    /// (at most its limit of them), by slot number.
    async fn key_holders(&self, workflow: &WorkflowName, key: &str) -> Result<Vec<TaskId>>;

    /// Applies `changes` atomically. A task or step write whose record no
    /// longer matches its expectation fails the whole commit with
    /// [`crate::Error::Conflict`]; a lost message lease with
    /// [`crate::Error::LeaseLost`]. Writes to a record that does not exist
    /// fail with [`crate::Error::NotFound`].
    async fn commit(&self, changes: Changes) -> Result<()>;

    /// Up to `limit` leased tasks and in-flight steps whose `complete_by` is
    /// at or before now, earliest first.
    async fn expired(&self, limit: u32) -> Result<Vec<Expired>>;

    /// Up to `limit` records whose warning point has passed, earliest
    /// `warn_at` first: leased tasks whose `warn_at` is at or before now and
    /// whose lease has raised no task warning yet, and running steps whose
    /// `warn_at` is at or before now and whose current attempt has raised
    /// none. Read from indexes of exactly those records, so its cost does
    /// not grow with the number of tasks.
    async fn warnings_due(&self, limit: u32) -> Result<Vec<Warning>>;

    /// Raises the warning `warning` found, in one transaction: it marks the
    /// warning raised for the lease (a task: same `warn_at`, still leased)
    /// or the attempt (a step: same attempt, still running) it was found
    /// for, so it is never due again, and, if the task is still unfinished
    /// and leased, sets the task's `at_risk_since` (unless already set),
    /// appends `events` and sends `send` (the task's status messages), in
    /// the same transaction. Returns whether the events were appended: `false`
    /// when the record moved on (finished, retried, released) or its task is
    /// no longer held, in which case a step that is still running is marked
    /// anyway, so that it is not found again.
    ///
    /// It writes nothing a holder's fenced write compares (state, lease
    /// epoch, attempt), and a holder's writes never undo it, so the holder
    /// of the task is not disturbed.
    async fn raise_warning(&self, warning: &Warning, events: Vec<Event>, send: Vec<(QueueName, Outgoing)>) -> Result<bool>;

    /// A task's history, oldest first.
    async fn history(&self, id: &TaskId) -> Result<Vec<Event>>;

    /// Events of every task after `after_seq`, oldest first, at most `limit`.
    async fn events_after(&self, after_seq: i64, limit: u32) -> Result<Vec<Event>>;

    /// The `limit` most recent events of every task, newest first (highest
    /// seq first). Its cost is bounded by `limit` whatever the history's
    /// size; unlike [`Tasks::events_after`] it may include an event whose
    /// lower-seq neighbour is still being committed, which is fine for a
    /// summary and wrong for a cursor.
    async fn latest_events(&self, limit: u32) -> Result<Vec<Event>>;

    /// Takes or renews the named lease for `holder` until now + `ttl`.
    /// Returns the lease if `holder` holds it now, `None` if another holder's
    /// lease is still running.
    async fn acquire_leader(&self, name: &str, holder: &InstanceId, ttl: Duration) -> Result<Option<LeaderLease>>;

    /// Gives up the named lease if `holder` holds it.
    async fn release_leader(&self, name: &str, holder: &InstanceId) -> Result<()>;

    /// The named lease if someone holds it now (its `until` is after now),
    /// `None` if it was never taken, ran out or was released. A read only:
    /// it neither takes nor renews anything.
    async fn leader(&self, name: &str) -> Result<Option<LeaderLease>>;

    /// Registers a version of a workflow definition. Versions are immutable:
    /// registering the same definition again is a no-op, a different one
    /// under an existing version is a `Conflict`.
    async fn register_workflow(&self, name: &WorkflowName, version: u32, definition: &Value) -> Result<()>;

    /// A registered definition: the given version, or the latest when `None`.
    async fn workflow(&self, name: &WorkflowName, version: Option<u32>) -> Result<Option<WorkflowEntry>>;

    /// The latest version of every registered workflow, sorted by name.
    async fn workflows(&self) -> Result<Vec<WorkflowEntry>>;

    /// Pauses (`change.paused`) or resumes a workflow, recording who, why
    /// and when: a compare-and-set on its paused state, so a pause of a
    /// paused workflow, or a resume of one that is not paused, is a
    /// `Conflict` and writes nothing. While a workflow is paused,
    /// [`Tasks::claim_tasks`] takes none of its tasks.
    async fn set_workflow_paused(&self, change: &WorkflowPause) -> Result<()>;

    /// The latest pause or resume of every workflow that had one, sorted by
    /// name (a workflow never paused has none).
    async fn workflow_pauses(&self) -> Result<Vec<WorkflowPause>>;

    /// Operator alerts (history events of kind `Alert`), newest first.
    async fn alerts(&self, limit: u32) -> Result<Vec<Event>>;

    /// Records the status of a component, replacing its previous one.
    async fn report_status(&self, key: &str, value: &Value) -> Result<()>;

    /// The statuses whose key starts with `prefix`, sorted by key.
    async fn statuses(&self, prefix: &str) -> Result<Vec<ComponentStatus>>;

    /// Takes a slot of the rate limit `request.key` at the store's now:
    /// granted if a call may start within `request.wait_max` (the limit's
    /// row moved on by one interval, in one compare-and-set statement),
    /// else refused with when to ask again (nothing written). However many
    /// processes take at once, the granted starts in any window of length
    /// `t` number at most `rate × t + burst` ([`rota_model::rate`]).
    async fn take_rate_slot(&self, request: &RateRequest) -> Result<RateSlot>;

    /// Deletes the rate limits whose theoretical arrival time is before
    /// `before`: a take treats a time in the past as no row at all, so
    /// forgetting them changes nothing, and the keys of targets no longer
    /// called do not pile up. Returns how many were deleted.
    async fn delete_rate_limits(&self, before: Timestamp) -> Result<u64>;

    /// Asks the shared breaker `ask.key` for one call at the store's now,
    /// in one compare-and-set statement ([`crate::breaker`]): go when it is
    /// closed or has no row; hold until `open_until` while open; after it,
    /// go as the probe if the probe lease is free or expired (taking it for
    /// `ask.probe_lease`), else hold until the lease ends. However many
    /// processes ask at once, at most one holds a live probe lease. Also
    /// returns the row after the ask (`None`: no row, a clean closed
    /// breaker).
    async fn admit_breaker(&self, ask: &BreakerAsk) -> Result<(BreakerAdmission, Option<SharedBreaker>)>;

    /// Reports one call's result to the shared breaker `report.key` in one
    /// upsert ([`crate::breaker`]); failures from every process add up.
    /// Returns the row after the report (`None`: there is no row and the
    /// report needed none).
    async fn report_breaker(&self, report: &BreakerReport) -> Result<Option<SharedBreaker>>;

    /// Every shared breaker's row, sorted by key.
    async fn shared_breakers(&self) -> Result<Vec<SharedBreaker>>;

    /// Deletes the shared breaker rows that have not changed since
    /// `before` and whose `open_until` and probe lease (if any) ended
    /// before it too: forgetting them changes nothing a probe would not.
    /// Returns how many were deleted.
    async fn delete_shared_breakers(&self, before: Timestamp) -> Result<u64>;

    /// Deletes up to `prune.limit` finished tasks that `prune` selects,
    /// oldest end time first, with their steps and history, in one
    /// transaction ([`Prune::check`] refuses a bad request first). Never
    /// deletes an unfinished task, nor a schedule's task that may belong
    /// to a fire the schedule has not recorded (see [`crate::prune`]).
    /// Schedules whose `last_task` is deleted are left as they are. A
    /// backend may also give free space back to the file system here, in a
    /// bounded step.
    async fn prune_tasks(&self, prune: &Prune) -> Result<Pruned>;

    /// How many tasks [`Tasks::prune_tasks`] would delete with `prune` if
    /// its limit were unbounded; deletes nothing (a dry run).
    async fn count_prunable(&self, prune: &Prune) -> Result<u64>;

    /// The tasks [`Tasks::prune_tasks`] would delete next with `prune`
    /// (the same selection, order and limit); deletes nothing. An archive
    /// reads them, writes them out, then prunes exactly these
    /// ([`Prune::only`]).
    async fn prunable_tasks(&self, prune: &Prune) -> Result<Vec<TaskId>>;

    /// Deletes the statuses whose key starts with `prefix` and that were
    /// last reported strictly before `reported_before` (circuit breakers
    /// nobody reports any more). Returns how many.
    async fn delete_statuses(&self, prefix: &str, reported_before: Timestamp) -> Result<u64>;

    /// Deletes, in one transaction, the leftovers of an instance that is
    /// gone: its heartbeat and its inbox queue (with its duplicate-detection
    /// ids). Only if its heartbeat exists and was reported before
    /// `sweep.gone_before` (a process that came back reports again), no task
    /// is leased by it (the Supervisor has not recovered them yet: a
    /// returning instance would still answer for them) and its inbox holds
    /// no message and no dead letter (something a Scheduler could still
    /// need, or an operator could still redrive). Otherwise deletes nothing.
    async fn sweep_instance(&self, sweep: &InstanceSweep) -> Result<Swept>;

    /// Records an operator action that has no history row (see
    /// [`crate::audit`]) in the audit table, at now. `Invalid` for a task
    /// action or an overlong field ([`NewAudit::check`]).
    async fn record_audit(&self, entry: &NewAudit) -> Result<()>;

    /// Operator actions, newest first: the audit table's rows and the
    /// operator rows of every task's history, merged ([`crate::audit`]).
    /// `Invalid` for a limit out of bounds ([`AuditFilter::check`]).
    async fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>>;

    /// Deletes up to `limit` of the audit table's rows older than `before`,
    /// oldest first. Returns how many. History rows are not touched: they
    /// go with their task.
    async fn prune_audit(&self, before: Timestamp, limit: u32) -> Result<u64>;

    /// Creates a batch, Running and unheld. A `Conflict` when the id exists.
    async fn create_batch(&self, new: &NewBatch) -> Result<BatchRecord>;

    /// A batch, if it exists.
    async fn batch(&self, id: &str) -> Result<Option<BatchRecord>>;

    /// The latest `limit` batches, newest first.
    async fn batches(&self, limit: u32) -> Result<Vec<BatchRecord>>;

    /// Takes a Running batch for `owner` until now + `lease`: the one named
    /// `id`, or when `None` the oldest whose lease is free (never taken, run
    /// out, or `owner`'s own). `None` when there is no such batch (another
    /// runner holds it, it is not Running, or it does not exist).
    async fn claim_batch(&self, id: Option<&str>, owner: &InstanceId, lease: Duration) -> Result<Option<BatchRecord>>;

    /// Records a page of `owner`'s run: the progress, the lease renewed
    /// until now + `lease`, and Done when `progress.finished`. Returns the
    /// batch as written, or `None` when `owner` no longer holds it or it is
    /// no longer Running (stopped: the runner stops too).
    async fn advance_batch(&self, id: &str, owner: &InstanceId, progress: &BatchProgress, lease: Duration) -> Result<Option<BatchRecord>>;

    /// Stops a Running batch (its runner stops at its next page). Returns
    /// the batch, or `None` when it does not exist; a batch already Done or
    /// Stopped is returned as it is.
    async fn stop_batch(&self, id: &str) -> Result<Option<BatchRecord>>;

    /// Creates a schedule, unpaused, with nothing fired: its first fire is
    /// the first after now. If one of that name exists with the same
    /// definition, writes nothing and returns it (creating is idempotent);
    /// with another definition (or from another source), `Conflict`. A
    /// definition whose cron expression or time zone does not parse is
    /// `Invalid` ([`NewSchedule::check`]).
    async fn create_schedule(&self, new: &NewSchedule) -> Result<ScheduleRecord>;

    /// Creates a schedule as [`Tasks::create_schedule`] does, or, if one of
    /// that name exists, gives it this definition and source (a workflow
    /// file's declaration wins over what was stored). A changed definition
    /// bumps the version and moves `fired_through` to now, so that fires of
    /// the new expression before the change are not caught up; the paused
    /// flag and the rest of the progress are kept. The same definition
    /// writes nothing.
    async fn declare_schedule(&self, new: &NewSchedule) -> Result<ScheduleRecord>;

    /// The named schedule, or `None`.
    async fn schedule(&self, name: &ScheduleName) -> Result<Option<ScheduleRecord>>;

    /// Every schedule, sorted by name.
    async fn schedules(&self) -> Result<Vec<ScheduleRecord>>;

    /// Pauses the named schedule (a paused one is left as it is). `NotFound`
    /// if there is none.
    async fn pause_schedule(&self, name: &ScheduleName) -> Result<ScheduleRecord>;

    /// Resumes the named schedule: it fires from now on (`fired_through`
    /// moves to now; fires while it was paused are not caught up). A
    /// running one is left as it is. `NotFound` if there is none.
    async fn resume_schedule(&self, name: &ScheduleName) -> Result<ScheduleRecord>;

    /// Deletes the named schedule (tasks it started are kept). `NotFound`
    /// if there is none.
    async fn delete_schedule(&self, name: &ScheduleName) -> Result<()>;

    /// Records the schedule's progress if its version is still
    /// `expected_version`, bumping it: of two leaders that read the same
    /// version, one advances and the other gets `Conflict`. `NotFound` if
    /// the schedule is gone.
    async fn advance_schedule(&self, name: &ScheduleName, expected_version: u64, progress: &ScheduleProgress) -> Result<ScheduleRecord>;
}
