//! The worker protocol: agents written in any language
//! receive step requests over HTTP and answer them, with the deadline and
//! fencing rules of the built-in agents.
//!
//! - `POST /v1/workers/{agent}/receive` leases requests from the agent's
//!   queue `agent.<name>` (a long poll, bounded by [`WorkerConfig`]).
//!   Requests already past their deadline are dropped without a reply, and
//!   messages that are not step requests are dead-lettered, as a built-in
//!   agent does.
//! - `…/renew` extends a lease, never past the step's deadline.
//! - `…/complete` and `…/fail` commit the reply a built-in agent would send,
//!   together with the completion of the request, in one store commit
//!   ([`rota_engine::agent_worker::commit_reply`]: the same code). After the
//!   deadline the reply is dropped (the request is consumed silently) and
//!   the worker gets 410 `deadline_passed`; a lease that ran out or was
//!   taken over is 409 `lease_lost`.
//! - A renew or a reply for a task that has finished meanwhile (an
//!   operator cancelled it) stops the call as a built-in agent's is
//!   stopped: the request is consumed without a reply, a `call_stopped`
//!   event is recorded ([`rota_engine::agent_worker::commit_stop`]), and
//!   the worker gets 410 `task_finished`: stop and send nothing.
//!
//! The lease token handed to a worker is the store's lease together with
//! what the reply needs (task, step, attempt, compensate, reply queue,
//! deadline), signed with HMAC-SHA256 under [`LeaseKey`]. The store's own
//! lease tokens are sequence numbers, so the signature is what makes the
//! token unforgeable: a worker cannot answer a request it did not receive,
//! nor one of another agent. API processes that serve one fleet of
//! workers must share the key.
//!
//! Deliberately left out: pushing requests to workers (they poll), and
//! running an agent's own retries (the worker retries transient faults
//! within the deadline itself, following the request's `retry` policy).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use rand::RngCore;
use rota_engine::agent_worker::{self, ReplyAddress};
use rota_engine::long_poll;
use rota_engine::protocol::{self, ReplyOutcome, StepRequest};
use rota_model::{FailureClass, FailureKind, InstanceId, LeaseToken, QueueName, StepName, TaskId, Timestamp};
use rota_store::{Delivery, QueueConfig, RECEIVE_MAX, Receive};
use rota_workflow::AgentName;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::ApiState;
use crate::error::{ApiError, ApiJson, ApiPath, ApiResult, ErrorBody};
use crate::wire::{
    AgentPath, CompleteRequest, FailRequest, ReceiveRequest, ReceiveResponse, RenewRequest, RenewResponse, ReplyView, RetryView,
    WorkRequest,
};

/// The key that signs lease tokens. Its `Debug` never shows it.
#[derive(Clone)]
pub struct LeaseKey(Arc<[u8]>);

impl LeaseKey {
    /// The shortest key accepted, in bytes.
    pub const BYTES_MIN: usize = 32;

    /// A key of these bytes (at least [`LeaseKey::BYTES_MIN`]). Every API
    /// process that serves the same workers needs the same key.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, crate::Error> {
        let bytes: Vec<u8> = bytes.into();
        if bytes.len() < Self::BYTES_MIN {
            return Err(crate::Error::Config(format!("workers.lease_key must be at least {} bytes, got {}", Self::BYTES_MIN, bytes.len())));
        }
        Ok(LeaseKey(bytes.into()))
    }

    /// A random key: enough for one API process (tokens it issued are
    /// refused by any other process, and after a restart).
    pub fn random() -> Self {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        LeaseKey(Arc::from(&bytes[..]))
    }

    fn mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC takes keys of any length")
    }
}

impl fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeaseKey(<redacted>)")
    }
}

/// The settings of the worker protocol. Checked by [`WorkerConfig::validate`].
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The agents that external workers run: workflow steps may name them
    /// (they join [`crate::Config::agents`] when definitions are validated),
    /// and only their queues are served by the worker endpoints.
    pub remote_agents: Vec<AgentName>,
    /// The most requests one receive may lease.
    pub receive_max: u32,
    /// The longest wait of a receive (long poll); also its default.
    pub receive_wait_max: Duration,
    /// The lease a receive takes, and a renewal's default.
    pub lease: Duration,
    /// The key that signs lease tokens.
    pub lease_key: LeaseKey,
}

impl Default for WorkerConfig {
    /// No remote agents, 32 requests per receive, a 20 s long poll, a 30 s
    /// lease and a random key.
    fn default() -> Self {
        WorkerConfig {
            remote_agents: Vec::new(),
            receive_max: 32,
            receive_wait_max: Duration::from_secs(20),
            lease: Duration::from_secs(30),
            lease_key: LeaseKey::random(),
        }
    }
}

impl WorkerConfig {
    /// The longest `receive_wait_max` that may be configured.
    pub const RECEIVE_WAIT_LIMIT: Duration = Duration::from_secs(300);
    /// The shortest lease: a worker needs time to renew it.
    pub const LEASE_MIN: Duration = Duration::from_secs(1);

    /// Checks every bound; the error names the field.
    pub fn validate(&self) -> Result<(), crate::Error> {
        let fail = |field: &str, why: String| Err(crate::Error::Config(format!("workers.{field}: {why}")));
        if self.receive_max == 0 || self.receive_max > RECEIVE_MAX {
            return fail("receive_max", format!("must be between 1 and {RECEIVE_MAX}, got {}", self.receive_max));
        }
        if self.receive_wait_max > Self::RECEIVE_WAIT_LIMIT {
            return fail("receive_wait_max", format!("must be at most {:?}, got {:?}", Self::RECEIVE_WAIT_LIMIT, self.receive_wait_max));
        }
        if self.lease < Self::LEASE_MIN || self.lease > QueueConfig::LEASE_MAX {
            return fail("lease", format!("must be between {:?} and {:?}, got {:?}", Self::LEASE_MIN, QueueConfig::LEASE_MAX, self.lease));
        }
        for agent in &self.remote_agents {
            if QueueName::new(format!("agent.{agent}")).is_err() {
                return fail("remote_agents", format!("agent {agent}: its queue name agent.{agent} would be too long"));
            }
        }
        Ok(())
    }
}

/// What a lease token proves and carries: the store's lease of the request
/// message and the address of its reply. Short field names: it travels
/// with every call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Claims {
    /// The agent queue.
    q: QueueName,
    /// The store's lease: message sequence number and lease epoch.
    m: i64,
    e: i64,
    /// The reply address: task, step, attempt, compensate, inbox.
    t: TaskId,
    s: StepName,
    a: u32,
    c: bool,
    r: QueueName,
    /// The step's deadline, ms since the epoch.
    d: i64,
    /// The classes of transient failure the step's policy fails at once
    /// (`retry.non_retryable`); left out when none, so tokens without it
    /// read the same.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    n: Vec<FailureClass>,
}

impl Claims {
    fn new(delivery: &Delivery, request: &StepRequest) -> Self {
        let call = &request.call;
        Claims {
            q: delivery.queue.clone(),
            m: delivery.lease_token.message,
            e: delivery.lease_token.epoch,
            t: call.task_id.clone(),
            s: call.step.clone(),
            a: call.attempt,
            c: call.compensate,
            r: request.reply_to.clone(),
            d: call.complete_by.as_millis(),
            n: request.retry.non_retryable().to_vec(),
        }
    }

    fn lease(&self) -> LeaseToken {
        LeaseToken { message: self.m, epoch: self.e }
    }

    fn complete_by(&self) -> Timestamp {
        Timestamp::from_millis(self.d)
    }

    fn address(&self) -> ReplyAddress {
        ReplyAddress { task_id: self.t.clone(), step: self.s.clone(), attempt: self.a, compensate: self.c, reply_to: self.r.clone() }
    }
}

/// The version prefix of lease tokens, so that the format can change.
const TOKEN_PREFIX: &str = "v1.";

/// `v1.<claims, base64url JSON>.<HMAC-SHA256 of what precedes, base64url>`.
fn sign(key: &LeaseKey, claims: &Claims) -> String {
    let payload = serde_json::to_vec(claims).expect("claims serialize");
    let signed = format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(payload));
    let mut mac = key.mac();
    mac.update(signed.as_bytes());
    let tag = mac.finalize().into_bytes();
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag))
}

/// The claims of a token this server signed, or why not.
fn verify(key: &LeaseKey, token: &str) -> Result<Claims, &'static str> {
    let (signed, tag) = token.rsplit_once('.').ok_or("not a lease token")?;
    let payload = signed.strip_prefix(TOKEN_PREFIX).ok_or("not a lease token of this version")?;
    let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| "not a lease token")?;
    let mut mac = key.mac();
    mac.update(signed.as_bytes());
    // Compared in constant time by the MAC itself.
    mac.verify_slice(&tag).map_err(|_| "the signature does not match (a token of another server, or altered)")?;
    let payload = URL_SAFE_NO_PAD.decode(payload).map_err(|_| "not a lease token")?;
    serde_json::from_slice(&payload).map_err(|_| "not a lease token")
}

/// 422 `invalid_lease_token`.
fn invalid_token(why: impl fmt::Display) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_lease_token", format!("lease_token: {why}"))
}

/// 409 `lease_lost`.
fn lease_lost(claims: &Claims) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "lease_lost",
        format!(
            "the lease of task {} step {} attempt {} was lost (it ran out, or the request was answered or delivered again): drop the work",
            claims.t, claims.s, claims.a
        ),
    )
}

/// 410 `deadline_passed`.
fn deadline_passed(claims: &Claims) -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "deadline_passed",
        format!(
            "task {} step {} attempt {} passed its complete-by ({} ms): the request was dropped without a reply, as a built-in agent does",
            claims.t, claims.s, claims.a, claims.d
        ),
    )
}

/// 410 `task_finished`.
fn task_finished(claims: &Claims, reason: &str) -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "task_finished",
        format!(
            "task {} step {} attempt {}: {reason}; the call is stopped and the request dropped without a reply: stop and send nothing",
            claims.t, claims.s, claims.a
        ),
    )
}

/// Stops the call when its task has finished (a cancel): consumes the
/// request without a reply and records it, as a built-in agent does, and
/// answers 410 `task_finished`. A task still going on passes.
async fn stop_if_finished(state: &ApiState, agent: &AgentName, queue: &QueueName, claims: &Claims) -> ApiResult<()> {
    let task = state.store().task(&claims.t).await.map_err(|err| ApiError::store("read the request's task", err))?;
    let Some(reason) = agent_worker::stop_reason(task.as_ref().map(|record| &record.task)) else { return Ok(()) };
    let now = state.clock().now();
    match agent_worker::commit_stop(state.store(), queue, claims.lease(), &claims.address(), agent.as_str(), &reason, now).await {
        Ok(()) => Err(task_finished(claims, &reason)),
        Err(rota_store::Error::LeaseLost(_)) => Err(lease_lost(claims)),
        Err(err) => Err(ApiError::store("stop a call of a finished task", err)),
    }
}

/// The agent from the path: one of the configured remote agents, and its queue.
fn remote_agent(state: &ApiState, raw: String) -> ApiResult<(AgentName, QueueName)> {
    let agent = AgentName::new(raw).map_err(|err| ApiError::invalid_path("agent", err))?;
    let workers = &state.config().workers;
    if !workers.remote_agents.contains(&agent) {
        let known: Vec<&str> = workers.remote_agents.iter().map(AgentName::as_str).collect();
        let known = if known.is_empty() { "none is configured".to_owned() } else { format!("the remote agents are {}", known.join(", ")) };
        return Err(ApiError::new(StatusCode::NOT_FOUND, "unknown_agent", format!("agent {agent} is not a remote agent ({known})")));
    }
    let queue = protocol::agent_queue(agent.as_str());
    Ok((agent, queue))
}

/// The claims of `token`, which must be for `queue`.
fn claims(state: &ApiState, queue: &QueueName, token: &str) -> ApiResult<Claims> {
    let claims = verify(&state.config().workers.lease_key, token).map_err(invalid_token)?;
    if &claims.q != queue {
        return Err(invalid_token(format!("the token is for queue {}, not {queue}", claims.q)));
    }
    Ok(claims)
}

/// Drops a request whose deadline has passed: its message is consumed
/// without a reply, as a built-in agent goes silent. A lease already lost
/// changes nothing (someone else drops it).
async fn drop_request(state: &ApiState, queue: &QueueName, lease: LeaseToken) -> ApiResult<()> {
    match state.store().complete(queue, lease).await {
        Ok(()) | Err(rota_store::Error::LeaseLost(_)) => Ok(()),
        Err(err) => Err(ApiError::store("drop a request past its deadline", err)),
    }
}

/// Lease step requests of an agent (long poll).
///
/// Waits up to `wait_ms` for a first request. Each request comes with an
/// opaque `lease_token`; renew the lease while working, then `complete` or
/// `fail` before `complete_by`.
#[utoipa::path(
    post, path = "/v1/workers/{agent}/receive", tag = "workers", params(AgentPath), request_body = ReceiveRequest,
    responses(
        (status = 200, description = "The requests leased (none when the wait ended first)", body = ReceiveResponse),
        (status = 400, description = "Invalid agent name or malformed JSON", body = ErrorBody),
        (status = 403, description = "The token's scope does not name this agent's queue", body = ErrorBody),
        (status = 404, description = "Not a remote agent of this server", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 409, description = "The queue is paused", body = ErrorBody),
        (status = 422, description = "max or wait_ms out of bounds", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn receive(
    State(state): State<ApiState>,
    ApiPath(AgentPath { agent }): ApiPath<AgentPath>,
    ApiJson(request): ApiJson<ReceiveRequest>,
) -> ApiResult<Json<ReceiveResponse>> {
    let (_agent, queue) = remote_agent(&state, agent)?;
    let config = &state.config().workers;
    let max = request.max.unwrap_or(1);
    if max == 0 || max > config.receive_max {
        return Err(ApiError::invalid_body(format!("max: must be between 1 and {}, got {max}", config.receive_max)));
    }
    let wait = match request.wait_ms {
        None => config.receive_wait_max,
        Some(ms) if Duration::from_millis(ms) <= config.receive_wait_max => Duration::from_millis(ms),
        Some(ms) => {
            return Err(ApiError::invalid_body(format!("wait_ms: must be at most {}, got {ms}", config.receive_wait_max.as_millis())));
        }
    };
    let mut receive = Receive::up_to(max).waiting(wait).leasing(config.lease);
    if let Some(worker) = request.worker {
        receive = receive.by(InstanceId::new(worker).map_err(|err| ApiError::invalid_body(format!("worker: {err}")))?);
    }
    let deliveries = receive_unless_closing(&state, &queue, receive).await?;
    let now = state.clock().now();
    let mut requests = Vec::with_capacity(deliveries.len());
    for delivery in deliveries {
        let request = match serde_json::from_str::<StepRequest>(delivery.body.get()) {
            Ok(request) => request,
            Err(err) => {
                // A poison message, dead-lettered as a built-in agent does.
                let reason = format!("not a step request: {err}");
                if let Err(err) = state.store().dead_letter(&queue, delivery.lease_token, reason).await {
                    tracing::warn!("could not dead-letter message {} of {queue}: {err}", delivery.id);
                }
                continue;
            }
        };
        if agent_worker::too_late(request.complete_by(), now) {
            tracing::debug!("request {} arrived after its complete-by: dropped without reply", delivery.id);
            // Not answered with an error: the other requests are leased
            // already, and this one's lease simply runs out if this failed.
            if let Err(err) = drop_request(&state, &queue, delivery.lease_token).await {
                tracing::warn!("could not drop request {} of {queue} past its deadline: {err}", delivery.id);
            }
            continue;
        }
        requests.push(work_request(&state, &delivery, request));
    }
    Ok(Json(ReceiveResponse { requests }))
}

/// Receives, unless the server starts to shut down first: then answers
/// nothing at once, so that a long poll does not hold up the shutdown.
/// Whatever the receive leases after that, or after the worker hung up, is
/// given back at once.
async fn receive_unless_closing(state: &ApiState, queue: &QueueName, receive: Receive) -> ApiResult<Vec<Delivery>> {
    let mut closing = state.closing();
    if *closing.borrow() {
        return Ok(Vec::new());
    }
    let closed = async move {
        let _ = closing.wait_for(|closing| *closing).await;
    };
    let received = long_poll::receive_unless(state.store(), queue, receive, closed).await.map_err(|err| ApiError::store("receive", err))?;
    Ok(received.unwrap_or_default())
}

fn work_request(state: &ApiState, delivery: &Delivery, request: StepRequest) -> WorkRequest {
    let lease_token = sign(&state.config().workers.lease_key, &Claims::new(delivery, &request));
    let retry = RetryView {
        attempts_max: request.retry.attempts_max(),
        backoff_initial_ms: request.retry.backoff_initial().as_millis() as u64,
        backoff_max_ms: request.retry.backoff_max().as_millis() as u64,
        non_retryable: request.retry.non_retryable().iter().map(|class| class_name(*class)).collect(),
    };
    let call = request.call;
    WorkRequest {
        lease_token,
        lease_until: delivery.lease_until.as_millis(),
        task_id: call.task_id.to_string(),
        workflow: call.workflow,
        step: call.step.to_string(),
        attempt: call.attempt,
        compensate: call.compensate,
        input: call.input,
        idempotency_key: call.idempotency_key,
        complete_by: call.complete_by.as_millis(),
        callback_token: call.callback_token,
        delivery_count: delivery.delivery_count,
        retry,
    }
}

/// Extend the lease of a request being worked on.
///
/// The lease runs to now + `lease_ms`, cut at the step's deadline. Past
/// the deadline the request is dropped (410 `deadline_passed`); when the
/// task has finished (an operator cancelled it), the call is stopped (410
/// `task_finished`).
#[utoipa::path(
    post, path = "/v1/workers/{agent}/renew", tag = "workers", params(AgentPath), request_body = RenewRequest,
    responses(
        (status = 200, description = "Renewed", body = RenewResponse),
        (status = 400, description = "Invalid agent name or malformed JSON", body = ErrorBody),
        (status = 403, description = "The token's scope does not name this agent's queue", body = ErrorBody),
        (status = 404, description = "Not a remote agent of this server", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 409, description = "`lease_lost`: the lease ran out or was taken over; drop the work", body = ErrorBody),
        (status = 410, description = "`deadline_passed`: the request was dropped, or `task_finished`: the task was cancelled (or ended) and the call is stopped; stop and send nothing", body = ErrorBody),
        (status = 422, description = "`invalid_lease_token`, or lease_ms out of bounds", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn renew(
    State(state): State<ApiState>,
    ApiPath(AgentPath { agent }): ApiPath<AgentPath>,
    ApiJson(request): ApiJson<RenewRequest>,
) -> ApiResult<Json<RenewResponse>> {
    let (agent, queue) = remote_agent(&state, agent)?;
    let claims = claims(&state, &queue, &request.lease_token)?;
    let asked = match request.lease_ms {
        None => state.config().workers.lease,
        Some(ms) if ms >= 1 && Duration::from_millis(ms) <= QueueConfig::LEASE_MAX => Duration::from_millis(ms),
        Some(ms) => {
            return Err(ApiError::invalid_body(format!(
                "lease_ms: must be between 1 and {}, got {ms}",
                QueueConfig::LEASE_MAX.as_millis()
            )));
        }
    };
    let now = state.clock().now();
    let left = claims.complete_by().since(now);
    if agent_worker::too_late(claims.complete_by(), now) || left < Duration::from_millis(1) {
        drop_request(&state, &queue, claims.lease()).await?;
        return Err(deadline_passed(&claims));
    }
    stop_if_finished(&state, &agent, &queue, &claims).await?;
    match state.store().renew(&queue, claims.lease(), Some(asked.min(left))).await {
        Ok(until) => Ok(Json(RenewResponse { lease_until: until.as_millis() })),
        Err(rota_store::Error::LeaseLost(_)) => Err(lease_lost(&claims)),
        Err(err) => Err(ApiError::store("renew", err)),
    }
}

/// Answer a request with the step's output.
///
/// Commits the reply together with the request's completion, as a built-in
/// agent does. Past the deadline, or when the task has finished (an
/// operator cancelled it), the reply is dropped (410).
#[utoipa::path(
    post, path = "/v1/workers/{agent}/complete", tag = "workers", params(AgentPath), request_body = CompleteRequest,
    responses(
        (status = 200, description = "The reply was committed", body = ReplyView),
        (status = 400, description = "Invalid agent name or malformed JSON", body = ErrorBody),
        (status = 403, description = "The token's scope does not name this agent's queue", body = ErrorBody),
        (status = 404, description = "Not a remote agent of this server", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 409, description = "`lease_lost`: the lease ran out or was taken over; the reply was not sent", body = ErrorBody),
        (status = 410, description = "`deadline_passed`: the reply was dropped, or `task_finished`: the task was cancelled (or ended), the reply was dropped and the call recorded as stopped", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "`invalid_lease_token`, or an output the store refuses", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn complete(
    State(state): State<ApiState>,
    ApiPath(AgentPath { agent }): ApiPath<AgentPath>,
    ApiJson(request): ApiJson<CompleteRequest>,
) -> ApiResult<Json<ReplyView>> {
    let (agent, queue) = remote_agent(&state, agent)?;
    let claims = claims(&state, &queue, &request.lease_token)?;
    reply(&state, &agent, &queue, &claims, ReplyOutcome::Succeeded { output: request.output }).await
}

/// Answer a request with a failure: transient (`retryable: true`, the step
/// is retried after a backoff) or permanent (the task goes to `error` or
/// compensates).
#[utoipa::path(
    post, path = "/v1/workers/{agent}/fail", tag = "workers", params(AgentPath), request_body = FailRequest,
    responses(
        (status = 200, description = "The reply was committed", body = ReplyView),
        (status = 400, description = "Invalid agent name or malformed JSON", body = ErrorBody),
        (status = 403, description = "The token's scope does not name this agent's queue", body = ErrorBody),
        (status = 404, description = "Not a remote agent of this server", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 409, description = "`lease_lost`: the lease ran out or was taken over; the reply was not sent", body = ErrorBody),
        (status = 410, description = "`deadline_passed`: the reply was dropped, or `task_finished`: the task was cancelled (or ended), the reply was dropped and the call recorded as stopped", body = ErrorBody),
        (status = 422, description = "`invalid_lease_token`, or an empty message", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn fail(
    State(state): State<ApiState>,
    ApiPath(AgentPath { agent }): ApiPath<AgentPath>,
    ApiJson(request): ApiJson<FailRequest>,
) -> ApiResult<Json<ReplyView>> {
    let (agent, queue) = remote_agent(&state, agent)?;
    let claims = claims(&state, &queue, &request.lease_token)?;
    if request.message.trim().is_empty() {
        return Err(ApiError::invalid_body("message: must say what went wrong"));
    }
    let class = request.class.as_deref().map(parse_class).transpose()?;
    let outcome = match class.filter(|class| request.retryable && claims.n.contains(class)) {
        // The step's policy says this failure will not pass: fail now, as a
        // built-in agent does, and say why.
        Some(class) => ReplyOutcome::Failed {
            error: format!("{}; not retried: {class} is listed in retry.non_retryable", request.message),
            retryable: false,
        },
        None => ReplyOutcome::Failed { error: request.message, retryable: request.retryable },
    };
    reply(&state, &agent, &queue, &claims, outcome).await
}

/// A class of failure as the worker protocol writes it: an HTTP status
/// (`"503"`) or a kind (`"timeout"`), the words of `retry.non_retryable`.
fn class_name(class: FailureClass) -> String {
    match class {
        FailureClass::Status(status) => status.to_string(),
        FailureClass::Kind(kind) => kind.as_str().to_owned(),
    }
}

/// The `class` of a failure: an HTTP status or a kind; 422 naming the
/// field otherwise.
fn parse_class(text: &str) -> ApiResult<FailureClass> {
    let kinds = || FailureKind::ALL.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ");
    match text.parse::<u16>() {
        Ok(status) => FailureClass::status(status).map_err(|err| ApiError::invalid_body(format!("class: {err}"))),
        Err(_) => FailureKind::parse(text)
            .map(FailureClass::Kind)
            .ok_or_else(|| ApiError::invalid_body(format!("class: expected an HTTP status or one of {}, got {text:?}", kinds()))),
    }
}

/// Commits the reply with the request's completion (the engine's code), or
/// drops it past the deadline or when the task has finished.
async fn reply(
    state: &ApiState,
    agent: &AgentName,
    queue: &QueueName,
    claims: &Claims,
    outcome: ReplyOutcome,
) -> ApiResult<Json<ReplyView>> {
    if agent_worker::too_late(claims.complete_by(), state.clock().now()) {
        drop_request(state, queue, claims.lease()).await?;
        return Err(deadline_passed(claims));
    }
    stop_if_finished(state, agent, queue, claims).await?;
    let status = match &outcome {
        ReplyOutcome::Succeeded { .. } => "succeeded",
        ReplyOutcome::Failed { .. } => "failed",
    };
    let replied =
        || Json(ReplyView { task_id: claims.t.to_string(), step: claims.s.to_string(), attempt: claims.a, status: status.into() });
    let address = claims.address();
    let outcome = match state.scheduler() {
        Some(scheduler) => match agent_worker::reply_in_process(scheduler, queue, claims.lease(), &address, outcome).await {
            Ok(agent_worker::DecidedInProcess::Committed) => return Ok(replied()),
            // Late or fenced: the request is consumed without a reply, as
            // the inbox would have ignored it; a spent lease is still lost.
            Ok(agent_worker::DecidedInProcess::Ignored(_)) => {
                return match state.store().complete(queue, claims.lease()).await {
                    Ok(()) => Ok(replied()),
                    Err(rota_store::Error::LeaseLost(_)) => Err(lease_lost(claims)),
                    Err(err) => Err(ApiError::store("reply", err)),
                };
            }
            Err(outcome) => outcome,
        },
        None => outcome,
    };
    match agent_worker::commit_reply(state.store(), queue, claims.lease(), &address, outcome).await {
        Ok(()) => Ok(replied()),
        Err(rota_store::Error::LeaseLost(_)) => Err(lease_lost(claims)),
        Err(err) => Err(ApiError::store("reply", err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            q: QueueName::new("agent.py").unwrap(),
            m: 7,
            e: 2,
            t: TaskId::new("order 17/β").unwrap(),
            s: StepName::new("charge").unwrap(),
            a: 3,
            c: false,
            r: QueueName::new("rota.inbox.a").unwrap(),
            d: 1_795_000_000_000,
            n: vec![FailureClass::Status(503), FailureClass::Kind(FailureKind::Timeout)],
        }
    }

    #[test]
    fn a_token_without_non_retryable_classes_reads_as_none() {
        let key = LeaseKey::random();
        let mut plain = claims();
        plain.n.clear();
        let token = sign(&key, &plain);
        assert_eq!(verify(&key, &token).unwrap(), plain);
        let payload = token.split('.').nth(1).unwrap();
        let json = String::from_utf8(URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
        assert!(!json.contains("\"n\""), "an empty list is left out: {json}");
    }

    #[test]
    fn tokens_round_trip_and_refuse_tampering_and_other_keys() {
        let key = LeaseKey::random();
        let token = sign(&key, &claims());
        assert_eq!(verify(&key, &token).unwrap(), claims());
        assert!(verify(&LeaseKey::random(), &token).unwrap_err().contains("signature"));
        let mut forged = claims();
        forged.a = 4;
        let forged_payload = sign(&LeaseKey::random(), &forged);
        let (payload, _) = forged_payload.rsplit_once('.').unwrap();
        let (_, tag) = token.rsplit_once('.').unwrap();
        assert!(verify(&key, &format!("{payload}.{tag}")).is_err(), "another payload under this tag");
        for garbage in ["", ".", "v1.", "v1..", "v2.abc.def", "nonsense"] {
            assert!(verify(&key, garbage).is_err(), "{garbage:?}");
        }
    }

    #[test]
    fn keys_are_long_and_never_shown() {
        assert!(LeaseKey::new(vec![1u8; 31]).unwrap_err().to_string().contains("at least 32"));
        let key = LeaseKey::new(b"0123456789abcdef0123456789abcdef".to_vec()).unwrap();
        assert_eq!(format!("{key:?}"), "LeaseKey(<redacted>)");
    }

    #[test]
    fn the_config_is_checked() {
        WorkerConfig::default().validate().unwrap();
        let check = |change: fn(&mut WorkerConfig), field: &str| {
            let mut config = WorkerConfig::default();
            change(&mut config);
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        };
        check(|c| c.receive_max = 0, "receive_max");
        check(|c| c.receive_wait_max = Duration::from_secs(301), "receive_wait_max");
        check(|c| c.lease = Duration::from_millis(10), "lease");
        check(|c| c.remote_agents = vec![AgentName::new("x".repeat(100)).unwrap()], "remote_agents");
    }
}
