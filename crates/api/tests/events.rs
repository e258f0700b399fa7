//! Server-sent events end to end: a task's stream from submit to its end,
//! resumed with `Last-Event-ID`; the all-tasks stream with filters;
//! keep-alives; streams end when the server shuts down.

mod common;

use std::time::Duration;

use common::{Frame, Options, SseReader, start};

/// Reads a task's stream to its end: the events, then the `end` event.
async fn read_to_end(reader: &mut SseReader) -> (Vec<Frame>, Frame) {
    let mut events = Vec::new();
    loop {
        let frame = reader.next_event().await.expect("the stream ended without an `end` event");
        if frame.event.as_deref() == Some("end") {
            assert!(reader.next_event().await.is_none(), "the stream closes after `end`");
            return (events, frame);
        }
        events.push(frame);
    }
}

fn kinds(frames: &[Frame]) -> Vec<String> {
    frames.iter().map(|f| f.json()["kind"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_stream_follows_the_task_to_its_end_and_resumes_after_the_last_event_id() {
    let server = start(Options::default()).await;
    server.submit("quick", "watched").await;
    let mut reader = SseReader::open(&server, "/v1/tasks/watched/events", None).await;
    let (events, end) = read_to_end(&mut reader).await;

    let names = kinds(&events);
    assert_eq!(names.first().map(String::as_str), Some("received"));
    assert_eq!(names.last().map(String::as_str), Some("processed"), "{names:?}");
    assert_eq!(names.iter().filter(|k| *k == "step_completed").count(), 2, "{names:?}");
    let seqs: Vec<i64> = events.iter().map(|f| f.id.as_deref().unwrap().parse().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "ids are the increasing seqs: {seqs:?}");
    for (frame, seq) in events.iter().zip(&seqs) {
        assert_eq!((frame.json()["seq"].as_i64(), frame.json()["task_id"].as_str()), (Some(*seq), Some("watched")));
    }
    assert_eq!(end.json(), serde_json::json!({ "task_id": "watched", "state": "processed" }));
    let history = server.get("/v1/tasks/watched/history").await;
    let history_seqs: Vec<i64> = history.body.as_array().unwrap().iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, history_seqs, "the stream carries the whole history");

    // Reconnecting after the second event gets only the later ones.
    let mut resumed = SseReader::open(&server, "/v1/tasks/watched/events", Some(&seqs[1].to_string())).await;
    let (later, end) = read_to_end(&mut resumed).await;
    let later_seqs: Vec<i64> = later.iter().map(|f| f.id.as_deref().unwrap().parse().unwrap()).collect();
    assert_eq!(later_seqs, seqs[2..]);
    assert_eq!(end.json()["state"], "processed");

    // `?after=` does the same for clients that cannot set the header.
    let mut after = SseReader::open(&server, &format!("/v1/tasks/watched/events?after={}", seqs[seqs.len() - 2]), None).await;
    let (last, _) = read_to_end(&mut after).await;
    assert_eq!(kinds(&last), ["processed"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_all_tasks_stream_filters_by_workflow_and_kind_and_resumes() {
    let server = start(Options::default()).await;
    let mut reader = SseReader::open(&server, "/v1/events?workflow=quick&kind=processed,received", None).await;
    server.submit("broken", "other").await;
    server.wait_terminal("other").await;
    server.submit("quick", "q-1").await;

    let mut seen = Vec::new();
    let last_seq = loop {
        let frame = reader.next_event().await.expect("the all-tasks stream stays open");
        let event = frame.json();
        assert_eq!(event["task_id"], "q-1", "only tasks of workflow quick: {event}");
        seen.push(event["kind"].as_str().unwrap().to_owned());
        if event["kind"] == "processed" {
            break frame.id.unwrap();
        }
    };
    assert_eq!(seen, ["received", "processed"], "only the kinds asked for");
    drop(reader);

    let mut resumed = SseReader::open(&server, "/v1/events?kind=processed", Some(&last_seq)).await;
    server.submit("quick", "q-2").await;
    let next = resumed.next_event().await.unwrap();
    assert_eq!((next.json()["task_id"].as_str(), next.json()["kind"].as_str()), (Some("q-2"), Some("processed")));
    assert!(next.id.unwrap().parse::<i64>().unwrap() > last_seq.parse::<i64>().unwrap());

    // Without a filter, every event from the start.
    let mut everything = SseReader::open(&server, "/v1/events", None).await;
    let first = everything.next_event().await.unwrap().json();
    assert_eq!((first["task_id"].as_str(), first["kind"].as_str()), (Some("other"), Some("received")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_sends_keep_alives() {
    let limits = rota_api::Limits { events_keep_alive: Duration::from_secs(1), ..Options::default().limits };
    let server = start(Options { limits, engine: false, ..Options::default() }).await;
    let mut reader = SseReader::open(&server, "/v1/events?kind=alert", None).await;
    let frame = reader.next().await.unwrap();
    assert!(frame.comment && frame.id.is_none(), "{frame:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_streams_end_when_the_server_shuts_down() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    server.submit("slow", "never-ends").await;
    let mut all = SseReader::open(&server, "/v1/events", None).await;
    let mut one = SseReader::open(&server, "/v1/tasks/never-ends/events", None).await;
    assert_eq!(one.next_event().await.unwrap().json()["kind"], "received");
    assert_eq!(all.next_event().await.unwrap().json()["kind"], "received");
    drop(server);
    // Both streams close (a graceful shutdown would otherwise wait for them forever).
    while let Some(frame) = all.next().await {
        assert!(frame.comment, "nothing but keep-alives: {frame:?}");
    }
    while let Some(frame) = one.next().await {
        assert!(frame.comment, "nothing but keep-alives: {frame:?}");
    }
}
