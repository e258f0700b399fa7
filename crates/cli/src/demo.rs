//! `rota demo`: the pattern's own example, end to end, in one command.
//!
//! On a fresh SQLite file it starts a simulated remote payment service over
//! real HTTP on loopback ([`service`]), a Scheduler and a Supervisor in one
//! engine, and the `http` agent in a second, agent-only engine (as a
//! separate worker process would run it). It submits a few hundred orders of
//! the order workflow (reserve → charge → ship → notify; release and refund
//! undo reserve and charge), kills the agent worker once a third of the
//! orders are done (its task is aborted mid-request: no graceful shutdown,
//! no reply for what it held), starts a new one a second later, waits for
//! every order to end, and prints what happened: how the orders ended and
//! why, the retries, the Supervisor's recoveries, and what the service
//! applied. It fails (exit 1, keeping the store) unless every order ended,
//! no idempotency key and no order's operation ever took effect twice, no
//! step completed twice, compensations ran in reverse order, and the
//! service's ledger agrees with how each order ended.
//!
//! One disagreement is only a warning, because it is the engine's current
//! rule rather than a fault of this run: a step whose last attempt timed out
//! is settled as failed and not compensated, though the service may have
//! applied it (late, or with its answer lost).
//!
//! With `--chaos` ([`chaos`]) every role runs as its own `rota` process
//! instead, on SQLite or PostgreSQL, while role processes are SIGKILLed and
//! (on PostgreSQL) the database's connections are stalled, cut or the
//! server restarted, for `--duration`; the same table and checks follow.
//!
//! Deliberately left out: any flag beyond the size, the seed, the pace,
//! where to keep the store and the chaos settings. The fault rates are
//! fixed (see [`service::Faults`]) so that most orders are processed, some
//! are compensated, and a few are left for an operator.

mod chaos;
mod report;
mod service;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use rota_agent::{HttpAgent, HttpConfig};
use rota_engine::breakers::SharedBreakerConfig;
use rota_engine::engine::Config as EngineConfig;
use rota_engine::{Client, Engine, Roles, Shutdown, Submission};
use rota_model::{Clock, ExhaustedPolicy, InstanceId, RetryPolicy, SystemClock, TaskId, TaskState, WorkflowName};
use rota_store::{SharedStore, TaskFilter};
use rota_store_sqlite::{Config as StoreConfig, SqliteStore};
use rota_workflow::{AgentCatalog, CompensateDef, StepDef, Workflow};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use service::{BLACKHOLE_DOMAIN, CLOSED_CARD_SUFFIX, DECLINED_CARD_SUFFIX, Faults, Service, UNDELIVERABLE_ADDRESS, splitmix64};

/// The workflow the demo runs.
const WORKFLOW: &str = "order";
/// The database file in the work directory.
const DB_FILE: &str = "rota-demo.db";
/// The step timeout (complete-by of each attempt).
const STEP_TIMEOUT: Duration = Duration::from_secs(1);
/// The task-level complete-by.
const TASK_DEADLINE: Duration = Duration::from_secs(20);
/// How long the killed agent worker stays dead.
const AGENT_DOWN_FOR: Duration = Duration::from_secs(1);
/// How often progress is shown when stderr is not a terminal.
const PLAIN_PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Orders submitted per second unless `--rate` says otherwise.
const RATE_DEFAULT: u32 = 50;

/// Arguments of `rota demo`.
#[derive(clap::Args)]
pub struct Args {
    /// How many orders to submit (with --chaos: --rate orders a second for --duration).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=100_000), conflicts_with = "chaos")]
    orders: u32,

    /// The seed of the orders and of the service's faults.
    #[arg(long, default_value_t = 42)]
    seed: u64,

    /// Keep the SQLite store in DIR (created if missing) instead of a
    /// temporary directory removed at the end.
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,

    /// Orders submitted per second [default: 50; 10 with --chaos].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    rate: Option<u32>,

    /// How long the run may take before the demo fails.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration, conflicts_with = "chaos")]
    timeout: Duration,

    #[command(flatten)]
    chaos: chaos::ChaosArgs,
}

/// Runs the demo (on `store_url` with `--chaos`, when it names a
/// PostgreSQL database): exit 0 when every check passed, 1 otherwise.
pub fn run(args: Args, store_url: &str) -> ExitCode {
    crate::init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = if args.chaos.chaos { runtime.block_on(chaos::run(args, store_url)) } else { runtime.block_on(demo(args)) };
    // Requests the service is still holding (hung on purpose) are cut here.
    runtime.shutdown_timeout(Duration::from_millis(200));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("error: {}", format!("{err:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

/// Where the demo's database lives; a directory the demo created is
/// removed when this is dropped.
struct Workdir {
    dir: PathBuf,
    remove: bool,
}

impl Drop for Workdir {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn workdir(keep: Option<PathBuf>) -> anyhow::Result<Workdir> {
    match keep {
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            if dir.join(DB_FILE).exists() {
                bail!(
                    "{} already exists: every demo starts from an empty store, so give another --keep directory",
                    dir.join(DB_FILE).display()
                );
            }
            Ok(Workdir { dir, remove: false })
        }
        None => {
            let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
            let dir = std::env::temp_dir().join(format!("rota-demo-{}-{stamp}", std::process::id()));
            std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            Ok(Workdir { dir, remove: true })
        }
    }
}

/// The order workflow of the demo, calling the service at `base`.
pub fn order_workflow(base: &str) -> anyhow::Result<Workflow> {
    let retry = RetryPolicy::new(3, Duration::from_millis(50), Duration::from_millis(500))?;
    let call = |path: &str, body: Value| json!({ "method": "POST", "url": format!("{base}/{path}"), "body": body });
    let step = |name: &str, body: Value| StepDef::new(name, "http").with_input(call(name, body)).timeout(STEP_TIMEOUT).retry(retry.clone());
    // Compensations name the order, not the step's output: a step whose
    // attempt timed out is compensated "in doubt", without an output, and
    // the service undoes whatever it did apply.
    let undo = |path: &str| CompensateDef::new("http").with_input(call(path, json!({ "order": "{{ input.order_id }}" })));
    Workflow::builder(WORKFLOW, 1)
        .deadline(TASK_DEADLINE)
        .on_exhausted(ExhaustedPolicy::Compensate)
        .max_failures(3)
        .step(step("reserve", json!({ "order": "{{ input.order_id }}" })).compensate(undo("release")))
        .step(
            step(
                "charge",
                json!({
                    "order": "{{ input.order_id }}",
                    "amount": "{{ input.amount }}",
                    "card": "{{ input.card }}",
                    "hold": "{{ steps.reserve.output.hold_id }}",
                }),
            )
            .compensate(undo("refund")),
        )
        .step(step(
            "ship",
            json!({
                "order": "{{ input.order_id }}",
                "hold": "{{ steps.reserve.output.hold_id }}",
                "address": "{{ input.address }}",
            }),
        ))
        .step(step(
            "notify",
            json!({
                "order": "{{ input.order_id }}",
                "email": "{{ input.email }}",
                "charge": "{{ steps.charge.output.charge_id }}",
                "tracking": "{{ steps.ship.output.tracking }}",
            }),
        ))
        .build(&AgentCatalog::builtin())
        .map_err(|problems| anyhow::anyhow!("the demo's workflow is invalid: {problems}"))
}

/// The order workflow as a definition file (JSON), for `rota` processes
/// that load it with `--workflows`: the same workflow as
/// [`order_workflow`] (a test checks that they agree).
pub fn order_definition(base: &str) -> Value {
    let call = |path: &str, body: Value| json!({ "method": "POST", "url": format!("{base}/{path}"), "body": body });
    let undo = |path: &str| json!({ "agent": "http", "with": call(path, json!({ "order": "{{ input.order_id }}" })) });
    let step = |name: &str, body: Value, compensate: Option<Value>| {
        let mut step = json!({
            "name": name,
            "agent": "http",
            "with": call(name, body),
            "timeout": humantime::format_duration(STEP_TIMEOUT).to_string(),
            "retry": { "attempts": 3, "backoff": "50ms", "max_backoff": "500ms" },
        });
        if let Some(compensate) = compensate {
            step["compensate"] = compensate;
        }
        step
    };
    json!({
        "name": WORKFLOW,
        "version": 1,
        "deadline": humantime::format_duration(TASK_DEADLINE).to_string(),
        "on_exhausted": "compensate",
        "max_failures": 3,
        "steps": [
            step("reserve", json!({ "order": "{{ input.order_id }}" }), Some(undo("release"))),
            step(
                "charge",
                json!({
                    "order": "{{ input.order_id }}",
                    "amount": "{{ input.amount }}",
                    "card": "{{ input.card }}",
                    "hold": "{{ steps.reserve.output.hold_id }}",
                }),
                Some(undo("refund")),
            ),
            step(
                "ship",
                json!({
                    "order": "{{ input.order_id }}",
                    "hold": "{{ steps.reserve.output.hold_id }}",
                    "address": "{{ input.address }}",
                }),
                None,
            ),
            step(
                "notify",
                json!({
                    "order": "{{ input.order_id }}",
                    "email": "{{ input.email }}",
                    "charge": "{{ steps.charge.output.charge_id }}",
                    "tracking": "{{ steps.ship.output.tracking }}",
                }),
                None,
            ),
        ],
    })
}

/// The orders: ids `order-0001`…, with a few declined cards, undeliverable
/// addresses, unreachable mailboxes and closed card accounts among them.
fn orders(seed: u64, count: u32) -> Vec<(TaskId, Value)> {
    let mut rng = Draws(seed ^ 0x5eed_0f0d_e125);
    let width = count.to_string().len().max(4);
    (1..=count)
        .map(|i| {
            let declined = rng.chance(0.05);
            let undeliverable = rng.chance(0.02);
            let blackhole = !undeliverable && rng.chance(0.015);
            let closed = !declined && (undeliverable || blackhole) && rng.chance(0.35);
            let suffix = if declined {
                DECLINED_CARD_SUFFIX.to_owned()
            } else if closed {
                CLOSED_CARD_SUFFIX.to_owned()
            } else {
                format!("{:04}", 1 + rng.below(9_998)).replace(CLOSED_CARD_SUFFIX, "4041")
            };
            let card = format!("4{:011}{suffix}", rng.below(100_000_000_000));
            let amount = 500 + rng.below(49_500);
            let address = if undeliverable { UNDELIVERABLE_ADDRESS.to_owned() } else { format!("{} Main Street", 1 + rng.below(999)) };
            let email = if blackhole { format!("customer{i}@{BLACKHOLE_DOMAIN}") } else { format!("customer{i}@example.com") };
            let id = format!("order-{i:0width$}");
            let input = json!({ "order_id": id, "amount": amount, "card": card, "address": address, "email": email });
            (TaskId::new(id).expect("order ids are valid task ids"), input)
        })
        .collect()
}

/// A seeded SplitMix64 sequence.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        splitmix64(self.0)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// A running agent-only engine.
struct AgentWorker {
    name: String,
    shutdown: Shutdown,
    task: JoinHandle<rota_engine::Result<()>>,
}

fn start_agent(store: &SharedStore, clock: &Arc<dyn Clock>, seed: u64, n: u32) -> anyhow::Result<AgentWorker> {
    let name = format!("demo-agent-{n}");
    let mut config = EngineConfig::new(InstanceId::new(name.clone())?);
    config.roles = Roles { scheduler: false, supervisor: false, agents: true };
    config.agent_concurrency = 64;
    config.seed = seed ^ u64::from(n);
    // A shared breaker that a burst of 503s does not open, but an outage
    // would (it then holds the calls for a second at a time).
    config.agent_breakers =
        Some(SharedBreakerConfig { failures_to_open: 10, open_for: Duration::from_secs(1), ..SharedBreakerConfig::default() });
    let agent = HttpAgent::with_config(HttpConfig::default(), clock.clone())?;
    let engine = Engine::new(store.clone(), clock.clone(), config).agent(Arc::new(agent));
    let shutdown = Shutdown::new();
    let task = tokio::spawn(engine.run(shutdown.clone()));
    Ok(AgentWorker { name, shutdown, task })
}

/// Counts of tasks by state.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Tally {
    by_state: BTreeMap<&'static str, u32>,
    finished: u32,
    total: u32,
}

impl Tally {
    fn of(tasks: &[rota_model::Task]) -> Tally {
        let mut tally = Tally { total: tasks.len() as u32, ..Tally::default() };
        for task in tasks {
            *tally.by_state.entry(task.state.as_str()).or_default() += 1;
            if task.state.is_terminal() {
                tally.finished += 1;
            }
        }
        tally
    }

    fn get(&self, state: TaskState) -> u32 {
        self.by_state.get(state.as_str()).copied().unwrap_or(0)
    }

    fn line(&self) -> String {
        format!(
            "processed {} · compensated {} · error {} · in flight {}",
            self.get(TaskState::Processed),
            self.get(TaskState::Compensated),
            self.get(TaskState::Error),
            self.total - self.finished,
        )
    }
}

/// Shows progress: a bar on a terminal, a line every few seconds otherwise.
struct Progress {
    bar: Option<ProgressBar>,
    last_line: Instant,
}

impl Progress {
    fn new(total: u32) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(u64::from(total));
            if let Ok(style) = ProgressStyle::with_template("{elapsed:>3} [{bar:20}] {pos}/{len} ended · {wide_msg}") {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        });
        Progress { bar, last_line: Instant::now() }
    }

    fn update(&mut self, tally: &Tally, total: u32) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(u64::from(tally.finished));
                bar.set_message(tally.line());
            }
            None if self.last_line.elapsed() >= PLAIN_PROGRESS_EVERY => {
                self.last_line = Instant::now();
                eprintln!("progress: {}/{total} orders ended · {}", tally.finished, tally.line());
            }
            None => {}
        }
    }

    /// Prints a line to stdout without tearing the bar.
    fn say(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| println!("{line}")),
            None => println!("{line}"),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

async fn demo(args: Args) -> anyhow::Result<bool> {
    let started = Instant::now();
    let mut workdir = workdir(args.keep.clone())?;
    let db = workdir.dir.join(DB_FILE);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store: SharedStore =
        Arc::new(SqliteStore::open(StoreConfig::new(&db), clock.clone()).with_context(|| format!("cannot open {}", db.display()))?);
    let service = start_service(&args, &db).await?;
    let mut roles = start_roles(&store, &clock, args.seed, order_workflow(&service.base)?).await?;
    let submitter = submit(roles.client.clone(), orders(args.seed, args.orders), args.rate.unwrap_or(RATE_DEFAULT));

    let mut watch = Watch {
        args: &args,
        store: &store,
        clock: &clock,
        workdir: &mut workdir,
        progress: Progress::new(args.orders),
        killed: false,
        restart_at: None,
        agents_started: 1,
        submitter: Some(submitter),
    };
    watch.until_every_order_ended(&mut roles).await?;
    println!("all {} orders ended in {:.1} s", args.orders, started.elapsed().as_secs_f64());
    roles.stop().await;
    service.server.abort();

    let report = report::gather(&store, &service.service.report(), &service.base).await?;
    print!("{}", report.table());
    let passed = report.passed();
    if args.keep.is_some() || !passed {
        workdir.remove = false;
        println!("the store is kept in {}", db.display());
    }
    drop(workdir);
    Ok(passed)
}

/// The simulated payment service, running.
struct RunningService {
    service: Arc<Service>,
    faults: Faults,
    base: String,
    server: JoinHandle<()>,
}

impl RunningService {
    /// Starts the payment service with the demo's fault rates.
    async fn start(seed: u64) -> anyhow::Result<RunningService> {
        let faults = Faults { unavailable: 0.08, late: 0.015, lost: 0.015, hang: Duration::from_millis(1_500) };
        let service = Service::new(seed, faults.clone());
        let (addr, server) = service.start().await.context("cannot start the simulated payment service")?;
        Ok(RunningService { service, faults, base: format!("http://{addr}"), server })
    }

    /// What the service does, in one line.
    fn describe(&self) -> String {
        format!(
            "payment service on {}: {:.0}% of requests answer 503, {:.1}% hang past the step timeout then apply late, \
             {:.1}% apply then answer too late; cards ending {DECLINED_CARD_SUFFIX} are declined",
            self.base,
            self.faults.unavailable * 100.0,
            self.faults.late * 100.0,
            self.faults.lost * 100.0
        )
    }
}

/// Starts the payment service and says what the run will do.
async fn start_service(args: &Args, db: &std::path::Path) -> anyhow::Result<RunningService> {
    let service = RunningService::start(args.seed).await?;
    println!("rota demo: {} orders, seed {}, store {}", args.orders, args.seed, db.display());
    println!("{}", service.describe());
    Ok(service)
}

/// The demo's engines: a Scheduler and a Supervisor in one, the `http`
/// agent in another.
struct RunningRoles {
    client: Client,
    shutdown: Shutdown,
    task: JoinHandle<rota_engine::Result<()>>,
    agent: AgentWorker,
}

/// Starts a Scheduler and a Supervisor in one engine, without agents, and
/// the first agent worker.
async fn start_roles(store: &SharedStore, clock: &Arc<dyn Clock>, seed: u64, workflow: Workflow) -> anyhow::Result<RunningRoles> {
    let mut config = EngineConfig::new(InstanceId::new("demo-scheduler")?);
    config.roles = Roles { scheduler: true, supervisor: true, agents: false };
    config.seed = seed;
    config.supervisor.interval = Duration::from_millis(200);
    config.supervisor.leader_ttl = Duration::from_secs(1);
    let recovery = RetryPolicy::new(1_000, Duration::from_millis(200), Duration::from_secs(2))?;
    config.supervisor.recovery = recovery.clone();
    config.scheduler.recovery = recovery;
    let engine = Engine::new(store.clone(), clock.clone(), config).workflow(workflow);
    engine.register_workflows().await?;
    let client = engine.client();
    let shutdown = Shutdown::new();
    let task = tokio::spawn(engine.run(shutdown.clone()));
    let agent = start_agent(store, clock, seed, 1)?;
    println!("scheduler + supervisor started (demo-scheduler); agent worker {} started", agent.name);
    Ok(RunningRoles { client, shutdown, task, agent })
}

impl RunningRoles {
    /// Stops the roles, gracefully this time.
    async fn stop(self) {
        self.agent.shutdown.trigger();
        self.shutdown.trigger();
        let stopping = async {
            let _ = self.agent.task.await;
            let _ = self.task.await;
        };
        if tokio::time::timeout(Duration::from_secs(15), stopping).await.is_err() {
            tracing::warn!("the engine took more than 15 s to stop");
        }
    }
}

/// Submits the orders at a steady pace, so that orders are still arriving
/// when the agent dies.
fn submit(client: Client, orders: Vec<(TaskId, Value)>, rate: u32) -> JoinHandle<anyhow::Result<()>> {
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        let workflow = WorkflowName::new(WORKFLOW).expect("a valid workflow name");
        for (id, input) in orders {
            ticks.tick().await;
            client.submit(Submission::new(workflow.clone(), input).with_id(id)).await?;
        }
        anyhow::Ok(())
    })
}

/// Watches the orders end while the agent worker is killed once and a new
/// one started.
struct Watch<'a> {
    args: &'a Args,
    store: &'a SharedStore,
    clock: &'a Arc<dyn Clock>,
    /// Kept, not removed, when the watch fails.
    workdir: &'a mut Workdir,
    progress: Progress,
    killed: bool,
    restart_at: Option<Instant>,
    agents_started: u32,
    submitter: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Watch<'_> {
    /// Returns once every order ended; fails, keeping the store, when the
    /// engine stops first or the run's time is up.
    async fn until_every_order_ended(&mut self, roles: &mut RunningRoles) -> anyhow::Result<()> {
        let total = self.args.orders;
        let deadline = Instant::now() + self.args.timeout;
        let filter = TaskFilter { limit: total + 1, ..TaskFilter::default() };
        loop {
            let tally = Tally::of(&self.store.list_tasks(&filter).await?);
            self.progress.update(&tally, total);
            self.reap_submitter().await?;
            if !self.killed && tally.finished >= total.div_ceil(3) {
                self.kill(&mut roles.agent, &tally).await;
            }
            if self.restart_at.is_some_and(|at| Instant::now() >= at) {
                roles.agent = self.restart()?;
            }
            if self.submitter.is_none() && tally.total == total && tally.finished == total && self.restart_at.is_none() {
                self.progress.finish();
                return Ok(());
            }
            if roles.task.is_finished() {
                let db = self.keep_store();
                let ended = (&mut roles.task).await.context("the engine panicked")?;
                bail!("the engine stopped before every order ended ({ended:?}); the store is in {db}");
            }
            if Instant::now() >= deadline {
                let db = self.keep_store();
                let within = humantime::format_duration(self.args.timeout);
                bail!("only {}/{total} orders ended within {within} ({}); the store is in {db}", tally.finished, tally.line());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Ends the progress display and keeps the store for a look at what was
    /// left; returns where it is.
    fn keep_store(&mut self) -> String {
        self.progress.finish();
        self.workdir.remove = false;
        self.workdir.dir.join(DB_FILE).display().to_string()
    }

    /// Fails if the submitter has finished with a failure.
    async fn reap_submitter(&mut self) -> anyhow::Result<()> {
        if let Some(running) = self.submitter.as_ref()
            && running.is_finished()
        {
            self.submitter.take().expect("checked").await.context("the submitter panicked")?.context("submitting orders")?;
        }
        Ok(())
    }

    /// Kills the agent worker: its task is aborted mid-request, with no
    /// graceful shutdown and no reply for what it held.
    async fn kill(&mut self, agent: &mut AgentWorker, tally: &Tally) {
        self.killed = true;
        agent.task.abort();
        let _ = (&mut agent.task).await;
        self.progress.say(&format!(
            "agent worker {} KILLED after {}/{} orders ended: its task was aborted mid-request, no graceful shutdown; \
             the Supervisor recovers the steps it held once their complete-by passes",
            agent.name, tally.finished, self.args.orders
        ));
        self.restart_at = Some(Instant::now() + AGENT_DOWN_FOR);
    }

    /// Starts a new agent worker.
    fn restart(&mut self) -> anyhow::Result<AgentWorker> {
        self.restart_at = None;
        self.agents_started += 1;
        let agent = start_agent(self.store, self.clock, self.args.seed, self.agents_started)?;
        self.progress.say(&format!(
            "agent worker {} started (a new instance, after {} down)",
            agent.name,
            humantime::format_duration(AGENT_DOWN_FOR)
        ));
        Ok(agent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workflow_builds_and_the_orders_are_reproducible() {
        let workflow = order_workflow("http://127.0.0.1:1").unwrap();
        let names: Vec<&str> = workflow.steps().iter().map(|s| s.name().as_str()).collect();
        assert_eq!(names, ["reserve", "charge", "ship", "notify"]);
        let a = orders(7, 200);
        assert_eq!(a, orders(7, 200));
        assert_eq!(a[0].0.as_str(), "order-0001");
        let declined = a.iter().filter(|(_, input)| input["card"].as_str().unwrap().ends_with(DECLINED_CARD_SUFFIX)).count();
        assert!((2..25).contains(&declined), "{declined}");
        assert!(a.iter().all(|(_, input)| input["card"].as_str().unwrap().len() == 16));
    }

    #[test]
    fn the_definition_file_is_the_same_workflow() {
        let base = "http://127.0.0.1:1";
        let text = serde_json::to_string_pretty(&order_definition(base)).unwrap();
        let parsed = rota_workflow::parse("order.json", &text, &AgentCatalog::builtin()).unwrap();
        assert_eq!(parsed.to_json(), order_workflow(base).unwrap().to_json());
    }
}
