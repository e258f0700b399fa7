//! `rota audit`: every operator action, newest first, with who did it and
//! why, on the store or, with `--server`, through a server's HTTP API.

use rota_model::{Clock, SystemClock};
use rota_store::{AuditAction, AuditCursor};

use crate::backend::AuditQuery;
use crate::output;
use crate::store_args::StoreArgs;
use crate::tasks::{TimeArg, parse_time_arg};

/// The most entries one page may list.
const LIMIT_MAX: u32 = rota_store::audit::AUDIT_LIMIT_MAX;

/// Arguments of `audit`.
#[derive(clap::Args)]
pub struct Args {
    /// Only actions at or after TIME: RFC 3339 (2026-11-28T09:00:00Z), or a
    /// duration ago (90m, 2h, 7d).
    #[arg(long, value_name = "TIME", value_parser = parse_time_arg)]
    since: Option<TimeArg>,
    /// Only this action (task.cancel, task.resubmit, task.pause, task.resume,
    /// task.signal, queue.pause, queue.resume, dlq.redrive, dlq.purge,
    /// prune, workflow.pause, workflow.resume, schedule.pause,
    /// schedule.resume, schedule.trigger, schedule.delete, batch.create,
    /// batch.stop, batch.resume).
    #[arg(long, value_name = "ACTION")]
    action: Option<AuditAction>,
    /// Only actions by exactly WHO (a token's name; `cli, user NAME`).
    #[arg(long, value_name = "WHO")]
    by: Option<String>,
    /// The most actions to list, newest first.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=i64::from(LIMIT_MAX)))]
    limit: u32,
    /// Only actions older than CURSOR: the last CURSOR of the previous page.
    #[arg(long, value_name = "CURSOR")]
    after: Option<AuditCursor>,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `rota audit`.
pub async fn run(store: &StoreArgs, args: Args) -> anyhow::Result<()> {
    if args.by.as_deref().is_some_and(str::is_empty) {
        anyhow::bail!("--by must not be empty");
    }
    let query = AuditQuery {
        since: args.since.map(|since| since.at(SystemClock.now())),
        action: args.action,
        by: args.by,
        after: args.after,
        limit: args.limit,
    };
    let entries = store.backend().await?.audit(&query).await?;
    if args.json {
        return output::json(&entries);
    }
    if entries.is_empty() {
        eprintln!("no operator actions");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|entry| {
            vec![
                output::rfc3339_millis(entry.at),
                entry.action.clone(),
                entry.target.clone(),
                entry.by.clone(),
                entry.reason.clone().unwrap_or_default().replace('\n', " "),
                output::value_cell(&entry.detail),
                entry.cursor.clone(),
            ]
        })
        .collect();
    output::line(&output::table(&["TIME", "ACTION", "TARGET", "BY", "REASON", "DETAIL", "CURSOR"], &rows))?;
    Ok(())
}
