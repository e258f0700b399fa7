//! [`ApiError`]: every error the API returns, and the one place where it
//! turns into a response: `{"error": {"code": "…", "reason": "…"}}` with a
//! status that says whose fault it is. Invalid input is always a 4xx.
//!
//! Also the extractors [`ApiJson`], [`ApiQuery`] and [`ApiPath`]: axum's own
//! extractors, whose rejections are turned into the same JSON shape (with a
//! code per kind of problem) instead of axum's plain-text bodies.
//!
//! Details of server-side failures go to the log, never to the client.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, OptionalFromRequest, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::ToSchema;

/// The body of every error response.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What went wrong: a stable code for programs and a reason for people.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable snake_case code (`not_found`, `invalid_query`, …); see `docs/api.md`.
    pub code: String,
    /// What is wrong, naming the field or request concerned.
    pub reason: String,
}

/// An error response: status, stable code, reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The stable code.
    pub code: &'static str,
    /// The human-readable reason.
    pub reason: String,
    /// When to try again, sent as `Retry-After` (whole seconds).
    pub retry_after: Option<std::time::Duration>,
}

/// The result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// An error with this status, code and reason.
    pub fn new(status: StatusCode, code: &'static str, reason: impl Into<String>) -> Self {
        ApiError { status, code, reason: reason.into(), retry_after: None }
    }

    /// 429: the Pending backlog is at its bound (`--pending-max`); try
    /// again after `retry_after`, when it is counted again.
    pub fn backlog_full(pending: u64, pending_max: u64, retry_after: std::time::Duration) -> Self {
        let reason = format!(
            "submit: {pending} tasks are waiting to start, at the bound of {pending_max} (--pending-max); try again after {} s",
            retry_after.as_secs().max(1)
        );
        ApiError { retry_after: Some(retry_after), ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "backlog_full", reason) }
    }

    /// 400: a path parameter is not valid (`what` names it).
    pub fn invalid_path(what: &str, why: impl std::fmt::Display) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_path", format!("path parameter {what}: {why}"))
    }

    /// 400: a query parameter is not valid (`what` names it).
    pub fn invalid_query(what: &str, why: impl std::fmt::Display) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", format!("query parameter {what}: {why}"))
    }

    /// 400: a header is not valid (`what` names it).
    pub fn invalid_header(what: &str, why: impl std::fmt::Display) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_header", format!("header {what}: {why}"))
    }

    /// 422: the body is well-formed but a field is not valid.
    pub fn invalid_body(why: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", why)
    }

    /// 404: `what` does not exist.
    pub fn not_found(what: impl std::fmt::Display) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("{what} not found"))
    }

    /// 401: no token, or one that is not configured. Says which, never the token.
    pub fn unauthorized(why: &str) -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", why)
    }

    /// 403: the token's scopes do not allow the request.
    pub fn forbidden(why: impl Into<String>) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", why)
    }

    /// 500: a failure on the server; `detail` goes to the log only.
    pub fn internal(request: &str, detail: impl std::fmt::Display) -> Self {
        tracing::error!("{request}: {detail}");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("{request} failed on the server (details are in its log)"))
    }

    /// The store error of `request`, classified.
    pub fn store(request: &str, err: rota_store::Error) -> Self {
        use rota_store::Error as E;
        match err {
            E::NotFound(what) => ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("{request}: {what} not found")),
            E::Invalid(why) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", format!("{request}: {why}")),
            E::Paused(queue) => ApiError::new(StatusCode::CONFLICT, "queue_paused", format!("{request}: queue {queue} is paused")),
            E::Conflict(why) | E::LeaseLost(why) => {
                ApiError::new(StatusCode::CONFLICT, "conflict", format!("{request}: changed concurrently, try again ({why})"))
            }
            E::Unavailable(why) => {
                tracing::warn!("{request}: store unavailable: {why}");
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", format!("{request}: the store is unavailable"))
            }
            E::Closed => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", format!("{request}: the store is closed")),
            E::Backend(detail) => ApiError::internal(request, format!("store backend: {detail}")),
        }
    }

    /// The engine error of `request`, classified.
    pub fn engine(request: &str, err: rota_engine::Error) -> Self {
        use rota_engine::Error as E;
        match err {
            E::Store(err) => ApiError::store(request, err),
            E::Workflow(detail) | E::Config(detail) | E::Export(detail) => ApiError::internal(request, detail),
            err @ E::OutOfBounds { .. } => ApiError::internal(request, err),
            err @ E::InvalidSubmission { .. } => ApiError::invalid_body(err.to_string()),
        }
    }

    /// The error of an operator's `request`: a rule that refused it is a
    /// 404 or 409 whose reason is the rule's own text (the CLI prints the
    /// same one on a local store); a failure is classified as
    /// [`ApiError::engine`] does.
    pub fn ops(request: &str, err: rota_engine::ops::Error) -> Self {
        use rota_engine::ops::Error as E;
        let reason = err.to_string();
        match err {
            E::TaskNotFound(_) | E::StepNotFound { .. } | E::ScheduleNotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", reason)
            }
            E::ScheduleExists(_) => ApiError::new(StatusCode::CONFLICT, "schedule_exists", reason),
            E::InvalidSchedule { .. } => ApiError::invalid_body(reason),
            E::UnknownWorkflow(_) => ApiError::new(StatusCode::NOT_FOUND, "unknown_workflow", reason),
            E::BeforeNotFound(id) => ApiError::invalid_query("before", format!("task {id} not found")),
            E::InvalidSubmission { .. } | E::InvalidRequest { .. } => ApiError::invalid_body(reason),
            E::Refused { .. } => ApiError::new(StatusCode::CONFLICT, "refused", reason),
            E::Signal { why, .. } if why.is_invalid_request() => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_signal", reason),
            E::Signal { .. } => ApiError::new(StatusCode::CONFLICT, "refused", reason),
            E::Callback(rota_engine::callback::Refusal::Unknown) => ApiError::new(StatusCode::NOT_FOUND, "unknown_callback", reason),
            E::Callback(rota_engine::callback::Refusal::TooLarge { .. }) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_callback", reason)
            }
            E::Callback(_) => ApiError::new(StatusCode::CONFLICT, "refused", reason),
            E::Engine(err) => ApiError::engine(request, err),
        }
    }

    fn body(&self) -> ErrorBody {
        ErrorBody { error: ErrorDetail { code: self.code.to_owned(), reason: self.reason.clone() } }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.reason)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(after) = self.retry_after {
            // Whole seconds, rounded up: 0 would say "at once".
            let seconds = after.as_millis().div_ceil(1000).max(1);
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(u64::try_from(seconds).unwrap_or(u64::MAX)));
        }
        response
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let status = rejection.status();
        let code = match &rejection {
            JsonRejection::MissingJsonContentType(_) => "unsupported_media_type",
            JsonRejection::JsonSyntaxError(_) => "malformed_json",
            JsonRejection::JsonDataError(_) => "invalid_body",
            _ if status == StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
            _ => "unreadable_body",
        };
        ApiError::new(status, code, format!("request body: {}", rejection.body_text()))
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        let status = if rejection.status().is_server_error() { StatusCode::BAD_REQUEST } else { rejection.status() };
        ApiError::new(status, "invalid_path", rejection.body_text())
    }
}

/// A JSON body, rejected as an [`ApiError`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let axum::Json(value) = <axum::Json<T> as FromRequest<S>>::from_request(request, state).await?;
        Ok(ApiJson(value))
    }
}

/// An optional JSON body: none when the body is empty (whatever the
/// `Content-Type` says, so that a client sending a bodiless POST with a
/// JSON type reads as before the body existed). A body that is there must
/// be JSON: without a JSON `Content-Type` it is refused (415), never
/// ignored.
impl<T, S> OptionalFromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Option<Self>, Self::Rejection> {
        let headers = request.headers();
        let length = headers.get(header::CONTENT_LENGTH).and_then(|length| length.to_str().ok()?.parse::<u64>().ok());
        let chunked = headers.get(header::TRANSFER_ENCODING).is_some();
        if length.unwrap_or(0) == 0 && !chunked {
            return Ok(None);
        }
        <ApiJson<T> as FromRequest<S>>::from_request(request, state).await.map(Some)
    }
}

/// Query parameters, rejected as an [`ApiError`]. A parameter given more
/// than once fills a `Vec` field (`?tag=a=1&tag=b=2`), as OpenAPI's
/// exploded form arrays are sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        // The error names the parameter it is about.
        serde_path_to_error::deserialize(serde_html_form::Deserializer::from_bytes(query.as_bytes())).map(ApiQuery).map_err(|err| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                format!("Failed to deserialize query string: {}: {}", err.path(), err.inner()),
            )
        })
    }
}

/// Path parameters, rejected as an [`ApiError`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(value) = axum::extract::Path::<T>::from_request_parts(parts, state).await?;
        Ok(ApiPath(value))
    }
}

/// A text body (a workflow definition), rejected as an [`ApiError`].
#[derive(Debug, Clone, Default)]
pub struct ApiText(pub String);

impl<S> FromRequest<S> for ApiText
where
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match String::from_request(request, state).await {
            Ok(text) => Ok(ApiText(text)),
            Err(rejection) => {
                let status = rejection.status();
                let code = if status == StatusCode::PAYLOAD_TOO_LARGE { "body_too_large" } else { "unreadable_body" };
                let status = if status.is_server_error() { StatusCode::BAD_REQUEST } else { status };
                Err(ApiError::new(status, code, format!("request body: {}", rejection.body_text())))
            }
        }
    }
}
