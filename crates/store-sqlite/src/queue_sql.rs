//! Queue operations as SQL, run by the writer thread inside its group-commit
//! transaction (or by a reader for the read-only ones). Every function takes
//! `now` from its caller: SQL never reads its own clock.

use std::time::Duration;

use rota_model::{InstanceId, LeaseToken, MessageId, QueueName, Timestamp};
use rota_store::{
    Backlog, DeadLetter, DeadLetterFilter, DeadLetterPage, Delivery, Error, Outgoing, QueueConfig, QueueStats, Redrive, Result, Sent,
    stored,
};
use rusqlite::{Connection, OptionalExtension, params};

use crate::sql_error;

/// A queue's row.
#[derive(Debug, Clone)]
pub(crate) struct QueueRow {
    pub id: i64,
    pub name: QueueName,
    pub config: QueueConfig,
    pub paused: bool,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn duration(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

pub(crate) fn find_queue(conn: &Connection, name: &QueueName) -> Result<Option<QueueRow>> {
    conn.prepare_cached("SELECT id, lease_ms, deliveries_max, dedupe_window_ms, paused FROM queues WHERE name = ?1")
        .and_then(|mut stmt| {
            stmt.query_row([name.as_str()], |row| {
                Ok(QueueRow {
                    id: row.get(0)?,
                    name: name.clone(),
                    config: QueueConfig { lease: duration(row.get(1)?), deliveries_max: row.get(2)?, dedupe_window: duration(row.get(3)?) },
                    paused: row.get::<_, i64>(4)? != 0,
                })
            })
            .optional()
        })
        .map_err(sql_error)
}

/// The queue's row, creating the queue with default settings on first use.
pub(crate) fn ensure_queue(conn: &Connection, name: &QueueName, now: Timestamp) -> Result<QueueRow> {
    if let Some(row) = find_queue(conn, name)? {
        return Ok(row);
    }
    upsert_queue(conn, name, &QueueConfig::default(), now, false)?;
    find_queue(conn, name)?.ok_or_else(|| Error::Backend(format!("queue {name} vanished after creation")))
}

/// The queue's row, or `NotFound` naming it.
pub(crate) fn existing_queue(conn: &Connection, name: &QueueName) -> Result<QueueRow> {
    find_queue(conn, name)?.ok_or_else(|| Error::NotFound(format!("queue {name}")))
}

/// Creates a queue, or (when `update`) overwrites an existing queue's settings.
pub(crate) fn upsert_queue(conn: &Connection, name: &QueueName, config: &QueueConfig, now: Timestamp, update: bool) -> Result<()> {
    let sql = if update {
        "INSERT INTO queues (name, lease_ms, deliveries_max, dedupe_window_ms, created_at) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (name) DO UPDATE SET lease_ms = excluded.lease_ms, deliveries_max = excluded.deliveries_max,
                                          dedupe_window_ms = excluded.dedupe_window_ms"
    } else {
        "INSERT INTO queues (name, lease_ms, deliveries_max, dedupe_window_ms, created_at) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (name) DO NOTHING"
    };
    conn.prepare_cached(sql)
        .and_then(|mut stmt| {
            stmt.execute(params![name.as_str(), millis(config.lease), config.deliveries_max, millis(config.dedupe_window), now.as_millis()])
        })
        .map_err(sql_error)?;
    Ok(())
}

pub(crate) fn set_paused(conn: &Connection, queue: &QueueRow, paused: bool) -> Result<()> {
    conn.prepare_cached("UPDATE queues SET paused = ?2 WHERE id = ?1")
        .and_then(|mut stmt| stmt.execute(params![queue.id, paused as i64]))
        .map_err(sql_error)?;
    Ok(())
}

/// Inserts one message, unless its id was seen within the queue's window.
pub(crate) fn send(conn: &Connection, queue: &QueueRow, message: &Outgoing, id: MessageId, now: Timestamp) -> Result<Sent> {
    if message.id.is_some() {
        // One statement decides: a fresh id inserts, an expired one is
        // refreshed, a remembered one changes nothing (a duplicate).
        let accepted = conn
            .prepare_cached(
                "INSERT INTO message_ids (queue_id, id, expires_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (queue_id, id) DO UPDATE SET expires_at = excluded.expires_at WHERE message_ids.expires_at <= ?4",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![queue.id, id.as_str(), now.add(queue.config.dedupe_window).as_millis(), now.as_millis()])
            })
            .map_err(sql_error)?;
        if accepted == 0 {
            return Ok(Sent { id, duplicate: true });
        }
    }
    conn.prepare_cached(
        "INSERT INTO messages (queue_id, id, body, ordering_key, enqueued_at, visible_at, reply_to, correlation_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            queue.id,
            id.as_str(),
            message.body.get(),
            message.ordering_key.as_deref(),
            now.as_millis(),
            now.add(message.delay).as_millis(),
            message.reply_to.as_ref().map(QueueName::as_str),
            message.correlation_id.as_deref()
        ])
    })
    .map_err(sql_error)?;
    Ok(Sent { id, duplicate: false })
}

/// Leases up to `max` visible messages, oldest first. Messages that would
/// pass the queue's delivery limit are dead-lettered instead, and the scan
/// goes on until `max` are leased or none is left.
pub(crate) fn claim(
    conn: &Connection,
    queue: &QueueRow,
    max: u32,
    lease: Duration,
    owner: Option<&InstanceId>,
    now: Timestamp,
) -> Result<Vec<Delivery>> {
    if queue.paused {
        return Ok(Vec::new());
    }
    let until = now.add(lease);
    let mut deliveries = Vec::new();
    loop {
        let wanted = max as usize - deliveries.len();
        // Pick, oldest visible first. A keyed message is eligible only while
        // it is the oldest remaining message of its key, so each key has at
        // most one lease at a time and is delivered in send order. Picking
        // and leasing are two statements, but the writer runs them inside
        // one IMMEDIATE transaction, so no other writer comes between them.
        let picked: Vec<i64> = conn
            .prepare_cached(
                "SELECT seq FROM messages AS m
                  WHERE m.queue_id = ?1 AND m.visible_at <= ?2
                    AND (m.ordering_key IS NULL
                         OR m.seq = (SELECT MIN(k.seq) FROM messages AS k
                                      WHERE k.queue_id = m.queue_id AND k.ordering_key = m.ordering_key))
                  ORDER BY m.visible_at, m.seq
                  LIMIT ?3",
            )
            .and_then(|mut stmt| {
                stmt.query_map(params![queue.id, now.as_millis(), wanted as i64], |row| row.get(0))?.collect::<rusqlite::Result<Vec<i64>>>()
            })
            .map_err(sql_error)?;
        if picked.is_empty() {
            break;
        }
        let mut exhausted = false;
        for seq in picked {
            let row = conn
                .prepare_cached(
                    "UPDATE messages
                        SET delivery_count = delivery_count + 1, lease_epoch = lease_epoch + 1,
                            lease_owner = ?2, lease_until = ?3, visible_at = ?3
                      WHERE seq = ?1
                  RETURNING seq, id, body, ordering_key, enqueued_at, delivery_count, lease_epoch, last_error, reply_to, correlation_id",
                )
                .and_then(|mut stmt| {
                    stmt.query_row(params![seq, owner.map(InstanceId::as_str), until.as_millis()], |row| {
                        let leased = stored::Leased {
                            seq: row.get(0)?,
                            id: row.get(1)?,
                            body: row.get(2)?,
                            ordering_key: row.get(3)?,
                            enqueued_at: row.get(4)?,
                            delivery_count: row.get(5)?,
                            lease_epoch: row.get(6)?,
                            lease_until: until.as_millis(),
                            reply_to: row.get(8)?,
                            correlation_id: row.get(9)?,
                        };
                        Ok((leased, row.get::<_, Option<String>>(7)?))
                    })
                })
                .map_err(sql_error)?;
            let (leased, last_error) = row;
            if leased.delivery_count > queue.config.deliveries_max {
                // This receive would be one delivery too many: the message
                // goes to the dead letters with the deliveries it really had.
                let delivered = leased.delivery_count - 1;
                let last = last_error.as_deref().unwrap_or("lease expired without completion");
                let reason =
                    format!("delivered {delivered} times, the queue's limit is {}; last failure: {last}", queue.config.deliveries_max);
                move_to_dead_letters(conn, leased.seq, delivered, now, &reason)?;
                exhausted = true;
                continue;
            }
            deliveries.push(leased.into_delivery(queue.name.clone())?);
        }
        if !exhausted || deliveries.len() >= max as usize {
            break;
        }
    }
    Ok(deliveries)
}

/// Deletes a leased message. `LeaseLost` unless `token` is its current, unexpired lease.
pub(crate) fn complete(conn: &Connection, queue: &QueueRow, token: LeaseToken, now: Timestamp) -> Result<()> {
    let deleted = conn
        .prepare_cached("DELETE FROM messages WHERE seq = ?1 AND queue_id = ?2 AND lease_epoch = ?3 AND lease_until > ?4")
        .and_then(|mut stmt| stmt.execute(params![token.message, queue.id, token.epoch, now.as_millis()]))
        .map_err(sql_error)?;
    if deleted == 0 {
        return Err(lease_lost(&queue.name, token));
    }
    Ok(())
}

pub(crate) fn lease_lost(queue: &QueueName, token: LeaseToken) -> Error {
    Error::LeaseLost(format!(
        "token {token} is not a current lease in queue {queue} (unknown, expired, delivered again, or already settled)"
    ))
}

/// The delivery count of the message leased by `token`, or `LeaseLost`.
fn leased_delivery_count(conn: &Connection, queue: &QueueRow, token: LeaseToken, now: Timestamp) -> Result<u32> {
    conn.prepare_cached("SELECT delivery_count FROM messages WHERE seq = ?1 AND queue_id = ?2 AND lease_epoch = ?3 AND lease_until > ?4")
        .and_then(|mut stmt| stmt.query_row(params![token.message, queue.id, token.epoch, now.as_millis()], |row| row.get(0)).optional())
        .map_err(sql_error)?
        .ok_or_else(|| lease_lost(&queue.name, token))
}

/// Gives a leased message back, visible after `delay`; dead-letters it when
/// its deliveries are used up.
pub(crate) fn abandon(
    conn: &Connection,
    queue: &QueueRow,
    token: LeaseToken,
    delay: Duration,
    reason: Option<&str>,
    now: Timestamp,
) -> Result<()> {
    let delivered = leased_delivery_count(conn, queue, token, now)?;
    if delivered >= queue.config.deliveries_max {
        let reason = format!(
            "delivered {delivered} times, the queue's limit is {}; last failure: {}",
            queue.config.deliveries_max,
            reason.unwrap_or("abandoned")
        );
        return move_to_dead_letters(conn, token.message, delivered, now, &reason);
    }
    conn.prepare_cached(
        "UPDATE messages SET lease_owner = NULL, lease_until = NULL, visible_at = ?2, last_error = COALESCE(?3, last_error) WHERE seq = ?1",
    )
    .and_then(|mut stmt| stmt.execute(params![token.message, now.add(delay).as_millis(), reason]))
    .map_err(sql_error)?;
    Ok(())
}

/// Extends a lease to `now + lease`.
pub(crate) fn renew(conn: &Connection, queue: &QueueRow, token: LeaseToken, lease: Duration, now: Timestamp) -> Result<Timestamp> {
    let until = now.add(lease);
    let updated = conn
        .prepare_cached(
            "UPDATE messages SET lease_until = ?5, visible_at = ?5
              WHERE seq = ?1 AND queue_id = ?2 AND lease_epoch = ?3 AND lease_until > ?4",
        )
        .and_then(|mut stmt| stmt.execute(params![token.message, queue.id, token.epoch, now.as_millis(), until.as_millis()]))
        .map_err(sql_error)?;
    if updated == 0 {
        return Err(lease_lost(&queue.name, token));
    }
    Ok(until)
}

/// Moves a leased message to the dead letters with the consumer's reason.
pub(crate) fn dead_letter(conn: &Connection, queue: &QueueRow, token: LeaseToken, reason: &str, now: Timestamp) -> Result<()> {
    let delivered = leased_delivery_count(conn, queue, token, now)?;
    move_to_dead_letters(conn, token.message, delivered, now, reason)
}

fn move_to_dead_letters(conn: &Connection, seq: i64, delivered: u32, now: Timestamp, reason: &str) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO dead_letters (queue_id, id, body, ordering_key, enqueued_at, delivery_count, dead_lettered_at, reason, reply_to,
                                   correlation_id)
         SELECT queue_id, id, body, ordering_key, enqueued_at, ?4, ?2, ?3, reply_to, correlation_id FROM messages WHERE seq = ?1",
    )
    .and_then(|mut stmt| stmt.execute(params![seq, now.as_millis(), reason, delivered]))
    .map_err(sql_error)?;
    conn.prepare_cached("DELETE FROM messages WHERE seq = ?1").and_then(|mut stmt| stmt.execute([seq])).map_err(sql_error)?;
    Ok(())
}

pub(crate) fn dead_letters(conn: &Connection, queue: &QueueRow, limit: u32) -> Result<Vec<DeadLetter>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT id, body, ordering_key, delivery_count, enqueued_at, dead_lettered_at, reason, reply_to, correlation_id
               FROM dead_letters WHERE queue_id = ?1 ORDER BY seq LIMIT ?2",
        )
        .map_err(sql_error)?;
    let rows = stmt
        .query_map(params![queue.id, limit], |row| dead_letter_row(row, 0))
        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    rows.into_iter().map(|row| row.into_dead_letter(queue)).collect()
}

/// A dead letter's columns as read, before its text columns are checked.
struct DeadLetterRow {
    id: String,
    body: String,
    ordering_key: Option<String>,
    delivery_count: u32,
    enqueued_at: i64,
    dead_lettered_at: i64,
    reason: String,
    reply_to: Option<String>,
    correlation_id: Option<String>,
}

/// Reads the dead letter's columns from `first` on (id, body,
/// ordering_key, delivery_count, enqueued_at, dead_lettered_at, reason,
/// reply_to, correlation_id).
fn dead_letter_row(row: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<DeadLetterRow> {
    Ok(DeadLetterRow {
        id: row.get(first)?,
        body: row.get(first + 1)?,
        ordering_key: row.get(first + 2)?,
        delivery_count: row.get(first + 3)?,
        enqueued_at: row.get(first + 4)?,
        dead_lettered_at: row.get(first + 5)?,
        reason: row.get(first + 6)?,
        reply_to: row.get(first + 7)?,
        correlation_id: row.get(first + 8)?,
    })
}

impl DeadLetterRow {
    fn into_dead_letter(self, queue: &QueueRow) -> Result<DeadLetter> {
        Ok(DeadLetter {
            queue: queue.name.clone(),
            id: stored::id(self.id)?,
            body: stored::body(self.body)?,
            ordering_key: self.ordering_key,
            delivery_count: self.delivery_count,
            enqueued_at: Timestamp::from_millis(self.enqueued_at),
            dead_lettered_at: Timestamp::from_millis(self.dead_lettered_at),
            reason: self.reason,
            reply_to: stored::reply_to(self.reply_to)?,
            correlation_id: self.correlation_id,
        })
    }
}

/// Sends dead letters back, in the order they were dead-lettered, with a
/// fresh delivery count and their original send time.
pub(crate) fn redrive(conn: &Connection, queue: &QueueRow, which: &Redrive, now: Timestamp) -> Result<u64> {
    let id = match which {
        Redrive::One(id) => Some(id.as_str()),
        Redrive::All => None,
    };
    let moved = conn
        .prepare_cached(
            "INSERT INTO messages (queue_id, id, body, ordering_key, enqueued_at, visible_at, reply_to, correlation_id)
             SELECT queue_id, id, body, ordering_key, enqueued_at, ?2, reply_to, correlation_id FROM dead_letters
              WHERE queue_id = ?1 AND (?3 IS NULL OR id = ?3) ORDER BY seq",
        )
        .and_then(|mut stmt| stmt.execute(params![queue.id, now.as_millis(), id]))
        .map_err(sql_error)?;
    conn.prepare_cached("DELETE FROM dead_letters WHERE queue_id = ?1 AND (?2 IS NULL OR id = ?2)")
        .and_then(|mut stmt| stmt.execute(params![queue.id, id]))
        .map_err(sql_error)?;
    if let (0, Redrive::One(id)) = (moved, which) {
        return Err(Error::NotFound(format!("dead letter {id} in queue {}", queue.name)));
    }
    Ok(moved as u64)
}

/// The conditions of a [`DeadLetterFilter`] besides its queue, as SQL on
/// `dead_letters` (parameters ?3 to ?5, each unset when NULL).
macro_rules! dead_letter_conditions {
    () => {
        "(?3 IS NULL OR instr(reason, ?3) > 0)
                                  AND (?4 IS NULL OR dead_lettered_at >= ?4) AND (?5 IS NULL OR dead_lettered_at < ?5)"
    };
}

/// A page of the walk over a queue's dead letters: the range of the next
/// `scan` of them in the `(queue_id, seq)` index, then the selected ones
/// in that range.
pub(crate) fn dead_letter_page(
    conn: &Connection,
    queue: &QueueRow,
    filter: &DeadLetterFilter,
    after: Option<u64>,
    scan: u32,
) -> Result<DeadLetterPage> {
    let after = after.map_or(0, |seq| i64::try_from(seq).unwrap_or(i64::MAX));
    let (scanned, through): (i64, Option<i64>) = conn
        .prepare_cached(
            "SELECT count(*), max(seq) FROM (SELECT seq FROM dead_letters WHERE queue_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3)",
        )
        .and_then(|mut stmt| stmt.query_row(params![queue.id, after, scan], |row| Ok((row.get(0)?, row.get(1)?))))
        .map_err(sql_error)?;
    let end = scanned < i64::from(scan);
    let Some(through) = through else { return Ok(DeadLetterPage { letters: Vec::new(), scanned_through: None, end }) };
    let mut stmt = conn
        .prepare_cached(concat!(
            "SELECT seq, id, body, ordering_key, delivery_count, enqueued_at, dead_lettered_at, reason, reply_to, correlation_id
               FROM dead_letters WHERE queue_id = ?1 AND seq > ?2 AND seq <= ?6 AND ",
            dead_letter_conditions!(),
            " ORDER BY seq"
        ))
        .map_err(sql_error)?;
    let rows = stmt
        .query_map(
            params![
                queue.id,
                after,
                filter.reason_contains,
                filter.dead_lettered.from.map(Timestamp::as_millis),
                filter.dead_lettered.until.map(Timestamp::as_millis),
                through
            ],
            |row| Ok((row.get::<_, i64>(0)?, dead_letter_row(row, 1)?)),
        )
        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    let letters = rows
        .into_iter()
        .map(|(seq, row)| Ok((u64::try_from(seq).unwrap_or(0), row.into_dead_letter(queue)?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(DeadLetterPage { letters, scanned_through: u64::try_from(through).ok(), end })
}

pub(crate) fn count_dead_letters(conn: &Connection, queue: &QueueRow, filter: &DeadLetterFilter) -> Result<u64> {
    let counted: i64 = conn
        // ?2 (a page's start) is not used: the count reads every one.
        .prepare_cached(concat!("SELECT count(*) FROM dead_letters WHERE queue_id = ?1 AND ", dead_letter_conditions!()))
        .and_then(|mut stmt| {
            stmt.query_row(
                params![
                    queue.id,
                    Option::<i64>::None,
                    filter.reason_contains,
                    filter.dead_lettered.from.map(Timestamp::as_millis),
                    filter.dead_lettered.until.map(Timestamp::as_millis)
                ],
                |row| row.get(0),
            )
        })
        .map_err(sql_error)?;
    Ok(u64::try_from(counted).unwrap_or(0))
}

/// Sends the listed dead letters back, in the order they were
/// dead-lettered, like [`redrive`]; a `seq` no longer there is passed over.
pub(crate) fn redrive_listed(conn: &Connection, queue: &QueueRow, seqs: &[u64], now: Timestamp) -> Result<u64> {
    let listed = serde_json::to_string(seqs).expect("numbers serialise");
    let moved = conn
        .prepare_cached(
            "INSERT INTO messages (queue_id, id, body, ordering_key, enqueued_at, visible_at, reply_to, correlation_id)
             SELECT queue_id, id, body, ordering_key, enqueued_at, ?2, reply_to, correlation_id FROM dead_letters
              WHERE queue_id = ?1 AND seq IN (SELECT value FROM json_each(?3)) ORDER BY seq",
        )
        .and_then(|mut stmt| stmt.execute(params![queue.id, now.as_millis(), listed]))
        .map_err(sql_error)?;
    conn.prepare_cached("DELETE FROM dead_letters WHERE queue_id = ?1 AND seq IN (SELECT value FROM json_each(?2))")
        .and_then(|mut stmt| stmt.execute(params![queue.id, listed]))
        .map_err(sql_error)?;
    Ok(moved as u64)
}

pub(crate) fn purge_dead_letters(conn: &Connection, queue: &QueueRow) -> Result<u64> {
    let deleted = conn
        .prepare_cached("DELETE FROM dead_letters WHERE queue_id = ?1")
        .and_then(|mut stmt| stmt.execute([queue.id]))
        .map_err(sql_error)?;
    Ok(deleted as u64)
}

/// Forgets message ids whose duplicate-detection window has passed, a bounded
/// number at a time so that the cleanup never stalls the writer.
pub(crate) fn forget_expired_ids(conn: &Connection, now: Timestamp, limit: u32) -> Result<usize> {
    conn.prepare_cached(
        "DELETE FROM message_ids WHERE (queue_id, id) IN
           (SELECT queue_id, id FROM message_ids WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)",
    )
    .and_then(|mut stmt| stmt.execute(params![now.as_millis(), limit]))
    .map_err(sql_error)
}

/// Which of `queues` a parked receive may find work in: those with a
/// visible message and not paused, and those that do not exist yet (their
/// first receive creates them). One statement for every parked queue, so
/// that a batch does not try a claim for each receiver of an idle queue.
pub(crate) fn servable(conn: &Connection, queues: &[&QueueName], now: Timestamp) -> Result<std::collections::HashSet<String>> {
    let names =
        serde_json::to_string(&queues.iter().map(|q| q.as_str()).collect::<Vec<_>>()).map_err(|err| Error::Backend(err.to_string()))?;
    let mut stmt = conn
        .prepare_cached(
            "SELECT DISTINCT j.value FROM json_each(?1) AS j
              WHERE NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = j.value)
                 OR EXISTS (SELECT 1 FROM queues q JOIN messages m ON m.queue_id = q.id
                             WHERE q.name = j.value AND q.paused = 0 AND m.visible_at <= ?2)",
        )
        .map_err(sql_error)?;
    let rows = stmt.query_map(params![names, now.as_millis()], |row| row.get::<_, String>(0)).map_err(sql_error)?;
    rows.collect::<rusqlite::Result<_>>().map_err(sql_error)
}

/// The backlogs of `queues` that exist, in the order given. Both reads
/// walk `messages_visible`: the ready count stops at `up_to` entries, and
/// a leased message is one visible later (at its lease's end).
pub(crate) fn backlogs(conn: &Connection, queues: &[QueueName], up_to: u32, now: Timestamp) -> Result<Vec<Backlog>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM messages m WHERE m.queue_id = q.id AND m.visible_at <= ?2 LIMIT ?3)),
                    EXISTS (SELECT 1 FROM messages m WHERE m.queue_id = q.id AND m.visible_at > ?2 AND m.lease_until > ?2)
               FROM queues q WHERE q.name = ?1",
        )
        .map_err(sql_error)?;
    let mut backlogs = Vec::with_capacity(queues.len());
    for queue in queues {
        let found = stmt
            .query_row(params![queue.as_str(), now.as_millis(), i64::from(up_to)], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, bool>(1)?))
            })
            .optional()
            .map_err(sql_error)?;
        if let Some((ready, leased)) = found {
            backlogs.push(Backlog { queue: queue.clone(), ready: u64::try_from(ready).unwrap_or(0), leased });
        }
    }
    Ok(backlogs)
}

pub(crate) fn stats(conn: &Connection, now: Timestamp) -> Result<Vec<QueueStats>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT q.name, q.paused,
                    (SELECT COUNT(*) FROM messages m WHERE m.queue_id = q.id AND m.visible_at <= ?1),
                    (SELECT COUNT(*) FROM messages m WHERE m.queue_id = q.id AND m.lease_until > ?1),
                    (SELECT COUNT(*) FROM messages m WHERE m.queue_id = q.id AND m.visible_at > ?1
                                                       AND (m.lease_until IS NULL OR m.lease_until <= ?1)),
                    (SELECT COUNT(*) FROM dead_letters d WHERE d.queue_id = q.id),
                    (SELECT MIN(m.enqueued_at) FROM messages m WHERE m.queue_id = q.id AND m.visible_at <= ?1)
               FROM queues q ORDER BY q.name",
        )
        .map_err(sql_error)?;
    let rows = stmt
        .query_map([now.as_millis()], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)? != 0,
                row.get::<_, i64>(2)?,
                row.get::<_, i64>(3)?,
                row.get::<_, i64>(4)?,
                row.get::<_, i64>(5)?,
                row.get::<_, Option<i64>>(6)?,
            ))
        })
        .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    rows.into_iter()
        .map(|(name, paused, ready, leased, delayed, dead, oldest)| {
            Ok(QueueStats {
                queue: QueueName::new(name).map_err(|e| Error::Backend(format!("stored queue name is invalid: {e}")))?,
                ready: ready as u64,
                leased: leased as u64,
                delayed: delayed as u64,
                dead_lettered: dead as u64,
                paused,
                oldest_ready_at: oldest.map(Timestamp::from_millis),
            })
        })
        .collect()
}
