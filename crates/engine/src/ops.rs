//! The operator's requests on tasks, and every rule about when they apply,
//! written once for every transport: the HTTP API's handlers and the CLI on
//! a local store both call these and only translate an [`Error`] (into a
//! status and a code, or a line on stderr). The text of an error is what the
//! user reads whichever transport carried it: the API answers it as its
//! reason, and the CLI prints it as it is.
//!
//! The rules:
//! - a request about a task that does not exist is [`Error::TaskNotFound`];
//! - a task is shown even when its definition is missing or unreadable
//!   ([`TaskDetail::definition`] is then `None`);
//! - cancel applies to a task that has not finished, resubmit to a task in
//!   Error; the transitions of `rota-model` decide, and a refusal is
//!   [`Error::Refused`];
//! - pause applies to a task that has not finished and is not paused,
//!   resume to a paused task (see [`crate::pause`]);
//! - a step named by a resubmit must be one of the task's
//!   ([`Error::StepNotFound`]), whatever state the task is in; a resubmit
//!   with a new input starts that step and its dependents over, and is
//!   refused for a task that failed while being undone;
//! - a submission names a registered workflow ([`Error::from_submit`]);
//! - a schedule's request names an existing schedule
//!   ([`Error::ScheduleNotFound`]); creating one checks its cron expression
//!   and time zone ([`Error::InvalidSchedule`]) and its workflow, and
//!   refuses a name taken by another definition ([`Error::ScheduleExists`]);
//! - a listing's filter means what [`TaskFilter`] says, on every transport;
//!   a page asked for `before` a task that does not exist is
//!   [`Error::BeforeNotFound`] (the store answers such a page empty).
//!
//! Deliberately left out: the queue and dead-letter requests, one store call
//! each, where the transports differ on purpose (the API refuses to pause a
//! queue that does not exist; `rota queue pause` creates it).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rota_model::{StepName, StepState, Task, TaskId, TaskState, TransitionError};
use rota_store::{Changes, Event, EventKind, StepWrite, TaskFilter, TaskRecord, TaskWrite};
use rota_workflow::Workflow;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::client::{Client, doorbell};
pub use crate::pause::Operator;
use crate::replies;
use crate::telemetry;

/// How often an operator's change that lost a race is tried again.
const OPERATOR_TRIES_MAX: u32 = 5;

/// Why a step in flight failed when its task was cancelled with nothing to undo.
const ABANDONED_BY_CANCEL: &str = "its task was cancelled";

/// The result of an operator's request.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A change an operator asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Stop a task that has not finished.
    Cancel,
    /// Run a task that ended in Error again.
    Resubmit,
    /// Complete a waiting step with a signal.
    Signal,
    /// Complete or fail a callback step's attempt.
    Callback,
    /// Hold a task's own moves (no new step).
    Pause,
    /// Release a paused task's moves.
    Resume,
}

impl Action {
    /// The request's name, as errors word it.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Cancel => "cancel",
            Action::Resubmit => "resubmit",
            Action::Signal => "signal",
            Action::Callback => "callback",
            Action::Pause => "pause",
            Action::Resume => "resume",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an operator's request did not apply, or failed. Each text is the
/// one the user reads, on every transport.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No task has this id.
    #[error("task {0} not found")]
    TaskNotFound(TaskId),
    /// The task has no step of this name.
    #[error("step {step} of task {task} (its steps: {}) not found", names(.steps))]
    StepNotFound {
        /// The task.
        task: TaskId,
        /// The step asked for.
        step: StepName,
        /// The task's steps, in definition order.
        steps: Vec<StepName>,
    },
    /// A listing asked for the tasks created before a task that does not
    /// exist. The text starts with the filter it is about, `before`.
    #[error("before: task {0} not found")]
    BeforeNotFound(TaskId),
    /// The submission names a workflow, or a version of it, that is not
    /// registered. The text starts with the field it is about, `workflow`.
    #[error("workflow: {0}")]
    UnknownWorkflow(String),
    /// A submission field is outside its bounds. The text starts with the
    /// field it is about.
    #[error("{field}: {why}")]
    InvalidSubmission {
        /// The field (`start_at`).
        field: &'static str,
        /// Its bounds and the value given.
        why: String,
    },
    /// An operator's request has a field outside its bounds. The text
    /// starts with the field it is about.
    #[error("{field}: {why}")]
    InvalidRequest {
        /// The field (`reason`).
        field: &'static str,
        /// Its bounds and the value given.
        why: String,
    },
    /// No schedule has this name.
    #[error("schedule {0} not found")]
    ScheduleNotFound(rota_model::ScheduleName),
    /// A schedule of this name exists with another definition.
    #[error("schedule {0} already exists with a different definition (delete it first)")]
    ScheduleExists(rota_model::ScheduleName),
    /// A schedule's field does not parse. The text starts with the field.
    #[error("{field}: {why}")]
    InvalidSchedule {
        /// The field (`cron`, `timezone`, `overlap`, `catch_up`, `name`).
        field: &'static str,
        /// Why, with the value given.
        why: String,
    },
    /// The task, or one of its steps, is in a state that does not allow the change.
    #[error("{action}: {refusal}")]
    Refused {
        /// What was asked.
        action: Action,
        /// Why it does not apply.
        refusal: Refusal,
    },
    /// A signal that no step of the task can take.
    #[error("signal {signal}: {why}")]
    Signal {
        /// The signal's name.
        signal: rota_model::SignalName,
        /// Why it was refused.
        why: crate::signal::Refusal,
    },
    /// A callback that no step can take.
    #[error("callback: {0}")]
    Callback(crate::callback::Refusal),
    /// The engine failed (the store, a stored definition): not a rule, and
    /// not the operator's doing.
    #[error(transparent)]
    Engine(#[from] crate::Error),
}

impl From<rota_store::Error> for Error {
    fn from(err: rota_store::Error) -> Self {
        Error::Engine(err.into())
    }
}

impl Error {
    /// An error of [`Client::submit`], with a workflow that is not
    /// registered as [`Error::UnknownWorkflow`] (nothing else a submission
    /// looks up can be missing).
    pub fn from_submit(err: crate::Error) -> Self {
        match err {
            crate::Error::Store(rota_store::Error::NotFound(what)) => Error::UnknownWorkflow(what),
            crate::Error::InvalidSubmission { field, why } => Error::InvalidSubmission { field, why },
            other => Error::Engine(other),
        }
    }

    /// Whether this is a lost race with the task's Scheduler, after which
    /// the same request on a fresh read may apply.
    fn is_lost_race(&self) -> bool {
        matches!(self, Error::Engine(crate::Error::Store(err)) if err.is_lost_race())
    }
}

/// Why a task's state does not allow a change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The task's own transition refused.
    #[error("task {task}: {why}")]
    Task {
        /// The task.
        task: TaskId,
        /// The transition's reason.
        why: TransitionError,
    },
    /// A step's transition refused.
    #[error("step {step} of task {task}: {why}")]
    Step {
        /// The task.
        task: TaskId,
        /// The step.
        step: StepName,
        /// The transition's reason.
        why: TransitionError,
    },
    /// A workflow's pause state refused (a pause of a paused workflow, a
    /// resume of one that is not paused).
    #[error("workflow {workflow} {why}")]
    Workflow {
        /// The workflow.
        workflow: rota_model::WorkflowName,
        /// Why.
        why: &'static str,
    },
    /// A resubmit of one step of a task whose compensation failed: the
    /// compensation resumes as a whole.
    #[error("task {task} failed while being undone: resubmit resumes its compensation, not one step")]
    StepOfCompensation {
        /// The task.
        task: TaskId,
    },
}

fn names(steps: &[StepName]) -> String {
    steps.iter().map(StepName::as_str).collect::<Vec<_>>().join(", ")
}

/// A task, its steps, and the definition of the version it runs.
#[derive(Debug, Clone)]
pub struct TaskDetail {
    /// The task and its steps.
    pub record: TaskRecord,
    /// Its workflow's definition; `None` when it is missing or unreadable
    /// (the task is still shown).
    pub definition: Option<Arc<Workflow>>,
    /// The child workflows its `workflow:` steps started, newest first, at
    /// most [`CHILDREN_SHOWN_MAX`] (read by [`Client::task`] only; empty
    /// in the answers of the other requests).
    pub children: Vec<Task>,
}

/// The most children a task's view lists (the newest).
pub const CHILDREN_SHOWN_MAX: u32 = 100;

impl Client {
    /// A task and its steps.
    pub async fn record(&self, id: &TaskId) -> Result<TaskRecord> {
        self.store.task(id).await?.ok_or_else(|| Error::TaskNotFound(id.clone()))
    }

    /// A task with its steps and its definition.
    pub async fn task(&self, id: &TaskId) -> Result<TaskDetail> {
        let record = self.record(id).await?;
        let definition = self.workflows.get(&record.task.workflow, Some(record.task.workflow_version)).await.ok();
        let children =
            self.store.list_tasks(&TaskFilter { parent: Some(id.clone()), limit: CHILDREN_SHOWN_MAX, ..TaskFilter::default() }).await?;
        Ok(TaskDetail { record, definition, children })
    }

    /// Why `task` waits, when its concurrency key holds it back: a Pending
    /// task without a slot of its key while every slot is in use reads
    /// `waiting for concurrency key customer=c1 (1/1 in use)`. `None` for a
    /// task without a key, one that holds a slot, or one that is not
    /// Pending.
    pub async fn concurrency_wait(&self, task: &Task) -> Result<Option<String>> {
        let Some(key) = task.concurrency.as_ref().filter(|_| task.state == TaskState::Pending) else { return Ok(None) };
        let holders = self.store.key_holders(&task.workflow, &key.key).await?;
        if holders.contains(&task.id) {
            return Ok(None);
        }
        let in_use = u32::try_from(holders.len()).unwrap_or(u32::MAX);
        Ok((in_use >= key.limit).then(|| key.waiting_reason(in_use)))
    }

    /// A task's events, oldest first.
    pub async fn history(&self, id: &TaskId) -> Result<Vec<Event>> {
        self.record(id).await?;
        Ok(self.store.history(id).await?)
    }

    /// The tasks that `filter` selects, newest first. An empty page
    /// `before` a task is told apart from a page before a task that does
    /// not exist by one more read, only then.
    pub async fn tasks(&self, filter: &TaskFilter) -> Result<Vec<Task>> {
        let tasks = self.store.list_tasks(filter).await?;
        if tasks.is_empty()
            && let Some(before) = &filter.before
            && self.store.task(before).await?.is_none()
        {
            return Err(Error::BeforeNotFound(before.clone()));
        }
        Ok(tasks)
    }

    /// How many tasks matching `filter` (its `before` and `limit` aside)
    /// are in each state, every state listed.
    pub async fn task_counts(&self, filter: &TaskFilter) -> Result<Vec<(TaskState, u64)>> {
        Ok(self.store.count_tasks(filter).await?)
    }

    /// The latest `limit` alerts, newest first.
    pub async fn alerts(&self, limit: u32) -> Result<Vec<Event>> {
        Ok(self.store.alerts(limit).await?)
    }

    /// Cancels a task that has not finished. If some step that has a
    /// compensation completed (or may have: it is in flight, or an attempt
    /// of it was never confirmed), the task is compensated; otherwise it is
    /// Cancelled. The `cancelled` event records who and why. Returns the
    /// state it moved to.
    pub async fn cancel(&self, id: &TaskId, operator: Operator<'_>) -> Result<TaskState> {
        operator.check()?;
        let state = self.retrying(|| self.try_cancel(id, operator)).await?;
        if state.is_terminal()
            && let Some(completions) = &self.completions
        {
            completions.publish(id.clone(), state);
        }
        Ok(state)
    }

    async fn try_cancel(&self, id: &TaskId, operator: Operator<'_>) -> Result<TaskState> {
        let record = self.record(id).await?;
        let workflow = self.workflows.get(&record.task.workflow, Some(record.task.workflow_version)).await?;
        let compensate = record.steps.iter().any(|s| {
            let maybe_done =
                matches!(s.state, StepState::Completed | StepState::Running) || (s.state == StepState::NotStarted && s.attempt > 0);
            maybe_done && workflow.step(&s.name).is_some_and(|d| d.compensate().is_some())
        });
        let now = self.clock.now();
        let next = record.task.cancel(compensate, now).map_err(|why| refused(Action::Cancel, Refusal::Task { task: id.clone(), why }))?;
        let state = next.state;
        let mut changes = Changes::default();
        changes.events.push(Event::task(
            id,
            now,
            EventKind::Cancelled,
            json!({ "compensate": compensate, "by": operator.by, "reason": operator.reason }),
        ));
        if compensate {
            changes.events.push(Event::task(id, now, EventKind::CompensationStarted, json!({ "reason": "cancelled by an operator" })));
            changes.send.push(doorbell(id));
        } else {
            // Nothing to undo: the attempts in flight are over for the
            // task's record now, not when the Supervisor finds them late.
            for running in record.steps.iter().filter(|s| s.state == StepState::Running) {
                let abandoned = running
                    .abandon(ABANDONED_BY_CANCEL, now)
                    .map_err(|why| refused(Action::Cancel, Refusal::Step { task: id.clone(), step: running.name.clone(), why }))?;
                let detail = json!({ "error": abandoned.last_error, "retryable": false, "cancelled": true });
                changes.events.push(Event::step(&abandoned, now, EventKind::StepFailed, detail));
                changes.steps.push(StepWrite::replacing(running, abandoned));
            }
        }
        changes.tasks.push(TaskWrite::replacing(&record.task, next));
        replies::commit(&self.store, changes).await?;
        if state.is_terminal() {
            metrics::counter!(telemetry::TASKS_FINISHED, "workflow" => record.task.workflow.to_string(), "state" => state.as_str())
                .increment(1);
        }
        Ok(state)
    }

    /// Resubmits a task that ended in Error. If it failed while being
    /// undone, its compensation resumes (the step whose compensation failed
    /// is compensated again); otherwise its failed steps (or only `step`)
    /// run again. Completed steps are kept either way.
    ///
    /// The `resubmitted` event records who and why.
    ///
    /// Returns the task as the resubmit left it: read again afterwards, it
    /// could already show the Scheduler's next move.
    pub async fn resubmit(&self, id: &TaskId, step: Option<&StepName>, operator: Operator<'_>) -> Result<TaskDetail> {
        operator.check()?;
        let record = self.retrying(|| self.try_resubmit(id, step, operator)).await?;
        let definition = self.workflows.get(&record.task.workflow, Some(record.task.workflow_version)).await.ok();
        Ok(TaskDetail { record, definition, children: Vec::new() })
    }

    async fn try_resubmit(&self, id: &TaskId, step: Option<&StepName>, operator: Operator<'_>) -> Result<TaskRecord> {
        let record = self.record(id).await?;
        if let Some(step) = step
            && !record.steps.iter().any(|s| &s.name == step)
        {
            let steps = record.steps.iter().map(|s| s.name.clone()).collect();
            return Err(Error::StepNotFound { task: id.clone(), step: step.clone(), steps });
        }
        let refuse = |refusal| refused(Action::Resubmit, refusal);
        let task_refused = |why| refuse(Refusal::Task { task: id.clone(), why });
        let step_refused = |step: &StepName, why| refuse(Refusal::Step { task: id.clone(), step: step.clone(), why });
        let now = self.clock.now();
        let mut changes = Changes::default();
        let next = if self.failed_while_compensating(&record).await? {
            if step.is_some() {
                return Err(refuse(Refusal::StepOfCompensation { task: id.clone() }));
            }
            // The steps that failed during the compensation are the ones that
            // had completed; a step that failed going forward stays failed.
            let completed = self.completed_steps(id).await?;
            for failed in record.steps.iter().filter(|s| s.state == StepState::Failed && completed.contains(&s.name)) {
                let again = failed.resubmit_compensation(now).map_err(|why| step_refused(&failed.name, why))?;
                changes.steps.push(StepWrite::replacing(failed, again));
            }
            record.task.resubmit_compensation(now).map_err(task_refused)?
        } else {
            let again: Vec<_> = record.steps.iter().filter(|s| step.map_or(s.state == StepState::Failed, |name| &s.name == name)).collect();
            for found in again {
                let next = found.resubmit(now).map_err(|why| step_refused(&found.name, why))?;
                changes.steps.push(StepWrite::replacing(found, next));
            }
            record.task.resubmit(now).map_err(task_refused)?
        };
        let detail = json!({
            "step": step.map(|s| s.as_str()),
            "compensation": next.state == TaskState::Compensating,
            "by": operator.by,
            "reason": operator.reason,
        });
        changes.events.push(Event::task(id, now, EventKind::Resubmitted, detail));
        changes.tasks.push(TaskWrite::replacing(&record.task, next.clone()));
        changes.send.push(doorbell(id));
        let mut steps = record.steps.clone();
        for written in &changes.steps {
            if let Some(step) = steps.iter_mut().find(|s| s.name == written.step.name) {
                *step = written.step.clone();
            }
        }
        replies::commit(&self.store, changes).await?;
        Ok(TaskRecord { task: next, steps })
    }

    /// Resubmits a task that ended in Error from step `step`, with a new
    /// input: the task's input is replaced, and `step` and every step that
    /// depends on it (directly or not) start over ([`rota_model::Step::rerun`]:
    /// whatever they did, they run again, their templates and conditions
    /// decided on the new input). Other steps keep what they did. The
    /// history's `resubmitted` event records the old and the new input (each
    /// as a digest when over [`HISTORY_INPUT_BYTES_MAX`]), `by`, who asked,
    /// and `reason`, why, when given.
    ///
    /// Refused like [`Client::resubmit`]: a task not in Error, a step the
    /// task does not have, and a task that failed while being undone (its
    /// compensation resumes as a whole).
    pub async fn resubmit_with_input(&self, id: &TaskId, step: &StepName, input: Value, operator: Operator<'_>) -> Result<TaskDetail> {
        operator.check()?;
        let record = self.retrying(|| self.try_resubmit_with_input(id, step, &input, operator)).await?;
        let definition = self.workflows.get(&record.task.workflow, Some(record.task.workflow_version)).await.ok();
        Ok(TaskDetail { record, definition, children: Vec::new() })
    }

    async fn try_resubmit_with_input(&self, id: &TaskId, step: &StepName, input: &Value, operator: Operator<'_>) -> Result<TaskRecord> {
        let record = self.record(id).await?;
        if !record.steps.iter().any(|s| &s.name == step) {
            let steps = record.steps.iter().map(|s| s.name.clone()).collect();
            return Err(Error::StepNotFound { task: id.clone(), step: step.clone(), steps });
        }
        let refuse = |refusal| refused(Action::Resubmit, refusal);
        if self.failed_while_compensating(&record).await? {
            return Err(refuse(Refusal::StepOfCompensation { task: id.clone() }));
        }
        let now = self.clock.now();
        let mut next = record.task.resubmit(now).map_err(|why| refuse(Refusal::Task { task: id.clone(), why }))?;
        next.input = input.clone();
        let workflow = self.workflows.get(&record.task.workflow, Some(record.task.workflow_version)).await?;
        let mut again: Vec<&StepName> = vec![step];
        again.extend(workflow.downstream(step));
        let mut changes = Changes::default();
        let mut steps = record.steps.clone();
        // A `for_each` step's instances start over with it.
        let starts_over = |name: &StepName| again.contains(&name) || name.instance_of().is_some_and(|(step, _)| again.contains(&&step));
        for current in steps.iter_mut().filter(|s| starts_over(&s.name) && s.state != StepState::NotStarted) {
            let rerun = current.rerun(now).map_err(|why| refuse(Refusal::Step { task: id.clone(), step: current.name.clone(), why }))?;
            changes.steps.push(StepWrite::replacing(current, rerun.clone()));
            *current = rerun;
        }
        let detail = json!({
            "step": step.as_str(),
            "compensation": false,
            "steps": again.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            "input": { "old": input_in_history(&record.task.input), "new": input_in_history(input) },
            "by": operator.by,
            "reason": operator.reason,
        });
        changes.events.push(Event::task(id, now, EventKind::Resubmitted, detail));
        changes.tasks.push(TaskWrite::replacing(&record.task, next.clone()));
        changes.send.push(doorbell(id));
        replies::commit(&self.store, changes).await?;
        Ok(TaskRecord { task: next, steps })
    }

    /// Whether the task's last run (since its last resubmit) reached compensation.
    async fn failed_while_compensating(&self, record: &TaskRecord) -> Result<bool> {
        if record.task.state != TaskState::Error {
            return Ok(false);
        }
        let history = self.store.history(&record.task.id).await?;
        let since_resubmit = history.iter().rposition(|e| e.kind == EventKind::Resubmitted).map_or(0, |i| i + 1);
        Ok(history[since_resubmit..].iter().any(|e| e.kind == EventKind::CompensationStarted))
    }

    /// The steps that completed (or were settled in doubt), from the history.
    async fn completed_steps(&self, id: &TaskId) -> Result<Vec<StepName>> {
        let history = self.store.history(id).await?;
        Ok(history
            .into_iter()
            .filter(|e| e.kind == EventKind::StepCompleted || (e.kind == EventKind::StepFailed && e.detail["in_doubt"] == json!(true)))
            .filter_map(|e| e.step)
            .collect())
    }

    /// Runs an operator's change again on a fresh read when it lost a race
    /// with the task's Scheduler (which moves the task's epoch on every
    /// decision), a bounded number of times.
    pub(crate) async fn retrying<T, F, Fut>(&self, mut change: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut tries = 0;
        loop {
            match change().await {
                Err(err) if err.is_lost_race() && tries < OPERATOR_TRIES_MAX => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(10 * u64::from(tries))).await;
                }
                other => return other,
            }
        }
    }
}

/// The largest task input a `resubmitted` event records as it is; a
/// larger one is recorded as its SHA-256 digest and size, so that the
/// history (and the status message sent with it to a reply queue) stays
/// small whatever the inputs.
pub const HISTORY_INPUT_BYTES_MAX: usize = 4 * 1024;

/// An input as a `resubmitted` event records it.
fn input_in_history(input: &Value) -> Value {
    let text = input.to_string();
    if text.len() <= HISTORY_INPUT_BYTES_MAX {
        return input.clone();
    }
    let digest: String = Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    json!({ "sha256": digest, "bytes": text.len() })
}

pub(crate) fn refused(action: Action, refusal: Refusal) -> Error {
    Error::Refused { action, refusal }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> TaskId {
        TaskId::new("t-1").unwrap()
    }

    fn check(err: Error, text: &str) {
        assert_eq!(err.to_string(), text);
    }

    #[test]
    fn refusals_name_the_action_and_the_task_once() {
        let terminal = TransitionError::Terminal { record: "task", state: "cancelled" };
        check(
            refused(Action::Cancel, Refusal::Task { task: id(), why: terminal }),
            "cancel: task t-1: task is cancelled, which is terminal",
        );
        check(
            refused(Action::Resubmit, Refusal::StepOfCompensation { task: id() }),
            "resubmit: task t-1 failed while being undone: resubmit resumes its compensation, not one step",
        );
        let steps = vec![StepName::new("a").unwrap(), StepName::new("b").unwrap()];
        check(
            Error::StepNotFound { task: id(), step: StepName::new("nope").unwrap(), steps },
            "step nope of task t-1 (its steps: a, b) not found",
        );
        check(Error::TaskNotFound(id()), "task t-1 not found");
    }

    #[test]
    fn a_large_input_is_recorded_as_its_digest() {
        let small = json!({ "n": 7 });
        assert_eq!(input_in_history(&small), small);
        let large = json!({ "blob": "x".repeat(HISTORY_INPUT_BYTES_MAX) });
        let recorded = input_in_history(&large);
        let bytes = large.to_string().len();
        assert_eq!(recorded["bytes"], json!(bytes));
        let digest = recorded["sha256"].as_str().unwrap();
        assert_eq!(digest.len(), 64);
        assert_eq!(input_in_history(&large), recorded, "the same input, the same digest");
        assert_ne!(input_in_history(&json!({ "blob": "y".repeat(HISTORY_INPUT_BYTES_MAX) }))["sha256"], json!(digest));
    }

    #[test]
    fn only_a_missing_workflow_of_a_submission_is_unknown() {
        let missing = crate::Error::Store(rota_store::Error::NotFound("workflow w (any version) is not registered".into()));
        check(Error::from_submit(missing), "workflow: workflow w (any version) is not registered");
        let down = Error::from_submit(crate::Error::Store(rota_store::Error::Unavailable("gone".into())));
        assert!(matches!(down, Error::Engine(_)), "{down:?}");
    }
}
