//! Observability of the real binary: `rota serve --listen 127.0.0.1:0`
//! shows the engine's metrics on the API's `/metrics` once a task ran, and
//! with `--otlp-endpoint` exports its spans over OTLP/HTTP (protobuf) to a
//! receiver in the test, one trace from the submit (continuing the
//! caller's `traceparent`) through the Scheduler to the agent calls.
//!
//! Real processes and real time, a few seconds.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{Rota, lines_of};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use serde_json::{Value, json};

/// How long a test waits for the server to start, a task to finish or
/// spans to arrive: bounds on the test, not timings it asserts.
const WAIT_MAX: Duration = Duration::from_secs(30);

/// Two delay steps.
const QUICK: &str = r#"
name: quick
version: 1
steps:
  - name: first
    agent: delay
    with: { for: "20ms" }
  - name: second
    agent: delay
    with: { for: "20ms" }
"#;

/// A `rota serve` process and the lines it logged.
struct Server {
    child: Child,
    stderr: mpsc::Receiver<String>,
    seen: Vec<String>,
    url: String,
}

impl Server {
    fn start(rota: &Rota, workflows: &std::path::Path, extra: &[&str]) -> Server {
        let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--workflows", workflows.to_str().unwrap(), "--instance-id", "obs-1"];
        args.extend(["--supervisor-interval", "200ms"]);
        args.extend(extra);
        let mut command = rota.command(&args);
        command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env_remove("ROTA_API_TOKEN")
            .env_remove("ROTA_SERVER")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
        let mut child = command.spawn().expect("rota starts");
        let stderr = lines_of(child.stderr.take().unwrap());
        let mut server = Server { child, stderr, seen: Vec::new(), url: String::new() };
        let deadline = Instant::now() + WAIT_MAX;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Ok(line) = server.stderr.recv_timeout(left) else { break };
            server.seen.push(line.clone());
            if let Some(rest) = line.split("listening on ").nth(1) {
                server.url = rest.split_whitespace().next().unwrap().to_owned();
                return server;
            }
        }
        panic!("rota serve did not say where it listens; its stderr:\n{}", server.seen.join("\n"));
    }

    /// SIGTERM, then the exit status once it stopped.
    fn terminate(mut self) -> std::process::ExitStatus {
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.seen.extend(self.stderr.try_iter());
                return status;
            }
            assert!(Instant::now() < deadline, "rota did not stop after SIGTERM");
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A blocking HTTP client for one server.
struct Http {
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
    base: String,
}

impl Http {
    fn new(server: &Server) -> Http {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        Http { runtime, client: rota_agent::http_client().timeout(WAIT_MAX).build().unwrap(), base: server.url.clone() }
    }

    fn send(&self, request: reqwest::RequestBuilder) -> (u16, String) {
        self.runtime.block_on(async {
            let response = request.send().await.expect("the request is answered");
            (response.status().as_u16(), response.text().await.unwrap())
        })
    }

    fn get(&self, path: &str) -> String {
        let (status, body) = self.send(self.client.get(format!("{}{path}", self.base)));
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    /// Submits `quick` as `id`, with a `traceparent` header when given.
    fn submit(&self, id: &str, traceparent: Option<&str>) {
        let mut request = self.client.post(format!("{}/v1/tasks", self.base)).json(&json!({ "workflow": "quick", "id": id }));
        if let Some(traceparent) = traceparent {
            request = request.header("traceparent", traceparent);
        }
        let (status, body) = self.send(request);
        assert_eq!(status, 201, "{body}");
    }

    fn wait_processed(&self, id: &str) {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let task: Value = serde_json::from_str(&self.get(&format!("/v1/tasks/{id}"))).unwrap();
            if task["state"] == "processed" {
                return;
            }
            assert!(Instant::now() < deadline, "task {id} did not finish: {task:#}");
            thread::sleep(Duration::from_millis(50));
        }
    }
}

fn workflows_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("quick.yaml"), QUICK).unwrap();
    dir
}

/// The value of the sample of `name` whose labels include `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|line| !line.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
        let all = labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
        (metric == name && all).then(|| value.parse().unwrap())
    })
}

#[test]
fn serve_shows_the_engines_metrics_on_its_api() {
    let rota = Rota::new();
    let workflows = workflows_dir();
    let server = Server::start(&rota, workflows.path(), &[]);
    let http = Http::new(&server);
    http.submit("m-1", None);
    http.wait_processed("m-1");
    // The agent call's own series is recorded just after its reply commits.
    let deadline = Instant::now() + WAIT_MAX;
    let text = loop {
        let text = http.get("/metrics");
        if sample(&text, "rota_agent_calls_total", &[("agent", "delay"), ("outcome", "succeeded")]) == Some(2.0) {
            break text;
        }
        assert!(Instant::now() < deadline, "no agent calls on /metrics:\n{text}");
        thread::sleep(Duration::from_millis(50));
    };
    let step = [("workflow", "quick"), ("step", "second"), ("agent", "delay"), ("outcome", "succeeded")];
    assert_eq!(sample(&text, "rota_step_duration_seconds_count", &step), Some(1.0), "{text}");
    assert_eq!(sample(&text, "rota_tasks_finished_total", &[("workflow", "quick"), ("state", "processed")]), Some(1.0), "{text}");
    assert!(sample(&text, "rota_sqlite_commit_jobs_bucket", &[("le", "+Inf")]).is_some_and(|n| n >= 1.0), "{text}");
    assert_eq!(sample(&text, "rota_http_requests_total", &[("route", "/v1/tasks"), ("method", "POST"), ("status", "201")]), Some(1.0));
    assert_eq!(sample(&text, "rota_tasks", &[("state", "processed")]), Some(1.0), "{text}");
    assert!(server.terminate().success());
}

/// One span as the receiver decoded it.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: Vec<(String, String)>,
}

impl Span {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An OTLP/HTTP receiver on a free loopback port: answers 200 to every
/// POST to `/v1/traces` and passes on the spans it decoded. Returns the
/// endpoint (its base URL) and the spans.
fn otlp_receiver() -> (String, mpsc::Receiver<Span>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            reader.read_line(&mut request_line).unwrap();
            let mut length = 0;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let Some((key, value)) = line.trim_end().split_once(':') else { break };
                if key.trim().eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap();
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            assert!(request_line.starts_with("POST /v1/traces "), "{request_line}");
            let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("an OTLP trace export");
            for span in request.resource_spans.iter().flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans) {
                let attributes = span
                    .attributes
                    .iter()
                    .map(|kv| {
                        let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                            Some(AnyValue::StringValue(s)) => s.clone(),
                            Some(AnyValue::IntValue(i)) => i.to_string(),
                            Some(AnyValue::BoolValue(b)) => b.to_string(),
                            other => format!("{other:?}"),
                        };
                        (kv.key.clone(), value)
                    })
                    .collect();
                let span = Span {
                    name: span.name.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes,
                };
                if tx.send(span).is_err() {
                    return;
                }
            }
        }
    });
    (endpoint, rx)
}

#[test]
fn serve_exports_one_trace_from_the_submit_to_the_agent_calls_over_otlp() {
    let rota = Rota::new();
    let workflows = workflows_dir();
    let (endpoint, spans) = otlp_receiver();
    let server = Server::start(&rota, workflows.path(), &["--otlp-endpoint", &endpoint]);
    let http = Http::new(&server);
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    http.submit("t-1", Some(&format!("00-{trace_id}-{caller_span}-01")));
    http.wait_processed("t-1");
    // Stopping flushes the spans still batched.
    assert!(server.terminate().success());

    let mut seen: Vec<Span> = Vec::new();
    let complete = |seen: &[Span]| {
        let calls = seen.iter().filter(|s| s.name == "rota.agent.call" && s.attribute("task_id") == Some("t-1")).count();
        let replies = seen.iter().filter(|s| s.name == "rota.scheduler.handle" && s.attribute("task_id") == Some("t-1")).count();
        calls == 2 && replies == 2
    };
    let deadline = Instant::now() + WAIT_MAX;
    while !complete(&seen) {
        let left = deadline.checked_duration_since(Instant::now()).unwrap_or_default();
        match spans.recv_timeout(left) {
            Ok(span) => seen.push(span),
            Err(_) => panic!("the spans of task t-1 did not all arrive; got {seen:#?}"),
        }
    }
    seen.extend(spans.try_iter());
    let of_task: Vec<&Span> = seen.iter().filter(|s| s.attribute("task_id") == Some("t-1")).collect();
    for name in ["rota.submit", "rota.scheduler.start", "rota.scheduler.handle", "rota.agent.call"] {
        assert!(of_task.iter().any(|s| s.name == name), "no {name} span: {of_task:#?}");
    }
    for span in &of_task {
        assert_eq!(span.trace_id, trace_id, "every span of the task is in the caller's trace: {span:#?}");
    }
    // The submit continues the caller's span, and each agent call is a
    // child of the Scheduler decision that sent its request.
    let submit = seen.iter().find(|s| s.name == "rota.http.submit").expect("the HTTP submit span");
    assert_eq!((submit.trace_id.as_str(), submit.parent_span_id.as_str()), (trace_id, caller_span));
    let decisions: Vec<&str> = of_task.iter().filter(|s| s.name.starts_with("rota.scheduler.")).map(|s| s.span_id.as_str()).collect();
    for call in of_task.iter().filter(|s| s.name == "rota.agent.call") {
        assert!(decisions.contains(&call.parent_span_id.as_str()), "{call:#?} is not a child of a decision: {of_task:#?}");
    }
}
