//! The two kinds of failure a step can have, and the crate's own [`Error`].
//!
//! A [`StepError`] is an expected outcome, classified where it happens: the
//! code that sees a 503 or an exit code knows whether trying again can help,
//! so it says so right there, and everything downstream (the retry loop, the
//! engine, the Supervisor) only reads the classification. [`Error`] is for
//! what stops the crate from being set up at all (a bad configuration).
//!
//! Deliberately left out: how a failure is reported to the Scheduler. That is
//! a message on a queue, built by the engine from an [`crate::Outcome`].

use std::fmt;
use std::time::Duration;

use rota_model::FailureClass;

/// The result of setting up an agent.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What stops an agent from being built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration is out of bounds; the message names the field.
    #[error("invalid agent configuration: {0}")]
    Config(String),
    /// The HTTP client could not be built (for example, no TLS roots).
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// Why one call of a step failed, and whether trying again can help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// A transient fault: a timeout, a refused connection, a 503, an exit
    /// code 75. The agent tries again inside the complete-by window.
    #[error("{message}")]
    Retryable {
        /// What went wrong, for the task history and the operator.
        message: String,
        /// How long the remote side asked us to wait (`Retry-After`, an open
        /// circuit). The retry loop waits at least this long.
        retry_after: Option<Duration>,
        /// What the failure was (a status, a timeout…), when the agent
        /// knows: a retry policy may list it as not worth retrying.
        class: Option<FailureClass>,
    },
    /// A fault that repeating the same request cannot fix: a 404, a bad
    /// input, a declined card. The agent replies at once with an error.
    #[error("{message}")]
    Permanent {
        /// What went wrong, for the task history and the operator.
        message: String,
    },
}

impl StepError {
    /// A transient fault with no hint about when to come back.
    pub fn retryable(message: impl Into<String>) -> Self {
        StepError::Retryable { message: message.into(), retry_after: None, class: None }
    }

    /// A transient fault the remote side asked us to retry after `wait`.
    pub fn retryable_after(message: impl Into<String>, wait: Duration) -> Self {
        StepError::Retryable { message: message.into(), retry_after: Some(wait), class: None }
    }

    /// The same error, saying what kind of failure it was. A permanent
    /// error stays as it is: it fails at once whatever the class.
    pub fn with_class(mut self, failure: FailureClass) -> Self {
        if let StepError::Retryable { class, .. } = &mut self {
            *class = Some(failure);
        }
        self
    }

    /// What kind of transient failure this was, if the agent said.
    pub fn class(&self) -> Option<FailureClass> {
        match self {
            StepError::Retryable { class, .. } => *class,
            StepError::Permanent { .. } => None,
        }
    }

    /// A fault that retrying cannot fix.
    pub fn permanent(message: impl Into<String>) -> Self {
        StepError::Permanent { message: message.into() }
    }

    /// Whether trying the same request again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StepError::Retryable { .. })
    }

    /// What went wrong.
    pub fn message(&self) -> &str {
        match self {
            StepError::Retryable { message, .. } | StepError::Permanent { message } => message,
        }
    }

    /// The wait the remote side asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            StepError::Retryable { retry_after, .. } => *retry_after,
            StepError::Permanent { .. } => None,
        }
    }
}

/// Converts a foreign `Result` into a step result, choosing the class at the
/// call site:
///
/// ```
/// use rota_agent::{StepError, StepResultExt};
///
/// fn parse_amount(text: &str) -> Result<u64, StepError> {
///     // A malformed amount stays malformed however often we try.
///     let amount: u64 = text.parse().permanent()?;
///     Ok(amount)
/// }
///
/// assert_eq!(parse_amount("12").unwrap(), 12);
/// assert!(!parse_amount("twelve").unwrap_err().is_retryable());
/// ```
pub trait StepResultExt<T> {
    /// The error becomes [`StepError::Retryable`], its text the message.
    fn retryable(self) -> Result<T, StepError>;
    /// The error becomes [`StepError::Permanent`], its text the message.
    fn permanent(self) -> Result<T, StepError>;
}

impl<T, E: fmt::Display> StepResultExt<T> for Result<T, E> {
    fn retryable(self) -> Result<T, StepError> {
        self.map_err(|e| StepError::retryable(e.to_string()))
    }

    fn permanent(self) -> Result<T, StepError> {
        self.map_err(|e| StepError::permanent(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_errors_convert_to_the_class_chosen_at_the_call_site() {
        let parsed: Result<u32, _> = "x".parse::<u32>();
        let err = parsed.clone().retryable().unwrap_err();
        assert!(err.is_retryable());
        assert_eq!(err.retry_after(), None);
        assert_eq!(err.message(), "invalid digit found in string");
        let err = parsed.permanent().unwrap_err();
        assert!(!err.is_retryable());
        assert_eq!(err.to_string(), "invalid digit found in string");
        assert_eq!(Ok::<_, String>(3).retryable(), Ok(3));
    }

    #[test]
    fn retry_after_belongs_to_retryable_errors_only() {
        let err = StepError::retryable_after("slow down", Duration::from_secs(2));
        assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(StepError::permanent("no").retry_after(), None);
    }

    #[test]
    fn only_transient_errors_carry_a_class() {
        let err = StepError::retryable("503").with_class(FailureClass::Status(503));
        assert_eq!(err.class(), Some(FailureClass::Status(503)));
        assert_eq!(StepError::permanent("404").with_class(FailureClass::Status(404)).class(), None);
    }
}
