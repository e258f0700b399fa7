//! The writer thread: the one connection that writes, and group commit.
//!
//! Callers hand the writer a job (a closure over the connection) through a
//! bounded channel and await its reply. The writer takes every job waiting
//! (up to `batch_ops_max`), runs each inside its own SAVEPOINT within ONE
//! transaction, commits once, and replies only once that commit is on
//! disk (with the default durability the [`crate::flusher`] flushes it,
//! while this thread runs the next batch). So a caller's success always
//! means "durable", and many callers share each flush: throughput comes
//! from batching, not from weakening durability.
//!
//! A caller that acts only by writing to this store (a Scheduler's claim,
//! its inbox) hears back as soon as the batch commits ([`ReplyAt::Commit`]):
//! whatever it writes next lands later in the WAL, so no flush can keep that
//! write without the commit it acted on. A batch with no other caller is
//! not flushed on its own: the next flush covers it. And when such a caller
//! was answered, the batch's flush waits up to `follow_up_wait` for that
//! caller's next commit (a Scheduler answering the message it was just
//! handed), so that one flush makes both durable: a lone workflow's step
//! then waits for one flush instead of two in a row.
//!
//! Receives wait here too ("parked"): after the jobs of a batch have run,
//! the writer serves parked receivers inside the same transaction, so a
//! message sent in a batch reaches a waiting consumer in the same commit —
//! in-process consumers are woken without any polling delay. Work that
//! appears without passing through this writer (another process writing
//! the same file, a delay or lease running out) is found by a poll every
//! `poll_interval` while receivers are parked.
//!
//! Each commit is also counted through the `metrics` facade
//! (`COMMITS_METRIC`, `COMMIT_JOBS_METRIC`: the group-commit batch sizes).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rota_model::{Clock, InstanceId, LeaseToken, QueueName, Timestamp};
use rota_store::{Delivery, Error, Result};
use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use crate::flusher::{Committed, FlushHandle};
use crate::queue_sql;

/// What a job leaves to do once the commit's outcome is known: reply to
/// its caller. It receives the commit error, if the commit failed.
pub(crate) type Settle = Box<dyn FnOnce(Option<&str>) + Send>;

/// A unit of work run inside the group-commit transaction. Returns whether
/// it succeeded (if not, its savepoint is rolled back) and how to settle.
pub(crate) type Job = Box<dyn FnOnce(&Connection, Timestamp) -> (bool, Settle) + Send>;

/// When a caller hears that its commit went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplyAt {
    /// Once the commit is durable: the caller may act outside the store.
    Durable,
    /// Once the commit is in the WAL, before its flush: the caller acts on
    /// the outcome only by writing to this store, and each such write is
    /// durable only with everything committed before it.
    Commit,
}

/// A message to the writer thread.
pub(crate) enum Command {
    /// Run a job in the next batch.
    Write(Job, ReplyAt),
    /// Wait for messages.
    Receive(Parked),
}

/// A receiver waiting for messages.
pub(crate) struct Parked {
    pub queue: QueueName,
    pub max: u32,
    pub lease: Option<Duration>,
    pub owner: Option<InstanceId>,
    /// When to give up and reply with nothing (wall time: a long poll is
    /// about real waiting, whatever the store's clock says).
    pub deadline: Instant,
    pub reply_at: ReplyAt,
    pub reply: oneshot::Sender<Result<Vec<Delivery>>>,
}

/// Counters of the writer's work, for benchmarks and metrics.
#[derive(Debug, Default)]
pub struct CommitStats {
    /// Transactions committed.
    pub commits: AtomicU64,
    /// Jobs run (each caller's operation is one job).
    pub jobs: AtomicU64,
    /// Claims made for receives (with or without messages found). A
    /// parked receive whose queue holds nothing visible waits without one.
    pub receives: AtomicU64,
    /// Transactions committed for the periodic sweep of expired message
    /// ids alone (no job, no receive, no give-back).
    pub sweeps: AtomicU64,
    /// Flushes of the WAL by the flusher thread (each covers every batch
    /// committed before it began); none when SQLite flushes in `COMMIT`.
    pub flushes: AtomicU64,
    /// Replies sent at commit, before the flush ([`ReplyAt::Commit`]):
    /// claims, and deliveries to receivers that act within the store.
    pub replied_at_commit: AtomicU64,
}

/// A snapshot of [`CommitStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitCounts {
    /// Transactions committed.
    pub commits: u64,
    /// Jobs run.
    pub jobs: u64,
    /// Receives served.
    pub receives: u64,
    /// Transactions that only swept expired message ids (counted in
    /// `commits` too).
    pub sweeps: u64,
    /// Flushes of the WAL by the flusher thread.
    pub flushes: u64,
    /// Replies sent at commit, before the flush.
    pub replied_at_commit: u64,
}

impl CommitStats {
    pub(crate) fn snapshot(&self) -> CommitCounts {
        CommitCounts {
            commits: self.commits.load(Ordering::Relaxed),
            jobs: self.jobs.load(Ordering::Relaxed),
            receives: self.receives.load(Ordering::Relaxed),
            sweeps: self.sweeps.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            replied_at_commit: self.replied_at_commit.load(Ordering::Relaxed),
        }
    }
}

/// Counter: group commits (transactions committed by the writer), through
/// the `metrics` facade (a no-op unless the process installed a recorder).
const COMMITS_METRIC: &str = "rota_sqlite_commits_total";
/// Histogram: the jobs (callers' writes) that shared one group commit.
const COMMIT_JOBS_METRIC: &str = "rota_sqlite_commit_jobs";
/// Counter: group commits that failed (every job in them failed too).
const COMMIT_FAILURES_METRIC: &str = "rota_sqlite_commit_failures_total";

pub(crate) struct WriterConfig {
    pub batch_ops_max: usize,
    pub poll_interval: Duration,
    pub follow_up_wait: Duration,
}

/// How often expired duplicate-detection ids are swept, and how many at most per sweep.
const ID_SWEEP_INTERVAL: Duration = Duration::from_secs(1);
const ID_SWEEP_MAX: u32 = 1_000;

pub(crate) struct Writer {
    conn: Connection,
    clock: Arc<dyn Clock>,
    commands: mpsc::Receiver<Command>,
    config: WriterConfig,
    parked: Vec<Parked>,
    /// Leases granted to receivers that went away before the reply: given
    /// back in the next transaction so that they do not wait out their lease.
    orphaned: Vec<LeaseToken>,
    stats: Arc<CommitStats>,
    last_poll: Instant,
    last_sweep: Instant,
    closed: Arc<AtomicBool>,
    /// Makes commits durable and replies after, when SQLite does not flush
    /// in `COMMIT` (see [`crate::flusher`]).
    flush: Option<FlushHandle>,
    /// Whether a commit no one waited for has not been flushed yet.
    unflushed: bool,
    /// Committed batches whose callers wait for a flush that waits in turn
    /// for the next commit of a caller answered at commit, and until when.
    held: Option<(Committed, Instant)>,
}

impl Writer {
    pub(crate) fn new(
        conn: Connection,
        clock: Arc<dyn Clock>,
        commands: mpsc::Receiver<Command>,
        config: WriterConfig,
        stats: Arc<CommitStats>,
        closed: Arc<AtomicBool>,
        flush: Option<FlushHandle>,
    ) -> Self {
        let now = Instant::now();
        Writer {
            conn,
            clock,
            commands,
            config,
            parked: Vec::new(),
            orphaned: Vec::new(),
            stats,
            last_poll: now,
            last_sweep: now,
            closed,
            flush,
            unflushed: false,
            held: None,
        }
    }

    /// Runs until every sender is gone.
    pub(crate) fn run(mut self) {
        // A tiny runtime only to wait on the channel with a timeout.
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_time().build() {
            Ok(runtime) => runtime,
            Err(err) => {
                tracing::error!("sqlite writer cannot start its timer runtime: {err}");
                return;
            }
        };
        let mut batch: Vec<Command> = Vec::with_capacity(self.config.batch_ops_max);
        loop {
            let open = if self.parked.is_empty() && self.orphaned.is_empty() && self.held.is_none() {
                match self.commands.blocking_recv() {
                    Some(command) => {
                        batch.push(command);
                        true
                    }
                    None => false,
                }
            } else {
                let wait = self.next_wake();
                let commands = &mut self.commands;
                match runtime.block_on(async { tokio::time::timeout(wait, commands.recv()).await }) {
                    Ok(Some(command)) => {
                        batch.push(command);
                        true
                    }
                    Ok(None) => false,
                    Err(_elapsed) => true,
                }
            };
            if !open {
                break;
            }
            while batch.len() < self.config.batch_ops_max {
                match self.commands.try_recv() {
                    Ok(command) => batch.push(command),
                    Err(_) => break,
                }
            }
            self.run_batch(&mut batch);
            if self.held.as_ref().is_some_and(|(_, until)| *until <= Instant::now()) {
                // The follow-up did not come in time.
                self.flush_held(self.commands.is_empty());
            }
        }
        for parked in self.parked.drain(..) {
            let _ = parked.reply.send(Ok(Vec::new()));
        }
        // The last batches' replies go out, flushed, before the store counts
        // as closed; a last commit no one waited for is flushed too.
        if let Some(flush) = self.flush.take() {
            let held = self.held.take().map(|(batch, _)| batch);
            if self.unflushed || held.is_some() {
                flush.flush_here_then_reply(held.unwrap_or_else(Committed::nothing));
            }
            drop(flush);
        }
        self.closed.store(true, Ordering::SeqCst);
    }

    /// How long to wait for commands before the next poll or receive deadline.
    fn next_wake(&self) -> Duration {
        let now = Instant::now();
        let poll_at = self.last_poll + self.config.poll_interval;
        let held_until = self.held.as_ref().map_or(poll_at, |(_, until)| *until);
        let earliest = self.parked.iter().map(|p| p.deadline).fold(poll_at.min(held_until), Instant::min);
        earliest.saturating_duration_since(now)
    }

    fn run_batch(&mut self, batch: &mut Vec<Command>) {
        let now = self.clock.now();
        let mut jobs = Vec::with_capacity(batch.len());
        let mut newly_parked: Vec<QueueName> = Vec::new();
        for command in batch.drain(..) {
            match command {
                Command::Write(job, reply_at) => jobs.push((job, reply_at)),
                Command::Receive(parked) => {
                    newly_parked.push(parked.queue.clone());
                    self.parked.push(parked);
                }
            }
        }
        // Receivers whose caller went away need nothing more.
        self.parked.retain(|p| !p.reply.is_closed());
        let flush_failure = self.flush.as_ref().and_then(|flush| {
            self.orphaned.extend(flush.take_orphaned());
            flush.failure()
        });

        let poll_due = self.last_poll.elapsed() >= self.config.poll_interval;
        let serve_parked = !self.parked.is_empty();
        if poll_due {
            self.last_poll = Instant::now();
        }
        // A poll with nothing to do must not take the write lock (another
        // process may be writing): check cheaply first. Between polls, only
        // the receivers that just arrived can have work no batch offered
        // them yet: the others were tried after the last batch of writes.
        let worth_serving = serve_parked
            && (!jobs.is_empty()
                || if poll_due {
                    self.any_visible(&self.parked.iter().map(|p| &p.queue).collect::<Vec<_>>(), now)
                } else {
                    !newly_parked.is_empty() && self.any_visible(&newly_parked.iter().collect::<Vec<_>>(), now)
                });
        let sweep_due = self.last_sweep.elapsed() >= ID_SWEEP_INTERVAL;

        if jobs.is_empty() && !worth_serving && self.orphaned.is_empty() && !sweep_due {
            self.reply_expired_waits();
            return;
        }

        let sweep_only = jobs.is_empty() && !worth_serving && self.orphaned.is_empty();
        let mut settles: Vec<(Settle, ReplyAt)> = Vec::with_capacity(jobs.len());
        let mut served: Vec<(Parked, Result<Vec<Delivery>>)> = Vec::new();
        let outcome = self.transaction(|writer| {
            for (job, reply_at) in jobs {
                run_cached(&writer.conn, "SAVEPOINT job")?;
                let (ok, settle) = job(&writer.conn, now);
                if !ok {
                    run_cached(&writer.conn, "ROLLBACK TO job")?;
                }
                run_cached(&writer.conn, "RELEASE job")?;
                settles.push((settle, reply_at));
            }
            writer.give_back_orphans(now)?;
            if worth_serving {
                served = writer.serve_parked(now)?;
            }
            if sweep_due {
                writer.last_sweep = Instant::now();
                queue_sql::forget_expired_ids(&writer.conn, now, ID_SWEEP_MAX)?;
            }
            // After a failed flush nothing more may commit: whether the
            // file's tail reached the disk is unknown.
            match flush_failure {
                Some(failure) => Err(Error::Backend(failure)),
                None => Ok(()),
            }
        });
        self.stats.jobs.fetch_add(settles.len() as u64, Ordering::Relaxed);
        // Passed on inside another error: its message alone, without the
        // "store backend error" of its kind.
        let failure = outcome.err().map(|err| match err {
            Error::Backend(message) => message,
            other => other.to_string(),
        });
        if failure.is_none() {
            self.stats.commits.fetch_add(1, Ordering::Relaxed);
            if sweep_only {
                self.stats.sweeps.fetch_add(1, Ordering::Relaxed);
            }
            metrics::counter!(COMMITS_METRIC).increment(1);
            metrics::histogram!(COMMIT_JOBS_METRIC).record(settles.len() as f64);
        } else {
            metrics::counter!(COMMIT_FAILURES_METRIC).increment(1);
            tracing::error!("sqlite group commit failed: {}", failure.as_deref().unwrap_or_default());
        }
        if failure.is_none() && self.flush.is_some() {
            let (at_commit, settles): (Vec<_>, Vec<_>) = settles.into_iter().partition(|(_, at)| *at == ReplyAt::Commit);
            let (served_at_commit, served): (Vec<_>, Vec<_>) = served.into_iter().partition(|(p, _)| p.reply_at == ReplyAt::Commit);
            let replied_at_commit = at_commit.len() + served_at_commit.len();
            self.stats.replied_at_commit.fetch_add(replied_at_commit as u64, Ordering::Relaxed);
            reply(at_commit.into_iter().map(|(settle, _)| settle), served_at_commit, None, &mut self.orphaned);
            let batch = Committed { settles: settles.into_iter().map(|(settle, _)| settle).collect(), served };
            let waited_for = !batch.is_empty();
            if waited_for {
                self.hold(batch);
            }
            if replied_at_commit > 0 && self.held.is_some() && !self.config.follow_up_wait.is_zero() {
                // The callers just answered write next, most likely at once:
                // their commit shares the flush of what waits (bounded by
                // the wait, counted from the first batch held).
            } else if waited_for {
                // With no work waiting, flush here, sparing a lone caller the
                // flusher thread's wake-up; with work waiting, or on its way
                // from the callers just answered, let it run during the flush.
                self.flush_held(self.commands.is_empty() && replied_at_commit == 0);
            } else if self.held.is_none() {
                // No one waits for this commit to be durable (a claim, say):
                // the next flush covers it, since it flushes the whole file.
                self.unflushed = true;
            }
            self.reply_expired_waits();
            return;
        }
        reply(settles.into_iter().map(|(settle, _)| settle), served, failure.as_deref(), &mut self.orphaned);
        self.reply_expired_waits();
    }

    /// Adds a committed batch to those waiting for the next flush.
    fn hold(&mut self, batch: Committed) {
        match &mut self.held {
            Some((held, _)) => held.absorb(batch),
            None => self.held = Some((batch, Instant::now() + self.config.follow_up_wait)),
        }
    }

    /// Flushes what waits for a flush, then replies: on this thread when
    /// `here`, else on the flusher thread while the next batch runs.
    fn flush_held(&mut self, here: bool) {
        if let (Some((batch, _)), Some(flush)) = (self.held.take(), &self.flush) {
            self.unflushed = false;
            if here {
                flush.flush_here_then_reply(batch);
            } else {
                flush.flush_then_reply(batch);
            }
        }
    }

    /// Whether any of `queues` holds a visible message, or does not exist
    /// yet (its first receive creates it). One statement for them all; on a
    /// read error, yes: the claim will report it.
    fn any_visible(&self, queues: &[&QueueName], now: Timestamp) -> bool {
        queue_sql::servable(&self.conn, queues, now).map_or(true, |servable| !servable.is_empty())
    }

    /// Claims messages for parked receivers, oldest receiver first. Returns
    /// the receivers to reply to now (served, or out of time); the rest stay
    /// parked.
    fn serve_parked(&mut self, now: Timestamp) -> Result<Vec<(Parked, Result<Vec<Delivery>>)>> {
        let wall = Instant::now();
        let mut ready = Vec::new();
        let mut still = Vec::with_capacity(self.parked.len());
        // A claim for a receiver whose queue holds nothing visible would
        // find nothing: one read leaves those out, however many wait.
        // On a read error, try every claim: each reports its own error.
        let servable = queue_sql::servable(&self.conn, &self.parked.iter().map(|p| &p.queue).collect::<Vec<_>>(), now).ok();
        for parked in std::mem::take(&mut self.parked) {
            let result = if servable.as_ref().is_none_or(|servable| servable.contains(parked.queue.as_str())) {
                self.stats.receives.fetch_add(1, Ordering::Relaxed);
                self.claim_for(&parked, now)
            } else {
                Ok(Vec::new())
            };
            match result {
                Ok(deliveries) if deliveries.is_empty() && parked.deadline > wall => still.push(parked),
                other => ready.push((parked, other)),
            }
        }
        self.parked = still;
        Ok(ready)
    }

    fn claim_for(&self, parked: &Parked, now: Timestamp) -> Result<Vec<Delivery>> {
        run_cached(&self.conn, "SAVEPOINT receive")?;
        let result = queue_sql::ensure_queue(&self.conn, &parked.queue, now).and_then(|queue| {
            let lease = parked.lease.unwrap_or(queue.config.lease);
            queue_sql::claim(&self.conn, &queue, parked.max, lease, parked.owner.as_ref(), now)
        });
        if result.is_err() {
            run_cached(&self.conn, "ROLLBACK TO receive")?;
        }
        run_cached(&self.conn, "RELEASE receive")?;
        result
    }

    fn give_back_orphans(&mut self, now: Timestamp) -> Result<()> {
        for token in self.orphaned.drain(..) {
            self.conn
                .prepare_cached(
                    "UPDATE messages SET lease_owner = NULL, lease_until = NULL, visible_at = ?3, delivery_count = delivery_count - 1
                      WHERE seq = ?1 AND lease_epoch = ?2",
                )
                .and_then(|mut stmt| stmt.execute(rusqlite::params![token.message, token.epoch, now.as_millis()]))
                .map_err(crate::sql_error)?;
        }
        Ok(())
    }

    fn reply_expired_waits(&mut self) {
        let wall = Instant::now();
        let (expired, waiting): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.parked).into_iter().partition(|p| p.deadline <= wall);
        self.parked = waiting;
        for parked in expired {
            let _ = parked.reply.send(Ok(Vec::new()));
        }
    }

    /// Runs `body` in one IMMEDIATE transaction and commits it, or rolls
    /// everything back if the body or the commit fails.
    fn transaction(&mut self, body: impl FnOnce(&mut Writer) -> Result<()>) -> Result<()> {
        self.conn.execute_batch("BEGIN IMMEDIATE").map_err(crate::sql_error)?;
        let result = body(self).and_then(|()| self.conn.execute_batch("COMMIT").map_err(crate::sql_error));
        let result = result.map_err(|err| crate::naming_the_file(err, &self.conn));
        if result.is_err()
            && !self.conn.is_autocommit()
            && let Err(err) = self.conn.execute_batch("ROLLBACK")
        {
            tracing::error!("sqlite rollback failed: {err}");
        }
        result
    }
}

/// Replies to jobs and served receivers, with the commit's `failure` if it
/// failed; the lease of a receiver that went away goes to `orphaned`, to be
/// given back.
fn reply(
    settles: impl Iterator<Item = Settle>,
    served: Vec<(Parked, Result<Vec<Delivery>>)>,
    failure: Option<&str>,
    orphaned: &mut Vec<LeaseToken>,
) {
    for settle in settles {
        settle(failure);
    }
    for (parked, result) in served {
        let result = match failure {
            Some(err) => Err(Error::Backend(err.to_owned())),
            None => result,
        };
        let tokens: Vec<LeaseToken> = match &result {
            Ok(deliveries) if failure.is_none() => deliveries.iter().map(|d| d.lease_token).collect(),
            _ => Vec::new(),
        };
        if parked.reply.send(result).is_err() {
            orphaned.extend(tokens);
        }
    }
}

/// Runs a parameterless statement through the statement cache: savepoints
/// run once per job, so re-parsing them each time would show in profiles.
fn run_cached(conn: &Connection, sql: &str) -> Result<()> {
    conn.prepare_cached(sql).and_then(|mut stmt| stmt.execute([])).map_err(crate::sql_error)?;
    Ok(())
}
