//! The test harness: a real SQLite store in a temporary directory, a real
//! engine (every role, the built-in `delay` agent) when a test needs tasks
//! to run, and the API served on `127.0.0.1:0`, spoken to with reqwest.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, StatusCode};
use rota_agent::DelayAgent;
use rota_api::{ApiState, AuthConfig, Config, Limits, WorkerConfig};
use rota_engine::engine::Config as EngineConfig;
use rota_engine::{Client, Completions, Engine, Scheduler, Shutdown, Workflows, scheduler};
use rota_model::{Clock, InstanceId, SystemClock};
use rota_store::SharedStore;
use rota_store_sqlite::{Config as StoreConfig, SqliteStore};
use rota_workflow::{AgentCatalog, StepDef, Workflow};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// The engine's instance id (what `locked_by` shows).
pub const INSTANCE: &str = "api-test-1";

/// How long a test waits for a task to reach a state before failing. A
/// bound on the test, not a timing it asserts.
pub const WAIT_MAX: Duration = Duration::from_secs(30);

/// What a test server runs.
pub struct Options {
    pub auth: AuthConfig,
    pub limits: Limits,
    /// Whether the engine runs (tasks only move when it does).
    pub engine: bool,
    /// The worker protocol's settings (remote agents…).
    pub workers: WorkerConfig,
    /// Workflows registered besides `quick`, `slow` and `broken`.
    pub workflows: Vec<Workflow>,
    /// Where `/metrics` comes from (the API's own recorder by default).
    pub metrics: rota_api::metrics::Registry,
    /// Whether the API hands remote workers' replies to this process's
    /// Scheduler, as `rota serve` does (the engine's when it runs; else
    /// one that does not run, [`Server::scheduler`], which a test drives).
    pub decide_replies: bool,
}

impl Default for Options {
    fn default() -> Self {
        let limits = Limits { events_poll_interval: Duration::from_millis(20), ..Limits::default() };
        Options {
            auth: AuthConfig::Disabled,
            limits,
            engine: true,
            workers: WorkerConfig::default(),
            workflows: Vec::new(),
            metrics: rota_api::metrics::Registry::default(),
            decide_replies: true,
        }
    }
}

/// A running API (and maybe engine) over a fresh store.
pub struct Server {
    pub base: String,
    pub http: reqwest::Client,
    pub store: SharedStore,
    /// The bearer token every request carries, if any.
    pub token: Option<String>,
    /// The Scheduler the API hands replies to, when no engine runs: it
    /// claims only when the test asks ([`Scheduler::claim_once`]).
    pub scheduler: Option<Scheduler>,
    engine_shutdown: Shutdown,
    api_shutdown: Option<oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl Server {
    /// The SQLite file behind the server's store.
    pub fn db_path(&self) -> std::path::PathBuf {
        self._dir.path().join("api.db")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.engine_shutdown.trigger();
        if let Some(tx) = self.api_shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Two delay steps of 10 ms: runs to `processed` at once.
pub fn quick() -> Workflow {
    Workflow::builder("quick", 1)
        .step(StepDef::new("first", "delay").with_input(json!({ "ms": 10 })))
        .step(StepDef::new("second", "delay").with_input(json!({ "ms": 10 })))
        .build(&AgentCatalog::builtin())
        .unwrap()
}

/// One step that waits a long time: stays `processing` until cancelled.
pub fn slow() -> Workflow {
    Workflow::builder("slow", 1)
        .step(StepDef::new("wait", "delay").with_input(json!({ "for": "10m" })).timeout(Duration::from_secs(3600)))
        .deadline(Duration::from_secs(7200))
        .build(&AgentCatalog::builtin())
        .unwrap()
}

/// One step whose input the delay agent refuses: a permanent error, so
/// the task ends in `error` with an alert.
pub fn broken() -> Workflow {
    Workflow::builder("broken", 1)
        .step(StepDef::new("only", "delay").with_input(json!({ "ms": "not a number" })))
        .build(&AgentCatalog::builtin())
        .unwrap()
}

pub async fn start(options: Options) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store: SharedStore = Arc::new(SqliteStore::open(StoreConfig::new(dir.path().join("api.db")), clock.clone()).unwrap());
    let mut config = EngineConfig::new(InstanceId::new(INSTANCE).unwrap());
    config.supervisor.interval = Duration::from_millis(100);
    config.supervisor.leader_ttl = Duration::from_secs(1);
    config.shutdown_grace = Duration::from_millis(100);
    let mut engine = Engine::new(store.clone(), clock.clone(), config)
        .agent(Arc::new(DelayAgent::new()))
        .workflow(quick())
        .workflow(slow())
        .workflow(broken());
    for workflow in options.workflows {
        engine = engine.workflow(workflow);
    }
    engine.register_workflows().await.unwrap();
    let engine_shutdown = Shutdown::new();
    let (client, deciding, idle) = if options.engine {
        let client = engine.client();
        let deciding = engine.scheduler().unwrap();
        tokio::spawn(engine.run(engine_shutdown.clone()));
        (client, deciding, None)
    } else {
        let workflows = Workflows::new(store.clone());
        let config = scheduler::Config::new(InstanceId::new(INSTANCE).unwrap());
        let idle = Scheduler::new(store.clone(), clock.clone(), workflows.clone(), Completions::default(), config).unwrap();
        (Client::new(store.clone(), clock.clone(), workflows, None), Some(idle.clone()), Some(idle))
    };
    let config = Config { limits: options.limits, workers: options.workers, metrics: options.metrics, ..Config::new(options.auth) };
    let mut state = ApiState::new(store.clone(), client, clock, config).unwrap();
    if options.decide_replies
        && let Some(scheduler) = deciding
    {
        state = state.with_scheduler(scheduler);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(rota_api::serve(listener, state, async move {
        let _ = rx.await;
    }));
    Server {
        base,
        http: rota_agent::http_client().build().unwrap(),
        store,
        token: None,
        scheduler: idle,
        engine_shutdown,
        api_shutdown: Some(tx),
        _dir: dir,
    }
}

/// A response's status and JSON body (`Value::Null` when the body is not JSON).
pub struct Reply {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
    pub text: String,
}

impl Reply {
    /// The error code of an error body.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or_else(|| panic!("not an error body: {} {}", self.status, self.text))
    }

    /// The error reason of an error body.
    pub fn reason(&self) -> &str {
        self.body["error"]["reason"].as_str().unwrap_or_else(|| panic!("not an error body: {} {}", self.status, self.text))
    }

    /// Asserts an error with this status and code, and returns the reason.
    #[track_caller]
    pub fn assert_error(&self, status: u16, code: &str) -> String {
        assert_eq!((self.status.as_u16(), self.code()), (status, code), "{}", self.text);
        self.reason().to_owned()
    }
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let builder = self.http.request(method, self.url(path));
        match &self.token {
            Some(token) => builder.bearer_auth(token),
            None => builder,
        }
    }

    pub async fn send(&self, builder: RequestBuilder) -> Reply {
        let response = builder.send().await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Reply { status, headers, body, text }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(self.request(Method::GET, path)).await
    }

    pub async fn post(&self, path: &str) -> Reply {
        self.send(self.request(Method::POST, path)).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Reply {
        self.send(self.request(Method::POST, path).json(body)).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.send(self.request(Method::DELETE, path)).await
    }

    /// Submits `workflow` with `id`; asserts it was created.
    pub async fn submit(&self, workflow: &str, id: &str) -> Value {
        let reply = self.post_json("/v1/tasks", &json!({ "workflow": workflow, "id": id, "input": { "n": 1 } })).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
        reply.body
    }

    /// Polls the task until `done` holds for its state, within [`WAIT_MAX`].
    pub async fn wait_for(&self, id: &str, done: impl Fn(&str) -> bool) -> Value {
        self.wait_until(id, |task| done(task["state"].as_str().unwrap())).await
    }

    /// Polls the task until `done` holds for it, within [`WAIT_MAX`].
    pub async fn wait_until(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        let started = std::time::Instant::now();
        loop {
            let reply = self.get(&format!("/v1/tasks/{id}")).await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
            if done(&reply.body) {
                return reply.body;
            }
            assert!(started.elapsed() < WAIT_MAX, "task {id} did not get there: {}", reply.text);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls the task until it is terminal.
    pub async fn wait_terminal(&self, id: &str) -> Value {
        self.wait_for(id, |state| matches!(state, "processed" | "error" | "compensated" | "cancelled")).await
    }
}

/// One server-sent event (or keep-alive comment) as it came over the wire.
#[derive(Debug, Clone, Default)]
pub struct Frame {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
    pub comment: bool,
}

impl Frame {
    /// The data as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|err| panic!("event data is not JSON ({err}): {}", self.data))
    }
}

/// Reads an event stream frame by frame.
pub struct SseReader {
    response: reqwest::Response,
    buffer: String,
}

impl SseReader {
    /// Opens `path` as an event stream; asserts 200 and the content type.
    pub async fn open(server: &Server, path: &str, last_event_id: Option<&str>) -> SseReader {
        let mut request = server.request(Method::GET, path);
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(content_type.starts_with("text/event-stream"), "{content_type}");
        SseReader { response, buffer: String::new() }
    }

    /// The next frame, or `None` when the stream ended. Fails the test if
    /// nothing arrives within [`WAIT_MAX`].
    pub async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut frame = Frame::default();
                for line in block.lines() {
                    if line.starts_with(':') {
                        frame.comment = true;
                    } else if let Some((field, value)) = line.split_once(':') {
                        let value = value.strip_prefix(' ').unwrap_or(value);
                        match field {
                            "id" => frame.id = Some(value.to_owned()),
                            "event" => frame.event = Some(value.to_owned()),
                            "data" => {
                                if !frame.data.is_empty() {
                                    frame.data.push('\n');
                                }
                                frame.data.push_str(value);
                            }
                            _ => {}
                        }
                    }
                }
                return Some(frame);
            }
            let chunk = tokio::time::timeout(WAIT_MAX, self.response.chunk()).await.expect("no event within WAIT_MAX");
            match chunk {
                Ok(Some(bytes)) => self.buffer.push_str(std::str::from_utf8(&bytes).unwrap()),
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// The next frame that is an event (keep-alive comments skipped).
    pub async fn next_event(&mut self) -> Option<Frame> {
        loop {
            let frame = self.next().await?;
            if !frame.comment || !frame.data.is_empty() {
                return Some(frame);
            }
        }
    }
}
