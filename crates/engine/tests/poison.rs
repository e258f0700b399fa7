//! Poison messages on an agent's queue, end to end on a real store (each
//! test runs on SQLite and on PostgreSQL) in real time: a step request
//! that makes its agent panic at every delivery, and a message that is no
//! step request at all. Each is dead-lettered (after the queue's delivery
//! bound, or at once), the poisoned task ends as its workflow says, and the
//! other tasks are not held up.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rota_agent::{Agent, Request, StepError};
use rota_engine::engine::Config;
use rota_engine::{Engine, Roles, Shutdown, Submission};
use rota_model::{ExhaustedPolicy, InstanceId, MessageId, QueueName, RetryPolicy, SystemClock, TaskId, TaskState, WorkflowName};
use rota_store::{Outgoing, QueueConfig};
use rota_workflow::{AgentCatalog, AgentName, StepDef, Workflow};
use serde_json::{Value, json};

use common::Backend;

/// The agent queue's delivery bound (a queue's default).
fn deliveries_max() -> u32 {
    QueueConfig::default().deliveries_max
}
/// The step's timeout: every delivery of a poisoned request up to the
/// bound fits in it on a loaded machine (an agent goes silent past it).
const STEP_TIMEOUT: Duration = Duration::from_secs(3);
/// How many healthy tasks run beside the poisoned one.
const HEALTHY: usize = 5;

/// An agent that panics on every request of a task whose id starts with
/// `poison`, and answers the others at once. It counts its calls per task
/// and attempt.
#[derive(Default)]
struct Fragile {
    calls: Mutex<BTreeMap<(String, u32), u32>>,
}

#[rota_engine::async_trait]
impl Agent for Fragile {
    fn name(&self) -> &str {
        "fragile"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        *self.calls.lock().unwrap().entry((request.task_id.to_string(), request.attempt)).or_default() += 1;
        if request.task_id.as_str().starts_with("poison") {
            panic!("the agent cannot handle task {}", request.task_id);
        }
        Ok(json!({ "ok": true }))
    }
}

fn workflow() -> Workflow {
    let once = RetryPolicy::new(1, Duration::from_millis(10), Duration::from_millis(10)).unwrap();
    Workflow::builder("fragile", 1)
        .deadline(Duration::from_secs(60))
        .max_failures(2)
        .on_exhausted(ExhaustedPolicy::Error)
        .step(StepDef::new("work", "fragile").timeout(STEP_TIMEOUT).retry(once))
        .build(&AgentCatalog::builtin().with(AgentName::new("fragile").unwrap()))
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

async fn a_request_that_panics_its_agent_is_dead_lettered_and_its_task_ends(backend: Backend) {
    let Some(db) = common::open(backend, Arc::new(SystemClock)).await else { return };
    let store = db.store.clone();
    let agent = Arc::new(Fragile::default());
    let engine = Engine::new(store.clone(), Arc::new(SystemClock), config()).agent(agent.clone()).workflow(workflow());
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    let shutdown = Shutdown::new();
    let running = tokio::spawn(engine.run(shutdown.clone()));

    // A message on the agent's queue that is no step request at all.
    let queue = QueueName::new("agent.fragile").unwrap();
    store
        .send(&queue, Outgoing::json(&json!({ "not": "a step request" })).unwrap().with_id(MessageId::new("garbage").unwrap()))
        .await
        .unwrap();
    let name = WorkflowName::new("fragile").unwrap();
    let poisoned = client.submit(Submission::new(name.clone(), json!({})).with_id(TaskId::new("poison-1").unwrap())).await.unwrap().id;
    let mut healthy = Vec::new();
    for i in 0..HEALTHY {
        let id = TaskId::new(format!("healthy-{i}")).unwrap();
        healthy.push(client.submit(Submission::new(name.clone(), json!({})).with_id(id)).await.unwrap().id);
    }
    for id in &healthy {
        assert_eq!(client.wait(id, Duration::from_secs(20)).await.unwrap(), TaskState::Processed, "{id} is not held up");
    }
    assert_eq!(client.wait(&poisoned, Duration::from_secs(30)).await.unwrap(), TaskState::Error, "the poisoned task ends");
    shutdown.trigger();
    running.await.unwrap().unwrap();

    let record = store.task(&poisoned).await.unwrap().unwrap();
    assert_eq!(record.task.failure_count, 2, "{:?}", record.task);
    assert!(record.task.error.as_deref().unwrap_or_default().contains("failure 2 of 2"), "{:?}", record.task.error);
    // Each attempt's request was delivered up to the bound, then dead-lettered.
    let calls = agent.calls.lock().unwrap().clone();
    for attempt in 1..=2 {
        assert_eq!(calls.get(&("poison-1".to_owned(), attempt)), Some(&deliveries_max()), "attempt {attempt}: {calls:?}");
    }
    let letters = store.dead_letters(&queue, 10).await.unwrap();
    let garbage: Vec<_> = letters.iter().filter(|l| l.id.as_str() == "garbage").collect();
    assert_eq!(garbage.len(), 1, "{letters:?}");
    assert_eq!(garbage[0].delivery_count, 1, "dead-lettered at its first delivery");
    assert!(garbage[0].reason.contains("not a step request"), "{}", garbage[0].reason);
    let poison: Vec<_> = letters.iter().filter(|l| l.id.as_str() != "garbage").collect();
    assert_eq!(poison.len(), 2, "one dead letter per attempt: {letters:?}");
    assert!(poison.iter().all(|l| l.delivery_count == deliveries_max()), "{poison:?}");
    for id in &healthy {
        assert_eq!(calls.get(&(id.to_string(), 1)), Some(&1), "{id} ran once: {calls:?}");
    }
}

on_each_backend!(a_request_that_panics_its_agent_is_dead_lettered_and_its_task_ends);
