//! Every endpoint and every error class, over HTTP, against a real SQLite
//! store and (where tasks must run) a real engine.

mod common;

use std::time::Duration;

use common::{Options, Server, start};
use reqwest::{Method, StatusCode};
use rota_model::QueueName;
use rota_store::{Outgoing, Receive};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitted_task_runs_and_a_second_submit_with_its_id_returns_it() {
    let server = start(Options::default()).await;
    let created = server.submit("quick", "order-1").await;
    assert_eq!(created["id"], "order-1");
    assert_eq!(created["workflow"], "quick");
    assert_eq!(created["input"], json!({ "n": 1 }));
    assert_eq!(created["steps"].as_array().unwrap().len(), 2);

    let again = server.post_json("/v1/tasks", &json!({ "workflow": "quick", "id": "order-1", "input": { "n": 2 } })).await;
    assert_eq!(again.status, StatusCode::OK, "the id is the idempotency key: {}", again.text);
    assert_eq!(again.body["input"], json!({ "n": 1 }), "the existing task is returned unchanged");

    let done = server.wait_terminal("order-1").await;
    assert_eq!(done["state"], "processed");
    let steps: Vec<(&str, &str)> =
        done["steps"].as_array().unwrap().iter().map(|s| (s["name"].as_str().unwrap(), s["state"].as_str().unwrap())).collect();
    assert_eq!(steps, [("first", "completed"), ("second", "completed")]);
    assert_eq!(done["output"]["second"], json!({ "slept_ms": 10 }));
    assert_eq!((done["steps"][0]["agent"].as_str(), done["max_failures"].as_u64()), (Some("delay"), Some(3)), "{done}");

    let history = server.get("/v1/tasks/order-1/history").await;
    assert_eq!(history.status, StatusCode::OK);
    let kinds: Vec<&str> = history.body.as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"received"));
    assert_eq!(kinds.last(), Some(&"processed"));
    assert_eq!(kinds.iter().filter(|k| **k == "step_completed").count(), 2);

    // A submission without an id gets a fresh one.
    let fresh = server.post_json("/v1/tasks", &json!({ "workflow": "quick" })).await;
    assert_eq!(fresh.status, StatusCode::CREATED, "{}", fresh.text);
    assert_ne!(fresh.body["id"], "order-1");
    assert_eq!(fresh.body["input"], json!({}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_task_waits_pending_until_its_start_time_then_runs() {
    let server = start(Options::default()).await;
    let reply = server.post_json("/v1/tasks", &json!({ "workflow": "quick", "id": "later", "delay": "400ms" })).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    let (created, not_before) = (reply.body["created_at"].as_i64().unwrap(), reply.body["not_before"].as_i64().unwrap());
    assert!(not_before >= created + 400, "it says when it starts: {}", reply.text);
    assert_eq!(reply.body["state"], "pending");
    let done = server.wait_terminal("later").await;
    assert_eq!(done["state"], "processed");
    let history = server.get("/v1/tasks/later/history").await.body;
    let claimed = history.as_array().unwrap().iter().find(|event| event["kind"] == "claimed").unwrap();
    assert!(claimed["at"].as_i64().unwrap() >= not_before, "claimed no earlier than its start: {history}");

    let at = server.post_json("/v1/tasks", &json!({ "workflow": "quick", "id": "at", "start_at": "2999-01-01T00:00:00+01:00" })).await;
    assert_eq!(at.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", at.text);
    assert!(at.reason().starts_with("start_at: must be at most"), "{}", at.text);
    for (body, field) in [
        (json!({ "workflow": "quick", "start_at": "tomorrow" }), "start_at: expected an RFC 3339 time"),
        (json!({ "workflow": "quick", "delay": "soon" }), "delay: expected a duration"),
        (json!({ "workflow": "quick", "delay": "400days" }), "delay: must be at most"),
        (json!({ "workflow": "quick", "delay": "1s", "start_at": "2026-12-01T02:00:00Z" }), "start_at and delay: give one"),
    ] {
        let reply = server.post_json("/v1/tasks", &body).await;
        reply.assert_error(422, "invalid_body");
        assert!(reply.reason().starts_with(field), "{field}: {}", reply.text);
    }
    assert_eq!(server.get("/v1/tasks").await.body.as_array().unwrap().len(), 1, "refused submissions created nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_are_listed_newest_first_and_filtered() {
    let server = start(Options::default()).await;
    server.submit("quick", "a").await;
    server.wait_terminal("a").await;
    server.submit("slow", "b").await;
    server.wait_for("b", |state| state == "processing").await;

    let ids = |reply: &common::Reply| -> Vec<String> {
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        reply.body.as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids(&server.get("/v1/tasks").await), ["b", "a"]);
    assert_eq!(ids(&server.get("/v1/tasks?limit=1").await), ["b"]);
    assert_eq!(ids(&server.get("/v1/tasks?state=processed").await), ["a"]);
    assert_eq!(ids(&server.get("/v1/tasks?workflow=slow").await), ["b"]);
    assert_eq!(ids(&server.get(&format!("/v1/tasks?locked_by={}", common::INSTANCE)).await), ["b"]);
    assert!(ids(&server.get("/v1/tasks?state=cancelled").await).is_empty());
    let listed = server.get("/v1/tasks?workflow=slow").await;
    assert_eq!(listed.body[0]["locked_by"], common::INSTANCE);
    assert!(listed.body[0].get("input").is_none(), "listings leave out input and output");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_are_paged_with_before_and_an_unknown_before_is_400() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    for id in ["t1", "t2", "t3", "t4", "t5"] {
        server.submit(if id == "t4" { "slow" } else { "quick" }, id).await;
    }
    let ids = |reply: &common::Reply| -> Vec<String> {
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        reply.body.as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect()
    };
    let mut pages = Vec::new();
    let mut path = "/v1/tasks?limit=2".to_owned();
    loop {
        let page = ids(&server.get(&path).await);
        let Some(last) = page.last() else { break };
        path = format!("/v1/tasks?limit=2&before={last}");
        pages.push(page);
    }
    assert_eq!(pages, [vec!["t5", "t4"], vec!["t3", "t2"], vec!["t1"]], "pages newest first, then an empty page");
    assert_eq!(ids(&server.get("/v1/tasks?workflow=quick&state=pending&limit=1&before=t4").await), ["t3"]);
    assert_eq!(ids(&server.get("/v1/tasks?workflow=slow&before=t4").await), Vec::<String>::new(), "an existing before, nothing older");

    let reason = server.get("/v1/tasks?before=nope").await.assert_error(400, "invalid_query");
    assert!(reason.contains("before") && reason.contains("nope"), "{reason}");
    server.get("/v1/tasks?before=%09").await.assert_error(400, "invalid_query");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_counts_list_every_state_with_a_total() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    let zeros = json!({ "pending": 0, "processing": 0, "processed": 0, "error": 0, "compensating": 0, "compensated": 0, "cancelled": 0 });
    let counts = server.get("/v1/tasks/counts").await;
    assert_eq!(counts.status, StatusCode::OK, "{}", counts.text);
    assert_eq!(counts.body, json!({ "counts": zeros, "total": 0 }));
    for (workflow, id) in [("quick", "q1"), ("quick", "q2"), ("slow", "s1")] {
        server.submit(workflow, id).await;
    }
    assert_eq!(server.post("/v1/tasks/q1/cancel").await.status, StatusCode::OK);
    let mut all = zeros.clone();
    all["pending"] = json!(2);
    all["cancelled"] = json!(1);
    assert_eq!(server.get("/v1/tasks/counts").await.body, json!({ "counts": all, "total": 3 }));
    let mut slow = zeros.clone();
    slow["pending"] = json!(1);
    assert_eq!(server.get("/v1/tasks/counts?workflow=slow").await.body, json!({ "counts": slow, "total": 1 }));
    assert_eq!(server.get("/v1/tasks/counts?workflow=other").await.body, json!({ "counts": zeros, "total": 0 }));
    server.get("/v1/tasks/counts?workflow=a%20b").await.assert_error(400, "invalid_query");
    server.get("/v1/tasks/counts?state=pending").await.assert_error(400, "invalid_query");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_keeps_its_priority_and_a_bad_one_is_refused() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    let reply = server.post_json("/v1/tasks", &json!({ "workflow": "quick", "id": "urgent", "priority": -100 })).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    assert_eq!(reply.body["priority"], -100);
    assert_eq!(server.get("/v1/tasks/urgent").await.body["priority"], -100, "the task view shows it");
    assert_eq!(server.get("/v1/tasks?id_prefix=urg").await.body[0]["priority"], -100, "summaries show it");
    server.submit("quick", "normal").await;
    assert_eq!(server.get("/v1/tasks/normal").await.body["priority"], 0, "the workflow's default");
    for priority in [json!(101), json!(-101), json!(i64::MAX), json!(1.5), json!("high")] {
        let reply = server.post_json("/v1/tasks", &json!({ "workflow": "quick", "priority": priority })).await;
        let reason = reply.assert_error(422, "invalid_body");
        assert!(reason.contains("priority"), "{priority}: {reason}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submissions_past_the_pending_bound_get_429_with_retry_after() {
    let limits = rota_api::Limits { pending_max: Some(2), ..Options::default().limits };
    let server = start(Options { engine: false, limits, ..Options::default() }).await;
    server.submit("quick", "first").await;
    server.submit("quick", "second").await;
    let refused = server.post_json("/v1/tasks", &json!({ "workflow": "quick", "id": "third" })).await;
    let reason = refused.assert_error(429, "backlog_full");
    assert!(reason.contains("2 tasks are waiting to start, at the bound of 2 (--pending-max)"), "{reason}");
    assert_eq!(refused.headers.get("retry-after").map(|v| v.to_str().unwrap()), Some("1"), "the recount is a second away at most");
    server.get("/v1/tasks/third").await.assert_error(404, "not_found");
    // Other requests go on: only submissions are bounded.
    assert_eq!(server.post("/v1/tasks/first/cancel").await.status, StatusCode::OK);
    assert_eq!(server.get("/v1/tasks/counts").await.body["counts"]["pending"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_are_searched_by_tags_times_and_id_prefix_and_counted() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    for (id, customer, region) in [("o-1", "c1", "eu"), ("o-2", "c2", "eu"), ("o-3", "c1", "us"), ("x-4", "c1", "eu")] {
        let body = json!({ "workflow": "quick", "id": id, "tags": { "customer": customer, "region": region } });
        let reply = server.post_json("/v1/tasks", &body).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
        assert_eq!(reply.body["tags"], json!({ "customer": customer, "region": region }));
    }
    server.submit("quick", "untagged").await;
    let ids = |reply: &common::Reply| -> Vec<String> {
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        reply.body.as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids(&server.get("/v1/tasks?tag=customer%3Dc1").await), ["x-4", "o-3", "o-1"]);
    assert_eq!(ids(&server.get("/v1/tasks?tag=customer%3Dc1&tag=region%3Deu").await), ["x-4", "o-1"], "every tag given");
    assert_eq!(ids(&server.get("/v1/tasks?tag=customer%3Dc1&id_prefix=o-").await), ["o-3", "o-1"]);
    assert_eq!(ids(&server.get("/v1/tasks?tag=customer%3Dc1&limit=1&before=o-3").await), ["o-1"], "paged");
    let listed = server.get("/v1/tasks?id_prefix=o-2").await;
    assert_eq!(listed.body[0]["tags"], json!({ "customer": "c2", "region": "eu" }), "summaries show the tags");
    assert_eq!(ids(&server.get("/v1/tasks?created_after=2000-01-01T00:00:00Z&created_before=2000-01-02T00:00:00Z").await).len(), 0);
    assert_eq!(ids(&server.get("/v1/tasks?created_after=2000-01-01T00:00:00Z").await).len(), 5);
    assert_eq!(ids(&server.get("/v1/tasks?ended_after=2000-01-01T00:00:00Z").await).len(), 0, "none has ended");
    assert_eq!(server.post("/v1/tasks/o-3/cancel").await.status, StatusCode::OK);
    assert_eq!(ids(&server.get("/v1/tasks?ended_after=2000-01-01T00:00:00Z&tag=customer%3Dc1").await), ["o-3"]);

    let counts = server.get("/v1/tasks/counts?tag=customer%3Dc1").await;
    assert_eq!(counts.status, StatusCode::OK, "{}", counts.text);
    assert_eq!(
        (&counts.body["counts"]["pending"], &counts.body["counts"]["cancelled"], &counts.body["total"]),
        (&json!(2), &json!(1), &json!(3))
    );
    assert_eq!(server.get("/v1/tasks/counts?id_prefix=x-&workflow=quick").await.body["total"], 1);

    for (query, named) in [
        ("tag=nokey", "tag"),
        ("tag=bad%20key%3D1", "tag"),
        ("created_after=yesterday", "created_after"),
        ("ended_before=2026-13-01T00:00:00Z", "ended_before"),
        ("id_prefix=", "id_prefix"),
    ] {
        let reason = server.get(&format!("/v1/tasks?{query}")).await.assert_error(400, "invalid_query");
        assert!(reason.contains(named), "{query}: {reason}");
        server.get(&format!("/v1/tasks/counts?{query}")).await.assert_error(400, "invalid_query");
    }
    let too_many: String = (0..17).map(|i| format!("tag=k{i}%3Dv&")).collect();
    server.get(&format!("/v1/tasks?{too_many}")).await.assert_error(400, "invalid_query");
    for tags in [json!({ "bad key": "x" }), json!({ "k": "v".repeat(257) }), json!({ "k": 1 }), json!(["k=v"])] {
        let reply = server.post_json("/v1/tasks", &json!({ "workflow": "quick", "tags": tags })).await;
        assert!(reply.status.is_client_error(), "tags {tags}: {}", reply.text);
        assert!(reply.text.contains("tag"), "the error names the tags: {}", reply.text);
    }
}

/// `order`, whose `ship` step runs a `parcel` child of one quick step.
fn with_children() -> Vec<rota_workflow::Workflow> {
    use rota_workflow::{AgentCatalog, StepDef, Workflow};
    let parcel = Workflow::builder("parcel", 1)
        .step(StepDef::new("book", "delay").with_input(json!({ "ms": 1 })))
        .build(&AgentCatalog::builtin())
        .unwrap();
    let order = Workflow::builder("order", 1)
        .step(StepDef::run_workflow("ship", "parcel", Some(1)).timeout(std::time::Duration::from_secs(30)))
        .build(&AgentCatalog::builtin())
        .unwrap();
    vec![parcel, order]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_children_are_listed_counted_and_selected_by_parent() {
    let server = start(Options { workflows: with_children(), ..Options::default() }).await;
    for id in ["p-1", "p-2"] {
        server.submit("order", id).await;
    }
    for id in ["p-1", "p-2"] {
        server.wait_until(id, |task| task["state"] == "processed").await;
    }
    let ids = |reply: &common::Reply| -> Vec<String> {
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        reply.body.as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids(&server.get("/v1/tasks?parent=p-1").await), ["p-1/ship#1"]);
    assert_eq!(ids(&server.get("/v1/tasks?parent=p-2&workflow=parcel").await), ["p-2/ship#1"]);
    assert!(ids(&server.get("/v1/tasks?parent=p-1%2Fship%231").await).is_empty(), "a child has no children");
    let counts = server.get("/v1/tasks/counts?parent=p-1").await;
    assert_eq!((&counts.body["counts"]["processed"], &counts.body["total"]), (&json!(1), &json!(1)), "{}", counts.text);
    let reason = server.get("/v1/tasks?parent=%20p").await.assert_error(400, "invalid_query");
    assert!(reason.contains("parent"), "{reason}");
    server.get("/v1/tasks/counts?parent=").await.assert_error(400, "invalid_query");

    let batch = server.post_json("/v1/batches", &json!({ "action": "cancel", "filter": { "parent": "p-1" } })).await;
    assert_eq!(batch.status, StatusCode::CREATED, "{}", batch.text);
    assert_eq!(batch.body["filter"]["parent"], "p-1", "the batch shows what it selects: {}", batch.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_cancels_every_task_its_filter_selects_and_reports_its_progress() {
    let server = start(Options::default()).await;
    for n in 0..5 {
        let body = json!({ "workflow": "slow", "id": format!("b-{n}"), "tags": { "batch": "one" } });
        assert_eq!(server.post_json("/v1/tasks", &body).await.status, StatusCode::CREATED);
    }
    server.submit("slow", "other").await;
    let created =
        server.post_json("/v1/batches", &json!({ "action": "cancel", "filter": { "tag": ["batch=one"] }, "reason": "test" })).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    assert_eq!((&created.body["total"], &created.body["state"], &created.body["reason"]), (&json!(5), &json!("running"), &json!("test")));
    assert_eq!(created.body["filter"]["tag"], json!(["batch=one"]));
    assert!(created.body["filter"]["created_before"].is_string(), "closed at its creation: {}", created.body);
    let id = created.body["id"].as_str().unwrap().to_owned();
    // The test engine's Supervisor leader runs it.
    let started = std::time::Instant::now();
    let done = loop {
        let batch = server.get(&format!("/v1/batches/{id}")).await;
        assert_eq!(batch.status, StatusCode::OK, "{}", batch.text);
        if batch.body["state"] == "done" {
            break batch.body;
        }
        assert!(started.elapsed() < common::WAIT_MAX, "the batch did not finish: {}", batch.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!((&done["done"], &done["skipped"], &done["failed"]), (&json!(5), &json!(0), &json!(0)), "{done}");
    for n in 0..5 {
        assert_eq!(server.get(&format!("/v1/tasks/b-{n}")).await.body["state"], "cancelled");
    }
    assert_ne!(server.get("/v1/tasks/other").await.body["state"], "cancelled", "a task the filter does not select");
    let listed = server.get("/v1/batches").await;
    assert_eq!(listed.body[0]["id"], json!(id));
    assert_eq!(server.post(&format!("/v1/batches/{id}/stop")).await.body["state"], "done", "a done batch stays done");

    for (body, named) in [
        (json!({ "action": "delete", "filter": { "state": "error" } }), "action"),
        (json!({ "action": "cancel" }), "filter"),
        (json!({ "action": "cancel", "filter": { "tag": ["nokey"] } }), "filter.tag"),
        (json!({ "action": "cancel", "filter": { "state": "sleepy" } }), "filter.state"),
        (json!({ "action": "cancel", "filter": { "created_after": "then" } }), "filter.created_after"),
        (json!({ "action": "cancel", "filter": { "state": "error" }, "reason": "x".repeat(1001) }), "reason"),
    ] {
        let reason = server.post_json("/v1/batches", &body).await.assert_error(422, "invalid_body");
        assert!(reason.starts_with(named), "{body}: {reason}");
    }
    server.get("/v1/batches/nope").await.assert_error(404, "not_found");
    server.post("/v1/batches/nope/stop").await.assert_error(404, "not_found");
}

/// A redrive batch sends back the dead letters of a queue its dead-letter
/// filter selects, and is listed with that filter; a redrive without a
/// queue, or with a task filter, and a cancel with a dead-letter filter,
/// are 422s naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_batch_sends_back_the_dead_letters_its_filter_selects() {
    let server = start(Options::default()).await;
    let jobs = QueueName::new("jobs").unwrap();
    for id in ["m-1", "m-2", "m-3"] {
        dead_letter_one(&server, &jobs, id).await;
    }
    let body = json!({ "action": "redrive", "dead_letters": { "queue": "jobs", "reason_contains": "poison m-2" }, "reason": "fixed" });
    let created = server.post_json("/v1/batches", &body).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    assert_eq!((&created.body["action"], &created.body["total"]), (&json!("redrive"), &json!(1)), "{}", created.text);
    assert_eq!(created.body["dead_letters"]["queue"], "jobs");
    assert_eq!(created.body["dead_letters"]["reason_contains"], "poison m-2");
    assert!(created.body["dead_letters"]["dead_lettered_before"].is_string(), "closed at its creation: {}", created.body);
    let id = created.body["id"].as_str().unwrap().to_owned();
    let started = std::time::Instant::now();
    let done = loop {
        let batch = server.get(&format!("/v1/batches/{id}")).await;
        if batch.body["state"] == "done" {
            break batch.body;
        }
        assert!(started.elapsed() < common::WAIT_MAX, "the batch did not finish: {}", batch.text);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!((&done["done"], &done["skipped"], &done["failed"]), (&json!(1), &json!(0), &json!(0)), "{done}");
    let left = server.get("/v1/queues/jobs/dead-letters").await;
    let left: Vec<&str> = left.body.as_array().unwrap().iter().map(|l| l["id"].as_str().unwrap()).collect();
    assert_eq!(left, ["m-1", "m-3"], "only m-2 went back");
    let listed = server.get("/v1/batches").await;
    assert_eq!((&listed.body[0]["id"], &listed.body[0]["dead_letters"]["queue"]), (&json!(id), &json!("jobs")), "{}", listed.text);

    for (body, named) in [
        (json!({ "action": "redrive" }), "dead_letters"),
        (json!({ "action": "redrive", "filter": { "state": "error" }, "dead_letters": { "queue": "jobs" } }), "filter"),
        (json!({ "action": "redrive", "dead_letters": { "queue": "has space" } }), "dead_letters.queue"),
        (json!({ "action": "redrive", "dead_letters": { "queue": "jobs", "reason_contains": "" } }), "dead_letters.reason_contains"),
        (
            json!({ "action": "redrive", "dead_letters": { "queue": "jobs", "dead_lettered_after": "then" } }),
            "dead_letters.dead_lettered_after",
        ),
        (
            json!({ "action": "redrive", "dead_letters": { "queue": "jobs", "size": 1 } }),
            "request body: Failed to deserialize the JSON body into the target type: dead_letters.size: unknown field",
        ),
        (json!({ "action": "cancel", "filter": { "state": "error" }, "dead_letters": { "queue": "jobs" } }), "dead_letters"),
    ] {
        let reason = server.post_json("/v1/batches", &body).await.assert_error(422, "invalid_body");
        assert!(reason.starts_with(named), "{body}: {reason}");
    }
    server
        .post_json("/v1/batches", &json!({ "action": "redrive", "dead_letters": { "queue": "nope" } }))
        .await
        .assert_error(404, "not_found");
}

/// Every operator action is listed by `GET /v1/audit`, newest first, with
/// the calling token's name and the reason: a task's cancel (from its
/// history) and a dead-letter purge and queue pause (from the audit
/// table); filters and paging; a bad filter is a 400 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_lists_operator_actions_with_the_tokens_name() {
    let token = rota_api::Token::new("oncall-token-0123456789", vec![rota_api::Scope::Admin]).unwrap().named("oncall").unwrap();
    let auth = rota_api::AuthConfig::tokens(vec![token]).unwrap();
    let mut server = start(Options { auth, engine: false, ..Options::default() }).await;
    server.token = Some("oncall-token-0123456789".to_owned());
    server.submit("slow", "au-1").await;
    let cancelled = server.post_json("/v1/tasks/au-1/cancel", &json!({ "reason": "customer asked" })).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{}", cancelled.text);
    let queue = rota_model::QueueName::new("orders").unwrap();
    server.store.create_queue(&queue, rota_store::QueueConfig::default()).await.unwrap();
    assert_eq!(server.post("/v1/queues/orders/dead-letters/purge").await.body["count"], json!(0));
    let long = server.post_json("/v1/queues/orders/pause", &json!({ "reason": "x".repeat(1001) })).await;
    assert!(long.assert_error(422, "invalid_body").starts_with("reason: is 1001 characters long"), "{}", long.text);
    assert_eq!(server.get("/v1/queues/orders").await.body["paused"], json!(false), "a refused pause pauses nothing");
    let paused = server.post_json("/v1/queues/orders/pause", &json!({ "reason": "the warehouse is closed" })).await;
    assert_eq!(paused.status, StatusCode::OK, "{}", paused.text);

    let listed = server.get("/v1/audit").await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    let rows: Vec<(&str, &str, &str)> = listed
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["target"].as_str().unwrap(), e["by"].as_str().unwrap()))
        .collect();
    // The caller as the history names it: the token's scope and name.
    let by = "api token with scope admin (oncall)";
    assert_eq!(rows, [("queue.pause", "orders", by), ("dlq.purge", "orders", by), ("task.cancel", "au-1", by)]);
    assert_eq!(listed.body[2]["reason"], json!("customer asked"));
    assert_eq!(listed.body[0]["reason"], json!("the warehouse is closed"), "an action on no task keeps its reason too");
    assert_eq!(listed.body[1]["reason"], Value::Null, "the body may be left out");
    assert_eq!(listed.body[1]["detail"], json!({ "purged": 0 }));

    let cancels = server.get("/v1/audit?action=task.cancel&by=api%20token%20with%20scope%20admin%20(oncall)").await;
    assert_eq!(cancels.body.as_array().unwrap().len(), 1, "{}", cancels.text);
    let first = server.get("/v1/audit?limit=1").await;
    let cursor = first.body[0]["cursor"].as_str().unwrap().to_owned();
    let next = server.get(&format!("/v1/audit?limit=1&after={cursor}")).await;
    assert_eq!(next.body[0]["action"], json!("dlq.purge"), "the next page starts after the cursor");
    assert_eq!(server.get("/v1/audit?since=2999-01-01T00:00:00Z").await.body, json!([]));

    for (query, named) in [("action=task.explode", "action"), ("after=yesterday", "after"), ("since=then", "since"), ("by=", "by")] {
        let reason = server.get(&format!("/v1/audit?{query}")).await.assert_error(400, "invalid_query");
        assert!(reason.contains(named), "{query}: {reason}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_show_their_heartbeats_and_the_supervisor_leader() {
    let server = start(Options::default()).await;
    let heartbeat = |instance: &str, stopped: bool| {
        json!({
            "instance": instance, "pid": 42, "roles": ["scheduler", "supervisor"], "agents": ["delay"],
            "workflows": [{ "name": "quick", "version": 1 }], "started_at": 1_000, "stopped": stopped,
        })
    };
    server.store.report_status(&format!("instance/{}", common::INSTANCE), &heartbeat(common::INSTANCE, false)).await.unwrap();
    server.store.report_status("instance/gone-1", &heartbeat("gone-1", true)).await.unwrap();
    // The test engine's Supervisor takes the lease on its first round.
    let started = std::time::Instant::now();
    let reply = loop {
        let reply = server.get("/v1/instances").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        if !reply.body["supervisor_leader"].is_null() {
            break reply;
        }
        assert!(started.elapsed() < common::WAIT_MAX, "no supervisor leader: {}", reply.text);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let leader = &reply.body["supervisor_leader"];
    assert_eq!(leader["holder"], common::INSTANCE);
    assert!(leader["until"].as_i64().unwrap() > 0 && leader["epoch"].as_u64().unwrap() >= 1, "{leader}");
    let instances = reply.body["instances"].as_array().unwrap();
    let names: Vec<&str> = instances.iter().map(|i| i["instance"].as_str().unwrap()).collect();
    let mut expected = vec!["gone-1", common::INSTANCE];
    expected.sort_unstable();
    assert_eq!(names, expected, "sorted by id");
    let live = instances.iter().find(|i| i["instance"] == common::INSTANCE).unwrap();
    assert_eq!(
        (&live["live"], &live["supervisor_leader"], &live["roles"], &live["agents"], &live["pid"], &live["started_at"]),
        (&json!(true), &json!(true), &json!(["scheduler", "supervisor"]), &json!(["delay"]), &json!(42), &json!(1_000))
    );
    assert_eq!(live["workflows"], json!([{ "name": "quick", "version": 1 }]));
    assert!(live["last_heartbeat"].as_i64().unwrap() > 1_000, "{live}");
    let gone = instances.iter().find(|i| i["instance"] == "gone-1").unwrap();
    assert_eq!((&gone["live"], &gone["stopped"], &gone["supervisor_leader"]), (&json!(false), &json!(true), &json!(false)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_counts_every_minute_of_the_window() {
    let server = start(Options::default()).await;
    server.submit("quick", "a-1").await;
    server.submit("broken", "a-2").await;
    server.wait_terminal("a-1").await;
    server.wait_terminal("a-2").await;

    let reply = server.get("/v1/activity?minutes=2").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let minutes = reply.body["minutes"].as_array().unwrap();
    assert_eq!(minutes.len(), 2);
    let start = |i: usize| minutes[i]["start"].as_i64().unwrap();
    assert_eq!((start(0) % 60_000, start(1) - start(0)), (0, 60_000), "whole minutes, oldest first");
    let sum = |field: &str| minutes.iter().map(|m| m[field].as_u64().unwrap()).sum::<u64>();
    assert_eq!((sum("received"), sum("processed"), sum("errors"), sum("steps_completed")), (2, 1, 1, 2), "{}", reply.text);
    let latencies: Vec<f64> = minutes.iter().filter_map(|m| m["step_latency_p99_ms"].as_f64()).collect();
    assert!(!latencies.is_empty() && latencies.iter().all(|ms| *ms >= 10.0), "the delay steps take 10 ms: {}", reply.text);
    assert_eq!(reply.body["complete"], true);
    assert!(reply.body["events_read"].as_u64().unwrap() >= 8, "{}", reply.text);

    assert_eq!(server.get("/v1/activity").await.body["minutes"].as_array().unwrap().len(), 15, "15 minutes by default");
    assert_eq!(server.get("/v1/activity?minutes=60").await.body["minutes"].as_array().unwrap().len(), 60);
    for bad in ["0", "61", "x"] {
        server.get(&format!("/v1/activity?minutes={bad}")).await.assert_error(400, "invalid_query");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_says_its_server_time() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    server.submit("quick", "t1").await;
    for (path, status) in [("/v1/tasks", 200), ("/v1/tasks/t1", 200), ("/v1/tasks?limit=0", 400), ("/v1/nothing", 404), ("/healthz", 200)] {
        let reply = server.get(path).await;
        assert_eq!(reply.status.as_u16(), status, "{path}: {}", reply.text);
        let timing = reply.headers.get("server-timing").unwrap_or_else(|| panic!("{path}: no Server-Timing")).to_str().unwrap();
        let ms = timing.strip_prefix("app;dur=").unwrap_or_else(|| panic!("{path}: {timing}"));
        assert!(ms.split_once('.').is_some_and(|(_, decimals)| decimals.len() == 1), "{path}: one decimal: {timing}");
        assert!(ms.parse::<f64>().is_ok_and(|ms| ms >= 0.0), "{path}: {timing}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_submissions_are_4xx_naming_the_problem() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    let raw = |body: &'static str| server.request(Method::POST, "/v1/tasks").header("content-type", "application/json").body(body);

    let reason = server.send(raw("{\"workflow\": ")).await.assert_error(400, "malformed_json");
    assert!(reason.starts_with("request body:"), "{reason}");
    server.send(server.request(Method::POST, "/v1/tasks").body("{}")).await.assert_error(415, "unsupported_media_type");
    let reason = server.send(raw("{\"workflow\": \"quick\", \"colour\": 1}")).await.assert_error(422, "invalid_body");
    assert!(reason.contains("colour"), "{reason}");
    server.send(raw("{\"input\": {}}")).await.assert_error(422, "invalid_body");
    server.send(raw("[1, 2]")).await.assert_error(422, "invalid_body");
    let reason = server.post_json("/v1/tasks", &json!({ "workflow": "no such" })).await.assert_error(422, "invalid_body");
    assert!(reason.starts_with("workflow:"), "{reason}");
    let reason = server.post_json("/v1/tasks", &json!({ "workflow": "nope" })).await.assert_error(404, "unknown_workflow");
    assert!(reason.contains("nope"), "{reason}");
    server.post_json("/v1/tasks", &json!({ "workflow": "quick", "version": 7 })).await.assert_error(404, "unknown_workflow");
    let reason = server.post_json("/v1/tasks", &json!({ "workflow": "quick", "version": 0 })).await.assert_error(422, "invalid_body");
    assert!(reason.starts_with("version:"), "{reason}");
    server.post_json("/v1/tasks", &json!({ "workflow": "quick", "version": -1 })).await.assert_error(422, "invalid_body");
    server.post_json("/v1/tasks", &json!({ "workflow": "quick", "version": 1.5 })).await.assert_error(422, "invalid_body");
    server.post_json("/v1/tasks", &json!({ "workflow": "quick", "version": 4294967296_u64 })).await.assert_error(422, "invalid_body");
    let reason = server.post_json("/v1/tasks", &json!({ "workflow": "quick", "id": "tab\there" })).await.assert_error(422, "invalid_body");
    assert!(reason.starts_with("id:"), "{reason}");
    server.post_json("/v1/tasks", &json!({ "workflow": "quick", "id": "x".repeat(201) })).await.assert_error(422, "invalid_body");
    let reason =
        server.post_json("/v1/tasks", &json!({ "workflow": "quick", "reply_queue": "a b" })).await.assert_error(422, "invalid_body");
    assert!(reason.starts_with("reply_queue:"), "{reason}");
    // An input past the client's bound (under the body limit of 1 MiB).
    let big = json!({ "workflow": "quick", "id": "big", "input": { "blob": "x".repeat(rota_engine::client::INPUT_BYTES_MAX_DEFAULT) } });
    let reason = server.post_json("/v1/tasks", &big).await.assert_error(422, "invalid_body");
    assert!(reason.starts_with("input: is ") && reason.contains("(input_bytes_max)"), "{reason}");
    let reason =
        server.post_json("/v1/tasks", &json!({ "workflow": "quick", "reply_queue": "agent.x" })).await.assert_error(422, "invalid_body");
    assert!(reason.starts_with("reply_queue: \"agent.x\" is reserved"), "{reason}");
    assert!(server.get("/v1/tasks").await.body.as_array().unwrap().is_empty(), "nothing was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_submitted_with_a_reply_queue_sends_its_status_events_there() {
    let server = start(Options::default()).await;
    let queue = QueueName::new("shop.replies").unwrap();
    let created = server.post_json("/v1/tasks", &json!({ "workflow": "quick", "id": "rq-1", "reply_queue": "shop.replies" })).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    assert_eq!(created.body["reply_queue"], "shop.replies");
    assert_eq!(server.wait_terminal("rq-1").await["state"], "processed");
    let mut events = Vec::new();
    loop {
        let batch = server.store.receive(&queue, Receive::up_to(10)).await.unwrap();
        let Some(delivery) = batch.into_iter().next() else { break };
        let body: Value = serde_json::from_str(delivery.body.get()).unwrap();
        assert_eq!(body["correlation_id"], "rq-1");
        events.push(body["event"].as_str().unwrap().to_owned());
        server.store.complete(&queue, delivery.lease_token).await.unwrap();
    }
    assert_eq!(events, ["received", "step_completed", "step_completed", "processed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_paths_and_queries_are_400_and_missing_things_404() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    let reason = server.get("/v1/tasks/nope").await.assert_error(404, "not_found");
    assert!(reason.contains("task nope"), "{reason}");
    server.get("/v1/tasks/nope/history").await.assert_error(404, "not_found");
    server.get("/v1/tasks/nope/events").await.assert_error(404, "not_found");
    server.post("/v1/tasks/nope/cancel").await.assert_error(404, "not_found");
    server.post("/v1/tasks/nope/resubmit").await.assert_error(404, "not_found");
    server.get("/v1/tasks/%20padded").await.assert_error(400, "invalid_path");
    server.get("/v1/tasks/%FF").await.assert_error(400, "invalid_path");

    let reason = server.get("/v1/tasks?state=bogus").await.assert_error(400, "invalid_query");
    assert!(reason.contains("state") && reason.contains("bogus"), "{reason}");
    let reason = server.get("/v1/tasks?limit=0").await.assert_error(400, "invalid_query");
    assert!(reason.contains("limit: must be between 1 and 1000, got 0"), "{reason}");
    server.get("/v1/tasks?limit=1001").await.assert_error(400, "invalid_query");
    server.get("/v1/tasks?limit=99999999999").await.assert_error(400, "invalid_query");
    server.get("/v1/tasks?limit=ten").await.assert_error(400, "invalid_query");
    server.get("/v1/tasks?workflow=a%20b").await.assert_error(400, "invalid_query");
    server.get("/v1/tasks?locked_by=%09").await.assert_error(400, "invalid_query");
    server.get("/v1/tasks?colour=red").await.assert_error(400, "invalid_query");
    server.get("/v1/alerts?limit=0").await.assert_error(400, "invalid_query");
    server.get("/v1/events?kind=nope").await.assert_error(400, "invalid_query");
    server.get("/v1/events?after=-1").await.assert_error(400, "invalid_query");
    server.get("/v1/events?workflow=a%20b").await.assert_error(400, "invalid_query");
    let bad_header = server.request(Method::GET, "/v1/events").header("last-event-id", "abc");
    server.send(bad_header).await.assert_error(400, "invalid_header");

    server.get("/v1/nothing-here").await.assert_error(404, "no_such_route");
    server.delete("/v1/tasks").await.assert_error(405, "method_not_allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_task_raises_an_alert_and_can_be_resubmitted_whole_or_by_step() {
    let server = start(Options::default()).await;
    server.submit("broken", "b-1").await;
    let failed = server.wait_terminal("b-1").await;
    assert_eq!(failed["state"], "error");
    assert!(failed["steps"][0]["last_error"].as_str().unwrap().contains("input.ms"), "{failed}");

    let alerts = server.get("/v1/alerts").await;
    assert_eq!(alerts.status, StatusCode::OK);
    assert_eq!(alerts.body[0]["task_id"], "b-1");
    assert_eq!(alerts.body[0]["step"], "only", "the alert names the step that failed: {}", alerts.text);
    assert!(alerts.body[0]["reason"].as_str().unwrap().contains("input.ms"), "{}", alerts.text);

    let reason = server.post("/v1/tasks/b-1/steps/nope/resubmit").await.assert_error(404, "not_found");
    assert!(reason.contains("its steps: only"), "{reason}");
    server.post("/v1/tasks/b-1/steps/a%20b/resubmit").await.assert_error(400, "invalid_path");

    let resubmitted = server.post_json("/v1/tasks/b-1/resubmit", &json!({ "reason": "try once more" })).await;
    assert_eq!(resubmitted.status, StatusCode::OK, "{}", resubmitted.text);
    assert_ne!(resubmitted.body["state"], "error", "a resubmitted task is pending again");
    server.wait_for("b-1", |state| state == "error").await;
    let resubmitted = server.post_json("/v1/tasks/b-1/steps/only/resubmit", &json!({ "reason": "and that step" })).await;
    assert_eq!(resubmitted.status, StatusCode::OK, "{}", resubmitted.text);
    server.wait_for("b-1", |state| state == "error").await;
    let history = server.get("/v1/tasks/b-1/history").await;
    let resubmits: Vec<(Value, Value)> = history
        .body
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "resubmitted")
        .map(|e| (e["detail"]["by"].clone(), e["detail"]["reason"].clone()))
        .collect();
    let by = json!("api without authentication");
    assert_eq!(resubmits, [(by.clone(), json!("try once more")), (by, json!("and that step"))], "who and why, each time");
    let long = server.post_json("/v1/tasks/b-1/resubmit", &json!({ "reason": "x".repeat(1001) })).await;
    assert!(long.assert_error(422, "invalid_body").starts_with("reason: is 1001 characters long"), "{}", long.text);

    // A task that did not fail cannot be resubmitted, nor a finished one cancelled.
    server.submit("quick", "q-1").await;
    server.wait_terminal("q-1").await;
    let reason = server.post("/v1/tasks/q-1/resubmit").await.assert_error(409, "refused");
    assert!(reason.contains("q-1"), "{reason}");
    server.post("/v1/tasks/q-1/cancel").await.assert_error(409, "refused");
}

/// `first` sleeps as long as the input says, `second` as long as `first`
/// slept: an input that is not a number fails `first` for good.
fn sleepy() -> rota_workflow::Workflow {
    use rota_workflow::{AgentCatalog, StepDef, Workflow};
    Workflow::builder("sleepy", 1)
        .step(StepDef::new("first", "delay").with_input(json!({ "ms": "{{ input.ms }}" })))
        .step(StepDef::new("second", "delay").with_input(json!({ "ms": "{{ steps.first.output.slept_ms }}" })))
        .build(&AgentCatalog::builtin())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_is_resubmitted_with_a_new_input() {
    let server = start(Options { workflows: vec![sleepy()], ..Options::default() }).await;
    let submitted = server.post_json("/v1/tasks", &json!({ "workflow": "sleepy", "id": "z-1", "input": { "ms": "soon" } })).await;
    assert_eq!(submitted.status, StatusCode::CREATED, "{}", submitted.text);
    assert_eq!(server.wait_terminal("z-1").await["state"], "error");

    // A body that is not a resubmit request is refused and changes nothing.
    server.post_json("/v1/tasks/z-1/steps/first/resubmit", &json!({ "inputs": {} })).await.assert_error(422, "invalid_body");
    let not_json = server.send(server.request(Method::POST, "/v1/tasks/z-1/steps/first/resubmit").body("{}")).await;
    assert_eq!(not_json.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{}", not_json.text);
    assert_eq!(server.get("/v1/tasks/z-1").await.body["state"], "error");

    let resubmitted = server.post_json("/v1/tasks/z-1/steps/first/resubmit", &json!({ "input": { "ms": 5 } })).await;
    assert_eq!(resubmitted.status, StatusCode::OK, "{}", resubmitted.text);
    assert_eq!(resubmitted.body["input"], json!({ "ms": 5 }));
    let done = server.wait_terminal("z-1").await;
    assert_eq!(done["state"], "processed", "{done}");
    assert_eq!(done["output"]["second"], json!({ "slept_ms": 5 }), "the later step saw the new input through the first's output");
    let history = server.get("/v1/tasks/z-1/history").await.body;
    let resubmit = history.as_array().unwrap().iter().find(|e| e["kind"] == "resubmitted").expect("recorded");
    assert_eq!(resubmit["detail"]["input"], json!({ "old": { "ms": "soon" }, "new": { "ms": 5 } }));
    assert_eq!(resubmit["detail"]["by"], "api without authentication");
    assert_eq!(resubmit["detail"]["steps"], json!(["first", "second"]));

    // A finished task is refused, and keeps its input.
    let reason =
        server.post_json("/v1/tasks/z-1/steps/first/resubmit", &json!({ "input": { "ms": 1 } })).await.assert_error(409, "refused");
    assert!(reason.contains("z-1"), "{reason}");
    assert_eq!(server.get("/v1/tasks/z-1").await.body["input"], json!({ "ms": 5 }));
    // An empty body, `null` or `{}` is the resubmit without a new input.
    for body in [json!({}), json!(null)] {
        server.post_json("/v1/tasks/z-1/steps/first/resubmit", &body).await.assert_error(409, "refused");
    }
    let bodiless =
        server.send(server.request(Method::POST, "/v1/tasks/z-1/steps/first/resubmit").header("content-type", "application/json")).await;
    bodiless.assert_error(409, "refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_task_is_cancelled() {
    let server = start(Options::default()).await;
    server.submit("slow", "s-1").await;
    let running = server.wait_until("s-1", |task| task["steps"][0]["state"] == "running").await;
    assert_eq!(running["steps"][0]["owner"], common::INSTANCE, "the holder owns a step in flight: {running}");
    let long = server.post_json("/v1/tasks/s-1/cancel", &json!({ "reason": "x".repeat(1001) })).await;
    assert!(long.assert_error(422, "invalid_body").starts_with("reason: is 1001 characters long"), "{}", long.text);
    server.post_json("/v1/tasks/s-1/cancel", &json!({ "why": "typo" })).await.assert_error(422, "invalid_body");
    let cancelled = server.post_json("/v1/tasks/s-1/cancel", &json!({ "reason": "the customer asked" })).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{}", cancelled.text);
    assert_eq!(cancelled.body, json!({ "id": "s-1", "state": "cancelled" }));
    let task = server.get("/v1/tasks/s-1").await.body;
    assert_eq!(task["state"], "cancelled");
    let step = &task["steps"][0];
    assert_eq!(
        (&step["state"], &step["last_error"], &step["complete_by"]),
        (&json!("failed"), &json!("attempt 1 was abandoned: its task was cancelled"), &Value::Null),
        "nothing is left in flight: {task}"
    );
    let history = server.get("/v1/tasks/s-1/history").await.body;
    let event = history.as_array().unwrap().iter().find(|e| e["kind"] == "cancelled").unwrap().clone();
    assert_eq!(event["detail"], json!({ "compensate": false, "by": "api without authentication", "reason": "the customer asked" }));
    server.post("/v1/tasks/s-1/cancel").await.assert_error(409, "refused");
}

/// `hold` (1 s) then `next`: a pause while `hold` runs stops before `next`.
fn held() -> rota_workflow::Workflow {
    use rota_workflow::{AgentCatalog, StepDef, Workflow};
    Workflow::builder("held", 1)
        .step(StepDef::new("hold", "delay").with_input(json!({ "ms": 1000 })))
        .step(StepDef::new("next", "delay").with_input(json!({ "ms": 10 })))
        .build(&AgentCatalog::builtin())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_task_starts_no_new_step_until_resumed() {
    let server = start(Options { workflows: vec![held()], ..Options::default() }).await;
    server.submit("held", "h-1").await;
    server.wait_until("h-1", |task| task["steps"][0]["state"] == "running").await;
    let paused = server.post_json("/v1/tasks/h-1/pause", &json!({ "reason": "the payment service is down" })).await;
    assert_eq!(paused.status, StatusCode::OK, "{}", paused.text);
    assert_eq!(paused.body["paused"], true, "{}", paused.text);
    let given_back = server.wait_until("h-1", |task| task["steps"][0]["state"] == "completed" && task["locked_by"].is_null()).await;
    assert_eq!((given_back["state"].as_str(), given_back["paused"].as_bool()), (Some("pending"), Some(true)), "{given_back}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let still = server.get("/v1/tasks/h-1").await.body;
    assert_eq!((still["state"].as_str(), still["steps"][1]["state"].as_str()), (Some("pending"), Some("not_started")), "{still}");
    let listed = server.get("/v1/tasks").await.body;
    assert_eq!(listed[0]["paused"], true, "listings show it: {listed}");
    let again = server.post("/v1/tasks/h-1/pause").await;
    assert_eq!(again.assert_error(409, "refused"), "pause: task h-1: cannot pause a task that is paused");

    let resumed = server.post("/v1/tasks/h-1/resume").await;
    assert_eq!(resumed.status, StatusCode::OK, "a resume needs no body: {}", resumed.text);
    assert_eq!(resumed.body["paused"], false);
    assert_eq!(server.wait_terminal("h-1").await["state"], "processed");
    let history = server.get("/v1/tasks/h-1/history").await.body;
    let of = |kind: &str| history.as_array().unwrap().iter().find(|e| e["kind"] == kind).unwrap()["detail"].clone();
    assert_eq!(of("paused"), json!({ "by": "api without authentication", "reason": "the payment service is down" }));
    assert_eq!(of("resumed"), json!({ "by": "api without authentication", "reason": null }));

    // Refusals.
    server.post("/v1/tasks/nope/pause").await.assert_error(404, "not_found");
    server.post("/v1/tasks/h-1/resume").await.assert_error(409, "refused");
    let finished = server.post("/v1/tasks/h-1/pause").await;
    assert_eq!(finished.assert_error(409, "refused"), "pause: task h-1: task is processed, which is terminal");
    let long = server.post_json("/v1/tasks/h-1/pause", &json!({ "reason": "x".repeat(1001) })).await;
    assert!(long.assert_error(422, "invalid_body").starts_with("reason: is 1001 characters long"), "{}", long.text);
    server.post_json("/v1/tasks/h-1/pause", &json!({ "why": "typo" })).await.assert_error(422, "invalid_body");
    let malformed = server.request(Method::POST, "/v1/tasks/h-1/pause").header("content-type", "application/json").body("{");
    server.send(malformed).await.assert_error(400, "malformed_json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_workflows_tasks_wait_until_it_is_resumed() {
    let server = start(Options { workflows: vec![held()], ..Options::default() }).await;
    let paused = server.post_json("/v1/workflows/held/pause", &json!({ "reason": "the payment service is down" })).await;
    assert_eq!(paused.status, StatusCode::OK, "{}", paused.text);
    let at = paused.body["at"].as_i64().expect("at");
    assert_eq!(
        paused.body,
        json!({ "workflow": "held", "paused": true, "by": "api without authentication", "reason": "the payment service is down", "at": at })
    );
    let listed = server.get("/v1/workflows").await.body;
    let held = listed.as_array().unwrap().iter().find(|w| w["name"] == "held").unwrap().clone();
    assert_eq!((held["paused"].as_bool(), held["pause"]["reason"].as_str()), (Some(true), Some("the payment service is down")), "{held}");
    assert_eq!(server.get("/v1/workflows/held").await.body["paused"], true);

    server.submit("held", "wp-1").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiting = server.get("/v1/tasks/wp-1").await.body;
    assert_eq!((waiting["state"].as_str(), waiting["workflow_paused"].as_bool()), (Some("pending"), Some(true)), "{waiting}");
    assert!(waiting["locked_by"].is_null(), "{waiting}");
    let again = server.post("/v1/workflows/held/pause").await;
    assert_eq!(again.assert_error(409, "refused"), "pause: workflow held is paused already");

    let resumed = server.post("/v1/workflows/held/resume").await;
    assert_eq!(resumed.status, StatusCode::OK, "a resume needs no body: {}", resumed.text);
    assert_eq!((resumed.body["paused"].as_bool(), resumed.body["reason"].is_null()), (Some(false), true), "{}", resumed.text);
    assert_eq!(server.wait_terminal("wp-1").await["state"], "processed");
    assert_eq!(server.get("/v1/tasks/wp-1").await.body["workflow_paused"], false);

    // Refusals.
    server.post("/v1/workflows/held/resume").await.assert_error(409, "refused");
    server.post("/v1/workflows/nope/pause").await.assert_error(404, "unknown_workflow");
    let long = server.post_json("/v1/workflows/held/pause", &json!({ "reason": "x".repeat(1001) })).await;
    assert!(long.assert_error(422, "invalid_body").starts_with("reason: is 1001 characters long"), "{}", long.text);
    server.post_json("/v1/workflows/held/pause", &json!({ "why": "typo" })).await.assert_error(422, "invalid_body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_with_slashes_and_spaces_travel_url_encoded() {
    let server = start(Options::default()).await;
    server.submit("quick", "order 17/β").await;
    let done = server.wait_terminal("order%2017%2F%CE%B2").await;
    assert_eq!((done["id"].as_str(), done["state"].as_str()), (Some("order 17/β"), Some("processed")));
}

const VALID_YAML: &str = "name: extra\nversion: 1\nsteps:\n  - name: nap\n    agent: delay\n    with: { ms: 1 }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflows_are_listed_shown_validated_and_registered() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    let listed = server.get("/v1/workflows").await;
    let names: Vec<&str> = listed.body.as_array().unwrap().iter().map(|w| w["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["broken", "quick", "slow"]);

    let shown = server.get("/v1/workflows/quick").await;
    assert_eq!(shown.status, StatusCode::OK);
    assert_eq!(shown.body["version"], 1);
    assert_eq!(
        shown.body["steps"][1],
        json!({ "name": "second", "agent": "delay", "waits_for": null, "when": null, "callback": false, "depends_on": ["first"], "compensated": false })
    );
    assert!(shown.body["registered_at"].as_i64().unwrap() > 0);
    assert_eq!(server.get("/v1/workflows/quick/versions/1").await.body, shown.body);
    server.get("/v1/workflows/quick/versions/2").await.assert_error(404, "not_found");
    server.get("/v1/workflows/quick/versions/0").await.assert_error(400, "invalid_path");
    server.get("/v1/workflows/quick/versions/one").await.assert_error(400, "invalid_path");
    server.get("/v1/workflows/nope").await.assert_error(404, "not_found");
    server.get("/v1/workflows/a%20b").await.assert_error(400, "invalid_path");

    let text = |path: &str, body: &str| server.request(Method::POST, path).header("content-type", "application/yaml").body(body.to_owned());
    let valid = server.send(text("/v1/workflows/validate", VALID_YAML)).await;
    assert_eq!(valid.status, StatusCode::OK, "{}", valid.text);
    assert_eq!((valid.body["valid"].as_bool(), valid.body["workflow"]["name"].as_str()), (Some(true), Some("extra")));
    assert!(valid.body["workflow"]["registered_at"].is_null());
    assert_eq!(server.get("/v1/workflows/extra").await.status, StatusCode::NOT_FOUND, "validating registers nothing");

    let invalid_yaml = VALID_YAML.replace("agent: delay", "agent: teleport");
    let invalid = server.send(text("/v1/workflows/validate", &invalid_yaml)).await;
    assert_eq!(invalid.status, StatusCode::OK);
    assert_eq!(invalid.body["valid"], false);
    let problem = &invalid.body["problems"][0];
    assert_eq!(problem["line"], 5, "{problem}");
    assert!(problem["message"].as_str().unwrap().contains("unknown agent `teleport`"), "{problem}");

    let json_definition = json!({ "name": "extra", "version": 2, "steps": [{ "name": "nap", "agent": "delay" }] });
    let validated = server.post_json("/v1/workflows/validate", &json_definition).await;
    assert_eq!(validated.body["valid"], true, "{}", validated.text);

    let created = server.send(text("/v1/workflows", VALID_YAML)).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    assert!(created.body["registered_at"].as_i64().is_some());
    let again = server.send(text("/v1/workflows", VALID_YAML)).await;
    assert_eq!(again.status, StatusCode::OK, "the same definition again is a no-op: {}", again.text);
    let changed = VALID_YAML.replace("ms: 1", "ms: 2");
    server.send(text("/v1/workflows", &changed)).await.assert_error(409, "version_exists");
    let refused = server.send(text("/v1/workflows", &invalid_yaml)).await;
    assert_eq!((refused.status.as_u16(), refused.code()), (422, "invalid_workflow"), "{}", refused.text);
    assert_eq!(refused.body["problems"][0]["line"], 5);
    let garbage = server.send(text("/v1/workflows", "{ not: [valid")).await;
    assert_eq!((garbage.status.as_u16(), garbage.code()), (422, "invalid_workflow"), "{}", garbage.text);
    server.send(text("/v1/workflows", " \n")).await.assert_error(400, "missing_body");
    server.send(text("/v1/workflows/validate", "")).await.assert_error(400, "missing_body");
    let not_text = server.request(Method::POST, "/v1/workflows").body(vec![0xff_u8, 0xfe]);
    server.send(not_text).await.assert_error(400, "unreadable_body");

    let second = server.post_json("/v1/workflows", &json_definition).await;
    assert_eq!(second.status, StatusCode::CREATED, "{}", second.text);
    assert_eq!(server.get("/v1/workflows/extra").await.body["version"], 2, "the latest version is shown");
    let submitted = server.post_json("/v1/tasks", &json!({ "workflow": "extra", "version": 1 })).await;
    assert_eq!((submitted.status, &submitted.body["version"]), (StatusCode::CREATED, &json!(1)));
    let written_as_float = server.post_json("/v1/tasks", &json!({ "workflow": "extra", "version": 1.0 })).await;
    assert_eq!((written_as_float.status, &written_as_float.body["version"]), (StatusCode::CREATED, &json!(1)));
}

async fn dead_letter_one(server: &Server, queue: &QueueName, id: &str) {
    let message = Outgoing::json(&json!({ "job": id }))
        .unwrap()
        .with_id(rota_model::MessageId::new(id).unwrap())
        .with_reply_to(QueueName::new("answers").unwrap())
        .with_correlation_id(format!("c-{id}"));
    server.store.send(queue, message).await.unwrap();
    let delivery = server.store.receive(queue, Receive::up_to(1)).await.unwrap().remove(0);
    server.store.dead_letter(queue, delivery.lease_token, format!("poison {id}")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_are_counted_paused_resumed_and_their_dead_letters_redriven_and_purged() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    let queue = QueueName::new("jobs").unwrap();
    dead_letter_one(&server, &queue, "m-1").await;

    let queues = server.get("/v1/queues").await;
    assert_eq!(queues.status, StatusCode::OK);
    let jobs = queues.body.as_array().unwrap().iter().find(|q| q["queue"] == "jobs").unwrap().clone();
    assert_eq!((jobs["ready"].as_u64(), jobs["dead_lettered"].as_u64(), jobs["paused"].as_bool()), (Some(0), Some(1), Some(false)));
    assert_eq!(server.get("/v1/queues/jobs").await.body, jobs);
    server.get("/v1/queues/nope").await.assert_error(404, "not_found");
    server.get("/v1/queues/a%20b").await.assert_error(400, "invalid_path");

    let letters = server.get("/v1/queues/jobs/dead-letters").await;
    assert_eq!(letters.status, StatusCode::OK);
    assert_eq!(letters.body[0]["id"], "m-1");
    assert_eq!(letters.body[0]["body"], json!({ "job": "m-1" }));
    assert_eq!(letters.body[0]["reason"], "poison m-1");
    assert_eq!((&letters.body[0]["reply_to"], &letters.body[0]["correlation_id"]), (&json!("answers"), &json!("c-m-1")));
    server.get("/v1/queues/nope/dead-letters").await.assert_error(404, "not_found");
    server.get("/v1/queues/jobs/dead-letters?limit=0").await.assert_error(400, "invalid_query");

    server.post("/v1/queues/jobs/dead-letters/m-404/redrive").await.assert_error(404, "not_found");
    assert_eq!(server.post("/v1/queues/jobs/dead-letters/m-1/redrive").await.body, json!({ "count": 1 }));
    assert_eq!(server.get("/v1/queues/jobs").await.body["ready"], 1);
    let redriven = server.store.receive(&queue, Receive::up_to(1)).await.unwrap().remove(0);
    server.store.complete(&queue, redriven.lease_token).await.unwrap();

    dead_letter_one(&server, &queue, "m-2").await;
    dead_letter_one(&server, &queue, "m-3").await;
    assert_eq!(server.post("/v1/queues/jobs/dead-letters/redrive").await.body, json!({ "count": 2 }));
    for _ in 0..2 {
        let delivery = server.store.receive(&queue, Receive::up_to(1)).await.unwrap().remove(0);
        server.store.dead_letter(&queue, delivery.lease_token, "again".into()).await.unwrap();
    }
    assert_eq!(server.post("/v1/queues/jobs/dead-letters/purge").await.body, json!({ "count": 2 }));
    assert_eq!(server.get("/v1/queues/jobs").await.body["dead_lettered"], 0);
    server.post("/v1/queues/nope/dead-letters/redrive").await.assert_error(404, "not_found");
    server.post("/v1/queues/nope/dead-letters/purge").await.assert_error(404, "not_found");

    let paused = server.post("/v1/queues/jobs/pause").await;
    assert_eq!((paused.status, &paused.body["paused"]), (StatusCode::OK, &json!(true)));
    let resumed = server.post("/v1/queues/jobs/resume").await;
    assert_eq!((resumed.status, &resumed.body["paused"]), (StatusCode::OK, &json!(false)));
    server.post("/v1/queues/nope/pause").await.assert_error(404, "not_found");
    server.post("/v1/queues/nope/resume").await.assert_error(404, "not_found");
    assert!(server.get("/v1/queues").await.body.as_array().unwrap().iter().all(|q| q["queue"] != "nope"), "no queue was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breakers_show_what_serve_processes_reported() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    assert_eq!(server.get("/v1/breakers").await.body, json!([]));
    let report = json!({
        "agent": "http", "endpoint": "http://127.0.0.1:9100", "state": "open",
        "consecutive_failures": 5, "open_until": 1_700_000_000_000_i64, "instance": "serve-1",
    });
    server.store.report_status("breaker/http://127.0.0.1:9100", &report).await.unwrap();
    server.store.report_status("instance/serve-1", &json!({ "alive": true })).await.unwrap();
    let breakers = server.get("/v1/breakers").await;
    assert_eq!(breakers.status, StatusCode::OK);
    let only: Vec<Value> = breakers.body.as_array().unwrap().clone();
    assert_eq!(only.len(), 1, "only breakers: {}", breakers.text);
    assert_eq!(
        (&only[0]["endpoint"], &only[0]["state"], &only[0]["consecutive_failures"], &only[0]["open_until"], &only[0]["instance"]),
        (&json!("http://127.0.0.1:9100"), &json!("open"), &json!(5), &json!(1_700_000_000_000_i64), &json!("serve-1"))
    );
    assert_eq!(only[0]["shared"], json!(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breakers_show_the_shared_ones_with_their_probe() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    let report = |holder: &str, probe: bool, result| rota_store::BreakerReport {
        key: "endpoint:http://127.0.0.1:9200".into(),
        holder: holder.into(),
        probe,
        result,
        failures_to_open: 1,
        open_for: Duration::from_millis(1),
    };
    let opened = server.store.report_breaker(&report("serve-1 t-1/call#1", false, rota_store::BreakerResult::Failure)).await.unwrap();
    let open_until = opened.unwrap().open_until.unwrap();
    let breakers = server.get("/v1/breakers").await;
    let view = &breakers.body[0];
    assert_eq!(
        (&view["endpoint"], &view["state"], &view["shared"], &view["consecutive_failures"], &view["open_until"], &view["agent"]),
        (&json!("http://127.0.0.1:9200"), &json!("open"), &json!(true), &json!(1), &json!(open_until.as_millis()), &Value::Null),
        "{}",
        breakers.text
    );
    // Once open_until has passed (the store's clock is real here), one call
    // takes the probe and the view names it.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let ask = rota_store::BreakerAsk {
        key: "endpoint:http://127.0.0.1:9200".into(),
        holder: "serve-2 t-2/call#1".into(),
        probe_lease: Duration::from_secs(30),
    };
    let (admission, _) = server.store.admit_breaker(&ask).await.unwrap();
    assert!(matches!(admission, rota_store::BreakerAdmission::Probe { .. }), "{admission:?}");
    let view = server.get("/v1/breakers").await.body[0].clone();
    assert_eq!(
        (&view["state"], &view["probe_holder"], &view["instance"]),
        (&json!("half_open"), &json!("serve-2 t-2/call#1"), &json!("serve-2"))
    );
    assert!(view["probe_until"].as_i64().is_some(), "{view}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_are_413() {
    let limits = rota_api::Limits { body_bytes_max: 1024, ..Options::default().limits };
    let server = start(Options { limits, engine: false, ..Options::default() }).await;
    let big = json!({ "workflow": "quick", "input": { "blob": "x".repeat(2048) } });
    let reason = server.post_json("/v1/tasks", &big).await.assert_error(413, "body_too_large");
    assert!(reason.starts_with("request body:"), "{reason}");
    let yaml = format!("{VALID_YAML}# {}\n", "x".repeat(2048));
    let register = server.request(Method::POST, "/v1/workflows").body(yaml.clone());
    server.send(register).await.assert_error(413, "body_too_large");
    server.send(server.request(Method::POST, "/v1/workflows/validate").body(yaml)).await.assert_error(413, "body_too_large");
    let small = server.post_json("/v1/tasks", &json!({ "workflow": "quick" })).await;
    assert_eq!(small.status, StatusCode::CREATED, "a body within the limit is served: {}", small.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_readiness_need_no_token() {
    let options = Options { auth: common_auth(), engine: false, ..Options::default() };
    let server = start(options).await;
    let health = server.get("/healthz").await;
    assert_eq!((health.status, &health.body["status"]), (StatusCode::OK, &json!("ok")));
    let ready = server.get("/readyz").await;
    assert_eq!((ready.status, &ready.body["status"], &ready.body["store"]), (StatusCode::OK, &json!("ok"), &json!("sqlite")));
    server.get("/v1/tasks").await.assert_error(401, "unauthorized");
}

/// Readiness is the store answering: a store that cannot (here its
/// workflow registry is gone) makes `/readyz` answer 503 `unavailable`,
/// while `/healthz`, which only says the process answers, stays 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_fails_while_the_store_cannot_answer() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    assert_eq!(server.get("/readyz").await.status, StatusCode::OK);
    let db = rusqlite::Connection::open(server.db_path()).unwrap();
    db.execute_batch("DROP TABLE workflows").unwrap();
    let ready = server.get("/readyz").await;
    assert_eq!(
        (ready.status, &ready.body["status"], &ready.body["store"]),
        (StatusCode::SERVICE_UNAVAILABLE, &json!("unavailable"), &json!("sqlite"))
    );
    assert_eq!(server.get("/healthz").await.status, StatusCode::OK);
}

fn common_auth() -> rota_api::AuthConfig {
    let token = rota_api::Token::new("admin-token-0123456789", vec![rota_api::Scope::Admin]).unwrap();
    rota_api::AuthConfig::tokens(vec![token]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_stops_when_its_shutdown_future_resolves() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    let base = server.base.clone();
    assert_eq!(server.get("/healthz").await.status, StatusCode::OK);
    drop(server);
    let started = std::time::Instant::now();
    loop {
        if rota_agent::http_client().build().unwrap().get(format!("{base}/healthz")).send().await.is_err() {
            break;
        }
        assert!(started.elapsed() < common::WAIT_MAX, "the server still answers");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// first (a 10 ms nap) → wait for `approved` → then (a nap as long as the
/// signal says).
fn approval() -> rota_workflow::Workflow {
    use rota_workflow::{AgentCatalog, StepDef, Workflow};
    Workflow::builder("approval", 1)
        .deadline(Duration::from_secs(120))
        .step(StepDef::new("first", "delay").with_input(json!({ "ms": 10 })))
        .step(StepDef::wait("approval", "approved").timeout(Duration::from_secs(60)))
        .step(StepDef::new("then", "delay").with_input(json!({ "ms": "{{ steps.approval.output.ms }}" })))
        .build(&AgentCatalog::builtin())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_completes_the_step_that_waits_for_it() {
    let server = start(Options { workflows: vec![approval()], ..Options::default() }).await;
    server.submit("approval", "a-1").await;
    let waiting = server.wait_until("a-1", |task| task["steps"][1]["state"] == "running").await;
    assert_eq!((waiting["steps"][1]["waits_for"].as_str(), waiting["steps"][1]["agent"].as_str()), (Some("approved"), None), "{waiting}");

    let sent = server.post_json("/v1/tasks/a-1/signals/approved", &json!({ "ms": 7 })).await;
    assert_eq!(sent.status, StatusCode::OK, "{}", sent.text);
    assert_eq!(sent.body, json!({ "id": "a-1", "signal": "approved", "step": "approval", "completed": true }));
    let done = server.wait_terminal("a-1").await;
    assert_eq!(done["state"], "processed", "{done}");
    assert_eq!(done["output"]["approval"], json!({ "ms": 7 }), "the signal's data is the step's output");
    assert_eq!(done["output"]["then"], json!({ "slept_ms": 7 }), "and the next step's template read it");
    let history = server.get("/v1/tasks/a-1/history").await.body;
    let signal = history.as_array().unwrap().iter().find(|e| e["kind"] == "signal").expect("the signal is in the history");
    assert_eq!((signal["step"].as_str(), signal["detail"]["sent_by"].as_str()), (Some("approval"), Some("api without authentication")));

    // Refusals, each changing nothing.
    server.post_json("/v1/tasks/a-1/signals/approved", &json!(1)).await.assert_error(409, "refused");
    server.post_json("/v1/tasks/nope/signals/approved", &json!(1)).await.assert_error(404, "not_found");
    server.submit("approval", "a-2").await;
    let unknown = server.post_json("/v1/tasks/a-2/signals/rejected", &json!(1)).await;
    unknown.assert_error(422, "invalid_signal");
    assert_eq!(unknown.reason(), "signal rejected: no step of task a-2 (workflow approval@1) waits for it (it waits for: approved)");
    server.post_json("/v1/tasks/a-2/signals/bad%20name", &json!(1)).await.assert_error(400, "invalid_path");
    let not_json = server.send(server.request(Method::POST, "/v1/tasks/a-2/signals/approved").body("yes")).await;
    assert_eq!(not_json.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{}", not_json.text);
    let history = server.get("/v1/tasks/a-2/history").await.body;
    assert!(history.as_array().unwrap().iter().all(|e| e["kind"] != "signal"), "{history}");
}

/// One long step per task, its tasks keyed by customer, one at a time.
fn serial() -> rota_workflow::Workflow {
    use rota_workflow::{AgentCatalog, StepDef, Workflow};
    Workflow::builder("serial", 1)
        .concurrency("input.customer", 1)
        .step(StepDef::new("wait", "delay").with_input(json!({ "for": "10m" })).timeout(Duration::from_secs(3600)))
        .deadline(Duration::from_secs(7200))
        .build(&AgentCatalog::builtin())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_held_back_by_its_concurrency_key_says_so_and_starts_when_the_slot_frees() {
    let server = start(Options { workflows: vec![serial()], ..Options::default() }).await;
    let submit = |id: &str, customer: Value| json!({ "workflow": "serial", "id": id, "input": { "customer": customer } });
    for (id, customer) in [("a1", json!("c1")), ("a2", json!("c1")), ("b1", json!(7))] {
        let reply = server.post_json("/v1/tasks", &submit(id, customer)).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    }
    let first = server.wait_for("a1", |state| state == "processing").await;
    assert_eq!((first["concurrency_key"].as_str(), first.get("waiting_for")), (Some("customer=c1"), None), "{first}");
    let other = server.wait_for("b1", |state| state == "processing").await;
    assert_eq!(other["concurrency_key"], "customer=7", "another key is not held back; an integer key is its text: {other}");
    let waiting = server.get("/v1/tasks/a2").await.body;
    assert_eq!(waiting["state"], "pending", "{waiting}");
    assert_eq!(waiting["waiting_for"], "waiting for concurrency key customer=c1 (1/1 in use)", "{waiting}");

    let cancelled = server.post_json("/v1/tasks/a1/cancel", &json!({ "reason": "make room" })).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{}", cancelled.text);
    let started = server.wait_for("a2", |state| state == "processing").await;
    assert!(started.get("waiting_for").is_none(), "{started}");

    let reply = server.post_json("/v1/tasks", &submit("bad", json!([1]))).await;
    let reason = reply.assert_error(422, "invalid_body");
    assert_eq!(reason, "input: the workflow's `concurrency.key` `input.customer` gives no key: it gave a list, not a string or an integer");
    let reply = server.post_json("/v1/tasks", &json!({ "workflow": "serial", "input": {} })).await;
    assert!(reply.assert_error(422, "invalid_body").ends_with("gives no key: no field `customer`"), "{}", reply.text);
    assert!(server.get("/v1/tasks/bad").await.status == StatusCode::NOT_FOUND, "nothing was created");
}
