//! rota's Store on SQLite: the embedded default (one file, no server).
//!
//! One writer thread owns the only writing connection and commits in groups
//! (see [`writer`]): every acknowledged write is flushed to disk first (by
//! default; WAL mode), many callers share each flush, and a flusher thread
//! flushes one batch while the writer runs the next (see [`flusher`]). Reads go to a
//! few separate connections, which WAL lets run beside the writer. Another
//! connection checkpoints the WAL in the background so that commits do not
//! pay for it.
//!
//! Several processes may open the same file (two `rota serve` on one
//! store): SQLite's file lock serializes their writers, and waiting
//! receivers poll for work written by the others every `poll_interval`.
//!
//! Deliberately left out: any SQL outside this crate.

mod audit_sql;
mod batch_sql;
pub mod flusher;
mod prune_sql;
mod queue_sql;
mod schedule_sql;
mod schema;
mod task_sql;
pub mod writer;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rota_model::{Clock, InstanceId, LeaseToken, MessageId, QueueName, ScheduleName, Task, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{
    AuditEntry, AuditFilter, Backlog, BatchProgress, BatchRecord, BreakerAdmission, BreakerAsk, BreakerReport, Changes, Claim,
    ComponentStatus, Created, DeadLetter, DeadLetterFilter, DeadLetterPage, Delivery, Error, Event, Expired, InstanceSweep, LeaderLease,
    NewAudit, NewBatch, NewSchedule, NewTask, Outgoing, Prune, Pruned, QueueConfig, QueueStats, Queues, RateRequest, RateSlot, Receive,
    Redrive, Result, ScheduleProgress, ScheduleRecord, Sent, SharedBreaker, Store, Swept, TaskFilter, TaskRecord, Tasks, Warning,
    WorkflowEntry, WorkflowPause,
};
use rusqlite::{Connection, OpenFlags};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use flusher::FlushHandle;
use writer::{Command, Job, Parked, ReplyAt, Settle, Writer, WriterConfig};
pub use writer::{CommitCounts, CommitStats};

/// How hard a commit tries to survive power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every acknowledged commit is flushed to disk first: it survives a
    /// process crash and a power loss. The writer commits with
    /// `synchronous=NORMAL` and a flusher thread flushes the WAL before any
    /// reply, so that the next batch runs during the flush (see
    /// [`flusher`]); the other connections use `synchronous=FULL`.
    #[default]
    Full,
    /// `synchronous=NORMAL`: survives a process crash, but a power loss may
    /// lose the last acknowledged commits.
    Normal,
}

impl Durability {
    fn pragma(self) -> &'static str {
        match self {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        }
    }
}

/// Settings of a SQLite store. Every bound is named here.
#[derive(Debug, Clone)]
pub struct Config {
    /// The database file (created if missing; its directory must exist).
    pub path: PathBuf,
    /// The fsync policy of commits.
    pub durability: Durability,
    /// The most operations one group commit takes.
    pub batch_ops_max: usize,
    /// How many operations may wait for the writer before callers wait to send.
    pub pending_ops_max: usize,
    /// How often waiting receivers re-check for work that did not pass
    /// through this process's writer (other processes, delays, expired leases).
    pub poll_interval: Duration,
    /// With [`Durability::Full`], how long a flush may wait for the next
    /// commit of a caller answered at commit (a Scheduler given a claim or a
    /// reply writes its decision next), so that one flush makes both
    /// durable. The callers waiting for that flush wait up to this much
    /// longer; a lone workflow waits for one flush a step instead of two.
    /// Zero flushes at once.
    pub follow_up_wait: Duration,
    /// How long to wait for another process's write lock before failing.
    pub busy_timeout: Duration,
    /// The largest message body accepted, in bytes.
    pub body_bytes_max: usize,
    /// How often the background connection checkpoints the WAL.
    pub checkpoint_interval: Duration,
    /// How many connections serve reads side by side (WAL lets them run
    /// beside the writer); each read takes a free one.
    pub readers: usize,
    /// How many free pages each prune gives back to the file system
    /// (`PRAGMA incremental_vacuum`, in the prune's transaction): each page
    /// moved is a write, so the bound keeps a prune's commit short; 0 gives
    /// nothing back (freed pages are still reused by new rows).
    pub vacuum_pages_max: u32,
    /// Below this many matches of a tag, an id prefix or a time range, a
    /// task listing reads that condition's own index and sorts what it
    /// finds; from it on, it walks the tasks newest first and tests each.
    /// The default suits pages of a hundred on ten million tasks.
    pub sparse_matches_max: u32,
}

impl Config {
    /// The most pages one prune may give back (256 MiB of 4 KiB pages).
    pub const VACUUM_PAGES_MAX: u32 = 65_536;

    /// The default of [`Config::follow_up_wait`]: a few times what a
    /// Scheduler takes to decide and commit, so that its commit comes in
    /// time, and short beside a flush's own wait under load.
    pub const FOLLOW_UP_WAIT_DEFAULT: Duration = Duration::from_millis(1);
    /// The longest [`Config::follow_up_wait`].
    pub const FOLLOW_UP_WAIT_MAX: Duration = Duration::from_secs(1);

    /// Defaults for a database at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Config {
            path: path.into(),
            durability: Durability::Full,
            batch_ops_max: 1024,
            pending_ops_max: 8192,
            poll_interval: Duration::from_millis(50),
            follow_up_wait: Self::FOLLOW_UP_WAIT_DEFAULT,
            busy_timeout: Duration::from_secs(5),
            body_bytes_max: rota_store::BODY_BYTES_MAX,
            checkpoint_interval: Duration::from_millis(200),
            readers: 4,
            vacuum_pages_max: 1024,
            sparse_matches_max: task_sql::SPARSE_MATCHES_MAX,
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(Error::Invalid(format!("sqlite store config: {what}")));
        if self.batch_ops_max == 0 || self.batch_ops_max > 100_000 {
            return bad("batch_ops_max must be between 1 and 100000");
        }
        if self.pending_ops_max == 0 {
            return bad("pending_ops_max must be at least 1");
        }
        if self.poll_interval < Duration::from_millis(1) {
            return bad("poll_interval must be at least 1 ms");
        }
        if self.follow_up_wait > Self::FOLLOW_UP_WAIT_MAX {
            return bad("follow_up_wait must be at most 1 s");
        }
        if self.body_bytes_max == 0 {
            return bad("body_bytes_max must be at least 1");
        }
        if self.readers == 0 || self.readers > 64 {
            return bad("readers must be between 1 and 64");
        }
        if self.vacuum_pages_max > Self::VACUUM_PAGES_MAX {
            return bad("vacuum_pages_max must be at most 65536");
        }
        Ok(())
    }
}

/// The settings SQLite reports for an open store, read back from the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pragmas {
    /// `PRAGMA journal_mode` (`wal`).
    pub journal_mode: String,
    /// `PRAGMA synchronous` of the writing connection (`normal` in both
    /// durabilities: with [`Durability::Full`] the flusher flushes instead).
    pub synchronous: String,
    /// Whether every commit's WAL is flushed to disk (`fdatasync`) before
    /// its callers hear of it: [`Durability::Full`]. Callers that act only
    /// by committing to this store (a Scheduler's claims and receives, see
    /// [`rota_store::Receive::acts_within_store`]) hear at the commit; what
    /// they cause is flushed before it leaves the process.
    pub flushed_before_reply: bool,
    /// `PRAGMA auto_vacuum` of the file (`incremental`).
    pub auto_vacuum: String,
}

/// How big the database file is, in pages, as of the last commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pages {
    /// `PRAGMA page_count`: the file's size in pages (the WAL aside).
    pub total: u64,
    /// `PRAGMA freelist_count`: pages that hold nothing, reused by new rows
    /// or given back by an incremental vacuum.
    pub free: u64,
    /// `PRAGMA page_size`, in bytes.
    pub size: u64,
}

/// rota's Store on a SQLite file.
pub struct SqliteStore {
    commands: mpsc::Sender<Command>,
    readers: Arc<Readers>,
    clock: Arc<dyn Clock>,
    config: Config,
    stats: Arc<CommitStats>,
    #[cfg(test)]
    flush_gate: Option<flusher::FlushGate>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").field("path", &self.config.path).finish()
    }
}

/// How a disk-full error starts (see [`naming_the_file`]).
const DISK_FULL: &str = "disk full: ";

pub(crate) fn sql_error(err: rusqlite::Error) -> Error {
    use rusqlite::ErrorCode;
    match err.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            Error::Unavailable(format!("the database is locked by another process: {err}"))
        }
        Some(ErrorCode::DiskFull) => Error::Backend(format!("{DISK_FULL}{err}")),
        Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied | ErrorCode::ReadOnly) => Error::Unavailable(err.to_string()),
        _ => Error::Backend(err.to_string()),
    }
}

/// A disk-full error made to name the database file written, which is the
/// first thing an operator needs (the statement that hit it does not know).
pub(crate) fn naming_the_file(err: Error, conn: &Connection) -> Error {
    match err {
        Error::Backend(message) if message.starts_with(DISK_FULL) && !message.contains(" cannot write SQLite database ") => {
            let path = conn.path().unwrap_or("(in memory)");
            Error::Backend(format!("{DISK_FULL}cannot write SQLite database {path} ({})", &message[DISK_FULL.len()..]))
        }
        other => other,
    }
}

/// Turns off SQLite's global memory statistics, once per process, before
/// the first connection. They cost a global mutex on every allocation
/// (measured: ~5% of the writer thread's time in mutex calls), and rota reads
/// none of them.
fn configure_sqlite_once() {
    static CONFIGURED: std::sync::Once = std::sync::Once::new();
    CONFIGURED.call_once(|| {
        // SAFETY: sqlite3_config is called before any connection of this
        // process is opened (the Once runs first in every open); if SQLite
        // was already initialized it returns SQLITE_MISUSE and changes
        // nothing, which is harmless.
        let code = unsafe { rusqlite::ffi::sqlite3_config(rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS, 0 as std::os::raw::c_int) };
        if code != rusqlite::ffi::SQLITE_OK {
            tracing::debug!("sqlite3_config(MEMSTATUS, 0) returned {code}; keeping the default");
        }
    });
}

fn open_connection(config: &Config) -> Result<Connection> {
    configure_sqlite_once();
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(&config.path, flags)
        .map_err(|e| Error::Unavailable(format!("cannot open SQLite database {}: {e}", config.path.display())))?;
    conn.busy_timeout(config.busy_timeout).map_err(sql_error)?;
    let journal: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(|e| Error::Unavailable(format!("cannot use SQLite database {}: {e}", config.path.display())))?;
    if !journal.eq_ignore_ascii_case("wal") {
        return Err(Error::Unavailable(format!("{} refuses WAL mode (journal_mode is {journal})", config.path.display())));
    }
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {}; PRAGMA temp_store = MEMORY; PRAGMA cache_size = -32768; PRAGMA journal_size_limit = 67108864;",
        config.durability.pragma()
    ))
    .map_err(sql_error)?;
    conn.set_prepared_statement_cache_capacity(128);
    Ok(conn)
}

/// Keeps the writer's statements compiled once. Without the planner's
/// stability guarantee, a statement whose plan looked at a bound value (a
/// bound `LIMIT`, a parameter compared with a partial index's condition)
/// is compiled again every time that parameter is bound: every claim was
/// parsed and planned anew, a quarter of the writer thread's time with one
/// workflow at a time. The writer's statements name their constants in
/// the SQL, and their index where the choice matters. The readers keep
/// the default: a listing's plan may rightly depend on its page size.
fn compile_once(conn: &Connection) -> Result<()> {
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map_err(sql_error)?;
    Ok(())
}

/// Makes the file give its free pages back when asked
/// (`auto_vacuum = INCREMENTAL`), so that pruning can shrink it. A new file
/// takes the setting before its first table; a file made without it is
/// switched once, here, by a `VACUUM` that rewrites it whole (it takes time
/// and room in proportion to the file, and the file's write lock).
fn incremental_vacuum(conn: &Connection, config: &Config) -> Result<()> {
    const INCREMENTAL: i64 = 2;
    let mode = |conn: &Connection| conn.query_row("PRAGMA auto_vacuum", [], |row| row.get::<_, i64>(0)).map_err(sql_error);
    if mode(conn)? == INCREMENTAL {
        return Ok(());
    }
    conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL").map_err(sql_error)?;
    if mode(conn)? != INCREMENTAL {
        tracing::info!("{}: switching to auto_vacuum=INCREMENTAL (a VACUUM, once)", config.path.display());
        conn.execute_batch("VACUUM").map_err(sql_error)?;
    }
    Ok(())
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `config.path`, runs the
    /// migrations, and starts the writer and checkpoint threads. Every
    /// operation reads "now" from `clock`.
    pub fn open(config: Config, clock: Arc<dyn Clock>) -> Result<SqliteStore> {
        config.validate()?;
        let mut writer_conn = open_connection(&config)?;
        compile_once(&writer_conn)?;
        incremental_vacuum(&writer_conn, &config)?;
        schema::migrate(&mut writer_conn).map_err(sql_error)?;
        let found: i64 = writer_conn.query_row("PRAGMA user_version", [], |row| row.get(0)).map_err(sql_error)?;
        if found > schema::version() {
            return Err(Error::Unavailable(format!(
                "{} has schema version {found}, newer than this rota knows ({}): upgrade rota",
                config.path.display(),
                schema::version()
            )));
        }
        // The background checkpointer does this work instead of the commits.
        writer_conn.execute_batch("PRAGMA wal_autocheckpoint = 10000").map_err(sql_error)?;
        // With Full durability the flusher flushes what the writer commits.
        writer_conn.execute_batch("PRAGMA synchronous = NORMAL").map_err(sql_error)?;
        let readers = (0..config.readers).map(|_| open_connection(&config).map(Mutex::new)).collect::<Result<Vec<_>>>()?;
        let checkpointer = open_connection(&config)?;

        let (commands, receiver) = mpsc::channel(config.pending_ops_max);
        let stats = Arc::new(CommitStats::default());
        let closed = Arc::new(AtomicBool::new(false));
        let flush = match config.durability {
            Durability::Full => Some(FlushHandle::start(&config.path, stats.clone())?),
            Durability::Normal => None,
        };
        #[cfg(test)]
        let flush_gate = flush.as_ref().map(FlushHandle::gate);
        let writer = Writer::new(
            writer_conn,
            clock.clone(),
            receiver,
            WriterConfig {
                batch_ops_max: config.batch_ops_max,
                poll_interval: config.poll_interval,
                follow_up_wait: config.follow_up_wait,
            },
            stats.clone(),
            closed.clone(),
            flush,
        );
        std::thread::Builder::new()
            .name("rota-sqlite-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| Error::Backend(format!("cannot start the writer thread: {e}")))?;
        let interval = config.checkpoint_interval;
        let checkpoint_closed = closed.clone();
        std::thread::Builder::new()
            .name("rota-sqlite-checkpoint".into())
            .spawn(move || run_checkpoints(checkpointer, interval, checkpoint_closed))
            .map_err(|e| Error::Backend(format!("cannot start the checkpoint thread: {e}")))?;

        let readers = Arc::new(Readers { connections: readers, next: AtomicUsize::new(0) });
        // The writer stops when the last sender (the store's) is dropped and then
        // sets `closed`, which stops the checkpointer.
        Ok(SqliteStore {
            commands,
            readers,
            clock,
            config,
            stats,
            #[cfg(test)]
            flush_gate,
        })
    }

    /// The settings SQLite reports: journal mode of the file and the
    /// synchronous level of the writing connection.
    pub async fn pragmas(&self) -> Result<Pragmas> {
        let synchronous: i64 = self.write(|conn, _| conn.query_row("PRAGMA synchronous", [], |row| row.get(0)).map_err(sql_error)).await?;
        let journal_mode: String =
            self.read(|conn, _| conn.query_row("PRAGMA journal_mode", [], |row| row.get(0)).map_err(sql_error)).await?;
        let auto_vacuum: i64 = self.read(|conn, _| conn.query_row("PRAGMA auto_vacuum", [], |row| row.get(0)).map_err(sql_error)).await?;
        let auto_vacuum = match auto_vacuum {
            0 => "none",
            1 => "full",
            2 => "incremental",
            _ => "unknown",
        };
        let synchronous = match synchronous {
            0 => "off",
            1 => "normal",
            2 => "full",
            3 => "extra",
            _ => "unknown",
        };
        Ok(Pragmas {
            journal_mode: journal_mode.to_lowercase(),
            synchronous: synchronous.into(),
            flushed_before_reply: self.config.durability == Durability::Full,
            auto_vacuum: auto_vacuum.into(),
        })
    }

    /// The file's size and free pages, as of the last commit.
    pub async fn pages(&self) -> Result<Pages> {
        self.read(|conn, _| {
            let pragma = |name: &str| conn.query_row(&format!("PRAGMA {name}"), [], |row| row.get::<_, i64>(0)).map_err(sql_error);
            let count = |value: i64| u64::try_from(value).unwrap_or(0);
            Ok(Pages { total: count(pragma("page_count")?), free: count(pragma("freelist_count")?), size: count(pragma("page_size")?) })
        })
        .await
    }

    /// Counters of the writer's group commits so far.
    pub fn commit_counts(&self) -> CommitCounts {
        self.stats.snapshot()
    }

    /// The configuration the store was opened with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Creates a task together with the application's own writes to the
    /// same database file, in one transaction: the pattern's "insert the
    /// order and its task state together". `app` runs on the writing
    /// connection inside the task's savepoint, after the task is created (or
    /// found: the task id is the idempotency key, and `app` is told which);
    /// if it fails, neither its writes nor the task are kept, and its error
    /// is returned as `Invalid`. `app` must not start or end transactions.
    pub async fn create_task_with<T, F>(&self, new: NewTask, app: F) -> Result<(Created, T)>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &Created) -> rusqlite::Result<T> + Send + 'static,
    {
        new.check(self.config.body_bytes_max)?;
        let ids: Vec<MessageId> = new.messages.iter().map(|(_, m)| Self::message_id(m)).collect();
        self.write(move |conn, now| {
            let created = Self::create_task_on(conn, &new, ids, now)?;
            let value = app(conn, &created).map_err(|e| Error::Invalid(format!("the application's writes failed: {e}")))?;
            Ok((created, value))
        })
        .await
    }

    fn create_task_on(conn: &Connection, new: &NewTask, ids: Vec<MessageId>, now: Timestamp) -> Result<Created> {
        if let Some(existing) = task_sql::get_task(conn, &new.task.id)? {
            return Ok(Created::Existing(Box::new(existing)));
        }
        if new.task.locked_by.is_some() && task_sql::workflow_paused(conn, &new.task.workflow)? {
            return Err(Error::Conflict(format!(
                "workflow {} is paused: task {} waits for a claim instead of being created claimed",
                new.task.workflow, new.task.id
            )));
        }
        task_sql::insert_task(conn, &new.task)?;
        for step in &new.steps {
            task_sql::insert_step(conn, step)?;
        }
        for event in &new.events {
            task_sql::insert_event(conn, event)?;
        }
        for ((queue, message), id) in new.messages.iter().zip(ids) {
            let row = queue_sql::ensure_queue(conn, queue, now)?;
            queue_sql::send(conn, &row, message, id, now)?;
        }
        Ok(Created::New)
    }

    /// Runs `op` on the writer inside its group-commit transaction and
    /// returns its result once the transaction is durable.
    async fn write<T, F>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, Timestamp) -> Result<T> + Send + 'static,
    {
        self.write_replying(ReplyAt::Durable, op).await
    }

    /// [`Self::write`], replying at `reply_at`.
    async fn write_replying<T, F>(&self, reply_at: ReplyAt, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, Timestamp) -> Result<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(move |conn, now| {
            let result = op(conn, now).map_err(|err| naming_the_file(err, conn));
            let ok = result.is_ok();
            let settle: Settle = Box::new(move |commit_error| {
                let result = match commit_error {
                    Some(err) if ok => Err(Error::Backend(format!("commit failed: {err}"))),
                    _ => result,
                };
                let _ = reply.send(result);
            });
            (ok, settle)
        });
        self.commands.send(Command::Write(job, reply_at)).await.map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }

    /// Runs a read-only `op` on the reader connection, off the async threads.
    async fn read<T, F>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, Timestamp) -> Result<T> + Send + 'static,
    {
        let readers = self.readers.clone();
        let now = self.clock.now();
        tokio::task::spawn_blocking(move || {
            let conn = readers.take()?;
            op(&conn, now)
        })
        .await
        .map_err(|e| Error::Backend(format!("read failed: {e}")))?
    }

    /// Ids for messages that have none: time-ordered UUIDs.
    fn message_id(message: &Outgoing) -> MessageId {
        message.id.clone().unwrap_or_else(|| MessageId::new(uuid::Uuid::now_v7().to_string()).expect("a UUID is a valid message id"))
    }
}

/// The read connections. A read takes a free one, or waits for the next in
/// turn when all are busy.
struct Readers {
    connections: Vec<Mutex<Connection>>,
    next: AtomicUsize,
}

impl Readers {
    fn take(&self) -> Result<std::sync::MutexGuard<'_, Connection>> {
        let poisoned = |_| Error::Backend("a reader connection is poisoned".into());
        for conn in &self.connections {
            if let Ok(guard) = conn.try_lock() {
                return Ok(guard);
            }
        }
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.connections.len();
        self.connections[turn].lock().map_err(poisoned)
    }
}

fn run_checkpoints(conn: Connection, interval: Duration, closed: Arc<AtomicBool>) {
    while !closed.load(Ordering::SeqCst) {
        std::thread::sleep(interval);
        // PASSIVE never blocks the writer; it copies what it can.
        if let Err(err) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::debug!("wal checkpoint skipped: {err}");
        }
    }
}

#[async_trait]
impl Queues for SqliteStore {
    async fn create_queue(&self, queue: &QueueName, config: QueueConfig) -> Result<()> {
        config.validate()?;
        let queue = queue.clone();
        self.write(move |conn, now| queue_sql::upsert_queue(conn, &queue, &config, now, true)).await
    }

    async fn queue_config(&self, queue: &QueueName) -> Result<Option<QueueConfig>> {
        let queue = queue.clone();
        self.read(move |conn, _| Ok(queue_sql::find_queue(conn, &queue)?.map(|q| q.config))).await
    }

    async fn send(&self, queue: &QueueName, message: Outgoing) -> Result<Sent> {
        message.check(self.config.body_bytes_max)?;
        let queue = queue.clone();
        let id = Self::message_id(&message);
        self.write(move |conn, now| {
            let row = queue_sql::ensure_queue(conn, &queue, now)?;
            queue_sql::send(conn, &row, &message, id, now)
        })
        .await
    }

    async fn send_batch(&self, queue: &QueueName, messages: Vec<Outgoing>) -> Result<Vec<Sent>> {
        for message in &messages {
            message.check(self.config.body_bytes_max)?;
        }
        let queue = queue.clone();
        let ids: Vec<MessageId> = messages.iter().map(Self::message_id).collect();
        self.write(move |conn, now| {
            let row = queue_sql::ensure_queue(conn, &queue, now)?;
            messages.iter().zip(ids).map(|(message, id)| queue_sql::send(conn, &row, message, id, now)).collect()
        })
        .await
    }

    async fn receive(&self, queue: &QueueName, request: Receive) -> Result<Vec<Delivery>> {
        request.validate()?;
        let (reply, answer) = oneshot::channel();
        let parked = Parked {
            queue: queue.clone(),
            max: request.max,
            lease: request.lease,
            owner: request.consumer,
            deadline: Instant::now() + request.wait,
            reply_at: if request.acts_within_store { ReplyAt::Commit } else { ReplyAt::Durable },
            reply,
        };
        self.commands.send(Command::Receive(parked)).await.map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }

    async fn complete(&self, queue: &QueueName, token: LeaseToken) -> Result<()> {
        let queue = queue.clone();
        self.write(move |conn, now| {
            let row = queue_sql::find_queue(conn, &queue)?.ok_or_else(|| queue_sql::lease_lost(&queue, token))?;
            queue_sql::complete(conn, &row, token, now)
        })
        .await
    }

    async fn complete_batch(&self, queue: &QueueName, tokens: &[LeaseToken]) -> Result<Vec<LeaseToken>> {
        let queue = queue.clone();
        let tokens = tokens.to_vec();
        self.write(move |conn, now| {
            let Some(row) = queue_sql::find_queue(conn, &queue)? else { return Ok(tokens) };
            let mut lost = Vec::new();
            for token in tokens {
                match queue_sql::complete(conn, &row, token, now) {
                    Ok(()) => {}
                    Err(Error::LeaseLost(_)) => lost.push(token),
                    Err(other) => return Err(other),
                }
            }
            Ok(lost)
        })
        .await
    }

    async fn abandon(&self, queue: &QueueName, token: LeaseToken, delay: Duration, reason: Option<String>) -> Result<()> {
        let queue = queue.clone();
        self.write(move |conn, now| {
            let row = queue_sql::find_queue(conn, &queue)?.ok_or_else(|| queue_sql::lease_lost(&queue, token))?;
            queue_sql::abandon(conn, &row, token, delay, reason.as_deref(), now)
        })
        .await
    }

    async fn renew(&self, queue: &QueueName, token: LeaseToken, lease: Option<Duration>) -> Result<Timestamp> {
        if let Some(lease) = lease {
            QueueConfig { lease, ..QueueConfig::default() }.validate()?;
        }
        let queue = queue.clone();
        self.write(move |conn, now| {
            let row = queue_sql::find_queue(conn, &queue)?.ok_or_else(|| queue_sql::lease_lost(&queue, token))?;
            queue_sql::renew(conn, &row, token, lease.unwrap_or(row.config.lease), now)
        })
        .await
    }

    async fn dead_letter(&self, queue: &QueueName, token: LeaseToken, reason: String) -> Result<()> {
        let queue = queue.clone();
        self.write(move |conn, now| {
            let row = queue_sql::find_queue(conn, &queue)?.ok_or_else(|| queue_sql::lease_lost(&queue, token))?;
            queue_sql::dead_letter(conn, &row, token, &reason, now)
        })
        .await
    }

    async fn dead_letters(&self, queue: &QueueName, limit: u32) -> Result<Vec<DeadLetter>> {
        let queue = queue.clone();
        self.read(move |conn, _| match queue_sql::find_queue(conn, &queue)? {
            Some(row) => queue_sql::dead_letters(conn, &row, limit),
            None => Err(Error::NotFound(format!("queue {queue}"))),
        })
        .await
    }

    async fn redrive(&self, queue: &QueueName, which: Redrive) -> Result<u64> {
        let queue = queue.clone();
        self.write(move |conn, now| {
            let row = queue_sql::existing_queue(conn, &queue)?;
            queue_sql::redrive(conn, &row, &which, now)
        })
        .await
    }

    async fn dead_letter_page(&self, filter: &DeadLetterFilter, after: Option<u64>, scan: u32) -> Result<DeadLetterPage> {
        let filter = filter.clone();
        self.read(move |conn, _| {
            let row = queue_sql::existing_queue(conn, &filter.queue)?;
            queue_sql::dead_letter_page(conn, &row, &filter, after, scan)
        })
        .await
    }

    async fn count_dead_letters(&self, filter: &DeadLetterFilter) -> Result<u64> {
        let filter = filter.clone();
        self.read(move |conn, _| {
            let row = queue_sql::existing_queue(conn, &filter.queue)?;
            queue_sql::count_dead_letters(conn, &row, &filter)
        })
        .await
    }

    async fn redrive_listed(&self, queue: &QueueName, seqs: &[u64]) -> Result<u64> {
        let (queue, seqs) = (queue.clone(), seqs.to_vec());
        self.write(move |conn, now| {
            let row = queue_sql::existing_queue(conn, &queue)?;
            queue_sql::redrive_listed(conn, &row, &seqs, now)
        })
        .await
    }

    async fn purge_dead_letters(&self, queue: &QueueName) -> Result<u64> {
        let queue = queue.clone();
        self.write(move |conn, _| {
            let row = queue_sql::existing_queue(conn, &queue)?;
            queue_sql::purge_dead_letters(conn, &row)
        })
        .await
    }

    async fn pause(&self, queue: &QueueName) -> Result<()> {
        let queue = queue.clone();
        self.write(move |conn, now| {
            let row = queue_sql::ensure_queue(conn, &queue, now)?;
            queue_sql::set_paused(conn, &row, true)
        })
        .await
    }

    async fn resume(&self, queue: &QueueName) -> Result<()> {
        let queue = queue.clone();
        self.write(move |conn, now| {
            let row = queue_sql::ensure_queue(conn, &queue, now)?;
            queue_sql::set_paused(conn, &row, false)
        })
        .await
    }

    async fn stats(&self) -> Result<Vec<QueueStats>> {
        self.read(queue_sql::stats).await
    }

    async fn backlogs(&self, queues: &[QueueName], up_to: u32) -> Result<Vec<Backlog>> {
        if queues.is_empty() {
            return Ok(Vec::new());
        }
        let queues = queues.to_vec();
        self.read(move |conn, now| queue_sql::backlogs(conn, &queues, up_to, now)).await
    }
}

#[async_trait]
impl Tasks for SqliteStore {
    async fn create_task(&self, new: NewTask) -> Result<Created> {
        new.check(self.config.body_bytes_max)?;
        let ids: Vec<MessageId> = new.messages.iter().map(|(_, m)| Self::message_id(m)).collect();
        self.write(move |conn, now| Self::create_task_on(conn, &new, ids, now)).await
    }

    async fn task(&self, id: &TaskId) -> Result<Option<TaskRecord>> {
        let id = id.clone();
        self.read(move |conn, _| task_sql::get_task(conn, &id)).await
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<Task>> {
        let (filter, sparse) = (filter.clone(), self.config.sparse_matches_max);
        self.read(move |conn, _| task_sql::list_tasks(conn, &filter, sparse)).await
    }

    async fn stale_children(&self, limit: u32) -> Result<Vec<TaskId>> {
        self.read(move |conn, _| task_sql::stale_children(conn, limit)).await
    }

    async fn count_tasks(&self, filter: &TaskFilter) -> Result<Vec<(TaskState, u64)>> {
        let (filter, sparse) = (filter.clone(), self.config.sparse_matches_max);
        self.read(move |conn, _| task_sql::count_tasks(conn, &filter, sparse)).await
    }

    async fn claim_records_by(&self, owner: &InstanceId, lease: Duration, claim: Claim) -> Result<Vec<TaskRecord>> {
        let owner = owner.clone();
        // A claim's holder acts only through this store (see the trait).
        self.write_replying(ReplyAt::Commit, move |conn, now| {
            let tasks = task_sql::claim_tasks(conn, &owner, lease, claim, now)?;
            tasks.into_iter().map(|task| Ok(TaskRecord { steps: task_sql::steps_of(conn, &task.id)?, task })).collect()
        })
        .await
    }

    async fn key_holders(&self, workflow: &WorkflowName, key: &str) -> Result<Vec<TaskId>> {
        let (workflow, key) = (workflow.clone(), key.to_owned());
        self.read(move |conn, _| task_sql::key_holders(conn, &workflow, &key)).await
    }

    async fn commit(&self, changes: Changes) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        for (_, message) in &changes.send {
            message.check(self.config.body_bytes_max)?;
        }
        let ids: Vec<MessageId> = changes.send.iter().map(|(_, m)| Self::message_id(m)).collect();
        self.write(move |conn, now| {
            task_sql::apply_writes(conn, &changes)?;
            for (queue, token) in &changes.complete {
                let row = queue_sql::find_queue(conn, queue)?.ok_or_else(|| queue_sql::lease_lost(queue, *token))?;
                queue_sql::complete(conn, &row, *token, now)?;
            }
            for ((queue, message), id) in changes.send.iter().zip(ids) {
                let row = queue_sql::ensure_queue(conn, queue, now)?;
                queue_sql::send(conn, &row, message, id, now)?;
            }
            Ok(())
        })
        .await
    }

    async fn expired(&self, limit: u32) -> Result<Vec<Expired>> {
        self.read(move |conn, now| task_sql::expired(conn, limit, now)).await
    }

    async fn warnings_due(&self, limit: u32) -> Result<Vec<Warning>> {
        self.read(move |conn, now| task_sql::warnings_due(conn, limit, now)).await
    }

    async fn raise_warning(&self, warning: &Warning, events: Vec<Event>, send: Vec<(QueueName, Outgoing)>) -> Result<bool> {
        for (_, message) in &send {
            message.check(self.config.body_bytes_max)?;
        }
        let warning = warning.clone();
        let ids: Vec<MessageId> = send.iter().map(|(_, m)| Self::message_id(m)).collect();
        self.write(move |conn, now| {
            let raised = task_sql::raise_warning(conn, &warning, &events, now)?;
            if raised {
                for ((queue, message), id) in send.iter().zip(ids) {
                    let row = queue_sql::ensure_queue(conn, queue, now)?;
                    queue_sql::send(conn, &row, message, id, now)?;
                }
            }
            Ok(raised)
        })
        .await
    }

    async fn history(&self, id: &TaskId) -> Result<Vec<Event>> {
        let id = id.clone();
        self.read(move |conn, _| task_sql::history(conn, &id)).await
    }

    async fn events_after(&self, after_seq: i64, limit: u32) -> Result<Vec<Event>> {
        self.read(move |conn, _| task_sql::events_after(conn, after_seq, limit)).await
    }

    async fn latest_events(&self, limit: u32) -> Result<Vec<Event>> {
        self.read(move |conn, _| task_sql::latest_events(conn, limit)).await
    }

    async fn leader(&self, name: &str) -> Result<Option<LeaderLease>> {
        let name = name.to_owned();
        self.read(move |conn, now| task_sql::leader(conn, &name, now)).await
    }

    async fn acquire_leader(&self, name: &str, holder: &InstanceId, ttl: Duration) -> Result<Option<LeaderLease>> {
        let (name, holder) = (name.to_owned(), holder.clone());
        self.write(move |conn, now| task_sql::acquire_leader(conn, &name, &holder, ttl, now)).await
    }

    async fn release_leader(&self, name: &str, holder: &InstanceId) -> Result<()> {
        let (name, holder) = (name.to_owned(), holder.clone());
        self.write(move |conn, now| task_sql::release_leader(conn, &name, &holder, now)).await
    }

    async fn register_workflow(&self, name: &WorkflowName, version: u32, definition: &Value) -> Result<()> {
        if version == 0 {
            return Err(Error::Invalid(format!("workflow {name}: version must be at least 1")));
        }
        let (name, definition) = (name.clone(), definition.clone());
        self.write(move |conn, now| task_sql::register_workflow(conn, &name, version, &definition, now)).await
    }

    async fn workflow(&self, name: &WorkflowName, version: Option<u32>) -> Result<Option<WorkflowEntry>> {
        let name = name.clone();
        self.read(move |conn, _| task_sql::workflow(conn, &name, version)).await
    }

    async fn workflows(&self) -> Result<Vec<WorkflowEntry>> {
        self.read(|conn, _| task_sql::workflows(conn)).await
    }

    async fn set_workflow_paused(&self, change: &WorkflowPause) -> Result<()> {
        let change = change.clone();
        self.write(move |conn, _| task_sql::set_workflow_paused(conn, &change)).await
    }

    async fn workflow_pauses(&self) -> Result<Vec<WorkflowPause>> {
        self.read(|conn, _| task_sql::workflow_pauses(conn)).await
    }

    async fn alerts(&self, limit: u32) -> Result<Vec<Event>> {
        self.read(move |conn, _| task_sql::alerts(conn, limit)).await
    }

    async fn report_status(&self, key: &str, value: &Value) -> Result<()> {
        let (key, value) = (key.to_owned(), value.clone());
        self.write(move |conn, now| task_sql::report_status(conn, &key, &value, now)).await
    }

    async fn statuses(&self, prefix: &str) -> Result<Vec<ComponentStatus>> {
        let prefix = prefix.to_owned();
        self.read(move |conn, _| task_sql::statuses(conn, &prefix)).await
    }

    async fn take_rate_slot(&self, request: &RateRequest) -> Result<RateSlot> {
        request.check()?;
        let request = request.clone();
        self.write(move |conn, now| task_sql::take_rate_slot(conn, &request, now)).await
    }

    async fn delete_rate_limits(&self, before: Timestamp) -> Result<u64> {
        self.write(move |conn, _| task_sql::delete_rate_limits(conn, before)).await
    }

    async fn admit_breaker(&self, ask: &BreakerAsk) -> Result<(BreakerAdmission, Option<SharedBreaker>)> {
        ask.check()?;
        let ask = ask.clone();
        self.write(move |conn, now| task_sql::admit_breaker(conn, &ask, now)).await
    }

    async fn report_breaker(&self, report: &BreakerReport) -> Result<Option<SharedBreaker>> {
        report.check()?;
        let report = report.clone();
        self.write(move |conn, now| task_sql::report_breaker(conn, &report, now)).await
    }

    async fn shared_breakers(&self) -> Result<Vec<SharedBreaker>> {
        self.read(move |conn, _| task_sql::shared_breakers(conn)).await
    }

    async fn delete_shared_breakers(&self, before: Timestamp) -> Result<u64> {
        self.write(move |conn, _| task_sql::delete_shared_breakers(conn, before)).await
    }

    async fn prune_tasks(&self, prune: &Prune) -> Result<Pruned> {
        prune.check()?;
        let (prune, vacuum_pages) = (prune.clone(), self.config.vacuum_pages_max);
        self.write(move |conn, _| prune_sql::prune_tasks(conn, &prune, vacuum_pages)).await
    }

    async fn count_prunable(&self, prune: &Prune) -> Result<u64> {
        prune.check()?;
        let prune = prune.clone();
        self.read(move |conn, _| prune_sql::count_prunable(conn, &prune)).await
    }

    async fn prunable_tasks(&self, prune: &Prune) -> Result<Vec<TaskId>> {
        prune.check()?;
        let prune = prune.clone();
        self.read(move |conn, _| prune_sql::prunable_tasks(conn, &prune)).await
    }

    async fn delete_statuses(&self, prefix: &str, reported_before: Timestamp) -> Result<u64> {
        let prefix = prefix.to_owned();
        self.write(move |conn, _| prune_sql::delete_statuses(conn, &prefix, reported_before)).await
    }

    async fn sweep_instance(&self, sweep: &InstanceSweep) -> Result<Swept> {
        let sweep = sweep.clone();
        self.write(move |conn, _| prune_sql::sweep_instance(conn, &sweep)).await
    }

    async fn create_batch(&self, new: &NewBatch) -> Result<BatchRecord> {
        let new = new.clone();
        self.write(move |conn, now| batch_sql::create_batch(conn, &new, now)).await
    }

    async fn batch(&self, id: &str) -> Result<Option<BatchRecord>> {
        let id = id.to_owned();
        self.read(move |conn, _| batch_sql::batch(conn, &id)).await
    }

    async fn batches(&self, limit: u32) -> Result<Vec<BatchRecord>> {
        self.read(move |conn, _| batch_sql::batches(conn, limit)).await
    }

    async fn claim_batch(&self, id: Option<&str>, owner: &InstanceId, lease: Duration) -> Result<Option<BatchRecord>> {
        let (id, owner) = (id.map(str::to_owned), owner.clone());
        self.write(move |conn, now| batch_sql::claim_batch(conn, id.as_deref(), &owner, lease, now)).await
    }

    async fn advance_batch(&self, id: &str, owner: &InstanceId, progress: &BatchProgress, lease: Duration) -> Result<Option<BatchRecord>> {
        let (id, owner, progress) = (id.to_owned(), owner.clone(), progress.clone());
        self.write(move |conn, now| batch_sql::advance_batch(conn, &id, &owner, &progress, lease, now)).await
    }

    async fn stop_batch(&self, id: &str) -> Result<Option<BatchRecord>> {
        let id = id.to_owned();
        self.write(move |conn, now| batch_sql::stop_batch(conn, &id, now)).await
    }

    async fn record_audit(&self, entry: &NewAudit) -> Result<()> {
        entry.check()?;
        let entry = entry.clone();
        self.write(move |conn, now| audit_sql::record_audit(conn, &entry, now)).await
    }

    async fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
        filter.check()?;
        let filter = filter.clone();
        self.read(move |conn, _| audit_sql::audit(conn, &filter)).await
    }

    async fn prune_audit(&self, before: Timestamp, limit: u32) -> Result<u64> {
        self.write(move |conn, _| audit_sql::prune_audit(conn, before, limit)).await
    }

    async fn create_schedule(&self, new: &NewSchedule) -> Result<ScheduleRecord> {
        new.check()?;
        let new = new.clone();
        self.write(move |conn, now| schedule_sql::create_schedule(conn, &new, now)).await
    }

    async fn declare_schedule(&self, new: &NewSchedule) -> Result<ScheduleRecord> {
        new.check()?;
        let new = new.clone();
        self.write(move |conn, now| schedule_sql::declare_schedule(conn, &new, now)).await
    }

    async fn schedule(&self, name: &ScheduleName) -> Result<Option<ScheduleRecord>> {
        let name = name.clone();
        self.read(move |conn, _| schedule_sql::schedule(conn, &name)).await
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRecord>> {
        self.read(|conn, _| schedule_sql::schedules(conn)).await
    }

    async fn pause_schedule(&self, name: &ScheduleName) -> Result<ScheduleRecord> {
        let name = name.clone();
        self.write(move |conn, now| schedule_sql::pause_schedule(conn, &name, now)).await
    }

    async fn resume_schedule(&self, name: &ScheduleName) -> Result<ScheduleRecord> {
        let name = name.clone();
        self.write(move |conn, now| schedule_sql::resume_schedule(conn, &name, now)).await
    }

    async fn delete_schedule(&self, name: &ScheduleName) -> Result<()> {
        let name = name.clone();
        self.write(move |conn, _| schedule_sql::delete_schedule(conn, &name)).await
    }

    async fn advance_schedule(&self, name: &ScheduleName, expected_version: u64, progress: &ScheduleProgress) -> Result<ScheduleRecord> {
        let (name, progress) = (name.clone(), progress.clone());
        self.write(move |conn, now| schedule_sql::advance_schedule(conn, &name, expected_version, &progress, now)).await
    }
}

impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rota_model::{InstanceId, MessageId, QueueName, Task, TaskId, Timestamp, WorkflowName};
    use rota_store::{Claim, Outgoing, WorkflowPause};

    use super::{Config, compile_once, open_connection, queue_sql, schema, task_sql};

    /// The sum of counter `counter` (an `SQLITE_STMTSTATUS_…`) over every
    /// statement cached on `conn`, reset to zero after the read if `reset`.
    fn statements_counter(conn: &rusqlite::Connection, counter: std::os::raw::c_int, reset: bool) -> i32 {
        let mut total = 0;
        // SAFETY: the handle is valid for as long as `conn` is borrowed, no
        // statement is finalized meanwhile (this thread owns the connection),
        // and sqlite3_stmt_status reads, or resets, the statement's own counter.
        unsafe {
            let db = conn.handle();
            let mut stmt = rusqlite::ffi::sqlite3_next_stmt(db, std::ptr::null_mut());
            while !stmt.is_null() {
                total += rusqlite::ffi::sqlite3_stmt_status(stmt, counter, std::os::raw::c_int::from(reset));
                stmt = rusqlite::ffi::sqlite3_next_stmt(db, stmt);
            }
        }
        total
    }

    /// How many times SQLite compiled the statements cached on `conn`
    /// again after their first preparation.
    fn compiled_again(conn: &rusqlite::Connection) -> i32 {
        statements_counter(conn, rusqlite::ffi::SQLITE_STMTSTATUS_REPREPARE, false)
    }

    /// The virtual machine steps the statements cached on `conn` took
    /// since the last call.
    fn steps_taken(conn: &rusqlite::Connection) -> i32 {
        statements_counter(conn, rusqlite::ffi::SQLITE_STMTSTATUS_VM_STEP, true)
    }

    /// A claim, and a receive whose receiver acts only within the store,
    /// hear back as soon as their batch commits; a plain receive, and the
    /// sends, only once the flush made the commit durable.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[expect(
        clippy::await_holding_lock,
        reason = "the guard holds back the flusher thread, which never awaits; the test body runs on its own thread"
    )]
    async fn only_callers_acting_within_the_store_hear_back_before_the_flush() {
        use std::sync::Arc;

        use rota_model::SystemClock;
        use rota_store::{NewTask, Queues, Receive, Tasks};

        let dir = tempfile::tempdir().expect("a temporary directory");
        let store = Arc::new(super::SqliteStore::open(Config::new(dir.path().join("early.db")), Arc::new(SystemClock)).expect("open"));
        let (inbox, agents) = (QueueName::new("inbox").expect("a queue name"), QueueName::new("agents").expect("a queue name"));
        let task = Task::new(
            TaskId::new("t-1").expect("a task id"),
            WorkflowName::new("order").expect("a name"),
            1,
            serde_json::json!({}),
            Timestamp::from_millis(0),
        );
        let new = NewTask { task, steps: Vec::new(), messages: Vec::new(), events: Vec::new() };
        store.create_task(new).await.expect("create");
        let receive = |queue: &QueueName, request: Receive| {
            let (store, queue) = (store.clone(), queue.clone());
            tokio::spawn(async move { store.receive(&queue, request).await.expect("receive") })
        };
        let waiting = Receive::up_to(1).waiting(Duration::from_secs(60));
        let scheduler = receive(&inbox, waiting.clone().acting_within_store());
        let agent = receive(&agents, waiting);
        let before = store.commit_counts().replied_at_commit;

        let gate = store.flush_gate.clone().expect("full durability flushes");
        let held = gate.hold();
        let owner = InstanceId::new("scheduler-1").expect("an instance id");
        let claimed = tokio::time::timeout(Duration::from_secs(10), store.claim_tasks(&owner, Duration::from_secs(60), 1))
            .await
            .expect("a claim answers before the flush")
            .expect("claim");
        assert_eq!(claimed.len(), 1);
        let send = |queue: &QueueName| {
            let (store, queue) = (store.clone(), queue.clone());
            tokio::spawn(async move { store.send(&queue, Outgoing::json(&"work").expect("json")).await.expect("send") })
        };
        let to_scheduler = send(&inbox);
        let delivered =
            tokio::time::timeout(Duration::from_secs(10), scheduler).await.expect("delivered before the flush").expect("joined");
        assert_eq!(delivered.len(), 1);
        let to_agent = send(&agents);
        // Time for a wrong answer to show; with the flush held, none can be right.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!to_scheduler.is_finished() && !to_agent.is_finished(), "a send answered before its flush");
        assert!(!agent.is_finished(), "a receiver that calls out got a message not yet durable");

        drop(held);
        let ten_s = Duration::from_secs(10);
        assert_eq!(tokio::time::timeout(ten_s, agent).await.expect("delivered after the flush").expect("joined").len(), 1);
        tokio::time::timeout(ten_s, to_scheduler).await.expect("sent").expect("joined");
        tokio::time::timeout(ten_s, to_agent).await.expect("sent").expect("joined");
        assert_eq!(store.commit_counts().replied_at_commit - before, 2, "the claim and the Scheduler's delivery");

        // A commit no one waits for is not flushed on its own.
        let flushes = store.commit_counts().flushes;
        assert!(store.claim_tasks(&owner, Duration::from_secs(60), 1).await.expect("claim").is_empty());
        assert_eq!(store.commit_counts().flushes, flushes, "a claim alone was flushed");
    }

    /// A reply handed at commit to a Scheduler waits for the flush of the
    /// Scheduler's next commit, and one flush makes both durable; with no
    /// next commit, the wait runs out and the reply is flushed alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_that_answered_a_scheduler_shares_the_flush_of_its_next_commit() {
        use std::sync::Arc;
        use std::task::{Context, Waker};

        use rota_model::SystemClock;
        use rota_store::{Queues, Receive};

        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut config = Config::new(dir.path().join("follow-up.db"));
        config.follow_up_wait = Config::FOLLOW_UP_WAIT_MAX;
        let store = Arc::new(super::SqliteStore::open(config, Arc::new(SystemClock)).expect("open"));
        let (inbox, agents) = (QueueName::new("inbox").expect("a queue name"), QueueName::new("agents").expect("a queue name"));
        let waiting = Receive::up_to(1).waiting(Duration::from_secs(60)).acting_within_store();
        let send = |queue: &QueueName| {
            let (store, queue) = (store.clone(), queue.clone());
            tokio::spawn(async move { store.send(&queue, Outgoing::json(&"work").expect("json")).await.expect("send") })
        };
        let ten_s = Duration::from_secs(10);

        let mut scheduler = store.receive(&inbox, waiting.clone());
        // One poll hands the receive to the writer: the reply sent next
        // queues behind it, so the writer parks the receiver first.
        assert!(scheduler.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending());
        let flushes = store.commit_counts().flushes;
        let reply = send(&inbox);
        let delivered = tokio::time::timeout(ten_s, scheduler).await.expect("delivered at commit").expect("receive");
        assert_eq!(delivered.len(), 1);
        assert!(!reply.is_finished(), "the reply's flush did not wait for the Scheduler's next commit");
        let decision = send(&agents);
        tokio::time::timeout(ten_s, decision).await.expect("the decision is flushed").expect("joined");
        tokio::time::timeout(ten_s, reply).await.expect("the reply is flushed with it").expect("joined");
        assert_eq!(store.commit_counts().flushes - flushes, 1, "one flush for the reply and the decision");

        let mut scheduler = store.receive(&inbox, waiting);
        assert!(scheduler.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending());
        let flushes = store.commit_counts().flushes;
        let reply = send(&inbox);
        tokio::time::timeout(ten_s, reply).await.expect("the wait ran out and the reply was flushed").expect("joined");
        assert_eq!(tokio::time::timeout(ten_s, scheduler).await.expect("delivered").expect("receive").len(), 1);
        assert_eq!(store.commit_counts().flushes - flushes, 1, "the reply alone");
    }

    /// A decision within a lease (a new epoch, a new update time) writes the
    /// task's own page and no index page: SQLite rewrites the entry of every
    /// index over a column an UPDATE sets, even to the value it had, and
    /// each page so written is one more frame in the WAL.
    #[test]
    fn a_write_within_a_lease_touches_no_index_of_the_task() {
        use rota_store::TaskWrite;

        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("frames.db");
        let mut conn = open_connection(&Config::new(&path)).expect("open");
        schema::migrate(&mut conn).expect("migrate");
        let owner = InstanceId::new("scheduler-1").expect("an instance id");
        let now = Timestamp::from_millis(1_000_000);
        let workflow = WorkflowName::new("orders").expect("a workflow name");
        for i in 0..500 {
            let task = Task::new(TaskId::new(format!("t{i}")).expect("a task id"), workflow.clone(), 1, serde_json::json!({}), now);
            task_sql::insert_task(&conn, &task).expect("insert");
        }
        let claimed = task_sql::claim_tasks(&conn, &owner, Duration::from_secs(10), Claim::by_priority(1), now).expect("claim");
        let before = claimed.into_iter().next().expect("a task claimed");
        let mut after = before.clone();
        after.lease_epoch += 1;
        after.updated_at = now.add(Duration::from_millis(3));
        let page_size: u64 = conn.query_row("PRAGMA page_size", [], |row| row.get::<_, i64>(0)).expect("page size").unsigned_abs();
        let wal = dir.path().join("frames.db-wal");

        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").expect("checkpoint");
        conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
        task_sql::write_task(&conn, &TaskWrite::replacing(&before, after.clone())).expect("the write");
        conn.execute_batch("COMMIT").expect("commit");
        let frames = std::fs::metadata(&wal).expect("the WAL").len().saturating_sub(32) / (page_size + 24);
        assert_eq!(frames, 1, "the task's page alone");

        // Giving the task back does change indexed columns, and writes them.
        let mut released = after.clone();
        released.locked_by = None;
        released.complete_by = None;
        released.state = rota_model::TaskState::Pending;
        released.lease_epoch += 1;
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").expect("checkpoint");
        task_sql::write_task(&conn, &TaskWrite::replacing(&after, released.clone())).expect("the release");
        let frames = std::fs::metadata(&wal).expect("the WAL").len().saturating_sub(32) / (page_size + 24);
        assert!(frames > 1, "a release moves the task between indexes: {frames} frame(s)");
        assert_eq!(task_sql::get_task(&conn, &released.id).expect("read").expect("found").task, released);
    }

    #[test]
    fn a_claim_does_not_walk_the_tasks_of_a_paused_workflow() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut conn = open_connection(&Config::new(dir.path().join("held.db"))).expect("open");
        schema::migrate(&mut conn).expect("migrate");
        let owner = InstanceId::new("scheduler-1").expect("an instance id");
        let paused = WorkflowName::new("refunds").expect("a workflow name");
        let now = Timestamp::from_millis(1_000_000);
        let create = |first: u32, count: u32| {
            for i in first..first + count {
                let task = Task::new(TaskId::new(format!("r{i}")).expect("a task id"), paused.clone(), 1, serde_json::json!({}), now);
                task_sql::insert_task(&conn, &task).expect("insert");
            }
        };
        // Paused with a few tasks before, and more submitted during the pause.
        create(0, 10);
        let pause = WorkflowPause { workflow: paused.clone(), paused: true, by: "ann".into(), reason: None, at: now };
        task_sql::set_workflow_paused(&conn, &pause).expect("pause");
        create(10, 10);
        let claim = || task_sql::claim_tasks(&conn, &owner, Duration::from_secs(10), Claim::by_priority(10), now).expect("claim");
        assert!(claim().is_empty(), "a paused workflow's task was claimed");
        steps_taken(&conn);
        assert!(claim().is_empty());
        let beside_few = steps_taken(&conn);
        create(20, 2_000);
        steps_taken(&conn);
        assert!(claim().is_empty());
        let beside_many = steps_taken(&conn);
        assert_eq!(beside_many, beside_few, "the claim's work grew with the paused backlog");

        let resume = WorkflowPause { paused: false, ..pause };
        task_sql::set_workflow_paused(&conn, &resume).expect("resume");
        assert_eq!(claim().len(), 10, "resumed, its tasks are claimed, those submitted during the pause too");
    }

    #[test]
    fn claims_are_not_compiled_again_for_each_new_time_or_size() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut conn = open_connection(&Config::new(dir.path().join("plans.db"))).expect("open");
        compile_once(&conn).expect("the writer's planner setting");
        schema::migrate(&mut conn).expect("migrate");
        let owner = InstanceId::new("scheduler-1").expect("an instance id");
        let name = QueueName::new("agent.noop").expect("a queue name");
        let mut now = Timestamp::from_millis(1_000_000);
        for round in 1..=20u32 {
            now = now.add(Duration::from_millis(7));
            let queue = queue_sql::ensure_queue(&conn, &name, now).expect("queue");
            let id = MessageId::new(format!("m{round}")).expect("a message id");
            queue_sql::send(&conn, &queue, &Outgoing::json(&round).expect("a body"), id, now).expect("send");
            let leased = queue_sql::claim(&conn, &queue, round % 5 + 1, Duration::from_secs(30), Some(&owner), now).expect("receive");
            assert_eq!(leased.len(), 1, "round {round}: the message just sent");
            task_sql::claim_tasks(&conn, &owner, Duration::from_secs(10), Claim::by_priority(round % 7 + 1), now).expect("claim");
        }
        assert_eq!(compiled_again(&conn), 0, "a statement was compiled again after a new binding");
    }
}
