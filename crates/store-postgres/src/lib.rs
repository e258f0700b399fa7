//! rota's Store on PostgreSQL: many processes on many machines sharing one
//! database.
//!
//! Every operation is one short transaction on a pooled connection. Claims
//! of messages and tasks are single statements with `FOR UPDATE SKIP
//! LOCKED`, so competing consumers never wait on each other's rows; state
//! changes are fenced updates (the row must still have the state and epoch
//! the writer read). PostgreSQL's own group commit shares fsyncs between
//! concurrent transactions, so there is no writer thread as on SQLite.
//!
//! Waiting receivers are woken at once by a send in their own process, and
//! by `LISTEN`/`NOTIFY` across processes: after a send commits, the store
//! announces the queue on its channel, if another process listens there
//! (see `announce`), and one listening connection per process wakes that
//! queue's receivers. They also re-check every `poll_interval` for what no
//! notification announces (delays running out, expired leases) and after the
//! listening connection was lost.
//!
//! Times come from the injected clock and are bound as parameters; SQL never
//! calls `now()`, so both backends behave alike under a manual clock.
//!
//! Connection loss: the pool reconnects on the next operation. An operation
//! whose connection broke fails with [`Error::Unavailable`] and nothing it
//! did is kept, except a commit whose acknowledgement was lost: that one
//! may have landed, which every caller already handles (a retried fenced
//! write then finds its own change and reports a lost race).
//!
//! Deliberately left out: SQL outside this crate, and `now()` in SQL.

mod announce;
use announce::EmptyLook;
mod audit_sql;
mod batch_sql;
mod commit_sql;
mod connections;
mod group_commit;
mod handoff;
mod nodelay;
mod params;
#[cfg(test)]
mod plans;
mod prune_sql;
pub use group_commit::CommitCounts;
mod queue_sql;
mod schedule_sql;
mod schema;
mod sql;
mod task_sql;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rota_model::{Clock, InstanceId, LeaseToken, MessageId, QueueName, ScheduleName, Task, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{
    AuditEntry, AuditFilter, Backlog, BatchProgress, BatchRecord, BreakerAdmission, BreakerAsk, BreakerReport, Changes, Claim,
    ComponentStatus, Created, DeadLetter, DeadLetterFilter, DeadLetterPage, Delivery, Error, Event, Expired, InstanceSweep, LeaderLease,
    NewAudit, NewBatch, NewSchedule, NewTask, Outgoing, Prune, Pruned, QueueConfig, QueueStats, Queues, RateRequest, RateSlot, Receive,
    Redrive, ScheduleProgress, ScheduleRecord, Sent, SharedBreaker, Store, Swept, TaskFilter, TaskRecord, Tasks, Warning, WorkflowEntry,
    WorkflowPause,
};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::sql::Names;

/// How often a transaction that lost a deadlock or serialization race is run again.
const TRANSACTION_TRIES_MAX: u32 = 5;

/// How many expired message ids one sweep forgets.
const ID_SWEEP_MAX: u32 = 1_000;

/// Settings of a PostgreSQL store. Every bound is named here.
#[derive(Debug, Clone)]
pub struct Config {
    /// The connection URL (`postgres://user@host:port/database`).
    pub url: String,
    /// The PostgreSQL schema that holds rota's tables (created if missing).
    pub schema: String,
    /// The most connections this process opens (plus one for listening).
    pub connections_max: u32,
    /// How long an operation waits for a free connection, or for a new one
    /// while the server is unreachable, before failing as unavailable.
    pub acquire_timeout: Duration,
    /// How often waiting receivers re-check for work no notification
    /// announces (delays running out, expired leases).
    pub poll_interval: Duration,
    /// The largest message body accepted, in bytes.
    pub body_bytes_max: usize,
    /// How often expired duplicate-detection ids are forgotten.
    pub sweep_interval: Duration,
    /// The name the connections show in `pg_stat_activity`.
    pub application_name: String,
    /// The most commits applied together in one statement (group commit).
    pub commit_batch_max: usize,
    /// The most commit and task-creation statements running at once (never
    /// more than `connections_max`): what arrives while all are running
    /// waits and goes out together in the next. Two by default: on workload
    /// W (two cores) 2, 3, 4 and 6 gave medians of 1,190, 1,055, 912 and 854
    /// workflows/s (three to six interleaved runs each): fewer, fuller
    /// statements leave the server more of its CPU.
    pub commits_in_flight: usize,
    /// How long a commit that returned before its flush (an agent's reply
    /// handed to a Scheduler of this process) waits for a later commit to
    /// flush it before a statement of its own does. The Scheduler's next
    /// commit, the usual one, comes within a statement's time.
    pub follow_up_wait: Duration,
    /// Below this many matches of a time range, a task listing reads that
    /// range's own index and sorts what it finds; from it on, it walks the
    /// tasks newest first and tests each. The default suits pages of a
    /// hundred on ten million tasks.
    pub sparse_matches_max: u32,
}

impl Config {
    /// The default [`Config::follow_up_wait`].
    pub const FOLLOW_UP_WAIT_DEFAULT: Duration = Duration::from_millis(5);
    /// The longest [`Config::follow_up_wait`].
    pub const FOLLOW_UP_WAIT_MAX: Duration = Duration::from_secs(1);

    /// Defaults for the database at `url`, in schema `rota`.
    pub fn new(url: impl Into<String>) -> Self {
        Config {
            url: url.into(),
            schema: "rota".into(),
            connections_max: 16,
            acquire_timeout: Duration::from_secs(5),
            poll_interval: Duration::from_millis(100),
            body_bytes_max: rota_store::BODY_BYTES_MAX,
            sweep_interval: Duration::from_secs(10),
            application_name: "rota".into(),
            commit_batch_max: 64,
            commits_in_flight: 2,
            follow_up_wait: Self::FOLLOW_UP_WAIT_DEFAULT,
            sparse_matches_max: task_sql::SPARSE_MATCHES_MAX,
        }
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::Invalid(format!("postgres store config: {what}")));
        if let Err(why) = sql::check_schema(&self.schema) {
            return bad(why);
        }
        if self.connections_max == 0 || self.connections_max > 1_000 {
            return bad(format!("connections_max must be between 1 and 1000, got {}", self.connections_max));
        }
        if self.poll_interval < Duration::from_millis(1) {
            return bad("poll_interval must be at least 1 ms".into());
        }
        if self.body_bytes_max == 0 {
            return bad("body_bytes_max must be at least 1".into());
        }
        if self.commit_batch_max == 0 || self.commit_batch_max > COMMIT_BATCH_LIMIT {
            return bad(format!("commit_batch_max must be between 1 and {COMMIT_BATCH_LIMIT}, got {}", self.commit_batch_max));
        }
        if self.commits_in_flight == 0 || self.commits_in_flight > 1_000 {
            return bad(format!("commits_in_flight must be between 1 and 1000, got {}", self.commits_in_flight));
        }
        if self.follow_up_wait > Self::FOLLOW_UP_WAIT_MAX {
            return bad(format!("follow_up_wait must be at most 1 s, got {:?}", self.follow_up_wait));
        }
        if self.sweep_interval < Duration::from_millis(10) {
            return bad("sweep_interval must be at least 10 ms".into());
        }
        Ok(())
    }

    /// The URL without its password, for messages.
    fn display_url(&self) -> String {
        match PgConnectOptions::from_str(&self.url) {
            Ok(options) => {
                format!(
                    "postgres://{}@{}:{}/{}",
                    options.get_username(),
                    options.get_host(),
                    options.get_port(),
                    options.get_database().unwrap_or("")
                )
            }
            Err(_) => "the configured postgres URL".into(),
        }
    }

    fn connect_options(&self) -> Result<PgConnectOptions, Error> {
        let options =
            PgConnectOptions::from_str(&self.url).map_err(|e| Error::Invalid(format!("postgres URL {}: {e}", self.display_url())))?;
        Ok(options.application_name(&self.application_name).options(PLANNER_SETTINGS))
    }
}

/// The largest `commit_batch_max`: a statement's arrays stay far below
/// PostgreSQL's limits on parameters and memory.
pub const COMMIT_BATCH_LIMIT: usize = 1_000;

/// The planner settings of every pooled connection.
///
/// The store runs a handful of statements, each prepared once per
/// connection and every one of them meant to reach its rows through an
/// index: keys, leases, deadlines. PostgreSQL's own choice goes wrong for
/// them in two ways. Left to choose, it plans the array-driven statements
/// (`unnest` of the parameters) afresh at every execution, because a custom
/// plan for one row always looks cheaper than the generic plan for ten, and
/// planning the commit statement costs twice its execution. And a generic
/// plan is made once, on the statistics of the moment: made while a table is
/// new and nearly empty, it hash-joins over a sequential scan and keeps doing
/// so as the table grows, until an ANALYZE happens to invalidate it (measured:
/// the commit took 0.96 ms instead of 0.24 ms after 2,000 tasks). So every
/// statement is planned once per connection, generically, with sequential
/// scans and hash or merge joins priced out: index scans and nested loops
/// whatever the statistics say. Bitmap scans too: a receive planned with one
/// read every visible message of its queue and sorted them for the oldest
/// few (8.7 ms with 10,000 waiting, against 1.0 ms walking the index in
/// order), and whether a connection got that plan depended on the statistics
/// when it first ran the receive. JIT compilation is off: it never pays for
/// statements this short, and the priced-out scans would trigger it. So are
/// parallel plans: the price of a scan that was priced out can make
/// splitting it across workers look worth it, and a generic plan with a
/// Gather node would start worker processes at every execution of a
/// statement that reads a few rows.
///
/// Which index a generic plan takes is settled on the statistics of its
/// moment too. On a new, empty table an index that leads with a column the
/// statement merely checks (a task's state, a message's queue) costs as
/// little as the key: plans made then found a task written by its state,
/// walking every task in that state, and a message completed by its queue,
/// walking the queue. So a statement that finds its rows by key tests the
/// rest of its condition as one expression, `(…) IS TRUE`, which no index
/// can serve (checked in `plans`).
const PLANNER_SETTINGS: [(&str, &str); 7] = [
    ("plan_cache_mode", "force_generic_plan"),
    ("enable_seqscan", "off"),
    ("enable_bitmapscan", "off"),
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
    ("jit", "off"),
    ("max_parallel_workers_per_gather", "0"),
];

/// What a store function can fail with: a domain error it decided, or a
/// driver error still to be classified (some of which retry the transaction).
#[derive(Debug)]
pub(crate) enum Fail {
    Store(Error),
    Sql(sqlx::Error),
}

impl From<Error> for Fail {
    fn from(err: Error) -> Self {
        Fail::Store(err)
    }
}

impl From<sqlx::Error> for Fail {
    fn from(err: sqlx::Error) -> Self {
        Fail::Sql(err)
    }
}

pub(crate) type Result<T, E = Fail> = std::result::Result<T, E>;

impl Fail {
    /// Whether PostgreSQL aborted the transaction to break a deadlock or a
    /// serialization conflict, so running it again is safe and likely to pass.
    fn is_transient(&self) -> bool {
        match self {
            Fail::Sql(sqlx::Error::Database(db)) => matches!(db.code().as_deref(), Some("40P01" | "40001")),
            _ => false,
        }
    }

    /// Whether the server refused the statement for what it did (an error
    /// it raised, not a lost connection or a pool timeout): the outcome is
    /// known, nothing was written.
    fn is_refused_by_server(&self) -> bool {
        matches!(self, Fail::Sql(sqlx::Error::Database(_)))
    }

    fn into_store(self) -> Error {
        match self {
            Fail::Store(err) => err,
            Fail::Sql(err) => classify(err),
        }
    }
}

/// Maps a driver error onto the store's classes: whatever a reconnect or a
/// wait may cure is `Unavailable`, the rest is `Backend`.
fn classify(err: sqlx::Error) -> Error {
    match &err {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_) => {
            Error::Unavailable(format!("postgres: {err}"))
        }
        sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => Error::Closed,
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            // 08: connection exceptions; 53: insufficient resources; 57P: the
            // server is shutting down or restarting; 40: a lost race that
            // exhausted its retries.
            if code.starts_with("08") || code.starts_with("53") || code.starts_with("57P") || code.starts_with("40") {
                Error::Unavailable(format!("postgres ({code}): {err}"))
            } else {
                Error::Backend(format!("postgres ({code}): {err}"))
            }
        }
        _ => Error::Backend(format!("postgres: {err}")),
    }
}

/// Runs `$body` in a transaction on a pooled connection bound to `$tx`,
/// committing when it returns `Ok`; runs it again when PostgreSQL aborted it
/// to break a deadlock. Evaluates to `Result<T, store::Error>`.
macro_rules! in_transaction {
    ($store:expr, $tx:ident => $body:block) => {{
        let mut tries = 1_u32;
        loop {
            let attempt: Result<_> = async {
                let mut conn = $store.connections.acquire().await?;
                let outcome: Result<_> = async {
                    let mut $tx = sqlx::Connection::begin(&mut *conn).await?;
                    let value = $body;
                    $tx.commit().await?;
                    Ok(value)
                }
                .await;
                conn.finished(&outcome);
                outcome
            }
            .await;
            match attempt {
                Err(fail) if fail.is_transient() && tries < TRANSACTION_TRIES_MAX => tries += 1,
                other => break other.map_err(Fail::into_store),
            }
        }
    }};
}

/// Runs `$body` with a pooled connection bound to `$conn`, outside any
/// transaction (each statement commits on its own).
macro_rules! with_connection {
    ($store:expr, $conn:ident => $body:block) => {{
        let attempt: Result<_> = async {
            let mut $conn = $store.connections.acquire().await?;
            let outcome: Result<_> = async { Ok($body) }.await;
            $conn.finished(&outcome);
            outcome
        }
        .await;
        attempt.map_err(Fail::into_store)
    }};
}

/// The background futures of one store, stopped when it is dropped.
struct Background(Vec<JoinHandle<()>>);

impl Drop for Background {
    fn drop(&mut self) {
        for handle in &self.0 {
            handle.abort();
        }
    }
}

/// rota's Store on PostgreSQL.
pub struct PgStore {
    /// The applications' pool ([`PgStore::pool`]), apart from the store's.
    app_pool: PgPool,
    /// The pool's connections kept between operations (see `connections`).
    connections: Arc<connections::Connections>,
    names: Arc<Names>,
    channel: String,
    clock: Arc<dyn Clock>,
    config: Config,
    /// Wakes receivers after a send: this process's, and others' through
    /// NOTIFY (see `announce`).
    announcer: announce::Announcer,
    /// Queue ids by name. A queue is never deleted and its id never
    /// changes, so an entry never goes stale.
    queue_ids: Mutex<HashMap<QueueName, i64>>,
    /// Commits and task creations waiting for their batch (see `group_commit`).
    commits: mpsc::UnboundedSender<group_commit::Job>,
    commit_stats: Arc<group_commit::CommitStats>,
    /// Receivers waiting in this process, for sends to hand messages to.
    waiting: Arc<handoff::Waiting>,
    give_back: handoff::GiveBack,
    _background: Background,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("url", &self.config.display_url()).field("schema", &self.config.schema).finish()
    }
}

/// The server's durability settings, as it reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
    /// `server_version`.
    pub version: String,
    /// `synchronous_commit`: `on` means a commit is acknowledged after its WAL is flushed.
    pub synchronous_commit: String,
    /// `fsync`: `on` means flushes reach the disk.
    pub fsync: String,
    /// `autovacuum`: `off` leaves dead rows until a manual VACUUM.
    pub autovacuum: String,
    /// The TLS protocol and cipher of the store's connection (from
    /// `pg_stat_ssl`), or `None` when it does not use TLS.
    pub tls: Option<String>,
}

impl ServerSettings {
    /// Whether an acknowledged commit survives a process crash and a power loss.
    pub fn survives_power_loss(&self) -> bool {
        matches!(self.synchronous_commit.as_str(), "on" | "remote_apply" | "remote_write" | "local") && self.fsync == "on"
    }
}

/// The schema versions before and after [`PgStore::migrate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migrated {
    /// The version found.
    pub from: i64,
    /// The version now.
    pub to: i64,
}

/// A pool of up to `connections` whose every new connection has Nagle's
/// algorithm off (see `nodelay`).
fn pool_options(config: &Config, connections: u32) -> Result<PgPoolOptions, Error> {
    let port = config.connect_options()?.get_port();
    Ok(PgPoolOptions::new().max_connections(connections).acquire_timeout(config.acquire_timeout).after_connect(move |_, _| {
        Box::pin(async move {
            nodelay::set_on_sockets_to(port);
            Ok(())
        })
    }))
}

impl PgStore {
    /// Connects, runs the migrations that have not run yet, and starts
    /// listening for sends. Every operation reads "now" from `clock`.
    pub async fn open(config: Config, clock: Arc<dyn Clock>) -> Result<PgStore, Error> {
        config.validate()?;
        let names = Arc::new(Names::new(&config.schema));
        let pool = pool_options(&config, config.connections_max)?.connect_lazy_with(config.connect_options()?);
        {
            let mut conn =
                pool.acquire().await.map_err(|e| Error::Unavailable(format!("cannot connect to {}: {e}", config.display_url())))?;
            Self::migrate_on(&mut conn, &names, &config).await?;
        }
        let channel = format!("rota_{}", config.schema);
        let connections = connections::Connections::new(pool.clone(), config.acquire_timeout);
        let sweeper = tokio::spawn(sweep(connections.clone(), names.clone(), clock.clone(), config.sweep_interval));
        // Notifications carry their origin, so that the listener skips this
        // store's own: its receivers were woken at the commit already.
        let origin = uuid::Uuid::new_v4().simple().to_string();
        // The listener holds its connection for good, so it gets one of its
        // own: taken from the pool, it would leave `connections_max - 1`
        // for the work (none at all with one connection).
        let listening = pool_options(&config, 1)?.connect_lazy_with(config.connect_options()?);
        let (announcer, announcing, listener) =
            announce::start(connections.clone(), listening, announce::Channel { name: channel.clone(), origin });
        let (commits, queued) = mpsc::unbounded_channel();
        let commit_stats = Arc::new(group_commit::CommitStats::default());
        let give_back = handoff::GiveBack { connections: connections.clone(), names: names.clone(), clock: clock.clone() };
        let waiting = Arc::new(handoff::Waiting::default());
        let committer = group_commit::Committer {
            connections: connections.clone(),
            names: names.clone(),
            clock: clock.clone(),
            stats: commit_stats.clone(),
            waiting: waiting.clone(),
            give_back: give_back.clone(),
            flushes: Arc::new(group_commit::Flushes::default()),
            follow_up_wait: config.follow_up_wait,
        };
        let group_committer = tokio::spawn(group_commit::run(
            committer,
            config.commit_batch_max,
            config.commits_in_flight.min(config.connections_max as usize),
            queued,
        ));
        let app_pool = pool_options(&config, config.connections_max)?.connect_lazy_with(config.connect_options()?);
        Ok(PgStore {
            app_pool,
            connections,
            names,
            channel,
            clock,
            config,
            announcer,
            queue_ids: Mutex::new(HashMap::new()),
            commits,
            commit_stats,
            waiting,
            give_back,
            _background: Background(vec![listener, sweeper, announcing, group_committer]),
        })
    }

    /// How many commits this store ran, and in how many statements.
    pub fn commit_counts(&self) -> CommitCounts {
        self.commit_stats.snapshot()
    }

    /// Runs the migrations that have not run yet on the database at
    /// `config.url`, without opening a store (`rota migrate`).
    pub async fn migrate(config: &Config) -> Result<Migrated, Error> {
        config.validate()?;
        let names = Names::new(&config.schema);
        let mut conn = <PgConnection as sqlx::Connection>::connect_with(&config.connect_options()?)
            .await
            .map_err(|e| Error::Unavailable(format!("cannot connect to {}: {e}", config.display_url())))?;
        Self::migrate_on(&mut conn, &names, config).await
    }

    async fn migrate_on(conn: &mut PgConnection, names: &Names, config: &Config) -> Result<Migrated, Error> {
        let (from, to) = schema::migrate(conn, names).await.map_err(|e| match classify(e) {
            Error::Backend(why) => Error::Backend(format!("migrating schema {} of {}: {why}", config.schema, config.display_url())),
            other => other,
        })?;
        if from > schema::version() {
            return Err(Error::Unavailable(format!(
                "schema {} of {} has version {from}, newer than this rota knows ({}): upgrade rota",
                config.schema,
                config.display_url(),
                schema::version()
            )));
        }
        Ok(Migrated { from, to })
    }

    /// The configuration the store was opened with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The server's version, durability and autovacuum settings, and the
    /// store connection's TLS, read back from it.
    pub async fn server_settings(&self) -> Result<ServerSettings, Error> {
        with_connection!(self, conn => {
            let (version, synchronous_commit, fsync, autovacuum, tls): (String, String, String, String, Option<String>) = sqlx::query_as(
                "SELECT current_setting('server_version'), current_setting('synchronous_commit'), current_setting('fsync'),
                        current_setting('autovacuum'),
                        (SELECT version || ' ' || cipher FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl)",
            )
            .fetch_one(&mut *conn)
            .await?;
            ServerSettings { version, synchronous_commit, fsync, autovacuum, tls }
        })
    }

    /// The server's data directory, when this user may see it (a superuser
    /// or a member of `pg_read_all_settings`; `pg_settings` hides it from
    /// others): where a benchmark on the same machine finds the server's
    /// processes to measure their CPU time.
    pub async fn data_directory(&self) -> Result<Option<String>, Error> {
        with_connection!(self, conn => {
            sqlx::query_scalar("SELECT setting FROM pg_settings WHERE name = 'data_directory'").fetch_optional(&mut *conn).await?
        })
    }

    /// The bytes the store's tables take on disk, with their indexes and
    /// TOAST: what a benchmark reports as the store's size. Dead rows count
    /// until a vacuum reclaims them.
    pub async fn schema_bytes(&self) -> Result<u64, Error> {
        let schema = self.config.schema.clone();
        let bytes: i64 = with_connection!(self, conn => {
            sqlx::query_scalar(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
                   JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind IN ('r', 'm')",
            )
            .bind(&schema)
            .fetch_one(&mut *conn)
            .await?
        })?;
        Ok(u64::try_from(bytes).unwrap_or(0))
    }

    /// Deletes the store's schema with everything in it, and closes the
    /// store (benchmarks and tests that start from an empty schema).
    pub async fn drop_schema(self) -> Result<(), Error> {
        with_connection!(self, conn => {
            sqlx::query(self.names.raw(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.names.quoted()))).execute(&mut *conn).await?;
        })?;
        self.close_pools().await;
        Ok(())
    }

    async fn close_pools(&self) {
        self.connections.release_all();
        self.connections.pool().close().await;
        self.app_pool.close().await;
    }

    /// A connection pool for applications that run their own statements
    /// beside rota's (see [`PgStore::create_task_in`]): up to
    /// `connections_max` connections of their own, opened when first used,
    /// apart from the store's (which it keeps between its operations).
    pub fn pool(&self) -> &PgPool {
        &self.app_pool
    }

    /// Creates a task inside the caller's own transaction (or on the
    /// caller's connection), so that it commits or rolls back together with
    /// the application's writes: the pattern's "insert the order and its task
    /// state together". If a task with that id exists, writes nothing and
    /// returns it. The task's messages are announced when `conn` commits.
    pub async fn create_task_in(&self, conn: &mut PgConnection, new: NewTask) -> Result<Created, Error> {
        new.check(self.config.body_bytes_max)?;
        self.ensure_queues(&new.messages.iter().map(|(queue, _)| queue).collect::<Vec<_>>()).await?;
        let attempt: Result<Created> = async {
            let (created, sent_to) = self.create_task_on(conn, &new).await?;
            // Only the caller knows when it commits: PostgreSQL delivers a
            // NOTIFY made in the transaction at that moment (or never).
            let queues: Vec<&str> = sent_to.iter().map(QueueName::as_str).collect();
            if !queues.is_empty() {
                queue_sql::notify(conn, &self.channel, &queues).await?;
            }
            Ok(created)
        }
        .await;
        attempt.map_err(Fail::into_store)
    }

    /// Ids for messages that have none: time-ordered UUIDs.
    fn message_id(message: &Outgoing) -> MessageId {
        message.id.clone().unwrap_or_else(|| MessageId::new(uuid::Uuid::now_v7().to_string()).expect("a UUID is a valid message id"))
    }

    /// Creates the queues that `messages` go to and that this process has
    /// not seen yet, with default settings, each in a statement of its own,
    /// before the transaction that sends to them begins: a rollback there
    /// must not take away a queue whose id is already cached (and a queue is
    /// harmless to keep), and a transaction must not wait for a second
    /// pooled connection while it holds one.
    async fn ensure_queues(&self, queues: &[&QueueName]) -> Result<(), Error> {
        let now = self.clock.now();
        for &name in queues {
            if self.cached_queue_id(name).is_some() {
                continue;
            }
            let row = with_connection!(self, conn => { queue_sql::ensure_queue(&mut conn, &self.names, name, now).await? })?;
            self.queue_ids.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(name.clone(), row.id);
        }
        Ok(())
    }

    /// The id of a queue [`PgStore::ensure_queues`] made sure of.
    async fn queue_id(&self, conn: &mut PgConnection, name: &QueueName) -> Result<i64> {
        self.existing_queue_id(conn, name).await?.ok_or_else(|| Error::Backend(format!("queue {name} vanished after its creation")).into())
    }

    /// The id of the queue `name` if it exists (a lease needs no queue creation).
    async fn existing_queue_id(&self, conn: &mut PgConnection, name: &QueueName) -> Result<Option<i64>> {
        if let Some(id) = self.cached_queue_id(name) {
            return Ok(Some(id));
        }
        let Some(row) = queue_sql::find_queue(conn, &self.names, name).await? else { return Ok(None) };
        self.queue_ids.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(name.clone(), row.id);
        Ok(Some(row.id))
    }

    fn cached_queue_id(&self, name: &QueueName) -> Option<i64> {
        self.queue_ids.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(name).copied()
    }

    /// Sends `messages` (grouped by queue, in order). Returns each send's
    /// outcome and the queues that got new messages, to be announced once
    /// the transaction commits.
    async fn send_all(
        &self,
        conn: &mut PgConnection,
        messages: &[(QueueName, Outgoing)],
        ids: &[MessageId],
        leases: &[Option<handoff::Lease>],
        now: Timestamp,
    ) -> Result<(Vec<Sent>, Vec<QueueName>, Vec<handoff::Leased>)> {
        let mut sent = Vec::with_capacity(messages.len());
        let mut sent_to = Vec::new();
        let mut leased = Vec::new();
        let mut start = 0;
        while start < messages.len() {
            let queue = &messages[start].0;
            let end = messages[start..].iter().position(|(q, _)| q != queue).map_or(messages.len(), |offset| start + offset);
            let queue_id = self.queue_id(conn, queue).await?;
            let batch: Vec<(&Outgoing, MessageId)> =
                messages[start..end].iter().zip(&ids[start..end]).map(|((_, m), id)| (m, id.clone())).collect();
            let (outcome, handed) = queue_sql::send(conn, &self.names, queue_id, &batch, &leases[start..end], now).await?;
            if outcome.iter().any(|s| !s.duplicate) && !sent_to.contains(queue) {
                sent_to.push(queue.clone());
            }
            sent.extend(outcome);
            leased.extend(handed);
            start = end;
        }
        Ok((sent, sent_to, leased))
    }

    /// Wakes this process's receivers of `queues` at once and has the other
    /// processes told, if any listens: called after the commit that sent to
    /// them.
    fn announce(&self, queues: Vec<QueueName>) {
        self.announcer.sent(queues);
    }

    async fn create_task_on(&self, conn: &mut PgConnection, new: &NewTask) -> Result<(Created, Vec<QueueName>)> {
        let now = self.clock.now();
        let mut queue_ids = HashMap::new();
        for (queue, _) in &new.messages {
            if !queue_ids.contains_key(queue) {
                queue_ids.insert(queue.clone(), self.queue_id(conn, queue).await?);
            }
        }
        let send_ids: Vec<MessageId> = new.messages.iter().map(|(_, message)| Self::message_id(message)).collect();
        // The caller commits, so nothing is handed over: a receiver handed a
        // message would hold it before it exists for anyone.
        let (created, sent_to, _) = commit_sql::create_tasks(conn, &self.names, &[(new, &send_ids)], &[], &queue_ids, now).await?;
        if !created.is_empty() {
            return Ok((Created::New, sent_to));
        }
        let existing = task_sql::get_task(conn, &self.names, &new.task.id).await?;
        let existing = existing.ok_or_else(|| group_commit::not_created(&new.task))?;
        Ok((Created::Existing(Box::new(existing)), Vec::new()))
    }

    /// One attempt at leasing messages from `queue`: one statement, plus one
    /// per message that ran out of deliveries (dead-lettered under its lease).
    /// Having found nothing, it tells the waiters (see [`Wakers::found_empty`])
    /// when the queue's next message turns visible, unless a wake-up came
    /// while it looked.
    async fn claim(&self, queue: &QueueName, request: &Receive) -> Result<Vec<Delivery>, Error> {
        let now = self.clock.now();
        self.ensure_queues(&[queue]).await?;
        let wakers = self.announcer.wakers();
        // Read before the statement's snapshot is taken: a wake-up after it
        // may announce what the statement did not see.
        let wakes = wakers.wakes(queue.as_str());
        with_connection!(self, conn => {
            let queue_id = self.queue_id(&mut conn, queue).await?;
            let mut deliveries = Vec::new();
            loop {
                let wanted = request.max - deliveries.len() as u32;
                let claimed = queue_sql::claim(&mut conn, &self.names, queue, queue_id, wanted, request, now)
                    .await?;
                if claimed.deliveries.is_empty() && claimed.exhausted.is_empty() && deliveries.is_empty() {
                    wakers.found_empty(queue.as_str(), wakes, EmptyLook { at: now, next_visible: claimed.next_visible });
                }
                deliveries.extend(claimed.deliveries);
                if claimed.exhausted.is_empty() {
                    break;
                }
                for (token, delivered, reason) in &claimed.exhausted {
                    queue_sql::dead_letter_exhausted(&mut conn, &self.names, *token, *delivered, reason, now).await?;
                }
                if deliveries.len() as u32 >= request.max {
                    break;
                }
            }
            deliveries
        })
    }
}

/// Forgets expired duplicate-detection ids every `interval`.
async fn sweep(connections: Arc<connections::Connections>, names: Arc<Names>, clock: Arc<dyn Clock>, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let swept = async {
            let mut conn = connections.acquire().await?;
            let outcome = queue_sql::forget_expired_ids(&mut conn, &names, clock.now(), ID_SWEEP_MAX).await;
            conn.finished(&outcome);
            outcome
        }
        .await;
        if let Err(err) = swept {
            tracing::debug!("postgres store: sweeping expired message ids failed: {}", err.into_store());
        }
    }
}

#[async_trait]
impl Queues for PgStore {
    async fn create_queue(&self, queue: &QueueName, config: QueueConfig) -> Result<(), Error> {
        config.validate()?;
        let now = self.clock.now();
        with_connection!(self, conn => { queue_sql::upsert_queue(&mut conn, &self.names, queue, &config, now, true).await? })
    }

    async fn queue_config(&self, queue: &QueueName) -> Result<Option<QueueConfig>, Error> {
        with_connection!(self, conn => { queue_sql::find_queue(&mut conn, &self.names, queue).await?.map(|q| q.config) })
    }

    async fn send(&self, queue: &QueueName, message: Outgoing) -> Result<Sent, Error> {
        let mut sent = self.send_batch(queue, vec![message]).await?;
        sent.pop().ok_or_else(|| Error::Backend("a send returned no outcome".into()))
    }

    async fn send_batch(&self, queue: &QueueName, messages: Vec<Outgoing>) -> Result<Vec<Sent>, Error> {
        for message in &messages {
            message.check(self.config.body_bytes_max)?;
        }
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let messages: Vec<(QueueName, Outgoing)> = messages.into_iter().map(|m| (queue.clone(), m)).collect();
        let now = self.clock.now();
        self.ensure_queues(&[queue]).await?;
        let ids: Vec<MessageId> = messages.iter().map(|(_, message)| Self::message_id(message)).collect();
        let handoffs = self.waiting.plan(messages.iter().zip(&ids).map(|((queue, message), id)| (queue, message, id)));
        let leases = &handoffs.leases;
        let (sent, sent_to, leased) = if messages.len() == 1 {
            // One statement commits on its own: no BEGIN and COMMIT round trips.
            with_connection!(self, conn => { self.send_all(&mut conn, &messages, &ids, leases, now).await? })?
        } else {
            in_transaction!(self, tx => { self.send_all(&mut tx, &messages, &ids, leases, now).await? })?
        };
        let sent_to = if handoffs.is_empty() {
            sent_to
        } else {
            let queue_ids: HashMap<QueueName, i64> = self.cached_queue_id(queue).map(|id| (queue.clone(), id)).into_iter().collect();
            handoffs.deliver(&leased, &queue_ids, now, &self.give_back);
            handoff::not_all_handed(sent_to, messages.iter().map(|(queue, _)| queue).zip(&ids), &leased, &queue_ids)
        };
        self.announce(sent_to);
        Ok(sent)
    }

    async fn receive(&self, queue: &QueueName, request: Receive) -> Result<Vec<Delivery>, Error> {
        request.validate()?;
        let deadline = tokio::time::Instant::now() + request.wait;
        let waker = self.announcer.wakers().of(queue.as_str());
        let mut first_look = true;
        loop {
            // Register for a wake-up before looking, so that a send
            // committed between the look and the wait is not missed.
            let notified = waker.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // A receive that would wait anyway need not look right after a
            // look that found the queue empty, while nothing woke the queue
            // since, nothing in it is due to turn visible and this process
            // hears the others' announcements: it parks at once, and finds
            // what no one announced at its next poll, as a parked receiver
            // always does. Consumers receive again after every message, so
            // this spares a statement a message.
            let skip = std::mem::take(&mut first_look)
                && !request.wait.is_zero()
                && self.announcer.hears_others()
                && self.announcer.wakers().still_empty(queue.as_str(), self.clock.now(), self.config.poll_interval);
            let got = if skip {
                self.commit_stats.look_skipped();
                Vec::new()
            } else {
                self.claim(queue, &request).await?
            };
            let now = tokio::time::Instant::now();
            if !got.is_empty() || now >= deadline {
                return Ok(got);
            }
            // Wait parked, so that a send from this process hands its
            // messages over directly (see `handoff`).
            let mut ticket = self.waiting.park(queue, &request);
            let wait = (deadline - now).min(self.config.poll_interval);
            tokio::select! {
                handed = &mut ticket.delivered => match handed {
                    Ok(deliveries) if !deliveries.is_empty() => return Ok(deliveries),
                    _ => continue,
                },
                _ = tokio::time::timeout(wait, notified) => {}
            }
            if !ticket.unpark() {
                // A sender took this receiver: its statement is running, and
                // its outcome comes on the ticket.
                if let Ok(deliveries) = (&mut ticket.delivered).await
                    && !deliveries.is_empty()
                {
                    return Ok(deliveries);
                }
            }
        }
    }

    async fn complete(&self, queue: &QueueName, token: LeaseToken) -> Result<(), Error> {
        let now = self.clock.now();
        with_connection!(self, conn => {
            let queue_id = self.existing_queue_id(&mut conn, queue).await?.ok_or_else(|| queue_sql::lease_lost(queue, token))?;
            queue_sql::complete(&mut conn, &self.names, queue, queue_id, token, now).await?
        })
    }

    async fn complete_batch(&self, queue: &QueueName, tokens: &[LeaseToken]) -> Result<Vec<LeaseToken>, Error> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let now = self.clock.now();
        with_connection!(self, conn => {
            match self.existing_queue_id(&mut conn, queue).await? {
                Some(queue_id) => queue_sql::complete_batch(&mut conn, &self.names, queue_id, tokens, now).await?,
                None => tokens.to_vec(),
            }
        })
    }

    async fn abandon(&self, queue: &QueueName, token: LeaseToken, delay: Duration, reason: Option<String>) -> Result<(), Error> {
        let now = self.clock.now();
        in_transaction!(self, tx => {
            let row = queue_sql::leasing_queue(&mut tx, &self.names, queue, token).await?;
            queue_sql::abandon(&mut tx, &self.names, &row, token, delay, reason.as_deref(), now).await?;
        })?;
        if delay.is_zero() {
            self.announce(vec![queue.clone()]);
        } else {
            // Not worth waking anyone, but the message will turn visible
            // sooner than the last look at the queue may say.
            self.announcer.wakers().wake(queue.as_str());
        }
        Ok(())
    }

    async fn renew(&self, queue: &QueueName, token: LeaseToken, lease: Option<Duration>) -> Result<Timestamp, Error> {
        if let Some(lease) = lease {
            QueueConfig { lease, ..QueueConfig::default() }.validate()?;
        }
        let now = self.clock.now();
        with_connection!(self, conn => {
            let row = queue_sql::leasing_queue(&mut conn, &self.names, queue, token).await?;
            queue_sql::renew(&mut conn, &self.names, &row, token, lease.unwrap_or(row.config.lease), now).await?
        })
    }

    async fn dead_letter(&self, queue: &QueueName, token: LeaseToken, reason: String) -> Result<(), Error> {
        let now = self.clock.now();
        in_transaction!(self, tx => {
            let row = queue_sql::leasing_queue(&mut tx, &self.names, queue, token).await?;
            queue_sql::dead_letter(&mut tx, &self.names, &row, token, &reason, now).await?
        })
    }

    async fn dead_letters(&self, queue: &QueueName, limit: u32) -> Result<Vec<DeadLetter>, Error> {
        with_connection!(self, conn => {
            let row = queue_sql::existing_queue(&mut conn, &self.names, queue).await?;
            queue_sql::dead_letters(&mut conn, &self.names, &row, limit).await?
        })
    }

    async fn redrive(&self, queue: &QueueName, which: Redrive) -> Result<u64, Error> {
        let now = self.clock.now();
        let moved = in_transaction!(self, tx => {
            let row = queue_sql::existing_queue(&mut tx, &self.names, queue).await?;
            queue_sql::redrive(&mut tx, &self.names, &row, &which, now).await?
        })?;
        self.announce(vec![queue.clone()]);
        Ok(moved)
    }

    async fn dead_letter_page(&self, filter: &DeadLetterFilter, after: Option<u64>, scan: u32) -> Result<DeadLetterPage, Error> {
        with_connection!(self, conn => {
            let row = queue_sql::existing_queue(&mut conn, &self.names, &filter.queue).await?;
            queue_sql::dead_letter_page(&mut conn, &self.names, &row, filter, after, scan).await?
        })
    }

    async fn count_dead_letters(&self, filter: &DeadLetterFilter) -> Result<u64, Error> {
        with_connection!(self, conn => {
            let row = queue_sql::existing_queue(&mut conn, &self.names, &filter.queue).await?;
            queue_sql::count_dead_letters(&mut conn, &self.names, &row, filter).await?
        })
    }

    async fn redrive_listed(&self, queue: &QueueName, seqs: &[u64]) -> Result<u64, Error> {
        let now = self.clock.now();
        let moved = in_transaction!(self, tx => {
            let row = queue_sql::existing_queue(&mut tx, &self.names, queue).await?;
            queue_sql::redrive_listed(&mut tx, &self.names, &row, seqs, now).await?
        })?;
        if moved > 0 {
            self.announce(vec![queue.clone()]);
        }
        Ok(moved)
    }

    async fn purge_dead_letters(&self, queue: &QueueName) -> Result<u64, Error> {
        with_connection!(self, conn => {
            let row = queue_sql::existing_queue(&mut conn, &self.names, queue).await?;
            queue_sql::purge_dead_letters(&mut conn, &self.names, &row).await?
        })
    }

    async fn pause(&self, queue: &QueueName) -> Result<(), Error> {
        let now = self.clock.now();
        in_transaction!(self, tx => {
            let row = queue_sql::ensure_queue(&mut tx, &self.names, queue, now).await?;
            queue_sql::set_paused(&mut tx, &self.names, &row, true).await?
        })
    }

    async fn resume(&self, queue: &QueueName) -> Result<(), Error> {
        let now = self.clock.now();
        in_transaction!(self, tx => {
            let row = queue_sql::ensure_queue(&mut tx, &self.names, queue, now).await?;
            queue_sql::set_paused(&mut tx, &self.names, &row, false).await?
        })?;
        self.announce(vec![queue.clone()]);
        Ok(())
    }

    async fn stats(&self) -> Result<Vec<QueueStats>, Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { queue_sql::stats(&mut conn, &self.names, now).await? })
    }

    async fn backlogs(&self, queues: &[QueueName], up_to: u32) -> Result<Vec<Backlog>, Error> {
        if queues.is_empty() {
            return Ok(Vec::new());
        }
        let now = self.clock.now();
        with_connection!(self, conn => { queue_sql::backlogs(&mut conn, &self.names, queues, up_to, now).await? })
    }
}

#[async_trait]
impl Tasks for PgStore {
    async fn create_task(&self, new: NewTask) -> Result<Created, Error> {
        new.check(self.config.body_bytes_max)?;
        self.ensure_queues(&new.messages.iter().map(|(queue, _)| queue).collect::<Vec<_>>()).await?;
        let mut queue_ids = HashMap::new();
        for (queue, _) in &new.messages {
            let id = self.cached_queue_id(queue).ok_or_else(|| Error::Backend(format!("queue {queue} has no known id")))?;
            queue_ids.insert(queue.clone(), id);
        }
        let send_ids: Vec<MessageId> = new.messages.iter().map(|(_, message)| Self::message_id(message)).collect();
        // One statement with the creations submitted at the same moment.
        let (done, outcome) = oneshot::channel();
        let pending = group_commit::PendingCreate { new, send_ids, queue_ids, done };
        self.commits.send(group_commit::Job::Create(Box::new(pending))).map_err(|_| Error::Closed)?;
        let (created, sent_to) = outcome.await.map_err(|_| Error::Closed)??;
        self.announce(sent_to);
        Ok(created)
    }

    async fn task(&self, id: &TaskId) -> Result<Option<TaskRecord>, Error> {
        with_connection!(self, conn => { task_sql::get_task(&mut conn, &self.names, id).await? })
    }

    async fn tasks(&self, ids: &[TaskId]) -> Result<Vec<TaskRecord>, Error> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        with_connection!(self, conn => { task_sql::get_tasks(&mut conn, &self.names, ids).await? })
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<Task>, Error> {
        with_connection!(self, conn => { task_sql::list_tasks(&mut conn, &self.names, filter, self.config.sparse_matches_max).await? })
    }

    async fn stale_children(&self, limit: u32) -> Result<Vec<TaskId>, Error> {
        with_connection!(self, conn => { task_sql::stale_children(&mut conn, &self.names, limit).await? })
    }

    async fn count_tasks(&self, filter: &TaskFilter) -> Result<Vec<(TaskState, u64)>, Error> {
        with_connection!(self, conn => { task_sql::count_tasks(&mut conn, &self.names, filter, self.config.sparse_matches_max).await? })
    }

    async fn claim_records_by(&self, owner: &InstanceId, lease: Duration, claim: Claim) -> Result<Vec<TaskRecord>, Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { task_sql::claim_tasks(&mut conn, &self.names, owner, lease, claim, now).await? })
    }

    async fn key_holders(&self, workflow: &WorkflowName, key: &str) -> Result<Vec<TaskId>, Error> {
        with_connection!(self, conn => { task_sql::key_holders(&mut conn, &self.names, workflow, key).await? })
    }

    async fn commit(&self, changes: Changes) -> Result<(), Error> {
        if changes.is_empty() {
            return Ok(());
        }
        for (_, message) in &changes.send {
            message.check(self.config.body_bytes_max)?;
        }
        self.ensure_queues(&changes.send.iter().map(|(queue, _)| queue).collect::<Vec<_>>()).await?;
        let send_ids: Vec<MessageId> = changes.send.iter().map(|(_, message)| Self::message_id(message)).collect();
        let mut queue_ids = HashMap::new();
        let named =
            changes.complete.iter().map(|(queue, token)| (queue, Some(token))).chain(changes.send.iter().map(|(queue, _)| (queue, None)));
        for (queue, token) in named {
            if queue_ids.contains_key(queue) {
                continue;
            }
            let id = match self.cached_queue_id(queue) {
                Some(id) => Some(id),
                None => with_connection!(self, conn => { self.existing_queue_id(&mut conn, queue).await? })?,
            };
            match (id, token) {
                (Some(id), _) => {
                    queue_ids.insert(queue.clone(), id);
                }
                (None, Some(token)) => return Err(queue_sql::lease_lost(queue, *token)),
                (None, None) => return Err(Error::Backend(format!("queue {queue} vanished after its creation"))),
            }
        }
        let (done, outcome) = oneshot::channel();
        self.commits
            .send(group_commit::Job::Commit(group_commit::Pending { changes, send_ids, queue_ids, done }))
            .map_err(|_| Error::Closed)?;
        let sent_to = outcome.await.map_err(|_| Error::Closed)??;
        self.announce(sent_to);
        Ok(())
    }

    async fn expired(&self, limit: u32) -> Result<Vec<Expired>, Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { task_sql::expired(&mut conn, &self.names, limit, now).await? })
    }

    async fn warnings_due(&self, limit: u32) -> Result<Vec<Warning>, Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { task_sql::warnings_due(&mut conn, &self.names, limit, now).await? })
    }

    async fn raise_warning(&self, warning: &Warning, events: Vec<Event>, send: Vec<(QueueName, Outgoing)>) -> Result<bool, Error> {
        for (_, message) in &send {
            message.check(self.config.body_bytes_max)?;
        }
        let now = self.clock.now();
        let mut queues: Vec<&QueueName> = send.iter().map(|(queue, _)| queue).collect();
        queues.dedup();
        self.ensure_queues(&queues).await?;
        let ids: Vec<MessageId> = send.iter().map(|(_, message)| Self::message_id(message)).collect();
        // Never handed to a parked receiver: those hand-offs are planned
        // before a commit that always sends, and this one may send nothing.
        let leases: Vec<Option<handoff::Lease>> = send.iter().map(|_| None).collect();
        let (raised, sent_to) = in_transaction!(self, tx => {
            let raised = task_sql::raise_warning(&mut tx, &self.names, warning, &events, now).await?;
            let sent_to = if raised && !send.is_empty() { self.send_all(&mut tx, &send, &ids, &leases, now).await?.1 } else { Vec::new() };
            (raised, sent_to)
        })?;
        self.announce(sent_to);
        Ok(raised)
    }

    async fn history(&self, id: &TaskId) -> Result<Vec<Event>, Error> {
        with_connection!(self, conn => { task_sql::history(&mut conn, &self.names, id).await? })
    }

    async fn events_after(&self, after_seq: i64, limit: u32) -> Result<Vec<Event>, Error> {
        with_connection!(self, conn => { task_sql::events_after(&mut conn, &self.names, after_seq, limit).await? })
    }

    async fn latest_events(&self, limit: u32) -> Result<Vec<Event>, Error> {
        with_connection!(self, conn => { task_sql::latest_events(&mut conn, &self.names, limit).await? })
    }

    async fn leader(&self, name: &str) -> Result<Option<LeaderLease>, Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { task_sql::leader(&mut conn, &self.names, name, now).await? })
    }

    async fn acquire_leader(&self, name: &str, holder: &InstanceId, ttl: Duration) -> Result<Option<LeaderLease>, Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { task_sql::acquire_leader(&mut conn, &self.names, name, holder, ttl, now).await? })
    }

    async fn release_leader(&self, name: &str, holder: &InstanceId) -> Result<(), Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { task_sql::release_leader(&mut conn, &self.names, name, holder, now).await? })
    }

    async fn register_workflow(&self, name: &WorkflowName, version: u32, definition: &Value) -> Result<(), Error> {
        if version == 0 {
            return Err(Error::Invalid(format!("workflow {name}: version must be at least 1")));
        }
        let now = self.clock.now();
        in_transaction!(self, tx => { task_sql::register_workflow(&mut tx, &self.names, name, version, definition, now).await? })
    }

    async fn workflow(&self, name: &WorkflowName, version: Option<u32>) -> Result<Option<WorkflowEntry>, Error> {
        with_connection!(self, conn => { task_sql::workflow(&mut conn, &self.names, name, version).await? })
    }

    async fn workflows(&self) -> Result<Vec<WorkflowEntry>, Error> {
        with_connection!(self, conn => { task_sql::workflows(&mut conn, &self.names).await? })
    }

    async fn set_workflow_paused(&self, change: &WorkflowPause) -> Result<(), Error> {
        with_connection!(self, conn => { task_sql::set_workflow_paused(&mut conn, &self.names, change).await? })
    }

    async fn workflow_pauses(&self) -> Result<Vec<WorkflowPause>, Error> {
        with_connection!(self, conn => { task_sql::workflow_pauses(&mut conn, &self.names).await? })
    }

    async fn alerts(&self, limit: u32) -> Result<Vec<Event>, Error> {
        with_connection!(self, conn => { task_sql::alerts(&mut conn, &self.names, limit).await? })
    }

    async fn report_status(&self, key: &str, value: &Value) -> Result<(), Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { task_sql::report_status(&mut conn, &self.names, key, value, now).await? })
    }

    async fn statuses(&self, prefix: &str) -> Result<Vec<ComponentStatus>, Error> {
        with_connection!(self, conn => { task_sql::statuses(&mut conn, &self.names, prefix).await? })
    }

    async fn take_rate_slot(&self, request: &RateRequest) -> Result<RateSlot, Error> {
        request.check()?;
        let now = self.clock.now();
        with_connection!(self, conn => { task_sql::take_rate_slot(&mut conn, &self.names, request, now).await? })
    }

    async fn admit_breaker(&self, ask: &BreakerAsk) -> Result<(BreakerAdmission, Option<SharedBreaker>), Error> {
        ask.check()?;
        let now = self.clock.now();
        with_connection!(self, conn => { task_sql::admit_breaker(&mut conn, &self.names, ask, now).await? })
    }

    async fn report_breaker(&self, report: &BreakerReport) -> Result<Option<SharedBreaker>, Error> {
        report.check()?;
        let now = self.clock.now();
        with_connection!(self, conn => { task_sql::report_breaker(&mut conn, &self.names, report, now).await? })
    }

    async fn shared_breakers(&self) -> Result<Vec<SharedBreaker>, Error> {
        with_connection!(self, conn => { task_sql::shared_breakers(&mut conn, &self.names).await? })
    }

    async fn delete_rate_limits(&self, before: Timestamp) -> Result<u64, Error> {
        with_connection!(self, conn => { task_sql::delete_rate_limits(&mut conn, &self.names, before).await? })
    }

    async fn delete_shared_breakers(&self, before: Timestamp) -> Result<u64, Error> {
        with_connection!(self, conn => { task_sql::delete_shared_breakers(&mut conn, &self.names, before).await? })
    }

    async fn prune_tasks(&self, prune: &Prune) -> Result<Pruned, Error> {
        prune.check()?;
        with_connection!(self, conn => { prune_sql::prune_tasks(&mut conn, &self.names, prune).await? })
    }

    async fn count_prunable(&self, prune: &Prune) -> Result<u64, Error> {
        prune.check()?;
        with_connection!(self, conn => { prune_sql::count_prunable(&mut conn, &self.names, prune).await? })
    }

    async fn prunable_tasks(&self, prune: &Prune) -> Result<Vec<TaskId>, Error> {
        prune.check()?;
        with_connection!(self, conn => { prune_sql::prunable_tasks(&mut conn, &self.names, prune).await? })
    }

    async fn delete_statuses(&self, prefix: &str, reported_before: Timestamp) -> Result<u64, Error> {
        with_connection!(self, conn => { prune_sql::delete_statuses(&mut conn, &self.names, prefix, reported_before).await? })
    }

    async fn sweep_instance(&self, sweep: &InstanceSweep) -> Result<Swept, Error> {
        let (swept, queue_id) = in_transaction!(self, tx => { prune_sql::sweep_instance(&mut tx, &self.names, sweep).await? })?;
        if let (Some(inbox), Some(_)) = (&sweep.inbox, queue_id) {
            // This process's own cache; other processes' caches may still
            // name the queue, which is why only the inbox of an instance
            // gone long enough, that nobody sends to any more, is swept.
            self.queue_ids.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(inbox);
        }
        Ok(swept)
    }

    async fn create_batch(&self, new: &NewBatch) -> Result<BatchRecord, Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { batch_sql::create_batch(&mut conn, &self.names, new, now).await? })
    }

    async fn batch(&self, id: &str) -> Result<Option<BatchRecord>, Error> {
        with_connection!(self, conn => { batch_sql::batch(&mut conn, &self.names, id).await? })
    }

    async fn batches(&self, limit: u32) -> Result<Vec<BatchRecord>, Error> {
        with_connection!(self, conn => { batch_sql::batches(&mut conn, &self.names, limit).await? })
    }

    async fn claim_batch(&self, id: Option<&str>, owner: &InstanceId, lease: Duration) -> Result<Option<BatchRecord>, Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { batch_sql::claim_batch(&mut conn, &self.names, id, owner, lease, now).await? })
    }

    async fn advance_batch(
        &self,
        id: &str,
        owner: &InstanceId,
        progress: &BatchProgress,
        lease: Duration,
    ) -> Result<Option<BatchRecord>, Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { batch_sql::advance_batch(&mut conn, &self.names, id, owner, progress, lease, now).await? })
    }

    async fn record_audit(&self, entry: &NewAudit) -> Result<(), Error> {
        entry.check()?;
        let now = self.clock.now();
        with_connection!(self, conn => { audit_sql::record_audit(&mut conn, &self.names, entry, now).await? })
    }

    async fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, Error> {
        filter.check()?;
        with_connection!(self, conn => { audit_sql::audit(&mut conn, &self.names, filter).await? })
    }

    async fn prune_audit(&self, before: Timestamp, limit: u32) -> Result<u64, Error> {
        with_connection!(self, conn => { audit_sql::prune_audit(&mut conn, &self.names, before, limit).await? })
    }

    async fn stop_batch(&self, id: &str) -> Result<Option<BatchRecord>, Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { batch_sql::stop_batch(&mut conn, &self.names, id, now).await? })
    }

    async fn create_schedule(&self, new: &NewSchedule) -> Result<ScheduleRecord, Error> {
        new.check()?;
        let now = self.clock.now();
        with_connection!(self, conn => { schedule_sql::create_schedule(&mut conn, &self.names, new, now).await? })
    }

    async fn declare_schedule(&self, new: &NewSchedule) -> Result<ScheduleRecord, Error> {
        new.check()?;
        let now = self.clock.now();
        in_transaction!(self, tx => { schedule_sql::declare_schedule(&mut tx, &self.names, new, now).await? })
    }

    async fn schedule(&self, name: &ScheduleName) -> Result<Option<ScheduleRecord>, Error> {
        with_connection!(self, conn => { schedule_sql::schedule(&mut conn, &self.names, name).await? })
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, Error> {
        with_connection!(self, conn => { schedule_sql::schedules(&mut conn, &self.names).await? })
    }

    async fn pause_schedule(&self, name: &ScheduleName) -> Result<ScheduleRecord, Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { schedule_sql::pause_schedule(&mut conn, &self.names, name, now).await? })
    }

    async fn resume_schedule(&self, name: &ScheduleName) -> Result<ScheduleRecord, Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { schedule_sql::resume_schedule(&mut conn, &self.names, name, now).await? })
    }

    async fn delete_schedule(&self, name: &ScheduleName) -> Result<(), Error> {
        with_connection!(self, conn => { schedule_sql::delete_schedule(&mut conn, &self.names, name).await? })
    }

    async fn advance_schedule(
        &self,
        name: &ScheduleName,
        expected_version: u64,
        progress: &ScheduleProgress,
    ) -> Result<ScheduleRecord, Error> {
        let now = self.clock.now();
        with_connection!(self, conn => { schedule_sql::advance_schedule(&mut conn, &self.names, name, expected_version, progress, now).await? })
    }
}

impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }
}
