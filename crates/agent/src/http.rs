//! The built-in `http` agent: one HTTP call per try, classified, behind a
//! circuit breaker per endpoint.
//!
//! The step input is
//! `{ "method": "POST", "url": "…", "headers": {…}?, "body": <json>?, "timeout": "5s"? }`.
//! The body, when given, is sent as JSON. Every request carries
//! `Idempotency-Key` (the step's key, stable across attempts),
//! `Rota-Attempt`, `Rota-Task-Id` and `Rota-Step`, plus
//! `Rota-Compensate: true` for a compensating action and, in a step
//! completed by a callback, `Rota-Callback-Token` (the attempt's one-time
//! token); these override user headers of the same name.
//!
//! | response                                    | result                                   | breaker  |
//! |---------------------------------------------|------------------------------------------|----------|
//! | 2xx                                         | output: body JSON; non-JSON → `{status, body}`; empty → `null` | success |
//! | 5xx                                         | retryable (`Retry-After` honoured)       | failure  |
//! | 429                                         | retryable, `Retry-After` (seconds or date) | success |
//! | 408                                         | retryable                                | success  |
//! | other 4xx, unfollowed 3xx                   | permanent, status and a body excerpt     | success  |
//! | timeout, connection refused or reset        | retryable                                | failure  |
//! | bad input, body over the size bound         | permanent                                | —        |
//! | host refused by the egress allow-list       | permanent, naming the host and the setting | —      |
//!
//! A transient failure carries its class, which a step's
//! `retry.non_retryable` may list to fail at once instead: the status for a
//! 5xx, 429 or 408, `timeout`, `connection`, and `circuit_open` for a call
//! the breaker refused.
//!
//! A 4xx counts as a success for the breaker: the endpoint answered, it is
//! the request that is wrong. A timeout caused by the step's own deadline
//! (rather than the input's `timeout`) does not count: a short deadline says
//! nothing about the endpoint.
//!
//! Error messages name the method and the URL without its query string,
//! which may hold credentials; messages end up in the task history.
//!
//! Deliberately left out: retries (the caller's loop does them), following
//! the response's `Location` beyond reqwest's redirect policy, and request
//! bodies other than JSON.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use rota_model::{Clock, FailureClass, FailureKind, Timestamp};
use serde_json::{Value, json};

use crate::breaker::{BreakerConfig, BreakerSnapshot, Breakers, Health, Refusal};
use crate::egress::{self, Egress};
use crate::input::{self, excerpt};
use crate::{Agent, Error, Request, Result, StepError};

/// The largest response body the agent reads, in bytes, whatever the
/// configuration says.
pub const RESPONSE_BYTES_LIMIT: usize = 64 * 1024 * 1024;
/// How much of an error response's body goes into the error message.
const EXCERPT_CHARS: usize = 200;

/// The fields a step input may have.
const FIELDS: &[&str] = &["method", "url", "headers", "body", "timeout"];

/// Settings of an [`HttpAgent`], checked by [`HttpAgent::with_config`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// The per-request timeout when the step input gives none. The step's
    /// remaining time caps it either way.
    pub timeout_default: Duration,
    /// The largest response body accepted; a bigger one is a permanent
    /// error. Bounded by [`RESPONSE_BYTES_LIMIT`].
    pub response_bytes_max: usize,
    /// When the per-endpoint breakers open and for how long.
    pub breaker: BreakerConfig,
    /// The hosts and networks calls may reach (off by default).
    pub egress: Egress,
}

impl Default for HttpConfig {
    /// 30 s timeout, 4 MiB responses, the default breaker, every host.
    fn default() -> Self {
        HttpConfig {
            timeout_default: Duration::from_secs(30),
            response_bytes_max: 4 * 1024 * 1024,
            breaker: BreakerConfig::default(),
            egress: Egress::default(),
        }
    }
}

impl HttpConfig {
    fn validate(&self) -> Result<()> {
        if self.timeout_default.is_zero() {
            return Err(Error::Config("http.timeout_default must be above zero".into()));
        }
        if self.response_bytes_max == 0 || self.response_bytes_max > RESPONSE_BYTES_LIMIT {
            return Err(Error::Config(format!(
                "http.response_bytes_max must be between 1 and {RESPONSE_BYTES_LIMIT}, got {}",
                self.response_bytes_max
            )));
        }
        Ok(())
    }
}

/// The built-in `http` agent. One instance holds one connection pool and
/// the breakers of every endpoint it has called; share it (it is cheap to
/// call from many spawned futures at once).
#[derive(Debug)]
pub struct HttpAgent {
    client: reqwest::Client,
    clock: Arc<dyn Clock>,
    config: HttpConfig,
    breakers: Breakers,
}

/// A parsed step input.
#[derive(Debug)]
struct HttpInput {
    method: Method,
    url: Url,
    headers: HeaderMap,
    body: Option<Value>,
    timeout: Option<Duration>,
}

impl HttpAgent {
    /// An agent with the default [`HttpConfig`].
    pub fn new(clock: Arc<dyn Clock>) -> Result<Self> {
        HttpAgent::with_config(HttpConfig::default(), clock)
    }

    /// An agent with `config`, refused with a message naming the field when
    /// it is out of bounds.
    pub fn with_config(config: HttpConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        config.validate()?;
        let client = config
            .egress
            .client(crate::http_client())
            .user_agent(concat!("rota/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Client(error_chain(&e)))?;
        let breakers = Breakers::new(config.breaker.clone(), clock.clone());
        Ok(HttpAgent { client, clock, config, breakers })
    }

    /// The breaker of every endpoint called so far, sorted by endpoint, for
    /// the engine to store and show.
    pub fn breakers(&self) -> Vec<BreakerSnapshot> {
        self.breakers.snapshots()
    }

    /// One try: through the endpoint's own breaker when `guarded` (it may
    /// refuse the call fast), else straight to the network; with the
    /// endpoint's health as the try showed it.
    async fn call_through(&self, request: &Request, guarded: bool) -> (Result<Value, StepError>, Health) {
        let input = match parse_input(&request.input) {
            Ok(input) => input,
            Err(err) => return (Err(err), Health::Unknown),
        };
        let remaining = request.remaining(self.clock.now());
        if remaining.is_zero() {
            return (Err(StepError::retryable("the step's complete-by time has passed")), Health::Unknown);
        }
        let step_timeout = input.timeout.unwrap_or(self.config.timeout_default);
        let (timeout, cut_by_deadline) = if remaining < step_timeout { (remaining, true) } else { (step_timeout, false) };
        let endpoint = endpoint(&input.url);
        if let Err(refused) = self.config.egress.check_url(&input.url) {
            let target = Target { method: &input.method, url: &input.url };
            return (Err(StepError::permanent(format!("{target}: {refused}"))), Health::Unknown);
        }
        if !guarded {
            return self.send(input, request, timeout, cut_by_deadline).await;
        }
        let pass = match self.breakers.admit(&endpoint) {
            Ok(pass) => pass,
            Err(refusal) => return (Err(refused(&endpoint, refusal, self.clock.now())), Health::Unknown),
        };
        // If this future is dropped at the deadline, `pass` is dropped
        // unsettled and a probe hands its slot back.
        let (result, health) = self.send(input, request, timeout, cut_by_deadline).await;
        match health {
            Health::Up => pass.succeeded(),
            Health::Failing => pass.failed(),
            Health::Unknown => pass.abandoned(),
        }
        (result, health)
    }

    /// Sends the request and classifies the result. The caller settles the
    /// breaker from the returned health.
    async fn send(
        &self,
        input: HttpInput,
        request: &Request,
        timeout: Duration,
        cut_by_deadline: bool,
    ) -> (Result<Value, StepError>, Health) {
        let target = Target { method: &input.method, url: &input.url };
        let mut builder = self.client.request(input.method.clone(), input.url.clone()).timeout(timeout).headers(input.headers);
        for (name, value) in rota_headers(request) {
            builder = builder.header(name, value);
        }
        if let Some(body) = &input.body {
            builder = builder.json(body);
        }
        let transport_failure = |e: reqwest::Error| -> (Result<Value, StepError>, Health) {
            if let Some(refused) = egress::refusal(&e) {
                // Our own refusal says nothing about the endpoint.
                (Err(StepError::permanent(format!("{target}: {refused}"))), Health::Unknown)
            } else if e.is_timeout() {
                let health = if cut_by_deadline { Health::Unknown } else { Health::Failing };
                let message = format!("{target}: timed out after {}", humantime::format_duration(timeout));
                (Err(StepError::retryable(message).with_class(FailureClass::Kind(FailureKind::Timeout))), health)
            } else if e.is_builder() || e.is_redirect() {
                (Err(StepError::permanent(format!("{target}: {}", error_chain(&e)))), Health::Up)
            } else {
                // Refused or reset connections, DNS failures, bodies cut off
                // mid-way: the network or the endpoint, worth another try.
                let message = format!("{target}: {}", error_chain(&e));
                (Err(StepError::retryable(message).with_class(FailureClass::Kind(FailureKind::Connection))), Health::Failing)
            }
        };
        let mut response = match builder.send().await {
            Ok(response) => response,
            Err(e) => return transport_failure(e),
        };
        let status = response.status();
        let retry_after =
            response.headers().get(RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|v| parse_retry_after(v, self.clock.now()));
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > self.config.response_bytes_max {
                        let max = self.config.response_bytes_max;
                        let message = format!("{target}: {status}: response body larger than {max} bytes");
                        return (Err(StepError::permanent(message)), Health::Up);
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => return transport_failure(e),
            }
        }
        classify(target, status, &body, retry_after)
    }
}

#[async_trait]
impl Agent for HttpAgent {
    fn name(&self) -> &str {
        "http"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        self.call_through(request, true).await.0
    }

    async fn call_unguarded(&self, request: &Request) -> (Result<Value, StepError>, Health) {
        self.call_through(request, false).await
    }

    fn target(&self, request: &Request) -> Option<String> {
        parse_input(&request.input).ok().map(|input| endpoint(&input.url))
    }

    fn breakers(&self) -> Vec<BreakerSnapshot> {
        HttpAgent::breakers(self)
    }
}

/// The method and URL of a call, shown in messages without the query.
#[derive(Clone, Copy)]
struct Target<'a> {
    method: &'a Method,
    url: &'a Url,
}

impl std::fmt::Display for Target<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = self.url;
        write!(f, "{} {}://{}{}", self.method, url.scheme(), url.host_str().unwrap_or(""), port_suffix(url))?;
        f.write_str(url.path())
    }
}

fn port_suffix(url: &Url) -> String {
    url.port().map(|p| format!(":{p}")).unwrap_or_default()
}

/// The breaker key of a URL: `scheme://host:port`, the port made explicit so
/// that `http://a` and `http://a:80` share a breaker.
fn endpoint(url: &Url) -> String {
    format!("{}://{}:{}", url.scheme(), url.host_str().unwrap_or(""), url.port_or_known_default().unwrap_or(0))
}

/// The headers rota adds to every request.
fn rota_headers(request: &Request) -> Vec<(HeaderName, HeaderValue)> {
    // Task ids are free text without control characters, so their UTF-8
    // bytes are valid header bytes (as obs-text); they are sent unchanged so
    // that the remote side sees exactly `request.idempotency_key`.
    let bytes = |s: &str| HeaderValue::from_bytes(s.as_bytes()).unwrap_or_else(|_| HeaderValue::from_static("invalid"));
    let mut headers = vec![
        (HeaderName::from_static("idempotency-key"), bytes(&request.idempotency_key)),
        (HeaderName::from_static("rota-attempt"), HeaderValue::from(request.attempt)),
        (HeaderName::from_static("rota-task-id"), bytes(request.task_id.as_str())),
        (HeaderName::from_static("rota-step"), bytes(request.step.as_str())),
    ];
    if request.compensate {
        headers.push((HeaderName::from_static("rota-compensate"), HeaderValue::from_static("true")));
    }
    if let Some(token) = &request.callback_token {
        headers.push((HeaderName::from_static("rota-callback-token"), bytes(token)));
    }
    headers
}

/// Reads the step input, naming the field at fault.
fn parse_input(value: &Value) -> Result<HttpInput, StepError> {
    let fields = input::object(value, FIELDS)?;
    let method_text = input::string(fields, "method")?;
    let method = Method::from_bytes(method_text.to_ascii_uppercase().as_bytes())
        .map_err(|_| StepError::permanent(format!("input.method: invalid HTTP method {method_text:?}")))?;
    let url_text = input::string(fields, "url")?;
    let url = Url::parse(url_text).map_err(|e| StepError::permanent(format!("input.url: invalid URL {url_text:?}: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(StepError::permanent(format!("input.url: expected an http:// or https:// URL with a host, got {url_text:?}")));
    }
    let mut headers = HeaderMap::new();
    for (name, value) in input::string_map(fields, "headers")? {
        let header_name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| StepError::permanent(format!("input.headers: invalid header name {name:?}")))?;
        let header_value =
            HeaderValue::from_str(value).map_err(|_| StepError::permanent(format!("input.headers.{name}: invalid header value")))?;
        headers.append(header_name, header_value);
    }
    let body = fields.get("body").cloned();
    let timeout = input::duration(fields, "timeout")?;
    if timeout.is_some_and(|t| t.is_zero()) {
        return Err(StepError::permanent("input.timeout: must be above zero"));
    }
    Ok(HttpInput { method, url, headers, body, timeout })
}

/// Maps a complete response to the step's result and the endpoint's health.
fn classify(target: Target<'_>, status: StatusCode, body: &[u8], retry_after: Option<Duration>) -> (Result<Value, StepError>, Health) {
    let text = || String::from_utf8_lossy(body);
    let failed = || format!("{target}: {status}: {}", excerpt(&text(), EXCERPT_CHARS));
    if status.is_success() {
        let output = if body.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            serde_json::from_slice(body).unwrap_or_else(|_| json!({ "status": status.as_u16(), "body": text() }))
        };
        return (Ok(output), Health::Up);
    }
    let class = FailureClass::Status(status.as_u16());
    if status.is_server_error() {
        return (Err(StepError::Retryable { message: failed(), retry_after, class: Some(class) }), Health::Failing);
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        return (Err(StepError::Retryable { message: failed(), retry_after, class: Some(class) }), Health::Up);
    }
    if status == StatusCode::REQUEST_TIMEOUT {
        return (Err(StepError::retryable(failed()).with_class(class)), Health::Up);
    }
    (Err(StepError::permanent(failed())), Health::Up)
}

/// Parses `Retry-After`: whole seconds, or an HTTP date (a date in the past
/// means "now").
fn parse_retry_after(value: &str, now: Timestamp) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    let millis = i64::try_from(date.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()?;
    Some(Timestamp::from_millis(millis).since(now))
}

/// The error a refused call fails with, without touching the network.
fn refused(endpoint: &str, refusal: Refusal, now: Timestamp) -> StepError {
    match refusal {
        Refusal::Open { until } => {
            let wait = until.since(now);
            let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(until.as_millis()).unwrap_or(0));
            StepError::retryable_after(
                format!("circuit open for {endpoint} until {} (in {})", httpdate::fmt_http_date(at), humantime::format_duration(wait)),
                wait,
            )
            .with_class(FailureClass::Kind(FailureKind::CircuitOpen))
        }
        Refusal::ProbeInFlight => StepError::retryable(format!("circuit half-open for {endpoint}: a probe call is in flight"))
            .with_class(FailureClass::Kind(FailureKind::CircuitOpen)),
    }
}

/// An error and its sources, one line: reqwest's top-level message alone
/// ("error sending request") hides the cause.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target_url() -> Url {
        Url::parse("https://pay.example:8443/charge?token=secret").unwrap()
    }

    /// Classifies a response to `POST https://pay.example:8443/charge`.
    fn check(status: u16, body: &str, retry_after: Option<Duration>) -> (Result<Value, StepError>, Health) {
        let url = target_url();
        let target = Target { method: &Method::POST, url: &url };
        classify(target, StatusCode::from_u16(status).unwrap(), body.as_bytes(), retry_after)
    }

    #[test]
    fn success_bodies_become_outputs() {
        assert_eq!(check(200, r#"{"id": 7}"#, None), (Ok(json!({"id": 7})), Health::Up));
        assert_eq!(check(204, "", None), (Ok(Value::Null), Health::Up));
        assert_eq!(check(200, "ok", None), (Ok(json!({"status": 200, "body": "ok"})), Health::Up));
    }

    #[test]
    fn statuses_are_classified() {
        let (result, health) = check(503, "busy", Some(Duration::from_secs(3)));
        assert_eq!(
            result.unwrap_err(),
            StepError::retryable_after("POST https://pay.example:8443/charge: 503 Service Unavailable: busy", Duration::from_secs(3))
                .with_class(FailureClass::Status(503))
        );
        assert_eq!(health, Health::Failing);
        let (result, health) = check(429, "", Some(Duration::from_secs(1)));
        assert_eq!((result.unwrap_err().retry_after(), health), (Some(Duration::from_secs(1)), Health::Up));
        assert!(check(408, "", None).0.unwrap_err().is_retryable());
        for status in [503, 429, 408] {
            assert_eq!(check(status, "", None).0.unwrap_err().class(), Some(FailureClass::Status(status)), "{status}");
        }
        let (result, health) = check(404, &"x".repeat(1_000), None);
        let err = result.unwrap_err();
        assert!(!err.is_retryable());
        assert!(err.message().starts_with("POST https://pay.example:8443/charge: 404 Not Found: xxx"), "{err}");
        assert!(err.message().len() < 300, "only an excerpt of the body");
        assert!(!err.message().contains("secret"), "the query string stays out of messages");
        assert_eq!(health, Health::Up);
    }

    #[test]
    fn retry_after_takes_seconds_or_a_date() {
        let now = Timestamp::from_millis(1_767_225_600_000); // 2026-01-01T00:00:00Z
        assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after("Thu, 01 Jan 2026 00:00:30 GMT", now), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("Wed, 31 Dec 2025 00:00:00 GMT", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
    }

    #[test]
    fn endpoints_make_the_port_explicit() {
        assert_eq!(endpoint(&Url::parse("http://a.example/x").unwrap()), "http://a.example:80");
        assert_eq!(endpoint(&target_url()), "https://pay.example:8443");
        assert_eq!(endpoint(&Url::parse("http://[::1]:9/").unwrap()), "http://[::1]:9");
    }

    #[test]
    fn bad_inputs_name_the_field() {
        let check_input = |v: Value| parse_input(&v).unwrap_err().message().to_owned();
        assert_eq!(check_input(json!({"url": "http://a"})), "input.method: missing");
        assert!(check_input(json!({"method": "GET", "url": "ftp://a"})).starts_with("input.url: expected an http"));
        assert!(check_input(json!({"method": "GET", "url": "not a url"})).starts_with("input.url: invalid URL"));
        assert!(check_input(json!({"method": "GE T", "url": "http://a"})).starts_with("input.method"));
        assert!(check_input(json!({"method": "GET", "url": "http://a", "headers": {"a b": "x"}})).starts_with("input.headers"));
        assert!(check_input(json!({"method": "GET", "url": "http://a", "timeout": 0})).starts_with("input.timeout"));
        assert!(check_input(json!({"method": "GET", "url": "http://a", "bdy": 1})).starts_with("input.bdy: unknown field"));
        let ok = parse_input(&json!({"method": "post", "url": "http://a/x", "body": {"k": 1}, "timeout": "2s"})).unwrap();
        assert_eq!((ok.method, ok.timeout), (Method::POST, Some(Duration::from_secs(2))));
    }
}
