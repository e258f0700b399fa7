//! `rota demo`, run as the real binary: it ends every order, kills and
//! restarts its agent worker, prints the table, and exits 0 only when no
//! effect was applied twice.

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn the_demo_ends_every_order_and_applies_each_effect_at_most_once() {
    let workdir = tempfile::tempdir().unwrap();
    let keep = workdir.path().join("kept");
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_rota"))
        .args(["demo", "--orders", "40", "--seed", "7", "--timeout", "60s", "--keep"])
        .arg(&keep)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", output.status);
    assert!(elapsed < Duration::from_secs(30), "the demo took {elapsed:?}");

    let has = |needle: &str| stdout.lines().any(|line| line.contains(needle));
    assert!(has("agent worker demo-agent-1 KILLED"), "{stdout}");
    assert!(has("agent worker demo-agent-2 started"), "{stdout}");
    assert!(has("all 40 orders ended"), "{stdout}");
    for label in ["processed", "compensated", "error", "retries", "supervisor recoveries", "requests received", "effects applied"] {
        assert!(has(label), "no `{label}` line in\n{stdout}");
    }
    let figure = |label: &str| -> u64 {
        let line = stdout.lines().find(|line| line.trim_start().starts_with(label)).unwrap_or_else(|| panic!("no `{label}` in\n{stdout}"));
        line.split_whitespace().filter_map(|token| token.parse().ok()).next_back().unwrap_or_else(|| panic!("no figure in {line:?}"))
    };
    let max_line = stdout.lines().find(|line| line.contains("max effects for one idempotency key")).unwrap();
    assert!(max_line.trim_end().ends_with("ok"), "{max_line}");
    assert!(figure("max effects for one idempotency key") <= 1, "{max_line}");
    assert!(figure("max effects for one order and operation") <= 1, "{stdout}");
    let ended = figure("processed") + figure("compensated") + figure("error");
    assert_eq!(ended, 40, "{stdout}");
    assert!(figure("processed") >= 20, "most orders are processed:\n{stdout}");
    assert!(figure("requests received") >= 40 * 4, "{stdout}");
    assert!(has("demo passed"), "{stdout}");
    assert!(keep.join("rota-demo.db").exists(), "--keep keeps the store");
}

#[test]
fn a_kept_store_is_never_reused() {
    let workdir = tempfile::tempdir().unwrap();
    std::fs::write(workdir.path().join("rota-demo.db"), b"").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_rota")).args(["demo", "--orders", "1", "--keep"]).arg(workdir.path()).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("error: ") && stderr.contains("already exists"), "{stderr}");
}
