//! The store URL: which backend to open, and where.
//!
//! `--store` (or `ROTA_STORE`) takes `sqlite://relative/path.db`,
//! `sqlite:///absolute/path.db`, or a bare path ending in `.db`, `.sqlite` or
//! `.sqlite3`. `postgres://…` is recognised so that it fails with a clear
//! message until the PostgreSQL backend exists. Every command that touches a
//! store opens it through [`open_store`], so the rules live here once.

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
    /// A PostgreSQL server (not built yet).
    Postgres,
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
            return Ok(StoreUrl::Postgres);
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

const EXPECTED: &str = "expected sqlite://PATH, sqlite:///ABSOLUTE/PATH, postgres://… or a file path ending in .db or .sqlite";

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

/// Opens the store that `url` names, with the given durability (SQLite only).
///
/// Errors are one line that names the URL and the reason, e.g. a directory
/// that does not exist or a backend that is not built.
pub fn open_store(url: &str, durability: Durability) -> anyhow::Result<SharedStore> {
    match StoreUrl::parse(url)? {
        StoreUrl::Postgres => {
            bail!("cannot open store {url}: the PostgreSQL store is not built yet (issue 4); use sqlite://PATH")
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

    #[test]
    fn postgres_is_recognised_and_other_schemes_refused() {
        check("postgres://rota@localhost/rota", Some(StoreUrl::Postgres));
        check("postgresql://localhost", Some(StoreUrl::Postgres));
        check("mysql://localhost/x.db", None);
    }

    #[test]
    fn opening_names_the_missing_directory_and_the_missing_backend() {
        let err = open_store("sqlite:///nonexistent-rota-dir/sub/q.db", Durability::Full).err().unwrap();
        assert_eq!(
            err.to_string(),
            "cannot open store sqlite:///nonexistent-rota-dir/sub/q.db: directory /nonexistent-rota-dir/sub does not exist"
        );
        let err = open_store("postgres://localhost/rota", Durability::Full).err().unwrap();
        assert!(err.to_string().contains("PostgreSQL store is not built yet (issue 4)"), "{err}");
    }
}
