//! Schedules as SQL: creation, declaration, pause and resume, deletion,
//! and the fenced advance of a schedule's progress. Like every other
//! operation, they take `now` from the caller.

use rota_model::{ScheduleName, TaskId, Timestamp, WorkflowName};
use rota_store::{Error, NewSchedule, ScheduleProgress, ScheduleRecord, ScheduleSource, ScheduleSpec};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use crate::sql::Names;
use crate::{Fail, Result};

/// The columns every statement returns, in `record_from`'s terms.
macro_rules! columns {
    () => {
        "name, workflow, cron, timezone, input, overlap, catch_up, source, paused, fired_through, last_fire_at, last_task, \
         buffered_fire_at, skipped, last_skipped_at, version, created_at, updated_at"
    };
}

fn corrupt(what: &str, err: impl std::fmt::Display) -> Fail {
    Error::Backend(format!("stored schedule {what} is invalid: {err}")).into()
}

fn record_from(row: &PgRow) -> Result<ScheduleRecord> {
    let at = Timestamp::from_millis;
    let optional_at = |column: &str| -> Result<Option<Timestamp>> { Ok(row.try_get::<Option<i64>, _>(column)?.map(at)) };
    let text = |column: &str| -> Result<String> { Ok(row.try_get::<String, _>(column)?) };
    let source = text("source")?;
    Ok(ScheduleRecord {
        name: ScheduleName::new(text("name")?).map_err(|e| corrupt("name", e))?,
        spec: ScheduleSpec {
            workflow: WorkflowName::new(text("workflow")?).map_err(|e| corrupt("workflow", e))?,
            cron: text("cron")?,
            timezone: text("timezone")?,
            input: serde_json::from_str(&text("input")?).map_err(|e| corrupt("input", e))?,
            overlap: text("overlap")?.parse().map_err(|e| corrupt("overlap", e))?,
            catch_up: text("catch_up")?.parse().map_err(|e| corrupt("catch_up", e))?,
        },
        source: ScheduleSource::parse(&source).ok_or_else(|| corrupt("source", &source))?,
        paused: row.try_get("paused")?,
        progress: ScheduleProgress {
            fired_through: at(row.try_get("fired_through")?),
            last_fire_at: optional_at("last_fire_at")?,
            last_task: row.try_get::<Option<String>, _>("last_task")?.map(TaskId::new).transpose().map_err(|e| corrupt("last_task", e))?,
            buffered_fire_at: optional_at("buffered_fire_at")?,
            skipped: row.try_get::<i64, _>("skipped")? as u64,
            last_skipped_at: optional_at("last_skipped_at")?,
        },
        version: row.try_get::<i64, _>("version")? as u64,
        created_at: at(row.try_get("created_at")?),
        updated_at: at(row.try_get("updated_at")?),
    })
}

pub(crate) async fn schedule(conn: &mut PgConnection, n: &Names, name: &ScheduleName) -> Result<Option<ScheduleRecord>> {
    let row = sqlx::query(n.sql(concat!("SELECT ", columns!(), " FROM rota.schedules WHERE name = $1")))
        .bind(name.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    row.as_ref().map(record_from).transpose()
}

pub(crate) async fn schedules(conn: &mut PgConnection, n: &Names) -> Result<Vec<ScheduleRecord>> {
    let rows = sqlx::query(n.sql(concat!("SELECT ", columns!(), " FROM rota.schedules ORDER BY name COLLATE \"C\"")))
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(record_from).collect()
}

async fn required(conn: &mut PgConnection, n: &Names, name: &ScheduleName) -> Result<ScheduleRecord> {
    schedule(conn, n, name).await?.ok_or_else(|| Error::NotFound(format!("schedule {name}")).into())
}

/// Inserts `new` unless a schedule of that name exists; returns the new
/// record, or `None` when one existed.
async fn insert(conn: &mut PgConnection, n: &Names, new: &NewSchedule, now: Timestamp) -> Result<Option<ScheduleRecord>> {
    let spec = &new.spec;
    let row = sqlx::query(n.sql(concat!(
        "INSERT INTO rota.schedules (name, workflow, cron, timezone, input, overlap, catch_up, source, paused, fired_through, skipped,
                                     version, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, false, $9, 0, 1, $9, $9)
         ON CONFLICT (name) DO NOTHING
         RETURNING ",
        columns!()
    )))
    .bind(new.name.as_str())
    .bind(spec.workflow.as_str())
    .bind(&spec.cron)
    .bind(&spec.timezone)
    .bind(spec.input.to_string())
    .bind(spec.overlap.as_str())
    .bind(spec.catch_up.as_str())
    .bind(new.source.as_str())
    .bind(now.as_millis())
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(record_from).transpose()
}

pub(crate) async fn create_schedule(conn: &mut PgConnection, n: &Names, new: &NewSchedule, now: Timestamp) -> Result<ScheduleRecord> {
    if let Some(created) = insert(conn, n, new, now).await? {
        return Ok(created);
    }
    let existing = required(conn, n, &new.name).await?;
    if existing.spec == new.spec && existing.source == new.source {
        return Ok(existing);
    }
    Err(Error::Conflict(format!("schedule {} already exists with a different definition (delete it first)", new.name)).into())
}

pub(crate) async fn declare_schedule(conn: &mut PgConnection, n: &Names, new: &NewSchedule, now: Timestamp) -> Result<ScheduleRecord> {
    if let Some(created) = insert(conn, n, new, now).await? {
        return Ok(created);
    }
    let row = sqlx::query(n.sql(concat!("SELECT ", columns!(), " FROM rota.schedules WHERE name = $1 FOR UPDATE")))
        .bind(new.name.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    let Some(existing) = row.as_ref().map(record_from).transpose()? else {
        return Err(Error::Conflict(format!("schedule {} was deleted while being declared", new.name)).into());
    };
    if existing.spec == new.spec && existing.source == new.source {
        return Ok(existing);
    }
    let fired_through = if existing.spec == new.spec { existing.progress.fired_through } else { existing.progress.fired_through.max(now) };
    let spec = &new.spec;
    let row = sqlx::query(n.sql(concat!(
        "UPDATE rota.schedules SET workflow = $2, cron = $3, timezone = $4, input = $5, overlap = $6, catch_up = $7, source = $8,
                                   fired_through = $9, version = version + 1, updated_at = $10
          WHERE name = $1
         RETURNING ",
        columns!()
    )))
    .bind(new.name.as_str())
    .bind(spec.workflow.as_str())
    .bind(&spec.cron)
    .bind(&spec.timezone)
    .bind(spec.input.to_string())
    .bind(spec.overlap.as_str())
    .bind(spec.catch_up.as_str())
    .bind(new.source.as_str())
    .bind(fired_through.as_millis())
    .bind(now.as_millis())
    .fetch_one(&mut *conn)
    .await?;
    record_from(&row)
}

pub(crate) async fn pause_schedule(conn: &mut PgConnection, n: &Names, name: &ScheduleName, now: Timestamp) -> Result<ScheduleRecord> {
    sqlx::query(n.sql("UPDATE rota.schedules SET paused = true, version = version + 1, updated_at = $2 WHERE name = $1 AND NOT paused"))
        .bind(name.as_str())
        .bind(now.as_millis())
        .execute(&mut *conn)
        .await?;
    required(conn, n, name).await
}

pub(crate) async fn resume_schedule(conn: &mut PgConnection, n: &Names, name: &ScheduleName, now: Timestamp) -> Result<ScheduleRecord> {
    sqlx::query(n.sql(
        "UPDATE rota.schedules SET paused = false, fired_through = GREATEST(fired_through, $2), version = version + 1, updated_at = $2
          WHERE name = $1 AND paused",
    ))
    .bind(name.as_str())
    .bind(now.as_millis())
    .execute(&mut *conn)
    .await?;
    required(conn, n, name).await
}

pub(crate) async fn delete_schedule(conn: &mut PgConnection, n: &Names, name: &ScheduleName) -> Result<()> {
    let deleted = sqlx::query(n.sql("DELETE FROM rota.schedules WHERE name = $1")).bind(name.as_str()).execute(&mut *conn).await?;
    if deleted.rows_affected() == 0 {
        return Err(Error::NotFound(format!("schedule {name}")).into());
    }
    Ok(())
}

pub(crate) async fn advance_schedule(
    conn: &mut PgConnection,
    n: &Names,
    name: &ScheduleName,
    expected_version: u64,
    progress: &ScheduleProgress,
    now: Timestamp,
) -> Result<ScheduleRecord> {
    let millis = |at: Option<Timestamp>| at.map(Timestamp::as_millis);
    let row = sqlx::query(n.sql(concat!(
        "UPDATE rota.schedules SET fired_through = $3, last_fire_at = $4, last_task = $5, buffered_fire_at = $6, skipped = $7,
                                   last_skipped_at = $8, version = version + 1, updated_at = $9
          WHERE name = $1 AND version = $2
         RETURNING ",
        columns!()
    )))
    .bind(name.as_str())
    .bind(expected_version as i64)
    .bind(progress.fired_through.as_millis())
    .bind(millis(progress.last_fire_at))
    .bind(progress.last_task.as_ref().map(TaskId::as_str))
    .bind(millis(progress.buffered_fire_at))
    .bind(progress.skipped as i64)
    .bind(millis(progress.last_skipped_at))
    .bind(now.as_millis())
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(row) = row {
        return record_from(&row);
    }
    let current = required(conn, n, name).await?;
    Err(Error::Conflict(format!(
        "schedule {name} is at version {}, not {expected_version}: someone else advanced or changed it",
        current.version
    ))
    .into())
}
