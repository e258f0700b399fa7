//! rota's running components: the things that loop, wait and spawn.
//!
//! Today that is the queue [`Consumer`]: the competing-consumer runtime that
//! leases messages from a durable queue, runs a [`Handler`] on each with
//! bounded concurrency, renews leases of slow handlers and settles every
//! message (complete, abandon, dead-letter) with batched completions. The
//! Scheduler and the Supervisor of the pattern will live here too.
//!
//! This is the only crate that spawns futures. Every component follows one
//! shape: a validated `Config`, and `run(self, …, shutdown)` that returns once
//! the [`Shutdown`] signal has been triggered and the component has let go of
//! everything it held (leases, in-flight work).
//!
//! Deliberately left out: SQL and storage details (behind
//! [`rota_store::Queues`]), the domain rules (in `rota-model`), remote calls
//! and their retries (the agent crate), and reading flags or environment
//! variables (only the `rota` binary does that).

pub mod consumer;
mod shutdown;

/// The attribute that implements [`Handler`]'s async method, re-exported so
/// that implementors need no dependency of their own.
pub use async_trait::async_trait;
pub use consumer::{Consumer, Handler, Outcome, Summary};
pub use shutdown::Shutdown;

/// The result of an engine operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can stop an engine component.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration is out of bounds; the message names the field.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The store failed in a way the component cannot retry.
    #[error(transparent)]
    Store(#[from] rota_store::Error),
}
