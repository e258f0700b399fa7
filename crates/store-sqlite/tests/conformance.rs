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
    /// `Config::sparse_matches_max`, when not the default.
    sparse_matches_max: Option<u32>,
}

impl SqliteHarness {
    fn new() -> Self {
        SqliteHarness { dir: tempfile::tempdir().expect("temp dir"), clock: Arc::new(ManualClock::default()), sparse_matches_max: None }
    }
}

#[async_trait]
impl Harness for SqliteHarness {
    async fn open(&self) -> SharedStore {
        let mut config = Config::new(self.dir.path().join("conformance.db"));
        // Short polls keep the long-poll cases quick.
        config.poll_interval = std::time::Duration::from_millis(10);
        config.sparse_matches_max = self.sparse_matches_max.unwrap_or(config.sparse_matches_max);
        Arc::new(SqliteStore::open(config, self.clock.clone()).expect("open sqlite store"))
    }

    fn clock(&self) -> Arc<ManualClock> {
        self.clock.clone()
    }
}

rota_store::conformance_suite!(SqliteHarness::new());

/// The search case again with every match taken as dense: each listing
/// walks the tasks newest first and tests every condition on each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_are_found_walking_newest_first_when_every_match_is_dense() {
    let harness = SqliteHarness { sparse_matches_max: Some(0), ..SqliteHarness::new() };
    rota_store::conformance::tasks_are_found_by_tags_times_and_id_prefix(&harness).await;
}
