//! The flusher thread: makes committed batches durable while the writer
//! runs the next one.
//!
//! With `synchronous=FULL`, SQLite flushes the WAL inside `COMMIT`, so the
//! one writer thread sits idle for every flush and a batch cannot start
//! before the last one is on disk. Instead, with [`Durability::Full`] the
//! writer commits with `synchronous=NORMAL` (the WAL is written, not
//! flushed; SQLite keeps the file consistent either way) and hands the
//! batch's replies here. This thread flushes the WAL file (`fdatasync` on a
//! descriptor of its own: Linux flushes the file, whichever descriptor wrote
//! it) and only then replies, to every batch committed before the flush
//! began. So a caller's success still means "durable", every batch waiting
//! shares one flush, and the writer's next batch runs during the flush.
//!
//! What changes for readers: another connection can read a commit up to one
//! flush before it is durable. Nothing reaches a caller of this store
//! before then (every write and every receive, a lease being a write,
//! replies from here), except a caller that acts only by writing to this
//! store (see [`crate::writer::ReplyAt::Commit`]). And anything written
//! after reading such a commit lands later in the same WAL, so no flush
//! can make it durable without its cause.
//!
//! A failed flush leaves the file's durable state unknown, so the store
//! stops: that batch and every later write fail with the flush's error.
//!
//! [`Durability::Full`]: crate::Durability::Full

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use rota_model::LeaseToken;
use rota_store::{Delivery, Error, Result};

use crate::writer::{CommitStats, Parked, Settle};

/// The most committed batches that may wait for a flush; past it the writer
/// waits too, so that callers' memory stays bounded when the disk is slow.
pub(crate) const BATCHES_AWAITING_FLUSH_MAX: usize = 256;

/// A committed batch whose replies wait for the flush.
pub(crate) struct Committed {
    pub settles: Vec<Settle>,
    pub served: Vec<(Parked, Result<Vec<Delivery>>)>,
}

impl Committed {
    /// A batch with no one to answer.
    pub(crate) fn nothing() -> Self {
        Committed { settles: Vec::new(), served: Vec::new() }
    }

    /// Whether no one waits for this batch's flush.
    pub(crate) fn is_empty(&self) -> bool {
        self.settles.is_empty() && self.served.is_empty()
    }

    /// Takes on the callers of a batch committed later: one flush answers both.
    pub(crate) fn absorb(&mut self, later: Committed) {
        self.settles.extend(later.settles);
        self.served.extend(later.served);
    }
}

/// The WAL file and whether flushing it ever failed.
struct Wal {
    path: PathBuf,
    file: Option<File>,
    failure: Option<String>,
    stats: Arc<CommitStats>,
}

impl Wal {
    /// Flushes the WAL file; after a failure, every later call fails too.
    fn flush(&mut self) -> Option<String> {
        if self.failure.is_some() {
            return self.failure.clone();
        }
        let result = match &self.file {
            Some(file) => file.sync_data(),
            None => File::open(&self.path).and_then(|file| {
                let synced = file.sync_data();
                self.file = Some(file);
                synced
            }),
        };
        match result {
            Ok(()) => {
                self.stats.flushes.fetch_add(1, Ordering::Relaxed);
                None
            }
            Err(err) => {
                let failure = format!("cannot flush {} to disk: {err}; the store stops writing, restart the process", self.path.display());
                tracing::error!("{failure}");
                self.failure = Some(failure);
                self.failure.clone()
            }
        }
    }
}

/// The writer's side: hands over committed batches, and learns whether a
/// flush failed and which leases came back unwanted.
pub(crate) struct FlushHandle {
    batches: Option<SyncSender<Committed>>,
    thread: Option<std::thread::JoinHandle<()>>,
    wal: Arc<Mutex<Wal>>,
    orphaned: Arc<Mutex<Vec<LeaseToken>>>,
    #[cfg(test)]
    gate: FlushGate,
}

/// Lets a test hold every flush back, to see what is answered before one.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct FlushGate(Arc<Mutex<()>>);

#[cfg(test)]
impl FlushGate {
    /// No flush starts until the guard is dropped.
    pub(crate) fn hold(&self) -> std::sync::MutexGuard<'_, ()> {
        lock(&self.0)
    }
}

impl FlushHandle {
    /// Starts the flusher of the WAL beside `database`.
    pub(crate) fn start(database: &std::path::Path, stats: Arc<CommitStats>) -> Result<FlushHandle> {
        let mut path = database.as_os_str().to_owned();
        path.push("-wal");
        let wal = Arc::new(Mutex::new(Wal { path: PathBuf::from(path), file: None, failure: None, stats }));
        let orphaned = Arc::new(Mutex::new(Vec::new()));
        let (batches, receiver) = std::sync::mpsc::sync_channel(BATCHES_AWAITING_FLUSH_MAX);
        let (thread_wal, thread_orphaned) = (wal.clone(), orphaned.clone());
        #[cfg(test)]
        let gate = FlushGate::default();
        #[cfg(test)]
        let thread_gate = gate.clone();
        let thread = std::thread::Builder::new()
            .name("rota-sqlite-flusher".into())
            .spawn(move || {
                run(
                    &receiver,
                    &thread_wal,
                    &thread_orphaned,
                    #[cfg(test)]
                    &thread_gate,
                );
            })
            .map_err(|e| Error::Backend(format!("cannot start the flusher thread: {e}")))?;
        Ok(FlushHandle {
            batches: Some(batches),
            thread: Some(thread),
            wal,
            orphaned,
            #[cfg(test)]
            gate,
        })
    }

    #[cfg(test)]
    pub(crate) fn gate(&self) -> FlushGate {
        self.gate.clone()
    }

    /// Why the store stopped writing, if a flush failed.
    pub(crate) fn failure(&self) -> Option<String> {
        lock(&self.wal).failure.clone()
    }

    /// Leases of receivers that went away before their reply.
    pub(crate) fn take_orphaned(&self) -> Vec<LeaseToken> {
        std::mem::take(&mut *lock(&self.orphaned))
    }

    /// Flushes on the writer's own thread and replies: when no other work
    /// waits for the writer, a handover to the flusher thread would only
    /// add a wake-up to a lone caller's wait.
    pub(crate) fn flush_here_then_reply(&self, batch: Committed) {
        #[cfg(test)]
        let _held = self.gate.hold();
        let failure = lock(&self.wal).flush();
        reply_all(batch, failure.as_deref(), &self.orphaned);
    }

    /// Hands over a committed batch; its replies go out after the next flush.
    pub(crate) fn flush_then_reply(&self, batch: Committed) {
        if let Some(batches) = &self.batches
            && let Err(returned) = batches.send(batch)
        {
            // Only if the thread is gone (it panicked): flush here instead.
            self.flush_here_then_reply(returned.0);
        }
    }
}

impl Drop for FlushHandle {
    /// Replies to what is still waiting, flushed, before the writer reports the store closed.
    fn drop(&mut self) {
        self.batches = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding it leaves plain data, still usable.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The flusher thread: one flush for every batch waiting, then their replies.
fn run(batches: &Receiver<Committed>, wal: &Mutex<Wal>, orphaned: &Mutex<Vec<LeaseToken>>, #[cfg(test)] gate: &FlushGate) {
    let mut waiting = Vec::new();
    while let Ok(first) = batches.recv() {
        waiting.push(first);
        // Every batch handed over by now is committed, so in the WAL: one flush covers them all.
        while let Ok(batch) = batches.try_recv() {
            waiting.push(batch);
        }
        #[cfg(test)]
        let held = gate.hold();
        let failure = lock(wal).flush();
        #[cfg(test)]
        drop(held);
        for batch in waiting.drain(..) {
            reply_all(batch, failure.as_deref(), orphaned);
        }
    }
}

/// Replies to a batch's callers: success unless `failure` says otherwise.
fn reply_all(batch: Committed, failure: Option<&str>, orphaned: &Mutex<Vec<LeaseToken>>) {
    for settle in batch.settles {
        settle(failure);
    }
    for (parked, result) in batch.served {
        let result = match failure {
            Some(err) => Err(Error::Backend(err.to_owned())),
            None => result,
        };
        let tokens: Vec<LeaseToken> = match (&result, failure) {
            (Ok(deliveries), None) => deliveries.iter().map(|d| d.lease_token).collect(),
            _ => Vec::new(),
        };
        if parked.reply.send(result).is_err() {
            lock(orphaned).extend(tokens);
        }
    }
}
