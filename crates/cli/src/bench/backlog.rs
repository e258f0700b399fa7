//! Backlogs put in a run's new store before its timer starts
//! (`--backlog N --backlog-kind KIND`), to see whether a claim, a receive
//! and the workload stay as fast when the store holds much waiting work:
//!
//! - `pending`: N workflows of W's own kind, submitted and not yet claimed.
//!   W then measures how fast the engine drains the first
//!   [`DRAIN_COUNT`] of them instead of its closed loop.
//! - `future`: N workflows submitted to start [`DUE_IN`] from now
//!   (`Start::At`), each with its delayed doorbell.
//! - `paused`: N workflows of a paused twin of W's workflow
//!   ([`PAUSED_WORKFLOW`]), submitted after the pause: claims must pass
//!   them by.
//! - `delayed`: N messages visible [`DUE_IN`] from now in the queue the
//!   work goes through (W: the agent's queue; Q: its queues, spread evenly).
//!
//! Everything goes through the public calls (`Client::submit`,
//! `Queues::send`), [`IN_FLIGHT_MAX`] at once so that commits group, as
//! `fill` does.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rota_model::QueueName;
use rota_store::{Outgoing, Queues};
use serde_json::json;
use tokio::task::JoinSet;

/// What a backlog holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BacklogKind {
    /// Workflows waiting to be claimed (W only).
    Pending,
    /// Workflows due an hour from now (W only).
    Future,
    /// Workflows of a paused workflow (W only).
    Paused,
    /// Queue messages visible an hour from now.
    Delayed,
}

impl BacklogKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BacklogKind::Pending => "pending",
            BacklogKind::Future => "future",
            BacklogKind::Paused => "paused",
            BacklogKind::Delayed => "delayed",
        }
    }
}

/// The largest `--backlog`.
pub(crate) const BACKLOG_MAX: u64 = 10_000_000;
/// How far ahead the not-yet-due workflows and the delayed messages are
/// due: well past the end of any run.
pub(crate) const DUE_IN: Duration = Duration::from_secs(3600);
/// How many of a pending backlog W times the drain of.
pub(crate) const DRAIN_COUNT: u64 = 2_000;
/// The paused twin of W's workflow.
pub(crate) const PAUSED_WORKFLOW: &str = "bench_w_paused";
/// The most calls in flight while a backlog is made: enough for large
/// group commits.
const IN_FLIGHT_MAX: usize = 1_024;

/// Runs `make(i)` for i in 0..count, [`IN_FLIGHT_MAX`] at once; returns how
/// long it took. Progress goes to stderr every tenth.
pub(crate) async fn in_flight<F, Fut>(what: &str, count: u64, mut make: F) -> anyhow::Result<Duration>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let started = Instant::now();
    let tenth = (count / 10).max(1);
    let mut running: JoinSet<anyhow::Result<()>> = JoinSet::new();
    let mut done = 0u64;
    let note = |done: u64| {
        if done.is_multiple_of(tenth) {
            eprintln!("backlog: {done}/{count} {what} in {:.1} s", started.elapsed().as_secs_f64());
        }
    };
    for i in 0..count {
        while running.len() >= IN_FLIGHT_MAX {
            running.join_next().await.context("a backlog call ended")???;
            done += 1;
            note(done);
        }
        running.spawn(make(i));
    }
    while let Some(ended) = running.join_next().await {
        ended??;
        done += 1;
        note(done);
    }
    Ok(started.elapsed())
}

/// Sends `count` messages visible [`DUE_IN`] from now, spread evenly over
/// `queues`.
pub(crate) async fn send_delayed(store: &Arc<dyn Queues>, queues: &[QueueName], count: u64) -> anyhow::Result<Duration> {
    let queues = Arc::new(queues.to_vec());
    in_flight("delayed messages", count, |i| {
        let (store, queues) = (store.clone(), queues.clone());
        async move {
            let queue = &queues[(i % queues.len() as u64) as usize];
            let message = Outgoing::json(&json!({ "backlog": i }))?.with_delay(DUE_IN);
            store.send(queue, message).await.with_context(|| format!("sending delayed message {i} to {queue}"))?;
            Ok(())
        }
    })
    .await
}
