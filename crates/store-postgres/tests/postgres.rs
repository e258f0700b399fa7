//! What only the PostgreSQL backend promises beyond the conformance suite:
//! tasks created inside the application's own transaction, event paging that
//! never passes a transaction still open, wake-ups across processes, and
//! recovery from killed connections. Needs `ROTA_TEST_POSTGRES_URL`; without
//! it each test prints a `SKIP` line.

use std::sync::Arc;
use std::time::Duration;

use rota_model::{Clock, ManualClock, QueueName, SystemClock, Task, TaskId, WorkflowName};
use rota_store::{Created, Event, EventKind, NewTask, Outgoing, Queues, Receive, Tasks};
use rota_store_postgres::{Config, PgStore};
use rota_testkit::postgres::TestSchema;
use serde_json::json;
use sqlx::{Connection, PgConnection};

fn config(schema: &TestSchema) -> Config {
    let mut config = Config::new(schema.url.clone());
    config.schema = schema.name.clone();
    config.connections_max = 4;
    config
}

async fn open(config: Config, clock: Arc<dyn Clock>) -> PgStore {
    PgStore::open(config, clock).await.expect("open the postgres store")
}

fn new_task(id: &str, clock: &dyn Clock, doorbell: &QueueName) -> NewTask {
    let id = TaskId::new(id).unwrap();
    let now = clock.now();
    NewTask {
        task: Task::new(id.clone(), WorkflowName::new("order").unwrap(), 1, json!({ "order": id.as_str() }), now),
        steps: Vec::new(),
        messages: vec![(doorbell.clone(), Outgoing::json(&json!({ "task": id.as_str() })).unwrap())],
        events: vec![Event::task(&id, now, EventKind::Received, json!({}))],
    }
}

/// A store on the real clock whose receivers never poll in a test's time:
/// a message reaches a waiting receiver by a wake-up or a hand-over only.
async fn open_without_polling(schema: &TestSchema) -> Arc<PgStore> {
    let mut settings = config(schema);
    settings.poll_interval = Duration::from_secs(600);
    Arc::new(open(settings, Arc::new(SystemClock)).await)
}

/// A receive of one message from `queue` on `store`, waiting up to a
/// minute, spawned and given time to park before this returns.
async fn parked_receive(store: Arc<PgStore>, queue: &QueueName) -> tokio::task::JoinHandle<Vec<rota_model::MessageId>> {
    let queue = queue.clone();
    let waiting = tokio::spawn(async move {
        let got = store.receive(&queue, Receive::up_to(1).waiting(Duration::from_secs(60))).await.expect("the receive succeeds");
        got.into_iter().map(|delivery| delivery.id).collect()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    waiting
}

async fn app_connection(schema: &TestSchema) -> PgConnection {
    PgConnection::connect(&schema.url).await.expect("connect as the application")
}

/// The pattern's example: the application inserts an order and the task that
/// processes it in one transaction of its own. Rolled back, neither exists
/// (nor the task's doorbell message); committed, both do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_created_in_the_applications_transaction_commits_or_rolls_back_with_it() {
    let Some(schema) = TestSchema::new("transactional submit on PostgreSQL") else { return };
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let store = open(config(&schema), clock.clone()).await;
    let doorbells = QueueName::new("doorbells").unwrap();
    let mut app = app_connection(&schema).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE TABLE \"{}\".orders (id TEXT PRIMARY KEY)", schema.name)))
        .execute(&mut app)
        .await
        .unwrap();
    let insert_order = format!("INSERT INTO \"{}\".orders (id) VALUES ($1)", schema.name);
    let count_orders = format!("SELECT COUNT(*) FROM \"{}\".orders", schema.name);

    let mut tx = app.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(insert_order.clone())).bind("order-1").execute(&mut *tx).await.unwrap();
    let created = store.create_task_in(&mut tx, new_task("order-1", clock.as_ref(), &doorbells)).await.unwrap();
    assert_eq!(created, Created::New);
    tx.rollback().await.unwrap();
    assert!(store.task(&TaskId::new("order-1").unwrap()).await.unwrap().is_none(), "a rolled-back submit leaves no task");
    assert!(store.receive(&doorbells, Receive::up_to(10)).await.unwrap().is_empty(), "nor its message");
    let orders: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count_orders.clone())).fetch_one(&mut app).await.unwrap();
    assert_eq!(orders, 0, "nor the application's row");

    let mut tx = app.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(insert_order)).bind("order-1").execute(&mut *tx).await.unwrap();
    store.create_task_in(&mut tx, new_task("order-1", clock.as_ref(), &doorbells)).await.unwrap();
    tx.commit().await.unwrap();
    let record = store.task(&TaskId::new("order-1").unwrap()).await.unwrap().expect("the committed task");
    assert_eq!(record.task.input, json!({ "order": "order-1" }));
    assert_eq!(store.receive(&doorbells, Receive::up_to(10)).await.unwrap().len(), 1, "its message was sent with it");
    let orders: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count_orders)).fetch_one(&mut app).await.unwrap();
    assert_eq!(orders, 1);

    let again = store.create_task_in(&mut app, new_task("order-1", clock.as_ref(), &doorbells)).await.unwrap();
    assert!(matches!(again, Created::Existing(_)), "the task id stays the idempotency key: {again:?}");
}

/// Event sequence numbers are drawn at insert and become visible at commit,
/// so they can commit out of order. `events_after` must not page past an
/// event whose transaction is still open: a reader that did would never see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_after_never_passes_an_event_still_being_written() {
    let Some(schema) = TestSchema::new("event paging on PostgreSQL") else { return };
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let store = open(config(&schema), clock.clone()).await;
    let doorbells = QueueName::new("doorbells").unwrap();
    store.create_task(new_task("first", clock.as_ref(), &doorbells)).await.unwrap();

    let mut app = app_connection(&schema).await;
    let mut open_tx = app.begin().await.unwrap();
    store.create_task_in(&mut open_tx, new_task("slow", clock.as_ref(), &doorbells)).await.unwrap();
    store.create_task(new_task("last", clock.as_ref(), &doorbells)).await.unwrap();

    let tasks_of = |events: Vec<Event>| events.into_iter().map(|e| e.task_id.to_string()).collect::<Vec<_>>();
    let visible = tasks_of(store.events_after(0, 100).await.unwrap());
    assert_eq!(visible, ["first"], "nothing after the open transaction's event is handed out yet");
    assert_eq!(store.history(&TaskId::new("last").unwrap()).await.unwrap().len(), 1, "history shows committed events at once");

    open_tx.commit().await.unwrap();
    let visible = tasks_of(store.events_after(0, 100).await.unwrap());
    assert_eq!(visible, ["first", "slow", "last"], "once it commits, every event in seq order");
}

/// Two messages of one ordering key sent by transactions that commit in
/// the other order than their messages were numbered: the later-numbered
/// one commits first and is leased; the earlier-numbered one, committed
/// after, is then the key's head by number but must wait until that lease
/// ends, so that a key never has two leases at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_has_one_lease_even_when_its_messages_commit_out_of_order() {
    let Some(schema) = TestSchema::new("ordering keys across transactions on PostgreSQL") else { return };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = open(config(&schema), clock.clone()).await;
    let work = QueueName::new("work").unwrap();
    store.create_queue(&work, rota_store::QueueConfig::default()).await.unwrap();
    let keyed = |body: &str| Outgoing::json(&json!(body)).unwrap().with_ordering_key("order-1");

    // Numbered first, committed last: a task created in the application's
    // transaction, whose creation sends the keyed message.
    let mut app = app_connection(&schema).await;
    let mut open_tx = app.begin().await.unwrap();
    let mut slow = new_task("slow", clock.as_ref(), &work);
    slow.messages = vec![(work.clone(), keyed("numbered first"))];
    store.create_task_in(&mut open_tx, slow).await.unwrap();
    let sent = store.send(&work, keyed("committed first")).await.unwrap();

    let first = store.receive(&work, Receive::up_to(10)).await.unwrap();
    assert_eq!(first.iter().map(|d| d.id.clone()).collect::<Vec<_>>(), [sent.id], "the only one committed");
    open_tx.commit().await.unwrap();
    assert!(store.receive(&work, Receive::up_to(10)).await.unwrap().is_empty(), "the key is leased: the other waits");
    store.complete(&work, first[0].lease_token).await.unwrap();
    let next = store.receive(&work, Receive::up_to(10)).await.unwrap();
    assert_eq!(next.iter().map(|d| d.body.get()).collect::<Vec<_>>(), ["\"numbered first\""], "then it is delivered");
}

/// A receiver waiting in one process is woken by a send from another
/// (another store on the same schema) through NOTIFY, not by its poll: the
/// poll interval here is longer than the receive's whole wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_from_another_process_wakes_a_waiting_receiver() {
    let Some(schema) = TestSchema::new("cross-process wake-up on PostgreSQL") else { return };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut slow_polling = config(&schema);
    slow_polling.poll_interval = Duration::from_secs(600);
    let receiver = Arc::new(open(slow_polling, clock.clone()).await);
    let sender = open(config(&schema), clock).await;
    let work = QueueName::new("work").unwrap();
    receiver.create_queue(&work, Default::default()).await.unwrap();

    let waiting = parked_receive(receiver, &work).await;
    let sent = sender.send(&work, Outgoing::json(&json!("hello")).unwrap()).await.unwrap();
    assert_eq!(waiting.await.unwrap(), [sent.id], "the waiting receiver got the message");
}

/// When the server drops every connection of a store (a restart, a network
/// cut, an operator's pg_terminate_backend), the store reconnects: later
/// operations succeed, nothing acknowledged is lost, and a waiting receiver
/// is still woken by the next send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_are_replaced_and_nothing_acknowledged_is_lost() {
    let Some(schema) = TestSchema::new("reconnect on PostgreSQL") else { return };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut killed = config(&schema);
    killed.application_name = format!("rota-{}", schema.name);
    killed.poll_interval = Duration::from_secs(600);
    let store = Arc::new(open(killed.clone(), clock.clone()).await);
    let sender = open(config(&schema), clock).await;
    let work = QueueName::new("work").unwrap();
    let before = store.send(&work, Outgoing::json(&json!("before")).unwrap()).await.unwrap();

    let mut admin = app_connection(&schema).await;
    let terminated: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()",
    )
    .bind(&killed.application_name)
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(!terminated.is_empty(), "the store's connections (pool and listener) were found and killed");

    // The first operations after the cut may fail as unavailable while the
    // pool notices; none may fail otherwise, and one must soon succeed.
    let mut received = Vec::new();
    for _ in 0..50 {
        match store.receive(&work, Receive::up_to(10)).await {
            Ok(got) => {
                received = got;
                break;
            }
            Err(rota_store::Error::Unavailable(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(other) => panic!("after reconnecting: {other}"),
        }
    }
    assert_eq!(received.iter().map(|d| d.id.clone()).collect::<Vec<_>>(), [before.id], "the message sent before the cut survived");

    let waiting = parked_receive(store.clone(), &work).await;
    let after = sender.send(&work, Outgoing::json(&json!("after")).unwrap()).await.unwrap();
    assert_eq!(waiting.await.unwrap(), [after.id], "the listener is back: the waiting receiver was woken");
}

/// The statements the engine runs all the time reach their rows through
/// indexes, however empty the tables were when each connection planned them:
/// a plan made on a new schema must not scan whole tables once they are big.
/// One connection plans everything on empty tables, the tables then grow to
/// 20,000 rows each (no ANALYZE), and the same work runs again: PostgreSQL
/// reports no sequential scan of tasks, steps, messages or events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_statements_use_indexes_whatever_the_tables_held_when_planned() {
    let Some(schema) = TestSchema::new("index-only plans on PostgreSQL") else { return };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut one_connection = config(&schema);
    one_connection.connections_max = 1;
    let store = open(one_connection, clock.clone()).await;
    let (doorbells, agent, bulk) =
        (QueueName::new("doorbells").unwrap(), QueueName::new("agent").unwrap(), QueueName::new("bulk").unwrap());
    let me = rota_model::InstanceId::new("scheduler-1").unwrap();

    // One task's way through the store: submit, doorbell, claim, read, a
    // decision that starts its step and sends a request, the agent's receive
    // and completion.
    let cycle = |n: usize| {
        let (store, clock, doorbells, agent, me) = (&store, &clock, &doorbells, &agent, &me);
        async move {
            let mut new = new_task(&format!("order-{n}"), clock.as_ref(), doorbells);
            let id = new.task.id.clone();
            new.steps.push(rota_model::Step::new(id.clone(), rota_model::StepName::new("work").unwrap(), 0, clock.now()));
            store.create_task(new).await.unwrap();
            let rung = store.receive(doorbells, Receive::up_to(1)).await.unwrap();
            let claimed = store.claim_tasks(me, Duration::from_secs(60), 1).await.unwrap().pop().expect("the new task is claimed");
            let record = store.task(&id).await.unwrap().expect("the claimed task");
            let step = record.steps[0].clone();
            let started = step.start(json!({}), clock.now(), Duration::from_secs(10)).unwrap();
            let changes = rota_store::Changes {
                tasks: vec![rota_store::TaskWrite::replacing(&claimed, claimed.clone())],
                steps: vec![rota_store::StepWrite::replacing(&step, started)],
                send: vec![(agent.clone(), Outgoing::json(&json!({ "task": id.as_str() })).unwrap())],
                events: vec![Event::task(&id, clock.now(), EventKind::StepStarted, json!({}))],
                complete: rung.iter().map(|d| (doorbells.clone(), d.lease_token)).collect(),
                new_steps: Vec::new(),
            };
            store.commit(changes).await.unwrap();
            let requests = store.receive(agent, Receive::up_to(1)).await.unwrap();
            let tokens: Vec<_> = requests.iter().map(|d| d.lease_token).collect();
            assert!(store.complete_batch(agent, &tokens).await.unwrap().is_empty(), "the request is completed");
        }
    };
    // More than five runs: PostgreSQL's own rule plans a statement's first
    // five executions for their parameters and then settles on one plan.
    for n in 0..8 {
        cycle(n).await;
    }

    let mut admin = app_connection(&schema).await;
    store.send(&bulk, Outgoing::json(&json!("bulk")).unwrap()).await.unwrap();
    let s = &schema.name;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{s}\".tasks (id, workflow, workflow_version, input, state, lease_epoch, not_before, failure_count,
                                  created_at, updated_at)
         SELECT 'bulk-' || g, 'order', 1, '{{}}', 'processed', 0, 0, 0, 0, 0 FROM generate_series(1, 20000) AS g;
         INSERT INTO \"{s}\".steps (task_id, name, position, state, attempt, not_before, updated_at)
         SELECT 'bulk-' || g, 'work', 0, 'completed', 1, 0, 0 FROM generate_series(1, 20000) AS g;
         INSERT INTO \"{s}\".events (task_id, at, kind, detail)
         SELECT 'bulk-' || g, 0, 'processed', '{{}}' FROM generate_series(1, 20000) AS g;
         INSERT INTO \"{s}\".messages (queue_id, id, body, enqueued_at, visible_at)
         SELECT (SELECT id FROM \"{s}\".queues WHERE name = 'bulk'), 'bulk-' || g, '{{}}', 0, 0 FROM generate_series(1, 20000) AS g;"
    )))
    .execute(&mut admin)
    .await
    .unwrap();

    // The pool's backend reports its counters when idle (see
    // `settled_counts`): wait until its index scans show, then compare.
    let scans = format!(
        "SELECT COALESCE(SUM(seq_scan), 0)::bigint, COALESCE(SUM(idx_scan), 0)::bigint FROM pg_stat_user_tables
          WHERE schemaname = '{s}' AND relname IN ('tasks', 'steps', 'messages', 'events')"
    );
    let (seq_before, idx_before) = settled_counts(&mut admin, &scans, 1).await;
    for n in 8..12 {
        cycle(n).await;
    }
    let (seq_after, idx_after) = settled_counts(&mut admin, &scans, idx_before + 4).await;
    assert!(idx_after > idx_before, "the work ran through indexes");
    assert_eq!(seq_after, seq_before, "no statement scanned a whole table once the tables were big");
}

/// A decision that leaves the task's state and lease as they were (a step's
/// reply handled, say) changes no indexed column of the task, so
/// PostgreSQL writes it as a heap-only update, adding no entry to any of
/// the table's indexes; a task's end changes its state and is not one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_within_a_lease_are_heap_only_updates() {
    let Some(schema) = TestSchema::new("heap-only task writes on PostgreSQL") else { return };
    let clock = Arc::new(ManualClock::default());
    let store = open(config(&schema), clock.clone()).await;
    let doorbells = QueueName::new("doorbells").unwrap();
    let me = rota_model::InstanceId::new("scheduler-1").unwrap();
    store.create_task(new_task("order-1", clock.as_ref(), &doorbells)).await.unwrap();
    let mut task = store.claim_tasks(&me, Duration::from_secs(60), 1).await.unwrap().pop().expect("the task is claimed");
    const WITHIN_LEASE: i64 = 5;
    for _ in 0..WITHIN_LEASE {
        clock.advance(Duration::from_millis(10));
        let mut next = task.clone();
        next.updated_at = clock.now();
        next.lease_epoch += 1;
        let changes = rota_store::Changes { tasks: vec![rota_store::TaskWrite::replacing(&task, next.clone())], ..Default::default() };
        store.commit(changes).await.unwrap();
        task = next;
    }
    let fence = task.fence().expect("the task is still held");
    let done = task.finish_processed(fence, json!({}), clock.now()).unwrap();
    store.commit(rota_store::Changes { tasks: vec![rota_store::TaskWrite::replacing(&task, done)], ..Default::default() }).await.unwrap();

    let mut admin = app_connection(&schema).await;
    let counts = format!(
        "SELECT COALESCE(SUM(n_tup_hot_upd), 0)::bigint, COALESCE(SUM(n_tup_upd), 0)::bigint FROM pg_stat_user_tables
          WHERE schemaname = '{}' AND relname = 'tasks'",
        schema.name
    );
    // The claim, the writes within the lease and the end; reported by the
    // store's backends when idle.
    let (heap_only, updates) = settled_counts(&mut admin, &counts, WITHIN_LEASE + 2).await;
    assert_eq!((updates, heap_only), (WITHIN_LEASE + 2, WITHIN_LEASE), "(updates, heap-only updates) of the task");
}

/// The two counters `query` reads from PostgreSQL's statistics, once the
/// second is at least `at_least` and they have stopped moving: a backend
/// reports its counters when idle, at once or, if it reported less than a
/// second before, up to ten seconds later. Gives up after a minute.
async fn settled_counts(admin: &mut PgConnection, query: &str, at_least: i64) -> (i64, i64) {
    let mut last = (0, 0);
    for _ in 0..300 {
        last = counts(admin, query).await;
        if last.1 >= at_least {
            tokio::time::sleep(Duration::from_millis(1_200)).await;
            return counts(admin, query).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the store's counters never reached {at_least} in PostgreSQL's statistics: {last:?}");
}

async fn counts(admin: &mut PgConnection, query: &str) -> (i64, i64) {
    sqlx::query_as(sqlx::AssertSqlSafe(query.to_owned())).fetch_one(admin).await.unwrap()
}

/// Commits made at the same moment share statements (group commit), and a
/// lost race among them fails only its own commit: the others are written,
/// the stale one writes nothing and is told what conflicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commits_share_statements_and_a_lost_race_fails_only_its_own() {
    let Some(schema) = TestSchema::new("group commit on PostgreSQL") else { return };
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let mut one_at_a_time = config(&schema);
    one_at_a_time.commits_in_flight = 1;
    let store = Arc::new(open(one_at_a_time, clock.clone()).await);
    let doorbells = QueueName::new("doorbells").unwrap();
    let me = rota_model::InstanceId::new("scheduler-1").unwrap();
    for n in 0..40 {
        store.create_task(new_task(&format!("order-{n}"), clock.as_ref(), &doorbells)).await.unwrap();
    }
    let mut claimed = store.claim_tasks(&me, Duration::from_secs(60), 40).await.unwrap();
    claimed.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
    assert_eq!(claimed.len(), 40);
    let touch = |task: &Task, note: &str| rota_store::Changes {
        tasks: vec![rota_store::TaskWrite::replacing(task, task.clone())],
        events: vec![Event::task(&task.id, clock.now(), EventKind::Released, json!({ "note": note }))],
        ..rota_store::Changes::default()
    };
    let commit_all = |batch: Vec<rota_store::Changes>| {
        let store = store.clone();
        async move {
            let commits = batch.into_iter().map(|changes| {
                let store = store.clone();
                tokio::spawn(async move { store.commit(changes).await })
            });
            let mut outcomes = Vec::new();
            for commit in commits.collect::<Vec<_>>() {
                outcomes.push(commit.await.unwrap());
            }
            outcomes
        }
    };

    let before = store.commit_counts();
    let outcomes = commit_all(claimed[..20].iter().map(|task| touch(task, "together")).collect()).await;
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    let after = store.commit_counts();
    assert_eq!(after.commits - before.commits, 20);
    assert!(after.statements - before.statements < 20, "20 commits at once shared statements: {before:?} then {after:?}");

    // Twenty more, one of them fenced with an epoch its task no longer has.
    let mut stale = touch(&claimed[20], "stale");
    stale.tasks[0].expected_epoch += 1;
    let mut batch: Vec<_> = claimed[21..].iter().map(|task| touch(task, "together")).collect();
    batch.insert(7, stale);
    let outcomes = commit_all(batch).await;
    for (index, outcome) in outcomes.iter().enumerate() {
        if index == 7 {
            assert!(matches!(outcome, Err(rota_store::Error::Conflict(_))), "the stale commit conflicts: {outcome:?}");
        } else {
            assert!(outcome.is_ok(), "commit {index} is written despite the stale one: {outcome:?}");
        }
    }
    for task in &claimed[20..] {
        let notes: Vec<_> = store.history(&task.id).await.unwrap().into_iter().filter(|e| e.kind == EventKind::Released).collect();
        let expected = if task.id == claimed[20].id { 0 } else { 1 };
        assert_eq!(notes.len(), expected, "events of {}: {notes:?}", task.id);
    }
}

/// A receiver waiting in this process gets a message sent from this
/// process straight from the send (one lease, delivery count 1, settled like
/// any other), but only a message a receive could take at once: not a
/// delayed one, a keyed one only as the head of its key, not on a paused
/// queue. A receiver that went away takes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_receiver_in_this_process_gets_only_what_a_receive_could_take() {
    let Some(schema) = TestSchema::new("handoff to waiting receivers on PostgreSQL") else { return };
    let store = open_without_polling(&schema).await;
    let work = QueueName::new("work").unwrap();
    let waiting = |wait_ms: u64| {
        let (store, work) = (store.clone(), work.clone());
        tokio::spawn(async move { store.receive(&work, Receive::up_to(10).waiting(Duration::from_millis(wait_ms))).await.unwrap() })
    };
    let parked = || tokio::time::sleep(Duration::from_millis(200));

    // Handed over: the waiting receiver has it, leased once.
    let receiver = waiting(60_000);
    parked().await;
    let sent = store.send(&work, Outgoing::json(&json!("plain")).unwrap()).await.unwrap();
    let got = receiver.await.unwrap();
    assert_eq!(got.iter().map(|d| (d.id.clone(), d.delivery_count)).collect::<Vec<_>>(), [(sent.id, 1)]);
    store.complete(&work, got[0].lease_token).await.expect("the handed-over lease settles like any other");

    // Delayed: not handed over; the receiver waits out its time empty.
    let receiver = waiting(300);
    parked().await;
    store.send(&work, Outgoing::json(&json!("later")).unwrap().with_delay(Duration::from_millis(600))).await.unwrap();
    assert!(receiver.await.unwrap().is_empty(), "a delayed message is not handed over");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let later = store.receive(&work, Receive::up_to(10)).await.unwrap();
    assert_eq!(later.len(), 1, "it is delivered once its delay is over");
    store.complete(&work, later[0].lease_token).await.unwrap();

    // Keyed behind a leased head: not handed over.
    store.send(&work, Outgoing::json(&json!("head")).unwrap().with_ordering_key("order-1")).await.unwrap();
    let head = store.receive(&work, Receive::up_to(10)).await.unwrap();
    assert_eq!(head.len(), 1);
    let receiver = waiting(300);
    parked().await;
    store.send(&work, Outgoing::json(&json!("second")).unwrap().with_ordering_key("order-1")).await.unwrap();
    assert!(receiver.await.unwrap().is_empty(), "a message behind its key's head is not handed over");
    store.complete(&work, head[0].lease_token).await.unwrap();
    let second = store.receive(&work, Receive::up_to(10)).await.unwrap();
    assert_eq!(second.len(), 1);
    store.complete(&work, second[0].lease_token).await.unwrap();

    // The head of its key: handed over; the next of its key, sent with it,
    // waits behind it.
    let receiver = waiting(60_000);
    parked().await;
    let keyed = |body: &str| Outgoing::json(&json!(body)).unwrap().with_ordering_key("order-2");
    let sent = store.send_batch(&work, vec![keyed("first of order-2"), keyed("next of order-2")]).await.unwrap();
    let got = receiver.await.unwrap();
    assert_eq!(got.iter().map(|d| d.id.clone()).collect::<Vec<_>>(), [sent[0].id.clone()], "only the head is handed over");
    assert!(store.receive(&work, Receive::up_to(10)).await.unwrap().is_empty(), "the next waits for the head");
    store.complete(&work, got[0].lease_token).await.unwrap();
    let next = store.receive(&work, Receive::up_to(10)).await.unwrap();
    assert_eq!(next.iter().map(|d| d.id.clone()).collect::<Vec<_>>(), [sent[1].id.clone()]);
    store.complete(&work, next[0].lease_token).await.unwrap();

    // Paused: not handed over.
    store.pause(&work).await.unwrap();
    let receiver = waiting(300);
    parked().await;
    store.send(&work, Outgoing::json(&json!("paused")).unwrap()).await.unwrap();
    assert!(receiver.await.unwrap().is_empty(), "a paused queue hands nothing over");
    store.resume(&work).await.unwrap();
    let resumed = store.receive(&work, Receive::up_to(10)).await.unwrap();
    assert_eq!(resumed.iter().map(|d| d.delivery_count).collect::<Vec<_>>(), [1], "delivered after the resume, once");
    store.complete(&work, resumed[0].lease_token).await.unwrap();

    // A receiver that went away takes nothing: the message stays visible.
    let receiver = waiting(60_000);
    parked().await;
    receiver.abort();
    let _ = receiver.await;
    let sent = store.send(&work, Outgoing::json(&json!("orphan")).unwrap()).await.unwrap();
    let orphan = store.receive(&work, Receive::up_to(10)).await.unwrap();
    assert_eq!(orphan.iter().map(|d| (d.id.clone(), d.delivery_count)).collect::<Vec<_>>(), [(sent.id, 1)]);
}

/// A commit that goes out alone hands its messages to the receivers
/// waiting in this process, as a send does: the reply it sends reaches the
/// waiting receiver leased once, settled like any other, and the message
/// it completes is gone. A commit refused for a lost lease hands nothing
/// over (it wrote nothing), and one to a paused queue leaves the message
/// for after the resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_alone_hands_its_messages_to_a_waiting_receiver() {
    let Some(schema) = TestSchema::new("commit handoff on PostgreSQL") else { return };
    let store = open_without_polling(&schema).await;
    let (requests, replies) = (QueueName::new("requests").unwrap(), QueueName::new("replies").unwrap());
    let waiting = |wait_ms: u64| {
        let (store, replies) = (store.clone(), replies.clone());
        tokio::spawn(async move { store.receive(&replies, Receive::up_to(10).waiting(Duration::from_millis(wait_ms))).await.unwrap() })
    };
    let parked = || tokio::time::sleep(Duration::from_millis(200));
    // An agent's reply: the request's completion and the reply's send,
    // keyed by its task.
    let reply = |request: &rota_store::Delivery, body: &str| rota_store::Changes {
        complete: vec![(requests.clone(), request.lease_token)],
        send: vec![(replies.clone(), Outgoing::json(&json!(body)).unwrap().with_ordering_key("task-1"))],
        ..Default::default()
    };

    store.send(&requests, Outgoing::json(&json!("first")).unwrap()).await.unwrap();
    let request = store.receive(&requests, Receive::up_to(1)).await.unwrap().remove(0);
    let handed_over = || store.commit_counts().handed_over;
    let receiver = waiting(60_000);
    parked().await;
    store.commit(reply(&request, "done")).await.unwrap();
    assert_eq!(handed_over(), 1, "the reply went straight to the waiting receiver");
    let got = receiver.await.unwrap();
    assert_eq!(got.iter().map(|d| (d.body.get(), d.delivery_count)).collect::<Vec<_>>(), [("\"done\"", 1)]);
    store.complete(&replies, got[0].lease_token).await.expect("the handed-over lease settles like any other");
    assert!(store.receive(&requests, Receive::up_to(10)).await.unwrap().is_empty(), "the request was completed");

    // Refused: the request's lease was lost (completed already), so the
    // commit writes nothing and the receiver waits out its time empty.
    let receiver = waiting(300);
    parked().await;
    let refused = store.commit(reply(&request, "again")).await.unwrap_err();
    assert!(matches!(refused, rota_store::Error::LeaseLost(_)), "{refused:?}");
    assert!(receiver.await.unwrap().is_empty(), "a refused commit hands nothing over");
    assert_eq!(handed_over(), 1);
    assert!(store.receive(&replies, Receive::up_to(10)).await.unwrap().is_empty(), "and sent nothing");

    // Paused: not handed over, delivered once after the resume.
    store.send(&requests, Outgoing::json(&json!("second")).unwrap()).await.unwrap();
    let request = store.receive(&requests, Receive::up_to(1)).await.unwrap().remove(0);
    store.pause(&replies).await.unwrap();
    let receiver = waiting(300);
    parked().await;
    store.commit(reply(&request, "paused")).await.unwrap();
    assert!(receiver.await.unwrap().is_empty(), "a paused queue hands nothing over");
    assert_eq!(handed_over(), 1);
    store.resume(&replies).await.unwrap();
    let resumed = store.receive(&replies, Receive::up_to(10)).await.unwrap();
    assert_eq!(resumed.iter().map(|d| d.delivery_count).collect::<Vec<_>>(), [1], "delivered after the resume, once");
}

/// A commit alone whose messages all go to receivers that act only through
/// this store (an agent's reply, handed to its Scheduler) commits before
/// its flush and returns only once a later synchronous commit has flushed
/// the WAL past it: the receiver has the reply while the commit still
/// waits, and the receiver's own commit lets it return. With no commit
/// after it, it flushes with a statement of its own after
/// `follow_up_wait`, and at once when the reply went into the queue
/// unleased after all (its key held by an earlier message). A reply to a
/// receiver that acts outside the store is flushed before its commit
/// returns, as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_handed_to_a_receiver_within_the_store_is_flushed_by_its_next_commit() {
    let Some(schema) = TestSchema::new("commits flushed later on PostgreSQL") else { return };
    let mut settings = config(&schema);
    settings.poll_interval = Duration::from_secs(600);
    settings.follow_up_wait = Duration::from_secs(1);
    let store = Arc::new(open(settings, Arc::new(SystemClock)).await);
    let mut admin = app_connection(&schema).await;
    let (requests, replies) = (QueueName::new("requests").unwrap(), QueueName::new("replies").unwrap());
    let waiting = |within_store: bool| {
        let (store, replies) = (store.clone(), replies.clone());
        let request = Receive::up_to(10).waiting(Duration::from_secs(60));
        let request = if within_store { request.acting_within_store() } else { request };
        tokio::spawn(async move { store.receive(&replies, request).await.unwrap() })
    };
    let parked = || tokio::time::sleep(Duration::from_millis(200));
    // An agent's reply, keyed by its task as a Scheduler's inbox wants.
    let agent_replies = |body: &'static str| {
        let (store, requests, replies) = (store.clone(), requests.clone(), replies.clone());
        tokio::spawn(async move {
            store.send(&requests, Outgoing::json(&json!(body)).unwrap()).await.unwrap();
            let request = store.receive(&requests, Receive::up_to(1)).await.unwrap().remove(0);
            let reply = rota_store::Changes {
                complete: vec![(requests.clone(), request.lease_token)],
                send: vec![(replies.clone(), Outgoing::json(&json!(body)).unwrap().with_ordering_key(body))],
                ..Default::default()
            };
            store.commit(reply).await
        })
    };
    let counts = || {
        let counts = store.commit_counts();
        (counts.handed_over, counts.flushed_later, counts.flush_statements)
    };

    // Flushed by the receiver's next commit.
    let receiver = waiting(true);
    parked().await;
    let agent = agent_replies("first");
    let got = receiver.await.unwrap();
    assert_eq!(got.iter().map(|d| d.body.get()).collect::<Vec<_>>(), ["\"first\""], "the reply was handed over");
    let written_through: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text").fetch_one(&mut admin).await.unwrap();
    assert!(!agent.is_finished(), "the agent's commit waits for a later flush");
    store
        .commit(rota_store::Changes { complete: vec![(replies.clone(), got[0].lease_token)], ..Default::default() })
        .await
        .expect("the receiver's commit, synchronous");
    agent.await.unwrap().expect("the agent's commit succeeds once flushed");
    assert_eq!(counts(), (1, 1, 0), "flushed by the receiver's commit, without a statement of its own");
    let flushed: bool = sqlx::query_scalar("SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn")
        .bind(&written_through)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(flushed, "the WAL is on disk past the agent's commit");

    // No commit after it: it flushes after `follow_up_wait`.
    let receiver = waiting(true);
    parked().await;
    let agent = agent_replies("second");
    let got = receiver.await.unwrap();
    assert_eq!(got.len(), 1);
    store.complete(&replies, got[0].lease_token).await.unwrap();
    agent.await.unwrap().expect("the agent's commit succeeds once flushed");
    assert_eq!(counts(), (2, 2, 1), "flushed by a statement of its own");

    // The reply's key is held by an earlier message, leased: the reply goes
    // in unleased, and its commit flushes at once.
    store.send(&replies, Outgoing::json(&json!("held")).unwrap().with_ordering_key("third")).await.unwrap();
    let held = store.receive(&replies, Receive::up_to(1)).await.unwrap();
    assert_eq!(held.len(), 1);
    let receiver = waiting(true);
    parked().await;
    let agent = agent_replies("third");
    let flushed = tokio::time::timeout(Duration::from_millis(900), agent).await;
    flushed.expect("flushed without waiting for a later commit").unwrap().expect("the agent's commit succeeds");
    assert_eq!(counts(), (2, 3, 2), "not handed over, flushed by a statement of its own");
    // Nothing wakes the receiver for a completion in this store: it is
    // let go, and a receive looks.
    receiver.abort();
    store.complete(&replies, held[0].lease_token).await.unwrap();
    let after_head = store.receive(&replies, Receive::up_to(10)).await.unwrap();
    assert_eq!(after_head.iter().map(|d| d.body.get()).collect::<Vec<_>>(), ["\"third\""], "delivered once its key is free");
    store.complete(&replies, after_head[0].lease_token).await.unwrap();

    // A receiver acting outside the store: flushed at the commit.
    let receiver = waiting(false);
    parked().await;
    agent_replies("fourth").await.unwrap().expect("the agent's commit succeeds");
    assert_eq!(receiver.await.unwrap().len(), 1);
    assert_eq!(counts(), (3, 3, 2), "handed over, flushed before the commit returned");
}

/// A task creation that goes out alone hands its messages to the receivers
/// waiting in this process, as a commit alone does: the doorbell reaches
/// the waiting receiver leased once when the creation returns. A creation
/// that writes nothing (its id exists) hands nothing over, and a task
/// created claimed while its workflow is paused is refused with nothing
/// sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creation_alone_hands_its_messages_to_a_waiting_receiver() {
    let Some(schema) = TestSchema::new("creation handoff on PostgreSQL") else { return };
    let store = open_without_polling(&schema).await;
    let doorbell = QueueName::new("doorbell").unwrap();
    let clock = SystemClock;
    let waiting = |wait_ms: u64| {
        let (store, doorbell) = (store.clone(), doorbell.clone());
        tokio::spawn(async move { store.receive(&doorbell, Receive::up_to(10).waiting(Duration::from_millis(wait_ms))).await.unwrap() })
    };
    let parked = || tokio::time::sleep(Duration::from_millis(200));
    let handed_over = || store.commit_counts().handed_over;

    let receiver = waiting(60_000);
    parked().await;
    let created = store.create_task(new_task("h-1", &clock, &doorbell)).await.unwrap();
    assert!(matches!(created, rota_store::Created::New), "{created:?}");
    assert_eq!(handed_over(), 1, "the doorbell went straight to the waiting receiver");
    let got = receiver.await.unwrap();
    assert_eq!(got.iter().map(|d| d.delivery_count).collect::<Vec<_>>(), [1]);
    store.complete(&doorbell, got[0].lease_token).await.expect("the handed-over lease settles like any other");

    let receiver = waiting(300);
    parked().await;
    let again = store.create_task(new_task("h-1", &clock, &doorbell)).await.unwrap();
    assert!(matches!(again, rota_store::Created::Existing(_)), "{again:?}");
    assert!(receiver.await.unwrap().is_empty(), "a creation that writes nothing hands nothing over");
    assert_eq!(handed_over(), 1);

    let pause = rota_store::WorkflowPause {
        workflow: WorkflowName::new("order").unwrap(),
        paused: true,
        by: "ann".to_owned(),
        reason: None,
        at: clock.now(),
    };
    store.set_workflow_paused(&pause).await.unwrap();
    let mut claimed = new_task("h-2", &clock, &doorbell);
    claimed.task = claimed.task.claim(rota_model::InstanceId::new("eager").unwrap(), clock.now(), Duration::from_secs(10)).unwrap().0;
    let receiver = waiting(300);
    parked().await;
    let refused = store.create_task(claimed).await;
    assert!(matches!(refused, Err(rota_store::Error::Conflict(_))), "{refused:?}");
    assert!(receiver.await.unwrap().is_empty(), "a refused creation hands nothing over");
    assert_eq!(handed_over(), 1);
    assert!(store.receive(&doorbell, Receive::up_to(10)).await.unwrap().is_empty(), "and sent nothing");
}

/// Tasks created at the same moment share statements, and each caller
/// still gets its own outcome: an id submitted twice is created once (the
/// other submission finds that task), and a creation the server refuses
/// (here two steps with one name) fails alone, writing nothing of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creations_share_statements_and_each_gets_its_own_outcome() {
    let Some(schema) = TestSchema::new("group creation on PostgreSQL") else { return };
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let mut one_at_a_time = config(&schema);
    one_at_a_time.commits_in_flight = 1;
    let store = Arc::new(open(one_at_a_time, clock.clone()).await);
    let doorbells = QueueName::new("doorbells").unwrap();
    let with_steps = |id: &str, names: &[&str]| {
        let mut new = new_task(id, clock.as_ref(), &doorbells);
        new.steps = names
            .iter()
            .enumerate()
            .map(|(n, name)| rota_model::Step::new(new.task.id.clone(), rota_model::StepName::new(*name).unwrap(), n as u32, clock.now()))
            .collect();
        new
    };
    let create_all = |batch: Vec<NewTask>| {
        let store = store.clone();
        async move {
            let creations: Vec<_> = batch
                .into_iter()
                .map(|new| {
                    let store = store.clone();
                    tokio::spawn(async move { store.create_task(new).await })
                })
                .collect();
            let mut outcomes = Vec::new();
            for creation in creations {
                outcomes.push(creation.await.unwrap());
            }
            outcomes
        }
    };

    let before = store.commit_counts();
    let outcomes = create_all((0..20).map(|n| with_steps(&format!("order-{n}"), &["charge", "ship"])).collect()).await;
    assert!(outcomes.iter().all(|o| matches!(o, Ok(Created::New))), "{outcomes:?}");
    let after = store.commit_counts();
    assert_eq!(after.creates - before.creates, 20);
    assert!(after.create_statements - before.create_statements < 20, "20 creations at once shared statements: {before:?} then {after:?}");

    // Twenty more, among them one id twice and one task with a repeated step name.
    let mut batch: Vec<_> = (20..38).map(|n| with_steps(&format!("order-{n}"), &["charge", "ship"])).collect();
    batch.insert(3, with_steps("order-25", &["charge", "ship"]));
    batch.insert(9, with_steps("order-bad", &["charge", "charge"]));
    let outcomes = create_all(batch).await;
    let twice: Vec<_> = [3, 6].iter().map(|&at| &outcomes[at]).collect();
    assert!(
        matches!(twice[..], [Ok(Created::New), Ok(Created::Existing(_))] | [Ok(Created::Existing(_)), Ok(Created::New)]),
        "order-25 submitted twice is created once: {twice:?}"
    );
    assert!(outcomes[9].is_err(), "the creation with a repeated step name fails: {:?}", outcomes[9]);
    for (index, outcome) in outcomes.iter().enumerate() {
        if ![3, 6, 9].contains(&index) {
            assert!(matches!(outcome, Ok(Created::New)), "creation {index} is written despite the bad one: {outcome:?}");
        }
    }
    assert!(store.task(&TaskId::new("order-bad").unwrap()).await.unwrap().is_none(), "nothing of the refused creation is kept");
    for n in 0..38 {
        let id = TaskId::new(format!("order-{n}")).unwrap();
        let record = store.task(&id).await.unwrap().unwrap_or_else(|| panic!("{id} exists"));
        assert_eq!(record.steps.len(), 2, "{id} has its steps");
        let received = store.history(&id).await.unwrap().into_iter().filter(|e| e.kind == EventKind::Received).count();
        assert_eq!(received, 1, "{id} has one received event");
    }
    let doorbells_sent = store.receive(&doorbells, Receive::up_to(100)).await.unwrap();
    assert_eq!(doorbells_sent.len(), 38, "one doorbell per task created, none for the refused one or the repeat");
}

/// A process alone on the store's channel makes no announcements (a
/// statement per send for nobody), and one that joins is heard at once:
/// from then on, the first process's sends wake the newcomer's waiting
/// receivers through NOTIFY, not through its poll (which here is longer
/// than the test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_alone_announces_nothing_and_hears_one_that_joins() {
    let Some(schema) = TestSchema::new("announcements only to others on PostgreSQL") else { return };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let first = open(config(&schema), clock.clone()).await;
    // An observer that listens without saying hello: invisible to the stores.
    let mut observer = sqlx::postgres::PgListener::connect(&schema.url).await.expect("observer connects");
    observer.listen(&format!("rota_{}", schema.name)).await.expect("observer listens");
    // Past the time a new process announces anyway while answers come in.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let work = QueueName::new("work").unwrap();
    first.send(&work, Outgoing::json(&json!("unheard")).unwrap()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut slow_polling = config(&schema);
    slow_polling.poll_interval = Duration::from_secs(600);
    let second = Arc::new(open(slow_polling, clock).await);
    // Everything said on the channel until the first process answers the
    // newcomer's hello.
    let mut heard = Vec::new();
    let answered = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let notification = observer.recv().await.expect("observer hears");
            heard.push(notification.payload().to_owned());
            if notification.payload().ends_with(" !here") {
                return;
            }
        }
    })
    .await;
    assert!(answered.is_ok(), "the first process answered the newcomer's hello: heard {heard:?}");
    assert!(heard.iter().all(|payload| !payload.ends_with(" work")), "the send made alone was not announced: {heard:?}");

    let later = QueueName::new("later").unwrap();
    second.create_queue(&later, Default::default()).await.unwrap();
    let waiting = parked_receive(second, &later).await;
    let sent = first.send(&later, Outgoing::json(&json!("heard")).unwrap()).await.unwrap();
    assert_eq!(waiting.await.unwrap(), [sent.id], "the newcomer's waiting receiver was woken");
}

/// The store keeps its connections between operations instead of handing
/// them back to the pool, so operations that find every connection busy
/// must be served by the next one that finishes: two connections serve
/// two hundred concurrent operations, none timing out. And applications
/// have a pool of their own: it has connections to give while the store
/// holds all of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn few_connections_serve_many_operations_and_the_application_pool_is_apart() {
    let Some(schema) = TestSchema::new("kept connections on PostgreSQL") else { return };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut two = config(&schema);
    two.connections_max = 2;
    two.acquire_timeout = Duration::from_secs(5);
    let store = Arc::new(open(two, clock).await);
    let work = QueueName::new("work").unwrap();
    store.create_queue(&work, Default::default()).await.unwrap();

    let operations: Vec<_> = (0..200)
        .map(|n| {
            let (store, work) = (store.clone(), work.clone());
            tokio::spawn(async move {
                store.send(&work, Outgoing::json(&json!({ "n": n })).unwrap()).await?;
                let got = store.receive(&work, Receive::up_to(1)).await?;
                if let Some(delivery) = got.first() {
                    store.complete(&work, delivery.lease_token).await?;
                }
                Ok::<_, rota_store::Error>(got.len())
            })
        })
        .collect();
    let mut received = 0;
    for operation in operations {
        received += operation.await.unwrap().expect("no operation waits past the acquire timeout");
    }
    let left = store.receive(&work, Receive::up_to(200)).await.unwrap();
    assert_eq!(received + left.len(), 200, "every message sent was received once");

    // The store's two connections are out of its pool now; the
    // application's pool still connects.
    let app = tokio::time::timeout(Duration::from_secs(10), store.pool().acquire()).await;
    assert!(matches!(app, Ok(Ok(_))), "the application's pool gave a connection: {app:?}");
}

/// The store's connections negotiate TLS when the server offers it (the
/// default `sslmode=prefer`), through rustls with the `ring` provider, the
/// only one the workspace builds: the pooled connections, the listening one
/// and the application's pool alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_use_tls_when_the_server_offers_it() {
    let Some(schema) = TestSchema::new("TLS on PostgreSQL") else { return };
    let mut admin = app_connection(&schema).await;
    let (offered,): (String,) = sqlx::query_as("SHOW ssl").fetch_one(&mut admin).await.unwrap();
    if offered != "on" {
        println!("SKIP TLS on PostgreSQL: the test server has ssl = {offered}");
        return;
    }
    let mut config = config(&schema);
    config.application_name = schema.name.clone();
    let store = Arc::new(open(config, Arc::new(SystemClock)).await);
    let work = QueueName::new("work").unwrap();
    store.create_queue(&work, Default::default()).await.unwrap();
    let waiting = parked_receive(store.clone(), &work).await;
    store.send(&work, Outgoing::json(&json!("hello")).unwrap()).await.unwrap();
    assert_eq!(waiting.await.unwrap().len(), 1);
    let mut app = store.pool().acquire().await.unwrap();
    let (app_tls,): (bool,) =
        sqlx::query_as("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetch_one(&mut *app).await.unwrap();
    assert!(app_tls, "the application's pool connected without TLS");

    let (total, encrypted): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
          WHERE a.application_name = $1",
    )
    .bind(&schema.name)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(total >= 2, "the store's connections show in pg_stat_activity: {total}");
    assert_eq!(encrypted, total, "every connection of the store uses TLS");
}

/// A store with one connection serves its first operation on a
/// single-threaded runtime. Opening it ran the migrations on a connection
/// that sqlx gives back to its pool in a task of its own (pinging it first),
/// which has not run yet when the operation looks for a connection: the
/// store must count the connections it holds itself (none), not read the
/// pool's figures (one connection out, none idle: all busy), and wait for
/// the one on its way back.
#[tokio::test]
async fn a_one_connection_store_serves_its_first_operation_on_a_single_threaded_runtime() {
    let Some(schema) = TestSchema::new("first operation on one connection on PostgreSQL") else { return };
    let mut one_connection = config(&schema);
    one_connection.connections_max = 1;
    let store = open(one_connection, Arc::new(SystemClock)).await;
    let work = QueueName::new("work").unwrap();
    store.create_queue(&work, Default::default()).await.expect("the first operation gets the store's connection");
    store.send(&work, Outgoing::json(&json!("hello")).unwrap()).await.unwrap();
    assert_eq!(store.receive(&work, Receive::up_to(1)).await.unwrap().len(), 1);
}

/// A consumer receives again after every message. A waiting receive right
/// after a look that found the queue empty parks without a statement,
/// while nothing woke the queue since and nothing in it is due to turn
/// visible; a send from this process or from another, or the time of a
/// delayed message, makes the next receive look again. A receive that
/// does not wait always looks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_receive_right_after_an_empty_look_parks_without_a_statement() {
    let Some(schema) = TestSchema::new("receives that skip a look on PostgreSQL") else { return };
    let manual = Arc::new(ManualClock::default());
    let clock: Arc<dyn Clock> = manual.clone();
    let mut slow_polling = config(&schema);
    slow_polling.poll_interval = Duration::from_secs(600);
    let store = open(slow_polling, clock.clone()).await;
    let work = QueueName::new("work").unwrap();
    store.create_queue(&work, Default::default()).await.unwrap();
    // Time for the listener to listen: only then are others heard.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let skipped = || store.commit_counts().looks_skipped;
    let briefly = || Receive::up_to(1).waiting(Duration::from_millis(50));
    let body = |delivered: &[rota_store::Delivery]| delivered.iter().map(|d| d.body.get().to_owned()).collect::<Vec<_>>();

    assert!(store.receive(&work, briefly()).await.unwrap().is_empty());
    assert_eq!(skipped(), 0, "the first receive looks");
    assert!(store.receive(&work, briefly()).await.unwrap().is_empty());
    assert_eq!(skipped(), 1, "the next one parks at once");
    assert!(store.receive(&work, Receive::up_to(1)).await.unwrap().is_empty());
    assert_eq!(skipped(), 1, "a receive that does not wait looks");

    store.send(&work, Outgoing::json(&json!("sent here")).unwrap()).await.unwrap();
    let got = store.receive(&work, briefly()).await.unwrap();
    assert_eq!(body(&got), ["\"sent here\""], "a send in this process voids the empty look");
    store.complete(&work, got[0].lease_token).await.unwrap();

    store.send(&work, Outgoing::json(&json!("later")).unwrap().with_delay(Duration::from_secs(10))).await.unwrap();
    assert!(store.receive(&work, briefly()).await.unwrap().is_empty(), "not visible yet");
    assert!(store.receive(&work, briefly()).await.unwrap().is_empty());
    assert_eq!(skipped(), 2, "nothing due before the delay runs out");
    manual.advance(Duration::from_secs(10));
    let got = store.receive(&work, briefly()).await.unwrap();
    assert_eq!(body(&got), ["\"later\""], "the delay ran out: the receive looks");
    store.complete(&work, got[0].lease_token).await.unwrap();

    let other = open(config(&schema), clock).await;
    // Time for the two to hear each other: the other announces from then on.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(store.receive(&work, briefly()).await.unwrap().is_empty());
    assert!(store.receive(&work, briefly()).await.unwrap().is_empty());
    assert_eq!(skipped(), 3);
    other.send(&work, Outgoing::json(&json!("sent there")).unwrap()).await.unwrap();
    let got = store.receive(&work, Receive::up_to(1).waiting(Duration::from_secs(30))).await.unwrap();
    assert_eq!(body(&got), ["\"sent there\""], "another process's announcement wakes the receiver or voids the empty look");
}
