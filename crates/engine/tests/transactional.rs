//! Transactional submit: an application creates a task inside its
//! own transaction, together with its own rows, with `Client::prepare` and
//! the backend's transactional create (`SqliteStore::create_task_with`,
//! `PgStore::create_task_in`). A failed or rolled-back transaction leaves
//! neither the row nor the task; a committed one leaves both, and the
//! embedded engine then runs the task.

use std::sync::Arc;
use std::time::Duration;

use rota_agent::{Agent, Request, StepError};
use rota_engine::engine::Config;
use rota_engine::{Engine, Shutdown, Submission};
use rota_model::{InstanceId, SystemClock, TaskId, TaskState, WorkflowName};
use rota_store::{Created, SharedStore, Tasks};
use rota_store_postgres::PgStore;
use rota_store_sqlite::SqliteStore;
use rota_testkit::postgres::TestSchema;
use rota_workflow::{AgentCatalog, AgentName, StepDef, Workflow};
use serde_json::{Value, json};
use sqlx::Connection;

struct Echo;

#[rota_engine::async_trait]
impl Agent for Echo {
    fn name(&self) -> &str {
        "echo"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        Ok(request.input.clone())
    }
}

fn workflow() -> Workflow {
    Workflow::builder("order", 1)
        .step(StepDef::new("charge", "echo").timeout(Duration::from_secs(5)))
        .build(&AgentCatalog::builtin().with(AgentName::new("echo").unwrap()))
        .unwrap()
}

fn engine(store: SharedStore) -> Engine {
    Engine::new(store, Arc::new(SystemClock), Config::new(InstanceId::new("tx-1").unwrap())).agent(Arc::new(Echo)).workflow(workflow())
}

fn submission(id: &str) -> Submission {
    Submission::new(WorkflowName::new("order").unwrap(), json!({ "order": id })).with_id(TaskId::new(id).unwrap())
}

/// Runs the engine until `id` is terminal, and returns its state.
async fn run_until_done(engine: Engine, id: &str) -> TaskState {
    let client = engine.client();
    let shutdown = Shutdown::new();
    let running = tokio::spawn(engine.run(shutdown.clone()));
    let state = client.wait(&TaskId::new(id).unwrap(), Duration::from_secs(20)).await.unwrap();
    shutdown.trigger();
    running.await.unwrap().unwrap();
    state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_task_and_the_applications_row_commit_together() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let store = Arc::new(SqliteStore::open(rota_store_sqlite::Config::new(&path), Arc::new(SystemClock)).unwrap());
    let shared: SharedStore = store.clone();
    let engine = engine(shared.clone());
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    let app = rusqlite::Connection::open(&path).unwrap();
    app.execute_batch("CREATE TABLE orders (id TEXT PRIMARY KEY)").unwrap();
    let orders = |app: &rusqlite::Connection| -> i64 { app.query_row("SELECT COUNT(*) FROM orders", [], |row| row.get(0)).unwrap() };

    // The application's write fails (a duplicate key): nothing is kept.
    let new = client.prepare(submission("order-1")).await.unwrap();
    let failed = store
        .create_task_with(new, |conn, _| {
            conn.execute("INSERT INTO orders (id) VALUES ('order-1')", [])?;
            conn.execute("INSERT INTO orders (id) VALUES ('order-1')", [])
        })
        .await;
    assert!(matches!(failed, Err(rota_store::Error::Invalid(_))), "{failed:?}");
    assert!(store.task(&TaskId::new("order-1").unwrap()).await.unwrap().is_none(), "the task was not kept");
    assert_eq!(orders(&app), 0, "nor the application's row");

    // Both succeed: both are kept, and the engine runs the task.
    let new = client.prepare(submission("order-1")).await.unwrap();
    let (created, inserted) =
        store.create_task_with(new, |conn, _| conn.execute("INSERT INTO orders (id) VALUES ('order-1')", [])).await.unwrap();
    assert_eq!((created, inserted), (Created::New, 1));
    assert_eq!(orders(&app), 1);
    assert_eq!(run_until_done(engine, "order-1").await, TaskState::Processed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_task_and_the_applications_row_commit_together() {
    let Some(schema) = TestSchema::new("transactional submit with the engine on PostgreSQL") else { return };
    let mut config = rota_store_postgres::Config::new(schema.url.clone());
    config.schema = schema.name.clone();
    let store = Arc::new(PgStore::open(config, Arc::new(SystemClock)).await.unwrap());
    let shared: SharedStore = store.clone();
    let engine = engine(shared.clone());
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    let mut app = sqlx::PgConnection::connect(&schema.url).await.unwrap();
    let table = format!("\"{}\".orders", schema.name);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE TABLE {table} (id TEXT PRIMARY KEY)"))).execute(&mut app).await.unwrap();
    let insert = format!("INSERT INTO {table} (id) VALUES ($1)");
    let count = format!("SELECT COUNT(*) FROM {table}");

    let mut tx = app.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(insert.clone())).bind("order-1").execute(&mut *tx).await.unwrap();
    store.create_task_in(&mut tx, client.prepare(submission("order-1")).await.unwrap()).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(store.task(&TaskId::new("order-1").unwrap()).await.unwrap().is_none(), "the rolled-back task was not kept");
    let orders: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count.clone())).fetch_one(&mut app).await.unwrap();
    assert_eq!(orders, 0, "nor the application's row");

    let mut tx = app.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(insert)).bind("order-1").execute(&mut *tx).await.unwrap();
    let created = store.create_task_in(&mut tx, client.prepare(submission("order-1")).await.unwrap()).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(created, Created::New);
    let orders: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count)).fetch_one(&mut app).await.unwrap();
    assert_eq!(orders, 1);
    assert_eq!(run_until_done(engine, "order-1").await, TaskState::Processed);
}
