//! Bulk actions: cancel or resubmit every task a filter selects, as a
//! durable batch (`rota_store::batch`) that survives the process running
//! it.
//!
//! [`create`] counts the selected tasks and stores the batch; its filter
//! is closed at the time of creation (tasks created later are not
//! selected). [`Batches::run`] then walks the tasks newest first, a page
//! at a time, applies the action to each, and records the page's progress
//! under the batch's lease; it stops when the walk ends (Done), when an
//! operator stops the batch, or when the lease was lost. The Supervisor
//! leader looks for batches nobody holds every [`Config::interval`]
//! ([`Batches::run_free`]), so a batch whose runner died goes on from its
//! cursor once the lease ran out.
//!
//! A task handled twice (its runner died after acting on it and before
//! recording the page) is refused by its own state the second time and
//! counted as skipped, except a task that a resubmit sent back to Error in
//! between, which is resubmitted again.
//!
//! Deliberately left out: other actions (pause, resume and redrive are one
//! call each; a batch of them would be the same walk).

use std::time::Duration;

use rota_model::{InstanceId, TaskId, Timestamp};
use rota_store::{AuditAction, BatchAction, BatchProgress, BatchRecord, BatchState, NewBatch, SharedStore, TaskFilter};

use serde_json::json;

use crate::client::Client;
use crate::ops;
use crate::pause::Operator;
use crate::{Result, Shutdown};

/// How batches run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// How many tasks one page handles (its progress is recorded after it).
    pub page: u32,
    /// How long a runner holds a batch without recording a page; a runner
    /// that dies leaves it to the next after this long.
    pub lease: Duration,
    /// How often the Supervisor leader looks for a batch nobody holds.
    pub interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config { page: 100, lease: Duration::from_secs(30), interval: Duration::from_secs(1) }
    }
}

impl Config {
    /// The largest page.
    pub const PAGE_MAX: u32 = 1_000;

    /// Refuses settings out of bounds.
    pub fn validate(&self) -> Result<()> {
        if self.page == 0 || self.page > Self::PAGE_MAX {
            return Err(crate::Error::Config(format!("batch page must be between 1 and {}, got {}", Self::PAGE_MAX, self.page)));
        }
        if self.lease < Duration::from_secs(1) {
            return Err(crate::Error::Config(format!("batch lease must be at least 1s, got {:?}", self.lease)));
        }
        Ok(())
    }
}

/// Stores a batch of `action` on the tasks `filter` selects now, counted.
pub async fn create(
    client: &Client,
    action: BatchAction,
    mut filter: TaskFilter,
    requested_by: &str,
    reason: Option<String>,
) -> ops::Result<BatchRecord> {
    let now = client.clock.now();
    // Closed at creation: a task created afterwards is not the batch's.
    let closed = Timestamp::from_millis(now.as_millis() + 1);
    filter.created.until = Some(filter.created.until.map_or(closed, |until| until.min(closed)));
    filter.before = None;
    let total = client.task_counts(&filter).await?.iter().map(|(_, n)| n).sum();
    let new =
        NewBatch { id: format!("batch-{}", uuid::Uuid::new_v4()), action, filter, total, requested_by: requested_by.to_owned(), reason };
    let batch = client.store.create_batch(&new).await?;
    let operator = Operator { by: requested_by, reason: batch.reason.as_deref() };
    let detail = json!({ "action": batch.action.as_str(), "total": batch.total, "filter": batch.filter });
    client.record_action(AuditAction::BatchCreate, operator, &batch.id, detail).await?;
    Ok(batch)
}

/// Stops batch `id` (its runner stops at its next page): `None` when it
/// does not exist. A batch already finished is returned as it is, and
/// only a stop that found it Running is recorded.
pub async fn stop(client: &Client, id: &str, operator: Operator<'_>) -> ops::Result<Option<BatchRecord>> {
    operator.check()?;
    let before = client.store.batch(id).await?;
    let Some(stopped) = client.store.stop_batch(id).await? else { return Ok(None) };
    if before.is_some_and(|b| b.state == BatchState::Running) && stopped.state == BatchState::Stopped {
        let detail = json!({ "done": stopped.done, "skipped": stopped.skipped, "failed": stopped.failed, "total": stopped.total });
        client.record_action(AuditAction::BatchStop, operator, id, detail).await?;
    }
    Ok(Some(stopped))
}

/// What happened to one task.
enum Outcome {
    Done,
    Skipped,
    Failed(String),
}

/// Runs batches.
#[derive(Clone)]
pub struct Batches {
    client: Client,
    store: SharedStore,
    instance: InstanceId,
    config: Config,
}

impl Batches {
    /// Runs batches as `instance`, through `client`.
    pub fn new(client: Client, instance: InstanceId, config: Config) -> Self {
        let store = client.store.clone();
        Batches { client, store, instance, config }
    }

    /// Takes the batch `id` (or, with `None`, the oldest nobody holds) and
    /// runs it, calling `on_page` with the batch after each page. `None`
    /// when there is no such batch to take (another runner holds it, or it
    /// is not Running).
    pub async fn run(&self, id: Option<&str>, shutdown: &Shutdown, mut on_page: impl FnMut(&BatchRecord)) -> Result<Option<BatchRecord>> {
        let Some(mut batch) = self.store.claim_batch(id, &self.instance, self.config.lease).await? else { return Ok(None) };
        tracing::info!(batch = %batch.id, action = %batch.action, by = %batch.requested_by, "running batch ({} task(s) selected)", batch.total);
        on_page(&batch);
        while batch.state == BatchState::Running && !shutdown.is_triggered() {
            let progress = self.page(&batch).await?;
            match self.store.advance_batch(&batch.id, &self.instance, &progress, self.config.lease).await? {
                Some(advanced) => batch = advanced,
                None => {
                    // Stopped by an operator, or taken over after a stall.
                    let now = self.store.batch(&batch.id).await?;
                    return Ok(now.or(Some(batch)));
                }
            }
            on_page(&batch);
        }
        if batch.state == BatchState::Done {
            tracing::info!(batch = %batch.id, "batch done: {} done, {} skipped, {} failed", batch.done, batch.skipped, batch.failed);
        }
        Ok(Some(batch))
    }

    /// One page: the next tasks after the cursor, each acted on.
    async fn page(&self, batch: &BatchRecord) -> Result<BatchProgress> {
        let filter = TaskFilter { before: batch.cursor.clone(), limit: self.config.page, ..batch.filter.clone() };
        let tasks = self.store.list_tasks(&filter).await?;
        let mut progress = BatchProgress {
            cursor: batch.cursor.clone(),
            done: batch.done,
            skipped: batch.skipped,
            failed: batch.failed,
            last_error: None,
            finished: tasks.is_empty(),
        };
        if let (true, Some(cursor)) = (tasks.is_empty(), &batch.cursor)
            && self.store.task(cursor).await?.is_none()
        {
            // Retention deleted the task the walk had reached: where it
            // stood is lost, so the batch ends and says so.
            progress.last_error = Some(format!("the walk's last task {cursor} was deleted meanwhile (retention); run the batch again"));
        }
        for task in &tasks {
            match self.act(batch, &task.id).await {
                Outcome::Done => progress.done += 1,
                Outcome::Skipped => progress.skipped += 1,
                Outcome::Failed(why) => {
                    progress.failed += 1;
                    progress.last_error = Some(format!("task {}: {why}", task.id));
                }
            }
            progress.cursor = Some(task.id.clone());
        }
        Ok(progress)
    }

    async fn act(&self, batch: &BatchRecord, id: &TaskId) -> Outcome {
        // Each task's history says who asked, through which batch, and why.
        let by = format!("{}, batch {}", batch.requested_by, batch.id);
        let operator = Operator { by: &by, reason: batch.reason.as_deref() };
        let result = match batch.action {
            BatchAction::Cancel => self.client.cancel(id, operator).await.map(drop),
            BatchAction::Resubmit => self.client.resubmit(id, None, operator).await.map(drop),
        };
        match result {
            Ok(()) => Outcome::Done,
            // Moved on since it was listed (finished, resubmitted, deleted).
            Err(ops::Error::Refused { .. } | ops::Error::TaskNotFound(_)) => Outcome::Skipped,
            Err(err) => Outcome::Failed(err.to_string()),
        }
    }

    /// While `instance` holds the Supervisor leader lease, takes the
    /// batches nobody holds, one at a time, every interval, until
    /// `shutdown`.
    pub async fn run_free(self, shutdown: Shutdown) {
        let mut ticks = tokio::time::interval(self.config.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = shutdown.triggered() => break,
            }
            match self.store.leader(crate::supervisor::LEADER_LEASE).await {
                Ok(Some(lease)) if lease.holder == self.instance => {}
                Ok(_) => continue,
                Err(err) => {
                    tracing::warn!("batches: cannot read the leader lease, tried again next interval: {err}");
                    continue;
                }
            }
            if let Err(err) = self.run(None, &shutdown, |_| {}).await {
                tracing::warn!("batch run failed, tried again next interval: {err}");
            }
        }
    }
}
