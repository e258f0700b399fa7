//! Schedules as the store keeps them: a definition (workflow, cron
//! expression, time zone, input, policies), whether it is paused, and its
//! progress (which fire times have been handled), advanced only by a
//! compare-and-set on the schedule's version so that two Supervisors that
//! both believe they lead never both advance it.
//!
//! Deliberately left out: when fires are due and what they start; that is
//! the engine's. The store only refuses a definition that does not parse.

use rota_model::{CatchUp, Cron, Overlap, ScheduleName, TaskId, Timestamp, WorkflowName};
use serde::Serialize;
use serde_json::Value;

use crate::{Error, Result};

/// What a schedule starts and when: everything a user writes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleSpec {
    /// The workflow each fire submits (its latest version at the fire).
    pub workflow: WorkflowName,
    /// The cron expression (five fields, or six with seconds).
    pub cron: String,
    /// The IANA time zone the expression is read in.
    pub timezone: String,
    /// The input of every task it starts.
    pub input: Value,
    /// What a fire does while the previous fire's task runs.
    pub overlap: Overlap,
    /// Which missed fires start after a time nobody fired them.
    pub catch_up: CatchUp,
}

impl ScheduleSpec {
    /// The parsed expression, or why it does not parse (the error names
    /// the field).
    pub fn parse_cron(&self) -> std::result::Result<Cron, rota_model::ScheduleError> {
        Cron::parse(&self.cron, &self.timezone)
    }
}

/// Where a schedule's definition comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleSource {
    /// Created by an operator (the CLI, the API).
    Api,
    /// Declared under `schedules:` in a workflow file; the file's
    /// definition replaces the stored one whenever a server loads it.
    File,
}

impl ScheduleSource {
    /// The source's name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            ScheduleSource::Api => "api",
            ScheduleSource::File => "file",
        }
    }

    /// The source named `name`, if any.
    pub fn parse(name: &str) -> Option<ScheduleSource> {
        [ScheduleSource::Api, ScheduleSource::File].into_iter().find(|s| s.as_str() == name)
    }
}

/// A schedule to create or declare.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSchedule {
    /// Its name.
    pub name: ScheduleName,
    /// Its definition.
    pub spec: ScheduleSpec,
    /// Where the definition comes from.
    pub source: ScheduleSource,
}

impl NewSchedule {
    /// Refuses, as every backend does before writing anything, a cron
    /// expression or time zone that does not parse.
    pub fn check(&self) -> Result<()> {
        self.spec.parse_cron().map(|_| ()).map_err(|err| Error::Invalid(format!("schedule {}: {}: {err}", self.name, err.field())))
    }
}

/// Which fires a schedule has handled. Written only by
/// [`crate::Tasks::advance_schedule`] (and moved to now by a resume or a
/// changed definition).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ScheduleProgress {
    /// Every fire time at or before this one has been handled (started,
    /// buffered or skipped); the next fire is the first one after it.
    pub fired_through: Timestamp,
    /// The fire time of the last task a cron fire started.
    pub last_fire_at: Option<Timestamp>,
    /// That task, whose state the overlap policy looks at.
    pub last_task: Option<TaskId>,
    /// A fire waiting for the last task to finish (`buffer-one`).
    pub buffered_fire_at: Option<Timestamp>,
    /// How many fires were skipped (by the overlap or catch-up policy).
    pub skipped: u64,
    /// The fire time of the last skipped fire.
    pub last_skipped_at: Option<Timestamp>,
}

/// A stored schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleRecord {
    /// Its name.
    pub name: ScheduleName,
    /// Its definition.
    pub spec: ScheduleSpec,
    /// Where the definition comes from.
    pub source: ScheduleSource,
    /// Paused schedules do not fire; their fires are not caught up later.
    pub paused: bool,
    /// Its progress.
    pub progress: ScheduleProgress,
    /// Bumped by every write: the fence of [`crate::Tasks::advance_schedule`].
    pub version: u64,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it was last written.
    pub updated_at: Timestamp,
}
