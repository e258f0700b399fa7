//! Response queues end to end, on a real store (each test runs on SQLite
//! and on PostgreSQL): tasks submitted with a reply queue run while nobody
//! reads it, then the queue holds one message per status event of every
//! task, in the task's history order, whatever way the task ended.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rota_agent::{Agent, Request, StepError};
use rota_engine::engine::Config;
use rota_engine::replies::{StatusMessage, is_status};
use rota_engine::{Engine, Error, Shutdown, Start, Submission};
use rota_model::{ExhaustedPolicy, InstanceId, QueueName, RetryPolicy, SystemClock, TaskId, TaskState, WorkflowName};
use rota_store::SharedStore;
use rota_workflow::{AgentCatalog, CompensateDef, StepDef, Workflow};
use serde_json::{Value, json};

use common::Backend;

/// Fails, for good, the steps named in the task's input `fail`.
#[derive(Default)]
struct Picky {
    calls: Mutex<u32>,
}

#[async_trait]
impl Agent for Picky {
    fn name(&self) -> &str {
        "picky"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        *self.calls.lock().unwrap() += 1;
        if !request.compensate && request.input["fail"].as_str() == Some(request.step.as_str()) {
            return Err(StepError::permanent("declined"));
        }
        Ok(json!({ "step": request.step.as_str() }))
    }
}

fn workflow(name: &str, policy: ExhaustedPolicy) -> Workflow {
    let quick = RetryPolicy::new(2, Duration::from_millis(10), Duration::from_millis(50)).unwrap();
    let catalog = AgentCatalog::builtin().with(rota_workflow::AgentName::new("picky").unwrap());
    let step = |name: &str| StepDef::new(name, "picky").with_input(json!({ "fail": "{{ input.fail }}" })).retry(quick.clone());
    Workflow::builder(name, 1)
        .on_exhausted(policy)
        .step(step("reserve").compensate(CompensateDef::new("picky")))
        .step(step("charge"))
        .build(&catalog)
        .unwrap()
}

fn replies() -> QueueName {
    QueueName::new("shop.replies").unwrap()
}

/// The status events of `id`'s history, as (kind, step, attempt, detail).
async fn status_history(store: &SharedStore, id: &TaskId) -> Vec<(String, Option<String>, Option<u32>, Value)> {
    let history = store.history(id).await.unwrap();
    history
        .into_iter()
        .filter(|e| is_status(e.kind))
        .map(|e| (e.kind.as_str().to_owned(), e.step.map(|s| s.to_string()), e.attempt, e.detail))
        .collect()
}

async fn every_status_event_waits_in_the_reply_queue_in_order(backend: Backend) {
    let Some(db) = common::open(backend, Arc::new(SystemClock)).await else { return };
    let store = db.store.clone();
    let mut config = Config::new(InstanceId::new("test-1").unwrap());
    config.supervisor.interval = Duration::from_millis(100);
    config.supervisor.leader_ttl = Duration::from_secs(1);
    let engine = Engine::new(store.clone(), Arc::new(SystemClock), config)
        .agent(Arc::new(Picky::default()))
        .workflow(workflow("plain", ExhaustedPolicy::Error))
        .workflow(workflow("undo", ExhaustedPolicy::Compensate));
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    let submit = |id: &str, workflow: &str, fail: &str| {
        Submission::new(WorkflowName::new(workflow).unwrap(), json!({ "fail": fail }))
            .with_id(TaskId::new(id).unwrap())
            .with_reply_queue(replies())
    };
    let ends = [
        ("ok-1", "plain", "", TaskState::Processed),
        ("ok-2", "plain", "", TaskState::Processed),
        ("failed", "plain", "charge", TaskState::Error),
        ("undone", "undo", "charge", TaskState::Compensated),
    ];
    for (id, workflow, fail, _) in ends {
        client.submit(submit(id, workflow, fail)).await.unwrap();
    }
    // Cancelled by an operator before it starts.
    let later = submit("cancelled", "plain", "").with_start(Start::After(Duration::from_secs(3600)));
    client.submit(later).await.unwrap();
    assert_eq!(
        client.cancel(&TaskId::new("cancelled").unwrap(), rota_engine::ops::Operator { by: "test", reason: None }).await.unwrap(),
        TaskState::Cancelled
    );
    // A task without a reply queue sends nothing anywhere.
    client.submit(Submission::new(WorkflowName::new("plain").unwrap(), json!({ "fail": "" }))).await.unwrap();

    let shutdown = Shutdown::new();
    let running = tokio::spawn(engine.run(shutdown.clone()));
    for (id, _, _, end) in ends {
        assert_eq!(client.wait(&TaskId::new(id).unwrap(), Duration::from_secs(20)).await.unwrap(), end, "{id}");
    }
    shutdown.trigger();
    running.await.unwrap().unwrap();

    // Read only now, as an application that was down all along.
    let messages = common::drain_status(&store, &replies()).await;
    let mut per_task: BTreeMap<String, Vec<StatusMessage>> = BTreeMap::new();
    for message in messages {
        per_task.entry(message.correlation_id.to_string()).or_default().push(message);
    }
    let ids: Vec<&str> = per_task.keys().map(String::as_str).collect();
    assert_eq!(ids, ["cancelled", "failed", "ok-1", "ok-2", "undone"], "one correlation id per task with a reply queue");
    for (id, messages) in &per_task {
        let task = TaskId::new(id.as_str()).unwrap();
        let got: Vec<_> = messages.iter().map(|m| (m.event.clone(), m.step.clone(), m.attempt, m.detail.clone())).collect();
        assert_eq!(got, status_history(&store, &task).await, "{id}: one message per status event, in history order");
        let last = messages.last().unwrap();
        let record = store.task(&task).await.unwrap().unwrap();
        assert_eq!(last.state, record.task.state, "{id}: the last message tells the end");
    }
    let kinds = |id: &str| per_task[id].iter().map(|m| m.event.as_str()).collect::<Vec<_>>();
    assert_eq!(kinds("ok-1"), ["received", "step_completed", "step_completed", "processed"]);
    assert_eq!(per_task["ok-1"][3].output, Some(json!({ "reserve": { "step": "reserve" }, "charge": { "step": "charge" } })));
    assert_eq!(kinds("failed"), ["received", "step_completed", "error"]);
    assert!(per_task["failed"][2].error.as_deref().is_some_and(|e| e.contains("declined")), "{:?}", per_task["failed"][2]);
    assert_eq!(kinds("undone"), ["received", "step_completed", "compensated"]);
    assert_eq!(kinds("cancelled"), ["received", "cancelled"]);
    assert_eq!(per_task["cancelled"][0].state, TaskState::Pending, "the state once the event's commit applied");
}

async fn an_engine_queue_is_refused_as_a_reply_queue(backend: Backend) {
    let Some(db) = common::open(backend, Arc::new(SystemClock)).await else { return };
    let engine = Engine::new(db.store.clone(), Arc::new(SystemClock), Config::new(InstanceId::new("test-1").unwrap()))
        .agent(Arc::new(Picky::default()))
        .workflow(workflow("plain", ExhaustedPolicy::Error));
    engine.register_workflows().await.unwrap();
    let submission =
        Submission::new(WorkflowName::new("plain").unwrap(), json!({})).with_reply_queue(QueueName::new("rota.tasks").unwrap());
    let err = engine.client().submit(submission).await.unwrap_err();
    assert!(matches!(err, Error::InvalidSubmission { field: "reply_queue", .. }), "{err:?}");
    assert!(err.to_string().starts_with("reply_queue: "), "{err}");
    assert!(db.store.list_tasks(&Default::default()).await.unwrap().is_empty(), "nothing was written");
}

on_each_backend!(every_status_event_waits_in_the_reply_queue_in_order, an_engine_queue_is_refused_as_a_reply_queue);
