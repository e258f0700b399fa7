//! A Supervisor leader paused (SIGSTOP) past its leader lease, then resumed
//! (SIGCONT) while another leads: two `rota serve` processes on one
//! PostgreSQL schema, a stream of tasks (some whose steps time out, so that
//! the Supervisor reports them; all with short deadlines, so that the
//! paused process's tasks are expired and reset by the other) and a
//! schedule firing every second. The other process must take over, and
//! after the resumption nothing may be done twice: no fire started twice,
//! no lease expired twice, no step attempt ended twice, no step completed
//! twice; every task ends.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{Serve, Submitter, history_violations, open_postgres};
use rota_model::InstanceId;
use rota_store::{EventKind, SharedStore, TaskFilter};
use rota_testkit::postgres::TestSchema;

/// Supervisor rounds every 200 ms: its leader lease lasts 1 s.
const SUPERVISOR_INTERVAL: &str = "200ms";
/// How long the leader stays stopped: many leader leases, and longer than
/// the deadlines below, so that the tasks it holds are expired meanwhile.
const PAUSE: Duration = Duration::from_secs(6);
/// How long the other process may take to lead once the lease ran out.
const TAKEOVER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long every task may take to end after the resumption.
const FINISH_TIMEOUT: Duration = Duration::from_secs(90);

/// Three steps within a 3 s deadline, and a schedule every second.
const WORK: &str = "name: work\nversion: 1\ndeadline: 3s\nsteps:\n\
  - { name: a, agent: delay, with: { ms: 200 } }\n\
  - { name: b, depends_on: [a], agent: delay, with: { ms: 200 } }\n\
  - { name: c, depends_on: [b], agent: delay, with: { ms: 200 } }\n\
  schedules:\n  - { name: tick, cron: \"* * * * * *\", overlap: allow, catch_up: all }\n";
/// A step that never answers in time: each attempt times out and is
/// reported by the Supervisor; the task ends in Error.
const STALL: &str = "name: stall\nversion: 1\ndeadline: 3s\nmax_failures: 2\non_exhausted: error\nsteps:\n\
  - { name: hang, agent: delay, with: { for: 10s }, timeout: 300ms, retry: { attempts: 2, backoff: 100ms, max_backoff: 100ms } }\n";

/// The instance holding the Supervisors' leader lease, if any.
fn leader(runtime: &tokio::runtime::Runtime, store: &SharedStore) -> Option<InstanceId> {
    runtime.block_on(store.leader("supervisor")).unwrap().map(|lease| lease.holder)
}

#[test]
fn postgres_supervisor_leader_paused_past_its_lease_then_resumed() {
    let Some(schema) = TestSchema::new("Supervisor leader paused on PostgreSQL") else { return };
    let store_url = format!("{}?schema={}&connections=4", schema.url, schema.name);
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join("workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    std::fs::write(workflows.join("work.yaml"), WORK).unwrap();
    std::fs::write(workflows.join("stall.yaml"), STALL).unwrap();

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let store = open_postgres(&runtime, &schema);
    let serve = |id: &str| {
        let args = ["--workflows", workflows.to_str().unwrap(), "--instance-id", id, "--supervisor-interval", SUPERVISOR_INTERVAL];
        Serve::start(&store_url, &[&args[..], &["--listen", "none"]].concat())
    };
    let serves = [("a", serve("a")), ("b", serve("b"))];

    // A steady stream of tasks, so that the leader holds some when stopped.
    let submitter = Submitter::start(&store_url, |n| if n % 4 == 3 { "stall" } else { "work" });

    // Stop the leader while it holds tasks, so that their leases run out.
    let deadline = Instant::now() + TAKEOVER_TIMEOUT;
    let paused = loop {
        if let Some(holder) = leader(&runtime, &store) {
            let held = TaskFilter { locked_by: Some(holder.clone()), limit: 10, ..TaskFilter::default() };
            if runtime.block_on(store.list_tasks(&held)).unwrap().len() >= 2 {
                break holder;
            }
        }
        assert!(Instant::now() < deadline, "no Supervisor leader held two tasks within {TAKEOVER_TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let (_, paused_serve) = serves.iter().find(|(id, _)| *id == paused.as_str()).expect("the leader is one of the two");
    let other = serves.iter().find(|(id, _)| *id != paused.as_str()).unwrap().0;
    assert_eq!(unsafe { libc::kill(paused_serve.pid(), libc::SIGSTOP) }, 0);
    let stopped_at = Instant::now();
    let took_over = loop {
        if leader(&runtime, &store).is_some_and(|holder| holder.as_str() == other) {
            break stopped_at.elapsed();
        }
        assert!(stopped_at.elapsed() < TAKEOVER_TIMEOUT, "{other} did not take over from the stopped {paused}");
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(PAUSE.saturating_sub(stopped_at.elapsed()));
    assert_eq!(leader(&runtime, &store).map(|holder| holder.to_string()).as_deref(), Some(other), "{other} leads to the end of the pause");
    assert_eq!(unsafe { libc::kill(paused_serve.pid(), libc::SIGCONT) }, 0);
    std::thread::sleep(Duration::from_secs(3));
    let submitted = submitter.stop();

    // Every task ends.
    let filter = TaskFilter { limit: 10_000, ..TaskFilter::default() };
    let deadline = Instant::now() + FINISH_TIMEOUT;
    let tasks = loop {
        let tasks = runtime.block_on(store.list_tasks(&filter)).unwrap();
        let unfinished: Vec<String> = tasks.iter().filter(|t| !t.state.is_terminal()).map(|t| format!("{} {:?}", t.id, t.state)).collect();
        if unfinished.is_empty() {
            break tasks;
        }
        assert!(Instant::now() < deadline, "unfinished after {FINISH_TIMEOUT:?}: {unfinished:?}\n{}", serves[0].1.log());
        std::thread::sleep(Duration::from_millis(250));
    };
    drop(serves);

    let mut problems = Vec::new();
    let mut expired_from_paused = 0;
    let mut fires = BTreeSet::new();
    for task in &tasks {
        let history = runtime.block_on(store.history(&task.id)).unwrap();
        problems.extend(history_violations(task.id.as_str(), &history));
        expired_from_paused +=
            history.iter().filter(|e| e.kind == EventKind::Expired && e.detail["previous_holder"] == paused.as_str()).count();
        if task.id.as_str().starts_with("tick@") {
            assert!(fires.insert(task.id.to_string()));
        }
    }
    eprintln!(
        "{} tasks ({} fires), {other} led {took_over:?} after {paused} stopped, {expired_from_paused} of {paused}'s leases expired",
        tasks.len(),
        fires.len()
    );
    assert!(problems.is_empty(), "{} problems, e.g. {:?}", problems.len(), &problems[..problems.len().min(10)]);
    assert_eq!(tasks.len() - fires.len(), submitted, "one task per submission");
    assert!(fires.len() >= 8, "the schedule fired through the pause: {} fires", fires.len());
    assert!(expired_from_paused > 0, "the pause expired none of {paused}'s tasks: the fault was not exercised");
    drop(schema);
}
