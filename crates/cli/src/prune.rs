//! `rota prune`: deletes finished tasks with their steps and history by
//! hand, in the same small batches as the Supervisor leader's retention
//! passes (`rota_engine::retention::prune`); `--dry-run` counts them.
//! Each batch is one transaction, so stopping it midway loses nothing but
//! the batches not yet run. With `--archive DIR` each batch is first
//! written to a new file there and fsynced (`rota_engine::archive`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use rota_engine::Shutdown;
use rota_engine::archive::Archive;
use rota_engine::ops::Operator;
use rota_engine::retention::Batches;
use rota_model::{Clock, SystemClock, TaskState, WorkflowName};
use rota_store::{AuditAction, Prune, PruneWorkflows};
use serde_json::json;

use crate::backend::{Backend, local_client, local_sender};
use crate::output::rfc3339;
use crate::store_args::StoreArgs;

/// Arguments of `prune`.
#[derive(clap::Args)]
pub struct Args {
    /// Delete the finished tasks that ended longer ago than this (e.g. 7d,
    /// 12h), whatever their workflow's `retention:` says.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    older_than: Duration,
    /// Only tasks in this finished state: processed, error, compensated or
    /// cancelled (repeat for several; default: all four). Unfinished tasks
    /// are never deleted.
    #[arg(long = "state", value_name = "STATE")]
    states: Vec<TaskState>,
    /// Only tasks of this workflow.
    #[arg(long, value_name = "NAME")]
    workflow: Option<WorkflowName>,
    /// Count the tasks that would be deleted; delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// The most tasks one batch deletes (one short transaction).
    #[arg(long, value_name = "N", default_value_t = 500)]
    batch: u32,
    /// The pause between two batches, which lets a running engine's writes through.
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = humantime::parse_duration)]
    pause: Duration,
    /// Write each batch to a new file in this directory (one task per
    /// line, the format of `rota export`), fsynced, before deleting it.
    /// Created if missing.
    #[arg(long, value_name = "DIR")]
    archive: Option<PathBuf>,
    /// Why, kept in the audit log (`rota audit`) with who pruned and how
    /// many tasks.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

/// Runs `rota prune`.
pub async fn run(store: &StoreArgs, args: Args) -> anyhow::Result<()> {
    store.local_only("prune")?;
    if let Some(state) = args.states.iter().find(|state| !state.is_terminal()) {
        bail!("--state {state}: only finished tasks are pruned (processed, error, compensated, cancelled)");
    }
    if !(1..=Prune::LIMIT_MAX).contains(&args.batch) {
        bail!("--batch must be between 1 and {}, got {}", Prune::LIMIT_MAX, args.batch);
    }
    let archive = match &args.archive {
        Some(dir) if !args.dry_run => Some(Archive::open(dir).map_err(|e| anyhow::anyhow!("--archive: {e}"))?),
        _ => None,
    };
    let Backend::Local(store) = store.backend().await? else { unreachable!("local_only refused --server") };
    let before = SystemClock.now().sub(args.older_than);
    let mut prune = Prune::finished_before(before, args.batch);
    if !args.states.is_empty() {
        prune.states = args.states.clone();
    }
    if let Some(workflow) = &args.workflow {
        prune.workflows = PruneWorkflows::Only(workflow.clone());
    }
    let what = describe(&args, &rfc3339(before));
    if args.dry_run {
        let count = store.count_prunable(&prune).await?;
        println!("would delete {count} {what}");
        return Ok(());
    }
    let batches = Batches { pause: args.pause, max: u32::MAX, archive: archive.as_ref(), clock: &SystemClock };
    let pass = rota_engine::retention::prune(&store, &prune, &batches, &Shutdown::new(), |pruned| {
        if !pruned.tasks.is_empty() {
            tracing::debug!("deleted a batch of {} task(s)", pruned.tasks.len());
        }
    })
    .await?;
    // The tasks' own operator history went with them: the prune stays
    // listed, with what it selected and deleted.
    let by = local_sender();
    let detail = json!({ "selected": what, "tasks": pass.tasks, "steps": pass.steps, "events": pass.events, "batches": pass.batches });
    local_client(&store)
        .record_action(AuditAction::Prune, Operator { by: &by, reason: args.reason.as_deref() }, "finished tasks", detail)
        .await?;
    println!("deleted {} {what}, with {} step(s) and {} event(s), in {} batch(es)", pass.tasks, pass.steps, pass.events, pass.batches);
    if let Some(archive) = &archive {
        println!("archived them to {}", archive.dir().display());
    }
    Ok(())
}

/// "finished task(s) [in STATES] [of workflow W] that ended before TIME".
fn describe(args: &Args, before: &str) -> String {
    let mut what = "finished task(s)".to_owned();
    if !args.states.is_empty() {
        let states: Vec<&str> = args.states.iter().map(|state| state.as_str()).collect();
        what.push_str(&format!(" in {}", states.join(", ")));
    }
    if let Some(workflow) = &args.workflow {
        what.push_str(&format!(" of workflow {workflow}"));
    }
    what.push_str(&format!(" that ended before {before}"));
    what
}
