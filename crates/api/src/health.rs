//! `/healthz` (the process answers) and `/readyz` (it can reach its store),
//! for load balancers and orchestrators; neither needs a token.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::ApiState;
use crate::wire::Health;

/// Liveness: answering at all is the check.
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".into(), store: None })
}

/// Readiness: one cheap store read (the queue registry's counts would scan
/// messages; one workflow lookup is an index probe).
pub async fn readyz(State(state): State<ApiState>) -> Response {
    let backend = state.store().backend().to_owned();
    let probe = rota_model::WorkflowName::new("rota.readyz").expect("a valid workflow name");
    match state.store().workflow(&probe, Some(1)).await {
        Ok(_) => Json(Health { status: "ok".into(), store: Some(backend) }).into_response(),
        Err(err) => {
            tracing::warn!("readiness check failed: {err}");
            (StatusCode::SERVICE_UNAVAILABLE, Json(Health { status: "unavailable".into(), store: Some(backend) })).into_response()
        }
    }
}
