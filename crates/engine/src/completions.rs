//! In-process notice of tasks reaching a terminal state, so that a caller
//! embedding the engine (`submit --wait`, the W benchmark) learns of it
//! without polling. Across processes, callers poll the store instead.

use std::time::Duration;

use rota_model::{TaskId, TaskState};
use tokio::sync::broadcast;

/// How many notices a slow listener may fall behind before it misses some
/// (it then re-reads the store).
const BACKLOG_MAX: usize = 16_384;

/// A broadcast of (task, terminal state) notices. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Completions {
    tx: broadcast::Sender<(TaskId, TaskState)>,
}

impl Default for Completions {
    fn default() -> Self {
        Completions { tx: broadcast::channel(BACKLOG_MAX).0 }
    }
}

impl Completions {
    /// Tells every listener that `task` reached `state`.
    pub fn publish(&self, task: TaskId, state: TaskState) {
        let _ = self.tx.send((task, state));
    }

    /// A listener for notices published from now on. Subscribe *before*
    /// submitting, so that a fast task's notice is not missed.
    pub fn subscribe(&self) -> broadcast::Receiver<(TaskId, TaskState)> {
        self.tx.subscribe()
    }

    /// Waits up to `timeout` for `task`'s terminal state on `listener`.
    /// Returns `None` on timeout or when the listener fell behind.
    pub async fn wait(listener: &mut broadcast::Receiver<(TaskId, TaskState)>, task: &TaskId, timeout: Duration) -> Option<TaskState> {
        let wait = async {
            loop {
                match listener.recv().await {
                    Ok((id, state)) if &id == task => return Some(state),
                    Ok(_) => continue,
                    Err(_) => return None,
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.ok().flatten()
    }
}
