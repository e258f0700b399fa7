//! The domain model of rota: ids, the task and step lifecycles, leases and
//! fencing, the retry policy, and the [`Clock`].
//!
//! This crate is pure. It does no IO and never reads the system time: every
//! transition takes `now` as an argument and returns the next record (or an
//! error saying why the move is refused). The store applies the result as a
//! compare-and-set, and the engine carries out the effects. Keeping the rules
//! here means they can be property-tested without a database, and both store
//! backends agree on them by construction.
//!
//! Deliberately left out: workflow definitions (parsing, DAGs, templates),
//! which are `rota-workflow`'s, and anything about how records are stored.

pub mod clock;
pub mod concurrency;
pub mod ids;
pub mod json;
pub mod priority;
pub mod rate;
pub mod retry;
pub mod schedule;
pub mod step;
pub mod tags;
pub mod task;

pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use concurrency::{CONCURRENCY_KEY_BYTES_MAX, CONCURRENCY_LIMIT_MAX, ConcurrencyKey, MAX_IN_FLIGHT_KEY};
pub use ids::{IdError, InstanceId, LeaseToken, MessageId, QueueName, ScheduleName, SignalName, StepName, TaskId, WorkflowName};
pub use priority::{PRIORITY_MAX, PRIORITY_MIN, Priority, PriorityError};
pub use rate::{RateLimit, RateLimitError, RateTake, RateUnit};
pub use retry::{FailureClass, FailureKind, RetryPolicy, RetryPolicyError};
pub use schedule::{CatchUp, Cron, Overlap, ScheduleError};
pub use step::{Step, StepState};
pub use tags::{TagError, Tags};
pub use task::{ExhaustedPolicy, ParentLink, Task, TaskFence, TaskState, TransitionError};
