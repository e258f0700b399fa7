//! The demo's final table, and the checks that decide its exit code: read
//! from the store (tasks, history, alerts) and from the simulated service
//! (requests and effects per idempotency key, the ledger of every order).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use rota_model::{TaskId, TaskState};
use rota_store::{EventKind, SharedStore, TaskFilter};

use super::service::{self, Op};

/// Events read per page of the history.
const PAGE: u32 = 5_000;

/// What the run did, and what the checks found.
#[derive(Debug, Default)]
pub struct Report {
    tasks: u32,
    by_state: HashMap<TaskState, u32>,
    /// Why compensated tasks were compensated, with counts.
    compensation_reasons: BTreeMap<String, u32>,
    /// Operator alerts, by reason.
    alert_reasons: BTreeMap<String, u32>,
    /// `StepFailed` events with `retryable: true`: the Scheduler retried the step.
    step_retries: u32,
    /// `StepFailed` events of attempts that got no reply before their
    /// complete-by, found by the Supervisor.
    step_timeouts: u32,
    /// `Expired` events: task leases the Supervisor found run out.
    task_expiries: u32,
    /// Steps re-sent by a Scheduler that took a task over.
    reissued: u32,
    /// Requests beyond the first per idempotency key (the agents' and the
    /// Scheduler's retries, as the service saw them).
    repeat_requests: u64,
    service: service::Counters,
    effects: u64,
    max_effects_per_key: Option<(String, u32)>,
    max_effects_per_order_op: Option<(String, Op, u32)>,
    /// Steps with more than one `StepCompleted`.
    completed_twice: Vec<String>,
    /// Compensated tasks whose compensations did not run in reverse order of completion.
    out_of_order: Vec<String>,
    /// Orders whose ledger at the service disagrees with how their task ended.
    mismatches: Vec<String>,
    /// Checks of the run itself (`--chaos`): label, figure, passed.
    run_checks: Vec<(String, String, bool)>,
}

/// Reads everything the table needs.
pub async fn gather(store: &SharedStore, service: &service::Report, base: &str) -> anyhow::Result<Report> {
    let mut report = Report::default();
    let tasks = store.list_tasks(&TaskFilter { limit: u32::MAX, ..TaskFilter::default() }).await?;
    report.tasks = tasks.len() as u32;
    let states: HashMap<TaskId, TaskState> = tasks.iter().map(|t| (t.id.clone(), t.state)).collect();
    for task in &tasks {
        *report.by_state.entry(task.state).or_default() += 1;
    }

    // One pass over the whole history.
    let mut completed: HashMap<(TaskId, String), u32> = HashMap::new();
    let mut completion_order: HashMap<TaskId, Vec<String>> = HashMap::new();
    let mut compensation_order: HashMap<TaskId, Vec<String>> = HashMap::new();
    let mut compensation_reason: HashMap<TaskId, String> = HashMap::new();
    let mut after = 0;
    loop {
        let page = store.events_after(after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        for event in page {
            let step = event.step.as_ref().map(|s| s.to_string());
            match event.kind {
                EventKind::StepCompleted => {
                    let step = step.unwrap_or_default();
                    *completed.entry((event.task_id.clone(), step.clone())).or_default() += 1;
                    completion_order.entry(event.task_id).or_default().push(step);
                }
                EventKind::StepCompensated => compensation_order.entry(event.task_id).or_default().push(step.unwrap_or_default()),
                EventKind::StepFailed => {
                    // A step settled "in doubt" (timed out while its order was
                    // being undone) is compensated as if it had completed last.
                    if event.detail["in_doubt"] == serde_json::Value::Bool(true) {
                        completion_order.entry(event.task_id.clone()).or_default().push(step.clone().unwrap_or_default());
                    }
                    let error = event.detail["error"].as_str().unwrap_or_default();
                    if event.detail["retryable"].as_bool() == Some(true) {
                        report.step_retries += 1;
                    }
                    if error.contains("complete-by") || error.contains("timed out while its task had no Scheduler") {
                        report.step_timeouts += 1;
                    }
                }
                EventKind::StepStarted if event.detail["reissued"].as_bool() == Some(true) => report.reissued += 1,
                EventKind::Expired => report.task_expiries += 1,
                EventKind::CompensationStarted => {
                    let reason = event.detail["reason"].as_str().unwrap_or("(no reason)");
                    compensation_reason.entry(event.task_id).or_insert_with(|| reason.to_owned());
                }
                _ => {}
            }
        }
    }
    for (task, reason) in compensation_reason {
        if states.get(&task) == Some(&TaskState::Compensated) {
            *report.compensation_reasons.entry(shorten(&reason, base)).or_default() += 1;
        }
    }
    let mut twice: Vec<String> =
        completed.iter().filter(|(_, n)| **n > 1).map(|((task, step), n)| format!("{task}/{step} completed {n} times")).collect();
    twice.sort();
    report.completed_twice = twice;
    for (task, undone) in &compensation_order {
        let done = completion_order.get(task).map(Vec::as_slice).unwrap_or_default();
        let position = |list: &[String], step: &str| list.iter().position(|s| s == step);
        let reversed = undone.iter().enumerate().all(|(i, a)| {
            undone[i + 1..].iter().all(|b| match (position(done, a), position(done, b)) {
                // `a` was undone before `b`, so it must have completed after it.
                (Some(pa), Some(pb)) => pa > pb,
                _ => false,
            })
        });
        if !reversed {
            report.out_of_order.push(format!("{task}: completed {done:?}, compensated {undone:?}"));
        }
    }
    report.out_of_order.sort();

    for alert in store.alerts(u32::MAX).await? {
        let reason = alert.detail["reason"].as_str().unwrap_or("(no reason)");
        *report.alert_reasons.entry(shorten(reason, base)).or_default() += 1;
    }

    // The service's side.
    report.service = service.counters.clone();
    report.repeat_requests = service.requests_per_key.values().map(|n| u64::from(n.saturating_sub(1))).sum();
    report.effects = service.effects_per_key.values().map(|n| u64::from(*n)).sum();
    report.max_effects_per_key =
        service.effects_per_key.iter().max_by_key(|(k, n)| (**n, std::cmp::Reverse((*k).clone()))).map(|(k, n)| (k.clone(), *n));
    report.max_effects_per_order_op = service
        .orders
        .iter()
        .flat_map(|(order, ledger)| ledger.applied.iter().map(move |(op, n)| (order.clone(), *op, *n)))
        .max_by_key(|(order, op, n)| (*n, std::cmp::Reverse((order.clone(), *op))));
    let empty = service::OrderLedger::default();
    for (id, state) in &states {
        let ledger = service.orders.get(id.as_str()).unwrap_or(&empty);
        let n = |op| ledger.count(op);
        match state {
            TaskState::Processed => {
                let all_once = [Op::Reserve, Op::Charge, Op::Ship, Op::Notify].iter().all(|op| n(*op) == 1);
                if !all_once || n(Op::Release) + n(Op::Refund) > 0 {
                    report.mismatches.push(format!("{id}: processed, but the service has {}", describe(ledger)));
                }
            }
            TaskState::Compensated => {
                let leftover: Vec<(&str, Op, Op)> = [("reserve", Op::Reserve, Op::Release), ("charge", Op::Charge, Op::Refund)]
                    .into_iter()
                    .filter(|(_, done, undone)| n(*done) != n(*undone))
                    .collect();
                if !leftover.is_empty() {
                    report.mismatches.push(format!("{id}: compensated, but the service has {}", describe(ledger)));
                }
            }
            // Error: left for an operator, whatever was done stays as it is.
            _ => {}
        }
    }
    report.mismatches.sort();
    Ok(report)
}

fn describe(ledger: &service::OrderLedger) -> String {
    let applied: Vec<String> =
        Op::ALL.iter().filter(|op| ledger.count(**op) > 0).map(|op| format!("{} ×{}", op.as_str(), ledger.count(*op))).collect();
    if applied.is_empty() { "nothing applied".into() } else { applied.join(", ") }
}

/// A reason without the service's address, attempt numbers and times, so
/// that reasons group.
fn shorten(reason: &str, base: &str) -> String {
    let reason = reason.replace(base, "");
    let reason = numbers_after(&reason, "attempt ", "N");
    numbers_after(&reason, "passed at ", "T")
}

/// `text` with the number after each `prefix` replaced by `placeholder`.
fn numbers_after(text: &str, prefix: &str, placeholder: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let (head, tail) = rest.split_at(at + prefix.len());
        out.push_str(head);
        let digits = tail.chars().take_while(char::is_ascii_digit).count();
        if digits > 0 {
            out.push_str(placeholder);
        }
        rest = &tail[digits..];
    }
    out.push_str(rest);
    out
}

impl Report {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.max_effects_per_key.as_ref().is_none_or(|(_, n)| *n <= 1)
            && self.max_effects_per_order_op.as_ref().is_none_or(|(_, _, n)| *n <= 1)
            && self.completed_twice.is_empty()
            && self.out_of_order.is_empty()
            && self.mismatches.is_empty()
            && self.run_checks.iter().all(|(_, _, passed)| *passed)
    }

    /// Adds a check of the run itself to the table and the verdict.
    pub fn add_check(&mut self, label: impl Into<String>, figure: impl Into<String>, passed: bool) {
        self.run_checks.push((label.into(), figure.into(), passed));
    }

    fn count(&self, state: TaskState) -> u32 {
        self.by_state.get(&state).copied().unwrap_or(0)
    }

    /// The table, ready to print.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let ok = |good: bool| if good { "ok" } else { "FAILED" };
        let reasons = |out: &mut String, reasons: &BTreeMap<String, u32>| {
            for (reason, n) in reasons {
                let _ = writeln!(out, "      {n:>5} × {reason}");
            }
        };

        let _ = writeln!(out, "orders");
        row(&mut out, "processed", self.count(TaskState::Processed).to_string(), "");
        row(&mut out, "compensated (completed steps undone; by reason)", self.count(TaskState::Compensated).to_string(), "");
        reasons(&mut out, &self.compensation_reasons);
        row(&mut out, "error (left for an operator; alerts by reason)", self.count(TaskState::Error).to_string(), "");
        reasons(&mut out, &self.alert_reasons);
        let others: u32 = self
            .by_state
            .iter()
            .filter(|(s, _)| !matches!(s, TaskState::Processed | TaskState::Compensated | TaskState::Error))
            .map(|(_, n)| *n)
            .sum();
        if others > 0 {
            row(&mut out, "not ended", others.to_string(), "FAILED");
        }
        let _ = writeln!(out, "retries");
        row(&mut out, "step retries (StepFailed, retryable)", self.step_retries.to_string(), "");
        row(&mut out, "repeat requests per idempotency key (agent retries)", self.repeat_requests.to_string(), "");
        let _ = writeln!(out, "supervisor recoveries");
        row(&mut out, "step attempts timed out, then retried or given up", self.step_timeouts.to_string(), "");
        row(&mut out, "task leases expired", self.task_expiries.to_string(), "");
        if self.reissued > 0 {
            row(&mut out, "steps re-sent by a Scheduler taking a task over", self.reissued.to_string(), "");
        }
        let _ = writeln!(out, "payment service");
        let s = &self.service;
        row(&mut out, "requests received", s.requests.to_string(), "");
        row(&mut out, "  answered 503", s.unavailable.to_string(), "");
        row(&mut out, "  hung past the timeout, applied late", s.late.to_string(), "");
        row(&mut out, "  applied, answer lost", s.lost.to_string(), "");
        row(&mut out, "  never answered (unreachable mailbox)", s.blackholed.to_string(), "");
        row(&mut out, "  replayed a stored response", s.replayed.to_string(), "");
        row(&mut out, "effects applied", self.effects.to_string(), "");
        let (key, n) = self.max_effects_per_key.clone().unwrap_or_default();
        row(
            &mut out,
            "max effects for one idempotency key",
            n.to_string(),
            &if n <= 1 { "ok".to_owned() } else { format!("FAILED: {key}") },
        );
        let (order, op, n) = self.max_effects_per_order_op.clone().unwrap_or((String::new(), Op::Reserve, 0));
        row(
            &mut out,
            "max effects for one order and operation",
            n.to_string(),
            &if n <= 1 { "ok".to_owned() } else { format!("FAILED: {order} {}", op.as_str()) },
        );
        let _ = writeln!(out, "checks");
        row(&mut out, "steps completed more than once", self.completed_twice.len().to_string(), ok(self.completed_twice.is_empty()));
        row(&mut out, "compensations not in reverse order", self.out_of_order.len().to_string(), ok(self.out_of_order.is_empty()));
        row(
            &mut out,
            "orders whose service ledger disagrees with the outcome",
            self.mismatches.len().to_string(),
            ok(self.mismatches.is_empty()),
        );
        for (label, figure, passed) in &self.run_checks {
            row(&mut out, label, figure.clone(), ok(*passed));
        }
        for problem in self.completed_twice.iter().chain(&self.out_of_order).chain(&self.mismatches).take(20) {
            let _ = writeln!(out, "    {problem}");
        }
        let _ = writeln!(out, "{}", if self.passed() { "demo passed" } else { "DEMO FAILED: see the FAILED lines above" });
        out
    }
}

fn row(out: &mut String, label: &str, value: String, note: &str) {
    let line = format!("  {label:<56} {value:>7}  {note}");
    let _ = writeln!(out, "{}", line.trim_end());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_lose_the_address_and_attempt_numbers() {
        assert_eq!(
            shorten("step notify attempt 3 got no reply; POST http://127.0.0.1:4000/notify: 503", "http://127.0.0.1:4000"),
            "step notify attempt N got no reply; POST /notify: 503"
        );
        assert_eq!(shorten("complete-by passed at 1795830722312 (failure 3 of 3)", ""), "complete-by passed at T (failure 3 of 3)");
    }
}
