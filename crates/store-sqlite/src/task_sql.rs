//! State-store operations as SQL: tasks, steps, history, leader leases.
//! Like the queue operations, they take `now` from the caller.

use std::time::Duration;

use rota_model::{
    ConcurrencyKey, InstanceId, ParentLink, Priority, QueueName, Step, StepName, StepState, Tags, Task, TaskId, TaskState, Timestamp,
    WorkflowName,
};
use rota_store::breaker::{self, BreakerAdmission, BreakerAsk, BreakerReport, BreakerResult, SharedBreaker, SharedBreakerState};
use rota_store::{
    Changes, Claim, ComponentStatus, Error, Event, EventKind, Expired, LeaderLease, RateRequest, RateSlot, Result, StepWrite, TaskFilter,
    TaskRecord, TaskWrite, TimeRange, Warning, WorkflowEntry, WorkflowPause, chain, prefix_upper_bound,
};
use rusqlite::types::Value as Sql;
use rusqlite::{Connection, OptionalExtension, Row, params, params_from_iter};
use serde_json::Value;

use crate::sql_error;

const TASK_COLUMNS: &str = "id, workflow, workflow_version, input, state, locked_by, lease_epoch, complete_by, not_before, \
                            failure_count, reply_to, output, error, created_at, updated_at, warn_at, at_risk_since, reply_queue, \
                            submitter, paused, tags, priority, concurrency_key, concurrency_limit, parent_id, parent_step, parent_attempt, depth";
const STEP_COLUMNS: &str =
    "task_id, name, position, state, attempt, complete_by, not_before, input, output, last_error, updated_at, warn_at, callback_digest";

fn json_text(value: &Value) -> String {
    value.to_string()
}

pub(crate) fn parse_json(column: &str, text: String) -> Result<Value> {
    serde_json::from_str(&text).map_err(|e| Error::Backend(format!("stored {column} is not JSON: {e}")))
}

fn corrupt(what: &str, err: impl std::fmt::Display) -> Error {
    Error::Backend(format!("stored {what} is invalid: {err}"))
}

/// A task row as read, before its text columns are checked.
struct TaskRow {
    id: String,
    workflow: String,
    workflow_version: u32,
    input: String,
    state: String,
    locked_by: Option<String>,
    lease_epoch: i64,
    complete_by: Option<i64>,
    not_before: i64,
    failure_count: u32,
    reply_to: Option<String>,
    output: Option<String>,
    error: Option<String>,
    created_at: i64,
    updated_at: i64,
    warn_at: Option<i64>,
    at_risk_since: Option<i64>,
    reply_queue: Option<String>,
    submitter: Option<String>,
    paused: bool,
    tags: Option<String>,
    priority: i64,
    concurrency_key: Option<String>,
    concurrency_limit: Option<u32>,
    parent_id: Option<String>,
    parent_step: Option<String>,
    parent_attempt: Option<u32>,
    depth: u32,
}

fn task_row(row: &Row<'_>) -> rusqlite::Result<TaskRow> {
    Ok(TaskRow {
        id: row.get(0)?,
        workflow: row.get(1)?,
        workflow_version: row.get(2)?,
        input: row.get(3)?,
        state: row.get(4)?,
        locked_by: row.get(5)?,
        lease_epoch: row.get(6)?,
        complete_by: row.get(7)?,
        not_before: row.get(8)?,
        failure_count: row.get(9)?,
        reply_to: row.get(10)?,
        output: row.get(11)?,
        error: row.get(12)?,
        created_at: row.get(13)?,
        updated_at: row.get(14)?,
        warn_at: row.get(15)?,
        at_risk_since: row.get(16)?,
        reply_queue: row.get(17)?,
        submitter: row.get(18)?,
        paused: row.get(19)?,
        tags: row.get(20)?,
        priority: row.get(21)?,
        concurrency_key: row.get(22)?,
        concurrency_limit: row.get(23)?,
        parent_id: row.get(24)?,
        parent_step: row.get(25)?,
        parent_attempt: row.get(26)?,
        depth: row.get(27)?,
    })
}

impl TaskRow {
    fn into_task(self) -> Result<Task> {
        Ok(Task {
            id: TaskId::new(self.id).map_err(|e| corrupt("task id", e))?,
            workflow: WorkflowName::new(self.workflow).map_err(|e| corrupt("workflow name", e))?,
            workflow_version: self.workflow_version,
            input: parse_json("task input", self.input)?,
            state: self.state.parse::<TaskState>().map_err(|e| corrupt("task state", e))?,
            locked_by: self.locked_by.map(InstanceId::new).transpose().map_err(|e| corrupt("locked_by", e))?,
            lease_epoch: self.lease_epoch as u64,
            complete_by: self.complete_by.map(Timestamp::from_millis),
            warn_at: self.warn_at.map(Timestamp::from_millis),
            at_risk_since: self.at_risk_since.map(Timestamp::from_millis),
            not_before: Timestamp::from_millis(self.not_before),
            failure_count: self.failure_count,
            reply_to: self.reply_to,
            reply_queue: self.reply_queue.map(QueueName::new).transpose().map_err(|e| corrupt("reply_queue", e))?,
            submitter: self.submitter,
            paused: self.paused,
            tags: self.tags.as_deref().map(Tags::from_json).transpose().map_err(|e| corrupt("tags", e))?.unwrap_or_default(),
            priority: Priority::new(self.priority).map_err(|e| corrupt("priority", e))?,
            concurrency: match (self.concurrency_key, self.concurrency_limit) {
                (Some(key), Some(limit)) => Some(ConcurrencyKey { key, limit }),
                _ => None,
            },
            parent: parent_link(self.parent_id, self.parent_step, self.parent_attempt, self.depth)?,
            output: self.output.map(|o| parse_json("task output", o)).transpose()?,
            error: self.error,
            created_at: Timestamp::from_millis(self.created_at),
            updated_at: Timestamp::from_millis(self.updated_at),
        })
    }
}

/// A task's parent link from its columns: all set, or none (a top-level task).
fn parent_link(id: Option<String>, step: Option<String>, attempt: Option<u32>, depth: u32) -> Result<Option<ParentLink>> {
    match (id, step, attempt) {
        (None, None, None) => Ok(None),
        (Some(id), Some(step), Some(attempt)) => Ok(Some(ParentLink {
            task: TaskId::new(id).map_err(|e| corrupt("parent_id", e))?,
            step: StepName::new(step).map_err(|e| corrupt("parent_step", e))?,
            attempt,
            depth,
        })),
        _ => Err(corrupt("parent link", "parent_id, parent_step and parent_attempt must be all set or all NULL")),
    }
}

struct StepRow {
    task_id: String,
    name: String,
    position: u32,
    state: String,
    attempt: u32,
    complete_by: Option<i64>,
    not_before: i64,
    input: Option<String>,
    output: Option<String>,
    last_error: Option<String>,
    updated_at: i64,
    warn_at: Option<i64>,
    callback_digest: Option<String>,
}

fn step_row(row: &Row<'_>) -> rusqlite::Result<StepRow> {
    Ok(StepRow {
        task_id: row.get(0)?,
        name: row.get(1)?,
        position: row.get(2)?,
        state: row.get(3)?,
        attempt: row.get(4)?,
        complete_by: row.get(5)?,
        not_before: row.get(6)?,
        input: row.get(7)?,
        output: row.get(8)?,
        last_error: row.get(9)?,
        updated_at: row.get(10)?,
        warn_at: row.get(11)?,
        callback_digest: row.get(12)?,
    })
}

impl StepRow {
    fn into_step(self) -> Result<Step> {
        Ok(Step {
            task_id: TaskId::new(self.task_id).map_err(|e| corrupt("task id", e))?,
            name: StepName::new(self.name).map_err(|e| corrupt("step name", e))?,
            position: self.position,
            state: self.state.parse::<StepState>().map_err(|e| corrupt("step state", e))?,
            attempt: self.attempt,
            complete_by: self.complete_by.map(Timestamp::from_millis),
            warn_at: self.warn_at.map(Timestamp::from_millis),
            not_before: Timestamp::from_millis(self.not_before),
            callback_digest: self.callback_digest,
            input: self.input.map(|i| parse_json("step input", i)).transpose()?,
            output: self.output.map(|o| parse_json("step output", o)).transpose()?,
            last_error: self.last_error,
            updated_at: Timestamp::from_millis(self.updated_at),
        })
    }
}

/// Binds a task's columns, in `TASK_COLUMNS` order, to parameters ?1..?16
/// and ?20 (`paused`): all but `at_risk_since`, which only
/// [`raise_warning`] writes, and `reply_queue`, `submitter`, `tags`,
/// `priority` and the concurrency key, which only the insert writes (they
/// never change).
fn bind_task(stmt: &mut rusqlite::Statement<'_>, task: &Task) -> rusqlite::Result<()> {
    stmt.raw_bind_parameter(1, task.id.as_str())?;
    stmt.raw_bind_parameter(2, task.workflow.as_str())?;
    stmt.raw_bind_parameter(3, task.workflow_version)?;
    stmt.raw_bind_parameter(4, json_text(&task.input))?;
    stmt.raw_bind_parameter(5, task.state.as_str())?;
    stmt.raw_bind_parameter(6, task.locked_by.as_ref().map(InstanceId::as_str))?;
    stmt.raw_bind_parameter(7, task.lease_epoch as i64)?;
    stmt.raw_bind_parameter(8, task.complete_by.map(Timestamp::as_millis))?;
    stmt.raw_bind_parameter(9, task.not_before.as_millis())?;
    stmt.raw_bind_parameter(10, task.failure_count)?;
    stmt.raw_bind_parameter(11, task.reply_to.as_deref())?;
    stmt.raw_bind_parameter(12, task.output.as_ref().map(json_text))?;
    stmt.raw_bind_parameter(13, task.error.as_deref())?;
    stmt.raw_bind_parameter(14, task.created_at.as_millis())?;
    stmt.raw_bind_parameter(15, task.updated_at.as_millis())?;
    stmt.raw_bind_parameter(16, task.warn_at.map(Timestamp::as_millis))?;
    stmt.raw_bind_parameter(20, task.paused)
}

/// Binds a step's columns, in `STEP_COLUMNS` order, to parameters ?1..?13.
fn bind_step(stmt: &mut rusqlite::Statement<'_>, step: &Step) -> rusqlite::Result<()> {
    stmt.raw_bind_parameter(1, step.task_id.as_str())?;
    stmt.raw_bind_parameter(2, step.name.as_str())?;
    stmt.raw_bind_parameter(3, step.position)?;
    stmt.raw_bind_parameter(4, step.state.as_str())?;
    stmt.raw_bind_parameter(5, step.attempt)?;
    stmt.raw_bind_parameter(6, step.complete_by.map(Timestamp::as_millis))?;
    stmt.raw_bind_parameter(7, step.not_before.as_millis())?;
    stmt.raw_bind_parameter(8, step.input.as_ref().map(json_text))?;
    stmt.raw_bind_parameter(9, step.output.as_ref().map(json_text))?;
    stmt.raw_bind_parameter(10, step.last_error.as_deref())?;
    stmt.raw_bind_parameter(11, step.updated_at.as_millis())?;
    stmt.raw_bind_parameter(12, step.warn_at.map(Timestamp::as_millis))?;
    stmt.raw_bind_parameter(13, step.callback_digest.as_deref())
}

pub(crate) fn insert_task(conn: &Connection, task: &Task) -> Result<()> {
    conn.prepare_cached(&format!(
        "INSERT INTO tasks ({TASK_COLUMNS}, held)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, NULL, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28,
                 EXISTS (SELECT 1 FROM workflow_pauses WHERE name = ?2 AND paused = 1))"
    ))
    .and_then(|mut stmt| {
        bind_task(&mut stmt, task)?;
        stmt.raw_bind_parameter(18, task.reply_queue.as_ref().map(QueueName::as_str))?;
        stmt.raw_bind_parameter(19, task.submitter.as_deref())?;
        stmt.raw_bind_parameter(21, (!task.tags.is_empty()).then(|| task.tags.to_json()))?;
        stmt.raw_bind_parameter(22, task.priority.get())?;
        stmt.raw_bind_parameter(23, task.concurrency.as_ref().map(|c| c.key.as_str()))?;
        stmt.raw_bind_parameter(24, task.concurrency.as_ref().map(|c| c.limit))?;
        stmt.raw_bind_parameter(25, task.parent.as_ref().map(|p| p.task.as_str()))?;
        stmt.raw_bind_parameter(26, task.parent.as_ref().map(|p| p.step.as_str()))?;
        stmt.raw_bind_parameter(27, task.parent.as_ref().map(|p| p.attempt))?;
        stmt.raw_bind_parameter(28, task.parent.as_ref().map_or(0, |p| p.depth))?;
        stmt.raw_execute()
    })
    .map_err(sql_error)?;
    for (key, value) in task.tags.iter() {
        conn.prepare_cached("INSERT INTO task_tags (key, value, task_id) VALUES (?1, ?2, ?3)")
            .and_then(|mut stmt| stmt.execute([key, value, task.id.as_str()]))
            .map_err(sql_error)?;
    }
    Ok(())
}

pub(crate) fn insert_step(conn: &Connection, step: &Step) -> Result<()> {
    conn.prepare_cached(&format!("INSERT INTO steps ({STEP_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"))
        .and_then(|mut stmt| {
            bind_step(&mut stmt, step)?;
            stmt.raw_execute()
        })
        .map_err(sql_error)?;
    Ok(())
}

/// Appends `event`, chained to its task's newest row (`rota_store::chain`):
/// one lookup on the `events_task` index, inside the writer's transaction,
/// so no other append of the task can come between.
pub(crate) fn insert_event(conn: &Connection, event: &Event) -> Result<()> {
    let previous: Option<Vec<u8>> = conn
        .prepare_cached("SELECT hash FROM events WHERE task_id = ?1 ORDER BY seq DESC LIMIT 1")
        .and_then(|mut stmt| stmt.query_row([event.task_id.as_str()], |row| row.get(0)).optional())
        .map_err(sql_error)?
        .flatten();
    let hash = chain::link(previous.as_deref(), event);
    conn.prepare_cached("INSERT INTO events (task_id, at, kind, step, attempt, detail, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")
        .and_then(|mut stmt| {
            stmt.execute(params![
                event.task_id.as_str(),
                event.at.as_millis(),
                event.kind.as_str(),
                event.step.as_ref().map(StepName::as_str),
                event.attempt,
                json_text(&event.detail),
                &hash[..],
            ])
        })
        .map_err(sql_error)?;
    Ok(())
}

/// The task columns a fenced write sets, in the order of [`task_values`].
const TASK_WRITE_COLUMNS: [&str; 16] = [
    "workflow",
    "workflow_version",
    "input",
    "state",
    "locked_by",
    "lease_epoch",
    "complete_by",
    "not_before",
    "failure_count",
    "reply_to",
    "output",
    "error",
    "created_at",
    "updated_at",
    "warn_at",
    "paused",
];

/// A task's values for [`TASK_WRITE_COLUMNS`].
fn task_values(task: &Task) -> [Sql; 16] {
    let text = |value: Option<&str>| value.map_or(Sql::Null, |v| Sql::Text(v.to_owned()));
    let millis = |at: Option<Timestamp>| at.map_or(Sql::Null, |at| Sql::Integer(at.as_millis()));
    [
        Sql::Text(task.workflow.as_str().to_owned()),
        Sql::Integer(i64::from(task.workflow_version)),
        Sql::Text(json_text(&task.input)),
        Sql::Text(task.state.as_str().to_owned()),
        text(task.locked_by.as_ref().map(InstanceId::as_str)),
        Sql::Integer(task.lease_epoch as i64),
        millis(task.complete_by),
        Sql::Integer(task.not_before.as_millis()),
        Sql::Integer(i64::from(task.failure_count)),
        text(task.reply_to.as_deref()),
        task.output.as_ref().map_or(Sql::Null, |output| Sql::Text(json_text(output))),
        text(task.error.as_deref()),
        Sql::Integer(task.created_at.as_millis()),
        Sql::Integer(task.updated_at.as_millis()),
        millis(task.warn_at),
        Sql::Integer(i64::from(task.paused)),
    ]
}

/// Compares the stored task (?1) with the values of a write (?2..?17):
/// its state and epoch, whether each column already holds its new value,
/// and whether the holder's warning and at-risk marks are set.
static TASK_UNCHANGED_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let same: Vec<String> = TASK_WRITE_COLUMNS.iter().enumerate().map(|(i, column)| format!("{column} IS ?{}", i + 2)).collect();
    format!("SELECT state, lease_epoch, {}, warned_at IS NOT NULL, at_risk_since IS NOT NULL FROM tasks WHERE id = ?1", same.join(", "))
});

/// A fenced task update: only if the stored task still has the state and
/// epoch the writer read. It sets only the columns whose value changes:
/// SQLite rewrites the entry of every index over a column an UPDATE sets,
/// changed or not, and each index page so written is one more page in the
/// WAL; a write within a lease changes no indexed column at all. Giving the
/// task up (no holder) clears the holder's warning and at-risk marks.
/// Zero rows matched is a `Conflict` (or `NotFound`).
pub(crate) fn write_task(conn: &Connection, write: &TaskWrite) -> Result<()> {
    let task = &write.task;
    let values = task_values(task);
    let stored = conn
        .prepare_cached(&TASK_UNCHANGED_SQL)
        .and_then(|mut stmt| {
            let params = std::iter::once(Sql::Text(task.id.as_str().to_owned())).chain(values.iter().cloned());
            stmt.query_row(params_from_iter(params), |row| {
                let mut unchanged = [false; 16];
                for (i, same) in unchanged.iter_mut().enumerate() {
                    *same = row.get(i + 2)?;
                }
                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?, unchanged, row.get::<_, bool>(18)?, row.get::<_, bool>(19)?))
            })
            .optional()
        })
        .map_err(sql_error)?;
    let Some((state, epoch, unchanged, warned, at_risk)) = stored else {
        return Err(Error::NotFound(format!("task {}", task.id)));
    };
    if state != write.expected_state.as_str() || epoch != write.expected_epoch as i64 {
        return Err(Error::Conflict(format!(
            "task {} is no longer {} at lease epoch {} (changed by another writer)",
            task.id, write.expected_state, write.expected_epoch
        )));
    }
    let mut sets: Vec<String> = Vec::new();
    let mut params: Vec<Sql> = Vec::new();
    for ((column, value), same) in TASK_WRITE_COLUMNS.iter().zip(values).zip(unchanged) {
        if !same {
            params.push(value);
            sets.push(format!("{column} = ?{}", params.len()));
        }
    }
    if task.locked_by.is_none() {
        if warned {
            sets.push("warned_at = NULL".into());
        }
        if at_risk {
            sets.push("at_risk_since = NULL".into());
        }
    }
    if sets.is_empty() {
        return Ok(());
    }
    let n = params.len();
    let sql = format!("UPDATE tasks SET {} WHERE id = ?{} AND state = ?{} AND lease_epoch = ?{}", sets.join(", "), n + 1, n + 2, n + 3);
    params.extend([
        Sql::Text(task.id.as_str().to_owned()),
        Sql::Text(write.expected_state.as_str().to_owned()),
        Sql::Integer(write.expected_epoch as i64),
    ]);
    let updated = conn.prepare_cached(&sql).and_then(|mut stmt| stmt.execute(params_from_iter(params))).map_err(sql_error)?;
    // The comparison above ran in this transaction, which holds the write
    // lock: the fence can only hold here too.
    if updated != 1 {
        return Err(Error::Backend(format!("task {}: the fenced write matched {updated} rows after its check", task.id)));
    }
    Ok(())
}

/// A fenced step update. Zero rows matched is a `Conflict` (or `NotFound`).
pub(crate) fn write_step(conn: &Connection, write: &StepWrite) -> Result<()> {
    let step = &write.step;
    let updated = conn
        .prepare_cached(
            "UPDATE steps SET position = ?3, state = ?4, attempt = ?5, complete_by = ?6, not_before = ?7, input = ?8,
                              output = ?9, last_error = ?10, updated_at = ?11, warn_at = ?12, callback_digest = ?13
              WHERE task_id = ?1 AND name = ?2 AND state = ?14 AND attempt = ?15",
        )
        .and_then(|mut stmt| {
            bind_step(&mut stmt, step)?;
            stmt.raw_bind_parameter(14, write.expected_state.as_str())?;
            stmt.raw_bind_parameter(15, write.expected_attempt)?;
            stmt.raw_execute()
        })
        .map_err(sql_error)?;
    if updated == 1 {
        return Ok(());
    }
    let exists: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM steps WHERE task_id = ?1 AND name = ?2)")
        .and_then(|mut stmt| stmt.query_row(params![step.task_id.as_str(), step.name.as_str()], |row| row.get(0)))
        .map_err(sql_error)?;
    if !exists {
        return Err(Error::NotFound(format!("step {} of task {}", step.name, step.task_id)));
    }
    Err(Error::Conflict(format!(
        "step {} of task {} is no longer {} at attempt {} (changed by another writer)",
        step.name, step.task_id, write.expected_state, write.expected_attempt
    )))
}

/// Creates a step a commit adds (an instance of a `for_each` step); one
/// that exists already is a `Conflict`.
fn create_step(conn: &Connection, step: &Step) -> Result<()> {
    let inserted = conn
        .prepare_cached(&format!(
            "INSERT INTO steps ({STEP_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) ON CONFLICT DO NOTHING"
        ))
        .and_then(|mut stmt| {
            bind_step(&mut stmt, step)?;
            stmt.raw_execute()
        })
        .map_err(sql_error)?;
    if inserted == 1 {
        return Ok(());
    }
    Err(Error::Conflict(format!("step {} of task {} exists already (created by another writer)", step.name, step.task_id)))
}

/// Applies fenced writes and events. Sends and completes are done by the
/// caller, which owns the queue functions; all of it runs in one savepoint.
pub(crate) fn apply_writes(conn: &Connection, changes: &Changes) -> Result<()> {
    for write in &changes.tasks {
        write_task(conn, write)?;
    }
    for write in &changes.steps {
        write_step(conn, write)?;
    }
    for step in &changes.new_steps {
        create_step(conn, step)?;
    }
    for event in &changes.events {
        insert_event(conn, event)?;
    }
    Ok(())
}

pub(crate) fn get_task(conn: &Connection, id: &TaskId) -> Result<Option<TaskRecord>> {
    let row = conn
        .prepare_cached(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1"))
        .and_then(|mut stmt| stmt.query_row([id.as_str()], task_row).optional())
        .map_err(sql_error)?;
    let Some(row) = row else { return Ok(None) };
    let task = row.into_task()?;
    Ok(Some(TaskRecord { task, steps: steps_of(conn, id)? }))
}

/// The steps of task `id`, in workflow order.
pub(crate) fn steps_of(conn: &Connection, id: &TaskId) -> Result<Vec<Step>> {
    let steps = conn
        .prepare_cached(&format!("SELECT {STEP_COLUMNS} FROM steps WHERE task_id = ?1 ORDER BY position, name"))
        .and_then(|mut stmt| stmt.query_map([id.as_str()], step_row)?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    steps.into_iter().map(StepRow::into_step).collect()
}

/// The default of `Config::sparse_matches_max`: below this many matches of
/// a sparse condition (a tag, an id prefix, a creation or end time range),
/// a listing reads that condition's own index and sorts what it finds; at
/// or above it, the matches are dense enough that walking the tasks newest
/// first and testing each finds a page sooner. About sqrt(page × tasks)
/// for pages of 100 on ten million tasks.
pub(crate) const SPARSE_MATCHES_MAX: u32 = 20_000;

/// The states of a finished task, as the partial index `tasks_finished`
/// names them (word for word, which is how SQLite knows it applies).
const FINISHED: &str = "t.state IN ('processed', 'error', 'compensated', 'cancelled')";

/// The condition whose index a listing reads first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// Whatever index serves the equality conditions (state, workflow,
    /// owner, submitter: each ends with the rowid), or the rowid itself,
    /// walked newest first with no sort.
    Newest,
    /// The n-th tag's entries in `task_tags`.
    Tag(usize),
    /// `tasks_finished`, by end time.
    Ended,
    /// `tasks_created`, by creation time.
    Created,
    /// The id's own index, by prefix.
    IdPrefix,
}

/// A statement's conditions and the values they bind, in order.
struct Selection {
    from: &'static str,
    conditions: Vec<String>,
    values: Vec<Sql>,
}

impl Selection {
    fn push(&mut self, condition: &str, values: impl IntoIterator<Item = Sql>) {
        let mut condition = condition.to_owned();
        for value in values {
            self.values.push(value);
            condition = condition.replacen("?_", &format!("?{}", self.values.len()), 1);
        }
        self.conditions.push(condition);
    }

    fn where_clause(&self) -> String {
        if self.conditions.is_empty() { String::new() } else { format!("WHERE {}", self.conditions.join(" AND ")) }
    }
}

fn text(value: &str) -> Sql {
    Sql::Text(value.to_owned())
}

/// `filter`'s conditions, with `driver`'s served by its index and the
/// other sparse ones kept off theirs (a unary `+` stops SQLite from
/// choosing an index for a term).
fn selection(filter: &TaskFilter, driver: Driver) -> Selection {
    // Tasks at risk are few: their partial index is read whole and sorted,
    // whatever else the filter names, rather than walking a larger index.
    // One submitter's tasks are walked on their own index: with a state or
    // workflow too, SQLite might otherwise pick an index of every task.
    let from = match (driver, filter.at_risk, filter.submitter.is_some()) {
        (_, true, _) => "tasks AS t INDEXED BY tasks_at_risk",
        // A task's children are few: walked on their own index.
        (Driver::Newest, false, false) if filter.parent.is_some() => "tasks AS t INDEXED BY tasks_parent",
        (Driver::Ended, false, _) => "tasks AS t INDEXED BY tasks_finished",
        (Driver::Created, false, _) => "tasks AS t INDEXED BY tasks_created",
        (Driver::Newest, false, true) => "tasks AS t INDEXED BY tasks_submitter",
        _ => "tasks AS t",
    };
    let mut s = Selection { from, conditions: Vec::new(), values: Vec::new() };
    if let Some(state) = filter.state {
        s.push("t.state = ?_", [text(state.as_str())]);
    }
    if let Some(workflow) = &filter.workflow {
        s.push("t.workflow = ?_", [text(workflow.as_str())]);
    }
    if let Some(owner) = &filter.locked_by {
        s.push("t.locked_by = ?_", [text(owner.as_str())]);
    }
    if let Some(submitter) = &filter.submitter {
        s.push("t.submitter = ?_", [text(submitter)]);
    }
    if let Some(parent) = &filter.parent {
        s.push("t.parent_id = ?_", [text(parent.as_str())]);
    }
    if filter.at_risk {
        s.push("t.at_risk_since IS NOT NULL AND t.locked_by IS NOT NULL", []);
    }
    for (index, (key, value)) in filter.tags.iter().enumerate() {
        let condition = if driver == Driver::Tag(index) {
            "t.id IN (SELECT g.task_id FROM task_tags AS g WHERE g.key = ?_ AND g.value = ?_)"
        } else {
            "EXISTS (SELECT 1 FROM task_tags AS g WHERE g.key = ?_ AND g.value = ?_ AND g.task_id = t.id)"
        };
        s.push(condition, [text(key), text(value)]);
    }
    let plus = |served: bool| if served { "" } else { "+" };
    let range = |s: &mut Selection, column: &str, served: bool, range: &TimeRange| {
        if let Some(from) = range.from {
            s.push(&format!("{}{column} >= ?_", plus(served)), [Sql::Integer(from.as_millis())]);
        }
        if let Some(until) = range.until {
            s.push(&format!("{}{column} < ?_", plus(served)), [Sql::Integer(until.as_millis())]);
        }
    };
    range(&mut s, "t.created_at", driver == Driver::Created, &filter.created);
    if filter.ended.is_set() {
        s.push(FINISHED, []);
        range(&mut s, "t.updated_at", driver == Driver::Ended, &filter.ended);
    }
    if let Some(prefix) = &filter.id_prefix {
        let condition = format!("{0}t.id >= ?_ AND {0}t.id < ?_", plus(driver == Driver::IdPrefix));
        s.push(&condition, [text(prefix), text(&prefix_upper_bound(prefix))]);
    }
    s
}

/// Picks the index a listing or count of `filter` reads first: the
/// sparsest of its sparse conditions when it matches fewer than `sparse`
/// tasks, else the newest-first walk. Each probe counts at most that many
/// entries of one index.
fn driver(conn: &Connection, filter: &TaskFilter, sparse: u32) -> Result<Driver> {
    if filter.at_risk || sparse == 0 {
        return Ok(Driver::Newest);
    }
    let mut candidates: Vec<Driver> = (0..filter.tags.len()).map(Driver::Tag).collect();
    if filter.ended.is_set() {
        candidates.push(Driver::Ended);
    }
    if filter.created.is_set() {
        candidates.push(Driver::Created);
    }
    if filter.id_prefix.is_some() {
        candidates.push(Driver::IdPrefix);
    }
    let mut best = (Driver::Newest, i64::from(sparse));
    for candidate in candidates {
        let matches = probe(conn, filter, candidate, sparse)?;
        if matches < best.1 {
            best = (candidate, matches);
        }
    }
    Ok(best.0)
}

/// How many tasks match `driver`'s condition alone, counted up to
/// `sparse` on its index.
fn probe(conn: &Connection, filter: &TaskFilter, driver: Driver, sparse: u32) -> Result<i64> {
    let (sql, values): (String, Vec<Sql>) = match driver {
        Driver::Newest => return Ok(i64::from(sparse)),
        Driver::Tag(index) => {
            let (key, value) = &filter.tags[index];
            ("SELECT 1 FROM task_tags WHERE key = ?1 AND value = ?2".into(), vec![text(key), text(value)])
        }
        Driver::Ended | Driver::Created | Driver::IdPrefix => {
            let only = TaskFilter {
                created: if driver == Driver::Created { filter.created } else { TimeRange::default() },
                ended: if driver == Driver::Ended { filter.ended } else { TimeRange::default() },
                id_prefix: if driver == Driver::IdPrefix { filter.id_prefix.clone() } else { None },
                ..TaskFilter::default()
            };
            let s = selection(&only, driver);
            (format!("SELECT 1 FROM {} {}", s.from, s.where_clause()), s.values)
        }
    };
    let sql = format!("SELECT count(*) FROM ({sql} LIMIT {sparse})");
    conn.prepare_cached(&sql).and_then(|mut stmt| stmt.query_row(params_from_iter(values.iter()), |row| row.get(0))).map_err(sql_error)
}

/// Tasks matching `filter`, newest first (by rowid: the order of creation).
/// `before` is a range on the rowid.
pub(crate) fn list_tasks(conn: &Connection, filter: &TaskFilter, sparse: u32) -> Result<Vec<Task>> {
    let mut s = selection(filter, driver(conn, filter, sparse)?);
    if let Some(before) = &filter.before {
        s.push("t.rowid < (SELECT rowid FROM tasks WHERE id = ?_)", [text(before.as_str())]);
    }
    s.values.push(Sql::Integer(i64::from(filter.limit)));
    let sql = format!("SELECT {TASK_COLUMNS} FROM {} {} ORDER BY t.rowid DESC LIMIT ?{}", s.from, s.where_clause(), s.values.len());
    let rows = conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| stmt.query_map(params_from_iter(s.values.iter()), task_row)?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    rows.into_iter().map(TaskRow::into_task).collect()
}

/// See [`rota_store::Tasks::stale_children`]: the unfinished children
/// (read on `tasks_children_running`) whose parent's step no longer runs
/// the attempt that started them.
pub(crate) fn stale_children(conn: &Connection, limit: u32) -> Result<Vec<TaskId>> {
    let ids = conn
        .prepare_cached(
            "SELECT c.id FROM tasks AS c INDEXED BY tasks_children_running
               LEFT JOIN tasks AS p ON p.id = c.parent_id
               LEFT JOIN steps AS s ON s.task_id = c.parent_id AND s.name = c.parent_step
              WHERE c.parent_id IS NOT NULL AND c.state IN ('pending', 'processing')
                AND (p.id IS NULL OR p.state NOT IN ('pending', 'processing')
                     OR s.state IS NOT 'running' OR s.attempt IS NOT c.parent_attempt)
              LIMIT ?1",
        )
        .and_then(|mut stmt| stmt.query_map([i64::from(limit)], |row| row.get::<_, String>(0))?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    ids.into_iter().map(|id| TaskId::new(id).map_err(|e| corrupt("task id", e))).collect()
}

/// How many tasks matching `filter` (`before` and `limit` aside) are in
/// each state, every state listed. With no condition, or a workflow only,
/// it counts entries of one index (`tasks_state`, `tasks_workflow_state`)
/// without reading the table.
pub(crate) fn count_tasks(conn: &Connection, filter: &TaskFilter, sparse: u32) -> Result<Vec<(TaskState, u64)>> {
    let s = selection(filter, driver(conn, filter, sparse)?);
    let sql = format!("SELECT t.state, count(*) FROM {} {} GROUP BY t.state", s.from, s.where_clause());
    let rows = conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| {
            stmt.query_map(params_from_iter(s.values.iter()), |row| Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql_error)?;
    let counted = rows
        .into_iter()
        .map(|(state, count)| Ok((state.parse::<TaskState>().map_err(|e| corrupt("task state", e))?, u64::try_from(count).unwrap_or(0))))
        .collect::<Result<Vec<_>>>()?;
    Ok(rota_store::counts_of_every_state(counted))
}

/// Claims up to `claim.max` claimable tasks in one statement (its oldest
/// share from `tasks_claimable`, the rest from `tasks_claimable_priority`),
/// gives each claimed task with a concurrency key and no slot yet the
/// lowest free slot of its key, and records a `Claimed` event for each.
///
/// A task with a concurrency key is claimable when it holds a slot (its
/// holder died or gave it back), or when the slots its key has in use and
/// the claimable tasks of its key submitted before it, which wait without
/// one, are fewer than its limit: so a key's tasks start in submission
/// order, at most `limit` at once, and a key at its limit is walked past.
pub(crate) fn claim_tasks(conn: &Connection, owner: &InstanceId, lease: Duration, claim: Claim, now: Timestamp) -> Result<Vec<Task>> {
    // A key at its limit is passed over on the count of its slots alone;
    // the older waiting tasks are counted only for a key with a free slot
    // (up to CONCURRENCY_LIMIT_MAX of them: SQLite's LIMIT cannot name the
    // task's own limit).
    const _: () = assert!(rota_model::CONCURRENCY_LIMIT_MAX == 10_000, "the LIMIT below");
    const CLAIMABLE: &str = "state IN ('pending', 'compensating') AND locked_by IS NULL AND paused = 0 AND held = 0 AND not_before <= ?3
                             AND NOT EXISTS (SELECT 1 FROM workflow_pauses p WHERE p.name = tasks.workflow AND p.paused = 1)
                             AND (concurrency_key IS NULL
                                  OR EXISTS (SELECT 1 FROM concurrency_slots s WHERE s.task_id = tasks.id)
                                  OR (SELECT count(*) FROM concurrency_slots s
                                       WHERE s.workflow = tasks.workflow AND s.key = tasks.concurrency_key) < concurrency_limit
                                 AND (SELECT count(*) FROM concurrency_slots s
                                       WHERE s.workflow = tasks.workflow AND s.key = tasks.concurrency_key)
                                   + (SELECT count(*) FROM (
                                        SELECT 1 FROM tasks AS w
                                         WHERE w.workflow = tasks.workflow AND w.concurrency_key = tasks.concurrency_key
                                           AND w.state IN ('pending', 'compensating') AND w.locked_by IS NULL AND w.paused = 0
                                           AND w.not_before <= ?3
                                           AND (w.not_before < tasks.not_before OR (w.not_before = tasks.not_before AND w.rowid < tasks.rowid))
                                           AND NOT EXISTS (SELECT 1 FROM concurrency_slots s WHERE s.task_id = w.id)
                                         LIMIT 10000))
                                   < concurrency_limit)";
    let oldest_first = claim.oldest_first.min(claim.max);
    // Each walk names its index: left to choose (there are no statistics),
    // the planner took `tasks_state` for `state IN (…)`, read every pending
    // task, due or not, and sorted them, so a claim cost grew with the
    // backlog. `priority IN (every priority, highest first)` makes the walk
    // of `tasks_claimable_priority` one range per priority, bounded by
    // `not_before`: without it a claim that finds fewer tasks than it may
    // take walks on through every task not due yet.
    let priorities = (rota_model::PRIORITY_MIN..=rota_model::PRIORITY_MAX).rev().map(|p| p.to_string()).collect::<Vec<_>>().join(",");
    let rows = conn
        .prepare_cached(&format!(
            "WITH oldest AS MATERIALIZED (SELECT rowid AS picked FROM tasks INDEXED BY tasks_claimable
                                          WHERE {CLAIMABLE} ORDER BY not_before LIMIT ?5),
                  ranked AS (SELECT rowid AS picked FROM tasks INDEXED BY tasks_claimable_priority
                              WHERE {CLAIMABLE} AND priority IN ({priorities}) AND rowid NOT IN (SELECT picked FROM oldest)
                              ORDER BY priority DESC, not_before LIMIT ?4)
             UPDATE tasks
                SET state = CASE state WHEN 'pending' THEN 'processing' ELSE state END,
                    locked_by = ?1, lease_epoch = lease_epoch + 1, complete_by = ?2, updated_at = ?3
              WHERE rowid IN (SELECT picked FROM oldest UNION ALL SELECT picked FROM ranked)
          RETURNING {TASK_COLUMNS}"
        ))
        .and_then(|mut stmt| {
            stmt.query_map(
                params![owner.as_str(), now.add(lease).as_millis(), now.as_millis(), claim.by_priority_count(), oldest_first],
                task_row,
            )?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql_error)?;
    let mut tasks = rows.into_iter().map(TaskRow::into_task).collect::<Result<Vec<_>>>()?;
    tasks.sort_by(|a, b| (a.not_before, &a.id).cmp(&(b.not_before, &b.id)));
    for task in &tasks {
        if let Some(key) = &task.concurrency {
            take_slot(conn, task, key)?;
        }
        let detail = serde_json::json!({ "owner": owner.as_str(), "lease_epoch": task.lease_epoch });
        insert_event(conn, &Event::task(&task.id, now, EventKind::Claimed, detail))?;
    }
    Ok(tasks)
}

/// Gives `task` the lowest free slot of its key, unless it holds one. The
/// claim chose it only if one is free (the writer runs one claim at a time),
/// so finding none is a broken invariant: the claim fails whole.
fn take_slot(conn: &Connection, task: &Task, key: &ConcurrencyKey) -> Result<()> {
    let held: Option<i64> = conn
        .prepare_cached("SELECT slot FROM concurrency_slots WHERE task_id = ?1")
        .and_then(|mut stmt| stmt.query_row([task.id.as_str()], |row| row.get(0)).optional())
        .map_err(sql_error)?;
    if held.is_some() {
        return Ok(());
    }
    let taken: Vec<i64> = conn
        .prepare_cached("SELECT slot FROM concurrency_slots WHERE workflow = ?1 AND key = ?2 ORDER BY slot")
        .and_then(|mut stmt| stmt.query_map([task.workflow.as_str(), key.key.as_str()], |row| row.get(0))?.collect())
        .map_err(sql_error)?;
    let free = (0..i64::from(key.limit)).zip(taken.iter().copied().chain(std::iter::repeat(-1))).find(|(slot, used)| slot != used);
    let Some((slot, _)) = free else {
        return Err(Error::Backend(format!(
            "claimed task {} finds no free slot of concurrency key {} (limit {})",
            task.id, key.key, key.limit
        )));
    };
    conn.prepare_cached("INSERT INTO concurrency_slots (workflow, key, slot, task_id) VALUES (?1, ?2, ?3, ?4)")
        .and_then(|mut stmt| stmt.execute(params![task.workflow.as_str(), key.key.as_str(), slot, task.id.as_str()]))
        .map_err(sql_error)?;
    Ok(())
}

/// The tasks holding a slot of `key` of `workflow`, by slot.
pub(crate) fn key_holders(conn: &Connection, workflow: &WorkflowName, key: &str) -> Result<Vec<TaskId>> {
    let ids: Vec<String> = conn
        .prepare_cached("SELECT task_id FROM concurrency_slots WHERE workflow = ?1 AND key = ?2 ORDER BY slot")
        .and_then(|mut stmt| stmt.query_map([workflow.as_str(), key], |row| row.get(0))?.collect())
        .map_err(sql_error)?;
    ids.into_iter().map(|id| TaskId::new(id).map_err(|e| corrupt("slot holder", e))).collect()
}

pub(crate) fn expired(conn: &Connection, limit: u32, now: Timestamp) -> Result<Vec<Expired>> {
    let tasks = conn
        .prepare_cached(&format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE locked_by IS NOT NULL AND complete_by <= ?1 ORDER BY complete_by LIMIT ?2"
        ))
        .and_then(|mut stmt| stmt.query_map(params![now.as_millis(), limit], task_row)?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    let steps = conn
        .prepare_cached(&format!(
            "SELECT {STEP_COLUMNS} FROM steps WHERE complete_by IS NOT NULL AND complete_by <= ?1
               AND state IN ('running', 'compensating') ORDER BY complete_by LIMIT ?2"
        ))
        .and_then(|mut stmt| stmt.query_map(params![now.as_millis(), limit], step_row)?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    let mut found: Vec<(Timestamp, Expired)> = Vec::with_capacity(tasks.len() + steps.len());
    for row in tasks {
        let task = row.into_task()?;
        found.push((task.complete_by.unwrap_or(now), Expired::Task(task)));
    }
    for row in steps {
        let step = row.into_step()?;
        found.push((step.complete_by.unwrap_or(now), Expired::Step(step)));
    }
    found.sort_by_key(|(at, _)| *at);
    found.truncate(limit as usize);
    Ok(found.into_iter().map(|(_, e)| e).collect())
}

/// Leased tasks and running steps whose warning point has passed with no
/// warning raised, each from its partial index (`tasks_warn_due`,
/// `steps_warn_due`), earliest first.
pub(crate) fn warnings_due(conn: &Connection, limit: u32, now: Timestamp) -> Result<Vec<Warning>> {
    let tasks = conn
        .prepare_cached(&format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE warn_at IS NOT NULL AND warned_at IS NULL AND warn_at <= ?1
               AND locked_by IS NOT NULL ORDER BY warn_at LIMIT ?2"
        ))
        .and_then(|mut stmt| stmt.query_map(params![now.as_millis(), limit], task_row)?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    let steps = conn
        .prepare_cached(&format!(
            "SELECT {STEP_COLUMNS} FROM steps WHERE warn_at IS NOT NULL AND warned_attempt < attempt AND warn_at <= ?1
               AND state = 'running' ORDER BY warn_at LIMIT ?2"
        ))
        .and_then(|mut stmt| stmt.query_map(params![now.as_millis(), limit], step_row)?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    let mut found = Vec::with_capacity(tasks.len() + steps.len());
    for row in tasks {
        found.push(Warning::Task(row.into_task()?));
    }
    for row in steps {
        found.push(Warning::Step(row.into_step()?));
    }
    found.sort_by_key(|w| w.warn_at());
    found.truncate(limit as usize);
    Ok(found)
}

/// Raises a warning found by [`warnings_due`] (see `Tasks::raise_warning`):
/// marks it raised, and appends `events` if its task is still held.
pub(crate) fn raise_warning(conn: &Connection, warning: &Warning, events: &[Event], now: Timestamp) -> Result<bool> {
    let live = match warning {
        Warning::Task(task) => {
            let Some(warn_at) = task.warn_at else { return Ok(false) };
            conn.prepare_cached(
                "UPDATE tasks SET warned_at = ?3, at_risk_since = COALESCE(at_risk_since, ?3)
                  WHERE id = ?1 AND warn_at = ?2 AND warned_at IS NULL AND locked_by IS NOT NULL
                    AND state IN ('processing', 'compensating')",
            )
            .and_then(|mut stmt| stmt.execute(params![task.id.as_str(), warn_at.as_millis(), now.as_millis()]))
            .map_err(sql_error)?
                == 1
        }
        Warning::Step(step) => {
            let task_id = step.task_id.as_str();
            let live = conn
                .prepare_cached(
                    "UPDATE tasks SET at_risk_since = COALESCE(at_risk_since, ?4)
                      WHERE id = ?1 AND locked_by IS NOT NULL AND state IN ('processing', 'compensating')
                        AND EXISTS (SELECT 1 FROM steps WHERE task_id = ?1 AND name = ?2 AND attempt = ?3 AND state = 'running'
                                       AND warn_at IS NOT NULL AND warned_attempt < attempt)",
                )
                .and_then(|mut stmt| stmt.execute(params![task_id, step.name.as_str(), step.attempt, now.as_millis()]))
                .map_err(sql_error)?
                == 1;
            // Marked even when its task is no longer held, so it is not due again.
            conn.prepare_cached(
                "UPDATE steps SET warned_attempt = attempt
                  WHERE task_id = ?1 AND name = ?2 AND attempt = ?3 AND state = 'running' AND warned_attempt < attempt",
            )
            .and_then(|mut stmt| stmt.execute(params![task_id, step.name.as_str(), step.attempt]))
            .map_err(sql_error)?;
            live
        }
    };
    if live {
        for event in events {
            insert_event(conn, event)?;
        }
    }
    Ok(live)
}

/// An event row as read: seq, task id, at, kind, step, attempt, detail, hash.
type EventRow = (i64, String, i64, String, Option<String>, Option<u32>, String, Option<Vec<u8>>);

pub(crate) fn event_row(row: &Row<'_>) -> rusqlite::Result<EventRow> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?, row.get(6)?, row.get(7)?))
}

pub(crate) fn into_event((seq, task_id, at, kind, step, attempt, detail, hash): EventRow) -> Result<Event> {
    Ok(Event {
        seq,
        task_id: TaskId::new(task_id).map_err(|e| corrupt("event task id", e))?,
        at: Timestamp::from_millis(at),
        kind: EventKind::parse(&kind).ok_or_else(|| corrupt("event kind", &kind))?,
        step: step.map(StepName::new).transpose().map_err(|e| corrupt("event step", e))?,
        attempt,
        detail: parse_json("event detail", detail)?,
        hash: hash.map(|hash| chain::hex(&hash)),
    })
}

pub(crate) fn history(conn: &Connection, id: &TaskId) -> Result<Vec<Event>> {
    let rows = conn
        .prepare_cached("SELECT seq, task_id, at, kind, step, attempt, detail, hash FROM events WHERE task_id = ?1 ORDER BY seq")
        .and_then(|mut stmt| stmt.query_map([id.as_str()], event_row)?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    rows.into_iter().map(into_event).collect()
}

pub(crate) fn latest_events(conn: &Connection, limit: u32) -> Result<Vec<Event>> {
    let rows = conn
        .prepare_cached("SELECT seq, task_id, at, kind, step, attempt, detail, hash FROM events ORDER BY seq DESC LIMIT ?1")
        .and_then(|mut stmt| stmt.query_map([limit], event_row)?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    rows.into_iter().map(into_event).collect()
}

pub(crate) fn events_after(conn: &Connection, after: i64, limit: u32) -> Result<Vec<Event>> {
    let rows = conn
        .prepare_cached("SELECT seq, task_id, at, kind, step, attempt, detail, hash FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2")
        .and_then(|mut stmt| stmt.query_map(params![after, limit], event_row)?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    rows.into_iter().map(into_event).collect()
}

/// Takes the named lease if it is free, expired, or already `holder`'s.
pub(crate) fn acquire_leader(
    conn: &Connection,
    name: &str,
    holder: &InstanceId,
    ttl: Duration,
    now: Timestamp,
) -> Result<Option<LeaderLease>> {
    let row = conn
        .prepare_cached(
            "INSERT INTO leaders (name, holder, until, epoch) VALUES (?1, ?2, ?3, 1)
             ON CONFLICT (name) DO UPDATE
                SET epoch = CASE WHEN leaders.holder = excluded.holder THEN leaders.epoch ELSE leaders.epoch + 1 END,
                    holder = excluded.holder, until = excluded.until
              WHERE leaders.holder = excluded.holder OR leaders.until <= ?4
          RETURNING holder, until, epoch",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![name, holder.as_str(), now.add(ttl).as_millis(), now.as_millis()], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
            })
            .optional()
        })
        .map_err(sql_error)?;
    Ok(row.map(|(_, until, epoch)| LeaderLease {
        name: name.to_owned(),
        holder: holder.clone(),
        until: Timestamp::from_millis(until),
        epoch: epoch as u64,
    }))
}

/// The named lease if it runs past `now`.
pub(crate) fn leader(conn: &Connection, name: &str, now: Timestamp) -> Result<Option<LeaderLease>> {
    let row = conn
        .prepare_cached("SELECT holder, until, epoch FROM leaders WHERE name = ?1 AND until > ?2")
        .and_then(|mut stmt| {
            stmt.query_row(params![name, now.as_millis()], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?, row.get::<_, i64>(2)?))
            })
            .optional()
        })
        .map_err(sql_error)?;
    row.map(|(holder, until, epoch)| {
        Ok(LeaderLease {
            name: name.to_owned(),
            holder: InstanceId::new(holder).map_err(|e| corrupt("leader holder", e))?,
            until: Timestamp::from_millis(until),
            epoch: epoch as u64,
        })
    })
    .transpose()
}

pub(crate) fn release_leader(conn: &Connection, name: &str, holder: &InstanceId, now: Timestamp) -> Result<()> {
    conn.prepare_cached("UPDATE leaders SET until = ?3 WHERE name = ?1 AND holder = ?2")
        .and_then(|mut stmt| stmt.execute(params![name, holder.as_str(), now.as_millis()]))
        .map_err(sql_error)?;
    Ok(())
}

pub(crate) fn register_workflow(conn: &Connection, name: &WorkflowName, version: u32, definition: &Value, now: Timestamp) -> Result<()> {
    let text = json_text(definition);
    let existing: Option<String> = conn
        .prepare_cached("SELECT definition FROM workflows WHERE name = ?1 AND version = ?2")
        .and_then(|mut stmt| stmt.query_row(params![name.as_str(), version], |row| row.get(0)).optional())
        .map_err(sql_error)?;
    match existing {
        Some(stored) if parse_json("workflow definition", stored.clone())? == *definition => Ok(()),
        Some(_) => Err(Error::Conflict(format!(
            "workflow {name} version {version} is already registered with a different definition (versions are immutable: bump the version)"
        ))),
        None => {
            conn.prepare_cached("INSERT INTO workflows (name, version, definition, registered_at) VALUES (?1, ?2, ?3, ?4)")
                .and_then(|mut stmt| stmt.execute(params![name.as_str(), version, text, now.as_millis()]))
                .map_err(sql_error)?;
            Ok(())
        }
    }
}

fn workflow_row(row: &Row<'_>) -> rusqlite::Result<(String, u32, String, i64)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
}

fn into_workflow((name, version, definition, at): (String, u32, String, i64)) -> Result<WorkflowEntry> {
    Ok(WorkflowEntry {
        name: WorkflowName::new(name).map_err(|e| corrupt("workflow name", e))?,
        version,
        definition: parse_json("workflow definition", definition)?,
        registered_at: Timestamp::from_millis(at),
    })
}

pub(crate) fn workflow(conn: &Connection, name: &WorkflowName, version: Option<u32>) -> Result<Option<WorkflowEntry>> {
    conn.prepare_cached(
        "SELECT name, version, definition, registered_at FROM workflows
          WHERE name = ?1 AND (?2 IS NULL OR version = ?2) ORDER BY version DESC LIMIT 1",
    )
    .and_then(|mut stmt| stmt.query_row(params![name.as_str(), version], workflow_row).optional())
    .map_err(sql_error)?
    .map(into_workflow)
    .transpose()
}

pub(crate) fn workflows(conn: &Connection) -> Result<Vec<WorkflowEntry>> {
    let rows = conn
        .prepare_cached(
            "SELECT w.name, w.version, w.definition, w.registered_at FROM workflows w
              WHERE w.version = (SELECT MAX(v.version) FROM workflows v WHERE v.name = w.name) ORDER BY w.name",
        )
        .and_then(|mut stmt| stmt.query_map([], workflow_row)?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    rows.into_iter().map(into_workflow).collect()
}

/// A workflow's pause or resume, fenced on its paused state: a pause
/// inserts or updates a row that is not paused, a resume updates one that
/// is; nothing matched is a `Conflict`.
pub(crate) fn set_workflow_paused(conn: &Connection, change: &WorkflowPause) -> Result<()> {
    let args = params![change.workflow.as_str(), change.paused, change.by, change.reason, change.at.as_millis()];
    let sql = if change.paused {
        "INSERT INTO workflow_pauses (name, paused, changed_by, reason, changed_at) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, changed_by = excluded.changed_by,
                                          reason = excluded.reason, changed_at = excluded.changed_at
          WHERE workflow_pauses.paused = 0"
    } else {
        "UPDATE workflow_pauses SET paused = ?2, changed_by = ?3, reason = ?4, changed_at = ?5 WHERE name = ?1 AND paused = 1"
    };
    let changed = conn.prepare_cached(sql).and_then(|mut stmt| stmt.execute(args)).map_err(sql_error)?;
    if changed == 0 {
        let already = if change.paused { "paused" } else { "not paused" };
        return Err(Error::Conflict(format!("workflow {} is {already}", change.workflow)));
    }
    // Hold or release its tasks, so that claims need not walk past them.
    let hold = if change.paused {
        "UPDATE tasks SET held = 1 WHERE workflow = ?1 AND state IN ('pending', 'processing', 'compensating') AND held = 0"
    } else {
        "UPDATE tasks INDEXED BY tasks_held SET held = 0 WHERE workflow = ?1 AND held = 1"
    };
    conn.prepare_cached(hold).and_then(|mut stmt| stmt.execute([change.workflow.as_str()])).map_err(sql_error)?;
    Ok(())
}

/// Whether `workflow` is paused now.
pub(crate) fn workflow_paused(conn: &Connection, workflow: &WorkflowName) -> Result<bool> {
    conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM workflow_pauses WHERE name = ?1 AND paused = 1)")
        .and_then(|mut stmt| stmt.query_row([workflow.as_str()], |row| row.get(0)))
        .map_err(sql_error)
}

pub(crate) fn workflow_pauses(conn: &Connection) -> Result<Vec<WorkflowPause>> {
    let rows = conn
        .prepare_cached("SELECT name, paused, changed_by, reason, changed_at FROM workflow_pauses ORDER BY name")
        .and_then(|mut stmt| {
            stmt.query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, bool>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, Option<String>>(3)?,
                    row.get::<_, i64>(4)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql_error)?;
    rows.into_iter()
        .map(|(name, paused, by, reason, at)| {
            let workflow = WorkflowName::new(&name).map_err(|_| corrupt("workflow name", &name))?;
            Ok(WorkflowPause { workflow, paused, by, reason, at: Timestamp::from_millis(at) })
        })
        .collect()
}

pub(crate) fn alerts(conn: &Connection, limit: u32) -> Result<Vec<Event>> {
    let rows = conn
        .prepare_cached(
            "SELECT seq, task_id, at, kind, step, attempt, detail, hash FROM events WHERE kind = 'alert' ORDER BY seq DESC LIMIT ?1",
        )
        .and_then(|mut stmt| stmt.query_map([limit], event_row)?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    rows.into_iter().map(into_event).collect()
}

pub(crate) fn report_status(conn: &Connection, key: &str, value: &Value, now: Timestamp) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO statuses (key, value, reported_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value, reported_at = excluded.reported_at",
    )
    .and_then(|mut stmt| stmt.execute(params![key, json_text(value), now.as_millis()]))
    .map_err(sql_error)?;
    Ok(())
}

pub(crate) fn statuses(conn: &Connection, prefix: &str) -> Result<Vec<ComponentStatus>> {
    let rows = conn
        .prepare_cached("SELECT key, value, reported_at FROM statuses WHERE substr(key, 1, length(?1)) = ?1 ORDER BY key")
        .and_then(|mut stmt| {
            stmt.query_map([prefix], |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?, row.get::<_, i64>(2)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql_error)?;
    rows.into_iter()
        .map(|(key, value, at)| Ok(ComponentStatus { key, value: parse_json("status", value)?, reported_at: Timestamp::from_millis(at) }))
        .collect()
}

/// One take of a rate limit: the GCRA rule of `rota_model::rate` as one
/// upsert, which writes only when the start is within the wait.
pub(crate) fn take_rate_slot(conn: &Connection, request: &RateRequest, now: Timestamp) -> Result<RateSlot> {
    let (now_us, interval_us, tolerance_us, wait_us) = request.micros(now);
    let taken: Option<i64> = conn
        .prepare_cached(
            "INSERT INTO rate_limits (key, tat_us) VALUES (?1, ?2 + ?3)
             ON CONFLICT (key) DO UPDATE SET tat_us = max(tat_us, ?2) + ?3
             WHERE max(tat_us, ?2) + ?3 - ?4 - ?2 <= ?5
             RETURNING tat_us",
        )
        .and_then(|mut stmt| stmt.query_row(params![request.key, now_us, interval_us, tolerance_us, wait_us], |row| row.get(0)).optional())
        .map_err(sql_error)?;
    if let Some(tat_us) = taken {
        return Ok(request.granted(tat_us, now));
    }
    let stored: Option<i64> = conn
        .prepare_cached("SELECT tat_us FROM rate_limits WHERE key = ?1")
        .and_then(|mut stmt| stmt.query_row([&request.key], |row| row.get(0)).optional())
        .map_err(sql_error)?;
    Ok(request.refused(stored, now))
}

const BREAKER_COLUMNS: &str = "key, state, consecutive_failures, open_until, probe_holder, probe_until, updated_at";

fn breaker_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<BreakerColumns> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?, row.get(6)?))
}

type BreakerColumns = (String, String, i64, Option<i64>, Option<String>, Option<i64>, i64);

fn shared_breaker(columns: BreakerColumns) -> Result<SharedBreaker> {
    let (key, state, failures, open_until, probe_holder, probe_until, updated_at) = columns;
    Ok(SharedBreaker {
        key,
        state: SharedBreakerState::parse(&state)?,
        consecutive_failures: u32::try_from(failures).map_err(|e| corrupt("breaker failures", e))?,
        open_until: open_until.map(Timestamp::from_millis),
        probe_holder,
        probe_until: probe_until.map(Timestamp::from_millis),
        updated_at: Timestamp::from_millis(updated_at),
    })
}

fn breaker(conn: &Connection, key: &str) -> Result<Option<SharedBreaker>> {
    let sql = format!("SELECT {BREAKER_COLUMNS} FROM breakers WHERE key = ?1");
    let columns = conn.prepare_cached(&sql).and_then(|mut stmt| stmt.query_row([key], breaker_row).optional()).map_err(sql_error)?;
    columns.map(shared_breaker).transpose()
}

/// One ask of a shared breaker: the probe lease taken by one
/// compare-and-set update, the row read beside it in the same write
/// transaction (the single writer makes the pair atomic).
pub(crate) fn admit_breaker(conn: &Connection, ask: &BreakerAsk, now: Timestamp) -> Result<(BreakerAdmission, Option<SharedBreaker>)> {
    let before = breaker(conn, &ask.key)?;
    let took = conn
        .prepare_cached(
            "UPDATE breakers SET state = 'half_open', probe_holder = ?2, probe_until = ?3 + ?4, updated_at = ?3
             WHERE key = ?1 AND state <> 'closed' AND coalesce(open_until, 0) <= ?3
               AND (probe_holder IS NULL OR coalesce(probe_until, 0) <= ?3)",
        )
        .and_then(|mut stmt| stmt.execute(params![ask.key, ask.holder, now.as_millis(), breaker::lease_ms(ask.probe_lease)]))
        .map_err(sql_error)?
        > 0;
    let admission = ask.answer(before.as_ref(), took, now);
    let after = if took { breaker(conn, &ask.key)? } else { before };
    Ok((admission, after))
}

/// How a report moves a breaker's row, the same for the failure's upsert
/// and the other reports' update: ?2 the holder, ?3 whether the call was
/// the probe, ?4 the result (0 success, 1 failure, 2 abandoned), ?5
/// failures_to_open, ?6 now, ?7 open_for (ms). `?3 AND probe_holder = ?2`:
/// the report is the current probe's result.
const BREAKER_REPORT_SET: &str = "
    consecutive_failures = CASE
      WHEN ?4 = 1 AND state = 'closed' THEN consecutive_failures + 1
      WHEN ?4 = 0 AND (state = 'closed' OR (?3 AND probe_holder = ?2)) THEN 0
      ELSE consecutive_failures END,
    state = CASE
      WHEN ?4 = 1 AND ((state = 'closed' AND consecutive_failures + 1 >= ?5) OR (?3 AND probe_holder = ?2)) THEN 'open'
      WHEN ?4 = 0 AND ?3 AND probe_holder = ?2 THEN 'closed'
      ELSE state END,
    open_until = CASE
      WHEN ?4 = 1 AND ((state = 'closed' AND consecutive_failures + 1 >= ?5) OR (?3 AND probe_holder = ?2)) THEN ?6 + ?7
      WHEN ?4 = 0 AND ?3 AND probe_holder = ?2 THEN NULL
      ELSE open_until END,
    probe_holder = CASE WHEN ?3 AND probe_holder = ?2 THEN NULL ELSE probe_holder END,
    probe_until = CASE WHEN ?3 AND probe_holder = ?2 THEN NULL ELSE probe_until END,
    updated_at = ?6";

/// One report to a shared breaker, as one statement: a failure's upsert
/// (only a failure creates a row), or an update of the row.
pub(crate) fn report_breaker(conn: &Connection, report: &BreakerReport, now: Timestamp) -> Result<Option<SharedBreaker>> {
    let (kind, sql): (i64, String) = match report.result {
        BreakerResult::Failure => (
            1,
            format!(
                "INSERT INTO breakers ({BREAKER_COLUMNS})
                 VALUES (?1, CASE WHEN ?5 <= 1 THEN 'open' ELSE 'closed' END, 1, CASE WHEN ?5 <= 1 THEN ?6 + ?7 END, NULL, NULL, ?6)
                 ON CONFLICT (key) DO UPDATE SET {BREAKER_REPORT_SET}
                 RETURNING {BREAKER_COLUMNS}"
            ),
        ),
        BreakerResult::Success | BreakerResult::Abandoned => (
            if report.result == BreakerResult::Success { 0 } else { 2 },
            format!("UPDATE breakers SET {BREAKER_REPORT_SET} WHERE key = ?1 RETURNING {BREAKER_COLUMNS}"),
        ),
    };
    let params = params![report.key, report.holder, report.probe, kind, report.failures_to_open, now.as_millis(), report.open_for_ms()];
    let columns = conn.prepare_cached(&sql).and_then(|mut stmt| stmt.query_row(params, breaker_row).optional()).map_err(sql_error)?;
    columns.map(shared_breaker).transpose()
}

pub(crate) fn shared_breakers(conn: &Connection) -> Result<Vec<SharedBreaker>> {
    let sql = format!("SELECT {BREAKER_COLUMNS} FROM breakers ORDER BY key");
    let rows = conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| stmt.query_map([], breaker_row)?.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(sql_error)?;
    rows.into_iter().map(shared_breaker).collect()
}

pub(crate) fn delete_rate_limits(conn: &Connection, before: Timestamp) -> Result<u64> {
    let before_us = before.as_millis().saturating_mul(1_000);
    let deleted = conn
        .prepare_cached("DELETE FROM rate_limits WHERE tat_us < ?1")
        .and_then(|mut stmt| stmt.execute([before_us]))
        .map_err(sql_error)?;
    Ok(deleted as u64)
}

pub(crate) fn delete_shared_breakers(conn: &Connection, before: Timestamp) -> Result<u64> {
    let deleted = conn
        .prepare_cached("DELETE FROM breakers WHERE updated_at < ?1 AND coalesce(open_until, 0) < ?1 AND coalesce(probe_until, 0) < ?1")
        .and_then(|mut stmt| stmt.execute([before.as_millis()]))
        .map_err(sql_error)?;
    Ok(deleted as u64)
}
