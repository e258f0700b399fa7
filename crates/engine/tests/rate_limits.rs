//! Rate limits end to end on each backend: the `http` agent calling a real
//! HTTP server on loopback (wiremock, with a responder that notes when
//! each call arrived), through engines sharing one store.
//!
//! - A call held for its slot spends nothing: with the store's clock in
//!   the test's hands, the held step keeps its attempt, the task its
//!   failure count, and the Supervisor does not time the step out while
//!   the clock passes its original complete-by.
//! - Two engines ("processes": on PostgreSQL two stores on one schema)
//!   calling one endpoint limited to 20/s, burst 5: in every 10 s window of
//!   the server's clock it receives at most 20 × 10 + 5 calls, and every
//!   task ends Processed without a failure. The steps' timeout (2 s) is far
//!   shorter than the queue of calls (about 12 s), so only held requests'
//!   moved deadlines let the last ones through without failing.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rota_agent::HttpAgent;
use rota_engine::engine::Config;
use rota_engine::{Engine, Roles, Shutdown, Submission};
use rota_model::{
    Clock, InstanceId, ManualClock, RateLimit, RetryPolicy, StepState, SystemClock, TaskId, TaskState, Timestamp, WorkflowName,
};
use rota_store::{SharedStore, TaskRecord};
use rota_workflow::{AgentCatalog, StepDef, Workflow};
use serde_json::json;
use wiremock::{Mock, MockServer, Request as Received, Respond, ResponseTemplate};

use common::Backend;

const START: Timestamp = Timestamp::from_millis(1_800_000_000_000);
/// How long the test waits, in real time, for the engine to get somewhere.
const PATIENCE: Duration = Duration::from_secs(60);

on_each_backend!(a_held_call_spends_nothing_and_its_deadline_moves, a_rate_held_across_two_processes_bounds_every_window);

/// Answers 200 `{}` and notes when each call arrived, on the server's clock.
#[derive(Clone, Default)]
struct Arrivals(Arc<Mutex<Vec<Instant>>>);

impl Respond for Arrivals {
    fn respond(&self, _request: &Received) -> ResponseTemplate {
        self.0.lock().unwrap().push(Instant::now());
        ResponseTemplate::new(200).set_body_json(json!({}))
    }
}

impl Arrivals {
    fn times(&self) -> Vec<Instant> {
        self.0.lock().unwrap().clone()
    }
}

async fn server() -> (MockServer, Arrivals) {
    let server = MockServer::start().await;
    let arrivals = Arrivals::default();
    Mock::given(wiremock::matchers::any()).respond_with(arrivals.clone()).mount(&server).await;
    (server, arrivals)
}

/// One `http` GET of `input.url`, limited to `rate`; one failure ends it.
fn limited(rate: RateLimit, timeout: Duration, deadline: Duration) -> Workflow {
    Workflow::builder("limited", 1)
        .deadline(deadline)
        .max_failures(1)
        .step(
            StepDef::new("get", "http")
                .with_input(json!({ "method": "GET", "url": "{{ input.url }}" }))
                .timeout(timeout)
                .retry(RetryPolicy::new(1, Duration::from_millis(10), Duration::from_millis(10)).unwrap())
                .rate_limit(rate),
        )
        .build(&AgentCatalog::builtin())
        .unwrap()
}

fn engine(store: SharedStore, clock: Arc<dyn Clock>, name: &str, roles: Roles, rate_wait: Duration, workflow: Workflow) -> Engine {
    let mut config = Config::new(InstanceId::new(name).unwrap());
    config.roles = roles;
    config.supervisor = config.supervisor.every(Duration::from_millis(50));
    config.scheduler.claim_wait = Duration::from_millis(100);
    config.agent_rate_wait = rate_wait;
    config.agent_concurrency = 32;
    Engine::new(store, clock.clone(), config).agent(Arc::new(HttpAgent::new(clock).unwrap())).workflow(workflow)
}

async fn record(store: &SharedStore, id: &TaskId) -> TaskRecord {
    store.task(id).await.unwrap().unwrap()
}

/// Waits, in real time, until `done` holds for the record of `id`.
async fn until(store: &SharedStore, id: &TaskId, what: &str, done: impl Fn(&TaskRecord) -> bool) -> TaskRecord {
    let started = Instant::now();
    loop {
        let record = record(store, id).await;
        if done(&record) {
            return record;
        }
        assert!(started.elapsed() < PATIENCE, "task {id}: {what} never happened: {record:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// 1/m, no in-process wait: of two tasks, one calls at once and the other
/// is held for a minute. The held step's complete-by moves by that minute
/// (its 10 s timeout passes on the clock and the Supervisor, running all
/// along, does not time it out), it keeps attempt 1 and the task a failure
/// count of 0; when the slot comes, the call is made and the task ends
/// Processed, having called the endpoint once.
async fn a_held_call_spends_nothing_and_its_deadline_moves(backend: Backend) {
    let clock = Arc::new(ManualClock::new(START));
    let Some(db) = common::open(backend, clock.clone()).await else { return };
    let (server, arrivals) = server().await;
    let rate = "1/m".parse::<RateLimit>().unwrap();
    let workflow = limited(rate, Duration::from_secs(10), Duration::from_secs(600));
    let engine = engine(db.store.clone(), clock.clone(), "solo", Roles::ALL, Duration::ZERO, workflow);
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    let shutdown = Shutdown::new();
    let running = tokio::spawn(engine.run(shutdown.clone()));

    let input = json!({ "url": format!("{}/orders", server.uri()) });
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(client.submit(Submission::new(WorkflowName::new("limited").unwrap(), input.clone())).await.unwrap().id);
    }
    // One of the two calls goes at once; the other is held.
    let started = Instant::now();
    let (done, held) = loop {
        let (a, b) = (record(&db.store, &ids[0]).await, record(&db.store, &ids[1]).await);
        let moved = |r: &TaskRecord| r.steps[0].complete_by.is_some_and(|by| by > START + Duration::from_secs(50));
        match (a.task.state, b.task.state) {
            (TaskState::Processed, _) if moved(&b) => break (a, b),
            (_, TaskState::Processed) if moved(&a) => break (b, a),
            _ => assert!(started.elapsed() < PATIENCE, "no call went and the other held: {a:#?} {b:#?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(done.task.failure_count, 0);
    let step = &held.steps[0];
    assert_eq!((step.state, step.attempt, held.task.failure_count), (StepState::Running, 1, 0), "{held:#?}");
    let complete_by = step.complete_by.unwrap();
    assert!(complete_by >= START + Duration::from_secs(60), "the deadline moved by the minute held: {complete_by} {held:#?}");
    assert_eq!(arrivals.times().len(), 1, "the held call was not made");

    // Past the step's own 10 s timeout, before the slot: the Supervisor
    // (every 50 ms) finds nothing to time out.
    clock.advance(Duration::from_secs(30));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = record(&db.store, &held.task.id).await;
    assert_eq!(
        (still.task.state, still.steps[0].state, still.steps[0].attempt, still.task.failure_count),
        (TaskState::Processing, StepState::Running, 1, 0),
        "{still:#?}"
    );

    clock.advance(Duration::from_secs(31));
    let finished = until(&db.store, &held.task.id, "Processed", |r| r.task.state == TaskState::Processed).await;
    assert_eq!((finished.steps[0].attempt, finished.task.failure_count), (1, 0), "{finished:#?}");
    assert_eq!(arrivals.times().len(), 2, "each task called once");
    shutdown.trigger();
    running.await.unwrap().unwrap();
}

/// 20/s, burst 5, one endpoint, two engines sharing the store (one with
/// every role, one only agents): 240 tasks. Counted on the server's clock,
/// no 10 s window holds more than 205 calls; every task ends Processed
/// with one attempt and no failure.
async fn a_rate_held_across_two_processes_bounds_every_window(backend: Backend) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let Some(db) = common::open(backend, clock.clone()).await else { return };
    let other_store = db.another_process(clock.clone()).await;
    let (server, arrivals) = server().await;
    let rate = "20/s".parse::<RateLimit>().unwrap().with_burst(5).unwrap();
    let workflow = || limited(rate, Duration::from_secs(2), Duration::from_secs(300));
    let rate_wait = Duration::from_millis(500);
    let first = engine(db.store.clone(), clock.clone(), "first", Roles::ALL, rate_wait, workflow());
    let agents_only = Roles { scheduler: false, supervisor: false, agents: true };
    let second = engine(other_store, clock.clone(), "second", agents_only, rate_wait, workflow());
    first.register_workflows().await.unwrap();
    let client = first.client();
    let shutdown = Shutdown::new();
    let running = [tokio::spawn(first.run(shutdown.clone())), tokio::spawn(second.run(shutdown.clone()))];

    let input = json!({ "url": format!("{}/orders", server.uri()) });
    let mut ids = Vec::new();
    for _ in 0..240 {
        ids.push(client.submit(Submission::new(WorkflowName::new("limited").unwrap(), input.clone())).await.unwrap().id);
    }
    for id in &ids {
        let record = until(&db.store, id, "Processed", |r| r.task.state.is_terminal()).await;
        assert_eq!((record.task.state, record.steps[0].attempt, record.task.failure_count), (TaskState::Processed, 1, 0), "{record:#?}");
    }
    let mut times = arrivals.times();
    times.sort();
    assert_eq!(times.len(), 240, "one call per task");
    let window = Duration::from_secs(10);
    let busiest = (0..times.len()).map(|i| times[i..].iter().take_while(|t| t.duration_since(times[i]) < window).count()).max().unwrap();
    println!("busiest 10 s window: {busiest} calls (bound 205); all 240 took {:?}", times[239].duration_since(times[0]));
    assert!(busiest <= 20 * 10 + 5, "{busiest} calls in 10 s, over 20/s × 10 s + burst 5");
    shutdown.trigger();
    for role in running {
        role.await.unwrap().unwrap();
    }
}
