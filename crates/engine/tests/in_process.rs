//! Replies decided in-process: an agent worker in its Scheduler's own
//! engine hands the reply straight to the Scheduler, whose decision
//! commits together with the consumption of the request, on either
//! backend. Nothing goes through the inbox; a lost request lease decides
//! nothing; a Scheduler that has given its tasks back decides nothing.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rota_engine::protocol::{self, Reply, ReplyOutcome, StepRequest};
use rota_engine::scheduler::{self, Handled};
use rota_engine::{Client, Completions, Error, Scheduler, Shutdown, Submission, Workflows};
use rota_model::{InstanceId, ManualClock, StepName, StepState, TaskId, Timestamp, WorkflowName};
use rota_store::{Delivery, Receive, SharedStore};
use rota_workflow::{AgentCatalog, StepDef, Workflow};
use serde_json::json;

use common::Backend;

const START: Timestamp = Timestamp::from_millis(1_800_000_000_000);

fn two_steps() -> Workflow {
    Workflow::builder("pair", 1)
        .step(StepDef::new("first", "delay"))
        .step(StepDef::new("second", "delay"))
        .build(&AgentCatalog::builtin())
        .unwrap()
}

struct Rig {
    store: SharedStore,
    clock: Arc<ManualClock>,
    scheduler: Scheduler,
    _test_store: common::TestStore,
}

impl Rig {
    /// A Scheduler that has claimed and started task `t-1`: the first
    /// step's request waits in the agent's queue.
    async fn started(backend: Backend) -> Option<Rig> {
        let clock = Arc::new(ManualClock::new(START));
        let test_store = common::open(backend, clock.clone()).await?;
        let store = test_store.store.clone();
        let workflows = Workflows::new(store.clone());
        workflows.register(&two_steps()).await.unwrap();
        let client = Client::new(store.clone(), clock.clone(), workflows.clone(), None);
        let submission = Submission::new(WorkflowName::new("pair").unwrap(), json!({})).with_id(TaskId::new("t-1").unwrap());
        client.submit(submission).await.unwrap();
        let config = scheduler::Config::new(InstanceId::new("holder").unwrap());
        let scheduler = Scheduler::new(store.clone(), clock.clone(), workflows, Completions::default(), config).unwrap();
        assert_eq!(scheduler.claim_once().await.unwrap(), 1);
        Some(Rig { store, clock, scheduler, _test_store: test_store })
    }

    /// Leases the next request from the agent's queue, for `lease`.
    async fn request(&self, lease: Duration) -> (Delivery, StepRequest) {
        let queue = protocol::agent_queue("delay");
        let mut got = self.store.receive(&queue, Receive::up_to(1).leasing(lease).by(InstanceId::new("agent").unwrap())).await.unwrap();
        assert_eq!(got.len(), 1, "one request waits");
        let delivery = got.remove(0);
        let request = serde_json::from_str(delivery.body.get()).unwrap();
        (delivery, request)
    }

    async fn step(&self, name: &str) -> rota_model::Step {
        let record = self.store.task(&TaskId::new("t-1").unwrap()).await.unwrap().unwrap();
        record.steps.into_iter().find(|s| s.name.as_str() == name).unwrap()
    }

    async fn inbox_is_empty(&self) -> bool {
        let inbox = self.scheduler.inbox();
        self.store.receive(inbox, Receive::up_to(10).by(InstanceId::new("peek").unwrap())).await.unwrap().is_empty()
    }
}

fn succeeded(request: &StepRequest) -> Reply {
    let call = &request.call;
    Reply {
        task_id: call.task_id.clone(),
        step: call.step.clone(),
        attempt: call.attempt,
        compensate: call.compensate,
        outcome: ReplyOutcome::Succeeded { output: json!({ "done": call.step.as_str() }) },
    }
}

async fn a_reply_decided_in_process_commits_with_the_consumption_of_its_request(backend: Backend) {
    let Some(rig) = Rig::started(backend).await else { return };
    let queue = protocol::agent_queue("delay");
    let (delivery, request) = rig.request(Duration::from_secs(30)).await;
    assert_eq!(request.call.step.as_str(), "first");
    assert_eq!(&request.reply_to, rig.scheduler.inbox());

    // A reply for another inbox is not this Scheduler's to decide.
    let elsewhere = protocol::inbox(&InstanceId::new("someone-else").unwrap());
    let reply = succeeded(&request);
    assert!(rig.scheduler.decide_reply(&reply, &elsewhere, &queue, delivery.lease_token).await.is_none());
    // A reply for an attempt that is not running is ignored, on a fresh
    // read, and commits nothing: the request is still leased.
    let stale = Reply { attempt: reply.attempt + 1, ..reply.clone() };
    match rig.scheduler.decide_reply(&stale, &request.reply_to, &queue, delivery.lease_token).await {
        Some(Ok(Handled::Ignored(_))) => {}
        other => panic!("a stale attempt is ignored, got {other:?}"),
    }
    assert_eq!(rig.step("first").await.state, StepState::Running);

    let decided = rig.scheduler.decide_reply(&reply, &request.reply_to, &queue, delivery.lease_token).await;
    assert!(matches!(decided, Some(Ok(Handled::Committed))), "{decided:?}");
    let first = rig.step("first").await;
    assert_eq!(first.state, StepState::Completed);
    assert_eq!(first.output, Some(json!({ "done": "first" })));
    assert_eq!(rig.step("second").await.state, StepState::Running, "the next step started in the same commit");
    // The request was consumed by the decision's commit: its lease no
    // longer settles anything, and no reply went to the inbox.
    assert!(matches!(rig.store.complete(&queue, delivery.lease_token).await, Err(rota_store::Error::LeaseLost(_))));
    assert!(rig.inbox_is_empty().await, "nothing went through the inbox");
    let (_, next) = rig.request(Duration::from_secs(30)).await;
    assert_eq!(next.call.step, StepName::new("second").unwrap());
}

async fn a_reply_whose_request_lease_ran_out_decides_nothing(backend: Backend) {
    let Some(rig) = Rig::started(backend).await else { return };
    let queue = protocol::agent_queue("delay");
    let (delivery, request) = rig.request(Duration::from_secs(1)).await;
    rig.clock.advance(Duration::from_secs(2));

    let decided = rig.scheduler.decide_reply(&succeeded(&request), &request.reply_to, &queue, delivery.lease_token).await;
    match decided {
        Some(Err(Error::Store(err))) if err.is_lost_race() => {}
        other => panic!("a lost request lease fails the decision, got {other:?}"),
    }
    let first = rig.step("first").await;
    assert_eq!((first.state, first.attempt), (StepState::Running, 1), "nothing was decided");
    assert_eq!(first.output, None);
    assert!(rig.inbox_is_empty().await);
    // The request is the next holder's, delivered again.
    let (again, redelivered) = rig.request(Duration::from_secs(30)).await;
    assert_eq!(redelivered.call.step.as_str(), "first");
    assert_eq!(again.delivery_count, 2);
}

async fn a_scheduler_that_gave_its_tasks_back_decides_nothing(backend: Backend) {
    let Some(rig) = Rig::started(backend).await else { return };
    let queue = protocol::agent_queue("delay");
    let (delivery, request) = rig.request(Duration::from_secs(30)).await;
    let shutdown = Shutdown::new();
    let running = tokio::spawn(rig.scheduler.clone().run(shutdown.clone()));
    shutdown.trigger();
    running.await.unwrap().unwrap();

    assert!(rig.scheduler.decide_reply(&succeeded(&request), &request.reply_to, &queue, delivery.lease_token).await.is_none());
    assert_eq!(rig.step("first").await.state, StepState::Running);
}

on_each_backend!(
    a_reply_decided_in_process_commits_with_the_consumption_of_its_request,
    a_reply_whose_request_lease_ran_out_decides_nothing,
    a_scheduler_that_gave_its_tasks_back_decides_nothing,
);
