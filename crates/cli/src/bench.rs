//! `rota bench`: the peer benchmark's workloads, run against rota itself.
//!
//! This implements the "Workload spec" of `bench/peers/README.md` (in the
//! shared folder) exactly, with the timing rules of its reference
//! implementation (`node/lib.mjs`, ported to Rust as `rust/src/benchlib.rs`):
//!
//! - Q, phase 1: N single-message [`Queues::send`] calls (no batch API), C in
//!   flight; phase 2: one [`Consumer`] with C slots in this process drains
//!   them (timer from the first handler entry to the return of the N-th
//!   distinct job); phase 3: after 1 s idle, T sends open loop at R/s, each
//!   its own spawned future, and pickup = handler entry − time just before
//!   the send.
//! - W: workflows of three sequential no-op steps through the engine, K
//!   lanes in a closed loop (see [`w`]).
//!
//! The harness passes its parameters as `PEERS_*` environment variables and
//! reads the JSON record written to `$PEERS_OUT`; without them the defaults
//! apply and the figures go to stdout. `--store sqlite` (the default) is a
//! fresh database file in `$PEERS_WORKDIR` (or a temporary directory);
//! `--store sqlite:///path.db` names the file, which must not exist yet,
//! because every run starts from an empty store. `--store postgres` is the
//! database at `$PEERS_PG_URL` (or a `postgres://` URL), in a schema of the
//! run's own that is dropped afterwards. The durability settings are read
//! back from the store and recorded with `meets_rule`.
//!
//! Deliberately left out: anything the spec does not ask for. The consumer
//! runs with its production defaults except `max_concurrent` = C and the
//! flags below, which are recorded in the run's `config`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use rota_engine::consumer::Config as ConsumerConfig;
use rota_engine::{Consumer, Handler, Outcome, Shutdown, Summary, async_trait};
use rota_model::{InstanceId, QueueName};
use rota_store::{Delivery, Outgoing, QueueConfig, Queues};
use rota_store_sqlite::CommitCounts;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::store_args::StoreArgs;

mod backlog;
mod cpu;
mod fill;
mod steady;
mod target;
mod w;
use crate::store_url::{STORE_URL_DEFAULT, StoreUrl};
use backlog::BacklogKind;
use target::Target;

/// The queue every bench job goes to (the spec's task name).
const QUEUE: &str = "noop";
/// The database file created in the work directory.
const DB_FILE: &str = "rota-bench.db";
/// How long phase 2 may take before the run fails (the harness's step limit is 600 s).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(540);
/// How long phase 3's jobs may take to be picked up after the last send.
const TRICKLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the worker idles before the trickle starts (the spec's 1 s).
const IDLE_BEFORE_TRICKLE: Duration = Duration::from_secs(1);

/// Arguments of `rota bench`. The store comes from the global `--store`
/// (`sqlite`, `postgres`, or a store URL) and `--durability` flags.
#[derive(clap::Args)]
pub struct Args {
    /// The workload: Q (queue) or W (workflow); or `fill`, which fills a
    /// new store named by --store with --tasks tasks (every state, four
    /// workflows, their history) and keeps it, to measure reads on it; or
    /// `steady`, workflows at --rate per second for --duration under a
    /// --retention, sampling the store's size (does it level off?).
    #[arg(value_enum)]
    workload: Workload,

    /// fill only: how many tasks to create.
    #[arg(long, default_value_t = fill::TASKS_DEFAULT, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    tasks: u64,

    /// Messages the consumer leases ahead of its C slots (default: C, the
    /// consumer's default).
    #[arg(long)]
    prefetch: Option<usize>,

    /// The most completions the consumer commits in one `complete_batch`.
    #[arg(long, default_value_t = ConsumerConfig::COMPLETE_BATCH_MAX_DEFAULT)]
    complete_batch_max: usize,

    /// W only: before the run, fill the new store with this many finished
    /// tasks and their histories (as `fill` does, with finished states
    /// only), to measure a store that has run for a while; the record gets
    /// the fill's size per task and filtered listings timed after the run.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    prefill: u64,

    /// steady only: how long the load runs.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = humantime::parse_duration)]
    duration: Duration,

    /// steady only: workflows submitted per second.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    rate: u64,

    /// steady only: how long finished tasks are kept.
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = humantime::parse_duration)]
    retention: Duration,

    /// steady only: how often the Supervisor leader runs a retention pass.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    retention_interval: Duration,

    /// steady only: how often the store's size is sampled.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    sample_every: Duration,

    /// W only: run the steps in this many separate `rota agent` processes
    /// (the built-in `delay` agent, 0 ms) instead of an in-process no-op
    /// agent; 0 keeps them in process (the harness's configuration).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=w::AGENT_PROCESSES_MAX))]
    agent_processes: u32,

    /// W only: run the agent in the Scheduler's own engine, as `rota serve`
    /// does, where the Scheduler decides each reply in the commit that
    /// consumes its request (one commit a step instead of two). The default
    /// runs it in a separate agent-only engine of the same process, so that
    /// the steps run in another worker than the orchestration, as the
    /// workload asks: replies go through the Scheduler's inbox.
    #[arg(long)]
    embedded: bool,

    /// W only: steps per workflow (the spec's 3).
    #[arg(long, default_value_t = w::STEPS_DEFAULT, value_parser = clap::value_parser!(u32).range(1..=w::STEPS_MAX))]
    steps: u32,

    /// W only: each workflow's input is this many bytes of JSON (`i` and a
    /// padding string `pad`); 0 keeps the spec's `{"i": n}`.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=w::INPUT_BYTES_MAX))]
    input_bytes: u64,

    /// Before the run, put this many items of --backlog-kind in the new
    /// store (W: any kind; Q: delayed only).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=backlog::BACKLOG_MAX))]
    backlog: u64,

    /// What the backlog holds: pending workflows (W times the drain of
    /// their first 2,000), workflows due in an hour (future), workflows of
    /// a paused workflow (paused), or messages visible in an hour (delayed).
    #[arg(long, value_enum, default_value = "pending")]
    backlog_kind: BacklogKind,

    /// Q only: spread the jobs over this many queues, each with its own
    /// consumer of C slots.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=QUEUES_MAX))]
    queues: u64,
}

/// The most `--queues`.
const QUEUES_MAX: u64 = 10_000;

impl Args {
    /// Refuses flags the workload does not take; the error names the flag.
    fn check(&self) -> anyhow::Result<()> {
        let w_only = [
            ("--steps", self.steps != w::STEPS_DEFAULT),
            ("--input-bytes", self.input_bytes != 0),
            ("--agent-processes", self.agent_processes != 0),
            ("--prefill", self.prefill != 0),
        ];
        match self.workload {
            Workload::Q => {
                if let Some((flag, _)) = w_only.iter().find(|(_, given)| *given) {
                    bail!("{flag} is for workload W, not Q");
                }
                if self.backlog > 0 && self.backlog_kind != BacklogKind::Delayed {
                    bail!("--backlog-kind {} is for workload W; Q takes a delayed backlog only", self.backlog_kind.as_str());
                }
            }
            Workload::W => {
                if self.queues != 1 {
                    bail!("--queues is for workload Q, not W");
                }
                if self.embedded && self.agent_processes != 0 {
                    bail!("--embedded runs the agent in the Scheduler's engine; --agent-processes runs it in other processes: give one");
                }
                if self.input_bytes != 0 && self.input_bytes < w::INPUT_BYTES_MIN {
                    bail!("--input-bytes must be 0 or at least {}, got {}", w::INPUT_BYTES_MIN, self.input_bytes);
                }
            }
            Workload::Fill | Workload::Steady => {
                if self.embedded {
                    bail!("--embedded is for workload W");
                }
                if self.backlog != 0 || self.queues != 1 || self.steps != w::STEPS_DEFAULT || self.input_bytes != 0 {
                    bail!("--backlog, --queues, --steps and --input-bytes are for workloads Q and W");
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Workload {
    /// Queue: enqueue, drain, trickle.
    #[value(name = "Q")]
    Q,
    /// Workflow: three sequential steps per workflow.
    #[value(name = "W")]
    W,
    /// Fill a new store with many tasks and keep it.
    #[value(name = "fill")]
    Fill,
    /// A steady load under retention, sampling the store's size.
    #[value(name = "steady")]
    Steady,
}

/// Runs the benchmark; the exit code follows the harness's contract (0 ok,
/// 3 not implemented, 1 failed).
pub fn run(args: Args, store: &StoreArgs) -> ExitCode {
    crate::init_tracing();
    if args.embedded && args.workload == Workload::Q {
        // The harness runs every NAME's command with Q and W: a variant of W
        // skips Q, as the contract's "not implemented".
        eprintln!("--embedded is a variant of workload W (Q has no agents): Q skipped");
        return ExitCode::from(3);
    }
    if let Err(err) = args.check() {
        eprintln!("error: {err}");
        return ExitCode::FAILURE;
    }
    let result =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime").and_then(|runtime| {
            match args.workload {
                Workload::Q => runtime.block_on(run_q(&args, store)),
                Workload::W => runtime.block_on(w::run(
                    store,
                    args.agent_processes,
                    args.embedded,
                    args.prefill,
                    w::Shape { steps: args.steps, input_bytes: args.input_bytes, backlog: args.backlog, backlog_kind: args.backlog_kind },
                )),
                Workload::Fill => runtime.block_on(fill::run(store, args.tasks)),
                Workload::Steady => runtime.block_on(steady::run(
                    store,
                    steady::Settings {
                        duration: args.duration,
                        rate: args.rate,
                        retention: args.retention,
                        retention_interval: args.retention_interval,
                        sample_every: args.sample_every,
                    },
                )),
            }
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", format!("{err:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

/// The workload parameters, from the harness's environment.
#[derive(Debug, Clone, Copy)]
struct Settings {
    n: u64,
    c: u64,
    trickle_n: u64,
    trickle_rate: u64,
}

impl Settings {
    fn from_env() -> anyhow::Result<Settings> {
        let settings = Settings {
            n: env_u64("PEERS_N", 20_000)?,
            c: env_u64("PEERS_C", 16)?,
            trickle_n: env_u64("PEERS_TRICKLE_N", 500)?,
            trickle_rate: env_u64("PEERS_TRICKLE_RATE", 200)?,
        };
        if settings.n == 0 || settings.c == 0 || settings.trickle_rate == 0 {
            bail!("PEERS_N, PEERS_C and PEERS_TRICKLE_RATE must be at least 1: {settings:?}");
        }
        Ok(settings)
    }
}

pub(crate) fn env_u64(name: &str, default: u64) -> anyhow::Result<u64> {
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => value.trim().parse().with_context(|| format!("{name}={value:?} is not a whole number")),
        _ => Ok(default),
    }
}

pub(crate) fn env_string(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// Where the run's database lives; a directory this run created is removed
/// when this is dropped.
pub(crate) struct Workdir {
    pub(crate) db: PathBuf,
    created: Option<PathBuf>,
}

impl Drop for Workdir {
    fn drop(&mut self) {
        if let Some(dir) = &self.created {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Resolves `--store` to a fresh SQLite file, or says why it cannot.
pub(crate) fn workdir(store_url: &str) -> anyhow::Result<Workdir> {
    let url = store_url.trim();
    if url == "sqlite" || url == STORE_URL_DEFAULT {
        return match env_string("PEERS_WORKDIR") {
            Some(dir) => fresh_file(Path::new(&dir).join(DB_FILE), None),
            None => {
                let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
                let dir = std::env::temp_dir().join(format!("rota-bench-{}-{stamp}", std::process::id()));
                std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
                fresh_file(dir.join(DB_FILE), Some(dir))
            }
        };
    }
    match StoreUrl::parse(url)? {
        StoreUrl::Sqlite(path) => fresh_file(path, None),
        StoreUrl::Postgres(_) => bail!("a PostgreSQL store has no work directory"),
    }
}

fn fresh_file(db: PathBuf, created: Option<PathBuf>) -> anyhow::Result<Workdir> {
    let workdir = Workdir { db, created };
    if workdir.db.exists() {
        bail!("{} already exists: every run starts from an empty store, so give a new file", workdir.db.display());
    }
    if let Some(parent) = workdir.db.parent().filter(|parent| !parent.as_os_str().is_empty())
        && !parent.is_dir()
    {
        bail!("directory {} does not exist", parent.display());
    }
    Ok(workdir)
}

/// The job payload, exactly `{"i": n}`.
#[derive(Serialize, Deserialize)]
struct Job {
    i: u64,
}

async fn run_q(args: &Args, store_args: &StoreArgs) -> anyhow::Result<()> {
    let settings = Settings::from_env()?;
    let target = Target::open(store_args).await?;
    let queues: Arc<dyn Queues> = target.store.clone();
    // One queue is the spec's `noop`; more are `noop-0`, `noop-1`…, job i
    // going to queue i mod their number.
    let names: Vec<QueueName> = if args.queues == 1 {
        vec![QueueName::new(QUEUE)?]
    } else {
        (0..args.queues).map(|j| QueueName::new(format!("{QUEUE}-{j}"))).collect::<Result<_, _>>()?
    };
    let slots = usize::try_from(settings.c)?;
    let consumer_config = |queue: &QueueName, j: u64| {
        let mut builder = ConsumerConfig::builder(queue.clone(), InstanceId::new(format!("rota-bench-{}-{j}", std::process::id()))?)
            .max_concurrent(slots)
            .complete_batch_max(args.complete_batch_max);
        if let Some(prefetch) = args.prefetch {
            builder = builder.prefetch(prefetch);
        }
        anyhow::Ok(builder.build()?)
    };
    let consumer_configs: Vec<ConsumerConfig> =
        names.iter().zip(0..).map(|(queue, j)| consumer_config(queue, j)).collect::<Result<_, _>>()?;
    // Schema, queues and backlog exist before any timer starts.
    for queue in &names {
        queues.create_queue(queue, QueueConfig::default()).await?;
    }
    let durability_record = target.durability().await?;
    let backlog_made = if args.backlog > 0 {
        let took = backlog::send_delayed(&queues, &names, args.backlog).await?;
        eprintln!("backlog of {} delayed messages made in {:.1} s", args.backlog, took.as_secs_f64());
        json!({ "items": args.backlog, "kind": "delayed", "made_s": round(Some(took.as_secs_f64()), 1) })
    } else {
        Value::Null
    };

    let tracker = Arc::new(Tracker::new(&settings));
    let progress = Progress::start(settings.n, tracker.clone());

    // Phase 1: enqueue N jobs, C calls in flight, no worker running.
    let commits_before = target.commit_counts();
    let e0 = now_ms();
    enqueue_pool(&queues, &names, settings.n, settings.c, &progress.sent).await?;
    let enqueue_s = (now_ms() - e0) / 1000.0;
    let commits_enqueued = target.commit_counts();

    // Phase 2: drain with a C-slot consumer in this process.
    progress.phase("drain");
    let shutdown = Shutdown::new();
    let d0 = now_ms();
    let consumers: Vec<_> = consumer_configs
        .iter()
        .map(|config| {
            tokio::spawn(Consumer::new(queues.clone(), config.clone()).run(Arc::new(Noop { tracker: tracker.clone() }), shutdown.clone()))
        })
        .collect();
    let drained = tracker.until(settings.n, DRAIN_TIMEOUT).await;
    let commits_drained = target.commit_counts();
    if let Err(err) = drained {
        shutdown.trigger();
        bail!("{err}");
    }
    let (first_start, nth_end, drain_invocations) = tracker.drain_times();
    let drain_s = (nth_end - first_start) / 1000.0;
    let drain_wall_s = (nth_end - d0) / 1000.0;

    // Phase 3: trickle, the worker running and idle for 1 s.
    tokio::time::sleep(IDLE_BEFORE_TRICKLE).await;
    progress.phase("trickle");
    let commits_idle = target.commit_counts();
    let (submitted, acks) = trickle(&queues, &names, &settings).await?;
    tracker.until(settings.n + settings.trickle_n, TRICKLE_TIMEOUT).await.map_err(anyhow::Error::msg)?;
    let commits_trickled = target.commit_counts();
    let (pickups, invocations, distinct) = tracker.pickups(&submitted);
    shutdown.trigger();
    let mut summaries = Vec::with_capacity(consumers.len());
    for consumer in consumers {
        summaries.push(consumer.await.context("a consumer panicked")??);
    }
    progress.finish();
    let receive_probe = probe_receive(&queues, &names[0]).await?;
    let store_size = target.store_size().await?;
    drop(queues);
    let peer_default = target.peer_default();
    let store_description = target.description();
    target.close().await;

    let percentile_ms = |values: &[f64], p: f64| round(percentile(values, p), 3);
    let record = json!({
        "peer": env_string("PEERS_PEER").unwrap_or_else(|| peer_default.into()),
        "workload": "Q",
        "run": env_u64("PEERS_RUN_INDEX", 1)?,
        "metrics": {
            "enqueue_jobs_per_s": round(Some(settings.n as f64 / enqueue_s), 1),
            "drain_jobs_per_s": round(Some(settings.n as f64 / drain_s), 1),
            "pickup_p50_ms": percentile_ms(&pickups, 50.0),
            "pickup_p99_ms": percentile_ms(&pickups, 99.0),
        },
        "extra": {
            "enqueue_s": round(Some(enqueue_s), 3),
            "drain_s": round(Some(drain_s), 3),
            "drain_wall_s_incl_worker_start": round(Some(drain_wall_s), 3),
            "duplicate_executions": invocations - distinct,
            "drain_invocations": drain_invocations,
            "trickle_enqueue_ack_p50_ms": percentile_ms(&acks, 50.0),
            "trickle_enqueue_ack_p99_ms": percentile_ms(&acks, 99.0),
            "pickup_max_ms": percentile_ms(&pickups, 100.0),
            "group_commits": {
                "enqueue": commit_delta(commits_before, commits_enqueued, enqueue_s),
                "drain_incl_worker_start": commit_delta(commits_enqueued, commits_drained, drain_wall_s),
                "trickle": commit_delta(commits_idle, commits_trickled, f64::NAN),
            },
            "consumer": consumer_record(&summaries),
            "backlog": backlog_made,
            "idle_probes": receive_probe,
            "rss_peak_bytes": rss_peak_bytes(),
            "store_bytes": store_size.bytes,
            "store_wal_bytes": store_size.wal_bytes,
        },
        "settings": {
            "N": settings.n, "C": settings.c, "TRICKLE_N": settings.trickle_n, "TRICKLE_RATE": settings.trickle_rate,
            "queues": args.queues, "backlog": args.backlog, "backlog_kind": args.backlog_kind.as_str(),
            "durability": durability_record,
        },
        "config": {
            "version": format!("rota {}", env!("CARGO_PKG_VERSION")),
            "store": store_description,
            "enqueue": "Queues::send(noop, {\"i\": n}): one message per call, acknowledged after its commit is durable; C lanes are spawned futures",
            "worker": format!(
                "{} rota_engine::Consumer in the same process and Tokio runtime, one per queue: max_concurrent {}, prefetch {}, complete_batch_max {}, receive_wait {:?}, lease {:?} (queue default); completions batched by the consumer's completer (its default path)",
                consumer_configs.len(), consumer_configs[0].max_concurrent(), consumer_configs[0].prefetch(), consumer_configs[0].complete_batch_max(),
                consumer_configs[0].receive_wait(), QueueConfig::default().lease),
            "completion_observed": "handler entry and return timestamps in the same process (std::time::Instant)",
            "runtime": "one multi-threaded Tokio runtime, default worker threads (one per core)",
        },
        "finished_at_unix_s": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
    });

    let metrics = &record["metrics"];
    for name in ["enqueue_jobs_per_s", "drain_jobs_per_s", "pickup_p50_ms", "pickup_p99_ms"] {
        println!("{name} {}", metrics[name]);
    }
    publish(&record)?;
    Ok(())
}

fn commit_delta(before: Option<CommitCounts>, after: Option<CommitCounts>, seconds: f64) -> Value {
    let (Some(before), Some(after)) = (before, after) else {
        return json!("not counted: PostgreSQL groups commits itself");
    };
    let commits = after.commits - before.commits;
    let jobs = after.jobs - before.jobs;
    json!({
        "commits": commits,
        "jobs": jobs,
        "receives_served": after.receives - before.receives,
        "jobs_per_commit": round((commits > 0).then(|| jobs as f64 / commits as f64), 2),
        "ms_per_commit": round((commits > 0 && seconds.is_finite()).then(|| seconds * 1000.0 / commits as f64), 4),
    })
}

/// The consumers' summaries added up.
fn consumer_record(summaries: &[Summary]) -> Value {
    let mut summary = Summary::default();
    for one in summaries {
        summary.receives += one.receives;
        summary.received += one.received;
        summary.handled += one.handled;
        summary.completed += one.completed;
        summary.complete_batches += one.complete_batches;
        summary.abandoned += one.abandoned;
        summary.released += one.released;
        summary.leases_lost += one.leases_lost;
        summary.store_errors += one.store_errors;
    }
    json!({
        "receives": summary.receives,
        "received": summary.received,
        "messages_per_receive": round((summary.receives > 0).then(|| summary.received as f64 / summary.receives as f64), 2),
        "handled": summary.handled,
        "completed": summary.completed,
        "complete_batches": summary.complete_batches,
        "completions_per_batch": round((summary.complete_batches > 0).then(|| summary.completed as f64 / summary.complete_batches as f64), 2),
        "abandoned": summary.abandoned,
        "released_at_shutdown": summary.released,
        "leases_lost": summary.leases_lost,
        "store_errors": summary.store_errors,
    })
}

/// Phase 1: `count` sends, `lanes` in flight, each lane sending its next job
/// when its previous one was acknowledged.
async fn enqueue_pool(queues: &Arc<dyn Queues>, names: &[QueueName], count: u64, lanes: u64, sent: &Arc<AtomicU64>) -> anyhow::Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let names = Arc::new(names.to_vec());
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..lanes.min(count) {
        let (queues, names, next, sent) = (queues.clone(), names.clone(), next.clone(), sent.clone());
        running.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return anyhow::Ok(());
                }
                let queue = &names[(i % names.len() as u64) as usize];
                queues.send(queue, Outgoing::json(&Job { i })?).await.with_context(|| format!("enqueue of job {i} failed"))?;
                sent.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while let Some(lane) = running.join_next().await {
        lane.context("an enqueue lane panicked")??;
    }
    Ok(())
}

/// Phase 3: open loop. Send k is issued at t0 + k/R whatever happened to the
/// earlier ones, each as its own spawned future. Returns (job, time just
/// before its send) and the acknowledgement latencies.
async fn trickle(queues: &Arc<dyn Queues>, names: &[QueueName], settings: &Settings) -> anyhow::Result<(Vec<(u64, f64)>, Vec<f64>)> {
    let interval_ms = 1000.0 / settings.trickle_rate as f64;
    let t0 = now_ms() + 20.0;
    let mut submitted = Vec::with_capacity(settings.trickle_n as usize);
    let mut pending = Vec::with_capacity(settings.trickle_n as usize);
    for k in 0..settings.trickle_n {
        let target = t0 + k as f64 * interval_ms;
        let ahead = target - now_ms();
        if ahead > 1.5 {
            tokio::time::sleep(Duration::from_secs_f64((ahead - 1.0) / 1000.0)).await;
        }
        while now_ms() < target {
            // Spin the last millisecond, as the reference does: timers are
            // not precise enough for a 5 ms schedule.
            std::hint::spin_loop();
        }
        let i = settings.n + k;
        let message = Outgoing::json(&Job { i })?;
        let (queues, queue) = (queues.clone(), names[(i % names.len() as u64) as usize].clone());
        let t = now_ms();
        submitted.push((i, t));
        pending.push(tokio::spawn(async move {
            queues.send(&queue, message).await.with_context(|| format!("trickle enqueue of job {i} failed"))?;
            anyhow::Ok(now_ms() - t)
        }));
    }
    let mut acks = Vec::with_capacity(pending.len());
    for send in pending {
        acks.push(send.await.context("a trickle send panicked")??);
    }
    Ok((submitted, acks))
}

/// How many times the idle receive probe runs.
const PROBE_RUNS: usize = 21;

/// Times a receive of up to 64 on `queue` with the run's work done: what a
/// backlog of delayed messages costs each receive. Median and slowest of
/// [`PROBE_RUNS`].
async fn probe_receive(queues: &Arc<dyn Queues>, queue: &QueueName) -> anyhow::Result<Value> {
    let mut took = Vec::with_capacity(PROBE_RUNS);
    let mut received = 0;
    for _ in 0..PROBE_RUNS {
        let started = Instant::now();
        received += queues.receive(queue, rota_store::Receive::up_to(64)).await.context("probing a receive")?.len();
        took.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(json!({
        "receive_p50_ms": round(percentile(&took, 50.0), 3),
        "receive_max_ms": round(percentile(&took, 100.0), 3),
        "received": received,
    }))
}

/// The no-op handler: notes the entry time, returns success.
struct Noop {
    tracker: Arc<Tracker>,
}

#[async_trait]
impl Handler for Noop {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        match serde_json::from_str::<Job>(delivery.body.get()) {
            Ok(job) => {
                self.tracker.handle(job.i);
                Outcome::Complete
            }
            Err(err) => Outcome::DeadLetter { reason: format!("not a bench job: {err}") },
        }
    }
}

/// One monotonic clock for the process, in milliseconds since first use.
pub(crate) fn now_ms() -> f64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64() * 1000.0
}

/// Handler invocations, as the reference's `Tracker` records them.
struct Tracker {
    n: u64,
    state: Mutex<TrackerState>,
}

struct TrackerState {
    first_start: Option<f64>,
    invocations: u64,
    /// Job i → its first handler entry time (NaN: not yet).
    seen: Vec<f64>,
    distinct: u64,
    /// The return time of the handler that made `distinct` reach N.
    nth_end: Option<f64>,
    /// Invocations when `distinct` reached N.
    drain_invocations: u64,
}

impl Tracker {
    fn new(settings: &Settings) -> Self {
        let total = (settings.n + settings.trickle_n) as usize;
        Tracker {
            n: settings.n,
            state: Mutex::new(TrackerState {
                first_start: None,
                invocations: 0,
                seen: vec![f64::NAN; total],
                distinct: 0,
                nth_end: None,
                drain_invocations: 0,
            }),
        }
    }

    /// The whole no-op handler: notes the entry time and, for the drain
    /// timer, the return of the N-th distinct job.
    fn handle(&self, i: u64) {
        let t = now_ms();
        let mut state = self.state.lock().expect("tracker lock");
        state.first_start.get_or_insert(t);
        state.invocations += 1;
        let index = i as usize;
        if index >= state.seen.len() {
            state.seen.resize(index + 1, f64::NAN);
        }
        if state.seen[index].is_nan() {
            state.seen[index] = t;
            state.distinct += 1;
            if state.distinct == self.n && state.nth_end.is_none() {
                state.nth_end = Some(now_ms());
                state.drain_invocations = state.invocations;
            }
        }
    }

    fn distinct(&self) -> u64 {
        self.state.lock().expect("tracker lock").distinct
    }

    /// Waits until `n` distinct jobs have been handled. The figures come from
    /// the handler's own timestamps, so this 1 ms poll does not enter them.
    async fn until(&self, n: u64, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let distinct = self.distinct();
            if distinct >= n {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(format!("timeout: {distinct}/{n} jobs handled after {} s", timeout.as_secs()));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// First handler entry, return of the N-th distinct job, invocations by then.
    fn drain_times(&self) -> (f64, f64, u64) {
        let state = self.state.lock().expect("tracker lock");
        (state.first_start.unwrap_or(f64::NAN), state.nth_end.unwrap_or(f64::NAN), state.drain_invocations)
    }

    /// Pickup latencies of the trickle jobs, and the invocation counts.
    fn pickups(&self, submitted: &[(u64, f64)]) -> (Vec<f64>, u64, u64) {
        let state = self.state.lock().expect("tracker lock");
        let pickups = submitted.iter().map(|(i, t)| state.seen[*i as usize] - t).collect();
        (pickups, state.invocations, state.distinct)
    }
}

/// The process's peak resident set (`VmHWM` of `/proc/self/status`), in
/// bytes; `None` where there is no such file.
pub(crate) fn rss_peak_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// Prints a run's record on one line and writes it to `$PEERS_OUT`, where
/// the harness reads it.
pub(crate) fn publish(record: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(record)?);
    if let Some(out) = env_string("PEERS_OUT") {
        std::fs::write(&out, serde_json::to_string_pretty(record)?).with_context(|| format!("cannot write PEERS_OUT={out}"))?;
    }
    Ok(())
}

/// Nearest-rank percentile (p in 0..=100).
pub(crate) fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

pub(crate) fn round(value: Option<f64>, digits: i32) -> Value {
    match value {
        Some(v) if v.is_finite() => {
            let scale = 10f64.powi(digits);
            json!((v * scale).round() / scale)
        }
        _ => Value::Null,
    }
}

/// The progress bar on stderr (indicatif hides it when stderr is not a
/// terminal). A ticker reads the counters ten times a second, so the hot
/// paths only bump an atomic.
struct Progress {
    bar: ProgressBar,
    sent: Arc<AtomicU64>,
    phase: Arc<Mutex<&'static str>>,
    ticker: tokio::task::JoinHandle<()>,
}

impl Progress {
    fn start(n: u64, tracker: Arc<Tracker>) -> Self {
        let bar = ProgressBar::new(n);
        if let Ok(style) = ProgressStyle::with_template("{msg:>8} [{bar:40}] {pos}/{len} {per_sec}") {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message("enqueue");
        let sent = Arc::new(AtomicU64::new(0));
        let phase = Arc::new(Mutex::new("enqueue"));
        let ticker = {
            let (bar, sent, phase) = (bar.clone(), sent.clone(), phase.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let position = match *phase.lock().expect("phase lock") {
                        "enqueue" => sent.load(Ordering::Relaxed),
                        _ => tracker.distinct(),
                    };
                    bar.set_position(position);
                }
            })
        };
        Progress { bar, sent, phase, ticker }
    }

    fn phase(&self, name: &'static str) {
        *self.phase.lock().expect("phase lock") = name;
        if name == "trickle" {
            let total = self.bar.length().unwrap_or(0);
            self.bar.set_length(total + env_u64("PEERS_TRICKLE_N", 500).unwrap_or(0));
        } else {
            self.bar.set_position(0);
        }
        self.bar.set_message(name);
    }

    fn finish(&self) {
        self.ticker.abort();
        self.bar.finish_and_clear();
    }
}
