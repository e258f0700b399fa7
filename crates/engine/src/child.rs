//! Child workflows: a `workflow: NAME` step runs a task of another
//! workflow (its child) and completes with the child's output.
//!
//! How it holds together, with no Scheduler slot held and no polling:
//! * The commit that records the step's attempt as running sends
//!   `StartChild` to the Scheduler's own inbox (the step's rendered `with`,
//!   the child's input, is kept in the step's row). Handling it creates the
//!   child, whose id is derived from the parent, the step and the attempt
//!   ([`child_task_id`]): a second `StartChild` for the same attempt (a
//!   redelivery, or a Scheduler taking the parent over, which asks again
//!   rather than starting a new attempt) finds the child instead of making
//!   another. The child records its parent, step, attempt and depth
//!   ([`rota_model::ParentLink`]).
//! * The commit that ends the child (Processed, Error, Compensated,
//!   Cancelled) sends [`ChildEnded`] to `rota.children`
//!   (`replies::commit` adds it, as it adds status messages), so the
//!   wakeup is lost only if the end is. Any Scheduler takes it and hands the
//!   parent's holder the outcome as the reply of the step's attempt
//!   ([`deliver`]): the output for Processed, a transient failure
//!   otherwise, which the workflow's `max_failures` retries as a new
//!   attempt, with a new child. A parent nobody holds gets it when it is
//!   claimed again: the claim asks for the child again and finds it ended.
//! * A child whose parent no longer waits for it (the parent cancelled,
//!   compensating or ended; its step timed out or moved to another
//!   attempt) is cancelled by the Supervisor leader ([`cancel_stale`],
//!   from `Tasks::stale_children`), which compensates it when its own
//!   workflow says so.
//! * A child deeper than the Scheduler's `child_depth_max`, or of a
//!   workflow that is not registered, is not created: the step fails for
//!   good with a reason that says why.

use rota_model::ids::ID_BYTES_MAX;
use rota_model::{ParentLink, StepName, StepState, TaskId, TaskState};
use rota_store::{Created, Error as StoreError, Outgoing, SharedStore};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::client::{Client, Submission};
use crate::pause::Operator;
use crate::protocol::{self, ChildEnded, InboxEnvelope, InboxMessage, Reply, ReplyOutcome};
use crate::{Error, Result};

/// The default of the Scheduler's `child_depth_max`: how many levels of
/// child workflows may run below a top-level task.
pub const CHILD_DEPTH_MAX_DEFAULT: u32 = 8;

/// The highest `child_depth_max` a configuration may give.
pub const CHILD_DEPTH_MAX_LIMIT: u32 = 100;

/// Who the history names as cancelling a child its parent left.
pub const CANCELLED_BY: &str = "rota";

/// The id of the child that attempt `attempt` of `workflow:` step `step`
/// of task `parent` starts: `PARENT/STEP#ATTEMPT`, or, when that is longer
/// than an id may be, `child-` and the SHA-256 of it in hex.
pub fn child_task_id(parent: &TaskId, step: &StepName, attempt: u32) -> TaskId {
    let plain = format!("{parent}/{step}#{attempt}");
    if plain.len() <= ID_BYTES_MAX {
        return TaskId::new(plain).expect("built from valid ids and within the bound");
    }
    let digest = Sha256::digest(plain.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    TaskId::new(format!("child-{hex}")).expect("a digest is a valid task id")
}

/// What handling a `StartChild` did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Started {
    /// The child was created now.
    Created(TaskId),
    /// It exists and runs.
    Running(TaskId),
    /// It exists and has ended: its end is to be delivered again.
    Ended(ChildEnded),
    /// The step's attempt is no longer running: nothing to start.
    Moved(String),
    /// The child cannot start (too deep, or its workflow cannot be used):
    /// the step fails for good with this reason.
    Refused(String),
}

/// Creates (or finds) the child of attempt `attempt` of `workflow:` step
/// `step` of task `id`, if that attempt still runs.
pub(crate) async fn start(client: &Client, id: &TaskId, step: &StepName, attempt: u32, depth_max: u32) -> Result<Started> {
    let Some(record) = client.store.task(id).await? else { return Ok(Started::Moved(format!("task {id} does not exist"))) };
    let task = &record.task;
    let Some(row) = record.steps.iter().find(|s| &s.name == step) else {
        return Ok(Started::Moved(format!("task {id} has no step {step}")));
    };
    if !matches!(task.state, TaskState::Pending | TaskState::Processing) || row.state != StepState::Running || row.attempt != attempt {
        return Ok(Started::Moved(format!("step {step} of task {id} no longer runs attempt {attempt}")));
    }
    let workflow = client.workflows.get(&task.workflow, Some(task.workflow_version)).await?;
    let Some(child) = workflow.step(step).and_then(|def| def.child()) else {
        return Ok(Started::Moved(format!("step {step} of task {id} runs no child workflow")));
    };
    let depth = task.parent.as_ref().map_or(0, |p| p.depth) + 1;
    if depth > depth_max {
        return Ok(Started::Refused(format!(
            "child workflow `{}` not started: it would run {depth} levels below its top-level task, more than child_depth_max ({depth_max}); \
             does a workflow start itself?",
            child.name()
        )));
    }
    let child_id = child_task_id(id, step, attempt);
    let mut submission = Submission::new(child.name().clone(), row.input.clone().unwrap_or(Value::Null)).with_id(child_id.clone());
    submission.version = child.version();
    // A caller confined to its own tasks sees its task's children too.
    submission.submitter = task.submitter.clone();
    submission.parent = Some(ParentLink { task: id.clone(), step: step.clone(), attempt, depth });
    let new = match client.prepare(submission).await {
        Ok(new) => new,
        Err(Error::Store(err)) if !matches!(err, StoreError::NotFound(_)) => return Err(Error::Store(err)),
        Err(err) => {
            let version = child.version().map_or_else(String::new, |v| format!(" version {v}"));
            return Ok(Started::Refused(format!("child workflow `{}`{version} cannot start: {err}", child.name())));
        }
    };
    match client.store.create_task(new).await? {
        Created::New => Ok(Started::Created(child_id)),
        Created::Existing(existing) if existing.task.state.is_terminal() => {
            Ok(Started::Ended(ChildEnded { child: child_id, parent: id.clone(), step: step.clone(), attempt }))
        }
        Created::Existing(_) => Ok(Started::Running(child_id)),
    }
}

/// The reply that fails attempt `attempt` of `step` of task `id` for good
/// with `error` (a child that cannot start).
pub(crate) fn refusal(id: &TaskId, step: &StepName, attempt: u32, error: String) -> Reply {
    Reply { task_id: id.clone(), step: step.clone(), attempt, compensate: false, outcome: ReplyOutcome::Failed { error, retryable: false } }
}

/// What delivering a child's end did.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivered {
    /// The outcome went to the parent's holder as the attempt's reply.
    Replied(ReplyOutcome),
    /// Nothing to deliver: the parent's step moved on, or nobody holds the
    /// parent (its next holder asks for the child again and finds it ended).
    Skipped(String),
}

/// Hands the parent's holder the outcome of `ended`'s child as the reply of
/// the step's attempt: its output when it was Processed, a transient
/// failure naming its state and error otherwise. Sent again (a redelivery)
/// it changes nothing: the attempt takes one reply.
pub async fn deliver(store: &SharedStore, ended: &ChildEnded) -> Result<Delivered> {
    let ChildEnded { child, parent, step, attempt } = ended;
    let Some(record) = store.task(parent).await? else { return Ok(Delivered::Skipped(format!("parent {parent} does not exist"))) };
    let waits = record.steps.iter().any(|s| &s.name == step && s.state == StepState::Running && s.attempt == *attempt);
    if !matches!(record.task.state, TaskState::Pending | TaskState::Processing) || !waits {
        return Ok(Delivered::Skipped(format!("step {step} of task {parent} no longer waits for child {child}")));
    }
    let Some(holder) = &record.task.locked_by else {
        return Ok(Delivered::Skipped(format!("nobody holds task {parent}: its next claim finds child {child} ended")));
    };
    let outcome = match store.task(child).await? {
        None => ReplyOutcome::Failed { error: format!("child workflow task {child} does not exist"), retryable: true },
        Some(found) => match found.task.state {
            TaskState::Processed => ReplyOutcome::Succeeded { output: found.task.output.unwrap_or(Value::Null) },
            state if state.is_terminal() => {
                let why = found.task.error.map_or_else(String::new, |e| format!(": {e}"));
                ReplyOutcome::Failed { error: format!("child workflow task {child} ended {}{why}", state.as_str()), retryable: true }
            }
            // Resubmitted since: its next end is delivered then.
            state => return Ok(Delivered::Skipped(format!("child {child} is {} again", state.as_str()))),
        },
    };
    let mut reply = Reply { task_id: parent.clone(), step: step.clone(), attempt: *attempt, compensate: false, outcome };
    let mut message = reply_message(&reply);
    let bytes = message.body.get().len();
    if bytes > rota_store::BODY_BYTES_MAX {
        let error = format!(
            "the output of child workflow task {child} is {bytes} bytes of JSON, over the limit of {} bytes of a message; \
             pass large data by reference (a URL, a key)",
            rota_store::BODY_BYTES_MAX
        );
        reply.outcome = ReplyOutcome::Failed { error, retryable: false };
        message = reply_message(&reply);
    }
    store.send(&protocol::inbox(holder), message).await?;
    Ok(Delivered::Replied(reply.outcome))
}

fn reply_message(reply: &Reply) -> Outgoing {
    let envelope = InboxEnvelope::traced(InboxMessage::Reply(reply.clone()));
    Outgoing::json(&envelope).expect("inbox messages serialize").with_ordering_key(reply.task_id.as_str())
}

/// Cancels up to `limit` children whose parent no longer waits for them
/// (`Tasks::stale_children`), each compensated when its workflow says so,
/// with a `cancelled` event naming the reason. Returns how many were
/// cancelled.
pub async fn cancel_stale(client: &Client, limit: u32) -> Result<u32> {
    let mut cancelled = 0;
    for id in client.store.stale_children(limit).await? {
        let reason = "its parent no longer waits for it (cancelled, undone, ended, or its step timed out or moved on)";
        match client.cancel(&id, Operator { by: CANCELLED_BY, reason: Some(reason) }).await {
            Ok(_) => cancelled += 1,
            // It ended or moved meanwhile: nothing to do.
            Err(err) => tracing::debug!("cancelling child {id}: {err}"),
        }
    }
    Ok(cancelled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_id_names_its_parent_step_and_attempt_or_a_digest_when_too_long() {
        let step = StepName::new("ship").unwrap();
        assert_eq!(child_task_id(&TaskId::new("order-1").unwrap(), &step, 2).as_str(), "order-1/ship#2");
        let long = TaskId::new("x".repeat(ID_BYTES_MAX)).unwrap();
        let id = child_task_id(&long, &step, 1);
        assert!(id.as_str().starts_with("child-") && id.as_str().len() == "child-".len() + 64, "{id}");
        assert_eq!(id, child_task_id(&long, &step, 1), "derived, so the same every time");
        assert_ne!(id, child_task_id(&long, &step, 2), "another attempt, another child");
    }
}
