//! The task lifecycle: one run of a workflow (one order, in the pattern's
//! example), its lease (`locked_by`, `complete_by`) and its failure count.
//!
//! ```text
//!            claim                 finish_processed
//!  Pending ─────────► Processing ─────────────────► Processed
//!    ▲  ▲                │  │ fail (permanent error)
//!    │  └── expire ◄─────┘  ├───────────────────────► Error ──resubmit──► Pending
//!    │    (below max)       └─► Compensating ──finish_compensated──► Compensated
//!    └──── release (shutdown)      (claim / expire as for Processing)
//!  any non-terminal ──cancel──► Cancelled (or Compensating when there is work to undo)
//! ```
//!
//! Beside the state, a task may be *paused* by an operator ([`Task::pause`],
//! [`Task::resume`]): a paused task is not claimed, and its holder starts
//! no new step (the steps in flight finish and are recorded) and gives it
//! back once nothing is in flight. Pausing changes no state; it only holds
//! the task's own moves until it is resumed.
//!
//! Every move is a pure function from the current record and `now` to the
//! next record. Moves made by a lease holder take a [`TaskFence`]: when the
//! lease has since been taken by someone else (or rescued by the Supervisor),
//! the move is refused with [`TransitionError::LeaseLost`].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::Timestamp;
use crate::concurrency::ConcurrencyKey;
use crate::ids::{InstanceId, QueueName, StepName, TaskId, WorkflowName};
use crate::priority::Priority;
use crate::tags::Tags;

/// Where a task is in its lifecycle. The doc comment of each state says who
/// moves a task out of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Created or reset, waiting for a Scheduler to claim it once `not_before`
    /// has passed. Moved out by a Scheduler's claim, or by cancel.
    Pending,
    /// Claimed by the Scheduler named in `locked_by` until `complete_by`. The
    /// holder moves it on; if the holder dies, it stays here until the
    /// Supervisor finds `complete_by` passed and expires it.
    Processing,
    /// Every step completed. Terminal.
    Processed,
    /// Failed for good: a permanent error, or the Supervisor's failure
    /// threshold was reached. An operator alert was raised. Terminal; only an
    /// operator's resubmit moves it back to Pending.
    Error,
    /// Undoing completed steps. Without `locked_by` it waits for a Scheduler
    /// to claim it; with one it is leased just like Processing and expired by
    /// the Supervisor the same way.
    Compensating,
    /// Every completed step was compensated. Terminal.
    Compensated,
    /// Cancelled by an operator with nothing to undo. Terminal.
    Cancelled,
}

impl TaskState {
    /// Every state, in lifecycle order.
    pub const ALL: [TaskState; 7] = [
        TaskState::Pending,
        TaskState::Processing,
        TaskState::Processed,
        TaskState::Error,
        TaskState::Compensating,
        TaskState::Compensated,
        TaskState::Cancelled,
    ];

    /// Whether no further move happens without an operator.
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskState::Processed | TaskState::Error | TaskState::Compensated | TaskState::Cancelled)
    }

    /// The state's name as stored and shown (`pending`, `processing`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Processing => "processing",
            TaskState::Processed => "processed",
            TaskState::Error => "error",
            TaskState::Compensating => "compensating",
            TaskState::Compensated => "compensated",
            TaskState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        TaskState::ALL.into_iter().find(|state| state.as_str().eq_ignore_ascii_case(s)).ok_or_else(|| {
            format!(
                "unknown task state {s:?} (expected one of pending, processing, processed, error, compensating, compensated, cancelled)"
            )
        })
    }
}

/// What the Supervisor asks for when a task reaches its failure threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExhaustedPolicy {
    /// Set Error and alert an operator.
    #[default]
    Error,
    /// Undo the completed steps (the compensating transaction).
    Compensate,
}

/// The proof of holding a task's lease: the epoch it was claimed at. Each
/// claim bumps the epoch, so a fence from an earlier claim never matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskFence {
    /// The lease epoch at claim time.
    pub epoch: u64,
}

/// Why a move was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The record is terminal and the move is not an operator's resubmit.
    #[error("{record} is {state}, which is terminal")]
    Terminal {
        /// What record ("task", "step").
        record: &'static str,
        /// Its state.
        state: &'static str,
    },
    /// The move does not apply to the current state.
    #[error("cannot {action} a {record} that is {state}")]
    NotAllowed {
        /// What record ("task", "step").
        record: &'static str,
        /// The refused move.
        action: &'static str,
        /// The record's state.
        state: &'static str,
    },
    /// The caller's lease or attempt is no longer the current one: someone
    /// else claimed the record since, or the Supervisor rescued it. Losing a
    /// race is an outcome, not a bug: the caller drops its work.
    #[error("{record} lease lost: held {held}, current {current}")]
    LeaseLost {
        /// What record ("task", "step").
        record: &'static str,
        /// The epoch or attempt the caller holds.
        held: u64,
        /// The record's current epoch or attempt.
        current: u64,
    },
    /// The move is not due yet (a backoff wait, or a deadline that has not passed).
    #[error("{record} is not due until {until}")]
    NotDue {
        /// What record ("task", "step").
        record: &'static str,
        /// When it becomes due.
        until: Timestamp,
    },
}

/// Where a child workflow's task comes from: the parent task, the step
/// (a `workflow:` step) and the attempt of that step that started it, and
/// how deep it is in its chain of parents (a top-level task's child is 1).
/// The parent's step waits for this attempt's child only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentLink {
    /// The parent task.
    pub task: TaskId,
    /// Its step that started the child.
    pub step: StepName,
    /// That step's attempt.
    pub attempt: u32,
    /// How many parents are above the child (1: its parent is a top-level task).
    pub depth: u32,
}

/// One run of a workflow, as the state store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// The task id (client-suppliable; the submission's idempotency key).
    pub id: TaskId,
    /// The workflow definition's name.
    pub workflow: WorkflowName,
    /// The definition's version this task started with and keeps.
    pub workflow_version: u32,
    /// The submitted input.
    pub input: Value,
    /// Where it is in its lifecycle.
    pub state: TaskState,
    /// The instance holding the lease (the pattern's `LockedBy`).
    pub locked_by: Option<InstanceId>,
    /// Bumped by every claim; fences out earlier holders.
    pub lease_epoch: u64,
    /// When the holder's time runs out (the pattern's `CompleteBy`).
    pub complete_by: Option<Timestamp>,
    /// When the current lease is at risk (the workflow's `warn_after` past
    /// the claim), if the workflow has a warning point: set by the holder's
    /// first decision, before `complete_by`, and cleared with the lease.
    #[serde(default)]
    pub warn_at: Option<Timestamp>,
    /// When the Supervisor first raised a warning (the task's own or one of
    /// its steps') during the current lease. Only the store's warning writes
    /// it; a holder's writes leave it alone, except that a write ending the
    /// lease clears it, as [`Task`]'s moves do.
    #[serde(default)]
    pub at_risk_since: Option<Timestamp>,
    /// The earliest time a Scheduler may claim it (the Supervisor's backoff).
    pub not_before: Timestamp,
    /// How many times its deadline passed (the pattern's `FailureCount`).
    pub failure_count: u32,
    /// The URL the submitting application wants status events posted to
    /// (the API's `callback_url`, served by the webhook dispatcher).
    pub reply_to: Option<String>,
    /// The durable queue the submitting application reads status events
    /// from (the response queue): every status event of the task is sent
    /// there, in the commit that records it. Set at submission, never changed.
    #[serde(default)]
    pub reply_queue: Option<QueueName>,
    /// Who submitted it, as the API names its caller (a token's name or
    /// fingerprint), when known. A caller that may only see its own tasks
    /// (the API's `submit` scope) sees the tasks with its name here. Set at
    /// submission, never changed.
    #[serde(default)]
    pub submitter: Option<String>,
    /// Whether an operator paused it ([`Task::pause`]): no Scheduler claims
    /// it, and its holder starts no new step, until it is resumed. Written
    /// by pause and resume only; every other move keeps it.
    #[serde(default)]
    pub paused: bool,
    /// Its `key=value` labels, given at submission and never changed, by
    /// which operators find it (the stores index them).
    #[serde(default, skip_serializing_if = "Tags::is_empty")]
    pub tags: Tags,
    /// Schedulers claim higher priorities first (see [`crate::priority`]).
    /// Set at submission, never changed.
    #[serde(default, skip_serializing_if = "Priority::is_normal")]
    pub priority: Priority,
    /// Its concurrency key (see [`crate::concurrency`]), when its workflow
    /// has `concurrency:` or `max_in_flight:`. Set at submission, never
    /// changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencyKey>,
    /// The step of another task that started this one, when it is a child
    /// workflow. Set at creation, never changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
    /// The final result, once Processed.
    pub output: Option<Value>,
    /// The reason for Error (or the last failure).
    pub error: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
}

impl Task {
    /// A new Pending task, claimable at once.
    pub fn new(id: TaskId, workflow: WorkflowName, workflow_version: u32, input: Value, now: Timestamp) -> Task {
        Task {
            id,
            workflow,
            workflow_version,
            input,
            state: TaskState::Pending,
            locked_by: None,
            lease_epoch: 0,
            complete_by: None,
            warn_at: None,
            at_risk_since: None,
            not_before: now,
            failure_count: 0,
            reply_to: None,
            reply_queue: None,
            submitter: None,
            paused: false,
            tags: Tags::default(),
            priority: Priority::NORMAL,
            concurrency: None,
            parent: None,
            output: None,
            error: None,
            created_at: now,
            updated_at: now,
        }
    }

    /// Whether a Scheduler holds the lease.
    pub fn is_leased(&self) -> bool {
        self.locked_by.is_some()
    }

    /// The fence of the current lease, if there is one.
    pub fn fence(&self) -> Option<TaskFence> {
        self.locked_by.as_ref().map(|_| TaskFence { epoch: self.lease_epoch })
    }

    fn refuse(&self, action: &'static str) -> TransitionError {
        if self.state.is_terminal() {
            TransitionError::Terminal { record: "task", state: self.state.as_str() }
        } else {
            TransitionError::NotAllowed { record: "task", action, state: self.state.as_str() }
        }
    }

    /// Checks that `fence` is the current lease.
    pub fn check_fence(&self, fence: TaskFence) -> Result<(), TransitionError> {
        if self.locked_by.is_none() || self.lease_epoch != fence.epoch {
            return Err(TransitionError::LeaseLost { record: "task", held: fence.epoch, current: self.lease_epoch });
        }
        Ok(())
    }

    /// Whether a Scheduler may claim it at `now`.
    pub fn is_claimable(&self, now: Timestamp) -> bool {
        matches!(self.state, TaskState::Pending | TaskState::Compensating)
            && self.locked_by.is_none()
            && self.not_before <= now
            && !self.paused
    }

    /// A Scheduler takes the lease until `now + lease`. Pending becomes
    /// Processing; an unclaimed Compensating task stays Compensating.
    pub fn claim(&self, owner: InstanceId, now: Timestamp, lease: Duration) -> Result<(Task, TaskFence), TransitionError> {
        if !matches!(self.state, TaskState::Pending | TaskState::Compensating) || self.locked_by.is_some() {
            return Err(self.refuse("claim"));
        }
        if self.paused {
            return Err(TransitionError::NotAllowed { record: "task", action: "claim", state: "paused" });
        }
        if self.not_before > now {
            return Err(TransitionError::NotDue { record: "task", until: self.not_before });
        }
        let mut next = self.clone();
        if next.state == TaskState::Pending {
            next.state = TaskState::Processing;
        }
        next.locked_by = Some(owner);
        next.lease_epoch += 1;
        next.complete_by = Some(now.add(lease));
        next.warn_at = None;
        next.at_risk_since = None;
        next.updated_at = now;
        let fence = TaskFence { epoch: next.lease_epoch };
        Ok((next, fence))
    }

    /// The holder extends its lease to `now + lease`.
    pub fn renew(&self, fence: TaskFence, now: Timestamp, lease: Duration) -> Result<Task, TransitionError> {
        self.check_fence(fence)?;
        let mut next = self.clone();
        next.complete_by = Some(now.add(lease));
        // A warning point the new complete-by no longer leaves room for is dropped.
        next.warn_at = self.warn_at.filter(|at| *at < now.add(lease));
        next.updated_at = now;
        Ok(next)
    }

    /// The holder sets when its lease, claimed at `claimed_at`, is at risk:
    /// `warn_after` later, if given and before its complete-by (a later one
    /// would only come once the lease has run out, so it is left out).
    pub fn warn_after(&self, fence: TaskFence, claimed_at: Timestamp, warn_after: Option<Duration>) -> Result<Task, TransitionError> {
        self.check_fence(fence)?;
        let mut next = self.clone();
        next.warn_at = warn_after.map(|after| claimed_at.add(after)).filter(|at| self.complete_by.is_some_and(|by| *at < by));
        Ok(next)
    }

    /// The holder records success: every step completed.
    pub fn finish_processed(&self, fence: TaskFence, output: Value, now: Timestamp) -> Result<Task, TransitionError> {
        self.check_fence(fence)?;
        if self.state != TaskState::Processing {
            return Err(self.refuse("finish as processed"));
        }
        let mut next = self.released(now);
        next.state = TaskState::Processed;
        next.output = Some(output);
        next.error = None;
        Ok(next)
    }

    /// The holder records a permanent failure. With [`ExhaustedPolicy::Error`]
    /// the task ends in Error; with [`ExhaustedPolicy::Compensate`] it waits,
    /// unleased, for a Scheduler to run the compensation.
    pub fn fail(&self, fence: TaskFence, reason: String, policy: ExhaustedPolicy, now: Timestamp) -> Result<Task, TransitionError> {
        self.check_fence(fence)?;
        let mut next = self.released(now);
        next.error = Some(reason);
        next.state = match (self.state, policy) {
            (TaskState::Processing, ExhaustedPolicy::Compensate) => {
                next.failure_count = 0;
                TaskState::Compensating
            }
            (TaskState::Processing | TaskState::Compensating, _) => TaskState::Error,
            _ => return Err(self.refuse("fail")),
        };
        Ok(next)
    }

    /// The holder records that every completed step was compensated.
    pub fn finish_compensated(&self, fence: TaskFence, now: Timestamp) -> Result<Task, TransitionError> {
        self.check_fence(fence)?;
        if self.state != TaskState::Compensating {
            return Err(self.refuse("finish as compensated"));
        }
        let mut next = self.released(now);
        next.state = TaskState::Compensated;
        Ok(next)
    }

    /// The holder gives the task back without a failure (graceful shutdown):
    /// another Scheduler may claim it at once.
    pub fn release(&self, fence: TaskFence, now: Timestamp) -> Result<Task, TransitionError> {
        self.check_fence(fence)?;
        let mut next = self.released(now);
        next.not_before = now;
        if next.state == TaskState::Processing {
            next.state = TaskState::Pending;
        }
        Ok(next)
    }

    /// The Supervisor's move when `complete_by` has passed: count a failure;
    /// below `failures_max` reset the task for another claim after `backoff`;
    /// at the threshold end it in Error or start compensation, per `policy`.
    /// A task already compensating that reaches the threshold ends in Error.
    pub fn expire(&self, now: Timestamp, failures_max: u32, backoff: Duration, policy: ExhaustedPolicy) -> Result<Task, TransitionError> {
        let Some(complete_by) = self.complete_by.filter(|_| self.is_leased()) else {
            return Err(self.refuse("expire"));
        };
        if complete_by > now {
            return Err(TransitionError::NotDue { record: "task", until: complete_by });
        }
        let mut next = self.fenced_off(now);
        next.failure_count += 1;
        next.error = Some(format!("complete-by passed at {complete_by} (failure {} of {failures_max})", next.failure_count));
        if next.failure_count < failures_max {
            next.not_before = now.add(backoff);
            if next.state == TaskState::Processing {
                next.state = TaskState::Pending;
            }
            return Ok(next);
        }
        next.state = match (self.state, policy) {
            (TaskState::Processing, ExhaustedPolicy::Compensate) => {
                next.failure_count = 0;
                next.not_before = now;
                TaskState::Compensating
            }
            _ => TaskState::Error,
        };
        Ok(next)
    }

    /// The Supervisor counts a failure of one of the task's steps (its
    /// complete-by passed with no reply). Below `failures_max` the task keeps
    /// its state and lease, and the step is retried; at the threshold the task
    /// ends in Error or starts compensation, per `policy`, and its lease is
    /// dropped, which fences out the Scheduler that held it.
    pub fn count_failure(
        &self,
        reason: String,
        failures_max: u32,
        policy: ExhaustedPolicy,
        now: Timestamp,
    ) -> Result<Task, TransitionError> {
        if !matches!(self.state, TaskState::Processing | TaskState::Compensating) {
            return Err(self.refuse("count a failure of"));
        }
        let mut next = self.clone();
        next.updated_at = now;
        next.failure_count += 1;
        next.error = Some(format!("{reason} (failure {} of {failures_max})", next.failure_count));
        if next.failure_count < failures_max {
            return Ok(next);
        }
        let mut next = next.fenced_off(now);
        next.state = match (self.state, policy) {
            (TaskState::Processing, ExhaustedPolicy::Compensate) => {
                next.failure_count = 0;
                next.not_before = now;
                TaskState::Compensating
            }
            _ => TaskState::Error,
        };
        Ok(next)
    }

    /// An operator cancels a task that has not finished. With
    /// `compensate` (there are completed steps with compensations) it goes
    /// to Compensating; otherwise to Cancelled. The lease is dropped, which
    /// fences out any Scheduler still working on it.
    pub fn cancel(&self, compensate: bool, now: Timestamp) -> Result<Task, TransitionError> {
        if self.state.is_terminal() || self.state == TaskState::Compensating {
            return Err(self.refuse("cancel"));
        }
        let mut next = self.fenced_off(now);
        next.error = Some("cancelled by an operator".into());
        if compensate {
            next.state = TaskState::Compensating;
            next.failure_count = 0;
            next.not_before = now;
        } else {
            next.state = TaskState::Cancelled;
        }
        Ok(next)
    }

    /// An operator resubmits a task that ended in Error: it becomes Pending
    /// with a fresh failure count. The only way out of a terminal state.
    pub fn resubmit(&self, now: Timestamp) -> Result<Task, TransitionError> {
        if self.state != TaskState::Error {
            return Err(TransitionError::NotAllowed { record: "task", action: "resubmit", state: self.state.as_str() });
        }
        let mut next = self.fenced_off(now);
        next.state = TaskState::Pending;
        next.failure_count = 0;
        next.not_before = now;
        next.error = None;
        Ok(next)
    }

    /// An operator resumes the compensation of a task that ended in Error
    /// while being undone: it waits, unleased, for a Scheduler to claim it.
    pub fn resubmit_compensation(&self, now: Timestamp) -> Result<Task, TransitionError> {
        let mut next = self.resubmit(now)?;
        next.state = TaskState::Compensating;
        Ok(next)
    }

    /// An operator pauses a task that has not finished: no Scheduler claims
    /// it, and its holder (which keeps its lease) starts no new step until
    /// [`Task::resume`]. The new epoch fences out a decision its holder took
    /// on the record before the pause: it is taken again on one that says
    /// paused.
    pub fn pause(&self, now: Timestamp) -> Result<Task, TransitionError> {
        if self.state.is_terminal() {
            return Err(self.refuse("pause"));
        }
        if self.paused {
            return Err(TransitionError::NotAllowed { record: "task", action: "pause", state: "paused" });
        }
        let mut next = self.clone();
        next.paused = true;
        next.lease_epoch += 1;
        next.updated_at = now;
        Ok(next)
    }

    /// An operator resumes a paused task, in any state (a task paused and
    /// then cancelled or failed loses the mark, so that a resubmit runs it).
    /// Like [`Task::pause`], it bumps the epoch.
    pub fn resume(&self, now: Timestamp) -> Result<Task, TransitionError> {
        if !self.paused {
            return Err(TransitionError::NotAllowed { record: "task", action: "resume", state: "not paused" });
        }
        let mut next = self.clone();
        next.paused = false;
        next.lease_epoch += 1;
        next.updated_at = now;
        Ok(next)
    }

    /// A copy without lease and with a new epoch, for moves made by someone
    /// other than the holder (the Supervisor, an operator). The new epoch is
    /// what makes the holder's next compare-and-set fail even where the
    /// state name stays the same (a Compensating task losing its lease).
    fn fenced_off(&self, now: Timestamp) -> Task {
        let mut next = self.released(now);
        next.lease_epoch += 1;
        next
    }

    /// A copy without lease, stamped `now`.
    fn released(&self, now: Timestamp) -> Task {
        let mut next = self.clone();
        next.locked_by = None;
        next.complete_by = None;
        next.warn_at = None;
        next.at_risk_since = None;
        next.updated_at = now;
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LEASE: Duration = Duration::from_secs(30);
    const WARN_AFTER: Duration = Duration::from_secs(20);

    fn at(millis: i64) -> Timestamp {
        Timestamp::from_millis(millis)
    }

    fn task() -> Task {
        Task::new(TaskId::new("t1").unwrap(), WorkflowName::new("order").unwrap(), 1, Value::Null, at(0))
    }

    fn owner(name: &str) -> InstanceId {
        InstanceId::new(name).unwrap()
    }

    #[test]
    fn the_pattern_happy_path() {
        let t = task();
        let (t, fence) = t.claim(owner("s1"), at(10), LEASE).unwrap();
        assert_eq!(t.state, TaskState::Processing);
        assert_eq!(t.locked_by, Some(owner("s1")));
        assert_eq!(t.complete_by, Some(at(30_010)));
        let t = t.finish_processed(fence, Value::from(1), at(20)).unwrap();
        assert_eq!(t.state, TaskState::Processed);
        assert_eq!(t.locked_by, None);
        assert_eq!(t.complete_by, None);
    }

    #[test]
    fn a_paused_task_is_not_claimed_keeps_its_lease_and_is_fenced() {
        let paused = task().pause(at(1)).unwrap();
        assert!(paused.paused);
        assert_eq!(paused.state, TaskState::Pending);
        assert!(!paused.is_claimable(at(2)));
        assert!(matches!(paused.claim(owner("s1"), at(2), LEASE), Err(TransitionError::NotAllowed { state: "paused", .. })));
        assert_eq!(paused.pause(at(2)).unwrap_err().to_string(), "cannot pause a task that is paused");
        let resumed = paused.resume(at(3)).unwrap();
        assert!(!resumed.paused && resumed.is_claimable(at(3)));
        assert_eq!(resumed.resume(at(4)).unwrap_err().to_string(), "cannot resume a task that is not paused");

        // A held task keeps its lease, but its holder's fence no longer matches.
        let (held, fence) = resumed.claim(owner("s1"), at(5), LEASE).unwrap();
        let paused = held.pause(at(6)).unwrap();
        assert_eq!((paused.state, paused.locked_by.clone()), (TaskState::Processing, Some(owner("s1"))));
        assert!(matches!(paused.check_fence(fence), Err(TransitionError::LeaseLost { .. })));
        // Every other move keeps the mark.
        let released = paused.release(paused.fence().unwrap(), at(7)).unwrap();
        assert!(released.paused && !released.is_claimable(at(7)));
        let cancelled = released.cancel(false, at(8)).unwrap();
        assert!(cancelled.paused);
        assert_eq!(cancelled.pause(at(9)).unwrap_err().to_string(), "task is cancelled, which is terminal");
        assert!(!cancelled.resume(at(9)).unwrap().paused, "a finished task may lose the mark");
    }

    #[test]
    fn two_claims_never_both_hold() {
        let (claimed, _) = task().claim(owner("s1"), at(0), LEASE).unwrap();
        assert!(matches!(claimed.claim(owner("s2"), at(1), LEASE), Err(TransitionError::NotAllowed { .. })));
    }

    #[test]
    fn supervisor_expiry_counts_failures_then_applies_the_policy() {
        let mut t = task();
        for failure in 1..=2 {
            let (claimed, _) = t.claim(owner("s1"), t.not_before, LEASE).unwrap();
            let late = claimed.complete_by.unwrap();
            assert!(matches!(
                claimed.expire(late.sub(Duration::from_millis(1)), 3, LEASE, ExhaustedPolicy::Error),
                Err(TransitionError::NotDue { .. })
            ));
            t = claimed.expire(late, 3, Duration::from_secs(5), ExhaustedPolicy::Error).unwrap();
            assert_eq!(t.state, TaskState::Pending);
            assert_eq!(t.failure_count, failure);
            assert_eq!(t.not_before, late.add(Duration::from_secs(5)));
            assert!(matches!(t.claim(owner("s1"), late, LEASE), Err(TransitionError::NotDue { .. })));
        }
        let (claimed, _) = t.claim(owner("s1"), t.not_before, LEASE).unwrap();
        let done = claimed.expire(claimed.complete_by.unwrap(), 3, LEASE, ExhaustedPolicy::Compensate).unwrap();
        assert_eq!(done.state, TaskState::Compensating);
        assert!(done.is_claimable(done.not_before));
        let (compensating, fence) = done.claim(owner("s2"), done.not_before, LEASE).unwrap();
        assert_eq!(compensating.state, TaskState::Compensating);
        assert_eq!(compensating.finish_compensated(fence, at(1)).unwrap().state, TaskState::Compensated);
    }

    #[test]
    fn a_rescued_lease_fences_out_the_old_holder() {
        let (claimed, old) = task().claim(owner("s1"), at(0), LEASE).unwrap();
        let reset = claimed.expire(at(30_000), 5, Duration::ZERO, ExhaustedPolicy::Error).unwrap();
        assert!(matches!(reset.finish_processed(old, Value::Null, at(1)), Err(TransitionError::LeaseLost { .. })));
        let (reclaimed, new) = reset.claim(owner("s2"), at(30_000), LEASE).unwrap();
        assert!(matches!(reclaimed.finish_processed(old, Value::Null, at(1)), Err(TransitionError::LeaseLost { .. })));
        assert!(reclaimed.finish_processed(new, Value::Null, at(1)).is_ok());
    }

    #[test]
    fn step_failures_count_against_the_task_then_end_it() {
        let (t, fence) = task().claim(owner("s1"), at(0), LEASE).unwrap();
        let t = t.count_failure("charge timed out".into(), 2, ExhaustedPolicy::Error, at(1)).unwrap();
        assert_eq!((t.state, t.failure_count, t.fence()), (TaskState::Processing, 1, Some(fence)), "still held by its Scheduler");
        let t = t.count_failure("charge timed out".into(), 2, ExhaustedPolicy::Error, at(2)).unwrap();
        assert_eq!((t.state, t.locked_by.clone()), (TaskState::Error, None));
        assert!(t.error.as_deref().unwrap().contains("failure 2 of 2"));
    }

    #[test]
    fn a_warning_point_belongs_to_one_lease() {
        let (claimed, fence) = task().claim(owner("s1"), at(10), LEASE).unwrap();
        let warned = claimed.warn_after(fence, at(10), Some(WARN_AFTER)).unwrap();
        assert_eq!((warned.warn_at, warned.complete_by), (Some(at(20_010)), Some(at(30_010))));
        assert_eq!(claimed.warn_after(fence, at(10), Some(LEASE)).unwrap().warn_at, None, "never at or past the complete-by");
        assert!(warned.warn_after(TaskFence { epoch: 0 }, at(10), Some(WARN_AFTER)).is_err(), "only the holder sets it");
        let at_risk = Task { at_risk_since: Some(at(20_010)), ..warned };
        let renewed = at_risk.renew(fence, at(11), LEASE).unwrap();
        assert_eq!((renewed.warn_at, renewed.at_risk_since), (Some(at(20_010)), Some(at(20_010))), "a renewal keeps the lease's warning");
        for ended in [
            at_risk.finish_processed(fence, Value::Null, at(20)).unwrap(),
            at_risk.release(fence, at(20)).unwrap(),
            at_risk.expire(at(30_010), 3, LEASE, ExhaustedPolicy::Error).unwrap(),
            at_risk.cancel(false, at(20)).unwrap(),
        ] {
            assert_eq!((ended.warn_at, ended.at_risk_since), (None, None), "ended in {}", ended.state);
        }
    }

    #[test]
    fn resubmit_is_the_only_way_out_of_error() {
        let (claimed, fence) = task().claim(owner("s1"), at(0), LEASE).unwrap();
        let failed = claimed.fail(fence, "card declined".into(), ExhaustedPolicy::Error, at(5)).unwrap();
        assert_eq!(failed.state, TaskState::Error);
        assert_eq!(failed.error.as_deref(), Some("card declined"));
        let again = failed.resubmit(at(6)).unwrap();
        assert_eq!((again.state, again.failure_count), (TaskState::Pending, 0));
        assert!(task().resubmit(at(1)).is_err(), "only Error can be resubmitted");
    }

    /// Every move, with arbitrary arguments, for the property test.
    #[derive(Debug, Clone)]
    enum Move {
        Claim(u8, i64),
        Renew(u64, i64),
        FinishProcessed(u64, i64),
        Fail(u64, bool, i64),
        FinishCompensated(u64, i64),
        Release(u64, i64),
        Expire(i64, u32, bool),
        Cancel(bool, i64),
        CountFailure(u32, bool, i64),
    }

    fn arb_move() -> impl Strategy<Value = Move> {
        let time = 0i64..200_000;
        prop_oneof![
            (0u8..3, time.clone()).prop_map(|(o, t)| Move::Claim(o, t)),
            (0u64..6, time.clone()).prop_map(|(e, t)| Move::Renew(e, t)),
            (0u64..6, time.clone()).prop_map(|(e, t)| Move::FinishProcessed(e, t)),
            (0u64..6, any::<bool>(), time.clone()).prop_map(|(e, c, t)| Move::Fail(e, c, t)),
            (0u64..6, time.clone()).prop_map(|(e, t)| Move::FinishCompensated(e, t)),
            (0u64..6, time.clone()).prop_map(|(e, t)| Move::Release(e, t)),
            (time.clone(), 1u32..4, any::<bool>()).prop_map(|(t, m, c)| Move::Expire(t, m, c)),
            (any::<bool>(), time.clone()).prop_map(|(c, t)| Move::Cancel(c, t)),
            (1u32..4, any::<bool>(), time).prop_map(|(m, c, t)| Move::CountFailure(m, c, t)),
        ]
    }

    fn apply(t: &Task, m: &Move) -> Result<Task, TransitionError> {
        let policy = |c: bool| if c { ExhaustedPolicy::Compensate } else { ExhaustedPolicy::Error };
        match *m {
            Move::Claim(o, now) => t
                .claim(owner(&format!("s{o}")), at(now), LEASE)
                .and_then(|(t, fence)| t.warn_after(fence, at(now), Some(WARN_AFTER)))
                .map(|t| Task { at_risk_since: t.warn_at, ..t }),
            Move::Renew(e, now) => t.renew(TaskFence { epoch: e }, at(now), LEASE),
            Move::FinishProcessed(e, now) => t.finish_processed(TaskFence { epoch: e }, Value::Null, at(now)),
            Move::Fail(e, c, now) => t.fail(TaskFence { epoch: e }, "boom".into(), policy(c), at(now)),
            Move::FinishCompensated(e, now) => t.finish_compensated(TaskFence { epoch: e }, at(now)),
            Move::Release(e, now) => t.release(TaskFence { epoch: e }, at(now)),
            Move::Expire(now, max, c) => t.expire(at(now), max, Duration::from_secs(1), policy(c)),
            Move::Cancel(c, now) => t.cancel(c, at(now)),
            Move::CountFailure(max, c, now) => t.count_failure("step timed out".into(), max, policy(c), at(now)),
        }
    }

    proptest! {
        #[test]
        fn nothing_leaves_a_terminal_state_but_resubmit(moves in prop::collection::vec(arb_move(), 1..60)) {
            let mut t = task();
            for m in &moves {
                let before = t.clone();
                if let Ok(next) = apply(&t, m) {
                    prop_assert!(!before.state.is_terminal(), "{m:?} moved a terminal task out of {}", before.state);
                    // Invariants that hold after every accepted move.
                    prop_assert_eq!(next.locked_by.is_some(), next.complete_by.is_some());
                    // Warnings belong to the lease: none survives its end.
                    prop_assert!(next.is_leased() || (next.warn_at.is_none() && next.at_risk_since.is_none()));
                    if let Some(warn_at) = next.warn_at {
                        prop_assert!(next.complete_by.is_some_and(|by| warn_at < by));
                    }
                    prop_assert!(next.locked_by.is_none() || matches!(next.state, TaskState::Processing | TaskState::Compensating));
                    prop_assert!(next.lease_epoch >= before.lease_epoch, "epochs never go back");
                    // A lease that ends by someone else's move (expire, cancel, a failure count at the
                    // threshold) always changes the epoch, so the old holder's compare-and-set fails.
                    if before.is_leased() && !next.is_leased() && matches!(m, Move::Expire(..) | Move::Cancel(..) | Move::CountFailure(..)) {
                        prop_assert!(next.lease_epoch > before.lease_epoch, "{m:?} dropped a lease without a new epoch");
                    }
                    t = next;
                }
            }
        }

        #[test]
        fn a_write_fenced_with_an_old_lease_is_refused(moves in prop::collection::vec(arb_move(), 1..60), stale in 0u64..6) {
            let mut t = task();
            for m in &moves {
                if let Ok(next) = apply(&t, m) { t = next; }
                if t.fence().map(|f| f.epoch) != Some(stale) {
                    let fence = TaskFence { epoch: stale };
                    let refused = |r: Result<Task, TransitionError>| matches!(r, Err(TransitionError::LeaseLost { .. }));
                    prop_assert!(refused(t.renew(fence, at(0), LEASE)));
                    prop_assert!(refused(t.finish_processed(fence, Value::Null, at(0))));
                    prop_assert!(refused(t.fail(fence, "x".into(), ExhaustedPolicy::Error, at(0))));
                    prop_assert!(refused(t.finish_compensated(fence, at(0))));
                    prop_assert!(refused(t.release(fence, at(0))));
                }
            }
        }
    }
}
