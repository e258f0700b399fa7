//! Workload W of the peer benchmark: a workflow of three steps run strictly
//! in sequence, each a no-op agent reached through rota's queues, driven by
//! K client lanes in a closed loop.
//!
//! How it maps onto rota: the workflow `bench_w` has steps `s1 → s2 → s3`,
//! each an `http`-free Rust agent (`Step.noop`) that returns its input. The
//! orchestration (Scheduler and Supervisor) runs in one engine and the agent
//! in another, agent-only engine: they share the process but talk only
//! through the store's queues (request to `agent.noop`, reply to the
//! Scheduler's inbox), and step s+1 is sent in the same commit that records
//! step s's completion. A workflow is complete when the commit that marks
//! the task Processed (with every step's output) has returned, i.e. when it
//! is durable and visible; the lane observes it through the engine's
//! in-process completion notice (no polling).
//!
//! With `--prefill N`, the new store is first filled with N finished tasks
//! and their histories (`fill::create`), and after the run a set of
//! filtered listings (a page of 50 each, the searches an operator makes) is
//! timed on the store the run left: how a store that has been running for
//! months serves both the workload and its operators.
//!
//! After the timed run, `PEERS_W_LONE` workflows (default
//! [`LONE_DEFAULT`]) run one at a time: a lone workflow's latency, with no
//! other work to share a commit with, recorded as `extra.lone_latency_*`.
//!
//! The shape of the work can grow (see `docs/performance.md`, "How cost
//! grows with the work"): `--steps` steps per workflow instead of three,
//! `--input-bytes` of input (a padding string beside `i`), K lanes from
//! `PEERS_K`, and a `--backlog` of waiting work put in the store first (see
//! [`super::backlog`]). Each is recorded in the record's settings; the
//! defaults are the spec's.
//!
//! `PEERS_W_AGENT_BACKLOG_MAX` sets the Scheduler's `agent_backlog_max`
//! (0: it never holds claims back), to measure what finishing started
//! work first costs; the record's settings say which was used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use rota_agent::{Agent, Request, StepError};
use rota_engine::engine::{Config as EngineConfig, Roles};
use rota_engine::{Client, Engine, Shutdown, Submission};
use rota_model::{Clock, InstanceId, RetryPolicy, SystemClock, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{SharedStore, TaskFilter, TimeRange};
use rota_workflow::{AgentCatalog, AgentName, StepDef, Workflow};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::backlog::{self, BacklogKind};
use super::fill;
use super::target::Target;
use super::{env_string, env_u64, now_ms, percentile, publish, round, rss_peak_bytes};
use crate::store_args::StoreArgs;

/// How long one workflow may take before the run fails.
const WORKFLOW_TIMEOUT: Duration = Duration::from_secs(60);
/// How many lone workflows run after the timed run unless `PEERS_W_LONE` says.
const LONE_DEFAULT: u64 = 100;

/// The no-op step service.
pub(super) struct Noop;

#[rota_engine::async_trait]
impl Agent for Noop {
    fn name(&self) -> &str {
        "noop"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        Ok(request.input.clone())
    }
}

/// The most `--agent-processes`.
pub(super) const AGENT_PROCESSES_MAX: i64 = 16;

/// The most `--steps` (the workflow definition's own bound).
pub(super) const STEPS_MAX: i64 = rota_workflow::STEPS_MAX as i64;
/// The spec's steps per workflow.
pub(super) const STEPS_DEFAULT: u32 = 3;
/// The largest `--input-bytes`: the largest input a client can be set to
/// take ([`rota_store::BODY_BYTES_MAX`]).
pub(super) const INPUT_BYTES_MAX: u64 = rota_store::BODY_BYTES_MAX as u64;
/// The smallest nonzero `--input-bytes`: `{"i":…,"pad":""}` with room for
/// any `i`.
pub(super) const INPUT_BYTES_MIN: u64 = 64;
/// How long a workflow of this many steps may take before the run fails.
fn workflow_deadline(steps: u32) -> Duration {
    Duration::from_secs(60).max(Duration::from_millis(200) * steps)
}

/// What W's work looks like and what waits in the store before it starts.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    /// Steps per workflow.
    pub steps: u32,
    /// The input's size in bytes of JSON; 0 keeps the spec's `{"i": n}`.
    pub input_bytes: u64,
    /// How many items of `backlog_kind` wait in the store first.
    pub backlog: u64,
    pub backlog_kind: BacklogKind,
}

/// Workflow `i`'s input: `{"i": i}`, or with `input_bytes` a padding string
/// `pad` that makes its JSON exactly that long. The padding is
/// pseudo-random, so that PostgreSQL's TOAST compression does not shrink
/// it to nothing (a repeated character would make the store's size lie).
fn input(i: u64, input_bytes: u64) -> Value {
    if input_bytes == 0 {
        return json!({ "i": i });
    }
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bare = serde_json::to_string(&json!({ "i": i, "pad": "" })).map_or(0, |text| text.len() as u64);
    let mut state = i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let pad: String = (0..input_bytes.saturating_sub(bare))
        .map(|_| {
            // xorshift64: cheap, and enough to defeat compression.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(ALPHABET[(state >> 58) as usize])
        })
        .collect();
    json!({ "i": i, "pad": pad })
}

/// The workflow `name`: `steps` sequential steps of the in-process `noop`
/// agent, or (for agents in other processes) of the built-in `delay` agent
/// with 0 ms.
pub(super) fn workflow(name: &str, remote_agents: bool, steps: u32) -> anyhow::Result<Workflow> {
    let retry = RetryPolicy::new(3, Duration::from_millis(10), Duration::from_millis(100))?;
    let mut builder = Workflow::builder(name, 1).deadline(workflow_deadline(steps));
    for s in 1..=steps {
        let step = if remote_agents {
            StepDef::new(format!("s{s}"), "delay").with_input(json!({ "ms": 0 }))
        } else {
            StepDef::new(format!("s{s}"), "noop").with_input(json!({ "i": "{{ input.i }}", "step": s }))
        };
        builder = builder.step(step.timeout(Duration::from_secs(10)).retry(retry.clone()));
    }
    let catalog = AgentCatalog::builtin().with(AgentName::new("noop")?);
    builder.build(&catalog).map_err(|d| anyhow::anyhow!("bench workflow: {d}"))
}

/// Routes completion notices to the lane waiting for each task.
#[derive(Clone, Default)]
struct Waiters {
    waiting: Arc<Mutex<HashMap<TaskId, oneshot::Sender<TaskState>>>>,
}

impl Waiters {
    fn expect(&self, id: TaskId) -> oneshot::Receiver<TaskState> {
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().expect("waiters").insert(id, tx);
        rx
    }

    fn notify(&self, id: &TaskId, state: TaskState) {
        if let Some(tx) = self.waiting.lock().expect("waiters").remove(id) {
            let _ = tx.send(state);
        }
    }
}

/// One workflow through the public API: submit, then wait for the notice.
async fn one(client: &Client, waiters: &Waiters, id: TaskId, i: u64, shape: Shape) -> anyhow::Result<f64> {
    let done = waiters.expect(id.clone());
    let t0 = now_ms();
    let submission = Submission::new(WorkflowName::new("bench_w")?, input(i, shape.input_bytes)).with_id(id.clone());
    client.submit(submission).await.with_context(|| format!("submitting workflow {i}"))?;
    let timeout = WORKFLOW_TIMEOUT.max(workflow_deadline(shape.steps));
    let state = tokio::time::timeout(timeout, done).await.with_context(|| format!("workflow {i} did not finish"))??;
    if state != TaskState::Processed {
        bail!("workflow {i} ended {state}");
    }
    Ok(now_ms() - t0)
}

/// Runs `count` workflows numbered from `first` on `lanes` lanes; returns
/// (latency, submit time, completion time) per workflow.
async fn closed_loop(
    client: &Client,
    waiters: &Waiters,
    prefix: &str,
    first: u64,
    count: u64,
    lanes: u64,
    shape: Shape,
) -> anyhow::Result<Vec<(f64, f64, f64)>> {
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..lanes.min(count) {
        let (client, waiters, next, prefix) = (client.clone(), waiters.clone(), next.clone(), prefix.to_owned());
        running.spawn(async move {
            let mut results = Vec::new();
            loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if k >= count {
                    return anyhow::Ok(results);
                }
                let i = first + k;
                let submitted = now_ms();
                let latency = one(&client, &waiters, TaskId::new(format!("{prefix}-{i}"))?, i, shape).await?;
                results.push((latency, submitted, submitted + latency));
            }
        });
    }
    let mut all = Vec::with_capacity(count as usize);
    while let Some(lane) = running.join_next().await {
        all.extend(lane.context("a lane panicked")??);
    }
    Ok(all)
}

/// Runs workload W and writes the record.
pub(super) async fn run(store_args: &StoreArgs, agent_processes: u32, embedded: bool, prefill: u64, shape: Shape) -> anyhow::Result<()> {
    let m = env_u64("PEERS_M", 2_000)?;
    let k = env_u64("PEERS_K", 50)?;
    let warmup = env_u64("PEERS_W_WARMUP", 100)?;
    let lone_count = env_u64("PEERS_W_LONE", LONE_DEFAULT)?;
    let agent_backlog_max = u32::try_from(env_u64("PEERS_W_AGENT_BACKLOG_MAX", rota_engine::scheduler::AGENT_BACKLOG_MAX_DEFAULT.into())?)
        .context("PEERS_W_AGENT_BACKLOG_MAX must fit 32 bits")?;
    if m == 0 || k == 0 {
        bail!("PEERS_M and PEERS_K must be at least 1");
    }
    let target = Target::open(store_args).await?;
    let durability = target.durability().await?;
    let store: SharedStore = target.store.clone();
    let prefilled = if prefill > 0 { Some(prefill_store(&target, prefill).await?) } else { None };

    // One step per lane at most is waiting for the agent, up to the
    // engine's bound on its agent slots.
    let agent_concurrency = usize::try_from(k)?.clamp(16, EngineConfig::AGENT_CONCURRENCY_MAX);
    let mut orchestration = EngineConfig::new(InstanceId::new(format!("bench-scheduler-{}", std::process::id()))?);
    orchestration.roles = Roles { scheduler: true, agents: embedded, supervisor: true };
    orchestration.agent_concurrency = agent_concurrency;
    orchestration.scheduler.inbox_concurrency = usize::try_from(k)?.max(16);
    orchestration.scheduler.agent_backlog_max = agent_backlog_max;
    orchestration.input_bytes_max = orchestration.input_bytes_max.max(usize::try_from(shape.input_bytes)?);
    let remote_agents = agent_processes > 0;
    let mut engine = Engine::new(store.clone(), Arc::new(SystemClock), orchestration)
        .workflow(workflow("bench_w", remote_agents, shape.steps)?)
        .workflow(workflow(backlog::PAUSED_WORKFLOW, remote_agents, shape.steps)?);
    if embedded {
        engine = engine.agent(Arc::new(Noop));
    }
    engine.register_workflows().await?;
    let client = engine.client();
    let completions = engine.completions();
    let agent_queue = rota_engine::protocol::agent_queue(if remote_agents { "delay" } else { "noop" });
    let mut made = make_backlog(&client, &agent_queue, shape).await?;

    let mut agents = EngineConfig::new(InstanceId::new(format!("bench-agent-{}", std::process::id()))?);
    agents.roles = Roles { scheduler: false, agents: true, supervisor: false };
    agents.agent_concurrency = agent_concurrency;
    let agent_engine = Engine::new(store.clone(), Arc::new(SystemClock), agents).agent(Arc::new(Noop));

    let shutdown = Shutdown::new();
    let orchestrating = tokio::spawn(engine.run(shutdown.clone()));
    let agent_shutdown = Shutdown::new();
    let serving = if remote_agents || embedded { None } else { Some(tokio::spawn(agent_engine.run(agent_shutdown.clone()))) };
    let children = AgentProcesses::start(&target.child_store_url(), agent_processes, k)?;
    let waiters = Waiters::default();
    let drained = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let router = {
        let (waiters, drained) = (waiters.clone(), drained.clone());
        let mut listener = completions.subscribe();
        tokio::spawn(async move {
            loop {
                match listener.recv().await {
                    Ok((id, state)) => {
                        if id.as_str().starts_with(BACKLOG_PREFIX) {
                            drained.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        waiters.notify(&id, state);
                    }
                    // A lost notice shows as a workflow that did not finish.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(lost)) => {
                        tracing::warn!("the completion listener lagged: {lost} notices lost");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
        })
    };

    let pending_backlog = shape.backlog_kind == BacklogKind::Pending && shape.backlog > 0;
    // Each workflow of a backlog rang the Scheduler's doorbell when it was
    // submitted; the run times the steady state beside the backlog, not the
    // Scheduler answering those rings (a pending backlog's drain is timed
    // on its own below).
    if !pending_backlog && shape.backlog > 0 && matches!(shape.backlog_kind, BacklogKind::Future | BacklogKind::Paused) {
        let waited = wait_for_doorbells(&store).await?;
        made["doorbells_answered_s"] = json!(round(Some(waited.as_secs_f64()), 1));
    }
    if !pending_backlog {
        closed_loop(&client, &waiters, "warmup", 0, warmup, k, shape).await.context("warm-up")?;
    }
    let commits_before = target.commit_counts();
    let pg_commits_before = target.postgres_commit_counts();
    let cpu_meter = target.cpu_meter(children.pids()).await;
    let cpu_before = cpu_meter.sample();
    let (timed, drain) = if pending_backlog {
        // The closed loop would queue behind the backlog: time its drain alone.
        let drain = time_drain(&drained, shape.backlog.min(backlog::DRAIN_COUNT), workflow_deadline(shape.steps)).await?;
        (Vec::new(), Some(drain))
    } else {
        (closed_loop(&client, &waiters, "w", 0, m, k, shape).await?, None)
    };
    let cpu_after = cpu_meter.sample();
    let commits_after = target.commit_counts();
    let pg_commits_after = target.postgres_commit_counts();
    let lone: Vec<f64> = if pending_backlog {
        Vec::new()
    } else {
        closed_loop(&client, &waiters, "lone", 0, lone_count, 1, shape).await?.iter().map(|t| t.0).collect()
    };
    let listings = time_listings(&store).await?;
    shutdown.trigger();
    agent_shutdown.trigger();
    router.abort();
    orchestrating.await.context("the engine panicked")??;
    if let Some(serving) = serving {
        serving.await.context("the agent engine panicked")??;
    }
    children.stop()?;
    let probes = probe_idle(&store, &agent_queue).await?;
    let store_size = target.store_size().await?;

    let first_submit = timed.iter().map(|t| t.1).fold(f64::INFINITY, f64::min);
    let last_done = timed.iter().map(|t| t.2).fold(f64::NEG_INFINITY, f64::max);
    let latencies: Vec<f64> = timed.iter().map(|t| t.0).collect();
    let elapsed_s = (last_done - first_submit) / 1000.0;
    let workflows_per_s = match &drain {
        Some(drain) => drain.per_s,
        None => m as f64 / elapsed_s,
    };
    let group_commits = match (commits_before, commits_after) {
        (Some(before), Some(after)) => {
            let (commits, jobs) = (after.commits - before.commits, after.jobs - before.jobs);
            json!({
                "commits": commits,
                "jobs": jobs,
                "jobs_per_commit": round((commits > 0).then(|| jobs as f64 / commits as f64), 2),
                "flushes": after.flushes - before.flushes,
                "replied_at_commit": after.replied_at_commit - before.replied_at_commit,
                "note": "flushes: fdatasyncs of the WAL; replied_at_commit: claims and Scheduler receives answered before their commit's flush",
            })
        }
        _ => match (pg_commits_before, pg_commits_after) {
            (Some(before), Some(after)) => {
                let (commits, statements) = (after.commits - before.commits, after.statements - before.statements);
                let (creates, create_statements) = (after.creates - before.creates, after.create_statements - before.create_statements);
                json!({
                    "decision_commits": commits,
                    "commit_statements": statements,
                    "commits_per_statement": round((statements > 0).then(|| commits as f64 / statements as f64), 2),
                    "task_creations": creates,
                    "create_statements": create_statements,
                    "creations_per_statement": round((create_statements > 0).then(|| creates as f64 / create_statements as f64), 2),
                    "handed_over": after.handed_over - before.handed_over,
                    "looks_skipped": after.looks_skipped - before.looks_skipped,
                    "flushed_later": after.flushed_later - before.flushed_later,
                    "flush_statements": after.flush_statements - before.flush_statements,
                    "note": "Tasks::commit calls (agent replies, Scheduler decisions), Tasks::create_task calls (submits), and the statements that ran them; handed_over: messages those commits, going out alone, inserted leased to a receiver waiting in this process; looks_skipped: receives that parked without a statement right after a look found their queue empty; flushed_later: commits alone that returned before their flush (all their messages handed to receivers acting only through the store) and were flushed by a later commit; flush_statements: statements run only to flush such a commit when no later commit did in time; sends and other receives are not counted",
                })
            }
            _ => json!("not counted"),
        },
    };
    let record = json!({
        "peer": env_string("PEERS_PEER").unwrap_or_else(|| target.peer_default().into()),
        "workload": "W",
        "run": env_u64("PEERS_RUN_INDEX", 1)?,
        "metrics": {
            "workflows_per_s": round(Some(workflows_per_s), 1),
            "latency_p50_ms": round(percentile(&latencies, 50.0), 3),
            "latency_p99_ms": round(percentile(&latencies, 99.0), 3),
        },
        "extra": {
            "elapsed_s": round(Some(elapsed_s), 3),
            "latency_max_ms": round(percentile(&latencies, 100.0), 3),
            "lone_latency_p50_ms": round(percentile(&lone, 50.0), 3),
            "lone_latency_p99_ms": round(percentile(&lone, 99.0), 3),
            "cpu": match &drain {
                Some(drain) => cpu_meter.report(&cpu_before, &cpu_after, drain.count, Duration::from_secs_f64(drain.seconds)),
                None => cpu_meter.report(&cpu_before, &cpu_after, m, Duration::from_secs_f64(elapsed_s.max(0.0))),
            },
            "group_commits": group_commits,
            "prefilled": prefilled,
            "listings": listings,
            "backlog": made,
            "backlog_drain": drain.as_ref().map(Drain::record),
            "idle_probes": probes,
            "rss_peak_bytes": rss_peak_bytes(),
            "store_bytes": store_size.bytes,
            "store_wal_bytes": store_size.wal_bytes,
        },
        "settings": {
            "M": m, "K": k, "W_WARMUP": warmup, "W_LONE": lone_count, "agent_processes": agent_processes, "embedded": embedded, "prefill": prefill,
            "steps": shape.steps, "input_bytes": shape.input_bytes, "backlog": shape.backlog, "backlog_kind": shape.backlog_kind.as_str(),
            "agent_backlog_max": agent_backlog_max, "agent_concurrency": agent_concurrency,
            "durability": durability,
        },
        "config": {
            "version": format!("rota {}", env!("CARGO_PKG_VERSION")),
            "workflow": format!("bench_w@1: s1 -> ... -> s{}, each a no-op Rust agent `noop` (returns its input {{i, step}}); step s+1 is sent in the commit that records step s", shape.steps),
            "workload": if drain.is_some() {
                format!("the drain of the first {} of a backlog of {} pending bench_w workflows, timed from the engine's start (no closed loop)", backlog::DRAIN_COUNT.min(shape.backlog), shape.backlog)
            } else {
                format!("{m} workflows on {k} lanes in a closed loop")
            },
            "dispatch": if remote_agents {
                format!("Scheduler -> queue agent.delay -> {agent_processes} `rota agent --queues delay --max-concurrent {k}` processes -> reply queue rota.inbox.<scheduler> -> Scheduler")
            } else if embedded {
                "Scheduler -> queue agent.noop -> agent worker of the Scheduler's own engine (rota serve's shape) -> reply decided in-process, in the commit that consumes the request".to_owned()
            } else {
                "Scheduler -> queue agent.noop -> agent-only engine (separate instance, same process) -> reply queue rota.inbox.<scheduler> -> Scheduler".to_owned()
            },
            "completion_observed": "notification: the Scheduler publishes the task's terminal state in-process after the commit that records it Processed returns (durable, visible)",
            "submit": "Client::submit (public API): task + steps + doorbell in one transaction",
            "store": target.description(),
        },
    });
    let metrics = &record["metrics"];
    for name in ["workflows_per_s", "latency_p50_ms", "latency_p99_ms"] {
        println!("{name} {}", metrics[name]);
    }
    println!("lone_latency_p50_ms {}", record["extra"]["lone_latency_p50_ms"]);
    let cpu = &record["extra"]["cpu"];
    println!(
        "cpu_ms_per_workflow rota {} agent_processes {} database {} cores_busy {}",
        cpu["rota_ms_per_workflow"], cpu["agent_processes_ms_per_workflow"], cpu["database_ms_per_workflow"], cpu["cores_busy"]
    );
    if let Some(prefilled) = &record["extra"]["prefilled"].as_object() {
        println!("prefilled_tasks {} bytes_per_task {}", prefilled["tasks"], prefilled["bytes_per_task"]);
    }
    for (name, timing) in record["extra"]["listings"].as_object().into_iter().flatten() {
        println!("listing {name} p50_ms {} max_ms {} rows {}", timing["p50_ms"], timing["max_ms"], timing["rows"]);
    }
    publish(&record)?;
    drop(store);
    target.close().await;
    Ok(())
}

/// The id prefix of a pending backlog's workflows.
const BACKLOG_PREFIX: &str = "backlog-";

/// Puts the backlog `shape` asks for in the store; returns what the record
/// says of it.
async fn make_backlog(client: &Client, agent_queue: &rota_model::QueueName, shape: Shape) -> anyhow::Result<Value> {
    if shape.backlog == 0 {
        return Ok(Value::Null);
    }
    let store = client.store().clone();
    let submit = |workflow: &'static str, start: Option<Timestamp>| {
        let client = client.clone();
        move |i: u64| {
            let client = client.clone();
            async move {
                let mut submission = Submission::new(WorkflowName::new(workflow)?, input(i, shape.input_bytes))
                    .with_id(TaskId::new(format!("{BACKLOG_PREFIX}{i}"))?);
                if let Some(at) = start {
                    submission = submission.starting_at(at);
                }
                client.submit(submission).await.with_context(|| format!("submitting backlog workflow {i}"))?;
                anyhow::Ok(())
            }
        }
    };
    let took = match shape.backlog_kind {
        BacklogKind::Pending => backlog::in_flight("pending workflows", shape.backlog, submit("bench_w", None)).await?,
        BacklogKind::Future => {
            let at = SystemClock.now().add(backlog::DUE_IN);
            backlog::in_flight("future workflows", shape.backlog, submit("bench_w", Some(at))).await?
        }
        BacklogKind::Paused => {
            let pause = rota_store::WorkflowPause {
                workflow: WorkflowName::new(backlog::PAUSED_WORKFLOW)?,
                paused: true,
                by: "rota bench".to_owned(),
                reason: Some("a paused workflow's backlog".to_owned()),
                at: SystemClock.now(),
            };
            store.set_workflow_paused(&pause).await.context("pausing the backlog's workflow")?;
            backlog::in_flight("paused workflows", shape.backlog, submit(backlog::PAUSED_WORKFLOW, None)).await?
        }
        BacklogKind::Delayed => {
            let queues: Arc<dyn rota_store::Queues> = store.clone();
            backlog::send_delayed(&queues, std::slice::from_ref(agent_queue), shape.backlog).await?
        }
    };
    eprintln!("backlog of {} {} made in {:.1} s", shape.backlog, shape.backlog_kind.as_str(), took.as_secs_f64());
    Ok(json!({
        "items": shape.backlog,
        "kind": shape.backlog_kind.as_str(),
        "made_s": round(Some(took.as_secs_f64()), 1),
        "made_per_s": round(Some(shape.backlog as f64 / took.as_secs_f64().max(1e-9)), 0),
    }))
}

/// Waits until the Scheduler has taken and completed every doorbell;
/// returns how long that took.
async fn wait_for_doorbells(store: &SharedStore) -> anyhow::Result<Duration> {
    const LIMIT: Duration = Duration::from_secs(600);
    let started = std::time::Instant::now();
    let doorbells = [rota_engine::protocol::tasks_queue()];
    loop {
        let backlog = store.backlogs(&doorbells, 1).await.context("reading the doorbells' backlog")?;
        if backlog.iter().all(|b| b.ready == 0 && !b.leased) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > LIMIT {
            bail!("the Scheduler did not answer the backlog's doorbells within {LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How a pending backlog's first workflows drained.
struct Drain {
    count: u64,
    /// From the engine's start to the `count`-th completion.
    seconds: f64,
    per_s: f64,
}

impl Drain {
    fn record(&self) -> Value {
        json!({ "workflows": self.count, "drain_s_incl_engine_start": round(Some(self.seconds), 3), "workflows_per_s": round(Some(self.per_s), 1) })
    }
}

/// Waits until `count` backlog workflows have completed, timed from now
/// (just after the engine started).
async fn time_drain(drained: &std::sync::atomic::AtomicU64, count: u64, deadline: Duration) -> anyhow::Result<Drain> {
    let t0 = now_ms();
    let limit = WORKFLOW_TIMEOUT.max(deadline) * 5;
    loop {
        let done = drained.load(std::sync::atomic::Ordering::Relaxed);
        if done >= count {
            let seconds = (now_ms() - t0) / 1000.0;
            return Ok(Drain { count, seconds, per_s: count as f64 / seconds });
        }
        if now_ms() - t0 > limit.as_secs_f64() * 1000.0 {
            bail!("the backlog's drain: {done}/{count} workflows finished after {} s", limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// How many times each idle probe runs.
const PROBE_RUNS: usize = 21;

/// Times, on the store the run left (its engines stopped), a claim of the
/// Scheduler's size (64, 8 of them oldest first) and a receive of 64 on the
/// agent queue: what the backlog costs each call the engine makes when
/// there is little else to find. Median and slowest of [`PROBE_RUNS`].
async fn probe_idle(store: &SharedStore, agent_queue: &rota_model::QueueName) -> anyhow::Result<Value> {
    let owner = InstanceId::new("bench-probe")?;
    let claim = rota_store::Claim { max: 64, oldest_first: 8 };
    let (mut claims, mut receives, mut claimed, mut received) = (Vec::new(), Vec::new(), 0, 0);
    for _ in 0..PROBE_RUNS {
        let started = std::time::Instant::now();
        claimed += store.claim_tasks_by(&owner, Duration::from_secs(60), claim).await.context("probing a claim")?.len();
        claims.push(started.elapsed().as_secs_f64() * 1000.0);
        let started = std::time::Instant::now();
        received += store.receive(agent_queue, rota_store::Receive::up_to(64)).await.context("probing a receive")?.len();
        receives.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(json!({
        "claim_p50_ms": round(percentile(&claims, 50.0), 3),
        "claim_max_ms": round(percentile(&claims, 100.0), 3),
        "claimed": claimed,
        "receive_p50_ms": round(percentile(&receives, 50.0), 3),
        "receive_max_ms": round(percentile(&receives, 100.0), 3),
        "received": received,
    }))
}

/// Fills the run's new store with `tasks` finished tasks; returns what the
/// record says of it: the count, how long it took and the bytes per task.
async fn prefill_store(target: &Target, tasks: u64) -> anyhow::Result<Value> {
    let before = target.store_size().await?.bytes;
    let took = fill::create(&target.store, tasks, &fill::FINISHED_STATES).await.context("prefilling the store")?;
    let after = target.store_size().await?.bytes;
    let bytes_per_task = after.saturating_sub(before) as f64 / tasks as f64;
    eprintln!("prefilled {tasks} finished tasks in {:.1} s, {bytes_per_task:.0} bytes per task", took.as_secs_f64());
    Ok(json!({
        "tasks": tasks,
        "states": fill::FINISHED_STATES.iter().map(|(state, share)| (state.as_str(), share)).collect::<std::collections::BTreeMap<_, _>>(),
        "fill_s": round(Some(took.as_secs_f64()), 1),
        "store_bytes_before": before,
        "store_bytes_after": after,
        "bytes_per_task": round(Some(bytes_per_task), 0),
        "how": "SQLite: page_count x page_size of the file, its WAL aside; PostgreSQL: pg_total_relation_size of the schema's tables (indexes and TOAST included)",
    }))
}

/// How many times each listing runs; the figures are the median and the
/// slowest of these (the first run included: a cold page costs too).
const LISTING_RUNS: usize = 21;

/// Times filtered listings (a page of 50, newest first) through the store,
/// as the API's task listing makes them: server time, no HTTP.
async fn time_listings(store: &SharedStore) -> anyhow::Result<Value> {
    let now = SystemClock.now();
    let hour_ago = Timestamp::from_millis(now.as_millis() - 3_600_000);
    let page = |filter: TaskFilter| TaskFilter { limit: 50, ..filter };
    let tag = |key: &str, value: &str| vec![(key.to_owned(), value.to_owned())];
    let listings: Vec<(&str, TaskFilter)> = vec![
        ("all", page(TaskFilter::default())),
        ("state_error", page(TaskFilter { state: Some(TaskState::Error), ..TaskFilter::default() })),
        ("workflow_refunds", page(TaskFilter { workflow: Some(WorkflowName::new("refunds")?), ..TaskFilter::default() })),
        (
            "workflow_and_state",
            page(TaskFilter {
                workflow: Some(WorkflowName::new("reports")?),
                state: Some(TaskState::Compensated),
                ..TaskFilter::default()
            }),
        ),
        ("tag_customer", page(TaskFilter { tags: tag("customer", "c042"), ..TaskFilter::default() })),
        (
            "tag_region_and_state",
            page(TaskFilter { tags: tag("region", "eu"), state: Some(TaskState::Cancelled), ..TaskFilter::default() }),
        ),
        ("id_prefix", page(TaskFilter { id_prefix: Some("fill-000004".to_owned()), ..TaskFilter::default() })),
        ("created_last_hour", page(TaskFilter { created: TimeRange { from: Some(hour_ago), until: None }, ..TaskFilter::default() })),
        (
            "ended_last_hour_error",
            page(TaskFilter {
                ended: TimeRange { from: Some(hour_ago), until: None },
                state: Some(TaskState::Error),
                ..TaskFilter::default()
            }),
        ),
        ("at_risk", page(TaskFilter { at_risk: true, ..TaskFilter::default() })),
    ];
    let mut timings = serde_json::Map::new();
    for (name, filter) in listings {
        let mut took = Vec::with_capacity(LISTING_RUNS);
        let mut rows = 0;
        for _ in 0..LISTING_RUNS {
            let started = std::time::Instant::now();
            rows = store.list_tasks(&filter).await.with_context(|| format!("listing {name}"))?.len();
            took.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        timings.insert(
            name.to_owned(),
            json!({ "p50_ms": round(percentile(&took, 50.0), 3), "max_ms": round(percentile(&took, 100.0), 3), "rows": rows }),
        );
    }
    Ok(Value::Object(timings))
}

/// `rota agent` child processes serving the `delay` agent, stopped with
/// SIGTERM (each must exit 0).
struct AgentProcesses(Vec<std::process::Child>);

impl AgentProcesses {
    fn start(store_url: &str, count: u32, concurrency: u64) -> anyhow::Result<AgentProcesses> {
        let exe = std::env::current_exe().context("cannot find the rota binary to start agent processes")?;
        let mut children = AgentProcesses(Vec::new());
        for i in 0..count {
            let mut child = std::process::Command::new(&exe)
                .args(["--store", store_url, "agent", "--queues", "delay", "--shutdown-grace", "1s"])
                .args(["--max-concurrent", &concurrency.max(16).to_string()])
                .args(["--instance-id", &format!("bench-agent-{}-{i}", std::process::id())])
                .env("RUST_LOG", "info")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .context("cannot start an agent process")?;
            let stderr = child.stderr.take().expect("piped");
            children.0.push(child);
            // Wait until it serves, then keep draining its log.
            let (started, ready) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                use std::io::BufRead;
                let mut lines = std::io::BufReader::new(stderr).lines().map_while(Result::ok);
                for line in lines.by_ref() {
                    if line.contains("rota serve started") {
                        let _ = started.send(());
                        break;
                    }
                }
                lines.for_each(drop);
            });
            ready.recv_timeout(Duration::from_secs(20)).context("an agent process did not start within 20 s")?;
        }
        Ok(children)
    }

    fn pids(&self) -> Vec<u32> {
        self.0.iter().map(std::process::Child::id).collect()
    }

    fn stop(mut self) -> anyhow::Result<()> {
        for child in &self.0 {
            // SAFETY: kill(2) on a child of this process.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        for child in self.0.drain(..) {
            let output = child.wait_with_output().context("waiting for an agent process")?;
            anyhow::ensure!(output.status.success(), "an agent process exited with {}", output.status);
        }
        Ok(())
    }
}

impl Drop for AgentProcesses {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
