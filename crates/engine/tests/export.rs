//! Export, import and retention's archive on each backend: an export read
//! back into an empty store gives the same tasks, steps and histories; an
//! import refuses a store that holds tasks; a retention pass with an
//! archive deletes only what it wrote durably, and what it wrote imports.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rota_engine::Shutdown;
use rota_engine::archive::{self, Archive};
use rota_engine::export::{self, Import, Line};
use rota_engine::retention::{Config, Retention};
use rota_model::{Clock, InstanceId, ManualClock, Step, StepName, Task, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{Changes, Event, EventKind, NewTask, SharedStore, TaskFilter, TaskWrite};
use serde_json::json;

use common::Backend;

const START: Timestamp = Timestamp::from_millis(1_800_000_000_000);
const DAY: Duration = Duration::from_secs(24 * 3600);

struct Rig {
    store: SharedStore,
    clock: Arc<ManualClock>,
    _store: common::TestStore,
}

impl Rig {
    async fn new(backend: Backend) -> Option<Rig> {
        let clock = Arc::new(ManualClock::new(START));
        let test_store = common::open(backend, clock.clone()).await?;
        Some(Rig { store: test_store.store.clone(), clock, _store: test_store })
    }

    /// A task of `workflow` with steps `a` and `b`, submitted now; then
    /// cancelled (finished), or claimed and left running.
    async fn task(&self, id: &str, workflow: &str, finished: bool) {
        let now = self.clock.now();
        let id = TaskId::new(id).unwrap();
        let task = Task::new(id.clone(), WorkflowName::new(workflow).unwrap(), 3, json!({"n": id.as_str()}), now);
        let steps: Vec<Step> =
            ["a", "b"].iter().enumerate().map(|(i, name)| Step::new(id.clone(), StepName::new(*name).unwrap(), i as u32, now)).collect();
        let events = vec![Event::task(&id, now, EventKind::Received, json!({"by": "test"}))];
        self.store.create_task(NewTask { task: task.clone(), steps: steps.clone(), messages: Vec::new(), events }).await.expect("create");
        self.clock.advance(Duration::from_millis(7));
        let now = self.clock.now();
        let (next, event) = if finished {
            (task.cancel(false, now).expect("cancel"), Event::task(&id, now, EventKind::Cancelled, json!({"by": "ops", "reason": "test"})))
        } else {
            let (claimed, _) = task.claim(InstanceId::new("sched-1").unwrap(), now, Duration::from_secs(60)).expect("claim");
            (claimed, Event::step(&steps[0], now, EventKind::StepStarted, json!({"agent": "delay"})))
        };
        let changes = Changes { tasks: vec![TaskWrite::replacing(&task, next)], events: vec![event], ..Changes::default() };
        self.store.commit(changes).await.expect("move");
        self.clock.advance(Duration::from_millis(5));
    }

    /// Every line of `ids` as the store holds them now, with the histories'
    /// store sequence numbers zeroed (an import numbers them anew).
    async fn lines(&self, ids: &[&str]) -> Vec<Line> {
        let ids: Vec<TaskId> = ids.iter().map(|id| TaskId::new(*id).unwrap()).collect();
        let mut lines = export::lines(&self.store, &ids).await.expect("read");
        for line in &mut lines {
            line.history.iter_mut().for_each(|event| event.seq = 0);
        }
        lines
    }
}

/// Every line `filter` exports, through the text format and back.
async fn export_all(store: &SharedStore, filter: TaskFilter) -> Vec<Line> {
    let mut text = Vec::new();
    let written = export::export(store, filter, |line| {
        text.push(line.to_json());
        Ok(())
    })
    .await
    .expect("export");
    assert_eq!(written, text.len() as u64);
    text.iter().map(|line| Line::parse(line).expect("an exported line reads back")).collect()
}

async fn import_all(store: &SharedStore, lines: Vec<Line>) -> export::Imported {
    let mut import = Import::start(store.clone()).await.expect("an empty store");
    for line in lines {
        import.write(line).await.expect("import a line");
    }
    import.finish()
}

async fn an_export_imports_into_an_empty_store_as_it_was(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let ids = ["order-1", "order-2", "mail-1", "order-3", "order-4"];
    for (n, id) in ids.iter().enumerate() {
        rig.task(id, if id.starts_with("mail") { "mail" } else { "order" }, n != 3).await;
    }
    let page_of_two = TaskFilter { limit: 2, ..TaskFilter::default() };
    let exported = export_all(&rig.store, page_of_two.clone()).await;
    let exported_ids: Vec<&str> = exported.iter().map(|line| line.task.id.as_str()).collect();
    assert_eq!(exported_ids, ["order-4", "order-3", "mail-1", "order-2", "order-1"], "every task once, newest first, across pages");
    let orders = export_all(&rig.store, TaskFilter { workflow: Some(WorkflowName::new("order").unwrap()), ..page_of_two.clone() }).await;
    assert_eq!(orders.len(), 4, "the listing's filters select what is exported");
    let cancelled = export_all(&rig.store, TaskFilter { state: Some(TaskState::Cancelled), ..page_of_two.clone() }).await;
    assert!(cancelled.iter().all(|line| line.task.state == TaskState::Cancelled) && cancelled.len() == 4);

    let Some(copy) = Rig::new(backend).await else { return };
    let imported = import_all(&copy.store, exported.clone()).await;
    assert_eq!(imported, export::Imported { tasks: 5, duplicates: 0, broken_chains: 0 });
    assert_eq!(copy.lines(&ids).await, rig.lines(&ids).await, "the same tasks, steps and histories, with the same hashes");
    let running = copy.store.task(&TaskId::new("order-3").unwrap()).await.unwrap().expect("imported");
    assert_eq!((running.task.state, running.task.locked_by.as_ref().map(InstanceId::as_str)), (TaskState::Processing, Some("sched-1")));

    let refused = Import::start(copy.store.clone()).await.err().expect("a store with tasks is refused").to_string();
    assert!(refused.contains("the store is not empty") && refused.contains("only into an empty store"), "{refused}");
    let refused = export::export(&rig.store, TaskFilter { limit: 0, ..TaskFilter::default() }, |_| Ok(())).await.expect_err("page 0");
    assert_eq!(refused.to_string(), "invalid configuration: export.page must be between 1 and 1000, got 0");
}

async fn an_import_keeps_the_first_line_of_a_task_read_twice(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    rig.task("order-1", "order", true).await;
    let line = export_all(&rig.store, TaskFilter::default()).await.remove(0);
    let Some(copy) = Rig::new(backend).await else { return };
    let mut later = line.clone();
    later.task.error = Some("a later copy".into());
    assert_eq!(import_all(&copy.store, vec![line, later]).await, export::Imported { tasks: 1, duplicates: 1, broken_chains: 0 });
    let stored = copy.store.task(&TaskId::new("order-1").unwrap()).await.unwrap().expect("imported");
    assert_eq!(stored.task.error.as_deref(), Some("cancelled by an operator"), "the first line wins");
}

async fn an_import_refuses_a_line_changed_after_it_was_written_unless_told(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    rig.task("order-1", "order", true).await;
    rig.task("order-2", "order", true).await;
    let mut lines = export_all(&rig.store, TaskFilter::default()).await;
    assert_eq!(lines[1].task.id.as_str(), "order-1");
    lines[1].history[0].at = Timestamp::from_millis(1);

    let Some(copy) = Rig::new(backend).await else { return };
    let mut import = Import::start(copy.store.clone()).await.expect("an empty store");
    import.write(lines[0].clone()).await.expect("an untouched line");
    let refused = import.write(lines[1].clone()).await.expect_err("a changed line").to_string();
    assert!(refused.contains("task order-1: the hash chain of its history is broken at row 1 (seq "), "{refused}");
    assert!(refused.contains("--accept-broken-chains"), "says how to import it anyway: {refused}");
    assert!(copy.store.task(&TaskId::new("order-1").unwrap()).await.unwrap().is_none(), "nothing of a refused line is written");
    assert_eq!(import.finish(), export::Imported { tasks: 1, duplicates: 0, broken_chains: 0 });

    let Some(accepting) = Rig::new(backend).await else { return };
    let mut import = Import::start(accepting.store.clone()).await.expect("an empty store").accepting_broken_chains();
    for line in lines {
        import.write(line).await.expect("accepted");
    }
    assert_eq!(import.finish(), export::Imported { tasks: 2, duplicates: 0, broken_chains: 1 });
    let stored = accepting.store.history(&TaskId::new("order-1").unwrap()).await.unwrap();
    assert_eq!(stored[0].at, Timestamp::from_millis(1), "imported as the file has it");
    let verified = export::verify(&accepting.store, 10, |id, at| panic!("{id}: {at}")).await.unwrap();
    assert_eq!(verified.broken, 0, "chained anew by the store");
}

fn retention(rig: &Rig, archive_dir: &std::path::Path) -> Retention {
    let config = Config { default: Some(DAY), pause: Duration::ZERO, batch: 2, archive: Some(archive_dir.to_owned()), ..Config::default() };
    Retention::new(rig.store.clone(), rig.clock.clone(), config).expect("a valid config")
}

async fn retention_archives_each_batch_durably_before_deleting_it(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let ids = ["order-1", "order-2", "order-3", "order-4", "order-5"];
    for (n, id) in ids.iter().enumerate() {
        rig.task(id, "order", n != 4).await;
    }
    let before = rig.lines(&ids[..4]).await;
    rig.clock.advance(2 * DAY);
    let dir = tempfile::tempdir().unwrap();
    let archive_dir = dir.path().join("archive");
    let pass = retention(&rig, &archive_dir).run_once(&Shutdown::new()).await.expect("a pass");
    assert_eq!((pass.tasks, pass.batches), (4, 3), "two batches of two, then an empty one");

    let files = archive::files(&archive_dir).unwrap();
    assert_eq!(files.len(), 2, "one file per batch: {files:?}");
    let names: Vec<String> =
        std::fs::read_dir(&archive_dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|name| name.ends_with(archive::SUFFIX)), "no partial file is left: {names:?}");
    let mut archived = Vec::new();
    for file in &files {
        for text in std::fs::read_to_string(file).unwrap().lines() {
            archived.push(Line::parse(text).expect("an archived line reads"));
        }
    }
    let archived_ids: Vec<&str> = archived.iter().map(|line| line.task.id.as_str()).collect();
    assert_eq!(archived_ids, ["order-1", "order-2", "order-3", "order-4"], "each deleted task, oldest end first");
    assert_eq!(rig.store.tasks(&[TaskId::new("order-1").unwrap()]).await.unwrap(), [], "deleted after archiving");
    assert!(rig.store.task(&TaskId::new("order-5").unwrap()).await.unwrap().is_some(), "the running task is kept");

    let Some(copy) = Rig::new(backend).await else { return };
    assert_eq!(import_all(&copy.store, archived).await.tasks, 4);
    assert_eq!(copy.lines(&ids[..4]).await, before, "the archive holds the tasks as they were before the prune");
}

async fn an_archive_that_cannot_be_written_deletes_nothing(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    rig.task("order-1", "order", true).await;
    rig.clock.advance(2 * DAY);
    let dir = tempfile::tempdir().unwrap();
    let archive_dir = dir.path().join("archive");
    let retention = retention(&rig, &archive_dir);
    std::fs::remove_dir(&archive_dir).unwrap();
    let err = retention.run_once(&Shutdown::new()).await.expect_err("the archive is gone");
    assert!(err.to_string().starts_with(&format!("cannot archive to {}", archive_dir.display())), "{err}");
    assert!(rig.store.task(&TaskId::new("order-1").unwrap()).await.unwrap().is_some(), "nothing archived, nothing deleted");

    std::fs::create_dir(&archive_dir).unwrap();
    assert_eq!(retention.run_once(&Shutdown::new()).await.unwrap().tasks, 1, "the next pass archives and deletes it");
    assert!(Archive::open(&dir.path().join("new/nested")).is_ok(), "a missing directory is created");
    std::fs::write(dir.path().join("file"), "").unwrap();
    let refused = Archive::open(&dir.path().join("file")).expect_err("a file is not a directory").to_string();
    assert!(refused.starts_with(&format!("archive directory {}", dir.path().join("file").display())), "{refused}");
}

async fn a_history_row_changed_deleted_or_moved_by_hand_is_found(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    for (id, finished) in [("order-1", true), ("order-2", false), ("order-3", true), ("order-4", true)] {
        rig.task(id, "order", finished).await;
    }
    let whole = export::verify(&rig.store, 2, |id, at| panic!("{id} is whole, yet {at}")).await.expect("verify");
    assert_eq!(whole, export::Verified { tasks: 4, rows: 8, unchained_tasks: 0, broken: 0 });
    let exported = export_all(&rig.store, TaskFilter::default()).await;
    assert!(exported.iter().all(|line| line.verify().is_ok() && line.history.iter().all(|event| event.hash.is_some())), "{exported:?}");

    let edits = [
        "UPDATE rota.events SET detail = '{\"by\":\"someone else\"}' WHERE task_id = 'order-1' AND kind = 'cancelled'",
        "DELETE FROM rota.events WHERE task_id = 'order-2' AND kind = 'received'",
        "UPDATE rota.events SET seq = seq + 1000000 WHERE task_id = 'order-3' AND kind = 'received'",
    ];
    for edit in edits {
        assert_eq!(rig._store.by_hand(edit).await, 1, "{edit}");
    }
    let mut found = Vec::new();
    let verified = export::verify(&rig.store, 2, |id, at| found.push(format!("{id} row {}", at.row))).await.expect("verify");
    assert_eq!((verified.tasks, verified.broken), (4, 3));
    found.sort();
    assert_eq!(found, ["order-1 row 2", "order-2 row 1", "order-3 row 1"], "the changed row, the row after the deleted one, the moved row");

    let mut line = exported.into_iter().find(|line| line.task.id.as_str() == "order-4").expect("order-4");
    line.history[0].at = Timestamp::from_millis(1);
    assert_eq!(line.verify().expect_err("a changed line").row, 1, "a line changed in the file");
}

on_each_backend!(
    a_history_row_changed_deleted_or_moved_by_hand_is_found,
    an_export_imports_into_an_empty_store_as_it_was,
    an_import_keeps_the_first_line_of_a_task_read_twice,
    an_import_refuses_a_line_changed_after_it_was_written_unless_told,
    retention_archives_each_batch_durably_before_deleting_it,
    an_archive_that_cannot_be_written_deletes_nothing,
);
