//! `rota serve`: every role of the pattern in one process, or the roles
//! `--roles` names, until SIGINT or SIGTERM.
//!
//! Startup, in order, so that a bad argument or a bad definition is reported
//! before anything is written: check the flags, load every definition in the
//! workflows directory (any problem stops startup with every diagnostic
//! printed), open the store, register the definitions, then start the
//! [`Engine`] with the built-in agents (`http`, `exec`, `delay`).
//!
//! While it runs, the engine's status [`Reporter`] writes this instance's
//! heartbeat and its agents' circuit breakers to the store's component
//! statuses, so that `rota status` and the API can show them from another
//! process.
//!
//! The first signal triggers the engine's [`Shutdown`] and waits for every
//! role to let go of what it holds (running agent calls get the consumer's
//! shutdown grace); a second signal exits at once, leaving the leases to
//! expire.
//!
//! With `ROTA_WEBHOOK_SECRET` set, `rota serve` also runs the webhook
//! dispatcher (`rota_engine::webhooks`), which POSTs the status events of
//! tasks submitted with a `callback_url`, signed with that secret; without
//! it, no webhook is sent. Several processes may run it (one leads).
//!
//! `rota serve` also serves the HTTP API (`--listen`, default
//! 127.0.0.1:7878; `--listen none` turns it off; see `api_server`). It binds
//! before the engine starts, so that a busy port or a bad token file stops
//! startup, and it stops with the same [`Shutdown`]. The role-only commands
//! (`rota scheduler`, `agent`, `supervisor`) serve no API; `rota api` serves
//! only the API.
//!
//! `--otlp-endpoint URL` (or `OTEL_EXPORTER_OTLP_ENDPOINT`) on every
//! engine command exports the roles' spans over OTLP (set up in `main`,
//! before the runtime starts).
//!
//! Deliberately left out: custom agents (a Rust program embeds the engine
//! instead) and hot reloading of definitions.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use rota_agent::{AgentRegistry, Egress, ExecConfig, HttpConfig};
use rota_engine::breakers::SharedBreakerConfig;
use rota_engine::engine::Config;
use rota_engine::status::{Heartbeat, Reporter};
use rota_engine::webhooks::{Dispatcher, Secret, WebhookConfig};
use rota_engine::{Client, Engine, Roles, Shutdown, Workflows};
use rota_model::{Clock, InstanceId, RateLimit, ScheduleName, SystemClock};
use rota_store::{NewSchedule, ScheduleSource, ScheduleSpec, SharedStore};
use rota_workflow::{AgentCatalog, AgentName, Workflow};
use tracing::{info, warn};

use crate::api_server::{self, ListenArgs, Listening, RemoteAgentArgs};
use crate::instance_id;
use crate::signals::Signals;
use crate::store_args::StoreArgs;
use crate::store_url::redacted;

/// The environment variable holding the secret that signs webhooks.
pub const WEBHOOK_SECRET_ENV: &str = "ROTA_WEBHOOK_SECRET";
/// The workflows directory used when `--workflows` is absent, if it exists.
const WORKFLOWS_DIR_DEFAULT: &str = "workflows";

/// How many calls each agent runs at once unless told otherwise.
const AGENT_CONCURRENCY_DEFAULT: u32 = 16;
/// How often the Supervisor looks for passed deadlines unless told otherwise.
const SUPERVISOR_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

/// What every engine process takes, whatever its roles.
#[derive(clap::Args, Clone)]
pub struct ProcessArgs {
    /// The directory of workflow definitions (*.yaml, *.yml, *.json), all
    /// registered at startup [default: ./workflows if it exists].
    #[arg(long, value_name = "DIR")]
    workflows: Option<PathBuf>,
    /// This process's instance id: the `locked_by` of the tasks it runs and
    /// the name of its Scheduler's inbox. Letters, digits, '-', '_', '.', ':'
    /// [default: <hostname>-<pid>].
    #[arg(long, env = "ROTA_INSTANCE_ID", value_name = "ID")]
    instance_id: Option<String>,
    /// At SIGINT/SIGTERM, how long agent calls and replies in progress may
    /// take to finish before they are cancelled and given back (0s..1h).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    shutdown_grace: Duration,
    /// The most items a `for_each` step may run over: a longer list fails
    /// the step for good rather than start that many instances (Scheduler).
    #[arg(long, value_name = "N", default_value_t = rota_engine::scheduler::FOR_EACH_ITEMS_MAX_DEFAULT as u32,
          value_parser = clap::value_parser!(u32).range(1..=rota_engine::scheduler::FOR_EACH_ITEMS_MAX_LIMIT as i64))]
    for_each_items_max: u32,
    /// How many levels of child workflows (`workflow:` steps) may run below
    /// a top-level task: a deeper child is not started and its step fails
    /// for good, which stops a workflow that starts itself (Scheduler).
    #[arg(long, value_name = "N", default_value_t = rota_engine::child::CHILD_DEPTH_MAX_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(rota_engine::child::CHILD_DEPTH_MAX_LIMIT)))]
    child_depth_max: u32,
    #[command(flatten)]
    remote: RemoteAgentArgs,
    #[command(flatten)]
    pub trace: TraceArgs,
}

/// Where this process exports its traces, if anywhere.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TraceArgs {
    /// Export traces over OTLP/HTTP (protobuf) to this collector, e.g.
    /// http://127.0.0.1:4318 (spans are POSTed to URL/v1/traces). Off when
    /// not given: nothing is exported and messages carry no trace context.
    #[arg(long = "otlp-endpoint", env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

impl TraceArgs {
    /// The endpoint, unless unset or empty.
    pub fn endpoint(&self) -> Option<&str> {
        self.otlp_endpoint.as_deref().map(str::trim).filter(|endpoint| !endpoint.is_empty())
    }
}

/// Where circuit breakers live (`--breakers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BreakerMode {
    /// In the store, shared by every process; open breakers hold work.
    Shared,
    /// In each process; open breakers fail calls fast.
    Local,
}

/// The agent role's settings.
#[derive(clap::Args, Clone)]
pub struct AgentArgs {
    /// The agent queues to consume, comma-separated: agent names (`http`) or
    /// their queues (`agent.http`) [default: every built-in agent].
    #[arg(long, value_name = "QUEUES", value_delimiter = ',')]
    queues: Vec<String>,
    /// How many calls each agent runs at once (MaxConcurrentCalls).
    #[arg(long, visible_alias = "max-concurrent", value_name = "N", default_value_t = AGENT_CONCURRENCY_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..=Config::AGENT_CONCURRENCY_MAX as i64))]
    agent_concurrency: u32,
    /// How often agents read whether the tasks of their calls in progress
    /// have finished (an operator's cancel, made by any process), to stop
    /// those calls: the `exec` command killed, the `http` request dropped.
    /// A call is stopped at most twice this after the cancel (10ms..1m).
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = humantime::parse_duration)]
    agent_stop_check: Duration,
    /// Rate limits of agent queues, comma-separated QUEUE=RATE[:BURST]
    /// (`http=20/s`, `agent.exec=100/m:10`): at most RATE calls start per
    /// unit (s, m, h), BURST at once (default 1), counted across every
    /// process sharing the store. A call past the limit is held (its
    /// request given back until its slot, its step's complete-by moved),
    /// never failed. Steps can limit their own target with `rate_limit:`.
    #[arg(long = "rate", value_name = "QUEUE=RATE[:BURST]", value_delimiter = ',')]
    rates: Vec<String>,
    /// The longest a call waits in-process for its rate slot (at most half
    /// its step's time left); a slot further away holds the request
    /// (0s..1m).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    agent_rate_wait: Duration,
    /// Where the `http` agent's circuit breakers live. `shared` (the
    /// default): in the store, one per endpoint for every process; after 5
    /// transient failures in a row it opens for 10 s, holding the
    /// endpoint's requests (neither failing them nor counting failures),
    /// then one process probes and the held work is released when the
    /// probe succeeds. `local`: each process keeps its own, which fails
    /// calls fast while open (a retryable `circuit_open` error).
    #[arg(long, value_name = "WHERE", default_value = "shared")]
    breakers: BreakerMode,
    /// Transient failures in a row of one endpoint that open its circuit
    /// breaker (1..1000; shared breakers count every process's).
    #[arg(long, value_name = "N", default_value_t = 5)]
    breaker_failures: u32,
    /// How long an open breaker holds (shared) or fails (local) calls to
    /// its endpoint before one probe may go (1ms..24h).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    breaker_open_for: Duration,
    /// The only hosts `http` steps and webhooks may reach, comma-separated:
    /// host names (api.example.com, *.example.com), networks (10.0.0.0/8)
    /// or addresses. A name not listed is allowed only when every address
    /// it resolves to lies in a listed network. A refused call fails its
    /// step for good (a webhook is dead-lettered). Off when not given:
    /// every host may be reached.
    #[arg(long, env = "ROTA_EGRESS_ALLOW", value_name = "HOSTS", value_delimiter = ',')]
    egress_allow: Vec<String>,
    /// The directory `exec` steps run in [default: /].
    #[arg(long, value_name = "DIR")]
    exec_dir: Option<PathBuf>,
    /// Variables of this process's environment that `exec` steps get,
    /// comma-separated. Steps get a clean environment: PATH, HOME, LANG,
    /// LC_ALL, TZ and TMPDIR (when set), the names given here, the step's
    /// own `env` and the ROTA_* variables; nothing else of the server's.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    exec_env: Vec<String>,
}

impl Default for AgentArgs {
    fn default() -> Self {
        AgentArgs {
            queues: Vec::new(),
            agent_concurrency: AGENT_CONCURRENCY_DEFAULT,
            agent_stop_check: rota_engine::agent_worker::STOP_CHECK_DEFAULT,
            rates: Vec::new(),
            agent_rate_wait: rota_engine::agent_worker::RATE_WAIT_DEFAULT,
            breakers: BreakerMode::Shared,
            breaker_failures: 5,
            breaker_open_for: Duration::from_secs(10),
            egress_allow: Vec::new(),
            exec_dir: None,
            exec_env: Vec::new(),
        }
    }
}

impl AgentArgs {
    /// The egress allow-list of `--egress-allow`, off when it is not given.
    fn egress(&self) -> anyhow::Result<Egress> {
        if self.egress_allow.is_empty() {
            return Ok(Egress::default());
        }
        Egress::allow_list(&self.egress_allow).map_err(|err| match err {
            rota_agent::Error::Config(why) => anyhow!("--{why}"),
            other => other.into(),
        })
    }

    /// The `exec` agent's settings: `--exec-dir`, which must exist, and the
    /// environment commands start from, read from this process's.
    fn exec_config(&self) -> anyhow::Result<ExecConfig> {
        let mut config = ExecConfig::default();
        if let Some(dir) = &self.exec_dir {
            let absolute = std::path::absolute(dir).with_context(|| format!("--exec-dir {}", dir.display()))?;
            anyhow::ensure!(absolute.is_dir(), "--exec-dir {}: no such directory", dir.display());
            config.working_dir = absolute;
        }
        let mut names: Vec<&str> = rota_agent::ENV_INHERITED.to_vec();
        for name in &self.exec_env {
            let name = name.trim();
            anyhow::ensure!(!name.is_empty() && !name.contains(['=', '\0']), "--exec-env: {name:?} is not a variable name");
            if !names.contains(&name) {
                names.push(name);
            }
        }
        config.env = names.into_iter().filter_map(|name| Some((name.to_owned(), std::env::var(name).ok()?))).collect();
        Ok(config)
    }
}

/// The Supervisor role's settings.
#[derive(clap::Args, Clone)]
pub struct SupervisorArgs {
    /// How often the Supervisor looks for passed deadlines (10ms..1h); its
    /// leadership lasts five of these without renewal.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = humantime::parse_duration)]
    supervisor_interval: Duration,
    /// A schedule's fire found later than this after its time is missed
    /// and follows the schedule's catch-up policy (1s..7d).
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = humantime::parse_duration)]
    schedule_late_max: Duration,
    /// The most fires of one schedule the Supervisor leader handles per
    /// round, oldest first (a catch-up after long downtime spreads over
    /// rounds).
    #[arg(long, value_name = "N", default_value_t = 100)]
    schedule_fires_per_round: u32,
    /// How long finished tasks are kept after they finished (e.g. 30d)
    /// before the Supervisor leader deletes them with their steps and
    /// history; a workflow's `retention:` overrides it for its tasks.
    /// Without it, only workflows with their own retention are pruned.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    retention: Option<Duration>,
    /// How often the Supervisor leader runs a retention pass (1s..1d).
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = humantime::parse_duration)]
    retention_interval: Duration,
    /// The most tasks one retention batch deletes (one short transaction).
    #[arg(long, value_name = "N", default_value_t = 500)]
    retention_batch: u32,
    /// The pause between two retention batches, which lets other writes through (at most 1m).
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = humantime::parse_duration)]
    retention_pause: Duration,
    /// How long an instance must have sent no heartbeat before its
    /// heartbeat and empty inbox queue are swept, and a circuit breaker no
    /// process reports is deleted (at least 1m).
    #[arg(long, value_name = "DURATION", default_value = "1day", value_parser = humantime::parse_duration)]
    instances_gone_after: Duration,
    /// Archive finished tasks to this directory before retention deletes
    /// them: each batch is written (one task per line, the format of `rota
    /// export`) to a new file and fsynced before its tasks are deleted.
    /// Created if missing.
    #[arg(long, value_name = "DIR")]
    archive: Option<std::path::PathBuf>,
    /// How long the audit log keeps the operator actions that have no task
    /// (queue, dead-letter, schedule, workflow and batch changes, prunes);
    /// a task's own actions are kept as long as the task (at least 1day).
    #[arg(long, value_name = "DURATION", default_value = "400days", value_parser = humantime::parse_duration)]
    audit_retention: Duration,
}

impl Default for SupervisorArgs {
    fn default() -> Self {
        let schedules = rota_engine::schedules::Config::default();
        let retention = rota_engine::retention::Config::default();
        SupervisorArgs {
            supervisor_interval: SUPERVISOR_INTERVAL_DEFAULT,
            schedule_late_max: schedules.late_max,
            schedule_fires_per_round: schedules.fires_per_round,
            retention: retention.default,
            retention_interval: retention.interval,
            retention_batch: retention.batch,
            retention_pause: retention.pause,
            instances_gone_after: retention.instances_gone_after,
            archive: retention.archive,
            audit_retention: retention.audit,
        }
    }
}

/// The Scheduler's settings.
#[derive(clap::Args, Clone)]
pub struct SchedulerArgs {
    /// One task in this many that the Scheduler claims is the oldest
    /// waiting, whatever its priority (the others go highest priority
    /// first), so that low priorities still progress: a task with none
    /// older waiting is claimed within this many claims. 1 ignores
    /// priorities.
    #[arg(long, value_name = "N", default_value_t = rota_store::OLDEST_SHARE_EVERY_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..))]
    claim_oldest_every: u32,
    /// Stop claiming new tasks while this many step requests wait for an
    /// agent (ready, not yet taken) in the agent queues the Scheduler
    /// sends to: the agents are saturated, and started tasks' next steps
    /// go first. 0 never stops claiming.
    #[arg(long, value_name = "N", default_value_t = rota_engine::scheduler::AGENT_BACKLOG_MAX_DEFAULT)]
    agent_backlog_max: u32,
}

impl Default for SchedulerArgs {
    fn default() -> Self {
        SchedulerArgs {
            claim_oldest_every: rota_store::OLDEST_SHARE_EVERY_DEFAULT,
            agent_backlog_max: rota_engine::scheduler::AGENT_BACKLOG_MAX_DEFAULT,
        }
    }
}

/// Arguments of `rota scheduler`.
#[derive(clap::Args)]
pub struct SchedulerCommand {
    #[command(flatten)]
    pub process: ProcessArgs,
    #[command(flatten)]
    scheduler: SchedulerArgs,
}

/// Arguments of `serve`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub process: ProcessArgs,
    #[command(flatten)]
    scheduler: SchedulerArgs,
    #[command(flatten)]
    agent: AgentArgs,
    #[command(flatten)]
    supervisor: SupervisorArgs,
    /// The roles to run, comma-separated.
    #[arg(long, value_enum, value_name = "ROLES", value_delimiter = ',', default_value = "scheduler,agent,supervisor")]
    roles: Vec<Role>,
    #[command(flatten)]
    listen: ListenArgs,
}

/// Arguments of `rota agent`.
#[derive(clap::Args)]
pub struct AgentCommand {
    #[command(flatten)]
    pub process: ProcessArgs,
    #[command(flatten)]
    agent: AgentArgs,
}

/// Arguments of `rota supervisor`.
#[derive(clap::Args)]
pub struct SupervisorCommand {
    #[command(flatten)]
    pub process: ProcessArgs,
    #[command(flatten)]
    supervisor: SupervisorArgs,
}

/// One engine process: its roles and their settings.
pub struct RunArgs {
    process: ProcessArgs,
    scheduler: SchedulerArgs,
    agent: AgentArgs,
    supervisor: SupervisorArgs,
    roles: Vec<Role>,
    /// Where to serve the HTTP API, if at all.
    listen: Option<ListenArgs>,
}

impl RunArgs {
    /// Only the given roles, every setting of the others at its default.
    fn only(process: ProcessArgs, roles: Vec<Role>) -> Self {
        RunArgs {
            process,
            scheduler: SchedulerArgs::default(),
            agent: AgentArgs::default(),
            supervisor: SupervisorArgs::default(),
            roles,
            listen: None,
        }
    }
}

impl From<SchedulerCommand> for RunArgs {
    fn from(args: SchedulerCommand) -> Self {
        RunArgs { scheduler: args.scheduler, ..RunArgs::only(args.process, vec![Role::Scheduler]) }
    }
}

impl From<Args> for RunArgs {
    fn from(args: Args) -> Self {
        let listen = Some(args.listen).filter(|listen| !listen.is_off());
        RunArgs {
            process: args.process,
            scheduler: args.scheduler,
            agent: args.agent,
            supervisor: args.supervisor,
            roles: args.roles,
            listen,
        }
    }
}

impl From<AgentCommand> for RunArgs {
    fn from(args: AgentCommand) -> Self {
        RunArgs { agent: args.agent, ..RunArgs::only(args.process, vec![Role::Agent]) }
    }
}

impl From<SupervisorCommand> for RunArgs {
    fn from(args: SupervisorCommand) -> Self {
        RunArgs { supervisor: args.supervisor, ..RunArgs::only(args.process, vec![Role::Supervisor]) }
    }
}

/// One role of the pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Role {
    /// Claims tasks and orchestrates their steps.
    Scheduler,
    /// Runs the built-in agents on their queues.
    #[value(alias = "agents")]
    Agent,
    /// Recovers passed deadlines.
    Supervisor,
}

/// Runs the engine until a signal stops it.
pub async fn run(store_args: StoreArgs, args: RunArgs) -> anyhow::Result<()> {
    // Listen before doing anything else, so that an early signal is a clean stop.
    let mut signals = Signals::new()?;
    let process = Process::build(&store_args, &args).await?;
    process.run(&mut signals).await
}

/// One engine process, built and checked, nothing running yet.
struct Process {
    instance: InstanceId,
    store: SharedStore,
    clock: Arc<dyn Clock>,
    engine: Engine,
    /// Writes this process's heartbeat and its agents' breakers.
    reporter: Reporter,
    /// The HTTP API's listener, when it serves one.
    listening: Option<Listening>,
    /// The webhook dispatcher, with `ROTA_WEBHOOK_SECRET` set.
    dispatcher: Option<Dispatcher>,
}

impl Process {
    /// Checks the flags, loads the definitions and binds the API's port,
    /// then opens the store and registers the definitions: a bad argument,
    /// a bad definition or a busy port stops startup with nothing written.
    async fn build(store_args: &StoreArgs, args: &RunArgs) -> anyhow::Result<Process> {
        let instance = instance_id::from_flag(args.process.instance_id.as_deref())?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let mut config = engine_config(args, instance.clone(), &*clock)?;
        let egress = args.agent.egress()?;
        let breaker = rota_agent::BreakerConfig::new(args.agent.breaker_failures, args.agent.breaker_open_for)
            .map_err(|e| anyhow::anyhow!("{}", breaker_flag_error(&e)))?;
        let http = HttpConfig { egress: egress.clone(), breaker, ..HttpConfig::default() };
        let agents =
            AgentRegistry::builtin_with(http, args.agent.exec_config()?, clock.clone()).context("cannot set up the built-in agents")?;
        let running_agents = selected_agents(&agents, &args.agent.queues)?;
        config.agent_rates = queue_rates(&agents, &args.agent.rates)?;
        let catalog = agent_catalog(&agents, &args.process.remote)?;
        let (dir, definitions) = load_workflows(args.process.workflows.as_deref(), &catalog)?;
        let listening = bind_api(args).await?;
        let webhook_secret = webhook_secret()?;

        let store = store_args.open().await?;
        warn_if_instance_is_live(&store, &instance, &*clock).await;
        register(&store, &definitions).await?;
        declare_schedules(&store, &definitions).await?;

        let dispatcher = match webhook_secret {
            Some(secret) => {
                let mut webhooks = WebhookConfig::new(instance.clone(), secret);
                webhooks.seed = config.seed.rotate_left(1);
                webhooks.egress = egress;
                Some(Dispatcher::new(store.clone(), clock.clone(), webhooks).context("cannot set up the webhooks")?)
            }
            None => None,
        };
        // Without the agent role the registry only serves to check definitions.
        let agent_names: Vec<String> = if config.roles.agents { running_agents } else { Vec::new() };
        let heartbeat = Heartbeat {
            instance: instance.clone(),
            roles: args.roles.iter().map(|role| role_name(*role).to_owned()).collect(),
            agents: agent_names.clone(),
            workflows: definitions.iter().map(|w| (w.name().as_str().to_owned(), w.version())).collect(),
            started_at: clock.now(),
        };
        info!(
            "rota serve started: instance {instance}, store {}, roles {}, agents {}, workflows {}, API {}, webhooks {}, egress {}",
            redacted(&store_args.url),
            heartbeat.roles.join(","),
            if agent_names.is_empty() { "none".to_owned() } else { agent_names.join(",") },
            loaded(dir.as_deref(), &definitions),
            listening.as_ref().map_or("off".to_owned(), |listening| format!("http://{}", listening.address)),
            if dispatcher.is_some() { "on" } else { "off (no ROTA_WEBHOOK_SECRET)" },
            if args.agent.egress_allow.is_empty() { "any host (no --egress-allow)".to_owned() } else { args.agent.egress_allow.join(",") },
        );

        let mut engine = Engine::new(store.clone(), clock.clone(), config);
        for name in &agent_names {
            engine = engine.agent(agents.get(name).expect("a registered name"));
        }
        for definition in definitions {
            engine = engine.workflow(definition);
        }
        let reporter = Reporter::new(store.clone(), clock.clone(), agents, heartbeat);
        Ok(Process { instance, store, clock, engine, reporter, listening, dispatcher })
    }

    /// Runs every role, the API and the dispatcher until the first signal,
    /// then waits for them to let go of what they hold; a second signal
    /// stops at once. One of them failing stops the others.
    async fn run(self, signals: &mut Signals) -> anyhow::Result<()> {
        let Process { instance, store, clock, engine, reporter, listening, dispatcher } = self;
        let shutdown = Shutdown::new();
        let client = engine.client();
        // The API hands its remote workers' replies to this Scheduler.
        let scheduler = engine.scheduler().context("cannot set up the Scheduler")?;
        let mut engine_run = tokio::spawn(engine.run(shutdown.clone()));
        let reporting = tokio::spawn(reporter.run(shutdown.clone()));
        let serving = serve_until_shutdown(listening, dispatcher, store, client, clock, scheduler, shutdown.clone());
        let mut serving = tokio::spawn(serving);

        let engine_stopped = tokio::select! {
            () = signals.next() => {
                info!("stopping: waiting for the work in flight (send another SIGINT or SIGTERM to stop at once)");
                shutdown.trigger();
                or_second_signal(signals, &mut engine_run, "the work in flight is given back when its leases expire").await?
            }
            joined = &mut engine_run => {
                shutdown.trigger();
                match joined {
                    Ok(Ok(())) => bail!("the engine stopped by itself"),
                    Ok(Err(err)) => return Err(anyhow::Error::new(err).context("the engine stopped")),
                    Err(err) => bail!("the engine panicked: {err}"),
                }
            }
            joined = &mut serving => {
                // They stop only after the shutdown otherwise: stop the
                // engine too rather than run half a server.
                shutdown.trigger();
                let _ = engine_run.await;
                match joined {
                    Ok(Ok(())) => bail!("the HTTP API and the webhook dispatcher stopped by themselves"),
                    Ok(Err(err)) => return Err(err),
                    Err(err) => bail!("the HTTP API or the webhook dispatcher panicked: {err}"),
                }
            }
        };
        // Requests in progress (a worker's long poll, say) may still take a moment.
        match or_second_signal(signals, &mut serving, "with HTTP requests in progress").await? {
            Ok(Ok(())) => {}
            Ok(Err(err)) => warn!("stopping: {err:#}"),
            Err(err) => warn!("the HTTP API or the webhook dispatcher panicked while stopping: {err}"),
        }
        match engine_stopped {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return Err(anyhow::Error::new(err).context("the engine failed while stopping")),
            Err(err) => bail!("the engine panicked while stopping: {err}"),
        }
        if let Err(err) = reporting.await {
            warn!("the status reporter panicked: {err}");
        }
        info!("rota serve stopped: instance {instance}");
        Ok(())
    }
}

/// `work`'s result, unless a second signal comes first.
async fn or_second_signal<T>(signals: &mut Signals, work: impl Future<Output = T>, left_behind: &str) -> anyhow::Result<T> {
    tokio::select! {
        done = work => Ok(done),
        () = signals.next() => bail!("stopped at once by a second signal, {left_behind}"),
    }
}

/// The engine's settings from the flags, checked; an error names the flag.
fn engine_config(args: &RunArgs, instance: InstanceId, clock: &dyn Clock) -> anyhow::Result<Config> {
    let mut config = Config::new(instance.clone());
    config.roles = Roles {
        scheduler: args.roles.contains(&Role::Scheduler),
        agents: args.roles.contains(&Role::Agent),
        supervisor: args.roles.contains(&Role::Supervisor),
    };
    config.scheduler.claim_oldest_every = args.scheduler.claim_oldest_every;
    config.scheduler.agent_backlog_max = args.scheduler.agent_backlog_max;
    config.agent_concurrency = args.agent.agent_concurrency as usize;
    config.agent_stop_check = args.agent.agent_stop_check;
    config.agent_rate_wait = args.agent.agent_rate_wait;
    config.agent_breakers = match args.agent.breakers {
        BreakerMode::Local => None,
        BreakerMode::Shared => Some(SharedBreakerConfig {
            failures_to_open: args.agent.breaker_failures,
            open_for: args.agent.breaker_open_for,
            ..SharedBreakerConfig::default()
        }),
    };
    config.supervisor = config.supervisor.every(args.supervisor.supervisor_interval);
    config.supervisor.schedules = rota_engine::schedules::Config {
        late_max: args.supervisor.schedule_late_max,
        fires_per_round: args.supervisor.schedule_fires_per_round,
    };
    config.supervisor.retention = rota_engine::retention::Config {
        default: args.supervisor.retention,
        interval: args.supervisor.retention_interval,
        batch: args.supervisor.retention_batch,
        pause: args.supervisor.retention_pause,
        instances_gone_after: args.supervisor.instances_gone_after,
        archive: args.supervisor.archive.clone(),
        audit: args.supervisor.audit_retention,
        ..rota_engine::retention::Config::default()
    };
    if let Some(dir) = &args.supervisor.archive {
        rota_engine::archive::Archive::open(dir).map_err(|e| anyhow::anyhow!("--archive: {e}"))?;
    }
    config.shutdown_grace = args.process.shutdown_grace;
    config.scheduler.for_each_items_max = args.process.for_each_items_max as usize;
    config.scheduler.child_depth_max = args.process.child_depth_max;
    if let Some(listen) = &args.listen {
        config.input_bytes_max = listen.input_bytes_max;
    }
    config.seed = seed(&instance, clock);
    match config.validate() {
        Ok(()) => Ok(config),
        Err(rota_engine::Error::OutOfBounds { field, why }) => match flag_of(field) {
            Some(flag) => bail!("{flag} {why}"),
            None => bail!("invalid configuration: {field} {why}"),
        },
        Err(err) => Err(err.into()),
    }
}

/// The agent crate's breaker error with the flags' names in place of its
/// fields'.
fn breaker_flag_error(error: &rota_agent::Error) -> String {
    let message = match error {
        rota_agent::Error::Config(message) => message.clone(),
        other => other.to_string(),
    };
    message.replace("breaker.failures_to_open", "--breaker-failures").replace("breaker.open_for", "--breaker-open-for")
}

/// The flag that sets an engine setting, for the settings that have one.
fn flag_of(field: &str) -> Option<&'static str> {
    match field {
        "supervisor.interval" => Some("--supervisor-interval"),
        "scheduler.claim_oldest_every" => Some("--claim-oldest-every"),
        "schedules.late_max" => Some("--schedule-late-max"),
        "schedules.fires_per_round" => Some("--schedule-fires-per-round"),
        "retention.default" => Some("--retention"),
        "retention.interval" => Some("--retention-interval"),
        "retention.batch" => Some("--retention-batch"),
        "retention.pause" => Some("--retention-pause"),
        "retention.instances_gone_after" => Some("--instances-gone-after"),
        "retention.audit" => Some("--audit-retention"),
        "shutdown_grace" => Some("--shutdown-grace"),
        "agent_concurrency" => Some("--agent-concurrency"),
        "agent_stop_check" => Some("--agent-stop-check"),
        "agent_rate_wait" => Some("--agent-rate-wait"),
        "input_bytes_max" => Some("--input-bytes-max"),
        "for_each_items_max" => Some("--for-each-items-max"),
        "child_depth_max" => Some("--child-depth-max"),
        "breakers.failures_to_open" => Some("--breaker-failures"),
        "breakers.open_for" => Some("--breaker-open-for"),
        _ => None,
    }
}

/// The agents a step may name: the built-in ones and those external
/// workers run (`--remote-agents`).
fn agent_catalog(agents: &AgentRegistry, remote: &RemoteAgentArgs) -> anyhow::Result<AgentCatalog> {
    let catalog = agents
        .names()
        .fold(AgentCatalog::empty(), |catalog, name| catalog.with(AgentName::new(name).expect("registered agents have valid names")));
    Ok(remote.names()?.into_iter().fold(catalog, AgentCatalog::with))
}

/// Binds the API's port, when it serves one. The default port being busy
/// (another `rota serve` on this host) is not fatal: it runs without.
async fn bind_api(args: &RunArgs) -> anyhow::Result<Option<Listening>> {
    let Some(listen) = &args.listen else { return Ok(None) };
    match api_server::bind(listen, &args.process.remote).await {
        Ok(listening) => Ok(Some(listening)),
        Err(err) if listen.is_default_in_use(&err) => {
            warn!(
                "{err:#}: running without the HTTP API (another rota serve on this host has it?); \
                 give --listen ADDR (port 0 picks a free one) or --listen none"
            );
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

/// The webhook signing secret, when `ROTA_WEBHOOK_SECRET` is set.
fn webhook_secret() -> anyhow::Result<Option<Secret>> {
    api_server::secret_env(WEBHOOK_SECRET_ENV)
        .map(|secret| Secret::new(secret).map_err(|err| anyhow!("{WEBHOOK_SECRET_ENV}: {err}")))
        .transpose()
}

/// Serves the API and runs the dispatcher until the shutdown, or fails
/// early with the first of them to fail; one that is off waits for the
/// shutdown, so that the caller's select has one shape either way.
async fn serve_until_shutdown(
    listening: Option<Listening>,
    dispatcher: Option<Dispatcher>,
    store: SharedStore,
    client: Client,
    clock: Arc<dyn Clock>,
    scheduler: Option<rota_engine::Scheduler>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let api = async {
        match listening {
            Some(listening) => listening.serve(store, client, clock, scheduler, shutdown.clone()).await,
            None => {
                shutdown.triggered().await;
                Ok(())
            }
        }
    };
    let dispatching = async {
        match dispatcher {
            Some(dispatcher) => dispatcher.run(shutdown.clone()).await.context("the webhook dispatcher failed"),
            None => {
                shutdown.triggered().await;
                Ok(())
            }
        }
    };
    tokio::try_join!(api, dispatching).map(drop)
}

/// The start line's account of the definitions loaded.
fn loaded(dir: Option<&Path>, definitions: &[Workflow]) -> String {
    let each: Vec<String> = definitions
        .iter()
        .map(|w| format!("{}@{} ({} step{})", w.name(), w.version(), w.steps().len(), if w.steps().len() == 1 { "" } else { "s" }))
        .collect();
    match (dir, each.is_empty()) {
        (None, _) => "none (no workflows directory; tasks run the definitions already registered)".to_owned(),
        (Some(dir), true) => format!("none in {}", dir.display()),
        (Some(dir), false) => format!("{} from {}", each.join(", "), dir.display()),
    }
}

/// The agents whose queues `--queues` names (an agent's name or its queue's),
/// or every built-in agent when it names none.
fn selected_agents(agents: &AgentRegistry, queues: &[String]) -> anyhow::Result<Vec<String>> {
    let known: Vec<&str> = agents.names().collect();
    if queues.is_empty() {
        return Ok(known.iter().map(|name| (*name).to_owned()).collect());
    }
    let mut selected: Vec<String> = Vec::new();
    for queue in queues {
        let queue = queue.trim();
        let name = known.iter().find(|name| **name == queue || rota_engine::protocol::agent_queue(name).as_str() == queue);
        let Some(name) = name else {
            let choices: Vec<String> = known.iter().map(|name| format!("{name} ({})", rota_engine::protocol::agent_queue(name))).collect();
            bail!("--queues: no agent consumes {queue:?}; the agents and their queues are {}", choices.join(", "));
        };
        if !selected.iter().any(|s| s == name) {
            selected.push((*name).to_owned());
        }
    }
    Ok(selected)
}

/// The queue rate limits of `--rate`, by agent name: each QUEUE=RATE[:BURST]
/// names an agent (or its queue) this build runs, once.
fn queue_rates(agents: &AgentRegistry, rates: &[String]) -> anyhow::Result<BTreeMap<String, RateLimit>> {
    let mut by_agent = BTreeMap::new();
    for entry in rates {
        let entry = entry.trim();
        let Some((queue, rate)) = entry.split_once('=') else {
            bail!("--rate {entry:?}: expected QUEUE=RATE[:BURST], such as http=20/s or http=20/s:5");
        };
        let name = selected_agents(agents, &[queue.to_owned()])
            .map_err(|e| anyhow!("--rate {entry:?}: {}", e.to_string().replace("--queues: ", "")))?;
        let (rate, burst) = match rate.split_once(':') {
            Some((rate, burst)) => {
                let burst: u32 =
                    burst.trim().parse().map_err(|_| anyhow!("--rate {entry:?}: the burst must be a whole number, got {burst:?}"))?;
                (rate, Some(burst))
            }
            None => (rate, None),
        };
        let mut limit: RateLimit = rate.parse().map_err(|e| anyhow!("--rate {entry:?}: {e}"))?;
        if let Some(burst) = burst {
            limit = limit.with_burst(burst).map_err(|e| anyhow!("--rate {entry:?}: {e}"))?;
        }
        if by_agent.insert(name[0].clone(), limit).is_some() {
            bail!("--rate {entry:?}: the queue of agent {} is limited twice", name[0]);
        }
    }
    Ok(by_agent)
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Scheduler => "scheduler",
        Role::Agent => "agent",
        Role::Supervisor => "supervisor",
    }
}

/// Loads every definition in `dir` (or in `./workflows` when it exists).
/// Any problem stops startup: every diagnostic goes to stderr, one per line.
fn load_workflows(dir: Option<&Path>, catalog: &AgentCatalog) -> anyhow::Result<(Option<PathBuf>, Vec<Workflow>)> {
    let dir = match dir {
        Some(dir) if !dir.is_dir() => bail!("--workflows {}: no such directory", dir.display()),
        Some(dir) => dir.to_path_buf(),
        None if Path::new(WORKFLOWS_DIR_DEFAULT).is_dir() => PathBuf::from(WORKFLOWS_DIR_DEFAULT),
        None => return Ok((None, Vec::new())),
    };
    let (workflows, problems) = rota_workflow::load_dir(&dir, catalog);
    if !problems.is_empty() {
        for problem in &problems {
            eprintln!("{problem}");
        }
        let count = problems.len();
        bail!("{count} problem{} in the workflow definitions in {}; not starting", if count == 1 { "" } else { "s" }, dir.display());
    }
    if workflows.is_empty() {
        warn!("no workflow definitions (*.yaml, *.yml, *.json) in {}", dir.display());
    }
    Ok((Some(dir), workflows))
}

/// Registers each definition, naming the one whose version is already
/// registered with a different definition.
async fn register(store: &SharedStore, definitions: &[Workflow]) -> anyhow::Result<()> {
    let workflows = Workflows::new(store.clone());
    for workflow in definitions {
        let (name, version) = (workflow.name(), workflow.version());
        match workflows.register(workflow).await {
            Ok(()) => {}
            Err(rota_engine::Error::Store(rota_store::Error::Conflict(detail))) => bail!(
                "workflow {name} version {version} differs from the version {version} already registered in the store \
                 (a changed definition needs a new version number): {detail}"
            ),
            Err(err) => return Err(anyhow::Error::new(err).context(format!("cannot register workflow {name} version {version}"))),
        }
    }
    Ok(())
}

/// Declares the schedules the definitions' files list: each replaces the
/// stored schedule of its name (one created from the CLI or the API
/// included; its pause and progress are kept). Two files may declare the
/// same schedule only with the same definition (two versions of one
/// workflow, say).
async fn declare_schedules(store: &SharedStore, definitions: &[Workflow]) -> anyhow::Result<()> {
    let mut declared: HashMap<ScheduleName, (NewSchedule, String)> = HashMap::new();
    for workflow in definitions {
        for def in workflow.schedules() {
            let spec = ScheduleSpec {
                workflow: workflow.name().clone(),
                cron: def.cron.clone(),
                timezone: def.timezone.clone(),
                input: def.input.clone(),
                overlap: def.overlap,
                catch_up: def.catch_up,
            };
            let new = NewSchedule { name: def.name.clone(), spec, source: ScheduleSource::File };
            let owner = format!("workflow {} version {}", workflow.name(), workflow.version());
            match declared.get(&def.name) {
                Some((first, _)) if *first == new => {}
                Some((_, first)) => bail!("schedule {} is declared differently by {first} and by {owner}", def.name),
                None => {
                    declared.insert(def.name.clone(), (new, owner));
                }
            }
        }
    }
    let mut names: Vec<&ScheduleName> = declared.keys().collect();
    names.sort();
    for name in names {
        let (new, owner) = &declared[name];
        let record = store.declare_schedule(new).await.with_context(|| format!("cannot declare schedule {name} of {owner}"))?;
        info!(
            "schedule {name} ({owner}): cron \"{}\" in {}{}",
            new.spec.cron,
            new.spec.timezone,
            if record.paused { ", paused" } else { "" }
        );
    }
    Ok(())
}

/// A jitter seed that differs between processes, so that two instances do
/// not back off in lockstep.
fn seed(instance: &InstanceId, clock: &dyn Clock) -> u64 {
    let mut hasher = DefaultHasher::new();
    (instance.as_str(), std::process::id(), clock.now().as_millis()).hash(&mut hasher);
    hasher.finish()
}

/// Two live processes with one instance id would share an inbox and each
/// other's leases; the heartbeat makes that visible.
async fn warn_if_instance_is_live(store: &SharedStore, instance: &InstanceId, clock: &dyn Clock) {
    if let Some(age) = rota_engine::status::live_heartbeat_age(store, instance, clock.now()).await {
        warn!(
            "instance id {instance} reported a heartbeat {} ago and did not stop cleanly: \
             if another process runs with this id, stop one of them (two processes must not share an instance id)",
            humantime::format_duration(Duration::from_millis(age.as_millis() as u64))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(rates: &[&str]) -> Result<Vec<(String, String, u32)>, String> {
        let agents = AgentRegistry::builtin(Arc::new(SystemClock)).unwrap();
        let rates: Vec<String> = rates.iter().map(|r| (*r).to_owned()).collect();
        queue_rates(&agents, &rates)
            .map(|by_agent| by_agent.into_iter().map(|(agent, limit)| (agent, limit.to_string(), limit.burst())).collect())
            .map_err(|e| e.to_string())
    }

    /// The engine configuration `rota COMMAND ARGS…` makes.
    fn configured<C: clap::Args + Into<RunArgs>>(args: &[&str]) -> Config {
        #[derive(clap::Parser)]
        struct Command<C: clap::Args> {
            #[command(flatten)]
            command: C,
        }
        let parsed = <Command<C> as clap::Parser>::try_parse_from(std::iter::once("rota").chain(args.iter().copied())).unwrap();
        engine_config(&parsed.command.into(), InstanceId::new("flags").unwrap(), &SystemClock).unwrap()
    }

    #[test]
    fn breaker_and_backlog_flags_reach_the_engine() {
        let agent = configured::<AgentCommand>(&["--breaker-failures", "2", "--breaker-open-for", "3s"]);
        let shared = agent.agent_breakers.expect("shared by default");
        assert_eq!((shared.failures_to_open, shared.open_for), (2, Duration::from_secs(3)));
        assert_eq!(shared.probe_lease, SharedBreakerConfig::default().probe_lease, "the rest keeps its defaults");
        let local = configured::<AgentCommand>(&["--breakers", "local"]);
        assert!(local.agent_breakers.is_none());
        let scheduler = configured::<SchedulerCommand>(&["--agent-backlog-max", "7"]);
        assert_eq!(scheduler.scheduler.agent_backlog_max, 7);
        let defaults = configured::<SchedulerCommand>(&[]);
        assert_eq!(defaults.scheduler.agent_backlog_max, rota_engine::scheduler::AGENT_BACKLOG_MAX_DEFAULT);
    }

    #[test]
    fn queue_rates_name_an_agent_or_its_queue_once_with_an_optional_burst() {
        assert_eq!(
            check(&["http=20/s", "agent.exec=100/m:10"]),
            Ok(vec![("exec".into(), "100/m".into(), 10), ("http".into(), "20/s".into(), 1)])
        );
        assert_eq!(check(&["http"]), Err("--rate \"http\": expected QUEUE=RATE[:BURST], such as http=20/s or http=20/s:5".into()));
        let unknown = check(&["mail=1/s"]).unwrap_err();
        assert!(unknown.starts_with("--rate \"mail=1/s\": no agent consumes \"mail\""), "{unknown}");
        assert_eq!(
            check(&["http=20/d"]),
            Err("--rate \"http=20/d\": expected a rate such as \"20/s\", \"100/m\" or \"500/h\", got \"20/d\"".into())
        );
        assert_eq!(check(&["http=20/s:x"]), Err("--rate \"http=20/s:x\": the burst must be a whole number, got \"x\"".into()));
        assert_eq!(check(&["http=20/s:0"]), Err("--rate \"http=20/s:0\": the burst must be between 1 and 100000, got 0".into()));
        assert_eq!(
            check(&["http=1/s", "agent.http=2/s"]),
            Err("--rate \"agent.http=2/s\": the queue of agent http is limited twice".into())
        );
    }
}
