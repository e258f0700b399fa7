//! `rota bench steady`: a steady load under retention, to see whether the
//! store stops growing. Workflows of workload W's shape (three no-op steps)
//! are submitted open loop at `--rate` per second for `--duration`, by one
//! engine running every role, with retention deleting finished tasks
//! `--retention` after they end (the Supervisor leader's passes, every
//! `--retention-interval`). Every `--sample-every` the store's size is
//! sampled: on SQLite the file's pages and free pages (retention's
//! incremental vacuum gives free pages back) and the WAL's size; on
//! PostgreSQL the schema's tables and indexes.
//!
//! The store levels off when the tasks it keeps stop growing: once the
//! first tasks are older than the retention, each pass deletes about what
//! the load added since the last. The record says how much the store grew
//! over the run's second half against its first (`growth_second_half`):
//! near zero means level.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rota_engine::engine::{Config as EngineConfig, Roles};
use rota_engine::{Engine, Shutdown, Submission};
use rota_model::{InstanceId, SystemClock, TaskState, WorkflowName};
use rota_store::{SharedStore, TaskFilter};
use serde_json::{Value, json};

use super::target::Target;
use super::w::{Noop, STEPS_DEFAULT, workflow};
use super::{env_string, publish, round};
use crate::store_args::StoreArgs;

/// Arguments of `rota bench steady`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Settings {
    /// How long the load runs.
    pub duration: Duration,
    /// Workflows submitted per second.
    pub rate: u64,
    /// How long finished tasks are kept.
    pub retention: Duration,
    /// How often the Supervisor leader runs a retention pass.
    pub retention_interval: Duration,
    /// How often the store's size is sampled.
    pub sample_every: Duration,
}

/// The most submissions in flight: past it the load is more than the engine
/// takes, and the run fails rather than measure a backlog.
const SUBMITS_IN_FLIGHT_MAX: u64 = 10_000;

/// One sample of the store.
struct Sample {
    at_s: f64,
    submitted: u64,
    tasks: u64,
    processed: u64,
    bytes: u64,
    free_bytes: Option<u64>,
    wal_bytes: Option<u64>,
}

/// Runs the steady load and prints the samples and the record.
pub(super) async fn run(store_args: &StoreArgs, settings: Settings) -> anyhow::Result<()> {
    if settings.rate == 0 {
        bail!("--rate must be at least 1 workflow per second");
    }
    if settings.sample_every.is_zero() || settings.duration < settings.sample_every * 2 {
        bail!("--duration must be at least two --sample-every intervals");
    }
    let target = Target::open(store_args).await?;
    let durability = target.durability().await?;
    let store: SharedStore = target.store.clone();

    let mut config = EngineConfig::new(InstanceId::new(format!("bench-steady-{}", std::process::id()))?);
    config.roles = Roles { scheduler: true, agents: true, supervisor: true };
    config.supervisor.retention.default = Some(settings.retention);
    config.supervisor.retention.interval = settings.retention_interval;
    config.supervisor.retention.validate().context("retention settings")?;
    let engine = Engine::new(store.clone(), Arc::new(SystemClock), config)
        .workflow(workflow("bench_w", false, STEPS_DEFAULT)?)
        .agent(Arc::new(Noop));
    engine.register_workflows().await?;
    let client = engine.client();
    let shutdown = Shutdown::new();
    let running = tokio::spawn(engine.run(shutdown.clone()));

    let submitted = Arc::new(AtomicU64::new(0));
    let in_flight = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let period = Duration::from_secs_f64(1.0 / settings.rate as f64);
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut samples = Vec::new();
    let mut next_sample = Duration::ZERO;
    let mut failure: Option<anyhow::Error> = None;
    let workflow_name = WorkflowName::new("bench_w")?;
    let (failed_tx, mut failed_rx) = tokio::sync::mpsc::unbounded_channel::<anyhow::Error>();
    while started.elapsed() < settings.duration {
        if started.elapsed() >= next_sample {
            let sample = sample(&target, &store, started.elapsed(), submitted.load(Ordering::Relaxed)).await?;
            print_sample(&sample);
            samples.push(sample);
            next_sample += settings.sample_every;
        }
        ticks.tick().await;
        if let Ok(err) = failed_rx.try_recv() {
            failure = Some(err);
            break;
        }
        if in_flight.load(Ordering::Relaxed) >= SUBMITS_IN_FLIGHT_MAX {
            failure = Some(anyhow::anyhow!("{SUBMITS_IN_FLIGHT_MAX} submissions in flight: the rate is more than this store takes"));
            break;
        }
        let n = submitted.fetch_add(1, Ordering::Relaxed);
        let (client, in_flight, failed, name) = (client.clone(), in_flight.clone(), failed_tx.clone(), workflow_name.clone());
        in_flight.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            if let Err(err) = client.submit(Submission::new(name, json!({ "i": n }))).await {
                let _ = failed.send(anyhow::Error::new(err).context(format!("submitting workflow {n}")));
            }
            in_flight.fetch_sub(1, Ordering::Relaxed);
        });
    }
    let last = sample(&target, &store, started.elapsed(), submitted.load(Ordering::Relaxed)).await?;
    print_sample(&last);
    samples.push(last);
    shutdown.trigger();
    running.await.context("the engine panicked")??;
    if let Some(err) = failure {
        return Err(err);
    }

    let record = record(&target, settings, &samples, durability);
    publish(&record)?;
    drop(store);
    target.close().await;
    Ok(())
}

/// Reads the store's size and task counts now.
async fn sample(target: &Target, store: &SharedStore, at: Duration, submitted: u64) -> anyhow::Result<Sample> {
    let counts = store.count_tasks(&TaskFilter::default()).await?;
    let tasks = counts.iter().map(|(_, n)| n).sum();
    let processed = counts.iter().find(|(state, _)| *state == TaskState::Processed).map_or(0, |(_, n)| *n);
    let size = target.store_size().await?;
    Ok(Sample {
        at_s: at.as_secs_f64(),
        submitted,
        tasks,
        processed,
        bytes: size.bytes,
        free_bytes: size.free_bytes,
        wal_bytes: size.wal_bytes,
    })
}

fn print_sample(sample: &Sample) {
    let optional = |bytes: Option<u64>| bytes.map_or_else(|| "-".to_owned(), mib);
    println!(
        "t={:>6.0}s submitted={:>8} tasks_kept={:>7} processed_kept={:>7} store={} free={} wal={}",
        sample.at_s,
        sample.submitted,
        sample.tasks,
        sample.processed,
        mib(sample.bytes),
        optional(sample.free_bytes),
        optional(sample.wal_bytes)
    );
}

fn mib(bytes: u64) -> String {
    format!("{:.2}MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The run's record: the samples, and how much the store grew in the
/// second half of the run against the first.
fn record(target: &Target, settings: Settings, samples: &[Sample], durability: Value) -> Value {
    let middle = samples.len() / 2;
    let (first, mid, last) = (&samples[0], &samples[middle], &samples[samples.len() - 1]);
    let growth = |from: &Sample, to: &Sample| to.bytes as f64 - from.bytes as f64;
    let first_half = growth(first, mid);
    let second_half = growth(mid, last);
    json!({
        "peer": env_string("PEERS_PEER").unwrap_or_else(|| target.peer_default().into()),
        "workload": "steady",
        "metrics": {
            "submitted": last.submitted,
            "tasks_kept_at_end": last.tasks,
            "store_bytes_at_middle": mid.bytes,
            "store_bytes_at_end": last.bytes,
            "store_bytes_max": samples.iter().map(|s| s.bytes).max(),
            "growth_first_half_bytes": first_half,
            "growth_second_half_bytes": second_half,
            "growth_second_half": round((mid.bytes > 0).then(|| second_half / mid.bytes as f64), 4),
        },
        "samples": samples.iter().map(|s| json!({
            "at_s": round(Some(s.at_s), 1),
            "submitted": s.submitted,
            "tasks_kept": s.tasks,
            "processed_kept": s.processed,
            "store_bytes": s.bytes,
            "free_bytes": s.free_bytes,
            "wal_bytes": s.wal_bytes,
        })).collect::<Vec<_>>(),
        "settings": {
            "duration_s": settings.duration.as_secs_f64(),
            "rate_per_s": settings.rate,
            "retention_s": settings.retention.as_secs_f64(),
            "retention_interval_s": settings.retention_interval.as_secs_f64(),
            "sample_every_s": settings.sample_every.as_secs_f64(),
            "durability": durability,
        },
        "config": {
            "version": format!("rota {}", env!("CARGO_PKG_VERSION")),
            "workflow": "bench_w@1: s1 -> s2 -> s3, each a no-op Rust agent; one engine with every role",
            "store": target.description(),
            "size": "SQLite: page_count x page_size (free pages included, WAL apart); PostgreSQL: pg_total_relation_size of the schema's tables",
        },
    })
}
