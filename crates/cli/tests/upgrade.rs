//! A store written by an earlier release, opened by this one. The fixtures
//! (`crates/store-sqlite/tests/fixtures/vN.db`, and PostgreSQL dumps in
//! `crates/store-postgres/tests/fixtures/vN.sql`) were written by the build
//! of schema version N with `scripts/store-fixtures.sh`: tasks in every
//! state (one cut mid-step by a SIGKILL, one waiting for a signal), a queue
//! with a ready, a leased and a dead-lettered message, a paused schedule.
//! Each is opened with the current code (its migrations run), read back,
//! and served until every unfinished task has finished.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Rota, Serve};
use rota_testkit::postgres::TestSchema;
use serde_json::{Value, json};

/// How long the upgraded store's unfinished tasks may take to finish.
const FINISH_TIMEOUT: Duration = Duration::from_secs(60);
/// The schema name the PostgreSQL dumps were written in.
const DUMP_SCHEMA: &str = "rota_fixture_schema";

/// Every fixture task and the state the script left it in.
const TASKS: &[(&str, &str)] = &[
    ("done-1", "processed"),
    ("done-2", "processed"),
    ("failed-1", "error"),
    ("waiting-1", "processing"),
    ("cut-1", "processing"),
    ("pending-1", "pending"),
    ("pending-2", "pending"),
    ("cancelled-1", "cancelled"),
];

/// The fixtures in `dir` named `v<N>.<ext>`, by N.
fn fixtures(dir: &Path, ext: &str) -> BTreeMap<u32, PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return BTreeMap::new() };
    entries
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| {
            let version = path.file_name()?.to_str()?.strip_prefix('v')?.strip_suffix(&format!(".{ext}"))?.parse().ok()?;
            Some((version, path))
        })
        .collect()
}

fn fixtures_dir(store_crate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(store_crate).join("tests/fixtures")
}

fn workflows_dir() -> PathBuf {
    fixtures_dir("store-sqlite").join("workflows")
}

/// The schema version of this build: `PRAGMA user_version` of a new file.
fn current_sqlite_version() -> u32 {
    let rota = Rota::new();
    rota.ok(&["migrate"]);
    let path = rota.url().strip_prefix("sqlite://").unwrap().to_owned();
    sqlite_version(Path::new(&path))
}

fn sqlite_version(path: &Path) -> u32 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("PRAGMA user_version", [], |row| row.get(0)).unwrap()
}

/// The tasks' states, by id.
fn states(rota: &Rota) -> BTreeMap<String, Value> {
    let tasks = rota.json(&["tasks", "--json", "--limit", "1000"]);
    tasks.as_array().unwrap().iter().map(|task| (task["id"].as_str().unwrap().to_owned(), task.clone())).collect()
}

fn step<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["steps"].as_array().unwrap().iter().find(|step| step["name"] == name).unwrap_or_else(|| panic!("no step {name}: {status}"))
}

/// Reads the fixture back, serves it until its unfinished tasks finish, and
/// checks that nothing written before the upgrade was lost or done twice.
fn check_upgrade(label: &str, rota: &Rota) {
    // Read back: the first command runs the migrations.
    let before = states(rota);
    for (id, state) in TASKS {
        let task = before.get(*id).unwrap_or_else(|| panic!("{label}: task {id} is missing after the upgrade"));
        assert_eq!(task["state"], *state, "{label}: {id}: {task}");
    }
    let cut = rota.json(&["status", "cut-1", "--json"]);
    assert_eq!(cut["input"], json!({"n": 3}), "{label}: {cut}");
    assert_eq!(cut["locked_by"], "fixture-old", "{label}: {cut}");
    assert_eq!(step(&cut, "first")["state"], "completed", "{label}: {cut}");
    assert_eq!(step(&cut, "first")["output"], json!({"slept_ms": 5}), "{label}: {cut}");
    assert_eq!(step(&cut, "second")["state"], "running", "{label}: {cut}");
    let failed = rota.json(&["status", "failed-1", "--json"]);
    assert!(failed["error"].as_str().unwrap().contains("exited 3"), "{label}: {failed}");
    let waiting = rota.json(&["status", "waiting-1", "--json"]);
    assert_eq!(step(&waiting, "approve")["state"], "running", "{label}: {waiting}");

    let work = rota.stats("fixture.work");
    let live = work["ready"].as_u64().unwrap() + work["leased"].as_u64().unwrap() + work["delayed"].as_u64().unwrap();
    assert_eq!((live, work["dead_lettered"].as_u64()), (3, Some(1)), "{label}: {work}");
    let dead = rota.json(&["dlq", "list", "fixture.work", "--json"]);
    assert_eq!(dead[0]["id"], "m-poison", "{label}: {dead}");
    assert_eq!(dead[0]["reason"], "poison: cannot decode", "{label}: {dead}");
    assert_eq!(dead[0]["body"], json!({"k": "poison"}), "{label}: {dead}");
    assert_eq!(rota.stats("fixture.replies")["ready"], 3, "{label}: done-2's received, step_completed and processed");

    let hourly = rota.json(&["schedules", "show", "hourly", "--json"]);
    assert_eq!(
        (&hourly["paused"], &hourly["cron"], &hourly["workflow"]),
        (&json!(true), &json!("0 0 * * * *"), &json!("quick")),
        "{label}"
    );
    let nightly = rota.json(&["schedules", "show", "nightly", "--json"]);
    assert_eq!((&nightly["timezone"], &nightly["catch_up"]), (&json!("Europe/Paris"), &json!("none")), "{label}: {nightly}");
    assert!(nightly["next_fire_at"].is_number(), "{label}: the upgraded schedule has a next fire: {nightly}");

    // Served by the upgraded process, under the old one's instance id: a
    // task's owner is only replaced when its lease (the workflow's deadline,
    // years for the waiting task) runs out, and the signal goes to the
    // owner's inbox.
    let workflows = workflows_dir();
    let serve = Serve::start(
        rota.url(),
        &["--workflows", workflows.to_str().unwrap(), "--instance-id", "fixture-old", "--supervisor-interval", "200ms", "--listen", "none"],
    );
    rota.ok(&["signal", "waiting-1", "approved", "--data", r#"{"by": "upgrade"}"#]);
    let deadline = Instant::now() + FINISH_TIMEOUT;
    let after = loop {
        let now = states(rota);
        let unfinished: Vec<(&String, &Value)> =
            now.iter().filter(|(_, task)| task["state"] == "pending" || task["state"] == "processing").collect();
        if unfinished.is_empty() {
            break now;
        }
        assert!(Instant::now() < deadline, "{label}: still unfinished after {FINISH_TIMEOUT:?}: {unfinished:?}\n{}", serve.log());
        std::thread::sleep(Duration::from_millis(200));
    };
    for (id, state) in TASKS {
        let expected = match *state {
            "pending" | "processing" => "processed",
            finished => finished,
        };
        assert_eq!(after[*id]["state"], expected, "{label}: {id}: {}", after[*id]);
        if *state == expected {
            assert_eq!(after[*id]["updated_at"], before[*id]["updated_at"], "{label}: finished task {id} was written again");
        }
    }
    // The cut task ran its second step again, and completed each step once.
    let cut = rota.json(&["status", "cut-1", "--json"]);
    for name in ["first", "second"] {
        let completions = cut["history"].as_array().unwrap().iter().filter(|e| e["kind"] == "step_completed" && e["step"] == name).count();
        assert_eq!(completions, 1, "{label}: cut-1's step {name} completed {completions} times: {cut}");
    }
    let waiting = rota.json(&["status", "waiting-1", "--json"]);
    assert_eq!(step(&waiting, "approve")["output"], json!({"by": "upgrade"}), "{label}: {waiting}");

    // The queue's messages, whole: the lease the old consumer held ran out.
    let received = rota.json(&["queue", "receive", "fixture.work", "--max", "10", "--wait", "5s", "--lease", "10m", "--json"]);
    let by_id: BTreeMap<&str, &Value> = received.as_array().unwrap().iter().map(|m| (m["id"].as_str().unwrap(), m)).collect();
    assert_eq!(by_id.keys().copied().collect::<Vec<_>>(), ["m-leased", "m-ready-1", "m-ready-2"], "{label}: {received}");
    assert_eq!(by_id["m-ready-1"]["body"], json!({"k": "ready-1"}), "{label}");
    assert_eq!(by_id["m-ready-1"]["ordering_key"], "order-7", "{label}");
    assert_eq!(
        (&by_id["m-ready-2"]["reply_to"], &by_id["m-ready-2"]["correlation_id"]),
        (&json!("fixture.answers"), &json!("c-2")),
        "{label}"
    );
    assert_eq!(by_id["m-leased"]["delivery_count"], 2, "{label}: {received}");
    drop(serve);

    // History rows from before the hash chain are counted, not flagged;
    // the rows appended since chain from them.
    let verified = rota.ok(&["verify"]);
    assert!(verified.trim_end().ends_with("every chain holds"), "{label}: {verified}");
}

#[test]
fn a_fixture_is_kept_for_the_current_sqlite_schema_version() {
    let current = current_sqlite_version();
    let kept = fixtures(&fixtures_dir("store-sqlite"), "db");
    assert!(
        kept.contains_key(&current),
        "no upgrade fixture for schema version {current} (kept: {:?}): after adding a migration, build rota and run \
         `scripts/store-fixtures.sh target/debug/rota` (with ROTA_FIXTURE_POSTGRES_URL set) and commit what it writes",
        kept.keys().collect::<Vec<_>>()
    );
}

#[test]
fn a_fixture_is_kept_for_the_current_postgres_schema_version() {
    let Some(schema) = TestSchema::new("the PostgreSQL schema version's fixture") else { return };
    let rota = Rota::with_store(&format!("{}?schema={}", schema.url, schema.name));
    // `rota migrate` says "…: version N (was 0)".
    let migrated = rota.ok(&["migrate"]);
    let current: u32 = migrated
        .split("version ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no version in `rota migrate`'s output: {migrated}"));
    let kept = fixtures(&fixtures_dir("store-postgres"), "sql");
    assert!(
        kept.contains_key(&current),
        "no upgrade fixture for PostgreSQL schema version {current} (kept: {:?}): after adding a migration, build rota and run \
         `ROTA_FIXTURE_POSTGRES_URL=... scripts/store-fixtures.sh target/debug/rota` and commit the dump it writes",
        kept.keys().collect::<Vec<_>>()
    );
}

#[test]
fn sqlite_stores_of_earlier_versions_open_and_finish_their_tasks() {
    let current = current_sqlite_version();
    let kept = fixtures(&fixtures_dir("store-sqlite"), "db");
    assert!(!kept.is_empty(), "no SQLite fixtures in {}", fixtures_dir("store-sqlite").display());
    for (version, path) in kept {
        let label = format!("SQLite v{version} → v{current}");
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("store.db");
        std::fs::copy(&path, &copy).unwrap();
        assert_eq!(sqlite_version(&copy), version, "{label}: the fixture's name says its version");
        let rota = Rota::with_store(&format!("sqlite://{}", copy.display()));
        check_upgrade(&label, &rota);
        assert_eq!(sqlite_version(&copy), current, "{label}: migrated");
        let conn = rusqlite::Connection::open(&copy).unwrap();
        let integrity: String = conn.query_row("PRAGMA integrity_check", [], |row| row.get(0)).unwrap();
        assert_eq!(integrity, "ok", "{label}");
        eprintln!("{label}: upgraded, read back and finished");
    }
}

#[test]
fn postgres_stores_of_earlier_versions_open_and_finish_their_tasks() {
    let kept = fixtures(&fixtures_dir("store-postgres"), "sql");
    assert!(!kept.is_empty(), "no PostgreSQL fixtures in {}", fixtures_dir("store-postgres").display());
    for (version, path) in kept {
        let Some(schema) = TestSchema::new("upgrade of a PostgreSQL store") else { return };
        let label = format!("PostgreSQL v{version}");
        let dump = std::fs::read_to_string(&path).unwrap().replace(DUMP_SCHEMA, &schema.name);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&schema.url).await.unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(dump))
                .execute(&mut conn)
                .await
                .unwrap_or_else(|err| panic!("{label}: loading the dump: {err}"));
        });
        let rota = Rota::with_store(&format!("{}?schema={}&connections=4", schema.url, schema.name));
        check_upgrade(&label, &rota);
        eprintln!("{label}: upgraded, read back and finished");
    }
}
