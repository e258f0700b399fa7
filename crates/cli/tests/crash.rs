//! The acceptance tests: SIGKILL the binary while it sends and while
//! it holds leases, then check that nothing acknowledged was lost and that
//! the stranded leases come back when they expire.
//!
//! These run in real time by nature (a real process, a real file); they are
//! kept to a few seconds each.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant};

use common::{Rota, lines_of, next_line};
use serde_json::Value;

/// How many bodies the sender is fed; far more than it gets to send.
const BODIES: u32 = 20_000;
/// How many acknowledgements to read before the kill.
const ACKS_BEFORE_KILL: usize = 300;

/// Every message in the queue, received with a long lease, by id.
fn drain(rota: &Rota, queue: &str) -> BTreeMap<String, Value> {
    let mut all = BTreeMap::new();
    loop {
        let batch = rota.receive(queue, 1000);
        if batch.is_empty() {
            return all;
        }
        for message in batch {
            let id = message["id"].as_str().unwrap().to_owned();
            assert!(all.insert(id.clone(), message).is_none(), "message {id} was delivered twice");
        }
    }
}

#[test]
fn sigkill_while_sending_loses_nothing_acknowledged() {
    let rota = Rota::new();
    let mut sender = rota
        .command(&["queue", "send", "q", "--lines"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = sender.stdin.take().unwrap();
    let feeder = thread::spawn(move || {
        for i in 0..BODIES {
            // The write fails once the sender is dead: that is the point.
            if writeln!(stdin, "{{\"i\":{i}}}").is_err() {
                return;
            }
        }
    });
    let acks = lines_of(sender.stdout.take().unwrap());
    let mut acknowledged = BTreeSet::new();
    while acknowledged.len() < ACKS_BEFORE_KILL {
        acknowledged.insert(next_line(&acks, Duration::from_secs(30), "acknowledged ids"));
    }
    assert_eq!(unsafe { libc::kill(sender.id() as i32, libc::SIGKILL) }, 0);
    let status = sender.wait().unwrap();
    // Ids printed before the kill and still in the pipe were acknowledged too.
    acknowledged.extend(acks.iter());
    feeder.join().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "the sender finished all {BODIES} sends before the kill: {status:?}");

    let stored = drain(&rota, "q");
    let lost: Vec<&String> = acknowledged.iter().filter(|id| !stored.contains_key(*id)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged messages were lost, e.g. {:?}",
        lost.len(),
        acknowledged.len(),
        &lost[..lost.len().min(5)]
    );
    // Each line was sent at most once, whole.
    let mut lines_sent = BTreeSet::new();
    for message in stored.values() {
        let i = message["body"]["i"].as_u64().unwrap_or_else(|| panic!("a body was mangled: {message}"));
        assert!(i < u64::from(BODIES));
        assert!(lines_sent.insert(i), "line {i} was sent twice");
    }
    eprintln!("acknowledged {} ids before the kill; {} messages are stored", acknowledged.len(), stored.len());
}

#[test]
fn sigkill_while_holding_leases_returns_them_after_the_lease() {
    let rota = Rota::new();
    let bodies: Vec<String> = (0..20).map(|i| format!("{{\"i\":{i}}}")).collect();
    let sent: BTreeSet<String> = rota.send_all("q", &bodies).into_iter().collect();
    assert_eq!(sent.len(), 20);

    let mut consumer = rota
        .command(&["queue", "consume", "q", "--max-concurrent", "5", "--lease", "2s", "--exec", "sleep 30"])
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let group = consumer.id() as i32;
    let lines = lines_of(consumer.stdout.take().unwrap());
    let mut held = BTreeSet::new();
    for _ in 0..5 {
        let line = next_line(&lines, Duration::from_secs(10), "five leased messages");
        let message: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(message["delivery_count"], 1);
        held.insert(message["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(unsafe { libc::kill(group, libc::SIGKILL) }, 0);
    let killed_at = Instant::now();
    // The `sleep`s are in the consumer's process group: leave no orphan behind.
    unsafe { libc::killpg(group, libc::SIGKILL) };
    assert_eq!(consumer.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert!(lines.recv_timeout(Duration::from_millis(100)).is_err(), "the consumer leased more than --max-concurrent");

    // Right away: the five are still leased by the dead consumer.
    let stats = rota.stats("q");
    assert!(killed_at.elapsed() < Duration::from_secs(1), "too slow to check before the lease ran out");
    assert_eq!((stats["leased"].as_u64(), stats["ready"].as_u64()), (Some(5), Some(15)), "{stats}");
    let others = drain(&rota, "q");
    assert_eq!(others.len(), 15);
    assert!(others.keys().all(|id| !held.contains(id)), "a leased message was delivered again before its lease ran out");
    assert!(others.values().all(|message| message["delivery_count"] == 1));

    // After the 2 s lease they come back, delivered a second time.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut back = BTreeMap::new();
    while back.len() < 5 {
        assert!(Instant::now() < deadline, "only {} of the 5 leased messages came back after 10 s", back.len());
        let batch = rota.json(&["queue", "receive", "q", "--max", "10", "--wait", "1s", "--lease", "10m", "--json"]);
        for message in batch.as_array().unwrap() {
            back.insert(message["id"].as_str().unwrap().to_owned(), message.clone());
        }
    }
    assert!(killed_at.elapsed() >= Duration::from_secs(1), "the leases came back before they expired");
    assert_eq!(back.keys().cloned().collect::<BTreeSet<_>>(), held);
    assert!(back.values().all(|message| message["delivery_count"] == 2), "{back:?}");

    let accounted: BTreeSet<String> = others.into_keys().chain(back.into_keys()).collect();
    assert_eq!(accounted, sent, "every message is accounted for");
}
