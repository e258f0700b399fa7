//! Bulk actions: cancel or resubmit every task a filter selects, or
//! redrive every dead letter of a queue a filter selects, as a durable
//! batch (`rota_store::batch`) that survives the process running it.
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
//! A task its runner acted on before dying, and before recording the
//! page, is not acted on again: it no longer matches the filter (a
//! resubmitted task is no longer in Error) or, listed again, is refused by
//! its own state; either way it is counted as skipped, at the latest when
//! the walk ends, so that done, skipped and failed add up to the tasks
//! selected. The exception is a task that a resubmit sent back to Error in
//! between, which is resubmitted again.
//!
//! A redrive walks the queue's dead letters oldest first instead, a page
//! being the next [`Config::page`] of them (selected or not, so a page
//! stays cheap however sparse the filter), and moves the selected ones of
//! the page back to the queue in one transaction. A dead letter redriven
//! before a crash is no longer there the second time: it is never sent
//! twice, and counted as skipped (when the walk ends, what it selected at
//! creation and found gone is). Dead letters that come after the batch
//! was made (a redriven message failing again) are not selected.
//!
//! Deliberately left out: pause and resume batches (one call each; a batch
//! of them would be the same walk), and filtering dead letters by their
//! task's workflow or tags (a dead letter keeps only its message body, so
//! that would be a JSON parse per row, with no index to drive it).

use std::time::Duration;

use rota_model::{InstanceId, TaskId, Timestamp};
use rota_store::{
    AuditAction, BatchAction, BatchCursor, BatchFilter, BatchProgress, BatchRecord, BatchState, DeadLetterFilter, NewBatch, SharedStore,
    TaskFilter,
};

use serde_json::json;

use crate::client::Client;
use crate::ops;
use crate::pause::Operator;
use crate::{Result, Shutdown};

/// How batches run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// How many tasks one page handles, or how many dead letters a redrive
    /// page looks at (its progress is recorded after it).
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

/// Stores a batch of `action` on what `filter` selects now, counted. A
/// redrive takes a dead-letter filter, the other actions a task filter.
pub async fn create(
    client: &Client,
    action: BatchAction,
    filter: BatchFilter,
    requested_by: &str,
    reason: Option<String>,
) -> ops::Result<BatchRecord> {
    if action.on_dead_letters() != filter.is_dead_letters() {
        let wanted = if action.on_dead_letters() { "a dead-letter filter" } else { "a task filter" };
        return Err(ops::Error::InvalidRequest { field: "filter", why: format!("a {action} batch takes {wanted}") });
    }
    let now = client.clock.now();
    // Closed at creation: a task created (a message dead-lettered)
    // afterwards is not the batch's.
    let closed = Timestamp::from_millis(now.as_millis() + 1);
    let close = |until: Option<Timestamp>| Some(until.map_or(closed, |until| until.min(closed)));
    let (filter, total) = match filter {
        BatchFilter::Tasks(mut filter) => {
            filter.created.until = close(filter.created.until);
            filter.before = None;
            let total = client.task_counts(&filter).await?.iter().map(|(_, n)| n).sum();
            (BatchFilter::Tasks(filter), total)
        }
        BatchFilter::DeadLetters(mut filter) => {
            filter.dead_lettered.until = close(filter.dead_lettered.until);
            let total = client.store.count_dead_letters(&filter).await?;
            (BatchFilter::DeadLetters(filter), total)
        }
    };
    let new =
        NewBatch { id: format!("batch-{}", uuid::Uuid::new_v4()), action, filter, total, requested_by: requested_by.to_owned(), reason };
    let batch = client.store.create_batch(&new).await?;
    let operator = Operator { by: requested_by, reason: batch.reason.as_deref() };
    let detail = json!({ "action": batch.action.as_str(), "total": batch.total, "filter": filter_detail(&batch.filter) });
    client.record_action(AuditAction::BatchCreate, operator, &batch.id, detail).await?;
    Ok(batch)
}

/// A filter as the audit log's detail shows it.
fn filter_detail(filter: &BatchFilter) -> serde_json::Value {
    match filter {
        BatchFilter::Tasks(filter) => json!(filter),
        BatchFilter::DeadLetters(filter) => json!({ "dead_letters": filter }),
    }
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

    /// One page: the next tasks (dead letters) after the cursor, each
    /// acted on.
    async fn page(&self, batch: &BatchRecord) -> Result<BatchProgress> {
        match &batch.filter {
            BatchFilter::Tasks(filter) => self.task_page(batch, filter).await,
            BatchFilter::DeadLetters(filter) => self.dead_letter_page(batch, filter).await,
        }
    }

    async fn task_page(&self, batch: &BatchRecord, filter: &TaskFilter) -> Result<BatchProgress> {
        let cursor = match &batch.cursor {
            Some(BatchCursor::Task(id)) => Some(id.clone()),
            None => None,
            Some(other) => return Err(crate::Error::Store(mismatched_cursor(batch, other))),
        };
        let filter = TaskFilter { before: cursor.clone(), limit: self.config.page, ..filter.clone() };
        let tasks = self.store.list_tasks(&filter).await?;
        let mut progress = BatchProgress {
            cursor: batch.cursor.clone(),
            done: batch.done,
            skipped: batch.skipped,
            failed: batch.failed,
            last_error: None,
            finished: tasks.is_empty(),
        };
        if let (true, Some(cursor)) = (tasks.is_empty(), &cursor)
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
            progress.cursor = Some(BatchCursor::Task(task.id.clone()));
        }
        if progress.finished {
            // Selected when the batch was made but no longer matching when
            // the walk got there (resubmitted by a runner that died before
            // recording its page, acted on by hand): skipped too.
            let handled = progress.done + progress.skipped + progress.failed;
            progress.skipped += batch.total.saturating_sub(handled);
        }
        Ok(progress)
    }

    /// The next page of the queue's dead letters, the selected ones moved
    /// back in one transaction; those gone already (redriven before a
    /// crash, purged) are skipped.
    async fn dead_letter_page(&self, batch: &BatchRecord, filter: &DeadLetterFilter) -> Result<BatchProgress> {
        let after = match &batch.cursor {
            Some(BatchCursor::DeadLetter(seq)) => Some(*seq),
            None => None,
            Some(other) => return Err(crate::Error::Store(mismatched_cursor(batch, other))),
        };
        let page = match self.store.dead_letter_page(filter, after, self.config.page).await {
            Ok(page) => page,
            Err(rota_store::Error::NotFound(what)) => {
                // The queue is gone (an instance's inbox, swept): so are its dead letters.
                let last_error = Some(format!("{what} no longer exists"));
                return Ok(BatchProgress { cursor: batch.cursor.clone(), last_error, finished: true, ..progress_of(batch) });
            }
            Err(err) => return Err(err.into()),
        };
        let seqs: Vec<u64> = page.letters.iter().map(|(seq, _)| *seq).collect();
        let moved = if seqs.is_empty() { 0 } else { self.store.redrive_listed(&filter.queue, &seqs).await? };
        let listed = seqs.len() as u64;
        assert!(moved <= listed, "redrove {moved} of {listed} listed dead letters");
        let mut progress = BatchProgress {
            cursor: page.scanned_through.map(BatchCursor::DeadLetter).or_else(|| batch.cursor.clone()),
            done: batch.done + moved,
            skipped: batch.skipped + (listed - moved),
            failed: batch.failed,
            last_error: None,
            finished: page.end,
        };
        if page.end {
            // Selected when the batch was made but gone when the walk got
            // there (redriven by a runner that died before recording its
            // page, redriven by hand, purged): skipped too.
            let handled = progress.done + progress.skipped + progress.failed;
            progress.skipped += batch.total.saturating_sub(handled);
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
            // Refused at its creation: a redrive batch walks dead letters.
            BatchAction::Redrive => return Outcome::Failed("a redrive batch with a task filter".into()),
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

/// A stored cursor of the other kind than the batch's filter: a corrupt row.
fn mismatched_cursor(batch: &BatchRecord, cursor: &BatchCursor) -> rota_store::Error {
    rota_store::Error::Backend(format!("batch {}: its cursor {cursor:?} does not fit its filter", batch.id))
}

/// A batch's progress so far, for a page to add to.
fn progress_of(batch: &BatchRecord) -> BatchProgress {
    BatchProgress {
        cursor: batch.cursor.clone(),
        done: batch.done,
        skipped: batch.skipped,
        failed: batch.failed,
        last_error: None,
        finished: false,
    }
}
