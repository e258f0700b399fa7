//! The task commands: `submit`, `status`, `tasks`, `alerts`,
//! `resubmit`, `cancel`, `pause`, `resume` and `workflows`. Each checks its arguments, opens
//! its [`Backend`] (the store, with no engine in this process: a `rota
//! serve` somewhere does the work; or a server's API with `--server`),
//! makes its calls, and prints the result: a table for people, `--json` for
//! programs. Both backends answer with the API's views, so the output is
//! the same either way.
//!
//! `submit --wait` polls the task, printing each step's moves on stderr as
//! they happen, and exits 0 only when the task ends Processed.
//!
//! Deliberately left out: following a task's events as a stream (the API's
//! server-sent events), and paging through long listings.

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use rota_api::wire::TaskView;
use rota_model::{
    Clock, PRIORITY_MAX, PRIORITY_MIN, Priority, QueueName, SignalName, StepName, StepState, SystemClock, Tags, TaskId, TaskState,
    Timestamp, WorkflowName,
};
use rota_store::{BatchAction, TaskFilter, TimeRange};
use serde_json::Value;

use crate::backend::{Backend, Start, SubmitHow};
use crate::batches::BulkArgs;
use crate::output::{self, AlertJson, BreakerJson, StatusJson, TaskSummaryJson, WorkflowJson, rfc3339_millis};
use crate::store_args::StoreArgs;

/// How often `submit --wait` reads the task.
const WAIT_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// The most tasks or alerts a listing may ask for.
const LIST_LIMIT_MAX: u32 = 10_000;
/// How many characters of an error or a JSON value a table cell shows.
const CELL_CHARS_MAX: usize = 60;
/// How many of the latest events `status` shows as a table.
const HISTORY_SHOWN: usize = 20;

/// Arguments of `submit`.
#[derive(clap::Args)]
pub struct SubmitArgs {
    /// The workflow to run (registered by `rota serve --workflows DIR`).
    workflow: WorkflowName,
    /// The task's input: a JSON document, or @FILE to read one from a file.
    #[arg(long, value_name = "JSON", default_value = "{}")]
    input: String,
    /// The task id, which doubles as the submission's idempotency key: a
    /// second submit with the same id creates nothing [default: a fresh UUID].
    #[arg(long, value_name = "ID")]
    id: Option<TaskId>,
    /// The workflow version [default: the latest registered].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    version: Option<u32>,
    /// Start no earlier than this time, in RFC 3339 (2026-12-01T02:00:00Z,
    /// or with an offset such as +01:00); the task waits Pending until then.
    #[arg(long, value_name = "TIME", conflicts_with = "delay")]
    at: Option<String>,
    /// Start no earlier than this long from now (90s, 10m, 2h 30m).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    delay: Option<Duration>,
    /// Send the task's status events (received, step_completed, processed,
    /// error, compensated, cancelled) to this durable queue, each in the
    /// commit that records it, with the task id as correlation id; read them
    /// with `rota queue receive QUEUE`. Not a `rota.` or `agent.` queue.
    #[arg(long, value_name = "QUEUE")]
    reply_queue: Option<QueueName>,
    /// Label the task (repeat for more): find it later with
    /// `rota tasks --tag key=value`. Keys: 1 to 64 of A-Z a-z 0-9 _ - . / :;
    /// values: at most 256 bytes; at most 16 tags.
    #[arg(long = "tag", value_name = "KEY=VALUE", value_parser = parse_tag_arg)]
    tags: Vec<(String, String)>,
    /// The task's priority, from -100 to 100: Schedulers claim higher
    /// priorities first, then in submission order, and one claimed task in
    /// `--claim-oldest-every` (8) is the oldest waiting, whatever its
    /// priority [default: the workflow's `priority:`, or 0].
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = parse_priority_arg)]
    priority: Option<Priority>,
    /// Wait for the task to end, showing its steps' progress on stderr; exit
    /// 0 only if it ends Processed.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits before giving up (the task goes on).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration, requires = "wait")]
    timeout: Duration,
}

/// Arguments of `status`.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// The task id.
    id: TaskId,
    /// Print a JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

/// The filters that select tasks, shared by `rota tasks` and `rota
/// export` (a filter added here serves both).
#[derive(clap::Args)]
pub struct FilterArgs {
    /// Only tasks in this state: pending, processing, processed, error,
    /// compensating, compensated or cancelled.
    #[arg(long, value_name = "STATE")]
    state: Option<TaskState>,
    /// Only tasks of this workflow.
    #[arg(long, value_name = "NAME")]
    workflow: Option<WorkflowName>,
    /// Only tasks at risk: unfinished tasks for which the Supervisor raised
    /// a deadline warning (`warn_after` passed) during their current lease,
    /// for the task or one of its steps.
    #[arg(long)]
    at_risk: bool,
    /// Only tasks with this tag (repeat: with every one given).
    #[arg(long = "tag", value_name = "KEY=VALUE", value_parser = parse_tag_arg)]
    tags: Vec<(String, String)>,
    /// Only tasks created at or after TIME: RFC 3339
    /// (2026-11-28T09:00:00Z), or a duration ago (90m, 2h, 7d).
    #[arg(long, value_name = "TIME", value_parser = parse_time_arg)]
    created_after: Option<TimeArg>,
    /// Only tasks created before TIME (RFC 3339, or a duration ago).
    #[arg(long, value_name = "TIME", value_parser = parse_time_arg)]
    created_before: Option<TimeArg>,
    /// Only finished tasks that ended at or after TIME (RFC 3339, or a
    /// duration ago).
    #[arg(long, value_name = "TIME", value_parser = parse_time_arg)]
    ended_after: Option<TimeArg>,
    /// Only finished tasks that ended before TIME (RFC 3339, or a duration
    /// ago).
    #[arg(long, value_name = "TIME", value_parser = parse_time_arg)]
    ended_before: Option<TimeArg>,
    /// Only tasks whose id starts with PREFIX.
    #[arg(long, value_name = "PREFIX")]
    id_prefix: Option<String>,
    /// Only the children of task ID: the tasks its `workflow:` steps
    /// started.
    #[arg(long, value_name = "ID")]
    parent: Option<TaskId>,
    /// The page after CURSOR: the tasks listed after it, that is created
    /// before it. A full page ends with the cursor of the next.
    #[arg(long, visible_alias = "before", value_name = "CURSOR")]
    after: Option<TaskId>,
}

impl FilterArgs {
    /// Whether any filter is given.
    pub fn any_given(&self) -> bool {
        self.state.is_some()
            || self.workflow.is_some()
            || self.at_risk
            || !self.tags.is_empty()
            || self.created_after.is_some()
            || self.created_before.is_some()
            || self.ended_after.is_some()
            || self.ended_before.is_some()
            || self.id_prefix.is_some()
            || self.parent.is_some()
            || self.after.is_some()
    }

    /// The store's filter, `limit` tasks per page; times given as a
    /// duration ago count back from now.
    pub fn filter(self, limit: u32) -> anyhow::Result<TaskFilter> {
        if let Some(prefix) = &self.id_prefix
            && (prefix.is_empty() || prefix.len() > rota_model::ids::ID_BYTES_MAX)
        {
            bail!("--id-prefix: must be 1 to {} bytes", rota_model::ids::ID_BYTES_MAX);
        }
        let now = SystemClock.now();
        let time = |arg: Option<TimeArg>| arg.map(|arg| arg.at(now));
        Ok(TaskFilter {
            state: self.state,
            workflow: self.workflow,
            at_risk: self.at_risk,
            tags: self.tags,
            created: TimeRange { from: time(self.created_after), until: time(self.created_before) },
            ended: TimeRange { from: time(self.ended_after), until: time(self.ended_before) },
            id_prefix: self.id_prefix,
            parent: self.parent,
            before: self.after,
            limit,
            ..TaskFilter::default()
        })
    }
}

/// Arguments of `tasks`.
#[derive(clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    filters: FilterArgs,
    /// The most tasks to list, newest first.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=i64::from(LIST_LIMIT_MAX)))]
    limit: u32,
    /// Print how many tasks match, by state, instead of listing them.
    #[arg(long, conflicts_with_all = ["after", "at_risk"])]
    count: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// A `--priority N`.
fn parse_priority_arg(text: &str) -> Result<Priority, String> {
    let value: i64 = text.trim().parse().map_err(|_| format!("expected an integer from {PRIORITY_MIN} to {PRIORITY_MAX}, got {text:?}"))?;
    Priority::new(value).map_err(|err| err.to_string())
}

/// A `--tag KEY=VALUE`.
fn parse_tag_arg(text: &str) -> Result<(String, String), String> {
    rota_model::tags::parse_tag(text).map_err(|err| err.to_string())
}

/// A time on the command line: a point, or a duration before the command
/// runs.
#[derive(Debug, Clone, Copy)]
pub enum TimeArg {
    At(Timestamp),
    Ago(Duration),
}

impl TimeArg {
    pub fn at(self, now: Timestamp) -> Timestamp {
        match self {
            TimeArg::At(at) => at,
            TimeArg::Ago(ago) => Timestamp::from_millis(now.as_millis() - i64::try_from(ago.as_millis()).unwrap_or(i64::MAX)),
        }
    }
}

pub fn parse_time_arg(text: &str) -> Result<TimeArg, String> {
    if let Ok(ago) = humantime::parse_duration(text.trim()) {
        return Ok(TimeArg::Ago(ago));
    }
    rota_engine::client::parse_start_at(text)
        .map(TimeArg::At)
        .map_err(|_| format!("expected an RFC 3339 time (2026-11-28T09:00:00Z) or a duration ago (90m, 2h, 7d), got {text:?}"))
}

/// Arguments of `alerts`.
#[derive(clap::Args)]
pub struct AlertsArgs {
    /// The most alerts to list, newest first.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=i64::from(LIST_LIMIT_MAX)))]
    limit: u32,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

/// Arguments of `resubmit`.
#[derive(clap::Args)]
pub struct ResubmitArgs {
    /// The task id (a task in Error); or, instead, filters that select the
    /// tasks to resubmit as a batch (see `rota batches`).
    #[arg(required_unless_present_any = BULK_FILTERS)]
    id: Option<TaskId>,
    #[command(flatten)]
    bulk: BulkArgs,
    /// Run only this step again [default: every failed step].
    #[arg(long, value_name = "STEP")]
    step: Option<StepName>,
    /// Replace the task's input (a JSON document, or @FILE to read one)
    /// and run the `--step` and every step that depends on it again on it.
    #[arg(long, value_name = "JSON", requires = "step")]
    input: Option<String>,
    /// Why, kept in the task's history with who did it.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

/// Arguments of `cancel`.
#[derive(clap::Args)]
pub struct CancelArgs {
    /// The task id; or, instead, filters that select the tasks to cancel as
    /// a batch (see `rota batches`).
    #[arg(required_unless_present_any = BULK_FILTERS)]
    id: Option<TaskId>,
    #[command(flatten)]
    bulk: BulkArgs,
    /// Why, kept in the task's history (or the batch) with who did it.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

/// The filters that make `cancel` and `resubmit` bulk actions.
const BULK_FILTERS: [&str; 10] =
    ["state", "workflow", "tags", "created_after", "created_before", "ended_after", "ended_before", "id_prefix", "parent", "at_risk"];

/// Arguments of `pause` and `resume`.
#[derive(clap::Args)]
pub struct PauseArgs {
    /// The task id.
    id: TaskId,
    /// Why, kept in the task's history with who did it.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

/// Arguments of `workflows`.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct WorkflowsArgs {
    #[command(subcommand)]
    action: Option<WorkflowsAction>,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

/// What `workflows` does besides listing.
#[derive(clap::Subcommand)]
pub enum WorkflowsAction {
    /// Pause a workflow (every version): no Scheduler claims its tasks
    /// until it is resumed, so new ones wait pending; tasks already running
    /// go on to their end.
    Pause(WorkflowPauseArgs),
    /// Resume a paused workflow: its waiting tasks are claimed again.
    Resume(WorkflowPauseArgs),
}

/// Arguments of `workflows pause` and `workflows resume`.
#[derive(clap::Args)]
pub struct WorkflowPauseArgs {
    /// The workflow's name.
    name: WorkflowName,
    /// Why, kept with the pause with who did it and when.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

/// Parses `--input`: JSON, or `@FILE`. serde_json's message ends with the
/// line and column of the problem.
pub(crate) fn parse_input(text: &str) -> anyhow::Result<Value> {
    parse_json_arg("--input", text)
}

/// Parses the JSON argument `flag`: JSON, or `@FILE`.
fn parse_json_arg(flag: &str, text: &str) -> anyhow::Result<Value> {
    if let Some(path) = text.strip_prefix('@') {
        let contents = std::fs::read_to_string(Path::new(path)).with_context(|| format!("{flag} @{path}: cannot read the file"))?;
        return serde_json::from_str(&contents).map_err(|err| anyhow!("{flag} @{path} is not valid JSON: {err}"));
    }
    serde_json::from_str(text).map_err(|err| anyhow!("{flag} is not valid JSON: {err}"))
}

/// Arguments of `signal`.
#[derive(clap::Args)]
pub struct SignalArgs {
    /// The task id.
    id: TaskId,
    /// The signal's name: a step of the task's workflow waits for it (`wait: NAME`).
    name: SignalName,
    /// The signal's data, which becomes the waiting step's output: a JSON
    /// document, or @FILE to read one from a file.
    #[arg(long, value_name = "JSON", default_value = "null")]
    data: String,
}

/// `rota signal`: prints the step the signal went to and whether it
/// completed it now or is kept until the task reaches it.
pub async fn signal(store: &StoreArgs, args: SignalArgs) -> anyhow::Result<()> {
    let data = parse_json_arg("--data", &args.data)?;
    let delivery = store.backend().await?.signal(&args.id, &args.name, data).await?;
    let what = if delivery.completed { "completed" } else { "kept until the task reaches it" };
    output::line(&format!("step {}: {what}", delivery.step))?;
    Ok(())
}

/// Arguments of `callback`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("outcome").required(true).args(["output", "error"])))]
pub struct CallbackArgs {
    /// The token the step's request carried (its `Rota-Callback-Token`
    /// header, or `{{ callback.token }}` in its input).
    token: String,
    /// Complete the step with this output: a JSON document, or @FILE to
    /// read one from a file.
    #[arg(long, value_name = "JSON")]
    output: Option<String>,
    /// Fail the attempt with this error instead.
    #[arg(long, value_name = "TEXT")]
    error: Option<String>,
    /// With --error: the failure is transient, so the step is tried again
    /// (counted against the task's max_failures) with a new token.
    #[arg(long, requires = "error")]
    retryable: bool,
}

/// `rota callback`: prints the step and attempt and what the callback did.
pub async fn callback(store: &StoreArgs, args: CallbackArgs) -> anyhow::Result<()> {
    let outcome = match (args.output, args.error) {
        (Some(output), _) => rota_engine::callback::Outcome::Succeeded { output: parse_json_arg("--output", &output)? },
        (None, Some(error)) => rota_engine::callback::Outcome::Failed { error, retryable: args.retryable },
        (None, None) => bail!("give --output JSON or --error TEXT"),
    };
    let accepted = store.backend().await?.callback(&args.token, outcome).await?;
    let what = if accepted.completed { "completed" } else { "failed" };
    output::line(&format!("task {} step {} attempt {}: {what}", accepted.task_id, accepted.step, accepted.attempt))?;
    Ok(())
}

/// `rota submit`.
pub async fn submit(store: &StoreArgs, args: SubmitArgs) -> anyhow::Result<()> {
    let input = parse_input(&args.input)?;
    let tags = Tags::new(args.tags).map_err(|err| anyhow!("--tag: {err}"))?;
    let backend = store.backend().await?;
    let start = match (args.at, args.delay) {
        (Some(at), _) => Start::At(at),
        (None, Some(delay)) => Start::After(delay),
        (None, None) => Start::Now,
    };
    let submitted = backend
        .submit(
            &args.workflow,
            args.version,
            input,
            args.id,
            &SubmitHow { start: &start, reply_queue: args.reply_queue.as_ref(), tags: &tags, priority: args.priority },
        )
        .await
        .map_err(|err| {
            let hint =
                "; `rota workflows` lists the registered ones, and `rota serve --workflows DIR` registers a directory of definitions";
            if err.to_string().contains("is not registered") { anyhow!("{err}{hint}") } else { err.context("cannot submit") }
        })?;
    let task = &submitted.view;
    output::line(&task.id)?;
    if TaskState::from(task.state) == TaskState::Pending && task.not_before > task.created_at {
        eprintln!("task {} starts no earlier than {}", task.id, output::rfc3339_millis(task.not_before));
    }
    if !submitted.created {
        eprintln!(
            "(existing) task {} already exists ({}@{}, {}); nothing was submitted",
            task.id,
            task.workflow,
            task.version,
            TaskState::from(task.state)
        );
    }
    if !args.wait {
        return Ok(());
    }
    let id = TaskId::new(task.id.as_str()).map_err(|err| anyhow!("the server answered an invalid task id: {err}"))?;
    let task = wait(&backend, &id, args.timeout).await?;
    match TaskState::from(task.state) {
        TaskState::Processed => Ok(()),
        state if state.is_terminal() => {
            let why = task.error.as_deref().map(|error| format!(": {error}")).unwrap_or_default();
            bail!("task {} ended {state}{why}", task.id)
        }
        state => bail!(
            "task {} did not end within {}: it is {state} (it goes on; `rota status {}` shows it)",
            task.id,
            humantime::format_duration(args.timeout),
            task.id
        ),
    }
}

/// Polls the task until it is terminal or `timeout` has passed, printing
/// each move of the task and of its steps on stderr, behind a spinner when
/// stderr is a terminal.
async fn wait(backend: &Backend, id: &TaskId, timeout: Duration) -> anyhow::Result<TaskView> {
    let started = Instant::now();
    let spinner = if std::io::stderr().is_terminal() {
        let spinner = indicatif::ProgressBar::new_spinner();
        spinner.enable_steady_tick(Duration::from_millis(100));
        spinner
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut seen: Option<TaskView> = None;
    loop {
        let task = backend.task(id).await?;
        let elapsed = started.elapsed();
        for line in moves(seen.as_ref(), &task) {
            spinner.suspend(|| eprintln!("[{:>7.2}s] {line}", elapsed.as_secs_f64()));
        }
        let completed = task.steps.iter().filter(|step| StepState::from(step.state) == StepState::Completed).count();
        spinner.set_message(format!("task {id}: {}, {completed}/{} steps completed", TaskState::from(task.state), task.steps.len()));
        if TaskState::from(task.state).is_terminal() || elapsed >= timeout {
            spinner.finish_and_clear();
            return Ok(task);
        }
        seen = Some(task);
        tokio::time::sleep(WAIT_POLL_INTERVAL.min(timeout.saturating_sub(elapsed))).await;
    }
}

/// What changed between two reads of a task, one line per move.
fn moves(before: Option<&TaskView>, after: &TaskView) -> Vec<String> {
    let mut lines = Vec::new();
    for step in &after.steps {
        let state = StepState::from(step.state);
        let previous = before.and_then(|before| before.steps.iter().find(|s| s.name == step.name));
        let unchanged = previous.is_some_and(|p| StepState::from(p.state) == state && p.attempt == step.attempt);
        if unchanged || (previous.is_none() && state == StepState::NotStarted && step.attempt == 0) {
            continue;
        }
        if state == StepState::Skipped {
            lines.push(format!("step {}: skipped (its `when` was false: {})", step.name, cut(step.when.as_deref().unwrap_or("?"))));
            continue;
        }
        let error = match (state, &step.last_error) {
            (StepState::Failed | StepState::NotStarted, Some(error)) => format!(": {}", cut(error)),
            _ => String::new(),
        };
        lines.push(format!("step {}: {state} (attempt {}){error}", step.name, step.attempt));
    }
    let state = TaskState::from(after.state);
    if before.is_none_or(|before| TaskState::from(before.state) != state || before.failure_count != after.failure_count) {
        let failures = if after.failure_count > 0 { format!(" (failure count {})", after.failure_count) } else { String::new() };
        lines.push(format!("task {}: {state}{failures}", after.id));
    }
    lines
}

/// A text cut to fit a table cell, on one line.
fn cut(text: &str) -> String {
    let text = text.replace('\n', " ");
    if text.chars().count() <= CELL_CHARS_MAX {
        return text;
    }
    let mut cut: String = text.chars().take(CELL_CHARS_MAX - 1).collect();
    cut.push('…');
    cut
}

/// `rota status`.
pub async fn status(store: &StoreArgs, args: StatusArgs) -> anyhow::Result<()> {
    let backend = store.backend().await?;
    let task = backend.task(&args.id).await?;
    let history = backend.history(&args.id).await?;
    // A token that may read the task but not list the breakers (scope
    // `submit`) still gets the task's status.
    let breakers = match backend.breakers().await {
        Ok(breakers) => breakers,
        Err(err) if crate::remote::code_of(&err) == Some("forbidden") => Vec::new(),
        Err(err) => return Err(err),
    };
    let breakers: Vec<BreakerJson> = breakers.iter().map(BreakerJson::from).filter(|b| b.state != "closed").collect();
    let status = StatusJson::new(&task, &history, breakers);
    if args.json {
        return output::json(&status);
    }
    output::line(&status_text(&status))?;
    Ok(())
}

/// `status` for people: the task's fields, its steps, its latest events and
/// the breakers that are not closed.
fn status_text(status: &StatusJson) -> String {
    let or_dash = |value: Option<&str>| value.unwrap_or("-").to_owned();
    let failures = match status.max_failures {
        Some(max) => format!("{} of {max}", status.failure_count),
        None => status.failure_count.to_string(),
    };
    let mut fields = vec![
        ("task", status.id.to_owned()),
        // A task of a paused workflow waits for the resume: say why.
        ("workflow", format!("{}@{}{}", status.workflow, status.version, if status.workflow_paused { " (paused)" } else { "" })),
        // A paused task says so beside its state, which pausing leaves as it
        // is; so does a task its concurrency key holds back.
        ("state", {
            let mut state = status.state.to_string();
            if status.paused {
                state.push_str(", paused");
            }
            if let Some(waiting) = status.waiting_for {
                state = format!("{state}, {waiting}");
            }
            state
        }),
        ("locked_by", or_dash(status.locked_by)),
        ("complete_by", or_dash(status.complete_by.as_deref())),
        ("at_risk_since", or_dash(status.at_risk_since.as_deref())),
        ("failure_count", failures),
        ("created_at", status.created_at.clone()),
        ("updated_at", status.updated_at.clone()),
    ];
    // A task put off to a later start says when it starts.
    if status.state == TaskState::Pending && status.not_before > status.created_at {
        fields.insert(3, ("starts_at", status.not_before.clone()));
    }
    // Known only for tasks submitted over the API with a token.
    if let Some(submitter) = status.submitter {
        fields.push(("submitter", submitter.to_owned()));
    }
    if status.priority != 0 {
        fields.push(("priority", status.priority.to_string()));
    }
    if let Some(key) = status.concurrency_key {
        fields.push(("concurrency_key", key.to_owned()));
    }
    if !status.tags.is_empty() {
        let tags: Vec<String> = status.tags.iter().map(|(key, value)| format!("{key}={value}")).collect();
        fields.push(("tags", tags.join(" ")));
    }
    if let Some(parent) = status.parent {
        fields.push(("parent", format!("{} (step {}, attempt {}, depth {})", parent.task, parent.step, parent.attempt, parent.depth)));
    }
    if let Some(error) = status.error {
        fields.push(("error", error.replace('\n', " ")));
    }
    fields.push(("input", status.input.to_string()));
    if let Some(output) = status.output {
        fields.push(("output", output.to_string()));
    }
    let width = fields.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    let mut text: Vec<String> = fields.iter().map(|(name, value)| format!("{name:<width$}  {value}")).collect();

    let rows: Vec<Vec<String>> = status
        .steps
        .iter()
        .map(|step| {
            vec![
                step.name.to_owned(),
                match (step.waits_for, step.agent) {
                    (Some(signal), _) => format!("waits for {signal}"),
                    (None, None) if let Some(workflow) = step.workflow => format!("workflow {workflow}"),
                    (None, Some(agent)) if step.callback => format!("{agent}, then its callback"),
                    (None, agent) => or_dash(agent),
                },
                step.state.to_string(),
                step.attempts.to_string(),
                or_dash(step.complete_by.as_deref()),
                or_dash(step.owner),
                step.last_error.map(cut).unwrap_or_default(),
            ]
        })
        .collect();
    text.push(String::new());
    text.push(output::table(&["STEP", "AGENT", "STATE", "ATTEMPTS", "COMPLETE BY", "OWNER", "LAST ERROR"], &rows));

    if !status.children.is_empty() {
        let rows: Vec<Vec<String>> = status
            .children
            .iter()
            .map(|child| {
                vec![
                    child.id.clone(),
                    child.workflow.clone(),
                    TaskState::from(child.state).to_string(),
                    child.step.clone(),
                    child.attempt.to_string(),
                ]
            })
            .collect();
        text.push(String::new());
        text.push(output::table(&["CHILD", "WORKFLOW", "STATE", "STEP", "ATTEMPT"], &rows));
    }

    let skipped = status.history.len().saturating_sub(HISTORY_SHOWN);
    let rows: Vec<Vec<String>> = status.history[skipped..]
        .iter()
        .map(|event| {
            let detail = if event.detail.as_object().is_some_and(|o| o.is_empty()) || event.detail.is_null() {
                String::new()
            } else {
                cut(&event.detail.to_string())
            };
            vec![
                event.at.clone(),
                event.kind.to_owned(),
                event.step.unwrap_or("").to_owned(),
                event.attempt.map(|a| a.to_string()).unwrap_or_default(),
                detail,
            ]
        })
        .collect();
    text.push(String::new());
    if skipped > 0 {
        text.push(format!("({skipped} earlier events not shown; --json shows them all)"));
    }
    text.push(output::table(&["TIME", "EVENT", "STEP", "ATTEMPT", "DETAIL"], &rows));

    if !status.breakers.is_empty() {
        let rows: Vec<Vec<String>> = status
            .breakers
            .iter()
            .map(|breaker| {
                vec![
                    breaker.endpoint.clone(),
                    if breaker.shared { "(shared)".to_owned() } else { breaker.agent.clone().unwrap_or_default() },
                    breaker.state.clone(),
                    breaker.consecutive_failures.map_or_else(|| "-".to_owned(), |failures| failures.to_string()),
                    breaker.open_until.clone().unwrap_or_else(|| "-".to_owned()),
                    breaker.probe_holder.clone().unwrap_or_else(|| "-".to_owned()),
                    breaker.instance.clone().unwrap_or_default(),
                    breaker.reported_at.clone(),
                ]
            })
            .collect();
        text.push(String::new());
        text.push("circuit breakers not closed:".to_owned());
        text.push(output::table(&["ENDPOINT", "AGENT", "STATE", "FAILURES", "OPEN UNTIL", "PROBE", "INSTANCE", "REPORTED"], &rows));
    }
    text.join("\n")
}

/// `rota tasks`.
pub async fn list(store: &StoreArgs, args: ListArgs) -> anyhow::Result<()> {
    let backend = store.backend().await?;
    let filter = args.filters.filter(args.limit)?;
    if args.count {
        let counts = backend.task_counts(&filter).await?;
        if args.json {
            return output::json(&counts);
        }
        let mut rows: Vec<Vec<String>> =
            TaskState::ALL.iter().map(|state| vec![state.to_string(), counts.of(*state).to_string()]).collect();
        rows.push(vec!["total".to_owned(), counts.total.to_string()]);
        output::line(&output::table(&["STATE", "TASKS"], &rows))?;
        return Ok(());
    }
    let tasks = backend.tasks(filter).await?;
    if args.json {
        let json: Vec<TaskSummaryJson> = tasks.iter().map(TaskSummaryJson::from).collect();
        return output::json(&json);
    }
    if tasks.is_empty() {
        eprintln!("no tasks");
        return Ok(());
    }
    let full_page = tasks.len() == args.limit as usize;
    let now = SystemClock.now().as_millis();
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|task| {
            let state = TaskState::from(task.state);
            // A Pending task that may not start yet says until when.
            let state = if task.paused {
                format!("{state}, paused")
            } else if state == TaskState::Pending && task.not_before > now {
                format!("{state} until {}", rfc3339_millis(task.not_before))
            } else if let Some(since) = task.at_risk_since {
                // A deadline warning was raised during its current lease.
                format!("{state}, at risk since {}", rfc3339_millis(since))
            } else {
                state.to_string()
            };
            vec![
                task.id.clone(),
                format!("{}@{}", task.workflow, task.version),
                state,
                task.failure_count.to_string(),
                task.locked_by.clone().unwrap_or_else(|| "-".to_owned()),
                rfc3339_millis(task.updated_at),
                task.error.as_deref().map(cut).unwrap_or_default(),
            ]
        })
        .collect();
    output::line(&output::table(&["ID", "WORKFLOW", "STATE", "FAILURES", "LOCKED BY", "UPDATED", "ERROR"], &rows))?;
    if full_page && let Some(last) = tasks.last() {
        eprintln!("more may follow: add --after {}", shell_word(&last.id));
    }
    Ok(())
}

/// `text` as one shell word: as is when it is plain, else single-quoted.
fn shell_word(text: &str) -> String {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:/@%+=,".contains(&b)) {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// `rota alerts`.
pub async fn alerts(store: &StoreArgs, args: AlertsArgs) -> anyhow::Result<()> {
    let alerts = store.backend().await?.alerts(args.limit).await?;
    if args.json {
        let json: Vec<AlertJson> = alerts.iter().map(AlertJson::from).collect();
        return output::json(&json);
    }
    if alerts.is_empty() {
        eprintln!("no alerts");
        return Ok(());
    }
    let rows: Vec<Vec<String>> =
        alerts.iter().map(|alert| vec![alert.task_id.clone(), rfc3339_millis(alert.at), alert.reason.replace('\n', " ")]).collect();
    output::line(&output::table(&["TASK", "TIME", "REASON"], &rows))?;
    Ok(())
}

/// `rota resubmit`: prints the task's state afterwards. With `--input`
/// (which needs `--step`), the task's input is replaced first.
pub async fn resubmit(store: &StoreArgs, args: ResubmitArgs) -> anyhow::Result<()> {
    let Some(id) = single(args.id, &args.bulk, "resubmit")? else {
        if args.step.is_some() {
            bail!("--step applies to one task: give its id");
        }
        return crate::batches::bulk(store, BatchAction::Resubmit, args.bulk, args.reason.as_deref()).await;
    };
    let backend = store.backend().await?;
    let task = match (args.input, args.step) {
        (Some(input), Some(step)) => backend.resubmit_with_input(&id, &step, parse_input(&input)?, args.reason.as_deref()).await?,
        (_, step) => backend.resubmit(&id, step.as_ref(), args.reason.as_deref()).await?,
    };
    output::line(TaskState::from(task.state).as_str())?;
    Ok(())
}

/// The one task a command names, or `None` for a bulk action by filters;
/// both at once is refused.
fn single(id: Option<TaskId>, bulk: &BulkArgs, command: &str) -> anyhow::Result<Option<TaskId>> {
    match id {
        Some(_) if bulk.filters.any_given() || bulk.dry_run => {
            bail!("{command}: give a task id or filters, not both")
        }
        id => Ok(id),
    }
}

/// `rota cancel`: prints the state the task moved to; with filters, runs
/// the batch and prints what it did.
pub async fn cancel(store: &StoreArgs, args: CancelArgs) -> anyhow::Result<()> {
    let Some(id) = single(args.id, &args.bulk, "cancel")? else {
        return crate::batches::bulk(store, BatchAction::Cancel, args.bulk, args.reason.as_deref()).await;
    };
    let state = store.backend().await?.cancel(&id, args.reason.as_deref()).await?;
    output::line(state.as_str())?;
    Ok(())
}

/// `rota pause`: prints `paused` and the task's state. The task starts no
/// new step until `rota resume`; steps in flight finish.
pub async fn pause(store: &StoreArgs, args: PauseArgs) -> anyhow::Result<()> {
    let task = store.backend().await?.pause_task(&args.id, args.reason.as_deref()).await?;
    output::line(&format!("paused ({})", TaskState::from(task.state)))?;
    Ok(())
}

/// `rota resume`: prints `resumed` and the task's state.
pub async fn resume(store: &StoreArgs, args: PauseArgs) -> anyhow::Result<()> {
    let task = store.backend().await?.resume_task(&args.id, args.reason.as_deref()).await?;
    output::line(&format!("resumed ({})", TaskState::from(task.state)))?;
    Ok(())
}

/// `rota workflows`: the latest version of each registered workflow;
/// `rota workflows pause|resume NAME` prints `paused` or `resumed`.
pub async fn workflows(store: &StoreArgs, args: WorkflowsArgs) -> anyhow::Result<()> {
    if let Some(action) = args.action {
        let (args, pause) = match action {
            WorkflowsAction::Pause(args) => (args, true),
            WorkflowsAction::Resume(args) => (args, false),
        };
        store.backend().await?.pause_workflow(&args.name, args.reason.as_deref(), pause).await?;
        output::line(if pause { "paused" } else { "resumed" })?;
        return Ok(());
    }
    let workflows = store.backend().await?.workflows().await?;
    if args.json {
        let json: Vec<WorkflowJson> = workflows.iter().map(WorkflowJson::from).collect();
        return output::json(&json);
    }
    if workflows.is_empty() {
        eprintln!("no workflows registered (`rota serve --workflows DIR` registers a directory of definitions)");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = workflows
        .iter()
        .map(|workflow| {
            let steps: Vec<String> = workflow
                .steps
                .iter()
                .map(|step| match (&step.agent, &step.waits_for) {
                    (_, Some(signal)) => format!("{} (waits for {signal})", step.name),
                    (agent, None) => format!("{} ({})", step.name, agent.as_deref().unwrap_or("?")),
                })
                .collect();
            vec![
                workflow.name.clone(),
                workflow.version.to_string(),
                workflow.registered_at.map(rfc3339_millis).unwrap_or_default(),
                match workflow.pause.as_ref().filter(|pause| pause.paused) {
                    Some(pause) => format!("paused by {}", pause.by),
                    None => "-".to_owned(),
                },
                steps.join(", "),
            ]
        })
        .collect();
    output::line(&output::table(&["NAME", "VERSION", "REGISTERED", "PAUSED", "STEPS"], &rows))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rota_model::{Step, Task, Timestamp};
    use serde_json::json;

    fn record(task_state: TaskState, steps: &[(&str, StepState, u32)]) -> TaskView {
        let id = TaskId::new("t-1").unwrap();
        let mut task = Task::new(id.clone(), WorkflowName::new("w").unwrap(), 1, json!({}), Timestamp::from_millis(0));
        task.state = task_state;
        let steps: Vec<Step> = steps
            .iter()
            .enumerate()
            .map(|(i, (name, state, attempt))| {
                let mut step = Step::new(id.clone(), StepName::new(*name).unwrap(), i as u32, Timestamp::from_millis(0));
                step.state = *state;
                step.attempt = *attempt;
                step
            })
            .collect();
        TaskView::new(&task, &steps, None)
    }

    #[test]
    fn moves_name_each_change_once() {
        let first = record(TaskState::Pending, &[("a", StepState::NotStarted, 0), ("b", StepState::NotStarted, 0)]);
        assert_eq!(moves(None, &first), ["task t-1: pending"]);
        let second = record(TaskState::Processing, &[("a", StepState::Running, 1), ("b", StepState::NotStarted, 0)]);
        assert_eq!(moves(Some(&first), &second), ["step a: running (attempt 1)", "task t-1: processing"]);
        assert!(moves(Some(&second), &second).is_empty());
        let mut third = record(TaskState::Error, &[("a", StepState::Failed, 1), ("b", StepState::NotStarted, 0)]);
        third.steps[0].last_error = Some("exit code 1\nboom".into());
        assert_eq!(moves(Some(&second), &third), ["step a: failed (attempt 1): exit code 1 boom", "task t-1: error"]);
        let mut fourth = record(TaskState::Processing, &[("a", StepState::Completed, 1), ("b", StepState::Skipped, 0)]);
        fourth.steps[1].when = Some("steps.a.output.ok".into());
        assert_eq!(
            moves(Some(&second), &fourth),
            ["step a: completed (attempt 1)", "step b: skipped (its `when` was false: steps.a.output.ok)"]
        );
    }

    #[test]
    fn input_errors_name_the_position() {
        let err = parse_input("{\"a\": }").unwrap_err().to_string();
        assert!(err.starts_with("--input is not valid JSON: ") && err.ends_with("at line 1 column 7"), "{err}");
        assert_eq!(parse_input("[1, 2]").unwrap(), json!([1, 2]));
    }
}
