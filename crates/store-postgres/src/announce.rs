//! Waking receivers: this process's at once, other processes' through
//! `LISTEN`/`NOTIFY` on the store's channel, and only when some other
//! process listens.
//!
//! A send wakes the receivers of its queue in this process when its commit
//! returns ([`Wakers`]). Other processes learn of it from an announcement:
//! a NOTIFY `<origin> <queue>` that the announcer makes in a transaction of
//! its own, coalescing what piles up while one is in flight (see [`run`]).
//!
//! An announcement costs a statement and wakes every listener, so a process
//! that is alone on its channel (the embedded shape, a one-process
//! deployment, a benchmark) makes none. Processes tell each other they are
//! there on the channel itself ([`Peers`]): each says `!hello` when it
//! starts listening, whoever hears a hello answers `!here`, and everyone
//! says `!here` every [`HEARTBEAT`]. A process announces while it has heard
//! another within [`PEER_EXPIRY`], during its first [`HELLO_REPLY_WAIT`] of
//! listening (the answers are on their way), and whenever it is not
//! listening (then it cannot know). A send that goes unannounced to a
//! process that joined a moment ago is found by that process's next poll
//! (`poll_interval`): announcements only make wake-ups early, never possible.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rota_model::{QueueName, Timestamp};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use crate::connections::Connections;

/// How often a process tells the others it is there.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(2);
/// How long after the last word from another process it is still counted
/// as there: three heartbeats missed.
pub(crate) const PEER_EXPIRY: Duration = Duration::from_secs(6);
/// How long a process that started listening announces anyway, while the
/// others' answers to its hello come in.
pub(crate) const HELLO_REPLY_WAIT: Duration = Duration::from_millis(250);

/// Payload suffix of a process saying it started listening (answer wanted).
const HELLO: &str = "!hello";
/// Payload suffix of a process saying it is there. `!` is not allowed in a
/// queue name, so neither can be mistaken for one.
const HERE: &str = "!here";

/// Waiting receivers by queue, woken by sends in this process and by the
/// listener; and, for each queue, the last look that found it empty while
/// nothing woke it since.
#[derive(Default)]
pub(crate) struct Wakers {
    by_queue: Mutex<HashMap<String, Watch>>,
}

#[derive(Default)]
struct Watch {
    notify: Arc<Notify>,
    /// Counts the wake-ups: a look begun before one may have missed what
    /// it announced.
    wakes: u64,
    empty: Option<EmptyLook>,
}

/// A look at a queue that found nothing to lease.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EmptyLook {
    /// The store's time of the look.
    pub(crate) at: Timestamp,
    /// The earliest time a message of the queue turns visible, none if it
    /// held no message.
    pub(crate) next_visible: Option<Timestamp>,
}

impl Wakers {
    pub(crate) fn of(&self, queue: &str) -> Arc<Notify> {
        self.lock().entry(queue.to_owned()).or_default().notify.clone()
    }

    /// How many wake-ups `queue` has had: read before a look, given back to
    /// [`Wakers::found_empty`] after it.
    pub(crate) fn wakes(&self, queue: &str) -> u64 {
        self.lock().entry(queue.to_owned()).or_default().wakes
    }

    /// Records a look begun after `wakes` wake-ups that found `queue`
    /// empty; a wake-up since then voids it.
    pub(crate) fn found_empty(&self, queue: &str, wakes: u64, look: EmptyLook) {
        if let Some(watch) = self.lock().get_mut(queue)
            && watch.wakes == wakes
        {
            watch.empty = Some(look);
        }
    }

    /// Whether a look at `queue` would find it empty, as far as this
    /// process knows at `now`: the last one did, less than `fresh_for`
    /// ago, nothing woke the queue since, and nothing in it is due to turn
    /// visible by `now`.
    pub(crate) fn still_empty(&self, queue: &str, now: Timestamp, fresh_for: std::time::Duration) -> bool {
        self.lock()
            .get(queue)
            .and_then(|watch| watch.empty)
            .is_some_and(|look| look.at <= now && now < look.at.add(fresh_for) && look.next_visible.is_none_or(|visible| now < visible))
    }

    pub(crate) fn wake(&self, queue: &str) {
        if let Some(watch) = self.lock().get_mut(queue) {
            watch.wake();
        }
    }

    fn wake_all(&self) {
        for watch in self.lock().values_mut() {
            watch.wake();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watch>> {
        self.by_queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Watch {
    fn wake(&mut self) {
        self.wakes += 1;
        self.empty = None;
        self.notify.notify_waiters();
    }
}

/// Whether another process listens on the channel, as far as this one has
/// heard.
#[derive(Default)]
pub(crate) struct Peers {
    state: Mutex<PeersState>,
}

#[derive(Default)]
struct PeersState {
    /// Since when the listener has listened without a break.
    listening_since: Option<Instant>,
    /// When another process was last heard from.
    heard: Option<Instant>,
}

impl Peers {
    /// Whether sends must be announced now.
    pub(crate) fn anyone_else(&self) -> bool {
        let state = self.lock();
        let Some(since) = state.listening_since else { return true };
        since.elapsed() < HELLO_REPLY_WAIT || state.heard.is_some_and(|heard| heard.elapsed() < PEER_EXPIRY)
    }

    fn listening(&self) {
        self.lock().listening_since = Some(Instant::now());
    }

    fn deaf(&self) {
        self.lock().listening_since = None;
    }

    /// Whether the listener listens: only then does this process hear what
    /// the others announce.
    fn hearing(&self) -> bool {
        self.lock().listening_since.is_some()
    }

    fn heard(&self) {
        self.lock().heard = Some(Instant::now());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PeersState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What the announcer says on the channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Say {
    /// A commit sent to this queue.
    Sent(QueueName),
    /// This process started listening: whoever hears it answers.
    Hello,
    /// This process is here.
    Here,
}

/// The sending side of the announcer: what a commit calls.
pub(crate) struct Announcer {
    wakers: Arc<Wakers>,
    peers: Arc<Peers>,
    says: mpsc::UnboundedSender<Say>,
}

impl Announcer {
    /// Wakes this process's receivers of `queues` at once and has the other
    /// processes told, if any listens: called after the commit that sent to
    /// them.
    pub(crate) fn sent(&self, queues: Vec<QueueName>) {
        let others = self.peers.anyone_else();
        for queue in queues {
            self.wakers.wake(queue.as_str());
            if others {
                // Only fails when the store is closing.
                let _ = self.says.send(Say::Sent(queue));
            }
        }
    }

    pub(crate) fn wakers(&self) -> &Arc<Wakers> {
        &self.wakers
    }

    /// Whether this process hears the other processes' announcements.
    pub(crate) fn hears_others(&self) -> bool {
        self.peers.hearing()
    }
}

/// The background half: the task that says things on the channel and the
/// one that listens to it.
pub(crate) struct Channel {
    pub(crate) name: String,
    /// Tags this process's own notifications, which its listener skips.
    pub(crate) origin: String,
}

/// Starts the announcer (on `pool`) and the listener (on `listening`, a
/// pool of its own: the listener holds its connection for good).
pub(crate) fn start(
    connections: Arc<Connections>,
    listening: PgPool,
    channel: Channel,
) -> (Announcer, tokio::task::JoinHandle<()>, tokio::task::JoinHandle<()>) {
    let wakers = Arc::new(Wakers::default());
    let peers = Arc::new(Peers::default());
    let (says, pending) = mpsc::unbounded_channel();
    let channel = Arc::new(channel);
    let announcing = tokio::spawn(run(connections, channel.clone(), pending));
    let listener = tokio::spawn(listen(listening, channel, wakers.clone(), peers.clone(), says.clone()));
    (Announcer { wakers, peers, says }, announcing, listener)
}

/// Says what is pending on the channel, coalescing what piles up while one
/// NOTIFY is in flight, plus `!here` every [`HEARTBEAT`]. Each NOTIFY is a
/// transaction of its own with `synchronous_commit` off: PostgreSQL
/// serializes the commits of notifying transactions, so a NOTIFY inside each
/// sending transaction would make every send wait for the fsync of the one
/// before; this one has no data to make durable. A process that dies before
/// announcing leaves the others to find its messages on their next poll.
async fn run(connections: Arc<Connections>, channel: Arc<Channel>, mut pending: mpsc::UnboundedReceiver<Say>) {
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut says: Vec<Say> = Vec::new();
    loop {
        let first = tokio::select! {
            first = pending.recv() => match first {
                Some(first) => first,
                None => return,
            },
            _ = heartbeat.tick() => Say::Here,
        };
        says.clear();
        says.push(first);
        while let Ok(next) = pending.try_recv() {
            if !says.contains(&next) {
                says.push(next);
            }
        }
        let payloads: Vec<String> = says
            .iter()
            .map(|say| match say {
                Say::Sent(queue) => format!("{} {queue}", channel.origin),
                Say::Hello => format!("{} {HELLO}", channel.origin),
                Say::Here => format!("{} {HERE}", channel.origin),
            })
            .collect();
        let announced: crate::Result<()> = async {
            let mut conn = connections.acquire().await?;
            let outcome =
                sqlx::query("SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, p) FROM unnest($2::text[]) AS p")
                    .bind(&channel.name)
                    .bind(&payloads)
                    .execute(&mut *conn)
                    .await
                    .map(|_| ())
                    .map_err(crate::Fail::from);
            conn.finished(&outcome);
            outcome
        }
        .await;
        if let Err(err) = announced {
            if connections.pool().is_closed() {
                return;
            }
            tracing::debug!("postgres store: announcing {payloads:?} failed (receivers will poll): {}", err.into_store());
        }
    }
}

/// Listens on the channel and wakes the receivers of each queue named in a
/// notification (`<origin> <queue>`, or a bare queue name from a
/// transaction of the application's own), except this store's own; notes
/// every other process heard, and answers hellos. When the connection
/// drops, wakes everyone (what was sent meanwhile was not announced) and
/// listens again, saying hello again.
async fn listen(pool: PgPool, channel: Arc<Channel>, wakers: Arc<Wakers>, peers: Arc<Peers>, says: mpsc::UnboundedSender<Say>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        if pool.is_closed() {
            return;
        }
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(err) => {
                tracing::warn!("postgres store: cannot open the listening connection: {err}; retrying in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        if let Err(err) = listener.listen(&channel.name).await {
            tracing::warn!("postgres store: LISTEN {} failed: {err}; retrying in {backoff:?}", channel.name);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
            continue;
        }
        backoff = Duration::from_millis(50);
        peers.listening();
        let _ = says.send(Say::Hello);
        wakers.wake_all();
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => match notification.payload().split_once(' ') {
                    Some((from, _)) if from == channel.origin => {}
                    Some((_, said)) => {
                        peers.heard();
                        match said {
                            HELLO => {
                                let _ = says.send(Say::Here);
                            }
                            HERE => {}
                            queue => wakers.wake(queue),
                        }
                    }
                    None => wakers.wake(notification.payload()),
                },
                // The connection dropped: listen again on a new one, and
                // say hello again (whoever started meanwhile was not heard).
                Ok(None) => {
                    peers.deaf();
                    wakers.wake_all();
                    break;
                }
                Err(_) if pool.is_closed() => return,
                Err(err) => {
                    tracing::warn!("postgres store: listening connection failed: {err}");
                    peers.deaf();
                    wakers.wake_all();
                    tokio::time::sleep(backoff).await;
                    break;
                }
            }
        }
    }
}
