//! Cancelling a task stops its agent calls in progress, end to end on each
//! backend: the embedded engine runs the built-in `exec` and `http` agents
//! on a real store whose clock is a `ManualClock`, and the cancel is made
//! through another store handle, as another process would make it (on
//! PostgreSQL a second `PgStore` on the same schema; on SQLite, where one
//! process owns the file, the same store). The agent learns of it by
//! reading the store, so nothing in-process carries the news.
//!
//! The times measured (cancel to process gone, cancel to connection
//! dropped) are printed, never asserted: the waits are bounded by a
//! generous patience only.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rota_agent::{ExecAgent, HttpAgent};
use rota_engine::engine::Config;
use rota_engine::{Client, Engine, Roles, Shutdown, Submission, Workflows};
use rota_model::{InstanceId, ManualClock, RetryPolicy, StepState, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{Event, EventKind, SharedStore, TaskRecord};
use rota_workflow::{AgentCatalog, StepDef, Workflow};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use common::Backend;

const START: Timestamp = Timestamp::from_millis(1_800_000_000_000);
/// How long the test waits, in real time, for the engine to get somewhere.
const PATIENCE: Duration = Duration::from_secs(20);

/// One step `run` of `agent` with `input`, 2 min to complete, not retried.
fn one_step(name: &str, agent: &str, input: Value) -> Workflow {
    let once = RetryPolicy::new(1, Duration::from_millis(10), Duration::from_millis(10)).unwrap();
    Workflow::builder(name, 1)
        .max_failures(1)
        .step(StepDef::new("run", agent).with_input(input).timeout(Duration::from_secs(120)).retry(once))
        .build(&AgentCatalog::builtin())
        .unwrap()
}

struct Rig {
    db: common::TestStore,
    store: SharedStore,
    clock: Arc<ManualClock>,
    /// The client of the engine running the agents.
    client: Client,
    shutdown: Shutdown,
    running: tokio::task::JoinHandle<rota_engine::Result<()>>,
}

impl Rig {
    async fn new(backend: Backend, workflow: Workflow) -> Option<Rig> {
        let clock = Arc::new(ManualClock::new(START));
        let db = common::open(backend, clock.clone()).await?;
        let store = db.store.clone();
        let mut config = Config::new(InstanceId::new("solo").unwrap());
        config.roles = Roles { supervisor: false, ..Roles::ALL };
        config.scheduler.claim_wait = Duration::from_millis(100);
        let engine = Engine::new(store.clone(), clock.clone(), config)
            .agent(Arc::new(ExecAgent::new(clock.clone())))
            .agent(Arc::new(HttpAgent::new(clock.clone()).unwrap()))
            .workflow(workflow);
        engine.register_workflows().await.unwrap();
        let client = engine.client();
        let shutdown = Shutdown::new();
        let running = tokio::spawn(engine.run(shutdown.clone()));
        Some(Rig { db, store, clock, client, shutdown, running })
    }

    async fn submit(&self, workflow: &str, id: &str) -> TaskId {
        let submission = Submission::new(WorkflowName::new(workflow).unwrap(), json!({})).with_id(TaskId::new(id).unwrap());
        self.client.submit(submission).await.unwrap().id
    }

    /// Waits until `done` holds of the task's record.
    async fn until(&self, id: &TaskId, what: &str, done: impl Fn(&TaskRecord) -> bool) -> TaskRecord {
        let started = Instant::now();
        loop {
            let record = self.store.task(id).await.unwrap().unwrap();
            if done(&record) {
                return record;
            }
            assert!(started.elapsed() < PATIENCE, "{what} never happened: {record:#?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Cancels `id` through a store handle of another process.
    async fn cancel_elsewhere(&self, id: &TaskId) -> TaskState {
        let elsewhere = self.db.another_process(self.clock.clone()).await;
        let client = Client::new(elsewhere.clone(), self.clock.clone(), Workflows::new(elsewhere), None);
        client.cancel(id, rota_engine::ops::Operator { by: "test", reason: None }).await.unwrap()
    }

    /// Waits for the task's `call_stopped` event and returns it.
    async fn stopped_event(&self, id: &TaskId) -> Event {
        let started = Instant::now();
        loop {
            let history = self.store.history(id).await.unwrap();
            if let Some(event) = history.iter().find(|e| e.kind == EventKind::CallStopped) {
                return event.clone();
            }
            assert!(started.elapsed() < PATIENCE, "no call_stopped event: {history:#?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn finish(self) {
        self.shutdown.trigger();
        self.running.await.unwrap().unwrap();
    }
}

/// Whether process `pid` still exists (a zombie counts: it was not reaped).
fn process_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The cancel failed the step's attempt as abandoned (nothing left in
/// flight for the Supervisor to find late), the step's call is recorded as
/// stopped with the reason, for its attempt, and nothing else happens to
/// the cancelled task afterwards: no reply was sent, so no step event
/// follows.
async fn stopped_and_recorded(rig: &Rig, id: &TaskId, agent: &str) {
    let event = rig.stopped_event(id).await;
    assert_eq!((event.step.as_ref().map(|s| s.as_str()), event.attempt), (Some("run"), Some(1)), "{event:?}");
    assert_eq!(event.detail, json!({ "agent": agent, "reason": "the task was cancelled", "compensate": false }));
    // Long enough for a reply, had one been sent, to reach the Scheduler.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let history = rig.store.history(id).await.unwrap();
    let after: Vec<EventKind> = history.iter().skip_while(|e| e.kind != EventKind::Cancelled).map(|e| e.kind).collect();
    assert_eq!(after, [EventKind::Cancelled, EventKind::StepFailed, EventKind::CallStopped], "{history:#?}");
    let failed = history.iter().find(|e| e.kind == EventKind::StepFailed).unwrap();
    assert_eq!((failed.step.as_ref().map(|s| s.as_str()), failed.attempt), (Some("run"), Some(1)), "{failed:?}");
    assert_eq!(failed.detail, json!({ "error": "attempt 1 was abandoned: its task was cancelled", "retryable": false, "cancelled": true }));
    let record = rig.store.task(id).await.unwrap().unwrap();
    assert_eq!(record.task.state, TaskState::Cancelled);
    let step = &record.steps[0];
    assert_eq!((step.state, step.attempt, step.complete_by), (StepState::Failed, 1, None), "{record:#?}");
    // Past the attempt's complete-by: the Supervisor would find nothing.
    rig.clock.advance(Duration::from_secs(121));
    assert!(rig.store.expired(100).await.unwrap().is_empty(), "nothing left in flight for the Supervisor");
}

/// A cancelled task's `exec` step running `sleep 60`: its process is gone
/// soon after the cancel, and the history says the call was stopped.
async fn cancelling_kills_a_running_exec_command(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    // `exec` keeps the pid the shell wrote: the pid is `sleep`'s.
    let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
    let workflow = one_step("sleeper", "exec", json!({ "command": ["sh", "-c", script], "timeout": "100s" }));
    let Some(rig) = Rig::new(backend, workflow).await else { return };
    let id = rig.submit("sleeper", "s-1").await;

    let started = Instant::now();
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|text| text.trim().parse::<u32>().ok()) {
            break pid;
        }
        assert!(started.elapsed() < PATIENCE, "the command never wrote its pid");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(process_exists(pid), "sleep runs");
    rig.until(&id, "step run running", |r| r.steps[0].state == StepState::Running).await;

    let cancelled_at = Instant::now();
    assert_eq!(rig.cancel_elsewhere(&id).await, TaskState::Cancelled);
    while process_exists(pid) {
        assert!(cancelled_at.elapsed() < PATIENCE, "process {pid} still exists {PATIENCE:?} after the cancel");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("{backend:?}: process {pid} gone {:?} after the cancel", cancelled_at.elapsed());
    stopped_and_recorded(&rig, &id, "exec").await;
    rig.finish().await;
}

/// A cancelled task's `http` step waiting for a server that never answers:
/// the server sees its connection closed soon after the cancel.
async fn cancelling_drops_a_running_http_request(backend: Backend) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/slow", listener.local_addr().unwrap());
    let workflow = one_step("slow-call", "http", json!({ "method": "POST", "url": url, "body": {}, "timeout": "100s" }));
    let Some(rig) = Rig::new(backend, workflow).await else { return };
    let id = rig.submit("slow-call", "h-1").await;

    let (mut connection, _) = tokio::time::timeout(PATIENCE, listener.accept()).await.expect("the agent never connected").unwrap();
    let mut request = Vec::new();
    let mut buffer = [0u8; 4096];
    // Read the whole request (its head names the step), answer nothing.
    while !String::from_utf8_lossy(&request).contains("\r\n\r\n{}") {
        let read = tokio::time::timeout(PATIENCE, connection.read(&mut buffer)).await.expect("the request never came").unwrap();
        assert!(read > 0, "the connection closed before the request was sent");
        request.extend_from_slice(&buffer[..read]);
    }
    assert!(String::from_utf8_lossy(&request).to_ascii_lowercase().contains("rota-task-id: h-1"), "{}", String::from_utf8_lossy(&request));
    rig.until(&id, "step run running", |r| r.steps[0].state == StepState::Running).await;

    let cancelled_at = Instant::now();
    assert_eq!(rig.cancel_elsewhere(&id).await, TaskState::Cancelled);
    let read = tokio::time::timeout(PATIENCE, connection.read(&mut buffer)).await.expect("the connection was never dropped");
    assert!(matches!(read, Ok(0) | Err(_)), "the agent sent more instead of closing: {read:?}");
    println!("{backend:?}: connection dropped {:?} after the cancel", cancelled_at.elapsed());
    stopped_and_recorded(&rig, &id, "http").await;
    rig.finish().await;
}

on_each_backend!(cancelling_kills_a_running_exec_command, cancelling_drops_a_running_http_request);
