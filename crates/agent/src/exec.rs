//! The built-in `exec` agent: runs a command per try, JSON in on stdin, JSON
//! out on stdout.
//!
//! The step input is
//! `{ "command": ["argv0", "arg", …] | "shell line", "env": {…}?, "timeout": "5s"?, "stdin": <json>? }`.
//! A string command runs as `sh -c <string>`. The command gets the `stdin`
//! field as JSON on its standard input, or the whole step input when there
//! is none.
//!
//! The command does not inherit the agent's environment or working
//! directory: it starts in [`ExecConfig::working_dir`] (`/` unless
//! configured) with a clean environment holding only
//! - [`ExecConfig::env`]: `PATH` ([`PATH_DEFAULT`] unless given) and the
//!   variables the agent's configuration names (the binary passes its own
//!   values of [`ENV_INHERITED`] and of the names `--exec-env` lists);
//! - the step input's `env`;
//! - `ROTA_TASK_ID`, `ROTA_STEP`, `ROTA_ATTEMPT`, `ROTA_IDEMPOTENCY_KEY` and
//!   `ROTA_COMPENSATE` (`true`/`false`).
//!
//! So the server's secrets (database URLs, tokens, signing keys in its
//! environment) never reach a step unless a configuration names them.
//!
//! Exit status mapping:
//!
//! | how the command ended                       | result                                     |
//! |---------------------------------------------|--------------------------------------------|
//! | exit 0                                      | output: stdout as JSON (empty → `null`; not JSON → permanent) |
//! | exit 75 (`EX_TEMPFAIL` of sysexits.h)       | retryable                                  |
//! | any other exit code                         | permanent                                  |
//! | killed by a signal (OOM killer, operator)   | retryable                                  |
//! | still running at its timeout                | killed, retryable                          |
//! | cannot start: not found, not executable     | permanent                                  |
//! | cannot start: anything else (EAGAIN, …)     | retryable                                  |
//!
//! The transient failures carry their class, which a step's
//! `retry.non_retryable` may list to fail at once instead: `timeout`,
//! `exit_tempfail` (exit 75), `killed` (a signal) and `start_failed`.
//!
//! Only 75 is retryable among exit codes: it is the one sysexits.h code that
//! means "try again later", and a script author can choose it on purpose.
//! Error messages carry the last lines of stderr.
//!
//! The command runs in a process group of its own. When its timeout passes,
//! or the step's deadline cancels the call, the whole group is killed, so a
//! shell's children do not outlive the step.
//!
//! Deliberately left out: per-step working directories, resource limits,
//! sandboxing, and platforms other than Unix.

use std::io;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rota_model::{Clock, FailureClass, FailureKind, json};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::input::{self, excerpt};
use crate::{Agent, Error, Request, Result, StepError};

/// The largest stdout the agent reads, in bytes, whatever the configuration
/// says.
pub const STDOUT_BYTES_LIMIT: usize = 64 * 1024 * 1024;
/// The exit code that asks for a retry (`EX_TEMPFAIL` in sysexits.h).
pub const EXIT_TEMPFAIL: i32 = 75;
/// How many trailing lines of stderr go into an error message.
const STDERR_LINES: usize = 5;

/// The fields a step input may have.
const FIELDS: &[&str] = &["command", "env", "timeout", "stdin"];

/// The variables of its own environment the binary passes to every command
/// (when it has them): where to find programs, the user's home, and the
/// locale and time zone, none of them secret.
pub const ENV_INHERITED: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"];
/// The `PATH` of commands when [`ExecConfig::env`] gives none.
pub const PATH_DEFAULT: &str = "/usr/local/bin:/usr/bin:/bin";

/// Settings of an [`ExecAgent`], checked by [`ExecAgent::with_config`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecConfig {
    /// The timeout when the step input gives none. The step's remaining
    /// time caps it either way.
    pub timeout_default: Duration,
    /// The largest stdout accepted; past it the command is killed and the
    /// try fails permanently. Bounded by [`STDOUT_BYTES_LIMIT`].
    pub stdout_bytes_max: usize,
    /// How many trailing bytes of stderr are kept for error messages.
    pub stderr_tail_bytes: usize,
    /// The environment every command starts from, in place of the agent's
    /// (the step input's `env` and the `ROTA_` variables are added). `PATH`
    /// is [`PATH_DEFAULT`] when this gives none.
    pub env: Vec<(String, String)>,
    /// The directory commands run in, absolute.
    pub working_dir: PathBuf,
}

impl Default for ExecConfig {
    /// 60 s timeout, 4 MiB stdout, 4 KiB of stderr, only `PATH`
    /// ([`PATH_DEFAULT`]) in the environment, in `/`.
    fn default() -> Self {
        ExecConfig {
            timeout_default: Duration::from_secs(60),
            stdout_bytes_max: 4 * 1024 * 1024,
            stderr_tail_bytes: 4 * 1024,
            env: Vec::new(),
            working_dir: PathBuf::from("/"),
        }
    }
}

impl ExecConfig {
    fn validate(&self) -> Result<()> {
        if self.timeout_default.is_zero() {
            return Err(Error::Config("exec.timeout_default must be above zero".into()));
        }
        if self.stdout_bytes_max == 0 || self.stdout_bytes_max > STDOUT_BYTES_LIMIT {
            return Err(Error::Config(format!(
                "exec.stdout_bytes_max must be between 1 and {STDOUT_BYTES_LIMIT}, got {}",
                self.stdout_bytes_max
            )));
        }
        if self.stderr_tail_bytes == 0 || self.stderr_tail_bytes > STDOUT_BYTES_LIMIT {
            return Err(Error::Config(format!(
                "exec.stderr_tail_bytes must be between 1 and {STDOUT_BYTES_LIMIT}, got {}",
                self.stderr_tail_bytes
            )));
        }
        if !self.working_dir.is_absolute() {
            return Err(Error::Config(format!("exec.working_dir must be an absolute path, got {}", self.working_dir.display())));
        }
        for (name, value) in &self.env {
            if !valid_env(name, value) {
                return Err(Error::Config(format!("exec.env: {name:?} is not a valid environment variable")));
            }
        }
        Ok(())
    }
}

/// The built-in `exec` agent.
#[derive(Debug)]
pub struct ExecAgent {
    clock: Arc<dyn Clock>,
    config: ExecConfig,
}

/// A parsed step input.
#[derive(Debug)]
struct ExecInput {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    timeout: Option<Duration>,
    stdin: Vec<u8>,
}

impl ExecAgent {
    /// An agent with the default [`ExecConfig`].
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        ExecAgent { clock, config: ExecConfig::default() }
    }

    /// An agent with `config`, refused with a message naming the field when
    /// it is out of bounds.
    pub fn with_config(config: ExecConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        config.validate()?;
        Ok(ExecAgent { clock, config })
    }
}

#[async_trait]
impl Agent for ExecAgent {
    fn name(&self) -> &str {
        "exec"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        let input = parse_input(&request.input)?;
        let remaining = request.remaining(self.clock.now());
        if remaining.is_zero() {
            return Err(StepError::retryable("the step's complete-by time has passed"));
        }
        let timeout = input.timeout.unwrap_or(self.config.timeout_default).min(remaining);
        let program = input.argv[0].clone();
        let mut command = Command::new(&program);
        command
            .args(&input.argv[1..])
            .current_dir(&self.config.working_dir)
            .env_clear()
            .env("PATH", PATH_DEFAULT)
            .envs(self.config.env.iter().map(|(k, v)| (k, v)))
            .envs(input.env.iter().map(|(k, v)| (k, v)))
            .env("ROTA_TASK_ID", request.task_id.as_str())
            .env("ROTA_STEP", request.step.as_str())
            .env("ROTA_ATTEMPT", request.attempt.to_string())
            .env("ROTA_IDEMPOTENCY_KEY", &request.idempotency_key)
            .env("ROTA_COMPENSATE", request.compensate.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A group of its own, so that a timeout can kill the command's
            // children too (`sh -c "a | b"`), not only the shell.
            .process_group(0)
            // The group kill below covers the usual case; this covers a
            // panic between spawn and the guard.
            .kill_on_drop(true);
        let child = command.spawn().map_err(|e| spawn_error(&program, e))?;
        let mut running = Running::new(child);
        let stdin = running.child.stdin.take();
        let stdout = running.child.stdout.take();
        let stderr = running.child.stderr.take();
        let stdout_max = self.config.stdout_bytes_max;
        let stderr_tail = self.config.stderr_tail_bytes;
        let work = async {
            let ((), stdout, stderr) =
                tokio::try_join!(write_stdin(stdin, &input.stdin), read_bounded(stdout, stdout_max), read_tail(stderr, stderr_tail))?;
            let status = running.child.wait().await?;
            running.reaped = true;
            io::Result::Ok((status, stdout, stderr))
        };
        // If the deadline drops this future instead, `running` is dropped
        // unreaped and its guard kills the group.
        let finished = tokio::time::timeout(timeout, work).await;
        match finished {
            Err(_elapsed) => {
                running.kill_group().await;
                let message = format!("`{program}` timed out after {}; killed", humantime::format_duration(timeout));
                Err(StepError::retryable(message).with_class(FailureClass::Kind(FailureKind::Timeout)))
            }
            Ok(Err(e)) if e.kind() == io::ErrorKind::FileTooLarge => {
                running.kill_group().await;
                Err(StepError::permanent(format!("`{program}`: stdout larger than {stdout_max} bytes; killed")))
            }
            Ok(Err(e)) => {
                running.kill_group().await;
                Err(StepError::retryable(format!("`{program}`: reading its output failed: {e}")))
            }
            Ok(Ok((status, stdout, stderr))) => classify(&program, status, &stdout, &stderr),
        }
    }
}

/// A spawned child whose process group is killed unless it was reaped.
struct Running {
    child: Child,
    /// The group id, which is the child's pid (`process_group(0)`).
    pgid: Option<i32>,
    reaped: bool,
}

impl Running {
    fn new(child: Child) -> Self {
        let pgid = child.id().and_then(|pid| i32::try_from(pid).ok());
        Running { child, pgid, reaped: false }
    }

    /// Kills the group and waits for the child, so no zombie is left.
    async fn kill_group(&mut self) {
        self.signal_group();
        let _ = self.child.wait().await;
        self.reaped = true;
    }

    fn signal_group(&self) {
        // Only while the child is unreaped: its pid (the group id) cannot be
        // reused until then, so the signal cannot reach a stranger's group.
        if let (Some(pgid), false) = (self.pgid, self.reaped) {
            // SAFETY: kill(2) takes plain integers and has no memory effects.
            let rc = unsafe { libc::kill(-pgid, libc::SIGKILL) };
            if rc != 0 {
                tracing::debug!(pgid, error = %io::Error::last_os_error(), "killing the command's process group failed");
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.signal_group();
    }
}

/// Writes the input and closes stdin. A command that exits without reading
/// its input is not an error.
async fn write_stdin(stdin: Option<tokio::process::ChildStdin>, bytes: &[u8]) -> io::Result<()> {
    let Some(mut stdin) = stdin else { return Ok(()) };
    match stdin.write_all(bytes).await {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Reads all of `pipe`, failing with `FileTooLarge` past `max` bytes.
async fn read_bounded(pipe: Option<impl AsyncRead + Unpin>, max: usize) -> io::Result<Vec<u8>> {
    let Some(pipe) = pipe else { return Ok(Vec::new()) };
    let mut bytes = Vec::new();
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    pipe.take(limit).read_to_end(&mut bytes).await?;
    if bytes.len() > max {
        return Err(io::Error::new(io::ErrorKind::FileTooLarge, "stdout over its bound"));
    }
    Ok(bytes)
}

/// Reads all of `pipe`, keeping only the last `keep` bytes.
async fn read_tail(pipe: Option<impl AsyncRead + Unpin>, keep: usize) -> io::Result<Vec<u8>> {
    let Some(mut pipe) = pipe else { return Ok(Vec::new()) };
    let mut tail = Vec::new();
    let mut buffer = [0u8; 8 * 1024];
    loop {
        let n = pipe.read(&mut buffer).await?;
        if n == 0 {
            break;
        }
        tail.extend_from_slice(&buffer[..n]);
        // Trim in batches, not on every read, to keep this linear.
        if tail.len() > 2 * keep {
            tail.drain(..tail.len() - keep);
        }
    }
    if tail.len() > keep {
        tail.drain(..tail.len() - keep);
    }
    Ok(tail)
}

/// Maps a finished command to the step's result.
fn classify(program: &str, status: ExitStatus, stdout: &[u8], stderr: &[u8]) -> Result<Value, StepError> {
    use std::os::unix::process::ExitStatusExt;

    let stderr = last_lines(stderr);
    let with_stderr = |head: String| if stderr.is_empty() { head } else { format!("{head}: {stderr}") };
    match (status.code(), status.signal()) {
        (Some(0), _) => {
            if stdout.iter().all(u8::is_ascii_whitespace) {
                return Ok(Value::Null);
            }
            serde_json::from_slice(stdout).map_err(|e| {
                let text = String::from_utf8_lossy(stdout);
                StepError::permanent(format!("`{program}` exited 0 but its stdout is not JSON ({e}): {}", excerpt(&text, 200)))
            })
        }
        (Some(EXIT_TEMPFAIL), _) => {
            let message = with_stderr(format!("`{program}` exited {EXIT_TEMPFAIL} (temporary failure)"));
            Err(StepError::retryable(message).with_class(FailureClass::Kind(FailureKind::ExitTempfail)))
        }
        (Some(code), _) => Err(StepError::permanent(with_stderr(format!("`{program}` exited {code}")))),
        (None, Some(signal)) => {
            let message = with_stderr(format!("`{program}` was killed by signal {signal}"));
            Err(StepError::retryable(message).with_class(FailureClass::Kind(FailureKind::Killed)))
        }
        (None, None) => Err(StepError::retryable(with_stderr(format!("`{program}` ended with {status}")))),
    }
}

/// The last few non-empty lines of stderr, joined with " | ", for messages.
fn last_lines(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let start = lines.len().saturating_sub(STDERR_LINES);
    excerpt(&lines[start..].join(" | "), 1_000)
}

/// Why a command could not start, classified.
fn spawn_error(program: &str, error: io::Error) -> StepError {
    let message = format!("cannot run `{program}`: {error}");
    match error.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidInput => StepError::permanent(message),
        _ => StepError::retryable(message).with_class(FailureClass::Kind(FailureKind::StartFailed)),
    }
}

/// Whether `name=value` can be put in an environment.
fn valid_env(name: &str, value: &str) -> bool {
    !name.is_empty() && !name.contains(['=', '\0']) && !value.contains('\0')
}

/// Reads the step input, naming the field at fault.
fn parse_input(value: &Value) -> Result<ExecInput, StepError> {
    let fields = input::object(value, FIELDS)?;
    let argv: Vec<String> = match fields.get("command") {
        Some(Value::String(line)) if !line.trim().is_empty() => vec!["sh".into(), "-c".into(), line.clone()],
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) if !s.contains('\0') => Ok(s.clone()),
                other => Err(StepError::permanent(format!("input.command[{i}]: expected a string, got {}", json::kind(other)))),
            })
            .collect::<Result<_, _>>()?,
        Some(Value::String(_) | Value::Array(_)) => return Err(StepError::permanent("input.command: must not be empty")),
        Some(other) => {
            return Err(StepError::permanent(format!(
                "input.command: expected an array of strings or a shell line, got {}",
                json::kind(other)
            )));
        }
        None => return Err(StepError::permanent("input.command: missing")),
    };
    if argv[0].is_empty() {
        return Err(StepError::permanent("input.command[0]: must not be empty"));
    }
    let env = input::string_map(fields, "env")?
        .into_iter()
        .map(|(k, v)| {
            if !valid_env(k, v) {
                Err(StepError::permanent(format!("input.env.{k}: invalid environment variable")))
            } else {
                Ok((k.to_owned(), v.to_owned()))
            }
        })
        .collect::<Result<_, _>>()?;
    let timeout = input::duration(fields, "timeout")?;
    if timeout.is_some_and(|t| t.is_zero()) {
        return Err(StepError::permanent("input.timeout: must be above zero"));
    }
    let stdin = serde_json::to_vec(fields.get("stdin").unwrap_or(value)).map_err(|e| StepError::permanent(format!("input.stdin: {e}")))?;
    Ok(ExecInput { argv, env, timeout, stdin })
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use serde_json::json;

    use super::*;

    /// Classifies a command that ended with the raw wait `status`.
    fn check(status: i32, stdout: &str, stderr: &str) -> Result<Value, StepError> {
        classify("job", ExitStatus::from_raw(status), stdout.as_bytes(), stderr.as_bytes())
    }

    #[test]
    fn exit_codes_are_mapped() {
        let exit = |code: i32| code << 8;
        assert_eq!(check(exit(0), r#"{"ok":true}"#, ""), Ok(json!({"ok": true})));
        assert_eq!(check(exit(0), " \n", ""), Ok(Value::Null));
        assert!(!check(exit(0), "done", "").unwrap_err().is_retryable());
        assert_eq!(
            check(exit(75), "", "db locked\n"),
            Err(StepError::retryable("`job` exited 75 (temporary failure): db locked")
                .with_class(FailureClass::Kind(FailureKind::ExitTempfail)))
        );
        assert_eq!(check(exit(1), "", "a\nb\n\nc\nd\ne\nf\n"), Err(StepError::permanent("`job` exited 1: b | c | d | e | f")));
        assert!(check(9, "", "").unwrap_err().is_retryable(), "SIGKILL from outside");
        assert_eq!(check(9, "", "").unwrap_err().class(), Some(FailureClass::Kind(FailureKind::Killed)));
    }

    #[test]
    fn inputs_are_read_and_checked() {
        let input = parse_input(&json!({"command": "echo hi", "env": {"A": "1"}, "timeout": "1s"})).unwrap();
        assert_eq!(input.argv, ["sh", "-c", "echo hi"]);
        assert_eq!(input.env, [("A".to_owned(), "1".to_owned())]);
        assert_eq!(input.stdin, serde_json::to_vec(&json!({"command": "echo hi", "env": {"A": "1"}, "timeout": "1s"})).unwrap());
        let input = parse_input(&json!({"command": ["cat"], "stdin": {"x": 1}})).unwrap();
        assert_eq!(input.stdin, br#"{"x":1}"#);
        let message = |v: Value| parse_input(&v).unwrap_err().message().to_owned();
        assert_eq!(message(json!({})), "input.command: missing");
        assert_eq!(message(json!({"command": []})), "input.command: must not be empty");
        assert_eq!(message(json!({"command": ["a", 1]})), "input.command[1]: expected a string, got a number");
        assert_eq!(message(json!({"command": "x", "env": {"A=B": "1"}})), "input.env.A=B: invalid environment variable");
    }

    #[test]
    fn stderr_tails_keep_the_end() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let text = (0..10_000).map(|i| format!("line {i}\n")).collect::<String>();
        let tail = rt.block_on(read_tail(Some(text.as_bytes()), 20)).unwrap();
        assert_eq!(tail, b"line 9998\nline 9999\n");
    }
}
