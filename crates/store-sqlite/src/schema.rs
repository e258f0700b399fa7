//! The schema, as embedded migrations. `PRAGMA user_version` records how
//! many have run; each runs once, in order, in its own transaction.

use rusqlite::Connection;

/// The migrations, in order. Never edit one that has shipped: add another.
pub(crate) const MIGRATIONS: &[&str] = &[
    r#"
-- Queues. `id` keeps message rows small and their index keys short.
CREATE TABLE queues (
    id               INTEGER PRIMARY KEY,
    name             TEXT    NOT NULL UNIQUE,
    lease_ms         INTEGER NOT NULL,
    deliveries_max   INTEGER NOT NULL,
    dedupe_window_ms INTEGER NOT NULL,
    paused           INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL
);

-- Live messages. A message is visible when visible_at <= now. Receiving it
-- sets lease_until and moves visible_at to the same time, so an expired
-- lease makes it visible again with no extra write. AUTOINCREMENT keeps
-- sequence numbers from ever being reused: a lease token (seq, epoch) must
-- never match a later message.
CREATE TABLE messages (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    queue_id       INTEGER NOT NULL,
    id             TEXT    NOT NULL,
    body           TEXT    NOT NULL,
    ordering_key   TEXT,
    enqueued_at    INTEGER NOT NULL,
    visible_at     INTEGER NOT NULL,
    delivery_count INTEGER NOT NULL DEFAULT 0,
    lease_epoch    INTEGER NOT NULL DEFAULT 0,
    lease_owner    TEXT,
    lease_until    INTEGER,
    last_error     TEXT
);
-- The receive scan: oldest visible first, stopping after LIMIT rows.
CREATE INDEX messages_visible ON messages (queue_id, visible_at, seq);
-- The head of each ordering key.
CREATE INDEX messages_ordering ON messages (queue_id, ordering_key, seq) WHERE ordering_key IS NOT NULL;
CREATE INDEX messages_id ON messages (queue_id, id);

-- Message ids remembered for duplicate detection until expires_at.
CREATE TABLE message_ids (
    queue_id   INTEGER NOT NULL,
    id         TEXT    NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (queue_id, id)
) WITHOUT ROWID;
CREATE INDEX message_ids_expiry ON message_ids (expires_at);

CREATE TABLE dead_letters (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    queue_id         INTEGER NOT NULL,
    id               TEXT    NOT NULL,
    body             TEXT    NOT NULL,
    ordering_key     TEXT,
    enqueued_at      INTEGER NOT NULL,
    delivery_count   INTEGER NOT NULL,
    dead_lettered_at INTEGER NOT NULL,
    reason           TEXT    NOT NULL
);
CREATE INDEX dead_letters_queue ON dead_letters (queue_id, seq);
CREATE INDEX dead_letters_id ON dead_letters (queue_id, id);

-- Tasks: the pattern's state records. The rowid orders them by creation.
CREATE TABLE tasks (
    id               TEXT    NOT NULL UNIQUE,
    workflow         TEXT    NOT NULL,
    workflow_version INTEGER NOT NULL,
    input            TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    locked_by        TEXT,
    lease_epoch      INTEGER NOT NULL,
    complete_by      INTEGER,
    not_before       INTEGER NOT NULL,
    failure_count    INTEGER NOT NULL,
    reply_to         TEXT,
    output           TEXT,
    error            TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);
CREATE INDEX tasks_claimable ON tasks (not_before) WHERE state IN ('pending', 'compensating') AND locked_by IS NULL;
CREATE INDEX tasks_leased ON tasks (complete_by) WHERE locked_by IS NOT NULL;
CREATE INDEX tasks_state ON tasks (state);

CREATE TABLE steps (
    task_id     TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    position    INTEGER NOT NULL,
    state       TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    complete_by INTEGER,
    not_before  INTEGER NOT NULL,
    input       TEXT,
    output      TEXT,
    last_error  TEXT,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (task_id, name)
) WITHOUT ROWID;
CREATE INDEX steps_in_flight ON steps (complete_by) WHERE complete_by IS NOT NULL;

-- The append-only history of every task.
CREATE TABLE events (
    seq     INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT    NOT NULL,
    at      INTEGER NOT NULL,
    kind    TEXT    NOT NULL,
    step    TEXT,
    attempt INTEGER,
    detail  TEXT    NOT NULL
);
CREATE INDEX events_task ON events (task_id, seq);

-- Named leases electing one holder (the Supervisor's leader election).
CREATE TABLE leaders (
    name   TEXT    PRIMARY KEY,
    holder TEXT    NOT NULL,
    until  INTEGER NOT NULL,
    epoch  INTEGER NOT NULL
);
"#,
    r#"
-- Workflow definitions, one row per immutable version.
CREATE TABLE workflows (
    name          TEXT    NOT NULL,
    version       INTEGER NOT NULL,
    definition    TEXT    NOT NULL,
    registered_at INTEGER NOT NULL,
    PRIMARY KEY (name, version)
) WITHOUT ROWID;

-- Alerts are history events of kind 'alert'; operators list them newest first.
CREATE INDEX events_alerts ON events (seq) WHERE kind = 'alert';

-- The last reported status of components (circuit breakers, instances).
CREATE TABLE statuses (
    key         TEXT    PRIMARY KEY,
    value       TEXT    NOT NULL,
    reported_at INTEGER NOT NULL
) WITHOUT ROWID;
"#,
    r#"
-- Listings by workflow, and by workflow and state, newest first: an index
-- entry ends with the rowid, so each walks its index in creation order with
-- no sort, and counts by state read only the index.
CREATE INDEX tasks_workflow ON tasks (workflow);
CREATE INDEX tasks_workflow_state ON tasks (workflow, state);
"#,
    r#"
-- Listings of the tasks one instance holds (a Scheduler's release at
-- shutdown, an operator's `locked_by=`), newest first. Held tasks are few,
-- so the index is partial; `locked_by = ?` implies the NOT NULL.
CREATE INDEX tasks_locked_by ON tasks (locked_by) WHERE locked_by IS NOT NULL;
"#,
    r#"
-- The response queue a task's status events are sent to (NULL: none).
ALTER TABLE tasks ADD COLUMN reply_queue TEXT;
"#,
    r#"
-- Schedules: a definition, a paused flag and the progress of its fires
-- (every fire time up to fired_through is handled), advanced by a
-- compare-and-set on version.
CREATE TABLE schedules (
    name             TEXT    PRIMARY KEY,
    workflow         TEXT    NOT NULL,
    cron             TEXT    NOT NULL,
    timezone         TEXT    NOT NULL,
    input            TEXT    NOT NULL,
    overlap          TEXT    NOT NULL,
    catch_up         TEXT    NOT NULL,
    source           TEXT    NOT NULL,
    paused           INTEGER NOT NULL,
    fired_through    INTEGER NOT NULL,
    last_fire_at     INTEGER,
    last_task        TEXT,
    buffered_fire_at INTEGER,
    skipped          INTEGER NOT NULL,
    last_skipped_at  INTEGER,
    version          INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
) WITHOUT ROWID;
"#,
    r#"
-- A message's reply address and correlation id, kept through
-- dead-lettering and redrive (NULL: none).
ALTER TABLE messages ADD COLUMN reply_to TEXT;
ALTER TABLE messages ADD COLUMN correlation_id TEXT;
ALTER TABLE dead_letters ADD COLUMN reply_to TEXT;
ALTER TABLE dead_letters ADD COLUMN correlation_id TEXT;
"#,
    r#"
-- Deadline warnings. `warn_at` is the holder's: when the current lease or
-- attempt is at risk. The rest is the Supervisor's, which holders' writes
-- never set: `warned_at` (the lease's own warning was raised),
-- `at_risk_since` (a warning of the task or a step was raised during the
-- lease; both are cleared by the write that ends the lease) and
-- `warned_attempt` (the last attempt whose warning was raised).
ALTER TABLE tasks ADD COLUMN warn_at INTEGER;
ALTER TABLE tasks ADD COLUMN warned_at INTEGER;
ALTER TABLE tasks ADD COLUMN at_risk_since INTEGER;
ALTER TABLE steps ADD COLUMN warn_at INTEGER;
ALTER TABLE steps ADD COLUMN warned_attempt INTEGER NOT NULL DEFAULT 0;
-- The Supervisor's scans hold only the warnings not yet raised, and the
-- at-risk listing only the tasks at risk: all three stay small.
CREATE INDEX tasks_warn_due ON tasks (warn_at) WHERE warn_at IS NOT NULL AND warned_at IS NULL;
CREATE INDEX steps_warn_due ON steps (warn_at) WHERE warn_at IS NOT NULL AND warned_attempt < attempt;
CREATE INDEX tasks_at_risk ON tasks (at_risk_since) WHERE at_risk_since IS NOT NULL AND locked_by IS NOT NULL;
"#,
    r#"
-- Retention: the finished tasks by end time (a finished task is written
-- again only by a resubmit, so `updated_at` is when it finished). Prunes
-- walk it oldest first, and it holds only finished tasks.
CREATE INDEX tasks_finished ON tasks (updated_at) WHERE state IN ('processed', 'error', 'compensated', 'cancelled');
"#,
    r#"
-- Who submitted each task (NULL: not known), and the listings of one
-- submitter's tasks, newest first (the entries end with the rowid).
ALTER TABLE tasks ADD COLUMN submitter TEXT;
CREATE INDEX tasks_submitter ON tasks (submitter) WHERE submitter IS NOT NULL;
"#,
    r#"
-- Callback steps: the SHA-256 of the current attempt's callback token
-- (NULL: none, or already used).
ALTER TABLE steps ADD COLUMN callback_digest TEXT;
"#,
    r#"
-- Paused tasks (an operator's pause): not claimed until resumed. The claim
-- index leaves them out, so a store full of paused tasks costs a claim
-- nothing.
ALTER TABLE tasks ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
DROP INDEX tasks_claimable;
CREATE INDEX tasks_claimable ON tasks (not_before) WHERE state IN ('pending', 'compensating') AND locked_by IS NULL AND paused = 0;
"#,
    r#"
-- Search: a task's tags (a JSON object, NULL: none) and one row per tag in
-- `task_tags`, keyed by the task id rather than its rowid (a VACUUM may
-- renumber rowids). Listings by creation time read `tasks_created`.
ALTER TABLE tasks ADD COLUMN tags TEXT;
CREATE TABLE task_tags (
    key     TEXT NOT NULL,
    value   TEXT NOT NULL,
    task_id TEXT NOT NULL,
    PRIMARY KEY (key, value, task_id)
) WITHOUT ROWID;
CREATE INDEX tasks_created ON tasks (created_at);
"#,
    r#"
-- The hash chain of each task's history (see `rota_store::chain`): the
-- SHA-256 of the previous row's hash and this row's content, computed by
-- the writer as it appends the row. NULL for rows written before.
ALTER TABLE events ADD COLUMN hash BLOB;
"#,
    r#"
-- Paused workflows (an operator's pause of a workflow, by name): claims
-- take none of their tasks. One row per workflow ever paused, holding the
-- latest pause or resume with who made it, when and why.
CREATE TABLE workflow_pauses (
    name       TEXT    PRIMARY KEY,
    paused     INTEGER NOT NULL,
    changed_by TEXT    NOT NULL,
    reason     TEXT,
    changed_at INTEGER NOT NULL
);
"#,
    r#"
-- Bulk actions: each batch, its filter (JSON), how far its walk got
-- (`cursor`: the last task handled) and the runner holding it.
CREATE TABLE batches (
    id           TEXT PRIMARY KEY,
    action       TEXT NOT NULL,
    filter       TEXT NOT NULL,
    total        INTEGER NOT NULL,
    requested_by TEXT NOT NULL,
    reason       TEXT,
    state        TEXT NOT NULL,
    cursor       TEXT,
    done         INTEGER NOT NULL,
    skipped      INTEGER NOT NULL,
    failed       INTEGER NOT NULL,
    last_error   TEXT,
    locked_by    TEXT,
    lease_until  INTEGER,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
);
CREATE INDEX batches_running ON batches (created_at) WHERE state = 'running';
"#,
    r#"
-- The audit log: operator actions that have no history row, with who and
-- why. Task actions are read from the history through `events_operator`.
CREATE TABLE audit (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    at     INTEGER NOT NULL,
    action TEXT    NOT NULL,
    actor  TEXT    NOT NULL,
    reason TEXT,
    target TEXT    NOT NULL,
    detail TEXT    NOT NULL
);
CREATE INDEX audit_at ON audit (at, id);
CREATE INDEX events_operator ON events (at, seq) WHERE kind IN ('cancelled', 'resubmitted', 'paused', 'resumed', 'signal');
"#,
    r#"
-- Rate limits shared by every process: each limit's theoretical arrival
-- time (GCRA, microseconds since the epoch), moved on by one
-- compare-and-set upsert per call.
CREATE TABLE rate_limits (
    key    TEXT    PRIMARY KEY,
    tat_us INTEGER NOT NULL
) WITHOUT ROWID;
"#,
    r#"
-- Priorities: claims walk the claimable tasks highest priority first, then
-- oldest first (`tasks_claimable_priority`), beside the oldest-first walk
-- of `tasks_claimable` that takes each claim's oldest share.
ALTER TABLE tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
CREATE INDEX tasks_claimable_priority ON tasks (priority DESC, not_before)
    WHERE state IN ('pending', 'compensating') AND locked_by IS NULL AND paused = 0;
"#,
    r#"
-- Concurrency keys: a task of a workflow with `concurrency:` or
-- `max_in_flight:` holds one of its key's slots (0..limit) from its first
-- claim until it ends. The primary key makes a second holder of a slot
-- impossible, and the triggers free the slot in the statement that ends
-- the task (any statement: the holder's commit, a cancel, the Supervisor's
-- failure threshold) or deletes it.
ALTER TABLE tasks ADD COLUMN concurrency_key TEXT;
ALTER TABLE tasks ADD COLUMN concurrency_limit INTEGER;
CREATE TABLE concurrency_slots (
    workflow TEXT    NOT NULL,
    key      TEXT    NOT NULL,
    slot     INTEGER NOT NULL,
    task_id  TEXT    NOT NULL UNIQUE,
    PRIMARY KEY (workflow, key, slot)
) WITHOUT ROWID;
-- The claimable tasks of each key in submission order: a claim counts those
-- older than a candidate (at most the limit of them).
CREATE INDEX tasks_concurrency_waiting ON tasks (workflow, concurrency_key, not_before)
    WHERE concurrency_key IS NOT NULL AND state IN ('pending', 'compensating') AND locked_by IS NULL AND paused = 0;
CREATE TRIGGER concurrency_slot_free AFTER UPDATE OF state ON tasks
    WHEN NEW.concurrency_key IS NOT NULL AND NEW.state IN ('processed', 'error', 'cancelled', 'compensated')
BEGIN
    DELETE FROM concurrency_slots WHERE task_id = NEW.id;
END;
CREATE TRIGGER concurrency_slot_gone AFTER DELETE ON tasks WHEN OLD.concurrency_key IS NOT NULL
BEGIN
    DELETE FROM concurrency_slots WHERE task_id = OLD.id;
END;
"#,
    r#"
-- Circuit breakers shared by every process: one row per endpoint, moved by
-- one compare-and-set statement per ask or report. Times are epoch ms.
CREATE TABLE breakers (
    key                  TEXT    PRIMARY KEY,
    state                TEXT    NOT NULL CHECK (state IN ('closed', 'open', 'half_open')),
    consecutive_failures INTEGER NOT NULL,
    open_until           INTEGER,
    probe_holder         TEXT,
    probe_until          INTEGER,
    updated_at           INTEGER NOT NULL
) WITHOUT ROWID;
"#,
    r#"
-- Nothing: PostgreSQL's version of this migration indexes the ids in byte
-- order, which SQLite's primary key already is. The two backends keep the
-- same schema version.
"#,
    r#"
-- Child workflows: a task started by another task's `workflow:` step keeps
-- that parent, step and attempt, and its depth below the top-level task.
-- `tasks_parent` lists a task's children; `tasks_children_running` holds
-- the unfinished ones, which the Supervisor checks against their parents.
ALTER TABLE tasks ADD COLUMN parent_id TEXT;
ALTER TABLE tasks ADD COLUMN parent_step TEXT;
ALTER TABLE tasks ADD COLUMN parent_attempt INTEGER;
ALTER TABLE tasks ADD COLUMN depth INTEGER NOT NULL DEFAULT 0;
CREATE INDEX tasks_parent ON tasks (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX tasks_children_running ON tasks (parent_id)
    WHERE parent_id IS NOT NULL AND state IN ('pending', 'processing');
"#,
    r#"
-- The unfinished tasks of a paused workflow are held: the claim indexes
-- leave them out, so a paused workflow's backlog costs a claim nothing
-- (it walked every one of them). A pause marks them and a resume clears
-- them (`tasks_held`), each in the transaction that changes the pause; a
-- task created meanwhile is marked as its workflow stands. Claims still
-- check `workflow_pauses` too.
ALTER TABLE tasks ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
UPDATE tasks SET held = 1
 WHERE state IN ('pending', 'processing', 'compensating')
   AND workflow IN (SELECT name FROM workflow_pauses WHERE paused = 1);
DROP INDEX tasks_claimable;
CREATE INDEX tasks_claimable ON tasks (not_before)
    WHERE state IN ('pending', 'compensating') AND locked_by IS NULL AND paused = 0 AND held = 0;
DROP INDEX tasks_claimable_priority;
CREATE INDEX tasks_claimable_priority ON tasks (priority DESC, not_before)
    WHERE state IN ('pending', 'compensating') AND locked_by IS NULL AND paused = 0 AND held = 0;
CREATE INDEX tasks_held ON tasks (workflow) WHERE held = 1;
"#,
    r#"
-- No statement finds a message by its queue and id (duplicates are
-- detected in `message_ids`), and every send and delete wrote this index:
-- one more page in the WAL for most commits.
DROP INDEX messages_id;
"#,
];

/// Runs the migrations that have not run yet.
pub(crate) fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let done: i64 = tx.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(usize::try_from(done).unwrap_or(0)) {
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (index + 1) as i64)?;
    }
    tx.commit()
}

/// How many migrations this build knows.
pub(crate) fn version() -> i64 {
    MIGRATIONS.len() as i64
}
