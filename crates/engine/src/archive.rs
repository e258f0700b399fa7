//! Retention's archive: before a batch of finished tasks is deleted, its
//! tasks are written, as export lines ([`crate::export::Line`]), to a new
//! file of a directory, and the file is made durable first.
//!
//! A batch goes to `tasks-<time>-<n>.jsonl.partial`, is fsynced, renamed
//! to `tasks-<time>-<n>.jsonl`, and the directory is fsynced; only then are
//! the tasks deleted (exactly those written: `rota_store::Prune::only`).
//! So a crash at any point loses no task: before the rename the tasks are
//! all still in the store (a `.partial` file is ignored, and they are
//! written again by the next pass); after it, the file holds them. A crash
//! between the rename and the delete leaves a task in the store and in the
//! archive, and the next pass writes it to a second file: an archive may
//! hold a task twice (`rota import` keeps the first line it reads). A task
//! an operator resubmitted between the write and the delete is kept in the
//! store; the archive holds it as it was.
//!
//! Deliberately left out: rotating or compressing the files (the
//! operator's tools do that), and archiving to anything but a local
//! directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rota_model::Timestamp;

use crate::export::Line;
use crate::{Error, Result};

/// The suffix of a finished archive file.
pub const SUFFIX: &str = ".jsonl";
/// The suffix of a file being written: never read as part of the archive.
pub const PARTIAL_SUFFIX: &str = ".jsonl.partial";

/// A directory that finished tasks are archived to. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Archive {
    dir: Arc<PathBuf>,
    files: Arc<AtomicU64>,
}

impl Archive {
    /// Archives to `dir`, created if missing. Fails, naming the directory,
    /// if it cannot be created or is not a directory.
    pub fn open(dir: &Path) -> Result<Archive> {
        fs::create_dir_all(dir).map_err(|e| Error::Export(format!("archive directory {}: {e}", dir.display())))?;
        if !dir.is_dir() {
            return Err(Error::Export(format!("archive directory {} is not a directory", dir.display())));
        }
        Ok(Archive { dir: Arc::new(dir.to_owned()), files: Arc::new(AtomicU64::new(0)) })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `lines` to a new file of the archive and returns its path
    /// once the file and its name are durable. `now` names the file.
    pub async fn write(&self, lines: Vec<Line>, now: Timestamp) -> Result<PathBuf> {
        let archive = self.clone();
        tokio::task::spawn_blocking(move || archive.write_durably(&lines, now))
            .await
            .map_err(|e| Error::Export(format!("archive write stopped: {e}")))?
            .map_err(|e| Error::Export(format!("cannot archive to {}: {e}", self.dir.display())))
    }

    fn write_durably(&self, lines: &[Line], now: Timestamp) -> io::Result<PathBuf> {
        let (partial, done, file) = self.create_new(now)?;
        let mut out = BufWriter::new(file);
        for line in lines {
            out.write_all(line.to_json().as_bytes())?;
            out.write_all(b"\n")?;
        }
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        fs::rename(&partial, &done)?;
        File::open(&*self.dir)?.sync_all()?;
        Ok(done)
    }

    /// A file no one else writes: the name carries the time and a counter,
    /// and creating it fails if it exists (another process archiving to the
    /// same directory at the same millisecond), so the next name is tried.
    /// Returns the file being written and the name it gets when done.
    fn create_new(&self, now: Timestamp) -> io::Result<(PathBuf, PathBuf, File)> {
        loop {
            let n = self.files.fetch_add(1, Ordering::Relaxed);
            let name = format!("tasks-{:013}-{n:04}", now.as_millis());
            let (partial, done) = (self.dir.join(format!("{name}{PARTIAL_SUFFIX}")), self.dir.join(format!("{name}{SUFFIX}")));
            if done.exists() {
                continue;
            }
            match OpenOptions::new().write(true).create_new(true).open(&partial) {
                Ok(file) => return Ok((partial, done, file)),
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(err) => return Err(err),
            }
        }
    }
}

/// The finished files of an archive directory, sorted by name (by the time
/// they were written): the `.jsonl` files, without the `.partial` ones.
pub fn files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.is_file() && path.to_string_lossy().ends_with(SUFFIX))
        .collect();
    files.sort();
    Ok(files)
}
