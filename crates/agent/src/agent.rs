//! The [`Agent`] trait that every agent implements, built in or custom, and
//! the [`AgentRegistry`] that names them.
//!
//! Deliberately left out: which queue an agent consumes and how many calls
//! run at once. The engine binds a registered agent to its queue.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use rota_model::Clock;

use crate::breaker::{BreakerSnapshot, Health};
use crate::{DelayAgent, ExecAgent, ExecConfig, HttpAgent, HttpConfig, Request, Result, StepError};

/// A named handler that performs one call to a remote service or resource.
///
/// `call` makes one try. It classifies its own failures as
/// [`StepError::Retryable`] or [`StepError::Permanent`]; retries, backoff and
/// the complete-by deadline are applied around it by
/// [`run_until_deadline`](crate::run_until_deadline), which also cancels the
/// call (drops its future) when the deadline passes, so a `call` must be
/// cancel-safe: it may be stopped at any `.await`.
///
/// Calls can repeat (a retry, or the Supervisor re-sending the step), so the
/// effect must be idempotent: pass `request.idempotency_key` on to the
/// remote side.
///
/// ```
/// use async_trait::async_trait;
/// use rota_agent::{Agent, AgentRegistry, Request, StepError, StepResultExt};
/// use serde_json::{Value, json};
///
/// /// Checks an order total against a limit.
/// struct Limit {
///     max: u64,
/// }
///
/// #[async_trait]
/// impl Agent for Limit {
///     fn name(&self) -> &str {
///         "limit"
///     }
///
///     async fn call(&self, request: &Request) -> Result<Value, StepError> {
///         let total = request.input["total"].as_u64().ok_or("input.total: expected an integer").permanent()?;
///         if total > self.max {
///             return Err(StepError::permanent(format!("total {total} is above the limit {}", self.max)));
///         }
///         Ok(json!({ "approved": total }))
///     }
/// }
///
/// let mut registry = AgentRegistry::new();
/// registry.register(std::sync::Arc::new(Limit { max: 100 }));
/// assert!(registry.get("limit").is_some());
/// ```
#[async_trait]
pub trait Agent: Send + Sync {
    /// The name workflow steps use to pick this agent (`agent: http`).
    fn name(&self) -> &str;

    /// Performs one try of the request and returns the step's output.
    async fn call(&self, request: &Request) -> Result<serde_json::Value, StepError>;

    /// One try, as [`Agent::call`], made without the agent's own circuit
    /// breaker (the caller keeps a breaker for the target, shared through
    /// the store, and must not have calls refused twice), with what the try
    /// says about the target's health. The default, for agents without
    /// breakers: `call`, health unknown.
    async fn call_unguarded(&self, request: &Request) -> (Result<serde_json::Value, StepError>, Health) {
        (self.call(request).await, Health::Unknown)
    }

    /// What a call of `request` reaches, as rate limits name it: for
    /// `http`, the endpoint `scheme://host:port`. `None` (the default):
    /// nothing narrower than the agent.
    fn target(&self, _request: &Request) -> Option<String> {
        None
    }

    /// The circuit breakers this agent keeps, for `rota status` and stats.
    /// Agents without breakers keep the default: none.
    fn breakers(&self) -> Vec<BreakerSnapshot> {
        Vec::new()
    }
}

/// Agents by name. The engine looks a step's agent up here.
#[derive(Clone, Default)]
pub struct AgentRegistry {
    agents: BTreeMap<String, Arc<dyn Agent>>,
}

impl AgentRegistry {
    /// A registry with no agents.
    pub fn new() -> Self {
        AgentRegistry::default()
    }

    /// A registry holding the built-in agents `http`, `exec` and `delay`,
    /// with their default configurations. `clock` drives the deadlines and
    /// the HTTP circuit breakers.
    pub fn builtin(clock: Arc<dyn Clock>) -> Result<Self> {
        AgentRegistry::builtin_with(HttpConfig::default(), ExecConfig::default(), clock)
    }

    /// A registry holding the built-in agents, `http` with `http` and
    /// `exec` with `exec`; refused with a message naming the field when one
    /// is out of bounds.
    pub fn builtin_with(http: HttpConfig, exec: ExecConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        let mut registry = AgentRegistry::new();
        registry.register(Arc::new(HttpAgent::with_config(http, clock.clone())?));
        registry.register(Arc::new(ExecAgent::with_config(exec, clock)?));
        registry.register(Arc::new(DelayAgent::new()));
        Ok(registry)
    }

    /// Adds `agent` under its [`Agent::name`], returning the agent it
    /// replaces, if any. Registering a custom `http` replaces the built-in.
    pub fn register(&mut self, agent: Arc<dyn Agent>) -> Option<Arc<dyn Agent>> {
        self.agents.insert(agent.name().to_owned(), agent)
    }

    /// The agent called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Agent>> {
        self.agents.get(name).cloned()
    }

    /// Whether an agent called `name` is registered (for validating
    /// workflow files).
    pub fn contains(&self, name: &str) -> bool {
        self.agents.contains_key(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }

    /// Every agent's circuit breakers, as `(agent name, breaker)`.
    pub fn breakers(&self) -> Vec<(String, BreakerSnapshot)> {
        self.agents.iter().flat_map(|(name, agent)| agent.breakers().into_iter().map(move |b| (name.clone(), b))).collect()
    }
}

impl std::fmt::Debug for AgentRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRegistry").field("agents", &self.agents.keys().collect::<Vec<_>>()).finish()
    }
}
