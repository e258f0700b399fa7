//! `long_poll::receive_unless`: what a long poll leases after its caller
//! stopped waiting (a server closing, a client hanging up) is given back
//! at once. Under a manual clock that never moves, so leases never run out
//! by themselves: a message can only come back by being given back.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rota_engine::long_poll;
use rota_model::{ManualClock, QueueName};
use rota_store::{Outgoing, QueueConfig, Receive, SharedStore};
use serde_json::json;

use common::Backend;

/// The long poll that is left waiting.
const LONG_POLL: Duration = Duration::from_secs(60);
/// How long the test waits for a message given back.
const WAIT_MAX: Duration = Duration::from_secs(10);
/// How long the abandoned poll has to lease a message before the test's
/// own receive competes for it.
const HEAD_START: Duration = Duration::from_millis(200);

async fn queue_on(store: &SharedStore) -> QueueName {
    let queue = QueueName::new("agent.remote").unwrap();
    store.create_queue(&queue, QueueConfig::default()).await.unwrap();
    queue
}

/// Sends a message while a poll nobody waits for is still running, and
/// receives it: possible only if that poll gave it back. The poll gets a
/// head start, so that it (not this receive) leases the message first;
/// should this receive win anyway, it gets the message at its first
/// delivery and the test passes without having shown anything.
async fn send_and_receive_again(store: &SharedStore, queue: &QueueName) {
    store.send(queue, Outgoing::json(&json!({ "n": 1 })).unwrap()).await.unwrap();
    tokio::time::sleep(HEAD_START).await;
    let again = store.receive(queue, Receive::up_to(10).waiting(WAIT_MAX)).await.unwrap();
    assert_eq!(again.len(), 1, "the message was not given back within {WAIT_MAX:?}");
}

async fn a_message_arriving_for_a_caller_who_left_is_given_back(backend: Backend) {
    let Some(db) = common::open(backend, Arc::new(ManualClock::default())).await else { return };
    let queue = queue_on(&db.store).await;
    // The caller hangs up while the poll waits on an empty queue...
    let poll = long_poll::receive_unless(&db.store, &queue, Receive::up_to(10).waiting(LONG_POLL), std::future::pending());
    assert!(tokio::time::timeout(Duration::from_millis(50), poll).await.is_err(), "an empty queue answered");
    // ...and the message that the abandoned poll then leases comes back.
    send_and_receive_again(&db.store, &queue).await;
}

async fn a_stop_answers_at_once_and_gives_back_what_follows(backend: Backend) {
    let Some(db) = common::open(backend, Arc::new(ManualClock::default())).await else { return };
    let queue = queue_on(&db.store).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let poll = {
        let (store, queue) = (db.store.clone(), queue.clone());
        tokio::spawn(async move {
            long_poll::receive_unless(&store, &queue, Receive::up_to(10).waiting(LONG_POLL), async {
                let _ = stopped.await;
            })
            .await
        })
    };
    stop.send(()).unwrap();
    let answered = tokio::time::timeout(WAIT_MAX, poll).await.expect("the stop did not end the poll").unwrap();
    assert!(answered.unwrap().is_none(), "a stopped poll answers nothing");
    send_and_receive_again(&db.store, &queue).await;
}

async fn a_caller_who_waits_gets_the_message(backend: Backend) {
    let Some(db) = common::open(backend, Arc::new(ManualClock::default())).await else { return };
    let queue = queue_on(&db.store).await;
    db.store.send(&queue, Outgoing::json(&json!({ "n": 1 })).unwrap()).await.unwrap();
    let received = long_poll::receive_unless(&db.store, &queue, Receive::up_to(10).waiting(LONG_POLL), std::future::pending())
        .await
        .unwrap()
        .expect("not stopped");
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].delivery_count, 1);
    let left = db.store.receive(&queue, Receive::up_to(10)).await.unwrap();
    assert!(left.is_empty(), "the message it answered stays leased to it");
}

on_each_backend!(
    a_message_arriving_for_a_caller_who_left_is_given_back,
    a_stop_answers_at_once_and_gives_back_what_follows,
    a_caller_who_waits_gets_the_message,
);
