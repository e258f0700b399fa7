//! Agents at work: a competing consumer of one agent's queue that runs
//! each step request through [`rota_agent::run_until_deadline`] and replies
//! to the requesting Scheduler.
//!
//! The reply and the consumption of the request commit together, so a
//! request is either answered or still queued, never both lost. Once the
//! request's complete-by has passed the agent stops and sends nothing, not
//! even an error: by then the Supervisor may already have asked for another
//! attempt, and the Scheduler's fence would refuse the reply anyway.
//!
//! The rules that every agent follows, built-in or external (the HTTP
//! worker protocol of `rota-api` calls them too), are public functions:
//! [`too_late`] (the deadline) and [`commit_reply`] (the reply message and
//! its commit with the request's completion).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rota_agent::{Agent, Outcome as CallOutcome};
use rota_model::{Clock, InstanceId, LeaseToken, QueueName, StepName, TaskId, Timestamp};
use rota_store::{Changes, Delivery, Outgoing, SharedStore};

use crate::consumer::{self, Consumer, Handler, Outcome};
use crate::protocol::{self, InboxEnvelope, InboxMessage, Reply, ReplyOutcome, StepRequest};
use crate::telemetry;
use crate::{Result, Shutdown};
use tracing::Instrument;

/// Settings of the workers of one agent.
#[derive(Debug, Clone)]
pub struct Config {
    /// This instance (the lease owner of the requests it takes).
    pub instance: InstanceId,
    /// How many requests run at once (MaxConcurrentCalls).
    pub max_concurrent: usize,
    /// The seed of the retry jitter (mixed with each request's identity).
    pub seed: u64,
    /// How long calls in progress may take to finish at shutdown; then
    /// they are cancelled and their requests given back.
    pub shutdown_grace: Duration,
}

/// Runs one agent on its queue.
pub struct AgentWorker {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    agent: Arc<dyn Agent>,
    queue: QueueName,
    config: Config,
}

impl AgentWorker {
    /// A worker for `agent`, consuming `agent.<name>`.
    pub fn new(store: SharedStore, clock: Arc<dyn Clock>, agent: Arc<dyn Agent>, config: Config) -> Self {
        let queue = protocol::agent_queue(agent.name());
        AgentWorker { store, clock, agent, queue, config }
    }

    /// Consumes the agent's queue until `shutdown`.
    pub async fn run(self, shutdown: Shutdown) -> Result<()> {
        let consumer_config = consumer::Config::builder(self.queue.clone(), self.config.instance.clone())
            .max_concurrent(self.config.max_concurrent)
            .shutdown_grace(self.config.shutdown_grace)
            .build()?;
        let consumer = Consumer::new(self.store.clone(), consumer_config);
        consumer.run(Arc::new(self), shutdown).await.map(|_| ())
    }

    /// Handles one request: calls the agent and replies (or stays silent).
    pub async fn serve(&self, request: &StepRequest, delivery: &Delivery) -> Outcome {
        if too_late(request.complete_by(), self.clock.now()) {
            tracing::debug!("request {} arrived after its complete-by: dropped without reply", delivery.id);
            return Outcome::Complete;
        }
        let mut rng = StdRng::seed_from_u64(self.request_seed(request));
        let started = std::time::Instant::now();
        let outcome = rota_agent::run_until_deadline(&*self.agent, &request.call, &request.retry, &*self.clock, &mut rng).await;
        record_call(self.agent.name(), &outcome, started.elapsed());
        let reply_outcome = match outcome {
            CallOutcome::Succeeded(output) => ReplyOutcome::Succeeded { output },
            CallOutcome::Failed { message, retryable, .. } => ReplyOutcome::Failed { error: message, retryable },
            CallOutcome::DeadlinePassed { .. } => return Outcome::Complete,
        };
        match commit_reply(&self.store, &self.queue, delivery.lease_token, &ReplyAddress::of(request), reply_outcome).await {
            Ok(()) => Outcome::Settled,
            // The request's lease ran out while we worked: it is (or will be)
            // someone else's, and its reply is theirs to send.
            Err(rota_store::Error::LeaseLost(_)) => Outcome::Settled,
            Err(err) => Outcome::Abandon { delay: Duration::from_secs(1), reason: format!("could not record the reply: {err}") },
        }
    }

    fn request_seed(&self, request: &StepRequest) -> u64 {
        let mut hasher = DefaultHasher::new();
        (self.config.seed, request.call.task_id.as_str(), request.call.step.as_str(), request.call.attempt).hash(&mut hasher);
        hasher.finish()
    }
}

/// Records an agent call's metrics: its outcome and how long it took (in
/// wall time: a call's latency is about the remote service, whatever the
/// engine's clock says).
fn record_call(agent: &str, outcome: &CallOutcome, took: Duration) {
    let label = match outcome {
        CallOutcome::Succeeded(_) => "succeeded",
        CallOutcome::Failed { retryable: false, .. } => "failed",
        CallOutcome::Failed { retryable: true, .. } => "retryable",
        CallOutcome::DeadlinePassed { .. } => "deadline_passed",
    };
    metrics::counter!(telemetry::AGENT_CALLS, "agent" => agent.to_owned(), "outcome" => label).increment(1);
    metrics::histogram!(telemetry::AGENT_CALL_DURATION, "agent" => agent.to_owned(), "outcome" => label).record(took.as_secs_f64());
}

/// Whether a request due by `complete_by` is too late to answer at `now`:
/// from its complete-by on, an agent stops and sends nothing, not even an
/// error (the Supervisor may already have asked for another attempt).
pub fn too_late(complete_by: Timestamp, now: Timestamp) -> bool {
    now >= complete_by
}

/// Whom a reply answers and where it goes: the parts of a [`StepRequest`]
/// that its reply needs. External workers (the HTTP worker protocol of
/// `rota-api`) carry it in their lease token instead of the whole request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyAddress {
    /// The task.
    pub task_id: TaskId,
    /// The step.
    pub step: StepName,
    /// The attempt answered: the Scheduler's fence.
    pub attempt: u32,
    /// Whether the request was the step's compensation.
    pub compensate: bool,
    /// The Scheduler inbox the reply goes to.
    pub reply_to: QueueName,
}

impl ReplyAddress {
    /// The address of the reply to `request`.
    pub fn of(request: &StepRequest) -> Self {
        let call = &request.call;
        ReplyAddress {
            task_id: call.task_id.clone(),
            step: call.step.clone(),
            attempt: call.attempt,
            compensate: call.compensate,
            reply_to: request.reply_to.clone(),
        }
    }
}

/// The changes that answer a request: the reply to `address` with
/// `outcome`, sent to the Scheduler's inbox keyed by the task, and the
/// completion of the request message (leased from `queue` with `lease`).
pub fn reply_changes(queue: &QueueName, lease: LeaseToken, address: &ReplyAddress, outcome: ReplyOutcome) -> Changes {
    // The reply carries the trace context of the span it is sent from (the
    // agent call's, for the built-in agents).
    let reply = InboxEnvelope::traced(InboxMessage::Reply(Reply {
        task_id: address.task_id.clone(),
        step: address.step.clone(),
        attempt: address.attempt,
        compensate: address.compensate,
        outcome,
    }));
    let message = Outgoing::json(&reply).expect("replies serialize").with_ordering_key(address.task_id.as_str());
    Changes { send: vec![(address.reply_to.clone(), message)], complete: vec![(queue.clone(), lease)], ..Changes::default() }
}

/// Answers a request as every agent does, built-in or external: the reply
/// commits together with the request's completion ([`reply_changes`]), so
/// it is sent once per delivery; a redelivered request's second reply
/// (after a lost lease) is refused by the Scheduler's attempt fence.
///
/// Fails with [`rota_store::Error::LeaseLost`] when the request's lease ran
/// out (the request is someone else's now, and so is its reply); nothing is
/// sent then.
pub async fn commit_reply(
    store: &SharedStore,
    queue: &QueueName,
    lease: LeaseToken,
    address: &ReplyAddress,
    outcome: ReplyOutcome,
) -> rota_store::Result<()> {
    crate::replies::commit(store, reply_changes(queue, lease, address, outcome)).await
}

#[async_trait]
impl Handler for AgentWorker {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        match serde_json::from_str::<StepRequest>(delivery.body.get()) {
            Ok(request) => {
                let call = &request.call;
                let span = tracing::debug_span!("rota.agent.call", agent = self.agent.name(), task_id = %call.task_id,
                    step = %call.step, attempt = call.attempt, compensate = call.compensate);
                telemetry::set_parent(&span, request.traceparent.as_deref());
                self.serve(&request, delivery).instrument(span).await
            }
            Err(err) => Outcome::DeadLetter { reason: format!("not a step request: {err}") },
        }
    }
}
