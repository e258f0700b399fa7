//! The queue endpoints: counts per queue, pause and resume, the dead
//! letters (list, redrive one or all, purge) and the circuit breakers that
//! `rota serve` processes report.
//!
//! Unlike `rota queue pause`, pausing or resuming a queue that does not
//! exist is a 404 rather than creating it: over the network a typo should
//! not make a queue.

use axum::extract::State;
use axum::{Extension, Json};
use rota_engine::ops::Operator;
use rota_model::{MessageId, QueueName};
use rota_store::Redrive;

use crate::ApiState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ApiResult, ErrorBody};
use crate::tasks::{caller_of, reason_of};
use crate::wire::{BreakerView, Count, DeadLetterPath, DeadLetterView, LimitQuery, OperatorRequest, QueuePath, QueueView};

fn queue_name(raw: String) -> ApiResult<QueueName> {
    QueueName::new(raw).map_err(|err| ApiError::invalid_path("queue", err))
}

/// The counts of `queue`, or 404.
async fn queue_stats(state: &ApiState, request: &str, queue: &QueueName) -> ApiResult<QueueView> {
    let stats = state.store().stats().await.map_err(|err| ApiError::store(request, err))?;
    stats.iter().find(|s| &s.queue == queue).map(QueueView::from).ok_or_else(|| ApiError::not_found(format!("queue {queue}")))
}

/// Counts for every queue, sorted by name.
#[utoipa::path(
    get, path = "/v1/queues", tag = "queues", operation_id = "list_queues",
    responses(
        (status = 200, description = "Every queue", body = [QueueView]),
    ),
    security(("bearer" = []))
)]
pub async fn list(State(state): State<ApiState>) -> ApiResult<Json<Vec<QueueView>>> {
    let stats = state.store().stats().await.map_err(|err| ApiError::store("queue stats", err))?;
    Ok(Json(stats.iter().map(QueueView::from).collect()))
}

/// Counts for one queue.
#[utoipa::path(
    get, path = "/v1/queues/{queue}", tag = "queues", operation_id = "get_queue",
    params(QueuePath),
    responses(
        (status = 200, description = "The queue", body = QueueView),
        (status = 400, description = "Invalid queue name", body = ErrorBody),
        (status = 404, description = "No such queue", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get(State(state): State<ApiState>, ApiPath(QueuePath { queue }): ApiPath<QueuePath>) -> ApiResult<Json<QueueView>> {
    let queue = queue_name(queue)?;
    Ok(Json(queue_stats(&state, "queue stats", &queue).await?))
}

/// Stop deliveries from a queue (sends still succeed).
#[utoipa::path(
    post, path = "/v1/queues/{queue}/pause", tag = "queues",
    params(QueuePath),
    request_body(content = Option<OperatorRequest>, description = "Why (optional), kept in the audit log with who did it; the body may be left out", content_type = "application/json"),
    responses(
        (status = 200, description = "The queue, paused", body = QueueView),
        (status = 400, description = "Invalid queue name", body = ErrorBody),
        (status = 404, description = "No such queue", body = ErrorBody),
        (status = 422, description = "A reason too long, or a body with a field the request does not have", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn pause(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(QueuePath { queue }): ApiPath<QueuePath>,
    request: Option<ApiJson<OperatorRequest>>,
) -> ApiResult<Json<QueueView>> {
    let reason = reason_of(request);
    let queue = queue_name(queue)?;
    existing(&state, "pause", &queue).await?;
    let by = caller_of(caller).to_string();
    state.client().pause_queue(&queue, Operator { by: &by, reason: reason.as_deref() }).await.map_err(|err| ApiError::ops("pause", err))?;
    Ok(Json(queue_stats(&state, "pause", &queue).await?))
}

/// Resume deliveries from a paused queue.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/resume", tag = "queues",
    params(QueuePath),
    request_body(content = Option<OperatorRequest>, description = "Why (optional), kept in the audit log with who did it; the body may be left out", content_type = "application/json"),
    responses(
        (status = 200, description = "The queue, resumed", body = QueueView),
        (status = 400, description = "Invalid queue name", body = ErrorBody),
        (status = 404, description = "No such queue", body = ErrorBody),
        (status = 422, description = "A reason too long, or a body with a field the request does not have", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn resume(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(QueuePath { queue }): ApiPath<QueuePath>,
    request: Option<ApiJson<OperatorRequest>>,
) -> ApiResult<Json<QueueView>> {
    let reason = reason_of(request);
    let queue = queue_name(queue)?;
    existing(&state, "resume", &queue).await?;
    let by = caller_of(caller).to_string();
    state
        .client()
        .resume_queue(&queue, Operator { by: &by, reason: reason.as_deref() })
        .await
        .map_err(|err| ApiError::ops("resume", err))?;
    Ok(Json(queue_stats(&state, "resume", &queue).await?))
}

async fn existing(state: &ApiState, request: &str, queue: &QueueName) -> ApiResult<()> {
    match state.store().queue_config(queue).await.map_err(|err| ApiError::store(request, err))? {
        Some(_) => Ok(()),
        None => Err(ApiError::not_found(format!("queue {queue}"))),
    }
}

/// A queue's dead letters, oldest first, with the reason of each.
#[utoipa::path(
    get, path = "/v1/queues/{queue}/dead-letters", tag = "dead letters",
    params(QueuePath, LimitQuery),
    responses(
        (status = 200, description = "Dead letters, oldest first", body = [DeadLetterView]),
        (status = 400, description = "Invalid queue name or limit", body = ErrorBody),
        (status = 404, description = "No such queue", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn dead_letters(
    State(state): State<ApiState>,
    ApiPath(QueuePath { queue }): ApiPath<QueuePath>,
    ApiQuery(query): ApiQuery<LimitQuery>,
) -> ApiResult<Json<Vec<DeadLetterView>>> {
    let queue = queue_name(queue)?;
    let limit = state.limit(query.limit)?;
    let letters = state.store().dead_letters(&queue, limit).await.map_err(|err| ApiError::store("list dead letters", err))?;
    Ok(Json(letters.iter().map(DeadLetterView::from).collect()))
}

/// Send every dead letter of a queue back to it with a fresh delivery count.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/dead-letters/redrive", tag = "dead letters",
    params(QueuePath),
    request_body(content = Option<OperatorRequest>, description = "Why (optional), kept in the audit log with who did it; the body may be left out", content_type = "application/json"),
    responses(
        (status = 200, description = "How many were sent back", body = Count),
        (status = 400, description = "Invalid queue name", body = ErrorBody),
        (status = 404, description = "No such queue", body = ErrorBody),
        (status = 422, description = "A reason too long, or a body with a field the request does not have", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn redrive_all(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(QueuePath { queue }): ApiPath<QueuePath>,
    request: Option<ApiJson<OperatorRequest>>,
) -> ApiResult<Json<Count>> {
    let reason = reason_of(request);
    let queue = queue_name(queue)?;
    let by = caller_of(caller).to_string();
    let operator = Operator { by: &by, reason: reason.as_deref() };
    let count = state.client().redrive_dead_letters(&queue, Redrive::All, operator).await.map_err(|err| ApiError::ops("redrive", err))?;
    Ok(Json(Count { count }))
}

/// Send one dead letter back to its queue with a fresh delivery count.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/dead-letters/{id}/redrive", tag = "dead letters",
    params(DeadLetterPath),
    request_body(content = Option<OperatorRequest>, description = "Why (optional), kept in the audit log with who did it; the body may be left out", content_type = "application/json"),
    responses(
        (status = 200, description = "How many were sent back (1)", body = Count),
        (status = 400, description = "Invalid queue name or message id", body = ErrorBody),
        (status = 404, description = "No such queue or dead letter", body = ErrorBody),
        (status = 422, description = "A reason too long, or a body with a field the request does not have", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn redrive_one(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(DeadLetterPath { queue, id }): ApiPath<DeadLetterPath>,
    request: Option<ApiJson<OperatorRequest>>,
) -> ApiResult<Json<Count>> {
    let reason = reason_of(request);
    let queue = queue_name(queue)?;
    let id = MessageId::new(id).map_err(|err| ApiError::invalid_path("id", err))?;
    let by = caller_of(caller).to_string();
    let operator = Operator { by: &by, reason: reason.as_deref() };
    let count =
        state.client().redrive_dead_letters(&queue, Redrive::One(id), operator).await.map_err(|err| ApiError::ops("redrive", err))?;
    Ok(Json(Count { count }))
}

/// Delete every dead letter of a queue.
#[utoipa::path(
    post, path = "/v1/queues/{queue}/dead-letters/purge", tag = "dead letters",
    params(QueuePath),
    request_body(content = Option<OperatorRequest>, description = "Why (optional), kept in the audit log with who did it; the body may be left out", content_type = "application/json"),
    responses(
        (status = 200, description = "How many were deleted", body = Count),
        (status = 400, description = "Invalid queue name", body = ErrorBody),
        (status = 404, description = "No such queue", body = ErrorBody),
        (status = 422, description = "A reason too long, or a body with a field the request does not have", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn purge(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(QueuePath { queue }): ApiPath<QueuePath>,
    request: Option<ApiJson<OperatorRequest>>,
) -> ApiResult<Json<Count>> {
    let reason = reason_of(request);
    let queue = queue_name(queue)?;
    let by = caller_of(caller).to_string();
    let operator = Operator { by: &by, reason: reason.as_deref() };
    let count = state.client().purge_dead_letters(&queue, operator).await.map_err(|err| ApiError::ops("purge", err))?;
    Ok(Json(Count { count }))
}

/// The circuit breakers of the `http` agents: those shared through the
/// store (state, failures of every process, open until, probe holder),
/// and those kept in process, as last reported by the processes that run
/// them.
#[utoipa::path(
    get, path = "/v1/breakers", tag = "queues",
    responses(
        (status = 200, description = "Every breaker, shared or reported, sorted by endpoint", body = [BreakerView]),
    ),
    security(("bearer" = []))
)]
pub async fn breakers(State(state): State<ApiState>) -> ApiResult<Json<Vec<BreakerView>>> {
    let store = state.store();
    let statuses = rota_engine::status::breakers(store).await.map_err(|err| ApiError::store("list breakers", err))?;
    let shared = store.shared_breakers().await.map_err(|err| ApiError::store("list breakers", err))?;
    Ok(Json(BreakerView::all(&shared, &statuses)))
}
