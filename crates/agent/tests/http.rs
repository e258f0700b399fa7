//! The `http` agent against a real HTTP server on loopback (wiremock), in
//! real time with short durations: sockets do not run on paused time.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rota_agent::{Agent, BreakerConfig, BreakerState, Egress, HttpAgent, HttpConfig, Outcome, Request, run_until_deadline};
use rota_model::{Clock, FailureClass, FailureKind, ManualClock, RetryPolicy, SystemClock};
use serde_json::{Value, json};
use wiremock::matchers::{body_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn request(input: Value, clock: &dyn Clock, window: Duration) -> Request {
    common::request("charge", 3, input, clock.now() + window)
}

fn post(server: &MockServer, body: Value) -> Value {
    json!({ "method": "POST", "url": format!("{}/charge", server.uri()), "body": body, "timeout": "2s" })
}

fn fast_retries(attempts: u32) -> RetryPolicy {
    RetryPolicy::new(attempts, Duration::from_millis(10), Duration::from_millis(20)).unwrap()
}

fn agent(clock: Arc<dyn Clock>) -> HttpAgent {
    HttpAgent::new(clock).unwrap()
}

async fn hits(server: &MockServer) -> usize {
    server.received_requests().await.unwrap().len()
}

#[tokio::test]
async fn success_returns_the_json_body_and_sends_rota_headers() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/charge"))
        .and(header("idempotency-key", "order-17/charge"))
        .and(header("rota-attempt", "3"))
        .and(header("rota-task-id", "order-17"))
        .and(header("rota-step", "charge"))
        .and(header("x-custom", "yes"))
        .and(body_json(json!({"amount": 12})))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"charge_id": "c-1"})))
        .expect(1)
        .mount(&server)
        .await;
    let clock = Arc::new(SystemClock);
    let mut input = post(&server, json!({"amount": 12}));
    input["headers"] = json!({"X-Custom": "yes"});
    let output = agent(clock.clone()).call(&request(input, clock.as_ref(), Duration::from_secs(10))).await;
    assert_eq!(output, Ok(json!({"charge_id": "c-1"})));
}

#[tokio::test]
async fn the_idempotency_key_is_stable_across_retries_and_compensation_has_its_own() {
    let server = MockServer::start().await;
    Mock::given(path("/charge")).respond_with(ResponseTemplate::new(500)).up_to_n_times(2).with_priority(1).mount(&server).await;
    Mock::given(path("/charge")).respond_with(ResponseTemplate::new(201).set_body_json(json!({"ok": true}))).mount(&server).await;
    let clock = Arc::new(SystemClock);
    let agent = agent(clock.clone());
    let request = request(post(&server, json!({})), clock.as_ref(), Duration::from_secs(10));
    let mut rng = StdRng::seed_from_u64(1);
    let outcome = run_until_deadline(&agent, &request, &fast_retries(5), clock.as_ref(), &mut rng).await;
    assert_eq!(outcome, Outcome::Succeeded(json!({"ok": true})));
    let received = server.received_requests().await.unwrap();
    assert_eq!(received.len(), 3);
    for r in &received {
        assert_eq!(r.headers.get("idempotency-key").unwrap(), "order-17/charge");
        assert_eq!(r.headers.get("rota-attempt").unwrap(), "3", "the Scheduler's attempt, not the agent's try");
        assert!(r.headers.get("rota-compensate").is_none());
        assert!(r.headers.get("rota-callback-token").is_none(), "only a callback step's requests carry a token");
    }

    let mut callback = request.clone();
    callback.callback_token = Some("dG9r.Y2hhcmdl.3.00ff".into());
    agent.call(&callback).await.unwrap();
    let last = server.received_requests().await.unwrap().pop().unwrap();
    assert_eq!(last.headers.get("rota-callback-token").unwrap(), "dG9r.Y2hhcmdl.3.00ff");

    let mut compensation = request.clone();
    compensation.compensate = true;
    compensation.idempotency_key = Request::idempotency_key_for(&compensation.task_id, &compensation.step, true);
    agent.call(&compensation).await.unwrap();
    let last = server.received_requests().await.unwrap().pop().unwrap();
    assert_eq!(last.headers.get("idempotency-key").unwrap(), "order-17/charge/compensate");
    assert_eq!(last.headers.get("rota-compensate").unwrap(), "true");
}

#[tokio::test]
async fn responses_are_classified() {
    let server = MockServer::start().await;
    Mock::given(path("/text")).respond_with(ResponseTemplate::new(200).set_body_string("accepted")).mount(&server).await;
    Mock::given(path("/empty")).respond_with(ResponseTemplate::new(204)).mount(&server).await;
    Mock::given(path("/broken")).respond_with(ResponseTemplate::new(500).set_body_string("db down")).mount(&server).await;
    Mock::given(path("/busy")).respond_with(ResponseTemplate::new(429).insert_header("Retry-After", "2")).mount(&server).await;
    Mock::given(path("/slow-client")).respond_with(ResponseTemplate::new(408)).mount(&server).await;
    Mock::given(path("/missing")).respond_with(ResponseTemplate::new(404).set_body_string("no such order")).mount(&server).await;
    let clock = Arc::new(SystemClock);
    let agent = agent(clock.clone());
    let call = |p: &str| {
        let input = json!({ "method": "GET", "url": format!("{}{p}", server.uri()) });
        let request = request(input, clock.as_ref(), Duration::from_secs(10));
        let agent = &agent;
        async move { agent.call(&request).await }
    };

    assert_eq!(call("/text").await, Ok(json!({"status": 200, "body": "accepted"})));
    assert_eq!(call("/empty").await, Ok(Value::Null));

    let err = call("/broken").await.unwrap_err();
    assert!(err.is_retryable());
    assert!(err.message().contains("500 Internal Server Error: db down"), "{err}");

    let err = call("/busy").await.unwrap_err();
    assert!(err.is_retryable());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));

    assert!(call("/slow-client").await.unwrap_err().is_retryable());

    let err = call("/missing").await.unwrap_err();
    assert!(!err.is_retryable());
    assert!(err.message().contains("404 Not Found: no such order"), "{err}");

    // The 500 counted against the endpoint's breaker; the answers after it
    // (429, 408, 404) show the endpoint is up and reset the count.
    let breakers = agent.breakers();
    assert_eq!(breakers.len(), 1);
    assert_eq!((breakers[0].state, breakers[0].consecutive_failures), (BreakerState::Closed, 0));
}

#[tokio::test]
async fn a_429_retry_after_is_honoured_by_the_retry_loop() {
    let server = MockServer::start().await;
    Mock::given(path("/charge"))
        .respond_with(ResponseTemplate::new(429).insert_header("Retry-After", "1"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(path("/charge")).respond_with(ResponseTemplate::new(200).set_body_json(json!(1))).mount(&server).await;
    let clock = Arc::new(SystemClock);
    let agent = agent(clock.clone());
    let request = request(post(&server, json!({})), clock.as_ref(), Duration::from_secs(10));
    let started = std::time::Instant::now();
    let outcome = run_until_deadline(&agent, &request, &fast_retries(3), clock.as_ref(), &mut StdRng::seed_from_u64(1)).await;
    assert_eq!(outcome, Outcome::Succeeded(json!(1)));
    assert!(started.elapsed() >= Duration::from_secs(1), "waited {:?}, not the 10 ms backoff", started.elapsed());
}

#[tokio::test]
async fn a_status_listed_as_non_retryable_fails_at_the_first_answer() {
    let server = MockServer::start().await;
    Mock::given(path("/charge")).respond_with(ResponseTemplate::new(503).set_body_string("down")).mount(&server).await;
    let clock = Arc::new(SystemClock);
    let agent = agent(clock.clone());
    let request = request(post(&server, json!({})), clock.as_ref(), Duration::from_secs(10));
    let listed = fast_retries(4).with_non_retryable([FailureClass::Status(503)]);
    let outcome = run_until_deadline(&agent, &request, &listed, clock.as_ref(), &mut StdRng::seed_from_u64(1)).await;
    let Outcome::Failed { message, attempts: 1, retryable: false } = outcome else { panic!("{outcome:?}") };
    assert!(message.ends_with("503 Service Unavailable: down; not retried: HTTP status 503 is listed in retry.non_retryable"), "{message}");
    assert_eq!(hits(&server).await, 1);
    // Listing other classes leaves a 503 retried to the end of the policy.
    let others = fast_retries(4).with_non_retryable([FailureClass::Status(404), FailureClass::Kind(FailureKind::Timeout)]);
    let outcome = run_until_deadline(&agent, &request, &others, clock.as_ref(), &mut StdRng::seed_from_u64(1)).await;
    assert!(matches!(outcome, Outcome::Failed { attempts: 4, retryable: true, .. }), "{outcome:?}");
    assert_eq!(hits(&server).await, 5);
}

#[tokio::test]
async fn connection_refused_is_retryable() {
    // Bind a port, then free it: nothing listens there now.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let clock = Arc::new(SystemClock);
    let input = json!({ "method": "GET", "url": format!("http://127.0.0.1:{port}/x") });
    let err = agent(clock.clone()).call(&request(input, clock.as_ref(), Duration::from_secs(5))).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert_eq!(err.class(), Some(FailureClass::Kind(FailureKind::Connection)));
    assert!(err.message().starts_with(&format!("GET http://127.0.0.1:{port}/x: ")), "{err}");
}

#[tokio::test]
async fn a_slow_endpoint_times_out_as_retryable() {
    let server = MockServer::start().await;
    Mock::given(path("/charge")).respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(5))).mount(&server).await;
    let clock = Arc::new(SystemClock);
    let agent = agent(clock.clone());
    let mut input = post(&server, json!({}));
    input["timeout"] = json!("150ms");
    let started = std::time::Instant::now();
    let err = agent.call(&request(input, clock.as_ref(), Duration::from_secs(10))).await.unwrap_err();
    assert!(err.is_retryable());
    assert!(err.message().contains("timed out after 150ms"), "{err}");
    assert_eq!(err.class(), Some(FailureClass::Kind(FailureKind::Timeout)));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(agent.breakers()[0].consecutive_failures, 1, "the input's own timeout counts against the endpoint");
}

#[tokio::test]
async fn a_hanging_endpoint_is_cut_at_the_deadline_without_blaming_it() {
    let server = MockServer::start().await;
    Mock::given(path("/charge")).respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(5))).mount(&server).await;
    let clock = Arc::new(SystemClock);
    let agent = agent(clock.clone());
    let request = request(post(&server, json!({})), clock.as_ref(), Duration::from_millis(300));
    let started = std::time::Instant::now();
    let outcome = run_until_deadline(&agent, &request, &fast_retries(5), clock.as_ref(), &mut StdRng::seed_from_u64(1)).await;
    assert!(matches!(outcome, Outcome::DeadlinePassed { .. }), "{outcome:?}");
    assert!(!outcome.should_reply());
    assert!(started.elapsed() < Duration::from_secs(2), "cut after {:?}", started.elapsed());
    assert!(agent.breakers().iter().all(|b| b.consecutive_failures == 0), "{:?}", agent.breakers());
}

#[tokio::test]
async fn the_breaker_opens_stops_calling_then_lets_a_probe_through() {
    let server = MockServer::start().await;
    Mock::given(path("/charge")).respond_with(ResponseTemplate::new(503)).up_to_n_times(3).with_priority(1).mount(&server).await;
    Mock::given(path("/charge")).respond_with(ResponseTemplate::new(200).set_body_json(json!("ok"))).mount(&server).await;
    let clock = Arc::new(ManualClock::default());
    let config = HttpConfig { breaker: BreakerConfig::new(3, Duration::from_secs(10)).unwrap(), ..HttpConfig::default() };
    let agent = HttpAgent::with_config(config, clock.clone()).unwrap();
    let request = request(post(&server, json!({})), clock.as_ref(), Duration::from_secs(60));

    for _ in 0..3 {
        assert!(agent.call(&request).await.unwrap_err().message().contains("503"));
    }
    let endpoint = format!("http://127.0.0.1:{}", server.address().port());
    let snapshot = &agent.breakers()[0];
    assert_eq!((snapshot.endpoint.as_str(), snapshot.state), (endpoint.as_str(), BreakerState::Open));
    assert_eq!(snapshot.open_until, Some(clock.now() + Duration::from_secs(10)));

    for _ in 0..5 {
        let err = agent.call(&request).await.unwrap_err();
        assert!(err.is_retryable());
        assert!(err.message().starts_with(&format!("circuit open for {endpoint} until ")), "{err}");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(10)));
    }
    assert_eq!(hits(&server).await, 3, "an open breaker does not touch the network");

    clock.advance(Duration::from_secs(10));
    assert_eq!(agent.call(&request).await, Ok(json!("ok")), "the probe goes through and succeeds");
    assert_eq!(agent.breakers()[0].state, BreakerState::Closed);
    assert_eq!(hits(&server).await, 4);
}

#[tokio::test]
async fn a_failed_probe_reopens_the_breaker() {
    let server = MockServer::start().await;
    Mock::given(path("/charge")).respond_with(ResponseTemplate::new(500)).mount(&server).await;
    let clock = Arc::new(ManualClock::default());
    let config = HttpConfig { breaker: BreakerConfig::new(2, Duration::from_secs(5)).unwrap(), ..HttpConfig::default() };
    let agent = HttpAgent::with_config(config, clock.clone()).unwrap();
    let request = request(post(&server, json!({})), clock.as_ref(), Duration::from_secs(60));
    for _ in 0..2 {
        agent.call(&request).await.unwrap_err();
    }
    clock.advance(Duration::from_secs(5));
    assert!(agent.call(&request).await.unwrap_err().message().contains("500"), "the probe reached the server");
    let snapshot = &agent.breakers()[0];
    assert_eq!((snapshot.state, snapshot.open_until), (BreakerState::Open, Some(clock.now() + Duration::from_secs(5))));
    assert!(agent.call(&request).await.unwrap_err().message().starts_with("circuit open"));
    assert_eq!(hits(&server).await, 3);
}

#[tokio::test]
async fn bad_input_is_permanent_and_never_sent() {
    let clock = Arc::new(SystemClock);
    let input = json!({ "method": "POST", "url": "http://127.0.0.1:9/x", "timeout": "fast" });
    let err = agent(clock.clone()).call(&request(input, clock.as_ref(), Duration::from_secs(5))).await.unwrap_err();
    assert!(!err.is_retryable());
    assert!(err.message().starts_with("input.timeout: invalid duration"), "{err}");
}

#[test]
fn configs_out_of_bounds_are_refused() {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let zero = HttpConfig { timeout_default: Duration::ZERO, ..HttpConfig::default() };
    assert!(HttpAgent::with_config(zero, clock.clone()).unwrap_err().to_string().contains("http.timeout_default"));
    let huge = HttpConfig { response_bytes_max: usize::MAX, ..HttpConfig::default() };
    assert!(HttpAgent::with_config(huge, clock).unwrap_err().to_string().contains("http.response_bytes_max"));
}

#[tokio::test]
async fn oversized_responses_are_refused() {
    let server = MockServer::start().await;
    Mock::given(path("/big")).respond_with(ResponseTemplate::new(200).set_body_string("x".repeat(2_000))).mount(&server).await;
    let clock = Arc::new(SystemClock);
    let config = HttpConfig { response_bytes_max: 1_000, ..HttpConfig::default() };
    let agent = HttpAgent::with_config(config, clock.clone()).unwrap();
    let input = json!({ "method": "GET", "url": format!("{}/big", server.uri()) });
    let err = agent.call(&request(input, clock.as_ref(), Duration::from_secs(5))).await.unwrap_err();
    assert!(!err.is_retryable());
    assert!(err.message().contains("larger than 1000 bytes"), "{err}");
}

/// An agent whose calls may reach only `allow`.
fn allowing(allow: &[&str], clock: Arc<dyn Clock>) -> HttpAgent {
    let config = HttpConfig { egress: Egress::allow_list(allow).unwrap(), ..HttpConfig::default() };
    HttpAgent::with_config(config, clock).unwrap()
}

#[tokio::test]
async fn the_egress_allow_list_refuses_unlisted_hosts_for_good() {
    let server = MockServer::start().await;
    Mock::given(path("/charge")).respond_with(ResponseTemplate::new(200).set_body_json(json!({"ok": true}))).mount(&server).await;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let port = server.address().port();
    let call = |agent: HttpAgent, host: &str| {
        let input = json!({ "method": "POST", "url": format!("http://{host}:{port}/charge"), "timeout": "2s" });
        let request = request(input, clock.as_ref(), Duration::from_secs(5));
        async move { agent.call(&request).await }
    };

    // An address literal outside the list: refused before any connection.
    let err = call(allowing(&["10.0.0.0/8"], clock.clone()), "127.0.0.1").await.unwrap_err();
    assert!(!err.is_retryable(), "a refusal is permanent: {err}");
    assert_eq!(
        err.message(),
        format!("POST http://127.0.0.1:{port}/charge: host 127.0.0.1 is not in the egress allow-list (egress-allow)")
    );
    // A name that resolves into a network the list does not hold.
    let err = call(allowing(&["10.0.0.0/8", "api.example.com"], clock.clone()), "localhost").await.unwrap_err();
    assert!(!err.is_retryable(), "a refusal is permanent: {err}");
    assert!(err.message().contains("host localhost resolves to "), "{err}");
    assert!(err.message().contains("which the egress allow-list (egress-allow) does not allow"), "{err}");
    assert_eq!(hits(&server).await, 0, "nothing reached the server");

    // The same calls, allowed by network or by name; and with the list off.
    assert_eq!(call(allowing(&["127.0.0.0/8", "::1"], clock.clone()), "localhost").await, Ok(json!({"ok": true})));
    assert_eq!(call(allowing(&["LocalHost"], clock.clone()), "localhost").await, Ok(json!({"ok": true})));
    assert_eq!(call(allowing(&["127.0.0.1"], clock.clone()), "127.0.0.1").await, Ok(json!({"ok": true})));
    assert_eq!(call(agent(clock.clone()), "127.0.0.1").await, Ok(json!({"ok": true})));
}

#[tokio::test]
async fn a_redirect_to_an_unlisted_address_is_refused() {
    let server = MockServer::start().await;
    let port = server.address().port();
    Mock::given(path("/away"))
        .respond_with(ResponseTemplate::new(302).insert_header("location", format!("http://127.0.0.2:{port}/charge")))
        .mount(&server)
        .await;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let input = json!({ "method": "GET", "url": format!("http://localhost:{port}/away"), "timeout": "2s" });
    let err = allowing(&["localhost"], clock.clone()).call(&request(input, clock.as_ref(), Duration::from_secs(5))).await.unwrap_err();
    assert!(!err.is_retryable(), "{err}");
    assert!(err.message().contains("host 127.0.0.2 is not in the egress allow-list (egress-allow)"), "{err}");
    assert_eq!(hits(&server).await, 1, "only the first hop was sent");
}
