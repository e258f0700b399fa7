//! Retention: finished tasks are deleted with their steps and history once
//! they are older than their workflow's `retention:` (or the store's
//! default), and the leftovers of instances that are gone (heartbeats,
//! inbox queues, circuit breakers nobody reports) are swept.
//!
//! The Supervisor leader runs a [`Retention`] pass every
//! [`Config::interval`], in a spawned future of its own so that a long
//! backlog never delays a round of recoveries. A pass deletes in batches of
//! [`Config::batch`] tasks (each one short transaction: the SQLite writer
//! and PostgreSQL's row locks are held for one batch only) with
//! [`Config::pause`] between them, at most [`Config::batches_per_pass`]
//! batches; what is left waits for the next pass. `rota prune` runs the
//! same batches by hand ([`prune`]).
//!
//! Which tasks: see `rota_store::prune` (finished, by end time, never a
//! schedule's task that may belong to an unrecorded fire). Which instances:
//! see `Retention::sweep`.
//!
//! With an archive ([`crate::archive`]), each batch is first written to a
//! durable file of the archive directory, and only the tasks written are
//! then deleted.
//!
//! Deliberately left out: pruning the events of tasks that are still
//! running (a task's history goes with it).

use std::sync::Arc;
use std::time::Duration;

use std::path::PathBuf;

use rota_model::{Clock, InstanceId, Timestamp, WorkflowName};
use rota_store::{AuditAction, InstanceSweep, NewAudit, Prune, PruneWorkflows, Pruned, SharedStore};
use rota_workflow::Workflow;

use serde_json::json;

use crate::archive::Archive;
use crate::supervisor::human;
use crate::{Error, Result, Shutdown, export, protocol, status, telemetry};

/// Who the audit log says pruned, for the leader's retention passes.
pub const RETENTION_BY: &str = "retention (supervisor leader)";

/// How retention runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// How long finished tasks are kept, from when they finished, when
    /// their workflow sets no `retention:`. `None`: kept for good (only
    /// workflows with their own retention are pruned).
    pub default: Option<Duration>,
    /// How often the leader runs a pass.
    pub interval: Duration,
    /// The most tasks one batch deletes (one transaction).
    pub batch: u32,
    /// The wait between two batches, which lets other writers through.
    pub pause: Duration,
    /// The most batches of one pass; a bigger backlog is finished by the
    /// next passes.
    pub batches_per_pass: u32,
    /// How long an instance must have been silent (no heartbeat) before
    /// its leftovers are swept; also how long a circuit breaker nobody
    /// reports (or, shared, nobody changes) is kept. Far longer than a restart, so that an instance that
    /// comes back with the same id finds its inbox.
    pub instances_gone_after: Duration,
    /// The directory finished tasks are archived to before they are
    /// deleted (created if missing), if any.
    pub archive: Option<PathBuf>,
    /// How long the audit table's rows are kept (the operator actions
    /// without a task; a task's own go with it).
    pub audit: Duration,
}

impl Config {
    /// The shortest retention: a task is kept at least this long after it
    /// finished, so that its submitter can read its result.
    pub const RETENTION_MIN: Duration = Duration::from_secs(1);
    /// The shortest and longest interval between passes.
    pub const INTERVAL_MIN: Duration = Duration::from_secs(1);
    /// The longest interval between passes.
    pub const INTERVAL_MAX: Duration = Duration::from_secs(24 * 3600);
    /// The longest pause between batches.
    pub const PAUSE_MAX: Duration = Duration::from_secs(60);
    /// The most batches a pass may run.
    pub const BATCHES_PER_PASS_MAX: u32 = 100_000;
    /// The shortest silence after which an instance counts as gone: many
    /// heartbeat intervals, so that a slow process is never swept.
    pub const INSTANCES_GONE_AFTER_MIN: Duration = Duration::from_secs(60);
    /// The shortest audit retention: a day, so that the log of an incident
    /// outlives the incident.
    pub const AUDIT_MIN: Duration = Duration::from_secs(24 * 3600);
    /// The default audit retention: 400 days, a year and a margin.
    pub const AUDIT_DEFAULT: Duration = Duration::from_secs(400 * 24 * 3600);

    /// Checks every bound; the error names the field.
    pub fn validate(&self) -> Result<()> {
        let out = |field: &'static str, why: String| Err(Error::OutOfBounds { field, why });
        if let Some(default) = self.default
            && default < Self::RETENTION_MIN
        {
            return out("retention.default", format!("must be at least {}, got {}", human(Self::RETENTION_MIN), human(default)));
        }
        if !(Self::INTERVAL_MIN..=Self::INTERVAL_MAX).contains(&self.interval) {
            let why =
                format!("must be between {} and {}, got {}", human(Self::INTERVAL_MIN), human(Self::INTERVAL_MAX), human(self.interval));
            return out("retention.interval", why);
        }
        if !(1..=Prune::LIMIT_MAX).contains(&self.batch) {
            return out("retention.batch", format!("must be between 1 and {}, got {}", Prune::LIMIT_MAX, self.batch));
        }
        if self.pause > Self::PAUSE_MAX {
            return out("retention.pause", format!("must be at most {}, got {}", human(Self::PAUSE_MAX), human(self.pause)));
        }
        if !(1..=Self::BATCHES_PER_PASS_MAX).contains(&self.batches_per_pass) {
            let why = format!("must be between 1 and {}, got {}", Self::BATCHES_PER_PASS_MAX, self.batches_per_pass);
            return out("retention.batches_per_pass", why);
        }
        if self.instances_gone_after < Self::INSTANCES_GONE_AFTER_MIN {
            let why = format!("must be at least {}, got {}", human(Self::INSTANCES_GONE_AFTER_MIN), human(self.instances_gone_after));
            return out("retention.instances_gone_after", why);
        }
        if self.audit < Self::AUDIT_MIN {
            return out("retention.audit", format!("must be at least {}, got {}", human(Self::AUDIT_MIN), human(self.audit)));
        }
        Ok(())
    }
}

impl Default for Config {
    /// No default retention; a pass every minute, batches of 500 tasks
    /// 50 ms apart, at most 1000 per pass; instances gone for a day; audit
    /// rows kept 400 days.
    fn default() -> Self {
        Config {
            default: None,
            interval: Duration::from_secs(60),
            batch: 500,
            pause: Duration::from_millis(50),
            batches_per_pass: 1000,
            instances_gone_after: status::INSTANCES_LISTED_FOR,
            archive: None,
            audit: Self::AUDIT_DEFAULT,
        }
    }
}

/// What to prune: the tasks of `workflows` finished more than `keep` ago.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Whose tasks.
    pub workflows: PruneWorkflows,
    /// How long they are kept.
    pub keep: Duration,
}

/// The rules of a pass: one per workflow that sets its own retention, and
/// the default for every other workflow (none without a default). Pure.
pub fn rules(default: Option<Duration>, own: &[(WorkflowName, Duration)]) -> Vec<Rule> {
    let mut rules: Vec<Rule> = own.iter().map(|(name, keep)| Rule { workflows: PruneWorkflows::Only(name.clone()), keep: *keep }).collect();
    if let Some(keep) = default {
        rules.push(Rule { workflows: PruneWorkflows::Except(own.iter().map(|(name, _)| name.clone()).collect()), keep });
    }
    rules
}

/// What a pass (or a prune by hand) deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// Tasks deleted.
    pub tasks: u64,
    /// Their steps.
    pub steps: u64,
    /// Their history events.
    pub events: u64,
    /// Batches run.
    pub batches: u32,
    /// Instances whose heartbeat was swept.
    pub instances: u32,
    /// Inbox queues swept with them.
    pub inboxes: u32,
    /// Circuit breakers nobody reported any more, and shared breakers
    /// nobody changed.
    pub breakers: u64,
    /// Audit table rows past the audit retention.
    pub audit_rows: u64,
    /// Rate limits nobody took a slot of for as long as an instance is
    /// taken to be gone.
    pub rate_limits: u64,
}

impl Pass {
    fn add(&mut self, pruned: &Pruned) {
        self.tasks += pruned.tasks.len() as u64;
        self.steps += pruned.steps;
        self.events += pruned.events;
        self.batches += 1;
    }
}

/// How a prune runs its batches.
#[derive(Debug, Clone)]
pub struct Batches<'a> {
    /// The wait between two batches.
    pub pause: Duration,
    /// The most batches.
    pub max: u32,
    /// Where each batch is archived before it is deleted, if anywhere.
    pub archive: Option<&'a Archive>,
    /// The clock that names the archive's files.
    pub clock: &'a dyn Clock,
}

/// Deletes what `prune` selects in batches of `prune.limit`, `batches.pause`
/// apart, at most `batches.max` batches, stopping early at `shutdown`;
/// `each` sees every batch. With an archive, a batch is first written to it
/// (durably) and then exactly its tasks are deleted. What the Supervisor
/// leader's passes and `rota prune` run.
pub async fn prune(
    store: &SharedStore,
    prune: &Prune,
    batches: &Batches<'_>,
    shutdown: &Shutdown,
    mut each: impl FnMut(&Pruned),
) -> Result<Pass> {
    let (pause, batches_max) = (batches.pause, batches.max);
    let mut pass = Pass::default();
    while pass.batches < batches_max && !shutdown.is_triggered() {
        if pass.batches > 0 && !pause.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = shutdown.triggered() => break,
            }
        }
        let pruned = match batches.archive {
            None => store.prune_tasks(prune).await?,
            Some(archive) => archive_then_prune(store, prune, archive, batches.clock).await?,
        };
        pass.add(&pruned);
        each(&pruned);
        if pruned.tasks.is_empty() {
            break;
        }
        metrics::counter!(telemetry::TASKS_PRUNED).increment(pruned.tasks.len() as u64);
        if pruned.tasks.len() < prune.limit as usize {
            break;
        }
    }
    Ok(pass)
}

/// One archived batch: the tasks the prune would delete next are written
/// to the archive, then those (and only those still selected) deleted.
async fn archive_then_prune(store: &SharedStore, prune: &Prune, archive: &Archive, clock: &dyn Clock) -> Result<Pruned> {
    let ids = store.prunable_tasks(prune).await?;
    if ids.is_empty() {
        return Ok(Pruned::default());
    }
    let lines = export::lines(store, &ids).await?;
    let written: Vec<_> = lines.iter().map(|line| line.task.id.clone()).collect();
    archive.write(lines, clock.now()).await?;
    Ok(store.prune_tasks(&Prune { only: Some(written), ..prune.clone() }).await?)
}

/// The Supervisor leader's retention passes.
#[derive(Clone)]
pub struct Retention {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    config: Config,
    archive: Option<Archive>,
}

impl Retention {
    /// Passes over `store` with `config`.
    pub fn new(store: SharedStore, clock: Arc<dyn Clock>, config: Config) -> Result<Self> {
        config.validate()?;
        let archive = config.archive.as_deref().map(Archive::open).transpose()?;
        Ok(Retention { store, clock, config, archive })
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Runs a pass every interval while `instance` holds the Supervisor
    /// leader lease, until `shutdown`.
    pub async fn run(self, instance: InstanceId, shutdown: Shutdown) {
        let mut ticks = tokio::time::interval(self.config.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = shutdown.triggered() => break,
            }
            match self.run_if_leader(&instance, &shutdown).await {
                Ok(Some(pass))
                    if pass.tasks > 0 || pass.instances > 0 || pass.breakers > 0 || pass.audit_rows > 0 || pass.rate_limits > 0 =>
                {
                    tracing::info!(
                        "retention: deleted {} finished task(s) ({} steps, {} events) in {} batch(es); swept {} gone instance(s), {} inbox(es), {} breaker(s), {} audit row(s), {} rate limit(s)",
                        pass.tasks,
                        pass.steps,
                        pass.events,
                        pass.batches,
                        pass.instances,
                        pass.inboxes,
                        pass.breakers,
                        pass.audit_rows,
                        pass.rate_limits
                    )
                }
                Ok(_) => {}
                Err(err) => tracing::warn!("retention pass failed, tried again next interval: {err}"),
            }
        }
    }

    /// A pass if `instance` holds the Supervisor leader lease now, `None`
    /// otherwise. Losing the lease during the pass is harmless: every batch
    /// is a transaction of its own, and two pruners delete each task once.
    pub async fn run_if_leader(&self, instance: &InstanceId, shutdown: &Shutdown) -> Result<Option<Pass>> {
        match self.store.leader(crate::supervisor::LEADER_LEASE).await? {
            Some(lease) if lease.holder == *instance => Ok(Some(self.run_once(shutdown).await?)),
            _ => Ok(None),
        }
    }

    /// One pass: the tasks of every rule, then the gone instances.
    pub async fn run_once(&self, shutdown: &Shutdown) -> Result<Pass> {
        let mut pass = Pass::default();
        let now = self.clock.now();
        for rule in rules(self.config.default, &self.own_retentions().await?) {
            let selection = Prune {
                workflows: rule.workflows,
                limit: self.config.batch,
                ..Prune::finished_before(now.sub(rule.keep), self.config.batch)
            };
            let batches = Batches {
                pause: self.config.pause,
                max: self.config.batches_per_pass.saturating_sub(pass.batches),
                archive: self.archive.as_ref(),
                clock: &*self.clock,
            };
            let done = prune(&self.store, &selection, &batches, shutdown, |_| {}).await?;
            pass.tasks += done.tasks;
            pass.steps += done.steps;
            pass.events += done.events;
            pass.batches += done.batches;
        }
        if pass.tasks > 0 {
            // Deleting tasks deletes their operator history: the pass
            // itself stays listed, with what it deleted.
            let detail = json!({ "tasks": pass.tasks, "steps": pass.steps, "events": pass.events, "batches": pass.batches });
            let entry =
                NewAudit { action: AuditAction::Prune, by: RETENTION_BY.to_owned(), reason: None, target: "retention".to_owned(), detail };
            self.store.record_audit(&entry).await?;
        }
        self.sweep(now, &mut pass).await?;
        self.sweep_audit(now, &mut pass, shutdown).await?;
        Ok(pass)
    }

    /// Deletes the audit table's rows older than [`Config::audit`], a
    /// batch at a time, at most [`Config::batches_per_pass`] batches.
    async fn sweep_audit(&self, now: Timestamp, pass: &mut Pass, shutdown: &Shutdown) -> Result<()> {
        let before = now.sub(self.config.audit);
        for _ in 0..self.config.batches_per_pass {
            let deleted = self.store.prune_audit(before, self.config.batch).await?;
            pass.audit_rows += deleted;
            if deleted < u64::from(self.config.batch) || shutdown.is_triggered() {
                break;
            }
        }
        Ok(())
    }

    /// The workflows whose latest version sets its own retention. A
    /// definition that does not read back is logged and follows the default.
    async fn own_retentions(&self) -> Result<Vec<(WorkflowName, Duration)>> {
        let mut own = Vec::new();
        for entry in self.store.workflows().await? {
            match serde_json::from_value::<Workflow>(entry.definition) {
                Ok(workflow) => own.extend(workflow.retention().map(|keep| (entry.name, keep.max(Config::RETENTION_MIN)))),
                Err(err) => tracing::warn!("retention: workflow {} version {} does not read back: {err}", entry.name, entry.version),
            }
        }
        if own.len() > Prune::EXCEPT_MAX {
            return Err(Error::Config(format!("retention: more than {} workflows set their own retention", Prune::EXCEPT_MAX)));
        }
        Ok(own)
    }

    /// Sweeps the instances silent for longer than
    /// [`Config::instances_gone_after`]: their heartbeat and their inbox,
    /// in one transaction, and only when nothing of them can still be
    /// needed. An instance that still holds a task's lease keeps both (the
    /// Supervisor recovers the task first; until then, replies in its inbox
    /// are what it would act on if it came back); an inbox that holds a
    /// message or a dead letter is kept with its heartbeat (the message may
    /// be for an instance that comes back with the same id; a dead letter
    /// is an operator's to redrive or purge). An inbox with no heartbeat at
    /// all is never swept: nothing says its instance is gone (an embedded
    /// engine may run without a heartbeat). Breakers not reported for as
    /// long are deleted too (live processes report theirs every 30 s), and
    /// the rate limits whose time passed that long ago.
    async fn sweep(&self, now: Timestamp, pass: &mut Pass) -> Result<()> {
        let gone_before = now.sub(self.config.instances_gone_after);
        for heartbeat in self.store.statuses(status::INSTANCE_PREFIX).await? {
            if heartbeat.reported_at >= gone_before {
                continue;
            }
            let Ok(instance) = InstanceId::new(heartbeat.key.trim_start_matches(status::INSTANCE_PREFIX)) else { continue };
            let sweep =
                InstanceSweep { inbox: Some(protocol::inbox(&instance)), instance, heartbeat_key: heartbeat.key.clone(), gone_before };
            match self.store.sweep_instance(&sweep).await {
                Ok(swept) => {
                    pass.instances += u32::from(swept.heartbeat);
                    pass.inboxes += u32::from(swept.inbox);
                }
                Err(err) if err.is_lost_race() => tracing::debug!("instance {} came back during its sweep", sweep.instance),
                Err(err) => return Err(err.into()),
            }
        }
        pass.breakers += self.store.delete_statuses(status::BREAKER_PREFIX, gone_before).await?;
        // Shared breakers unchanged for as long (and not open nor probing
        // past it) say nothing a fresh closed breaker would not.
        pass.breakers += self.store.delete_shared_breakers(gone_before).await?;
        // A rate limit whose time is that far past counts as never taken:
        // the keys of targets no longer called are forgotten.
        pass.rate_limits += self.store.delete_rate_limits(gone_before).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> WorkflowName {
        WorkflowName::new(text).unwrap()
    }

    #[test]
    fn a_workflows_own_retention_overrides_the_default_both_ways() {
        let day = Duration::from_secs(24 * 3600);
        let own = [(name("audit"), 90 * day), (name("ping"), Duration::from_secs(60))];
        assert_eq!(
            rules(Some(30 * day), &own),
            [
                Rule { workflows: PruneWorkflows::Only(name("audit")), keep: 90 * day },
                Rule { workflows: PruneWorkflows::Only(name("ping")), keep: Duration::from_secs(60) },
                Rule { workflows: PruneWorkflows::Except(vec![name("audit"), name("ping")]), keep: 30 * day },
            ],
            "longer and shorter than the default; the default leaves both out"
        );
        assert_eq!(rules(None, &own).len(), 2, "without a default only the workflows that ask are pruned");
        assert_eq!(rules(None, &[]), [], "nothing at all by default");
        assert_eq!(rules(Some(day), &[]), [Rule { workflows: PruneWorkflows::Except(Vec::new()), keep: day }]);
    }

    #[test]
    fn config_bounds_name_the_field() {
        let refused = |change: fn(&mut Config)| {
            let mut config = Config::default();
            change(&mut config);
            config.validate().expect_err("out of bounds").to_string()
        };
        assert!(Config::default().validate().is_ok());
        assert_eq!(
            refused(|c| c.default = Some(Duration::from_millis(10))),
            "invalid configuration: retention.default must be at least 1s, got 10ms"
        );
        assert_eq!(
            refused(|c| c.interval = Duration::ZERO),
            "invalid configuration: retention.interval must be between 1s and 1day, got 0s"
        );
        assert_eq!(refused(|c| c.batch = 0), "invalid configuration: retention.batch must be between 1 and 10000, got 0");
        assert_eq!(refused(|c| c.pause = Duration::from_secs(61)), "invalid configuration: retention.pause must be at most 1m, got 1m 1s");
        assert_eq!(
            refused(|c| c.batches_per_pass = 0),
            "invalid configuration: retention.batches_per_pass must be between 1 and 100000, got 0"
        );
        assert_eq!(
            refused(|c| c.audit = Duration::from_secs(3600)),
            "invalid configuration: retention.audit must be at least 1day, got 1h"
        );
        assert_eq!(
            refused(|c| c.instances_gone_after = Duration::from_secs(6)),
            "invalid configuration: retention.instances_gone_after must be at least 1m, got 6s"
        );
    }
}
