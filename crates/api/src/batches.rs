//! The bulk-action endpoints: start a batch (cancel or resubmit every task
//! a filter selects, redrive every dead letter of a queue a filter
//! selects), list them, show one, stop one. The Supervisor leader
//! runs a batch ([`rota_engine::batch`]); this only translates.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use rota_engine::ops::Operator;
use rota_model::{QueueName, TaskState, WorkflowName};
use rota_store::{BatchAction, BatchFilter, DeadLetterFilter, TaskFilter, TimeRange};

use crate::ApiState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ApiResult, ErrorBody};
use crate::tasks::{Search, caller_of, reason_of};
use crate::wire::{BatchFilterView, BatchPath, BatchRequest, BatchView, DeadLetterFilterView, LimitQuery, OperatorRequest};

/// The longest reason kept with a batch.
const REASON_CHARS_MAX: usize = 1000;

/// A batch's filter as the store takes it, or a 422 naming the field.
pub(crate) fn filter_of(view: BatchFilterView) -> ApiResult<TaskFilter> {
    let search = Search {
        tag: view.tag,
        created_after: view.created_after,
        created_before: view.created_before,
        ended_after: view.ended_after,
        ended_before: view.ended_before,
        id_prefix: view.id_prefix,
        parent: view.parent,
    };
    // The search's refusal names its parameter: the field of `filter`.
    let filter =
        search.filter().map_err(|err| ApiError::invalid_body(format!("filter.{}", err.reason.trim_start_matches("query parameter "))))?;
    Ok(TaskFilter {
        state: view
            .state
            .as_deref()
            .map(str::parse::<TaskState>)
            .transpose()
            .map_err(|err| ApiError::invalid_body(format!("filter.state: {err}")))?,
        workflow: view
            .workflow
            .map(WorkflowName::new)
            .transpose()
            .map_err(|err| ApiError::invalid_body(format!("filter.workflow: {err}")))?,
        ..filter
    })
}

/// A dead-letter filter as the store takes it, or a 422 naming the field.
pub(crate) fn dead_letter_filter_of(view: DeadLetterFilterView) -> ApiResult<DeadLetterFilter> {
    let queue = QueueName::new(view.queue).map_err(|err| ApiError::invalid_body(format!("dead_letters.queue: {err}")))?;
    if view.reason_contains.as_ref().is_some_and(|text| text.is_empty() || text.chars().count() > REASON_CHARS_MAX) {
        return Err(ApiError::invalid_body(format!("dead_letters.reason_contains: 1 to {REASON_CHARS_MAX} characters")));
    }
    let time = |name: &str, text: Option<String>| {
        text.map(|text| rota_engine::client::parse_start_at(&text))
            .transpose()
            .map_err(|why| ApiError::invalid_body(format!("dead_letters.{name}: {why}")))
    };
    let dead_lettered = TimeRange {
        from: time("dead_lettered_after", view.dead_lettered_after)?,
        until: time("dead_lettered_before", view.dead_lettered_before)?,
    };
    Ok(DeadLetterFilter { queue, reason_contains: view.reason_contains, dead_lettered })
}

/// The filter of a batch request, checked against its action.
fn batch_filter_of(action: BatchAction, request: &mut BatchRequest) -> ApiResult<BatchFilter> {
    let tasks = filter_of(std::mem::take(&mut request.filter))?;
    if action.on_dead_letters() {
        if tasks.selects_something() {
            return Err(ApiError::invalid_body("filter: a redrive selects dead letters (dead_letters), not tasks"));
        }
        let Some(view) = request.dead_letters.take() else {
            return Err(ApiError::invalid_body(
                "dead_letters: a redrive needs the queue whose dead letters to send back (dead_letters.queue)",
            ));
        };
        return Ok(BatchFilter::DeadLetters(dead_letter_filter_of(view)?));
    }
    if request.dead_letters.is_some() {
        return Err(ApiError::invalid_body(format!("dead_letters: a {action} selects tasks (filter), not dead letters")));
    }
    let mut filter = tasks;
    if !filter.selects_something() {
        return Err(ApiError::invalid_body("filter: give at least one of state, workflow, tag, a time, id_prefix or parent"));
    }
    if action == BatchAction::Resubmit && filter.state.is_none() {
        filter.state = Some(TaskState::Error);
    }
    Ok(BatchFilter::Tasks(filter))
}

/// Start a bulk action: cancel or resubmit every task the filter selects,
/// or redrive every dead letter of a queue the dead-letter filter selects.
///
/// The batch is stored with its filter, closed now (tasks created later,
/// messages dead-lettered later, are not selected), and the count of what
/// it selected; the Supervisor leader runs it, a page at a time, and goes
/// on from where it got after a restart. Follow it with
/// `GET /v1/batches/{id}`.
#[utoipa::path(
    post, path = "/v1/batches", tag = "batches", operation_id = "create_batch", request_body = BatchRequest,
    responses(
        (status = 201, description = "Stored; the Supervisor leader runs it", body = BatchView),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 404, description = "A redrive of a queue that does not exist", body = ErrorBody),
        (status = 422, description = "Invalid field, a filter that selects nothing in particular, a redrive without dead_letters, or a filter of the other kind than the action's", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiJson(mut request): ApiJson<BatchRequest>,
) -> ApiResult<(StatusCode, Json<BatchView>)> {
    let action = request.action.parse::<BatchAction>().map_err(|why| ApiError::invalid_body(format!("action: {why}")))?;
    let filter = batch_filter_of(action, &mut request)?;
    if let Some(reason) = &request.reason
        && reason.chars().count() > REASON_CHARS_MAX
    {
        return Err(ApiError::invalid_body(format!("reason: at most {REASON_CHARS_MAX} characters")));
    }
    let by = caller_of(caller).to_string();
    let batch = rota_engine::batch::create(state.client(), action, filter, &by, request.reason)
        .await
        .map_err(|err| ApiError::ops("create batch", err))?;
    Ok((StatusCode::CREATED, Json(BatchView::from(&batch))))
}

/// The latest batches, newest first.
#[utoipa::path(
    get, path = "/v1/batches", tag = "batches", operation_id = "list_batches", params(LimitQuery),
    responses(
        (status = 200, description = "Batches, newest first", body = [BatchView]),
        (status = 400, description = "Invalid limit", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(State(state): State<ApiState>, ApiQuery(query): ApiQuery<LimitQuery>) -> ApiResult<Json<Vec<BatchView>>> {
    let limit = state.limit(query.limit)?;
    let batches = state.client().store().batches(limit).await.map_err(|err| ApiError::store("list batches", err))?;
    Ok(Json(batches.iter().map(BatchView::from).collect()))
}

/// A batch and how far it got.
#[utoipa::path(
    get, path = "/v1/batches/{id}", tag = "batches", operation_id = "get_batch", params(BatchPath),
    responses(
        (status = 200, description = "The batch", body = BatchView),
        (status = 404, description = "No such batch", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get(State(state): State<ApiState>, ApiPath(BatchPath { id }): ApiPath<BatchPath>) -> ApiResult<Json<BatchView>> {
    let batch = state.client().store().batch(&id).await.map_err(|err| ApiError::store("get batch", err))?;
    batch.map(|b| Json(BatchView::from(&b))).ok_or_else(|| ApiError::not_found(format!("batch {id}")))
}

/// Stop a batch: its runner stops at its next page; the tasks it has not
/// reached are left as they are. A batch already done or stopped is
/// answered as it is.
#[utoipa::path(
    post, path = "/v1/batches/{id}/stop", tag = "batches", operation_id = "stop_batch", params(BatchPath),
    request_body(content = Option<OperatorRequest>, description = "Why (optional), kept in the audit log with who did it; the body may be left out", content_type = "application/json"),
    responses(
        (status = 200, description = "The batch, stopped (or already done)", body = BatchView),
        (status = 400, description = "A body that is not JSON", body = ErrorBody),
        (status = 404, description = "No such batch", body = ErrorBody),
        (status = 422, description = "A reason too long, or a body with a field the request does not have", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn stop(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(BatchPath { id }): ApiPath<BatchPath>,
    request: Option<ApiJson<OperatorRequest>>,
) -> ApiResult<Json<BatchView>> {
    let reason = reason_of(request);
    let by = caller_of(caller).to_string();
    let operator = Operator { by: &by, reason: reason.as_deref() };
    let batch = rota_engine::batch::stop(state.client(), &id, operator).await.map_err(|err| ApiError::ops("stop batch", err))?;
    batch.map(|b| Json(BatchView::from(&b))).ok_or_else(|| ApiError::not_found(format!("batch {id}")))
}
