//! Recovery paths of the pattern, end to end on a real store (each test runs
//! on SQLite and on PostgreSQL) in real time (short timeouts): agents that go silent, a Scheduler that dies, the
//! failure threshold, two Supervisors, and the operator's cancel and
//! resubmit.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rota_agent::{Agent, Request, StepError};
use rota_engine::engine::Config;
use rota_engine::ops::Operator;
use rota_engine::supervisor::{self, Supervisor};
use rota_engine::{Completions, Engine, Roles, Shutdown, Submission, Workflows};
use rota_model::{ExhaustedPolicy, InstanceId, RetryPolicy, StepState, SystemClock, TaskId, TaskState, WorkflowName};
use rota_store::{EventKind, SharedStore};
use rota_workflow::{AgentCatalog, AgentName, CompensateDef, StepDef, Workflow};
use serde_json::{Value, json};

use common::{Backend, TestStore};

/// An agent whose behaviour per (step, attempt) is scripted: hang past the
/// deadline, fail, or succeed. It counts calls per step.
#[derive(Default)]
struct Scripted {
    hang: Mutex<HashMap<(String, u32), ()>>,
    hang_always: Mutex<Vec<String>>,
    calls: Mutex<Vec<(String, bool, u32)>>,
    block: AtomicBool,
}

#[rota_engine::async_trait]
impl Agent for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        let step = request.step.to_string();
        self.calls.lock().unwrap().push((step.clone(), request.compensate, request.attempt));
        let hang = self.hang.lock().unwrap().contains_key(&(step.clone(), request.attempt))
            || (!request.compensate && self.hang_always.lock().unwrap().contains(&step))
            || (self.block.load(Ordering::SeqCst) && !request.compensate);
        if hang {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        Ok(json!({ "step": step, "attempt": request.attempt }))
    }
}

struct Rig {
    _db: TestStore,
    store: SharedStore,
    agent: Arc<Scripted>,
}

async fn rig(backend: Backend) -> Option<Rig> {
    let db = common::open(backend, Arc::new(SystemClock)).await?;
    Some(Rig { store: db.store.clone(), _db: db, agent: Arc::new(Scripted::default()) })
}

fn quick_recovery() -> RetryPolicy {
    RetryPolicy::new(100, Duration::from_millis(50), Duration::from_millis(100)).unwrap()
}

fn config(instance: &str, roles: Roles) -> Config {
    let mut config = Config::new(InstanceId::new(instance).unwrap());
    config.roles = roles;
    config.scheduler.recovery = quick_recovery();
    config.scheduler.claim_wait = Duration::from_millis(100);
    config.supervisor.recovery = quick_recovery();
    config.supervisor.interval = Duration::from_millis(50);
    config.supervisor.leader_ttl = Duration::from_millis(500);
    config
}

/// The timeout of the step a test makes hang: short, so that the Supervisor
/// finds it soon.
const HANGS_TIMEOUT: Duration = Duration::from_millis(300);
/// The timeout of the other steps and of every compensation, which the
/// agent answers at once: far above a round trip through the queues on a
/// loaded machine. At 300 ms, such a step or compensation timed out too
/// under load, and the task took a path the test did not expect (step a
/// settled in doubt in place of b, or two missed compensations of a ending
/// the task in Error).
const ANSWERS_TIMEOUT: Duration = Duration::from_secs(10);

/// Steps a, b, c (a and b with compensations); only `hanging` (a step the
/// test makes hang in some of its attempts) times out quickly.
fn workflow(hanging: &str, max_failures: u32, policy: ExhaustedPolicy, deadline: Duration) -> Workflow {
    let once = RetryPolicy::new(1, Duration::from_millis(10), Duration::from_millis(10)).unwrap();
    let step = |name: &str| {
        let timeout = if name == hanging { HANGS_TIMEOUT } else { ANSWERS_TIMEOUT };
        StepDef::new(name, "scripted").timeout(timeout).retry(once.clone())
    };
    let compensation = || CompensateDef::new("scripted").timeout(ANSWERS_TIMEOUT);
    Workflow::builder("flow", 1)
        .deadline(deadline)
        .max_failures(max_failures)
        .on_exhausted(policy)
        .step(step("a").compensate(compensation()))
        .step(step("b").compensate(compensation()))
        .step(step("c"))
        .build(&AgentCatalog::builtin().with(AgentName::new("scripted").unwrap()))
        .unwrap()
}

async fn with_engine<F, Fut>(rig: &Rig, workflow: Workflow, body: F) -> TaskId
where
    F: FnOnce(rota_engine::Client) -> Fut,
    Fut: std::future::Future<Output = TaskId>,
{
    let engine =
        Engine::new(rig.store.clone(), Arc::new(SystemClock), config("solo", Roles::ALL)).agent(rig.agent.clone()).workflow(workflow);
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    let shutdown = Shutdown::new();
    let running = tokio::spawn(engine.run(shutdown.clone()));
    let id = body(client).await;
    shutdown.trigger();
    running.await.unwrap().unwrap();
    id
}

fn flow() -> WorkflowName {
    WorkflowName::new("flow").unwrap()
}

async fn kinds(store: &SharedStore, id: &TaskId) -> Vec<EventKind> {
    store.history(id).await.unwrap().into_iter().map(|e| e.kind).collect()
}

async fn a_silent_agent_is_recovered_by_the_supervisor_and_the_step_retried(backend: Backend) {
    let Some(rig) = rig(backend).await else { return };
    rig.agent.hang.lock().unwrap().insert(("b".into(), 1), ());
    let store = rig.store.clone();
    let id = with_engine(&rig, workflow("b", 3, ExhaustedPolicy::Error, Duration::from_secs(30)), |client| async move {
        let id = client.submit(Submission::new(flow(), json!({}))).await.unwrap().id;
        assert_eq!(client.wait(&id, Duration::from_secs(20)).await.unwrap(), TaskState::Processed);
        id
    })
    .await;
    let record = store.task(&id).await.unwrap().unwrap();
    assert_eq!(record.task.failure_count, 1, "the timeout counted once");
    let attempts: HashMap<String, u32> = record.steps.iter().map(|s| (s.name.to_string(), s.attempt)).collect();
    assert_eq!(attempts, HashMap::from([("a".into(), 1), ("b".into(), 2), ("c".into(), 1)]));
    let calls = rig.agent.calls.lock().unwrap().clone();
    assert_eq!(calls.iter().filter(|c| c.0 == "a").count(), 1, "a completed step never runs again");
    let history = kinds(&store, &id).await;
    assert_eq!(history.iter().filter(|k| **k == EventKind::StepCompleted).count(), 3);
    assert!(history.contains(&EventKind::StepFailed), "the timeout is in the history: {history:?}");
}

async fn at_the_failure_threshold_the_task_ends_in_error_with_an_alert(backend: Backend) {
    let Some(rig) = rig(backend).await else { return };
    rig.agent.hang_always.lock().unwrap().push("b".into());
    let store = rig.store.clone();
    let id = with_engine(&rig, workflow("b", 2, ExhaustedPolicy::Error, Duration::from_secs(30)), |client| async move {
        let id = client.submit(Submission::new(flow(), json!({}))).await.unwrap().id;
        assert_eq!(client.wait(&id, Duration::from_secs(20)).await.unwrap(), TaskState::Error);
        id
    })
    .await;
    let record = store.task(&id).await.unwrap().unwrap();
    assert_eq!(record.task.failure_count, 2);
    assert!(record.task.error.as_deref().unwrap().contains("failure 2 of 2"), "{:?}", record.task.error);
    assert!(store.alerts(10).await.unwrap()[0].detail["reason"].as_str().unwrap().contains("failure threshold 2 reached"));
    let alerts = store.alerts(10).await.unwrap();
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0].task_id, id);
}

async fn at_the_threshold_with_compensate_the_completed_steps_are_undone_in_reverse(backend: Backend) {
    let Some(rig) = rig(backend).await else { return };
    rig.agent.hang_always.lock().unwrap().push("c".into());
    let store = rig.store.clone();
    let id = with_engine(&rig, workflow("c", 2, ExhaustedPolicy::Compensate, Duration::from_secs(30)), |client| async move {
        let id = client.submit(Submission::new(flow(), json!({}))).await.unwrap().id;
        assert_eq!(client.wait(&id, Duration::from_secs(20)).await.unwrap(), TaskState::Compensated);
        id
    })
    .await;
    let compensations: Vec<String> = rig.agent.calls.lock().unwrap().iter().filter(|c| c.1).map(|c| c.0.clone()).collect();
    assert_eq!(compensations, ["b", "a"], "reverse order of completion");
    let record = store.task(&id).await.unwrap().unwrap();
    let states: HashMap<String, StepState> = record.steps.iter().map(|s| (s.name.to_string(), s.state)).collect();
    assert_eq!(states["a"], StepState::Compensated);
    assert_eq!(states["b"], StepState::Compensated);
}

async fn a_dead_schedulers_task_is_taken_over_after_its_deadline(backend: Backend) {
    let Some(rig) = rig(backend).await else { return };
    let wf = workflow("b", 3, ExhaustedPolicy::Error, Duration::from_millis(1_500));
    // The agents and the Supervisor run in their own engine throughout. The
    // Supervisor takes one expired record per round: step b's attempt
    // expires before the task's deadline, so it comes first every round,
    // and must not starve the task's own expiry.
    let mut support_config = config("support", Roles { scheduler: false, agents: true, supervisor: true });
    support_config.supervisor.batch = 1;
    let support = Engine::new(rig.store.clone(), Arc::new(SystemClock), support_config).agent(rig.agent.clone()).workflow(wf.clone());
    support.register_workflows().await.unwrap();
    let client = support.client();
    let shutdown = Shutdown::new();
    let supporting = tokio::spawn(support.run(shutdown.clone()));

    // Scheduler 1 claims the task; step b hangs, and then scheduler 1 dies.
    rig.agent.block.store(false, Ordering::SeqCst);
    rig.agent.hang.lock().unwrap().insert(("b".into(), 1), ());
    let first = Engine::new(
        rig.store.clone(),
        Arc::new(SystemClock),
        config("scheduler-1", Roles { scheduler: true, agents: false, supervisor: false }),
    );
    let first_shutdown = Shutdown::new();
    let first_running = tokio::spawn(first.run(first_shutdown.clone()));
    let id = client.submit(Submission::new(flow(), json!({}))).await.unwrap().id;
    let mut waited = 0;
    loop {
        let record = rig.store.task(&id).await.unwrap().unwrap();
        if record.steps.iter().any(|s| s.name.as_str() == "b" && s.state == StepState::Running) {
            assert_eq!(record.task.locked_by.as_ref().map(|i| i.as_str()), Some("scheduler-1"));
            break;
        }
        waited += 1;
        assert!(waited < 200, "step b never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first_running.abort(); // a crash: no graceful shutdown, its lease stays
    let _ = first_running.await;

    let second = Engine::new(
        rig.store.clone(),
        Arc::new(SystemClock),
        config("scheduler-2", Roles { scheduler: true, agents: false, supervisor: false }),
    );
    let second_shutdown = Shutdown::new();
    let second_running = tokio::spawn(second.run(second_shutdown.clone()));
    let state = client.wait(&id, Duration::from_secs(20)).await.unwrap();
    if state != TaskState::Processed {
        let record = rig.store.task(&id).await.unwrap().unwrap();
        let history = rig.store.history(&id).await.unwrap();
        let stats = rig.store.stats().await.unwrap();
        panic!("not processed: {record:#?}\n{history:#?}\n{stats:#?}");
    }
    second_shutdown.trigger();
    second_running.await.unwrap().unwrap();
    shutdown.trigger();
    supporting.await.unwrap().unwrap();
    first_shutdown.trigger();

    let history = rig.store.history(&id).await.unwrap();
    let claims: Vec<String> =
        history.iter().filter(|e| e.kind == EventKind::Claimed).map(|e| e.detail["owner"].as_str().unwrap().to_string()).collect();
    assert_eq!(claims, ["scheduler-1", "scheduler-2"], "taken over once, after the deadline");
    assert!(history.iter().any(|e| e.kind == EventKind::Expired), "the Supervisor expired the dead Scheduler's lease");
    let completed: Vec<String> =
        history.iter().filter(|e| e.kind == EventKind::StepCompleted).map(|e| e.step.as_ref().unwrap().to_string()).collect();
    assert_eq!(completed, ["a", "b", "c"], "each step completed once");
    let a_calls = rig.agent.calls.lock().unwrap().iter().filter(|c| c.0 == "a").count();
    assert_eq!(a_calls, 1, "the step completed before the crash is not run again");
}

async fn of_two_supervisors_only_one_leads(backend: Backend) {
    let Some(rig) = rig(backend).await else { return };
    let workflows = Workflows::new(rig.store.clone());
    let make = |name: &str| {
        let mut cfg = supervisor::Config::new(InstanceId::new(name).unwrap());
        cfg.leader_ttl = Duration::from_secs(5);
        Supervisor::new(rig.store.clone(), Arc::new(SystemClock), workflows.clone(), Completions::default(), cfg).unwrap()
    };
    let (one, two) = (make("sup-1"), make("sup-2"));
    let (a, b) = tokio::join!(one.run_once(), two.run_once());
    let leaders = [a.unwrap().leader, b.unwrap().leader];
    assert_eq!(leaders.iter().filter(|l| **l).count(), 1, "exactly one leads: {leaders:?}");
    let (a, b) = tokio::join!(one.run_once(), two.run_once());
    assert_eq!([a.unwrap().leader, b.unwrap().leader], leaders, "leadership is sticky while renewed");
}

async fn cancel_compensates_what_completed_and_resubmit_runs_a_failed_task_again(backend: Backend) {
    let Some(rig) = rig(backend).await else { return };
    rig.agent.block.store(false, Ordering::SeqCst);
    rig.agent.hang_always.lock().unwrap().push("b".into());
    let store = rig.store.clone();
    let agent = rig.agent.clone();
    with_engine(&rig, workflow("b", 1, ExhaustedPolicy::Error, Duration::from_secs(30)), |client| async move {
        // Cancel while b hangs: a completed and has a compensation.
        let id = client.submit(Submission::new(flow(), json!({}))).await.unwrap().id;
        loop {
            let record = client.status(&id).await.unwrap().unwrap();
            if record.steps.iter().any(|s| s.name.as_str() == "b" && s.state == StepState::Running) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let too_long = "x".repeat(rota_engine::pause::REASON_CHARS_MAX + 1);
        let refused = client.cancel(&id, Operator { by: "ana", reason: Some(&too_long) }).await.expect_err("a reason too long");
        assert_eq!(refused.to_string(), "reason: is 1001 characters long, more than the 1000 accepted");
        let cancelled = client.cancel(&id, Operator { by: "ana", reason: Some("customer asked") }).await.unwrap();
        assert_eq!(cancelled, TaskState::Compensating);
        assert_eq!(client.wait(&id, Duration::from_secs(20)).await.unwrap(), TaskState::Compensated);
        let history = client.history(&id).await.unwrap();
        let event = history.iter().find(|e| e.kind == EventKind::Cancelled).expect("a cancelled event");
        assert_eq!(event.detail, json!({"compensate": true, "by": "ana", "reason": "customer asked"}), "who and why");
        assert!(client.cancel(&id, Operator { by: "test", reason: None }).await.is_err(), "a finished task cannot be cancelled");

        // A task that failed (threshold 1) runs again once resubmitted.
        let failed = client.submit(Submission::new(flow(), json!({}))).await.unwrap().id;
        assert_eq!(client.wait(&failed, Duration::from_secs(20)).await.unwrap(), TaskState::Error);
        agent.hang_always.lock().unwrap().clear();
        // The answer is the task as the resubmit left it, whatever the
        // Scheduler did since.
        let resubmitted = client.resubmit(&failed, None, Operator { by: "bo", reason: Some("the service is back") }).await.unwrap().record;
        assert_eq!(resubmitted.task.state, TaskState::Pending);
        assert!(resubmitted.steps.iter().all(|step| step.state != StepState::Failed), "{:?}", resubmitted.steps);
        assert_eq!(client.wait(&failed, Duration::from_secs(20)).await.unwrap(), TaskState::Processed);
        let history = client.history(&failed).await.unwrap();
        let event = history.iter().find(|e| e.kind == EventKind::Resubmitted).expect("a resubmitted event");
        assert_eq!((&event.detail["by"], &event.detail["reason"]), (&json!("bo"), &json!("the service is back")), "who and why");
        assert!(
            client.resubmit(&failed, None, Operator { by: "test", reason: None }).await.is_err(),
            "only a failed task can be resubmitted"
        );
        failed
    })
    .await;
    let _ = store;
}

async fn a_graceful_stop_gives_held_tasks_back_at_once(backend: Backend) {
    let Some(rig) = rig(backend).await else { return };
    // A long deadline: if the task were not given back, the takeover would
    // wait for the Supervisor far longer than this test runs.
    let wf = workflow("b", 3, ExhaustedPolicy::Error, Duration::from_secs(600));
    let support = Engine::new(
        rig.store.clone(),
        Arc::new(SystemClock),
        config("support", Roles { scheduler: false, agents: true, supervisor: true }),
    )
    .agent(rig.agent.clone())
    .workflow(wf);
    support.register_workflows().await.unwrap();
    let client = support.client();
    let shutdown = Shutdown::new();
    let supporting = tokio::spawn(support.run(shutdown.clone()));

    rig.agent.hang.lock().unwrap().insert(("b".into(), 1), ());
    let first = Engine::new(
        rig.store.clone(),
        Arc::new(SystemClock),
        config("scheduler-1", Roles { scheduler: true, agents: false, supervisor: false }),
    );
    let first_shutdown = Shutdown::new();
    let first_running = tokio::spawn(first.run(first_shutdown.clone()));
    let id = client.submit(Submission::new(flow(), json!({}))).await.unwrap().id;
    loop {
        let record = rig.store.task(&id).await.unwrap().unwrap();
        if record.steps.iter().any(|s| s.name.as_str() == "b" && s.state == StepState::Running) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first_shutdown.trigger();
    first_running.await.unwrap().unwrap();
    let record = rig.store.task(&id).await.unwrap().unwrap();
    assert_eq!((record.task.state, record.task.locked_by.clone()), (TaskState::Pending, None), "given back, claimable at once");
    assert!(kinds(&rig.store, &id).await.contains(&EventKind::Released));

    let second = Engine::new(
        rig.store.clone(),
        Arc::new(SystemClock),
        config("scheduler-2", Roles { scheduler: true, agents: false, supervisor: false }),
    );
    let second_shutdown = Shutdown::new();
    let second_running = tokio::spawn(second.run(second_shutdown.clone()));
    assert_eq!(client.wait(&id, Duration::from_secs(20)).await.unwrap(), TaskState::Processed);
    second_shutdown.trigger();
    second_running.await.unwrap().unwrap();
    shutdown.trigger();
    supporting.await.unwrap().unwrap();
    let record = rig.store.task(&id).await.unwrap().unwrap();
    assert_eq!(record.task.failure_count, 0, "a release is not a failure");
    let a_calls = rig.agent.calls.lock().unwrap().iter().filter(|c| c.0 == "a").count();
    assert_eq!(a_calls, 1, "the completed step is not run again");
}

async fn a_step_that_timed_out_for_good_is_compensated_in_case_its_effect_landed(backend: Backend) {
    let Some(rig) = rig(backend).await else { return };
    rig.agent.hang_always.lock().unwrap().push("b".into());
    let store = rig.store.clone();
    let id = with_engine(&rig, workflow("b", 2, ExhaustedPolicy::Compensate, Duration::from_secs(30)), |client| async move {
        let id = client.submit(Submission::new(flow(), json!({}))).await.unwrap().id;
        assert_eq!(client.wait(&id, Duration::from_secs(20)).await.unwrap(), TaskState::Compensated);
        id
    })
    .await;
    let compensations: Vec<String> = rig.agent.calls.lock().unwrap().iter().filter(|c| c.1).map(|c| c.0.clone()).collect();
    assert_eq!(compensations, ["b", "a"], "the in-doubt step first, then the completed one");
    let history = store.history(&id).await.unwrap();
    assert!(history.iter().any(|e| e.kind == EventKind::StepFailed && e.detail["in_doubt"] == json!(true)), "the doubt is in the history");
}

on_each_backend!(
    a_silent_agent_is_recovered_by_the_supervisor_and_the_step_retried,
    at_the_failure_threshold_the_task_ends_in_error_with_an_alert,
    at_the_threshold_with_compensate_the_completed_steps_are_undone_in_reverse,
    a_dead_schedulers_task_is_taken_over_after_its_deadline,
    of_two_supervisors_only_one_leads,
    cancel_compensates_what_completed_and_resubmit_runs_a_failed_task_again,
    a_graceful_stop_gives_held_tasks_back_at_once,
    a_step_that_timed_out_for_good_is_compensated_in_case_its_effect_landed,
);
