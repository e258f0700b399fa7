//! The task endpoints: submit (the task id is the idempotency
//! key), status with steps, listing with filters, history, alerts, cancel,
//! resubmit, pause and resume. Each goes through [`rota_engine::Client`], whose operator
//! requests ([`rota_engine::ops`]) hold the rules, so that these handlers
//! only read the request and translate the answer: the same rules and the
//! same texts as the CLI on a local store.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use rota_engine::ops::Operator;
use rota_engine::{Start, Submission, ops};
use rota_model::tags::{TAGS_PER_TASK_MAX, parse_tag};
use rota_model::{InstanceId, Priority, QueueName, SignalName, StepName, Tags, TaskId, TaskState, WorkflowName};
use rota_store::{TaskFilter, TimeRange};
use serde_json::json;
use tracing::Instrument;

use crate::ApiState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ApiResult, ErrorBody};
use crate::wire::{
    AlertView, EventView, LimitQuery, OperatorRequest, PauseRequest, ResubmitRequest, SignalDelivery, SignalPath, StepPath, SubmitRequest,
    TaskCounts, TaskCountsQuery, TaskListQuery, TaskPath, TaskStateChange, TaskSummary, TaskView,
};

/// A task id from the path.
pub(crate) fn task_id(raw: String) -> ApiResult<TaskId> {
    TaskId::new(raw).map_err(|err| ApiError::invalid_path("id", err))
}

/// The view of a task after `request`, or 404 (also when `caller` may
/// not see it).
async fn view(state: &ApiState, caller: &Caller, request: &str, id: &TaskId) -> ApiResult<TaskView> {
    let detail = state.client().task(id).await.map_err(|err| ApiError::ops(request, err))?;
    if !caller.may_see(detail.record.task.submitter.as_deref()) {
        return Err(hidden(request, id));
    }
    let mut view = TaskView::from(&detail);
    view.workflow_paused = state.client().workflow_paused(&detail.record.task.workflow).await.map_err(|err| ApiError::ops(request, err))?;
    view.waiting_for = state.client().concurrency_wait(&detail.record.task).await.map_err(|err| ApiError::ops(request, err))?;
    Ok(view)
}

/// The answer about a task the caller may not see: the one about a task
/// that does not exist, so that its existence is not told either.
fn hidden(request: &str, id: &TaskId) -> ApiError {
    ApiError::ops(request, ops::Error::TaskNotFound(id.clone()))
}

/// The request's caller (anonymous on routes without authentication).
pub(crate) fn caller_of(caller: Option<Extension<Caller>>) -> Caller {
    caller.map_or_else(Caller::anonymous, |Extension(caller)| caller)
}

/// Refuses with 404, before `request` does anything, a task that `caller`
/// may not see (a confined caller and a task it did not submit).
pub(crate) async fn check_visible(state: &ApiState, caller: &Caller, request: &str, id: &TaskId) -> ApiResult<()> {
    if caller.confined_to().is_none() {
        return Ok(());
    }
    let record = state.client().record(id).await.map_err(|err| ApiError::ops(request, err))?;
    if caller.may_see(record.task.submitter.as_deref()) { Ok(()) } else { Err(hidden(request, id)) }
}

/// Submit a task.
///
/// The task id is the idempotency key: submitting an id that exists creates
/// nothing and answers 200 with the existing task (which keeps its own
/// workflow, version and input); a new task is 201.
#[utoipa::path(
    post, path = "/v1/tasks", tag = "tasks", request_body = SubmitRequest,
    responses(
        (status = 201, description = "Created", body = TaskView),
        (status = 200, description = "A task with this id already existed; nothing was created", body = TaskView),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 404, description = "The workflow (or that version of it) is not registered", body = ErrorBody),
        (status = 409, description = "The id is taken by a task of another submitter (for a token of scope submit alone)", body = ErrorBody),
        (status = 422, description = "Invalid field", body = ErrorBody),
        (status = 429, description = "The Pending backlog is at its bound (`--pending-max`): nothing was created; try again after `Retry-After`", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait before submitting again (when the backlog is counted again)"))),
    ),
    security(("bearer" = []))
)]
///
/// A W3C `traceparent` header makes the submit (and the task's trace: its
/// Scheduler decisions and agent calls) part of the caller's trace, when
/// the server exports traces.
pub async fn submit(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<SubmitRequest>,
) -> ApiResult<(StatusCode, Json<TaskView>)> {
    let span = tracing::debug_span!("rota.http.submit", workflow = %request.workflow);
    let traceparent = headers.get("traceparent").and_then(|value| value.to_str().ok());
    rota_engine::telemetry::set_parent(&span, traceparent);
    submit_traced(state, caller_of(caller), request).instrument(span).await
}

async fn submit_traced(state: ApiState, caller: Caller, request: SubmitRequest) -> ApiResult<(StatusCode, Json<TaskView>)> {
    let workflow = WorkflowName::new(request.workflow).map_err(|err| ApiError::invalid_body(format!("workflow: {err}")))?;
    if request.version == Some(0) {
        return Err(ApiError::invalid_body("version: must be at least 1"));
    }
    let id = request.id.map(TaskId::new).transpose().map_err(|err| ApiError::invalid_body(format!("id: {err}")))?;
    if let Some(url) = &request.callback_url {
        rota_engine::webhooks::check_url(url).map_err(|why| ApiError::invalid_body(format!("callback_url: {why}")))?;
    }
    let reply_queue =
        request.reply_queue.map(QueueName::new).transpose().map_err(|err| ApiError::invalid_body(format!("reply_queue: {err}")))?;
    let start = match (request.start_at.as_deref(), request.delay.as_deref()) {
        (Some(_), Some(_)) => return Err(ApiError::invalid_body("start_at and delay: give one of them, not both")),
        (Some(at), None) => {
            Start::At(rota_engine::client::parse_start_at(at).map_err(|why| ApiError::invalid_body(format!("start_at: {why}")))?)
        }
        (None, Some(delay)) => Start::After(
            humantime::parse_duration(delay.trim())
                .map_err(|err| ApiError::invalid_body(format!("delay: expected a duration such as 90s or 10m ({err}), got {delay:?}")))?,
        ),
        (None, None) => Start::Now,
    };
    let tags = Tags::new(request.tags.unwrap_or_default()).map_err(|err| ApiError::invalid_body(format!("tags: {err}")))?;
    let priority = request.priority.map(Priority::new).transpose().map_err(|err| ApiError::invalid_body(format!("priority: {err}")))?;
    let input = request.input.unwrap_or_else(|| json!({}));
    let submission = Submission {
        workflow,
        version: request.version,
        input,
        id,
        reply_to: request.callback_url,
        reply_queue,
        start,
        fired_by: None,
        submitter: caller.submitter().map(str::to_owned),
        tags,
        priority,
        // Only a `workflow:` step starts a child.
        parent: None,
    };
    let limits = state.limits();
    if let Some(pending_max) = limits.pending_max {
        state.backlog().admit(state.store(), state.clock().as_ref(), pending_max, limits.pending_recount).await?;
    }
    let submitted = state.client().submit(submission).await.map_err(|err| ApiError::ops("submit", ops::Error::from_submit(err)))?;
    if submitted.created && limits.pending_max.is_some() {
        state.backlog().accepted().await;
    }
    let status = if submitted.created { StatusCode::CREATED } else { StatusCode::OK };
    match view(&state, &caller, "submit", &submitted.id).await {
        // The id is someone else's task: say it is taken, and nothing of it.
        Err(err) if err.status == StatusCode::NOT_FOUND && !submitted.created => Err(ApiError::new(
            StatusCode::CONFLICT,
            "task_exists",
            format!("submit: task id {} is taken by a task of another submitter; choose another id", submitted.id),
        )),
        answer => Ok((status, Json(answer?))),
    }
}

/// A task with its steps.
#[utoipa::path(
    get, path = "/v1/tasks/{id}", tag = "tasks", operation_id = "get_task",
    params(TaskPath),
    responses(
        (status = 200, description = "The task", body = TaskView),
        (status = 400, description = "Invalid id", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(TaskPath { id }): ApiPath<TaskPath>,
) -> ApiResult<Json<TaskView>> {
    let id = task_id(id)?;
    Ok(Json(view(&state, &caller_of(caller), "get task", &id).await?))
}

/// Tasks, newest first, filtered.
#[utoipa::path(
    get, path = "/v1/tasks", tag = "tasks", operation_id = "list_tasks", params(TaskListQuery),
    responses(
        (status = 200, description = "Tasks, newest first", body = [TaskSummary]),
        (status = 400, description = "Invalid filter or limit, or `before` names no task", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
///
/// Page with `before`: the next page is the one `before` the last task of
/// this one; an empty page is the end. Every filter, on any page, is served
/// by an index, whatever the store's size. A token of scope `submit` alone
/// lists only the tasks it submitted.
pub async fn list(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiQuery(query): ApiQuery<TaskListQuery>,
) -> ApiResult<Json<Vec<TaskSummary>>> {
    let caller = caller_of(caller);
    let search = Search {
        tag: query.tag,
        created_after: query.created_after,
        created_before: query.created_before,
        ended_after: query.ended_after,
        ended_before: query.ended_before,
        id_prefix: query.id_prefix,
        parent: query.parent,
    };
    let filter = TaskFilter {
        submitter: caller.confined_to().map(str::to_owned),
        state: query.state.as_deref().map(str::parse::<TaskState>).transpose().map_err(|err| ApiError::invalid_query("state", err))?,
        workflow: query.workflow.map(WorkflowName::new).transpose().map_err(|err| ApiError::invalid_query("workflow", err))?,
        locked_by: query.locked_by.map(InstanceId::new).transpose().map_err(|err| ApiError::invalid_query("locked_by", err))?,
        at_risk: query.at_risk.unwrap_or(false),
        before: query.before.map(TaskId::new).transpose().map_err(|err| ApiError::invalid_query("before", err))?,
        limit: state.limit(query.limit)?,
        ..search.filter()?
    };
    let tasks = state.client().tasks(&filter).await.map_err(|err| ApiError::ops("list tasks", err))?;
    Ok(Json(tasks.iter().map(TaskSummary::from).collect()))
}

/// Exact task counts in every state, of every task or of one workflow.
#[utoipa::path(
    get, path = "/v1/tasks/counts", tag = "tasks", operation_id = "count_tasks", params(TaskCountsQuery),
    responses(
        (status = 200, description = "Counts by state (every state present) and their total", body = TaskCounts),
        (status = 400, description = "Invalid workflow name", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn counts(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiQuery(query): ApiQuery<TaskCountsQuery>,
) -> ApiResult<Json<TaskCounts>> {
    let search = Search {
        tag: query.tag,
        created_after: query.created_after,
        created_before: query.created_before,
        ended_after: query.ended_after,
        ended_before: query.ended_before,
        id_prefix: query.id_prefix,
        parent: query.parent,
    };
    let filter = TaskFilter {
        submitter: caller_of(caller).confined_to().map(str::to_owned),
        workflow: query.workflow.map(WorkflowName::new).transpose().map_err(|err| ApiError::invalid_query("workflow", err))?,
        ..search.filter()?
    };
    let counted = state.client().task_counts(&filter).await.map_err(|err| ApiError::ops("count tasks", err))?;
    Ok(Json(TaskCounts::from(counted.as_slice())))
}

/// The reason an operator's optional body gives, if any.
pub(crate) fn reason_of(request: Option<ApiJson<OperatorRequest>>) -> Option<String> {
    request.and_then(|ApiJson(request)| request.reason)
}

/// The search conditions the listing, the counts and the batches share,
/// as sent.
pub(crate) struct Search {
    pub tag: Vec<String>,
    pub created_after: Option<String>,
    pub created_before: Option<String>,
    pub ended_after: Option<String>,
    pub ended_before: Option<String>,
    pub id_prefix: Option<String>,
    pub parent: Option<String>,
}

impl Search {
    /// The conditions as a filter, or a 400 naming the parameter.
    pub(crate) fn filter(self) -> ApiResult<TaskFilter> {
        if self.tag.len() > TAGS_PER_TASK_MAX {
            return Err(ApiError::invalid_query("tag", format!("at most {TAGS_PER_TASK_MAX} tags, got {}", self.tag.len())));
        }
        let tags = self
            .tag
            .iter()
            .map(|text| parse_tag(text))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| ApiError::invalid_query("tag", err))?;
        let time = |name: &str, text: Option<String>| {
            text.map(|text| rota_engine::client::parse_start_at(&text)).transpose().map_err(|why| ApiError::invalid_query(name, why))
        };
        let id_prefix = match self.id_prefix {
            Some(prefix) if prefix.is_empty() || prefix.len() > rota_model::ids::ID_BYTES_MAX => {
                return Err(ApiError::invalid_query("id_prefix", "must be 1 to 200 bytes"));
            }
            prefix => prefix,
        };
        let parent = self.parent.map(TaskId::new).transpose().map_err(|err| ApiError::invalid_query("parent", err))?;
        Ok(TaskFilter {
            tags,
            created: TimeRange { from: time("created_after", self.created_after)?, until: time("created_before", self.created_before)? },
            ended: TimeRange { from: time("ended_after", self.ended_after)?, until: time("ended_before", self.ended_before)? },
            id_prefix,
            parent,
            ..TaskFilter::default()
        })
    }
}

/// A task's history, oldest first.
#[utoipa::path(
    get, path = "/v1/tasks/{id}/history", tag = "tasks",
    params(TaskPath),
    responses(
        (status = 200, description = "Its events, oldest first", body = [EventView]),
        (status = 400, description = "Invalid id", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn history(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(TaskPath { id }): ApiPath<TaskPath>,
) -> ApiResult<Json<Vec<EventView>>> {
    let id = task_id(id)?;
    check_visible(&state, &caller_of(caller), "task history", &id).await?;
    let events = state.client().history(&id).await.map_err(|err| ApiError::ops("task history", err))?;
    Ok(Json(events.iter().map(EventView::from).collect()))
}

/// Operator alerts, newest first.
#[utoipa::path(
    get, path = "/v1/alerts", tag = "tasks", params(LimitQuery),
    responses(
        (status = 200, description = "Alerts, newest first", body = [AlertView]),
        (status = 400, description = "Invalid limit", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn alerts(State(state): State<ApiState>, ApiQuery(query): ApiQuery<LimitQuery>) -> ApiResult<Json<Vec<AlertView>>> {
    let limit = state.limit(query.limit)?;
    let alerts = state.client().alerts(limit).await.map_err(|err| ApiError::ops("list alerts", err))?;
    Ok(Json(alerts.iter().map(AlertView::from).collect()))
}

/// Cancel a task that has not finished.
///
/// If a step with a compensation completed (or may have), the task is
/// compensated (`compensating`); otherwise it is `cancelled`. Who cancelled
/// it (the caller) and why (`reason`, optional) are recorded in its
/// history. The body may be left out.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/cancel", tag = "tasks",
    params(TaskPath),
    request_body(content = Option<OperatorRequest>, description = "Why (optional); the body may be left out", content_type = "application/json"),
    responses(
        (status = 200, description = "The state it moved to", body = TaskStateChange),
        (status = 400, description = "Invalid id, or a reason too long", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task has finished, or changed concurrently", body = ErrorBody),
        (status = 422, description = "A body with a field the request does not have, or of the wrong type", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn cancel(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(TaskPath { id }): ApiPath<TaskPath>,
    request: Option<ApiJson<OperatorRequest>>,
) -> ApiResult<Json<TaskStateChange>> {
    let id = task_id(id)?;
    let by = caller_of(caller).to_string();
    let request = request.map(|ApiJson(request)| request).unwrap_or_default();
    let operator = Operator { by: &by, reason: request.reason.as_deref() };
    let moved = state.client().cancel(&id, operator).await.map_err(|err| ApiError::ops("cancel", err))?;
    Ok(Json(TaskStateChange { id: id.to_string(), state: moved.into() }))
}

/// Send a signal to a task: the JSON body is the signal's data (`null` for
/// none).
///
/// It completes the step that waits for a signal of this name when that
/// step is waiting, or is kept until the task reaches the step. The
/// signal's data becomes the step's output. Who sent it is recorded in the
/// task's history.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/signals/{name}", tag = "tasks",
    params(SignalPath),
    request_body(content = serde_json::Value, description = "The signal's data, any JSON value", content_type = "application/json"),
    responses(
        (status = 200, description = "Delivered: the step it went to, and whether it completed it now", body = SignalDelivery),
        (status = 400, description = "Invalid id or signal name, or malformed JSON", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task has finished or is being undone, the step already received this signal, or it changed concurrently", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 422, description = "No step of the task waits for this signal, or its data is too large", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn signal(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(SignalPath { id, name }): ApiPath<SignalPath>,
    ApiJson(data): ApiJson<serde_json::Value>,
) -> ApiResult<Json<SignalDelivery>> {
    let id = task_id(id)?;
    let signal = SignalName::new(name).map_err(|err| ApiError::invalid_path("name", err))?;
    let caller = caller_of(caller);
    check_visible(&state, &caller, "signal", &id).await?;
    let sent_by = caller.to_string();
    let delivered = state.client().signal(&id, &signal, data, &sent_by).await.map_err(|err| ApiError::ops("signal", err))?;
    Ok(Json(SignalDelivery {
        id: id.to_string(),
        signal: signal.to_string(),
        step: delivered.step.to_string(),
        completed: delivered.completed,
    }))
}

/// Pause a task that has not finished: it starts no new step until
/// resumed. Steps in flight finish and are recorded; once none is, its
/// Scheduler gives it back, and no Scheduler claims it while it is paused.
/// Who paused it (the caller) and why (`reason`, optional) are recorded in
/// its history. The body may be left out.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/pause", tag = "tasks",
    params(TaskPath),
    request_body(content = Option<PauseRequest>, description = "Why (optional); the body may be left out", content_type = "application/json"),
    responses(
        (status = 200, description = "The task after the pause", body = TaskView),
        (status = 400, description = "Invalid id, or a reason too long", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task has finished or is paused already, or changed concurrently", body = ErrorBody),
        (status = 422, description = "A body with a field the request does not have, or of the wrong type", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn pause_task(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(TaskPath { id }): ApiPath<TaskPath>,
    request: Option<ApiJson<PauseRequest>>,
) -> ApiResult<Json<TaskView>> {
    let id = task_id(id)?;
    let by = caller_of(caller).to_string();
    let request = request.map(|ApiJson(request)| request).unwrap_or_default();
    let operator = Operator { by: &by, reason: request.reason.as_deref() };
    let paused = state.client().pause(&id, operator).await.map_err(|err| ApiError::ops("pause", err))?;
    Ok(Json(TaskView::from(&paused)))
}

/// Resume a paused task: a Scheduler takes it up again (at once when
/// nobody holds it). Who resumed it and why are recorded in its history.
/// The body may be left out.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/resume", tag = "tasks",
    params(TaskPath),
    request_body(content = Option<PauseRequest>, description = "Why (optional); the body may be left out", content_type = "application/json"),
    responses(
        (status = 200, description = "The task after the resume", body = TaskView),
        (status = 400, description = "Invalid id, or a reason too long", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task is not paused, or changed concurrently", body = ErrorBody),
        (status = 422, description = "A body with a field the request does not have, or of the wrong type", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn resume_task(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(TaskPath { id }): ApiPath<TaskPath>,
    request: Option<ApiJson<PauseRequest>>,
) -> ApiResult<Json<TaskView>> {
    let id = task_id(id)?;
    let by = caller_of(caller).to_string();
    let request = request.map(|ApiJson(request)| request).unwrap_or_default();
    let operator = Operator { by: &by, reason: request.reason.as_deref() };
    let resumed = state.client().resume(&id, operator).await.map_err(|err| ApiError::ops("resume", err))?;
    Ok(Json(TaskView::from(&resumed)))
}

/// Resubmit a task that ended in `error`: its failed steps run again (or
/// its compensation resumes, if it failed while being undone). Who asked
/// (the caller) and why (`reason`, optional) are recorded in its history.
/// The body may be left out.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/resubmit", tag = "tasks",
    params(TaskPath),
    request_body(content = Option<OperatorRequest>, description = "Why (optional); the body may be left out", content_type = "application/json"),
    responses(
        (status = 200, description = "The task after the resubmit", body = TaskView),
        (status = 400, description = "Invalid id, or a reason too long", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task is not in error, or changed concurrently", body = ErrorBody),
        (status = 422, description = "A body with a field the request does not have, or of the wrong type", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn resubmit(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(TaskPath { id }): ApiPath<TaskPath>,
    request: Option<ApiJson<OperatorRequest>>,
) -> ApiResult<Json<TaskView>> {
    let id = task_id(id)?;
    let by = caller_of(caller).to_string();
    let request = request.map(|ApiJson(request)| request).unwrap_or_default();
    resubmit_task(&state, &id, None, Operator { by: &by, reason: request.reason.as_deref() }).await
}

/// Resubmit one step of a task that ended in `error`; with an `input`,
/// from that step on with a new input: the task's input is replaced, and
/// the step and every step that depends on it run again.
#[utoipa::path(
    post, path = "/v1/tasks/{id}/steps/{step}/resubmit", tag = "tasks",
    params(StepPath),
    request_body(content = Option<ResubmitRequest>, description = "Optional: a new input, and why", content_type = "application/json"),
    responses(
        (status = 200, description = "The task after the resubmit", body = TaskView),
        (status = 400, description = "Invalid id or step name, a malformed body, or a reason too long", body = ErrorBody),
        (status = 404, description = "No such task or step", body = ErrorBody),
        (status = 409, description = "The task or step cannot be resubmitted, or changed concurrently", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 422, description = "A body with a field the request does not have, or of the wrong type", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn resubmit_step(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(StepPath { id, step }): ApiPath<StepPath>,
    body: Option<ApiJson<Option<ResubmitRequest>>>,
) -> ApiResult<Json<TaskView>> {
    let id = task_id(id)?;
    let step = StepName::new(step).map_err(|err| ApiError::invalid_path("step", err))?;
    let by = caller_of(caller).to_string();
    let ResubmitRequest { input, reason } = body.and_then(|ApiJson(body)| body).unwrap_or_default();
    let operator = Operator { by: &by, reason: reason.as_deref() };
    match input {
        Some(input) => {
            let resubmitted =
                state.client().resubmit_with_input(&id, &step, input, operator).await.map_err(|err| ApiError::ops("resubmit", err))?;
            Ok(Json(TaskView::from(&resubmitted)))
        }
        None => resubmit_task(&state, &id, Some(&step), operator).await,
    }
}

async fn resubmit_task(state: &ApiState, id: &TaskId, step: Option<&StepName>, operator: Operator<'_>) -> ApiResult<Json<TaskView>> {
    let resubmitted = state.client().resubmit(id, step, operator).await.map_err(|err| ApiError::ops("resubmit", err))?;
    Ok(Json(TaskView::from(&resubmitted)))
}
