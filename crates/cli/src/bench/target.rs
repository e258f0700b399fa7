//! The store a benchmark run measures: a fresh SQLite file, or a fresh
//! schema on PostgreSQL, both empty when the run starts and removed after.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use rota_model::SystemClock;
use rota_store::SharedStore;
use rota_store_postgres::PgStore;
use rota_store_sqlite::{CommitCounts, Durability, SqliteStore};
use serde_json::{Value, json};

use super::cpu::{CpuMeter, LocalServer};
use super::{Workdir, env_string, workdir};
use crate::store_args::StoreArgs;
use crate::store_url::{StoreUrl, redacted};

/// The store under measurement and how to describe it in the record.
/// A store's size on disk (see [`Target::store_size`]).
pub(crate) struct StoreSize {
    /// The file's pages, or the schema's tables and indexes.
    pub bytes: u64,
    /// SQLite only: the pages among them that hold nothing.
    pub free_bytes: Option<u64>,
    /// SQLite only: the write-ahead log's file.
    pub wal_bytes: Option<u64>,
}

pub(crate) struct Target {
    pub(crate) store: SharedStore,
    backend: Backend,
}

enum Backend {
    Sqlite { store: Arc<SqliteStore>, durability: Durability, _workdir: Workdir },
    Postgres { store: Arc<PgStore>, url: String },
}

impl Target {
    /// Opens the store `--store` names: `sqlite` (or a SQLite URL) or
    /// `postgres` (the database at `$PEERS_PG_URL`) or a PostgreSQL URL. On
    /// PostgreSQL every run gets a schema of its own, dropped by [`Target::close`].
    pub(crate) async fn open(store_args: &StoreArgs) -> anyhow::Result<Target> {
        let url = store_args.url.trim();
        let postgres_url = if url == "postgres" {
            Some(env_string("PEERS_PG_URL").context("--store postgres takes the database URL from PEERS_PG_URL, which is unset")?)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(url.to_owned())
        } else {
            None
        };
        if let Some(url) = postgres_url {
            let StoreUrl::Postgres(parsed) = StoreUrl::parse(&url)? else { bail!("{} is not a PostgreSQL URL", redacted(&url)) };
            let mut config = parsed.config();
            if parsed.schema.is_none() {
                config.schema = format!("rota_bench_{}", std::process::id());
            }
            // A leftover schema of an earlier run would not be empty.
            if let Ok(stale) = PgStore::open(config.clone(), Arc::new(SystemClock)).await {
                stale.drop_schema().await.ok();
            }
            let store = Arc::new(
                PgStore::open(config, Arc::new(SystemClock)).await.with_context(|| format!("cannot open store {}", redacted(&url)))?,
            );
            return Ok(Target { store: store.clone(), backend: Backend::Postgres { store, url } });
        }
        let workdir = workdir(url)?;
        let durability: Durability = store_args.durability.into();
        let mut config = rota_store_sqlite::Config::new(&workdir.db);
        config.durability = durability;
        let store = Arc::new(
            SqliteStore::open(config, Arc::new(SystemClock))
                .with_context(|| format!("cannot open the SQLite store {}", workdir.db.display()))?,
        );
        Ok(Target { store: store.clone(), backend: Backend::Sqlite { store, durability, _workdir: workdir } })
    }

    /// The store URL for child processes of the run (`rota agent`).
    pub(crate) fn child_store_url(&self) -> String {
        match &self.backend {
            Backend::Sqlite { store, .. } => format!("sqlite://{}", store.config().path.display()),
            Backend::Postgres { store, url } => {
                let (base, _) = url.split_once('?').unwrap_or((url, ""));
                format!("{base}?schema={}", store.config().schema)
            }
        }
    }

    /// The peer name used when the harness does not give one.
    pub(crate) fn peer_default(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite { .. } => "rota-sqlite",
            Backend::Postgres { .. } => "rota-pg",
        }
    }

    /// The group-commit counters (SQLite's writer thread only).
    pub(crate) fn commit_counts(&self) -> Option<CommitCounts> {
        match &self.backend {
            Backend::Sqlite { store, .. } => Some(store.commit_counts()),
            Backend::Postgres { .. } => None,
        }
    }

    /// PostgreSQL's commit statements: `Tasks::commit` calls and the
    /// statements that ran them (group commit).
    pub(crate) fn postgres_commit_counts(&self) -> Option<rota_store_postgres::CommitCounts> {
        match &self.backend {
            Backend::Sqlite { .. } => None,
            Backend::Postgres { store, .. } => Some(store.commit_counts()),
        }
    }

    /// The durability settings read back from the store, with `meets_rule`.
    pub(crate) async fn durability(&self) -> anyhow::Result<Value> {
        Ok(match &self.backend {
            Backend::Sqlite { store, durability, .. } => {
                let pragmas = store.pragmas().await?;
                json!({
                    "store": "SQLite file in PEERS_WORKDIR (rota-store-sqlite: rusqlite, bundled libsqlite3; one writer thread, group commit)",
                    "journal_mode": pragmas.journal_mode,
                    "synchronous": pragmas.synchronous,
                    "flushed_before_reply": pragmas.flushed_before_reply,
                    "durability_flag": match durability { Durability::Full => "full", Durability::Normal => "normal" },
                    "how": "read back from the store (SqliteStore::pragmas: journal_mode of the file, synchronous of the writing connection; flushed_before_reply: its flusher thread fdatasyncs the WAL after each commit and before any reply, so synchronous is normal; the Scheduler's claims and receives hear at the commit, and its next commit, flushed before any agent or client hears of it, makes them durable too)",
                    "meets_rule": pragmas.journal_mode == "wal" && (pragmas.flushed_before_reply || matches!(pragmas.synchronous.as_str(), "full" | "extra")),
                })
            }
            Backend::Postgres { store, url } => {
                let settings = store.server_settings().await?;
                json!({
                    "store": format!("PostgreSQL {} at {} (rota-store-postgres: sqlx, schema {}, {} pooled connections)",
                        settings.version, redacted(url), store.config().schema, store.config().connections_max),
                    "synchronous_commit": settings.synchronous_commit,
                    "fsync": settings.fsync,
                    "autovacuum": settings.autovacuum,
                    "tls": settings.tls.as_deref().unwrap_or("off"),
                    "how": "read back from the server (current_setting, pg_stat_ssl) on the store's own connection",
                    "meets_rule": settings.survives_power_loss(),
                })
            }
        })
    }

    /// The store's size on disk: the SQLite file's pages (with how many of
    /// them are free) and its WAL apart, or the PostgreSQL schema's tables
    /// with their indexes.
    pub(crate) async fn store_size(&self) -> anyhow::Result<StoreSize> {
        Ok(match &self.backend {
            Backend::Sqlite { store, .. } => {
                let pages = store.pages().await?;
                let mut wal = store.config().path.clone().into_os_string();
                wal.push("-wal");
                let wal_bytes = std::fs::metadata(&wal).map_or(0, |meta| meta.len());
                StoreSize { bytes: pages.total * pages.size, free_bytes: Some(pages.free * pages.size), wal_bytes: Some(wal_bytes) }
            }
            Backend::Postgres { store, .. } => StoreSize { bytes: store.schema_bytes().await?, free_bytes: None, wal_bytes: None },
        })
    }

    /// What measures the run's CPU time: this process, the agent
    /// `children`, and the PostgreSQL server when it runs on this machine
    /// and tells this user its data directory (a superuser, or a member of
    /// `pg_read_all_settings`, sees it in `pg_settings`).
    pub(crate) async fn cpu_meter(&self, children: Vec<u32>) -> CpuMeter {
        match &self.backend {
            Backend::Sqlite { .. } => CpuMeter::new(children, None, "none apart: SQLite runs inside the rota process"),
            Backend::Postgres { store, .. } => {
                let directory = store.data_directory().await.ok().flatten();
                match directory.as_deref().and_then(|directory| LocalServer::find(Path::new(directory))) {
                    Some(server) => CpuMeter::new(children, Some(server), ""),
                    None => CpuMeter::new(
                        children,
                        None,
                        "not measured: the server's data directory is hidden from this user or its postmaster.pid is not on this machine",
                    ),
                }
            }
        }
    }

    /// One line describing the store's configuration.
    pub(crate) fn description(&self) -> String {
        match &self.backend {
            Backend::Sqlite { store, durability, .. } => {
                let config = store.config();
                format!(
                    "SQLite, durability {durability:?}, batch_ops_max {}, pending_ops_max {}, poll_interval {:?}, follow_up_wait {:?}",
                    config.batch_ops_max, config.pending_ops_max, config.poll_interval, config.follow_up_wait
                )
            }
            Backend::Postgres { store, .. } => {
                let config = store.config();
                format!(
                    "PostgreSQL, schema {}, connections_max {}, poll_interval {:?} (LISTEN/NOTIFY wake-ups)",
                    config.schema, config.connections_max, config.poll_interval
                )
            }
        }
    }

    /// Closes the store and removes what the run created.
    pub(crate) async fn close(self) {
        drop(self.store);
        match self.backend {
            Backend::Sqlite { store, .. } => drop(store),
            Backend::Postgres { store, .. } => {
                // Anything of the run still holding the store (a client, a
                // listener) keeps it open: drop the schema through a store of
                // its own then, rather than leave the run's tables behind.
                let dropped = match Arc::try_unwrap(store) {
                    Ok(store) => store.drop_schema().await,
                    Err(shared) => match PgStore::open(shared.config().clone(), Arc::new(SystemClock)).await {
                        Ok(own) => own.drop_schema().await,
                        Err(err) => Err(err),
                    },
                };
                if let Err(err) = dropped {
                    tracing::warn!("cannot drop the benchmark's schema: {err}");
                }
            }
        }
    }
}
