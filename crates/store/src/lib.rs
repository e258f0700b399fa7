//! The Store: rota's durable state store and durable queues, behind one
//! trait pair that every backend implements ([`Queues`] and [`Tasks`],
//! together [`Store`]).
//!
//! The traits speak only domain types. SQL lives in the backends
//! (`rota-store-sqlite`, later `rota-store-postgres`); what a backend must
//! do is written down once, as the [`conformance`] suite, which every backend
//! runs unchanged. A behaviour that the suite does not check is not
//! guaranteed.
//!
//! Times: a backend is built with an `Arc<dyn Clock>` and reads "now" from it
//! for every operation, binding it as a parameter. SQL never calls its own
//! `now()`, so a test can move time for both backends alike.
//!
//! Deliberately left out: how a backend batches writes (group commit) and how
//! it wakes waiting consumers. Those are the backend's business, observable
//! only through latency and throughput.

pub mod audit;
pub mod batch;
pub mod breaker;
pub mod chain;
mod claim;
pub mod conformance;
mod error;
pub mod prune;
mod queue;
pub mod rate;
mod schedule;
pub mod stored;
mod task;

use std::sync::Arc;

pub use audit::{AuditAction, AuditCursor, AuditEntry, AuditFilter, AuditSource, NewAudit};
pub use batch::{BatchAction, BatchCursor, BatchFilter, BatchProgress, BatchRecord, BatchState, DeadLetterFilter, NewBatch};
pub use breaker::{BreakerAdmission, BreakerAsk, BreakerReport, BreakerResult, SharedBreaker, SharedBreakerState};
pub use claim::{Claim, OLDEST_SHARE_EVERY_DEFAULT, OldestShare};
pub use error::{Error, Result};
pub use prune::{InstanceSweep, Prune, PruneWorkflows, Pruned, Swept};
pub use queue::{
    BODY_BYTES_MAX, Backlog, Body, CORRELATION_ID_BYTES_MAX, DEDUPE_WINDOW_DEFAULT, DeadLetter, DeadLetterPage, Delivery,
    ORDERING_KEY_BYTES_MAX, Outgoing, QueueConfig, QueueStats, Queues, RECEIVE_MAX, Receive, Redrive, Sent,
};
pub use rate::{RATE_KEY_BYTES_MAX, RATE_WAIT_MAX_LIMIT, RateRequest, RateSlot};
pub use schedule::{NewSchedule, ScheduleProgress, ScheduleRecord, ScheduleSource, ScheduleSpec};
pub use task::{
    Changes, ComponentStatus, Created, Event, EventKind, Expired, LeaderLease, NewTask, StepWrite, TaskFilter, TaskRecord, TaskWrite,
    Tasks, TimeRange, Warning, WorkflowEntry, WorkflowPause, counts_of_every_state, prefix_upper_bound,
};

/// A complete store: durable queues and the task state store, sharing one
/// database so that a task's state change and its messages commit together.
pub trait Store: Queues + Tasks {
    /// A short name of the backend ("sqlite", "postgres") for logs and stats.
    fn backend(&self) -> &'static str;
}

/// A shared, type-erased store, as components receive it.
pub type SharedStore = Arc<dyn Store>;
