//! Callback steps: an agent step whose agent only hands the work to a
//! remote service, which completes the step later by presenting the
//! attempt's one-time token (`POST /v1/callbacks/{token}`).
//!
//! The token names its task, step and attempt, and carries a secret: the
//! HMAC of those under the Scheduler's callback key. Only the SHA-256 of
//! the secret is stored (the step's `callback_digest`), so neither the
//! store's rows nor the step input shown to readers (rendered with a
//! placeholder where the template uses `{{ callback.token }}`) can
//! complete a step; the token itself travels only in the agent's request.
//!
//! A callback is taken like a signal: one commit, a compare-and-set on the
//! task's state and lease epoch (which it bumps) and on the step's state
//! and attempt, so a Scheduler deciding on the task at the same moment
//! loses and decides again on a fresh read. It is refused, changing
//! nothing, unless the step is running the token's attempt, the token is
//! unused and the attempt's complete-by is ahead:
//! - a success completes the step in that commit (with the callback's
//!   output) and wakes the task's holder, as a signal does;
//! - a failure clears the digest (the token is used) and hands the holder
//!   the failure as the attempt's reply, so that the workflow's retry and
//!   `max_failures` rules apply as to any agent's failure. A task without a
//!   holder at that moment is taken over later and its step runs again as a
//!   new attempt, as for any attempt in flight.

use hmac::{Hmac, KeyInit, Mac};
use rota_model::{StepName, StepState, Task, TaskId, TaskState};
use rota_store::{Changes, Event, EventKind, Outgoing, StepWrite, TaskRecord, TaskWrite};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::client::Client;
use crate::ops::{Error, Result};
use crate::protocol::{self, InboxEnvelope, InboxMessage, Reply, ReplyOutcome};

/// The largest callback output accepted, in bytes of JSON; it becomes the
/// step's output, read by later steps' templates.
pub const OUTPUT_BYTES_MAX: usize = 1024 * 1024;

/// The longest error text a failed callback keeps, in bytes; a longer one
/// is cut at a character boundary.
pub const ERROR_BYTES_MAX: usize = 4 * 1024;

/// What the stored input shows where the template used the token.
pub const TOKEN_PLACEHOLDER: &str = "[callback token]";

/// The secret's length in bytes (hex-encoded in the token).
const SECRET_BYTES: usize = 16;

/// The key a Scheduler derives callback tokens under. Its `Debug` does
/// not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct CallbackKey([u8; 32]);

impl CallbackKey {
    /// A key from the operating system's randomness.
    pub fn random() -> Self {
        CallbackKey(rand::random())
    }

    /// A given key (tests, the simulation).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        CallbackKey(bytes)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for CallbackKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallbackKey(..)")
    }
}

/// One attempt's callback token.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    task: TaskId,
    step: StepName,
    attempt: u32,
    secret: String,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of logs and panics.
        f.debug_struct("Token").field("task", &self.task).field("step", &self.step).field("attempt", &self.attempt).finish()
    }
}

impl Token {
    /// The token of `attempt` of `step` of `task`, under `key`. The task's
    /// creation time is part of it, so that a task deleted and submitted
    /// again under the same id gets other tokens.
    pub fn issue(key: &[u8], task: &Task, step: &StepName, attempt: u32) -> Token {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length");
        for part in [task.id.as_str().as_bytes(), step.as_str().as_bytes()] {
            mac.update(part);
            mac.update(&[0]);
        }
        mac.update(&attempt.to_be_bytes());
        mac.update(&task.created_at.as_millis().to_be_bytes());
        let secret = hex(&mac.finalize().into_bytes()[..SECRET_BYTES]);
        Token { task: task.id.clone(), step: step.clone(), attempt, secret }
    }

    /// Reads a token's text; `None` if it is not one.
    pub fn parse(text: &str) -> Option<Token> {
        use base64::Engine as _;
        let mut parts = text.split('.');
        let (task, step, attempt, secret) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || secret.len() != SECRET_BYTES * 2 || !secret.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let decode =
            |part: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(part).ok().and_then(|b| String::from_utf8(b).ok());
        Some(Token {
            task: TaskId::new(decode(task)?).ok()?,
            step: StepName::new(decode(step)?).ok()?,
            attempt: attempt.parse().ok().filter(|a| *a > 0)?,
            secret: secret.to_ascii_lowercase(),
        })
    }

    /// The token's text: `<task id>.<step>.<attempt>.<secret>`, the names
    /// base64url-encoded, so that it fits in a URL path as it is.
    pub fn text(&self) -> String {
        use base64::Engine as _;
        let encode = |part: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(part);
        format!("{}.{}.{}.{}", encode(self.task.as_str()), encode(self.step.as_str()), self.attempt, self.secret)
    }

    /// What the step stores: the SHA-256 of the secret, hex.
    pub fn digest(&self) -> String {
        hex(&Sha256::digest(self.secret.as_bytes()))
    }

    /// The task it is for.
    pub fn task(&self) -> &TaskId {
        &self.task
    }

    /// The step it is for.
    pub fn step(&self) -> &StepName {
        &self.step
    }

    /// The attempt it is for.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a remote service reports with its callback.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The work is done; `output` becomes the step's output.
    Succeeded {
        /// The step's output.
        output: Value,
    },
    /// The work failed. `retryable` asks for another attempt (counted
    /// against the task's `max_failures`); otherwise the failure is
    /// permanent.
    Failed {
        /// What went wrong.
        error: String,
        /// Whether another attempt may succeed.
        retryable: bool,
    },
}

/// What a callback did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The task.
    pub task: TaskId,
    /// The step it completed or failed.
    pub step: StepName,
    /// The attempt.
    pub attempt: u32,
    /// Whether it completed the step (a success) rather than failing it.
    pub completed: bool,
}

/// Why a callback was refused. Each text is what the caller reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The token is not one, or names no callback step of an existing task,
    /// or its secret does not match the attempt's.
    #[error("no step waits for this callback token")]
    Unknown,
    /// The token's attempt is not waiting any more: it completed, failed,
    /// timed out or was replaced by a later attempt, or the token was used.
    #[error("step {step} of task {task}: {why}; the callback changes nothing")]
    NotCurrent {
        /// The task.
        task: TaskId,
        /// The step.
        step: StepName,
        /// Why, in the caller's terms.
        why: String,
    },
    /// The output is larger than [`OUTPUT_BYTES_MAX`].
    #[error("its output is {bytes} bytes of JSON, more than the {max} accepted")]
    TooLarge {
        /// The output's size.
        bytes: usize,
        /// The bound.
        max: usize,
    },
}

impl Client {
    /// Completes or fails the attempt `token` names, on behalf of `sent_by`
    /// (who, as the history will show it).
    pub async fn callback(&self, token: &str, outcome: Outcome, sent_by: &str) -> Result<Accepted> {
        if let Outcome::Succeeded { output } = &outcome {
            let bytes = serde_json::to_vec(output).map_or(usize::MAX, |encoded| encoded.len());
            if bytes > OUTPUT_BYTES_MAX {
                return Err(Error::Callback(Refusal::TooLarge { bytes, max: OUTPUT_BYTES_MAX }));
            }
        }
        let token = Token::parse(token).ok_or(Error::Callback(Refusal::Unknown))?;
        let outcome = match outcome {
            Outcome::Failed { error, retryable } => Outcome::Failed { error: cut(error, ERROR_BYTES_MAX), retryable },
            succeeded => succeeded,
        };
        self.retrying(|| self.try_callback(&token, &outcome, sent_by)).await
    }

    async fn try_callback(&self, token: &Token, outcome: &Outcome, sent_by: &str) -> Result<Accepted> {
        let unknown = || Error::Callback(Refusal::Unknown);
        let record = match self.record(token.task()).await {
            Ok(record) => record,
            Err(Error::TaskNotFound(_)) => return Err(unknown()),
            Err(err) => return Err(err),
        };
        let TaskRecord { task, steps } = &record;
        let workflow = self.workflows.get(&task.workflow, Some(task.workflow_version)).await?;
        if !workflow.step(token.step()).is_some_and(|def| def.completes_by_callback()) {
            return Err(unknown());
        }
        let Some(step) = steps.iter().find(|s| &s.name == token.step()) else { return Err(unknown()) };
        let now = self.clock.now();
        let not_current = |why: String| Error::Callback(Refusal::NotCurrent { task: task.id.clone(), step: step.name.clone(), why });
        let attempt = token.attempt();
        let waiting = step.state == StepState::Running && step.attempt == attempt;
        match &step.callback_digest {
            // The secret is checked before anything about the attempt is
            // told. Both sides are digests of secrets, so the comparison
            // leaks nothing worth timing.
            Some(digest) if waiting && *digest != token.digest() => return Err(unknown()),
            Some(_) if waiting => {}
            None if waiting => return Err(not_current(format!("the callback token of attempt {attempt} was already used"))),
            _ => return Err(not_current(over(task, step, attempt))),
        }
        if let Some(at) = step.complete_by.filter(|at| *at <= now) {
            return Err(not_current(format!("attempt {attempt} timed out at {}", at.as_millis())));
        }
        let mut changes = Changes::default();
        let (next, completed) = match outcome {
            Outcome::Succeeded { output } => {
                let done = step.complete(attempt, output.clone(), now).map_err(|why| Error::Refused {
                    action: crate::ops::Action::Callback,
                    refusal: crate::ops::Refusal::Step { task: task.id.clone(), step: step.name.clone(), why },
                })?;
                let bytes = serde_json::to_vec(output).map_or(0, |o| o.len());
                let detail = json!({ "outcome": "succeeded", "sent_by": sent_by, "bytes": bytes });
                changes.events.push(Event::step(&done, now, EventKind::Callback, detail));
                changes.events.push(Event::step(&done, now, EventKind::StepCompleted, json!({ "callback": true })));
                if let Some(holder) = &task.locked_by {
                    let wake = InboxMessage::Signalled { task_id: task.id.clone(), step: step.name.clone() };
                    changes.send.push((protocol::inbox(holder), inbox_message(wake, &task.id)));
                }
                (done, true)
            }
            Outcome::Failed { error, retryable } => {
                let mut used = step.clone();
                used.callback_digest = None;
                used.updated_at = now;
                let detail = json!({ "outcome": "failed", "sent_by": sent_by, "error": error, "retryable": retryable });
                changes.events.push(Event::step(&used, now, EventKind::Callback, detail));
                if let Some(holder) = &task.locked_by {
                    let reply = Reply {
                        task_id: task.id.clone(),
                        step: step.name.clone(),
                        attempt,
                        compensate: false,
                        outcome: ReplyOutcome::Failed { error: error.clone(), retryable: *retryable },
                    };
                    changes.send.push((protocol::inbox(holder), inbox_message(InboxMessage::Reply(reply), &task.id)));
                }
                (used, false)
            }
        };
        changes.steps.push(StepWrite::replacing(step, next));
        changes.tasks.push(TaskWrite::replacing(task, crate::signal::moved(task, now)));
        crate::replies::commit(&self.store, changes).await?;
        Ok(Accepted { task: task.id.clone(), step: step.name.clone(), attempt, completed })
    }
}

/// Why the token's attempt is no longer waiting, the token unused.
fn over(task: &Task, step: &rota_model::Step, attempt: u32) -> String {
    if matches!(task.state, TaskState::Processed | TaskState::Error | TaskState::Cancelled | TaskState::Compensated) {
        return format!("task {} is {}", task.id, task.state.as_str());
    }
    if step.attempt != attempt {
        return format!("attempt {attempt} is over (the step is at attempt {})", step.attempt);
    }
    match step.state {
        StepState::Completed | StepState::Compensating | StepState::Compensated => format!("attempt {attempt} has completed"),
        state => format!("attempt {attempt} is over (the step is {})", state.as_str()),
    }
}

fn inbox_message(message: InboxMessage, task: &TaskId) -> Outgoing {
    Outgoing::json(&InboxEnvelope::traced(message)).expect("inbox messages serialize").with_ordering_key(task.as_str())
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// The decision-time side: the token of an attempt being started, the
/// input to store (the token replaced by [`TOKEN_PLACEHOLDER`]) and the
/// input to send.
pub(crate) struct Issued {
    pub token: Token,
    pub stored: Value,
    pub sent: Value,
}

/// Issues attempt `attempt`'s token of `step` and renders its input both
/// ways.
pub(crate) fn issue(
    key: &[u8],
    task: &Task,
    step: &StepName,
    attempt: u32,
    template: &Value,
    context: &rota_workflow::TemplateContext<'_>,
) -> Result<Issued, rota_workflow::TemplateError> {
    let token = Token::issue(key, task, step, attempt);
    let text = token.text();
    let stored = rota_workflow::render(template, &rota_workflow::TemplateContext { callback_token: Some(TOKEN_PLACEHOLDER), ..*context })?;
    let sent = rota_workflow::render(template, &rota_workflow::TemplateContext { callback_token: Some(&text), ..*context })?;
    Ok(Issued { token, stored, sent })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rota_model::{Timestamp, WorkflowName};

    fn task(id: &str, created_at: i64) -> Task {
        Task::new(TaskId::new(id).unwrap(), WorkflowName::new("order").unwrap(), 1, json!({}), Timestamp::from_millis(created_at))
    }

    #[test]
    fn tokens_read_back_and_differ_by_every_part() {
        let step = StepName::new("charge.v2").unwrap();
        let t = task("order 17/ü", 1_000);
        let token = Token::issue(b"key", &t, &step, 3);
        let text = token.text();
        assert!(text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')), "URL-safe: {text}");
        assert_eq!(Token::parse(&text), Some(token.clone()));
        assert_eq!((token.task().as_str(), token.step().as_str(), token.attempt()), ("order 17/ü", "charge.v2", 3));
        let others = [
            Token::issue(b"other key", &t, &step, 3),
            Token::issue(b"key", &task("order 18", 1_000), &step, 3),
            Token::issue(b"key", &t, &StepName::new("refund").unwrap(), 3),
            Token::issue(b"key", &t, &step, 4),
            Token::issue(b"key", &task("order 17/ü", 1_001), &step, 3),
        ];
        for other in others {
            assert_ne!(other.digest(), token.digest(), "{other:?}");
        }
        assert_eq!(token.digest().len(), 64);
        assert!(!format!("{token:?}").contains(&token.secret), "Debug hides the secret");
    }

    #[test]
    fn malformed_tokens_are_none() {
        let good = Token::issue(b"key", &task("t", 0), &StepName::new("s").unwrap(), 1).text();
        let (head, secret) = good.rsplit_once('.').unwrap();
        for bad in [
            String::new(),
            "a.b.c".into(),
            format!("{good}.x"),
            format!("{head}.{}", &secret[1..]),
            format!("{head}.{}z", &secret[1..]),
            good.replacen(".1.", ".0.", 1),
            good.replacen(".1.", ".x.", 1),
            format!("!!{good}"),
        ] {
            assert_eq!(Token::parse(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn long_errors_are_cut_at_a_character_boundary() {
        assert_eq!(cut("héllo".into(), 2), "h");
        assert_eq!(cut("short".into(), 10), "short");
    }
}
