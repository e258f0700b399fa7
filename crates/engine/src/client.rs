//! What applications and operators do to tasks: submit, cancel,
//! resubmit, look up, and wait. Each is one fenced commit with its history
//! events, plus a doorbell when a Scheduler has work to claim.

use std::sync::Arc;
use std::time::Duration;

use rota_model::{Clock, Step, StepName, StepState, Task, TaskId, TaskState, WorkflowName};
use rota_store::{Changes, Created, Event, EventKind, NewTask, Outgoing, SharedStore, StepWrite, TaskRecord, TaskWrite};
use serde_json::{Value, json};

use crate::completions::Completions;
use crate::protocol::{self, Doorbell};
use crate::telemetry;
use crate::workflows::Workflows;
use crate::{Error, Result};
use tracing::Instrument;

/// How often an operator's change that lost a race is tried again.
const OPERATOR_TRIES_MAX: u32 = 5;

/// A request to run a workflow.
#[derive(Debug, Clone)]
pub struct Submission {
    /// The workflow.
    pub workflow: WorkflowName,
    /// Its version; the latest registered when `None`, as the client's
    /// [`Workflows`] knows it (read from the registry at most its
    /// `latest_refresh` ago, or registered through it since).
    pub version: Option<u32>,
    /// The task's input.
    pub input: Value,
    /// The task id (the submission's idempotency key); a fresh one when `None`.
    pub id: Option<TaskId>,
    /// Where the submitter wants status events (kept with the task).
    pub reply_to: Option<String>,
}

impl Submission {
    /// A submission of the latest `workflow` with `input`.
    pub fn new(workflow: WorkflowName, input: Value) -> Self {
        Submission { workflow, version: None, input, id: None, reply_to: None }
    }

    /// With a client-chosen id.
    pub fn with_id(mut self, id: TaskId) -> Self {
        self.id = Some(id);
        self
    }
}

/// The outcome of a submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The task's id.
    pub id: TaskId,
    /// False when a task with that id already existed (nothing was created).
    pub created: bool,
    /// The workflow version the task runs.
    pub version: u32,
}

/// The operations on tasks. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    workflows: Workflows,
    completions: Option<Completions>,
}

impl Client {
    /// A client of `store`. With `completions` (an engine in this process),
    /// [`Client::wait`] is notified; without, it polls the store.
    pub fn new(store: SharedStore, clock: Arc<dyn Clock>, workflows: Workflows, completions: Option<Completions>) -> Self {
        Client { store, clock, workflows, completions }
    }

    /// The store behind this client.
    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    /// The workflow definitions this client submits.
    pub fn workflows(&self) -> &Workflows {
        &self.workflows
    }

    /// Creates a task with its steps, its `received` event and the doorbell
    /// that wakes a Scheduler, in one transaction. Submitting an id that
    /// exists creates nothing and says so.
    ///
    /// Runs in a `rota.submit` span, the root of the task's trace (or a
    /// child of the caller's span): its trace context goes with the
    /// doorbell and the `received` event to the Scheduler that claims it.
    pub async fn submit(&self, submission: Submission) -> Result<Submitted> {
        let span = tracing::debug_span!("rota.submit", task_id = tracing::field::Empty, workflow = %submission.workflow);
        async move {
            let new = self.prepare(submission).await?;
            let (id, version) = (new.task.id.clone(), new.task.workflow_version);
            tracing::Span::current().record("task_id", id.as_str());
            match self.store.create_task(new).await? {
                Created::New => Ok(Submitted { id, created: true, version }),
                // The existing task keeps the version it started with.
                Created::Existing(existing) => Ok(Submitted { id, created: false, version: existing.task.workflow_version }),
            }
        }
        .instrument(span)
        .await
    }

    /// Everything [`Client::submit`] would create, without creating it: for
    /// an application that creates the task inside its own transaction, with
    /// its own writes (`PgStore::create_task_in` on PostgreSQL,
    /// `SqliteStore::create_task_with` on SQLite), so that both commit or
    /// neither does.
    pub async fn prepare(&self, submission: Submission) -> Result<NewTask> {
        let workflow = self.workflows.get(&submission.workflow, submission.version).await?;
        let now = self.clock.now();
        let id = match submission.id {
            Some(id) => id,
            None => TaskId::new(uuid::Uuid::now_v7().to_string()).expect("a UUID is a valid task id"),
        };
        let mut task = Task::new(id.clone(), workflow.name().clone(), workflow.version(), submission.input, now);
        task.reply_to = submission.reply_to;
        let steps: Vec<Step> =
            workflow.steps().iter().enumerate().map(|(i, def)| Step::new(id.clone(), def.name().clone(), i as u32, now)).collect();
        let mut detail = json!({ "workflow": workflow.name(), "version": workflow.version() });
        // Kept for a Scheduler that claims the task without its doorbell.
        if let Some(traceparent) = telemetry::current_traceparent() {
            detail["traceparent"] = Value::String(traceparent);
        }
        let received = Event::task(&id, now, EventKind::Received, detail);
        Ok(NewTask { task, steps, messages: vec![doorbell(&id)], events: vec![received] })
    }

    /// A task and its steps.
    pub async fn status(&self, id: &TaskId) -> Result<Option<TaskRecord>> {
        Ok(self.store.task(id).await?)
    }

    /// Cancels a task that has not finished. If some step that has a
    /// compensation completed (or may have: it is in flight, or an attempt
    /// of it was never confirmed), the task is compensated; otherwise it is
    /// Cancelled. Returns the state it moved to.
    pub async fn cancel(&self, id: &TaskId) -> Result<TaskState> {
        let state = self.retrying(|| self.try_cancel(id)).await?;
        if state.is_terminal()
            && let Some(completions) = &self.completions
        {
            completions.publish(id.clone(), state);
        }
        Ok(state)
    }

    async fn try_cancel(&self, id: &TaskId) -> Result<TaskState> {
        let record = self.required(id).await?;
        let workflow = self.workflows.get(&record.task.workflow, Some(record.task.workflow_version)).await?;
        let compensate = record.steps.iter().any(|s| {
            let maybe_done =
                matches!(s.state, StepState::Completed | StepState::Running) || (s.state == StepState::NotStarted && s.attempt > 0);
            maybe_done && workflow.step(&s.name).is_some_and(|d| d.compensate().is_some())
        });
        let now = self.clock.now();
        let next = record.task.cancel(compensate, now).map_err(|e| Error::Refused(format!("task {id}: {e}")))?;
        let state = next.state;
        let mut changes = Changes::default();
        changes.events.push(Event::task(id, now, EventKind::Cancelled, json!({ "compensate": compensate })));
        if compensate {
            changes.events.push(Event::task(id, now, EventKind::CompensationStarted, json!({ "reason": "cancelled by an operator" })));
            changes.send.push(doorbell(id));
        }
        changes.tasks.push(TaskWrite::replacing(&record.task, next));
        self.store.commit(changes).await?;
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
    pub async fn resubmit(&self, id: &TaskId, step: Option<&StepName>) -> Result<()> {
        self.retrying(|| self.try_resubmit(id, step)).await
    }

    async fn try_resubmit(&self, id: &TaskId, step: Option<&StepName>) -> Result<()> {
        let record = self.required(id).await?;
        let now = self.clock.now();
        let mut changes = Changes::default();
        let next = if self.failed_while_compensating(&record).await? {
            if step.is_some() {
                return Err(Error::Refused(format!(
                    "task {id} failed while being undone: resubmit resumes its compensation, not one step"
                )));
            }
            // The steps that failed during the compensation are the ones that
            // had completed; a step that failed going forward stays failed.
            let completed = self.completed_steps(id).await?;
            for failed in record.steps.iter().filter(|s| s.state == StepState::Failed && completed.contains(&s.name)) {
                let again =
                    failed.resubmit_compensation(now).map_err(|e| Error::Refused(format!("step {} of task {id}: {e}", failed.name)))?;
                changes.steps.push(StepWrite::replacing(failed, again));
            }
            record.task.resubmit_compensation(now).map_err(|e| Error::Refused(format!("task {id}: {e}")))?
        } else {
            if let Some(name) = step {
                let found =
                    record.steps.iter().find(|s| &s.name == name).ok_or_else(|| Error::Refused(format!("task {id} has no step {name}")))?;
                let again = found.resubmit(now).map_err(|e| Error::Refused(format!("step {name} of task {id}: {e}")))?;
                changes.steps.push(StepWrite::replacing(found, again));
            } else {
                for failed in record.steps.iter().filter(|s| s.state == StepState::Failed) {
                    let again = failed.resubmit(now).map_err(|e| Error::Refused(format!("step {} of task {id}: {e}", failed.name)))?;
                    changes.steps.push(StepWrite::replacing(failed, again));
                }
            }
            record.task.resubmit(now).map_err(|e| Error::Refused(format!("task {id}: {e}")))?
        };
        let detail = json!({ "step": step.map(|s| s.as_str()), "compensation": next.state == TaskState::Compensating });
        changes.events.push(Event::task(id, now, EventKind::Resubmitted, detail));
        changes.tasks.push(TaskWrite::replacing(&record.task, next));
        changes.send.push(doorbell(id));
        self.store.commit(changes).await?;
        Ok(())
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
    async fn retrying<T, F, Fut>(&self, mut change: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut tries = 0;
        loop {
            match change().await {
                Err(Error::Store(err)) if err.is_lost_race() && tries < OPERATOR_TRIES_MAX => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(10 * u64::from(tries))).await;
                }
                other => return other,
            }
        }
    }

    /// Waits up to `timeout` for the task to reach a terminal state; returns
    /// it (or the current state on timeout).
    pub async fn wait(&self, id: &TaskId, timeout: Duration) -> Result<TaskState> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut listener = self.completions.as_ref().map(Completions::subscribe);
        loop {
            let record = self.required(id).await?;
            if record.task.state.is_terminal() || tokio::time::Instant::now() >= deadline {
                return Ok(record.task.state);
            }
            let slice = Duration::from_millis(200).min(deadline.saturating_duration_since(tokio::time::Instant::now()));
            match listener.as_mut() {
                Some(listener) => {
                    if let Some(state) = Completions::wait(listener, id, slice).await {
                        return Ok(state);
                    }
                }
                None => tokio::time::sleep(slice).await,
            }
        }
    }

    async fn required(&self, id: &TaskId) -> Result<TaskRecord> {
        self.store.task(id).await?.ok_or_else(|| Error::Store(rota_store::Error::NotFound(format!("task {id}"))))
    }
}

fn doorbell(id: &TaskId) -> (rota_model::QueueName, Outgoing) {
    (protocol::tasks_queue(), Outgoing::json(&Doorbell::new(id.clone())).expect("doorbells serialize"))
}
