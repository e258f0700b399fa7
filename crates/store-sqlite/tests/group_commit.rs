//! Behaviour specific to the SQLite backend: group commit and the durability
//! settings it reads back. (What every backend must do is in the shared
//! conformance suite.)

use std::sync::Arc;
use std::time::Duration;

use rota_model::{QueueName, SystemClock};
use rota_store::{Outgoing, QueueConfig, Queues, Receive};
use rota_store_sqlite::{Config, Durability, SqliteStore};

fn open(dir: &tempfile::TempDir, durability: Durability) -> Arc<SqliteStore> {
    let mut config = Config::new(dir.path().join("store.db"));
    config.durability = durability;
    Arc::new(SqliteStore::open(config, Arc::new(SystemClock)).expect("open"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sends_share_commits() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, Durability::Full);
    let queue = QueueName::new("jobs").unwrap();
    store.send(&queue, Outgoing::json(&0).unwrap()).await.unwrap();
    let before = store.commit_counts();
    send_from_lanes(&store, &queue, 32, 50).await;
    let after = store.commit_counts();
    let (jobs, commits) = (after.jobs - before.jobs, after.commits - before.commits);
    assert_eq!(jobs, 32 * 50, "every send is one job");
    assert!(commits < jobs, "32 concurrent senders must share commits: {commits} commits for {jobs} sends");
    let stats = store.stats().await.unwrap();
    assert_eq!(stats[0].ready, 32 * 50 + 1);
}

// One thread: see the comment on the sleep below.
#[tokio::test(flavor = "current_thread")]
async fn a_parked_receiver_is_served_in_the_commit_of_the_send() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, Durability::Full);
    let queue = QueueName::new("jobs").unwrap();
    // An existing queue: parking on it commits nothing (a receive on an
    // unknown one commits its creation, whenever the writer gets to it).
    store.create_queue(&queue, QueueConfig::default()).await.unwrap();
    let before = store.commit_counts();
    let receiver = {
        let (store, queue) = (store.clone(), queue.clone());
        tokio::spawn(async move { store.receive(&queue, Receive::up_to(10).waiting(Duration::from_secs(30))).await })
    };
    // The test runs on one thread: this await runs the receive up to its
    // park request, which the writer takes before the send's (one channel).
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.send(&queue, Outgoing::parse(r#"{"i":1}"#).unwrap()).await.unwrap();
    let deliveries = receiver.await.unwrap().unwrap();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].body.get(), r#"{"i":1}"#);
    let after = store.commit_counts();
    // The periodic sweep of expired ids commits on its own once a second,
    // and may fall in between.
    let work_commits = |c: rota_store_sqlite::CommitCounts| c.commits - c.sweeps;
    assert_eq!(
        work_commits(after) - work_commits(before),
        1,
        "the send and the receive it satisfied share one commit: {before:?} {after:?}"
    );
}

#[tokio::test]
async fn durability_settings_are_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let full = open(&dir, Durability::Full).pragmas().await.unwrap();
    assert_eq!((full.journal_mode.as_str(), full.synchronous.as_str(), full.flushed_before_reply), ("wal", "normal", true));
    let dir = tempfile::tempdir().unwrap();
    let normal = open(&dir, Durability::Normal).pragmas().await.unwrap();
    assert_eq!((normal.synchronous.as_str(), normal.flushed_before_reply), ("normal", false));
}

#[tokio::test]
async fn a_write_returns_only_after_a_flush_that_followed_its_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, Durability::Full);
    let queue = QueueName::new("jobs").unwrap();
    for n in 0..20 {
        let before = store.commit_counts();
        store.send(&queue, Outgoing::json(&n).unwrap()).await.unwrap();
        let after = store.commit_counts();
        assert!(after.commits > before.commits, "the send committed");
        assert!(after.flushes > before.flushes, "send {n} returned before any flush after its commit: {before:?} {after:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let normal = open(&dir, Durability::Normal);
    normal.send(&queue, Outgoing::json(&0).unwrap()).await.unwrap();
    assert_eq!(normal.commit_counts().flushes, 0, "Normal leaves the WAL to the checkpoints");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_share_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, Durability::Full);
    let queue = QueueName::new("jobs").unwrap();
    send_from_lanes(&store, &queue, 32, 50).await;
    let counts = store.commit_counts();
    assert!(counts.flushes >= 1 && counts.flushes <= counts.commits, "{counts:?}");
    assert!(counts.flushes < 32 * 50, "1,600 sends must share flushes: {counts:?}");
}

#[tokio::test]
async fn a_failed_flush_fails_the_write_and_every_later_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, Durability::Full);
    let queue = QueueName::new("jobs").unwrap();
    // The migrations at open wrote the WAL and nothing has flushed it yet:
    // without the file, the first flush cannot open it.
    let wal = dir.path().join("store.db-wal");
    std::fs::remove_file(&wal).expect("the WAL exists after open");
    let first = store.send(&queue, Outgoing::json(&1).unwrap()).await.unwrap_err().to_string();
    assert!(first.contains("store.db-wal") && first.contains("cannot flush"), "{first}");
    let later = store.send(&queue, Outgoing::json(&2).unwrap()).await.unwrap_err().to_string();
    assert!(later.contains("cannot flush"), "a store whose flush failed must stop writing: {later}");
}

#[tokio::test]
async fn a_missing_directory_is_a_clear_error() {
    let err = SqliteStore::open(Config::new("/nonexistent/dir/store.db"), Arc::new(SystemClock)).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("/nonexistent/dir/store.db"), "{text}");
    assert!(matches!(err, rota_store::Error::Unavailable(_)), "{err:?}");
}

#[tokio::test]
async fn bad_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path().join("x.db"));
    config.batch_ops_max = 0;
    let err = SqliteStore::open(config, Arc::new(SystemClock)).unwrap_err();
    assert!(err.to_string().contains("batch_ops_max"), "{err}");
}

/// Sends `per_lane` messages from each of `lanes` tasks at once, so that
/// their writes meet at the writer together.
async fn send_from_lanes(store: &Arc<SqliteStore>, queue: &QueueName, lanes: u32, per_lane: u32) {
    let lanes: Vec<_> = (0..lanes)
        .map(|lane| {
            let (store, queue) = (store.clone(), queue.clone());
            tokio::spawn(async move {
                for n in 0..per_lane {
                    store.send(&queue, Outgoing::json(&(lane * 1000 + n)).unwrap()).await.unwrap();
                }
            })
        })
        .collect();
    for lane in lanes {
        lane.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_to_one_queue_try_no_claim_for_receivers_waiting_on_others() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir, Durability::Normal);
    let idle: Vec<QueueName> = (0..50).map(|n| QueueName::new(format!("idle-{n}")).unwrap()).collect();
    // A first receive creates each queue.
    for queue in &idle {
        assert!(store.receive(queue, Receive::up_to(1)).await.unwrap().is_empty());
    }
    let waiting: Vec<_> = idle
        .iter()
        .map(|queue| {
            let (store, queue) = (store.clone(), queue.clone());
            tokio::spawn(async move { store.receive(&queue, Receive::up_to(1).waiting(Duration::from_secs(30))).await.unwrap() })
        })
        .collect();
    // Time for every receive to reach the writer and park there.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let parked = |store: &Arc<SqliteStore>| store.commit_counts().receives;
    let before = parked(&store);
    let busy = QueueName::new("busy").unwrap();
    for n in 0..20 {
        store.send(&busy, Outgoing::json(&n).unwrap()).await.unwrap();
    }
    let tried = parked(&store) - before;
    assert!(tried < 20, "20 sends to another queue tried {tried} claims for 50 idle receivers");

    // A send to a waiting receiver's queue still reaches it.
    store.send(&idle[7], Outgoing::json(&"for seven").unwrap()).await.unwrap();
    let mut waiting = waiting;
    let seventh = waiting.remove(7);
    let delivered = tokio::time::timeout(Duration::from_secs(10), seventh).await.expect("served").unwrap();
    assert_eq!(delivered.len(), 1);
    for other in waiting {
        other.abort();
    }
}
