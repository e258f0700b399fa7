//! The auth matrix: every endpoint × every scope, allowed or 403; 401
//! without a token or with an unknown one; public endpoints open to all.

mod common;

use common::{Options, start};
use reqwest::{Method, StatusCode};
use rota_api::{AuthConfig, Scope, Token, WorkerConfig};
use rota_model::QueueName;
use rota_store::Outgoing;
use rota_workflow::AgentName;
use serde_json::{Value, json};

const ADMIN: &str = "admin-token-000000000001";
const OPERATOR: &str = "operator-token-00000001";
const READ: &str = "read-token-000000000001";
const SUBMIT: &str = "submit-token-0000000001";
const AGENT: &str = "agent-token-00000000001";

fn auth() -> AuthConfig {
    let token = |secret: &str, scope: Scope| Token::new(secret, vec![scope]).unwrap();
    AuthConfig::tokens(vec![
        token(ADMIN, Scope::Admin),
        token(OPERATOR, Scope::Operator),
        token(READ, Scope::Read),
        token(SUBMIT, Scope::Submit),
        token(AGENT, Scope::Agent { queues: vec![QueueName::new("agent.delay").unwrap(), QueueName::new("agent.py").unwrap()] }),
    ])
    .unwrap()
}

/// What an endpoint needs.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Needs {
    Read,
    ReadTask,
    Submit,
    Signal,
    Operate,
    /// The worker protocol on agent `py`, which the agent token names.
    Work,
    /// The worker protocol on agent `other`, which it does not.
    WorkOther,
}

fn allowed(token: &str, needs: Needs) -> bool {
    match token {
        ADMIN => true,
        OPERATOR => matches!(needs, Needs::Read | Needs::ReadTask | Needs::Signal | Needs::Operate),
        READ => matches!(needs, Needs::Read | Needs::ReadTask),
        // Allowed, and confined to its own tasks (404 for the others).
        SUBMIT => matches!(needs, Needs::Submit | Needs::ReadTask | Needs::Signal),
        AGENT => needs == Needs::Work,
        _ => false,
    }
}

/// Two remote agents: `py` (in the agent token's scope) and `other`.
fn workers() -> WorkerConfig {
    WorkerConfig { remote_agents: vec![AgentName::new("py").unwrap(), AgentName::new("other").unwrap()], ..WorkerConfig::default() }
}

const YAML: &str = "name: extra\nversion: 1\nsteps:\n  - name: nap\n    agent: delay\n";

/// A request: method, path, JSON body, text body, and what it needs.
type Endpoint = (Method, &'static str, Option<Value>, Option<&'static str>, Needs);

/// Every protected endpoint, with a request that is valid apart from auth.
fn endpoints() -> Vec<Endpoint> {
    use Needs::*;
    vec![
        (Method::POST, "/v1/tasks", Some(json!({ "workflow": "quick" })), None, Submit),
        (Method::GET, "/v1/tasks", None, None, ReadTask),
        (Method::GET, "/v1/tasks/counts", None, None, Read),
        (Method::GET, "/v1/tasks/t-1", None, None, ReadTask),
        (Method::GET, "/v1/tasks/t-1/history", None, None, ReadTask),
        (Method::GET, "/v1/tasks/t-1/events", None, None, ReadTask),
        (Method::POST, "/v1/tasks/t-1/cancel", None, None, Operate),
        (Method::POST, "/v1/tasks/t-1/pause", None, None, Operate),
        (Method::POST, "/v1/tasks/t-1/resume", Some(json!({ "reason": "done" })), None, Operate),
        (Method::POST, "/v1/tasks/t-1/signals/approved", Some(json!({ "by": "ann" })), None, Signal),
        (Method::POST, "/v1/tasks/t-1/resubmit", None, None, Operate),
        (Method::POST, "/v1/tasks/t-1/steps/first/resubmit", None, None, Operate),
        (Method::GET, "/v1/alerts", None, None, Read),
        (Method::GET, "/v1/events", None, None, Read),
        (Method::GET, "/v1/workflows", None, None, Read),
        (Method::GET, "/v1/workflows/quick", None, None, Read),
        (Method::GET, "/v1/workflows/quick/versions/1", None, None, Read),
        (Method::POST, "/v1/workflows/validate", None, Some(YAML), Read),
        (Method::POST, "/v1/workflows", None, Some(YAML), Operate),
        (Method::GET, "/v1/schedules", None, None, Read),
        (Method::POST, "/v1/schedules", Some(json!({ "name": "s", "workflow": "quick", "cron": "0 0 1 1 *" })), None, Operate),
        (Method::GET, "/v1/schedules/s", None, None, Read),
        (Method::POST, "/v1/schedules/s/pause", None, None, Operate),
        (Method::POST, "/v1/schedules/s/resume", None, None, Operate),
        (Method::POST, "/v1/schedules/s/trigger", None, None, Operate),
        (Method::DELETE, "/v1/schedules/s", None, None, Operate),
        (Method::GET, "/v1/queues", None, None, Read),
        (Method::GET, "/v1/queues/jobs", None, None, Read),
        (Method::POST, "/v1/queues/jobs/pause", None, None, Operate),
        (Method::POST, "/v1/queues/jobs/resume", None, None, Operate),
        (Method::GET, "/v1/queues/jobs/dead-letters", None, None, Read),
        (Method::POST, "/v1/queues/jobs/dead-letters/redrive", None, None, Operate),
        (Method::POST, "/v1/queues/jobs/dead-letters/m-1/redrive", None, None, Operate),
        (Method::POST, "/v1/queues/jobs/dead-letters/purge", None, None, Operate),
        (Method::GET, "/v1/breakers", None, None, Read),
        (Method::GET, "/v1/instances", None, None, Read),
        (Method::GET, "/v1/activity", None, None, Read),
        (Method::GET, "/metrics", None, None, Read),
        (Method::POST, "/v1/workers/py/receive", Some(json!({ "wait_ms": 0 })), None, Work),
        (Method::POST, "/v1/workers/py/renew", Some(json!({ "lease_token": "v1.x.y" })), None, Work),
        (Method::POST, "/v1/workers/py/complete", Some(json!({ "lease_token": "v1.x.y", "output": 1 })), None, Work),
        (Method::POST, "/v1/workers/py/fail", Some(json!({ "lease_token": "v1.x.y", "message": "m", "retryable": true })), None, Work),
        (Method::POST, "/v1/workers/other/receive", Some(json!({ "wait_ms": 0 })), None, WorkOther),
        (Method::POST, "/v1/workers/other/complete", Some(json!({ "lease_token": "v1.x.y", "output": 1 })), None, WorkOther),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scope_on_every_endpoint() {
    let server = start(Options { auth: auth(), engine: false, workers: workers(), ..Options::default() }).await;
    server.store.send(&QueueName::new("jobs").unwrap(), Outgoing::json(&json!({})).unwrap()).await.unwrap();
    let seeded = server.http.post(server.url("/v1/tasks")).bearer_auth(ADMIN).json(&json!({ "workflow": "quick", "id": "t-1" }));
    assert_eq!(seeded.send().await.unwrap().status(), StatusCode::CREATED);

    let mut checked = 0;
    for (method, path, json, text, needs) in endpoints() {
        for token in [ADMIN, OPERATOR, READ, SUBMIT, AGENT, "not-a-configured-token", ""] {
            let mut request = server.http.request(method.clone(), server.url(path));
            if !token.is_empty() {
                request = request.bearer_auth(token);
            }
            if let Some(json) = &json {
                request = request.json(json);
            }
            if let Some(text) = text {
                request = request.body(text);
            }
            // Only the status and headers are read: event streams stay open.
            let response = request.send().await.unwrap();
            let status = response.status();
            let www_authenticate = response.headers().get("www-authenticate").map(|v| v.to_str().unwrap().to_owned());
            let what = format!("{method} {path} with token {token:?}");
            match token {
                "" | "not-a-configured-token" => {
                    assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}");
                    assert_eq!(www_authenticate.as_deref(), Some("Bearer"), "{what}");
                    let body: Value = response.json().await.unwrap();
                    assert_eq!(body["error"]["code"], "unauthorized", "{what}");
                    assert!(!body.to_string().contains("not-a-configured"), "the token is never echoed: {body}");
                }
                token if allowed(token, needs) => {
                    assert!(status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN, "{what}: {status}");
                    assert!(!status.is_server_error(), "{what}: {status}");
                }
                _ => {
                    assert_eq!(status, StatusCode::FORBIDDEN, "{what}");
                    let body: Value = response.json().await.unwrap();
                    assert_eq!(body["error"]["code"], "forbidden", "{what}");
                    assert!(body["error"]["reason"].as_str().unwrap().contains(path.split('/').nth(2).unwrap_or("metrics")), "{body}");
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, endpoints().len() * 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_authorization_headers_are_401() {
    let server = start(Options { auth: auth(), engine: false, ..Options::default() }).await;
    for header in [format!("Basic {ADMIN}"), "Bearer".to_owned(), format!("Bearer{ADMIN}"), format!("Bearer {ADMIN}x")] {
        let response = server.http.get(server.url("/v1/tasks")).header("authorization", &header).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{header}");
    }
    let lower = server.http.get(server.url("/v1/tasks")).header("authorization", format!("bearer {ADMIN}")).send().await.unwrap();
    assert_eq!(lower.status(), StatusCode::OK, "the scheme is case-insensitive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documentation_and_health_are_public() {
    let server = start(Options { auth: auth(), engine: false, ..Options::default() }).await;
    for path in ["/healthz", "/readyz", "/openapi.json", "/docs/"] {
        assert_eq!(server.get(path).await.status, StatusCode::OK, "{path}");
    }
}

/// A callback's token is its credential: the route answers on its merits
/// (here: no step waits for this token) without a bearer token, and a
/// bearer token, valid or not, changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_take_no_bearer_token() {
    let server = start(Options { auth: auth(), engine: false, ..Options::default() }).await;
    for token in [None, Some(READ), Some("not-a-configured-token")] {
        let mut request = server.http.post(server.url("/v1/callbacks/bm90.YQ.1.00000000000000000000000000000000")).json(&json!({}));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{token:?}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unknown_callback", "{token:?}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_disabled_everything_is_open() {
    let server = start(Options { engine: false, workers: workers(), ..Options::default() }).await;
    for (method, path, json, text, _) in endpoints() {
        let mut request = server.http.request(method.clone(), server.url(path));
        if let Some(json) = &json {
            request = request.json(json);
        }
        if let Some(text) = text {
            request = request.body(text);
        }
        let status = request.send().await.unwrap().status();
        assert!(status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN, "{method} {path}: {status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_submit_scope_sees_only_the_tasks_it_submitted() {
    const OTHER: &str = "other-submit-token-0001";
    let shop = Token::new(SUBMIT, vec![Scope::Submit]).unwrap().named("shop").unwrap();
    let other = Token::new(OTHER, vec![Scope::Submit]).unwrap();
    let other_id = other.id().to_owned();
    let admin = Token::new(ADMIN, vec![Scope::Admin]).unwrap();
    let admin_id = admin.id().to_owned();
    let auth = AuthConfig::tokens(vec![admin, shop, other]).unwrap();
    let mut server = start(Options { auth, engine: false, ..Options::default() }).await;
    let as_token = |server: &mut common::Server, token: &str| server.token = Some(token.to_owned());

    as_token(&mut server, ADMIN);
    assert_eq!(server.submit("quick", "theirs").await["submitter"], admin_id.as_str());
    as_token(&mut server, OTHER);
    assert_eq!(server.submit("quick", "other-1").await["submitter"], other_id.as_str());
    as_token(&mut server, SUBMIT);
    let created = server.submit("quick", "mine").await;
    assert_eq!(created["submitter"], "shop", "the token's name is its id");
    assert_eq!(server.get("/v1/tasks/mine").await.body["state"], "pending");
    let listed: Vec<Value> = server.get("/v1/tasks").await.body.as_array().unwrap().iter().map(|t| t["id"].clone()).collect();
    assert_eq!(listed, [json!("mine")], "a submit token lists its own tasks only");
    let listed = server.get("/v1/tasks?workflow=quick&state=pending").await.body;
    assert_eq!(listed.as_array().unwrap().len(), 1, "with filters too: {listed}");

    // Another's task reads exactly as a task that does not exist.
    let missing = server.get("/v1/tasks/nothing").await.assert_error(404, "not_found");
    for path in ["/v1/tasks/theirs", "/v1/tasks/other-1", "/v1/tasks/theirs/history", "/v1/tasks/theirs/events"] {
        let reason = server.get(path).await.assert_error(404, "not_found");
        let id = path.split('/').nth(3).unwrap();
        assert_eq!(reason.replace(id, "nothing").replace("task history", "get task").replace("task events", "get task"), missing, "{path}");
    }
    server.post_json("/v1/tasks/theirs/signals/approved", &json!({"by": "mallory"})).await.assert_error(404, "not_found");
    let own = server.post_json("/v1/tasks/mine/signals/approved", &json!({"by": "ann"})).await;
    assert!(own.status != 403 && own.status != 404, "its own task may be signalled: {:?}", own.body);
    // Submitting another's id is refused without showing the task.
    let taken = server.send(server.request(Method::POST, "/v1/tasks").json(&json!({"workflow": "quick", "id": "theirs"}))).await;
    let reason = taken.assert_error(409, "task_exists");
    assert!(reason.contains("theirs") && !taken.body.to_string().contains(&admin_id), "{}", taken.body);
    let again = server.send(server.request(Method::POST, "/v1/tasks").json(&json!({"workflow": "quick", "id": "mine"}))).await;
    assert_eq!(again.status, 200, "its own id answers with its task: {:?}", again.body);
    server.post("/v1/tasks/mine/cancel").await.assert_error(403, "forbidden");
    server.get("/v1/tasks/counts").await.assert_error(403, "forbidden");

    // Other scopes see everything, with each task's submitter.
    as_token(&mut server, ADMIN);
    let listed: Vec<(Value, Value)> =
        server.get("/v1/tasks").await.body.as_array().unwrap().iter().map(|t| (t["id"].clone(), t["submitter"].clone())).collect();
    assert_eq!(
        listed,
        [(json!("mine"), json!("shop")), (json!("other-1"), json!(other_id)), (json!("theirs"), json!(admin_id))],
        "newest first, with their submitters"
    );
    assert_eq!(server.get("/v1/tasks/mine").await.body["submitter"], "shop");
}
