//! The Consumer against a real store: each test runs on SQLite (a temporary
//! file) and on PostgreSQL (a fresh schema).
//!
//! These run in real time with short durations: the store does its IO on a
//! thread of its own, which tokio's paused clock counts as idle, so paused
//! time would fire every timeout at once (see DEPENDENCIES.md).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rota_engine::consumer::{Config, ConfigBuilder};
use rota_engine::{Consumer, Handler, Outcome, Shutdown, Summary};
use rota_model::{InstanceId, QueueName, SystemClock};
use rota_store::{Delivery, Outgoing, QueueConfig, QueueStats, Queues};
use serde::Deserialize;

use common::{Backend, TestStore};

/// A store on a fresh database, and what keeps that database alive.
async fn open_store(backend: Backend) -> Option<(Arc<dyn Queues>, TestStore)> {
    let db = common::open(backend, Arc::new(SystemClock)).await?;
    let store: Arc<dyn Queues> = db.store.clone();
    Some((store, db))
}

fn queue() -> QueueName {
    QueueName::new("work").unwrap()
}

fn config(consumer: &str, build: impl FnOnce(ConfigBuilder) -> ConfigBuilder) -> Config {
    let builder = Config::builder(queue(), InstanceId::new(consumer).unwrap()).receive_wait(Duration::from_millis(100));
    build(builder).build().expect("valid consumer config")
}

/// The test message body.
#[derive(Debug, Deserialize, serde::Serialize)]
struct Job {
    i: u64,
    #[serde(default)]
    action: Action,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Action {
    /// Sleep `Recorder::work`, then complete.
    #[default]
    Work,
    /// Sleep this many milliseconds, then complete.
    SleepMs(u64),
    /// Wait until the test opens the recorder's latch, then complete.
    Latched,
    /// Abandon the first delivery with this delay (ms), complete the next.
    AbandonOnceMs(u64),
    /// Always abandon, without delay.
    AbandonAlways,
    /// Dead-letter at once.
    DeadLetter,
    /// Panic.
    Panic,
}

async fn send_jobs(store: &dyn Queues, jobs: impl IntoIterator<Item = Job>) {
    let messages: Vec<Outgoing> = jobs.into_iter().map(|job| Outgoing::json(&job).unwrap()).collect();
    store.send_batch(&queue(), messages).await.expect("send");
}

/// A handler that records what it saw: per job, the delivery times; the
/// number of handlers running at once and its high-water mark; how many
/// returned.
#[derive(Default)]
struct Recorder {
    work: Duration,
    running: AtomicUsize,
    running_max: AtomicUsize,
    returned: AtomicUsize,
    deliveries: Mutex<HashMap<u64, Vec<(Instant, u32)>>>,
    latch: Latch,
}

/// What handlers of `Action::Latched` jobs wait on, shut until the test
/// opens it.
struct Latch(tokio::sync::Semaphore);

impl Default for Latch {
    fn default() -> Self {
        Latch(tokio::sync::Semaphore::new(0))
    }
}

impl Latch {
    async fn wait(&self) {
        // No permit is ever added: the wait ends when the latch is closed.
        let _ = self.0.acquire().await;
    }

    fn open(&self) {
        self.0.close();
    }
}

impl Recorder {
    fn new(work: Duration) -> Arc<Self> {
        Arc::new(Recorder { work, ..Default::default() })
    }

    fn distinct(&self) -> usize {
        self.deliveries.lock().unwrap().len()
    }

    fn deliveries_of(&self, i: u64) -> Vec<(Instant, u32)> {
        self.deliveries.lock().unwrap().get(&i).cloned().unwrap_or_default()
    }

    /// Jobs delivered more than once, with their delivery counts.
    fn duplicates(&self) -> Vec<(u64, Vec<u32>)> {
        let deliveries = self.deliveries.lock().unwrap();
        let mut found: Vec<(u64, Vec<u32>)> = deliveries
            .iter()
            .filter(|(_, seen)| seen.len() > 1)
            .map(|(i, seen)| (*i, seen.iter().map(|(_, count)| *count).collect()))
            .collect();
        found.sort();
        found
    }

    fn total(&self) -> usize {
        self.deliveries.lock().unwrap().values().map(Vec::len).sum()
    }
}

#[async_trait]
impl Handler for Recorder {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        let running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.running_max.fetch_max(running, Ordering::SeqCst);
        let job: Job = serde_json::from_str(delivery.body.get()).expect("test body");
        self.deliveries.lock().unwrap().entry(job.i).or_default().push((Instant::now(), delivery.delivery_count));
        let outcome = match job.action {
            Action::Work => {
                tokio::time::sleep(self.work).await;
                Outcome::Complete
            }
            Action::SleepMs(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Outcome::Complete
            }
            Action::Latched => {
                self.latch.wait().await;
                Outcome::Complete
            }
            Action::AbandonOnceMs(ms) if delivery.delivery_count == 1 => {
                Outcome::Abandon { delay: Duration::from_millis(ms), reason: "try again later".into() }
            }
            Action::AbandonOnceMs(_) => Outcome::Complete,
            Action::AbandonAlways => Outcome::Abandon { delay: Duration::ZERO, reason: "downstream is down".into() },
            Action::DeadLetter => Outcome::DeadLetter { reason: format!("poison message {}", job.i) },
            Action::Panic => {
                self.running.fetch_sub(1, Ordering::SeqCst);
                panic!("handler panics on purpose (job {})", job.i);
            }
        };
        self.running.fetch_sub(1, Ordering::SeqCst);
        self.returned.fetch_add(1, Ordering::SeqCst);
        outcome
    }
}

/// Runs a consumer in the background until `stop` is called.
struct Running {
    shutdown: Shutdown,
    run: tokio::task::JoinHandle<rota_engine::Result<Summary>>,
}

impl Running {
    fn start(store: &Arc<dyn Queues>, config: Config, handler: Arc<dyn Handler>) -> Self {
        let shutdown = Shutdown::new();
        let consumer = Consumer::new(store.clone(), config);
        let run = tokio::spawn(consumer.run(handler, shutdown.clone()));
        Running { shutdown, run }
    }

    async fn stop(self) -> Summary {
        self.shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(10), self.run).await.expect("consumer stops in time").unwrap().expect("consumer ran")
    }
}

/// Waits until `done` holds, failing the test after `limit`.
async fn eventually(limit: Duration, what: &str, mut done: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn queue_stats(store: &dyn Queues) -> QueueStats {
    store.stats().await.unwrap().into_iter().find(|stats| stats.queue == queue()).expect("the queue exists")
}

async fn every_message_is_handled_once_and_completed_within_max_concurrent(backend: Backend) {
    let Some((store, _dir)) = open_store(backend).await else { return };
    send_jobs(&*store, (0..600).map(|i| Job { i, action: Action::Work })).await;
    let recorder = Recorder::new(Duration::from_millis(1));
    let consumer = Running::start(&store, config("c1", |b| b.max_concurrent(8).complete_batch_max(50)), recorder.clone());

    eventually(Duration::from_secs(30), "600 jobs handled", async || recorder.distinct() == 600).await;
    let summary = consumer.stop().await;

    assert_eq!(recorder.total(), 600, "jobs ran twice: {:?} {summary:?}", recorder.duplicates());
    assert_eq!(summary.handled, 600);
    assert_eq!(summary.completed, 600, "{summary:?}");
    assert!(summary.complete_batches < 600, "completions are batched: {summary:?}");
    let running_max = recorder.running_max.load(Ordering::SeqCst);
    assert!(running_max <= 8, "max_concurrent exceeded: {running_max} handlers at once");
    assert!(running_max >= 2, "handlers should overlap: high-water {running_max}");
    let stats = queue_stats(&*store).await;
    assert_eq!((stats.ready, stats.leased, stats.delayed, stats.dead_lettered), (0, 0, 0, 0), "{stats:?}");
}

async fn slow_handlers_fill_exactly_max_concurrent_slots(backend: Backend) {
    let Some((store, _dir)) = open_store(backend).await else { return };
    send_jobs(&*store, (0..40).map(|i| Job { i, action: Action::Work })).await;
    let recorder = Recorder::new(Duration::from_millis(30));
    let consumer = Running::start(&store, config("c1", |b| b.max_concurrent(3).prefetch(5)), recorder.clone());

    eventually(Duration::from_secs(30), "40 jobs handled", async || recorder.distinct() == 40).await;
    let summary = consumer.stop().await;

    assert_eq!(recorder.running_max.load(Ordering::SeqCst), 3);
    assert_eq!(summary.completed, 40, "{summary:?}");
    assert_eq!(recorder.total(), 40);
}

async fn abandon_and_dead_letter_outcomes_reach_the_store(backend: Backend) {
    let Some((store, _dir)) = open_store(backend).await else { return };
    store.create_queue(&queue(), QueueConfig { deliveries_max: 3, ..QueueConfig::default() }).await.unwrap();
    send_jobs(
        &*store,
        [
            Job { i: 0, action: Action::AbandonOnceMs(300) },
            Job { i: 1, action: Action::DeadLetter },
            Job { i: 2, action: Action::AbandonAlways },
            Job { i: 3, action: Action::Work },
        ],
    )
    .await;
    let recorder = Recorder::new(Duration::ZERO);
    let consumer = Running::start(&store, config("c1", |b| b.max_concurrent(4)), recorder.clone());

    eventually(Duration::from_secs(10), "the abandoned job's second delivery", async || recorder.deliveries_of(0).len() == 2).await;
    eventually(Duration::from_secs(10), "job 2's three deliveries", async || recorder.deliveries_of(2).len() == 3).await;
    // Give the completer a moment to commit the last outcomes, then check
    // that nothing more arrives.
    eventually(Duration::from_secs(10), "two dead letters", async || {
        store.dead_letters(&queue(), 10).await.is_ok_and(|letters| letters.len() == 2)
    })
    .await;
    let summary = consumer.stop().await;

    let first = recorder.deliveries_of(0);
    assert_eq!(first.iter().map(|(_, count)| *count).collect::<Vec<_>>(), [1, 2], "delivery counts of the abandoned job");
    let waited = first[1].0 - first[0].0;
    assert!(waited >= Duration::from_millis(250), "the abandon delay was honoured: redelivered after {waited:?}");
    assert_eq!(recorder.deliveries_of(1).len(), 1, "a dead-lettered job is not delivered again");
    assert_eq!(recorder.deliveries_of(3).len(), 1);

    let letters = store.dead_letters(&queue(), 10).await.unwrap();
    let reasons: HashMap<u64, String> =
        letters.iter().map(|letter| (serde_json::from_str::<Job>(letter.body.get()).unwrap().i, letter.reason.clone())).collect();
    assert_eq!(reasons.get(&1).map(String::as_str), Some("poison message 1"), "{letters:?}");
    assert!(reasons.get(&2).is_some_and(|reason| reason.contains("downstream is down")), "{letters:?}");
    assert_eq!(summary.dead_lettered, 1, "{summary:?}");
    assert!(summary.abandoned >= 3, "{summary:?}");
    assert_eq!(summary.completed, 2, "{summary:?}");
    let stats = queue_stats(&*store).await;
    assert_eq!((stats.ready, stats.leased, stats.delayed, stats.dead_lettered), (0, 0, 0, 2), "{stats:?}");
}

async fn a_handler_slower_than_the_lease_keeps_its_message(backend: Backend) {
    let Some((store, _dir)) = open_store(backend).await else { return };
    send_jobs(&*store, [Job { i: 0, action: Action::SleepMs(1_000) }]).await;
    let recorder = Recorder::new(Duration::ZERO);
    // Two competing consumers with a 300 ms lease: if renewal failed, the
    // message would become visible again and one of them would receive it.
    let lease = Duration::from_millis(300);
    let first = Running::start(&store, config("c1", |b| b.max_concurrent(2).lease(lease)), recorder.clone());
    let second = Running::start(&store, config("c2", |b| b.max_concurrent(2).lease(lease)), recorder.clone());

    eventually(Duration::from_secs(10), "the job's first delivery", async || recorder.distinct() == 1).await;
    // The handler runs 1 s (more than 3 leases); wait a little past it.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let summaries = [first.stop().await, second.stop().await];

    assert_eq!(recorder.deliveries_of(0).len(), 1, "delivered a second time: {summaries:?}");
    let renewals: u64 = summaries.iter().map(|summary| summary.renewals).sum();
    assert!(renewals >= 3, "the lease was renewed about every 200 ms: {summaries:?}");
    assert_eq!(summaries.iter().map(|summary| summary.completed).sum::<u64>(), 1, "{summaries:?}");
    assert_eq!(summaries.iter().map(|summary| summary.leases_lost).sum::<u64>(), 0, "{summaries:?}");
    let stats = queue_stats(&*store).await;
    assert_eq!((stats.ready, stats.leased), (0, 0), "{stats:?}");
}

async fn shutdown_gives_back_prefetched_messages_and_leaves_nothing_leased(backend: Backend) {
    let Some((store, _dir)) = open_store(backend).await else { return };
    send_jobs(&*store, (0..200).map(|i| Job { i, action: Action::Work })).await;
    let recorder = Recorder::new(Duration::from_millis(40));
    let consumer = Running::start(&store, config("c1", |b| b.max_concurrent(4).prefetch(12)), recorder.clone());

    eventually(Duration::from_secs(10), "a few jobs handled", async || recorder.distinct() >= 8).await;
    let summary = consumer.stop().await;

    assert!(summary.released > 0, "prefetched messages were given back: {summary:?}");
    assert_eq!(summary.completed, summary.handled, "running handlers finished and completed: {summary:?}");
    let stats = queue_stats(&*store).await;
    assert_eq!(stats.leased, 0, "{stats:?}");
    assert_eq!(stats.ready + summary.completed, 200, "every job is completed or ready again: {stats:?} {summary:?}");
}

async fn shutdown_cancels_handlers_past_the_grace_and_gives_their_messages_back(backend: Backend) {
    let Some((store, _dir)) = open_store(backend).await else { return };
    send_jobs(&*store, (0..3).map(|i| Job { i, action: Action::SleepMs(30_000) })).await;
    let recorder = Recorder::new(Duration::ZERO);
    let consumer =
        Running::start(&store, config("c1", |b| b.max_concurrent(3).shutdown_grace(Duration::from_millis(200))), recorder.clone());

    eventually(Duration::from_secs(10), "three handlers running", async || recorder.distinct() == 3).await;
    let started = Instant::now();
    let summary = consumer.stop().await;

    assert!(started.elapsed() < Duration::from_secs(2), "stopped after the grace, not after the handlers");
    assert_eq!(summary.completed, 0, "{summary:?}");
    assert_eq!(summary.abandoned, 3, "{summary:?}");
    let stats = queue_stats(&*store).await;
    assert_eq!((stats.ready, stats.leased), (3, 0), "{stats:?}");
}

async fn a_panicking_handler_gives_its_message_back_until_it_is_dead_lettered(backend: Backend) {
    let Some((store, _dir)) = open_store(backend).await else { return };
    store.create_queue(&queue(), QueueConfig { deliveries_max: 2, ..QueueConfig::default() }).await.unwrap();
    send_jobs(&*store, [Job { i: 0, action: Action::Panic }, Job { i: 1, action: Action::Work }]).await;
    let recorder = Recorder::new(Duration::ZERO);
    let consumer = Running::start(&store, config("c1", |b| b.max_concurrent(2)), recorder.clone());

    eventually(Duration::from_secs(10), "two deliveries of the panicking job", async || recorder.deliveries_of(0).len() == 2).await;
    eventually(Duration::from_secs(10), "the dead letter", async || {
        store.dead_letters(&queue(), 10).await.is_ok_and(|letters| letters.len() == 1)
    })
    .await;
    let summary = consumer.stop().await;

    assert_eq!(summary.panics, 2, "{summary:?}");
    assert_eq!(summary.completed, 1, "{summary:?}");
    let letters = store.dead_letters(&queue(), 10).await.unwrap();
    assert!(letters[0].reason.contains("panicked"), "{letters:?}");
}

async fn one_slow_handler_does_not_hold_up_the_fast_ones(backend: Backend) {
    // Fast handlers make a due receive wait for the running ones to end;
    // that wait is bounded, so a slow handler among them must not stall it.
    // The slow one waits on a latch the test holds until every fast one has
    // returned: with an unbounded wait they never would (the limit below
    // only keeps such a failure from hanging).
    let Some((store, _dir)) = open_store(backend).await else { return };
    send_jobs(&*store, [Job { i: 0, action: Action::Latched }]).await;
    send_jobs(&*store, (1..=400).map(|i| Job { i, action: Action::Work })).await;
    let recorder = Recorder::new(Duration::ZERO);
    let consumer = Running::start(&store, config("c1", |b| b.max_concurrent(4)), recorder.clone());

    eventually(Duration::from_secs(60), "the fast jobs handled while the slow one waits", async || {
        recorder.returned.load(Ordering::SeqCst) == 400
    })
    .await;
    assert_eq!(recorder.deliveries_of(0).len(), 1, "the slow job was running all along");
    assert_eq!(recorder.running.load(Ordering::SeqCst), 1, "only the slow job still runs");
    recorder.latch.open();
    eventually(Duration::from_secs(60), "the slow job handled", async || recorder.returned.load(Ordering::SeqCst) == 401).await;
    let summary = consumer.stop().await;
    assert_eq!(summary.completed, 401, "{summary:?}");
}

on_each_backend!(
    every_message_is_handled_once_and_completed_within_max_concurrent,
    slow_handlers_fill_exactly_max_concurrent_slots,
    abandon_and_dead_letter_outcomes_reach_the_store,
    a_handler_slower_than_the_lease_keeps_its_message,
    shutdown_gives_back_prefetched_messages_and_leaves_nothing_leased,
    shutdown_cancels_handlers_past_the_grace_and_gives_their_messages_back,
    a_panicking_handler_gives_its_message_back_until_it_is_dead_lettered,
    one_slow_handler_does_not_hold_up_the_fast_ones,
);
