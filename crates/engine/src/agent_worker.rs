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
//! A call whose task has finished meanwhile (an operator cancelled it, or
//! it ended otherwise) is stopped: nobody would read its reply. The task
//! may have been cancelled through any process sharing the store, so the
//! worker reads the tasks of its longer calls every
//! [`Config::stop_check`] ([`STOP_CHECK_DEFAULT`]); a call found so is
//! cancelled (its future dropped: the `exec` agent kills the command's
//! process group, the `http` agent drops the connection), and its request
//! is consumed without a reply together with a `call_stopped` event
//! ([`commit_stop`]).
//!
//! Rate limits hold work rather than fail it. Before every try the worker
//! takes a slot of each limit that applies (`queue:agent.NAME`, from
//! [`Config::queue_rate`], then the step's `rate_limit:` keyed by the
//! call's target, `endpoint:scheme://host:port` for `http`, or by
//! `agent:NAME`), through [`Tasks::take_rate_slot`](rota_store::Tasks::take_rate_slot),
//! shared by every process. A slot at most [`Config::rate_wait`] away (and
//! at most half the time left) is waited for in-process; a slot further
//! away *holds* the request ([`commit_hold`]): in one commit the request is
//! consumed and sent again, delayed until the slot, and the step's
//! complete-by (and warning point) move to the step's whole timeout after
//! that, fenced on the step's state and attempt. So a held call spends no
//! try, no delivery, no attempt and no failure, and the Supervisor never
//! times it out for the time it was held.
//!
//! Circuit breakers hold work too. With [`Config::breakers`] set (the
//! engine's default), before every try of an agent that names a target the
//! worker asks the target's breaker, shared through the store
//! ([`crate::breakers`]): while it is open the request is held the same
//! way until the breaker lets a probe through, and behind another
//! process's probe it asks again within a recheck; after every try it
//! reports what the try said about the target. The agent's own breaker is
//! then left out (the tries go through [`Agent::call_unguarded`]).
//!
//! The rules that every agent follows, built-in or external (the HTTP
//! worker protocol of `rota-api` calls them too), are public functions:
//! [`too_late`] (the deadline), [`stop_reason`] and [`commit_stop`] (a
//! finished task), and [`commit_reply`] (the reply message and its commit
//! with the request's completion).

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rota_agent::{Agent, Gate, Health, Hold, Outcome as CallOutcome};
use rota_model::{Clock, InstanceId, LeaseToken, QueueName, RateLimit, StepName, StepState, Task, TaskId, TaskState, Timestamp};
use rota_store::{Changes, Delivery, Event, EventKind, Outgoing, RateRequest, RateSlot, SharedStore, StepWrite};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::breakers::{BreakerGate, SharedBreakers};
use crate::consumer::{self, Consumer, Handler, Outcome};
use crate::protocol::{self, InboxEnvelope, InboxMessage, Reply, ReplyOutcome, StepRequest};
use crate::scheduler::{Handled, Scheduler};
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
    /// How often the tasks of the calls in progress are read to find those
    /// that finished (a cancel). Calls running for less than this are not
    /// read yet, so a call is stopped at most twice this after its task
    /// finished, and short calls cost no read.
    pub stop_check: Duration,
    /// The rate limit of this agent's queue, shared by every process
    /// consuming it (`rota agent --rate QUEUE=20/s`); `None`: none.
    pub queue_rate: Option<RateLimit>,
    /// The longest a call waits in-process for its rate slot; a slot
    /// further away holds the request ([`commit_hold`]).
    pub rate_wait: Duration,
    /// The circuit breakers shared through the store, which hold the
    /// requests of an endpoint while open; `None`: the agent's own
    /// in-process breakers fail calls fast instead.
    pub breakers: Option<Arc<SharedBreakers>>,
}

/// The default of [`Config::rate_wait`].
pub const RATE_WAIT_DEFAULT: Duration = Duration::from_secs(1);
/// The longest [`Config::rate_wait`] accepted.
pub const RATE_WAIT_MAX: Duration = Duration::from_secs(60);

/// The default of [`Config::stop_check`]: a cancelled task's calls stop
/// within half a second.
pub const STOP_CHECK_DEFAULT: Duration = Duration::from_millis(250);
/// The shortest [`Config::stop_check`] accepted.
pub const STOP_CHECK_MIN: Duration = Duration::from_millis(10);
/// The longest [`Config::stop_check`] accepted.
pub const STOP_CHECK_MAX: Duration = Duration::from_secs(60);

/// Runs one agent on its queue.
pub struct AgentWorker {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    agent: Arc<dyn Agent>,
    queue: QueueName,
    config: Config,
    in_flight: Arc<InFlight>,
    /// The Scheduler of this process, which decides the replies to its
    /// own requests at once ([`Scheduler::decide_reply`]).
    scheduler: Option<Scheduler>,
}

impl AgentWorker {
    /// A worker for `agent`, consuming `agent.<name>`.
    pub fn new(store: SharedStore, clock: Arc<dyn Clock>, agent: Arc<dyn Agent>, config: Config) -> Self {
        let queue = protocol::agent_queue(agent.name());
        AgentWorker { store, clock, agent, queue, config, in_flight: Arc::default(), scheduler: None }
    }

    /// Hands the replies to `scheduler`'s requests straight to it, to be
    /// decided in the commit that consumes the request, instead of
    /// committing each reply to its inbox first: one commit a step instead
    /// of two. For a worker in the Scheduler's own process (the embedded
    /// engine); any reply it cannot decide goes through the inbox.
    pub fn replying_in_process(mut self, scheduler: Scheduler) -> Self {
        self.scheduler = Some(scheduler);
        self
    }

    /// Consumes the agent's queue until `shutdown`, stopping the calls
    /// whose tasks finish meanwhile.
    pub async fn run(self, shutdown: Shutdown) -> Result<()> {
        check_stop_check(self.config.stop_check)?;
        check_rate_wait(self.config.rate_wait)?;
        let consumer_config = consumer::Config::builder(self.queue.clone(), self.config.instance.clone())
            .max_concurrent(self.config.max_concurrent)
            .shutdown_grace(self.config.shutdown_grace)
            .build()?;
        let consumer = Consumer::new(self.store.clone(), consumer_config);
        // The watch runs until the consumer returns, through its shutdown
        // grace too: a call may be stopped while the worker drains.
        let watch = tokio::spawn(watch_for_stops(self.store.clone(), self.in_flight.clone(), self.config.stop_check));
        let ran = consumer.run(Arc::new(self), shutdown).await.map(|_| ());
        watch.abort();
        ran
    }

    /// Handles one request: calls the agent and replies (or stays silent,
    /// or stops the call when its task finished meanwhile).
    pub async fn serve(&self, request: &StepRequest, delivery: &Delivery) -> Outcome {
        if too_late(request.complete_by(), self.clock.now()) {
            tracing::debug!("request {} arrived after its complete-by: dropped without reply", delivery.id);
            return Outcome::Complete;
        }
        let mut rng = StdRng::seed_from_u64(self.request_seed(request));
        let started = std::time::Instant::now();
        let mut watched = self.in_flight.watch(&request.call.task_id);
        let rate = RateGate { store: &self.store, clock: &*self.clock, limits: self.rate_limits(request), wait_max: self.config.rate_wait };
        let breaker = self.breaker_gate(request);
        let gate = CallGate { breaker, rate };
        let call = rota_agent::run_gated(&*self.agent, &request.call, &request.retry, &*self.clock, &mut rng, &gate);
        let outcome = tokio::select! {
            outcome = call => outcome,
            Ok(reason) = &mut watched.stop => {
                // Leaving the select dropped the call: the agent's work is
                // cancelled at its current `.await`.
                record_stopped(self.agent.name(), started.elapsed());
                tracing::info!(reason, "the call was stopped: its task finished");
                let address = ReplyAddress::of(request);
                return match commit_stop(&self.store, &self.queue, delivery.lease_token, &address, self.agent.name(), &reason, self.clock.now()).await {
                    Ok(()) | Err(rota_store::Error::LeaseLost(_)) => Outcome::Settled,
                    // The request is consumed all the same: its task is over.
                    Err(err) => {
                        tracing::warn!("recording the stopped call failed: {err}");
                        Outcome::Complete
                    }
                };
            }
        };
        drop(watched);
        record_call(self.agent.name(), &outcome, started.elapsed());
        let reply_outcome = match outcome {
            CallOutcome::Succeeded(output) => ReplyOutcome::Succeeded { output },
            CallOutcome::Failed { message, retryable, .. } => ReplyOutcome::Failed { error: message, retryable },
            CallOutcome::DeadlinePassed { .. } => return Outcome::Complete,
            CallOutcome::Held(hold) => return self.hold(request, delivery, hold, &mut rng).await,
        };
        let address = ReplyAddress::of(request);
        let reply_outcome = match self.decide_in_process(&address, delivery.lease_token, reply_outcome).await {
            Ok(outcome) => return outcome,
            Err(reply_outcome) => reply_outcome,
        };
        match commit_reply(&self.store, &self.queue, delivery.lease_token, &address, reply_outcome).await {
            Ok(()) => Outcome::Settled,
            // The request's lease ran out while we worked: it is (or will be)
            // someone else's, and its reply is theirs to send.
            Err(rota_store::Error::LeaseLost(_)) => Outcome::Settled,
            Err(err) => Outcome::Abandon { delay: Duration::from_secs(1), reason: format!("could not record the reply: {err}") },
        }
    }

    /// Has this process's Scheduler decide the reply at once, if it sent
    /// the request and runs. Gives the outcome back when the reply must go
    /// through the inbox instead: nothing was committed then.
    async fn decide_in_process(
        &self,
        address: &ReplyAddress,
        lease: LeaseToken,
        outcome: ReplyOutcome,
    ) -> std::result::Result<Outcome, ReplyOutcome> {
        let Some(scheduler) = &self.scheduler else { return Err(outcome) };
        match reply_in_process(scheduler, &self.queue, lease, address, outcome).await? {
            DecidedInProcess::Committed => Ok(Outcome::Settled),
            // A late or fenced reply: the request is consumed all the same.
            DecidedInProcess::Ignored(_) => Ok(Outcome::Complete),
        }
    }

    /// The rate limits of `request`'s tries, as `(key, limit)`: the
    /// queue's, then the step's on its target.
    fn rate_limits(&self, request: &StepRequest) -> Vec<(String, RateLimit)> {
        let queue = self.config.queue_rate.map(|limit| (format!("queue:{}", self.queue), limit));
        let step = request.rate_limit.map(|limit| match self.agent.target(&request.call) {
            Some(target) => (format!("endpoint:{target}"), limit),
            None => (format!("agent:{}", self.agent.name()), limit),
        });
        queue.into_iter().chain(step).collect()
    }

    /// The shared breaker of `request`'s target, if breakers are shared
    /// and the agent names a target (`endpoint:scheme://host:port` for
    /// `http`).
    fn breaker_gate(&self, request: &StepRequest) -> Option<BreakerGate<'_>> {
        let breakers = self.config.breakers.as_deref()?;
        let target = self.agent.target(&request.call)?;
        let call = &request.call;
        let holder = breakers.holder(&format!("{}/{}#{}", call.task_id, call.step, call.attempt));
        Some(BreakerGate { breakers, key: format!("endpoint:{target}"), holder, probe: AtomicBool::new(false) })
    }

    /// Gives a held request back until its slot, spread by up to one
    /// [`Config::rate_wait`] so that the requests held together do not all
    /// come back at once.
    async fn hold(&self, request: &StepRequest, delivery: &Delivery, hold: Hold, rng: &mut StdRng) -> Outcome {
        let now = self.clock.now();
        let spread_ms = u64::try_from(self.config.rate_wait.as_millis()).unwrap_or(u64::MAX).max(1);
        let delay = hold.until.since(now) + Duration::from_millis(rng.random_range(0..spread_ms));
        tracing::debug!(reason = %hold.reason, ?delay, "held: the request is given back until its slot");
        match commit_hold(&self.store, &self.queue, delivery.lease_token, request, delay, now).await {
            Ok(Held::Moved) | Err(rota_store::Error::LeaseLost(_)) => Outcome::Settled,
            // The step moved on without this request (its task was
            // cancelled, the attempt was replaced): nobody waits for it.
            Ok(Held::Stale) | Err(rota_store::Error::Conflict(_)) => Outcome::Complete,
            Err(err) => Outcome::Abandon { delay: Duration::from_secs(1), reason: format!("could not hold the request: {err}") },
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
        CallOutcome::Held(_) => "held",
    };
    metrics::counter!(telemetry::AGENT_CALLS, "agent" => agent.to_owned(), "outcome" => label).increment(1);
    metrics::histogram!(telemetry::AGENT_CALL_DURATION, "agent" => agent.to_owned(), "outcome" => label).record(took.as_secs_f64());
}

/// Records a call stopped because its task finished.
fn record_stopped(agent: &str, took: Duration) {
    metrics::counter!(telemetry::AGENT_CALLS, "agent" => agent.to_owned(), "outcome" => "stopped").increment(1);
    metrics::histogram!(telemetry::AGENT_CALL_DURATION, "agent" => agent.to_owned(), "outcome" => "stopped").record(took.as_secs_f64());
}

/// What admits each try of one request: its shared circuit breaker, then
/// its rate limits (a slot is not taken for a try the breaker holds).
struct CallGate<'a> {
    breaker: Option<BreakerGate<'a>>,
    rate: RateGate<'a>,
}

#[async_trait]
impl Gate for CallGate<'_> {
    async fn admit(&self, request: &rota_agent::Request, remaining: Duration) -> std::result::Result<(), Hold> {
        if let Some(breaker) = &self.breaker {
            breaker.admit().await?;
        }
        let admitted = self.rate.admit(request, remaining).await;
        if admitted.is_err()
            && let Some(breaker) = &self.breaker
        {
            breaker.withdraw().await;
        }
        admitted
    }

    fn keeps_breakers(&self) -> bool {
        self.breaker.is_some()
    }

    async fn report(&self, _request: &rota_agent::Request, health: Health) {
        if let Some(breaker) = &self.breaker {
            breaker.report(health).await;
        }
    }
}

/// The rate limits of one request's tries, taken in the store.
struct RateGate<'a> {
    store: &'a SharedStore,
    clock: &'a dyn Clock,
    limits: Vec<(String, RateLimit)>,
    wait_max: Duration,
}

#[async_trait]
impl Gate for RateGate<'_> {
    async fn admit(&self, _request: &rota_agent::Request, remaining: Duration) -> std::result::Result<(), Hold> {
        // Waiting in-process spends the step's own time: at most half of
        // what is left, so the call keeps time to run.
        let wait_max = self.wait_max.min(remaining / 2);
        for (key, limit) in &self.limits {
            let take = RateRequest { key: key.clone(), limit: *limit, wait_max };
            match self.store.take_rate_slot(&take).await {
                Ok(RateSlot::Granted { start }) => {
                    let wait = start.since(self.clock.now());
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                }
                Ok(RateSlot::Refused { retry_at }) => return Err(Hold { until: retry_at, reason: format!("rate limit {key} ({limit})") }),
                // Without the store no slot can be known to be free: hold
                // the call rather than exceed the limit.
                Err(err) => {
                    let until = self.clock.now() + self.wait_max;
                    return Err(Hold { until, reason: format!("rate limit {key}: the store did not answer: {err}") });
                }
            }
        }
        Ok(())
    }
}

/// What [`commit_hold`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// The request was sent again, delayed, and its step's complete-by moved.
    Moved,
    /// The step no longer runs this attempt: nothing was written.
    Stale,
}

/// Holds a request for `delay` without spending anything of its step: in
/// one commit, fenced on the step's state and attempt, the request (leased
/// from `queue` with `lease`) is consumed and sent again delayed by
/// `delay`, and the step's complete-by moves to the step's whole timeout
/// after the request comes back (`now + delay + timeout`: the deadline
/// starts again when the call can start; a request that does not say its
/// timeout keeps the time it had left), its warning point and the
/// request's complete-by with it. A new message starts with no delivery
/// counted; the step keeps its attempt and the task its failure count.
/// [`Held::Stale`] when the step has moved on (nothing written).
pub async fn commit_hold(
    store: &SharedStore,
    queue: &QueueName,
    lease: LeaseToken,
    request: &StepRequest,
    delay: Duration,
    now: Timestamp,
) -> rota_store::Result<Held> {
    let call = &request.call;
    let Some(record) = store.task(&call.task_id).await? else { return Ok(Held::Stale) };
    let in_flight = if call.compensate { StepState::Compensating } else { StepState::Running };
    let Some(step) = record.steps.iter().find(|s| s.name == call.step && s.state == in_flight && s.attempt == call.attempt) else {
        return Ok(Held::Stale);
    };
    let Some(complete_by) = step.complete_by else { return Ok(Held::Stale) };
    let budget = request.timeout().unwrap_or_else(|| complete_by.since(now));
    // Never earlier than the held time added to the deadline it had.
    let moved_by = (now + delay + budget).max(complete_by + delay);
    let shift = moved_by.since(complete_by);
    let mut moved = step.clone();
    moved.complete_by = Some(moved_by);
    moved.warn_at = step.warn_at.map(|at| at + shift);
    let mut again = request.clone();
    again.call.complete_by = moved_by;
    let message = Outgoing::json(&again).expect("requests serialize").with_delay(delay);
    let changes = Changes {
        steps: vec![StepWrite::replacing(step, moved)],
        send: vec![(queue.clone(), message)],
        complete: vec![(queue.clone(), lease)],
        ..Changes::default()
    };
    crate::replies::commit(store, changes).await?;
    Ok(Held::Moved)
}

/// Checks a [`Config::rate_wait`] (the engine's `agent_rate_wait`).
pub fn check_rate_wait(wait: Duration) -> Result<()> {
    if wait <= RATE_WAIT_MAX {
        return Ok(());
    }
    let why = format!("must be at most {}, got {}", humantime::format_duration(RATE_WAIT_MAX), humantime::format_duration(wait));
    Err(crate::Error::OutOfBounds { field: "agent_rate_wait", why })
}

/// Checks a [`Config::stop_check`] (the engine's `agent_stop_check`).
pub fn check_stop_check(interval: Duration) -> Result<()> {
    if (STOP_CHECK_MIN..=STOP_CHECK_MAX).contains(&interval) {
        return Ok(());
    }
    let human = humantime::format_duration;
    let why = format!("must be between {} and {}, got {}", human(STOP_CHECK_MIN), human(STOP_CHECK_MAX), human(interval));
    Err(crate::Error::OutOfBounds { field: "agent_stop_check", why })
}

/// The calls in progress of one worker, each with the means to stop it.
#[derive(Default)]
struct InFlight {
    calls: Mutex<HashMap<u64, Call>>,
    next: AtomicU64,
}

/// One call in progress.
struct Call {
    task_id: TaskId,
    started: Instant,
    stop: oneshot::Sender<String>,
}

/// A call's registration: the receiver of its stop, and its removal when
/// the call ends (dropped).
struct Watched<'a> {
    in_flight: &'a InFlight,
    key: u64,
    stop: oneshot::Receiver<String>,
}

impl InFlight {
    fn watch(&self, task_id: &TaskId) -> Watched<'_> {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let call = Call { task_id: task_id.clone(), started: Instant::now(), stop: tx };
        self.calls.lock().expect("in-flight calls").insert(key, call);
        Watched { in_flight: self, key, stop: rx }
    }

    /// The tasks of the calls running for at least `age` at `now`.
    fn tasks_running_for(&self, age: Duration, now: Instant) -> Vec<TaskId> {
        let calls = self.calls.lock().expect("in-flight calls");
        let tasks: BTreeSet<&TaskId> = calls.values().filter(|c| now.duration_since(c.started) >= age).map(|c| &c.task_id).collect();
        tasks.into_iter().cloned().collect()
    }

    /// Stops every call of `task_id`, saying `reason`.
    fn stop(&self, task_id: &TaskId, reason: &str) {
        let mut calls = self.calls.lock().expect("in-flight calls");
        let keys: Vec<u64> = calls.iter().filter(|(_, c)| &c.task_id == task_id).map(|(k, _)| *k).collect();
        for key in keys {
            if let Some(call) = calls.remove(&key) {
                let _ = call.stop.send(reason.to_owned());
            }
        }
    }
}

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        self.in_flight.calls.lock().expect("in-flight calls").remove(&self.key);
    }
}

/// Every `interval`, reads the tasks of the calls that have run that long
/// and stops the calls of those that finished. A failed read is tried
/// again at the next round.
async fn watch_for_stops(store: SharedStore, in_flight: Arc<InFlight>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let ids = in_flight.tasks_running_for(interval, Instant::now());
        if ids.is_empty() {
            continue;
        }
        let records = match store.tasks(&ids).await {
            Ok(records) => records,
            Err(err) => {
                tracing::warn!("reading the tasks of the calls in progress failed: {err}");
                continue;
            }
        };
        let found: HashMap<&TaskId, &Task> = records.iter().map(|r| (&r.task.id, &r.task)).collect();
        for id in &ids {
            if let Some(reason) = stop_reason(found.get(id).copied()) {
                in_flight.stop(id, &reason);
            }
        }
    }
}

/// Why a call for a task that reads as `task` (`None`: there is no such
/// task) should stop, if it should: the task has finished, so whatever the
/// call replies is ignored. A task being undone (Compensating) is not
/// finished: it waits for its forward calls' replies to know what to undo.
pub fn stop_reason(task: Option<&Task>) -> Option<String> {
    match task {
        None => Some("the task no longer exists".to_owned()),
        Some(task) if task.state == TaskState::Cancelled => Some("the task was cancelled".to_owned()),
        Some(task) if task.state.is_terminal() => Some(format!("the task ended ({})", task.state)),
        Some(_) => None,
    }
}

/// Consumes a request whose call was stopped, without a reply, and records
/// a `call_stopped` event for its step and attempt, in one commit. Fails
/// with [`rota_store::Error::LeaseLost`] when the request's lease ran out
/// (then nothing is written).
pub async fn commit_stop(
    store: &SharedStore,
    queue: &QueueName,
    lease: LeaseToken,
    address: &ReplyAddress,
    agent: &str,
    reason: &str,
    now: Timestamp,
) -> rota_store::Result<()> {
    let event = Event {
        seq: 0,
        task_id: address.task_id.clone(),
        at: now,
        kind: EventKind::CallStopped,
        step: Some(address.step.clone()),
        attempt: Some(address.attempt),
        detail: json!({ "agent": agent, "reason": reason, "compensate": address.compensate }),
        hash: None,
    };
    let changes = Changes { complete: vec![(queue.clone(), lease)], events: vec![event], ..Changes::default() };
    crate::replies::commit(store, changes).await
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
    let reply = InboxEnvelope::traced(InboxMessage::Reply(reply_to(address, outcome)));
    let message = Outgoing::json(&reply).expect("replies serialize").with_ordering_key(address.task_id.as_str());
    Changes { send: vec![(address.reply_to.clone(), message)], complete: vec![(queue.clone(), lease)], ..Changes::default() }
}

/// What [`reply_in_process`] did with a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecidedInProcess {
    /// The decision on it committed, consuming the request.
    Committed,
    /// It was late or fenced, and nothing was committed: the request is
    /// the caller's to consume, without a reply.
    Ignored(String),
}

/// Has `scheduler`, this process's, decide the reply to `address` at once,
/// in the commit that consumes the request (leased from `queue` with
/// `lease`), as every agent of the Scheduler's process does, built-in or
/// remote (the HTTP worker protocol of `rota-api` when it runs beside the
/// Scheduler). Gives the outcome back when the reply must go through the
/// inbox instead ([`commit_reply`]): the Scheduler did not send the
/// request, has given its tasks back, or could not decide (a lost race, a
/// failure); nothing was committed then, so the reply's own commit is
/// still right (if the lease was lost, it fails the same way).
pub async fn reply_in_process(
    scheduler: &Scheduler,
    queue: &QueueName,
    lease: LeaseToken,
    address: &ReplyAddress,
    outcome: ReplyOutcome,
) -> std::result::Result<DecidedInProcess, ReplyOutcome> {
    let reply = reply_to(address, outcome);
    match scheduler.decide_reply(&reply, &address.reply_to, queue, lease).await {
        None => Err(reply.outcome),
        Some(Ok(Handled::Committed)) => Ok(DecidedInProcess::Committed),
        Some(Ok(Handled::Ignored(reason))) => {
            tracing::debug!("reply to {}/{} ignored: {reason}", address.task_id, address.step);
            Ok(DecidedInProcess::Ignored(reason))
        }
        Some(Err(err)) => {
            tracing::debug!("reply to {}/{} not decided in-process, sent to the inbox: {err}", address.task_id, address.step);
            Err(reply.outcome)
        }
    }
}

/// The reply to `address` saying `outcome`.
fn reply_to(address: &ReplyAddress, outcome: ReplyOutcome) -> Reply {
    Reply {
        task_id: address.task_id.clone(),
        step: address.step.clone(),
        attempt: address.attempt,
        compensate: address.compensate,
        outcome,
    }
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

#[cfg(test)]
mod tests {
    use rota_model::WorkflowName;

    use super::*;

    fn task_in(state: TaskState) -> Task {
        let mut task = Task::new(TaskId::new("t-1").unwrap(), WorkflowName::new("w").unwrap(), 1, json!({}), Timestamp::from_millis(1_000));
        task.state = state;
        task
    }

    #[test]
    fn a_call_stops_only_once_its_task_has_finished() {
        assert_eq!(stop_reason(Some(&task_in(TaskState::Cancelled))).as_deref(), Some("the task was cancelled"));
        assert_eq!(stop_reason(Some(&task_in(TaskState::Error))).as_deref(), Some("the task ended (error)"));
        assert_eq!(stop_reason(Some(&task_in(TaskState::Compensated))).as_deref(), Some("the task ended (compensated)"));
        assert_eq!(stop_reason(None).as_deref(), Some("the task no longer exists"));
        // A task being undone waits for its forward calls' replies to know
        // what to compensate; its compensations must run too.
        for going_on in [TaskState::Pending, TaskState::Processing, TaskState::Compensating] {
            assert_eq!(stop_reason(Some(&task_in(going_on))), None, "{going_on}");
        }
    }

    #[test]
    fn only_calls_running_for_the_interval_are_read_and_a_stop_reaches_every_call_of_the_task() {
        let in_flight = InFlight::default();
        let (a, b) = (TaskId::new("a").unwrap(), TaskId::new("b").unwrap());
        let mut first = in_flight.watch(&a);
        let mut second = in_flight.watch(&a);
        let young = in_flight.watch(&b);
        let later = Instant::now() + Duration::from_millis(300);
        in_flight.calls.lock().unwrap().get_mut(&young.key).unwrap().started = later - Duration::from_millis(100);
        let interval = Duration::from_millis(250);
        assert_eq!(in_flight.tasks_running_for(interval, later), std::slice::from_ref(&a), "one read per task, none for the young call");
        in_flight.stop(&a, "the task was cancelled");
        assert_eq!(first.stop.try_recv().unwrap(), "the task was cancelled");
        assert_eq!(second.stop.try_recv().unwrap(), "the task was cancelled");
        drop(young);
        assert!(in_flight.calls.lock().unwrap().is_empty(), "a call is forgotten once stopped or ended");
    }
}
