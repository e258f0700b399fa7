//! The database unreachable for longer than a lease, two ways: stalled
//! (connections stay open and hang, nothing answers) and cut (connections
//! closed, new ones refused). A `rota serve` reaches PostgreSQL through a
//! fault-injecting TCP proxy (`rota_testkit::proxy`) while tasks are
//! submitted straight to the database all along. The process must live
//! through both outages, and afterwards every task must end with nothing
//! done twice (each step attempt ended once, each step completed once, at
//! most one expiry per lease).

mod common;

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use common::{Serve, Submitter, history_violations, open_postgres};
use rota_store::{EventKind, SharedStore, TaskFilter};
use rota_testkit::postgres::TestSchema;
use rota_testkit::proxy::{FaultProxy, Mode};

/// Each outage: longer than the tasks' 2 s deadline (the lease a Scheduler
/// holds a task for), so that leases run out while the database is away.
const OUTAGE: Duration = Duration::from_secs(5);
/// How long after an outage began whatever was on the wire has landed.
const SETTLE: Duration = Duration::from_millis(500);
/// How long every task may take to end after the last outage.
const FINISH_TIMEOUT: Duration = Duration::from_secs(90);

/// Three short steps within a 2 s deadline.
const WORK: &str = "name: work\nversion: 1\ndeadline: 2s\nmax_failures: 20\nsteps:\n\
  - { name: a, agent: delay, with: { ms: 50 } }\n\
  - { name: b, depends_on: [a], agent: delay, with: { ms: 50 } }\n\
  - { name: c, depends_on: [b], agent: delay, with: { ms: 50 } }\n";

/// The host and port of a `postgres://user@host:port/db` URL.
fn address_of(url: &str) -> SocketAddr {
    let after_at = url.rsplit_once('@').map_or(url, |(_, rest)| rest);
    let host_port = after_at.split('/').next().unwrap();
    host_port.to_socket_addrs().expect("a host:port").next().unwrap()
}

/// How far the engine got: tasks claimed plus tasks ended (submissions,
/// which go straight to the database, are not counted).
fn progress(runtime: &tokio::runtime::Runtime, store: &SharedStore) -> usize {
    let tasks = runtime.block_on(store.list_tasks(&TaskFilter { limit: 10_000, ..TaskFilter::default() })).unwrap();
    tasks.iter().filter(|t| t.state != rota_model::TaskState::Pending).count() + tasks.iter().filter(|t| t.state.is_terminal()).count()
}

fn unfinished(runtime: &tokio::runtime::Runtime, store: &SharedStore) -> Vec<String> {
    let tasks = runtime.block_on(store.list_tasks(&TaskFilter { limit: 10_000, ..TaskFilter::default() })).unwrap();
    tasks.iter().filter(|t| !t.state.is_terminal()).map(|t| format!("{} {:?}", t.id, t.state)).collect()
}

#[test]
fn postgres_stalled_then_cut_past_a_lease_loses_nothing_and_doubles_nothing() {
    let Some(schema) = TestSchema::new("database stalled and cut on PostgreSQL") else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let upstream = address_of(&schema.url);
    let proxy = runtime.block_on(FaultProxy::start(upstream)).expect("the proxy listens");
    let direct_url = format!("{}?schema={}&connections=2", schema.url, schema.name);
    let proxied_url =
        format!("{}?schema={}&connections=4", schema.url.replacen(&upstream.to_string(), &proxy.addr().to_string(), 1), schema.name);
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join("workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    std::fs::write(workflows.join("work.yaml"), WORK).unwrap();

    let store = open_postgres(&runtime, &schema);
    let args = ["--workflows", workflows.to_str().unwrap(), "--instance-id", "solo", "--supervisor-interval", "200ms", "--listen", "none"];
    let mut serve = Serve::start(&proxied_url, &args);

    // Submissions straight to the database, before, during and after the
    // outages, as an API process elsewhere would take them.
    let submitter = Submitter::start(&direct_url, |_| "work");

    let mut faults = Vec::new();
    for mode in [Mode::Stall, Mode::Cut] {
        // Wait until the process holds tasks, so that the outage catches work in flight.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let held = TaskFilter { state: Some(rota_model::TaskState::Processing), limit: 10, ..TaskFilter::default() };
            if !runtime.block_on(store.list_tasks(&held)).unwrap().is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "no task was processing before the {mode:?}\n{}", serve.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        let in_flight = runtime.block_on(store.list_tasks(&TaskFilter { limit: 10_000, ..TaskFilter::default() })).unwrap();
        let in_flight = in_flight.iter().filter(|t| !t.state.is_terminal()).count();
        proxy.set(mode);
        // Past what was on the wire when it began, nothing moves: the
        // outage is real.
        std::thread::sleep(SETTLE);
        let moved_before = progress(&runtime, &store);
        std::thread::sleep(OUTAGE - SETTLE);
        assert_eq!(progress(&runtime, &store), moved_before, "tasks moved while the database was unreachable ({mode:?})");
        proxy.set(Mode::Pass);
        assert!(serve.child.try_wait().unwrap().is_none(), "rota serve exited during the {mode:?}:\n{}", serve.log());
        faults.push(format!("{mode:?} for {OUTAGE:?} with {in_flight} unfinished"));
        std::thread::sleep(Duration::from_secs(2));
    }
    let submitted = submitter.stop();

    let recovery_started = Instant::now();
    loop {
        let left = unfinished(&runtime, &store);
        if left.is_empty() {
            break;
        }
        assert!(recovery_started.elapsed() < FINISH_TIMEOUT, "unfinished after {FINISH_TIMEOUT:?}: {left:?}\n{}", serve.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let recovered_in = recovery_started.elapsed();
    assert!(serve.child.try_wait().unwrap().is_none(), "rota serve lived through both outages");

    let tasks = runtime.block_on(store.list_tasks(&TaskFilter { limit: 10_000, ..TaskFilter::default() })).unwrap();
    assert_eq!(tasks.len(), submitted, "one task per submission");
    let mut problems = Vec::new();
    let mut expired = 0;
    for task in &tasks {
        let history = runtime.block_on(store.history(&task.id)).unwrap();
        problems.extend(history_violations(task.id.as_str(), &history));
        expired += history.iter().filter(|e| e.kind == EventKind::Expired).count();
        assert_eq!(task.state, rota_model::TaskState::Processed, "{}: {:?} {:?}", task.id, task.state, task.error);
    }
    eprintln!("{submitted} tasks through {faults:?}; {expired} leases expired; all ended {recovered_in:?} after the last outage");
    assert!(problems.is_empty(), "{} problems, e.g. {:?}", problems.len(), &problems[..problems.len().min(10)]);
    drop(serve);
    drop(proxy);
    drop(schema);
}
