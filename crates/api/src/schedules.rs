//! The schedule endpoints: list (with the next fire times), create, show,
//! delete, pause, resume, and trigger (fire now). The rules are the
//! engine's operator requests ([`rota_engine::schedules`]); this only
//! translates.

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use rota_engine::ops;
use rota_engine::ops::Operator;
use rota_model::ScheduleName;

use crate::ApiState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ApiPath, ApiQuery, ApiResult, ErrorBody};
use crate::tasks::{caller_of, reason_of};
use crate::wire::{OperatorRequest, ReasonQuery, SchedulePath, ScheduleRequest, ScheduleView, TaskView};

fn schedule_name(raw: String) -> ApiResult<ScheduleName> {
    ScheduleName::new(raw).map_err(|err| ApiError::invalid_path("name", err))
}

/// Every schedule, sorted by name, with its next fire time.
#[utoipa::path(
    get, path = "/v1/schedules", tag = "schedules", operation_id = "list_schedules",
    responses(
        (status = 200, description = "Every schedule", body = [ScheduleView]),
    ),
    security(("bearer" = []))
)]
pub async fn list(State(state): State<ApiState>) -> ApiResult<Json<Vec<ScheduleView>>> {
    let schedules = state.client().schedules().await.map_err(|err| ApiError::ops("list schedules", err))?;
    Ok(Json(schedules.iter().map(ScheduleView::from).collect()))
}

/// Create a schedule.
///
/// Idempotent: creating a schedule that exists with the same definition
/// answers 200 with it; with another definition, 409.
#[utoipa::path(
    post, path = "/v1/schedules", tag = "schedules", operation_id = "create_schedule", request_body = ScheduleRequest,
    responses(
        (status = 201, description = "Created", body = ScheduleView),
        (status = 200, description = "It existed with this definition; nothing changed", body = ScheduleView),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 404, description = "The workflow is not registered", body = ErrorBody),
        (status = 409, description = "A schedule of this name exists with another definition", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 422, description = "Invalid field (a cron expression, a time zone, a policy)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(state): State<ApiState>,
    ApiJson(request): ApiJson<ScheduleRequest>,
) -> ApiResult<(StatusCode, Json<ScheduleView>)> {
    let new = request.to_new_schedule().map_err(ApiError::invalid_body)?;
    let (detail, created) = state.client().create_schedule(&new).await.map_err(|err| ApiError::ops("create schedule", err))?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(ScheduleView::from(&detail))))
}

/// A schedule, with its next fire time and progress.
#[utoipa::path(
    get, path = "/v1/schedules/{name}", tag = "schedules", operation_id = "get_schedule",
    params(SchedulePath),
    responses(
        (status = 200, description = "The schedule", body = ScheduleView),
        (status = 400, description = "Invalid name", body = ErrorBody),
        (status = 404, description = "No such schedule", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get(State(state): State<ApiState>, ApiPath(SchedulePath { name }): ApiPath<SchedulePath>) -> ApiResult<Json<ScheduleView>> {
    let name = schedule_name(name)?;
    let detail = state.client().schedule(&name).await.map_err(|err| ApiError::ops("show schedule", err))?;
    Ok(Json(ScheduleView::from(&detail)))
}

/// Delete a schedule. The tasks it started are kept.
#[utoipa::path(
    delete, path = "/v1/schedules/{name}", tag = "schedules", operation_id = "delete_schedule",
    params(SchedulePath, ReasonQuery),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Invalid name, or a reason too long", body = ErrorBody),
        (status = 404, description = "No such schedule", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(SchedulePath { name }): ApiPath<SchedulePath>,
    ApiQuery(ReasonQuery { reason }): ApiQuery<ReasonQuery>,
) -> ApiResult<StatusCode> {
    let name = schedule_name(name)?;
    let by = caller_of(caller).to_string();
    let operator = Operator { by: &by, reason: reason.as_deref() };
    // A DELETE has no body: the reason comes as a query parameter.
    operator.check().map_err(|err| ApiError::invalid_query("reason", err))?;
    state.client().delete_schedule(&name, operator).await.map_err(|err| ApiError::ops("delete schedule", err))?;
    Ok(StatusCode::NO_CONTENT)
}

/// Pause a schedule: it does not fire until resumed.
#[utoipa::path(
    post, path = "/v1/schedules/{name}/pause", tag = "schedules", operation_id = "pause_schedule",
    params(SchedulePath),
    request_body(content = Option<OperatorRequest>, description = "Why (optional), kept in the audit log with who did it; the body may be left out", content_type = "application/json"),
    responses(
        (status = 200, description = "The schedule, paused", body = ScheduleView),
        (status = 400, description = "Invalid name", body = ErrorBody),
        (status = 404, description = "No such schedule", body = ErrorBody),
        (status = 422, description = "A reason too long, or a body with a field the request does not have", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn pause(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(SchedulePath { name }): ApiPath<SchedulePath>,
    request: Option<ApiJson<OperatorRequest>>,
) -> ApiResult<Json<ScheduleView>> {
    let reason = reason_of(request);
    let name = schedule_name(name)?;
    let detail = state
        .client()
        .pause_schedule(&name, Operator { by: &caller_of(caller).to_string(), reason: reason.as_deref() })
        .await
        .map_err(|err| ApiError::ops("pause schedule", err))?;
    Ok(Json(ScheduleView::from(&detail)))
}

/// Resume a schedule: it fires from now on (fires while it was paused are
/// not caught up).
#[utoipa::path(
    post, path = "/v1/schedules/{name}/resume", tag = "schedules", operation_id = "resume_schedule",
    params(SchedulePath),
    request_body(content = Option<OperatorRequest>, description = "Why (optional), kept in the audit log with who did it; the body may be left out", content_type = "application/json"),
    responses(
        (status = 200, description = "The schedule, running", body = ScheduleView),
        (status = 400, description = "Invalid name", body = ErrorBody),
        (status = 404, description = "No such schedule", body = ErrorBody),
        (status = 422, description = "A reason too long, or a body with a field the request does not have", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn resume(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(SchedulePath { name }): ApiPath<SchedulePath>,
    request: Option<ApiJson<OperatorRequest>>,
) -> ApiResult<Json<ScheduleView>> {
    let reason = reason_of(request);
    let name = schedule_name(name)?;
    let detail = state
        .client()
        .resume_schedule(&name, Operator { by: &caller_of(caller).to_string(), reason: reason.as_deref() })
        .await
        .map_err(|err| ApiError::ops("resume schedule", err))?;
    Ok(Json(ScheduleView::from(&detail)))
}

/// Fire a schedule now, paused or not, whatever its overlap policy.
///
/// Starts its workflow with its input as the task `NAME@manual@<now>`
/// (RFC 3339 UTC, milliseconds), an id no cron fire has; the schedule's
/// own fires go on as before.
#[utoipa::path(
    post, path = "/v1/schedules/{name}/trigger", tag = "schedules", operation_id = "trigger_schedule",
    params(SchedulePath),
    request_body(content = Option<OperatorRequest>, description = "Why (optional), kept in the audit log with who did it; the body may be left out", content_type = "application/json"),
    responses(
        (status = 201, description = "The task it started", body = TaskView),
        (status = 400, description = "Invalid name", body = ErrorBody),
        (status = 404, description = "No such schedule, or its workflow is not registered", body = ErrorBody),
        (status = 422, description = "A reason too long, or a body with a field the request does not have", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn trigger(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(SchedulePath { name }): ApiPath<SchedulePath>,
    request: Option<ApiJson<OperatorRequest>>,
) -> ApiResult<(StatusCode, Json<TaskView>)> {
    let reason = reason_of(request);
    let name = schedule_name(name)?;
    let submitted = state
        .client()
        .trigger_schedule(&name, Operator { by: &caller_of(caller).to_string(), reason: reason.as_deref() })
        .await
        .map_err(|err| ApiError::ops("trigger schedule", err))?;
    let detail = state.client().task(&submitted.id).await.map_err(|err: ops::Error| ApiError::ops("trigger schedule", err))?;
    Ok((StatusCode::CREATED, Json(TaskView::from(&detail))))
}
