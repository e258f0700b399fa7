//! Priorities end to end: a submission without one takes its workflow's
//! (`priority:`), one with its own keeps it, and a Scheduler claims the
//! highest first while its oldest share (`claim_oldest_every`) takes the
//! oldest waiting task whatever its priority, on either backend.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rota_engine::{Client, Completions, Scheduler, Submission, Workflows, scheduler};
use rota_model::{InstanceId, ManualClock, Priority, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::TaskFilter;
use rota_workflow::{AgentCatalog, StepDef, Workflow};
use serde_json::json;

use common::Backend;

const START: Timestamp = Timestamp::from_millis(1_800_000_000_000);

fn workflow() -> Workflow {
    Workflow::builder("ranked", 1).priority(5).step(StepDef::new("nap", "delay")).build(&AgentCatalog::builtin()).unwrap()
}

async fn claims_follow_priorities_and_the_oldest_share(backend: Backend) {
    let clock = Arc::new(ManualClock::new(START));
    let Some(test_store) = common::open(backend, clock.clone()).await else { return };
    let store = test_store.store.clone();
    let workflows = Workflows::new(store.clone());
    workflows.register(&workflow()).await.unwrap();
    let client = Client::new(store.clone(), clock.clone(), workflows.clone(), None);

    // Submitted a second apart in this order; `None` takes the workflow's 5.
    let submitted = [("a", None), ("b", Some(-10)), ("c", Some(20)), ("d", None), ("e", Some(-10)), ("f", Some(20))];
    for (id, priority) in submitted {
        let mut submission = Submission::new(WorkflowName::new("ranked").unwrap(), json!({})).with_id(TaskId::new(id).unwrap());
        if let Some(priority) = priority {
            submission = submission.with_priority(Priority::new(priority).unwrap());
        }
        client.submit(submission).await.unwrap();
        clock.advance(Duration::from_secs(1));
    }
    let stored = |id: &str| {
        let store = store.clone();
        let id = TaskId::new(id).unwrap();
        async move { store.task(&id).await.unwrap().unwrap().task }
    };
    assert_eq!(stored("a").await.priority.get(), 5, "the workflow's default");
    assert_eq!(stored("b").await.priority.get(), -10, "the submission's own");

    let mut config = scheduler::Config::new(InstanceId::new("ranker").unwrap());
    config.claim_batch = 1;
    config.claim_oldest_every = 3;
    let ranker = Scheduler::new(store.clone(), clock.clone(), workflows, Completions::default(), config).unwrap();
    let mut order = Vec::new();
    for _ in 0..submitted.len() {
        assert_eq!(ranker.claim_once().await.unwrap(), 1);
        let held = store.list_tasks(&TaskFilter { state: Some(TaskState::Processing), ..TaskFilter::default() }).await.unwrap();
        let new: Vec<String> = held.iter().map(|t| t.id.to_string()).filter(|id| !order.contains(id)).collect();
        assert_eq!(new.len(), 1, "one claim, one task: {new:?}");
        order.extend(new);
    }
    // Claims 0 and 3 are the oldest share; the others take the highest
    // priority, oldest first among equals.
    assert_eq!(order, ["a", "c", "f", "b", "d", "e"]);
    drop(test_store);
}

on_each_backend!(claims_follow_priorities_and_the_oldest_share);
