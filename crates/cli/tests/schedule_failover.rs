//! The crash test for schedules: a schedule firing every second,
//! run by two `rota serve` processes on one PostgreSQL schema for about 20
//! seconds while the Supervisor leader is SIGKILLed and restarted (twice),
//! starts exactly one task per fire time, none missing.
//!
//! The schedule catches up `all` missed fires (and a fire is late only
//! after a minute), so the expected set is every whole second after the
//! schedule was declared up to the fire time it has handled last: a fire
//! the killed leader did not get to is fired by the next leader, and one it
//! started and did not record is found already created (same derived id).

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use rota_model::schedule::rfc3339_seconds;
use rota_model::{Clock, InstanceId, ScheduleName, SystemClock, Timestamp};
use rota_store::{EventKind, SharedStore, TaskFilter};
use rota_testkit::postgres::TestSchema;

/// How long a process may take to log that it started.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// The pool of each `rota serve`.
const CONNECTIONS_PER_PROCESS: u32 = 4;
/// The workflow and its schedule: every second, overlap allowed, every
/// missed fire caught up.
const TICK: &str = "name: tick\nversion: 1\nsteps:\n  - name: nap\n    agent: delay\n    with: { ms: 5 }\n\
                    schedules:\n  - name: every-second\n    cron: \"* * * * * *\"\n    overlap: allow\n    catch_up: all\n";

/// A `rota serve`, killed when dropped.
struct Serve {
    child: Child,
}

impl Serve {
    fn start(store: &str, workflows: &Path, instance: &str) -> Serve {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rota"));
        command.args(["--store", store, "serve", "--workflows", workflows.to_str().unwrap(), "--instance-id", instance]);
        command.args(["--supervisor-interval", "200ms", "--listen", "127.0.0.1:0"]);
        command.env_remove("ROTA_STORE").env("RUST_LOG", "info").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("rota serve starts");
        let (sender, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // Keep draining after nobody listens, so the child never blocks.
                let _ = sender.send(line);
            }
        });
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let mut seen = Vec::new();
        loop {
            match lines.recv_timeout(Duration::from_millis(200)) {
                Ok(line) if line.contains("rota serve started") => return Serve { child },
                Ok(line) => seen.push(line),
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("rota serve {instance} did not start:\n{}", seen.join("\n"));
                }
            }
        }
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The instance holding the Supervisors' leader lease, waiting for one.
fn leader(runtime: &tokio::runtime::Runtime, store: &SharedStore) -> InstanceId {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(lease) = runtime.block_on(store.leader("supervisor")).unwrap() {
            return lease.holder;
        }
        assert!(Instant::now() < deadline, "no Supervisor leads");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn postgres_two_serves_fire_every_second_once_across_leader_sigkills() {
    let Some(schema) = TestSchema::new("schedule failover on PostgreSQL") else { return };
    let store_url = format!("{}?schema={}&connections={CONNECTIONS_PER_PROCESS}", schema.url, schema.name);
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join("workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    std::fs::write(workflows.join("tick.yaml"), TICK).unwrap();

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = common::open_postgres(&runtime, &schema);

    let started = Instant::now();
    let mut serves = vec![("a", Serve::start(&store_url, &workflows, "a")), ("b", Serve::start(&store_url, &workflows, "b"))];
    let name = ScheduleName::new("every-second").unwrap();
    let declared = runtime.block_on(store.schedule(&name)).unwrap().expect("rota serve declared the file's schedule");

    // Kill the leader twice, each time restarting it a few seconds later.
    let mut leaders = Vec::new();
    for (kill_at, restart_at) in [(Duration::from_secs(5), Duration::from_secs(9)), (Duration::from_secs(12), Duration::from_secs(15))] {
        std::thread::sleep(kill_at.saturating_sub(started.elapsed()));
        let holder = leader(&runtime, &store);
        leaders.push(holder.to_string());
        let index = serves.iter().position(|(id, _)| *id == holder.as_str()).expect("the leader is one of the two");
        let (id, serve) = serves.remove(index);
        serve.kill();
        std::thread::sleep(restart_at.saturating_sub(started.elapsed()));
        serves.push((id, Serve::start(&store_url, &workflows, id)));
    }
    std::thread::sleep(Duration::from_secs(20).saturating_sub(started.elapsed()));
    leaders.push(leader(&runtime, &store).to_string());
    for (_, serve) in serves {
        serve.kill();
    }

    let after = runtime.block_on(store.schedule(&name)).unwrap().unwrap();
    let fired_through = after.progress.fired_through;
    // Every whole second after the declaration, up to the last handled.
    // The declaration's time, not the progress read back: by the time the
    // test reads the schedule, the first leader may have fired already.
    let first = declared.created_at.as_millis() / 1000 + 1;
    let last = fired_through.as_millis().div_euclid(1000);
    let expected: BTreeSet<String> =
        (first..=last).map(|second| format!("every-second@{}", rfc3339_seconds(Timestamp::from_millis(second * 1000)))).collect();
    let filter = TaskFilter { limit: 10_000, ..TaskFilter::default() };
    let tasks = runtime.block_on(store.list_tasks(&filter)).unwrap();
    let ids: Vec<String> = tasks.iter().map(|t| t.id.to_string()).collect();
    let unique: BTreeSet<String> = ids.iter().cloned().collect();
    assert_eq!(unique.len(), ids.len(), "a task per id");
    let missing: Vec<&String> = expected.difference(&unique).collect();
    // The final kill may cut a round between its submissions and the
    // advance that records them: such fires are the ones right after the
    // last one recorded, in a row (the next leader would find them started).
    let cut_short: BTreeSet<String> = (last + 1..=last + i64::from(rota_engine::schedules::Config::default().fires_per_round))
        .map(|second| format!("every-second@{}", rfc3339_seconds(Timestamp::from_millis(second * 1000))))
        .collect();
    let extra: Vec<&String> = unique.difference(&expected).collect();
    let unexplained: Vec<&&String> = extra.iter().filter(|id| !cut_short.contains(**id)).collect();
    let in_a_row = extra.iter().zip(cut_short.iter()).all(|(found, next)| *found == next);
    assert!(
        missing.is_empty() && unexplained.is_empty() && in_a_row,
        "one task per fire time: missing {missing:?}, extra {extra:?} (leaders {leaders:?}, recorded through {last})"
    );
    assert!(expected.len() >= 15, "about 20 s of fires, {} found (leaders {leaders:?})", expected.len());
    let now = clock.now();
    assert!(now.since(fired_through) < Duration::from_secs(5), "it fired up to the end: {fired_through:?} at {now:?}");
    assert!(leaders.windows(2).any(|pair| pair[0] != pair[1]), "leadership moved: {leaders:?}");

    // Each task was created once, by a fire that says which.
    for task in tasks.iter().take(5) {
        let history = runtime.block_on(store.history(&task.id)).unwrap();
        let received: Vec<_> = history.iter().filter(|e| e.kind == EventKind::Received).collect();
        assert_eq!(received.len(), 1, "{}: one received event", task.id);
        assert_eq!(received[0].detail["schedule"]["name"], "every-second");
    }
    drop(schema);
}
