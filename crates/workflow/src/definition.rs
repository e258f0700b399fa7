//! The resolved definition: what a validated workflow is made of.
//!
//! A [`Workflow`] only exists validated: its fields are private, and every
//! way to get one (parsing, the builder, deserializing stored JSON) runs the
//! same checks in `validate`, the one module that builds one. So the DAG
//! helpers can rely on the graph being acyclic and every `depends_on`
//! naming a step. Deliberately left out: how a definition is written
//! (`spec`, `parse`, `builder`) and stored (`stored`).

use std::time::Duration;

use rota_model::{
    CONCURRENCY_KEY_BYTES_MAX, CatchUp, ConcurrencyKey, ExhaustedPolicy, MAX_IN_FLIGHT_KEY, Overlap, Priority, RateLimit, RetryPolicy,
    ScheduleName, SignalName, StepName, WorkflowName,
};
use serde_json::Value;

use crate::agent::AgentName;
use crate::condition::Condition;

/// The task-level complete-by when a definition gives no `deadline`.
pub const DEADLINE_DEFAULT: Duration = Duration::from_secs(5 * 60);
/// A step's complete-by when it gives no `timeout`, counted from when its
/// request is sent.
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// The Supervisor's `failure_count` threshold when a definition gives no
/// `max_failures`.
pub const MAX_FAILURES_DEFAULT: u32 = 3;
/// The most steps one workflow may have. The Scheduler scans a task's steps
/// on every reply, so the bound keeps that scan cheap.
pub const STEPS_MAX: usize = 1_000;

/// How many instances of a `for_each` step may be in flight at once when
/// it gives no `max_parallel`.
pub const MAX_PARALLEL_DEFAULT: u32 = 10;

/// A validated, resolved workflow definition: one version of one workflow.
///
/// "Resolved" means every default is filled in and every step's
/// `depends_on` is explicit (a step written without one depends on the step
/// before it). Two definitions that mean the same are equal, whichever way
/// they were written.
///
/// It serializes to its canonical JSON form ([`Workflow::to_json`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Workflow {
    pub(crate) name: WorkflowName,
    pub(crate) version: u32,
    pub(crate) deadline: Duration,
    pub(crate) warn_after: Option<Duration>,
    pub(crate) retention: Option<Duration>,
    pub(crate) on_exhausted: ExhaustedPolicy,
    pub(crate) max_failures: u32,
    /// The priority of its tasks when their submission gives none.
    pub(crate) priority: Priority,
    /// `concurrency:`, the key of its tasks and its limit.
    pub(crate) concurrency: Option<Concurrency>,
    /// `max_in_flight:`, at most this many of its tasks started and unfinished.
    pub(crate) max_in_flight: Option<u32>,
    pub(crate) steps: Vec<StepDef>,
    /// Step indices in topological order, ties broken by definition order.
    /// Derived from `steps` when the workflow is validated.
    pub(crate) order: Vec<usize>,
    /// The schedules its file declares. Not part of the version: the
    /// canonical stored form leaves them out, so a version registered from
    /// a file reads back without them.
    pub(crate) schedules: Vec<ScheduleDef>,
}

/// A schedule declared under `schedules:` in a workflow file: it starts
/// the file's workflow (its latest version at each fire). Validated: the
/// cron expression and the time zone parse.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleDef {
    /// Its name.
    pub name: ScheduleName,
    /// The cron expression (five fields, or six with seconds).
    pub cron: String,
    /// The IANA time zone; `UTC` when the file gives none.
    pub timezone: String,
    /// The input of every task it starts; `{}` when the file gives none.
    pub input: Value,
    /// The overlap policy; `skip` when the file gives none.
    pub overlap: Overlap,
    /// The catch-up policy; `latest` when the file gives none.
    pub catch_up: CatchUp,
}

/// The most schedules one workflow file may declare.
pub const SCHEDULES_MAX: usize = 100;

/// One step of a resolved [`Workflow`].
#[derive(Debug, Clone, PartialEq)]
pub struct StepDef {
    pub(crate) name: StepName,
    pub(crate) action: StepAction,
    pub(crate) callback: bool,
    pub(crate) with: Value,
    pub(crate) timeout: Duration,
    pub(crate) warn_after: Option<Duration>,
    pub(crate) when: Option<Condition>,
    pub(crate) for_each: Option<ForEach>,
    pub(crate) retry: RetryPolicy,
    pub(crate) rate_limit: Option<RateLimit>,
    pub(crate) compensate: Option<CompensateDef>,
    pub(crate) depends_on: Vec<StepName>,
}

/// A step's `for_each`: the step runs once per item of a list, each
/// instance (`NAME[i]`, see [`StepName::instance`]) with its own attempts,
/// timeout, retries and compensation, and `{{ item }}` and `{{ index }}`
/// in its templates. The step's output is the list of the instances'
/// outputs, in item order.
#[derive(Debug, Clone, PartialEq)]
pub struct ForEach {
    pub(crate) items: Condition,
    pub(crate) max_parallel: u32,
}

impl ForEach {
    /// The expression giving the items: CEL over `input` and the upstream
    /// steps' outputs, like a `when`, evaluated once as the step becomes
    /// ready ([`Condition::evaluate_list`]).
    pub fn items(&self) -> &Condition {
        &self.items
    }

    /// How many instances may be in flight at once, at least 1.
    pub fn max_parallel(&self) -> u32 {
        self.max_parallel
    }
}

/// A workflow's `concurrency: { key, limit }`: at most `limit` of its tasks
/// with the same key started and unfinished at once.
#[derive(Debug, Clone, PartialEq)]
pub struct Concurrency {
    pub(crate) key: Condition,
    pub(crate) limit: u32,
}

impl Concurrency {
    /// The key expression: CEL over `input` alone, evaluated at submission
    /// to a string or an integer.
    pub fn key(&self) -> &Condition {
        &self.key
    }

    /// How many tasks of one key may hold a slot at once.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The name a key is shown with: `customer` for `input.customer`, the
    /// expression itself otherwise.
    pub fn name(&self) -> &str {
        let source = self.key.source().trim();
        match source.strip_prefix("input.") {
            Some(path) if !path.is_empty() && path.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') => path,
            _ => source,
        }
    }
}

/// What a step does when it starts.
#[derive(Debug, Clone, PartialEq)]
pub enum StepAction {
    /// Sends a request to this agent and completes with its reply.
    Call(AgentName),
    /// Waits for a signal of this name sent to the task (by an operator, a
    /// person's approval, a provider's webhook); completes with its payload.
    /// It sends nothing and has nothing to undo, and its `timeout` is how
    /// long it waits.
    Wait(SignalName),
    /// Starts a task of another workflow (a child) and completes with its
    /// output; the child's failure fails the step. Its `with` is the child's
    /// input and its `timeout` how long the step waits for the child.
    Child(ChildWorkflow),
}

/// The workflow a `workflow:` step starts, and the version it pins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildWorkflow {
    pub(crate) name: WorkflowName,
    pub(crate) version: Option<u32>,
}

impl ChildWorkflow {
    /// The child's workflow.
    pub fn name(&self) -> &WorkflowName {
        &self.name
    }

    /// The version pinned (`version:`); `None` runs the latest registered
    /// when the child starts.
    pub fn version(&self) -> Option<u32> {
        self.version
    }
}

/// The step that undoes a completed step (its part of the compensating
/// transaction).
#[derive(Debug, Clone, PartialEq)]
pub struct CompensateDef {
    pub(crate) agent: AgentName,
    pub(crate) with: Value,
    pub(crate) timeout: Duration,
    pub(crate) retry: RetryPolicy,
}

impl Workflow {
    /// The schedules its file declares (none for a workflow built in Rust
    /// or read back from the registry).
    pub fn schedules(&self) -> &[ScheduleDef] {
        &self.schedules
    }

    /// The workflow's name.
    pub fn name(&self) -> &WorkflowName {
        &self.name
    }

    /// The definition's version, at least 1. A running task keeps the
    /// version it started with.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The task-level complete-by, counted from when the task is claimed.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// When a claimed task is at risk: counted from the claim like the
    /// [`Workflow::deadline`], and shorter than it. Once a lease passes it
    /// the Supervisor raises an `at_risk` event and an alert, once per lease.
    pub fn warn_after(&self) -> Option<Duration> {
        self.warn_after
    }

    /// How long its finished tasks are kept, counted from when they
    /// finished, before the Supervisor leader deletes them with their
    /// steps and history; `None` follows the store's default retention.
    /// The latest version's value applies to the tasks of every version.
    pub fn retention(&self) -> Option<Duration> {
        self.retention
    }

    /// What the Supervisor asks for when `failure_count` reaches
    /// [`Workflow::max_failures`].
    pub fn on_exhausted(&self) -> ExhaustedPolicy {
        self.on_exhausted
    }

    /// The Supervisor's `failure_count` threshold, at least 1.
    pub fn max_failures(&self) -> u32 {
        self.max_failures
    }

    /// The priority of its tasks whose submission gives none (`priority:`,
    /// 0 by default): claims take higher priorities first.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// `concurrency:`, if given.
    pub fn concurrency(&self) -> Option<&Concurrency> {
        self.concurrency.as_ref()
    }

    /// `max_in_flight:`, if given.
    pub fn max_in_flight(&self) -> Option<u32> {
        self.max_in_flight
    }

    /// The concurrency key of a task of this workflow with `input`:
    /// `NAME=VALUE` from `concurrency:`, the one key of `max_in_flight:`,
    /// or none. The error says, in words, why the key could not be
    /// computed (the submission is refused).
    pub fn concurrency_key(&self, input: &Value) -> Result<Option<ConcurrencyKey>, String> {
        if let Some(limit) = self.max_in_flight {
            return Ok(Some(ConcurrencyKey { key: MAX_IN_FLIGHT_KEY.to_owned(), limit }));
        }
        let Some(concurrency) = &self.concurrency else { return Ok(None) };
        let value = concurrency.key.evaluate_key(input)?;
        let key = format!("{}={value}", concurrency.name());
        if key.len() > CONCURRENCY_KEY_BYTES_MAX {
            return Err(format!("the key `{}` is {} bytes, more than {CONCURRENCY_KEY_BYTES_MAX}", key.escape_debug(), key.len()));
        }
        Ok(Some(ConcurrencyKey { key, limit: concurrency.limit }))
    }

    /// The steps, in definition order.
    pub fn steps(&self) -> &[StepDef] {
        &self.steps
    }

    /// The step that waits for `signal`, if any (validation allows at most
    /// one per signal name, so a signal always has one destination).
    pub fn step_waiting_for(&self, signal: &SignalName) -> Option<&StepDef> {
        self.steps.iter().find(|step| step.waits_for() == Some(signal))
    }
}

impl StepDef {
    /// The step's name, unique within its workflow.
    pub fn name(&self) -> &StepName {
        &self.name
    }

    /// What the step does: call an agent or wait for a signal.
    pub fn action(&self) -> &StepAction {
        &self.action
    }

    /// The agent that runs the step; `None` for a step that waits.
    pub fn agent(&self) -> Option<&AgentName> {
        match &self.action {
            StepAction::Call(agent) => Some(agent),
            StepAction::Wait(_) | StepAction::Child(_) => None,
        }
    }

    /// The child workflow the step runs, if it is a `workflow:` step.
    pub fn child(&self) -> Option<&ChildWorkflow> {
        match &self.action {
            StepAction::Child(child) => Some(child),
            StepAction::Call(_) | StepAction::Wait(_) => None,
        }
    }

    /// The signal the step waits for; `None` for a step that calls an agent.
    pub fn waits_for(&self) -> Option<&SignalName> {
        match &self.action {
            StepAction::Wait(signal) => Some(signal),
            StepAction::Call(_) | StepAction::Child(_) => None,
        }
    }

    /// Whether the step completes by a callback: its agent's reply only
    /// says that the request was accepted, and the remote service completes
    /// the step later with the attempt's callback token (`{{ callback.token }}`
    /// in the input template, and the `Rota-Callback-Token` header of an
    /// `http` request), within the step's timeout.
    pub fn completes_by_callback(&self) -> bool {
        self.callback
    }

    /// The input template, rendered with [`crate::render`] when the step's
    /// request is sent. `null` when the definition gives none.
    pub fn with(&self) -> &Value {
        &self.with
    }

    /// The step's complete-by, counted from when its request is sent (for
    /// a step that waits, from when it starts waiting).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// When an attempt is at risk: counted from when its request is sent
    /// like the [`StepDef::timeout`], and shorter than it. Once an attempt
    /// passes it the Supervisor raises an `at_risk` event and an alert, once
    /// per attempt. Compensations have none.
    pub fn warn_after(&self) -> Option<Duration> {
        self.warn_after
    }

    /// The rate limit of the step's calls (and its compensation's), if
    /// any: shared by every process calling the same target (an `http`
    /// step's `scheme://host:port`; for an agent without one, the agent).
    /// A call waiting for its slot is held without spending its retries,
    /// and its complete-by moves by the time held.
    pub fn rate_limit(&self) -> Option<&RateLimit> {
        self.rate_limit.as_ref()
    }

    /// The step's condition, if any: decided once, when the step becomes
    /// ready (every dependency completed or skipped) and before its first
    /// attempt. False skips the step; an expression that cannot be decided
    /// fails it permanently.
    pub fn when(&self) -> Option<&Condition> {
        self.when.as_ref()
    }

    /// The step's `for_each`, if it runs once per item of a list.
    pub fn for_each(&self) -> Option<&ForEach> {
        self.for_each.as_ref()
    }

    /// How often the step is tried and how long to wait between tries.
    pub fn retry(&self) -> &RetryPolicy {
        &self.retry
    }

    /// The step that undoes this one, if any.
    pub fn compensate(&self) -> Option<&CompensateDef> {
        self.compensate.as_ref()
    }

    /// The steps that must complete (or be skipped) before this one starts, resolved: a
    /// step written without `depends_on` depends on the step before it, and
    /// the first step on none.
    pub fn depends_on(&self) -> &[StepName] {
        &self.depends_on
    }
}

impl CompensateDef {
    /// The agent that runs the compensation.
    pub fn agent(&self) -> &AgentName {
        &self.agent
    }

    /// The input template. It may refer to the compensated step's own output
    /// as well as to its upstream steps' outputs.
    pub fn with(&self) -> &Value {
        &self.with
    }

    /// The compensation's complete-by. Defaults to the step's own timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The compensation's retry policy. Defaults to the step's own policy.
    pub fn retry(&self) -> &RetryPolicy {
        &self.retry
    }
}
