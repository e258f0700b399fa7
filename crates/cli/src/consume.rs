//! `rota queue consume`: a competing consumer that runs until SIGINT or
//! SIGTERM.
//!
//! It keeps at most `--max-concurrent` messages leased: it receives only as
//! many as it has free slots, so a crash strands at most that many leases,
//! each of which comes back when it expires. Every leased message is printed
//! as one JSON line on stdout. With `--exec CMD` it runs `sh -c CMD` with the
//! body on stdin, renewing the lease every third of its length while the
//! command runs, then completes the message on exit 0 and abandons it
//! otherwise (the reason names the exit code and the command's last stderr
//! line). Without `--exec` it completes each message once printed.
//!
//! A message with a reply address (`queue send --reply-to Q`) is answered:
//! the command's stdout (as JSON if it parses, else as a JSON string) is
//! sent to Q with the message's correlation id (its message id when it has
//! none), in the same commit that completes the message, so the answer is
//! sent once per completion. A failed command sends nothing.
//!
//! The first signal stops receiving and lets the running commands finish;
//! a second one kills them and abandons their messages.
//!
//! Delivery is at least once: a command may run again for the same message
//! after a crash or a lost lease, so commands should be idempotent (the
//! message id is in `ROTA_MESSAGE_ID`).
//!
//! Deliberately left out: prefetching, batching completes, and killing a
//! command whose lease was lost (it finishes; its outcome is dropped).

use crate::signals::Signals;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rota_model::{InstanceId, QueueName};
use rota_store::{Changes, Delivery, Outgoing, Receive, SharedStore};
use serde_json::value::RawValue;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tracing::{debug, warn};

use crate::output::{self, DeliveryJson};
use crate::store_args::StoreArgs;

/// How long one receive waits for a message; also bounds how long a stop
/// request waits for the receive loop.
const RECEIVE_WAIT: Duration = Duration::from_secs(1);
/// How long to wait before receiving again after a transient store error.
const RECEIVE_RETRY_DELAY: Duration = Duration::from_secs(1);
/// How long to wait, once a command has exited, for the rest of its stderr
/// (a background process it started may hold the pipe open).
const STDERR_DRAIN_TIMEOUT: Duration = Duration::from_millis(200);
/// The longest abandon reason kept, in characters.
const REASON_CHARS_MAX: usize = 1000;
/// The shortest renewal period, however short the lease.
const RENEW_PERIOD_MIN: Duration = Duration::from_millis(10);
/// The most output of a command kept as its reply, in bytes (the stores'
/// default bound on a message body); a command that writes more fails.
const REPLY_BYTES_MAX: usize = rota_store::BODY_BYTES_MAX;

/// Arguments of `queue consume`.
#[derive(clap::Args)]
pub struct Args {
    /// The queue.
    queue: QueueName,
    /// The most messages leased and handled at once.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(rota_store::RECEIVE_MAX)))]
    max_concurrent: u32,
    /// The lease length (the queue's default when absent); renewed every third of it while a command runs.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    lease: Option<Duration>,
    /// Run `sh -c CMD` for each message, body on stdin: exit 0 completes it, anything else abandons it.
    /// The command's stdout and stderr go to stderr; ROTA_QUEUE, ROTA_MESSAGE_ID and
    /// ROTA_DELIVERY_COUNT are set.
    #[arg(long, value_name = "CMD")]
    exec: Option<String>,
    /// Print each message and complete it (what happens without --exec).
    #[arg(long, conflicts_with = "exec")]
    print: bool,
    /// How long an abandoned message stays invisible before it is delivered again.
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = humantime::parse_duration)]
    retry_delay: Duration,
}

/// Runs the consumer until a signal stops it.
pub async fn run(store_args: &StoreArgs, args: Args) -> anyhow::Result<()> {
    debug_assert!(!(args.print && args.exec.is_some()), "clap refuses --print with --exec");
    if let Some(lease) = args.lease {
        crate::queue::check_lease_flag(lease)?;
    }
    // Listen before doing anything else, so that an early signal is a clean stop.
    let signals = Signals::new()?;
    let store = store_args.open().await?;
    let queue = args.queue;
    let lease = match args.lease {
        Some(lease) => lease,
        None => {
            let config = store.queue_config(&queue).await.with_context(|| format!("cannot read the settings of queue {queue}"))?;
            config.unwrap_or_default().lease
        }
    };
    let consumer = InstanceId::new(format!("rota-consume-{}", std::process::id())).expect("a valid instance id");
    let (stop_tx, stop) = watch::channel(false);
    let (abort_tx, abort) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    tokio::spawn(signals.forward(stop_tx.clone(), abort_tx));

    let handler = Arc::new(Handler {
        store: store.clone(),
        queue: queue.clone(),
        lease,
        exec: args.exec,
        retry_delay: args.retry_delay,
        stop: stop_tx,
    });
    let slots = Arc::new(Semaphore::new(args.max_concurrent as usize));
    let mut handlers = JoinSet::new();
    let mut stopping = stop.clone();
    let mut failure = None;
    while !*stopping.borrow() {
        while let Some(joined) = handlers.try_join_next() {
            propagate_panic(joined);
        }
        let first = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            _ = stopping.changed() => break,
        };
        // Ask for as many messages as there are free slots, never more: a
        // message leased beyond them would wait with its lease running.
        let max = 1 + u32::try_from(slots.available_permits()).expect("slots fit in u32");
        let request = Receive::up_to(max).leasing(lease).waiting(RECEIVE_WAIT).by(consumer.clone());
        match store.receive(&queue, request).await {
            Ok(deliveries) => {
                assert!(deliveries.len() <= max as usize, "receive returned {} messages, asked for at most {max}", deliveries.len());
                let mut first = Some(first);
                for delivery in deliveries {
                    let slot = first.take().unwrap_or_else(|| slots.clone().try_acquire_owned().expect("a slot per delivery"));
                    handlers.spawn(handler.clone().handle(delivery, slot, abort.clone()));
                }
            }
            Err(err) if err.is_retryable() => {
                warn!("cannot receive from queue {queue}, retrying: {err}");
                tokio::select! {
                    () = tokio::time::sleep(RECEIVE_RETRY_DELAY) => {}
                    _ = stopping.changed() => {}
                }
            }
            Err(err) => {
                failure = Some(anyhow::Error::new(err).context(format!("cannot receive from queue {queue}")));
                break;
            }
        }
    }
    if !handlers.is_empty() {
        eprintln!("rota: stopping; waiting for {} message(s) in progress (send another SIGINT or SIGTERM to abandon them)", handlers.len());
    }
    while let Some(joined) = handlers.join_next().await {
        propagate_panic(joined);
    }
    match failure {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

fn propagate_panic(joined: Result<(), tokio::task::JoinError>) {
    if let Err(err) = joined
        && err.is_panic()
    {
        std::panic::resume_unwind(err.into_panic());
    }
}

impl Signals {
    /// The first signal asks to stop receiving; the second to abort the
    /// commands in progress.
    async fn forward(mut self, stop: Arc<watch::Sender<bool>>, abort: watch::Sender<bool>) {
        self.next().await;
        stop.send_replace(true);
        self.next().await;
        abort.send_replace(true);
    }
}

/// What the consumer does with one leased message.
struct Handler {
    store: SharedStore,
    queue: QueueName,
    lease: Duration,
    exec: Option<String>,
    retry_delay: Duration,
    /// Set when stdout is gone: printing is the point of the consumer.
    stop: Arc<watch::Sender<bool>>,
}

/// How handling a message ended.
enum Outcome {
    /// Handled: complete it (and send the reply, if it asked for one).
    Done(Option<(QueueName, Outgoing)>),
    /// Not handled: abandon it with this reason.
    Failed(String),
    /// Its lease was lost while its command ran: someone else may hold it now.
    LeaseLost,
}

impl Handler {
    async fn handle(self: Arc<Self>, delivery: Delivery, _slot: OwnedSemaphorePermit, abort: watch::Receiver<bool>) {
        let json = serde_json::to_string(&DeliveryJson::from(&delivery)).expect("a delivery serializes");
        let outcome = match output::line(&json) {
            Err(err) => {
                warn!("cannot print message {}, stopping: {err}", delivery.id);
                self.stop.send_replace(true);
                Outcome::Failed(format!("consumer could not print the message: {err}"))
            }
            Ok(()) => match &self.exec {
                None => Outcome::Done(None),
                Some(command) => self.execute(command, &delivery, abort).await,
            },
        };
        let (id, token) = (&delivery.id, delivery.lease_token);
        let settled = match outcome {
            Outcome::Done(None) => self.store.complete(&self.queue, token).await,
            Outcome::Done(Some(reply)) => {
                let changes = Changes { send: vec![reply], complete: vec![(self.queue.clone(), token)], ..Changes::default() };
                self.store.commit(changes).await
            }
            Outcome::Failed(reason) => {
                debug!("abandoning message {id}: {reason}");
                self.store.abandon(&self.queue, token, self.retry_delay, Some(reason)).await
            }
            Outcome::LeaseLost => return,
        };
        match settled {
            Ok(()) => {}
            Err(err) if err.is_lost_race() => warn!("message {id} of queue {}: {err}; it will be delivered again", self.queue),
            Err(err) => {
                warn!("cannot settle message {id} of queue {}: {err}; it will be delivered again when its lease expires", self.queue)
            }
        }
    }

    /// Runs the command for one message, renewing its lease until it exits.
    async fn execute(&self, command: &str, delivery: &Delivery, mut abort: watch::Receiver<bool>) -> Outcome {
        let mut child = match Command::new("sh")
            .arg("-c")
            .arg(command)
            .env("ROTA_QUEUE", self.queue.as_str())
            .env("ROTA_MESSAGE_ID", delivery.id.as_str())
            .env("ROTA_DELIVERY_COUNT", delivery.delivery_count.to_string())
            .stdin(Stdio::piped())
            // Our stdout carries only the JSON lines; the command's is its
            // reply when one is asked for, else it goes to our stderr.
            .stdout(if delivery.reply_to.is_some() { Stdio::piped() } else { Stdio::from(std::io::stderr()) })
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
        {
            Ok(child) => child,
            Err(err) => return Outcome::Failed(format!("cannot start sh -c {command:?}: {err}")),
        };
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let body = delivery.body.get().to_owned();
        // A command that does not read its stdin may exit first: that is fine.
        let feeder = tokio::spawn(async move {
            let _ = stdin.write_all(body.as_bytes()).await;
        });
        let stderr = child.stderr.take().expect("stderr is piped");
        let last_stderr_line = tokio::spawn(echo_stderr(stderr));
        let output = child.stdout.take().map(|stdout| tokio::spawn(read_reply(stdout)));

        let token = delivery.lease_token;
        let period = (self.lease / 3).max(RENEW_PERIOD_MIN);
        let mut renewal = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        renewal.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut lease_lost = false;
        let waited = loop {
            tokio::select! {
                status = child.wait() => break status,
                _ = renewal.tick(), if !lease_lost => match self.store.renew(&self.queue, token, Some(self.lease)).await {
                    Ok(until) => debug!("renewed the lease of message {} until {until}", delivery.id),
                    Err(err) if err.is_lost_race() => {
                        warn!("message {} of queue {}: {err}; its command keeps running but its outcome will be dropped", delivery.id, self.queue);
                        lease_lost = true;
                    }
                    Err(err) => warn!("cannot renew the lease of message {}, will retry: {err}", delivery.id),
                },
                Ok(()) = abort.changed() => {
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                    feeder.abort();
                    return Outcome::Failed("the consumer stopped before the command finished".to_owned());
                }
            }
        };
        feeder.abort();
        let last_line = match tokio::time::timeout(STDERR_DRAIN_TIMEOUT, last_stderr_line).await {
            Ok(Ok(line)) => line,
            _ => String::new(),
        };
        if lease_lost {
            return Outcome::LeaseLost;
        }
        match waited {
            Ok(status) if status.success() => match (output, &delivery.reply_to) {
                (Some(output), Some(reply_to)) => match output.await {
                    Ok(Ok(bytes)) => Outcome::Done(Some((reply_to.clone(), reply(delivery, &bytes)))),
                    Ok(Err(why)) => Outcome::Failed(why),
                    Err(err) => Outcome::Failed(format!("cannot read the command's output: {err}")),
                },
                _ => Outcome::Done(None),
            },
            Ok(status) => Outcome::Failed(failure_reason(status, &last_line)),
            Err(err) => Outcome::Failed(format!("cannot wait for sh -c {command:?}: {err}")),
        }
    }
}

/// Reads a command's stdout to its end, up to [`REPLY_BYTES_MAX`].
async fn read_reply(stdout: tokio::process::ChildStdout) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    let mut limited = stdout.take(REPLY_BYTES_MAX as u64 + 1);
    limited.read_to_end(&mut bytes).await.map_err(|err| format!("cannot read the command's output: {err}"))?;
    if bytes.len() > REPLY_BYTES_MAX {
        return Err(format!("the command's output is over {REPLY_BYTES_MAX} bytes, too large for a reply"));
    }
    Ok(bytes)
}

/// The answer to `request`: `output` as JSON if it parses, else as a JSON
/// string, with the request's correlation id (its message id without one).
fn reply(request: &Delivery, output: &[u8]) -> Outgoing {
    let text = String::from_utf8_lossy(output);
    let trimmed = text.trim();
    let body = match serde_json::from_str::<serde_json::Value>(trimmed) {
        Ok(_) if !trimmed.is_empty() => RawValue::from_string(trimmed.to_owned()).expect("it parsed as JSON"),
        _ => serde_json::value::to_raw_value(text.trim_end_matches('\n')).expect("a string serializes"),
    };
    let correlation_id = request.correlation_id.clone().unwrap_or_else(|| request.id.to_string());
    Outgoing::new(body).with_correlation_id(correlation_id)
}

/// Copies a command's stderr to ours, line by line, and returns its last
/// non-blank line.
async fn echo_stderr(stderr: tokio::process::ChildStderr) -> String {
    let mut reader = BufReader::new(stderr);
    let mut buffer = Vec::new();
    let mut last = String::new();
    loop {
        buffer.clear();
        match reader.read_until(b'\n', &mut buffer).await {
            Ok(0) | Err(_) => return last,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buffer);
                let line = line.trim_end_matches(['\n', '\r']);
                eprintln!("{line}");
                if !line.trim().is_empty() {
                    line.clone_into(&mut last);
                }
            }
        }
    }
}

/// "exit code N: <last stderr line>", or "killed by signal N: …".
fn failure_reason(status: ExitStatus, last_stderr_line: &str) -> String {
    let how = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => format!("{status}"),
    };
    let reason = if last_stderr_line.trim().is_empty() { how } else { format!("{how}: {}", last_stderr_line.trim()) };
    reason.chars().take(REASON_CHARS_MAX).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_name_the_exit_and_the_last_stderr_line() {
        assert_eq!(failure_reason(ExitStatus::from_raw(3 << 8), "  boom \n"), "exit code 3: boom");
        assert_eq!(failure_reason(ExitStatus::from_raw(1 << 8), ""), "exit code 1");
        assert_eq!(failure_reason(ExitStatus::from_raw(9), "x"), "killed by signal 9: x");
        assert_eq!(failure_reason(ExitStatus::from_raw(1 << 8), &"e".repeat(5000)).chars().count(), REASON_CHARS_MAX);
    }
}
