//! Prometheus metrics at `/metrics`, every name prefixed `rota_`.
//!
//! Two kinds:
//! - counted as requests pass (`rota_http_requests_total` by route, method
//!   and status; `rota_http_request_duration_seconds`), in this API's own
//!   recorder: each [`ApiState`] has its own, so that several routers in one
//!   process (tests, or an embedding program) never share or fight over
//!   the global `metrics` recorder;
//! - read from the store at each scrape, so they are right whichever
//!   process did the work: tasks by state (`rota_tasks`), per queue the
//!   ready, leased, delayed and dead-lettered counts, whether it is paused
//!   and the age of its oldest ready message, the circuit breakers' states,
//!   and whether the store answered (`rota_store_up`).
//!
//! The engine's own metrics (step latencies, retries, recoveries, agent
//! calls, dead letters, the SQLite writer's group-commit batch sizes) are
//! recorded through the `metrics` facade into the process-global recorder,
//! wherever they happen (other threads, the store's writer thread). A
//! process that runs the engine and serves the API installs one
//! Prometheus recorder globally with [`install_global`] and gives its
//! handle to the API as [`Registry::Global`]: `/metrics` then renders the
//! engine's metrics and the API's together. The default,
//! [`Registry::PerState`], keeps the API's own recorder (tests).
//!
//! Deliberately left out: an HTTP listener of the exporter's own (the API
//! serves `/metrics`), and push gateways.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use rota_model::TaskState;
use rota_store::QueueStats;

use crate::ApiState;

/// The buckets of `rota_http_request_duration_seconds`, in seconds.
const HTTP_DURATION_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The states a breaker reports (`rota_breaker_state` has one series per state).
const BREAKER_STATES: [&str; 3] = ["closed", "open", "half_open"];

/// The buckets of every `*_seconds` histogram but the HTTP one, in seconds:
/// from a fast local step to a slow remote call.
const DURATION_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// The buckets of `rota_sqlite_commit_jobs` (jobs per group commit).
const BATCH_BUCKETS: &[f64] = &[0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0];

/// Where the API's `/metrics` comes from.
#[derive(Clone, Default)]
pub enum Registry {
    /// A recorder of the API's own, only for the API's metrics: several
    /// routers in one process (tests) never share or fight over the global
    /// `metrics` recorder.
    #[default]
    PerState,
    /// The process-global recorder installed by [`install_global`], which
    /// the engine records into too.
    Global(PrometheusHandle),
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Registry::PerState => "PerState",
            Registry::Global(_) => "Global",
        })
    }
}

/// The Prometheus builder with every histogram's buckets.
fn builder() -> PrometheusBuilder {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full("rota_http_request_duration_seconds".into()), HTTP_DURATION_BUCKETS)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full("rota_sqlite_commit_jobs".into()), BATCH_BUCKETS))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full("rota_postgres_commit_batch".into()), BATCH_BUCKETS))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full("rota_postgres_create_batch".into()), BATCH_BUCKETS))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), DURATION_BUCKETS))
        .expect("the buckets are not empty")
}

/// How often the global recorder's upkeep runs: it drains the samples
/// histograms buffer between scrapes, which would otherwise grow without
/// bound in a process nobody scrapes.
const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// A per-state recorder runs its upkeep every this many requests (it has
/// no thread of its own: several may live in one process).
const UPKEEP_EVERY_REQUESTS: u64 = 1024;

/// The global recorder, once installed by this crate.
static GLOBAL: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();

/// Installs a Prometheus recorder as the process-global `metrics` recorder
/// (once: later calls return the same handle), and returns the handle
/// that renders it, for [`Registry::Global`]. A thread runs the recorder's
/// upkeep every few seconds. Fails when another recorder was installed
/// first.
pub fn install_global() -> Result<PrometheusHandle, crate::Error> {
    let mut failed = None;
    let handle = GLOBAL.get_or_init(|| {
        let recorder = builder().build_recorder();
        let handle = recorder.handle();
        if let Err(err) = metrics::set_global_recorder(recorder) {
            failed = Some(err.to_string());
            return handle;
        }
        let upkeep = handle.clone();
        let spawned = std::thread::Builder::new().name("rota-metrics-upkeep".into()).spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_INTERVAL);
                upkeep.run_upkeep();
            }
        });
        if let Err(err) = spawned {
            failed = Some(format!("cannot start its upkeep thread: {err}"));
        }
        handle
    });
    match failed {
        Some(err) => Err(crate::Error::Config(format!("cannot install the metrics recorder: {err}"))),
        None => Ok(handle.clone()),
    }
}

/// This API's metrics registry.
#[derive(Clone)]
pub(crate) struct Metrics {
    /// The API's own recorder; `None` records into the global one.
    recorder: Option<Arc<PrometheusRecorder>>,
    handle: PrometheusHandle,
    /// Requests recorded, for the per-state recorder's upkeep.
    recorded: Arc<std::sync::atomic::AtomicU64>,
}

impl Metrics {
    pub(crate) fn new(registry: &Registry) -> Self {
        match registry {
            Registry::PerState => {
                let recorder = builder().build_recorder();
                let handle = recorder.handle();
                Metrics { recorder: Some(Arc::new(recorder)), handle, recorded: Arc::default() }
            }
            Registry::Global(handle) => Metrics { recorder: None, handle: handle.clone(), recorded: Arc::default() },
        }
    }

    fn record<T>(&self, f: impl FnOnce() -> T) -> T {
        match &self.recorder {
            Some(recorder) => {
                let recorded = self.recorded.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if recorded.is_multiple_of(UPKEEP_EVERY_REQUESTS) {
                    self.handle.run_upkeep();
                }
                metrics::with_local_recorder(recorder.as_ref(), f)
            }
            None => f(),
        }
    }
}

/// The middleware that counts every request by route pattern (never by
/// raw path: ids would make unbounded label sets), method and status, and
/// tells the client the server's time in a `Server-Timing` header
/// (`app;dur=<milliseconds>`, which browsers' developer tools show): the
/// time until the response's head, so for a stream the time to its start.
pub async fn count_request(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let mut response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    let seconds = started.elapsed().as_secs_f64();
    if let Ok(timing) = HeaderValue::from_str(&server_timing(seconds)) {
        response.headers_mut().insert(SERVER_TIMING, timing);
    }
    // Method, route pattern and status only: never headers (tokens) or bodies.
    tracing::debug!(method = %method, route = %route, status = %status, seconds, "request");
    state.inner.metrics.record(|| {
        metrics::counter!("rota_http_requests_total", "route" => route.clone(), "method" => method.clone(), "status" => status)
            .increment(1);
        metrics::histogram!("rota_http_request_duration_seconds", "route" => route, "method" => method).record(seconds);
    });
    response
}

/// The `Server-Timing` header's name (the `http` crate has no constant for it).
const SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

/// The `Server-Timing` value for a request that took `seconds`.
fn server_timing(seconds: f64) -> String {
    format!("app;dur={:.1}", seconds * 1000.0)
}

/// What the store says at one scrape.
struct Snapshot {
    tasks: Vec<(TaskState, u64)>,
    queues: Vec<QueueStats>,
    breakers: Vec<(String, String, String)>,
}

async fn snapshot(state: &ApiState) -> rota_store::Result<Snapshot> {
    let store = state.store();
    let tasks = store.count_tasks(&rota_store::TaskFilter::default()).await?;
    let queues = store.stats().await?;
    let reported = rota_engine::status::breakers(store).await?;
    let shared = store.shared_breakers().await?;
    // A shared breaker's `agent` label is `shared`: it belongs to no one
    // process's agent.
    let breakers = crate::wire::BreakerView::all(&shared, &reported)
        .into_iter()
        .map(|view| {
            let agent = if view.shared { "shared".to_owned() } else { view.agent.unwrap_or_default() };
            (view.endpoint, agent, view.state)
        })
        .collect();
    Ok(Snapshot { tasks, queues, breakers })
}

/// `/metrics`: the Prometheus text format.
pub async fn render(State(state): State<ApiState>) -> Response {
    let snapshot = snapshot(&state).await;
    let now = state.clock().now();
    let metrics = &state.inner.metrics;
    metrics.record(|| match &snapshot {
        Ok(snapshot) => {
            metrics::gauge!("rota_store_up").set(1.0);
            for (task_state, count) in &snapshot.tasks {
                metrics::gauge!("rota_tasks", "state" => task_state.as_str()).set(*count as f64);
            }
            for queue in &snapshot.queues {
                let name = queue.queue.to_string();
                metrics::gauge!("rota_queue_ready_messages", "queue" => name.clone()).set(queue.ready as f64);
                metrics::gauge!("rota_queue_leased_messages", "queue" => name.clone()).set(queue.leased as f64);
                metrics::gauge!("rota_queue_delayed_messages", "queue" => name.clone()).set(queue.delayed as f64);
                metrics::gauge!("rota_queue_dead_letters", "queue" => name.clone()).set(queue.dead_lettered as f64);
                metrics::gauge!("rota_queue_paused", "queue" => name.clone()).set(if queue.paused { 1.0 } else { 0.0 });
                let age = queue.oldest_ready_at.map_or(0.0, |at| now.since(at).as_secs_f64());
                metrics::gauge!("rota_queue_oldest_ready_age_seconds", "queue" => name).set(age);
            }
            for (endpoint, agent, current) in &snapshot.breakers {
                for state in BREAKER_STATES {
                    let value = if state == current { 1.0 } else { 0.0 };
                    metrics::gauge!("rota_breaker_state", "endpoint" => endpoint.clone(), "agent" => agent.clone(), "state" => state)
                        .set(value);
                }
            }
        }
        Err(err) => {
            tracing::warn!("metrics: cannot read the store: {err}");
            metrics::gauge!("rota_store_up").set(0.0);
        }
    });
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], metrics.handle.render()).into_response()
}
