//! Bulk actions as durable batches: an operator's cancel or resubmit of
//! every task a filter selects, kept in the store with its progress so
//! that it survives the process running it.
//!
//! A batch walks the tasks its filter selects newest first, a page at a
//! time, and records after each page how far it got (`cursor`, the last
//! task handled) and what happened (done, skipped, failed). One runner at
//! a time holds it, under a lease that each page renews; a runner that
//! dies leaves the lease to run out, and the next runner (the Supervisor
//! leader, or `rota batches resume`) goes on from the cursor. A task acted
//! on again after such a crash is refused by its own state (a cancelled
//! task cannot be cancelled, a resubmitted one is no longer in Error) and
//! counted as skipped.

use std::fmt;
use std::str::FromStr;

use rota_model::{InstanceId, TaskId, Timestamp};
use serde::{Deserialize, Serialize};

use crate::TaskFilter;

/// What a batch does to each task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchAction {
    /// Cancel it (compensating when its workflow says so).
    Cancel,
    /// Resubmit it from its first unfinished step (a task in Error).
    Resubmit,
}

impl BatchAction {
    pub fn as_str(self) -> &'static str {
        match self {
            BatchAction::Cancel => "cancel",
            BatchAction::Resubmit => "resubmit",
        }
    }
}

impl fmt::Display for BatchAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BatchAction {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "cancel" => Ok(BatchAction::Cancel),
            "resubmit" => Ok(BatchAction::Resubmit),
            other => Err(format!("unknown batch action {other:?} (cancel or resubmit)")),
        }
    }
}

/// Where a batch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchState {
    /// Not finished: a runner holds it or the next one takes it.
    Running,
    /// An operator stopped it; the tasks not reached are left as they are.
    Stopped,
    /// Every selected task was handled.
    Done,
}

impl BatchState {
    pub fn as_str(self) -> &'static str {
        match self {
            BatchState::Running => "running",
            BatchState::Stopped => "stopped",
            BatchState::Done => "done",
        }
    }
}

impl fmt::Display for BatchState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BatchState {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "running" => Ok(BatchState::Running),
            "stopped" => Ok(BatchState::Stopped),
            "done" => Ok(BatchState::Done),
            other => Err(format!("unknown batch state {other:?}")),
        }
    }
}

/// A batch to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewBatch {
    pub id: String,
    pub action: BatchAction,
    /// The tasks it acts on (its `before` and `limit` aside: the runner
    /// pages through them).
    pub filter: TaskFilter,
    /// How many tasks the filter selected when the batch was made.
    pub total: u64,
    /// Who asked (a token's name, the OS user).
    pub requested_by: String,
    /// Why, if they said.
    pub reason: Option<String>,
}

/// A stored batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRecord {
    pub id: String,
    pub action: BatchAction,
    pub filter: TaskFilter,
    pub total: u64,
    pub requested_by: String,
    pub reason: Option<String>,
    pub state: BatchState,
    /// The last task handled: the next page starts after it.
    pub cursor: Option<TaskId>,
    /// Tasks the action was applied to.
    pub done: u64,
    /// Tasks the action did not apply to any more (already cancelled, no
    /// longer in Error).
    pub skipped: u64,
    /// Tasks the action failed on for another reason; `last_error` says the
    /// latest.
    pub failed: u64,
    pub last_error: Option<String>,
    /// The runner holding it, and until when.
    pub locked_by: Option<InstanceId>,
    pub lease_until: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// What one page of a batch did, written by its runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchProgress {
    pub cursor: Option<TaskId>,
    pub done: u64,
    pub skipped: u64,
    pub failed: u64,
    pub last_error: Option<String>,
    /// True when the walk reached the end: the batch is done.
    pub finished: bool,
}

impl BatchRecord {
    /// A filter as a batch keeps it (JSON).
    pub fn filter_json(filter: &TaskFilter) -> String {
        serde_json::to_string(filter).expect("a task filter serialises")
    }

    /// A filter kept with [`BatchRecord::filter_json`].
    pub fn filter_from_json(text: &str) -> Result<TaskFilter, String> {
        serde_json::from_str(text).map_err(|err| format!("stored batch filter is invalid: {err}"))
    }
}
