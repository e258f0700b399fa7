//! The Scheduler: claims Pending tasks, sends each ready step's
//! request to its agent's queue with its complete-by, consumes the replies
//! from its inbox, and moves each task along its workflow.
//!
//! Every decision is [`plan::decide`], a pure function, committed as one
//! fenced transaction together with the messages it sends and the inbox
//! message it consumes. So a crash at any point leaves either the whole
//! decision or none of it: after a restart the requests already sent are
//! still in the agents' queues, replies still in the inbox, and a task whose
//! holder is gone is reset by the Supervisor and taken over by another
//! Scheduler, which re-sends only the steps that were in flight (completed
//! steps never run again).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rota_model::{Clock, InstanceId, LeaseToken, QueueName, RetryPolicy, StepName, TaskId, TaskState, Timestamp};
use rota_store::{
    Changes, Delivery, Event, EventKind, NewTask, OldestShare, Outgoing, Receive, SharedStore, TaskFilter, TaskRecord, TaskWrite,
};
use serde_json::json;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::callback::CallbackKey;
use crate::completions::Completions;
use crate::consumer::{self, Consumer, Handler, Outcome};
use crate::plan::{self, Decision, Input};
use crate::protocol::{self, Doorbell, InboxEnvelope, InboxMessage, Reply};
use crate::replies;
use crate::saturation::Saturation;
use crate::telemetry::{self, StepOutcome};
use crate::workflows::Workflows;
use crate::{Error, Result, Shutdown};

/// A Scheduler's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// This instance: the `locked_by` of the tasks it claims.
    pub instance: InstanceId,
    /// The most tasks one claim takes.
    pub claim_batch: u32,
    /// One task in this many that this Scheduler claims is taken
    /// oldest-first whatever its priority (the others highest priority
    /// first), so that low priorities still progress: see
    /// [`rota_store::OldestShare`]. 1 ignores priorities.
    pub claim_oldest_every: u32,
    /// The lease a claim takes before the workflow's deadline replaces it
    /// (the start's commit, right after the claim's). It only has to cover
    /// that gap, and it is how long a task waits for the Supervisor when its
    /// Scheduler dies inside it: the claim is committed, the start is not,
    /// nothing is in flight. So it is kept short (the default is 10 s).
    pub claim_lease: Duration,
    /// How long the claim loop waits for a doorbell before claiming anyway
    /// (the fallback that finds tasks whose doorbell was lost).
    pub claim_wait: Duration,
    /// How many inbox messages (replies) are handled at once.
    pub inbox_concurrency: usize,
    /// The backoff between recoveries of a failed or timed-out step.
    pub recovery: RetryPolicy,
    /// The seed of the backoff jitter.
    pub seed: u64,
    /// The key this Scheduler derives callback tokens under: random by
    /// default (tokens must not be guessable, so it is not drawn from the
    /// seed); tests set their own.
    pub callback_key: CallbackKey,
    /// How long replies being handled may take to finish at shutdown.
    pub shutdown_grace: Duration,
    /// The most items a `for_each` step may have: a longer list fails the
    /// step, rather than start a runaway number of instances (each a step
    /// row that every decision of the task reads).
    pub for_each_items_max: usize,
    /// How many levels of child workflows (`workflow:` steps) may run below
    /// a top-level task: a deeper child is not started and its step fails,
    /// which stops a workflow that starts itself.
    pub child_depth_max: u32,
    /// How many step requests may wait for an agent (ready, not yet taken)
    /// in the agent queues this Scheduler sends to before it stops
    /// claiming new tasks. Past it the agents are saturated: a new task's
    /// first request would only queue ahead of the next steps of tasks
    /// already started, so claims wait and started tasks go on. 0 never
    /// stops claiming.
    pub agent_backlog_max: u32,
}

/// The default of [`Config::agent_backlog_max`].
pub const AGENT_BACKLOG_MAX_DEFAULT: u32 = 256;

/// The default of [`Config::for_each_items_max`].
pub const FOR_EACH_ITEMS_MAX_DEFAULT: usize = 1_000;

/// The highest [`Config::for_each_items_max`] a configuration may give.
pub const FOR_EACH_ITEMS_MAX_LIMIT: usize = 100_000;

impl Config {
    /// Defaults for `instance`.
    pub fn new(instance: InstanceId) -> Self {
        Config {
            instance,
            claim_batch: 64,
            claim_oldest_every: rota_store::OLDEST_SHARE_EVERY_DEFAULT,
            claim_lease: Duration::from_secs(10),
            claim_wait: Duration::from_secs(1),
            inbox_concurrency: 32,
            recovery: default_recovery(),
            seed: 0,
            callback_key: CallbackKey::random(),
            shutdown_grace: crate::consumer::Config::SHUTDOWN_GRACE_DEFAULT,
            for_each_items_max: FOR_EACH_ITEMS_MAX_DEFAULT,
            child_depth_max: crate::child::CHILD_DEPTH_MAX_DEFAULT,
            agent_backlog_max: AGENT_BACKLOG_MAX_DEFAULT,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.claim_batch == 0 || self.claim_batch > rota_store::RECEIVE_MAX {
            return Err(Error::Config(format!("scheduler claim_batch must be 1..={}", rota_store::RECEIVE_MAX)));
        }
        if self.claim_oldest_every == 0 {
            return Err(Error::Config("scheduler claim_oldest_every must be at least 1".into()));
        }
        if self.inbox_concurrency == 0 {
            return Err(Error::Config("scheduler inbox_concurrency must be at least 1".into()));
        }
        if self.claim_wait.is_zero() {
            return Err(Error::Config("scheduler claim_wait must be positive".into()));
        }
        check_for_each_items_max(self.for_each_items_max)?;
        check_child_depth_max(self.child_depth_max)
    }
}

/// Checks [`Config::for_each_items_max`]; the error names the field.
pub(crate) fn check_for_each_items_max(items_max: usize) -> Result<()> {
    if !(1..=FOR_EACH_ITEMS_MAX_LIMIT).contains(&items_max) {
        let why = format!("must be between 1 and {FOR_EACH_ITEMS_MAX_LIMIT}, got {items_max}");
        return Err(Error::OutOfBounds { field: "for_each_items_max", why });
    }
    Ok(())
}

/// Checks [`Config::child_depth_max`]; the error names the field.
pub(crate) fn check_child_depth_max(depth_max: u32) -> Result<()> {
    let limit = crate::child::CHILD_DEPTH_MAX_LIMIT;
    if !(1..=limit).contains(&depth_max) {
        return Err(Error::OutOfBounds { field: "child_depth_max", why: format!("must be between 1 and {limit}, got {depth_max}") });
    }
    Ok(())
}

/// The default backoff between recoveries: 500 ms doubling to 30 s.
pub fn default_recovery() -> RetryPolicy {
    RetryPolicy::new(1_000, Duration::from_millis(500), Duration::from_secs(30)).expect("a valid policy")
}

/// How often a start that lost a race is decided again before giving up
/// (the Supervisor then recovers the task when its claim lease runs out).
const START_TRIES_MAX: u32 = 5;

/// The most tasks given back at shutdown (the rest wait for the Supervisor).
const RELEASE_MAX: u32 = 10_000;

/// The most task records a Scheduler keeps from its own commits (see
/// [`Records`]); past it, new ones are not kept.
const RECORDS_KEPT_MAX: usize = 10_000;

/// The records of the tasks this Scheduler holds, as its last commit left
/// them, so that a reply is decided without reading the task again.
///
/// A kept record can only be stale if someone else moved the task since,
/// and every such move (the Supervisor's expiry, an operator's cancel, a
/// claim by another Scheduler) bumps the task's lease epoch, on which every
/// decision's commit is fenced: a decision taken on a stale record fails
/// as a lost race, writing nothing; the record is dropped and the message
/// decided again at once on a fresh read. A decision to ignore a message is
/// never taken on a kept
/// record: it is checked on a fresh read first, because ignoring commits
/// nothing that could fail.
#[derive(Default)]
struct Records {
    by_task: Mutex<HashMap<TaskId, TaskRecord>>,
}

impl Records {
    /// Takes the record of task `id` out: the decision that takes it puts
    /// back what its commit leaves, and any other outcome leaves the task
    /// to a fresh read. A message handled beside it reads the task afresh.
    fn take(&self, id: &TaskId) -> Option<TaskRecord> {
        self.lock().remove(id)
    }

    fn forget(&self, id: &TaskId) {
        self.lock().remove(id);
    }

    /// Keeps `after` as the record of task `id`; `None` forgets it.
    fn keep(&self, id: &TaskId, after: Option<TaskRecord>) {
        let mut by_task = self.lock();
        match after {
            Some(record) if by_task.len() < RECORDS_KEPT_MAX || by_task.contains_key(id) => {
                by_task.insert(id.clone(), record);
            }
            Some(_) => {}
            None => {
                by_task.remove(id);
            }
        }
    }

    /// What `changes` change of `before`'s record, if the result is worth
    /// keeping: the task neither ended nor left this Scheduler. Only the
    /// changed rows are copied, so that a decision's cost does not grow
    /// with the number of steps.
    fn patch(before: &TaskRecord, changes: &Changes, me: &rota_model::InstanceId) -> Option<RecordPatch> {
        let write = changes.tasks.iter().find(|w| w.task.id == before.task.id)?;
        if write.task.state.is_terminal() || write.task.locked_by.as_ref() != Some(me) {
            return None;
        }
        let steps =
            changes.steps.iter().map(|w| &w.step).chain(&changes.new_steps).filter(|s| s.task_id == before.task.id).cloned().collect();
        Some(RecordPatch { task: write.task.clone(), steps })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, TaskRecord>> {
        self.by_task.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The rows a committed decision wrote to a kept record.
struct RecordPatch {
    task: rota_model::Task,
    steps: Vec<rota_model::Step>,
}

impl RecordPatch {
    fn apply(self, mut record: TaskRecord) -> TaskRecord {
        record.task = self.task;
        for written in self.steps {
            match record.steps.iter_mut().find(|s| s.name == written.name) {
                Some(step) => *step = written,
                None => record.steps.push(written),
            }
        }
        record
    }
}

/// One task's inputs are decided one at a time: a decision is taken on
/// the record the task's previous one left. The inbox keeps a task's
/// messages apart by their ordering key; a reply decided in-process
/// ([`Scheduler::decide_reply`]) passes the inbox, so both take the task's
/// turn here.
#[derive(Default)]
struct Turns {
    by_task: Mutex<HashMap<TaskId, Arc<tokio::sync::Mutex<()>>>>,
}

/// A task's turn: dropped, it lets the next input of the task be decided.
struct Turn<'a> {
    turns: &'a Turns,
    id: TaskId,
    held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Turns {
    async fn take(&self, id: &TaskId) -> Turn<'_> {
        let lock = self.lock().entry(id.clone()).or_default().clone();
        let held = lock.lock_owned().await;
        Turn { turns: self, id: id.clone(), held: Some(held) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, Arc<tokio::sync::Mutex<()>>>> {
        self.by_task.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut by_task = self.turns.lock();
        drop(self.held.take());
        // Forgotten when no one else holds or waits for it: those took
        // their clone under the same lock.
        if by_task.get(&self.id).is_some_and(|lock| Arc::strong_count(lock) == 1) {
            by_task.remove(&self.id);
        }
    }
}

/// A task being taken at its creation by the Scheduler of the process
/// that submits it ([`Scheduler::take_at_creation`]). While it lives, that
/// Scheduler does not give its tasks back at shutdown.
pub(crate) struct TakeAtCreation {
    scheduler: Scheduler,
    _open: tokio::sync::OwnedRwLockReadGuard<bool>,
    /// The task as claimed, before its start: what a start after the
    /// creation decides on when the start could not go into it.
    claimed: Option<TaskRecord>,
    /// The task after its start, when the start goes into the creation,
    /// and the queues the start sends to.
    started: Option<(TaskRecord, Vec<QueueName>)>,
}

impl TakeAtCreation {
    /// `new` as this Scheduler leaves it by claiming it and deciding its
    /// start, to be created so in one commit: held, its first steps sent,
    /// with the claim's `claimed` event after `received` and the start's
    /// events after that, without the doorbell that would have woken a
    /// claim. When the start cannot go into the creation (it ends the task,
    /// or consumes a message), only the claim does, and the start follows
    /// the creation ([`TakeAtCreation::created`]). `None` when a claim could
    /// not take the task now (not due yet, paused, or under a concurrency
    /// key, whose slots only a claim hands out), or it is a child
    /// workflow's.
    pub(crate) async fn take(&mut self, mut new: NewTask, now: Timestamp) -> Option<NewTask> {
        let inner = &self.scheduler.inner;
        if new.task.concurrency.is_some() || new.task.parent.is_some() {
            return None;
        }
        let (claimed, fence) = new.task.claim(inner.config.instance.clone(), now, inner.config.claim_lease).ok()?;
        new.task = claimed;
        let detail = json!({ "owner": inner.config.instance.as_str(), "lease_epoch": fence.epoch });
        new.events.push(Event::task(&new.task.id, now, EventKind::Claimed, detail));
        let doorbells = protocol::tasks_queue();
        new.messages.retain(|(queue, _)| *queue != doorbells);
        let record = TaskRecord { task: new.task.clone(), steps: new.steps.clone() };
        if let Some(mut changes) = self.scheduler.decide_start(&record, now).await {
            replies::attach(&mut changes);
            let patch = Records::patch(&record, &changes, &inner.config.instance);
            if let (Some(patch), Some(started)) = (patch, started_with(new.clone(), &changes)) {
                let sent_to = changes.send.iter().map(|(queue, _)| queue.clone()).collect();
                self.started = Some((patch.apply(record), sent_to));
                return Some(started);
            }
        }
        self.claimed = Some(record);
        Some(new)
    }

    /// The task was created as [`TakeAtCreation::take`] made it: keeps the
    /// record of its start, or starts it now, as a claim starts what it
    /// took.
    pub(crate) fn created(self) {
        let TakeAtCreation { scheduler, _open: open, claimed, started } = self;
        let inner = &scheduler.inner;
        inner.taken_at_creation.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(telemetry::CLAIMED_AT_CREATION).increment(1);
        if let Some((started, sent_to)) = started {
            inner.saturation.sending(sent_to.iter());
            inner.saturation.decided(false);
            inner.records.keep(&started.task.id.clone(), Some(started));
            return;
        }
        let Some(record) = claimed else { return };
        let span = tracing::debug_span!("rota.scheduler.start", task_id = %record.task.id, workflow = %record.task.workflow);
        tokio::spawn(
            async move {
                let id = record.task.id.clone();
                if let Err(err) = scheduler.start(&id, Some(record)).await {
                    tracing::warn!("starting task {id}: {err}");
                }
                drop(open);
            }
            .instrument(span),
        );
    }
}

/// `new`, created claimed, with its start's `changes` applied: `None` when
/// they do more than write this task and send (they consume a message), or
/// leave it unheld (ended at its start: such a task is started after its
/// creation, so that the store's check of a paused workflow still applies).
fn started_with(mut new: NewTask, changes: &Changes) -> Option<NewTask> {
    if !changes.complete.is_empty() {
        return None;
    }
    for write in &changes.tasks {
        if write.task.id != new.task.id {
            return None;
        }
        new.task = write.task.clone();
    }
    for write in &changes.steps {
        let step = new.steps.iter_mut().find(|s| s.task_id == write.step.task_id && s.name == write.step.name)?;
        *step = write.step.clone();
    }
    new.steps.extend(changes.new_steps.iter().cloned());
    new.events.extend(changes.events.iter().cloned());
    new.messages.extend(changes.send.iter().cloned());
    (new.task.locked_by.is_some() && !new.task.state.is_terminal()).then_some(new)
}

/// What handling one input did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// A decision was committed.
    Committed,
    /// Nothing to do (a fenced reply, a task held by someone else…).
    Ignored(String),
}

/// The Scheduler. Cheap to clone (shared inside).
#[derive(Clone)]
pub struct Scheduler {
    inner: Arc<Inner>,
}

struct Inner {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    workflows: Workflows,
    completions: Completions,
    inbox: QueueName,
    config: Config,
    rng: Mutex<StdRng>,
    records: Records,
    /// How many of the next claim's tasks are taken oldest-first.
    oldest_share: Mutex<OldestShare>,
    /// Whether the agents keep up (see [`Config::agent_backlog_max`]).
    saturation: Saturation,
    /// Whose turn it is to decide on each task.
    turns: Turns,
    /// Whether replies may be decided in-process: until [`Scheduler::run`]
    /// gives its tasks back at shutdown.
    deciding: AtomicBool,
    /// Whether submissions of this process may be taken at their creation
    /// (see [`Scheduler::take_at_creation`]): true while the claim loop
    /// runs. Each taking holds it for reading until its start is decided,
    /// so that the shutdown, which closes it for writing, gives back every
    /// task so taken.
    intake: Arc<tokio::sync::RwLock<bool>>,
    /// Whether the last claim took a full batch (or none ran yet): there may
    /// be claimable tasks waiting, which a new submission must not pass.
    backlog: AtomicBool,
    /// Tasks taken at their creation, ever.
    taken_at_creation: AtomicU64,
}

impl Scheduler {
    /// A Scheduler over `store`.
    pub fn new(store: SharedStore, clock: Arc<dyn Clock>, workflows: Workflows, completions: Completions, config: Config) -> Result<Self> {
        config.validate()?;
        let inbox = protocol::inbox(&config.instance);
        let rng = Mutex::new(StdRng::seed_from_u64(config.seed));
        let oldest_share = Mutex::new(OldestShare::new(config.claim_oldest_every));
        let records = Records::default();
        Ok(Scheduler {
            inner: Arc::new(Inner {
                store,
                clock,
                workflows,
                completions,
                inbox,
                rng,
                records,
                oldest_share,
                saturation: Saturation::new(config.agent_backlog_max),
                turns: Turns::default(),
                deciding: AtomicBool::new(true),
                intake: Arc::new(tokio::sync::RwLock::new(false)),
                backlog: AtomicBool::new(true),
                taken_at_creation: AtomicU64::new(0),
                config,
            }),
        })
    }

    /// This Scheduler's inbox.
    pub fn inbox(&self) -> &QueueName {
        &self.inner.inbox
    }

    /// Runs the claim loop and the inbox consumer until `shutdown`.
    pub async fn run(self, shutdown: Shutdown) -> Result<()> {
        // Replies and retries lead only to this Scheduler's commits.
        let consumer_config = consumer::Config::builder(self.inner.inbox.clone(), self.inner.config.instance.clone())
            .max_concurrent(self.inner.config.inbox_concurrency)
            .shutdown_grace(self.inner.config.shutdown_grace)
            .acting_within_store()
            .build()?;
        let inbox = Consumer::new(self.inner.store.clone(), consumer_config);
        let handler: Arc<dyn Handler> = Arc::new(self.clone());
        let inbox_shutdown = shutdown.clone();
        // Held in a JoinSet so that if this future is dropped (the process's
        // roles are torn down without a graceful shutdown), the inbox
        // consumer goes with it instead of running on detached.
        let mut inbox_run = JoinSet::new();
        inbox_run.spawn(async move { inbox.run(handler, inbox_shutdown).await });
        // Child workflows' ends, shared by every Scheduler.
        let children_config = consumer::Config::builder(protocol::children_queue(), self.inner.config.instance.clone())
            .max_concurrent(self.inner.config.inbox_concurrency)
            .shutdown_grace(self.inner.config.shutdown_grace)
            .build()?;
        let children = Consumer::new(self.inner.store.clone(), children_config);
        let children_handler: Arc<dyn Handler> = Arc::new(ChildEnds { store: self.inner.store.clone() });
        let children_shutdown = shutdown.clone();
        let mut children_run = JoinSet::new();
        children_run.spawn(async move { children.run(children_handler, children_shutdown).await });
        *self.inner.intake.write().await = true;
        let claims = self.claim_loop(shutdown).await;
        // Waits for the tasks being taken at their creation to be started,
        // so that the tasks given back below include them.
        *self.inner.intake.write().await = false;
        let inbox =
            inbox_run.join_next().await.expect("one inbox consumer").map_err(|e| Error::Config(format!("inbox consumer panicked: {e}")))?;
        let children = children_run
            .join_next()
            .await
            .expect("one consumer of child ends")
            .map_err(|e| Error::Config(format!("the consumer of child ends panicked: {e}")))?;
        if let Err(err) = children {
            tracing::warn!("the consumer of child ends stopped: {err}");
        }
        // Replies from here on wait in the inbox for whoever takes the
        // tasks over.
        self.inner.deciding.store(false, Ordering::Release);
        if let Err(err) = self.release_held().await {
            tracing::warn!("giving back held tasks at shutdown: {err}");
        }
        claims?;
        inbox.map(|_| ())
    }

    async fn claim_loop(&self, shutdown: Shutdown) -> Result<()> {
        let doorbells = protocol::tasks_queue();
        let me = self.inner.config.instance.clone();
        while !shutdown.is_triggered() {
            // A doorbell only leads to a claim.
            let request =
                Receive::up_to(rota_store::RECEIVE_MAX.min(256)).waiting(self.inner.config.claim_wait).by(me.clone()).acting_within_store();
            let rung = tokio::select! {
                rung = self.inner.store.receive(&doorbells, request) => rung,
                () = shutdown.triggered() => break,
            };
            let mut traces = HashMap::new();
            match rung {
                Ok(rung) if !rung.is_empty() => {
                    // Read only when the starts' spans are wanted: tracing on.
                    if tracing::span_enabled!(tracing::Level::DEBUG) {
                        traces = doorbell_traces(&rung);
                    }
                    // Doorbells only wake; the claim below finds the work, and the
                    // fallback claim finds it too if a doorbell is lost. So their
                    // completion need not delay the claim: it commits alongside.
                    let tokens: Vec<_> = rung.iter().map(|d| d.lease_token).collect();
                    let (store, queue) = (self.inner.store.clone(), doorbells.clone());
                    tokio::spawn(async move {
                        if let Err(err) = store.complete_batch(&queue, &tokens).await {
                            tracing::warn!("completing doorbells: {err}");
                        }
                    });
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!("waiting for doorbells: {err}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            loop {
                if !self.wait_for_agents(&shutdown).await {
                    break;
                }
                match self.claim_traced(&traces).await {
                    Ok(claimed) if claimed == self.inner.config.claim_batch as usize => continue,
                    Ok(_) => break,
                    Err(err) => {
                        tracing::warn!("claiming tasks: {err}");
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// Claims up to a batch of claimable tasks and starts each. Returns how
    /// many were claimed: none while the agents' backlog is at its bound.
    pub async fn claim_once(&self) -> Result<usize> {
        if self.inner.saturation.saturated(&self.inner.store).await {
            return Ok(0);
        }
        self.claim_traced(&HashMap::new()).await
    }

    /// Waits while the agents' backlog is at its bound, re-checking after
    /// each committed decision (or every `claim_wait`). False when
    /// `shutdown` came first.
    async fn wait_for_agents(&self, shutdown: &Shutdown) -> bool {
        let inner = &self.inner;
        while inner.saturation.saturated(&inner.store).await {
            tokio::select! {
                () = inner.saturation.next_decision(inner.config.claim_wait) => {}
                () = shutdown.triggered() => return false,
            }
        }
        !shutdown.is_triggered()
    }

    /// [`Scheduler::claim_once`], each start in a `rota.scheduler.start`
    /// span continuing the trace of its task's doorbell in `traces` (or,
    /// when tracing is on, of its `received` event).
    async fn claim_traced(&self, traces: &HashMap<TaskId, String>) -> Result<usize> {
        let inner = &self.inner;
        let claim = inner.oldest_share.lock().expect("the oldest share").plan(inner.config.claim_batch);
        // The claim returns the tasks' steps too: a start reads nothing.
        let claimed = inner.store.claim_records_by(&inner.config.instance, inner.config.claim_lease, claim).await?;
        let count = claimed.len();
        inner.backlog.store(count >= inner.config.claim_batch as usize, Ordering::Relaxed);
        inner.oldest_share.lock().expect("the oldest share").record(count);
        let mut starts = JoinSet::new();
        for record in claimed {
            let scheduler = self.clone();
            let traceparent = traces.get(&record.task.id).cloned();
            starts.spawn(async move {
                let id = record.task.id.clone();
                let span = tracing::debug_span!("rota.scheduler.start", task_id = %id, workflow = %record.task.workflow);
                let traceparent = match traceparent {
                    Some(traceparent) => Some(traceparent),
                    None if !span.is_disabled() => scheduler.received_traceparent(&id).await,
                    None => None,
                };
                telemetry::set_parent(&span, traceparent.as_deref());
                if let Err(err) = scheduler.start(&id, Some(record)).instrument(span).await {
                    tracing::warn!("starting task {id}: {err}");
                }
            });
        }
        while starts.join_next().await.is_some() {}
        Ok(count)
    }

    /// Reserves the taking of a task submitted in this process at its
    /// creation: the task is created claimed by this Scheduler (see
    /// [`TakeAtCreation::claim`]) and started at once, saving its doorbell,
    /// the claim and a commit. Only while the claim loop runs, its last
    /// claim left nothing claimable behind (a new task must not pass waiting
    /// ones) and the agents keep up; otherwise `None`, and the task is
    /// created Pending for a claim, as from any other process.
    pub(crate) async fn take_at_creation(&self) -> Option<TakeAtCreation> {
        let inner = &self.inner;
        let open = inner.intake.clone().try_read_owned().ok().filter(|open| **open)?;
        if inner.backlog.load(Ordering::Relaxed) || inner.saturation.saturated(&inner.store).await {
            return None;
        }
        Some(TakeAtCreation { scheduler: self.clone(), _open: open, claimed: None, started: None })
    }

    /// How many tasks this Scheduler took at their creation.
    pub fn taken_at_creation(&self) -> u64 {
        self.inner.taken_at_creation.load(Ordering::Relaxed)
    }

    /// The trace context the task's submit left in its `received` event.
    async fn received_traceparent(&self, id: &TaskId) -> Option<String> {
        let history = self.inner.store.history(id).await.ok()?;
        let received = history.iter().find(|e| e.kind == EventKind::Received)?;
        received.detail.get("traceparent")?.as_str().map(str::to_owned)
    }

    /// Gives back every task this instance holds, at once claimable by
    /// another Scheduler (which re-sends the steps that were in flight). Run
    /// at a graceful shutdown, after the inbox stopped: without it, the
    /// tasks would wait for the Supervisor to expire their leases.
    pub async fn release_held(&self) -> Result<usize> {
        let inner = &self.inner;
        let filter = TaskFilter { locked_by: Some(inner.config.instance.clone()), limit: RELEASE_MAX, ..TaskFilter::default() };
        let held = inner.store.list_tasks(&filter).await?;
        let mut released = 0;
        for task in held {
            let Some(fence) = task.fence() else { continue };
            let now = inner.clock.now();
            let Ok(next) = task.release(fence, now) else { continue };
            let mut changes = Changes::default();
            changes.events.push(Event::task(&task.id, now, EventKind::Released, json!({ "by": inner.config.instance.as_str() })));
            changes.send.push((protocol::tasks_queue(), Outgoing::json(&Doorbell::new(task.id.clone())).expect("doorbells serialize")));
            changes.tasks.push(TaskWrite::replacing(&task, next));
            match replies::commit(&inner.store, changes).await {
                Ok(()) => released += 1,
                Err(err) if err.is_lost_race() => {}
                Err(err) => return Err(err.into()),
            }
        }
        if released > 0 {
            tracing::info!("gave back {released} task(s) held by {}", inner.config.instance);
        }
        Ok(released)
    }

    /// Decides what a fresh claim of `task` means and commits it. A lost
    /// race (the Supervisor settling one of its steps at the same moment) is
    /// decided again on a fresh read: a claimed task whose start was never
    /// committed would otherwise sit idle until its claim lease ran out.
    async fn start(&self, task: &rota_model::TaskId, mut read: Option<TaskRecord>) -> Result<Handled> {
        let mut tries = 0;
        loop {
            // The claim's own read first, then a fresh one after a lost race.
            let record = match read.take() {
                Some(record) => record,
                None => match self.inner.store.task(task).await? {
                    Some(record) => record,
                    None => return Ok(Handled::Ignored(format!("task {task} vanished"))),
                },
            };
            match self.apply(record, Input::Claimed, None).await {
                Err(Error::Store(err)) if err.is_lost_race() && tries < START_TRIES_MAX => {
                    tries += 1;
                    tracing::debug!("start of task {task} lost a race, deciding again: {err}");
                }
                other => return other,
            }
        }
    }

    /// Handles one inbox message; `settle` is the message's lease, completed
    /// in the same commit as the decision.
    pub async fn handle(&self, message: &InboxMessage, settle: Option<LeaseToken>) -> Result<Handled> {
        let settle = settle.map(|token| (self.inner.inbox.clone(), token));
        self.decide(message, settle).await
    }

    /// Decides an agent's reply in this process, without its passing
    /// through the inbox: the decision's commit also consumes the agent's
    /// request (`lease`, on `queue`), so the request's consumption, the
    /// step's outcome and whatever follows are one commit instead of two.
    /// A lost request lease fails the commit (the request is someone
    /// else's, and so is its reply). `None` when this Scheduler has given
    /// its tasks back (shutdown), or the reply is not for its inbox: the
    /// reply then goes through the inbox. On an error nothing was decided, and the agent's
    /// own commit of the reply (consuming the request) is still right.
    pub async fn decide_reply(&self, reply: &Reply, reply_to: &QueueName, queue: &QueueName, lease: LeaseToken) -> Option<Result<Handled>> {
        let inner = &self.inner;
        if reply_to != &inner.inbox || !inner.deciding.load(Ordering::Acquire) {
            return None;
        }
        let _turn = inner.turns.take(&reply.task_id).await;
        let span = tracing::debug_span!("rota.scheduler.handle", task_id = %reply.task_id, message = "reply");
        let decided = self.decide_on(&reply.task_id, Input::Reply(reply), Some((queue.clone(), lease))).instrument(span).await;
        metrics::counter!(telemetry::REPLIES_DECIDED_IN_PROCESS, "outcome" => decided_label(&decided)).increment(1);
        Some(decided)
    }

    /// Decides on `message`, completing `settle` (a queue and a lease) in
    /// the decision's commit.
    async fn decide(&self, message: &InboxMessage, settle: Option<(QueueName, LeaseToken)>) -> Result<Handled> {
        let input = match message {
            InboxMessage::Reply(reply) => Input::Reply(reply),
            InboxMessage::Retry { step, .. } => Input::Retry(step),
            InboxMessage::StepExpired { step, attempt, .. } => Input::StepExpired(step, *attempt),
            InboxMessage::Signalled { step, .. } => Input::Signalled(step),
            InboxMessage::StartChild { task_id, step, attempt } => return self.start_child(task_id, step, *attempt, settle).await,
        };
        self.decide_on(message.task_id(), input, settle).await
    }

    /// Decides on `input` for task `id` (on the record kept from this
    /// Scheduler's last commit, or on a fresh read), completing `settle`.
    async fn decide_on(&self, id: &TaskId, input: Input<'_>, settle: Option<(QueueName, LeaseToken)>) -> Result<Handled> {
        if let Some(kept) = self.inner.records.take(id) {
            match self.apply(kept, input, settle.clone()).await {
                // Only ignored on a fresh read (see `Records`).
                Ok(Handled::Ignored(_)) => {}
                // The record was stale and the commit wrote nothing: decide
                // again on a fresh read, as if it had not been kept.
                Err(Error::Store(err)) if err.is_lost_race() => {}
                other => return other,
            }
        }
        let Some(record) = self.inner.store.task(id).await? else {
            return Ok(Handled::Ignored(format!("task {id} does not exist")));
        };
        self.apply(record, input, settle).await
    }

    /// Creates (or finds) the child of a `workflow:` step's attempt. A child
    /// that cannot start fails the attempt for good, decided like an
    /// agent's permanent failure; one that has ended already (the task was
    /// taken over after its end) has its end delivered again.
    async fn start_child(&self, id: &TaskId, step: &StepName, attempt: u32, settle: Option<(QueueName, LeaseToken)>) -> Result<Handled> {
        let inner = &self.inner;
        let client = crate::client::Client::new(inner.store.clone(), inner.clock.clone(), inner.workflows.clone(), None)
            .with_input_bytes_max(usize::MAX);
        match crate::child::start(&client, id, step, attempt, inner.config.child_depth_max).await? {
            crate::child::Started::Created(child) => Ok(Handled::Ignored(format!("started child {child}"))),
            crate::child::Started::Running(child) => Ok(Handled::Ignored(format!("child {child} runs"))),
            crate::child::Started::Moved(why) => Ok(Handled::Ignored(why)),
            crate::child::Started::Ended(ended) => {
                let delivered = crate::child::deliver(&inner.store, &ended).await?;
                Ok(Handled::Ignored(format!("child {} had ended: {delivered:?}", ended.child)))
            }
            crate::child::Started::Refused(error) => {
                let reply = InboxMessage::Reply(crate::child::refusal(id, step, attempt, error));
                Box::pin(self.decide(&reply, settle)).await
            }
        }
    }

    /// The start a claim of `record` (just claimed, Processing) leads to,
    /// when there is something to commit.
    async fn decide_start(&self, record: &TaskRecord, now: Timestamp) -> Option<Changes> {
        let workflow = self.inner.workflows.get(&record.task.workflow, Some(record.task.workflow_version)).await.ok()?;
        match self.plan(record, &[], Input::Claimed, &workflow, now) {
            Decision::Commit(changes) => Some(*changes),
            Decision::Ignore(_) => None,
        }
    }

    /// What `input` leads to on `record` at `now` (`order`: the steps in
    /// the order they completed, for a compensation).
    fn plan(
        &self,
        record: &TaskRecord,
        order: &[StepName],
        input: Input<'_>,
        workflow: &rota_workflow::Workflow,
        now: Timestamp,
    ) -> Decision {
        let inner = &self.inner;
        let traceparent = telemetry::current_traceparent();
        let cx = plan::Context {
            workflow,
            me: &inner.config.instance,
            inbox: &inner.inbox,
            now,
            recovery: &inner.config.recovery,
            traceparent: traceparent.as_deref(),
            callback_key: inner.config.callback_key.as_bytes(),
            for_each_items_max: inner.config.for_each_items_max,
        };
        let mut rng = inner.rng.lock().expect("scheduler rng");
        plan::decide(record, order, input, &cx, &mut *rng)
    }

    async fn apply(&self, record: TaskRecord, input: Input<'_>, settle: Option<(QueueName, LeaseToken)>) -> Result<Handled> {
        let inner = &self.inner;
        let workflow = inner.workflows.get(&record.task.workflow, Some(record.task.workflow_version)).await?;
        let order = if record.task.state == TaskState::Compensating { self.completion_order(&record).await? } else { Vec::new() };
        let now = inner.clock.now();
        match self.plan(&record, &order, input, &workflow, now) {
            Decision::Ignore(reason) => Ok(Handled::Ignored(reason)),
            Decision::Commit(mut changes) => {
                if let Some(settled) = settle {
                    changes.complete.push(settled);
                }
                let ended: Option<(rota_model::TaskId, TaskState)> =
                    changes.tasks.iter().map(|w| &w.task).find(|t| t.state.is_terminal()).map(|t| (t.id.clone(), t.state));
                let retried: Vec<StepName> = retried_steps(&changes);
                let patch = Records::patch(&record, &changes, &inner.config.instance);
                inner.saturation.sending(changes.send.iter().map(|(queue, _)| queue));
                if let Err(err) = replies::commit(&inner.store, *changes).await {
                    inner.records.forget(&record.task.id);
                    return Err(err.into());
                }
                inner.saturation.decided(matches!(input, Input::Reply(_)));
                record_decision(&record, &workflow, input, now, &retried, ended.as_ref().map(|(_, state)| *state));
                let id = record.task.id.clone();
                inner.records.keep(&id, patch.map(|patch| patch.apply(record)));
                if let Some((id, state)) = ended {
                    inner.completions.publish(id, state);
                }
                Ok(Handled::Committed)
            }
        }
    }

    /// The task's steps in the order they completed, from its history.
    async fn completion_order(&self, record: &TaskRecord) -> Result<Vec<StepName>> {
        let history = self.inner.store.history(&record.task.id).await?;
        let mut order: Vec<StepName> = Vec::new();
        for event in history {
            // A step settled in doubt counts as completed when it was settled.
            let completed = event.kind == EventKind::StepCompleted
                || (event.kind == EventKind::StepFailed && event.detail["in_doubt"] == serde_json::Value::Bool(true));
            if completed && let Some(step) = event.step {
                order.retain(|s| s != &step);
                order.push(step);
            }
        }
        Ok(order)
    }
}

/// The `outcome` label of a reply decided in-process.
fn decided_label(decided: &Result<Handled>) -> &'static str {
    match decided {
        Ok(Handled::Committed) => "committed",
        Ok(Handled::Ignored(_)) => "ignored",
        Err(Error::Store(err)) if err.is_lost_race() => "lost_race",
        Err(_) => "failed",
    }
}

/// The trace contexts of the doorbells rung, by task.
fn doorbell_traces(rung: &[Delivery]) -> HashMap<TaskId, String> {
    rung.iter()
        .filter_map(|d| serde_json::from_str::<Doorbell>(d.body.get()).ok())
        .filter_map(|d| Some((d.task_id, d.traceparent?)))
        .collect()
}

/// The steps a decision schedules again after a failure (their
/// `step_failed` event names a `retry_in_ms`).
fn retried_steps(changes: &Changes) -> Vec<StepName> {
    changes
        .events
        .iter()
        .filter(|e| e.kind == EventKind::StepFailed && e.detail.get("retry_in_ms").is_some_and(|v| !v.is_null()))
        .filter_map(|e| e.step.clone())
        .collect()
}

/// Records the metrics of a committed decision: the latency of the attempt
/// it answered (from the request's commit, the step's last update, to now),
/// the retries it scheduled and the task's end.
fn record_decision(
    record: &TaskRecord,
    workflow: &rota_workflow::Workflow,
    input: Input<'_>,
    now: rota_model::Timestamp,
    retried: &[StepName],
    ended: Option<TaskState>,
) {
    let workflow_name = record.task.workflow.to_string();
    let answered = match input {
        Input::Reply(reply) => {
            let outcome = match &reply.outcome {
                protocol::ReplyOutcome::Succeeded { .. } => StepOutcome::Succeeded,
                protocol::ReplyOutcome::Failed { retryable: true, .. } => StepOutcome::Retryable,
                protocol::ReplyOutcome::Failed { retryable: false, .. } => StepOutcome::Failed,
            };
            Some((&reply.step, reply.compensate, outcome))
        }
        Input::StepExpired(step, _) => {
            let compensate = record.steps.iter().any(|s| &s.name == step && s.state == rota_model::StepState::Compensating);
            Some((step, compensate, StepOutcome::TimedOut))
        }
        Input::Claimed | Input::Retry(_) | Input::Signalled(_) => None,
    };
    if let Some((step, compensate, outcome)) = answered
        && let (Some(before), Some(def)) = (record.steps.iter().find(|s| &s.name == step), workflow.step(step))
    {
        let agent = match (compensate, def.compensate()) {
            (true, Some(compensation)) => compensation.agent().to_string(),
            // A waiting step's only answer a Scheduler handles is its timeout.
            _ if def.child().is_some() => "workflow".to_owned(),
            _ => def.agent().map_or_else(|| "wait".to_owned(), ToString::to_string),
        };
        let seconds = now.since(before.updated_at).as_secs_f64();
        metrics::histogram!(telemetry::STEP_DURATION, "workflow" => workflow_name.clone(), "step" => step.to_string(),
            "agent" => agent, "outcome" => outcome.label(compensate))
        .record(seconds);
    }
    for step in retried {
        metrics::counter!(telemetry::STEP_RETRIES, "workflow" => workflow_name.clone(), "step" => step.to_string()).increment(1);
    }
    if let Some(state) = ended {
        metrics::counter!(telemetry::TASKS_FINISHED, "workflow" => workflow_name, "state" => state.as_str()).increment(1);
    }
}

/// The consumer of `rota.children`: hands each child's end to its parent's
/// holder ([`crate::child::deliver`]).
struct ChildEnds {
    store: SharedStore,
}

#[async_trait]
impl Handler for ChildEnds {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        let ended: protocol::ChildEnded = match serde_json::from_str(delivery.body.get()) {
            Ok(ended) => ended,
            Err(err) => return Outcome::DeadLetter { reason: format!("not a child's end: {err}") },
        };
        match crate::child::deliver(&self.store, &ended).await {
            Ok(delivered) => {
                tracing::debug!("end of child {} for task {}: {delivered:?}", ended.child, ended.parent);
                Outcome::Complete
            }
            Err(err) => Outcome::Abandon { delay: Duration::from_secs(1), reason: err.to_string() },
        }
    }
}

#[async_trait]
impl Handler for Scheduler {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        let InboxEnvelope { message, traceparent } = match serde_json::from_str(delivery.body.get()) {
            Ok(envelope) => envelope,
            Err(err) => return Outcome::DeadLetter { reason: format!("not an inbox message: {err}") },
        };
        let kind = match &message {
            InboxMessage::Reply(_) => "reply",
            InboxMessage::Retry { .. } => "retry",
            InboxMessage::StepExpired { .. } => "step_expired",
            InboxMessage::Signalled { .. } => "signalled",
            InboxMessage::StartChild { .. } => "start_child",
        };
        let span = tracing::debug_span!("rota.scheduler.handle", task_id = %message.task_id(), message = kind);
        // The Supervisor's timeout reports carry no context: the decision
        // joins the task's trace through its submit's.
        let traceparent = match traceparent {
            None if !span.is_disabled() => self.received_traceparent(message.task_id()).await,
            other => other,
        };
        telemetry::set_parent(&span, traceparent.as_deref());
        let _turn = self.inner.turns.take(message.task_id()).await;
        match Scheduler::handle(self, &message, Some(delivery.lease_token)).instrument(span).await {
            Ok(Handled::Committed) => Outcome::Settled,
            Ok(Handled::Ignored(reason)) => {
                tracing::debug!("inbox message for task {} ignored: {reason}", message.task_id());
                Outcome::Complete
            }
            // Someone moved the task meanwhile: read it again and decide again.
            Err(Error::Store(err)) if err.is_lost_race() => {
                Outcome::Abandon { delay: Duration::from_millis(20), reason: format!("lost a race: {err}") }
            }
            Err(err) => Outcome::Abandon { delay: Duration::from_secs(1), reason: err.to_string() },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;

    #[tokio::test]
    async fn a_task_has_one_turn_at_a_time_and_is_forgotten_after_the_last() {
        let turns = Turns::default();
        let (a, b) = (TaskId::new("a").unwrap(), TaskId::new("b").unwrap());
        let first = turns.take(&a).await;
        // Another task's turn does not wait.
        let other = turns.take(&b).await;
        drop(other);
        let mut waiting = Box::pin(turns.take(&a));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(waiting.as_mut().poll(&mut cx).is_pending(), "the task's second input waits for the first");
        drop(first);
        let second = waiting.await;
        assert_eq!(turns.lock().len(), 1, "b was forgotten, a is held");
        drop(second);
        assert!(turns.lock().is_empty(), "nothing is kept once no one holds or waits");
    }
}
