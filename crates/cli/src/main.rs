//! The `rota` binary: flags and environment, wiring, and the operator
//! commands.
//!
//! Code map:
//! - `store_url`: `--store URL` → an open [`rota_store::SharedStore`].
//! - `store_args`: the global flags that say where commands act (a store,
//!   or a server's API), passed to every command.
//! - `queue`: `rota queue …`, one function per subcommand.
//! - `consume`: `rota queue consume`, a long-running competing consumer.
//! - `dlq`: `rota dlq …`, the dead-letter queues.
//! - `output`: the JSON shapes and tables the commands print.
//! - `bench`: `rota bench`.
//! - `demo`: `rota demo`, the pattern's example end to end on a simulated service.
//! - `serve`: `rota serve`, the engine with every role (or some) and the
//!   HTTP API until a signal; `rota scheduler`, `rota agent` and `rota
//!   supervisor` run one role.
//! - `api_server`: `--listen`, `--auth` and `rota api` (the HTTP API alone).
//! - `backend`: where the operator commands act: the store (`--store`) or a
//!   remote server's HTTP API (`--server`, through `remote`).
//! - `tasks`: `rota submit`, `status`, `tasks`, `alerts`, `resubmit`,
//!   `cancel`, `pause`, `resume` and `workflows`.
//! - `validate`: `rota validate`, workflow files checked without a store.
//! - `prune`: `rota prune`, finished tasks deleted by hand (or counted).
//! - `config_file`: `--config FILE`, settings for any command's flags.
//! - `completions`, `man`: `rota completions SHELL` and `rota man`, the
//!   shell completion scripts and man pages, generated from [`Cli`].
//!
//! Every failure ends as one line on stderr starting with `error: ` and exit
//! code 1; clap reports usage errors (bad flags, ids, durations) with exit
//! code 2. Logs go to stderr at `warn` (`info` for `serve`) unless `RUST_LOG`
//! says otherwise. The long-running commands (`serve`, `scheduler`, `agent`,
//! `supervisor`, `api`) export their spans over OTLP/HTTP with
//! `--otlp-endpoint URL` or `OTEL_EXPORTER_OTLP_ENDPOINT`.

// The doc comments of the clap types are the commands' `--help` text,
// written for a terminal: `<hostname>`, `RATE[:BURST]` and bare URLs are
// what a user reads there, not HTML, links or markdown.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links, rustdoc::bare_urls)]

mod api_server;
mod audit;
mod backend;
mod batches;
mod bench;
mod completions;
mod config_file;
mod consume;
mod demo;
mod dlq;
mod export;
mod instance_id;
mod man;
mod output;
mod prune;
mod queue;
mod remote;
mod schedules;
mod serve;
mod signals;
mod store_args;
mod store_url;
mod tasks;
mod validate;

use std::ffi::OsString;
use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};
use store_args::StoreArgs;
use store_url::{DurabilityArg, STORE_URL_DEFAULT};
use tracing_subscriber::EnvFilter;

/// jemalloc rather than the system's allocator: with glibc's malloc, over a
/// quarter of rota's CPU in `rota bench W` on PostgreSQL went to allocating
/// and freeing (buffers made on one thread and dropped on another), and
/// jemalloc's per-thread caches cut rota's CPU per workflow by about a sixth
/// for a few MiB more resident memory.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// How long a finished command waits for the runtime's blocking threads (a
/// read of stdin cannot be cancelled) before the process exits anyway.
const RUNTIME_SHUTDOWN_TIMEOUT: Duration = Duration::from_millis(200);

/// rota: durable task orchestration.
#[derive(Parser)]
#[command(name = "rota", version)]
struct Cli {
    /// The store: sqlite://PATH, sqlite:///ABSOLUTE/PATH, a path ending in .db
    /// or .sqlite, or postgres://USER@HOST:PORT/DATABASE[?schema=NAME&connections=N].
    #[arg(long = "store", env = "ROTA_STORE", value_name = "URL", default_value = STORE_URL_DEFAULT, global = true)]
    store_url: String,

    /// How hard a commit tries to survive power loss (SQLite): `full` fsyncs
    /// every acknowledged commit, `normal` survives a process crash only.
    #[arg(long, env = "ROTA_DURABILITY", value_enum, default_value_t = DurabilityArg::Full, global = true)]
    durability: DurabilityArg,

    /// Run the operator commands (status, tasks, alerts, submit, resubmit,
    /// cancel, pause, resume, workflows, queue stats/pause/resume, dlq) against this
    /// server's HTTP API instead of --store, e.g. http://rota.internal:7878.
    #[arg(long = "server", env = "ROTA_SERVER", value_name = "URL", global = true)]
    server_url: Option<String>,

    /// The bearer token for --server.
    #[arg(id = "server_token", long = "token", env = "ROTA_TOKEN", value_name = "TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,

    /// A TOML file of settings: each key a flag's name (`store`, `listen`,
    /// `instance-id`, ...); flags and environment variables win over it.
    #[arg(long = "config", env = "ROTA_CONFIG", value_name = "FILE", global = true)]
    config: Option<std::path::PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the engine (Scheduler, agents, Supervisor) until SIGINT or SIGTERM.
    Serve(Box<serve::Args>),
    /// Run only the Scheduler role until SIGINT or SIGTERM (scale-out: any number of them).
    Scheduler(serve::SchedulerCommand),
    /// Run only agents (all built-in ones, or those --queues names) until SIGINT or SIGTERM.
    Agent(serve::AgentCommand),
    /// Run only the Supervisor role until SIGINT or SIGTERM (one leads at a time, elected by a lease).
    Supervisor(serve::SupervisorCommand),
    /// Serve only the HTTP API until SIGINT or SIGTERM (scale-out: no engine role runs here).
    Api(api_server::Args),
    /// Create or upgrade the store's schema (every command also does it when it opens the store).
    Migrate,
    /// Submit a task; prints its id.
    Submit(tasks::SubmitArgs),
    /// Show a task: its fields, steps, history, and circuit breakers that are not closed.
    Status(tasks::StatusArgs),
    /// List tasks, newest first.
    Tasks(tasks::ListArgs),
    /// List operator alerts, newest first.
    Alerts(tasks::AlertsArgs),
    /// Run a task that ended in Error again (its failed steps, or one step); with filters instead of an id, every task they select, as a batch.
    Resubmit(tasks::ResubmitArgs),
    /// Cancel a task (compensating its completed steps when the workflow says how); with filters instead of an id, every task they select, as a batch.
    Cancel(tasks::CancelArgs),
    /// Send a signal to a task: it completes the step that waits for it (now, or when the task gets there).
    Signal(tasks::SignalArgs),
    /// Complete (--output) or fail (--error) a callback step's attempt with the token its request carried.
    Callback(tasks::CallbackArgs),
    /// Pause a task: it starts no new step until resumed (steps in flight finish); prints its state.
    Pause(tasks::PauseArgs),
    /// Resume a paused task; prints its state.
    Resume(tasks::PauseArgs),
    /// List the registered workflows (latest version of each); pause or resume one.
    Workflows(tasks::WorkflowsArgs),
    /// List operator actions (cancel, resubmit, pause, signal, redrive, purge, prune, schedule and batch changes…), newest first, with who and why.
    Audit(audit::Args),
    /// Bulk actions (`rota cancel` or `rota resubmit` with filters): list, show, stop, resume.
    #[command(subcommand)]
    Batches(batches::Command),
    /// Cron schedules that start tasks: create, list (with next fire times), show, pause, resume, trigger, delete.
    #[command(subcommand)]
    Schedules(schedules::Command),
    /// Delete finished tasks (with their steps and history) that ended longer ago than --older-than; --dry-run counts them.
    Prune(prune::Args),
    /// Write tasks (with steps and history) as JSON lines to stdout, newest first; the filters of `rota tasks` apply.
    Export(export::ExportArgs),
    /// Read exported tasks (files, archive directories, or - for stdin) into an empty store, for inspection.
    Import(export::ImportArgs),
    /// Check the hash chains of task histories, in export files or archive directories, or in the store itself.
    Verify(export::VerifyArgs),
    /// Check workflow definition files; prints every problem as FILE:LINE:COL: message.
    Validate(validate::Args),
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
    /// Print the completion script for SHELL (bash, zsh, fish, elvish, powershell) to stdout.
    Completions(completions::Args),
    /// Print rota's man page (roff) to stdout, or write one page per command with --dir DIR.
    Man(man::Args),
}

fn main() -> ExitCode {
    let command = Cli::command();
    let args: Vec<OsString> = std::env::args_os().collect();
    let matches = command.clone().get_matches_from(args.clone());
    let cli = match config_file::apply(&command, &matches, args) {
        Ok(args) => Cli::parse_from(args),
        Err(err) => return failed(&err),
    };
    let server = cli.server_url.map(|url| remote::ServerArgs { url, token: cli.token });
    let store = StoreArgs { url: cli.store_url, durability: cli.durability, server };
    let result = match cli.command {
        Command::Bench(args) => return bench::run(args, &store),
        Command::Demo(args) => return demo::run(args, &store.url),
        Command::Serve(args) => {
            let trace = args.process.trace.clone();
            run_server(serve::run(store, (*args).into()), &trace)
        }
        Command::Scheduler(args) => {
            let trace = args.process.trace.clone();
            run_server(serve::run(store, serve::RunArgs::from(args)), &trace)
        }
        Command::Agent(args) => {
            let trace = args.process.trace.clone();
            run_server(serve::run(store, args.into()), &trace)
        }
        Command::Supervisor(args) => {
            let trace = args.process.trace.clone();
            run_server(serve::run(store, args.into()), &trace)
        }
        Command::Api(args) => {
            let trace = args.trace.clone();
            run_server(api_server::run(store, args), &trace)
        }
        Command::Migrate => run_async(migrate(store)),
        Command::Submit(args) => run_async(async move { tasks::submit(&store, args).await }),
        Command::Status(args) => run_async(async move { tasks::status(&store, args).await }),
        Command::Tasks(args) => run_async(async move { tasks::list(&store, args).await }),
        Command::Alerts(args) => run_async(async move { tasks::alerts(&store, args).await }),
        Command::Resubmit(args) => run_async(async move { tasks::resubmit(&store, args).await }),
        Command::Cancel(args) => run_async(async move { tasks::cancel(&store, args).await }),
        Command::Signal(args) => run_async(async move { tasks::signal(&store, args).await }),
        Command::Callback(args) => run_async(async move { tasks::callback(&store, args).await }),
        Command::Pause(args) => run_async(async move { tasks::pause(&store, args).await }),
        Command::Resume(args) => run_async(async move { tasks::resume(&store, args).await }),
        Command::Workflows(args) => run_async(async move { tasks::workflows(&store, args).await }),
        Command::Schedules(command) => run_async(schedules::run(store, command)),
        Command::Batches(command) => run_async(batches::run(store, command)),
        Command::Audit(args) => run_async(async move { audit::run(&store, args).await }),
        Command::Prune(args) => run_async(async move { prune::run(&store, args).await }),
        Command::Export(args) => run_async(async move { export::export(&store, args).await }),
        Command::Import(args) => run_async(async move { export::import(&store, args).await }),
        Command::Verify(args) => run_async(async move { export::verify(&store, args).await }),
        Command::Validate(args) => validate::run(args),
        Command::Completions(args) => completions::run(args, Cli::command()),
        Command::Man(args) => man::run(args, Cli::command()),
        Command::Queue(command) => run_async(queue::run(store, command)),
        Command::Dlq(command) => run_async(dlq::run(store, command)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => failed(&err),
    }
}

/// Reports `err` as one line on stderr.
fn failed(err: &anyhow::Error) -> ExitCode {
    // `{:#}` joins the context chain with ": ", which keeps it on one line
    // unless a message itself has a newline.
    let message = format!("{err:#}").replace('\n', " ");
    eprintln!("error: {message}");
    ExitCode::FAILURE
}

/// `rota migrate`: brings the store's schema up to this build's version.
async fn migrate(store: StoreArgs) -> anyhow::Result<()> {
    match store_url::StoreUrl::parse(&store.url)? {
        store_url::StoreUrl::Postgres(postgres) => {
            let config = postgres.config();
            let migrated = rota_store_postgres::PgStore::migrate(&config)
                .await
                .with_context(|| format!("cannot migrate store {}", store_url::redacted(&store.url)))?;
            println!("schema {} of {}: version {} (was {})", config.schema, store_url::redacted(&store.url), migrated.to, migrated.from);
        }
        store_url::StoreUrl::Sqlite(path) => {
            // Opening a SQLite store runs its migrations.
            store.open().await?;
            println!("{}: migrated to this build's schema", path.display());
        }
    }
    Ok(())
}

/// Runs a command on a fresh multi-threaded runtime, with logging set up.
fn run_async(command: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    run_async_logging(command, "warn")
}

/// [`run_async`], logging at `default_level` unless `RUST_LOG` says otherwise.
fn run_async_logging(command: impl Future<Output = anyhow::Result<()>>, default_level: &str) -> anyhow::Result<()> {
    run_traced(command, default_level, None)
}

/// A long-running command (`serve`, the roles, `api`): logs at `info`, and
/// exports its spans when `trace` names an OTLP endpoint.
fn run_server(command: impl Future<Output = anyhow::Result<()>>, trace: &serve::TraceArgs) -> anyhow::Result<()> {
    run_traced(command, "info", trace.endpoint())
}

/// Runs `command` on a fresh runtime with logging (and, with `otlp`, trace
/// export) set up; the spans still batched are flushed once it ends.
fn run_traced(command: impl Future<Output = anyhow::Result<()>>, default_level: &str, otlp: Option<&str>) -> anyhow::Result<()> {
    // The exporter's HTTP client must be built outside any runtime.
    let exporter = otlp.map(otlp_provider).transpose()?;
    init_tracing_with(default_level, exporter.as_ref());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")?;
    let result = runtime.block_on(command);
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_TIMEOUT);
    if let Some(provider) = exporter
        && let Err(err) = provider.shutdown()
    {
        eprintln!("warning: exporting the last traces: {err}");
    }
    result
}

/// A tracer provider that batches spans and POSTs them to
/// `ENDPOINT/v1/traces` as OTLP protobuf (the OTLP/HTTP default port is
/// 4318). Building it checks the URL.
fn otlp_provider(endpoint: &str) -> anyhow::Result<opentelemetry_sdk::trace::SdkTracerProvider> {
    use opentelemetry_otlp::WithExportConfig;
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    // The exporter builds its own reqwest client, which needs the TLS
    // crypto provider installed (reqwest is built without one).
    rota_agent::install_crypto_provider();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(url)
        .build()
        .map_err(|err| anyhow::anyhow!("--otlp-endpoint {endpoint}: {err}"))?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name("rota").build();
    Ok(opentelemetry_sdk::trace::SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

/// Logs to stderr, at `warn` unless `RUST_LOG` says otherwise.
fn init_tracing() {
    init_tracing_with("warn", None);
}

/// Logs to stderr, at `default_level` unless `RUST_LOG` says otherwise;
/// with `exporter`, also sends rota's spans (the engine's are at `debug`,
/// so they never show in the log at its default level) and the warnings
/// inside them to it.
fn init_tracing_with(default_level: &str, exporter: Option<&opentelemetry_sdk::trace::SdkTracerProvider>) {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    // Colours only for a terminal: a log file or a pipe gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let log = tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(std::io::stderr).with_filter(filter);
    let traces = exporter.map(|provider| {
        let wanted = tracing_subscriber::filter::filter_fn(|meta| {
            if meta.is_span() { meta.target().starts_with("rota") } else { *meta.level() <= tracing::Level::WARN }
        });
        tracing_opentelemetry::layer().with_tracer(provider.tracer("rota")).with_filter(wanted)
    });
    // A second initialisation (there is none today) would only keep the first.
    let _ = tracing_subscriber::registry().with(log).with(traces).try_init();
}
