//! A step's retry policy and the operator's resubmit with a new input, end
//! to end on each backend: the embedded engine (Scheduler and agents) on a
//! real store whose clock is a `ManualClock`, the built-in `http` agent
//! calling a real HTTP server on loopback (wiremock), and an agent written
//! here that echoes its input.
//!
//! The clock moves only where the test moves it: a Scheduler's retry waits
//! for its backoff on the store's clock, so a step retried by the Scheduler
//! shows the test advancing the clock, and one that is not retried ends
//! without it.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rota_agent::{Agent, HttpAgent, Request, StepError};
use rota_engine::engine::Config;
use rota_engine::{Client, Engine, Roles, Shutdown, Submission, ops};
use rota_model::{FailureClass, InstanceId, ManualClock, RetryPolicy, StepName, StepState, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{Event, EventKind, SharedStore, TaskRecord};
use rota_workflow::{AgentCatalog, AgentName, StepDef, Workflow};
use serde_json::{Value, json};
use wiremock::matchers::path;
use wiremock::{Mock, MockServer, ResponseTemplate};

use common::Backend;

const START: Timestamp = Timestamp::from_millis(1_800_000_000_000);
/// How long the test waits, in real time, for the engine to get somewhere.
const PATIENCE: Duration = Duration::from_secs(20);

/// Echoes its step's input as its output, records every call, and fails
/// for good a step whose input says `"fail": true`, once the test lets it
/// (a permit of `failures_allowed` per failure): the test decides what has
/// happened in the task before the failure ends it.
struct Echo {
    calls: Mutex<Vec<(String, Value)>>,
    failures_allowed: tokio::sync::Semaphore,
}

impl Default for Echo {
    fn default() -> Echo {
        Echo { calls: Mutex::default(), failures_allowed: tokio::sync::Semaphore::new(0) }
    }
}

impl Echo {
    fn calls(&self, step: &str) -> Vec<Value> {
        self.calls.lock().unwrap().iter().filter(|(name, _)| name == step).map(|(_, input)| input.clone()).collect()
    }
}

#[rota_engine::async_trait]
impl Agent for Echo {
    fn name(&self) -> &str {
        "echo"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        self.calls.lock().unwrap().push((request.step.to_string(), request.input.clone()));
        if request.input["fail"] == json!(true) {
            self.failures_allowed.acquire().await.expect("the semaphore is never closed").forget();
            return Err(StepError::permanent("refused: fail is true"));
        }
        Ok(request.input.clone())
    }
}

fn catalog() -> AgentCatalog {
    AgentCatalog::builtin().with(AgentName::new("echo").unwrap())
}

/// Two tries inside each attempt, 10-20 ms apart, and `non_retryable`.
fn policy(non_retryable: &[u16]) -> RetryPolicy {
    RetryPolicy::new(2, Duration::from_millis(10), Duration::from_millis(20))
        .unwrap()
        .with_non_retryable(non_retryable.iter().map(|status| FailureClass::status(*status).unwrap()))
}

/// One `http` GET of `input.url`; the task fails after two counted failures.
fn fetch(name: &str, non_retryable: &[u16]) -> Workflow {
    Workflow::builder(name, 1)
        .max_failures(2)
        .step(StepDef::new("get", "http").with_input(json!({ "method": "GET", "url": "{{ input.url }}" })).retry(policy(non_retryable)))
        .build(&catalog())
        .unwrap()
}

/// `check` → `pack` (which fails for good when the input says so), and
/// `label`, a second root that depends on nothing.
fn ship() -> Workflow {
    Workflow::builder("ship", 1)
        .step(StepDef::new("check", "echo").with_input(json!({ "n": "{{ input.n }}" })))
        .step(
            StepDef::new("pack", "echo")
                .with_input(json!({ "n": "{{ input.n }}", "checked": "{{ steps.check.output.n }}", "fail": "{{ input.fail }}" })),
        )
        .step(StepDef::new("label", "echo").depends_on(Vec::<String>::new()).with_input(json!({ "label": "{{ input.n }}" })))
        .step(StepDef::wait("approve", "go").depends_on(["pack"]).timeout(Duration::from_secs(120)))
        .build(&catalog())
        .unwrap()
}

struct Rig {
    _db: common::TestStore,
    store: SharedStore,
    clock: Arc<ManualClock>,
    echo: Arc<Echo>,
    client: Client,
    shutdown: Shutdown,
    running: tokio::task::JoinHandle<rota_engine::Result<()>>,
}

impl Rig {
    async fn new(backend: Backend) -> Option<Rig> {
        let clock = Arc::new(ManualClock::new(START));
        let db = common::open(backend, clock.clone()).await?;
        let store = db.store.clone();
        let echo = Arc::new(Echo::default());
        let mut config = Config::new(InstanceId::new("solo").unwrap());
        // No Supervisor: the clock only moves where the test moves it, and
        // nothing here times out.
        config.roles = Roles { supervisor: false, ..Roles::ALL };
        config.scheduler.recovery = RetryPolicy::new(100, Duration::from_millis(50), Duration::from_millis(100)).unwrap();
        config.scheduler.claim_wait = Duration::from_millis(100);
        let engine = Engine::new(store.clone(), clock.clone(), config)
            .agent(Arc::new(HttpAgent::new(clock.clone()).unwrap()))
            .agent(echo.clone())
            .workflow(fetch("fetch-404", &[404]))
            .workflow(fetch("fetch-503", &[503]))
            .workflow(ship());
        engine.register_workflows().await.unwrap();
        let client = engine.client();
        let shutdown = Shutdown::new();
        let running = tokio::spawn(engine.run(shutdown.clone()));
        Some(Rig { _db: db, store, clock, echo, client, shutdown, running })
    }

    async fn submit(&self, workflow: &str, input: Value) -> TaskId {
        self.client.submit(Submission::new(WorkflowName::new(workflow).unwrap(), input)).await.unwrap().id
    }

    /// Waits for the task to reach `state` without moving the clock.
    async fn reaches(&self, id: &TaskId, state: TaskState) -> TaskRecord {
        self.until(id, state, Duration::ZERO).await
    }

    /// Waits for the task to reach `state`, moving the clock by `step`
    /// every 20 ms of real time.
    async fn until(&self, id: &TaskId, state: TaskState, step: Duration) -> TaskRecord {
        let started = std::time::Instant::now();
        loop {
            let record = self.store.task(id).await.unwrap().unwrap();
            if record.task.state == state {
                return record;
            }
            assert!(started.elapsed() < PATIENCE, "task {id} never reached {state}: {record:#?}");
            self.clock.advance(step);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the task's step `name` to reach `state`, without moving
    /// the clock.
    async fn step_reaches(&self, id: &TaskId, name: &str, state: StepState) -> TaskRecord {
        let started = std::time::Instant::now();
        loop {
            let record = self.store.task(id).await.unwrap().unwrap();
            if step(&record, name).state == state {
                return record;
            }
            assert!(started.elapsed() < PATIENCE, "step {name} of task {id} never reached {state}: {record:#?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn history(&self, id: &TaskId) -> Vec<Event> {
        self.store.history(id).await.unwrap()
    }

    async fn stop(self) {
        self.shutdown.trigger();
        self.running.await.unwrap().unwrap();
    }
}

fn of_kind(history: &[Event], kind: EventKind) -> Vec<&Event> {
    history.iter().filter(|e| e.kind == kind).collect()
}

fn step<'r>(record: &'r TaskRecord, name: &str) -> &'r rota_model::Step {
    record.steps.iter().find(|s| s.name.as_str() == name).unwrap()
}

async fn hits(server: &MockServer, at: &str) -> usize {
    server.received_requests().await.unwrap().iter().filter(|r| r.url.path() == at).count()
}

async fn server() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(path("/missing")).respond_with(ResponseTemplate::new(404).set_body_string("no such order")).mount(&server).await;
    Mock::given(path("/busy")).respond_with(ResponseTemplate::new(503).set_body_string("try later")).mount(&server).await;
    server
}

/// A status the policy lists fails the step at its first answer: one
/// call, attempt 1, no retry by the agent or the Scheduler (the clock never
/// moves), and the history says why. A status it does not list is retried
/// by the agent and then by the Scheduler, up to `max_failures`.
async fn a_listed_status_fails_at_once_and_another_is_retried(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let server = server().await;

    let missing = rig.submit("fetch-404", json!({ "url": format!("{}/missing", server.uri()) })).await;
    let record = rig.reaches(&missing, TaskState::Error).await;
    assert_eq!((step(&record, "get").state, step(&record, "get").attempt), (StepState::Failed, 1));
    assert_eq!(hits(&server, "/missing").await, 1);

    let busy = rig.submit("fetch-503", json!({ "url": format!("{}/busy", server.uri()) })).await;
    let record = rig.reaches(&busy, TaskState::Error).await;
    assert_eq!((step(&record, "get").state, step(&record, "get").attempt), (StepState::Failed, 1));
    assert_eq!(hits(&server, "/busy").await, 1, "the agent did not try again");
    let history = rig.history(&busy).await;
    let failed = of_kind(&history, EventKind::StepFailed);
    assert_eq!(failed.len(), 1, "{history:#?}");
    assert_eq!(failed[0].detail["retryable"], json!(false));
    let error = failed[0].detail["error"].as_str().unwrap();
    assert!(error.contains("503 Service Unavailable: try later; not retried: HTTP status 503 is listed in retry.non_retryable"), "{error}");
    let reason = record.task.error.unwrap();
    assert!(reason.starts_with("step get failed permanently: ") && !reason.contains("threshold"), "{reason}");

    // 503 is not listed in fetch-404's policy: two tries per attempt, and a
    // second attempt after the Scheduler's backoff.
    let retried = rig.submit("fetch-404", json!({ "url": format!("{}/busy", server.uri()) })).await;
    let record = rig.until(&retried, TaskState::Error, Duration::from_millis(50)).await;
    assert_eq!(step(&record, "get").attempt, 2, "the Scheduler ran a second attempt");
    assert_eq!(hits(&server, "/busy").await, 1 + 4, "two tries in each of two attempts");
    let history = rig.history(&retried).await;
    let failed = of_kind(&history, EventKind::StepFailed);
    assert!(failed.iter().all(|e| e.detail["retryable"] == json!(true)), "{history:#?}");
    let reason = record.task.error.unwrap();
    assert!(reason.ends_with("503 Service Unavailable: try later (failure 2 of 2)"), "{reason}");
    rig.stop().await;
}

/// A resubmit with a new input from `check` runs `check` and everything
/// after it again on the new input (its templates and later steps' see
/// it), keeps `label`, which does not depend on `check`, and records the
/// old and new input and who asked.
async fn a_resubmit_with_a_new_input_runs_the_step_and_its_dependents_again(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let id = rig.submit("ship", json!({ "n": 1, "fail": true })).await;
    // `label` runs beside `check` and `pack`: it must have completed before
    // `pack` fails and ends the task, or its reply would come too late to
    // count and it would rightly run again after the resubmit.
    rig.step_reaches(&id, "label", StepState::Completed).await;
    rig.echo.failures_allowed.add_permits(1);
    let record = rig.reaches(&id, TaskState::Error).await;
    assert_eq!(step(&record, "check").state, StepState::Completed);
    assert_eq!(step(&record, "pack").state, StepState::Failed);
    assert_eq!(rig.echo.calls("label").len(), 1);

    let check = StepName::new("check").unwrap();
    let detail = rig
        .client
        .resubmit_with_input(
            &id,
            &check,
            json!({ "n": 7, "fail": false }),
            rota_engine::ops::Operator { by: "test, user ana", reason: Some("the check was wrong") },
        )
        .await
        .unwrap();
    assert_eq!(detail.record.task.state, TaskState::Pending);
    assert_eq!(detail.record.task.input, json!({ "n": 7, "fail": false }));
    // The approval waits for a signal: the task runs until then.
    rig.step_reaches(&id, "approve", StepState::Running).await;
    rig.client.signal(&id, &rota_model::SignalName::new("go").unwrap(), json!("ok"), "test").await.unwrap();
    let record = rig.reaches(&id, TaskState::Processed).await;

    assert_eq!(rig.echo.calls("check"), [json!({ "n": 1 }), json!({ "n": 7 })]);
    assert_eq!(rig.echo.calls("pack"), [json!({ "n": 1, "checked": 1, "fail": true }), json!({ "n": 7, "checked": 7, "fail": false })]);
    assert_eq!(rig.echo.calls("label"), [json!({ "label": 1 })], "a step that does not depend on check keeps its run");
    assert_eq!((step(&record, "check").attempt, step(&record, "pack").attempt, step(&record, "label").attempt), (2, 2, 1));
    assert_eq!(record.task.output.unwrap()["pack"], json!({ "n": 7, "checked": 7, "fail": false }));

    let history = rig.history(&id).await;
    let resubmitted = of_kind(&history, EventKind::Resubmitted);
    assert_eq!(resubmitted.len(), 1);
    assert_eq!(
        resubmitted[0].detail,
        json!({
            "step": "check",
            "compensation": false,
            "steps": ["check", "pack", "approve"],
            "input": { "old": { "n": 1, "fail": true }, "new": { "n": 7, "fail": false } },
            "by": "test, user ana",
            "reason": "the check was wrong",
        })
    );
    rig.stop().await;
}

/// A task that is still running is not resubmitted: the refusal names
/// the state, and neither its input nor its history changes. A step the
/// task does not have is refused too.
async fn resubmitting_a_running_task_is_refused_and_changes_nothing(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let id = rig.submit("ship", json!({ "n": 1, "fail": false })).await;
    let before = rig.step_reaches(&id, "approve", StepState::Running).await;
    let events = rig.history(&id).await.len();
    let check = StepName::new("check").unwrap();
    let err = rig
        .client
        .resubmit_with_input(&id, &check, json!({ "n": 2 }), rota_engine::ops::Operator { by: "test", reason: None })
        .await
        .unwrap_err();
    assert!(matches!(err, ops::Error::Refused { .. }), "{err:?}");
    assert_eq!(err.to_string(), format!("resubmit: task {id}: cannot resubmit a task that is processing"));
    let nope = StepName::new("nope").unwrap();
    let err = rig
        .client
        .resubmit_with_input(&id, &nope, json!({ "n": 2 }), rota_engine::ops::Operator { by: "test", reason: None })
        .await
        .unwrap_err();
    assert!(matches!(err, ops::Error::StepNotFound { .. }), "{err:?}");
    let after = rig.store.task(&id).await.unwrap().unwrap();
    assert_eq!(after.task.input, json!({ "n": 1, "fail": false }));
    assert_eq!((after.task.state, after.task.lease_epoch), (before.task.state, before.task.lease_epoch));
    assert_eq!(rig.history(&id).await.len(), events, "nothing recorded");
    rig.client.signal(&id, &rota_model::SignalName::new("go").unwrap(), json!("ok"), "test").await.unwrap();
    rig.reaches(&id, TaskState::Processed).await;
    rig.stop().await;
}

on_each_backend!(
    a_listed_status_fails_at_once_and_another_is_retried,
    a_resubmit_with_a_new_input_runs_the_step_and_its_dependents_again,
    resubmitting_a_running_task_is_refused_and_changes_nothing,
);
