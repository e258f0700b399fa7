//! `GET /v1/audit`: every operator action, newest first, with who did it
//! and why (see `rota_store::audit` for where each is kept). This only
//! translates.

use axum::Json;
use axum::extract::State;
use rota_store::{AuditAction, AuditCursor, AuditFilter};

use crate::ApiState;
use crate::error::{ApiError, ApiQuery, ApiResult, ErrorBody};
use crate::wire::{AuditEntryView, AuditQuery};

/// The operator actions, newest first: on tasks (cancel, resubmit, pause,
/// resume, signal, read from their history) and the others (queues, dead
/// letters, workflows, schedules, batches, prunes). Page with `after`, the
/// `cursor` of the last entry of a page.
#[utoipa::path(
    get, path = "/v1/audit", tag = "audit", operation_id = "list_audit", params(AuditQuery),
    responses(
        (status = 200, description = "The actions, newest first", body = [AuditEntryView]),
        (status = 400, description = "Invalid query parameter", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list(State(state): State<ApiState>, ApiQuery(query): ApiQuery<AuditQuery>) -> ApiResult<Json<Vec<AuditEntryView>>> {
    let limit = state.limit(query.limit)?;
    let since = query
        .since
        .map(|text| rota_engine::client::parse_start_at(&text))
        .transpose()
        .map_err(|why| ApiError::invalid_query("since", why))?;
    let action = query.action.map(|text| text.parse::<AuditAction>()).transpose().map_err(|why| ApiError::invalid_query("action", why))?;
    let after = query.after.map(|text| text.parse::<AuditCursor>()).transpose().map_err(|why| ApiError::invalid_query("after", why))?;
    if query.by.as_deref().is_some_and(str::is_empty) {
        return Err(ApiError::invalid_query("by", "must not be empty"));
    }
    let filter = AuditFilter { since, action, by: query.by, after, limit };
    let entries = state.client().audit(&filter).await.map_err(|err| ApiError::ops("list audit", err))?;
    Ok(Json(entries.iter().map(AuditEntryView::from).collect()))
}
