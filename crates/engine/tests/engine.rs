//! The embedded engine end to end, on a real store (each test runs on
//! SQLite and on PostgreSQL), with agents written in Rust: every role in one
//! process, as `rota serve` runs them.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rota_agent::{Agent, Request, StepError};
use rota_engine::engine::Config;
use rota_engine::{Engine, Shutdown, Submission};
use rota_model::{ExhaustedPolicy, InstanceId, RetryPolicy, SystemClock, TaskId, TaskState, WorkflowName};
use rota_store::{EventKind, SharedStore};
use rota_workflow::{AgentCatalog, CompensateDef, StepDef, Workflow};
use serde_json::{Value, json};

use common::{Backend, TestStore};

/// An agent that records every call and fails the steps it is told to.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<(String, bool, u32)>>,
    fail_permanently: Mutex<Vec<String>>,
}

#[async_trait]
impl Agent for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        self.calls.lock().unwrap().push((request.step.to_string(), request.compensate, request.attempt));
        if !request.compensate && self.fail_permanently.lock().unwrap().contains(&request.step.to_string()) {
            return Err(StepError::permanent("card declined"));
        }
        Ok(json!({ "step": request.step.as_str(), "input": request.input }))
    }
}

struct Setup {
    _db: TestStore,
    store: SharedStore,
    agent: Arc<Recorder>,
}

async fn setup(backend: Backend) -> Option<Setup> {
    let db = common::open(backend, Arc::new(SystemClock)).await?;
    Some(Setup { store: db.store.clone(), _db: db, agent: Arc::new(Recorder::default()) })
}

fn catalog() -> AgentCatalog {
    AgentCatalog::builtin().with(rota_workflow::AgentName::new("recorder").unwrap())
}

fn quick() -> RetryPolicy {
    RetryPolicy::new(2, Duration::from_millis(10), Duration::from_millis(50)).unwrap()
}

fn engine(setup: &Setup, workflow: Workflow) -> Engine {
    let mut config = Config::new(InstanceId::new("test-1").unwrap());
    config.supervisor.interval = Duration::from_millis(100);
    config.supervisor.leader_ttl = Duration::from_secs(1);
    Engine::new(setup.store.clone(), Arc::new(SystemClock), config).agent(setup.agent.clone()).workflow(workflow)
}

async fn run_one(setup: &Setup, workflow: Workflow, input: Value) -> (TaskId, TaskState) {
    let name = workflow.name().clone();
    let engine = engine(setup, workflow);
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    let shutdown = Shutdown::new();
    let running = tokio::spawn(engine.run(shutdown.clone()));
    let submitted = client.submit(Submission::new(name, input)).await.unwrap();
    let state = client.wait(&submitted.id, Duration::from_secs(20)).await.unwrap();
    shutdown.trigger();
    running.await.unwrap().unwrap();
    (submitted.id, state)
}

fn order(policy: ExhaustedPolicy) -> Workflow {
    Workflow::builder("order", 1)
        .on_exhausted(policy)
        .step(
            StepDef::new("reserve", "recorder")
                .with_input(json!({ "order": "{{ input.order_id }}" }))
                .retry(quick())
                .compensate(CompensateDef::new("recorder").with_input(json!({ "release": "{{ steps.reserve.output.step }}" }))),
        )
        .step(
            StepDef::new("charge", "recorder")
                .with_input(json!({ "amount": "{{ input.amount }}", "after": "{{ steps.reserve.output.step }}" }))
                .retry(quick())
                .compensate(CompensateDef::new("recorder")),
        )
        .step(StepDef::new("ship", "recorder").retry(quick()))
        .build(&catalog())
        .unwrap()
}

async fn a_task_runs_its_steps_in_order_and_is_processed(backend: Backend) {
    let Some(setup) = setup(backend).await else { return };
    let (id, state) = run_one(&setup, order(ExhaustedPolicy::Error), json!({ "order_id": 17, "amount": 250 })).await;
    assert_eq!(state, TaskState::Processed);
    let calls: Vec<String> = setup.agent.calls.lock().unwrap().iter().map(|c| c.0.clone()).collect();
    assert_eq!(calls, ["reserve", "charge", "ship"], "each step once, in order");
    let record = setup.store.task(&id).await.unwrap().unwrap();
    let output = record.task.output.unwrap();
    assert_eq!(output["charge"]["input"], json!({ "amount": 250, "after": "reserve" }), "templates reach the input and earlier outputs");
    assert!(record.steps.iter().all(|s| s.attempt == 1));
    let kinds: Vec<EventKind> = setup.store.history(&id).await.unwrap().into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds.first(), Some(&EventKind::Received));
    assert_eq!(kinds.last(), Some(&EventKind::Processed));
    assert_eq!(kinds.iter().filter(|k| **k == EventKind::StepCompleted).count(), 3);
}

async fn parallel_branches_fan_out_and_fan_in(backend: Backend) {
    let Some(setup) = setup(backend).await else { return };
    let workflow = Workflow::builder("diamond", 1)
        .step(StepDef::new("start", "recorder"))
        .step(StepDef::new("left", "recorder").depends_on(["start"]))
        .step(StepDef::new("right", "recorder").depends_on(["start"]))
        .step(
            StepDef::new("join", "recorder")
                .depends_on(["left", "right"])
                .with_input(json!(["{{ steps.left.output.step }}", "{{ steps.right.output.step }}"])),
        )
        .build(&catalog())
        .unwrap();
    let (id, state) = run_one(&setup, workflow, json!({})).await;
    assert_eq!(state, TaskState::Processed);
    let calls: Vec<String> = setup.agent.calls.lock().unwrap().iter().map(|c| c.0.clone()).collect();
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert_eq!((calls[0].as_str(), calls[3].as_str()), ("start", "join"));
    let record = setup.store.task(&id).await.unwrap().unwrap();
    assert_eq!(record.task.output.unwrap()["join"]["input"], json!(["left", "right"]));
}

async fn a_permanent_error_ends_in_error_with_an_alert(backend: Backend) {
    let Some(setup) = setup(backend).await else { return };
    setup.agent.fail_permanently.lock().unwrap().push("charge".into());
    let (id, state) = run_one(&setup, order(ExhaustedPolicy::Error), json!({ "order_id": 1, "amount": 5 })).await;
    assert_eq!(state, TaskState::Error);
    let alerts = setup.store.alerts(10).await.unwrap();
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0].task_id, id);
    assert!(alerts[0].detail["reason"].as_str().unwrap().contains("card declined"), "{:?}", alerts[0].detail);
    let calls: Vec<String> = setup.agent.calls.lock().unwrap().iter().map(|c| c.0.clone()).collect();
    assert_eq!(calls, ["reserve", "charge"], "a permanent error is not retried and nothing after it runs");
}

async fn a_permanent_error_compensates_completed_steps_in_reverse(backend: Backend) {
    let Some(setup) = setup(backend).await else { return };
    setup.agent.fail_permanently.lock().unwrap().push("ship".into());
    let (id, state) = run_one(&setup, order(ExhaustedPolicy::Compensate), json!({ "order_id": 2, "amount": 9 })).await;
    assert_eq!(state, TaskState::Compensated);
    let calls: Vec<(String, bool)> = setup.agent.calls.lock().unwrap().iter().map(|c| (c.0.clone(), c.1)).collect();
    let expected: Vec<(String, bool)> = [("reserve", false), ("charge", false), ("ship", false), ("charge", true), ("reserve", true)]
        .iter()
        .map(|(s, c)| (s.to_string(), *c))
        .collect();
    assert_eq!(calls, expected, "compensations run in reverse order of completion");
    let record = setup.store.task(&id).await.unwrap().unwrap();
    let states: HashMap<String, String> = record.steps.iter().map(|s| (s.name.to_string(), s.state.to_string())).collect();
    assert_eq!(states["reserve"], "compensated");
    assert_eq!(states["charge"], "compensated");
    assert_eq!(states["ship"], "failed");
}

async fn submitting_the_same_id_twice_creates_one_task(backend: Backend) {
    let Some(setup) = setup(backend).await else { return };
    let engine = engine(&setup, order(ExhaustedPolicy::Error));
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    let id = TaskId::new("order-42").unwrap();
    let submission = Submission::new(WorkflowName::new("order").unwrap(), json!({ "order_id": 42, "amount": 1 })).with_id(id.clone());
    assert!(client.submit(submission.clone()).await.unwrap().created);
    assert!(!client.submit(submission).await.unwrap().created, "the task id is the idempotency key");
    let shutdown = Shutdown::new();
    let running = tokio::spawn(engine.run(shutdown.clone()));
    assert_eq!(client.wait(&id, Duration::from_secs(20)).await.unwrap(), TaskState::Processed);
    shutdown.trigger();
    running.await.unwrap().unwrap();
    assert_eq!(setup.agent.calls.lock().unwrap().len(), 3);
}

on_each_backend!(
    a_task_runs_its_steps_in_order_and_is_processed,
    parallel_branches_fan_out_and_fan_in,
    a_permanent_error_ends_in_error_with_an_alert,
    a_permanent_error_compensates_completed_steps_in_reverse,
    submitting_the_same_id_twice_creates_one_task,
);
