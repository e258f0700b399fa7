//! The Supervisor: every interval, finds tasks and steps whose
//! complete-by has passed and arranges their recovery. It only requests;
//! the Scheduler and the Agents act:
//!
//! * A leased task whose complete-by passed has lost its Scheduler. The
//!   Supervisor counts a failure and resets it to Pending (after a backoff),
//!   or at the threshold ends it in Error with an alert, or asks for its
//!   compensation, per the workflow. This is the pattern's own example.
//! * A step whose attempt timed out while its task's Scheduler is alive is
//!   reported to that Scheduler (`StepExpired` in its inbox, once per
//!   attempt), which counts the failure and retries or ends the task.
//! * A step left in flight by a task nobody holds is settled as not started,
//!   so that whoever claims the task next starts it afresh.
//! * A running attempt or a leased task past its warning point (`warn_at`,
//!   from the definition's `warn_after`) is at risk: the Supervisor raises
//!   an `at_risk` event and an alert while the complete-by is still ahead,
//!   once per attempt and once per lease (`Tasks::raise_warning`). Raising
//!   one changes no state, lease epoch or attempt, so the task's Scheduler
//!   is not disturbed: its next commit matches as if nothing had happened.
//!
//! * The leader fires the schedules that are due ([`crate::schedules`]),
//!   and wakes at the next fire time when that comes before its next round.
//! * The leader deletes finished tasks past their retention and sweeps the
//!   leftovers of gone instances ([`crate::retention`]), in a spawned
//!   future of its own, so that a backlog never delays a round.
//! * The leader runs the bulk-action batches nobody holds ([`crate::batch`]),
//!   in another such future.
//! * The leader cancels the child workflows whose parent no longer waits
//!   for them ([`crate::child::cancel_stale`]): a cancelled or undone
//!   parent, a step that timed out or moved to another attempt.
//!
//! Several Supervisors may run; a leader lease in the store elects one per
//! interval, and every write is a compare-and-set, so no failed task or step
//! is recovered twice.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rota_model::{Clock, InstanceId, RetryPolicy, Step, Task, TaskState, Timestamp};
use rota_store::{Changes, Event, EventKind, Expired, Outgoing, SharedStore, StepWrite, TaskWrite, Warning};
use serde_json::json;

use crate::batch::{self, Batches};
use crate::client::Client;
use crate::completions::Completions;
use crate::protocol::{self, Doorbell, InboxMessage};
use crate::replies;
use crate::retention::{self, Retention};
use crate::schedules::{self, Firing};
use crate::telemetry;
use crate::workflows::Workflows;
use crate::{Error, Result, Shutdown};

/// The name of the leader lease Supervisors compete for.
pub const LEADER_LEASE: &str = "supervisor";

/// A Supervisor's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// This instance.
    pub instance: InstanceId,
    /// How often it looks for expired deadlines.
    pub interval: Duration,
    /// How long its leadership lasts without renewal (several intervals, so
    /// that one slow round does not hand leadership over).
    pub leader_ttl: Duration,
    /// The most expired records handled per round.
    pub batch: u32,
    /// The backoff before a reset task may be claimed again.
    pub recovery: RetryPolicy,
    /// The seed of the backoff jitter.
    pub seed: u64,
    /// How the leader fires schedules.
    pub schedules: schedules::Config,
    /// How the leader deletes finished tasks and sweeps gone instances.
    pub retention: retention::Config,
    /// How the leader runs the bulk-action batches nobody holds.
    pub batches: batch::Config,
}

impl Config {
    /// The shortest interval: a busier loop only loads the store.
    pub const INTERVAL_MIN: Duration = Duration::from_millis(10);
    /// The longest interval: passed deadlines wait at most this long.
    pub const INTERVAL_MAX: Duration = Duration::from_secs(3_600);
    /// Leadership set by [`Config::every`] lasts this many intervals.
    pub const LEADER_TTL_INTERVALS: u32 = 5;

    /// Defaults for `instance`: every second, leadership for 5 s.
    pub fn new(instance: InstanceId) -> Self {
        Config {
            instance,
            interval: Duration::from_secs(1),
            leader_ttl: Duration::from_secs(1) * Self::LEADER_TTL_INTERVALS,
            batch: 256,
            recovery: crate::scheduler::default_recovery(),
            seed: 0,
            schedules: schedules::Config::default(),
            retention: retention::Config::default(),
            batches: batch::Config::default(),
        }
    }

    /// Rounds every `interval`, with leadership lasting
    /// [`Config::LEADER_TTL_INTERVALS`] of them.
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self.leader_ttl = interval * Self::LEADER_TTL_INTERVALS;
        self
    }

    /// Checks every bound; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if !(Self::INTERVAL_MIN..=Self::INTERVAL_MAX).contains(&self.interval) {
            let why =
                format!("must be between {} and {}, got {}", human(Self::INTERVAL_MIN), human(Self::INTERVAL_MAX), human(self.interval));
            return Err(Error::OutOfBounds { field: "supervisor.interval", why });
        }
        if self.leader_ttl <= self.interval {
            let why = format!("must be longer than the interval ({}), got {}", human(self.interval), human(self.leader_ttl));
            return Err(Error::OutOfBounds { field: "supervisor.leader_ttl", why });
        }
        if self.batch == 0 {
            return Err(Error::OutOfBounds { field: "supervisor.batch", why: "must be at least 1, got 0".into() });
        }
        self.schedules.validate()?;
        self.batches.validate()?;
        self.retention.validate()
    }
}

/// A duration as people write it (`10ms`, `1h`).
pub(crate) fn human(duration: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(duration)
}

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Round {
    /// Whether this instance led the round (only the leader acts).
    pub leader: bool,
    /// Tasks reset to Pending for another claim.
    pub tasks_reset: u32,
    /// Tasks ended in Error or sent to compensation at the threshold.
    pub tasks_ended: u32,
    /// Timed-out steps reported to their Scheduler.
    pub steps_reported: u32,
    /// In-flight steps of unheld tasks settled as not started.
    pub steps_settled: u32,
    /// What the schedules did (the leader fires them).
    pub schedules: schedules::Round,
    /// Warnings raised (`at_risk` events, each with an alert).
    pub warnings_raised: u32,
    /// Child workflows cancelled because their parent no longer waits.
    pub children_cancelled: u32,
}

impl Round {
    /// Adds the round's recoveries to [`telemetry::SUPERVISOR_RECOVERIES`].
    fn record(&self) {
        let kinds = [
            ("task_reset", self.tasks_reset),
            ("task_ended", self.tasks_ended),
            ("step_reported", self.steps_reported),
            ("step_settled", self.steps_settled),
            ("child_cancelled", self.children_cancelled),
        ];
        for (kind, count) in kinds {
            if count > 0 {
                metrics::counter!(telemetry::SUPERVISOR_RECOVERIES, "kind" => kind).increment(u64::from(count));
            }
        }
    }
}

/// The Supervisor.
pub struct Supervisor {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    workflows: Workflows,
    completions: Completions,
    config: Config,
    rng: Mutex<StdRng>,
    firing: Firing,
    retention: Retention,
    batches: Batches,
    client: Client,
}

impl Supervisor {
    /// A Supervisor over `store`.
    pub fn new(store: SharedStore, clock: Arc<dyn Clock>, workflows: Workflows, completions: Completions, config: Config) -> Result<Self> {
        config.validate()?;
        let rng = Mutex::new(StdRng::seed_from_u64(config.seed));
        // A schedule's input was checked against the bound of the client
        // that created it; a fire must not be refused by another bound.
        let client =
            Client::new(store.clone(), clock.clone(), workflows.clone(), Some(completions.clone())).with_input_bytes_max(usize::MAX);
        let batches = Batches::new(client.clone(), config.instance.clone(), config.batches.clone());
        let firing = Firing::new(client.clone(), config.schedules)?;
        let retention = Retention::new(store.clone(), clock.clone(), config.retention.clone())?;
        Ok(Supervisor { store, clock, workflows, completions, config, rng, firing, retention, batches, client })
    }

    /// Runs a round every interval, and at the next fire time of a
    /// schedule when that comes first, until `shutdown`; then gives up
    /// leadership.
    pub async fn run(self, shutdown: Shutdown) -> Result<()> {
        let retention = tokio::spawn(self.retention.clone().run(self.config.instance.clone(), shutdown.clone()));
        let batches = tokio::spawn(self.batches.clone().run_free(shutdown.clone()));
        let mut ticks = tokio::time::interval(self.config.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_fire: Option<Timestamp> = None;
        loop {
            let until_fire = next_fire.map_or(Duration::MAX, |at| at.since(self.clock.now()));
            tokio::select! {
                _ = ticks.tick() => {}
                () = tokio::time::sleep(until_fire), if next_fire.is_some() => {}
                () = shutdown.triggered() => break,
            }
            match self.run_once().await {
                Ok(round) => next_fire = round.schedules.next_fire,
                Err(err) => {
                    next_fire = None;
                    tracing::warn!("supervisor round failed: {err}");
                }
            }
        }
        if let Err(err) = retention.await {
            tracing::warn!("the retention passes ended abnormally: {err}");
        }
        if let Err(err) = batches.await {
            tracing::warn!("the batch runs ended abnormally: {err}");
        }
        if let Err(err) = self.store.release_leader(LEADER_LEASE, &self.config.instance).await {
            tracing::warn!("releasing supervisor leadership: {err}");
        }
        Ok(())
    }

    /// One round: if this instance leads, recover what has expired.
    pub async fn run_once(&self) -> Result<Round> {
        let mut round = Round::default();
        let leadership = self.store.acquire_leader(LEADER_LEASE, &self.config.instance, self.config.leader_ttl).await?;
        if leadership.is_none() {
            return Ok(round);
        }
        round.leader = true;
        self.recover_expired(&mut round).await?;
        self.raise_warnings(&mut round).await?;
        match crate::child::cancel_stale(&self.client, self.config.batch).await {
            Ok(cancelled) => round.children_cancelled = cancelled,
            Err(err) => tracing::warn!("cancelling children their parents left: {err}"),
        }
        round.record();
        // After the recoveries and warnings: a fire's task is new work, a
        // recovery is overdue work.
        match self.firing.run_once().await {
            Ok(schedules) => round.schedules = schedules,
            Err(err) => tracing::warn!("firing schedules: {err}"),
        }
        Ok(round)
    }

    async fn recover_expired(&self, round: &mut Round) -> Result<()> {
        for expired in self.store.expired(self.config.batch).await? {
            let outcome = match expired {
                Expired::Task(task) => self.expire_task(&task, round).await,
                Expired::Step(step) => self.expire_step(&step, round).await,
            };
            match outcome {
                Ok(()) => {}
                // Its Scheduler (or another round) moved it first: nothing to recover.
                Err(Error::Store(err)) if err.is_lost_race() => tracing::debug!("expired record moved meanwhile: {err}"),
                Err(err) => tracing::warn!("recovering an expired record: {err}"),
            }
        }
        Ok(())
    }

    /// Raises the warnings whose point has passed: an `at_risk` event and
    /// an alert (naming the step, for a step's attempt) whose reason says
    /// what passed its warning point and how long remains before its
    /// complete-by. The store appends them only while the task is held and
    /// the attempt or lease is the one found, so never after the work
    /// finished.
    async fn raise_warnings(&self, round: &mut Round) -> Result<()> {
        for warning in self.store.warnings_due(self.config.batch).await? {
            let now = self.clock.now();
            let events = warning_events(&warning, now);
            let send = match &warning {
                Warning::Task(task) => replies::for_warning(task, &events),
                // A step's warning carries no task: read it for its reply queue.
                Warning::Step(step) => match self.store.task(&step.task_id).await? {
                    Some(record) => replies::for_warning(&record.task, &events),
                    None => Vec::new(),
                },
            };
            match self.store.raise_warning(&warning, events, send).await {
                Ok(true) => {
                    round.warnings_raised += 1;
                    metrics::counter!(telemetry::WARNINGS_RAISED, "of" => warning_of(&warning)).increment(1);
                }
                Ok(false) => tracing::debug!("warning for task {} no longer applies", warning.task_id()),
                Err(err) => tracing::warn!("raising a warning for task {}: {err}", warning.task_id()),
            }
        }
        Ok(())
    }

    async fn expire_task(&self, task: &Task, round: &mut Round) -> Result<()> {
        let workflow = self.workflows.get(&task.workflow, Some(task.workflow_version)).await?;
        let now = self.clock.now();
        let backoff = {
            let mut rng = self.rng.lock().expect("supervisor rng");
            self.config.recovery.delay_after(task.failure_count + 1, &mut *rng)
        };
        let next = task
            .expire(now, workflow.max_failures(), backoff, workflow.on_exhausted())
            .map_err(|e| Error::Store(rota_store::Error::Conflict(e.to_string())))?;
        let mut changes = Changes::default();
        let detail = json!({
            "previous_holder": task.locked_by.as_ref().map(|i| i.as_str()),
            "failure_count": next.failure_count,
            "reason": next.error,
        });
        changes.events.push(Event::task(&task.id, now, EventKind::Expired, detail));
        let reason = next.error.clone().unwrap_or_default();
        let reset = match next.state {
            TaskState::Error => {
                let reason = format!("{reason}; failure threshold {} reached", workflow.max_failures());
                changes.events.push(Event::task(&task.id, now, EventKind::Error, json!({ "reason": reason })));
                changes.events.push(Event::task(&task.id, now, EventKind::Alert, json!({ "reason": reason })));
                false
            }
            TaskState::Compensating if task.state == TaskState::Processing => {
                changes.events.push(Event::task(&task.id, now, EventKind::CompensationStarted, json!({ "reason": reason })));
                changes.send.push(doorbell(task, Duration::ZERO));
                false
            }
            _ => {
                changes.send.push(doorbell(task, next.not_before.since(now)));
                true
            }
        };
        let ended = next.state.is_terminal().then_some(next.state);
        // Counted once committed: the same task may come up twice in a round
        // (through an expired step, then its own entry), and the second
        // expiry loses the race.
        changes.tasks.push(TaskWrite::replacing(task, next));
        replies::commit(&self.store, changes).await?;
        if reset {
            round.tasks_reset += 1;
        } else {
            round.tasks_ended += 1;
        }
        if let Some(state) = ended {
            metrics::counter!(telemetry::TASKS_FINISHED, "workflow" => task.workflow.to_string(), "state" => state.as_str()).increment(1);
            self.completions.publish(task.id.clone(), state);
        }
        Ok(())
    }

    async fn expire_step(&self, step: &Step, round: &mut Round) -> Result<()> {
        let Some(record) = self.store.task(&step.task_id).await? else { return Ok(()) };
        let task = &record.task;
        let now = self.clock.now();
        let held = matches!(task.state, TaskState::Processing | TaskState::Compensating) && task.is_leased();
        if held && task.complete_by.is_some_and(|at| at > now) {
            // Its Scheduler is (presumably) alive: ask it to recover the step.
            let message = InboxMessage::StepExpired { task_id: task.id.clone(), step: step.name.clone(), attempt: step.attempt };
            // Keyed by task like replies: handled one at a time with them.
            let mut outgoing = Outgoing::json(&message).expect("inbox messages serialize").with_ordering_key(task.id.as_str());
            if let Some(id) = protocol::message_id(format_args!("expired/{}/{}/{}", task.id, step.name, step.attempt)) {
                outgoing = outgoing.with_id(id);
            }
            let owner = task.locked_by.as_ref().expect("held tasks have an owner");
            let changes = Changes { send: vec![(protocol::inbox(owner), outgoing)], ..Changes::default() };
            replies::commit(&self.store, changes).await?;
            round.steps_reported += 1;
            return Ok(());
        }
        if held {
            // The task's own lease ran out too: expire the task now. Leaving
            // it to the task's own entry would starve it: its steps expired
            // before it, so with enough of them they fill every round's batch.
            return self.expire_task(task, round).await;
        }
        // In a task being undone, a step that timed out is in doubt and gets
        // compensated; otherwise it is simply started afresh by the next holder.
        let in_doubt = task.state == TaskState::Compensating && step.state == rota_model::StepState::Running;
        let settled = if in_doubt { step.settle_in_doubt(now) } else { step.expire(now, Duration::ZERO) }
            .map_err(|e| Error::Store(rota_store::Error::Conflict(e.to_string())))?;
        let detail = json!({ "error": "timed out while its task had no Scheduler", "retryable": !in_doubt, "in_doubt": in_doubt });
        let event = Event::step(step, now, EventKind::StepFailed, detail);
        let changes = Changes { steps: vec![StepWrite::replacing(step, settled)], events: vec![event], ..Changes::default() };
        replies::commit(&self.store, changes).await?;
        round.steps_settled += 1;
        Ok(())
    }
}

/// What a warning is about, as a metric label: `step` or `task`.
fn warning_of(warning: &Warning) -> &'static str {
    match warning {
        Warning::Task(_) => "task",
        Warning::Step(_) => "step",
    }
}

/// The `at_risk` event and the alert of `warning`, raised at `now`.
pub(crate) fn warning_events(warning: &Warning, now: Timestamp) -> Vec<Event> {
    let (complete_by, warn_at) = match warning {
        Warning::Task(task) => (task.complete_by, task.warn_at),
        Warning::Step(step) => (step.complete_by, step.warn_at),
    };
    let left = complete_by.map_or(Duration::ZERO, |by| by.since(now));
    let what = match warning {
        Warning::Task(_) => "the task".to_owned(),
        Warning::Step(step) => format!("step {} attempt {}", step.name, step.attempt),
    };
    let complete_by_ms = complete_by.map(Timestamp::as_millis);
    let reason = format!("{what} passed its warn_after with {} left before its complete-by", human(left));
    let detail = json!({
        "reason": reason,
        "warn_at": warn_at.map(Timestamp::as_millis),
        "complete_by": complete_by_ms,
        "remaining_ms": u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
    });
    let alert = json!({ "reason": reason });
    match warning {
        Warning::Task(task) => {
            vec![Event::task(&task.id, now, EventKind::AtRisk, detail), Event::task(&task.id, now, EventKind::Alert, alert)]
        }
        Warning::Step(step) => vec![Event::step(step, now, EventKind::AtRisk, detail), Event::step(step, now, EventKind::Alert, alert)],
    }
}

fn doorbell(task: &Task, after: Duration) -> (rota_model::QueueName, Outgoing) {
    let outgoing = Outgoing::json(&Doorbell::new(task.id.clone())).expect("doorbells serialize").with_delay(after);
    (protocol::tasks_queue(), outgoing)
}
