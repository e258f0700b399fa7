//! `rota bench`, run as the real binary the way the peer harness runs it:
//! parameters in `PEERS_*` variables, the record in `$PEERS_OUT`, the exit
//! code as the contract says (0 ok, 3 not implemented, other failures).

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// Runs `rota bench ARGS` with a small workload in `workdir`.
fn bench(workdir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rota"))
        .arg("bench")
        .args(args)
        .env_remove("ROTA_STORE")
        .env_remove("ROTA_DURABILITY")
        .env_remove("PEERS_PG_URL")
        .env("PEERS_N", "300")
        .env("PEERS_C", "4")
        .env("PEERS_TRICKLE_N", "20")
        .env("PEERS_TRICKLE_RATE", "200")
        .env("PEERS_M", "60")
        .env("PEERS_K", "8")
        .env("PEERS_W_WARMUP", "5")
        .env("PEERS_W_LONE", "10")
        .env("PEERS_WORKDIR", workdir)
        .env("PEERS_OUT", workdir.join("out.json"))
        .env("PEERS_PEER", "rota-test")
        .output()
        .expect("run rota")
}

fn record(workdir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(workdir.join("out.json")).expect("PEERS_OUT written")).expect("a JSON record")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn workload_q_writes_the_record_the_harness_reads() {
    let dir = tempfile::tempdir().unwrap();
    let output = bench(dir.path(), &["--store", "sqlite", "Q"]);
    assert!(output.status.success(), "{:?}: {}", output.status, stderr(&output));

    let record = record(dir.path());
    for metric in ["enqueue_jobs_per_s", "drain_jobs_per_s", "pickup_p50_ms", "pickup_p99_ms"] {
        let value = record["metrics"][metric].as_f64().unwrap_or_else(|| panic!("{metric} missing: {record}"));
        assert!(value > 0.0, "{metric} = {value}");
    }
    assert!(record["metrics"]["pickup_p50_ms"].as_f64() <= record["metrics"]["pickup_p99_ms"].as_f64());
    assert_eq!(record["extra"]["duplicate_executions"], 0, "{record}");
    assert_eq!(record["extra"]["drain_invocations"], 300, "{record}");
    assert_eq!(record["extra"]["consumer"]["completed"], 320, "every job of both phases completed: {record}");
    assert!(record["extra"]["trickle_enqueue_ack_p99_ms"].as_f64().is_some(), "{record}");
    assert_eq!(record["settings"]["N"], 300);
    assert_eq!(record["settings"]["C"], 4);
    let durability = &record["settings"]["durability"];
    // The writer commits with synchronous=normal and its flusher flushes the WAL before any reply.
    assert_eq!((durability["journal_mode"].as_str(), durability["synchronous"].as_str()), (Some("wal"), Some("normal")), "{durability}");
    assert_eq!(durability["flushed_before_reply"], true, "{durability}");
    assert_eq!(durability["meets_rule"], true);
    assert_eq!(record["peer"], "rota-test");
    assert_eq!(record["workload"], "Q");
    assert!(dir.path().join("rota-bench.db").exists(), "the store is a file in PEERS_WORKDIR");

    // The figures also go to stdout, one per line, then the record.
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.lines().next().is_some_and(|line| line.starts_with("enqueue_jobs_per_s ")), "{stdout}");
}

#[test]
fn normal_durability_is_recorded_as_not_meeting_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let output = bench(dir.path(), &["--store", "sqlite", "--durability", "normal", "Q"]);
    assert!(output.status.success(), "{:?}: {}", output.status, stderr(&output));
    let durability = &record(dir.path())["settings"]["durability"];
    assert_eq!(durability["synchronous"], "normal", "{durability}");
    assert_eq!(durability["flushed_before_reply"], false, "{durability}");
    assert_eq!(durability["meets_rule"], false);
}

#[test]
fn workload_w_runs_workflows_through_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let output = bench(dir.path(), &["--store", "sqlite", "W"]);
    assert!(output.status.success(), "{:?}: {}", output.status, stderr(&output));
    let record = record(dir.path());
    assert_eq!(record["workload"], "W");
    for metric in ["workflows_per_s", "latency_p50_ms", "latency_p99_ms"] {
        let value = record["metrics"][metric].as_f64().unwrap_or_else(|| panic!("{metric} missing: {record}"));
        assert!(value > 0.0, "{metric} = {value}");
    }
    assert_eq!(record["settings"]["M"], 60);
    assert_eq!(record["settings"]["durability"]["meets_rule"], true, "{record}");
    // The lone workflows, one at a time after the timed run.
    assert_eq!(record["settings"]["W_LONE"], 10);
    let (lone_p50, lone_p99) = (record["extra"]["lone_latency_p50_ms"].as_f64(), record["extra"]["lone_latency_p99_ms"].as_f64());
    assert!(matches!((lone_p50, lone_p99), (Some(p50), Some(p99)) if p50 > 0.0 && p99 >= p50), "{record}");
    assert!(stdout(&output).contains("lone_latency_p50_ms "), "{}", stdout(&output));
    // CPU per workflow: the bench process's; SQLite has no server of its own.
    let cpu = &record["extra"]["cpu"];
    assert!(cpu["rota_ms_per_workflow"].as_f64().is_some_and(|ms| ms > 0.0), "{cpu}");
    assert!(cpu["database_ms_per_workflow"].is_null() && cpu["agent_processes_ms_per_workflow"].is_null(), "{cpu}");
    assert!(stdout(&output).contains("cpu_ms_per_workflow rota "), "{}", stdout(&output));
}

#[test]
fn workload_w_on_a_prefilled_store_records_its_size_and_listings() {
    let dir = tempfile::tempdir().unwrap();
    let output = bench(dir.path(), &["--store", "sqlite", "W", "--prefill", "500"]);
    assert!(output.status.success(), "{:?}: {}", output.status, stderr(&output));
    let record = record(dir.path());
    assert_eq!(record["settings"]["prefill"], 500);
    let prefilled = &record["extra"]["prefilled"];
    assert_eq!(prefilled["tasks"], 500, "{record}");
    assert!(prefilled["bytes_per_task"].as_f64().is_some_and(|bytes| bytes > 100.0), "{prefilled}");
    assert!(prefilled["store_bytes_after"].as_u64() > prefilled["store_bytes_before"].as_u64(), "{prefilled}");
    let listings = &record["extra"]["listings"];
    // A full page of everything; the one task of customer c042 among 500;
    // the filled tasks in Error (a tenth of them) and every workflow run.
    assert_eq!(listings["all"]["rows"], 50, "{listings}");
    assert_eq!(listings["tag_customer"]["rows"], 1, "{listings}");
    assert_eq!(listings["id_prefix"]["rows"], 10, "fill-0000040 to fill-0000049: {listings}");
    assert!(listings["state_error"]["rows"].as_u64().is_some_and(|rows| rows > 10), "{listings}");
    assert!(listings["created_last_hour"]["rows"] == 50, "{listings}");
    for (name, timing) in listings.as_object().expect("listings") {
        let (p50, max) = (timing["p50_ms"].as_f64(), timing["max_ms"].as_f64());
        assert!(matches!((p50, max), (Some(p50), Some(max)) if p50 > 0.0 && max >= p50), "{name}: {timing}");
    }
    assert!(stdout(&output).contains("prefilled_tasks 500 "), "{}", stdout(&output));
}

#[test]
fn steady_load_under_retention_prunes_and_samples_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("steady.db").display());
    let output = bench(
        dir.path(),
        &[
            "--store",
            &store,
            "steady",
            "--duration",
            "8s",
            "--rate",
            "40",
            "--retention",
            "1s",
            "--retention-interval",
            "1s",
            "--sample-every",
            "2s",
        ],
    );
    assert!(output.status.success(), "{:?}: {}", output.status, stderr(&output));
    let record = record(dir.path());
    assert_eq!(record["workload"], "steady");
    let samples = record["samples"].as_array().expect("samples");
    assert!(samples.len() >= 4, "a sample every 2 s of 8 s, and the last: {record}");
    let submitted = record["metrics"]["submitted"].as_u64().expect("submitted");
    let kept = record["metrics"]["tasks_kept_at_end"].as_u64().expect("kept");
    assert!(submitted > 100, "{record}");
    // Retention deleted the tasks that ended more than a second before its
    // last pass: what is kept is the last seconds' worth, not the run's.
    assert!(kept < submitted * 3 / 4, "{kept} of {submitted} kept: {record}");
    assert!(samples.iter().all(|s| s["store_bytes"].as_u64().is_some_and(|b| b > 0) && s["free_bytes"].is_u64()), "{record}");
    assert!(stdout(&output).lines().any(|line| line.starts_with("t=") && line.contains("tasks_kept=")), "{}", stdout(&output));
}

#[test]
fn exit_codes_follow_the_harness_contract() {
    let dir = tempfile::tempdir().unwrap();

    let output = bench(dir.path(), &["--store", "sqlite", "X"]);
    assert_eq!(output.status.code(), Some(2), "an unknown workload is a usage error: {}", stderr(&output));

    let output = bench(dir.path(), &["--store", "postgres", "Q"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("PEERS_PG_URL, which is unset"), "--store postgres names its variable: {}", stderr(&output));

    let existing = dir.path().join("old.db");
    std::fs::write(&existing, b"").unwrap();
    let url = format!("sqlite://{}", existing.display());
    let output = bench(dir.path(), &["--store", &url, "Q"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("already exists"), "a run needs an empty store: {}", stderr(&output));
    assert!(!dir.path().join("out.json").exists(), "no record for a failed run");
}

/// Both workloads on PostgreSQL, each in a schema of its own that is dropped
/// afterwards; the server's durability settings and the connection's TLS
/// are read back (W without TLS; Q as the URL says, TLS if the server
/// offers it). W runs on a store prefilled with finished tasks, whose size
/// is read from the server.
#[test]
fn q_and_w_run_on_postgres() {
    let Some(url) = rota_testkit::postgres::url("rota bench on PostgreSQL") else { return };
    let without_tls = format!("{url}{}sslmode=disable", if url.contains('?') { '&' } else { '?' });
    for (workload, url) in [("Q", url.clone()), ("W", without_tls)] {
        let dir = tempfile::tempdir().unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_rota"))
            .args(["bench", "--store", "postgres", workload])
            .args(if workload == "W" { &["--prefill", "200"][..] } else { &[] })
            .env_remove("ROTA_STORE")
            .envs([("PEERS_N", "300"), ("PEERS_C", "4"), ("PEERS_TRICKLE_N", "20"), ("PEERS_TRICKLE_RATE", "200")])
            .envs([("PEERS_M", "60"), ("PEERS_K", "8"), ("PEERS_W_WARMUP", "5"), ("PEERS_W_LONE", "10")])
            .env("PEERS_PG_URL", &url)
            .env("PEERS_OUT", dir.path().join("out.json"))
            .env_remove("PEERS_PEER")
            .output()
            .unwrap();
        assert!(output.status.success(), "{workload}: {:?}: {}", output.status, stderr(&output));
        let record = record(dir.path());
        assert_eq!(record["peer"], "rota-pg", "{record}");
        assert_eq!(record["workload"], workload);
        let durability = &record["settings"]["durability"];
        assert_eq!(durability["synchronous_commit"], "on", "{durability}");
        assert_eq!(durability["meets_rule"], true, "{durability}");
        assert!(matches!(durability["autovacuum"].as_str(), Some("on" | "off")), "{durability}");
        let tls = durability["tls"].as_str().unwrap_or_default();
        match workload {
            "W" => {
                assert_eq!(tls, "off", "{durability}");
                let prefilled = &record["extra"]["prefilled"];
                assert_eq!(prefilled["tasks"], 200, "{record}");
                assert!(prefilled["bytes_per_task"].as_f64().is_some_and(|bytes| bytes > 100.0), "{prefilled}");
                assert_eq!(record["extra"]["listings"]["tag_customer"]["rows"], 1, "{record}");
                // The test's server runs on this machine, and a superuser sees its data directory.
                let cpu = &record["extra"]["cpu"];
                assert!(cpu["database_ms_per_workflow"].as_f64().is_some_and(|ms| ms > 0.0), "{cpu}");
            }
            _ => assert!(tls == "off" || tls.starts_with("TLSv"), "{durability}"),
        }
    }
}

/// `--agent-processes N` runs W's steps in N `rota agent` processes (the
/// figures for "1 to 4 agent processes"), which stop cleanly afterwards.
#[test]
fn workload_w_runs_its_agents_in_separate_processes() {
    let dir = tempfile::tempdir().unwrap();
    let output = bench(dir.path(), &["--store", "sqlite", "W", "--agent-processes", "2"]);
    assert!(output.status.success(), "{:?}: {}", output.status, stderr(&output));
    let record = record(dir.path());
    assert_eq!(record["settings"]["agent_processes"], 2, "{record}");
    assert!(record["config"]["dispatch"].as_str().unwrap().contains("2 `rota agent"), "{record}");
    assert!(record["metrics"]["workflows_per_s"].as_f64().unwrap() > 0.0);
    let cpu = &record["extra"]["cpu"];
    assert!(cpu["agent_processes_ms_per_workflow"].as_f64().is_some_and(|ms| ms > 0.0), "{cpu}");
}

/// `--embedded` runs W's agent in the Scheduler's engine, which decides
/// each reply in the commit that consumes its request: no agent commit of
/// its own, so under seven writes a workflow (about 5.7 measured; a
/// separate agent engine needs nine: create, claim, start and two a
/// step). Q has no agents: skipped, as the harness's contract says
/// (exit 3).
#[test]
fn workload_w_embedded_decides_the_replies_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let output = bench(dir.path(), &["--store", "sqlite", "W", "--embedded"]);
    assert!(output.status.success(), "{:?}: {}", output.status, stderr(&output));
    let record = record(dir.path());
    assert_eq!(record["settings"]["embedded"], true, "{record}");
    assert!(record["config"]["dispatch"].as_str().unwrap().contains("decided in-process"), "{record}");
    let writes = record["extra"]["group_commits"]["jobs"].as_f64().unwrap();
    assert!(writes < 7.0 * 60.0, "{writes} writes for 60 workflows: {record}");

    let output = bench(dir.path(), &["--store", "sqlite", "Q", "--embedded"]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(stderr(&output).contains("--embedded is a variant of workload W"), "{}", stderr(&output));
}

/// The growth flags (`--steps`, `--input-bytes`, `--backlog` of each kind,
/// `--queues`) reach the record's settings, and each run records its peak
/// RSS and the store's size.
#[test]
fn growth_flags_reach_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let output = bench(
        dir.path(),
        &["--store", "sqlite", "W", "--steps", "5", "--input-bytes", "1000", "--backlog", "40", "--backlog-kind", "future"],
    );
    assert!(output.status.success(), "{:?}: {}", output.status, stderr(&output));
    let record = record(dir.path());
    let settings = &record["settings"];
    assert_eq!((settings["steps"].as_u64(), settings["input_bytes"].as_u64()), (Some(5), Some(1000)), "{settings}");
    assert_eq!((settings["backlog"].as_u64(), settings["backlog_kind"].as_str()), (Some(40), Some("future")), "{settings}");
    assert_eq!(record["extra"]["backlog"]["items"], 40, "{record}");
    assert_eq!(record["extra"]["idle_probes"]["claimed"], 0, "a task due in an hour is not claimed: {record}");
    assert!(record["extra"]["rss_peak_bytes"].as_u64().is_some_and(|bytes| bytes > 0), "{record}");
    assert!(record["extra"]["store_bytes"].as_u64().is_some_and(|bytes| bytes > 0), "{record}");

    // A pending backlog: W times its drain instead of the closed loop.
    let dir = tempfile::tempdir().unwrap();
    let output = bench(dir.path(), &["--store", "sqlite", "W", "--backlog", "30"]);
    assert!(output.status.success(), "{:?}: {}", output.status, stderr(&output));
    let record = self::record(dir.path());
    assert_eq!(record["settings"]["backlog_kind"], "pending", "{record}");
    assert_eq!(record["extra"]["backlog_drain"]["workflows"], 30, "{record}");
    assert!(record["metrics"]["workflows_per_s"].as_f64().is_some_and(|rate| rate > 0.0), "{record}");

    // A paused workflow's backlog is left alone.
    let dir = tempfile::tempdir().unwrap();
    let output = bench(dir.path(), &["--store", "sqlite", "W", "--backlog", "30", "--backlog-kind", "paused"]);
    assert!(output.status.success(), "{:?}: {}", output.status, stderr(&output));
    let record = self::record(dir.path());
    assert_eq!(record["extra"]["idle_probes"]["claimed"], 0, "{record}");

    // Q over three queues, with delayed messages that nobody receives.
    let dir = tempfile::tempdir().unwrap();
    let output = bench(dir.path(), &["--store", "sqlite", "Q", "--queues", "3", "--backlog", "50", "--backlog-kind", "delayed"]);
    assert!(output.status.success(), "{:?}: {}", output.status, stderr(&output));
    let record = self::record(dir.path());
    assert_eq!(record["settings"]["queues"], 3, "{record}");
    assert_eq!(record["extra"]["consumer"]["completed"], 320, "every job of both phases, none of the backlog: {record}");
    assert_eq!(record["extra"]["idle_probes"]["received"], 0, "{record}");
    assert!(record["extra"]["rss_peak_bytes"].as_u64().is_some_and(|bytes| bytes > 0), "{record}");
}

#[test]
fn bad_growth_flags_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    for (args, flag) in [
        (&["W", "--steps", "0"][..], "--steps"),
        (&["W", "--steps", "1001"][..], "--steps"),
        (&["W", "--input-bytes", "10"][..], "--input-bytes"),
        (&["W", "--input-bytes", "300000"][..], "--input-bytes"),
        (&["W", "--queues", "2"][..], "--queues"),
        (&["Q", "--queues", "0"][..], "--queues"),
        (&["Q", "--steps", "5"][..], "--steps"),
        (&["Q", "--backlog", "5", "--backlog-kind", "pending"][..], "--backlog-kind"),
        (&["W", "--backlog-kind", "later"][..], "--backlog-kind"),
    ] {
        let output = bench(dir.path(), &[&["--store", "sqlite"][..], args].concat());
        assert!(!output.status.success(), "{args:?} was taken");
        assert!(stderr(&output).contains(flag), "{args:?}: the error names {flag}: {}", stderr(&output));
        assert!(!dir.path().join("out.json").exists(), "{args:?}: no record for a refused run");
    }
}
