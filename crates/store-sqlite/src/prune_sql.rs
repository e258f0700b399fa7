//! Retention as SQL: deleting finished tasks in batches, and the leftovers
//! of instances that are gone. The rules are written in `rota_store::prune`.

use rota_model::{TaskId, Timestamp};
use rota_store::{Error, InstanceSweep, Prune, PruneWorkflows, Pruned, Result, Swept};
use rusqlite::types::Value as Sql;
use rusqlite::{Connection, OptionalExtension, params, params_from_iter};

use crate::sql_error;

/// The `WHERE` clause selecting the tasks `prune` deletes, and its
/// parameters. The first term repeats the partial index's own condition
/// word for word, which is how SQLite knows the index applies; the state
/// names come from `TaskState::as_str`, never from the caller's text.
fn selection(prune: &Prune) -> (String, Vec<Sql>) {
    let states = prune.state_names().iter().map(|name| format!("'{name}'")).collect::<Vec<_>>().join(", ");
    let mut sql = format!(
        "t.state IN ('processed', 'error', 'compensated', 'cancelled') AND t.state IN ({states}) AND t.updated_at < ?1 \
         AND NOT EXISTS (SELECT 1 FROM schedules s \
             WHERE substr(t.id, 1, length(s.name) + 1) = s.name || '@' \
             AND t.updated_at >= min(s.fired_through, coalesce(s.buffered_fire_at, s.fired_through)))"
    );
    let mut values = vec![Sql::Integer(prune.finished_before.as_millis())];
    match &prune.workflows {
        PruneWorkflows::All => {}
        PruneWorkflows::Only(name) => {
            sql.push_str(" AND t.workflow = ?2");
            values.push(Sql::Text(name.to_string()));
        }
        PruneWorkflows::Except(names) if names.is_empty() => {}
        PruneWorkflows::Except(names) => {
            let marks = (0..names.len()).map(|i| format!("?{}", i + 2)).collect::<Vec<_>>().join(", ");
            sql.push_str(&format!(" AND t.workflow NOT IN ({marks})"));
            values.extend(names.iter().map(|name| Sql::Text(name.to_string())));
        }
    }
    if let Some(only) = &prune.only {
        let first = values.len() + 1;
        let marks = (0..only.len()).map(|i| format!("?{}", first + i)).collect::<Vec<_>>().join(", ");
        sql.push_str(&format!(" AND t.id IN ({marks})"));
        values.extend(only.iter().map(|id| Sql::Text(id.to_string())));
    }
    (sql, values)
}

/// The ids of the next batch, oldest end first: what `prune_tasks` deletes.
fn batch(conn: &Connection, prune: &Prune) -> Result<Vec<String>> {
    let (selection, mut values) = selection(prune);
    let limit_mark = values.len() + 1;
    values.push(Sql::Integer(i64::from(prune.limit)));
    let sql = format!("SELECT t.id FROM tasks t WHERE {selection} ORDER BY t.updated_at, t.id LIMIT ?{limit_mark}");
    conn.prepare_cached(&sql)
        .and_then(|mut stmt| stmt.query_map(params_from_iter(values.iter()), |row| row.get(0))?.collect())
        .map_err(sql_error)
}

fn task_id(id: &str) -> Result<TaskId> {
    TaskId::new(id).map_err(|e| Error::Backend(format!("stored task id is invalid: {e}")))
}

pub(crate) fn prunable_tasks(conn: &Connection, prune: &Prune) -> Result<Vec<TaskId>> {
    batch(conn, prune)?.iter().map(|id| task_id(id)).collect()
}

/// Deletes one batch, then gives back up to `vacuum_pages` free pages of
/// the file (`PRAGMA incremental_vacuum`), inside the writer's transaction.
pub(crate) fn prune_tasks(conn: &Connection, prune: &Prune, vacuum_pages: u32) -> Result<Pruned> {
    let ids = batch(conn, prune)?;
    let mut pruned = Pruned::default();
    for id in &ids {
        pruned.events +=
            conn.prepare_cached("DELETE FROM events WHERE task_id = ?1").and_then(|mut s| s.execute([id])).map_err(sql_error)? as u64;
        pruned.steps +=
            conn.prepare_cached("DELETE FROM steps WHERE task_id = ?1").and_then(|mut s| s.execute([id])).map_err(sql_error)? as u64;
        // Each tag row by its key, through the tags the task keeps.
        conn.prepare_cached(
            "DELETE FROM task_tags WHERE (key, value, task_id) IN \
             (SELECT j.key, j.value, t.id FROM tasks AS t, json_each(t.tags) AS j WHERE t.id = ?1)",
        )
        .and_then(|mut s| s.execute([id]))
        .map_err(sql_error)?;
        conn.prepare_cached("DELETE FROM tasks WHERE id = ?1").and_then(|mut s| s.execute([id])).map_err(sql_error)?;
        pruned.tasks.push(task_id(id)?);
    }
    if vacuum_pages > 0 {
        incremental_vacuum(conn, vacuum_pages)?;
    }
    Ok(pruned)
}

/// Gives back up to `pages` free pages. A no-op on a file whose
/// auto_vacuum is not INCREMENTAL; each page moved is a write, hence the
/// bound. The pragma frees one page per step, so it is stepped to the end.
fn incremental_vacuum(conn: &Connection, pages: u32) -> Result<()> {
    let mut stmt = conn.prepare_cached(&format!("PRAGMA incremental_vacuum({pages})")).map_err(sql_error)?;
    let mut rows = stmt.query([]).map_err(sql_error)?;
    while rows.next().map_err(sql_error)?.is_some() {}
    Ok(())
}

pub(crate) fn count_prunable(conn: &Connection, prune: &Prune) -> Result<u64> {
    let (selection, values) = selection(prune);
    let sql = format!("SELECT count(*) FROM tasks t WHERE {selection}");
    let count: i64 = conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| stmt.query_row(params_from_iter(values.iter()), |row| row.get(0)))
        .map_err(sql_error)?;
    Ok(count as u64)
}

pub(crate) fn delete_statuses(conn: &Connection, prefix: &str, reported_before: Timestamp) -> Result<u64> {
    let deleted = conn
        .prepare_cached("DELETE FROM statuses WHERE substr(key, 1, length(?1)) = ?1 AND reported_at < ?2")
        .and_then(|mut stmt| stmt.execute(params![prefix, reported_before.as_millis()]))
        .map_err(sql_error)?;
    Ok(deleted as u64)
}

pub(crate) fn sweep_instance(conn: &Connection, sweep: &InstanceSweep) -> Result<Swept> {
    let gone: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM statuses WHERE key = ?1 AND reported_at < ?2)")
        .and_then(|mut stmt| stmt.query_row(params![sweep.heartbeat_key, sweep.gone_before.as_millis()], |row| row.get(0)))
        .map_err(sql_error)?;
    let holds_tasks: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM tasks WHERE locked_by = ?1)")
        .and_then(|mut stmt| stmt.query_row([sweep.instance.as_str()], |row| row.get(0)))
        .map_err(sql_error)?;
    if !gone || holds_tasks {
        return Ok(Swept::default());
    }
    let mut swept = Swept { heartbeat: true, inbox: false };
    if let Some(inbox) = &sweep.inbox {
        let queue_id: Option<i64> = conn
            .prepare_cached("SELECT id FROM queues WHERE name = ?1")
            .and_then(|mut stmt| stmt.query_row([inbox.as_str()], |row| row.get(0)).optional())
            .map_err(sql_error)?;
        if let Some(queue_id) = queue_id {
            let holds_messages: bool = conn
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM messages WHERE queue_id = ?1) OR EXISTS (SELECT 1 FROM dead_letters WHERE queue_id = ?1)",
                )
                .and_then(|mut stmt| stmt.query_row([queue_id], |row| row.get(0)))
                .map_err(sql_error)?;
            if holds_messages {
                return Ok(Swept::default());
            }
            for sql in ["DELETE FROM message_ids WHERE queue_id = ?1", "DELETE FROM queues WHERE id = ?1"] {
                conn.prepare_cached(sql).and_then(|mut stmt| stmt.execute([queue_id])).map_err(sql_error)?;
            }
            swept.inbox = true;
        }
    }
    conn.prepare_cached("DELETE FROM statuses WHERE key = ?1")
        .and_then(|mut stmt| stmt.execute([&sweep.heartbeat_key]))
        .map_err(sql_error)?;
    Ok(swept)
}
