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
//! Deliberately left out (for now): the engine's own metrics (step latency,
//! retries, recoveries, group-commit batch sizes), which need the engine to
//! record into a registry it shares with this one.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use rota_model::TaskState;
use rota_store::{QueueStats, TaskFilter};

use crate::ApiState;
use crate::queues::BREAKER_PREFIX;

/// The buckets of `rota_http_request_duration_seconds`, in seconds.
const HTTP_DURATION_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The states a breaker reports (`rota_breaker_state` has one series per state).
const BREAKER_STATES: [&str; 3] = ["closed", "open", "half_open"];

/// This API's metrics registry.
#[derive(Clone)]
pub(crate) struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full("rota_http_request_duration_seconds".into()), HTTP_DURATION_BUCKETS)
            .expect("the buckets are not empty")
            .build_recorder();
        let handle = recorder.handle();
        Metrics { recorder: Arc::new(recorder), handle }
    }

    fn record<T>(&self, f: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(self.recorder.as_ref(), f)
    }
}

/// The middleware that counts every request by route pattern (never by
/// raw path: ids would make unbounded label sets), method and status.
pub async fn count_request(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    let seconds = started.elapsed().as_secs_f64();
    // Method, route pattern and status only: never headers (tokens) or bodies.
    tracing::debug!(method = %method, route = %route, status = %status, seconds, "request");
    state.inner.metrics.record(|| {
        metrics::counter!("rota_http_requests_total", "route" => route.clone(), "method" => method.clone(), "status" => status)
            .increment(1);
        metrics::histogram!("rota_http_request_duration_seconds", "route" => route, "method" => method).record(seconds);
    });
    response
}

/// What the store says at one scrape.
struct Snapshot {
    tasks: Vec<(TaskState, usize)>,
    queues: Vec<QueueStats>,
    breakers: Vec<(String, String, String)>,
}

async fn snapshot(state: &ApiState) -> rota_store::Result<Snapshot> {
    let store = state.store();
    let mut tasks = Vec::with_capacity(TaskState::ALL.len());
    for task_state in TaskState::ALL {
        let filter = TaskFilter { state: Some(task_state), limit: state.limits().metrics_tasks_counted_max, ..TaskFilter::default() };
        tasks.push((task_state, store.list_tasks(&filter).await?.len()));
    }
    let queues = store.stats().await?;
    let breakers = store
        .statuses(BREAKER_PREFIX)
        .await?
        .iter()
        .map(|status| {
            let view = crate::wire::BreakerView::from(status);
            (view.endpoint, view.agent.unwrap_or_default(), view.state)
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
