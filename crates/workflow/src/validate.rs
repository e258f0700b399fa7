//! Turns a [`Spec`] into a [`Workflow`], reporting every problem.
//!
//! Checks run on whatever the decoder could read, even after it found
//! problems elsewhere, so one pass over a file reports all of them. A
//! workflow is only built when nothing at all was wrong.

use std::collections::HashMap;
use std::time::Duration;

use rota_model::retry::HTTP_STATUS_RANGE;
use rota_model::{
    CONCURRENCY_LIMIT_MAX, CatchUp, Cron, ExhaustedPolicy, FailureClass, Overlap, Priority, RetryPolicy, ScheduleError, ScheduleName,
    SignalName, StepName, WorkflowName,
};
use serde_json::Value;

use crate::agent::{AgentCatalog, AgentName};
use crate::condition::Condition;
use crate::dag;
use crate::definition::{
    ChildWorkflow, CompensateDef, Concurrency, DEADLINE_DEFAULT, ForEach, MAX_FAILURES_DEFAULT, MAX_PARALLEL_DEFAULT, SCHEDULES_MAX,
    STEPS_MAX, ScheduleDef, StepAction, StepDef, TIMEOUT_DEFAULT, Workflow,
};
use crate::diagnostic::{Diagnostic, Diagnostics, Locate};
use crate::spec::{CompensateSpec, ConcurrencySpec, ScheduleSpec, Spec, StepSpec};
use crate::template::{Target, references};

/// Validates `spec`. `agents` is `None` when reading back a stored version,
/// whose agents were checked when it was first loaded.
pub(crate) fn validate(spec: Spec, loc: &dyn Locate, agents: Option<&AgentCatalog>) -> Result<Workflow, Diagnostics> {
    let mut problems = Vec::new();
    match validate_into(spec, loc, agents, &mut problems) {
        Some(workflow) if problems.is_empty() => Ok(workflow),
        _ => Err(Diagnostics::from(problems).sorted()),
    }
}

/// Validates `spec`, adding problems to `problems` (which may already hold
/// the decoder's). Returns a workflow only if `problems` is still empty.
///
/// The sections run in a fixed order, each on whatever the earlier ones
/// could read, and report in that order: diagnostics at the same position
/// keep it.
pub(crate) fn validate_into(
    spec: Spec,
    loc: &dyn Locate,
    agents: Option<&AgentCatalog>,
    problems: &mut Vec<Diagnostic>,
) -> Option<Workflow> {
    let mut check = Check { loc, agents, problems };
    let top = check.workflow_fields(&spec);
    let steps = check.step_list(spec.steps);
    let labels: Vec<String> = steps.iter().enumerate().map(|(i, step)| step_label(&step.name, i)).collect();
    let fields: Vec<StepFields> = steps.iter().enumerate().map(|(i, step)| check.step_fields(i, &labels[i], step, top.deadline)).collect();
    let index = check.unique_names(&steps);
    check.one_step_per_signal(&fields, &labels);
    let graph = check.dependencies(&steps, &index, &labels);
    let order = check.acyclic(&steps, &graph);
    check.templates(&steps, &index, &labels, &graph.deps);
    check.conditions(&fields, &index, &labels, &graph.deps);
    let schedules = check.schedules(spec.schedules.unwrap_or_default());
    if !check.problems.is_empty() {
        return None;
    }
    let mut workflow = assemble(top, steps, fields, &graph.deps, order.expect("validated DAG"));
    workflow.schedules = schedules;
    Some(workflow)
}

/// The workflow's own fields, checked; `None` where a problem was reported
/// (or, for the version, where the decoder reported it missing).
struct WorkflowFields {
    name: Option<WorkflowName>,
    version: Option<u32>,
    deadline: Duration,
    warn_after: Option<Duration>,
    retention: Option<Duration>,
    on_exhausted: ExhaustedPolicy,
    max_failures: u32,
    priority: Priority,
    concurrency: Option<Concurrency>,
    max_in_flight: Option<u32>,
}

/// One step's own fields, checked; `None` where a problem was reported.
struct StepFields {
    name: Option<StepName>,
    action: Option<StepAction>,
    callback: bool,
    timeout: Duration,
    warn_after: Option<Duration>,
    /// `None` also where a problem was reported.
    when: Option<Condition>,
    /// `None` also where a problem was reported.
    for_each: Option<ForEach>,
    retry: RetryPolicy,
    compensate: Option<Option<CompensateDef>>,
}

/// The resolved dependencies: `deps[i]` lists the steps step `i` depends
/// on, and `pointers[i][k]` is where its `k`th one is written, for a
/// cycle's diagnostic.
struct Graph {
    deps: Vec<Vec<usize>>,
    pointers: Vec<Vec<String>>,
}

/// The checks of one definition, reporting where it was written.
struct Check<'a> {
    loc: &'a dyn Locate,
    agents: Option<&'a AgentCatalog>,
    problems: &'a mut Vec<Diagnostic>,
}

impl Check<'_> {
    fn report(&mut self, pointer: &str, message: String) {
        self.problems.push(self.loc.at_value(pointer, message));
    }

    /// The declared schedules: at most [`SCHEDULES_MAX`], names valid and
    /// unique, cron expressions, time zones and policies that parse.
    fn schedules(&mut self, specs: Vec<ScheduleSpec>) -> Vec<ScheduleDef> {
        if specs.len() > SCHEDULES_MAX {
            self.report(
                "/schedules",
                format!("a workflow file may declare at most {SCHEDULES_MAX} schedules, this one has {}", specs.len()),
            );
        }
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut defs = Vec::new();
        for (i, spec) in specs.into_iter().enumerate() {
            let at = format!("/schedules/{i}");
            let label =
                spec.name.as_deref().map_or_else(|| format!("schedule {}", i + 1), |name| format!("schedule `{}`", name.escape_debug()));
            let name = spec.name.as_deref().and_then(|name| match ScheduleName::new(name) {
                Ok(name) => Some(name),
                Err(err) => {
                    self.report(&format!("{at}/name"), format!("{label}: {err}"));
                    None
                }
            });
            if let Some(name) = &name
                && let Some(first) = seen.insert(name.to_string(), i)
            {
                self.report(&format!("{at}/name"), format!("{label}: the name is already used by schedule {}", first + 1));
            }
            let timezone = spec.timezone.unwrap_or_else(|| "UTC".to_owned());
            let overlap = self.policy(&at, &label, spec.overlap.as_deref().map(str::parse::<Overlap>).transpose());
            let catch_up = self.policy(&at, &label, spec.catch_up.as_deref().map(str::parse::<CatchUp>).transpose());
            // The zone and the expression are checked apart, so that both
            // are reported when both are wrong.
            let zone_ok = match Cron::parse("* * * * *", &timezone) {
                Ok(_) => true,
                Err(err) => {
                    self.report(&format!("{at}/timezone"), format!("{label}: {err}"));
                    false
                }
            };
            let cron = spec.cron.and_then(|cron| match Cron::parse(&cron, "UTC") {
                Ok(_) => Some(cron),
                Err(err) => {
                    self.report(&format!("{at}/cron"), format!("{label}: {err}"));
                    None
                }
            });
            let cron = cron.filter(|_| zone_ok);
            if let (Some(name), Some(cron), Some(overlap), Some(catch_up)) = (name, cron, overlap, catch_up) {
                let input = spec.input.unwrap_or_else(|| Value::Object(serde_json::Map::new()));
                defs.push(ScheduleDef {
                    name,
                    cron,
                    timezone,
                    input,
                    overlap: overlap.unwrap_or_default(),
                    catch_up: catch_up.unwrap_or_default(),
                });
            }
        }
        defs
    }

    /// A schedule's policy, or `None` after reporting why it does not parse
    /// at the field the error names.
    fn policy<T>(&mut self, at: &str, label: &str, parsed: Result<Option<T>, ScheduleError>) -> Option<Option<T>> {
        parsed.map_err(|err| self.report(&format!("{at}/{}", err.field()), format!("{label}: {err}"))).ok()
    }

    /// The name, the version, the deadline and the failure threshold.
    fn workflow_fields(&mut self, spec: &Spec) -> WorkflowFields {
        let name = spec.name.as_deref().and_then(|name| match WorkflowName::new(name) {
            Ok(name) => Some(name),
            Err(err) => {
                self.report("/name", err.to_string());
                None
            }
        });
        if spec.version == Some(0) {
            self.report("/version", "`version` must be at least 1".into());
        }
        let deadline = spec.deadline.unwrap_or(DEADLINE_DEFAULT);
        self.duration("/deadline", "`deadline`", deadline);
        self.warn_after("/warn_after", "`warn_after`", spec.warn_after, ("`deadline`", deadline));
        if let Some(retention) = spec.retention {
            self.duration("/retention", "`retention`", retention);
        }
        let max_failures = spec.max_failures.unwrap_or(MAX_FAILURES_DEFAULT);
        if max_failures == 0 {
            self.report("/max_failures", "`max_failures` must be at least 1".into());
        }
        let priority = match spec.priority.map(Priority::new).transpose() {
            Ok(priority) => priority.unwrap_or_default(),
            Err(err) => {
                let (min, max) = (rota_model::PRIORITY_MIN, rota_model::PRIORITY_MAX);
                self.report("/priority", format!("`priority` must be an integer from {min} to {max}, found {}", err.got));
                Priority::default()
            }
        };
        let (concurrency, max_in_flight) = self.concurrency(spec);
        WorkflowFields {
            name,
            version: spec.version,
            priority,
            concurrency,
            max_in_flight,
            deadline,
            warn_after: spec.warn_after,
            retention: spec.retention,
            on_exhausted: spec.on_exhausted.unwrap_or_default(),
            max_failures,
        }
    }

    /// The steps, which must be at least one and at most [`STEPS_MAX`].
    fn step_list(&mut self, steps: Option<Vec<StepSpec>>) -> Vec<StepSpec> {
        // `None` means the decoder found no usable list and has said so.
        if steps.as_ref().is_some_and(Vec::is_empty) {
            self.report("/steps", "`steps` must list at least one step".into());
        }
        let steps = steps.unwrap_or_default();
        if steps.len() > STEPS_MAX {
            self.report("/steps", format!("a workflow may have at most {STEPS_MAX} steps, this one has {}", steps.len()));
        }
        steps
    }

    /// Step `i`'s own fields: its name, agent (or signal), timeout, retry
    /// policy and compensation.
    fn step_fields(&mut self, i: usize, label: &str, step: &StepSpec, deadline: Duration) -> StepFields {
        let at = format!("/steps/{i}");
        let name = step.name.as_deref().and_then(|name| match StepName::new(name) {
            Ok(name) if name.is_instance() => {
                let message = format!("{label}: a step's name may not end with `[N]`: that names an instance of a `for_each` step");
                self.report(&format!("{at}/name"), message);
                None
            }
            Ok(name) => Some(name),
            Err(err) => {
                self.report(&format!("{at}/name"), err.to_string());
                None
            }
        });
        let action = match (&step.agent, &step.wait, &step.workflow) {
            (Some(_), Some(_), _) => {
                let message = format!("{label}: a step either calls an agent (`agent`) or waits for a signal (`wait`), not both");
                self.report(&format!("{at}/wait"), message);
                None
            }
            (Some(_), None, Some(_)) | (None, Some(_), Some(_)) => {
                let message = format!(
                    "{label}: a step runs a child workflow (`workflow`), or calls an agent (`agent`), or waits for a signal (`wait`): one of them"
                );
                self.report(&format!("{at}/workflow"), message);
                None
            }
            (None, None, None) if step.unreadable => None,
            (None, None, None) => {
                self.report(
                    &at,
                    format!("{label}: missing required field `agent` (or `wait`, for a step that waits for a signal, or `workflow`, for a child workflow)"),
                );
                None
            }
            (Some(agent), None, None) => self.agent(&format!("{at}/agent"), label, Some(agent)).map(StepAction::Call),
            (None, Some(signal), None) => self.wait(&at, label, step, signal, deadline).map(StepAction::Wait),
            (None, None, Some(workflow)) => self.child(&at, label, step, workflow, deadline).map(StepAction::Child),
        };
        if step.workflow_version.is_some() && step.workflow.is_none() {
            let message = format!("{label}: `version` pins the version of a child workflow, and this step has no `workflow`");
            self.report(&format!("{at}/version"), message);
        }
        let callback = step.callback == Some(true);
        if callback && step.workflow.is_some() {
            let message = format!("{label}: a step that runs a child workflow is completed by the child, so no `callback`");
            self.report(&format!("{at}/callback"), message);
        }
        if callback && step.wait.is_some() {
            let message = format!("{label}: a step that waits for a signal is completed by the signal, so no `callback`");
            self.report(&format!("{at}/callback"), message);
        }
        let timeout = step.timeout.unwrap_or(TIMEOUT_DEFAULT);
        self.duration(&format!("{at}/timeout"), &format!("{label}: `timeout`"), timeout);
        self.warn_after(&format!("{at}/warn_after"), &format!("{label}: `warn_after`"), step.warn_after, ("`timeout`", timeout));
        let retry = step.retry.clone().unwrap_or_default();
        self.retry(&format!("{at}/retry"), label, &retry);
        let compensate = step.compensate.as_ref().map(|c| self.compensate(&format!("{at}/compensate"), label, c, timeout, &retry));
        let when = step.when.as_deref().and_then(|source| self.condition(&format!("{at}/when"), label, "when", source));
        let for_each = self.for_each(&at, label, step);
        if step.rate_limit.is_some() && step.workflow.is_some() {
            let message = format!("{label}: a step that runs a child workflow calls no agent, so no `rate_limit`");
            self.report(&format!("{at}/rate_limit"), message);
        }
        if step.rate_limit.is_some() && step.wait.is_some() {
            let message = format!("{label}: a step that waits for a signal calls no agent, so no `rate_limit`");
            self.report(&format!("{at}/rate_limit"), message);
        }
        StepFields { name, action, callback, timeout, warn_after: step.warn_after, when, for_each, retry, compensate }
    }

    /// A `for_each` expression parses like a condition; `max_parallel` is
    /// at least 1 and only goes with it; a step that waits for a signal or
    /// completes by a callback has no instances.
    fn for_each(&mut self, at: &str, label: &str, step: &StepSpec) -> Option<ForEach> {
        if step.max_parallel == Some(0) {
            self.report(&format!("{at}/max_parallel"), format!("{label}: `max_parallel` must be at least 1"));
        }
        let Some(source) = step.for_each.as_deref() else {
            if step.max_parallel.is_some() {
                let message = format!("{label}: `max_parallel` bounds the instances of a `for_each` step, and this step has no `for_each`");
                self.report(&format!("{at}/max_parallel"), message);
            }
            return None;
        };
        if step.wait.is_some() {
            let message = format!("{label}: a step that waits for a signal cannot run `for_each` (a signal completes one step)");
            self.report(&format!("{at}/for_each"), message);
        }
        if step.workflow.is_some() {
            let message = format!("{label}: a step that runs a child workflow cannot run `for_each` (it starts one child)");
            self.report(&format!("{at}/for_each"), message);
        }
        if step.callback == Some(true) {
            let message = format!("{label}: a `for_each` step cannot complete by a callback (`callback: true` is for single steps)");
            self.report(&format!("{at}/for_each"), message);
        }
        let items = self.condition(&format!("{at}/for_each"), label, "for_each", source)?;
        let max_parallel = step.max_parallel.unwrap_or(MAX_PARALLEL_DEFAULT).max(1);
        Some(ForEach { items, max_parallel })
    }

    /// `concurrency:` (a key expression over `input` alone, a limit within
    /// bounds) and `max_in_flight:`, which a workflow does not combine: a
    /// task holds one slot.
    fn concurrency(&mut self, spec: &Spec) -> (Option<Concurrency>, Option<u32>) {
        let limit_ok = |limit: u32| (1..=CONCURRENCY_LIMIT_MAX).contains(&limit);
        if let Some(limit) = spec.max_in_flight.filter(|limit| !limit_ok(*limit)) {
            self.report("/max_in_flight", format!("`max_in_flight` must be from 1 to {CONCURRENCY_LIMIT_MAX}, found {limit}"));
        }
        if spec.max_in_flight.is_some() && spec.concurrency.is_some() {
            let message = "a workflow has `concurrency` or `max_in_flight`, not both: a task holds one slot \
                           (bound the whole workflow with a `max_in_flight`, or each key with `concurrency`)";
            self.report("/max_in_flight", message.into());
        }
        let Some(ConcurrencySpec { key, limit }) = &spec.concurrency else {
            return (None, spec.max_in_flight.filter(|limit| limit_ok(*limit)));
        };
        if let Some(limit) = limit.filter(|limit| !limit_ok(*limit)) {
            self.report("/concurrency/limit", format!("`concurrency.limit` must be from 1 to {CONCURRENCY_LIMIT_MAX}, found {limit}"));
        }
        let key = key.as_deref().and_then(|source| match Condition::parse(source) {
            Ok(key) if key.steps().is_empty() => Some(key),
            Ok(key) => {
                for reference in key.steps() {
                    let message =
                        "`concurrency.key` may use only `input`: a task's key is computed when it is submitted, before any step ran";
                    self.problems.push(self.loc.at_inside("/concurrency/key", reference.at, message.into()));
                }
                None
            }
            Err(problems) => {
                for problem in problems {
                    let message = format!("`concurrency.key`: {}", problem.message.replace('\n', "\\n"));
                    self.problems.push(self.loc.at_inside("/concurrency/key", problem.at, message));
                }
                None
            }
        });
        let concurrency = match (key, limit) {
            (Some(key), Some(limit)) if limit_ok(*limit) => Some(Concurrency { key, limit: *limit }),
            _ => None,
        };
        (concurrency, None)
    }

    /// A condition (or a `for_each` expression: `field`) parses and names
    /// only `input` and `steps.NAME`; each problem is placed where it is in
    /// the expression.
    fn condition(&mut self, pointer: &str, label: &str, field: &str, source: &str) -> Option<Condition> {
        match Condition::parse(source) {
            Ok(condition) => Some(condition),
            Err(problems) => {
                for problem in problems {
                    // One line per problem: the parser may quote a newline.
                    let message = format!("{label}: `{field}`: {}", problem.message.replace('\n', "\\n"));
                    self.problems.push(self.loc.at_inside(pointer, problem.at, message));
                }
                None
            }
        }
    }

    /// Conditions refer only to upstream steps: those are settled
    /// (completed or skipped) when the condition is decided.
    /// (A `for_each` expression too: it is evaluated as the step starts.)
    fn conditions(&mut self, fields: &[StepFields], index: &HashMap<&str, usize>, labels: &[String], deps: &[Vec<usize>]) {
        for (i, field) in fields.iter().enumerate() {
            let expressions = [("when", field.when.as_ref()), ("for_each", field.for_each.as_ref().map(ForEach::items))];
            for (key, expression) in expressions {
                let Some(expression) = expression else { continue };
                let upstream = dag::upstream_indices(deps, i);
                let pointer = format!("/steps/{i}/{key}");
                for reference in expression.steps() {
                    let step = &reference.name.escape_debug().to_string();
                    let message = match index.get(reference.name.as_str()) {
                        None => format!("{}: `{key}` refers to unknown step `{step}`", labels[i]),
                        Some(&j) if !upstream[j] => {
                            format!("{}: `{key}` refers to step `{step}`, which is not upstream (add it to `depends_on`)", labels[i])
                        }
                        Some(_) => continue,
                    };
                    self.problems.push(self.loc.at_inside(&pointer, reference.at, message));
                }
            }
        }
    }

    /// A waiting step's signal and the fields that must go with it (a
    /// timeout within the deadline) or must not (what only an agent call
    /// uses).
    fn wait(&mut self, at: &str, label: &str, step: &StepSpec, signal: &str, deadline: Duration) -> Option<SignalName> {
        let signal = match SignalName::new(signal) {
            Ok(signal) => Some(signal),
            Err(err) => {
                self.report(&format!("{at}/wait"), format!("{label}: {err}"));
                None
            }
        };
        let shown = signal.as_ref().map_or("", SignalName::as_str);
        match step.timeout {
            None => self.report(
                &format!("{at}/wait"),
                format!("{label}: a step that waits needs a `timeout`: how long to wait for signal `{shown}` before the step fails"),
            ),
            // The task's own complete-by would pass first and fail the task
            // as a whole, so the step's timeout could never apply.
            Some(timeout) if timeout > deadline => self.report(
                &format!("{at}/timeout"),
                format!(
                    "{label}: waits up to {}, longer than the workflow's `deadline` of {} (raise `deadline`: the task must outlive its waits)",
                    humantime::format_duration(timeout),
                    humantime::format_duration(deadline)
                ),
            ),
            Some(_) => {}
        }
        if !step.with.is_null() {
            let message = format!("{label}: a step that waits for a signal takes no `with` (the signal's payload is its output)");
            self.report(&format!("{at}/with"), message);
        }
        if step.retry.is_some() {
            let message = format!(
                "{label}: a step that waits for a signal calls no agent to retry (`max_failures` counts its timeouts), so no `retry`"
            );
            self.report(&format!("{at}/retry"), message);
        }
        if step.compensate.is_some() {
            let message = format!("{label}: a step that waits for a signal has nothing to undo, so no `compensate`");
            self.report(&format!("{at}/compensate"), message);
        }
        signal
    }

    /// A `workflow:` step's child workflow name, and what must go with it (a
    /// timeout within the deadline: how long to wait for the child) or must
    /// not (an agent's retry policy: a failed child is retried as a new
    /// child, counted by `max_failures`).
    fn child(&mut self, at: &str, label: &str, step: &StepSpec, workflow: &str, deadline: Duration) -> Option<ChildWorkflow> {
        let name = match WorkflowName::new(workflow) {
            Ok(name) => Some(name),
            Err(err) => {
                self.report(&format!("{at}/workflow"), format!("{label}: {err}"));
                None
            }
        };
        let shown = name.as_ref().map_or("", WorkflowName::as_str);
        match step.timeout {
            None => self.report(
                &format!("{at}/workflow"),
                format!("{label}: a step that runs a child workflow needs a `timeout`: how long to wait for `{shown}` to finish"),
            ),
            Some(timeout) if timeout > deadline => self.report(
                &format!("{at}/timeout"),
                format!(
                    "{label}: waits up to {} for its child, longer than the workflow's `deadline` of {} (raise `deadline`: the task must outlive its children)",
                    humantime::format_duration(timeout),
                    humantime::format_duration(deadline)
                ),
            ),
            Some(_) => {}
        }
        if step.retry.is_some() {
            let message = format!(
                "{label}: a step that runs a child workflow calls no agent to retry (a failed child is retried as a new one, counted by `max_failures`), so no `retry`"
            );
            self.report(&format!("{at}/retry"), message);
        }
        if step.workflow_version == Some(0) {
            self.report(&format!("{at}/version"), format!("{label}: `version` must be at least 1"));
        }
        Some(ChildWorkflow { name: name?, version: step.workflow_version })
    }

    /// A signal has one destination: at most one step waits for each name.
    fn one_step_per_signal(&mut self, fields: &[StepFields], labels: &[String]) {
        let mut waiting: HashMap<&SignalName, usize> = HashMap::new();
        for (i, field) in fields.iter().enumerate() {
            let Some(StepAction::Wait(signal)) = &field.action else { continue };
            if let Some(&first) = waiting.get(signal) {
                let message = format!(
                    "{}: signal `{signal}` is already awaited by {}: a signal may be awaited by one step",
                    labels[i], labels[first]
                );
                self.report(&format!("/steps/{i}/wait"), message);
            } else {
                waiting.insert(signal, i);
            }
        }
    }

    /// Step names are unique. Returns where each name is first used.
    fn unique_names<'s>(&mut self, steps: &'s [StepSpec]) -> HashMap<&'s str, usize> {
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (i, step) in steps.iter().enumerate() {
            let Some(name) = step.name.as_deref() else { continue };
            if let Some(first) = index.get(name) {
                let message = format!("duplicate step name `{}` (step {} has it too)", name.escape_debug(), first + 1);
                self.report(&format!("/steps/{i}/name"), message);
            } else {
                index.insert(name, i);
            }
        }
        index
    }

    /// Dependencies, resolved: a step without `depends_on` depends on the
    /// step before it. Each named dependency exists and is named once.
    fn dependencies(&mut self, steps: &[StepSpec], index: &HashMap<&str, usize>, labels: &[String]) -> Graph {
        let mut graph = Graph { deps: Vec::with_capacity(steps.len()), pointers: Vec::with_capacity(steps.len()) };
        for (i, step) in steps.iter().enumerate() {
            let mut mine = Vec::new();
            let mut pointers = Vec::new();
            match &step.depends_on {
                None if i > 0 => {
                    mine.push(i - 1);
                    pointers.push(format!("/steps/{i}/name"));
                }
                None => {}
                Some(list) => {
                    for (k, dep) in list.iter().enumerate() {
                        let pointer = format!("/steps/{i}/depends_on/{k}");
                        match index.get(dep.as_str()) {
                            Some(&j) if mine.contains(&j) => {
                                self.report(&pointer, format!("{}: `depends_on` lists `{}` twice", labels[i], dep.escape_debug()))
                            }
                            Some(&j) => {
                                mine.push(j);
                                pointers.push(pointer);
                            }
                            None => self.report(&pointer, format!("{}: depends on unknown step `{}`", labels[i], dep.escape_debug())),
                        }
                    }
                }
            }
            graph.deps.push(mine);
            graph.pointers.push(pointers);
        }
        graph
    }

    /// The dependencies form no cycle. Returns the topological order, or
    /// reports one cycle through each group of steps that cannot be placed,
    /// at the first edge of the cycle.
    fn acyclic(&mut self, steps: &[StepSpec], graph: &Graph) -> Option<Vec<usize>> {
        let unplaced = match dag::topological(&graph.deps) {
            Ok(order) => return Some(order),
            Err(unplaced) => unplaced,
        };
        for cycle in dag::cycles(&graph.deps, &unplaced) {
            let names: Vec<String> = cycle.iter().map(|&i| step_name(&steps[i].name, i)).collect();
            let mut message = format!("dependency cycle: {}", names[0]);
            for (k, next) in names.iter().skip(1).chain([&names[0]]).enumerate() {
                message.push_str(if k == 0 { " depends on " } else { ", which depends on " });
                message.push_str(next);
            }
            let first = cycle[0];
            let second = *cycle.get(1).unwrap_or(&first);
            let edge = graph.deps[first].iter().position(|&d| d == second).expect("a cycle follows dependency edges");
            self.report(&graph.pointers[first][edge], message);
        }
        None
    }

    /// Templates refer only to upstream steps (a compensation also to the
    /// step it undoes, which has completed by then).
    fn templates(&mut self, steps: &[StepSpec], index: &HashMap<&str, usize>, labels: &[String], deps: &[Vec<usize>]) {
        for (i, step) in steps.iter().enumerate() {
            let upstream = dag::upstream_indices(deps, i);
            let for_each = step.for_each.is_some();
            let step_refs = Refs { label: &labels[i], index, what: "", callback: step.callback == Some(true), for_each };
            self.template_refs(&format!("/steps/{i}/with"), &step.with, &step_refs, |j| upstream[j]);
            if let Some(compensate) = &step.compensate {
                let compensation_refs = Refs { label: &labels[i], index, what: "compensation ", callback: false, for_each };
                self.template_refs(&format!("/steps/{i}/compensate/with"), &compensate.with, &compensation_refs, |j| j == i || upstream[j]);
            }
        }
    }
}

/// Builds the workflow from sections that all passed: every required part
/// is present.
fn assemble(top: WorkflowFields, steps: Vec<StepSpec>, fields: Vec<StepFields>, deps: &[Vec<usize>], order: Vec<usize>) -> Workflow {
    let names: Vec<StepName> = fields.iter().map(|f| f.name.clone().expect("validated step name")).collect();
    let steps = steps
        .into_iter()
        .zip(fields)
        .zip(deps)
        .map(|((spec, fields), its_deps)| StepDef {
            name: fields.name.expect("validated step name"),
            action: fields.action.expect("validated agent or signal"),
            callback: fields.callback,
            with: spec.with,
            timeout: fields.timeout,
            warn_after: fields.warn_after,
            when: fields.when,
            for_each: fields.for_each,
            retry: fields.retry,
            rate_limit: spec.rate_limit,
            compensate: fields.compensate.map(|c| c.expect("validated compensation")),
            depends_on: its_deps.iter().map(|&j| names[j].clone()).collect(),
        })
        .collect();
    let workflow = Workflow {
        name: top.name.expect("validated workflow name"),
        version: top.version.expect("validated version"),
        deadline: top.deadline,
        warn_after: top.warn_after,
        retention: top.retention,
        on_exhausted: top.on_exhausted,
        max_failures: top.max_failures,
        priority: top.priority,
        concurrency: top.concurrency,
        max_in_flight: top.max_in_flight,
        steps,
        order,
        schedules: Vec::new(),
    };
    assert_eq!(workflow.order.len(), workflow.steps.len(), "the topological order places every step once");
    workflow
}

/// How a step is named in a diagnostic about one of its fields.
fn step_label(name: &Option<String>, index: usize) -> String {
    match name {
        Some(name) => format!("step `{}`", name.escape_debug()),
        None => format!("step {}", index + 1),
    }
}

/// How a step is named in a dependency cycle's diagnostic.
fn step_name(name: &Option<String>, index: usize) -> String {
    match name {
        Some(name) => format!("`{name}`"),
        None => format!("step {}", index + 1),
    }
}

/// What a template's references are checked against, and how a problem
/// names the template.
struct Refs<'a> {
    label: &'a str,
    index: &'a HashMap<&'a str, usize>,
    /// "" for a step's input, "compensation " for its compensation's.
    what: &'a str,
    /// Whether the template is a callback step's input, the only one with
    /// a callback token.
    callback: bool,
    /// Whether the template is a `for_each` step's (or its compensation's),
    /// the only ones with an item and an index.
    for_each: bool,
}

impl Check<'_> {
    fn duration(&mut self, pointer: &str, what: &str, duration: Duration) {
        if duration.is_zero() {
            self.report(pointer, format!("{what} must be longer than 0"));
        } else if !duration.subsec_nanos().is_multiple_of(1_000_000) {
            // Every stored time in rota is in milliseconds; a finer duration
            // would not survive the round trip through the store.
            self.report(pointer, format!("{what} must be a whole number of milliseconds, got {}", humantime::format_duration(duration)));
        }
    }

    /// A warning point, when given: a duration like any other, and shorter
    /// than the complete-by it warns about (`bound`, named as written), or
    /// it would fire only once the work has already failed.
    fn warn_after(&mut self, pointer: &str, what: &str, warn_after: Option<Duration>, bound: (&str, Duration)) {
        let Some(warn_after) = warn_after else { return };
        self.duration(pointer, what, warn_after);
        let (bound_name, bound) = bound;
        if !warn_after.is_zero() && warn_after >= bound {
            let message = format!(
                "{what} ({}) must be shorter than {bound_name} ({}): the warning must come while there is still time to act",
                humantime::format_duration(warn_after),
                humantime::format_duration(bound)
            );
            self.report(pointer, message);
        }
    }

    fn retry(&mut self, pointer: &str, label: &str, retry: &RetryPolicy) {
        for (field, duration) in [("backoff", retry.backoff_initial()), ("max_backoff", retry.backoff_max())] {
            if !duration.subsec_nanos().is_multiple_of(1_000_000) {
                self.report(
                    &format!("{pointer}/{field}"),
                    format!(
                        "{label}: `retry.{field}` must be a whole number of milliseconds, got {}",
                        humantime::format_duration(duration)
                    ),
                );
            }
        }
        // The parser checks the statuses it reads; a builder's policy may
        // hold any `u16`.
        for (i, class) in retry.non_retryable().iter().enumerate() {
            if let FailureClass::Status(status) = class
                && !HTTP_STATUS_RANGE.contains(status)
            {
                self.report(
                    &format!("{pointer}/non_retryable/{i}"),
                    format!("{label}: `retry.non_retryable`: HTTP status must be between 100 and 599, found {status}"),
                );
            }
        }
    }

    fn agent(&mut self, pointer: &str, label: &str, agent: Option<&str>) -> Option<AgentName> {
        let agent = match AgentName::new(agent?) {
            Ok(agent) => agent,
            Err(err) => {
                self.report(pointer, format!("{label}: {err}"));
                return None;
            }
        };
        if let Some(catalog) = self.agents
            && !catalog.contains(&agent)
        {
            let known: Vec<&str> = catalog.names().map(AgentName::as_str).collect();
            self.report(pointer, format!("{label}: unknown agent `{agent}` (known agents: {})", known.join(", ")));
            return None;
        }
        Some(agent)
    }

    fn compensate(
        &mut self,
        pointer: &str,
        label: &str,
        spec: &CompensateSpec,
        step_timeout: Duration,
        step_retry: &RetryPolicy,
    ) -> Option<CompensateDef> {
        let agent = self.agent(&format!("{pointer}/agent"), label, spec.agent.as_deref());
        // The compensation usually calls the same service as the step, so it
        // inherits the step's timeout and retry policy unless it sets its own.
        let timeout = spec.timeout.unwrap_or(step_timeout);
        self.duration(&format!("{pointer}/timeout"), &format!("{label}: `compensate.timeout`"), timeout);
        let retry = spec.retry.clone().unwrap_or_else(|| step_retry.clone());
        self.retry(&format!("{pointer}/retry"), &format!("{label}: compensation"), &retry);
        Some(CompensateDef { agent: agent?, with: spec.with.clone(), timeout, retry })
    }

    fn template_refs(&mut self, pointer: &str, template: &Value, refs: &Refs<'_>, allowed: impl Fn(usize) -> bool) {
        let Refs { label, index, what, callback, for_each } = refs;
        for reference in references(template) {
            let at = format!("{pointer}{}", reference.pointer);
            let step = match reference.target {
                Err(err) => {
                    self.report(&at, format!("{label}: {what}template: {err}"));
                    continue;
                }
                Ok(Target::StepOutput { step, .. }) => step,
                Ok(Target::CallbackToken) if !callback => {
                    let message = format!(
                        "{label}: {what}template `{{{{ {} }}}}`: only a step with `callback: true` has a callback token",
                        reference.expr
                    );
                    self.report(&at, message);
                    continue;
                }
                Ok(Target::Item { .. } | Target::Index) if !for_each => {
                    let message = format!(
                        "{label}: {what}template `{{{{ {} }}}}`: only a step with `for_each` has an item and an index",
                        reference.expr
                    );
                    self.report(&at, message);
                    continue;
                }
                Ok(_) => continue,
            };
            let expr = &reference.expr;
            match index.get(step.as_str()) {
                None => self.report(&at, format!("{label}: {what}template `{{{{ {expr} }}}}` refers to unknown step `{step}`")),
                Some(&j) if !allowed(j) => self.report(
                    &at,
                    format!(
                        "{label}: {what}template `{{{{ {expr} }}}}` refers to step `{step}`, which is not upstream (add it to `depends_on`)"
                    ),
                ),
                Some(_) => {}
            }
        }
    }
}
