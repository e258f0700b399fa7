//! SIGINT and SIGTERM for the long-running commands (`serve`, `queue consume`).

use anyhow::Context;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGINT and SIGTERM, registered before the store is opened, so that a
/// signal that arrives during start-up is not lost.
pub(crate) struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    /// Starts listening for both signals.
    pub(crate) fn new() -> anyhow::Result<Signals> {
        let interrupt = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
        let terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
        Ok(Signals { interrupt, terminate })
    }

    /// Waits for the next SIGINT or SIGTERM.
    pub(crate) async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}
