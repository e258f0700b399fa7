//! What the engine's end-to-end tests share: a real store on either
//! backend. `on_each_backend!` turns each listed `async fn name(backend)`
//! into two tests, `sqlite::name` and `postgres::name`; the PostgreSQL ones
//! need `ROTA_TEST_POSTGRES_URL` and print a `SKIP` line without it.

use std::sync::Arc;

use rota_engine::replies::StatusMessage;
use rota_model::{Clock, QueueName};
use rota_store::{Receive, SharedStore};
use rota_testkit::postgres::TestSchema;

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A store on a fresh database (a temporary SQLite file, or a PostgreSQL
/// schema dropped at the end), kept alive with what it lives in.
pub struct TestStore {
    pub store: SharedStore,
    _dir: tempfile::TempDir,
    _schema: Option<TestSchema>,
}

/// Opens a fresh store on `backend`, or `None` when PostgreSQL is not configured.
pub async fn open(backend: Backend, clock: Arc<dyn Clock>) -> Option<TestStore> {
    let dir = tempfile::tempdir().expect("temp dir");
    match backend {
        Backend::Sqlite => {
            let config = rota_store_sqlite::Config::new(dir.path().join("test.db"));
            let store = rota_store_sqlite::SqliteStore::open(config, clock).expect("open the SQLite store");
            Some(TestStore { store: Arc::new(store), _dir: dir, _schema: None })
        }
        Backend::Postgres => {
            let schema = TestSchema::new("engine test on PostgreSQL")?;
            let mut config = rota_store_postgres::Config::new(schema.url.clone());
            config.schema = schema.name.clone();
            config.connections_max = 8;
            let store = rota_store_postgres::PgStore::open(config, clock).await.expect("open the PostgreSQL store");
            Some(TestStore { store: Arc::new(store), _dir: dir, _schema: Some(schema) })
        }
    }
}

impl TestStore {
    /// Another store on the same database, as another process would open
    /// it: on PostgreSQL a second `PgStore` on the same schema (its own
    /// connections and listener); on SQLite, where one process owns the
    /// file, the same store.
    #[allow(dead_code)] // Only the tests of work across processes use it.
    pub async fn another_process(&self, clock: Arc<dyn Clock>) -> SharedStore {
        match &self._schema {
            None => self.store.clone(),
            Some(schema) => {
                let mut config = rota_store_postgres::Config::new(schema.url.clone());
                config.schema = schema.name.clone();
                config.connections_max = 4;
                Arc::new(rota_store_postgres::PgStore::open(config, clock).await.expect("open a second PostgreSQL store"))
            }
        }
    }

    /// Runs `sql` on the store's database behind the store's back, as an
    /// operator editing it by hand would (`rota.` names the PostgreSQL
    /// schema); returns the rows it changed.
    #[allow(dead_code)] // Only the tests of the history's hash chain edit rows.
    pub async fn by_hand(&self, sql: &str) -> u64 {
        match &self._schema {
            None => {
                let conn = rusqlite::Connection::open(self._dir.path().join("test.db")).expect("open the SQLite file");
                conn.execute(&sql.replace("rota.", ""), []).expect("run the hand edit") as u64
            }
            Some(schema) => {
                use sqlx::Connection;
                let mut conn = sqlx::PgConnection::connect(&schema.url).await.expect("connect to PostgreSQL");
                let sql = sql.replace("rota.", &format!("{}.", schema.name));
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut conn).await.expect("run the hand edit").rows_affected()
            }
        }
    }
}

/// Runs each `async fn $name(backend: Backend)` of the file as two tests.
#[macro_export]
macro_rules! on_each_backend {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Postgres).await
                }
            )*
        }
    };
}

/// Every status message waiting in a response queue, received and
/// completed, oldest first; each must carry its task id as ordering key.
#[allow(dead_code)] // Only the tests of response queues read them.
pub async fn drain_status(store: &SharedStore, queue: &QueueName) -> Vec<StatusMessage> {
    let mut all = Vec::new();
    loop {
        let batch = store.receive(queue, Receive::up_to(100)).await.unwrap();
        if batch.is_empty() {
            return all;
        }
        for delivery in batch {
            let message: StatusMessage = serde_json::from_str(delivery.body.get()).unwrap();
            assert_eq!(delivery.ordering_key.as_deref(), Some(message.correlation_id.as_str()), "keyed by its task");
            all.push(message);
            store.complete(queue, delivery.lease_token).await.unwrap();
        }
    }
}
