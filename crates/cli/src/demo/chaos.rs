//! `rota demo --chaos`: the demo's orders and payment service, with every
//! role in its own `rota` process, while faults are injected.
//!
//! The demo process runs the payment service and submits the orders over
//! HTTP to an API process (retrying an order until it is acknowledged: the
//! order id is the task id, so a retry never makes a second task). Role
//! processes are this executable: two `serve --roles scheduler`, two
//! `serve --roles agent`, two `serve --roles supervisor` and one `api`, all
//! on one store, each logging to `logs/<instance>.log` in the work
//! directory. On SQLite that store is a fresh file in the work directory;
//! with `--store postgres://…` it is a schema of that database (a fresh one
//! unless the URL names one with `schema=`), which the role processes reach
//! through a fault-injecting TCP proxy ([`rota_testkit::proxy`]) that this
//! process runs.
//!
//! For `--duration`, every few seconds (drawn from `--seed`) one fault:
//! SIGKILL of a random role process, then a fresh process in its place
//! with a new instance id; on PostgreSQL also every connection stalled
//! (bytes held) or cut (closed, new ones refused) for a few seconds, and,
//! with `--pg-restart CMD`, the server restarted by running CMD. A role
//! process that exits by itself (one that cannot reach the database at
//! startup does) is started again and counted.
//!
//! Then the faults stop and every order must end within `--recover-within`
//! of the end of the last fault; the demo's table and checks follow, with
//! the faults by kind and the time the last order took to end after the
//! last fault. Exit 1 when any check fails (the work directory is kept).

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rota_model::{Clock, SystemClock, TaskId, Timestamp};
use rota_store::{SharedStore, TaskFilter};
use rota_testkit::proxy::{FaultProxy, Mode};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use super::{Draws, Progress, RunningService, Tally, WORKFLOW, Workdir, order_definition, orders, report, workdir};
use crate::store_url::{STORE_URL_DEFAULT, StoreUrl, redacted};

/// Orders submitted per second with `--chaos` unless `--rate` says otherwise.
const CHAOS_RATE_DEFAULT: u32 = 10;
/// The shortest and longest pause between two faults.
const FAULT_EVERY_MIN: Duration = Duration::from_secs(2);
const FAULT_EVERY_MAX: Duration = Duration::from_secs(5);
/// The shortest and longest stall or cut of the database's connections.
const OUTAGE_MIN: Duration = Duration::from_secs(1);
const OUTAGE_MAX: Duration = Duration::from_secs(8);
/// How long a role process may take to log that it started.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a role process may take to stop after SIGTERM at the end.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long one submission over HTTP may take before it is tried again.
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause before a failed submission is tried again.
const SUBMIT_RETRY_PAUSE: Duration = Duration::from_millis(250);
/// The pooled connections of each role process on PostgreSQL: the seven
/// processes and the replacements of killed ones stay well within the
/// server's default of 100 connections.
const CONNECTIONS_PER_PROCESS: u32 = 4;
/// How often the orders' progress is read from the store.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);
/// The agent role's concurrent calls per process.
const AGENT_CONCURRENCY: u32 = 64;

/// The role processes, and how many of each run at once.
const FLEET: [(Role, u32); 4] = [(Role::Scheduler, 2), (Role::Agent, 2), (Role::Supervisor, 2), (Role::Api, 1)];

/// The chaos flags of `rota demo`.
#[derive(clap::Args)]
pub struct ChaosArgs {
    /// Run every role as its own process and inject faults (see --duration,
    /// --pg-restart); the store is a fresh SQLite file, or a schema of the
    /// PostgreSQL database --store names.
    #[arg(long)]
    pub chaos: bool,

    /// How long faults are injected and orders submitted (with --chaos).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, requires = "chaos")]
    duration: Duration,

    /// A shell command that restarts the PostgreSQL server, run now and
    /// then (with --chaos on PostgreSQL), e.g. `pg_ctlcluster
    /// --skip-systemctl-redirect 15 main restart`.
    #[arg(long, value_name = "CMD", requires = "chaos")]
    pg_restart: Option<String>,

    /// How long after the last fault every order must have ended (with --chaos).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration, requires = "chaos")]
    recover_within: Duration,
}

/// A role process's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    Scheduler,
    Agent,
    Supervisor,
    Api,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Scheduler => "scheduler",
            Role::Agent => "agent",
            Role::Supervisor => "supervisor",
            Role::Api => "api",
        }
    }
}

/// One fault.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Kill(usize),
    Stall(Duration),
    Cut(Duration),
    Restart,
}

/// Where the store is, for this process and for the role processes.
struct Stores {
    /// What this process opens: the file, or the database directly.
    direct: String,
    /// What the role processes open: through the proxy on PostgreSQL.
    roles: String,
    /// The proxy, on PostgreSQL.
    proxy: Option<FaultProxy>,
    /// The schema this run made (dropped at the end of a passed run
    /// unless `--keep`), on PostgreSQL.
    made_schema: Option<String>,
    /// What to print as the store.
    shown: String,
}

/// Runs the chaos demo: whether every check passed.
pub async fn run(args: super::Args, store_url: &str) -> anyhow::Result<bool> {
    let chaos = &args.chaos;
    let rate = args.rate.unwrap_or(CHAOS_RATE_DEFAULT);
    let count = u32::try_from(u64::from(rate) * chaos.duration.as_secs().max(1)).unwrap_or(u32::MAX).min(100_000);
    let postgres = match StoreUrl::parse(store_url)? {
        StoreUrl::Postgres(_) => true,
        StoreUrl::Sqlite(_) if store_url == STORE_URL_DEFAULT => false,
        StoreUrl::Sqlite(_) => bail!(
            "--store {store_url}: rota demo --chaos keeps its SQLite store in its work directory (--keep DIR); \
             --store takes a PostgreSQL URL"
        ),
    };
    if chaos.pg_restart.is_some() && !postgres {
        bail!("--pg-restart restarts a PostgreSQL server: give --store postgres://…");
    }
    let mut workdir = workdir(args.keep.clone())?;
    let stores = stores(&workdir, store_url, postgres).await?;
    let clock = SystemClock;
    let store = crate::store_url::open_store(&stores.direct, rota_store_sqlite::Durability::Full)
        .await
        .with_context(|| format!("cannot open the demo's store {}", stores.shown))?;
    if !store.list_tasks(&TaskFilter { limit: 1, ..TaskFilter::default() }).await?.is_empty() {
        bail!("the store {} already holds tasks: the demo starts from an empty one (name another schema= in --store)", stores.shown);
    }

    let service = RunningService::start(args.seed).await?;
    let workflows = workdir.dir.join("workflows");
    std::fs::create_dir_all(&workflows).with_context(|| format!("cannot create {}", workflows.display()))?;
    let definition = serde_json::to_string_pretty(&order_definition(&service.base))?;
    std::fs::write(workflows.join("order.json"), definition).context("cannot write the order workflow")?;
    let logs = workdir.dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;

    println!(
        "rota demo --chaos: {rate} orders a second for {} ({count} orders), seed {}, store {}",
        humantime::format_duration(chaos.duration),
        args.seed,
        stores.shown
    );
    println!("{}", service.describe());
    let mut fleet = Fleet::new(&stores.roles, &workflows, &logs)?;
    for (role, n) in FLEET {
        for _ in 0..n {
            let at = fleet.spawn(role)?;
            fleet.wait_started(at).await?;
        }
    }
    println!(
        "role processes started: {} (logs in {})",
        fleet.processes.iter().map(|p| p.instance.as_str()).collect::<Vec<_>>().join(", "),
        logs.display()
    );

    let submitted = Arc::new(AtomicU64::new(0));
    let retried = Arc::new(AtomicU64::new(0));
    let submitter = submit_over_http(
        format!("http://{}", fleet.api_listen),
        orders(args.seed, count),
        rate,
        chaos.recover_within,
        (submitted.clone(), retried.clone()),
    );
    let mut run = ChaosRun {
        chaos,
        store: &store,
        clock: &clock,
        proxy: stores.proxy.as_ref(),
        draws: Draws(args.seed ^ 0xc4a0_5eed),
        progress: Progress::new(count),
        faults: BTreeMap::new(),
        last_fault_end: clock.now(),
        submitter: Some(submitter),
    };
    let outcome = run.inject_then_recover(&mut fleet, count).await;
    let (faults, last_fault_end) = (run.faults.clone(), run.last_fault_end);
    run.progress.finish();
    drop(run);
    let exited = fleet.exited_by_themselves;
    let started = fleet.started.values().sum::<u32>();
    fleet.stop_all().await;
    service.server.abort();

    let mut report = report::gather(&store, &service.service.report(), &service.base).await?;
    let ended_at = last_end(&store).await?;
    println!("faults injected");
    for (kind, n) in &faults {
        println!("  {kind:<56} {n:>7}");
    }
    println!("role processes");
    println!("  {:<56} {:>7}", "started (with replacements)", started);
    println!("  {:<56} {:>7}", "exited by themselves, then started again", exited);
    println!("submissions");
    println!("  {:<56} {:>7}", "orders acknowledged by the API process", submitted.load(Ordering::Relaxed));
    println!("  {:<56} {:>7}", "failed tries made again (API or database away)", retried.load(Ordering::Relaxed));
    // Orders are submitted one after the other: the acknowledged ones are the first ones.
    let acknowledged = usize::try_from(submitted.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
    let stored = all_ids(&store).await?;
    let lost = orders(args.seed, count).iter().take(acknowledged).filter(|(id, _)| !stored.contains(id)).count();
    report.add_check("acknowledged orders missing from the store", lost.to_string(), lost == 0);
    let bound = humantime::format_duration(chaos.recover_within);
    match &outcome {
        Ok(()) => {
            let after =
                Duration::from_millis(ended_at.map_or(0, |at| at.as_millis().saturating_sub(last_fault_end.as_millis()).max(0) as u64));
            report.add_check(
                format!("every order ended within {bound} of the last fault"),
                format!("{:.1} s", after.as_secs_f64()),
                after <= chaos.recover_within,
            );
        }
        Err(err) => {
            println!("error: {}", format!("{err:#}").replace('\n', " "));
            report.add_check(format!("every order ended within {bound} of the last fault"), "no", false);
        }
    }
    print!("{}", report.table());
    let passed = report.passed();
    if args.keep.is_some() || !passed {
        workdir.remove = false;
        println!("the work directory (logs, SQLite store) is kept in {}", workdir.dir.display());
    }
    if let Some(schema) = &stores.made_schema {
        if passed && args.keep.is_none() {
            drop_schema(&stores.direct).await.with_context(|| format!("cannot drop the demo's schema {schema}"))?;
        } else {
            println!("the PostgreSQL schema {schema} is kept");
        }
    }
    drop(workdir);
    Ok(passed)
}

/// The store URLs: a file in the work directory, or a schema of the
/// database with a proxy in front of it for the role processes.
async fn stores(workdir: &Workdir, store_url: &str, postgres: bool) -> anyhow::Result<Stores> {
    if !postgres {
        let url = format!("sqlite://{}", workdir.dir.join(super::DB_FILE).display());
        return Ok(Stores { direct: url.clone(), roles: url.clone(), proxy: None, made_schema: None, shown: url });
    }
    let StoreUrl::Postgres(parsed) = StoreUrl::parse(store_url)? else { unreachable!("checked by the caller") };
    let (mut direct, made_schema) = match &parsed.schema {
        Some(_) => (store_url.to_owned(), None),
        None => {
            let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
            let schema = format!("rota_demo_{stamp}");
            (with_option(store_url, "schema", &schema), Some(schema))
        }
    };
    let (host_port, upstream) = upstream_of(store_url)?;
    let proxy = FaultProxy::start(upstream).await.context("cannot start the fault-injecting proxy")?;
    let mut roles = direct.replacen(&host_port, &proxy.addr().to_string(), 1);
    if parsed.connections.is_none() {
        roles = with_option(&roles, "connections", &CONNECTIONS_PER_PROCESS.to_string());
        direct = with_option(&direct, "connections", &CONNECTIONS_PER_PROCESS.to_string());
    }
    let shown = format!("{} (role processes through a fault-injecting proxy on {})", redacted(&direct), proxy.addr());
    Ok(Stores { direct, roles, proxy: Some(proxy), made_schema, shown })
}

/// `url` with `name=value` added to its query.
fn with_option(url: &str, name: &str, value: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{name}={value}")
}

/// The `host:port` text of a PostgreSQL URL and the address it resolves to.
fn upstream_of(url: &str) -> anyhow::Result<(String, SocketAddr)> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    if host_port.is_empty() {
        bail!("--store {}: the chaos proxy needs a host (and port) in the URL", redacted(url));
    }
    let with_port = if host_port.rsplit_once(':').is_some_and(|(_, port)| port.parse::<u16>().is_ok()) {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    };
    let address = with_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.next())
        .with_context(|| format!("--store {}: cannot resolve {with_port}", redacted(url)))?;
    Ok((host_port.to_owned(), address))
}

/// Drops the schema this run made.
async fn drop_schema(url: &str) -> anyhow::Result<()> {
    let StoreUrl::Postgres(parsed) = StoreUrl::parse(url)? else { bail!("not a PostgreSQL URL") };
    let store = rota_store_postgres::PgStore::open(parsed.config(), Arc::new(SystemClock)).await?;
    store.drop_schema().await?;
    Ok(())
}

/// The ids of every task in the store.
async fn all_ids(store: &SharedStore) -> anyhow::Result<std::collections::HashSet<TaskId>> {
    let tasks = store.list_tasks(&TaskFilter { limit: u32::MAX, ..TaskFilter::default() }).await?;
    Ok(tasks.into_iter().map(|task| task.id).collect())
}

/// When the last order ended (the latest update of any task).
async fn last_end(store: &SharedStore) -> anyhow::Result<Option<Timestamp>> {
    let tasks = store.list_tasks(&TaskFilter { limit: u32::MAX, ..TaskFilter::default() }).await?;
    Ok(tasks.iter().map(|task| task.updated_at).max())
}

/// One running role process.
struct RoleProcess {
    role: Role,
    instance: String,
    child: Child,
    log: PathBuf,
}

/// The role processes.
struct Fleet {
    exe: PathBuf,
    store_url: String,
    workflows: PathBuf,
    logs: PathBuf,
    /// Where the API process listens; its replacements take the same port.
    api_listen: SocketAddr,
    processes: Vec<RoleProcess>,
    started: BTreeMap<Role, u32>,
    exited_by_themselves: u32,
}

impl Fleet {
    fn new(store_url: &str, workflows: &Path, logs: &Path) -> anyhow::Result<Fleet> {
        let exe = std::env::current_exe().context("cannot find this executable to start role processes")?;
        // A free port, given up at once for the API process to take.
        let api_listen =
            TcpListener::bind(("127.0.0.1", 0)).and_then(|listener| listener.local_addr()).context("no free port for the API")?;
        Ok(Fleet {
            exe,
            store_url: store_url.to_owned(),
            workflows: workflows.to_owned(),
            logs: logs.to_owned(),
            api_listen,
            processes: Vec::new(),
            started: BTreeMap::new(),
            exited_by_themselves: 0,
        })
    }

    /// Starts a fresh process of `role`, with a new instance id; returns
    /// its position in the fleet.
    fn spawn(&mut self, role: Role) -> anyhow::Result<usize> {
        let n = self.started.entry(role).or_default();
        *n += 1;
        let instance = format!("chaos-{}-{n}", role.name());
        let log = self.logs.join(format!("{instance}.log"));
        let file = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let mut command = Command::new(&self.exe);
        command.arg("--store").arg(&self.store_url);
        match role {
            Role::Api => {
                command.args(["api", "--listen", &self.api_listen.to_string()]);
            }
            _ => {
                command.args(["serve", "--roles", role.name(), "--listen", "none", "--instance-id", &instance, "--shutdown-grace", "2s"]);
                command.arg("--workflows").arg(&self.workflows);
            }
        }
        match role {
            Role::Agent => command.args(["--queues", "http", "--max-concurrent", &AGENT_CONCURRENCY.to_string()]),
            Role::Supervisor => command.args(["--supervisor-interval", "200ms"]),
            _ => &mut command,
        };
        // The start is recognised by its log line at the info level.
        command.env("RUST_LOG", "info").env_remove("ROTA_STORE").env_remove("ROTA_INSTANCE_ID").env_remove("ROTA_CONFIG");
        command.stdin(Stdio::null()).stdout(file.try_clone()?).stderr(file);
        let child = command.spawn().with_context(|| format!("cannot start {}", self.exe.display()))?;
        self.processes.push(RoleProcess { role, instance, child, log });
        Ok(self.processes.len() - 1)
    }

    /// Waits until the process at `at` logged that it started; fails,
    /// with its log, if it exits or takes too long.
    async fn wait_started(&mut self, at: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            let process = &mut self.processes[at];
            let log = std::fs::read_to_string(&process.log).unwrap_or_default();
            if log.lines().any(|line| line.contains("rota serve started") || line.contains("rota api started")) {
                return Ok(());
            }
            if let Some(status) = process.child.try_wait()? {
                bail!("{} exited at startup ({status}):\n{}", process.instance, tail(&log));
            }
            if Instant::now() >= deadline {
                bail!("{} did not start within {STARTUP_TIMEOUT:?}:\n{}", process.instance, tail(&log));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILLs the process at `at` and starts a fresh one of its role,
    /// waiting for it to start (a replacement that exits is left to
    /// [`Fleet::restart_exited`]). Returns the victim's instance id.
    async fn kill_and_replace(&mut self, at: usize) -> anyhow::Result<String> {
        let mut victim = self.processes.remove(at);
        let _ = victim.child.kill();
        let _ = victim.child.wait();
        let fresh = self.spawn(victim.role)?;
        if let Err(err) = self.wait_started(fresh).await {
            tracing::warn!("a replacement did not start: {err:#}");
        }
        Ok(victim.instance)
    }

    /// Starts again the processes that exited by themselves.
    fn restart_exited(&mut self) -> anyhow::Result<Vec<String>> {
        let mut restarted = Vec::new();
        let mut at = 0;
        while at < self.processes.len() {
            if self.processes[at].child.try_wait()?.is_some() {
                let gone = self.processes.remove(at);
                self.exited_by_themselves += 1;
                restarted.push(gone.instance);
                self.spawn(gone.role)?;
            } else {
                at += 1;
            }
        }
        Ok(restarted)
    }

    /// SIGTERMs every process and waits for it to stop (SIGKILL after
    /// [`STOP_TIMEOUT`]).
    async fn stop_all(&mut self) {
        for process in &self.processes {
            // SAFETY: kill(2) on a child of this process, not yet reaped.
            unsafe { libc::kill(process.child.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        for mut process in self.processes.drain(..) {
            while matches!(process.child.try_wait(), Ok(None)) {
                if Instant::now() >= deadline {
                    tracing::warn!("{} did not stop within {STOP_TIMEOUT:?} of SIGTERM: killed", process.instance);
                    let _ = process.child.kill();
                    let _ = process.child.wait();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for process in &mut self.processes {
            let _ = process.child.kill();
            let _ = process.child.wait();
        }
    }
}

/// The last lines of a log, for an error message.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

/// The fault loop and the wait for every order to end.
struct ChaosRun<'a> {
    chaos: &'a ChaosArgs,
    store: &'a SharedStore,
    clock: &'a SystemClock,
    proxy: Option<&'a FaultProxy>,
    draws: Draws,
    progress: Progress,
    /// Faults injected, by kind.
    faults: BTreeMap<String, u32>,
    /// When the last fault ended (the database back, the replacement started).
    last_fault_end: Timestamp,
    submitter: Option<JoinHandle<anyhow::Result<()>>>,
}

impl ChaosRun<'_> {
    /// Injects faults for `--duration`, then waits for every order to end
    /// within `--recover-within` of the last one.
    async fn inject_then_recover(&mut self, fleet: &mut Fleet, count: u32) -> anyhow::Result<()> {
        let chaos_ends = Instant::now() + self.chaos.duration;
        let mut next_fault = Instant::now() + self.pause();
        let mut next_progress = Instant::now();
        let mut recover_by: Option<Instant> = None;
        loop {
            for instance in fleet.restart_exited()? {
                self.progress.say(&format!("{instance} exited by itself: a fresh process of its role is started"));
            }
            let now = Instant::now();
            if now < chaos_ends && now >= next_fault {
                self.inject(fleet).await?;
                next_fault = Instant::now() + self.pause();
            }
            if now >= chaos_ends && recover_by.is_none() {
                self.progress.say(&format!(
                    "faults stopped after {}; every order must end within {}",
                    humantime::format_duration(self.chaos.duration),
                    humantime::format_duration(self.chaos.recover_within)
                ));
                recover_by = Some(Instant::now() + self.chaos.recover_within);
            }
            self.reap_submitter().await?;
            if now >= next_progress {
                next_progress = now + PROGRESS_EVERY;
                // The database may be away (a restart): progress is read again later.
                if let Ok(tasks) = self.store.list_tasks(&TaskFilter { limit: count + 1, ..TaskFilter::default() }).await {
                    let tally = Tally::of(&tasks);
                    self.progress.update(&tally, count);
                    if recover_by.is_some() && self.submitter.is_none() && tally.total == count && tally.finished == count {
                        return Ok(());
                    }
                    if let Some(by) = recover_by
                        && Instant::now() >= by
                    {
                        bail!("only {}/{count} orders ended by the bound ({})", tally.finished, tally.line());
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The pause before the next fault.
    fn pause(&mut self) -> Duration {
        between(&mut self.draws, FAULT_EVERY_MIN, FAULT_EVERY_MAX)
    }

    /// Draws one fault and injects it; returns once it is over.
    async fn inject(&mut self, fleet: &mut Fleet) -> anyhow::Result<()> {
        let fault = self.draw(fleet.processes.len());
        let kind = match fault {
            Fault::Kill(at) => {
                let role = fleet.processes[at].role;
                let instance = fleet.kill_and_replace(at).await?;
                self.progress.say(&format!("fault: SIGKILL {instance}; a fresh {} process started", role.name()));
                format!("SIGKILL: {} process", role.name())
            }
            Fault::Stall(length) | Fault::Cut(length) => {
                let (mode, kind) = match fault {
                    Fault::Stall(_) => (Mode::Stall, "database connections stalled"),
                    _ => (Mode::Cut, "database connections cut"),
                };
                let proxy = self.proxy.expect("outages are drawn only with the proxy");
                self.progress.say(&format!("fault: {kind} for {}", humantime::format_duration(length)));
                proxy.set(mode);
                tokio::time::sleep(length).await;
                proxy.set(Mode::Pass);
                kind.to_owned()
            }
            Fault::Restart => {
                let command = self.chaos.pg_restart.clone().expect("restarts are drawn only with --pg-restart");
                self.progress.say(&format!("fault: PostgreSQL restarted by `{command}`"));
                let output = tokio::task::spawn_blocking(move || Command::new("sh").arg("-c").arg(&command).stdin(Stdio::null()).output())
                    .await
                    .context("the restart command's thread panicked")?
                    .context("cannot run the --pg-restart command")?;
                if !output.status.success() {
                    bail!("--pg-restart command failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
                }
                "PostgreSQL server restarted".to_owned()
            }
        };
        *self.faults.entry(kind).or_default() += 1;
        self.last_fault_end = self.clock.now();
        Ok(())
    }

    /// A fault: on SQLite always a kill; on PostgreSQL a kill half of the
    /// time, else a stall, a cut or (with `--pg-restart`) a restart. On
    /// PostgreSQL the first fault is always a kill and the second an
    /// outage, so that a short run sees both kinds whatever the seed and
    /// however long each fault took on a busy machine.
    fn draw(&mut self, processes: usize) -> Fault {
        let kill = Fault::Kill(self.draws.below(processes as u64) as usize);
        if self.proxy.is_none() {
            return kill;
        }
        let kill_now = match self.faults.values().sum::<u32>() {
            0 => true,
            1 => false,
            _ => self.draws.chance(0.5),
        };
        if kill_now {
            return kill;
        }
        let kinds = if self.chaos.pg_restart.is_some() { 3 } else { 2 };
        match self.draws.below(kinds) {
            0 => Fault::Stall(between(&mut self.draws, OUTAGE_MIN, OUTAGE_MAX)),
            1 => Fault::Cut(between(&mut self.draws, OUTAGE_MIN, OUTAGE_MAX)),
            _ => Fault::Restart,
        }
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
}

/// A duration drawn evenly from `[min, max)`, to the millisecond.
fn between(draws: &mut Draws, min: Duration, max: Duration) -> Duration {
    let span = (max - min).as_millis() as u64;
    min + Duration::from_millis(draws.below(span.max(1)))
}

/// Submits the orders at a steady pace over HTTP to the API process,
/// trying each again until it is acknowledged (the API process may be
/// killed, the database away); fails when one is not within `give_up`.
fn submit_over_http(
    base: String,
    orders: Vec<(TaskId, Value)>,
    rate: u32,
    give_up: Duration,
    (submitted, retried): (Arc<AtomicU64>, Arc<AtomicU64>),
) -> JoinHandle<anyhow::Result<()>> {
    tokio::spawn(async move {
        let client = rota_agent::http_client().timeout(SUBMIT_TIMEOUT).build().context("cannot build an HTTP client")?;
        let token = std::env::var(crate::api_server::TOKEN_ENV).ok().filter(|token| !token.is_empty());
        let url = format!("{base}/v1/tasks");
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
        for (id, input) in orders {
            ticks.tick().await;
            let body = json!({ "workflow": WORKFLOW, "id": id.as_str(), "input": input });
            let first_try = Instant::now();
            loop {
                let mut request = client.post(&url).json(&body);
                if let Some(token) = &token {
                    request = request.bearer_auth(token);
                }
                let why = match request.send().await {
                    Ok(response) if response.status().is_success() => break,
                    Ok(response) => format!("{} {}", response.status(), response.text().await.unwrap_or_default()),
                    Err(err) => err.to_string(),
                };
                retried.fetch_add(1, Ordering::Relaxed);
                if first_try.elapsed() >= give_up {
                    bail!("order {id} was not acknowledged within {}: {why}", humantime::format_duration(give_up));
                }
                tokio::time::sleep(SUBMIT_RETRY_PAUSE).await;
            }
            submitted.fetch_add(1, Ordering::Relaxed);
        }
        anyhow::Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_is_the_urls_host_and_port() {
        let (text, address) = upstream_of("postgres://postgres@127.0.0.1:5434/test?schema=x").unwrap();
        assert_eq!((text.as_str(), address.port()), ("127.0.0.1:5434", 5434));
        let (text, address) = upstream_of("postgres://u:p@127.0.0.1/db").unwrap();
        assert_eq!((text.as_str(), address.port()), ("127.0.0.1", 5432));
        assert!(upstream_of("postgres:///db").is_err());
    }

    #[test]
    fn options_join_the_query() {
        assert_eq!(with_option("postgres://h/db", "schema", "s"), "postgres://h/db?schema=s");
        assert_eq!(with_option("postgres://h/db?schema=s", "connections", "4"), "postgres://h/db?schema=s&connections=4");
    }
}
