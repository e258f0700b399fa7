//! Where an operator command acts: the store itself (`--store`, through a
//! [`Client`] with no engine in this process) or a remote server's HTTP API
//! (`--server`). This only picks the transport: on a local store the
//! requests on tasks go through the same operator requests as the server's
//! handlers ([`rota_engine::ops`], which hold the rules), and both sides
//! answer with the API's wire types ([`rota_api::wire`]), built locally by
//! the same conversions the server uses. So each command has one code path
//! after this and prints the same thing either way.
//!
//! A request that a rule refuses (a missing task or step, a workflow that
//! is not registered, a change the task's state does not allow) reads the
//! same on both sides: the rule's own text, which the server answers as its
//! reason. Other failures name what was asked first.
//! Known differences, kept because the API chose them: over HTTP a pause or
//! resume of a queue that does not exist is an error (locally it creates
//! the queue), failures of the server's store keep their details in its
//! log, and listings are bounded by the server's limit (1000 by default).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use rota_api::wire::{
    AlertView, AuditEntryView, BatchFilterView, BatchRequest, BatchView, BreakerView, CallbackAccepted, Count, DeadLetterFilterView,
    DeadLetterView, EventView, OperatorRequest, PauseRequest, QueueView, ScheduleRequest, ScheduleView, SignalDelivery, TaskCounts,
    TaskStateChange, TaskSummary, TaskView, WorkflowPauseView, WorkflowView,
};
use rota_engine::ops::Operator;
use rota_engine::{Client, Submission, Workflows, ops};
use rota_model::{Priority, QueueName, ScheduleName, SignalName, StepName, SystemClock, Tags, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{AuditAction, AuditCursor, AuditFilter, BatchAction, BatchFilter, DeadLetterFilter, Redrive, SharedStore, TaskFilter};
use serde::Serialize;
use serde_json::Value;

use crate::output;
use crate::remote::{self, Server};

/// The store, or a server's API.
pub enum Backend {
    /// The store named by `--store`.
    Local(SharedStore),
    /// The server named by `--server`.
    Remote(Server),
}

/// The outcome of a submit.
pub struct Submitted {
    /// The task (the existing one when its id was taken).
    pub view: TaskView,
    /// Whether this submit created it.
    pub created: bool,
}

/// The body of `POST /v1/tasks`.
#[derive(Serialize)]
struct SubmitBody<'a> {
    workflow: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<u32>,
    input: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    start_at: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reply_queue: Option<&'a str>,
    #[serde(skip_serializing_if = "Tags::is_empty")]
    tags: &'a Tags,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<Priority>,
}

/// How a task is submitted, beyond what it runs: when it starts, where its
/// status events go, its tags.
#[derive(Clone, Copy)]
pub struct SubmitHow<'a> {
    pub start: &'a Start,
    pub reply_queue: Option<&'a QueueName>,
    pub tags: &'a Tags,
    pub priority: Option<Priority>,
}

/// When a submitted task may start, as the command line says it.
#[derive(Debug, Clone, Default)]
pub enum Start {
    /// As soon as a Scheduler claims it.
    #[default]
    Now,
    /// At this time, in RFC 3339, as the user wrote it.
    At(String),
    /// This long after the submission reaches the store (or the server).
    After(Duration),
}

fn client(store: &SharedStore) -> Client {
    Client::new(store.clone(), Arc::new(SystemClock), Workflows::new(store.clone()), None)
}

/// Who sends a signal (or resubmits with a new input, pauses or resumes a
/// task) from the command line on a local store, as the task's history
/// shows it: the OS user, as the login shell names it.
pub(crate) fn local_sender() -> String {
    match std::env::var("USER").or_else(|_| std::env::var("LOGNAME")) {
        Ok(user) if !user.is_empty() => format!("cli, user {user}"),
        _ => "cli".to_owned(),
    }
}

/// An operator request's error on a local store: a rule's refusal as the
/// rule words it, a failure after what was asked.
fn local_error(asked: impl FnOnce() -> String, err: ops::Error) -> anyhow::Error {
    match err {
        ops::Error::Engine(failure) => anyhow::Error::new(failure).context(asked()),
        refusal => anyhow::Error::new(refusal),
    }
}

/// The same for the server's answer: its codes for a rule's refusal carry
/// the rule's text as their reason.
fn remote_error(asked: impl FnOnce() -> String, err: anyhow::Error) -> anyhow::Error {
    match remote::code_of(&err) {
        Some("not_found" | "unknown_workflow" | "refused" | "invalid_signal" | "unknown_callback" | "schedule_exists" | "invalid_body") => {
            err
        }
        _ => err.context(asked()),
    }
}

impl Backend {
    /// Submits a task.
    pub async fn submit(
        &self,
        workflow: &WorkflowName,
        version: Option<u32>,
        input: Value,
        id: Option<TaskId>,
        how: &SubmitHow<'_>,
    ) -> anyhow::Result<Submitted> {
        let SubmitHow { start, reply_queue, tags, priority } = *how;
        match self {
            Backend::Local(store) => {
                let client = client(store);
                let start = match start {
                    Start::Now => rota_engine::Start::Now,
                    Start::At(text) => {
                        rota_engine::Start::At(rota_engine::client::parse_start_at(text).map_err(|why| anyhow!("--at: {why}"))?)
                    }
                    Start::After(delay) => rota_engine::Start::After(*delay),
                };
                let reply_queue = reply_queue.cloned();
                let submission = Submission {
                    workflow: workflow.clone(),
                    version,
                    input,
                    id,
                    reply_to: None,
                    reply_queue,
                    start,
                    fired_by: None,
                    submitter: None,
                    tags: tags.clone(),
                    priority,
                    parent: None,
                };
                let submitted = client.submit(submission).await.map_err(|err| anyhow::Error::new(ops::Error::from_submit(err)))?;
                let detail =
                    client.task(&submitted.id).await.map_err(|err| local_error(|| format!("cannot read task {}", submitted.id), err))?;
                Ok(Submitted { view: TaskView::from(&detail), created: submitted.created })
            }
            Backend::Remote(server) => {
                let (start_at, delay) = match start {
                    Start::Now => (None, None),
                    Start::At(text) => (Some(text.as_str()), None),
                    Start::After(delay) => (None, Some(humantime::format_duration(*delay).to_string())),
                };
                let body = SubmitBody {
                    workflow: workflow.as_str(),
                    version,
                    input: &input,
                    id: id.as_ref().map(TaskId::as_str),
                    start_at,
                    delay,
                    reply_queue: reply_queue.map(QueueName::as_str),
                    tags,
                    priority,
                };
                let (status, view) = server.post::<TaskView, _>(&["v1", "tasks"], Some(&body)).await?;
                Ok(Submitted { view, created: status == reqwest::StatusCode::CREATED })
            }
        }
    }

    /// A task with its steps; "task ID not found" when it does not exist.
    pub async fn task(&self, id: &TaskId) -> anyhow::Result<TaskView> {
        match self {
            Backend::Local(store) => {
                let client = client(store);
                let asked = || format!("cannot read task {id}");
                let detail = client.task(id).await.map_err(|err| local_error(asked, err))?;
                let mut view = TaskView::from(&detail);
                view.workflow_paused = client.workflow_paused(&detail.record.task.workflow).await.map_err(|err| local_error(asked, err))?;
                view.waiting_for = client.concurrency_wait(&detail.record.task).await.map_err(|err| local_error(asked, err))?;
                Ok(view)
            }
            Backend::Remote(server) => server.get(&["v1", "tasks", id.as_str()], &[]).await,
        }
    }

    /// A task's events, oldest first.
    pub async fn history(&self, id: &TaskId) -> anyhow::Result<Vec<EventView>> {
        match self {
            Backend::Local(store) => {
                let events =
                    client(store).history(id).await.map_err(|err| local_error(|| format!("cannot read the history of task {id}"), err))?;
                Ok(events.iter().map(EventView::from).collect())
            }
            Backend::Remote(server) => server.get(&["v1", "tasks", id.as_str(), "history"], &[]).await,
        }
    }

    /// Every circuit breaker: shared through the store, or reported by
    /// the `rota serve` processes that keep their own.
    pub async fn breakers(&self) -> anyhow::Result<Vec<BreakerView>> {
        match self {
            Backend::Local(store) => {
                let statuses = rota_engine::status::breakers(store).await.context("cannot read the circuit breakers")?;
                let shared = store.shared_breakers().await.context("cannot read the shared circuit breakers")?;
                Ok(BreakerView::all(&shared, &statuses))
            }
            Backend::Remote(server) => server.get(&["v1", "breakers"], &[]).await,
        }
    }

    /// The tasks `filter` selects, newest first.
    pub async fn tasks(&self, filter: TaskFilter) -> anyhow::Result<Vec<TaskSummary>> {
        match self {
            Backend::Local(store) => {
                let tasks = client(store).tasks(&filter).await.map_err(|err| local_error(|| "cannot list tasks".to_owned(), err))?;
                Ok(tasks.iter().map(TaskSummary::from).collect())
            }
            Backend::Remote(server) => {
                let mut params = search_params(&filter);
                params.push(("limit", filter.limit.to_string()));
                if let Some(state) = filter.state {
                    params.push(("state", state.as_str().to_owned()));
                }
                if let Some(workflow) = filter.workflow {
                    params.push(("workflow", workflow.to_string()));
                }
                if let Some(locked_by) = filter.locked_by {
                    params.push(("locked_by", locked_by.to_string()));
                }
                if filter.at_risk {
                    params.push(("at_risk", "true".to_owned()));
                }
                if let Some(before) = &filter.before {
                    params.push(("before", before.to_string()));
                }
                server.get(&["v1", "tasks"], &params).await.context("cannot list tasks")
            }
        }
    }

    /// How many tasks match `filter` (its `before` and `limit` aside), by
    /// state.
    pub async fn task_counts(&self, filter: &TaskFilter) -> anyhow::Result<TaskCounts> {
        match self {
            Backend::Local(store) => {
                let counted =
                    client(store).task_counts(filter).await.map_err(|err| local_error(|| "cannot count tasks".to_owned(), err))?;
                Ok(TaskCounts::from(counted.as_slice()))
            }
            Backend::Remote(server) => {
                let mut params = search_params(filter);
                if let Some(workflow) = &filter.workflow {
                    params.push(("workflow", workflow.to_string()));
                }
                let counts: TaskCounts = server.get(&["v1", "tasks", "counts"], &params).await.context("cannot count tasks")?;
                match filter.state {
                    // The counts have every state; the others are zero.
                    Some(state) => Ok(TaskCounts::from([(state, counts.of(state))].as_slice())),
                    None => Ok(counts),
                }
            }
        }
    }

    /// Operator alerts, newest first.
    pub async fn alerts(&self, limit: u32) -> anyhow::Result<Vec<AlertView>> {
        match self {
            Backend::Local(store) => {
                let alerts = client(store).alerts(limit).await.map_err(|err| local_error(|| "cannot list alerts".to_owned(), err))?;
                Ok(alerts.iter().map(AlertView::from).collect())
            }
            Backend::Remote(server) => server.get(&["v1", "alerts"], &[("limit", limit.to_string())]).await.context("cannot list alerts"),
        }
    }

    /// Resubmits a task in Error (or one of its steps), with an optional
    /// reason; the task afterwards. On a local store the history records
    /// the OS user who ran the command.
    pub async fn resubmit(&self, id: &TaskId, step: Option<&StepName>, reason: Option<&str>) -> anyhow::Result<TaskView> {
        let asked = || format!("cannot resubmit task {id}");
        match self {
            Backend::Local(store) => {
                let by = local_sender();
                let operator = Operator { by: &by, reason };
                let resubmitted = client(store).resubmit(id, step, operator).await.map_err(|err| local_error(asked, err))?;
                Ok(TaskView::from(&resubmitted))
            }
            Backend::Remote(server) => {
                let segments: Vec<&str> = match step {
                    Some(step) => vec!["v1", "tasks", id.as_str(), "steps", step.as_str(), "resubmit"],
                    None => vec!["v1", "tasks", id.as_str(), "resubmit"],
                };
                let body = OperatorRequest { reason: reason.map(str::to_owned) };
                let (_, view) = server.post::<TaskView, _>(&segments, Some(&body)).await.map_err(|err| remote_error(asked, err))?;
                Ok(view)
            }
        }
    }

    /// Resubmits a task in Error from `step` with a new input: the step and
    /// its dependents run again on it. On a local store the history records
    /// the OS user who ran the command.
    pub async fn resubmit_with_input(
        &self,
        id: &TaskId,
        step: &StepName,
        input: serde_json::Value,
        reason: Option<&str>,
    ) -> anyhow::Result<TaskView> {
        let asked = || format!("cannot resubmit task {id}");
        match self {
            Backend::Local(store) => {
                let by = local_sender();
                let operator = Operator { by: &by, reason };
                let resubmitted =
                    client(store).resubmit_with_input(id, step, input, operator).await.map_err(|err| local_error(asked, err))?;
                Ok(TaskView::from(&resubmitted))
            }
            Backend::Remote(server) => {
                let segments = ["v1", "tasks", id.as_str(), "steps", step.as_str(), "resubmit"];
                let body = serde_json::json!({ "input": input, "reason": reason });
                let (_, view) = server.post::<TaskView, _>(&segments, Some(&body)).await.map_err(|err| remote_error(asked, err))?;
                Ok(view)
            }
        }
    }

    /// Cancels a task, with an optional reason; the state it moved to. On
    /// a local store the history records the OS user who ran the command.
    pub async fn cancel(&self, id: &TaskId, reason: Option<&str>) -> anyhow::Result<TaskState> {
        let asked = || format!("cannot cancel task {id}");
        match self {
            Backend::Local(store) => {
                let by = local_sender();
                client(store).cancel(id, Operator { by: &by, reason }).await.map_err(|err| local_error(asked, err))
            }
            Backend::Remote(server) => {
                let body = OperatorRequest { reason: reason.map(str::to_owned) };
                let (_, change) = server
                    .post::<TaskStateChange, _>(&["v1", "tasks", id.as_str(), "cancel"], Some(&body))
                    .await
                    .map_err(|err| remote_error(asked, err))?;
                Ok(change.state.into())
            }
        }
    }

    /// Pauses (`pause`) or resumes a workflow, with an optional reason; the
    /// change as stored. On a local store it records the OS user who ran
    /// the command.
    pub async fn pause_workflow(&self, name: &WorkflowName, reason: Option<&str>, pause: bool) -> anyhow::Result<WorkflowPauseView> {
        let verb = if pause { "pause" } else { "resume" };
        let asked = || format!("cannot {verb} workflow {name}");
        match self {
            Backend::Local(store) => {
                let by = local_sender();
                let operator = Operator { by: &by, reason };
                let client = client(store);
                let moved = if pause { client.pause_workflow(name, operator).await } else { client.resume_workflow(name, operator).await };
                Ok(WorkflowPauseView::from(&moved.map_err(|err| local_error(asked, err))?))
            }
            Backend::Remote(server) => {
                let body = PauseRequest { reason: reason.map(str::to_owned) };
                let (_, view) = server
                    .post::<WorkflowPauseView, _>(&["v1", "workflows", name.as_str(), verb], Some(&body))
                    .await
                    .map_err(|err| remote_error(asked, err))?;
                Ok(view)
            }
        }
    }

    /// Pauses a task, with an optional reason; the task afterwards. On a
    /// local store the history records the OS user who ran the command.
    pub async fn pause_task(&self, id: &TaskId, reason: Option<&str>) -> anyhow::Result<TaskView> {
        self.pause_or_resume(id, reason, true).await
    }

    /// Resumes a paused task, with an optional reason; the task afterwards.
    pub async fn resume_task(&self, id: &TaskId, reason: Option<&str>) -> anyhow::Result<TaskView> {
        self.pause_or_resume(id, reason, false).await
    }

    async fn pause_or_resume(&self, id: &TaskId, reason: Option<&str>, pause: bool) -> anyhow::Result<TaskView> {
        let verb = if pause { "pause" } else { "resume" };
        let asked = || format!("cannot {verb} task {id}");
        match self {
            Backend::Local(store) => {
                let by = local_sender();
                let operator = Operator { by: &by, reason };
                let client = client(store);
                let moved = if pause { client.pause(id, operator).await } else { client.resume(id, operator).await };
                Ok(TaskView::from(&moved.map_err(|err| local_error(asked, err))?))
            }
            Backend::Remote(server) => {
                let body = PauseRequest { reason: reason.map(str::to_owned) };
                let (_, view) = server
                    .post::<TaskView, _>(&["v1", "tasks", id.as_str(), verb], Some(&body))
                    .await
                    .map_err(|err| remote_error(asked, err))?;
                Ok(view)
            }
        }
    }

    /// Sends a signal to a task. On a local store the history records the
    /// OS user who ran the command as its sender.
    pub async fn signal(&self, id: &TaskId, signal: &SignalName, data: serde_json::Value) -> anyhow::Result<SignalDelivery> {
        let asked = || format!("cannot send signal {signal} to task {id}");
        match self {
            Backend::Local(store) => {
                let delivered = client(store).signal(id, signal, data, &local_sender()).await.map_err(|err| local_error(asked, err))?;
                Ok(SignalDelivery {
                    id: id.to_string(),
                    signal: signal.to_string(),
                    step: delivered.step.to_string(),
                    completed: delivered.completed,
                })
            }
            Backend::Remote(server) => {
                let segments = ["v1", "tasks", id.as_str(), "signals", signal.as_str()];
                let (_, delivery) =
                    server.post::<SignalDelivery, _>(&segments, Some(&data)).await.map_err(|err| remote_error(asked, err))?;
                Ok(delivery)
            }
        }
    }

    /// Completes or fails the attempt of a callback step that `token`
    /// names. On a local store the history records the OS user who ran
    /// the command as its sender.
    pub async fn callback(&self, token: &str, outcome: rota_engine::callback::Outcome) -> anyhow::Result<CallbackAccepted> {
        let asked = || "cannot take the callback".to_owned();
        match self {
            Backend::Local(store) => {
                let accepted = client(store).callback(token, outcome, &local_sender()).await.map_err(|err| local_error(asked, err))?;
                Ok(CallbackAccepted {
                    task_id: accepted.task.to_string(),
                    step: accepted.step.to_string(),
                    attempt: accepted.attempt,
                    completed: accepted.completed,
                })
            }
            Backend::Remote(server) => {
                let body = match outcome {
                    rota_engine::callback::Outcome::Succeeded { output } => serde_json::json!({ "output": output }),
                    rota_engine::callback::Outcome::Failed { error, retryable } => {
                        serde_json::json!({ "error": error, "retryable": retryable })
                    }
                };
                let (_, accepted) = server
                    .post::<CallbackAccepted, _>(&["v1", "callbacks", token], Some(&body))
                    .await
                    .map_err(|err| remote_error(asked, err))?;
                Ok(accepted)
            }
        }
    }

    /// The latest version of each registered workflow, with its pause.
    pub async fn workflows(&self) -> anyhow::Result<Vec<WorkflowView>> {
        match self {
            Backend::Local(store) => {
                let entries = store.workflows().await.context("cannot list workflows")?;
                let pauses = store.workflow_pauses().await.context("cannot list workflows")?;
                entries
                    .iter()
                    .map(|entry| {
                        let view = WorkflowView::from_entry(entry).ok_or_else(|| {
                            anyhow!("the stored definition of workflow {} version {} is unreadable", entry.name, entry.version)
                        })?;
                        Ok(view.with_pause(&pauses))
                    })
                    .collect()
            }
            Backend::Remote(server) => server.get(&["v1", "workflows"], &[]).await.context("cannot list workflows"),
        }
    }

    /// Counts of every queue.
    pub async fn queues(&self) -> anyhow::Result<Vec<QueueView>> {
        match self {
            Backend::Local(store) => Ok(store.stats().await.context("cannot read queue stats")?.iter().map(QueueView::from).collect()),
            Backend::Remote(server) => server.get(&["v1", "queues"], &[]).await.context("cannot read queue stats"),
        }
    }

    /// Stops deliveries from a queue.
    pub async fn pause(&self, queue: &QueueName, reason: Option<&str>) -> anyhow::Result<()> {
        match self {
            Backend::Local(store) => client(store)
                .pause_queue(queue, Operator { by: &local_sender(), reason })
                .await
                .map_err(|err| local_error(|| format!("cannot pause queue {queue}"), err)),
            Backend::Remote(server) => server
                .post::<QueueView, _>(&["v1", "queues", queue.as_str(), "pause"], Some(&reason_body(reason)))
                .await
                .map(drop)
                .with_context(|| format!("cannot pause queue {queue}")),
        }
    }

    /// Resumes deliveries from a queue.
    pub async fn resume(&self, queue: &QueueName, reason: Option<&str>) -> anyhow::Result<()> {
        match self {
            Backend::Local(store) => client(store)
                .resume_queue(queue, Operator { by: &local_sender(), reason })
                .await
                .map_err(|err| local_error(|| format!("cannot resume queue {queue}"), err)),
            Backend::Remote(server) => server
                .post::<QueueView, _>(&["v1", "queues", queue.as_str(), "resume"], Some(&reason_body(reason)))
                .await
                .map(drop)
                .with_context(|| format!("cannot resume queue {queue}")),
        }
    }

    /// A queue's dead letters, oldest first.
    pub async fn dead_letters(&self, queue: &QueueName, limit: u32) -> anyhow::Result<Vec<DeadLetterView>> {
        let context = || format!("cannot list the dead letters of queue {queue}");
        match self {
            Backend::Local(store) => {
                Ok(store.dead_letters(queue, limit).await.with_context(context)?.iter().map(DeadLetterView::from).collect())
            }
            Backend::Remote(server) => {
                server.get(&["v1", "queues", queue.as_str(), "dead-letters"], &[("limit", limit.to_string())]).await.with_context(context)
            }
        }
    }

    /// Sends dead letters back to their queue; how many.
    pub async fn redrive(&self, queue: &QueueName, which: Redrive, reason: Option<&str>) -> anyhow::Result<u64> {
        let context = || format!("cannot redrive dead letters of queue {queue}");
        match self {
            Backend::Local(store) => client(store)
                .redrive_dead_letters(queue, which, Operator { by: &local_sender(), reason })
                .await
                .map_err(|err| local_error(context, err)),
            Backend::Remote(server) => {
                let segments: Vec<&str> = match &which {
                    Redrive::One(id) => vec!["v1", "queues", queue.as_str(), "dead-letters", id.as_str(), "redrive"],
                    Redrive::All => vec!["v1", "queues", queue.as_str(), "dead-letters", "redrive"],
                };
                Ok(server.post::<Count, _>(&segments, Some(&reason_body(reason))).await.with_context(context)?.1.count)
            }
        }
    }

    /// How many dead letters `filter` selects, and the first `shown` of
    /// them, oldest first (a redrive's dry run). On a local store only: the
    /// API has no filtered listing of dead letters.
    pub async fn matching_dead_letters(&self, filter: &DeadLetterFilter, shown: usize) -> anyhow::Result<(u64, Vec<DeadLetterView>)> {
        let context = || format!("cannot read the dead letters of queue {}", filter.queue);
        let Backend::Local(store) = self else {
            bail!("--dry-run of a filtered redrive reads the store: give --store (or ROTA_STORE) instead of --server");
        };
        let total = store.count_dead_letters(filter).await.with_context(context)?;
        let (mut first, mut after) = (Vec::new(), None);
        while first.len() < shown {
            let page = store.dead_letter_page(filter, after, rota_engine::batch::Config::default().page).await.with_context(context)?;
            first.extend(page.letters.iter().map(|(_, letter)| DeadLetterView::from(letter)));
            if page.end {
                break;
            }
            after = page.scanned_through;
        }
        first.truncate(shown);
        Ok((total, first))
    }

    /// Deletes a queue's dead letters; how many.
    pub async fn purge(&self, queue: &QueueName, reason: Option<&str>) -> anyhow::Result<u64> {
        let context = || format!("cannot purge dead letters of queue {queue}");
        match self {
            Backend::Local(store) => client(store)
                .purge_dead_letters(queue, Operator { by: &local_sender(), reason })
                .await
                .map_err(|err| local_error(context, err)),
            Backend::Remote(server) => Ok(server
                .post::<Count, _>(&["v1", "queues", queue.as_str(), "dead-letters", "purge"], Some(&reason_body(reason)))
                .await
                .with_context(context)?
                .1
                .count),
        }
    }

    /// Creates a schedule; whether this request created it (the same
    /// definition again creates nothing).
    pub async fn create_schedule(&self, request: &ScheduleRequest) -> anyhow::Result<(ScheduleView, bool)> {
        let asked = || format!("cannot create schedule {}", request.name);
        match self {
            Backend::Local(store) => {
                let new = request.to_new_schedule().map_err(|why| anyhow!(why))?;
                let (detail, created) = client(store).create_schedule(&new).await.map_err(|err| local_error(asked, err))?;
                Ok((ScheduleView::from(&detail), created))
            }
            Backend::Remote(server) => {
                let (status, view) =
                    server.post::<ScheduleView, _>(&["v1", "schedules"], Some(request)).await.map_err(|err| remote_error(asked, err))?;
                Ok((view, status == reqwest::StatusCode::CREATED))
            }
        }
    }

    /// Every schedule, by name, with its next fire time.
    pub async fn schedules(&self) -> anyhow::Result<Vec<ScheduleView>> {
        match self {
            Backend::Local(store) => {
                let schedules = client(store).schedules().await.map_err(|err| local_error(|| "cannot list schedules".to_owned(), err))?;
                Ok(schedules.iter().map(ScheduleView::from).collect())
            }
            Backend::Remote(server) => server.get(&["v1", "schedules"], &[]).await.context("cannot list schedules"),
        }
    }

    /// One schedule; "schedule NAME not found" when there is none.
    pub async fn schedule(&self, name: &ScheduleName) -> anyhow::Result<ScheduleView> {
        let asked = || format!("cannot read schedule {name}");
        match self {
            Backend::Local(store) => {
                let detail = client(store).schedule(name).await.map_err(|err| local_error(asked, err))?;
                Ok(ScheduleView::from(&detail))
            }
            Backend::Remote(server) => server.get(&["v1", "schedules", name.as_str()], &[]).await.map_err(|err| remote_error(asked, err)),
        }
    }

    /// Pauses a schedule; the schedule afterwards.
    pub async fn pause_schedule(&self, name: &ScheduleName, reason: Option<&str>) -> anyhow::Result<ScheduleView> {
        let asked = || format!("cannot pause schedule {name}");
        match self {
            Backend::Local(store) => Ok(ScheduleView::from(
                &client(store)
                    .pause_schedule(name, Operator { by: &local_sender(), reason })
                    .await
                    .map_err(|err| local_error(asked, err))?,
            )),
            Backend::Remote(server) => self.schedule_change(server, name, "pause", reason, asked).await,
        }
    }

    /// Resumes a schedule; the schedule afterwards.
    pub async fn resume_schedule(&self, name: &ScheduleName, reason: Option<&str>) -> anyhow::Result<ScheduleView> {
        let asked = || format!("cannot resume schedule {name}");
        match self {
            Backend::Local(store) => Ok(ScheduleView::from(
                &client(store)
                    .resume_schedule(name, Operator { by: &local_sender(), reason })
                    .await
                    .map_err(|err| local_error(asked, err))?,
            )),
            Backend::Remote(server) => self.schedule_change(server, name, "resume", reason, asked).await,
        }
    }

    /// `POST /v1/schedules/{name}/{verb}`; the schedule afterwards.
    async fn schedule_change(
        &self,
        server: &Server,
        name: &ScheduleName,
        verb: &str,
        reason: Option<&str>,
        asked: impl FnOnce() -> String,
    ) -> anyhow::Result<ScheduleView> {
        let (_, view) = server
            .post::<ScheduleView, _>(&["v1", "schedules", name.as_str(), verb], Some(&reason_body(reason)))
            .await
            .map_err(|err| remote_error(asked, err))?;
        Ok(view)
    }

    /// Fires a schedule now; the task it started.
    pub async fn trigger_schedule(&self, name: &ScheduleName, reason: Option<&str>) -> anyhow::Result<TaskView> {
        let asked = || format!("cannot trigger schedule {name}");
        match self {
            Backend::Local(store) => {
                let client = client(store);
                let submitted =
                    client.trigger_schedule(name, Operator { by: &local_sender(), reason }).await.map_err(|err| local_error(asked, err))?;
                let detail = client.task(&submitted.id).await.map_err(|err| local_error(asked, err))?;
                Ok(TaskView::from(&detail))
            }
            Backend::Remote(server) => {
                let (_, view) = server
                    .post::<TaskView, _>(&["v1", "schedules", name.as_str(), "trigger"], Some(&reason_body(reason)))
                    .await
                    .map_err(|err| remote_error(asked, err))?;
                Ok(view)
            }
        }
    }

    /// Deletes a schedule.
    pub async fn delete_schedule(&self, name: &ScheduleName, reason: Option<&str>) -> anyhow::Result<()> {
        let asked = || format!("cannot delete schedule {name}");
        match self {
            Backend::Local(store) => {
                client(store).delete_schedule(name, Operator { by: &local_sender(), reason }).await.map_err(|err| local_error(asked, err))
            }
            Backend::Remote(server) => {
                let query: Vec<(&str, String)> = reason.map(|reason| ("reason", reason.to_owned())).into_iter().collect();
                server.delete(&["v1", "schedules", name.as_str()], &query).await.map_err(|err| remote_error(asked, err))
            }
        }
    }
}

/// The body of an operator's action on no task: why, if given.
fn reason_body(reason: Option<&str>) -> OperatorRequest {
    OperatorRequest { reason: reason.map(str::to_owned) }
}

/// The query parameters of `filter`'s search conditions (tags, time
/// ranges, id prefix, parent), as `GET /v1/tasks` and `/v1/tasks/counts`
/// take them.
fn search_params(filter: &TaskFilter) -> Vec<(&'static str, String)> {
    let mut params: Vec<(&'static str, String)> = filter.tags.iter().map(|(key, value)| ("tag", format!("{key}={value}"))).collect();
    let times = [
        ("created_after", filter.created.from),
        ("created_before", filter.created.until),
        ("ended_after", filter.ended.from),
        ("ended_before", filter.ended.until),
    ];
    params.extend(times.into_iter().filter_map(|(name, at)| Some((name, output::rfc3339(at?)))));
    if let Some(prefix) = &filter.id_prefix {
        params.push(("id_prefix", prefix.clone()));
    }
    if let Some(parent) = &filter.parent {
        params.push(("parent", parent.to_string()));
    }
    params
}

impl Backend {
    /// Stores a batch of `action` on what `filter` selects.
    pub async fn create_batch(&self, action: BatchAction, filter: &BatchFilter, reason: Option<&str>) -> anyhow::Result<BatchView> {
        match self {
            Backend::Local(store) => {
                let batch = rota_engine::batch::create(&client(store), action, filter.clone(), &local_sender(), reason.map(str::to_owned))
                    .await
                    .map_err(|err| local_error(|| "cannot create the batch".to_owned(), err))?;
                Ok(BatchView::from(&batch))
            }
            Backend::Remote(server) => {
                let (filter, dead_letters) = match filter {
                    BatchFilter::Tasks(filter) => (BatchFilterView::from(filter), None),
                    BatchFilter::DeadLetters(filter) => (BatchFilterView::default(), Some(DeadLetterFilterView::from(filter))),
                };
                let body = BatchRequest { action: action.to_string(), filter, dead_letters, reason: reason.map(str::to_owned) };
                let (_, view) = server.post::<BatchView, _>(&["v1", "batches"], Some(&body)).await?;
                Ok(view)
            }
        }
    }

    /// A batch; "batch ID not found" when it does not exist.
    pub async fn batch(&self, id: &str) -> anyhow::Result<BatchView> {
        match self {
            Backend::Local(store) => {
                let batch = store.batch(id).await.with_context(|| format!("cannot read batch {id}"))?;
                batch.map(|b| BatchView::from(&b)).ok_or_else(|| anyhow!("batch {id} not found"))
            }
            Backend::Remote(server) => server.get(&["v1", "batches", id], &[]).await,
        }
    }

    /// The latest `limit` batches, newest first.
    pub async fn batches(&self, limit: u32) -> anyhow::Result<Vec<BatchView>> {
        match self {
            Backend::Local(store) => {
                let batches = store.batches(limit).await.context("cannot list batches")?;
                Ok(batches.iter().map(BatchView::from).collect())
            }
            Backend::Remote(server) => server.get(&["v1", "batches"], &[("limit", limit.to_string())]).await.context("cannot list batches"),
        }
    }

    /// Stops a batch; the batch afterwards.
    pub async fn stop_batch(&self, id: &str, reason: Option<&str>) -> anyhow::Result<BatchView> {
        match self {
            Backend::Local(store) => {
                let operator = Operator { by: &local_sender(), reason };
                let batch = rota_engine::batch::stop(&client(store), id, operator)
                    .await
                    .map_err(|err| local_error(|| format!("cannot stop batch {id}"), err))?;
                batch.map(|b| BatchView::from(&b)).ok_or_else(|| anyhow!("batch {id} not found"))
            }
            Backend::Remote(server) => {
                let (_, view) = server.post::<BatchView, _>(&["v1", "batches", id, "stop"], Some(&reason_body(reason))).await?;
                Ok(view)
            }
        }
    }
}

/// What `rota audit` lists.
pub struct AuditQuery {
    pub since: Option<Timestamp>,
    pub action: Option<AuditAction>,
    pub by: Option<String>,
    pub after: Option<AuditCursor>,
    pub limit: u32,
}

impl Backend {
    /// Operator actions, newest first.
    pub async fn audit(&self, query: &AuditQuery) -> anyhow::Result<Vec<AuditEntryView>> {
        let context = || "cannot list the audit log".to_owned();
        match self {
            Backend::Local(store) => {
                let filter =
                    AuditFilter { since: query.since, action: query.action, by: query.by.clone(), after: query.after, limit: query.limit };
                let entries = client(store).audit(&filter).await.map_err(|err| local_error(context, err))?;
                Ok(entries.iter().map(AuditEntryView::from).collect())
            }
            Backend::Remote(server) => {
                let mut params = vec![("limit", query.limit.to_string())];
                params.extend(query.since.map(|at| ("since", output::rfc3339(at))));
                params.extend(query.action.map(|action| ("action", action.as_str().to_owned())));
                params.extend(query.by.clone().map(|by| ("by", by)));
                params.extend(query.after.map(|cursor| ("after", cursor.to_string())));
                server.get(&["v1", "audit"], &params).await.with_context(context)
            }
        }
    }
}

/// A client of a local store, for the commands that run engine code here.
pub fn local_client(store: &SharedStore) -> Client {
    client(store)
}
