//! Bulk actions as the operator meets them: `rota resubmit` with filters
//! resubmits every task in Error that they select, as one batch; SIGKILLed
//! half-way, the batch is finished by the Supervisor leader of a running
//! `rota serve`, from where it got, and no task is resubmitted twice.
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
use rota_model::{SystemClock, TaskId, WorkflowName};
use rota_store::EventKind;
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
