//! Agents at work (R3): a competing consumer of one agent's queue that runs
//! each step request through [`rota_agent::run_until_deadline`] and replies
//! to the requesting Scheduler.
//!
//! The reply and the consumption of the request commit together, so a
//! request is either answered or still queued, never both lost. Once the
//! request's complete-by has passed the agent stops and sends nothing, not
//! even an error: by then the Supervisor may already have asked for another
//! attempt, and the Scheduler's fence would refuse the reply anyway.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rota_agent::{Agent, Outcome as CallOutcome};
use rota_model::{Clock, InstanceId, QueueName};
use rota_store::{Changes, Delivery, Outgoing, SharedStore};

use crate::consumer::{self, Consumer, Handler, Outcome};
use crate::protocol::{self, InboxMessage, Reply, ReplyOutcome, StepRequest};
use crate::{Result, Shutdown};

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
        if self.clock.now() >= request.complete_by() {
            tracing::debug!("request {} arrived after its complete-by: dropped without reply", delivery.id);
            return Outcome::Complete;
        }
        let mut rng = StdRng::seed_from_u64(self.request_seed(request));
        let outcome = rota_agent::run_until_deadline(&*self.agent, &request.call, &request.retry, &*self.clock, &mut rng).await;
        let reply_outcome = match outcome {
            CallOutcome::Succeeded(output) => ReplyOutcome::Succeeded { output },
            CallOutcome::Failed { message, retryable, .. } => ReplyOutcome::Failed { error: message, retryable },
            CallOutcome::DeadlinePassed { .. } => return Outcome::Complete,
        };
        let call = &request.call;
        let reply = InboxMessage::Reply(Reply {
            task_id: call.task_id.clone(),
            step: call.step.clone(),
            attempt: call.attempt,
            compensate: call.compensate,
            outcome: reply_outcome,
        });
        // The reply commits together with the request's completion, so it
        // is sent once per delivery; a redelivered request's second reply
        // (after a lost lease) is refused by the Scheduler's attempt fence.
        let message = Outgoing::json(&reply).expect("replies serialize").with_ordering_key(call.task_id.as_str());
        let changes = Changes {
            send: vec![(request.reply_to.clone(), message)],
            complete: vec![(self.queue.clone(), delivery.lease_token)],
            ..Changes::default()
        };
        match self.store.commit(changes).await {
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

#[async_trait]
impl Handler for AgentWorker {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        match serde_json::from_str::<StepRequest>(delivery.body.get()) {
            Ok(request) => self.serve(&request, delivery).await,
            Err(err) => Outcome::DeadLetter { reason: format!("not a step request: {err}") },
        }
    }
}
