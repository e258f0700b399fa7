//! Schedules as SQL: creation, declaration, pause and resume, deletion,
//! and the fenced advance of a schedule's progress. Like every other
//! operation, they take `now` from the caller.

use rota_model::{ScheduleName, TaskId, Timestamp, WorkflowName};
use rota_store::{Error, NewSchedule, Result, ScheduleProgress, ScheduleRecord, ScheduleSource, ScheduleSpec};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::sql_error;

const COLUMNS: &str = "name, workflow, cron, timezone, input, overlap, catch_up, source, paused, fired_through, last_fire_at, \
                       last_task, buffered_fire_at, skipped, last_skipped_at, version, created_at, updated_at";

fn corrupt(what: &str, err: impl std::fmt::Display) -> Error {
    Error::Backend(format!("stored schedule {what} is invalid: {err}"))
}

/// A schedule row as read, before its text columns are checked.
struct ScheduleRow {
    name: String,
    workflow: String,
    cron: String,
    timezone: String,
    input: String,
    overlap: String,
    catch_up: String,
    source: String,
    paused: bool,
    fired_through: i64,
    last_fire_at: Option<i64>,
    last_task: Option<String>,
    buffered_fire_at: Option<i64>,
    skipped: i64,
    last_skipped_at: Option<i64>,
    version: i64,
    created_at: i64,
    updated_at: i64,
}

fn schedule_row(row: &Row<'_>) -> rusqlite::Result<ScheduleRow> {
    Ok(ScheduleRow {
        name: row.get(0)?,
        workflow: row.get(1)?,
        cron: row.get(2)?,
        timezone: row.get(3)?,
        input: row.get(4)?,
        overlap: row.get(5)?,
        catch_up: row.get(6)?,
        source: row.get(7)?,
        paused: row.get(8)?,
        fired_through: row.get(9)?,
        last_fire_at: row.get(10)?,
        last_task: row.get(11)?,
        buffered_fire_at: row.get(12)?,
        skipped: row.get(13)?,
        last_skipped_at: row.get(14)?,
        version: row.get(15)?,
        created_at: row.get(16)?,
        updated_at: row.get(17)?,
    })
}

fn into_record(row: ScheduleRow) -> Result<ScheduleRecord> {
    let at = Timestamp::from_millis;
    Ok(ScheduleRecord {
        name: ScheduleName::new(row.name).map_err(|e| corrupt("name", e))?,
        spec: ScheduleSpec {
            workflow: WorkflowName::new(row.workflow).map_err(|e| corrupt("workflow", e))?,
            cron: row.cron,
            timezone: row.timezone,
            input: serde_json::from_str(&row.input).map_err(|e| corrupt("input", e))?,
            overlap: row.overlap.parse().map_err(|e| corrupt("overlap", e))?,
            catch_up: row.catch_up.parse().map_err(|e| corrupt("catch_up", e))?,
        },
        source: ScheduleSource::parse(&row.source).ok_or_else(|| corrupt("source", &row.source))?,
        paused: row.paused,
        progress: ScheduleProgress {
            fired_through: at(row.fired_through),
            last_fire_at: row.last_fire_at.map(at),
            last_task: row.last_task.map(TaskId::new).transpose().map_err(|e| corrupt("last_task", e))?,
            buffered_fire_at: row.buffered_fire_at.map(at),
            skipped: row.skipped as u64,
            last_skipped_at: row.last_skipped_at.map(at),
        },
        version: row.version as u64,
        created_at: at(row.created_at),
        updated_at: at(row.updated_at),
    })
}

pub(crate) fn schedule(conn: &Connection, name: &ScheduleName) -> Result<Option<ScheduleRecord>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM schedules WHERE name = ?1"))
        .and_then(|mut stmt| stmt.query_row([name.as_str()], schedule_row).optional())
        .map_err(sql_error)?
        .map(into_record)
        .transpose()
}

pub(crate) fn schedules(conn: &Connection) -> Result<Vec<ScheduleRecord>> {
    let rows = conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM schedules ORDER BY name"))
        .and_then(|mut stmt| stmt.query_map([], schedule_row)?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    rows.into_iter().map(into_record).collect()
}

fn required(conn: &Connection, name: &ScheduleName) -> Result<ScheduleRecord> {
    schedule(conn, name)?.ok_or_else(|| Error::NotFound(format!("schedule {name}")))
}

fn insert(conn: &Connection, new: &NewSchedule, now: Timestamp) -> Result<ScheduleRecord> {
    let spec = &new.spec;
    conn.prepare_cached(
        "INSERT INTO schedules (name, workflow, cron, timezone, input, overlap, catch_up, source, paused, fired_through, skipped,
                                version, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 0, ?9, 0, 1, ?9, ?9)",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            new.name.as_str(),
            spec.workflow.as_str(),
            spec.cron,
            spec.timezone,
            spec.input.to_string(),
            spec.overlap.as_str(),
            spec.catch_up.as_str(),
            new.source.as_str(),
            now.as_millis(),
        ])
    })
    .map_err(sql_error)?;
    required(conn, &new.name)
}

pub(crate) fn create_schedule(conn: &Connection, new: &NewSchedule, now: Timestamp) -> Result<ScheduleRecord> {
    match schedule(conn, &new.name)? {
        Some(existing) if existing.spec == new.spec && existing.source == new.source => Ok(existing),
        Some(_) => Err(Error::Conflict(format!("schedule {} already exists with a different definition (delete it first)", new.name))),
        None => insert(conn, new, now),
    }
}

pub(crate) fn declare_schedule(conn: &Connection, new: &NewSchedule, now: Timestamp) -> Result<ScheduleRecord> {
    let Some(existing) = schedule(conn, &new.name)? else { return insert(conn, new, now) };
    if existing.spec == new.spec && existing.source == new.source {
        return Ok(existing);
    }
    let fired_through = if existing.spec == new.spec { existing.progress.fired_through } else { existing.progress.fired_through.max(now) };
    let spec = &new.spec;
    conn.prepare_cached(
        "UPDATE schedules SET workflow = ?2, cron = ?3, timezone = ?4, input = ?5, overlap = ?6, catch_up = ?7, source = ?8,
                              fired_through = ?9, version = version + 1, updated_at = ?10
          WHERE name = ?1",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            new.name.as_str(),
            spec.workflow.as_str(),
            spec.cron,
            spec.timezone,
            spec.input.to_string(),
            spec.overlap.as_str(),
            spec.catch_up.as_str(),
            new.source.as_str(),
            fired_through.as_millis(),
            now.as_millis(),
        ])
    })
    .map_err(sql_error)?;
    required(conn, &new.name)
}

pub(crate) fn pause_schedule(conn: &Connection, name: &ScheduleName, now: Timestamp) -> Result<ScheduleRecord> {
    conn.prepare_cached("UPDATE schedules SET paused = 1, version = version + 1, updated_at = ?2 WHERE name = ?1 AND paused = 0")
        .and_then(|mut stmt| stmt.execute(params![name.as_str(), now.as_millis()]))
        .map_err(sql_error)?;
    required(conn, name)
}

pub(crate) fn resume_schedule(conn: &Connection, name: &ScheduleName, now: Timestamp) -> Result<ScheduleRecord> {
    conn.prepare_cached(
        "UPDATE schedules SET paused = 0, fired_through = MAX(fired_through, ?2), version = version + 1, updated_at = ?2
          WHERE name = ?1 AND paused = 1",
    )
    .and_then(|mut stmt| stmt.execute(params![name.as_str(), now.as_millis()]))
    .map_err(sql_error)?;
    required(conn, name)
}

pub(crate) fn delete_schedule(conn: &Connection, name: &ScheduleName) -> Result<()> {
    let deleted = conn
        .prepare_cached("DELETE FROM schedules WHERE name = ?1")
        .and_then(|mut stmt| stmt.execute([name.as_str()]))
        .map_err(sql_error)?;
    if deleted == 0 {
        return Err(Error::NotFound(format!("schedule {name}")));
    }
    Ok(())
}

pub(crate) fn advance_schedule(
    conn: &Connection,
    name: &ScheduleName,
    expected_version: u64,
    progress: &ScheduleProgress,
    now: Timestamp,
) -> Result<ScheduleRecord> {
    let millis = |at: Option<Timestamp>| at.map(Timestamp::as_millis);
    let updated = conn
        .prepare_cached(
            "UPDATE schedules SET fired_through = ?3, last_fire_at = ?4, last_task = ?5, buffered_fire_at = ?6, skipped = ?7,
                                  last_skipped_at = ?8, version = version + 1, updated_at = ?9
              WHERE name = ?1 AND version = ?2",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                name.as_str(),
                expected_version as i64,
                progress.fired_through.as_millis(),
                millis(progress.last_fire_at),
                progress.last_task.as_ref().map(TaskId::as_str),
                millis(progress.buffered_fire_at),
                progress.skipped as i64,
                millis(progress.last_skipped_at),
                now.as_millis(),
            ])
        })
        .map_err(sql_error)?;
    let record = required(conn, name)?;
    if updated == 0 {
        return Err(Error::Conflict(format!(
            "schedule {name} is at version {}, not {expected_version}: someone else advanced or changed it",
            record.version
        )));
    }
    Ok(record)
}
