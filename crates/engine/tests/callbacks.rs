//! Callback steps end to end, on each backend: the agent's request carries
//! the attempt's token (which the stored input does not), a callback with
//! it completes the step and later steps read its output, and a callback
//! is refused without changing anything when its token is forged, used, or
//! its attempt timed out or was replaced; a failure callback is counted
//! like an agent's failure, and the retry gets a new token.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rota_agent::{Agent, Request, StepError};
use rota_engine::callback::{Accepted, Outcome, Refusal, TOKEN_PLACEHOLDER};
use rota_engine::engine::Config;
use rota_engine::{Client, Engine, Shutdown, Submission, ops};
use rota_model::{ExhaustedPolicy, InstanceId, RetryPolicy, StepName, StepState, SystemClock, TaskId, TaskState, WorkflowName};
use rota_store::{EventKind, SharedStore, TaskRecord};
use rota_workflow::{AgentCatalog, StepDef, Workflow};
use serde_json::{Value, json};

use common::{Backend, TestStore};

/// A request of the `payout` step: task, attempt, token, input as sent.
type Sent = (TaskId, u32, Option<String>, Value);

/// The requests of the `payout` step.
#[derive(Default)]
struct Service {
    requests: Mutex<Vec<Sent>>,
}

#[async_trait]
impl Agent for Service {
    fn name(&self) -> &str {
        "service"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        if request.step.as_str() == "payout" {
            let sent = (request.task_id.clone(), request.attempt, request.callback_token.clone(), request.input.clone());
            self.requests.lock().unwrap().push(sent);
            return Ok(json!({ "accepted": true }));
        }
        Ok(request.input.clone())
    }
}

/// payout (completed by a callback, waiting `timeout`) → receipt, which
/// reads the callback's output.
fn payout(timeout: Duration) -> Workflow {
    let catalog = AgentCatalog::builtin().with(rota_workflow::AgentName::new("service").unwrap());
    let once = RetryPolicy::new(1, Duration::from_millis(10), Duration::from_millis(10)).unwrap();
    Workflow::builder("payout", 1)
        .max_failures(2)
        .on_exhausted(ExhaustedPolicy::Error)
        .step(
            StepDef::new("payout", "service")
                .callback()
                .timeout(timeout)
                .retry(once.clone())
                .with_input(json!({ "token": "{{ callback.token }}" })),
        )
        .step(StepDef::new("receipt", "service").retry(once).with_input(json!({ "paid": "{{ steps.payout.output.id }}" })))
        .build(&catalog)
        .unwrap()
}

struct Setup {
    _db: TestStore,
    store: SharedStore,
    service: Arc<Service>,
    client: Client,
    shutdown: Shutdown,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.shutdown.trigger();
    }
}

async fn setup(backend: Backend, timeout: Duration) -> Option<Setup> {
    let db = common::open(backend, Arc::new(SystemClock)).await?;
    let store = db.store.clone();
    let service = Arc::new(Service::default());
    let mut config = Config::new(InstanceId::new("test-1").unwrap());
    config.supervisor.interval = Duration::from_millis(50);
    config.supervisor.leader_ttl = Duration::from_secs(1);
    let engine = Engine::new(store.clone(), Arc::new(SystemClock), config).agent(service.clone()).workflow(payout(timeout));
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    let shutdown = Shutdown::new();
    tokio::spawn(engine.run(shutdown.clone()));
    Some(Setup { _db: db, store, service, client, shutdown })
}

impl Setup {
    async fn submit(&self, id: &str) -> TaskId {
        let submission = Submission::new(WorkflowName::new("payout").unwrap(), json!({})).with_id(TaskId::new(id).unwrap());
        self.client.submit(submission).await.unwrap().id
    }

    async fn record(&self, id: &TaskId) -> TaskRecord {
        self.store.task(id).await.unwrap().unwrap()
    }

    /// The token of attempt `attempt` of the payout step, once its request
    /// reached the service and its acceptance was recorded.
    async fn token(&self, id: &TaskId, attempt: u32) -> String {
        for _ in 0..400 {
            let sent = self.service.requests.lock().unwrap().iter().find(|(t, a, _, _)| t == id && *a == attempt).cloned();
            let accepted = self
                .store
                .history(id)
                .await
                .unwrap()
                .iter()
                .any(|e| e.kind == EventKind::Callback && e.attempt == Some(attempt) && e.detail["outcome"] == "accepted");
            if let (Some((_, _, token, input)), true) = (sent, accepted) {
                let token = token.expect("a callback step's request carries its token");
                assert_eq!(input, json!({ "token": token }), "the template rendered the same token");
                return token;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("attempt {attempt} of payout never reached the service");
    }

    async fn wait_for(&self, id: &TaskId, state: TaskState) -> TaskRecord {
        for _ in 0..400 {
            let record = self.record(id).await;
            if record.task.state == state {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("task {id} never reached {state:?}: {:?}", self.record(id).await);
    }
}

fn step<'r>(record: &'r TaskRecord, name: &str) -> &'r rota_model::Step {
    record.steps.iter().find(|s| s.name.as_str() == name).unwrap()
}

fn refusal(err: ops::Error) -> Refusal {
    match err {
        ops::Error::Callback(why) => why,
        other => panic!("expected a callback refusal, got {other}"),
    }
}

async fn a_callback_completes_its_attempt_once(backend: Backend) {
    let Some(setup) = setup(backend, Duration::from_secs(60)).await else { return };
    let id = setup.submit("p-1").await;
    let token = setup.token(&id, 1).await;
    let waiting = setup.record(&id).await;
    let payout = step(&waiting, "payout");
    assert_eq!((payout.state, payout.input.clone()), (StepState::Running, Some(json!({ "token": TOKEN_PLACEHOLDER }))));
    assert!(payout.callback_digest.as_ref().is_some_and(|d| d.len() == 64 && !token.contains(d.as_str())), "only a digest is stored");

    // A forged secret is unknown, and changes nothing.
    let (head, _) = token.rsplit_once('.').unwrap();
    let forged = format!("{head}.{}", "0".repeat(32));
    let err = setup.client.callback(&forged, Outcome::Succeeded { output: json!(1) }, "test").await.unwrap_err();
    assert_eq!(refusal(err), Refusal::Unknown);
    assert_eq!(setup.record(&id).await, waiting);

    let accepted = setup.client.callback(&token, Outcome::Succeeded { output: json!({ "id": "po-1" }) }, "test").await.unwrap();
    let expected = Accepted { task: id.clone(), step: StepName::new("payout").unwrap(), attempt: 1, completed: true };
    assert_eq!(accepted, expected);
    let done = setup.wait_for(&id, TaskState::Processed).await;
    assert_eq!(step(&done, "payout").output, Some(json!({ "id": "po-1" })));
    assert_eq!(step(&done, "receipt").output, Some(json!({ "paid": "po-1" })), "the next step read the callback's output");
    let history = setup.store.history(&id).await.unwrap();
    let callbacks: Vec<(&str, &str)> = history
        .iter()
        .filter(|e| e.kind == EventKind::Callback)
        .map(|e| (e.detail["outcome"].as_str().unwrap(), e.detail["sent_by"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(callbacks, [("accepted", ""), ("succeeded", "test")]);

    // Used: refused, nothing changes.
    let err = setup.client.callback(&token, Outcome::Succeeded { output: json!({ "id": "po-2" }) }, "test").await.unwrap_err();
    assert_eq!(err.to_string(), "callback: step payout of task p-1: task p-1 is processed; the callback changes nothing");
    assert_eq!(setup.record(&id).await, done);
    assert_eq!(setup.store.history(&id).await.unwrap().len(), history.len());
}

async fn a_timed_out_or_replaced_attempt_refuses_its_callback(backend: Backend) {
    let Some(setup) = setup(backend, Duration::from_millis(300)).await else { return };
    let id = setup.submit("p-2").await;
    let first = setup.token(&id, 1).await;
    // No callback: the attempt times out and the retry carries a new token.
    let second = setup.token(&id, 2).await;
    assert_ne!(first, second);
    let before = setup.record(&id).await;
    let err = setup.client.callback(&first, Outcome::Succeeded { output: json!({ "id": "late" }) }, "test").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "callback: step payout of task p-2: attempt 1 is over (the step is at attempt 2); the callback changes nothing"
    );
    // The second times out too: the task ends at its failure threshold.
    let failed = setup.wait_for(&id, TaskState::Error).await;
    assert!(failed.task.error.as_deref().unwrap().contains("got no callback before its complete-by"), "{:?}", failed.task.error);
    let err = setup.client.callback(&second, Outcome::Succeeded { output: json!({ "id": "late" }) }, "test").await.unwrap_err();
    assert!(matches!(refusal(err), Refusal::NotCurrent { .. }));
    assert_eq!(setup.record(&id).await, failed, "a late callback changes nothing");
    assert_eq!(step(&before, "payout").attempt, 2);
}

async fn a_failed_callback_counts_as_a_failure_and_the_retry_gets_a_new_token(backend: Backend) {
    let Some(setup) = setup(backend, Duration::from_secs(60)).await else { return };
    let id = setup.submit("p-3").await;
    let first = setup.token(&id, 1).await;
    let failed = Outcome::Failed { error: "the bank is down".into(), retryable: true };
    let accepted = setup.client.callback(&first, failed.clone(), "test").await.unwrap();
    assert!(!accepted.completed);
    let err = setup.client.callback(&first, failed, "test").await.unwrap_err();
    assert!(matches!(refusal(err), Refusal::NotCurrent { .. }), "the failure used the token");
    let second = setup.token(&id, 2).await;
    let record = setup.record(&id).await;
    assert_eq!(record.task.failure_count, 1, "counted like an agent's failure");
    assert!(step(&record, "payout").last_error.as_deref().unwrap().contains("the bank is down"));
    setup.client.callback(&second, Outcome::Succeeded { output: json!({ "id": "po-3" }) }, "test").await.unwrap();
    setup.wait_for(&id, TaskState::Processed).await;

    // A permanent failure ends the task at once.
    let id = setup.submit("p-4").await;
    let token = setup.token(&id, 1).await;
    setup.client.callback(&token, Outcome::Failed { error: "account closed".into(), retryable: false }, "test").await.unwrap();
    let ended = setup.wait_for(&id, TaskState::Error).await;
    assert!(ended.task.error.as_deref().unwrap().contains("account closed"));
    assert_eq!(ended.task.failure_count, 0, "a permanent failure is not a transient one");
}

on_each_backend!(
    a_callback_completes_its_attempt_once,
    a_timed_out_or_replaced_attempt_refuses_its_callback,
    a_failed_callback_counts_as_a_failure_and_the_retry_gets_a_new_token,
);
