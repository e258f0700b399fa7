//! A local API server to try the API with curl or a browser, and to run
//! schemathesis against: a SQLite store in the given file, every engine
//! role in this process, the `delay` agent, one workflow `nap` (two short
//! delay steps), the remote agent `py-payments` with a workflow `pay` for
//! the Python example worker (`examples/workers/python/worker.py`), and
//! authentication disabled unless an admin token is given.
//!
//! ```text
//! cargo run -p rota-api --example serve -- 127.0.0.1:7878 /tmp/rota-api.db [ADMIN_TOKEN]
//! ```
//!
//! The real server is `rota serve`; this example only wires the public API
//! of `rota-api` the way the binary does.

use std::sync::Arc;
use std::time::Duration;

use rota_agent::DelayAgent;
use rota_api::{ApiState, AuthConfig, Config, Scope, Token, WorkerConfig};
use rota_engine::engine::Config as EngineConfig;
use rota_engine::{Engine, Shutdown};
use rota_model::{Clock, InstanceId, SystemClock};
use rota_store::SharedStore;
use rota_store_sqlite::{Config as StoreConfig, SqliteStore};
use rota_workflow::{AgentCatalog, AgentName, StepDef, Workflow};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:7878".to_owned());
    let database = args.next().unwrap_or_else(|| "rota-api-example.db".to_owned());
    let auth = match args.next() {
        Some(token) => AuthConfig::tokens(vec![Token::new(token, vec![Scope::Admin])?])?,
        None => AuthConfig::Disabled,
    };

    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store: SharedStore = Arc::new(SqliteStore::open(StoreConfig::new(database), clock.clone())?);
    let nap = Workflow::builder("nap", 1)
        .step(StepDef::new("first", "delay").with_input(json!({ "ms": 200 })))
        .step(StepDef::new("second", "delay").with_input(json!({ "ms": "{{ input.ms }}" })).timeout(Duration::from_secs(60)))
        .build(&AgentCatalog::builtin())
        .map_err(|problems| problems.to_string())?;
    // Run by an external worker: `python3 examples/workers/python/worker.py --agent py-payments`.
    let remote = AgentName::new("py-payments")?;
    let pay = Workflow::builder("pay", 1)
        .step(StepDef::new("reserve", remote.as_str()).with_input(json!({ "amount": "{{ input.amount }}" })))
        .step(StepDef::new("charge", remote.as_str()).with_input(json!({ "amount": "{{ input.amount }}", "card": "{{ input.card }}" })))
        .build(&AgentCatalog::builtin().with(remote.clone()))
        .map_err(|problems| problems.to_string())?;
    let engine = Engine::new(store.clone(), clock.clone(), EngineConfig::new(InstanceId::new("example-1")?))
        .agent(Arc::new(DelayAgent::new()))
        .workflow(nap)
        .workflow(pay);
    engine.register_workflows().await?;
    let config = Config { workers: WorkerConfig { remote_agents: vec![remote], ..WorkerConfig::default() }, ..Config::new(auth) };
    let state = ApiState::new(store, engine.client(), clock, config)?;

    let shutdown = Shutdown::new();
    let engine = tokio::spawn(engine.run(shutdown.clone()));
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    eprintln!("rota API on http://{} (docs at /docs); Ctrl-C stops", listener.local_addr()?);
    let stopping = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stopping.trigger();
    });
    let triggered = shutdown.clone();
    rota_api::serve(listener, state, async move { triggered.triggered().await }).await?;
    engine.await??;
    Ok(())
}
