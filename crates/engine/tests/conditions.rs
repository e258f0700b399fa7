//! Step conditions (`when:`) end to end, on SQLite and on PostgreSQL: a
//! false condition skips its step, a skipped step settles its dependents,
//! is left out of the output and of compensation, and a condition that
//! cannot be decided fails the task.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rota_agent::{Agent, Request, StepError};
use rota_engine::engine::Config;
use rota_engine::{Engine, Shutdown, Submission};
use rota_model::{ExhaustedPolicy, InstanceId, StepState, SystemClock, TaskId, TaskState};
use rota_store::{EventKind, SharedStore, TaskRecord};
use rota_workflow::{AgentCatalog, CompensateDef, StepDef, Workflow};
use serde_json::{Value, json};

use common::{Backend, TestStore};

/// An agent that records every call (step, compensation or not), echoes
/// its input, and fails the steps it is told to.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<(String, bool)>>,
    fail_permanently: Mutex<Vec<String>>,
}

#[async_trait]
impl Agent for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        self.calls.lock().unwrap().push((request.step.to_string(), request.compensate));
        if !request.compensate && self.fail_permanently.lock().unwrap().contains(&request.step.to_string()) {
            return Err(StepError::permanent("card declined"));
        }
        Ok(json!({ "input": request.input }))
    }
}

struct Setup {
    _db: TestStore,
    store: SharedStore,
    agent: Arc<Recorder>,
}

impl Setup {
    fn calls(&self) -> Vec<(String, bool)> {
        self.agent.calls.lock().unwrap().clone()
    }

    fn steps_called(&self) -> Vec<String> {
        self.calls().into_iter().filter(|(_, compensate)| !compensate).map(|(step, _)| step).collect()
    }

    async fn record(&self, id: &TaskId) -> TaskRecord {
        self.store.task(id).await.unwrap().unwrap()
    }

    async fn states(&self, id: &TaskId) -> HashMap<String, StepState> {
        self.record(id).await.steps.iter().map(|s| (s.name.to_string(), s.state)).collect()
    }
}

async fn setup(backend: Backend) -> Option<Setup> {
    let db = common::open(backend, Arc::new(SystemClock)).await?;
    Some(Setup { store: db.store.clone(), _db: db, agent: Arc::new(Recorder::default()) })
}

fn catalog() -> AgentCatalog {
    AgentCatalog::builtin().with(rota_workflow::AgentName::new("recorder").unwrap())
}

async fn run(setup: &Setup, workflow: Workflow, inputs: &[Value]) -> Vec<(TaskId, TaskState)> {
    let name = workflow.name().clone();
    let mut config = Config::new(InstanceId::new("test-1").unwrap());
    config.supervisor.interval = Duration::from_millis(100);
    config.supervisor.leader_ttl = Duration::from_secs(1);
    let engine = Engine::new(setup.store.clone(), Arc::new(SystemClock), config).agent(setup.agent.clone()).workflow(workflow);
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    let shutdown = Shutdown::new();
    let running = tokio::spawn(engine.run(shutdown.clone()));
    let mut ended = Vec::new();
    for input in inputs {
        let submitted = client.submit(Submission::new(name.clone(), input.clone())).await.unwrap();
        let state = client.wait(&submitted.id, Duration::from_secs(20)).await.unwrap();
        ended.push((submitted.id, state));
    }
    shutdown.trigger();
    running.await.unwrap().unwrap();
    ended
}

/// `upgrade` runs only for a VIP; `notify` follows it either way; `thank`
/// follows it too but only when it ran.
fn membership() -> Workflow {
    Workflow::builder("membership", 1)
        .step(StepDef::new("check", "recorder").with_input(json!({ "vip": "{{ input.vip }}" })))
        .step(StepDef::new("upgrade", "recorder").when("steps.check.output.input.vip == true"))
        .step(StepDef::new("notify", "recorder").depends_on(["upgrade"]))
        .step(StepDef::new("thank", "recorder").depends_on(["upgrade"]).when("has(steps.upgrade)"))
        .build(&catalog())
        .unwrap()
}

async fn a_false_condition_skips_the_step_and_its_dependents_still_run(backend: Backend) {
    let Some(setup) = setup(backend).await else { return };
    let ended = run(&setup, membership(), &[json!({ "vip": false })]).await;
    let (id, state) = &ended[0];
    assert_eq!(*state, TaskState::Processed);
    assert_eq!(setup.steps_called(), ["check", "notify"], "a skipped step is never sent; a step after it runs");
    let states = setup.states(id).await;
    assert_eq!(states["upgrade"], StepState::Skipped);
    assert_eq!(states["thank"], StepState::Skipped, "a condition on a skipped step sees it absent from `steps`");
    assert_eq!(states["notify"], StepState::Completed);
    let record = setup.record(id).await;
    let skipped = record.steps.iter().find(|s| s.name.as_str() == "upgrade").unwrap();
    assert_eq!((skipped.attempt, skipped.input.as_ref(), skipped.output.as_ref()), (0, None, None));
    let output = record.task.output.unwrap();
    let keys: Vec<&String> = output.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["check", "notify"], "skipped steps have no entry in the task's output");
    let history = setup.store.history(id).await.unwrap();
    let skips: Vec<(&str, &Value)> = history
        .iter()
        .filter(|e| e.kind == EventKind::StepSkipped)
        .map(|e| (e.step.as_ref().map_or("", |s| s.as_str()), &e.detail["when"]))
        .collect();
    assert_eq!(skips, [("upgrade", &json!("steps.check.output.input.vip == true")), ("thank", &json!("has(steps.upgrade)"))]);
    let started: Vec<&str> =
        history.iter().filter(|e| e.kind == EventKind::StepStarted).filter_map(|e| e.step.as_ref().map(|s| s.as_str())).collect();
    assert_eq!(started, ["check", "notify"]);
}

async fn a_true_condition_runs_the_step(backend: Backend) {
    let Some(setup) = setup(backend).await else { return };
    let ended = run(&setup, membership(), &[json!({ "vip": true })]).await;
    let (id, state) = &ended[0];
    assert_eq!(*state, TaskState::Processed);
    let mut called = setup.steps_called();
    called[2..].sort();
    assert_eq!(called, ["check", "upgrade", "notify", "thank"]);
    assert!(setup.states(id).await.values().all(|s| *s == StepState::Completed));
    let history = setup.store.history(id).await.unwrap();
    assert!(!history.iter().any(|e| e.kind == EventKind::StepSkipped));
}

async fn a_condition_that_cannot_be_decided_fails_the_task(backend: Backend) {
    let Some(setup) = setup(backend).await else { return };
    let workflow = Workflow::builder("undecided", 1)
        .step(StepDef::new("first", "recorder"))
        .step(StepDef::new("big", "recorder").when("input.amount > 100"))
        .build(&catalog())
        .unwrap();
    let ended = run(&setup, workflow, &[json!({ "currency": "EUR" })]).await;
    let (id, state) = &ended[0];
    assert_eq!(*state, TaskState::Error, "a missing field is a permanent failure, not a skip");
    assert_eq!(setup.steps_called(), ["first"]);
    let record = setup.record(id).await;
    let reason = "step big: condition `input.amount > 100` could not be evaluated: no field `amount`";
    assert_eq!(record.task.error.as_deref(), Some(reason));
    let big = record.steps.iter().find(|s| s.name.as_str() == "big").unwrap();
    assert_eq!((big.state, big.attempt, big.last_error.as_deref()), (StepState::NotStarted, 0, Some(reason)));
    let alerts = setup.store.alerts(10).await.unwrap();
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0].detail["reason"], json!(reason));
}

async fn a_template_reading_a_skipped_step_fails_the_task(backend: Backend) {
    let Some(setup) = setup(backend).await else { return };
    let workflow = Workflow::builder("careless", 1)
        .step(StepDef::new("maybe", "recorder").when("input.go"))
        .step(StepDef::new("after", "recorder").with_input(json!({ "from": "{{ steps.maybe.output }}" })))
        .build(&catalog())
        .unwrap();
    let ended = run(&setup, workflow, &[json!({ "go": false })]).await;
    let (id, state) = &ended[0];
    assert_eq!(*state, TaskState::Error);
    assert!(setup.calls().is_empty());
    let error = setup.record(id).await.task.error.unwrap();
    assert!(error.starts_with("step after: template refers to `steps.maybe.output`, which is missing"), "{error}");
}

async fn compensation_passes_over_skipped_steps(backend: Backend) {
    let Some(setup) = setup(backend).await else { return };
    setup.agent.fail_permanently.lock().unwrap().push("charge".into());
    let workflow = Workflow::builder("undo", 1)
        .on_exhausted(ExhaustedPolicy::Compensate)
        .step(StepDef::new("reserve", "recorder").compensate(CompensateDef::new("recorder")))
        .step(StepDef::new("insure", "recorder").when("input.insured").compensate(CompensateDef::new("recorder")))
        .step(StepDef::new("charge", "recorder"))
        .build(&catalog())
        .unwrap();
    let ended = run(&setup, workflow, &[json!({ "insured": false })]).await;
    let (id, state) = &ended[0];
    assert_eq!(*state, TaskState::Compensated);
    let calls: Vec<(String, bool)> = setup.calls();
    let expected: Vec<(String, bool)> =
        [("reserve", false), ("charge", false), ("reserve", true)].iter().map(|(s, c)| (s.to_string(), *c)).collect();
    assert_eq!(calls, expected, "a skipped step has nothing to undo");
    let states = setup.states(id).await;
    assert_eq!((states["reserve"], states["insure"], states["charge"]), (StepState::Compensated, StepState::Skipped, StepState::Failed));
}

on_each_backend!(
    a_false_condition_skips_the_step_and_its_dependents_still_run,
    a_true_condition_runs_the_step,
    a_condition_that_cannot_be_decided_fails_the_task,
    a_template_reading_a_skipped_step_fails_the_task,
    compensation_passes_over_skipped_steps,
);
