//! Retention passes on each backend: finished tasks are deleted after
//! their workflow's own retention or the store's default, in bounded
//! batches, only by the Supervisor leader, and gone instances are swept.
//! The clock is a `ManualClock`; the tests run the passes themselves.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rota_engine::retention::{Config, Pass, RETENTION_BY, Retention};
use rota_engine::{Shutdown, Workflows, protocol, status};
use rota_model::{Clock, InstanceId, ManualClock, Task, TaskId, Timestamp, WorkflowName};
use rota_store::{AuditAction, AuditFilter, Changes, Event, EventKind, NewAudit, NewTask, QueueConfig, SharedStore, TaskWrite};
use rota_workflow::{AgentCatalog, StepDef, Workflow};
use serde_json::json;

use common::Backend;

const START: Timestamp = Timestamp::from_millis(1_800_000_000_000);
const MINUTE: Duration = Duration::from_secs(60);
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

    /// Registers `name` (one `delay` step) with its own `retention`, if any.
    async fn workflow(&self, name: &str, retention: Option<Duration>) {
        let mut builder = Workflow::builder(name, 1).step(StepDef::new("wait", "delay"));
        if let Some(retention) = retention {
            builder = builder.retention(retention);
        }
        let workflow = builder.build(&AgentCatalog::builtin()).expect("a valid workflow");
        Workflows::new(self.store.clone()).register(&workflow).await.expect("register");
    }

    /// A task of `workflow`, cancelled now (so finished now).
    async fn finished(&self, id: &str, workflow: &str) {
        let id = TaskId::new(id).unwrap();
        let task = Task::new(id.clone(), WorkflowName::new(workflow).unwrap(), 1, json!({}), self.clock.now());
        let events = vec![Event::task(&id, self.clock.now(), EventKind::Received, json!({}))];
        self.store.create_task(NewTask { task: task.clone(), steps: Vec::new(), messages: Vec::new(), events }).await.expect("create");
        let cancelled = task.cancel(false, self.clock.now()).expect("cancel");
        let changes = Changes { tasks: vec![TaskWrite::replacing(&task, cancelled)], ..Changes::default() };
        self.store.commit(changes).await.expect("cancel");
    }

    fn retention(&self, config: Config) -> Retention {
        Retention::new(self.store.clone(), self.clock.clone(), config).expect("a valid config")
    }

    async fn pass(&self, retention: &Retention) -> Pass {
        retention.run_once(&Shutdown::new()).await.expect("a pass")
    }

    /// Which of `ids` are still stored.
    async fn kept(&self, ids: &[&str]) -> Vec<String> {
        let ids: Vec<TaskId> = ids.iter().map(|id| TaskId::new(*id).unwrap()).collect();
        self.store.tasks(&ids).await.expect("tasks").into_iter().map(|record| record.task.id.to_string()).collect()
    }
}

fn config(default: Option<Duration>) -> Config {
    Config { default, pause: Duration::ZERO, ..Config::default() }
}

async fn each_workflow_keeps_its_finished_tasks_for_its_own_retention(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    rig.workflow("audit", Some(90 * DAY)).await;
    rig.workflow("ping", Some(MINUTE)).await;
    rig.workflow("order", None).await;
    for (id, workflow) in [("audit-1", "audit"), ("ping-1", "ping"), ("order-1", "order"), ("unregistered-1", "unregistered")] {
        rig.finished(id, workflow).await;
    }
    let all = ["audit-1", "ping-1", "order-1", "unregistered-1"];
    let retention = rig.retention(config(Some(30 * DAY)));

    assert_eq!(rig.pass(&retention).await.tasks, 0, "nothing is old enough yet");
    rig.clock.advance(MINUTE + Duration::from_secs(1));
    assert_eq!(rig.pass(&retention).await.tasks, 1);
    assert_eq!(rig.kept(&all).await, ["audit-1", "order-1", "unregistered-1"], "ping keeps its tasks for a minute");
    rig.clock.advance(30 * DAY);
    assert_eq!(rig.pass(&retention).await.tasks, 2);
    assert_eq!(rig.kept(&all).await, ["audit-1"], "the default applies to the others, registered or not");
    rig.clock.advance(60 * DAY);
    assert_eq!(rig.pass(&retention).await.tasks, 1);
    assert_eq!(rig.kept(&all).await, Vec::<String>::new(), "audit keeps its tasks for 90 days, longer than the default");
}

async fn without_a_default_only_workflows_that_ask_are_pruned(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    rig.workflow("ping", Some(MINUTE)).await;
    rig.finished("ping-1", "ping").await;
    rig.finished("order-1", "order").await;
    rig.clock.advance(365 * DAY);
    let pass = rig.pass(&rig.retention(config(None))).await;
    assert_eq!((pass.tasks, pass.events), (1, 1));
    assert_eq!(rig.kept(&["ping-1", "order-1"]).await, ["order-1"]);
}

async fn a_pass_runs_bounded_batches_and_the_next_pass_goes_on(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    for n in 0..5 {
        rig.finished(&format!("order-{n}"), "order").await;
    }
    rig.clock.advance(2 * DAY);
    let retention = rig.retention(Config { batch: 2, batches_per_pass: 2, ..config(Some(DAY)) });
    let first = rig.pass(&retention).await;
    assert_eq!((first.tasks, first.batches), (4, 2), "two batches of two, then the pass ends");
    let second = rig.pass(&retention).await;
    assert_eq!((second.tasks, second.batches), (1, 1), "a short batch ends the pass");
    assert_eq!(rig.pass(&retention).await.tasks, 0);
}

async fn only_the_supervisor_leader_runs_a_pass(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    rig.finished("order-1", "order").await;
    rig.clock.advance(2 * DAY);
    let retention = rig.retention(config(Some(DAY)));
    let (me, other) = (InstanceId::new("me").unwrap(), InstanceId::new("other").unwrap());
    let shutdown = Shutdown::new();
    assert_eq!(retention.run_if_leader(&me, &shutdown).await.unwrap(), None, "nobody leads");
    rig.store.acquire_leader(rota_engine::supervisor::LEADER_LEASE, &other, MINUTE).await.unwrap().expect("other leads");
    assert_eq!(retention.run_if_leader(&me, &shutdown).await.unwrap(), None, "another instance leads");
    assert_eq!(rig.kept(&["order-1"]).await, ["order-1"]);
    rig.clock.advance(2 * MINUTE);
    rig.store.acquire_leader(rota_engine::supervisor::LEADER_LEASE, &me, MINUTE).await.unwrap().expect("me leads");
    let pass = retention.run_if_leader(&me, &shutdown).await.unwrap().expect("the leader runs a pass");
    assert_eq!(pass.tasks, 1);
}

async fn instances_gone_long_enough_are_swept_with_their_inbox(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let gone = InstanceId::new("gone-1").unwrap();
    rig.store.report_status(&status::instance_key(&gone), &json!({"instance": "gone-1"})).await.unwrap();
    rig.store.create_queue(&protocol::inbox(&gone), QueueConfig::default()).await.unwrap();
    rig.store.report_status(&status::breaker_key("http://old"), &json!({})).await.unwrap();
    let failure = rota_store::BreakerReport {
        key: "endpoint:http://old:80".into(),
        holder: "gone-1 t/s#1".into(),
        probe: false,
        result: rota_store::BreakerResult::Failure,
        failures_to_open: 5,
        open_for: Duration::from_secs(10),
    };
    rig.store.report_breaker(&failure).await.unwrap();
    let limit: rota_model::RateLimit = "10/s".parse().unwrap();
    let take = |key: &str| rota_store::RateRequest { key: key.to_owned(), limit, wait_max: Duration::ZERO };
    rig.store.take_rate_slot(&take("endpoint:http://old:80")).await.unwrap();
    rig.clock.advance(DAY);
    rig.store.take_rate_slot(&take("endpoint:http://live:80")).await.unwrap();
    let live = InstanceId::new("live-1").unwrap();
    rig.store.report_status(&status::instance_key(&live), &json!({"instance": "live-1"})).await.unwrap();
    rig.store.create_queue(&protocol::inbox(&live), QueueConfig::default()).await.unwrap();
    let retention = rig.retention(Config { instances_gone_after: DAY, ..config(None) });

    let pass = rig.pass(&retention).await;
    assert_eq!((pass.instances, pass.inboxes, pass.breakers), (0, 0, 0), "silent for exactly the bound: not gone yet");
    assert_eq!(pass.rate_limits, 0, "the old key's time (a tenth of a second after its take) is not a day past yet");
    rig.clock.advance(Duration::from_secs(1));
    let pass = rig.pass(&retention).await;
    assert_eq!((pass.instances, pass.inboxes, pass.breakers), (1, 1, 2), "the reported breaker and the shared one");
    assert_eq!(pass.rate_limits, 1, "the rate limit not taken for a day, not the live one");
    assert!(rig.store.shared_breakers().await.unwrap().is_empty());
    let heartbeats: Vec<String> = rig.store.statuses(status::INSTANCE_PREFIX).await.unwrap().into_iter().map(|s| s.key).collect();
    assert_eq!(heartbeats, ["instance/live-1"]);
    let queues: Vec<String> = rig.store.stats().await.unwrap().into_iter().map(|s| s.queue.to_string()).collect();
    assert!(!queues.contains(&"rota.inbox.gone-1".to_owned()) && queues.contains(&"rota.inbox.live-1".to_owned()), "{queues:?}");
}

/// A pass that deletes tasks records itself in the audit log with its
/// counts (the tasks' own operator rows go with them); audit rows older
/// than the audit retention are swept in bounded batches, younger ones kept.
async fn a_pass_is_audited_and_old_audit_rows_are_swept(backend: Backend) {
    let Some(rig) = Rig::new(backend).await else { return };
    let purge = |queue: &str| NewAudit {
        action: AuditAction::DlqPurge,
        by: "alice".to_owned(),
        reason: None,
        target: queue.to_owned(),
        detail: json!({ "purged": 1 }),
    };
    for queue in ["old-1", "old-2", "old-3"] {
        rig.store.record_audit(&purge(queue)).await.unwrap();
    }
    rig.finished("order-1", "order").await;
    rig.clock.advance(2 * DAY);
    rig.store.record_audit(&purge("young")).await.unwrap();
    let retention = rig.retention(Config { audit: DAY, batch: 2, ..config(Some(DAY)) });

    let pass = rig.pass(&retention).await;
    assert_eq!((pass.tasks, pass.audit_rows), (1, 3), "the old rows in two batches, the young one kept");
    let listed = rig.store.audit(&AuditFilter { limit: 10, ..AuditFilter::default() }).await.unwrap();
    let rows: Vec<(AuditAction, &str, &str)> = listed.iter().map(|e| (e.action, e.by.as_str(), e.target.as_str())).collect();
    assert_eq!(rows, [(AuditAction::Prune, RETENTION_BY, "retention"), (AuditAction::DlqPurge, "alice", "young")]);
    assert_eq!(listed[0].detail["tasks"], json!(1), "the prune says how many tasks it deleted");
    let pass = rig.pass(&retention).await;
    assert_eq!((pass.tasks, pass.audit_rows), (0, 0));
    let again = rig.store.audit(&AuditFilter { limit: 10, ..AuditFilter::default() }).await.unwrap();
    assert_eq!(again.len(), 2, "a pass that deletes nothing records nothing");
}

on_each_backend!(
    each_workflow_keeps_its_finished_tasks_for_its_own_retention,
    without_a_default_only_workflows_that_ask_are_pruned,
    a_pass_runs_bounded_batches_and_the_next_pass_goes_on,
    only_the_supervisor_leader_runs_a_pass,
    instances_gone_long_enough_are_swept_with_their_inbox,
    a_pass_is_audited_and_old_audit_rows_are_swept,
);
