//! `rota dlq …`: the dead-letter queues. An operator lists what was
//! dead-lettered and why, sends messages back to their queue with a fresh
//! delivery count (redrive), or deletes them (purge), on the store or, with
//! `--server`, through a server's HTTP API.
//!
//! A redrive of one message (`--id`) or of all of them (`--all`) is one
//! statement, as it always was. A redrive with filters (the reason, when
//! they were dead-lettered) is a durable batch (`crate::batches`): it
//! shows its progress, survives a restart, and can be stopped.

use std::time::Duration;

use rota_model::{MessageId, QueueName, SystemClock};
use rota_store::{BatchAction, BatchFilter, DeadLetterFilter, Redrive, TimeRange};

use crate::output::{self, DeadLetterJson};
use crate::store_args::StoreArgs;
use crate::tasks::{TimeArg, parse_time_arg};

/// How many of the selected dead letters a dry run names.
const DRY_RUN_SHOWN: usize = 10;

/// How many dead letters `list` shows unless told otherwise.
const LIST_LIMIT_DEFAULT: u32 = 100;

/// `rota dlq …`
#[derive(clap::Subcommand)]
pub enum Command {
    /// List a queue's dead letters, oldest first, with the reason each was dead-lettered.
    List(ListArgs),
    /// Send dead letters back to their queue with a fresh delivery count:
    /// one (--id) or all (--all) at once, printing how many, or those the
    /// filters select as a durable batch.
    Redrive(RedriveArgs),
    /// Delete every dead letter of a queue; prints how many.
    Purge(PurgeArgs),
}

/// Arguments of `dlq list`.
#[derive(clap::Args)]
pub struct ListArgs {
    /// The queue whose dead letters to list.
    queue: QueueName,
    /// The most dead letters to show.
    #[arg(long, value_name = "N", default_value_t = LIST_LIMIT_DEFAULT, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    limit: u32,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

/// Arguments of `dlq redrive`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).multiple(true)))]
pub struct RedriveArgs {
    /// The queue whose dead letters to send back.
    queue: QueueName,
    /// Only the dead letter with this message id.
    #[arg(long, value_name = "ID", group = "which", conflicts_with_all = ["all", "reason_contains", "dead_lettered_after", "dead_lettered_before", "dry_run", "detach"])]
    id: Option<MessageId>,
    /// All of the queue's dead letters, in one statement (with --dry-run:
    /// how many, and the first).
    #[arg(long, group = "which", conflicts_with_all = ["reason_contains", "dead_lettered_after", "dead_lettered_before", "detach"])]
    all: bool,
    /// Only dead letters whose reason contains TEXT (case-sensitive); a
    /// filter makes the redrive a durable batch.
    #[arg(long, value_name = "TEXT", group = "which")]
    reason_contains: Option<String>,
    /// Only dead letters dead-lettered at or after TIME: RFC 3339
    /// (2026-11-28T09:00:00Z), or a duration ago (90m, 2h, 7d).
    #[arg(long, value_name = "TIME", group = "which", value_parser = parse_time_arg)]
    dead_lettered_after: Option<TimeArg>,
    /// Only dead letters dead-lettered before TIME (RFC 3339, or a duration
    /// ago).
    #[arg(long, value_name = "TIME", group = "which", value_parser = parse_time_arg)]
    dead_lettered_before: Option<TimeArg>,
    /// Print how many dead letters would be sent back, and the first of
    /// them with their reasons, and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Why, kept in the audit log with who did it (and with the batch, for
    /// a filtered redrive).
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
    /// Store the batch and return, printing its id: a Supervisor leader
    /// runs it.
    #[arg(long)]
    detach: bool,
    /// How long this process holds the batch without progress before
    /// another runner (a `rota serve` Supervisor leader) takes it over.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    batch_lease: Duration,
}

impl RedriveArgs {
    /// The filter the flags give (every dead letter of the queue with --all).
    fn filter(&self) -> anyhow::Result<DeadLetterFilter> {
        if self.reason_contains.as_ref().is_some_and(String::is_empty) {
            anyhow::bail!("--reason-contains: give the text to look for");
        }
        let now = rota_model::Clock::now(&SystemClock);
        let time = |arg: Option<TimeArg>| arg.map(|arg| arg.at(now));
        Ok(DeadLetterFilter {
            queue: self.queue.clone(),
            reason_contains: self.reason_contains.clone(),
            dead_lettered: TimeRange { from: time(self.dead_lettered_after), until: time(self.dead_lettered_before) },
        })
    }
}

/// Arguments of `dlq purge`.
#[derive(clap::Args)]
pub struct PurgeArgs {
    /// The queue whose dead letters to delete.
    queue: QueueName,
    /// Why, kept in the audit log with who did it.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

/// Runs one `rota dlq` subcommand.
pub async fn run(store: StoreArgs, command: Command) -> anyhow::Result<()> {
    match command {
        Command::List(args) => list(&store, args).await,
        Command::Redrive(args) => redrive(&store, args).await,
        Command::Purge(args) => purge(&store, args).await,
    }
}

async fn list(store: &StoreArgs, args: ListArgs) -> anyhow::Result<()> {
    let letters = store.backend().await?.dead_letters(&args.queue, args.limit).await?;
    if args.json {
        let json: Vec<DeadLetterJson> = letters.iter().map(DeadLetterJson::from).collect();
        return output::json(&json);
    }
    if letters.is_empty() {
        eprintln!("no dead letters in queue {}", args.queue);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = letters
        .iter()
        .map(|letter| {
            vec![
                letter.id.to_string(),
                letter.delivery_count.to_string(),
                output::rfc3339_millis(letter.dead_lettered_at),
                output::value_cell(&letter.body),
                letter.reason.clone(),
            ]
        })
        .collect();
    output::line(&output::table(&["ID", "DELIVERIES", "DEAD-LETTERED AT", "BODY", "REASON"], &rows))?;
    Ok(())
}

async fn redrive(store: &StoreArgs, args: RedriveArgs) -> anyhow::Result<()> {
    let backend = store.backend().await?;
    if let Some(id) = args.id {
        let moved = backend.redrive(&args.queue, Redrive::One(id), args.reason.as_deref()).await?;
        output::line(&moved.to_string())?;
        return Ok(());
    }
    let filter = args.filter()?;
    if args.dry_run {
        let (total, first) = backend.matching_dead_letters(&filter, DRY_RUN_SHOWN).await?;
        output::line(&format!("would redrive {total} dead letter(s) of queue {}", args.queue))?;
        let rows: Vec<Vec<String>> = first
            .iter()
            .map(|letter| vec![letter.id.clone(), output::rfc3339_millis(letter.dead_lettered_at), letter.reason.clone()])
            .collect();
        if !rows.is_empty() {
            output::line(&output::table(&["ID", "DEAD-LETTERED AT", "REASON"], &rows))?;
        }
        if total > first.len() as u64 {
            output::line("…")?;
        }
        return Ok(());
    }
    if args.all {
        let moved = backend.redrive(&args.queue, Redrive::All, args.reason.as_deref()).await?;
        output::line(&moved.to_string())?;
        return Ok(());
    }
    crate::batches::start(
        &backend,
        BatchAction::Redrive,
        &BatchFilter::DeadLetters(filter),
        args.reason.as_deref(),
        args.batch_lease,
        args.detach,
    )
    .await
}

async fn purge(store: &StoreArgs, args: PurgeArgs) -> anyhow::Result<()> {
    let purged = store.backend().await?.purge(&args.queue, args.reason.as_deref()).await?;
    output::line(&purged.to_string())?;
    Ok(())
}
