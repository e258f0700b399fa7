//! Schedules: a cron expression in a time zone, and the two policies that
//! say what a fire does when the previous one is still running (overlap)
//! and which fires start after a time nobody fired them (catch-up).
//!
//! Cron expressions are croner's (seconds optional, `L`, `W`, `#`, the
//! `@daily` nicknames), evaluated in an IANA time zone from chrono-tz. Over
//! a daylight-saving change croner decides, and rota follows it: a
//! fixed-time job (`0 30 2 * * *`) whose time falls in a skipped hour runs
//! at the first time after the gap, and once only in a repeated hour; an
//! interval job (`0 */15 * * * *`) skips the times that do not exist and
//! runs at every repeated one.
//!
//! The ids of the tasks a schedule starts are derived here, from the
//! schedule's name and the fire time, so that everyone who fires the same
//! time submits the same id and the store creates one task.
//!
//! Deliberately left out: when fires are due and what a fire starts (the
//! engine's `schedules` module), and how schedules are stored.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

use crate::{ScheduleName, TaskId, Timestamp};

/// Why a schedule's cron expression, time zone or policy is refused. The
/// message names the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The cron expression does not parse.
    #[error("invalid cron expression {expression:?}: {why}")]
    Cron {
        /// The expression given.
        expression: String,
        /// croner's reason.
        why: String,
    },
    /// The time zone is not an IANA name chrono-tz knows.
    #[error("unknown time zone {name:?}: expected an IANA name such as UTC, Europe/Paris or America/New_York")]
    Timezone {
        /// The name given.
        name: String,
    },
    /// An overlap or catch-up policy that does not exist.
    #[error("invalid {field} {value:?}: expected one of {expected}")]
    Policy {
        /// `overlap` or `catch_up`.
        field: &'static str,
        /// The value given.
        value: String,
        /// The accepted values.
        expected: &'static str,
    },
}

impl ScheduleError {
    /// The name of the field at fault (`cron`, `timezone`, `overlap`,
    /// `catch_up`), for errors that point at it.
    pub fn field(&self) -> &'static str {
        match self {
            ScheduleError::Cron { .. } => "cron",
            ScheduleError::Timezone { .. } => "timezone",
            ScheduleError::Policy { field, .. } => field,
        }
    }
}

/// What a fire does while the task of the previous fire has not finished.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Overlap {
    /// The fire is skipped (and counted as skipped on the schedule).
    #[default]
    #[serde(rename = "skip")]
    Skip,
    /// The fire starts its task anyway: runs may overlap.
    #[serde(rename = "allow")]
    Allow,
    /// The fire waits: it starts as soon as the previous task finishes, with
    /// the id of its own fire time. At most one fire waits; a fire that
    /// finds one already waiting is skipped.
    #[serde(rename = "buffer-one")]
    BufferOne,
}

impl Overlap {
    /// Every policy.
    pub const ALL: [Overlap; 3] = [Overlap::Skip, Overlap::Allow, Overlap::BufferOne];

    /// The policy's name as written and stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Allow => "allow",
            Overlap::BufferOne => "buffer-one",
        }
    }
}

impl FromStr for Overlap {
    type Err = ScheduleError;
    fn from_str(value: &str) -> Result<Self, ScheduleError> {
        Overlap::ALL.into_iter().find(|o| o.as_str() == value).ok_or_else(|| ScheduleError::Policy {
            field: "overlap",
            value: value.to_owned(),
            expected: "skip, allow, buffer-one",
        })
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which fires start when the schedule comes due after a time in which
/// nobody fired it (every Supervisor down, or none of them leading). A fire
/// is *missed* when it is found later than the engine's lateness bound;
/// fires found in time always start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// Missed fires are skipped: the schedule fires from now on.
    None,
    /// Only the most recent missed fire starts; older ones are skipped.
    #[default]
    Latest,
    /// Every missed fire starts, oldest first, a bounded number per round.
    All,
}

impl CatchUp {
    /// Every policy.
    pub const ALL: [CatchUp; 3] = [CatchUp::None, CatchUp::Latest, CatchUp::All];

    /// The policy's name as written and stored.
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::None => "none",
            CatchUp::Latest => "latest",
            CatchUp::All => "all",
        }
    }
}

impl FromStr for CatchUp {
    type Err = ScheduleError;
    fn from_str(value: &str) -> Result<Self, ScheduleError> {
        CatchUp::ALL.into_iter().find(|c| c.as_str() == value).ok_or_else(|| ScheduleError::Policy {
            field: "catch_up",
            value: value.to_owned(),
            expected: "none, latest, all",
        })
    }
}

impl fmt::Display for CatchUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A cron expression in a time zone, parsed and checked.
#[derive(Clone)]
pub struct Cron {
    expression: String,
    zone: Tz,
    cron: croner::Cron,
}

impl fmt::Debug for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Cron({:?} in {})", self.expression, self.zone.name())
    }
}

impl Cron {
    /// Parses `expression` (five fields, or six with seconds first) for the
    /// IANA time zone `timezone`.
    pub fn parse(expression: &str, timezone: &str) -> Result<Cron, ScheduleError> {
        let zone: Tz = timezone.parse().map_err(|_| ScheduleError::Timezone { name: timezone.to_owned() })?;
        let parser = croner::parser::CronParser::builder().seconds(croner::parser::Seconds::Optional).build();
        let cron =
            parser.parse(expression).map_err(|err| ScheduleError::Cron { expression: expression.to_owned(), why: err.to_string() })?;
        Ok(Cron { expression: expression.to_owned(), zone, cron })
    }

    /// The expression as given.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The time zone's IANA name.
    pub fn timezone(&self) -> &str {
        self.zone.name()
    }

    /// The first fire time strictly after `after`, or `None` if there is
    /// none (an expression such as `0 0 30 2 *` never matches, and croner
    /// searches up to the year 5000).
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        // Fire times are whole seconds, and croner steps off the start's
        // wall clock second: from the start's own second, the next match is
        // strictly after `after` whatever its milliseconds. (Truncated in
        // UTC: in a repeated hour a local time names two instants.)
        let second = after.as_millis().div_euclid(1_000);
        let local = DateTime::<Utc>::from_timestamp(second, 0)?.with_timezone(&self.zone);
        let next = self.cron.find_next_occurrence(&local, false).ok()?;
        Some(Timestamp::from_millis(next.timestamp_millis()))
    }

    /// The last fire time at or before `at`, if any.
    pub fn previous_at_or_before(&self, at: Timestamp) -> Option<Timestamp> {
        let second = at.as_millis().div_euclid(1_000);
        let local = DateTime::<Utc>::from_timestamp(second, 0)?.with_timezone(&self.zone);
        let previous = self.cron.find_previous_occurrence(&local, true).ok()?;
        Some(Timestamp::from_millis(previous.timestamp_millis()))
    }

    /// The fire times in `(after, until]`, oldest first, at most `max`.
    pub fn fires_between(&self, after: Timestamp, until: Timestamp, max: usize) -> Vec<Timestamp> {
        let mut fires = Vec::new();
        let mut cursor = after;
        while fires.len() < max {
            match self.next_after(cursor) {
                Some(next) if next <= until => {
                    fires.push(next);
                    cursor = next;
                }
                _ => break,
            }
        }
        fires
    }
}

/// A time as RFC 3339 in UTC, whole seconds (`2026-11-27T01:00:00Z`).
pub fn rfc3339_seconds(at: Timestamp) -> String {
    rfc3339(at, SecondsFormat::Secs)
}

/// A time as RFC 3339 in UTC with milliseconds (`2026-11-27T01:00:00.250Z`).
pub fn rfc3339_millis(at: Timestamp) -> String {
    rfc3339(at, SecondsFormat::Millis)
}

fn rfc3339(at: Timestamp, format: SecondsFormat) -> String {
    DateTime::<Utc>::from_timestamp_millis(at.as_millis()).map_or_else(|| at.as_millis().to_string(), |t| t.to_rfc3339_opts(format, true))
}

/// The id of the task a schedule's cron fire at `fire_at` starts:
/// `NAME@2026-11-27T01:00:00Z`. Everyone who fires that time derives the
/// same id, so the store creates one task however many try.
pub fn fire_task_id(schedule: &ScheduleName, fire_at: Timestamp) -> TaskId {
    TaskId::new(format!("{schedule}@{}", rfc3339_seconds(fire_at))).expect("a schedule name and a time make a valid task id")
}

/// The id of the task a manual fire (`rota schedules trigger`) at `at`
/// starts: `NAME@manual@2026-11-27T01:00:00.250Z`. It never equals a cron
/// fire's id, so a manual fire neither replaces nor blocks a cron fire.
pub fn manual_task_id(schedule: &ScheduleName, at: Timestamp) -> TaskId {
    TaskId::new(format!("{schedule}@manual@{}", rfc3339_millis(at))).expect("a schedule name and a time make a valid task id")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        Timestamp::from_millis(DateTime::parse_from_rfc3339(text).unwrap().timestamp_millis())
    }

    fn utc(fires: &[Timestamp]) -> Vec<String> {
        fires.iter().map(|t| rfc3339_seconds(*t)).collect()
    }

    fn check(expression: &str, zone: &str, after: &str, until: &str, expected: &[&str]) {
        let cron = Cron::parse(expression, zone).unwrap();
        let fires = cron.fires_between(at(after), at(until), 100);
        assert_eq!(utc(&fires), expected, "{expression} in {zone} after {after}");
    }

    #[test]
    fn seconds_are_optional_and_fires_are_strictly_after() {
        check(
            "* * * * * *",
            "UTC",
            "2026-11-27T01:00:00.500Z",
            "2026-11-27T01:00:03Z",
            &["2026-11-27T01:00:01Z", "2026-11-27T01:00:02Z", "2026-11-27T01:00:03Z"],
        );
        check(
            "*/20 * * * * *",
            "UTC",
            "2026-11-27T01:00:00Z",
            "2026-11-27T01:01:00Z",
            &["2026-11-27T01:00:20Z", "2026-11-27T01:00:40Z", "2026-11-27T01:01:00Z"],
        );
        check("0 9 * * MON", "UTC", "2026-11-27T00:00:00Z", "2026-12-08T00:00:00Z", &["2026-11-30T09:00:00Z", "2026-12-07T09:00:00Z"]);
    }

    #[test]
    fn a_zone_moves_the_fires() {
        // 09:00 in Paris is 08:00 UTC in winter.
        check("0 0 9 * * *", "Europe/Paris", "2026-11-27T00:00:00Z", "2026-11-28T00:00:00Z", &["2026-11-27T08:00:00Z"]);
    }

    #[test]
    fn a_skipped_hour_runs_fixed_jobs_after_the_gap_and_drops_interval_fires() {
        // Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00 UTC).
        // A fixed-time job at 02:30 runs at the first time after the gap.
        check(
            "0 30 2 * * *",
            "Europe/Berlin",
            "2026-03-28T12:00:00Z",
            "2026-03-30T12:00:00Z",
            &["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"],
        );
        // An interval job has no fires in the missing hour.
        check(
            "0 */30 * * * *",
            "Europe/Berlin",
            "2026-03-29T00:00:00Z",
            "2026-03-29T01:30:00Z",
            &["2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z", "2026-03-29T01:30:00Z"],
        );
    }

    #[test]
    fn a_repeated_hour_runs_fixed_jobs_once_and_interval_jobs_twice() {
        // Berlin, 2026-10-25: 03:00 CEST goes back to 02:00 CET, so 02:xx
        // local happens at 00:xx UTC and again at 01:xx UTC.
        check("0 30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", "2026-10-25T12:00:00Z", &["2026-10-25T00:30:00Z"]);
        check(
            "0 */30 2 * * *",
            "Europe/Berlin",
            "2026-10-24T12:00:00Z",
            "2026-10-25T12:00:00Z",
            &["2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z", "2026-10-25T01:00:00Z", "2026-10-25T01:30:00Z"],
        );
    }

    #[test]
    fn bad_expressions_and_zones_name_their_field() {
        let err = Cron::parse("61 * * * *", "UTC").unwrap_err();
        assert_eq!(err.field(), "cron");
        assert!(err.to_string().starts_with("invalid cron expression \"61 * * * *\""), "{err}");
        let err = Cron::parse("* * * * *", "Mars/Olympus").unwrap_err();
        assert_eq!(err.field(), "timezone");
        assert!(err.to_string().contains("unknown time zone \"Mars/Olympus\""), "{err}");
        assert!(Cron::parse("", "UTC").is_err());
        assert!(Cron::parse("* * *", "UTC").is_err());
        assert_eq!("buffer-one".parse::<Overlap>(), Ok(Overlap::BufferOne));
        assert_eq!("sometimes".parse::<Overlap>().unwrap_err().field(), "overlap");
        assert_eq!("all".parse::<CatchUp>(), Ok(CatchUp::All));
        assert_eq!("most".parse::<CatchUp>().unwrap_err().field(), "catch_up");
    }

    #[test]
    fn an_impossible_date_never_fires() {
        let cron = Cron::parse("0 0 30 2 *", "UTC").unwrap();
        assert_eq!(cron.next_after(at("2026-01-01T00:00:00Z")), None);
        let every_minute = Cron::parse("* * * * *", "UTC").unwrap();
        assert_eq!(every_minute.previous_at_or_before(at("2026-01-01T00:05:30.500Z")), Some(at("2026-01-01T00:05:00Z")));
        assert_eq!(every_minute.previous_at_or_before(at("2026-01-01T00:05:00Z")), Some(at("2026-01-01T00:05:00Z")), "inclusive");
    }

    #[test]
    fn fire_ids_are_derived_and_manual_ones_never_collide() {
        let name = ScheduleName::new("nightly").unwrap();
        let fire = at("2026-11-27T01:00:00Z");
        assert_eq!(fire_task_id(&name, fire).as_str(), "nightly@2026-11-27T01:00:00Z");
        assert_eq!(fire_task_id(&name, fire), fire_task_id(&name, fire));
        assert_eq!(manual_task_id(&name, fire).as_str(), "nightly@manual@2026-11-27T01:00:00.000Z");
        assert_ne!(manual_task_id(&name, fire), fire_task_id(&name, fire));
    }
}
