//! `store::Error`: what can go wrong in a store operation, classified so
//! that callers can decide without parsing messages.

use rota_model::{IdError, QueueName};

/// The result of a store operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in a store operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The lease token is not the current lease of a message in that queue:
    /// the message was completed, its lease expired, or it was delivered
    /// again since. Losing a race is an outcome: the caller drops its work.
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// A fenced write found the record changed since it was read (another
    /// claim, a rescue by the Supervisor, an operator's cancel). Like
    /// `LeaseLost`, the caller drops its work.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The named thing does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The request itself is invalid (too large, malformed, out of bounds).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The queue is paused (only for operations that a pause refuses).
    #[error("queue {0} is paused")]
    Paused(QueueName),
    /// The store cannot be reached or opened.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The backend failed (IO, corruption, a bug). Details are in the message.
    #[error("store backend error: {0}")]
    Backend(String),
    /// The store was shut down.
    #[error("store closed")]
    Closed,
}

impl Error {
    /// Whether retrying the same operation later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable(_) | Error::Backend(_))
    }

    /// Whether this is a lost race (`LeaseLost` or `Conflict`), after which
    /// the caller should drop the work rather than report a failure.
    pub fn is_lost_race(&self) -> bool {
        matches!(self, Error::LeaseLost(_) | Error::Conflict(_))
    }
}

impl From<IdError> for Error {
    fn from(err: IdError) -> Self {
        Error::Invalid(err.to_string())
    }
}
