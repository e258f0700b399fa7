//! The `exec` agent running real `sh` commands, in real time with short
//! durations: child processes do not run on paused time.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::StdRng;
use rota_agent::{Agent, ExecAgent, ExecConfig, Outcome, Request, run_until_deadline};
use rota_model::{Clock, RetryPolicy, SystemClock};
use serde_json::{Value, json};

fn request(input: Value, window: Duration) -> Request {
    common::request("ship", 2, input, SystemClock.now() + window)
}

/// Runs one try of `input` with a 10 s window.
async fn check(input: Value) -> Result<Value, rota_agent::StepError> {
    ExecAgent::new(Arc::new(SystemClock)).call(&request(input, Duration::from_secs(10))).await
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the field after the parenthesised command name.
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Waits up to 2 s for `pid` to die (the kill is asynchronous).
async fn dies(pid: i32) -> bool {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

async fn read_pid(file: &Path) -> i32 {
    let started = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(file)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "the command never wrote its pid");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn json_goes_in_on_stdin_and_comes_out_on_stdout() {
    assert_eq!(check(json!({"command": ["cat"], "stdin": {"order": 17}})).await, Ok(json!({"order": 17})));
    // Without a `stdin` field the whole input is sent.
    assert_eq!(check(json!({"command": "cat"})).await, Ok(json!({"command": "cat"})));
    assert_eq!(check(json!({"command": "true"})).await, Ok(Value::Null));
}

#[tokio::test]
async fn the_command_sees_the_request_in_its_environment() {
    let line =
        r#"printf '{"task":"%s","key":"%s","attempt":%s,"extra":"%s"}' "$ROTA_TASK_ID" "$ROTA_IDEMPOTENCY_KEY" "$ROTA_ATTEMPT" "$EXTRA""#;
    let output = check(json!({"command": line, "env": {"EXTRA": "x"}})).await;
    assert_eq!(output, Ok(json!({"task": "order-17", "key": "order-17/ship", "attempt": 2, "extra": "x"})));
}

#[tokio::test]
async fn the_command_gets_a_clean_environment_and_its_own_directory() {
    // The test process has these; the command must not.
    assert!(std::env::var_os("HOME").is_some() && std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let dir = tempfile::tempdir().unwrap();
    let config = ExecConfig {
        env: vec![("FROM_CONFIG".into(), "c".into()), ("SHARED".into(), "config".into())],
        working_dir: dir.path().to_path_buf(),
        ..ExecConfig::default()
    };
    let agent = ExecAgent::with_config(config, Arc::new(SystemClock)).unwrap();
    let line = r#"printf '{"home":"%s","manifest":"%s","path":"%s","dir":"%s","config":"%s","shared":"%s","names":"%s"}' \
        "$HOME" "$CARGO_MANIFEST_DIR" "$PATH" "$(pwd -P)" "$FROM_CONFIG" "$SHARED" "$(env | cut -d= -f1 | sort | tr '\n' ' ')""#;
    let input = json!({"command": line, "env": {"SHARED": "step"}});
    let output = agent.call(&request(input, Duration::from_secs(10))).await.unwrap();
    assert_eq!(output["home"], "", "the agent's HOME leaked");
    assert_eq!(output["manifest"], "", "the agent's environment leaked");
    assert_eq!(output["path"], rota_agent::PATH_DEFAULT);
    assert_eq!(output["dir"], dir.path().canonicalize().unwrap().to_str().unwrap());
    assert_eq!(output["config"], "c");
    assert_eq!(output["shared"], "step", "the step's env overrides the agent's configuration");
    // Exactly what the docs list, plus what sh sets itself (PWD, SHLVL, _).
    let names: Vec<&str> =
        output["names"].as_str().unwrap().split_whitespace().filter(|n| !matches!(*n, "PWD" | "SHLVL" | "_" | "OLDPWD")).collect();
    let expected =
        ["FROM_CONFIG", "PATH", "ROTA_ATTEMPT", "ROTA_COMPENSATE", "ROTA_IDEMPOTENCY_KEY", "ROTA_STEP", "ROTA_TASK_ID", "SHARED"];
    assert_eq!(names, expected);

    let relative = ExecConfig { working_dir: "work".into(), ..ExecConfig::default() };
    assert!(ExecAgent::with_config(relative, Arc::new(SystemClock)).unwrap_err().to_string().contains("exec.working_dir"));
    let bad_env = ExecConfig { env: vec![("A=B".into(), "1".into())], ..ExecConfig::default() };
    assert!(ExecAgent::with_config(bad_env, Arc::new(SystemClock)).unwrap_err().to_string().contains("exec.env"));
}

#[tokio::test]
async fn exit_75_is_retryable_and_other_codes_are_permanent() {
    let err = check(json!({"command": "echo 'queue full' >&2; exit 75"})).await.unwrap_err();
    assert!(err.is_retryable());
    assert_eq!(err.message(), "`sh` exited 75 (temporary failure): queue full");

    let err = check(json!({"command": "echo one >&2; echo 'bad address' >&2; exit 1"})).await.unwrap_err();
    assert!(!err.is_retryable());
    assert_eq!(err.message(), "`sh` exited 1: one | bad address");

    let err = check(json!({"command": "echo not json"})).await.unwrap_err();
    assert!(!err.is_retryable());
    assert!(err.message().contains("stdout is not JSON"), "{err}");

    let err = check(json!({"command": ["/nonexistent/rota-test-binary"]})).await.unwrap_err();
    assert!(!err.is_retryable());
    assert!(err.message().starts_with("cannot run `/nonexistent/rota-test-binary`"), "{err}");
}

#[tokio::test]
async fn a_timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    // The shell starts a grandchild and waits for it; both must die.
    let line = format!("sleep 30 & echo $! > {}; wait", pid_file.display());
    let started = Instant::now();
    let err = check(json!({"command": line, "timeout": "300ms"})).await.unwrap_err();
    assert!(err.is_retryable());
    assert!(err.message().contains("timed out after 300ms; killed"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    let grandchild = read_pid(&pid_file).await;
    assert!(dies(grandchild).await, "pid {grandchild} outlived the timeout");
}

#[tokio::test]
async fn the_deadline_cancels_the_command_and_nothing_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let line = format!("sleep 30 & echo $! > {}; wait", pid_file.display());
    let clock = SystemClock;
    let agent = ExecAgent::new(Arc::new(clock));
    let request = request(json!({"command": line}), Duration::from_millis(400));
    let policy = RetryPolicy::new(3, Duration::from_millis(10), Duration::from_millis(20)).unwrap();
    let started = Instant::now();
    let outcome = run_until_deadline(&agent, &request, &policy, &clock, &mut StdRng::seed_from_u64(5)).await;
    assert!(matches!(outcome, Outcome::DeadlinePassed { .. }), "{outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    let grandchild = read_pid(&pid_file).await;
    assert!(dies(grandchild).await, "pid {grandchild} outlived the deadline");
}

#[tokio::test]
async fn oversized_stdout_is_refused_and_the_command_killed() {
    let config = ExecConfig { stdout_bytes_max: 1_000, ..ExecConfig::default() };
    let agent = ExecAgent::with_config(config, Arc::new(SystemClock)).unwrap();
    // `yes` would write forever: the bound must stop it, not the timeout.
    let started = Instant::now();
    let err = agent.call(&request(json!({"command": ["yes"], "timeout": "5s"}), Duration::from_secs(10))).await.unwrap_err();
    assert!(!err.is_retryable());
    assert!(err.message().contains("stdout larger than 1000 bytes"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn retries_of_a_temporary_failure_reach_success() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("tried");
    // Fails with 75 the first time, succeeds the second.
    let line = format!("if [ -e {m} ]; then echo '\"done\"'; else touch {m}; exit 75; fi", m = marker.display());
    let clock = SystemClock;
    let agent = ExecAgent::new(Arc::new(clock));
    let request = request(json!({"command": line}), Duration::from_secs(10));
    let policy = RetryPolicy::new(3, Duration::from_millis(10), Duration::from_millis(20)).unwrap();
    let outcome = run_until_deadline(&agent, &request, &policy, &clock, &mut StdRng::seed_from_u64(5)).await;
    assert_eq!(outcome, Outcome::Succeeded(json!("done")));
}
