//! The task commands and `rota serve`, run as the real binary against a
//! temporary SQLite store: validate, serve + submit end to end, status,
//! alerts, resubmit, cancel, signals, and the issue's real-process tests
//! (SIGKILL mid-run and restart; two `rota serve` processes on one store).
//!
//! These run in real time by nature (real processes, a real file, the
//! built-in `delay` and `exec` agents); each is kept to a few seconds.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{Rota, assert_one_error_line, lines_of};
use serde_json::{Value, json};

/// How long a test waits for `rota serve` to say it started.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);

/// A `rota serve` child process, killed when dropped.
struct Serve {
    child: Child,
    stderr: mpsc::Receiver<String>,
    /// Every stderr line read so far (for failure messages).
    seen: Vec<String>,
}

impl Serve {
    /// Starts `rota serve --workflows DIR --instance-id ID` with a quick
    /// Supervisor and `env`, which `exec` steps get too (`--exec-env`), and
    /// waits until it has registered its workflows.
    fn start(rota: &Rota, workflows: &Path, instance: &str, env: &[(&str, &str)]) -> Serve {
        Serve::start_with(rota, workflows, instance, env, &[])
    }

    /// [`Serve::start`] with more flags.
    fn start_with(rota: &Rota, workflows: &Path, instance: &str, env: &[(&str, &str)], flags: &[&str]) -> Serve {
        let dir = workflows.to_str().unwrap();
        let mut args = vec!["serve", "--workflows", dir, "--instance-id", instance, "--supervisor-interval", "200ms"];
        args.extend_from_slice(flags);
        let names: Vec<&str> = env.iter().map(|(name, _)| *name).collect();
        let names = names.join(",");
        if !env.is_empty() {
            args.extend(["--exec-env", &names]);
        }
        let mut command = rota.command(&args);
        command.stdout(Stdio::null()).stderr(Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("rota serve starts");
        let stderr = lines_of(child.stderr.take().unwrap());
        let mut serve = Serve { child, stderr, seen: Vec::new() };
        serve.wait_for_line("rota serve started", STARTUP_TIMEOUT);
        serve
    }

    fn wait_for_line(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(needle);
                    self.seen.push(line);
                    if found {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        panic!("rota serve did not log {needle:?} within {timeout:?}; its stderr:\n{}", self.seen.join("\n"));
    }

    fn signal(&self, signal: i32) {
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }

    /// Sends SIGTERM and returns the exit status and how long it took.
    fn terminate(mut self) -> (std::process::ExitStatus, Duration, String) {
        let started = Instant::now();
        self.signal(libc::SIGTERM);
        let status = wait_with_timeout(&mut self.child, Duration::from_secs(20)).expect("rota serve exits after SIGTERM");
        let elapsed = started.elapsed();
        // Read to the end of its stderr: the reader thread may not have
        // passed on the last lines yet (it stops at EOF, which drops the
        // channel; the timeout bounds a pipe some grandchild still holds).
        while let Ok(line) = self.stderr.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(line);
        }
        (status, elapsed, self.seen.join("\n"))
    }

    /// SIGKILL, at once.
    fn kill(mut self) {
        self.signal(libc::SIGKILL);
        let status = self.child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A directory of workflow files (and whatever else a test keeps beside them).
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        Files { dir: tempfile::tempdir().unwrap() }
    }

    /// The workflows directory, created on first use.
    fn workflows(&self) -> PathBuf {
        let dir = self.dir.path().join("workflows");
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn workflow(&self, name: &str, yaml: &str) -> PathBuf {
        let path = self.workflows().join(name);
        std::fs::write(&path, yaml).unwrap();
        path
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Polls `status --json` until the task's state is `state`.
fn wait_for_state(rota: &Rota, id: &str, state: &str, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let status = rota.json(&["status", id, "--json"]);
        if status["state"] == state {
            return status;
        }
        assert!(Instant::now() < deadline, "task {id} is not {state} after {timeout:?}: {status:#}");
        thread::sleep(Duration::from_millis(100));
    }
}

/// Polls `tasks --json` until every task is in a terminal state; returns them.
fn wait_for_all_terminal(rota: &Rota, count: usize, timeout: Duration) -> Vec<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let tasks = rota.json(&["tasks", "--json", "--limit", "1000"]);
        let tasks = tasks.as_array().unwrap().clone();
        let terminal = ["processed", "error", "compensated", "cancelled"];
        if tasks.len() == count && tasks.iter().all(|task| terminal.contains(&task["state"].as_str().unwrap())) {
            return tasks;
        }
        let states: BTreeMap<String, usize> = tasks.iter().fold(BTreeMap::new(), |mut counts, task| {
            *counts.entry(task["state"].as_str().unwrap().to_owned()).or_default() += 1;
            counts
        });
        if Instant::now() >= deadline {
            // Say where each unfinished task stands, with its history.
            let stuck: Vec<String> = tasks
                .iter()
                .filter(|task| !terminal.contains(&task["state"].as_str().unwrap()))
                .map(|task| {
                    let id = task["id"].as_str().unwrap();
                    format!("{task}\nstatus: {}", rota.json(&["status", id, "--json"]))
                })
                .collect();
            panic!("not every task ended within {timeout:?}: {states:?}\n{}", stuck.join("\n"));
        }
        thread::sleep(Duration::from_millis(200));
    }
}

// ---------------------------------------------------------------- validate

#[test]
fn validate_prints_every_problem_with_its_position() {
    let rota = Rota::new();
    let files = Files::new();
    let good = files.workflow("good.yaml", "name: good\nversion: 2\nsteps:\n  - name: a\n    agent: delay\n  - name: b\n    agent: exec\n");
    let bad = files.workflow(
        "bad.yaml",
        "name: bad\n\
         version: 1\n\
         steps:\n  \
           - name: a\n    \
             agent: nope\n    \
             timeout: 5 parsecs\n  \
           - name: b\n    \
             depends_on: [missing]\n    \
             agent: exec\n    \
             colour: red\n",
    );
    let (good, bad) = (good.display().to_string(), bad.display().to_string());
    let output = rota.command(&["validate", &good, &bad]).output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", stderr_of(&output));
    assert_eq!(stdout_of(&output), format!("{good}: ok (workflow good version 2, 2 steps)\n"));
    let stderr = stderr_of(&output);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines,
        [
            format!("{bad}:5:12: step `a`: unknown agent `nope` (known agents: delay, exec, http)"),
            format!(
                "{bad}:6:14: step `a`: invalid duration \"5 parsecs\" for `timeout`: unknown time unit \"parsecs\", supported units: \
                 ns, us/µs, ms, sec, min, hours, days, weeks, months, years (and few variations)"
            ),
            format!("{bad}:8:18: step `b`: depends on unknown step `missing`"),
            format!(
                "{bad}:10:5: step `b`: unknown field `colour` (expected one of: name, agent, wait, workflow, version, when, for_each, max_parallel, callback, with, timeout, warn_after, retry, rate_limit, compensate, depends_on)"
            ),
            "error: 4 problems in 1 of 2 workflow files".to_owned(),
        ]
    );

    // The repository's example validates.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workflows/order.yaml");
    let stdout = rota.ok(&["validate", example.to_str().unwrap()]);
    assert!(stdout.trim_end().ends_with("order.yaml: ok (workflow order version 3, 4 steps)"), "{stdout}");

    // Custom agents are declared with --agent.
    let custom = files.path("custom.json");
    std::fs::write(&custom, r#"{"name": "c", "version": 1, "steps": [{"name": "post", "agent": "ledger"}]}"#).unwrap();
    let custom = custom.display().to_string();
    let (code, stderr) = rota.fails(&["validate", &custom]);
    assert_eq!(code, 1);
    assert!(stderr.starts_with(&format!("{custom}:1:")) && stderr.contains("unknown agent `ledger`"), "{stderr}");
    assert_eq!(rota.ok(&["validate", "--agent", "ledger", &custom]), format!("{custom}: ok (workflow c version 1, 1 step)\n"));

    // A step that waits for a signal must say how long.
    let waiting =
        files.workflow("waiting.yaml", "name: w\nversion: 1\nsteps:\n  - name: approval\n    wait: approved\n").display().to_string();
    let (code, stderr) = rota.fails(&["validate", &waiting]);
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with(&format!(
            "{waiting}:5:11: step `approval`: a step that waits needs a `timeout`: how long to wait for signal `approved` before the step fails"
        )),
        "{stderr}"
    );
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workflows/approval.yaml");
    let stdout = rota.ok(&["validate", example.to_str().unwrap()]);
    assert!(stdout.trim_end().ends_with("approval.yaml: ok (workflow approval version 1, 3 steps)"), "{stdout}");

    // A retry policy's non_retryable list: HTTP statuses and failure kinds.
    let policy = files
        .workflow(
            "policy.yaml",
            "name: p\nversion: 1\nsteps:\n  - name: call\n    agent: http\n    retry: { non_retryable: [404, 503, timeout] }\n",
        )
        .display()
        .to_string();
    assert_eq!(rota.ok(&["validate", &policy]), format!("{policy}: ok (workflow p version 1, 1 step)\n"));
    let policy = files
        .workflow(
            "policy.yaml",
            "name: p\nversion: 1\nsteps:\n  - name: call\n    agent: http\n    retry: { non_retryable: [404, 700, teapot] }\n",
        )
        .display()
        .to_string();
    let (code, stderr) = rota.fails(&["validate", &policy]);
    assert_eq!(code, 1);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines,
        [
            format!("{policy}:6:35: step `call`: `retry.non_retryable`: HTTP status must be between 100 and 599, found 700"),
            format!(
                "{policy}:6:40: step `call`: `retry.non_retryable`: unknown failure kind `teapot` (expected an HTTP status or one of: \
                 timeout, connection, circuit_open, exit_tempfail, killed, start_failed)"
            ),
            "error: 2 problems in 1 of 1 workflow file".to_owned(),
        ]
    );

    // A missing file is a problem of its own, without a position.
    let missing = files.path("missing.yaml").display().to_string();
    let (code, stderr) = rota.fails(&["validate", &missing]);
    assert_eq!(code, 1);
    assert!(stderr.starts_with(&format!("{missing}:0:0: cannot read: ")), "{stderr}");
}

#[test]
fn validate_reports_cycles_of_child_workflows_and_warns_of_missing_ones() {
    let rota = Rota::new();
    let files = Files::new();
    let child = |name: &str, runs: &str| {
        format!("name: {name}\nversion: 1\nsteps:\n  - name: run\n    workflow: {runs}\n    timeout: 1m\n  - name: a\n    agent: delay\n")
    };
    let a = files.workflow("a.yaml", &child("a", "b")).display().to_string();
    let b = files.workflow("b.yaml", &child("b", "a")).display().to_string();
    let c = files.workflow("c.yaml", &child("c", "elsewhere")).display().to_string();
    let output = rota.command(&["validate", &a, &b, &c]).output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", stderr_of(&output));
    let stderr = stderr_of(&output);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines,
        [
            format!("{a}: workflow `a` starts itself through child workflows: a -> b -> a (only child_depth_max would stop it)"),
            format!(
                "{c}: warning: step `run` runs child workflow `elsewhere`, which none of the files given defines: it must be registered before a task reaches the step"
            ),
            "error: 1 problem in 1 of 3 workflow files".to_owned(),
        ]
    );
    // Without the cycle, a missing child is only a warning.
    let output = rota.command(&["validate", &c]).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr_of(&output));
    assert_eq!(stdout_of(&output), format!("{c}: ok (workflow c version 1, 2 steps)\n"));
    // A step that runs a child workflow must say how long it waits.
    let untimed = files.workflow("u.yaml", "name: u\nversion: 1\nsteps:\n  - name: run\n    workflow: c\n").display().to_string();
    let (code, stderr) = rota.fails(&["validate", &untimed]);
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with(&format!(
            "{untimed}:5:15: step `run`: a step that runs a child workflow needs a `timeout`: how long to wait for `c` to finish"
        )),
        "{stderr}"
    );
}

#[test]
fn serve_refuses_to_start_with_an_invalid_workflow() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow("ok.yaml", "name: ok\nversion: 1\nsteps:\n  - name: a\n    agent: delay\n");
    let bad = files.workflow("zz.yaml", "name: zz\nversion: 1\nsteps:\n  - name: a\n    agent: nope\n");
    let dir = files.workflows().display().to_string();
    rota.ok(&["migrate"]);
    let output = rota.command(&["serve", "--workflows", &dir]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = stderr_of(&output);
    assert!(stderr.contains(&format!("{}:5:12: step `a`: unknown agent `nope`", bad.display())), "{stderr}");
    assert!(stderr.lines().last().unwrap().starts_with("error: 1 problem in the workflow definitions in "), "{stderr}");
    // Nothing was registered.
    assert_eq!(rota.json(&["workflows", "--json"]), json!([]));

    let (code, stderr) = rota.fails(&["serve", "--workflows", &dir, "--instance-id", "has space"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["--instance-id", "letters, digits"]);

    let (code, stderr) = rota.fails(&["serve", "--workflows", &dir, "--shutdown-grace", "2h"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["--shutdown-grace must be at most 1h, got 2h"]);

    let (code, stderr) = rota.fails(&["serve", "--workflows", &dir, "--supervisor-interval", "5ms"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["--supervisor-interval must be between 10ms and 1h, got 5ms"]);
}

// ------------------------------------------------------------ end to end

const PIPELINE: &str = r#"
name: pipeline
version: 1
steps:
  - name: pause
    agent: delay
    with: { for: "10ms" }
  - name: echo
    agent: exec
    with: { command: ["sh", "-c", "cat"], stdin: { order: "{{ input.order }}", pause: "{{ steps.pause.output }}" } }
"#;

#[test]
fn serve_runs_a_submitted_task_to_processed() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow("pipeline.yaml", PIPELINE);
    let serve = Serve::start(&rota, &files.workflows(), "e2e-1", &[]);

    let output = rota.command(&["submit", "pipeline", "--input", r#"{"order": 7}"#, "--id", "order-7", "--wait"]).output().unwrap();
    let stderr = stderr_of(&output);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stdout_of(&output), "order-7\n");
    assert!(stderr.contains("step echo: completed (attempt 1)"), "progress on stderr: {stderr}");
    assert!(stderr.contains("task order-7: processed"), "{stderr}");

    let status = rota.json(&["status", "order-7", "--json"]);
    assert_eq!(status["id"], "order-7");
    assert_eq!(status["state"], "processed");
    assert_eq!(status["workflow"], "pipeline");
    assert_eq!(status["version"], 1);
    assert_eq!(status["failure_count"], 0);
    assert_eq!(status["locked_by"], Value::Null, "a finished task holds no lease");
    assert_eq!(status["input"], json!({ "order": 7 }));
    assert_eq!(status["output"]["echo"], json!({ "order": 7, "pause": { "slept_ms": 10 } }), "{status:#}");
    let steps = status["steps"].as_array().unwrap();
    let names: Vec<&str> = steps.iter().map(|step| step["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["pause", "echo"]);
    for step in steps {
        assert_eq!((&step["state"], &step["attempts"]), (&json!("completed"), &json!(1)), "{step}");
    }
    assert_eq!(steps[1]["agent"], "exec");
    let kinds: Vec<&str> = status["history"].as_array().unwrap().iter().map(|event| event["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"received"));
    assert_eq!(kinds.last(), Some(&"processed"));
    let claimed = status["history"].as_array().unwrap().iter().find(|event| event["kind"] == "claimed").unwrap();
    assert_eq!(claimed["detail"]["owner"], "e2e-1");
    assert!(status["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(status["breakers"], json!([]));

    // The same id again creates nothing, and says so.
    let output = rota.command(&["submit", "pipeline", "--id", "order-7"]).output().unwrap();
    assert!(output.status.success());
    assert_eq!(stdout_of(&output), "order-7\n");
    assert!(stderr_of(&output).contains("(existing) task order-7 already exists (pipeline@1, processed)"), "{}", stderr_of(&output));

    // Listings.
    let second = rota.ok(&["submit", "pipeline", "--input", r#"{"order": 8}"#, "--wait"]);
    let processed = rota.json(&["tasks", "--state", "processed", "--json"]);
    let ids: BTreeSet<&str> = processed.as_array().unwrap().iter().map(|task| task["id"].as_str().unwrap()).collect();
    assert_eq!(ids, BTreeSet::from(["order-7", second.trim()]));
    assert_eq!(rota.json(&["tasks", "--state", "error", "--json"]), json!([]));
    assert_eq!(rota.json(&["tasks", "--workflow", "pipeline", "--limit", "1", "--json"]).as_array().unwrap().len(), 1);
    let older = rota.json(&["tasks", "--before", second.trim(), "--json"]);
    assert_eq!(older.as_array().unwrap().iter().map(|task| task["id"].as_str().unwrap()).collect::<Vec<_>>(), ["order-7"]);
    assert_eq!(rota.json(&["tasks", "--before", "order-7", "--json"]), json!([]), "nothing before the first task");
    let table = rota.ok(&["tasks"]);
    assert!(table.starts_with("ID") && table.contains("pipeline@1") && table.contains("processed"), "{table}");
    let text = rota.ok(&["status", "order-7"]);
    assert!(text.contains("pipeline@1") && text.contains("STEP") && text.contains("echo"), "{text}");
    let workflows = rota.json(&["workflows", "--json"]);
    assert_eq!(workflows[0]["name"], "pipeline");
    assert_eq!(workflows[0]["steps"][1], json!({ "name": "echo", "agent": "exec", "depends_on": ["pause"] }));

    let (status, took, stderr) = serve.terminate();
    assert_eq!(status.code(), Some(0), "SIGTERM is a clean stop: {stderr}");
    assert!(took < Duration::from_secs(5), "stopping took {took:?}");
    assert!(stderr.contains("rota serve stopped"), "{stderr}");
}

#[test]
fn a_task_submitted_with_a_delay_waits_pending_and_says_when_it_starts() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow("pipeline.yaml", PIPELINE);
    let _serve = Serve::start(&rota, &files.workflows(), "delay-1", &[]);

    let output = rota.command(&["submit", "pipeline", "--id", "later", "--delay", "1h"]).output().unwrap();
    assert!(output.status.success(), "{}", stderr_of(&output));
    assert!(stderr_of(&output).contains("task later starts no earlier than 20"), "{}", stderr_of(&output));
    let status = rota.json(&["status", "later", "--json"]);
    assert_eq!(status["state"], "pending");
    assert!(status["not_before"].as_str().unwrap() > status["created_at"].as_str().unwrap(), "{status:#}");
    let listed = rota.ok(&["tasks", "--state", "pending"]);
    assert!(listed.contains(&format!("pending until {}", status["not_before"].as_str().unwrap())), "{listed}");
    let text = rota.ok(&["status", "later"]);
    assert!(text.contains(&format!("starts_at      {}", status["not_before"].as_str().unwrap())), "{text}");

    // A start time already past runs at once; one given twice or malformed is refused.
    rota.ok(&["submit", "pipeline", "--id", "now", "--input", r#"{"order": 1}"#, "--at", "2020-01-01T00:00:00+02:00", "--wait"]);
    let (code, stderr) = rota.fails(&["submit", "pipeline", "--at", "next tuesday"]);
    assert!(code != 0 && stderr.contains("--at: expected an RFC 3339 time"), "{stderr}");
    let (code, stderr) = rota.fails(&["submit", "pipeline", "--at", "2030-01-01T00:00:00Z", "--delay", "1m"]);
    assert!(code != 0 && stderr.contains("cannot be used with"), "{stderr}");
    assert_eq!(rota.json(&["status", "later", "--json"])["state"], "pending", "still waiting");
}

#[test]
fn a_parents_children_are_listed_counted_and_selected_for_a_bulk_action() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow("parcel.yaml", "name: parcel\nversion: 1\nsteps:\n  - name: book\n    agent: delay\n    with: {ms: 1}\n");
    files.workflow("order.yaml", "name: order\nversion: 1\nsteps:\n  - name: ship\n    workflow: parcel\n    timeout: 1m\n");
    let serve = Serve::start(&rota, &files.workflows(), "parent-1", &[]);
    for id in ["o-1", "o-2"] {
        rota.ok(&["submit", "order", "--id", id, "--wait"]);
    }
    drop(serve);
    let ids = |args: &[&str]| -> Vec<String> {
        let mut full = vec!["tasks", "--json"];
        full.extend_from_slice(args);
        rota.json(&full).as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids(&["--parent", "o-1"]), ["o-1/ship#1"]);
    assert_eq!(ids(&["--parent", "o-2", "--state", "processed"]), ["o-2/ship#1"]);
    assert!(ids(&["--parent", "o-1/ship#1"]).is_empty(), "a child without children of its own");
    assert_eq!(rota.json(&["tasks", "--count", "--parent", "o-2", "--json"])["total"], 1);
    let dry = rota.ok(&["cancel", "--parent", "o-1", "--dry-run"]);
    assert!(dry.starts_with("would cancel 1 task(s): o-1/ship#1"), "a bulk action selects by parent: {dry}");
    let exported = rota.ok(&["export", "--parent", "o-2"]);
    assert_eq!(exported.lines().count(), 1, "{exported}");
    let (code, stderr) = rota.fails(&["tasks", "--parent", " o-1"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--parent"), "{stderr}");
}

#[test]
fn tasks_are_tagged_searched_counted_and_paged() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow("pipeline.yaml", PIPELINE);
    let serve = Serve::start(&rota, &files.workflows(), "search-1", &[]);
    for (id, customer) in [("o-1", "c1"), ("o-2", "c2"), ("o-3", "c1"), ("x-4", "c1")] {
        rota.ok(&["submit", "pipeline", "--id", id, "--delay", "1h", "--tag", &format!("customer={customer}"), "--tag", "region=eu"]);
    }
    rota.ok(&["cancel", "o-1"]);
    let status = rota.json(&["status", "o-3", "--json"]);
    assert_eq!(status["tags"], json!({ "customer": "c1", "region": "eu" }));
    assert!(rota.ok(&["status", "o-3"]).contains("tags           customer=c1 region=eu"));

    let ids = |args: &[&str]| -> Vec<String> {
        let mut full = vec!["tasks", "--json"];
        full.extend_from_slice(args);
        rota.json(&full).as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids(&["--tag", "customer=c1"]), ["x-4", "o-3", "o-1"]);
    assert_eq!(ids(&["--tag", "customer=c1", "--id-prefix", "o-"]), ["o-3", "o-1"]);
    assert_eq!(ids(&["--tag", "customer=c1", "--state", "pending"]), ["x-4", "o-3"]);
    assert_eq!(ids(&["--created-after", "1h"]).len(), 4, "a duration means that long ago");
    assert!(ids(&["--created-before", "1h"]).is_empty());
    assert_eq!(ids(&["--ended-after", "2020-01-01T00:00:00Z"]), ["o-1"]);

    // A full page says how to get the next; the cursor gets it.
    let output = rota.command(&["tasks", "--tag", "customer=c1", "--limit", "2"]).output().unwrap();
    assert!(stderr_of(&output).contains("more may follow: add --after o-3"), "{}", stderr_of(&output));
    assert_eq!(ids(&["--tag", "customer=c1", "--limit", "2", "--after", "o-3"]), ["o-1"]);

    let counted = rota.ok(&["tasks", "--count", "--tag", "customer=c1"]);
    let lines: Vec<&str> =
        counted.lines().filter(|l| l.starts_with("pending") || l.starts_with("cancelled") || l.starts_with("total")).collect();
    let words: Vec<Vec<&str>> = lines.iter().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(words, [vec!["pending", "2"], vec!["cancelled", "1"], vec!["total", "3"]], "{counted}");
    assert_eq!(rota.json(&["tasks", "--count", "--id-prefix", "x", "--json"])["total"], 1);

    rota.ok(&["submit", "pipeline", "--id", "p-5", "--delay", "1h", "--priority", "-7"]);
    assert_eq!(rota.json(&["status", "p-5", "--json"])["priority"], -7);
    assert!(rota.ok(&["status", "p-5"]).contains("priority       -7"));
    assert_eq!(rota.json(&["status", "o-3", "--json"])["priority"], 0, "the workflow's default");
    let (code, stderr) = rota.fails(&["submit", "pipeline", "--priority", "101"]);
    assert!(code == 2 && stderr.contains("from -100 to 100, got 101"), "{stderr}");
    let (code, stderr) = rota.fails(&["submit", "pipeline", "--tag", "no-equals"]);
    assert!(code == 2 && stderr.contains("expected a tag as key=value"), "{stderr}");
    let (code, stderr) = rota.fails(&["tasks", "--created-after", "last week"]);
    assert!(code == 2 && stderr.contains("expected an RFC 3339 time"), "{stderr}");
    let many: Vec<String> = (0..17).map(|i| format!("k{i}=v")).collect();
    let mut args = vec!["submit", "pipeline"];
    for tag in &many {
        args.extend(["--tag", tag.as_str()]);
    }
    let (code, stderr) = rota.fails(&args);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["--tag: a task has at most 16 tags, got 17"]);
    drop(serve);
}

#[test]
fn prune_deletes_finished_tasks_by_hand_and_counts_them_in_a_dry_run() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow("pipeline.yaml", PIPELINE);
    let serve = Serve::start(&rota, &files.workflows(), "prune-1", &[]);
    for id in ["done-1", "done-2", "waiting"] {
        rota.ok(&["submit", "pipeline", "--id", id, "--delay", "1h"]);
    }
    rota.ok(&["cancel", "done-1"]);
    rota.ok(&["cancel", "done-2"]);

    let dry = rota.ok(&["prune", "--older-than", "0s", "--dry-run"]);
    assert!(dry.starts_with("would delete 2 finished task(s) that ended before 20"), "{dry}");
    assert_eq!(rota.json(&["status", "done-1", "--json"])["state"], "cancelled", "a dry run deletes nothing");
    let only_errors = rota.ok(&["prune", "--older-than", "0s", "--state", "error"]);
    assert!(only_errors.starts_with("deleted 0 finished task(s) in error that ended before"), "{only_errors}");
    let audit = rota.json(&["audit", "--json"]);
    assert_eq!(
        audit.as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap()).collect::<Vec<_>>(),
        ["prune", "task.cancel", "task.cancel"]
    );
    let pruned = rota.ok(&["prune", "--older-than", "0s", "--workflow", "pipeline", "--batch", "1", "--reason", "disk space"]);
    assert!(pruned.starts_with("deleted 2 finished task(s) of workflow pipeline that ended before"), "{pruned}");
    assert!(pruned.trim_end().ends_with("in 3 batch(es)"), "two full batches of one, then an empty one: {pruned}");
    // The cancels went with their tasks; the prunes stay, with who, why and how many.
    let audit = rota.json(&["audit", "--json"]);
    assert_eq!(audit.as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap()).collect::<Vec<_>>(), ["prune", "prune"]);
    assert_eq!(
        (&audit[0]["reason"], &audit[0]["detail"]["tasks"], &audit[1]["detail"]["tasks"]),
        (&json!("disk space"), &json!(2), &json!(0))
    );
    assert!(audit[0]["by"].as_str().unwrap().starts_with("cli"), "{}", audit[0]);
    assert!(audit[0]["detail"]["selected"].as_str().unwrap().contains("of workflow pipeline"), "{}", audit[0]);
    let (_, stderr) = rota.fails(&["status", "done-1"]);
    assert_one_error_line(&stderr, &["done-1"]);
    assert_eq!(rota.json(&["status", "waiting", "--json"])["state"], "pending", "a pending task is never deleted");
    assert!(rota.ok(&["prune", "--older-than", "1d", "--dry-run"]).starts_with("would delete 0 "), "nothing older than a day");

    let (code, stderr) = rota.fails(&["prune", "--older-than", "0s", "--state", "pending"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["--state pending: only finished tasks are pruned"]);
    let (code, _) = rota.fails(&["prune", "--older-than", "soon"]);
    assert_eq!(code, 2, "clap reports a bad duration");
    drop(serve);
}

/// Export lines by task id, without the store's own event sequence
/// numbers (an import numbers the events anew, in the same order).
fn comparable(lines: &str) -> Vec<Value> {
    let mut lines: Vec<Value> = lines.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    for line in &mut lines {
        line["history"].as_array_mut().unwrap().iter_mut().for_each(|event| event["seq"] = json!(0));
    }
    lines.sort_by(|a, b| a["task"]["id"].as_str().cmp(&b["task"]["id"].as_str()));
    lines
}

#[test]
fn export_import_and_prune_with_an_archive_keep_every_task_and_its_history() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow("pipeline.yaml", PIPELINE);
    let serve = Serve::start(&rota, &files.workflows(), "export-1", &[]);
    for id in ["done-1", "done-2", "waiting"] {
        rota.ok(&["submit", "pipeline", "--id", id, "--delay", "1h"]);
    }
    rota.ok(&["cancel", "done-1"]);
    rota.ok(&["cancel", "done-2"]);
    drop(serve);

    let exported = rota.ok(&["export", "--page", "2"]);
    let ids: Vec<String> =
        exported.lines().map(|line| serde_json::from_str::<Value>(line).unwrap()["task"]["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(ids, ["waiting", "done-2", "done-1"], "one line per task, newest first");
    let first: Value = serde_json::from_str(exported.lines().last().unwrap()).unwrap();
    assert_eq!(first["rota_export"], 1, "every line says its format's version");
    let kinds: Vec<&str> = first["history"].as_array().unwrap().iter().map(|event| event["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"received"));
    assert_eq!(kinds.last(), Some(&"cancelled"), "the whole history: {kinds:?}");
    let cancelled = rota.ok(&["export", "--state", "cancelled"]);
    assert_eq!(cancelled.lines().count(), 2, "the filters of `rota tasks`");
    let export_file = rota.dir().join("tasks.jsonl");
    std::fs::write(&export_file, &exported).unwrap();

    let copy = Rota::new();
    let imported = copy.ok(&["import", export_file.to_str().unwrap()]);
    assert_eq!(imported.trim(), "imported 3 task(s) from 1 file(s)");
    assert_eq!(comparable(&copy.ok(&["export"])), comparable(&exported), "the imported store exports the same tasks");
    let status = copy.json(&["status", "done-1", "--json"]);
    assert_eq!(status["state"], "cancelled");
    let (code, stderr) = copy.fails(&["import", export_file.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["the store is not empty", "only into an empty store"]);
    let bad = rota.dir().join("bad.jsonl");
    std::fs::write(&bad, format!("{}\n{{\"rota_export\": 2}}\n", exported.lines().next().unwrap())).unwrap();
    let (_, stderr) = Rota::new().fails(&["import", bad.to_str().unwrap()]);
    assert_one_error_line(&stderr, &[&format!("{}:2: rota_export version 2 is not one this rota reads", bad.display())]);

    let archive = rota.dir().join("archive");
    let pruned = rota.ok(&["prune", "--older-than", "0s", "--batch", "1", "--archive", archive.to_str().unwrap()]);
    assert!(pruned.contains("deleted 2 finished task(s)") && pruned.contains("archived them to"), "{pruned}");
    assert_eq!(std::fs::read_dir(&archive).unwrap().count(), 2, "a file per batch of one");
    let restored = Rota::new();
    let imported = restored.ok(&["import", archive.to_str().unwrap()]);
    assert_eq!(imported.trim(), "imported 2 task(s) from 2 file(s)");
    let archived: Vec<Value> = comparable(&exported).into_iter().filter(|line| line["task"]["id"] != "waiting").collect();
    assert_eq!(comparable(&restored.ok(&["export"])), archived, "the archive holds the deleted tasks as they were");
    let (_, stderr) = rota.fails(&["status", "done-1"]);
    assert_one_error_line(&stderr, &["done-1"]);
}

#[test]
fn verify_finds_a_history_row_changed_by_hand_in_the_store_or_a_file() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow("pipeline.yaml", PIPELINE);
    let serve = Serve::start(&rota, &files.workflows(), "verify-1", &[]);
    for id in ["done-1", "done-2"] {
        rota.ok(&["submit", "pipeline", "--id", id, "--delay", "1h"]);
        assert_eq!(rota.ok(&["cancel", id, "--reason", "the customer asked"]), "cancelled\n");
    }
    drop(serve);
    let status = rota.json(&["status", "done-1", "--json"]);
    let cancelled = status["history"].as_array().unwrap().iter().find(|e| e["kind"] == "cancelled").cloned().unwrap();
    assert!(cancelled["detail"]["by"].as_str().unwrap().starts_with("cli"), "who cancelled it: {cancelled}");
    assert_eq!(cancelled["detail"]["reason"], "the customer asked");
    assert_eq!(rota.ok(&["verify"]).trim(), "checked 2 task(s), 4 history row(s): every chain holds");
    let exported = rota.ok(&["export"]);
    let export_file = rota.dir().join("tasks.jsonl");
    std::fs::write(&export_file, &exported).unwrap();
    let file = export_file.to_str().unwrap();
    assert_eq!(rota.ok(&["verify", file]).trim(), "checked 2 task(s), 4 history row(s) in 1 file(s): every chain holds");

    std::fs::write(&export_file, exported.replacen(r#""compensate":false"#, r#""compensate":true"#, 1)).unwrap();
    let output = rota.command(&["verify", file]).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with(&format!("{file}:1: task done-2: row 2 (seq ")), "{stdout}");
    assert_one_error_line(&String::from_utf8_lossy(&output.stderr), &["the history of 1 task(s) was changed after it was written"]);
    let (code, stderr) = Rota::new().fails(&["import", file]);
    assert_eq!(code, 1);
    assert_one_error_line(
        &stderr,
        &[&format!("{file}:1: task done-2: the hash chain of its history is broken at row 2 (seq "), "--accept-broken-chains"],
    );
    let imported = Rota::new().ok(&["import", "--accept-broken-chains", file]);
    assert_eq!(
        imported.trim(),
        "imported 2 task(s) from 1 file(s); 1 task(s) whose history's hash chain was broken were imported anyway and chained anew \
         (`rota verify` on the files names them)"
    );

    let db = rusqlite::Connection::open(rota.dir().join("q.db")).unwrap();
    let changed =
        db.execute("UPDATE events SET detail = '{\"compensate\":true}' WHERE task_id = 'done-1' AND kind = 'cancelled'", []).unwrap();
    assert_eq!(changed, 1);
    let output = rota.command(&["verify"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("task done-1: row 2 (seq ") && stdout.contains("this row was changed"), "{stdout}");
}

#[test]
fn serve_with_a_retention_deletes_finished_tasks_and_validate_checks_the_field() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow("pipeline.yaml", &PIPELINE.replace("version: 1\n", "version: 1\nretention: 1s\n"));
    let bad = files.path("bad.yaml");
    std::fs::write(&bad, "name: bad\nversion: 1\nretention: forever\nsteps:\n  - name: a\n    agent: delay\n").unwrap();
    let (_, stderr) = rota.fails(&["validate", bad.to_str().unwrap()]);
    assert!(stderr.starts_with(&format!("{}:3:12: invalid duration \"forever\" for `retention`", bad.display())), "{stderr}");

    let archive = rota.dir().join("archive");
    let flags = ["--retention-interval", "1s", "--archive", archive.to_str().unwrap()];
    let mut serve = Serve::start_with(&rota, &files.workflows(), "retention-1", &[], &flags);
    rota.ok(&["submit", "pipeline", "--id", "short-lived", "--delay", "1h"]);
    rota.ok(&["cancel", "short-lived"]);
    serve.wait_for_line("retention: deleted 1 finished task(s)", Duration::from_secs(15));
    let (_, stderr) = rota.fails(&["status", "short-lived"]);
    assert_one_error_line(&stderr, &["short-lived"]);
    let archived: Vec<String> =
        std::fs::read_dir(&archive).unwrap().map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap()).collect();
    assert_eq!(archived.len(), 1, "one batch, one file");
    assert!(archived[0].starts_with(r#"{"rota_export":1,"task":{"id":"short-lived""#), "{}", archived[0]);

    let not_a_dir = files.path("bad.yaml");
    let (_, stderr) = rota.fails(&["serve", "--workflows", files.workflows().to_str().unwrap(), "--archive", not_a_dir.to_str().unwrap()]);
    assert_one_error_line(&stderr, &["--archive: archive directory", "bad.yaml"]);
}

/// reserve → wait for `approved` → charge, whose input names the approver;
/// an unanswered wait compensates the reservation.
const APPROVAL: &str = r#"
name: approval
version: 1
deadline: 1m
max_failures: 1
on_exhausted: compensate
steps:
  - name: reserve
    agent: exec
    with: { command: ["sh", "-c", "echo '{\"hold\": \"h-1\"}'"] }
    compensate: { agent: exec, with: { command: ["sh", "-c", "echo '{\"released\": true}'"] } }
  - name: approval
    wait: approved
    timeout: 2s
  - name: charge
    agent: exec
    with: { command: ["sh", "-c", "cat"], stdin: { hold: "{{ steps.reserve.output.hold }}", approved_by: "{{ steps.approval.output.by }}" } }
"#;

#[test]
fn an_approval_completes_with_its_signal_and_compensates_without_it() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow("approval.yaml", APPROVAL);
    let _serve = Serve::start(&rota, &files.workflows(), "approval-1", &[]);

    // With the signal: the charge step's template reads its data.
    rota.ok(&["submit", "approval", "--id", "approved-order"]);
    let waiting = wait_for_step(&rota, "approved-order", "approval", "running");
    assert_eq!(waiting["waits_for"], "approved", "{waiting}");
    let text = rota.ok(&["status", "approved-order"]);
    assert!(text.contains("waits for approved"), "status says what the step waits for: {text}");
    assert_eq!(rota.ok(&["signal", "approved-order", "approved", "--data", r#"{"by": "ann"}"#]), "step approval: completed\n");
    let done = wait_for_state(&rota, "approved-order", "processed", Duration::from_secs(20));
    assert_eq!(done["output"]["charge"], json!({ "hold": "h-1", "approved_by": "ann" }), "{done:#}");
    let signal = done["history"].as_array().unwrap().iter().find(|event| event["kind"] == "signal").expect("a signal event").clone();
    assert!(signal["detail"]["sent_by"].as_str().unwrap().starts_with("cli"), "who sent it: {signal}");

    // Without it: the wait times out and the reservation is released.
    rota.ok(&["submit", "approval", "--id", "ignored-order"]);
    let undone = wait_for_state(&rota, "ignored-order", "compensated", Duration::from_secs(20));
    let steps: Vec<(&str, &str)> =
        undone["steps"].as_array().unwrap().iter().map(|s| (s["name"].as_str().unwrap(), s["state"].as_str().unwrap())).collect();
    assert_eq!(steps, [("reserve", "compensated"), ("approval", "failed"), ("charge", "not_started")], "{undone:#}");

    // Refused signals are one clear line and change nothing.
    let (code, stderr) = rota.fails(&["signal", "ignored-order", "approved"]);
    assert!(
        code != 0 && stderr.trim_end() == "error: signal approved: task ignored-order is compensated: it takes no more signals",
        "{stderr}"
    );
    let (code, stderr) = rota.fails(&["signal", "approved-order", "rejected", "--data", "{"]);
    assert!(code != 0 && stderr.contains("--data is not valid JSON"), "{stderr}");
    let (_, stderr) = rota.fails(&["signal", "approved-order", "rejected"]);
    assert!(stderr.contains("no step of task approved-order (workflow approval@1) waits for it (it waits for: approved)"), "{stderr}");
}

/// Waits until step `step` of task `id` is in `state`; returns the step.
fn wait_for_step(rota: &Rota, id: &str, step: &str, state: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let status = rota.json(&["status", id, "--json"]);
        let found = status["steps"].as_array().unwrap().iter().find(|s| s["name"] == step).cloned().unwrap();
        if found["state"] == state {
            return found;
        }
        assert!(std::time::Instant::now() < deadline, "step {step} of {id} never reached {state}: {status:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn operator_errors_are_one_clear_line() {
    let rota = Rota::new();
    rota.ok(&["migrate"]);
    let (code, stderr) = rota.fails(&["status", "nope"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["task nope not found"]);
    for command in [["cancel", "nope"], ["resubmit", "nope"], ["pause", "nope"], ["resume", "nope"]] {
        let (code, stderr) = rota.fails(&command);
        assert_eq!(code, 1);
        assert_one_error_line(&stderr, &["task nope not found"]);
    }

    let (code, stderr) = rota.fails(&["submit", "pipeline", "--input", r#"{"order": 7"#]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["--input is not valid JSON", "at line 1 column 11"]);

    let (code, stderr) = rota.fails(&["submit", "pipeline"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["workflow pipeline", "is not registered", "rota workflows"]);

    let (code, stderr) = rota.fails(&["tasks", "--before", "nope"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["before: task nope not found"]);

    let (code, stderr) = rota.fails(&["tasks", "--state", "bogus"]);
    assert_eq!(code, 2, "a bad flag value is a usage error");
    assert!(stderr.contains("pending, processing, processed, error, compensating, compensated, cancelled"), "{stderr}");
}

// ----------------------------------------------- errors, alerts, resubmit

#[test]
fn a_failed_step_raises_an_alert_and_resubmit_runs_it_again() {
    let rota = Rota::new();
    let files = Files::new();
    let marker = files.path("marker");
    let log = files.path("steps.log");
    files.workflow(
        "fails.yaml",
        r#"
name: fails
version: 1
steps:
  - name: broken
    agent: exec
    with: { command: ["sh", "-c", "echo 'no such thing' >&2; exit 1"] }
"#,
    );
    files.workflow(
        "needs-marker.yaml",
        &format!(
            r#"
name: needs-marker
version: 1
steps:
  - name: first
    agent: exec
    with: {{ command: ["sh", "-c", "echo first >> '{log}'; echo '{{}}'"] }}
  - name: check
    agent: exec
    with: {{ command: ["sh", "-c", "echo check >> '{log}'; test -f '{marker}' && echo '{{\"found\": true}}'"] }}
"#,
            log = log.display(),
            marker = marker.display()
        ),
    );
    let _serve = Serve::start(&rota, &files.workflows(), "alerts-1", &[]);

    // A permanent failure ends the task in Error, and --wait says so.
    let output = rota.command(&["submit", "fails", "--id", "f-1", "--wait"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = stderr_of(&output);
    assert!(stderr.lines().last().unwrap().starts_with("error: task f-1 ended error: "), "{stderr}");
    assert!(stderr.contains("no such thing"), "the step's stderr is in the error: {stderr}");
    let status = rota.json(&["status", "f-1", "--json"]);
    assert_eq!(status["state"], "error");
    assert_eq!(status["steps"][0]["state"], "failed");
    assert!(status["steps"][0]["last_error"].as_str().unwrap().contains("exited 1"), "{status:#}");
    assert_eq!(rota.json(&["tasks", "--state", "error", "--json"])[0]["id"], "f-1");

    let alerts = rota.json(&["alerts", "--json"]);
    let alerts = alerts.as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0]["task_id"], "f-1");
    assert!(alerts[0]["reason"].as_str().unwrap().contains("no such thing"), "{alerts:?}");
    assert!(alerts[0]["at"].as_str().unwrap().ends_with('Z'));
    let table = rota.ok(&["alerts"]);
    assert!(table.starts_with("TASK") && table.contains("f-1"), "{table}");

    // Fixing the cause and resubmitting runs the failed step again, and
    // only it: the completed step is kept.
    let output = rota.command(&["submit", "needs-marker", "--id", "m-1", "--wait"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", stderr_of(&output));
    let status = rota.json(&["status", "m-1", "--json"]);
    assert_eq!((&status["steps"][0]["state"], &status["steps"][1]["state"]), (&json!("completed"), &json!("failed")));
    let (code, stderr) = rota.fails(&["resubmit", "m-1", "--step", "nope"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["step nope of task m-1 (its steps: first, check) not found"]);
    std::fs::write(&marker, "").unwrap();
    assert_eq!(rota.ok(&["resubmit", "m-1"]), "pending\n");
    let status = wait_for_state(&rota, "m-1", "processed", Duration::from_secs(10));
    assert_eq!(status["output"]["check"], json!({ "found": true }));
    assert_eq!(status["steps"][0]["attempts"], 1, "the completed step did not run again");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "first\ncheck\ncheck\n");
    let kinds: Vec<&str> = status["history"].as_array().unwrap().iter().map(|event| event["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"resubmitted"), "{kinds:?}");

    // A processed task cannot be resubmitted.
    let (code, stderr) = rota.fails(&["resubmit", "m-1"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["resubmit: task m-1: "]);
}

#[test]
fn resubmit_with_a_new_input_runs_the_step_and_its_dependents_again() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow(
        "greet.yaml",
        r#"
name: greet
version: 1
steps:
  - name: echo
    agent: exec
    with: { command: ["cat"], stdin: "{{ input.name }}" }
  - name: check
    agent: exec
    with: { command: ["sh", "-c", "test \"$(cat)\" = '\"ok\"' && echo '{\"checked\": true}'"], stdin: "{{ steps.echo.output }}" }
"#,
    );
    let _serve = Serve::start(&rota, &files.workflows(), "greet-1", &[]);
    let output = rota.command(&["submit", "greet", "--id", "g-1", "--input", r#"{"name": "bad"}"#, "--wait"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", stderr_of(&output));

    // --input needs --step, and must be JSON.
    let (code, stderr) = rota.fails(&["resubmit", "g-1", "--input", "{}"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--step"), "{stderr}");
    let (code, stderr) = rota.fails(&["resubmit", "g-1", "--step", "echo", "--input", "{name}"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["--input is not valid JSON: "]);
    assert_eq!(rota.json(&["status", "g-1", "--json"])["input"], json!({ "name": "bad" }), "nothing changed");

    let input = files.path("input.json");
    std::fs::write(&input, r#"{"name": "ok"}"#).unwrap();
    assert_eq!(rota.ok(&["resubmit", "g-1", "--step", "echo", "--input", &format!("@{}", input.display())]), "pending\n");
    let status = wait_for_state(&rota, "g-1", "processed", Duration::from_secs(10));
    assert_eq!(status["input"], json!({ "name": "ok" }));
    assert_eq!(status["output"], json!({ "echo": "ok", "check": { "checked": true } }));
    assert_eq!((&status["steps"][0]["attempts"], &status["steps"][1]["attempts"]), (&json!(2), &json!(2)), "{status:#}");
    let history = status["history"].as_array().unwrap();
    let resubmitted = history.iter().find(|event| event["kind"] == "resubmitted").expect("recorded");
    assert_eq!(resubmitted["detail"]["input"], json!({ "old": { "name": "bad" }, "new": { "name": "ok" } }));
    assert!(resubmitted["detail"]["by"].as_str().unwrap().starts_with("cli"), "{resubmitted:#}");

    // A processed task is refused, and keeps its input.
    let (code, stderr) = rota.fails(&["resubmit", "g-1", "--step", "echo", "--input", "{}"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["resubmit: task g-1: cannot resubmit a task that is processed"]);
    assert_eq!(rota.json(&["status", "g-1", "--json"])["input"], json!({ "name": "ok" }));
}

// -------------------------------------------------------- circuit breakers

/// Runs `rota serve` with `flags` and a workflow calling a port nobody
/// listens on (every call refused: a transient failure), submits one task;
/// returns its `rota status --json` once it shows a breaker of that
/// endpoint, the endpoint and the text of `rota status`.
fn breaker_of_a_down_endpoint(instance: &str, flags: &[&str]) -> (Value, String, String) {
    let rota = Rota::new();
    let files = Files::new();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    files.workflow(
        "down.yaml",
        &format!(
            "name: down\nversion: 1\nsteps:\n  - name: call\n    agent: http\n    with: {{ method: POST, url: \"http://127.0.0.1:{port}/x\" }}\n    \
             timeout: 3s\n    retry: {{ attempts: 20, backoff: 10ms, max_backoff: 20ms }}\n"
        ),
    );
    let _serve = Serve::start_with(&rota, &files.workflows(), instance, &[], flags);
    assert_eq!(rota.ok(&["submit", "down", "--id", "d-1"]), "d-1\n");
    let endpoint = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let status = rota.json(&["status", "d-1", "--json"]);
        if status["breakers"].as_array().unwrap().iter().any(|breaker| breaker["endpoint"] == endpoint.as_str()) {
            break status;
        }
        assert!(Instant::now() < deadline, "no breaker of {endpoint} was reported: {status:#}");
        thread::sleep(Duration::from_millis(100));
    };
    let breaker = status["breakers"].as_array().unwrap().iter().find(|breaker| breaker["endpoint"] == endpoint.as_str()).unwrap().clone();
    let text = rota.ok(&["status", "d-1"]);
    assert!(text.contains("circuit breakers not closed:") && text.contains(&endpoint), "{text}");
    (breaker, endpoint, text)
}

#[test]
fn status_shows_a_shared_circuit_breaker_that_opened_and_holds_the_work() {
    let (breaker, _, text) = breaker_of_a_down_endpoint("breaker-1", &[]);
    assert_eq!(breaker["state"], "open", "{breaker}");
    assert_eq!(breaker["shared"], true, "{breaker}");
    assert_eq!(breaker["consecutive_failures"], 5, "the default opens at 5: {breaker}");
    assert!(breaker["open_until"].as_str().unwrap().ends_with('Z'), "{breaker}");
    assert!(text.contains("(shared)"), "{text}");
}

#[test]
fn status_shows_a_local_circuit_breaker_that_opened() {
    let (breaker, _, _) = breaker_of_a_down_endpoint("breaker-1", &["--breakers", "local"]);
    assert_eq!(breaker["state"], "open", "{breaker}");
    assert_eq!(breaker["shared"], false, "{breaker}");
    assert_eq!(breaker["agent"], "http");
    assert_eq!(breaker["instance"], "breaker-1");
    assert!(breaker["open_until"].as_str().unwrap().ends_with('Z'), "{breaker}");
}

// ------------------------------------------------------------------ cancel

#[test]
fn validate_reports_a_warning_point_that_is_not_before_its_complete_by() {
    let rota = Rota::new();
    let files = Files::new();
    let late = files.workflow(
        "late.yaml",
        "name: late\nversion: 1\ndeadline: 1m\nwarn_after: 2m\nsteps:\n  - name: a\n    agent: delay\n    timeout: 5s\n    warn_after: 5s\n",
    );
    let late = late.display().to_string();
    let (code, stderr) = rota.fails(&["validate", &late]);
    assert_eq!(code, 1);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines,
        [
            format!(
                "{late}:4:13: `warn_after` (2m) must be shorter than `deadline` (1m): the warning must come while there is still time to act"
            ),
            format!(
                "{late}:9:17: step `a`: `warn_after` (5s) must be shorter than `timeout` (5s): the warning must come while there is still time to act"
            ),
            "error: 2 problems in 1 of 1 workflow file".to_owned(),
        ]
    );
    let fine =
        files.workflow("fine.yaml", "name: fine\nversion: 1\nwarn_after: 4m\nsteps:\n  - name: a\n    agent: delay\n    warn_after: 20s\n");
    let fine = fine.display().to_string();
    assert_eq!(rota.ok(&["validate", &fine]), format!("{fine}: ok (workflow fine version 1, 1 step)\n"));
}

#[test]
fn validate_reports_a_bad_condition_where_it_is_wrong() {
    let rota = Rota::new();
    let files = Files::new();
    let bad = files.workflow(
        "bad.yaml",
        "name: bad\nversion: 1\nsteps:\n  - name: a\n    agent: delay\n    when: input.n >\n  - name: b\n    agent: delay\n    depends_on: []\n    when: steps.a.output.ok\n  - name: c\n    agent: delay\n    when: input.x && amount > 1\n",
    );
    let bad = bad.display().to_string();
    let (code, stderr) = rota.fails(&["validate", &bad]);
    assert_eq!(code, 1);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 4, "{stderr}");
    assert!(lines[0].starts_with(&format!("{bad}:6:20: step `a`: `when`: Syntax error: mismatched input '<EOF>'")), "{stderr}");
    assert_eq!(
        lines[1..],
        [
            format!("{bad}:10:11: step `b`: `when` refers to step `a`, which is not upstream (add it to `depends_on`)"),
            format!(
                "{bad}:13:22: step `c`: `when`: unknown name `amount`: a condition may refer to `input` and to upstream steps as `steps.NAME`"
            ),
            "error: 3 problems in 1 of 1 workflow file".to_owned(),
        ]
    );
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workflows/shipping.yaml");
    let stdout = rota.ok(&["validate", example.to_str().unwrap()]);
    assert!(stdout.trim_end().ends_with("shipping.yaml: ok (workflow shipping version 1, 4 steps)"), "{stdout}");
}

#[test]
fn a_step_whose_condition_is_false_is_skipped_and_shown_so() {
    let rota = Rota::new();
    let files = Files::new();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workflows/shipping.yaml");
    files.workflow("shipping.yaml", &std::fs::read_to_string(example).unwrap());
    let _serve = Serve::start(&rota, &files.workflows(), "shipping-1", &[]);

    rota.ok(&["submit", "shipping", "--id", "light", "--input", r#"{"order_id": 1, "kg": 2, "value": 5000}"#]);
    rota.ok(&["submit", "shipping", "--id", "heavy", "--input", r#"{"order_id": 2, "kg": 40, "value": 5000}"#]);
    let light = wait_for_state(&rota, "light", "processed", Duration::from_secs(20));
    let states = |task: &Value| -> Vec<(String, String)> {
        task["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["name"].as_str().unwrap().into(), s["state"].as_str().unwrap().into()))
            .collect()
    };
    let expected = |freight: &str, insure: &str| -> Vec<(String, String)> {
        [("weigh", "completed"), ("freight", freight), ("label", "completed"), ("insure", insure)]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(states(&light), expected("skipped", "skipped"), "{light:#}");
    assert_eq!(light["output"], json!({ "weigh": { "kg": 2 }, "label": { "order": 1 } }), "skipped steps have no entry");
    let skipped: Vec<&Value> = light["history"].as_array().unwrap().iter().filter(|e| e["kind"] == "step_skipped").collect();
    assert_eq!(skipped.len(), 2, "{light:#}");
    assert_eq!(skipped[0]["detail"]["when"], "steps.weigh.output.kg > 30");
    let text = rota.ok(&["status", "light"]);
    assert!(text.lines().any(|line| line.starts_with("freight") && line.contains("skipped")), "{text}");

    let heavy = wait_for_state(&rota, "heavy", "processed", Duration::from_secs(20));
    assert_eq!(states(&heavy), expected("completed", "completed"), "{heavy:#}");
    assert_eq!(heavy["output"]["insure"], json!({ "carrier": "freight" }));
}

#[test]
fn a_for_each_step_runs_each_item_and_status_shows_the_instances() {
    let rota = Rota::new();
    let files = Files::new();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workflows/refunds.yaml");
    let stdout = rota.ok(&["validate", example.to_str().unwrap()]);
    assert!(stdout.trim_end().ends_with("refunds.yaml: ok (workflow refunds version 1, 3 steps)"), "{stdout}");
    files.workflow("refunds.yaml", &std::fs::read_to_string(example).unwrap());
    let _serve = Serve::start(&rota, &files.workflows(), "refunds-1", &[]);
    let orders = r#"{"orders": [{"id": "a", "amount": 5}, {"id": "b", "amount": 0}, {"id": "c", "amount": 7}]}"#;
    rota.ok(&["submit", "refunds", "--id", "r-1", "--input", orders]);
    let task = wait_for_state(&rota, "r-1", "processed", Duration::from_secs(20));
    let steps: Vec<(String, String)> = task["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap().into(), s["state"].as_str().unwrap().into()))
        .collect();
    for name in ["refund", "refund[0]", "refund[1]"] {
        assert!(steps.contains(&(name.to_owned(), "completed".to_owned())), "{name} completed: {steps:?}");
    }
    assert!(!steps.iter().any(|(name, _)| name == "refund[2]"), "the filter left two items: {steps:?}");
    let refunded = json!([{ "order": "a", "amount": 5, "n": 0 }, { "order": "c", "amount": 7, "n": 1 }]);
    assert_eq!(task["output"]["refund"], refunded, "{task:#}");
    assert_eq!(task["output"]["report"], json!({ "refunded": refunded }));
    assert!(task["output"].get("refund[0]").is_none(), "instances have no entry of their own");
    let text = rota.ok(&["status", "r-1"]);
    assert!(text.lines().any(|line| line.starts_with("refund[1]") && line.contains("completed")), "{text}");
}

#[test]
fn tasks_at_risk_lists_a_task_whose_step_passed_its_warning_point() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow(
        "risky.yaml",
        "name: risky\nversion: 1\nsteps:\n  - name: wait\n    agent: delay\n    with: { for: \"60s\" }\n    timeout: 2m\n    warn_after: 300ms\n",
    );
    let help = rota.ok(&["tasks", "--help"]);
    assert!(help.contains("--at-risk") && help.contains("deadline warning"), "{help}");
    let serve = Serve::start(&rota, &files.workflows(), "risk-1", &[]);
    let output = rota.command(&["tasks", "--at-risk"]).output().unwrap();
    assert!(output.status.success());
    assert_eq!((stdout_of(&output).as_str(), stderr_of(&output).trim()), ("", "no tasks"), "nothing is at risk yet");
    assert_eq!(rota.ok(&["submit", "risky", "--id", "r-1"]), "r-1\n");
    let deadline = Instant::now() + Duration::from_secs(15);
    let listed = loop {
        let listed = rota.json(&["tasks", "--at-risk", "--json"]);
        if !listed.as_array().unwrap().is_empty() {
            break listed;
        }
        assert!(Instant::now() < deadline, "r-1 never became at risk: {:#}", rota.json(&["status", "r-1", "--json"]));
        thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed:#}");
    assert_eq!((&listed[0]["id"], &listed[0]["state"]), (&json!("r-1"), &json!("processing")));
    assert!(listed[0]["at_risk_since"].as_str().unwrap().ends_with('Z'), "{listed:#}");
    let table = rota.ok(&["tasks", "--at-risk"]);
    assert!(table.starts_with("ID") && table.contains("r-1") && table.contains("processing, at risk since "), "{table}");
    let alerts = rota.ok(&["alerts"]);
    assert!(alerts.contains("r-1") && alerts.contains("step wait attempt 1 passed its warn_after with "), "{alerts}");
    let status = rota.json(&["status", "r-1", "--json"]);
    assert!(status["at_risk_since"].is_string() && status["steps"][0]["warn_at"].is_string(), "{status:#}");
    let kinds: Vec<&str> = status["history"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "at_risk").count(), 1, "warned once: {kinds:?}");

    // Cancelled, it is at risk no more.
    assert_eq!(rota.ok(&["cancel", "r-1"]), "cancelled\n");
    assert_eq!(rota.json(&["tasks", "--at-risk", "--json"]), json!([]));
    let (status, _, stderr) = serve.terminate();
    assert_eq!(status.code(), Some(0), "{stderr}");
}

#[test]
fn cancel_stops_a_task_stuck_in_a_long_step() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow(
        "slow.yaml",
        r#"
name: slow
version: 1
steps:
  - name: wait
    agent: delay
    with: { for: "60s" }
    timeout: 2m
  - name: after
    agent: delay
    with: { ms: 1 }
"#,
    );
    let serve = Serve::start(&rota, &files.workflows(), "cancel-1", &[]);
    assert_eq!(rota.ok(&["submit", "slow", "--id", "s-1"]), "s-1\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = rota.json(&["status", "s-1", "--json"]);
        if status["steps"][0]["state"] == "running" {
            assert_eq!(status["state"], "processing");
            assert_eq!(status["locked_by"], "cancel-1");
            assert_eq!(status["steps"][0]["owner"], "cancel-1", "{status:#}");
            assert!(status["steps"][0]["complete_by"].is_string());
            break;
        }
        assert!(Instant::now() < deadline, "the step never started: {status:#}");
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(rota.ok(&["cancel", "s-1"]), "cancelled\n");
    let status = rota.json(&["status", "s-1", "--json"]);
    assert_eq!(status["state"], "cancelled");
    assert_eq!(status["steps"][1]["state"], "not_started");
    let (code, stderr) = rota.fails(&["cancel", "s-1"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["cancel: task s-1: ", "cancelled"]);

    // The agent is still in its 60 s sleep: a stop gives it the consumer's
    // shutdown grace, then gives its message back.
    let (status, took, stderr) = serve.terminate();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(took < Duration::from_secs(15), "stopping took {took:?}");
}

#[test]
fn a_paused_task_finishes_its_step_and_waits_for_resume() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow(
        "held.yaml",
        r#"
name: held
version: 1
steps:
  - name: hold
    agent: delay
    with: { for: "1s" }
  - name: next
    agent: delay
    with: { ms: 1 }
"#,
    );
    let _serve = Serve::start(&rota, &files.workflows(), "pause-1", &[]);
    rota.ok(&["submit", "held", "--id", "h-1"]);
    wait_for_step(&rota, "h-1", "hold", "running");
    assert_eq!(rota.ok(&["pause", "h-1", "--reason", "the payment service is down"]), "paused (processing)\n");
    let given_back = wait_for_state(&rota, "h-1", "pending", Duration::from_secs(20));
    assert_eq!((&given_back["paused"], &given_back["locked_by"]), (&json!(true), &Value::Null), "{given_back:#}");
    assert_eq!(given_back["steps"][0]["state"], "completed", "the step in flight finished: {given_back:#}");
    thread::sleep(Duration::from_millis(500));
    let status = rota.json(&["status", "h-1", "--json"]);
    assert_eq!((&status["state"], &status["steps"][1]["state"]), (&json!("pending"), &json!("not_started")), "{status:#}");
    let paused = status["history"].as_array().unwrap().iter().find(|e| e["kind"] == "paused").cloned().unwrap();
    assert!(paused["detail"]["by"].as_str().unwrap().starts_with("cli"), "who paused it: {paused}");
    assert_eq!(paused["detail"]["reason"], "the payment service is down");
    assert!(rota.ok(&["status", "h-1"]).contains("pending, paused"), "status says so");
    assert!(rota.ok(&["tasks"]).contains("pending, paused"), "the listing says so");
    assert_eq!(rota.json(&["tasks", "--json"])[0]["paused"], true);
    let (code, stderr) = rota.fails(&["pause", "h-1"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["pause: task h-1: cannot pause a task that is paused"]);

    assert_eq!(rota.ok(&["resume", "h-1"]), "resumed (pending)\n");
    let done = wait_for_state(&rota, "h-1", "processed", Duration::from_secs(20));
    assert_eq!(done["paused"], false);
    let (code, stderr) = rota.fails(&["resume", "h-1"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["resume: task h-1: cannot resume a task that is not paused"]);
}

#[test]
fn a_paused_workflows_tasks_wait_until_it_is_resumed() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow(
        "quick.yaml",
        r#"
name: quick
version: 1
steps:
  - name: only
    agent: delay
    with: { ms: 1 }
"#,
    );
    let _serve = Serve::start(&rota, &files.workflows(), "wf-pause-1", &[]);
    assert_eq!(rota.ok(&["workflows", "pause", "quick", "--reason", "the payment service is down"]), "paused\n");
    let listed = rota.ok(&["workflows"]);
    assert!(listed.contains("paused by cli"), "the listing says so: {listed}");
    let json = rota.json(&["workflows", "--json"]);
    assert_eq!((&json[0]["paused"], &json[0]["pause"]["reason"]), (&json!(true), &json!("the payment service is down")), "{json:#}");
    assert!(json[0]["pause"]["by"].as_str().unwrap().starts_with("cli"), "who paused it: {json:#}");

    rota.ok(&["submit", "quick", "--id", "q-1"]);
    thread::sleep(Duration::from_millis(500));
    let status = rota.json(&["status", "q-1", "--json"]);
    assert_eq!((&status["state"], &status["workflow_paused"]), (&json!("pending"), &json!(true)), "{status:#}");
    assert!(rota.ok(&["status", "q-1"]).contains("quick@1 (paused)"), "status says why it waits");
    let (code, stderr) = rota.fails(&["workflows", "pause", "quick"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["pause: workflow quick is paused already"]);
    let (_, stderr) = rota.fails(&["workflows", "pause", "nope"]);
    assert_one_error_line(&stderr, &["nope is not registered"]);

    assert_eq!(rota.ok(&["workflows", "resume", "quick"]), "resumed\n");
    let done = wait_for_state(&rota, "q-1", "processed", Duration::from_secs(20));
    assert_eq!(done["workflow_paused"], false);
    let (_, stderr) = rota.fails(&["workflows", "resume", "quick"]);
    assert_one_error_line(&stderr, &["resume: workflow quick is not paused"]);
}

// ------------------------------------------------------ real processes

/// A workflow of `steps` exec steps, each logging `$RUN <idempotency key>
/// <attempt>` to `$STEP_LOG`, then sleeping `sleep` seconds.
fn logging_workflow(name: &str, steps: usize, sleep: &str, deadline: &str) -> String {
    let mut yaml = format!("name: {name}\nversion: 1\ndeadline: {deadline}\nmax_failures: 5\nsteps:\n");
    for i in 1..=steps {
        yaml.push_str(&format!(
            "  - name: s{i}\n    agent: exec\n    timeout: 2s\n    with: {{ command: [\"sh\", \"-c\", \"echo \\\"$RUN $ROTA_IDEMPOTENCY_KEY $ROTA_ATTEMPT\\\" >> \\\"$STEP_LOG\\\"; sleep {sleep}; echo '{{}}'\"] }}\n"
        ));
    }
    yaml
}

/// The log's lines as (run, task, step).
fn log_entries(log: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|line| {
            let mut parts = line.split(' ');
            let run = parts.next().unwrap().to_owned();
            let key = parts.next().unwrap_or_else(|| panic!("a log line without a key: {line:?}"));
            let (task, step) = key.rsplit_once('/').unwrap_or_else(|| panic!("a key without a step: {line:?}"));
            (run, task.to_owned(), step.to_owned())
        })
        .collect()
}

fn submit_all(rota: &Rota, workflow: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|i| {
            let id = format!("t-{i:03}");
            assert_eq!(rota.ok(&["submit", workflow, "--id", &id]).trim(), id);
            id
        })
        .collect()
}

/// Each task's history events, by task id.
fn histories(rota: &Rota, ids: &[String]) -> BTreeMap<String, Vec<Value>> {
    ids.iter().map(|id| (id.clone(), rota.json(&["status", id, "--json"])["history"].as_array().unwrap().clone())).collect()
}

#[test]
fn sigkill_mid_run_then_restart_runs_no_completed_step_again() {
    const TASKS: usize = 12;
    const STEPS: usize = 4;
    let rota = Rota::new();
    let files = Files::new();
    let log = files.path("steps.log");
    let log_env = log.to_str().unwrap();
    files.workflow("chain.yaml", &logging_workflow("chain", STEPS, "0.3", "3s"));

    let first = Serve::start(&rota, &files.workflows(), "crash-1", &[("RUN", "before"), ("STEP_LOG", log_env)]);
    let ids = submit_all(&rota, "chain", TASKS);
    // Kill once some steps have run but most tasks are mid-way.
    let deadline = Instant::now() + Duration::from_secs(15);
    while log_entries(&log).len() < TASKS + TASKS / 2 {
        assert!(Instant::now() < deadline, "the steps did not start: {:?}", log_entries(&log));
        thread::sleep(Duration::from_millis(20));
    }
    first.kill();
    let killed_at = Instant::now();

    // With no process running, read what was recorded as completed.
    let before = histories(&rota, &ids);
    let completed_before: BTreeSet<(String, String)> = before
        .iter()
        .flat_map(|(id, events)| {
            events
                .iter()
                .filter(|event| event["kind"] == "step_completed")
                .map(|event| (id.clone(), event["step"].as_str().unwrap().to_owned()))
        })
        .collect();
    let unfinished = before.values().filter(|events| !events.iter().any(|event| event["kind"] == "processed")).count();
    assert!(unfinished > 0, "every task finished before the kill; the test needs tasks in flight");
    assert!(!completed_before.is_empty(), "no step completed before the kill");

    let _second = Serve::start(&rota, &files.workflows(), "crash-2", &[("RUN", "after"), ("STEP_LOG", log_env)]);
    // A task that times out again on a loaded machine waits out the
    // recovery backoff (0.5 s doubling) each time: allow for several rounds.
    // On a loaded machine the kill often comes right after the last submit,
    // between that task's claim and its start: it then waits for the claim
    // lease (10 s) before the Supervisor frees it.
    let tasks = wait_for_all_terminal(&rota, TASKS, Duration::from_secs(60));
    for task in &tasks {
        assert_eq!(task["state"], "processed", "{task}");
    }
    eprintln!(
        "{} steps completed and {unfinished} tasks unfinished at the kill; all {TASKS} processed {:?} after it",
        completed_before.len(),
        killed_at.elapsed()
    );

    let entries = log_entries(&log);
    let rerun: Vec<&(String, String, String)> =
        entries.iter().filter(|(run, task, step)| run == "after" && completed_before.contains(&(task.clone(), step.clone()))).collect();
    assert!(rerun.is_empty(), "steps recorded as completed before the kill ran again after the restart: {rerun:?}");
    // Every step ran, and each completed exactly once.
    let after = histories(&rota, &ids);
    for (id, events) in &after {
        for i in 1..=STEPS {
            let step = format!("s{i}");
            let completions = events.iter().filter(|event| event["kind"] == "step_completed" && event["step"] == step.as_str()).count();
            assert_eq!(completions, 1, "task {id} step {step} completed {completions} times");
            assert!(entries.iter().any(|(_, task, s)| task == id && *s == step), "task {id} step {step} never ran");
        }
    }
    // The recovered tasks were claimed by the second instance after the
    // Supervisor reset them.
    let recovered = after.values().filter(|events| events.iter().any(|event| event["kind"] == "expired")).count();
    assert!(recovered > 0, "no task was recovered by the Supervisor");
}

/// Two `rota serve` on one SQLite file, 30 tasks: each claimed once, each
/// step run once, none recovered. Which process gets how many is up to the
/// race; a round where one process took everything (seen under heavy load,
/// the other starved of CPU) exercised no competition, so it is run again,
/// up to three rounds, and one of them must show both processes claiming.
#[test]
fn two_serve_processes_on_one_store_never_run_a_task_twice() {
    const ROUNDS: usize = 3;
    let mut seen = Vec::new();
    for _ in 0..ROUNDS {
        let claims_by = two_serve_processes_round();
        if claims_by.len() == 2 {
            return;
        }
        eprintln!("one process claimed every task: {claims_by:?}; another round");
        seen.push(claims_by);
    }
    panic!("in {ROUNDS} rounds one process claimed every task: {seen:?}");
}

/// One round of the test above: its checks, and the claims per instance.
fn two_serve_processes_round() -> BTreeMap<String, usize> {
    const TASKS: usize = 30;
    const STEPS: usize = 3;
    let rota = Rota::new();
    let files = Files::new();
    let log = files.path("steps.log");
    let log_env = log.to_str().unwrap();
    files.workflow("pair.yaml", &logging_workflow("pair", STEPS, "0.02", "30s"));

    let a = Serve::start(&rota, &files.workflows(), "pair-a", &[("RUN", "a"), ("STEP_LOG", log_env)]);
    let b = Serve::start(&rota, &files.workflows(), "pair-b", &[("RUN", "b"), ("STEP_LOG", log_env)]);
    let ids = submit_all(&rota, "pair", TASKS);
    let tasks = wait_for_all_terminal(&rota, TASKS, Duration::from_secs(25));
    for task in &tasks {
        assert_eq!(task["state"], "processed", "{task}");
    }

    let mut claims_by: BTreeMap<String, usize> = BTreeMap::new();
    for (id, events) in histories(&rota, &ids) {
        let owners: Vec<&str> =
            events.iter().filter(|event| event["kind"] == "claimed").map(|event| event["detail"]["owner"].as_str().unwrap()).collect();
        assert_eq!(owners.len(), 1, "task {id} was claimed {} times: {owners:?}", owners.len());
        *claims_by.entry(owners[0].to_owned()).or_default() += 1;
        assert!(!events.iter().any(|event| event["kind"] == "expired"), "task {id} needed recovery without a fault");
    }
    // Each step ran exactly once, in whichever process's agent took it.
    let mut runs: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut runs_by: BTreeMap<String, usize> = BTreeMap::new();
    for (run, task, step) in log_entries(&log) {
        *runs.entry((task, step)).or_default() += 1;
        *runs_by.entry(run).or_default() += 1;
    }
    assert_eq!(runs.len(), TASKS * STEPS);
    let repeated: Vec<_> = runs.iter().filter(|(_, count)| **count > 1).collect();
    assert!(repeated.is_empty(), "steps ran more than once: {repeated:?}");
    eprintln!("claims by instance: {claims_by:?}; step runs by process: {runs_by:?}");

    for serve in [a, b] {
        let (status, _, stderr) = serve.terminate();
        assert_eq!(status.code(), Some(0), "{stderr}");
    }
    // Submissions come one at a time, each with its doorbell, so both
    // Schedulers mostly get some (from a tenth to a half each, seen).
    claims_by
}

// ---------------------------------------------------------- response queues

/// Every message of `queue`, leased with `queue receive` and completed with
/// `queue complete` round after round (a receive leases one message per
/// ordering key at a time), in the order received.
fn read_queue(rota: &Rota, queue: &str) -> Vec<Value> {
    let mut all = Vec::new();
    loop {
        let batch = rota.json(&["queue", "receive", queue, "--max", "1000", "--json"]);
        let batch = batch.as_array().unwrap().clone();
        if batch.is_empty() {
            return all;
        }
        for delivery in batch {
            rota.ok(&["queue", "complete", queue, delivery["lease_token"].as_str().unwrap()]);
            all.push(delivery);
        }
    }
}

/// The issue's "done when": an application submits tasks with a response
/// queue and is down while they run; when it starts again it reads every
/// status event of every task from the queue, in order per task.
#[test]
fn an_application_reads_every_status_event_from_its_reply_queue_after_being_down() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow("pipeline.yaml", PIPELINE);
    files.workflow(
        "fails.yaml",
        r#"
name: fails
version: 1
steps:
  - name: broken
    agent: exec
    with: { command: ["sh", "-c", "echo 'out of stock' >&2; exit 1"] }
"#,
    );
    let serve = Serve::start(&rota, &files.workflows(), "replies-1", &[]);
    let mut ids = Vec::new();
    for order in 0..4 {
        let input = format!(r#"{{"order": {order}}}"#);
        ids.push(rota.ok(&["submit", "pipeline", "--input", &input, "--reply-queue", "shop.replies"]).trim().to_owned());
    }
    ids.push(rota.ok(&["submit", "fails", "--id", "f-1", "--reply-queue", "shop.replies"]).trim().to_owned());
    rota.ok(&["submit", "pipeline", "--id", "unwatched"]);
    for id in &ids {
        let status = rota.json(&["status", id, "--json"]);
        assert_eq!(status["reply_queue"], "shop.replies", "{status:#}");
    }
    wait_for_all_terminal(&rota, 6, Duration::from_secs(30));
    let (status, _, stderr) = serve.terminate();
    assert_eq!(status.code(), Some(0), "{stderr}");

    // The application starts now, with the engine stopped.
    let mut per_task: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for delivery in read_queue(&rota, "shop.replies") {
        let body = &delivery["body"];
        assert_eq!(delivery["ordering_key"], body["correlation_id"], "keyed by task: {delivery}");
        per_task.entry(body["correlation_id"].as_str().unwrap().to_owned()).or_default().push(body.clone());
    }
    let mut expected_ids = ids.clone();
    expected_ids.sort();
    assert_eq!(per_task.keys().cloned().collect::<Vec<_>>(), expected_ids, "every task with a reply queue, and only those");
    let status_kinds = ["received", "step_completed", "processed", "error", "compensated", "cancelled"];
    for (id, messages) in &per_task {
        let status = rota.json(&["status", id, "--json"]);
        let history: Vec<(Value, Value)> = status["history"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| status_kinds.contains(&e["kind"].as_str().unwrap()))
            .map(|e| (e["kind"].clone(), e["step"].clone()))
            .collect();
        let got: Vec<(Value, Value)> =
            messages.iter().map(|m| (m["event"].clone(), m.get("step").cloned().unwrap_or(Value::Null))).collect();
        assert_eq!(got, history, "task {id}: every status event, in order");
        assert_eq!(messages.last().unwrap()["state"], status["state"], "task {id}");
    }
    let kinds = |id: &str| per_task[id].iter().map(|m| m["event"].as_str().unwrap().to_owned()).collect::<Vec<_>>();
    assert_eq!(kinds(&ids[0]), ["received", "step_completed", "step_completed", "processed"]);
    assert_eq!(per_task[&ids[0]][3]["output"]["echo"]["order"], 0, "the output comes with the end");
    assert_eq!(kinds("f-1"), ["received", "error"]);
    assert!(per_task["f-1"][1]["error"].as_str().unwrap().contains("out of stock"), "{:?}", per_task["f-1"]);
    assert_eq!(rota.json(&["queue", "receive", "shop.replies", "--json"]), json!([]), "nothing was delivered twice");
}

#[test]
fn a_bad_reply_queue_is_refused_naming_it() {
    let rota = Rota::new();
    let files = Files::new();
    files.workflow("pipeline.yaml", PIPELINE);
    let _serve = Serve::start(&rota, &files.workflows(), "replies-2", &[]);
    let (code, stderr) = rota.fails(&["submit", "pipeline", "--reply-queue", "has space"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--reply-queue"), "{stderr}");
    let (code, stderr) = rota.fails(&["submit", "pipeline", "--reply-queue", "rota.tasks"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["reply_queue: \"rota.tasks\" is reserved"]);
    assert_eq!(rota.json(&["tasks", "--json"]), json!([]), "nothing was submitted");
}
