//! [`Shutdown`]: the signal that tells long-running components to stop.
//!
//! One type, cheap to clone, that both triggers and observes: the process's
//! signal handler (or a test) calls [`Shutdown::trigger`], and every component
//! that received a clone sees it through [`Shutdown::triggered`]. It is a
//! level, not an event: a component that starts after the trigger stops at
//! once. Deliberately left out: how long a component may take to stop, which
//! each component bounds in its own `Config`.

use std::sync::Arc;

use tokio::sync::watch;

/// A shutdown signal shared by every component of a process.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let shutdown = rota_engine::Shutdown::new();
/// let observer = shutdown.clone();
/// let waiting = tokio::spawn(async move { observer.triggered().await });
/// shutdown.trigger();
/// waiting.await.unwrap();
/// assert!(shutdown.is_triggered());
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct Shutdown {
    // The sender is shared (never dropped while a clone lives), so receivers
    // subscribed from it never see the channel close.
    tx: Arc<watch::Sender<bool>>,
}

impl Shutdown {
    /// A signal that has not been triggered.
    pub fn new() -> Self {
        Shutdown { tx: Arc::new(watch::Sender::new(false)) }
    }

    /// Triggers the signal. Idempotent.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    /// Whether the signal has been triggered.
    pub fn is_triggered(&self) -> bool {
        *self.tx.borrow()
    }

    /// Resolves once the signal is triggered (at once if it already was).
    pub async fn triggered(&self) {
        let mut rx = self.tx.subscribe();
        // `wait_for` fails only when the sender is gone, and `self` holds it.
        let _ = rx.wait_for(|triggered| *triggered).await;
    }
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown::new()
    }
}
