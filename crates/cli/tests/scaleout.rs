//! Scale-out on PostgreSQL with real processes: two `rota
//! scheduler`, three `rota agent` and two `rota supervisor` processes share
//! one database while a thousand tasks of a three-step workflow run. A
//! seeded chaos loop SIGKILLs a random process every couple of seconds and
//! starts a replacement with a fresh instance id; one variant also restarts
//! the PostgreSQL server in the middle. Afterwards: every task is Processed
//! (none lost), every step's idempotency key reached the service, each step
//! completed exactly once, and no step was called again after its
//! completion had been recorded.
//!
//! The service is an HTTP recorder in this test process, called by the
//! built-in `http` agent with each step's `Idempotency-Key`; it notes the
//! wall-clock time of every call, which the test compares with the time of
//! the step's `step_completed` event (the same machine's clock).
//!
//! Needs `ROTA_TEST_POSTGRES_URL`; the restart variant also needs the right
//! to run `pg_ctlcluster` (as `.ci/run` has). Without the URL each test
//! prints a `SKIP` line.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use rota_engine::{Client, Submission, Workflows};
use rota_model::{Clock, SystemClock, TaskId, TaskState, WorkflowName};
use rota_store::{EventKind, SharedStore, TaskFilter};
use rota_store_postgres::{Config, PgStore};
use rota_testkit::postgres::TestSchema;
use serde_json::json;

/// Tasks submitted per run.
const TASKS: usize = 1_000;
/// Steps per task.
const STEPS: usize = 3;
/// How often the chaos loop kills a process.
const KILL_EVERY: Duration = Duration::from_millis(1_800);
/// The fewest kills a run must have made for its verdict to count.
const KILLS_MIN: usize = 4;
/// How long the whole run may take before the test fails.
const RUN_TIMEOUT: Duration = Duration::from_secs(240);
/// How long a process may take to log that it started.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// The pool of each role process: seven of them (and their replacements,
/// while a killed one's connections linger) stay well within the server's
/// default of 100 connections.
const CONNECTIONS_PER_PROCESS: u32 = 4;
/// The chaos loop's seed (printed, so that a failure can be replayed).
const SEED: u64 = 0x5eed_0004;

/// A `rota` role process, killed when dropped.
struct Process {
    role: &'static str,
    instance: String,
    child: Child,
}

impl Process {
    /// Starts `rota <role>` and waits until it logs that it started. A
    /// process that exits first (the server restarting) is started again.
    fn start(role: &'static str, instance: String, store: &str, workflows: &Path) -> Process {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            let mut command = Command::new(env!("CARGO_BIN_EXE_rota"));
            command.args(["--store", store, role, "--workflows", workflows.to_str().unwrap(), "--instance-id", &instance]);
            match role {
                "agent" => command.args(["--queues", "http", "--max-concurrent", "16", "--shutdown-grace", "2s"]),
                "supervisor" => command.args(["--supervisor-interval", "200ms"]),
                _ => command.args(["--shutdown-grace", "2s"]),
            };
            command.env_remove("ROTA_STORE").env("RUST_LOG", "info").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
            let mut child = command.spawn().expect("rota starts");
            let (lines, stderr) = (mpsc::channel(), child.stderr.take().unwrap());
            let sender = lines.0;
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if sender.send(line).is_err() {
                        // Nobody listens any more; keep draining so the child never blocks.
                    }
                }
            });
            let mut seen = Vec::new();
            let started = loop {
                match lines.1.recv_timeout(Duration::from_millis(200)) {
                    Ok(line) if line.contains("rota serve started") => break true,
                    Ok(line) => seen.push(line),
                    Err(mpsc::RecvTimeoutError::Timeout) if child.try_wait().unwrap().is_none() => {}
                    Err(_) => break false,
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    panic!("rota {role} {instance} did not start within {STARTUP_TIMEOUT:?}:\n{}", seen.join("\n"));
                }
            };
            if started {
                return Process { role, instance, child };
            }
            let _ = child.wait();
            assert!(Instant::now() < deadline, "rota {role} {instance} kept exiting at startup:\n{}", seen.join("\n"));
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then the exit status (a graceful stop exits 0).
    fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "rota {} {} did not stop within 30 s of SIGTERM", self.role, self.instance);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.kill();
        }
    }
}

/// The service the steps call: records (idempotency key, arrival in ms).
type Calls = Arc<Mutex<Vec<(String, i64)>>>;

fn start_recorder() -> (String, Calls) {
    let calls: Calls = Arc::default();
    let recorded = calls.clone();
    let (ready, address) = mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(async move {
            let app = axum::Router::new().route(
                "/step",
                axum::routing::post(move |headers: axum::http::HeaderMap| {
                    let recorded = recorded.clone();
                    async move {
                        let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                        recorded.lock().unwrap().push((key, SystemClock.now().as_millis()));
                        // Long enough that kills land on calls in flight.
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        axum::Json(json!({ "ok": true }))
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            ready.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    let address = address.recv().unwrap();
    (format!("http://{address}/step"), calls)
}

/// A small seeded generator: the chaos loop must be replayable.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, bound: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % bound as u64) as usize
    }
}

/// What a run may do to the database server in the middle.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    KillsOnly,
    ServerRestart,
}

/// Restarts the server the test uses: its Debian cluster (found by port in
/// `pg_lsclusters`) with `pg_ctlcluster`, or else its data directory with
/// `pg_ctl` as the `postgres` user.
fn restart_postgres(url: &str) {
    let settings = Command::new("psql")
        .args([url, "-XAtc", "SELECT current_setting('port') || '|' || current_setting('data_directory')"])
        .output()
        .expect("psql runs");
    let settings = String::from_utf8_lossy(&settings.stdout).trim().to_owned();
    let (port, data_directory) = settings.split_once('|').expect("psql printed the port and the data directory");
    let (port, data_directory) = (port.to_owned(), data_directory.to_owned());
    let clusters = Command::new("pg_lsclusters").arg("--no-header").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let cluster = clusters.unwrap_or_default().lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.len() >= 3 && fields[2] == port).then(|| (fields[0].to_owned(), fields[1].to_owned()))
    });
    let status = match &cluster {
        Some((version, name)) => {
            Command::new("pg_ctlcluster").args(["--skip-systemctl-redirect", version, name, "restart", "-m", "fast"]).status()
        }
        None => {
            let version = std::fs::read_to_string(format!("{data_directory}/PG_VERSION")).expect("the data directory's PG_VERSION");
            let pg_ctl = format!("/usr/lib/postgresql/{}/bin/pg_ctl", version.trim());
            let restart = format!("{pg_ctl} -D {data_directory} -w -t 60 -m fast restart");
            Command::new("su").args(["postgres", "-s", "/bin/sh", "-c", &restart]).status()
        }
    };
    let status = status.expect("the restart command runs");
    assert!(status.success(), "restarting the server on port {port} ({cluster:?}, {data_directory}) failed: {status}");
}

fn run_scale_out(test: &str, fault: Fault) {
    let Some(schema) = TestSchema::new(test) else { return };
    // Seven processes share the server's connections (100 by default).
    let store_url = format!("{}?schema={}&connections={CONNECTIONS_PER_PROCESS}", schema.url, schema.name);
    let (service, calls) = start_recorder();
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join("workflows");
    std::fs::create_dir(&workflows).unwrap();
    let mut yaml = String::from("name: chain\nversion: 1\ndeadline: 10s\nmax_failures: 100\nsteps:\n");
    for i in 1..=STEPS {
        yaml.push_str(&format!(
            "  - name: s{i}\n    agent: http\n    timeout: 2s\n    retry: {{ attempts: 3, backoff: 50ms, max_backoff: 200ms }}\n    with: {{ method: POST, url: \"{service}\", body: {{ step: s{i} }} }}\n"
        ));
    }
    std::fs::write(workflows.join("chain.yaml"), yaml).unwrap();

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store: SharedStore = runtime.block_on(async {
        let mut config = Config::new(schema.url.clone());
        config.schema = schema.name.clone();
        config.connections_max = 4;
        Arc::new(PgStore::open(config, clock.clone()).await.expect("open the store"))
    });

    let roles: [(&'static str, usize); 3] = [("scheduler", 2), ("agent", 3), ("supervisor", 2)];
    let mut generation = 0;
    let mut next_instance = |role: &str| {
        generation += 1;
        format!("{role}-{generation}")
    };
    let mut processes: Vec<Process> = Vec::new();
    for (role, count) in roles {
        for _ in 0..count {
            processes.push(Process::start(role, next_instance(role), &store_url, &workflows));
        }
    }

    // Submit every task through the public client, a few at a time, while
    // the chaos below already runs.
    let client = Client::new(store.clone(), clock.clone(), Workflows::new(store.clone()), None);
    let ids: Vec<TaskId> = (0..TASKS).map(|i| TaskId::new(format!("order-{i:04}")).unwrap()).collect();
    let submitting = {
        let ids = ids.clone();
        runtime.spawn(async move {
            let mut submitting = tokio::task::JoinSet::new();
            for chunk in ids.chunks(TASKS / 8) {
                let (client, chunk) = (client.clone(), chunk.to_vec());
                submitting.spawn(async move {
                    for id in chunk {
                        // The id is the idempotency key: a submission cut by
                        // the server's restart is safe to send again.
                        loop {
                            let submission = Submission::new(WorkflowName::new("chain").unwrap(), json!({})).with_id(id.clone());
                            match client.submit(submission).await {
                                Ok(_) => break,
                                Err(rota_engine::Error::Store(err)) if err.is_retryable() => {
                                    tokio::time::sleep(Duration::from_millis(100)).await;
                                }
                                Err(err) => panic!("submit {id}: {err}"),
                            }
                        }
                    }
                });
            }
            while let Some(done) = submitting.join_next().await {
                done.unwrap();
            }
        })
    };

    // Chaos until every task is terminal: a kill every KILL_EVERY, and one
    // at each tenth of the tasks done, so that a fast run still gets its
    // share; the server restart (in that variant) at a third.
    let mut random = XorShift(SEED);
    let started = Instant::now();
    let mut kills: Vec<String> = Vec::new();
    let mut restarted = fault == Fault::KillsOnly;
    let mut last_kill = Instant::now();
    let mut next_checkpoint = TASKS / 10;
    loop {
        let terminal = runtime.block_on(count_terminal(&store));
        if terminal == TASKS {
            break;
        }
        assert!(
            started.elapsed() < RUN_TIMEOUT,
            "only {terminal} of {TASKS} tasks terminal after {RUN_TIMEOUT:?} (faults: {kills:?}, seed {SEED:#x})"
        );
        if !restarted && terminal >= TASKS / 3 {
            restart_postgres(&schema.url);
            restarted = true;
            kills.push(format!("postgres-restart at {terminal} done"));
        }
        let at_checkpoint = terminal >= next_checkpoint;
        if at_checkpoint || last_kill.elapsed() >= KILL_EVERY {
            if at_checkpoint {
                next_checkpoint = terminal - terminal % (TASKS / 10) + TASKS / 10;
            }
            let victim = random.below(processes.len());
            let mut process = processes.swap_remove(victim);
            process.kill();
            kills.push(format!("{} at {terminal} done", process.instance));
            let role = process.role;
            processes.push(Process::start(role, next_instance(role), &store_url, &workflows));
            last_kill = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let elapsed = started.elapsed();
    runtime.block_on(submitting).expect("the submissions finished");
    // A run that ended before enough chaos proves little.
    assert!(kills.len() >= KILLS_MIN, "the run ended after only {} kills ({kills:?}); it needs at least {KILLS_MIN}", kills.len());

    // Every process still running stops cleanly on SIGTERM.
    for process in processes {
        let (role, instance) = (process.role, process.instance.clone());
        let status = process.terminate();
        assert_eq!(status.code(), Some(0), "rota {role} {instance} did not exit 0 after SIGTERM: {status}");
    }

    // The verdict.
    let calls = calls.lock().unwrap().clone();
    let mut calls_by_key: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for (key, at) in &calls {
        calls_by_key.entry(key.as_str()).or_default().push(*at);
    }
    let mut called_after_completion = Vec::new();
    let mut not_applied = Vec::new();
    let mut not_processed = Vec::new();
    let mut completed_twice = Vec::new();
    let records = runtime.block_on(async {
        let mut records = Vec::with_capacity(TASKS);
        for id in &ids {
            let task = store.task(id).await.unwrap().unwrap_or_else(|| panic!("task {id} is lost"));
            let history = store.history(id).await.unwrap();
            records.push((task, history));
        }
        records
    });
    for (record, history) in &records {
        let id = &record.task.id;
        if record.task.state != TaskState::Processed {
            not_processed.push(format!("{id}: {}", record.task.state));
        }
        for step in 1..=STEPS {
            let name = format!("s{step}");
            let key = format!("{id}/{name}");
            let completions: Vec<i64> = history
                .iter()
                .filter(|e| e.kind == EventKind::StepCompleted && e.step.as_ref().map(|s| s.as_str()) == Some(name.as_str()))
                .map(|e| e.at.as_millis())
                .collect();
            if completions.len() != 1 {
                completed_twice.push(format!("{key}: {} completions", completions.len()));
            }
            match calls_by_key.get(key.as_str()) {
                None => not_applied.push(key.clone()),
                Some(arrivals) => {
                    if let Some(completed_at) = completions.first()
                        && let Some(late) = arrivals.iter().find(|at| *at > completed_at)
                    {
                        called_after_completion.push(format!("{key}: completed at {completed_at}, called again at {late}"));
                    }
                }
            }
        }
    }
    let expired = records.iter().filter(|(_, history)| history.iter().any(|e| e.kind == EventKind::Expired)).count();
    let claimers: BTreeSet<String> = records
        .iter()
        .flat_map(|(_, history)| history.iter().filter(|e| e.kind == EventKind::Claimed))
        .filter_map(|e| e.detail["owner"].as_str().map(str::to_owned))
        .collect();
    eprintln!(
        "{TASKS} tasks in {elapsed:?}: {} calls for {} keys, {} tasks recovered after a deadline, claimed by {} instances; faults: {kills:?}",
        calls.len(),
        calls_by_key.len(),
        expired,
        claimers.len()
    );
    assert!(not_processed.is_empty(), "tasks not processed: {not_processed:?}");
    assert!(not_applied.is_empty(), "step keys never applied: {not_applied:?}");
    assert!(completed_twice.is_empty(), "steps not completed exactly once: {completed_twice:?}");
    assert!(called_after_completion.is_empty(), "steps called after their completion was recorded: {called_after_completion:?}");
    assert!(expired > 0, "no task needed recovery: the kills hit nothing in flight");
    drop(store);
    drop(runtime);
}

async fn count_terminal(store: &SharedStore) -> usize {
    let mut terminal = 0;
    for state in [TaskState::Processed, TaskState::Error, TaskState::Compensated, TaskState::Cancelled] {
        let filter = TaskFilter { state: Some(state), limit: (TASKS + 1) as u32, ..TaskFilter::default() };
        terminal += store.list_tasks(&filter).await.map(|tasks| tasks.len()).unwrap_or(0);
    }
    terminal
}

#[test]
fn scale_out_on_postgres_survives_sigkills_of_every_role() {
    run_scale_out("scale-out on PostgreSQL with SIGKILLs", Fault::KillsOnly);
}

#[test]
fn scale_out_on_postgres_survives_a_server_restart() {
    run_scale_out("scale-out on PostgreSQL with a server restart", Fault::ServerRestart);
}
