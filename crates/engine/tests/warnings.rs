//! Deadline warnings end to end, on each backend: a Scheduler and agent
//! workers run on a real store whose clock is a `ManualClock`, the test
//! holds every agent call until it answers it, moves the clock past warning
//! points, and runs the Supervisor's rounds itself (`run_once`).
//!
//! Clock jumps stay below the queues' 30 s lease, so that no message lease
//! runs out while an agent holds a request.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rota_agent::{Agent, Request, StepError};
use rota_engine::engine::Config;
use rota_engine::supervisor::{self, Supervisor};
use rota_engine::{Client, Completions, Engine, Roles, Shutdown, Submission, Workflows};
use rota_model::{Clock, InstanceId, ManualClock, QueueName, RetryPolicy, StepState, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{Event, EventKind, SharedStore, TaskFilter};
use rota_workflow::{AgentCatalog, AgentName, StepDef, Workflow};
use serde_json::{Value, json};

use common::Backend;

const START: Timestamp = Timestamp::from_millis(1_800_000_000_000);
/// How long the test waits, in real time, for the engine to get somewhere.
const PATIENCE: Duration = Duration::from_secs(20);

/// How the test answers one attempt of one step.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Succeed,
    FailTransiently,
}

/// An agent that holds every call until the test answers its attempt.
#[derive(Default)]
struct Gate {
    answers: Mutex<HashMap<(String, u32), Answer>>,
}

impl Gate {
    fn answer(&self, step: &str, attempt: u32, answer: Answer) {
        self.answers.lock().unwrap().insert((step.to_owned(), attempt), answer);
    }
}

#[rota_engine::async_trait]
impl Agent for Gate {
    fn name(&self) -> &str {
        "gate"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        let key = (request.step.to_string(), request.attempt);
        loop {
            let answer = self.answers.lock().unwrap().get(&key).copied();
            match answer {
                Some(Answer::Succeed) => return Ok(json!({ "attempt": request.attempt })),
                Some(Answer::FailTransiently) => {
                    return Err(StepError::retryable("busy"));
                }
                None => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}

/// Steps `a` and `b` of 20 s, at risk after 10 s; the task's deadline
/// 10 min, with no warning point.
fn steps_warned() -> Workflow {
    let once = RetryPolicy::new(1, Duration::from_millis(10), Duration::from_millis(10)).unwrap();
    let step =
        |name: &str| StepDef::new(name, "gate").timeout(Duration::from_secs(20)).warn_after(Duration::from_secs(10)).retry(once.clone());
    Workflow::builder("steps-warned", 1)
        .deadline(Duration::from_secs(600))
        .max_failures(3)
        .step(step("a"))
        .step(step("b"))
        .build(&catalog())
        .unwrap()
}

/// One step of 25 s with no warning point; the task's deadline 28 s, at
/// risk after 10 s.
fn task_warned() -> Workflow {
    Workflow::builder("task-warned", 1)
        .deadline(Duration::from_secs(28))
        .warn_after(Duration::from_secs(10))
        .step(StepDef::new("only", "gate").timeout(Duration::from_secs(25)))
        .build(&catalog())
        .unwrap()
}

fn catalog() -> AgentCatalog {
    AgentCatalog::builtin().with(AgentName::new("gate").unwrap())
}

struct Rig {
    _db: common::TestStore,
    store: SharedStore,
    clock: Arc<ManualClock>,
    gate: Arc<Gate>,
    client: Client,
    supervisor: Supervisor,
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
        config.scheduler.recovery = RetryPolicy::new(100, Duration::from_millis(50), Duration::from_millis(100)).unwrap();
        config.scheduler.claim_wait = Duration::from_millis(100);
        let engine = Engine::new(store.clone(), clock.clone(), config).agent(gate.clone()).workflow(steps_warned()).workflow(task_warned());
        engine.register_workflows().await.unwrap();
        let client = engine.client();
        let shutdown = Shutdown::new();
        let running = tokio::spawn(engine.run(shutdown.clone()));
        let supervisor = supervisor(&store, &clock, "supervisor-1");
        Some(Rig { _db: db, store, clock, gate, client, supervisor, shutdown, running })
    }

    async fn submit(&self, workflow: &str, id: &str) -> TaskId {
        let submission = Submission::new(WorkflowName::new(workflow).unwrap(), json!({})).with_id(TaskId::new(id).unwrap());
        self.client.submit(submission).await.unwrap().id
    }

    /// Waits until step `name` of `id` runs attempt `attempt`.
    async fn running(&self, id: &TaskId, name: &str, attempt: u32) {
        let started = std::time::Instant::now();
        loop {
            let record = self.store.task(id).await.unwrap().unwrap();
            if record.steps.iter().any(|s| s.name.as_str() == name && s.state == StepState::Running && s.attempt == attempt) {
                return;
            }
            assert!(started.elapsed() < PATIENCE, "step {name} attempt {attempt} never ran: {record:#?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// One Supervisor round; returns how many warnings it raised.
    async fn round(&self) -> u32 {
        let round = self.supervisor.run_once().await.unwrap();
        assert!(round.leader, "the test's Supervisor leads");
        round.warnings_raised
    }

    async fn history(&self, id: &TaskId) -> Vec<Event> {
        self.store.history(id).await.unwrap()
    }

    async fn at_risk(&self) -> Vec<String> {
        let filter = TaskFilter { at_risk: true, ..TaskFilter::default() };
        self.client.tasks(&filter).await.unwrap().into_iter().map(|t| t.id.to_string()).collect()
    }

    async fn finish(self, id: &TaskId) {
        assert_eq!(self.client.wait(id, PATIENCE).await.unwrap(), TaskState::Processed);
        self.shutdown.trigger();
        self.running.await.unwrap().unwrap();
    }
}

fn supervisor(store: &SharedStore, clock: &Arc<ManualClock>, name: &str) -> Supervisor {
    let mut config = supervisor::Config::new(InstanceId::new(name).unwrap());
    config.leader_ttl = Duration::from_secs(3_600);
    Supervisor::new(store.clone(), clock.clone(), Workflows::new(store.clone()), Completions::default(), config).unwrap()
}

fn of_kind(history: &[Event], kind: EventKind) -> Vec<&Event> {
    history.iter().filter(|e| e.kind == kind).collect()
}

/// A step past its warning point raises exactly one `at_risk` event and one
/// alert naming it, with a reason saying what passed and how long remains;
/// a step that finishes before its point raises none; only the leader
/// raises anything.
async fn a_step_past_its_warning_point_raises_one_warning(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let id = rig.submit("steps-warned", "w-1").await;
    rig.running(&id, "a", 1).await;
    assert_eq!(rig.round().await, 0, "nothing is at risk at the start");

    rig.clock.advance(Duration::from_secs(11));
    let follower = supervisor(&rig.store, &rig.clock, "supervisor-2");
    let round = follower.run_once().await.unwrap();
    assert!(!round.leader && round.warnings_raised == 0, "a Supervisor that does not lead raises nothing: {round:?}");
    assert!(of_kind(&rig.history(&id).await, EventKind::AtRisk).is_empty());
    assert_eq!(rig.round().await, 1, "a's attempt passed its warning point");
    assert_eq!(rig.round().await, 0, "and is warned once");
    assert_eq!(rig.at_risk().await, ["w-1"]);

    let history = rig.history(&id).await;
    let at_risk = of_kind(&history, EventKind::AtRisk);
    assert_eq!(at_risk.len(), 1, "{history:#?}");
    assert_eq!((at_risk[0].step.as_ref().map(|s| s.as_str()), at_risk[0].attempt), (Some("a"), Some(1)));
    assert_eq!(at_risk[0].detail["remaining_ms"], json!(9_000));
    let alerts = of_kind(&history, EventKind::Alert);
    assert_eq!(alerts.len(), 1, "{history:#?}");
    assert_eq!(alerts[0].step.as_ref().map(|s| s.as_str()), Some("a"), "the alert names the step");
    assert_eq!(alerts[0].detail["reason"], json!("step a attempt 1 passed its warn_after with 9s left before its complete-by"));
    assert_eq!(rig.store.alerts(10).await.unwrap().len(), 1, "listed with the other alerts");

    // a answers; b starts at +11 s (at risk at +21 s) and answers at once.
    rig.gate.answer("a", 1, Answer::Succeed);
    rig.running(&id, "b", 1).await;
    rig.gate.answer("b", 1, Answer::Succeed);
    assert_eq!(rig.client.wait(&id, PATIENCE).await.unwrap(), TaskState::Processed);
    assert!(rig.at_risk().await.is_empty(), "a finished task is not at risk");
    rig.clock.advance(Duration::from_secs(15));
    assert_eq!(rig.round().await, 0, "b finished before its warning point");
    assert_eq!(of_kind(&rig.history(&id).await, EventKind::AtRisk).len(), 1);
    rig.finish(&id).await;
}

/// Each attempt has its own warning point: an attempt retried after a
/// warning warns again when it passes its own.
async fn a_retried_attempt_warns_again(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let id = rig.submit("steps-warned", "w-2").await;
    rig.running(&id, "a", 1).await;
    rig.clock.advance(Duration::from_secs(11));
    assert_eq!(rig.round().await, 1);
    rig.gate.answer("a", 1, Answer::FailTransiently);
    // The retry waits out a backoff of at most 100 ms on the store's clock.
    let started = std::time::Instant::now();
    loop {
        let record = rig.store.task(&id).await.unwrap().unwrap();
        if record.steps[0].attempt == 2 && record.steps[0].state == StepState::Running {
            break;
        }
        assert!(started.elapsed() < PATIENCE, "a was not retried: {record:#?}");
        rig.clock.advance(Duration::from_millis(20));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rig.round().await, 0, "the new attempt is not at risk yet");
    rig.clock.advance(Duration::from_secs(11));
    assert_eq!(rig.round().await, 1, "the second attempt passed its own warning point");
    assert_eq!(rig.round().await, 0);
    let history = rig.history(&id).await;
    let attempts: Vec<Option<u32>> = of_kind(&history, EventKind::AtRisk).iter().map(|e| e.attempt).collect();
    assert_eq!(attempts, [Some(1), Some(2)], "one warning per attempt");
    rig.gate.answer("a", 2, Answer::Succeed);
    rig.running(&id, "b", 1).await;
    rig.gate.answer("b", 1, Answer::Succeed);
    rig.finish(&id).await;
}

/// A workflow's own `warn_after` warns once per lease, about the task: an
/// `at_risk` event and an alert without a step, and the task is listed at
/// risk until it finishes.
async fn a_task_past_its_warning_point_raises_one_warning(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let id = rig.submit("task-warned", "w-3").await;
    rig.running(&id, "only", 1).await;
    let task = rig.store.task(&id).await.unwrap().unwrap().task;
    assert_eq!(task.warn_at.map(|at| at.since(task.complete_by.unwrap().sub(Duration::from_secs(28)))), Some(Duration::from_secs(10)));
    assert_eq!(rig.round().await, 0);
    assert!(rig.at_risk().await.is_empty());
    rig.clock.advance(Duration::from_secs(11));
    assert_eq!(rig.round().await, 1, "the lease passed its warning point");
    assert_eq!(rig.round().await, 0, "once per lease");
    let history = rig.history(&id).await;
    let at_risk = of_kind(&history, EventKind::AtRisk);
    assert_eq!(at_risk.len(), 1, "{history:#?}");
    assert_eq!(at_risk[0].step, None, "about the task");
    let alerts = of_kind(&history, EventKind::Alert);
    assert_eq!(alerts[0].detail["reason"], json!("the task passed its warn_after with 17s left before its complete-by"));
    assert_eq!(rig.at_risk().await, ["w-3"]);
    let record = rig.store.task(&id).await.unwrap().unwrap();
    assert_eq!(record.task.at_risk_since, Some(rig.clock.now()));

    rig.gate.answer("only", 1, Answer::Succeed);
    assert_eq!(rig.client.wait(&id, PATIENCE).await.unwrap(), TaskState::Processed);
    assert!(rig.at_risk().await.is_empty(), "at risk no more once finished");
    assert_eq!(rig.store.task(&id).await.unwrap().unwrap().task.at_risk_since, None);
    rig.finish(&id).await;
}

/// A task with a reply queue gets its `at_risk` events there, a step's and
/// the task's own, each once and in history order among its other status
/// events, as the application reads them after the task ended.
async fn a_warning_is_sent_to_the_reply_queue(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let replies = QueueName::new("app.status").unwrap();
    for (workflow, id) in [("steps-warned", "r-steps"), ("task-warned", "r-task")] {
        let submission = Submission::new(WorkflowName::new(workflow).unwrap(), json!({}))
            .with_id(TaskId::new(id).unwrap())
            .with_reply_queue(replies.clone());
        rig.client.submit(submission).await.unwrap();
    }
    let (steps, task) = (TaskId::new("r-steps").unwrap(), TaskId::new("r-task").unwrap());
    rig.running(&steps, "a", 1).await;
    rig.running(&task, "only", 1).await;
    rig.clock.advance(Duration::from_secs(11));
    assert_eq!(rig.round().await, 2, "step a's attempt and r-task's lease passed their warning points");
    assert_eq!(rig.round().await, 0);
    rig.gate.answer("only", 1, Answer::Succeed);
    rig.gate.answer("a", 1, Answer::Succeed);
    rig.running(&steps, "b", 1).await;
    rig.gate.answer("b", 1, Answer::Succeed);
    assert_eq!(rig.client.wait(&task, PATIENCE).await.unwrap(), TaskState::Processed);
    // Both must have ended before their messages are read: r-steps'
    // last commit may still be on its way when r-task's is done.
    assert_eq!(rig.client.wait(&steps, PATIENCE).await.unwrap(), TaskState::Processed);

    let messages = common::drain_status(&rig.store, &replies).await;
    let of = |id: &TaskId| messages.iter().filter(|m| &m.correlation_id == id).collect::<Vec<_>>();
    let kinds = |id: &TaskId| of(id).iter().map(|m| (m.event.clone(), m.step.clone(), m.attempt)).collect::<Vec<_>>();
    let kind = |event: &str, step: Option<&str>, attempt: Option<u32>| (event.to_owned(), step.map(str::to_owned), attempt);
    assert_eq!(
        kinds(&steps),
        [
            kind("received", None, None),
            kind("at_risk", Some("a"), Some(1)),
            kind("step_completed", Some("a"), Some(1)),
            kind("step_completed", Some("b"), Some(1)),
            kind("processed", None, None),
        ]
    );
    assert_eq!(
        kinds(&task),
        [
            kind("received", None, None),
            kind("at_risk", None, None),
            kind("step_completed", Some("only"), Some(1)),
            kind("processed", None, None)
        ]
    );
    for id in [&steps, &task] {
        let at_risk = of(id).into_iter().find(|m| m.event == "at_risk").unwrap();
        let event = of_kind(&rig.history(id).await, EventKind::AtRisk)[0].clone();
        assert_eq!((at_risk.at, &at_risk.detail), (event.at.as_millis(), &event.detail), "{id}: the message carries the event");
        assert_eq!(at_risk.state, TaskState::Processing, "{id}");
    }
    rig.finish(&steps).await;
}

on_each_backend!(
    a_step_past_its_warning_point_raises_one_warning,
    a_retried_attempt_warns_again,
    a_task_past_its_warning_point_raises_one_warning,
    a_warning_is_sent_to_the_reply_queue,
);
