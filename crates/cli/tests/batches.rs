//! Bulk actions as the operator meets them: `rota resubmit` with filters
//! resubmits every task in Error that they select, as one batch; SIGKILLed
//! half-way, the batch is finished by the Supervisor leader of a running
//! `rota serve`, from where it got, and no task is resubmitted twice.
//! `rota dlq redrive` with filters does the same with dead letters, and no
//! message is sent back twice.
//!
//! `ROTA_BULK_TASKS` sets how many tasks (300 by default, to keep CI
//! short; the figure is 1000).

mod common;

use std::io::BufRead;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Rota, Serve};
use rota_engine::{Client, Submission, Workflows};
use rota_model::{MessageId, QueueName};
use rota_model::{SystemClock, TaskId, WorkflowName};
use rota_store::{EventKind, Outgoing, Queues, Receive};
use rota_store_sqlite::{Config, SqliteStore};
use serde_json::{Value, json};

/// How long the tasks may take to reach a state.
const WAIT_MAX: Duration = Duration::from_secs(240);

fn tasks_wanted() -> usize {
    std::env::var("ROTA_BULK_TASKS").ok().and_then(|n| n.parse().ok()).unwrap_or(300)
}

fn count_in(rota: &Rota, state: &str) -> u64 {
    rota.json(&["tasks", "--count", "--workflow", "gate", "--state", state, "--json"])["total"].as_u64().unwrap()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < WAIT_MAX, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_thousand_tasks_in_error_are_resubmitted_by_one_command_that_is_killed_half_way() {
    let rota = Rota::new();
    let db = rota.dir().join("q.db");
    let workflows = rota.dir().join("workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    let flag = rota.dir().join("down");
    std::fs::write(&flag, "the gate is down").unwrap();
    std::fs::write(
        workflows.join("gate.yaml"),
        format!(
            "name: gate\nversion: 1\nsteps:\n  - name: pass\n    agent: exec\n    with: {{ command: [\"sh\", \"-c\", \"test ! -e '{}'\"] }}\n",
            flag.display()
        ),
    )
    .unwrap();
    let serve = Serve::start(rota.url(), &["--workflows", workflows.to_str().unwrap(), "--instance-id", "bulk-serve", "--listen", "none"]);

    // The tasks, submitted here through the engine's client (a thousand
    // CLI processes would take long); each fails at its gate.
    let wanted = tasks_wanted();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let clock = Arc::new(SystemClock);
        let store: rota_store::SharedStore = Arc::new(SqliteStore::open(Config::new(&db), clock.clone()).unwrap());
        let client = Client::new(store.clone(), clock, Workflows::new(store), None);
        for n in 0..wanted {
            let submission = Submission::new(WorkflowName::new("gate").unwrap(), json!({ "n": n }))
                .with_id(TaskId::new(format!("gate-{n:04}")).unwrap());
            client.submit(submission).await.unwrap();
        }
    });
    wait_until("every task is in Error", || count_in(&rota, "error") == wanted as u64);

    // The gate opens; one command resubmits them all, and is killed after
    // its first page.
    std::fs::remove_file(&flag).unwrap();
    let dry = rota.ok(&["resubmit", "--workflow", "gate", "--dry-run"]);
    assert!(dry.starts_with(&format!("would resubmit {wanted} task(s): gate-{:04}, ", wanted - 1)), "{dry}");
    let mut bulk = rota
        .command(&["resubmit", "--workflow", "gate", "--batch-lease", "2s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(bulk.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let batch_id = loop {
        let line = lines.next().expect("the command reports its progress").unwrap();
        seen.push(line.clone());
        // `batch ID: N of M handled (…)`, after a page.
        if let Some(rest) = line.strip_prefix("batch ")
            && let Some((id, progress)) = rest.split_once(": ")
            && let Some((handled, _)) = progress.split_once(" of ")
            && handled.parse::<usize>().is_ok_and(|n| n > 0)
        {
            break id.to_owned();
        }
    };
    bulk.kill().unwrap();
    let status = bulk.wait().unwrap();
    assert!(!status.success(), "killed before it finished: {seen:?}");

    // The Supervisor leader takes it over once its lease ran out.
    let mut batch = Value::Null;
    wait_until("the batch is done", || {
        batch = rota.json(&["batches", "show", &batch_id, "--json"]);
        batch["state"] == "done"
    });
    assert_eq!(batch["total"], wanted as u64, "{batch:#}");
    assert_eq!(batch["failed"], 0, "{batch:#}");
    assert_eq!(batch["done"].as_u64().unwrap() + batch["skipped"].as_u64().unwrap(), wanted as u64, "{batch:#}");
    assert_eq!(batch["locked_by"], Value::Null);
    wait_until("every task is processed", || count_in(&rota, "processed") == wanted as u64);
    // None resubmitted twice: read every history.
    let twice: Vec<String> = runtime.block_on(async {
        let store = SqliteStore::open(Config::new(&db), Arc::new(SystemClock)).unwrap();
        let mut twice = Vec::new();
        for n in 0..wanted {
            let id = TaskId::new(format!("gate-{n:04}")).unwrap();
            let history = rota_store::Tasks::history(&store, &id).await.unwrap();
            if history.iter().filter(|e| e.kind == EventKind::Resubmitted).count() != 1 {
                twice.push(id.to_string());
            }
        }
        twice
    });
    assert!(twice.is_empty(), "tasks not resubmitted exactly once: {twice:?}");
    assert!(serve.log().contains("running batch"), "the serve's leader ran it:\n{}", serve.log());
    eprintln!("{wanted} tasks; killed after: {}; the batch: {batch}", seen.last().unwrap());
}

/// `count` dead letters in queue `q` of the store at `db`, `m-0000`..:
/// every other one timed out, the rest were refused.
fn dead_letters(runtime: &tokio::runtime::Runtime, db: &std::path::Path, count: usize) {
    runtime.block_on(async {
        let store = SqliteStore::open(Config::new(db), Arc::new(SystemClock)).unwrap();
        let q = QueueName::new("q").unwrap();
        let messages =
            (0..count).map(|n| Outgoing::json(&json!({ "n": n })).unwrap().with_id(MessageId::new(format!("m-{n:04}")).unwrap())).collect();
        store.send_batch(&q, messages).await.unwrap();
        let mut left = count;
        while left > 0 {
            for delivery in store.receive(&q, Receive::up_to(1000)).await.unwrap() {
                let n = delivery.id.as_str()[2..].parse::<usize>().unwrap();
                let reason = if n % 2 == 0 { format!("agent timeout ({n})") } else { format!("HTTP 400 ({n})") };
                store.dead_letter(&q, delivery.lease_token, reason).await.unwrap();
                left -= 1;
            }
        }
    });
}

#[test]
fn a_filtered_redrive_dry_runs_then_runs_as_a_batch_with_its_audit_entry() {
    let rota = Rota::new();
    rota.ok(&["queue", "create", "q"]);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    dead_letters(&runtime, &rota.dir().join("q.db"), 30);

    let dry = rota.ok(&["dlq", "redrive", "q", "--reason-contains", "timeout", "--dry-run"]);
    let lines: Vec<&str> = dry.lines().collect();
    assert_eq!(lines[0], "would redrive 15 dead letter(s) of queue q", "{dry}");
    assert!(lines[1].starts_with("ID") && lines[1].contains("REASON"), "a table of the first: {dry}");
    assert!(lines[2].starts_with("m-0000") && lines[2].ends_with("agent timeout (0)"), "{dry}");
    assert_eq!(lines.len(), 2 + 10 + 1, "the first ten, then …: {dry}");
    assert_eq!(lines[12], "…");
    assert_eq!(rota.stats("q")["dead_lettered"], 30, "a dry run changes nothing");
    let all = rota.ok(&["dlq", "redrive", "q", "--all", "--dry-run"]);
    assert!(all.starts_with("would redrive 30 dead letter(s) of queue q\n"), "{all}");

    let none = rota.ok(&["dlq", "redrive", "q", "--reason-contains", "timeout", "--dead-lettered-before", "2000-01-01T00:00:00Z"]);
    assert!(none.trim_end().ends_with("done: 0 redriven, 0 skipped, 0 failed"), "nothing dead-lettered before 2000: {none}");
    let output = rota.command(&["dlq", "redrive", "q", "--reason-contains", "timeout", "--reason", "agent fixed"]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(report.starts_with("batch ") && report.trim_end().ends_with("done: 15 redriven, 0 skipped, 0 failed"), "{report}");
    let stats = rota.stats("q");
    assert_eq!((stats["ready"].as_u64(), stats["dead_lettered"].as_u64()), (Some(15), Some(15)), "{stats}");

    let batches = rota.json(&["batches", "list", "--json"]);
    let redrive = batches.as_array().unwrap().iter().find(|b| b["action"] == "redrive" && b["total"] == 15).expect("listed");
    assert_eq!((&redrive["dead_letters"]["queue"], &redrive["dead_letters"]["reason_contains"]), (&json!("q"), &json!("timeout")));
    let audit = rota.json(&["audit", "--action", "batch.create", "--json"]);
    let entry = audit.as_array().unwrap().iter().find(|e| e["target"] == redrive["id"]).expect("audited");
    assert_eq!((&entry["reason"], &entry["detail"]["action"]), (&json!("agent fixed"), &json!("redrive")), "{entry}");

    let detached = rota.command(&["dlq", "redrive", "q", "--dead-lettered-after", "1h", "--detach"]).output().unwrap();
    let id = String::from_utf8_lossy(&detached.stdout).trim().to_owned();
    assert!(id.starts_with("batch-"), "--detach prints the id: {id}");
    assert_eq!(rota.json(&["batches", "show", &id, "--json"])["state"], "running", "left to a Supervisor leader");

    for (args, needle) in [
        (vec!["dlq", "redrive", "q", "--all", "--reason-contains", "x"], "cannot be used with"),
        (vec!["dlq", "redrive", "q", "--id", "m-0001", "--dry-run"], "cannot be used with"),
        (vec!["dlq", "redrive", "q", "--dead-lettered-after", "then"], "expected an RFC 3339 time"),
        (vec!["dlq", "redrive", "q"], "required"),
    ] {
        let (code, stderr) = rota.fails(&args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    let (code, stderr) = rota.fails(&["dlq", "redrive", "nope", "--reason-contains", "x"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cannot create the batch: not found: queue nope"), "{stderr}");
}

#[test]
fn a_redrive_batch_killed_half_way_is_finished_by_the_serve_and_sends_nothing_twice() {
    let rota = Rota::new();
    let db = rota.dir().join("q.db");
    rota.ok(&["queue", "create", "q"]);
    let serve = Serve::start(rota.url(), &["--instance-id", "redrive-serve", "--listen", "none"]);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // Pages of 100: the command is killed after its first.
    let wanted = 4 * tasks_wanted();
    dead_letters(&runtime, &db, 2 * wanted);

    let mut redrive = rota
        .command(&["dlq", "redrive", "q", "--reason-contains", "timeout", "--batch-lease", "2s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(redrive.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let batch_id = loop {
        let line = lines.next().expect("the command reports its progress").unwrap();
        seen.push(line.clone());
        if let Some(rest) = line.strip_prefix("batch ")
            && let Some((id, progress)) = rest.split_once(": ")
            && let Some((handled, _)) = progress.split_once(" of ")
            && handled.parse::<usize>().is_ok_and(|n| n > 0)
        {
            break id.to_owned();
        }
    };
    redrive.kill().unwrap();
    let status = redrive.wait().unwrap();
    assert!(!status.success(), "killed before it finished: {seen:?}");

    let mut batch = Value::Null;
    wait_until("the batch is done", || {
        batch = rota.json(&["batches", "show", &batch_id, "--json"]);
        batch["state"] == "done"
    });
    assert_eq!((&batch["action"], &batch["total"], &batch["failed"]), (&json!("redrive"), &json!(wanted), &json!(0)), "{batch:#}");
    assert_eq!(batch["done"].as_u64().unwrap() + batch["skipped"].as_u64().unwrap(), wanted as u64, "{batch:#}");
    // Each timed-out message is in the live queue once; the others stay dead.
    let stats = rota.stats("q");
    assert_eq!((stats["ready"].as_u64(), stats["dead_lettered"].as_u64()), (Some(wanted as u64), Some(wanted as u64)), "{stats}");
    let ids: std::collections::BTreeSet<String> = runtime.block_on(async {
        let store = SqliteStore::open(Config::new(&db), Arc::new(SystemClock)).unwrap();
        let q = QueueName::new("q").unwrap();
        let mut ids = std::collections::BTreeSet::new();
        loop {
            let got = store.receive(&q, Receive::up_to(1000)).await.unwrap();
            if got.is_empty() {
                break ids;
            }
            for delivery in got {
                assert_eq!(delivery.delivery_count, 1, "a fresh count");
                assert!(ids.insert(delivery.id.to_string()), "{} sent back twice", delivery.id);
            }
        }
    });
    assert_eq!(ids.len(), wanted);
    assert!(ids.iter().all(|id| id[2..].parse::<usize>().unwrap() % 2 == 0), "only the timed-out ones");
    assert!(serve.log().contains("running batch"), "the serve's leader ran it:\n{}", serve.log());
    eprintln!("{wanted} dead letters redriven; killed after: {}; the batch: {batch}", seen.last().unwrap());
}
