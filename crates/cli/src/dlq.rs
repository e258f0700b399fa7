//! `rota dlq …`: the dead-letter queues. An operator lists what was
//! dead-lettered and why, sends messages back to their queue with a fresh
//! delivery count (redrive), or deletes them (purge), on the store or, with
//! `--server`, through a server's HTTP API.

use rota_model::{MessageId, QueueName};
use rota_store::Redrive;

use crate::output::{self, DeadLetterJson};
use crate::store_args::StoreArgs;

/// How many dead letters `list` shows unless told otherwise.
const LIST_LIMIT_DEFAULT: u32 = 100;

/// `rota dlq …`
#[derive(clap::Subcommand)]
pub enum Command {
    /// List a queue's dead letters, oldest first, with the reason each was dead-lettered.
    List(ListArgs),
    /// Send dead letters back to their queue with a fresh delivery count; prints how many.
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
#[command(group(clap::ArgGroup::new("which").required(true).multiple(false)))]
pub struct RedriveArgs {
    /// The queue whose dead letters to send back.
    queue: QueueName,
    /// Only the dead letter with this message id.
    #[arg(long, value_name = "ID", group = "which")]
    id: Option<MessageId>,
    /// All of the queue's dead letters.
    #[arg(long, group = "which")]
    all: bool,
}

/// Arguments of `dlq purge`.
#[derive(clap::Args)]
pub struct PurgeArgs {
    /// The queue whose dead letters to delete.
    queue: QueueName,
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
    let which = match args.id {
        Some(id) => Redrive::One(id),
        None => {
            assert!(args.all, "clap requires --id or --all");
            Redrive::All
        }
    };
    let moved = store.backend().await?.redrive(&args.queue, which).await?;
    output::line(&moved.to_string())?;
    Ok(())
}

async fn purge(store: &StoreArgs, args: PurgeArgs) -> anyhow::Result<()> {
    let purged = store.backend().await?.purge(&args.queue).await?;
    output::line(&purged.to_string())?;
    Ok(())
}
