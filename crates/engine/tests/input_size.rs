//! Inputs of the maximum size, end to end on a real store (each test runs
//! on SQLite and on PostgreSQL): an input over the client's bound is
//! refused at submission, naming the bound; an input under it whose
//! rendered step request outgrows what a message may carry fails its step
//! for good, with an error that says so, instead of failing the
//! Scheduler's commit until the task's failure threshold.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rota_agent::{Agent, Request, StepError};
use rota_engine::engine::Config;
use rota_engine::plan::REQUEST_BYTES_MAX;
use rota_engine::{Engine, Error, Roles, Shutdown, Submission};
use rota_model::{ExhaustedPolicy, InstanceId, RetryPolicy, SystemClock, TaskId, TaskState, WorkflowName};
use rota_store::EventKind;
use rota_workflow::{AgentCatalog, AgentName, StepDef, Workflow};
use serde_json::{Value, json};

use common::Backend;

/// An agent that answers at once with the size of what it was given.
struct Echo;

#[rota_engine::async_trait]
impl Agent for Echo {
    fn name(&self) -> &str {
        "echo"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        Ok(json!({ "bytes": request.input.to_string().len() }))
    }
}

/// One step whose request carries the input's `blob` `copies` times.
fn workflow(name: &str, copies: usize) -> Workflow {
    let with: serde_json::Map<String, Value> = (0..copies).map(|i| (format!("copy{i}"), json!("{{ input.blob }}"))).collect();
    let once = RetryPolicy::new(1, Duration::from_millis(10), Duration::from_millis(10)).unwrap();
    Workflow::builder(name, 1)
        .deadline(Duration::from_secs(30))
        .max_failures(3)
        .on_exhausted(ExhaustedPolicy::Error)
        .step(StepDef::new("work", "echo").with_input(Value::Object(with)).timeout(Duration::from_secs(5)).retry(once))
        .build(&AgentCatalog::builtin().with(AgentName::new("echo").unwrap()))
        .unwrap()
}

fn config() -> Config {
    let quick = RetryPolicy::new(100, Duration::from_millis(50), Duration::from_millis(100)).unwrap();
    let mut config = Config::new(InstanceId::new("solo").unwrap());
    config.roles = Roles::ALL;
    config.scheduler.recovery = quick.clone();
    config.scheduler.claim_wait = Duration::from_millis(100);
    config.supervisor.recovery = quick;
    config.supervisor.interval = Duration::from_millis(50);
    config.supervisor.leader_ttl = Duration::from_millis(500);
    config
}

/// An input of exactly `bytes` bytes of JSON: `{"blob":"xxx…"}`.
fn input_of(bytes: usize) -> Value {
    let overhead = json!({ "blob": "" }).to_string().len();
    let input = json!({ "blob": "x".repeat(bytes - overhead) });
    assert_eq!(input.to_string().len(), bytes);
    input
}

async fn an_input_over_the_bound_is_refused_at_submission_naming_it(backend: Backend) {
    let Some(db) = common::open(backend, Arc::new(SystemClock)).await else { return };
    let mut config = config();
    config.roles = Roles { scheduler: false, agents: false, supervisor: false };
    config.input_bytes_max = 10_000;
    let engine = Engine::new(db.store.clone(), Arc::new(SystemClock), config).workflow(workflow("small", 1));
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    let name = WorkflowName::new("small").unwrap();

    let refused = client.submit(Submission::new(name.clone(), input_of(10_001)).with_id(TaskId::new("too-big").unwrap())).await;
    match refused {
        Err(Error::InvalidSubmission { field: "input", why }) => {
            assert!(why.contains("10001 bytes") && why.contains("limit of 10000 bytes (input_bytes_max)"), "{why}");
        }
        other => panic!("expected the input to be refused, got {other:?}"),
    }
    assert!(db.store.task(&TaskId::new("too-big").unwrap()).await.unwrap().is_none(), "nothing was written");
    let fits = client.submit(Submission::new(name, input_of(10_000)).with_id(TaskId::new("fits").unwrap())).await.unwrap();
    assert!(fits.created, "an input of exactly the bound is taken");

    let mut bad = self::config();
    bad.input_bytes_max = REQUEST_BYTES_MAX + 1;
    match bad.validate() {
        Err(Error::OutOfBounds { field: "input_bytes_max", why }) => assert!(why.contains("262144"), "{why}"),
        other => panic!("a bound past a request's limit is refused: {other:?}"),
    }
}

async fn a_rendered_request_over_a_messages_limit_fails_its_step_for_good(backend: Backend) {
    let Some(db) = common::open(backend, Arc::new(SystemClock)).await else { return };
    let store = db.store.clone();
    // Three copies of a 100 KB input: under the submission bound, over a request's limit.
    let engine = Engine::new(store.clone(), Arc::new(SystemClock), config())
        .agent(Arc::new(Echo))
        .workflow(workflow("triple", 3))
        .workflow(workflow("single", 1));
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    let shutdown = Shutdown::new();
    let running = tokio::spawn(engine.run(shutdown.clone()));

    let input = input_of(100_000);
    let triple = WorkflowName::new("triple").unwrap();
    let single = WorkflowName::new("single").unwrap();
    let oversized = client.submit(Submission::new(triple, input.clone()).with_id(TaskId::new("oversized").unwrap())).await.unwrap().id;
    let fine = client.submit(Submission::new(single, input).with_id(TaskId::new("fine").unwrap())).await.unwrap().id;
    assert_eq!(client.wait(&fine, Duration::from_secs(20)).await.unwrap(), TaskState::Processed, "one copy fits");
    assert_eq!(client.wait(&oversized, Duration::from_secs(20)).await.unwrap(), TaskState::Error);
    shutdown.trigger();
    running.await.unwrap().unwrap();

    let record = store.task(&oversized).await.unwrap().unwrap();
    let error = record.task.error.clone().unwrap_or_default();
    assert!(
        error.contains("step work: its request is") && error.contains(&format!("over the limit of {REQUEST_BYTES_MAX} bytes")),
        "{error}"
    );
    assert_eq!(record.task.failure_count, 0, "no commit failed and no lease ran out: {:?}", record.task);
    assert_eq!(record.steps[0].attempt, 0, "no attempt was recorded: {:?}", record.steps[0]);
    let history = store.history(&oversized).await.unwrap();
    let failed: Vec<_> = history.iter().filter(|e| e.kind == EventKind::StepFailed).collect();
    assert_eq!(failed.len(), 1, "{history:?}");
    assert_eq!(failed[0].detail["retryable"], json!(false));
    assert!(!history.iter().any(|e| e.kind == EventKind::StepStarted), "{history:?}");
}

on_each_backend!(
    an_input_over_the_bound_is_refused_at_submission_naming_it,
    a_rendered_request_over_a_messages_limit_fails_its_step_for_good
);
