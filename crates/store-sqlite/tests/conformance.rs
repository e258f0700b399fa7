//! The shared conformance suite, on SQLite: each case gets a fresh file.

use std::sync::Arc;

use async_trait::async_trait;
use rota_model::ManualClock;
use rota_store::SharedStore;
use rota_store::conformance::Harness;
use rota_store_sqlite::{Config, SqliteStore};

struct SqliteHarness {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
}

impl SqliteHarness {
    fn new() -> Self {
        SqliteHarness { dir: tempfile::tempdir().expect("temp dir"), clock: Arc::new(ManualClock::default()) }
    }
}

#[async_trait]
impl Harness for SqliteHarness {
    async fn open(&self) -> SharedStore {
        let mut config = Config::new(self.dir.path().join("conformance.db"));
        // Short polls keep the long-poll cases quick.
        config.poll_interval = std::time::Duration::from_millis(10);
        Arc::new(SqliteStore::open(config, self.clock.clone()).expect("open sqlite store"))
    }

    fn clock(&self) -> Arc<ManualClock> {
        self.clock.clone()
    }
}

rota_store::conformance_suite!(SqliteHarness::new());
