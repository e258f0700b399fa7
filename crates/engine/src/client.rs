//! What applications do with tasks: submit, look up, and wait. A
//! submission is one commit with its history event and the doorbell that
//! wakes a Scheduler. The operator's requests (cancel, resubmit, the
//! lookups that refuse a missing task) are in [`crate::ops`].

use std::sync::Arc;
use std::time::Duration;

use rota_model::{Clock, Priority, QueueName, Step, Tags, Task, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{Created, Event, EventKind, NewTask, Outgoing, SharedStore, TaskRecord};
use serde_json::{Value, json};

use crate::completions::Completions;
use crate::protocol::{self, Doorbell};
use crate::replies;
use crate::scheduler::Scheduler;
use crate::telemetry;
use crate::workflows::Workflows;
use crate::{Error, Result};
use tracing::Instrument;

/// What [`Client::take_at_creation`] did with a submission.
enum Taken {
    /// Created claimed (and started, or being started).
    Created,
    /// A task with its id existed: nothing was written.
    Existing(Box<TaskRecord>),
    /// Not taken: to be created Pending.
    Not(Box<NewTask>),
}

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
    /// The URL the submitter wants status events posted to (kept with the task).
    pub reply_to: Option<String>,
    /// The durable queue the submitter reads status events from: each is
    /// sent there in the commit that records it ([`crate::replies`]).
    pub reply_queue: Option<QueueName>,
    /// When the task may start: it waits Pending until then.
    pub start: Start,
    /// The schedule fire that submits it, if one does (told in its
    /// `received` event).
    pub fired_by: Option<Fired>,
    /// Who submits it ([`rota_model::Task::submitter`]), when known: the
    /// API's caller.
    pub submitter: Option<String>,
    /// Its labels, by which operators find it ([`rota_model::Task::tags`]).
    pub tags: Tags,
    /// Its priority ([`rota_model::Task::priority`]); the workflow's
    /// default (`priority:`) when `None`.
    pub priority: Option<Priority>,
    /// The step of another task that starts it, when it is a child
    /// workflow (told in its `received` event).
    pub parent: Option<rota_model::ParentLink>,
}

/// The schedule fire behind a submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fired {
    /// The schedule.
    pub schedule: rota_model::ScheduleName,
    /// The fire time (for a manual fire, when it was asked for).
    pub fire_at: Timestamp,
    /// Whether an operator fired it (`trigger`) rather than the cron.
    pub manual: bool,
}

/// When a submitted task may start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Start {
    /// As soon as a Scheduler claims it.
    #[default]
    Now,
    /// No earlier than this time (now when it is past), at most
    /// [`START_DELAY_MAX`] ahead.
    At(Timestamp),
    /// No earlier than this long after the submission, by the client's
    /// clock, at most [`START_DELAY_MAX`].
    After(Duration),
}

/// A start time written in RFC 3339 (`2026-12-01T02:00:00Z`,
/// `2026-12-01T03:00:00+01:00`), as `rota submit --at` and the API's
/// `start_at` take it. The error says what was expected.
pub fn parse_start_at(text: &str) -> std::result::Result<Timestamp, String> {
    let at = chrono::DateTime::parse_from_rfc3339(text.trim())
        .map_err(|err| format!("expected an RFC 3339 time such as 2026-12-01T02:00:00Z ({err}), got {text:?}"))?;
    Ok(Timestamp::from_millis(at.timestamp_millis()))
}

/// The furthest ahead a task's start may be put off: a year and a day,
/// enough for a yearly job, short enough to catch a start given in the
/// wrong unit.
pub const START_DELAY_MAX: Duration = Duration::from_secs(366 * 24 * 3600);

/// The largest task input a client takes unless told otherwise, in bytes
/// of JSON: half of a step request's limit ([`rota_store::BODY_BYTES_MAX`]),
/// so that a step whose `with` renders the whole input still fits beside
/// its other fields and earlier steps' outputs.
pub const INPUT_BYTES_MAX_DEFAULT: usize = rota_store::BODY_BYTES_MAX / 2;

impl Submission {
    /// A submission of the latest `workflow` with `input`.
    pub fn new(workflow: WorkflowName, input: Value) -> Self {
        Submission {
            workflow,
            version: None,
            input,
            id: None,
            reply_to: None,
            reply_queue: None,
            start: Start::Now,
            fired_by: None,
            submitter: None,
            tags: Tags::default(),
            priority: None,
            parent: None,
        }
    }

    /// Starting no earlier than `at`.
    pub fn starting_at(self, at: Timestamp) -> Self {
        self.with_start(Start::At(at))
    }

    /// Starting as `start` says.
    pub fn with_start(mut self, start: Start) -> Self {
        self.start = start;
        self
    }

    /// Sending its status events to `queue`.
    pub fn with_reply_queue(mut self, queue: QueueName) -> Self {
        self.reply_queue = Some(queue);
        self
    }

    /// Submitted by the schedule fire `fired`.
    pub fn fired_by(mut self, fired: Fired) -> Self {
        self.fired_by = Some(fired);
        self
    }

    /// Submitted by `submitter`.
    pub fn submitted_by(mut self, submitter: impl Into<String>) -> Self {
        self.submitter = Some(submitter.into());
        self
    }

    /// Labelled with `tags`.
    pub fn with_tags(mut self, tags: Tags) -> Self {
        self.tags = tags;
        self
    }

    /// Of `priority` rather than the workflow's default.
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = Some(priority);
        self
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
    pub(crate) store: SharedStore,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) workflows: Workflows,
    pub(crate) completions: Option<Completions>,
    /// The largest input a submission may carry, in bytes of JSON.
    pub(crate) input_bytes_max: usize,
    /// The Scheduler of this process, which may take a submission in the
    /// commit that creates it (see [`Scheduler::take_at_creation`]).
    pub(crate) scheduler: Option<Scheduler>,
}

impl Client {
    /// A client of `store`. With `completions` (an engine in this process),
    /// [`Client::wait`] is notified; without, it polls the store. It takes
    /// inputs up to [`INPUT_BYTES_MAX_DEFAULT`].
    pub fn new(store: SharedStore, clock: Arc<dyn Clock>, workflows: Workflows, completions: Option<Completions>) -> Self {
        Client { store, clock, workflows, completions, input_bytes_max: INPUT_BYTES_MAX_DEFAULT, scheduler: None }
    }

    /// Lets `scheduler`, which runs in this process, take what this client
    /// submits in the commit that creates it, whenever it has no backlog:
    /// the task is created claimed and started at once, without a doorbell
    /// and a claim of its own.
    pub fn with_scheduler(mut self, scheduler: Scheduler) -> Self {
        self.scheduler = Some(scheduler);
        self
    }

    /// Takes task inputs (and schedule inputs) of up to `bytes` of JSON,
    /// refusing larger ones at submission (see [`check_input_bytes_max`]
    /// for the bounds of `bytes`).
    pub fn with_input_bytes_max(mut self, bytes: usize) -> Self {
        self.input_bytes_max = bytes;
        self
    }

    /// The largest input this client takes, in bytes of JSON.
    pub fn input_bytes_max(&self) -> usize {
        self.input_bytes_max
    }

    /// Refuses an input larger than this client takes; the error names the bound.
    pub(crate) fn check_input(&self, input: &Value) -> std::result::Result<(), String> {
        let bytes = serde_json::to_string(input).map_or(usize::MAX, |text| text.len());
        if bytes > self.input_bytes_max {
            return Err(format!(
                "is {bytes} bytes of JSON, over the limit of {} bytes (input_bytes_max); pass large data by reference (a URL, a key)",
                self.input_bytes_max
            ));
        }
        Ok(())
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
            let new = match self.take_at_creation(new).await? {
                Taken::Created => return Ok(Submitted { id, created: true, version }),
                Taken::Existing(existing) => return Ok(Submitted { id, created: false, version: existing.task.workflow_version }),
                Taken::Not(new) => *new,
            };
            match self.store.create_task(new).await? {
                Created::New => Ok(Submitted { id, created: true, version }),
                // The existing task keeps the version it started with.
                Created::Existing(existing) => Ok(Submitted { id, created: false, version: existing.task.workflow_version }),
            }
        }
        .instrument(span)
        .await
    }

    /// Creates `new` claimed by this process's Scheduler when it takes it
    /// (see [`Scheduler::take_at_creation`]) and starts it; else hands `new`
    /// back, to be created Pending. A paused workflow's task is handed back
    /// too: the store refuses to create it claimed.
    async fn take_at_creation(&self, new: NewTask) -> Result<Taken> {
        let Some(scheduler) = &self.scheduler else { return Ok(Taken::Not(Box::new(new))) };
        let Some(mut taking) = scheduler.take_at_creation().await else { return Ok(Taken::Not(Box::new(new))) };
        let Some(taken) = taking.take(new.clone(), self.clock.now()).await else { return Ok(Taken::Not(Box::new(new))) };
        match self.store.create_task(taken).await {
            Ok(Created::New) => {
                taking.created();
                Ok(Taken::Created)
            }
            Ok(Created::Existing(existing)) => Ok(Taken::Existing(existing)),
            Err(rota_store::Error::Conflict(_)) => Ok(Taken::Not(Box::new(new))),
            Err(err) => Err(err.into()),
        }
    }

    /// Everything [`Client::submit`] would create, without creating it: for
    /// an application that creates the task inside its own transaction, with
    /// its own writes (`PgStore::create_task_in` on PostgreSQL,
    /// `SqliteStore::create_task_with` on SQLite), so that both commit or
    /// neither does.
    pub async fn prepare(&self, submission: Submission) -> Result<NewTask> {
        if let Some(queue) = &submission.reply_queue {
            replies::check_reply_queue(queue).map_err(|why| Error::InvalidSubmission { field: "reply_queue", why })?;
        }
        self.check_input(&submission.input).map_err(|why| Error::InvalidSubmission { field: "input", why })?;
        let workflow = self.workflows.get(&submission.workflow, submission.version).await?;
        let now = self.clock.now();
        let id = match submission.id {
            Some(id) => id,
            None => TaskId::new(uuid::Uuid::now_v7().to_string()).expect("a UUID is a valid task id"),
        };
        let too_far =
            |field| Error::InvalidSubmission { field, why: format!("must be at most {} days ahead", START_DELAY_MAX.as_secs() / 86_400) };
        let start_at = match submission.start {
            Start::Now => None,
            Start::At(at) if at.since(now) > START_DELAY_MAX => return Err(too_far("start_at")),
            Start::After(delay) if delay > START_DELAY_MAX => return Err(too_far("delay")),
            Start::At(at) => Some(at),
            Start::After(delay) => Some(now.add(delay)),
        }
        .filter(|at| *at > now);
        // The key is computed once, here: a task's key never changes.
        let concurrency = workflow.concurrency_key(&submission.input).map_err(|why| Error::InvalidSubmission {
            field: "input",
            why: format!(
                "the workflow's `concurrency.key` `{}` gives no key: {why}",
                workflow.concurrency().map_or("", |c| c.key().source())
            ),
        })?;
        let mut task = Task::new(id.clone(), workflow.name().clone(), workflow.version(), submission.input, now);
        task.concurrency = concurrency;
        task.reply_to = submission.reply_to;
        task.reply_queue = submission.reply_queue;
        task.submitter = submission.submitter;
        task.tags = submission.tags;
        task.priority = submission.priority.unwrap_or_else(|| workflow.priority());
        task.parent = submission.parent.clone();
        // Claims skip the task until then, and its doorbell rings then.
        let mut ring = doorbell(&id);
        if let Some(at) = start_at {
            task.not_before = at;
            ring.1 = ring.1.with_delay(at.since(now));
        }
        let steps: Vec<Step> =
            workflow.steps().iter().enumerate().map(|(i, def)| Step::new(id.clone(), def.name().clone(), i as u32, now)).collect();
        let mut detail = json!({ "workflow": workflow.name(), "version": workflow.version() });
        if let Some(at) = start_at {
            detail["start_at"] = json!(at.as_millis());
        }
        if let Some(parent) = &submission.parent {
            detail["parent"] = json!({ "task": parent.task, "step": parent.step, "attempt": parent.attempt, "depth": parent.depth });
        }
        if let Some(fired) = &submission.fired_by {
            detail["schedule"] = json!({
                "name": fired.schedule,
                "fire_at": rota_model::schedule::rfc3339_millis(fired.fire_at),
                "manual": fired.manual,
            });
        }
        // Kept for a Scheduler that claims the task without its doorbell.
        if let Some(traceparent) = telemetry::current_traceparent() {
            detail["traceparent"] = Value::String(traceparent);
        }
        let received = Event::task(&id, now, EventKind::Received, detail);
        let mut new = NewTask { task, steps, messages: vec![ring], events: vec![received] };
        replies::attach_new(&mut new);
        Ok(new)
    }

    /// A task and its steps.
    pub async fn status(&self, id: &TaskId) -> Result<Option<TaskRecord>> {
        Ok(self.store.task(id).await?)
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

/// Checks an input bound: at least 1 byte, at most [`rota_store::BODY_BYTES_MAX`]
/// (no step request could carry a larger input whole).
pub fn check_input_bytes_max(bytes: usize) -> std::result::Result<(), String> {
    if !(1..=rota_store::BODY_BYTES_MAX).contains(&bytes) {
        return Err(format!("must be between 1 and {}, got {bytes}", rota_store::BODY_BYTES_MAX));
    }
    Ok(())
}

pub(crate) fn doorbell(id: &TaskId) -> (rota_model::QueueName, Outgoing) {
    (protocol::tasks_queue(), Outgoing::json(&Doorbell::new(id.clone())).expect("doorbells serialize"))
}
