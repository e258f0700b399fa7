//! rota's HTTP API: everything the operator commands of
//! the CLI do, over HTTP with JSON, for applications, operators and
//! dashboards written in any language.
//!
//! - [`router`] builds the axum [`Router`] from an [`ApiState`] (the store,
//!   a [`rota_engine::Client`], the clock and a validated [`Config`]);
//!   [`serve`] runs it on a listener until a shutdown future resolves.
//! - `/v1/…`: tasks (submit with idempotent client ids, status, list,
//!   history, cancel, resubmit), alerts, workflows (list, show, validate,
//!   register), queues (stats, pause, resume), dead letters (list, redrive,
//!   purge), circuit breakers, and server-sent event streams of task
//!   events that resume from `Last-Event-ID` ([`events`]).
//! - Every error is `{"error": {"code", "reason"}}` ([`ApiError`]); invalid
//!   input is always a 4xx.
//! - `/openapi.json` is generated from the handlers (utoipa) and `/docs`
//!   serves Swagger UI from files vendored in the binary (works offline).
//! - `/ui`: the web dashboard (`ui`), a client of `/v1` whose files are
//!   compiled in; `/` redirects there.
//! - Bearer tokens with scopes ([`auth`]), bounded request bodies,
//!   `/healthz`, `/readyz` and Prometheus `/metrics` ([`metrics`]).
//!
//! ```no_run
//! # async fn run(store: rota_store::SharedStore, engine: rota_engine::Engine) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use rota_api::{ApiState, AuthConfig, Config, Scope, Token};
//!
//! let auth = AuthConfig::tokens(vec![
//!     Token::new("an-admin-token-of-16+-chars", vec![Scope::Admin])?,
//!     Token::new("the-shop-application-token", vec![Scope::Submit])?,
//! ])?;
//! let clock: Arc<dyn rota_model::Clock> = Arc::new(rota_model::SystemClock);
//! let state = ApiState::new(store, engine.client(), clock, Config::new(auth))?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7878").await?;
//! let shutdown = rota_engine::Shutdown::new();
//! let stop = shutdown.clone();
//! rota_api::serve(listener, state, async move { stop.triggered().await }).await?;
//! # Ok(())
//! # }
//! ```
//!
//! - The worker protocol for external agents ([`workers`]): receive step
//!   requests with a lease, renew, complete or fail them, under the same
//!   deadline and fencing rules as the built-in agents.
//!
//! - Webhooks: a task may be submitted with a `callback_url` (checked
//!   here); the engine's `webhooks::Dispatcher` POSTs its status events
//!   there.
//!
//! Deliberately left out: TLS (put a proxy in front),
//! and reading configuration: the binary builds [`Config`] from its flags
//! and files. This crate runs no engine role; it only talks to the store
//! and the client, so an API-only process scales out like any other.

#![warn(missing_docs)]

pub mod audit;
pub mod auth;
mod backlog;
pub mod batches;
pub mod callbacks;
pub mod error;
pub mod events;
mod health;
pub mod metrics;
mod openapi;
pub mod queues;
pub mod schedules;
pub mod status;
pub mod tasks;
mod ui;
pub mod wire;
pub mod workers;
pub mod workflows;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use rota_engine::{Client, Workflows};
use rota_model::Clock;
use rota_store::SharedStore;
use rota_workflow::AgentCatalog;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use auth::{AuthConfig, Permission, Scope, Token};
pub use error::{ApiError, ApiResult, ErrorBody, ErrorDetail};
pub use workers::{LeaseKey, WorkerConfig};

/// What can stop the API from starting or serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is out of bounds; the message names it.
    #[error("invalid API configuration: {0}")]
    Config(String),
    /// The listener failed.
    #[error("serving HTTP: {0}")]
    Io(#[from] std::io::Error),
}

/// The bounds of the API. Every one has a default and is checked by
/// [`Limits::validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The largest request body, in bytes; a larger one gets 413.
    pub body_bytes_max: usize,
    /// The most items a listing may ask for (`limit`).
    pub list_limit_max: u32,
    /// The number of items a listing returns without `limit`.
    pub list_limit_default: u32,
    /// How often an event stream looks for new events in the store.
    pub events_poll_interval: Duration,
    /// How often an idle event stream sends a keep-alive comment.
    pub events_keep_alive: Duration,
    /// The most events read from the store at once by an event stream.
    pub events_batch_max: u32,
    /// How long a dashboard sign-in lasts.
    pub session_ttl: Duration,
    /// The most Pending tasks before a submission is refused with 429 and
    /// `Retry-After` (`--pending-max`); `None`, the default: no bound.
    pub pending_max: Option<u64>,
    /// How often the Pending backlog is counted while `pending_max` is set
    /// (the submissions accepted in between are added to the last count).
    pub pending_recount: Duration,
}

impl Limits {
    /// The default largest request body: 1 MiB (a workflow definition is at
    /// most [`rota_workflow::DEFINITION_BYTES_MAX`]).
    pub const BODY_BYTES_MAX_DEFAULT: usize = 1024 * 1024;
    /// The largest request body that may be configured.
    pub const BODY_BYTES_MAX_LIMIT: usize = 64 * 1024 * 1024;
    /// The largest `list_limit_max` that may be configured.
    pub const LIST_LIMIT_MAX_LIMIT: u32 = 10_000;
    /// How often the Pending backlog is counted by default: once a second.
    pub const PENDING_RECOUNT_DEFAULT: Duration = Duration::from_secs(1);

    /// Checks every bound; the error names the field.
    pub fn validate(&self) -> Result<(), Error> {
        let fail = |field: &str, why: String| Err(Error::Config(format!("limits.{field}: {why}")));
        if self.body_bytes_max == 0 || self.body_bytes_max > Self::BODY_BYTES_MAX_LIMIT {
            return fail("body_bytes_max", format!("must be between 1 and {}, got {}", Self::BODY_BYTES_MAX_LIMIT, self.body_bytes_max));
        }
        if self.list_limit_max == 0 || self.list_limit_max > Self::LIST_LIMIT_MAX_LIMIT {
            return fail("list_limit_max", format!("must be between 1 and {}, got {}", Self::LIST_LIMIT_MAX_LIMIT, self.list_limit_max));
        }
        if self.list_limit_default == 0 || self.list_limit_default > self.list_limit_max {
            return fail("list_limit_default", format!("must be between 1 and list_limit_max, got {}", self.list_limit_default));
        }
        if self.events_poll_interval < Duration::from_millis(10) || self.events_poll_interval > Duration::from_secs(60) {
            return fail("events_poll_interval", format!("must be between 10 ms and 60 s, got {:?}", self.events_poll_interval));
        }
        if self.events_keep_alive < Duration::from_secs(1) || self.events_keep_alive > Duration::from_secs(300) {
            return fail("events_keep_alive", format!("must be between 1 s and 300 s, got {:?}", self.events_keep_alive));
        }
        if self.events_batch_max == 0 || self.events_batch_max > 10_000 {
            return fail("events_batch_max", format!("must be between 1 and 10000, got {}", self.events_batch_max));
        }
        if self.pending_max == Some(0) {
            return fail("pending_max", "must be at least 1 (leave it unset for no bound)".into());
        }
        if self.pending_recount < Duration::from_millis(100) || self.pending_recount > Duration::from_secs(60) {
            return fail("pending_recount", format!("must be between 100 ms and 60 s, got {:?}", self.pending_recount));
        }
        let (shortest, longest) = ui::SESSION_TTL_RANGE;
        if self.session_ttl < shortest || self.session_ttl > longest {
            return fail("session_ttl", format!("must be between 1 minute and 30 days, got {:?}", self.session_ttl));
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_bytes_max: Self::BODY_BYTES_MAX_DEFAULT,
            list_limit_max: 1_000,
            list_limit_default: 100,
            events_poll_interval: Duration::from_millis(250),
            events_keep_alive: Duration::from_secs(15),
            events_batch_max: 500,
            session_ttl: Duration::from_secs(12 * 3600),
            pending_max: None,
            pending_recount: Self::PENDING_RECOUNT_DEFAULT,
        }
    }
}

/// The API's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Who may call it.
    pub auth: AuthConfig,
    /// Its bounds.
    pub limits: Limits,
    /// The agents that workflow definitions may name when validated or
    /// registered through the API (the built-in ones by default; add the
    /// custom agents that the engine processes run). The remote agents of
    /// [`WorkerConfig::remote_agents`] are added to it.
    pub agents: AgentCatalog,
    /// The worker protocol for external agents.
    pub workers: WorkerConfig,
    /// Where `/metrics` comes from: the API's own recorder (the default), or
    /// the process-global one that the engine records into too.
    pub metrics: metrics::Registry,
}

impl Config {
    /// Default limits, the built-in agents, and `auth`.
    pub fn new(auth: AuthConfig) -> Self {
        Config {
            auth,
            limits: Limits::default(),
            agents: AgentCatalog::builtin(),
            workers: WorkerConfig::default(),
            metrics: metrics::Registry::default(),
        }
    }

    /// The agents workflow definitions may name: [`Config::agents`] and the
    /// remote agents.
    pub fn catalog(&self) -> AgentCatalog {
        self.workers.remote_agents.iter().cloned().fold(self.agents.clone(), AgentCatalog::with)
    }
}

/// What every handler reads: the store, the client, the clock, the
/// configuration and the metrics registry. Cheap to clone.
#[derive(Clone)]
pub struct ApiState {
    inner: Arc<Inner>,
}

struct Inner {
    store: SharedStore,
    client: Client,
    clock: Arc<dyn Clock>,
    config: Config,
    /// The agents definitions may name ([`Config::catalog`]).
    catalog: AgentCatalog,
    /// The definitions tasks run, cached (versions are immutable).
    workflows: Workflows,
    metrics: metrics::Metrics,
    /// Set when the server begins to shut down, so that event streams end
    /// (a graceful shutdown waits for every open response).
    closing: watch::Sender<bool>,
    /// The last count of the Pending backlog (see [`Limits::pending_max`]).
    backlog: backlog::Backlog,
    /// The Scheduler of this process, if it runs one: it decides the
    /// replies of remote workers at once (see [`ApiState::with_scheduler`]).
    scheduler: Option<rota_engine::Scheduler>,
}

impl ApiState {
    /// The state of an API over `store`, making its task changes through
    /// `client` (which should be a client of the same store). Checks
    /// `config`'s limits.
    pub fn new(store: SharedStore, client: Client, clock: Arc<dyn Clock>, config: Config) -> Result<Self, Error> {
        config.limits.validate()?;
        config.workers.validate()?;
        // The client's own, so that a registration here is the latest its
        // submissions see at once.
        let workflows = client.workflows().clone();
        let catalog = config.catalog();
        let metrics = metrics::Metrics::new(&config.metrics);
        let inner = Inner {
            store,
            client,
            clock,
            config,
            catalog,
            workflows,
            metrics,
            closing: watch::Sender::new(false),
            backlog: backlog::Backlog::default(),
            scheduler: None,
        };
        Ok(ApiState { inner: Arc::new(inner) })
    }

    /// Hands the replies of remote workers (the HTTP worker protocol) to
    /// `scheduler`, the Scheduler running in this process on the same
    /// store, to be decided in the commit that consumes their request, as
    /// its own agent workers' are; a reply it did not request, or cannot
    /// decide, goes through its inbox. Call it before cloning the state.
    pub fn with_scheduler(mut self, scheduler: rota_engine::Scheduler) -> Self {
        Arc::get_mut(&mut self.inner).expect("with_scheduler is called before the state is shared").scheduler = Some(scheduler);
        self
    }

    /// The Scheduler of this process, if given ([`ApiState::with_scheduler`]).
    pub fn scheduler(&self) -> Option<&rota_engine::Scheduler> {
        self.inner.scheduler.as_ref()
    }

    /// The store.
    pub fn store(&self) -> &SharedStore {
        &self.inner.store
    }

    /// The task client.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The workflow definitions, cached.
    pub fn workflows(&self) -> &Workflows {
        &self.inner.workflows
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.inner.config.limits
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The agents workflow definitions may name: the configured ones and
    /// the remote ones.
    pub fn catalog(&self) -> &AgentCatalog {
        &self.inner.catalog
    }

    /// Ends the open event streams (as [`serve`] does when its shutdown
    /// future resolves). Requests keep being answered.
    pub fn close_streams(&self) {
        self.inner.closing.send_replace(true);
    }

    pub(crate) fn backlog(&self) -> &backlog::Backlog {
        &self.inner.backlog
    }

    pub(crate) fn closing(&self) -> watch::Receiver<bool> {
        self.inner.closing.subscribe()
    }

    /// A `limit` query parameter checked against the bounds.
    pub(crate) fn limit(&self, limit: Option<u32>) -> ApiResult<u32> {
        let limits = self.limits();
        match limit {
            None => Ok(limits.list_limit_default),
            Some(n) if n >= 1 && n <= limits.list_limit_max => Ok(n),
            Some(n) => Err(ApiError::invalid_query("limit", format!("must be between 1 and {}, got {n}", limits.list_limit_max))),
        }
    }
}

/// The whole API as an axum router: `/v1/…` behind authentication but for
/// `/v1/callbacks/{token}` (the token is its credential), and
/// `/healthz`, `/readyz`, `/openapi.json` and `/docs` without; the
/// dashboard at `/ui`, which checks its own session.
/// `/metrics` needs read access.
pub fn router(state: ApiState) -> Router {
    let (v1, mut openapi) = openapi::routes().split_for_parts();
    let (public, public_openapi) = openapi::public_routes().split_for_parts();
    openapi.merge(public_openapi);
    let protected = v1
        .route("/metrics", axum::routing::get(metrics::render))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth::authorize));
    let openapi = Arc::new(openapi);
    let swagger: Router<ApiState> = utoipa_swagger_ui::SwaggerUi::new("/docs").url("/openapi.json", (*openapi).clone()).into();
    Router::new()
        .merge(protected)
        .merge(public)
        .route("/healthz", axum::routing::get(health::healthz))
        .route("/readyz", axum::routing::get(health::readyz))
        .merge(swagger)
        .merge(ui::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.limits().body_bytes_max))
        .layer(axum::middleware::from_fn_with_state(state.clone(), metrics::count_request))
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> impl IntoResponse {
    ApiError::new(StatusCode::NOT_FOUND, "no_such_route", format!("no route {}", uri.path()))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> impl IntoResponse {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", format!("{method} is not allowed on {}", uri.path()))
}

/// Serves [`router`]`(state)` on `listener` until `shutdown` resolves;
/// then ends the event streams and waits for the requests in progress.
pub async fn serve(listener: TcpListener, state: ApiState, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), Error> {
    if matches!(state.config().auth, AuthConfig::Disabled) {
        tracing::warn!("HTTP API authentication is disabled: every request may do everything");
    }
    let app = router(state.clone());
    let closing = state.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            closing.close_streams();
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_limits_are_valid_and_each_bound_is_checked() {
        Limits::default().validate().unwrap();
        let check = |change: fn(&mut Limits), field: &str| {
            let mut limits = Limits::default();
            change(&mut limits);
            let err = limits.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        };
        check(|l| l.body_bytes_max = 0, "body_bytes_max");
        check(|l| l.list_limit_max = 0, "list_limit_max");
        check(|l| l.list_limit_default = 5_000, "list_limit_default");
        check(|l| l.events_poll_interval = Duration::ZERO, "events_poll_interval");
        check(|l| l.events_keep_alive = Duration::ZERO, "events_keep_alive");
        check(|l| l.events_batch_max = 0, "events_batch_max");
        check(|l| l.session_ttl = Duration::ZERO, "session_ttl");
    }
}
