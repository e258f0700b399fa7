//! Signals: outside events (a person's approval, a provider's webhook, an
//! operator) sent to a task by name, completing the step that waits for
//! that name with the signal's data as its output.
//!
//! A signal is recorded in the waiting step's row, so it is as durable and
//! as fenced as any step change:
//! - sent while the step waits (Running), it completes the step in the
//!   signal's own commit and wakes the task's holder (a `Signalled` message
//!   in its inbox) to move the task on;
//! - sent before the task reaches the step (NotStarted), or after the
//!   wait's timeout passed, it is kept in the step's `input`, and the step
//!   completes with it as soon as it starts (again).
//!
//! Either way the commit is a compare-and-set on the task's state and lease
//! epoch (which it bumps) and on the step's state and attempt, like an
//! operator's cancel: a Scheduler deciding on the task at the same moment
//! loses its commit and decides again on a fresh read that sees the signal,
//! so a signal racing the step's start is never dropped. A signal that no
//! step can take (the task is unknown or finished, no step waits for that
//! name, or the step already has its signal) is refused and writes nothing.

use rota_model::{SignalName, Step, StepState, Task, TaskId, TaskState};
use rota_store::{Changes, Event, EventKind, Outgoing, StepWrite, TaskRecord, TaskWrite};
use serde_json::{Value, json};

use crate::client::Client;
use crate::ops::{Error, Result};
use crate::protocol::{self, InboxEnvelope, InboxMessage};

/// The largest signal data accepted, in bytes of JSON: a signal is a
/// decision or a provider's notification, not a document, and it is kept
/// twice (the step's input and output).
pub const DATA_BYTES_MAX: usize = 256 * 1024;

/// Why a signal was refused. Each text is what the sender reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No step of the task's workflow waits for a signal of that name.
    #[error("no step of task {task} (workflow {workflow}) waits for it ({})", awaited_list(.awaited))]
    NotAwaited {
        /// The task.
        task: TaskId,
        /// Its workflow, with the version it runs.
        workflow: String,
        /// The signals its steps wait for.
        awaited: Vec<SignalName>,
    },
    /// The task has finished.
    #[error("task {task} is {state}: it takes no more signals")]
    Finished {
        /// The task.
        task: TaskId,
        /// Its final state.
        state: &'static str,
    },
    /// The task is being undone: no step will run again.
    #[error("task {task} is being undone (compensating): it takes no more signals")]
    Undoing {
        /// The task.
        task: TaskId,
    },
    /// The step already received this signal (before it started, or it
    /// completed with it).
    #[error("step {step} of task {task} has already received it")]
    AlreadyReceived {
        /// The task.
        task: TaskId,
        /// The step.
        step: String,
    },
    /// The step that waits for it has failed; resubmit the task first.
    #[error("step {step} of task {task}, which waits for it, has failed")]
    StepFailed {
        /// The task.
        task: TaskId,
        /// The step.
        step: String,
    },
    /// The step that waits for it was skipped (its `when` condition was
    /// false): it will never wait.
    #[error("step {step} of task {task}, which waits for it, was skipped: its `when` condition was false")]
    StepSkipped {
        /// The task.
        task: TaskId,
        /// The step.
        step: String,
    },
    /// The data is larger than [`DATA_BYTES_MAX`].
    #[error("its data is {bytes} bytes of JSON, more than the {max} accepted")]
    TooLarge {
        /// The data's size.
        bytes: usize,
        /// The bound.
        max: usize,
    },
}

impl Refusal {
    /// Whether the refusal is about the request itself (a signal no step
    /// waits for, or too large) rather than the task's current state.
    pub fn is_invalid_request(&self) -> bool {
        matches!(self, Refusal::NotAwaited { .. } | Refusal::TooLarge { .. })
    }
}

fn awaited_list(awaited: &[SignalName]) -> String {
    if awaited.is_empty() {
        return "it waits for no signal".into();
    }
    let names: Vec<&str> = awaited.iter().map(SignalName::as_str).collect();
    format!("it waits for: {}", names.join(", "))
}

/// What a signal did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// The step it went to.
    pub step: rota_model::StepName,
    /// Whether it completed the step now (the step was waiting), or is kept
    /// until the task reaches the step.
    pub completed: bool,
}

/// The data of the signal a waiting step received, if it did. The step's
/// `input` holds the signal as recorded by `received_input`.
pub fn received(step: &Step) -> Option<&Value> {
    let input = step.input.as_ref()?.as_object()?;
    input.get("signal")?;
    input.get("data")
}

/// A signal as kept in its step's `input`: its name, data, sender and
/// arrival time.
fn received_input(signal: &SignalName, data: Value, sent_by: &str, at: rota_model::Timestamp) -> Value {
    json!({ "signal": signal.as_str(), "data": data, "sent_by": sent_by, "sent_at": at.as_millis() })
}

impl Client {
    /// Sends the signal `signal` with `data` to task `id`, on behalf of
    /// `sent_by` (who, as the history will show it).
    pub async fn signal(&self, id: &TaskId, signal: &SignalName, data: Value, sent_by: &str) -> Result<Delivered> {
        let bytes = serde_json::to_vec(&data).map_or(usize::MAX, |encoded| encoded.len());
        if bytes > DATA_BYTES_MAX {
            return Err(Error::Signal { signal: signal.clone(), why: Refusal::TooLarge { bytes, max: DATA_BYTES_MAX } });
        }
        self.retrying(|| self.try_signal(id, signal, &data, sent_by)).await
    }

    async fn try_signal(&self, id: &TaskId, signal: &SignalName, data: &Value, sent_by: &str) -> Result<Delivered> {
        let refuse = |why| Error::Signal { signal: signal.clone(), why };
        let record = self.record(id).await?;
        let TaskRecord { task, steps } = &record;
        let workflow = self.workflows.get(&task.workflow, Some(task.workflow_version)).await?;
        let Some(def) = workflow.step_waiting_for(signal) else {
            let awaited = workflow.steps().iter().filter_map(|s| s.waits_for().cloned()).collect();
            let workflow = protocol::workflow_label(&task.workflow, task.workflow_version);
            return Err(refuse(Refusal::NotAwaited { task: id.clone(), workflow, awaited }));
        };
        match task.state {
            TaskState::Pending | TaskState::Processing => {}
            TaskState::Compensating => return Err(refuse(Refusal::Undoing { task: id.clone() })),
            state => return Err(refuse(Refusal::Finished { task: id.clone(), state: state.as_str() })),
        }
        let Some(step) = steps.iter().find(|s| &s.name == def.name()) else {
            return Err(Error::Engine(crate::Error::Workflow(format!("task {id} has no row for its step {}", def.name()))));
        };
        let step_name = step.name.to_string();
        if received(step).is_some() || step.state == StepState::Completed {
            return Err(refuse(Refusal::AlreadyReceived { task: id.clone(), step: step_name }));
        }
        let now = self.clock.now();
        let mut changes = Changes::default();
        let mut next = step.clone();
        next.input = Some(received_input(signal, data.clone(), sent_by, now));
        next.updated_at = now;
        let completed = match step.state {
            // Its timeout has passed and is about to be counted: the signal
            // is kept for the step's next attempt, if the task gets one.
            StepState::Running if step.complete_by.is_some_and(|at| at <= now) => false,
            StepState::Running => {
                next = next.complete(step.attempt, data.clone(), now).map_err(|why| Error::Refused {
                    action: crate::ops::Action::Signal,
                    refusal: crate::ops::Refusal::Step { task: id.clone(), step: step.name.clone(), why },
                })?;
                true
            }
            // Not reached yet, or waiting out the backoff after a timeout:
            // kept until the step starts.
            StepState::NotStarted => false,
            StepState::Failed => return Err(refuse(Refusal::StepFailed { task: id.clone(), step: step_name })),
            StepState::Skipped => return Err(refuse(Refusal::StepSkipped { task: id.clone(), step: step_name })),
            StepState::Completed | StepState::Compensating | StepState::Compensated => {
                return Err(refuse(Refusal::AlreadyReceived { task: id.clone(), step: step_name }));
            }
        };
        let detail = json!({ "signal": signal.as_str(), "sent_by": sent_by, "bytes": serde_json::to_vec(data).map_or(0, |d| d.len()), "completed": completed });
        changes.events.push(Event::step(&next, now, EventKind::Signal, detail));
        if completed {
            changes.events.push(Event::step(&next, now, EventKind::StepCompleted, json!({ "signal": signal.as_str() })));
            if let Some(holder) = &task.locked_by {
                let wake = InboxEnvelope::traced(InboxMessage::Signalled { task_id: id.clone(), step: step.name.clone() });
                let outgoing = Outgoing::json(&wake).expect("inbox messages serialize").with_ordering_key(id.as_str());
                changes.send.push((protocol::inbox(holder), outgoing));
            }
        }
        changes.steps.push(StepWrite::replacing(step, next.clone()));
        changes.tasks.push(TaskWrite::replacing(task, moved(task, now)));
        crate::replies::commit(&self.store, changes).await?;
        Ok(Delivered { step: next.name, completed })
    }
}

/// The task as the signal's commit leaves it: unchanged but for its version
/// (the lease epoch), so that a decision its holder took on the earlier
/// record fails its commit and is taken again on one that has the signal.
pub(crate) fn moved(task: &Task, now: rota_model::Timestamp) -> Task {
    let mut next = task.clone();
    next.lease_epoch += 1;
    next.updated_at = now;
    next
}
