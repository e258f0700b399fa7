//! Bulk-action batches on each backend: a batch acts once on each task its
//! filter selected, goes on from its cursor after its runner died (once
//! the lease ran out), and stops when an operator stops it. The clock is
//! a `ManualClock`; the tests drive the runners themselves.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rota_engine::batch::{self, Batches, Config};
use rota_engine::{Client, Shutdown, Workflows};
use rota_model::{Clock, ExhaustedPolicy, InstanceId, ManualClock, Step, StepName, Tags, Task, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{BatchAction, BatchRecord, BatchState, Changes, Event, EventKind, NewTask, SharedStore, TaskFilter, TaskWrite};
use rota_workflow::{AgentCatalog, StepDef, Workflow};
use serde_json::json;

use common::Backend;

const START: Timestamp = Timestamp::from_millis(1_800_000_000_000);
const LEASE: Duration = Duration::from_secs(30);

struct Rig {
    store: SharedStore,
    clock: Arc<ManualClock>,
    client: Client,
    _store: common::TestStore,
}

impl Rig {
    async fn new(backend: Backend) -> Option<Rig> {
        let clock = Arc::new(ManualClock::new(START));
        let test_store = common::open(backend, clock.clone()).await?;
        let store = test_store.store.clone();
        let workflow = Workflow::builder("order", 1).step(StepDef::new("wait", "delay")).build(&AgentCatalog::builtin()).expect("valid");
        let workflows = Workflows::new(store.clone());
        workflows.register(&workflow).await.expect("register");
        let client = Client::new(store.clone(), clock.clone(), workflows, None);
        Some(Rig { store, clock, client, _store: test_store })
    }

    /// Tasks `ids`, tagged `customer`, ended in Error.
    async fn failed(&self, ids: &[String], customer: &str) {
        let now = self.clock.now();
        for id in ids {
            let id = TaskId::new(id.as_str()).unwrap();
            let mut task = Task::new(id.clone(), WorkflowName::new("order").unwrap(), 1, json!({}), now);
            task.tags = Tags::new([("customer".to_owned(), customer.to_owned())]).unwrap();
            let steps = vec![Step::new(id.clone(), StepName::new("wait").unwrap(), 0, now)];
            let events = vec![Event::task(&id, now, EventKind::Received, json!({}))];
            self.store.create_task(NewTask { task, steps, messages: Vec::new(), events }).await.expect("create");
        }
        let owner = InstanceId::new("failer").unwrap();
        let claimed = self.store.claim_tasks(&owner, LEASE, ids.len() as u32).await.expect("claim");
        assert_eq!(claimed.len(), ids.len());
        for task in claimed {
            let failed = task.fail(task.fence().unwrap(), "boom".into(), ExhaustedPolicy::Error, now).expect("fail");
            let changes = Changes { tasks: vec![TaskWrite::replacing(&task, failed)], ..Changes::default() };
            self.store.commit(changes).await.expect("fail");
        }
    }

    fn runner(&self, name: &str) -> Batches {
        Batches::new(self.client.clone(), InstanceId::new(name).unwrap(), Config { page: 10, lease: LEASE, ..Config::default() })
    }

    async fn state_of(&self, id: &str) -> TaskState {
        self.store.task(&TaskId::new(id).unwrap()).await.unwrap().unwrap().task.state
    }

    async fn resubmits_of(&self, id: &str) -> usize {
        let history = self.store.history(&TaskId::new(id).unwrap()).await.unwrap();
        history.iter().filter(|event| event.kind == EventKind::Resubmitted).count()
    }
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:02}")).collect()
}

fn errors_of(customer: &str) -> TaskFilter {
    TaskFilter { state: Some(TaskState::Error), tags: vec![("customer".into(), customer.into())], ..TaskFilter::default() }
}

/// Runs one page with `runner`, then stops as if its process died: the
/// batch stays held until its lease runs out.
async fn one_page_then_die(runner: &Batches, id: &str) -> BatchRecord {
    let shutdown = Shutdown::new();
    let mut pages = 0;
    let batch = runner
        .run(Some(id), &shutdown, |_| {
            pages += 1;
            // The first call is the claim; the second follows the first page.
            if pages == 2 {
                shutdown.trigger();
            }
        })
        .await
        .expect("run")
        .expect("claimed");
    assert_eq!((batch.state, batch.done), (BatchState::Running, 10), "one page of ten, still held");
    batch
}

async fn a_batch_acts_once_on_each_task_and_goes_on_after_its_runner_died(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let c1 = ids("c1", 25);
    rig.failed(&c1, "c1").await;
    rig.failed(&ids("c2", 5), "c2").await;
    let batch = batch::create(&rig.client, BatchAction::Resubmit, errors_of("c1"), "ops", Some("payments back".into())).await.unwrap();
    assert_eq!((batch.total, batch.state), (25, BatchState::Running));
    // A task failing after the batch was made is not the batch's.
    rig.clock.advance(Duration::from_millis(5));
    rig.failed(&["c1-late".to_owned()], "c1").await;

    let (first, second) = (rig.runner("runner-1"), rig.runner("runner-2"));
    one_page_then_die(&first, &batch.id).await;
    assert!(second.run(Some(&batch.id), &Shutdown::new(), |_| {}).await.unwrap().is_none(), "held until its lease runs out");
    rig.clock.advance(LEASE);
    let mut seen = Vec::new();
    let done = second.run(Some(&batch.id), &Shutdown::new(), |b| seen.push(b.done)).await.unwrap().expect("taken over");
    assert_eq!((done.state, done.done, done.skipped, done.failed), (BatchState::Done, 25, 0, 0), "{done:?}");
    assert_eq!(seen, [10, 20, 25, 25], "from the cursor: the claim, two pages, the empty page");
    for id in &c1 {
        assert_eq!((rig.state_of(id).await, rig.resubmits_of(id).await), (TaskState::Pending, 1), "task {id}");
    }
    assert_eq!(rig.state_of("c2-00").await, TaskState::Error, "another customer's task is left alone");
    assert_eq!(rig.state_of("c1-late").await, TaskState::Error, "a later task is left alone");

    // Cancel every c1 task: the pending ones are, the one in Error cannot be.
    let again = batch::create(&rig.client, BatchAction::Cancel, TaskFilter { state: None, ..errors_of("c1") }, "ops", None).await.unwrap();
    let ran = first.run(Some(&again.id), &Shutdown::new(), |_| {}).await.unwrap().unwrap();
    assert_eq!((ran.total, ran.done, ran.skipped), (26, 25, 1), "{ran:?}");
    assert_eq!((rig.state_of("c1-00").await, rig.state_of("c1-late").await), (TaskState::Cancelled, TaskState::Error));
}

async fn a_stopped_batch_leaves_the_tasks_it_did_not_reach(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let c1 = ids("c1", 25);
    rig.failed(&c1, "c1").await;
    let batch = batch::create(&rig.client, BatchAction::Resubmit, errors_of("c1"), "ops", None).await.unwrap();
    let runner = rig.runner("runner-1");
    one_page_then_die(&runner, &batch.id).await;
    let stopped = rig.store.stop_batch(&batch.id).await.unwrap().unwrap();
    assert_eq!(stopped.state, BatchState::Stopped);
    assert!(runner.run(Some(&batch.id), &Shutdown::new(), |_| {}).await.unwrap().is_none(), "not run again");
    let mut states = Vec::new();
    for id in &c1 {
        states.push(rig.state_of(id).await);
    }
    let resubmitted = states.iter().filter(|s| **s == TaskState::Pending).count();
    assert_eq!((resubmitted, states.len() - resubmitted), (10, 15), "the newest ten resubmitted, the rest still in Error");
    assert!(states[15..].iter().all(|s| *s == TaskState::Pending), "newest first: {states:?}");
}

on_each_backend!(a_batch_acts_once_on_each_task_and_goes_on_after_its_runner_died, a_stopped_batch_leaves_the_tasks_it_did_not_reach,);
