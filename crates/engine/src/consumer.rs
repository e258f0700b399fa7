//! [`Consumer`]: the competing-consumer runtime that agents (and `rota bench`)
//! run on a queue.
//!
//! A consumer leases messages from one queue, runs a [`Handler`] on each with
//! at most `max_concurrent` running at once (Service Bus's
//! MaxConcurrentCalls), and settles each message with the handler's
//! [`Outcome`]: complete, abandon (retry later) or dead-letter. Any number of
//! consumers, in any number of processes, may compete on one queue: the
//! store's lease decides who handles a message.
//!
//! # How it is built
//!
//! Three kinds of spawned futures, so that no store round trip ever waits
//! behind another one of a different kind:
//!
//! - **The receive loop** (the future of [`Consumer::run`]) keeps a local
//!   buffer of leased, not yet started messages. When the buffer is at or
//!   below half of `prefetch`, it asks the store for as many messages as
//!   there is room for (free slots + prefetch − buffered), long-polling up to
//!   `receive_wait`. At most one receive is outstanding, and it runs while
//!   handlers run. One exception: when handlers take less than half a
//!   receive's round trip (both are moving averages), a due receive waits
//!   for the running handlers to end, at most one round trip, so that it asks
//!   for their slots too. Receiving at once would return after those slots
//!   were free anyway, with half as many messages for the same commit; with
//!   no-op handlers this doubles the messages per receive.
//! - **One slot per running handler**, spawned per message, never more than
//!   `max_concurrent`. A slot renews its message's lease whenever a third of
//!   the lease is left and the handler is still running, so a slow handler
//!   keeps its message instead of seeing it delivered a second time.
//! - **The completer** drains the handlers' outcomes from a bounded channel
//!   and commits every queued completion with one `complete_batch` call, with
//!   up to two such calls in flight. The backends group-commit, so the busier
//!   the consumer, the bigger the batch and the fewer the fsyncs per message;
//!   the second call in flight lets the store merge a batch with a receive
//!   into one commit instead of alternating them. Abandons and
//!   dead-letterings are rare and go one by one, beside the batch.
//!
//! # Delivery guarantee: at least once
//!
//! A slot is free as soon as its handler has returned and its outcome is
//! queued for the completer; the message's lease is still held until the
//! completion commits. If the process dies in between (or the commit fails,
//! or the lease ran out), the message is delivered again once its lease
//! expires, and the handler runs a second time. Handlers must therefore be
//! idempotent; the message id is the natural idempotency key.
//!
//! # Shutdown
//!
//! When the [`Shutdown`] signal is triggered, the consumer stops receiving,
//! gives prefetched but unstarted messages back at once (an abandon without
//! delay: this spends one of their deliveries), lets running handlers finish
//! within `shutdown_grace` (then cancels them and gives their messages back),
//! waits for the completer to commit every queued outcome, and returns a
//! [`Summary`]. When it returns, it holds no lease, unless the store failed
//! while settling (then the lease simply expires).
//!
//! Deliberately left out: what a handler does (the agent crate's business),
//! retry policies across deliveries (the abandon delay is the handler's
//! choice), and ordering keys beyond what the store enforces.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rota_model::{InstanceId, LeaseToken, QueueName, Timestamp};
use rota_store::{Delivery, QueueConfig, Queues, RECEIVE_MAX, Receive};
use tokio::sync::mpsc;
use tokio::task::{JoinError, JoinHandle, JoinSet};
use tokio::time::{Instant, sleep_until};
use tracing::{debug, error, info, warn};

use crate::{Error, Result, Shutdown};

/// What a handler decided about a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Handled: delete the message.
    Complete,
    /// Not handled now: make it visible again after `delay`. If the message
    /// has used up its deliveries, the store dead-letters it with `reason`.
    Abandon {
        /// How long the message stays invisible.
        delay: Duration,
        /// Why, kept as the message's last error.
        reason: String,
    },
    /// It can never be handled (a poison message): move it to the
    /// dead-letter queue at once, keeping `reason`.
    DeadLetter {
        /// Why, shown to operators in the dead-letter queue.
        reason: String,
    },
    /// The handler settled the message itself, in the same transaction as
    /// its own writes (`Tasks::commit` with the message in `complete`), so
    /// that its effect and the message's consumption are atomic. Nothing is
    /// left to do.
    Settled,
}

/// The code that handles one message.
///
/// It may run more than once for one message (see the module doc: delivery
/// is at least once), and up to `max_concurrent` calls run at once.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles one delivery and says how to settle it. A panic counts as
    /// `Abandon` without delay.
    async fn handle(&self, delivery: &Delivery) -> Outcome;
}

/// A consumer's settings, validated when built: see [`Config::builder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    queue: QueueName,
    consumer: InstanceId,
    max_concurrent: usize,
    prefetch: usize,
    lease: Option<Duration>,
    receive_wait: Duration,
    complete_batch_max: usize,
    shutdown_grace: Duration,
    acts_within_store: bool,
}

impl Config {
    /// Default handler slots (MaxConcurrentCalls).
    pub const MAX_CONCURRENT_DEFAULT: usize = 16;
    /// The most handler slots one consumer may have.
    pub const MAX_CONCURRENT_LIMIT: usize = 10_000;
    /// The most messages one consumer may lease ahead of its slots.
    pub const PREFETCH_LIMIT: usize = 10_000;
    /// The shortest lease a consumer accepts: renewing at a third of the
    /// lease must leave time for a store round trip.
    pub const LEASE_MIN: Duration = Duration::from_millis(50);
    /// Default long-poll wait of a receive.
    pub const RECEIVE_WAIT_DEFAULT: Duration = Duration::from_secs(5);
    /// The longest long-poll wait.
    pub const RECEIVE_WAIT_MAX: Duration = Duration::from_secs(300);
    /// Default bound on the completions committed by one `complete_batch`.
    pub const COMPLETE_BATCH_MAX_DEFAULT: usize = 1_000;
    /// The largest `complete_batch_max`.
    pub const COMPLETE_BATCH_MAX_LIMIT: usize = 10_000;
    /// Default time running handlers get to finish at shutdown.
    pub const SHUTDOWN_GRACE_DEFAULT: Duration = Duration::from_secs(10);
    /// The longest shutdown grace.
    pub const SHUTDOWN_GRACE_MAX: Duration = Duration::from_secs(3_600);

    /// Starts a configuration for a consumer named `consumer` (recorded as
    /// the lease owner) on `queue`, with the defaults.
    pub fn builder(queue: QueueName, consumer: InstanceId) -> ConfigBuilder {
        ConfigBuilder {
            config: Config {
                queue,
                consumer,
                max_concurrent: Self::MAX_CONCURRENT_DEFAULT,
                prefetch: 0,
                lease: None,
                receive_wait: Self::RECEIVE_WAIT_DEFAULT,
                complete_batch_max: Self::COMPLETE_BATCH_MAX_DEFAULT,
                shutdown_grace: Self::SHUTDOWN_GRACE_DEFAULT,
                acts_within_store: false,
            },
            prefetch: None,
        }
    }

    /// The queue consumed.
    pub fn queue(&self) -> &QueueName {
        &self.queue
    }

    /// The consumer's id, recorded as the owner of its leases.
    pub fn consumer(&self) -> &InstanceId {
        &self.consumer
    }

    /// How many handlers run at once at most.
    pub fn max_concurrent(&self) -> usize {
        self.max_concurrent
    }

    /// How many messages are leased ahead of free slots.
    pub fn prefetch(&self) -> usize {
        self.prefetch
    }

    /// The lease asked for; `None` takes the queue's setting at start.
    pub fn lease(&self) -> Option<Duration> {
        self.lease
    }

    /// How long a receive waits for a first message.
    pub fn receive_wait(&self) -> Duration {
        self.receive_wait
    }

    /// Whether the handler acts only by writing to the consumer's store
    /// (see [`ConfigBuilder::acting_within_store`]).
    pub fn acts_within_store(&self) -> bool {
        self.acts_within_store
    }

    /// The most completions committed by one `complete_batch`.
    pub fn complete_batch_max(&self) -> usize {
        self.complete_batch_max
    }

    /// How long running handlers get to finish at shutdown.
    pub fn shutdown_grace(&self) -> Duration {
        self.shutdown_grace
    }

    fn validate(&self) -> Result<()> {
        let bad = |message: String| Err(Error::Config(message));
        if !(1..=Self::MAX_CONCURRENT_LIMIT).contains(&self.max_concurrent) {
            return bad(format!("max_concurrent must be between 1 and {}, got {}", Self::MAX_CONCURRENT_LIMIT, self.max_concurrent));
        }
        if self.prefetch > Self::PREFETCH_LIMIT {
            return bad(format!("prefetch must be at most {}, got {}", Self::PREFETCH_LIMIT, self.prefetch));
        }
        if let Some(lease) = self.lease
            && !(Self::LEASE_MIN..=QueueConfig::LEASE_MAX).contains(&lease)
        {
            return bad(format!("lease must be between {:?} and {:?}, got {lease:?}", Self::LEASE_MIN, QueueConfig::LEASE_MAX));
        }
        if self.receive_wait.is_zero() || self.receive_wait > Self::RECEIVE_WAIT_MAX {
            return bad(format!("receive_wait must be above zero and at most {:?}, got {:?}", Self::RECEIVE_WAIT_MAX, self.receive_wait));
        }
        if !(1..=Self::COMPLETE_BATCH_MAX_LIMIT).contains(&self.complete_batch_max) {
            return bad(format!(
                "complete_batch_max must be between 1 and {}, got {}",
                Self::COMPLETE_BATCH_MAX_LIMIT,
                self.complete_batch_max
            ));
        }
        if self.shutdown_grace > Self::SHUTDOWN_GRACE_MAX {
            return bad(format!("shutdown_grace must be at most {:?}, got {:?}", Self::SHUTDOWN_GRACE_MAX, self.shutdown_grace));
        }
        Ok(())
    }
}

/// Builds a [`Config`]; [`ConfigBuilder::build`] checks every bound.
///
/// ```
/// use std::time::Duration;
/// use rota_engine::consumer::Config;
/// use rota_model::{InstanceId, QueueName};
///
/// let config = Config::builder(QueueName::new("payments").unwrap(), InstanceId::new("agent-1").unwrap())
///     .max_concurrent(8)
///     .lease(Duration::from_secs(60))
///     .build()
///     .unwrap();
/// assert_eq!(config.prefetch(), 8, "prefetch defaults to max_concurrent");
///
/// let err = Config::builder(QueueName::new("payments").unwrap(), InstanceId::new("agent-1").unwrap())
///     .max_concurrent(0)
///     .build()
///     .unwrap_err();
/// assert!(err.to_string().contains("max_concurrent"), "{err}");
/// ```
#[derive(Debug, Clone)]
pub struct ConfigBuilder {
    config: Config,
    prefetch: Option<usize>,
}

impl ConfigBuilder {
    /// Handler slots (default [`Config::MAX_CONCURRENT_DEFAULT`]).
    pub fn max_concurrent(mut self, slots: usize) -> Self {
        self.config.max_concurrent = slots;
        self
    }

    /// Messages leased ahead of free slots (default: `max_concurrent`).
    /// More prefetch means fewer, larger receives; prefetched messages wait
    /// with their lease running, and are given back at shutdown.
    pub fn prefetch(mut self, messages: usize) -> Self {
        self.prefetch = Some(messages);
        self
    }

    /// The lease length (default: the queue's, read once at start).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = Some(lease);
        self
    }

    /// The long-poll wait of a receive (default [`Config::RECEIVE_WAIT_DEFAULT`]).
    pub fn receive_wait(mut self, wait: Duration) -> Self {
        self.config.receive_wait = wait;
        self
    }

    /// The most completions per `complete_batch` (default [`Config::COMPLETE_BATCH_MAX_DEFAULT`]).
    pub fn complete_batch_max(mut self, max: usize) -> Self {
        self.config.complete_batch_max = max;
        self
    }

    /// The handler acts on a message only by writing to the consumer's
    /// store (a Scheduler's inbox): a store that flushes after committing
    /// may then deliver before the message's commit is durable (see
    /// [`rota_store::Receive::acts_within_store`]). Off by default: a
    /// handler that calls out must get only durable messages.
    pub fn acting_within_store(mut self) -> Self {
        self.config.acts_within_store = true;
        self
    }

    /// How long running handlers get to finish at shutdown (default [`Config::SHUTDOWN_GRACE_DEFAULT`]).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.config.shutdown_grace = grace;
        self
    }

    /// Checks every bound; the error names the offending field.
    pub fn build(self) -> Result<Config> {
        let mut config = self.config;
        config.prefetch = self.prefetch.unwrap_or(config.max_concurrent);
        config.validate()?;
        Ok(config)
    }
}

/// What a consumer did, returned by [`Consumer::run`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Receive calls that returned (with or without messages).
    pub receives: u64,
    /// Messages leased.
    pub received: u64,
    /// Handler calls.
    pub handled: u64,
    /// Completions committed.
    pub completed: u64,
    /// `complete_batch` calls that committed.
    pub complete_batches: u64,
    /// Abandons committed, the shutdown's give-backs included.
    pub abandoned: u64,
    /// Dead-letterings committed.
    pub dead_lettered: u64,
    /// Prefetched or cancelled messages given back at shutdown (also in `abandoned`).
    pub released: u64,
    /// Lease renewals committed.
    pub renewals: u64,
    /// Leases found lost (expired or taken over) when renewing, settling or dispatching.
    pub leases_lost: u64,
    /// Handler calls that panicked.
    pub panics: u64,
    /// Store calls that failed (each retry counts).
    pub store_errors: u64,
}

/// The competing-consumer runtime for one queue. See the module doc.
pub struct Consumer {
    store: Arc<dyn Queues>,
    config: Config,
}

impl Consumer {
    /// A consumer of `config.queue()` on `store`. Nothing runs until [`Consumer::run`].
    pub fn new(store: Arc<dyn Queues>, config: Config) -> Self {
        Consumer { store, config }
    }

    /// Runs `handler` on the queue's messages until `shutdown` is triggered,
    /// then stops as the module doc describes and says what it did.
    ///
    /// Fails only when the store cannot tell the queue's lease at start, or
    /// when the store is closed under it; other store errors are logged and
    /// retried after a bounded backoff.
    pub async fn run(self, handler: Arc<dyn Handler>, shutdown: Shutdown) -> Result<Summary> {
        let Consumer { store, config } = self;
        // Every receive and renewal asks for this exact length, so the
        // renewal timers below match the store's expiry.
        let lease = match config.lease {
            Some(lease) => lease,
            None => store.queue_config(&config.queue).await?.map_or(QueueConfig::default().lease, |queue| queue.lease),
        };
        if lease < Config::LEASE_MIN {
            return Err(Error::Config(format!("the queue's lease {lease:?} is below the consumer's minimum {:?}", Config::LEASE_MIN)));
        }
        info!(queue = %config.queue, consumer = %config.consumer, max_concurrent = config.max_concurrent, prefetch = config.prefetch, ?lease, "consumer started");

        let counters = Arc::new(Counters::default());
        let (settle_tx, settle_rx) = mpsc::channel(settle_capacity(&config));
        let completer =
            tokio::spawn(complete_loop(store.clone(), config.queue.clone(), settle_rx, config.complete_batch_max, counters.clone()));
        let slot = Arc::new(SlotContext {
            store: store.clone(),
            queue: config.queue.clone(),
            lease,
            handler,
            settle: settle_tx,
            counters: counters.clone(),
            pace: HandlerPace::default(),
        });

        let mut dispatcher = Dispatcher {
            store,
            config,
            lease,
            slot,
            buffer: VecDeque::new(),
            tasks: JoinSet::new(),
            receiving: None,
            retry_at: None,
            hold_receive_until: None,
            pace: ReceivePace::default(),
            receive_max_asked: 0,
            backoff: Backoff::new(BACKOFF_MIN, BACKOFF_MAX),
            counters: counters.clone(),
        };
        let ran = dispatcher.run(&shutdown).await;
        dispatcher.stop().await;
        // The dispatcher holds the last sender: once it is gone, the completer
        // commits what is queued and ends.
        drop(dispatcher);
        if let Err(err) = completer.await {
            error!("consumer's completer failed: {err}");
        }
        let summary = counters.summary();
        info!(?summary, "consumer stopped");
        ran.map(|()| summary)
    }
}

/// The first wait after a failed store call.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
/// The longest wait after failed store calls in a row.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How often a settlement is tried before its lease is left to expire.
const SETTLE_ATTEMPTS: u32 = 5;
/// Abandons and dead-letterings in flight at once in the completer.
const SETTLE_ONE_IN_FLIGHT_MAX: usize = 64;
/// `complete_batch` calls in flight at once in the completer. More than one
/// keeps completions flowing while a commit is under way, and lets the
/// store's group commit merge them with other operations.
const COMPLETE_BATCHES_IN_FLIGHT_MAX: usize = 2;

/// The settlement channel holds a few full batches, so handlers rarely wait
/// for the completer, while the number of handled-but-uncommitted messages
/// (whose leases are held) stays bounded.
fn settle_capacity(config: &Config) -> usize {
    (2 * config.complete_batch_max).max(config.max_concurrent + config.prefetch)
}

/// A leased message and when its lease started at the latest.
struct Leased {
    delivery: Delivery,
    /// Taken just before the receive was sent: the store started the lease
    /// after this, so timers counted from here err on the early side.
    asked_at: Instant,
}

/// What the completer must do for one message.
#[derive(Debug)]
enum Settlement {
    Complete(LeaseToken),
    Abandon {
        token: LeaseToken,
        delay: Duration,
        reason: String,
    },
    DeadLetter {
        token: LeaseToken,
        reason: String,
    },
    /// Give back without handling (shutdown, panic, cancellation).
    Release {
        token: LeaseToken,
        reason: String,
    },
}

type Received = (Instant, rota_store::Result<Vec<Delivery>>);

/// The receive loop's state.
struct Dispatcher {
    store: Arc<dyn Queues>,
    config: Config,
    lease: Duration,
    slot: Arc<SlotContext>,
    /// Leased messages not started yet, oldest first.
    buffer: VecDeque<Leased>,
    /// Running slots; its length is the number of busy slots.
    tasks: JoinSet<()>,
    receiving: Option<JoinHandle<Received>>,
    /// Set after a failed receive: no receive before then.
    retry_at: Option<Instant>,
    /// Set while a due receive waits for fast handlers to end (see
    /// `handlers_end_first`): no receive before then unless every slot is free.
    hold_receive_until: Option<Instant>,
    /// Round trips of receives that found enough messages.
    pace: ReceivePace,
    /// How many messages the outstanding (or last) receive asked for.
    receive_max_asked: usize,
    backoff: Backoff,
    counters: Arc<Counters>,
}

impl Dispatcher {
    async fn run(&mut self, shutdown: &Shutdown) -> Result<()> {
        let stop = shutdown.triggered();
        tokio::pin!(stop);
        loop {
            self.reap();
            self.dispatch();
            if self.receive_due() {
                let now = Instant::now();
                match self.hold_receive_until {
                    None if self.handlers_end_first() => self.hold_receive_until = Some(now + self.pace.receive_rtt()),
                    Some(until) if now < until && !self.tasks.is_empty() => {}
                    _ => {
                        self.hold_receive_until = None;
                        self.start_receive();
                    }
                }
            } else {
                self.hold_receive_until = None;
            }
            let receiving = &mut self.receiving;
            let tasks = &mut self.tasks;
            let wake_at = self.retry_at.or(self.hold_receive_until);
            tokio::select! {
                biased;
                () = &mut stop => return Ok(()),
                joined = async { receiving.as_mut().expect("guarded by the branch condition").await }, if receiving.is_some() => {
                    self.receiving = None;
                    self.on_received(joined)?;
                }
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => self.on_slot_end(joined),
                () = sleep_until(wake_at.unwrap_or_else(Instant::now)), if wake_at.is_some() => {
                    if self.retry_at.is_some_and(|at| at <= Instant::now()) {
                        self.retry_at = None;
                    }
                }
            }
        }
    }

    /// Whether the running handlers are expected to end before a receive
    /// started now could return. Then the receive waits for them (bounded by
    /// one round trip), so that it can ask for their slots too: with fast
    /// handlers, receiving at once would return while those slots are free
    /// and get only half as many messages, for the same commit. With slow
    /// handlers, receiving at once keeps the buffer ahead of the slots.
    fn handlers_end_first(&self) -> bool {
        !self.tasks.is_empty() && self.slot.pace.handler_time() * 2 < self.pace.receive_rtt()
    }

    /// Starts buffered messages while slots are free.
    fn dispatch(&mut self) {
        while self.tasks.len() < self.config.max_concurrent {
            let Some(leased) = self.buffer.pop_front() else { break };
            if leased.asked_at + self.lease <= Instant::now() {
                // It waited in the buffer until its lease ran out: another
                // consumer may hold it now, so running it would only add a
                // duplicate.
                self.counters.leases_lost.fetch_add(1, Ordering::Relaxed);
                debug!(message = %leased.delivery.id, "prefetched message's lease expired before a slot was free");
                continue;
            }
            self.tasks.spawn(run_slot(self.slot.clone(), leased));
        }
    }

    /// Collects the slots that have ended.
    fn reap(&mut self) {
        while let Some(joined) = self.tasks.try_join_next() {
            self.on_slot_end(joined);
        }
    }

    /// Whether a receive may start: none is outstanding, no backoff is
    /// running, and the buffer is at or below its low-water mark (half the
    /// prefetch).
    fn receive_due(&self) -> bool {
        self.receiving.is_none() && self.retry_at.is_none() && self.buffer.len() <= self.config.prefetch / 2
    }

    /// Starts a receive for as many messages as there is room for.
    fn start_receive(&mut self) {
        let held = self.tasks.len() + self.buffer.len();
        let room = (self.config.max_concurrent + self.config.prefetch).saturating_sub(held);
        if room == 0 {
            return;
        }
        self.receive_max_asked = room.min(RECEIVE_MAX as usize);
        let request = Receive {
            max: u32::try_from(self.receive_max_asked).unwrap_or(RECEIVE_MAX),
            lease: Some(self.lease),
            wait: self.config.receive_wait,
            consumer: Some(self.config.consumer.clone()),
            acts_within_store: self.config.acts_within_store,
        };
        let store = self.store.clone();
        let queue = self.config.queue.clone();
        self.receiving = Some(tokio::spawn(async move {
            let asked_at = Instant::now();
            (asked_at, store.receive(&queue, request).await)
        }));
    }

    fn on_received(&mut self, joined: std::result::Result<Received, JoinError>) -> Result<()> {
        match joined {
            Ok((asked_at, Ok(deliveries))) => {
                self.backoff.reset();
                if deliveries.len() == self.receive_max_asked {
                    // A full batch did not wait for messages: its round trip
                    // is the store's latency alone.
                    self.pace.record(asked_at.elapsed());
                }
                self.counters.receives.fetch_add(1, Ordering::Relaxed);
                self.counters.received.fetch_add(deliveries.len() as u64, Ordering::Relaxed);
                self.buffer.extend(deliveries.into_iter().map(|delivery| Leased { delivery, asked_at }));
            }
            Ok((_, Err(rota_store::Error::Closed))) => return Err(Error::Store(rota_store::Error::Closed)),
            Ok((_, Err(err))) => {
                self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
                let wait = self.backoff.next();
                warn!(queue = %self.config.queue, "receive failed, retrying in {wait:?}: {err}");
                self.retry_at = Some(Instant::now() + wait);
            }
            Err(err) => {
                self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
                let wait = self.backoff.next();
                error!(queue = %self.config.queue, "receive panicked, retrying in {wait:?}: {err}");
                self.retry_at = Some(Instant::now() + wait);
            }
        }
        Ok(())
    }

    fn on_slot_end(&self, joined: std::result::Result<(), JoinError>) {
        if let Err(err) = joined
            && err.is_panic()
        {
            self.counters.panics.fetch_add(1, Ordering::Relaxed);
            error!(queue = %self.config.queue, "a handler panicked; its message is given back: {err}");
        }
    }

    /// Stops as the module doc says: give back the buffer, let handlers
    /// finish within the grace, give back what an outstanding receive leased.
    async fn stop(&mut self) {
        let deadline = Instant::now() + self.config.shutdown_grace;
        let buffered: Vec<Leased> = self.buffer.drain(..).collect();
        for leased in buffered {
            self.release(leased.delivery.lease_token, "the consumer stopped before handling it").await;
        }
        loop {
            tokio::select! {
                joined = self.tasks.join_next() => match joined {
                    Some(joined) => self.on_slot_end(joined),
                    None => break,
                },
                () = sleep_until(deadline) => {
                    warn!(queue = %self.config.queue, running = self.tasks.len(), "handlers still running after the shutdown grace: cancelling them");
                    // A cancelled slot gives its message back (its guard does).
                    self.tasks.abort_all();
                    while self.tasks.join_next().await.is_some() {}
                    break;
                }
            }
        }
        if let Some(receiving) = self.receiving.take() {
            // Cancelling a receive is safe: a store gives back the leases it
            // granted to a receiver that went away (the `Queues::receive`
            // contract). A receive that had already returned still yields its
            // messages here, and they are given back like the buffer.
            receiving.abort();
            if let Ok((_, Ok(deliveries))) = receiving.await {
                self.counters.receives.fetch_add(1, Ordering::Relaxed);
                self.counters.received.fetch_add(deliveries.len() as u64, Ordering::Relaxed);
                for delivery in deliveries {
                    self.release(delivery.lease_token, "the consumer stopped before handling it").await;
                }
            }
        }
    }

    async fn release(&self, token: LeaseToken, reason: &str) {
        self.counters.released.fetch_add(1, Ordering::Relaxed);
        // The completer lives until every sender is gone, and `self.slot` holds one.
        let _ = self.slot.settle.send(Settlement::Release { token, reason: reason.to_owned() }).await;
    }
}

/// What every slot shares.
struct SlotContext {
    store: Arc<dyn Queues>,
    queue: QueueName,
    lease: Duration,
    handler: Arc<dyn Handler>,
    settle: mpsc::Sender<Settlement>,
    counters: Arc<Counters>,
    /// How long handlers take, for the receive loop's pacing.
    pace: HandlerPace,
}

/// One handler call: run it, renew the lease while it runs, queue its outcome.
async fn run_slot(ctx: Arc<SlotContext>, leased: Leased) {
    let token = leased.delivery.lease_token;
    // If the handler panics or the slot is cancelled, the guard gives the
    // message back instead of leaving its lease to expire.
    let mut guard = SettleGuard { settle: &ctx.settle, pending: None, token, armed: true };
    ctx.counters.handled.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let outcome = handle_renewing(&ctx, &leased).await;
    ctx.pace.record(started.elapsed());
    guard.pending = match outcome {
        Outcome::Complete => Some(Settlement::Complete(token)),
        Outcome::Abandon { delay, reason } => Some(Settlement::Abandon { token, delay, reason }),
        Outcome::DeadLetter { reason } => Some(Settlement::DeadLetter { token, reason }),
        Outcome::Settled => None,
    };
    if guard.pending.is_none() {
        ctx.counters.completed.fetch_add(1, Ordering::Relaxed);
        guard.armed = false;
        return;
    }
    // Reserving first keeps the settlement in the guard until it can be sent
    // without waiting, so cancelling this slot here cannot lose it. While the
    // channel is full the slot stays busy: that is the back-pressure that
    // keeps the receive loop from leasing more than the completer commits.
    if let Ok(permit) = ctx.settle.reserve().await
        && let Some(settlement) = guard.pending.take()
    {
        permit.send(settlement);
    }
    guard.armed = false;
}

/// Runs the handler, renewing the lease each time a third of it is left.
async fn handle_renewing(ctx: &SlotContext, leased: &Leased) -> Outcome {
    let token = leased.delivery.lease_token;
    let renew_after = ctx.lease - ctx.lease / 3;
    let retry_after = (ctx.lease / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut renew_at = leased.asked_at + renew_after;
    let mut renewing: Option<(Instant, RenewFuture<'_>)> = None;
    let mut lost = false;
    let handling = ctx.handler.handle(&leased.delivery);
    tokio::pin!(handling);
    loop {
        tokio::select! {
            biased;
            outcome = &mut handling => return outcome,
            renewed = async { renewing.as_mut().expect("guarded by the branch condition").1.as_mut().await }, if renewing.is_some() => {
                let (asked_at, _) = renewing.take().expect("polled above");
                match renewed {
                    Ok(_) => {
                        ctx.counters.renewals.fetch_add(1, Ordering::Relaxed);
                        renew_at = asked_at + renew_after;
                    }
                    Err(err) if err.is_lost_race() => {
                        ctx.counters.leases_lost.fetch_add(1, Ordering::Relaxed);
                        warn!(queue = %ctx.queue, message = %leased.delivery.id, "lease lost while the handler ran; the message may be handled elsewhere too: {err}");
                        lost = true;
                    }
                    Err(err) => {
                        ctx.counters.store_errors.fetch_add(1, Ordering::Relaxed);
                        warn!(queue = %ctx.queue, message = %leased.delivery.id, "lease renewal failed, retrying in {retry_after:?}: {err}");
                        renew_at = Instant::now() + retry_after;
                    }
                }
            }
            () = sleep_until(renew_at), if renewing.is_none() && !lost => {
                renewing = Some((Instant::now(), ctx.store.renew(&ctx.queue, token, Some(ctx.lease))));
            }
        }
    }
}

type RenewFuture<'a> = std::pin::Pin<Box<dyn Future<Output = rota_store::Result<Timestamp>> + Send + 'a>>;

/// Gives a message back if its slot ends without queueing an outcome.
struct SettleGuard<'a> {
    settle: &'a mpsc::Sender<Settlement>,
    /// The outcome to queue; `None` before the handler returned.
    pending: Option<Settlement>,
    token: LeaseToken,
    /// Cleared once the outcome is queued (or the completer is gone).
    armed: bool,
}

impl Drop for SettleGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let settlement = match self.pending.take() {
            Some(settlement) => settlement,
            None if std::thread::panicking() => Settlement::Release { token: self.token, reason: "the handler panicked".into() },
            None => Settlement::Release { token: self.token, reason: "the handler was cancelled at shutdown".into() },
        };
        if let Err(mpsc::error::TrySendError::Full(settlement)) = self.settle.try_send(settlement)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let settle = self.settle.clone();
            runtime.spawn(async move {
                let _ = settle.send(settlement).await;
            });
        }
    }
}

/// The completer: commits queued outcomes, completions in batches.
async fn complete_loop(
    store: Arc<dyn Queues>,
    queue: QueueName,
    mut settlements: mpsc::Receiver<Settlement>,
    batch_max: usize,
    counters: Arc<Counters>,
) {
    let mut batch = Vec::with_capacity(batch_max);
    let mut batches = JoinSet::new();
    let mut one_by_one = JoinSet::new();
    loop {
        // While the batches in flight are at their bound, completions
        // accumulate in the channel and make the next batch bigger.
        while batches.len() >= COMPLETE_BATCHES_IN_FLIGHT_MAX {
            batches.join_next().await;
        }
        if settlements.recv_many(&mut batch, batch_max).await == 0 {
            break;
        }
        let mut tokens = Vec::with_capacity(batch.len());
        for settlement in batch.drain(..) {
            match settlement {
                Settlement::Complete(token) => tokens.push(token),
                other => {
                    while one_by_one.len() >= SETTLE_ONE_IN_FLIGHT_MAX {
                        one_by_one.join_next().await;
                    }
                    one_by_one.spawn(settle_one(store.clone(), queue.clone(), other, counters.clone()));
                }
            }
        }
        if !tokens.is_empty() {
            batches.spawn(complete_tokens(store.clone(), queue.clone(), tokens, counters.clone()));
        }
        while batches.try_join_next().is_some() {}
        while one_by_one.try_join_next().is_some() {}
    }
    while batches.join_next().await.is_some() {}
    while one_by_one.join_next().await.is_some() {}
}

async fn complete_tokens(store: Arc<dyn Queues>, queue: QueueName, tokens: Vec<LeaseToken>, counters: Arc<Counters>) {
    let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
    for attempt in 1..=SETTLE_ATTEMPTS {
        match store.complete_batch(&queue, &tokens).await {
            Ok(lost) => {
                counters.complete_batches.fetch_add(1, Ordering::Relaxed);
                counters.completed.fetch_add((tokens.len() - lost.len()) as u64, Ordering::Relaxed);
                if !lost.is_empty() {
                    counters.leases_lost.fetch_add(lost.len() as u64, Ordering::Relaxed);
                    warn!(%queue, lost = lost.len(), "completions whose lease had been lost; those messages are handled again");
                }
                return;
            }
            Err(err) => {
                counters.store_errors.fetch_add(1, Ordering::Relaxed);
                if !err.is_retryable() || attempt == SETTLE_ATTEMPTS {
                    error!(%queue, messages = tokens.len(), "could not complete handled messages; they are delivered again when their lease expires: {err}");
                    return;
                }
                let wait = backoff.next();
                warn!(%queue, messages = tokens.len(), "complete_batch failed, retrying in {wait:?}: {err}");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

async fn settle_one(store: Arc<dyn Queues>, queue: QueueName, settlement: Settlement, counters: Arc<Counters>) {
    let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
    for attempt in 1..=SETTLE_ATTEMPTS {
        let (done, result) = match &settlement {
            Settlement::Complete(token) => (&counters.completed, store.complete(&queue, *token).await),
            Settlement::Abandon { token, delay, reason } => {
                (&counters.abandoned, store.abandon(&queue, *token, *delay, Some(reason.clone())).await)
            }
            Settlement::Release { token, reason } => {
                (&counters.abandoned, store.abandon(&queue, *token, Duration::ZERO, Some(reason.clone())).await)
            }
            Settlement::DeadLetter { token, reason } => (&counters.dead_lettered, store.dead_letter(&queue, *token, reason.clone()).await),
        };
        match result {
            Ok(()) => {
                done.fetch_add(1, Ordering::Relaxed);
                if matches!(settlement, Settlement::DeadLetter { .. }) {
                    metrics::counter!(crate::telemetry::DEAD_LETTERS, "queue" => queue.to_string()).increment(1);
                }
                return;
            }
            Err(err) if err.is_lost_race() => {
                counters.leases_lost.fetch_add(1, Ordering::Relaxed);
                debug!(%queue, ?settlement, "settling found the lease lost: {err}");
                return;
            }
            Err(err) => {
                counters.store_errors.fetch_add(1, Ordering::Relaxed);
                if !err.is_retryable() || attempt == SETTLE_ATTEMPTS {
                    error!(%queue, ?settlement, "could not settle a message; it is delivered again when its lease expires: {err}");
                    return;
                }
                let wait = backoff.next();
                warn!(%queue, ?settlement, "settling failed, retrying in {wait:?}: {err}");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// A moving average of handler durations, shared by every slot. Updates
/// may race and lose one sample; it only steers the receive pacing.
#[derive(Default)]
struct HandlerPace {
    average_ns: AtomicU64,
}

impl HandlerPace {
    fn record(&self, took: Duration) {
        let sample = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let average = self.average_ns.load(Ordering::Relaxed);
        self.average_ns.store(ewma(average, sample), Ordering::Relaxed);
    }

    fn handler_time(&self) -> Duration {
        Duration::from_nanos(self.average_ns.load(Ordering::Relaxed))
    }
}

/// A moving average of receive round trips (only those that found a full
/// batch, so long-poll waits do not count). Until one is known, it assumes
/// no handler is fast enough to wait for.
#[derive(Default)]
struct ReceivePace {
    average_ns: u64,
}

impl ReceivePace {
    fn record(&mut self, took: Duration) {
        self.average_ns = ewma(self.average_ns, u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
    }

    fn receive_rtt(&self) -> Duration {
        Duration::from_nanos(self.average_ns)
    }
}

/// An exponentially weighted moving average with weight 1/8 for the new
/// sample; the first sample is taken as is.
fn ewma(average: u64, sample: u64) -> u64 {
    if average == 0 { sample } else { average - average / 8 + sample / 8 }
}

/// Exponential backoff without jitter: the waits are short and bounded, and
/// only this consumer's own calls retry on them.
struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(min: Duration, max: Duration) -> Self {
        Backoff { min, max, next: min }
    }

    fn next(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    fn reset(&mut self) {
        self.next = self.min;
    }
}

#[derive(Default)]
struct Counters {
    receives: AtomicU64,
    received: AtomicU64,
    handled: AtomicU64,
    completed: AtomicU64,
    complete_batches: AtomicU64,
    abandoned: AtomicU64,
    dead_lettered: AtomicU64,
    released: AtomicU64,
    renewals: AtomicU64,
    leases_lost: AtomicU64,
    panics: AtomicU64,
    store_errors: AtomicU64,
}

impl Counters {
    fn summary(&self) -> Summary {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Summary {
            receives: get(&self.receives),
            received: get(&self.received),
            handled: get(&self.handled),
            completed: get(&self.completed),
            complete_batches: get(&self.complete_batches),
            abandoned: get(&self.abandoned),
            dead_lettered: get(&self.dead_lettered),
            released: get(&self.released),
            renewals: get(&self.renewals),
            leases_lost: get(&self.leases_lost),
            panics: get(&self.panics),
            store_errors: get(&self.store_errors),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(build: impl FnOnce(ConfigBuilder) -> ConfigBuilder) -> Result<Config> {
        build(Config::builder(QueueName::new("q").unwrap(), InstanceId::new("c").unwrap())).build()
    }

    #[test]
    fn defaults_are_valid_and_prefetch_follows_slots() {
        let config = check(|b| b).unwrap();
        assert_eq!(config.max_concurrent(), Config::MAX_CONCURRENT_DEFAULT);
        assert_eq!(config.prefetch(), Config::MAX_CONCURRENT_DEFAULT);
        assert_eq!(check(|b| b.max_concurrent(3)).unwrap().prefetch(), 3);
        assert_eq!(check(|b| b.max_concurrent(3).prefetch(0)).unwrap().prefetch(), 0);
    }

    #[test]
    fn bounds_are_named_in_errors() {
        type Case = (&'static str, fn(ConfigBuilder) -> ConfigBuilder);
        let cases: [Case; 7] = [
            ("max_concurrent", |b| b.max_concurrent(0)),
            ("max_concurrent", |b| b.max_concurrent(Config::MAX_CONCURRENT_LIMIT + 1)),
            ("prefetch", |b| b.prefetch(Config::PREFETCH_LIMIT + 1)),
            ("lease", |b| b.lease(Duration::from_millis(10))),
            ("receive_wait", |b| b.receive_wait(Duration::ZERO)),
            ("complete_batch_max", |b| b.complete_batch_max(0)),
            ("shutdown_grace", |b| b.shutdown_grace(Duration::from_secs(7_200))),
        ];
        for (field, build) in cases {
            let err = check(build).unwrap_err();
            assert!(err.to_string().contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn backoff_doubles_up_to_its_bound_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(70));
        let waits: Vec<_> = (0..4).map(|_| backoff.next().as_millis()).collect();
        assert_eq!(waits, [20, 40, 70, 70]);
        backoff.reset();
        assert_eq!(backoff.next(), Duration::from_millis(20));
    }
}
