//! [`Tasks::commit`](rota_store::Tasks::commit) as one statement: the
//! fenced task and step writes, the history events, the completions of
//! leased messages and the sends, all as data-modifying CTEs over arrays,
//! committed on their own (no BEGIN, no COMMIT: one round trip). The final
//! SELECT calls `rota.refuse_unless`, which fails the statement, and with it
//! every write, when a fenced write or a completion matched fewer rows than
//! asked. A refused commit is then diagnosed, in the order the trait's
//! documentation gives (tasks, steps, leases), to say what conflicted.

use std::collections::HashMap;

use rota_model::{InstanceId, MessageId, QueueName, StepName, Timestamp};
use rota_model::{Step, Task};
use rota_store::{Changes, Error, Event, NewTask, Outgoing};
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, PgConnection, Postgres};

use crate::queue_sql::lease_lost;
use crate::sql::Names;
use crate::{Fail, Result};

/// The SQLSTATE `rota.refuse_unless` raises.
pub(crate) const REFUSED: &str = "RT409";

fn json_text(value: &serde_json::Value) -> String {
    value.to_string()
}

/// The messages of one statement as parallel arrays. An id repeated within
/// the statement is a duplicate of its first use and left out.
struct Sends<'a> {
    /// The task whose creation sends each (creates only).
    owners: Vec<&'a str>,
    queue_ids: Vec<i64>,
    ids: Vec<&'a str>,
    keyed: Vec<bool>,
    bodies: Vec<&'a str>,
    ordering_keys: Vec<Option<&'a str>>,
    visible: Vec<i64>,
}

impl<'a> Sends<'a> {
    fn new(
        messages: impl IntoIterator<Item = (&'a str, &'a (QueueName, Outgoing), &'a MessageId)>,
        queue_id: &dyn Fn(&QueueName) -> Result<i64>,
        now: Timestamp,
    ) -> Result<Sends<'a>> {
        let mut sends = Sends {
            owners: Vec::new(),
            queue_ids: Vec::new(),
            ids: Vec::new(),
            keyed: Vec::new(),
            bodies: Vec::new(),
            ordering_keys: Vec::new(),
            visible: Vec::new(),
        };
        let mut keyed_seen: Vec<(&QueueName, &MessageId)> = Vec::new();
        for (owner, (queue, message), id) in messages {
            if message.id.is_some() {
                if keyed_seen.contains(&(queue, id)) {
                    continue;
                }
                keyed_seen.push((queue, id));
            }
            sends.owners.push(owner);
            sends.queue_ids.push(queue_id(queue)?);
            sends.ids.push(id.as_str());
            sends.keyed.push(message.id.is_some());
            sends.bodies.push(message.body.get());
            sends.ordering_keys.push(message.ordering_key.as_deref());
            sends.visible.push(now.add(message.delay).as_millis());
        }
        Ok(sends)
    }
}

/// Adds one parameter, an array or a scalar.
fn add<'q, T: sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>>(args: &mut PgArguments, value: T) -> Result<()> {
    args.add(value).map_err(|e| Error::Backend(format!("encoding a statement parameter: {e}")).into())
}

/// Adds the columns of `tasks` as 15 arrays, in the table's order (both
/// the creation and the commit statement take them so).
fn add_task_columns(args: &mut PgArguments, tasks: &[&Task]) -> Result<()> {
    add(args, tasks.iter().map(|t| t.id.as_str()).collect::<Vec<_>>())?;
    add(args, tasks.iter().map(|t| t.workflow.as_str()).collect::<Vec<_>>())?;
    add(args, tasks.iter().map(|t| i64::from(t.workflow_version)).collect::<Vec<_>>())?;
    add(args, tasks.iter().map(|t| json_text(&t.input)).collect::<Vec<_>>())?;
    add(args, tasks.iter().map(|t| t.state.as_str()).collect::<Vec<_>>())?;
    add(args, tasks.iter().map(|t| t.locked_by.as_ref().map(InstanceId::as_str)).collect::<Vec<_>>())?;
    add(args, tasks.iter().map(|t| t.lease_epoch as i64).collect::<Vec<_>>())?;
    add(args, tasks.iter().map(|t| t.complete_by.map(Timestamp::as_millis)).collect::<Vec<_>>())?;
    add(args, tasks.iter().map(|t| t.not_before.as_millis()).collect::<Vec<_>>())?;
    add(args, tasks.iter().map(|t| i64::from(t.failure_count)).collect::<Vec<_>>())?;
    add(args, tasks.iter().map(|t| t.reply_to.as_deref()).collect::<Vec<_>>())?;
    add(args, tasks.iter().map(|t| t.output.as_ref().map(json_text)).collect::<Vec<_>>())?;
    add(args, tasks.iter().map(|t| t.error.as_deref()).collect::<Vec<_>>())?;
    add(args, tasks.iter().map(|t| t.created_at.as_millis()).collect::<Vec<_>>())?;
    add(args, tasks.iter().map(|t| t.updated_at.as_millis()).collect::<Vec<_>>())
}

/// Adds the columns of `steps` as 11 arrays, in the table's order.
fn add_step_columns(args: &mut PgArguments, steps: &[&Step]) -> Result<()> {
    add(args, steps.iter().map(|s| s.task_id.as_str()).collect::<Vec<_>>())?;
    add(args, steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>())?;
    add(args, steps.iter().map(|s| i64::from(s.position)).collect::<Vec<_>>())?;
    add(args, steps.iter().map(|s| s.state.as_str()).collect::<Vec<_>>())?;
    add(args, steps.iter().map(|s| i64::from(s.attempt)).collect::<Vec<_>>())?;
    add(args, steps.iter().map(|s| s.complete_by.map(Timestamp::as_millis)).collect::<Vec<_>>())?;
    add(args, steps.iter().map(|s| s.not_before.as_millis()).collect::<Vec<_>>())?;
    add(args, steps.iter().map(|s| s.input.as_ref().map(json_text)).collect::<Vec<_>>())?;
    add(args, steps.iter().map(|s| s.output.as_ref().map(json_text)).collect::<Vec<_>>())?;
    add(args, steps.iter().map(|s| s.last_error.as_deref()).collect::<Vec<_>>())?;
    add(args, steps.iter().map(|s| s.updated_at.as_millis()).collect::<Vec<_>>())
}

/// Adds the columns of `events` as 6 arrays (task, at, kind, step,
/// attempt, detail).
fn add_event_columns(args: &mut PgArguments, events: &[&Event]) -> Result<()> {
    add(args, events.iter().map(|e| e.task_id.as_str()).collect::<Vec<_>>())?;
    add(args, events.iter().map(|e| e.at.as_millis()).collect::<Vec<_>>())?;
    add(args, events.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>())?;
    add(args, events.iter().map(|e| e.step.as_ref().map(StepName::as_str)).collect::<Vec<_>>())?;
    add(args, events.iter().map(|e| e.attempt.map(i64::from)).collect::<Vec<_>>())?;
    add(args, events.iter().map(|e| json_text(&e.detail)).collect::<Vec<_>>())
}

/// Adds the messages of `sends` as 6 arrays (queue, id, keyed, body,
/// ordering key, visible at).
fn add_send_columns(args: &mut PgArguments, sends: &Sends<'_>) -> Result<()> {
    add(args, &sends.queue_ids)?;
    add(args, &sends.ids)?;
    add(args, &sends.keyed)?;
    add(args, &sends.bodies)?;
    add(args, &sends.ordering_keys)?;
    add(args, &sends.visible)
}

/// The queues among `queue_ids` whose id is in `sent_to`.
fn queues_named(queue_ids: &HashMap<QueueName, i64>, sent_to: &[i64]) -> Vec<QueueName> {
    queue_ids.iter().filter(|(_, id)| sent_to.contains(id)).map(|(queue, _)| queue.clone()).collect()
}

/// One task to create, with the id of each message it sends.
pub(crate) type NewPart<'a> = (&'a NewTask, &'a [MessageId]);

/// Creates tasks, each with its steps, its events and its messages, in one
/// statement, except those whose id exists already (nothing of theirs is
/// written). The ids of `parts` must differ, and a keyed message may be
/// sent by one part only. Returns the ids created and the queues that got
/// new messages.
pub(crate) async fn create_tasks(
    conn: &mut PgConnection,
    n: &Names,
    parts: &[NewPart<'_>],
    queue_ids: &HashMap<QueueName, i64>,
    now: Timestamp,
) -> Result<(Vec<String>, Vec<QueueName>)> {
    let queue_id = |queue: &QueueName| -> Result<i64> {
        queue_ids.get(queue).copied().ok_or_else(|| Error::Backend(format!("queue {queue} has no known id")).into())
    };
    let tasks: Vec<_> = parts.iter().map(|(new, _)| &new.task).collect();
    let steps: Vec<_> = parts.iter().flat_map(|(new, _)| &new.steps).collect();
    // Each event and message goes with the task whose creation writes it.
    let events: Vec<_> = parts.iter().flat_map(|(new, _)| new.events.iter().map(|event| (&new.task.id, event))).collect();
    let messages = parts.iter().flat_map(|(new, ids)| new.messages.iter().zip(ids.iter()).map(|(m, id)| (new.task.id.as_str(), m, id)));
    let sends = Sends::new(messages, &queue_id, now)?;
    let mut args = PgArguments::default();
    // Tasks, $1..$15; steps, $16..$26; events, $27..$32.
    add_task_columns(&mut args, &tasks)?;
    add_step_columns(&mut args, &steps)?;
    add_event_columns(&mut args, &events.iter().map(|(_, event)| *event).collect::<Vec<_>>())?;
    // The event-writer lock base, $33, and now, $34.
    add(&mut args, n.event_lock_base())?;
    add(&mut args, now.as_millis())?;
    // Sends, $35..$40.
    add_send_columns(&mut args, &sends)?;
    // The task each event and message goes with, $41 and $42.
    add(&mut args, events.iter().map(|(owner, _)| owner.as_str()).collect::<Vec<_>>())?;
    add(&mut args, &sends.owners)?;
    let row: (Vec<String>, Vec<i64>) = sqlx::query_as_with(
        n.sql(
            "WITH
         inserted AS (
             INSERT INTO rota.tasks (id, workflow, workflow_version, input, state, locked_by, lease_epoch, complete_by, not_before,
                                     failure_count, reply_to, output, error, created_at, updated_at)
             SELECT t.id, t.workflow, t.workflow_version, t.input, t.state, t.locked_by, t.lease_epoch, t.complete_by, t.not_before,
                    t.failure_count, t.reply_to, t.output, t.error, t.created_at, t.updated_at
               FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::bigint[],
                           $9::bigint[], $10::bigint[], $11::text[], $12::text[], $13::text[], $14::bigint[], $15::bigint[])
                    WITH ORDINALITY
                    AS t(id, workflow, workflow_version, input, state, locked_by, lease_epoch, complete_by, not_before,
                         failure_count, reply_to, output, error, created_at, updated_at, position)
              ORDER BY t.position
             ON CONFLICT (id) DO NOTHING
          RETURNING id),
         step_rows AS (
             INSERT INTO rota.steps (task_id, name, position, state, attempt, complete_by, not_before, input, output, last_error,
                                     updated_at)
             SELECT w.* FROM unnest($16::text[], $17::text[], $18::bigint[], $19::text[], $20::bigint[], $21::bigint[],
                                    $22::bigint[], $23::text[], $24::text[], $25::text[], $26::bigint[])
                    AS w(task_id, name, position, state, attempt, complete_by, not_before, input, output, last_error, updated_at)
              WHERE w.task_id IN (SELECT id FROM inserted)),
         writer AS (
             SELECT pg_advisory_xact_lock_shared($33 + (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM rota.event_seq))
              WHERE cardinality($27::text[]) > 0 AND EXISTS (SELECT 1 FROM inserted)),
         appended AS (
             INSERT INTO rota.events (task_id, at, kind, step, attempt, detail)
             SELECT e.task_id, e.at, e.kind, e.step, e.attempt, e.detail
               FROM writer, unnest($27::text[], $28::bigint[], $29::text[], $30::text[], $31::bigint[], $32::text[], $41::text[])
                    WITH ORDINALITY AS e(task_id, at, kind, step, attempt, detail, owner, position)
              WHERE e.owner IN (SELECT id FROM inserted)
              ORDER BY e.position),
         fresh AS (
             INSERT INTO rota.message_ids (queue_id, id, expires_at)
             SELECT q.id, m.id, $34 + q.dedupe_window_ms
               FROM unnest($35::bigint[], $36::text[], $37::bool[], $42::text[]) AS m(queue_id, id, keyed, owner)
               JOIN rota.queues AS q ON q.id = m.queue_id
              WHERE m.keyed AND m.owner IN (SELECT id FROM inserted)
             ON CONFLICT (queue_id, id) DO UPDATE SET expires_at = excluded.expires_at WHERE rota.message_ids.expires_at <= $34
             RETURNING queue_id, id),
         sent AS (
             INSERT INTO rota.messages (queue_id, id, body, ordering_key, enqueued_at, visible_at)
             SELECT m.queue_id, m.id, m.body, m.ordering_key, $34, m.visible_at
               FROM unnest($35::bigint[], $36::text[], $37::bool[], $38::text[], $39::text[], $40::bigint[], $42::text[])
                    WITH ORDINALITY AS m(queue_id, id, keyed, body, ordering_key, visible_at, owner, position)
              WHERE m.owner IN (SELECT id FROM inserted) AND (NOT m.keyed OR (m.queue_id, m.id) IN (SELECT queue_id, id FROM fresh))
              ORDER BY m.position
          RETURNING queue_id)
         SELECT ARRAY(SELECT id FROM inserted), ARRAY(SELECT DISTINCT queue_id FROM sent)",
        ),
        args,
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok((row.0, queues_named(queue_ids, &row.1)))
}

/// What a commit statement did.
pub(crate) enum Committed {
    /// Everything was written; these queues got new messages.
    Written(Vec<QueueName>),
    /// A fenced write or a completion missed, so nothing was written:
    /// [`diagnose`] says which.
    Refused,
}

/// One caller's changes within a commit statement: the changes, and the id
/// of each message they send.
pub(crate) type Part<'a> = (&'a Changes, &'a [MessageId]);

/// Applies every part's changes in one statement, all or nothing.
/// `queue_ids` holds the id of every queue they name (sends and
/// completions).
pub(crate) async fn commit(
    conn: &mut PgConnection,
    n: &Names,
    parts: &[Part<'_>],
    queue_ids: &HashMap<QueueName, i64>,
    now: Timestamp,
) -> Result<Committed> {
    let queue_id = |queue: &QueueName| -> Result<i64> {
        queue_ids.get(queue).copied().ok_or_else(|| Error::Backend(format!("queue {queue} has no known id")).into())
    };
    let task_writes: Vec<_> = parts.iter().flat_map(|(changes, _)| &changes.tasks).collect();
    let tasks: Vec<_> = task_writes.iter().map(|w| &w.task).collect();
    let step_writes: Vec<_> = parts.iter().flat_map(|(changes, _)| &changes.steps).collect();
    let steps: Vec<_> = step_writes.iter().map(|w| &w.step).collect();
    let events: Vec<_> = parts.iter().flat_map(|(changes, _)| &changes.events).collect();
    let complete: Vec<_> = parts.iter().flat_map(|(changes, _)| &changes.complete).collect();

    let messages = parts.iter().flat_map(|(changes, ids)| changes.send.iter().zip(ids.iter()).map(|(m, id)| ("", m, id)));
    let sends = Sends::new(messages, &queue_id, now)?;
    let complete_queue_ids = complete.iter().map(|(queue, _)| queue_id(queue)).collect::<Result<Vec<_>>>()?;

    let mut args = PgArguments::default();
    // Tasks, $1..$15, and what each write expects, $16 and $17.
    add_task_columns(&mut args, &tasks)?;
    add(&mut args, task_writes.iter().map(|w| w.expected_state.as_str()).collect::<Vec<_>>())?;
    add(&mut args, task_writes.iter().map(|w| w.expected_epoch as i64).collect::<Vec<_>>())?;
    // Steps, $18..$28, and what each write expects, $29 and $30.
    add_step_columns(&mut args, &steps)?;
    add(&mut args, step_writes.iter().map(|w| w.expected_state.as_str()).collect::<Vec<_>>())?;
    add(&mut args, step_writes.iter().map(|w| i64::from(w.expected_attempt)).collect::<Vec<_>>())?;
    // Completions, $31..$33, and now, $34.
    add(&mut args, complete.iter().map(|(_, token)| token.message).collect::<Vec<_>>())?;
    add(&mut args, complete.iter().map(|(_, token)| token.epoch).collect::<Vec<_>>())?;
    add(&mut args, &complete_queue_ids)?;
    add(&mut args, now.as_millis())?;
    // Events, $35..$40, and the event-writer lock base, $41.
    add_event_columns(&mut args, &events)?;
    add(&mut args, n.event_lock_base())?;
    // Sends, $42..$47.
    add_send_columns(&mut args, &sends)?;
    let outcome = sqlx::query_scalar_with::<_, Vec<i64>, _>(
        n.sql(
            "WITH
         task_writes AS (
             UPDATE rota.tasks AS t
                SET workflow = w.workflow, workflow_version = w.workflow_version, input = w.input, state = w.state,
                    locked_by = w.locked_by, lease_epoch = w.lease_epoch, complete_by = w.complete_by, not_before = w.not_before,
                    failure_count = w.failure_count, reply_to = w.reply_to, output = w.output, error = w.error,
                    created_at = w.created_at, updated_at = w.updated_at
               FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::bigint[],
                           $9::bigint[], $10::bigint[], $11::text[], $12::text[], $13::text[], $14::bigint[], $15::bigint[],
                           $16::text[], $17::bigint[])
                    AS w(id, workflow, workflow_version, input, state, locked_by, lease_epoch, complete_by, not_before,
                         failure_count, reply_to, output, error, created_at, updated_at, expected_state, expected_epoch)
              WHERE t.id = w.id AND t.state = w.expected_state AND t.lease_epoch = w.expected_epoch
          RETURNING t.id),
         step_writes AS (
             UPDATE rota.steps AS s
                SET position = w.position, state = w.state, attempt = w.attempt, complete_by = w.complete_by,
                    not_before = w.not_before, input = w.input, output = w.output, last_error = w.last_error,
                    updated_at = w.updated_at
               FROM unnest($18::text[], $19::text[], $20::bigint[], $21::text[], $22::bigint[], $23::bigint[], $24::bigint[],
                           $25::text[], $26::text[], $27::text[], $28::bigint[], $29::text[], $30::bigint[])
                    AS w(task_id, name, position, state, attempt, complete_by, not_before, input, output, last_error,
                         updated_at, expected_state, expected_attempt)
              WHERE s.task_id = w.task_id AND s.name = w.name AND s.state = w.expected_state AND s.attempt = w.expected_attempt
          RETURNING s.task_id),
         completed AS (
             DELETE FROM rota.messages AS m
              USING unnest($31::bigint[], $32::bigint[], $33::bigint[]) AS c(seq, epoch, queue_id)
              WHERE m.seq = c.seq AND m.lease_epoch = c.epoch AND m.queue_id = c.queue_id AND m.lease_until > $34
          RETURNING m.seq),
         writer AS (
             SELECT pg_advisory_xact_lock_shared($41 + (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM rota.event_seq))
              WHERE cardinality($35::text[]) > 0),
         appended AS (
             INSERT INTO rota.events (task_id, at, kind, step, attempt, detail)
             SELECT e.task_id, e.at, e.kind, e.step, e.attempt, e.detail
               FROM writer, unnest($35::text[], $36::bigint[], $37::text[], $38::text[], $39::bigint[], $40::text[]) WITH ORDINALITY
                    AS e(task_id, at, kind, step, attempt, detail, position)
              ORDER BY e.position
          RETURNING 1),
         fresh AS (
             INSERT INTO rota.message_ids (queue_id, id, expires_at)
             SELECT q.id, m.id, $34 + q.dedupe_window_ms
               FROM unnest($42::bigint[], $43::text[], $44::bool[]) AS m(queue_id, id, keyed)
               JOIN rota.queues AS q ON q.id = m.queue_id
              WHERE m.keyed
             ON CONFLICT (queue_id, id) DO UPDATE SET expires_at = excluded.expires_at WHERE rota.message_ids.expires_at <= $34
             RETURNING queue_id, id),
         sent AS (
             INSERT INTO rota.messages (queue_id, id, body, ordering_key, enqueued_at, visible_at)
             SELECT m.queue_id, m.id, m.body, m.ordering_key, $34, m.visible_at
               FROM unnest($42::bigint[], $43::text[], $44::bool[], $45::text[], $46::text[], $47::bigint[]) WITH ORDINALITY
                    AS m(queue_id, id, keyed, body, ordering_key, visible_at, position)
              WHERE NOT m.keyed OR (m.queue_id, m.id) IN (SELECT queue_id, id FROM fresh)
              ORDER BY m.position
          RETURNING queue_id)
         SELECT ARRAY(SELECT DISTINCT queue_id FROM sent)
          WHERE rota.refuse_unless(
                    (SELECT count(*) FROM task_writes) = cardinality($1::text[])
                AND (SELECT count(*) FROM step_writes) = cardinality($18::text[])
                AND (SELECT count(*) FROM completed) = cardinality($31::bigint[])
                AND (SELECT count(*) FROM appended) = cardinality($35::text[]),
                    'a fenced write or a lease missed')",
        ),
        args,
    )
    .fetch_one(&mut *conn)
    .await;
    match outcome {
        Ok(sent_to) => Ok(Committed::Written(queues_named(queue_ids, &sent_to))),
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(REFUSED) => Ok(Committed::Refused),
        Err(err) => Err(err.into()),
    }
}

/// Says why a refused commit was refused: the first task write, then step
/// write, then lease that does not match the store now.
pub(crate) async fn diagnose(conn: &mut PgConnection, n: &Names, changes: &Changes, now: Timestamp) -> Fail {
    let diagnosis: Result<Fail> = async {
        for write in &changes.tasks {
            let found: Option<(String, i64)> = sqlx::query_as(n.sql("SELECT state, lease_epoch FROM rota.tasks WHERE id = $1"))
                .bind(write.task.id.as_str())
                .fetch_optional(&mut *conn)
                .await?;
            match found {
                None => return Ok(Error::NotFound(format!("task {}", write.task.id)).into()),
                Some((state, epoch)) if state != write.expected_state.as_str() || epoch != write.expected_epoch as i64 => {
                    return Ok(Error::Conflict(format!(
                        "task {} is no longer {} at lease epoch {} (changed by another writer)",
                        write.task.id, write.expected_state, write.expected_epoch
                    ))
                    .into());
                }
                Some(_) => {}
            }
        }
        for write in &changes.steps {
            let step = &write.step;
            let found: Option<(String, i64)> =
                sqlx::query_as(n.sql("SELECT state, attempt FROM rota.steps WHERE task_id = $1 AND name = $2"))
                    .bind(step.task_id.as_str())
                    .bind(step.name.as_str())
                    .fetch_optional(&mut *conn)
                    .await?;
            match found {
                None => return Ok(Error::NotFound(format!("step {} of task {}", step.name, step.task_id)).into()),
                Some((state, attempt)) if state != write.expected_state.as_str() || attempt != i64::from(write.expected_attempt) => {
                    return Ok(Error::Conflict(format!(
                        "step {} of task {} is no longer {} at attempt {} (changed by another writer)",
                        step.name, step.task_id, write.expected_state, write.expected_attempt
                    ))
                    .into());
                }
                Some(_) => {}
            }
        }
        for (queue, token) in &changes.complete {
            let held: bool = sqlx::query_scalar(
                n.sql("SELECT EXISTS (SELECT 1 FROM rota.messages WHERE seq = $1 AND lease_epoch = $2 AND lease_until > $3)"),
            )
            .bind(token.message)
            .bind(token.epoch)
            .bind(now.as_millis())
            .fetch_one(&mut *conn)
            .await?;
            if !held {
                return Ok(lease_lost(queue, *token).into());
            }
        }
        // Everything matches now: another writer changed and restored a
        // record in between. Still a lost race for this commit.
        Ok(Error::Conflict("a record changed while the commit ran (changed by another writer)".into()).into())
    }
    .await;
    diagnosis.unwrap_or_else(|fail| fail)
}
