//! The HTTP API in the real binary: `rota serve --listen` and `rota api` on a
//! temporary SQLite store, driven over HTTP (submit, server-sent events,
//! result), tokens from an `--auth` file and from `ROTA_API_TOKEN`, the
//! operator commands with `--server` printing what they print on the store,
//! and SIGTERM stopping cleanly.
//!
//! Real processes and real time, each test a few seconds.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{Rota, assert_one_error_line, lines_of};
use serde_json::{Value, json};

/// How long a test waits for a server to say where it listens.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long one HTTP request (or a whole event stream) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a server may take to stop after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

const ADMIN_TOKEN: &str = "admin-token-for-the-api-tests";
const SUBMIT_TOKEN: &str = "submit-token-for-the-api-tests";

/// Two steps: a short delay, then `cat` of the input's order.
const PIPELINE: &str = r#"
name: pipeline
version: 1
steps:
  - name: pause
    agent: delay
    with: { for: "50ms" }
  - name: echo
    agent: exec
    with: { command: ["sh", "-c", "cat"], stdin: { order: "{{ input.order }}" } }
"#;

/// One step that sleeps for a minute: a task to cancel.
const SLOW: &str = r#"
name: slow
version: 1
steps:
  - name: wait
    agent: delay
    with: { for: "60s" }
    timeout: 2m
"#;

/// A step that waits for the signal `approved`, then one that reads it.
const APPROVAL: &str = r#"
name: approval
version: 1
steps:
  - name: approval
    wait: approved
    timeout: 2m
  - name: echo
    agent: exec
    with: { command: ["sh", "-c", "cat"], stdin: { by: "{{ steps.approval.output.by }}" } }
"#;

/// A workflows directory and an `--auth` file in a temporary directory.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        let files = Files { dir: tempfile::tempdir().unwrap() };
        let workflows = files.workflows();
        std::fs::create_dir_all(&workflows).unwrap();
        std::fs::write(workflows.join("pipeline.yaml"), PIPELINE).unwrap();
        std::fs::write(workflows.join("slow.yaml"), SLOW).unwrap();
        std::fs::write(workflows.join("approval.yaml"), APPROVAL).unwrap();
        files
    }

    fn workflows(&self) -> PathBuf {
        self.dir.path().join("workflows")
    }

    /// An auth file with an admin token (read from the environment
    /// variable `ROTA_TEST_ADMIN`) and a submit token (inline).
    fn auth(&self) -> PathBuf {
        let path = self.dir.path().join("auth.toml");
        let text = format!(
            "[[tokens]]\nname = \"ops\"\ntoken_env = \"ROTA_TEST_ADMIN\"\nscopes = [\"admin\"]\n\n\
             [[tokens]]\nname = \"shop\"\ntoken = \"{SUBMIT_TOKEN}\"\nscopes = [\"submit\"]\n"
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// A `rota serve` or `rota api` child that listens on a free port; killed when dropped.
struct Server {
    child: Child,
    stderr: mpsc::Receiver<String>,
    seen: Vec<String>,
    /// `http://127.0.0.1:PORT`, as the server logged it.
    url: String,
}

impl Server {
    /// Starts `rota ARGS` (which must listen on port 0) with `env`, and
    /// waits for the line that says where it listens.
    fn start(rota: &Rota, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut command = rota.command(args);
        command.stdout(Stdio::null()).stderr(Stdio::piped()).env_remove("ROTA_API_TOKEN").env_remove("ROTA_SERVER");
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().expect("rota starts");
        let stderr = lines_of(child.stderr.take().unwrap());
        let mut server = Server { child, stderr, seen: Vec::new(), url: String::new() };
        let line = server.wait_for_line("listening on http://", STARTUP_TIMEOUT);
        let address = line.split("listening on ").nth(1).unwrap().split_whitespace().next().unwrap();
        server.url = address.to_owned();
        server
    }

    /// `rota serve --listen 127.0.0.1:0` with the test workflows and a quick Supervisor.
    fn serve(rota: &Rota, files: &Files, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let workflows = files.workflows();
        let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--workflows", workflows.to_str().unwrap(), "--instance-id", "api-1"];
        args.extend(["--supervisor-interval", "200ms"]);
        args.extend(extra);
        Server::start(rota, &args, env)
    }

    fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => break,
            }
        }
        panic!("rota did not log {needle:?} within {timeout:?}; its stderr:\n{}", self.seen.join("\n"));
    }

    /// Sends SIGTERM; the exit status and everything it logged.
    fn terminate(mut self) -> (std::process::ExitStatus, String) {
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + STOP_TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "rota did not stop within {STOP_TIMEOUT:?} of SIGTERM");
            thread::sleep(Duration::from_millis(20));
        };
        self.seen.extend(self.stderr.try_iter());
        (status, self.seen.join("\n"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A blocking HTTP client (reqwest on its own runtime) for one server.
struct Http {
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
    base: String,
}

/// A response: status, headers of interest, body text.
struct Answer {
    status: u16,
    content_type: String,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|err| panic!("not JSON ({err}): {}", self.body))
    }
}

impl Http {
    fn new(server: &Server) -> Http {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = rota_agent::http_client().timeout(REQUEST_TIMEOUT).build().unwrap();
        Http { runtime, client, base: server.url.clone() }
    }

    fn send(&self, method: reqwest::Method, path: &str, token: Option<&str>, body: Option<Value>) -> Answer {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        self.runtime.block_on(async {
            let response = request.send().await.expect("the request is answered");
            let status = response.status().as_u16();
            let content_type = response.headers().get("content-type").map(|value| value.to_str().unwrap().to_owned()).unwrap_or_default();
            let body = response.text().await.expect("the body is read");
            Answer { status, content_type, body }
        })
    }

    fn get(&self, path: &str, token: Option<&str>) -> Answer {
        self.send(reqwest::Method::GET, path, token, None)
    }

    fn post(&self, path: &str, token: Option<&str>, body: Option<Value>) -> Answer {
        self.send(reqwest::Method::POST, path, token, body)
    }
}

/// The `data:` lines of a server-sent event stream, as JSON, and the names of its `event:` lines.
fn sse_data(stream: &str) -> (Vec<Value>, Vec<String>) {
    let data =
        stream.lines().filter_map(|line| line.strip_prefix("data:")).map(|data| serde_json::from_str(data.trim()).unwrap()).collect();
    let names = stream.lines().filter_map(|line| line.strip_prefix("event:")).map(|name| name.trim().to_owned()).collect();
    (data, names)
}

/// Polls `GET /v1/tasks/{id}` until its state is `state`.
fn wait_for_state(http: &Http, id: &str, state: &str, token: &str) -> Value {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    loop {
        let task = http.get(&format!("/v1/tasks/{id}"), Some(token)).json();
        if task["state"] == state {
            return task;
        }
        assert!(Instant::now() < deadline, "task {id} is not {state}: {task:#}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `rota --server URL --token TOKEN args…` and returns what it printed.
fn remote(rota: &Rota, server: &Server, token: &str, args: &[&str]) -> std::process::Output {
    let mut full = vec!["--server", server.url.as_str(), "--token", token];
    full.extend(args);
    rota.command(&full).env_remove("ROTA_SERVER").env_remove("ROTA_TOKEN").output().expect("rota runs")
}

fn stdout(output: &std::process::Output) -> String {
    assert!(output.status.success(), "failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout.clone()).unwrap()
}

#[test]
fn serve_listens_and_runs_a_task_submitted_over_http() {
    let rota = Rota::new();
    let files = Files::new();
    let auth = files.auth();
    let mut server = Server::serve(&rota, &files, &["--auth", auth.to_str().unwrap()], &[("ROTA_TEST_ADMIN", ADMIN_TOKEN)]);
    assert!(server.url.starts_with("http://127.0.0.1:") && !server.url.ends_with(":0"), "{}", server.url);
    assert!(!server.seen.join("\n").contains(ADMIN_TOKEN) && !server.seen.join("\n").contains(SUBMIT_TOKEN), "tokens are never logged");
    let http = Http::new(&server);

    // Without a token, or with an unknown one: 401; out of scope: 403; open routes need none.
    let denied = http.get("/v1/tasks", None);
    assert_eq!((denied.status, denied.json()["error"]["code"].as_str()), (401, Some("unauthorized")), "{}", denied.body);
    assert_eq!(http.get("/v1/tasks", Some("not-a-configured-token")).status, 401);
    let listed = http.get("/v1/tasks", Some(SUBMIT_TOKEN));
    assert_eq!((listed.status, listed.json()), (200, json!([])), "the submit scope lists its own tasks: none yet");
    assert_eq!(http.get("/healthz", None).status, 200);
    let openapi = http.get("/openapi.json", None);
    assert_eq!(openapi.status, 200);
    assert!(openapi.json()["paths"]["/v1/tasks"].is_object());
    // The dashboard's address is printed, and it asks for a token to sign in.
    let dashboard = server.wait_for_line("dashboard at http://", STARTUP_TIMEOUT);
    assert!(dashboard.contains(&format!("dashboard at {}/ui", server.url)), "{dashboard} names {}", server.url);
    let login = http.get("/ui/login", None);
    assert!(login.status == 200 && login.body.contains("Sign in"), "{}", login.body);

    // Submit, follow the events until the end, read the result: what the README shows with curl.
    let submitted = http.post("/v1/tasks", Some(SUBMIT_TOKEN), Some(json!({"workflow": "pipeline", "id": "o-1", "input": {"order": 7}})));
    assert_eq!(submitted.status, 201, "{}", submitted.body);
    assert_eq!(submitted.json()["id"], "o-1");
    let events = http.get("/v1/tasks/o-1/events", Some(SUBMIT_TOKEN));
    assert_eq!(events.status, 200);
    assert!(events.content_type.starts_with("text/event-stream"), "{}", events.content_type);
    let (data, names) = sse_data(&events.body);
    let kinds: Vec<&str> = data.iter().filter_map(|event| event["kind"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"received"), "{}", events.body);
    assert!(kinds.contains(&"step_completed") && kinds.contains(&"processed"), "{}", events.body);
    assert_eq!(names, ["end"], "{}", events.body);
    assert_eq!(data.last().unwrap(), &json!({"task_id": "o-1", "state": "processed"}));
    let task = http.get("/v1/tasks/o-1", Some(SUBMIT_TOKEN)).json();
    assert_eq!(task["state"], "processed");
    assert_eq!(task["output"]["echo"], json!({"order": 7}));
    // The id is the idempotency key.
    let again = http.post("/v1/tasks", Some(SUBMIT_TOKEN), Some(json!({"workflow": "pipeline", "id": "o-1"})));
    assert_eq!(again.status, 200, "{}", again.body);

    // A submit token is enough to follow its own task from the CLI.
    let over_http = stdout(&remote(&rota, &server, SUBMIT_TOKEN, &["status", "o-1", "--json"]));
    assert_eq!(over_http, rota.ok(&["status", "o-1", "--json"]));
    assert_eq!(task["submitter"], "shop", "the token's name");
    assert!(rota.ok(&["status", "o-1"]).contains("submitter      shop"), "rota status names the submitter");

    // The same engine sees a task submitted on the store, and the API shows
    // it, but not to the submit token, which did not submit it.
    assert_eq!(rota.ok(&["submit", "pipeline", "--id", "local-1", "--input", r#"{"order": 8}"#, "--wait"]), "local-1\n");
    assert_eq!(http.get("/v1/tasks/local-1", Some(ADMIN_TOKEN)).json()["state"], "processed");
    assert_eq!(http.get("/v1/tasks/local-1", Some(SUBMIT_TOKEN)).status, 404);
    let listed = stdout(&remote(&rota, &server, SUBMIT_TOKEN, &["tasks"]));
    assert!(listed.contains("o-1") && !listed.contains("local-1"), "a submit token lists its own tasks: {listed}");

    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "SIGTERM is a clean stop: {log}");
    assert!(log.contains("rota serve stopped"), "{log}");
    assert!(!log.contains(ADMIN_TOKEN) && !log.contains(SUBMIT_TOKEN), "tokens are never logged: {log}");
}

#[test]
fn operator_commands_over_http_print_what_they_print_locally() {
    let rota = Rota::new();
    let files = Files::new();
    // A short grace: the cancelled task's agent is still in its minute-long sleep at the stop.
    let server = Server::serve(&rota, &files, &["--shutdown-grace", "1s"], &[("ROTA_API_TOKEN", ADMIN_TOKEN)]);
    let http = Http::new(&server);

    // submit (and --wait) over HTTP.
    let output = remote(
        &rota,
        &server,
        ADMIN_TOKEN,
        &["submit", "pipeline", "--id", "r-1", "--input", r#"{"order": 1}"#, "--tag", "customer=c1", "--tag", "region=eu", "--wait"],
    );
    assert_eq!(stdout(&output), "r-1\n");
    let progress = String::from_utf8_lossy(&output.stderr);
    assert!(progress.contains("step echo: completed (attempt 1)") && progress.contains("task r-1: processed"), "{progress}");
    let output = remote(&rota, &server, ADMIN_TOKEN, &["submit", "pipeline", "--id", "r-1"]);
    assert_eq!(stdout(&output), "r-1\n");
    assert!(String::from_utf8_lossy(&output.stderr).contains("(existing) task r-1 already exists (pipeline@1, processed)"));
    rota.ok(&["submit", "pipeline", "--id", "r-2", "--input", r#"{"order": 2}"#, "--tag", "customer=c2", "--wait"]);

    // A dead letter to list (the API has no send: put it there on the store).
    rota.ok(&["queue", "send", "jobs", "--body", r#"{"n": 1}"#]);
    let received = rota.receive("jobs", 1);
    rota.ok(&["queue", "dead-letter", "jobs", received[0]["lease_token"].as_str().unwrap(), "--reason", "poison"]);

    // Read-only commands print the same bytes either way.
    for args in [
        vec!["status", "r-1", "--json"],
        vec!["status", "r-1"],
        vec!["tasks", "--json"],
        vec!["tasks", "--state", "processed", "--workflow", "pipeline", "--limit", "1"],
        vec!["tasks", "--tag", "customer=c1", "--json"],
        vec!["tasks", "--tag", "customer=c2", "--tag", "region=eu"],
        vec!["tasks", "--id-prefix", "r-", "--created-after", "2020-01-01T00:00:00Z", "--ended-before", "2100-01-01T00:00:00Z"],
        vec!["tasks", "--count", "--tag", "customer=c1"],
        vec!["tasks", "--count", "--state", "processed", "--json"],
        vec!["tasks", "--count", "--state", "processed", "--workflow", "slow", "--json"],
        vec!["tasks", "--parent", "r-1", "--json"],
        vec!["alerts", "--json"],
        vec!["workflows", "--json"],
        vec!["workflows"],
        vec!["queue", "stats", "jobs", "--json"],
        vec!["queue", "stats", "jobs"],
        vec!["dlq", "list", "jobs", "--json"],
        vec!["dlq", "list", "jobs"],
    ] {
        let local = rota.ok(&args);
        let over_http = stdout(&remote(&rota, &server, ADMIN_TOKEN, &args));
        assert_eq!(over_http, local, "rota {args:?} differs over HTTP");
    }

    // Changes: cancel a task stuck in a long step, pause and resume a queue, redrive and purge dead letters.
    assert_eq!(stdout(&remote(&rota, &server, ADMIN_TOKEN, &["submit", "slow", "--id", "s-1"])), "s-1\n");
    wait_for_state(&http, "s-1", "processing", ADMIN_TOKEN);
    let paused = remote(&rota, &server, ADMIN_TOKEN, &["pause", "s-1", "--reason", "maintenance"]);
    assert_eq!(stdout(&paused), "paused (processing)\n", "{}", String::from_utf8_lossy(&paused.stderr));
    let status = rota.json(&["status", "s-1", "--json"]);
    assert_eq!(status["paused"], true, "{status:#}");
    let event = status["history"].as_array().unwrap().iter().find(|e| e["kind"] == "paused").cloned().unwrap();
    assert!(event["detail"]["by"].as_str().unwrap().starts_with("api token with scope admin"), "who paused it: {event}");
    assert_eq!(event["detail"]["reason"], "maintenance");
    assert_eq!(stdout(&remote(&rota, &server, ADMIN_TOKEN, &["resume", "s-1"])), "resumed (processing)\n");
    assert_eq!(stdout(&remote(&rota, &server, ADMIN_TOKEN, &["cancel", "s-1"])), "cancelled\n");
    let output = remote(&rota, &server, ADMIN_TOKEN, &["cancel", "s-1"]);
    assert_eq!(output.status.code(), Some(1));
    assert_one_error_line(&String::from_utf8_lossy(&output.stderr), &["cancel: task s-1: ", "cancelled"]);
    let output = remote(&rota, &server, ADMIN_TOKEN, &["status", "nope"]);
    assert_one_error_line(&String::from_utf8_lossy(&output.stderr), &["task nope not found"]);
    let (_, local) = rota.fails(&["status", "nope"]);
    assert_eq!(String::from_utf8_lossy(&output.stderr), local, "a missing task reads the same");
    // Refusals read the same too.
    for args in [["resubmit", "r-1"], ["cancel", "r-1"], ["cancel", "nope"]] {
        let (code, local) = rota.fails(&args);
        let output = remote(&rota, &server, ADMIN_TOKEN, &args);
        assert_eq!((output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned()), (Some(code), local), "rota {args:?}");
    }

    stdout(&remote(&rota, &server, ADMIN_TOKEN, &["queue", "pause", "jobs", "--reason", "the consumer is being deployed"]));
    assert_eq!(rota.stats("jobs")["paused"], true);
    stdout(&remote(&rota, &server, ADMIN_TOKEN, &["queue", "resume", "jobs"]));
    assert_eq!(rota.stats("jobs")["paused"], false);
    assert_eq!(stdout(&remote(&rota, &server, ADMIN_TOKEN, &["dlq", "redrive", "jobs", "--all"])), "1\n");
    let again = rota.receive("jobs", 1);
    rota.ok(&["queue", "dead-letter", "jobs", again[0]["lease_token"].as_str().unwrap(), "--reason", "poison again"]);
    assert_eq!(stdout(&remote(&rota, &server, ADMIN_TOKEN, &["dlq", "purge", "jobs", "--reason", "poison, reported"])), "1\n");

    // Every change above is in the audit log, newest first, with who (the
    // token, or the OS user of a local command) and why; it reads the same
    // locally and over HTTP.
    assert_eq!(rota.ok(&["dlq", "purge", "jobs", "--reason", "a last look"]), "0\n");
    let audit = rota.json(&["audit", "--json", "--limit", "8"]);
    let actions: Vec<&str> = audit.as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(
        actions,
        ["dlq.purge", "dlq.purge", "dlq.redrive", "queue.resume", "queue.pause", "task.cancel", "task.resume", "task.pause"]
    );
    assert!(audit[0]["by"].as_str().unwrap().starts_with("cli"), "a local command: {}", audit[0]);
    assert!(audit[1]["by"].as_str().unwrap().starts_with("api token with scope admin"), "over HTTP: {}", audit[1]);
    assert_eq!((&audit[2]["detail"]["moved"], &audit[7]["reason"], &audit[7]["target"]), (&json!(1), &json!("maintenance"), &json!("s-1")));
    let reasons: Vec<&Value> = audit.as_array().unwrap()[..5].iter().map(|e| &e["reason"]).collect();
    assert_eq!(
        reasons,
        [&json!("a last look"), &json!("poison, reported"), &Value::Null, &Value::Null, &json!("the consumer is being deployed")],
        "the reasons given locally and over HTTP"
    );
    let cursor = audit[0]["cursor"].as_str().unwrap();
    for args in [
        vec!["audit", "--json"],
        vec!["audit", "--action", "task.pause"],
        vec!["audit", "--after", cursor, "--limit", "2", "--json"],
        vec!["audit", "--since", "1h", "--action", "dlq.purge", "--json"],
    ] {
        let local = rota.ok(&args);
        let over_http = stdout(&remote(&rota, &server, ADMIN_TOKEN, &args));
        assert_eq!(over_http, local, "rota {args:?} differs over HTTP");
    }
    let (code, stderr) = rota.fails(&["audit", "--action", "task.explode"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("unknown audit action"), "{stderr}");

    // Without the token: one clear line, naming the flag to give.
    let output = rota.command(&["--server", &server.url, "tasks"]).env_remove("ROTA_TOKEN").output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert_one_error_line(&String::from_utf8_lossy(&output.stderr), &["--token"]);
    // Commands the API does not offer say so.
    let output = remote(&rota, &server, ADMIN_TOKEN, &["queue", "send", "jobs", "--body", "{}"]);
    assert_eq!(output.status.code(), Some(1));
    assert_one_error_line(&String::from_utf8_lossy(&output.stderr), &["rota queue send", "only on a local store"]);
    // A delayed start over HTTP: the server's clock counts the delay.
    let output = remote(&rota, &server, ADMIN_TOKEN, &["submit", "pipeline", "--id", "r-later", "--delay", "1h"]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("task r-later starts no earlier than"), "{output:?}");
    let later = http.get("/v1/tasks/r-later", Some(ADMIN_TOKEN)).json();
    assert!(later["not_before"].as_i64().unwrap() >= later["created_at"].as_i64().unwrap() + 3_600_000, "{later}");

    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
}

/// A request that a rule refuses is refused by the same rule, in the same
/// words, on the store and over HTTP.
#[test]
fn a_refused_request_reads_the_same_on_the_store_and_over_http() {
    let rota = Rota::new();
    let files = Files::new();
    let server = Server::serve(&rota, &files, &[], &[("ROTA_API_TOKEN", ADMIN_TOKEN)]);
    rota.ok(&["submit", "pipeline", "--id", "done-1", "--input", r#"{"order": 1}"#, "--wait"]);
    let unregistered = "workflow: workflow unregistered (any version) is not registered; `rota workflows` lists the registered ones, \
                        and `rota serve --workflows DIR` registers a directory of definitions";
    let refusals: [(&[&str], &str); 13] = [
        (
            &["signal", "done-1", "approved"],
            "signal approved: no step of task done-1 (workflow pipeline@1) waits for it (it waits for no signal)",
        ),
        (&["signal", "nope", "approved"], "task nope not found"),
        (&["resubmit", "done-1", "--step", "nope"], "step nope of task done-1 (its steps: pause, echo) not found"),
        (&["cancel", "done-1"], "cancel: task done-1: task is processed, which is terminal"),
        (&["resubmit", "done-1"], "resubmit: task done-1: cannot resubmit a task that is processed"),
        (&["cancel", "nope"], "task nope not found"),
        (&["resubmit", "nope", "--step", "pause"], "task nope not found"),
        (&["resubmit", "done-1", "--step", "pause", "--input", "{}"], "resubmit: task done-1: cannot resubmit a task that is processed"),
        (&["resubmit", "done-1", "--step", "nope", "--input", "{}"], "step nope of task done-1 (its steps: pause, echo) not found"),
        (&["submit", "unregistered"], unregistered),
        (&["pause", "done-1"], "pause: task done-1: task is processed, which is terminal"),
        (&["resume", "done-1"], "resume: task done-1: cannot resume a task that is not paused"),
        (&["pause", "nope", "--reason", "why"], "task nope not found"),
    ];
    for (args, line) in refusals {
        let (code, local) = rota.fails(args);
        assert_eq!((code, local.as_str()), (1, format!("error: {line}\n").as_str()), "rota {args:?} on the store");
        let over_http = remote(&rota, &server, ADMIN_TOKEN, args);
        let over_http = (over_http.status.code(), String::from_utf8_lossy(&over_http.stderr).into_owned());
        assert_eq!(over_http, (Some(code), local), "rota {args:?} over HTTP");
    }

    // A signal over HTTP: the sender recorded is the token's scope.
    rota.ok(&["submit", "approval", "--id", "approve-1"]);
    let sent = remote(&rota, &server, ADMIN_TOKEN, &["signal", "approve-1", "approved", "--data", r#"{"by": "ann"}"#]);
    assert!(stdout(&sent).starts_with("step approval: "), "{}", String::from_utf8_lossy(&sent.stderr));
    let done = rota.json(&["status", "approve-1", "--json"]);
    let signal = done["history"].as_array().unwrap().iter().find(|e| e["kind"] == "signal").cloned().unwrap();
    let sent_by = signal["detail"]["sent_by"].as_str().unwrap();
    assert!(sent_by.starts_with("api token with scope admin (token:") && sent_by.ends_with(')'), "the scope and the token's id: {sent_by}");
    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
}

#[test]
fn rota_api_serves_the_api_without_running_tasks() {
    let rota = Rota::new();
    let files = Files::new();
    // Register the workflows, then stop: only the API runs from here on.
    let serve = Server::serve(&rota, &files, &[], &[]);
    let (status, _) = serve.terminate();
    assert_eq!(status.code(), Some(0));

    let api = Server::start(&rota, &["api", "--listen", "127.0.0.1:0"], &[("ROTA_API_TOKEN", ADMIN_TOKEN)]);
    let http = Http::new(&api);
    assert_eq!(http.get("/v1/workflows", None).status, 401);
    let submitted = http.post("/v1/tasks", Some(ADMIN_TOKEN), Some(json!({"workflow": "pipeline", "id": "p-1", "input": {"order": 1}})));
    assert_eq!(submitted.status, 201, "{}", submitted.body);
    thread::sleep(Duration::from_millis(500));
    assert_eq!(http.get("/v1/tasks/p-1", Some(ADMIN_TOKEN)).json()["state"], "pending", "no Scheduler runs in `rota api`");
    assert_eq!(http.get("/readyz", None).status, 200);
    let cancelled = http.post("/v1/tasks/p-1/cancel", Some(ADMIN_TOKEN), None);
    assert_eq!(cancelled.json()["state"], "cancelled", "{}", cancelled.body);
    let (status, log) = api.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("rota api stopped"), "{log}");
}

#[test]
fn listen_and_auth_errors_name_the_flag_the_file_and_the_field() {
    let rota = Rota::new();
    let files = Files::new();
    let workflows = files.workflows();
    let dir = workflows.to_str().unwrap();

    // No token on a non-loopback address: refused unless --insecure-no-auth.
    let (code, stderr) = rota.fails(&["serve", "--workflows", dir, "--listen", "0.0.0.0:0"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["--listen 0.0.0.0:0", "non-loopback", "--auth", "--insecure-no-auth"]);
    let (code, stderr) = rota.fails(&["api", "--listen", "0.0.0.0:0"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["--listen 0.0.0.0:0", "non-loopback"]);

    let auth = files.file("bad.toml", "[[tokens]]\ntoken = \"a-token-long-enough-1\"\nscopes = [\"root\"]\n");
    let (code, stderr) = rota.fails(&["api", "--listen", "127.0.0.1:0", "--auth", auth.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &[&format!("--auth {}", auth.display()), "tokens[0].scopes[0]", "unknown scope \"root\""]);
    assert!(!stderr.contains("a-token-long-enough-1"), "{stderr}");

    let missing = Path::new(dir).join("missing.toml");
    let (_, stderr) = rota.fails(&["api", "--listen", "127.0.0.1:0", "--auth", missing.to_str().unwrap()]);
    assert_one_error_line(&stderr, &[&format!("--auth {}", missing.display()), "cannot read"]);

    let output = rota.command(&["api", "--listen", "127.0.0.1:0"]).env("ROTA_API_TOKEN", "short").output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert_one_error_line(&String::from_utf8_lossy(&output.stderr), &["ROTA_API_TOKEN", "16 to 512 bytes"]);
}

/// A step of an agent that no rota process runs: the example Python worker does.
const PAY: &str = r#"
name: pay
version: 1
steps:
  - name: charge
    agent: py-payments
    with: { amount: "{{ input.amount }}" }
"#;

#[test]
fn serve_with_a_remote_agent_lets_the_python_worker_run_its_steps() {
    let rota = Rota::new();
    let files = Files::new();
    std::fs::write(files.workflows().join("pay.yaml"), PAY).unwrap();
    let worker_token = "worker-token-for-the-api-tests";
    let auth = files.file(
        "workers.toml",
        &format!(
            "[[tokens]]\ntoken = \"{ADMIN_TOKEN}\"\nscopes = [\"admin\"]\n\n\
             [[tokens]]\nname = \"payments\"\ntoken = \"{worker_token}\"\nscopes = [\"agent:py-payments\"]\n"
        ),
    );
    // Without --remote-agent the definition names an unknown agent.
    let workflows = files.workflows();
    let (code, stderr) = rota.fails(&["serve", "--workflows", workflows.to_str().unwrap(), "--listen", "none"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("unknown agent `py-payments`"), "{stderr}");

    let key = "a-worker-lease-key-of-at-least-32-bytes";
    let extra = ["--auth", auth.to_str().unwrap(), "--remote-agent", "py-payments"];
    let server = Server::serve(&rota, &files, &extra, &[("ROTA_WORKER_KEY", key)]);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let worker_script = repo.join("examples/workers/python/worker.py");
    let mut worker = std::process::Command::new("python3")
        .arg(&worker_script)
        .args(["--url", &server.url, "--agent", "py-payments", "--token", worker_token, "--wait-ms", "500"])
        .env_remove("ROTA_TOKEN")
        // The worker runs on the Python client, taken from the checkout's source.
        .env("PYTHONPATH", repo.join("clients/python/src"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs the example worker");
    let output = remote(&rota, &server, ADMIN_TOKEN, &["submit", "pay", "--id", "p-1", "--input", r#"{"amount": 42}"#, "--wait"]);
    let _ = worker.kill();
    let worker_output = worker.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the task did not end processed: {}\nworker: {}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&worker_output.stderr)
    );
    let status: Value = serde_json::from_str(&stdout(&remote(&rota, &server, ADMIN_TOKEN, &["status", "p-1", "--json"]))).unwrap();
    assert_eq!(status["steps"][0]["agent"], "py-payments");
    assert_eq!(status["output"]["charge"]["amount"], 42, "{status:#}");

    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(!log.contains(key) && !log.contains(worker_token), "secrets are never logged");
}

/// One webhook delivery as a receiver saw it.
struct Delivery {
    headers: Vec<(String, String)>,
    body: Value,
}

impl Delivery {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }
}

/// A webhook receiver on a free loopback port: answers 200 to every POST
/// and passes each delivery on; `http://127.0.0.1:PORT/hook` is its URL.
fn webhook_receiver() -> (String, mpsc::Receiver<Delivery>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut headers = Vec::new();
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            loop {
                line.clear();
                reader.read_line(&mut line).unwrap();
                let Some((key, value)) = line.trim_end().split_once(':') else { break };
                headers.push((key.trim().to_owned(), value.trim().to_owned()));
            }
            let length: usize = headers.iter().find(|(key, _)| key.eq_ignore_ascii_case("content-length")).unwrap().1.parse().unwrap();
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            let body = serde_json::from_slice(&body).unwrap();
            if tx.send(Delivery { headers, body }).is_err() {
                return;
            }
        }
    });
    (url, rx)
}

#[test]
fn serve_with_a_webhook_secret_posts_signed_status_events_to_the_callback_url() {
    let rota = Rota::new();
    let files = Files::new();
    let (hook, deliveries) = webhook_receiver();
    let secret = "a-webhook-secret-for-the-tests";
    let server = Server::serve(&rota, &files, &[], &[("ROTA_API_TOKEN", ADMIN_TOKEN), ("ROTA_WEBHOOK_SECRET", secret)]);
    assert!(server.seen.iter().any(|line| line.contains("webhooks on")), "{}", server.seen.join("\n"));
    let http = Http::new(&server);
    let submitted = http.post(
        "/v1/tasks",
        Some(ADMIN_TOKEN),
        Some(json!({"workflow": "pipeline", "id": "w-1", "input": {"order": 3}, "callback_url": hook})),
    );
    assert_eq!(submitted.status, 201, "{}", submitted.body);
    let mut kinds = Vec::new();
    while kinds.last().map(String::as_str) != Some("processed") {
        let delivery = deliveries.recv_timeout(REQUEST_TIMEOUT).unwrap_or_else(|_| panic!("no webhook after {kinds:?}"));
        assert_eq!(delivery.body["task_id"], "w-1");
        let signature = delivery.header("Rota-Signature").expect("signed");
        assert!(signature.starts_with("t=") && signature.contains(",v1="), "{signature}");
        assert_eq!(delivery.header("Rota-Event-Id"), Some(delivery.body["seq"].to_string().as_str()));
        kinds.push(delivery.body["kind"].as_str().unwrap().to_owned());
    }
    assert_eq!(kinds.first().map(String::as_str), Some("received"), "{kinds:?}");

    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(!log.contains(secret), "the secret is never logged");
}

#[test]
fn the_log_at_its_default_level_holds_no_token_input_signal_or_secret() {
    const INPUT_SECRET: &str = "card-4111-secret-input";
    const SIGNAL_SECRET: &str = "signal-secret-approver";
    const WEBHOOK_SECRET: &str = "webhook-signing-secret-0123";
    const QUERY_SECRET: &str = "callback-query-secret";
    const WRONG_TOKEN: &str = "a-wrong-token-that-is-not-configured";
    let rota = Rota::new();
    let files = Files::new();
    let auth = files.auth();
    let env = [("ROTA_TEST_ADMIN", ADMIN_TOKEN), ("ROTA_WEBHOOK_SECRET", WEBHOOK_SECRET)];
    let server = Server::serve(&rota, &files, &["--auth", auth.to_str().unwrap()], &env);
    let http = Http::new(&server);

    let body = json!({
        "workflow": "approval",
        "id": "secret-1",
        "input": {"card": INPUT_SECRET},
        "callback_url": format!("http://127.0.0.1:9/hook?key={QUERY_SECRET}"),
    });
    assert_eq!(http.post("/v1/tasks", Some(SUBMIT_TOKEN), Some(body)).status, 201);
    assert_eq!(http.get("/v1/tasks/secret-1", Some(WRONG_TOKEN)).status, 401);
    let signal = http.post("/v1/tasks/secret-1/signals/approved", Some(SUBMIT_TOKEN), Some(json!({"by": SIGNAL_SECRET})));
    assert_eq!(signal.status, 200, "a submit token signals its own task: {}", signal.body);
    let task = wait_for_state(&http, "secret-1", "processed", SUBMIT_TOKEN);
    assert_eq!(task["output"]["echo"]["by"], SIGNAL_SECRET, "the secrets did flow through the task");

    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("rota serve started"), "the log is at its default level: {log}");
    for secret in [ADMIN_TOKEN, SUBMIT_TOKEN, WRONG_TOKEN, INPUT_SECRET, SIGNAL_SECRET, WEBHOOK_SECRET, QUERY_SECRET] {
        assert!(!log.contains(secret), "{secret:?} is in the log:\n{log}");
    }
}
