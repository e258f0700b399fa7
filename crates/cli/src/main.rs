//! The `rota` binary: flags and environment, wiring, and the operator
//! commands.
//!
//! Code map:
//! - `store_url`: `--store URL` → an open [`rota_store::SharedStore`].
//! - `queue`: `rota queue …`, one function per subcommand.
//! - `consume`: `rota queue consume`, a long-running competing consumer.
//! - `dlq`: `rota dlq …`, the dead-letter queues.
//! - `output`: the JSON shapes and tables the commands print.
//! - `bench`: `rota bench`.
//! - `demo`: `rota demo`, the pattern's example end to end on a simulated service.
//!
//! Every failure ends as one line on stderr starting with `error: ` and exit
//! code 1; clap reports usage errors (bad flags, ids, durations) with exit
//! code 2. Logs go to stderr at `warn` unless `RUST_LOG` says otherwise.
mod bench;
mod consume;
mod demo;
mod dlq;
mod output;
mod queue;
mod store_url;

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use rota_store::SharedStore;
use store_url::{DurabilityArg, STORE_URL_DEFAULT, open_store};
use tracing_subscriber::EnvFilter;

/// How long a finished command waits for the runtime's blocking threads (a
/// read of stdin cannot be cancelled) before the process exits anyway.
const RUNTIME_SHUTDOWN_TIMEOUT: Duration = Duration::from_millis(200);

/// rota: durable task orchestration.
#[derive(Parser)]
#[command(name = "rota", version)]
struct Cli {
    /// The store: sqlite://PATH, sqlite:///ABSOLUTE/PATH, a path ending in .db
    /// or .sqlite, or postgres://… (not built yet).
    #[arg(long = "store", env = "ROTA_STORE", value_name = "URL", default_value = STORE_URL_DEFAULT, global = true)]
    store_url: String,

    /// How hard a commit tries to survive power loss (SQLite): `full` fsyncs
    /// every acknowledged commit, `normal` survives a process crash only.
    #[arg(long, env = "ROTA_DURABILITY", value_enum, default_value_t = DurabilityArg::Full, global = true)]
    durability: DurabilityArg,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Send, receive and settle messages; create, pause and inspect queues.
    #[command(subcommand)]
    Queue(queue::Command),
    /// Inspect, redrive and purge dead letters.
    #[command(subcommand)]
    Dlq(dlq::Command),
    /// Run a benchmark workload (see ../shared/bench/peers/README.md).
    Bench(bench::Args),
    /// Run the order-processing demo: a simulated payment service that fails, an agent killed mid-run, a final table.
    Demo(demo::Args),
}

/// Where the store is, as the global flags say. Commands open it only after
/// checking their own arguments, so a bad argument is reported first.
pub struct StoreArgs {
    url: String,
    durability: DurabilityArg,
}

impl StoreArgs {
    /// Opens the store.
    pub fn open(&self) -> anyhow::Result<SharedStore> {
        open_store(&self.url, self.durability.into())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let store = StoreArgs { url: cli.store_url, durability: cli.durability };
    let result = match cli.command {
        Command::Bench(args) => return bench::run(args, &store),
        Command::Demo(args) => return demo::run(args),
        Command::Queue(command) => run_async(queue::run(store, command)),
        Command::Dlq(command) => run_async(dlq::run(store, command)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // `{:#}` joins the context chain with ": ", which keeps it on one line
            // unless a message itself has a newline.
            let message = format!("{err:#}").replace('\n', " ");
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a command on a fresh multi-threaded runtime, with logging set up.
fn run_async(command: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")?;
    let result = runtime.block_on(command);
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_TIMEOUT);
    result
}

/// Logs to stderr, at `warn` unless `RUST_LOG` says otherwise.
fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    // A second initialisation (there is none today) would only keep the first.
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
