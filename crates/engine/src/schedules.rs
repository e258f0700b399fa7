//! Schedules at work: which fires are due and what each one does
//! ([`plan`], a pure function), and the leader's round that starts them
//! ([`Firing`], run by the [`Supervisor`](crate::Supervisor) leader only).
//!
//! A fire submits the schedule's workflow through the ordinary submission
//! path with a task id derived from the schedule and the fire time
//! ([`rota_model::schedule::fire_task_id`]), then records the schedule's
//! progress with a compare-and-set on its version. Two leaders (a failover,
//! a restart, a lease that ran out mid-round) that fire the same time
//! submit the same id, and the store creates one task: a fire that finds
//! its task already created (`Created::Existing`) has already fired. A
//! leader that dies between the submission and the advance leaves the
//! progress behind; the next leader fires the same time again, finds the
//! task, and advances.
//!
//! Due fires: every fire time after the schedule's `fired_through` and at
//! or before now. One found more than [`Config::late_max`] after its time
//! is *missed* and follows the schedule's catch-up policy; the others start
//! (subject to the overlap policy). A round handles at most
//! [`Config::fires_per_round`] fires of a schedule, oldest first, so that
//! catching up a year of downtime cannot flood the store; the rest follow
//! in the next rounds.
//!
//! Deliberately left out: the manual fire (`trigger`), which is an
//! operator's request ([`Client::trigger_schedule`]) and touches no
//! progress.

use std::sync::Arc;
use std::time::Duration;

use rota_model::schedule::{fire_task_id, manual_task_id, rfc3339_seconds};
use rota_model::{CatchUp, Clock, Cron, Overlap, ScheduleName, TaskId, Timestamp};
use rota_store::{AuditAction, NewSchedule, ScheduleProgress, ScheduleRecord, SharedStore};
use serde_json::json;

use crate::client::{Client, Fired, Submission, Submitted};
use crate::ops::Operator;
use crate::{Error, Result};
use crate::{ops, telemetry};

/// How schedules fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// A fire found later than this after its time is missed: it follows
    /// the catch-up policy instead of starting. Long enough for a
    /// Supervisor failover (the leader lease's time to live and a round).
    pub late_max: Duration,
    /// The most fires of one schedule a round handles (started, buffered
    /// or skipped), oldest first; the rest wait for the next rounds.
    pub fires_per_round: u32,
}

impl Config {
    /// The shortest lateness bound: shorter than a round, every fire would
    /// be missed.
    pub const LATE_MAX_MIN: Duration = Duration::from_secs(1);
    /// The longest lateness bound.
    pub const LATE_MAX_MAX: Duration = Duration::from_secs(7 * 24 * 3600);
    /// The most fires per round a config may allow.
    pub const FIRES_PER_ROUND_MAX: u32 = 10_000;

    /// Checks every bound; the error names the field.
    pub fn validate(&self) -> Result<()> {
        if !(Self::LATE_MAX_MIN..=Self::LATE_MAX_MAX).contains(&self.late_max) {
            let why = format!(
                "must be between {} and {}, got {}",
                crate::supervisor::human(Self::LATE_MAX_MIN),
                crate::supervisor::human(Self::LATE_MAX_MAX),
                crate::supervisor::human(self.late_max)
            );
            return Err(Error::OutOfBounds { field: "schedules.late_max", why });
        }
        if !(1..=Self::FIRES_PER_ROUND_MAX).contains(&self.fires_per_round) {
            let why = format!("must be between 1 and {}, got {}", Self::FIRES_PER_ROUND_MAX, self.fires_per_round);
            return Err(Error::OutOfBounds { field: "schedules.fires_per_round", why });
        }
        Ok(())
    }
}

impl Default for Config {
    /// A minute's lateness, 100 fires per round.
    fn default() -> Self {
        Config { late_max: Duration::from_secs(60), fires_per_round: 100 }
    }
}

/// What a round does with one schedule: the fires to start, in order, and
/// the progress to record once they are submitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Fire times whose tasks start now.
    pub start: Vec<Timestamp>,
    /// Fires the overlap policy skipped.
    pub skipped: Vec<Timestamp>,
    /// Missed fires the catch-up policy skipped, counted up to the round's
    /// bound (for the log and the metric).
    pub missed: u32,
    /// The schedule's progress after this round.
    pub progress: ScheduleProgress,
}

impl Plan {
    /// Whether the round changes nothing.
    pub fn is_idle(&self, before: &ScheduleProgress) -> bool {
        self.start.is_empty() && self.progress == *before
    }
}

/// Which fires of `record` are due at `now` and what each does, given
/// whether the task of its last fire is still running. Pure.
pub fn plan(record: &ScheduleRecord, cron: &Cron, now: Timestamp, previous_running: bool, config: &Config) -> Plan {
    let mut progress = record.progress.clone();
    let mut start = Vec::new();
    let mut skipped = Vec::new();
    let mut running = previous_running;
    let max = config.fires_per_round as usize;
    let launch = |at: Timestamp, progress: &mut ScheduleProgress, start: &mut Vec<Timestamp>| {
        start.push(at);
        progress.last_fire_at = Some(at);
        progress.last_task = Some(fire_task_id(&record.name, at));
    };
    // A waiting fire starts once the task it waited for has finished.
    if let Some(buffered) = progress.buffered_fire_at
        && !running
    {
        progress.buffered_fire_at = None;
        launch(buffered, &mut progress, &mut start);
        running = true;
    }

    let late_edge = now.sub(config.late_max);
    let mut missed = 0;
    let mut due = Vec::new();
    let on_time_from = match record.spec.catch_up {
        CatchUp::All => progress.fired_through,
        CatchUp::None | CatchUp::Latest if late_edge > progress.fired_through => {
            let missed_fires = cron.fires_between(progress.fired_through, late_edge, max);
            let latest = if missed_fires.len() < max { missed_fires.last().copied() } else { cron.previous_at_or_before(late_edge) };
            missed = missed_fires.len() as u32;
            if record.spec.catch_up == CatchUp::Latest
                && let Some(latest) = latest
            {
                due.push(latest);
                missed -= u32::from(missed_fires.last() == Some(&latest));
            }
            late_edge
        }
        CatchUp::None | CatchUp::Latest => progress.fired_through,
    };
    let on_time = cron.fires_between(on_time_from, now, max.saturating_sub(due.len()));
    let full = due.len() + on_time.len() >= max;
    due.extend(on_time);
    progress.fired_through = match due.last() {
        // The round's bound cut the due fires short: the rest come next.
        Some(last) if full => *last,
        _ => now,
    };

    for at in due {
        match (running, record.spec.overlap) {
            (true, Overlap::Skip) => skipped.push(at),
            (true, Overlap::BufferOne) if progress.buffered_fire_at.is_none() => progress.buffered_fire_at = Some(at),
            (true, Overlap::BufferOne) => skipped.push(at),
            (_, Overlap::Allow) | (false, _) => {
                launch(at, &mut progress, &mut start);
                running = true;
            }
        }
    }
    if let Some(last) = skipped.last() {
        progress.skipped += skipped.len() as u64;
        progress.last_skipped_at = Some(*last);
    }
    Plan { start, skipped, missed, progress }
}

/// What a round did with every schedule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Round {
    /// Tasks started (created, or found already created by another leader).
    pub started: u32,
    /// Fires the overlap policy skipped.
    pub skipped: u32,
    /// Missed fires the catch-up policy skipped.
    pub missed: u32,
    /// The earliest next fire time of any running schedule, if any: the
    /// Supervisor wakes then.
    pub next_fire: Option<Timestamp>,
}

/// The leader's round over the schedules.
#[derive(Clone)]
pub struct Firing {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    client: Client,
    config: Config,
}

impl Firing {
    /// A round runner over `client`'s store.
    pub fn new(client: Client, config: Config) -> Result<Self> {
        config.validate()?;
        Ok(Firing { store: client.store.clone(), clock: client.clock.clone(), client, config })
    }

    /// Fires what is due in every running schedule. A schedule that cannot
    /// fire (its workflow is not registered, a store error) is logged and
    /// tried again next round; one whose advance loses the race was fired
    /// by another leader.
    pub async fn run_once(&self) -> Result<Round> {
        let mut round = Round::default();
        for record in self.store.schedules().await? {
            if record.paused {
                continue;
            }
            let cron = match record.spec.parse_cron() {
                Ok(cron) => cron,
                Err(err) => {
                    tracing::warn!("schedule {}: {err}", record.name);
                    continue;
                }
            };
            let next = match self.fire(&record, &cron, &mut round).await {
                Ok(next) => next,
                Err(Error::Store(err)) if err.is_lost_race() => {
                    tracing::debug!("schedule {} was advanced or changed meanwhile: {err}", record.name);
                    cron.next_after(record.progress.fired_through)
                }
                Err(err) => {
                    tracing::warn!("schedule {}: firing failed, tried again next round: {err}", record.name);
                    cron.next_after(record.progress.fired_through)
                }
            };
            round.next_fire = match (round.next_fire, next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok(round)
    }

    /// Fires `record`'s due fires; returns its next fire time.
    async fn fire(&self, record: &ScheduleRecord, cron: &Cron, round: &mut Round) -> Result<Option<Timestamp>> {
        let now = self.clock.now();
        let next = cron.next_after(record.progress.fired_through);
        if record.progress.buffered_fire_at.is_none() && next.is_none_or(|at| at > now) {
            return Ok(next);
        }
        let previous_running = match (&record.progress.last_task, record.spec.overlap) {
            (None, _) | (_, Overlap::Allow) => false,
            (Some(id), _) => self.running(id).await?,
        };
        let plan = plan(record, cron, now, previous_running, &self.config);
        if plan.is_idle(&record.progress) {
            return Ok(next);
        }
        for at in &plan.start {
            let fired = Fired { schedule: record.name.clone(), fire_at: *at, manual: false };
            let submission = Submission::new(record.spec.workflow.clone(), record.spec.input.clone())
                .with_id(fire_task_id(&record.name, *at))
                .fired_by(fired);
            let submitted = self.client.submit(submission).await?;
            if !submitted.created {
                tracing::debug!("schedule {}: the fire at {} had already started {}", record.name, rfc3339_seconds(*at), submitted.id);
            }
        }
        self.store.advance_schedule(&record.name, record.version, &plan.progress).await?;
        count(&plan, round);
        if plan.missed > 0 {
            tracing::info!(
                "schedule {}: {} missed fire(s) skipped by catch-up {} (at most {} counted per round)",
                record.name,
                plan.missed,
                record.spec.catch_up,
                self.config.fires_per_round
            );
        }
        Ok(cron.next_after(plan.progress.fired_through))
    }

    /// Whether the task `id` exists and has not finished.
    async fn running(&self, id: &TaskId) -> Result<bool> {
        Ok(self.store.task(id).await?.is_some_and(|record| !record.task.state.is_terminal()))
    }
}

fn count(plan: &Plan, round: &mut Round) {
    round.started += plan.start.len() as u32;
    round.skipped += plan.skipped.len() as u32;
    round.missed += plan.missed;
    for (outcome, n) in [("started", plan.start.len() as u64), ("skipped", plan.skipped.len() as u64), ("missed", u64::from(plan.missed))] {
        if n > 0 {
            metrics::counter!(telemetry::SCHEDULE_FIRES, "outcome" => outcome).increment(n);
        }
    }
}

/// A schedule as operators see it: the record, and its next fire time.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleDetail {
    /// The stored schedule.
    pub record: ScheduleRecord,
    /// The next fire time the leader will handle (the first after
    /// `fired_through`: in the past when a fire is due and not yet handled),
    /// `None` when paused or when the expression never matches again.
    pub next_fire: Option<Timestamp>,
}

impl ScheduleDetail {
    fn of(record: ScheduleRecord) -> Self {
        let next_fire =
            if record.paused { None } else { record.spec.parse_cron().ok().and_then(|c| c.next_after(record.progress.fired_through)) };
        ScheduleDetail { record, next_fire }
    }
}

/// The operator's requests on schedules, every rule written once for the
/// API and the CLI (see [`crate::ops`] for how errors read).
impl Client {
    /// Creates a schedule (idempotent for the same definition); whether
    /// this request created it.
    pub async fn create_schedule(&self, new: &NewSchedule) -> ops::Result<(ScheduleDetail, bool)> {
        new.spec.parse_cron().map_err(|err| ops::Error::InvalidSchedule { field: err.field(), why: err.to_string() })?;
        self.check_input(&new.spec.input).map_err(|why| ops::Error::InvalidSchedule { field: "input", why })?;
        self.workflows.get(&new.spec.workflow, None).await.map_err(ops::Error::from_submit)?;
        // Only to tell the two answers apart: the store's create decides.
        let existed = self.store.schedule(&new.name).await?.is_some();
        match self.store.create_schedule(new).await {
            Ok(record) => Ok((ScheduleDetail::of(record), !existed)),
            Err(rota_store::Error::Conflict(_)) => Err(ops::Error::ScheduleExists(new.name.clone())),
            Err(err) => Err(err.into()),
        }
    }

    /// Every schedule, by name, with its next fire time.
    pub async fn schedules(&self) -> ops::Result<Vec<ScheduleDetail>> {
        Ok(self.store.schedules().await?.into_iter().map(ScheduleDetail::of).collect())
    }

    /// One schedule.
    pub async fn schedule(&self, name: &ScheduleName) -> ops::Result<ScheduleDetail> {
        let record = self.store.schedule(name).await?.ok_or_else(|| ops::Error::ScheduleNotFound(name.clone()))?;
        Ok(ScheduleDetail::of(record))
    }

    /// Pauses a schedule: it does not fire until resumed.
    pub async fn pause_schedule(&self, name: &ScheduleName, operator: Operator<'_>) -> ops::Result<ScheduleDetail> {
        operator.check()?;
        let paused = self.store.pause_schedule(name).await.map(ScheduleDetail::of).map_err(|err| not_found(name, err))?;
        self.record_action(AuditAction::SchedulePause, operator, name.as_str(), json!({})).await?;
        Ok(paused)
    }

    /// Resumes a schedule: it fires from now on.
    pub async fn resume_schedule(&self, name: &ScheduleName, operator: Operator<'_>) -> ops::Result<ScheduleDetail> {
        operator.check()?;
        let resumed = self.store.resume_schedule(name).await.map(ScheduleDetail::of).map_err(|err| not_found(name, err))?;
        self.record_action(AuditAction::ScheduleResume, operator, name.as_str(), json!({})).await?;
        Ok(resumed)
    }

    /// Deletes a schedule; the tasks it started are kept.
    pub async fn delete_schedule(&self, name: &ScheduleName, operator: Operator<'_>) -> ops::Result<()> {
        operator.check()?;
        self.store.delete_schedule(name).await.map_err(|err| not_found(name, err))?;
        self.record_action(AuditAction::ScheduleDelete, operator, name.as_str(), json!({})).await
    }

    /// Fires a schedule now, paused or not, whatever its overlap policy:
    /// its workflow with its input, as the task `NAME@manual@<now>`. The
    /// schedule's progress is not touched, so the cron fires go on as
    /// before.
    pub async fn trigger_schedule(&self, name: &ScheduleName, operator: Operator<'_>) -> ops::Result<Submitted> {
        operator.check()?;
        let detail = self.schedule(name).await?;
        let spec = &detail.record.spec;
        let now = self.clock.now();
        let fired = Fired { schedule: name.clone(), fire_at: now, manual: true };
        let submission = Submission::new(spec.workflow.clone(), spec.input.clone()).with_id(manual_task_id(name, now)).fired_by(fired);
        let submitted = self.submit(submission).await.map_err(ops::Error::from_submit)?;
        self.record_action(AuditAction::ScheduleTrigger, operator, name.as_str(), json!({ "task": submitted.id.as_str() })).await?;
        Ok(submitted)
    }
}

fn not_found(name: &ScheduleName, err: rota_store::Error) -> ops::Error {
    match err {
        rota_store::Error::NotFound(_) => ops::Error::ScheduleNotFound(name.clone()),
        other => other.into(),
    }
}
