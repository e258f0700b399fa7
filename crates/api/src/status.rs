//! What the system is doing: the processes that run it (from their
//! heartbeats, with the Supervisors' leader) and its recent activity per
//! minute (from the newest events). Both read a bounded amount whatever the
//! store's size; the engine's `status` and `activity` modules hold the
//! rules, these handlers only translate.

use axum::Json;
use axum::extract::State;
use rota_engine::{activity, status};

use crate::ApiState;
use crate::error::{ApiError, ApiQuery, ApiResult, ErrorBody};
use crate::wire::{ActivityQuery, ActivityView, InstancesView};

/// The processes that reported a heartbeat, and who leads the Supervisors.
#[utoipa::path(
    get, path = "/v1/instances", tag = "status", operation_id = "list_instances",
    responses(
        (status = 200, description = "Every instance heard from in the last day, live or not, sorted by id, and the Supervisors' leader", body = InstancesView),
    ),
    security(("bearer" = []))
)]
pub async fn instances(State(state): State<ApiState>) -> ApiResult<Json<InstancesView>> {
    let now = state.clock().now();
    let instances = status::instances(state.store(), now).await.map_err(|err| ApiError::store("list instances", err))?;
    let leader = status::supervisor_leader(state.store()).await.map_err(|err| ApiError::store("read the supervisor leader", err))?;
    Ok(Json(InstancesView::new(&instances, leader.as_ref())))
}

/// Tasks received, processed and ended in error, steps completed and step
/// latency, per minute over the last `minutes` minutes.
///
/// Computed from the newest events only (at most 20000, newest first), so
/// its cost does not grow with the store; `complete` is false when the
/// window held more events than that.
#[utoipa::path(
    get, path = "/v1/activity", tag = "status", operation_id = "get_activity", params(ActivityQuery),
    responses(
        (status = 200, description = "Every minute of the window, oldest first", body = ActivityView),
        (status = 400, description = "Invalid window", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn activity(State(state): State<ApiState>, ApiQuery(query): ApiQuery<ActivityQuery>) -> ApiResult<Json<ActivityView>> {
    let minutes = query.minutes.unwrap_or(activity::MINUTES_DEFAULT);
    if !(1..=activity::MINUTES_MAX).contains(&minutes) {
        return Err(ApiError::invalid_query("minutes", format!("must be between 1 and {}, got {minutes}", activity::MINUTES_MAX)));
    }
    let now = state.clock().now();
    let summary = activity::read(state.store(), now, minutes).await.map_err(|err| ApiError::store("read activity", err))?;
    Ok(Json(ActivityView::from(&summary)))
}
