//! The SQLite store's disk fills up under a running `rota serve`: writes
//! fail with an error naming the store's file, nothing committed is lost,
//! the file stays intact, and once space is freed the engine goes on and
//! finishes every task it acknowledged.
//!
//! The store lives on a small tmpfs mounted for the test (root only; the
//! test prints a SKIP line when it cannot mount one).

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Rota, Serve};

/// The file system's size: room for the store and its WAL, quickly filled.
const TMPFS_SIZE: &str = "8m";
/// How long the engine may take to finish everything once space is back.
const FINISH_TIMEOUT: Duration = Duration::from_secs(60);
/// The most submissions tried on the full disk before one must fail (a
/// few may fit in pages the WAL already has).
const TRIES_WHILE_FULL: usize = 200;

const QUICK: &str = "name: quick\nversion: 1\nsteps:\n  - { name: nap, agent: delay, with: { ms: 5 } }\n";

/// A tmpfs mounted on a fresh directory, unmounted when dropped.
struct Tmpfs {
    mount_point: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts one, or says why it cannot.
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mount_point = dir.path().join("mnt");
        std::fs::create_dir(&mount_point).map_err(|e| e.to_string())?;
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "rota-disk-full"])
            .arg(&mount_point)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !output.status.success() {
            return Err(format!("mount -t tmpfs failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
        }
        Ok(Tmpfs { mount_point, _dir: dir })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount").arg(&self.mount_point).status().is_ok_and(|s| s.success())
            // Busy (a process not yet reaped): detach it now, freed when unused.
            || Command::new("umount").arg("-l").arg(&self.mount_point).status().is_ok_and(|s| s.success());
        if !unmounted {
            eprintln!("note: could not unmount {}", self.mount_point.display());
        }
    }
}

/// Writes to `path` until the file system is full; returns the bytes written.
fn fill(path: &Path) -> u64 {
    let mut file = std::fs::File::create(path).unwrap();
    let mut written = 0;
    for chunk in [1 << 16, 1 << 12, 1 << 9, 1] {
        let block = vec![0xa5_u8; chunk];
        while file.write_all(&block).and_then(|()| file.flush()).is_ok() {
            written += chunk as u64;
        }
    }
    let _ = file.sync_all();
    written
}

fn submit(rota: &Rota, id: &str) -> Result<(), String> {
    let output = rota.command(&["submit", "quick", "--id", id]).output().unwrap();
    if output.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&output.stderr).into_owned()) }
}

#[test]
fn sqlite_disk_full_fails_clearly_loses_nothing_and_recovers() {
    let tmpfs = match Tmpfs::mount(TMPFS_SIZE) {
        Ok(tmpfs) => tmpfs,
        Err(why) => {
            println!("SKIP sqlite_disk_full_fails_clearly_loses_nothing_and_recovers: cannot mount a tmpfs ({why}); run as root");
            return;
        }
    };
    let db = tmpfs.mount_point.join("q.db");
    let url = format!("sqlite://{}", db.display());
    let rota = Rota::with_store(&url);
    let workflows = rota.dir().join("workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    std::fs::write(workflows.join("quick.yaml"), QUICK).unwrap();
    let serve = Serve::start(&url, &["--workflows", workflows.to_str().unwrap(), "--instance-id", "full", "--listen", "none"]);

    let mut acknowledged = BTreeSet::new();
    for i in 0..20 {
        let id = format!("before-{i}");
        submit(&rota, &id).unwrap_or_else(|err| panic!("{id}: {err}"));
        acknowledged.insert(id);
    }

    // Fill the disk; submissions must then fail, each naming the file.
    let filler = tmpfs.mount_point.join("filler");
    let filled = fill(&filler);
    let mut refused = Vec::new();
    for i in 0..TRIES_WHILE_FULL {
        let id = format!("full-{i}");
        match submit(&rota, &id) {
            Ok(()) => {
                acknowledged.insert(id);
            }
            Err(err) => refused.push(err),
        }
        if refused.len() >= 3 {
            break;
        }
    }
    assert!(!refused.is_empty(), "{TRIES_WHILE_FULL} submissions all succeeded on a full disk ({filled} bytes of filler)");
    for err in &refused {
        assert!(err.contains("disk full") || err.contains("disk is full"), "the error says the disk is full: {err}");
        assert!(err.contains(&db.display().to_string()), "the error names the store's file {}: {err}", db.display());
    }
    std::thread::sleep(Duration::from_secs(1));
    let mut child_status = None;
    // The engine survives the full disk (its writes fail and are retried).
    let serve = {
        let mut serve = serve;
        if let Some(status) = serve.child.try_wait().unwrap() {
            child_status = Some(status);
        }
        serve
    };
    assert!(child_status.is_none(), "rota serve exited on a full disk ({child_status:?}):\n{}", serve.log());

    // Space again: the engine goes on, and finishes every acknowledged task.
    std::fs::remove_file(&filler).unwrap();
    for i in 0..10 {
        let id = format!("after-{i}");
        submit(&rota, &id).unwrap_or_else(|err| panic!("{id} after space was freed: {err}"));
        acknowledged.insert(id);
    }
    let deadline = Instant::now() + FINISH_TIMEOUT;
    loop {
        let tasks = rota.json(&["tasks", "--json", "--limit", "1000"]);
        let processed: BTreeSet<String> = tasks
            .as_array()
            .unwrap()
            .iter()
            .filter(|task| task["state"] == "processed")
            .map(|task| task["id"].as_str().unwrap().to_owned())
            .collect();
        let missing: Vec<&String> = acknowledged.difference(&processed).collect();
        if missing.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "not processed after {FINISH_TIMEOUT:?}: {missing:?}\n{}", serve.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(serve);

    let conn = rusqlite::Connection::open(&db).unwrap();
    let integrity: String = conn.query_row("PRAGMA integrity_check", [], |row| row.get(0)).unwrap();
    assert_eq!(integrity, "ok");
    drop(conn);
    eprintln!(
        "{} tasks acknowledged and processed; {} submissions refused on the full disk, e.g. {}",
        acknowledged.len(),
        refused.len(),
        refused[0].trim()
    );
    drop(tmpfs);
}
