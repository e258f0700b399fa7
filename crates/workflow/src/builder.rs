//! The Rust builder: a [`Spec`] filled in by method calls, validated by the
//! same function as a file, so that a built workflow equals the same
//! workflow written in YAML.

use std::time::Duration;

use rota_model::{ExhaustedPolicy, RetryPolicy};
use serde_json::Value;

use crate::agent::AgentCatalog;
use crate::definition::{CompensateDef, StepDef, Workflow};
use crate::diagnostic::{Diagnostics, TextlessLocator};
use crate::spec::{CompensateSpec, Spec, StepSpec};

/// Builds a [`Workflow`] in Rust; see [`Workflow::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct WorkflowBuilder {
    spec: Spec,
}

/// One step for [`WorkflowBuilder::step`]; see [`StepDef::new`].
#[derive(Debug, Clone)]
#[must_use = "a step builder does nothing until passed to `WorkflowBuilder::step`"]
pub struct StepBuilder {
    spec: StepSpec,
}

/// A compensation for [`StepBuilder::compensate`]; see [`CompensateDef::new`].
#[derive(Debug, Clone)]
#[must_use = "a compensation builder does nothing until passed to `StepBuilder::compensate`"]
pub struct CompensateBuilder {
    spec: CompensateSpec,
}

impl Workflow {
    /// Starts a definition in Rust, equivalent to a YAML file with the same
    /// fields. Unset fields take the same defaults as in a file.
    ///
    /// ```
    /// use std::time::Duration;
    /// use rota_model::ExhaustedPolicy;
    /// use rota_workflow::{AgentCatalog, CompensateDef, StepDef, Workflow};
    /// use serde_json::json;
    ///
    /// let workflow = Workflow::builder("order", 3)
    ///     .deadline(Duration::from_secs(120))
    ///     .on_exhausted(ExhaustedPolicy::Compensate)
    ///     .step(
    ///         StepDef::new("reserve", "http")
    ///             .with_input(json!({ "order": "{{ input.order_id }}" }))
    ///             .timeout(Duration::from_secs(5))
    ///             .compensate(CompensateDef::new("http").with_input(json!({ "order": "{{ input.order_id }}" }))),
    ///     )
    ///     .step(StepDef::new("charge", "http").depends_on(["reserve"]))
    ///     .build(&AgentCatalog::builtin())?;
    /// assert_eq!(workflow.steps()[1].depends_on()[0].as_str(), "reserve");
    /// # Ok::<(), rota_workflow::Diagnostics>(())
    /// ```
    pub fn builder(name: impl Into<String>, version: u32) -> WorkflowBuilder {
        WorkflowBuilder { spec: Spec { name: Some(name.into()), version: Some(version), steps: Some(Vec::new()), ..Spec::default() } }
    }
}

impl WorkflowBuilder {
    /// The task-level complete-by (default 5 minutes).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.spec.deadline = Some(deadline);
        self
    }

    /// When a claimed task is at risk, counted from the claim (default:
    /// never); shorter than the deadline.
    pub fn warn_after(mut self, warn_after: Duration) -> Self {
        self.spec.warn_after = Some(warn_after);
        self
    }

    /// How long finished tasks are kept before the Supervisor leader
    /// deletes them (default: the store's retention).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.spec.retention = Some(retention);
        self
    }

    /// What the Supervisor asks for at the failure threshold (default
    /// [`ExhaustedPolicy::Error`]).
    pub fn on_exhausted(mut self, policy: ExhaustedPolicy) -> Self {
        self.spec.on_exhausted = Some(policy);
        self
    }

    /// The Supervisor's `failure_count` threshold (default 3).
    pub fn max_failures(mut self, max_failures: u32) -> Self {
        self.spec.max_failures = Some(max_failures);
        self
    }

    /// The priority of its tasks whose submission gives none (default 0);
    /// checked against the bounds by `build`.
    pub fn priority(mut self, priority: i64) -> Self {
        self.spec.priority = Some(priority);
        self
    }

    /// At most `limit` of its tasks with the same key (a CEL expression
    /// over `input`, evaluated at submission) started and unfinished at
    /// once; checked by `build`.
    pub fn concurrency(mut self, key: &str, limit: u32) -> Self {
        self.spec.concurrency = Some(crate::spec::ConcurrencySpec { key: Some(key.to_owned()), limit: Some(limit) });
        self
    }

    /// At most `limit` of its tasks started and unfinished at once; checked
    /// by `build`.
    pub fn max_in_flight(mut self, limit: u32) -> Self {
        self.spec.max_in_flight = Some(limit);
        self
    }

    /// Appends a step.
    pub fn step(mut self, step: StepBuilder) -> Self {
        self.spec.steps.get_or_insert_with(Vec::new).push(step.spec);
        self
    }

    /// Validates the definition exactly as [`crate::parse`] validates a file.
    /// Diagnostics name the file `<builder>`; a problem in step N (0-based)
    /// is at line N + 1, column 0, and one of the workflow itself at 0:0.
    pub fn build(self, agents: &AgentCatalog) -> Result<Workflow, Diagnostics> {
        crate::validate::validate(self.spec, &TextlessLocator { file: "<builder>" }, Some(agents))
    }
}

impl StepDef {
    /// Starts a step named `name` run by `agent`. Names are checked by
    /// [`WorkflowBuilder::build`], which reports a bad one as a diagnostic.
    #[allow(clippy::new_ret_no_self)] // Reads as the definition it builds: `.step(StepDef::new(..))`.
    pub fn new(name: impl Into<String>, agent: impl Into<String>) -> StepBuilder {
        StepBuilder { spec: StepSpec { name: Some(name.into()), agent: Some(agent.into()), ..StepSpec::default() } }
    }

    /// Starts a step named `name` that waits for the signal `signal`; it
    /// needs a [`StepBuilder::timeout`], how long it waits.
    pub fn wait(name: impl Into<String>, signal: impl Into<String>) -> StepBuilder {
        StepBuilder { spec: StepSpec { name: Some(name.into()), wait: Some(signal.into()), ..StepSpec::default() } }
    }

    /// Starts a step named `name` that runs a task of `workflow` (a child
    /// workflow: `version` pins one, `None` the latest when the child
    /// starts) and completes with its output; it needs a
    /// [`StepBuilder::timeout`], how long it waits for the child.
    pub fn run_workflow(name: impl Into<String>, workflow: impl Into<String>, version: Option<u32>) -> StepBuilder {
        StepBuilder {
            spec: StepSpec { name: Some(name.into()), workflow: Some(workflow.into()), workflow_version: version, ..StepSpec::default() },
        }
    }
}

impl StepBuilder {
    /// The input template (default `null`).
    pub fn with_input(mut self, template: Value) -> Self {
        self.spec.with = template;
        self
    }

    /// The step's complete-by, from when its request is sent (default 30 s);
    /// for a step that waits, how long it waits (required).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.spec.timeout = Some(timeout);
        self
    }

    /// When an attempt is at risk, counted from when its request is sent
    /// (default: never); shorter than the timeout.
    pub fn warn_after(mut self, warn_after: Duration) -> Self {
        self.spec.warn_after = Some(warn_after);
        self
    }

    /// Limits how often the step's calls start, across every process
    /// sharing the store; see [`crate::StepDef::rate_limit`].
    pub fn rate_limit(mut self, limit: rota_model::RateLimit) -> Self {
        self.spec.rate_limit = Some(limit);
        self
    }

    /// The step's condition, a CEL expression over `input` and `steps`
    /// (see [`crate::Condition`]); false skips the step. Checked by
    /// [`WorkflowBuilder::build`].
    pub fn when(mut self, condition: impl Into<String>) -> Self {
        self.spec.when = Some(condition.into());
        self
    }

    /// Runs the step once per item of the list `items` gives, a CEL
    /// expression over `input` and `steps` (see [`crate::ForEach`]).
    pub fn for_each(mut self, items: impl Into<String>) -> Self {
        self.spec.for_each = Some(items.into());
        self
    }

    /// How many instances of a `for_each` step may be in flight at once
    /// (default [`crate::MAX_PARALLEL_DEFAULT`]).
    pub fn max_parallel(mut self, max_parallel: u32) -> Self {
        self.spec.max_parallel = Some(max_parallel);
        self
    }

    /// Makes the step complete by a callback rather than by its agent's
    /// reply; see [`crate::StepDef::completes_by_callback`].
    pub fn callback(mut self) -> Self {
        self.spec.callback = Some(true);
        self
    }

    /// The retry policy (default [`RetryPolicy::default`]).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.spec.retry = Some(retry);
        self
    }

    /// The step that undoes this one once it has completed.
    pub fn compensate(mut self, compensate: CompensateBuilder) -> Self {
        self.spec.compensate = Some(compensate.spec);
        self
    }

    /// The steps that must complete first. Without this call the step
    /// depends on the step added before it; with an empty list it starts
    /// with the task.
    pub fn depends_on<S: Into<String>>(mut self, steps: impl IntoIterator<Item = S>) -> Self {
        self.spec.depends_on = Some(steps.into_iter().map(Into::into).collect());
        self
    }
}

impl CompensateDef {
    /// Starts a compensation run by `agent`. Its timeout and retry policy
    /// default to those of the step it undoes.
    #[allow(clippy::new_ret_no_self)] // Mirrors `StepDef::new`.
    pub fn new(agent: impl Into<String>) -> CompensateBuilder {
        CompensateBuilder { spec: CompensateSpec { agent: Some(agent.into()), ..CompensateSpec::default() } }
    }
}

impl CompensateBuilder {
    /// The input template (default `null`).
    pub fn with_input(mut self, template: Value) -> Self {
        self.spec.with = template;
        self
    }

    /// The compensation's complete-by (default: the step's timeout).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.spec.timeout = Some(timeout);
        self
    }

    /// The compensation's retry policy (default: the step's policy).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.spec.retry = Some(retry);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(builder: WorkflowBuilder) -> Result<Workflow, Vec<String>> {
        builder.build(&AgentCatalog::builtin()).map_err(|problems| problems.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn builder_and_yaml_resolve_to_the_same_workflow() {
        let yaml = "name: order\nversion: 3\ndeadline: 2m\non_exhausted: compensate\nsteps:\n\
            \x20 - name: reserve\n    agent: http\n    with: { order: \"{{ input.order_id }}\" }\n    timeout: 5s\n\
            \x20   retry: { attempts: 5, backoff: 100ms, max_backoff: 2s }\n\
            \x20   compensate: { agent: http, with: { order: \"{{ input.order_id }}\" } }\n\
            \x20 - name: charge\n    agent: http\n    with: { hold: \"{{ steps.reserve.output.hold_id }}\" }\n\
            \x20 - name: ship\n    agent: exec\n    depends_on: [reserve]\n\
            \x20 - name: notify\n    agent: delay\n    depends_on: [charge, ship]\n    compensate: { agent: delay, timeout: 1s }\n";
        let parsed = crate::parse("order.yaml", yaml, &AgentCatalog::builtin()).unwrap();
        let retry = RetryPolicy::new(5, Duration::from_millis(100), Duration::from_secs(2)).unwrap();
        let built = check(
            Workflow::builder("order", 3)
                .deadline(Duration::from_secs(120))
                .on_exhausted(ExhaustedPolicy::Compensate)
                .step(
                    StepDef::new("reserve", "http")
                        .with_input(json!({ "order": "{{ input.order_id }}" }))
                        .timeout(Duration::from_secs(5))
                        .retry(retry)
                        .compensate(CompensateDef::new("http").with_input(json!({ "order": "{{ input.order_id }}" }))),
                )
                .step(StepDef::new("charge", "http").with_input(json!({ "hold": "{{ steps.reserve.output.hold_id }}" })))
                .step(StepDef::new("ship", "exec").depends_on(["reserve"]))
                .step(
                    StepDef::new("notify", "delay")
                        .depends_on(["charge", "ship"])
                        .compensate(CompensateDef::new("delay").timeout(Duration::from_secs(1))),
                ),
        )
        .unwrap();
        assert_eq!(built, parsed);
        let deps: Vec<Vec<&str>> = built.steps().iter().map(|s| s.depends_on().iter().map(|d| d.as_str()).collect()).collect();
        assert_eq!(deps, [vec![], vec!["reserve"], vec!["reserve"], vec!["charge", "ship"]]);
    }

    #[test]
    fn builder_warnings_are_checked_like_a_file() {
        let built = Workflow::builder("w", 1)
            .deadline(Duration::from_secs(60))
            .warn_after(Duration::from_secs(50))
            .step(StepDef::new("a", "http").timeout(Duration::from_secs(10)).warn_after(Duration::from_secs(9)))
            .build(&AgentCatalog::builtin())
            .unwrap();
        let parsed = crate::parse(
            "w.yaml",
            "name: w\nversion: 1\ndeadline: 1m\nwarn_after: 50s\nsteps:\n  - name: a\n    agent: http\n    timeout: 10s\n    warn_after: 9s\n",
            &AgentCatalog::builtin(),
        )
        .unwrap();
        assert_eq!(built, parsed);
        let problems = check(
            Workflow::builder("w", 1)
                .warn_after(Duration::from_secs(600))
                .step(StepDef::new("a", "http").timeout(Duration::from_secs(10)).warn_after(Duration::from_secs(10))),
        )
        .unwrap_err();
        assert_eq!(
            problems,
            [
                "<builder>:0:0: `warn_after` (10m) must be shorter than `deadline` (5m): the warning must come while there is still time to act",
                "<builder>:1:0: step `a`: `warn_after` (10s) must be shorter than `timeout` (10s): the warning must come while there is still time to act",
            ]
        );
    }

    #[test]
    fn builder_conditions_are_checked_like_a_file() {
        let built = Workflow::builder("w", 1)
            .step(StepDef::new("a", "http"))
            .step(StepDef::new("b", "http").when("steps.a.output.ok"))
            .build(&AgentCatalog::builtin())
            .unwrap();
        let parsed = crate::parse(
            "w.yaml",
            "name: w\nversion: 1\nsteps:\n  - { name: a, agent: http }\n  - { name: b, agent: http, when: steps.a.output.ok }\n",
            &AgentCatalog::builtin(),
        )
        .unwrap();
        assert_eq!(built, parsed);
        assert_eq!(built.steps()[1].when().map(crate::Condition::source), Some("steps.a.output.ok"));
        let when = "steps.a.output.ok || 'x\\ny' in steps";
        let problems = check(Workflow::builder("w", 1).step(StepDef::new("a", "http").when(when))).unwrap_err();
        assert_eq!(
            problems,
            [
                "<builder>:1:0: step `a`: `when` refers to step `a`, which is not upstream (add it to `depends_on`)",
                // A name holding a newline is escaped: one problem per line.
                "<builder>:1:0: step `a`: `when` refers to unknown step `x\\ny`",
            ]
        );
    }

    #[test]
    fn builder_problems_name_the_step_by_number() {
        let zero = RetryPolicy::new(1, Duration::from_nanos(10), Duration::from_secs(1)).unwrap();
        let problems = check(
            Workflow::builder("bad name", 0)
                .max_failures(0)
                .step(StepDef::new("a", "htp").timeout(Duration::ZERO).retry(zero))
                .step(StepDef::new("b", "http").depends_on(["a", "zz"]).with_input(json!(["{{ steps.c.output }}"])))
                .step(StepDef::new("c", "http").depends_on(["c"]).compensate(CompensateDef::new("nope"))),
        )
        .unwrap_err();
        assert_eq!(
            problems,
            [
                "<builder>:0:0: invalid workflow name \"bad name\": may only contain ASCII letters, digits, '-', '_', '.' and ':'",
                "<builder>:0:0: `version` must be at least 1",
                "<builder>:0:0: `max_failures` must be at least 1",
                "<builder>:1:0: step `a`: unknown agent `htp` (known agents: delay, exec, http)",
                "<builder>:1:0: step `a`: `timeout` must be longer than 0",
                "<builder>:1:0: step `a`: `retry.backoff` must be a whole number of milliseconds, got 10ns",
                "<builder>:2:0: step `b`: depends on unknown step `zz`",
                "<builder>:2:0: step `b`: template `{{ steps.c.output }}` refers to step `c`, which is not upstream (add it to `depends_on`)",
                "<builder>:3:0: step `c`: unknown agent `nope` (known agents: delay, exec, http)",
                "<builder>:3:0: dependency cycle: `c` depends on `c`",
            ]
        );
        assert_eq!(check(Workflow::builder("w", 1)).unwrap_err(), ["<builder>:0:0: `steps` must list at least one step"]);
    }

    #[test]
    fn custom_agents_are_accepted_once_registered() {
        let builder = Workflow::builder("w", 1).step(StepDef::new("a", "ledger"));
        assert!(builder.clone().build(&AgentCatalog::builtin()).is_err());
        let agents = AgentCatalog::builtin().with(crate::AgentName::new("ledger").unwrap());
        assert_eq!(builder.build(&agents).unwrap().steps()[0].agent().map(crate::AgentName::as_str), Some("ledger"));
    }
}
