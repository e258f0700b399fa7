//! Bulk actions as durable batches: an operator's cancel or resubmit of
//! every task a filter selects, or redrive of every dead letter of a queue
//! a filter selects, kept in the store with its progress so that it
//! survives the process running it.
//!
//! A batch walks the tasks its filter selects newest first, a page at a
//! time, and records after each page how far it got (`cursor`, the last
//! task handled) and what happened (done, skipped, failed). One runner at
//! a time holds it, under a lease that each page renews; a runner that
//! dies leaves the lease to run out, and the next runner (the Supervisor
//! leader, or `rota batches resume`) goes on from the cursor. A task acted
//! on again after such a crash is refused by its own state (a cancelled
//! task cannot be cancelled, a resubmitted one is no longer in Error) and
//! counted as skipped. A redrive walks a queue's dead letters oldest
//! first instead ([`DeadLetterFilter`], cursor: the last dead letter's
//! `seq`); a redrive moves each row back to the live queue, so a dead
//! letter redriven again after such a crash is no longer there and is
//! counted as skipped, never sent twice.

use std::fmt;
use std::str::FromStr;

use rota_model::{InstanceId, QueueName, TaskId, Timestamp};
use serde::{Deserialize, Serialize};

use crate::{TaskFilter, TimeRange};

/// What a batch does to each task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchAction {
    /// Cancel it (compensating when its workflow says so).
    Cancel,
    /// Resubmit it from its first unfinished step (a task in Error).
    Resubmit,
    /// Send a dead letter back to its queue with a fresh delivery count.
    Redrive,
}

impl BatchAction {
    pub fn as_str(self) -> &'static str {
        match self {
            BatchAction::Cancel => "cancel",
            BatchAction::Resubmit => "resubmit",
            BatchAction::Redrive => "redrive",
        }
    }

    /// Whether it acts on dead letters (a [`BatchFilter::DeadLetters`])
    /// rather than on tasks.
    pub fn on_dead_letters(self) -> bool {
        self == BatchAction::Redrive
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
            "redrive" => Ok(BatchAction::Redrive),
            other => Err(format!("unknown batch action {other:?} (cancel, resubmit or redrive)")),
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
    /// What it acts on (a task filter's `before` and `limit` aside: the
    /// runner pages through them).
    pub filter: BatchFilter,
    /// How many tasks (dead letters) the filter selected when the batch
    /// was made.
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
    pub filter: BatchFilter,
    pub total: u64,
    pub requested_by: String,
    pub reason: Option<String>,
    pub state: BatchState,
    /// The last task (dead letter) handled: the next page starts after it.
    pub cursor: Option<BatchCursor>,
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
    pub cursor: Option<BatchCursor>,
    pub done: u64,
    pub skipped: u64,
    pub failed: u64,
    pub last_error: Option<String>,
    /// True when the walk reached the end: the batch is done.
    pub finished: bool,
}

/// What a batch acts on.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchFilter {
    /// The tasks a task filter selects (cancel, resubmit).
    Tasks(TaskFilter),
    /// The dead letters of one queue a dead-letter filter selects
    /// (redrive).
    DeadLetters(DeadLetterFilter),
}

/// The key a dead-letter filter is kept under in a batch's JSON; a task
/// filter is kept as itself (as batches were before dead letters had
/// any), which never has this key.
const DEAD_LETTERS_KEY: &str = "dead_letters";

impl BatchFilter {
    /// The filter as a batch keeps it (JSON).
    pub fn to_json(&self) -> String {
        match self {
            BatchFilter::Tasks(filter) => serde_json::to_string(filter).expect("a task filter serialises"),
            BatchFilter::DeadLetters(filter) => {
                serde_json::to_string(&serde_json::json!({ DEAD_LETTERS_KEY: filter })).expect("a dead-letter filter serialises")
            }
        }
    }

    /// A filter kept with [`BatchFilter::to_json`].
    pub fn from_json(text: &str) -> Result<BatchFilter, String> {
        let invalid = |err: serde_json::Error| format!("stored batch filter is invalid: {err}");
        let value: serde_json::Value = serde_json::from_str(text).map_err(invalid)?;
        match value.get(DEAD_LETTERS_KEY) {
            Some(filter) => Ok(BatchFilter::DeadLetters(serde_json::from_value(filter.clone()).map_err(invalid)?)),
            None => Ok(BatchFilter::Tasks(serde_json::from_value(value).map_err(invalid)?)),
        }
    }

    /// Whether it selects dead letters.
    pub fn is_dead_letters(&self) -> bool {
        matches!(self, BatchFilter::DeadLetters(_))
    }
}

/// Which dead letters of a queue a redrive batch (or a dry run) selects:
/// those matching every condition set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetterFilter {
    /// The queue whose dead letters.
    pub queue: QueueName,
    /// Only dead letters whose reason contains this text (case-sensitive).
    #[serde(default)]
    pub reason_contains: Option<String>,
    /// Only dead letters dead-lettered in this range.
    #[serde(default)]
    pub dead_lettered: TimeRange,
}

impl DeadLetterFilter {
    /// Every dead letter of `queue`.
    pub fn all(queue: QueueName) -> Self {
        DeadLetterFilter { queue, reason_contains: None, dead_lettered: TimeRange::default() }
    }
}

/// Where a batch's walk got: the last task, or the last dead letter's
/// `seq` (its place in its dead-letter queue, oldest first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchCursor {
    Task(TaskId),
    DeadLetter(u64),
}

impl BatchCursor {
    /// The cursor as a batch keeps it (text).
    pub fn to_text(&self) -> String {
        match self {
            BatchCursor::Task(id) => id.to_string(),
            BatchCursor::DeadLetter(seq) => seq.to_string(),
        }
    }

    /// A cursor kept with [`BatchCursor::to_text`] by a batch with `filter`.
    pub fn from_text(filter: &BatchFilter, text: String) -> Result<BatchCursor, String> {
        match filter {
            BatchFilter::Tasks(_) => TaskId::new(text).map(BatchCursor::Task).map_err(|err| err.to_string()),
            BatchFilter::DeadLetters(_) => {
                text.parse().map(BatchCursor::DeadLetter).map_err(|_| format!("dead-letter cursor {text:?} is not a number"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_filter_kept_before_dead_letters_had_batches_reads_back() {
        // As the batches of schema versions up to 19 wrote it.
        let kept = r#"{"state":"error","workflow":"order","locked_by":null,"submitter":null,"at_risk":false,"tags":[["customer","c1"]],"created":{"from":null,"until":1800000000001},"ended":{"from":null,"until":null},"id_prefix":null,"before":null,"limit":100}"#;
        let BatchFilter::Tasks(filter) = BatchFilter::from_json(kept).unwrap() else { panic!("a task filter") };
        assert_eq!(filter.tags, [("customer".to_owned(), "c1".to_owned())]);
        assert_eq!(filter.created.until, Some(Timestamp::from_millis(1_800_000_000_001)));
        assert_eq!(BatchFilter::from_json(&BatchFilter::Tasks(filter.clone()).to_json()).unwrap(), BatchFilter::Tasks(filter));
    }

    #[test]
    fn a_dead_letter_filter_reads_back_and_its_cursor_is_a_number() {
        let filter = BatchFilter::DeadLetters(DeadLetterFilter {
            queue: QueueName::new("agent.http").unwrap(),
            reason_contains: Some("timeout".into()),
            dead_lettered: TimeRange { from: Some(Timestamp::from_millis(5)), until: None },
        });
        assert_eq!(BatchFilter::from_json(&filter.to_json()).unwrap(), filter);
        assert_eq!(BatchCursor::from_text(&filter, "42".into()).unwrap(), BatchCursor::DeadLetter(42));
        assert!(BatchCursor::from_text(&filter, "task-1".into()).unwrap_err().contains("not a number"));
        assert!(
            BatchFilter::from_json(r#"{"dead_letters":{"queue":"has space"}}"#).unwrap_err().contains("stored batch filter is invalid")
        );
    }
}
