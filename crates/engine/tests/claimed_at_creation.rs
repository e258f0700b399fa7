//! Tasks taken at their creation, on each backend: a task submitted through
//! the client of an engine whose Scheduler has no backlog is created claimed
//! by that Scheduler and started at once, with the history a claim leaves;
//! a paused workflow's task is created Pending instead and waits for the
//! resume; a task under a concurrency key is left to a claim.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rota_agent::{Agent, Request, StepError};
use rota_engine::engine::Config;
use rota_engine::{Client, Engine, Roles, Scheduler, Shutdown, Submission};
use rota_model::{InstanceId, ManualClock, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{EventKind, SharedStore, WorkflowPause};
use rota_workflow::{AgentCatalog, AgentName, StepDef, Workflow};
use serde_json::{Value, json};

use common::Backend;

const START: Timestamp = Timestamp::from_millis(1_800_000_000_000);
/// How long the test waits, in real time, for the engine to get somewhere.
const PATIENCE: Duration = Duration::from_secs(20);

/// Answers every call at once.
struct Echo;

#[rota_engine::async_trait]
impl Agent for Echo {
    fn name(&self) -> &str {
        "echo"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        Ok(request.input.clone())
    }
}

/// Holds every call until the test opens it.
#[derive(Default)]
struct Gate {
    open: std::sync::atomic::AtomicBool,
}

#[rota_engine::async_trait]
impl Agent for Gate {
    fn name(&self) -> &str {
        "gate"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        while !self.open.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(request.input.clone())
    }
}

fn workflow(name: &str, concurrency_key: bool) -> Workflow {
    let agent = if name == "gated" { "gate" } else { "echo" };
    let mut builder = Workflow::builder(name, 1).step(StepDef::new("only", agent));
    if concurrency_key {
        builder = builder.concurrency("input.key", 1);
    }
    let catalog = AgentCatalog::builtin().with(AgentName::new("echo").unwrap()).with(AgentName::new("gate").unwrap());
    builder.build(&catalog).unwrap()
}

struct Rig {
    _db: common::TestStore,
    store: SharedStore,
    client: Client,
    scheduler: Scheduler,
    gate: Arc<Gate>,
    shutdown: Shutdown,
    running: tokio::task::JoinHandle<rota_engine::Result<()>>,
}

impl Rig {
    async fn new(backend: Backend) -> Option<Rig> {
        let clock = Arc::new(ManualClock::new(START));
        let db = common::open(backend, clock.clone()).await?;
        let store = db.store.clone();
        let mut config = Config::new(InstanceId::new("solo").unwrap());
        config.roles = Roles { supervisor: false, ..Roles::ALL };
        config.scheduler.claim_wait = Duration::from_millis(50);
        let gate = Arc::new(Gate::default());
        let engine = Engine::new(store.clone(), clock.clone(), config)
            .agent(Arc::new(Echo))
            .agent(gate.clone())
            .workflow(workflow("gated", false))
            .workflow(workflow("plain", false))
            .workflow(workflow("keyed", true));
        engine.register_workflows().await.unwrap();
        let client = engine.client();
        let scheduler = engine.scheduler().unwrap().expect("the engine runs a Scheduler");
        let shutdown = Shutdown::new();
        let running = tokio::spawn(engine.run(shutdown.clone()));
        Some(Rig { _db: db, store, client, scheduler, gate, shutdown, running })
    }

    async fn submit(&self, workflow: &str, id: &str) -> TaskId {
        let submission = Submission::new(WorkflowName::new(workflow).unwrap(), json!({ "key": "k" })).with_id(TaskId::new(id).unwrap());
        self.client.submit(submission).await.unwrap().id
    }

    async fn finished(&self, id: &TaskId) {
        assert_eq!(self.client.wait(id, PATIENCE).await.unwrap(), TaskState::Processed, "task {id} finished");
    }

    async fn kinds(&self, id: &TaskId) -> Vec<EventKind> {
        self.store.history(id).await.unwrap().into_iter().map(|e| e.kind).collect()
    }

    /// Waits until the Scheduler's claims have found nothing left behind
    /// (its first claim runs when its loop starts): submitted from then on,
    /// a task is taken at its creation.
    async fn settled(&self) {
        let first = self.submit("plain", "first").await;
        self.finished(&first).await;
        let started = std::time::Instant::now();
        let mut n = 0;
        while self.scheduler.taken_at_creation() == 0 {
            assert!(started.elapsed() < PATIENCE, "no submission was ever taken at its creation");
            let probe = self.submit("plain", &format!("probe-{n}")).await;
            self.finished(&probe).await;
            n += 1;
        }
    }

    async fn stop(self) {
        self.shutdown.trigger();
        self.running.await.unwrap().unwrap();
    }
}

async fn a_submission_is_claimed_in_the_commit_that_creates_it(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    rig.settled().await;
    let taken = rig.scheduler.taken_at_creation();
    let id = rig.submit("plain", "taken").await;
    assert_eq!(rig.scheduler.taken_at_creation(), taken + 1, "taken at its creation");
    rig.finished(&id).await;
    let kinds = rig.kinds(&id).await;
    assert_eq!(&kinds[..2], [EventKind::Received, EventKind::Claimed], "a claim's history: {kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == EventKind::Claimed).count(), 1, "claimed once: {kinds:?}");
    let taken = rig.store.task(&id).await.unwrap().unwrap().task;
    let claimed = rig.store.task(&TaskId::new("first").unwrap()).await.unwrap().unwrap().task;
    assert_eq!((taken.lease_epoch, taken.locked_by), (claimed.lease_epoch, None), "its leases are a claimed task's");
    let first_kinds = rig.kinds(&claimed.id).await;
    assert_eq!(kinds, first_kinds, "so is its history");
    rig.stop().await;
}

/// The creating commit also starts the task: when the submission returns,
/// its first step's request is out, with the start's history, before any
/// other commit of the Scheduler.
async fn the_creating_commit_sends_the_first_step(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    rig.settled().await;
    let id = rig.submit("gated", "gated-1").await;
    let record = rig.store.task(&id).await.unwrap().unwrap();
    assert_eq!(
        (record.task.state, record.task.locked_by.as_ref().map(|o| o.as_str())),
        (TaskState::Processing, Some("solo")),
        "held by the Scheduler that took it"
    );
    let step = &record.steps[0];
    assert_eq!((step.state, step.attempt), (rota_model::StepState::Running, 1), "its step runs");
    assert_eq!(rig.kinds(&id).await, [EventKind::Received, EventKind::Claimed, EventKind::StepStarted]);
    rig.gate.open.store(true, std::sync::atomic::Ordering::Relaxed);
    rig.finished(&id).await;
    rig.stop().await;
}

async fn a_paused_workflows_submission_waits_pending_for_the_resume(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    rig.settled().await;
    let taken = rig.scheduler.taken_at_creation();
    let pause = |paused: bool| WorkflowPause {
        workflow: WorkflowName::new("plain").unwrap(),
        paused,
        by: "ann".to_owned(),
        reason: None,
        at: START,
    };
    rig.store.set_workflow_paused(&pause(true)).await.unwrap();
    let id = rig.submit("plain", "while-paused").await;
    assert_eq!(rig.scheduler.taken_at_creation(), taken, "not taken while its workflow is paused");
    // Claims run every 50 ms: several pass it over.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let record = rig.store.task(&id).await.unwrap().unwrap();
    assert_eq!((record.task.state, record.task.locked_by), (TaskState::Pending, None), "it waits, unclaimed");
    assert_eq!(rig.kinds(&id).await, [EventKind::Received], "nothing but its receipt");
    rig.store.set_workflow_paused(&pause(false)).await.unwrap();
    rig.finished(&id).await;
    rig.stop().await;
}

async fn a_task_under_a_concurrency_key_is_left_to_a_claim(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    rig.settled().await;
    let taken = rig.scheduler.taken_at_creation();
    let id = rig.submit("keyed", "keyed-1").await;
    assert_eq!(rig.scheduler.taken_at_creation(), taken, "its slot is a claim's to give");
    rig.finished(&id).await;
    rig.stop().await;
}

on_each_backend!(
    a_submission_is_claimed_in_the_commit_that_creates_it,
    the_creating_commit_sends_the_first_step,
    a_paused_workflows_submission_waits_pending_for_the_resume,
    a_task_under_a_concurrency_key_is_left_to_a_claim,
);
