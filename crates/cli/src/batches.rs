//! Bulk actions from the command line: `rota cancel` and `rota resubmit`
//! with filters instead of an id, `rota dlq redrive` with filters
//! (`crate::dlq`), and `rota batches` to list, show, stop and resume them.
//!
//! On a local store the command stores the batch and runs it here, a page
//! at a time, with a progress bar; if this process dies, the batch's lease
//! runs out and a `rota serve` Supervisor leader (or `rota batches resume`)
//! goes on from where it got. Through `--server`, the server's Supervisor
//! leader runs it and the command follows its progress.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::bail;
use indicatif::{ProgressBar, ProgressStyle};
use rota_api::wire::BatchView;
use rota_engine::Shutdown;
use rota_engine::batch::{self, Batches};
use rota_engine::ops::Operator;
use rota_model::TaskState;
use rota_store::{AuditAction, BatchAction, BatchFilter};

use crate::backend::{self, Backend, local_client, local_sender};
use crate::output;
use crate::store_args::StoreArgs;
use crate::tasks::FilterArgs;

/// How often a batch run by a server is read again.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);
/// How many of the selected tasks a dry run names.
const DRY_RUN_SHOWN: u32 = 10;

/// The flags of a bulk `cancel` or `resubmit`.
#[derive(clap::Args)]
pub struct BulkArgs {
    #[command(flatten)]
    pub filters: FilterArgs,
    /// Print how many tasks the filters select, and the first of them, and
    /// change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// How long this process holds the batch without progress before
    /// another runner (a `rota serve` Supervisor leader) takes it over.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub batch_lease: Duration,
}

/// `rota batches`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// List the latest batches, newest first.
    List {
        /// How many.
        #[arg(long, value_name = "N", default_value_t = 20)]
        limit: u32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a batch and how far it got.
    Show {
        /// The batch id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop a batch: the tasks it has not reached are left as they are.
    Stop {
        /// The batch id.
        id: String,
        /// Why, kept in the audit log with who did it.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Run a batch here from where it got (one whose runner died), on a
    /// local store; through --server, follow it.
    Resume {
        /// The batch id.
        id: String,
        /// How long this process holds the batch without progress.
        #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
        batch_lease: Duration,
    },
}

/// `rota cancel` or `rota resubmit` with filters.
pub async fn bulk(store: &StoreArgs, action: BatchAction, args: BulkArgs, reason: Option<&str>) -> anyhow::Result<()> {
    let mut filter = args.filters.filter(DRY_RUN_SHOWN)?;
    if filter.before.is_some() || filter.at_risk {
        bail!("--after and --at-risk do not apply to a bulk {action}");
    }
    if !filter.selects_something() {
        bail!("give the tasks to {action} by id, or by filters (--state, --workflow, --tag, a time, --id-prefix, --parent)");
    }
    if action == BatchAction::Resubmit && filter.state.is_none() {
        // Only a task in Error can be resubmitted.
        filter.state = Some(TaskState::Error);
    }
    let backend = store.backend().await?;
    if args.dry_run {
        let counts = backend.task_counts(&filter).await?;
        let first: Vec<String> = backend.tasks(filter).await?.into_iter().map(|task| task.id).collect();
        let more = if counts.total > first.len() as u64 { ", …" } else { "" };
        output::line(&format!("would {action} {} task(s): {}{more}", counts.total, first.join(", ")))?;
        return Ok(());
    }
    start(&backend, action, &BatchFilter::Tasks(filter), reason, args.batch_lease, false).await
}

/// Stores a batch of `action` on what `filter` selects and runs it here
/// (or follows the server's run) to its end, then reports it; with
/// `detach`, prints its id and leaves it to a Supervisor leader.
pub async fn start(
    backend: &Backend,
    action: BatchAction,
    filter: &BatchFilter,
    reason: Option<&str>,
    lease: Duration,
    detach: bool,
) -> anyhow::Result<()> {
    let created = backend.create_batch(action, filter, reason).await?;
    let what = if filter.is_dead_letters() { "dead letter(s)" } else { "task(s)" };
    eprintln!("batch {}: {action} {} {what}", created.id, created.total);
    if detach {
        eprintln!("a Supervisor leader (`rota serve`, `rota supervisor`) runs it; follow it with `rota batches show {}`", created.id);
        output::line(&created.id)?;
        return Ok(());
    }
    let finished = run_or_follow(backend, &created, lease).await?;
    report(&finished)
}

/// Runs the batch here on a local store (following it if another runner
/// holds it), or follows the server's run.
async fn run_or_follow(backend: &Backend, batch: &BatchView, lease: Duration) -> anyhow::Result<BatchView> {
    let bar = Bar::new(batch.total);
    let Backend::Local(store) = backend else { return follow(backend, &batch.id, &bar).await };
    let instance = crate::instance_id::from_flag(None)?;
    let runner = Batches::new(backend::local_client(store), instance, batch::Config { lease, ..batch::Config::default() });
    let shutdown = Shutdown::new();
    let interrupt = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                shutdown.trigger();
            }
        })
    };
    let ran = runner.run(Some(&batch.id), &shutdown, |record| bar.show(&BatchView::from(record))).await;
    interrupt.abort();
    match ran? {
        Some(record) if shutdown.is_triggered() && record.state == rota_store::BatchState::Running => {
            bar.finish();
            bail!(
                "interrupted: batch {} goes on from where it got in a `rota serve` Supervisor leader once its lease runs out, or with `rota batches resume {}`; `rota batches stop {}` stops it",
                batch.id,
                batch.id,
                batch.id
            )
        }
        Some(record) if record.state == rota_store::BatchState::Running => follow(backend, &batch.id, &bar).await,
        Some(record) => {
            bar.finish();
            Ok(BatchView::from(&record))
        }
        // Another runner holds it.
        None => follow(backend, &batch.id, &bar).await,
    }
}

/// Reads the batch again until it is no longer running.
async fn follow(backend: &Backend, id: &str, bar: &Bar) -> anyhow::Result<BatchView> {
    loop {
        let batch = backend.batch(id).await?;
        bar.show(&batch);
        if batch.state != "running" {
            bar.finish();
            return Ok(batch);
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

fn report(batch: &BatchView) -> anyhow::Result<()> {
    output::line(&format!(
        "batch {} {}: {} {}, {} skipped, {} failed{}",
        batch.id,
        batch.state,
        batch.done,
        past_tense(&batch.action),
        batch.skipped,
        batch.failed,
        batch.last_error.as_deref().map(|e| format!(" (last: {e})")).unwrap_or_default()
    ))?;
    if batch.failed > 0 || batch.state == "stopped" {
        bail!("batch {} {} with {} failure(s)", batch.id, batch.state, batch.failed);
    }
    Ok(())
}

fn past_tense(action: &str) -> &'static str {
    match action {
        "cancel" => "cancelled",
        "resubmit" => "resubmitted",
        "redrive" => "redriven",
        _ => "done",
    }
}

/// The progress shown on stderr: a bar on a terminal, a line per page
/// otherwise.
struct Bar {
    bar: Option<ProgressBar>,
}

impl Bar {
    fn new(total: u64) -> Bar {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            let style = ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}").unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar
        });
        Bar { bar }
    }

    fn show(&self, batch: &BatchView) {
        let handled = batch.done + batch.skipped + batch.failed;
        match &self.bar {
            Some(bar) => {
                bar.set_position(handled);
                bar.set_message(format!("{} skipped, {} failed", batch.skipped, batch.failed));
            }
            None => {
                eprintln!("batch {}: {handled} of {} handled ({} skipped, {} failed)", batch.id, batch.total, batch.skipped, batch.failed)
            }
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

/// `rota batches …`.
pub async fn run(store: StoreArgs, command: Command) -> anyhow::Result<()> {
    let backend = store.backend().await?;
    match command {
        Command::List { limit, json } => {
            let batches = backend.batches(limit).await?;
            if json {
                return output::json(&batches);
            }
            let rows: Vec<Vec<String>> = batches
                .iter()
                .map(|b| {
                    vec![
                        b.id.clone(),
                        b.action.clone(),
                        b.state.clone(),
                        format!("{}/{}", b.done + b.skipped + b.failed, b.total),
                        b.failed.to_string(),
                        b.requested_by.clone(),
                        output::rfc3339_millis(b.created_at),
                    ]
                })
                .collect();
            output::line(&output::table(&["ID", "ACTION", "STATE", "HANDLED", "FAILED", "BY", "CREATED"], &rows))?;
        }
        Command::Show { id, json } => {
            let batch = backend.batch(&id).await?;
            if json {
                return output::json(&batch);
            }
            output::line(&serde_json::to_string_pretty(&batch)?)?;
        }
        Command::Stop { id, reason } => {
            let batch = backend.stop_batch(&id, reason.as_deref()).await?;
            output::line(&batch.state)?;
        }
        Command::Resume { id, batch_lease } => {
            let batch = backend.batch(&id).await?;
            let finished = run_or_follow(&backend, &batch, batch_lease).await?;
            // Run here, the resume is this operator's; through a server,
            // the leader runs it and nothing is asked of it.
            if let Backend::Local(store) = &backend {
                let by = local_sender();
                let detail = serde_json::json!({ "state": finished.state, "done": finished.done, "total": finished.total });
                local_client(store).record_action(AuditAction::BatchResume, Operator { by: &by, reason: None }, &id, detail).await?;
            }
            report(&finished)?;
        }
    }
    Ok(())
}
