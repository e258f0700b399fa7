//! Invalid input is a 4xx, never a 5xx: every endpoint gets malformed
//! paths, queries and bodies, and every answer is either a success or an
//! error in the one JSON shape.

mod common;

use common::{Options, Reply, start};
use reqwest::Method;
use serde_json::json;

/// Path segments that are not valid ids or names, URL-encoded. (Not `..`:
/// the client resolves it, and `/v1/tasks/../events` is the all-tasks stream.)
const BAD_SEGMENTS: &[&str] = &["%00", "%FF%FE", "%20lead", "trail%20", "a%0Ab", "...", "%2E%2E%2F%2E%2E"];

/// Query strings that no endpoint accepts.
const BAD_QUERIES: &[&str] = &["limit=-1", "limit=1e3", "limit=", "limit=18446744073709551616", "state[]=x", "after=x", "%ZZ=1"];

/// JSON bodies of the wrong shape, and bytes that are not JSON.
fn bad_bodies() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("application/json", b"null".to_vec()),
        ("application/json", b"[]".to_vec()),
        ("application/json", b"\"text\"".to_vec()),
        ("application/json", b"{\"workflow\": 7}".to_vec()),
        ("application/json", b"{\"workflow\": \"quick\", \"version\": \"1\"}".to_vec()),
        ("application/json", b"{\"workflow\": \"quick\", \"id\": 5}".to_vec()),
        ("application/json", "[".repeat(10_000).into_bytes()),
        ("application/json", vec![0xff, 0xfe, 0x00]),
        ("application/json", Vec::new()),
        ("text/plain", b"{\"workflow\": \"quick\"}".to_vec()),
        ("application/yaml", b"name: [unclosed".to_vec()),
        ("application/yaml", b"&a [*a]".to_vec()),
    ]
}

/// Every route, with `{}` where a path parameter goes.
const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/tasks"),
    ("GET", "/v1/tasks"),
    ("GET", "/v1/tasks/counts"),
    ("GET", "/v1/tasks/{}"),
    ("GET", "/v1/tasks/{}/history"),
    ("GET", "/v1/tasks/{}/events"),
    ("POST", "/v1/tasks/{}/cancel"),
    ("POST", "/v1/tasks/{}/resubmit"),
    ("POST", "/v1/tasks/t-1/steps/{}/resubmit"),
    ("GET", "/v1/alerts"),
    ("GET", "/v1/events"),
    ("GET", "/v1/workflows"),
    ("POST", "/v1/workflows"),
    ("POST", "/v1/workflows/validate"),
    ("GET", "/v1/workflows/{}"),
    ("GET", "/v1/workflows/quick/versions/{}"),
    ("GET", "/v1/queues"),
    ("GET", "/v1/queues/{}"),
    ("POST", "/v1/queues/{}/pause"),
    ("POST", "/v1/queues/{}/resume"),
    ("GET", "/v1/queues/{}/dead-letters"),
    ("POST", "/v1/queues/{}/dead-letters/redrive"),
    ("POST", "/v1/queues/jobs/dead-letters/{}/redrive"),
    ("POST", "/v1/queues/{}/dead-letters/purge"),
    ("GET", "/v1/breakers"),
    ("GET", "/v1/instances"),
    ("GET", "/v1/activity"),
    ("POST", "/v1/workers/{}/receive"),
    ("POST", "/v1/workers/{}/renew"),
    ("POST", "/v1/workers/{}/complete"),
    ("POST", "/v1/workers/{}/fail"),
];

#[track_caller]
fn assert_client_side(reply: &Reply, what: &str) {
    assert!(!reply.status.is_server_error(), "{what}: {} {}", reply.status, reply.text);
    if reply.status.is_client_error() {
        assert!(reply.body["error"]["code"].is_string() && reply.body["error"]["reason"].is_string(), "{what}: {}", reply.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_to_every_endpoint_are_4xx_in_the_error_shape() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    server.submit("quick", "t-1").await;
    let method = |name: &str| Method::from_bytes(name.as_bytes()).unwrap();
    let mut requests = 0;

    for (verb, route) in ROUTES {
        if route.contains("{}") {
            for segment in BAD_SEGMENTS.iter().copied().chain([&*"x".repeat(5_000)]) {
                let path = route.replace("{}", segment);
                let reply = server.send(server.request(method(verb), &path).timeout(common::WAIT_MAX)).await;
                assert_client_side(&reply, &format!("{verb} {path}"));
                requests += 1;
            }
        }
        let path = route.replace("{}", "t-1");
        for query in BAD_QUERIES {
            let reply = server.send(server.request(method(verb), &format!("{path}?{query}"))).await;
            assert_client_side(&reply, &format!("{verb} {path}?{query}"));
            requests += 1;
        }
        if *verb == "POST" {
            for (content_type, body) in bad_bodies() {
                let request = server.request(method(verb), &path).header("content-type", content_type).body(body.clone());
                let reply = server.send(request).await;
                assert_client_side(
                    &reply,
                    &format!("{verb} {path} with {content_type} {:?}", String::from_utf8_lossy(&body[..body.len().min(20)])),
                );
                requests += 1;
            }
        }
    }
    assert!(requests > 300, "{requests}");
    assert_eq!(server.get("/readyz").await.body["status"], "ok", "the server is still well");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_methods_and_unknown_routes_answer_in_the_error_shape() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    for (verb, path) in [("PUT", "/v1/tasks"), ("PATCH", "/v1/queues"), ("DELETE", "/v1/workflows"), ("POST", "/healthz")] {
        let reply = server.send(server.request(Method::from_bytes(verb.as_bytes()).unwrap(), path)).await;
        reply.assert_error(405, "method_not_allowed");
    }
    for path in ["/v1", "/v2/tasks", "/v1/tasks/a/b/c", "/v1/queues/jobs/dead-letters/x/y"] {
        server.get(path).await.assert_error(404, "no_such_route");
    }
    let huge_input = json!({ "workflow": "quick", "input": { "nested": [[[[[[[[[[1]]]]]]]]]] } });
    assert_eq!(server.post_json("/v1/tasks", &huge_input).await.status.as_u16(), 201, "deep but valid JSON is accepted");
}
