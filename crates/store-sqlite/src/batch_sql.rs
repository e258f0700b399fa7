//! Bulk-action batches as SQL (see `rota_store::batch`). Like the other
//! operations, they take `now` from the caller.

use std::time::Duration;

use rota_model::{InstanceId, Timestamp};
use rota_store::{BatchCursor, BatchFilter, BatchProgress, BatchRecord, Error, NewBatch, Result};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::sql_error;

const BATCH_COLUMNS: &str = "id, action, filter, total, requested_by, reason, state, cursor, done, skipped, failed, last_error, \
                             locked_by, lease_until, created_at, updated_at";

fn corrupt(what: &str, err: impl std::fmt::Display) -> Error {
    Error::Backend(format!("stored batch {what} is invalid: {err}"))
}

/// A batch row as read, before its text columns are checked.
struct BatchRow {
    id: String,
    action: String,
    filter: String,
    total: i64,
    requested_by: String,
    reason: Option<String>,
    state: String,
    cursor: Option<String>,
    done: i64,
    skipped: i64,
    failed: i64,
    last_error: Option<String>,
    locked_by: Option<String>,
    lease_until: Option<i64>,
    created_at: i64,
    updated_at: i64,
}

fn batch_row(row: &Row<'_>) -> rusqlite::Result<BatchRow> {
    Ok(BatchRow {
        id: row.get(0)?,
        action: row.get(1)?,
        filter: row.get(2)?,
        total: row.get(3)?,
        requested_by: row.get(4)?,
        reason: row.get(5)?,
        state: row.get(6)?,
        cursor: row.get(7)?,
        done: row.get(8)?,
        skipped: row.get(9)?,
        failed: row.get(10)?,
        last_error: row.get(11)?,
        locked_by: row.get(12)?,
        lease_until: row.get(13)?,
        created_at: row.get(14)?,
        updated_at: row.get(15)?,
    })
}

impl BatchRow {
    fn into_record(self) -> Result<BatchRecord> {
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let filter = BatchFilter::from_json(&self.filter).map_err(|e| corrupt("filter", e))?;
        Ok(BatchRecord {
            action: self.action.parse().map_err(|e| corrupt("action", e))?,
            cursor: self.cursor.map(|text| BatchCursor::from_text(&filter, text)).transpose().map_err(|e| corrupt("cursor", e))?,
            filter,
            total: count(self.total),
            requested_by: self.requested_by,
            reason: self.reason,
            state: self.state.parse().map_err(|e| corrupt("state", e))?,
            done: count(self.done),
            skipped: count(self.skipped),
            failed: count(self.failed),
            last_error: self.last_error,
            locked_by: self.locked_by.map(InstanceId::new).transpose().map_err(|e| corrupt("locked_by", e))?,
            lease_until: self.lease_until.map(Timestamp::from_millis),
            created_at: Timestamp::from_millis(self.created_at),
            updated_at: Timestamp::from_millis(self.updated_at),
            id: self.id,
        })
    }
}

fn one(conn: &Connection, sql: &str, values: impl rusqlite::Params) -> Result<Option<BatchRecord>> {
    let row = conn.prepare_cached(sql).and_then(|mut stmt| stmt.query_row(values, batch_row).optional()).map_err(sql_error)?;
    row.map(BatchRow::into_record).transpose()
}

pub(crate) fn create_batch(conn: &Connection, new: &NewBatch, now: Timestamp) -> Result<BatchRecord> {
    let inserted = conn
        .prepare_cached(
            "INSERT INTO batches (id, action, filter, total, requested_by, reason, state, done, skipped, failed, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running', 0, 0, 0, ?7, ?7)
             ON CONFLICT (id) DO NOTHING",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                new.id,
                new.action.as_str(),
                new.filter.to_json(),
                i64::try_from(new.total).unwrap_or(i64::MAX),
                new.requested_by,
                new.reason,
                now.as_millis(),
            ])
        })
        .map_err(sql_error)?;
    if inserted == 0 {
        return Err(Error::Conflict(format!("batch {} exists", new.id)));
    }
    batch(conn, &new.id)?.ok_or_else(|| Error::Backend(format!("batch {} vanished after its insert", new.id)))
}

pub(crate) fn batch(conn: &Connection, id: &str) -> Result<Option<BatchRecord>> {
    one(conn, &format!("SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?1"), [id])
}

pub(crate) fn batches(conn: &Connection, limit: u32) -> Result<Vec<BatchRecord>> {
    let rows = conn
        .prepare_cached(&format!("SELECT {BATCH_COLUMNS} FROM batches ORDER BY created_at DESC, id DESC LIMIT ?1"))
        .and_then(|mut stmt| stmt.query_map([limit], batch_row)?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    rows.into_iter().map(BatchRow::into_record).collect()
}

pub(crate) fn claim_batch(
    conn: &Connection,
    id: Option<&str>,
    owner: &InstanceId,
    lease: Duration,
    now: Timestamp,
) -> Result<Option<BatchRecord>> {
    let free = "state = 'running' AND (locked_by IS NULL OR locked_by = ?2 OR lease_until <= ?3)";
    let target = match id {
        Some(id) => id.to_owned(),
        None => {
            let oldest: Option<String> = conn
                .prepare_cached(&format!(
                    "SELECT id FROM batches WHERE {} ORDER BY created_at, id LIMIT 1",
                    free.replace("?2", "?1").replace("?3", "?2")
                ))
                .and_then(|mut stmt| stmt.query_row(params![owner.as_str(), now.as_millis()], |row| row.get(0)).optional())
                .map_err(sql_error)?;
            match oldest {
                Some(id) => id,
                None => return Ok(None),
            }
        }
    };
    one(
        conn,
        &format!("UPDATE batches SET locked_by = ?2, lease_until = ?4, updated_at = ?3 WHERE id = ?1 AND {free} RETURNING {BATCH_COLUMNS}"),
        params![target, owner.as_str(), now.as_millis(), now.add(lease).as_millis()],
    )
}

pub(crate) fn advance_batch(
    conn: &Connection,
    id: &str,
    owner: &InstanceId,
    progress: &BatchProgress,
    lease: Duration,
    now: Timestamp,
) -> Result<Option<BatchRecord>> {
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let (state, locked_by, lease_until) =
        if progress.finished { ("done", None, None) } else { ("running", Some(owner.as_str()), Some(now.add(lease).as_millis())) };
    one(
        conn,
        &format!(
            "UPDATE batches SET cursor = ?3, done = ?4, skipped = ?5, failed = ?6, last_error = coalesce(?7, last_error), state = ?8,
                    locked_by = ?9, lease_until = ?10, updated_at = ?11
              WHERE id = ?1 AND locked_by = ?2 AND state = 'running'
          RETURNING {BATCH_COLUMNS}"
        ),
        params![
            id,
            owner.as_str(),
            progress.cursor.as_ref().map(BatchCursor::to_text),
            count(progress.done),
            count(progress.skipped),
            count(progress.failed),
            progress.last_error,
            state,
            locked_by,
            lease_until,
            now.as_millis(),
        ],
    )
}

pub(crate) fn stop_batch(conn: &Connection, id: &str, now: Timestamp) -> Result<Option<BatchRecord>> {
    conn.prepare_cached(
        "UPDATE batches SET state = 'stopped', locked_by = NULL, lease_until = NULL, updated_at = ?2 WHERE id = ?1 AND state = 'running'",
    )
    .and_then(|mut stmt| stmt.execute(params![id, now.as_millis()]))
    .map_err(sql_error)?;
    batch(conn, id)
}
