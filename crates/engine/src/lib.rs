//! rota's running components: the things that loop, wait and spawn.
//!
//! The pattern's three roles live here: the [`Scheduler`] (claims tasks,
//! sends step requests, consumes replies, advances each task's workflow;
//! its decisions are the pure functions of [`plan`]), the agents at work
//! ([`AgentWorker`], one competing consumer per agent queue) and the
//! [`Supervisor`] (recovers expired deadlines, elected by a leader lease).
//! [`Client`] submits tasks and serves the operator's requests ([`ops`]:
//! look up, list, cancel, resubmit, each rule written once for the HTTP API
//! and the CLI); [`Engine`] wires any
//! subset of the roles into one process. All of them stand on the queue
//! [`Consumer`]: the competing-consumer runtime that leases messages from a
//! durable queue, runs a [`Handler`] on each with bounded concurrency,
//! renews leases of slow handlers and settles every message with batched
//! completions. The messages between roles are in [`protocol`].
//!
//! Every long-running component is spawned here (the binary only wires
//! them; the store backends spawn only their own machinery), and the
//! webhook [`webhooks::Dispatcher`] is one of them. Each has one shape: a
//! validated `Config`, and `run(self, …, shutdown)` that returns once the
//! [`Shutdown`] signal has been triggered and the component has let go of
//! everything it held (leases, in-flight work).
//!
//! Deliberately left out: SQL and storage details (behind
//! [`rota_store::Queues`]), the domain rules (in `rota-model`), remote calls
//! and their retries (the agent crate), and reading flags or environment
//! variables (only the `rota` binary does that).

pub mod activity;
pub mod agent_worker;
pub mod archive;
pub mod audit;
pub mod batch;
pub mod breakers;
pub mod callback;
pub mod child;
pub mod client;
pub mod completions;
pub mod consumer;
pub mod engine;
pub mod export;
pub mod long_poll;
pub mod ops;
pub mod pause;
pub mod plan;
pub mod protocol;
pub mod replies;
pub mod retention;
mod saturation;
pub mod scheduler;
pub mod schedules;
mod shutdown;
pub mod signal;
pub mod status;
pub mod supervisor;
pub mod telemetry;
pub mod webhooks;
pub mod workflows;

pub use agent_worker::AgentWorker;
pub use client::{Client, Fired, Start, Submission, Submitted};
pub use completions::Completions;
pub use engine::{Engine, Roles};
pub use scheduler::Scheduler;
pub use supervisor::Supervisor;
pub use workflows::Workflows;

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
    /// A setting is outside its bounds.
    #[error("invalid configuration: {field} {why}")]
    OutOfBounds {
        /// The setting, as its config field is named (`supervisor.interval`).
        field: &'static str,
        /// Its bounds and the value given.
        why: String,
    },
    /// A submission asks for something outside its bounds; nothing was written.
    #[error("{field}: {why}")]
    InvalidSubmission {
        /// The submission's field (`start_at`, `delay`).
        field: &'static str,
        /// Its bounds and the value given.
        why: String,
    },
    /// The store failed in a way the component cannot retry.
    #[error(transparent)]
    Store(#[from] rota_store::Error),
    /// A workflow definition could not be used.
    #[error("workflow: {0}")]
    Workflow(String),
    /// An export, import or archive could not read or write its lines.
    #[error("{0}")]
    Export(String),
}
