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
}

impl PgHarness {
    fn new() -> Option<Self> {
        let schema = TestSchema::new("conformance on PostgreSQL")?;
        Some(PgHarness { schema, clock: Arc::new(ManualClock::default()) })
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
        Arc::new(PgStore::open(config, self.clock.clone()).await.expect("open postgres store"))
    }

    fn clock(&self) -> Arc<ManualClock> {
        self.clock.clone()
    }
}

rota_store::conformance_suite!(optional PgHarness::new());
