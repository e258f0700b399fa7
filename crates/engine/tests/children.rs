//! Child workflows end to end, on each backend: a `workflow:` step starts a
//! child task whose output is the step's output; a failed child fails the
//! step, which is retried with a new child; cancelling the parent cancels
//! its running child, which compensates; a workflow that starts itself
//! stops at `child_depth_max`; and a child's end survives the engine
//! stopping before the parent heard of it.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rota_agent::{Agent, Request, StepError};
use rota_engine::child::child_task_id;
use rota_engine::engine::Config;
use rota_engine::ops::Operator;
use rota_engine::protocol::children_queue;
use rota_engine::{Client, Engine, Shutdown, Submission};
use rota_model::{ExhaustedPolicy, InstanceId, ParentLink, RetryPolicy, StepName, StepState, SystemClock, TaskId, TaskState, WorkflowName};
use rota_store::{QueueConfig, SharedStore, TaskFilter};
use rota_workflow::{AgentCatalog, CompensateDef, StepDef, Workflow};
use serde_json::{Value, json};

use common::{Backend, TestStore};

/// An agent that records every call (task, step, compensate, input) and
/// fails, for good, the calls of the tasks named in `fail`.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<(String, String, bool, Value)>>,
    fail: Mutex<Vec<String>>,
}

impl Recorder {
    fn calls_of(&self, task: &str) -> Vec<(String, bool, Value)> {
        self.calls.lock().unwrap().iter().filter(|c| c.0 == task).map(|c| (c.1.clone(), c.2, c.3.clone())).collect()
    }
}

#[async_trait]
impl Agent for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        let task = request.task_id.to_string();
        self.calls.lock().unwrap().push((task.clone(), request.step.to_string(), request.compensate, request.input.clone()));
        if self.fail.lock().unwrap().contains(&task) {
            return Err(StepError::permanent(format!("{task} is told to fail")));
        }
        Ok(json!({ "step": request.step.as_str(), "got": request.input }))
    }
}

fn catalog() -> AgentCatalog {
    AgentCatalog::builtin().with(rota_workflow::AgentName::new("recorder").unwrap())
}

fn quick() -> RetryPolicy {
    RetryPolicy::new(1, Duration::from_millis(10), Duration::from_millis(10)).unwrap()
}

/// order: reserve → ship (a `shipping` child, given the address) → confirm,
/// which reads the child's output.
fn order() -> Workflow {
    Workflow::builder("order", 1)
        .max_failures(2)
        .step(StepDef::new("reserve", "recorder").retry(quick()))
        .step(
            StepDef::run_workflow("ship", "shipping", Some(1))
                .timeout(Duration::from_secs(60))
                .with_input(json!({ "to": "{{ input.to }}" })),
        )
        .step(StepDef::new("confirm", "recorder").retry(quick()).with_input(json!({ "label": "{{ steps.ship.output.label }}" })))
        .build(&catalog())
        .unwrap()
}

/// shipping: book (undone by its compensation) → label, whose output is
/// the child's; `hold` (a signal never sent) keeps it running when asked.
fn shipping(hold: bool) -> Workflow {
    let mut builder = Workflow::builder("shipping", 1).max_failures(1).on_exhausted(ExhaustedPolicy::Compensate).step(
        StepDef::new("book", "recorder")
            .retry(quick())
            .with_input(json!({ "to": "{{ input.to }}" }))
            .compensate(CompensateDef::new("recorder")),
    );
    if hold {
        builder = builder.step(StepDef::wait("hold", "never").timeout(Duration::from_secs(60)));
    }
    builder.step(StepDef::new("label", "recorder").retry(quick())).build(&catalog()).unwrap()
}

/// recursive: a step that starts another task of the same workflow.
fn recursive() -> Workflow {
    Workflow::builder("recursive", 1)
        .max_failures(1)
        .step(StepDef::run_workflow("again", "recursive", None).timeout(Duration::from_secs(60)))
        .build(&catalog())
        .unwrap()
}

struct Setup {
    _db: TestStore,
    store: SharedStore,
    agent: Arc<Recorder>,
    client: Option<Client>,
    workflows: Vec<Workflow>,
    depth_max: Option<u32>,
}

async fn setup(backend: Backend, workflows: Vec<Workflow>) -> Option<Setup> {
    let db = common::open(backend, Arc::new(SystemClock)).await?;
    let store = db.store.clone();
    let agent = Arc::new(Recorder::default());
    let mut setup = Setup { _db: db, store, agent, client: None, workflows, depth_max: None };
    let engine = setup.engine("setup");
    engine.register_workflows().await.unwrap();
    setup.client = Some(engine.client());
    Some(setup)
}

impl Setup {
    fn engine(&self, instance: &str) -> Engine {
        let mut config = Config::new(InstanceId::new(instance).unwrap());
        config.supervisor.interval = Duration::from_millis(50);
        config.supervisor.leader_ttl = Duration::from_secs(1);
        if let Some(depth_max) = self.depth_max {
            config.scheduler.child_depth_max = depth_max;
        }
        let mut engine = Engine::new(self.store.clone(), Arc::new(SystemClock), config).agent(self.agent.clone());
        for workflow in &self.workflows {
            engine = engine.workflow(workflow.clone());
        }
        engine
    }

    fn run(&self, instance: &str) -> (Shutdown, tokio::task::JoinHandle<rota_engine::Result<()>>) {
        let shutdown = Shutdown::new();
        (shutdown.clone(), tokio::spawn(self.engine(instance).run(shutdown)))
    }

    async fn submit(&self, workflow: &str, id: &str, input: Value) -> TaskId {
        let submission = Submission::new(WorkflowName::new(workflow).unwrap(), input).with_id(TaskId::new(id).unwrap());
        self.client.as_ref().unwrap().submit(submission).await.unwrap().id
    }

    async fn task(&self, id: &TaskId) -> rota_store::TaskRecord {
        self.store.task(id).await.unwrap().unwrap_or_else(|| panic!("task {id} is missing"))
    }

    async fn step(&self, id: &TaskId, step: &str) -> rota_model::Step {
        self.task(id).await.steps.into_iter().find(|s| s.name.as_str() == step).unwrap()
    }

    async fn wait_for(&self, what: &str, mut done: impl AsyncFnMut(&Setup) -> bool) {
        for _ in 0..800 {
            if done(self).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("never: {what}");
    }

    async fn wait_for_state(&self, id: &TaskId, state: TaskState) {
        self.wait_for(&format!("task {id} {state:?}"), async |s| s.store.task(id).await.unwrap().is_some_and(|r| r.task.state == state))
            .await;
    }
}

fn step(name: &str) -> StepName {
    StepName::new(name).unwrap()
}

async fn the_parent_waits_for_its_child_and_gets_its_output(backend: Backend) {
    let Some(setup) = setup(backend, vec![order(), shipping(false)]).await else { return };
    let (shutdown, running) = setup.run("children-1");
    let id = setup.submit("order", "order-1", json!({ "to": "Lyon" })).await;
    setup.wait_for_state(&id, TaskState::Processed).await;
    shutdown.trigger();
    running.await.unwrap().unwrap();

    let child_id = child_task_id(&id, &step("ship"), 1);
    assert_eq!(child_id.as_str(), "order-1/ship#1");
    let child = setup.task(&child_id).await;
    assert_eq!(child.task.state, TaskState::Processed);
    assert_eq!((child.task.workflow.as_str(), child.task.workflow_version), ("shipping", 1), "the version the step pins");
    assert_eq!(child.task.input, json!({ "to": "Lyon" }), "the step's `with` is the child's input");
    assert_eq!(child.task.parent, Some(ParentLink { task: id.clone(), step: step("ship"), attempt: 1, depth: 1 }));
    let ship = setup.step(&id, "ship").await;
    assert_eq!(ship.state, StepState::Completed);
    assert_eq!(ship.output, child.task.output, "the child's output is the step's output");
    let confirmed = setup.agent.calls_of("order-1").into_iter().find(|c| c.0 == "confirm").unwrap();
    assert_eq!(confirmed.2, json!({ "label": { "step": "label", "got": null } }), "a later step reads the child's output");

    let children = setup.store.list_tasks(&TaskFilter { parent: Some(id.clone()), ..TaskFilter::default() }).await.unwrap();
    assert_eq!(children.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["order-1/ship#1"], "listed by parent");
    assert!(setup.store.stale_children(10).await.unwrap().is_empty());
}

async fn a_failed_child_fails_the_step_which_retries_with_a_new_child(backend: Backend) {
    let Some(setup) = setup(backend, vec![order(), shipping(false)]).await else { return };
    setup.agent.fail.lock().unwrap().push("order-2/ship#1".into());
    let (shutdown, running) = setup.run("children-2");
    let id = setup.submit("order", "order-2", json!({ "to": "Oslo" })).await;
    setup.wait_for_state(&id, TaskState::Processed).await;
    shutdown.trigger();
    running.await.unwrap().unwrap();

    let first = setup.task(&child_task_id(&id, &step("ship"), 1)).await;
    assert_eq!(first.task.state, TaskState::Compensated, "the first child failed and undid itself");
    let second = setup.task(&child_task_id(&id, &step("ship"), 2)).await;
    assert_eq!(second.task.state, TaskState::Processed, "the retry ran a new child");
    let parent = setup.task(&id).await;
    assert_eq!(parent.task.failure_count, 1, "the failed child counted one failure");
    let history = setup.store.history(&id).await.unwrap();
    let failed = history.iter().find(|e| e.kind == rota_store::EventKind::StepFailed).expect("the step failed once");
    let error = failed.detail["error"].as_str().unwrap();
    assert!(error.contains("child workflow task order-2/ship#1 ended compensated"), "{error}");
}

async fn cancelling_the_parent_cancels_its_running_child_which_compensates(backend: Backend) {
    let Some(setup) = setup(backend, vec![order(), shipping(true)]).await else { return };
    let (shutdown, running) = setup.run("children-3");
    let id = setup.submit("order", "order-3", json!({ "to": "Rome" })).await;
    let child_id = child_task_id(&id, &step("ship"), 1);
    setup
        .wait_for("the child holds", async |s| {
            s.store
                .task(&child_id)
                .await
                .unwrap()
                .is_some_and(|r| r.steps.iter().any(|st| st.name.as_str() == "hold" && st.state == StepState::Running))
        })
        .await;
    let state = setup.client.as_ref().unwrap().cancel(&id, Operator { by: "test", reason: Some("changed my mind") }).await.unwrap();
    assert_eq!(state, TaskState::Cancelled, "the parent has nothing of its own to undo");
    setup.wait_for_state(&child_id, TaskState::Compensated).await;
    shutdown.trigger();
    running.await.unwrap().unwrap();

    let calls = setup.agent.calls_of(child_id.as_str());
    assert!(calls.iter().any(|c| c.0 == "book" && c.1), "the child's booking was undone: {calls:?}");
    let history = setup.store.history(&child_id).await.unwrap();
    let cancelled = history.iter().find(|e| e.kind == rota_store::EventKind::Cancelled).expect("the child was cancelled");
    assert_eq!(cancelled.detail["by"], json!("rota"));
    assert!(cancelled.detail["reason"].as_str().unwrap().contains("parent no longer waits"), "{}", cancelled.detail);
    assert!(setup.store.stale_children(10).await.unwrap().is_empty(), "nothing left to cancel");
}

async fn a_workflow_starting_itself_stops_at_the_depth_limit(backend: Backend) {
    let Some(mut setup) = setup(backend, vec![recursive()]).await else { return };
    setup.depth_max = Some(2);
    let (shutdown, running) = setup.run("children-4");
    let id = setup.submit("recursive", "loop", json!({})).await;
    setup.wait_for_state(&id, TaskState::Error).await;
    shutdown.trigger();
    running.await.unwrap().unwrap();

    let first = child_task_id(&id, &step("again"), 1);
    let second = child_task_id(&first, &step("again"), 1);
    assert_eq!(setup.task(&second).await.task.parent.unwrap().depth, 2);
    assert!(setup.store.task(&child_task_id(&second, &step("again"), 1)).await.unwrap().is_none(), "no third level");
    let deepest = setup.task(&second).await.task;
    assert_eq!(deepest.state, TaskState::Error);
    let error = deepest.error.unwrap();
    assert!(error.contains("more than child_depth_max (2)"), "{error}");
    for id in [&first, &id] {
        assert_eq!(setup.task(id).await.task.state, TaskState::Error, "the failure goes up to {id}");
    }
}

async fn a_childs_end_outlives_the_engine_stopping_before_the_parent_heard(backend: Backend) {
    let Some(setup) = setup(backend, vec![order(), shipping(false)]).await else { return };
    // Ends of children wait in their queue, undelivered, as if the process
    // that ended the child stopped right after its commit.
    setup.store.create_queue(&children_queue(), QueueConfig::default()).await.unwrap();
    setup.store.pause(&children_queue()).await.unwrap();
    let (shutdown, running) = setup.run("children-5a");
    let id = setup.submit("order", "order-5", json!({ "to": "Porto" })).await;
    let child_id = child_task_id(&id, &step("ship"), 1);
    setup.wait_for_state(&child_id, TaskState::Processed).await;
    shutdown.trigger();
    running.await.unwrap().unwrap();
    let ship = setup.step(&id, "ship").await;
    assert_eq!((ship.state, ship.attempt), (StepState::Running, 1), "the parent has not heard");
    let waiting = setup.store.stats().await.unwrap().into_iter().find(|q| q.queue == children_queue()).unwrap();
    assert_eq!(waiting.ready, 1, "the child's end was committed with it");

    // Another engine takes the parent over; the end reaches it.
    setup.store.resume(&children_queue()).await.unwrap();
    let (shutdown, running) = setup.run("children-5b");
    setup.wait_for_state(&id, TaskState::Processed).await;
    shutdown.trigger();
    running.await.unwrap().unwrap();
    let ship = setup.step(&id, "ship").await;
    assert_eq!((ship.state, ship.attempt), (StepState::Completed, 1), "the same attempt, the same child");
    assert!(setup.store.task(&child_task_id(&id, &step("ship"), 2)).await.unwrap().is_none(), "no second child");
}

on_each_backend!(
    the_parent_waits_for_its_child_and_gets_its_output,
    a_failed_child_fails_the_step_which_retries_with_a_new_child,
    cancelling_the_parent_cancels_its_running_child_which_compensates,
    a_workflow_starting_itself_stops_at_the_depth_limit,
    a_childs_end_outlives_the_engine_stopping_before_the_parent_heard,
);
