//! The audit log as SQL (see `rota_store::audit`): the `audit` table, and
//! the operator rows of the history read through the `events_operator`
//! partial index. Each is one statement.

use rota_model::Timestamp;
use rota_store::Error;
use rota_store::audit::{AuditAction, AuditCursor, AuditEntry, AuditFilter, AuditSource, NewAudit, merge};
use sqlx::{PgConnection, Row};

use crate::Result;
use crate::sql::Names;
use crate::task_sql::{event_from, json_text, parse_json};

/// The condition naming the operator kinds of the history, written exactly
/// as the partial index `events_operator` was, so that the planner can
/// prove the index covers the query (`HISTORY_SQL` repeats it).
#[cfg(test)]
const OPERATOR_KINDS: &str = "kind IN ('cancelled', 'resubmitted', 'paused', 'resumed', 'signal')";

/// The operator rows of the history, newest first, after a cursor.
const HISTORY_SQL: &str = "SELECT * FROM rota.events
  WHERE kind IN ('cancelled', 'resubmitted', 'paused', 'resumed', 'signal')
    AND at >= $1 AND at <= $2 AND (at < $2 OR seq < $3)
    AND ($4::text IS NULL OR kind = $4)
    AND ($5::text IS NULL OR coalesce(detail::jsonb ->> 'by', detail::jsonb ->> 'sent_by') = $5)
  ORDER BY at DESC, seq DESC LIMIT $6";

pub(crate) async fn record_audit(conn: &mut PgConnection, n: &Names, entry: &NewAudit, now: Timestamp) -> Result<()> {
    sqlx::query(n.sql("INSERT INTO rota.audit (at, action, actor, reason, target, detail) VALUES ($1, $2, $3, $4, $5, $6)"))
        .bind(now.as_millis())
        .bind(entry.action.as_str())
        .bind(&entry.by)
        .bind(&entry.reason)
        .bind(&entry.target)
        .bind(json_text(&entry.detail))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

pub(crate) async fn audit(conn: &mut PgConnection, n: &Names, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
    let history = if filter.reads(AuditSource::History) { history_rows(conn, n, filter).await? } else { Vec::new() };
    let table = if filter.reads(AuditSource::Table) { table_rows(conn, n, filter).await? } else { Vec::new() };
    Ok(merge(history, table, filter.limit))
}

async fn history_rows(conn: &mut PgConnection, n: &Names, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
    let (at_max, id_below) = AuditCursor::bounds(filter.after, AuditSource::History);
    let rows = sqlx::query(n.sql(HISTORY_SQL))
        .bind(filter.since_millis())
        .bind(at_max)
        .bind(id_below)
        .bind(filter.history_kind())
        .bind(&filter.by)
        .bind(i64::from(filter.limit))
        .fetch_all(&mut *conn)
        .await?;
    let mut entries = Vec::with_capacity(rows.len());
    for row in &rows {
        let event = event_from(row)?;
        let entry = AuditEntry::from_event(&event)
            .ok_or_else(|| Error::Backend(format!("history row {} ({}) is not an operator action", event.seq, event.kind.as_str())))?;
        entries.push(entry);
    }
    Ok(entries)
}

async fn table_rows(conn: &mut PgConnection, n: &Names, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
    let (at_max, id_below) = AuditCursor::bounds(filter.after, AuditSource::Table);
    let rows = sqlx::query(n.sql(
        "SELECT id, at, action, actor, reason, target, detail FROM rota.audit
          WHERE at >= $1 AND at <= $2 AND (at < $2 OR id < $3)
            AND ($4::text IS NULL OR action = $4) AND ($5::text IS NULL OR actor = $5)
          ORDER BY at DESC, id DESC LIMIT $6",
    ))
    .bind(filter.since_millis())
    .bind(at_max)
    .bind(id_below)
    .bind(filter.action.map(AuditAction::as_str))
    .bind(&filter.by)
    .bind(i64::from(filter.limit))
    .fetch_all(&mut *conn)
    .await?;
    let mut entries = Vec::with_capacity(rows.len());
    for row in &rows {
        let action: String = row.try_get("action")?;
        entries.push(AuditEntry {
            cursor: AuditCursor { at: Timestamp::from_millis(row.try_get("at")?), source: AuditSource::Table, id: row.try_get("id")? },
            action: action.parse().map_err(|e| Error::Backend(format!("stored audit action is invalid: {e}")))?,
            by: row.try_get("actor")?,
            reason: row.try_get("reason")?,
            target: row.try_get("target")?,
            detail: parse_json("audit detail", row.try_get("detail")?)?,
        });
    }
    Ok(entries)
}

/// One statement: the oldest `limit` rows before `before`, deleted.
pub(crate) async fn prune_audit(conn: &mut PgConnection, n: &Names, before: Timestamp, limit: u32) -> Result<u64> {
    let done = sqlx::query(n.sql(
        "DELETE FROM rota.audit WHERE id IN (SELECT id FROM rota.audit WHERE at < $1 ORDER BY at, id LIMIT $2 FOR UPDATE SKIP LOCKED)",
    ))
    .bind(before.as_millis())
    .bind(i64::from(limit))
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_kinds_are_the_stores_and_the_index_names_them() {
        let listed: Vec<String> = rota_store::audit::HISTORY_KINDS.iter().map(|kind| format!("'{kind}'")).collect();
        assert_eq!(OPERATOR_KINDS, format!("kind IN ({})", listed.join(", ")));
        let migrations = crate::schema::MIGRATIONS.join("\n");
        assert!(HISTORY_SQL.contains(OPERATOR_KINDS), "the listing repeats the condition");
        assert!(
            migrations.contains(&format!("ON rota.events (at, seq) WHERE {OPERATOR_KINDS};")),
            "the partial index repeats the condition"
        );
    }
}
