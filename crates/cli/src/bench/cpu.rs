//! CPU time a run costs: this process (every thread: engine, agents,
//! clients and, on SQLite, the store itself), its agent child processes,
//! and a PostgreSQL server on this machine. Read before and after the timed
//! part of a run, so that a faster run is seen to cost less CPU per
//! workflow rather than to move the work into the database.
//!
//! The server's figure is the whole server's: the postmaster, every live
//! child (backends, WAL writer, checkpointer…) and the children it has
//! reaped, from `/proc`. Other clients' work on the same server counts too,
//! which is why a run records the load it saw. A server on another machine,
//! or one whose data directory this user cannot read, gives no figure.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::round;

/// What `/proc/PID/stat` says of a process's CPU time and parent.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    parent: u32,
    /// User and system time, in clock ticks.
    own_ticks: u64,
    /// User and system time of the children it has waited for.
    reaped_ticks: u64,
}

fn parse_stat(stat: &str) -> Option<Stat> {
    // The command name may hold spaces and parentheses; the fields after the last ')' do not.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // Index 0 here is field 3 of proc(5); ppid is field 4, utime..cstime fields 14..=17.
    let number = |index: usize| fields.get(index).and_then(|field| field.parse::<u64>().ok());
    Some(Stat { parent: u32::try_from(number(1)?).ok()?, own_ticks: number(11)? + number(12)?, reaped_ticks: number(13)? + number(14)? })
}

fn read_stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// A process's CPU time, and its reaped children's when `reaped` is set.
fn proc_cpu(pid: u32, reaped: bool) -> Option<Duration> {
    let stat = read_stat(pid)?;
    Some(ticks_to_duration(stat.own_ticks + if reaped { stat.reaped_ticks } else { 0 }))
}

fn ticks_to_duration(ticks: u64) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100).max(1);
    Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / per_second)
}

/// This process's CPU time, every thread included (getrusage, microseconds).
fn own_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let micros = |time: libc::timeval| Duration::from_secs(time.tv_sec as u64) + Duration::from_micros(time.tv_usec as u64);
    micros(usage.ru_utime) + micros(usage.ru_stime)
}

/// A PostgreSQL server on this machine, found by its `postmaster.pid`.
pub(super) struct LocalServer {
    postmaster: u32,
}

impl LocalServer {
    /// The server whose data directory is `data_directory`, if its
    /// `postmaster.pid` is readable here and names a live process.
    pub(super) fn find(data_directory: &Path) -> Option<LocalServer> {
        let pid_file = std::fs::read_to_string(data_directory.join("postmaster.pid")).ok()?;
        let postmaster: u32 = pid_file.lines().next()?.trim().parse().ok()?;
        proc_cpu(postmaster, true)?;
        Some(LocalServer { postmaster })
    }

    /// The server's CPU time so far: the postmaster with its reaped
    /// children, and every live child.
    fn cpu(&self) -> Option<Duration> {
        let mut total = proc_cpu(self.postmaster, true)?;
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
            if read_stat(pid).is_some_and(|stat| stat.parent == self.postmaster) {
                total += proc_cpu(pid, false).unwrap_or_default();
            }
        }
        Some(total)
    }
}

/// CPU times at one moment.
pub(super) struct CpuSample {
    own: Duration,
    children: Option<Duration>,
    server: Option<Duration>,
}

/// What is sampled: this process always, and optionally agent children and
/// a local server.
pub(super) struct CpuMeter {
    children: Vec<u32>,
    server: Option<LocalServer>,
    server_unmeasured: &'static str,
}

impl CpuMeter {
    /// A meter of this process, the `children` (process ids) and `server`;
    /// `server_unmeasured` says why there is no server figure when `server`
    /// is `None`.
    pub(super) fn new(children: Vec<u32>, server: Option<LocalServer>, server_unmeasured: &'static str) -> CpuMeter {
        CpuMeter { children, server, server_unmeasured }
    }

    pub(super) fn sample(&self) -> CpuSample {
        let children = (!self.children.is_empty()).then(|| self.children.iter().filter_map(|pid| proc_cpu(*pid, true)).sum());
        CpuSample { own: own_cpu(), children, server: self.server.as_ref().and_then(LocalServer::cpu) }
    }

    /// The record's `cpu` object: milliseconds of CPU per workflow between
    /// `before` and `after`, and how many cores they kept busy over `elapsed`.
    pub(super) fn report(&self, before: &CpuSample, after: &CpuSample, workflows: u64, elapsed: Duration) -> Value {
        let per_workflow = |spent: Duration| round(Some(spent.as_secs_f64() * 1000.0 / workflows.max(1) as f64), 3);
        let own = after.own.saturating_sub(before.own);
        let children = after.children.zip(before.children).map(|(after, before)| after.saturating_sub(before));
        let server = after.server.zip(before.server).map(|(after, before)| after.saturating_sub(before));
        let total = own + children.unwrap_or_default() + server.unwrap_or_default();
        json!({
            "rota_ms_per_workflow": per_workflow(own),
            "agent_processes_ms_per_workflow": children.map(per_workflow),
            "database_ms_per_workflow": server.map(per_workflow),
            "total_ms_per_workflow": per_workflow(total),
            "cores_busy": round(Some(total.as_secs_f64() / elapsed.as_secs_f64().max(f64::EPSILON)), 2),
            "how": format!(
                "rota: getrusage(RUSAGE_SELF) of the bench process (all threads; on SQLite the store runs inside it); \
                 agent processes: /proc/PID/stat; database: {}",
                if self.server.is_some() {
                    "the local PostgreSQL server's postmaster, its live children and its reaped children, /proc/PID/stat (other clients' work on that server counts too)"
                } else {
                    self.server_unmeasured
                }
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_command_name_whatever_it_holds() {
        let line = "4242 (postgres: a) (b) 7) S 17 4242 4242 0 -1 4194304 10 0 0 0 250 31 9 4 20 0 1 0 100 0 0";
        assert_eq!(parse_stat(line), Some(Stat { parent: 17, own_ticks: 281, reaped_ticks: 13 }));
        assert_eq!(parse_stat("4242 (truncated"), None);
    }

    #[test]
    fn a_server_is_found_by_a_postmaster_pid_file_naming_a_live_process() {
        let dir = tempfile::tempdir().unwrap();
        assert!(LocalServer::find(dir.path()).is_none(), "no postmaster.pid");
        std::fs::write(dir.path().join("postmaster.pid"), format!("{}\n/data\n", std::process::id())).unwrap();
        let server = LocalServer::find(dir.path()).expect("this process stands in for the postmaster");
        assert!(server.cpu().is_some());
        std::fs::write(dir.path().join("postmaster.pid"), "not a pid\n").unwrap();
        assert!(LocalServer::find(dir.path()).is_none());
    }

    #[test]
    fn the_report_divides_by_the_workflows_and_leaves_out_what_was_not_measured() {
        let meter = CpuMeter::new(Vec::new(), None, "embedded");
        let before = CpuSample { own: Duration::from_millis(100), children: None, server: None };
        let after = CpuSample { own: Duration::from_millis(600), children: None, server: None };
        let report = meter.report(&before, &after, 1_000, Duration::from_secs(1));
        assert_eq!(report["rota_ms_per_workflow"], 0.5);
        assert_eq!(report["total_ms_per_workflow"], 0.5);
        assert_eq!(report["cores_busy"], 0.5);
        assert!(report["database_ms_per_workflow"].is_null() && report["agent_processes_ms_per_workflow"].is_null());
        assert!(report["how"].as_str().unwrap().contains("embedded"));
    }
}
