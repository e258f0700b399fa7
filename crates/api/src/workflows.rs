//! The workflow endpoints: the registry (list the latest versions, show one
//! version), validation of a definition without registering it (what `rota
//! validate` does for a file), and registration of a new version.
//!
//! A definition is sent as the request body, YAML or JSON (JSON when it
//! starts with `{` and parses as JSON), and read by [`rota_workflow::parse`]:
//! every problem comes back with its line and column. Versions are
//! immutable: registering the same definition again is a no-op (200), a
//! different definition under an existing version is a 409.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use rota_model::WorkflowName;
use rota_workflow::{Diagnostics, Workflow};

use crate::ApiState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiJson, ApiPath, ApiResult, ApiText, ErrorBody, ErrorDetail};
use crate::tasks::caller_of;
use crate::wire::{
    InvalidWorkflowBody, PauseRequest, ProblemView, ValidationView, WorkflowPath, WorkflowPauseView, WorkflowVersionPath, WorkflowView,
};

/// How diagnostics name the request body (its extension is not `.json` or
/// `.yaml`, so the parser picks the format from the text).
const BODY_SOURCE: &str = "body";

fn workflow_name(raw: String) -> ApiResult<WorkflowName> {
    WorkflowName::new(raw).map_err(|err| ApiError::invalid_path("name", err))
}

fn problems(diagnostics: &Diagnostics) -> Vec<ProblemView> {
    diagnostics.iter().map(|d| ProblemView { line: d.line, column: d.column, message: d.message.clone() }).collect()
}

fn view(request: &str, entry: &rota_store::WorkflowEntry) -> ApiResult<WorkflowView> {
    WorkflowView::from_entry(entry).ok_or_else(|| {
        ApiError::internal(request, format!("the stored definition of workflow {} version {} is unreadable", entry.name, entry.version))
    })
}

/// The latest version of every registered workflow, sorted by name.
#[utoipa::path(
    get, path = "/v1/workflows", tag = "workflows", operation_id = "list_workflows",
    responses(
        (status = 200, description = "Registered workflows", body = [WorkflowView]),
    ),
    security(("bearer" = []))
)]
pub async fn list(State(state): State<ApiState>) -> ApiResult<Json<Vec<WorkflowView>>> {
    let entries = state.store().workflows().await.map_err(|err| ApiError::store("list workflows", err))?;
    let pauses = state.store().workflow_pauses().await.map_err(|err| ApiError::store("list workflows", err))?;
    entries.iter().map(|entry| Ok(view("list workflows", entry)?.with_pause(&pauses))).collect::<ApiResult<Vec<_>>>().map(Json)
}

/// The latest registered version of a workflow.
#[utoipa::path(
    get, path = "/v1/workflows/{name}", tag = "workflows",
    params(WorkflowPath),
    responses(
        (status = 200, description = "The latest version", body = WorkflowView),
        (status = 400, description = "Invalid name", body = ErrorBody),
        (status = 404, description = "Not registered", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn latest(State(state): State<ApiState>, ApiPath(WorkflowPath { name }): ApiPath<WorkflowPath>) -> ApiResult<Json<WorkflowView>> {
    let name = workflow_name(name)?;
    show(&state, &name, None).await
}

/// One version of a workflow.
#[utoipa::path(
    get, path = "/v1/workflows/{name}/versions/{version}", tag = "workflows",
    params(WorkflowVersionPath),
    responses(
        (status = 200, description = "That version", body = WorkflowView),
        (status = 400, description = "Invalid name or version", body = ErrorBody),
        (status = 404, description = "Not registered", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn version(
    State(state): State<ApiState>,
    ApiPath(WorkflowVersionPath { name, version }): ApiPath<WorkflowVersionPath>,
) -> ApiResult<Json<WorkflowView>> {
    let name = workflow_name(name)?;
    let version = version
        .parse::<u32>()
        .ok()
        .filter(|v| *v >= 1)
        .ok_or_else(|| ApiError::invalid_path("version", format!("expected a whole number from 1, got {version:?}")))?;
    show(&state, &name, Some(version)).await
}

async fn show(state: &ApiState, name: &WorkflowName, version: Option<u32>) -> ApiResult<Json<WorkflowView>> {
    let entry = state.store().workflow(name, version).await.map_err(|err| ApiError::store("show workflow", err))?;
    let entry = entry.ok_or_else(|| match version {
        Some(version) => ApiError::not_found(format!("workflow {name} version {version}")),
        None => ApiError::not_found(format!("workflow {name}")),
    })?;
    let pauses = state.store().workflow_pauses().await.map_err(|err| ApiError::store("show workflow", err))?;
    Ok(Json(view("show workflow", &entry)?.with_pause(&pauses)))
}

/// Pause a workflow (every version): no Scheduler claims its tasks until it
/// is resumed, so new ones wait `pending`; tasks already running go on to
/// their end. Who paused it (the caller), why (`reason`, optional) and when
/// are kept with it. The body may be left out.
#[utoipa::path(
    post, path = "/v1/workflows/{name}/pause", tag = "workflows", operation_id = "pause_workflow",
    params(WorkflowPath),
    request_body(content = Option<PauseRequest>, description = "Why (optional); the body may be left out", content_type = "application/json"),
    responses(
        (status = 200, description = "The pause as stored", body = WorkflowPauseView),
        (status = 400, description = "Invalid name, or a reason too long", body = ErrorBody),
        (status = 404, description = "Not registered", body = ErrorBody),
        (status = 409, description = "The workflow is paused already", body = ErrorBody),
        (status = 422, description = "A body with a field the request does not have, or of the wrong type", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn pause(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(WorkflowPath { name }): ApiPath<WorkflowPath>,
    request: Option<ApiJson<PauseRequest>>,
) -> ApiResult<Json<WorkflowPauseView>> {
    let name = workflow_name(name)?;
    let by = caller_of(caller).to_string();
    let request = request.map(|ApiJson(request)| request).unwrap_or_default();
    let operator = rota_engine::pause::Operator { by: &by, reason: request.reason.as_deref() };
    let paused = state.client().pause_workflow(&name, operator).await.map_err(|err| ApiError::ops("pause workflow", err))?;
    Ok(Json(WorkflowPauseView::from(&paused)))
}

/// Resume a paused workflow: Schedulers claim its waiting tasks again (at
/// once). Who resumed it and why are kept with it. The body may be left out.
#[utoipa::path(
    post, path = "/v1/workflows/{name}/resume", tag = "workflows", operation_id = "resume_workflow",
    params(WorkflowPath),
    request_body(content = Option<PauseRequest>, description = "Why (optional); the body may be left out", content_type = "application/json"),
    responses(
        (status = 200, description = "The resume as stored", body = WorkflowPauseView),
        (status = 400, description = "Invalid name, or a reason too long", body = ErrorBody),
        (status = 404, description = "Not registered", body = ErrorBody),
        (status = 409, description = "The workflow is not paused", body = ErrorBody),
        (status = 422, description = "A body with a field the request does not have, or of the wrong type", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn resume(
    State(state): State<ApiState>,
    caller: Option<Extension<Caller>>,
    ApiPath(WorkflowPath { name }): ApiPath<WorkflowPath>,
    request: Option<ApiJson<PauseRequest>>,
) -> ApiResult<Json<WorkflowPauseView>> {
    let name = workflow_name(name)?;
    let by = caller_of(caller).to_string();
    let request = request.map(|ApiJson(request)| request).unwrap_or_default();
    let operator = rota_engine::pause::Operator { by: &by, reason: request.reason.as_deref() };
    let resumed = state.client().resume_workflow(&name, operator).await.map_err(|err| ApiError::ops("resume workflow", err))?;
    Ok(Json(WorkflowPauseView::from(&resumed)))
}

/// Check a definition (YAML or JSON) without registering it.
///
/// Always 200 when the body could be read: `valid` says whether the
/// definition is valid, `problems` lists every problem with its position.
#[utoipa::path(
    post, path = "/v1/workflows/validate", tag = "workflows",
    request_body(content = String, description = "A workflow definition, YAML or JSON", content_type = "application/yaml"),
    responses(
        (status = 200, description = "The outcome", body = ValidationView),
        (status = 400, description = "The body is empty or not UTF-8 text", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn validate(State(state): State<ApiState>, ApiText(text): ApiText) -> ApiResult<Json<ValidationView>> {
    required_body(&text)?;
    Ok(Json(match rota_workflow::parse(BODY_SOURCE, &text, state.catalog()) {
        Ok(workflow) => ValidationView { valid: true, workflow: Some(WorkflowView::new(&workflow, None)), problems: Vec::new() },
        Err(diagnostics) => ValidationView { valid: false, workflow: None, problems: problems(&diagnostics) },
    }))
}

/// An empty body is a missing definition, not an invalid one.
fn required_body(text: &str) -> ApiResult<()> {
    if text.trim().is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "missing_body",
            "request body: a workflow definition (YAML or JSON) is required",
        ));
    }
    Ok(())
}

/// Register a new version of a workflow (YAML or JSON).
///
/// 201 when registered; 200 when the same definition was registered under
/// that version already; 409 when a different one was.
#[utoipa::path(
    post, path = "/v1/workflows", tag = "workflows",
    request_body(content = String, description = "A workflow definition, YAML or JSON", content_type = "application/yaml"),
    responses(
        (status = 201, description = "Registered", body = WorkflowView),
        (status = 200, description = "This definition was registered under this version already", body = WorkflowView),
        (status = 400, description = "The body is empty or not UTF-8 text", body = ErrorBody),
        (status = 409, description = "A different definition has this version", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "Invalid definition: every problem", body = InvalidWorkflowBody),
    ),
    security(("bearer" = []))
)]
pub async fn register(State(state): State<ApiState>, ApiText(text): ApiText) -> ApiResult<Response> {
    required_body(&text)?;
    let workflow = match rota_workflow::parse(BODY_SOURCE, &text, state.catalog()) {
        Ok(workflow) => workflow,
        Err(diagnostics) => {
            let body = InvalidWorkflowBody {
                error: ErrorDetail {
                    code: "invalid_workflow".into(),
                    reason: format!("the definition has {} problem(s), listed in `problems`", diagnostics.len()),
                },
                problems: problems(&diagnostics),
            };
            return Ok((StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response());
        }
    };
    let registered = state.store().workflow(workflow.name(), Some(workflow.version())).await;
    let registered = registered.map_err(|err| ApiError::store("register workflow", err))?;
    let definition = serde_json::to_value(&workflow).map_err(|err| ApiError::internal("register workflow", err))?;
    let status = match registered {
        Some(entry) if entry.definition == definition => StatusCode::OK,
        Some(_) => return Err(version_taken(&workflow)),
        None => {
            let result = state.store().register_workflow(workflow.name(), workflow.version(), &definition).await;
            match result {
                Ok(()) => {
                    state.workflows().registered(std::sync::Arc::new(workflow.clone()));
                    StatusCode::CREATED
                }
                Err(rota_store::Error::Conflict(_)) => return Err(version_taken(&workflow)),
                Err(err) => return Err(ApiError::store("register workflow", err)),
            }
        }
    };
    let entry = state.store().workflow(workflow.name(), Some(workflow.version())).await;
    let entry = entry.map_err(|err| ApiError::store("register workflow", err))?;
    let registered_at = entry.map(|e| e.registered_at.as_millis());
    Ok((status, Json(WorkflowView::new(&workflow, registered_at))).into_response())
}

fn version_taken(workflow: &Workflow) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "version_exists",
        format!(
            "workflow {} version {} is registered with a different definition; versions are immutable, register a new version",
            workflow.name(),
            workflow.version()
        ),
    )
}
