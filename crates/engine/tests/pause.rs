//! Pausing tasks end to end, on each backend: a Scheduler and agent
//! workers run on a real store whose clock is a `ManualClock`, the test
//! holds every agent call until it answers it, runs the Supervisor's rounds
//! itself, and claims with a second Scheduler of its own to show what a
//! claim finds.
//!
//! Clock jumps stay below the queues' 30 s lease, so that no message lease
//! runs out while an agent holds a request.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rota_agent::{Agent, Request, StepError};
use rota_engine::engine::Config;
use rota_engine::ops::{self, Action};
use rota_engine::pause::{Operator, REASON_CHARS_MAX};
use rota_engine::supervisor::{self, Supervisor};
use rota_engine::{Client, Completions, Engine, Roles, Scheduler, Shutdown, Start, Submission, Workflows, scheduler};
use rota_model::{InstanceId, ManualClock, RetryPolicy, StepState, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{Event, EventKind, SharedStore, TaskRecord};
use rota_workflow::{AgentCatalog, AgentName, StepDef, Workflow};
use serde_json::{Value, json};

use common::Backend;

const START: Timestamp = Timestamp::from_millis(1_800_000_000_000);
/// How long the test waits, in real time, for the engine to get somewhere.
const PATIENCE: Duration = Duration::from_secs(20);

/// An agent that holds every call until the test lets its attempt go.
#[derive(Default)]
struct Gate {
    answers: Mutex<HashMap<(String, u32), bool>>,
    calls: Mutex<Vec<(String, u32)>>,
}

impl Gate {
    fn succeed(&self, step: &str, attempt: u32) {
        self.answers.lock().unwrap().insert((step.to_owned(), attempt), true);
    }

    fn calls(&self) -> Vec<(String, u32)> {
        self.calls.lock().unwrap().clone()
    }
}

#[rota_engine::async_trait]
impl Agent for Gate {
    fn name(&self) -> &str {
        "gate"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        let key = (request.step.to_string(), request.attempt);
        self.calls.lock().unwrap().push(key.clone());
        loop {
            if self.answers.lock().unwrap().get(&key).copied().unwrap_or(false) {
                return Ok(json!({ "attempt": request.attempt }));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Steps `a` then `b` of 20 s each; the task's deadline 10 min.
fn two_steps() -> Workflow {
    let once = RetryPolicy::new(1, Duration::from_millis(10), Duration::from_millis(10)).unwrap();
    let step = |name: &str| StepDef::new(name, "gate").timeout(Duration::from_secs(20)).retry(once.clone());
    Workflow::builder("two-steps", 1)
        .deadline(Duration::from_secs(600))
        .max_failures(5)
        .step(step("a"))
        .step(step("b"))
        .build(&AgentCatalog::builtin().with(AgentName::new("gate").unwrap()))
        .unwrap()
}

struct Rig {
    _db: common::TestStore,
    store: SharedStore,
    clock: Arc<ManualClock>,
    gate: Arc<Gate>,
    client: Client,
    supervisor: Supervisor,
    /// A Scheduler the test claims with, to see what a claim finds.
    claimer: Scheduler,
    shutdown: Shutdown,
    running: tokio::task::JoinHandle<rota_engine::Result<()>>,
}

impl Rig {
    async fn new(backend: Backend) -> Option<Rig> {
        let clock = Arc::new(ManualClock::new(START));
        let db = common::open(backend, clock.clone()).await?;
        let store = db.store.clone();
        let gate = Arc::new(Gate::default());
        let mut config = Config::new(InstanceId::new("solo").unwrap());
        // The test runs the Supervisor's rounds itself.
        config.roles = Roles { supervisor: false, ..Roles::ALL };
        config.scheduler.recovery = RetryPolicy::new(100, Duration::from_secs(2), Duration::from_secs(2)).unwrap();
        config.scheduler.claim_wait = Duration::from_millis(100);
        let engine = Engine::new(store.clone(), clock.clone(), config).agent(gate.clone()).workflow(two_steps());
        engine.register_workflows().await.unwrap();
        let client = engine.client();
        let shutdown = Shutdown::new();
        let running = tokio::spawn(engine.run(shutdown.clone()));
        let mut supervisor_config = supervisor::Config::new(InstanceId::new("supervisor-1").unwrap());
        supervisor_config.leader_ttl = Duration::from_secs(3_600);
        let workflows = Workflows::new(store.clone());
        let supervisor =
            Supervisor::new(store.clone(), clock.clone(), workflows.clone(), Completions::default(), supervisor_config).unwrap();
        let claimer_config = scheduler::Config::new(InstanceId::new("claimer").unwrap());
        let claimer = Scheduler::new(store.clone(), clock.clone(), workflows, Completions::default(), claimer_config).unwrap();
        Some(Rig { _db: db, store, clock, gate, client, supervisor, claimer, shutdown, running })
    }

    async fn submit(&self, id: &str, start: Start) -> TaskId {
        let submission =
            Submission::new(WorkflowName::new("two-steps").unwrap(), json!({})).with_id(TaskId::new(id).unwrap()).with_start(start);
        self.client.submit(submission).await.unwrap().id
    }

    async fn record(&self, id: &TaskId) -> TaskRecord {
        self.store.task(id).await.unwrap().unwrap()
    }

    /// Waits until `done` holds of the task's record.
    async fn until(&self, id: &TaskId, what: &str, done: impl Fn(&TaskRecord) -> bool) -> TaskRecord {
        let started = std::time::Instant::now();
        loop {
            let record = self.record(id).await;
            if done(&record) {
                return record;
            }
            assert!(started.elapsed() < PATIENCE, "{what} never happened: {record:#?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until step `name` of `id` runs attempt `attempt`.
    async fn running(&self, id: &TaskId, name: &str, attempt: u32) -> TaskRecord {
        self.until(id, &format!("step {name} attempt {attempt} running"), |r| {
            r.steps.iter().any(|s| s.name.as_str() == name && s.state == StepState::Running && s.attempt == attempt)
        })
        .await
    }

    /// Lets the engine's own claim loop (every 100 ms) and the test's
    /// claimer try the task, and checks that it stays as it is: paused,
    /// Pending, unheld, step `b`'s agent not called.
    async fn stays_paused(&self, id: &TaskId) {
        assert_eq!(self.claimer.claim_once().await.unwrap(), 0, "a claim takes no paused task");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(self.claimer.claim_once().await.unwrap(), 0, "a claim takes no paused task");
        let record = self.record(id).await;
        assert!(record.task.paused, "{record:#?}");
        assert_eq!((record.task.state, record.task.locked_by.clone()), (TaskState::Pending, None), "{record:#?}");
        assert!(!self.gate.calls().iter().any(|(step, _)| step == "b"), "b never started: {:?}", self.gate.calls());
    }

    async fn history(&self, id: &TaskId) -> Vec<Event> {
        self.store.history(id).await.unwrap()
    }

    async fn finish(self, id: &TaskId) {
        assert_eq!(self.client.wait(id, PATIENCE).await.unwrap(), TaskState::Processed);
        self.shutdown.trigger();
        self.running.await.unwrap().unwrap();
    }
}

fn ops_user(reason: Option<&'static str>) -> Operator<'static> {
    Operator { by: "ops-ann", reason }
}

fn of_kind(history: &[Event], kind: EventKind) -> Vec<&Event> {
    history.iter().filter(|e| e.kind == kind).collect()
}

/// A task paused while a step runs: the step finishes and its completion is
/// recorded, the next step does not start, the holder gives the task back,
/// and no claim takes it; resumed, it goes on from the next step. Both moves
/// are in its history with who and why.
async fn a_paused_task_finishes_its_step_in_flight_and_starts_no_other(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let id = rig.submit("p-1", Start::Now).await;
    rig.running(&id, "a", 1).await;

    let paused = rig.client.pause(&id, ops_user(Some("the payment service is down"))).await.unwrap();
    assert!(paused.record.task.paused);
    assert_eq!(paused.record.task.state, TaskState::Processing, "a pause keeps the task held while a step runs");
    rig.gate.succeed("a", 1);
    let record = rig.until(&id, "the holder giving the paused task back", |r| r.task.locked_by.is_none()).await;
    let step = |record: &TaskRecord, name: &str| record.steps.iter().find(|s| s.name.as_str() == name).unwrap().clone();
    assert_eq!(step(&record, "a").state, StepState::Completed, "the step in flight finished and was recorded");
    assert_eq!(step(&record, "b").state, StepState::NotStarted, "the next one did not start");
    rig.stays_paused(&id).await;

    let history = rig.history(&id).await;
    let pause = of_kind(&history, EventKind::Paused);
    assert_eq!(pause.len(), 1);
    assert_eq!(pause[0].detail, json!({ "by": "ops-ann", "reason": "the payment service is down" }));
    let released = of_kind(&history, EventKind::Released);
    assert_eq!(released.len(), 1, "{history:#?}");
    assert_eq!(released[0].detail["paused"], json!(true));

    let resumed = rig.client.resume(&id, ops_user(None)).await.unwrap();
    assert!(!resumed.record.task.paused);
    rig.running(&id, "b", 1).await;
    rig.gate.succeed("b", 1);
    // The step is recorded Running before its request reaches the agent:
    // the calls are complete only once the task has ended.
    assert_eq!(rig.client.wait(&id, PATIENCE).await.unwrap(), TaskState::Processed);
    let history = rig.history(&id).await;
    let resume = of_kind(&history, EventKind::Resumed);
    assert_eq!(resume.len(), 1);
    assert_eq!(resume[0].detail, json!({ "by": "ops-ann", "reason": null }));
    assert_eq!(rig.gate.calls(), [("a".to_owned(), 1), ("b".to_owned(), 1)], "each step ran once");
    rig.finish(&id).await;
}

/// A task paused before any Scheduler took it stays Pending across claims
/// once its start time has come; resumed, it runs at once.
async fn a_paused_pending_task_is_not_claimed_until_resumed(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let id = rig.submit("p-2", Start::After(Duration::from_secs(10))).await;
    rig.client.pause(&id, ops_user(Some("wait for the migration"))).await.unwrap();
    rig.clock.advance(Duration::from_secs(11));
    rig.stays_paused(&id).await;
    assert!(rig.gate.calls().is_empty(), "no step started: {:?}", rig.gate.calls());
    assert!(of_kind(&rig.history(&id).await, EventKind::Claimed).is_empty(), "never claimed");

    rig.client.resume(&id, ops_user(Some("done"))).await.unwrap();
    rig.running(&id, "a", 1).await;
    rig.gate.succeed("a", 1);
    rig.running(&id, "b", 1).await;
    rig.gate.succeed("b", 1);
    rig.finish(&id).await;
}

/// The Supervisor treats a paused task like any other: a step of it that
/// times out is reported to its holder, which counts the failure and gives
/// the task back without starting the retry; no round or claim starts it
/// while paused, past the backoff too. Resumed, the step runs its next
/// attempt.
async fn a_timed_out_step_of_a_paused_task_is_retried_only_after_the_resume(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let id = rig.submit("p-3", Start::Now).await;
    rig.running(&id, "a", 1).await;
    rig.client.pause(&id, ops_user(None)).await.unwrap();

    rig.clock.advance(Duration::from_secs(21));
    let round = rig.supervisor.run_once().await.unwrap();
    assert_eq!(round.steps_reported, 1, "the timeout is reported to the holder: {round:?}");
    let record = rig.until(&id, "the holder counting the timeout and giving the task back", |r| r.task.locked_by.is_none()).await;
    assert_eq!(record.task.failure_count, 1, "the timeout counted: {record:#?}");
    let a = record.steps.iter().find(|s| s.name.as_str() == "a").unwrap();
    assert_eq!((a.state, a.attempt), (StepState::NotStarted, 1), "waiting for its retry");
    // The agent's late answer is dropped (past the attempt's complete-by).
    rig.gate.succeed("a", 1);

    rig.clock.advance(Duration::from_secs(5));
    let round = rig.supervisor.run_once().await.unwrap();
    assert_eq!((round.tasks_reset, round.tasks_ended, round.steps_reported), (0, 0, 0), "nothing to recover: {round:?}");
    rig.stays_paused(&id).await;
    assert_eq!(rig.gate.calls(), [("a".to_owned(), 1)], "no retry while paused");

    rig.client.resume(&id, ops_user(None)).await.unwrap();
    rig.running(&id, "a", 2).await;
    rig.gate.succeed("a", 2);
    rig.running(&id, "b", 1).await;
    rig.gate.succeed("b", 1);
    rig.finish(&id).await;
}

/// Pausing an unknown or finished task, pausing twice, resuming a task
/// that is not paused, or giving too long a reason is refused with a clear
/// error, and writes nothing.
async fn refused_pauses_and_resumes_change_nothing(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let unknown = TaskId::new("nobody").unwrap();
    let err = rig.client.pause(&unknown, ops_user(None)).await.unwrap_err();
    assert!(matches!(err, ops::Error::TaskNotFound(_)), "{err:?}");
    assert_eq!(err.to_string(), "task nobody not found");

    let id = rig.submit("p-4", Start::Now).await;
    let err = rig.client.resume(&id, ops_user(None)).await.unwrap_err();
    assert_eq!(err.to_string(), "resume: task p-4: cannot resume a task that is not paused");
    let long = "x".repeat(REASON_CHARS_MAX + 1);
    let err = rig.client.pause(&id, Operator { by: "ops-ann", reason: Some(&long) }).await.unwrap_err();
    assert!(err.to_string().starts_with("reason: is 1001 characters long"), "{err}");
    rig.client.pause(&id, ops_user(None)).await.unwrap();
    // A holder that claimed the task gives it back, paused, unless its
    // step is already in flight: compare from once that has settled.
    let before =
        rig.until(&id, "the pause settling", |r| r.task.locked_by.is_none() || r.steps.iter().any(|s| s.state == StepState::Running)).await;
    let err = rig.client.pause(&id, ops_user(None)).await.unwrap_err();
    assert!(matches!(err, ops::Error::Refused { action: Action::Pause, .. }), "{err:?}");
    assert_eq!(err.to_string(), "pause: task p-4: cannot pause a task that is paused");
    assert_eq!(rig.record(&id).await, before, "a refused pause writes nothing");
    rig.client.resume(&id, ops_user(None)).await.unwrap();

    rig.running(&id, "a", 1).await;
    rig.gate.succeed("a", 1);
    rig.running(&id, "b", 1).await;
    rig.gate.succeed("b", 1);
    assert_eq!(rig.client.wait(&id, PATIENCE).await.unwrap(), TaskState::Processed);
    let before = (rig.record(&id).await, rig.history(&id).await);
    let err = rig.client.pause(&id, ops_user(Some("too late"))).await.unwrap_err();
    assert_eq!(err.to_string(), "pause: task p-4: task is processed, which is terminal");
    assert_eq!((rig.record(&id).await, rig.history(&id).await), before, "a refused pause writes nothing");
    let kinds: Vec<EventKind> = before.1.iter().map(|e| e.kind).filter(|k| matches!(k, EventKind::Paused | EventKind::Resumed)).collect();
    assert_eq!(kinds, [EventKind::Paused, EventKind::Resumed], "only the pause and resume that applied are recorded");
    rig.finish(&id).await;
}

/// A paused workflow: its new task stays Pending and unclaimed (by the
/// engine's claim loop and by another Scheduler), while its task already
/// held goes on to its end; another pause is refused, an unknown workflow
/// is not found. Resumed, the waiting task runs to its end. The pause and
/// the resume are stored with who and why.
async fn a_paused_workflows_new_tasks_wait_until_it_is_resumed(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let workflow = WorkflowName::new("two-steps").unwrap();
    let held = rig.submit("wf-held", Start::Now).await;
    rig.running(&held, "a", 1).await;

    let paused = rig.client.pause_workflow(&workflow, ops_user(Some("payments down"))).await.unwrap();
    assert!(paused.paused);
    let waiting = rig.submit("wf-new", Start::Now).await;
    assert_eq!(rig.claimer.claim_once().await.unwrap(), 0, "no claim takes a task of a paused workflow");
    rig.gate.succeed("a", 1);
    rig.running(&held, "b", 1).await;
    let record = rig.record(&waiting).await;
    assert_eq!((record.task.state, record.task.locked_by.clone()), (TaskState::Pending, None), "{record:#?}");
    assert!(!record.task.paused, "the task itself carries no mark");
    assert_eq!(rig.gate.calls().iter().filter(|(step, _)| step == "a").count(), 1, "only the held task's step a ran");

    let again = rig.client.pause_workflow(&workflow, ops_user(None)).await.unwrap_err();
    assert!(matches!(again, ops::Error::Refused { action: Action::Pause, .. }), "{again:?}");
    assert_eq!(again.to_string(), "pause: workflow two-steps is paused already");
    let unknown = rig.client.pause_workflow(&WorkflowName::new("nope").unwrap(), ops_user(None)).await.unwrap_err();
    assert!(matches!(unknown, ops::Error::UnknownWorkflow(_)), "{unknown:?}");
    let pauses = rig.client.workflow_pauses().await.unwrap();
    assert_eq!(
        pauses.iter().map(|p| (p.workflow.as_str(), p.paused, p.by.as_str(), p.reason.as_deref())).collect::<Vec<_>>(),
        [("two-steps", true, "ops-ann", Some("payments down"))]
    );

    rig.gate.succeed("b", 1);
    assert_eq!(rig.client.wait(&held, PATIENCE).await.unwrap(), TaskState::Processed, "the held task went on to its end");
    let resumed = rig.client.resume_workflow(&workflow, ops_user(None)).await.unwrap();
    assert!(!resumed.paused);
    let not_paused = rig.client.resume_workflow(&workflow, ops_user(None)).await.unwrap_err();
    assert_eq!(not_paused.to_string(), "resume: workflow two-steps is not paused");
    // The gate already lets attempt 1 of both steps through.
    rig.finish(&waiting).await;
}

on_each_backend!(
    a_paused_task_finishes_its_step_in_flight_and_starts_no_other,
    a_paused_pending_task_is_not_claimed_until_resumed,
    a_timed_out_step_of_a_paused_task_is_retried_only_after_the_resume,
    refused_pauses_and_resumes_change_nothing,
    a_paused_workflows_new_tasks_wait_until_it_is_resumed,
);
