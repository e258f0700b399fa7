//! Group commit of [`Tasks::commit`](rota_store::Tasks::commit): the
//! decisions that Schedulers and agents commit at the same moment go to
//! PostgreSQL as one statement.
//!
//! Every commit is one statement already (see `commit_sql`), but a busy
//! process sends hundreds a second, each tiny, and what a statement costs the
//! server is mostly fixed: setting up its executor for every data-modifying
//! CTE, its commit record, its wait for the WAL flush. So commits queue here,
//! and a batch starts whenever fewer than `commits_in_flight` are running:
//! it takes everything queued (up to `commit_batch_max`) and applies all of
//! it in one statement. Idle, a commit goes out alone at once; busy, the
//! batches grow with the load while their number stays bounded.
//!
//! A batch is all or nothing, like each commit in it. When one of its
//! fenced writes or completions misses (a lost race: rare, and the caller's
//! own business), the statement writes nothing and every commit of the batch
//! is run again in a statement of its own, so that each caller gets the
//! outcome it would have had alone, with the diagnosis that names what
//! conflicted. Two commits of one batch that write the same row miss the
//! same way (a statement updates a row once), and run again on their own
//! they race as any two concurrent commits do.
//! When the statement fails otherwise (connection lost, server down), every
//! caller gets that error: like any commit whose reply is lost, its outcome
//! is unknown, and running the parts again could apply them twice.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rota_model::{Clock, MessageId, QueueName};
use rota_store::{Changes, Error};
use sqlx::PgPool;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::commit_sql::{self, Committed, Part};
use crate::sql::Names;
use crate::{Fail, Result, TRANSACTION_TRIES_MAX};

/// Commit statements run (batches and commits alone).
pub(crate) const STATEMENTS_METRIC: &str = "rota_postgres_commit_statements_total";
/// Histogram: the commits that shared one statement.
pub(crate) const BATCH_METRIC: &str = "rota_postgres_commit_batch";
/// Batches refused as a whole and run again commit by commit.
pub(crate) const BATCHES_REFUSED_METRIC: &str = "rota_postgres_commit_batches_refused_total";

/// One caller's commit, waiting for its batch.
pub(crate) struct Pending {
    pub(crate) changes: Changes,
    /// The id of each message `changes` sends.
    pub(crate) send_ids: Vec<MessageId>,
    /// The id of every queue `changes` names.
    pub(crate) queue_ids: HashMap<QueueName, i64>,
    /// Where the outcome goes: the queues that got new messages, to announce.
    pub(crate) done: oneshot::Sender<Result<Vec<QueueName>, Error>>,
}

/// How many commits and commit statements a store has run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommitCounts {
    /// Commits asked for (`Tasks::commit` calls with something to write).
    pub commits: u64,
    /// Statements that ran them: one per batch, plus one per commit run
    /// again alone after its batch was refused.
    pub statements: u64,
}

#[derive(Default)]
pub(crate) struct CommitStats {
    commits: AtomicU64,
    statements: AtomicU64,
}

impl CommitStats {
    pub(crate) fn snapshot(&self) -> CommitCounts {
        CommitCounts { commits: self.commits.load(Ordering::Relaxed), statements: self.statements.load(Ordering::Relaxed) }
    }
}

/// What the batches need of the store.
#[derive(Clone)]
pub(crate) struct Committer {
    pub(crate) pool: PgPool,
    pub(crate) names: Arc<Names>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) stats: Arc<CommitStats>,
}

/// Takes queued commits in batches of up to `batch_max`, with at most
/// `in_flight` batches running, until the store is dropped.
pub(crate) async fn run(committer: Committer, batch_max: usize, in_flight: usize, mut queued: mpsc::UnboundedReceiver<Pending>) {
    let slots = Arc::new(Semaphore::new(in_flight));
    while let Some(first) = queued.recv().await {
        // Waiting for a slot is what lets a batch grow: whatever queues
        // meanwhile joins it.
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let mut batch = vec![first];
        while batch.len() < batch_max {
            match queued.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        tokio::spawn(committer.clone().commit_batch(batch, slot));
    }
}

impl Committer {
    async fn commit_batch(self, mut batch: Vec<Pending>, _slot: OwnedSemaphorePermit) {
        metrics::histogram!(BATCH_METRIC).record(batch.len() as f64);
        self.stats.commits.fetch_add(batch.len() as u64, Ordering::Relaxed);
        if batch.len() == 1 {
            let one = batch.pop().expect("one commit");
            let outcome = self.commit_alone(&one).await;
            let _ = one.done.send(outcome);
            return;
        }
        let mut queue_ids = HashMap::new();
        for pending in &batch {
            queue_ids.extend(pending.queue_ids.iter().map(|(queue, id)| (queue.clone(), *id)));
        }
        let parts: Vec<Part<'_>> = batch.iter().map(|p| (&p.changes, p.send_ids.as_slice())).collect();
        match self.statement(&parts, &queue_ids).await {
            Ok(Committed::Written(sent_to)) => {
                let mut sent_to = Some(sent_to);
                for pending in batch {
                    // One caller announces for the batch.
                    let _ = pending.done.send(Ok(sent_to.take().unwrap_or_default()));
                }
            }
            Ok(Committed::Refused) => {
                metrics::counter!(BATCHES_REFUSED_METRIC).increment(1);
                let alone: Vec<_> = batch.iter().map(|pending| self.commit_alone(pending)).collect();
                let outcomes = futures_util::future::join_all(alone).await;
                for (pending, outcome) in batch.into_iter().zip(outcomes) {
                    let _ = pending.done.send(outcome);
                }
            }
            Err(fail) => {
                let err = fail.into_store();
                for pending in batch {
                    let _ = pending.done.send(Err(duplicate(&err)));
                }
            }
        }
    }

    /// One caller's commit in a statement of its own, diagnosed if refused.
    async fn commit_alone(&self, pending: &Pending) -> Result<Vec<QueueName>, Error> {
        let parts = [(&pending.changes, pending.send_ids.as_slice())];
        match self.statement(&parts, &pending.queue_ids).await {
            Ok(Committed::Written(sent_to)) => Ok(sent_to),
            Ok(Committed::Refused) => {
                let diagnosis: Result<Fail> = async {
                    let mut conn = self.pool.acquire().await?;
                    Ok(commit_sql::diagnose(&mut conn, &self.names, &pending.changes, self.clock.now()).await)
                }
                .await;
                Err(diagnosis.unwrap_or_else(|fail| fail).into_store())
            }
            Err(fail) => Err(fail.into_store()),
        }
    }

    /// Runs one commit statement, again when PostgreSQL aborted it to break
    /// a deadlock.
    async fn statement(&self, parts: &[Part<'_>], queue_ids: &HashMap<QueueName, i64>) -> Result<Committed> {
        metrics::counter!(STATEMENTS_METRIC).increment(1);
        self.stats.statements.fetch_add(1, Ordering::Relaxed);
        let mut tries = 1_u32;
        loop {
            let attempt: Result<Committed> = async {
                let mut conn = self.pool.acquire().await?;
                commit_sql::commit(&mut conn, &self.names, parts, queue_ids, self.clock.now()).await
            }
            .await;
            match attempt {
                Err(fail) if fail.is_transient() && tries < TRANSACTION_TRIES_MAX => tries += 1,
                other => return other,
            }
        }
    }
}

/// The same error again, for each caller of a failed batch.
fn duplicate(err: &Error) -> Error {
    match err {
        Error::LeaseLost(why) => Error::LeaseLost(why.clone()),
        Error::Conflict(why) => Error::Conflict(why.clone()),
        Error::NotFound(what) => Error::NotFound(what.clone()),
        Error::Invalid(why) => Error::Invalid(why.clone()),
        Error::Paused(queue) => Error::Paused(queue.clone()),
        Error::Unavailable(why) => Error::Unavailable(why.clone()),
        Error::Backend(why) => Error::Backend(why.clone()),
        Error::Closed => Error::Closed,
    }
}
