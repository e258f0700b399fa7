//! `rota validate FILE…`: checks workflow definitions without a store.
//!
//! Every problem of every file is printed on stderr as `FILE:LINE:COL:
//! message`, the form editors and CI logs turn into links; each valid file
//! gets one line on stdout. The exit code is non-zero if any file has a
//! problem, so the command fits a pre-commit hook or a CI step.
//!
//! Deliberately left out: checks that need a store (whether a version is
//! already registered with a different definition; `rota serve` reports
//! that when it registers).

use std::path::PathBuf;

use anyhow::bail;
use rota_workflow::{AgentCatalog, AgentName};

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
    for file in &args.files {
        match rota_workflow::load_file(file, &catalog) {
            Ok(workflow) => {
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
    if invalid > 0 {
        let files = args.files.len();
        let plural = |n: usize, word: &str| if n == 1 { format!("{n} {word}") } else { format!("{n} {word}s") };
        bail!("{} in {invalid} of {}", plural(problems, "problem"), plural(files, "workflow file"));
    }
    Ok(())
}
