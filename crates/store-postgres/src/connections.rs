//! The connections the store's hot paths run on: kept checked out of the
//! pool between operations.
//!
//! sqlx's pool pings a connection when it goes back to the pool, and (with
//! its default settings) again when it is taken out: two round trips, each
//! waking the server's backend, around every statement of ours, which are
//! one round trip each. Measured on workload W, the pings were a third of
//! the round trips the server answered. So a connection that finished its
//! operation cleanly goes to the operation that has waited longest for one,
//! or, when none waits, waits here for the next one (most recently used
//! first), and goes back to the pool (pinged then) only when:
//!
//! - its operation failed for a reason other than an error the server
//!   raised (a lost connection, a timeout): then every connection waiting
//!   here goes back too, since a server restart or a network cut takes all
//!   of them, and the pool's ping sorts the live from the dead;
//! - its operation was abandoned halfway (the future was dropped): the
//!   connection may still owe a reply, and the pool's ping drains it;
//! - it has been out of the pool for [`KEEP_MAX`], so that the pool's
//!   lifetime and idle limits still apply.
//!
//! The pool still bounds the connections (`connections_max`): one waiting
//! here counts as taken. So every one of the store's own operations takes
//! its connection here, never from the pool directly (which would wait for
//! connections that only come back here), and applications get a pool of
//! their own (`PgStore::pool`).
//!
//! Waiting operations are served in the order they came: a finished
//! connection is handed to the oldest of them, not left for whoever asks
//! next (a busy task asks again at once, before the woken one runs, and
//! would keep a connection to itself until the others time out). Whether
//! another connection can come from the pool is judged on the count of
//! connections the store holds, kept by a drop guard, never on the pool's
//! own figures: those count a connection still on its way back to the pool
//! (sqlx pings it in a task of its own first) as busy, and the store would
//! wait for it to finish an operation it is not running.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
use tokio::sync::oneshot;
use tokio::time::Instant;

use rota_store::Error;

use crate::{Fail, Result};

/// How long a connection stays out of the pool before it goes back.
pub(crate) const KEEP_MAX: Duration = Duration::from_secs(60);

/// Connections waiting between operations, and operations waiting for a
/// connection, over the pool the connections came from.
pub(crate) struct Connections {
    pool: PgPool,
    acquire_timeout: Duration,
    state: Mutex<State>,
    /// How many connections the store holds out of the pool: waiting here,
    /// running an operation, or handed to a waiting operation.
    held: Arc<AtomicU32>,
    /// Whether a connection is being taken from the pool (see `grow`).
    growing: AtomicBool,
}

#[derive(Default)]
struct State {
    /// Connections no operation runs on, with the time each left the pool.
    /// Only while no operation waits: a finished connection goes to a
    /// waiting operation first.
    idle: Vec<(Held, Instant)>,
    /// Operations waiting for a connection, oldest first.
    waiters: VecDeque<Waiter>,
    next_waiter: u64,
}

/// What a waiting operation is handed: a connection and the time it left
/// the pool, or why none could be taken from the pool.
type Handed = std::result::Result<(Held, Instant), String>;

struct Waiter {
    id: u64,
    hand: oneshot::Sender<Handed>,
}

/// A connection out of the pool, counted in [`Connections::held`] until it
/// is dropped (and so goes back to the pool).
struct Held {
    conn: PoolConnection<Postgres>,
    held: Arc<AtomicU32>,
}

impl Held {
    fn new(conn: PoolConnection<Postgres>, held: &Arc<AtomicU32>) -> Held {
        held.fetch_add(1, Ordering::AcqRel);
        Held { conn, held: held.clone() }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.held.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Connections {
    pub(crate) fn new(pool: PgPool, acquire_timeout: Duration) -> Arc<Connections> {
        Arc::new(Connections {
            pool,
            acquire_timeout,
            state: Mutex::new(State::default()),
            held: Arc::new(AtomicU32::new(0)),
            growing: AtomicBool::new(false),
        })
    }

    /// A connection: the one that finished last; when every one is busy,
    /// whichever comes first of one finishing (handed to the operations in
    /// the order they asked) and one more from the pool. Waits at most the
    /// acquire timeout.
    pub(crate) async fn acquire(self: &Arc<Self>) -> Result<Connection> {
        let deadline = Instant::now() + self.acquire_timeout;
        let mut waiting = {
            let mut state = self.lock();
            if let Some((conn, taken_at)) = state.idle.pop() {
                return Ok(Connection { conn: Some(conn), taken_at, home: self.clone() });
            }
            let (hand, handed) = oneshot::channel();
            let id = state.next_waiter;
            state.next_waiter += 1;
            state.waiters.push_back(Waiter { id, hand });
            Waiting { home: self, id, handed }
        };
        self.grow();
        match tokio::time::timeout_at(deadline, &mut waiting.handed).await {
            Ok(Ok(Ok((conn, taken_at)))) => Ok(Connection { conn: Some(conn), taken_at, home: self.clone() }),
            Ok(Ok(Err(why))) => Err(Error::Unavailable(why).into()),
            // The sender went without a word: only when the store is gone.
            Ok(Err(_)) => Err(Error::Unavailable("postgres: the store is closing".into()).into()),
            Err(_) => Err(Error::Unavailable(format!(
                "postgres: no connection free within {:?} (every one of the {} is busy)",
                self.acquire_timeout,
                self.pool.options().get_max_connections()
            ))
            .into()),
        }
    }

    /// Takes one more connection from the pool, in a task of its own, when
    /// an operation waits, the store holds fewer than the pool may open and
    /// none is on its way already. Its own task, so that an operation served
    /// meanwhile by a connection that finished does not abandon it halfway:
    /// an abandoned connect is a server process forked for nothing, and a
    /// busy store would fork one for most operations. The pool's acquire
    /// also waits for a connection on its way back to the pool.
    fn grow(self: &Arc<Self>) {
        if self.lock().waiters.is_empty() {
            return;
        }
        // Every connection the pool may open is the store's: one finishing
        // will be handed on.
        if self.held.load(Ordering::Acquire) >= self.pool.options().get_max_connections() {
            return;
        }
        if self.growing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let got = this.pool.acquire().await;
            match got {
                Ok(conn) => this.give(Held::new(conn, &this.held), Instant::now()),
                Err(err) => this.fail_waiters(&format!("postgres: {err}")),
            }
            this.growing.store(false, Ordering::Release);
            // More operations may wait than the one this connection served.
            this.grow();
        });
    }

    /// Hands `conn` to the oldest operation still waiting, or keeps it for
    /// the next one.
    fn give(&self, mut conn: Held, taken_at: Instant) {
        let mut state = self.lock();
        while let Some(waiter) = state.waiters.pop_front() {
            let Err(unsent) = waiter.hand.send(Ok((conn, taken_at))) else { return };
            // That operation stopped waiting: the next one.
            (conn, _) = unsent.expect("what was sent was a connection");
        }
        state.idle.push((conn, taken_at));
    }

    /// Taking a connection from the pool failed: every operation waiting
    /// fails with `why` (the server is unreachable; the next operation
    /// tries again).
    fn fail_waiters(&self, why: &str) {
        let waiters = std::mem::take(&mut self.lock().waiters);
        for waiter in waiters {
            let _ = waiter.hand.send(Err(why.to_owned()));
        }
    }

    /// The pool the connections come from.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Sends every waiting connection back to the pool.
    pub(crate) fn release_all(self: &Arc<Self>) {
        let waiting = std::mem::take(&mut self.lock().idle);
        drop(waiting);
        self.grow();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// An operation's place in the line. Dropped (served, timed out or
/// abandoned), it leaves the line, and a connection handed to it meanwhile
/// goes to the next operation.
struct Waiting<'a> {
    home: &'a Arc<Connections>,
    id: u64,
    handed: oneshot::Receiver<Handed>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.home.lock().waiters.retain(|waiter| waiter.id != self.id);
        if let Ok(Ok((conn, taken_at))) = self.handed.try_recv() {
            self.home.give(conn, taken_at);
        }
    }
}

/// A connection taken for one operation. Dropped, it goes back to the pool;
/// [`Connection::finished`] keeps it for the next operation instead.
pub(crate) struct Connection {
    conn: Option<Held>,
    taken_at: Instant,
    home: Arc<Connections>,
}

impl Connection {
    /// The operation ended with `outcome`: keep the connection for the next
    /// one, unless the outcome says the connection may be broken.
    pub(crate) fn finished<T>(self, outcome: &Result<T>) {
        self.finished_with(outcome.as_ref().err());
    }

    /// [`Connection::finished`], for an operation whose failure, if any, is
    /// `failure`.
    pub(crate) fn finished_with(mut self, failure: Option<&Fail>) {
        let Some(conn) = self.conn.take() else { return };
        match failure {
            Some(fail) if !fail.leaves_connection_usable() => {
                drop(conn);
                self.home.release_all();
            }
            _ if self.taken_at.elapsed() >= KEEP_MAX || self.home.pool.is_closed() => {
                drop(conn);
                // An operation waiting here can take it from the pool now.
                self.home.grow();
            }
            _ => self.home.give(conn, self.taken_at),
        }
    }
}

impl Drop for Connection {
    /// Not finished: the operation was abandoned halfway, and the
    /// connection may still owe a reply. The pool's ping drains it.
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            drop(conn);
            self.home.grow();
        }
    }
}

impl std::ops::Deref for Connection {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn.as_ref().expect("a connection until finished").conn
    }
}

impl std::ops::DerefMut for Connection {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn.as_mut().expect("a connection until finished").conn
    }
}

impl Fail {
    /// Whether the connection an operation failed on can run the next one:
    /// the failure was an error the server raised (the connection is at a
    /// statement boundary) or one of the store's own, not a lost connection,
    /// a timeout or a protocol error.
    fn leaves_connection_usable(&self) -> bool {
        match self {
            Fail::Store(_) => true,
            Fail::Sql(sqlx::Error::Database(_) | sqlx::Error::RowNotFound) => true,
            Fail::Sql(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use sqlx::postgres::PgPoolOptions;

    use super::Connections;

    /// A finished connection goes to the operation that waited longest, even
    /// when the one that finished asks again at once (on a single-threaded
    /// runtime the woken waiter has not run yet then): taking it back would
    /// starve the waiter until its acquire timed out.
    #[tokio::test]
    async fn a_finished_connection_goes_to_the_operation_that_waited_longest() {
        let Some(url) = rota_testkit::postgres::url("fair connection hand-over on PostgreSQL") else { return };
        let pool = PgPoolOptions::new().max_connections(1).connect_lazy(&url).unwrap();
        let connections = Connections::new(pool, Duration::from_secs(5));
        let served = Arc::new(Mutex::new(Vec::new()));
        let first = connections.acquire().await.unwrap();
        let waiter = tokio::spawn({
            let (connections, served) = (connections.clone(), served.clone());
            async move {
                let conn = connections.acquire().await.unwrap();
                served.lock().unwrap().push("the waiter");
                conn.finished_with(None);
            }
        });
        while connections.lock().waiters.is_empty() {
            tokio::task::yield_now().await;
        }
        first.finished_with(None);
        let again = connections.acquire().await.unwrap();
        served.lock().unwrap().push("the one that finished");
        again.finished_with(None);
        waiter.await.unwrap();
        assert_eq!(*served.lock().unwrap(), ["the waiter", "the one that finished"]);
    }
}
