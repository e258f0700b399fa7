//! What the operator commands print: one JSON shape per record (for
//! `--json` and for `consume`'s JSON lines) and plain aligned tables for
//! people. Times are RFC 3339 in UTC with milliseconds in both.
//!
//! The JSON shapes are the CLI's own, not the HTTP API's wire types (their
//! times are RFC 3339, and some fields are named for people): they are
//! built here from store records or from the API's views (which the
//! operator commands get from either backend), and only ever serialized,
//! except that `status` prints its text from its JSON shape, so that both
//! show the same fields.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::{Duration, UNIX_EPOCH};

use rota_api::wire::{
    AlertView, BreakerView, ChildView, DeadLetterView, EventView, ParentView, QueueView, StepView, TaskSummary, TaskView,
    WorkflowPauseView, WorkflowView,
};
use rota_model::{QueueName, StepState, TaskState, Timestamp};
use rota_store::Delivery;
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// How many characters of a body a table shows before cutting it.
const TABLE_BODY_CHARS_MAX: usize = 60;

/// A timestamp as RFC 3339 in UTC, with milliseconds.
pub fn rfc3339(at: Timestamp) -> String {
    let millis = u64::try_from(at.as_millis()).unwrap_or(0);
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(millis)).to_string()
}

/// A time in epoch milliseconds (as the API's views carry it) as RFC 3339.
pub fn rfc3339_millis(millis: i64) -> String {
    rfc3339(Timestamp::from_millis(millis))
}

/// A leased message, as `receive --json` and `consume` print it.
#[derive(Serialize)]
pub struct DeliveryJson<'a> {
    queue: &'a str,
    id: &'a str,
    body: &'a RawValue,
    lease_token: String,
    delivery_count: u32,
    enqueued_at: String,
    lease_until: String,
    ordering_key: Option<&'a str>,
    reply_to: Option<&'a str>,
    correlation_id: Option<&'a str>,
}

impl<'a> From<&'a Delivery> for DeliveryJson<'a> {
    fn from(delivery: &'a Delivery) -> Self {
        DeliveryJson {
            queue: delivery.queue.as_str(),
            id: delivery.id.as_str(),
            body: &delivery.body,
            lease_token: delivery.lease_token.to_string(),
            delivery_count: delivery.delivery_count,
            enqueued_at: rfc3339(delivery.enqueued_at),
            lease_until: rfc3339(delivery.lease_until),
            ordering_key: delivery.ordering_key.as_deref(),
            reply_to: delivery.reply_to.as_ref().map(QueueName::as_str),
            correlation_id: delivery.correlation_id.as_deref(),
        }
    }
}

/// A dead letter, as `dlq list --json` prints it.
#[derive(Serialize)]
pub struct DeadLetterJson<'a> {
    queue: &'a str,
    id: &'a str,
    body: &'a Value,
    reason: &'a str,
    delivery_count: u32,
    enqueued_at: String,
    dead_lettered_at: String,
    ordering_key: Option<&'a str>,
    reply_to: Option<&'a str>,
    correlation_id: Option<&'a str>,
}

impl<'a> From<&'a DeadLetterView> for DeadLetterJson<'a> {
    fn from(letter: &'a DeadLetterView) -> Self {
        DeadLetterJson {
            queue: &letter.queue,
            id: &letter.id,
            body: &letter.body,
            reason: &letter.reason,
            delivery_count: letter.delivery_count,
            enqueued_at: rfc3339_millis(letter.enqueued_at),
            dead_lettered_at: rfc3339_millis(letter.dead_lettered_at),
            ordering_key: letter.ordering_key.as_deref(),
            reply_to: letter.reply_to.as_deref(),
            correlation_id: letter.correlation_id.as_deref(),
        }
    }
}

/// One queue's counts, as `queue stats --json` prints them.
#[derive(Serialize)]
pub struct StatsJson<'a> {
    queue: &'a str,
    ready: u64,
    leased: u64,
    delayed: u64,
    dead_lettered: u64,
    paused: bool,
    oldest_ready_at: Option<String>,
}

impl<'a> From<&'a QueueView> for StatsJson<'a> {
    fn from(stats: &'a QueueView) -> Self {
        StatsJson {
            queue: &stats.queue,
            ready: stats.ready,
            leased: stats.leased,
            delayed: stats.delayed,
            dead_lettered: stats.dead_lettered,
            paused: stats.paused,
            oldest_ready_at: stats.oldest_ready_at.map(rfc3339_millis),
        }
    }
}

/// A task as `tasks --json` lists it (without input and output; `status`
/// shows those).
#[derive(Serialize)]
pub struct TaskSummaryJson<'a> {
    id: &'a str,
    workflow: &'a str,
    version: u32,
    state: TaskState,
    locked_by: Option<&'a str>,
    complete_by: Option<String>,
    failure_count: u32,
    at_risk_since: Option<String>,
    paused: bool,
    error: Option<&'a str>,
    tags: &'a BTreeMap<String, String>,
    priority: i32,
    created_at: String,
    updated_at: String,
}

impl<'a> From<&'a TaskSummary> for TaskSummaryJson<'a> {
    fn from(task: &'a TaskSummary) -> Self {
        TaskSummaryJson {
            id: &task.id,
            workflow: &task.workflow,
            version: task.version,
            state: TaskState::from(task.state),
            locked_by: task.locked_by.as_deref(),
            complete_by: task.complete_by.map(rfc3339_millis),
            failure_count: task.failure_count,
            at_risk_since: task.at_risk_since.map(rfc3339_millis),
            paused: task.paused,
            error: task.error.as_deref(),
            tags: &task.tags,
            priority: task.priority,
            created_at: rfc3339_millis(task.created_at),
            updated_at: rfc3339_millis(task.updated_at),
        }
    }
}

/// A task with its steps, history and the breakers that are not closed, as
/// `status --json` prints it.
#[derive(Serialize)]
pub struct StatusJson<'a> {
    pub id: &'a str,
    pub workflow: &'a str,
    pub version: u32,
    pub state: TaskState,
    pub paused: bool,
    pub workflow_paused: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<&'a str>,
    pub locked_by: Option<&'a str>,
    pub lease_epoch: u64,
    pub complete_by: Option<String>,
    pub warn_at: Option<String>,
    pub at_risk_since: Option<String>,
    pub not_before: String,
    pub failure_count: u32,
    pub max_failures: Option<u32>,
    pub error: Option<&'a str>,
    pub input: &'a Value,
    pub output: Option<&'a Value>,
    pub reply_to: Option<&'a str>,
    pub reply_queue: Option<&'a str>,
    pub submitter: Option<&'a str>,
    pub tags: &'a BTreeMap<String, String>,
    pub priority: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<&'a ParentView>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub children: &'a [ChildView],
    pub created_at: String,
    pub updated_at: String,
    pub steps: Vec<StepJson<'a>>,
    pub history: Vec<EventJson<'a>>,
    pub breakers: Vec<BreakerJson>,
}

/// One step of a task, in `status --json`.
#[derive(Serialize)]
pub struct StepJson<'a> {
    pub name: &'a str,
    pub position: u32,
    pub agent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waits_for: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub when: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub callback: bool,
    pub state: StepState,
    pub attempts: u32,
    pub complete_by: Option<String>,
    pub warn_at: Option<String>,
    pub not_before: String,
    pub owner: Option<&'a str>,
    pub input: Option<&'a Value>,
    pub output: Option<&'a Value>,
    pub last_error: Option<&'a str>,
    pub updated_at: String,
}

impl<'a> StatusJson<'a> {
    /// A task as the API shows it, its history, and the breakers to show.
    pub fn new(task: &'a TaskView, history: &'a [EventView], breakers: Vec<BreakerJson>) -> Self {
        StatusJson {
            id: &task.id,
            workflow: &task.workflow,
            version: task.version,
            state: TaskState::from(task.state),
            paused: task.paused,
            workflow_paused: task.workflow_paused,
            concurrency_key: task.concurrency_key.as_deref(),
            waiting_for: task.waiting_for.as_deref(),
            locked_by: task.locked_by.as_deref(),
            lease_epoch: task.lease_epoch,
            complete_by: task.complete_by.map(rfc3339_millis),
            warn_at: task.warn_at.map(rfc3339_millis),
            at_risk_since: task.at_risk_since.map(rfc3339_millis),
            not_before: rfc3339_millis(task.not_before),
            failure_count: task.failure_count,
            max_failures: task.max_failures,
            error: task.error.as_deref(),
            input: &task.input,
            output: task.output.as_ref(),
            reply_to: task.callback_url.as_deref(),
            reply_queue: task.reply_queue.as_deref(),
            submitter: task.submitter.as_deref(),
            tags: &task.tags,
            priority: task.priority,
            parent: task.parent.as_ref(),
            children: &task.children,
            created_at: rfc3339_millis(task.created_at),
            updated_at: rfc3339_millis(task.updated_at),
            steps: task.steps.iter().map(StepJson::from).collect(),
            history: history.iter().map(EventJson::from).collect(),
            breakers,
        }
    }
}

impl<'a> From<&'a StepView> for StepJson<'a> {
    fn from(step: &'a StepView) -> Self {
        StepJson {
            name: &step.name,
            position: step.position,
            agent: step.agent.as_deref(),
            waits_for: step.waits_for.as_deref(),
            workflow: step.workflow.as_deref(),
            when: step.when.as_deref(),
            callback: step.callback,
            state: StepState::from(step.state),
            attempts: step.attempt,
            complete_by: step.complete_by.map(rfc3339_millis),
            warn_at: step.warn_at.map(rfc3339_millis),
            not_before: rfc3339_millis(step.not_before),
            owner: step.owner.as_deref(),
            input: step.input.as_ref(),
            output: step.output.as_ref(),
            last_error: step.last_error.as_deref(),
            updated_at: rfc3339_millis(step.updated_at),
        }
    }
}

/// One event of a task's history, in `status --json`.
#[derive(Serialize)]
pub struct EventJson<'a> {
    pub seq: i64,
    pub at: String,
    pub kind: &'a str,
    pub step: Option<&'a str>,
    pub attempt: Option<u32>,
    pub detail: &'a Value,
}

impl<'a> From<&'a EventView> for EventJson<'a> {
    fn from(event: &'a EventView) -> Self {
        EventJson {
            seq: event.seq,
            at: rfc3339_millis(event.at),
            kind: &event.kind,
            step: event.step.as_deref(),
            attempt: event.attempt,
            detail: &event.detail,
        }
    }
}

/// A circuit breaker, shared or as `rota serve` reported it.
#[derive(Serialize)]
pub struct BreakerJson {
    pub endpoint: String,
    pub agent: Option<String>,
    pub state: String,
    pub consecutive_failures: Option<u64>,
    pub open_until: Option<String>,
    pub instance: Option<String>,
    pub reported_at: String,
    pub shared: bool,
    pub probe_holder: Option<String>,
    pub probe_until: Option<String>,
}

impl From<&BreakerView> for BreakerJson {
    fn from(breaker: &BreakerView) -> Self {
        BreakerJson {
            endpoint: breaker.endpoint.clone(),
            agent: breaker.agent.clone(),
            state: breaker.state.clone(),
            consecutive_failures: breaker.consecutive_failures,
            open_until: breaker.open_until.map(rfc3339_millis),
            instance: breaker.instance.clone(),
            reported_at: rfc3339_millis(breaker.reported_at),
            shared: breaker.shared,
            probe_holder: breaker.probe_holder.clone(),
            probe_until: breaker.probe_until.map(rfc3339_millis),
        }
    }
}

/// An alert, as `alerts --json` lists it.
#[derive(Serialize)]
pub struct AlertJson<'a> {
    seq: i64,
    task_id: &'a str,
    at: String,
    reason: &'a str,
    step: Option<&'a str>,
    detail: &'a Value,
}

impl<'a> From<&'a AlertView> for AlertJson<'a> {
    fn from(alert: &'a AlertView) -> Self {
        AlertJson {
            seq: alert.seq,
            task_id: &alert.task_id,
            at: rfc3339_millis(alert.at),
            reason: &alert.reason,
            step: alert.step.as_deref(),
            detail: &alert.detail,
        }
    }
}

/// A registered workflow, as `workflows --json` lists it.
#[derive(Serialize)]
pub struct WorkflowJson<'a> {
    name: &'a str,
    version: u32,
    registered_at: Option<String>,
    steps: Vec<WorkflowStepJson<'a>>,
    paused: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pause: Option<WorkflowPauseJson<'a>>,
}

/// A workflow's latest pause or resume, in `workflows --json`.
#[derive(Serialize)]
pub struct WorkflowPauseJson<'a> {
    paused: bool,
    by: &'a str,
    reason: Option<&'a str>,
    at: String,
}

impl<'a> From<&'a WorkflowPauseView> for WorkflowPauseJson<'a> {
    fn from(pause: &'a WorkflowPauseView) -> Self {
        WorkflowPauseJson { paused: pause.paused, by: &pause.by, reason: pause.reason.as_deref(), at: rfc3339_millis(pause.at) }
    }
}

/// One step of a workflow, in `workflows --json`.
#[derive(Serialize)]
pub struct WorkflowStepJson<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    agent: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    waits_for: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    when: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    callback: bool,
    depends_on: &'a [String],
}

impl<'a> From<&'a WorkflowView> for WorkflowJson<'a> {
    fn from(workflow: &'a WorkflowView) -> Self {
        WorkflowJson {
            name: &workflow.name,
            version: workflow.version,
            registered_at: workflow.registered_at.map(rfc3339_millis),
            steps: workflow
                .steps
                .iter()
                .map(|step| WorkflowStepJson {
                    name: &step.name,
                    agent: step.agent.as_deref(),
                    waits_for: step.waits_for.as_deref(),
                    when: step.when.as_deref(),
                    callback: step.callback,
                    depends_on: &step.depends_on,
                })
                .collect(),
            paused: workflow.paused,
            pause: workflow.pause.as_ref().map(WorkflowPauseJson::from),
        }
    }
}

/// Writes `text` and a newline to stdout and flushes, so that a reader of a
/// pipe sees each line as soon as it is printed.
pub fn line(text: &str) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{text}")?;
    stdout.flush()
}

/// Prints `value` as pretty JSON.
pub fn json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    line(&text)?;
    Ok(())
}

/// A body cut to fit a table cell.
pub fn body_cell(body: &RawValue) -> String {
    text_cell(body.get())
}

/// A JSON value (a dead letter's body) cut to fit a table cell.
pub fn value_cell(value: &Value) -> String {
    text_cell(&value.to_string())
}

fn text_cell(text: &str) -> String {
    if text.chars().count() <= TABLE_BODY_CHARS_MAX {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(TABLE_BODY_CHARS_MAX - 1).collect();
    cut.push('…');
    cut
}

/// Renders rows under headers, columns padded to their widest cell. The last
/// column is not padded, so long bodies and reasons do not leave trailing
/// blanks.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|header| header.chars().count()).collect();
    for row in rows {
        debug_assert_eq!(row.len(), headers.len());
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let headers: Vec<String> = headers.iter().map(|header| (*header).to_owned()).collect();
    for row in std::iter::once(&headers).chain(rows) {
        let last = row.len().saturating_sub(1);
        for (column, cell) in row.iter().enumerate() {
            if column == last {
                out.push_str(cell);
            } else {
                let pad = widths[column] - cell.chars().count();
                out.push_str(cell);
                out.extend(std::iter::repeat_n(' ', pad + 2));
            }
        }
        out.push('\n');
    }
    out.pop();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_leave_the_last_one_ragged() {
        let rows = vec![vec!["a".to_owned(), "1".to_owned(), "x".to_owned()], vec!["bbb".to_owned(), "22".to_owned(), "yy".to_owned()]];
        assert_eq!(table(&["NAME", "N", "BODY"], &rows), "NAME  N   BODY\na     1   x\nbbb   22  yy");
    }

    #[test]
    fn times_are_rfc3339_utc_with_millis() {
        assert_eq!(rfc3339(Timestamp::from_millis(1_767_225_600_123)), "2026-01-01T00:00:00.123Z");
    }

    #[test]
    fn long_bodies_are_cut() {
        let body = RawValue::from_string(format!("\"{}\"", "x".repeat(100))).unwrap();
        assert_eq!(body_cell(&body).chars().count(), TABLE_BODY_CHARS_MAX);
    }
}
