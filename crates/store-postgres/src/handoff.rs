//! Handing new messages straight to the receivers waiting in this process.
//!
//! A receiver that found its queue empty parks here while it waits. A send
//! to that queue from this process ([`Queues::send`] and `send_batch`) then
//! inserts the message already leased to the receiver, in the statement that
//! sends it, and gives the delivery to the receiver once that statement has
//! committed: no wake-up, no second statement to lease it, and the receiver
//! has the message the moment the sender's commit returns (the pickup
//! latency of a queue is one commit). Receivers in other processes are woken
//! by NOTIFY and lease with a statement as before.
//!
//! Commits (`Tasks::commit`) and task creations hand over only when they
//! go out alone (see `group_commit`): a receiver taken by a batch would wait for the whole
//! batch, and consumers handed one message at a time stop taking them in
//! batches, which cost throughput when measured with fifty workflows in
//! flight.
//!
//! [`Queues::send`]: rota_store::Queues::send
//!
//! Only messages a receive could take at once are handed over: no delay,
//! the queue not paused, and a keyed message only as the head of its key:
//! the first of its key in the statement, and no message of that key in
//! the queue (both checked in the statement, against what a receive
//! started at the same moment would see). A receiver takes at most
//! its `max`, and one send may feed several receivers. The lease is the one
//! a receive would have taken: delivery count 1, the receiver's lease length
//! or the queue's, and a random epoch (see `queue_sql::claim`).
//!
//! If the statement fails, the receivers get nothing and wait on; if a
//! receiver went away meanwhile, its messages are given back at once (lease
//! cleared, delivery not counted), as a receive does for a receiver that
//! went away.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rota_model::{InstanceId, LeaseToken, MessageId, QueueName, Timestamp};
use rota_store::{Delivery, Outgoing, Receive};
use tokio::sync::oneshot;

use crate::queue_sql::{self, millis};
use crate::sql::Names;

/// A receiver waiting in this process.
struct Parked {
    id: u64,
    room: u32,
    lease_ms: Option<i64>,
    owner: Option<InstanceId>,
    /// The receiver acts on what it gets only by writing to this store
    /// (see [`Receive::acts_within_store`]).
    acts_within_store: bool,
    deliver: oneshot::Sender<Vec<Delivery>>,
}

/// The receivers waiting in this process, by queue.
#[derive(Default)]
pub(crate) struct Waiting {
    next_id: AtomicU64,
    by_queue: Mutex<HashMap<QueueName, Vec<Parked>>>,
    /// The ordering keys (queue, key) of the keyed messages being handed
    /// over by statements still running: a statement does not see another
    /// one's message of the same key before it commits, so two would both
    /// find their key free and lease it twice.
    keys_in_flight: Mutex<HashSet<(QueueName, String)>>,
}

/// A parked receiver's ticket: where its deliveries arrive. Dropped while
/// still parked (the receive was cancelled: a shutdown, an HTTP long poll
/// whose client went away), it takes the receiver back, so that nothing
/// stays parked for a queue no send in this process will visit again.
pub(crate) struct Ticket<'a> {
    id: u64,
    queue: QueueName,
    waiting: &'a Waiting,
    parked: bool,
    pub(crate) delivered: oneshot::Receiver<Vec<Delivery>>,
}

impl Ticket<'_> {
    /// Takes the receiver back unless a sender took it: `false` means its
    /// deliveries are on their way (or its sender failed) on `delivered`.
    pub(crate) fn unpark(&mut self) -> bool {
        self.parked = false;
        self.waiting.unpark(&self.queue, self.id)
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.parked {
            self.waiting.unpark(&self.queue, self.id);
        }
    }
}

impl Waiting {
    /// Parks a receiver of `queue` asking for `request`.
    pub(crate) fn park(&self, queue: &QueueName, request: &Receive) -> Ticket<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (deliver, delivered) = oneshot::channel();
        let parked = Parked {
            id,
            room: request.max,
            lease_ms: request.lease.map(millis),
            owner: request.consumer.clone(),
            acts_within_store: request.acts_within_store,
            deliver,
        };
        self.lock().entry(queue.clone()).or_default().push(parked);
        Ticket { id, queue: queue.clone(), waiting: self, parked: true, delivered }
    }

    fn unpark(&self, queue: &QueueName, id: u64) -> bool {
        let mut by_queue = self.lock();
        let Some(parked) = by_queue.get_mut(queue) else { return false };
        let Some(position) = parked.iter().position(|p| p.id == id) else { return false };
        parked.swap_remove(position);
        true
    }

    /// Decides which of `sends` (queue, message, id) go to waiting
    /// receivers, taking those receivers. The plan's `leases` line up with
    /// `sends`. A keyed message goes only if it is the first of its key in
    /// `sends` and no other statement is handing its key over.
    pub(crate) fn plan<'a>(self: &Arc<Self>, sends: impl IntoIterator<Item = (&'a QueueName, &'a Outgoing, &'a MessageId)>) -> Plan {
        let mut plan = Plan { leases: Vec::new(), takers: Vec::new(), keys: Vec::new(), waiting: Some(self.clone()) };
        let mut by_queue = None;
        // Every key of `sends`: a second message of a key waits behind the
        // first.
        let mut keys_seen: Vec<(&QueueName, &str)> = Vec::new();
        for (queue, message, id) in sends {
            let first_of_key = match message.ordering_key.as_deref() {
                None => true,
                Some(key) if keys_seen.contains(&(queue, key)) => false,
                Some(key) => {
                    keys_seen.push((queue, key));
                    true
                }
            };
            let lease = if message.delay.is_zero() && first_of_key {
                let by_queue = by_queue.get_or_insert_with(|| self.lock());
                match &message.ordering_key {
                    None => take_room(by_queue, &mut plan.takers, queue, message, id),
                    Some(key) => {
                        let mut in_flight = self.keys();
                        let held = (queue.clone(), key.clone());
                        if in_flight.contains(&held) {
                            None
                        } else {
                            let lease = take_room(by_queue, &mut plan.takers, queue, message, id);
                            if lease.is_some() {
                                in_flight.insert(held.clone());
                                plan.keys.push(held);
                            }
                            lease
                        }
                    }
                }
            } else {
                None
            };
            plan.leases.push(lease);
        }
        plan
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, HashSet<(QueueName, String)>> {
        self.keys_in_flight.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<QueueName, Vec<Parked>>> {
        self.by_queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Finds room for one message with a receiver of `queue`: one already
/// taken by this plan, else one still parked.
fn take_room(
    by_queue: &mut HashMap<QueueName, Vec<Parked>>,
    takers: &mut Vec<Taker>,
    queue: &QueueName,
    message: &Outgoing,
    id: &MessageId,
) -> Option<Lease> {
    let index =
        match takers.iter().position(|t| &t.queue == queue && !t.parked.deliver.is_closed() && t.given.len() < t.parked.room as usize) {
            Some(index) => index,
            None => {
                let parked = by_queue.get_mut(queue)?;
                // A receiver whose caller went away takes nothing.
                parked.retain(|p| !p.deliver.is_closed());
                let parked = parked.pop()?;
                takers.push(Taker { queue: queue.clone(), parked, given: Vec::new() });
                takers.len() - 1
            }
        };
    let taker = &mut takers[index];
    let lease = Lease { lease_ms: taker.parked.lease_ms, owner: taker.parked.owner.clone(), epoch: queue_sql::lease_epoch_step() };
    taker.given.push(Given {
        id: id.clone(),
        body: message.body.clone(),
        epoch: lease.epoch,
        reply_to: message.reply_to.clone(),
        correlation_id: message.correlation_id.clone(),
    });
    Some(lease)
}

/// The lease a handed-over message is inserted with.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    /// The receiver's lease length; the queue's when `None`.
    pub(crate) lease_ms: Option<i64>,
    pub(crate) owner: Option<InstanceId>,
    pub(crate) epoch: i64,
}

struct Given {
    id: MessageId,
    body: rota_store::Body,
    epoch: i64,
    reply_to: Option<QueueName>,
    correlation_id: Option<String>,
}

struct Taker {
    queue: QueueName,
    parked: Parked,
    given: Vec<Given>,
}

/// Which messages of one statement go to which waiting receivers. Dropped
/// (delivered, or its statement failed), it frees the keys it held.
pub(crate) struct Plan {
    /// One entry per message sent, in order: its lease, if handed over.
    pub(crate) leases: Vec<Option<Lease>>,
    takers: Vec<Taker>,
    /// The ordering keys this plan holds in `keys_in_flight`.
    keys: Vec<(QueueName, String)>,
    waiting: Option<Arc<Waiting>>,
}

impl Drop for Plan {
    fn drop(&mut self) {
        if let Some(waiting) = &self.waiting
            && !self.keys.is_empty()
        {
            let mut in_flight = waiting.keys();
            for key in &self.keys {
                in_flight.remove(key);
            }
        }
    }
}

/// A message the statement inserted already leased.
#[derive(Debug, Clone)]
pub(crate) struct Leased {
    pub(crate) queue_id: i64,
    pub(crate) id: String,
    pub(crate) seq: i64,
    pub(crate) lease_until: i64,
}

impl Plan {
    /// Whether no message is handed over.
    pub(crate) fn is_empty(&self) -> bool {
        self.takers.is_empty()
    }

    /// Whether every message sent goes to a receiver that acts on it only by
    /// writing to this store. Such a statement may commit before its flush
    /// (see `group_commit::Flushes`): no one outside the store acts on what
    /// it wrote before a later synchronous commit has flushed it. A message
    /// whose receiver went away is given back by a synchronous commit,
    /// which flushes it first; one the statement inserts unleased after all
    /// (its queue paused meanwhile, or its key held) is flushed by the
    /// committer at once.
    pub(crate) fn hands_all_within_store(&self) -> bool {
        !self.leases.is_empty() && self.leases.iter().all(Option::is_some) && self.takers.iter().all(|taker| taker.parked.acts_within_store)
    }

    /// After the statement committed: gives each receiver the messages that
    /// were inserted leased to it (`leased`). Those whose receiver went away
    /// are given back.
    pub(crate) fn deliver(mut self, leased: &[Leased], queue_ids: &HashMap<QueueName, i64>, now: Timestamp, give_back: &GiveBack) {
        let mut orphans = Vec::new();
        for taker in std::mem::take(&mut self.takers) {
            let Some(&queue_id) = queue_ids.get(&taker.queue) else { continue };
            let deliveries: Vec<Delivery> = taker
                .given
                .into_iter()
                .filter_map(|given| {
                    let row = leased.iter().find(|l| l.queue_id == queue_id && l.id == given.id.as_str())?;
                    Some(Delivery {
                        queue: taker.queue.clone(),
                        id: given.id,
                        body: given.body,
                        lease_token: LeaseToken { message: row.seq, epoch: given.epoch },
                        delivery_count: 1,
                        enqueued_at: now,
                        lease_until: Timestamp::from_millis(row.lease_until),
                        ordering_key: None,
                        reply_to: given.reply_to,
                        correlation_id: given.correlation_id,
                    })
                })
                .collect();
            // An empty list sends the receiver back to looking for itself.
            if let Err(undelivered) = taker.parked.deliver.send(deliveries) {
                orphans.extend(undelivered.iter().map(|d| d.lease_token));
            }
        }
        if !orphans.is_empty() {
            give_back.spawn(orphans);
        }
    }
}

/// Gives back leases granted to receivers that went away.
#[derive(Clone)]
pub(crate) struct GiveBack {
    pub(crate) connections: std::sync::Arc<crate::connections::Connections>,
    pub(crate) names: std::sync::Arc<Names>,
    pub(crate) clock: std::sync::Arc<dyn rota_model::Clock>,
}

impl GiveBack {
    fn spawn(&self, tokens: Vec<LeaseToken>) {
        let this = self.clone();
        tokio::spawn(async move {
            let given_back: crate::Result<()> = async {
                let mut conn = this.connections.acquire().await?;
                let outcome = queue_sql::give_back(&mut conn, &this.names, &tokens, this.clock.now()).await;
                conn.finished(&outcome);
                outcome
            }
            .await;
            if let Err(fail) = given_back {
                tracing::warn!("giving back {} message(s) whose receiver went away: {}", tokens.len(), fail.into_store());
            }
        });
    }
}

/// The queues among `sent_to` that got a message no receiver was handed:
/// only those have news for the others (a message handed over is leased,
/// no one else could take it), so only those are announced.
pub(crate) fn not_all_handed<'a>(
    sent_to: Vec<QueueName>,
    sends: impl Iterator<Item = (&'a QueueName, &'a MessageId)> + Clone,
    leased: &[Leased],
    queue_ids: &HashMap<QueueName, i64>,
) -> Vec<QueueName> {
    if leased.is_empty() {
        return sent_to;
    }
    sent_to
        .into_iter()
        .filter(|queue| {
            let queue_id = queue_ids.get(queue).copied();
            sends.clone().any(|(to, id)| to == queue && !leased.iter().any(|l| Some(l.queue_id) == queue_id && l.id == id.as_str()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parked(waiting: &Waiting, queue: &QueueName) -> usize {
        waiting.lock().get(queue).map_or(0, Vec::len)
    }

    /// A cancelled receive (its ticket dropped while parked) leaves nothing
    /// parked; one taken back or handed messages is not parked twice.
    #[test]
    fn a_dropped_ticket_takes_its_receiver_back() {
        let waiting = Arc::new(Waiting::default());
        let queue = QueueName::new("work").unwrap();
        let first = waiting.park(&queue, &Receive::up_to(4));
        let mut second = waiting.park(&queue, &Receive::up_to(4));
        assert_eq!(parked(&waiting, &queue), 2);
        drop(first);
        assert_eq!(parked(&waiting, &queue), 1, "the cancelled receive is no longer parked");
        assert!(second.unpark(), "taken back before any send took it");
        assert_eq!(parked(&waiting, &queue), 0);
        drop(second);
        assert_eq!(parked(&waiting, &queue), 0);

        // A receiver a send took is not parked any more; dropping its
        // ticket changes nothing.
        let third = waiting.park(&queue, &Receive::up_to(4));
        let message = Outgoing::json(&serde_json::json!("hello")).unwrap();
        let id = MessageId::new("m-1").unwrap();
        let plan = waiting.plan([(&queue, &message, &id)]);
        assert!(!plan.is_empty(), "the send found the parked receiver");
        assert_eq!(parked(&waiting, &queue), 0);
        drop(third);
        assert_eq!(parked(&waiting, &queue), 0);
    }

    /// Two statements running at once never both hand over a message of
    /// one ordering key (neither sees the other's before it commits): the
    /// second plan leaves its message to a receive until the first plan is
    /// done; a message of another key, or of no key, still goes; and the
    /// second message of a key within one plan waits behind the first.
    #[test]
    fn one_ordering_key_is_handed_over_by_one_statement_at_a_time() {
        let waiting = Arc::new(Waiting::default());
        let queue = QueueName::new("inbox").unwrap();
        let keyed = |key: &str| Outgoing::json(&serde_json::json!(key)).unwrap().with_ordering_key(key);
        let id = |n: u32| MessageId::new(format!("m-{n}")).unwrap();
        let handed = |plan: &Plan| plan.leases.iter().map(Option::is_some).collect::<Vec<_>>();
        let _tickets: Vec<_> = (0..4).map(|_| waiting.park(&queue, &Receive::up_to(1))).collect();

        let (task_1, task_2, plain) = (keyed("task-1"), keyed("task-2"), Outgoing::json(&serde_json::json!("plain")).unwrap());
        let first = waiting.plan([(&queue, &task_1, &id(1))]);
        assert_eq!(handed(&first), [true]);
        let second = waiting.plan([(&queue, &task_1, &id(2)), (&queue, &task_2, &id(3)), (&queue, &plain, &id(4))]);
        assert_eq!(handed(&second), [false, true, true], "task-1 is being handed over by the first statement");
        drop(first);
        drop(second);
        let third = waiting.plan([(&queue, &task_1, &id(5)), (&queue, &task_1, &id(6))]);
        assert_eq!(handed(&third), [true, false], "free again once the first is done; the next of the key waits");
    }
}
