//! Retention: deleting finished tasks with their steps and history, and
//! the leftovers of instances that are gone.
//!
//! A prune deletes at most [`Prune::limit`] tasks per call, each call one
//! short transaction, so that the caller (the Supervisor leader, or an
//! operator's `rota prune`) can delete a backlog in small batches that never
//! hold the store's write lock for long. Only finished tasks are deleted
//! (the states of [`TaskState::is_terminal`]), by their end time: a
//! finished task is never written again except by an operator's resubmit,
//! so its `updated_at` is when it finished.
//!
//! Schedules derive the ids of the tasks they start from the fire time
//! (`NAME@<fire time>`), and a fire submitted by a leader that died before
//! recording its progress is submitted again by the next leader, relying
//! on the task id to find it already created. So a prune never deletes a
//! task of a schedule (an id starting with `NAME@`) that finished at or
//! after the schedule's recorded progress (`fired_through`, or its buffered
//! fire when that is older): such a task may belong to a fire the schedule
//! has not recorded yet, and deleting it would let the fire start twice.
//! Every fire at or before `fired_through` is never submitted again.
//!
//! Archiving before deleting reads the batch first
//! ([`crate::Tasks::prunable_tasks`]), writes it out, then deletes exactly
//! those tasks ([`Prune::only`]): a task that changed in between (an
//! operator resubmitted it) no longer matches the selection and is kept.
//!
//! Deliberately left out: messages that still name a deleted task (a
//! finished task has none in flight; a late one is dropped by its consumer
//! like any message for a task it cannot find).

use rota_model::{InstanceId, QueueName, TaskId, TaskState, Timestamp, WorkflowName};

use crate::{Error, Result};

/// Whose tasks a prune deletes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PruneWorkflows {
    /// Tasks of every workflow.
    All,
    /// Tasks of this workflow only (its own retention).
    Only(WorkflowName),
    /// Tasks of every workflow but these (the store's default retention,
    /// leaving out the workflows that set their own).
    Except(Vec<WorkflowName>),
}

/// Which finished tasks a prune deletes: those in one of `states` whose end
/// time is strictly before `finished_before`, of `workflows`, oldest end
/// first, at most `limit` per call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prune {
    /// Only tasks that finished strictly before this time.
    pub finished_before: Timestamp,
    /// Only tasks in these states: finished ones, at least one.
    pub states: Vec<TaskState>,
    /// Only tasks of these workflows.
    pub workflows: PruneWorkflows,
    /// At most this many tasks per call (one transaction).
    pub limit: u32,
    /// Only these tasks (those an archive has written), when set; each is
    /// still deleted only if the rest of the selection matches it.
    pub only: Option<Vec<TaskId>>,
}

impl Prune {
    /// The most tasks one call may delete: a bigger batch holds the write
    /// lock longer than a commit should wait.
    pub const LIMIT_MAX: u32 = 10_000;
    /// The most workflows [`PruneWorkflows::Except`] may name.
    pub const EXCEPT_MAX: usize = 1_000;

    /// Every finished task older than `finished_before`, in batches of `limit`.
    pub fn finished_before(finished_before: Timestamp, limit: u32) -> Self {
        let states = TaskState::ALL.into_iter().filter(|state| state.is_terminal()).collect();
        Prune { finished_before, states, workflows: PruneWorkflows::All, limit, only: None }
    }

    /// Refuses, as every backend does before touching anything, a prune
    /// without states or naming an unfinished one (a running task is never
    /// deleted), a limit outside 1..=[`Prune::LIMIT_MAX`], or too long an
    /// exception list or list of tasks.
    pub fn check(&self) -> Result<()> {
        if self.states.is_empty() {
            return Err(Error::Invalid("prune: name at least one finished state".into()));
        }
        if let Some(state) = self.states.iter().find(|state| !state.is_terminal()) {
            return Err(Error::Invalid(format!("prune: {} tasks are not finished and are never deleted", state.as_str())));
        }
        if !(1..=Self::LIMIT_MAX).contains(&self.limit) {
            return Err(Error::Invalid(format!("prune: limit must be between 1 and {}, got {}", Self::LIMIT_MAX, self.limit)));
        }
        if let PruneWorkflows::Except(names) = &self.workflows
            && names.len() > Self::EXCEPT_MAX
        {
            return Err(Error::Invalid(format!("prune: at most {} workflows may be left out, got {}", Self::EXCEPT_MAX, names.len())));
        }
        if let Some(only) = &self.only
            && only.len() > Self::LIMIT_MAX as usize
        {
            return Err(Error::Invalid(format!("prune: at most {} tasks may be named, got {}", Self::LIMIT_MAX, only.len())));
        }
        Ok(())
    }

    /// The state names, as stored, for a backend's `IN` list.
    pub fn state_names(&self) -> Vec<&'static str> {
        self.states.iter().map(|state| state.as_str()).collect()
    }
}

/// What one [`crate::Tasks::prune_tasks`] call deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    /// The tasks deleted, oldest end first.
    pub tasks: Vec<TaskId>,
    /// How many of their steps were deleted with them.
    pub steps: u64,
    /// How many of their history events were deleted with them.
    pub events: u64,
}

/// The leftovers of an instance that is gone, for
/// [`crate::Tasks::sweep_instance`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceSweep {
    /// The instance.
    pub instance: InstanceId,
    /// The status key of its heartbeat.
    pub heartbeat_key: String,
    /// Swept only if that heartbeat was reported strictly before this time.
    pub gone_before: Timestamp,
    /// Its inbox queue, if it had one.
    pub inbox: Option<QueueName>,
}

/// What [`crate::Tasks::sweep_instance`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// The heartbeat was deleted (the instance was gone long enough and
    /// nothing of it is still needed).
    pub heartbeat: bool,
    /// The inbox queue was deleted.
    pub inbox: bool,
}
