//! Callback steps end to end: `rota serve` with authentication on, a
//! payout service outside it (an HTTP server in this test) that takes the
//! step's request and keeps its token, and callbacks posted to
//! `/v1/callbacks/{token}` without an API token. A callback completes the
//! step with its output; a token used twice, a token of an attempt that
//! timed out or was replaced by a retry, and a forged one are refused and
//! change nothing.
//!
//! Real processes and real time, a few seconds.

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use common::{Rota, lines_of};
use serde_json::{Value, json};

/// How long the test waits for anything: a bound on the test, not a timing
/// it checks.
const WAIT_MAX: Duration = Duration::from_secs(30);

const ADMIN_TOKEN: &str = "admin-token-for-the-callback-tests";

/// reserve → payout (a callback step whose service has `timeout` to call
/// back) → receipt (which reads the callback's output).
fn workflow(name: &str, service: &str, timeout: &str, max_failures: u32) -> String {
    format!(
        r#"
name: {name}
version: 1
max_failures: {max_failures}
on_exhausted: error
steps:
  - name: reserve
    agent: delay
    with: {{ ms: 1 }}
  - name: payout
    agent: http
    callback: true
    timeout: {timeout}
    retry: {{ attempts: 1 }}
    with:
      method: POST
      url: {service}/payouts
      body: {{ task: "{{{{ task.id }}}}", callback_token: "{{{{ callback.token }}}}" }}
  - name: receipt
    agent: exec
    with: {{ command: ["sh", "-c", "cat"], stdin: {{ payout: "{{{{ steps.payout.output.payout_id }}}}" }} }}
"#
    )
}

/// What the payout service received: the header's token and the body.
#[derive(Debug, Clone)]
struct Received {
    header_token: String,
    body: Value,
}

/// The payout service: answers 202 to every request and keeps it.
struct PayoutService {
    url: String,
    received: Arc<Mutex<Vec<Received>>>,
    _runtime: tokio::runtime::Runtime,
}

impl PayoutService {
    fn start() -> PayoutService {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let kept = received.clone();
        let app = axum::Router::new().route(
            "/payouts",
            axum::routing::post(move |headers: axum::http::HeaderMap, axum::Json(body): axum::Json<Value>| {
                let kept = kept.clone();
                async move {
                    let header_token = headers.get("rota-callback-token").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
                    kept.lock().unwrap().push(Received { header_token, body });
                    (axum::http::StatusCode::ACCEPTED, axum::Json(json!({ "accepted": true })))
                }
            }),
        );
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        runtime.spawn(async move { axum::serve(listener, app).await.unwrap() });
        PayoutService { url, received, _runtime: runtime }
    }

    /// The requests received for `task`, waiting until there are `count`.
    fn requests_for(&self, task: &str, count: usize) -> Vec<Received> {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let found: Vec<Received> = self.received.lock().unwrap().iter().filter(|r| r.body["task"] == task).cloned().collect();
            if found.len() >= count {
                return found;
            }
            assert!(Instant::now() < deadline, "the service got {} requests for {task}, not {count}", found.len());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `rota serve` with authentication on; killed when dropped.
struct Server {
    child: Child,
    url: String,
    _stderr: mpsc::Receiver<String>,
}

impl Server {
    fn start(rota: &Rota, workflows: &Path, auth: &Path) -> Server {
        let mut command = rota.command(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--workflows",
            workflows.to_str().unwrap(),
            "--auth",
            auth.to_str().unwrap(),
            "--supervisor-interval",
            "100ms",
        ]);
        command.stdout(Stdio::null()).stderr(Stdio::piped()).env("ROTA_TEST_ADMIN", ADMIN_TOKEN);
        let mut child = command.spawn().expect("rota starts");
        let stderr = lines_of(child.stderr.take().unwrap());
        let deadline = Instant::now() + WAIT_MAX;
        let url = loop {
            let line = stderr.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("rota says where it listens");
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.split_whitespace().next().unwrap().to_owned();
            }
        };
        Server { child, url, _stderr: stderr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP client on its own runtime; no bearer token unless asked.
struct Http {
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
    base: String,
}

impl Http {
    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let request = self.client.post(format!("{}{path}", self.base)).json(body);
        self.runtime.block_on(async {
            let response = request.send().await.expect("answered");
            let status = response.status().as_u16();
            (status, response.json().await.unwrap_or(Value::Null))
        })
    }

    fn callback(&self, token: &str, body: &Value) -> (u16, Value) {
        self.post(&format!("/v1/callbacks/{token}"), body)
    }
}

fn status(rota: &Rota, id: &str) -> Value {
    rota.json(&["status", id, "--json"])
}

fn wait_until(rota: &Rota, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let task = status(rota, id);
        if done(&task) {
            return task;
        }
        assert!(Instant::now() < deadline, "task {id} never got there: {task}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_state(rota: &Rota, id: &str, state: &str) -> Value {
    wait_until(rota, id, |task| task["state"] == state)
}

fn step<'v>(task: &'v Value, name: &str) -> &'v Value {
    task["steps"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap()
}

fn callbacks_in(task: &Value) -> Vec<Value> {
    task["history"].as_array().unwrap().iter().filter(|e| e["kind"] == "callback").cloned().collect()
}

#[test]
fn an_outside_service_completes_a_callback_step_once_and_only_while_it_waits() {
    let rota = Rota::new();
    let service = PayoutService::start();
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join("workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    std::fs::write(workflows.join("payout.yaml"), workflow("payout", &service.url, "1m", 1)).unwrap();
    std::fs::write(workflows.join("hasty.yaml"), workflow("hasty", &service.url, "1s", 2)).unwrap();
    let auth = dir.path().join("auth.toml");
    std::fs::write(&auth, "[[tokens]]\nname = \"ops\"\ntoken_env = \"ROTA_TEST_ADMIN\"\nscopes = [\"admin\"]\n").unwrap();
    let server = Server::start(&rota, &workflows, &auth);
    let http = Http {
        runtime: tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap(),
        client: rota_agent::http_client().timeout(WAIT_MAX).build().unwrap(),
        base: server.url.clone(),
    };

    // The request carries the token in its header and where the template
    // put it; the stored input shows a placeholder instead.
    rota.ok(&["submit", "payout", "--id", "p-1", "--input", "{}"]);
    let request = service.requests_for("p-1", 1).remove(0);
    let token = request.header_token.clone();
    assert!(!token.is_empty(), "the header carries the token");
    assert_eq!(request.body["callback_token"], token.as_str(), "the template rendered the same token");
    // (Waiting for the agent's acceptance first only makes the history's
    // order certain: a callback may also come before it.)
    let waiting = wait_until(&rota, "p-1", |task| callbacks_in(task).iter().any(|e| e["detail"]["outcome"] == "accepted"));
    let stored_input = step(&waiting, "payout")["input"].to_string();
    assert!(stored_input.contains("[callback token]") && !stored_input.contains(&token), "{stored_input}");

    // A forged token, and one naming the right attempt with a wrong secret.
    let (code, body) = http.callback("not-a-token", &json!({ "output": 1 }));
    assert_eq!((code, body["error"]["code"].as_str()), (404, Some("unknown_callback")), "{body}");
    let (head, secret) = token.rsplit_once('.').unwrap();
    let wrong = format!("{head}.{}", secret.chars().rev().collect::<String>());
    assert_eq!(http.callback(&wrong, &json!({ "output": 1 })).0, 404);
    let (code, body) = http.callback(&token, &json!({ "output": 1, "error": "both" }));
    assert_eq!((code, body["error"]["code"].as_str()), (422, Some("invalid_body")), "{body}");

    // The callback, without an API token, completes the step.
    let (code, body) = http.callback(&token, &json!({ "output": { "payout_id": "po-17" } }));
    assert_eq!((code, &body), (200, &json!({ "task_id": "p-1", "step": "payout", "attempt": 1, "completed": true })));
    let done = wait_state(&rota, "p-1", "processed");
    assert_eq!(step(&done, "payout")["output"], json!({ "payout_id": "po-17" }));
    assert_eq!(step(&done, "receipt")["output"], json!({ "payout": "po-17" }), "the next step's template read the callback's output");
    let outcomes: Vec<String> = callbacks_in(&done).iter().filter_map(|e| e["detail"]["outcome"].as_str().map(str::to_owned)).collect();
    assert_eq!(outcomes, ["accepted", "succeeded"]);

    // Used twice: refused, nothing changes.
    let (code, body) = http.callback(&token, &json!({ "output": { "payout_id": "po-18" } }));
    assert_eq!((code, body["error"]["code"].as_str()), (409, Some("refused")), "{body}");
    assert_eq!(status(&rota, "p-1"), done, "a refused callback changes nothing");

    // A step whose service never calls back times out; the retry's request
    // carries a new token, and the first attempt's is refused.
    rota.ok(&["submit", "hasty", "--id", "h-1", "--input", "{}"]);
    let first = service.requests_for("h-1", 1).remove(0).header_token;
    let second = service.requests_for("h-1", 2).remove(1).header_token;
    assert_ne!(first, second, "each attempt has its own token");
    let (code, body) = http.callback(&first, &json!({ "output": { "payout_id": "late" } }));
    assert_eq!(code, 409, "{body}");
    assert!(body["error"]["reason"].as_str().unwrap().contains("attempt 1 is over"), "{body}");
    // The second attempt times out too: at the failure threshold the task
    // ends, and its token is refused as well.
    let failed = wait_state(&rota, "h-1", "error");
    assert!(failed["error"].as_str().unwrap().contains("got no callback before its complete-by"), "{failed}");
    let (code, body) = http.callback(&second, &json!({ "output": { "payout_id": "late" } }));
    assert_eq!(code, 409, "{body}");
    assert_eq!(status(&rota, "h-1"), failed, "a late callback changes nothing");

    // A failure reported by the service is permanent by default.
    rota.ok(&["submit", "payout", "--id", "p-2", "--input", "{}"]);
    let token = service.requests_for("p-2", 1).remove(0).header_token;
    let (code, body) = http.callback(&token, &json!({ "error": "account closed" }));
    assert_eq!((code, body["completed"].as_bool()), (200, Some(false)), "{body}");
    let failed = wait_state(&rota, "p-2", "error");
    assert!(failed["error"].as_str().unwrap().contains("account closed"), "{failed}");
    assert_eq!(http.callback(&token, &json!({ "output": 1 })).0, 409, "the token was used by the failure");

    // `rota callback` does the same, on the store itself and through the
    // server, and says why it refuses.
    rota.ok(&["submit", "payout", "--id", "p-3", "--input", "{}"]);
    let token = service.requests_for("p-3", 1).remove(0).header_token;
    let said = rota.ok(&["callback", &token, "--output", r#"{"payout_id": "po-cli"}"#]);
    assert_eq!(said.trim(), "task p-3 step payout attempt 1: completed");
    let done = wait_state(&rota, "p-3", "processed");
    assert_eq!(step(&done, "receipt")["output"], json!({ "payout": "po-cli" }));
    let by = callbacks_in(&done).iter().find(|e| e["detail"]["outcome"] == "succeeded").unwrap()["detail"]["sent_by"].clone();
    assert!(by.as_str().unwrap().starts_with("cli"), "a local callback is sent by the command line: {by}");
    let (code, stderr) = rota.fails(&["callback", &token, "--output", "1"]);
    assert!(code != 0 && stderr.contains("the callback changes nothing"), "{code} {stderr}");
    let (code, stderr) = rota.fails(&["callback", "not-a-token", "--error", "x"]);
    assert!(code != 0 && stderr.contains("no step waits for this callback token"), "{code} {stderr}");

    rota.ok(&["submit", "payout", "--id", "p-4", "--input", "{}"]);
    let token = service.requests_for("p-4", 1).remove(0).header_token;
    let remote = ["--server", server.url.as_str(), "--token", ADMIN_TOKEN];
    let said = rota.ok(&[&remote[..], &["callback", &token, "--error", "account frozen"]].concat());
    assert_eq!(said.trim(), "task p-4 step payout attempt 1: failed");
    let failed = wait_state(&rota, "p-4", "error");
    assert!(failed["error"].as_str().unwrap().contains("account frozen"), "{failed}");
    let (code, stderr) = rota.fails(&[&remote[..], &["callback", &token, "--output", "1"]].concat());
    assert!(code != 0 && stderr.contains("the callback changes nothing"), "through the server too: {code} {stderr}");
    let (code, stderr) = rota.fails(&["callback", &token]);
    assert!(code != 0 && stderr.contains("--output"), "an outcome is required: {stderr}");
}
