//! Bulk-action batches as SQL (see `rota_store::batch`). Like the other
//! operations, they take `now` from the caller.

use std::time::Duration;

use rota_model::{InstanceId, Timestamp};
use rota_store::{BatchCursor, BatchFilter, BatchProgress, BatchRecord, Error, NewBatch};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use crate::sql::Names;
use crate::{Fail, Result};

fn corrupt(what: &str, err: impl std::fmt::Display) -> Fail {
    Error::Backend(format!("stored batch {what} is invalid: {err}")).into()
}

fn batch_from(row: &PgRow) -> Result<BatchRecord> {
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let filter = BatchFilter::from_json(&row.try_get::<String, _>("filter")?).map_err(|e| corrupt("filter", e))?;
    Ok(BatchRecord {
        id: row.try_get("id")?,
        action: row.try_get::<String, _>("action")?.parse().map_err(|e| corrupt("action", e))?,
        cursor: row
            .try_get::<Option<String>, _>("cursor")?
            .map(|text| BatchCursor::from_text(&filter, text))
            .transpose()
            .map_err(|e| corrupt("cursor", e))?,
        filter,
        total: count(row.try_get("total")?),
        requested_by: row.try_get("requested_by")?,
        reason: row.try_get("reason")?,
        state: row.try_get::<String, _>("state")?.parse().map_err(|e| corrupt("state", e))?,
        done: count(row.try_get("done")?),
        skipped: count(row.try_get("skipped")?),
        failed: count(row.try_get("failed")?),
        last_error: row.try_get("last_error")?,
        locked_by: row.try_get::<Option<String>, _>("locked_by")?.map(InstanceId::new).transpose().map_err(|e| corrupt("locked_by", e))?,
        lease_until: row.try_get::<Option<i64>, _>("lease_until")?.map(Timestamp::from_millis),
        created_at: Timestamp::from_millis(row.try_get("created_at")?),
        updated_at: Timestamp::from_millis(row.try_get("updated_at")?),
    })
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(crate) async fn create_batch(conn: &mut PgConnection, n: &Names, new: &NewBatch, now: Timestamp) -> Result<BatchRecord> {
    let row = sqlx::query(n.sql(
        "INSERT INTO rota.batches (id, action, filter, total, requested_by, reason, state, done, skipped, failed, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, 'running', 0, 0, 0, $7, $7)
         ON CONFLICT (id) DO NOTHING
         RETURNING *",
    ))
    .bind(&new.id)
    .bind(new.action.as_str())
    .bind(new.filter.to_json())
    .bind(count(new.total))
    .bind(&new.requested_by)
    .bind(&new.reason)
    .bind(now.as_millis())
    .fetch_optional(&mut *conn)
    .await?;
    match row {
        Some(row) => batch_from(&row),
        None => Err(Error::Conflict(format!("batch {} exists", new.id)).into()),
    }
}

pub(crate) async fn batch(conn: &mut PgConnection, n: &Names, id: &str) -> Result<Option<BatchRecord>> {
    let row = sqlx::query(n.sql("SELECT * FROM rota.batches WHERE id = $1")).bind(id).fetch_optional(&mut *conn).await?;
    row.as_ref().map(batch_from).transpose()
}

pub(crate) async fn batches(conn: &mut PgConnection, n: &Names, limit: u32) -> Result<Vec<BatchRecord>> {
    let rows = sqlx::query(n.sql("SELECT * FROM rota.batches ORDER BY created_at DESC, id DESC LIMIT $1"))
        .bind(i64::from(limit))
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(batch_from).collect()
}

/// One statement: the batch named, or the oldest free one, locked against
/// another runner's claim (`SKIP LOCKED`), taken for `owner`.
pub(crate) async fn claim_batch(
    conn: &mut PgConnection,
    n: &Names,
    id: Option<&str>,
    owner: &InstanceId,
    lease: Duration,
    now: Timestamp,
) -> Result<Option<BatchRecord>> {
    let row = sqlx::query(n.sql(
        "WITH chosen AS (
             SELECT id FROM rota.batches
              WHERE state = 'running' AND ($1::text IS NULL OR id = $1)
                AND (locked_by IS NULL OR locked_by = $2 OR lease_until <= $3)
              ORDER BY created_at, id LIMIT 1
                FOR UPDATE SKIP LOCKED)
         UPDATE rota.batches AS b SET locked_by = $2, lease_until = $4, updated_at = $3
           FROM chosen WHERE b.id = chosen.id
         RETURNING b.*",
    ))
    .bind(id)
    .bind(owner.as_str())
    .bind(now.as_millis())
    .bind(now.add(lease).as_millis())
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(batch_from).transpose()
}

pub(crate) async fn advance_batch(
    conn: &mut PgConnection,
    n: &Names,
    id: &str,
    owner: &InstanceId,
    progress: &BatchProgress,
    lease: Duration,
    now: Timestamp,
) -> Result<Option<BatchRecord>> {
    let (state, locked_by, lease_until) =
        if progress.finished { ("done", None, None) } else { ("running", Some(owner.as_str()), Some(now.add(lease).as_millis())) };
    let row = sqlx::query(n.sql(
        "UPDATE rota.batches SET cursor = $3, done = $4, skipped = $5, failed = $6, last_error = coalesce($7, last_error), state = $8,
                locked_by = $9, lease_until = $10, updated_at = $11
          WHERE id = $1 AND locked_by = $2 AND state = 'running'
      RETURNING *",
    ))
    .bind(id)
    .bind(owner.as_str())
    .bind(progress.cursor.as_ref().map(BatchCursor::to_text))
    .bind(count(progress.done))
    .bind(count(progress.skipped))
    .bind(count(progress.failed))
    .bind(&progress.last_error)
    .bind(state)
    .bind(locked_by)
    .bind(lease_until)
    .bind(now.as_millis())
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(batch_from).transpose()
}

pub(crate) async fn stop_batch(conn: &mut PgConnection, n: &Names, id: &str, now: Timestamp) -> Result<Option<BatchRecord>> {
    sqlx::query(n.sql("UPDATE rota.batches SET state = 'stopped', locked_by = NULL, lease_until = NULL, updated_at = $2 WHERE id = $1 AND state = 'running'"))
        .bind(id)
        .bind(now.as_millis())
        .execute(&mut *conn)
        .await?;
    batch(conn, n, id).await
}
