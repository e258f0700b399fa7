//! Recent activity per minute, from the event log: tasks received,
//! processed and ended in error, steps completed, and the latency of steps
//! (from an attempt's `StepStarted` to its `StepCompleted`).
//!
//! The cost is bounded whatever the store's size: [`read`] takes at most
//! [`EVENTS_READ_MAX`] of the newest events (by seq) and [`summarize`], a
//! pure function, counts them. When the window holds more events than that,
//! the answer says so ([`Activity::complete`] is false) rather than reading
//! more.
//!
//! Deliberately left out: anything older than [`MINUTES_MAX`] minutes, and
//! exactness past the bound. A step whose start fell before the events read
//! has no latency (its completion still counts). Minutes follow the
//! events' own `at`, which the writers take from their clocks: seq order
//! and time order may differ by a clock's skew between processes.

use std::collections::HashMap;

use rota_model::{StepName, TaskId, Timestamp};
use rota_store::{Event, EventKind, SharedStore};

/// The window when none is asked for, in minutes.
pub const MINUTES_DEFAULT: u32 = 15;
/// The longest window, in minutes.
pub const MINUTES_MAX: u32 = 60;
/// The most events one summary reads (the newest ones).
pub const EVENTS_READ_MAX: u32 = 20_000;

const MINUTE_MS: i64 = 60_000;

/// One minute of activity.
#[derive(Debug, Clone, PartialEq)]
pub struct Minute {
    /// When the minute starts (a whole minute since the epoch).
    pub start: Timestamp,
    /// Tasks submitted (`Received`).
    pub received: u64,
    /// Tasks that ended processed (`Processed`).
    pub processed: u64,
    /// Tasks that ended in error (`Error`).
    pub errors: u64,
    /// Steps completed (`StepCompleted`).
    pub steps_completed: u64,
    /// The median latency of the steps completed in this minute whose
    /// start was read, in milliseconds (nearest rank).
    pub step_latency_p50_ms: Option<f64>,
    /// Their 99th percentile.
    pub step_latency_p99_ms: Option<f64>,
}

/// Activity over a window of whole minutes.
#[derive(Debug, Clone, PartialEq)]
pub struct Activity {
    /// Every minute of the window, oldest first; the last one is the
    /// minute in progress.
    pub minutes: Vec<Minute>,
    /// How many events were read.
    pub events_read: usize,
    /// Whether every event of the window was read: fewer than the bound
    /// came back, or the oldest one read is older than the window.
    pub complete: bool,
}

/// Reads the newest events (at most [`EVENTS_READ_MAX`]) and summarizes
/// the `minutes` up to `now` (at most [`MINUTES_MAX`]; the caller checks).
pub async fn read(store: &SharedStore, now: Timestamp, minutes: u32) -> rota_store::Result<Activity> {
    let events = store.latest_events(EVENTS_READ_MAX).await?;
    Ok(summarize(&events, now, minutes, EVENTS_READ_MAX as usize))
}

/// The activity of the `minutes` whole minutes up to the one holding `now`,
/// from `events` (newest first, as `latest_events` returns them), of which
/// at most `read_max` were asked for.
pub fn summarize(events: &[Event], now: Timestamp, minutes: u32, read_max: usize) -> Activity {
    let last_start = now.as_millis().div_euclid(MINUTE_MS) * MINUTE_MS;
    let first_start = last_start - i64::from(minutes.saturating_sub(1)) * MINUTE_MS;
    let slot = |at: Timestamp| -> Option<usize> {
        let at = at.as_millis();
        (at >= first_start && at < last_start + MINUTE_MS).then(|| ((at - first_start) / MINUTE_MS) as usize)
    };
    let mut counts = vec![Counts::default(); minutes as usize];
    let mut started: HashMap<(&TaskId, &StepName, u32), Timestamp> = HashMap::new();
    // Oldest first, so that a step's start is known when its completion comes.
    for event in events.iter().rev() {
        if let (EventKind::StepStarted, Some(step), Some(attempt)) = (event.kind, &event.step, event.attempt) {
            started.insert((&event.task_id, step, attempt), event.at);
        }
        let Some(index) = slot(event.at) else { continue };
        let minute = &mut counts[index];
        match event.kind {
            EventKind::Received => minute.received += 1,
            EventKind::Processed => minute.processed += 1,
            EventKind::Error => minute.errors += 1,
            EventKind::StepCompleted => {
                minute.steps_completed += 1;
                let start = match (&event.step, event.attempt) {
                    (Some(step), Some(attempt)) => started.get(&(&event.task_id, step, attempt)),
                    _ => None,
                };
                if let Some(start) = start {
                    minute.latencies_ms.push(event.at.as_millis().saturating_sub(start.as_millis()).max(0));
                }
            }
            _ => {}
        }
    }
    let oldest = events.last().map(|event| event.at.as_millis());
    let complete = events.len() < read_max || oldest.is_some_and(|at| at < first_start);
    let minutes = counts
        .into_iter()
        .enumerate()
        .map(|(index, mut counted)| {
            counted.latencies_ms.sort_unstable();
            Minute {
                start: Timestamp::from_millis(first_start + index as i64 * MINUTE_MS),
                received: counted.received,
                processed: counted.processed,
                errors: counted.errors,
                steps_completed: counted.steps_completed,
                step_latency_p50_ms: percentile(&counted.latencies_ms, 50),
                step_latency_p99_ms: percentile(&counted.latencies_ms, 99),
            }
        })
        .collect();
    Activity { minutes, events_read: events.len(), complete }
}

/// What one minute counted before its percentiles are taken.
#[derive(Debug, Clone, Default)]
struct Counts {
    received: u64,
    processed: u64,
    errors: u64,
    steps_completed: u64,
    latencies_ms: Vec<i64>,
}

/// The nearest-rank `p`th percentile of `sorted`, `None` when empty.
fn percentile(sorted: &[i64], p: usize) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    Some(sorted[rank - 1] as f64)
}

#[cfg(test)]
mod tests {
    use rota_store::Event;
    use serde_json::json;

    use super::*;

    /// 10:00:00.000 on some day, a whole minute.
    const T0: i64 = 1_700_000_040_000;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(T0 + ms)
    }

    fn task_event(task: &str, kind: EventKind, ms: i64) -> Event {
        Event::task(&TaskId::new(task).unwrap(), at(ms), kind, json!({}))
    }

    fn step_event(task: &str, step: &str, attempt: u32, kind: EventKind, ms: i64) -> Event {
        let mut event = task_event(task, kind, ms);
        event.step = Some(StepName::new(step).unwrap());
        event.attempt = Some(attempt);
        event
    }

    /// Summarizes `oldest_first` the way the store hands events over:
    /// newest first, with seqs in order.
    fn check(oldest_first: Vec<Event>, now_ms: i64, minutes: u32, read_max: usize) -> Activity {
        let mut events: Vec<Event> =
            oldest_first.into_iter().enumerate().map(|(seq, event)| Event { seq: seq as i64 + 1, ..event }).collect();
        events.reverse();
        summarize(&events, at(now_ms), minutes, read_max)
    }

    #[test]
    fn every_minute_of_the_window_is_listed_oldest_first_even_when_empty() {
        let activity = check(Vec::new(), 30_000, 3, 100);
        let starts: Vec<i64> = activity.minutes.iter().map(|m| m.start.as_millis() - T0).collect();
        assert_eq!(starts, [-120_000, -60_000, 0], "the last minute holds now");
        assert!(activity.minutes.iter().all(|m| m.received == 0 && m.step_latency_p50_ms.is_none()));
        assert_eq!((activity.events_read, activity.complete), (0, true));
    }

    #[test]
    fn events_are_counted_in_their_minute_and_latency_pairs_start_and_completion() {
        let events = vec![
            task_event("old", EventKind::Received, -200_000), // before the window
            task_event("a", EventKind::Received, -70_000),
            step_event("a", "charge", 1, EventKind::StepStarted, -65_000),
            step_event("a", "charge", 1, EventKind::StepFailed, -64_000),
            step_event("a", "charge", 2, EventKind::StepStarted, -61_000),
            step_event("a", "charge", 2, EventKind::StepCompleted, -59_000), // 2 s, attempt 2's start
            task_event("a", EventKind::Processed, -59_000),
            task_event("b", EventKind::Received, 1_000),
            step_event("b", "charge", 1, EventKind::StepStarted, 1_000),
            step_event("b", "charge", 1, EventKind::StepCompleted, 1_100), // 100 ms
            step_event("c", "ship", 1, EventKind::StepCompleted, 2_000),   // its start was not read
            task_event("b", EventKind::Error, 3_000),
            task_event("future", EventKind::Received, 90_000), // after the window
        ];
        let activity = check(events, 30_000, 2, 100);
        let rows: Vec<(i64, u64, u64, u64, u64, Option<f64>)> = activity
            .minutes
            .iter()
            .map(|m| (m.start.as_millis() - T0, m.received, m.processed, m.errors, m.steps_completed, m.step_latency_p50_ms))
            .collect();
        assert_eq!(rows, [(-60_000, 0, 1, 0, 1, Some(2_000.0)), (0, 1, 0, 1, 2, Some(100.0))]);
        assert_eq!(activity.minutes[1].step_latency_p99_ms, Some(100.0), "only completions with a start have a latency");
        assert_eq!((activity.events_read, activity.complete), (13, true));
        assert_eq!(check(vec![task_event("a", EventKind::Received, -70_000)], 30_000, 2, 100).minutes[0].received, 0);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let latencies: Vec<i64> = (1..=200).collect();
        assert_eq!(percentile(&latencies, 50), Some(100.0));
        assert_eq!(percentile(&latencies, 99), Some(198.0));
        assert_eq!(percentile(&[7], 99), Some(7.0));
        assert_eq!(percentile(&[], 50), None);
        let mut events = Vec::new();
        for (i, ms) in [10, 20, 30, 40].into_iter().enumerate() {
            let task = format!("t{i}");
            events.push(step_event(&task, "s", 1, EventKind::StepStarted, 0));
            events.push(step_event(&task, "s", 1, EventKind::StepCompleted, ms));
        }
        let minute = &check(events, 0, 1, 100).minutes[0];
        assert_eq!((minute.step_latency_p50_ms, minute.step_latency_p99_ms), (Some(20.0), Some(40.0)));
    }

    #[test]
    fn a_full_read_is_complete_only_if_it_reaches_back_past_the_window() {
        let busy: Vec<Event> = (0..10).map(|i| task_event(&format!("t{i}"), EventKind::Received, i * 1_000)).collect();
        let cut = check(busy.clone(), 30_000, 1, 10);
        assert_eq!((cut.events_read, cut.complete), (10, false), "the bound was reached inside the window");
        let mut reaching = vec![task_event("older", EventKind::Received, -100_000)];
        reaching.extend(busy.into_iter().skip(1));
        let whole = check(reaching, 30_000, 1, 10);
        assert_eq!((whole.events_read, whole.complete), (10, true), "the oldest event read is before the window");
    }
}
