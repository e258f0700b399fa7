//! The schema, as embedded migrations. Every table lives in the store's own
//! PostgreSQL schema (`rota` by default), so several stores can share one
//! database. `migrations` records which have run; each runs once, in order,
//! in one transaction that holds an advisory lock, so that processes
//! starting together never run a migration twice.

use sqlx::{Connection, PgConnection};

use crate::sql::Names;

/// The migrations, in order. `rota.` stands for the store's schema. Never
/// edit one that has shipped: add another.
pub(crate) const MIGRATIONS: &[&str] = &[
    r#"
-- Queues. `id` keeps message rows small and their index keys short.
CREATE TABLE rota.queues (
    id               BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name             TEXT    NOT NULL UNIQUE,
    lease_ms         BIGINT  NOT NULL,
    deliveries_max   BIGINT  NOT NULL,
    dedupe_window_ms BIGINT  NOT NULL,
    paused           BOOLEAN NOT NULL DEFAULT false,
    created_at       BIGINT  NOT NULL
);

-- Live messages. A message is visible when visible_at <= now. Receiving it
-- sets lease_until and moves visible_at to the same time, so an expired lease
-- makes it visible again with no extra write. Identity values are never
-- reused: a lease token (seq, epoch) never matches a later message.
CREATE TABLE rota.messages (
    seq            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id       BIGINT NOT NULL,
    id             TEXT   NOT NULL,
    body           TEXT   NOT NULL,
    ordering_key   TEXT,
    enqueued_at    BIGINT NOT NULL,
    visible_at     BIGINT NOT NULL,
    delivery_count BIGINT NOT NULL DEFAULT 0,
    lease_epoch    BIGINT NOT NULL DEFAULT 0,
    lease_owner    TEXT,
    lease_until    BIGINT,
    last_error     TEXT
);
-- The receive scan: oldest visible first, stopping after LIMIT rows.
CREATE INDEX messages_visible ON rota.messages (queue_id, visible_at, seq);
-- The head of each ordering key.
CREATE INDEX messages_ordering ON rota.messages (queue_id, ordering_key, seq) WHERE ordering_key IS NOT NULL;

-- Message ids remembered for duplicate detection until expires_at.
CREATE TABLE rota.message_ids (
    queue_id   BIGINT NOT NULL,
    id         TEXT   NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (queue_id, id)
);
CREATE INDEX message_ids_expiry ON rota.message_ids (expires_at);

CREATE TABLE rota.dead_letters (
    seq              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id         BIGINT NOT NULL,
    id               TEXT   NOT NULL,
    body             TEXT   NOT NULL,
    ordering_key     TEXT,
    enqueued_at      BIGINT NOT NULL,
    delivery_count   BIGINT NOT NULL,
    dead_lettered_at BIGINT NOT NULL,
    reason           TEXT   NOT NULL
);
CREATE INDEX dead_letters_queue ON rota.dead_letters (queue_id, seq);

-- Tasks: the pattern's state records. `created_seq` orders them by creation.
CREATE TABLE rota.tasks (
    id               TEXT   PRIMARY KEY,
    created_seq      BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    workflow         TEXT   NOT NULL,
    workflow_version BIGINT NOT NULL,
    input            TEXT   NOT NULL,
    state            TEXT   NOT NULL,
    locked_by        TEXT,
    lease_epoch      BIGINT NOT NULL,
    complete_by      BIGINT,
    not_before       BIGINT NOT NULL,
    failure_count    BIGINT NOT NULL,
    reply_to         TEXT,
    output           TEXT,
    error            TEXT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
CREATE INDEX tasks_claimable ON rota.tasks (not_before) WHERE state IN ('pending', 'compensating') AND locked_by IS NULL;
CREATE INDEX tasks_leased ON rota.tasks (complete_by) WHERE locked_by IS NOT NULL;
CREATE INDEX tasks_state ON rota.tasks (state, created_seq);
CREATE INDEX tasks_workflow ON rota.tasks (workflow, created_seq);

CREATE TABLE rota.steps (
    task_id     TEXT   NOT NULL,
    name        TEXT   NOT NULL,
    position    BIGINT NOT NULL,
    state       TEXT   NOT NULL,
    attempt     BIGINT NOT NULL,
    complete_by BIGINT,
    not_before  BIGINT NOT NULL,
    input       TEXT,
    output      TEXT,
    last_error  TEXT,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (task_id, name)
);
CREATE INDEX steps_in_flight ON rota.steps (complete_by) WHERE complete_by IS NOT NULL;

-- The append-only history of every task. `seq` comes from its own sequence
-- so that readers can find the highest value handed out (see `events_after`).
CREATE SEQUENCE rota.event_seq;
CREATE TABLE rota.events (
    seq     BIGINT PRIMARY KEY DEFAULT nextval('rota.event_seq'),
    task_id TEXT   NOT NULL,
    at      BIGINT NOT NULL,
    kind    TEXT   NOT NULL,
    step    TEXT,
    attempt BIGINT,
    detail  TEXT   NOT NULL
);
ALTER SEQUENCE rota.event_seq OWNED BY rota.events.seq;
CREATE INDEX events_task ON rota.events (task_id, seq);
-- Alerts are history events of kind 'alert'; operators list them newest first.
CREATE INDEX events_alerts ON rota.events (seq) WHERE kind = 'alert';

-- Named leases electing one holder (the Supervisor's leader election).
CREATE TABLE rota.leaders (
    name   TEXT   PRIMARY KEY,
    holder TEXT   NOT NULL,
    until  BIGINT NOT NULL,
    epoch  BIGINT NOT NULL
);

-- Workflow definitions, one row per immutable version.
CREATE TABLE rota.workflows (
    name          TEXT   NOT NULL,
    version       BIGINT NOT NULL,
    definition    TEXT   NOT NULL,
    registered_at BIGINT NOT NULL,
    PRIMARY KEY (name, version)
);

-- The last reported status of components (circuit breakers, instances).
CREATE TABLE rota.statuses (
    key         TEXT   PRIMARY KEY,
    value       TEXT   NOT NULL,
    reported_at BIGINT NOT NULL
);
"#,
    r#"
-- Fails the statement that calls it (and so rolls back everything that
-- statement wrote) unless `ok`: how a one-statement commit refuses to keep
-- its writes when a fenced write or a lease missed. SQLSTATE RT409.
CREATE FUNCTION rota.refuse_unless(ok boolean, message text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT ok THEN
        RAISE EXCEPTION USING ERRCODE = 'RT409', MESSAGE = message;
    END IF;
    RETURN true;
END
$$;
"#,
    r#"
-- Listings and counts by workflow and state together, newest first.
CREATE INDEX tasks_workflow_state ON rota.tasks (workflow, state, created_seq);
"#,
    r#"
-- Listings of the tasks one instance holds (a Scheduler's release at
-- shutdown, an operator's `locked_by=`), newest first. Held tasks are few,
-- so the index is partial; `locked_by = $1` implies the NOT NULL.
CREATE INDEX tasks_locked_by ON rota.tasks (locked_by, created_seq) WHERE locked_by IS NOT NULL;
"#,
    r#"
-- The response queue a task's status events are sent to (NULL: none).
ALTER TABLE rota.tasks ADD COLUMN reply_queue TEXT;
"#,
    r#"
-- Schedules: a definition, a paused flag and the progress of its fires
-- (every fire time up to fired_through is handled), advanced by a
-- compare-and-set on version.
CREATE TABLE rota.schedules (
    name             TEXT    PRIMARY KEY,
    workflow         TEXT    NOT NULL,
    cron             TEXT    NOT NULL,
    timezone         TEXT    NOT NULL,
    input            TEXT    NOT NULL,
    overlap          TEXT    NOT NULL,
    catch_up         TEXT    NOT NULL,
    source           TEXT    NOT NULL,
    paused           BOOLEAN NOT NULL,
    fired_through    BIGINT  NOT NULL,
    last_fire_at     BIGINT,
    last_task        TEXT,
    buffered_fire_at BIGINT,
    skipped          BIGINT  NOT NULL,
    last_skipped_at  BIGINT,
    version          BIGINT  NOT NULL,
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL
);
"#,
    r#"
-- A message's reply address and correlation id, kept through
-- dead-lettering and redrive (NULL: none).
ALTER TABLE rota.messages ADD COLUMN reply_to TEXT, ADD COLUMN correlation_id TEXT;
ALTER TABLE rota.dead_letters ADD COLUMN reply_to TEXT, ADD COLUMN correlation_id TEXT;
"#,
    r#"
-- Deadline warnings. `warn_at` is the holder's: when the current lease or
-- attempt is at risk. The rest is the Supervisor's, which holders' writes
-- never set: `warned_at` (the lease's own warning was raised),
-- `at_risk_since` (a warning of the task or a step was raised during the
-- lease; both are cleared by the write that ends the lease) and
-- `warned_attempt` (the last attempt whose warning was raised).
ALTER TABLE rota.tasks ADD COLUMN warn_at BIGINT;
ALTER TABLE rota.tasks ADD COLUMN warned_at BIGINT;
ALTER TABLE rota.tasks ADD COLUMN at_risk_since BIGINT;
ALTER TABLE rota.steps ADD COLUMN warn_at BIGINT;
ALTER TABLE rota.steps ADD COLUMN warned_attempt BIGINT NOT NULL DEFAULT 0;
-- The Supervisor's scans hold only the warnings not yet raised, and the
-- at-risk listing only the tasks at risk, newest first: all three stay small.
CREATE INDEX tasks_warn_due ON rota.tasks (warn_at) WHERE warn_at IS NOT NULL AND warned_at IS NULL;
CREATE INDEX steps_warn_due ON rota.steps (warn_at) WHERE warn_at IS NOT NULL AND warned_attempt < attempt;
CREATE INDEX tasks_at_risk ON rota.tasks (created_seq) WHERE at_risk_since IS NOT NULL AND locked_by IS NOT NULL;
"#,
    r#"
-- Retention: the finished tasks by end time (a finished task is written
-- again only by a resubmit, so `updated_at` is when it finished). Prunes
-- walk it oldest first, and it holds only finished tasks.
CREATE INDEX tasks_finished ON rota.tasks (updated_at) WHERE state IN ('processed', 'error', 'compensated', 'cancelled');
"#,
    r#"
-- Who submitted each task (NULL: not known), and the listings of one
-- submitter's tasks, newest first.
ALTER TABLE rota.tasks ADD COLUMN submitter TEXT;
CREATE INDEX tasks_submitter ON rota.tasks (submitter, created_seq) WHERE submitter IS NOT NULL;
"#,
    r#"
-- Callback steps: the SHA-256 of the current attempt's callback token
-- (NULL: none, or already used).
ALTER TABLE rota.steps ADD COLUMN callback_digest TEXT;
"#,
    r#"
-- Paused tasks (an operator's pause): not claimed until resumed. The claim
-- index leaves them out, so a store full of paused tasks costs a claim
-- nothing.
ALTER TABLE rota.tasks ADD COLUMN paused BOOLEAN NOT NULL DEFAULT false;
DROP INDEX rota.tasks_claimable;
CREATE INDEX tasks_claimable ON rota.tasks (not_before) WHERE state IN ('pending', 'compensating') AND locked_by IS NULL AND NOT paused;
"#,
    r#"
-- Search: a task's tags (a JSON object, NULL: none) and one row per tag in
-- `task_tags`, whose key ends with the task's `created_seq` so that one
-- tag's tasks are walked newest first with no sort. Listings by creation
-- time read `tasks_created`.
ALTER TABLE rota.tasks ADD COLUMN tags TEXT;
CREATE TABLE rota.task_tags (
    key         TEXT   NOT NULL,
    value       TEXT   NOT NULL,
    created_seq BIGINT NOT NULL,
    PRIMARY KEY (key, value, created_seq)
);
CREATE INDEX tasks_created ON rota.tasks (created_at);
"#,
    r#"
-- The hash chain of each task's history (see `rota_store::chain`): the
-- SHA-256 of the previous row's hash (by seq) and this row's content,
-- computed by a trigger as every statement appends rows, so no writer
-- makes an extra round trip. NULL for rows written before.
--
-- Appenders of one task are serialized on its row (the lock a fenced
-- write takes anyway; a task being created has none yet, and no one else
-- can append to it). Rows of the same statement see the ones before them.
-- A row whose seq was drawn before a row that committed first is given a
-- new seq, so that seq order stays chain order.
ALTER TABLE rota.events ADD COLUMN hash BYTEA;
CREATE FUNCTION rota.events_chain() RETURNS trigger LANGUAGE plpgsql AS $chain$
DECLARE
    previous_hash BYTEA;
    previous_seq  BIGINT;
BEGIN
    PERFORM 1 FROM rota.tasks WHERE id = NEW.task_id FOR NO KEY UPDATE;
    SELECT e.hash, e.seq INTO previous_hash, previous_seq
      FROM rota.events e WHERE e.task_id = NEW.task_id ORDER BY e.seq DESC LIMIT 1;
    IF previous_seq IS NOT NULL AND previous_seq > NEW.seq THEN
        NEW.seq := nextval('rota.event_seq');
    END IF;
    NEW.hash := sha256(COALESCE(previous_hash, ''::bytea) || convert_to(
        NEW.task_id || chr(31) || NEW.at::text || chr(31) || NEW.kind || chr(31) || COALESCE(NEW.step, '') || chr(31)
        || COALESCE(NEW.attempt::text, '') || chr(31) || NEW.detail, 'UTF8'));
    RETURN NEW;
END
$chain$;
CREATE TRIGGER events_chain BEFORE INSERT ON rota.events FOR EACH ROW EXECUTE FUNCTION rota.events_chain();
"#,
    r#"
-- Paused workflows (an operator's pause of a workflow, by name): claims
-- take none of their tasks. One row per workflow ever paused, holding the
-- latest pause or resume with who made it, when and why.
CREATE TABLE rota.workflow_pauses (
    name       TEXT    PRIMARY KEY,
    paused     BOOLEAN NOT NULL,
    changed_by TEXT    NOT NULL,
    reason     TEXT,
    changed_at BIGINT  NOT NULL
);
"#,
    r#"
-- Bulk actions: each batch, its filter (JSON), how far its walk got
-- (`cursor`: the last task handled) and the runner holding it.
CREATE TABLE rota.batches (
    id           TEXT PRIMARY KEY,
    action       TEXT NOT NULL,
    filter       TEXT NOT NULL,
    total        BIGINT NOT NULL,
    requested_by TEXT NOT NULL,
    reason       TEXT,
    state        TEXT NOT NULL,
    cursor       TEXT,
    done         BIGINT NOT NULL,
    skipped      BIGINT NOT NULL,
    failed       BIGINT NOT NULL,
    last_error   TEXT,
    locked_by    TEXT,
    lease_until  BIGINT,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL
);
CREATE INDEX batches_running ON rota.batches (created_at) WHERE state = 'running';
"#,
    r#"
-- The audit log: operator actions that have no history row, with who and
-- why. Task actions are read from the history through `events_operator`.
CREATE TABLE rota.audit (
    id     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at     BIGINT NOT NULL,
    action TEXT   NOT NULL,
    actor  TEXT   NOT NULL,
    reason TEXT,
    target TEXT   NOT NULL,
    detail TEXT   NOT NULL
);
CREATE INDEX audit_at ON rota.audit (at, id);
CREATE INDEX events_operator ON rota.events (at, seq) WHERE kind IN ('cancelled', 'resubmitted', 'paused', 'resumed', 'signal');
"#,
    r#"
-- Rate limits shared by every process: each limit's theoretical arrival
-- time (GCRA, microseconds since the epoch), moved on by one
-- compare-and-set upsert per call.
CREATE TABLE rota.rate_limits (
    key    TEXT   PRIMARY KEY,
    tat_us BIGINT NOT NULL
);
"#,
    r#"
-- Priorities: claims walk the claimable tasks highest priority first, then
-- oldest first (`tasks_claimable_priority`), beside the oldest-first walk
-- of `tasks_claimable` that takes each claim's oldest share.
ALTER TABLE rota.tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
CREATE INDEX tasks_claimable_priority ON rota.tasks (priority DESC, not_before)
    WHERE state IN ('pending', 'compensating') AND locked_by IS NULL AND NOT paused;
"#,
    r#"
-- Concurrency keys: a task of a workflow with `concurrency:` or
-- `max_in_flight:` holds one of its key's slots (0..limit) from its first
-- claim until it ends. The primary key makes a second holder of a slot
-- impossible whatever the claims' snapshots saw, and the trigger frees the
-- slot in the statement that ends the task (any statement: the holder's
-- commit, a cancel, the Supervisor's failure threshold).
ALTER TABLE rota.tasks ADD COLUMN concurrency_key TEXT, ADD COLUMN concurrency_limit INTEGER;
CREATE TABLE rota.concurrency_slots (
    workflow TEXT    NOT NULL,
    key      TEXT    NOT NULL,
    slot     INTEGER NOT NULL,
    task_id  TEXT    NOT NULL UNIQUE REFERENCES rota.tasks (id) ON DELETE CASCADE,
    PRIMARY KEY (workflow, key, slot)
);
-- The claimable tasks of each key in submission order: a claim counts those
-- older than a candidate (at most the limit of them).
CREATE INDEX tasks_concurrency_waiting ON rota.tasks (workflow, concurrency_key, not_before, created_seq)
    WHERE concurrency_key IS NOT NULL AND state IN ('pending', 'compensating') AND locked_by IS NULL AND NOT paused;
CREATE FUNCTION rota.concurrency_slot_free() RETURNS trigger LANGUAGE plpgsql AS $free$
BEGIN
    DELETE FROM rota.concurrency_slots WHERE task_id = NEW.id;
    RETURN NULL;
END
$free$;
CREATE TRIGGER concurrency_slot_free AFTER UPDATE OF state ON rota.tasks FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL AND NEW.state IN ('processed', 'error', 'cancelled', 'compensated'))
    EXECUTE FUNCTION rota.concurrency_slot_free();
"#,
    r#"
-- Circuit breakers shared by every process: one row per endpoint, moved by
-- one compare-and-set statement per ask or report. Times are epoch ms.
CREATE TABLE rota.breakers (
    key                  TEXT    PRIMARY KEY,
    state                TEXT    NOT NULL CHECK (state IN ('closed', 'open', 'half_open')),
    consecutive_failures INTEGER NOT NULL,
    open_until           BIGINT,
    probe_holder         TEXT,
    probe_until          BIGINT,
    updated_at           BIGINT  NOT NULL
);
"#,
    r#"
-- Listings by id prefix: the ids in byte order, whatever the database's
-- collation (the primary key's index follows that collation, so it cannot
-- serve a byte-order range).
CREATE INDEX tasks_id_bytes ON rota.tasks ((id COLLATE "C"));
"#,
    r#"
-- Child workflows: a task started by another task's `workflow:` step keeps
-- that parent, step and attempt, and its depth below the top-level task.
-- `tasks_parent` lists a task's children newest first;
-- `tasks_children_running` holds the unfinished ones, which the
-- Supervisor checks against their parents.
ALTER TABLE rota.tasks ADD COLUMN parent_id TEXT;
ALTER TABLE rota.tasks ADD COLUMN parent_step TEXT;
ALTER TABLE rota.tasks ADD COLUMN parent_attempt INTEGER;
ALTER TABLE rota.tasks ADD COLUMN depth INTEGER NOT NULL DEFAULT 0;
CREATE INDEX tasks_parent ON rota.tasks (parent_id, created_seq) WHERE parent_id IS NOT NULL;
CREATE INDEX tasks_children_running ON rota.tasks (parent_id)
    WHERE parent_id IS NOT NULL AND state IN ('pending', 'processing');
"#,
    r#"
-- The unfinished tasks of a paused workflow are held: the claim indexes
-- leave them out, so a paused workflow's backlog costs a claim nothing
-- (it walked every one of them). A pause marks them and a resume clears
-- them (`tasks_held`), each in the transaction that changes the pause; a
-- task created meanwhile is marked as its workflow stands, reading a
-- paused row with a share lock, so that a resume waits for it to commit
-- and then clears it. Claims still check `workflow_pauses` too.
ALTER TABLE rota.tasks ADD COLUMN held BOOLEAN NOT NULL DEFAULT false;
UPDATE rota.tasks SET held = true
 WHERE state IN ('pending', 'processing', 'compensating')
   AND workflow IN (SELECT name FROM rota.workflow_pauses WHERE paused);
DROP INDEX rota.tasks_claimable;
CREATE INDEX tasks_claimable ON rota.tasks (not_before)
    WHERE state IN ('pending', 'compensating') AND locked_by IS NULL AND NOT paused AND NOT held;
DROP INDEX rota.tasks_claimable_priority;
CREATE INDEX tasks_claimable_priority ON rota.tasks (priority DESC, not_before)
    WHERE state IN ('pending', 'compensating') AND locked_by IS NULL AND NOT paused AND NOT held;
CREATE INDEX tasks_held ON rota.tasks (workflow) WHERE held;
"#,
    r#"
-- Finished tasks by end time in a column of their own: `ended_at` is
-- `updated_at` once a task has finished, NULL before. `tasks_finished`
-- keyed on `updated_at` made every write of an unfinished task change an
-- indexed column, so none could be a heap-only update: each wrote a new
-- entry into every index of the table. Writes within a lease now change
-- no indexed column and, with room kept free on each page (fillfactor),
-- stay on their page. Adding the column rewrites the table once.
ALTER TABLE rota.tasks SET (fillfactor = 85);
ALTER TABLE rota.tasks ADD COLUMN ended_at BIGINT GENERATED ALWAYS AS
    (CASE WHEN state IN ('processed', 'error', 'compensated', 'cancelled') THEN updated_at END) STORED;
DROP INDEX rota.tasks_finished;
CREATE INDEX tasks_finished ON rota.tasks (ended_at) WHERE ended_at IS NOT NULL;
"#,
];

/// How many migrations this build knows.
pub(crate) fn version() -> i64 {
    MIGRATIONS.len() as i64
}

/// Creates the schema if needed and runs the migrations that have not run
/// yet. Returns the schema version found before and after.
pub(crate) async fn migrate(conn: &mut PgConnection, names: &Names) -> Result<(i64, i64), sqlx::Error> {
    let mut tx = conn.begin().await?;
    // One migrator at a time per schema, across every process.
    let (class, object) = names.migration_lock();
    sqlx::query("SELECT pg_advisory_xact_lock($1, $2)").bind(class).bind(object).execute(&mut *tx).await?;
    sqlx::query(names.raw(&format!("CREATE SCHEMA IF NOT EXISTS {}", names.quoted()))).execute(&mut *tx).await?;
    sqlx::query(names.raw(&format!(
        "CREATE TABLE IF NOT EXISTS {}.migrations (version BIGINT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        names.quoted()
    )))
    .execute(&mut *tx)
    .await?;
    let found: i64 = sqlx::query_scalar(names.raw(&format!("SELECT COALESCE(MAX(version), 0) FROM {}.migrations", names.quoted())))
        .fetch_one(&mut *tx)
        .await?;
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(usize::try_from(found).unwrap_or(0)) {
        sqlx::raw_sql(names.raw(&names.qualify(sql))).execute(&mut *tx).await?;
        sqlx::query(names.raw(&format!("INSERT INTO {}.migrations (version) VALUES ($1)", names.quoted())))
            .bind(index as i64 + 1)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok((found, found.max(version())))
}
