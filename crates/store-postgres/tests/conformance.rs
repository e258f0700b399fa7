//! The shared conformance suite, on PostgreSQL: each case gets a fresh
//! schema. Needs `ROTA_TEST_POSTGRES_URL`; without it each case prints a
//! `SKIP` line.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rota_model::ManualClock;
use rota_store::SharedStore;
use rota_store::conformance::Harness;
use rota_store_postgres::{Config, PgStore};
use rota_testkit::postgres::TestSchema;

struct PgHarness {
    schema: TestSchema,
    clock: Arc<ManualClock>,
    /// `Config::sparse_matches_max`, when not the default.
    sparse_matches_max: Option<u32>,
}

impl PgHarness {
    fn new() -> Option<Self> {
        let schema = TestSchema::new("conformance on PostgreSQL")?;
        Some(PgHarness { schema, clock: Arc::new(ManualClock::default()), sparse_matches_max: None })
    }
}

#[async_trait]
impl Harness for PgHarness {
    async fn open(&self) -> SharedStore {
        let mut config = Config::new(self.schema.url.clone());
        config.schema = self.schema.name.clone();
        config.connections_max = 8;
        // Short polls keep the long-poll cases quick.
        config.poll_interval = Duration::from_millis(10);
        config.sparse_matches_max = self.sparse_matches_max.unwrap_or(config.sparse_matches_max);
        Arc::new(PgStore::open(config, self.clock.clone()).await.expect("open postgres store"))
    }

    fn clock(&self) -> Arc<ManualClock> {
        self.clock.clone()
    }
}

rota_store::conformance_suite!(optional PgHarness::new());

/// The search case again with every match taken as dense: each listing
/// walks the tasks newest first and tests every condition on each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_are_found_walking_newest_first_when_every_match_is_dense() {
    let Some(harness) = PgHarness::new() else { return };
    let harness = PgHarness { sparse_matches_max: Some(0), ..harness };
    rota_store::conformance::tasks_are_found_by_tags_times_and_id_prefix(&harness).await;
}
