//! `--config FILE`: the real binary reading settings from a TOML file,
//! with flags and environment variables winning over it, and bad files
//! refused with the file, line and key named before anything is written.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_one_error_line, lines_of};

/// How long a test waits for `rota serve` to say it started.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// A temporary directory to hold configuration files and stores.
struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Dir {
        Dir(tempfile::tempdir().unwrap())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    fn file(&self, name: &str, text: &str) -> String {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    /// `rota args…` in this directory, with no rota variable inherited.
    fn rota(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rota"));
        command.current_dir(self.0.path()).args(args).stdin(Stdio::null()).env_remove("RUST_LOG");
        for (name, _) in std::env::vars() {
            if name.starts_with("ROTA_") || name.starts_with("OTEL_") {
                command.env_remove(name);
            }
        }
        command
    }

    fn ok(&self, command: &mut Command) -> String {
        let output = command.output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    }

    fn fails(&self, command: &mut Command) -> String {
        let output = command.output().unwrap();
        assert_eq!(output.status.code(), Some(1), "stdout: {}", String::from_utf8_lossy(&output.stdout));
        String::from_utf8(output.stderr).unwrap()
    }
}

#[test]
fn a_flag_beats_its_variable_which_beats_the_file_which_beats_the_default() {
    let dir = Dir::new();
    // `roles` is a setting of `rota serve`: `rota migrate` skips it.
    let config = dir.file("rota.toml", "# the deployment's settings\nstore = \"sqlite://file.db\"\nroles = [\"scheduler\"]\n");
    assert_eq!(dir.ok(&mut dir.rota(&["migrate"])), "rota.db: migrated to this build's schema\n");
    assert_eq!(dir.ok(&mut dir.rota(&["--config", &config, "migrate"])), "file.db: migrated to this build's schema\n");
    assert_eq!(dir.ok(dir.rota(&["migrate"]).env("ROTA_CONFIG", &config)), "file.db: migrated to this build's schema\n");
    assert_eq!(
        dir.ok(dir.rota(&["--config", &config, "migrate"]).env("ROTA_STORE", "env.db")),
        "env.db: migrated to this build's schema\n"
    );
    assert_eq!(
        dir.ok(dir.rota(&["migrate", "--config", &config, "--store", "flag.db"]).env("ROTA_STORE", "env.db")),
        "flag.db: migrated to this build's schema\n"
    );
}

/// Starts `rota serve` and returns its start line, then stops it.
fn start_line(command: &mut Command) -> String {
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let lines = lines_of(child.stderr.take().unwrap());
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    let mut seen = Vec::new();
    let started = loop {
        let left = deadline.checked_duration_since(Instant::now()).unwrap_or_default();
        match lines.recv_timeout(left) {
            Ok(line) if line.contains("rota serve started") => break line,
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                panic!("rota serve did not start within {STARTUP_TIMEOUT:?}; its stderr:\n{}", seen.join("\n"));
            }
        }
    };
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert!(child.wait().unwrap().success(), "rota serve did not stop cleanly");
    started
}

#[test]
fn serve_takes_its_settings_from_the_file() {
    let dir = Dir::new();
    std::fs::create_dir(dir.path("flows")).unwrap();
    dir.file("flows/nap.yaml", "name: nap\nversion: 1\nsteps:\n  - name: a\n    agent: delay\n");
    let config = dir.file(
        "rota.toml",
        r#"
store = "sqlite://serve.db"
workflows = "flows"
instance_id = "from-file"
listen = "127.0.0.1:0"
roles = ["scheduler", "agent"]
queues = ["delay"]
agent-concurrency = 4
supervisor-interval = "250ms"
shutdown-grace = "1s"
webhook-secret = "a-webhook-secret-from-the-file"
egress-allow = ["api.example.com", "10.0.0.0/8"]
exec-dir = "flows"
exec-env = ["HOME"]
"#,
    );
    let line = start_line(&mut dir.rota(&["serve", "--config", &config]));
    for needle in [
        "instance from-file,",
        "serve.db",
        "roles scheduler,agent,",
        "agents delay,",
        "nap@1 (1 step) from flows",
        "API http://127.0.0.1:",
        "webhooks on",
        "egress api.example.com,10.0.0.0/8",
    ] {
        assert!(line.contains(needle), "{needle:?} not in {line}");
    }
    assert!(!line.contains(":7878"), "{line}");

    let line = start_line(dir.rota(&["serve", "--config", &config]).env("ROTA_INSTANCE_ID", "from-env"));
    assert!(line.contains("instance from-env,"), "{line}");
    let line = start_line(dir.rota(&["serve", "--config", &config, "--instance-id", "from-flag"]).env("ROTA_INSTANCE_ID", "from-env"));
    assert!(line.contains("instance from-flag,"), "{line}");
    // A variable the environment sets wins over the file's.
    let line = start_line(dir.rota(&["serve", "--config", &config]).env("ROTA_WEBHOOK_SECRET", ""));
    assert!(line.contains("webhooks off"), "{line}");
}

#[test]
fn a_bad_file_is_refused_naming_the_file_line_and_key() {
    let dir = Dir::new();
    let refused = |text: &str, needles: &[&str]| {
        let config = dir.file("bad.toml", &format!("store = \"sqlite://never.db\"\n{text}"));
        let stderr = dir.fails(&mut dir.rota(&["serve", "--config", &config]));
        let mut expected: Vec<String> = vec![format!("error: {config}:")];
        expected.extend(needles.iter().map(|needle| (*needle).to_owned()));
        assert_one_error_line(&stderr, &expected.iter().map(String::as_str).collect::<Vec<_>>());
    };
    refused("# a comment\n\ncolour = \"blue\"\n", &["bad.toml:4: unknown key `colour`"]);
    refused("instance_idd = \"x\"\n", &[":2: unknown key `instance_idd` (did you mean `instance-id`?)"]);
    refused("agent-concurrency = \"many\"\n", &[":2: agent-concurrency: invalid value 'many' for '--agent-concurrency <N>'"]);
    refused("roles = [\"scheduler\", \"conductor\"]\n", &[":2: roles: invalid value 'conductor'"]);
    refused("listen = true\n", &[":2: listen: expected a string or a number"]);
    refused("insecure-no-auth = \"yes\"\n", &[":2: insecure-no-auth: expected true or false"]);
    refused("[api]\nlisten = \"127.0.0.1:1\"\n", &[":2: api: sections are not settings"]);
    refused("queues = [\"delay\",\n", &[":2: not valid TOML"]);
    refused("config = \"other.toml\"\n", &[":2: a configuration file cannot name another one"]);
    assert!(!Path::new(&dir.path("never.db")).exists(), "a refused file must leave nothing written");

    let missing = dir.path("missing.toml").display().to_string();
    let stderr = dir.fails(&mut dir.rota(&["migrate", "--config", &missing]));
    assert_one_error_line(&stderr, &[&format!("--config {missing}: cannot read")]);
}
