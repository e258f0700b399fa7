//! Queue operations as SQL. Every function takes `now` from its caller: SQL
//! never reads its own clock. Functions that must be atomic with others take
//! the caller's transaction as their connection.

use std::time::Duration;

use rota_model::{InstanceId, LeaseToken, MessageId, QueueName, Timestamp};
use rota_store::{
    Backlog, DeadLetter, DeadLetterFilter, DeadLetterPage, Delivery, Error, Outgoing, QueueConfig, QueueStats, Receive, Redrive, Sent,
    stored,
};
use sqlx::{PgConnection, Row};

use crate::handoff::{Lease, Leased};
use crate::params::{Array, Param, Params, Statement};
use crate::sql::Names;
use crate::{Fail, Result};

/// A queue's row.
#[derive(Debug, Clone)]
pub(crate) struct QueueRow {
    pub id: i64,
    pub name: QueueName,
    pub config: QueueConfig,
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn duration(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn count(value: i64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

pub(crate) async fn find_queue(conn: &mut PgConnection, n: &Names, name: &QueueName) -> Result<Option<QueueRow>> {
    let row = sqlx::query(n.sql("SELECT id, lease_ms, deliveries_max, dedupe_window_ms FROM rota.queues WHERE name = $1"))
        .bind(name.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(QueueRow {
        id: row.try_get(0)?,
        name: name.clone(),
        config: QueueConfig {
            lease: duration(row.try_get(1)?),
            deliveries_max: count(row.try_get(2)?),
            dedupe_window: duration(row.try_get(3)?),
        },
    }))
}

/// The queue's row, creating the queue with default settings on first use.
pub(crate) async fn ensure_queue(conn: &mut PgConnection, n: &Names, name: &QueueName, now: Timestamp) -> Result<QueueRow> {
    if let Some(row) = find_queue(conn, n, name).await? {
        return Ok(row);
    }
    upsert_queue(conn, n, name, &QueueConfig::default(), now, false).await?;
    find_queue(conn, n, name).await?.ok_or_else(|| Fail::from(Error::Backend(format!("queue {name} vanished after creation"))))
}

/// The queue's row, or `NotFound` naming it.
pub(crate) async fn existing_queue(conn: &mut PgConnection, n: &Names, name: &QueueName) -> Result<QueueRow> {
    find_queue(conn, n, name).await?.ok_or_else(|| Error::NotFound(format!("queue {name}")).into())
}

/// The queue's row, or `LeaseLost` for `token` (no queue, no lease).
pub(crate) async fn leasing_queue(conn: &mut PgConnection, n: &Names, name: &QueueName, token: LeaseToken) -> Result<QueueRow> {
    find_queue(conn, n, name).await?.ok_or_else(|| lease_lost(name, token).into())
}

/// Creates a queue, or (when `update`) overwrites an existing queue's settings.
pub(crate) async fn upsert_queue(
    conn: &mut PgConnection,
    n: &Names,
    name: &QueueName,
    config: &QueueConfig,
    now: Timestamp,
    update: bool,
) -> Result<()> {
    let sql = if update {
        n.sql(
            "INSERT INTO rota.queues (name, lease_ms, deliveries_max, dedupe_window_ms, created_at) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (name) DO UPDATE SET lease_ms = excluded.lease_ms, deliveries_max = excluded.deliveries_max,
                                              dedupe_window_ms = excluded.dedupe_window_ms",
        )
    } else {
        n.sql(
            "INSERT INTO rota.queues (name, lease_ms, deliveries_max, dedupe_window_ms, created_at) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (name) DO NOTHING",
        )
    };
    sqlx::query(sql)
        .bind(name.as_str())
        .bind(millis(config.lease))
        .bind(i64::from(config.deliveries_max))
        .bind(millis(config.dedupe_window))
        .bind(now.as_millis())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

pub(crate) async fn set_paused(conn: &mut PgConnection, n: &Names, queue: &QueueRow, paused: bool) -> Result<()> {
    sqlx::query(n.sql("UPDATE rota.queues SET paused = $2 WHERE id = $1")).bind(queue.id).bind(paused).execute(&mut *conn).await?;
    Ok(())
}

/// Inserts messages into the queue with id `queue_id` in one statement,
/// dropping those whose id was seen within the queue's window (and repeats
/// of an id within `messages`). Returns one outcome per message, in order.
/// Sends `messages` to one queue; those with a lease in `leases` (lined up
/// with `messages`) are inserted leased to a waiting receiver (see
/// `handoff`), unless the queue is paused. Returns each message's outcome and
/// the messages inserted leased.
pub(crate) async fn send(
    conn: &mut PgConnection,
    n: &Names,
    queue_id: i64,
    messages: &[(&Outgoing, MessageId)],
    leases: &[Option<Lease>],
    now: Timestamp,
) -> Result<(Vec<Sent>, Vec<Leased>)> {
    let columns = SendColumns::new(messages, leases, now);
    let mut params = Params::default();
    let p = SendParams {
        queue_id: params.push(queue_id)?,
        now: params.push(now.as_millis())?,
        id: params.array(&columns.ids, "text[]")?,
        keyed: params.array(&columns.keyed, "bool[]")?,
        body: params.array(&columns.bodies, "text[]")?,
        ordering_key: params.array(&columns.keys, "text[]")?,
        visible_at: params.array(&columns.visible, "bigint[]")?,
        reply_to: params.array(&columns.reply_to, "text[]")?,
        correlation_id: params.array(&columns.correlation_ids, "text[]")?,
        handoff: params.array(&columns.handoffs.handoff, "bool[]")?,
        owner: params.array(&columns.handoffs.owner, "text[]")?,
        lease_ms: params.array(&columns.handoffs.lease_ms, "bigint[]")?,
        epoch: params.array(&columns.handoffs.epoch, "bigint[]")?,
    };
    static SEND: Statement = Statement::new();
    let sql = SEND.text(|| send_sql(&p));
    let inserted: Vec<(String, i64, Option<i64>)> = sqlx::query_as_with(n.sql(sql), params.into_arguments()).fetch_all(&mut *conn).await?;
    let sent = messages
        .iter()
        .zip(columns.repeated)
        .map(|((message, id), repeated)| {
            let duplicate = repeated || (message.id.is_some() && !inserted.iter().any(|(i, _, _)| i == id.as_str()));
            Sent { id: id.clone(), duplicate }
        })
        .collect();
    let leased = inserted.into_iter().filter_map(|(id, seq, until)| Some(Leased { queue_id, id, seq, lease_until: until? })).collect();
    Ok((sent, leased))
}

/// The messages of one send as columns, each message's repeat of an
/// earlier id in the batch left out.
struct SendColumns<'a> {
    ids: Vec<&'a str>,
    keyed: Vec<bool>,
    bodies: Vec<&'a str>,
    keys: Vec<Option<&'a str>>,
    visible: Vec<i64>,
    reply_to: Vec<Option<&'a str>>,
    correlation_ids: Vec<Option<&'a str>>,
    handoffs: HandoffColumns<'a>,
    /// Lined up with the messages: whether each repeats an earlier id.
    repeated: Vec<bool>,
}

impl<'a> SendColumns<'a> {
    fn new(messages: &'a [(&'a Outgoing, MessageId)], leases: &'a [Option<Lease>], now: Timestamp) -> SendColumns<'a> {
        let mut columns = SendColumns {
            ids: Vec::with_capacity(messages.len()),
            keyed: Vec::with_capacity(messages.len()),
            bodies: Vec::with_capacity(messages.len()),
            keys: Vec::with_capacity(messages.len()),
            visible: Vec::with_capacity(messages.len()),
            reply_to: Vec::with_capacity(messages.len()),
            correlation_ids: Vec::with_capacity(messages.len()),
            handoffs: HandoffColumns::default(),
            repeated: vec![false; messages.len()],
        };
        for (index, (message, id)) in messages.iter().enumerate() {
            // A second message with the same id in one batch is its duplicate.
            if message.id.is_some() && messages[..index].iter().any(|(m, earlier)| m.id.is_some() && earlier == id) {
                columns.repeated[index] = true;
                continue;
            }
            columns.ids.push(id.as_str());
            columns.keyed.push(message.id.is_some());
            columns.bodies.push(message.body.get());
            columns.keys.push(message.ordering_key.as_deref());
            columns.visible.push(now.add(message.delay).as_millis());
            columns.reply_to.push(message.reply_to.as_ref().map(QueueName::as_str));
            columns.correlation_ids.push(message.correlation_id.as_deref());
            columns.handoffs.push(leases.get(index).and_then(Option::as_ref));
        }
        columns
    }
}

/// The parameters of the send statement.
struct SendParams {
    queue_id: Param,
    now: Param,
    id: Array,
    keyed: Array,
    body: Array,
    ordering_key: Array,
    visible_at: Array,
    reply_to: Array,
    correlation_id: Array,
    /// Whether each message goes to a waiting receiver, and that lease's
    /// owner, length (the queue's when NULL) and epoch.
    handoff: Array,
    owner: Array,
    lease_ms: Array,
    epoch: Array,
}

/// The send statement. One statement decides for every id: a fresh one is
/// remembered, an expired one is refreshed, a remembered one inserts
/// nothing. WITH ORDINALITY keeps the send order in the sequence numbers.
fn send_sql(p: &SendParams) -> String {
    let SendParams { queue_id, now, id, keyed, body, ordering_key, visible_at, reply_to, correlation_id, handoff, owner, lease_ms, epoch } =
        p;
    format!(
        "WITH fresh AS (
             INSERT INTO rota.message_ids (queue_id, id, expires_at)
             SELECT q.id, m.id, {now} + q.dedupe_window_ms
               FROM unnest({id}, {keyed}) AS m(id, keyed), rota.queues AS q
              WHERE q.id = {queue_id} AND m.keyed
             ON CONFLICT (queue_id, id) DO UPDATE SET expires_at = excluded.expires_at WHERE rota.message_ids.expires_at <= {now}
             RETURNING id)
         INSERT INTO rota.messages (queue_id, id, body, ordering_key, enqueued_at, visible_at, delivery_count, lease_epoch,
                                    lease_owner, lease_until, reply_to, correlation_id)
         SELECT {queue_id}, m.id, m.body, m.ordering_key, {now}, COALESCE(h.until, m.visible_at), CASE WHEN h.until IS NULL THEN 0 ELSE 1 END,
                CASE WHEN h.until IS NULL THEN 0 ELSE m.epoch END, CASE WHEN h.until IS NULL THEN NULL ELSE m.owner END, h.until,
                m.reply_to, m.correlation_id
           FROM unnest({id}, {keyed}, {body}, {ordering_key}, {visible_at}, {handoff}, {owner}, {lease_ms}, {epoch}, {reply_to},
                       {correlation_id}) WITH ORDINALITY
                AS m(id, keyed, body, ordering_key, visible_at, handoff, owner, lease_ms, epoch, reply_to, correlation_id, position)
          CROSS JOIN LATERAL (SELECT CASE WHEN m.handoff AND NOT q.paused
                                           AND (m.ordering_key IS NULL
                                                OR NOT EXISTS (SELECT 1 FROM rota.messages AS k
                                                                WHERE k.queue_id = q.id AND k.ordering_key = m.ordering_key))
                                      THEN {now} + COALESCE(m.lease_ms, q.lease_ms) END AS until
                                FROM rota.queues AS q WHERE q.id = {queue_id} OFFSET 0) AS h
          WHERE NOT m.keyed OR m.id IN (SELECT id FROM fresh)
          ORDER BY m.position
      RETURNING id, seq, lease_until"
    )
}

/// The handoff columns of a send statement, one entry per message.
#[derive(Default)]
pub(crate) struct HandoffColumns<'a> {
    pub(crate) handoff: Vec<bool>,
    pub(crate) owner: Vec<Option<&'a str>>,
    pub(crate) lease_ms: Vec<Option<i64>>,
    pub(crate) epoch: Vec<i64>,
}

impl<'a> HandoffColumns<'a> {
    pub(crate) fn push(&mut self, lease: Option<&'a Lease>) {
        self.handoff.push(lease.is_some());
        self.owner.push(lease.and_then(|l| l.owner.as_ref()).map(InstanceId::as_str));
        self.lease_ms.push(lease.and_then(|l| l.lease_ms));
        self.epoch.push(lease.map_or(0, |l| l.epoch));
    }
}

/// Tells listening receivers (in every process) that these queues have new
/// messages; PostgreSQL delivers it when the transaction commits.
pub(crate) async fn notify(conn: &mut PgConnection, channel: &str, queues: &[&str]) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, q) FROM unnest($2::text[]) AS q").bind(channel).bind(queues).execute(&mut *conn).await?;
    Ok(())
}

/// How far a receive moves a lease epoch on: 1 to 2^40, at random (see
/// [`claim`]). Drawn from the operating system's generator, not a seeded
/// one: its whole point is that no other process can draw the same value.
pub(crate) fn lease_epoch_step() -> i64 {
    1 + (rand::random::<u64>() >> 24) as i64
}

/// Gives back leases granted to receivers that went away: the messages are
/// visible again at once, and the deliveries that never happened are not
/// counted.
pub(crate) async fn give_back(conn: &mut PgConnection, n: &Names, tokens: &[LeaseToken], now: Timestamp) -> Result<()> {
    sqlx::query(n.sql(
        "UPDATE rota.messages AS m
            SET lease_owner = NULL, lease_until = NULL, visible_at = $1, delivery_count = m.delivery_count - 1
           FROM unnest($2::bigint[], $3::bigint[]) AS t(seq, epoch)
          WHERE m.seq = t.seq AND m.lease_epoch = t.epoch",
    ))
    .bind(now.as_millis())
    .bind(tokens.iter().map(|t| t.message).collect::<Vec<_>>())
    .bind(tokens.iter().map(|t| t.epoch).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// What one claim statement leased.
pub(crate) struct Claimed {
    /// Deliveries to hand out.
    pub deliveries: Vec<Delivery>,
    /// Messages leased one delivery past the queue's limit, with their
    /// token and the reason to dead-letter them under.
    pub exhausted: Vec<(LeaseToken, u32, String)>,
    /// When nothing was leased: the earliest time a message of the queue
    /// turns visible (a delay or a lease running out), none if it holds no
    /// message; as of the statement's snapshot.
    pub next_visible: Option<Timestamp>,
}

/// The receive: `$1` queue id, `$2` now, `$3` the most messages, `$4` the
/// consumer, `$5` the lease (the queue's when NULL), `$6` the epoch step.
///
/// A keyed message is leased only as the head of its key (its lowest
/// `seq`) and while no message of its key holds a lease: a `seq` is drawn
/// before its transaction commits, so a message numbered lower can become
/// visible after one numbered higher was leased, and must wait for it.
///
/// When it leases nothing, it returns one row, empty but for its last
/// column: the earliest `visible_at` of the queue (see
/// [`Claimed::next_visible`]).
pub(crate) const CLAIM_SQL: &str =
    "WITH q AS (SELECT id, lease_ms, deliveries_max FROM rota.queues, (SELECT set_config('synchronous_commit', 'off', true)) AS async
                    WHERE id = $1 AND NOT paused),
              picked AS (
                 SELECT m.seq, m.visible_at FROM rota.messages AS m
                  WHERE m.queue_id = (SELECT id FROM q) AND m.visible_at <= $2
                    AND (m.ordering_key IS NULL
                         OR (m.seq = (SELECT MIN(k.seq) FROM rota.messages AS k
                                       WHERE k.queue_id = m.queue_id AND k.ordering_key = m.ordering_key)
                             AND NOT EXISTS (SELECT 1 FROM rota.messages AS l
                                              WHERE l.queue_id = m.queue_id AND l.ordering_key = m.ordering_key
                                                AND l.lease_until > $2)))
                  ORDER BY m.visible_at, m.seq
                  LIMIT $3
                  FOR UPDATE SKIP LOCKED),
              leased AS (
         UPDATE rota.messages AS m
            SET delivery_count = m.delivery_count + 1, lease_epoch = m.lease_epoch + $6,
                lease_owner = $4, lease_until = $2 + COALESCE($5, q.lease_ms), visible_at = $2 + COALESCE($5, q.lease_ms)
           FROM picked, q
          WHERE m.seq = picked.seq
      RETURNING m.seq, m.id, m.body, m.ordering_key, m.enqueued_at, m.delivery_count, m.lease_epoch, m.last_error,
                picked.visible_at, m.lease_until, q.deliveries_max, m.reply_to, m.correlation_id)
         SELECT *, NULL::bigint AS next_visible FROM leased
         UNION ALL
         SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                (SELECT MIN(n.visible_at) FROM rota.messages AS n WHERE n.queue_id = $1)
          WHERE NOT EXISTS (SELECT 1 FROM leased)";

/// Leases up to `max` visible messages of a queue that is not paused,
/// oldest first, in one statement that skips rows other receivers are
/// leasing right now. A message whose delivery count passes the queue's
/// limit is leased too but returned as exhausted, for the caller to
/// dead-letter under its token.
///
/// The statement commits asynchronously (`synchronous_commit` off for its
/// own transaction): a receive records no work anyone relies on, so it need
/// not wait for its WAL to reach the disk, which takes the flush out of
/// every pickup. If the server crashes before that WAL is written, the lease
/// is lost with it and the message is delivered again, as after any expired
/// lease. What must not happen is that its holder's token matches the lease
/// of that next delivery, which would take the same epoch if epochs only
/// counted up: so each receive moves the epoch on by a random step of up to
/// 2^40 ([`lease_epoch_step`]), and a token of a forgotten lease matches a
/// later one with a probability of 2^-40. Everything that settles a lease
/// (complete, abandon, dead-letter, the commit of a decision) is a
/// synchronous commit, whose flush also makes every earlier receive durable.
pub(crate) async fn claim(
    conn: &mut PgConnection,
    n: &Names,
    queue: &QueueName,
    queue_id: i64,
    max: u32,
    request: &Receive,
    now: Timestamp,
) -> Result<Claimed> {
    // A keyed message is eligible only while it is the oldest remaining
    // message of its key, so each key has at most one lease at a time and is
    // delivered in send order: while a receiver holds the head's row lock,
    // the others skip it and see that their candidate is no head.
    let rows = sqlx::query(n.sql(CLAIM_SQL))
        .bind(queue_id)
        .bind(now.as_millis())
        .bind(i64::from(max))
        .bind(request.consumer.as_ref().map(InstanceId::as_str))
        .bind(request.lease.map(millis))
        .bind(lease_epoch_step())
        .fetch_all(&mut *conn)
        .await?;
    // Nothing leased: one row, of the queue's next visibility alone.
    if let [row] = rows.as_slice()
        && row.try_get::<Option<i64>, _>(0)?.is_none()
    {
        let next_visible = row.try_get::<Option<i64>, _>(13)?.map(Timestamp::from_millis);
        return Ok(Claimed { deliveries: Vec::new(), exhausted: Vec::new(), next_visible });
    }
    let mut claimed = rows
        .iter()
        .map(|row| {
            Ok(ClaimedRow {
                leased: stored::Leased {
                    seq: row.try_get(0)?,
                    id: row.try_get(1)?,
                    body: row.try_get(2)?,
                    ordering_key: row.try_get(3)?,
                    enqueued_at: row.try_get(4)?,
                    delivery_count: count(row.try_get(5)?),
                    lease_epoch: row.try_get(6)?,
                    lease_until: row.try_get(9)?,
                    reply_to: row.try_get(11)?,
                    correlation_id: row.try_get(12)?,
                },
                last_error: row.try_get(7)?,
                was_visible_at: row.try_get(8)?,
                deliveries_max: count(row.try_get(10)?),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    claimed.sort_by_key(|row| (row.was_visible_at, row.leased.seq));
    let mut outcome = Claimed { deliveries: Vec::with_capacity(claimed.len()), exhausted: Vec::new(), next_visible: None };
    for row in claimed {
        let leased = row.leased;
        if leased.delivery_count > row.deliveries_max {
            // This receive would be one delivery too many: the message goes
            // to the dead letters with the deliveries it really had.
            let delivered = leased.delivery_count - 1;
            let last = row.last_error.as_deref().unwrap_or("lease expired without completion");
            let reason = format!("delivered {delivered} times, the queue's limit is {}; last failure: {last}", row.deliveries_max);
            outcome.exhausted.push((LeaseToken { message: leased.seq, epoch: leased.lease_epoch }, delivered, reason));
            continue;
        }
        outcome.deliveries.push(leased.into_delivery(queue.clone())?);
    }
    Ok(outcome)
}

/// Dead-letters a message this receive leased past its delivery limit.
pub(crate) async fn dead_letter_exhausted(
    conn: &mut PgConnection,
    n: &Names,
    token: LeaseToken,
    delivered: u32,
    reason: &str,
    now: Timestamp,
) -> Result<()> {
    sqlx::query(n.sql(
        "WITH gone AS (DELETE FROM rota.messages WHERE seq = $1 AND lease_epoch = $5
                       RETURNING queue_id, id, body, ordering_key, enqueued_at, reply_to, correlation_id)
         INSERT INTO rota.dead_letters (queue_id, id, body, ordering_key, enqueued_at, delivery_count, dead_lettered_at, reason, reply_to,
                                        correlation_id)
         SELECT queue_id, id, body, ordering_key, enqueued_at, $4, $2, $3, reply_to, correlation_id FROM gone",
    ))
    .bind(token.message)
    .bind(now.as_millis())
    .bind(reason)
    .bind(i64::from(delivered))
    .bind(token.epoch)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// A leased row with what the receive needs to decide whether it is one
/// delivery too many.
struct ClaimedRow {
    leased: stored::Leased,
    last_error: Option<String>,
    was_visible_at: i64,
    deliveries_max: u32,
}

/// Deletes a leased message. `LeaseLost` unless `token` is its current, unexpired lease.
pub(crate) async fn complete(
    conn: &mut PgConnection,
    n: &Names,
    queue: &QueueName,
    queue_id: i64,
    token: LeaseToken,
    now: Timestamp,
) -> Result<()> {
    let lost = complete_batch(conn, n, queue_id, &[token], now).await?;
    if !lost.is_empty() {
        return Err(lease_lost(queue, token).into());
    }
    Ok(())
}

/// Deletes the leased messages whose tokens ($3, $4) are current in queue
/// $1 at $2. Each is found by its key alone, the lease tested as one
/// condition (see `PLANNER_SETTINGS`).
pub(crate) const COMPLETE_SQL: &str = "DELETE FROM rota.messages AS m
          USING unnest($3::bigint[], $4::bigint[]) AS t(seq, epoch)
          WHERE m.seq = t.seq AND (m.queue_id = $1 AND m.lease_epoch = t.epoch AND m.lease_until > $2) IS TRUE
      RETURNING m.seq, m.lease_epoch";

/// Deletes the leased messages whose tokens are current, in one statement.
/// Returns the tokens whose lease was lost.
pub(crate) async fn complete_batch(
    conn: &mut PgConnection,
    n: &Names,
    queue_id: i64,
    tokens: &[LeaseToken],
    now: Timestamp,
) -> Result<Vec<LeaseToken>> {
    let seqs: Vec<i64> = tokens.iter().map(|t| t.message).collect();
    let epochs: Vec<i64> = tokens.iter().map(|t| t.epoch).collect();
    let deleted: Vec<(i64, i64)> =
        sqlx::query_as(n.sql(COMPLETE_SQL)).bind(queue_id).bind(now.as_millis()).bind(&seqs).bind(&epochs).fetch_all(&mut *conn).await?;
    if deleted.len() == tokens.len() {
        return Ok(Vec::new());
    }
    Ok(tokens.iter().filter(|t| !deleted.contains(&(t.message, t.epoch))).copied().collect())
}

pub(crate) fn lease_lost(queue: &QueueName, token: LeaseToken) -> Error {
    Error::LeaseLost(format!(
        "token {token} is not a current lease in queue {queue} (unknown, expired, delivered again, or already settled)"
    ))
}

/// The delivery count of message $1 while leased by epoch $3 in queue $2
/// at $4, found by its key alone (see `PLANNER_SETTINGS`).
pub(crate) const LEASED_COUNT_SQL: &str = "SELECT delivery_count FROM rota.messages
          WHERE seq = $1 AND (queue_id = $2 AND lease_epoch = $3 AND lease_until > $4) IS TRUE FOR UPDATE";

/// The delivery count of the message leased by `token`, locked for this
/// transaction, or `LeaseLost`.
async fn leased_delivery_count(conn: &mut PgConnection, n: &Names, queue: &QueueRow, token: LeaseToken, now: Timestamp) -> Result<u32> {
    let found: Option<i64> = sqlx::query_scalar(n.sql(LEASED_COUNT_SQL))
        .bind(token.message)
        .bind(queue.id)
        .bind(token.epoch)
        .bind(now.as_millis())
        .fetch_optional(&mut *conn)
        .await?;
    found.map(count).ok_or_else(|| lease_lost(&queue.name, token).into())
}

/// Gives a leased message back, visible after `delay`; dead-letters it when
/// its deliveries are used up.
pub(crate) async fn abandon(
    conn: &mut PgConnection,
    n: &Names,
    queue: &QueueRow,
    token: LeaseToken,
    delay: Duration,
    reason: Option<&str>,
    now: Timestamp,
) -> Result<()> {
    let delivered = leased_delivery_count(conn, n, queue, token, now).await?;
    if delivered >= queue.config.deliveries_max {
        let reason = format!(
            "delivered {delivered} times, the queue's limit is {}; last failure: {}",
            queue.config.deliveries_max,
            reason.unwrap_or("abandoned")
        );
        return move_to_dead_letters(conn, n, token.message, delivered, now, &reason).await;
    }
    sqlx::query(n.sql(
        "UPDATE rota.messages SET lease_owner = NULL, lease_until = NULL, visible_at = $2, last_error = COALESCE($3, last_error)
          WHERE seq = $1",
    ))
    .bind(token.message)
    .bind(now.add(delay).as_millis())
    .bind(reason)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Extends the lease of message $1 (epoch $3, queue $2, live at $4) to $5,
/// the message found by its key alone (see `PLANNER_SETTINGS`).
pub(crate) const RENEW_SQL: &str = "UPDATE rota.messages SET lease_until = $5, visible_at = $5
          WHERE seq = $1 AND (queue_id = $2 AND lease_epoch = $3 AND lease_until > $4) IS TRUE";

/// Extends a lease to `now + lease`.
pub(crate) async fn renew(
    conn: &mut PgConnection,
    n: &Names,
    queue: &QueueRow,
    token: LeaseToken,
    lease: Duration,
    now: Timestamp,
) -> Result<Timestamp> {
    let until = now.add(lease);
    let updated = sqlx::query(n.sql(RENEW_SQL))
        .bind(token.message)
        .bind(queue.id)
        .bind(token.epoch)
        .bind(now.as_millis())
        .bind(until.as_millis())
        .execute(&mut *conn)
        .await?
        .rows_affected();
    if updated == 0 {
        return Err(lease_lost(&queue.name, token).into());
    }
    Ok(until)
}

/// Moves a leased message to the dead letters with the consumer's reason.
pub(crate) async fn dead_letter(
    conn: &mut PgConnection,
    n: &Names,
    queue: &QueueRow,
    token: LeaseToken,
    reason: &str,
    now: Timestamp,
) -> Result<()> {
    let delivered = leased_delivery_count(conn, n, queue, token, now).await?;
    move_to_dead_letters(conn, n, token.message, delivered, now, reason).await
}

pub(crate) async fn move_to_dead_letters(
    conn: &mut PgConnection,
    n: &Names,
    seq: i64,
    delivered: u32,
    now: Timestamp,
    reason: &str,
) -> Result<()> {
    sqlx::query(n.sql(
        "WITH gone AS (DELETE FROM rota.messages WHERE seq = $1
                       RETURNING queue_id, id, body, ordering_key, enqueued_at, reply_to, correlation_id)
         INSERT INTO rota.dead_letters (queue_id, id, body, ordering_key, enqueued_at, delivery_count, dead_lettered_at, reason, reply_to,
                                        correlation_id)
         SELECT queue_id, id, body, ordering_key, enqueued_at, $4, $2, $3, reply_to, correlation_id FROM gone",
    ))
    .bind(seq)
    .bind(now.as_millis())
    .bind(reason)
    .bind(i64::from(delivered))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub(crate) async fn dead_letters(conn: &mut PgConnection, n: &Names, queue: &QueueRow, limit: u32) -> Result<Vec<DeadLetter>> {
    let rows = sqlx::query(n.sql(
        "SELECT id, body, ordering_key, delivery_count, enqueued_at, dead_lettered_at, reason, reply_to, correlation_id
           FROM rota.dead_letters WHERE queue_id = $1 ORDER BY seq LIMIT $2",
    ))
    .bind(queue.id)
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(|row| dead_letter_from(row, queue, 0)).collect()
}

/// Sends dead letters back, in the order they were dead-lettered, with a
/// fresh delivery count and their original send time.
pub(crate) async fn redrive(conn: &mut PgConnection, n: &Names, queue: &QueueRow, which: &Redrive, now: Timestamp) -> Result<u64> {
    let id = match which {
        Redrive::One(id) => Some(id.as_str()),
        Redrive::All => None,
    };
    let moved = sqlx::query(n.sql(
        "WITH gone AS (DELETE FROM rota.dead_letters WHERE queue_id = $1 AND ($3::text IS NULL OR id = $3)
                       RETURNING seq, queue_id, id, body, ordering_key, enqueued_at, reply_to, correlation_id)
         INSERT INTO rota.messages (queue_id, id, body, ordering_key, enqueued_at, visible_at, reply_to, correlation_id)
         SELECT queue_id, id, body, ordering_key, enqueued_at, $2, reply_to, correlation_id FROM gone ORDER BY seq",
    ))
    .bind(queue.id)
    .bind(now.as_millis())
    .bind(id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if let (0, Redrive::One(id)) = (moved, which) {
        return Err(Error::NotFound(format!("dead letter {id} in queue {}", queue.name)).into());
    }
    Ok(moved)
}

/// The conditions of a [`DeadLetterFilter`] besides its queue, as SQL on
/// `dead_letters` (parameters $3 to $5, each unset when NULL).
macro_rules! dead_letter_conditions {
    () => {
        "($3::text IS NULL OR strpos(reason, $3) > 0)
                                  AND ($4::bigint IS NULL OR dead_lettered_at >= $4) AND ($5::bigint IS NULL OR dead_lettered_at < $5)"
    };
}

fn dead_letter_from(row: &sqlx::postgres::PgRow, queue: &QueueRow, first: usize) -> Result<DeadLetter> {
    Ok(DeadLetter {
        queue: queue.name.clone(),
        id: stored::id(row.try_get(first)?)?,
        body: stored::body(row.try_get(first + 1)?)?,
        ordering_key: row.try_get(first + 2)?,
        delivery_count: count(row.try_get(first + 3)?),
        enqueued_at: Timestamp::from_millis(row.try_get(first + 4)?),
        dead_lettered_at: Timestamp::from_millis(row.try_get(first + 5)?),
        reason: row.try_get(first + 6)?,
        reply_to: stored::reply_to(row.try_get(first + 7)?)?,
        correlation_id: row.try_get(first + 8)?,
    })
}

/// A page of the walk over a queue's dead letters: the range of the next
/// `scan` of them in the `(queue_id, seq)` index, then the selected ones
/// in that range.
pub(crate) async fn dead_letter_page(
    conn: &mut PgConnection,
    n: &Names,
    queue: &QueueRow,
    filter: &DeadLetterFilter,
    after: Option<u64>,
    scan: u32,
) -> Result<DeadLetterPage> {
    let after = after.map_or(0, |seq| i64::try_from(seq).unwrap_or(i64::MAX));
    let range = sqlx::query(n.sql(
        "SELECT count(*), max(seq) FROM (SELECT seq FROM rota.dead_letters WHERE queue_id = $1 AND seq > $2 ORDER BY seq LIMIT $3) AS s",
    ))
    .bind(queue.id)
    .bind(after)
    .bind(i64::from(scan))
    .fetch_one(&mut *conn)
    .await?;
    let (scanned, through): (i64, Option<i64>) = (range.try_get(0)?, range.try_get(1)?);
    let end = scanned < i64::from(scan);
    let Some(through) = through else { return Ok(DeadLetterPage { letters: Vec::new(), scanned_through: None, end }) };
    let rows = sqlx::query(n.sql(concat!(
        "SELECT seq, id, body, ordering_key, delivery_count, enqueued_at, dead_lettered_at, reason, reply_to, correlation_id
           FROM rota.dead_letters WHERE queue_id = $1 AND seq > $2 AND seq <= $6 AND ",
        dead_letter_conditions!(),
        " ORDER BY seq"
    )))
    .bind(queue.id)
    .bind(after)
    .bind(filter.reason_contains.as_deref())
    .bind(filter.dead_lettered.from.map(Timestamp::as_millis))
    .bind(filter.dead_lettered.until.map(Timestamp::as_millis))
    .bind(through)
    .fetch_all(&mut *conn)
    .await?;
    let letters = rows
        .iter()
        .map(|row| Ok((u64::try_from(row.try_get::<i64, _>(0)?).unwrap_or(0), dead_letter_from(row, queue, 1)?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(DeadLetterPage { letters, scanned_through: u64::try_from(through).ok(), end })
}

pub(crate) async fn count_dead_letters(conn: &mut PgConnection, n: &Names, queue: &QueueRow, filter: &DeadLetterFilter) -> Result<u64> {
    // $2 (a page's start) is only cast: the count reads every one.
    let counted: i64 = sqlx::query(
        n.sql(concat!("SELECT count(*) FROM rota.dead_letters WHERE queue_id = $1 AND $2::bigint IS NULL AND ", dead_letter_conditions!())),
    )
    .bind(queue.id)
    .bind(Option::<i64>::None)
    .bind(filter.reason_contains.as_deref())
    .bind(filter.dead_lettered.from.map(Timestamp::as_millis))
    .bind(filter.dead_lettered.until.map(Timestamp::as_millis))
    .fetch_one(&mut *conn)
    .await?
    .try_get(0)?;
    Ok(u64::try_from(counted).unwrap_or(0))
}

/// Moves the dead letters $3 of queue $1 back to it, visible at $2; each
/// found by its key alone (see `PLANNER_SETTINGS`).
pub(crate) const REDRIVE_LISTED_SQL: &str = "WITH gone AS (DELETE FROM rota.dead_letters WHERE seq = ANY($3) AND (queue_id = $1) IS TRUE
                       RETURNING seq, queue_id, id, body, ordering_key, enqueued_at, reply_to, correlation_id)
         INSERT INTO rota.messages (queue_id, id, body, ordering_key, enqueued_at, visible_at, reply_to, correlation_id)
         SELECT queue_id, id, body, ordering_key, enqueued_at, $2, reply_to, correlation_id FROM gone ORDER BY seq";

/// Sends the listed dead letters back, in the order they were
/// dead-lettered, like [`redrive`]; a `seq` no longer there is passed over.
pub(crate) async fn redrive_listed(conn: &mut PgConnection, n: &Names, queue: &QueueRow, seqs: &[u64], now: Timestamp) -> Result<u64> {
    let seqs: Vec<i64> = seqs.iter().map(|seq| i64::try_from(*seq).unwrap_or(i64::MAX)).collect();
    let moved =
        sqlx::query(n.sql(REDRIVE_LISTED_SQL)).bind(queue.id).bind(now.as_millis()).bind(&seqs).execute(&mut *conn).await?.rows_affected();
    Ok(moved)
}

pub(crate) async fn purge_dead_letters(conn: &mut PgConnection, n: &Names, queue: &QueueRow) -> Result<u64> {
    let deleted =
        sqlx::query(n.sql("DELETE FROM rota.dead_letters WHERE queue_id = $1")).bind(queue.id).execute(&mut *conn).await?.rows_affected();
    Ok(deleted)
}

/// Forgets message ids whose duplicate-detection window has passed, a bounded
/// number at a time.
pub(crate) async fn forget_expired_ids(conn: &mut PgConnection, n: &Names, now: Timestamp, limit: u32) -> Result<u64> {
    let deleted = sqlx::query(n.sql(
        "DELETE FROM rota.message_ids WHERE (queue_id, id) IN
           (SELECT queue_id, id FROM rota.message_ids WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
    ))
    .bind(now.as_millis())
    .bind(i64::from(limit))
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(deleted)
}

/// The backlogs of `queues` that exist, in the order given. Both reads
/// walk `messages_visible`: the ready count stops at `up_to` entries, and
/// a leased message is one visible later (at its lease's end).
pub(crate) async fn backlogs(conn: &mut PgConnection, n: &Names, queues: &[QueueName], up_to: u32, now: Timestamp) -> Result<Vec<Backlog>> {
    let names: Vec<&str> = queues.iter().map(QueueName::as_str).collect();
    let rows = sqlx::query(n.sql(
        "SELECT q.name,
                (SELECT COUNT(*) FROM (SELECT 1 FROM rota.messages m WHERE m.queue_id = q.id AND m.visible_at <= $2 LIMIT $3) AS ready),
                EXISTS (SELECT 1 FROM rota.messages m WHERE m.queue_id = q.id AND m.visible_at > $2 AND m.lease_until > $2)
           FROM unnest($1::text[]) WITH ORDINALITY AS asked (name, place)
           JOIN rota.queues q ON q.name = asked.name
          ORDER BY asked.place",
    ))
    .bind(&names)
    .bind(now.as_millis())
    .bind(i64::from(up_to))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|row| {
            let name: String = row.try_get(0)?;
            Ok(Backlog {
                queue: QueueName::new(name).map_err(|e| Error::Backend(format!("stored queue name is invalid: {e}")))?,
                ready: u64::try_from(row.try_get::<i64, _>(1)?).unwrap_or(0),
                leased: row.try_get(2)?,
            })
        })
        .collect()
}

pub(crate) async fn stats(conn: &mut PgConnection, n: &Names, now: Timestamp) -> Result<Vec<QueueStats>> {
    let rows = sqlx::query(n.sql(
        "SELECT q.name, q.paused,
                (SELECT COUNT(*) FROM rota.messages m WHERE m.queue_id = q.id AND m.visible_at <= $1),
                (SELECT COUNT(*) FROM rota.messages m WHERE m.queue_id = q.id AND m.lease_until > $1),
                (SELECT COUNT(*) FROM rota.messages m WHERE m.queue_id = q.id AND m.visible_at > $1
                                                       AND (m.lease_until IS NULL OR m.lease_until <= $1)),
                (SELECT COUNT(*) FROM rota.dead_letters d WHERE d.queue_id = q.id),
                (SELECT MIN(m.enqueued_at) FROM rota.messages m WHERE m.queue_id = q.id AND m.visible_at <= $1)
           FROM rota.queues q ORDER BY q.name COLLATE \"C\"",
    ))
    .bind(now.as_millis())
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|row| {
            let name: String = row.try_get(0)?;
            let counted = |index: usize| -> Result<u64> { Ok(u64::try_from(row.try_get::<i64, _>(index)?).unwrap_or(0)) };
            Ok(QueueStats {
                queue: QueueName::new(name).map_err(|e| Error::Backend(format!("stored queue name is invalid: {e}")))?,
                paused: row.try_get(1)?,
                ready: counted(2)?,
                leased: counted(3)?,
                delayed: counted(4)?,
                dead_lettered: counted(5)?,
                oldest_ready_at: row.try_get::<Option<i64>, _>(6)?.map(Timestamp::from_millis),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rota_model::{QueueName, SystemClock};
    use rota_store::{Outgoing, Queues};
    use sqlx::Connection;

    use super::*;

    /// The receive walks `messages_visible` in order and stops at its limit,
    /// whatever the statistics were when a connection planned it: a plan
    /// that reads every visible message and sorts them (a bitmap scan, a
    /// sequential scan) makes each receive cost the whole backlog.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_receive_walks_its_index_in_order_whatever_the_statistics() {
        let Some(schema) = rota_testkit::postgres::TestSchema::new("the receive's plan on PostgreSQL") else { return };
        let mut config = crate::Config::new(schema.url.clone());
        config.schema = schema.name.clone();
        let store = crate::PgStore::open(config.clone(), Arc::new(SystemClock)).await.unwrap();
        let queue = QueueName::new("work").unwrap();
        store.send(&queue, Outgoing::json(&serde_json::json!("first")).unwrap()).await.unwrap();
        let mut conn = PgConnection::connect_with(&config.connect_options().unwrap()).await.unwrap();
        let s = &schema.name;
        let fill = format!(
            "INSERT INTO \"{s}\".messages (queue_id, id, body, enqueued_at, visible_at)
             SELECT (SELECT id FROM \"{s}\".queues WHERE name = 'work'), 'm-' || g, '{{}}', g, g FROM generate_series(1, 20000) AS g"
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(fill)).execute(&mut conn).await.unwrap();
        let names = Names::new(s);
        for analyzed in [false, true] {
            if analyzed {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("ANALYZE \"{s}\".messages"))).execute(&mut conn).await.unwrap();
            }
            let prepare = format!("PREPARE receive_plan AS {}", names.qualify(CLAIM_SQL));
            sqlx::raw_sql(sqlx::AssertSqlSafe(prepare)).execute(&mut conn).await.unwrap();
            let plan: Vec<String> =
                sqlx::query_scalar("EXPLAIN EXECUTE receive_plan(1, 1000000, 18, 'c', NULL, 1)").fetch_all(&mut conn).await.unwrap();
            sqlx::raw_sql("DEALLOCATE receive_plan").execute(&mut conn).await.unwrap();
            let plan = plan.join("\n");
            assert!(plan.contains("Index Scan using messages_visible"), "analyzed: {analyzed}\n{plan}");
            for walk in ["Bitmap", "Sort", "Seq Scan on messages"] {
                assert!(!plan.contains(walk), "the receive's plan has a {walk} (analyzed: {analyzed}):\n{plan}");
            }
        }
    }
}
