//! Bulk-action batches on each backend: a batch acts once on each task (or
//! dead letter) its filter selected, goes on from its cursor after its
//! runner died (once the lease ran out), and stops when an operator stops
//! it. The clock is
//! a `ManualClock`; the tests drive the runners themselves.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rota_engine::batch::{self, Batches, Config};
use rota_engine::ops::Operator;
use rota_engine::{Client, Shutdown, Workflows};
use rota_model::{
    Clock, ExhaustedPolicy, InstanceId, ManualClock, MessageId, QueueName, Step, StepName, Tags, Task, TaskId, TaskState, Timestamp,
    WorkflowName,
};
use rota_store::{
    AuditAction, AuditFilter, BatchAction, BatchCursor, BatchFilter, BatchRecord, BatchState, Changes, DeadLetterFilter, Event, EventKind,
    NewTask, Outgoing, Receive, SharedStore, TaskFilter, TaskWrite,
};
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
    let batch = batch::create(&rig.client, BatchAction::Resubmit, BatchFilter::Tasks(errors_of("c1")), "ops", Some("payments back".into()))
        .await
        .unwrap();
    assert_eq!((batch.total, batch.state), (25, BatchState::Running));
    // A task failing after the batch was made is not the batch's.
    rig.clock.advance(Duration::from_millis(5));
    rig.failed(&["c1-late".to_owned()], "c1").await;

    let (first, second) = (rig.runner("runner-1"), rig.runner("runner-2"));
    one_page_then_die(&first, &batch.id).await;
    // The runner also resubmitted the first three tasks of its next page,
    // then died before recording it.
    for id in ["c1-14", "c1-13", "c1-12"] {
        let operator = Operator { by: "ops, batch (died before recording)", reason: None };
        rig.client.resubmit(&TaskId::new(id).unwrap(), None, operator).await.unwrap();
    }
    assert!(second.run(Some(&batch.id), &Shutdown::new(), |_| {}).await.unwrap().is_none(), "held until its lease runs out");
    rig.clock.advance(LEASE);
    let mut seen = Vec::new();
    let done = second.run(Some(&batch.id), &Shutdown::new(), |b| seen.push((b.done, b.skipped))).await.unwrap().expect("taken over");
    // The three are no longer in Error, so the walk does not list them;
    // they count as skipped when it ends.
    assert_eq!((done.state, done.done, done.skipped, done.failed), (BatchState::Done, 22, 3, 0), "{done:?}");
    assert_eq!(seen, [(10, 0), (20, 0), (22, 0), (22, 3)], "from the cursor: the claim, two pages, the empty page");
    for id in &c1 {
        assert_eq!((rig.state_of(id).await, rig.resubmits_of(id).await), (TaskState::Pending, 1), "task {id}");
    }
    assert_eq!(rig.state_of("c2-00").await, TaskState::Error, "another customer's task is left alone");
    assert_eq!(rig.state_of("c1-late").await, TaskState::Error, "a later task is left alone");

    // Cancel every c1 task: the pending ones are, the one in Error cannot be.
    let again =
        batch::create(&rig.client, BatchAction::Cancel, BatchFilter::Tasks(TaskFilter { state: None, ..errors_of("c1") }), "ops", None)
            .await
            .unwrap();
    let ran = first.run(Some(&again.id), &Shutdown::new(), |_| {}).await.unwrap().unwrap();
    assert_eq!((ran.total, ran.done, ran.skipped), (26, 25, 1), "{ran:?}");
    assert_eq!((rig.state_of("c1-00").await, rig.state_of("c1-late").await), (TaskState::Cancelled, TaskState::Error));
}

async fn a_stopped_batch_leaves_the_tasks_it_did_not_reach(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let c1 = ids("c1", 25);
    rig.failed(&c1, "c1").await;
    let batch = batch::create(&rig.client, BatchAction::Resubmit, BatchFilter::Tasks(errors_of("c1")), "ops", None).await.unwrap();
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

/// Dead letters `m-00`..: each sent to `queue`, received and
/// dead-lettered, a millisecond apart, with the reason `reason_of(n)`.
async fn dead_letters(rig: &Rig, queue: &QueueName, n: usize, reason_of: impl Fn(usize) -> &'static str) {
    for i in 0..n {
        let message = Outgoing::json(&json!({ "n": i })).unwrap().with_id(MessageId::new(format!("m-{i:02}")).unwrap());
        rig.store.send(queue, message).await.expect("send");
    }
    let received = rig.store.receive(queue, Receive::up_to(1000)).await.expect("receive");
    assert_eq!(received.len(), n);
    for (i, delivery) in received.into_iter().enumerate() {
        rig.clock.advance(Duration::from_millis(1));
        rig.store.dead_letter(queue, delivery.lease_token, format!("{} ({i})", reason_of(i))).await.expect("dead_letter");
    }
}

async fn a_redrive_batch_sends_each_selected_dead_letter_back_once_after_its_runner_died(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let http = QueueName::new("agent.http").unwrap();
    // Every sixth is refused (HTTP 400), the rest timed out: 25 of 30.
    let reason_of = |i: usize| if i % 6 == 5 { "HTTP 400" } else { "agent timeout" };
    dead_letters(&rig, &http, 30, reason_of).await;
    let timeouts = DeadLetterFilter { reason_contains: Some("timeout".into()), ..DeadLetterFilter::all(http.clone()) };
    let refused = batch::create(&rig.client, BatchAction::Redrive, BatchFilter::Tasks(errors_of("c1")), "ops", None).await.unwrap_err();
    assert!(refused.to_string().contains("a redrive batch takes a dead-letter filter"), "{refused}");
    let batch =
        batch::create(&rig.client, BatchAction::Redrive, BatchFilter::DeadLetters(timeouts.clone()), "ops", Some("agent fixed".into()))
            .await
            .unwrap();
    assert_eq!((batch.total, batch.state), (25, BatchState::Running));
    // Dead-lettered after the batch was made: not the batch's.
    rig.clock.advance(Duration::from_millis(5));
    rig.store.send(&http, Outgoing::json(&json!({ "late": true })).unwrap().with_id(MessageId::new("late").unwrap())).await.unwrap();
    let late = rig.store.receive(&http, Receive::up_to(1)).await.unwrap().remove(0);
    rig.store.dead_letter(&http, late.lease_token, "agent timeout (late)".into()).await.unwrap();

    // The first runner redrives one page (m-00..m-09: nine timed out) and dies.
    let first = rig.runner("runner-1");
    let shutdown = Shutdown::new();
    let mut pages = 0;
    let held = first
        .run(Some(&batch.id), &shutdown, |_| {
            pages += 1;
            if pages == 2 {
                shutdown.trigger();
            }
        })
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!((held.state, held.done, held.skipped), (BatchState::Running, 9, 0), "{held:?}");
    let Some(BatchCursor::DeadLetter(cursor)) = held.cursor else { panic!("a dead-letter cursor: {held:?}") };
    // ...as if it had redriven its next page too (m-10..m-19: eight) and
    // died before recording it.
    let unrecorded = rig.store.dead_letter_page(&timeouts, Some(cursor), 10).await.unwrap();
    let seqs: Vec<u64> = unrecorded.letters.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(rig.store.redrive_listed(&http, &seqs).await.unwrap(), 8);

    let second = rig.runner("runner-2");
    assert!(second.run(Some(&batch.id), &Shutdown::new(), |_| {}).await.unwrap().is_none(), "held until its lease runs out");
    rig.clock.advance(LEASE);
    let done = second.run(Some(&batch.id), &Shutdown::new(), |_| {}).await.unwrap().expect("taken over");
    assert_eq!((done.state, done.done, done.skipped, done.failed), (BatchState::Done, 17, 8, 0), "the unrecorded page skipped: {done:?}");

    // The live queue holds each selected message once, with a fresh count.
    let back = rig.store.receive(&http, Receive::up_to(1000)).await.unwrap();
    let mut ids: Vec<String> = back.iter().map(|d| d.id.to_string()).collect();
    ids.sort();
    let wanted: Vec<String> = (0..30).filter(|i| reason_of(*i) == "agent timeout").map(|i| format!("m-{i:02}")).collect();
    assert_eq!(ids, wanted, "each timed-out message once, no other");
    assert!(back.iter().all(|d| d.delivery_count == 1), "fresh delivery counts");
    let left = rig.store.dead_letters(&http, 100).await.unwrap();
    let mut left_ids: Vec<String> = left.iter().map(|l| l.id.to_string()).collect();
    left_ids.sort();
    assert_eq!(left_ids, ["late", "m-05", "m-11", "m-17", "m-23", "m-29"], "the refused ones and the later one stay");

    // The audit log has the batch, with its filter.
    let audit = rig
        .store
        .audit(&AuditFilter { since: None, action: Some(AuditAction::BatchCreate), by: None, after: None, limit: 10 })
        .await
        .unwrap();
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!((audit[0].target.as_str(), audit[0].reason.as_deref()), (batch.id.as_str(), Some("agent fixed")));
    assert_eq!(audit[0].detail["action"], "redrive");
    assert_eq!(audit[0].detail["filter"]["dead_letters"]["queue"], "agent.http", "{:?}", audit[0].detail);
}

on_each_backend!(
    a_batch_acts_once_on_each_task_and_goes_on_after_its_runner_died,
    a_stopped_batch_leaves_the_tasks_it_did_not_reach,
    a_redrive_batch_sends_each_selected_dead_letter_back_once_after_its_runner_died,
);
