//! `rota demo --chaos`, run as the real binary for a short while: every
//! role in its own process, role processes SIGKILLed (and, on PostgreSQL,
//! the database's connections stalled and cut through the demo's proxy;
//! never `--pg-restart`, which would restart the shared server). It must
//! end every order, apply no effect twice and exit 0, saying which faults
//! it injected.

use std::process::{Command, Output};

use rota_testkit::postgres::TestSchema;

/// Runs `rota demo --chaos --duration 20s` with `extra` arguments and
/// returns its stdout, failing the test unless it passed.
fn chaos(extra: &[&str]) -> String {
    let output: Output = Command::new(env!("CARGO_BIN_EXE_rota"))
        .args(["demo", "--chaos", "--duration", "20s", "--seed", "42"])
        .args(extra)
        .env_remove("RUST_LOG")
        .env_remove("ROTA_STORE")
        .env_remove("ROTA_API_TOKEN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", output.status);
    stdout
}

/// The last number on the line that starts with `label`.
fn figure(stdout: &str, label: &str) -> u64 {
    let line = stdout.lines().find(|line| line.trim_start().starts_with(label)).unwrap_or_else(|| panic!("no `{label}` in\n{stdout}"));
    line.split_whitespace().filter_map(|token| token.parse().ok()).next_back().unwrap_or_else(|| panic!("no figure in {line:?}"))
}

/// How many role processes were SIGKILLed, over every role.
fn kills(stdout: &str) -> u64 {
    stdout.lines().filter(|line| line.trim_start().starts_with("SIGKILL:")).map(|line| figure(line, "SIGKILL:")).sum()
}

/// What both backends must show.
fn check(stdout: &str) {
    let orders = 200; // 10 a second for 20 s
    assert_eq!(figure(stdout, "orders acknowledged by the API process"), orders, "{stdout}");
    let ended = figure(stdout, "processed") + figure(stdout, "compensated") + figure(stdout, "error");
    assert_eq!(ended, orders, "{stdout}");
    let kills = kills(stdout);
    assert!(kills >= 1, "role processes were killed:\n{stdout}");
    assert!(figure(stdout, "started (with replacements)") >= 7 + kills, "{stdout}");
    for check in ["max effects for one idempotency key", "steps completed more than once", "every order ended within"] {
        let line = stdout.lines().find(|line| line.contains(check)).unwrap_or_else(|| panic!("no `{check}` in\n{stdout}"));
        assert!(line.trim_end().ends_with("ok"), "{line}");
    }
    assert!(stdout.lines().any(|line| line == "demo passed"), "{stdout}");
}

#[test]
fn chaos_on_sqlite_kills_role_processes_and_every_order_ends_once() {
    let stdout = chaos(&[]);
    check(&stdout);
    // Every fault on SQLite is a kill, one every 2 to 5 s.
    let kills = kills(&stdout);
    assert!(kills >= 2, "role processes were killed:\n{stdout}");
    assert!(!stdout.contains("database connections"), "no proxy on SQLite:\n{stdout}");
}

#[test]
fn chaos_on_postgres_also_stalls_and_cuts_connections_and_every_order_ends_once() {
    let Some(schema) = TestSchema::new("rota demo --chaos on PostgreSQL") else { return };
    let url = format!("{}?schema={}", schema.url, schema.name);
    let stdout = chaos(&["--store", &url]);
    check(&stdout);
    let outages = ["database connections stalled", "database connections cut"]
        .iter()
        .filter(|kind| stdout.lines().any(|line| line.trim_start().starts_with(**kind)))
        .map(|kind| figure(&stdout, kind))
        .sum::<u64>();
    assert!(outages >= 1, "the connections were stalled or cut:\n{stdout}");
}
