//! The SQLite file gives its free pages back: every file is
//! `auto_vacuum=INCREMENTAL` (a file made without it is switched once at
//! open), and each prune gives back up to `vacuum_pages_max` free pages.

use std::sync::Arc;

use rota_model::{SystemClock, Task, TaskId, Timestamp, WorkflowName};
use rota_store::{Changes, NewTask, Prune, TaskWrite, Tasks};
use rota_store_sqlite::{Config, Durability, SqliteStore};
use serde_json::json;

/// Without fsyncs: hundreds of commits, and durability is not the point.
fn open(mut config: Config) -> SqliteStore {
    config.durability = Durability::Normal;
    SqliteStore::open(config, Arc::new(SystemClock)).expect("open")
}

/// `count` cancelled tasks whose input takes about a page each.
async fn finished_tasks(store: &SqliteStore, count: usize) {
    let order = WorkflowName::new("order").unwrap();
    for n in 0..count {
        let id = TaskId::new(format!("order-{n}")).unwrap();
        let task = Task::new(id, order.clone(), 1, json!({ "padding": "x".repeat(4000) }), Timestamp::from_millis(1));
        store.create_task(NewTask { task: task.clone(), steps: Vec::new(), messages: Vec::new(), events: Vec::new() }).await.unwrap();
        let cancelled = task.cancel(false, Timestamp::from_millis(2)).unwrap();
        store.commit(Changes { tasks: vec![TaskWrite::replacing(&task, cancelled)], ..Changes::default() }).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_made_without_incremental_vacuum_is_switched_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE kept (v TEXT); INSERT INTO kept VALUES ('still here');").unwrap();
        let mode: i64 = conn.query_row("PRAGMA auto_vacuum", [], |row| row.get(0)).unwrap();
        assert_eq!(mode, 0, "SQLite's default is no vacuum");
    }
    let store = open(Config::new(&path));
    assert_eq!(store.pragmas().await.unwrap().auto_vacuum, "incremental");
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let kept: String = conn.query_row("SELECT v FROM kept", [], |row| row.get(0)).unwrap();
    assert_eq!(kept, "still here", "the switch keeps the data");
    let fresh = open(Config::new(dir.path().join("new.db")));
    assert_eq!(fresh.pragmas().await.unwrap().auto_vacuum, "incremental", "a new file too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prune_gives_free_pages_back_up_to_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(Config::new(dir.path().join("store.db")));
    finished_tasks(&store, 300).await;
    let full = store.pages().await.unwrap();
    assert!(full.total > 300, "about a page per task: {full:?}");
    let pruned = store.prune_tasks(&Prune::finished_before(Timestamp::from_millis(10), 1000)).await.unwrap();
    assert_eq!(pruned.tasks.len(), 300);
    let after = store.pages().await.unwrap();
    assert!(after.total < full.total - 250, "the file shrank: {full:?} then {after:?}");
    assert!(after.free < 10, "no free page is left over: {after:?}");

    let mut config = Config::new(dir.path().join("kept.db"));
    config.vacuum_pages_max = 100;
    let bounded = open(config);
    finished_tasks(&bounded, 300).await;
    let full = bounded.pages().await.unwrap();
    bounded.prune_tasks(&Prune::finished_before(Timestamp::from_millis(10), 1000)).await.unwrap();
    let after = bounded.pages().await.unwrap();
    assert_eq!(after.total, full.total - 100, "one prune gives back at most vacuum_pages_max pages: {full:?} then {after:?}");
    assert!(after.free > 150, "the rest stays free, for new rows or the next prune: {after:?}");
    bounded.prune_tasks(&Prune::finished_before(Timestamp::from_millis(10), 1000)).await.unwrap();
    assert_eq!(bounded.pages().await.unwrap().total, full.total - 200, "an empty prune gives back more");
}

#[tokio::test]
async fn too_many_vacuum_pages_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("x.db"));
    config.vacuum_pages_max = Config::VACUUM_PAGES_MAX + 1;
    let err = SqliteStore::open(config, Arc::new(SystemClock)).unwrap_err();
    assert!(err.to_string().contains("vacuum_pages_max"), "{err}");
}
