//! The step lifecycle: one node of a workflow within one task, with its
//! attempt number (the fence for agent replies) and its own `complete_by`.
//!
//! ```text
//!              start                 complete
//!  NotStarted ──────► Running ─────────────────► Completed ──begin_compensation──► Compensating
//!     ▲   ▲             │ │ fail (permanent, or attempts used up)                      │ compensated
//!     │   └─ retry ◄────┘ └──────────────────────► Failed ──resubmit──► NotStarted     ▼
//!     │  (fail: transient; expire: deadline passed)                               Compensated
//!     │
//!     └──skip (its `when` condition is false, before any attempt)──► Skipped
//! ```
//!
//! Replies carry the attempt they answer. A reply for any other attempt than
//! the current one is refused with [`TransitionError::LeaseLost`]: that is how
//! a late or duplicate reply from an earlier attempt never changes state.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::Timestamp;
use crate::ids::{StepName, TaskId};
use crate::retry::RetryPolicy;
use crate::task::TransitionError;

/// Where a step is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// Not yet sent, or waiting for its next attempt after `not_before`. The
    /// task's Scheduler starts it when its dependencies have completed.
    NotStarted,
    /// A request for `attempt` is with an agent until `complete_by`. The reply
    /// moves it on; without a reply it stays here until the Supervisor finds
    /// `complete_by` passed.
    Running,
    /// The agent replied with an output. Compensation may later undo it;
    /// an operator's resubmit with a new input ([`Step::rerun`]) starts it over.
    Completed,
    /// A permanent error, or retries used up. Terminal; an operator's
    /// resubmit (or [`Step::rerun`]) moves it back to NotStarted.
    Failed,
    /// Its compensation request (`attempt`) is with an agent until `complete_by`.
    Compensating,
    /// Its effect was undone. Terminal.
    Compensated,
    /// Its `when` condition was false when it became ready: it never ran,
    /// has no output and nothing to undo. It satisfies the steps that
    /// depend on it like a completed step. Terminal: only an operator's
    /// resubmit with a new input ([`Step::rerun`]) moves it again, so that
    /// its condition is decided again on that input.
    Skipped,
}

impl StepState {
    /// Every state, in lifecycle order.
    pub const ALL: [StepState; 7] = [
        StepState::NotStarted,
        StepState::Running,
        StepState::Completed,
        StepState::Failed,
        StepState::Compensating,
        StepState::Compensated,
        StepState::Skipped,
    ];

    /// Whether no further move happens without an operator.
    pub fn is_terminal(self) -> bool {
        matches!(self, StepState::Failed | StepState::Compensated | StepState::Skipped)
    }

    /// Whether the steps that depend on it may start: it completed, or it
    /// was skipped (a skipped step settles its dependents like a completed
    /// one, so that a condition on one step of a chain does not stop the
    /// rest).
    pub fn is_settled(self) -> bool {
        matches!(self, StepState::Completed | StepState::Skipped)
    }

    /// The state's name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            StepState::NotStarted => "not_started",
            StepState::Running => "running",
            StepState::Completed => "completed",
            StepState::Failed => "failed",
            StepState::Compensating => "compensating",
            StepState::Compensated => "compensated",
            StepState::Skipped => "skipped",
        }
    }
}

impl fmt::Display for StepState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StepState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        StepState::ALL.into_iter().find(|state| state.as_str() == s).ok_or_else(|| format!("unknown step state {s:?}"))
    }
}

/// One step of one task, as the state store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The task it belongs to.
    pub task_id: TaskId,
    /// Its name within the workflow.
    pub name: StepName,
    /// Its position in the workflow definition (for display and ordering).
    pub position: u32,
    /// Where it is in its lifecycle.
    pub state: StepState,
    /// The current attempt (1-based once started); bumped by every start, so
    /// replies to earlier attempts are fenced out.
    pub attempt: u32,
    /// When the current attempt's time runs out.
    pub complete_by: Option<Timestamp>,
    /// When the current attempt is at risk (its step's `warn_after` past its
    /// start), if the step has a warning point: set only while Running,
    /// before `complete_by`, and cleared by every move that ends or replaces
    /// the attempt. The Supervisor raises the warning once per attempt.
    pub warn_at: Option<Timestamp>,
    /// The earliest time the next attempt may start (retry backoff).
    pub not_before: Timestamp,
    /// For a step completed by a callback: the SHA-256 (hex) of the
    /// current attempt's callback token, which a callback must present.
    /// The token itself is sent to the agent only, never stored. Set by
    /// the Scheduler when it starts such an attempt; every transition that
    /// ends or replaces the attempt clears it, and so does a callback that
    /// used it.
    pub callback_digest: Option<String>,
    /// The request sent to the agent, once rendered. For a step that waits
    /// for a signal, the signal once it arrived (possibly before the step
    /// started: it is kept here until the step consumes it).
    pub input: Option<Value>,
    /// The agent's output (or the signal's payload), once Completed.
    pub output: Option<Value>,
    /// The last error, if any attempt failed.
    pub last_error: Option<String>,
    /// When it last changed.
    pub updated_at: Timestamp,
}

impl Step {
    /// A step that has not started.
    pub fn new(task_id: TaskId, name: StepName, position: u32, now: Timestamp) -> Step {
        Step {
            task_id,
            name,
            position,
            state: StepState::NotStarted,
            attempt: 0,
            complete_by: None,
            warn_at: None,
            not_before: now,
            callback_digest: None,
            input: None,
            output: None,
            last_error: None,
            updated_at: now,
        }
    }

    fn refuse(&self, action: &'static str) -> TransitionError {
        if self.state.is_terminal() {
            TransitionError::Terminal { record: "step", state: self.state.as_str() }
        } else {
            TransitionError::NotAllowed { record: "step", action, state: self.state.as_str() }
        }
    }

    /// Checks that `attempt` is the current attempt of a step in flight.
    pub fn check_attempt(&self, attempt: u32) -> Result<(), TransitionError> {
        if !matches!(self.state, StepState::Running | StepState::Compensating) {
            return Err(self.refuse("accept a reply for"));
        }
        if attempt != self.attempt {
            return Err(TransitionError::LeaseLost { record: "step", held: attempt.into(), current: self.attempt.into() });
        }
        Ok(())
    }

    /// The Scheduler sends a new attempt with `input`, due by `now + timeout`.
    pub fn start(&self, input: Value, now: Timestamp, timeout: Duration) -> Result<Step, TransitionError> {
        if self.state != StepState::NotStarted {
            return Err(self.refuse("start"));
        }
        if self.not_before > now {
            return Err(TransitionError::NotDue { record: "step", until: self.not_before });
        }
        let mut next = self.clone();
        next.state = StepState::Running;
        next.attempt += 1;
        next.complete_by = Some(now.add(timeout));
        next.warn_at = None;
        next.callback_digest = None;
        next.input = Some(input);
        next.updated_at = now;
        Ok(next)
    }

    /// The Scheduler starts a `for_each` step: its `items` (a JSON list)
    /// are kept as its input, and it is Running, with no complete-by of
    /// its own, while its instances (steps of their own, `NAME[i]`) run;
    /// it completes with their outputs. The attempt counts like a start's,
    /// so a resubmitted step is fanned out again as a new attempt.
    pub fn fan_out(&self, items: Value, now: Timestamp) -> Result<Step, TransitionError> {
        if self.state != StepState::NotStarted {
            return Err(self.refuse("fan out"));
        }
        let mut next = self.clone();
        next.state = StepState::Running;
        next.attempt += 1;
        next.complete_by = None;
        next.warn_at = None;
        next.callback_digest = None;
        next.input = Some(items);
        next.updated_at = now;
        Ok(next)
    }

    /// The Scheduler found the step's `when` condition false as it became
    /// ready: it will never run. Only a step that has had no attempt may be
    /// skipped: the condition is decided once, before the first attempt, so
    /// a retry or a resubmit never changes the decision.
    pub fn skip(&self, now: Timestamp) -> Result<Step, TransitionError> {
        if self.state != StepState::NotStarted || self.attempt > 0 {
            return Err(self.refuse("skip"));
        }
        let mut next = self.clone();
        next.state = StepState::Skipped;
        next.updated_at = now;
        Ok(next)
    }

    /// A Scheduler that took over a task re-sends a step that was in flight
    /// under the previous holder: a new attempt, so that a reply to the old
    /// one (which went to the previous holder) is fenced out.
    pub fn reissue(&self, now: Timestamp, timeout: Duration) -> Result<Step, TransitionError> {
        if !matches!(self.state, StepState::Running | StepState::Compensating) {
            return Err(self.refuse("reissue"));
        }
        let mut next = self.clone();
        next.attempt += 1;
        next.complete_by = Some(now.add(timeout));
        next.warn_at = None;
        next.callback_digest = None;
        next.updated_at = now;
        Ok(next)
    }

    /// The attempt just sent (by [`Step::start`] or [`Step::reissue`] at
    /// `now`) is at risk `warn_after` later, if given and before its
    /// complete-by; a warning point at or past the complete-by would only
    /// come once the attempt has failed, so it is left out.
    pub fn warn_after(&self, now: Timestamp, warn_after: Option<Duration>) -> Result<Step, TransitionError> {
        if self.state != StepState::Running {
            return Err(self.refuse("set the warning point of"));
        }
        let mut next = self.clone();
        next.warn_at = warn_after.map(|after| now.add(after)).filter(|at| self.complete_by.is_some_and(|by| *at < by));
        Ok(next)
    }

    /// The agent's reply for `attempt` carried an output.
    pub fn complete(&self, attempt: u32, output: Value, now: Timestamp) -> Result<Step, TransitionError> {
        self.check_attempt(attempt)?;
        if self.state != StepState::Running {
            return Err(self.refuse("complete"));
        }
        let mut next = self.clone();
        next.state = StepState::Completed;
        next.complete_by = None;
        next.warn_at = None;
        next.callback_digest = None;
        next.output = Some(output);
        next.updated_at = now;
        Ok(next)
    }

    /// The agent's reply for `attempt` was an error. With `retry_after` the
    /// step waits that long for another attempt; without, it has Failed.
    pub fn fail(&self, attempt: u32, error: String, retry_after: Option<Duration>, now: Timestamp) -> Result<Step, TransitionError> {
        self.check_attempt(attempt)?;
        if self.state != StepState::Running {
            return Err(self.refuse("fail"));
        }
        let mut next = self.clone();
        next.complete_by = None;
        next.warn_at = None;
        next.callback_digest = None;
        next.last_error = Some(error);
        next.updated_at = now;
        match retry_after {
            Some(delay) => {
                next.state = StepState::NotStarted;
                next.not_before = now.add(delay);
            }
            None => next.state = StepState::Failed,
        }
        Ok(next)
    }

    /// [`Step::fail`] with the decision taken by `policy`: a retryable error
    /// gets another attempt after a jittered backoff while attempts remain.
    pub fn fail_with_policy(
        &self,
        attempt: u32,
        error: String,
        retryable: bool,
        policy: &RetryPolicy,
        rng: &mut impl Rng,
        now: Timestamp,
    ) -> Result<Step, TransitionError> {
        let retry_after = (retryable && policy.allows_after(attempt)).then(|| policy.delay_after(attempt, rng));
        self.fail(attempt, error, retry_after, now)
    }

    /// The Supervisor's move when the attempt's `complete_by` has passed with
    /// no reply: the step waits `backoff` for another attempt. (Whether the
    /// task still has failures left is the task's count, decided by the caller.)
    pub fn expire(&self, now: Timestamp, backoff: Duration) -> Result<Step, TransitionError> {
        let Some(complete_by) = self.complete_by.filter(|_| matches!(self.state, StepState::Running | StepState::Compensating)) else {
            return Err(self.refuse("expire"));
        };
        if complete_by > now {
            return Err(TransitionError::NotDue { record: "step", until: complete_by });
        }
        let mut next = self.clone();
        next.complete_by = None;
        next.warn_at = None;
        next.callback_digest = None;
        next.not_before = now.add(backoff);
        next.last_error = Some(format!("attempt {} got no reply before its complete-by {complete_by}", self.attempt));
        next.updated_at = now;
        next.state = if self.state == StepState::Running { StepState::NotStarted } else { StepState::Completed };
        Ok(next)
    }

    /// Its task was cancelled while this attempt was in flight (for a
    /// `for_each` step, while its instances ran), with nothing to undo: no
    /// reply to the attempt will be acted on, so the step has Failed, with
    /// `reason` as its error. Whether the attempt's effect landed is not
    /// known; a cancel that has something to undo compensates instead.
    pub fn abandon(&self, reason: &str, now: Timestamp) -> Result<Step, TransitionError> {
        if self.state != StepState::Running {
            return Err(self.refuse("abandon"));
        }
        let mut next = self.clone();
        next.state = StepState::Failed;
        next.complete_by = None;
        next.warn_at = None;
        next.callback_digest = None;
        next.last_error = Some(format!("attempt {} was abandoned: {reason}", self.attempt));
        next.updated_at = now;
        Ok(next)
    }

    /// A step whose attempt timed out while its task is being undone: its
    /// effect may or may not have landed (the agent may have applied it and
    /// lost the answer). It is settled as Completed without an output, "in
    /// doubt", so that its compensation runs too: compensations must be
    /// idempotent and accept that there may be nothing to undo.
    ///
    /// It applies to a Running step whose complete-by has passed, and to a
    /// step waiting for its next attempt after an unconfirmed one (NotStarted
    /// with an attempt behind it: a timeout or a transient failure).
    pub fn settle_in_doubt(&self, now: Timestamp) -> Result<Step, TransitionError> {
        match (self.state, self.complete_by) {
            (StepState::Running, Some(complete_by)) if complete_by > now => {
                return Err(TransitionError::NotDue { record: "step", until: complete_by });
            }
            (StepState::Running, Some(_)) => {}
            (StepState::NotStarted, _) if self.attempt > 0 => {}
            _ => return Err(self.refuse("settle in doubt")),
        }
        let mut next = self.clone();
        next.state = StepState::Completed;
        next.complete_by = None;
        next.warn_at = None;
        next.callback_digest = None;
        next.not_before = now;
        next.last_error = Some(format!("attempt {} was never confirmed: its effect is in doubt, so it is compensated", self.attempt));
        next.updated_at = now;
        Ok(next)
    }

    /// The Scheduler sends the compensation of a completed step.
    pub fn begin_compensation(&self, now: Timestamp, timeout: Duration) -> Result<Step, TransitionError> {
        if self.state != StepState::Completed {
            return Err(self.refuse("compensate"));
        }
        if self.not_before > now {
            return Err(TransitionError::NotDue { record: "step", until: self.not_before });
        }
        let mut next = self.clone();
        next.state = StepState::Compensating;
        next.attempt += 1;
        next.complete_by = Some(now.add(timeout));
        next.warn_at = None;
        next.callback_digest = None;
        next.updated_at = now;
        Ok(next)
    }

    /// The compensation reply for `attempt` succeeded.
    pub fn compensated(&self, attempt: u32, now: Timestamp) -> Result<Step, TransitionError> {
        self.check_attempt(attempt)?;
        if self.state != StepState::Compensating {
            return Err(self.refuse("finish compensating"));
        }
        let mut next = self.clone();
        next.state = StepState::Compensated;
        next.complete_by = None;
        next.warn_at = None;
        next.callback_digest = None;
        next.updated_at = now;
        Ok(next)
    }

    /// The compensation reply for `attempt` was an error. With `retry_after`
    /// the step goes back to Completed, to be compensated again after that
    /// wait; without, it has Failed (and the task needs an operator).
    pub fn fail_compensation(
        &self,
        attempt: u32,
        error: String,
        retry_after: Option<Duration>,
        now: Timestamp,
    ) -> Result<Step, TransitionError> {
        self.check_attempt(attempt)?;
        if self.state != StepState::Compensating {
            return Err(self.refuse("fail the compensation of"));
        }
        let mut next = self.clone();
        next.complete_by = None;
        next.warn_at = None;
        next.callback_digest = None;
        next.last_error = Some(error);
        next.updated_at = now;
        match retry_after {
            Some(delay) => {
                next.state = StepState::Completed;
                next.not_before = now.add(delay);
            }
            None => next.state = StepState::Failed,
        }
        Ok(next)
    }

    /// An operator resumes a compensation that failed on this step: it goes
    /// back to Completed, to be compensated again.
    pub fn resubmit_compensation(&self, now: Timestamp) -> Result<Step, TransitionError> {
        if self.state != StepState::Failed {
            return Err(TransitionError::NotAllowed { record: "step", action: "resubmit the compensation of", state: self.state.as_str() });
        }
        let mut next = self.clone();
        next.state = StepState::Completed;
        next.not_before = now;
        next.updated_at = now;
        Ok(next)
    }

    /// An operator runs the step again from the start, after changing the
    /// task's input: whatever it did (completed, failed, was skipped, or was
    /// left running when the task failed), it goes back to NotStarted
    /// without output, error or resolved input, so that its input template
    /// and its `when` are decided again on the new input. A compensation's
    /// states are refused (a task being undone is resumed as a whole). The
    /// attempt number keeps counting, so replies to old attempts stay fenced.
    pub fn rerun(&self, now: Timestamp) -> Result<Step, TransitionError> {
        if matches!(self.state, StepState::Compensating | StepState::Compensated) {
            return Err(TransitionError::NotAllowed { record: "step", action: "run again", state: self.state.as_str() });
        }
        let mut next = Step::new(self.task_id.clone(), self.name.clone(), self.position, now);
        next.attempt = self.attempt;
        Ok(next)
    }

    /// An operator resubmits a failed step: it may start again at once. The
    /// attempt number keeps counting, so replies to old attempts stay fenced.
    pub fn resubmit(&self, now: Timestamp) -> Result<Step, TransitionError> {
        if self.state != StepState::Failed {
            return Err(TransitionError::NotAllowed { record: "step", action: "resubmit", state: self.state.as_str() });
        }
        let mut next = self.clone();
        next.state = StepState::NotStarted;
        next.not_before = now;
        next.updated_at = now;
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use serde_json::json;

    const TIMEOUT: Duration = Duration::from_secs(5);
    const WARN_AFTER: Duration = Duration::from_secs(4);

    fn at(millis: i64) -> Timestamp {
        Timestamp::from_millis(millis)
    }

    fn step() -> Step {
        Step::new(TaskId::new("t1").unwrap(), StepName::new("charge").unwrap(), 0, at(0))
    }

    #[test]
    fn an_abandoned_attempt_fails_the_step_and_leaves_nothing_in_flight() {
        let running = step().start(Value::Null, at(0), TIMEOUT).unwrap().warn_after(at(0), Some(WARN_AFTER)).unwrap();
        let abandoned = running.abandon("its task was cancelled", at(1_000)).unwrap();
        assert_eq!(abandoned.state, StepState::Failed);
        assert_eq!((abandoned.complete_by, abandoned.warn_at, abandoned.attempt), (None, None, 1));
        assert_eq!(abandoned.last_error.as_deref(), Some("attempt 1 was abandoned: its task was cancelled"));
        assert!(abandoned.complete(1, Value::from("late"), at(1_001)).is_err(), "a late reply is refused");
        assert!(step().abandon("cancelled", at(0)).is_err(), "a step that never started has nothing to abandon");
        let done = running.complete(1, Value::Null, at(500)).unwrap();
        assert!(matches!(done.abandon("cancelled", at(1_000)), Err(TransitionError::NotAllowed { .. })));
    }

    #[test]
    fn a_late_reply_from_an_earlier_attempt_changes_nothing() {
        let first = step().start(Value::Null, at(0), TIMEOUT).unwrap();
        assert_eq!(first.attempt, 1);
        let expired = first.expire(at(5_000), Duration::ZERO).unwrap();
        let second = expired.start(Value::Null, at(5_000), TIMEOUT).unwrap();
        assert_eq!(second.attempt, 2);
        assert!(matches!(second.complete(1, Value::from("late"), at(5_001)), Err(TransitionError::LeaseLost { held: 1, current: 2, .. })));
        let done = second.complete(2, Value::from("ok"), at(5_002)).unwrap();
        assert_eq!(done.state, StepState::Completed);
        assert!(done.complete(2, Value::from("dup"), at(5_003)).is_err(), "a duplicate reply is refused too");
    }

    #[test]
    fn retries_follow_the_policy_until_attempts_run_out() {
        let policy = RetryPolicy::new(3, Duration::from_millis(100), Duration::from_secs(1)).unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        let mut s = step();
        for attempt in 1..=3 {
            s = s.start(Value::Null, s.not_before, TIMEOUT).unwrap();
            assert_eq!(s.attempt, attempt);
            s = s.fail_with_policy(attempt, "503".into(), true, &policy, &mut rng, s.updated_at).unwrap();
        }
        assert_eq!(s.state, StepState::Failed);
        assert_eq!(s.last_error.as_deref(), Some("503"));
    }

    #[test]
    fn a_permanent_error_fails_at_once() {
        let policy = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(1);
        let s = step().start(Value::Null, at(0), TIMEOUT).unwrap();
        let s = s.fail_with_policy(1, "404".into(), false, &policy, &mut rng, at(1)).unwrap();
        assert_eq!(s.state, StepState::Failed);
        assert_eq!(s.resubmit(at(2)).unwrap().state, StepState::NotStarted);
    }

    #[test]
    fn a_warning_point_belongs_to_one_running_attempt() {
        let first = step().start(Value::Null, at(0), TIMEOUT).unwrap().warn_after(at(0), Some(WARN_AFTER)).unwrap();
        assert_eq!((first.warn_at, first.complete_by), (Some(at(4_000)), Some(at(5_000))));
        assert_eq!(first.complete(1, Value::Null, at(1)).unwrap().warn_at, None, "a finished attempt is at risk no more");
        let waiting = first.fail(1, "503".into(), Some(Duration::ZERO), at(1)).unwrap();
        assert_eq!(waiting.warn_at, None);
        let second = waiting.start(Value::Null, at(10), TIMEOUT).unwrap();
        assert_eq!(second.warn_at, None, "a new attempt gets its own point, from its own start");
        assert_eq!(second.warn_after(at(10), Some(WARN_AFTER)).unwrap().warn_at, Some(at(4_010)));
        assert_eq!(second.warn_after(at(10), None).unwrap().warn_at, None, "a step without warn_after is never at risk");
        assert_eq!(second.warn_after(at(10), Some(TIMEOUT)).unwrap().warn_at, None, "never at or past the complete-by");
        assert!(step().warn_after(at(0), Some(WARN_AFTER)).is_err(), "only a running attempt has one");
    }

    #[test]
    fn compensation_is_fenced_like_the_step() {
        let s = step().start(Value::Null, at(0), TIMEOUT).unwrap().complete(1, Value::Null, at(1)).unwrap();
        let c = s.begin_compensation(at(2), TIMEOUT).unwrap();
        assert_eq!((c.state, c.attempt), (StepState::Compensating, 2));
        assert!(c.compensated(1, at(3)).is_err());
        assert_eq!(c.compensated(2, at(3)).unwrap().state, StepState::Compensated);
    }

    #[test]
    fn only_a_step_without_attempts_is_skipped() {
        let skipped = step().skip(at(1)).unwrap();
        assert_eq!((skipped.state, skipped.attempt, skipped.output.as_ref()), (StepState::Skipped, 0, None));
        assert!(skipped.state.is_terminal() && skipped.state.is_settled());
        assert!(skipped.start(Value::Null, at(2), TIMEOUT).is_err(), "a skipped step never runs");
        assert!(skipped.resubmit(at(2)).is_err(), "nor is it resubmitted");
        assert!(skipped.begin_compensation(at(2), TIMEOUT).is_err(), "it has nothing to undo");
        let running = step().start(Value::Null, at(0), TIMEOUT).unwrap();
        assert!(running.skip(at(1)).is_err());
        let retrying = running.fail(1, "503".into(), Some(Duration::ZERO), at(1)).unwrap();
        assert!(retrying.skip(at(2)).is_err(), "the condition was decided before the first attempt");
    }

    #[test]
    fn a_rerun_starts_over_but_keeps_counting_attempts() {
        let done = step().start(json!({"a": 1}), at(0), TIMEOUT).unwrap().complete(1, json!({"ok": true}), at(1)).unwrap();
        for before in [done.clone(), step().skip(at(1)).unwrap(), step().start(Value::Null, at(0), TIMEOUT).unwrap()] {
            let again = before.rerun(at(5)).unwrap();
            assert_eq!((again.state, again.attempt, again.not_before), (StepState::NotStarted, before.attempt, at(5)));
            assert_eq!((again.input, again.output, again.last_error, again.complete_by), (None, None, None, None));
        }
        let compensated = done.begin_compensation(at(2), TIMEOUT).unwrap();
        assert!(compensated.rerun(at(3)).is_err(), "a compensation is resumed as a whole");
        assert!(compensated.compensated(2, at(3)).unwrap().rerun(at(4)).is_err());
    }

    #[derive(Debug, Clone)]
    enum Move {
        Start(i64),
        Complete(u32, i64),
        Fail(u32, Option<u64>, i64),
        Expire(i64),
        BeginCompensation(i64),
        Compensated(u32, i64),
        Reissue(i64),
        FailCompensation(u32, Option<u64>, i64),
        SettleInDoubt(i64),
        Skip(i64),
    }

    fn arb_move() -> impl Strategy<Value = Move> {
        let time = 0i64..100_000;
        prop_oneof![
            time.clone().prop_map(Move::Start),
            (0u32..6, time.clone()).prop_map(|(a, t)| Move::Complete(a, t)),
            (0u32..6, prop::option::of(0u64..2_000), time.clone()).prop_map(|(a, r, t)| Move::Fail(a, r, t)),
            time.clone().prop_map(Move::Expire),
            time.clone().prop_map(Move::BeginCompensation),
            (0u32..6, time.clone()).prop_map(|(a, t)| Move::Compensated(a, t)),
            time.clone().prop_map(Move::Reissue),
            (0u32..6, prop::option::of(0u64..2_000), time.clone()).prop_map(|(a, r, t)| Move::FailCompensation(a, r, t)),
            time.clone().prop_map(Move::SettleInDoubt),
            time.prop_map(Move::Skip),
        ]
    }

    fn apply(s: &Step, m: &Move) -> Result<Step, TransitionError> {
        match *m {
            Move::Start(now) => s.start(Value::Null, at(now), TIMEOUT).and_then(|s| s.warn_after(at(now), Some(WARN_AFTER))),
            Move::Complete(a, now) => s.complete(a, Value::Null, at(now)),
            Move::Fail(a, r, now) => s.fail(a, "e".into(), r.map(Duration::from_millis), at(now)),
            Move::Expire(now) => s.expire(at(now), Duration::from_millis(10)),
            Move::BeginCompensation(now) => s.begin_compensation(at(now), TIMEOUT),
            Move::Compensated(a, now) => s.compensated(a, at(now)),
            Move::Reissue(now) => s.reissue(at(now), TIMEOUT).and_then(|s| s.warn_after(at(now), Some(WARN_AFTER))),
            Move::FailCompensation(a, r, now) => s.fail_compensation(a, "e".into(), r.map(Duration::from_millis), at(now)),
            Move::SettleInDoubt(now) => s.settle_in_doubt(at(now)),
            Move::Skip(now) => s.skip(at(now)),
        }
    }

    proptest! {
        #[test]
        fn nothing_leaves_a_terminal_step_but_resubmit(moves in prop::collection::vec(arb_move(), 1..60)) {
            let mut s = step();
            for m in &moves {
                let before = s.clone();
                if let Ok(next) = apply(&s, m) {
                    prop_assert!(!before.state.is_terminal(), "{m:?} moved a step out of {}", before.state);
                    prop_assert!(next.attempt >= before.attempt, "attempts never go back");
                    prop_assert_eq!(next.complete_by.is_some(), matches!(next.state, StepState::Running | StepState::Compensating));
                    // A warning point belongs to a running attempt, before its complete-by.
                    if let Some(warn_at) = next.warn_at {
                        prop_assert_eq!(next.state, StepState::Running);
                        prop_assert!(next.complete_by.is_some_and(|by| warn_at < by));
                    }
                    s = next;
                }
            }
        }

        #[test]
        fn a_reply_for_another_attempt_is_refused(moves in prop::collection::vec(arb_move(), 1..60), stale in 0u32..6) {
            let mut s = step();
            for m in &moves {
                if let Ok(next) = apply(&s, m) { s = next; }
                if stale != s.attempt {
                    prop_assert!(s.complete(stale, Value::Null, at(0)).is_err());
                    prop_assert!(s.fail(stale, "x".into(), None, at(0)).is_err());
                    prop_assert!(s.compensated(stale, at(0)).is_err());
                    prop_assert!(s.fail_compensation(stale, "x".into(), None, at(0)).is_err());
                }
            }
        }
    }
}
