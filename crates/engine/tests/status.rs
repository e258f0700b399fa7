//! The status `Reporter`: a running process's heartbeat reads as live
//! under its instance key, and the last one, written at shutdown, says it
//! stopped. On both backends, under a manual clock.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rota_agent::AgentRegistry;
use rota_engine::Shutdown;
use rota_engine::status::{self, Heartbeat, Reporter};
use rota_model::{Clock, InstanceId, ManualClock};
use rota_store::{ComponentStatus, SharedStore};
use serde_json::json;

use common::Backend;

/// How long a test waits for the reporter's first round.
const WAIT_MAX: Duration = Duration::from_secs(10);

async fn heartbeat_of(store: &SharedStore, instance: &InstanceId) -> Option<ComponentStatus> {
    let key = status::instance_key(instance);
    store.statuses(&key).await.unwrap().into_iter().find(|status| status.key == key)
}

async fn a_heartbeat_is_live_until_its_process_stops(backend: Backend) {
    let clock = Arc::new(ManualClock::default());
    let Some(db) = common::open(backend, clock.clone()).await else { return };
    let instance = InstanceId::new("serve-1").unwrap();
    assert_eq!(status::live_heartbeat_age(&db.store, &instance, clock.now()).await, None, "nothing reported yet");

    let heartbeat = Heartbeat {
        instance: instance.clone(),
        roles: vec!["scheduler".to_owned()],
        agents: Vec::new(),
        workflows: vec![("order".to_owned(), 2)],
        started_at: clock.now(),
    };
    let shutdown = Shutdown::new();
    let reporter = Reporter::new(db.store.clone(), clock.clone(), AgentRegistry::new(), heartbeat);
    let running = tokio::spawn(reporter.run(shutdown.clone()));
    let started = Instant::now();
    let first = loop {
        if let Some(first) = heartbeat_of(&db.store, &instance).await {
            break first;
        }
        assert!(started.elapsed() < WAIT_MAX, "no heartbeat after {WAIT_MAX:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(first.value["roles"], json!(["scheduler"]));
    assert_eq!(first.value["workflows"], json!([{ "name": "order", "version": 2 }]));
    assert_eq!(first.value["stopped"], json!(false));
    clock.advance(Duration::from_secs(5));
    assert_eq!(status::live_heartbeat_age(&db.store, &instance, clock.now()).await, Some(Duration::from_secs(5)));
    let listed = status::instances(&db.store, clock.now()).await.unwrap();
    let expected = status::Instance {
        instance: "serve-1".to_owned(),
        roles: vec!["scheduler".to_owned()],
        agents: Vec::new(),
        workflows: vec![("order".to_owned(), 2)],
        pid: Some(u64::from(std::process::id())),
        started_at: Some(first.reported_at),
        stopped: false,
        last_heartbeat: first.reported_at,
        live: true,
    };
    assert_eq!(listed, [expected], "the instances as their heartbeats show them");
    clock.advance(status::REPORT_INTERVAL * 3);
    let silent = status::instances(&db.store, clock.now()).await.unwrap();
    assert!(!silent[0].live || silent[0].last_heartbeat > first.reported_at, "a heartbeat too old is not live: {silent:?}");

    shutdown.trigger();
    running.await.unwrap();
    let last = heartbeat_of(&db.store, &instance).await.unwrap();
    assert_eq!(last.value["stopped"], json!(true));
    assert_eq!(status::live_heartbeat_age(&db.store, &instance, clock.now()).await, None, "it stopped cleanly");
    let stopped = status::instances(&db.store, clock.now()).await.unwrap();
    assert_eq!((stopped.len(), stopped[0].stopped, stopped[0].live), (1, true, false), "a stopped instance is listed, not live");
    clock.advance(status::INSTANCES_LISTED_FOR);
    assert_eq!(status::instances(&db.store, clock.now()).await.unwrap().len(), 1, "listed for a day after its last heartbeat");
    clock.advance(Duration::from_millis(1));
    assert!(status::instances(&db.store, clock.now()).await.unwrap().is_empty(), "then no longer");
}

on_each_backend!(a_heartbeat_is_live_until_its_process_stops);
