//! `POST /v1/callbacks/{token}`: a remote service completes (or fails) the
//! callback step attempt that its token names.
//!
//! The route takes no bearer token: the callback token is the credential.
//! It is unguessable, names one attempt of one step, works once, and only
//! while that attempt runs (see `rota_engine::callback`), which is what a
//! third-party service can be given without an API token of its own.

use axum::Json;
use axum::extract::State;
use rota_engine::callback::Outcome;

use crate::ApiState;
use crate::error::{ApiError, ApiJson, ApiPath, ApiResult, ErrorBody};
use crate::wire::{CallbackAccepted, CallbackPath, CallbackRequest};

/// Who a callback was sent by, as the history shows it: the route knows
/// no more of its caller than that it holds the token.
const SENT_BY: &str = "the holder of the callback token";

/// Complete or fail a callback step's attempt.
///
/// The body is `{"output": …}` for a success (the step's output; `{}` is
/// a success with a `null` output), or `{"error": "…", "retryable": false}`
/// for a failure: a permanent one by default, counted against the task's
/// `max_failures` and tried again as a new attempt with `"retryable": true`.
/// Refused, changing nothing, when the token's attempt is no longer
/// waiting: it completed, failed or timed out, a later attempt replaced
/// it, or the token was used already.
#[utoipa::path(
    post, path = "/v1/callbacks/{token}", tag = "callbacks",
    params(CallbackPath),
    request_body(content = CallbackRequest, description = "The outcome", content_type = "application/json"),
    responses(
        (status = 200, description = "Taken: the step completed, or its failure was handed to the task's Scheduler", body = CallbackAccepted),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 404, description = "No step waits for this token", body = ErrorBody),
        (status = 409, description = "The token's attempt is no longer waiting, or the token was used", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 422, description = "Both `output` and `error`, `retryable` without `error`, or an output too large", body = ErrorBody),
    )
)]
pub async fn callback(
    State(state): State<ApiState>,
    ApiPath(CallbackPath { token }): ApiPath<CallbackPath>,
    ApiJson(request): ApiJson<CallbackRequest>,
) -> ApiResult<Json<CallbackAccepted>> {
    let outcome = match request {
        CallbackRequest { output, error: None, retryable: None } => Outcome::Succeeded { output: output.unwrap_or_default() },
        CallbackRequest { output: None, error: Some(error), retryable } => Outcome::Failed { error, retryable: retryable.unwrap_or(false) },
        CallbackRequest { error: None, .. } => return Err(ApiError::invalid_body("retryable: only a failure (`error`) is retryable")),
        CallbackRequest { .. } => {
            return Err(ApiError::invalid_body("a callback gives `output` (a success) or `error` (a failure), not both"));
        }
    };
    let accepted = state.client().callback(&token, outcome, SENT_BY).await.map_err(|err| ApiError::ops("callback", err))?;
    Ok(Json(CallbackAccepted {
        task_id: accepted.task.to_string(),
        step: accepted.step.to_string(),
        attempt: accepted.attempt,
        completed: accepted.completed,
    }))
}
