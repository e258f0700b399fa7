//! `for_each` steps end to end on a real store (each test runs on SQLite
//! and on PostgreSQL): one instance per item, at most `max_parallel` in
//! flight, each retried and compensated on its own, the step's output the
//! instances' outputs in item order, and a list over the Scheduler's bound
//! failing the step.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rota_agent::{Agent, Request, StepError};
use rota_engine::engine::Config;
use rota_engine::{Engine, Shutdown, Submission};
use rota_model::{ExhaustedPolicy, InstanceId, RetryPolicy, StepName, StepState, SystemClock, TaskId, TaskState};
use rota_store::{EventKind, SharedStore, TaskRecord};
use rota_workflow::{AgentCatalog, CompensateDef, StepDef, Workflow};
use serde_json::{Value, json};

use common::{Backend, TestStore};

/// One call the agent received.
#[derive(Debug, Clone)]
struct Call {
    step: String,
    compensate: bool,
    attempt: u32,
    key: String,
    input: Value,
}

/// An agent that records its calls and how many ran at once, fails
/// permanently the items listed, and fails transiently (every try of the
/// agent's own retries) the first attempt of the items listed.
#[derive(Default)]
struct Items {
    calls: Mutex<Vec<Call>>,
    running: Mutex<(usize, usize)>,
    declined: Vec<i64>,
    flaky: Vec<i64>,
}

#[async_trait]
impl Agent for Items {
    fn name(&self) -> &str {
        "items"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        self.calls.lock().unwrap().push(Call {
            step: request.step.to_string(),
            compensate: request.compensate,
            attempt: request.attempt,
            key: request.idempotency_key.clone(),
            input: request.input.clone(),
        });
        {
            let mut running = self.running.lock().unwrap();
            running.0 += 1;
            running.1 = running.1.max(running.0);
        }
        // Long enough for the instances in flight to overlap.
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.running.lock().unwrap().0 -= 1;
        let item = request.input.get("id").and_then(Value::as_i64);
        if !request.compensate && item.is_some_and(|id| self.declined.contains(&id)) {
            return Err(StepError::permanent("declined"));
        }
        if !request.compensate && request.attempt == 1 && item.is_some_and(|id| self.flaky.contains(&id)) {
            return Err(StepError::retryable("busy"));
        }
        Ok(json!({ "step": request.step.as_str(), "input": request.input }))
    }
}

impl Items {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn peak(&self) -> usize {
        self.running.lock().unwrap().1
    }
}

struct Setup {
    _db: TestStore,
    store: SharedStore,
}

fn catalog() -> AgentCatalog {
    AgentCatalog::builtin().with(rota_workflow::AgentName::new("items").unwrap())
}

fn quick() -> RetryPolicy {
    RetryPolicy::new(2, Duration::from_millis(10), Duration::from_millis(50)).unwrap()
}

/// `list` (its output's `input` is the task's `ids`), then `charge` for
/// each id, then `total` reading charge's output.
fn fan_out(max_parallel: u32, policy: ExhaustedPolicy) -> Workflow {
    Workflow::builder("fan", 1)
        .on_exhausted(policy)
        .max_failures(5)
        .step(StepDef::new("list", "items").with_input(json!("{{ input.ids }}")))
        .step(
            StepDef::new("charge", "items")
                .for_each("steps.list.output.input")
                .max_parallel(max_parallel)
                .with_input(json!({ "id": "{{ item }}", "index": "{{ index }}", "note": "item {{ index }} of {{ task.id }}" }))
                .retry(quick())
                .compensate(
                    CompensateDef::new("items")
                        .with_input(json!({ "refund": "{{ item }}", "charged": "{{ steps.charge.output.input.id }}" })),
                ),
        )
        .step(StepDef::new("total", "items").with_input(json!({ "charges": "{{ steps.charge.output }}" })))
        .build(&catalog())
        .unwrap()
}

async fn run(
    backend: Backend,
    workflow: Workflow,
    agent: Items,
    items_max: Option<usize>,
    ids: Vec<i64>,
) -> Option<(Setup, Arc<Items>, TaskId, TaskState)> {
    let db = common::open(backend, Arc::new(SystemClock)).await?;
    let setup = Setup { store: db.store.clone(), _db: db };
    let agent = Arc::new(agent);
    let mut config = Config::new(InstanceId::new("test-1").unwrap());
    config.supervisor.interval = Duration::from_millis(100);
    config.supervisor.leader_ttl = Duration::from_secs(1);
    config.agent_concurrency = 64;
    if let Some(max) = items_max {
        config.scheduler.for_each_items_max = max;
    }
    let name = workflow.name().clone();
    let engine = Engine::new(setup.store.clone(), Arc::new(SystemClock), config).agent(agent.clone()).workflow(workflow);
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    let shutdown = Shutdown::new();
    let running = tokio::spawn(engine.run(shutdown.clone()));
    let submitted = client.submit(Submission::new(name, json!({ "ids": ids }))).await.unwrap();
    let state = client.wait(&submitted.id, Duration::from_secs(30)).await.unwrap();
    shutdown.trigger();
    running.await.unwrap().unwrap();
    Some((setup, agent, submitted.id, state))
}

fn step<'r>(record: &'r TaskRecord, name: &str) -> &'r rota_model::Step {
    record.steps.iter().find(|s| s.name.as_str() == name).unwrap_or_else(|| panic!("no step {name}"))
}

async fn each_item_runs_once_within_max_parallel_and_the_output_keeps_item_order(backend: Backend) {
    let ids: Vec<i64> = (100..112).collect();
    let agent = Items { flaky: vec![103], ..Items::default() };
    let Some((setup, agent, id, state)) = run(backend, fan_out(3, ExhaustedPolicy::Error), agent, None, ids.clone()).await else { return };
    assert_eq!(state, TaskState::Processed);
    assert!(agent.peak() <= 3, "at most max_parallel instances were in flight at once, saw {}", agent.peak());

    let calls = agent.calls();
    let mut keys: HashMap<String, String> = HashMap::new();
    for call in calls.iter().filter(|c| c.step.starts_with("charge[")) {
        assert!(!call.compensate);
        let key = keys.entry(call.step.clone()).or_insert_with(|| call.key.clone());
        assert_eq!(key, &call.key, "every attempt of an instance carries its idempotency key");
    }
    assert_eq!(keys.len(), ids.len(), "one instance per item: {keys:?}");
    let distinct: std::collections::HashSet<&String> = keys.values().collect();
    assert_eq!(distinct.len(), ids.len(), "each item has its own idempotency key");
    assert_eq!(keys["charge[3]"], format!("{id}/charge[3]"));
    let attempts = |name: &str| calls.iter().filter(|c| c.step == name).map(|c| c.attempt).max();
    assert_eq!(attempts("charge[3]"), Some(2), "the flaky item was retried as a new attempt of its own");
    assert_eq!(attempts("charge[4]"), Some(1), "the other items were not");
    let third = calls.iter().find(|c| c.step == "charge[3]").unwrap();
    assert_eq!(third.input, json!({ "id": 103, "index": 3, "note": format!("item 3 of {id}") }), "item and index render");

    let record = setup.store.task(&id).await.unwrap().unwrap();
    let charge = step(&record, "charge");
    assert_eq!(charge.state, StepState::Completed);
    let outputs = charge.output.clone().unwrap();
    let charged: Vec<Value> = outputs.as_array().unwrap().iter().map(|o| o["input"]["id"].clone()).collect();
    assert_eq!(charged, ids.iter().map(|i| json!(i)).collect::<Vec<_>>(), "the outputs, in item order");
    for index in 0..ids.len() {
        let instance = step(&record, &format!("charge[{index}]"));
        assert_eq!(instance.state, StepState::Completed);
        assert_eq!(instance.attempt, if index == 3 { 2 } else { 1 });
    }
    let output = record.task.output.unwrap();
    assert_eq!(output["total"]["input"]["charges"], outputs, "a later step reads the list");
    assert!(output.get("charge[0]").is_none(), "instances are not in the task's output: {output}");
    let history = setup.store.history(&id).await.unwrap();
    let started: Vec<&str> =
        history.iter().filter(|e| e.kind == EventKind::StepStarted).filter_map(|e| e.step.as_ref().map(StepName::as_str)).collect();
    assert_eq!(started.iter().filter(|s| s.starts_with("charge[")).count(), ids.len() + 1, "each instance's attempts are in the history");
}

async fn a_failed_item_compensates_the_completed_items_in_reverse(backend: Backend) {
    let agent = Items { declined: vec![4], ..Items::default() };
    let ids = vec![0, 1, 2, 3, 4, 5, 6];
    let Some((setup, agent, id, state)) = run(backend, fan_out(1, ExhaustedPolicy::Compensate), agent, None, ids).await else { return };
    assert_eq!(state, TaskState::Compensated);
    let calls = agent.calls();
    let forward: Vec<&str> = calls.iter().filter(|c| !c.compensate).map(|c| c.step.as_str()).collect();
    assert_eq!(forward, ["list", "charge[0]", "charge[1]", "charge[2]", "charge[3]", "charge[4]"], "one at a time, none after the failure");
    let undone: Vec<(&str, &Value)> = calls.iter().filter(|c| c.compensate).map(|c| (c.step.as_str(), &c.input)).collect();
    let expected: Vec<(String, Value)> = (0..4).rev().map(|i| (format!("charge[{i}]"), json!({ "refund": i, "charged": i }))).collect();
    assert_eq!(
        undone.iter().map(|(s, v)| ((*s).to_owned(), (*v).clone())).collect::<Vec<_>>(),
        expected,
        "each completed item undone, the last first, with its own item and output"
    );
    let record = setup.store.task(&id).await.unwrap().unwrap();
    assert_eq!(step(&record, "charge").state, StepState::Failed, "the step stopped at the failed item");
    assert_eq!(step(&record, "charge[4]").state, StepState::Failed);
    for index in 0..4 {
        assert_eq!(step(&record, &format!("charge[{index}]")).state, StepState::Compensated);
    }
    assert!(record.steps.iter().all(|s| s.name.as_str() != "charge[5]"), "an item after the failure never started");
}

async fn a_list_over_the_bound_fails_the_step_and_starts_nothing(backend: Backend) {
    let Some((setup, agent, id, state)) =
        run(backend, fan_out(2, ExhaustedPolicy::Error), Items::default(), Some(5), vec![1, 2, 3, 4, 5, 6]).await
    else {
        return;
    };
    assert_eq!(state, TaskState::Error);
    let record = setup.store.task(&id).await.unwrap().unwrap();
    let error = record.task.error.clone().unwrap();
    assert!(error.contains("step charge: `for_each` gave 6 items, over the limit of 5"), "{error}");
    assert!(agent.calls().iter().all(|c| c.step == "list"), "no instance started");
    assert!(record.steps.iter().all(|s| !s.name.is_instance()));
}

async fn an_empty_list_completes_the_step_with_an_empty_output(backend: Backend) {
    let Some((setup, _agent, id, state)) = run(backend, fan_out(2, ExhaustedPolicy::Error), Items::default(), None, Vec::new()).await
    else {
        return;
    };
    assert_eq!(state, TaskState::Processed);
    let record = setup.store.task(&id).await.unwrap().unwrap();
    assert_eq!(step(&record, "charge").output, Some(json!([])));
    assert_eq!(record.task.output.unwrap()["total"]["input"]["charges"], json!([]));
}

on_each_backend!(
    each_item_runs_once_within_max_parallel_and_the_output_keeps_item_order,
    a_failed_item_compensates_the_completed_items_in_reverse,
    a_list_over_the_bound_fails_the_step_and_starts_nothing,
    an_empty_list_completes_the_step_with_an_empty_output,
);
