//! Where an operator command acts: the store itself (`--store`, through a
//! [`Client`] with no engine in this process) or a remote server's HTTP API
//! (`--server`). Both answer with the API's wire types ([`rota_api::wire`]),
//! built locally by the same conversions the server uses, so each command
//! has one code path after this and prints the same thing either way.
//!
//! Errors read the same on both sides where it matters to an operator: a
//! missing task is "task ID not found", a refused change names the task.
//! Known differences, kept because the API chose them: over HTTP a pause or
//! resume of a queue that does not exist is an error (locally it creates
//! the queue), and listings are bounded by the server's limit (1000 by
//! default).

use std::sync::Arc;

use anyhow::{Context, anyhow};
use rota_api::wire::{
    AlertView, BreakerView, Count, DeadLetterView, EventView, QueueView, TaskStateChange, TaskSummary, TaskView, WorkflowView,
};
use rota_engine::{Client, Submission, Workflows};
use rota_model::{QueueName, StepName, SystemClock, TaskId, TaskState, WorkflowName};
use rota_store::{Redrive, SharedStore, TaskFilter, TaskRecord};
use serde::Serialize;
use serde_json::Value;

use crate::remote::{self, Server};

/// The store, or a server's API.
pub enum Backend {
    /// The store named by `--store`.
    Local(SharedStore),
    /// The server named by `--server`.
    Remote(Server),
}

/// A task with its steps, and what only the store knows.
pub struct TaskDetail {
    /// The task, as the API shows it.
    pub view: TaskView,
    /// The queue its completion is reported to (local only: the API does not show it).
    pub reply_to: Option<String>,
}

/// The outcome of a submit.
pub struct Submitted {
    /// The task (the existing one when its id was taken).
    pub view: TaskView,
    /// Whether this submit created it.
    pub created: bool,
}

/// What `rota tasks` asks for.
pub struct TaskQuery {
    pub state: Option<TaskState>,
    pub workflow: Option<WorkflowName>,
    pub limit: u32,
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
}

fn client(store: &SharedStore) -> Client {
    Client::new(store.clone(), Arc::new(SystemClock), Workflows::new(store.clone()), None)
}

/// An engine error as an operator reads it: a missing record or a refused
/// request is its own message, without the variant's prefix.
fn engine_error(err: rota_engine::Error) -> anyhow::Error {
    match err {
        rota_engine::Error::Store(rota_store::Error::NotFound(what)) => anyhow!("{what}"),
        rota_engine::Error::Refused(why) => anyhow!("{why}"),
        other => anyhow::Error::new(other),
    }
}

async fn required(store: &SharedStore, id: &TaskId) -> anyhow::Result<TaskRecord> {
    store.task(id).await.with_context(|| format!("cannot read task {id}"))?.ok_or_else(|| anyhow!("task {id} not found"))
}

/// The view of a stored task, with its definition's agents (a task whose
/// definition is missing or unreadable is still shown).
async fn view(store: &SharedStore, record: &TaskRecord) -> TaskView {
    let task = &record.task;
    let definition = Workflows::new(store.clone()).get(&task.workflow, Some(task.workflow_version)).await.ok();
    TaskView::new(task, &record.steps, definition.as_deref())
}

/// "cannot ACTION task ID: why", from a refused (or failed) change; a
/// missing task is just "task ID not found".
fn refused(action: &str, id: &TaskId, err: anyhow::Error) -> anyhow::Error {
    if remote::code_of(&err) == Some("not_found") {
        return err;
    }
    let message = err.to_string();
    // The API prefixes its reasons with the request's name.
    let message = message.strip_prefix(&format!("{action}: ")).unwrap_or(&message);
    let message = message.strip_prefix(&format!("task {id}: ")).unwrap_or(message);
    anyhow!("cannot {action} task {id}: {message}")
}

impl Backend {
    /// Submits a task.
    pub async fn submit(
        &self,
        workflow: &WorkflowName,
        version: Option<u32>,
        input: Value,
        id: Option<TaskId>,
    ) -> anyhow::Result<Submitted> {
        match self {
            Backend::Local(store) => {
                let submission = Submission { workflow: workflow.clone(), version, input, id, reply_to: None };
                let submitted = client(store).submit(submission).await.map_err(engine_error)?;
                let record = required(store, &submitted.id).await?;
                Ok(Submitted { view: view(store, &record).await, created: submitted.created })
            }
            Backend::Remote(server) => {
                let body = SubmitBody { workflow: workflow.as_str(), version, input: &input, id: id.as_ref().map(TaskId::as_str) };
                let (status, view) = server.post::<TaskView, _>(&["v1", "tasks"], Some(&body)).await?;
                Ok(Submitted { view, created: status == reqwest::StatusCode::CREATED })
            }
        }
    }

    /// A task with its steps; "task ID not found" when it does not exist.
    pub async fn task(&self, id: &TaskId) -> anyhow::Result<TaskDetail> {
        match self {
            Backend::Local(store) => {
                let record = required(store, id).await?;
                Ok(TaskDetail { view: view(store, &record).await, reply_to: record.task.reply_to.clone() })
            }
            Backend::Remote(server) => Ok(TaskDetail { view: server.get(&["v1", "tasks", id.as_str()], &[]).await?, reply_to: None }),
        }
    }

    /// A task's events, oldest first.
    pub async fn history(&self, id: &TaskId) -> anyhow::Result<Vec<EventView>> {
        match self {
            Backend::Local(store) => {
                let events = store.history(id).await.with_context(|| format!("cannot read the history of task {id}"))?;
                Ok(events.iter().map(EventView::from).collect())
            }
            Backend::Remote(server) => server.get(&["v1", "tasks", id.as_str(), "history"], &[]).await,
        }
    }

    /// Every circuit breaker the `rota serve` processes reported.
    pub async fn breakers(&self) -> anyhow::Result<Vec<BreakerView>> {
        match self {
            Backend::Local(store) => {
                let statuses = rota_engine::status::breakers(store).await.context("cannot read the circuit breakers")?;
                Ok(statuses.iter().map(BreakerView::from).collect())
            }
            Backend::Remote(server) => server.get(&["v1", "breakers"], &[]).await,
        }
    }

    /// Tasks, newest first.
    pub async fn tasks(&self, query: TaskQuery) -> anyhow::Result<Vec<TaskSummary>> {
        match self {
            Backend::Local(store) => {
                let filter = TaskFilter { state: query.state, workflow: query.workflow, limit: query.limit, ..TaskFilter::default() };
                let tasks = store.list_tasks(&filter).await.context("cannot list tasks")?;
                Ok(tasks.iter().map(TaskSummary::from).collect())
            }
            Backend::Remote(server) => {
                let mut params = vec![("limit", query.limit.to_string())];
                if let Some(state) = query.state {
                    params.push(("state", state.as_str().to_owned()));
                }
                if let Some(workflow) = query.workflow {
                    params.push(("workflow", workflow.to_string()));
                }
                server.get(&["v1", "tasks"], &params).await.context("cannot list tasks")
            }
        }
    }

    /// Operator alerts, newest first.
    pub async fn alerts(&self, limit: u32) -> anyhow::Result<Vec<AlertView>> {
        match self {
            Backend::Local(store) => {
                let alerts = store.alerts(limit).await.context("cannot list alerts")?;
                Ok(alerts.iter().map(AlertView::from).collect())
            }
            Backend::Remote(server) => server.get(&["v1", "alerts"], &[("limit", limit.to_string())]).await.context("cannot list alerts"),
        }
    }

    /// Resubmits a task in Error (or one of its steps); the task afterwards.
    pub async fn resubmit(&self, id: &TaskId, step: Option<&StepName>) -> anyhow::Result<TaskView> {
        match self {
            Backend::Local(store) => {
                let record = required(store, id).await?;
                if let Some(step) = step
                    && !record.steps.iter().any(|s| &s.name == step)
                {
                    let names: Vec<&str> = record.steps.iter().map(|s| s.name.as_str()).collect();
                    anyhow::bail!("task {id} has no step {step} (its steps: {})", names.join(", "));
                }
                client(store).resubmit(id, step).await.map_err(|err| refused("resubmit", id, engine_error(err)))?;
                let record = required(store, id).await?;
                Ok(view(store, &record).await)
            }
            Backend::Remote(server) => {
                let segments: Vec<&str> = match step {
                    Some(step) => vec!["v1", "tasks", id.as_str(), "steps", step.as_str(), "resubmit"],
                    None => vec!["v1", "tasks", id.as_str(), "resubmit"],
                };
                let (_, view) = server.post::<TaskView, ()>(&segments, None).await.map_err(|err| refused("resubmit", id, err))?;
                Ok(view)
            }
        }
    }

    /// Cancels a task; the state it moved to.
    pub async fn cancel(&self, id: &TaskId) -> anyhow::Result<TaskState> {
        match self {
            Backend::Local(store) => {
                required(store, id).await?;
                client(store).cancel(id).await.map_err(|err| refused("cancel", id, engine_error(err)))
            }
            Backend::Remote(server) => {
                let (_, change) = server
                    .post::<TaskStateChange, ()>(&["v1", "tasks", id.as_str(), "cancel"], None)
                    .await
                    .map_err(|err| refused("cancel", id, err))?;
                Ok(crate::tasks::task_state(change.state))
            }
        }
    }

    /// The latest version of each registered workflow.
    pub async fn workflows(&self) -> anyhow::Result<Vec<WorkflowView>> {
        match self {
            Backend::Local(store) => {
                let entries = store.workflows().await.context("cannot list workflows")?;
                entries
                    .iter()
                    .map(|entry| {
                        WorkflowView::from_entry(entry).ok_or_else(|| {
                            anyhow!("the stored definition of workflow {} version {} is unreadable", entry.name, entry.version)
                        })
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
    pub async fn pause(&self, queue: &QueueName) -> anyhow::Result<()> {
        match self {
            Backend::Local(store) => store.pause(queue).await.with_context(|| format!("cannot pause queue {queue}")),
            Backend::Remote(server) => server
                .post::<QueueView, ()>(&["v1", "queues", queue.as_str(), "pause"], None)
                .await
                .map(drop)
                .with_context(|| format!("cannot pause queue {queue}")),
        }
    }

    /// Resumes deliveries from a queue.
    pub async fn resume(&self, queue: &QueueName) -> anyhow::Result<()> {
        match self {
            Backend::Local(store) => store.resume(queue).await.with_context(|| format!("cannot resume queue {queue}")),
            Backend::Remote(server) => server
                .post::<QueueView, ()>(&["v1", "queues", queue.as_str(), "resume"], None)
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
    pub async fn redrive(&self, queue: &QueueName, which: Redrive) -> anyhow::Result<u64> {
        let context = || format!("cannot redrive dead letters of queue {queue}");
        match self {
            Backend::Local(store) => store.redrive(queue, which).await.with_context(context),
            Backend::Remote(server) => {
                let segments: Vec<&str> = match &which {
                    Redrive::One(id) => vec!["v1", "queues", queue.as_str(), "dead-letters", id.as_str(), "redrive"],
                    Redrive::All => vec!["v1", "queues", queue.as_str(), "dead-letters", "redrive"],
                };
                Ok(server.post::<Count, ()>(&segments, None).await.with_context(context)?.1.count)
            }
        }
    }

    /// Deletes a queue's dead letters; how many.
    pub async fn purge(&self, queue: &QueueName) -> anyhow::Result<u64> {
        let context = || format!("cannot purge dead letters of queue {queue}");
        match self {
            Backend::Local(store) => store.purge_dead_letters(queue).await.with_context(context),
            Backend::Remote(server) => Ok(server
                .post::<Count, ()>(&["v1", "queues", queue.as_str(), "dead-letters", "purge"], None)
                .await
                .with_context(context)?
                .1
                .count),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_action_and_the_task_once() {
        let id = TaskId::new("t-1").unwrap();
        let err = refused("cancel", &id, anyhow!("cancel: task t-1: is already processed"));
        assert_eq!(err.to_string(), "cannot cancel task t-1: is already processed");
        let err = refused("cancel", &id, anyhow!("task t-1: is already processed"));
        assert_eq!(err.to_string(), "cannot cancel task t-1: is already processed");
    }
}
