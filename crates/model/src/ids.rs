//! Identifiers. Every id has a newtype, validated when it is built, so that a
//! bad name is refused at the edge with a message that says what is wrong.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {value:?}: {reason}")]
pub struct IdError {
    /// What kind of id was being built ("queue name", "task id", ...).
    pub kind: &'static str,
    /// The rejected input, cut to a readable length.
    pub value: String,
    /// What rule it breaks.
    pub reason: &'static str,
}

impl IdError {
    fn new(kind: &'static str, value: &str, reason: &'static str) -> Self {
        let value: String = value.chars().take(80).collect();
        IdError { kind, value, reason }
    }
}

/// The longest id of any kind, in bytes. Ids end up in indexes, log lines
/// and HTTP headers (the idempotency key), so they are kept short.
pub const ID_BYTES_MAX: usize = 200;

fn check_free_text(kind: &'static str, value: &str) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::new(kind, value, "must not be empty"));
    }
    if value.len() > ID_BYTES_MAX {
        return Err(IdError::new(kind, value, "longer than 200 bytes"));
    }
    if value.chars().any(char::is_control) {
        return Err(IdError::new(kind, value, "contains a control character"));
    }
    if value.trim() != value {
        return Err(IdError::new(kind, value, "starts or ends with whitespace"));
    }
    Ok(())
}

fn check_name(kind: &'static str, value: &str) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::new(kind, value, "must not be empty"));
    }
    if value.len() > 100 {
        return Err(IdError::new(kind, value, "longer than 100 bytes"));
    }
    if !value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':')) {
        return Err(IdError::new(kind, value, "may only contain ASCII letters, digits, '-', '_', '.' and ':'"));
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $check:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps `value`.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                $check($kind, &value)?;
                Ok($name(value))
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, IdError> {
                $name::new(value)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(value: &str) -> Result<Self, IdError> {
                $name::new(value)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }
    };
}

string_id!(
    /// A task's id. Clients may supply it, and then it doubles as the
    /// idempotency key of the submission: submitting the same id twice creates
    /// one task.
    TaskId, "task id", check_free_text
);
string_id!(
    /// A message's id, unique within its queue while it is remembered for
    /// duplicate detection.
    MessageId, "message id", check_free_text
);
string_id!(
    /// The name of a durable queue.
    QueueName, "queue name", check_name
);
string_id!(
    /// The name of a step within its workflow, or of one instance of a
    /// `for_each` step: the step's name and the item's index in brackets
    /// (`charge[3]`). A workflow's own steps never have brackets, so an
    /// instance's name never collides with a step's.
    StepName, "step name", check_step_name
);

/// The most instances one `for_each` step may have, whatever a
/// configuration allows: an instance's index is written with at most
/// this many digits in its name.
pub const INSTANCE_INDEX_DIGITS_MAX: usize = 9;

fn check_step_name(kind: &'static str, value: &str) -> Result<(), IdError> {
    match split_instance(value) {
        Some((step, _)) => check_name(kind, step),
        None if value.contains(['[', ']']) => {
            Err(IdError::new(kind, value, "may hold brackets only as an instance's index at its end (`step[3]`)"))
        }
        None => check_name(kind, value),
    }
}

/// `step[3]` as `("step", 3)`; `None` for a name without a well-formed
/// index (digits, no leading zero, at most [`INSTANCE_INDEX_DIGITS_MAX`]).
fn split_instance(value: &str) -> Option<(&str, usize)> {
    let inner = value.strip_suffix(']')?;
    let open = inner.rfind('[')?;
    let digits = &inner[open + 1..];
    let well_formed = !digits.is_empty()
        && digits.len() <= INSTANCE_INDEX_DIGITS_MAX
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    if !well_formed || inner[..open].contains(['[', ']']) {
        return None;
    }
    Some((&inner[..open], digits.parse().ok()?))
}

impl StepName {
    /// The name of instance `index` of this `for_each` step: `NAME[index]`.
    pub fn instance(&self, index: usize) -> StepName {
        debug_assert!(self.instance_of().is_none(), "an instance has no instances");
        StepName(format!("{}[{index}]", self.0))
    }

    /// For an instance of a `for_each` step, the step's name and the
    /// instance's index; `None` for a step of the workflow itself.
    pub fn instance_of(&self) -> Option<(StepName, usize)> {
        split_instance(&self.0).map(|(step, index)| (StepName(step.to_owned()), index))
    }

    /// Whether this names an instance of a `for_each` step.
    pub fn is_instance(&self) -> bool {
        split_instance(&self.0).is_some()
    }
}
string_id!(
    /// The name of a signal: what a waiting step waits for, and what an
    /// outside event (a person's approval, a provider's webhook) sends to a
    /// task.
    SignalName, "signal name", check_name
);
string_id!(
    /// The name of a workflow definition.
    WorkflowName, "workflow name", check_name
);
string_id!(
    /// The name of a schedule. A name, like a workflow's, so that it never
    /// contains the `@` that separates it from the fire time in the ids of
    /// the tasks it starts.
    ScheduleName, "schedule name", check_name
);
string_id!(
    /// The id of one running process (a Scheduler, Agent or Supervisor
    /// instance). It is what the pattern calls `LockedBy`.
    InstanceId, "instance id", check_free_text
);

/// The proof that a consumer holds a message's lease (peek-lock).
///
/// It names the message and the lease epoch: every receive of a message bumps
/// its epoch, so a token from an earlier delivery can never complete, abandon
/// or renew a later one. It renders as `<message sequence>.<epoch>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LeaseToken {
    /// The message's sequence number in its store (never reused).
    pub message: i64,
    /// The lease epoch of the delivery this token was issued for.
    pub epoch: i64,
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.message, self.epoch)
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseToken({self})")
    }
}

impl FromStr for LeaseToken {
    type Err = IdError;
    fn from_str(value: &str) -> Result<Self, IdError> {
        let bad = || IdError::new("lease token", value, "expected <message>.<epoch>, two positive integers");
        let (message, epoch) = value.split_once('.').ok_or_else(bad)?;
        let message: i64 = message.parse().map_err(|_| bad())?;
        let epoch: i64 = epoch.parse().map_err(|_| bad())?;
        if message <= 0 || epoch <= 0 {
            return Err(bad());
        }
        Ok(LeaseToken { message, epoch })
    }
}

impl TryFrom<String> for LeaseToken {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, IdError> {
        value.parse()
    }
}

impl From<LeaseToken> for String {
    fn from(token: LeaseToken) -> String {
        token.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_refuse_what_would_break_urls_and_logs() {
        assert!(QueueName::new("payments.v2").is_ok());
        let err = QueueName::new("has space").unwrap_err();
        assert_eq!(err.kind, "queue name");
        assert!(QueueName::new("").is_err());
        assert!(QueueName::new("x".repeat(101)).is_err());
        assert!(TaskId::new("order 17/β").is_ok(), "task ids are free text");
        assert!(TaskId::new("tab\there").is_err());
        assert!(TaskId::new(" padded").is_err());
    }

    #[test]
    fn instances_of_for_each_steps_are_named_by_their_index() {
        let step = StepName::new("charge").unwrap();
        let third = step.instance(3);
        assert_eq!(third.as_str(), "charge[3]");
        assert_eq!(StepName::new("charge[3]").unwrap(), third);
        assert_eq!(third.instance_of(), Some((step.clone(), 3)));
        assert!(third.is_instance() && !step.is_instance());
        assert_eq!(StepName::new("charge[0]").unwrap().instance_of(), Some((step, 0)));
        for bad in ["charge[", "charge[]", "charge[03]", "charge[-1]", "charge[1][2]", "ch[a]rge", "[1]", "charge[1234567890]"] {
            assert!(StepName::new(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn lease_tokens_round_trip_and_reject_garbage() {
        let token = LeaseToken { message: 42, epoch: 7 };
        assert_eq!(token.to_string().parse::<LeaseToken>().unwrap(), token);
        for bad in ["", "42", "42.", ".7", "a.b", "0.1", "1.-1", "1.2.3"] {
            assert!(bad.parse::<LeaseToken>().is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn ids_deserialize_through_validation() {
        let err = serde_json::from_str::<QueueName>("\"a b\"").unwrap_err();
        assert!(err.to_string().contains("queue name"), "{err}");
    }
}
