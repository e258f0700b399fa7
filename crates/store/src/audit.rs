//! The audit log: every operator action, with who did it and why.
//!
//! An action on a task (cancel, resubmit, pause, resume, signal) is
//! already written, with who and why, into the task's history by the very
//! commit that makes it; the audit log reads those rows back (through a
//! partial index of the operator kinds) instead of writing them a second
//! time, so a task action can never be recorded in one place and missing
//! from the other, and the hot commit path gains no statement. Every other
//! action (on queues, dead letters, workflows, schedules, batches, and a
//! prune) has no history row: it is a row of the store's `audit` table,
//! written after the action with its outcome ([`Tasks::record_audit`],
//! which refuses the task actions). A listing ([`Tasks::audit`]) merges
//! both, newest first, on one keyset ([`AuditCursor`]).
//!
//! The two sources live as long as what they record: a task's actions go
//! with the task when retention deletes it (the prune itself is an audit
//! row with its counts, so who deleted what stays listed), and the table's
//! rows are deleted after the audit retention ([`Tasks::prune_audit`]).
//!
//! [`Tasks::record_audit`]: crate::Tasks::record_audit
//! [`Tasks::audit`]: crate::Tasks::audit
//! [`Tasks::prune_audit`]: crate::Tasks::prune_audit

use std::fmt;
use std::str::FromStr;

use rota_model::Timestamp;
use serde_json::Value;

use crate::{Error, Event, EventKind, Result};

/// The most entries one listing returns.
pub const AUDIT_LIMIT_MAX: u32 = 1_000;

/// The longest `by` (who acted) the table keeps, in characters.
pub const AUDIT_BY_CHARS_MAX: usize = 200;

/// The longest reason the table keeps, in characters (as an operator's
/// reason on a task: `REASON_CHARS_MAX` in the engine).
pub const AUDIT_REASON_CHARS_MAX: usize = 1_000;

macro_rules! audit_actions {
    ($($variant:ident = $name:literal, $doc:literal;)*) => {
        /// What an operator did.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum AuditAction {
            $(#[doc = $doc] $variant,)*
        }

        impl AuditAction {
            /// Every action, in the order they are documented.
            pub const ALL: &'static [AuditAction] = &[$(AuditAction::$variant,)*];

            /// The action's name as stored and shown (`area.verb`).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(AuditAction::$variant => $name,)*
                }
            }
        }
    };
}

audit_actions! {
    TaskCancel = "task.cancel", "A task was cancelled (from its history: `cancelled`).";
    TaskResubmit = "task.resubmit", "A task or one of its steps was resubmitted (from its history: `resubmitted`).";
    TaskPause = "task.pause", "A task was paused (from its history: `paused`).";
    TaskResume = "task.resume", "A task was resumed (from its history: `resumed`).";
    TaskSignal = "task.signal", "A signal was sent to a task (from its history: `signal`).";
    QueuePause = "queue.pause", "A queue's deliveries were paused.";
    QueueResume = "queue.resume", "A queue's deliveries were resumed.";
    DlqRedrive = "dlq.redrive", "Dead letters were sent back to their queue.";
    DlqPurge = "dlq.purge", "A queue's dead letters were deleted.";
    Prune = "prune", "Finished tasks were deleted by hand (`rota prune`), or by retention.";
    WorkflowPause = "workflow.pause", "A workflow was paused.";
    WorkflowResume = "workflow.resume", "A workflow was resumed.";
    SchedulePause = "schedule.pause", "A schedule was paused.";
    ScheduleResume = "schedule.resume", "A schedule was resumed.";
    ScheduleTrigger = "schedule.trigger", "A schedule was fired by hand.";
    ScheduleDelete = "schedule.delete", "A schedule was deleted.";
    BatchCreate = "batch.create", "A bulk action (batch) was created.";
    BatchStop = "batch.stop", "A batch was stopped.";
    BatchResume = "batch.resume", "A stopped or abandoned batch was run again by hand.";
}

impl AuditAction {
    /// The history event kind a task action is read from; `None` for the
    /// actions kept in the audit table.
    pub fn event_kind(self) -> Option<EventKind> {
        match self {
            AuditAction::TaskCancel => Some(EventKind::Cancelled),
            AuditAction::TaskResubmit => Some(EventKind::Resubmitted),
            AuditAction::TaskPause => Some(EventKind::Paused),
            AuditAction::TaskResume => Some(EventKind::Resumed),
            AuditAction::TaskSignal => Some(EventKind::Signal),
            _ => None,
        }
    }

    /// The task action a history event records, if it records one.
    pub fn of_event(kind: EventKind) -> Option<AuditAction> {
        AuditAction::ALL.iter().copied().find(|action| action.event_kind() == Some(kind))
    }
}

/// The history kinds that are operator actions, as stored: the backends'
/// partial index and listing name exactly these (a test of each backend
/// checks that its SQL does).
pub const HISTORY_KINDS: [&str; 5] = ["cancelled", "resubmitted", "paused", "resumed", "signal"];

impl fmt::Display for AuditAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AuditAction {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        AuditAction::ALL.iter().copied().find(|action| action.as_str() == text).ok_or_else(|| {
            let names: Vec<&str> = AuditAction::ALL.iter().map(|a| a.as_str()).collect();
            format!("unknown audit action {text:?} (one of {})", names.join(", "))
        })
    }
}

/// Where an entry comes from, which also orders entries of the same
/// millisecond: history rows before table rows, newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AuditSource {
    /// The audit table (the row's id).
    Table,
    /// A task's history (the event's `seq`).
    History,
}

/// An entry's place in the listing's order (newest first): its time, its
/// source and its row's id there. A listing continues after one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AuditCursor {
    pub at: Timestamp,
    pub source: AuditSource,
    pub id: i64,
}

impl AuditCursor {
    /// The bounds a source's query takes to list what comes after this
    /// cursor in newest-first order: rows with `at < at_max`, or `at ==
    /// at_max` and `id < id_below`.
    pub fn bounds(after: Option<AuditCursor>, source: AuditSource) -> (i64, i64) {
        match after {
            None => (i64::MAX, i64::MAX),
            Some(cursor) => {
                let id_below = match source.cmp(&cursor.source) {
                    // The same source: below the cursor's row.
                    std::cmp::Ordering::Equal => cursor.id,
                    // Rows of a source that sorts before the cursor's at the
                    // same millisecond were listed already.
                    std::cmp::Ordering::Greater => i64::MIN,
                    std::cmp::Ordering::Less => i64::MAX,
                };
                (cursor.at.as_millis(), id_below)
            }
        }
    }
}

impl fmt::Display for AuditCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match self.source {
            AuditSource::Table => 'a',
            AuditSource::History => 'h',
        };
        write!(f, "{}.{source}{}", self.at.as_millis(), self.id)
    }
}

impl FromStr for AuditCursor {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{text:?} is not an audit cursor (the `next` of a listing)");
        let (at, rest) = text.split_once('.').ok_or_else(bad)?;
        let at: i64 = at.parse().map_err(|_| bad())?;
        let source = match rest.chars().next() {
            Some('a') => AuditSource::Table,
            Some('h') => AuditSource::History,
            _ => return Err(bad()),
        };
        let id: i64 = rest[1..].parse().map_err(|_| bad())?;
        Ok(AuditCursor { at: Timestamp::from_millis(at), source, id })
    }
}

/// An action to record in the audit table.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAudit {
    pub action: AuditAction,
    /// Who (a token's name, the OS user of a local CLI, the Supervisor).
    pub by: String,
    /// Why, if they said.
    pub reason: Option<String>,
    /// What it was done to (a queue, a workflow, a schedule, a batch id; a
    /// prune's selection).
    pub target: String,
    /// What it did (counts, a filter), as JSON.
    pub detail: Value,
}

impl NewAudit {
    /// Refuses a task action (those are read from the task's history, and
    /// recording one here would list it twice) and overlong fields.
    pub fn check(&self) -> Result<()> {
        if self.action.event_kind().is_some() {
            return Err(Error::Invalid(format!("{} is recorded in the task's history, not in the audit table", self.action)));
        }
        if self.by.is_empty() || self.by.chars().count() > AUDIT_BY_CHARS_MAX {
            return Err(Error::Invalid(format!("an audit entry's by must be 1 to {AUDIT_BY_CHARS_MAX} characters")));
        }
        if self.reason.as_deref().is_some_and(|r| r.chars().count() > AUDIT_REASON_CHARS_MAX) {
            return Err(Error::Invalid(format!("an audit entry's reason must be at most {AUDIT_REASON_CHARS_MAX} characters")));
        }
        Ok(())
    }
}

/// One operator action as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    /// Its place in the listing (and its source).
    pub cursor: AuditCursor,
    pub action: AuditAction,
    pub by: String,
    pub reason: Option<String>,
    /// What it was done to: the task's id for a task action.
    pub target: String,
    /// What it did: the history row's detail (with its `step`, when it is
    /// about one) for a task action.
    pub detail: Value,
}

impl AuditEntry {
    /// When it was done.
    pub fn at(&self) -> Timestamp {
        self.cursor.at
    }

    /// A task action as its history row records it; `None` for a row of
    /// another kind.
    pub fn from_event(event: &Event) -> Option<AuditEntry> {
        let action = AuditAction::of_event(event.kind)?;
        let text = |key: &str| event.detail.get(key).and_then(Value::as_str).map(str::to_owned);
        // Signals name their sender `sent_by`; every other operator row `by`.
        let by = text("by").or_else(|| text("sent_by")).unwrap_or_else(|| "unknown".to_owned());
        let mut detail = event.detail.clone();
        if let (Some(step), Value::Object(map)) = (&event.step, &mut detail) {
            map.insert("step".to_owned(), Value::String(step.to_string()));
        }
        Some(AuditEntry {
            cursor: AuditCursor { at: event.at, source: AuditSource::History, id: event.seq },
            action,
            by,
            reason: text("reason"),
            target: event.task_id.to_string(),
            detail,
        })
    }
}

/// Which actions to list: newest first, after `after`, at most `limit`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AuditFilter {
    /// Only actions at or after this time.
    pub since: Option<Timestamp>,
    pub action: Option<AuditAction>,
    /// Only actions by exactly this name.
    pub by: Option<String>,
    /// Continue after this entry (the previous page's last).
    pub after: Option<AuditCursor>,
    /// At most this many (1 to [`AUDIT_LIMIT_MAX`]).
    pub limit: u32,
}

impl AuditFilter {
    /// Refuses a limit out of bounds.
    pub fn check(&self) -> Result<()> {
        if self.limit == 0 || self.limit > AUDIT_LIMIT_MAX {
            return Err(Error::Invalid(format!("an audit listing's limit must be 1 to {AUDIT_LIMIT_MAX}, got {}", self.limit)));
        }
        Ok(())
    }

    /// Whether the listing reads `source` at all (an action filter names
    /// one of them).
    pub fn reads(&self, source: AuditSource) -> bool {
        match self.action {
            None => true,
            Some(action) => (action.event_kind().is_some()) == (source == AuditSource::History),
        }
    }

    /// The stored kind a history query is limited to, if the filter names
    /// a task action.
    pub fn history_kind(&self) -> Option<&'static str> {
        self.action.and_then(AuditAction::event_kind).map(EventKind::as_str)
    }

    /// The lowest time listed, in epoch milliseconds.
    pub fn since_millis(&self) -> i64 {
        self.since.map_or(i64::MIN, Timestamp::as_millis)
    }
}

/// Merges the newest-first pages a backend read from each source (each at
/// most `limit` long) into the listing's page.
pub fn merge(mut history: Vec<AuditEntry>, table: Vec<AuditEntry>, limit: u32) -> Vec<AuditEntry> {
    history.extend(table);
    history.sort_by_key(|entry| std::cmp::Reverse(entry.cursor));
    history.truncate(limit as usize);
    history
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(at: i64, source: AuditSource, id: i64) -> AuditCursor {
        AuditCursor { at: Timestamp::from_millis(at), source, id }
    }

    #[test]
    fn cursors_round_trip_as_text() {
        for c in [cursor(0, AuditSource::Table, 1), cursor(1_764_300_000_000, AuditSource::History, 987_654)] {
            assert_eq!(c.to_string().parse::<AuditCursor>(), Ok(c));
        }
        for bad in ["", "12", "12.x3", "12.a", "a.h1", "12.h1.2"] {
            assert!(bad.parse::<AuditCursor>().is_err(), "{bad:?} is refused");
        }
    }

    #[test]
    fn bounds_list_exactly_what_sorts_after_the_cursor() {
        // Every (source, id) at one millisecond, in newest-first order.
        let order = [
            cursor(5, AuditSource::History, 9),
            cursor(5, AuditSource::History, 2),
            cursor(5, AuditSource::Table, 7),
            cursor(5, AuditSource::Table, 3),
        ];
        for (index, after) in order.iter().enumerate() {
            for source in [AuditSource::History, AuditSource::Table] {
                let (at_max, id_below) = AuditCursor::bounds(Some(*after), source);
                let listed: Vec<&AuditCursor> =
                    order.iter().filter(|c| c.source == source && (c.at.as_millis() < at_max || c.id < id_below)).collect();
                let expected: Vec<&AuditCursor> = order[index + 1..].iter().filter(|c| c.source == source).collect();
                assert_eq!(listed, expected, "after {after:?} from {source:?}");
            }
        }
    }

    #[test]
    fn actions_parse_and_task_actions_map_to_history_kinds() {
        for action in AuditAction::ALL {
            assert_eq!(action.as_str().parse::<AuditAction>(), Ok(*action));
            if let Some(kind) = action.event_kind() {
                assert_eq!(AuditAction::of_event(kind), Some(*action));
                assert!(HISTORY_KINDS.contains(&kind.as_str()), "{kind:?} is one of the indexed kinds");
            }
        }
        let mapped = AuditAction::ALL.iter().filter(|a| a.event_kind().is_some()).count();
        assert_eq!(mapped, HISTORY_KINDS.len(), "every indexed kind is a task action");
        assert!("task.explode".parse::<AuditAction>().unwrap_err().contains("task.cancel"));
    }
}
