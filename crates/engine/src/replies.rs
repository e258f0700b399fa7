//! Response queues: a task submitted with a `reply_queue` has each of its
//! status events sent to that durable queue as a [`StatusMessage`], in the
//! same commit that records the event, with the task id as correlation id
//! and ordering key. The application reads them with the ordinary peek-lock
//! receive, in order per task, and loses nothing while it is down: the
//! messages wait in the queue.
//!
//! Every commit the engine makes goes through [`commit`] (and every
//! submission through [`attach_new`], in `Client::prepare`), which adds the messages for the
//! events it carries: an event site cannot forget them. Deadline warnings,
//! which write no task, get theirs from [`for_warning`], sent by the store
//! in the transaction that appends the `at_risk` event. Which kinds are
//! status events is one `match` ([`is_status`]).
//!
//! Deliberately left out: events the store writes by itself (`claimed`,
//! from `claim_tasks`), which are not status events; delivery anywhere but
//! a queue of the same store (webhooks are `webhooks.rs`).

use rota_model::{QueueName, Task, TaskId, TaskState};
use rota_store::{Changes, Event, EventKind, NewTask, Outgoing, SharedStore};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The largest task output, as JSON text, a status message carries; a
/// larger one is left out (`output_omitted`) and read from the task, so
/// that a status message never outgrows a store's body bound (256 KiB by
/// default) and blocks the commit it belongs to.
pub const OUTPUT_BYTES_MAX: usize = 64 * 1024;

/// The longest error text a status message carries, in bytes; a longer
/// one is cut at a character boundary.
pub const ERROR_BYTES_MAX: usize = 4 * 1024;

/// Queue-name prefixes the engine's own queues use: a reply queue may not
/// start with one (status messages would land in a Scheduler's inbox or an
/// agent's queue).
pub const RESERVED_PREFIXES: [&str; 2] = ["rota.", "agent."];

/// Whether events of `kind` are status events, sent to the task's reply
/// queue. Exhaustive on purpose: a new kind must be decided here.
pub fn is_status(kind: EventKind) -> bool {
    use EventKind::*;
    match kind {
        // A deadline warning (`at_risk`) writes no task: its messages are
        // made by [`for_warning`] and sent by `Tasks::raise_warning`.
        Received | StepCompleted | StepSkipped | Processed | Error | Compensated | Cancelled | AtRisk => true,
        Claimed | StepStarted | StepFailed | Expired | CompensationStarted | StepCompensated | Resubmitted | Released | Alert | Signal
        | Callback => false,
        // An operator's pause and resume hold and release the task's own
        // moves; like a resubmit, they are no news of its progress.
        Paused | Resumed => false,
        // The task had already finished (its end was the news).
        CallStopped => false,
    }
}

/// Checks a reply queue named in a submission; the error says why it is
/// refused (the caller names the field).
pub fn check_reply_queue(queue: &QueueName) -> Result<(), String> {
    match RESERVED_PREFIXES.iter().find(|prefix| queue.as_str().starts_with(*prefix)) {
        Some(prefix) => Err(format!("\"{queue}\" is reserved: names starting with {prefix:?} are the engine's own queues")),
        None => Ok(()),
    }
}

/// The body of a message sent to a reply queue: one status event of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusMessage {
    /// The task's id: what the application correlates the result with.
    pub correlation_id: TaskId,
    /// The event's kind (`received`, `step_completed`, `processed`, ...).
    pub event: String,
    /// The step concerned, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// The step's attempt concerned, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// When it happened (epoch ms).
    pub at: i64,
    /// The event's detail, as in the task's history.
    pub detail: Value,
    /// The task's state once the commit carrying the event is applied.
    pub state: TaskState,
    /// The task's output, when it ended Processed (and the output fits in
    /// [`OUTPUT_BYTES_MAX`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Set when the output was too large to carry: read it from the task.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_omitted: bool,
    /// The task's error, when it ended in Error, Compensated or Cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl StatusMessage {
    /// The message for `event`, about `task` as the event's commit leaves it.
    pub fn new(task: &Task, event: &Event) -> StatusMessage {
        let output = task.output.as_ref().filter(|_| task.state == TaskState::Processed);
        let fits = output.filter(|o| o.to_string().len() <= OUTPUT_BYTES_MAX);
        let ended_badly = matches!(task.state, TaskState::Error | TaskState::Compensated | TaskState::Cancelled);
        StatusMessage {
            correlation_id: task.id.clone(),
            event: event.kind.as_str().to_owned(),
            step: event.step.as_ref().map(|s| s.to_string()),
            attempt: event.attempt,
            at: event.at.as_millis(),
            detail: event.detail.clone(),
            state: task.state,
            output: fits.cloned(),
            output_omitted: output.is_some() && fits.is_none(),
            error: task.error.as_deref().filter(|_| ended_badly).map(cut),
        }
    }

    fn outgoing(&self) -> Outgoing {
        Outgoing::json(self).expect("status messages serialize").with_ordering_key(self.correlation_id.as_str())
    }
}

fn cut(text: &str) -> String {
    let mut end = text.len().min(ERROR_BYTES_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// Adds to `changes` a message for each status event it appends about a
/// task with a reply queue, after the other messages, in event order.
///
/// A status event is appended only with a write of its task (every move
/// that reports one moves the task): the written record says where to send
/// and the state to report.
pub fn attach(changes: &mut Changes) {
    let mut messages = Vec::new();
    for event in changes.events.iter().filter(|e| is_status(e.kind)) {
        let task = changes.tasks.iter().map(|w| &w.task).find(|t| t.id == event.task_id);
        let task = task.unwrap_or_else(|| {
            panic!("a {} event of task {} is committed without a write of its task", event.kind.as_str(), event.task_id)
        });
        if let Some(queue) = &task.reply_queue {
            messages.push((queue.clone(), StatusMessage::new(task, event).outgoing()));
        }
        if let Some(ended) = child_ended(task, event) {
            messages.push(ended);
        }
    }
    changes.send.extend(messages);
}

/// The [`ChildEnded`](crate::protocol::ChildEnded) message that the event
/// ending a child workflow's task sends, in the same commit: the parent's
/// wakeup is lost only if the end is.
fn child_ended(task: &Task, event: &Event) -> Option<(QueueName, Outgoing)> {
    let parent = task.parent.as_ref()?;
    let ends = matches!(event.kind, EventKind::Processed | EventKind::Error | EventKind::Compensated | EventKind::Cancelled);
    if !ends || !task.state.is_terminal() || event.step.is_some() {
        return None;
    }
    let ended = crate::protocol::ChildEnded {
        child: task.id.clone(),
        parent: parent.task.clone(),
        step: parent.step.clone(),
        attempt: parent.attempt,
    };
    let outgoing = Outgoing::json(&ended).expect("child ends serialize").with_ordering_key(parent.task.as_str());
    Some((crate::protocol::children_queue(), outgoing))
}

/// The messages for the status events among a deadline warning's
/// `events` about `task` (as read when the warning was found), for
/// `Tasks::raise_warning` to send in the transaction that appends the
/// events: a warning writes no task, so [`attach`] never sees it.
pub fn for_warning(task: &Task, events: &[Event]) -> Vec<(QueueName, Outgoing)> {
    let Some(queue) = &task.reply_queue else { return Vec::new() };
    events
        .iter()
        .filter(|e| is_status(e.kind) && e.task_id == task.id)
        .map(|e| (queue.clone(), StatusMessage::new(task, e).outgoing()))
        .collect()
}

/// As [`attach`], for a task's creation.
pub fn attach_new(new: &mut NewTask) {
    let Some(queue) = new.task.reply_queue.clone() else { return };
    for event in new.events.iter().filter(|e| is_status(e.kind)) {
        new.messages.push((queue.clone(), StatusMessage::new(&new.task, event).outgoing()));
    }
}

/// Commits `changes` with their status messages ([`attach`]) and the
/// doorbells of the concurrency slots they free ([`ring_for_freed_slots`]):
/// the one way the engine commits.
pub async fn commit(store: &SharedStore, mut changes: Changes) -> rota_store::Result<()> {
    attach(&mut changes);
    ring_for_freed_slots(&mut changes);
    store.commit(changes).await
}

/// Adds a doorbell for each task with a concurrency key that `changes`
/// end: the write frees the task's slot, and the doorbell wakes a Scheduler
/// to claim the key's next waiting task at once rather than at its next
/// fallback claim. Sent in the same commit, so a slot is never freed
/// without one.
pub fn ring_for_freed_slots(changes: &mut Changes) {
    let ended = changes
        .tasks
        .iter()
        .filter(|w| w.task.concurrency.is_some() && w.task.state.is_terminal() && !w.expected_state.is_terminal())
        .map(|w| crate::client::doorbell(&w.task.id))
        .collect::<Vec<_>>();
    changes.send.extend(ended);
}

#[cfg(test)]
mod tests {
    use rota_model::{Step, StepName, Timestamp, WorkflowName};
    use rota_store::TaskWrite;
    use serde_json::json;

    use super::*;

    fn task(state: TaskState, reply_queue: Option<&str>) -> Task {
        let mut task = Task::new(TaskId::new("t-1").unwrap(), WorkflowName::new("order").unwrap(), 1, json!({}), Timestamp::from_millis(5));
        task.state = state;
        task.reply_queue = reply_queue.map(|q| QueueName::new(q).unwrap());
        task
    }

    fn changes(after: Task, kinds: &[EventKind]) -> Changes {
        let before = task(TaskState::Processing, after.reply_queue.as_ref().map(QueueName::as_str));
        let step = Step::new(after.id.clone(), StepName::new("charge").unwrap(), 0, Timestamp::from_millis(5));
        let events = kinds.iter().map(|k| Event::step(&step, Timestamp::from_millis(9), *k, json!({ "k": k.as_str() }))).collect();
        Changes { tasks: vec![TaskWrite::replacing(&before, after)], events, ..Changes::default() }
    }

    fn bodies(changes: &Changes) -> Vec<StatusMessage> {
        changes.send.iter().map(|(_, m)| serde_json::from_str(m.body.get()).unwrap()).collect()
    }

    #[test]
    fn every_status_event_gets_a_message_in_order_keyed_by_task() {
        let mut after = task(TaskState::Processed, Some("shop.replies"));
        after.output = Some(json!({ "total": 3 }));
        let mut c = changes(after, &[EventKind::StepStarted, EventKind::StepCompleted, EventKind::Processed, EventKind::Alert]);
        attach(&mut c);
        let sent: Vec<_> = c.send.iter().map(|(q, m)| (q.as_str(), m.ordering_key.as_deref())).collect();
        assert_eq!(sent, [("shop.replies", Some("t-1")), ("shop.replies", Some("t-1"))]);
        let b = bodies(&c);
        assert_eq!(b.iter().map(|m| m.event.as_str()).collect::<Vec<_>>(), ["step_completed", "processed"]);
        assert_eq!(b[1].output, Some(json!({ "total": 3 })));
        assert_eq!((b[1].state, b[1].step.as_deref(), b[1].attempt, b[1].at), (TaskState::Processed, Some("charge"), Some(0), 9));
        assert_eq!(b[1].detail, json!({ "k": "processed" }));
        assert_eq!(b[1].correlation_id.as_str(), "t-1");
    }

    #[test]
    fn a_task_without_a_reply_queue_sends_nothing() {
        let mut c = changes(task(TaskState::Processed, None), &[EventKind::Processed]);
        attach(&mut c);
        assert!(c.send.is_empty());
    }

    #[test]
    fn errors_are_carried_when_the_task_ends_badly_and_large_outputs_are_left_out() {
        let mut failed = task(TaskState::Error, Some("q"));
        failed.error = Some("é".repeat(ERROR_BYTES_MAX));
        let mut c = changes(failed, &[EventKind::Error]);
        attach(&mut c);
        let error = bodies(&c)[0].error.clone().unwrap();
        assert!(error.len() <= ERROR_BYTES_MAX && error.len() > ERROR_BYTES_MAX - 2, "cut at a character boundary: {}", error.len());

        let mut done = task(TaskState::Processed, Some("q"));
        done.output = Some(json!("x".repeat(OUTPUT_BYTES_MAX)));
        let mut c = changes(done, &[EventKind::Processed]);
        attach(&mut c);
        let b = &bodies(&c)[0];
        assert_eq!((b.output.is_none(), b.output_omitted), (true, true));
        assert!(c.send[0].1.body.get().len() < OUTPUT_BYTES_MAX);
    }

    #[test]
    #[should_panic(expected = "without a write of its task")]
    fn a_status_event_without_its_task_write_is_a_bug() {
        let mut c = changes(task(TaskState::Processed, Some("q")), &[EventKind::Processed]);
        c.tasks.clear();
        attach(&mut c);
    }

    #[test]
    fn a_creation_reports_received() {
        let mut new = NewTask { task: task(TaskState::Pending, Some("q")), steps: vec![], messages: vec![], events: vec![] };
        new.events.push(Event::task(&new.task.id, Timestamp::from_millis(5), EventKind::Received, json!({ "workflow": "order" })));
        attach_new(&mut new);
        let b: StatusMessage = serde_json::from_str(new.messages[0].1.body.get()).unwrap();
        assert_eq!((b.event.as_str(), b.state, new.messages[0].0.as_str()), ("received", TaskState::Pending, "q"));
    }

    /// The engine commits only through [`commit`]: a new commit site that
    /// called the store directly could append status events without their
    /// messages.
    #[test]
    fn every_engine_commit_goes_through_here() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|name| name == "replies.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (number, line) in text.lines().enumerate() {
                let direct = line.contains("store.commit(");
                assert!(!direct, "{}:{}: commit through replies::commit: {line}", path.display(), number + 1);
            }
        }
    }

    #[test]
    fn engine_queues_are_refused_as_reply_queues() {
        for bad in ["rota.tasks", "rota.inbox.x", "agent.http"] {
            assert!(check_reply_queue(&QueueName::new(bad).unwrap()).is_err(), "{bad}");
        }
        assert!(check_reply_queue(&QueueName::new("shop.replies").unwrap()).is_ok());
    }

    #[test]
    fn ending_a_task_with_a_concurrency_key_rings_the_doorbell_in_the_same_commit() {
        let key = rota_model::ConcurrencyKey { key: "customer=c1".into(), limit: 1 };
        let mut ended = task(TaskState::Processed, None);
        ended.concurrency = Some(key.clone());
        let mut with_key = changes(ended, &[]);
        ring_for_freed_slots(&mut with_key);
        let queues: Vec<&str> = with_key.send.iter().map(|(q, _)| q.as_str()).collect();
        assert_eq!(queues, [crate::protocol::tasks_queue().as_str()], "one doorbell for the freed slot");

        let mut unkeyed = changes(task(TaskState::Processed, None), &[]);
        ring_for_freed_slots(&mut unkeyed);
        assert!(unkeyed.send.is_empty(), "no key, no slot to free");
        let mut running = task(TaskState::Processing, None);
        running.concurrency = Some(key);
        let mut still_running = changes(running, &[]);
        ring_for_freed_slots(&mut still_running);
        assert!(still_running.send.is_empty(), "a task that goes on keeps its slot");
    }
}
