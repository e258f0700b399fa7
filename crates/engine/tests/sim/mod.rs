//! The simulated world of `tests/simulation.rs`: a real SQLite store on a
//! temporary file, a shared `ManualClock`, Schedulers and Supervisors driven
//! by hand, and a fake agent in front of a fake remote service, every choice
//! taken by one seeded RNG.
//!
//! Determinism: everything runs on one current-thread runtime and every store
//! operation is awaited before the next starts, so the store's writer thread
//! sees one operation at a time, always the same ones in the same order for a
//! seed. Nothing here reads the system time; the store's only wall-clock
//! timers (its polls and the sweep of expired message ids) change nothing
//! that a receive with no wait or a send can observe.
//!
//! Deliberately left out: true concurrency inside one role (two inbox
//! handlers of one Scheduler racing on one task). Interleavings here are at
//! the grain of whole store operations of different roles.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rota_engine::client::Client;
use rota_engine::protocol::{self, InboxMessage, Reply, ReplyOutcome, StepRequest};
use rota_engine::scheduler::{self, Handled, Scheduler};
use rota_engine::supervisor::{self, Supervisor};
use rota_engine::{Completions, Error as EngineError, Submission, Workflows, ops};
use rota_model::{
    Clock, ExhaustedPolicy, InstanceId, LeaseToken, ManualClock, MessageId, QueueName, RetryPolicy, StepName, StepState, TaskId, TaskState,
    Timestamp, WorkflowName,
};
use rota_store::{Changes, Delivery, EventKind, Outgoing, Receive, SharedStore, TaskFilter};
use rota_store_sqlite::{Config as StoreConfig, Durability, SqliteStore};
use rota_workflow::{AgentCatalog, AgentName, CompensateDef, StepDef, Workflow};
use serde_json::{Value, json};

/// The agent every simulated step runs on.
pub const AGENT: &str = "sim";
/// Every workflow's task-level complete-by.
pub const DEADLINE: Duration = Duration::from_secs(20);
/// Every step's (and compensation's) complete-by.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(2);
/// The step of `approve` that waits, and the signal it waits for.
pub const WAIT_STEP: &str = "approval";
pub const SIGNAL: &str = "ok";
/// The step of `payout` that a callback completes.
pub const CALLBACK_STEP: &str = "transfer";
/// How long it waits.
const WAIT_TIMEOUT: Duration = Duration::from_secs(3);
/// The step of `order` that runs a `parcel` child, and how long it waits
/// for the child: a few of the child's step timeouts, so that faults in
/// the child sometimes outlast it (the step then retries with a new child
/// and the old one is left to the Supervisor).
pub const CHILD_STEP: &str = "ship";
const CHILD_TIMEOUT: Duration = Duration::from_secs(8);
/// `keyed`'s limit per customer: one, so its tasks of one customer run
/// strictly one after another, in submission order.
pub const KEY_LIMIT: u32 = 1;
/// `capped`'s `max_in_flight`.
pub const IN_FLIGHT_MAX: u32 = 2;
/// The customers `keyed` tasks belong to (its concurrency key's values).
const CUSTOMERS: [&str; 2] = ["c0", "c1"];
/// The condition of `choose`'s `express` step, on `quote`'s output.
pub const EXPRESS_WHEN: &str = "steps.quote.output.attempt == 1";
/// Every workflow's failure threshold.
pub const MAX_FAILURES: u32 = 3;
/// How long a Scheduler's claim holds before the workflow's deadline replaces it.
const CLAIM_LEASE: Duration = Duration::from_secs(5);
/// The trace lines kept for a failure report (the whole trace with `ROTA_SIM_TRACE=1`).
const TRACE_TAIL: usize = 80;

/// The command that replays one seed.
pub fn replay_command(seed: u64) -> String {
    format!("ROTA_SIM_SEED={seed} cargo test -p rota-engine --test simulation -- replay --nocapture")
}

/// A backoff between recoveries (of the Scheduler or the Supervisor): short,
/// so that a seed covers several recoveries in a few simulated minutes.
fn recovery(initial_ms: u64, max_ms: u64) -> RetryPolicy {
    RetryPolicy::new(1_000, Duration::from_millis(initial_ms), Duration::from_millis(max_ms)).expect("a valid policy")
}

/// The workflows every seed runs.
pub fn workflows() -> Vec<Workflow> {
    let catalog = AgentCatalog::builtin().with(AgentName::new(AGENT).expect("a valid agent name"));
    let step = |name: &str| StepDef::new(name, AGENT).timeout(STEP_TIMEOUT);
    let undo = || CompensateDef::new(AGENT);
    let base =
        |name: &str, policy: ExhaustedPolicy| Workflow::builder(name, 1).deadline(DEADLINE).max_failures(MAX_FAILURES).on_exhausted(policy);
    vec![
        // Sequential, every step undoable: failures end in compensation.
        base("seq", ExhaustedPolicy::Compensate)
            .step(step("reserve").compensate(undo()))
            .step(step("charge").with_input(json!({ "hold": "{{ steps.reserve.output.key }}" })).compensate(undo()))
            .step(step("ship").compensate(undo()))
            .build(&catalog)
            .expect("seq is valid"),
        // Fan-out and fan-in; the join has nothing to undo.
        base("diamond", ExhaustedPolicy::Compensate)
            .step(step("start").compensate(undo()))
            .step(step("left").depends_on(["start"]).compensate(undo()))
            .step(step("right").depends_on(["start"]).compensate(undo()))
            .step(
                step("join")
                    .depends_on(["left", "right"])
                    .with_input(json!(["{{ steps.left.output.key }}", "{{ steps.right.output.key }}"])),
            )
            .build(&catalog)
            .expect("diamond is valid"),
        // Failures end in Error with an alert; only a cancel compensates.
        base("strict", ExhaustedPolicy::Error)
            .step(step("debit").compensate(undo()))
            .step(step("notify"))
            .build(&catalog)
            .expect("strict is valid"),
        // The first step has nothing to undo: a cancel while it runs ends
        // the task Cancelled at once, abandoning the attempt in flight.
        base("notify", ExhaustedPolicy::Compensate)
            .step(step("announce"))
            .step(step("record").compensate(undo()))
            .build(&catalog)
            .expect("notify is valid"),
        // A step that waits for a signal, which the driver sends at random
        // moments (before the task, before the step, while it waits, after
        // its timeout, after the task ended); the step after it reads it.
        base("approve", ExhaustedPolicy::Compensate)
            .step(step("hold").compensate(undo()))
            .step(StepDef::wait(WAIT_STEP, SIGNAL).timeout(WAIT_TIMEOUT))
            .step(step("pay").with_input(json!({ "approved": "{{ steps.approval.output.n }}" })))
            .build(&catalog)
            .expect("approve is valid"),
        // A condition on an earlier output: `express` runs only when
        // `quote` took effect on its first attempt (the service's output
        // names the attempt that applied it), so the faults decide; the
        // step after it runs either way.
        base("choose", ExhaustedPolicy::Compensate)
            .step(step("quote").compensate(undo()))
            .step(step("express").when(EXPRESS_WHEN).compensate(undo()))
            .step(step("deliver").with_input(json!({ "quote": "{{ steps.quote.output.key }}" })))
            .build(&catalog)
            .expect("choose is valid"),
        // A step the service completes by a callback, which the driver
        // posts at random moments (before the request was accepted, while
        // the step waits, after its attempt timed out or was retried, twice);
        // the step after it reads the callback's output.
        base("payout", ExhaustedPolicy::Compensate)
            .step(step("lock").compensate(undo()))
            .step(step(CALLBACK_STEP).callback().with_input(json!({ "token": "{{ callback.token }}" })).compensate(undo()))
            .step(step("settle").with_input(json!({ "paid": "{{ steps.transfer.output.n }}" })))
            .build(&catalog)
            .expect("payout is valid"),
        // A step run once per item, two at a time: each item is faulted,
        // retried, timed out and compensated on its own; the step after
        // it reads the list of their outputs.
        base("batch", ExhaustedPolicy::Compensate)
            .step(step("open").compensate(undo()))
            .step(step("each").for_each("[10, 11, 12, 13]").max_parallel(2).with_input(json!({ "item": "{{ item }}" })).compensate(undo()))
            .step(step("close").with_input(json!({ "items": "{{ steps.each.output }}" })))
            .build(&catalog)
            .expect("batch is valid"),
        // At most KEY_LIMIT tasks per customer at once, started in
        // submission order.
        base("keyed", ExhaustedPolicy::Compensate)
            .concurrency("input.customer", KEY_LIMIT)
            .step(step("work").compensate(undo()))
            .step(step("finish"))
            .build(&catalog)
            .expect("keyed is valid"),
        // At most IN_FLIGHT_MAX tasks at once; failures end in Error, which
        // frees the slot, and a resubmit waits for one again.
        base("capped", ExhaustedPolicy::Error)
            .max_in_flight(IN_FLIGHT_MAX)
            .step(step("load").compensate(undo()))
            .step(step("store"))
            .build(&catalog)
            .expect("capped is valid"),
        // A step that runs a child workflow (`parcel`), undone like any
        // other step when the order is; the step after it reads the child's
        // output.
        base("order", ExhaustedPolicy::Compensate)
            .step(step("pay").compensate(undo()))
            .step(
                StepDef::run_workflow(CHILD_STEP, "parcel", Some(1))
                    .timeout(CHILD_TIMEOUT)
                    .with_input(json!({ "paid": "{{ steps.pay.output.key }}" }))
                    .compensate(undo()),
            )
            .step(step("confirm").with_input(json!({ "label": "{{ steps.ship.output.label.key }}" })))
            .build(&catalog)
            .expect("order is valid"),
        // The child of `order`: undoes its booking when it is cancelled.
        base("parcel", ExhaustedPolicy::Compensate)
            .step(step("book").compensate(undo()))
            .step(step("label"))
            .build(&catalog)
            .expect("parcel is valid"),
    ]
}

/// What the fake agent does with one request. Chosen per request, by weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fate {
    /// Calls the service and replies at once, as `AgentWorker` does.
    Succeed,
    /// Replies with a transient failure (the agent's retries were used up).
    FailRetryable,
    /// Replies with a permanent failure (unless the service already applied
    /// the effect: an idempotent service answers a repeat with the result).
    FailPermanent,
    /// Completes the request, calls nothing, sends nothing.
    LoseRequest,
    /// Calls the service, completes the request, and the reply is lost.
    LoseReply,
    /// Dies holding the request (perhaps after the call): its lease expires
    /// and the request is delivered again.
    Crash,
    /// Calls the service, completes the request; the reply arrives later.
    Late,
    /// Calls the service and replies twice (once later).
    Duplicate,
    /// Keeps working past the request's lease, then replies and completes in
    /// one commit, which fails if the lease was lost meanwhile.
    Slow,
    /// Calls the service and hands the reply to the requesting Scheduler, if
    /// it is alive, to be decided in the commit that consumes the request
    /// (as an agent in the Scheduler's own engine does); through the inbox
    /// when it is gone or cannot decide.
    InProcess,
}

/// What the driver does in one tick of the fault phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    /// A Scheduler claims (at most one task), after perhaps ringing off the doorbells.
    Claim,
    /// A Scheduler handles one to three messages of its inbox.
    Inbox,
    /// The agent takes one to three requests and meets each with a fate.
    Agent,
    /// A Supervisor's round.
    Supervise,
    /// The clock moves: mostly a little, sometimes past timeouts and deadlines.
    Advance,
    /// The system clock is stepped back (an NTP correction, a VM restored):
    /// mostly by under a second, sometimes by up to half a minute.
    StepBack,
    /// A held reply arrives (or a slow agent finishes) ahead of its time.
    DeliverLate,
    /// A Scheduler's process dies; another instance may take its place.
    CrashScheduler,
    /// A Scheduler's process dies and restarts under the same id (same inbox).
    RestartScheduler,
    /// A second Scheduler starts.
    AddScheduler,
    /// A Supervisor dies holding the leader lease; another starts.
    CrashSupervisor,
    /// The next planned task is submitted.
    Submit,
    /// The operator cancels a task.
    Cancel,
    /// The driver looks for stalled tasks (see `World::find_stalls`).
    Inspect,
    /// The operator resubmits a task in Error.
    Resubmit,
    /// Someone sends a signal to a task (or a signal no step waits for).
    Signal,
    /// The remote service posts a callback with a token it was given (the
    /// current one, an earlier attempt's, or one it used already).
    Callback,
    /// A Scheduler dies after leasing inbox messages, before handling them.
    CrashMidInbox,
    /// A Scheduler dies between its claim's commit and the start's.
    CrashMidClaim,
    /// A Scheduler holding a task with a concurrency key (and so one of
    /// its key's slots) dies; another instance replaces it.
    CrashKeyHolder,
    /// A Scheduler takes ends of child workflows from `rota.children` and
    /// hands each to its parent's holder (or dies before it does).
    ChildEnds,
    /// The operator cancels a parent whose child runs (sometimes the
    /// running child itself).
    CancelParent,
}

/// One seed's mix of faults ("swarm testing": each seed weights the faults
/// differently, some not at all, so that rare combinations come up).
#[derive(Debug, Clone)]
pub struct Profile {
    /// The agent's fates, by weight.
    pub fates: Vec<(Fate, u32)>,
    /// The driver's actions, by weight.
    pub actions: Vec<(Action, u32)>,
    /// The chance that a task has a step the service always declines.
    pub decline: f64,
    /// How many tasks the seed submits.
    pub tasks: usize,
    /// How many ticks the fault phase lasts.
    pub fault_ticks: u32,
    /// The chance that a task is of a workflow with a concurrency key
    /// (`keyed` or `capped`), and that it is a parent (`order`); the other
    /// tasks are of any workflow.
    pub keyed: f64,
    pub parents: f64,
    /// The Schedulers' backoff before a failed step's next attempt (initial, max ms).
    pub scheduler_backoff: (u64, u64),
    /// The Supervisor's backoff before a reset task may be claimed (initial, max ms).
    pub supervisor_backoff: (u64, u64),
}

impl Profile {
    /// The profile of `seed`, drawn from `rng`.
    fn draw(rng: &mut StdRng) -> Profile {
        let mut some = |options: &[u32]| options[rng.random_range(0..options.len())];
        let fates = vec![
            (Fate::Succeed, 60),
            (Fate::FailRetryable, some(&[0, 5, 15])),
            (Fate::FailPermanent, some(&[0, 1, 4])),
            (Fate::LoseRequest, some(&[0, 3, 8])),
            (Fate::LoseReply, some(&[0, 3, 8])),
            (Fate::Crash, some(&[0, 3, 8])),
            (Fate::Late, some(&[0, 5, 12])),
            (Fate::Duplicate, some(&[0, 3, 8])),
            (Fate::Slow, some(&[0, 3, 8])),
            (Fate::InProcess, some(&[0, 20, 60])),
        ];
        let actions = vec![
            (Action::Claim, 12),
            (Action::Inbox, 30),
            (Action::Agent, 30),
            (Action::Supervise, some(&[4, 10])),
            (Action::Advance, 20),
            (Action::StepBack, some(&[0, 1, 3])),
            (Action::DeliverLate, 6),
            (Action::CrashScheduler, some(&[0, 1, 3])),
            (Action::RestartScheduler, some(&[0, 1, 2])),
            (Action::AddScheduler, some(&[0, 2, 4])),
            (Action::CrashSupervisor, some(&[0, 1])),
            (Action::Submit, 4),
            (Action::Cancel, some(&[0, 0, 1])),
            (Action::Inspect, 3),
            (Action::Resubmit, some(&[0, 0, 2])),
            (Action::Signal, some(&[2, 6])),
            (Action::Callback, some(&[3, 8])),
            (Action::CrashMidInbox, some(&[0, 0, 1])),
            (Action::CrashMidClaim, some(&[0, 0, 1])),
            (Action::CrashKeyHolder, some(&[0, 1, 3])),
            (Action::ChildEnds, 8),
            (Action::CancelParent, some(&[0, 2, 4])),
        ];
        let decline = [0.0, 0.1, 0.3][rng.random_range(0..3)];
        let tasks = rng.random_range(3..=6);
        let fault_ticks = rng.random_range(100..=220);
        let scheduler_backoff = [(100, 1_000), (1_000, 8_000)][rng.random_range(0..2)];
        let supervisor_backoff = [(100, 1_000), (1_000, 5_000)][rng.random_range(0..2)];
        let keyed = [0.0, 0.3, 0.6][rng.random_range(0..3)];
        let parents = [0.0, 0.2, 0.4][rng.random_range(0..3)];
        Profile { fates, actions, decline, tasks, fault_ticks, scheduler_backoff, supervisor_backoff, keyed, parents }
    }
}

/// One effect the fake remote service applied, once per idempotency key.
#[derive(Debug, Clone)]
pub struct Effect {
    /// The attempt whose call applied it.
    pub attempt: u32,
    /// The result, returned again to every repeat of the key.
    pub output: Value,
}

/// The fake remote service: idempotent by (task, step, compensate), as the
/// `Idempotency-Key` the agents forward asks of it.
#[derive(Debug, Default)]
pub struct Service {
    /// Applied effects by (task, step, compensate).
    pub effects: BTreeMap<(TaskId, StepName, bool), Effect>,
    /// Calls (repeats included).
    pub calls: u64,
    /// Broken expectations of the engine seen from the service side.
    pub problems: Vec<String>,
    /// Compensations called for effects never applied: (task, step, attempt).
    pub undone_without_effect: Vec<(TaskId, StepName, u32)>,
}

impl Service {
    /// Performs (or repeats) the call of `request`; returns its result.
    fn call(&mut self, request: &StepRequest) -> Value {
        self.calls += 1;
        let call = &request.call;
        if call.compensate && !self.effects.contains_key(&(call.task_id.clone(), call.step.clone(), false)) {
            // Legitimate only for a step in doubt; checked against the history at the end.
            self.undone_without_effect.push((call.task_id.clone(), call.step.clone(), call.attempt));
        }
        if call.idempotency_key != rota_agent::Request::idempotency_key_for(&call.task_id, &call.step, call.compensate) {
            self.problems.push(format!("request {}/{} carries idempotency key {:?}", call.task_id, call.step, call.idempotency_key));
        }
        let key = (call.task_id.clone(), call.step.clone(), call.compensate);
        let effect = self
            .effects
            .entry(key)
            .or_insert_with(|| Effect { attempt: call.attempt, output: json!({ "key": call.idempotency_key, "attempt": call.attempt }) });
        effect.output.clone()
    }

    pub fn applied(&self, task: &TaskId, step: &StepName, compensate: bool) -> bool {
        self.effects.contains_key(&(task.clone(), step.clone(), compensate))
    }
}

/// A reply on its way, or a slow agent still holding its request.
#[derive(Debug)]
enum Held {
    /// A reply in transit until `at`.
    Reply { at: Timestamp, queue: QueueName, message: Outgoing, what: String },
    /// A slow agent that replies at `at` if its request lease still holds.
    Slow { at: Timestamp, request: Box<StepRequest>, token: LeaseToken, fate: Fate },
}

impl Held {
    fn at(&self) -> Timestamp {
        match self {
            Held::Reply { at, .. } | Held::Slow { at, .. } => *at,
        }
    }
}

/// A success reply that a Scheduler handled and ignored.
#[derive(Debug, Clone)]
pub struct IgnoredSuccess {
    pub task: TaskId,
    pub step: StepName,
    pub compensate: bool,
    pub attempt: u32,
    /// The Scheduler's reason (`Handled::Ignored`).
    pub reason: String,
}

/// A task the seed submits.
#[derive(Debug, Clone)]
pub struct Planned {
    pub id: TaskId,
    pub workflow: WorkflowName,
    /// The step whose forward action the service always declines.
    pub declined: Option<StepName>,
    /// Its input's `customer`: `keyed`'s concurrency key.
    pub customer: String,
    pub submitted: bool,
}

/// Counters summed over seeds.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    pub actions: BTreeMap<String, u64>,
    pub fates: BTreeMap<String, u64>,
    pub outcomes: BTreeMap<String, u64>,
    /// Steps with a `when` condition in tasks that ended: ran or skipped.
    pub conditions: BTreeMap<String, u64>,
    pub handled: BTreeMap<String, u64>,
    /// What became of the signals sent: completed a waiting step, kept for
    /// later, refused (by reason), or lost a race.
    pub signals: BTreeMap<String, u64>,
    /// What became of the callbacks posted: taken (by outcome), or refused
    /// (by reason).
    pub callbacks: BTreeMap<String, u64>,
    /// Concurrency keys: holders crashed, tasks taken over holding a slot,
    /// tasks that waited for a slot.
    pub keys: BTreeMap<String, u64>,
    /// Child workflows: how they ended, ends delivered or skipped, parents
    /// cancelled while their child ran, children the Supervisor cancelled.
    pub children: BTreeMap<String, u64>,
    pub late_delivered: u64,
    pub slow_lost_lease: u64,
    pub scheduler_crashes: u64,
    pub supervisor_rounds_led: u64,
    pub tasks_reset: u64,
    pub steps_reported: u64,
    pub steps_settled: u64,
    pub quiet_rounds: u64,
    pub simulated_ms: u64,
    pub leaked_effects: u64,
    pub leaked_after_ignored_reply: u64,
    /// Findings of once-known bug classes (see `known` in simulation.rs),
    /// one line each; each is also a failure of its seed.
    pub known: Vec<String>,
}

impl Counts {
    pub fn add(&mut self, other: &Counts) {
        for (mine, theirs) in [
            (&mut self.actions, &other.actions),
            (&mut self.fates, &other.fates),
            (&mut self.outcomes, &other.outcomes),
            (&mut self.conditions, &other.conditions),
            (&mut self.handled, &other.handled),
            (&mut self.signals, &other.signals),
            (&mut self.callbacks, &other.callbacks),
            (&mut self.keys, &other.keys),
            (&mut self.children, &other.children),
        ] {
            for (k, v) in theirs {
                *mine.entry(k.clone()).or_default() += v;
            }
        }
        self.late_delivered += other.late_delivered;
        self.slow_lost_lease += other.slow_lost_lease;
        self.scheduler_crashes += other.scheduler_crashes;
        self.supervisor_rounds_led += other.supervisor_rounds_led;
        self.tasks_reset += other.tasks_reset;
        self.steps_reported += other.steps_reported;
        self.steps_settled += other.steps_settled;
        self.quiet_rounds += other.quiet_rounds;
        self.simulated_ms += other.simulated_ms;
        self.leaked_effects += other.leaked_effects;
        self.leaked_after_ignored_reply += other.leaked_after_ignored_reply;
        self.known.extend(other.known.iter().cloned());
    }
}

/// A live Scheduler, its instance id, and when this process of it started
/// (the latest time the clock had shown by then: a claim an earlier
/// process made under the same id is not later, even when the clock was
/// stepped back since).
struct Live {
    id: InstanceId,
    scheduler: Scheduler,
    since: Timestamp,
}

/// The simulated world of one seed.
pub struct World {
    pub seed: u64,
    rng: StdRng,
    pub profile: Profile,
    pub clock: Arc<ManualClock>,
    /// The latest time the clock has shown (it may be stepped back).
    latest: Timestamp,
    start: Timestamp,
    pub store: SharedStore,
    _dir: tempfile::TempDir,
    workflows: Workflows,
    pub definitions: BTreeMap<WorkflowName, Workflow>,
    client: Client,
    schedulers: Vec<Live>,
    schedulers_made: u32,
    supervisors: Vec<Supervisor>,
    supervisors_made: u32,
    pub service: Service,
    held: Vec<Held>,
    pub tasks: Vec<Planned>,
    /// Every success reply the agent produced: (task, step, compensate, attempt).
    pub succeeded: BTreeSet<(TaskId, StepName, bool, u32)>,
    pub ignored_successes: Vec<IgnoredSuccess>,
    /// The data of every signal the engine accepted, by task.
    pub signals: BTreeMap<TaskId, Value>,
    /// Every callback token the service was given, in order.
    pub tokens: Vec<String>,
    /// The answer the service gave to each token it called back with
    /// (`true`: success).
    answered: BTreeMap<String, bool>,
    /// The keys (task, step) whose work the service accepted and has not
    /// answered with a failure.
    pending: BTreeSet<(TaskId, StepName)>,
    /// The complete-by of the attempt each token was given for: the
    /// service does no work for a token past it.
    deadlines: BTreeMap<String, Timestamp>,
    /// Every callback the engine took: by (task, step, attempt), its
    /// outcome's output (`None` for a failure).
    pub callbacks: BTreeMap<(TaskId, StepName, u32), Option<Value>>,
    /// Tasks found stalled (see `find_stalls`).
    pub stalls: Vec<String>,
    /// What a look at the concurrency slots found wrong while the seed ran
    /// (see `inspect_slots`).
    pub slot_problems: Vec<String>,
    /// Children a Supervisor leader's round left running though their
    /// parent no longer waited for them (see `supervise`).
    pub children_left: Vec<String>,
    /// Every task as the seed left it, children included: read by the
    /// checks before anything else.
    pub finals: BTreeMap<TaskId, rota_model::Task>,
    trace: Vec<String>,
    trace_all: bool,
    pub counts: Counts,
}

/// A failure of the driver itself (an engine call failed in a way no fault explains).
pub type Fail = String;

impl World {
    /// A fresh world for `seed`: store, workflows, one Scheduler, one Supervisor.
    pub async fn new(seed: u64) -> World {
        World::with_profile(seed, |_| {}).await
    }

    /// A fresh world for `seed` whose drawn profile `adjust` changes first.
    pub async fn with_profile(seed: u64, adjust: impl FnOnce(&mut Profile)) -> World {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut profile = Profile::draw(&mut rng);
        adjust(&mut profile);
        let clock = Arc::new(ManualClock::default());
        let start = clock.now();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut config = StoreConfig::new(dir.path().join("sim.db"));
        config.durability = Durability::Normal;
        config.poll_interval = Duration::from_millis(5);
        let store: SharedStore = Arc::new(SqliteStore::open(config, clock.clone()).expect("open the SQLite store"));
        let workflows = Workflows::new(store.clone());
        let mut definitions = BTreeMap::new();
        for workflow in self::workflows() {
            workflows.register(&workflow).await.expect("register a workflow");
            definitions.insert(workflow.name().clone(), workflow);
        }
        let client = Client::new(store.clone(), clock.clone(), workflows.clone(), None);
        let names: Vec<WorkflowName> = definitions.keys().cloned().collect();
        let name = |text: &str| WorkflowName::new(text).expect("a valid workflow name");
        let mut tasks = Vec::new();
        for i in 0..profile.tasks {
            let workflow = if rng.random_bool(profile.keyed) {
                name(["keyed", "capped"][rng.random_range(0..2)])
            } else if rng.random_bool(profile.parents) {
                name("order")
            } else {
                names[rng.random_range(0..names.len())].clone()
            };
            let customer = CUSTOMERS[rng.random_range(0..CUSTOMERS.len())].to_owned();
            let declined = rng.random_bool(profile.decline).then(|| {
                let steps: Vec<&StepDef> = definitions[&workflow].steps().iter().filter(|s| s.agent().is_some()).collect();
                steps[rng.random_range(0..steps.len())].name().clone()
            });
            let id = TaskId::new(format!("t{i}-{workflow}")).expect("a valid task id");
            tasks.push(Planned { id, workflow, declined, customer, submitted: false });
        }
        let mut world = World {
            seed,
            rng,
            profile,
            latest: clock.now(),
            clock,
            start,
            store,
            _dir: dir,
            workflows,
            definitions,
            client,
            schedulers: Vec::new(),
            schedulers_made: 0,
            supervisors: Vec::new(),
            supervisors_made: 0,
            service: Service::default(),
            held: Vec::new(),
            tasks,
            succeeded: BTreeSet::new(),
            ignored_successes: Vec::new(),
            signals: BTreeMap::new(),
            tokens: Vec::new(),
            answered: BTreeMap::new(),
            pending: BTreeSet::new(),
            deadlines: BTreeMap::new(),
            callbacks: BTreeMap::new(),
            stalls: Vec::new(),
            slot_problems: Vec::new(),
            children_left: Vec::new(),
            finals: BTreeMap::new(),
            trace: Vec::new(),
            trace_all: std::env::var_os("ROTA_SIM_TRACE").is_some(),
            counts: Counts::default(),
        };
        world.note(format!("profile {:?}", world.profile));
        world.add_scheduler(None);
        world.add_supervisor();
        world
    }

    /// Milliseconds since the world began (for the trace).
    fn elapsed_ms(&self) -> i64 {
        self.clock.now().as_millis() - self.start.as_millis()
    }

    /// Appends a line to the trace.
    pub fn note(&mut self, line: String) {
        let line = format!("[{:>7} ms] {line}", self.elapsed_ms());
        if self.trace_all {
            println!("seed {}: {line}", self.seed);
        }
        self.trace.push(line);
    }

    /// The end of the trace, for a failure report.
    pub fn trace_tail(&self) -> String {
        let from = self.trace.len().saturating_sub(TRACE_TAIL);
        self.trace[from..].join("\n")
    }

    /// The whole trace (for the determinism check).
    pub fn trace(&self) -> &[String] {
        &self.trace
    }

    fn count(map: &mut BTreeMap<String, u64>, key: impl std::fmt::Debug) {
        *map.entry(format!("{key:?}")).or_default() += 1;
    }

    fn pick<T: Copy>(&mut self, weighted: &[(T, u32)]) -> T {
        let total: u32 = weighted.iter().map(|(_, w)| w).sum();
        let mut roll = self.rng.random_range(0..total.max(1));
        for (option, weight) in weighted {
            if roll < *weight {
                return *option;
            }
            roll -= weight;
        }
        weighted[0].0
    }

    /// Starts a Scheduler: a new instance, or (`Some`) a restart of one
    /// whose process died, with the same id and therefore the same inbox.
    pub fn add_scheduler(&mut self, restart: Option<InstanceId>) -> InstanceId {
        let id = restart.unwrap_or_else(|| {
            self.schedulers_made += 1;
            InstanceId::new(format!("s{}", self.schedulers_made)).expect("a valid instance id")
        });
        let config = scheduler::Config {
            claim_batch: 1,
            claim_lease: CLAIM_LEASE,
            recovery: recovery(self.profile.scheduler_backoff.0, self.profile.scheduler_backoff.1),
            seed: self.seed ^ (u64::from(self.schedulers_made) << 32),
            ..scheduler::Config::new(id.clone())
        };
        let scheduler = Scheduler::new(self.store.clone(), self.clock.clone(), self.workflows.clone(), Completions::default(), config)
            .expect("a valid scheduler config");
        self.schedulers.push(Live { id: id.clone(), scheduler, since: self.latest.max(self.clock.now()) });
        self.note(format!("scheduler {id} starts"));
        id
    }

    fn add_supervisor(&mut self) {
        self.supervisors_made += 1;
        let id = InstanceId::new(format!("sup{}", self.supervisors_made)).expect("a valid instance id");
        let config = supervisor::Config {
            interval: Duration::from_secs(1),
            leader_ttl: Duration::from_secs(3),
            recovery: recovery(self.profile.supervisor_backoff.0, self.profile.supervisor_backoff.1),
            seed: self.seed ^ (u64::from(self.supervisors_made) << 40),
            ..supervisor::Config::new(id.clone())
        };
        let supervisor = Supervisor::new(self.store.clone(), self.clock.clone(), self.workflows.clone(), Completions::default(), config)
            .expect("a valid supervisor config");
        self.supervisors.push(supervisor);
        self.note(format!("supervisor {id} starts"));
    }

    /// Submits the next planned task, if any is left.
    pub async fn submit_next(&mut self) -> Result<bool, Fail> {
        let Some(planned) = self.tasks.iter_mut().find(|t| !t.submitted) else { return Ok(false) };
        planned.submitted = true;
        let planned = planned.clone();
        let input = json!({ "declined": planned.declined.as_ref().map(|s| s.as_str()), "customer": planned.customer });
        let submission = Submission::new(planned.workflow.clone(), input).with_id(planned.id.clone());
        let submitted = self.client.submit(submission).await.map_err(|e| format!("submitting {}: {e}", planned.id))?;
        if !submitted.created {
            return Err(format!("task {} existed before its submission", planned.id));
        }
        self.note(format!("submit {} (declines {:?})", planned.id, planned.declined.as_ref().map(|s| s.as_str())));
        Ok(true)
    }

    /// Moves the clock.
    pub fn advance(&mut self, by: Duration) {
        self.clock.advance(by);
        self.latest = self.latest.max(self.clock.now());
        self.note(format!("clock +{} ms", by.as_millis()));
    }

    /// Steps the clock back, as a system clock corrected backwards does.
    pub fn step_back(&mut self, by: Duration) {
        self.latest = self.latest.max(self.clock.now());
        self.clock.set(self.clock.now().sub(by));
        self.note(format!("clock -{} ms (stepped back)", by.as_millis()));
    }

    /// One tick of the fault phase.
    pub async fn fault_tick(&mut self) -> Result<(), Fail> {
        let action = self.pick(&self.profile.actions.clone());
        Self::count(&mut self.counts.actions, action);
        match action {
            Action::Claim => {
                let i = self.rng.random_range(0..self.schedulers.len());
                self.claim(i).await?;
            }
            Action::Inbox => {
                let i = self.rng.random_range(0..self.schedulers.len());
                let max = self.rng.random_range(1..=3);
                self.inbox(i, max).await?;
            }
            Action::Agent => {
                let max = self.rng.random_range(1..=3);
                self.agent(max, true).await?;
            }
            Action::Supervise => {
                let i = self.rng.random_range(0..self.supervisors.len());
                self.supervise(i).await?;
            }
            Action::Advance => {
                let by = match self.rng.random_range(0..100) {
                    0..70 => Duration::from_millis(self.rng.random_range(0..300)),
                    70..95 => Duration::from_millis(self.rng.random_range(300..3_000)),
                    _ => Duration::from_millis(self.rng.random_range(3_000..25_000)),
                };
                self.advance(by);
            }
            Action::StepBack => {
                let by = match self.rng.random_range(0..100) {
                    0..70 => Duration::from_millis(self.rng.random_range(1..1_000)),
                    _ => Duration::from_millis(self.rng.random_range(1_000..30_000)),
                };
                self.step_back(by);
            }
            Action::DeliverLate => {
                if !self.held.is_empty() {
                    let i = self.rng.random_range(0..self.held.len());
                    let held = self.held.swap_remove(i);
                    self.release(held).await?;
                }
            }
            Action::CrashScheduler => {
                let i = self.rng.random_range(0..self.schedulers.len());
                let dead = self.schedulers.swap_remove(i);
                self.counts.scheduler_crashes += 1;
                self.note(format!("scheduler {} crashes (its inbox is abandoned)", dead.id));
                if self.schedulers.is_empty() {
                    self.add_scheduler(None);
                }
            }
            Action::CrashMidInbox => {
                // The process dies after leasing inbox messages, before handling them.
                let i = self.rng.random_range(0..self.schedulers.len());
                let id = self.schedulers[i].id.clone();
                let inbox = self.schedulers[i].scheduler.inbox().clone();
                let taken = self.store.receive(&inbox, Receive::up_to(3).by(id.clone())).await.map_err(|e| format!("receiving: {e}"))?;
                self.crash(i, taken.len(), "leasing inbox messages");
            }
            Action::CrashMidClaim => {
                // The process dies between the claim's commit and the start's.
                let i = self.rng.random_range(0..self.schedulers.len());
                let id = self.schedulers[i].id.clone();
                let claimed = self.store.claim_tasks(&id, CLAIM_LEASE, 1).await.map_err(|e| format!("claiming: {e}"))?;
                self.crash(i, claimed.len(), "claiming tasks");
            }
            Action::RestartScheduler => {
                let i = self.rng.random_range(0..self.schedulers.len());
                let dead = self.schedulers.swap_remove(i);
                self.counts.scheduler_crashes += 1;
                self.note(format!("scheduler {} crashes and restarts", dead.id));
                self.add_scheduler(Some(dead.id));
            }
            Action::AddScheduler => {
                if self.schedulers.len() < 2 {
                    self.add_scheduler(None);
                }
            }
            Action::CrashSupervisor => {
                let i = self.rng.random_range(0..self.supervisors.len());
                self.supervisors.swap_remove(i);
                self.note("a supervisor crashes (without giving up its leadership)".into());
                self.add_supervisor();
                if self.supervisors.len() < 2 && self.rng.random_bool(0.5) {
                    self.add_supervisor();
                }
            }
            Action::Submit => {
                self.submit_next().await?;
            }
            Action::Inspect => {
                self.find_stalls().await?;
                self.inspect_slots().await?;
            }
            Action::Resubmit => {
                let filter = TaskFilter { state: Some(TaskState::Error), limit: 1_000, ..TaskFilter::default() };
                let mut failed = Vec::new();
                for task in self.store.list_tasks(&filter).await.map_err(|e| format!("listing tasks: {e}"))? {
                    failed.push(task.id);
                }
                if !failed.is_empty() {
                    let id = failed[self.rng.random_range(0..failed.len())].clone();
                    self.resubmit(&id).await?;
                }
            }
            Action::Signal => {
                let approvals: Vec<TaskId> = self.tasks.iter().filter(|t| t.workflow.as_str() == "approve").map(|t| t.id.clone()).collect();
                if !approvals.is_empty() {
                    let id = approvals[self.rng.random_range(0..approvals.len())].clone();
                    let name = if self.rng.random_bool(0.1) { "nobody-waits" } else { SIGNAL };
                    self.signal(&id, name).await?;
                }
            }
            Action::Callback => {
                if !self.tokens.is_empty() {
                    // Mostly the newest tokens; sometimes any earlier one.
                    let newest = self.tokens.len().saturating_sub(3);
                    let from = if self.rng.random_bool(0.8) { newest } else { 0 };
                    let token = self.tokens[self.rng.random_range(from..self.tokens.len())].clone();
                    self.callback(&token, true).await?;
                }
            }
            Action::Cancel => {
                let submitted: Vec<TaskId> = self.tasks.iter().filter(|t| t.submitted).map(|t| t.id.clone()).collect();
                if !submitted.is_empty() {
                    let id = submitted[self.rng.random_range(0..submitted.len())].clone();
                    self.cancel(&id).await?;
                }
            }
            Action::CrashKeyHolder => self.crash_key_holder().await?,
            Action::ChildEnds => {
                let max = self.rng.random_range(1..=3);
                self.child_ends(max, true).await?;
            }
            Action::CancelParent => self.cancel_parent().await?,
        }
        self.release_due().await
    }

    /// A Scheduler holding a task with a concurrency key dies, with no
    /// restart under its id: the task keeps its slot, Processing under a
    /// dead holder, until the Supervisor expires it and another Scheduler
    /// takes it over.
    async fn crash_key_holder(&mut self) -> Result<(), Fail> {
        let tasks = self
            .store
            .list_tasks(&TaskFilter { limit: 1_000, ..TaskFilter::default() })
            .await
            .map_err(|e| format!("listing tasks: {e}"))?;
        let holders: Vec<(usize, TaskId)> = tasks
            .iter()
            .filter(|t| t.concurrency.is_some() && !t.state.is_terminal())
            .filter_map(|t| {
                let holder = t.locked_by.as_ref()?;
                Some((self.schedulers.iter().position(|l| &l.id == holder)?, t.id.clone()))
            })
            .collect();
        if holders.is_empty() {
            return Ok(());
        }
        let (i, task) = holders[self.rng.random_range(0..holders.len())].clone();
        let dead = self.schedulers.swap_remove(i);
        self.counts.scheduler_crashes += 1;
        *self.counts.keys.entry("holders crashed".to_owned()).or_default() += 1;
        self.note(format!("scheduler {} crashes holding {task}, which holds a concurrency slot", dead.id));
        if self.schedulers.is_empty() || self.rng.random_bool(0.5) {
            self.add_scheduler(None);
        }
        Ok(())
    }

    /// A Scheduler takes up to `max` ends of child workflows and hands each
    /// to its parent's holder, as the consumer of `rota.children` does;
    /// when `faulty`, it sometimes dies holding one (redelivered once its
    /// short lease runs out). Returns how many it took.
    async fn child_ends(&mut self, max: u32, faulty: bool) -> Result<usize, Fail> {
        let queue = protocol::children_queue();
        let i = self.rng.random_range(0..self.schedulers.len());
        let id = self.schedulers[i].id.clone();
        let receive = Receive::up_to(max).leasing(Duration::from_secs(2)).by(id.clone());
        let deliveries = self.store.receive(&queue, receive).await.map_err(|e| format!("receiving child ends: {e}"))?;
        let count = deliveries.len();
        for delivery in deliveries {
            let ended: protocol::ChildEnded =
                serde_json::from_str(delivery.body.get()).map_err(|e| format!("a child's end that does not parse: {e}"))?;
            let what = format!("end of child {} (of {}/{} attempt {})", ended.child, ended.parent, ended.step, ended.attempt);
            if faulty && self.rng.random_bool(0.1) {
                self.note(format!("{id} dies holding the {what}"));
                continue;
            }
            match rota_engine::child::deliver(&self.store, &ended).await {
                Ok(delivered) => {
                    let kind = match &delivered {
                        rota_engine::child::Delivered::Replied(_) => "ends delivered",
                        rota_engine::child::Delivered::Skipped(_) => "ends skipped",
                    };
                    *self.counts.children.entry(kind.to_owned()).or_default() += 1;
                    self.note(format!("{id} takes the {what}: {delivered:?}"));
                    self.complete_request(&queue, delivery.lease_token).await?;
                }
                Err(EngineError::Store(err)) if err.is_lost_race() => {
                    self.note(format!("{id} takes the {what}: lost a race ({err}), abandoned"));
                    match self.store.abandon(&queue, delivery.lease_token, Duration::from_millis(20), Some(err.to_string())).await {
                        Ok(()) | Err(rota_store::Error::LeaseLost(_)) => {}
                        Err(e) => return Err(format!("abandoning a child's end: {e}")),
                    }
                }
                Err(err) => return Err(format!("delivering the {what}: {err}")),
            }
        }
        Ok(count)
    }

    /// The operator cancels a parent while its child runs, or (one time in
    /// four) the running child itself.
    async fn cancel_parent(&mut self) -> Result<(), Fail> {
        let tasks = self
            .store
            .list_tasks(&TaskFilter { limit: 1_000, ..TaskFilter::default() })
            .await
            .map_err(|e| format!("listing tasks: {e}"))?;
        let running: Vec<(TaskId, TaskId)> = tasks
            .iter()
            .filter(|t| !t.state.is_terminal())
            .filter_map(|t| t.parent.as_ref().map(|p| (p.task.clone(), t.id.clone())))
            .collect();
        if running.is_empty() {
            return Ok(());
        }
        let (parent, child) = running[self.rng.random_range(0..running.len())].clone();
        if self.rng.random_bool(0.25) {
            *self.counts.children.entry("children cancelled by the operator".to_owned()).or_default() += 1;
            self.cancel(&child).await
        } else {
            *self.counts.children.entry("parents cancelled while their child ran".to_owned()).or_default() += 1;
            self.cancel(&parent).await
        }
    }

    /// Scheduler `i` crashes after `what` (`count` of them); it restarts
    /// under the same id half the time, else another instance replaces it.
    fn crash(&mut self, i: usize, count: usize, what: &str) {
        let dead = self.schedulers.swap_remove(i);
        self.counts.scheduler_crashes += 1;
        let restart = self.rng.random_bool(0.5);
        self.note(format!("scheduler {} crashes after {what} ({count}){}", dead.id, if restart { " and restarts" } else { "" }));
        if restart {
            self.add_scheduler(Some(dead.id));
        } else if self.schedulers.is_empty() || self.rng.random_bool(0.5) {
            self.add_scheduler(None);
        }
    }

    /// Delivers every held reply that is due.
    async fn release_due(&mut self) -> Result<(), Fail> {
        let now = self.clock.now();
        let mut due = Vec::new();
        let mut i = 0;
        while i < self.held.len() {
            if self.held[i].at() <= now {
                due.push(self.held.remove(i));
            } else {
                i += 1;
            }
        }
        for held in due {
            self.release(held).await?;
        }
        Ok(())
    }

    /// Delivers everything held, due or not.
    async fn release_all(&mut self) -> Result<(), Fail> {
        for held in std::mem::take(&mut self.held) {
            self.release(held).await?;
        }
        Ok(())
    }

    async fn release(&mut self, held: Held) -> Result<(), Fail> {
        match held {
            Held::Reply { queue, message, what, .. } => {
                let sent = self.store.send(&queue, message).await.map_err(|e| format!("sending a late reply: {e}"))?;
                self.counts.late_delivered += 1;
                self.note(format!(
                    "late reply {what} delivered to {queue}{}",
                    if sent.duplicate { " (dropped as a duplicate id)" } else { "" }
                ));
            }
            Held::Slow { request, token, fate, .. } => {
                let outcome = self.outcome(&request, fate);
                let reply = reply_message(&request, outcome, true);
                let changes = Changes {
                    send: vec![(request.reply_to.clone(), reply)],
                    complete: vec![(protocol::agent_queue(AGENT), token)],
                    ..Changes::default()
                };
                let what = describe(&request);
                match self.store.commit(changes).await {
                    Ok(()) => self.note(format!("slow agent finally replies to {what}")),
                    Err(rota_store::Error::LeaseLost(_)) => {
                        self.counts.slow_lost_lease += 1;
                        self.note(format!("slow agent lost the lease of {what}: its reply is dropped"));
                    }
                    Err(e) => return Err(format!("slow reply to {what}: {e}")),
                }
            }
        }
        Ok(())
    }

    /// A Scheduler claims (at most one task) after perhaps ringing off the doorbells.
    async fn claim(&mut self, i: usize) -> Result<usize, Fail> {
        if self.rng.random_bool(0.3) {
            let doorbells = protocol::tasks_queue();
            let rung = self.store.receive(&doorbells, Receive::up_to(256)).await.map_err(|e| format!("doorbells: {e}"))?;
            let tokens: Vec<LeaseToken> = rung.iter().map(|d| d.lease_token).collect();
            if !tokens.is_empty() {
                self.store.complete_batch(&doorbells, &tokens).await.map_err(|e| format!("completing doorbells: {e}"))?;
            }
        }
        let live = &self.schedulers[i];
        let id = live.id.clone();
        let claimed = live.scheduler.claim_once().await.map_err(|e| format!("scheduler {id} claim: {e}"))?;
        if claimed > 0 {
            self.note(format!("scheduler {id} claimed {claimed}"));
        }
        Ok(claimed)
    }

    /// A Scheduler handles up to `max` messages from its inbox. Returns how many.
    async fn inbox(&mut self, i: usize, max: u32) -> Result<usize, Fail> {
        let id = self.schedulers[i].id.clone();
        let inbox = self.schedulers[i].scheduler.inbox().clone();
        let deliveries =
            self.store.receive(&inbox, Receive::up_to(max).by(id.clone())).await.map_err(|e| format!("receiving from {inbox}: {e}"))?;
        let count = deliveries.len();
        for delivery in deliveries {
            self.handle(i, &inbox, &delivery).await?;
        }
        Ok(count)
    }

    async fn handle(&mut self, i: usize, inbox: &QueueName, delivery: &Delivery) -> Result<(), Fail> {
        let id = self.schedulers[i].id.clone();
        let message: InboxMessage =
            serde_json::from_str(delivery.body.get()).map_err(|e| format!("an inbox message that does not parse: {e}"))?;
        let what = describe_inbox(&message);
        let handled = self.schedulers[i].scheduler.handle(&message, Some(delivery.lease_token)).await;
        match handled {
            Ok(Handled::Committed) => {
                Self::count(&mut self.counts.handled, "committed");
                self.note(format!("{id} handles {what}: committed"));
            }
            Ok(Handled::Ignored(reason)) => {
                Self::count(&mut self.counts.handled, "ignored");
                self.note(format!("{id} handles {what}: ignored ({reason})"));
                if let InboxMessage::Reply(Reply { task_id, step, attempt, compensate, outcome: ReplyOutcome::Succeeded { .. } }) = &message
                {
                    self.ignored_successes.push(IgnoredSuccess {
                        task: task_id.clone(),
                        step: step.clone(),
                        compensate: *compensate,
                        attempt: *attempt,
                        reason: reason.clone(),
                    });
                }
                match self.store.complete(inbox, delivery.lease_token).await {
                    Ok(()) | Err(rota_store::Error::LeaseLost(_)) => {}
                    Err(e) => return Err(format!("completing an ignored inbox message: {e}")),
                }
            }
            Err(EngineError::Store(err)) if err.is_lost_race() => {
                Self::count(&mut self.counts.handled, "lost race");
                self.note(format!("{id} handles {what}: lost a race ({err}), abandoned"));
                match self.store.abandon(inbox, delivery.lease_token, Duration::from_millis(20), Some(err.to_string())).await {
                    Ok(()) | Err(rota_store::Error::LeaseLost(_)) => {}
                    Err(e) => return Err(format!("abandoning an inbox message: {e}")),
                }
            }
            Err(err) => return Err(format!("scheduler {id} failed to handle {what}: {err}")),
        }
        Ok(())
    }

    /// One Supervisor round.
    async fn supervise(&mut self, i: usize) -> Result<(), Fail> {
        let round = self.supervisors[i].run_once().await.map_err(|e| format!("supervisor round: {e}"))?;
        if round.leader {
            self.counts.supervisor_rounds_led += 1;
            self.counts.tasks_reset += u64::from(round.tasks_reset);
            self.counts.steps_reported += u64::from(round.steps_reported);
            self.counts.steps_settled += u64::from(round.steps_settled);
            if round != (supervisor::Round { leader: true, ..Default::default() }) {
                self.note(format!("supervisor round: {round:?}"));
            }
            *self.counts.children.entry("cancelled by the Supervisor".to_owned()).or_default() += u64::from(round.children_cancelled);
            self.children_left_by_the_round().await?;
        }
        Ok(())
    }

    /// A leader's round cancels every child whose parent no longer waits
    /// for it (the documented reach of a parent's cancel: its children are
    /// cancelled by the Supervisor's next round), so none is left after it.
    async fn children_left_by_the_round(&mut self) -> Result<(), Fail> {
        let parents = self.tasks.iter().any(|t| self.definitions[&t.workflow].steps().iter().any(|d| d.child().is_some()));
        if !parents {
            return Ok(()); // A seed without parents has no children to leave.
        }
        let left = self.store.stale_children(100).await.map_err(|e| format!("reading stale children: {e}"))?;
        for child in left {
            let line = format!("child {child} still runs after a Supervisor leader's round, though its parent no longer waits for it");
            self.note(format!("CHILD LEFT: {line}"));
            self.children_left.push(line);
        }
        Ok(())
    }

    /// An operator cancels `id` (a refusal is not a failure).
    pub async fn cancel(&mut self, id: &TaskId) -> Result<(), Fail> {
        match self.client.cancel(id, rota_engine::ops::Operator { by: "test", reason: None }).await {
            Ok(state) => self.note(format!("operator cancels {id}: now {state}")),
            Err(ops::Error::Refused { refusal, .. }) => self.note(format!("operator cancel of {id} refused: {refusal}")),
            Err(ops::Error::Engine(EngineError::Store(err))) if err.is_lost_race() => {
                self.note(format!("operator cancel of {id} lost a race: {err}"))
            }
            Err(err) => return Err(format!("cancelling {id}: {err}")),
        }
        Ok(())
    }

    /// Sends the signal `name` to `id`, with data unique to the seed and the
    /// moment. A refusal is not a failure, but an accepted signal no step
    /// waits for, or a second accepted one, is.
    pub async fn signal(&mut self, id: &TaskId, name: &str) -> Result<(), Fail> {
        let data = json!({ "n": self.elapsed_ms() });
        let signal = rota_model::SignalName::new(name).expect("a valid signal name");
        match self.client.signal(id, &signal, data.clone(), "sim").await {
            Ok(delivered) => {
                let what = if delivered.completed { "completed" } else { "kept" };
                *self.counts.signals.entry(what.to_owned()).or_default() += 1;
                self.note(format!("signal {name} to {id}: step {} {what}", delivered.step));
                if name != SIGNAL {
                    return Err(format!("signal {name}, which no step waits for, was accepted by {id}"));
                }
                if let Some(first) = self.signals.insert(id.clone(), data) {
                    return Err(format!("a second signal {name} was accepted by {id} (the first had {first})"));
                }
            }
            Err(ops::Error::Signal { why, .. }) => {
                let reason = format!("{why:?}");
                let kind = reason.split([' ', '{']).next().unwrap_or_default();
                *self.counts.signals.entry(format!("refused: {kind}")).or_default() += 1;
                self.note(format!("signal {name} to {id} refused: {why}"));
            }
            Err(ops::Error::TaskNotFound(_)) => {
                *self.counts.signals.entry("refused: not submitted yet".to_owned()).or_default() += 1;
                self.note(format!("signal {name} to {id} refused: not submitted yet"));
            }
            Err(ops::Error::Engine(EngineError::Store(err))) if err.is_lost_race() => {
                *self.counts.signals.entry("lost a race".to_owned()).or_default() += 1;
                self.note(format!("signal {name} to {id} lost a race: {err}"));
            }
            Err(err) => return Err(format!("signalling {id}: {err}")),
        }
        Ok(())
    }

    /// The service posts a callback with `token`: mostly a success with
    /// output unique to the seed and the moment, sometimes a failure. The
    /// driver knows beforehand whether the engine must take it (the token's
    /// attempt is running, unused, before its complete-by, and its task has
    /// not ended): taking one it must refuse, or refusing one it must take,
    /// fails the seed.
    pub async fn callback(&mut self, text: &str, faulty: bool) -> Result<bool, Fail> {
        let token = rota_engine::callback::Token::parse(text).ok_or_else(|| format!("the service got a malformed token {text:?}"))?;
        let (task, step, attempt) = (token.task().clone(), token.step().clone(), token.attempt());
        let record = self.store.task(&task).await.map_err(|e| format!("reading {task}: {e}"))?.ok_or("a token of no task")?;
        let now = self.clock.now();
        let current = record.steps.iter().find(|s| s.name == step).is_some_and(|s| {
            s.state == StepState::Running && s.attempt == attempt && s.callback_digest.is_some() && s.complete_by.is_some_and(|at| at > now)
        });
        let must_take = current && !record.task.state.is_terminal();
        // The service does the work when it calls back, once per
        // idempotency key: a repeat reports the result of the first, and
        // only work it never did can fail. It posts the same answer again
        // for a token it answered before.
        let applied = self.service.applied(&task, &step, false);
        // Past the attempt's complete-by the service does no work, as
        // agents go silent then; it may still post, and must be refused.
        let too_late = self.deadlines.get(text).is_some_and(|by| now >= *by);
        let roll = match self.answered.get(text) {
            Some(true) => 9,
            Some(false) => 1,
            None if too_late && !applied => 1,
            None if faulty && !applied => self.rng.random_range(0..10),
            None => 9,
        };
        let outcome = match roll {
            0 => rota_engine::callback::Outcome::Failed { error: "the payout bounced".into(), retryable: true },
            1 => rota_engine::callback::Outcome::Failed { error: "the account is closed".into(), retryable: false },
            _ => {
                let output = json!({ "n": self.elapsed_ms() });
                let effect = self.service.effects.entry((task.clone(), step.clone(), false)).or_insert(Effect { attempt, output });
                rota_engine::callback::Outcome::Succeeded { output: effect.output.clone() }
            }
        };
        self.answered.insert(text.to_owned(), roll >= 2);
        // A stale token's late answer says nothing of the key's work.
        if roll < 2 && !too_late {
            self.pending.remove(&(task.clone(), step.clone()));
        }
        let output = match &outcome {
            rota_engine::callback::Outcome::Succeeded { output } => Some(output.clone()),
            rota_engine::callback::Outcome::Failed { .. } => None,
        };
        let what = format!("callback of {task}/{step} attempt {attempt}");
        match self.client.callback(text, outcome, "sim").await {
            Ok(accepted) => {
                let kind = if accepted.completed { "taken: completed" } else { "taken: failed" };
                *self.counts.callbacks.entry(kind.to_owned()).or_default() += 1;
                self.note(format!("{what}: {kind}"));
                if !must_take {
                    return Err(format!("{what} was taken, but that attempt was not waiting for it"));
                }
                if self.callbacks.insert((task, step, attempt), output).is_some() {
                    return Err(format!("{what} was taken twice"));
                }
                return Ok(true);
            }
            Err(ops::Error::Callback(why)) => {
                let reason = format!("{why:?}");
                let kind = reason.split([' ', '{']).next().unwrap_or_default();
                *self.counts.callbacks.entry(format!("refused: {kind}")).or_default() += 1;
                self.note(format!("{what} refused: {why}"));
                if must_take {
                    return Err(format!("{what} was refused, but that attempt was waiting for it: {why}"));
                }
            }
            Err(err) => return Err(format!("{what}: {err}")),
        }
        Ok(false)
    }

    /// An operator resubmits `id`, which ended in Error.
    pub async fn resubmit(&mut self, id: &TaskId) -> Result<(), Fail> {
        match self.client.resubmit(id, None, rota_engine::ops::Operator { by: "test", reason: None }).await {
            Ok(_) => self.note(format!("operator resubmits {id}")),
            Err(ops::Error::Refused { refusal, .. }) => self.note(format!("operator resubmit of {id} refused: {refusal}")),
            Err(ops::Error::Engine(EngineError::Store(err))) if err.is_lost_race() => {
                self.note(format!("operator resubmit of {id} lost a race: {err}"))
            }
            Err(err) => return Err(format!("resubmitting {id}: {err}")),
        }
        Ok(())
    }

    /// The agent takes up to `max` requests and deals with each, faulty or not.
    async fn agent(&mut self, max: u32, faulty: bool) -> Result<usize, Fail> {
        let queue = protocol::agent_queue(AGENT);
        let lease = Duration::from_millis(if faulty { self.rng.random_range(300..4_000) } else { 30_000 });
        let agent = InstanceId::new("agent").expect("a valid instance id");
        let deliveries =
            self.store.receive(&queue, Receive::up_to(max).leasing(lease).by(agent)).await.map_err(|e| format!("agent receive: {e}"))?;
        let count = deliveries.len();
        for delivery in deliveries {
            let request: StepRequest =
                serde_json::from_str(delivery.body.get()).map_err(|e| format!("a step request that does not parse: {e}"))?;
            let fate = if faulty { self.pick(&self.profile.fates.clone()) } else { Fate::Succeed };
            self.serve(&queue, &delivery, &request, fate).await?;
        }
        Ok(count)
    }

    /// What the service answers to `request` when the agent's fate is `fate`.
    fn outcome(&mut self, request: &StepRequest, fate: Fate) -> ReplyOutcome {
        let call = &request.call;
        let declined = !call.compensate
            && self.tasks.iter().any(|t| t.id == call.task_id && t.declined.as_ref() == Some(&call.step))
            && !self.service.applied(&call.task_id, &call.step, false);
        let applied = self.service.applied(&call.task_id, &call.step, call.compensate);
        // An idempotent service serializes calls with one key: while a slow
        // call that will succeed is in flight, a second call cannot be
        // declined for good, it is told to retry (as a 409 "in progress").
        let in_flight = self.held.iter().any(|held| match held {
            Held::Slow { request: other, fate: Fate::Succeed, .. } => {
                other.call.task_id == call.task_id && other.call.step == call.step && other.call.compensate == call.compensate
            }
            _ => false,
        });
        let fate = if fate == Fate::FailPermanent && in_flight { Fate::FailRetryable } else { fate };
        // Work it accepted for this key and has not answered yet is in
        // flight too: it cannot decline the key now, it accepts it again.
        let pending = call.callback_token.is_some() && self.pending.contains(&(call.task_id.clone(), call.step.clone()));
        let (fate, declined) = if pending { (Fate::Succeed, false) } else { (fate, declined) };
        match fate {
            Fate::FailPermanent if !applied => ReplyOutcome::Failed { error: "declined by the service".into(), retryable: false },
            Fate::FailRetryable => ReplyOutcome::Failed { error: "the service is unavailable".into(), retryable: true },
            _ if declined => ReplyOutcome::Failed { error: "declined by the service".into(), retryable: false },
            _ if call.callback_token.is_some() => {
                // The service keeps the token, whatever becomes of the
                // reply, and accepts the work: it does it when it calls
                // back (see `callback`).
                self.tokens.push(call.callback_token.clone().unwrap_or_default());
                self.deadlines.insert(call.callback_token.clone().unwrap_or_default(), request.complete_by());
                self.pending.insert((call.task_id.clone(), call.step.clone()));
                self.succeeded.insert((call.task_id.clone(), call.step.clone(), call.compensate, call.attempt));
                ReplyOutcome::Succeeded { output: json!({ "accepted": true }) }
            }
            _ => {
                let output = self.service.call(request);
                self.succeeded.insert((call.task_id.clone(), call.step.clone(), call.compensate, call.attempt));
                ReplyOutcome::Succeeded { output }
            }
        }
    }

    async fn serve(&mut self, queue: &QueueName, delivery: &Delivery, request: &StepRequest, fate: Fate) -> Result<(), Fail> {
        let what = describe(request);
        let now = self.clock.now();
        if now >= request.complete_by() {
            // As AgentWorker: past its complete-by the request is dropped without a reply.
            self.note(format!("agent drops {what}: past its complete-by"));
            return self.complete_request(queue, delivery.lease_token).await;
        }
        Self::count(&mut self.counts.fates, fate);
        match fate {
            Fate::Succeed | Fate::FailRetryable | Fate::FailPermanent => {
                let outcome = self.outcome(request, fate);
                self.note(format!("agent {fate:?} {what}: {}", short(&outcome)));
                let changes = Changes {
                    send: vec![(request.reply_to.clone(), reply_message(request, outcome, true))],
                    complete: vec![(queue.clone(), delivery.lease_token)],
                    ..Changes::default()
                };
                self.commit_reply(changes, &what).await?;
            }
            Fate::LoseRequest => {
                self.note(format!("agent loses {what} before calling the service"));
                self.complete_request(queue, delivery.lease_token).await?;
            }
            Fate::LoseReply => {
                let outcome = self.outcome(request, Fate::Succeed);
                self.note(format!("agent loses the reply to {what}: {}", short(&outcome)));
                self.complete_request(queue, delivery.lease_token).await?;
            }
            Fate::Crash => {
                let called = self.rng.random_bool(0.5);
                if called {
                    self.outcome(request, Fate::Succeed);
                }
                self.note(format!("agent crashes holding {what} (service called: {called})"));
            }
            Fate::Late | Fate::Duplicate => {
                let outcome = self.outcome(request, Fate::Succeed);
                let at = now.add(Duration::from_millis(self.rng.random_range(100..8_000)));
                let keep_id = self.rng.random_bool(0.5);
                let late = reply_message(request, outcome.clone(), fate == Fate::Late || keep_id);
                let mut changes = Changes { complete: vec![(queue.clone(), delivery.lease_token)], ..Changes::default() };
                if fate == Fate::Duplicate {
                    changes.send.push((request.reply_to.clone(), reply_message(request, outcome.clone(), true)));
                }
                self.note(format!("agent {fate:?} {what}: {} (the late copy at +{} ms)", short(&outcome), at.since(now).as_millis()));
                self.commit_reply(changes, &what).await?;
                self.held.push(Held::Reply { at, queue: request.reply_to.clone(), message: late, what });
            }
            Fate::InProcess => {
                let fate = self.pick(&[(Fate::Succeed, 8), (Fate::FailRetryable, 1), (Fate::FailPermanent, 1)]);
                let outcome = self.outcome(request, fate);
                self.reply_in_process(queue, delivery, request, outcome, &what).await?;
            }
            Fate::Slow => {
                let at = now.add(Duration::from_millis(self.rng.random_range(100..6_000)));
                let inner = self.pick(&[(Fate::Succeed, 8), (Fate::FailRetryable, 1), (Fate::FailPermanent, 1)]);
                self.note(format!("agent works slowly on {what} ({inner:?} at +{} ms)", at.since(now).as_millis()));
                self.held.push(Held::Slow { at, request: Box::new(request.clone()), token: delivery.lease_token, fate: inner });
            }
        }
        Ok(())
    }

    /// Hands `outcome` to the live Scheduler whose inbox the request names,
    /// as `AgentWorker::replying_in_process` does, and commits it to the
    /// inbox when there is none or it could not decide.
    async fn reply_in_process(
        &mut self,
        queue: &QueueName,
        delivery: &Delivery,
        request: &StepRequest,
        outcome: ReplyOutcome,
        what: &str,
    ) -> Result<(), Fail> {
        let call = &request.call;
        let reply =
            Reply { task_id: call.task_id.clone(), step: call.step.clone(), attempt: call.attempt, compensate: call.compensate, outcome };
        let live = self.schedulers.iter().find(|l| l.scheduler.inbox() == &request.reply_to).map(|l| (l.id.clone(), l.scheduler.clone()));
        if let Some((id, scheduler)) = live {
            let decided = scheduler.decide_reply(&reply, &request.reply_to, queue, delivery.lease_token).await;
            let fallback = match decided {
                Some(Ok(Handled::Committed)) => {
                    Self::count(&mut self.counts.handled, "committed in-process");
                    self.note(format!("{id} decides {what} in-process: {}: committed", short(&reply.outcome)));
                    return Ok(());
                }
                Some(Ok(Handled::Ignored(reason))) => {
                    Self::count(&mut self.counts.handled, "ignored in-process");
                    self.note(format!("{id} decides {what} in-process: {}: ignored ({reason})", short(&reply.outcome)));
                    if let ReplyOutcome::Succeeded { .. } = &reply.outcome {
                        self.ignored_successes.push(IgnoredSuccess {
                            task: reply.task_id.clone(),
                            step: reply.step.clone(),
                            compensate: reply.compensate,
                            attempt: reply.attempt,
                            reason,
                        });
                    }
                    return self.complete_request(queue, delivery.lease_token).await;
                }
                Some(Err(err)) => format!("not decided ({err})"),
                None => "not for a running Scheduler".to_owned(),
            };
            self.note(format!("{id} decides {what} in-process: {fallback}: sent to the inbox"));
        }
        let changes = Changes {
            send: vec![(request.reply_to.clone(), reply_message(request, reply.outcome, true))],
            complete: vec![(queue.clone(), delivery.lease_token)],
            ..Changes::default()
        };
        self.commit_reply(changes, what).await
    }

    /// Commits a reply with the completion of its request, as `AgentWorker`
    /// does: a lost request lease means the request is someone else's now.
    async fn commit_reply(&mut self, changes: Changes, what: &str) -> Result<(), Fail> {
        match self.store.commit(changes).await {
            Ok(()) => Ok(()),
            Err(rota_store::Error::LeaseLost(_)) => {
                self.note(format!("agent lost the lease of {what}: its reply is dropped"));
                Ok(())
            }
            Err(e) => Err(format!("agent reply to {what}: {e}")),
        }
    }

    async fn complete_request(&mut self, queue: &QueueName, token: LeaseToken) -> Result<(), Fail> {
        match self.store.complete(queue, token).await {
            Ok(()) | Err(rota_store::Error::LeaseLost(_)) => Ok(()),
            Err(e) => Err(format!("completing a request: {e}")),
        }
    }

    /// The fault phase: submits the tasks and runs `profile.fault_ticks` ticks.
    pub async fn fault_phase(&mut self) -> Result<(), Fail> {
        // Half the tasks at once, the rest during the phase (and any left at its end).
        for _ in 0..self.tasks.len().div_ceil(2) {
            self.submit_next().await?;
        }
        for _ in 0..self.profile.fault_ticks {
            self.fault_tick().await?;
        }
        while self.submit_next().await? {}
        Ok(())
    }

    /// The quiet phase: no more faults; every role keeps working and time
    /// keeps moving until every task is terminal or `rounds_max` rounds pass.
    /// Returns whether every task ended.
    pub async fn quiet_phase(&mut self, rounds_max: u32) -> Result<bool, Fail> {
        self.note("quiet phase".into());
        self.release_all().await?;
        // The service calls back for every request it still owes an answer.
        for token in self.tokens.clone() {
            self.callback(&token, false).await?;
        }
        for _ in 0..rounds_max {
            self.counts.quiet_rounds += 1;
            let posted = self.tokens.len();
            let mut busy = self.agent(100, false).await?;
            loop {
                let taken = self.child_ends(50, false).await?;
                busy += taken;
                if taken == 0 {
                    break;
                }
            }
            // The service calls back for every request it was just given.
            let given: Vec<String> = self.tokens[posted..].to_vec();
            for token in given {
                busy += usize::from(self.callback(&token, false).await?);
            }
            for i in 0..self.schedulers.len() {
                loop {
                    let handled = self.inbox(i, 50).await?;
                    busy += handled;
                    if handled == 0 {
                        break;
                    }
                }
                while self.claim(i).await? > 0 {
                    busy += 1;
                }
            }
            for i in 0..self.supervisors.len() {
                self.supervise(i).await?;
            }
            if busy == 0 {
                // A stall lasts until the task's deadline, so idle rounds are enough to find it.
                self.find_stalls().await?;
            }
            if self.all_terminal().await? {
                return Ok(true);
            }
            // Idle rounds wait for a complete-by or a backoff: move faster.
            self.advance(Duration::from_millis(if busy > 0 { 200 } else { 1_000 }));
        }
        Ok(false)
    }

    /// Finds tasks held by a live Scheduler that nothing will move before
    /// their deadline: no step in flight and nothing in the holder's inbox
    /// (no reply, no Retry, no timeout report on its way). Every role has
    /// just done all it could, so such a task only waits for the Supervisor
    /// to expire it, which counts a failure it never had.
    async fn find_stalls(&mut self) -> Result<(), Fail> {
        let filter = TaskFilter { limit: 1_000, ..TaskFilter::default() };
        let tasks = self.store.list_tasks(&filter).await.map_err(|e| format!("listing tasks: {e}"))?;
        let stats = self.store.stats().await.map_err(|e| format!("queue stats: {e}"))?;
        for task in tasks {
            let Some(holder) = task.locked_by.as_ref().and_then(|o| self.schedulers.iter().find(|l| &l.id == o)) else { continue };
            let (owner, since) = (&holder.id.clone(), holder.since);
            if task.state.is_terminal() || self.stalls.iter().any(|s| s.starts_with(&format!("task {} ", task.id))) {
                continue;
            }
            let inbox = protocol::inbox(owner);
            if stats.iter().find(|q| q.queue == inbox).is_some_and(|q| q.ready + q.leased + q.delayed > 0) {
                continue;
            }
            let record = self.store.task(&task.id).await.map_err(|e| format!("reading {}: {e}", task.id))?.ok_or("a task vanished")?;
            if record.steps.iter().any(|s| matches!(s.state, StepState::Running | StepState::Compensating)) {
                continue;
            }
            // A task claimed by an earlier process under the same id (which
            // died between its claim and its start) waits for its claim lease,
            // as it would under another id: recovered by the Supervisor, by design.
            let history = self.store.history(&task.id).await.map_err(|e| format!("history of {}: {e}", task.id))?;
            let claimed_at = history.iter().rev().find(|e| e.kind == EventKind::Claimed).map(|e| e.at);
            if claimed_at.is_some_and(|at| at > since) {
                let steps: Vec<String> = record
                    .steps
                    .iter()
                    .map(|s| {
                        format!(
                            "{}={}#{} not_before {:+} ms",
                            s.name,
                            s.state,
                            s.attempt,
                            s.not_before.as_millis() - self.clock.now().as_millis()
                        )
                    })
                    .collect();
                let line = format!(
                    "task {} ({}) is held by live Scheduler {owner} until {:+} ms with nothing in flight and nothing in its inbox; steps: {}",
                    task.id,
                    task.state,
                    task.complete_by.map_or(0, |at| at.as_millis() - self.clock.now().as_millis()),
                    steps.join(", ")
                );
                self.note(format!("STALL: {line}"));
                self.stalls.push(line);
            }
        }
        Ok(())
    }

    /// Checks the concurrency slots against the tasks now: no key has more
    /// holders than its limit, every holder is a task of that key that
    /// has not ended (a slot outliving its task would hold its key back
    /// for good), and every Processing task with a key holds a slot.
    pub async fn inspect_slots(&mut self) -> Result<(), Fail> {
        let tasks = self
            .store
            .list_tasks(&TaskFilter { limit: 1_000, ..TaskFilter::default() })
            .await
            .map_err(|e| format!("listing tasks: {e}"))?;
        let keys: BTreeSet<(WorkflowName, String, u32)> =
            tasks.iter().filter_map(|t| t.concurrency.as_ref().map(|c| (t.workflow.clone(), c.key.clone(), c.limit))).collect();
        let mut found = Vec::new();
        for (workflow, key, limit) in keys {
            let holders = self.store.key_holders(&workflow, &key).await.map_err(|e| format!("reading the holders of {key}: {e}"))?;
            if holders.len() > limit as usize {
                found.push(format!("key {workflow}/{key} has {} holders, over its limit of {limit}: {holders:?}", holders.len()));
            }
            for holder in &holders {
                match tasks.iter().find(|t| &t.id == holder) {
                    Some(task) if task.state.is_terminal() => {
                        found.push(format!("task {holder} holds a slot of {workflow}/{key}, though it ended {}", task.state));
                    }
                    Some(task) if task.concurrency.as_ref().is_none_or(|c| c.key != key) || task.workflow != workflow => {
                        found.push(format!("task {holder} holds a slot of {workflow}/{key}, which is not its key"));
                    }
                    Some(_) => {}
                    None => found.push(format!("a slot of {workflow}/{key} is held by {holder}, which does not exist")),
                }
            }
            for task in tasks.iter().filter(|t| t.workflow == workflow && t.state == TaskState::Processing) {
                if task.concurrency.as_ref().is_some_and(|c| c.key == key) && !holders.contains(&task.id) {
                    found.push(format!("task {} of key {workflow}/{key} is processing without a slot", task.id));
                }
            }
        }
        for line in found {
            self.note(format!("SLOTS: {line}"));
            self.slot_problems.push(line);
        }
        Ok(())
    }

    /// Whether every planned task exists and every task, children included, has ended.
    async fn all_terminal(&self) -> Result<bool, Fail> {
        let filter = TaskFilter { limit: 1_000, ..TaskFilter::default() };
        let tasks = self.store.list_tasks(&filter).await.map_err(|e| format!("listing tasks: {e}"))?;
        let planned = tasks.iter().filter(|t| t.parent.is_none()).count();
        Ok(planned == self.tasks.len() && tasks.iter().all(|t| t.state.is_terminal()))
    }

    /// Records the simulated time spent.
    pub fn finish(&mut self) {
        self.counts.simulated_ms += u64::try_from(self.elapsed_ms()).unwrap_or(0);
    }

    /// Drops the Scheduler at `i`, as a process crash would.
    pub fn crash_scheduler(&mut self, i: usize) -> InstanceId {
        let dead = self.schedulers.remove(i);
        self.note(format!("scheduler {} crashes", dead.id));
        dead.id
    }

    /// Targeted scenarios: the agent's next request, answered with `fate`.
    pub async fn agent_once(&mut self, fate: Fate) -> Result<Option<StepRequest>, Fail> {
        let queue = protocol::agent_queue(AGENT);
        let agent = InstanceId::new("agent").expect("a valid instance id");
        let mut deliveries = self.store.receive(&queue, Receive::up_to(1).by(agent)).await.map_err(|e| format!("agent receive: {e}"))?;
        let Some(delivery) = deliveries.pop() else { return Ok(None) };
        let request: StepRequest = serde_json::from_str(delivery.body.get()).map_err(|e| format!("bad request: {e}"))?;
        self.serve(&queue, &delivery, &request, fate).await?;
        Ok(Some(request))
    }

    /// Targeted scenarios: handles every message in Scheduler `i`'s inbox.
    pub async fn drain_inbox(&mut self, i: usize) -> Result<usize, Fail> {
        let mut total = 0;
        loop {
            let handled = self.inbox(i, 50).await?;
            total += handled;
            if handled == 0 {
                return Ok(total);
            }
        }
    }

    /// Targeted scenarios: Scheduler `i` claims once.
    pub async fn claim_with(&mut self, i: usize) -> Result<usize, Fail> {
        self.claim(i).await
    }

    /// Targeted scenarios: the operators' client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Targeted scenarios: every Supervisor dies (the leader without giving
    /// up its lease) and a new one starts.
    pub fn crash_supervisors(&mut self) {
        self.supervisors.clear();
        self.note("every supervisor crashes (the leader keeps its lease until it runs out)".into());
        self.add_supervisor();
    }

    /// Targeted scenarios: one round of every Supervisor.
    pub async fn supervise_all(&mut self) -> Result<(), Fail> {
        for i in 0..self.supervisors.len() {
            self.supervise(i).await?;
        }
        Ok(())
    }

    /// Targeted scenarios: one round of the first Supervisor.
    pub async fn supervise_once(&mut self) -> Result<(), Fail> {
        self.supervise(0).await
    }

    /// Targeted scenarios: delivers every held reply now.
    pub async fn deliver_held(&mut self) -> Result<usize, Fail> {
        let count = self.held.len();
        self.release_all().await?;
        Ok(count)
    }

    /// Targeted scenarios: looks for stalled tasks now.
    pub async fn find_stalls_now(&mut self) -> Result<(), Fail> {
        self.find_stalls().await
    }

    /// Whether the task is in `state` now.
    pub async fn state(&self, id: &TaskId) -> TaskState {
        self.store.task(id).await.expect("read a task").expect("the task exists").task.state
    }
}

/// The reply message an agent sends for `request`, as `AgentWorker` builds it
/// (with its message id unless `with_id` is false, which makes the store
/// accept a duplicate so that the Scheduler's fence has to refuse it).
fn reply_message(request: &StepRequest, outcome: ReplyOutcome, with_id: bool) -> Outgoing {
    let call = &request.call;
    let reply = InboxMessage::Reply(Reply {
        task_id: call.task_id.clone(),
        step: call.step.clone(),
        attempt: call.attempt,
        compensate: call.compensate,
        outcome,
    });
    let mut message = Outgoing::json(&reply).expect("replies serialize").with_ordering_key(call.task_id.as_str());
    let suffix = if call.compensate { "/compensate" } else { "" };
    if with_id && let Ok(id) = MessageId::new(format!("rep/{}/{}{suffix}/{}", call.task_id, call.step, call.attempt)) {
        message = message.with_id(id);
    }
    message
}

fn describe(request: &StepRequest) -> String {
    let call = &request.call;
    let undo = if call.compensate { " (compensate)" } else { "" };
    format!("{}/{}{undo} attempt {}", call.task_id, call.step, call.attempt)
}

fn describe_inbox(message: &InboxMessage) -> String {
    match message {
        InboxMessage::Reply(reply) => {
            let undo = if reply.compensate { " (compensate)" } else { "" };
            format!("reply {}/{}{undo} attempt {} {}", reply.task_id, reply.step, reply.attempt, short(&reply.outcome))
        }
        InboxMessage::Retry { task_id, step } => format!("retry {task_id}/{step}"),
        InboxMessage::StepExpired { task_id, step, attempt } => format!("step expired {task_id}/{step} attempt {attempt}"),
        InboxMessage::Signalled { task_id, step } => format!("signalled {task_id}/{step}"),
        InboxMessage::StartChild { task_id, step, attempt } => format!("start child {task_id}/{step} attempt {attempt}"),
    }
}

fn short(outcome: &ReplyOutcome) -> String {
    match outcome {
        ReplyOutcome::Succeeded { .. } => "ok".into(),
        ReplyOutcome::Failed { retryable: true, .. } => "transient failure".into(),
        ReplyOutcome::Failed { retryable: false, .. } => "permanent failure".into(),
    }
}
