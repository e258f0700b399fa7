//! The worker protocol end to end: a real SQLite store, a real engine
//! (Scheduler and Supervisor; no built-in agent runs the remote agent
//! `py-payments`), the API over HTTP, and the Python example worker
//! (`examples/workers/python/worker.py`) as a child process. Without
//! `python3` those tests print a `SKIP` line and pass; the protocol's own
//! rules (stale leases, deadlines, forged tokens) are checked over HTTP
//! directly and always run.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Options, Server, start};
use reqwest::StatusCode;
use rota_api::{AuthConfig, Scope, Token, WorkerConfig};
use rota_model::{ExhaustedPolicy, FailureClass, FailureKind, QueueName, RetryPolicy};
use rota_workflow::{AgentCatalog, AgentName, CompensateDef, StepDef, Workflow};
use serde_json::{Value, json};

const AGENT: &str = "py-payments";
const ADMIN_TOKEN: &str = "admin-token-000000000001";
const WORKER_TOKEN: &str = "worker-token-0000000001";

fn catalog() -> AgentCatalog {
    AgentCatalog::builtin().with(AgentName::new(AGENT).unwrap())
}

/// Steps that pass the task's input on; `charge` retries transient faults
/// quickly within an attempt.
fn steps(workflow: &str, version: u32) -> rota_workflow::WorkflowBuilder {
    let fields = json!({ "amount": "{{ input.amount }}", "card": "{{ input.card }}", "flaky": "{{ input.flaky }}" });
    Workflow::builder(workflow, version)
        .step(StepDef::new("reserve", AGENT).with_input(json!({ "amount": "{{ input.amount }}" })).compensate(
            CompensateDef::new(AGENT).with_input(json!({ "amount": "{{ input.amount }}", "hold": "{{ steps.reserve.output.key }}" })),
        ))
        .step(
            StepDef::new("charge", AGENT)
                .with_input(fields)
                .retry(RetryPolicy::new(2, Duration::from_millis(20), Duration::from_millis(50)).unwrap()),
        )
        .step(StepDef::new("ship", AGENT).with_input(json!({ "slow_ms": "{{ input.slow_ms }}" })))
}

/// A permanent failure sets the task to `error`.
fn pay() -> Workflow {
    steps("pay", 1).build(&catalog()).unwrap()
}

/// A permanent failure undoes the completed steps.
fn pay_undo() -> Workflow {
    steps("pay-undo", 1).on_exhausted(ExhaustedPolicy::Compensate).build(&catalog()).unwrap()
}

/// One step with a short deadline.
fn hurry() -> Workflow {
    Workflow::builder("hurry", 1)
        .step(StepDef::new("only", AGENT).with_input(json!({ "n": 1 })).timeout(Duration::from_secs(1)))
        .build(&catalog())
        .unwrap()
}

/// One step without a compensation and a long deadline.
fn long() -> Workflow {
    Workflow::builder("long", 1)
        .step(StepDef::new("only", AGENT).with_input(json!({ "n": 1 })).timeout(Duration::from_secs(120)))
        .build(&catalog())
        .unwrap()
}

/// One step whose policy fails HTTP 503 and timeouts at once.
fn picky() -> Workflow {
    let policy = RetryPolicy::new(2, Duration::from_millis(20), Duration::from_millis(50))
        .unwrap()
        .with_non_retryable([FailureClass::status(503).unwrap(), FailureClass::Kind(FailureKind::Timeout)]);
    Workflow::builder("picky", 1)
        .max_failures(3)
        .step(StepDef::new("only", AGENT).with_input(json!({ "n": 1 })).timeout(Duration::from_secs(60)).retry(policy))
        .build(&catalog())
        .unwrap()
}

fn workers(lease: Duration) -> WorkerConfig {
    WorkerConfig { remote_agents: vec![AgentName::new(AGENT).unwrap(), AgentName::new("other").unwrap()], lease, ..WorkerConfig::default() }
}

async fn server(lease: Duration) -> Server {
    let token = |secret: &str, scope: Scope| Token::new(secret, vec![scope]).unwrap();
    let auth = AuthConfig::tokens(vec![
        token(ADMIN_TOKEN, Scope::Admin),
        token(WORKER_TOKEN, Scope::Agent { queues: vec![QueueName::new(format!("agent.{AGENT}")).unwrap()] }),
    ])
    .unwrap();
    let options =
        Options { auth, workers: workers(lease), workflows: vec![pay(), pay_undo(), hurry(), long(), picky()], ..Options::default() };
    let mut server = start(options).await;
    server.token = Some(ADMIN_TOKEN.to_owned());
    server
}

async fn submit(server: &Server, workflow: &str, id: &str, input: Value) {
    let reply = server.post_json("/v1/tasks", &json!({ "workflow": workflow, "id": id, "input": input })).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
}

/// The Python worker as a child process (killed when dropped), or `None`
/// with a SKIP line when there is no `python3`.
fn python_worker(server: &Server) -> Option<tokio::process::Child> {
    let found = std::process::Command::new("python3").arg("--version").output().is_ok_and(|out| out.status.success());
    if !found {
        println!("SKIP: python3 is not installed; the Python example worker was not run");
        return None;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/workers/python/worker.py");
    let child = tokio::process::Command::new("python3")
        .arg(script)
        .args(["--url", &server.base, "--agent", AGENT, "--wait-ms", "1000", "--concurrency", "2", "--name", "py-test"])
        .env("ROTA_TOKEN", WORKER_TOKEN)
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    Some(child)
}

fn step<'a>(task: &'a Value, name: &str) -> &'a Value {
    task["steps"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("no step {name}: {task}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_worker_runs_a_workflow_to_processed() {
    // A 2 s lease and a 5 s step: the worker must renew to keep it. (With a
    // 1 s lease, a renewal due every third of a second missed its window
    // once under a loaded CI machine.)
    let server = server(Duration::from_secs(2)).await;
    let Some(_worker) = python_worker(&server) else { return };
    submit(&server, "pay", "p-1", json!({ "amount": 42, "card": "ok", "flaky": true, "slow_ms": 5000 })).await;

    let done = server.wait_terminal("p-1").await;
    assert_eq!(done["state"], "processed", "{done}");
    let output = &done["output"];
    assert_eq!(output["reserve"], json!({ "step": "reserve", "amount": 42, "key": "p-1/reserve", "attempt": 1, "delivery_count": 1 }));
    // The first attempt of `charge` failed transiently: a second one succeeded.
    assert_eq!(output["charge"]["attempt"], 2, "{output}");
    assert_eq!(output["charge"]["key"], "p-1/charge", "the idempotency key is the same for every attempt");
    // The slow step outlived its lease twice over, yet was delivered once.
    assert_eq!(output["ship"]["delivery_count"], 1, "the worker renewed its lease: {output}");

    let history = server.get("/v1/tasks/p-1/history").await.body;
    let failed: Vec<&Value> = history.as_array().unwrap().iter().filter(|e| e["kind"] == "step_failed").collect();
    assert_eq!(failed.len(), 1, "{history}");
    assert_eq!((failed[0]["step"].as_str(), failed[0]["detail"]["retryable"].as_bool()), (Some("charge"), Some(true)));
    assert!(failed[0]["detail"]["error"].as_str().unwrap().contains("payment gateway timed out"), "{}", failed[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_of_the_python_worker_ends_in_error_or_compensates() {
    let server = server(Duration::from_secs(30)).await;
    let Some(_worker) = python_worker(&server) else { return };
    let declined = json!({ "amount": 7, "card": "declined", "flaky": false, "slow_ms": 0 });
    submit(&server, "pay", "d-1", declined.clone()).await;
    submit(&server, "pay-undo", "d-2", declined).await;

    let failed = server.wait_terminal("d-1").await;
    assert_eq!(failed["state"], "error", "{failed}");
    assert_eq!(step(&failed, "charge")["state"], "failed");
    assert!(step(&failed, "charge")["last_error"].as_str().unwrap().contains("card declined"), "{failed}");
    assert_eq!(step(&failed, "ship")["state"], "not_started");

    let undone = server.wait_terminal("d-2").await;
    assert_eq!(undone["state"], "compensated", "{undone}");
    assert_eq!(step(&undone, "reserve")["state"], "compensated");
    let history = server.get("/v1/tasks/d-2/history").await.body;
    assert!(history.as_array().unwrap().iter().any(|e| e["kind"] == "step_compensated" && e["step"] == "reserve"), "{history}");
}

/// Receives one request of `agent` with `token`, waiting for it.
async fn receive_one(server: &Server, token: &str) -> Value {
    let request = server.request(reqwest::Method::POST, &format!("/v1/workers/{AGENT}/receive")).bearer_auth(token);
    let reply = server.send(request.json(&json!({ "max": 1, "wait_ms": 10_000 }))).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let requests = reply.body["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 1, "{}", reply.text);
    requests[0].clone()
}

async fn call(server: &Server, operation: &str, body: Value) -> common::Reply {
    server.post_json(&format!("/v1/workers/{AGENT}/{operation}"), &body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_lease_token_is_refused_and_the_current_one_answers() {
    let server = server(Duration::from_secs(1)).await;
    submit(&server, "pay", "s-1", json!({ "amount": 5, "card": "ok", "flaky": false, "slow_ms": 0 })).await;

    let first = receive_one(&server, WORKER_TOKEN).await;
    assert_eq!((first["task_id"].as_str(), first["step"].as_str(), first["attempt"].as_u64()), (Some("s-1"), Some("reserve"), Some(1)));
    assert_eq!(first["idempotency_key"], "s-1/reserve");
    assert_eq!((first["compensate"].as_bool(), first["delivery_count"].as_u64()), (Some(false), Some(1)));
    assert_eq!(first["input"], json!({ "amount": 5 }));
    assert_eq!(first["workflow"], "pay@1");
    let renewed = call(&server, "renew", json!({ "lease_token": first["lease_token"], "lease_ms": 500 })).await;
    assert_eq!(renewed.status, StatusCode::OK, "{}", renewed.text);
    assert!(renewed.body["lease_until"].as_i64().unwrap() <= first["complete_by"].as_i64().unwrap());

    // Let the lease run out: the request is delivered again, with a new lease.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let second = receive_one(&server, WORKER_TOKEN).await;
    assert_eq!(
        (second["step"].as_str(), second["attempt"].as_u64(), second["delivery_count"].as_u64()),
        (Some("reserve"), Some(1), Some(2))
    );
    assert_ne!(first["lease_token"], second["lease_token"]);

    let stale = first["lease_token"].clone();
    let reason =
        call(&server, "complete", json!({ "lease_token": stale, "output": { "by": "first" } })).await.assert_error(409, "lease_lost");
    assert!(reason.contains("s-1") && reason.contains("reserve"), "{reason}");
    call(&server, "fail", json!({ "lease_token": stale, "message": "late", "retryable": false })).await.assert_error(409, "lease_lost");
    call(&server, "renew", json!({ "lease_token": stale })).await.assert_error(409, "lease_lost");

    // Tokens are signed: an altered one, or one for another agent, is not a lease.
    let token = second["lease_token"].as_str().unwrap();
    let altered = format!("{}{}", &token[..token.len() - 1], if token.ends_with('A') { 'B' } else { 'A' });
    call(&server, "complete", json!({ "lease_token": altered, "output": 1 })).await.assert_error(422, "invalid_lease_token");
    let elsewhere = server.post_json("/v1/workers/other/complete", &json!({ "lease_token": token, "output": 1 })).await;
    elsewhere.assert_error(422, "invalid_lease_token");
    server.post_json("/v1/workers/nobody/receive", &json!({ "wait_ms": 0 })).await.assert_error(404, "unknown_agent");

    let answered = call(&server, "complete", json!({ "lease_token": token, "output": { "by": "second" } })).await;
    assert_eq!(answered.status, StatusCode::OK, "{}", answered.text);
    assert_eq!(answered.body, json!({ "task_id": "s-1", "step": "reserve", "attempt": 1, "status": "succeeded" }));
    call(&server, "complete", json!({ "lease_token": token, "output": {} })).await.assert_error(409, "lease_lost");

    let task = server.wait_until("s-1", |task| step(task, "reserve")["state"] == "completed").await;
    assert_eq!(step(&task, "reserve")["output"], json!({ "by": "second" }));
}

/// Beside its Scheduler (`rota serve`), the API has a remote worker's
/// reply decided in the commit that consumes the request, before the reply
/// returns: with no engine running (the test claims by hand), the step is
/// completed and the next one started as soon as the worker hears back.
/// Without the Scheduler the reply waits in its inbox, which no one reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_reply_is_decided_by_the_scheduler_of_the_process_before_it_returns() {
    for decide_replies in [true, false] {
        let token = |secret: &str, scope: Scope| Token::new(secret, vec![scope]).unwrap();
        let auth = AuthConfig::tokens(vec![
            token(ADMIN_TOKEN, Scope::Admin),
            token(WORKER_TOKEN, Scope::Agent { queues: vec![QueueName::new(format!("agent.{AGENT}")).unwrap()] }),
        ])
        .unwrap();
        let options = Options {
            auth,
            engine: false,
            decide_replies,
            workers: workers(Duration::from_secs(30)),
            workflows: vec![pay()],
            ..Options::default()
        };
        let mut server = start(options).await;
        server.token = Some(ADMIN_TOKEN.to_owned());
        submit(&server, "pay", "d-1", json!({ "amount": 5, "card": "ok", "flaky": false, "slow_ms": 0 })).await;
        assert_eq!(server.scheduler.as_ref().unwrap().claim_once().await.unwrap(), 1);

        let request = receive_one(&server, WORKER_TOKEN).await;
        assert_eq!(request["step"], "reserve");
        let answered = call(&server, "complete", json!({ "lease_token": request["lease_token"], "output": { "key": "h-1" } })).await;
        assert_eq!(answered.status, StatusCode::OK, "{}", answered.text);
        assert_eq!(answered.body["status"], "succeeded");
        let task = server.get("/v1/tasks/d-1").await.body;
        let states = (step(&task, "reserve")["state"].as_str(), step(&task, "charge")["state"].as_str());
        if decide_replies {
            assert_eq!(states, (Some("completed"), Some("running")), "decided before the reply returned: {task}");
            assert_eq!(step(&task, "reserve")["output"], json!({ "key": "h-1" }));
            // The request was consumed by the decision: its token is spent.
            call(&server, "complete", json!({ "lease_token": request["lease_token"], "output": {} })).await.assert_error(409, "lease_lost");
        } else {
            assert_eq!(states, (Some("running"), Some("not_started")), "the reply waits in the inbox: {task}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_after_the_deadline_is_dropped_and_the_step_is_tried_again() {
    let server = server(Duration::from_secs(30)).await;
    submit(&server, "hurry", "h-1", json!({})).await;
    let late = receive_one(&server, WORKER_TOKEN).await;
    assert_eq!(late["attempt"], 1);
    let complete_by = late["complete_by"].as_i64().unwrap();
    assert!(late["lease_until"].as_i64().unwrap() > complete_by, "the receive's lease is the configured one");

    // Sleep past the deadline (by the wall clock the server reads too).
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    while now() <= complete_by {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reason = call(&server, "complete", json!({ "lease_token": late["lease_token"], "output": { "late": true } }))
        .await
        .assert_error(410, "deadline_passed");
    assert!(reason.contains("h-1"), "{reason}");
    call(&server, "renew", json!({ "lease_token": late["lease_token"] })).await.assert_error(410, "deadline_passed");

    // The Supervisor finds the attempt expired; the Scheduler sends attempt 2.
    let again = receive_one(&server, WORKER_TOKEN).await;
    assert_eq!((again["step"].as_str(), again["attempt"].as_u64()), (Some("only"), Some(2)), "{again}");
    let answered = call(&server, "complete", json!({ "lease_token": again["lease_token"], "output": { "late": false } })).await;
    assert_eq!(answered.status, StatusCode::OK, "{}", answered.text);
    let done = server.wait_terminal("h-1").await;
    assert_eq!((done["state"].as_str(), &done["output"]["only"]), (Some("processed"), &json!({ "late": false })));
}

/// The `call_stopped` events of a task's history.
async fn stopped_calls(server: &Server, id: &str) -> Vec<Value> {
    let history = server.get(&format!("/v1/tasks/{id}/history")).await.body;
    history.as_array().unwrap().iter().filter(|e| e["kind"] == "call_stopped").cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_learns_of_a_cancel_on_its_next_renew_or_reply() {
    let server = server(Duration::from_secs(30)).await;
    submit(&server, "long", "c-1", json!({})).await;
    submit(&server, "long", "c-2", json!({})).await;
    let mut requests = [receive_one(&server, WORKER_TOKEN).await, receive_one(&server, WORKER_TOKEN).await];
    requests.sort_by_key(|r| r["task_id"].as_str().unwrap().to_owned());
    let [renewing, replying] = [&requests[0], &requests[1]];
    for id in ["c-1", "c-2"] {
        let cancelled = server.post_json(&format!("/v1/tasks/{id}/cancel"), &json!({})).await;
        assert_eq!(cancelled.status, StatusCode::OK, "{}", cancelled.text);
    }

    // The renew stops the call: the request is consumed without a reply.
    let reason = call(&server, "renew", json!({ "lease_token": renewing["lease_token"] })).await.assert_error(410, "task_finished");
    assert!(reason.contains("c-1") && reason.contains("the task was cancelled"), "{reason}");
    call(&server, "complete", json!({ "lease_token": renewing["lease_token"], "output": 1 })).await.assert_error(409, "lease_lost");
    // So does a reply: it is dropped.
    let reason =
        call(&server, "complete", json!({ "lease_token": replying["lease_token"], "output": 1 })).await.assert_error(410, "task_finished");
    assert!(reason.contains("c-2"), "{reason}");

    for id in ["c-1", "c-2"] {
        let stopped = stopped_calls(&server, id).await;
        assert_eq!(stopped.len(), 1, "{stopped:?}");
        assert_eq!((stopped[0]["step"].as_str(), stopped[0]["attempt"].as_u64()), (Some("only"), Some(1)));
        assert_eq!(stopped[0]["detail"], json!({ "agent": AGENT, "reason": "the task was cancelled", "compensate": false }));
        let task = server.get(&format!("/v1/tasks/{id}")).await.body;
        assert_eq!(task["state"], "cancelled", "{task}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_failure_of_a_class_the_policy_lists_fails_the_step_at_once() {
    let server = server(Duration::from_secs(30)).await;
    submit(&server, "picky", "nr-1", json!({})).await;
    let first = receive_one(&server, WORKER_TOKEN).await;
    assert_eq!(first["retry"]["non_retryable"], json!(["503", "timeout"]), "{first}");

    // A class that is not a class is refused, and the request stays leased.
    let reason =
        call(&server, "fail", json!({ "lease_token": first["lease_token"], "message": "x", "retryable": true, "class": "teapot" }))
            .await
            .assert_error(422, "invalid_body");
    assert!(reason.starts_with("class: expected an HTTP status or one of timeout"), "{reason}");
    // A class the policy does not list is retried as before.
    let other = json!({ "lease_token": first["lease_token"], "message": "404 from upstream", "retryable": true, "class": "404" });
    assert_eq!(call(&server, "fail", other).await.status, StatusCode::OK);
    let again = receive_one(&server, WORKER_TOKEN).await;
    assert_eq!(again["attempt"], 2, "{again}");
    // A listed one fails the step for good.
    let listed = json!({ "lease_token": again["lease_token"], "message": "503 from upstream", "retryable": true, "class": "503" });
    assert_eq!(call(&server, "fail", listed).await.status, StatusCode::OK);
    let failed = server.wait_terminal("nr-1").await;
    assert_eq!(failed["state"], "error", "{failed}");
    assert_eq!(
        step(&failed, "only")["last_error"],
        "503 from upstream; not retried: HTTP status 503 is listed in retry.non_retryable",
        "{failed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_of_a_task_being_undone_goes_on() {
    // Cancelling `pay` while `reserve` (which has a compensation) runs undoes
    // the task: its compensation waits for the call's reply, so the call is
    // not stopped.
    let server = server(Duration::from_secs(30)).await;
    submit(&server, "pay", "u-1", json!({ "amount": 5, "card": "ok", "flaky": false, "slow_ms": 0 })).await;
    let reserve = receive_one(&server, WORKER_TOKEN).await;
    let cancelled = server.post_json("/v1/tasks/u-1/cancel", &json!({})).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{}", cancelled.text);
    assert_eq!(server.get("/v1/tasks/u-1").await.body["state"], "compensating");
    let renewed = call(&server, "renew", json!({ "lease_token": reserve["lease_token"] })).await;
    assert_eq!(renewed.status, StatusCode::OK, "{}", renewed.text);
    let answered = call(&server, "complete", json!({ "lease_token": reserve["lease_token"], "output": { "key": "hold-1" } })).await;
    assert_eq!(answered.status, StatusCode::OK, "{}", answered.text);
    let undo = receive_one(&server, WORKER_TOKEN).await;
    assert_eq!((undo["step"].as_str(), undo["compensate"].as_bool()), (Some("reserve"), Some(true)), "{undo}");
    assert_eq!(undo["input"]["hold"], "hold-1", "the compensation got the reply of the call that went on");
    assert!(stopped_calls(&server, "u-1").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_checks_its_bounds_and_workflows_may_name_remote_agents() {
    let server = server(Duration::from_secs(30)).await;
    let path = format!("/v1/workers/{AGENT}/receive");
    let reason = server.post_json(&path, &json!({ "max": 0 })).await.assert_error(422, "invalid_body");
    assert!(reason.starts_with("max:"), "{reason}");
    server.post_json(&path, &json!({ "max": 33 })).await.assert_error(422, "invalid_body");
    let reason = server.post_json(&path, &json!({ "wait_ms": 20_001 })).await.assert_error(422, "invalid_body");
    assert!(reason.starts_with("wait_ms:"), "{reason}");
    server.post_json(&path, &json!({ "colour": 1 })).await.assert_error(422, "invalid_body");
    let empty = server.post_json(&path, &json!({ "wait_ms": 0 })).await;
    assert_eq!((empty.status, &empty.body), (StatusCode::OK, &json!({ "requests": [] })));

    let yaml = format!("name: remote\nversion: 1\nsteps:\n  - name: pay\n    agent: {AGENT}\n");
    let checked = server.send(server.request(reqwest::Method::POST, "/v1/workflows/validate").body(yaml)).await;
    assert_eq!(checked.body["valid"], true, "{}", checked.text);
    let unknown = "name: remote\nversion: 1\nsteps:\n  - name: pay\n    agent: py-nobody\n";
    let checked = server.send(server.request(reqwest::Method::POST, "/v1/workflows/validate").body(unknown)).await;
    assert_eq!(checked.body["valid"], false, "{}", checked.text);
}
