//! The operator commands, run as the real binary against a temporary SQLite
//! store: what they print, and how they fail.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{Rota, assert_one_error_line, lines_of, next_line};
use serde_json::{Value, json};

fn ids(messages: &[Value]) -> BTreeSet<String> {
    messages.iter().map(|message| message["id"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn send_receive_complete_round_trip() {
    let rota = Rota::new();
    let first = rota.ok(&["queue", "send", "orders", "--body", r#"{"order": 1, "items": ["a", "b"]}"#]);
    let second = rota.ok(&["queue", "send", "orders", "--body", r#""plain string""#, "--key", "customer-7"]);
    let sent: BTreeSet<String> = [first.trim().to_owned(), second.trim().to_owned()].into();

    let received = rota.receive("orders", 10);
    assert_eq!(ids(&received), sent);
    let order = received.iter().find(|message| message["id"] == first.trim()).unwrap();
    assert_eq!(order["body"], json!({"order": 1, "items": ["a", "b"]}), "the body is JSON, not a string");
    assert_eq!(order["delivery_count"], 1);
    assert_eq!(order["queue"], "orders");
    assert!(order["enqueued_at"].as_str().unwrap().ends_with('Z'));
    assert!(order["lease_until"].as_str().unwrap() > order["enqueued_at"].as_str().unwrap());
    assert_eq!(order["ordering_key"], Value::Null);
    let keyed = received.iter().find(|message| message["id"] == second.trim()).unwrap();
    assert_eq!(keyed["body"], json!("plain string"));
    assert_eq!(keyed["ordering_key"], "customer-7");

    let stats = rota.stats("orders");
    assert_eq!((stats["ready"].as_u64(), stats["leased"].as_u64()), (Some(0), Some(2)));
    for message in &received {
        rota.ok(&["queue", "complete", "orders", message["lease_token"].as_str().unwrap()]);
    }
    let stats = rota.stats("orders");
    assert_eq!((stats["ready"].as_u64(), stats["leased"].as_u64()), (Some(0), Some(0)));
    assert_eq!(rota.receive("orders", 10), Vec::<Value>::new());

    // A completed message's token is gone.
    let token = received[0]["lease_token"].as_str().unwrap();
    let (code, stderr) = rota.fails(&["queue", "complete", "orders", token]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["lease lost", token, "unknown, expired, or already completed"]);
}

#[test]
fn receive_without_json_prints_a_table() {
    let rota = Rota::new();
    let id = rota.ok(&["queue", "send", "q", "--body", r#"{"n": 1}"#]);
    let table = rota.ok(&["queue", "receive", "q"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    assert!(lines[0].starts_with("ID") && lines[0].contains("LEASE TOKEN"), "{table}");
    assert!(lines[1].starts_with(id.trim()) && lines[1].ends_with(r#"{"n": 1}"#), "{table}");
}

#[test]
fn duplicate_ids_are_sent_once_and_noted() {
    let rota = Rota::new();
    assert_eq!(rota.ok(&["queue", "send", "q", "--body", "1", "--id", "order-17"]).trim(), "order-17");
    let output = rota.command(&["queue", "send", "q", "--body", "2", "--id", "order-17"]).output().unwrap();
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "order-17");
    assert!(String::from_utf8_lossy(&output.stderr).contains("(duplicate)"));
    assert_eq!(rota.stats("q")["ready"], 1);
}

#[test]
fn stats_json_counts_every_state() {
    let rota = Rota::new();
    rota.send_all("q", &["1".into(), "2".into(), "3".into(), "4".into()]);
    rota.ok(&["queue", "send", "q", "--body", "5", "--delay", "1h"]);
    let leased = rota.receive("q", 2);
    rota.ok(&["queue", "dead-letter", "q", leased[0]["lease_token"].as_str().unwrap(), "--reason", "poison"]);
    rota.ok(&["queue", "send", "other", "--body", "{}"]);

    let all = rota.json(&["queue", "stats", "--json"]);
    let names: Vec<&str> = all.as_array().unwrap().iter().map(|stats| stats["queue"].as_str().unwrap()).collect();
    assert_eq!(names, ["other", "q"]);
    let stats = rota.stats("q");
    for field in ["queue", "ready", "leased", "delayed", "dead_lettered", "paused"] {
        assert!(stats.get(field).is_some(), "stats lack {field}: {stats}");
    }
    assert_eq!(stats["ready"], 2);
    assert_eq!(stats["leased"], 1);
    assert_eq!(stats["delayed"], 1);
    assert_eq!(stats["dead_lettered"], 1);
    assert_eq!(stats["paused"], false);

    rota.ok(&["queue", "pause", "q"]);
    assert_eq!(rota.stats("q")["paused"], true);
    assert_eq!(rota.receive("q", 10), Vec::<Value>::new(), "a paused queue delivers nothing");
    rota.ok(&["queue", "send", "q", "--body", "6"]);
    rota.ok(&["queue", "resume", "q"]);
    assert_eq!(rota.receive("q", 10).len(), 3);

    let table = rota.ok(&["queue", "stats"]);
    assert!(table.starts_with("QUEUE") && table.contains("DEAD-LETTERED"), "{table}");
}

#[test]
fn abandon_renew_and_create() {
    let rota = Rota::new();
    rota.ok(&["queue", "create", "q", "--lease", "1m", "--max-deliveries", "3", "--dedupe-window", "1m"]);
    rota.ok(&["queue", "send", "q", "--body", r#"{"n": 1}"#]);
    let received = rota.receive("q", 1);
    let token = received[0]["lease_token"].as_str().unwrap();

    let expiry = rota.ok(&["queue", "renew", "q", token, "--lease", "2h"]);
    let expiry = humantime::parse_rfc3339(expiry.trim()).expect("renew prints an RFC 3339 time");
    let left = expiry.duration_since(std::time::SystemTime::now()).unwrap();
    assert!(left > Duration::from_secs(7000) && left <= Duration::from_secs(7200), "{left:?}");

    rota.ok(&["queue", "abandon", "q", token, "--reason", "not now"]);
    let again = rota.receive("q", 1);
    assert_eq!(again[0]["delivery_count"], 2);
    let token = again[0]["lease_token"].as_str().unwrap();
    rota.ok(&["queue", "abandon", "q", token, "--delay", "1h"]);
    assert_eq!(rota.stats("q")["delayed"], 1);
    assert_one_error_line(&rota.fails(&["queue", "renew", "q", token]).1, &["lease lost"]);

    let (code, stderr) = rota.fails(&["queue", "create", "q", "--max-deliveries", "0"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["--max-deliveries must be between 1"]);
}

#[test]
fn dead_letters_are_listed_redriven_and_purged() {
    let rota = Rota::new();
    rota.ok(&["queue", "create", "q", "--max-deliveries", "1"]);
    let sent = rota.send_all("q", &[r#"{"n":1}"#.into(), r#"{"n":2}"#.into(), r#"{"n":3}"#.into()]);
    let received = rota.receive("q", 3);
    let by_body = |n: i64| received.iter().find(|message| message["body"]["n"] == n).unwrap();
    rota.ok(&["queue", "dead-letter", "q", by_body(1)["lease_token"].as_str().unwrap(), "--reason", "poison: bad total"]);
    // Its one delivery is used up, so abandoning dead-letters it with the reason.
    rota.ok(&["queue", "abandon", "q", by_body(2)["lease_token"].as_str().unwrap(), "--reason", "upstream down"]);

    let letters = rota.json(&["dlq", "list", "q", "--json"]);
    let letters = letters.as_array().unwrap();
    assert_eq!(letters.len(), 2, "{letters:?}");
    let reasons: BTreeSet<&str> = letters.iter().map(|letter| letter["reason"].as_str().unwrap()).collect();
    assert!(reasons.contains("poison: bad total"), "{reasons:?}");
    assert!(reasons.iter().any(|reason| reason.contains("upstream down")), "{reasons:?}");
    assert!(letters.iter().all(|letter| letter["body"].is_object() && sent.contains(&letter["id"].as_str().unwrap().to_owned())));
    let table = rota.ok(&["dlq", "list", "q"]);
    assert!(table.contains("REASON") && table.contains("poison: bad total"), "{table}");

    let first = by_body(1)["id"].as_str().unwrap();
    assert_eq!(rota.ok(&["dlq", "redrive", "q", "--id", first]).trim(), "1");
    let stats = rota.stats("q");
    assert_eq!((stats["ready"].as_u64(), stats["dead_lettered"].as_u64()), (Some(1), Some(1)));
    let redriven = rota.receive("q", 10);
    assert_eq!(redriven.len(), 1);
    assert_eq!(redriven[0]["id"], first);
    assert_eq!(redriven[0]["delivery_count"], 1, "a redriven message gets a fresh delivery count");

    let (code, stderr) = rota.fails(&["dlq", "redrive", "q", "--id", "no-such-id"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["not found"]);
    assert_eq!(rota.ok(&["dlq", "purge", "q"]).trim(), "1");
    assert_eq!(rota.ok(&["dlq", "purge", "q"]).trim(), "0");
    assert_eq!(rota.json(&["dlq", "list", "q", "--json"]), json!([]));
    assert_eq!(rota.ok(&["dlq", "redrive", "q", "--all"]).trim(), "0");

    // Exactly one of --id and --all.
    assert_eq!(rota.fails(&["dlq", "redrive", "q"]).0, 2);
    assert_eq!(rota.fails(&["dlq", "redrive", "q", "--all", "--id", first]).0, 2);
}

#[test]
fn send_lines_stops_at_a_bad_line() {
    let rota = Rota::new();
    let output = rota.with_stdin(&["queue", "send", "q", "--lines"], "{\"a\":1}\n\n[2]\n{\"c\": tru}\n{\"d\":4}\n");
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 2, "the two lines before the bad one were sent: {stdout}");
    assert_one_error_line(&String::from_utf8(output.stderr).unwrap(), &["stdin line 4", "column 10", "nothing after it was sent"]);
    let bodies: BTreeSet<String> = rota.receive("q", 10).iter().map(|message| message["body"].to_string()).collect();
    assert_eq!(bodies, [r#"{"a":1}"#.to_owned(), "[2]".to_owned()].into());
}

#[test]
fn errors_are_one_line_naming_the_problem() {
    let rota = Rota::new();
    let (code, stderr) = rota.fails(&["queue", "send", "q", "--body", r#"{"a": }"#]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["--body is not valid JSON", "line 1 column 7"]);

    let (code, stderr) = rota.fails(&["queue", "complete", "q", "12.3"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["lease lost", "12.3", "unknown, expired, or already completed"]);

    let (code, stderr) = rota.fails(&["queue", "receive", "q", "--lease", "0s"]);
    assert_eq!(code, 1);
    assert_one_error_line(&stderr, &["--lease must be between 1ms and 24h"]);

    let missing = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/no/such/dir/q.db", missing.path().display());
    let output = rota.command(&["queue", "stats"]).args(["--store", &url]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert_one_error_line(&String::from_utf8_lossy(&output.stderr), &["cannot open store", "does not exist"]);

    // An operator command on a store file that does not exist says so, and
    // creates nothing there (a mistyped path must not look like an empty store).
    let absent = missing.path().join("absent.db");
    let url = format!("sqlite://{}", absent.display());
    for args in [vec!["queue", "stats"], vec!["tasks"], vec!["dlq", "list", "q"]] {
        let output = rota.command(&args).args(["--store", &url]).output().unwrap();
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert_one_error_line(&String::from_utf8_lossy(&output.stderr), &["cannot open store", "absent.db does not exist", "rota migrate"]);
        assert!(!absent.exists(), "{args:?} created {}", absent.display());
    }

    // Port 1 on loopback refuses at once; the password is never shown.
    let output = rota.command(&["queue", "stats"]).args(["--store", "postgres://rota:secret@127.0.0.1:1/rota"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_one_error_line(&stderr, &["cannot open store postgres://rota:***@127.0.0.1:1/rota", "cannot connect"]);
    assert!(!stderr.contains("secret"), "{stderr}");

    // Bad security settings stop a server before it starts, naming the flag.
    for (args, needles) in [
        (vec!["serve", "--listen", "none", "--egress-allow", "api.example.com,10.0.0.0/33"], vec!["--egress-allow", "\"10.0.0.0/33\""]),
        (vec!["agent", "--exec-dir", "/no/such/rota/dir"], vec!["--exec-dir /no/such/rota/dir: no such directory"]),
        (vec!["agent", "--exec-env", "A=B"], vec!["--exec-env", "\"A=B\" is not a variable name"]),
        (
            vec!["serve", "--listen", "127.0.0.1:0", "--input-bytes-max", "300000"],
            vec!["--input-bytes-max must be between 1 and 262144, got 300000"],
        ),
        (vec!["api", "--listen", "127.0.0.1:0", "--input-bytes-max", "0"], vec!["--input-bytes-max must be between 1 and 262144, got 0"]),
        (vec!["serve", "--listen", "none", "--breaker-failures", "0"], vec!["--breaker-failures must be between 1 and 1000, got 0"]),
        (vec!["agent", "--breaker-open-for", "0s"], vec!["--breaker-open-for must be between 1ms and 1day, got 0s"]),
    ] {
        let (code, stderr) = rota.fails(&args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert_one_error_line(&stderr, &needles);
    }

    // Usage errors are clap's: exit code 2, the first line names the argument.
    for (args, needles) in [
        (vec!["queue", "send", "has space", "--body", "1"], vec!["<QUEUE>", "invalid queue name"]),
        (vec!["queue", "send", "q", "--body", "1", "--delay", "5 parsecs"], vec!["--delay"]),
        (vec!["queue", "receive", "q", "--wait", "soon"], vec!["--wait"]),
        (vec!["queue", "complete", "q", "not-a-token"], vec!["<TOKEN>", "invalid lease token"]),
        (vec!["queue", "receive", "q", "--max", "0"], vec!["--max"]),
    ] {
        let (code, stderr) = rota.fails(&args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        let first = stderr.lines().next().unwrap();
        assert!(first.starts_with("error: "), "{args:?}: {stderr}");
        for needle in needles {
            assert!(first.contains(needle), "{args:?}: {stderr}");
        }
    }
}

#[test]
fn consume_execs_completes_abandons_and_stops_on_sigterm() {
    let rota = Rota::new();
    rota.ok(&["queue", "create", "jobs", "--max-deliveries", "2"]);
    rota.send_all("jobs", &[r#"{"ok":true}"#.into(), r#"{"ok":false}"#.into()]);
    let script = r#"grep -q true || { echo "checking $ROTA_MESSAGE_ID" >&2; echo "body says no" >&2; exit 3; }"#;
    let mut consumer = rota
        .command(&["queue", "consume", "jobs", "--max-concurrent", "2", "--lease", "5s", "--exec", script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lines = lines_of(consumer.stdout.take().unwrap());
    // Three deliveries: the good message once, the bad one twice, then it is dead-lettered.
    let mut printed = Vec::new();
    for _ in 0..3 {
        let line = next_line(&lines, Duration::from_secs(10), "a leased message");
        printed.push(serde_json::from_str::<Value>(&line).expect("one JSON object per line"));
    }
    assert_eq!(printed.iter().filter(|message| message["body"]["ok"] == false).count(), 2, "{printed:?}");

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = rota.stats("jobs");
        if stats["dead_lettered"] == 1 && stats["ready"] == 0 && stats["leased"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the consumer did not settle both messages: {stats}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let letters = rota.json(&["dlq", "list", "jobs", "--json"]);
    assert_eq!(letters[0]["body"], json!({"ok": false}));
    // The store may add the delivery count; the command's outcome is kept as the last failure.
    assert!(letters[0]["reason"].as_str().unwrap().ends_with("exit code 3: body says no"), "{letters}");

    // SIGTERM stops it cleanly.
    assert_eq!(unsafe { libc::kill(consumer.id() as i32, libc::SIGTERM) }, 0);
    let status = consumer.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// `queue send --reply-to` + `queue consume --exec`: the command's output
/// comes back on the reply queue with the request's correlation id (its
/// message id without one), as JSON when it parses; a failed command sends
/// nothing and a message without a reply address gets no answer. The reply
/// address and correlation id show in `receive` and survive a dead letter.
#[test]
fn consume_exec_answers_to_the_reply_address() {
    let rota = Rota::new();
    rota.ok(&["queue", "create", "requests", "--max-deliveries", "1"]);
    rota.ok(&["queue", "send", "requests", "--body", r#"{"n": 2}"#, "--reply-to", "answers", "--correlation-id", "order-17"]);
    let second = rota.ok(&["queue", "send", "requests", "--body", r#"{"n": 3, "text": true}"#, "--reply-to", "answers"]);
    rota.ok(&["queue", "send", "requests", "--body", r#"{"n": 4, "fail": true}"#, "--reply-to", "answers", "--correlation-id", "bad"]);
    rota.ok(&["queue", "send", "requests", "--body", r#"{"n": 5}"#]);
    let (code, stderr) = rota.fails(&["queue", "send", "requests", "--body", "1", "--correlation-id", "x"]);
    assert_eq!(code, 2, "--correlation-id needs --reply-to: {stderr}");
    assert!(stderr.contains("--reply-to"), "{stderr}");
    let (code, stderr) = rota.fails(&["queue", "send", "requests", "--body", "1", "--reply-to", "a b"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--reply-to"), "{stderr}");

    // Doubles n; prints text when asked, fails when asked.
    let script = r#"body=$(cat); case "$body" in *fail*) exit 1;; *text*) echo "plain words";; *) echo "{\"doubled\": $(echo "$body" | sed 's/[^0-9]//g')0}";; esac"#;
    let mut consumer = rota
        .command(&["queue", "consume", "requests", "--max-concurrent", "1", "--exec", script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lines = lines_of(consumer.stdout.take().unwrap());
    let mut printed = Vec::new();
    for _ in 0..4 {
        printed.push(serde_json::from_str::<Value>(&next_line(&lines, Duration::from_secs(10), "a leased message")).unwrap());
    }
    assert_eq!((&printed[0]["reply_to"], &printed[0]["correlation_id"]), (&json!("answers"), &json!("order-17")), "{printed:?}");
    assert_eq!((&printed[3]["reply_to"], &printed[3]["correlation_id"]), (&Value::Null, &Value::Null));
    let deadline = Instant::now() + Duration::from_secs(10);
    while rota.stats("requests")["ready"] != 0 || rota.stats("requests")["leased"] != 0 {
        assert!(Instant::now() < deadline, "the consumer did not settle every message: {}", rota.stats("requests"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(unsafe { libc::kill(consumer.id() as i32, libc::SIGTERM) }, 0);
    assert!(consumer.wait().unwrap().success());

    let answers = rota.json(&["queue", "receive", "answers", "--max", "10", "--json"]);
    let answers: Vec<(Value, Value)> =
        answers.as_array().unwrap().iter().map(|a| (a["correlation_id"].clone(), a["body"].clone())).collect();
    assert_eq!(answers, [(json!("order-17"), json!({ "doubled": 20 })), (json!(second.trim()), json!("plain words"))]);
    let letters = rota.json(&["dlq", "list", "requests", "--json"]);
    assert_eq!((&letters[0]["reply_to"], &letters[0]["correlation_id"]), (&json!("answers"), &json!("bad")), "{letters}");
}

#[test]
fn consume_without_exec_prints_and_completes() {
    let rota = Rota::new();
    rota.send_all("q", &["1".into(), "2".into(), "3".into()]);
    let mut consumer = rota.command(&["queue", "consume", "q", "--print"]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let lines = lines_of(consumer.stdout.take().unwrap());
    let mut bodies: Vec<i64> = (0..3)
        .map(|_| serde_json::from_str::<Value>(&next_line(&lines, Duration::from_secs(10), "a message")).unwrap()["body"].as_i64().unwrap())
        .collect();
    bodies.sort();
    assert_eq!(bodies, [1, 2, 3]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while rota.stats("q")["leased"] != 0 {
        assert!(Instant::now() < deadline, "messages were not completed");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(rota.stats("q")["ready"], 0);
    assert_eq!(unsafe { libc::kill(consumer.id() as i32, libc::SIGINT) }, 0);
    assert!(consumer.wait().unwrap().success());
}
