//! A long-poll receive on behalf of a caller who may stop waiting: a
//! server that starts to shut down, or an HTTP client that hangs up.
//!
//! The store's receive cannot be cut short once it has leased messages
//! (the lease is written when the messages are found), so it runs as a
//! spawned future. If its caller stops waiting first, whatever it leases is
//! abandoned at once rather than left leased to nobody until the lease runs
//! out.

use std::future::Future;
use std::time::Duration;

use rota_model::QueueName;
use rota_store::{Delivery, Receive, SharedStore};
use tokio::task::JoinHandle;

/// Receives from `queue` unless `stop` resolves first; then answers
/// `Ok(None)` at once and gives back whatever the receive leases. Dropping
/// the returned future before it finishes gives the messages back too.
pub async fn receive_unless(
    store: &SharedStore,
    queue: &QueueName,
    receive: Receive,
    stop: impl Future<Output = ()>,
) -> rota_store::Result<Option<Vec<Delivery>>> {
    let receiving = {
        let (store, queue) = (store.clone(), queue.clone());
        tokio::spawn(async move { store.receive(&queue, receive).await })
    };
    let mut pending = GiveBackUnlessTaken { store: store.clone(), queue: queue.clone(), receiving: Some(receiving) };
    tokio::select! {
        joined = pending.receiving.as_mut().expect("set above") => {
            pending.receiving = None;
            match joined {
                Ok(received) => received.map(Some),
                Err(err) => Err(rota_store::Error::Backend(format!("the receive from {queue} panicked: {err}"))),
            }
        }
        () = stop => Ok(None),
    }
}

/// A receive in flight whose messages nobody will take: on drop, they are
/// abandoned as soon as the receive returns them.
struct GiveBackUnlessTaken {
    store: SharedStore,
    queue: QueueName,
    receiving: Option<JoinHandle<rota_store::Result<Vec<Delivery>>>>,
}

impl Drop for GiveBackUnlessTaken {
    fn drop(&mut self) {
        let Some(receiving) = self.receiving.take() else { return };
        let (store, queue) = (self.store.clone(), self.queue.clone());
        let give_back = async move {
            let Ok(Ok(deliveries)) = receiving.await else { return };
            for delivery in deliveries {
                if let Err(err) = store.abandon(&queue, delivery.lease_token, Duration::ZERO, None).await {
                    tracing::warn!("could not give back message {} of {queue} that nobody waited for: {err}", delivery.id);
                }
            }
        };
        // Dropped outside a runtime, the receive is gone with it and its
        // leases simply run out.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(give_back);
        }
    }
}
