//! Fuzzing the API's request decoding, with proptest: arbitrary JSON and
//! definition text sent to every endpoint that takes a body, and arbitrary
//! path segments to those that take an id, on a running server. Every
//! answer is a success or a 4xx in the one error shape: never a 5xx, a
//! dropped connection or a server that stops answering.
//!
//! A failing input is shrunk and saved in `tests/fuzz.proptest-regressions`
//! (committed), so it runs first on every later run.

mod common;

use common::{Options, Server, start};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// The endpoints that read a JSON body, `{}` standing for a task id.
const JSON_ROUTES: &[&str] =
    &["/v1/tasks", "/v1/workers/delay/receive", "/v1/workers/delay/renew", "/v1/workers/delay/complete", "/v1/workers/delay/fail"];

/// The endpoints that take an id in the path and no body.
const ID_ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/tasks/{}"),
    ("GET", "/v1/tasks/{}/history"),
    ("POST", "/v1/tasks/{}/cancel"),
    ("POST", "/v1/tasks/{}/resubmit"),
    ("POST", "/v1/tasks/{}/steps/{}/resubmit"),
    ("GET", "/v1/queues/{}"),
    ("POST", "/v1/queues/{}/pause"),
    ("GET", "/v1/workflows/{}"),
    ("GET", "/v1/tasks?before={}"),
];

/// Field names the bodies use, so that arbitrary objects reach the checks
/// behind the first field.
const FIELDS: &[&str] = &[
    "workflow",
    "version",
    "input",
    "id",
    "callback_url",
    "reply_queue",
    "start_at",
    "delay",
    "max",
    "wait_ms",
    "lease_ms",
    "lease_token",
    "output",
    "error",
    "retryable",
    "retry_after_ms",
    "extra",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        "\\PC{0,24}".prop_map(Value::String),
        prop::sample::select(&["quick", "slow", "2026-12-01T02:00:00Z", "10m", "http://127.0.0.1:1/", "-1s", "1e999"][..])
            .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(prop::sample::select(FIELDS), inner, 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

/// 256 cases per target, or `ROTA_FUZZ_CASES` for a longer run (see
/// docs/reliability.md).
fn config() -> Config {
    let cases = std::env::var("ROTA_FUZZ_CASES")
        .map(|text| text.parse().unwrap_or_else(|_| panic!("ROTA_FUZZ_CASES must be a number of cases, got {text:?}")));
    Config {
        cases: cases.unwrap_or(256),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel("proptest-regressions"))),
        ..Config::default()
    }
}

/// Checks that an answer is a success or a 4xx in the error shape.
fn answered_well(what: &str, status: StatusCode, body: &str) -> Result<(), TestCaseError> {
    prop_assert!(!status.is_server_error(), "{what}: {status} {body}");
    if status.is_client_error() {
        let error: Value =
            serde_json::from_str(body).map_err(|err| TestCaseError::fail(format!("{what}: {status} not JSON ({err}): {body}")))?;
        prop_assert!(error["error"]["code"].is_string() && error["error"]["reason"].is_string(), "{what}: {body}");
    }
    Ok(())
}

struct Fixture {
    runtime: tokio::runtime::Runtime,
    server: Server,
}

impl Fixture {
    fn new() -> Fixture {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let server = runtime.block_on(start(Options { engine: false, ..Options::default() }));
        Fixture { runtime, server }
    }

    fn send(&self, method: Method, path: &str, body: Option<(&'static str, Vec<u8>)>) -> (StatusCode, String) {
        let mut request = self.server.request(method, path);
        if let Some((content_type, bytes)) = body {
            request = request.header(reqwest::header::CONTENT_TYPE, content_type).body(bytes);
        }
        self.runtime.block_on(async {
            let reply = request.send().await.expect("the server answers");
            (reply.status(), reply.text().await.unwrap())
        })
    }
}

/// A path segment made of `text`, percent-encoded byte by byte.
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

#[test]
fn json_bodies_of_any_shape_are_a_success_or_a_4xx() {
    let fixture = Fixture::new();
    proptest!(config(), |(route in prop::sample::select(JSON_ROUTES), body in json_value())| {
        let (status, text) = fixture.send(Method::POST, route, Some(("application/json", serde_json::to_vec(&body).unwrap())));
        answered_well(&format!("POST {route} {body}"), status, &text)?;
    });
    assert_eq!(fixture.send(Method::GET, "/healthz", None).0, StatusCode::OK, "still answering");
}

#[test]
fn definitions_of_any_text_are_a_success_or_a_4xx() {
    let fixture = Fixture::new();
    let definition = prop_oneof![
        "\\PC{0,200}",
        json_value().prop_map(|value| serde_json::to_string(&json!({ "name": "fuzz", "version": 1, "steps": [value] })).unwrap()),
    ];
    proptest!(config(), |(route in prop::sample::select(&["/v1/workflows/validate", "/v1/workflows"][..]), text in definition)| {
        let (status, body) = fixture.send(Method::POST, route, Some(("application/yaml", text.clone().into_bytes())));
        answered_well(&format!("POST {route} {text:?}"), status, &body)?;
    });
}

#[test]
fn ids_of_any_text_are_a_success_or_a_4xx() {
    let fixture = Fixture::new();
    proptest!(config(), |((method, route) in prop::sample::select(ID_ROUTES), id in "\\PC{0,40}")| {
        let path = route.replace("{}", &segment(&id));
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let (status, body) = fixture.send(method.clone(), &path, None);
        answered_well(&format!("{method} {path}"), status, &body)?;
    });
}
