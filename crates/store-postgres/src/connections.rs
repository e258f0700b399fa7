//! The connections the store's hot paths run on: kept checked out of the
//! pool between operations.
//!
//! sqlx's pool pings a connection when it goes back to the pool, and (with
//! its default settings) again when it is taken out: two round trips, each
//! waking the server's backend, around every statement of ours, which are
//! one round trip each. Measured on workload W, the pings were a third of
//! the round trips the server answered. So a connection that finished its
//! operation cleanly waits here for the next one instead, most recently
//! used first, and goes back to the pool (pinged then) only when:
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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
use tokio::sync::Notify;
use tokio::time::Instant;

use rota_store::Error;

use crate::{Fail, Result};

/// How long a connection stays out of the pool before it goes back.
pub(crate) const KEEP_MAX: Duration = Duration::from_secs(60);

/// Connections waiting between operations, over the pool they came from.
pub(crate) struct Connections {
    pool: PgPool,
    acquire_timeout: Duration,
    idle: Mutex<Vec<(PoolConnection<Postgres>, Instant)>>,
    /// Told whenever a connection starts waiting here, for an operation
    /// that found none (it would otherwise wait on the pool for one that
    /// never goes back there), and when taking one from the pool failed.
    returned: Notify,
    /// Whether a connection is being taken from the pool (see `grow`).
    growing: AtomicBool,
    /// How many times taking a connection from the pool failed, and why
    /// it last did.
    failures: AtomicU64,
    last_failure: Mutex<String>,
}

impl Connections {
    pub(crate) fn new(pool: PgPool, acquire_timeout: Duration) -> Arc<Connections> {
        Arc::new(Connections {
            pool,
            acquire_timeout,
            idle: Mutex::new(Vec::new()),
            returned: Notify::new(),
            growing: AtomicBool::new(false),
            failures: AtomicU64::new(0),
            last_failure: Mutex::new(String::new()),
        })
    }

    /// A connection: the one that finished last; when every one is busy,
    /// whichever comes first of one finishing and one more from the pool.
    /// Waits at most the acquire timeout.
    pub(crate) async fn acquire(self: &Arc<Self>) -> Result<Connection> {
        let deadline = Instant::now() + self.acquire_timeout;
        let failures = self.failures.load(Ordering::Acquire);
        loop {
            let returned = self.returned.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            if let Some((conn, taken_at)) = self.lock().pop() {
                return Ok(Connection { conn: Some(conn), taken_at, home: self.clone() });
            }
            if self.failures.load(Ordering::Acquire) != failures {
                let why = self.last_failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
                return Err(Error::Unavailable(why).into());
            }
            self.grow();
            if tokio::time::timeout_at(deadline, returned).await.is_err() {
                return Err(Error::Unavailable(format!(
                    "postgres: no connection free within {:?} (every one of the {} is busy)",
                    self.acquire_timeout,
                    self.pool.options().get_max_connections()
                ))
                .into());
            }
        }
    }

    /// Takes one more connection from the pool, in a task of its own, unless
    /// one is on its way already. Its own task, so that an operation served
    /// meanwhile by a connection that finished does not abandon it halfway:
    /// an abandoned connect is a server process forked for nothing, and a
    /// busy store would fork one for most operations.
    fn grow(self: &Arc<Self>) {
        // Every connection the pool may open is out: one finishing will do.
        let full = self.pool.size() >= self.pool.options().get_max_connections() && self.pool.num_idle() == 0;
        if full || self.growing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let got = this.pool.acquire().await;
            this.growing.store(false, Ordering::Release);
            match got {
                Ok(conn) => {
                    this.lock().push((conn, Instant::now()));
                    this.returned.notify_one();
                }
                Err(err) => {
                    *this.last_failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = format!("postgres: {err}");
                    this.failures.fetch_add(1, Ordering::AcqRel);
                    this.returned.notify_waiters();
                }
            }
        });
    }

    /// The pool the connections come from.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Sends every waiting connection back to the pool.
    pub(crate) fn release_all(&self) {
        let waiting = std::mem::take(&mut *self.lock());
        drop(waiting);
        self.returned.notify_waiters();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(PoolConnection<Postgres>, Instant)>> {
        self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A connection taken for one operation. Dropped, it goes back to the pool;
/// [`Connection::finished`] keeps it for the next operation instead.
pub(crate) struct Connection {
    conn: Option<PoolConnection<Postgres>>,
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
                self.home.returned.notify_one();
            }
            _ => {
                self.home.lock().push((conn, self.taken_at));
                self.home.returned.notify_one();
            }
        }
    }
}

impl Drop for Connection {
    /// Not finished: the operation was abandoned halfway, and the
    /// connection may still owe a reply. The pool's ping drains it.
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            drop(conn);
            self.home.returned.notify_one();
        }
    }
}

impl std::ops::Deref for Connection {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn.as_ref().expect("a connection until finished")
    }
}

impl std::ops::DerefMut for Connection {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("a connection until finished")
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
