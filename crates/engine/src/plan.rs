//! The Scheduler's decisions, as pure functions: from a task's record, its
//! workflow and one input (a claim, a reply, a retry, a timeout), the
//! changes to commit. No IO and no clock: `now` and the RNG come in, a
//! [`Decision`] goes out, and the Scheduler commits it as one fenced
//! transaction. The simulation tests drive exactly these functions.
//!
//! Rules, in the pattern's words:
//! * Every change is recorded before it is acted on: a step's request is sent
//!   in the same commit that records the step as running.
//! * A reply for any attempt but the current one changes nothing.
//! * A permanent error ends the task in Error with an alert, or starts the
//!   compensation, per the workflow's `on_exhausted`, without counting
//!   against `max_failures`. A transient failure the step's retry policy
//!   lists as `non_retryable` arrives as a permanent one (the agent turned
//!   it), so it ends the step's retries the same way.
//! * A transient failure (retries used up inside the deadline, or a
//!   timeout reported by the Supervisor) counts against the task's
//!   `failure_count`; below `max_failures` the step is retried after a
//!   backoff, at the threshold the task ends as for a permanent error.
//! * A callback step's attempt carries a one-time token (see
//!   [`crate::callback`]); its agent's success only says the request was
//!   accepted, and the step completes when the callback comes, or times
//!   out like any attempt.
//! * A claim sets the task's warning point (the workflow's `warn_after`)
//!   and every attempt of a step its own (the step's `warn_after`); the
//!   Supervisor raises the warnings. Compensations have none.
//! * A step with a `when` condition has it decided as it becomes ready
//!   (every dependency completed or skipped), before its first attempt:
//!   false skips it (Skipped, a `step_skipped` event), and a skipped step
//!   settles its dependents like a completed one; a condition that cannot
//!   be decided (a missing field, a value of the wrong kind) is a permanent
//!   failure of the step. A skipped step has no output (it is left out of
//!   the task's output, and a template reading it fails) and nothing to
//!   compensate.
//! * A paused task starts no step (nor compensation, nor its end): its
//!   steps in flight finish and are recorded, and once none is in flight
//!   its holder gives it back (`released`, `paused: true`); it is not
//!   claimed again until resumed.
//! * Compensation undoes completed steps one at a time, in reverse order of
//!   completion, and waits for steps still in flight to settle first. A step
//!   whose attempt timed out while the task is being undone is "in doubt"
//!   (the agent may have applied it and lost the answer): it is settled as
//!   completed without output and compensated first. Compensations must
//!   therefore be idempotent and accept that there may be nothing to undo.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::Rng;
use rota_agent::Request;
use rota_model::{InstanceId, QueueName, RetryPolicy, Step, StepName, StepState, Task, TaskState, Timestamp};
use rota_store::{Changes, Event, EventKind, Outgoing, StepWrite, TaskRecord, TaskWrite};
use rota_workflow::{TemplateContext, Workflow};
use serde_json::{Value, json};

use crate::protocol::{self, Doorbell, InboxEnvelope, InboxMessage, Reply, ReplyOutcome, StepRequest};

/// The largest step request (or compensation request) a Scheduler sends:
/// the largest message body every store takes. A larger one fails its step
/// for good, since it could never be committed.
pub const REQUEST_BYTES_MAX: usize = rota_store::BODY_BYTES_MAX;

/// The largest response to a callback step's request kept in the
/// `callback` event that records it (a bigger one is left out): the
/// response is an acknowledgement, the callback brings the output.
pub const ACCEPTED_RESPONSE_BYTES_MAX: usize = 4 * 1024;

/// What the Scheduler knows when it decides.
pub struct Context<'a> {
    /// The task's workflow, at the version the task started with.
    pub workflow: &'a Workflow,
    /// This Scheduler instance.
    pub me: &'a InstanceId,
    /// Its inbox, where replies come back.
    pub inbox: &'a QueueName,
    /// The time of the decision.
    pub now: Timestamp,
    /// The backoff between recoveries of a step (Supervisor-level retries).
    pub recovery: &'a RetryPolicy,
    /// The trace context of the decision, carried by the messages it sends.
    pub traceparent: Option<&'a str>,
    /// The key callback tokens are derived under.
    pub callback_key: &'a [u8],
    /// The most items a `for_each` step may have; a longer list fails the
    /// step (see [`crate::scheduler::Config::for_each_items_max`]).
    pub for_each_items_max: usize,
}

/// What happened that needs a decision.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// The task was just claimed (new, taken over, or to compensate).
    Claimed,
    /// An agent replied.
    Reply(&'a Reply),
    /// A step's backoff has passed.
    Retry(&'a StepName),
    /// The Supervisor reports an attempt that timed out.
    StepExpired(&'a StepName, u32),
    /// A signal completed this waiting step (already recorded).
    Signalled(&'a StepName),
}

/// The outcome of a decision.
#[derive(Debug)]
pub enum Decision {
    /// Commit these changes (they include the fenced task write).
    Commit(Box<Changes>),
    /// Nothing to do; the message that caused it is settled as is.
    Ignore(String),
}

/// Decides what `input` means for the task in `record`. `completed_in_order`
/// lists the task's steps in the order they completed (from its history);
/// compensation runs in reverse of it.
pub fn decide(record: &TaskRecord, completed_in_order: &[StepName], input: Input<'_>, cx: &Context<'_>, rng: &mut impl Rng) -> Decision {
    let task = &record.task;
    if task.locked_by.as_ref() != Some(cx.me) {
        return Decision::Ignore(format!("task {} is not leased by {}", task.id, cx.me));
    }
    let Some(fence) = task.fence() else { return Decision::Ignore("task has no lease".into()) };
    let steps_before: BTreeMap<StepName, &Step> = record.steps.iter().map(|s| (s.name.clone(), s)).collect();
    let mut draft = Draft::new(record, &steps_before, completed_in_order, cx);

    let applied = match input {
        Input::Claimed => draft.on_claimed(fence),
        Input::Reply(reply) => draft.on_reply(reply, rng),
        Input::Retry(_) | Input::Signalled(_) => Ok(()),
        Input::StepExpired(step, attempt) => draft.on_step_expired(step, attempt, rng),
    };
    if let Err(reason) = applied {
        return Decision::Ignore(reason);
    }
    if draft.task.locked_by.as_ref() == Some(cx.me) {
        draft.advance(fence);
    }
    draft.finish()
}

/// The steps' outputs as a decision leaves them: the record's, read in
/// place, and the few the decision changed, copied.
struct Outputs<'a> {
    before: &'a BTreeMap<StepName, &'a Step>,
    /// Outputs the draft set or cleared.
    changed: BTreeMap<StepName, Option<Value>>,
}

impl rota_workflow::StepOutputs for Outputs<'_> {
    fn output(&self, step: &StepName) -> Option<&Value> {
        match self.changed.get(step) {
            Some(changed) => changed.as_ref(),
            None => self.before.get(step).and_then(|before| before.output.as_ref()),
        }
    }
}

/// The task's steps as a decision leaves them: the record's rows, read in
/// place, under the rows the decision wrote. (Copying every row at every
/// decision made a step's cost grow with the workflow's length.)
struct Steps<'a> {
    before: &'a BTreeMap<StepName, &'a Step>,
    /// The rows this decision changed or created, whole.
    drafted: BTreeMap<StepName, Step>,
}

impl<'a> Steps<'a> {
    fn get(&self, name: &StepName) -> Option<&Step> {
        self.drafted.get(name).or_else(|| self.before.get(name).copied())
    }

    fn insert(&mut self, name: StepName, step: Step) {
        self.drafted.insert(name, step);
    }

    /// Every step in name order, as drafted.
    fn values(&self) -> impl Iterator<Item = &Step> {
        // Both maps are sorted by name: merge them, the drafted row winning.
        let (mut before, mut drafted) = (self.before.iter().peekable(), self.drafted.iter().peekable());
        std::iter::from_fn(move || match (before.peek(), drafted.peek()) {
            (Some((b, _)), Some((d, _))) => match b.cmp(d) {
                std::cmp::Ordering::Less => before.next().map(|(_, step)| *step),
                std::cmp::Ordering::Equal => {
                    before.next();
                    drafted.next().map(|(_, step)| step)
                }
                std::cmp::Ordering::Greater => drafted.next().map(|(_, step)| step),
            },
            (Some(_), None) => before.next().map(|(_, step)| *step),
            (None, _) => drafted.next().map(|(_, step)| step),
        })
    }

    /// The outputs as drafted: the record's, and copies of those the
    /// decision set or cleared.
    fn outputs(&self) -> Outputs<'a> {
        let changed = self
            .drafted
            .iter()
            .filter(|(name, step)| self.before.get(*name).and_then(|before| before.output.as_ref()) != step.output.as_ref())
            .map(|(name, step)| (name.clone(), step.output.clone()))
            .collect();
        Outputs { before: self.before, changed }
    }
}

impl std::ops::Index<&StepName> for Steps<'_> {
    type Output = Step;

    fn index(&self, name: &StepName) -> &Step {
        self.get(name).unwrap_or_else(|| panic!("no step {name} in the draft"))
    }
}

/// A decision being built: the records as they will be, plus what to send.
struct Draft<'a> {
    cx: &'a Context<'a>,
    task_before: &'a Task,
    task: Task,
    steps: Steps<'a>,
    completed_in_order: Vec<StepName>,
    changes: Changes,
    /// The steps this decision sends a Retry for.
    retries: BTreeSet<StepName>,
    /// The steps this decision creates: instances of `for_each` steps.
    created: BTreeSet<StepName>,
}

impl<'a> Draft<'a> {
    fn new(
        record: &'a TaskRecord,
        steps_before: &'a BTreeMap<StepName, &'a Step>,
        completed_in_order: &[StepName],
        cx: &'a Context<'a>,
    ) -> Self {
        Draft {
            cx,
            task_before: &record.task,
            task: record.task.clone(),
            steps: Steps { before: steps_before, drafted: BTreeMap::new() },
            completed_in_order: completed_in_order.to_vec(),
            changes: Changes::default(),
            retries: BTreeSet::new(),
            created: BTreeSet::new(),
        }
    }

    /// Whether `name` is a `for_each` step itself (not one of its
    /// instances): its row stands for the whole list, Running while its
    /// instances run, with nothing of its own in flight.
    fn fans_out(&self, name: &StepName) -> bool {
        !name.is_instance() && self.cx.workflow.step(name).is_some_and(|d| d.for_each().is_some())
    }

    /// Whether something of `step` is with an agent (or waits for a
    /// signal): a request, a compensation, a wait.
    fn in_flight(&self, step: &Step) -> bool {
        matches!(step.state, StepState::Running | StepState::Compensating) && !self.fans_out(&step.name)
    }

    fn event(&mut self, kind: EventKind, detail: Value) {
        self.changes.events.push(Event::task(&self.task.id, self.cx.now, kind, detail));
    }

    fn step_event(&mut self, step: &StepName, kind: EventKind, detail: Value) {
        let step = &self.steps[step];
        self.changes.events.push(Event::step(step, self.cx.now, kind, detail));
    }

    /// A fresh claim: set the task's complete-by from the workflow's deadline,
    /// and re-send whatever the previous holder had in flight (new attempts,
    /// since its replies went to the previous holder's inbox).
    fn on_claimed(&mut self, fence: rota_model::TaskFence) -> Result<(), String> {
        let wf = self.cx.workflow;
        self.task = self
            .task
            .renew(fence, self.cx.now, wf.deadline())
            .and_then(|renewed| renewed.warn_after(fence, self.cx.now, wf.warn_after()))
            .map_err(|e| e.to_string())?;
        // While compensating, a step still running is not re-run: it is left
        // to settle (a late success gets compensated, a timeout does not).
        let reissue = |s: &Step| match self.task.state {
            TaskState::Processing => s.state == StepState::Running,
            _ => s.state == StepState::Compensating,
        };
        // A waiting step sent nothing to reissue: it keeps its attempt and
        // complete-by (a takeover does not extend a wait), and a signal
        // still completes it.
        let waits = |s: &Step| self.cx.workflow.step(&s.name).is_some_and(|d| d.waits_for().is_some());
        // A running child workflow keeps its attempt too: its child is
        // asked for again (created if the previous holder never did, found
        // if it did), and its end reaches whoever holds the task then.
        let runs_child = |s: &Step| s.state == StepState::Running && self.cx.workflow.step(&s.name).is_some_and(|d| d.child().is_some());
        let children: Vec<(StepName, u32)> = self
            .steps
            .values()
            .filter(|s| self.task.state == TaskState::Processing && runs_child(s))
            .map(|s| (s.name.clone(), s.attempt))
            .collect();
        for (name, attempt) in children {
            let start = self.start_child(&name, attempt);
            self.changes.send.push(start);
        }
        let in_flight: Vec<StepName> = self
            .steps
            .values()
            .filter(|s| reissue(s) && !waits(s) && !runs_child(s) && !self.fans_out(&s.name))
            .map(|s| s.name.clone())
            .collect();
        for name in in_flight {
            let compensate = self.steps[&name].state == StepState::Compensating;
            let Some(def) = self.cx.workflow.step(&name) else { continue };
            let timeout = if compensate { def.compensate().map_or(def.timeout(), |c| c.timeout()) } else { def.timeout() };
            let mut reissued = self.steps[&name].reissue(self.cx.now, timeout).map_err(|e| e.to_string())?;
            if !compensate {
                reissued = reissued.warn_after(self.cx.now, def.warn_after()).map_err(|e| e.to_string())?;
            }
            let mut input = reissued.input.clone().unwrap_or(Value::Null);
            let mut token = None;
            if !compensate && def.completes_by_callback() {
                // The previous attempt's token dies with it: the new one gets
                // its own, and its request is rendered again to carry it.
                let outputs = self.outputs();
                let context = self.template_context(reissued.attempt, &outputs, None);
                let issued = crate::callback::issue(self.cx.callback_key, &self.task, &name, reissued.attempt, def.with(), &context)
                    .map_err(|e| format!("step {name}: {e}"))?;
                reissued.callback_digest = Some(issued.token.digest());
                input = issued.sent;
                token = Some(issued.token.text());
            }
            // The same request was sent before, so it fits (but for a
            // longer attempt number at the very edge of the limit).
            let send = self.request(&name, &reissued, compensate, input, token)?;
            self.steps.insert(name.clone(), reissued);
            self.changes.send.push(send);
            self.step_event(&name, EventKind::StepStarted, json!({ "reissued": true, "compensate": compensate }));
        }
        // A step backing off before its next attempt was to be woken by a
        // Retry in the previous holder's inbox, which nobody reads now.
        let backing_off: Vec<(StepName, Duration)> = self
            .steps
            .values()
            .filter(|s| s.not_before > self.cx.now && matches!(s.state, StepState::NotStarted | StepState::Completed))
            .map(|s| (s.name.clone(), s.not_before.since(self.cx.now)))
            .collect();
        for (name, wait) in backing_off {
            self.send_retry(&name, wait);
        }
        Ok(())
    }

    fn on_reply(&mut self, reply: &Reply, rng: &mut impl Rng) -> Result<(), String> {
        let Some(step) = self.steps.get(&reply.step) else {
            return Err(format!("task {} has no step {}", self.task.id, reply.step));
        };
        let now = self.cx.now;
        match (&reply.outcome, reply.compensate) {
            (ReplyOutcome::Succeeded { output }, false)
                if self.cx.workflow.step(&reply.step).is_some_and(|d| d.completes_by_callback()) =>
            {
                // The service took the request; the callback completes the
                // step (or the attempt times out).
                step.check_attempt(reply.attempt).map_err(|e| format!("reply ignored: {e}"))?;
                let response = if serde_json::to_vec(output).map_or(usize::MAX, |o| o.len()) <= ACCEPTED_RESPONSE_BYTES_MAX {
                    output.clone()
                } else {
                    json!({ "omitted": "larger than the bound of an event's response" })
                };
                self.step_event(&reply.step, EventKind::Callback, json!({ "outcome": "accepted", "response": response }));
            }
            (ReplyOutcome::Succeeded { output }, false) => {
                let done = step.complete(reply.attempt, output.clone(), now).map_err(|e| format!("reply ignored: {e}"))?;
                self.steps.insert(reply.step.clone(), done);
                self.completed_in_order.push(reply.step.clone());
                self.step_event(&reply.step, EventKind::StepCompleted, json!({}));
            }
            (ReplyOutcome::Succeeded { .. }, true) => {
                let done = step.compensated(reply.attempt, now).map_err(|e| format!("reply ignored: {e}"))?;
                self.steps.insert(reply.step.clone(), done);
                self.step_event(&reply.step, EventKind::StepCompensated, json!({}));
            }
            (ReplyOutcome::Failed { error, retryable }, compensate) => {
                step.check_attempt(reply.attempt).map_err(|e| format!("reply ignored: {e}"))?;
                if *retryable {
                    self.transient_failure(&reply.step, compensate, format!("step {} failed: {error}", reply.step), rng)?;
                } else {
                    self.permanent_failure(&reply.step, compensate, error)?;
                }
            }
        }
        Ok(())
    }

    fn on_step_expired(&mut self, name: &StepName, attempt: u32, rng: &mut impl Rng) -> Result<(), String> {
        let Some(step) = self.steps.get(name) else { return Err(format!("task {} has no step {name}", self.task.id)) };
        step.check_attempt(attempt).map_err(|e| format!("timeout report ignored: {e}"))?;
        if step.complete_by.is_none_or(|at| at > self.cx.now) {
            return Err(format!("step {name} attempt {attempt} is not past its complete-by"));
        }
        let compensate = step.state == StepState::Compensating;
        let reason = match self.cx.workflow.step(name).and_then(|d| d.waits_for()) {
            Some(signal) => format!("step {name} attempt {attempt} received no signal `{signal}` before its complete-by"),
            None if let Some(child) = self.cx.workflow.step(name).and_then(|d| d.child()).filter(|_| !compensate) => {
                format!("step {name} attempt {attempt}: its child workflow `{}` did not finish before its complete-by", child.name())
            }
            None if !compensate && self.cx.workflow.step(name).is_some_and(|d| d.completes_by_callback()) => {
                format!("step {name} attempt {attempt} got no callback before its complete-by")
            }
            None => format!("step {name} attempt {attempt} got no reply before its complete-by"),
        };
        if self.task.state == TaskState::Compensating && !compensate {
            // A step left running when compensation began timed out: its
            // effect may have landed, so it is compensated too.
            self.settle_in_doubt(name, &reason)?;
            return Ok(());
        }
        self.transient_failure(name, compensate, reason, rng)
    }

    /// Counts a failure against the task; retries the step after a backoff
    /// below the threshold, ends the task at it.
    fn transient_failure(&mut self, name: &StepName, compensate: bool, reason: String, rng: &mut impl Rng) -> Result<(), String> {
        let wf = self.cx.workflow;
        let counted =
            self.task.count_failure(reason.clone(), wf.max_failures(), wf.on_exhausted(), self.cx.now).map_err(|e| e.to_string())?;
        let below_threshold = counted.locked_by.is_some();
        self.task = counted;
        let step = &self.steps[name];
        let backoff = self.cx.recovery.delay_after(self.task.failure_count.max(1), rng);
        let attempt = step.attempt;
        let retry_after = below_threshold.then_some(backoff);
        let timed_out = step.complete_by.is_some_and(|at| at <= self.cx.now);
        // (A waiting step has no effect that could have landed.)
        let waits = self.cx.workflow.step(name).is_some_and(|d| d.waits_for().is_some());
        if !below_threshold && !compensate && !waits && self.task.state == TaskState::Compensating {
            // The last straw, and the task is to be undone. This attempt, or
            // an earlier unconfirmed one, may have had its effect (a timeout,
            // a lost answer): the step is compensated too.
            let waiting = if timed_out {
                step.clone()
            } else {
                step.fail(attempt, reason.clone(), Some(Duration::ZERO), self.cx.now).map_err(|e| e.to_string())?
            };
            self.steps.insert(name.clone(), waiting);
            self.step_event(name, EventKind::StepFailed, json!({ "error": reason, "retryable": true, "timed_out": timed_out }));
            self.settle_in_doubt(name, &reason)?;
            self.task_ended_by_failures(name, &reason);
            return Ok(());
        }
        let next = if timed_out {
            // A timeout: the agent went silent, so expire the attempt.
            let mut expired = step.expire(self.cx.now, backoff).map_err(|e| e.to_string())?;
            if !below_threshold && !compensate {
                expired.state = StepState::Failed;
            }
            expired
        } else if compensate {
            step.fail_compensation(attempt, reason.clone(), retry_after, self.cx.now).map_err(|e| e.to_string())?
        } else {
            step.fail(attempt, reason.clone(), retry_after, self.cx.now).map_err(|e| e.to_string())?
        };
        self.steps.insert(name.clone(), next);
        self.step_event(
            name,
            EventKind::StepFailed,
            json!({
                "error": reason,
                "retryable": true,
                "retry_in_ms": retry_after.map(|d| d.as_millis() as u64),
                "timed_out": timed_out,
            }),
        );
        if below_threshold {
            self.send_retry(name, backoff);
        } else {
            self.task_ended_by_failures(name, &reason);
        }
        Ok(())
    }

    /// Settles a timed-out step as Completed without output ("in doubt")
    /// and queues it for compensation, last completed so undone first.
    fn settle_in_doubt(&mut self, name: &StepName, reason: &str) -> Result<(), String> {
        let settled = self.steps[name].settle_in_doubt(self.cx.now).map_err(|e| e.to_string())?;
        self.steps.insert(name.clone(), settled);
        self.completed_in_order.retain(|n| n != name);
        self.completed_in_order.push(name.clone());
        self.step_event(name, EventKind::StepFailed, json!({ "error": reason, "retryable": false, "in_doubt": true }));
        Ok(())
    }

    fn permanent_failure(&mut self, name: &StepName, compensate: bool, error: &str) -> Result<(), String> {
        let step = &self.steps[name];
        let attempt = step.attempt;
        let failed = if compensate {
            step.fail_compensation(attempt, error.to_owned(), None, self.cx.now)
        } else {
            step.fail(attempt, error.to_owned(), None, self.cx.now)
        }
        .map_err(|e| e.to_string())?;
        self.steps.insert(name.clone(), failed);
        self.step_event(name, EventKind::StepFailed, json!({ "error": error, "retryable": false }));
        let fence = self.task.fence().ok_or("task lost its lease")?;
        let (reason, policy) = if compensate {
            (format!("compensation of step {name} failed permanently: {error}"), rota_model::ExhaustedPolicy::Error)
        } else {
            (format!("step {name} failed permanently: {error}"), self.cx.workflow.on_exhausted())
        };
        self.task = self.task.fail(fence, reason.clone(), policy, self.cx.now).map_err(|e| e.to_string())?;
        self.after_unleased(name, &reason);
        Ok(())
    }

    /// The failure threshold was reached.
    fn task_ended_by_failures(&mut self, step: &StepName, reason: &str) {
        let reason = format!("{reason}; failure threshold {} reached", self.cx.workflow.max_failures());
        self.after_unleased(step, &reason);
    }

    /// Events (and the doorbell for compensation) after the task lost its
    /// lease by failing at `step`. The alert names the step, so that an
    /// operator sees where without reading the reason.
    fn after_unleased(&mut self, step: &StepName, reason: &str) {
        match self.task.state {
            TaskState::Error => {
                self.event(EventKind::Error, json!({ "reason": reason }));
                self.step_event(step, EventKind::Alert, json!({ "reason": reason }));
            }
            TaskState::Compensating => {
                self.event(EventKind::CompensationStarted, json!({ "reason": reason }));
                self.send_doorbell(Duration::ZERO);
            }
            _ => {}
        }
    }

    /// Moves the task on: starts every ready step, or finishes it; while
    /// compensating, undoes the next completed step, or finishes. A paused
    /// task is held instead.
    fn advance(&mut self, fence: rota_model::TaskFence) {
        if self.task.paused {
            self.hold(fence);
            return;
        }
        match self.task.state {
            TaskState::Processing => self.advance_processing(fence),
            TaskState::Compensating => self.advance_compensating(fence),
            _ => {}
        }
    }

    /// A paused task starts nothing, not even its end (it finishes once
    /// resumed). While a step of it is in flight its holder keeps the
    /// lease, to record the step's answer; after that it gives the task
    /// back, so that a pause costs no lease, no deadline and no Scheduler
    /// while it lasts. A step backing off before another attempt is retried
    /// by whoever claims the task after the resume.
    fn hold(&mut self, fence: rota_model::TaskFence) {
        if self.steps.values().any(|s| self.in_flight(s)) {
            return;
        }
        match self.task.release(fence, self.cx.now) {
            Ok(released) => {
                self.task = released;
                self.event(EventKind::Released, json!({ "by": self.cx.me.as_str(), "paused": true }));
            }
            Err(err) => tracing::error!("giving back paused task {}: {err}", self.task.id),
        }
    }

    /// Starts every ready step. A waiting step whose signal has already
    /// arrived completes at once, which may make more steps ready: those
    /// start in the same decision.
    fn advance_processing(&mut self, fence: rota_model::TaskFence) {
        while self.task.state == TaskState::Processing {
            if !self.start_ready_steps(fence) {
                break;
            }
        }
        if self.task.state == TaskState::Processing {
            self.wake_when_due();
        }
    }

    /// Makes sure a held task with nothing in flight is woken: a step held
    /// back only by its `not_before` gets a Retry for that time, unless
    /// this decision sends one. A backoff sends its own Retry; this one is
    /// for a `not_before` the clock fell behind when it was stepped back
    /// (a step is due from when it became ready, and that time is ahead of
    /// a clock stepped back past it), which nothing would wake until the
    /// task's lease ran out.
    fn wake_when_due(&mut self) {
        let now = self.cx.now;
        let in_flight = self.steps.values().any(|s| self.in_flight(s));
        if in_flight || !self.retries.is_empty() {
            return;
        }
        let held = self.cx.workflow.ready(
            |name| self.steps.get(name).is_some_and(|s| s.state.is_settled()),
            |name| self.steps.get(name).is_some_and(|s| s.state == StepState::NotStarted && s.not_before > now),
        );
        // Instances of a `for_each` step backing off before another attempt.
        let instances = self.steps.values().filter(|s| s.name.is_instance() && s.state == StepState::NotStarted && s.not_before > now);
        let earliest = held.iter().filter_map(|def| self.steps.get(def.name())).chain(instances).min_by_key(|s| s.not_before);
        if let Some((name, wait)) = earliest.map(|s| (s.name.clone(), s.not_before.since(now))) {
            self.send_retry(&name, wait);
        }
    }

    /// One pass of [`Draft::advance_processing`]; whether a waiting step
    /// completed (so that another pass may start more).
    fn start_ready_steps(&mut self, fence: rota_model::TaskFence) -> bool {
        let wf = self.cx.workflow;
        let now = self.cx.now;
        // A `for_each` step's instances are settled with it: it completes
        // once they all have, and its output holds theirs.
        if self.steps.values().filter(|s| !s.name.is_instance()).all(|s| s.state.is_settled()) {
            // Skipped steps have no output, and no entry.
            let output: serde_json::Map<String, Value> = self
                .steps
                .values()
                .filter(|s| s.state == StepState::Completed && !s.name.is_instance())
                .map(|s| (s.name.to_string(), s.output.clone().unwrap_or(Value::Null)))
                .collect();
            match self.task.finish_processed(fence, Value::Object(output), now) {
                Ok(done) => {
                    self.task = done;
                    self.event(EventKind::Processed, json!({}));
                }
                Err(err) => tracing::error!("finishing task {}: {err}", self.task.id),
            }
            return false;
        }
        let fanned_out: Vec<StepName> =
            self.steps.values().filter(|s| s.state == StepState::Running && self.fans_out(&s.name)).map(|s| s.name.clone()).collect();
        let mut completed_any = false;
        for name in fanned_out {
            match self.run_instances(fence, &name) {
                Some(completed) => completed_any |= completed,
                None => return false,
            }
        }
        if completed_any {
            // Another pass starts what the completed step made ready.
            return true;
        }
        let ready: Vec<StepName> = wf
            .ready(
                |name| self.steps.get(name).is_some_and(|s| s.state.is_settled()),
                |name| self.steps.get(name).is_some_and(|s| s.state == StepState::NotStarted && s.not_before <= now),
            )
            .into_iter()
            .map(|def| def.name().clone())
            .collect();
        let outputs = self.outputs();
        for name in ready {
            let def = wf.step(&name).expect("ready steps come from the workflow");
            match self.decide_condition(fence, &name, &outputs) {
                Some(true) => {}
                // A skip may make more steps ready: another pass starts them.
                Some(false) => {
                    completed_any = true;
                    continue;
                }
                None => return false,
            }
            if let Some(signal) = def.waits_for() {
                completed_any |= self.start_waiting(&name, signal, def.timeout());
                continue;
            }
            if let Some(for_each) = def.for_each() {
                match self.fan_out(fence, &name, for_each, &outputs) {
                    Some(completed) => completed_any |= completed,
                    None => return false,
                }
                continue;
            }
            let attempt = self.steps[&name].attempt + 1;
            let context = self.template_context(attempt, &outputs, None);
            let rendered = if def.completes_by_callback() {
                crate::callback::issue(self.cx.callback_key, &self.task, &name, attempt, def.with(), &context)
                    .map(|issued| (issued.stored, Some((issued.sent, issued.token))))
            } else {
                rota_workflow::render(def.with(), &context).map(|input| (input, None))
            };
            let (input, callback) = match rendered {
                Ok(rendered) => rendered,
                Err(err) => {
                    let reason = format!("step {name}: {err}");
                    self.step_event(&name, EventKind::StepFailed, json!({ "error": reason, "retryable": false }));
                    if let Ok(failed) = self.task.fail(fence, reason.clone(), wf.on_exhausted(), now) {
                        self.task = failed;
                        self.after_unleased(&name, &reason);
                    }
                    return false;
                }
            };
            match self.steps[&name].start(input.clone(), now, def.timeout()).and_then(|started| started.warn_after(now, def.warn_after())) {
                Ok(mut started) => {
                    let (sent, token) = match callback {
                        Some((sent, token)) => {
                            started.callback_digest = Some(token.digest());
                            (sent, Some(token.text()))
                        }
                        None => (input, None),
                    };
                    let send = match def.child() {
                        // The child's input is the rendered `with`, kept in
                        // the step's row: the inbox message only names it.
                        Some(_) => Ok(self.start_child(&name, started.attempt)),
                        None => self.request(&name, &started, false, sent, token),
                    };
                    let send = match send {
                        Ok(send) => send,
                        Err(reason) => {
                            // Not started: the attempt was never recorded.
                            self.step_event(&name, EventKind::StepFailed, json!({ "error": reason, "retryable": false }));
                            if let Ok(failed) = self.task.fail(fence, reason.clone(), wf.on_exhausted(), now) {
                                self.task = failed;
                                self.after_unleased(&name, &reason);
                            }
                            return false;
                        }
                    };
                    self.steps.insert(name.clone(), started);
                    self.changes.send.push(send);
                    let attempt = self.steps[&name].attempt;
                    let detail = match def.child() {
                        Some(child) => json!({ "attempt": attempt, "workflow": child.name().as_str() }),
                        None => json!({ "attempt": attempt }),
                    };
                    self.step_event(&name, EventKind::StepStarted, detail);
                }
                Err(err) => tracing::error!("starting step {name} of task {}: {err}", self.task.id),
            }
        }
        completed_any
    }

    /// Decides the `when` condition of a ready step, before its first
    /// attempt: whether it runs (true: no condition, or a retry), is skipped
    /// (false, recorded here), or `None` when the condition could not be
    /// decided, which failed the task as a permanent failure of the step
    /// (like a template that cannot be rendered).
    fn decide_condition(&mut self, fence: rota_model::TaskFence, name: &StepName, outputs: &Outputs<'_>) -> Option<bool> {
        let now = self.cx.now;
        let step = &self.steps[name];
        let Some(when) = self.cx.workflow.step(name).and_then(|def| def.when()).filter(|_| step.attempt == 0) else {
            return Some(true);
        };
        match when.evaluate(&self.task.input, outputs) {
            Ok(true) => Some(true),
            Ok(false) => {
                let skipped = step.skip(now).expect("a ready step without attempts can be skipped");
                self.steps.insert(name.clone(), skipped);
                self.step_event(name, EventKind::StepSkipped, json!({ "when": when.source() }));
                Some(false)
            }
            Err(err) => {
                let reason = format!("step {name}: {err}");
                let mut failed = step.clone();
                failed.last_error = Some(reason.clone());
                failed.updated_at = now;
                self.steps.insert(name.clone(), failed);
                self.step_event(name, EventKind::StepFailed, json!({ "error": reason, "retryable": false }));
                if let Ok(task) = self.task.fail(fence, reason.clone(), self.cx.workflow.on_exhausted(), now) {
                    self.task = task;
                    self.after_unleased(name, &reason);
                }
                None
            }
        }
    }

    /// Starts a step that waits for `signal`: it completes at once with a
    /// signal that arrived before it started (returning true), else it
    /// waits until its timeout; nothing is sent either way.
    fn start_waiting(&mut self, name: &StepName, signal: &rota_model::SignalName, timeout: Duration) -> bool {
        let now = self.cx.now;
        let step = &self.steps[name];
        let received = crate::signal::received(step).cloned();
        let input = step.input.clone().filter(|_| received.is_some()).unwrap_or(Value::Null);
        // A wait has a warning point like any attempt: the signal is late.
        let warn_after = self.cx.workflow.step(name).and_then(|def| def.warn_after());
        let started = match step.start(input, now, timeout).and_then(|started| started.warn_after(now, warn_after)) {
            Ok(started) => started,
            Err(err) => {
                tracing::error!("starting step {name} of task {}: {err}", self.task.id);
                return false;
            }
        };
        let attempt = started.attempt;
        self.steps.insert(name.clone(), started);
        self.step_event(name, EventKind::StepStarted, json!({ "attempt": attempt, "waits_for": signal.as_str() }));
        let Some(data) = received else { return false };
        match self.steps[name].complete(attempt, data, now) {
            Ok(done) => {
                self.steps.insert(name.clone(), done);
                self.completed_in_order.push(name.clone());
                self.step_event(name, EventKind::StepCompleted, json!({ "signal": signal.as_str() }));
                true
            }
            Err(err) => {
                tracing::error!("completing step {name} of task {} with its signal: {err}", self.task.id);
                false
            }
        }
    }

    /// Starts `for_each` step `name` as it becomes ready: its items are
    /// evaluated once and kept in its row, and its first instances start.
    /// `Some(true)` when it completed at once (no items), `None` when it
    /// failed the task: an expression that cannot be evaluated, or gives
    /// more than [`Context::for_each_items_max`] items, fails the step
    /// permanently, like a condition that cannot be decided.
    fn fan_out(
        &mut self,
        fence: rota_model::TaskFence,
        name: &StepName,
        for_each: &rota_workflow::ForEach,
        outputs: &Outputs<'_>,
    ) -> Option<bool> {
        let now = self.cx.now;
        let max = self.cx.for_each_items_max;
        let items = match for_each.items().evaluate_list(&self.task.input, outputs) {
            Ok(items) if items.len() > max => {
                Err(format!("`for_each` gave {} items, over the limit of {max} (the Scheduler's `for_each_items_max`)", items.len()))
            }
            Ok(items) => Ok(items),
            Err(reason) => Err(format!("`for_each` expression `{}` could not be evaluated: {reason}", for_each.items().source())),
        };
        let items = match items {
            Ok(items) => items,
            Err(reason) => {
                let reason = format!("step {name}: {reason}");
                let mut failed = self.steps[name].clone();
                failed.last_error = Some(reason.clone());
                failed.updated_at = now;
                self.steps.insert(name.clone(), failed);
                self.step_event(name, EventKind::StepFailed, json!({ "error": reason, "retryable": false }));
                if let Ok(task) = self.task.fail(fence, reason.clone(), self.cx.workflow.on_exhausted(), now) {
                    self.task = task;
                    self.after_unleased(name, &reason);
                }
                return None;
            }
        };
        let count = items.len();
        match self.steps[name].fan_out(Value::Array(items), now) {
            Ok(started) => {
                let attempt = started.attempt;
                self.steps.insert(name.clone(), started);
                self.step_event(name, EventKind::StepStarted, json!({ "attempt": attempt, "items": count }));
            }
            Err(err) => {
                tracing::error!("starting for_each step {name} of task {}: {err}", self.task.id);
                return Some(false);
            }
        }
        self.run_instances(fence, name)
    }

    /// Moves running `for_each` step `name` on: completes it once every
    /// instance has completed (its output their outputs, in item order),
    /// else starts instances, those due for another attempt first, then
    /// new ones in item order, while fewer than its `max_parallel` are in
    /// flight. `Some(true)` when it completed, `None` when starting an
    /// instance failed the task.
    fn run_instances(&mut self, fence: rota_model::TaskFence, name: &StepName) -> Option<bool> {
        let now = self.cx.now;
        let Some(for_each) = self.cx.workflow.step(name).and_then(|d| d.for_each()) else { return Some(false) };
        let max_parallel = usize::try_from(for_each.max_parallel()).unwrap_or(usize::MAX);
        let count = self.steps[name].input.as_ref().and_then(Value::as_array).map_or(0, Vec::len);
        let (mut in_flight, mut completed) = (0, 0);
        let (mut due, mut fresh) = (Vec::new(), Vec::new());
        for index in 0..count {
            match self.steps.get(&name.instance(index)) {
                None => fresh.push(index),
                Some(s) if s.state == StepState::Completed => completed += 1,
                Some(s) if s.state == StepState::Running => in_flight += 1,
                Some(s) if s.state == StepState::NotStarted && s.not_before <= now => due.push(index),
                // Backing off until its next attempt (a Retry will come).
                Some(_) => {}
            }
        }
        if completed == count {
            let outputs: Vec<Value> =
                (0..count).map(|index| self.steps[&name.instance(index)].output.clone().unwrap_or(Value::Null)).collect();
            let step = &self.steps[name];
            return match step.complete(step.attempt, Value::Array(outputs), now) {
                Ok(done) => {
                    self.steps.insert(name.clone(), done);
                    self.completed_in_order.push(name.clone());
                    self.step_event(name, EventKind::StepCompleted, json!({ "items": count }));
                    Some(true)
                }
                Err(err) => {
                    tracing::error!("completing for_each step {name} of task {}: {err}", self.task.id);
                    Some(false)
                }
            };
        }
        let outputs = self.outputs();
        for index in due.into_iter().chain(fresh) {
            if in_flight >= max_parallel {
                break;
            }
            if !self.start_instance(fence, name, index, &outputs) {
                return None;
            }
            in_flight += 1;
        }
        Some(false)
    }

    /// Starts an attempt of instance `index` of `for_each` step `name`,
    /// creating its row at its first; false when its request could not be
    /// made (a template that cannot be rendered, a request too large),
    /// which fails the task like any step's.
    fn start_instance(&mut self, fence: rota_model::TaskFence, name: &StepName, index: usize, outputs: &Outputs<'_>) -> bool {
        let now = self.cx.now;
        let wf = self.cx.workflow;
        let def = wf.step(name).expect("for_each steps come from the workflow");
        let instance = name.instance(index);
        let current = match self.steps.get(&instance) {
            Some(step) => step.clone(),
            None => {
                self.created.insert(instance.clone());
                Step::new(self.task.id.clone(), instance.clone(), self.steps[name].position, now)
            }
        };
        let item = self.item(name, index);
        let rendered = rota_workflow::render(def.with(), &self.template_context(current.attempt + 1, outputs, Some((&item, index))))
            .map_err(|err| format!("step {instance}: {err}"))
            .and_then(|input| {
                let started = current.start(input.clone(), now, def.timeout()).and_then(|s| s.warn_after(now, def.warn_after()));
                let started = started.map_err(|err| format!("step {instance}: {err}"))?;
                let send = self.request(&instance, &started, false, input, None)?;
                Ok((started, send))
            });
        match rendered {
            Ok((started, send)) => {
                let attempt = started.attempt;
                self.steps.insert(instance.clone(), started);
                self.changes.send.push(send);
                self.step_event(&instance, EventKind::StepStarted, json!({ "attempt": attempt, "index": index }));
                true
            }
            Err(reason) => {
                // Not started: the attempt was never recorded (the row, if
                // new, is created to hold the error).
                let mut failed = current;
                failed.last_error = Some(reason.clone());
                failed.updated_at = now;
                self.steps.insert(instance.clone(), failed);
                self.step_event(&instance, EventKind::StepFailed, json!({ "error": reason, "retryable": false }));
                if let Ok(task) = self.task.fail(fence, reason.clone(), wf.on_exhausted(), now) {
                    self.task = task;
                    self.after_unleased(&instance, &reason);
                }
                false
            }
        }
    }

    /// A `for_each` step still running when its task stopped going forward
    /// (an instance failed it, or it is being undone) starts no more
    /// instances: it has failed, and its completed instances are undone one
    /// by one like any completed step.
    fn stop_fanned_out(&mut self) {
        if !matches!(self.task.state, TaskState::Error | TaskState::Compensating) {
            return;
        }
        let running: Vec<StepName> =
            self.steps.values().filter(|s| s.state == StepState::Running && self.fans_out(&s.name)).map(|s| s.name.clone()).collect();
        for name in running {
            let step = &self.steps[&name];
            let reason = format!("stopped starting instances: the task is {}", self.task.state);
            match step.fail(step.attempt, reason.clone(), None, self.cx.now) {
                Ok(stopped) => {
                    self.steps.insert(name.clone(), stopped);
                    self.step_event(&name, EventKind::StepFailed, json!({ "error": reason, "retryable": false }));
                }
                Err(err) => tracing::error!("stopping for_each step {name} of task {}: {err}", self.task.id),
            }
        }
    }

    fn advance_compensating(&mut self, fence: rota_model::TaskFence) {
        let wf = self.cx.workflow;
        let now = self.cx.now;
        // A step still waiting for a signal did nothing to undo and will
        // not be needed: it stops waiting rather than hold the compensation
        // back until its timeout. A step running a child workflow stops
        // waiting too: the Supervisor cancels the child, which undoes its
        // own work (`Tasks::stale_children`). But the child may have ended
        // Processed already, or may before the Supervisor's round, and then
        // nothing undoes it: so a child step with a compensation is left
        // waiting for another attempt, which settles it in doubt below and
        // compensates it.
        let waiting: Vec<StepName> = self
            .steps
            .values()
            .filter(|s| s.state == StepState::Running && wf.step(&s.name).is_some_and(|d| d.waits_for().is_some() || d.child().is_some()))
            .map(|s| s.name.clone())
            .collect();
        for name in waiting {
            let step = &self.steps[&name];
            let def = wf.step(&name);
            let (reason, in_doubt) = if def.is_some_and(|d| d.child().is_some()) {
                let in_doubt = def.is_some_and(|d| d.compensate().is_some());
                ("stopped waiting for its child workflow: the task is being undone (the child is cancelled)".to_owned(), in_doubt)
            } else {
                ("stopped waiting: the task is being undone".to_owned(), false)
            };
            match step.fail(step.attempt, reason.clone(), in_doubt.then_some(Duration::ZERO), now) {
                Ok(stopped) => {
                    self.steps.insert(name.clone(), stopped);
                    self.step_event(&name, EventKind::StepFailed, json!({ "error": reason, "retryable": false }));
                }
                Err(err) => tracing::error!("stopping the wait of step {name} of task {}: {err}", self.task.id),
            }
        }
        if self.steps.values().any(|s| self.in_flight(s)) {
            return; // Wait for in-flight steps and compensations to settle.
        }
        // A step waiting for another attempt had one that was never
        // confirmed (a timeout, a transient failure): it may have had its
        // effect, so it is settled in doubt and compensated first.
        let unconfirmed: Vec<StepName> = self
            .steps
            .values()
            .filter(|s| s.state == StepState::NotStarted && s.attempt > 0 && wf.step(&s.name).is_some_and(|d| d.compensate().is_some()))
            .map(|s| s.name.clone())
            .collect();
        for name in unconfirmed {
            if let Err(err) = self.settle_in_doubt(&name, "its last attempt was never confirmed") {
                tracing::error!("settling step {name} of task {} in doubt: {err}", self.task.id);
            }
        }
        let next = self.completed_in_order.iter().rev().find(|name| {
            let completed = self.steps.get(name).is_some_and(|s| s.state == StepState::Completed);
            completed && wf.step(name).is_some_and(|d| d.compensate().is_some())
        });
        let Some(name) = next.cloned() else {
            match self.task.finish_compensated(fence, now) {
                Ok(done) => {
                    self.task = done;
                    self.event(EventKind::Compensated, json!({}));
                }
                Err(err) => tracing::error!("finishing compensation of task {}: {err}", self.task.id),
            }
            return;
        };
        if self.steps[&name].not_before > now {
            // Backing off, with a Retry on its way, unless the clock was
            // stepped back past the time the step became due: then one is
            // sent for that time (see `wake_when_due`).
            if self.retries.is_empty() {
                let wait = self.steps[&name].not_before.since(now);
                self.send_retry(&name, wait);
            }
            return;
        }
        if self.fans_out(&name) {
            // A `for_each` step is undone through its instances, which
            // completed before it and so are undone after it, each on its
            // own: its own row is settled at once, with no request.
            // (No attempt: nothing was sent.)
            let mut done = self.steps[&name].clone();
            done.state = StepState::Compensated;
            done.updated_at = now;
            self.steps.insert(name.clone(), done);
            self.step_event(&name, EventKind::StepCompensated, json!({ "by_instances": true }));
            self.advance_compensating(fence);
            return;
        }
        let def = wf.step(&name).expect("compensated steps come from the workflow");
        let compensation = def.compensate().expect("checked above");
        let attempt = self.steps[&name].attempt + 1;
        let mut outputs = self.outputs();
        let item = name.instance_of().map(|(step, index)| {
            // An instance's compensation reads its own output as the step's.
            if let Some(output) = self.steps[&name].output.clone() {
                outputs.changed.insert(step.clone(), Some(output));
            }
            (self.item(&step, index), index)
        });
        let item_ref = item.as_ref().map(|(item, index)| (item, *index));
        let input = match rota_workflow::render(compensation.with(), &self.template_context(attempt, &outputs, item_ref)) {
            Ok(input) => input,
            Err(err) => {
                let reason = format!("compensation of step {name}: {err}");
                if let Ok(failed) = self.task.fail(fence, reason.clone(), rota_model::ExhaustedPolicy::Error, now) {
                    self.task = failed;
                    self.after_unleased(&name, &reason);
                }
                return;
            }
        };
        match self.steps[&name].begin_compensation(now, compensation.timeout()) {
            Ok(mut started) => {
                started.input = Some(input.clone());
                let send = match self.request(&name, &started, true, input, None) {
                    Ok(send) => send,
                    Err(reason) => {
                        if let Ok(failed) = self.task.fail(fence, reason.clone(), rota_model::ExhaustedPolicy::Error, now) {
                            self.task = failed;
                            self.after_unleased(&name, &reason);
                        }
                        return;
                    }
                };
                self.steps.insert(name.clone(), started);
                self.changes.send.push(send);
                self.step_event(&name, EventKind::StepStarted, json!({ "compensate": true }));
            }
            Err(err) => tracing::error!("compensating step {name} of task {}: {err}", self.task.id),
        }
    }

    /// The steps' outputs as the draft has them now.
    fn outputs(&self) -> Outputs<'a> {
        self.steps.outputs()
    }

    fn template_context<'c>(&'c self, attempt: u32, outputs: &'c Outputs<'_>, item: Option<(&'c Value, usize)>) -> TemplateContext<'c> {
        TemplateContext {
            input: &self.task.input,
            outputs,
            task_id: &self.task.id,
            workflow: &self.task.workflow,
            attempt,
            callback_token: None,
            item,
        }
    }

    /// Item `index` of `for_each` step `step`, from the list its row keeps.
    fn item(&self, step: &StepName, index: usize) -> Value {
        self.steps.get(step).and_then(|s| s.input.as_ref()).and_then(|items| items.get(index)).cloned().unwrap_or(Value::Null)
    }

    /// The request of `step` (the attempt about to be recorded) to its
    /// agent's queue, or why it cannot be sent: a request larger than a
    /// message may be ([`REQUEST_BYTES_MAX`]) would fail the commit that
    /// records the attempt, every time, so it fails the step instead.
    fn request(
        &self,
        name: &StepName,
        step: &Step,
        compensate: bool,
        input: Value,
        callback_token: Option<String>,
    ) -> Result<(QueueName, Outgoing), String> {
        let def = self.cx.workflow.step(name).expect("requests are for workflow steps");
        let (agent, retry, timeout) = match (compensate, def.compensate(), def.agent()) {
            (true, Some(c), _) => (c.agent().as_str(), c.retry().clone(), c.timeout()),
            (_, _, Some(agent)) => (agent.as_str(), def.retry().clone(), def.timeout()),
            // Unreachable by construction: waiting steps are started by
            // `start_waiting` and never reissued or compensated.
            (_, _, None) => return Err(format!("step {name} waits for a signal: it has no request to send")),
        };
        let request = StepRequest {
            call: Request {
                task_id: self.task.id.clone(),
                workflow: protocol::workflow_label(&self.task.workflow, self.task.workflow_version),
                step: name.clone(),
                attempt: step.attempt,
                compensate,
                input,
                idempotency_key: Request::idempotency_key_for(&self.task.id, name, compensate),
                complete_by: step.complete_by.unwrap_or(self.cx.now),
                callback_token,
            },
            retry,
            reply_to: self.cx.inbox.clone(),
            traceparent: self.cx.traceparent.map(str::to_owned),
            rate_limit: def.rate_limit().copied(),
            timeout_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        };
        // No message id (duplicate detection) is needed: the request is sent
        // by the commit that records the attempt, which happens once.
        let message = Outgoing::json(&request).expect("requests serialize");
        let bytes = message.body.get().len();
        if bytes > REQUEST_BYTES_MAX {
            let what = if compensate { "compensation request" } else { "request" };
            return Err(format!(
                "step {name}: its {what} is {bytes} bytes of JSON, over the limit of {REQUEST_BYTES_MAX} bytes of a message; \
                 pass large data by reference (a URL, a key) rather than in the input or an output"
            ));
        }
        Ok((protocol::agent_queue(agent), message))
    }

    /// The message asking this Scheduler to create the child task of
    /// `workflow:` step `name`'s `attempt` (see [`InboxMessage::StartChild`]).
    fn start_child(&self, name: &StepName, attempt: u32) -> (QueueName, Outgoing) {
        let message = InboxMessage::StartChild { task_id: self.task.id.clone(), step: name.clone(), attempt };
        let envelope = InboxEnvelope { message, traceparent: self.cx.traceparent.map(str::to_owned) };
        let outgoing = Outgoing::json(&envelope).expect("inbox messages serialize").with_ordering_key(self.task.id.as_str());
        (self.cx.inbox.clone(), outgoing)
    }

    fn send_retry(&mut self, name: &StepName, after: Duration) {
        self.retries.insert(name.clone());
        let message = InboxMessage::Retry { task_id: self.task.id.clone(), step: name.clone() };
        let envelope = InboxEnvelope { message, traceparent: self.cx.traceparent.map(str::to_owned) };
        let outgoing = Outgoing::json(&envelope).expect("inbox messages serialize").with_delay(after);
        self.changes.send.push((self.cx.inbox.clone(), outgoing));
    }

    fn send_doorbell(&mut self, after: Duration) {
        let doorbell = Doorbell { task_id: self.task.id.clone(), traceparent: self.cx.traceparent.map(str::to_owned) };
        let outgoing = Outgoing::json(&doorbell).expect("doorbells serialize").with_delay(after);
        self.changes.send.push((protocol::tasks_queue(), outgoing));
    }

    fn finish(mut self) -> Decision {
        // The task write doubles as the fence of the whole commit: even when
        // only a step changed, the commit fails if the task moved on.
        // Every decision bumps the lease epoch, which makes it the task's
        // version: two decisions taken on the same read (a delayed Retry and
        // a reply, handled side by side) cannot both commit, so neither
        // overwrites what the other counted.
        self.stop_fanned_out();
        self.task.updated_at = self.cx.now;
        self.task.lease_epoch += 1;
        self.changes.tasks.push(TaskWrite::replacing(self.task_before, self.task.clone()));
        for (name, step) in self.steps.drafted {
            if self.created.contains(&name) {
                self.changes.new_steps.push(step);
                continue;
            }
            let before = self.steps.before[&name];
            if step != *before {
                self.changes.steps.push(StepWrite::replacing(before, step));
            }
        }
        Decision::Commit(Box::new(self.changes))
    }
}
