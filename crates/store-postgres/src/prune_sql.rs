//! Retention as SQL: deleting finished tasks in batches, and the leftovers
//! of instances that are gone. The rules are written in `rota_store::prune`.

use rota_model::{TaskId, Timestamp};
use rota_store::{Error, InstanceSweep, Prune, PruneWorkflows, Pruned, Swept};
use sqlx::PgConnection;

use crate::sql::Names;
use crate::{Fail, Result};

/// The selection shared by the prune and its count. The first term repeats
/// the partial index's condition word for word, so that a generic plan
/// can still prove the index applies. A
/// schedule's task that finished at or after the schedule's progress may
/// belong to a fire not yet recorded, and is kept (see `rota_store::prune`).
macro_rules! selection {
    () => {
        "t.ended_at IS NOT NULL AND t.state = ANY($1) AND t.ended_at < $2
         AND ($3::text IS NULL OR t.workflow = $3) AND NOT (t.workflow = ANY($4))
         AND ($5::text[] IS NULL OR t.id = ANY($5))
         AND NOT EXISTS (SELECT 1 FROM rota.schedules s
             WHERE left(t.id, length(s.name) + 1) = s.name || '@'
             AND t.ended_at >= LEAST(s.fired_through, COALESCE(s.buffered_fire_at, s.fired_through)))"
    };
}

/// The parameters `$1`..`$5` of [`selection!`].
type Parameters = (Vec<String>, i64, Option<String>, Vec<String>, Option<Vec<String>>);

/// The parameters `$1`..`$5` of [`selection!`].
fn parameters(prune: &Prune) -> Parameters {
    let states = prune.state_names().into_iter().map(str::to_owned).collect();
    let (only, except) = match &prune.workflows {
        PruneWorkflows::All => (None, Vec::new()),
        PruneWorkflows::Only(name) => (Some(name.to_string()), Vec::new()),
        PruneWorkflows::Except(names) => (None, names.iter().map(ToString::to_string).collect()),
    };
    let ids = prune.only.as_ref().map(|ids| ids.iter().map(ToString::to_string).collect());
    (states, prune.finished_before.as_millis(), only, except, ids)
}

fn task_ids(ids: Vec<String>) -> Result<Vec<TaskId>> {
    ids.into_iter().map(|id| TaskId::new(id).map_err(|e| Fail::from(Error::Backend(format!("stored task id is invalid: {e}"))))).collect()
}

/// The next batch, as `prune_tasks` would choose it (without its row locks).
pub(crate) async fn prunable_tasks(conn: &mut PgConnection, n: &Names, prune: &Prune) -> Result<Vec<TaskId>> {
    let (states, before, only, except, ids) = parameters(prune);
    let chosen: Vec<String> =
        sqlx::query_scalar(n.sql(concat!("SELECT t.id FROM rota.tasks t WHERE ", selection!(), " ORDER BY t.ended_at, t.id LIMIT $6")))
            .bind(states)
            .bind(before)
            .bind(only)
            .bind(except)
            .bind(ids)
            .bind(i64::from(prune.limit))
            .fetch_all(&mut *conn)
            .await?;
    task_ids(chosen)
}

/// One statement: the batch is chosen (skipping tasks an operator is
/// resubmitting right now) and deleted with its steps and events.
pub(crate) async fn prune_tasks(conn: &mut PgConnection, n: &Names, prune: &Prune) -> Result<Pruned> {
    let (states, before, only, except, chosen) = parameters(prune);
    let (events, steps, ids): (i64, i64, Vec<String>) = sqlx::query_as(n.sql(concat!(
        "WITH doomed AS (SELECT t.id, t.ended_at FROM rota.tasks t WHERE ",
        selection!(),
        " ORDER BY t.ended_at, t.id LIMIT $6 FOR UPDATE OF t SKIP LOCKED),
         gone_events AS (DELETE FROM rota.events WHERE task_id IN (SELECT id FROM doomed) RETURNING 1),
         gone_steps AS (DELETE FROM rota.steps WHERE task_id IN (SELECT id FROM doomed) RETURNING 1),
         gone_tags AS (DELETE FROM rota.task_tags AS g
                         USING rota.tasks AS t, jsonb_each_text(t.tags::jsonb) AS kv
                         WHERE t.id IN (SELECT id FROM doomed) AND t.tags IS NOT NULL
                           AND g.key = kv.key AND g.value = kv.value AND g.created_seq = t.created_seq),
         gone AS (DELETE FROM rota.tasks WHERE id IN (SELECT id FROM doomed) RETURNING id)
         SELECT (SELECT count(*) FROM gone_events), (SELECT count(*) FROM gone_steps),
                ARRAY(SELECT d.id FROM doomed d JOIN gone g ON g.id = d.id ORDER BY d.ended_at, d.id)"
    )))
    .bind(states)
    .bind(before)
    .bind(only)
    .bind(except)
    .bind(chosen)
    .bind(i64::from(prune.limit))
    .fetch_one(&mut *conn)
    .await?;
    let tasks = task_ids(ids)?;
    Ok(Pruned { tasks, steps: u64::try_from(steps).unwrap_or(0), events: u64::try_from(events).unwrap_or(0) })
}

pub(crate) async fn count_prunable(conn: &mut PgConnection, n: &Names, prune: &Prune) -> Result<u64> {
    let (states, before, only, except, ids) = parameters(prune);
    let count: i64 = sqlx::query_scalar(n.sql(concat!("SELECT count(*) FROM rota.tasks t WHERE ", selection!())))
        .bind(states)
        .bind(before)
        .bind(only)
        .bind(except)
        .bind(ids)
        .fetch_one(&mut *conn)
        .await?;
    Ok(u64::try_from(count).unwrap_or(0))
}

pub(crate) async fn delete_statuses(conn: &mut PgConnection, n: &Names, prefix: &str, reported_before: Timestamp) -> Result<u64> {
    let done = sqlx::query(n.sql("DELETE FROM rota.statuses WHERE left(key, length($1)) = $1 AND reported_at < $2"))
        .bind(prefix)
        .bind(reported_before.as_millis())
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected())
}

/// Returns what it deleted and the inbox's queue id when it deleted one
/// (for the caller's cache). The heartbeat is deleted last and only if it
/// is still old: a process that came back meanwhile rewrote it, the
/// delete matches nothing, and the whole sweep is rolled back
/// (`Conflict`).
pub(crate) async fn sweep_instance(conn: &mut PgConnection, n: &Names, sweep: &InstanceSweep) -> Result<(Swept, Option<i64>)> {
    let (gone, holds_tasks): (bool, bool) = sqlx::query_as(n.sql(
        "SELECT EXISTS (SELECT 1 FROM rota.statuses WHERE key = $1 AND reported_at < $2),
                EXISTS (SELECT 1 FROM rota.tasks WHERE locked_by = $3)",
    ))
    .bind(&sweep.heartbeat_key)
    .bind(sweep.gone_before.as_millis())
    .bind(sweep.instance.as_str())
    .fetch_one(&mut *conn)
    .await?;
    if !gone || holds_tasks {
        return Ok((Swept::default(), None));
    }
    let mut swept = Swept { heartbeat: true, inbox: false };
    let mut deleted_queue = None;
    if let Some(inbox) = &sweep.inbox {
        let queue: Option<(i64, bool)> = sqlx::query_as(n.sql(
            "SELECT q.id, EXISTS (SELECT 1 FROM rota.messages WHERE queue_id = q.id)
                          OR EXISTS (SELECT 1 FROM rota.dead_letters WHERE queue_id = q.id)
             FROM rota.queues q WHERE q.name = $1 FOR UPDATE",
        ))
        .bind(inbox.as_str())
        .fetch_optional(&mut *conn)
        .await?;
        match queue {
            Some((_, true)) => return Ok((Swept::default(), None)),
            Some((id, false)) => {
                sqlx::query(n.sql("DELETE FROM rota.message_ids WHERE queue_id = $1")).bind(id).execute(&mut *conn).await?;
                sqlx::query(n.sql("DELETE FROM rota.queues WHERE id = $1")).bind(id).execute(&mut *conn).await?;
                swept.inbox = true;
                deleted_queue = Some(id);
            }
            None => {}
        }
    }
    let deleted = sqlx::query(n.sql("DELETE FROM rota.statuses WHERE key = $1 AND reported_at < $2"))
        .bind(&sweep.heartbeat_key)
        .bind(sweep.gone_before.as_millis())
        .execute(&mut *conn)
        .await?;
    if deleted.rows_affected() == 0 {
        return Err(Error::Conflict(format!("instance {} reported again during its sweep", sweep.instance)).into());
    }
    Ok((swept, deleted_queue))
}
