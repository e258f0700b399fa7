//! rota's Store on SQLite. (Implementation in progress.)
use std::path::PathBuf;
use std::time::Duration;

/// How hard a commit tries to survive power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=FULL`: every acknowledged commit is fsynced first.
    #[default]
    Full,
    /// `synchronous=NORMAL`: survives a process crash, may lose the last commits on power loss.
    Normal,
}

/// Settings of a SQLite store.
#[derive(Debug, Clone)]
pub struct Config {
    /// The database file.
    pub path: PathBuf,
    /// fsync policy.
    pub durability: Durability,
    /// The most operations one group commit takes.
    pub batch_ops_max: usize,
    /// Capacity of the channel to the writer thread.
    pub pending_ops_max: usize,
    /// How often waiting receivers re-check for work written by other processes.
    pub poll_interval: Duration,
    /// How long to wait for another process's write lock.
    pub busy_timeout: Duration,
    /// The largest message body accepted, in bytes.
    pub body_bytes_max: usize,
}

impl Config {
    /// Defaults for a database at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Config {
            path: path.into(),
            durability: Durability::Full,
            batch_ops_max: 1024,
            pending_ops_max: 8192,
            poll_interval: Duration::from_millis(50),
            busy_timeout: Duration::from_secs(5),
            body_bytes_max: rota_store::BODY_BYTES_MAX,
        }
    }
}

/// The store.
pub struct SqliteStore {}

impl SqliteStore {
    /// Opens (creating if needed) the database and starts the writer thread.
    pub fn open(_config: Config, _clock: std::sync::Arc<dyn rota_model::Clock>) -> rota_store::Result<SqliteStore> {
        Err(rota_store::Error::Unavailable("not yet implemented".into()))
    }
}
