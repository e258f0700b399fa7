//! `rota queue …`: send, receive and settle messages, create, pause and
//! inspect queues. Each subcommand is one function that checks its
//! arguments, opens the store, makes one store call (or, for
//! `send --lines`, a stream of them) and prints the result.
//!
//! The long-running consumer lives in `consume`; dead letters in `dlq`.
//!
//! `stats`, `pause` and `resume` also work against a server's HTTP API
//! (`--server`); the others move messages and leases, which the API does not
//! offer, and work only on a local store.

use std::time::Duration;

use anyhow::{Context, anyhow};
use rota_model::{LeaseToken, MessageId, QueueName};
use rota_store::{Body, Outgoing, QueueConfig, RECEIVE_MAX, Receive, SharedStore};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinSet;

use crate::consume;
use crate::output::{self, DeliveryJson, StatsJson};
use crate::store_args::StoreArgs;

/// How many sends `send --lines` keeps in flight unless told otherwise.
const SEND_LANES_DEFAULT: u32 = 16;
/// The most sends `send --lines` may keep in flight.
const SEND_LANES_MAX: u32 = 1024;

/// `rota queue …`
#[derive(clap::Subcommand)]
pub enum Command {
    /// Send a message (or, with --lines, one per line of stdin); prints the message id.
    Send(SendArgs),
    /// Lease ready messages and print them with their lease tokens.
    Receive(ReceiveArgs),
    /// Complete a leased message: it was handled and is deleted.
    Complete(TokenArgs),
    /// Give a leased message back, to be delivered again (or dead-lettered once its deliveries are used up).
    Abandon(AbandonArgs),
    /// Extend a lease; prints the new expiry.
    Renew(RenewArgs),
    /// Move a leased message to the dead-letter queue at once (a poison message).
    DeadLetter(DeadLetterArgs),
    /// Create a queue, or change the given settings of an existing one.
    Create(CreateArgs),
    /// Stop deliveries from a queue (sends still succeed).
    Pause(QueueActionArgs),
    /// Resume deliveries from a paused queue.
    Resume(QueueActionArgs),
    /// Show counts per queue: ready, leased, delayed, dead-lettered, paused.
    Stats(StatsArgs),
    /// Run a competing consumer until SIGINT or SIGTERM.
    Consume(consume::Args),
}

/// Arguments of `queue send`.
#[derive(clap::Args)]
pub struct SendArgs {
    /// The queue (created with default settings if it does not exist).
    queue: QueueName,
    /// The message body, a JSON document.
    #[arg(long, value_name = "JSON", required_unless_present = "lines", conflicts_with = "lines")]
    body: Option<String>,
    /// Read newline-delimited JSON bodies from stdin and send each; prints each
    /// message id as soon as its send is durable (not necessarily in input order).
    #[arg(long)]
    lines: bool,
    /// How many sends to keep in flight with --lines [default: 16; 1 when --key is given, to keep line order].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(SEND_LANES_MAX)))]
    lanes: Option<u32>,
    /// The message id, for duplicate detection (assigned by the store when absent).
    #[arg(long, value_name = "ID", conflicts_with = "lines")]
    id: Option<MessageId>,
    /// Keep the message invisible for this long after sending (e.g. 5s, 250ms, 10m).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = humantime::parse_duration)]
    delay: Duration,
    /// An ordering key: messages with the same key are delivered in send order, one at a time.
    #[arg(long, value_name = "KEY")]
    key: Option<String>,
    /// A reply address: the queue the receiver should answer to (`queue
    /// consume --exec` sends the command's output there).
    #[arg(long, value_name = "QUEUE", conflicts_with = "lines")]
    reply_to: Option<QueueName>,
    /// What the answer should carry to be matched with this message (1 to
    /// 200 bytes) [default: none, and `consume --exec` answers with the
    /// message id].
    #[arg(long, value_name = "ID", requires = "reply_to")]
    correlation_id: Option<String>,
}

/// Arguments of `queue receive`.
#[derive(clap::Args)]
pub struct ReceiveArgs {
    /// The queue.
    queue: QueueName,
    /// The most messages to lease.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(RECEIVE_MAX)))]
    max: u32,
    /// The lease length (the queue's default when absent).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    lease: Option<Duration>,
    /// How long to wait for a first message when none is ready.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = humantime::parse_duration)]
    wait: Duration,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

/// A queue and a lease token.
#[derive(clap::Args)]
pub struct TokenArgs {
    /// The queue.
    queue: QueueName,
    /// The lease token printed by `receive` (<message>.<epoch>).
    token: LeaseToken,
}

/// Arguments of `queue abandon`.
#[derive(clap::Args)]
pub struct AbandonArgs {
    #[command(flatten)]
    target: TokenArgs,
    /// Keep the message invisible for this long before it is delivered again.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = humantime::parse_duration)]
    delay: Duration,
    /// Why it was given back (kept if the message ends up dead-lettered).
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

/// Arguments of `queue renew`.
#[derive(clap::Args)]
pub struct RenewArgs {
    #[command(flatten)]
    target: TokenArgs,
    /// The new lease length, from now (the queue's default when absent).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    lease: Option<Duration>,
}

/// Arguments of `queue dead-letter`.
#[derive(clap::Args)]
pub struct DeadLetterArgs {
    #[command(flatten)]
    target: TokenArgs,
    /// Why (kept with the dead letter).
    #[arg(long, value_name = "TEXT")]
    reason: String,
}

/// Arguments of `queue create`.
#[derive(clap::Args)]
pub struct CreateArgs {
    /// The queue.
    queue: QueueName,
    /// How long a receive leases a message unless it asks otherwise [default for a new queue: 30s].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    lease: Option<Duration>,
    /// How many deliveries a message gets before it is dead-lettered [default for a new queue: 10].
    #[arg(long, value_name = "N")]
    max_deliveries: Option<u32>,
    /// How long a message id is remembered to drop duplicate sends [default for a new queue: 10m].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    dedupe_window: Option<Duration>,
}

/// Just a queue.
#[derive(clap::Args)]
pub struct QueueArg {
    /// The queue.
    queue: QueueName,
}

/// Arguments of `queue pause` and `queue resume`.
#[derive(clap::Args)]
pub struct QueueActionArgs {
    /// The queue.
    queue: QueueName,
    /// Why, kept in the audit log with who did it.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

/// Arguments of `queue stats`.
#[derive(clap::Args)]
pub struct StatsArgs {
    /// Only this queue (all queues when absent).
    queue: Option<QueueName>,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs one `rota queue` subcommand.
pub async fn run(store: StoreArgs, command: Command) -> anyhow::Result<()> {
    let remote_capable = matches!(command, Command::Stats(_) | Command::Pause(_) | Command::Resume(_));
    if !remote_capable {
        store.local_only(&format!("queue {}", command.name()))?;
    }
    match command {
        Command::Send(args) if args.lines => send_lines(&store, args).await,
        Command::Send(args) => send(&store, args).await,
        Command::Receive(args) => receive(&store, args).await,
        Command::Complete(args) => complete(&store, args).await,
        Command::Abandon(args) => abandon(&store, args).await,
        Command::Renew(args) => renew(&store, args).await,
        Command::DeadLetter(args) => dead_letter(&store, args).await,
        Command::Create(args) => create(&store, args).await,
        Command::Pause(args) => pause(&store, args).await,
        Command::Resume(args) => resume(&store, args).await,
        Command::Stats(args) => stats(&store, args).await,
        Command::Consume(args) => consume::run(&store, args).await,
    }
}

impl Command {
    /// The subcommand's name, as typed.
    fn name(&self) -> &'static str {
        match self {
            Command::Send(_) => "send",
            Command::Receive(_) => "receive",
            Command::Complete(_) => "complete",
            Command::Abandon(_) => "abandon",
            Command::Renew(_) => "renew",
            Command::DeadLetter(_) => "dead-letter",
            Command::Create(_) => "create",
            Command::Pause(_) => "pause",
            Command::Resume(_) => "resume",
            Command::Stats(_) => "stats",
            Command::Consume(_) => "consume",
        }
    }
}

/// A `store::Error` from an operation on a lease, with `LeaseLost` spelled
/// out for an operator who may have pasted an old token.
pub fn lease_error(err: rota_store::Error, queue: &QueueName, token: LeaseToken) -> anyhow::Error {
    match err {
        rota_store::Error::LeaseLost(detail) => {
            tracing::debug!("lease lost: {detail}");
            anyhow!(
                "lease lost: token {token} in queue {queue} is unknown, expired, or already completed (or the message was delivered again since)"
            )
        }
        other => anyhow::Error::new(other).context(format!("queue {queue}, lease {token}")),
    }
}

/// Checks a `--lease` flag against the store's bounds, naming the flag.
pub fn check_lease_flag(lease: Duration) -> anyhow::Result<()> {
    let min = Duration::from_millis(1);
    anyhow::ensure!(
        (min..=QueueConfig::LEASE_MAX).contains(&lease),
        "--lease must be between 1ms and {}h, got {}",
        QueueConfig::LEASE_MAX.as_secs() / 3600,
        humantime::format_duration(lease)
    );
    Ok(())
}

/// Parses a `--body`. serde_json's message ends with the line and column.
fn parse_body(text: &str) -> anyhow::Result<Body> {
    serde_json::from_str::<Body>(text).map_err(|err| anyhow!("--body is not valid JSON: {err}"))
}

/// Parses line `number` of `send --lines`' stdin; the error names the line
/// and the column.
fn parse_line(number: usize, text: &str) -> anyhow::Result<Body> {
    serde_json::from_str::<Body>(text).map_err(|err| {
        // Each body is one line, so serde_json's "at line 1 column N" becomes "column N".
        let position = format!(" at line {} column {}", err.line(), err.column());
        let message = err.to_string();
        let message = message.strip_suffix(&position).unwrap_or(&message);
        anyhow!("stdin line {number} is not valid JSON: {message} at column {}; nothing after it was sent", err.column())
    })
}

async fn send(store: &StoreArgs, args: SendArgs) -> anyhow::Result<()> {
    // clap's `requires` cannot see that a flag is absent (it defaults to false).
    anyhow::ensure!(args.lanes.is_none(), "--lanes only applies with --lines");
    let text = args.body.as_deref().expect("clap requires --body without --lines");
    let mut message = Outgoing::new(parse_body(text)?).with_delay(args.delay);
    message.id = args.id;
    message.ordering_key = args.key;
    message.reply_to = args.reply_to;
    message.correlation_id = args.correlation_id;
    let store = store.open().await?;
    let sent = store.send(&args.queue, message).await.with_context(|| format!("cannot send to queue {}", args.queue))?;
    output::line(sent.id.as_str())?;
    if sent.duplicate {
        eprintln!(
            "(duplicate) message id {} was already sent to {} within its duplicate-detection window; nothing was added",
            sent.id, args.queue
        );
    }
    Ok(())
}

/// `send --lines`: reads bodies from stdin and keeps up to `--lanes` sends in
/// flight, printing each message id once its send is durable. A line that is
/// not JSON, or a send that fails, stops the reading: the sends already in
/// flight finish (and are printed), nothing after the line is sent.
async fn send_lines(store: &StoreArgs, args: SendArgs) -> anyhow::Result<()> {
    // Concurrent sends may commit in any order; an ordering key promises send
    // order, so with one the lines go one at a time.
    let lanes = if args.key.is_some() { 1 } else { args.lanes.unwrap_or(SEND_LANES_DEFAULT) as usize };
    let store: SharedStore = store.open().await?;
    let queue = args.queue;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut in_flight: JoinSet<(usize, rota_store::Result<MessageId>)> = JoinSet::new();
    let mut line_number = 0;
    let mut eof = false;
    let mut failure: Option<anyhow::Error> = None;
    loop {
        let reading = !eof && failure.is_none();
        if !reading && in_flight.is_empty() {
            break;
        }
        tokio::select! {
            Some(joined) = in_flight.join_next(), if !in_flight.is_empty() => {
                let (number, result) = joined.expect("send futures do not panic");
                match result {
                    Ok(id) => output::line(id.as_str()).context("cannot write to stdout")?,
                    Err(err) => {
                        let err = anyhow::Error::new(err).context(format!("stdin line {number}: cannot send to queue {queue}; nothing after it was sent"));
                        failure.get_or_insert(err);
                    }
                }
            }
            next = lines.next_line(), if reading && in_flight.len() < lanes => {
                let text = match next {
                    Ok(Some(text)) => text,
                    Ok(None) => {
                        eof = true;
                        continue;
                    }
                    Err(err) => {
                        failure = Some(anyhow!("cannot read stdin after line {line_number}: {err}"));
                        continue;
                    }
                };
                line_number += 1;
                if text.trim().is_empty() {
                    continue;
                }
                let body = match parse_line(line_number, &text) {
                    Ok(body) => body,
                    Err(err) => {
                        failure = Some(err);
                        continue;
                    }
                };
                let mut message = Outgoing::new(body).with_delay(args.delay);
                message.ordering_key.clone_from(&args.key);
                let (store, queue, number) = (store.clone(), queue.clone(), line_number);
                in_flight.spawn(async move { (number, store.send(&queue, message).await.map(|sent| sent.id)) });
            }
            else => break,
        }
    }
    match failure {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

async fn receive(store: &StoreArgs, args: ReceiveArgs) -> anyhow::Result<()> {
    if let Some(lease) = args.lease {
        check_lease_flag(lease)?;
    }
    let mut request = Receive::up_to(args.max).waiting(args.wait);
    request.lease = args.lease;
    let store = store.open().await?;
    let deliveries = store.receive(&args.queue, request).await.with_context(|| format!("cannot receive from queue {}", args.queue))?;
    if args.json {
        let json: Vec<DeliveryJson> = deliveries.iter().map(DeliveryJson::from).collect();
        return output::json(&json);
    }
    if deliveries.is_empty() {
        eprintln!("no message ready in queue {}", args.queue);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = deliveries
        .iter()
        .map(|delivery| {
            vec![
                delivery.id.to_string(),
                delivery.lease_token.to_string(),
                delivery.delivery_count.to_string(),
                output::rfc3339(delivery.lease_until),
                delivery.ordering_key.clone().unwrap_or_default(),
                output::body_cell(&delivery.body),
            ]
        })
        .collect();
    output::line(&output::table(&["ID", "LEASE TOKEN", "DELIVERY", "LEASED UNTIL", "KEY", "BODY"], &rows))?;
    Ok(())
}

async fn complete(store: &StoreArgs, args: TokenArgs) -> anyhow::Result<()> {
    let store = store.open().await?;
    store.complete(&args.queue, args.token).await.map_err(|err| lease_error(err, &args.queue, args.token))
}

async fn abandon(store: &StoreArgs, args: AbandonArgs) -> anyhow::Result<()> {
    let TokenArgs { queue, token } = args.target;
    let store = store.open().await?;
    store.abandon(&queue, token, args.delay, args.reason).await.map_err(|err| lease_error(err, &queue, token))
}

async fn renew(store: &StoreArgs, args: RenewArgs) -> anyhow::Result<()> {
    let TokenArgs { queue, token } = args.target;
    if let Some(lease) = args.lease {
        check_lease_flag(lease)?;
    }
    let store = store.open().await?;
    let until = store.renew(&queue, token, args.lease).await.map_err(|err| lease_error(err, &queue, token))?;
    output::line(&output::rfc3339(until))?;
    Ok(())
}

async fn dead_letter(store: &StoreArgs, args: DeadLetterArgs) -> anyhow::Result<()> {
    let TokenArgs { queue, token } = args.target;
    let store = store.open().await?;
    store.dead_letter(&queue, token, args.reason).await.map_err(|err| lease_error(err, &queue, token))
}

async fn create(store: &StoreArgs, args: CreateArgs) -> anyhow::Result<()> {
    let store = store.open().await?;
    let existing = store.queue_config(&args.queue).await.with_context(|| format!("cannot read the settings of queue {}", args.queue))?;
    let mut config = existing.unwrap_or_default();
    if let Some(lease) = args.lease {
        config.lease = lease;
    }
    if let Some(deliveries_max) = args.max_deliveries {
        config.deliveries_max = deliveries_max;
    }
    if let Some(dedupe_window) = args.dedupe_window {
        config.dedupe_window = dedupe_window;
    }
    validate_config(&config)?;
    store.create_queue(&args.queue, config).await.with_context(|| format!("cannot create queue {}", args.queue))
}

/// Checks queue settings, naming the flag rather than the field.
fn validate_config(config: &QueueConfig) -> anyhow::Result<()> {
    config.validate().map_err(|err| {
        let message = err.to_string().replace("deliveries_max", "--max-deliveries").replace("dedupe_window", "--dedupe-window");
        let message = message.strip_prefix("invalid request: ").unwrap_or(&message);
        let message = if message.starts_with("lease") { format!("--{message}") } else { message.to_owned() };
        anyhow!("{message}")
    })
}

async fn pause(store: &StoreArgs, args: QueueActionArgs) -> anyhow::Result<()> {
    store.backend().await?.pause(&args.queue, args.reason.as_deref()).await
}

async fn resume(store: &StoreArgs, args: QueueActionArgs) -> anyhow::Result<()> {
    store.backend().await?.resume(&args.queue, args.reason.as_deref()).await
}

async fn stats(store: &StoreArgs, args: StatsArgs) -> anyhow::Result<()> {
    let mut all = store.backend().await?.queues().await?;
    if let Some(queue) = &args.queue {
        all.retain(|stats| stats.queue == queue.as_str());
    }
    if args.json {
        let json: Vec<StatsJson> = all.iter().map(StatsJson::from).collect();
        return output::json(&json);
    }
    if all.is_empty() {
        eprintln!("no queues");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|stats| {
            vec![
                stats.queue.to_string(),
                stats.ready.to_string(),
                stats.leased.to_string(),
                stats.delayed.to_string(),
                stats.dead_lettered.to_string(),
                if stats.paused { "yes" } else { "no" }.to_owned(),
                stats.oldest_ready_at.map(output::rfc3339_millis).unwrap_or_default(),
            ]
        })
        .collect();
    output::line(&output::table(&["QUEUE", "READY", "LEASED", "DELAYED", "DEAD-LETTERED", "PAUSED", "OLDEST READY"], &rows))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_line_names_its_number_and_column() {
        let err = parse_line(17, r#"{"i": 1,}"#).unwrap_err().to_string();
        assert!(err.starts_with("stdin line 17 is not valid JSON: key must be a string at column 9"), "{err}");
        assert!(parse_line(1, r#"{"i": 1}"#).is_ok());
    }

    #[test]
    fn a_bad_body_keeps_serde_json_position() {
        let err = parse_body("{\"a\": }").unwrap_err().to_string();
        assert_eq!(err, "--body is not valid JSON: expected value at line 1 column 7");
    }

    #[test]
    fn queue_settings_errors_name_the_flag() {
        let config = QueueConfig { deliveries_max: 0, ..QueueConfig::default() };
        let err = validate_config(&config).unwrap_err().to_string();
        assert!(err.starts_with("--max-deliveries must be between 1 and"), "{err}");
        let config = QueueConfig { lease: Duration::ZERO, ..QueueConfig::default() };
        let err = validate_config(&config).unwrap_err().to_string();
        assert!(err.starts_with("--lease must be between"), "{err}");
    }
}
