//! The store URL: which backend to open, and where.
//!
//! `--store` (or `ROTA_STORE`) takes `sqlite://relative/path.db`,
//! `sqlite:///absolute/path.db`, a bare path ending in `.db`, `.sqlite` or
//! `.sqlite3`, or `postgres://user@host:port/database`. A PostgreSQL URL may
//! carry options of rota's own, taken off before the URL reaches the
//! driver: `schema=NAME` (the schema holding rota's tables, default `rota`),
//! `connections=N` (the pool size), `commit_batch=N` (the most commits
//! applied in one statement) and `commits_in_flight=N` (the most commit
//! statements running at once). Every command that touches a store
//! opens it through [`open_store`], so the rules live here once.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use rota_model::SystemClock;
use rota_store::SharedStore;
use rota_store_sqlite::{Config, Durability, SqliteStore};

/// The store URL used when neither `--store` nor `ROTA_STORE` is given.
pub const STORE_URL_DEFAULT: &str = "sqlite://rota.db";

/// File name endings accepted as a bare SQLite path.
const SQLITE_EXTENSIONS: [&str; 3] = ["db", "sqlite", "sqlite3"];

/// A parsed store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// A SQLite database file (created when missing; its directory must exist).
    Sqlite(PathBuf),
    /// A PostgreSQL database.
    Postgres(PostgresUrl),
}

/// A PostgreSQL store URL, split into the driver's URL and rota's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresUrl {
    /// The URL for the driver, without rota's options.
    pub url: String,
    /// `schema=`: the schema that holds rota's tables.
    pub schema: Option<String>,
    /// `connections=`: the most pooled connections.
    pub connections: Option<u32>,
    /// `commit_batch=`: the most commits applied in one statement.
    pub commit_batch: Option<usize>,
    /// `commits_in_flight=`: the most commit statements running at once.
    pub commits_in_flight: Option<usize>,
}

impl PostgresUrl {
    fn parse(url: &str) -> anyhow::Result<PostgresUrl> {
        let mut parsed = PostgresUrl { url: url.to_owned(), schema: None, connections: None, commit_batch: None, commits_in_flight: None };
        let Some((base, query)) = url.split_once('?') else { return Ok(parsed) };
        let count = |option: &str, value: &str| -> anyhow::Result<u32> {
            let count = value.parse::<u32>().ok().filter(|n| (1..=1000).contains(n));
            count.with_context(|| format!("store URL option {option}={value:?} must be a number from 1 to 1000"))
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            match pair.split_once('=') {
                Some(("schema", value)) => parsed.schema = Some(value.to_owned()),
                Some(("connections", value)) => parsed.connections = Some(count("connections", value)?),
                Some(("commit_batch", value)) => parsed.commit_batch = Some(count("commit_batch", value)? as usize),
                Some(("commits_in_flight", value)) => parsed.commits_in_flight = Some(count("commits_in_flight", value)? as usize),
                _ => kept.push(pair),
            }
        }
        parsed.url = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        Ok(parsed)
    }

    /// The store configuration this URL asks for.
    pub fn config(&self) -> rota_store_postgres::Config {
        let mut config = rota_store_postgres::Config::new(self.url.clone());
        if let Some(schema) = &self.schema {
            config.schema = schema.clone();
        }
        if let Some(connections) = self.connections {
            config.connections_max = connections;
        }
        if let Some(batch) = self.commit_batch {
            config.commit_batch_max = batch;
        }
        if let Some(in_flight) = self.commits_in_flight {
            config.commits_in_flight = in_flight;
        }
        config
    }
}

impl StoreUrl {
    /// Parses a store URL; the error says what forms are accepted.
    pub fn parse(url: &str) -> anyhow::Result<StoreUrl> {
        let url = url.trim();
        if url.is_empty() {
            bail!("the store URL is empty; {EXPECTED}");
        }
        if let Some(rest) = url.strip_prefix("sqlite:") {
            // `sqlite://rel.db`, `sqlite:///abs.db` and sqlx's `sqlite:rel.db`.
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                bail!("store URL {url:?} names no database file; {EXPECTED}");
            }
            if path.contains('?') {
                bail!("store URL {url:?} has query options, which are not supported; {EXPECTED}");
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(StoreUrl::Postgres(PostgresUrl::parse(url)?));
        }
        if let Some((scheme, _)) = url.split_once("://") {
            bail!("unknown store URL scheme {scheme:?} in {url:?}; {EXPECTED}");
        }
        let path = Path::new(url);
        let extension = path.extension().and_then(|ext| ext.to_str()).unwrap_or("");
        if SQLITE_EXTENSIONS.contains(&extension) {
            return Ok(StoreUrl::Sqlite(path.to_path_buf()));
        }
        bail!("unrecognised store URL {url:?}; {EXPECTED}")
    }
}

const EXPECTED: &str =
    "expected sqlite://PATH, sqlite:///ABSOLUTE/PATH, postgres://USER@HOST:PORT/DATABASE or a file path ending in .db or .sqlite";

/// How hard a SQLite commit tries to survive power loss (`--durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DurabilityArg {
    /// Every acknowledged commit is fsynced first.
    #[default]
    Full,
    /// Survives a process crash; the last commits may be lost on power loss.
    Normal,
}

impl From<DurabilityArg> for Durability {
    fn from(arg: DurabilityArg) -> Durability {
        match arg {
            DurabilityArg::Full => Durability::Full,
            DurabilityArg::Normal => Durability::Normal,
        }
    }
}

impl fmt::Display for DurabilityArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DurabilityArg::Full => "full",
            DurabilityArg::Normal => "normal",
        })
    }
}

/// Opens the store that `url` names, with the given durability (SQLite only:
/// PostgreSQL's durability is the server's `synchronous_commit`), running
/// its migrations.
///
/// Errors are one line that names the URL (without a password) and the
/// reason, e.g. a directory that does not exist or a server that does not answer.
pub async fn open_store(url: &str, durability: Durability) -> anyhow::Result<SharedStore> {
    match StoreUrl::parse(url)? {
        StoreUrl::Postgres(postgres) => {
            let store = rota_store_postgres::PgStore::open(postgres.config(), Arc::new(SystemClock))
                .await
                .with_context(|| format!("cannot open store {}", redacted(url)))?;
            Ok(Arc::new(store))
        }
        StoreUrl::Sqlite(path) => {
            // SQLite creates the file but not its directory, and its own error
            // ("unable to open database file") does not say which part is missing.
            if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty())
                && !parent.is_dir()
            {
                bail!("cannot open store {url}: directory {} does not exist", parent.display());
            }
            if path.is_dir() {
                bail!("cannot open store {url}: {} is a directory, not a database file", path.display());
            }
            let mut config = Config::new(path);
            config.durability = durability;
            let store = SqliteStore::open(config, Arc::new(SystemClock)).with_context(|| format!("cannot open store {url}"))?;
            Ok(Arc::new(store))
        }
    }
}

/// The store URL without a password (`postgres://user:secret@host` shows as
/// `postgres://user:***@host`), for logs and messages.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let Some((userinfo, host)) = rest.split_once('@') else { return url.to_owned() };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(url: &str, expected: Option<StoreUrl>) {
        match (StoreUrl::parse(url), expected) {
            (Ok(got), Some(want)) => assert_eq!(got, want, "{url}"),
            (Err(_), None) => {}
            (got, want) => panic!("{url:?}: got {got:?}, want {want:?}"),
        }
    }

    fn sqlite(path: &str) -> Option<StoreUrl> {
        Some(StoreUrl::Sqlite(PathBuf::from(path)))
    }

    #[test]
    fn sqlite_urls_name_relative_and_absolute_files() {
        check("sqlite://rota.db", sqlite("rota.db"));
        check("sqlite://data/q.db", sqlite("data/q.db"));
        check("sqlite:///var/lib/rota/q.db", sqlite("/var/lib/rota/q.db"));
        check("sqlite:q.db", sqlite("q.db"));
        check("sqlite://", None);
        check("sqlite://q.db?mode=rwc", None);
    }

    #[test]
    fn bare_paths_need_a_database_extension() {
        check("q.db", sqlite("q.db"));
        check("/tmp/x/q.sqlite", sqlite("/tmp/x/q.sqlite"));
        check("./q.sqlite3", sqlite("./q.sqlite3"));
        check("q.txt", None);
        check("q", None);
        check("", None);
    }

    fn postgres(url: &str, schema: Option<&str>, connections: Option<u32>) -> Option<StoreUrl> {
        Some(StoreUrl::Postgres(PostgresUrl {
            url: url.into(),
            schema: schema.map(Into::into),
            connections,
            commit_batch: None,
            commits_in_flight: None,
        }))
    }

    #[test]
    fn postgres_urls_keep_driver_options_and_take_rotas_own() {
        check("postgres://rota@localhost/rota", postgres("postgres://rota@localhost/rota", None, None));
        check("postgresql://localhost", postgres("postgresql://localhost", None, None));
        check(
            "postgres://h/db?sslmode=require&schema=jobs&connections=8",
            postgres("postgres://h/db?sslmode=require", Some("jobs"), Some(8)),
        );
        let StoreUrl::Postgres(tuned) = StoreUrl::parse("postgres://h/db?commit_batch=16&commits_in_flight=2").unwrap() else {
            panic!("a PostgreSQL URL")
        };
        assert_eq!((tuned.commit_batch, tuned.commits_in_flight, tuned.url.as_str()), (Some(16), Some(2), "postgres://h/db"));
        assert_eq!((tuned.config().commit_batch_max, tuned.config().commits_in_flight), (16, 2));
        check("postgres://h/db?commit_batch=0", None);
        check("postgres://h/db?connections=0", None);
        check("postgres://h/db?connections=many", None);
        check("mysql://localhost/x.db", None);
    }

    #[tokio::test]
    async fn opening_names_the_missing_directory_and_the_unreachable_server() {
        let err = open_store("sqlite:///nonexistent-rota-dir/sub/q.db", Durability::Full).await.err().unwrap();
        assert_eq!(
            err.to_string(),
            "cannot open store sqlite:///nonexistent-rota-dir/sub/q.db: directory /nonexistent-rota-dir/sub does not exist"
        );
        // Port 1 on loopback refuses at once.
        let err = open_store("postgres://rota:secret@127.0.0.1:1/rota", Durability::Full).await.err().unwrap();
        let message = format!("{err:#}");
        assert!(message.starts_with("cannot open store postgres://rota:***@127.0.0.1:1/rota: "), "{message}");
        assert!(!message.contains("secret"), "the password never shows: {message}");
    }

    #[test]
    fn shown_store_urls_hide_passwords() {
        assert_eq!(redacted("postgres://rota:s3cret@db:5432/rota"), "postgres://rota:***@db:5432/rota");
        assert_eq!(redacted("postgres://rota@db/rota"), "postgres://rota@db/rota");
        assert_eq!(redacted("sqlite:///var/lib/rota.db"), "sqlite:///var/lib/rota.db");
    }
}
