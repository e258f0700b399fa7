//! The backlog bound: with [`Limits::pending_max`](crate::Limits::pending_max)
//! set, a submission is answered 429 with `Retry-After` while the Pending
//! backlog is at the bound, instead of letting it grow without limit.
//!
//! The backlog is counted from the store (an exact count of the Pending
//! tasks, read from the state index) at most once per
//! [`Limits::pending_recount`](crate::Limits::pending_recount), and the
//! submissions this process accepts in between are added to the count, so
//! the bound costs one count a second however many submissions arrive.
//! Other processes' submissions and the tasks claimed meanwhile are seen at
//! the next count: the bound is approximate by that much, never by more.
//!
//! Deliberately left out: a bound per workflow or per submitter, and any
//! queueing of refused submissions (the client retries after `Retry-After`).

use rota_model::{Clock, TaskState, Timestamp};
use rota_store::{SharedStore, TaskFilter};
use tokio::sync::Mutex;

use crate::error::{ApiError, ApiResult};

/// The last count of the Pending backlog, and when it was read.
#[derive(Default)]
pub(crate) struct Backlog {
    counted: Mutex<Option<(Timestamp, u64)>>,
}

impl Backlog {
    /// Refuses a submission while the backlog is at `pending_max`, counting
    /// it again first when the last count is `recount` old.
    pub(crate) async fn admit(
        &self,
        store: &SharedStore,
        clock: &dyn Clock,
        pending_max: u64,
        recount: std::time::Duration,
    ) -> ApiResult<()> {
        // Held while counting, so that one count serves every submission
        // waiting for it.
        let mut counted = self.counted.lock().await;
        let now = clock.now();
        let pending = match *counted {
            Some((at, pending)) if now.since(at) < recount && at <= now => pending,
            _ => {
                let filter = TaskFilter { state: Some(TaskState::Pending), ..TaskFilter::default() };
                let counts = store.count_tasks(&filter).await.map_err(|err| ApiError::store("submit", err))?;
                let pending = counts.iter().filter(|(state, _)| *state == TaskState::Pending).map(|(_, n)| *n).sum();
                *counted = Some((now, pending));
                pending
            }
        };
        if pending >= pending_max {
            return Err(ApiError::backlog_full(pending, pending_max, recount));
        }
        Ok(())
    }

    /// Counts a submission accepted since the last count.
    pub(crate) async fn accepted(&self) {
        if let Some((_, pending)) = self.counted.lock().await.as_mut() {
            *pending += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use rota_model::{ManualClock, Task, TaskId, WorkflowName};
    use rota_store::{Changes, NewTask, TaskWrite};
    use serde_json::json;

    use super::*;

    const RECOUNT: Duration = Duration::from_secs(1);

    async fn create(store: &SharedStore, id: &str, now: Timestamp) {
        let task = Task::new(TaskId::new(id).unwrap(), WorkflowName::new("w").unwrap(), 1, json!({}), now);
        store.create_task(NewTask { task, steps: Vec::new(), messages: Vec::new(), events: Vec::new() }).await.unwrap();
    }

    #[tokio::test]
    async fn the_backlog_is_counted_at_most_once_per_recount_and_grows_with_what_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_800_000_000_000)));
        let config = rota_store_sqlite::Config::new(dir.path().join("backlog.db"));
        let store: SharedStore = Arc::new(rota_store_sqlite::SqliteStore::open(config, clock.clone()).unwrap());
        let backlog = Backlog::default();
        create(&store, "a", clock.now()).await;

        backlog.admit(&store, clock.as_ref(), 3, RECOUNT).await.expect("1 of 3");
        backlog.accepted().await;
        create(&store, "b", clock.now()).await;
        backlog.admit(&store, clock.as_ref(), 3, RECOUNT).await.expect("2 of 3, from the count and what was accepted");
        backlog.accepted().await;
        create(&store, "c", clock.now()).await;
        let full = backlog.admit(&store, clock.as_ref(), 3, RECOUNT).await.expect_err("3 of 3");
        assert_eq!((full.status.as_u16(), full.code, full.retry_after), (429, "backlog_full", Some(RECOUNT)));
        assert!(full.reason.contains("3 tasks are waiting to start, at the bound of 3"), "{}", full.reason);

        // A task starts (leaves Pending): seen at the next count only.
        let a = store.task(&TaskId::new("a").unwrap()).await.unwrap().unwrap().task;
        let cancelled = a.cancel(false, clock.now()).unwrap();
        store.commit(Changes { tasks: vec![TaskWrite::replacing(&a, cancelled)], ..Changes::default() }).await.unwrap();
        clock.advance(RECOUNT - Duration::from_millis(1));
        assert!(backlog.admit(&store, clock.as_ref(), 3, RECOUNT).await.is_err(), "not counted again before the recount");
        clock.advance(Duration::from_millis(1));
        backlog.admit(&store, clock.as_ref(), 3, RECOUNT).await.expect("counted again: 2 of 3");

        // A clock stepped back counts again rather than trusting a count
        // from the future.
        backlog.accepted().await;
        create(&store, "d", clock.now()).await;
        assert!(backlog.admit(&store, clock.as_ref(), 3, RECOUNT).await.is_err(), "3 of 3 again");
        let c = store.task(&TaskId::new("c").unwrap()).await.unwrap().unwrap().task;
        let cancelled = c.cancel(false, clock.now()).unwrap();
        store.commit(Changes { tasks: vec![TaskWrite::replacing(&c, cancelled)], ..Changes::default() }).await.unwrap();
        clock.set(clock.now().sub(Duration::from_secs(60)));
        backlog.admit(&store, clock.as_ref(), 3, RECOUNT).await.expect("counted again: 2 of 3");
    }
}
