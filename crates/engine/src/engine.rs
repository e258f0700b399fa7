//! The embedded engine: every role of the pattern in one process over one
//! store, or any subset of them (for processes that scale out).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rota_agent::Agent;
use rota_model::{Clock, InstanceId, RateLimit};
use rota_store::SharedStore;
use rota_workflow::Workflow;
use tokio::task::JoinSet;

use crate::agent_worker::{self, AgentWorker};
use crate::breakers::{SharedBreakerConfig, SharedBreakers};
use crate::client::Client;
use crate::completions::Completions;
use crate::scheduler::{self, Scheduler};
use crate::supervisor::{self, Supervisor, human};
use crate::workflows::Workflows;
use crate::{Error, Result, Shutdown};

/// Which roles a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    /// Claim tasks and orchestrate their steps.
    pub scheduler: bool,
    /// Run the registered agents on their queues.
    pub agents: bool,
    /// Recover expired deadlines.
    pub supervisor: bool,
}

impl Roles {
    /// Every role (the embedded default, `rota serve`).
    pub const ALL: Roles = Roles { scheduler: true, agents: true, supervisor: true };
}

/// The engine's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// This process's instance id (`locked_by`, lease owner, leader).
    pub instance: InstanceId,
    /// The roles to run.
    pub roles: Roles,
    /// The Scheduler's settings.
    pub scheduler: scheduler::Config,
    /// The Supervisor's settings.
    pub supervisor: supervisor::Config,
    /// How many requests each agent runs at once.
    pub agent_concurrency: usize,
    /// How often agents read whether the tasks of their calls in progress
    /// finished, to stop those calls (`agent_worker::Config::stop_check`).
    pub agent_stop_check: Duration,
    /// Rate limits of agent queues, by agent name (queue `agent.NAME`),
    /// shared by every process consuming them
    /// (`agent_worker::Config::queue_rate`).
    pub agent_rates: BTreeMap<String, RateLimit>,
    /// The longest a call waits in-process for its rate slot before its
    /// request is held instead (`agent_worker::Config::rate_wait`).
    pub agent_rate_wait: Duration,
    /// The agents' circuit breakers, shared through the store: while open
    /// they hold the requests of their endpoint (neither failing them nor
    /// counting failures). `None`: each agent keeps its own breakers in
    /// process, which fail calls fast.
    pub agent_breakers: Option<SharedBreakerConfig>,
    /// The seed of every jitter in this process.
    pub seed: u64,
    /// How long work in progress (agent calls, replies being handled) may
    /// take to finish when the engine stops; then it is given back.
    pub shutdown_grace: Duration,
    /// How long a submission without a version takes the latest version
    /// read from the registry as the latest (see [`Workflows`]); versions
    /// registered through this engine are the latest at once.
    pub workflow_latest_refresh: Duration,
    /// The largest task input this engine's clients take, in bytes of
    /// JSON (see [`Client::with_input_bytes_max`]).
    pub input_bytes_max: usize,
}

impl Config {
    /// The most agent calls each agent runs at once.
    pub const AGENT_CONCURRENCY_MAX: usize = 1_024;

    /// Defaults for `instance`, every role.
    pub fn new(instance: InstanceId) -> Self {
        Config {
            scheduler: scheduler::Config::new(instance.clone()),
            supervisor: supervisor::Config::new(instance.clone()),
            instance,
            roles: Roles::ALL,
            agent_concurrency: 16,
            agent_stop_check: agent_worker::STOP_CHECK_DEFAULT,
            agent_rates: BTreeMap::new(),
            agent_rate_wait: agent_worker::RATE_WAIT_DEFAULT,
            agent_breakers: Some(SharedBreakerConfig::default()),
            seed: 0,
            shutdown_grace: crate::consumer::Config::SHUTDOWN_GRACE_DEFAULT,
            workflow_latest_refresh: crate::workflows::LATEST_REFRESH_DEFAULT,
            input_bytes_max: crate::client::INPUT_BYTES_MAX_DEFAULT,
        }
    }

    /// Checks every bound; the error names the field.
    pub fn validate(&self) -> Result<()> {
        self.supervisor.validate()?;
        if self.scheduler.claim_oldest_every == 0 {
            return Err(Error::OutOfBounds { field: "scheduler.claim_oldest_every", why: "must be at least 1, got 0".into() });
        }
        let grace_max = crate::consumer::Config::SHUTDOWN_GRACE_MAX;
        if self.shutdown_grace > grace_max {
            let why = format!("must be at most {}, got {}", human(grace_max), human(self.shutdown_grace));
            return Err(Error::OutOfBounds { field: "shutdown_grace", why });
        }
        if !(1..=Self::AGENT_CONCURRENCY_MAX).contains(&self.agent_concurrency) {
            let why = format!("must be between 1 and {}, got {}", Self::AGENT_CONCURRENCY_MAX, self.agent_concurrency);
            return Err(Error::OutOfBounds { field: "agent_concurrency", why });
        }
        agent_worker::check_stop_check(self.agent_stop_check)?;
        crate::scheduler::check_for_each_items_max(self.scheduler.for_each_items_max)?;
        crate::scheduler::check_child_depth_max(self.scheduler.child_depth_max)?;
        agent_worker::check_rate_wait(self.agent_rate_wait)?;
        if let Some(breakers) = &self.agent_breakers {
            breakers.validate()?;
        }
        crate::client::check_input_bytes_max(self.input_bytes_max).map_err(|why| Error::OutOfBounds { field: "input_bytes_max", why })?;
        Ok(())
    }
}

/// The engine: the roles, the agents and the workflows of one process.
pub struct Engine {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    config: Config,
    agents: Vec<Arc<dyn Agent>>,
    workflows: Workflows,
    definitions: Vec<Workflow>,
    completions: Completions,
    /// The Scheduler [`Engine::run`] runs, made once it is first asked for.
    scheduler: std::sync::OnceLock<Scheduler>,
}

impl Engine {
    /// An engine over `store` with `config`, no agents and no workflows yet.
    pub fn new(store: SharedStore, clock: Arc<dyn Clock>, config: Config) -> Self {
        let workflows = Workflows::new(store.clone()).clock(clock.clone()).latest_refresh(config.workflow_latest_refresh);
        Engine {
            store,
            clock,
            config,
            agents: Vec::new(),
            workflows,
            definitions: Vec::new(),
            completions: Completions::default(),
            scheduler: std::sync::OnceLock::new(),
        }
    }

    /// The Scheduler this engine runs (`None` without the Scheduler role),
    /// for the parts of the process that answer its agents' requests
    /// themselves: the HTTP worker protocol hands it the replies of remote
    /// workers, as the engine's own agent workers do.
    pub fn scheduler(&self) -> Result<Option<Scheduler>> {
        if !self.config.roles.scheduler {
            return Ok(None);
        }
        if let Some(scheduler) = self.scheduler.get() {
            return Ok(Some(scheduler.clone()));
        }
        let mut scheduler_config = self.config.scheduler.clone();
        scheduler_config.seed ^= self.config.seed;
        scheduler_config.shutdown_grace = self.config.shutdown_grace;
        let made =
            Scheduler::new(self.store.clone(), self.clock.clone(), self.workflows.clone(), self.completions.clone(), scheduler_config)?;
        Ok(Some(self.scheduler.get_or_init(|| made).clone()))
    }

    /// Adds an agent (built-in or custom) this process runs.
    pub fn agent(mut self, agent: Arc<dyn Agent>) -> Self {
        self.agents.push(agent);
        self
    }

    /// Adds a workflow definition, registered in the store when the engine starts.
    pub fn workflow(mut self, workflow: Workflow) -> Self {
        self.definitions.push(workflow);
        self
    }

    /// A client that submits, cancels, resubmits and waits, notified by this engine.
    pub fn client(&self) -> Client {
        let client = Client::new(self.store.clone(), self.clock.clone(), self.workflows.clone(), Some(self.completions.clone()))
            .with_input_bytes_max(self.config.input_bytes_max);
        // A Scheduler whose settings are refused fails the engine's run.
        match self.scheduler() {
            Ok(Some(scheduler)) => client.with_scheduler(scheduler),
            _ => client,
        }
    }

    /// The engine's completion notices (for waiting on many tasks at once).
    pub fn completions(&self) -> Completions {
        self.completions.clone()
    }

    /// Registers the workflows (so that clients can submit at once).
    pub async fn register_workflows(&self) -> Result<()> {
        for workflow in &self.definitions {
            self.workflows.register(workflow).await?;
        }
        Ok(())
    }

    /// Runs the roles until `shutdown`, then returns once each has let go of
    /// what it held.
    pub async fn run(self, shutdown: Shutdown) -> Result<()> {
        self.config.validate()?;
        self.register_workflows().await?;
        let mut roles: JoinSet<Result<()>> = JoinSet::new();
        let config = &self.config;
        let local_scheduler = self.scheduler()?;
        if let Some(scheduler) = &local_scheduler {
            roles.spawn(scheduler.clone().run(shutdown.clone()));
        }
        if config.roles.supervisor {
            let mut supervisor_config = config.supervisor.clone();
            supervisor_config.seed ^= config.seed;
            let supervisor = Supervisor::new(
                self.store.clone(),
                self.clock.clone(),
                self.workflows.clone(),
                self.completions.clone(),
                supervisor_config,
            )?;
            roles.spawn(supervisor.run(shutdown.clone()));
        }
        if config.roles.agents {
            let breakers = config.agent_breakers.as_ref().map(|breakers| {
                Arc::new(SharedBreakers::new(self.store.clone(), self.clock.clone(), breakers.clone(), config.instance.clone()))
            });
            for agent in &self.agents {
                let worker_config = agent_worker::Config {
                    instance: config.instance.clone(),
                    max_concurrent: config.agent_concurrency,
                    seed: config.seed,
                    shutdown_grace: config.shutdown_grace,
                    stop_check: config.agent_stop_check,
                    queue_rate: config.agent_rates.get(agent.name()).copied(),
                    rate_wait: config.agent_rate_wait,
                    breakers: breakers.clone(),
                };
                let mut worker = AgentWorker::new(self.store.clone(), self.clock.clone(), agent.clone(), worker_config);
                if let Some(scheduler) = &local_scheduler {
                    worker = worker.replying_in_process(scheduler.clone());
                }
                roles.spawn(worker.run(shutdown.clone()));
            }
        }
        let mut first_error = None;
        while let Some(joined) = roles.join_next().await {
            let result = joined.map_err(|e| Error::Config(format!("a role panicked: {e}"))).and_then(|r| r);
            if let Err(err) = result {
                tracing::error!("role stopped: {err}");
                shutdown.trigger();
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_out_of_bounds_are_named() {
        let config = || Config::new(InstanceId::new("i-1").unwrap());
        config().validate().unwrap();
        let refused = |change: fn(&mut Config)| {
            let mut config = config();
            change(&mut config);
            match config.validate() {
                Err(Error::OutOfBounds { field, why }) => format!("{field} {why}"),
                other => panic!("expected OutOfBounds, got {other:?}"),
            }
        };
        assert_eq!(
            refused(|c| c.supervisor.interval = Duration::from_millis(5)),
            "supervisor.interval must be between 10ms and 1h, got 5ms"
        );
        assert_eq!(
            refused(|c| c.supervisor = c.supervisor.clone().every(Duration::from_secs(7200))),
            "supervisor.interval must be between 10ms and 1h, got 2h"
        );
        assert_eq!(
            refused(|c| c.supervisor.leader_ttl = Duration::from_millis(500)),
            "supervisor.leader_ttl must be longer than the interval (1s), got 500ms"
        );
        assert_eq!(refused(|c| c.supervisor.batch = 0), "supervisor.batch must be at least 1, got 0");
        assert_eq!(refused(|c| c.shutdown_grace = Duration::from_secs(7200)), "shutdown_grace must be at most 1h, got 2h");
        assert_eq!(refused(|c| c.scheduler.for_each_items_max = 0), "for_each_items_max must be between 1 and 100000, got 0");
        assert_eq!(refused(|c| c.agent_concurrency = 0), "agent_concurrency must be between 1 and 1024, got 0");
        assert_eq!(refused(|c| c.agent_stop_check = Duration::from_millis(5)), "agent_stop_check must be between 10ms and 1m, got 5ms");
        assert_eq!(refused(|c| c.agent_rate_wait = Duration::from_secs(61)), "agent_rate_wait must be at most 1m, got 1m 1s");
        assert_eq!(refused(|c| c.input_bytes_max = 0), "input_bytes_max must be between 1 and 262144, got 0");
        let every = config().supervisor.every(Duration::from_millis(200));
        assert_eq!((every.interval, every.leader_ttl), (Duration::from_millis(200), Duration::from_secs(1)));
    }
}
