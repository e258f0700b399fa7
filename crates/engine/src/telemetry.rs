//! What the engine tells the outside about its work: metrics and traces.
//!
//! **Metrics** go through the [`metrics`] facade, to whichever recorder the
//! process installed (the `rota` binary installs one Prometheus recorder
//! whose registry the HTTP API renders at `/metrics`); without one, every
//! record is a no-op. The names are the constants below, all prefixed
//! `rota_`; `docs/api.md` lists them with their labels. Labels are bounded
//! sets: workflow, step and agent names come from registered definitions,
//! never from task ids or inputs.
//!
//! **Traces**: the roles open `tracing` spans (submit, a Scheduler's
//! decision on a claim or an inbox message, an agent call) and carry the
//! W3C trace context (`traceparent`) in the messages between them, so that
//! one trace runs from a submit through every Scheduler decision and agent
//! call of the task. The context is read from and written to spans through
//! `tracing-opentelemetry`: with no OpenTelemetry layer installed (tracing
//! off, the default) the spans have no context, no message carries one and
//! nothing is exported. The spans are at DEBUG level, so that the INFO logs
//! are unchanged and they cost nothing unless a layer wants them.
//!
//! Deliberately left out: installing a recorder or a subscriber, and any
//! exporter (the binary's business).

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Histogram: seconds from a step's attempt being sent to the Scheduler's
/// decision on its reply (or on its timeout). Labels: `workflow`, `step`,
/// `agent`, `outcome` ([`StepOutcome`]).
pub const STEP_DURATION: &str = "rota_step_duration_seconds";
/// Counter: step attempts the Scheduler scheduled again after a transient
/// failure or a timeout. Labels: `workflow`, `step`.
pub const STEP_RETRIES: &str = "rota_step_retries_total";
/// Counter: tasks that reached a terminal state (through a Scheduler, the
/// Supervisor, or a cancel of a task with nothing to undo). Labels:
/// `workflow`, `state`.
pub const TASKS_FINISHED: &str = "rota_tasks_finished_total";
/// Counter: agent calls by this process's agent workers (each runs the
/// agent's in-deadline retries). Labels: `agent`, `outcome` (`succeeded`,
/// `failed`, `retryable`, `deadline_passed`, `held`, `stopped`).
pub const AGENT_CALLS: &str = "rota_agent_calls_total";
/// Histogram: seconds an agent call took, its in-deadline retries included.
/// Labels: `agent`, `outcome`.
pub const AGENT_CALL_DURATION: &str = "rota_agent_call_duration_seconds";
/// Counter: the Supervisor's recoveries. Labels: `kind` (`task_reset`,
/// `task_ended`, `step_reported`, `step_settled`).
pub const SUPERVISOR_RECOVERIES: &str = "rota_supervisor_recoveries_total";
/// Counter: schedule fires handled by the Supervisor leader. Labels:
/// `outcome` (`started`, `skipped` by the overlap policy, `missed` and
/// skipped by the catch-up policy).
pub const SCHEDULE_FIRES: &str = "rota_schedule_fires_total";
/// Counter: deadline warnings the Supervisor raised (`at_risk` events).
/// Labels: `of` (`step`, `task`).
pub const WARNINGS_RAISED: &str = "rota_supervisor_warnings_total";
/// Counter: finished tasks deleted by retention (the Supervisor leader's
/// passes and `rota prune`), with their steps and history.
pub const TASKS_PRUNED: &str = "rota_tasks_pruned_total";
/// Counter: messages a consumer dead-lettered (poison messages). Labels:
/// `queue`.
pub const DEAD_LETTERS: &str = "rota_dead_letters_total";
/// Gauge: 1 while this process's Scheduler claims no new task because
/// its agents' backlog is at `agent_backlog_max`, else 0.
pub const CLAIMS_HELD_BACK: &str = "rota_scheduler_claims_held_back";
/// Counter: agents' replies decided by a Scheduler of the same process
/// without passing through its inbox. Labels: `outcome` (`committed`,
/// `ignored`, `lost_race`, `failed`: the last two then go through the
/// inbox).
pub const REPLIES_DECIDED_IN_PROCESS: &str = "rota_scheduler_replies_in_process_total";
/// Counter: tasks this process's Scheduler took in the commit that created
/// them (submitted here while it had no backlog), without a doorbell and a
/// claim.
pub const CLAIMED_AT_CREATION: &str = "rota_scheduler_claimed_at_creation_total";
/// How a step's attempt ended, as the `outcome` label of [`STEP_DURATION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepOutcome {
    /// The agent succeeded.
    Succeeded,
    /// The agent failed permanently.
    Failed,
    /// The agent used up its retries on transient faults.
    Retryable,
    /// No reply came before the complete-by.
    TimedOut,
}

impl StepOutcome {
    /// The label value; a compensation's outcome is prefixed `compensation_`.
    pub fn label(self, compensate: bool) -> &'static str {
        match (self, compensate) {
            (StepOutcome::Succeeded, false) => "succeeded",
            (StepOutcome::Failed, false) => "failed",
            (StepOutcome::Retryable, false) => "retryable",
            (StepOutcome::TimedOut, false) => "timed_out",
            (StepOutcome::Succeeded, true) => "compensation_succeeded",
            (StepOutcome::Failed, true) => "compensation_failed",
            (StepOutcome::Retryable, true) => "compensation_retryable",
            (StepOutcome::TimedOut, true) => "compensation_timed_out",
        }
    }
}

/// The W3C `traceparent` of `span` (`00-<trace id>-<span id>-<flags>`), or
/// `None` when the span has no trace context (tracing is off, or the span
/// is disabled).
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let context = span.context();
    let span_ref = context.span();
    let sc = span_ref.span_context();
    sc.is_valid().then(|| format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8()))
}

/// The `traceparent` of the current span.
pub fn current_traceparent() -> Option<String> {
    traceparent(&tracing::Span::current())
}

/// Makes the remote span named by `traceparent` the parent of `span`
/// (which must not have been entered yet). A missing or malformed value
/// leaves `span` a root: a trace context is a hint, never a reason to
/// refuse a message.
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    if span.is_disabled() {
        return;
    }
    if let Some(remote) = traceparent.and_then(parse_traceparent) {
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
}

/// Parses a W3C `traceparent` header value (version 00; later versions
/// are read as 00, as the recommendation asks).
pub fn parse_traceparent(value: &str) -> Option<SpanContext> {
    let mut parts = value.trim().split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
        return None;
    }
    if trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let trace_id = TraceId::from_hex(trace).ok()?;
    let span_id = SpanId::from_hex(span).ok()?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    let context = SpanContext::new(trace_id, span_id, TraceFlags::new(flags) & TraceFlags::SAMPLED, true, TraceState::default());
    context.is_valid().then_some(context)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(value: &str) -> Option<(String, String, bool)> {
        parse_traceparent(value).map(|c| (c.trace_id().to_string(), c.span_id().to_string(), c.is_sampled()))
    }

    #[test]
    fn traceparents_parse_as_the_recommendation_says() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(check(ok), Some(("4bf92f3577b34da6a3ce929d0e0e4736".into(), "00f067aa0ba902b7".into(), true)));
        assert_eq!(check("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").map(|c| c.2), Some(false));
        // A later version may add fields.
        assert!(check("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra").is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-xyz92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(check(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn without_a_layer_spans_carry_no_context() {
        let span = tracing::debug_span!("rota.test");
        assert_eq!(traceparent(&span), None);
        set_parent(&span, Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        assert_eq!(traceparent(&span), None);
    }
}
