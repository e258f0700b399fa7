//! Waiting steps and signals end to end, on each backend: a signal
//! completes the step that waits for it (sent while it waits, or before the
//! task reaches it), later steps' templates read its data, a wait that gets
//! no signal fails like a timed-out step, and a signal no step can take is
//! refused without changing anything.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rota_agent::{Agent, Request, StepError};
use rota_engine::engine::Config;
use rota_engine::signal::{DATA_BYTES_MAX, Delivered, Refusal};
use rota_engine::{Client, Engine, Shutdown, Submission, ops};
use rota_model::{ExhaustedPolicy, InstanceId, RetryPolicy, SignalName, StepName, StepState, SystemClock, TaskId, TaskState, WorkflowName};
use rota_store::{EventKind, SharedStore};
use rota_workflow::{AgentCatalog, CompensateDef, StepDef, Workflow};
use serde_json::{Value, json};

use common::{Backend, TestStore};

/// An agent that records every call: (step, compensate, input).
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<(String, bool, Value)>>,
}

#[async_trait]
impl Agent for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        self.calls.lock().unwrap().push((request.step.to_string(), request.compensate, request.input.clone()));
        Ok(json!({ "step": request.step.as_str() }))
    }
}

/// reserve → wait for `approved` → charge, whose input names the approver.
fn approval(wait: Duration) -> Workflow {
    let catalog = AgentCatalog::builtin().with(rota_workflow::AgentName::new("recorder").unwrap());
    let quick = RetryPolicy::new(1, Duration::from_millis(10), Duration::from_millis(10)).unwrap();
    Workflow::builder("approval", 1)
        .max_failures(1)
        .on_exhausted(ExhaustedPolicy::Compensate)
        .step(StepDef::new("reserve", "recorder").retry(quick.clone()).compensate(CompensateDef::new("recorder")))
        .step(StepDef::wait("approval", "approved").timeout(wait))
        .step(StepDef::new("charge", "recorder").retry(quick).with_input(json!({ "approved_by": "{{ steps.approval.output.by }}" })))
        .build(&catalog)
        .unwrap()
}

struct Setup {
    _db: TestStore,
    store: SharedStore,
    agent: Arc<Recorder>,
    engine: Option<Engine>,
    client: Client,
}

async fn setup(backend: Backend, wait: Duration) -> Option<Setup> {
    let db = common::open(backend, Arc::new(SystemClock)).await?;
    let store = db.store.clone();
    let agent = Arc::new(Recorder::default());
    let mut config = Config::new(InstanceId::new("test-1").unwrap());
    config.supervisor.interval = Duration::from_millis(50);
    config.supervisor.leader_ttl = Duration::from_secs(1);
    let engine = Engine::new(store.clone(), Arc::new(SystemClock), config).agent(agent.clone()).workflow(approval(wait));
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    Some(Setup { _db: db, store, agent, engine: Some(engine), client })
}

impl Setup {
    fn run(&mut self) -> (Shutdown, tokio::task::JoinHandle<rota_engine::Result<()>>) {
        let shutdown = Shutdown::new();
        let engine = self.engine.take().expect("run once");
        (shutdown.clone(), tokio::spawn(engine.run(shutdown)))
    }

    async fn submit(&self, id: &str) -> TaskId {
        let submission = Submission::new(WorkflowName::new("approval").unwrap(), json!({})).with_id(TaskId::new(id).unwrap());
        self.client.submit(submission).await.unwrap().id
    }

    async fn step_state(&self, id: &TaskId, step: &str) -> StepState {
        let record = self.store.task(id).await.unwrap().unwrap();
        record.steps.iter().find(|s| s.name.as_str() == step).unwrap().state
    }

    async fn wait_for_step(&self, id: &TaskId, step: &str, state: StepState) {
        for _ in 0..400 {
            if self.step_state(id, step).await == state {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("step {step} of task {id} never reached {state:?}");
    }

    async fn kinds(&self, id: &TaskId) -> Vec<(EventKind, Option<String>)> {
        let history = self.store.history(id).await.unwrap();
        history.into_iter().map(|e| (e.kind, e.step.map(|s| s.to_string()))).collect()
    }
}

fn approved() -> SignalName {
    SignalName::new("approved").unwrap()
}

fn event(kind: EventKind, step: &str) -> (EventKind, Option<String>) {
    (kind, Some(step.to_owned()))
}

async fn a_signal_completes_the_waiting_step_and_later_steps_read_its_data(backend: Backend) {
    let Some(mut setup) = setup(backend, Duration::from_secs(60)).await else { return };
    let (shutdown, running) = setup.run();
    let id = setup.submit("signalled-while-waiting").await;
    setup.wait_for_step(&id, "approval", StepState::Running).await;
    assert_eq!(setup.step_state(&id, "charge").await, StepState::NotStarted, "nothing runs past a waiting step");

    let delivered = setup.client.signal(&id, &approved(), json!({ "by": "ann" }), "cli, user ann").await.unwrap();
    assert_eq!(delivered, Delivered { step: StepName::new("approval").unwrap(), completed: true });
    assert_eq!(setup.client.wait(&id, Duration::from_secs(20)).await.unwrap(), TaskState::Processed);
    shutdown.trigger();
    running.await.unwrap().unwrap();

    let record = setup.store.task(&id).await.unwrap().unwrap();
    let step = |name: &str| record.steps.iter().find(|s| s.name.as_str() == name).unwrap().clone();
    assert_eq!(step("approval").output, Some(json!({ "by": "ann" })), "the signal's data is the step's output");
    assert_eq!(step("approval").input.unwrap()["sent_by"], json!("cli, user ann"));
    let charged: Vec<Value> = setup.agent.calls.lock().unwrap().iter().filter(|c| c.0 == "charge").map(|c| c.2.clone()).collect();
    assert_eq!(charged, [json!({ "approved_by": "ann" })], "the next step's template used the signal");

    let history = setup.store.history(&id).await.unwrap();
    let signal = history.iter().find(|e| e.kind == EventKind::Signal).expect("the signal is in the history");
    assert_eq!(signal.step.as_ref().map(StepName::as_str), Some("approval"));
    assert_eq!(signal.detail["sent_by"], json!("cli, user ann"), "with who sent it");
    assert_eq!(signal.detail["signal"], json!("approved"));
    let kinds = setup.kinds(&id).await;
    let at = |wanted: &(EventKind, Option<String>)| kinds.iter().position(|k| k == wanted).unwrap();
    assert!(at(&event(EventKind::StepStarted, "approval")) < at(&event(EventKind::Signal, "approval")));
    assert!(at(&event(EventKind::Signal, "approval")) < at(&event(EventKind::StepCompleted, "approval")));
    assert!(at(&event(EventKind::StepCompleted, "approval")) < at(&event(EventKind::StepStarted, "charge")));
}

async fn a_signal_sent_before_the_step_is_kept_until_the_task_reaches_it(backend: Backend) {
    let Some(mut setup) = setup(backend, Duration::from_secs(60)).await else { return };
    // Submitted while no Scheduler runs: the task is Pending.
    let id = setup.submit("signalled-early").await;
    let delivered = setup.client.signal(&id, &approved(), json!({ "by": "bob" }), "api").await.unwrap();
    assert!(!delivered.completed, "kept, not completed: the task has not reached the step");
    let record = setup.store.task(&id).await.unwrap().unwrap();
    assert_eq!(record.task.state, TaskState::Pending);
    let approval = record.steps.iter().find(|s| s.name.as_str() == "approval").unwrap();
    assert_eq!((approval.state, approval.input.as_ref().map(|i| i["data"].clone())), (StepState::NotStarted, Some(json!({ "by": "bob" }))));

    let (shutdown, running) = setup.run();
    assert_eq!(setup.client.wait(&id, Duration::from_secs(20)).await.unwrap(), TaskState::Processed);
    shutdown.trigger();
    running.await.unwrap().unwrap();
    let charged: Vec<Value> = setup.agent.calls.lock().unwrap().iter().filter(|c| c.0 == "charge").map(|c| c.2.clone()).collect();
    assert_eq!(charged, [json!({ "approved_by": "bob" })]);
    let kinds = setup.kinds(&id).await;
    let signal = kinds.iter().position(|k| *k == event(EventKind::Signal, "approval")).unwrap();
    let started = kinds.iter().position(|k| *k == event(EventKind::StepStarted, "approval")).unwrap();
    assert!(signal < started, "kept from before the step started: {kinds:?}");
    assert_eq!(kinds[started + 1], event(EventKind::StepCompleted, "approval"), "and consumed as it started");
}

async fn a_wait_without_its_signal_fails_and_the_task_is_compensated(backend: Backend) {
    let Some(mut setup) = setup(backend, Duration::from_millis(300)).await else { return };
    let (shutdown, running) = setup.run();
    let id = setup.submit("never-approved").await;
    assert_eq!(setup.client.wait(&id, Duration::from_secs(20)).await.unwrap(), TaskState::Compensated);
    shutdown.trigger();
    running.await.unwrap().unwrap();

    let calls: Vec<(String, bool)> = setup.agent.calls.lock().unwrap().iter().map(|c| (c.0.clone(), c.1)).collect();
    assert_eq!(calls, [("reserve".to_owned(), false), ("reserve".to_owned(), true)], "reserved, never charged, released");
    let history = setup.store.history(&id).await.unwrap();
    let failed = history.iter().find(|e| e.kind == EventKind::StepFailed && e.step.as_ref().is_some_and(|s| s.as_str() == "approval"));
    let error = failed.expect("the wait failed").detail["error"].as_str().unwrap().to_owned();
    assert_eq!(error, "step approval attempt 1 received no signal `approved` before its complete-by");
    assert_eq!(setup.step_state(&id, "approval").await, StepState::Failed);

    // Finished: a signal now is refused and changes nothing.
    let before = setup.store.history(&id).await.unwrap().len();
    let err = setup.client.signal(&id, &approved(), json!({ "by": "late" }), "api").await.unwrap_err();
    assert_eq!(err.to_string(), "signal approved: task never-approved is compensated: it takes no more signals");
    assert_eq!(setup.store.history(&id).await.unwrap().len(), before);
}

async fn signals_no_step_can_take_are_refused_and_change_nothing(backend: Backend) {
    let Some(setup) = setup(backend, Duration::from_secs(60)).await else { return };
    let id = setup.submit("refusals").await;
    let before = setup.store.task(&id).await.unwrap().unwrap();
    let history = setup.store.history(&id).await.unwrap().len();

    let err = setup.client.signal(&TaskId::new("nobody").unwrap(), &approved(), json!(null), "api").await.unwrap_err();
    assert!(matches!(err, ops::Error::TaskNotFound(_)), "{err}");
    let err = setup.client.signal(&id, &SignalName::new("rejected").unwrap(), json!(null), "api").await.unwrap_err();
    assert_eq!(err.to_string(), "signal rejected: no step of task refusals (workflow approval@1) waits for it (it waits for: approved)");
    assert!(matches!(err, ops::Error::Signal { why: Refusal::NotAwaited { .. }, .. }));
    let big = json!("x".repeat(DATA_BYTES_MAX));
    let err = setup.client.signal(&id, &approved(), big, "api").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("signal approved: its data is {} bytes of JSON, more than the {DATA_BYTES_MAX} accepted", DATA_BYTES_MAX + 2)
    );
    assert_eq!(setup.store.task(&id).await.unwrap().unwrap(), before, "nothing changed");
    assert_eq!(setup.store.history(&id).await.unwrap().len(), history);

    // The first is kept; a second of the same name is refused.
    setup.client.signal(&id, &approved(), json!({ "by": "ann" }), "api").await.unwrap();
    let kept = setup.store.task(&id).await.unwrap().unwrap();
    let err = setup.client.signal(&id, &approved(), json!({ "by": "eve" }), "api").await.unwrap_err();
    assert_eq!(err.to_string(), "signal approved: step approval of task refusals has already received it");
    assert_eq!(setup.store.task(&id).await.unwrap().unwrap(), kept, "the first signal stands");

    // Cancelled (nothing ran, so nothing to undo): finished.
    setup.client.cancel(&id, rota_engine::ops::Operator { by: "test", reason: None }).await.unwrap();
    let err = setup.client.signal(&id, &approved(), json!(null), "api").await.unwrap_err();
    assert_eq!(err.to_string(), "signal approved: task refusals is cancelled: it takes no more signals");
}

on_each_backend!(
    a_signal_completes_the_waiting_step_and_later_steps_read_its_data,
    a_signal_sent_before_the_step_is_kept_until_the_task_reaches_it,
    a_wait_without_its_signal_fails_and_the_task_is_compensated,
    signals_no_step_can_take_are_refused_and_change_nothing,
);
