//! Whether the agents a Scheduler sends to keep up, so that it finishes
//! the tasks it started before claiming new ones.
//!
//! An agent queue is saturated when at least `agent_backlog_max` requests
//! wait in it (ready, not yet taken) while its consumers hold others
//! leased. While one is, the Scheduler claims nothing: a new task's first
//! request would only queue ahead of the next steps of the tasks it
//! started. A queue nobody consumes is down, not saturated: holding claims
//! back for it would stop every workflow's new tasks for as long as it
//! stays down, while its own tasks fail as they would anyway.
//!
//! The check is one bounded read (`Queues::backlogs`). It is skipped while
//! the last one, taken within [`RECHECK_AFTER`], saw the backlog so far
//! under the bound that, with every request this Scheduler sent since and
//! has had no answer to counted as still waiting, it stays under half of
//! it: so an idle Scheduler's lone workflow pays no read before its
//! claim, one whose agents keep up reads about once per
//! [`RECHECK_AFTER`], and one whose sends could have brought the backlog
//! near the bound reads before every claim.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rota_model::QueueName;
use rota_store::SharedStore;

use crate::{protocol, telemetry};

/// The most agent queues watched: the check's read names them all.
const QUEUES_WATCHED_MAX: usize = 256;

/// How long a check that found the backlog far under its bound stands.
pub(crate) const RECHECK_AFTER: Duration = Duration::from_millis(50);

/// One Scheduler's watch over the agent queues it sends to.
pub(crate) struct Saturation {
    /// `agent_backlog_max`; 0 never holds claims back.
    bound: u32,
    /// The agent queues this Scheduler has sent step requests to.
    queues: Mutex<Vec<QueueName>>,
    /// Agent requests this Scheduler has sent, ever.
    sent: AtomicU64,
    /// Agent replies it has decided on, ever: each was a request taken.
    answered: AtomicU64,
    /// The last check: when, the largest ready count it saw, and `sent`
    /// less `answered` then.
    last: Mutex<Option<(Instant, u64, u64)>>,
    /// Whether the last check held claims back (to log changes only).
    held_back: AtomicBool,
    /// Rung by every committed decision: a reply handled may be the one
    /// that brings the backlog under its bound.
    decided: tokio::sync::Notify,
}

impl Saturation {
    pub(crate) fn new(bound: u32) -> Self {
        Saturation {
            bound,
            queues: Mutex::default(),
            sent: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            last: Mutex::new(None),
            held_back: AtomicBool::new(false),
            decided: tokio::sync::Notify::new(),
        }
    }

    /// Counts the agent requests among the queues a commit sent to, and
    /// watches their queues.
    pub(crate) fn sending<'q>(&self, sent: impl Iterator<Item = &'q QueueName>) {
        if self.bound == 0 {
            return;
        }
        let mut watched = None;
        let mut requests = 0;
        for queue in sent.filter(|q| protocol::is_agent_queue(q)) {
            requests += 1;
            let queues = watched.get_or_insert_with(|| self.queues.lock().expect("the watched queues"));
            if queues.len() < QUEUES_WATCHED_MAX && !queues.contains(queue) {
                queues.push(queue.clone());
            }
        }
        self.sent.fetch_add(requests, Ordering::Relaxed);
    }

    /// A decision was committed; `answered`: on an agent's reply.
    pub(crate) fn decided(&self, answered: bool) {
        if answered && self.bound > 0 {
            self.answered.fetch_add(1, Ordering::Relaxed);
        }
        self.decided.notify_one();
    }

    /// Requests sent and not answered yet, as far as this Scheduler knows.
    fn unanswered(&self) -> u64 {
        // Read in this order, a reply decided between the reads can only
        // make the difference larger, never wrap it below zero.
        let answered = self.answered.load(Ordering::Relaxed);
        self.sent.load(Ordering::Relaxed).saturating_sub(answered)
    }

    /// Waits for the next committed decision, or `at_most`.
    pub(crate) async fn next_decision(&self, at_most: Duration) {
        tokio::select! {
            () = self.decided.notified() => {}
            () = tokio::time::sleep(at_most) => {}
        }
    }

    /// Whether a queue is saturated now (see the module's comment). A
    /// failed read says no: the bound protects latency, and a store that
    /// cannot answer it will refuse the claim too.
    pub(crate) async fn saturated(&self, store: &SharedStore) -> bool {
        if self.bound == 0 || self.recently_far_under() {
            return false;
        }
        let queues = self.queues.lock().expect("the watched queues").clone();
        if queues.is_empty() {
            return false;
        }
        let unanswered_before = self.unanswered();
        let backlogs = match store.backlogs(&queues, self.bound).await {
            Ok(backlogs) => backlogs,
            Err(err) => {
                tracing::debug!("counting the agents' backlog: {err}; claiming anyway");
                return false;
            }
        };
        let most_ready = backlogs.iter().map(|b| b.ready).max().unwrap_or(0);
        *self.last.lock().expect("the last check") = Some((Instant::now(), most_ready, unanswered_before));
        let saturated = backlogs.into_iter().find(|b| b.leased && b.ready >= u64::from(self.bound));
        let held_back = saturated.is_some();
        if self.held_back.swap(held_back, Ordering::Relaxed) != held_back {
            match &saturated {
                Some(backlog) => tracing::info!(
                    "{} or more step requests wait in {} while its agents are busy (--agent-backlog-max): \
                     no new task is claimed until started ones move on",
                    self.bound,
                    backlog.queue
                ),
                None => tracing::info!("the agents keep up again: claiming new tasks"),
            }
        }
        metrics::gauge!(telemetry::CLAIMS_HELD_BACK).set(if held_back { 1.0 } else { 0.0 });
        held_back
    }

    /// Whether the last check is recent and, with the requests sent since
    /// and not answered counted as still waiting, under half the bound.
    fn recently_far_under(&self) -> bool {
        let Some((at, ready, unanswered_then)) = *self.last.lock().expect("the last check") else { return false };
        let more_unanswered = self.unanswered().saturating_sub(unanswered_then);
        at.elapsed() < RECHECK_AFTER && (ready + more_unanswered) * 2 < u64::from(self.bound)
    }
}
