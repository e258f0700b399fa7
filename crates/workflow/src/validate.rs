//! Turns a [`Spec`] into a [`Workflow`], reporting every problem.
//!
//! Checks run on whatever the decoder could read, even after it found
//! problems elsewhere, so one pass over a file reports all of them. A
//! workflow is only built when nothing at all was wrong.

use std::collections::HashMap;
use std::time::Duration;

use rota_model::{RetryPolicy, StepName, WorkflowName};
use serde_json::Value;

use crate::agent::{AgentCatalog, AgentName};
use crate::builder::{CompensateSpec, Spec};
use crate::dag;
use crate::definition::{CompensateDef, DEADLINE_DEFAULT, MAX_FAILURES_DEFAULT, STEPS_MAX, StepDef, TIMEOUT_DEFAULT, Workflow};
use crate::diagnostic::{Diagnostic, Diagnostics, Locate};
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
pub(crate) fn validate_into(
    spec: Spec,
    loc: &dyn Locate,
    agents: Option<&AgentCatalog>,
    problems: &mut Vec<Diagnostic>,
) -> Option<Workflow> {
    let name = spec.name.as_deref().and_then(|name| match WorkflowName::new(name) {
        Ok(name) => Some(name),
        Err(err) => {
            problems.push(loc.at_value("/name", err.to_string()));
            None
        }
    });
    if spec.version == Some(0) {
        problems.push(loc.at_value("/version", "`version` must be at least 1".into()));
    }
    let deadline = spec.deadline.unwrap_or(DEADLINE_DEFAULT);
    check_duration(loc, problems, "/deadline", "`deadline`", deadline);
    let max_failures = spec.max_failures.unwrap_or(MAX_FAILURES_DEFAULT);
    if max_failures == 0 {
        problems.push(loc.at_value("/max_failures", "`max_failures` must be at least 1".into()));
    }

    // `None` means the decoder found no usable list and has said so.
    if spec.steps.as_ref().is_some_and(Vec::is_empty) {
        problems.push(loc.at_value("/steps", "`steps` must list at least one step".into()));
    }
    let steps = spec.steps.unwrap_or_default();
    if steps.len() > STEPS_MAX {
        problems.push(loc.at_value("/steps", format!("a workflow may have at most {STEPS_MAX} steps, this one has {}", steps.len())));
    }

    // Per-step fields.
    let labels: Vec<String> = steps
        .iter()
        .enumerate()
        .map(|(i, step)| match &step.name {
            Some(name) => format!("step `{name}`"),
            None => format!("step {}", i + 1),
        })
        .collect();
    let mut checked = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        let at = format!("/steps/{i}");
        let label = &labels[i];
        let name = step.name.as_deref().and_then(|name| match StepName::new(name) {
            Ok(name) => Some(name),
            Err(err) => {
                problems.push(loc.at_value(&format!("{at}/name"), err.to_string()));
                None
            }
        });
        let agent = check_agent(loc, problems, agents, &format!("{at}/agent"), label, step.agent.as_deref());
        let timeout = step.timeout.unwrap_or(TIMEOUT_DEFAULT);
        check_duration(loc, problems, &format!("{at}/timeout"), &format!("{label}: `timeout`"), timeout);
        let retry = step.retry.clone().unwrap_or_default();
        check_retry(loc, problems, &format!("{at}/retry"), label, &retry);
        let compensate = step
            .compensate
            .as_ref()
            .map(|c| check_compensate(loc, problems, agents, &format!("{at}/compensate"), label, c, timeout, &retry));
        checked.push((name, agent, timeout, retry, compensate));
    }

    // Names are unique.
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, step) in steps.iter().enumerate() {
        let Some(name) = step.name.as_deref() else { continue };
        if let Some(first) = index.get(name) {
            problems
                .push(loc.at_value(&format!("/steps/{i}/name"), format!("duplicate step name `{name}` (step {} has it too)", first + 1)));
        } else {
            index.insert(name, i);
        }
    }

    // Dependencies, resolved: without `depends_on`, the previous step.
    let mut deps: Vec<Vec<usize>> = Vec::with_capacity(steps.len());
    let mut dep_pointers: Vec<Vec<String>> = Vec::with_capacity(steps.len());
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
                            problems.push(loc.at_value(&pointer, format!("{}: `depends_on` lists `{dep}` twice", labels[i])))
                        }
                        Some(&j) => {
                            mine.push(j);
                            pointers.push(pointer);
                        }
                        None => problems.push(loc.at_value(&pointer, format!("{}: depends on unknown step `{dep}`", labels[i]))),
                    }
                }
            }
        }
        deps.push(mine);
        dep_pointers.push(pointers);
    }
    let order = match dag::topological(&deps) {
        Ok(order) => Some(order),
        Err(unplaced) => {
            for cycle in dag::cycles(&deps, &unplaced) {
                let names: Vec<String> = cycle.iter().map(|&i| step_name(&steps[i].name, i)).collect();
                let mut message = format!("dependency cycle: {}", names[0]);
                for (k, next) in names.iter().skip(1).chain([&names[0]]).enumerate() {
                    message.push_str(if k == 0 { " depends on " } else { ", which depends on " });
                    message.push_str(next);
                }
                let first = cycle[0];
                let second = *cycle.get(1).unwrap_or(&first);
                let edge = deps[first].iter().position(|&d| d == second).expect("a cycle follows dependency edges");
                problems.push(loc.at_value(&dep_pointers[first][edge], message));
            }
            None
        }
    };

    // Templates refer only to upstream steps (a compensation also to the
    // step it undoes, which has completed by then).
    for (i, step) in steps.iter().enumerate() {
        let upstream = dag::upstream_indices(&deps, i);
        check_templates(loc, problems, &format!("/steps/{i}/with"), &labels[i], &step.with, &index, |j| upstream[j], "");
        if let Some(compensate) = &step.compensate {
            check_templates(
                loc,
                problems,
                &format!("/steps/{i}/compensate/with"),
                &labels[i],
                &compensate.with,
                &index,
                |j| j == i || upstream[j],
                "compensation ",
            );
        }
    }

    if !problems.is_empty() {
        return None;
    }
    // Nothing was wrong, so every required part is present.
    let names: Vec<StepName> = checked.iter().map(|c| c.0.clone().expect("validated step name")).collect();
    let steps = steps
        .into_iter()
        .zip(checked)
        .zip(&deps)
        .map(|((spec, (name, agent, timeout, retry, compensate)), its_deps)| StepDef {
            name: name.expect("validated step name"),
            agent: agent.expect("validated agent"),
            with: spec.with,
            timeout,
            retry,
            compensate: compensate.map(|c| c.expect("validated compensation")),
            depends_on: its_deps.iter().map(|&j| names[j].clone()).collect(),
        })
        .collect();
    let workflow = Workflow {
        name: name.expect("validated workflow name"),
        version: spec.version.expect("validated version"),
        deadline,
        on_exhausted: spec.on_exhausted.unwrap_or_default(),
        max_failures,
        steps,
        order: order.expect("validated DAG"),
    };
    assert_eq!(workflow.order.len(), workflow.steps.len(), "the topological order places every step once");
    Some(workflow)
}

fn step_name(name: &Option<String>, index: usize) -> String {
    match name {
        Some(name) => format!("`{name}`"),
        None => format!("step {}", index + 1),
    }
}

fn check_duration(loc: &dyn Locate, problems: &mut Vec<Diagnostic>, pointer: &str, what: &str, duration: Duration) {
    if duration.is_zero() {
        problems.push(loc.at_value(pointer, format!("{what} must be longer than 0")));
    } else if !duration.subsec_nanos().is_multiple_of(1_000_000) {
        // Every stored time in rota is in milliseconds; a finer duration
        // would not survive the round trip through the store.
        problems.push(
            loc.at_value(pointer, format!("{what} must be a whole number of milliseconds, got {}", humantime::format_duration(duration))),
        );
    }
}

fn check_retry(loc: &dyn Locate, problems: &mut Vec<Diagnostic>, pointer: &str, label: &str, retry: &RetryPolicy) {
    for (field, duration) in [("backoff", retry.backoff_initial()), ("max_backoff", retry.backoff_max())] {
        if !duration.subsec_nanos().is_multiple_of(1_000_000) {
            problems.push(loc.at_value(
                &format!("{pointer}/{field}"),
                format!("{label}: `retry.{field}` must be a whole number of milliseconds, got {}", humantime::format_duration(duration)),
            ));
        }
    }
}

fn check_agent(
    loc: &dyn Locate,
    problems: &mut Vec<Diagnostic>,
    agents: Option<&AgentCatalog>,
    pointer: &str,
    label: &str,
    agent: Option<&str>,
) -> Option<AgentName> {
    let agent = match AgentName::new(agent?) {
        Ok(agent) => agent,
        Err(err) => {
            problems.push(loc.at_value(pointer, format!("{label}: {err}")));
            return None;
        }
    };
    if let Some(catalog) = agents
        && !catalog.contains(&agent)
    {
        let known: Vec<&str> = catalog.names().map(AgentName::as_str).collect();
        problems.push(loc.at_value(pointer, format!("{label}: unknown agent `{agent}` (known agents: {})", known.join(", "))));
        return None;
    }
    Some(agent)
}

#[allow(clippy::too_many_arguments)] // One call site; a struct would only rename the parameters.
fn check_compensate(
    loc: &dyn Locate,
    problems: &mut Vec<Diagnostic>,
    agents: Option<&AgentCatalog>,
    pointer: &str,
    label: &str,
    spec: &CompensateSpec,
    step_timeout: Duration,
    step_retry: &RetryPolicy,
) -> Option<CompensateDef> {
    let agent = check_agent(loc, problems, agents, &format!("{pointer}/agent"), label, spec.agent.as_deref());
    // The compensation usually calls the same service as the step, so it
    // inherits the step's timeout and retry policy unless it sets its own.
    let timeout = spec.timeout.unwrap_or(step_timeout);
    check_duration(loc, problems, &format!("{pointer}/timeout"), &format!("{label}: `compensate.timeout`"), timeout);
    let retry = spec.retry.clone().unwrap_or_else(|| step_retry.clone());
    check_retry(loc, problems, &format!("{pointer}/retry"), &format!("{label}: compensation"), &retry);
    Some(CompensateDef { agent: agent?, with: spec.with.clone(), timeout, retry })
}

#[allow(clippy::too_many_arguments)] // Two call sites that differ in the last three.
fn check_templates(
    loc: &dyn Locate,
    problems: &mut Vec<Diagnostic>,
    pointer: &str,
    label: &str,
    template: &Value,
    index: &HashMap<&str, usize>,
    allowed: impl Fn(usize) -> bool,
    what: &str,
) {
    for reference in references(template) {
        let at = format!("{pointer}{}", reference.pointer);
        let step = match reference.target {
            Err(err) => {
                problems.push(loc.at_value(&at, format!("{label}: {what}template: {err}")));
                continue;
            }
            Ok(Target::StepOutput { step, .. }) => step,
            Ok(_) => continue,
        };
        let expr = &reference.expr;
        match index.get(step.as_str()) {
            None => problems.push(loc.at_value(&at, format!("{label}: {what}template `{{{{ {expr} }}}}` refers to unknown step `{step}`"))),
            Some(&j) if !allowed(j) => problems.push(loc.at_value(
                &at,
                format!(
                    "{label}: {what}template `{{{{ {expr} }}}}` refers to step `{step}`, which is not upstream (add it to `depends_on`)"
                ),
            )),
            Some(_) => {}
        }
    }
}
