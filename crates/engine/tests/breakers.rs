//! Circuit breakers shared through the store, end to end on each backend:
//! the `http` agent calling a real HTTP server on loopback (wiremock) that
//! is down (503) while the store's clock, in the test's hands, reads
//! before `START + OUTAGE`, and up from then on. Two engines ("processes":
//! on PostgreSQL two stores on one schema) run the agents.
//!
//! With shared breakers, the breaker opens after two failures from any
//! process and every request for the endpoint is held (given back until
//! the breaker lets a probe through, its step's complete-by moved): once
//! every task is held, the clock jumps past the outage, one probe closes
//! the breaker and the held work is released. Every task ends Processed on
//! its first attempt with no failure counted.
//!
//! Without the breaker (shared breakers off, the agents' own breakers set
//! never to open), the same outage is counted until each task's first
//! attempt has spent its three tries: a lower bound of what the endpoint
//! sees without a breaker. The shared breaker's count is bounded by the
//! calls in flight when it opens. Both counts are printed.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rota_agent::{BreakerConfig, HttpAgent, HttpConfig};
use rota_engine::breakers::SharedBreakerConfig;
use rota_engine::engine::Config;
use rota_engine::{Engine, Roles, Shutdown, Submission};
use rota_model::{Clock, InstanceId, ManualClock, RetryPolicy, StepState, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{SharedBreakerState, SharedStore, TaskRecord};
use rota_workflow::{AgentCatalog, StepDef, Workflow};
use serde_json::json;
use wiremock::{Mock, MockServer, Request as Received, Respond, ResponseTemplate};

use common::Backend;

const START: Timestamp = Timestamp::from_millis(1_800_000_000_000);
/// How long the endpoint is down, on the store's clock.
const OUTAGE: Duration = Duration::from_secs(10);
/// How long the test waits, in real time, for the engines to get somewhere.
const PATIENCE: Duration = Duration::from_secs(60);
const TASKS: usize = 40;
/// Tries per attempt of the step.
const TRIES: u32 = 3;
/// Calls each engine runs at once.
const CONCURRENCY: usize = 4;
/// The step's timeout: a held step's complete-by moves to at least the
/// outage's end plus this.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

on_each_backend!(an_outage_holds_work_behind_a_shared_breaker_and_releases_it_after);

/// Down (503) while `clock` reads before `START + OUTAGE`; counts the calls
/// of each phase.
#[derive(Clone)]
struct Endpoint {
    clock: Arc<ManualClock>,
    during_outage: Arc<AtomicU64>,
    after: Arc<AtomicU64>,
}

impl Respond for Endpoint {
    fn respond(&self, _request: &Received) -> ResponseTemplate {
        if self.clock.now() < START + OUTAGE {
            self.during_outage.fetch_add(1, Ordering::SeqCst);
            ResponseTemplate::new(503).set_body_string("down")
        } else {
            self.after.fetch_add(1, Ordering::SeqCst);
            ResponseTemplate::new(200).set_body_json(json!({}))
        }
    }
}

async fn endpoint(clock: Arc<ManualClock>) -> (MockServer, Endpoint) {
    let server = MockServer::start().await;
    let endpoint = Endpoint { clock, during_outage: Arc::default(), after: Arc::default() };
    Mock::given(wiremock::matchers::any()).respond_with(endpoint.clone()).mount(&server).await;
    (server, endpoint)
}

/// One `http` GET of `input.url`: three tries 10 ms apart per attempt, up
/// to five failures.
fn workflow() -> Workflow {
    Workflow::builder("flaky", 1)
        .deadline(Duration::from_secs(3_600))
        .max_failures(5)
        .step(
            StepDef::new("get", "http")
                .with_input(json!({ "method": "GET", "url": "{{ input.url }}" }))
                .timeout(STEP_TIMEOUT)
                .retry(RetryPolicy::new(TRIES, Duration::from_millis(10), Duration::from_millis(10)).unwrap()),
        )
        .build(&AgentCatalog::builtin())
        .unwrap()
}

/// An engine; `shared`: the breakers shared through the store (opening at
/// two failures), else none at all (the agent's own never opens).
fn engine(store: SharedStore, clock: Arc<ManualClock>, name: &str, roles: Roles, shared: bool) -> Engine {
    let clock: Arc<dyn Clock> = clock;
    let mut config = Config::new(InstanceId::new(name).unwrap());
    config.roles = roles;
    config.supervisor = config.supervisor.every(Duration::from_millis(50));
    config.scheduler.claim_wait = Duration::from_millis(100);
    config.agent_concurrency = CONCURRENCY;
    config.agent_breakers = shared.then(|| SharedBreakerConfig { failures_to_open: 2, ..SharedBreakerConfig::default() });
    let never_opens = BreakerConfig::new(rota_agent::breaker::FAILURES_TO_OPEN_LIMIT, Duration::from_secs(10)).unwrap();
    let http = HttpAgent::with_config(HttpConfig { breaker: never_opens, ..HttpConfig::default() }, clock.clone()).unwrap();
    Engine::new(store, clock, config).agent(Arc::new(http)).workflow(workflow())
}

async fn record(store: &SharedStore, id: &TaskId) -> TaskRecord {
    store.task(id).await.unwrap().unwrap()
}

/// Waits, in real time, until `done` holds for every task's record.
async fn until_all(store: &SharedStore, ids: &[TaskId], what: &str, done: impl Fn(&TaskRecord) -> bool) -> Vec<TaskRecord> {
    let started = Instant::now();
    loop {
        let mut records = Vec::new();
        for id in ids {
            records.push(record(store, id).await);
        }
        if records.iter().all(&done) {
            return records;
        }
        let pending: Vec<&TaskRecord> = records.iter().filter(|r| !done(r)).collect();
        assert!(started.elapsed() < PATIENCE, "{what} never happened for {} task(s): {:#?}", pending.len(), pending.first());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs two engines on a fresh store, submits the tasks; returns the
/// store, the endpoint, the task ids and what to stop.
struct Run {
    store: SharedStore,
    clock: Arc<ManualClock>,
    endpoint: Endpoint,
    ids: Vec<TaskId>,
    shutdown: Shutdown,
    running: Vec<tokio::task::JoinHandle<rota_engine::Result<()>>>,
    _server: MockServer,
    _db: common::TestStore,
}

async fn start(backend: Backend, shared: bool) -> Option<Run> {
    let clock = Arc::new(ManualClock::new(START));
    let db = common::open(backend, clock.clone()).await?;
    let other_store = db.another_process(clock.clone()).await;
    let (server, endpoint) = endpoint(clock.clone()).await;
    let first = engine(db.store.clone(), clock.clone(), "first", Roles::ALL, shared);
    let agents_only = Roles { scheduler: false, supervisor: false, agents: true };
    let second = engine(other_store, clock.clone(), "second", agents_only, shared);
    first.register_workflows().await.unwrap();
    let client = first.client();
    let shutdown = Shutdown::new();
    let running = vec![tokio::spawn(first.run(shutdown.clone())), tokio::spawn(second.run(shutdown.clone()))];
    let input = json!({ "url": format!("{}/orders", server.uri()) });
    let mut ids = Vec::new();
    for _ in 0..TASKS {
        ids.push(client.submit(Submission::new(WorkflowName::new("flaky").unwrap(), input.clone())).await.unwrap().id);
    }
    Some(Run { store: db.store.clone(), clock, endpoint, ids, shutdown, running, _server: server, _db: db })
}

impl Run {
    async fn stop(self) {
        self.shutdown.trigger();
        for role in self.running {
            role.await.unwrap().unwrap();
        }
    }
}

async fn an_outage_holds_work_behind_a_shared_breaker_and_releases_it_after(backend: Backend) {
    // Without the breaker: the outage lasts until each task's first
    // attempt has spent its tries (the clock stands still meanwhile).
    let Some(baseline) = start(backend, false).await else { return };
    let floor = (TASKS as u64) * u64::from(TRIES);
    let started = Instant::now();
    while baseline.endpoint.during_outage.load(Ordering::SeqCst) < floor {
        assert!(started.elapsed() < PATIENCE, "the first attempts never spent their tries");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let without = baseline.endpoint.during_outage.load(Ordering::SeqCst);
    baseline.stop().await;

    let Some(run) = start(backend, true).await else { return };
    // Every task held: its step still on attempt 1, its complete-by moved
    // past the outage by the step's timeout, no failure counted.
    let held_by = START + OUTAGE + STEP_TIMEOUT;
    until_all(&run.store, &run.ids, "held", |r| {
        r.steps[0].state == StepState::Running && r.steps[0].complete_by.is_some_and(|by| by >= held_by)
    })
    .await;
    let breakers = run.store.shared_breakers().await.unwrap();
    assert_eq!(breakers.len(), 1, "{breakers:?}");
    assert_eq!((breakers[0].state, breakers[0].open_until), (SharedBreakerState::Open, Some(START + OUTAGE)), "{breakers:?}");
    let with = run.endpoint.during_outage.load(Ordering::SeqCst);
    assert!(run.store.statuses("breaker/").await.unwrap().is_empty(), "the agents' own breakers are not used");

    // The endpoint recovers; the clock moves on by a recheck at a time
    // until every task is done.
    run.clock.advance(OUTAGE);
    let started = Instant::now();
    let done = loop {
        let mut records = Vec::new();
        for id in &run.ids {
            records.push(record(&run.store, id).await);
        }
        if records.iter().all(|r| r.task.state.is_terminal()) {
            break records;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "the held work was never released: {:#?}",
            records.iter().find(|r| !r.task.state.is_terminal())
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        run.clock.advance(Duration::from_secs(1));
    };
    for record in &done {
        assert_eq!((record.task.state, record.steps[0].attempt, record.task.failure_count), (TaskState::Processed, 1, 0), "{record:#?}");
    }
    let breakers = run.store.shared_breakers().await.unwrap();
    assert_eq!((breakers[0].state, breakers[0].consecutive_failures), (SharedBreakerState::Closed, 0), "{breakers:?}");
    let after = run.endpoint.after.load(Ordering::SeqCst);
    println!(
        "calls during the {OUTAGE:?} outage, {TASKS} tasks: {with} with the shared breaker, at least {without} without a breaker; \
         {after} after it (one per task)"
    );
    assert_eq!(after, TASKS as u64, "one successful call per task once released");
    // Shared: at most the calls in flight when the breaker opened (two
    // tries per call in flight, per process). Without: at least three per
    // task.
    assert!(with <= 2 * 2 * CONCURRENCY as u64, "{with} calls reached the endpoint while its breaker should have been open");
    assert!(with * 5 <= without, "{with} calls with the breaker, {without} without");
    run.stop().await;
}
