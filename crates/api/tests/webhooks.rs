//! Webhooks end to end: tasks submitted over HTTP with a `callback_url`, a
//! real engine and store, the [`Dispatcher`], and a real axum receiver
//! that fails the first deliveries and then accepts them (or always fails,
//! until told otherwise). Checks the signature (computed here
//! independently), the order, the retries, dead-lettering after the limit,
//! and the redrive.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use common::{Options, Server, WAIT_MAX, start};
use hmac::{Hmac, KeyInit, Mac};
use rota_engine::Shutdown;
use rota_engine::status::WEBHOOK_CURSOR_KEY;
use rota_engine::webhooks::{Dispatcher, Secret, WebhookConfig};
use rota_model::{InstanceId, SystemClock};
use serde_json::{Value, json};
use sha2::Sha256;

const SECRET: &str = "webhook-secret-for-tests-000001";

/// One POST as the receiver saw it.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    signature: String,
    delivery: u32,
    event_id: String,
    body: Vec<u8>,
    accepted: bool,
}

impl Received {
    fn event(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

#[derive(Default)]
struct Receiver {
    seen: Mutex<Vec<Received>>,
    /// `/hook` fails this many requests first.
    hook_failures_left: AtomicU32,
    /// `/dead` fails until this is set.
    dead_accepts: AtomicBool,
}

async fn record(path: &str, receiver: &Receiver, headers: &HeaderMap, body: Bytes, accepted: bool) -> StatusCode {
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    receiver.seen.lock().unwrap().push(Received {
        path: path.to_owned(),
        signature: header("rota-signature"),
        delivery: header("rota-delivery").parse().unwrap(),
        event_id: header("rota-event-id"),
        body: body.to_vec(),
        accepted,
    });
    if accepted { StatusCode::NO_CONTENT } else { StatusCode::INTERNAL_SERVER_ERROR }
}

async fn hook(State(receiver): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let fail = receiver.hook_failures_left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
    record("/hook", &receiver, &headers, body, !fail).await
}

async fn dead(State(receiver): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let accepted = receiver.dead_accepts.load(Ordering::SeqCst);
    record("/dead", &receiver, &headers, body, accepted).await
}

/// Starts the receiver; returns its base URL.
async fn receiver(state: Arc<Receiver>) -> String {
    let app = axum::Router::new().route("/hook", axum::routing::post(hook)).route("/dead", axum::routing::post(dead)).with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

fn config(instance: &str) -> WebhookConfig {
    let mut config = WebhookConfig::new(InstanceId::new(instance).unwrap(), Secret::new(SECRET).unwrap());
    config.attempts_max = 5;
    config.backoff_initial = Duration::from_millis(20);
    config.backoff_max = Duration::from_millis(100);
    config.poll_interval = Duration::from_millis(20);
    config.request_timeout = Duration::from_secs(5);
    config
}

/// Runs a dispatcher until the returned signal is triggered.
fn dispatch(server: &Server, instance: &str) -> (Shutdown, tokio::task::JoinHandle<Result<(), rota_engine::Error>>) {
    let dispatcher = Dispatcher::new(server.store.clone(), Arc::new(SystemClock), config(instance)).unwrap();
    let shutdown = Shutdown::new();
    (shutdown.clone(), tokio::spawn(dispatcher.run(shutdown)))
}

/// Waits until `done` holds for what the receiver has seen.
async fn wait_seen(receiver: &Receiver, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
    let started = std::time::Instant::now();
    loop {
        let seen = receiver.seen.lock().unwrap().clone();
        if done(&seen) {
            return seen;
        }
        assert!(started.elapsed() < WAIT_MAX, "{what}: the receiver saw {seen:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks `Rota-Signature` against the body with an HMAC computed here.
fn assert_signed(received: &Received) {
    let (t, v1) = received.signature.strip_prefix("t=").and_then(|rest| rest.split_once(",v1=")).expect("t=…,v1=…");
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(&received.body);
    let expected: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(v1, expected, "signature of {}", String::from_utf8_lossy(&received.body));
    let sent_at: i64 = t.parse().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((now - 600..=now + 1).contains(&sent_at), "t={sent_at} is the sending time");
}

async fn submit(server: &Server, id: &str, callback_url: Option<&str>) {
    let mut body = json!({ "workflow": "quick", "id": id });
    if let Some(url) = callback_url {
        body["callback_url"] = json!(url);
    }
    let reply = server.post_json("/v1/tasks", &body).await;
    assert_eq!(reply.status, reqwest::StatusCode::CREATED, "{}", reply.text);
    assert_eq!(reply.body["callback_url"], json!(callback_url));
}

fn kinds_of(seen: &[Received], task: &str) -> Vec<String> {
    seen.iter().filter(|r| r.accepted && r.event()["task_id"] == task).map(|r| r.event()["kind"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_events_are_posted_signed_in_order_retried_and_dead_lettered() {
    let server = start(Options::default()).await;
    let state = Arc::new(Receiver { hook_failures_left: AtomicU32::new(3), ..Receiver::default() });
    let base = receiver(state.clone()).await;
    let (stop, running) = dispatch(&server, "hooks-1");

    let reason = server
        .post_json("/v1/tasks", &json!({ "workflow": "quick", "callback_url": "ftp://nope/" }))
        .await
        .assert_error(422, "invalid_body");
    assert!(reason.starts_with("callback_url:"), "{reason}");

    submit(&server, "quiet", None).await;
    submit(&server, "w-1", Some(&format!("{base}/hook"))).await;
    assert_eq!(server.wait_terminal("w-1").await["state"], "processed");
    let seen = wait_seen(&state, "w-1 processed", |seen| kinds_of(seen, "w-1").contains(&"processed".to_owned())).await;

    // The first event was refused three times and delivered the fourth time;
    // the later ones waited behind it (one task's events go in order).
    let first: Vec<(u32, bool)> = seen.iter().take(4).map(|r| (r.delivery, r.accepted)).collect();
    assert_eq!(first, [(1, false), (2, false), (3, false), (4, true)], "{seen:#?}");
    assert!(seen.iter().take(4).all(|r| r.event_id == seen[0].event_id));
    assert_eq!(kinds_of(&seen, "w-1"), ["received", "step_completed", "step_completed", "processed"]);
    let seqs: Vec<i64> = seen.iter().filter(|r| r.accepted).map(|r| r.event()["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "in event order: {seqs:?}");
    for received in &seen {
        assert_signed(received);
        assert_eq!(received.event_id, received.event()["seq"].to_string());
        assert_eq!(received.event()["task_id"], "w-1", "a task without a callback URL sends nothing");
    }

    // A receiver that keeps failing: each event is delivered attempts_max
    // times, then dead-lettered with the last error.
    submit(&server, "w-2", Some(&format!("{base}/dead"))).await;
    assert_eq!(server.wait_terminal("w-2").await["state"], "processed");
    let started = std::time::Instant::now();
    let dead_letters = loop {
        let reply = server.get("/v1/queues/rota.webhooks/dead-letters").await;
        if reply.body.as_array().is_some_and(|letters| letters.len() == 4) {
            break reply.body;
        }
        assert!(started.elapsed() < WAIT_MAX, "dead letters: {}", reply.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for letter in dead_letters.as_array().unwrap() {
        assert_eq!(letter["delivery_count"], 5, "{letter}");
        let reason = letter["reason"].as_str().unwrap();
        assert!(reason.contains("answered 500") && reason.contains("(delivery 5 of 5)"), "{reason}");
    }
    let refused = state.seen.lock().unwrap().iter().filter(|r| r.path == "/dead").count();
    assert_eq!(refused, 4 * 5, "four events, five deliveries each");

    // Once the receiver is back, an operator redrives them: delivered, in order.
    state.dead_accepts.store(true, Ordering::SeqCst);
    let redriven = server.post("/v1/queues/rota.webhooks/dead-letters/redrive").await;
    assert_eq!(redriven.body["count"], 4, "{}", redriven.text);
    let seen = wait_seen(&state, "w-2 redriven", |seen| kinds_of(seen, "w-2").len() == 4).await;
    assert_eq!(kinds_of(&seen, "w-2"), ["received", "step_completed", "step_completed", "processed"]);

    // The cursor is durable: another dispatcher goes on where this one stopped.
    stop.trigger();
    running.await.unwrap().unwrap();
    let cursor = server.store.statuses(WEBHOOK_CURSOR_KEY).await.unwrap();
    assert!(cursor[0].value["seq"].as_i64().unwrap() > 0, "{cursor:?}");
    let delivered_before = state.seen.lock().unwrap().len();
    let (stop, running) = dispatch(&server, "hooks-2");
    submit(&server, "w-3", Some(&format!("{base}/hook"))).await;
    let seen = wait_seen(&state, "w-3 processed", |seen| kinds_of(seen, "w-3").contains(&"processed".to_owned())).await;
    let after: Vec<&Received> = seen[delivered_before..].iter().collect();
    assert!(after.iter().all(|r| r.event()["task_id"] == "w-3"), "nothing delivered twice: {after:#?}");
    assert_eq!(kinds_of(&seen, "w-3"), ["received", "step_completed", "step_completed", "processed"]);
    stop.trigger();
    running.await.unwrap().unwrap();
}

/// A step of 1.5 s with a warning point at 300 ms: the Supervisor (every
/// 100 ms in these tests) raises one `at_risk` warning while it runs.
fn risky() -> rota_workflow::Workflow {
    rota_workflow::Workflow::builder("risky", 1)
        .step(
            rota_workflow::StepDef::new("slow", "delay")
                .with_input(json!({ "ms": 1500 }))
                .timeout(Duration::from_secs(30))
                .warn_after(Duration::from_millis(300)),
        )
        .build(&rota_workflow::AgentCatalog::builtin())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_at_risk_warning_reaches_webhooks_event_streams_and_the_at_risk_listing() {
    let server = start(Options { workflows: vec![risky()], ..Options::default() }).await;
    let state = Arc::new(Receiver::default());
    let base = receiver(state.clone()).await;
    let (stop, running) = dispatch(&server, "hooks-risk");
    let mut stream = common::SseReader::open(&server, "/v1/events?kind=at_risk", None).await;
    assert_eq!(server.get("/v1/tasks?at_risk=true").await.body, json!([]), "nothing is at risk yet");

    let reply = server.post_json("/v1/tasks", &json!({ "workflow": "risky", "id": "r-1", "callback_url": format!("{base}/hook") })).await;
    assert_eq!(reply.status, reqwest::StatusCode::CREATED, "{}", reply.text);
    let frame = stream.next_event().await.expect("an at_risk event on the stream");
    let event = frame.json();
    assert_eq!(
        (&event["kind"], &event["task_id"], &event["step"], &event["attempt"]),
        (&json!("at_risk"), &json!("r-1"), &json!("slow"), &json!(1))
    );
    assert!(event["detail"]["reason"].as_str().unwrap().starts_with("step slow attempt 1 passed its warn_after with "), "{event}");

    // While the step runs, the task is listed at risk, and says since when.
    let listed = server.get("/v1/tasks?at_risk=true").await;
    assert_eq!(listed.body.as_array().map(Vec::len), Some(1), "{}", listed.text);
    assert_eq!(listed.body[0]["id"], "r-1");
    assert!(listed.body[0]["at_risk_since"].is_i64(), "{}", listed.text);
    let task = server.get("/v1/tasks/r-1").await.body;
    assert_eq!(task["at_risk_since"], listed.body[0]["at_risk_since"]);
    assert!(task["steps"][0]["warn_at"].is_i64(), "{task}");
    assert_eq!(server.get("/v1/tasks?at_risk=true&state=processing").await.body.as_array().map(Vec::len), Some(1));
    assert_eq!(server.get("/v1/tasks?at_risk=true&workflow=quick").await.body, json!([]));
    assert_eq!(server.get("/v1/tasks?at_risk=false").await.body.as_array().map(Vec::len), Some(1), "false is no filter");
    let reason = server.get("/v1/tasks?at_risk=maybe").await.assert_error(400, "invalid_query");
    assert!(reason.contains("at_risk"), "{reason}");
    let alerts = server.get("/v1/alerts").await.body;
    assert_eq!((&alerts[0]["task_id"], &alerts[0]["step"]), (&json!("r-1"), &json!("slow")), "{alerts}");

    assert_eq!(server.wait_terminal("r-1").await["state"], "processed");
    assert_eq!(server.get("/v1/tasks?at_risk=true").await.body, json!([]), "a finished task is not at risk");
    let seen = wait_seen(&state, "r-1 processed", |seen| kinds_of(seen, "r-1").contains(&"processed".to_owned())).await;
    assert_eq!(kinds_of(&seen, "r-1"), ["received", "at_risk", "step_completed", "processed"], "the webhook gets the warning once");
    let posted = seen.iter().find(|r| r.event()["kind"] == "at_risk").unwrap();
    assert_signed(posted);
    assert_eq!(posted.event()["seq"], event["seq"], "the same event as the stream's");
    stop.trigger();
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_the_egress_allow_list_refuses_is_dead_lettered_at_once() {
    let server = start(Options::default()).await;
    let state = Arc::new(Receiver::default());
    let base = receiver(state.clone()).await;
    let port = base.rsplit(':').next().unwrap();
    let mut config = config("hooks-egress");
    config.egress = rota_agent::Egress::allow_list(&["10.0.0.0/8"]).unwrap();
    let dispatcher = Dispatcher::new(server.store.clone(), Arc::new(SystemClock), config).unwrap();
    let stop = Shutdown::new();
    let running = tokio::spawn(dispatcher.run(stop.clone()));

    // An address literal, and a name that resolves outside the list.
    submit(&server, "eg-1", Some(&format!("{base}/hook?key=q"))).await;
    submit(&server, "eg-2", Some(&format!("http://localhost:{port}/hook"))).await;
    assert_eq!(server.wait_terminal("eg-1").await["state"], "processed");
    assert_eq!(server.wait_terminal("eg-2").await["state"], "processed");
    let started = std::time::Instant::now();
    let letters = loop {
        let reply = server.get("/v1/queues/rota.webhooks/dead-letters").await;
        if reply.body.as_array().is_some_and(|letters| letters.len() == 8) {
            break reply.body;
        }
        assert!(started.elapsed() < WAIT_MAX, "dead letters: {}", reply.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for letter in letters.as_array().unwrap() {
        assert_eq!(letter["delivery_count"], 1, "refused for good, not retried: {letter}");
        let reason = letter["reason"].as_str().unwrap();
        assert!(reason.contains("egress allow-list (egress-allow)") && !reason.contains("key=q"), "{reason}");
        assert!(reason.contains("host 127.0.0.1 is not in") || reason.contains("host localhost resolves to"), "{reason}");
    }
    assert!(state.seen.lock().unwrap().is_empty(), "nothing reached the receiver");
    stop.trigger();
    running.await.unwrap().unwrap();
}
