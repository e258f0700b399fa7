//! `rota schedules …` as the real binary, on a local SQLite store and over
//! a server's API (`--server`), printing the same thing either way; a
//! `rota serve` that declares a workflow file's schedules and fires them;
//! and `rota validate` placing a bad cron expression or time zone at its
//! FILE:LINE:COL.

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Rota, assert_one_error_line, lines_of};
use serde_json::Value;

/// How long a test waits for `rota serve` to say it started.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);

const REPORT: &str = "name: report\nversion: 1\nsteps:\n  - name: nap\n    agent: delay\n    with: { ms: 10 }\n\
                      schedules:\n  - name: yearly\n    cron: \"0 0 0 1 1 *\"\n    timezone: Europe/Paris\n    input: { kind: yearly }\n";

/// A `rota serve` child listening on a free port; killed when dropped.
struct Serve {
    child: Child,
    url: String,
    _stderr: mpsc::Receiver<String>,
}

impl Serve {
    fn start(rota: &Rota, workflows: &Path) -> Serve {
        let args = ["serve", "--listen", "127.0.0.1:0", "--workflows", workflows.to_str().unwrap(), "--supervisor-interval", "200ms"];
        let mut child = rota.command(&args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("rota serve starts");
        let stderr = lines_of(child.stderr.take().unwrap());
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Ok(line) = stderr.recv_timeout(left) else { break };
            if let Some(rest) = line.split("listening on ").nth(1) {
                let url = rest.split_whitespace().next().unwrap().to_owned();
                return Serve { child, url, _stderr: stderr };
            }
            seen.push(line);
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("rota serve did not say where it listens; its stderr:\n{}", seen.join("\n"));
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn workflows_dir(dir: &Path, report: &str) -> std::path::PathBuf {
    let workflows = dir.join("workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    std::fs::write(workflows.join("report.yaml"), report).unwrap();
    workflows
}

/// `rota [--server URL] args…`, which must succeed; its stdout.
fn ok(rota: &Rota, server: Option<&str>, args: &[&str]) -> String {
    let mut full: Vec<&str> = server.map(|url| vec!["--server", url]).unwrap_or_default();
    full.extend(args);
    rota.ok(&full)
}

/// The same for a command that must fail; its stderr.
fn fails(rota: &Rota, server: Option<&str>, args: &[&str]) -> String {
    let mut full: Vec<&str> = server.map(|url| vec!["--server", url]).unwrap_or_default();
    full.extend(args);
    rota.fails(&full).1
}

/// Every schedule command, on one transport, against a running server that
/// fires the schedules. Returns what the transport-independent commands
/// printed, to compare the two transports.
fn exercise(rota: &Rota, server: Option<&str>, name: &str) -> Vec<String> {
    let mut printed = Vec::new();
    let created = ok(rota, server, &["schedules", "create", name, "--workflow", "report", "--cron", "*/1 * * * * *", "--overlap", "allow"]);
    assert!(
        created.starts_with(&format!(
            "schedule {name} created (workflow report, cron \"*/1 * * * * *\" in UTC, overlap allow, catch-up latest); next fire 20"
        )),
        "{created}"
    );
    let again = ok(rota, server, &["schedules", "create", name, "--workflow", "report", "--cron", "*/1 * * * * *", "--overlap", "allow"]);
    assert!(again.starts_with(&format!("schedule {name} unchanged (it exists with this definition):")), "{again}");

    let stderr = fails(rota, server, &["schedules", "create", name, "--workflow", "report", "--cron", "0 * * * * *"]);
    assert_one_error_line(&stderr, &[&format!("schedule {name} already exists with a different definition (delete it first)")]);
    printed.push(stderr.replace(name, "NAME"));
    let stderr = fails(rota, server, &["schedules", "create", "bad", "--workflow", "report", "--cron", "61 * * * *"]);
    assert_one_error_line(&stderr, &["cron: invalid cron expression \"61 * * * *\""]);
    printed.push(stderr);
    let stderr =
        fails(rota, server, &["schedules", "create", "bad", "--workflow", "report", "--cron", "* * * * *", "--timezone", "Mars/Base"]);
    assert_one_error_line(&stderr, &["timezone: unknown time zone \"Mars/Base\""]);
    printed.push(stderr);
    let stderr = fails(rota, server, &["schedules", "create", "bad", "--workflow", "nope", "--cron", "* * * * *"]);
    assert_one_error_line(&stderr, &["nope"]);
    printed.push(stderr);

    // The server fires it every second.
    let prefix = format!("{name}@");
    let deadline = Instant::now() + Duration::from_secs(10);
    let fired = loop {
        let tasks = rota.json(&["tasks", "--json", "--limit", "1000"]);
        let fired: Vec<String> = tasks
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["id"].as_str())
            .filter(|id| id.starts_with(&prefix))
            .map(str::to_owned)
            .collect();
        if fired.len() >= 2 || Instant::now() > deadline {
            break fired;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(fired.len() >= 2, "the server fired {name} every second: {fired:?}");
    assert!(fired.iter().all(|id| id.len() == prefix.len() + "2026-11-27T01:00:00Z".len() && id.ends_with('Z')), "{fired:?}");

    let list = ok(rota, server, &["schedules", "list"]);
    let header = list.lines().next().unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["NAME", "WORKFLOW", "CRON", "TIMEZONE", "STATE", "NEXT", "FIRE", "LAST", "TASK"]
    );
    let row = list.lines().find(|line| line.starts_with(name)).unwrap_or_else(|| panic!("{name} listed: {list}"));
    assert!(row.contains("report") && row.contains("*/1 * * * * *") && row.contains("running") && row.contains(&prefix), "{row}");
    let yearly = list.lines().find(|line| line.starts_with("yearly")).unwrap_or_else(|| panic!("the file's schedule listed: {list}"));
    assert!(yearly.contains("Europe/Paris") && yearly.contains("0 0 0 1 1 *"), "{yearly}");
    let json = rota.json(&["schedules", "list", "--json"]);
    let listed: Vec<&Value> = json.as_array().unwrap().iter().collect();
    let yearly = listed.iter().find(|s| s["name"] == "yearly").unwrap();
    assert_eq!((&yearly["source"], &yearly["input"]["kind"]), (&Value::from("file"), &Value::from("yearly")));
    assert!(yearly["next_fire_at"].as_i64().is_some(), "{yearly}");

    let shown = ok(rota, server, &["schedules", "show", name]);
    for needle in ["workflow      report", "overlap       allow", "catch-up      latest", "source        api", "state         running"] {
        assert!(shown.contains(needle), "{needle:?} in {shown}");
    }
    assert!(shown.contains(&format!("last task     {prefix}")), "{shown}");

    assert_eq!(ok(rota, server, &["schedules", "pause", name, "--reason", "quiet hours"]), format!("schedule {name} paused\n"));
    let paused = ok(rota, server, &["schedules", "show", name]);
    assert!(paused.contains("state         paused") && paused.contains("next fire     none (paused)"), "{paused}");
    let resumed = ok(rota, server, &["schedules", "resume", name]);
    assert!(resumed.starts_with(&format!("schedule {name} resumed; next fire 20")), "{resumed}");

    let triggered = ok(rota, server, &["schedules", "trigger", "yearly"]);
    assert!(triggered.starts_with("schedule yearly fired: task yearly@manual@20"), "{triggered}");
    let id = triggered.split("task ").nth(1).unwrap().split(' ').next().unwrap().to_owned();
    let history = rota.json(&["status", &id, "--json"]);
    let received = history["history"].as_array().unwrap().iter().find(|e| e["kind"] == "received").cloned().unwrap();
    assert_eq!(
        (&received["detail"]["schedule"]["name"], &received["detail"]["schedule"]["manual"]),
        (&Value::from("yearly"), &Value::from(true))
    );

    assert_eq!(ok(rota, server, &["schedules", "delete", name, "--reason", "replaced by another"]), format!("schedule {name} deleted\n"));
    let audit = rota.json(&["audit", "--json", "--limit", "100"]);
    let reasons: Vec<(&str, &Value)> =
        audit.as_array().unwrap().iter().filter(|e| e["target"] == name).map(|e| (e["action"].as_str().unwrap(), &e["reason"])).collect();
    assert_eq!(
        reasons,
        [
            ("schedule.delete", &Value::from("replaced by another")),
            ("schedule.resume", &Value::Null),
            ("schedule.pause", &Value::from("quiet hours"))
        ],
        "{audit:#}"
    );
    for command in ["show", "pause", "resume", "trigger", "delete"] {
        let stderr = fails(rota, server, &["schedules", command, name]);
        assert_one_error_line(&stderr, &[&format!("schedule {name} not found")]);
        printed.push(stderr.replace(name, "NAME"));
    }
    printed
}

#[test]
fn schedule_commands_read_the_same_on_a_store_and_over_http() {
    let rota = Rota::new();
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::start(&rota, &workflows_dir(dir.path(), REPORT));
    let local = exercise(&rota, None, "local");
    let remote = exercise(&rota, Some(&serve.url), "remote");
    assert_eq!(local, remote, "the refusals read the same on both transports");
}

#[test]
fn schedules_help_names_every_command_and_flag() {
    let rota = Rota::new();
    let help = rota.ok(&["schedules", "--help"]);
    for command in ["create", "list", "show", "pause", "resume", "trigger", "delete"] {
        assert!(help.contains(command), "{command} in {help}");
    }
    let help = rota.ok(&["schedules", "create", "--help"]);
    for flag in ["--workflow", "--cron", "--input", "--timezone", "--overlap", "--catch-up", "[possible values: skip, allow, buffer-one]"] {
        assert!(help.contains(flag), "{flag} in {help}");
    }
    let (_, stderr) = rota.fails(&["schedules", "create", "x", "--workflow", "w", "--cron", "* * * * *", "--overlap", "sometimes"]);
    assert!(stderr.contains("invalid value 'sometimes' for '--overlap <POLICY>'"), "{stderr}");
}

#[test]
fn validate_places_a_bad_cron_expression_and_time_zone() {
    let rota = Rota::new();
    let dir = tempfile::tempdir().unwrap();
    let bad = REPORT.replace("0 0 0 1 1 *", "0 0 0 1 13 *").replace("Europe/Paris", "Europe/Pariss");
    let workflows = workflows_dir(dir.path(), &bad);
    let file = workflows.join("report.yaml");
    let output = rota.command(&["validate", file.to_str().unwrap()]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    let file = file.display();
    assert!(stderr.contains(&format!("{file}:9:11: schedule `yearly`: invalid cron expression \"0 0 0 1 13 *\"")), "{stderr}");
    assert!(stderr.contains(&format!("{file}:10:15: schedule `yearly`: unknown time zone \"Europe/Pariss\"")), "{stderr}");
    let (_, stderr) = rota.fails(&["serve", "--workflows", workflows.to_str().unwrap()]);
    assert!(stderr.contains("invalid cron expression"), "serve refuses the file too: {stderr}");
}
