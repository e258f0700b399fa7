//! Runs the real `rota` binary against a SQLite store in a fresh temporary
//! directory.

#![allow(dead_code)] // Each test file uses a different part of this.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use rota_store::{Event, EventKind};
use serde_json::Value;

/// A store in a temporary directory, and the binary to run against it.
pub struct Rota {
    dir: tempfile::TempDir,
    url: String,
}

impl Rota {
    pub fn new() -> Rota {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = format!("sqlite://{}", dir.path().join("q.db").display());
        Rota { dir, url }
    }

    /// Runs against `url` instead of a fresh file (the temporary directory is
    /// still made, for the test's own files).
    pub fn with_store(url: &str) -> Rota {
        Rota { dir: tempfile::tempdir().expect("a temporary directory"), url: url.to_owned() }
    }

    /// The temporary directory.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// `rota --store <url> args…`, with stdin closed and logging at its default.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rota"));
        command.arg("--store").arg(&self.url).args(args).env_remove("RUST_LOG").env_remove("ROTA_STORE").stdin(Stdio::null());
        command
    }

    /// Runs and returns stdout, failing the test (with stderr) unless it succeeded.
    pub fn ok(&self, args: &[&str]) -> String {
        let output = self.command(args).output().expect("rota runs");
        assert!(output.status.success(), "rota {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).expect("utf-8 stdout")
    }

    /// Runs with `input` on stdin and returns the output, whatever the status.
    pub fn with_stdin(&self, args: &[&str], input: &str) -> Output {
        let mut child = self.command(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("rota runs");
        let mut stdin = child.stdin.take().unwrap();
        let input = input.to_owned();
        let writer = thread::spawn(move || {
            let _ = std::io::Write::write_all(&mut stdin, input.as_bytes());
        });
        let output = child.wait_with_output().expect("rota finishes");
        writer.join().unwrap();
        output
    }

    /// Runs and parses stdout as JSON.
    pub fn json(&self, args: &[&str]) -> Value {
        let stdout = self.ok(args);
        serde_json::from_str(&stdout).unwrap_or_else(|err| panic!("rota {args:?} printed no JSON ({err}): {stdout}"))
    }

    /// Runs a command that must fail; returns its exit code and stderr.
    pub fn fails(&self, args: &[&str]) -> (i32, String) {
        let output = self.command(args).output().expect("rota runs");
        let stderr = String::from_utf8(output.stderr).expect("utf-8 stderr");
        assert!(!output.status.success(), "rota {args:?} succeeded; stdout: {}", String::from_utf8_lossy(&output.stdout));
        (output.status.code().expect("exited, not killed"), stderr)
    }

    /// The stats of one queue, as `queue stats --json` prints them.
    pub fn stats(&self, queue: &str) -> Value {
        let all = self.json(&["queue", "stats", "--json"]);
        all.as_array()
            .unwrap()
            .iter()
            .find(|stats| stats["queue"] == queue)
            .cloned()
            .unwrap_or_else(|| panic!("no stats for {queue}: {all}"))
    }

    /// Receives up to `max` messages with a long lease.
    pub fn receive(&self, queue: &str, max: u32) -> Vec<Value> {
        let max = max.to_string();
        let received = self.json(&["queue", "receive", queue, "--max", &max, "--lease", "10m", "--json"]);
        received.as_array().unwrap().clone()
    }

    /// Sends each body; returns the message ids.
    pub fn send_all(&self, queue: &str, bodies: &[String]) -> Vec<String> {
        let input: String = bodies.iter().map(|body| format!("{body}\n")).collect();
        let output = self.with_stdin(&["queue", "send", queue, "--lines"], &input);
        assert!(output.status.success(), "send --lines failed: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap().lines().map(str::to_owned).collect()
    }
}

/// The lines a child prints, delivered through a channel so that a test can
/// wait for them with a timeout. Only complete lines (ending in a newline)
/// are passed on: a line cut by a kill was never acknowledged.
pub fn lines_of(stream: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line.ends_with('\n') => {
                    if tx.send(line.trim_end().to_owned()).is_err() {
                        return;
                    }
                }
                Ok(_) => return,
            }
        }
    });
    rx
}

/// The next line, or a test failure after `timeout`.
pub fn next_line(lines: &mpsc::Receiver<String>, timeout: Duration, waiting_for: &str) -> String {
    lines.recv_timeout(timeout).unwrap_or_else(|err| panic!("no line from rota within {timeout:?} while waiting for {waiting_for}: {err}"))
}

/// Asserts that stderr is one line starting with `error: ` and containing each of `needles`.
pub fn assert_one_error_line(stderr: &str, needles: &[&str]) {
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    for needle in needles {
        assert!(lines[0].contains(needle), "stderr does not mention {needle:?}: {stderr}");
    }
}

/// How long a `rota serve` may take to log that it started.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `rota serve` (SIGKILLed when dropped), with its log kept.
pub struct Serve {
    pub child: std::process::Child,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Serve {
    /// `rota --store STORE serve ARGS…` at `RUST_LOG=info`, once it has logged
    /// that it started (the test fails with its log if it does not).
    pub fn start(store: &str, args: &[&str]) -> Serve {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rota"));
        command.args(["--store", store, "serve"]).args(args);
        command.env_remove("ROTA_STORE").env("RUST_LOG", "info").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("rota serve starts");
        let lines = lines_of(child.stderr.take().unwrap());
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let deadline = std::time::Instant::now() + STARTUP_TIMEOUT;
        loop {
            match lines.recv_timeout(Duration::from_millis(200)) {
                Ok(line) => {
                    let started = line.contains("rota serve started");
                    log.lock().unwrap().push(line);
                    if started {
                        break;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) if std::time::Instant::now() < deadline => {}
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("rota serve {args:?} did not start:\n{}", log.lock().unwrap().join("\n"));
                }
            }
        }
        // Keep draining, so that the child never blocks on a full pipe.
        let kept = log.clone();
        thread::spawn(move || {
            for line in lines {
                kept.lock().unwrap().push(line);
            }
        });
        Serve { child, log }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        // A stopped process dies of SIGKILL too; nothing is left behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What must hold of one task's history whatever faults it met, as a list
/// of violations: received once, at most one expiry per lease and only of
/// the lease's holder, each step attempt ended once, each step completed
/// once.
pub fn history_violations(id: &str, history: &[Event]) -> Vec<String> {
    let mut found = Vec::new();
    let received = history.iter().filter(|e| e.kind == EventKind::Received).count();
    if received != 1 {
        found.push(format!("{id}: received {received} times"));
    }
    // At most one expiry per lease, by the lease's holder's successor.
    let mut holder: Option<String> = None;
    let mut expired_this_lease = false;
    // Each attempt ends once; each step completes once.
    let mut attempt_ends: BTreeMap<(String, u32), usize> = BTreeMap::new();
    let mut completions: BTreeMap<String, usize> = BTreeMap::new();
    for event in history {
        match event.kind {
            EventKind::Claimed => {
                holder = event.detail["owner"].as_str().map(str::to_owned);
                expired_this_lease = false;
            }
            EventKind::Expired => {
                let previous = event.detail["previous_holder"].as_str().map(str::to_owned);
                if expired_this_lease {
                    found.push(format!("{id}: lease of {holder:?} expired twice (seq {})", event.seq));
                }
                if previous != holder {
                    found.push(format!("{id}: expired a lease of {previous:?} while {holder:?} held it (seq {})", event.seq));
                }
                expired_this_lease = true;
            }
            EventKind::StepCompleted | EventKind::StepFailed => {
                let step = event.step.as_ref().map(|s| s.to_string()).unwrap_or_default();
                *attempt_ends.entry((step.clone(), event.attempt.unwrap_or(0))).or_default() += 1;
                if event.kind == EventKind::StepCompleted {
                    *completions.entry(step).or_default() += 1;
                }
            }
            _ => {}
        }
    }
    for ((step, attempt), ends) in attempt_ends {
        if ends > 1 {
            found.push(format!("{id}: step {step} attempt {attempt} ended {ends} times"));
        }
    }
    for (step, count) in completions {
        if count > 1 {
            found.push(format!("{id}: step {step} completed {count} times"));
        }
    }
    found
}

/// A store on the test schema `schema`, to read what the processes under
/// test wrote.
pub fn open_postgres(runtime: &tokio::runtime::Runtime, schema: &rota_testkit::postgres::TestSchema) -> rota_store::SharedStore {
    let clock: std::sync::Arc<dyn rota_model::Clock> = std::sync::Arc::new(rota_model::SystemClock);
    runtime.block_on(async {
        let mut config = rota_store_postgres::Config::new(schema.url.clone());
        config.schema = schema.name.clone();
        config.connections_max = 2;
        std::sync::Arc::new(rota_store_postgres::PgStore::open(config, clock).await.expect("open the store"))
    })
}

/// Submits a task through the CLI every 50 ms on its own thread, until
/// stopped: the task of submission `n` runs workflow `workflow_of(n)` with
/// the id `<workflow>-<n>`.
pub struct Submitter {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: thread::JoinHandle<usize>,
}

impl Submitter {
    pub fn start(store_url: &str, workflow_of: fn(usize) -> &'static str) -> Submitter {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (stopped, url) = (stop.clone(), store_url.to_owned());
        let thread = thread::spawn(move || {
            let rota = Rota::with_store(&url);
            let mut submitted = 0;
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let workflow = workflow_of(submitted);
                rota.ok(&["submit", workflow, "--id", &format!("{workflow}-{submitted}")]);
                submitted += 1;
                thread::sleep(Duration::from_millis(50));
            }
            submitted
        });
        Submitter { stop, thread }
    }

    /// Stops it; how many tasks it submitted.
    pub fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the submitter ran")
    }
}
