//! `rota bench fill`: fills an empty store with many tasks, in every state
//! and across a few workflows, with the history a run would have left, to
//! measure what reads cost on a large store (see
//! `docs/dashboard-performance.md`). It is not a workload of the peer
//! benchmark and keeps its store.
//!
//! Everything goes through `Tasks::create_task` (a task, its one step and
//! its events in one creation, many in flight so that the backends share
//! commits), which writes a task in whatever state it is given: no step
//! runs, no message is sent. Task `fill-0000000` is the oldest; tasks are
//! spread [`SPACING`] apart, the newest created just now, so the last
//! minutes hold recent activity. Unfinished tasks are held by an instance
//! that does not exist (`fill-scheduler`) until a day from now, so that a
//! Supervisor running on the store finds nothing expired.
//!
//! Deliberately left out: queues (no doorbells, no step requests) and
//! workflows with more than one step.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use rota_engine::Workflows;
use rota_model::{Clock, InstanceId, Step, StepName, StepState, SystemClock, Tags, Task, TaskId, TaskState, Timestamp, WorkflowName};
use rota_store::{Created, Event, EventKind, NewTask, SharedStore};
use rota_workflow::{AgentCatalog, StepDef, Workflow};
use serde_json::json;
use tokio::task::JoinSet;

use crate::store_args::StoreArgs;
use crate::store_url::{STORE_URL_DEFAULT, StoreUrl};

/// The tasks a fill creates when `--tasks` is not given.
pub(crate) const TASKS_DEFAULT: u64 = 1_000_000;
/// The most creations in flight: enough for every group commit to be large.
const IN_FLIGHT_MAX: usize = 1_024;
/// Between two tasks' creation times.
const SPACING: Duration = Duration::from_millis(50);
/// How long the unfinished tasks' and steps' leases run.
const LEASE: Duration = Duration::from_secs(24 * 3600);
/// The workflows, with how many tasks in ten go to each.
const WORKFLOWS: [(&str, u64); 4] = [("orders", 5), ("refunds", 3), ("emails", 1), ("reports", 1)];
/// The states, with how many tasks in a hundred are in each.
const STATES: [(TaskState, u64); 7] = [
    (TaskState::Processed, 70),
    (TaskState::Error, 8),
    (TaskState::Cancelled, 5),
    (TaskState::Compensated, 3),
    (TaskState::Compensating, 2),
    (TaskState::Processing, 6),
    (TaskState::Pending, 6),
];
/// The finished states only, in a hundred: a store that has run for a
/// while and kept its history (`rota bench W --prefill`).
pub(crate) const FINISHED_STATES: [(TaskState, u64); 4] =
    [(TaskState::Processed, 80), (TaskState::Error, 10), (TaskState::Cancelled, 6), (TaskState::Compensated, 4)];
/// How many customers the `customer` tag spreads the tasks over: a tag
/// value selects one task in this many (sparse), while `region`'s four
/// values each select a quarter (dense).
pub(crate) const CUSTOMERS: u64 = 1_000;
/// The `region` tag's values.
const REGIONS: [&str; 4] = ["eu", "us", "apac", "latam"];
/// The one step of every filled workflow.
const STEP: &str = "work";
/// The holder of the unfinished tasks.
const HOLDER: &str = "fill-scheduler";

/// Fills the store `store_args` names with `tasks` tasks.
pub(crate) async fn run(store_args: &StoreArgs, tasks: u64) -> anyhow::Result<()> {
    let url = store_args.url.trim();
    if url == "sqlite" || url == STORE_URL_DEFAULT {
        bail!("`rota bench fill` keeps the store it fills: name it, e.g. --store sqlite:///tmp/rota-1m.db");
    }
    if let StoreUrl::Sqlite(path) = StoreUrl::parse(url)?
        && path.exists()
    {
        bail!("{} already exists: a fill starts from an empty store, so give a new file", path.display());
    }
    let store = store_args.open().await?;
    let took = create(&store, tasks, &STATES).await?;
    let counts = store.count_tasks(&rota_store::TaskFilter::default()).await?;
    let rate = tasks as f64 / took.as_secs_f64().max(1e-9);
    println!("{url}: {tasks} tasks created in {:.1} s ({rate:.0} tasks/s)", took.as_secs_f64());
    for (state, count) in counts {
        println!("  {:<12} {count}", state.as_str());
    }
    Ok(())
}

/// Creates `tasks` tasks in the empty store `store`, their states drawn
/// from `states` (weights), with a progress bar; returns how long it took.
pub(crate) async fn create(store: &SharedStore, tasks: u64, states: &'static [(TaskState, u64)]) -> anyhow::Result<Duration> {
    let existing: u64 = store.count_tasks(&rota_store::TaskFilter::default()).await?.iter().map(|(_, n)| n).sum();
    if existing > 0 {
        bail!("the store holds {existing} tasks already: a fill starts from an empty store");
    }
    let workflows = Workflows::new(store.clone());
    for (name, _) in WORKFLOWS {
        let workflow = Workflow::builder(name, 1)
            .step(StepDef::new(STEP, "delay").with_input(json!({ "ms": 10 })))
            .build(&AgentCatalog::builtin())
            .map_err(|problems| anyhow::anyhow!("workflow {name}: {problems}"))?;
        workflows.register(&workflow).await.with_context(|| format!("cannot register workflow {name}"))?;
    }

    let now = SystemClock.now();
    let first = Timestamp::from_millis(now.as_millis() - SPACING.as_millis() as i64 * tasks as i64);
    let progress = ProgressBar::new(tasks).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} tasks, {per_sec}, {eta} left").unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = Instant::now();
    let mut running: JoinSet<anyhow::Result<()>> = JoinSet::new();
    for i in 0..tasks {
        while running.len() >= IN_FLIGHT_MAX {
            running.join_next().await.context("a creation ended")???;
            progress.inc(1);
        }
        let created_at = Timestamp::from_millis(first.as_millis() + SPACING.as_millis() as i64 * i as i64);
        let new = filled(i, created_at, now, states);
        let store: SharedStore = Arc::clone(store);
        running.spawn(async move {
            match store.create_task(new).await? {
                Created::New => Ok(()),
                Created::Existing(record) => bail!("task {} existed already", record.task.id),
            }
        });
    }
    while let Some(done) = running.join_next().await {
        done??;
        progress.inc(1);
    }
    progress.finish_and_clear();
    Ok(started.elapsed())
}

/// Which of `table`'s entries `n` falls in, each as wide as its weight.
fn pick<T: Copy>(table: &[(T, u64)], n: u64) -> T {
    let total: u64 = table.iter().map(|(_, weight)| weight).sum();
    let mut n = n % total;
    for (entry, weight) in table {
        if n < *weight {
            return *entry;
        }
        n -= weight;
    }
    unreachable!("n is below the total weight")
}

/// Task `i`, created at `created_at`, as a run that reached its state
/// would have left it, with its step and history. The state is drawn from a
/// multiplicative hash of `i`, so that states do not follow workflows.
fn filled(i: u64, created_at: Timestamp, now: Timestamp, states: &[(TaskState, u64)]) -> NewTask {
    let id = TaskId::new(format!("fill-{i:07}")).expect("a valid task id");
    let workflow = WorkflowName::new(pick(&WORKFLOWS, i)).expect("a valid workflow name");
    let state = pick(states, i.wrapping_mul(2_654_435_761) >> 7);
    let latency_ms = 20 + (i % 80) as i64;
    let at = |ms: i64| Timestamp::from_millis(created_at.as_millis() + ms);
    let lease_until = now.add(LEASE);

    let mut task = Task::new(id.clone(), workflow, 1, json!({ "n": i }), created_at);
    task.tags = Tags::new([
        ("customer".to_owned(), format!("c{:03}", i % CUSTOMERS)),
        ("region".to_owned(), REGIONS[(i / 7) as usize % REGIONS.len()].to_owned()),
    ])
    .expect("valid tags");
    let mut step = Step::new(id.clone(), StepName::new(STEP).expect("a valid step name"), 0, created_at);
    let mut events = vec![Event::task(&id, created_at, EventKind::Received, json!({}))];
    let step_event = |kind: EventKind, ms: i64, detail: serde_json::Value| Event {
        seq: 0,
        task_id: id.clone(),
        at: at(ms),
        kind,
        step: Some(StepName::new(STEP).expect("a valid step name")),
        attempt: Some(1),
        detail,
        hash: None,
    };
    if state != TaskState::Pending && state != TaskState::Cancelled {
        events.push(Event::task(&id, at(5), EventKind::Claimed, json!({ "owner": HOLDER, "lease_epoch": 1 })));
        events.push(step_event(EventKind::StepStarted, 10, json!({ "agent": "delay" })));
        task.lease_epoch = 1;
        step.attempt = 1;
    }
    let completed = 10 + latency_ms;
    match state {
        TaskState::Pending => {}
        TaskState::Processing => {
            step.state = StepState::Running;
            step.complete_by = Some(lease_until);
        }
        TaskState::Processed => {
            events.push(step_event(EventKind::StepCompleted, completed, json!({})));
            events.push(Event::task(&id, at(completed + 1), EventKind::Processed, json!({})));
            step.state = StepState::Completed;
            step.output = Some(json!({ "slept_ms": 10 }));
            task.output = Some(json!({ STEP: { "slept_ms": 10 } }));
        }
        TaskState::Error => {
            let why = "the agent refused the input (filled)";
            events.push(step_event(EventKind::StepFailed, completed, json!({ "error": why, "retry": false })));
            events.push(Event::task(&id, at(completed + 1), EventKind::Error, json!({ "reason": why })));
            events.push(Event::task(&id, at(completed + 1), EventKind::Alert, json!({ "reason": why })));
            step.state = StepState::Failed;
            step.last_error = Some(why.to_owned());
            task.error = Some(why.to_owned());
            task.failure_count = 1;
        }
        TaskState::Cancelled => {
            events.push(Event::task(&id, at(1_000), EventKind::Cancelled, json!({ "compensate": false })));
        }
        TaskState::Compensating | TaskState::Compensated => {
            events.push(step_event(EventKind::StepCompleted, completed, json!({})));
            events.push(Event::task(
                &id,
                at(completed + 1),
                EventKind::CompensationStarted,
                json!({ "reason": "cancelled by an operator" }),
            ));
            step.state = StepState::Compensating;
            step.complete_by = Some(lease_until);
            if state == TaskState::Compensated {
                events.push(step_event(EventKind::StepCompensated, completed + 20, json!({})));
                events.push(Event::task(&id, at(completed + 21), EventKind::Compensated, json!({})));
                step.state = StepState::Compensated;
                step.complete_by = None;
            }
        }
    }
    task.state = state;
    if matches!(state, TaskState::Processing | TaskState::Compensating) {
        task.locked_by = Some(InstanceId::new(HOLDER).expect("a valid instance id"));
        task.complete_by = Some(lease_until);
    }
    let last = events.last().map_or(created_at, |event| event.at);
    task.updated_at = last;
    step.updated_at = last;
    NewTask { task, steps: vec![step], messages: Vec::new(), events }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_and_workflow_is_filled_in_its_share() {
        let now = Timestamp::from_millis(1_700_000_000_000);
        let mut states = std::collections::BTreeMap::new();
        let mut workflows = std::collections::BTreeMap::new();
        for i in 0..10_000 {
            let new = filled(i, now, now, &STATES);
            assert!(new.check(usize::MAX).is_ok());
            *states.entry(new.task.state.as_str()).or_insert(0) += 1;
            *workflows.entry(new.task.workflow.to_string()).or_insert(0) += 1;
        }
        assert_eq!(states.len(), TaskState::ALL.len(), "{states:?}");
        for (state, share) in STATES {
            let count: u64 = states[state.as_str()];
            assert!(count.abs_diff(share * 100) < share * 20 + 50, "{state}: {count} of 10000, expected about {share}%");
        }
        assert_eq!(workflows["orders"], 5_000);
        assert_eq!(workflows["reports"], 1_000);
    }
}
