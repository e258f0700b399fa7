//! The OpenAPI document (every route, every schema), the offline Swagger
//! UI, and the Prometheus metrics.

mod common;

use common::{Options, start};
use reqwest::StatusCode;
use rota_model::QueueName;
use rota_store::{Outgoing, Receive};
use serde_json::{Value, json};

/// Every `/v1` operation the router serves, as (method, OpenAPI path).
const OPERATIONS: &[(&str, &str)] = &[
    ("post", "/v1/tasks"),
    ("get", "/v1/tasks"),
    ("get", "/v1/tasks/counts"),
    ("get", "/v1/tasks/{id}"),
    ("get", "/v1/tasks/{id}/history"),
    ("get", "/v1/tasks/{id}/events"),
    ("post", "/v1/tasks/{id}/cancel"),
    ("post", "/v1/tasks/{id}/pause"),
    ("post", "/v1/tasks/{id}/resume"),
    ("post", "/v1/tasks/{id}/resubmit"),
    ("post", "/v1/tasks/{id}/signals/{name}"),
    ("post", "/v1/tasks/{id}/steps/{step}/resubmit"),
    ("post", "/v1/callbacks/{token}"),
    ("get", "/v1/alerts"),
    ("get", "/v1/events"),
    ("get", "/v1/workflows"),
    ("post", "/v1/workflows"),
    ("post", "/v1/workflows/validate"),
    ("get", "/v1/workflows/{name}"),
    ("get", "/v1/workflows/{name}/versions/{version}"),
    ("post", "/v1/workflows/{name}/pause"),
    ("post", "/v1/workflows/{name}/resume"),
    ("get", "/v1/schedules"),
    ("post", "/v1/schedules"),
    ("get", "/v1/schedules/{name}"),
    ("delete", "/v1/schedules/{name}"),
    ("post", "/v1/schedules/{name}/pause"),
    ("post", "/v1/schedules/{name}/resume"),
    ("post", "/v1/schedules/{name}/trigger"),
    ("get", "/v1/queues"),
    ("get", "/v1/queues/{queue}"),
    ("post", "/v1/queues/{queue}/pause"),
    ("post", "/v1/queues/{queue}/resume"),
    ("get", "/v1/queues/{queue}/dead-letters"),
    ("post", "/v1/queues/{queue}/dead-letters/purge"),
    ("post", "/v1/queues/{queue}/dead-letters/redrive"),
    ("post", "/v1/queues/{queue}/dead-letters/{id}/redrive"),
    ("get", "/v1/breakers"),
    ("get", "/v1/batches"),
    ("post", "/v1/batches"),
    ("get", "/v1/batches/{id}"),
    ("post", "/v1/batches/{id}/stop"),
    ("get", "/v1/audit"),
    ("get", "/v1/instances"),
    ("get", "/v1/activity"),
    ("post", "/v1/workers/{agent}/receive"),
    ("post", "/v1/workers/{agent}/renew"),
    ("post", "/v1/workers/{agent}/complete"),
    ("post", "/v1/workers/{agent}/fail"),
];

/// Every `$ref` in a JSON document.
fn refs(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("$ref", Value::String(target)) => found.push(target.clone()),
                    _ => refs(value, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| refs(item, found)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_lists_every_route_with_its_errors_and_schemas() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    let reply = server.get("/openapi.json").await;
    assert_eq!(reply.status, StatusCode::OK);
    let doc = reply.body;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{}", doc["openapi"]);
    let paths = doc["paths"].as_object().unwrap();
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, item) in paths {
        for method in ["get", "post", "delete", "put", "patch"] {
            if item.get(method).is_some() {
                documented.push((method.to_owned(), path.clone()));
            }
        }
    }
    let mut expected: Vec<(String, String)> = OPERATIONS.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
    documented.sort();
    expected.sort();
    assert_eq!(documented, expected, "the document lists exactly the routes served");

    // Client generators key operations by their ids: each must be unique.
    let mut ids: Vec<&str> = OPERATIONS.iter().map(|(method, path)| doc["paths"][path][method]["operationId"].as_str().unwrap()).collect();
    ids.sort_unstable();
    let repeated: Vec<&&str> = ids.windows(2).filter(|pair| pair[0] == pair[1]).map(|pair| &pair[0]).collect();
    assert!(repeated.is_empty(), "operationIds used more than once: {repeated:?}");

    for (method, path) in OPERATIONS {
        let operation = &doc["paths"][path][method];
        let responses = operation["responses"].as_object().unwrap();
        assert!(responses.keys().any(|s| s.starts_with('2')), "{method} {path} documents its success");
        // The callback token is the one credential of its route.
        let public = *path == "/v1/callbacks/{token}";
        for status in ["401", "403"] {
            assert_eq!(responses.contains_key(status), !public, "{method} {path} documents {status} (or not, if public)");
        }
        for (status, response) in responses {
            if status.starts_with('4') || status.starts_with('5') {
                let schema = &response["content"]["application/json"]["schema"]["$ref"];
                assert!(schema.as_str().unwrap().ends_with("Body"), "{method} {path} {status}: {response}");
            }
        }
        let security = if public { Value::Null } else { json!([{ "bearer": [] }]) };
        assert_eq!(operation["security"], security, "{method} {path}");
    }
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");

    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let mut targets = Vec::new();
    refs(&doc, &mut targets);
    assert!(!targets.is_empty());
    for target in targets {
        let name = target.strip_prefix("#/components/schemas/").unwrap_or_else(|| panic!("unexpected $ref {target}"));
        assert!(schemas.contains_key(name), "{target} is defined");
    }
    for name in [
        "ErrorBody",
        "SubmitRequest",
        "TaskView",
        "StepView",
        "EventView",
        "QueueView",
        "DeadLetterView",
        "WorkflowView",
        "ScheduleRequest",
        "ScheduleView",
        "ReceiveRequest",
        "WorkRequest",
        "CompleteRequest",
        "FailRequest",
        "ReplyView",
    ] {
        assert!(schemas.contains_key(name), "schema {name}");
    }

    // Deadline warnings: the listing's filter and the fields that say when.
    let params = doc["paths"]["/v1/tasks"]["get"]["parameters"].as_array().unwrap();
    let at_risk = params.iter().find(|p| p["name"] == "at_risk").expect("the at_risk filter is documented");
    assert_eq!((&at_risk["in"], &at_risk["schema"]["type"]), (&json!("query"), &json!("boolean")), "{at_risk}");
    for (schema, field) in
        [("TaskSummary", "at_risk_since"), ("TaskView", "at_risk_since"), ("TaskView", "warn_at"), ("StepView", "warn_at")]
    {
        assert!(schemas[schema]["properties"].get(field).is_some(), "{schema}.{field} is documented");
    }

    // Conditions: the Skipped state, its event kind and the `when` fields.
    assert!(schemas["StepStateView"].to_string().contains(r#""skipped""#), "{}", schemas["StepStateView"]);
    for (schema, field) in [("StepView", "when"), ("WorkflowStepView", "when")] {
        assert!(schemas[schema]["properties"].get(field).is_some(), "{schema}.{field} is documented");
    }
    let kind = &doc["paths"]["/v1/events"]["get"]["parameters"].as_array().unwrap().iter().find(|p| p["name"] == "kind").unwrap()["schema"];
    assert!(kind["pattern"].as_str().is_some_and(|p| p.contains("step_skipped")), "{kind}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swagger_ui_is_served_from_the_binary() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    let page = server.get("/docs/").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.text.contains("swagger-ui"), "{}", page.text);
    assert!(!page.text.contains("cdn") && !page.text.contains("unpkg"), "nothing loads from a CDN");
    for asset in ["/docs/swagger-ui.css", "/docs/swagger-ui-bundle.js", "/docs/swagger-initializer.js"] {
        let reply = server.get(asset).await;
        assert_eq!(reply.status, StatusCode::OK, "{asset}");
        assert!(!reply.text.is_empty(), "{asset}");
    }
    assert!(server.get("/docs/swagger-initializer.js").await.text.contains("/openapi.json"));
}

/// The value of the sample `name{labels}` in a Prometheus text, if present.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|line| !line.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
        let all = labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
        (metric == name && all).then(|| value.parse().unwrap())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_tasks_queues_dead_letters_and_breakers() {
    let server = start(Options::default()).await;
    server.submit("quick", "m-1").await;
    server.wait_terminal("m-1").await;
    server.get("/v1/tasks/nope").await;
    let queue = QueueName::new("jobs").unwrap();
    for _ in 0..2 {
        server.store.send(&queue, Outgoing::json(&json!({})).unwrap()).await.unwrap();
    }
    let delivery = server.store.receive(&queue, Receive::up_to(1)).await.unwrap().remove(0);
    server.store.dead_letter(&queue, delivery.lease_token, "poison".into()).await.unwrap();
    let breaker = json!({ "agent": "http", "endpoint": "http://127.0.0.1:9", "state": "half_open" });
    server.store.report_status("breaker/http://127.0.0.1:9", &breaker).await.unwrap();

    let reply = server.get("/metrics").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.headers["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = reply.text;
    let requests = |route: &str, method: &str, status: &str| {
        sample(&text, "rota_http_requests_total", &[("route", route), ("method", method), ("status", status)])
    };
    assert_eq!(requests("/v1/tasks", "POST", "201"), Some(1.0), "{text}");
    assert_eq!(requests("/v1/tasks/{id}", "GET", "404"), Some(1.0), "by route pattern, not raw path: {text}");
    assert!(requests("/v1/tasks/{id}", "GET", "200").unwrap() >= 1.0);
    assert!(sample(&text, "rota_http_request_duration_seconds_bucket", &[("route", "/v1/tasks"), ("le", "+Inf")]).is_some(), "{text}");
    assert_eq!(sample(&text, "rota_tasks", &[("state", "processed")]), Some(1.0), "{text}");
    assert_eq!(sample(&text, "rota_tasks", &[("state", "error")]), Some(0.0));
    assert_eq!(sample(&text, "rota_queue_ready_messages", &[("queue", "jobs")]), Some(1.0), "{text}");
    assert_eq!(sample(&text, "rota_queue_dead_letters", &[("queue", "jobs")]), Some(1.0));
    assert_eq!(sample(&text, "rota_queue_paused", &[("queue", "jobs")]), Some(0.0));
    assert!(sample(&text, "rota_queue_oldest_ready_age_seconds", &[("queue", "jobs")]).unwrap() >= 0.0);
    assert_eq!(sample(&text, "rota_breaker_state", &[("endpoint", "http://127.0.0.1:9"), ("state", "half_open")]), Some(1.0));
    assert_eq!(sample(&text, "rota_breaker_state", &[("endpoint", "http://127.0.0.1:9"), ("state", "open")]), Some(0.0));
    assert_eq!(sample(&text, "rota_store_up", &[]), Some(1.0));
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        assert!(line.starts_with("rota_"), "every name is prefixed: {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routers_in_one_process_count_their_own_requests() {
    let first = start(Options { engine: false, ..Options::default() }).await;
    let second = start(Options { engine: false, ..Options::default() }).await;
    for _ in 0..3 {
        first.get("/v1/queues").await;
    }
    second.get("/v1/queues").await;
    let count = |text: &str| sample(text, "rota_http_requests_total", &[("route", "/v1/queues"), ("status", "200")]);
    assert_eq!(count(&first.get("/metrics").await.text), Some(3.0));
    assert_eq!(count(&second.get("/metrics").await.text), Some(1.0));
}
