//! Live status: server-sent event streams of task events.
//!
//! - `GET /v1/tasks/{id}/events`: that task's history, then its events as
//!   they happen; after the task reaches a terminal state the stream sends
//!   one `end` event (`{"task_id", "state"}`) and closes.
//! - `GET /v1/events`: every task's events, optionally only of one workflow
//!   or of some kinds; it stays open.
//!
//! Each event's SSE `id` is its `seq`, the store's global event order, and
//! its data is an [`EventView`]. A client that reconnects with
//! `Last-Event-ID` (browsers do it by themselves) gets only the events after
//! that one; `?after=SEQ` does the same for clients that cannot set headers.
//!
//! The streams poll the store (`history` per task, `events_after` for all)
//! every [`Limits::events_poll_interval`](crate::Limits), so they work the
//! same whichever process made the change, on every backend; an idle stream
//! sends a keep-alive comment every `events_keep_alive`. Streams end when
//! the server shuts down.
//!
//! Deliberately left out: webhooks (the other way to follow a task, in `webhooks`), and a push
//! notification from the store that would replace the polling.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::Stream;
use rota_model::{TaskId, WorkflowName};
use rota_store::EventKind;
use serde_json::json;
use tokio::sync::watch;

use crate::ApiState;
use crate::error::{ApiError, ApiPath, ApiQuery, ApiResult, ErrorBody};
use crate::tasks::task_id;
use crate::wire::{EventView, EventsQuery, TaskEventsQuery, TaskPath};

/// The header a reconnecting client sends with the last event id it saw.
pub const LAST_EVENT_ID: &str = "last-event-id";

/// How many tasks' workflows the all-tasks stream remembers (for its
/// workflow filter) before it starts over.
const WORKFLOW_CACHE_MAX: usize = 10_000;

/// The position to resume after: `Last-Event-ID`, else `?after=`, else the start.
fn resume_after(headers: &HeaderMap, after: Option<i64>) -> ApiResult<i64> {
    let from_header = match headers.get(LAST_EVENT_ID) {
        None => None,
        Some(value) => {
            let text = value.to_str().map_err(|_| ApiError::invalid_header("Last-Event-ID", "not visible ASCII"))?.trim();
            let seq = text.parse::<i64>().ok().filter(|seq| *seq >= 0).ok_or_else(|| {
                ApiError::invalid_header("Last-Event-ID", format!("expected an event seq (a whole number), got {text:?}"))
            })?;
            Some(seq)
        }
    };
    if let Some(after) = after
        && after < 0
    {
        return Err(ApiError::invalid_query("after", format!("must be at least 0, got {after}")));
    }
    Ok(from_header.or(after).unwrap_or(0))
}

fn sse_event(event: &rota_store::Event) -> SseEvent {
    let data = serde_json::to_string(&EventView::from(event)).expect("events serialize");
    SseEvent::default().id(event.seq.to_string()).data(data)
}

/// Waits one poll interval; false when the server is closing.
async fn pause(state: &ApiState, closing: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(state.limits().events_poll_interval) => true,
        _ = closing.wait_for(|closing| *closing) => false,
    }
}

/// A task's events as server-sent events: history first, then live, until it ends.
#[utoipa::path(
    get, path = "/v1/tasks/{id}/events", tag = "events",
    params(
        TaskPath,
        ("Last-Event-ID" = Option<i64>, Header, description = "Resume after this event seq", minimum = 0),
        TaskEventsQuery,
    ),
    responses(
        (status = 200, description = "An event stream: one `message` per event (id = seq, data = an EventView), then an `end` event once the task is terminal", content_type = "text/event-stream", body = String),
        (status = 400, description = "Invalid id, Last-Event-ID or after", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn task_events(
    State(state): State<ApiState>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    ApiPath(TaskPath { id }): ApiPath<TaskPath>,
    ApiQuery(query): ApiQuery<TaskEventsQuery>,
    headers: HeaderMap,
) -> ApiResult<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>> {
    let id = task_id(id)?;
    let after = resume_after(&headers, query.after)?;
    state.client().record(&id).await.map_err(|err| ApiError::ops("task events", err))?;
    crate::tasks::check_visible(&state, &crate::tasks::caller_of(caller), "task events", &id).await?;
    let keep_alive = KeepAlive::new().interval(state.limits().events_keep_alive);
    let closing = state.closing();
    let stream = TaskStream { state, id, after, pending: VecDeque::new(), ended: false, polled: false, closing };
    Ok(Sse::new(futures_util::stream::unfold(stream, TaskStream::next)).keep_alive(keep_alive))
}

struct TaskStream {
    state: ApiState,
    id: TaskId,
    after: i64,
    pending: VecDeque<SseEvent>,
    ended: bool,
    polled: bool,
    closing: watch::Receiver<bool>,
}

impl TaskStream {
    async fn next(mut self) -> Option<(Result<SseEvent, Infallible>, Self)> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some((Ok(event), self));
            }
            if self.ended || *self.closing.borrow() {
                return None;
            }
            if self.polled && !pause(&self.state, &mut self.closing).await {
                return None;
            }
            self.polled = true;
            if let Err(err) = self.poll().await {
                tracing::warn!("event stream of task {}: {err}", self.id);
            }
        }
    }

    /// Reads the task, then its history: when the task was terminal at the
    /// first read, the history read after it holds every event up to the end.
    async fn poll(&mut self) -> rota_store::Result<()> {
        let store = self.state.store();
        let Some(record) = store.task(&self.id).await? else {
            self.ended = true;
            return Ok(());
        };
        for event in store.history(&self.id).await? {
            if event.seq > self.after {
                self.after = event.seq;
                self.pending.push_back(sse_event(&event));
            }
        }
        if record.task.state.is_terminal() {
            let data = json!({ "task_id": self.id.as_str(), "state": record.task.state.as_str() }).to_string();
            self.pending.push_back(SseEvent::default().event("end").data(data));
            self.ended = true;
        }
        Ok(())
    }
}

/// Every task's events as server-sent events, optionally filtered.
#[utoipa::path(
    get, path = "/v1/events", tag = "events",
    params(
        ("Last-Event-ID" = Option<i64>, Header, description = "Resume after this event seq", minimum = 0),
        EventsQuery,
    ),
    responses(
        (status = 200, description = "An event stream: one `message` per event (id = seq, data = an EventView); it stays open", content_type = "text/event-stream", body = String),
        (status = 400, description = "Invalid filter, Last-Event-ID or after", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn all_events(
    State(state): State<ApiState>,
    ApiQuery(query): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> ApiResult<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>> {
    let after = resume_after(&headers, query.after)?;
    let workflow = query.workflow.map(WorkflowName::new).transpose().map_err(|err| ApiError::invalid_query("workflow", err))?;
    let kinds = match query.kind {
        None => None,
        Some(list) => Some(
            list.split(',')
                .map(|name| {
                    EventKind::parse(name.trim()).ok_or_else(|| {
                        let known: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
                        ApiError::invalid_query("kind", format!("unknown event kind {name:?} (known: {})", known.join(", ")))
                    })
                })
                .collect::<ApiResult<Vec<EventKind>>>()?,
        ),
    };
    let keep_alive = KeepAlive::new().interval(state.limits().events_keep_alive);
    let closing = state.closing();
    let stream = AllStream {
        state,
        after,
        workflow,
        kinds,
        workflow_of: HashMap::new(),
        pending: VecDeque::new(),
        drained: false,
        polled: false,
        closing,
    };
    Ok(Sse::new(futures_util::stream::unfold(stream, AllStream::next)).keep_alive(keep_alive))
}

struct AllStream {
    state: ApiState,
    after: i64,
    workflow: Option<WorkflowName>,
    kinds: Option<Vec<EventKind>>,
    workflow_of: HashMap<TaskId, Option<WorkflowName>>,
    pending: VecDeque<SseEvent>,
    /// Whether the last read returned less than a batch (so the next waits).
    drained: bool,
    polled: bool,
    closing: watch::Receiver<bool>,
}

impl AllStream {
    async fn next(mut self) -> Option<(Result<SseEvent, Infallible>, Self)> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some((Ok(event), self));
            }
            if *self.closing.borrow() {
                return None;
            }
            if self.polled && self.drained && !pause(&self.state, &mut self.closing).await {
                return None;
            }
            self.polled = true;
            if let Err(err) = self.poll().await {
                self.drained = true;
                tracing::warn!("event stream of all tasks: {err}");
            }
        }
    }

    async fn poll(&mut self) -> rota_store::Result<()> {
        let batch = self.state.limits().events_batch_max;
        let events = self.state.store().events_after(self.after, batch).await?;
        self.drained = (events.len() as u64) < u64::from(batch);
        for event in events {
            // The position moves only once the event is decided, so that a
            // failed lookup reads it again on the next poll.
            let wanted = self.wants(&event).await?;
            self.after = self.after.max(event.seq);
            if wanted {
                self.pending.push_back(sse_event(&event));
            }
        }
        Ok(())
    }

    async fn wants(&mut self, event: &rota_store::Event) -> rota_store::Result<bool> {
        if self.kinds.as_ref().is_some_and(|kinds| !kinds.contains(&event.kind)) {
            return Ok(false);
        }
        match self.workflow.clone() {
            None => Ok(true),
            Some(wanted) => Ok(self.workflow_of(&event.task_id).await?.as_ref() == Some(&wanted)),
        }
    }

    /// The workflow of a task, remembered (a task never changes workflow).
    async fn workflow_of(&mut self, id: &TaskId) -> rota_store::Result<Option<WorkflowName>> {
        if let Some(found) = self.workflow_of.get(id) {
            return Ok(found.clone());
        }
        let workflow = self.state.store().task(id).await?.map(|record| record.task.workflow);
        if self.workflow_of.len() >= WORKFLOW_CACHE_MAX {
            self.workflow_of.clear();
        }
        self.workflow_of.insert(id.clone(), workflow.clone());
        Ok(workflow)
    }
}
