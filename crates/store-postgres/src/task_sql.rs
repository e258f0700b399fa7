//! State-store operations as SQL: tasks, steps, history, leader leases,
//! workflow versions and component statuses. Like the queue operations, they
//! take `now` from the caller.

use std::time::Duration;

use rota_model::{
    ConcurrencyKey, InstanceId, ParentLink, Priority, QueueName, Step, StepName, StepState, Tags, Task, TaskId, TaskState, Timestamp,
    WorkflowName,
};
use rota_store::breaker::{self, BreakerAdmission, BreakerAsk, BreakerReport, BreakerResult, SharedBreaker, SharedBreakerState};
use rota_store::{
    Claim, ComponentStatus, Error, Event, EventKind, Expired, LeaderLease, RateRequest, RateSlot, TaskFilter, TaskRecord, TimeRange,
    Warning, WorkflowEntry, WorkflowPause, chain,
};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{Connection, PgConnection, Row};

use crate::sql::Names;
use crate::{Fail, Result};

pub(crate) fn json_text(value: &Value) -> String {
    value.to_string()
}

pub(crate) fn parse_json(column: &str, text: String) -> Result<Value> {
    serde_json::from_str(&text).map_err(|e| Error::Backend(format!("stored {column} is not JSON: {e}")).into())
}

fn corrupt(what: &str, err: impl std::fmt::Display) -> Fail {
    Error::Backend(format!("stored {what} is invalid: {err}")).into()
}

fn count(value: i64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

fn task_from(row: &PgRow) -> Result<Task> {
    Ok(Task {
        id: TaskId::new(row.try_get::<String, _>("id")?).map_err(|e| corrupt("task id", e))?,
        workflow: WorkflowName::new(row.try_get::<String, _>("workflow")?).map_err(|e| corrupt("workflow name", e))?,
        workflow_version: count(row.try_get("workflow_version")?),
        input: parse_json("task input", row.try_get("input")?)?,
        state: row.try_get::<String, _>("state")?.parse::<TaskState>().map_err(|e| corrupt("task state", e))?,
        locked_by: row.try_get::<Option<String>, _>("locked_by")?.map(InstanceId::new).transpose().map_err(|e| corrupt("locked_by", e))?,
        lease_epoch: row.try_get::<i64, _>("lease_epoch")? as u64,
        complete_by: row.try_get::<Option<i64>, _>("complete_by")?.map(Timestamp::from_millis),
        warn_at: row.try_get::<Option<i64>, _>("warn_at")?.map(Timestamp::from_millis),
        at_risk_since: row.try_get::<Option<i64>, _>("at_risk_since")?.map(Timestamp::from_millis),
        not_before: Timestamp::from_millis(row.try_get("not_before")?),
        failure_count: count(row.try_get("failure_count")?),
        reply_to: row.try_get("reply_to")?,
        reply_queue: row
            .try_get::<Option<String>, _>("reply_queue")?
            .map(QueueName::new)
            .transpose()
            .map_err(|e| corrupt("reply_queue", e))?,
        submitter: row.try_get("submitter")?,
        paused: row.try_get("paused")?,
        tags: row
            .try_get::<Option<String>, _>("tags")?
            .as_deref()
            .map(Tags::from_json)
            .transpose()
            .map_err(|e| corrupt("tags", e))?
            .unwrap_or_default(),
        priority: Priority::new(i64::from(row.try_get::<i32, _>("priority")?)).map_err(|e| corrupt("priority", e))?,
        concurrency: match (row.try_get::<Option<String>, _>("concurrency_key")?, row.try_get::<Option<i32>, _>("concurrency_limit")?) {
            (Some(key), Some(limit)) => {
                Some(ConcurrencyKey { key, limit: u32::try_from(limit).map_err(|e| corrupt("concurrency limit", e))? })
            }
            _ => None,
        },
        parent: parent_link(row)?,
        output: row.try_get::<Option<String>, _>("output")?.map(|o| parse_json("task output", o)).transpose()?,
        error: row.try_get("error")?,
        created_at: Timestamp::from_millis(row.try_get("created_at")?),
        updated_at: Timestamp::from_millis(row.try_get("updated_at")?),
    })
}

/// A task's parent link from its columns: all set, or none (a top-level task).
fn parent_link(row: &PgRow) -> Result<Option<ParentLink>> {
    let id: Option<String> = row.try_get("parent_id")?;
    let step: Option<String> = row.try_get("parent_step")?;
    let attempt: Option<i32> = row.try_get("parent_attempt")?;
    match (id, step, attempt) {
        (None, None, None) => Ok(None),
        (Some(id), Some(step), Some(attempt)) => Ok(Some(ParentLink {
            task: TaskId::new(id).map_err(|e| corrupt("parent_id", e))?,
            step: StepName::new(step).map_err(|e| corrupt("parent_step", e))?,
            attempt: u32::try_from(attempt).map_err(|e| corrupt("parent_attempt", e))?,
            depth: u32::try_from(row.try_get::<i32, _>("depth")?).map_err(|e| corrupt("depth", e))?,
        })),
        _ => Err(corrupt("parent link", "parent_id, parent_step and parent_attempt must be all set or all NULL")),
    }
}

/// A step from `row`, whose step columns carry `prefix` (empty when the
/// row is a `steps` row, `s_` when steps were joined to their task).
fn step_from(row: &PgRow, prefix: &str) -> Result<Step> {
    let column = |name: &str| format!("{prefix}{name}");
    Ok(Step {
        task_id: TaskId::new(row.try_get::<String, _>(&*column("task_id"))?).map_err(|e| corrupt("task id", e))?,
        name: StepName::new(row.try_get::<String, _>(&*column("name"))?).map_err(|e| corrupt("step name", e))?,
        position: count(row.try_get(&*column("position"))?),
        state: row.try_get::<String, _>(&*column("state"))?.parse::<StepState>().map_err(|e| corrupt("step state", e))?,
        attempt: count(row.try_get(&*column("attempt"))?),
        complete_by: row.try_get::<Option<i64>, _>(&*column("complete_by"))?.map(Timestamp::from_millis),
        warn_at: row.try_get::<Option<i64>, _>(&*column("warn_at"))?.map(Timestamp::from_millis),
        not_before: Timestamp::from_millis(row.try_get(&*column("not_before"))?),
        callback_digest: row.try_get(&*column("callback_digest"))?,
        input: row.try_get::<Option<String>, _>(&*column("input"))?.map(|i| parse_json("step input", i)).transpose()?,
        output: row.try_get::<Option<String>, _>(&*column("output"))?.map(|o| parse_json("step output", o)).transpose()?,
        last_error: row.try_get(&*column("last_error"))?,
        updated_at: Timestamp::from_millis(row.try_get(&*column("updated_at"))?),
    })
}

/// A task and its steps, read in one statement (one snapshot).
pub(crate) async fn get_task(conn: &mut PgConnection, n: &Names, id: &TaskId) -> Result<Option<TaskRecord>> {
    let rows = sqlx::query(n.sql(
        "SELECT t.*, s.task_id AS s_task_id, s.name AS s_name, s.position AS s_position, s.state AS s_state, s.attempt AS s_attempt,
                s.complete_by AS s_complete_by, s.not_before AS s_not_before, s.input AS s_input, s.output AS s_output,
                s.last_error AS s_last_error, s.updated_at AS s_updated_at, s.warn_at AS s_warn_at,
                s.callback_digest AS s_callback_digest
           FROM rota.tasks AS t LEFT JOIN rota.steps AS s ON s.task_id = t.id
          WHERE t.id = $1
          ORDER BY s.position, s.name",
    ))
    .bind(id.as_str())
    .fetch_all(&mut *conn)
    .await?;
    let Some(first) = rows.first() else { return Ok(None) };
    let task = task_from(first)?;
    let mut steps = Vec::with_capacity(rows.len());
    for row in &rows {
        if row.try_get::<Option<String>, _>("s_name")?.is_some() {
            steps.push(step_from(row, "s_")?);
        }
    }
    Ok(Some(TaskRecord { task, steps }))
}

/// Several tasks and their steps, in the order of `ids`, in one statement.
pub(crate) async fn get_tasks(conn: &mut PgConnection, n: &Names, ids: &[TaskId]) -> Result<Vec<TaskRecord>> {
    let rows = sqlx::query(n.sql(
        "SELECT t.*, s.task_id AS s_task_id, s.name AS s_name, s.position AS s_position, s.state AS s_state, s.attempt AS s_attempt,
                s.complete_by AS s_complete_by, s.not_before AS s_not_before, s.input AS s_input, s.output AS s_output,
                s.last_error AS s_last_error, s.updated_at AS s_updated_at, s.warn_at AS s_warn_at,
                s.callback_digest AS s_callback_digest
           FROM rota.tasks AS t LEFT JOIN rota.steps AS s ON s.task_id = t.id
          WHERE t.id = ANY($1::text[])
          ORDER BY t.id, s.position, s.name",
    ))
    .bind(ids.iter().map(TaskId::as_str).collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;
    let mut records = records_from(&rows)?;
    let mut ordered = Vec::with_capacity(records.len());
    for id in ids {
        if let Some(at) = records.iter().position(|r| &r.task.id == id) {
            ordered.push(records.swap_remove(at));
        }
    }
    Ok(ordered)
}

/// The default of `Config::sparse_matches_max`: below this many matches of
/// a time range, a listing reads the range's own index and sorts what it
/// finds; at or above it, it walks the tasks newest first and tests each.
/// About sqrt(page × tasks) for pages of 100 on ten million tasks.
pub(crate) const SPARSE_MATCHES_MAX: u32 = 20_000;

/// A value a listing binds.
enum Bind {
    Text(String),
    Int(i64),
}

/// The index a listing reads first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// The index serving the equality conditions (each ends with
    /// `created_seq`), or `created_seq`'s own, walked backwards.
    Newest,
    /// The first tag's entries in `task_tags`, which end with `created_seq`
    /// too: walked backwards, joined to their tasks.
    Tag,
    /// `tasks_finished`, by end time; the matches are sorted.
    Ended,
    /// `tasks_created`, by creation time; the matches are sorted.
    Created,
    /// `tasks_id_bytes`, the ids in byte order, as a range of a prefix;
    /// the matches are sorted.
    IdPrefix,
}

/// A statement's source, conditions and values, in binding order. The
/// connections plan generically (see `PLANNER_SETTINGS`), so each
/// combination of conditions is its own text naming only those that
/// apply: a generic plan of `($1 IS NULL OR state = $1)` can use no index.
struct Selection {
    from: String,
    /// The column that orders the listing (the driving index's last).
    order: &'static str,
    conditions: Vec<String>,
    values: Vec<Bind>,
}

impl Selection {
    fn push(&mut self, condition: &str, values: impl IntoIterator<Item = Bind>) {
        let mut condition = condition.to_owned();
        for value in values {
            self.values.push(value);
            condition = condition.replacen("$_", &format!("${}", self.values.len()), 1);
        }
        self.conditions.push(condition);
    }

    fn where_clause(&self) -> String {
        if self.conditions.is_empty() { String::new() } else { format!("WHERE {}", self.conditions.join(" AND ")) }
    }

    fn query(&self, text: sqlx::AssertSqlSafe<String>) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
        let mut query = sqlx::query(text);
        for value in &self.values {
            query = match value {
                Bind::Text(text) => query.bind(text.clone()),
                Bind::Int(int) => query.bind(*int),
            };
        }
        query
    }
}

fn text(value: &str) -> Bind {
    Bind::Text(value.to_owned())
}

/// `filter`'s conditions read through `driver`'s index. A range that does
/// not drive is written `(column + 0)`, which no index serves, so that the
/// generic plan keeps to the driving one.
fn selection(filter: &TaskFilter, driver: Driver) -> Selection {
    // `ended_at` is set exactly when the task has finished.
    const FINISHED: &str = "ended_at IS NOT NULL";
    let range = |column: &str, range: &TimeRange| {
        let mut conditions = Vec::new();
        if range.from.is_some() {
            conditions.push(format!("{column} >= $_"));
        }
        if range.until.is_some() {
            conditions.push(format!("{column} < $_"));
        }
        conditions.join(" AND ")
    };
    let range_values = |range: &TimeRange| [range.from, range.until].into_iter().flatten().map(|at| Bind::Int(at.as_millis()));
    let mut s = Selection { from: String::new(), order: "t.created_seq", conditions: Vec::new(), values: Vec::new() };
    // The driving source first: its values come first.
    match driver {
        _ if filter.at_risk => {
            // Tasks at risk are few: read whole from their partial index and
            // the other conditions applied to them, rather than walking a
            // larger index (`tasks_state` on every task processing) that a
            // generic plan of an empty table would choose.
            s.from = "(SELECT * FROM rota.tasks WHERE at_risk_since IS NOT NULL AND locked_by IS NOT NULL OFFSET 0) AS t".into();
        }
        Driver::Tag => {
            let (key, value) = &filter.tags[0];
            s.from = "rota.task_tags AS g JOIN rota.tasks AS t ON t.created_seq = g.created_seq".into();
            s.order = "g.created_seq";
            s.push("g.key = $_ AND g.value = $_", [text(key), text(value)]);
        }
        Driver::Ended | Driver::Created => {
            let (column, range_of, only) = if driver == Driver::Ended {
                ("ended_at", &filter.ended, format!("{FINISHED} AND "))
            } else {
                ("created_at", &filter.created, String::new())
            };
            let mut inner = Selection { from: String::new(), order: "", conditions: Vec::new(), values: Vec::new() };
            inner.push(&format!("{only}{}", range(column, range_of)), range_values(range_of));
            s.from = format!("(SELECT * FROM rota.tasks {} OFFSET 0) AS t", inner.where_clause());
            s.values = inner.values;
        }
        Driver::IdPrefix => {
            let prefix = filter.id_prefix.as_deref().unwrap_or_default();
            let mut inner = Selection { from: String::new(), order: "", conditions: Vec::new(), values: Vec::new() };
            inner.push(ID_PREFIX_RANGE, [text(prefix), text(&rota_store::prefix_upper_bound(prefix))]);
            s.from = format!("(SELECT * FROM rota.tasks {} OFFSET 0) AS t", inner.where_clause());
            s.values = inner.values;
        }
        Driver::Newest => s.from = "rota.tasks AS t".into(),
    }
    if let Some(state) = filter.state {
        s.push("t.state = $_", [text(state.as_str())]);
    }
    if let Some(workflow) = &filter.workflow {
        s.push("t.workflow = $_", [text(workflow.as_str())]);
    }
    if let Some(owner) = &filter.locked_by {
        s.push("t.locked_by = $_", [text(owner.as_str())]);
    }
    if let Some(submitter) = &filter.submitter {
        s.push("t.submitter = $_", [text(submitter)]);
    }
    if let Some(parent) = &filter.parent {
        s.push("t.parent_id = $_", [text(parent.as_str())]);
    }
    let driven_tags = usize::from(driver == Driver::Tag && !filter.at_risk);
    for (key, value) in filter.tags.iter().skip(driven_tags) {
        s.push(
            "EXISTS (SELECT 1 FROM rota.task_tags AS o WHERE o.key = $_ AND o.value = $_ AND o.created_seq = t.created_seq)",
            [text(key), text(value)],
        );
    }
    if filter.created.is_set() && driver != Driver::Created {
        s.push(&range("(t.created_at + 0)", &filter.created), range_values(&filter.created));
    }
    if filter.ended.is_set() && driver != Driver::Ended {
        s.push(&format!("t.{FINISHED} AND {}", range("(t.ended_at + 0)", &filter.ended)), range_values(&filter.ended));
    }
    if let Some(prefix) = &filter.id_prefix
        && driver != Driver::IdPrefix
    {
        // An exact test in byte order whatever the database's collation,
        // which no index serves: it filters whatever drives.
        s.push("starts_with(t.id, $_)", [text(prefix)]);
    }
    s
}

/// The ids from a prefix to its upper bound in byte order (`COLLATE "C"`,
/// whatever the database's collation), on `tasks_id_bytes`.
const ID_PREFIX_RANGE: &str = "(id COLLATE \"C\") >= $_ AND (id COLLATE \"C\") < $_";

/// The index a listing or count of `filter` reads first: its first tag's
/// when it has tags (walked in order, it needs no sort however many match);
/// else a time range's, when that range matches fewer than `sparse` tasks;
/// else the newest-first walk.
async fn driver(conn: &mut PgConnection, n: &Names, filter: &TaskFilter, sparse: u32) -> Result<Driver> {
    if filter.at_risk {
        return Ok(Driver::Newest);
    }
    if !filter.tags.is_empty() {
        return Ok(Driver::Tag);
    }
    if sparse == 0 {
        return Ok(Driver::Newest);
    }
    let mut best = (Driver::Newest, i64::from(sparse));
    for candidate in [Driver::Ended, Driver::Created, Driver::IdPrefix] {
        let applies = match candidate {
            Driver::Ended => filter.ended.is_set(),
            Driver::Created => filter.created.is_set(),
            _ => filter.id_prefix.is_some(),
        };
        if !applies {
            continue;
        }
        let only = TaskFilter {
            ended: if candidate == Driver::Ended { filter.ended } else { TimeRange::default() },
            created: if candidate == Driver::Created { filter.created } else { TimeRange::default() },
            id_prefix: if candidate == Driver::IdPrefix { filter.id_prefix.clone() } else { None },
            ..TaskFilter::default()
        };
        let s = selection(&only, candidate);
        let text = n.qualify(&format!("SELECT count(*) FROM (SELECT 1 FROM {} LIMIT {sparse}) AS probe", s.from));
        let matches: i64 = s.query(n.raw(&text)).fetch_one(&mut *conn).await?.try_get(0)?;
        if matches < best.1 {
            best = (candidate, matches);
        }
    }
    Ok(best.0)
}

/// Tasks matching `filter`, newest first (by `created_seq`); `before` is a
/// range on the same column.
pub(crate) async fn list_tasks(conn: &mut PgConnection, n: &Names, filter: &TaskFilter, sparse: u32) -> Result<Vec<Task>> {
    let (text, s) = listing(filter, driver(conn, n, filter, sparse).await?);
    let rows = s.query(n.raw(&n.qualify(&text))).fetch_all(&mut *conn).await?;
    rows.iter().map(task_from).collect()
}

/// The statement of a page of `filter` read through `driver`, and its values.
fn listing(filter: &TaskFilter, driver: Driver) -> (String, Selection) {
    let mut s = selection(filter, driver);
    if let Some(before) = &filter.before {
        let condition = format!("{} < (SELECT created_seq FROM rota.tasks WHERE id = $_)", s.order);
        s.push(&condition, [text(before.as_str())]);
    }
    s.values.push(Bind::Int(i64::from(filter.limit)));
    let page = format!("{} {} ORDER BY {} DESC LIMIT ${}", s.from, s.where_clause(), s.order, s.values.len());
    let text = if driver == Driver::Newest && keys_only(filter) {
        // The page's keys from the index of the equality columns alone
        // (an index-only walk), then their rows. Asked for the rows at
        // once, a generic plan guesses from the columns' distinct values
        // that matches are common and walks every task newest first,
        // testing each: a rare pair (one workflow's compensated tasks)
        // cost 14,000 rows and 10 ms a page on a million tasks, 0.2 ms so.
        format!("SELECT o.* FROM rota.tasks AS o WHERE o.created_seq IN (SELECT t.created_seq FROM {page}) ORDER BY o.created_seq DESC")
    } else {
        format!("SELECT t.* FROM {page}")
    };
    (text, s)
}

/// Whether `filter` names only columns that lead an index ending with
/// `created_seq` (`tasks_workflow_state`, `tasks_state`, `tasks_workflow`,
/// `tasks_locked_by`, `tasks_submitter`), at least one of them.
fn keys_only(filter: &TaskFilter) -> bool {
    // Every field named, so that a new condition is considered here.
    let TaskFilter { state, workflow, locked_by, submitter, tags, created, ended, id_prefix, at_risk, parent, before: _, limit: _ } =
        filter;
    let plain = tags.is_empty() && !created.is_set() && !ended.is_set() && id_prefix.is_none() && !at_risk && parent.is_none();
    // Exactly one of the indexes' leading column sets.
    let columns = matches!(
        (workflow.is_some() || state.is_some(), locked_by.is_some(), submitter.is_some()),
        (true, false, false) | (false, true, false) | (false, false, true)
    );
    plain && columns
}

/// See [`rota_store::Tasks::stale_children`]: the unfinished children
/// (read on `tasks_children_running`) whose parent's step no longer runs
/// the attempt that started them.
pub(crate) async fn stale_children(conn: &mut PgConnection, n: &Names, limit: u32) -> Result<Vec<TaskId>> {
    let ids: Vec<String> = sqlx::query_scalar(n.sql(
        "SELECT c.id FROM rota.tasks AS c
           LEFT JOIN rota.tasks AS p ON p.id = c.parent_id
           LEFT JOIN rota.steps AS s ON s.task_id = c.parent_id AND s.name = c.parent_step
          WHERE c.parent_id IS NOT NULL AND c.state IN ('pending', 'processing')
            AND (p.id IS NULL OR p.state NOT IN ('pending', 'processing')
                 OR s.state IS DISTINCT FROM 'running' OR s.attempt IS DISTINCT FROM c.parent_attempt)
          LIMIT $1",
    ))
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await?;
    ids.into_iter().map(|id| TaskId::new(id).map_err(|e| corrupt("task id", e))).collect()
}

/// How many tasks matching `filter` (`before` and `limit` aside) are in
/// each state, every state listed. With no condition, or a workflow only,
/// it reads one index (`tasks_state`, `tasks_workflow_state`).
pub(crate) async fn count_tasks(conn: &mut PgConnection, n: &Names, filter: &TaskFilter, sparse: u32) -> Result<Vec<(TaskState, u64)>> {
    let s = selection(filter, driver(conn, n, filter, sparse).await?);
    let text = n.qualify(&format!("SELECT t.state, count(*) FROM {} {} GROUP BY t.state", s.from, s.where_clause()));
    let rows = s.query(n.raw(&text)).fetch_all(&mut *conn).await?;
    let counted = rows
        .iter()
        .map(|row| {
            let state: String = row.try_get(0)?;
            let count: i64 = row.try_get(1)?;
            Ok((state.parse::<TaskState>().map_err(|e| corrupt("task state", e))?, u64::try_from(count).unwrap_or(0)))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(rota_store::counts_of_every_state(counted))
}

/// Claims up to `claim.max` claimable tasks in one statement that skips
/// tasks other Schedulers are claiming right now (its oldest share from
/// `tasks_claimable`, the rest from `tasks_claimable_priority`), gives each
/// claimed task with a concurrency key and no slot yet a free slot of its
/// key, and records a `Claimed` event for each.
///
/// A task with a concurrency key is a candidate when it holds a slot, or
/// when the slots its key has in use and the claimable tasks of its key
/// submitted before it, which wait without one, are fewer than its limit
/// (so a key's tasks start in submission order, and a key at its limit is
/// walked past). What decides is the slot table's primary key, not the
/// statement's snapshot: a candidate is claimed only if the insert of its
/// slot went in (`ON CONFLICT DO NOTHING` waits for a concurrent insert of
/// the same slot and gives way if it commits), or if its slot row is still
/// there when locked (`kept`: a slot freed meanwhile is not kept). So no
/// two tasks ever hold one slot, whatever the claims' snapshots saw.
///
/// The claim commits asynchronously (`synchronous_commit` off for its own
/// transaction, as a receive's): its holder acts on a task only through
/// later commits of this database, and a synchronous commit flushes the
/// WAL up to its own record, past the claim's. So the start waits for one
/// flush instead of two, and a claim lost in a server crash takes nothing
/// with it that anyone acted on.
pub(crate) async fn claim_tasks(
    conn: &mut PgConnection,
    n: &Names,
    owner: &InstanceId,
    lease: Duration,
    claim: Claim,
    now: Timestamp,
) -> Result<Vec<TaskRecord>> {
    // One statement: the claim, its slots, and a `claimed` event per task
    // (the writer's lock taken before any seq is drawn, as in every event
    // writer).
    let rows = sqlx::query(n.sql(
        "WITH writer AS (
             SELECT pg_advisory_xact_lock_shared($5 + (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM rota.event_seq))),
         oldest AS MATERIALIZED (
             SELECT id FROM rota.tasks
              WHERE state IN ('pending', 'compensating') AND locked_by IS NULL AND NOT paused AND NOT held AND not_before <= $3
                AND NOT EXISTS (SELECT 1 FROM rota.workflow_pauses p WHERE p.name = rota.tasks.workflow AND p.paused)
                AND (concurrency_key IS NULL
                     OR EXISTS (SELECT 1 FROM rota.concurrency_slots s WHERE s.task_id = rota.tasks.id)
                     OR (SELECT count(*) FROM rota.concurrency_slots s
                          WHERE s.workflow = rota.tasks.workflow AND s.key = rota.tasks.concurrency_key) < concurrency_limit
                    AND (SELECT count(*) FROM rota.concurrency_slots s
                          WHERE s.workflow = rota.tasks.workflow AND s.key = rota.tasks.concurrency_key)
                      + (SELECT count(*) FROM (
                           SELECT 1 FROM rota.tasks AS w
                            WHERE w.workflow = rota.tasks.workflow AND w.concurrency_key = rota.tasks.concurrency_key
                              AND w.state IN ('pending', 'compensating') AND w.locked_by IS NULL AND NOT w.paused
                              AND w.not_before <= $3
                              AND (w.not_before, w.created_seq) < (rota.tasks.not_before, rota.tasks.created_seq)
                              AND NOT EXISTS (SELECT 1 FROM rota.concurrency_slots s WHERE s.task_id = w.id)
                            LIMIT rota.tasks.concurrency_limit) AS older)
                      < concurrency_limit)
              ORDER BY not_before LIMIT $6
              FOR UPDATE SKIP LOCKED),
         ranked AS MATERIALIZED (
             SELECT id FROM rota.tasks
              WHERE state IN ('pending', 'compensating') AND locked_by IS NULL AND NOT paused AND NOT held AND not_before <= $3
                AND NOT EXISTS (SELECT 1 FROM rota.workflow_pauses p WHERE p.name = rota.tasks.workflow AND p.paused)
                AND (concurrency_key IS NULL
                     OR EXISTS (SELECT 1 FROM rota.concurrency_slots s WHERE s.task_id = rota.tasks.id)
                     OR (SELECT count(*) FROM rota.concurrency_slots s
                          WHERE s.workflow = rota.tasks.workflow AND s.key = rota.tasks.concurrency_key) < concurrency_limit
                    AND (SELECT count(*) FROM rota.concurrency_slots s
                          WHERE s.workflow = rota.tasks.workflow AND s.key = rota.tasks.concurrency_key)
                      + (SELECT count(*) FROM (
                           SELECT 1 FROM rota.tasks AS w
                            WHERE w.workflow = rota.tasks.workflow AND w.concurrency_key = rota.tasks.concurrency_key
                              AND w.state IN ('pending', 'compensating') AND w.locked_by IS NULL AND NOT w.paused
                              AND w.not_before <= $3
                              AND (w.not_before, w.created_seq) < (rota.tasks.not_before, rota.tasks.created_seq)
                              AND NOT EXISTS (SELECT 1 FROM rota.concurrency_slots s WHERE s.task_id = w.id)
                            LIMIT rota.tasks.concurrency_limit) AS older)
                      < concurrency_limit)
                AND id NOT IN (SELECT id FROM oldest)
              ORDER BY priority DESC, not_before LIMIT $4
              FOR UPDATE SKIP LOCKED),
         picked AS MATERIALIZED (
             SELECT t.id, t.workflow, t.concurrency_key, t.concurrency_limit, t.not_before, t.created_seq
               FROM rota.tasks AS t, (SELECT set_config('synchronous_commit', 'off', true)) AS async
              WHERE t.id IN (SELECT id FROM oldest UNION ALL SELECT id FROM ranked)),
         kept AS MATERIALIZED (
             SELECT s.task_id FROM rota.concurrency_slots AS s
              WHERE s.task_id IN (SELECT id FROM picked WHERE concurrency_key IS NOT NULL)
                FOR UPDATE),
         waiting AS (
             SELECT p.*, row_number() OVER (PARTITION BY p.workflow, p.concurrency_key ORDER BY p.not_before, p.created_seq) - 1 AS nth
               FROM picked AS p
              WHERE p.concurrency_key IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM rota.concurrency_slots s WHERE s.task_id = p.id)),
         taken AS (
             INSERT INTO rota.concurrency_slots (workflow, key, slot, task_id)
             SELECT w.workflow, w.concurrency_key, free.slot, w.id
               FROM waiting AS w
                    CROSS JOIN LATERAL (
                        SELECT g AS slot FROM generate_series(0, w.concurrency_limit - 1) AS g
                         WHERE NOT EXISTS (SELECT 1 FROM rota.concurrency_slots s
                                            WHERE s.workflow = w.workflow AND s.key = w.concurrency_key AND s.slot = g)
                        OFFSET w.nth LIMIT 1) AS free
             ON CONFLICT DO NOTHING
          RETURNING task_id),
         claimed AS (
             UPDATE rota.tasks AS t
                SET state = CASE t.state WHEN 'pending' THEN 'processing' ELSE t.state END,
                    locked_by = $1, lease_epoch = t.lease_epoch + 1, complete_by = $2, updated_at = $3
               FROM picked AS p
              WHERE t.id = p.id
                AND (p.concurrency_key IS NULL OR p.id IN (SELECT task_id FROM kept) OR p.id IN (SELECT task_id FROM taken))
          RETURNING t.*),
         appended AS (
             INSERT INTO rota.events (task_id, at, kind, detail)
             SELECT c.id, $3, 'claimed', '{\"lease_epoch\":' || c.lease_epoch || ',\"owner\":' || to_json($1::text)::text || '}'
               FROM writer, claimed AS c
              ORDER BY c.not_before, c.id)
         SELECT c.*, s.task_id AS s_task_id, s.name AS s_name, s.position AS s_position, s.state AS s_state, s.attempt AS s_attempt,
                s.complete_by AS s_complete_by, s.not_before AS s_not_before, s.input AS s_input, s.output AS s_output,
                s.last_error AS s_last_error, s.updated_at AS s_updated_at, s.warn_at AS s_warn_at,
                s.callback_digest AS s_callback_digest
           FROM claimed AS c LEFT JOIN rota.steps AS s ON s.task_id = c.id
          ORDER BY c.not_before, c.id, s.position, s.name",
    ))
    .bind(owner.as_str())
    .bind(now.add(lease).as_millis())
    .bind(now.as_millis())
    .bind(i64::from(claim.by_priority_count()))
    .bind(n.event_lock_base())
    .bind(i64::from(claim.oldest_first.min(claim.max)))
    .fetch_all(&mut *conn)
    .await?;
    // In byte order of the ids, whatever the database's collation.
    let mut records = records_from(&rows)?;
    records.sort_by(|a, b| (a.task.not_before, &a.task.id).cmp(&(b.task.not_before, &b.task.id)));
    Ok(records)
}

/// The task records of rows of a task joined with its steps (`s_`
/// columns), ordered by task.
fn records_from(rows: &[PgRow]) -> Result<Vec<TaskRecord>> {
    let mut records: Vec<TaskRecord> = Vec::new();
    for row in rows {
        let id: String = row.try_get("id")?;
        if records.last().is_none_or(|r| r.task.id.as_str() != id) {
            records.push(TaskRecord { task: task_from(row)?, steps: Vec::new() });
        }
        if row.try_get::<Option<String>, _>("s_name")?.is_some() {
            let step = step_from(row, "s_")?;
            records.last_mut().expect("pushed above").steps.push(step);
        }
    }
    Ok(records)
}

/// The tasks holding a slot of `key` of `workflow`, by slot.
pub(crate) async fn key_holders(conn: &mut PgConnection, n: &Names, workflow: &WorkflowName, key: &str) -> Result<Vec<TaskId>> {
    let ids: Vec<String> =
        sqlx::query_scalar(n.sql("SELECT task_id FROM rota.concurrency_slots WHERE workflow = $1 AND key = $2 ORDER BY slot"))
            .bind(workflow.as_str())
            .bind(key)
            .fetch_all(&mut *conn)
            .await?;
    ids.into_iter().map(|id| TaskId::new(id).map_err(|e| corrupt("slot holder", e))).collect()
}

pub(crate) async fn expired(conn: &mut PgConnection, n: &Names, limit: u32, now: Timestamp) -> Result<Vec<Expired>> {
    let tasks =
        sqlx::query(n.sql("SELECT * FROM rota.tasks WHERE locked_by IS NOT NULL AND complete_by <= $1 ORDER BY complete_by LIMIT $2"))
            .bind(now.as_millis())
            .bind(i64::from(limit))
            .fetch_all(&mut *conn)
            .await?;
    let steps = sqlx::query(n.sql(
        "SELECT * FROM rota.steps WHERE complete_by IS NOT NULL AND complete_by <= $1
            AND state IN ('running', 'compensating') ORDER BY complete_by LIMIT $2",
    ))
    .bind(now.as_millis())
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await?;
    let mut found: Vec<(Timestamp, Expired)> = Vec::with_capacity(tasks.len() + steps.len());
    for row in &tasks {
        let task = task_from(row)?;
        found.push((task.complete_by.unwrap_or(now), Expired::Task(task)));
    }
    for row in &steps {
        let step = step_from(row, "")?;
        found.push((step.complete_by.unwrap_or(now), Expired::Step(step)));
    }
    found.sort_by_key(|(at, _)| *at);
    found.truncate(limit as usize);
    Ok(found.into_iter().map(|(_, e)| e).collect())
}

/// Leased tasks and running steps whose warning point has passed with no
/// warning raised, each from its partial index (`tasks_warn_due`,
/// `steps_warn_due`), earliest first.
pub(crate) async fn warnings_due(conn: &mut PgConnection, n: &Names, limit: u32, now: Timestamp) -> Result<Vec<Warning>> {
    let tasks = sqlx::query(n.sql(
        "SELECT * FROM rota.tasks WHERE warn_at IS NOT NULL AND warned_at IS NULL AND warn_at <= $1
            AND locked_by IS NOT NULL ORDER BY warn_at LIMIT $2",
    ))
    .bind(now.as_millis())
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await?;
    let steps = sqlx::query(n.sql(
        "SELECT * FROM rota.steps WHERE warn_at IS NOT NULL AND warned_attempt < attempt AND warn_at <= $1
            AND state = 'running' ORDER BY warn_at LIMIT $2",
    ))
    .bind(now.as_millis())
    .bind(i64::from(limit))
    .fetch_all(&mut *conn)
    .await?;
    let mut found = Vec::with_capacity(tasks.len() + steps.len());
    for row in &tasks {
        found.push(Warning::Task(task_from(row)?));
    }
    for row in &steps {
        found.push(Warning::Step(step_from(row, "")?));
    }
    found.sort_by_key(|w| w.warn_at());
    found.truncate(limit as usize);
    Ok(found)
}

/// Marks task $1 warned at $3 while its warning, due at $2, is live. The
/// task is found by its key alone (see `PLANNER_SETTINGS`): tasks created
/// together share a warning time.
pub(crate) const WARN_TASK_SQL: &str = "UPDATE rota.tasks SET warned_at = $3, at_risk_since = COALESCE(at_risk_since, $3)
                  WHERE id = $1 AND (warn_at = $2 AND warned_at IS NULL AND locked_by IS NOT NULL
                    AND state IN ('processing', 'compensating')) IS TRUE";

/// Raises a warning found by [`warnings_due`] (see `Tasks::raise_warning`)
/// inside the caller's transaction: the task row first, as a holder's
/// commit locks it, then the step, then the events (under the event
/// writer's lock).
pub(crate) async fn raise_warning(tx: &mut PgConnection, n: &Names, warning: &Warning, events: &[Event], now: Timestamp) -> Result<bool> {
    let live = match warning {
        Warning::Task(task) => {
            let Some(warn_at) = task.warn_at else { return Ok(false) };
            sqlx::query(n.sql(WARN_TASK_SQL))
                .bind(task.id.as_str())
                .bind(warn_at.as_millis())
                .bind(now.as_millis())
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1
        }
        Warning::Step(step) => {
            let live = sqlx::query(n.sql(
                "UPDATE rota.tasks SET at_risk_since = COALESCE(at_risk_since, $4)
                  WHERE id = $1 AND locked_by IS NOT NULL AND state IN ('processing', 'compensating')
                    AND EXISTS (SELECT 1 FROM rota.steps WHERE task_id = $1 AND name = $2 AND attempt = $3 AND state = 'running'
                                   AND warn_at IS NOT NULL AND warned_attempt < attempt)",
            ))
            .bind(step.task_id.as_str())
            .bind(step.name.as_str())
            .bind(i64::from(step.attempt))
            .bind(now.as_millis())
            .execute(&mut *tx)
            .await?
            .rows_affected()
                == 1;
            // Marked even when its task is no longer held, so it is not due again.
            sqlx::query(n.sql(
                "UPDATE rota.steps SET warned_attempt = attempt
                  WHERE task_id = $1 AND name = $2 AND attempt = $3 AND state = 'running' AND warned_attempt < attempt",
            ))
            .bind(step.task_id.as_str())
            .bind(step.name.as_str())
            .bind(i64::from(step.attempt))
            .execute(&mut *tx)
            .await?;
            live
        }
    };
    if live && !events.is_empty() {
        sqlx::query(n.sql(
            "WITH writer AS (
                 SELECT pg_advisory_xact_lock_shared($1 + (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM rota.event_seq)))
             INSERT INTO rota.events (task_id, at, kind, step, attempt, detail)
             SELECT e.task_id, e.at, e.kind, e.step, e.attempt, e.detail
               FROM writer, unnest($2::text[], $3::bigint[], $4::text[], $5::text[], $6::bigint[], $7::text[])
                    WITH ORDINALITY AS e(task_id, at, kind, step, attempt, detail, position)
              ORDER BY e.position",
        ))
        .bind(n.event_lock_base())
        .bind(events.iter().map(|e| e.task_id.as_str()).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.at.as_millis()).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.step.as_ref().map(StepName::as_str)).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.attempt.map(i64::from)).collect::<Vec<_>>())
        .bind(events.iter().map(|e| json_text(&e.detail)).collect::<Vec<_>>())
        .execute(&mut *tx)
        .await?;
    }
    Ok(live)
}

pub(crate) fn event_from(row: &PgRow) -> Result<Event> {
    let kind: String = row.try_get("kind")?;
    Ok(Event {
        seq: row.try_get("seq")?,
        task_id: TaskId::new(row.try_get::<String, _>("task_id")?).map_err(|e| corrupt("event task id", e))?,
        at: Timestamp::from_millis(row.try_get("at")?),
        kind: EventKind::parse(&kind).ok_or_else(|| corrupt("event kind", &kind))?,
        step: row.try_get::<Option<String>, _>("step")?.map(StepName::new).transpose().map_err(|e| corrupt("event step", e))?,
        attempt: row.try_get::<Option<i64>, _>("attempt")?.map(count),
        detail: parse_json("event detail", row.try_get("detail")?)?,
        hash: row.try_get::<Option<Vec<u8>>, _>("hash")?.map(|hash| chain::hex(&hash)),
    })
}

pub(crate) async fn history(conn: &mut PgConnection, n: &Names, id: &TaskId) -> Result<Vec<Event>> {
    let rows =
        sqlx::query(n.sql("SELECT * FROM rota.events WHERE task_id = $1 ORDER BY seq")).bind(id.as_str()).fetch_all(&mut *conn).await?;
    rows.iter().map(event_from).collect()
}

/// The highest event seq at or below which every event is settled: committed
/// for good or never to appear. Sequence values are drawn at insert time but
/// become visible at commit, so a reader paging by seq could otherwise pass a
/// low seq whose transaction commits later, and never see it.
///
/// Every event writer first takes a shared advisory lock whose key carries
/// the sequence's value before it draws (so all its seqs are above the key),
/// held until it ends. Read the sequence's last value first, then the lowest
/// key held: any writer not holding its lock yet will draw above the value
/// read, and every writer holding one writes only above its key.
pub(crate) async fn events_settled_through(conn: &mut PgConnection, n: &Names) -> Result<i64> {
    let handed_out: i64 = sqlx::query_scalar(n.sql("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM rota.event_seq"))
        .fetch_one(&mut *conn)
        .await?;
    let lowest_writer: Option<i64> = sqlx::query_scalar(
        "SELECT MIN(((l.classid::bigint << 32) | l.objid::bigint) - $1)
           FROM pg_locks AS l
          WHERE l.locktype = 'advisory' AND l.objsubid = 1
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND ((l.classid::bigint << 32) | l.objid::bigint) BETWEEN $1 AND $1 + $2",
    )
    .bind(n.event_lock_base())
    .bind(Names::event_lock_span())
    .fetch_one(&mut *conn)
    .await?;
    Ok(lowest_writer.map_or(handed_out, |lowest| lowest.min(handed_out)))
}

/// The `limit` newest events, highest seq first, settled or not.
pub(crate) async fn latest_events(conn: &mut PgConnection, n: &Names, limit: u32) -> Result<Vec<Event>> {
    let rows =
        sqlx::query(n.sql("SELECT * FROM rota.events ORDER BY seq DESC LIMIT $1")).bind(i64::from(limit)).fetch_all(&mut *conn).await?;
    rows.iter().map(event_from).collect()
}

pub(crate) async fn events_after(conn: &mut PgConnection, n: &Names, after: i64, limit: u32) -> Result<Vec<Event>> {
    let settled = events_settled_through(conn, n).await?;
    let rows = sqlx::query(n.sql("SELECT * FROM rota.events WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3"))
        .bind(after)
        .bind(settled)
        .bind(i64::from(limit))
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(event_from).collect()
}

/// Takes the named lease if it is free, expired, or already `holder`'s.
pub(crate) async fn acquire_leader(
    conn: &mut PgConnection,
    n: &Names,
    name: &str,
    holder: &InstanceId,
    ttl: Duration,
    now: Timestamp,
) -> Result<Option<LeaderLease>> {
    let row: Option<(i64, i64)> = sqlx::query_as(n.sql(
        "INSERT INTO rota.leaders AS l (name, holder, until, epoch) VALUES ($1, $2, $3, 1)
         ON CONFLICT (name) DO UPDATE
            SET epoch = CASE WHEN l.holder = excluded.holder THEN l.epoch ELSE l.epoch + 1 END,
                holder = excluded.holder, until = excluded.until
          WHERE l.holder = excluded.holder OR l.until <= $4
      RETURNING until, epoch",
    ))
    .bind(name)
    .bind(holder.as_str())
    .bind(now.add(ttl).as_millis())
    .bind(now.as_millis())
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|(until, epoch)| LeaderLease {
        name: name.to_owned(),
        holder: holder.clone(),
        until: Timestamp::from_millis(until),
        epoch: epoch as u64,
    }))
}

/// The named lease if it runs past `now`.
pub(crate) async fn leader(conn: &mut PgConnection, n: &Names, name: &str, now: Timestamp) -> Result<Option<LeaderLease>> {
    let row: Option<(String, i64, i64)> =
        sqlx::query_as(n.sql("SELECT holder, until, epoch FROM rota.leaders WHERE name = $1 AND until > $2"))
            .bind(name)
            .bind(now.as_millis())
            .fetch_optional(&mut *conn)
            .await?;
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

pub(crate) async fn release_leader(conn: &mut PgConnection, n: &Names, name: &str, holder: &InstanceId, now: Timestamp) -> Result<()> {
    sqlx::query(n.sql("UPDATE rota.leaders SET until = $3 WHERE name = $1 AND holder = $2"))
        .bind(name)
        .bind(holder.as_str())
        .bind(now.as_millis())
        .execute(&mut *conn)
        .await?;
    Ok(())
}

pub(crate) async fn register_workflow(
    conn: &mut PgConnection,
    n: &Names,
    name: &WorkflowName,
    version: u32,
    definition: &Value,
    now: Timestamp,
) -> Result<()> {
    sqlx::query(n.sql(
        "INSERT INTO rota.workflows (name, version, definition, registered_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (name, version) DO NOTHING",
    ))
    .bind(name.as_str())
    .bind(i64::from(version))
    .bind(json_text(definition))
    .bind(now.as_millis())
    .execute(&mut *conn)
    .await?;
    let stored: String = sqlx::query_scalar(n.sql("SELECT definition FROM rota.workflows WHERE name = $1 AND version = $2"))
        .bind(name.as_str())
        .bind(i64::from(version))
        .fetch_one(&mut *conn)
        .await?;
    if parse_json("workflow definition", stored)? != *definition {
        return Err(Error::Conflict(format!(
            "workflow {name} version {version} is already registered with a different definition (versions are immutable: bump the version)"
        ))
        .into());
    }
    Ok(())
}

fn workflow_from(row: &PgRow) -> Result<WorkflowEntry> {
    Ok(WorkflowEntry {
        name: WorkflowName::new(row.try_get::<String, _>("name")?).map_err(|e| corrupt("workflow name", e))?,
        version: count(row.try_get("version")?),
        definition: parse_json("workflow definition", row.try_get("definition")?)?,
        registered_at: Timestamp::from_millis(row.try_get("registered_at")?),
    })
}

pub(crate) async fn workflow(
    conn: &mut PgConnection,
    n: &Names,
    name: &WorkflowName,
    version: Option<u32>,
) -> Result<Option<WorkflowEntry>> {
    let row = sqlx::query(
        n.sql("SELECT * FROM rota.workflows WHERE name = $1 AND ($2::bigint IS NULL OR version = $2) ORDER BY version DESC LIMIT 1"),
    )
    .bind(name.as_str())
    .bind(version.map(i64::from))
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(workflow_from).transpose()
}

pub(crate) async fn workflows(conn: &mut PgConnection, n: &Names) -> Result<Vec<WorkflowEntry>> {
    let rows = sqlx::query(n.sql(
        "SELECT * FROM (SELECT DISTINCT ON (name) * FROM rota.workflows ORDER BY name, version DESC) AS latest ORDER BY name COLLATE \"C\"",
    ))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter().map(workflow_from).collect()
}

/// A workflow's pause or resume, fenced on its paused state: a pause
/// inserts or updates a row that is not paused, a resume updates one that
/// is; nothing matched is a `Conflict`.
pub(crate) async fn set_workflow_paused(conn: &mut PgConnection, n: &Names, change: &WorkflowPause) -> Result<()> {
    let sql = if change.paused {
        "INSERT INTO rota.workflow_pauses AS w (name, paused, changed_by, reason, changed_at) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, changed_by = excluded.changed_by,
                                          reason = excluded.reason, changed_at = excluded.changed_at
          WHERE NOT w.paused"
    } else {
        "UPDATE rota.workflow_pauses SET paused = $2, changed_by = $3, reason = $4, changed_at = $5 WHERE name = $1 AND paused"
    };
    let mut tx = conn.begin().await?;
    let changed = sqlx::query(n.sql(sql))
        .bind(change.workflow.as_str())
        .bind(change.paused)
        .bind(&change.by)
        .bind(&change.reason)
        .bind(change.at.as_millis())
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if changed == 0 {
        let already = if change.paused { "paused" } else { "not paused" };
        return Err(Error::Conflict(format!("workflow {} is {already}", change.workflow)).into());
    }
    // Hold or release its tasks, so that claims need not walk past them.
    let hold = if change.paused {
        "UPDATE rota.tasks SET held = true WHERE workflow = $1 AND state IN ('pending', 'processing', 'compensating') AND NOT held"
    } else {
        "UPDATE rota.tasks SET held = false WHERE workflow = $1 AND held"
    };
    sqlx::query(n.sql(hold)).bind(change.workflow.as_str()).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(())
}

pub(crate) async fn workflow_pauses(conn: &mut PgConnection, n: &Names) -> Result<Vec<WorkflowPause>> {
    let rows = sqlx::query(n.sql("SELECT * FROM rota.workflow_pauses ORDER BY name COLLATE \"C\"")).fetch_all(&mut *conn).await?;
    rows.iter()
        .map(|row| {
            Ok(WorkflowPause {
                workflow: WorkflowName::new(row.try_get::<String, _>("name")?).map_err(|e| corrupt("workflow name", e))?,
                paused: row.try_get("paused")?,
                by: row.try_get("changed_by")?,
                reason: row.try_get("reason")?,
                at: Timestamp::from_millis(row.try_get("changed_at")?),
            })
        })
        .collect()
}

pub(crate) async fn alerts(conn: &mut PgConnection, n: &Names, limit: u32) -> Result<Vec<Event>> {
    let rows = sqlx::query(n.sql("SELECT * FROM rota.events WHERE kind = 'alert' ORDER BY seq DESC LIMIT $1"))
        .bind(i64::from(limit))
        .fetch_all(&mut *conn)
        .await?;
    rows.iter().map(event_from).collect()
}

pub(crate) async fn report_status(conn: &mut PgConnection, n: &Names, key: &str, value: &Value, now: Timestamp) -> Result<()> {
    sqlx::query(n.sql(
        "INSERT INTO rota.statuses (key, value, reported_at) VALUES ($1, $2, $3)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value, reported_at = excluded.reported_at",
    ))
    .bind(key)
    .bind(json_text(value))
    .bind(now.as_millis())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub(crate) async fn statuses(conn: &mut PgConnection, n: &Names, prefix: &str) -> Result<Vec<ComponentStatus>> {
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        n.sql("SELECT key, value, reported_at FROM rota.statuses WHERE left(key, length($1)) = $1 ORDER BY key COLLATE \"C\""),
    )
    .bind(prefix)
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter()
        .map(|(key, value, at)| Ok(ComponentStatus { key, value: parse_json("status", value)?, reported_at: Timestamp::from_millis(at) }))
        .collect()
}

/// One take of a rate limit: the GCRA rule of `rota_model::rate` as one
/// upsert. The conflicting row is locked by the upsert, so concurrent takers
/// each see the one before; it writes only when the start is within the wait.
pub(crate) async fn take_rate_slot(conn: &mut PgConnection, n: &Names, request: &RateRequest, now: Timestamp) -> Result<RateSlot> {
    let (now_us, interval_us, tolerance_us, wait_us) = request.micros(now);
    let taken: Option<i64> = sqlx::query_scalar(n.sql(
        "INSERT INTO rota.rate_limits AS r (key, tat_us) VALUES ($1, $2 + $3)
         ON CONFLICT (key) DO UPDATE SET tat_us = GREATEST(r.tat_us, $2) + $3
         WHERE GREATEST(r.tat_us, $2) + $3 - $4 - $2 <= $5
         RETURNING tat_us",
    ))
    .bind(&request.key)
    .bind(now_us)
    .bind(interval_us)
    .bind(tolerance_us)
    .bind(wait_us)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(tat_us) = taken {
        return Ok(request.granted(tat_us, now));
    }
    let stored: Option<i64> = sqlx::query_scalar(n.sql("SELECT tat_us FROM rota.rate_limits WHERE key = $1"))
        .bind(&request.key)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(request.refused(stored, now))
}

type BreakerColumns = (String, String, i32, Option<i64>, Option<String>, Option<i64>, i64);
/// A breaker's row and whether an ask took its probe lease.
type BreakerAsked = (String, String, i32, Option<i64>, Option<String>, Option<i64>, i64, bool);

fn shared_breaker(columns: BreakerColumns) -> Result<SharedBreaker> {
    let (key, state, failures, open_until, probe_holder, probe_until, updated_at) = columns;
    Ok(SharedBreaker {
        key,
        state: SharedBreakerState::parse(&state)?,
        consecutive_failures: u32::try_from(failures).map_err(|e| Error::Backend(format!("stored breaker failures are invalid: {e}")))?,
        open_until: open_until.map(Timestamp::from_millis),
        probe_holder,
        probe_until: probe_until.map(Timestamp::from_millis),
        updated_at: Timestamp::from_millis(updated_at),
    })
}

/// One ask of a shared breaker as one statement: the row as the statement
/// found it, beside whether its compare-and-set update took the probe
/// lease. The update locks the row, so of concurrent asks one takes a free
/// lease and the others, re-checking the row after the winner commits,
/// find it taken.
pub(crate) async fn admit_breaker(
    conn: &mut PgConnection,
    n: &Names,
    ask: &BreakerAsk,
    now: Timestamp,
) -> Result<(BreakerAdmission, Option<SharedBreaker>)> {
    let row: Option<BreakerAsked> = sqlx::query_as(n.sql(
        "WITH before AS (
             SELECT key, state, consecutive_failures, open_until, probe_holder, probe_until, updated_at
             FROM rota.breakers WHERE key = $1
         ), taken AS (
             UPDATE rota.breakers SET state = 'half_open', probe_holder = $2, probe_until = $3 + $4, updated_at = $3
             WHERE key = $1 AND state <> 'closed' AND coalesce(open_until, 0) <= $3
               AND (probe_holder IS NULL OR coalesce(probe_until, 0) <= $3)
             RETURNING key
         )
         SELECT b.*, EXISTS (SELECT 1 FROM taken) FROM before b",
    ))
    .bind(&ask.key)
    .bind(&ask.holder)
    .bind(now.as_millis())
    .bind(breaker::lease_ms(ask.probe_lease))
    .fetch_optional(&mut *conn)
    .await?;
    let Some((key, state, failures, open_until, probe_holder, probe_until, updated_at, took)) = row else {
        return Ok((BreakerAdmission::Go, None));
    };
    let before = shared_breaker((key, state, failures, open_until, probe_holder, probe_until, updated_at))?;
    let admission = ask.answer(Some(&before), took, now);
    let after = if took {
        SharedBreaker {
            state: SharedBreakerState::HalfOpen,
            probe_holder: Some(ask.holder.clone()),
            probe_until: Some(now + ask.probe_lease),
            updated_at: now,
            ..before
        }
    } else {
        before
    };
    Ok((admission, after.into()))
}

/// How a report moves a breaker's row, the same for the failure's upsert
/// and the other reports' update: $2 the holder, $3 whether the call was
/// the probe, $4 the result (0 success, 1 failure, 2 abandoned), $5
/// failures_to_open, $6 now, $7 open_for (ms). `$3 AND b.probe_holder =
/// $2`: the report is the current probe's result.
macro_rules! breaker_report_set {
    () => {
        "consecutive_failures = CASE
           WHEN $4 = 1 AND b.state = 'closed' THEN b.consecutive_failures + 1
           WHEN $4 = 0 AND (b.state = 'closed' OR ($3 AND b.probe_holder = $2)) THEN 0
           ELSE b.consecutive_failures END,
         state = CASE
           WHEN $4 = 1 AND ((b.state = 'closed' AND b.consecutive_failures + 1 >= $5) OR ($3 AND b.probe_holder = $2)) THEN 'open'
           WHEN $4 = 0 AND $3 AND b.probe_holder = $2 THEN 'closed'
           ELSE b.state END,
         open_until = CASE
           WHEN $4 = 1 AND ((b.state = 'closed' AND b.consecutive_failures + 1 >= $5) OR ($3 AND b.probe_holder = $2)) THEN $6 + $7
           WHEN $4 = 0 AND $3 AND b.probe_holder = $2 THEN NULL
           ELSE b.open_until END,
         probe_holder = CASE WHEN $3 AND b.probe_holder = $2 THEN NULL ELSE b.probe_holder END,
         probe_until = CASE WHEN $3 AND b.probe_holder = $2 THEN NULL ELSE b.probe_until END,
         updated_at = $6"
    };
}

/// One report to a shared breaker, as one statement: a failure's upsert
/// (only a failure creates a row; the conflicting row is locked, so
/// failures reported at once from several processes all add up), or an
/// update of the row.
pub(crate) async fn report_breaker(
    conn: &mut PgConnection,
    n: &Names,
    report: &BreakerReport,
    now: Timestamp,
) -> Result<Option<SharedBreaker>> {
    let (kind, sql): (i64, &'static str) = match report.result {
        BreakerResult::Failure => (
            1,
            concat!(
                "INSERT INTO rota.breakers AS b (key, state, consecutive_failures, open_until, probe_holder, probe_until, updated_at)
                 VALUES ($1, CASE WHEN $5 <= 1 THEN 'open' ELSE 'closed' END, 1, CASE WHEN $5 <= 1 THEN $6 + $7 END, NULL, NULL, $6)
                 ON CONFLICT (key) DO UPDATE SET ",
                breaker_report_set!(),
                " RETURNING b.key, b.state, b.consecutive_failures, b.open_until, b.probe_holder, b.probe_until, b.updated_at"
            ),
        ),
        BreakerResult::Success | BreakerResult::Abandoned => (
            if report.result == BreakerResult::Success { 0 } else { 2 },
            concat!(
                "UPDATE rota.breakers AS b SET ",
                breaker_report_set!(),
                " WHERE b.key = $1
                 RETURNING b.key, b.state, b.consecutive_failures, b.open_until, b.probe_holder, b.probe_until, b.updated_at"
            ),
        ),
    };
    let columns: Option<BreakerColumns> = sqlx::query_as(n.sql(sql))
        .bind(&report.key)
        .bind(&report.holder)
        .bind(report.probe)
        .bind(kind)
        .bind(i64::from(report.failures_to_open))
        .bind(now.as_millis())
        .bind(report.open_for_ms())
        .fetch_optional(&mut *conn)
        .await?;
    columns.map(shared_breaker).transpose()
}

pub(crate) async fn shared_breakers(conn: &mut PgConnection, n: &Names) -> Result<Vec<SharedBreaker>> {
    let rows: Vec<BreakerColumns> = sqlx::query_as(
        n.sql("SELECT key, state, consecutive_failures, open_until, probe_holder, probe_until, updated_at FROM rota.breakers ORDER BY key"),
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter().map(shared_breaker).collect()
}

pub(crate) async fn delete_rate_limits(conn: &mut PgConnection, n: &Names, before: Timestamp) -> Result<u64> {
    let done = sqlx::query(n.sql("DELETE FROM rota.rate_limits WHERE tat_us < $1"))
        .bind(before.as_millis().saturating_mul(1_000))
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected())
}

pub(crate) async fn delete_shared_breakers(conn: &mut PgConnection, n: &Names, before: Timestamp) -> Result<u64> {
    let done = sqlx::query(
        n.sql("DELETE FROM rota.breakers WHERE updated_at < $1 AND coalesce(open_until, 0) < $1 AND coalesce(probe_until, 0) < $1"),
    )
    .bind(before.as_millis())
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rota_model::SystemClock;

    use super::*;

    /// The plan of a page of `filter` read through `driver`, on a store
    /// of the current schema.
    async fn plan(filter: &TaskFilter, driver: Driver) -> Option<String> {
        let schema = rota_testkit::postgres::TestSchema::new("listing plans on PostgreSQL")?;
        let mut config = crate::Config::new(schema.url.clone());
        config.schema = schema.name.clone();
        crate::PgStore::open(config.clone(), Arc::new(SystemClock)).await.unwrap();
        let mut conn = PgConnection::connect_with(&config.connect_options().unwrap()).await.unwrap();
        let names = Names::new(&schema.name);
        let (text, s) = listing(filter, driver);
        let explain = names.raw(&format!("EXPLAIN {}", names.qualify(&text)));
        let rows = s.query(explain).fetch_all(&mut conn).await.unwrap();
        Some(rows.iter().map(|row| row.get::<String, _>(0)).collect::<Vec<_>>().join("\n"))
    }

    /// A paused workflow's unfinished tasks, those created during the pause
    /// too, are out of the claim indexes until the resume, so that claims
    /// do not walk them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paused_workflows_tasks_are_out_of_the_claim_indexes() {
        use rota_store::{NewTask, Tasks};
        let Some(schema) = rota_testkit::postgres::TestSchema::new("held tasks on PostgreSQL") else { return };
        let mut config = crate::Config::new(schema.url.clone());
        config.schema = schema.name.clone();
        let store = crate::PgStore::open(config.clone(), Arc::new(SystemClock)).await.unwrap();
        let mut conn = PgConnection::connect_with(&config.connect_options().unwrap()).await.unwrap();
        let names = Names::new(&schema.name);
        let workflow = WorkflowName::new("refunds").unwrap();
        let now = Timestamp::from_millis(1_000_000);
        let create = |name: &str| {
            let task = Task::new(TaskId::new(name).unwrap(), workflow.clone(), 1, serde_json::json!({}), now);
            store.create_task(NewTask { task, steps: Vec::new(), messages: Vec::new(), events: Vec::new() })
        };
        // What the claim indexes hold of the workflow: their condition.
        let in_claim_indexes = "SELECT count(*) FROM rota.tasks
                                 WHERE workflow = 'refunds' AND state IN ('pending', 'compensating') AND locked_by IS NULL
                                   AND NOT paused AND NOT held";
        let mut claimable = async || sqlx::query_scalar::<_, i64>(names.sql(in_claim_indexes)).fetch_one(&mut conn).await.unwrap();

        create("before").await.unwrap();
        let pause = WorkflowPause { workflow: workflow.clone(), paused: true, by: "ann".into(), reason: None, at: now };
        store.set_workflow_paused(&pause).await.unwrap();
        create("during").await.unwrap();
        assert_eq!(claimable().await, 0, "paused, its tasks are held");
        store.set_workflow_paused(&WorkflowPause { paused: false, ..pause }).await.unwrap();
        assert_eq!(claimable().await, 2, "resumed, its tasks are back, those created during the pause too");
    }

    /// A listing by id prefix reads the ids' byte-order index: the primary
    /// key's index follows the database's collation and cannot serve it,
    /// and with no index the listing reads every task (2 s on a million).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_id_prefix_listing_reads_the_ids_in_byte_order() {
        let filter = TaskFilter { id_prefix: Some("order-17".into()), state: Some(TaskState::Error), ..TaskFilter::default() };
        let Some(plan) = plan(&filter, Driver::IdPrefix).await else { return };
        assert!(plan.contains("tasks_id_bytes"), "{plan}");
        assert!(!plan.contains("Seq Scan"), "{plan}");
    }

    /// A listing by workflow and state walks their index for the page's
    /// keys, never every task newest first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listing_by_workflow_and_state_walks_their_index() {
        let filter = TaskFilter {
            workflow: Some(WorkflowName::new("reports").unwrap()),
            state: Some(TaskState::Compensated),
            before: Some(TaskId::new("fill-0500000").unwrap()),
            limit: 50,
            ..TaskFilter::default()
        };
        let Some(plan) = plan(&filter, Driver::Newest).await else { return };
        assert!(plan.contains("Index Only Scan Backward using tasks_workflow_state"), "{plan}");
        assert!(!plan.contains("Backward using tasks_created_seq_key"), "{plan}");
    }
}
