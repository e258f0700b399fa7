//! `rota validate FILE…`: checks workflow definitions without a store.
//!
//! Every problem of every file is printed on stderr as `FILE:LINE:COL:
//! message`, the form editors and CI logs turn into links; each valid file
//! gets one line on stdout. The exit code is non-zero if any file has a
//! problem, so the command fits a pre-commit hook or a CI step.
//!
//! Across the files, a child workflow (`workflow:` step) that none of them
//! defines gets a warning (it may be registered already), and a cycle of
//! workflows starting each other (`a -> b -> a`) is a problem: only the
//! Scheduler's `child_depth_max` would stop it.
//!
//! Deliberately left out: checks that need a store (whether a version is
//! already registered with a different definition; `rota serve` reports
//! that when it registers).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::bail;
use rota_workflow::{AgentCatalog, AgentName, Workflow};

use crate::output;

/// Arguments of `validate`.
#[derive(clap::Args)]
pub struct Args {
    /// The definition files (YAML, or JSON for .json).
    #[arg(value_name = "FILE", required = true)]
    files: Vec<PathBuf>,
    /// A custom agent that steps may name, besides http, exec and delay (repeatable).
    #[arg(long = "agent", value_name = "NAME")]
    agents: Vec<AgentName>,
}

/// Validates each file; fails if any has a problem.
pub fn run(args: Args) -> anyhow::Result<()> {
    let catalog = args.agents.into_iter().fold(AgentCatalog::builtin(), AgentCatalog::with);
    let mut invalid = 0usize;
    let mut problems = 0usize;
    let mut valid: Vec<(PathBuf, Workflow)> = Vec::new();
    for file in &args.files {
        match rota_workflow::load_file(file, &catalog) {
            Ok(workflow) => {
                valid.push((file.clone(), workflow.clone()));
                let steps = workflow.steps().len();
                output::line(&format!(
                    "{}: ok (workflow {} version {}, {steps} step{})",
                    file.display(),
                    workflow.name(),
                    workflow.version(),
                    if steps == 1 { "" } else { "s" }
                ))?;
            }
            Err(diagnostics) => {
                invalid += 1;
                problems += diagnostics.len();
                for diagnostic in &diagnostics {
                    eprintln!("{diagnostic}");
                }
            }
        }
    }
    for problem in child_cycles(&valid) {
        invalid += 1;
        problems += 1;
        eprintln!("{problem}");
    }
    for warning in missing_children(&valid) {
        eprintln!("{warning}");
    }
    if invalid > 0 {
        let files = args.files.len();
        let plural = |n: usize, word: &str| if n == 1 { format!("{n} {word}") } else { format!("{n} {word}s") };
        bail!("{} in {invalid} of {}", plural(problems, "problem"), plural(files, "workflow file"));
    }
    Ok(())
}

/// The child workflows the files name that none of them defines, one
/// warning each (a store may have them registered).
fn missing_children(valid: &[(PathBuf, Workflow)]) -> Vec<String> {
    let defined: Vec<&str> = valid.iter().map(|(_, w)| w.name().as_str()).collect();
    let mut warnings = Vec::new();
    for (file, workflow) in valid {
        for step in workflow.steps() {
            let Some(child) = step.child() else { continue };
            if !defined.contains(&child.name().as_str()) {
                warnings.push(format!(
                    "{}: warning: step `{}` runs child workflow `{}`, which none of the files given defines: it must be registered before a task reaches the step",
                    file.display(),
                    step.name(),
                    child.name()
                ));
            }
        }
    }
    warnings
}

/// Every cycle of workflows starting each other among the files (`a -> b
/// -> a`, or a workflow starting itself), one problem each, named from the
/// first file of the cycle's first workflow.
fn child_cycles(valid: &[(PathBuf, Workflow)]) -> Vec<String> {
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut files: BTreeMap<&str, &PathBuf> = BTreeMap::new();
    for (file, workflow) in valid {
        files.entry(workflow.name().as_str()).or_insert(file);
        let names = children.entry(workflow.name().as_str()).or_default();
        for child in workflow.steps().iter().filter_map(|step| step.child()) {
            if !names.contains(&child.name().as_str()) {
                names.push(child.name().as_str());
            }
        }
    }
    let mut problems = Vec::new();
    let mut reported: Vec<Vec<&str>> = Vec::new();
    for &start in children.keys() {
        let mut path = vec![start];
        find_cycles(&children, start, &mut path, &mut |cycle: Vec<&str>| {
            // The same cycle found from another of its workflows.
            let mut key = cycle[..cycle.len() - 1].to_vec();
            key.sort_unstable();
            if reported.contains(&key) {
                return;
            }
            reported.push(key);
            problems.push(format!(
                "{}: workflow `{}` starts itself through child workflows: {} (only child_depth_max would stop it)",
                files[cycle[0]].display(),
                cycle[0],
                cycle.join(" -> ")
            ));
        });
    }
    problems
}

/// Walks the children of the last workflow of `path`, reporting each path
/// back to its first workflow.
fn find_cycles<'a>(
    children: &BTreeMap<&'a str, Vec<&'a str>>,
    start: &'a str,
    path: &mut Vec<&'a str>,
    found: &mut dyn FnMut(Vec<&'a str>),
) {
    let last = *path.last().expect("a path has a start");
    for &child in children.get(last).into_iter().flatten() {
        if child == start {
            let mut cycle = path.clone();
            cycle.push(child);
            found(cycle);
        } else if !path.contains(&child) && children.contains_key(child) {
            path.push(child);
            find_cycles(children, start, path, found);
            path.pop();
        }
    }
}
