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

mod cpu;
mod fill;
mod steady;
mod target;
mod w;
use crate::store_url::{STORE_URL_DEFAULT, StoreUrl};
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
    let result =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime").and_then(|runtime| {
            match args.workload {
                Workload::Q => runtime.block_on(run_q(&args, store)),
                Workload::W => runtime.block_on(w::run(store, args.agent_processes, args.prefill)),
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
    let queue = QueueName::new(QUEUE)?;
    let slots = usize::try_from(settings.c)?;
    let consumer_config = {
        let mut builder = ConsumerConfig::builder(queue.clone(), InstanceId::new(format!("rota-bench-{}", std::process::id()))?)
            .max_concurrent(slots)
            .complete_batch_max(args.complete_batch_max);
        if let Some(prefetch) = args.prefetch {
            builder = builder.prefetch(prefetch);
        }
        builder.build()?
    };
    // Schema and queue exist before any timer starts.
    queues.create_queue(&queue, QueueConfig::default()).await?;
    let durability_record = target.durability().await?;

    let tracker = Arc::new(Tracker::new(&settings));
    let progress = Progress::start(settings.n, tracker.clone());

    // Phase 1: enqueue N jobs, C calls in flight, no worker running.
    let commits_before = target.commit_counts();
    let e0 = now_ms();
    enqueue_pool(&queues, &queue, settings.n, settings.c, &progress.sent).await?;
    let enqueue_s = (now_ms() - e0) / 1000.0;
    let commits_enqueued = target.commit_counts();

    // Phase 2: drain with a C-slot consumer in this process.
    progress.phase("drain");
    let shutdown = Shutdown::new();
    let d0 = now_ms();
    let consumer = tokio::spawn(
        Consumer::new(queues.clone(), consumer_config.clone()).run(Arc::new(Noop { tracker: tracker.clone() }), shutdown.clone()),
    );
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
    let (submitted, acks) = trickle(&queues, &queue, &settings).await?;
    tracker.until(settings.n + settings.trickle_n, TRICKLE_TIMEOUT).await.map_err(anyhow::Error::msg)?;
    let commits_trickled = target.commit_counts();
    let (pickups, invocations, distinct) = tracker.pickups(&submitted);
    shutdown.trigger();
    let summary = consumer.await.context("the consumer panicked")??;
    progress.finish();
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
            "consumer": consumer_record(&summary),
        },
        "settings": {
            "N": settings.n, "C": settings.c, "TRICKLE_N": settings.trickle_n, "TRICKLE_RATE": settings.trickle_rate,
            "durability": durability_record,
        },
        "config": {
            "version": format!("rota {}", env!("CARGO_PKG_VERSION")),
            "store": store_description,
            "enqueue": "Queues::send(noop, {\"i\": n}): one message per call, acknowledged after its commit is durable; C lanes are spawned futures",
            "worker": format!(
                "rota_engine::Consumer in the same process and Tokio runtime: max_concurrent {}, prefetch {}, complete_batch_max {}, receive_wait {:?}, lease {:?} (queue default); completions batched by the consumer's completer (its default path)",
                consumer_config.max_concurrent(), consumer_config.prefetch(), consumer_config.complete_batch_max(),
                consumer_config.receive_wait(), QueueConfig::default().lease),
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

fn consumer_record(summary: &Summary) -> Value {
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
async fn enqueue_pool(queues: &Arc<dyn Queues>, queue: &QueueName, count: u64, lanes: u64, sent: &Arc<AtomicU64>) -> anyhow::Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..lanes.min(count) {
        let (queues, queue, next, sent) = (queues.clone(), queue.clone(), next.clone(), sent.clone());
        running.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return anyhow::Ok(());
                }
                queues.send(&queue, Outgoing::json(&Job { i })?).await.with_context(|| format!("enqueue of job {i} failed"))?;
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
async fn trickle(queues: &Arc<dyn Queues>, queue: &QueueName, settings: &Settings) -> anyhow::Result<(Vec<(u64, f64)>, Vec<f64>)> {
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
        let (queues, queue) = (queues.clone(), queue.clone());
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
