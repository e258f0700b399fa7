//! The seeded deterministic simulation of the whole engine: Schedulers,
//! Supervisors, a fake agent and a fake remote service over a real SQLite
//! store and a `ManualClock`, driven tick by tick by one
//! seeded RNG that injects the faults: agents that crash holding a request,
//! lose requests or replies, reply late, twice, or after their lease ran
//! out; transient and permanent failures; Schedulers that crash (their inbox
//! abandoned) or restart under the same id; Supervisors that crash holding
//! the leader lease; Schedulers that die between a claim and its start or
//! holding inbox messages; operator cancels and resubmits; clock jumps
//! that expire step timeouts, task deadlines and message leases; and the
//! clock stepped back (up to 30 s). Tasks with a concurrency key (`keyed`,
//! one per customer at a time; `capped`, a `max_in_flight`) have their
//! holders crashed, to be expired and taken over; parents (`order`, whose
//! step runs a `parcel` child) are cancelled while their child runs, and
//! the ends of children are taken, lost and taken again. After the
//! faults, a quiet phase lets every role work until every task has ended.
//!
//! Then each seed is checked against the task histories, the stored records
//! and what the fake service applied (see [`check`]). A failing seed prints
//! itself, the broken invariants, the end of its trace and the command that
//! replays it:
//!
//! ```text
//! ROTA_SIM_SEED=<n> cargo test -p rota-engine --test simulation -- replay --nocapture
//! ```
//!
//! (`ROTA_SIM_TRACE=1` prints the whole trace as it runs.) `many_seeds` runs
//! `ROTA_SIM_SEEDS` seeds (default 1000) from `ROTA_SIM_FIRST` (default 0),
//! spread over the machine's cores, each seed on its own current-thread
//! runtime and store.

mod sim;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rota_engine::child::child_task_id;
use rota_engine::scheduler;
use rota_model::{Clock, StepName, StepState, TaskId, TaskState};
use rota_store::{Changes, Event, EventKind, TaskRecord};
use serde_json::{Value, json};
use sim::{Counts, Fate, World, replay_command};

/// Seeds `many_seeds` runs by default: about 105 s in a debug build on 2 idle cores.
const SEEDS_DEFAULT: u64 = 1_000;
/// The seed `replay` runs when `ROTA_SIM_SEED` is not set.
const REPLAY_DEFAULT: u64 = 7;
/// The quiet phase's bound, in rounds (each moves the clock 0.2 s to 1 s).
const QUIET_ROUNDS_MAX: u32 = 600;

/// What one seed did.
struct Outcome {
    seed: u64,
    counts: Counts,
    problems: Vec<String>,
    trace_tail: String,
    trace: Vec<String>,
    /// The final records and histories, for the determinism check.
    fingerprint: String,
}

impl Outcome {
    fn report(&self) -> String {
        format!(
            "simulation seed {} failed:\n  - {}\n--- end of the trace ---\n{}\n--- replay with: {}",
            self.seed,
            self.problems.join("\n  - "),
            self.trace_tail,
            replay_command(self.seed)
        )
    }
}

/// Runs one seed from start to checks.
async fn run_seed(seed: u64) -> Outcome {
    let mut world = World::new(seed).await;
    let mut problems = Vec::new();
    let driven = async {
        world.fault_phase().await?;
        world.quiet_phase(QUIET_ROUNDS_MAX).await
    }
    .await;
    match driven {
        Ok(true) => {}
        // Not a failure by itself: `check` names each task that did not end.
        Ok(false) => problems.push(format!("the quiet phase ended after {QUIET_ROUNDS_MAX} rounds with tasks still running")),
        Err(fail) => problems.push(format!("the driver failed: {fail}")),
    }
    world.finish();
    let fingerprint = check(&mut world, &mut problems).await;
    Outcome { seed, counts: world.counts.clone(), problems, trace_tail: world.trace_tail(), trace: world.trace().to_vec(), fingerprint }
}

/// Whether the step waits for a signal (rather than calling the agent).
fn waits(world: &World, workflow: &rota_model::WorkflowName, step: &StepName) -> bool {
    world.definitions[workflow].step(step).is_some_and(|d| d.waits_for().is_some())
}

/// Whether a callback completes the step (rather than the agent's reply).
fn by_callback(world: &World, workflow: &rota_model::WorkflowName, step: &StepName) -> bool {
    world.definitions[workflow].step(step).is_some_and(|d| d.completes_by_callback())
}

/// Whether the step is a `for_each` step itself (its instances call the
/// agent; it completes when they all have).
fn fans_out(world: &World, workflow: &rota_model::WorkflowName, step: &StepName) -> bool {
    !step.is_instance() && world.definitions[workflow].step(step).is_some_and(|d| d.for_each().is_some())
}

/// Whether the step runs a child workflow (rather than calling the agent).
fn runs_child(world: &World, workflow: &rota_model::WorkflowName, step: &StepName) -> bool {
    world.definitions[workflow].step(step).is_some_and(|d| d.child().is_some())
}

/// The child that attempt `attempt` of `step` of `task` started, if it
/// ended Processed.
fn processed_child<'w>(world: &'w World, task: &TaskId, step: &StepName, attempt: u32) -> Option<&'w rota_model::Task> {
    world.finals.get(&child_task_id(task, step, attempt)).filter(|child| child.state == TaskState::Processed)
}

/// A step's compensation, if the workflow gives it one.
fn compensable(world: &World, workflow: &rota_model::WorkflowName, step: &StepName) -> bool {
    world.definitions[workflow].step(step).is_some_and(|d| d.compensate().is_some())
}

/// Checks every invariant of one seed; appends what is broken to `problems`.
/// Returns a fingerprint of the final state.
///
/// Outside the tasks ([`check_outside_the_tasks`]): the fake service saw
/// nothing wrong, no queue dead-lettered a message, and no task stalled
/// (held by a live Scheduler with nothing in flight). Then, for each
/// submitted task: it exists, every promise of [`check_task`] holds, and no
/// effect of a Compensated or Cancelled task was left undone
/// ([`count_leaks`]). Stalls, leaks and compensations out of order after a
/// retried in-doubt compensation are once-known bug classes: failures like
/// any other, also listed apart in the summary (see [`known`]).
///
/// The children that `workflow:` steps started are checked as tasks too.
/// Then the promises across tasks: of concurrency keys
/// ([`check_concurrency_keys`]) and of child workflows
/// ([`check_child_workflows`]).
async fn check(world: &mut World, problems: &mut Vec<String>) -> String {
    let all = world.store.list_tasks(&rota_store::TaskFilter { limit: 10_000, ..Default::default() }).await;
    match all {
        Ok(tasks) => world.finals = tasks.into_iter().map(|t| (t.id.clone(), t)).collect(),
        Err(e) => problems.push(format!("listing tasks: {e}")),
    }
    if let Err(fail) = world.inspect_slots().await {
        problems.push(format!("inspecting the concurrency slots: {fail}"));
    }
    check_outside_the_tasks(world, problems).await;
    let mut fingerprint = String::new();
    let planned: Vec<TaskId> = world.tasks.iter().map(|t| t.id.clone()).collect();
    let children: Vec<TaskId> = world.finals.values().filter(|t| t.parent.is_some()).map(|t| t.id.clone()).collect();
    let mut read = Vec::new();
    for id in planned.iter().chain(&children) {
        let Some((record, history)) = read_task(world, id, problems).await else { continue };
        let before = problems.len();
        for line in check_task(world, &record, &history, problems) {
            known(world, problems, line);
        }
        if problems.len() > before {
            problems.push(history_for_a_reader(&record.task.id, &history));
        }
        let outcomes = if record.task.parent.is_some() { &mut world.counts.children } else { &mut world.counts.outcomes };
        let prefix = if record.task.parent.is_some() { "child ended " } else { "" };
        *outcomes.entry(format!("{prefix}{}", record.task.state)).or_default() += 1;
        let definition = &world.definitions[&record.task.workflow];
        for step in record.steps.iter().filter(|s| definition.step(&s.name).is_some_and(|d| d.when().is_some())) {
            let decided = match step.state {
                StepState::Skipped => "skipped",
                StepState::NotStarted if step.attempt == 0 => "not reached",
                _ => "ran",
            };
            *world.counts.conditions.entry(decided.to_owned()).or_default() += 1;
        }
        count_leaks(world, &record, problems);
        fingerprint.push_str(&format!("{:?}\n", record));
        for event in &history {
            fingerprint.push_str(&format!("{} {:?} {:?} {:?} {}\n", event.at, event.kind, event.step, event.attempt, event.detail));
        }
        read.push((record, history));
    }
    check_concurrency_keys(world, &read, problems);
    check_child_workflows(world, &read, problems);
    fingerprint
}

/// What the fake service found wrong, stalls, and dead-lettered messages.
async fn check_outside_the_tasks(world: &mut World, problems: &mut Vec<String>) {
    problems.extend(world.service.problems.iter().cloned());
    problems.extend(world.slot_problems.iter().map(|p| format!("concurrency slots: {p}")));
    problems.extend(world.children_left.iter().cloned());
    for stall in world.stalls.clone() {
        known(world, problems, format!("stall: {stall}"));
    }
    match world.store.stats().await {
        Ok(queues) => {
            for queue in queues.iter().filter(|q| q.dead_lettered > 0) {
                problems.push(format!("queue {} dead-lettered {} messages", queue.queue, queue.dead_lettered));
            }
        }
        Err(e) => problems.push(format!("reading queue stats: {e}")),
    }
}

/// The stored task and its history. No task is lost: a submitted task that
/// cannot be read is a problem.
async fn read_task(world: &World, id: &TaskId, problems: &mut Vec<String>) -> Option<(TaskRecord, Vec<Event>)> {
    let record = match world.store.task(id).await {
        Ok(Some(record)) => record,
        Ok(None) => {
            problems.push(format!("task {id} was submitted and is lost"));
            return None;
        }
        Err(e) => {
            problems.push(format!("reading task {id}: {e}"));
            return None;
        }
    };
    match world.store.history(id).await {
        Ok(history) => Some((record, history)),
        Err(e) => {
            problems.push(format!("reading the history of {id}: {e}"));
            None
        }
    }
}

/// A task's history, one event a line, to print under its problems.
fn history_for_a_reader(id: &TaskId, history: &[Event]) -> String {
    let events: Vec<String> = history
        .iter()
        .map(|e| {
            let step = e.step.as_ref().map_or(String::new(), |s| format!(" {s}#{}", e.attempt.unwrap_or(0)));
            format!("{:?}{step} {}", e.kind, e.detail)
        })
        .collect();
    format!("history of {id}:\n      {}", events.join("\n      "))
}

/// Checks one task against every promise about it alone, one function
/// each, and adds what is broken to `problems`. Returns the findings of a
/// once-known bug class (see [`known`]), which the caller records as
/// failures too.
fn check_task(world: &World, record: &TaskRecord, history: &[Event], problems: &mut Vec<String>) -> Vec<String> {
    let walk = Walk::new(history);
    let mut report = Report { task: &record.task, problems, known: Vec::new(), doubt_retried: walk.doubt_retried.clone() };
    every_task_ends(record, &mut report);
    attempts_never_go_back(&walk, &mut report);
    settles_are_fenced(world, &walk, &mut report);
    nothing_completes_once_undoing_began(&walk, &mut report);
    undone_only_if_done_or_in_doubt(world, &walk, &mut report);
    at_most_once_per_step(&walk, &mut report);
    stored_steps_agree_with_the_history(record, history, &walk, &mut report);
    compensation_runs_in_reverse_order(world, &walk, &mut report);
    each_ending_recorded_once(record, history, &mut report);
    processed_means_every_step_applied_once(world, record, &walk, &mut report);
    compensated_means_everything_undone(world, record, &walk, &mut report);
    signals_are_kept_and_used_once(world, record, history, &mut report);
    conditions_decide_once_and_skipped_steps_never_run(world, record, history, &mut report);
    callbacks_complete_their_attempt(world, record, history, &mut report);
    a_cancelled_task_never_ends_processed(record, history, &mut report);
    a_cancelled_task_leaves_nothing_in_flight(record, history, &mut report);
    report.known
}

/// Where the checks of one task report.
struct Report<'a> {
    task: &'a rota_model::Task,
    problems: &'a mut Vec<String>,
    /// Findings of a once-known bug class, for the caller.
    known: Vec<String>,
    /// In-doubt steps whose compensation failed once and was retried: the
    /// mark of the once-known class (see [`Report::fail_or_known`]).
    doubt_retried: BTreeSet<StepName>,
}

impl Report<'_> {
    /// A broken promise, named with the task.
    fn fail(&mut self, what: String) {
        self.problems.push(format!("task {} ({}): {what}", self.task.id, self.task.workflow));
    }

    /// A broken promise that belongs to the once-known class "compensation
    /// out of order after an in-doubt compensation was retried" when this
    /// task retried one, and is an ordinary failure otherwise.
    fn fail_or_known(&mut self, what: String) {
        if self.doubt_retried.is_empty() {
            self.fail(what);
        } else {
            self.known.push(format!("in-doubt compensation retried ({:?}): task {}: {what}", self.doubt_retried, self.task.id));
        }
    }
}

/// One task's history, read once: the facts the checks compare, no verdict.
#[derive(Default)]
struct Walk {
    /// Events whose attempt is below one seen earlier for the same step:
    /// (step, kind, attempt, the highest attempt before it).
    went_back: Vec<(StepName, EventKind, u32, u32)>,
    /// Every StepCompleted and StepCompensated, in history order.
    settles: Vec<Settle>,
    /// Completions and in-doubt settles, in history order.
    finished: Vec<Finished>,
    /// In-doubt steps whose compensation failed once and had to be retried.
    doubt_retried: BTreeSet<StepName>,
    /// Whether the task ever began compensating.
    compensation_started: bool,
}

/// A StepCompleted (`undo` false) or StepCompensated (`undo` true) event.
struct Settle {
    step: StepName,
    attempt: u32,
    undo: bool,
    /// The attempt started last in the same direction before it, if any.
    last_started: Option<u32>,
}

/// A step's forward part done: completed, or settled "in doubt" (a forward
/// attempt that timed out while the task was being undone is settled as
/// completed, without output, and compensated, since its effect may have
/// landed).
struct Finished {
    step: StepName,
    in_doubt: bool,
    /// Whether a StepCompensated came before it.
    after_undoing_began: bool,
}

impl Walk {
    fn new(history: &[Event]) -> Walk {
        let mut walk = Walk::default();
        let mut max_attempt: BTreeMap<StepName, u32> = BTreeMap::new();
        let mut last_started: BTreeMap<(StepName, bool), u32> = BTreeMap::new();
        let mut compensations: BTreeSet<(StepName, u32)> = BTreeSet::new();
        let mut compensating = false;
        for event in history {
            match event.kind {
                EventKind::CompensationStarted => {
                    compensating = true;
                    walk.compensation_started = true;
                }
                EventKind::Resubmitted => compensating = false,
                _ => {}
            }
            let (Some(step), Some(attempt)) = (&event.step, event.attempt) else { continue };
            let seen = max_attempt.entry(step.clone()).or_insert(0);
            if attempt < *seen {
                walk.went_back.push((step.clone(), event.kind, attempt, *seen));
            }
            *seen = (*seen).max(attempt);
            let after_undoing_began = walk.settles.iter().any(|s| s.undo);
            match event.kind {
                EventKind::StepStarted => {
                    let undo = event.detail.get("compensate").and_then(Value::as_bool).unwrap_or(false);
                    last_started.insert((step.clone(), undo), attempt);
                    if undo {
                        compensations.insert((step.clone(), attempt));
                    }
                }
                EventKind::StepCompleted | EventKind::StepCompensated => {
                    let undo = event.kind == EventKind::StepCompensated;
                    let last_started = last_started.get(&(step.clone(), undo)).copied();
                    walk.settles.push(Settle { step: step.clone(), attempt, undo, last_started });
                    if !undo {
                        walk.finished.push(Finished { step: step.clone(), in_doubt: false, after_undoing_began });
                    }
                }
                // A failed compensation of a step in doubt is retried.
                EventKind::StepFailed if compensations.contains(&(step.clone(), attempt)) && walk.in_doubt().any(|s| s == step) => {
                    walk.doubt_retried.insert(step.clone());
                }
                EventKind::StepFailed if compensations.contains(&(step.clone(), attempt)) => {}
                EventKind::StepFailed => {
                    let forward = last_started.get(&(step.clone(), false)) == Some(&attempt);
                    if settles_in_doubt(event, compensating, forward) {
                        walk.finished.push(Finished { step: step.clone(), in_doubt: true, after_undoing_began });
                    }
                }
                _ => {}
            }
        }
        walk
    }

    /// The steps settled in doubt.
    fn in_doubt(&self) -> impl Iterator<Item = &StepName> {
        self.finished.iter().filter(|f| f.in_doubt).map(|f| &f.step)
    }

    /// The StepCompleted (`undo` false) or StepCompensated (`undo` true)
    /// events, as (step, attempt).
    fn settled(&self, undo: bool) -> impl Iterator<Item = (&StepName, u32)> {
        self.settles.iter().filter(move |s| s.undo == undo).map(|s| (&s.step, s.attempt))
    }

    /// The steps compensated, in the order they were.
    fn undone(&self) -> Vec<&StepName> {
        self.settled(true).map(|(step, _)| step).collect()
    }

    /// The steps that have a compensation, in reverse order of completion:
    /// the order compensation must follow.
    fn reverse_completion<'w>(&'w self, world: &World, task: &rota_model::Task) -> Vec<&'w StepName> {
        self.finished.iter().map(|f| &f.step).filter(|s| compensable(world, &task.workflow, s)).rev().collect()
    }
}

/// Whether a StepFailed settles its step in doubt. The Scheduler marks its
/// in-doubt settles; the Supervisor's (for a task nobody holds) look like
/// any timeout, but in a task being undone (`compensating`) one of the
/// attempt started last (`forward`) settles it in doubt.
fn settles_in_doubt(event: &Event, compensating: bool, forward: bool) -> bool {
    let marked = event.detail.get("in_doubt").and_then(Value::as_bool).unwrap_or(false);
    let by_supervisor = event.detail.get("error").and_then(Value::as_str) == Some("timed out while its task had no Scheduler");
    marked || (compensating && forward && by_supervisor)
}

/// Every task ends terminal. Not "visibly in progress": after the quiet
/// phase nothing injects faults any more, and every non-terminal state has
/// an owner that moves it on or a complete-by that the Supervisor enforces,
/// counting failures up to the threshold, so a task still running then is
/// stuck, which is a bug.
fn every_task_ends(record: &TaskRecord, report: &mut Report<'_>) {
    let task = &record.task;
    if !task.state.is_terminal() {
        report.fail(format!(
            "still {} after the quiet phase (locked_by {:?}, complete_by {:?}, not_before {}, failures {}); steps: {}",
            task.state,
            task.locked_by,
            task.complete_by,
            task.not_before,
            task.failure_count,
            steps_summary(record)
        ));
    }
}

/// Attempt numbers never go back along a step's history.
fn attempts_never_go_back(walk: &Walk, report: &mut Report<'_>) {
    for (step, kind, attempt, seen) in &walk.went_back {
        report.fail(format!("step {step}: a {kind:?} event for attempt {attempt} after attempt {seen}"));
    }
}

/// A step completes or is compensated only for the attempt started last,
/// and only on a success the agent really sent for that attempt.
fn settles_are_fenced(world: &World, walk: &Walk, report: &mut Report<'_>) {
    for settle in &walk.settles {
        let Settle { step, attempt, undo, last_started } = settle;
        let (did, started) = if *undo { ("compensated", "compensation") } else { ("completed", "attempt") };
        // A `for_each` step completes with its instances, not on a reply
        // (its output is checked against theirs with the task's output),
        // and is settled compensated as its instances are undone.
        if fans_out(world, &report.task.workflow, step) {
            continue;
        }
        if *last_started != Some(*attempt) {
            report.fail(format!("step {step} {did} for attempt {attempt}, but the last {started} started was {last_started:?}"));
        }
        // A waiting step completes on its signal, not on an agent's reply.
        if waits(world, &report.task.workflow, step) {
            if !world.signals.contains_key(&report.task.id) {
                report.fail(format!("step {step} completed for attempt {attempt}, but no signal was accepted"));
            }
        } else if !*undo && runs_child(world, &report.task.workflow, step) {
            // A child step completes on its attempt's child ending Processed.
            if processed_child(world, &report.task.id, step, *attempt).is_none() {
                let child = child_task_id(&report.task.id, step, *attempt);
                report.fail(format!("step {step} completed for attempt {attempt}, but its child {child} did not end Processed"));
            }
        } else if !*undo && by_callback(world, &report.task.workflow, step) {
            // A callback step completes on a callback the engine took for
            // that attempt, not on its agent's reply (which only accepted).
            let taken = world.callbacks.get(&(report.task.id.clone(), step.clone(), *attempt));
            if !taken.is_some_and(Option::is_some) {
                report.fail(format!("step {step} completed for attempt {attempt}, but no successful callback was taken for it"));
            }
        } else if !world.succeeded.contains(&(report.task.id.clone(), step.clone(), *undo, *attempt)) {
            report.fail(format!("step {step} {did} for attempt {attempt}, for which the agent sent no success"));
        }
    }
}

/// Once compensation has undone a step, no step completes or is settled in
/// doubt any more.
fn nothing_completes_once_undoing_began(walk: &Walk, report: &mut Report<'_>) {
    for finished in walk.finished.iter().filter(|f| f.after_undoing_began) {
        let step = &finished.step;
        match finished.in_doubt {
            false => report.fail(format!("step {step} completed after compensation had begun undoing steps")),
            true => report.fail(format!("step {step} was settled in doubt after compensation had begun undoing steps")),
        }
    }
}

/// A compensation is only requested for a step that completed or whose
/// effect is in doubt: the service never undoes what it never applied,
/// except for a step in doubt, or one that ran a child (whose effects the
/// service applied under the child's id).
fn undone_only_if_done_or_in_doubt(world: &World, walk: &Walk, report: &mut Report<'_>) {
    for (task, step, attempt) in &world.service.undone_without_effect {
        let child_done = runs_child(world, &report.task.workflow, step) && walk.settled(false).any(|(s, _)| s == step);
        if *task == report.task.id && !walk.in_doubt().any(|s| s == step) && !child_done {
            report.fail(format!(
                "the compensation of {step} (attempt {attempt}) was requested, but the step neither completed nor was in doubt"
            ));
        }
    }
}

/// The fence: at most one StepCompleted and one StepCompensated per step.
fn at_most_once_per_step(walk: &Walk, report: &mut Report<'_>) {
    for (undo, what) in [(false, "completed"), (true, "compensated")] {
        let mut seen = BTreeSet::new();
        for (step, attempt) in walk.settled(undo) {
            if !seen.insert(step) {
                report.fail(format!("step {step} {what} twice (again for attempt {attempt})"));
            }
        }
    }
}

/// The stored steps agree with the history: the stored attempt is the last
/// one started, a step past Completed has a completion (or an in-doubt
/// settle), and a Compensated one a StepCompensated event.
fn stored_steps_agree_with_the_history(record: &TaskRecord, history: &[Event], walk: &Walk, report: &mut Report<'_>) {
    for step in &record.steps {
        let started = history
            .iter()
            .filter(|e| e.kind == EventKind::StepStarted && e.step.as_ref() == Some(&step.name))
            .filter_map(|e| e.attempt)
            .max()
            .unwrap_or(0);
        if step.attempt != started {
            report.fail(format!("step {} is stored at attempt {}, but the last attempt started was {started}", step.name, step.attempt));
        }
        let done = walk.settled(false).any(|(s, _)| s == &step.name) || walk.in_doubt().any(|s| s == &step.name);
        if matches!(step.state, StepState::Completed | StepState::Compensating | StepState::Compensated) && !done {
            report.fail(format!("step {} is {} without a StepCompleted event or an in-doubt settle", step.name, step.state));
        }
        if step.state == StepState::Compensated && !walk.settled(true).any(|(s, _)| s == &step.name) {
            report.fail(format!("step {} is compensated without a StepCompensated event", step.name));
        }
    }
}

/// Compensation runs in reverse order of completion, where a step settled
/// in doubt counts as completed when it was settled: the steps compensated
/// so far are a prefix of that order.
fn compensation_runs_in_reverse_order(world: &World, walk: &Walk, report: &mut Report<'_>) {
    let reverse = walk.reverse_completion(world, report.task);
    let undone = walk.undone();
    if !reverse.starts_with(&undone) {
        report.fail_or_known(format!("compensated in the order {undone:?}, which does not begin the reverse completion order {reverse:?}"));
    }
}

/// Each ending is recorded once, and only the one the task reached (Error
/// and its Alert once more per resubmit, the only way out of a terminal
/// state); a task is cancelled at most once.
fn each_ending_recorded_once(record: &TaskRecord, history: &[Event], report: &mut Report<'_>) {
    let task = &record.task;
    let times = |kind: EventKind| history.iter().filter(|e| e.kind == kind).count();
    let resubmits = times(EventKind::Resubmitted);
    for (kind, state, before) in [
        (EventKind::Processed, TaskState::Processed, 0),
        (EventKind::Compensated, TaskState::Compensated, 0),
        (EventKind::Error, TaskState::Error, resubmits),
        (EventKind::Alert, TaskState::Error, resubmits),
    ] {
        let expected = before + usize::from(task.state == state);
        if times(kind) != expected {
            report.fail(format!("{} {kind:?} events in a task that is {}", times(kind), task.state));
        }
    }
    if times(EventKind::Cancelled) > 1 {
        report.fail(format!("cancelled {} times", times(EventKind::Cancelled)));
    }
    let missing = match task.state {
        TaskState::Processed if times(EventKind::Processed) == 0 => Some("processed without a Processed event"),
        TaskState::Compensated if times(EventKind::Compensated) == 0 => Some("compensated without a Compensated event"),
        TaskState::Error if times(EventKind::Alert) == 0 || times(EventKind::Error) == 0 => {
            Some("in Error without an Error event and an Alert")
        }
        TaskState::Cancelled if times(EventKind::Cancelled) == 0 => Some("cancelled without a Cancelled event"),
        _ => None,
    };
    if let Some(missing) = missing {
        report.fail(missing.into());
    }
}

/// A Processed task ran no compensation, and every step Completed with the
/// output the service returned, which the task's output holds too.
fn processed_means_every_step_applied_once(world: &World, record: &TaskRecord, walk: &Walk, report: &mut Report<'_>) {
    let task = &record.task;
    if task.state != TaskState::Processed {
        return;
    }
    let id = &task.id;
    if walk.compensation_started || walk.settled(true).next().is_some() {
        report.fail("processed, yet compensation ran".into());
    }
    let output = task.output.as_ref().and_then(Value::as_object);
    for step in &record.steps {
        if step.state == StepState::Skipped {
            // Checked by `conditions_decide_once_and_skipped_steps_never_run`.
            if output.is_some_and(|o| o.contains_key(step.name.as_str())) {
                report.fail(format!("processed, and skipped step {} has an entry in the task's output", step.name));
            }
            continue;
        }
        if step.state != StepState::Completed {
            report.fail(format!("processed, but step {} is {}", step.name, step.state));
        }
        let effect = |name: &StepName| world.service.effects.get(&(id.clone(), name.clone(), false)).map(|e| e.output.clone());
        let applied = if waits(world, &task.workflow, &step.name) {
            world.signals.get(id).cloned()
        } else if fans_out(world, &task.workflow, &step.name) {
            // The instances' outputs, in item order.
            let count = step.input.as_ref().and_then(Value::as_array).map_or(0, Vec::len);
            (0..count).map(|index| effect(&step.name.instance(index))).collect::<Option<Vec<Value>>>().map(Value::Array)
        } else if runs_child(world, &task.workflow, &step.name) {
            // The output of the child of its last attempt.
            processed_child(world, id, &step.name, step.attempt).and_then(|child| child.output.clone())
        } else {
            effect(&step.name)
        };
        let applied = applied.as_ref();
        let stored = output.and_then(|o| o.get(step.name.as_str()));
        // An instance has no entry of its own in the task's output.
        let stored_ok = if step.name.is_instance() { stored.is_none() } else { stored.is_some() && stored == applied };
        if !stored_ok || applied.is_none() || step.output.as_ref() != applied {
            report.fail(format!("step {}: task output {stored:?}, step output {:?}, service applied {applied:?}", step.name, step.output));
        }
        if world.service.applied(id, &step.name, true) {
            report.fail(format!("processed, yet the service applied the compensation of {}", step.name));
        }
    }
}

/// A Compensated task undid every step that has a compensation, all of
/// them in reverse order of completion, and keeps none Completed or in
/// flight.
fn compensated_means_everything_undone(world: &World, record: &TaskRecord, walk: &Walk, report: &mut Report<'_>) {
    let task = &record.task;
    if task.state != TaskState::Compensated {
        return;
    }
    let reverse = walk.reverse_completion(world, task);
    let undone = walk.undone();
    if undone != reverse {
        report.fail_or_known(format!("compensated {undone:?}, but expected the reverse completion order {reverse:?}"));
    }
    for step in &record.steps {
        let left = match step.state {
            StepState::Completed => compensable(world, &task.workflow, &step.name),
            StepState::Running | StepState::Compensating => true,
            _ => false,
        };
        if left {
            report.fail_or_known(format!("compensated, but step {} is still {}", step.name, step.state));
        }
    }
}

/// Signals: an accepted signal is in the history once (a refused one not
/// at all), is never lost (once it is recorded, the waiting step never
/// starts without completing with it at once, and never times out waiting
/// on an attempt that started after it), and the steps after it read its
/// data.
fn signals_are_kept_and_used_once(world: &World, record: &TaskRecord, history: &[Event], report: &mut Report<'_>) {
    let task = &record.task;
    let Some(wait) = world.definitions[&task.workflow].steps().iter().find(|d| d.waits_for().is_some()) else { return };
    let signals: Vec<&Event> = history.iter().filter(|e| e.kind == EventKind::Signal).collect();
    let accepted = world.signals.get(&task.id);
    if signals.len() != usize::from(accepted.is_some()) {
        report.fail(format!("{} signal events, but {} signal accepted", signals.len(), usize::from(accepted.is_some())));
    }
    let Some(signal) = signals.first() else { return };
    let on_step: Vec<&Event> = history.iter().filter(|e| e.seq > signal.seq && e.step.as_ref() == Some(wait.name())).collect();
    for (i, event) in on_step.iter().enumerate() {
        if event.kind == EventKind::StepStarted && on_step.get(i + 1).is_none_or(|next| next.kind != EventKind::StepCompleted) {
            report.fail(format!("step {} attempt {:?} started after its signal without completing with it", wait.name(), event.attempt));
        }
    }
    let started_after: BTreeSet<u32> = on_step.iter().filter(|e| e.kind == EventKind::StepStarted).filter_map(|e| e.attempt).collect();
    for failed in on_step.iter().filter(|e| e.kind == EventKind::StepFailed) {
        if failed.attempt.is_some_and(|a| started_after.contains(&a)) {
            report.fail(format!(
                "step {} attempt {:?} failed though its signal had arrived: {}",
                wait.name(),
                failed.attempt,
                failed.detail
            ));
        }
    }
    if task.state == TaskState::Processed {
        let step = |name: &str| record.steps.iter().find(|s| s.name.as_str() == name);
        let output = step(wait.name().as_str()).and_then(|s| s.output.as_ref());
        if output != accepted {
            report.fail(format!("step {} has output {output:?}, but the signal accepted had {accepted:?}", wait.name()));
        }
        let read = step("pay").and_then(|s| s.input.as_ref()).map(|input| input["approved"].clone());
        if read != accepted.map(|data| data["n"].clone()) {
            report.fail(format!("step pay read {read:?} from the signal, which had {accepted:?}"));
        }
    }
}

/// Conditions: a step with a `when` is decided once, before any attempt. A
/// Skipped step never ran (no attempt started, nothing applied or undone
/// by the service), has one `step_skipped` event, and its condition is
/// false on the task's input and the outputs its upstream steps keep; a
/// step that ran had it true. A step without a condition is never skipped.
fn conditions_decide_once_and_skipped_steps_never_run(world: &World, record: &TaskRecord, history: &[Event], report: &mut Report<'_>) {
    let task = &record.task;
    let outputs: BTreeMap<StepName, Value> =
        record.steps.iter().filter_map(|s| s.output.as_ref().map(|o| (s.name.clone(), o.clone()))).collect();
    for step in &record.steps {
        let name = &step.name;
        let skips = history.iter().filter(|e| e.kind == EventKind::StepSkipped && e.step.as_ref() == Some(name)).count();
        let Some(when) = world.definitions[&task.workflow].step(name).and_then(|d| d.when()) else {
            if step.state == StepState::Skipped || skips > 0 {
                report.fail(format!("step {name} has no condition, yet it was skipped"));
            }
            continue;
        };
        let decided = when.evaluate(&task.input, &outputs);
        if step.state == StepState::Skipped {
            let started = history.iter().any(|e| e.kind == EventKind::StepStarted && e.step.as_ref() == Some(name));
            if started || step.attempt != 0 || step.output.is_some() {
                report.fail(format!("skipped step {name} ran: started {started}, attempt {}, output {:?}", step.attempt, step.output));
            }
            if world.service.applied(&task.id, name, false) || world.service.applied(&task.id, name, true) {
                report.fail(format!("the service applied skipped step {name} (or its compensation)"));
            }
            if skips != 1 {
                report.fail(format!("skipped step {name} has {skips} step_skipped events"));
            }
            if decided != Ok(false) {
                report.fail(format!("step {name} was skipped, but its condition gives {decided:?} on the stored outputs"));
            }
        } else if skips > 0 {
            report.fail(format!("step {name} is {} after a step_skipped event", step.state));
        } else if step.attempt > 0 && decided != Ok(true) {
            report.fail(format!("step {name} ran, but its condition gives {decided:?} on the stored outputs"));
        }
    }
}

/// Callbacks: each one taken is in the history once, for its attempt; a
/// successful one completed its attempt (and nothing else did), and the
/// step after it read its output.
fn callbacks_complete_their_attempt(world: &World, record: &TaskRecord, history: &[Event], report: &mut Report<'_>) {
    let task = &record.task;
    let taken: Vec<_> = world.callbacks.iter().filter(|((id, _, _), _)| id == &task.id).collect();
    let events: Vec<&Event> = history.iter().filter(|e| e.kind == EventKind::Callback && e.detail["outcome"] != "accepted").collect();
    if events.len() != taken.len() {
        report.fail(format!("{} callback events, but {} callbacks taken", events.len(), taken.len()));
    }
    for ((_, step, attempt), output) in &taken {
        let completions = history
            .iter()
            .filter(|e| e.kind == EventKind::StepCompleted && e.step.as_ref() == Some(step) && e.attempt == Some(*attempt))
            .count();
        let expected = usize::from(output.is_some());
        if completions != expected {
            report.fail(format!("step {step} attempt {attempt}: {completions} completions after a callback that was taken ({output:?})"));
        }
    }
    if task.state == TaskState::Processed
        && let Some(transfer) = record.steps.iter().find(|s| s.name.as_str() == sim::CALLBACK_STEP)
    {
        let taken_output = world.callbacks.get(&(task.id.clone(), transfer.name.clone(), transfer.attempt)).cloned().flatten();
        if transfer.output != taken_output {
            report.fail(format!("step {} has output {:?}, but the callback taken had {taken_output:?}", transfer.name, transfer.output));
        }
        let read = record.steps.iter().find(|s| s.name.as_str() == "settle").and_then(|s| s.input.as_ref()).map(|i| i["paid"].clone());
        if read != taken_output.map(|o| o["n"].clone()) {
            report.fail(format!("step settle read {read:?} from the callback"));
        }
    }
}

/// A cancelled task never ends Processed: a cancel ends it at once, or
/// undoes it (a compensation that fails ends it in Error, and a resubmit
/// then resumes the compensation).
fn a_cancelled_task_never_ends_processed(record: &TaskRecord, history: &[Event], report: &mut Report<'_>) {
    let Some(cancel) = history.iter().position(|e| e.kind == EventKind::Cancelled) else { return };
    if record.task.state == TaskState::Processed || history[cancel..].iter().any(|e| e.kind == EventKind::Processed) {
        report.fail(format!("processed after it was cancelled ({})", history[cancel].detail));
    }
}

/// A task cancelled with nothing to undo failed its steps in flight in the
/// cancel's commit: none is left Running, and no step of it moves after
/// the cancel (a Supervisor timing out an abandoned attempt later would).
fn a_cancelled_task_leaves_nothing_in_flight(record: &TaskRecord, history: &[Event], report: &mut Report<'_>) {
    if record.task.state != TaskState::Cancelled {
        return;
    }
    for step in record.steps.iter().filter(|s| matches!(s.state, StepState::Running | StepState::Compensating)) {
        report.fail(format!("cancelled with step {} still {} (attempt {})", step.name, step.state, step.attempt));
    }
    let Some(cancel) = history.iter().position(|e| e.kind == EventKind::Cancelled) else { return };
    for event in &history[cancel + 1..] {
        let abandoned = event.kind == EventKind::StepFailed && event.detail["cancelled"] == json!(true);
        if event.step.is_some() && !abandoned && !matches!(event.kind, EventKind::CallStopped | EventKind::Signal) {
            report.fail(format!("step {:?} moved after the cancel: {:?} {}", event.step, event.kind, event.detail));
        }
    }
}

/// The promises of concurrency keys, from the histories of every task
/// with a key read in the store's global event order (see [`KeyWalk`]):
/// [`a_key_never_runs_more_than_its_limit`] and
/// [`a_key_starts_its_tasks_in_submission_order`]. A task holds one of its
/// key's slots from its first claim after its submission (or a resubmit)
/// until it ends, also while its holder is dead and it waits to be taken
/// over. The slots left in the store are checked by
/// `World::inspect_slots`, during the seed and before these checks: none
/// is held by a task that ended, so none leaked.
fn check_concurrency_keys(world: &mut World, read: &[(TaskRecord, Vec<Event>)], problems: &mut Vec<String>) {
    let mut events: Vec<(&TaskRecord, &Event)> =
        read.iter().filter(|(r, _)| r.task.concurrency.is_some()).flat_map(|(r, h)| h.iter().map(move |e| (r, e))).collect();
    events.sort_by_key(|(_, e)| e.seq);
    let mut keys: BTreeMap<(String, String), KeyWalk> = BTreeMap::new();
    for (record, event) in events {
        let task = &record.task;
        let Some(key) = &task.concurrency else { continue };
        let walk = keys.entry((task.workflow.to_string(), key.key.clone())).or_default();
        walk.log.push(format!("{} {} {:?} {}", event.seq, task.id, event.kind, event.detail));
        match event.kind {
            EventKind::Received | EventKind::Resubmitted => {
                let place = *walk.submitted.entry(task.id.clone()).or_insert(event.seq);
                walk.waiting.insert(task.id.clone(), (event.at, place));
                if walk.holding.len() >= key.limit as usize {
                    *world.counts.keys.entry("submitted while their key was full".into()).or_default() += 1;
                }
            }
            EventKind::Expired => {
                walk.expired.insert(task.id.clone());
            }
            EventKind::Claimed => {
                let owner = event.detail["owner"].as_str().unwrap_or_default().to_owned();
                if let Some(owners) = walk.holding.get_mut(&task.id) {
                    if walk.expired.contains(&task.id) && !owners.contains(&owner) {
                        *world.counts.keys.entry("taken over holding their slot after their holder's lease ran out".into()).or_default() +=
                            1;
                    }
                    owners.insert(owner);
                    continue;
                }
                a_key_never_runs_more_than_its_limit(walk, task, key.limit, problems);
                a_key_starts_its_tasks_in_submission_order(walk, task, key.limit, event, problems);
                walk.waiting.remove(&task.id);
                walk.holding.insert(task.id.clone(), BTreeSet::from([owner]));
            }
            // A cancel into compensation moves a task's not_before: one
            // that waits for a slot (resubmitted) waits from then on.
            EventKind::Cancelled if event.detail["compensate"] == json!(true) => {
                if let Some(waiting) = walk.waiting.get_mut(&task.id) {
                    waiting.0 = event.at;
                }
            }
            EventKind::Processed | EventKind::Compensated | EventKind::Error | EventKind::Cancelled => {
                walk.waiting.remove(&task.id);
                walk.holding.remove(&task.id);
                walk.expired.remove(&task.id);
            }
            _ => {}
        }
    }
    for ((workflow, key), walk) in keys {
        if walk.failed {
            let from = walk.log.len().saturating_sub(40);
            problems.push(format!("events of key {workflow}/{key}, in the store's order:\n      {}", walk.log[from..].join("\n      ")));
        }
    }
}

/// The tasks of one concurrency key, at one point of the store's event order.
#[derive(Default)]
struct KeyWalk {
    /// The tasks holding a slot, each with the Schedulers that claimed it
    /// while it held it (more than one after a takeover).
    holding: BTreeMap<TaskId, BTreeSet<String>>,
    /// The holders the Supervisor expired (their holder's lease ran out).
    expired: BTreeSet<TaskId>,
    /// The tasks waiting for a slot: their `not_before` (when they were
    /// submitted or resubmitted) and their submission's place in the event
    /// order (the store's tie-break, the order it inserted them).
    waiting: BTreeMap<TaskId, (rota_model::Timestamp, i64)>,
    /// Each task's submission's place in the event order.
    submitted: BTreeMap<TaskId, i64>,
    /// The key's events so far, one a line, for the report.
    log: Vec<String>,
    failed: bool,
}

/// Never do more than `limit` tasks of one key hold a slot, so never do
/// more run at once: a task takes a slot only while fewer hold one. A slot
/// granted twice, or freed while its task still runs (as an expiry or a
/// takeover might), breaks it.
fn a_key_never_runs_more_than_its_limit(walk: &mut KeyWalk, task: &rota_model::Task, limit: u32, problems: &mut Vec<String>) {
    if walk.holding.len() >= limit as usize {
        let holders = listed(walk.holding.keys());
        problems.push(format!("task {} took a slot of its key while [{holders}] held all {limit}", task.id));
        walk.failed = true;
    }
}

/// A task takes its key's slot only when one is free for it after the
/// tasks of the key submitted before it that wait for one and may be
/// claimed (their `not_before` passed): a key's tasks start in submission
/// order, as the store promises (`Tasks::claim_tasks_by`). With a limit of
/// one, strictly one after another.
fn a_key_starts_its_tasks_in_submission_order(
    walk: &mut KeyWalk,
    task: &rota_model::Task,
    limit: u32,
    claimed: &Event,
    problems: &mut Vec<String>,
) {
    let Some(&mine) = walk.waiting.get(&task.id) else {
        problems.push(format!("task {} took a slot of its key without being submitted or resubmitted first", task.id));
        walk.failed = true;
        return;
    };
    let older: Vec<&TaskId> =
        walk.waiting.iter().filter(|(id, waited)| **id != task.id && **waited < mine && waited.0 <= claimed.at).map(|(id, _)| id).collect();
    if walk.holding.len() + older.len() >= limit as usize {
        problems.push(format!(
            "task {} took a slot of its key (limit {limit}) before [{}], submitted before it and waiting, while [{}] held one",
            task.id,
            listed(older),
            listed(walk.holding.keys())
        ));
        walk.failed = true;
    }
}

/// Task ids for a report: `a, b`.
fn listed<'a>(ids: impl IntoIterator<Item = &'a TaskId>) -> String {
    ids.into_iter().map(TaskId::as_str).collect::<Vec<_>>().join(", ")
}

/// The promises of child workflows, for each child with its parent:
/// [`children_link_back_to_their_parent_step`] and
/// [`a_processed_child_is_undone_with_its_parent`]. That every child ends
/// is every task's promise ([`every_task_ends`]); that a Supervisor
/// leader's round leaves no child running whose parent left it is checked
/// after each round (`World::children_left`).
fn check_child_workflows(world: &mut World, read: &[(TaskRecord, Vec<Event>)], problems: &mut Vec<String>) {
    let by_id: BTreeMap<&TaskId, (&TaskRecord, &[Event])> = read.iter().map(|(r, h)| (&r.task.id, (r, h.as_slice()))).collect();
    for (child, child_history) in read.iter().filter(|(r, _)| r.task.parent.is_some()) {
        let Some(link) = &child.task.parent else { continue };
        let Some(&(parent, parent_history)) = by_id.get(&link.task) else {
            problems.push(format!("child {} names parent {}, which does not exist", child.task.id, link.task));
            continue;
        };
        let before = problems.len();
        children_link_back_to_their_parent_step(world, child, child_history, parent, parent_history, problems);
        a_processed_child_is_undone_with_its_parent(world, child, child_history, parent, parent_history, problems);
        if problems.len() > before {
            problems.push(history_for_a_reader(&child.task.id, child_history));
            problems.push(history_for_a_reader(&parent.task.id, parent_history));
        }
    }
}

/// A child belongs to one attempt of one step of its parent: the step runs
/// the child's workflow, the child's id is derived from the attempt, its
/// depth is one below its parent's, and it was created after the attempt
/// had started (once: one `received` event).
fn children_link_back_to_their_parent_step(
    world: &World,
    child: &TaskRecord,
    child_history: &[Event],
    parent: &TaskRecord,
    parent_history: &[Event],
    problems: &mut Vec<String>,
) {
    let Some(link) = &child.task.parent else { return };
    let id = &child.task.id;
    let runs = world.definitions[&parent.task.workflow].step(&link.step).and_then(|d| d.child()).map(|c| c.name().clone());
    if runs.as_ref() != Some(&child.task.workflow) {
        problems
            .push(format!("child {id} ({}) was started by step {} of {}, which runs {runs:?}", child.task.workflow, link.step, link.task));
    }
    if *id != child_task_id(&link.task, &link.step, link.attempt) {
        problems.push(format!("child {id} is not named for its parent's attempt ({}/{}#{})", link.task, link.step, link.attempt));
    }
    let depth = parent.task.parent.as_ref().map_or(0, |p| p.depth) + 1;
    if link.depth != depth {
        problems.push(format!("child {id} has depth {}, but its parent's is {}", link.depth, depth - 1));
    }
    let received: Vec<i64> = child_history.iter().filter(|e| e.kind == EventKind::Received).map(|e| e.seq).collect();
    let started = parent_history
        .iter()
        .find(|e| e.kind == EventKind::StepStarted && e.step.as_ref() == Some(&link.step) && e.attempt == Some(link.attempt))
        .map(|e| e.seq);
    match (received.as_slice(), started) {
        ([created], Some(started)) if started < *created => {}
        _ => problems.push(format!(
            "child {id} was received at {received:?}, but attempt {} of {}'s step {} started at {started:?}",
            link.attempt, link.task, link.step
        )),
    }
}

/// A child that ended Processed while its parent still waited for it is
/// undone with its parent: a parent that ends Compensated or Cancelled
/// undid the step that ran it (here, the step's own compensation; the
/// child's effects are the service's, under the child's id). A child that
/// ended Processed after its parent stopped waiting for it (the attempt
/// failed first: it timed out) keeps its effects, by design: the
/// Supervisor cancels such a child on its next round, and one that ends
/// before that round is not undone (at least once, as a step that timed
/// out after its effect landed). Counted apart.
fn a_processed_child_is_undone_with_its_parent(
    world: &mut World,
    child: &TaskRecord,
    child_history: &[Event],
    parent: &TaskRecord,
    parent_history: &[Event],
    problems: &mut Vec<String>,
) {
    let Some(link) = &child.task.parent else { return };
    let Some(processed) = child_history.iter().find(|e| e.kind == EventKind::Processed).map(|e| e.seq) else { return };
    let left_before = parent_history.iter().any(|e| {
        e.seq < processed && e.kind == EventKind::StepFailed && e.step.as_ref() == Some(&link.step) && e.attempt == Some(link.attempt)
    });
    if left_before {
        *world.counts.children.entry("processed after their parent's attempt failed".into()).or_default() += 1;
        return;
    }
    let undone = world.service.applied(&parent.task.id, &link.step, true);
    if matches!(parent.task.state, TaskState::Compensated | TaskState::Cancelled) && !undone {
        problems.push(format!(
            "child {} ended Processed while its parent waited for it, and its parent ended {} without undoing step {}",
            child.task.id, parent.task.state, link.step
        ));
    }
}

/// Finds effects the service applied for a Compensated or Cancelled task
/// that were never undone: a known bug (see [`known`]).
fn count_leaks(world: &mut World, record: &TaskRecord, problems: &mut Vec<String>) {
    if !matches!(record.task.state, TaskState::Compensated | TaskState::Cancelled) {
        return;
    }
    for step in &record.steps {
        let id = &record.task.id;
        if compensable(world, &record.task.workflow, &step.name)
            && world.service.applied(id, &step.name, false)
            && !world.service.applied(id, &step.name, true)
        {
            world.counts.leaked_effects += 1;
            let ignored: Vec<String> = world
                .ignored_successes
                .iter()
                .filter(|r| &r.task == id && r.step == step.name && !r.compensate)
                .map(|r| format!("attempt {}: {}", r.attempt, r.reason))
                .collect();
            if !ignored.is_empty() {
                world.counts.leaked_after_ignored_reply += 1;
            }
            let line = format!(
                "leak: task {id} ended {} with step {} ({}, attempt {}) applied and never undone; success replies ignored: {ignored:?}",
                record.task.state, step.name, step.state, step.attempt
            );
            known(world, problems, line);
        }
    }
}

/// Records a finding of a once-known bug class (stalls after a takeover,
/// in-doubt compensations lost, leaked effects). They were fixed; a finding
/// is a failure like any other, listed apart in the summary.
fn known(world: &mut World, problems: &mut Vec<String>, line: String) {
    let line = format!("seed {}: {line}", world.seed);
    problems.push(line.clone());
    world.counts.known.push(line);
}

fn steps_summary(record: &TaskRecord) -> String {
    record
        .steps
        .iter()
        .map(|s| format!("{}={}#{} (complete_by {:?}, not_before {})", s.name, s.state, s.attempt, s.complete_by, s.not_before))
        .collect::<Vec<_>>()
        .join(", ")
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.trim().parse().unwrap_or_else(|_| panic!("{name} must be a whole number, got {value:?}")))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime")
}

/// Runs seeds `first..first + count` on every core; each worker thread takes
/// the next seed and runs it on a runtime of its own.
fn run_seeds(first: u64, count: u64) -> (Vec<Outcome>, Counts) {
    let next = std::sync::atomic::AtomicU64::new(first);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
    let results = std::sync::Mutex::new((Vec::new(), Counts::default()));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                let runtime = runtime();
                loop {
                    let seed = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if seed >= first + count {
                        return;
                    }
                    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(run_seed(seed))));
                    let outcome = ran.unwrap_or_else(|panic| {
                        let message = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        Outcome {
                            seed,
                            counts: Counts::default(),
                            problems: vec![format!("panicked: {message}")],
                            trace_tail: String::from("(lost in the panic: replay the seed with ROTA_SIM_TRACE=1)"),
                            trace: Vec::new(),
                            fingerprint: String::new(),
                        }
                    });
                    let mut results = results.lock().unwrap();
                    results.1.add(&outcome.counts);
                    if !outcome.problems.is_empty() {
                        results.0.push(outcome);
                    }
                }
            });
        }
    });
    results.into_inner().unwrap()
}

/// Thousands of seeds in CI; every invariant of [`check`] on each.
#[test]
fn many_seeds() {
    let count = env_u64("ROTA_SIM_SEEDS").unwrap_or(SEEDS_DEFAULT);
    let first = env_u64("ROTA_SIM_FIRST").unwrap_or(0);
    let started = Instant::now();
    let (mut failed, counts) = run_seeds(first, count);
    let elapsed = started.elapsed();
    println!(
        "simulation: {count} seeds ({first}..{}) in {:.1} s, {:.1} simulated hours",
        first + count,
        elapsed.as_secs_f64(),
        counts.simulated_ms as f64 / 3_600_000.0
    );
    println!("  task outcomes: {:?}", counts.outcomes);
    println!("  steps with a condition: {:?}", counts.conditions);
    println!("  driver actions: {:?}", counts.actions);
    println!("  agent fates: {:?}", counts.fates);
    println!("  signals: {:?}", counts.signals);
    println!("  callbacks: {:?}", counts.callbacks);
    println!("  concurrency keys: {:?}", counts.keys);
    println!("  child workflows: {:?}", counts.children);
    println!("  inbox messages handled: {:?}", counts.handled);
    println!(
        "  scheduler crashes {}, supervisor rounds led {}, tasks reset {}, steps reported {}, steps settled {}, \
         late replies delivered {}, slow replies that lost their lease {}, quiet rounds {}",
        counts.scheduler_crashes,
        counts.supervisor_rounds_led,
        counts.tasks_reset,
        counts.steps_reported,
        counts.steps_settled,
        counts.late_delivered,
        counts.slow_lost_lease,
        counts.quiet_rounds
    );
    println!(
        "  effects applied but never compensated in Compensated or Cancelled tasks: {} ({} after a success reply was ignored)",
        counts.leaked_effects, counts.leaked_after_ignored_reply
    );
    let mut known = counts.known.clone();
    known.sort();
    println!("  findings of once-known bug classes (see `known`): {}", known.len());
    for line in known.iter().take(env_u64("ROTA_SIM_KNOWN").unwrap_or(5) as usize) {
        println!("    {line}");
    }
    failed.sort_by_key(|o| o.seed);
    if let Some(first_failure) = failed.first() {
        let seeds: Vec<u64> = failed.iter().map(|o| o.seed).collect();
        panic!("{} of {count} seeds failed: {seeds:?}\n\n{}", failed.len(), first_failure.report());
    }
}

/// Replays one seed: `ROTA_SIM_SEED=<n>` (with `ROTA_SIM_TRACE=1` for the
/// whole trace), or a fixed seed so that the test is never empty.
#[tokio::test(flavor = "current_thread")]
async fn replay() {
    let seed = env_u64("ROTA_SIM_SEED").unwrap_or(REPLAY_DEFAULT);
    let outcome = run_seed(seed).await;
    println!("seed {seed}: {:?}; {} ms simulated", outcome.counts.outcomes, outcome.counts.simulated_ms);
    assert!(outcome.problems.is_empty(), "{}", outcome.report());
}

/// A seed replays exactly: same trace, same final records and histories.
#[tokio::test(flavor = "current_thread")]
async fn a_seed_runs_the_same_twice() {
    for seed in [3, 11] {
        let first = run_seed(seed).await;
        let second = run_seed(seed).await;
        assert_eq!(first.trace, second.trace, "seed {seed} took another path on its second run");
        assert_eq!(first.fingerprint, second.fingerprint, "seed {seed} ended elsewhere on its second run");
        assert!(first.problems.is_empty(), "{}", first.report());
    }
}

fn id(value: &str) -> TaskId {
    TaskId::new(value).unwrap()
}

fn step_name(value: &str) -> StepName {
    StepName::new(value).unwrap()
}

/// A world with no planned tasks of its own, for the targeted scenarios.
/// Its one task is `t0-seq`; recoveries back off 0.5 s to 1 s (Scheduler) and
/// 50 ms to 100 ms (Supervisor).
async fn scenario_world() -> World {
    let mut world = World::with_profile(0, |profile| {
        profile.scheduler_backoff = (1_000, 8_000);
        profile.supervisor_backoff = (100, 1_000);
    })
    .await;
    world.tasks.truncate(1);
    world.tasks[0].declined = None;
    world.tasks[0].workflow = rota_model::WorkflowName::new("seq").unwrap();
    world.tasks[0].id = id("t0-seq");
    world
}

/// The clock is stepped back 5 s while a task waits for its approval
/// signal. The signal completes the wait and wakes the Scheduler, but the
/// next step became due at the task's submission, which the clock now
/// shows only 5 s later: the Scheduler sends itself a Retry for that time,
/// and the step starts then, not when the task's 20 s lease runs out
/// (nothing else would wake the task).
#[tokio::test(flavor = "current_thread")]
async fn a_clock_stepped_back_delays_the_next_step_until_it_is_due_again() {
    let mut world = scenario_world().await;
    let task = id("t0-approve");
    world.tasks[0].workflow = rota_model::WorkflowName::new("approve").unwrap();
    world.tasks[0].id = task.clone();
    assert!(world.submit_next().await.unwrap());
    assert_eq!(world.claim_with(0).await.unwrap(), 1);
    let first = world.agent_once(Fate::Succeed).await.unwrap().expect("the hold request");
    assert_eq!(first.call.step.as_str(), "hold");
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1, "the reply: the task now waits for its signal");

    world.step_back(Duration::from_secs(5));
    world.signal(&task, sim::SIGNAL).await.unwrap();
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1, "the Signalled notice");
    let record = world.store.task(&task).await.unwrap().unwrap();
    let states: Vec<(&str, StepState)> = record.steps.iter().map(|s| (s.name.as_str(), s.state)).collect();
    assert_eq!(states, [("hold", StepState::Completed), ("approval", StepState::Completed), ("pay", StepState::NotStarted)]);
    world.find_stalls_now().await.unwrap();
    assert!(world.stalls.is_empty(), "a Retry is on its way: {:?}", world.stalls);

    world.advance(Duration::from_millis(4_900));
    assert_eq!(world.drain_inbox(0).await.unwrap(), 0, "not due yet");
    world.advance(Duration::from_millis(100));
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1, "the Retry, once the clock is back at the submission");
    let record = world.store.task(&task).await.unwrap().unwrap();
    let pay = record.steps.iter().find(|s| s.name.as_str() == "pay").unwrap();
    assert_eq!((pay.state, pay.attempt), (StepState::Running, 1), "pay started within the task's lease");
    assert_eq!(record.task.failure_count, 0);
    assert!(world.quiet_phase(100).await.unwrap());
    assert_eq!(world.state(&task).await, TaskState::Processed);
    let mut problems = Vec::new();
    check(&mut world, &mut problems).await;
    assert!(problems.is_empty(), "{problems:#?}");
}

/// An agent's reply to attempt 1 is held back past the step's timeout; the
/// Supervisor reports the timeout, the Scheduler retries with attempt 2, and
/// only then does the late reply arrive: the fence refuses it, and the step
/// completes once, for attempt 2.
#[tokio::test(flavor = "current_thread")]
async fn a_late_reply_after_a_supervisor_driven_retry_is_fenced() {
    let mut world = scenario_world().await;
    let task = id("t0-seq");
    let reserve = step_name("reserve");
    assert!(world.submit_next().await.unwrap());
    assert_eq!(world.claim_with(0).await.unwrap(), 1);
    let first = world.agent_once(Fate::Late).await.unwrap().expect("the first request");
    assert_eq!((first.call.step.as_str(), first.call.attempt), ("reserve", 1));

    // Past the step's timeout: the Supervisor reports it, the Scheduler retries.
    world.advance(sim::STEP_TIMEOUT + Duration::from_millis(1));
    world.supervise_once().await.unwrap();
    assert_eq!(world.counts.steps_reported, 1);
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1, "the StepExpired report");
    world.advance(Duration::from_secs(2)); // past the recovery backoff
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1, "the Retry");
    let record = world.store.task(&task).await.unwrap().unwrap();
    let step = record.steps.iter().find(|s| s.name == reserve).unwrap();
    assert_eq!((step.state, step.attempt), (StepState::Running, 2));
    assert_eq!(record.task.failure_count, 1, "the timeout counted against the task");

    // The late reply for attempt 1 arrives now, and is fenced out.
    assert_eq!(world.deliver_held().await.unwrap(), 1);
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1);
    let ignored = world.ignored_successes.last().expect("the late reply was ignored");
    assert_eq!((ignored.attempt, ignored.step.as_str()), (1, "reserve"));
    assert!(ignored.reason.contains("lease lost"), "{}", ignored.reason);
    let record = world.store.task(&task).await.unwrap().unwrap();
    let step = record.steps.iter().find(|s| s.name == reserve).unwrap();
    assert_eq!((step.state, step.attempt), (StepState::Running, 2), "the late reply changed nothing");

    // Attempt 2 succeeds (the service repeats the result of the effect it applied once).
    let second = world.agent_once(Fate::Succeed).await.unwrap().expect("the second request");
    assert_eq!(second.call.attempt, 2);
    assert_eq!(world.service.effects[&(task.clone(), reserve.clone(), false)].attempt, 1, "applied once, by attempt 1");
    assert!(world.quiet_phase(100).await.unwrap());
    assert_eq!(world.state(&task).await, TaskState::Processed);
    let mut problems = Vec::new();
    check(&mut world, &mut problems).await;
    assert!(problems.is_empty(), "{problems:#?}");
    let history = world.store.history(&task).await.unwrap();
    let completions: Vec<u32> = history
        .iter()
        .filter(|e| e.kind == EventKind::StepCompleted && e.step.as_ref() == Some(&reserve))
        .filter_map(|e| e.attempt)
        .collect();
    assert_eq!(completions, [2], "reserve completed once, for attempt 2");
}

/// The only Scheduler crashes while the task's first step is in flight (its
/// reply lands in the dead Scheduler's inbox). Another Scheduler cannot take
/// the task until the Supervisor finds the deadline passed and resets it;
/// then it claims the task, re-sends the step as a new attempt, and finishes.
#[tokio::test(flavor = "current_thread")]
async fn a_crash_of_the_only_scheduler_is_recovered_by_another_after_the_deadline() {
    let mut world = scenario_world().await;
    let task = id("t0-seq");
    let reserve = step_name("reserve");
    assert!(world.submit_next().await.unwrap());
    assert_eq!(world.claim_with(0).await.unwrap(), 1);
    world.agent_once(Fate::Succeed).await.unwrap().expect("the first request");
    let dead = world.crash_scheduler(0);
    let live = world.add_scheduler(None);
    assert_ne!(dead, live);

    // Before the deadline, the task stays with the dead Scheduler.
    world.advance(sim::DEADLINE - Duration::from_secs(1));
    world.supervise_once().await.unwrap();
    assert_eq!(world.claim_with(0).await.unwrap(), 0, "the task is still leased to {dead}");
    let record = world.store.task(&task).await.unwrap().unwrap();
    assert_eq!((record.task.state, record.task.locked_by.as_ref()), (TaskState::Processing, Some(&dead)));

    // Past it, the Supervisor resets the task and the live Scheduler takes it.
    world.advance(Duration::from_secs(1));
    world.supervise_once().await.unwrap();
    assert_eq!(world.counts.tasks_reset, 1);
    let record = world.store.task(&task).await.unwrap().unwrap();
    assert_eq!((record.task.state, record.task.failure_count, record.task.locked_by.clone()), (TaskState::Pending, 1, None));
    world.advance(Duration::from_secs(2)); // past the recovery backoff
    assert_eq!(world.claim_with(0).await.unwrap(), 1);
    let record = world.store.task(&task).await.unwrap().unwrap();
    assert_eq!(record.task.locked_by.as_ref(), Some(&live));
    let step = record.steps.iter().find(|s| s.name == reserve).unwrap();
    assert_eq!((step.state, step.attempt), (StepState::Running, 2), "the step in flight was sent again as attempt 2");

    assert!(world.quiet_phase(100).await.unwrap());
    assert_eq!(world.state(&task).await, TaskState::Processed);
    let mut problems = Vec::new();
    check(&mut world, &mut problems).await;
    assert!(problems.is_empty(), "{problems:#?}");
    let history = world.store.history(&task).await.unwrap();
    assert!(history.iter().any(|e| e.kind == EventKind::Expired), "the Supervisor recorded the expiry");
    assert_eq!(history.iter().filter(|e| e.kind == EventKind::StepCompleted).count(), 3, "each step completed once");
}

/// A Scheduler dies between its claim's commit and its start's (as `rota
/// serve` SIGKILLed right after a submit does): the task is held by the dead
/// instance with nothing in flight, and only the Supervisor can free it, once
/// the claim lease has run out. With the default lease that takes seconds;
/// it took a minute (twenty times this short workflow's deadline) when the
/// default lease was 60 s.
#[tokio::test(flavor = "current_thread")]
async fn a_scheduler_dead_between_its_claim_and_its_start_holds_the_task_for_seconds() {
    let mut world = scenario_world().await;
    let task = id("t0-seq");
    let reserve = step_name("reserve");
    assert!(world.submit_next().await.unwrap());
    let dead = world.crash_scheduler(0);
    // Its claim, as `Scheduler::claim_once` takes it, with the default lease.
    let lease = scheduler::Config::new(dead.clone()).claim_lease;
    let claimed = world.store.claim_tasks(&dead, lease, 1).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let live = world.add_scheduler(None);

    // Ten seconds on, the Supervisor has reset the task.
    world.advance(Duration::from_secs(10));
    world.supervise_once().await.unwrap();
    let record = world.store.task(&task).await.unwrap().unwrap();
    assert_eq!(
        (record.task.state, record.task.locked_by.as_ref(), world.counts.tasks_reset),
        (TaskState::Pending, None, 1),
        "10 s after a claim whose start never came, the task is still held by {dead} (claim lease {lease:?})"
    );

    // Another Scheduler takes it and runs it from its first step.
    world.advance(Duration::from_secs(2)); // past the recovery backoff
    assert_eq!(world.claim_with(0).await.unwrap(), 1);
    let record = world.store.task(&task).await.unwrap().unwrap();
    assert_eq!(record.task.locked_by.as_ref(), Some(&live));
    let step = record.steps.iter().find(|s| s.name == reserve).unwrap();
    assert_eq!((step.state, step.attempt), (StepState::Running, 1));
    assert!(world.quiet_phase(100).await.unwrap());
    assert_eq!(world.state(&task).await, TaskState::Processed);
    let mut problems = Vec::new();
    check(&mut world, &mut problems).await;
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A step fails (here: times out) just before the task's deadline and backs
/// off; the Supervisor resets the task at the deadline, and another Scheduler
/// claims it before the backoff has passed. The Retry its previous holder
/// scheduled is ignored there, so the claim schedules its own: the step runs
/// once its backoff has passed and the task is Processed, with no stall.
#[tokio::test(flavor = "current_thread")]
async fn a_task_taken_over_while_a_step_backs_off_waits_for_its_deadline() {
    let mut world = scenario_world().await;
    let task = id("t0-seq");
    assert!(world.submit_next().await.unwrap());
    assert_eq!(world.claim_with(0).await.unwrap(), 1);
    // Just before the deadline, reserve's timeout is reported and it backs off.
    world.advance(sim::DEADLINE - Duration::from_millis(100));
    world.supervise_once().await.unwrap();
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1, "the StepExpired report");
    let backing_off = world.store.task(&task).await.unwrap().unwrap();
    let reserve_not_before = backing_off.steps[0].not_before;
    // At the deadline the task is reset; a second Scheduler claims it while reserve still backs off.
    let second = world.add_scheduler(None);
    world.advance(Duration::from_millis(200));
    world.supervise_once().await.unwrap();
    assert_eq!(world.counts.tasks_reset, 1);
    world.advance(Duration::from_millis(200));
    assert_eq!(world.claim_with(1).await.unwrap(), 1);
    assert!(world.clock.now() < reserve_not_before, "the claim came while reserve backs off");
    world.find_stalls_now().await.unwrap();
    assert!(world.stalls.is_empty(), "a Retry is on its way: {:?}", world.stalls);
    let _ = second;

    assert!(world.quiet_phase(200).await.unwrap());
    let record = world.store.task(&task).await.unwrap().unwrap();
    assert_eq!(record.task.state, TaskState::Processed);
    let history = world.store.history(&task).await.unwrap();
    assert_eq!(history.iter().filter(|e| e.kind == EventKind::Expired).count(), 1, "only the deadline the test forced");
    let mut problems = Vec::new();
    check(&mut world, &mut problems).await;
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The operator cancels a task while its second step is in flight; the
/// agent's success reply (the charge was applied) reaches the Scheduler
/// while the task is unleased, Compensating, and is ignored. The Scheduler
/// that claims the compensation leaves the running step to settle; it times
/// out and, its effect being in doubt, is compensated first.
#[tokio::test(flavor = "current_thread")]
async fn a_step_in_flight_when_cancelled_is_compensated_in_doubt() {
    let mut world = scenario_world().await;
    let task = id("t0-seq");
    let charge = step_name("charge");
    assert!(world.submit_next().await.unwrap());
    assert_eq!(world.claim_with(0).await.unwrap(), 1);
    world.agent_once(Fate::Succeed).await.unwrap().expect("reserve's request");
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1);
    let request = world.agent_once(Fate::Succeed).await.unwrap().expect("charge's request");
    assert_eq!(request.call.step, charge);
    world.cancel(&task).await.unwrap();
    assert_eq!(world.state(&task).await, TaskState::Compensating);
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1);
    let ignored = world.ignored_successes.last().expect("charge's reply was ignored");
    assert_eq!(ignored.step, charge);
    assert!(ignored.reason.contains("is not leased by"), "{}", ignored.reason);

    assert!(world.quiet_phase(200).await.unwrap());
    assert_eq!(world.state(&task).await, TaskState::Compensated);
    assert!(world.service.applied(&task, &charge, true), "the charge was undone");
    assert!(world.service.applied(&task, &step_name("reserve"), true), "the reservation was undone");
    let history = world.store.history(&task).await.unwrap();
    let undone: Vec<&str> =
        history.iter().filter(|e| e.kind == EventKind::StepCompensated).filter_map(|e| e.step.as_ref().map(|s| s.as_str())).collect();
    assert_eq!(undone, ["charge", "reserve"]);
    let mut problems = Vec::new();
    check(&mut world, &mut problems).await;
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The operator cancels a task while its first step is in flight (the
/// reservation was applied, its reply lost). The step times out and is
/// settled in doubt, and the first attempt at its compensation fails with a
/// transient error.
///
/// The Scheduler finds the in-doubt settle in the history (a `StepFailed`
/// event with `in_doubt`), so the reservation's compensation is retried after
/// its backoff and the task ends Compensated with it undone (this was lost
/// once: simulation seeds 39, 150, 346, and out of order in 32, 49, 63).
#[tokio::test(flavor = "current_thread")]
async fn an_in_doubt_step_whose_compensation_fails_once_is_retried() {
    let mut world = scenario_world().await;
    let task = id("t0-seq");
    let reserve = step_name("reserve");
    assert!(world.submit_next().await.unwrap());
    assert_eq!(world.claim_with(0).await.unwrap(), 1);
    world.agent_once(Fate::LoseReply).await.unwrap().expect("reserve's request: applied, the reply lost");
    world.cancel(&task).await.unwrap();
    assert_eq!(world.claim_with(0).await.unwrap(), 1, "the compensation is claimed");
    world.advance(sim::STEP_TIMEOUT + Duration::from_millis(1));
    world.supervise_once().await.unwrap();
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1, "reserve's timeout: settled in doubt, its compensation sent");
    let undo = world.agent_once(Fate::FailRetryable).await.unwrap().expect("reserve's compensation");
    assert!(undo.call.compensate && undo.call.step == reserve);
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1, "the transient failure of the compensation");

    assert_eq!(world.state(&task).await, TaskState::Compensating, "the compensation waits to be retried");
    assert!(world.quiet_phase(200).await.unwrap());
    let record = world.store.task(&task).await.unwrap().unwrap();
    assert_eq!(record.task.state, TaskState::Compensated);
    let step = record.steps.iter().find(|s| s.name == reserve).unwrap();
    assert_eq!(step.state, StepState::Compensated);
    assert!(world.service.applied(&task, &reserve, false), "the reservation was applied");
    assert!(world.service.applied(&task, &reserve, true), "and undone");
}

/// A step's attempt times out (the charge was applied, its reply lost) and
/// the step waits to be retried; before the retry, the operator cancels the
/// task.
///
/// The charge's last attempt was never confirmed, so its effect is in
/// doubt: the compensation settles it in doubt and undoes it first, then the
/// reservation.
#[tokio::test(flavor = "current_thread")]
async fn a_step_that_timed_out_before_a_cancel_is_compensated_in_doubt() {
    let mut world = scenario_world().await;
    let task = id("t0-seq");
    let charge = step_name("charge");
    assert!(world.submit_next().await.unwrap());
    assert_eq!(world.claim_with(0).await.unwrap(), 1);
    world.agent_once(Fate::Succeed).await.unwrap().expect("reserve's request");
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1);
    world.agent_once(Fate::LoseReply).await.unwrap().expect("charge's request: applied, the reply lost");
    world.advance(sim::STEP_TIMEOUT + Duration::from_millis(1));
    world.supervise_once().await.unwrap();
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1, "charge's timeout: retried after a backoff");
    world.cancel(&task).await.unwrap();
    assert!(world.quiet_phase(200).await.unwrap());

    assert_eq!(world.state(&task).await, TaskState::Compensated);
    assert!(world.service.applied(&task, &step_name("reserve"), true), "the reservation was undone");
    assert!(world.service.applied(&task, &charge, false), "the charge was applied");
    assert!(world.service.applied(&task, &charge, true), "the charge was undone");
    let history = world.store.history(&task).await.unwrap();
    let undone: Vec<&str> =
        history.iter().filter(|e| e.kind == EventKind::StepCompensated).filter_map(|e| e.step.as_ref().map(|s| s.as_str())).collect();
    assert_eq!(undone, ["charge", "reserve"]);
}

/// The operator cancels an order while its child (a parcel) is about to
/// finish: the child's last reply is on its way. The child ends Processed
/// right after the cancel, before the order's Scheduler claims its
/// compensation and long before a Supervisor's round could cancel it.
///
/// The order stops waiting for its child, and since its child step has a
/// compensation, it settles the step in doubt and compensates it, so the
/// child's effects are undone with the order. (Once the step was failed
/// outright, trusting the Supervisor to cancel the child, and the order
/// ended Compensated with the finished parcel's effects kept: simulation
/// seed 10.)
#[tokio::test(flavor = "current_thread")]
async fn a_child_that_finished_as_its_parent_was_cancelled_is_undone_by_the_parent() {
    let mut world = scenario_world().await;
    let order = id("t0-order");
    world.tasks[0].workflow = rota_model::WorkflowName::new("order").unwrap();
    world.tasks[0].id = order.clone();
    let ship = step_name(sim::CHILD_STEP);
    let parcel = child_task_id(&order, &ship, 1);
    assert!(world.submit_next().await.unwrap());
    assert_eq!(world.claim_with(0).await.unwrap(), 1);
    world.agent_once(Fate::Succeed).await.unwrap().expect("pay's request");
    assert_eq!(world.drain_inbox(0).await.unwrap(), 2, "pay's reply, then the StartChild of ship");
    assert_eq!(world.state(&parcel).await, TaskState::Pending, "the child was created");
    assert_eq!(world.claim_with(0).await.unwrap(), 1, "the child is claimed");
    world.agent_once(Fate::Succeed).await.unwrap().expect("book's request");
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1);
    let label = world.agent_once(Fate::Succeed).await.unwrap().expect("label's request");
    assert_eq!(label.call.task_id, parcel);
    world.cancel(&order).await.unwrap();
    assert_eq!(world.state(&order).await, TaskState::Compensating);
    assert_eq!(world.drain_inbox(0).await.unwrap(), 1, "label's reply");
    assert_eq!(world.state(&parcel).await, TaskState::Processed, "the child finished after the cancel");

    assert!(world.quiet_phase(200).await.unwrap());
    assert_eq!(world.state(&order).await, TaskState::Compensated);
    assert!(world.service.applied(&order, &ship, true), "the order's ship step was compensated");
    let history = world.store.history(&order).await.unwrap();
    let undone: Vec<&str> =
        history.iter().filter(|e| e.kind == EventKind::StepCompensated).filter_map(|e| e.step.as_ref().map(|s| s.as_str())).collect();
    assert_eq!(undone, [sim::CHILD_STEP, "pay"]);
    let mut problems = Vec::new();
    check(&mut world, &mut problems).await;
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The checks themselves: a history doctored after the fact (a step
/// completed a second time, once more for a stale attempt, and a compensation
/// out of order in a processed task) is caught.
#[tokio::test(flavor = "current_thread")]
async fn the_checks_catch_a_doctored_history() {
    let mut world = scenario_world().await;
    let task = id("t0-seq");
    assert!(world.submit_next().await.unwrap());
    assert!(world.quiet_phase(100).await.unwrap());
    let mut problems = Vec::new();
    check(&mut world, &mut problems).await;
    assert!(problems.is_empty(), "{problems:#?}");

    let record = world.store.task(&task).await.unwrap().unwrap();
    let now = world.clock.now();
    let charge = record.steps[1].clone();
    let stale = rota_model::Step { attempt: 0, ..charge.clone() };
    let events = vec![
        Event::step(&charge, now, EventKind::StepCompleted, json!({})),
        Event::step(&stale, now, EventKind::StepCompleted, json!({})),
        Event::step(&record.steps[0], now, EventKind::StepCompensated, json!({})),
    ];
    finds_in_doctored_history(
        &mut world,
        events,
        &[
            "step charge completed twice",
            "step charge: a StepCompleted event for attempt 0 after attempt 1",
            "step charge completed for attempt 0, but the last attempt started was Some(1)",
            "step charge completed for attempt 0, for which the agent sent no success",
            "step reserve compensated for attempt 1, but the last compensation started was None",
            "which does not begin the reverse completion order",
            "processed, yet compensation ran",
        ],
    )
    .await;
}

/// Commits `events` into the histories as if they had happened, runs every
/// check, and asserts that the problems found mention each of `expected`.
async fn finds_in_doctored_history(world: &mut World, events: Vec<Event>, expected: &[&str]) {
    world.store.commit(Changes { events, ..Changes::default() }).await.unwrap();
    let mut problems = Vec::new();
    check(world, &mut problems).await;
    let all = problems.join("\n");
    for expected in expected {
        assert!(all.contains(expected), "missing {expected:?} in:\n{all}");
    }
}

/// The key checks themselves: two tasks of one customer run one after the
/// other; then a history doctored after the fact has the second resubmitted
/// and claimed before the first (resubmitted too, so older), and the first
/// claimed while the second holds the key's only slot: both are caught.
#[tokio::test(flavor = "current_thread")]
async fn the_key_checks_catch_a_doctored_history() {
    let mut world = scenario_world().await;
    let keyed = rota_model::WorkflowName::new("keyed").unwrap();
    world.tasks.push(world.tasks[0].clone());
    for (n, planned) in world.tasks.iter_mut().enumerate() {
        planned.workflow = keyed.clone();
        planned.id = id(&format!("t{n}-keyed"));
        planned.customer = "c0".into();
    }
    let (first, second) = (world.tasks[0].id.clone(), world.tasks[1].id.clone());
    assert!(world.submit_next().await.unwrap());
    assert!(world.submit_next().await.unwrap());
    assert!(world.quiet_phase(100).await.unwrap());
    let mut problems = Vec::new();
    check(&mut world, &mut problems).await;
    assert!(problems.is_empty(), "{problems:#?}");
    let seq = |history: Vec<Event>, kind: EventKind| history.iter().find(|e| e.kind == kind).map(|e| e.seq);
    let ended = seq(world.store.history(&first).await.unwrap(), EventKind::Processed);
    let started = seq(world.store.history(&second).await.unwrap(), EventKind::Claimed);
    assert!(ended.is_some() && ended < started, "the second started after the first ended: {ended:?}, {started:?}");

    let now = world.clock.now();
    let claimed = || json!({ "owner": "s9", "lease_epoch": 9 });
    let events = vec![
        Event::task(&first, now, EventKind::Resubmitted, json!({})),
        Event::task(&second, now, EventKind::Resubmitted, json!({})),
        Event::task(&second, now, EventKind::Claimed, claimed()),
        Event::task(&first, now, EventKind::Claimed, claimed()),
    ];
    finds_in_doctored_history(
        &mut world,
        events,
        &[
            "task t1-keyed took a slot of its key (limit 1) before [t0-keyed], submitted before it and waiting",
            "task t0-keyed took a slot of its key while [t1-keyed] held all 1",
            "events of key keyed/customer=c0",
        ],
    )
    .await;
}

/// A task fails (charge is declined) and its compensation fails too (the
/// reservation's release is declined): Error, with an alert. The operator
/// resubmits it.
///
/// The resubmit resumes the compensation: the release of reserve runs
/// again and the task ends Compensated; no completed step runs again.
#[tokio::test(flavor = "current_thread")]
async fn a_resubmit_after_a_failed_compensation_resumes_it() {
    let mut world = scenario_world().await;
    let task = id("t0-seq");
    let reserve = step_name("reserve");
    world.tasks[0].declined = Some(step_name("charge"));
    assert!(world.submit_next().await.unwrap());
    assert_eq!(world.claim_with(0).await.unwrap(), 1);
    world.agent_once(Fate::Succeed).await.unwrap().expect("reserve's request");
    world.drain_inbox(0).await.unwrap();
    world.agent_once(Fate::Succeed).await.unwrap().expect("charge's request, declined");
    world.drain_inbox(0).await.unwrap();
    assert_eq!(world.state(&task).await, TaskState::Compensating);
    assert_eq!(world.claim_with(0).await.unwrap(), 1);
    let release = world.agent_once(Fate::FailPermanent).await.unwrap().expect("reserve's compensation");
    assert!(release.call.compensate);
    world.drain_inbox(0).await.unwrap();
    assert_eq!(world.state(&task).await, TaskState::Error);

    world.resubmit(&task).await.unwrap();
    assert!(world.quiet_phase(200).await.unwrap());
    let history = world.store.history(&task).await.unwrap();
    let completed: Vec<u32> = history
        .iter()
        .filter(|e| e.kind == EventKind::StepCompleted && e.step.as_ref() == Some(&reserve))
        .filter_map(|e| e.attempt)
        .collect();
    assert_eq!(completed, [1], "reserve does not run again after the resubmit");
    assert_eq!(world.state(&task).await, TaskState::Compensated);
    assert!(world.service.applied(&task, &reserve, true), "the reservation was undone");
    let mut problems = Vec::new();
    check(&mut world, &mut problems).await;
    assert!(problems.is_empty(), "{problems:#?}");
}

/// How many seeds the schedule scenario runs.
const SCHEDULE_SEEDS: u64 = 12;

/// A schedule firing every second while the Supervisor leader crashes,
/// sometimes in the middle of a fire: it has submitted some of the round's
/// fires and dies before recording the schedule's progress, still holding
/// its lease. The next leader (once the lease ran out) fires the same times
/// again, finds the tasks already created (same derived ids) and advances.
/// Checked per seed: exactly one task per fire time from the schedule's
/// creation to its last handled fire, none missing, each received once
/// with the fire that started it.
#[tokio::test(flavor = "current_thread")]
async fn a_schedule_fires_each_time_once_across_leader_crashes_mid_fire() {
    use rand::{Rng, SeedableRng};
    use rota_engine::Fired;
    use rota_engine::schedules::{self, plan};
    use rota_engine::{Submission, ops};
    use rota_model::schedule::{fire_task_id, rfc3339_seconds};
    use rota_model::{CatchUp, Overlap, ScheduleName, Timestamp};
    use rota_store::{NewSchedule, ScheduleSource, ScheduleSpec, TaskFilter};

    let mut fires_left_unrecorded = 0;
    for seed in 0..SCHEDULE_SEEDS {
        let mut world = World::new(seed).await;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let name = ScheduleName::new("tick").unwrap();
        let workflow = world.definitions.keys().next().unwrap().clone();
        let spec = ScheduleSpec {
            workflow,
            cron: "* * * * * *".into(),
            timezone: "UTC".into(),
            input: json!({}),
            overlap: Overlap::Allow,
            catch_up: CatchUp::All,
        };
        let new = NewSchedule { name: name.clone(), spec, source: ScheduleSource::Api };
        let (created, _) = world.client().create_schedule(&new).await.map_err(|e: ops::Error| e.to_string()).unwrap();
        let mut crashes_mid_fire = 0;
        for _ in 0..60 {
            let step = Duration::from_millis(rng.random_range(100..2_500));
            world.advance(step);
            if rng.random_bool(0.15) {
                // A leader's round that dies after submitting some of its fires.
                let record = world.store.schedule(&name).await.unwrap().unwrap();
                let cron = record.spec.parse_cron().unwrap();
                let planned = plan(&record, &cron, world.clock.now(), false, &schedules::Config::default());
                let submitted = rng.random_range(0..=planned.start.len());
                for at in &planned.start[..submitted] {
                    let fired = Fired { schedule: name.clone(), fire_at: *at, manual: false };
                    let submission =
                        Submission::new(record.spec.workflow.clone(), json!({})).with_id(fire_task_id(&name, *at)).fired_by(fired);
                    world.client().submit(submission).await.unwrap();
                }
                world.note(format!("a leader dies mid-fire after {submitted} of {} fires", planned.start.len()));
                fires_left_unrecorded += submitted;
                crashes_mid_fire += 1;
                world.crash_supervisors();
            } else {
                world.supervise_all().await.unwrap();
            }
        }
        // Quiet: the surviving leader takes over and catches up.
        for _ in 0..10 {
            world.advance(Duration::from_secs(1));
            world.supervise_all().await.unwrap();
        }
        let after = world.store.schedule(&name).await.unwrap().unwrap();
        let first = created.record.progress.fired_through.as_millis() / 1000 + 1;
        let last = after.progress.fired_through.as_millis().div_euclid(1000);
        let expected: BTreeSet<String> =
            (first..=last).map(|s| format!("tick@{}", rfc3339_seconds(Timestamp::from_millis(s * 1000)))).collect();
        let filter = TaskFilter { limit: 10_000, ..TaskFilter::default() };
        let tasks = world.store.list_tasks(&filter).await.unwrap();
        let found: BTreeSet<String> = tasks.iter().map(|t| t.id.to_string()).filter(|id| id.starts_with("tick@")).collect();
        let context = format!("seed {seed}, {crashes_mid_fire} crashes mid-fire\n{}", world.trace_tail());
        assert_eq!(found, expected, "one task per fire time, none missing: {context}");
        assert!(expected.len() > 30, "the schedule fired all along: {context}");
        assert!(world.clock.now().since(after.progress.fired_through) <= Duration::from_secs(2), "it caught up: {context}");
        for task in tasks.iter().filter(|t| t.id.as_str().starts_with("tick@")) {
            let history = world.store.history(&task.id).await.unwrap();
            let received: Vec<&Event> = history.iter().filter(|e| e.kind == EventKind::Received).collect();
            assert_eq!(received.len(), 1, "{}: received once: {context}", task.id);
            let fire_at = received[0].detail["schedule"]["fire_at"].as_str().unwrap().replace(".000Z", "Z");
            assert_eq!(format!("tick@{fire_at}"), task.id.as_str(), "the event names the fire: {context}");
        }
    }
    assert!(fires_left_unrecorded > 0, "some crashes came after a submission and before the advance");
}
