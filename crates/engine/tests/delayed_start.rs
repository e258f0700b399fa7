//! Delayed starts: a task submitted to start later waits Pending, is not
//! claimed before its time on either backend, and is claimed once the
//! (injected) clock reaches it; its doorbell is delayed to ring then.

use std::sync::Arc;
use std::time::Duration;

use rota_engine::client::{START_DELAY_MAX, parse_start_at};
use rota_engine::{Client, Error, Start, Submission, Workflows};
use rota_model::{Clock, InstanceId, ManualClock, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{EventKind, SharedStore};
use rota_store_postgres::PgStore;
use rota_store_sqlite::SqliteStore;
use rota_testkit::postgres::TestSchema;
use rota_workflow::{AgentCatalog, StepDef, Workflow};
use serde_json::json;

const START: Timestamp = Timestamp::from_millis(1_800_000_000_000);
const LEASE: Duration = Duration::from_secs(30);

fn workflow() -> Workflow {
    Workflow::builder("later", 1).step(StepDef::new("nap", "delay")).build(&AgentCatalog::builtin()).unwrap()
}

async fn client(store: SharedStore, clock: Arc<ManualClock>) -> Client {
    let workflows = Workflows::new(store.clone());
    workflows.register(&workflow()).await.unwrap();
    Client::new(store, clock, workflows, None)
}

fn submission(id: &str) -> Submission {
    Submission::new(WorkflowName::new("later").unwrap(), json!({})).with_id(TaskId::new(id).unwrap())
}

async fn a_delayed_task_waits_for_its_time(store: SharedStore, clock: Arc<ManualClock>) {
    let client = client(store.clone(), clock.clone()).await;
    let owner = InstanceId::new("scheduler-1").unwrap();
    let at = START.add(Duration::from_secs(600));
    client.submit(submission("later").starting_at(at)).await.unwrap();

    let record = store.task(&TaskId::new("later").unwrap()).await.unwrap().unwrap();
    assert_eq!((record.task.state, record.task.not_before), (TaskState::Pending, at));
    let history = store.history(&record.task.id).await.unwrap();
    assert_eq!(history[0].kind, EventKind::Received);
    assert_eq!(history[0].detail["start_at"], json!(at.as_millis()), "the history says when it starts");
    let doorbells = store.stats().await.unwrap().into_iter().find(|q| q.queue.as_str() == "rota.tasks").unwrap();
    assert_eq!((doorbells.ready, doorbells.delayed), (0, 1), "the doorbell rings at the start time");

    assert!(store.claim_tasks(&owner, LEASE, 10).await.unwrap().is_empty(), "not claimed at once");
    clock.advance(Duration::from_secs(599));
    assert!(store.claim_tasks(&owner, LEASE, 10).await.unwrap().is_empty(), "nor a second early");
    clock.advance(Duration::from_secs(1));
    let claimed = store.claim_tasks(&owner, LEASE, 10).await.unwrap();
    assert_eq!(claimed.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["later"], "claimed once its time has come");

    // A start already past starts now.
    client.submit(submission("past").starting_at(START)).await.unwrap();
    let past = store.task(&TaskId::new("past").unwrap()).await.unwrap().unwrap();
    assert_eq!(past.task.not_before, clock.now());
    assert_eq!(store.claim_tasks(&owner, LEASE, 10).await.unwrap().len(), 1);

    // A delay counts from the submission, on the client's clock.
    client.submit(submission("after").with_start(Start::After(Duration::from_secs(90)))).await.unwrap();
    let after = store.task(&TaskId::new("after").unwrap()).await.unwrap().unwrap();
    assert_eq!(after.task.not_before, after.task.created_at.add(Duration::from_secs(90)));

    // Too far ahead: refused, nothing written.
    let too_far = clock.now().add(START_DELAY_MAX + Duration::from_secs(1));
    let err = client.submit(submission("too-far").starting_at(too_far)).await.unwrap_err();
    assert!(matches!(err, Error::InvalidSubmission { field: "start_at", .. }), "{err}");
    assert!(err.to_string().starts_with("start_at: must be at most"), "{err}");
    assert!(store.task(&TaskId::new("too-far").unwrap()).await.unwrap().is_none());
    let err = client.submit(submission("too-late").with_start(Start::After(START_DELAY_MAX * 2))).await.unwrap_err();
    assert_eq!(err.to_string(), "delay: must be at most 366 days ahead");
}

#[tokio::test]
async fn sqlite_a_delayed_task_waits_for_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(START));
    let store = SqliteStore::open(rota_store_sqlite::Config::new(dir.path().join("later.db")), clock.clone()).unwrap();
    a_delayed_task_waits_for_its_time(Arc::new(store), clock).await;
}

#[tokio::test]
async fn postgres_a_delayed_task_waits_for_its_time() {
    let Some(schema) = TestSchema::new("delayed starts on PostgreSQL") else { return };
    let mut config = rota_store_postgres::Config::new(schema.url.clone());
    config.schema = schema.name.clone();
    let clock = Arc::new(ManualClock::new(START));
    let store = PgStore::open(config, clock.clone()).await.unwrap();
    a_delayed_task_waits_for_its_time(Arc::new(store), clock).await;
}

#[test]
fn start_times_are_read_in_rfc_3339_with_any_offset() {
    let utc = parse_start_at("2026-12-01T02:00:00Z").unwrap();
    assert_eq!(parse_start_at("2026-12-01T03:00:00+01:00").unwrap(), utc);
    assert_eq!(parse_start_at(" 2026-12-01T02:00:00.250Z ").unwrap(), utc.add(Duration::from_millis(250)));
    for wrong in ["tomorrow", "2026-12-01", "2026-12-01 02:00", ""] {
        let err = parse_start_at(wrong).unwrap_err();
        assert!(err.contains("RFC 3339") && err.contains(&format!("{wrong:?}")), "{err}");
    }
}
