//! Webhooks: a task submitted with a `callback_url`
//! has its status events POSTed there, signed, retried with backoff, and
//! dead-lettered when they keep failing.
//!
//! The [`Dispatcher`] has two parts, both durable:
//!
//! - **The follower** reads the store's global event order
//!   (`events_after`) from a cursor kept in the store (status key
//!   [`WEBHOOK_CURSOR_KEY`]), and for each event of the configured kinds of a task
//!   with a callback URL sends one delivery message to the queue
//!   [`QUEUE`] (`rota.webhooks`). Messages carry the task id as their
//!   ordering key, so one task's events are delivered in order, one at a
//!   time; and the event seq as their message id, so an event enqueued twice
//!   (a crash between the send and the cursor's save, or two followers) is
//!   dropped by duplicate detection. One follower leads at a time (a leader
//!   lease), however many processes run a dispatcher.
//! - **The sender** is a [`Consumer`] of that queue: it POSTs
//!   each delivery, completes it on a 2xx, and otherwise abandons it with an
//!   exponential backoff; after [`WebhookConfig::attempts_max`] deliveries
//!   the store moves it to the queue's dead letters with the last error,
//!   where `rota dlq` (or `POST /v1/queues/rota.webhooks/dead-letters/…/redrive`)
//!   can send it again. A paused queue holds every delivery.
//!
//! Each POST has the event as its JSON body ([`WebhookEvent`], the shape of
//! the API's SSE events: `seq`, `task_id`, `at`, `kind`, `step`, `attempt`,
//! `detail`) and the
//! header `Rota-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`
//! under [`WebhookConfig::secret`], so that receivers can check where it came
//! from and refuse replays (a `t` too old).
//!
//! Delivery is at least once: a receiver may see an event twice (the
//! `Rota-Event-Id` header, the event's seq, tells repeats apart).
//!
//! The callback URL is the submitter's: with [`WebhookConfig::egress`] on
//! (the `egress-allow` setting, shared with the `http` agent), a delivery to
//! a host the allow-list refuses (by name, by address literal, or by the
//! addresses its name resolves to) is dead-lettered at once, with a reason
//! naming the host and the setting.
//!
//! Deliberately left out: per-task secrets.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rota_model::{Clock, InstanceId, MessageId, QueueName, TaskId};
use rota_store::{Delivery, Event, EventKind, Outgoing, QueueConfig, SharedStore};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::status::WEBHOOK_CURSOR_KEY;
use crate::{Consumer, Handler, Outcome, Shutdown, async_trait};

/// The queue of webhook deliveries.
pub const QUEUE: &str = "rota.webhooks";

/// The leader lease of the follower.
const LEADER_LEASE: &str = "webhooks";

/// The signature header.
pub const SIGNATURE_HEADER: &str = "Rota-Signature";

/// The longest callback URL accepted, in bytes.
pub const URL_BYTES_MAX: usize = 2048;

/// Checks a callback URL: `http` or `https`, a host, at most
/// [`URL_BYTES_MAX`] bytes, no control characters or spaces.
pub fn check_url(url: &str) -> Result<(), String> {
    if url.len() > URL_BYTES_MAX {
        return Err(format!("must be at most {URL_BYTES_MAX} bytes, got {}", url.len()));
    }
    if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("must not contain spaces or control characters".into());
    }
    let Ok(parsed) = reqwest::Url::parse(url) else { return Err(format!("{url:?} is not a URL")) };
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("{url:?} must be an http or https URL with a host"));
    }
    Ok(())
}

/// The secret that signs webhooks. Its `Debug` never shows it.
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl Secret {
    /// The shortest secret accepted, in bytes.
    pub const BYTES_MIN: usize = 16;

    /// A secret of these bytes (at least [`Secret::BYTES_MIN`]).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, crate::Error> {
        let bytes: Vec<u8> = bytes.into();
        if bytes.len() < Self::BYTES_MIN {
            return Err(crate::Error::Config(format!("webhooks.secret must be at least {} bytes, got {}", Self::BYTES_MIN, bytes.len())));
        }
        Ok(Secret(bytes.into()))
    }

    /// The `Rota-Signature` value of `body` sent at `unix_seconds`:
    /// `t=<unix_seconds>,v1=<hex HMAC-SHA256 of "<unix_seconds>.<body>">`.
    pub fn signature(&self, unix_seconds: i64, body: &[u8]) -> String {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(unix_seconds.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        let tag = mac.finalize().into_bytes();
        let hex: String = tag.iter().map(|byte| format!("{byte:02x}")).collect();
        format!("t={unix_seconds},v1={hex}")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The dispatcher's settings. Checked by [`WebhookConfig::validate`].
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// This process (the follower's leader lease and the sender's leases).
    pub instance: InstanceId,
    /// The signing secret.
    pub secret: Secret,
    /// The event kinds delivered.
    pub kinds: Vec<EventKind>,
    /// Deliveries of one event before it is dead-lettered.
    pub attempts_max: u32,
    /// The wait after the first failed delivery; it doubles each time.
    pub backoff_initial: Duration,
    /// The longest wait between deliveries.
    pub backoff_max: Duration,
    /// How long one POST may take.
    pub request_timeout: Duration,
    /// POSTs in flight at once.
    pub concurrency: usize,
    /// How often the follower looks for new events.
    pub poll_interval: Duration,
    /// The most events the follower reads at once.
    pub batch_max: u32,
    /// The seed of the retry jitter.
    pub seed: u64,
    /// The hosts and networks deliveries may reach (off by default).
    pub egress: rota_agent::Egress,
}

impl WebhookConfig {
    /// The status kinds (received, step completed, skipped or failed, processed,
    /// error, compensation, cancelled, resubmitted, at risk), 8 attempts 1 s apart
    /// doubling to 5 min, 10 s per POST, 16 at once, a 250 ms poll, every host.
    pub fn new(instance: InstanceId, secret: Secret) -> Self {
        use EventKind::*;
        WebhookConfig {
            instance,
            secret,
            kinds: vec![
                Received,
                StepCompleted,
                StepSkipped,
                StepFailed,
                Processed,
                Error,
                CompensationStarted,
                StepCompensated,
                Compensated,
                Cancelled,
                Resubmitted,
                AtRisk,
            ],
            attempts_max: 8,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            request_timeout: Duration::from_secs(10),
            concurrency: 16,
            poll_interval: Duration::from_millis(250),
            batch_max: 500,
            seed: 0,
            egress: rota_agent::Egress::default(),
        }
    }

    /// Checks every bound; the error names the field.
    pub fn validate(&self) -> Result<(), crate::Error> {
        let fail = |field: &str, why: String| Err(crate::Error::Config(format!("webhooks.{field}: {why}")));
        if self.attempts_max == 0 || self.attempts_max > QueueConfig::DELIVERIES_MAX_LIMIT {
            return fail("attempts_max", format!("must be between 1 and {}, got {}", QueueConfig::DELIVERIES_MAX_LIMIT, self.attempts_max));
        }
        if self.backoff_initial.is_zero() || self.backoff_initial > self.backoff_max {
            return fail("backoff_initial", format!("must be above zero and at most backoff_max, got {:?}", self.backoff_initial));
        }
        if self.backoff_max > Duration::from_secs(24 * 3600) {
            return fail("backoff_max", format!("must be at most 24 h, got {:?}", self.backoff_max));
        }
        if self.request_timeout < Duration::from_millis(10) || self.request_timeout > Duration::from_secs(300) {
            return fail("request_timeout", format!("must be between 10 ms and 300 s, got {:?}", self.request_timeout));
        }
        if self.concurrency == 0 || self.concurrency > 1_000 {
            return fail("concurrency", format!("must be between 1 and 1000, got {}", self.concurrency));
        }
        if self.poll_interval < Duration::from_millis(10) || self.poll_interval > Duration::from_secs(60) {
            return fail("poll_interval", format!("must be between 10 ms and 60 s, got {:?}", self.poll_interval));
        }
        if self.batch_max == 0 || self.batch_max > 10_000 {
            return fail("batch_max", format!("must be between 1 and 10000, got {}", self.batch_max));
        }
        if self.kinds.is_empty() {
            return fail("kinds", "name at least one event kind".into());
        }
        Ok(())
    }

    /// The lease of a delivery: long enough for a POST and its answer.
    fn lease(&self) -> Duration {
        (self.request_timeout * 2).max(Duration::from_secs(5))
    }
}

/// The body of one webhook POST: a task's event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WebhookEvent {
    /// Its position in the store's global event order.
    pub seq: i64,
    /// The task.
    pub task_id: String,
    /// When it happened, epoch ms.
    pub at: i64,
    /// What happened ([`EventKind::as_str`]).
    pub kind: String,
    /// The step concerned, if any.
    pub step: Option<String>,
    /// The step's attempt, if any.
    pub attempt: Option<u32>,
    /// Details.
    pub detail: Value,
}

impl From<&Event> for WebhookEvent {
    fn from(event: &Event) -> Self {
        WebhookEvent {
            seq: event.seq,
            task_id: event.task_id.to_string(),
            at: event.at.as_millis(),
            kind: event.kind.as_str().to_owned(),
            step: event.step.as_ref().map(ToString::to_string),
            attempt: event.attempt,
            detail: event.detail.clone(),
        }
    }
}

/// One delivery: an event and where it goes.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Message {
    url: String,
    event: WebhookEvent,
}

/// What one follower round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Round {
    /// Whether this instance leads (only the leader follows events).
    pub leader: bool,
    /// Events read.
    pub events: usize,
    /// Deliveries enqueued.
    pub enqueued: usize,
    /// The cursor after the round.
    pub cursor: i64,
}

/// Follows task events into webhook deliveries and sends them. See the module doc.
pub struct Dispatcher {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    config: WebhookConfig,
    http: reqwest::Client,
    queue: QueueName,
    /// Each task's callback URL (immutable once submitted), bounded.
    urls: HashMap<TaskId, Option<String>>,
}

/// The most task URLs remembered before the cache is cleared.
const URL_CACHE_MAX: usize = 10_000;

impl Dispatcher {
    /// A dispatcher over `store`; checks `config`.
    pub fn new(store: SharedStore, clock: Arc<dyn Clock>, config: WebhookConfig) -> Result<Self, crate::Error> {
        config.validate()?;
        let http = config
            .egress
            .client(rota_agent::http_client())
            .timeout(config.request_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("rota-webhooks/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| crate::Error::Config(format!("webhooks: cannot build the HTTP client: {err}")))?;
        let queue = QueueName::new(QUEUE).expect("a valid queue name");
        Ok(Dispatcher { store, clock, config, http, queue, urls: HashMap::new() })
    }

    /// Creates the delivery queue (with `attempts_max` deliveries), then
    /// follows events and sends deliveries until `shutdown`.
    pub async fn run(mut self, shutdown: Shutdown) -> crate::Result<()> {
        let queue_config = QueueConfig { lease: self.config.lease(), deliveries_max: self.config.attempts_max, ..QueueConfig::default() };
        self.store.create_queue(&self.queue, queue_config).await?;
        let consumer_config = crate::consumer::Config::builder(self.queue.clone(), self.config.instance.clone())
            .max_concurrent(self.config.concurrency)
            .lease(self.config.lease())
            .receive_wait(Duration::from_secs(1))
            .build()?;
        let sender = Sender::new(self.http.clone(), self.clock.clone(), self.config.clone());
        let consumer = tokio::spawn(Consumer::new(self.store.clone(), consumer_config).run(Arc::new(sender), shutdown.clone()));

        let stop = shutdown.triggered();
        tokio::pin!(stop);
        loop {
            let round = match self.run_once().await {
                Ok(round) => round,
                Err(err) => {
                    tracing::warn!("webhook follower round failed: {err}");
                    Round::default()
                }
            };
            // A full batch means more is waiting: go on at once.
            if round.events < self.config.batch_max as usize {
                tokio::select! {
                    () = &mut stop => break,
                    () = tokio::time::sleep(self.config.poll_interval) => {}
                }
            } else if shutdown.is_triggered() {
                break;
            }
        }
        if let Err(err) = self.store.release_leader(LEADER_LEASE, &self.config.instance).await {
            tracing::warn!("releasing the webhook follower's leadership: {err}");
        }
        match consumer.await {
            Ok(result) => result.map(|_| ()),
            Err(err) => Err(crate::Error::Config(format!("the webhook sender panicked: {err}"))),
        }
    }

    /// One follower round: if this instance leads, enqueue the deliveries of
    /// the events after the cursor (up to `batch_max`) and move the cursor.
    pub async fn run_once(&mut self) -> rota_store::Result<Round> {
        let ttl = (self.config.poll_interval * 20).max(Duration::from_secs(5));
        if self.store.acquire_leader(LEADER_LEASE, &self.config.instance, ttl).await?.is_none() {
            return Ok(Round::default());
        }
        let cursor = self.cursor().await?;
        let events = self.store.events_after(cursor, self.config.batch_max).await?;
        let mut round = Round { leader: true, events: events.len(), enqueued: 0, cursor };
        let Some(last) = events.last().map(|event| event.seq) else { return Ok(round) };
        let mut messages = Vec::new();
        let kinds = self.config.kinds.clone();
        for event in events.iter().filter(|event| kinds.contains(&event.kind)) {
            let Some(url) = self.url_of(&event.task_id).await? else { continue };
            let message = Message { url, event: WebhookEvent::from(event) };
            let mut outgoing = Outgoing::json(&message)?.with_ordering_key(event.task_id.as_str());
            if let Ok(id) = MessageId::new(format!("webhook-{}", event.seq)) {
                outgoing = outgoing.with_id(id);
            }
            messages.push(outgoing);
        }
        round.enqueued = messages.len();
        if !messages.is_empty() {
            self.store.send_batch(&self.queue, messages).await?;
        }
        // Saved after the send: a crash in between enqueues the same events
        // again, and duplicate detection drops them.
        self.store.report_status(WEBHOOK_CURSOR_KEY, &json!({ "seq": last })).await?;
        round.cursor = last;
        Ok(round)
    }

    async fn cursor(&self) -> rota_store::Result<i64> {
        let statuses = self.store.statuses(WEBHOOK_CURSOR_KEY).await?;
        let saved = statuses.iter().find(|status| status.key == WEBHOOK_CURSOR_KEY).and_then(|status| status.value["seq"].as_i64());
        Ok(saved.unwrap_or(0))
    }

    async fn url_of(&mut self, task_id: &TaskId) -> rota_store::Result<Option<String>> {
        if let Some(url) = self.urls.get(task_id) {
            return Ok(url.clone());
        }
        let url = self.store.task(task_id).await?.and_then(|record| record.task.reply_to);
        if self.urls.len() >= URL_CACHE_MAX {
            self.urls.clear();
        }
        self.urls.insert(task_id.clone(), url.clone());
        Ok(url)
    }
}

/// POSTs one delivery.
struct Sender {
    http: reqwest::Client,
    clock: Arc<dyn Clock>,
    config: WebhookConfig,
    rng: Mutex<StdRng>,
}

impl Sender {
    fn new(http: reqwest::Client, clock: Arc<dyn Clock>, config: WebhookConfig) -> Self {
        let rng = Mutex::new(StdRng::seed_from_u64(config.seed));
        Sender { http, clock, config, rng }
    }

    /// The wait before the next delivery after `deliveries` failed ones:
    /// doubling from `backoff_initial`, capped, with equal jitter.
    fn backoff(&self, deliveries: u32) -> Duration {
        let doublings = deliveries.saturating_sub(1).min(30);
        let base = self.config.backoff_initial.saturating_mul(1 << doublings).min(self.config.backoff_max);
        let half = base / 2;
        let fraction: f64 = self.rng.lock().expect("the jitter RNG is never poisoned").random();
        half + half.mul_f64(fraction)
    }
}

#[async_trait]
impl Handler for Sender {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        let message: Message = match serde_json::from_str(delivery.body.get()) {
            Ok(message) => message,
            Err(err) => return Outcome::DeadLetter { reason: format!("not a webhook delivery: {err}") },
        };
        if let Some(refused) = reqwest::Url::parse(&message.url).ok().and_then(|url| self.config.egress.check_url(&url).err()) {
            return Outcome::DeadLetter { reason: format!("POST {}: {refused}", without_query(&message.url)) };
        }
        let body = serde_json::to_vec(&message.event).expect("events serialize");
        let sent_at = self.clock.now().as_millis().div_euclid(1_000);
        let request = self
            .http
            .post(&message.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, self.config.secret.signature(sent_at, &body))
            .header("Rota-Event-Id", message.event.seq.to_string())
            .header("Rota-Event-Kind", &message.event.kind)
            .header("Rota-Delivery", delivery.delivery_count.to_string())
            .body(body);
        let failure = match request.send().await {
            Ok(response) if response.status().is_success() => return Outcome::Complete,
            Ok(response) => format!("POST {} answered {}", without_query(&message.url), response.status()),
            Err(err) => match rota_agent::egress::refusal(&err) {
                Some(refused) => return Outcome::DeadLetter { reason: format!("POST {}: {refused}", without_query(&message.url)) },
                None => format!("POST {} failed: {}", without_query(&message.url), without_url(&err)),
            },
        };
        tracing::debug!(event = message.event.seq, deliveries = delivery.delivery_count, "webhook: {failure}");
        let reason = format!("{failure} (delivery {} of {})", delivery.delivery_count, self.config.attempts_max);
        Outcome::Abandon { delay: self.backoff(delivery.delivery_count), reason }
    }
}

/// `url` without its query string, which may hold credentials.
fn without_query(url: &str) -> &str {
    url.split_once('?').map_or(url, |(head, _)| head)
}

/// A reqwest error's kind, without repeating the URL.
fn without_url(err: &reqwest::Error) -> String {
    if err.is_timeout() {
        "timed out".into()
    } else if err.is_connect() {
        "could not connect".into()
    } else {
        err.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_hmac_sha256_of_time_dot_body() {
        let secret = Secret::new("a-webhook-secret-of-32-bytes-xxx").unwrap();
        let signature = secret.signature(1_795_000_000, b"{\"seq\":1}");
        let (t, v1) = signature.split_once(",v1=").unwrap();
        assert_eq!(t, "t=1795000000");
        assert_eq!(v1.len(), 64);
        assert_eq!(signature, secret.signature(1_795_000_000, b"{\"seq\":1}"));
        assert_ne!(signature, secret.signature(1_795_000_001, b"{\"seq\":1}"));
        assert_ne!(signature, Secret::new("another-secret-of-32-bytes-xxxxx").unwrap().signature(1_795_000_000, b"{\"seq\":1}"));
        assert_eq!(format!("{secret:?}"), "Secret(<redacted>)");
        assert!(Secret::new("short").is_err());
    }

    #[test]
    fn callback_urls_are_checked() {
        assert!(check_url("https://shop.example/hooks/rota?x=1").is_ok());
        assert!(check_url("http://127.0.0.1:9000/").is_ok());
        for bad in ["ftp://x/", "not a url", "https://", "mailto:a@b", "http://a b/", &format!("https://x/{}", "a".repeat(2048))] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_config_is_checked() {
        let config = || WebhookConfig::new(InstanceId::new("i-1").unwrap(), Secret::new("0123456789abcdef").unwrap());
        config().validate().unwrap();
        let check = |change: fn(&mut WebhookConfig), field: &str| {
            let mut c = config();
            change(&mut c);
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        };
        check(|c| c.attempts_max = 0, "attempts_max");
        check(|c| c.backoff_initial = Duration::ZERO, "backoff_initial");
        check(|c| c.backoff_max = Duration::from_secs(100_000), "backoff_max");
        check(|c| c.request_timeout = Duration::ZERO, "request_timeout");
        check(|c| c.concurrency = 0, "concurrency");
        check(|c| c.poll_interval = Duration::ZERO, "poll_interval");
        check(|c| c.batch_max = 0, "batch_max");
        check(|c| c.kinds.clear(), "kinds");
    }

    #[test]
    fn backoff_doubles_within_bounds() {
        let mut config = WebhookConfig::new(InstanceId::new("i-1").unwrap(), Secret::new("0123456789abcdef").unwrap());
        config.backoff_initial = Duration::from_millis(100);
        config.backoff_max = Duration::from_millis(1_000);
        let sender = Sender::new(rota_agent::http_client().build().unwrap(), Arc::new(rota_model::SystemClock), config);
        for (deliveries, base) in [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1_000), (40, 1_000)] {
            for _ in 0..20 {
                let wait = sender.backoff(deliveries);
                let base = Duration::from_millis(base);
                assert!(wait >= base / 2 && wait <= base, "after {deliveries}: {wait:?} not in [{:?}, {base:?}]", base / 2);
            }
        }
    }
}
