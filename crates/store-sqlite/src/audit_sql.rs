//! The audit log as SQL (see `rota_store::audit`): the `audit` table, and
//! the operator rows of the history read through the `events_operator`
//! partial index. Like the other operations, they take `now` from the
//! caller.

use rota_model::Timestamp;
use rota_store::audit::{AuditAction, AuditCursor, AuditEntry, AuditFilter, AuditSource, NewAudit, merge};
use rota_store::{Error, Result};
use rusqlite::{Connection, params};

use crate::sql_error;
use crate::task_sql::{event_row, into_event, parse_json};

/// The condition naming the operator kinds of the history, written exactly
/// as the partial index `events_operator` was (SQLite uses a partial index
/// only for a query that repeats its condition).
const OPERATOR_KINDS: &str = "kind IN ('cancelled', 'resubmitted', 'paused', 'resumed', 'signal')";

pub(crate) fn record_audit(conn: &Connection, entry: &NewAudit, now: Timestamp) -> Result<()> {
    conn.prepare_cached("INSERT INTO audit (at, action, actor, reason, target, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
        .and_then(|mut stmt| {
            stmt.execute(params![
                now.as_millis(),
                entry.action.as_str(),
                entry.by,
                entry.reason,
                entry.target,
                serde_json::to_string(&entry.detail).expect("a JSON value serialises"),
            ])
        })
        .map_err(sql_error)?;
    Ok(())
}

pub(crate) fn audit(conn: &Connection, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
    let history = if filter.reads(AuditSource::History) { history_rows(conn, filter)? } else { Vec::new() };
    let table = if filter.reads(AuditSource::Table) { table_rows(conn, filter)? } else { Vec::new() };
    Ok(merge(history, table, filter.limit))
}

fn history_rows(conn: &Connection, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
    let (at_max, id_below) = AuditCursor::bounds(filter.after, AuditSource::History);
    let sql = format!(
        "SELECT seq, task_id, at, kind, step, attempt, detail, hash FROM events
          WHERE {OPERATOR_KINDS} AND at >= ?1 AND at <= ?2 AND (at < ?2 OR seq < ?3)
            AND (?4 IS NULL OR kind = ?4)
            AND (?5 IS NULL OR coalesce(json_extract(detail, '$.by'), json_extract(detail, '$.sent_by')) = ?5)
          ORDER BY at DESC, seq DESC LIMIT ?6"
    );
    let rows = conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| {
            stmt.query_map(params![filter.since_millis(), at_max, id_below, filter.history_kind(), filter.by, filter.limit], event_row)?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql_error)?;
    let mut entries = Vec::with_capacity(rows.len());
    for row in rows {
        let event = into_event(row)?;
        let entry = AuditEntry::from_event(&event)
            .ok_or_else(|| Error::Backend(format!("history row {} ({}) is not an operator action", event.seq, event.kind.as_str())))?;
        entries.push(entry);
    }
    Ok(entries)
}

fn table_rows(conn: &Connection, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
    let (at_max, id_below) = AuditCursor::bounds(filter.after, AuditSource::Table);
    type Row = (i64, i64, String, String, Option<String>, String, String);
    let rows: Vec<Row> = conn
        .prepare_cached(
            "SELECT id, at, action, actor, reason, target, detail FROM audit
              WHERE at >= ?1 AND at <= ?2 AND (at < ?2 OR id < ?3)
                AND (?4 IS NULL OR action = ?4) AND (?5 IS NULL OR actor = ?5)
              ORDER BY at DESC, id DESC LIMIT ?6",
        )
        .and_then(|mut stmt| {
            stmt.query_map(
                params![filter.since_millis(), at_max, id_below, filter.action.map(AuditAction::as_str), filter.by, filter.limit],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?, row.get(6)?)),
            )?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql_error)?;
    rows.into_iter()
        .map(|(id, at, action, by, reason, target, detail)| {
            Ok(AuditEntry {
                cursor: AuditCursor { at: Timestamp::from_millis(at), source: AuditSource::Table, id },
                action: action.parse().map_err(|e| Error::Backend(format!("stored audit action is invalid: {e}")))?,
                by,
                reason,
                target,
                detail: parse_json("audit detail", detail)?,
            })
        })
        .collect()
}

pub(crate) fn prune_audit(conn: &Connection, before: Timestamp, limit: u32) -> Result<u64> {
    let deleted = conn
        .prepare_cached("DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < ?1 ORDER BY at, id LIMIT ?2)")
        .and_then(|mut stmt| stmt.execute(params![before.as_millis(), limit]))
        .map_err(sql_error)?;
    Ok(deleted as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_kinds_are_the_stores_and_the_index_names_them() {
        let listed: Vec<String> = rota_store::audit::HISTORY_KINDS.iter().map(|kind| format!("'{kind}'")).collect();
        assert_eq!(OPERATOR_KINDS, format!("kind IN ({})", listed.join(", ")));
        let migrations = crate::schema::MIGRATIONS.join("\n");
        assert!(migrations.contains(&format!("ON events (at, seq) WHERE {OPERATOR_KINDS};")), "the partial index repeats the condition");
    }
}
