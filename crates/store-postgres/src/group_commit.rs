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
//!
//! A commit that goes out alone hands its messages to the receivers waiting
//! in this process (see `handoff`): a lone workflow's next step reaches its
//! agent, and the agent's reply its Scheduler, the moment the commit
//! returns, without a wake-up and a receive statement; so does a task
//! creation alone (a submission's doorbell, or the first request of a task
//! created started by its own process's Scheduler). A batch of several
//! commits does not: its receivers would wait for the whole batch, and
//! consumers handed one message at a time would stop taking them in
//! batches, which cost throughput when measured with fifty workflows in
//! flight.
//!
//! A commit alone whose messages all go to receivers that act only by
//! writing to this store (an agent's reply, handed to its Scheduler's
//! inbox) does not wait for its own flush: it commits with
//! `synchronous_commit` off, hands its messages over, and its caller hears
//! back once a later synchronous commit has flushed the WAL past it (see
//! [`Flushes`]): most often the decision of the Scheduler it handed the
//! reply to. So a step of a lone workflow waits for one flush instead of
//! two in a row, and the caller's success still means "durable".

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rota_model::{Clock, MessageId, QueueName, TaskId};
use rota_store::{Changes, Created, Error, NewTask};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};

use crate::commit_sql::{self, Committed, Flush, NewPart, Part};
use crate::connections::Connections;
use crate::handoff::{GiveBack, Lease, Leased, Waiting};
use crate::sql::Names;
use crate::task_sql;
use crate::{Fail, Result, TRANSACTION_TRIES_MAX};

/// Commit statements run (batches and commits alone).
pub(crate) const STATEMENTS_METRIC: &str = "rota_postgres_commit_statements_total";
/// Histogram: the commits that shared one statement.
pub(crate) const BATCH_METRIC: &str = "rota_postgres_commit_batch";
/// Batches refused as a whole and run again commit by commit.
pub(crate) const BATCHES_REFUSED_METRIC: &str = "rota_postgres_commit_batches_refused_total";
/// Commits alone that returned before their flush, for a later one.
pub(crate) const FLUSHED_LATER_METRIC: &str = "rota_postgres_commits_flushed_later_total";
/// Statements run only to flush a commit no later commit flushed in time.
pub(crate) const FLUSH_STATEMENTS_METRIC: &str = "rota_postgres_flush_statements_total";
/// Statements that created tasks (batches and creations alone).
pub(crate) const CREATE_STATEMENTS_METRIC: &str = "rota_postgres_create_statements_total";
/// Histogram: the task creations that shared one statement.
pub(crate) const CREATE_BATCH_METRIC: &str = "rota_postgres_create_batch";

/// Why `task` is neither created nor found after its creation statement:
/// created claimed while its workflow is paused (the statement leaves such
/// a task out), or gone since its insert conflicted.
pub(crate) fn not_created(task: &rota_model::Task) -> Fail {
    match task.locked_by {
        Some(_) => Error::Conflict(format!(
            "workflow {} is paused: task {} waits for a claim instead of being created claimed",
            task.workflow, task.id
        ))
        .into(),
        None => Error::Backend(format!("task {} vanished after a conflicting insert", task.id)).into(),
    }
}

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

/// One caller's task creation (`Tasks::create_task`), waiting for its batch.
pub(crate) struct PendingCreate {
    pub(crate) new: NewTask,
    /// The id of each message the task sends.
    pub(crate) send_ids: Vec<MessageId>,
    /// The id of every queue it sends to.
    pub(crate) queue_ids: HashMap<QueueName, i64>,
    /// Where the outcome goes, with the queues that got new messages.
    pub(crate) done: oneshot::Sender<Result<(Created, Vec<QueueName>), Error>>,
}

/// How many commits and task creations a store has run, and in how many
/// statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommitCounts {
    /// Commits asked for (`Tasks::commit` calls with something to write).
    pub commits: u64,
    /// Statements that ran them: one per batch, plus one per commit run
    /// again alone after its batch was refused.
    pub statements: u64,
    /// Task creations asked for (`Tasks::create_task` calls).
    pub creates: u64,
    /// Statements that ran them.
    pub create_statements: u64,
    /// Messages that commits alone handed to receivers waiting in this
    /// process (see `handoff`).
    pub handed_over: u64,
    /// Receives that parked without a statement, right after a look that
    /// found their queue empty (see `Queues::receive`).
    pub looks_skipped: u64,
    /// Commits alone that returned before their flush and were flushed by
    /// a later synchronous commit (see [`Flushes`]).
    pub flushed_later: u64,
    /// Statements run only to flush such a commit, when no later commit
    /// did within `follow_up_wait`.
    pub flush_statements: u64,
}

#[derive(Default)]
pub(crate) struct CommitStats {
    commits: AtomicU64,
    statements: AtomicU64,
    creates: AtomicU64,
    create_statements: AtomicU64,
    handed_over: AtomicU64,
    looks_skipped: AtomicU64,
    flushed_later: AtomicU64,
    flush_statements: AtomicU64,
}

impl CommitStats {
    pub(crate) fn snapshot(&self) -> CommitCounts {
        CommitCounts {
            commits: self.commits.load(Ordering::Relaxed),
            statements: self.statements.load(Ordering::Relaxed),
            creates: self.creates.load(Ordering::Relaxed),
            create_statements: self.create_statements.load(Ordering::Relaxed),
            handed_over: self.handed_over.load(Ordering::Relaxed),
            looks_skipped: self.looks_skipped.load(Ordering::Relaxed),
            flushed_later: self.flushed_later.load(Ordering::Relaxed),
            flush_statements: self.flush_statements.load(Ordering::Relaxed),
        }
    }

    /// Counts a receive that parked without a statement.
    pub(crate) fn look_skipped(&self) {
        self.looks_skipped.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the batches need of the store.
#[derive(Clone)]
pub(crate) struct Committer {
    pub(crate) connections: Arc<Connections>,
    pub(crate) names: Arc<Names>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) stats: Arc<CommitStats>,
    /// The receivers waiting in this process, for a commit alone to hand
    /// its messages to.
    pub(crate) waiting: Arc<Waiting>,
    pub(crate) give_back: GiveBack,
    pub(crate) flushes: Arc<Flushes>,
    /// How long a commit that returned before its flush waits for a later
    /// commit to flush it, before a statement of its own does.
    pub(crate) follow_up_wait: Duration,
}

/// Commits whose flush a later synchronous commit does.
///
/// PostgreSQL writes one WAL, in order, and a synchronous commit returns
/// once the WAL is on disk up to its own commit record. A commit record is
/// written when its statement ends, so a synchronous commit whose statement
/// was sent after another commit returned flushes that commit too. Each
/// commit that returned before its flush takes a ticket, numbered in the
/// order they return; each synchronous statement that writes notes, before
/// it is sent, the last ticket handed out, and once it returns marks every
/// ticket up to that one durable. A statement that wrote nothing has no
/// commit record to flush and marks nothing.
pub(crate) struct Flushes {
    /// The last ticket handed out.
    issued: AtomicU64,
    /// The highest ticket known durable.
    durable: watch::Sender<u64>,
}

impl Default for Flushes {
    fn default() -> Self {
        Flushes { issued: AtomicU64::new(0), durable: watch::Sender::new(0) }
    }
}

impl Flushes {
    /// The ticket of a commit that has just returned before its flush.
    fn issue(&self) -> u64 {
        self.issued.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// What a synchronous statement about to be sent will make durable.
    pub(crate) fn covered_by_next(&self) -> u64 {
        self.issued.load(Ordering::SeqCst)
    }

    /// A synchronous statement that wrote has returned: `covered` (its
    /// [`Flushes::covered_by_next`]) and every ticket before are durable.
    pub(crate) fn flushed(&self, covered: u64) {
        self.durable.send_if_modified(|durable| {
            let newer = covered > *durable;
            if newer {
                *durable = covered;
            }
            newer
        });
    }

    /// Waits up to `wait` for `ticket` to be made durable.
    async fn flushed_within(&self, ticket: u64, wait: Duration) -> bool {
        let mut durable = self.durable.subscribe();
        matches!(tokio::time::timeout(wait, durable.wait_for(|durable| *durable >= ticket)).await, Ok(Ok(_)))
    }
}

/// Whether a commit statement carrying `changes` surely writes a row (and
/// so a commit record that a synchronous commit flushes): all but a send
/// with its own id, which a duplicate turns into nothing.
fn surely_writes(changes: &Changes) -> bool {
    !changes.tasks.is_empty()
        || !changes.steps.is_empty()
        || !changes.new_steps.is_empty()
        || !changes.complete.is_empty()
        || !changes.events.is_empty()
        || changes.send.iter().any(|(_, message)| message.id.is_none())
}

/// A write waiting for its batch.
// A commit, the frequent job, is kept inline: boxing it would allocate on
// every commit to save a few bytes per job waiting in the backlog.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Job {
    Commit(Pending),
    /// Boxed: a creation carries a whole task, and commits, the more
    /// frequent jobs, should not pay for its size in the backlog.
    Create(Box<PendingCreate>),
}

/// Takes queued writes in batches of up to `batch_max`, with at most
/// `in_flight` batches running, until the store is dropped. A batch holds
/// writes of one kind: commits, or task creations.
pub(crate) async fn run(committer: Committer, batch_max: usize, in_flight: usize, mut queued: mpsc::UnboundedReceiver<Job>) {
    let slots = Arc::new(Semaphore::new(in_flight));
    let mut backlog: VecDeque<Job> = VecDeque::new();
    loop {
        if backlog.is_empty() {
            match queued.recv().await {
                Some(first) => backlog.push_back(first),
                None => return,
            }
        }
        // Waiting for a slot is what lets a batch grow: whatever queues
        // meanwhile joins it.
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        while let Ok(next) = queued.try_recv() {
            backlog.push_back(next);
        }
        let (mut commits, mut creates) = (Vec::new(), Vec::new());
        let creating = matches!(backlog.front(), Some(Job::Create(_)));
        let mut others = VecDeque::new();
        while let Some(job) = backlog.pop_front() {
            match job {
                Job::Commit(commit) if !creating && commits.len() < batch_max => commits.push(commit),
                Job::Create(create) if creating && creates.len() < batch_max => creates.push(*create),
                other => others.push_back(other),
            }
        }
        backlog = others;
        if creating {
            tokio::spawn(committer.clone().create_batch(creates, slot));
        } else {
            tokio::spawn(committer.clone().commit_batch(commits, slot));
        }
    }
}

impl Committer {
    async fn commit_batch(self, mut batch: Vec<Pending>, slot: OwnedSemaphorePermit) {
        metrics::histogram!(BATCH_METRIC).record(batch.len() as f64);
        self.stats.commits.fetch_add(batch.len() as u64, Ordering::Relaxed);
        if batch.len() == 1 {
            let one = batch.pop().expect("one commit");
            let sends = one.changes.send.iter().zip(&one.send_ids).map(|((queue, message), id)| (queue, message, id));
            let handoffs = self.waiting.plan(sends);
            let flush = match handoffs.hands_all_within_store() {
                true => Flush::Later,
                false => Flush::AtCommit,
            };
            let now = self.clock.now();
            let mut ticket = None;
            // A failed commit drops the plan: its receivers get nothing
            // and look for themselves.
            let outcome = self.commit_alone(&one, &handoffs.leases, flush).await.map(|(sent_to, leased)| {
                // Taken before the receivers act: the commit they make next
                // then counts as flushing this one. A message inserted
                // unleased after all is visible to any receiver of its
                // queue, so that one is flushed without waiting.
                if flush == Flush::Later {
                    let all_leased = leased.len() == one.changes.send.len();
                    ticket = Some((self.flushes.issue(), if all_leased { self.follow_up_wait } else { Duration::ZERO }));
                }
                self.stats.handed_over.fetch_add(leased.len() as u64, Ordering::Relaxed);
                handoffs.deliver(&leased, &one.queue_ids, now, &self.give_back);
                let sends = one.changes.send.iter().map(|(queue, _)| queue).zip(&one.send_ids);
                crate::handoff::not_all_handed(sent_to, sends, &leased, &one.queue_ids)
            });
            let outcome = match (outcome, ticket) {
                (Ok(sent_to), Some((ticket, wait))) => {
                    // The next batch need not wait for this one's flush.
                    drop(slot);
                    self.flushed_later(ticket, wait).await.map(|()| sent_to)
                }
                (outcome, _) => outcome,
            };
            let _ = one.done.send(outcome);
            return;
        }
        let mut queue_ids = HashMap::new();
        for pending in &batch {
            queue_ids.extend(pending.queue_ids.iter().map(|(queue, id)| (queue.clone(), *id)));
        }
        let parts: Vec<Part<'_>> = batch.iter().map(|p| (&p.changes, p.send_ids.as_slice())).collect();
        match self.statement(&parts, &[], &queue_ids, Flush::AtCommit).await {
            Ok(Committed::Written { sent_to, .. }) => {
                let mut sent_to = Some(sent_to);
                for pending in batch {
                    // One caller announces for the batch.
                    let _ = pending.done.send(Ok(sent_to.take().unwrap_or_default()));
                }
            }
            Ok(Committed::Refused) => {
                metrics::counter!(BATCHES_REFUSED_METRIC).increment(1);
                let alone: Vec<_> = batch.iter().map(|pending| self.commit_alone(pending, &[], Flush::AtCommit)).collect();
                let outcomes = futures_util::future::join_all(alone).await;
                for (pending, outcome) in batch.into_iter().zip(outcomes) {
                    let _ = pending.done.send(outcome.map(|(sent_to, _)| sent_to));
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

    /// Waits until a later synchronous commit has flushed the commit that
    /// took `ticket` when it returned before its flush, or, after `wait`,
    /// flushes it with a statement of its own. An error leaves whether the
    /// commit is durable unknown, like any commit whose reply is lost.
    async fn flushed_later(&self, ticket: u64, wait: Duration) -> Result<(), Error> {
        if !self.flushes.flushed_within(ticket, wait).await {
            metrics::counter!(FLUSH_STATEMENTS_METRIC).increment(1);
            self.stats.flush_statements.fetch_add(1, Ordering::Relaxed);
            let covered = self.flushes.covered_by_next();
            let mut conn = self.connections.acquire().await.map_err(Fail::into_store)?;
            let flushed = commit_sql::flush(&mut conn).await;
            conn.finished(&flushed);
            flushed.map_err(Fail::into_store)?;
            self.flushes.flushed(covered);
        }
        metrics::counter!(FLUSHED_LATER_METRIC).increment(1);
        self.stats.flushed_later.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// One caller's commit in a statement of its own, diagnosed if refused.
    /// Returns the queues that got new messages and the messages inserted
    /// leased (those `leases`, lined up with its messages, hand over).
    async fn commit_alone(
        &self,
        pending: &Pending,
        leases: &[Option<Lease>],
        flush: Flush,
    ) -> Result<(Vec<QueueName>, Vec<Leased>), Error> {
        let parts = [(&pending.changes, pending.send_ids.as_slice())];
        match self.statement(&parts, leases, &pending.queue_ids, flush).await {
            Ok(Committed::Written { sent_to, leased }) => Ok((sent_to, leased)),
            Ok(Committed::Refused) => {
                let diagnosis: Result<Fail> = async {
                    let mut conn = self.connections.acquire().await?;
                    let diagnosis = commit_sql::diagnose(&mut conn, &self.names, &pending.changes, self.clock.now()).await;
                    conn.finished_with(Some(&diagnosis));
                    Ok(diagnosis)
                }
                .await;
                Err(diagnosis.unwrap_or_else(|fail| fail).into_store())
            }
            Err(fail) => Err(fail.into_store()),
        }
    }

    /// Creates the tasks of `batch`, in as few statements as their ids and
    /// keyed messages allow (see [`statement_groups`]). A statement the
    /// server refused for what it wrote (a constraint, a value out of range)
    /// is run again creation by creation, so that only the creation at
    /// fault fails; a creation is idempotent (an existing id writes
    /// nothing), so running one again is safe.
    async fn create_batch(self, batch: Vec<PendingCreate>, _slot: OwnedSemaphorePermit) {
        self.stats.creates.fetch_add(batch.len() as u64, Ordering::Relaxed);
        for group in statement_groups(batch) {
            metrics::histogram!(CREATE_BATCH_METRIC).record(group.len() as f64);
            if let [alone] = group.as_slice() {
                let outcome = self.create_alone(alone).await;
                let _ = group.into_iter().next().expect("one creation").done.send(outcome);
                continue;
            }
            let outcome = self.create_statement(&group, &[]).await.map(|(outcomes, _)| outcomes);
            match outcome {
                Ok(outcomes) => {
                    for (pending, outcome) in group.into_iter().zip(outcomes) {
                        let _ = pending.done.send(Ok(outcome));
                    }
                }
                Err(fail) if group.len() > 1 && fail.is_refused_by_server() => {
                    for pending in group {
                        let outcome = self.create_statement(std::slice::from_ref(&pending), &[]).await;
                        let outcome = outcome.map(|(mut outcomes, _)| outcomes.remove(0)).map_err(Fail::into_store);
                        let _ = pending.done.send(outcome);
                    }
                }
                Err(fail) => {
                    let err = fail.into_store();
                    for pending in group {
                        let _ = pending.done.send(Err(duplicate(&err)));
                    }
                }
            }
        }
    }

    /// A creation in a statement of its own: it hands its messages to the
    /// receivers waiting in this process, as a commit alone does (a
    /// submission's doorbell to its Scheduler, the first step's request of
    /// a task created started to its agent).
    async fn create_alone(&self, pending: &PendingCreate) -> Result<(Created, Vec<QueueName>), Error> {
        let sends = pending.new.messages.iter().zip(&pending.send_ids).map(|((queue, message), id)| (queue, message, id));
        let handoffs = self.waiting.plan(sends);
        let now = self.clock.now();
        let (mut outcomes, leased) =
            self.create_statement(std::slice::from_ref(pending), &handoffs.leases).await.map_err(Fail::into_store)?;
        self.stats.handed_over.fetch_add(leased.len() as u64, Ordering::Relaxed);
        handoffs.deliver(&leased, &pending.queue_ids, now, &self.give_back);
        let (created, sent_to) = outcomes.remove(0);
        let sends = pending.new.messages.iter().map(|(queue, _)| queue).zip(&pending.send_ids);
        Ok((created, crate::handoff::not_all_handed(sent_to, sends, &leased, &pending.queue_ids)))
    }

    /// Runs one create statement (again when PostgreSQL aborted it to break
    /// a deadlock) and reads the tasks that existed already. Returns each
    /// creation's outcome, in order (the queues that got new messages go
    /// with the first), and the messages inserted leased (those `leases`,
    /// lined up with the creations' messages, hand over).
    async fn create_statement(
        &self,
        group: &[PendingCreate],
        leases: &[Option<Lease>],
    ) -> Result<(Vec<(Created, Vec<QueueName>)>, Vec<Leased>)> {
        metrics::counter!(CREATE_STATEMENTS_METRIC).increment(1);
        self.stats.create_statements.fetch_add(1, Ordering::Relaxed);
        let mut queue_ids = HashMap::new();
        for pending in group {
            queue_ids.extend(pending.queue_ids.iter().map(|(queue, id)| (queue.clone(), *id)));
        }
        let parts: Vec<NewPart<'_>> = group.iter().map(|p| (&p.new, p.send_ids.as_slice())).collect();
        let mut tries = 1_u32;
        loop {
            let covered = self.flushes.covered_by_next();
            let mut conn = self.connections.acquire().await?;
            let attempt: Result<_> = async {
                let (inserted, sent_to, leased) =
                    commit_sql::create_tasks(&mut conn, &self.names, &parts, leases, &queue_ids, self.clock.now()).await?;
                let existing: Vec<TaskId> =
                    group.iter().map(|p| &p.new.task.id).filter(|id| !inserted.iter().any(|i| i == id.as_str())).cloned().collect();
                let mut found =
                    if existing.is_empty() { Vec::new() } else { task_sql::get_tasks(&mut conn, &self.names, &existing).await? };
                let mut outcomes = Vec::with_capacity(group.len());
                let mut sent_to = Some(sent_to);
                for pending in group {
                    let id = &pending.new.task.id;
                    let created = if inserted.iter().any(|i| i == id.as_str()) {
                        Created::New
                    } else {
                        let at = found.iter().position(|record| &record.task.id == id);
                        let record = at.map(|at| found.swap_remove(at));
                        let record = record.ok_or_else(|| not_created(&pending.new.task))?;
                        Created::Existing(Box::new(record))
                    };
                    outcomes.push((created, sent_to.take().unwrap_or_default()));
                }
                if !inserted.is_empty() {
                    self.flushes.flushed(covered);
                }
                Ok((outcomes, leased))
            }
            .await;
            conn.finished(&attempt);
            match attempt {
                Err(fail) if fail.is_transient() && tries < TRANSACTION_TRIES_MAX => tries += 1,
                other => return other,
            }
        }
    }

    /// Runs one commit statement, again when PostgreSQL aborted it to break
    /// a deadlock.
    async fn statement(
        &self,
        parts: &[Part<'_>],
        leases: &[Option<Lease>],
        queue_ids: &HashMap<QueueName, i64>,
        flush: Flush,
    ) -> Result<Committed> {
        metrics::counter!(STATEMENTS_METRIC).increment(1);
        self.stats.statements.fetch_add(1, Ordering::Relaxed);
        let writes = parts.iter().any(|(changes, _)| surely_writes(changes));
        let mut tries = 1_u32;
        loop {
            let covered = self.flushes.covered_by_next();
            let attempt: Result<Committed> = async {
                let mut conn = self.connections.acquire().await?;
                let outcome = commit_sql::commit(&mut conn, &self.names, parts, leases, queue_ids, flush, self.clock.now()).await;
                conn.finished(&outcome);
                outcome
            }
            .await;
            if flush == Flush::AtCommit && writes && matches!(attempt, Ok(Committed::Written { .. })) {
                self.flushes.flushed(covered);
            }
            match attempt {
                Err(fail) if fail.is_transient() && tries < TRANSACTION_TRIES_MAX => tries += 1,
                other => return other,
            }
        }
    }
}

/// Splits creations into statements: one statement writes a task id once
/// (a second creation of the same id goes to a later statement, where it
/// finds the task the first created), and a creation that sends a keyed
/// message goes alone (a statement writes a message id once, and whether
/// it is a duplicate depends on whether its own task is created).
fn statement_groups(batch: Vec<PendingCreate>) -> Vec<Vec<PendingCreate>> {
    let mut groups: Vec<Vec<PendingCreate>> = Vec::new();
    let mut open: Vec<PendingCreate> = Vec::new();
    let mut later: Vec<PendingCreate> = Vec::new();
    let mut rest = batch;
    while !rest.is_empty() {
        for pending in rest.drain(..) {
            if pending.new.messages.iter().any(|(_, message)| message.id.is_some()) {
                groups.push(vec![pending]);
            } else if open.iter().any(|p| p.new.task.id == pending.new.task.id) {
                later.push(pending);
            } else {
                open.push(pending);
            }
        }
        if !open.is_empty() {
            groups.push(std::mem::take(&mut open));
        }
        rest = std::mem::take(&mut later);
    }
    groups
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
