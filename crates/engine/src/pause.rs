//! Pausing a task: an operator holds a task's own moves without ending
//! it, and resumes it later.
//!
//! A paused task starts no new step: the steps in flight finish and their
//! answers are recorded (a completion, a failure and its retry's backoff, a
//! timeout), but nothing new is sent, not even a compensation, and the task
//! does not end while paused. Once nothing of it is in flight, its holder
//! gives it back ([`crate::plan`]'s hold), and no Scheduler claims it until
//! it is resumed; so a long pause costs no lease and no deadline. While a
//! step is in flight the task is held as usual and its deadlines run as
//! usual: the Supervisor expires a held paused task like any other
//! (counting the failure; the reset task stays paused and unclaimed), and
//! reports a step's timeout to its holder, which counts it and does not
//! start the retry until the resume.
//!
//! The mark is the task's `paused` column, so it survives restarts and is
//! seen by every process. Pause and resume are fenced like a cancel: each
//! is a compare-and-set on the task's state and lease epoch, which it
//! bumps, so a decision its holder took on the record before is refused at
//! commit and taken again on one with the new mark. Each records who did it
//! and why in the task's history (`paused`, `resumed`); neither is a status
//! event ([`crate::replies::is_status`]). Other operator moves keep the
//! mark: a paused task that is cancelled into compensation, or resubmitted,
//! waits for the resume like any paused task.
//!
//! A whole workflow can be paused too ([`Client::pause_workflow`]): no
//! claim takes a task of it, so its new tasks, and those given back or
//! reset, wait Pending (or Compensating) until it is resumed; tasks already
//! held go on to their end (pause those one by one to hold them). The mark
//! is a row of the store's own (`Tasks::set_workflow_paused`, a
//! compare-and-set), with who, when and why of the latest pause or resume.
//!
//! Deliberately left out: a pause that ends by itself at a given time.

use rota_model::{TaskId, TaskState, WorkflowName};
use rota_store::{AuditAction, Changes, Event, EventKind, TaskFilter, TaskRecord, TaskWrite, WorkflowPause};
use serde_json::json;

use crate::client::{Client, doorbell};
use crate::ops::{Action, Error, Refusal, Result, TaskDetail, refused};
use crate::replies;

/// The longest reason an operator's action may give, in characters: a
/// note for the next operator, kept in the task's history.
pub const REASON_CHARS_MAX: usize = 1_000;

/// Who acts on a task (pause, resume, cancel, resubmit) or a workflow
/// (pause, resume), and why: both are recorded with what it did.
#[derive(Debug, Clone, Copy)]
pub struct Operator<'a> {
    /// Who (the API's caller, or the local user of the CLI), as the history
    /// shows it.
    pub by: &'a str,
    /// Why, when given.
    pub reason: Option<&'a str>,
}

impl Operator<'_> {
    /// Refuses a reason longer than [`REASON_CHARS_MAX`].
    pub fn check(&self) -> Result<()> {
        if let Some(reason) = self.reason {
            let chars = reason.chars().count();
            if chars > REASON_CHARS_MAX {
                let why = format!("is {chars} characters long, more than the {REASON_CHARS_MAX} accepted");
                return Err(Error::InvalidRequest { field: "reason", why });
            }
        }
        Ok(())
    }
}

impl Client {
    /// Pauses task `id`, which must not have finished nor be paused already.
    /// Returns the task as the pause left it.
    pub async fn pause(&self, id: &TaskId, operator: Operator<'_>) -> Result<TaskDetail> {
        self.pause_or_resume(id, Action::Pause, operator).await
    }

    /// Resumes task `id`, which must be paused: a task left unclaimed by the
    /// pause gets a doorbell, so that a Scheduler takes it up at once (or
    /// when its backoff ends). Returns the task as the resume left it.
    pub async fn resume(&self, id: &TaskId, operator: Operator<'_>) -> Result<TaskDetail> {
        self.pause_or_resume(id, Action::Resume, operator).await
    }

    async fn pause_or_resume(&self, id: &TaskId, action: Action, operator: Operator<'_>) -> Result<TaskDetail> {
        operator.check()?;
        let record = self.retrying(|| self.try_pause_or_resume(id, action, operator)).await?;
        let verb = if action == Action::Pause { "paused" } else { "resumed" };
        tracing::info!(task = %id, by = operator.by, "task {id} {verb} by {}", operator.by);
        let definition = self.workflows.get(&record.task.workflow, Some(record.task.workflow_version)).await.ok();
        Ok(TaskDetail { record, definition, children: Vec::new() })
    }

    async fn try_pause_or_resume(&self, id: &TaskId, action: Action, operator: Operator<'_>) -> Result<TaskRecord> {
        let record = self.record(id).await?;
        let task = &record.task;
        let now = self.clock.now();
        let (moved, kind) = match action {
            Action::Pause => (task.pause(now), EventKind::Paused),
            _ => (task.resume(now), EventKind::Resumed),
        };
        let next = moved.map_err(|why| refused(action, Refusal::Task { task: id.clone(), why }))?;
        let mut changes = Changes::default();
        changes.events.push(Event::task(id, now, kind, json!({ "by": operator.by, "reason": operator.reason })));
        // A task nobody holds waits for a claim: ring when it may start.
        if !next.paused && !next.is_leased() && matches!(next.state, TaskState::Pending | TaskState::Compensating) {
            let mut ring = doorbell(id);
            if next.not_before > now {
                ring.1 = ring.1.with_delay(next.not_before.since(now));
            }
            changes.send.push(ring);
        }
        changes.tasks.push(TaskWrite::replacing(task, next.clone()));
        replies::commit(&self.store, changes).await?;
        Ok(TaskRecord { task: next, steps: record.steps })
    }

    /// Pauses workflow `name` (every version), which must be registered and
    /// not paused: no claim takes a task of it until it is resumed; tasks
    /// already held go on. Returns the pause as stored.
    pub async fn pause_workflow(&self, name: &WorkflowName, operator: Operator<'_>) -> Result<WorkflowPause> {
        self.pause_or_resume_workflow(name, Action::Pause, operator).await
    }

    /// Resumes workflow `name`, which must be paused, and rings a doorbell
    /// for one of its Pending tasks so that a Scheduler takes them up at
    /// once. Returns the resume as stored.
    pub async fn resume_workflow(&self, name: &WorkflowName, operator: Operator<'_>) -> Result<WorkflowPause> {
        let resumed = self.pause_or_resume_workflow(name, Action::Resume, operator).await?;
        let waiting = TaskFilter { state: Some(TaskState::Pending), workflow: Some(name.clone()), limit: 1, ..TaskFilter::default() };
        if let Some(task) = self.store.list_tasks(&waiting).await?.first() {
            let (queue, ring) = doorbell(&task.id);
            self.store.send(&queue, ring).await?;
        }
        Ok(resumed)
    }

    /// The latest pause or resume of every workflow that had one, by name.
    pub async fn workflow_pauses(&self) -> Result<Vec<WorkflowPause>> {
        Ok(self.store.workflow_pauses().await?)
    }

    /// Whether workflow `name` is paused now.
    pub async fn workflow_paused(&self, name: &WorkflowName) -> Result<bool> {
        Ok(self.store.workflow_pauses().await?.iter().any(|p| &p.workflow == name && p.paused))
    }

    async fn pause_or_resume_workflow(&self, name: &WorkflowName, action: Action, operator: Operator<'_>) -> Result<WorkflowPause> {
        operator.check()?;
        if self.store.workflow(name, None).await?.is_none() {
            return Err(Error::UnknownWorkflow(format!("{name} is not registered")));
        }
        let change = WorkflowPause {
            workflow: name.clone(),
            paused: action == Action::Pause,
            by: operator.by.to_owned(),
            reason: operator.reason.map(str::to_owned),
            at: self.clock.now(),
        };
        match self.store.set_workflow_paused(&change).await {
            Ok(()) => {}
            Err(rota_store::Error::Conflict(_)) => {
                let why = if change.paused { "is paused already" } else { "is not paused" };
                return Err(refused(action, Refusal::Workflow { workflow: name.clone(), why }));
            }
            Err(err) => return Err(err.into()),
        }
        let verb = if change.paused { "paused" } else { "resumed" };
        tracing::info!(workflow = %name, by = operator.by, reason = operator.reason, "workflow {name} {verb} by {}", operator.by);
        let recorded = if change.paused { AuditAction::WorkflowPause } else { AuditAction::WorkflowResume };
        self.record_action(recorded, operator, name.as_str(), json!({})).await?;
        Ok(change)
    }
}
