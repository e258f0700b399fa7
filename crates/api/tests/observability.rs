//! The engine's metrics on the API's `/metrics` (one process-global
//! recorder shared by the engine, the store's writer and the API), and the
//! trace context carried from a submit through the Scheduler to the agent.
//!
//! Both install process-global things (the `metrics` recorder, the
//! `tracing` subscriber), once per test process; each test only looks at
//! the series and spans of its own tasks.

mod common;

use std::time::Duration;

use common::{Options, WAIT_MAX, start};
use reqwest::StatusCode;
use rota_api::metrics::Registry;
use rota_model::QueueName;
use rota_store::Outgoing;
use rota_workflow::{AgentCatalog, StepDef, Workflow};
use serde_json::json;

/// The value of the sample of `name` whose labels include `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|line| !line.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
        let all = labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
        (metric == name && all).then(|| value.parse().unwrap())
    })
}

/// A named check of the `/metrics` text.
type Check = Box<dyn Fn(&str) -> bool>;

/// One step that outlives its timeout every time: the Supervisor reports
/// each attempt, the Scheduler retries once, then the task ends in error.
fn stuck() -> Workflow {
    Workflow::builder("stuck", 1)
        .step(StepDef::new("hang", "delay").with_input(json!({ "ms": 60_000 })).timeout(Duration::from_millis(300)))
        .max_failures(2)
        .build(&AgentCatalog::builtin())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_metrics_show_on_the_apis_metrics_after_tasks_run() {
    let handle = rota_api::metrics::install_global().unwrap();
    let server = start(Options { metrics: Registry::Global(handle), workflows: vec![stuck()], ..Options::default() }).await;
    server.submit("quick", "obs-quick").await;
    server.submit("broken", "obs-broken").await;
    server.submit("stuck", "obs-stuck").await;
    assert_eq!(server.wait_terminal("obs-quick").await["state"], "processed");
    assert_eq!(server.wait_terminal("obs-broken").await["state"], "error");
    assert_eq!(server.wait_terminal("obs-stuck").await["state"], "error");
    // A poison message in an agent's queue is dead-lettered by its worker.
    let queue = QueueName::new("agent.delay").unwrap();
    server.store.send(&queue, Outgoing::json(&json!({ "not": "a step request" })).unwrap()).await.unwrap();

    let step = |workflow: &'static str, step: &'static str, outcome: &'static str| {
        move |text: &str| {
            let labels = [("workflow", workflow), ("step", step), ("agent", "delay"), ("outcome", outcome)];
            sample(text, "rota_step_duration_seconds_count", &labels).is_some_and(|n| n >= 1.0)
                && sample(text, "rota_step_duration_seconds_bucket", &[labels[0], labels[1], ("le", "+Inf")]).is_some()
        }
    };
    let expected: Vec<(&str, Check)> = vec![
        ("quick's steps succeeded", Box::new(step("quick", "first", "succeeded"))),
        ("broken's step failed", Box::new(step("broken", "only", "failed"))),
        ("stuck's step timed out", Box::new(step("stuck", "hang", "timed_out"))),
        (
            "the retry of stuck's step",
            Box::new(|text| sample(text, "rota_step_retries_total", &[("workflow", "stuck"), ("step", "hang")]).is_some_and(|n| n >= 1.0)),
        ),
        (
            "finished tasks",
            Box::new(|text| {
                sample(text, "rota_tasks_finished_total", &[("workflow", "quick"), ("state", "processed")]) == Some(1.0)
                    && sample(text, "rota_tasks_finished_total", &[("workflow", "stuck"), ("state", "error")]) == Some(1.0)
            }),
        ),
        (
            "the Supervisor's reports of timed-out steps",
            Box::new(|text| sample(text, "rota_supervisor_recoveries_total", &[("kind", "step_reported")]).is_some_and(|n| n >= 2.0)),
        ),
        (
            "agent calls",
            Box::new(|text| {
                sample(text, "rota_agent_calls_total", &[("agent", "delay"), ("outcome", "succeeded")]).is_some_and(|n| n >= 2.0)
                    && sample(text, "rota_agent_calls_total", &[("agent", "delay"), ("outcome", "failed")]).is_some_and(|n| n >= 1.0)
                    && sample(text, "rota_agent_calls_total", &[("agent", "delay"), ("outcome", "deadline_passed")])
                        .is_some_and(|n| n >= 1.0)
                    && sample(text, "rota_agent_call_duration_seconds_bucket", &[("agent", "delay"), ("le", "+Inf")]).is_some()
            }),
        ),
        (
            "the dead letter",
            Box::new(|text| sample(text, "rota_dead_letters_total", &[("queue", "agent.delay")]).is_some_and(|n| n >= 1.0)),
        ),
        (
            "the SQLite writer's group commits",
            Box::new(|text| {
                sample(text, "rota_sqlite_commits_total", &[]).is_some_and(|n| n >= 1.0)
                    && sample(text, "rota_sqlite_commit_jobs_bucket", &[("le", "+Inf")]).is_some_and(|n| n >= 1.0)
            }),
        ),
        (
            "the API's own metrics beside them",
            Box::new(|text| {
                sample(text, "rota_http_requests_total", &[("route", "/v1/tasks"), ("method", "POST"), ("status", "201")]) == Some(3.0)
                    && sample(text, "rota_tasks", &[("state", "processed")]) == Some(1.0)
            }),
        ),
    ];
    // Some series are recorded just after the state a test can see (an
    // agent call returns after its reply committed): look until all show.
    let started = std::time::Instant::now();
    loop {
        let reply = server.get("/metrics").await;
        assert_eq!(reply.status, StatusCode::OK);
        let missing: Vec<&str> = expected.iter().filter(|(_, present)| !present(&reply.text)).map(|(what, _)| *what).collect();
        if missing.is_empty() {
            for line in reply.text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
                assert!(line.starts_with("rota_"), "every name is prefixed: {line}");
            }
            break;
        }
        assert!(started.elapsed() < WAIT_MAX, "missing from /metrics: {missing:?}\n{}", reply.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The spans every test in this process records: an OpenTelemetry layer
/// over an in-memory exporter, installed once as the global subscriber (the
/// engine's futures run on every runtime thread).
fn spans() -> &'static opentelemetry_sdk::trace::InMemorySpanExporter {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;
    static EXPORTER: std::sync::OnceLock<opentelemetry_sdk::trace::InMemorySpanExporter> = std::sync::OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = opentelemetry_sdk::trace::InMemorySpanExporter::default();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        let subscriber = tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(provider.tracer("rota-test")));
        tracing::subscriber::set_global_default(subscriber).expect("no other subscriber in this test process");
        exporter
    })
}

/// A finished span, as the test needs it.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    task_id: Option<String>,
    /// The `message` attribute of a `rota.scheduler.handle` span.
    message: Option<String>,
}

fn finished_spans() -> Vec<Span> {
    spans()
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .map(|span| Span {
            name: span.name.to_string(),
            trace_id: span.span_context.trace_id().to_string(),
            span_id: span.span_context.span_id().to_string(),
            parent_span_id: span.parent_span_id.to_string(),
            task_id: span.attributes.iter().find(|kv| kv.key.as_str() == "task_id").map(|kv| kv.value.as_str().into_owned()),
            message: span.attributes.iter().find(|kv| kv.key.as_str() == "message").map(|kv| kv.value.as_str().into_owned()),
        })
        .collect()
}

/// Waits until the spans of task `id` include `calls` agent calls and as
/// many handled replies (the last decision's span ends just after the task
/// shows as finished), and returns them.
async fn spans_of(id: &str, calls: usize) -> Vec<Span> {
    let started = std::time::Instant::now();
    loop {
        let spans: Vec<Span> = finished_spans().into_iter().filter(|s| s.task_id.as_deref() == Some(id)).collect();
        let count = |name: &str| spans.iter().filter(|s| s.name == name).count();
        if count("rota.agent.call") >= calls && count("rota.scheduler.handle") >= calls {
            return spans;
        }
        assert!(started.elapsed() < WAIT_MAX, "the spans of task {id} did not all end: {spans:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_runs_from_the_submit_through_the_scheduler_to_the_agent_calls() {
    spans();
    let server = start(Options { workflows: vec![stuck()], ..Options::default() }).await;

    // A caller's trace context is continued.
    let (trace_id, caller_span) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let request = server
        .request(reqwest::Method::POST, "/v1/tasks")
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .json(&json!({ "workflow": "quick", "id": "traced-1" }));
    assert_eq!(server.send(request).await.status, StatusCode::CREATED);
    assert_eq!(server.wait_terminal("traced-1").await["state"], "processed");
    let spans = spans_of("traced-1", 2).await;
    for name in ["rota.submit", "rota.scheduler.start", "rota.scheduler.handle", "rota.agent.call"] {
        assert!(spans.iter().any(|s| s.name == name), "no {name} span: {spans:#?}");
    }
    for span in &spans {
        assert_eq!(span.trace_id, trace_id, "every span of the task is in the caller's trace: {spans:#?}");
    }
    let http = finished_spans().into_iter().find(|s| s.name == "rota.http.submit" && s.trace_id == trace_id).expect("the HTTP span");
    assert_eq!(http.parent_span_id, caller_span, "the submit is a child of the caller's span");
    // Each agent call is the child of the Scheduler decision that sent its
    // request, and each reply's handling the child of the call it answers.
    let ids = |prefix: &str| spans.iter().filter(|s| s.name.starts_with(prefix)).map(|s| s.span_id.clone()).collect::<Vec<_>>();
    let (decisions, calls) = (ids("rota.scheduler."), ids("rota.agent.call"));
    for span in &spans {
        match span.name.as_str() {
            "rota.agent.call" => assert!(decisions.contains(&span.parent_span_id), "{span:#?} in {spans:#?}"),
            "rota.scheduler.handle" => assert!(calls.contains(&span.parent_span_id), "{span:#?} in {spans:#?}"),
            _ => {}
        }
    }

    // Without a caller's context, the submit starts the task's own trace.
    server.submit("quick", "traced-2").await;
    server.wait_terminal("traced-2").await;
    let spans = spans_of("traced-2", 2).await;
    let submit = spans.iter().find(|s| s.name == "rota.submit").expect("the submit span");
    assert!(spans.iter().all(|s| s.trace_id == submit.trace_id), "one trace: {spans:#?}");
    assert_ne!(submit.trace_id, trace_id);

    // The Supervisor's timeout reports carry no context, yet the decisions
    // on them (and the retried attempt) stay in the task's trace.
    server.submit("stuck", "traced-3").await;
    assert_eq!(server.wait_terminal("traced-3").await["state"], "error");
    let spans = spans_of("traced-3", 2).await;
    let submit = spans.iter().find(|s| s.name == "rota.submit").expect("the submit span");
    assert!(spans.iter().any(|s| s.message.as_deref() == Some("step_expired")), "{spans:#?}");
    assert!(spans.iter().all(|s| s.trace_id == submit.trace_id), "one trace: {spans:#?}");
}
