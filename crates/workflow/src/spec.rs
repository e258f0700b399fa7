//! The unvalidated "spec" of a definition, shared by every way of writing
//! one: the file decoder (`parse`), the Rust builder (`builder`) and the
//! stored JSON form (`stored`) each produce a [`Spec`], and one function,
//! `validate::validate`, turns a spec into a [`Workflow`](crate::Workflow).
//! That is what makes a built workflow equal to the same workflow written in
//! YAML.
//!
//! Names are kept as plain strings until validation so that a bad name is
//! reported as a diagnostic, like every other problem, rather than as a
//! panic. Deliberately left out: any check; a spec holds whatever was
//! written.

use std::time::Duration;

use rota_model::{ExhaustedPolicy, RateLimit, RetryPolicy};
use serde_json::Value;

/// A definition before validation. `None` means "not given": a default
/// applies, or (for a required field) the decoder has already reported it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Spec {
    pub name: Option<String>,
    pub version: Option<u32>,
    pub deadline: Option<Duration>,
    pub warn_after: Option<Duration>,
    pub retention: Option<Duration>,
    pub on_exhausted: Option<ExhaustedPolicy>,
    pub max_failures: Option<u32>,
    pub priority: Option<i64>,
    /// `concurrency: { key, limit }`: the key expression as written (parsed
    /// by validation) and the limit.
    pub concurrency: Option<ConcurrencySpec>,
    /// `max_in_flight: N`: at most N of its tasks Processing at once.
    pub max_in_flight: Option<u32>,
    pub steps: Option<Vec<StepSpec>>,
    /// The schedules a workflow file declares (never stored with the
    /// definition: see `definition::ScheduleDef`).
    pub schedules: Option<Vec<ScheduleSpec>>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ConcurrencySpec {
    pub key: Option<String>,
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ScheduleSpec {
    pub name: Option<String>,
    pub cron: Option<String>,
    pub timezone: Option<String>,
    pub input: Option<Value>,
    pub overlap: Option<String>,
    pub catch_up: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct StepSpec {
    pub name: Option<String>,
    pub agent: Option<String>,
    /// The signal a waiting step waits for (instead of calling an agent).
    pub wait: Option<String>,
    /// The child workflow a step runs (instead of calling an agent), and
    /// the version it pins (`None`: the latest when the child starts).
    pub workflow: Option<String>,
    pub workflow_version: Option<u32>,
    /// An agent step completed by a callback (`callback: true`) rather
    /// than by its agent's reply.
    pub callback: Option<bool>,
    pub with: Value,
    pub timeout: Option<Duration>,
    pub warn_after: Option<Duration>,
    /// The condition, as written (parsed by validation).
    pub when: Option<String>,
    /// The `for_each` expression, as written (parsed by validation).
    pub for_each: Option<String>,
    pub max_parallel: Option<u32>,
    pub retry: Option<RetryPolicy>,
    /// The rate limit of the step's calls (`rate_limit:`), shared by every
    /// process calling the same target.
    pub rate_limit: Option<RateLimit>,
    pub compensate: Option<CompensateSpec>,
    /// `None`: depends on the previous step. `Some(vec![])`: a root.
    pub depends_on: Option<Vec<String>>,
    /// The decoder could not read the step at all (it is not a mapping)
    /// and has said so: no check of its fields applies.
    pub unreadable: bool,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct CompensateSpec {
    pub agent: Option<String>,
    pub with: Value,
    pub timeout: Option<Duration>,
    pub retry: Option<RetryPolicy>,
}
