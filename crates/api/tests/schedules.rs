//! The schedule endpoints over a real server: create (201, then 200 for
//! the same definition, 409 for another), the refusals with the field they
//! are about, list and show with the next fire time, pause and resume,
//! trigger (a task with its own id), delete; and the engine firing a
//! created schedule.

mod common;

use common::{Options, start};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn every_second(name: &str) -> Value {
    json!({ "name": name, "workflow": "quick", "cron": "* * * * * *", "overlap": "allow", "input": { "n": 1 } })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_created_listed_changed_triggered_and_deleted() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    let created = server.post_json("/v1/schedules", &every_second("tick")).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let view = &created.body;
    assert_eq!((&view["name"], &view["workflow"], &view["timezone"]), (&json!("tick"), &json!("quick"), &json!("UTC")));
    assert_eq!(
        (&view["overlap"], &view["catch_up"], &view["source"], &view["paused"]),
        (&json!("allow"), &json!("latest"), &json!("api"), &json!(false))
    );
    let next = view["next_fire_at"].as_i64().unwrap();
    assert_eq!(next % 1000, 0, "fire times are whole seconds");
    assert!(next > view["fired_through"].as_i64().unwrap());

    let again = server.post_json("/v1/schedules", &every_second("tick")).await;
    assert_eq!(again.status, StatusCode::OK, "the same definition again changes nothing");
    let mut other = every_second("tick");
    other["cron"] = json!("0 * * * * *");
    let reason = server.post_json("/v1/schedules", &other).await.assert_error(409, "schedule_exists");
    assert_eq!(reason, "schedule tick already exists with a different definition (delete it first)");

    for (body, status, code, reason) in [
        (
            json!({ "name": "b", "workflow": "quick", "cron": "61 * * * *" }),
            422,
            "invalid_body",
            "cron: invalid cron expression \"61 * * * *\"",
        ),
        (
            json!({ "name": "b", "workflow": "quick", "cron": "* * * * *", "timezone": "Mars/Base" }),
            422,
            "invalid_body",
            "timezone: unknown time zone",
        ),
        (
            json!({ "name": "b", "workflow": "quick", "cron": "* * * * *", "overlap": "never" }),
            422,
            "invalid_body",
            "overlap: invalid overlap \"never\"",
        ),
        (
            json!({ "name": "b", "workflow": "quick", "cron": "* * * * *", "catch_up": "some" }),
            422,
            "invalid_body",
            "catch_up: invalid catch_up \"some\"",
        ),
        (json!({ "name": "b@c", "workflow": "quick", "cron": "* * * * *" }), 422, "invalid_body", "name: invalid schedule name"),
        (json!({ "name": "b", "workflow": "nope", "cron": "* * * * *" }), 404, "unknown_workflow", "workflow nope"),
        (json!({ "name": "b", "workflow": "quick" }), 422, "invalid_body", "cron"),
    ] {
        let reply = server.post_json("/v1/schedules", &body).await;
        let got = reply.assert_error(status, code);
        assert!(got.contains(reason), "{body}: {got}");
    }
    assert_eq!(server.get("/v1/schedules").await.body.as_array().unwrap().len(), 1, "refused creations wrote nothing");

    let shown = server.get("/v1/schedules/tick").await;
    assert_eq!((shown.status, &shown.body["input"]), (StatusCode::OK, &json!({ "n": 1 })));
    let paused = server.post_json("/v1/schedules/tick/pause", &json!({ "reason": "the report moved" })).await;
    assert_eq!((&paused.body["paused"], &paused.body["next_fire_at"]), (&json!(true), &Value::Null));
    let resumed = server.post("/v1/schedules/tick/resume").await;
    assert_eq!(resumed.body["paused"], json!(false));
    assert!(resumed.body["next_fire_at"].as_i64().is_some());

    let triggered = server.post("/v1/schedules/tick/trigger").await;
    assert_eq!(triggered.status, StatusCode::CREATED, "{}", triggered.body);
    let id = triggered.body["id"].as_str().unwrap();
    assert!(id.starts_with("tick@manual@20") && id.ends_with('Z'), "{id}");
    assert_eq!(triggered.body["input"], json!({ "n": 1 }));
    let history = server.get(&format!("/v1/tasks/{}/history", id.replace('@', "%40"))).await.body;
    assert_eq!(history[0]["detail"]["schedule"]["name"], json!("tick"));
    assert_eq!(history[0]["detail"]["schedule"]["manual"], json!(true));

    let long = server.delete(&format!("/v1/schedules/tick?reason={}", "x".repeat(1001))).await;
    assert!(long.assert_error(400, "invalid_query").contains("reason"), "{}", long.text);
    assert_eq!(server.delete("/v1/schedules/tick?reason=replaced%20by%20tock").await.status, StatusCode::NO_CONTENT);
    let audit = server.get("/v1/audit?limit=10").await.body;
    let reasons: Vec<(&str, &Value)> = audit.as_array().unwrap().iter().map(|e| (e["action"].as_str().unwrap(), &e["reason"])).collect();
    assert_eq!(
        reasons,
        [
            ("schedule.delete", &json!("replaced by tock")),
            ("schedule.trigger", &Value::Null),
            ("schedule.resume", &Value::Null),
            ("schedule.pause", &json!("the report moved")),
        ],
        "the reasons given, kept in the audit log"
    );
    for (method, path) in [("GET", ""), ("POST", "/pause"), ("POST", "/resume"), ("POST", "/trigger"), ("DELETE", "")] {
        let path = format!("/v1/schedules/tick{path}");
        let reply = match method {
            "GET" => server.get(&path).await,
            "POST" => server.post(&path).await,
            _ => server.delete(&path).await,
        };
        assert_eq!(reply.assert_error(404, "not_found"), "schedule tick not found", "{method} {path}");
    }
    server.get("/v1/schedules/a%20b").await.assert_error(400, "invalid_path");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_fires_a_created_schedule() {
    let server = start(Options::default()).await;
    assert_eq!(server.post_json("/v1/schedules", &every_second("tick")).await.status, StatusCode::CREATED);
    let deadline = std::time::Instant::now() + common::WAIT_MAX;
    loop {
        let tasks = server.get("/v1/tasks?workflow=quick").await.body;
        let fired: Vec<&str> =
            tasks.as_array().unwrap().iter().filter_map(|t| t["id"].as_str()).filter(|id| id.starts_with("tick@")).collect();
        if fired.len() >= 2 {
            let shown = server.get("/v1/schedules/tick").await.body;
            assert!(shown["last_task"].as_str().unwrap().starts_with("tick@"), "{shown}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the schedule fired: {tasks}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
