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
//! Commits of decisions (`Tasks::commit`) do not hand over: measured on
//! workload W, it saved half a millisecond per step at one workflow in
//! flight and cost throughput at fifty, because the consumers then take
//! messages one at a time instead of in batches, and a receiver taken by a
//! commit waits for that commit's whole group.
//!
//! [`Queues::send`]: rota_store::Queues::send
//!
//! Only messages a receive could take at once are handed over: no delay, no
//! ordering key (a keyed message must wait for the head of its key), and
//! the queue not paused (checked in the statement). A receiver takes at most
//! its `max`, and one send may feed several receivers. The lease is the one
//! a receive would have taken: delivery count 1, the receiver's lease length
//! or the queue's, and a random epoch (see `queue_sql::claim`).
//!
//! If the statement fails, the receivers get nothing and wait on; if a
//! receiver went away meanwhile, its messages are given back at once (lease
//! cleared, delivery not counted), as a receive does for a receiver that
//! went away.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

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
    deliver: oneshot::Sender<Vec<Delivery>>,
}

/// The receivers waiting in this process, by queue.
#[derive(Default)]
pub(crate) struct Waiting {
    next_id: AtomicU64,
    by_queue: Mutex<HashMap<QueueName, Vec<Parked>>>,
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
        let parked = Parked { id, room: request.max, lease_ms: request.lease.map(millis), owner: request.consumer.clone(), deliver };
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
    /// `sends`.
    pub(crate) fn plan<'a>(&self, sends: impl IntoIterator<Item = (&'a QueueName, &'a Outgoing, &'a MessageId)>) -> Plan {
        let mut plan = Plan::default();
        let mut by_queue = None;
        for (queue, message, id) in sends {
            let eligible = message.delay.is_zero() && message.ordering_key.is_none();
            let lease = if eligible {
                let by_queue = by_queue.get_or_insert_with(|| self.lock());
                take_room(by_queue, &mut plan.takers, queue, message, id)
            } else {
                None
            };
            plan.leases.push(lease);
        }
        plan
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

/// Which messages of one statement go to which waiting receivers.
#[derive(Default)]
pub(crate) struct Plan {
    /// One entry per message sent, in order: its lease, if handed over.
    pub(crate) leases: Vec<Option<Lease>>,
    takers: Vec<Taker>,
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

    /// After the statement committed: gives each receiver the messages that
    /// were inserted leased to it (`leased`). Those whose receiver went away
    /// are given back.
    pub(crate) fn deliver(self, leased: &[Leased], queue_ids: &HashMap<QueueName, i64>, now: Timestamp, give_back: &GiveBack) {
        let mut orphans = Vec::new();
        for taker in self.takers {
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
        let waiting = Waiting::default();
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
}
