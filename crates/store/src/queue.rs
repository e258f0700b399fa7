//! Durable competing-consumer queues: peek-lock with a lease, explicit
//! complete / abandon, lease renewal, at-least-once delivery, a maximum
//! delivery count followed by a dead-letter queue that keeps the reason,
//! delayed delivery, ordering keys (FIFO per key, one lease at a time per
//! key), duplicate detection by message id, pause / resume, and a reply
//! address and correlation id kept with each message (what to do with them
//! is the receiver's business).

use std::time::Duration;

use async_trait::async_trait;
use rota_model::{InstanceId, LeaseToken, MessageId, QueueName, Timestamp};
use serde::Serialize;
use serde_json::value::RawValue;

use crate::Result;
use crate::batch::DeadLetterFilter;

/// A message body: a JSON document, kept as its text. Validated once when
/// built, never re-parsed by the store.
pub type Body = Box<RawValue>;

/// The default bound on a message body, in bytes (backends take the bound
/// they enforce from their configuration).
pub const BODY_BYTES_MAX: usize = 256 * 1024;

/// The longest ordering key, in bytes.
pub const ORDERING_KEY_BYTES_MAX: usize = 200;

/// The longest correlation id, in bytes.
pub const CORRELATION_ID_BYTES_MAX: usize = 200;

/// The most messages one receive may ask for.
pub const RECEIVE_MAX: u32 = 1_000;

/// How long a message id is remembered for duplicate detection by default.
pub const DEDUPE_WINDOW_DEFAULT: Duration = Duration::from_secs(10 * 60);

/// A queue's settings. Queues are created with the defaults on first use,
/// or explicitly with [`Queues::create_queue`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueConfig {
    /// How long a receive leases a message unless the receive asks otherwise.
    pub lease: Duration,
    /// How many deliveries a message gets before it is dead-lettered.
    pub deliveries_max: u32,
    /// How long a sent message id is remembered to drop duplicates.
    pub dedupe_window: Duration,
}

impl Default for QueueConfig {
    /// A 30 s lease, 10 deliveries, a 10 minute duplicate-detection window
    /// (Azure Service Bus's defaults, where it has them).
    fn default() -> Self {
        QueueConfig { lease: Duration::from_secs(30), deliveries_max: 10, dedupe_window: DEDUPE_WINDOW_DEFAULT }
    }
}

impl QueueConfig {
    /// The longest lease a queue or a receive may ask for.
    pub const LEASE_MAX: Duration = Duration::from_secs(24 * 3600);
    /// The most deliveries a queue may allow.
    pub const DELIVERIES_MAX_LIMIT: u32 = 10_000;

    /// Checks the bounds; the error names the offending field.
    pub fn validate(&self) -> Result<()> {
        check_lease(self.lease)?;
        if self.deliveries_max == 0 || self.deliveries_max > Self::DELIVERIES_MAX_LIMIT {
            return Err(crate::Error::Invalid(format!(
                "deliveries_max must be between 1 and {}, got {}",
                Self::DELIVERIES_MAX_LIMIT,
                self.deliveries_max
            )));
        }
        if self.dedupe_window > Duration::from_secs(7 * 24 * 3600) {
            return Err(crate::Error::Invalid(format!("dedupe_window must be at most 7 days, got {:?}", self.dedupe_window)));
        }
        Ok(())
    }
}

/// Checks a lease duration against the bounds.
pub(crate) fn check_lease(lease: Duration) -> Result<()> {
    if lease < Duration::from_millis(1) || lease > QueueConfig::LEASE_MAX {
        return Err(crate::Error::Invalid(format!("lease must be between 1 ms and 24 h, got {lease:?}")));
    }
    Ok(())
}

/// A message to send.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The JSON body.
    pub body: Body,
    /// The message id; sending the same id again within the queue's
    /// duplicate-detection window is a no-op that returns the first send's id.
    /// Without one, the store assigns a fresh id.
    pub id: Option<MessageId>,
    /// How long to keep it invisible after sending.
    pub delay: Duration,
    /// Messages with the same key are delivered in send order, one lease at a
    /// time (a session, in Service Bus terms).
    pub ordering_key: Option<String>,
    /// Where the receiver should send its answer (a reply address). Kept
    /// with the message through leases, dead-lettering and redrive; the
    /// store does nothing else with it.
    pub reply_to: Option<QueueName>,
    /// What the answer should carry to be matched with this request. Kept
    /// like `reply_to`.
    pub correlation_id: Option<String>,
}

impl Outgoing {
    /// A message with this body, no id, no delay, no ordering key.
    pub fn new(body: Body) -> Self {
        Outgoing { body, id: None, delay: Duration::ZERO, ordering_key: None, reply_to: None, correlation_id: None }
    }

    /// A message whose body is `value` serialized.
    pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<Self> {
        let body = serde_json::value::to_raw_value(value).map_err(|e| crate::Error::Invalid(format!("message body: {e}")))?;
        Ok(Outgoing::new(body))
    }

    /// A message whose body is the JSON text `text`, validated here.
    pub fn parse(text: &str) -> Result<Self> {
        let body = RawValue::from_string(text.to_owned()).map_err(|e| crate::Error::Invalid(format!("message body is not JSON: {e}")))?;
        Ok(Outgoing::new(body))
    }

    /// With a message id for duplicate detection.
    pub fn with_id(mut self, id: MessageId) -> Self {
        self.id = Some(id);
        self
    }

    /// Invisible for `delay` after sending.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// With an ordering key.
    pub fn with_ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// With a reply address.
    pub fn with_reply_to(mut self, queue: QueueName) -> Self {
        self.reply_to = Some(queue);
        self
    }

    /// With a correlation id.
    pub fn with_correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }

    /// Refuses, as every backend does before storing anything, a body over
    /// `body_bytes_max` (the bound the backend was configured with), an
    /// ordering key that is empty or over [`ORDERING_KEY_BYTES_MAX`] and a
    /// correlation id that is empty or over [`CORRELATION_ID_BYTES_MAX`].
    pub fn check(&self, body_bytes_max: usize) -> Result<()> {
        let size = self.body.get().len();
        if size > body_bytes_max {
            return Err(crate::Error::Invalid(format!("message body is {size} bytes, over the limit of {body_bytes_max} bytes")));
        }
        if self.ordering_key.as_ref().is_some_and(|k| k.is_empty() || k.len() > ORDERING_KEY_BYTES_MAX) {
            return Err(crate::Error::Invalid(format!("ordering key must be 1 to {ORDERING_KEY_BYTES_MAX} bytes")));
        }
        if self.correlation_id.as_ref().is_some_and(|c| c.is_empty() || c.len() > CORRELATION_ID_BYTES_MAX) {
            return Err(crate::Error::Invalid(format!("correlation id must be 1 to {CORRELATION_ID_BYTES_MAX} bytes")));
        }
        Ok(())
    }
}

/// The outcome of one send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sent {
    /// The message id (the given one, or the one the store assigned).
    pub id: MessageId,
    /// Whether the id was seen within the window, so nothing was added.
    pub duplicate: bool,
}

/// A receive request.
#[derive(Debug, Clone)]
pub struct Receive {
    /// The most messages to lease (1..=[`RECEIVE_MAX`]).
    pub max: u32,
    /// The lease length; the queue's default when `None`.
    pub lease: Option<Duration>,
    /// How long to wait for a first message when none is ready (long poll).
    /// Zero returns at once.
    pub wait: Duration,
    /// Who receives, recorded as the lease owner.
    pub consumer: Option<InstanceId>,
    /// The receiver acts on what it gets only by writing to this same store
    /// (a Scheduler does). A store that makes commits durable after
    /// committing them may then deliver before the commit that sent or
    /// leased the messages is durable: whatever the receiver writes lands
    /// after that commit, and no flush keeps it without its cause. A
    /// receiver that calls out (an agent, an application's consumer) leaves
    /// this off, and gets only durable messages.
    pub acts_within_store: bool,
}

impl Receive {
    /// Up to `max` messages, the queue's lease, no waiting.
    pub fn up_to(max: u32) -> Self {
        Receive { max, lease: None, wait: Duration::ZERO, consumer: None, acts_within_store: false }
    }

    /// Wait up to `wait` for a first message.
    pub fn waiting(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Lease for `lease` instead of the queue's default.
    pub fn leasing(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Record `consumer` as the lease owner.
    pub fn by(mut self, consumer: InstanceId) -> Self {
        self.consumer = Some(consumer);
        self
    }

    /// The receiver acts only through this store: see [`Receive::acts_within_store`].
    pub fn acting_within_store(mut self) -> Self {
        self.acts_within_store = true;
        self
    }

    /// Checks the bounds; the error names the offending field.
    pub fn validate(&self) -> Result<()> {
        if self.max == 0 || self.max > RECEIVE_MAX {
            return Err(crate::Error::Invalid(format!("max must be between 1 and {RECEIVE_MAX}, got {}", self.max)));
        }
        if let Some(lease) = self.lease {
            check_lease(lease)?;
        }
        Ok(())
    }
}

/// A leased message.
#[derive(Debug, Clone, Serialize)]
pub struct Delivery {
    /// The queue it came from.
    pub queue: QueueName,
    /// Its message id.
    pub id: MessageId,
    /// Its body.
    pub body: Body,
    /// The proof of this lease, for complete / abandon / renew / dead_letter.
    pub lease_token: LeaseToken,
    /// How many times it has been delivered, this delivery included.
    pub delivery_count: u32,
    /// When it was sent.
    pub enqueued_at: Timestamp,
    /// When this lease runs out unless renewed.
    pub lease_until: Timestamp,
    /// Its ordering key, if any.
    pub ordering_key: Option<String>,
    /// Where its sender wants the answer, if it said.
    pub reply_to: Option<QueueName>,
    /// What the answer should carry, if the sender said.
    pub correlation_id: Option<String>,
}

/// A message in a dead-letter queue.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// The queue it was dead-lettered from.
    pub queue: QueueName,
    /// Its message id.
    pub id: MessageId,
    /// Its body.
    pub body: Body,
    /// Its ordering key, if any.
    pub ordering_key: Option<String>,
    /// How many times it was delivered.
    pub delivery_count: u32,
    /// When it was first sent.
    pub enqueued_at: Timestamp,
    /// When it was dead-lettered.
    pub dead_lettered_at: Timestamp,
    /// Why: the consumer's reason, or the delivery count that ran out.
    pub reason: String,
    /// Its reply address, if any.
    pub reply_to: Option<QueueName>,
    /// Its correlation id, if any.
    pub correlation_id: Option<String>,
}

/// One page of a walk over a queue's dead letters, oldest first
/// ([`Queues::dead_letter_page`]).
#[derive(Debug, Clone)]
pub struct DeadLetterPage {
    /// The dead letters of the page that the filter selects, each with its
    /// `seq` (its place in the dead-letter queue, oldest first).
    pub letters: Vec<(u64, DeadLetter)>,
    /// The `seq` of the last dead letter the page looked at, selected or
    /// not: the next page starts after it. `None` when it looked at none.
    pub scanned_through: Option<u64>,
    /// True when the page looked at fewer dead letters than it could: the
    /// walk reached the end of the queue.
    pub end: bool,
}

/// Which dead letters to send back to their queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redrive {
    /// The one with this message id.
    One(MessageId),
    /// All of them.
    All,
}

/// Counts for one queue, as of one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueStats {
    /// The queue.
    pub queue: QueueName,
    /// Visible and waiting for a consumer.
    pub ready: u64,
    /// Leased by a consumer.
    pub leased: u64,
    /// Sent with a delay (or abandoned with one) that has not passed yet.
    pub delayed: u64,
    /// In the dead-letter queue.
    pub dead_lettered: u64,
    /// Whether receives are paused.
    pub paused: bool,
    /// When the oldest ready message was sent.
    pub oldest_ready_at: Option<Timestamp>,
}

/// How far one queue's consumers are behind (see [`Queues::backlogs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backlog {
    /// The queue.
    pub queue: QueueName,
    /// Ready messages, counted up to the bound asked.
    pub ready: u64,
    /// Whether a consumer holds a message of it leased now.
    pub leased: bool,
}

/// Durable competing-consumer queues.
///
/// Every method that takes a [`LeaseToken`] fails with
/// [`crate::Error::LeaseLost`] unless the token is the current, unexpired
/// lease of a message in that queue.
#[async_trait]
pub trait Queues: Send + Sync {
    /// Creates a queue, or updates the settings of an existing one.
    async fn create_queue(&self, queue: &QueueName, config: QueueConfig) -> Result<()>;

    /// A queue's settings, or `None` if it does not exist.
    async fn queue_config(&self, queue: &QueueName) -> Result<Option<QueueConfig>>;

    /// Sends one message (creating the queue with defaults if needed). When
    /// this returns `Ok`, the message is durable: it survives a crash.
    async fn send(&self, queue: &QueueName, message: Outgoing) -> Result<Sent>;

    /// Sends many messages atomically: all are durable, or none is sent.
    async fn send_batch(&self, queue: &QueueName, messages: Vec<Outgoing>) -> Result<Vec<Sent>>;

    /// Leases up to `request.max` visible messages, oldest first, waiting up to
    /// `request.wait` for a first one. Each delivery bumps the message's
    /// delivery count; a message whose count would pass the queue's
    /// `deliveries_max` goes to the dead-letter queue instead of being
    /// delivered. A paused queue delivers nothing.
    async fn receive(&self, queue: &QueueName, request: Receive) -> Result<Vec<Delivery>>;

    /// Deletes a leased message: it was handled.
    async fn complete(&self, queue: &QueueName, token: LeaseToken) -> Result<()>;

    /// Completes many leased messages in one commit. Returns the tokens whose
    /// lease was lost (those messages were not deleted).
    async fn complete_batch(&self, queue: &QueueName, tokens: &[LeaseToken]) -> Result<Vec<LeaseToken>>;

    /// Gives a leased message back, visible again after `delay`. If it has
    /// used up its deliveries, it is dead-lettered with `reason` instead.
    async fn abandon(&self, queue: &QueueName, token: LeaseToken, delay: Duration, reason: Option<String>) -> Result<()>;

    /// Extends a lease to now + `lease` (the queue's default when `None`).
    /// Returns the new expiry.
    async fn renew(&self, queue: &QueueName, token: LeaseToken, lease: Option<Duration>) -> Result<Timestamp>;

    /// Moves a leased message to the dead-letter queue at once, keeping `reason`
    /// (a poison message).
    async fn dead_letter(&self, queue: &QueueName, token: LeaseToken, reason: String) -> Result<()>;

    /// Up to `limit` dead letters of a queue, oldest first.
    async fn dead_letters(&self, queue: &QueueName, limit: u32) -> Result<Vec<DeadLetter>>;

    /// Sends dead letters back to their queue with a fresh delivery count.
    /// Returns how many were moved; `Redrive::One` of an unknown id is `NotFound`.
    async fn redrive(&self, queue: &QueueName, which: Redrive) -> Result<u64>;

    /// A page of the walk over `filter.queue`'s dead letters, oldest first:
    /// it looks at the next `scan` dead letters after the one with `seq`
    /// `after` (from the first, with `None`) and returns those the filter
    /// selects. Bounded by `scan` whatever the filter: a page reads one
    /// range of the queue's `(queue_id, seq)` index, however few of them
    /// match. An unknown queue is `NotFound`.
    async fn dead_letter_page(&self, filter: &DeadLetterFilter, after: Option<u64>, scan: u32) -> Result<DeadLetterPage>;

    /// How many of `filter.queue`'s dead letters the filter selects (it
    /// reads them all). An unknown queue is `NotFound`.
    async fn count_dead_letters(&self, filter: &DeadLetterFilter) -> Result<u64>;

    /// Sends the dead letters of `queue` with these `seq`s back to it, in
    /// the order they were dead-lettered, with a fresh delivery count, in
    /// one transaction. Returns how many were moved: a `seq` no longer
    /// there (redriven or purged already) is passed over.
    async fn redrive_listed(&self, queue: &QueueName, seqs: &[u64]) -> Result<u64>;

    /// Deletes every dead letter of a queue. Returns how many.
    async fn purge_dead_letters(&self, queue: &QueueName) -> Result<u64>;

    /// Stops deliveries from a queue (sends still succeed).
    async fn pause(&self, queue: &QueueName) -> Result<()>;

    /// Resumes deliveries from a paused queue.
    async fn resume(&self, queue: &QueueName) -> Result<()>;

    /// Counts for every queue, sorted by name.
    async fn stats(&self) -> Result<Vec<QueueStats>>;

    /// The backlog of each of `queues` that exists, in the order given:
    /// its ready messages (visible, waiting for a consumer; a paused
    /// queue's too) counted no further than `up_to`, and whether a
    /// consumer holds one leased. Its cost is bounded by `up_to` whatever
    /// the backlog, for a caller that only asks whether consumers that are
    /// there keep up.
    async fn backlogs(&self, queues: &[QueueName], up_to: u32) -> Result<Vec<Backlog>>;
}
