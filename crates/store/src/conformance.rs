//! The conformance suite: what every backend must do, written once against
//! the [`Store`](crate::Store) traits and run unchanged on each backend.
//!
//! A backend's test crate implements [`Harness`] and expands
//! [`conformance_suite!`](crate::conformance_suite) with it, which generates
//! one `#[tokio::test]` per case so that each shows up (and fails) on its
//! own. Cases control time through the harness's [`ManualClock`].
//!
//! Each case is a public `async fn` that panics with a message saying which
//! promise was broken. Cases assert on outcomes only, never on how long an
//! operation took: store time is the manual clock, and the only real waits
//! are the long-poll cases' short ones. Sizes are kept small so that the
//! whole suite runs in seconds.
//!
//! Deliberately left out: throughput, latency and crash-consistency under a
//! killed process (the simulation and the benchmarks cover those), and any
//! behaviour the trait documentation leaves to the backend (how long polls
//! are woken, how writes are batched).

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rota_model::{
    CatchUp, Clock, ConcurrencyKey, ExhaustedPolicy, InstanceId, LeaseToken, ManualClock, MessageId, Overlap, PRIORITY_MAX, PRIORITY_MIN,
    ParentLink, Priority, QueueName, ScheduleName, Step, StepName, StepState, Tags, Task, TaskId, TaskState, Timestamp, WorkflowName,
};
use serde_json::{Value, json};

use crate::breaker::{BreakerAdmission, BreakerAsk, BreakerReport, BreakerResult, SharedBreakerState};
use crate::rate::{RateRequest, RateSlot};
use crate::{
    AuditAction, AuditFilter, BODY_BYTES_MAX, BatchAction, BatchCursor, BatchFilter, BatchProgress, BatchState, Changes, Claim, Created,
    DeadLetterFilter, DeadLetterPage, Delivery, Error, Event, EventKind, Expired, InstanceSweep, NewAudit, NewBatch, NewSchedule, NewTask,
    OldestShare, Outgoing, Prune, PruneWorkflows, QueueConfig, QueueStats, RECEIVE_MAX, Receive, Redrive, ScheduleProgress, ScheduleSource,
    ScheduleSpec, Sent, SharedStore, StepWrite, Swept, TaskFilter, TaskRecord, TaskWrite, TimeRange, Warning, WorkflowPause, chain,
};

/// What a backend provides to run the suite.
#[async_trait]
pub trait Harness: Send + Sync {
    /// Opens a store on this harness's database. Every call opens a new
    /// handle on the *same* database (as a restarted process would), all
    /// reading time from [`Harness::clock`].
    async fn open(&self) -> SharedStore;

    /// The clock every store opened by this harness reads.
    fn clock(&self) -> Arc<ManualClock>;
}

/// Generates one test per conformance case. `$make` is an expression that
/// builds a fresh harness (a new, empty database) each time it is evaluated.
///
/// The list of cases below is the only one: a case written in this file but
/// not listed would run on no backend, so `every_case_is_listed` (a test of
/// this crate) fails naming any `pub async fn` of this file missing from it.
#[macro_export]
macro_rules! conformance_suite {
    // For backends that need a server: `$make` evaluates to
    // `Option<harness>`, and each case returns at once on `None` (the
    // harness says why, so that a skip is never silent).
    (optional $make:expr) => {
        $crate::conformance_suite! { @list (@cases $make) }
    };
    ($make:expr) => {
        $crate::conformance_suite! { @list (@cases Some($make)) }
    };
    // Hands the list of cases to another arm: `@cases` makes the tests,
    // `@names` the names, for the test that nothing is left out.
    (@list ($($then:tt)*)) => {
        $crate::conformance_suite! { $($then)*;
            // Queues.
            send_then_receive_oldest_visible_first,
            a_leased_message_is_hidden_until_its_lease_expires,
            stale_and_foreign_tokens_lose_the_lease,
            complete_deletes_and_complete_batch_reports_lost_tokens,
            renew_extends_the_lease,
            abandon_makes_the_message_visible_after_the_delay,
            deliveries_max_dead_letters_after_the_last_delivery,
            abandon_at_the_last_delivery_dead_letters_with_the_reason,
            dead_letter_moves_a_message_at_once_with_the_reason,
            redrive_and_purge_dead_letters,
            dead_letters_are_walked_a_bounded_page_at_a_time_and_redriven_once,
            delayed_messages_wait_for_their_delay,
            ordering_keys_deliver_fifo_one_lease_per_key,
            an_ordering_key_head_comes_back_before_its_successors,
            duplicate_ids_are_dropped_within_the_window,
            pause_stops_deliveries_but_not_sends,
            send_batch_and_receive_max,
            stats_and_queue_configs,
            backlogs_count_ready_messages_up_to_a_bound_and_see_leases,
            invalid_requests_are_refused_and_store_nothing,
            concurrent_receivers_get_each_message_once,
            long_poll_wakes_on_send_and_times_out_empty,
            reply_to_and_correlation_id_are_kept_everywhere,
            messages_leases_and_tasks_survive_reopen,
            // Tasks.
            create_task_writes_everything_once,
            a_task_keeps_its_reply_queue,
            a_task_keeps_its_submitter_and_lists_by_it,
            tasks_are_found_by_tags_times_and_id_prefix,
            a_batch_is_held_by_one_runner_advanced_taken_over_and_stopped,
            an_operator_write_replaces_the_input_and_starts_steps_over,
            list_tasks_filters_newest_first,
            list_tasks_pages_with_before,
            count_tasks_counts_every_state,
            tasks_reads_several_with_their_steps,
            claim_tasks_leases_due_pending_and_unleased_compensating,
            claims_take_higher_priorities_first_and_an_oldest_share,
            a_steady_stream_of_high_priorities_lets_an_old_low_task_through,
            a_paused_task_is_never_claimed_and_keeps_its_mark,
            a_paused_workflows_tasks_are_not_claimed_until_it_is_resumed,
            a_task_created_claimed_is_refused_while_its_workflow_is_paused,
            concurrent_claims_never_share_a_task,
            a_concurrency_key_starts_its_tasks_in_order_up_to_its_limit_without_blocking_others,
            a_concurrency_slot_is_freed_by_the_write_that_ends_its_task,
            a_dead_holders_task_keeps_its_slot_until_taken_over_and_ended,
            concurrent_claims_never_exceed_a_concurrency_limit,
            commit_applies_fenced_writes_and_messages_together,
            a_skipped_step_is_stored_and_fenced_like_any_state,
            commit_with_a_stale_write_conflicts_and_writes_nothing,
            commit_with_a_lost_message_lease_writes_nothing,
            commit_to_a_missing_record_is_not_found,
            a_commit_creates_instance_steps_once,
            expired_finds_tasks_and_steps_past_their_deadline,
            warnings_are_due_once_per_attempt_and_lease,
            a_step_keeps_its_callback_digest,
            a_warning_for_work_that_moved_on_writes_nothing,
            history_and_events_after_page_in_order,
            every_history_row_is_chained_to_the_one_before,
            leader_lease_elects_one_holder,
            leader_reads_the_running_lease,
            latest_events_are_the_newest_first,
            workflow_versions_are_immutable_and_latest_wins,
            alerts_list_newest_first,
            component_statuses_are_replaced_and_listed_by_prefix,
            // Audit.
            the_audit_log_merges_operator_history_and_its_table_newest_first,
            // Rate limits.
            concurrent_rate_takers_never_exceed_rate_times_t_plus_burst,
            a_rate_slot_within_the_wait_is_granted_later_and_a_refusal_says_when,
            rate_limits_in_the_past_are_forgotten_without_a_trace,
            // Shared circuit breakers.
            breaker_failures_from_two_processes_add_up_and_open_it,
            two_owners_race_for_the_probe_and_exactly_one_wins,
            an_expired_probe_lease_is_taken_over_and_only_the_probe_decides,
            stale_closed_breakers_are_deleted_and_open_ones_kept,
            // Schedules.
            create_schedule_is_idempotent_and_refuses_another_definition,
            invalid_schedules_are_refused_and_store_nothing,
            pause_resume_and_delete_schedules,
            advance_schedule_is_fenced_on_its_version,
            declare_schedule_replaces_the_definition_and_keeps_progress,
            // Retention.
            prune_deletes_finished_tasks_oldest_first_in_batches,
            prune_selects_by_state_and_workflow_and_counts_without_deleting,
            prunable_tasks_names_the_next_batch_and_only_prunes_just_those,
            prune_keeps_the_tasks_of_fires_a_schedule_has_not_recorded,
            sweep_instance_deletes_only_what_nobody_needs,
            // Child workflows.
            a_child_keeps_its_parent_link_and_stale_children_are_found,
        }
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(harness) = $make else { return };
                $crate::conformance::$case(&harness).await;
            }
        )*
    };
    (@names; $($case:ident),* $(,)?) => {
        [$(stringify!($case)),*]
    };
}

// ---------------------------------------------------------------------------
// Helpers. They only compute or unwrap; every promise is asserted in a case.
// ---------------------------------------------------------------------------

/// The lease of a queue created with [`QueueConfig::default`].
const LEASE_DEFAULT: Duration = Duration::from_secs(30);
const MILLI: Duration = Duration::from_millis(1);
const SECOND: Duration = Duration::from_secs(1);

/// Asserts that `$result` is `Err` matching `$pattern`, naming the case's
/// step in the panic message otherwise.
macro_rules! assert_err {
    ($result:expr, $pattern:pat, $($context:tt)+) => {
        match $result {
            Err($pattern) => {}
            other => panic!("{}: expected Err({}), got {:?}", format_args!($($context)+), stringify!($pattern), other),
        }
    };
}

fn queue(name: &str) -> QueueName {
    QueueName::new(name).expect("valid queue name")
}

fn message_id(id: &str) -> MessageId {
    MessageId::new(id).expect("valid message id")
}

fn task_id(id: &str) -> TaskId {
    TaskId::new(id).expect("valid task id")
}

fn instance(id: &str) -> InstanceId {
    InstanceId::new(id).expect("valid instance id")
}

/// A message whose body is the JSON string `label`.
fn labelled(label: &str) -> Outgoing {
    Outgoing::json(label).expect("a string serializes")
}

/// The label of a message sent with [`labelled`].
fn label(delivery: &Delivery) -> String {
    serde_json::from_str(delivery.body.get()).unwrap_or_else(|e| panic!("body {:?} is not a label: {e}", delivery.body.get()))
}

fn labels(deliveries: &[Delivery]) -> Vec<String> {
    deliveries.iter().map(label).collect()
}

fn ids(deliveries: &[Delivery]) -> Vec<MessageId> {
    deliveries.iter().map(|d| d.id.clone()).collect()
}

async fn send(store: &SharedStore, queue: &QueueName, message: Outgoing) -> Sent {
    store.send(queue, message).await.unwrap_or_else(|e| panic!("send to {queue} failed: {e}"))
}

async fn send_label(store: &SharedStore, queue: &QueueName, label: &str) -> Sent {
    send(store, queue, labelled(label)).await
}

async fn receive(store: &SharedStore, queue: &QueueName, request: Receive) -> Vec<Delivery> {
    store.receive(queue, request).await.unwrap_or_else(|e| panic!("receive from {queue} failed: {e}"))
}

/// Receives up to `max` messages without waiting, with the queue's lease.
async fn receive_now(store: &SharedStore, queue: &QueueName, max: u32) -> Vec<Delivery> {
    receive(store, queue, Receive::up_to(max)).await
}

/// Receives exactly one message, or panics saying `what` was expected.
async fn receive_one(store: &SharedStore, queue: &QueueName, what: &str) -> Delivery {
    let mut got = receive_now(store, queue, 10).await;
    assert_eq!(got.len(), 1, "{what}: expected exactly one delivery, got {got:?}");
    got.remove(0)
}

async fn assert_nothing_to_receive(store: &SharedStore, queue: &QueueName, what: &str) {
    let got = receive_now(store, queue, RECEIVE_MAX).await;
    assert!(got.is_empty(), "{what}: expected no delivery, got {got:?}");
}

async fn complete(store: &SharedStore, queue: &QueueName, delivery: &Delivery) {
    store
        .complete(queue, delivery.lease_token)
        .await
        .unwrap_or_else(|e| panic!("complete of a current lease ({}) failed: {e}", delivery.lease_token));
}

/// One queue's stats, or `None` when `stats` does not list it.
async fn stats_of(store: &SharedStore, queue: &QueueName) -> Option<QueueStats> {
    let all = store.stats().await.expect("stats");
    all.into_iter().find(|s| &s.queue == queue)
}

/// A queue's counts as (ready, leased, delayed, dead lettered); zeros for a
/// queue that `stats` does not list.
async fn counts(store: &SharedStore, queue: &QueueName) -> (u64, u64, u64, u64) {
    stats_of(store, queue).await.map(|s| (s.ready, s.leased, s.delayed, s.dead_lettered)).unwrap_or_default()
}

/// A new Pending task of `workflow` with one step per name (positions in
/// order) and a `Received` event.
fn new_task(id: &str, workflow: &str, steps: &[&str], now: Timestamp) -> NewTask {
    let id = task_id(id);
    let task = Task::new(id.clone(), WorkflowName::new(workflow).expect("valid workflow name"), 1, json!({ "order": id.as_str() }), now);
    let steps = steps
        .iter()
        .enumerate()
        .map(|(position, name)| Step::new(id.clone(), StepName::new(*name).expect("valid step name"), position as u32, now))
        .collect();
    let events = vec![Event::task(&id, now, EventKind::Received, json!({ "by": "conformance" }))];
    NewTask { task, steps, messages: Vec::new(), events }
}

async fn create(store: &SharedStore, new: NewTask) {
    let id = new.task.id.clone();
    match store.create_task(new).await {
        Ok(Created::New) => {}
        other => panic!("create_task({id}) of a new id: expected Ok(Created::New), got {other:?}"),
    }
}

async fn stored(store: &SharedStore, id: &TaskId) -> TaskRecord {
    store.task(id).await.expect("task").unwrap_or_else(|| panic!("task {id} is missing"))
}

fn step_of<'r>(record: &'r TaskRecord, name: &str) -> &'r Step {
    record.steps.iter().find(|s| s.name.as_str() == name).unwrap_or_else(|| panic!("task {} has no step {name}", record.task.id))
}

async fn claim(store: &SharedStore, owner: &InstanceId, lease: Duration, max: u32) -> Vec<Task> {
    store.claim_tasks(owner, lease, max).await.unwrap_or_else(|e| panic!("claim_tasks by {owner} failed: {e}"))
}

/// Claims exactly the task `id` (the only claimable one), returning it.
async fn claim_only(store: &SharedStore, owner: &InstanceId, lease: Duration, id: &TaskId) -> Task {
    let mut claimed = claim(store, owner, lease, 10).await;
    assert_eq!(claimed.iter().map(|t| &t.id).collect::<Vec<_>>(), vec![id], "claim_tasks by {owner}: expected exactly {id}");
    claimed.remove(0)
}

async fn commit(store: &SharedStore, changes: Changes, what: &str) {
    store.commit(changes).await.unwrap_or_else(|e| panic!("{what}: commit failed: {e}"));
}

async fn history_kinds(store: &SharedStore, id: &TaskId) -> Vec<EventKind> {
    store.history(id).await.expect("history").into_iter().map(|e| e.kind).collect()
}

fn task_ids(tasks: &[Task]) -> Vec<&str> {
    tasks.iter().map(|t| t.id.as_str()).collect()
}

fn ok<T, E: Debug>(result: Result<T, E>, what: &str) -> T {
    result.unwrap_or_else(|e| panic!("{what}: {e:?}"))
}

// ---------------------------------------------------------------------------
// Queues.
// ---------------------------------------------------------------------------

/// `send` returns the message id, not a duplicate. `receive` leases the
/// oldest visible messages first (by visible time, then send order), each
/// with delivery count 1, its own lease token, a lease of the queue's default
/// or of the receive's length, the body as the exact text sent, and the send
/// time as `enqueued_at`.
pub async fn send_then_receive_oldest_visible_first(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let orders = queue("orders");
    let t0 = clock.now();

    let text = r#"{"order": 17, "lines": [{"sku": "A-1", "qty": 2}], "note": "café ☕", "z": null, "a": 1.5}"#;
    let first = send(&store, &orders, Outgoing::parse(text).unwrap()).await;
    assert!(!first.duplicate, "a first send is not a duplicate: {first:?}");
    let b = send_label(&store, &orders, "b").await;
    let c = send_label(&store, &orders, "c").await;
    let sent_ids: BTreeSet<_> = [&first.id, &b.id, &c.id].into_iter().collect();
    assert_eq!(sent_ids.len(), 3, "the store assigns distinct ids: {first:?} {b:?} {c:?}");

    let got = receive_now(&store, &orders, 1).await;
    assert_eq!(got.len(), 1, "receive max 1 returns one message: {got:?}");
    let d = &got[0];
    assert_eq!(d.id, first.id, "the oldest message comes first");
    assert_eq!(d.queue, orders);
    assert_eq!(d.body.get(), text, "the body comes back as the exact text sent");
    assert_eq!(d.delivery_count, 1, "a first delivery has delivery_count 1");
    assert_eq!(d.enqueued_at, t0, "enqueued_at is the send time");
    assert_eq!(d.lease_until, t0.add(LEASE_DEFAULT), "the queue's default lease is 30 s");
    assert_eq!(d.ordering_key, None);

    let short = Duration::from_secs(5);
    let rest = receive(&store, &orders, Receive::up_to(10).leasing(short)).await;
    assert_eq!(ids(&rest), vec![b.id, c.id], "the others follow in send order");
    assert_eq!(labels(&rest), vec!["b", "c"]);
    for d in &rest {
        assert_eq!(d.lease_until, t0.add(short), "Receive::lease overrides the queue's lease");
        assert_eq!(d.delivery_count, 1);
    }
    let tokens: BTreeSet<LeaseToken> = got.iter().chain(&rest).map(|d| d.lease_token).collect();
    assert_eq!(tokens.len(), 3, "every delivery has its own lease token");

    // Visible time decides before send order: an abandoned message goes
    // behind one that has been waiting longer, and a delayed one is placed by
    // the time its delay ends. Checked twice: which message each receive of
    // one leases, and the order of the messages one receive returns.
    for (name, one_at_a_time) in [("visible-order-single", true), ("visible-order-batch", false)] {
        let work = queue(name);
        let t1 = clock.now();
        let x = send_label(&store, &work, "x").await;
        let y = send_label(&store, &work, "y").await;
        let z = send(&store, &work, labelled("z").with_delay(Duration::from_secs(3))).await;
        clock.advance(SECOND);
        let x1 = receive(&store, &work, Receive::up_to(1)).await.remove(0);
        assert_eq!(x1.id, x.id, "x was sent first");
        ok(store.abandon(&work, x1.lease_token, Duration::ZERO, None).await, "abandon x");
        clock.set(t1.add(Duration::from_secs(3)));
        let mut got = Vec::new();
        if one_at_a_time {
            for _ in 0..3 {
                got.extend(receive(&store, &work, Receive::up_to(1)).await);
            }
        } else {
            got = receive_now(&store, &work, 10).await;
        }
        let how = if one_at_a_time { "leased by receives of max 1" } else { "returned by one receive" };
        assert_eq!(
            ids(&got),
            vec![y.id, x.id, z.id],
            "{how}, oldest visible first: y (visible t0), x (abandoned at t0+1s), z (delayed to t0+3s); got {:?}",
            labels(&got)
        );
    }
}

/// Peek-lock: a leased message is not delivered again until its lease
/// expires (`lease_until <= now`); then it is delivered again with count 2 and
/// a new token, and the old token is refused by every lease operation.
pub async fn a_leased_message_is_hidden_until_its_lease_expires(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let jobs = queue("jobs");
    let sent = send_label(&store, &jobs, "job").await;

    let first = receive_one(&store, &jobs, "the first delivery").await;
    assert_eq!((first.id.clone(), first.delivery_count), (sent.id.clone(), 1));
    assert_nothing_to_receive(&store, &jobs, "while the lease runs").await;
    assert_eq!(counts(&store, &jobs).await, (0, 1, 0, 0), "stats count the message as leased");

    clock.advance(LEASE_DEFAULT - MILLI);
    assert_nothing_to_receive(&store, &jobs, "1 ms before the lease ends").await;
    clock.advance(MILLI);
    assert_eq!(clock.now(), first.lease_until);
    let second = receive_one(&store, &jobs, "at lease_until the lease has expired").await;
    assert_eq!(second.id, sent.id);
    assert_eq!(second.delivery_count, 2, "the second delivery has delivery_count 2");
    assert_ne!(second.lease_token, first.lease_token, "a new delivery has a new token");
    assert_eq!(second.lease_until, clock.now().add(LEASE_DEFAULT));
    assert_eq!(label(&second), "job");

    let old = first.lease_token;
    assert_err!(store.complete(&jobs, old).await, Error::LeaseLost(_), "complete with the first delivery's token");
    assert_err!(store.abandon(&jobs, old, Duration::ZERO, None).await, Error::LeaseLost(_), "abandon with the first delivery's token");
    assert_err!(store.renew(&jobs, old, None).await, Error::LeaseLost(_), "renew with the first delivery's token");
    assert_err!(store.dead_letter(&jobs, old, "stale".into()).await, Error::LeaseLost(_), "dead_letter with the first delivery's token");

    assert_nothing_to_receive(&store, &jobs, "the stale operations must not release the current lease").await;
    assert_eq!(counts(&store, &jobs).await, (0, 1, 0, 0), "the stale operations changed nothing");
    complete(&store, &jobs, &second).await;
    assert_eq!(counts(&store, &jobs).await, (0, 0, 0, 0), "complete deletes the message");
    clock.advance(LEASE_DEFAULT * 2);
    assert_nothing_to_receive(&store, &jobs, "a completed message is gone").await;
}

/// A token is refused once its lease has expired (even if nobody received
/// the message since), on another queue than its own, after the message was
/// completed, and when it was never issued.
pub async fn stale_and_foreign_tokens_lose_the_lease(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let left = queue("left");
    let right = queue("right");

    send_label(&store, &left, "expiring").await;
    let expiring = receive_one(&store, &left, "the expiring message").await;
    clock.advance(LEASE_DEFAULT);
    assert_err!(
        store.complete(&left, expiring.lease_token).await,
        Error::LeaseLost(_),
        "complete at lease_until, with nobody having received the message since"
    );
    assert_err!(store.renew(&left, expiring.lease_token, None).await, Error::LeaseLost(_), "renew after the lease expired");
    let again = receive_one(&store, &left, "the refused complete must not delete the message").await;
    assert_eq!((label(&again), again.delivery_count), ("expiring".into(), 2));
    complete(&store, &left, &again).await;

    send_label(&store, &left, "mine").await;
    send_label(&store, &right, "theirs").await;
    let mine = receive_one(&store, &left, "the left message").await;
    let token = mine.lease_token;
    assert_err!(store.complete(&right, token).await, Error::LeaseLost(_), "complete on another queue");
    assert_err!(store.abandon(&right, token, Duration::ZERO, None).await, Error::LeaseLost(_), "abandon on another queue");
    assert_err!(store.renew(&right, token, None).await, Error::LeaseLost(_), "renew on another queue");
    assert_err!(store.dead_letter(&right, token, "wrong".into()).await, Error::LeaseLost(_), "dead_letter on another queue");
    assert_eq!(counts(&store, &right).await, (1, 0, 0, 0), "the other queue is untouched");
    assert_eq!(counts(&store, &left).await, (0, 1, 0, 0), "the message stays leased");

    complete(&store, &left, &mine).await;
    assert_err!(store.complete(&left, token).await, Error::LeaseLost(_), "completing the same token twice");
    assert_err!(store.abandon(&left, token, Duration::ZERO, None).await, Error::LeaseLost(_), "abandon after complete");

    let forged = LeaseToken { message: 987_654_321, epoch: 1 };
    assert_err!(store.complete(&left, forged).await, Error::LeaseLost(_), "complete with a token never issued");
    assert_err!(store.renew(&left, forged, None).await, Error::LeaseLost(_), "renew with a token never issued");
}

/// `complete` deletes; `complete_batch` deletes the messages whose leases are
/// current and returns the tokens whose lease was lost, deleting nothing for
/// them.
pub async fn complete_deletes_and_complete_batch_reports_lost_tokens(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let batch = queue("batch");
    for name in ["a", "b", "c", "d", "e"] {
        send_label(&store, &batch, name).await;
    }
    let short = receive(&store, &batch, Receive::up_to(2).leasing(Duration::from_secs(10))).await;
    let long = receive(&store, &batch, Receive::up_to(3).leasing(Duration::from_secs(60))).await;
    assert_eq!(labels(&short), vec!["a", "b"]);
    assert_eq!(labels(&long), vec!["c", "d", "e"]);

    complete(&store, &batch, &long[0]).await;
    assert_eq!(counts(&store, &batch).await, (0, 4, 0, 0), "complete deleted c");
    clock.advance(Duration::from_secs(10));

    let tokens: Vec<LeaseToken> = short.iter().chain(&long).map(|d| d.lease_token).collect();
    let lost = ok(store.complete_batch(&batch, &tokens).await, "complete_batch");
    let lost: BTreeSet<LeaseToken> = lost.into_iter().collect();
    let expected: BTreeSet<LeaseToken> = [short[0].lease_token, short[1].lease_token, long[0].lease_token].into_iter().collect();
    assert_eq!(lost, expected, "complete_batch reports a and b (expired) and c (already completed) as lost");

    let back = receive_now(&store, &batch, 10).await;
    assert_eq!(labels(&back), vec!["a", "b"], "only the lost ones remain; d and e were deleted");
    assert!(back.iter().all(|d| d.delivery_count == 2), "a and b are delivered a second time: {back:?}");

    let lost = ok(store.complete_batch(&batch, &[]).await, "complete_batch of nothing");
    assert!(lost.is_empty(), "an empty batch loses nothing: {lost:?}");
    let tokens: Vec<LeaseToken> = back.iter().map(|d| d.lease_token).collect();
    let lost = ok(store.complete_batch(&batch, &tokens).await, "complete_batch of current leases");
    assert!(lost.is_empty(), "current leases are not lost: {lost:?}");
    assert_eq!(counts(&store, &batch).await, (0, 0, 0, 0));
}

/// `renew` extends a lease to now + lease (the queue's default, or the one
/// given) and returns the new expiry; the message stays hidden past its
/// original expiry.
pub async fn renew_extends_the_lease(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let slow = queue("slow");
    let t0 = clock.now();
    send_label(&store, &slow, "long job").await;
    let d = receive_one(&store, &slow, "the job").await;
    assert_eq!(d.lease_until, t0.add(LEASE_DEFAULT));

    clock.advance(Duration::from_secs(10));
    let until = ok(store.renew(&slow, d.lease_token, None).await, "renew with the queue's lease");
    assert_eq!(until, t0.add(Duration::from_secs(40)), "renew extends to now + the queue's lease");

    clock.advance(Duration::from_secs(20));
    assert_eq!(clock.now(), d.lease_until, "the clock stands at the original expiry");
    assert_nothing_to_receive(&store, &slow, "a renewed lease outlives its original expiry").await;

    let until = ok(store.renew(&slow, d.lease_token, Some(Duration::from_secs(5))).await, "renew for 5 s");
    assert_eq!(until, clock.now().add(Duration::from_secs(5)), "renew with a lease extends to now + that lease");
    clock.advance(Duration::from_secs(5) - MILLI);
    assert_nothing_to_receive(&store, &slow, "1 ms before the renewed lease ends").await;
    clock.advance(MILLI);
    let again = receive_one(&store, &slow, "the renewed lease has run out").await;
    assert_eq!(again.delivery_count, 2);
    assert_err!(store.renew(&slow, d.lease_token, None).await, Error::LeaseLost(_), "renew with the superseded token");
    complete(&store, &slow, &again).await;
}

/// `abandon` gives a message back: visible at once with a zero delay, after
/// the delay otherwise (counted as delayed meanwhile), each time with the
/// delivery count incremented on the next delivery.
pub async fn abandon_makes_the_message_visible_after_the_delay(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let retry = queue("retry");
    send_label(&store, &retry, "flaky").await;

    let d1 = receive_one(&store, &retry, "the first delivery").await;
    ok(store.abandon(&retry, d1.lease_token, Duration::ZERO, None).await, "abandon without delay");
    assert_err!(store.complete(&retry, d1.lease_token).await, Error::LeaseLost(_), "complete after abandon");
    let d2 = receive_one(&store, &retry, "an abandoned message is visible again at once").await;
    assert_eq!(d2.delivery_count, 2);
    assert_ne!(d2.lease_token, d1.lease_token);

    let delay = Duration::from_secs(10);
    ok(store.abandon(&retry, d2.lease_token, delay, Some("remote busy".into())).await, "abandon with a delay");
    assert_nothing_to_receive(&store, &retry, "during the abandon delay").await;
    assert_eq!(counts(&store, &retry).await, (0, 0, 1, 0), "an abandoned message waiting out its delay counts as delayed");
    clock.advance(delay - MILLI);
    assert_nothing_to_receive(&store, &retry, "1 ms before the abandon delay ends").await;
    clock.advance(MILLI);
    let d3 = receive_one(&store, &retry, "after the abandon delay").await;
    assert_eq!((label(&d3), d3.delivery_count), ("flaky".into(), 3));
    complete(&store, &retry, &d3).await;
}

/// With `deliveries_max: 2`, a message whose second lease expires is not
/// delivered a third time: the next receive dead-letters it with a reason
/// that names the deliveries.
pub async fn deliveries_max_dead_letters_after_the_last_delivery(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let fragile = queue("fragile");
    let config = QueueConfig { deliveries_max: 2, ..QueueConfig::default() };
    ok(store.create_queue(&fragile, config).await, "create_queue");
    let t0 = clock.now();
    let sent = send_label(&store, &fragile, "poison").await;

    let d1 = receive_one(&store, &fragile, "delivery 1").await;
    assert_eq!(d1.delivery_count, 1);
    clock.advance(LEASE_DEFAULT);
    let d2 = receive_one(&store, &fragile, "delivery 2").await;
    assert_eq!(d2.delivery_count, 2);
    clock.advance(LEASE_DEFAULT);
    assert_nothing_to_receive(&store, &fragile, "a message that used its 2 deliveries").await;

    let dead = ok(store.dead_letters(&fragile, 10).await, "dead_letters");
    assert_eq!(dead.len(), 1, "the message is dead-lettered: {dead:?}");
    let letter = &dead[0];
    assert_eq!(letter.id, sent.id);
    assert_eq!(letter.queue, fragile);
    assert_eq!(letter.body.get(), "\"poison\"");
    assert_eq!(letter.delivery_count, 2, "the dead letter keeps its delivery count");
    assert_eq!(letter.enqueued_at, t0);
    assert!(letter.dead_lettered_at >= d2.lease_until && letter.dead_lettered_at <= clock.now(), "dead_lettered_at: {letter:?}");
    assert!(letter.reason.to_lowercase().contains("deliver"), "the reason names the deliveries that ran out, got {:?}", letter.reason);
    assert_eq!(counts(&store, &fragile).await, (0, 0, 0, 1), "stats count one dead letter and nothing else");
    assert_err!(store.complete(&fragile, d2.lease_token).await, Error::LeaseLost(_), "complete of a dead-lettered message");
}

/// Abandoning a message at its last delivery dead-letters it at once (even
/// with a delay), keeping the abandon's reason.
pub async fn abandon_at_the_last_delivery_dead_letters_with_the_reason(harness: &dyn Harness) {
    let store = harness.open().await;
    let payments = queue("payments");
    ok(store.create_queue(&payments, QueueConfig { deliveries_max: 2, ..QueueConfig::default() }).await, "create_queue");
    let sent = send_label(&store, &payments, "charge").await;

    let d1 = receive_one(&store, &payments, "delivery 1").await;
    ok(store.abandon(&payments, d1.lease_token, Duration::ZERO, Some("first failure".into())).await, "abandon 1");
    let d2 = receive_one(&store, &payments, "delivery 2").await;
    assert_eq!(d2.delivery_count, 2);
    let reason = "handler crashed: card service returned 500";
    ok(store.abandon(&payments, d2.lease_token, Duration::from_secs(60), Some(reason.into())).await, "abandon at the last delivery");

    let dead = ok(store.dead_letters(&payments, 10).await, "dead_letters");
    assert_eq!(dead.len(), 1, "abandon at the last delivery dead-letters at once, without waiting for the delay: {dead:?}");
    assert_eq!(dead[0].id, sent.id);
    assert_eq!(dead[0].delivery_count, 2);
    assert!(dead[0].reason.contains(reason), "the dead letter keeps the abandon's reason {reason:?}, got {:?}", dead[0].reason);
    assert_eq!(counts(&store, &payments).await, (0, 0, 0, 1));
    assert_nothing_to_receive(&store, &payments, "a dead-lettered message").await;
}

/// `dead_letter` moves a leased message to the dead-letter queue at once,
/// keeping its id, body, key, delivery count and the given reason.
pub async fn dead_letter_moves_a_message_at_once_with_the_reason(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let inbox = queue("inbox");
    let t0 = clock.now();
    let sent = send(&store, &inbox, Outgoing::parse(r#"{"broken": true}"#).unwrap().with_ordering_key("customer-9")).await;
    send_label(&store, &inbox, "fine").await;

    let d = receive(&store, &inbox, Receive::up_to(1)).await.remove(0);
    assert_eq!(d.id, sent.id);
    clock.advance(SECOND);
    let reason = "poison: missing field `amount`";
    ok(store.dead_letter(&inbox, d.lease_token, reason.into()).await, "dead_letter");
    assert_err!(store.complete(&inbox, d.lease_token).await, Error::LeaseLost(_), "complete after dead_letter");

    let dead = ok(store.dead_letters(&inbox, 10).await, "dead_letters");
    assert_eq!(dead.len(), 1, "{dead:?}");
    let letter = &dead[0];
    assert_eq!(letter.id, sent.id);
    assert_eq!(letter.queue, inbox);
    assert_eq!(letter.body.get(), r#"{"broken": true}"#);
    assert_eq!(letter.ordering_key.as_deref(), Some("customer-9"));
    assert_eq!(letter.delivery_count, 1);
    assert_eq!(letter.enqueued_at, t0);
    assert_eq!(letter.dead_lettered_at, clock.now());
    assert_eq!(letter.reason, reason, "dead_letter keeps the reason as given");
    assert_eq!(counts(&store, &inbox).await, (1, 0, 0, 1), "one ready, one dead letter");
    let rest = receive_one(&store, &inbox, "the other message").await;
    assert_eq!(label(&rest), "fine");
    let elsewhere = queue("elsewhere");
    send_label(&store, &elsewhere, "unrelated").await;
    assert!(ok(store.dead_letters(&elsewhere, 10).await, "dead_letters of another queue").is_empty(), "dead letters are per queue");
}

/// Dead letters are listed oldest first within the limit; `redrive` sends
/// them back with a fresh delivery count (`One` of an unknown id is
/// `NotFound`, `All` returns how many moved); `purge_dead_letters` deletes
/// them and returns how many.
pub async fn redrive_and_purge_dead_letters(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let mail = queue("mail");
    ok(store.create_queue(&mail, QueueConfig { deliveries_max: 2, ..QueueConfig::default() }).await, "create_queue");
    let names = ["a", "b", "c", "d"];
    for name in names {
        send_label(&store, &mail, name).await;
    }
    let delivered = receive_now(&store, &mail, 10).await;
    assert_eq!(labels(&delivered), names);
    for d in &delivered {
        clock.advance(MILLI);
        ok(store.dead_letter(&mail, d.lease_token, format!("bad {}", label(d))).await, "dead_letter");
    }
    let dead = ok(store.dead_letters(&mail, 10).await, "dead_letters");
    assert_eq!(dead.iter().map(|l| l.reason.as_str()).collect::<Vec<_>>(), ["bad a", "bad b", "bad c", "bad d"], "oldest first");
    let two = ok(store.dead_letters(&mail, 2).await, "dead_letters limit 2");
    assert_eq!(two.iter().map(|l| l.id.clone()).collect::<Vec<_>>(), vec![dead[0].id.clone(), dead[1].id.clone()], "the limit is honoured");

    let moved = ok(store.redrive(&mail, Redrive::One(delivered[1].id.clone())).await, "redrive b");
    assert_eq!(moved, 1);
    let left: Vec<_> = ok(store.dead_letters(&mail, 10).await, "dead_letters").into_iter().map(|l| l.id).collect();
    assert_eq!(left, vec![delivered[0].id.clone(), delivered[2].id.clone(), delivered[3].id.clone()], "b left the dead letters");
    let b = receive_one(&store, &mail, "the redriven message").await;
    assert_eq!((label(&b), b.delivery_count), ("b".into(), 1), "a redriven message starts a fresh delivery count");
    assert_eq!(b.id, delivered[1].id, "a redriven message keeps its id");

    assert_err!(store.redrive(&mail, Redrive::One(message_id("no-such-message"))).await, Error::NotFound(_), "redrive of an unknown id");
    assert_err!(store.redrive(&mail, Redrive::One(b.id.clone())).await, Error::NotFound(_), "redrive of a message that is not dead");
    complete(&store, &mail, &b).await;

    let moved = ok(store.redrive(&mail, Redrive::All).await, "redrive all");
    assert_eq!(moved, 3, "redrive all returns how many moved");
    assert!(ok(store.dead_letters(&mail, 10).await, "dead_letters").is_empty());
    let back = receive_now(&store, &mail, 10).await;
    let mut back_labels = labels(&back);
    back_labels.sort();
    assert_eq!(back_labels, ["a", "c", "d"]);
    assert!(back.iter().all(|d| d.delivery_count == 1), "fresh counts after redrive all: {back:?}");
    assert_eq!(ok(store.redrive(&mail, Redrive::All).await, "redrive all of nothing"), 0);

    for d in &back {
        ok(store.dead_letter(&mail, d.lease_token, "again".into()).await, "dead_letter");
    }
    assert_eq!(ok(store.purge_dead_letters(&mail).await, "purge"), 3, "purge returns how many it deleted");
    assert!(ok(store.dead_letters(&mail, 10).await, "dead_letters").is_empty(), "purge leaves no dead letter");
    assert_eq!(counts(&store, &mail).await, (0, 0, 0, 0));
    assert_eq!(ok(store.purge_dead_letters(&mail).await, "purge of nothing"), 0);
    assert_nothing_to_receive(&store, &mail, "after purge").await;
}

/// The walk over a queue's dead letters (`dead_letter_page`) goes oldest
/// first, looks at `scan` dead letters a page whatever the filter, returns
/// those the filter selects (reason substring, dead-lettered time range)
/// with their `seq`, and says where it got and whether it reached the end;
/// `count_dead_letters` counts the same selection. `redrive_listed` moves
/// the listed ones back with a fresh delivery count, and a second redrive
/// of the same `seq`s (a runner that crashed before recording its page)
/// moves nothing: the live queue holds each message once. A redrive batch
/// keeps its dead-letter filter and its `seq` cursor.
pub async fn dead_letters_are_walked_a_bounded_page_at_a_time_and_redriven_once(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let mail = queue("mail");
    ok(store.create_queue(&mail, QueueConfig::default()).await, "create_queue");
    let names = ["a", "b", "c", "d", "e", "f", "g"];
    for name in names {
        send_label(&store, &mail, name).await;
    }
    let t0 = clock.now();
    for d in receive_now(&store, &mail, 10).await {
        clock.advance(SECOND);
        // b, d and f time out; the others are refused.
        let reason = if ["b", "d", "f"].contains(&label(&d).as_str()) { "agent timeout after 30s" } else { "HTTP 400" };
        ok(store.dead_letter(&mail, d.lease_token, format!("{reason} ({})", label(&d))).await, "dead_letter");
    }
    let other = queue("other");
    send_label(&store, &other, "x").await;
    let x = receive_one(&store, &other, "x").await;
    ok(store.dead_letter(&other, x.lease_token, "agent timeout".into()).await, "dead_letter x");

    let timeouts = DeadLetterFilter { reason_contains: Some("timeout".into()), ..DeadLetterFilter::all(mail.clone()) };
    assert_eq!(ok(store.count_dead_letters(&timeouts).await, "count timeouts"), 3, "b, d and f; not x, of another queue");
    assert_eq!(ok(store.count_dead_letters(&DeadLetterFilter::all(mail.clone())).await, "count all"), 7);
    let from_c_to_f = DeadLetterFilter {
        dead_lettered: TimeRange { from: Some(t0 + 3 * SECOND), until: Some(t0 + 6 * SECOND) },
        ..DeadLetterFilter::all(mail.clone())
    };
    assert_eq!(ok(store.count_dead_letters(&from_c_to_f).await, "count by time"), 3, "c, d and e: from inclusive, until exclusive");
    let timeout_case = DeadLetterFilter { reason_contains: Some("TIMEOUT".into()), ..DeadLetterFilter::all(mail.clone()) };
    assert_eq!(ok(store.count_dead_letters(&timeout_case).await, "count by case"), 0, "the reason match is case-sensitive");

    // Pages of three: a b c | d e f | g. Each looks at three, whatever matches.
    let first = ok(store.dead_letter_page(&timeouts, None, 3).await, "first page");
    let picked = |page: &DeadLetterPage| page.letters.iter().map(|(_, l)| l.reason.clone()).collect::<Vec<_>>();
    assert_eq!(picked(&first), ["agent timeout after 30s (b)"]);
    assert!(!first.end, "three looked at, more may follow");
    let through = first.scanned_through.expect("looked at three");
    assert!(first.letters[0].0 < through, "b comes before c, where the page stopped");
    let second = ok(store.dead_letter_page(&timeouts, Some(through), 3).await, "second page");
    assert_eq!(picked(&second), ["agent timeout after 30s (d)", "agent timeout after 30s (f)"]);
    let third = ok(store.dead_letter_page(&timeouts, second.scanned_through, 3).await, "third page");
    assert!(third.letters.is_empty() && third.end, "g does not match and ends the walk: {third:?}");
    assert!(third.scanned_through > second.scanned_through);
    let past = ok(store.dead_letter_page(&timeouts, third.scanned_through, 3).await, "past the end");
    assert_eq!((past.letters.len(), past.scanned_through, past.end), (0, None, true));
    let by_time = ok(store.dead_letter_page(&from_c_to_f, None, 10).await, "by time");
    assert_eq!(
        by_time.letters.iter().map(|(_, l)| l.reason.clone()).collect::<Vec<_>>(),
        ["HTTP 400 (c)", "agent timeout after 30s (d)", "HTTP 400 (e)"]
    );
    assert_eq!(by_time.letters[0].1.queue, mail, "{by_time:?}");
    assert_err!(store.dead_letter_page(&DeadLetterFilter::all(queue("nope")), None, 3).await, Error::NotFound(_), "an unknown queue");

    // Redrive the second page; then again, as a runner that crashed before
    // recording it would.
    let seqs: Vec<u64> = second.letters.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(ok(store.redrive_listed(&mail, &seqs).await, "redrive d and f"), 2);
    assert_eq!(ok(store.redrive_listed(&mail, &seqs).await, "redrive d and f again"), 0, "gone from the dead letters: nothing moved");
    assert_eq!(ok(store.redrive_listed(&mail, &[]).await, "redrive nothing"), 0);
    assert_eq!(
        ok(store.redrive_listed(&other, &[first.letters[0].0]).await, "b's seq on another queue"),
        0,
        "a seq of another queue is not moved"
    );
    let back = receive_now(&store, &mail, 10).await;
    assert_eq!(labels(&back), ["d", "f"], "each once, in the order they were dead-lettered");
    assert!(back.iter().all(|d| d.delivery_count == 1), "fresh delivery counts: {back:?}");
    assert_eq!(ok(store.count_dead_letters(&timeouts).await, "count timeouts"), 1, "b is left");
    assert_eq!(ok(store.count_dead_letters(&DeadLetterFilter::all(other.clone())).await, "count other"), 1, "x is left");

    // A redrive batch keeps its filter and its cursor.
    let new = NewBatch {
        id: "r1".into(),
        action: BatchAction::Redrive,
        filter: BatchFilter::DeadLetters(timeouts.clone()),
        total: 3,
        requested_by: "ops".into(),
        reason: None,
    };
    let created = ok(store.create_batch(&new).await, "create_batch");
    assert_eq!((created.action, &created.filter), (BatchAction::Redrive, &BatchFilter::DeadLetters(timeouts)));
    let runner = instance("runner-a");
    ok(store.claim_batch(Some("r1"), &runner, 10 * SECOND).await, "claim_batch").expect("free");
    let page =
        BatchProgress { cursor: Some(BatchCursor::DeadLetter(through)), done: 1, skipped: 0, failed: 0, last_error: None, finished: false };
    let advanced = ok(store.advance_batch("r1", &runner, &page, 10 * SECOND).await, "advance_batch").expect("held");
    assert_eq!(advanced.cursor, Some(BatchCursor::DeadLetter(through)));
    assert_eq!(ok(store.batch("r1").await, "batch"), Some(advanced), "read back alike");
}

/// A message sent with a delay is invisible, and counted as delayed, until
/// the delay has passed.
pub async fn delayed_messages_wait_for_their_delay(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let reminders = queue("reminders");
    let t0 = clock.now();
    let delay = Duration::from_secs(5);
    let later = send(&store, &reminders, labelled("later").with_delay(delay)).await;
    send_label(&store, &reminders, "now").await;

    let first = receive_now(&store, &reminders, 10).await;
    assert_eq!(labels(&first), vec!["now"], "only the undelayed message is visible");
    let stats = stats_of(&store, &reminders).await.expect("the queue is listed");
    assert_eq!((stats.ready, stats.leased, stats.delayed), (0, 1, 1), "stats count the delayed message: {stats:?}");

    clock.advance(delay - MILLI);
    assert_nothing_to_receive(&store, &reminders, "1 ms before the delay ends").await;
    clock.advance(MILLI);
    let d = receive_one(&store, &reminders, "once the delay has passed").await;
    assert_eq!(d.id, later.id);
    assert_eq!(d.delivery_count, 1);
    assert_eq!(d.enqueued_at, t0, "enqueued_at is the send time, not the end of the delay");
    assert_eq!(counts(&store, &reminders).await, (0, 2, 0, 0));
}

/// Messages with an ordering key are delivered one lease at a time per key,
/// in send order; a leased head blocks only its own key. Completing or
/// dead-lettering the head lets the next one through.
pub async fn ordering_keys_deliver_fifo_one_lease_per_key(harness: &dyn Harness) {
    let store = harness.open().await;
    let sessions = queue("sessions");
    send(&store, &sessions, labelled("a").with_ordering_key("k1")).await;
    send(&store, &sessions, labelled("b").with_ordering_key("k1")).await;
    send(&store, &sessions, labelled("c").with_ordering_key("k2")).await;
    send(&store, &sessions, labelled("d").with_ordering_key("k2")).await;
    send_label(&store, &sessions, "u").await;

    let first = receive_now(&store, &sessions, 10).await;
    assert_eq!(labels(&first), vec!["a", "c", "u"], "one head per key, and unkeyed messages are not blocked");
    assert_eq!(first[0].ordering_key.as_deref(), Some("k1"));
    assert_eq!(first[1].ordering_key.as_deref(), Some("k2"));
    assert_eq!(first[2].ordering_key, None);
    assert_nothing_to_receive(&store, &sessions, "every key's head is leased").await;

    complete(&store, &sessions, &first[0]).await;
    let b = receive_one(&store, &sessions, "b follows a once a is completed").await;
    assert_eq!(label(&b), "b");

    ok(store.dead_letter(&sessions, first[1].lease_token, "poison".into()).await, "dead_letter c");
    let d = receive_one(&store, &sessions, "d follows c once c is dead-lettered").await;
    assert_eq!(label(&d), "d");
}

/// The head of a key that is abandoned, or whose lease expires, is delivered
/// again before the key's later messages.
pub async fn an_ordering_key_head_comes_back_before_its_successors(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let sessions = queue("sessions");
    send(&store, &sessions, labelled("a").with_ordering_key("k")).await;
    send(&store, &sessions, labelled("b").with_ordering_key("k")).await;

    let a1 = receive_one(&store, &sessions, "the head").await;
    assert_eq!(label(&a1), "a");
    ok(store.abandon(&sessions, a1.lease_token, Duration::ZERO, None).await, "abandon a");
    let a2 = receive_one(&store, &sessions, "the abandoned head comes back, alone").await;
    assert_eq!((label(&a2), a2.delivery_count), ("a".into(), 2), "a comes again before b");

    clock.advance(LEASE_DEFAULT);
    let a3 = receive_one(&store, &sessions, "the expired head comes back, alone").await;
    assert_eq!((label(&a3), a3.delivery_count), ("a".into(), 3), "a comes again before b");

    complete(&store, &sessions, &a3).await;
    let b = receive_one(&store, &sessions, "b once a is completed").await;
    assert_eq!((label(&b), b.delivery_count), ("b".into(), 1));
}

/// A message id seen within the queue's duplicate-detection window is
/// dropped: the send returns the id with `duplicate: true` and adds nothing,
/// also after the first one was completed and also within one batch. Once
/// the window has passed, the id is accepted again.
pub async fn duplicate_ids_are_dropped_within_the_window(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let dedupe = queue("dedupe");
    let window = Duration::from_secs(60);
    ok(store.create_queue(&dedupe, QueueConfig { dedupe_window: window, ..QueueConfig::default() }).await, "create_queue");
    let x = message_id("order-17/charge/1");

    let first = send(&store, &dedupe, labelled("x1").with_id(x.clone())).await;
    assert_eq!(first, Sent { id: x.clone(), duplicate: false });
    let second = send(&store, &dedupe, labelled("x2").with_id(x.clone())).await;
    assert_eq!(second, Sent { id: x.clone(), duplicate: true }, "the same id again is a duplicate");
    let other = send(&store, &dedupe, labelled("y").with_id(message_id("order-17/charge/2"))).await;
    assert!(!other.duplicate, "a different id is accepted");
    let unnamed1 = send_label(&store, &dedupe, "n1").await;
    let unnamed2 = send_label(&store, &dedupe, "n2").await;
    assert!(!unnamed1.duplicate && !unnamed2.duplicate && unnamed1.id != unnamed2.id, "messages without id are never duplicates");
    assert_eq!(counts(&store, &dedupe).await, (4, 0, 0, 0), "the duplicate added nothing");

    let all = receive_now(&store, &dedupe, 10).await;
    assert_eq!(labels(&all), vec!["x1", "y", "n1", "n2"], "the first send's body is kept");
    let tokens: Vec<LeaseToken> = all.iter().map(|d| d.lease_token).collect();
    assert!(ok(store.complete_batch(&dedupe, &tokens).await, "complete_batch").is_empty());
    let after_complete = send(&store, &dedupe, labelled("x3").with_id(x.clone())).await;
    assert!(after_complete.duplicate, "an id is remembered for the window even after its message was completed");
    assert_eq!(counts(&store, &dedupe).await, (0, 0, 0, 0));

    let batch = vec![
        labelled("z1").with_id(message_id("z")),
        labelled("z2").with_id(message_id("z")),
        labelled("w").with_id(message_id("w")),
        labelled("x4").with_id(x.clone()),
    ];
    let sent = ok(store.send_batch(&dedupe, batch).await, "send_batch");
    let flags: Vec<(&str, bool)> = sent.iter().map(|s| (s.id.as_str(), s.duplicate)).collect();
    assert_eq!(flags, [("z", false), ("z", true), ("w", false), (x.as_str(), true)], "duplicates within and across batches");
    let got = receive_now(&store, &dedupe, 10).await;
    assert_eq!(labels(&got), vec!["z1", "w"]);

    clock.advance(window + SECOND);
    let fresh = send(&store, &dedupe, labelled("x5").with_id(x.clone())).await;
    assert_eq!(fresh, Sent { id: x.clone(), duplicate: false }, "after the window has passed the id is accepted again");
    let d = receive_now(&store, &dedupe, 10).await;
    assert!(labels(&d).contains(&"x5".to_string()), "the re-sent x is delivered: {:?}", labels(&d));
}

/// A paused queue delivers nothing but accepts sends; stats say it is
/// paused; after resume its messages are delivered.
pub async fn pause_stops_deliveries_but_not_sends(harness: &dyn Harness) {
    let store = harness.open().await;
    let outbox = queue("outbox");
    send_label(&store, &outbox, "before").await;
    ok(store.pause(&outbox).await, "pause");
    let during = send_label(&store, &outbox, "during").await;
    assert!(!during.duplicate);
    assert_nothing_to_receive(&store, &outbox, "a paused queue").await;
    let stats = stats_of(&store, &outbox).await.expect("the queue is listed");
    assert!(stats.paused, "stats show the queue as paused: {stats:?}");
    assert_eq!(stats.ready, 2, "both messages wait: {stats:?}");

    ok(store.resume(&outbox).await, "resume");
    assert!(!stats_of(&store, &outbox).await.expect("listed").paused, "stats show the queue as resumed");
    let got = receive_now(&store, &outbox, 10).await;
    assert_eq!(labels(&got), vec!["before", "during"]);
}

/// `send_batch` of 200 returns 200 distinct ids in order, all receivable in
/// send order; `receive` never returns more than `max`.
pub async fn send_batch_and_receive_max(harness: &dyn Harness) {
    let store = harness.open().await;
    let bulk = queue("bulk");
    let messages: Vec<Outgoing> = (0..200).map(|n| Outgoing::json(&json!({ "n": n })).unwrap()).collect();
    let sent = ok(store.send_batch(&bulk, messages).await, "send_batch of 200");
    assert_eq!(sent.len(), 200, "one Sent per message");
    assert!(sent.iter().all(|s| !s.duplicate), "nothing in the batch is a duplicate");
    assert_eq!(sent.iter().map(|s| &s.id).collect::<BTreeSet<_>>().len(), 200, "distinct ids");
    assert_eq!(counts(&store, &bulk).await, (200, 0, 0, 0));

    let first = receive_now(&store, &bulk, 50).await;
    assert_eq!(first.len(), 50, "receive max 50 returns 50");
    let rest = receive_now(&store, &bulk, RECEIVE_MAX).await;
    assert_eq!(rest.len(), 150, "the rest");
    let all: Vec<&Delivery> = first.iter().chain(&rest).collect();
    let numbers: Vec<i64> =
        all.iter().map(|d| serde_json::from_str::<Value>(d.body.get()).unwrap()["n"].as_i64().expect("body has n")).collect();
    assert_eq!(numbers, (0..200).collect::<Vec<i64>>(), "delivered in send order");
    let delivered: Vec<&MessageId> = all.iter().map(|d| &d.id).collect();
    assert_eq!(delivered, sent.iter().map(|s| &s.id).collect::<Vec<_>>(), "delivery ids are the sent ids");
    assert!(ok(store.send_batch(&bulk, Vec::new()).await, "send_batch of nothing").is_empty());
}

/// Queues are created with the defaults on first send; `create_queue` sets
/// and later updates a config that `queue_config` returns (`None` for an
/// unknown queue) and that receives use. `stats` lists every queue sorted by
/// name with ready, leased, delayed and dead-lettered counts.
pub async fn stats_and_queue_configs(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let zeta = queue("zeta");
    let alpha = queue("alpha");
    let mid = queue("mid");

    assert_eq!(ok(store.queue_config(&zeta).await, "queue_config"), None, "an unknown queue has no config");
    let custom = QueueConfig { lease: Duration::from_secs(5), deliveries_max: 3, dedupe_window: Duration::from_secs(60) };
    ok(store.create_queue(&alpha, custom.clone()).await, "create_queue");
    assert_eq!(ok(store.queue_config(&alpha).await, "queue_config"), Some(custom), "create_queue's config is kept");
    let updated = QueueConfig { lease: Duration::from_secs(7), deliveries_max: 4, dedupe_window: Duration::from_secs(90) };
    ok(store.create_queue(&alpha, updated.clone()).await, "create_queue on an existing queue");
    assert_eq!(ok(store.queue_config(&alpha).await, "queue_config"), Some(updated.clone()), "create_queue updates the config");
    send_label(&store, &alpha, "probe").await;
    let probe = receive_one(&store, &alpha, "the probe").await;
    assert_eq!(probe.lease_until, clock.now().add(updated.lease), "receive uses the updated queue lease");
    complete(&store, &alpha, &probe).await;

    let t0 = clock.now();
    send_label(&store, &zeta, "leased").await;
    send_label(&store, &zeta, "dead").await;
    clock.advance(SECOND);
    send_label(&store, &zeta, "ready 1").await;
    send_label(&store, &zeta, "ready 2").await;
    send(&store, &zeta, labelled("delayed").with_delay(Duration::from_secs(60))).await;
    assert_eq!(ok(store.queue_config(&zeta).await, "queue_config"), Some(QueueConfig::default()), "auto-created with the defaults");
    let taken = receive_now(&store, &zeta, 2).await;
    assert_eq!(labels(&taken), vec!["leased", "dead"]);
    ok(store.dead_letter(&zeta, taken[1].lease_token, "test".into()).await, "dead_letter");
    send_label(&store, &mid, "m").await;

    let stats = ok(store.stats().await, "stats");
    let names: Vec<&str> = stats.iter().map(|s| s.queue.as_str()).collect();
    assert_eq!(names, ["alpha", "mid", "zeta"], "stats list every queue, sorted by name");
    let by_name: HashMap<&str, &QueueStats> = stats.iter().map(|s| (s.queue.as_str(), s)).collect();
    let a = by_name["alpha"];
    assert_eq!((a.ready, a.leased, a.delayed, a.dead_lettered, a.paused, a.oldest_ready_at), (0, 0, 0, 0, false, None), "alpha: {a:?}");
    let m = by_name["mid"];
    assert_eq!((m.ready, m.leased, m.delayed, m.dead_lettered), (1, 0, 0, 0), "mid: {m:?}");
    let z = by_name["zeta"];
    assert_eq!((z.ready, z.leased, z.delayed, z.dead_lettered, z.paused), (2, 1, 1, 1, false), "zeta: {z:?}");
    assert_eq!(z.oldest_ready_at, Some(t0.add(SECOND)), "the oldest ready message was sent at t0 + 1 s: {z:?}");
}

/// `backlogs` counts the visible messages of each named queue that exists
/// (a paused queue's too), never leased, delayed or dead-lettered ones,
/// stops at its bound, and says whether a consumer holds one leased.
pub async fn backlogs_count_ready_messages_up_to_a_bound_and_see_leases(harness: &dyn Harness) {
    let store = harness.open().await;
    let (first, second, other, missing) = (queue("first"), queue("second"), queue("other"), queue("missing"));
    for label in ["a", "b", "c", "d"] {
        send_label(&store, &first, label).await;
    }
    send(&store, &first, labelled("later").with_delay(Duration::from_secs(60))).await;
    send_label(&store, &second, "e").await;
    send_label(&store, &second, "f").await;
    send_label(&store, &other, "elsewhere").await;
    let taken = receive_now(&store, &first, 2).await;
    ok(store.dead_letter(&first, taken[1].lease_token, "test".into()).await, "dead_letter");
    ok(store.pause(&second).await, "pause");

    let asked = [second.clone(), missing.clone(), first.clone()];
    let backlogs = |up_to: u32| {
        let (store, asked) = (store.clone(), asked.clone());
        async move {
            let found = ok(store.backlogs(&asked, up_to).await, "backlogs");
            found.into_iter().map(|b| (b.queue.as_str().to_owned(), b.ready, b.leased)).collect::<Vec<_>>()
        }
    };
    let expected = |first_ready: u64, first_leased: bool, second_ready: u64| {
        vec![("second".to_owned(), second_ready, false), ("first".to_owned(), first_ready, first_leased)]
    };
    assert_eq!(backlogs(100).await, expected(2, true, 2), "in the order asked, without the missing queue");
    assert_eq!(backlogs(1).await, expected(1, true, 1), "counting stops at the bound");
    assert_eq!(backlogs(0).await, expected(0, true, 0), "a bound of 0 counts nothing");
    assert_eq!(ok(store.backlogs(&[], 100).await, "backlogs of no queue"), Vec::new());
    complete(&store, &first, &taken[0]).await;
    assert_eq!(backlogs(100).await, expected(2, false, 2), "nothing leased once the lease is completed");
    harness.clock().advance(Duration::from_secs(61));
    assert_eq!(backlogs(100).await, expected(3, false, 2), "the delayed message is ready once its delay passed");
}

/// Out-of-bounds requests fail with `Invalid` and store nothing: receive max
/// 0 or above [`RECEIVE_MAX`], a zero lease, `deliveries_max: 0`, a body
/// larger than [`BODY_BYTES_MAX`] (alone or in a batch).
pub async fn invalid_requests_are_refused_and_store_nothing(harness: &dyn Harness) {
    let store = harness.open().await;
    let checks = queue("checks");
    send_label(&store, &checks, "resident").await;

    assert_err!(store.receive(&checks, Receive::up_to(0)).await, Error::Invalid(_), "receive max 0");
    assert_err!(store.receive(&checks, Receive::up_to(RECEIVE_MAX + 1)).await, Error::Invalid(_), "receive max RECEIVE_MAX + 1");
    assert_err!(store.receive(&checks, Receive::up_to(1).leasing(Duration::ZERO)).await, Error::Invalid(_), "receive with a zero lease");
    assert_eq!(counts(&store, &checks).await, (1, 0, 0, 0), "invalid receives lease nothing");

    let strict = queue("strict");
    let zero = QueueConfig { deliveries_max: 0, ..QueueConfig::default() };
    assert_err!(store.create_queue(&strict, zero).await, Error::Invalid(_), "deliveries_max 0");
    assert_eq!(ok(store.queue_config(&strict).await, "queue_config"), None, "a refused create_queue creates nothing");

    let too_big = format!("\"{}\"", "x".repeat(BODY_BYTES_MAX - 1));
    assert_eq!(too_big.len(), BODY_BYTES_MAX + 1);
    assert_err!(store.send(&checks, Outgoing::parse(&too_big).unwrap()).await, Error::Invalid(_), "a body of BODY_BYTES_MAX + 1 bytes");
    let batch = vec![labelled("small"), Outgoing::parse(&too_big).unwrap()];
    assert_err!(store.send_batch(&checks, batch).await, Error::Invalid(_), "a batch with one body too large");
    assert_eq!(counts(&store, &checks).await, (1, 0, 0, 0), "refused sends store nothing, not even the batch's valid message");

    let fits = format!("\"{}\"", "x".repeat(BODY_BYTES_MAX - 2));
    assert_eq!(fits.len(), BODY_BYTES_MAX);
    ok(store.send(&checks, Outgoing::parse(&fits).unwrap()).await, "a body of exactly BODY_BYTES_MAX bytes is accepted");
    let all = receive_now(&store, &checks, RECEIVE_MAX).await;
    assert_eq!(all.len(), 2, "receive max RECEIVE_MAX is valid");
    assert_eq!(all[1].body.get().len(), BODY_BYTES_MAX, "the largest body comes back whole");
}

/// Four concurrent receivers draining 400 messages, 7 at a time, get every
/// message exactly once.
pub async fn concurrent_receivers_get_each_message_once(harness: &dyn Harness) {
    const MESSAGES: usize = 400;
    const RECEIVERS: usize = 4;
    let store = harness.open().await;
    let shared = queue("shared");
    let messages: Vec<Outgoing> = (0..MESSAGES).map(|n| Outgoing::json(&n).unwrap()).collect();
    let sent = ok(store.send_batch(&shared, messages).await, "send_batch");
    let sent: BTreeSet<MessageId> = sent.into_iter().map(|s| s.id).collect();

    let mut receivers = tokio::task::JoinSet::new();
    for r in 0..RECEIVERS {
        let store = store.clone();
        let shared = shared.clone();
        receivers.spawn(async move {
            let consumer = instance(&format!("receiver-{r}"));
            let mut got = Vec::new();
            loop {
                let batch = receive(&store, &shared, Receive::up_to(7).by(consumer.clone())).await;
                if batch.is_empty() {
                    return got;
                }
                assert!(batch.len() <= 7, "receive returned more than max: {}", batch.len());
                let tokens: Vec<LeaseToken> = batch.iter().map(|d| d.lease_token).collect();
                let lost = ok(store.complete_batch(&shared, &tokens).await, "complete_batch");
                assert!(lost.is_empty(), "receiver {r} lost fresh leases: {lost:?}");
                got.extend(batch.into_iter().map(|d| (d.id, d.delivery_count)));
            }
        });
    }
    let mut delivered = Vec::new();
    while let Some(result) = receivers.join_next().await {
        delivered.extend(result.expect("a receiver panicked"));
    }
    assert_eq!(delivered.len(), MESSAGES, "every message is delivered exactly once in total");
    assert!(delivered.iter().all(|(_, count)| *count == 1), "no message is delivered twice");
    let unique: BTreeSet<MessageId> = delivered.into_iter().map(|(id, _)| id).collect();
    assert_eq!(unique, sent, "no message is lost or invented");
    assert_eq!(counts(&store, &shared).await, (0, 0, 0, 0));
}

/// A long-poll receive returns a message sent while it waits; on an empty
/// queue it returns nothing once its wait is over.
pub async fn long_poll_wakes_on_send_and_times_out_empty(harness: &dyn Harness) {
    let store = harness.open().await;
    let replies = queue("replies");
    let sender = {
        let store = store.clone();
        let replies = replies.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            send_label(&store, &replies, "late reply").await
        })
    };
    let got = receive(&store, &replies, Receive::up_to(10).waiting(Duration::from_secs(10))).await;
    let sent = sender.await.expect("the sender panicked");
    assert_eq!(ids(&got), vec![sent.id], "the waiting receive gets the message sent while it waited");

    let empty = queue("empty");
    let got = receive(&store, &empty, Receive::up_to(10).waiting(Duration::from_millis(50))).await;
    assert!(got.is_empty(), "a long poll on an empty queue returns nothing: {got:?}");
}

/// A message's reply address and correlation id come back with every
/// delivery of it, whichever way it was sent (`send`, `send_batch`, a
/// commit, a task's creation, handed to a waiting receiver), and are kept
/// through dead-lettering and redrive. A message without them has none; an
/// empty or oversized correlation id is refused and stores nothing.
pub async fn reply_to_and_correlation_id_are_kept_everywhere(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let jobs = queue("jobs");
    let answers = queue("answers");
    let addressed = |label: &str| labelled(label).with_reply_to(answers.clone()).with_correlation_id(format!("c-{label}"));
    let props = |d: &Delivery| (label(d), d.reply_to.as_ref().map(|q| q.as_str().to_owned()), d.correlation_id.clone());
    let expect = |label: &str| (label.to_owned(), Some("answers".to_owned()), Some(format!("c-{label}")));

    // A receiver already waiting gets it handed over where a backend does that.
    let waiting = {
        let (store, jobs) = (store.clone(), jobs.clone());
        tokio::spawn(async move { receive(&store, &jobs, Receive::up_to(1).waiting(Duration::from_secs(10))).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    ok(store.send(&jobs, addressed("waited")).await, "send to a waiting receiver");
    let got = waiting.await.expect("the receiver panicked");
    assert_eq!(got.iter().map(props).collect::<Vec<_>>(), [expect("waited")], "a waiting receiver gets them");
    ok(store.complete(&jobs, got[0].lease_token).await, "complete");

    ok(store.send(&jobs, addressed("one")).await, "send");
    ok(store.send_batch(&jobs, vec![addressed("batch"), labelled("plain")]).await, "send_batch");
    commit(&store, Changes { send: vec![(jobs.clone(), addressed("commit"))], ..Changes::default() }, "a commit's send").await;
    let mut new = new_task("with-message", "order", &["s"], clock.now());
    new.messages.push((jobs.clone(), addressed("created")));
    create(&store, new).await;
    let got = receive_now(&store, &jobs, 10).await;
    let plain = (String::from("plain"), None, None);
    assert_eq!(
        got.iter().map(props).collect::<Vec<_>>(),
        [expect("one"), expect("batch"), plain, expect("commit"), expect("created")],
        "every way of sending keeps them"
    );

    // Dead-lettered, listed, redriven, received again: still there.
    for delivery in &got {
        ok(store.dead_letter(&jobs, delivery.lease_token, "poison".into()).await, "dead_letter");
    }
    let letters = ok(store.dead_letters(&jobs, 10).await, "dead_letters");
    let listed: Vec<_> = letters.iter().map(|l| (l.reply_to.as_ref().map(|q| q.as_str().to_owned()), l.correlation_id.clone())).collect();
    assert_eq!(listed[0], (Some("answers".to_owned()), Some("c-one".to_owned())), "a dead letter keeps them");
    assert_eq!(listed[2], (None, None), "a message without them has none");
    assert_eq!(ok(store.redrive(&jobs, Redrive::All).await, "redrive"), 5);
    let again = receive_now(&store, &jobs, 10).await;
    assert_eq!(again.iter().map(props).collect::<Vec<_>>(), got.iter().map(props).collect::<Vec<_>>(), "redrive keeps them");
    // Run out of deliveries: the store's own dead-lettering keeps them too.
    let brief = queue("brief");
    ok(store.create_queue(&brief, QueueConfig { deliveries_max: 1, ..QueueConfig::default() }).await, "create_queue");
    ok(store.send(&brief, addressed("tired")).await, "send");
    let first = receive_one(&store, &brief, "the only delivery").await;
    ok(store.abandon(&brief, first.lease_token, Duration::ZERO, Some("busy".into())).await, "abandon");
    let letters = ok(store.dead_letters(&brief, 10).await, "dead_letters");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].correlation_id.as_deref(), Some("c-tired"), "{letters:?}");
    assert_eq!(letters[0].reply_to.as_ref(), Some(&answers));

    for bad in [String::new(), "x".repeat(crate::CORRELATION_ID_BYTES_MAX + 1)] {
        assert_err!(store.send(&jobs, labelled("bad").with_correlation_id(bad.clone())).await, Error::Invalid(_), "correlation id {bad:?}");
    }
    assert_nothing_to_receive(&store, &jobs, "after refused sends").await;
}

/// After the store is dropped and reopened, queue configs, unleased messages,
/// leases, dead letters and tasks are all still there.
pub async fn messages_leases_and_tasks_survive_reopen(harness: &dyn Harness) {
    let clock = harness.clock();
    let durable = queue("durable");
    let config = QueueConfig { deliveries_max: 5, ..QueueConfig::default() };
    let order = task_id("order-durable");
    let (leased, poisoned) = {
        let store = harness.open().await;
        ok(store.create_queue(&durable, config.clone()).await, "create_queue");
        for name in ["a", "b", "c", "p"] {
            send_label(&store, &durable, name).await;
        }
        let leased = receive(&store, &durable, Receive::up_to(1)).await.remove(0);
        assert_eq!(label(&leased), "a");
        create(&store, new_task(order.as_str(), "order", &["charge"], clock.now())).await;
        // Dead-letter p: receive b, c and p, give b and c back.
        let three = receive_now(&store, &durable, 3).await;
        assert_eq!(labels(&three), vec!["b", "c", "p"]);
        ok(store.abandon(&durable, three[0].lease_token, Duration::ZERO, None).await, "abandon b");
        ok(store.abandon(&durable, three[1].lease_token, Duration::ZERO, None).await, "abandon c");
        ok(store.dead_letter(&durable, three[2].lease_token, "kept".into()).await, "dead_letter p");
        (leased, three[2].id.clone())
    };

    let store = harness.open().await;
    assert_eq!(ok(store.queue_config(&durable).await, "queue_config"), Some(config), "the queue config survives");
    let dead = ok(store.dead_letters(&durable, 10).await, "dead_letters");
    assert_eq!(dead.iter().map(|l| (&l.id, l.reason.as_str())).collect::<Vec<_>>(), [(&poisoned, "kept")], "the dead letter survives");
    let unleased = receive_now(&store, &durable, 10).await;
    assert_eq!(labels(&unleased), vec!["b", "c"], "unleased messages survive; the leased one stays leased");
    for d in &unleased {
        complete(&store, &durable, d).await;
    }
    clock.advance(LEASE_DEFAULT);
    let again = receive_one(&store, &durable, "the leased message once its lease expired").await;
    assert_eq!((again.id.clone(), again.delivery_count), (leased.id.clone(), 2));
    assert_err!(store.complete(&durable, leased.lease_token).await, Error::LeaseLost(_), "the pre-restart token after redelivery");
    let record = stored(&store, &order).await;
    assert_eq!(record.task.state, TaskState::Pending, "the task survives");
    assert_eq!(record.steps.len(), 1);
    assert_eq!(history_kinds(&store, &order).await, [EventKind::Received]);
}

// ---------------------------------------------------------------------------
// Tasks.
// ---------------------------------------------------------------------------

/// A task's response queue is written at creation and read back by every
/// read of the task (look-up, several at once, listing, claim, expiry); the
/// commits that move the task keep it. A task without one reads `None`.
pub async fn a_task_keeps_its_reply_queue(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let now = clock.now();
    let replies = queue("shop.replies");
    let mut new = new_task("order-rq", "order", &["charge"], now);
    new.task.reply_queue = Some(replies.clone());
    create(&store, new).await;
    create(&store, new_task("order-plain", "order", &["charge"], now)).await;

    let read = stored(&store, &task_id("order-rq")).await;
    assert_eq!(read.task.reply_queue.as_ref(), Some(&replies), "task() reads the reply queue back");
    assert_eq!(stored(&store, &task_id("order-plain")).await.task.reply_queue, None, "a task without one reads None");
    let several = ok(store.tasks(&[task_id("order-rq"), task_id("order-plain")]).await, "tasks");
    let queues: Vec<_> = several.iter().map(|r| r.task.reply_queue.clone()).collect();
    assert_eq!(queues, [Some(replies.clone()), None], "tasks() reads each task's reply queue");
    let listed = ok(store.list_tasks(&TaskFilter::default()).await, "list_tasks");
    let listed: Vec<_> = listed.iter().map(|t| (t.id.as_str(), t.reply_queue.clone())).collect();
    assert_eq!(listed, [("order-plain", None), ("order-rq", Some(replies.clone()))], "list_tasks reads the reply queues");

    let owner = instance("scheduler-rq");
    let claimed = claim(&store, &owner, SECOND, 10).await;
    let mine = claimed.iter().find(|t| t.id.as_str() == "order-rq").expect("order-rq was claimed");
    assert_eq!(mine.reply_queue.as_ref(), Some(&replies), "claim_tasks returns the reply queue");
    let mut after = mine.clone();
    after.updated_at = now.add(MILLI);
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(mine, after)], ..Changes::default() }, "a fenced write").await;
    assert_eq!(stored(&store, &task_id("order-rq")).await.task.reply_queue.as_ref(), Some(&replies), "a commit keeps it");

    clock.advance(SECOND * 2);
    let expired = ok(store.expired(10).await, "expired");
    let found = expired.iter().find_map(|e| match e {
        Expired::Task(task) if task.id.as_str() == "order-rq" => Some(task.reply_queue.clone()),
        _ => None,
    });
    assert_eq!(found, Some(Some(replies)), "expired() returns the reply queue: {expired:?}");
}

/// A task's submitter is written at creation and read back by every read of
/// the task; a commit keeps it; `list_tasks` with `submitter` lists only
/// that submitter's tasks, newest first, with the other filters and `before`.
pub async fn a_task_keeps_its_submitter_and_lists_by_it(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let now = clock.now();
    for (id, workflow, submitter) in [
        ("t-1", "order", Some("shop")),
        ("t-2", "order", Some("billing")),
        ("t-3", "refund", Some("shop")),
        ("t-4", "order", None),
        ("t-5", "order", Some("shop")),
    ] {
        let mut new = new_task(id, workflow, &["charge"], now);
        new.task.submitter = submitter.map(str::to_owned);
        create(&store, new).await;
    }
    assert_eq!(stored(&store, &task_id("t-1")).await.task.submitter.as_deref(), Some("shop"), "task() reads it back");
    assert_eq!(stored(&store, &task_id("t-4")).await.task.submitter, None, "a task without one reads None");
    let several = ok(store.tasks(&[task_id("t-2"), task_id("t-4")]).await, "tasks");
    let submitters: Vec<_> = several.iter().map(|r| r.task.submitter.clone()).collect();
    assert_eq!(submitters, [Some("billing".to_owned()), None], "tasks() reads each task's submitter");

    let list = |filter: TaskFilter| {
        let store = &store;
        async move { ok(store.list_tasks(&filter).await, "list_tasks").iter().map(|t| t.id.to_string()).collect::<Vec<_>>() }
    };
    let shop = || TaskFilter { submitter: Some("shop".into()), ..TaskFilter::default() };
    assert_eq!(list(shop()).await, ["t-5", "t-3", "t-1"], "one submitter's tasks, newest first");
    assert_eq!(list(TaskFilter { workflow: Some(WorkflowName::new("order").unwrap()), ..shop() }).await, ["t-5", "t-1"], "with a workflow");
    assert_eq!(list(TaskFilter { state: Some(TaskState::Pending), ..shop() }).await, ["t-5", "t-3", "t-1"], "with a state");
    assert!(list(TaskFilter { state: Some(TaskState::Processed), ..shop() }).await.is_empty(), "with a state none has");
    assert_eq!(list(TaskFilter { before: Some(task_id("t-5")), limit: 1, ..shop() }).await, ["t-3"], "paged with before");
    assert_eq!(list(TaskFilter { before: Some(task_id("t-4")), ..shop() }).await, ["t-3", "t-1"], "before another's task");
    assert!(list(TaskFilter { submitter: Some("nobody".into()), ..TaskFilter::default() }).await.is_empty());

    let owner = instance("scheduler-sub");
    let claimed = claim(&store, &owner, SECOND, 10).await;
    let mine = claimed.iter().find(|t| t.id.as_str() == "t-3").expect("t-3 was claimed");
    assert_eq!(mine.submitter.as_deref(), Some("shop"), "claim_tasks returns the submitter");
    let mut after = mine.clone();
    after.submitter = Some("someone else".into());
    after.updated_at = now.add(MILLI);
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(mine, after)], ..Changes::default() }, "a fenced write").await;
    assert_eq!(stored(&store, &task_id("t-3")).await.task.submitter.as_deref(), Some("shop"), "a commit never changes it");
}

/// A task write replaces the task's input (an operator's resubmit with a
/// new input), and step writes put completed and failed steps back to
/// NotStarted without output, error or resolved input, keeping their
/// attempt; a write fenced on the epoch before it is refused and the input
/// stays.
pub async fn an_operator_write_replaces_the_input_and_starts_steps_over(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let id = task_id("again-1");
    create(&store, new_task(id.as_str(), "order", &["check", "pack"], clock.now())).await;
    let claimed = claim_only(&store, &instance("scheduler-in"), LEASE_DEFAULT, &id).await;
    let record = stored(&store, &id).await;
    let (check, pack) = (step_of(&record, "check").clone(), step_of(&record, "pack").clone());
    let started = ok(check.start(json!({ "n": 1 }), clock.now(), SECOND), "model start");
    let checked = ok(started.complete(1, json!({ "n": 1 }), clock.now()), "model complete");
    let packing = ok(pack.start(json!({ "n": 1 }), clock.now(), SECOND), "model start");
    let declined = ok(packing.fail(1, "declined".into(), None, clock.now()), "model fail");
    let failed = ok(claimed.fail(claimed.fence().unwrap(), "declined".into(), ExhaustedPolicy::Error, clock.now()), "model fail");
    let changes = Changes {
        tasks: vec![TaskWrite::replacing(&claimed, failed.clone())],
        steps: vec![StepWrite::replacing(&check, checked.clone()), StepWrite::replacing(&pack, declined.clone())],
        ..Changes::default()
    };
    commit(&store, changes, "the task fails").await;

    clock.advance(SECOND);
    let mut again = ok(failed.resubmit(clock.now()), "model resubmit");
    again.input = json!({ "n": 7, "note": "fixed" });
    let (check_again, pack_again) = (ok(checked.rerun(clock.now()), "rerun"), ok(declined.rerun(clock.now()), "rerun"));
    let changes = Changes {
        tasks: vec![TaskWrite::replacing(&failed, again.clone())],
        steps: vec![StepWrite::replacing(&checked, check_again), StepWrite::replacing(&declined, pack_again)],
        ..Changes::default()
    };
    commit(&store, changes, "the resubmit").await;
    let after = stored(&store, &id).await;
    assert_eq!(after.task, again, "the task reads back with its new input");
    assert_eq!(after.task.input, json!({ "n": 7, "note": "fixed" }));
    for name in ["check", "pack"] {
        let step = step_of(&after, name);
        assert_eq!((step.state, step.attempt), (StepState::NotStarted, 1), "{name} starts over, its attempt kept");
        assert_eq!((&step.input, &step.output, &step.last_error), (&None, &None, &None), "{name} keeps nothing of its run");
    }

    // A write fenced on the failed task's epoch lost to the resubmit.
    let mut stale = failed.clone();
    stale.input = json!({ "n": 99 });
    let write = Changes { tasks: vec![TaskWrite::replacing(&failed, stale)], ..Changes::default() };
    assert_err!(store.commit(write).await, Error::Conflict(_), "a write fenced on the epoch before the resubmit");
    assert_eq!(stored(&store, &id).await.task.input, json!({ "n": 7, "note": "fixed" }), "the input stays");
}

/// `create_task` writes the task, its steps, its messages and its events
/// together; creating the same id again writes nothing and returns the
/// existing record. `task` returns steps ordered by position and `None` for
/// an unknown id.
pub async fn create_task_writes_everything_once(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let scheduler = queue("scheduler");
    let now = clock.now();
    let mut new = new_task("order-1", "order", &["reserve", "charge", "ship"], now);
    new.task.reply_to = Some("replies.shop".into());
    new.task.input = json!({ "order": 1, "lines": [{ "sku": "A-1", "qty": 2 }], "customer": "ana" });
    new.steps.reverse(); // Given out of order: the store orders by position.
    new.messages.push((scheduler.clone(), Outgoing::json(&json!({ "task": "order-1" })).unwrap()));
    let task = new.task.clone();
    let mut steps = new.steps.clone();
    steps.reverse();
    create(&store, new.clone()).await;

    let record = stored(&store, &task.id).await;
    assert_eq!(record.task, task, "the task reads back as written");
    assert_eq!(record.steps, steps, "the steps read back as written, ordered by position");
    assert_eq!(counts(&store, &scheduler).await, (1, 0, 0, 0), "the message was sent with the task");
    let history = ok(store.history(&task.id).await, "history");
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0].kind, EventKind::Received);
    assert!(history[0].seq > 0, "a stored event has a positive seq: {:?}", history[0]);
    assert_eq!(Event { seq: 0, hash: None, ..history[0].clone() }, new.events[0], "the event reads back as written");

    let mut again = new_task("order-1", "refund", &["other"], now);
    again.task.input = json!({ "different": true });
    again.messages.push((scheduler.clone(), labelled("second wake-up")));
    match ok(store.create_task(again).await, "create_task of an existing id") {
        Created::Existing(existing) => assert_eq!(*existing, record, "Existing carries the stored record"),
        Created::New => panic!("create_task of an existing id returned Created::New"),
    }
    assert_eq!(stored(&store, &task.id).await, record, "the second create changed nothing");
    assert_eq!(counts(&store, &scheduler).await, (1, 0, 0, 0), "the second create sent no message");
    assert_eq!(ok(store.history(&task.id).await, "history").len(), 1, "the second create appended no event");
    let d = receive_one(&store, &scheduler, "the task's message").await;
    assert_eq!(d.body.get(), r#"{"task":"order-1"}"#);

    assert_eq!(ok(store.task(&task_id("no-such-task")).await, "task"), None, "an unknown id is None");
}

/// A task keeps its tags; `list_tasks` and `count_tasks` find tasks by
/// tags (every one given), creation and end time ranges (half-open) and id
/// prefix, with the other filters, newest first, paged with `before`. A
/// pruned task leaves no tag behind: its id and tags can be used again.
pub async fn tasks_are_found_by_tags_times_and_id_prefix(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let start = clock.now();
    let tags_of = |i: u32| {
        let region = if i.is_multiple_of(2) { "eu" } else { "us" };
        Tags::new([("customer".to_owned(), format!("c{}", i % 3)), ("region".to_owned(), region.to_owned())]).unwrap()
    };
    // s02 and s03 finish at `first_end` (and a millisecond later), s05 at
    // `second_end`, in Error. Each is claimable only from then: a claim
    // takes the one meant.
    let first_end = start + 12 * SECOND;
    let second_end = first_end + 10 * SECOND;
    let claimable_from = |id: &str| match id {
        "s02" => start,
        "s03" => first_end + MILLI,
        "s05" => second_end,
        _ => second_end + 3600 * SECOND,
    };
    // s01..s12, one second apart; s12 has no tags.
    for i in 1..=12u32 {
        let id = format!("s{i:02}");
        let mut new = new_task(&id, "order", &["a", "b"], clock.now());
        new.task.not_before = claimable_from(&id);
        if i != 12 {
            new.task.tags = tags_of(i);
        }
        create(&store, new).await;
        clock.advance(SECOND);
    }
    for id in ["p%1", "p_1", "pa1"] {
        let mut new = new_task(id, "other", &[], clock.now());
        new.task.not_before = claimable_from(id);
        create(&store, new).await;
    }
    assert_eq!(stored(&store, &task_id("s04")).await.task.tags, tags_of(4), "tags are kept");
    assert!(stored(&store, &task_id("s12")).await.task.tags.is_empty());
    assert_eq!(clock.now(), first_end);
    move_to_state(&store, &task_id("s02"), TaskState::Processed, first_end).await;
    clock.advance(MILLI);
    move_to_state(&store, &task_id("s03"), TaskState::Processed, clock.now()).await;
    clock.set(second_end);
    move_to_state(&store, &task_id("s05"), TaskState::Error, second_end).await;

    let tag = |key: &str, value: &str| (key.to_owned(), value.to_owned());
    let at = |seconds: u64| Timestamp::from_millis(start.as_millis() + 1000 * seconds as i64);
    let base = TaskFilter::default();
    let cases: Vec<(&str, TaskFilter, Vec<&str>)> = vec![
        ("one tag", TaskFilter { tags: vec![tag("customer", "c1")], ..base.clone() }, vec!["s10", "s07", "s04", "s01"]),
        ("two tags", TaskFilter { tags: vec![tag("customer", "c1"), tag("region", "eu")], ..base.clone() }, vec!["s10", "s04"]),
        ("a tag no task has", TaskFilter { tags: vec![tag("customer", "c9")], ..base.clone() }, vec![]),
        (
            "a tag and a state",
            TaskFilter { tags: vec![tag("region", "us")], state: Some(TaskState::Processed), ..base.clone() },
            vec!["s03"],
        ),
        (
            "created in [3 s, 6 s)",
            TaskFilter { created: TimeRange { from: Some(at(3)), until: Some(at(6)) }, ..base.clone() },
            vec!["s06", "s05", "s04"],
        ),
        (
            "created from 10 s",
            TaskFilter { created: TimeRange { from: Some(at(10)), until: None }, ..base.clone() },
            vec!["pa1", "p_1", "p%1", "s12", "s11"],
        ),
        ("created before 1 s", TaskFilter { created: TimeRange { from: None, until: Some(at(1)) }, ..base.clone() }, vec!["s01"]),
        (
            "ended at the first end",
            TaskFilter { ended: TimeRange { from: Some(first_end), until: Some(second_end) }, ..base.clone() },
            vec!["s03", "s02"],
        ),
        (
            "ended since the second end",
            TaskFilter { ended: TimeRange { from: Some(second_end), until: None }, ..base.clone() },
            vec!["s05"],
        ),
        (
            "ended, and a tag",
            TaskFilter { ended: TimeRange { from: Some(start), until: None }, tags: vec![tag("region", "eu")], ..base.clone() },
            vec!["s02"],
        ),
        ("an id prefix", TaskFilter { id_prefix: Some("s1".into()), ..base.clone() }, vec!["s12", "s11", "s10"]),
        ("a prefix with a LIKE wildcard", TaskFilter { id_prefix: Some("p%".into()), ..base.clone() }, vec!["p%1"]),
        ("a prefix with the other wildcard", TaskFilter { id_prefix: Some("p_".into()), ..base.clone() }, vec!["p_1"]),
        (
            "a prefix, a tag and a range",
            TaskFilter {
                id_prefix: Some("s0".into()),
                tags: vec![tag("customer", "c2")],
                created: TimeRange { from: Some(at(4)), until: None },
                ..base.clone()
            },
            vec!["s08", "s05"],
        ),
    ];
    for (what, filter, expected) in &cases {
        let got = ok(store.list_tasks(filter).await, "list_tasks");
        assert_eq!(task_ids(&got), *expected, "list_tasks, {what}");
        let counted: u64 = ok(store.count_tasks(filter).await, "count_tasks").iter().map(|(_, n)| n).sum();
        assert_eq!(counted, expected.len() as u64, "count_tasks, {what}");
        // Paged one at a time, the pages are the listing.
        let mut paged = Vec::new();
        let mut before = None;
        loop {
            let page = ok(store.list_tasks(&TaskFilter { before: before.clone(), limit: 1, ..filter.clone() }).await, "list_tasks");
            let Some(last) = page.last() else { break };
            paged.push(last.id.to_string());
            before = Some(last.id.clone());
        }
        assert_eq!(paged, *expected, "list_tasks paged by one, {what}");
    }
    let by_state = ok(store.count_tasks(&TaskFilter { tags: vec![tag("customer", "c2")], ..base.clone() }).await, "count_tasks");
    let nonzero: Vec<_> = by_state.into_iter().filter(|(_, n)| *n > 0).collect();
    assert_eq!(nonzero, [(TaskState::Pending, 2), (TaskState::Processed, 1), (TaskState::Error, 1)], "c2: s11, s08 pending; s02; s05");

    // Pruned with its tags: the same id with the same tags is new again.
    let pruned = ok(store.prune_tasks(&Prune::finished_before(clock.now() + SECOND, 10)).await, "prune");
    assert_eq!(pruned_ids(&pruned), ["s02", "s03", "s05"]);
    let eu = TaskFilter { tags: vec![tag("region", "eu")], ..base.clone() };
    assert_eq!(task_ids(&ok(store.list_tasks(&eu).await, "list_tasks")), ["s10", "s08", "s06", "s04"], "pruned tasks are gone");
    let mut again = new_task("s02", "order", &[], clock.now());
    again.task.tags = tags_of(2);
    create(&store, again).await;
    assert_eq!(task_ids(&ok(store.list_tasks(&eu).await, "list_tasks")), ["s02", "s10", "s08", "s06", "s04"], "a new task, newest");
}

/// A batch keeps its filter; one runner at a time holds it (the oldest
/// free one is claimed first); only the holder advances it, renewing its
/// lease; another takes it over once the lease ran out, from its cursor; a
/// stopped batch is claimed and advanced by nobody; a finished one is Done
/// and free.
pub async fn a_batch_is_held_by_one_runner_advanced_taken_over_and_stopped(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let filter = TaskFilter {
        state: Some(TaskState::Error),
        tags: vec![("customer".into(), "c1".into())],
        created: TimeRange { from: None, until: Some(clock.now()) },
        ..TaskFilter::default()
    };
    let new = |id: &str| NewBatch {
        id: id.into(),
        action: BatchAction::Resubmit,
        filter: BatchFilter::Tasks(filter.clone()),
        total: 7,
        requested_by: "ops".into(),
        reason: Some("payments back".into()),
    };
    let first = ok(store.create_batch(&new("b1")).await, "create_batch");
    assert_eq!((first.state, first.cursor.as_ref(), first.done, first.locked_by.as_ref()), (BatchState::Running, None, 0, None));
    assert_eq!(
        (&first.filter, first.total, first.reason.as_deref()),
        (&BatchFilter::Tasks(filter.clone()), 7, Some("payments back")),
        "kept as given"
    );
    assert_err!(store.create_batch(&new("b1")).await, Error::Conflict(_), "an id taken");
    clock.advance(SECOND);
    ok(store.create_batch(&new("b2")).await, "create_batch");

    let (a, b) = (instance("runner-a"), instance("runner-b"));
    let lease = 10 * SECOND;
    let held = ok(store.claim_batch(None, &a, lease).await, "claim_batch").expect("a free batch");
    assert_eq!((held.id.as_str(), held.locked_by.as_ref()), ("b1", Some(&a)), "the oldest free one");
    let other = ok(store.claim_batch(None, &b, lease).await, "claim_batch").expect("the other is free");
    assert_eq!(other.id, "b2");
    assert_eq!(ok(store.claim_batch(Some("b1"), &b, lease).await, "claim_batch"), None, "held by a");
    assert_eq!(ok(store.claim_batch(None, &b, lease).await, "claim_batch").map(|r| r.id), Some("b2".into()), "its own again");

    let page = BatchProgress {
        cursor: Some(BatchCursor::Task(task_id("t-5"))),
        done: 3,
        skipped: 1,
        failed: 0,
        last_error: None,
        finished: false,
    };
    assert_eq!(ok(store.advance_batch("b1", &b, &page, lease).await, "advance_batch"), None, "only the holder advances it");
    let advanced = ok(store.advance_batch("b1", &a, &page, lease).await, "advance_batch").expect("a holds it");
    assert_eq!((advanced.cursor.as_ref(), advanced.done, advanced.skipped), (Some(&BatchCursor::Task(task_id("t-5"))), 3, 1));
    assert_eq!(advanced.lease_until, Some(clock.now() + lease), "renewed");

    // a goes silent: once its lease ran out, b goes on from the cursor.
    clock.advance(lease);
    let taken = ok(store.claim_batch(Some("b1"), &b, lease).await, "claim_batch").expect("the lease ran out");
    assert_eq!((taken.locked_by.as_ref(), taken.cursor.as_ref(), taken.done), (Some(&b), Some(&BatchCursor::Task(task_id("t-5"))), 3));
    assert_eq!(ok(store.advance_batch("b1", &a, &page, lease).await, "advance_batch"), None, "a lost it");

    let stopped = ok(store.stop_batch("b2").await, "stop_batch").expect("b2 exists");
    assert_eq!((stopped.state, stopped.locked_by.as_ref()), (BatchState::Stopped, None));
    assert_eq!(ok(store.advance_batch("b2", &b, &page, lease).await, "advance_batch"), None, "its runner stops");
    assert_eq!(ok(store.claim_batch(Some("b2"), &b, lease).await, "claim_batch"), None, "a stopped batch runs no more");
    assert_eq!(ok(store.stop_batch("nope").await, "stop_batch"), None);

    let last = BatchProgress {
        cursor: Some(BatchCursor::Task(task_id("t-1"))),
        done: 6,
        skipped: 1,
        failed: 1,
        last_error: Some("boom".into()),
        finished: true,
    };
    let done = ok(store.advance_batch("b1", &b, &last, lease).await, "advance_batch").expect("b holds it");
    assert_eq!((done.state, done.locked_by.as_ref(), done.failed, done.last_error.as_deref()), (BatchState::Done, None, 1, Some("boom")));
    assert_eq!(ok(store.stop_batch("b1").await, "stop_batch").map(|r| r.state), Some(BatchState::Done), "a done batch stays done");
    assert_eq!(ok(store.claim_batch(None, &a, lease).await, "claim_batch"), None, "nothing left to run");
    let listed: Vec<String> = ok(store.batches(10).await, "batches").into_iter().map(|r| r.id).collect();
    assert_eq!(listed, ["b2", "b1"], "newest first");
    assert_eq!(ok(store.batch("b1").await, "batch"), Some(done));
}

/// `list_tasks` filters by state and workflow, returns the newest first and
/// honours the limit.
pub async fn list_tasks_filters_newest_first(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    for (id, workflow) in [("o1", "order"), ("r1", "refund"), ("o2", "order"), ("o3", "order")] {
        create(&store, new_task(id, workflow, &[], clock.now())).await;
        clock.advance(SECOND);
    }
    let claimed = claim(&store, &instance("s1"), LEASE_DEFAULT, 1).await;
    assert_eq!(task_ids(&claimed), ["o1"], "the oldest is claimed");

    let list = |state: Option<TaskState>, workflow: Option<&str>, limit: u32| TaskFilter {
        state,
        workflow: workflow.map(|w| WorkflowName::new(w).unwrap()),
        limit,
        ..TaskFilter::default()
    };
    let cases = [
        (list(None, None, 100), vec!["o3", "o2", "r1", "o1"]),
        (list(None, Some("order"), 100), vec!["o3", "o2", "o1"]),
        (list(Some(TaskState::Pending), Some("order"), 100), vec!["o3", "o2"]),
        (list(Some(TaskState::Processing), None, 100), vec!["o1"]),
        (list(Some(TaskState::Pending), None, 100), vec!["o3", "o2", "r1"]),
        (list(None, None, 2), vec!["o3", "o2"]),
        (list(Some(TaskState::Processed), None, 100), vec![]),
        (list(None, Some("unknown"), 100), vec![]),
    ];
    for (filter, expected) in cases {
        let got = ok(store.list_tasks(&filter).await, "list_tasks");
        assert_eq!(task_ids(&got), expected, "list_tasks({filter:?})");
    }
    let got = ok(store.list_tasks(&TaskFilter::default()).await, "list_tasks");
    assert_eq!(got[3], stored(&store, &task_id("o1")).await.task, "list_tasks returns whole tasks");
}

/// `list_tasks` with `before` pages newest first: each page starts with
/// the task created just before the previous page's last, with or without
/// a state or workflow filter, and the pages together are the unpaged
/// listing. A `before` that names no task selects nothing.
pub async fn list_tasks_pages_with_before(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    // p01..p12, even ones of `order`, odd ones of `refund`; the six oldest
    // are claimed (Processing), the others stay Pending.
    let ids: Vec<String> = (1..=12).map(|i| format!("p{i:02}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let workflow = if (i + 1) % 2 == 0 { "order" } else { "refund" };
        create(&store, new_task(id, workflow, &[], clock.now())).await;
        clock.advance(SECOND);
    }
    assert_eq!(claim(&store, &instance("pager"), LEASE_DEFAULT, 6).await.len(), 6);

    let filter = |state: Option<TaskState>, workflow: Option<&str>, limit: u32| TaskFilter {
        state,
        workflow: workflow.map(|w| WorkflowName::new(w).unwrap()),
        limit,
        ..TaskFilter::default()
    };
    let newest_first =
        |pick: &dyn Fn(usize) -> bool| -> Vec<String> { (1..=12).rev().filter(|i| pick(*i)).map(|i| format!("p{i:02}")).collect() };
    let cases = [
        (filter(None, None, 4), newest_first(&|_| true)),
        (filter(Some(TaskState::Processing), None, 2), newest_first(&|i| i <= 6)),
        (filter(None, Some("refund"), 2), newest_first(&|i| i % 2 == 1)),
        (filter(Some(TaskState::Pending), Some("order"), 1), newest_first(&|i| i > 6 && i % 2 == 0)),
    ];
    for (base, expected) in cases {
        let mut pages: Vec<Vec<String>> = Vec::new();
        let mut before = None;
        loop {
            let page = ok(store.list_tasks(&TaskFilter { before: before.clone(), ..base.clone() }).await, "list_tasks");
            assert!(page.len() <= base.limit as usize, "a page honours the limit ({base:?}): {page:?}");
            let Some(last) = page.last() else { break };
            before = Some(last.id.clone());
            pages.push(task_ids(&page).into_iter().map(str::to_owned).collect());
            assert!(pages.len() <= 12, "paging with before ends ({base:?}): {pages:?}");
        }
        assert_eq!(pages.len(), 3, "three pages ({base:?}): {pages:?}");
        assert_eq!(pages.concat(), expected, "the pages, in order, are the listing newest first ({base:?})");
        let unpaged = ok(store.list_tasks(&TaskFilter { limit: 100, ..base.clone() }).await, "list_tasks");
        assert_eq!(task_ids(&unpaged), expected, "the unpaged listing ({base:?})");
    }

    let middle = TaskFilter { before: Some(task_id("p07")), ..filter(None, None, 100) };
    assert_eq!(
        task_ids(&ok(store.list_tasks(&middle).await, "list_tasks")),
        ["p06", "p05", "p04", "p03", "p02", "p01"],
        "before excludes itself"
    );
    let oldest = TaskFilter { before: Some(task_id("p01")), ..filter(None, None, 100) };
    assert!(ok(store.list_tasks(&oldest).await, "list_tasks").is_empty(), "nothing is older than the oldest");
    let unknown = TaskFilter { before: Some(task_id("no-such-task")), ..filter(None, None, 100) };
    assert!(ok(store.list_tasks(&unknown).await, "list_tasks").is_empty(), "a before that names no task selects nothing");
}

/// `count_tasks` lists every state, in `TaskState::ALL` order, with how
/// many tasks are in it (zeros included), and follows their changes.
pub async fn count_tasks_counts_every_state(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let zeros: Vec<(TaskState, u64)> = TaskState::ALL.iter().map(|state| (*state, 0)).collect();
    assert_eq!(ok(store.count_tasks(&TaskFilter::default()).await, "count_tasks"), zeros, "an empty store counts zero in every state");
    for id in ["count-1", "count-2", "count-3"] {
        create(&store, new_task(id, "order", &["charge"], clock.now())).await;
    }
    create(&store, new_task("count-refund", "refund", &[], clock.now().add(SECOND))).await;
    assert_eq!(claim(&store, &instance("counter"), 30 * SECOND, 1).await.len(), 1);
    let expected: Vec<(TaskState, u64)> = TaskState::ALL
        .iter()
        .map(|state| {
            let count = match state {
                TaskState::Pending => 2,
                TaskState::Processing => 1,
                _ => 0,
            };
            (*state, count)
        })
        .collect();
    let all: Vec<(TaskState, u64)> =
        expected.iter().map(|(state, count)| (*state, count + u64::from(*state == TaskState::Pending))).collect();
    assert_eq!(ok(store.count_tasks(&TaskFilter::default()).await, "count_tasks"), all, "three pending (one a refund), one claimed");
    let order = WorkflowName::new("order").unwrap();
    assert_eq!(
        ok(store.count_tasks(&TaskFilter { workflow: Some(order.clone()), ..TaskFilter::default() }).await, "count_tasks"),
        expected,
        "of order: two pending, one claimed"
    );
    let unknown = WorkflowName::new("unknown").unwrap();
    assert_eq!(
        ok(store.count_tasks(&TaskFilter { workflow: Some(unknown.clone()), ..TaskFilter::default() }).await, "count_tasks"),
        zeros,
        "an unknown workflow counts zero in every state"
    );
}

/// `tasks` reads several tasks with their steps in the order asked, each
/// as `task` reads it alone, leaving out ids that name no task.
pub async fn tasks_reads_several_with_their_steps(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    create(&store, new_task("many-1", "order", &["reserve", "charge", "ship"], clock.now())).await;
    create(&store, new_task("many-2", "order", &[], clock.now())).await;
    create(&store, new_task("many-3", "order", &["charge"], clock.now())).await;
    let ids = [task_id("many-3"), task_id("missing"), task_id("many-1"), task_id("many-2")];
    let got = ok(store.tasks(&ids).await, "tasks");
    let mut alone = Vec::new();
    for id in ["many-3", "many-1", "many-2"] {
        alone.push(stored(&store, &task_id(id)).await);
    }
    assert_eq!(got, alone, "the tasks in the order asked, each as read alone, the missing one left out");
    assert!(ok(store.tasks(&[]).await, "tasks of none").is_empty());
}

/// `claim_tasks` leases due Pending tasks (oldest `not_before` first, at most
/// `max`) as Processing, and unleased Compensating ones (staying
/// Compensating), bumping the lease epoch, setting `locked_by` and
/// `complete_by`, and recording a `Claimed` event. Leased tasks and tasks not
/// yet due are not claimed. `claim_records_by` returns the tasks with their
/// steps, as stored after the claim.
pub async fn claim_tasks_leases_due_pending_and_unleased_compensating(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let s1 = instance("scheduler-1");
    let s2 = instance("scheduler-2");
    let t0 = clock.now();
    create(&store, new_task("p1", "order", &["charge"], t0)).await;
    clock.advance(SECOND);
    create(&store, new_task("p2", "order", &["charge"], clock.now())).await;
    let mut later = new_task("p3", "order", &[], clock.now());
    later.task.not_before = clock.now().add(Duration::from_secs(60));
    let due_at = later.task.not_before;
    create(&store, later).await;

    let first = claim(&store, &s1, LEASE_DEFAULT, 1).await;
    assert_eq!(task_ids(&first), ["p1"], "max 1 claims one, oldest not_before first");
    let p1 = &first[0];
    assert_eq!(p1.state, TaskState::Processing);
    assert_eq!(p1.locked_by.as_ref(), Some(&s1));
    assert_eq!(p1.lease_epoch, 1, "a claim bumps the epoch");
    assert_eq!(p1.complete_by, Some(clock.now().add(LEASE_DEFAULT)), "complete_by is now + lease");
    assert_eq!(&stored(&store, &p1.id).await.task, p1, "the returned task is what is stored");
    assert_eq!(history_kinds(&store, &p1.id).await, [EventKind::Received, EventKind::Claimed], "a claim records a Claimed event");

    let second = claim(&store, &s2, LEASE_DEFAULT, 10).await;
    assert_eq!(task_ids(&second), ["p2"], "p1 is leased and p3 is not due");
    assert!(claim(&store, &s2, LEASE_DEFAULT, 10).await.is_empty(), "nothing is claimable");
    clock.set(due_at.sub(MILLI));
    assert!(claim(&store, &s2, LEASE_DEFAULT, 10).await.is_empty(), "1 ms before not_before");
    clock.set(due_at);
    let third = claim(&store, &s2, LEASE_DEFAULT, 10).await;
    assert_eq!(task_ids(&third), ["p3"], "claimable once not_before has come");

    // p1 fails with compensation: it waits unleased in Compensating.
    let fence = p1.fence().expect("claimed");
    let failed = ok(p1.fail(fence, "card declined".into(), ExhaustedPolicy::Compensate, clock.now()), "model fail");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(p1, failed)], ..Changes::default() }, "fail p1").await;
    let compensating = claim(&store, &s2, LEASE_DEFAULT, 10).await;
    assert_eq!(task_ids(&compensating), ["p1"], "an unleased Compensating task is claimable");
    let c = &compensating[0];
    assert_eq!(c.state, TaskState::Compensating, "it stays Compensating");
    assert_eq!((c.locked_by.as_ref(), c.lease_epoch), (Some(&s2), 2));
    assert_eq!(c.complete_by, Some(clock.now().add(LEASE_DEFAULT)));

    assert!(claim(&store, &s1, LEASE_DEFAULT, 10).await.is_empty(), "leased Compensating and Processing tasks are not claimable");
    clock.advance(LEASE_DEFAULT * 3);
    assert!(claim(&store, &s1, LEASE_DEFAULT, 10).await.is_empty(), "an expired lease is the Supervisor's to reset, not a claim's");

    // A Scheduler finds the tasks it holds (to give them back when it stops).
    let held = ok(store.list_tasks(&TaskFilter { locked_by: Some(s2.clone()), ..TaskFilter::default() }).await, "list_tasks");
    let mut held: Vec<&str> = held.iter().map(|t| t.id.as_str()).collect();
    held.sort();
    assert_eq!(held, ["p1", "p2", "p3"], "every task s2 holds, and only those");

    // A claim of records returns each task with its steps, as stored after
    // the claim, in the same order.
    create(&store, new_task("r2", "order", &["charge", "ship", "notify"], clock.now())).await;
    clock.advance(SECOND);
    create(&store, new_task("r1", "order", &["charge", "ship"], clock.now())).await;
    let records = ok(store.claim_records_by(&s1, LEASE_DEFAULT, Claim::by_priority(10)).await, "claim_records_by");
    assert_eq!(records.iter().map(|r| r.task.id.as_str()).collect::<Vec<_>>(), ["r2", "r1"], "oldest not_before first");
    for record in &records {
        assert_eq!(record.task.locked_by.as_ref(), Some(&s1));
        assert_eq!(record, &stored(&store, &record.task.id).await, "the returned record is what is stored");
    }
    assert_eq!(records[0].steps.len(), 3);
}

/// A new Pending task like [`new_task`], with `priority`.
fn new_task_of_priority(id: &str, priority: i64, now: Timestamp) -> NewTask {
    let mut new = new_task(id, "order", &[], now);
    new.task.priority = Priority::new(priority).expect("a priority within the bounds");
    new
}

/// A task's priority is stored and read back; claims take the claimable
/// tasks highest priority first, then oldest `not_before` first, except
/// `oldest_first` of them, the oldest whatever their priority; a claim
/// returns `max` tasks whenever as many are claimable, even when its
/// oldest share holds high-priority tasks too; Compensating tasks and
/// tasks not yet due take part like Pending ones.
pub async fn claims_take_higher_priorities_first_and_an_oldest_share(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let owner = instance("scheduler-priority");
    // Created a second apart, in this order: (id, priority).
    let created = [("low-1", -5), ("normal-1", 0), ("high-1", 10), ("low-2", -5), ("top-1", i64::from(PRIORITY_MAX)), ("high-2", 10)];
    for (id, priority) in created {
        create(&store, new_task_of_priority(id, priority, clock.now())).await;
        clock.advance(SECOND);
    }
    let mut delayed = new_task_of_priority("top-later", i64::from(PRIORITY_MAX), clock.now());
    delayed.task.not_before = clock.now().add(Duration::from_secs(60));
    create(&store, delayed).await;
    assert_eq!(stored(&store, &task_id("top-1")).await.task.priority.get(), PRIORITY_MAX, "the priority is stored");
    assert_eq!(stored(&store, &task_id("low-1")).await.task.priority.get(), -5);

    let by_priority = ok(store.claim_tasks_by(&owner, LEASE_DEFAULT, Claim::by_priority(2)).await, "claim by priority");
    assert_eq!(task_ids(&by_priority), ["high-1", "top-1"], "the two highest (returned in not_before order), not the one not due");
    assert_eq!(by_priority[1].priority.get(), PRIORITY_MAX, "a claim returns the priority");

    let shared = ok(store.claim_tasks_by(&owner, LEASE_DEFAULT, Claim { max: 3, oldest_first: 1 }).await, "claim with a share");
    assert_eq!(task_ids(&shared), ["low-1", "normal-1", "high-2"], "the oldest, then the two highest of the rest");

    // The oldest claimable task is also the highest: the claim still
    // returns `max` tasks.
    clock.set(clock.now().add(Duration::from_secs(60)));
    clock.advance(SECOND);
    create(&store, new_task_of_priority("high-3", 10, clock.now())).await;
    clock.advance(SECOND);
    create(&store, new_task_of_priority("normal-2", 0, clock.now())).await;
    let oldest = ok(store.claim_tasks_by(&owner, LEASE_DEFAULT, Claim { max: 1, oldest_first: 1 }).await, "claim the oldest");
    assert_eq!(task_ids(&oldest), ["low-2"], "a claim all oldest-first ignores priorities");
    let overlapping = ok(store.claim_tasks_by(&owner, LEASE_DEFAULT, Claim { max: 2, oldest_first: 1 }).await, "claim with overlap");
    assert_eq!(task_ids(&overlapping), ["top-later", "high-3"], "the oldest (also the highest), then the highest of the rest");
    let rest = ok(store.claim_tasks_by(&owner, LEASE_DEFAULT, Claim { max: 5, oldest_first: 5 }).await, "the rest");
    assert_eq!(task_ids(&rest), ["normal-2"], "fewer claimable than asked: all of them");

    // An unleased Compensating task competes by its priority too.
    let top = stored(&store, &task_id("top-1")).await.task;
    let failed = ok(top.fail(top.fence().expect("held"), "declined".into(), ExhaustedPolicy::Compensate, clock.now()), "model fail");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(&top, failed)], ..Changes::default() }, "fail top-1").await;
    create(&store, new_task_of_priority("high-4", 10, clock.now())).await;
    let compensating = ok(store.claim_tasks_by(&owner, LEASE_DEFAULT, Claim::by_priority(1)).await, "claim compensating");
    assert_eq!(task_ids(&compensating), ["top-1"], "the Compensating task of the highest priority goes first");
    assert_eq!(compensating[0].state, TaskState::Compensating);
}

/// The starvation bound (see `rota_store::OldestShare`): while a steady
/// stream of high-priority tasks keeps coming, one claim at a time, a
/// Scheduler claiming with a share of one in `every` takes the oldest
/// low-priority task once in every `every` claims, the others by
/// priority, on either backend.
pub async fn a_steady_stream_of_high_priorities_lets_an_old_low_task_through(harness: &dyn Harness) {
    const EVERY: u32 = 4;
    let store = harness.open().await;
    let clock = harness.clock();
    let owner = instance("scheduler-share");
    for id in ["low-a", "low-b", "low-c"] {
        create(&store, new_task_of_priority(id, i64::from(PRIORITY_MIN), clock.now())).await;
        clock.advance(SECOND);
    }
    let mut share = OldestShare::new(EVERY);
    let mut order = Vec::new();
    for round in 0..12 {
        // Two new high-priority tasks for every one claimed: the backlog
        // of higher priorities only grows.
        for n in 0..2 {
            create(&store, new_task_of_priority(&format!("high-{round}-{n}"), 50, clock.now())).await;
            clock.advance(MILLI);
        }
        let claimed = ok(store.claim_tasks_by(&owner, LEASE_DEFAULT, share.plan(1)).await, "claim one");
        assert_eq!(claimed.len(), 1, "round {round}: one task is always claimable");
        share.record(claimed.len());
        order.push(claimed[0].id.as_str().to_owned());
    }
    let lows: Vec<(usize, &str)> =
        order.iter().enumerate().filter(|(_, id)| id.starts_with("low")).map(|(at, id)| (at, id.as_str())).collect();
    assert_eq!(lows, [(0, "low-a"), (4, "low-b"), (8, "low-c")], "one claim in {EVERY} takes the oldest, in order: {order:?}");
    assert_eq!(order[1], "high-0-0", "the others take the highest priority, oldest first: {order:?}");
}

/// A task's `paused` mark is written by creation and by commits and read
/// back by every read of the task (look-up, several at once, listing,
/// claim, expiry, after a reopen); a paused task is never claimed, Pending
/// or unleased Compensating, whatever its `not_before`, and is claimable
/// again once a commit clears the mark. A held task keeps its lease when
/// paused.
pub async fn a_paused_task_is_never_claimed_and_keeps_its_mark(harness: &dyn Harness) {
    let clock = harness.clock();
    let owner = instance("scheduler-pause");
    {
        let store = harness.open().await;
        let now = clock.now();
        let mut born_paused = new_task("pz-born", "order", &["charge"], now);
        born_paused.task.paused = true;
        create(&store, born_paused).await;
        create(&store, new_task("pz-pending", "order", &["charge"], now)).await;
        create(&store, new_task("pz-held", "order", &["charge"], now)).await;
        let pending = stored(&store, &task_id("pz-pending")).await.task;
        let paused = ok(pending.pause(now), "model pause");
        commit(&store, Changes { tasks: vec![TaskWrite::replacing(&pending, paused)], ..Changes::default() }, "pause pz-pending").await;

        let claimed = claim(&store, &owner, SECOND, 10).await;
        assert_eq!(task_ids(&claimed), ["pz-held"], "only the task without the mark is claimed");
        assert!(!claimed[0].paused);
        let held = &claimed[0];
        let paused = ok(held.pause(now), "model pause");
        commit(&store, Changes { tasks: vec![TaskWrite::replacing(held, paused.clone())], ..Changes::default() }, "pause pz-held").await;
        let read = stored(&store, &held.id).await.task;
        assert_eq!(read, paused, "a held task keeps its lease and state when paused");
        assert!(read.paused && read.locked_by.as_ref() == Some(&owner));

        // Given back by its holder, it stays unclaimed, as does an unleased
        // Compensating one.
        let released = ok(read.release(read.fence().expect("held"), now), "model release");
        commit(&store, Changes { tasks: vec![TaskWrite::replacing(&read, released.clone())], ..Changes::default() }, "release").await;
        assert!(stored(&store, &held.id).await.task.paused, "a commit keeps the mark");
        let mut compensating = new_task("pz-undo", "order", &["charge"], now);
        compensating.task.state = TaskState::Compensating;
        compensating.task.paused = true;
        create(&store, compensating).await;
        clock.advance(SECOND * 3);
        assert!(claim(&store, &owner, SECOND, 10).await.is_empty(), "no paused task is claimed, Pending or Compensating");
    }

    let store = harness.open().await;
    let ids = [task_id("pz-born"), task_id("pz-pending"), task_id("pz-held"), task_id("pz-undo")];
    let several = ok(store.tasks(&ids).await, "tasks");
    assert!(several.iter().all(|r| r.task.paused), "tasks() reads the mark, after a reopen: {several:?}");
    let listed = ok(store.list_tasks(&TaskFilter::default()).await, "list_tasks");
    assert_eq!(listed.iter().filter(|t| t.paused).count(), 4, "list_tasks reads the mark");
    assert!(claim(&store, &owner, SECOND, 10).await.is_empty(), "still none claimable after a reopen");

    let pending = stored(&store, &task_id("pz-pending")).await.task;
    let resumed = ok(pending.resume(clock.now()), "model resume");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(&pending, resumed)], ..Changes::default() }, "resume").await;
    let claimed = claim(&store, &owner, SECOND, 10).await;
    assert_eq!(task_ids(&claimed), ["pz-pending"], "a resumed task is claimable again");
    assert!(!claimed[0].paused, "claim_tasks returns the cleared mark");

    // A held paused task expires like any other, and the expiry reads the mark.
    let held = &claimed[0];
    let paused = ok(held.pause(clock.now()), "model pause");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(held, paused)], ..Changes::default() }, "pause again").await;
    clock.advance(SECOND * 2);
    let expired = ok(store.expired(10).await, "expired");
    let found = expired.iter().find_map(|e| match e {
        Expired::Task(task) if task.id.as_str() == "pz-pending" => Some(task.paused),
        _ => None,
    });
    assert_eq!(found, Some(true), "expired() returns the mark: {expired:?}");
}

/// While a workflow is paused no claim takes a task of it, Pending or
/// unleased Compensating, whether created before or during the pause,
/// while other workflows' tasks are claimed; a task already held keeps its
/// lease. A pause and a resume are compare-and-sets on the paused state,
/// recorded with who, why and when, kept across a reopen; resumed, its
/// tasks are claimable again.
pub async fn a_paused_workflows_tasks_are_not_claimed_until_it_is_resumed(harness: &dyn Harness) {
    let clock = harness.clock();
    let owner = instance("scheduler-wf-pause");
    let order = WorkflowName::new("order").expect("valid name");
    let change = |paused: bool, by: &str, reason: Option<&str>| WorkflowPause {
        workflow: order.clone(),
        paused,
        by: by.to_owned(),
        reason: reason.map(str::to_owned),
        at: clock.now(),
    };
    {
        let store = harness.open().await;
        assert!(ok(store.workflow_pauses().await, "workflow_pauses").is_empty(), "no workflow was ever paused");
        let refused = store.set_workflow_paused(&change(false, "ann", None)).await;
        assert!(matches!(refused, Err(Error::Conflict(_))), "resuming a workflow that is not paused: {refused:?}");

        create(&store, new_task("wp-held", "order", &["charge"], clock.now())).await;
        let held = claim(&store, &owner, SECOND * 60, 10).await;
        assert_eq!(task_ids(&held), ["wp-held"]);
        create(&store, new_task("wp-before", "order", &["charge"], clock.now())).await;
        ok(store.set_workflow_paused(&change(true, "ann", Some("payments down"))).await, "pause");
        let again = store.set_workflow_paused(&change(true, "bob", None)).await;
        assert!(matches!(again, Err(Error::Conflict(_))), "pausing a paused workflow: {again:?}");
        create(&store, new_task("wp-during", "order", &["charge"], clock.now())).await;
        let mut undo = new_task("wp-undo", "order", &["charge"], clock.now());
        undo.task.state = TaskState::Compensating;
        create(&store, undo).await;
        create(&store, new_task("other-1", "shipping", &["ship"], clock.now())).await;
        clock.advance(SECOND);
        let claimed = claim(&store, &owner, SECOND * 60, 10).await;
        assert_eq!(task_ids(&claimed), ["other-1"], "only another workflow's task is claimed");
        let still = stored(&store, &task_id("wp-held")).await.task;
        assert_eq!(still.locked_by.as_ref(), Some(&owner), "a held task keeps its lease");
    }

    let store = harness.open().await;
    let pauses = ok(store.workflow_pauses().await, "workflow_pauses");
    assert_eq!(pauses.len(), 1, "{pauses:?}");
    assert_eq!(
        (pauses[0].workflow.as_str(), pauses[0].paused, pauses[0].by.as_str(), pauses[0].reason.as_deref()),
        ("order", true, "ann", Some("payments down")),
        "the pause is kept, with who and why, after a reopen"
    );
    assert!(claim(&store, &owner, SECOND * 60, 10).await.is_empty(), "still none claimed after a reopen");

    clock.advance(SECOND);
    let resumed_at = clock.now();
    ok(store.set_workflow_paused(&change(false, "bob", Some("payments back"))).await, "resume");
    let pauses = ok(store.workflow_pauses().await, "workflow_pauses");
    assert_eq!(
        (pauses[0].paused, pauses[0].by.as_str(), pauses[0].reason.as_deref(), pauses[0].at),
        (false, "bob", Some("payments back"), resumed_at),
        "the latest change is the resume"
    );
    let mut claimed = claim(&store, &owner, SECOND * 60, 10).await;
    claimed.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
    assert_eq!(task_ids(&claimed), ["wp-before", "wp-during", "wp-undo"], "resumed, its tasks are claimed");
    ok(store.set_workflow_paused(&change(true, "cy", None)).await, "a resumed workflow can be paused again");
}

/// A task created already claimed (its submitter's Scheduler taking it in
/// the creating commit) is stored as given, held by its owner and not
/// claimable; while its workflow is paused it is refused with `Conflict`
/// and nothing of it is written (task, steps, history, messages), so the
/// submitter creates it Pending instead, and that one waits for the resume.
pub async fn a_task_created_claimed_is_refused_while_its_workflow_is_paused(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let owner = instance("scheduler-eager");
    let other = instance("scheduler-other");
    let doorbells = queue("eager-doorbells");
    let claimed_new = |id: &str| {
        let mut new = new_task(id, "order", &["charge"], clock.now());
        let (claimed, _) = ok(new.task.claim(owner.clone(), clock.now(), SECOND * 10), "model claim");
        new.task = claimed;
        new.events.push(Event::task(&new.task.id, clock.now(), EventKind::Claimed, json!({ "owner": owner.as_str(), "lease_epoch": 1 })));
        new.messages.push((doorbells.clone(), labelled(id)));
        new
    };

    create(&store, claimed_new("ec-running")).await;
    let running = stored(&store, &task_id("ec-running")).await.task;
    assert_eq!(
        (running.state, running.locked_by.as_ref(), running.lease_epoch, running.complete_by),
        (TaskState::Processing, Some(&owner), 1, Some(clock.now().add(SECOND * 10))),
        "created as given: held by its owner"
    );
    assert_eq!(history_kinds(&store, &task_id("ec-running")).await, [EventKind::Received, EventKind::Claimed]);
    assert!(claim(&store, &other, SECOND * 60, 10).await.is_empty(), "a task created claimed is not claimable");
    assert_eq!(labels(&receive_now(&store, &doorbells, 10).await), ["ec-running"], "its message is sent with it");

    let pause = WorkflowPause {
        workflow: WorkflowName::new("order").expect("valid name"),
        paused: true,
        by: "ann".to_owned(),
        reason: None,
        at: clock.now(),
    };
    ok(store.set_workflow_paused(&pause).await, "pause");
    let refused = store.create_task(claimed_new("ec-paused")).await;
    assert!(matches!(refused, Err(Error::Conflict(_))), "created claimed while its workflow is paused: {refused:?}");
    assert!(ok(store.task(&task_id("ec-paused")).await, "task").is_none(), "the refused task is not stored");
    assert!(history_kinds(&store, &task_id("ec-paused")).await.is_empty(), "nor its history");
    assert_nothing_to_receive(&store, &doorbells, "the refused task's message").await;

    create(&store, new_task("ec-paused", "order", &["charge"], clock.now())).await;
    assert_eq!(stored(&store, &task_id("ec-paused")).await.task.state, TaskState::Pending, "created Pending instead");
    assert!(claim(&store, &other, SECOND * 60, 10).await.is_empty(), "and left to wait for the resume");
    let resumed = WorkflowPause { paused: false, at: clock.now(), ..pause };
    ok(store.set_workflow_paused(&resumed).await, "resume");
    assert_eq!(task_ids(&claim(&store, &other, SECOND * 60, 10).await), ["ec-paused"], "claimed once resumed");
}

/// Four concurrent claimers over 100 Pending tasks claim each exactly once.
pub async fn concurrent_claims_never_share_a_task(harness: &dyn Harness) {
    const TASKS: usize = 100;
    const CLAIMERS: usize = 4;
    let store = harness.open().await;
    let clock = harness.clock();
    let mut creates = tokio::task::JoinSet::new();
    for n in 0..TASKS {
        let store = store.clone();
        let new = new_task(&format!("task-{n:03}"), "order", &["charge"], clock.now());
        creates.spawn(async move { create(&store, new).await });
    }
    while let Some(result) = creates.join_next().await {
        result.expect("a create panicked");
    }

    let mut claimers = tokio::task::JoinSet::new();
    for c in 0..CLAIMERS {
        let store = store.clone();
        claimers.spawn(async move {
            let owner = instance(&format!("scheduler-{c}"));
            let mut got = Vec::new();
            loop {
                let claimed = claim(&store, &owner, LEASE_DEFAULT, 7).await;
                if claimed.is_empty() {
                    return got;
                }
                assert!(claimed.len() <= 7, "claim_tasks returned more than max: {}", claimed.len());
                got.extend(claimed.into_iter().map(|t| (t.id, owner.clone())));
            }
        });
    }
    let mut claims = Vec::new();
    while let Some(result) = claimers.join_next().await {
        claims.extend(result.expect("a claimer panicked"));
    }
    assert_eq!(claims.len(), TASKS, "every task is claimed exactly once in total");
    let unique: BTreeSet<&TaskId> = claims.iter().map(|(id, _)| id).collect();
    assert_eq!(unique.len(), TASKS, "no task is claimed twice");
    for (id, owner) in &claims {
        let task = stored(&store, id).await.task;
        assert_eq!(task.locked_by.as_ref(), Some(owner), "{id} is held by the claimer that got it");
        assert_eq!(task.lease_epoch, 1, "{id} was claimed once");
    }
}

/// A new Pending task of `workflow` with concurrency key `key` of `limit`.
fn keyed_task(id: &str, workflow: &str, key: &str, limit: u32, now: Timestamp) -> NewTask {
    let mut new = new_task(id, workflow, &["call"], now);
    new.task.concurrency = Some(ConcurrencyKey { key: key.to_owned(), limit });
    new
}

async fn holders(store: &SharedStore, workflow: &str, key: &str) -> Vec<String> {
    let workflow = WorkflowName::new(workflow).expect("valid workflow name");
    let held = store.key_holders(&workflow, key).await.unwrap_or_else(|e| panic!("key_holders({workflow}, {key}): {e}"));
    held.into_iter().map(|id| id.as_str().to_owned()).collect()
}

/// Commits `claimed`'s end as Processed, fenced on its claim.
async fn finish(store: &SharedStore, claimed: &Task, now: Timestamp) {
    let fence = claimed.fence().expect("a claimed task has a fence");
    let done = ok(claimed.finish_processed(fence, json!({}), now), "finish");
    let event = Event::task(&claimed.id, now, EventKind::Processed, json!({}));
    commit(store, Changes { tasks: vec![TaskWrite::replacing(claimed, done)], events: vec![event], ..Changes::default() }, "finish").await;
}

/// A task with a concurrency key is stored with it, and claims give out at
/// most `limit` slots of a key, to its tasks in submission order, across
/// owners; a key at its limit holds back neither unkeyed tasks nor other
/// keys' (nor its own workflow's other keys: keys are per workflow, so
/// another workflow's same key is another key).
pub async fn a_concurrency_key_starts_its_tasks_in_order_up_to_its_limit_without_blocking_others(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    for n in 0..4 {
        create(&store, keyed_task(&format!("c1-{n}"), "calls", "customer=c1", 2, clock.now())).await;
        clock.advance(MILLI);
    }
    create(&store, keyed_task("c2-0", "calls", "customer=c2", 1, clock.now())).await;
    clock.advance(MILLI);
    create(&store, keyed_task("c2-1", "calls", "customer=c2", 1, clock.now())).await;
    create(&store, keyed_task("other-0", "other", "customer=c1", 1, clock.now())).await;
    create(&store, new_task("plain", "calls", &["call"], clock.now())).await;
    clock.advance(MILLI);
    let kept = stored(&store, &task_id("c1-0")).await.task;
    assert_eq!(kept.concurrency, Some(ConcurrencyKey { key: "customer=c1".into(), limit: 2 }), "the key is stored with the task");
    assert_eq!(stored(&store, &task_id("plain")).await.task.concurrency, None);

    // One at a time, so that the order is the claims' and not a batch's.
    let (a, b) = (instance("scheduler-a"), instance("scheduler-b"));
    let mut order = Vec::new();
    for owner in [&a, &b, &a, &b, &a, &b] {
        order.extend(claim(&store, owner, LEASE_DEFAULT, 1).await.into_iter().map(|t| t.id.as_str().to_owned()));
    }
    assert_eq!(
        order,
        ["c1-0", "c1-1", "c2-0", "other-0", "plain"],
        "c1's two oldest, c2's oldest, the other workflow's own c1, the unkeyed task; nothing else while the keys are at their limits"
    );
    assert!(claim(&store, &a, LEASE_DEFAULT, 10).await.is_empty(), "every key is at its limit");
    assert_eq!(holders(&store, "calls", "customer=c1").await, ["c1-0", "c1-1"], "slots 0 and 1");
    assert_eq!(holders(&store, "calls", "customer=c2").await, ["c2-0"]);
    assert_eq!(holders(&store, "other", "customer=c1").await, ["other-0"]);
    assert!(holders(&store, "calls", "customer=c3").await.is_empty());

    // A claim of many gives a key no more than its free slots, oldest first.
    let c1_0 = stored(&store, &task_id("c1-0")).await.task;
    let c2_0 = stored(&store, &task_id("c2-0")).await.task;
    finish(&store, &c1_0, clock.now()).await;
    finish(&store, &c2_0, clock.now()).await;
    let next = claim(&store, &b, LEASE_DEFAULT, 10).await;
    assert_eq!(task_ids(&next), ["c1-2", "c2-1"], "one free slot each, taken by the oldest waiting task of the key");
    let mut c1 = holders(&store, "calls", "customer=c1").await;
    c1.sort();
    assert_eq!(c1, ["c1-1", "c1-2"]);
}

/// The slot is freed by the write that ends its task, whatever that write
/// is (the holder's Processed or Error, an operator's cancel, a prune of
/// the finished task changes nothing), so the next waiting task is
/// claimable at once; a write that does not end it (a renewal, giving the
/// task back) keeps it.
pub async fn a_concurrency_slot_is_freed_by_the_write_that_ends_its_task(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    for n in 0..5 {
        create(&store, keyed_task(&format!("k-{n}"), "calls", "customer=c1", 1, clock.now())).await;
        clock.advance(MILLI);
    }
    let owner = instance("scheduler-a");
    let first = claim(&store, &owner, LEASE_DEFAULT, 10).await;
    assert_eq!(task_ids(&first), ["k-0"]);

    // Given back (a Scheduler shutting down): still its slot, claimed again first.
    let fence = first[0].fence().expect("fence");
    let released = ok(first[0].release(fence, clock.now()), "release");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(&first[0], released)], ..Changes::default() }, "release").await;
    assert_eq!(holders(&store, "calls", "customer=c1").await, ["k-0"], "a task given back keeps its slot");
    let again = claim(&store, &owner, LEASE_DEFAULT, 10).await;
    assert_eq!(task_ids(&again), ["k-0"], "only the holder is claimable");

    finish(&store, &again[0], clock.now()).await;
    assert!(holders(&store, "calls", "customer=c1").await.is_empty(), "Processed frees the slot in its commit");
    let second = claim(&store, &owner, LEASE_DEFAULT, 10).await;
    assert_eq!(task_ids(&second), ["k-1"]);

    let fence = second[0].fence().expect("fence");
    let failed = ok(second[0].fail(fence, "boom".into(), ExhaustedPolicy::Error, clock.now()), "fail");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(&second[0], failed)], ..Changes::default() }, "fail").await;
    assert!(holders(&store, "calls", "customer=c1").await.is_empty(), "Error frees the slot");
    let third = claim(&store, &owner, LEASE_DEFAULT, 10).await;
    assert_eq!(task_ids(&third), ["k-2"]);

    let cancelled = ok(third[0].cancel(false, clock.now()), "cancel");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(&third[0], cancelled)], ..Changes::default() }, "cancel").await;
    assert!(holders(&store, "calls", "customer=c1").await.is_empty(), "an operator's cancel frees the slot");
    assert_eq!(task_ids(&claim(&store, &owner, LEASE_DEFAULT, 10).await), ["k-3"]);

    // Cancelling a waiting task takes nothing from the holder.
    let waiting = stored(&store, &task_id("k-4")).await.task;
    let cancelled = ok(waiting.cancel(false, clock.now()), "cancel");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(&waiting, cancelled)], ..Changes::default() }, "cancel waiting").await;
    assert_eq!(holders(&store, "calls", "customer=c1").await, ["k-3"]);
    let pruned = ok(store.prune_tasks(&Prune::finished_before(clock.now() + SECOND, 100)).await, "prune");
    assert_eq!(pruned.tasks.len(), 4, "k-0, k-1, k-2 and k-4 finished; {pruned:?}");
    assert_eq!(holders(&store, "calls", "customer=c1").await, ["k-3"], "a prune leaves the holder's slot");
}

/// A slot belongs to the task, not to the process: when the holder's lease
/// runs out and the Supervisor puts the task back to Pending, the task keeps
/// its slot, so no other task of its key starts; the next Scheduler takes it
/// over, and the slot is free only once it ends.
pub async fn a_dead_holders_task_keeps_its_slot_until_taken_over_and_ended(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    create(&store, keyed_task("first", "calls", "customer=c1", 1, clock.now())).await;
    clock.advance(MILLI);
    create(&store, keyed_task("second", "calls", "customer=c1", 1, clock.now())).await;
    clock.advance(MILLI);
    let dead = claim(&store, &instance("scheduler-dead"), 10 * SECOND, 10).await;
    assert_eq!(task_ids(&dead), ["first"]);

    clock.advance(11 * SECOND);
    let expired = ok(store.expired(10).await, "expired");
    let [Expired::Task(held)] = expired.as_slice() else { panic!("expected the dead holder's task to be expired, got {expired:?}") };
    let reset = ok(held.expire(clock.now(), 5, Duration::ZERO, ExhaustedPolicy::Error), "expire");
    assert_eq!((reset.state, reset.locked_by.clone()), (TaskState::Pending, None), "put back to Pending");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(held, reset)], ..Changes::default() }, "the Supervisor's reset").await;
    assert_eq!(holders(&store, "calls", "customer=c1").await, ["first"], "the task keeps its slot while nobody holds it");

    let taken_over = claim(&store, &instance("scheduler-b"), LEASE_DEFAULT, 10).await;
    assert_eq!(task_ids(&taken_over), ["first"], "the holder's task is taken over; the waiting task does not start");
    assert!(claim(&store, &instance("scheduler-c"), LEASE_DEFAULT, 10).await.is_empty());
    finish(&store, &taken_over[0], clock.now()).await;
    assert_eq!(task_ids(&claim(&store, &instance("scheduler-c"), LEASE_DEFAULT, 10).await), ["second"]);
}

/// Claims racing from many owners never let more than `limit` tasks of a
/// key hold a slot: each claimer counts its tasks of each key as running
/// from the claim's return until just before the commit that ends them,
/// and the count never passes the limit; every task runs once.
pub async fn concurrent_claims_never_exceed_a_concurrency_limit(harness: &dyn Harness) {
    const KEYS: usize = 4;
    const PER_KEY: usize = 10;
    const CLAIMERS: usize = 4;
    let store = harness.open().await;
    let clock = harness.clock();
    for n in 0..PER_KEY {
        for k in 0..KEYS {
            let limit = if k == 0 { 2 } else { 1 };
            create(&store, keyed_task(&format!("k{k}-{n:02}"), "calls", &format!("customer=c{k}"), limit, clock.now())).await;
        }
    }
    let running: Arc<std::sync::Mutex<HashMap<String, u32>>> = Arc::default();
    let mut claimers = tokio::task::JoinSet::new();
    for c in 0..CLAIMERS {
        let (store, running, clock) = (store.clone(), running.clone(), clock.clone());
        claimers.spawn(async move {
            let owner = instance(&format!("scheduler-{c}"));
            let mut done = Vec::new();
            let mut idle = 0;
            while idle < 50 {
                let claimed = claim(&store, &owner, LEASE_DEFAULT, 3).await;
                if claimed.is_empty() {
                    idle += 1;
                    tokio::task::yield_now().await;
                    continue;
                }
                idle = 0;
                for task in &claimed {
                    let key = task.concurrency.clone().expect("a keyed task");
                    let mut running = running.lock().expect("running");
                    let now_running = running.entry(key.key.clone()).or_default();
                    *now_running += 1;
                    assert!(*now_running <= key.limit, "{} tasks of {} run at once, over its limit {}", now_running, key.key, key.limit);
                }
                for task in &claimed {
                    *running.lock().expect("running").get_mut(&task.concurrency.as_ref().expect("keyed").key).expect("counted") -= 1;
                    finish(&store, task, clock.now()).await;
                    done.push(task.id.clone());
                }
            }
            done
        });
    }
    let mut done = Vec::new();
    while let Some(result) = claimers.join_next().await {
        done.extend(result.expect("a claimer panicked"));
    }
    let unique: BTreeSet<&TaskId> = done.iter().collect();
    assert_eq!((done.len(), unique.len()), (KEYS * PER_KEY, KEYS * PER_KEY), "every task ran exactly once");
    for k in 0..KEYS {
        assert!(holders(&store, "calls", &format!("customer=c{k}")).await.is_empty(), "every slot was freed");
    }
}

/// `commit` applies fenced task and step writes, sends, message completions
/// and events together.
pub async fn commit_applies_fenced_writes_and_messages_together(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let agent = queue("agent.inventory");
    let owner = instance("scheduler-1");
    create(&store, new_task("order-7", "order", &["reserve", "charge"], clock.now())).await;
    let claimed = claim_only(&store, &owner, LEASE_DEFAULT, &task_id("order-7")).await;
    let fence = claimed.fence().expect("claimed");
    let record = stored(&store, &claimed.id).await;

    // Start the first step: record it and send its request together.
    let reserve = step_of(&record, "reserve").clone();
    let running = ok(reserve.start(json!({ "sku": "A-1" }), clock.now(), Duration::from_secs(10)), "model start");
    let request = Outgoing::json(&json!({ "task": "order-7", "step": "reserve", "attempt": 1 })).unwrap();
    commit(
        &store,
        Changes {
            steps: vec![StepWrite::replacing(&reserve, running.clone())],
            send: vec![(agent.clone(), request)],
            events: vec![Event::step(&running, clock.now(), EventKind::StepStarted, json!({}))],
            ..Changes::default()
        },
        "start reserve",
    )
    .await;
    let record = stored(&store, &claimed.id).await;
    assert_eq!(step_of(&record, "reserve"), &running, "the step write is stored");
    assert_eq!(step_of(&record, "charge").state, StepState::NotStarted, "the other step is untouched");
    let delivery = receive_one(&store, &agent, "the request sent by the commit").await;
    let body: Value = serde_json::from_str(delivery.body.get()).expect("a JSON body");
    assert_eq!(body, json!({ "task": "order-7", "step": "reserve", "attempt": 1 }), "the request's body");

    // The reply: complete the step, renew the task, consume the message.
    clock.advance(SECOND);
    let done = ok(running.complete(1, json!({ "reserved": true }), clock.now()), "model complete");
    let renewed = ok(claimed.renew(fence, clock.now(), LEASE_DEFAULT), "model renew");
    commit(
        &store,
        Changes {
            tasks: vec![TaskWrite::replacing(&claimed, renewed.clone())],
            steps: vec![StepWrite::replacing(&running, done.clone())],
            complete: vec![(agent.clone(), delivery.lease_token)],
            events: vec![Event::step(&done, clock.now(), EventKind::StepCompleted, json!({ "reserved": true }))],
            ..Changes::default()
        },
        "complete reserve",
    )
    .await;
    assert_eq!(counts(&store, &agent).await, (0, 0, 0, 0), "the commit completed the message");
    assert_err!(store.complete(&agent, delivery.lease_token).await, Error::LeaseLost(_), "completing the committed token again");

    let finished = ok(renewed.finish_processed(fence, json!({ "shipped": false }), clock.now()), "model finish");
    commit(
        &store,
        Changes {
            tasks: vec![TaskWrite::replacing(&renewed, finished.clone())],
            events: vec![Event::task(&finished.id, clock.now(), EventKind::Processed, json!({}))],
            ..Changes::default()
        },
        "finish",
    )
    .await;
    let record = stored(&store, &claimed.id).await;
    assert_eq!(record.task, finished, "the task write is stored");
    assert_eq!(step_of(&record, "reserve"), &done);
    assert_eq!(
        history_kinds(&store, &claimed.id).await,
        [EventKind::Received, EventKind::Claimed, EventKind::StepStarted, EventKind::StepCompleted, EventKind::Processed]
    );
    ok(store.commit(Changes::default()).await, "an empty commit");
}

/// A step skipped by its condition is stored as Skipped (no attempt, no
/// output) with its `step_skipped` event, reads back alike through `task`
/// and `tasks`, and a write still expecting it NotStarted conflicts.
pub async fn a_skipped_step_is_stored_and_fenced_like_any_state(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let owner = instance("scheduler-1");
    create(&store, new_task("order-8", "order", &["check", "upgrade", "notify"], clock.now())).await;
    let claimed = claim_only(&store, &owner, LEASE_DEFAULT, &task_id("order-8")).await;
    let record = stored(&store, &claimed.id).await;
    let upgrade = step_of(&record, "upgrade").clone();
    clock.advance(SECOND);
    let skipped = ok(upgrade.skip(clock.now()), "model skip");
    let renewed = ok(claimed.renew(claimed.fence().expect("claimed"), clock.now(), LEASE_DEFAULT), "model renew");
    let detail = json!({ "when": "steps.check.output.vip" });
    commit(
        &store,
        Changes {
            tasks: vec![TaskWrite::replacing(&claimed, renewed.clone())],
            steps: vec![StepWrite::replacing(&upgrade, skipped.clone())],
            events: vec![Event::step(&skipped, clock.now(), EventKind::StepSkipped, detail.clone())],
            ..Changes::default()
        },
        "skip upgrade",
    )
    .await;
    let record = stored(&store, &claimed.id).await;
    let read = step_of(&record, "upgrade");
    assert_eq!(read, &skipped, "the skipped step reads back as written");
    assert_eq!((read.state, read.attempt, read.output.as_ref()), (StepState::Skipped, 0, None));
    let several = ok(store.tasks(std::slice::from_ref(&claimed.id)).await, "tasks");
    assert_eq!(several.len(), 1);
    assert_eq!(step_of(&several[0], "upgrade").state, StepState::Skipped, "a listing of records reads the state too");
    let history = ok(store.history(&claimed.id).await, "history");
    let event = history.iter().find(|e| e.kind == EventKind::StepSkipped).expect("the step_skipped event");
    assert_eq!((event.step.as_ref().map(StepName::as_str), &event.detail), (Some("upgrade"), &detail));

    // A write that still expects the step NotStarted lost a race.
    let started = ok(upgrade.start(json!({}), clock.now(), Duration::from_secs(10)), "model start");
    assert_err!(
        store.commit(Changes { steps: vec![StepWrite::replacing(&upgrade, started)], ..Changes::default() }).await,
        Error::Conflict(_),
        "starting a step that was skipped meanwhile"
    );
    assert_eq!(step_of(&stored(&store, &claimed.id).await, "upgrade").state, StepState::Skipped);
}

/// A write whose expectation is stale (state, epoch or attempt changed since
/// it was read) fails the whole commit with `Conflict`: none of its task or
/// step writes, sends or events appear.
pub async fn commit_with_a_stale_write_conflicts_and_writes_nothing(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let agent = queue("agent.payments");
    let s1 = instance("scheduler-1");
    let s2 = instance("scheduler-2");
    let id = task_id("order-9");
    create(&store, new_task(id.as_str(), "order", &["charge"], clock.now())).await;
    let by_s1 = claim_only(&store, &s1, LEASE_DEFAULT, &id).await;

    // s1 stalls; the Supervisor resets the task and s2 claims it.
    clock.advance(LEASE_DEFAULT);
    let reset = ok(by_s1.expire(clock.now(), 5, Duration::ZERO, ExhaustedPolicy::Error), "model expire");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(&by_s1, reset)], ..Changes::default() }, "expire").await;
    let by_s2 = claim_only(&store, &s2, LEASE_DEFAULT, &id).await;
    assert!(by_s2.lease_epoch > by_s1.lease_epoch, "each claim (and the rescue) moves the epoch on");
    let before = stored(&store, &id).await;
    let charge = step_of(&before, "charge").clone();
    let history_before = ok(store.history(&id).await, "history");

    let stale_changes = |tasks: Vec<TaskWrite>, steps: Vec<StepWrite>| Changes {
        tasks,
        steps,
        send: vec![(agent.clone(), labelled("must not be sent"))],
        events: vec![Event::task(&id, clock.now(), EventKind::Processed, json!({ "stale": true }))],
        complete: Vec::new(),
        new_steps: Vec::new(),
    };
    let start = |step: &Step| ok(step.start(json!({}), clock.now(), Duration::from_secs(10)), "model start");

    // s1 finishes with its old fence (epoch 1), along with a valid step write.
    let finished = ok(by_s1.finish_processed(by_s1.fence().unwrap(), json!({}), clock.now()), "model finish");
    let changes = stale_changes(vec![TaskWrite::replacing(&by_s1, finished)], vec![StepWrite::replacing(&charge, start(&charge))]);
    assert_err!(store.commit(changes).await, Error::Conflict(_), "a task write fenced with a superseded epoch");

    // The right epoch but a stale state.
    let mut wrong_state = TaskWrite::replacing(&by_s2, by_s2.clone());
    wrong_state.expected_state = TaskState::Pending;
    assert_err!(
        store.commit(stale_changes(vec![wrong_state], Vec::new())).await,
        Error::Conflict(_),
        "a task write expecting a stale state"
    );

    // Step writes with a stale attempt or state.
    let mut wrong_attempt = StepWrite::replacing(&charge, start(&charge));
    wrong_attempt.expected_attempt = 3;
    assert_err!(store.commit(stale_changes(Vec::new(), vec![wrong_attempt])).await, Error::Conflict(_), "a step write expecting attempt 3");
    let mut wrong_step_state = StepWrite::replacing(&charge, start(&charge));
    wrong_step_state.expected_state = StepState::Running;
    assert_err!(
        store.commit(stale_changes(Vec::new(), vec![wrong_step_state])).await,
        Error::Conflict(_),
        "a step write expecting a stale state"
    );

    assert_eq!(stored(&store, &id).await, before, "no task or step write of a conflicting commit is applied");
    assert_eq!(counts(&store, &agent).await, (0, 0, 0, 0), "no message of a conflicting commit is sent");
    assert_eq!(ok(store.history(&id).await, "history"), history_before, "no event of a conflicting commit is appended");

    // The current holder's writes still go through.
    let finished = ok(by_s2.finish_processed(by_s2.fence().unwrap(), json!({ "ok": true }), clock.now()), "model finish");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(&by_s2, finished.clone())], ..Changes::default() }, "s2 finishes").await;
    assert_eq!(stored(&store, &id).await.task, finished);
}

/// A stale lease token among a commit's completions fails it with
/// `LeaseLost` and nothing is written; the current token commits.
pub async fn commit_with_a_lost_message_lease_writes_nothing(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let replies = queue("replies");
    let notices = queue("notices");
    let owner = instance("scheduler-1");
    let id = task_id("order-11");
    create(&store, new_task(id.as_str(), "order", &[], clock.now())).await;
    let claimed = claim_only(&store, &owner, Duration::from_secs(300), &id).await;
    let before = stored(&store, &id).await;
    let history_before = ok(store.history(&id).await, "history");

    send_label(&store, &replies, "reply").await;
    let first = receive(&store, &replies, Receive::up_to(1).leasing(Duration::from_secs(5))).await.remove(0);
    clock.advance(Duration::from_secs(5));
    let second = receive_one(&store, &replies, "the reply after its first lease expired").await;

    let finished = ok(claimed.finish_processed(claimed.fence().unwrap(), json!({}), clock.now()), "model finish");
    let changes = |token: LeaseToken| Changes {
        tasks: vec![TaskWrite::replacing(&claimed, finished.clone())],
        steps: Vec::new(),
        new_steps: Vec::new(),
        send: vec![(notices.clone(), labelled("processed"))],
        complete: vec![(replies.clone(), token)],
        events: vec![Event::task(&id, clock.now(), EventKind::Processed, json!({}))],
    };
    assert_err!(store.commit(changes(first.lease_token)).await, Error::LeaseLost(_), "a commit completing a superseded delivery");
    assert_eq!(stored(&store, &id).await, before, "the task write was not applied");
    assert_eq!(counts(&store, &notices).await, (0, 0, 0, 0), "the message was not sent");
    assert_eq!(ok(store.history(&id).await, "history"), history_before, "the event was not appended");
    assert_eq!(counts(&store, &replies).await, (0, 1, 0, 0), "the reply is still leased by the second delivery");

    commit(&store, changes(second.lease_token), "with the current token").await;
    assert_eq!(stored(&store, &id).await.task, finished);
    assert_eq!(counts(&store, &replies).await, (0, 0, 0, 0), "the reply was completed by the commit");
    assert_eq!(counts(&store, &notices).await, (1, 0, 0, 0), "the notice was sent");
}

/// A write to a task or step that does not exist fails the commit with
/// `NotFound`, writing nothing.
pub async fn commit_to_a_missing_record_is_not_found(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let outbox = queue("outbox");
    let id = task_id("order-real");
    create(&store, new_task(id.as_str(), "order", &["charge"], clock.now())).await;
    let with_send = |tasks: Vec<TaskWrite>, steps: Vec<StepWrite>| Changes {
        tasks,
        steps,
        send: vec![(outbox.clone(), labelled("must not be sent"))],
        ..Changes::default()
    };

    let ghost = Task::new(task_id("order-ghost"), WorkflowName::new("order").unwrap(), 1, Value::Null, clock.now());
    let write = TaskWrite::replacing(&ghost, ghost.clone());
    assert_err!(store.commit(with_send(vec![write], Vec::new())).await, Error::NotFound(_), "a write to a task that does not exist");

    let stray = Step::new(id.clone(), StepName::new("refund").unwrap(), 5, clock.now());
    let started = ok(stray.start(json!({}), clock.now(), SECOND), "model start");
    let write = StepWrite::replacing(&stray, started);
    assert_err!(store.commit(with_send(Vec::new(), vec![write])).await, Error::NotFound(_), "a write to a step the task does not have");

    let orphan = Step::new(task_id("order-ghost"), StepName::new("charge").unwrap(), 0, clock.now());
    let started = ok(orphan.start(json!({}), clock.now(), SECOND), "model start");
    let write = StepWrite::replacing(&orphan, started);
    assert_err!(store.commit(with_send(Vec::new(), vec![write])).await, Error::NotFound(_), "a write to a step of a missing task");

    assert_eq!(counts(&store, &outbox).await, (0, 0, 0, 0), "nothing of a failed commit is sent");
    assert_eq!(ok(store.task(&task_id("order-ghost")).await, "task"), None, "no task was created by a write");
    assert_eq!(stored(&store, &id).await.steps.len(), 1, "no step was created by a write");
}

/// A commit may create steps (the instances of a `for_each` step) with its
/// fenced writes: they are stored as given, read back with the task's
/// other steps, and expire like any step; creating one that exists
/// already refuses the whole commit with `Conflict`, writing nothing.
pub async fn a_commit_creates_instance_steps_once(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let owner = instance("scheduler-1");
    let outbox = queue("outbox");
    let id = task_id("fan-out");
    create(&store, new_task(id.as_str(), "order", &["charge"], clock.now())).await;
    let task = claim_only(&store, &owner, Duration::from_secs(30), &id).await;
    let charge = step_of(&stored(&store, &id).await, "charge").clone();
    let now = clock.now();
    let instance_of = |index: usize, due: Duration| {
        let fresh = Step::new(id.clone(), charge.name.instance(index), charge.position, now);
        ok(fresh.start(json!({ "item": index }), now, due), "model start")
    };
    let first = instance_of(0, SECOND);
    let second = instance_of(1, Duration::from_secs(20));
    let mut renewed = task.clone();
    renewed.lease_epoch += 1;
    let create_two = Changes {
        tasks: vec![TaskWrite::replacing(&task, renewed.clone())],
        new_steps: vec![first.clone(), second.clone()],
        send: vec![(outbox.clone(), labelled("request of instance 0"))],
        ..Changes::default()
    };
    commit(&store, create_two, "creating two instances").await;
    let record = stored(&store, &id).await;
    assert_eq!(step_of(&record, "charge[0]"), &first);
    assert_eq!(step_of(&record, "charge[1]"), &second);
    assert_eq!(record.steps.len(), 3, "the step and its two instances");

    // Another decision taken on the same task record starts instance 1 too:
    // refused, though its task write matches the store now.
    let mut again = renewed.clone();
    again.lease_epoch += 1;
    let third = instance_of(2, SECOND);
    let twice = Changes {
        tasks: vec![TaskWrite::replacing(&renewed, again)],
        new_steps: vec![third, instance_of(1, SECOND)],
        send: vec![(outbox.clone(), labelled("must not be sent"))],
        ..Changes::default()
    };
    assert_err!(store.commit(twice).await, Error::Conflict(_), "creating an instance that exists");
    assert_eq!(stored(&store, &id).await, record, "nothing of the refused commit was written");
    assert_eq!(counts(&store, &outbox).await, (1, 0, 0, 0), "only the first commit's message was sent");

    // A created instance is an ordinary step: fenced writes and expiry.
    let done = ok(first.complete(1, json!({ "charged": 0 }), now), "model complete");
    commit(&store, Changes { steps: vec![StepWrite::replacing(&first, done.clone())], ..Changes::default() }, "complete").await;
    assert_eq!(step_of(&stored(&store, &id).await, "charge[0]"), &done);
    clock.advance(Duration::from_secs(21));
    let expired = ok(store.expired(10).await, "expired");
    assert!(
        expired.iter().any(|e| matches!(e, Expired::Step(step) if step.name == second.name)),
        "the running instance is found past its complete-by: {expired:?}"
    );
}

/// `expired` returns leased tasks and in-flight steps (Running or
/// Compensating) whose `complete_by` is at or before now, earliest first,
/// within the limit, and nothing before their deadlines.
pub async fn expired_finds_tasks_and_steps_past_their_deadline(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let owner = instance("scheduler-1");
    let t0 = clock.now();

    // slow: leased for 30 s, with a running step due at 20 s, a compensating
    // one due at 25 s, and one not started.
    create(&store, new_task("slow", "order", &["reserve", "charge", "ship"], t0)).await;
    let slow = claim_only(&store, &owner, Duration::from_secs(30), &task_id("slow")).await;
    let record = stored(&store, &slow.id).await;
    let reserve = step_of(&record, "reserve").clone();
    let reserve_running = ok(reserve.start(json!({}), t0, Duration::from_secs(20)), "start reserve");
    let charge = step_of(&record, "charge").clone();
    let charge_done = ok(charge.start(json!({}), t0, SECOND).and_then(|s| s.complete(1, json!({}), t0)), "start and complete charge");
    let charge_compensating = ok(charge_done.begin_compensation(t0, Duration::from_secs(25)), "compensate charge");
    let steps = vec![StepWrite::replacing(&reserve, reserve_running.clone()), StepWrite::replacing(&charge, charge_compensating.clone())];
    commit(&store, Changes { steps, ..Changes::default() }, "start steps").await;

    // fast: leased for 10 s. done: claimed, then processed. idle: never claimed.
    create(&store, new_task("fast", "order", &[], t0)).await;
    let fast = claim_only(&store, &owner, Duration::from_secs(10), &task_id("fast")).await;
    create(&store, new_task("done", "order", &[], t0)).await;
    let done = claim_only(&store, &owner, Duration::from_secs(5), &task_id("done")).await;
    let processed = ok(done.finish_processed(done.fence().unwrap(), json!({}), t0), "finish done");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(&done, processed)], ..Changes::default() }, "finish done").await;
    create(&store, new_task("idle", "order", &["wait"], t0)).await;

    assert!(ok(store.expired(10).await, "expired").is_empty(), "nothing has expired at t0");
    clock.set(t0.add(Duration::from_secs(10) - MILLI));
    assert!(ok(store.expired(10).await, "expired").is_empty(), "nothing has expired 1 ms before the first deadline");
    clock.set(t0.add(Duration::from_secs(10)));
    assert_eq!(ok(store.expired(10).await, "expired"), [Expired::Task(fast.clone())], "at its complete_by, fast has expired");

    clock.set(t0.add(Duration::from_secs(60)));
    let all = ok(store.expired(10).await, "expired");
    let expected = [
        Expired::Task(fast.clone()),
        Expired::Step(reserve_running.clone()),
        Expired::Step(charge_compensating.clone()),
        Expired::Task(slow.clone()),
    ];
    assert_eq!(all, expected, "leased tasks and in-flight steps, earliest complete_by first");
    let two = ok(store.expired(2).await, "expired limit 2");
    assert_eq!(two, expected[..2], "the limit is honoured");
}

/// The events a warning appends in these cases: an `at_risk` event and an
/// alert, as the Supervisor writes them.
fn warning_events(warning: &Warning, at: Timestamp) -> Vec<Event> {
    match warning {
        Warning::Task(task) => vec![
            Event::task(&task.id, at, EventKind::AtRisk, json!({ "reason": "lease at risk" })),
            Event::task(&task.id, at, EventKind::Alert, json!({ "reason": "lease at risk" })),
        ],
        Warning::Step(step) => vec![
            Event::step(step, at, EventKind::AtRisk, json!({ "reason": "attempt at risk" })),
            Event::step(step, at, EventKind::Alert, json!({ "reason": "attempt at risk" })),
        ],
    }
}

async fn at_risk_ids(store: &SharedStore) -> Vec<String> {
    let listed = ok(store.list_tasks(&TaskFilter { at_risk: true, ..TaskFilter::default() }).await, "list at risk");
    listed.into_iter().map(|t| t.id.to_string()).collect()
}

/// `warnings_due` finds a running step past its `warn_at` and a leased task
/// past its own, earliest first, until `raise_warning` raised it: once per
/// attempt (a new attempt is due again) and once per lease. Raising appends
/// the events, sends its messages (once), sets `at_risk_since` (kept by the holder's writes, cleared
/// by the write that ends the lease), and never makes the holder's next
/// fenced commit fail. `list_tasks` with `at_risk` lists exactly the held
/// tasks warned during their lease.
pub async fn warnings_are_due_once_per_attempt_and_lease(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let owner = instance("scheduler-1");
    let t0 = clock.now();

    // slow: leased for 60 s, at risk after 30 s; reserve runs 20 s, at risk
    // after 10 s; charge completed (no warning point left).
    create(&store, new_task("slow", "order", &["reserve", "charge"], t0)).await;
    let claimed = claim_only(&store, &owner, Duration::from_secs(60), &task_id("slow")).await;
    let slow = ok(claimed.warn_after(claimed.fence().unwrap(), t0, Some(Duration::from_secs(30))), "model warn_after");
    let record = stored(&store, &slow.id).await;
    let reserve = step_of(&record, "reserve").clone();
    let first =
        ok(reserve.start(json!({}), t0, Duration::from_secs(20)).and_then(|s| s.warn_after(t0, Some(Duration::from_secs(10)))), "start");
    let charge = step_of(&record, "charge").clone();
    let charge_done = ok(
        charge.start(json!({}), t0, SECOND).and_then(|s| s.warn_after(t0, Some(MILLI))).and_then(|s| s.complete(1, json!({}), t0)),
        "start and complete charge",
    );
    let changes = Changes {
        tasks: vec![TaskWrite::replacing(&claimed, slow.clone())],
        steps: vec![StepWrite::replacing(&reserve, first.clone()), StepWrite::replacing(&charge, charge_done)],
        ..Changes::default()
    };
    commit(&store, changes, "start reserve with a warning point").await;
    let record = stored(&store, &slow.id).await;
    assert_eq!(
        (record.task.warn_at, step_of(&record, "reserve").warn_at),
        (Some(t0.add(Duration::from_secs(30))), Some(t0.add(Duration::from_secs(10)))),
        "warn_at reads back"
    );
    // plain: leased with no warning point at all.
    create(&store, new_task("plain", "order", &["only"], t0)).await;
    claim_only(&store, &owner, Duration::from_secs(60), &task_id("plain")).await;

    clock.set(t0.add(Duration::from_secs(10) - MILLI));
    assert!(ok(store.warnings_due(10).await, "due").is_empty(), "nothing is due 1 ms before the first warning point");
    assert!(at_risk_ids(&store).await.is_empty(), "nothing is at risk before a warning");
    clock.set(t0.add(Duration::from_secs(10)));
    let due = ok(store.warnings_due(10).await, "due");
    assert_eq!(due, [Warning::Step(first.clone())], "at its warn_at, the running attempt is due (the completed step is not)");
    let raised_at = clock.now();
    let replies = queue("app.status");
    let status = || vec![(replies.clone(), labelled("slow at risk"))];
    assert!(ok(store.raise_warning(&due[0], warning_events(&due[0], raised_at), status()).await, "raise"), "a due warning is raised");
    assert!(ok(store.warnings_due(10).await, "due").is_empty(), "a raised warning is not due again");
    assert!(
        !ok(store.raise_warning(&due[0], warning_events(&due[0], raised_at), status()).await, "raise again"),
        "raising it twice writes nothing"
    );
    let sent = receive_one(&store, &replies, "the raised warning's message, sent once").await;
    assert_eq!(label(&sent), "slow at risk");
    let kinds = history_kinds(&store, &slow.id).await;
    assert_eq!(kinds[kinds.len() - 2..], [EventKind::AtRisk, EventKind::Alert], "the events were appended once: {kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == EventKind::AtRisk).count(), 1, "once: {kinds:?}");
    let record = stored(&store, &slow.id).await;
    assert_eq!(record.task.at_risk_since, Some(raised_at), "the task is at risk since the warning");
    assert_eq!(at_risk_ids(&store).await, ["slow"]);

    // The holder commits on the records it kept from before the warning:
    // the attempt fails, a second one starts with its own warning point.
    clock.set(t0.add(Duration::from_secs(12)));
    let now = clock.now();
    let failed = ok(first.fail(1, "503".into(), Some(Duration::ZERO), now), "fail attempt 1");
    let second =
        ok(failed.start(json!({}), now, Duration::from_secs(20)).and_then(|s| s.warn_after(now, Some(Duration::from_secs(10)))), "start 2");
    let renewed = ok(slow.renew(slow.fence().unwrap(), now, Duration::from_secs(60)), "renew");
    let decided = Task { lease_epoch: renewed.lease_epoch + 1, ..renewed };
    let changes = Changes {
        tasks: vec![TaskWrite::replacing(&slow, decided.clone())],
        steps: vec![StepWrite::replacing(&first, second.clone())],
        ..Changes::default()
    };
    commit(&store, changes, "the holder's decision after the warning").await;
    let record = stored(&store, &slow.id).await;
    assert_eq!(record.task.at_risk_since, Some(raised_at), "the holder's writes keep the lease's warning");
    assert_eq!(at_risk_ids(&store).await, ["slow"]);

    // The task's own point (30 s) and the second attempt's (22 s).
    clock.set(t0.add(Duration::from_secs(40)));
    let due = ok(store.warnings_due(10).await, "due");
    let second_stored = step_of(&stored(&store, &slow.id).await, "reserve").clone();
    assert_eq!(due, [Warning::Step(second_stored), Warning::Task(stored(&store, &slow.id).await.task)], "earliest warn_at first");
    assert_eq!(ok(store.warnings_due(1).await, "due limit 1"), due[..1], "the limit is honoured");
    for warning in &due {
        assert!(ok(store.raise_warning(warning, warning_events(warning, clock.now()), Vec::new()).await, "raise"), "{warning:?} is raised");
    }
    assert!(ok(store.warnings_due(10).await, "due").is_empty(), "each is raised once");
    let kinds = history_kinds(&store, &slow.id).await;
    assert_eq!(kinds.iter().filter(|k| **k == EventKind::AtRisk).count(), 3, "one per attempt and one for the lease: {kinds:?}");
    assert_eq!(stored(&store, &slow.id).await.task.at_risk_since, Some(raised_at), "at risk since the first warning");

    // The lease ends: the task is at risk no more, and a new lease may warn again.
    let held = stored(&store, &slow.id).await.task;
    let released = ok(held.release(held.fence().unwrap(), clock.now()), "release");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(&held, released)], ..Changes::default() }, "release").await;
    let record = stored(&store, &slow.id).await;
    assert_eq!((record.task.warn_at, record.task.at_risk_since), (None, None), "a lease's warning ends with it");
    assert!(at_risk_ids(&store).await.is_empty(), "a released task is not listed at risk");
    let reclaimed = claim_only(&store, &owner, Duration::from_secs(60), &slow.id).await;
    let now = clock.now();
    let warned = ok(reclaimed.warn_after(reclaimed.fence().unwrap(), now, Some(Duration::from_secs(30))), "warn_after");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(&reclaimed, warned)], ..Changes::default() }, "second lease").await;
    clock.advance(Duration::from_secs(30));
    let due = ok(store.warnings_due(10).await, "due");
    assert_eq!(due.len(), 1, "the new lease is due: {due:?}");
    assert!(matches!(&due[0], Warning::Task(t) if t.id == slow.id));
    assert!(ok(store.raise_warning(&due[0], warning_events(&due[0], clock.now()), Vec::new()).await, "raise"), "the new lease warns again");
    assert_eq!(at_risk_ids(&store).await, ["slow"]);
    // The filter combines with the others.
    let listed = |filter: TaskFilter| {
        let store = store.clone();
        async move { task_ids(&ok(store.list_tasks(&filter).await, "list")).into_iter().map(str::to_owned).collect::<Vec<_>>() }
    };
    let at_risk = TaskFilter { at_risk: true, ..TaskFilter::default() };
    assert_eq!(listed(TaskFilter { state: Some(TaskState::Processing), ..at_risk.clone() }).await, ["slow"]);
    assert!(listed(TaskFilter { state: Some(TaskState::Pending), ..at_risk.clone() }).await.is_empty());
    assert!(listed(TaskFilter { workflow: Some(WorkflowName::new("other").unwrap()), ..at_risk.clone() }).await.is_empty());
    assert_eq!(listed(TaskFilter { locked_by: Some(owner.clone()), ..at_risk.clone() }).await, ["slow"]);
    assert!(listed(TaskFilter { before: Some(slow.id.clone()), ..at_risk.clone() }).await.is_empty(), "nothing older is at risk");
    assert_eq!(listed(TaskFilter { before: Some(task_id("plain")), ..at_risk }).await, ["slow"], "paging by `before`");
}

/// A step's `callback_digest` is stored by the creation and by fenced
/// commits, reads back, and is cleared by a commit that clears it; a
/// commit on a stale attempt changes nothing, digest included.
pub async fn a_step_keeps_its_callback_digest(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let owner = instance("scheduler-1");
    let t0 = clock.now();
    create(&store, new_task("cb", "order", &["charge"], t0)).await;
    assert_eq!(step_of(&stored(&store, &task_id("cb")).await, "charge").callback_digest, None, "none until an attempt starts");
    let claimed = claim_only(&store, &owner, Duration::from_secs(60), &task_id("cb")).await;
    let fence = claimed.fence().unwrap();
    let record = stored(&store, &claimed.id).await;
    let charge = step_of(&record, "charge").clone();
    let mut started = ok(charge.start(json!({}), t0, Duration::from_secs(20)), "start");
    started.callback_digest = Some("a".repeat(64));
    let mut renewed = ok(claimed.renew(fence, t0, Duration::from_secs(60)), "renew");
    renewed.lease_epoch += 1;
    let changes = Changes {
        tasks: vec![TaskWrite::replacing(&claimed, renewed.clone())],
        steps: vec![StepWrite::replacing(&charge, started.clone())],
        ..Changes::default()
    };
    commit(&store, changes, "start charge with a digest").await;
    let record = stored(&store, &claimed.id).await;
    assert_eq!(step_of(&record, "charge"), &started, "the digest reads back with the rest of the step");

    // A write expecting an earlier attempt loses, and the digest stays.
    let mut stale = started.clone();
    stale.callback_digest = None;
    let stale_write = StepWrite { step: stale, expected_state: StepState::NotStarted, expected_attempt: 0 };
    let lost = store.commit(Changes { steps: vec![stale_write], ..Changes::default() }).await;
    assert!(lost.is_err(), "a stale step write is refused: {lost:?}");
    assert_eq!(step_of(&stored(&store, &claimed.id).await, "charge").callback_digest, started.callback_digest, "unchanged");

    let mut used = started.clone();
    used.callback_digest = None;
    let mut moved = renewed.clone();
    moved.lease_epoch += 1;
    let changes = Changes {
        tasks: vec![TaskWrite::replacing(&renewed, moved)],
        steps: vec![StepWrite::replacing(&started, used.clone())],
        ..Changes::default()
    };
    commit(&store, changes, "clear the digest").await;
    assert_eq!(step_of(&stored(&store, &claimed.id).await, "charge"), &used, "cleared");
}

/// A warning whose record moved on between `warnings_due` and
/// `raise_warning` writes no event and sends no message: a step that
/// completed, a task that finished, a step whose task was cancelled
/// (marked anyway, so that it is not found again).
pub async fn a_warning_for_work_that_moved_on_writes_nothing(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let owner = instance("scheduler-1");
    let t0 = clock.now();
    let minute = Duration::from_secs(60);
    let mut running = Vec::new();
    for id in ["completes", "finishes", "cancelled"] {
        create(&store, new_task(id, "order", &["work"], t0)).await;
        let claimed = claim_only(&store, &owner, minute, &task_id(id)).await;
        let held = ok(claimed.warn_after(claimed.fence().unwrap(), t0, Some(SECOND)), "warn_after");
        let step = step_of(&stored(&store, &held.id).await, "work").clone();
        let started = ok(step.start(json!({}), t0, minute).and_then(|s| s.warn_after(t0, Some(SECOND))), "start");
        let changes = Changes {
            tasks: vec![TaskWrite::replacing(&claimed, held.clone())],
            steps: vec![StepWrite::replacing(&step, started.clone())],
            ..Changes::default()
        };
        commit(&store, changes, "start").await;
        running.push((held, started));
    }
    clock.advance(SECOND);
    let due = ok(store.warnings_due(10).await, "due");
    assert_eq!(due.len(), 6, "every task and step is due: {due:?}");
    let now = clock.now();

    // completes: its step completed (the task is still held).
    let (_, step) = &running[0];
    let done = ok(step.complete(1, json!({}), now), "complete");
    commit(&store, Changes { steps: vec![StepWrite::replacing(step, done)], ..Changes::default() }, "complete").await;
    // finishes: processed.
    let (task, step) = &running[1];
    let done = ok(step.complete(1, json!({}), now), "complete");
    let processed = ok(task.finish_processed(task.fence().unwrap(), json!({}), now), "finish");
    commit(
        &store,
        Changes { tasks: vec![TaskWrite::replacing(task, processed)], steps: vec![StepWrite::replacing(step, done)], ..Changes::default() },
        "finish",
    )
    .await;
    // cancelled: the operator's cancel leaves the step running.
    let (task, _) = &running[2];
    let cancelled = ok(task.cancel(false, now), "cancel");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(task, cancelled)], ..Changes::default() }, "cancel").await;

    let before: Vec<Vec<EventKind>> = histories_of(&store, &running).await;
    let replies = queue("app.status");
    for warning in &due {
        let is_held_task = matches!(warning, Warning::Task(t) if t.id.as_str() == "completes");
        let status = vec![(replies.clone(), labelled(warning.task_id().as_str()))];
        let raised = ok(store.raise_warning(warning, warning_events(warning, now), status).await, "raise");
        assert_eq!(raised, is_held_task, "{warning:?}: only the task still held and unfinished is warned");
    }
    let sent = receive_one(&store, &replies, "only the raised warning's message").await;
    assert_eq!(label(&sent), "completes");
    let after: Vec<Vec<EventKind>> = histories_of(&store, &running).await;
    assert_eq!(after[1..], before[1..], "no event for a finished or cancelled task");
    assert_eq!(after[0].len(), before[0].len() + 2, "the held task's own warning only: {:?}", after[0]);
    assert!(ok(store.warnings_due(10).await, "due").is_empty(), "nothing moved on is due again");
    assert_eq!(at_risk_ids(&store).await, ["completes"]);
}

/// The history of each task of `running`, as kinds.
async fn histories_of(store: &SharedStore, running: &[(Task, Step)]) -> Vec<Vec<EventKind>> {
    let mut all = Vec::new();
    for (task, _) in running {
        all.push(history_kinds(store, &task.id).await);
    }
    all
}

/// Every history row a backend appends carries its link in the task's hash
/// chain (`crate::chain`): whatever appended it (a creation, a claim, a
/// commit of several rows of several tasks, a warning), in `seq` order,
/// the chain verifies; the hashes depend on the rows' content and order
/// only, so the same history written into another store has the same ones.
pub async fn every_history_row_is_chained_to_the_one_before(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let (a, b) = (task_id("chain-a"), task_id("chain-b"));
    let mut first = new_task(a.as_str(), "order", &["charge"], clock.now());
    first.events.push(Event::task(&a, clock.now(), EventKind::Alert, json!({ "nested": { "z": 1, "a": [1.5, null, "\u{1f}é"] } })));
    create(&store, first).await;
    let mut second = new_task(b.as_str(), "order", &[], clock.now());
    second.task.not_before = clock.now().add(Duration::from_secs(3600));
    create(&store, second).await;
    clock.advance(SECOND);
    let claimed = claim_only(&store, &instance("chainer"), 60 * SECOND, &a).await;
    let step = stored(&store, &a).await.steps[0].clone();
    let events = vec![
        Event::step(&step, clock.now(), EventKind::StepStarted, json!({ "agent": "payments" })),
        Event::task(&b, clock.now(), EventKind::Alert, json!({ "message": "stuck" })),
        Event::step(&step, clock.now(), EventKind::StepCompleted, json!({ "n": 2 })),
    ];
    let finished = ok(claimed.finish_processed(claimed.fence().expect("fenced"), json!({}), clock.now()), "finish");
    let changes = Changes { tasks: vec![TaskWrite::replacing(&claimed, finished)], events, ..Changes::default() };
    commit(&store, changes, "three rows of two tasks").await;

    for (id, rows) in [(&a, 5), (&b, 2)] {
        let history = ok(store.history(id).await, "history");
        assert_eq!(history.len(), rows, "{id}: {history:?}");
        assert!(history.iter().all(|event| event.hash.is_some()), "{id}: every row has a hash");
        assert_eq!(chain::verify(&history), Ok(chain::Whole { chained: rows, unchained: 0 }), "{id}'s chain holds");
        let mut rewritten = history.clone();
        rewritten.iter_mut().for_each(|event| (event.seq, event.hash) = (0, None));
        chain::seal(None, &mut rewritten);
        let hashes = |events: &[Event]| events.iter().map(|event| event.hash.clone()).collect::<Vec<_>>();
        assert_eq!(hashes(&rewritten), hashes(&history), "{id}: the hashes depend on content and order only");
    }
    let newest = ok(store.latest_events(1).await, "latest");
    assert_eq!(newest[0].hash, ok(store.history(&a).await, "history").last().unwrap().hash, "every read carries the hash");
}

/// `history` returns a task's events oldest first with increasing seq;
/// `events_after` pages through every task's events in seq order.
pub async fn history_and_events_after_page_in_order(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let t1 = task_id("order-a");
    let t2 = task_id("order-b");
    create(&store, new_task(t1.as_str(), "order", &["charge"], clock.now())).await;
    create(&store, new_task(t2.as_str(), "order", &[], clock.now())).await;
    clock.advance(SECOND);
    let step = stored(&store, &t1).await.steps[0].clone();
    let started = Event::step(&step, clock.now(), EventKind::StepStarted, json!({ "agent": "payments" }));
    commit(&store, Changes { events: vec![started.clone()], ..Changes::default() }, "event for order-a").await;
    let alert = Event::task(&t2, clock.now(), EventKind::Alert, json!({ "message": "stuck" }));
    let completed = Event::step(&step, clock.now(), EventKind::StepCompleted, json!({ "n": 2 }));
    commit(&store, Changes { events: vec![alert.clone(), completed.clone()], ..Changes::default() }, "two events").await;

    let history = ok(store.history(&t1).await, "history");
    assert_eq!(history.iter().map(|e| e.kind).collect::<Vec<_>>(), [EventKind::Received, EventKind::StepStarted, EventKind::StepCompleted]);
    assert!(history.windows(2).all(|w| w[0].seq < w[1].seq), "seq increases: {history:?}");
    assert_eq!(Event { seq: 0, hash: None, ..history[1].clone() }, started, "an event reads back as written");
    assert_eq!(Event { seq: 0, hash: None, ..history[2].clone() }, completed, "an event reads back as written");
    assert_eq!(ok(store.history(&t2).await, "history").iter().map(|e| e.kind).collect::<Vec<_>>(), [EventKind::Received, EventKind::Alert]);
    assert!(ok(store.history(&task_id("no-such-task")).await, "history").is_empty());

    let mut paged = Vec::new();
    let mut after = 0;
    loop {
        let page = ok(store.events_after(after, 2).await, "events_after");
        assert!(page.len() <= 2, "events_after honours its limit: {page:?}");
        let Some(last) = page.last() else { break };
        after = last.seq;
        paged.extend(page);
        assert!(paged.len() <= 5, "events_after keeps returning events: {paged:?}");
    }
    let order: Vec<(&str, EventKind)> = paged.iter().map(|e| (e.task_id.as_str(), e.kind)).collect();
    assert_eq!(
        order,
        [
            ("order-a", EventKind::Received),
            ("order-b", EventKind::Received),
            ("order-a", EventKind::StepStarted),
            ("order-b", EventKind::Alert),
            ("order-a", EventKind::StepCompleted),
        ],
        "every task's events in the order they were written"
    );
    assert!(paged.windows(2).all(|w| w[0].seq < w[1].seq), "seq increases across pages: {paged:?}");
    assert_eq!(paged[2], history[1], "events_after and history agree");
    let tail = ok(store.events_after(paged[2].seq, 100).await, "events_after");
    assert_eq!(tail, paged[3..], "events_after starts strictly after the given seq");
}

/// The leader lease: the first holder gets it; another gets `None` while it
/// runs; the holder renews with the same epoch; after the ttl another holder
/// takes it with a higher epoch; `release_leader` by the holder frees it at
/// once (by anyone else, it does nothing).
pub async fn leader_lease_elects_one_holder(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let a = instance("supervisor-a");
    let b = instance("supervisor-b");
    let ttl = Duration::from_secs(10);
    let t0 = clock.now();
    let acquire = |holder: &InstanceId| {
        let store = store.clone();
        let holder = holder.clone();
        async move { ok(store.acquire_leader("supervisor", &holder, ttl).await, "acquire_leader") }
    };

    let first = acquire(&a).await.expect("the first holder gets the lease");
    assert_eq!((first.name.as_str(), &first.holder, first.until), ("supervisor", &a, t0.add(ttl)));
    assert_eq!(acquire(&b).await, None, "another holder is refused while the lease runs");

    clock.advance(Duration::from_secs(5));
    let renewed = acquire(&a).await.expect("the holder renews");
    assert_eq!((renewed.epoch, renewed.until), (first.epoch, clock.now().add(ttl)), "a renewal keeps the epoch and moves until");
    clock.advance(Duration::from_secs(5));
    assert_eq!(acquire(&b).await, None, "the renewed lease outlives the first until");

    clock.advance(Duration::from_secs(6));
    let taken = acquire(&b).await.expect("after the ttl another holder takes the lease");
    assert_eq!(taken.holder, b);
    assert!(taken.epoch > first.epoch, "a new holder gets a higher epoch: {taken:?} after {first:?}");
    assert_eq!(acquire(&a).await, None, "the deposed holder is refused");

    ok(store.release_leader("supervisor", &a).await, "release by a non-holder");
    assert_eq!(acquire(&a).await, None, "a release by a non-holder does nothing");
    ok(store.release_leader("supervisor", &b).await, "release by the holder");
    let back = acquire(&a).await.expect("a released lease is free at once");
    assert!(back.epoch > taken.epoch, "each change of holder raises the epoch: {back:?} after {taken:?}");

    let other = ok(store.acquire_leader("compactor", &b, ttl).await, "acquire_leader").expect("leases are per name");
    assert_eq!(other.holder, b);
}

/// `leader` reads who holds a lease now without taking it: `None` before
/// anyone took it, the holder's lease (as `acquire_leader` returned it)
/// while it runs, `None` once it ran out or was released.
pub async fn leader_reads_the_running_lease(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let a = instance("supervisor-a");
    let ttl = Duration::from_secs(10);
    assert_eq!(ok(store.leader("supervisor").await, "leader"), None, "a lease never taken has no holder");
    let taken = ok(store.acquire_leader("supervisor", &a, ttl).await, "acquire_leader").expect("free lease");
    assert_eq!(ok(store.leader("supervisor").await, "leader"), Some(taken.clone()), "the running lease, as acquired");
    assert_eq!(ok(store.leader("compactor").await, "leader"), None, "leases are per name");
    clock.advance(Duration::from_secs(9));
    assert_eq!(ok(store.leader("supervisor").await, "leader"), Some(taken.clone()), "reading does not take or renew");
    clock.advance(Duration::from_secs(1));
    assert_eq!(ok(store.leader("supervisor").await, "leader"), None, "a lease that ran out has no holder");
    let again = ok(store.acquire_leader("supervisor", &a, ttl).await, "acquire_leader").expect("expired lease");
    assert_eq!(ok(store.leader("supervisor").await, "leader"), Some(again));
    ok(store.release_leader("supervisor", &a).await, "release_leader");
    assert_eq!(ok(store.leader("supervisor").await, "leader"), None, "a released lease has no holder");
}

/// `latest_events` returns the newest events of every task, highest seq
/// first, at most `limit`: the same events `events_after` pages through.
pub async fn latest_events_are_the_newest_first(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    assert!(ok(store.latest_events(10).await, "latest_events").is_empty(), "no event yet");
    for id in ["latest-1", "latest-2", "latest-3"] {
        create(&store, new_task(id, "order", &["charge"], clock.now())).await;
        clock.advance(SECOND);
    }
    let step = stored(&store, &task_id("latest-1")).await.steps[0].clone();
    let started = Event::step(&step, clock.now(), EventKind::StepStarted, json!({}));
    commit(&store, Changes { events: vec![started], ..Changes::default() }, "a step event").await;

    let all = ok(store.events_after(0, 100).await, "events_after");
    assert_eq!(all.len(), 4);
    let newest: Vec<Event> = all.iter().rev().cloned().collect();
    assert_eq!(ok(store.latest_events(100).await, "latest_events"), newest, "every event, newest first");
    assert_eq!(ok(store.latest_events(2).await, "latest_events"), newest[..2], "at most limit, the newest");
    assert_eq!(ok(store.latest_events(0).await, "latest_events"), [], "a limit of zero reads nothing");
}

/// Workflow definitions are registered per version, immutably.
pub async fn workflow_versions_are_immutable_and_latest_wins(harness: &dyn Harness) {
    let store = harness.open().await;
    let order = WorkflowName::new("order").unwrap();
    let v1 = json!({"steps": ["reserve"]});
    let v2 = json!({"steps": ["reserve", "charge"]});
    ok(store.register_workflow(&order, 1, &v1).await, "register v1");
    ok(store.register_workflow(&order, 1, &v1).await, "registering the same definition again is a no-op");
    let err = store.register_workflow(&order, 1, &v2).await.expect_err("a different definition under an existing version");
    assert!(matches!(err, Error::Conflict(_)), "expected Conflict, got {err:?}");
    ok(store.register_workflow(&order, 2, &v2).await, "register v2");
    let other = WorkflowName::new("refund").unwrap();
    ok(store.register_workflow(&other, 7, &json!({})).await, "register another workflow");

    let latest = ok(store.workflow(&order, None).await, "latest").expect("order is registered");
    assert_eq!((latest.version, &latest.definition), (2, &v2));
    let first = ok(store.workflow(&order, Some(1)).await, "v1").expect("v1 is kept");
    assert_eq!(first.definition, v1, "a running task keeps the version it started with");
    assert_eq!(ok(store.workflow(&order, Some(3)).await, "v3"), None);
    let listed: Vec<(String, u32)> =
        ok(store.workflows().await, "workflows").into_iter().map(|w| (w.name.to_string(), w.version)).collect();
    assert_eq!(listed, [("order".to_string(), 2), ("refund".to_string(), 7)], "the latest version of each, by name");
    assert!(matches!(store.register_workflow(&order, 0, &v1).await, Err(Error::Invalid(_))), "version 0 is refused");
}

/// The audit log lists the operator rows of every history (read, never
/// written twice) and the audit table's rows, merged newest first on one
/// keyset that pages across both at the same millisecond; filters by
/// action, by and since; refuses task actions in the table; and
/// `prune_audit` deletes old table rows only, oldest first, bounded.
pub async fn the_audit_log_merges_operator_history_and_its_table_newest_first(harness: &dyn Harness) {
    let clock = harness.clock();
    let t0 = clock.now();
    let ms = Duration::from_millis(1);
    let at = |n: u32| t0 + ms * n;
    {
        let store = harness.open().await;
        let id = task_id("au-1");
        let mut new = new_task("au-1", "order", &["approve"], t0);
        let approve = new.steps[0].clone();
        new.events.push(Event::task(&id, at(1), EventKind::Paused, json!({ "by": "alice", "reason": "r1" })));
        new.events.push(Event::task(&id, at(1), EventKind::Alert, json!({ "by": "alice" })));
        new.events.push(Event::task(&id, at(3), EventKind::Resumed, json!({ "by": "bob", "reason": null })));
        new.events.push(Event::step(&approve, at(3), EventKind::Signal, json!({ "signal": "ok", "sent_by": "carol" })));
        create(&store, new).await;

        let entry = |action: AuditAction, by: &str, detail: Value| NewAudit {
            action,
            by: by.to_owned(),
            reason: Some(format!("{action} by {by}")),
            target: "orders".to_owned(),
            detail,
        };
        clock.advance(ms * 2);
        ok(store.record_audit(&entry(AuditAction::WorkflowPause, "alice", json!({}))).await, "record workflow.pause");
        clock.advance(ms);
        ok(store.record_audit(&entry(AuditAction::DlqPurge, "bob", json!({ "purged": 2 }))).await, "record dlq.purge");
        ok(store.record_audit(&entry(AuditAction::DlqRedrive, "alice", json!({ "moved": 1 }))).await, "record dlq.redrive");

        let task_action = entry(AuditAction::TaskCancel, "alice", json!({}));
        assert!(
            matches!(store.record_audit(&task_action).await, Err(Error::Invalid(_))),
            "a task action is the history's, not the table's"
        );
        let nobody = entry(AuditAction::QueuePause, "", json!({}));
        assert!(matches!(store.record_audit(&nobody).await, Err(Error::Invalid(_))), "an entry says who");
        let no_limit = AuditFilter::default();
        assert!(matches!(store.audit(&no_limit).await, Err(Error::Invalid(_))), "a limit of 0 is refused");
    }

    let store = harness.open().await;
    let list = |filter: AuditFilter| {
        let store = store.clone();
        async move { ok(store.audit(&filter).await, "audit") }
    };
    let actions = |entries: &[crate::AuditEntry]| entries.iter().map(|e| e.action.as_str().to_owned()).collect::<Vec<_>>();
    let all = list(AuditFilter { limit: 100, ..AuditFilter::default() }).await;
    let newest_first = ["task.signal", "task.resume", "dlq.redrive", "dlq.purge", "workflow.pause", "task.pause"];
    assert_eq!(actions(&all), newest_first, "both sources, newest first, after a reopen (the alert is no operator action): {all:?}");
    assert_eq!(all.iter().map(|e| e.at()).collect::<Vec<_>>(), [at(3), at(3), at(3), at(3), at(2), at(1)]);
    let pause = &all[5];
    assert_eq!(
        (pause.by.as_str(), pause.reason.as_deref(), pause.target.as_str()),
        ("alice", Some("r1"), "au-1"),
        "a task action's who, why and task"
    );
    let signal = &all[0];
    assert_eq!((signal.by.as_str(), &signal.detail["step"]), ("carol", &json!("approve")), "a signal's sender and step");
    assert_eq!(all[3].detail, json!({ "purged": 2 }), "a table row's detail");
    assert_eq!(all[3].reason.as_deref(), Some("dlq.purge by bob"));

    // Pages of two follow the same order, across sources within one millisecond.
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = list(AuditFilter { limit: 2, after, ..AuditFilter::default() }).await;
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 2);
        after = page.last().map(|e| e.cursor);
        paged.extend(page);
    }
    assert_eq!(paged, all, "paging with the last entry's cursor lists each entry once, in order");

    let by_alice = list(AuditFilter { by: Some("alice".to_owned()), limit: 100, ..AuditFilter::default() }).await;
    assert_eq!(actions(&by_alice), ["dlq.redrive", "workflow.pause", "task.pause"], "by: both sources");
    let by_carol = list(AuditFilter { by: Some("carol".to_owned()), limit: 100, ..AuditFilter::default() }).await;
    assert_eq!(actions(&by_carol), ["task.signal"], "by matches a signal's sender");
    for action in [AuditAction::TaskPause, AuditAction::DlqPurge, AuditAction::TaskCancel] {
        let only = list(AuditFilter { action: Some(action), limit: 100, ..AuditFilter::default() }).await;
        let expected: Vec<&str> = newest_first.iter().copied().filter(|a| *a == action.as_str()).collect();
        assert_eq!(actions(&only), expected, "action {action}");
    }
    let since = list(AuditFilter { since: Some(at(2)), limit: 100, ..AuditFilter::default() }).await;
    assert_eq!(actions(&since), newest_first[..5], "since is inclusive");
    let first_two = list(AuditFilter { limit: 2, ..AuditFilter::default() }).await;
    assert_eq!(actions(&first_two), newest_first[..2], "limit");

    // Pruning: the table's rows before the bound, oldest first, at most limit.
    assert_eq!(ok(store.prune_audit(at(4), 1).await, "prune_audit"), 1, "at most limit");
    let left = list(AuditFilter { limit: 100, ..AuditFilter::default() }).await;
    assert_eq!(actions(&left), ["task.signal", "task.resume", "dlq.redrive", "dlq.purge", "task.pause"], "the oldest row went first");
    assert_eq!(ok(store.prune_audit(at(3), 10).await, "prune_audit"), 0, "nothing else is before the bound");
    assert_eq!(ok(store.prune_audit(at(4), 10).await, "prune_audit"), 2);
    let left = list(AuditFilter { limit: 100, ..AuditFilter::default() }).await;
    assert_eq!(actions(&left), ["task.signal", "task.resume", "task.pause"], "history rows go only with their task");
}

/// Alerts are the `Alert` events of every task, newest first.
pub async fn alerts_list_newest_first(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let mut changes = Changes::default();
    for (n, kind) in [EventKind::Received, EventKind::Alert, EventKind::Error, EventKind::Alert].into_iter().enumerate() {
        let task = TaskId::new(format!("t{n}")).unwrap();
        changes.events.push(Event::task(&task, clock.now(), kind, json!({"n": n})));
    }
    ok(store.commit(changes).await, "commit events");
    let alerts = ok(store.alerts(10).await, "alerts");
    let tasks: Vec<&str> = alerts.iter().map(|e| e.task_id.as_str()).collect();
    assert_eq!(tasks, ["t3", "t1"], "only alerts, newest first");
    assert!(alerts.iter().all(|e| e.kind == EventKind::Alert));
    assert_eq!(ok(store.alerts(1).await, "alerts").len(), 1, "the limit is honoured");
}

/// Component statuses (circuit breakers) are replaced on each report.
pub async fn component_statuses_are_replaced_and_listed_by_prefix(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    ok(store.report_status("breaker/http://a:1", &json!({"state": "closed"})).await, "report");
    clock.advance(Duration::from_secs(1));
    ok(store.report_status("breaker/http://a:1", &json!({"state": "open"})).await, "report again");
    ok(store.report_status("breaker/http://b:2", &json!({"state": "closed"})).await, "report");
    ok(store.report_status("instance/s1", &json!({"alive": true})).await, "report");
    let breakers = ok(store.statuses("breaker/").await, "statuses");
    let keys: Vec<&str> = breakers.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, ["breaker/http://a:1", "breaker/http://b:2"]);
    assert_eq!(breakers[0].value, json!({"state": "open"}), "the last report wins");
    assert_eq!(breakers[0].reported_at, clock.now());
    assert_eq!(ok(store.statuses("").await, "all").len(), 3);
}

// ---------------------------------------------------------------------------
// Rate limits.
// ---------------------------------------------------------------------------

fn rate_request(key: &str, rate: &str, burst: u32, wait_max: Duration) -> RateRequest {
    let limit = rate.parse::<rota_model::RateLimit>().expect("valid rate").with_burst(burst).expect("valid burst");
    RateRequest { key: key.to_owned(), limit, wait_max }
}

/// Many takers on several store handles (as many processes), all at once
/// at every tick of the clock: the granted starts in any window of length
/// `t` number at most `rate × t + burst`, and the limit is used (every
/// tick grants what the budget allows, no less). Another key has its own
/// budget.
pub async fn concurrent_rate_takers_never_exceed_rate_times_t_plus_burst(harness: &dyn Harness) {
    let clock = harness.clock();
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(harness.open().await);
    }
    // 20/s: one slot every 50 ms, 5 at once.
    let (burst, interval_ms) = (5usize, 50i64);
    let request = rate_request("endpoint:http://api.example:443", "20/s", 5, Duration::ZERO);
    let mut starts: Vec<Timestamp> = Vec::new();
    // Ticks of 20 ms for 3 s of store time: 12 takers each, at once.
    for tick in 0..150 {
        let mut takes = tokio::task::JoinSet::new();
        for i in 0..12 {
            let (store, request) = (stores[i % stores.len()].clone(), request.clone());
            takes.spawn(async move { store.take_rate_slot(&request).await });
        }
        for answer in takes.join_all().await {
            match ok(answer, "take") {
                RateSlot::Granted { start } => {
                    assert_eq!(start, clock.now(), "tick {tick}: no wait offered, so a granted call starts now");
                    starts.push(start);
                }
                RateSlot::Refused { retry_at } => assert!(retry_at > clock.now(), "tick {tick}: a refusal points ahead"),
            }
        }
        clock.advance(Duration::from_millis(20));
    }
    starts.sort();
    for (i, first) in starts.iter().enumerate() {
        for window_ms in [interval_ms, 500, 1_000, 3_000] {
            let inside = starts[i..].iter().take_while(|s| s.as_millis() < first.as_millis() + window_ms).count();
            let bound = (window_ms / interval_ms) as usize + burst;
            assert!(inside <= bound, "{inside} calls started in {window_ms} ms from {first}: more than rate × t + burst = {bound}");
        }
    }
    // 3 s at 20/s after a burst of 5: the budget is used, not just bounded.
    assert!(starts.len() >= 60, "only {} of the ~65 slots were granted", starts.len());
    let other = rate_request("queue:agent.http", "20/s", 5, Duration::ZERO);
    assert!(matches!(ok(stores[0].take_rate_slot(&other).await, "take"), RateSlot::Granted { .. }), "another key has its own budget");
}

/// A take offering to wait is granted a start within the wait, one
/// interval after the slot before; past the wait it is refused, writing
/// nothing, with the time a take would succeed. Bad requests are refused.
pub async fn a_rate_slot_within_the_wait_is_granted_later_and_a_refusal_says_when(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let t0 = clock.now();
    // 10/s, burst 2, waiting up to 250 ms: slots at +0, +0, +100, +200.
    let request = rate_request("endpoint:http://slow:80", "10/s", 2, Duration::from_millis(250));
    let mut got = Vec::new();
    for _ in 0..4 {
        match ok(store.take_rate_slot(&request).await, "take") {
            RateSlot::Granted { start } => got.push(start.as_millis() - t0.as_millis()),
            refused => panic!("slot {} refused: {refused:?}", got.len() + 1),
        }
    }
    assert_eq!(got, [0, 0, 100, 200]);
    let refused = ok(store.take_rate_slot(&request).await, "take past the wait");
    assert_eq!(refused, RateSlot::Refused { retry_at: t0 + Duration::from_millis(50) }, "the next slot is at +300, 250 ms of wait");
    assert_eq!(ok(store.take_rate_slot(&request).await, "again"), refused, "a refusal wrote nothing");
    clock.advance(Duration::from_millis(50));
    assert_eq!(ok(store.take_rate_slot(&request).await, "at retry_at"), RateSlot::Granted { start: t0 + Duration::from_millis(300) });
    let bad = RateRequest { key: String::new(), ..request.clone() };
    assert!(matches!(store.take_rate_slot(&bad).await, Err(Error::Invalid(_))), "an empty key is refused");
    let bad = RateRequest { wait_max: Duration::from_secs(7_200), ..request };
    assert!(matches!(store.take_rate_slot(&bad).await, Err(Error::Invalid(_))), "an endless wait is refused");
}

/// `delete_rate_limits` deletes only the limits whose theoretical arrival
/// time is before the time given, and a key deleted so is granted as if it
/// had never been taken (its slot was in the past anyway).
pub async fn rate_limits_in_the_past_are_forgotten_without_a_trace(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let t0 = clock.now();
    // 1/min, burst 1: one take moves the key's time a minute ahead.
    let old = rate_request("endpoint:http://old:80", "1/min", 1, Duration::ZERO);
    let recent = rate_request("endpoint:http://recent:80", "1/min", 1, Duration::ZERO);
    assert_eq!(ok(store.take_rate_slot(&old).await, "take old"), RateSlot::Granted { start: t0 });
    clock.advance(Duration::from_secs(3_600));
    let t1 = clock.now();
    assert_eq!(ok(store.take_rate_slot(&recent).await, "take recent"), RateSlot::Granted { start: t1 });
    // old's time is t0 + 1 min, recent's t1 + 1 min.
    assert_eq!(ok(store.delete_rate_limits(t0 + Duration::from_secs(60)).await, "delete at old's time"), 0, "strictly before");
    assert_eq!(ok(store.delete_rate_limits(t1).await, "delete before t1"), 1, "old's time passed, recent's did not");
    assert_eq!(ok(store.delete_rate_limits(t1).await, "again"), 0, "recent is kept");
    assert_eq!(ok(store.take_rate_slot(&old).await, "take old again"), RateSlot::Granted { start: t1 }, "as if never taken");
    assert!(
        matches!(ok(store.take_rate_slot(&recent).await, "take recent again"), RateSlot::Refused { .. }),
        "recent still holds its minute"
    );
}

// ---------------------------------------------------------------------------
// Shared circuit breakers.
// ---------------------------------------------------------------------------

const BREAKER_KEY: &str = "endpoint:http://pay.example:80";

fn breaker_ask(holder: &str) -> BreakerAsk {
    BreakerAsk { key: BREAKER_KEY.to_owned(), holder: holder.to_owned(), probe_lease: Duration::from_secs(5) }
}

/// A report to [`BREAKER_KEY`]: opens after 3 failures, for 10 s.
fn breaker_report(holder: &str, probe: bool, result: BreakerResult) -> BreakerReport {
    BreakerReport {
        key: BREAKER_KEY.to_owned(),
        holder: holder.to_owned(),
        probe,
        result,
        failures_to_open: 3,
        open_for: Duration::from_secs(10),
    }
}

/// Failures reported at once from two processes all count; a success
/// resets the count; the third failure in a row opens the breaker for
/// `open_for`, and while open every ask is held until then. An unknown
/// breaker is closed and a success to it writes nothing. Bad asks and
/// reports are refused.
pub async fn breaker_failures_from_two_processes_add_up_and_open_it(harness: &dyn Harness) {
    let clock = harness.clock();
    let (a, b) = (harness.open().await, harness.open().await);
    assert_eq!(ok(a.admit_breaker(&breaker_ask("a")).await, "ask"), (BreakerAdmission::Go, None), "no row: closed");
    assert_eq!(ok(a.report_breaker(&breaker_report("a", false, BreakerResult::Success)).await, "success"), None, "nothing to write");
    let mut reports = tokio::task::JoinSet::new();
    for store in [a.clone(), b.clone()] {
        reports.spawn(async move { store.report_breaker(&breaker_report("x", false, BreakerResult::Failure)).await });
    }
    for answer in reports.join_all().await {
        ok(answer, "failure");
    }
    let row = ok(a.shared_breakers().await, "list").pop().expect("a row");
    assert_eq!((row.state, row.consecutive_failures), (SharedBreakerState::Closed, 2), "both failures counted: {row:?}");
    let reset = ok(b.report_breaker(&breaker_report("b", false, BreakerResult::Success)).await, "success").expect("row");
    assert_eq!((reset.state, reset.consecutive_failures), (SharedBreakerState::Closed, 0));
    for (i, store) in [&a, &b, &a].into_iter().enumerate() {
        let row = ok(store.report_breaker(&breaker_report("x", false, BreakerResult::Failure)).await, "failure").expect("row");
        assert_eq!(row.consecutive_failures, i as u32 + 1);
    }
    let open = ok(b.shared_breakers().await, "list").pop().expect("a row");
    let until = clock.now() + Duration::from_secs(10);
    assert_eq!((open.state, open.open_until, open.probe_holder.as_deref()), (SharedBreakerState::Open, Some(until), None), "{open:?}");
    let (held, row) = ok(b.admit_breaker(&breaker_ask("b")).await, "ask while open");
    assert_eq!(held, BreakerAdmission::Hold { until });
    assert_eq!(row.as_ref(), Some(&open), "an ask while open writes nothing");
    // A late failure of a call let through before it opened extends nothing.
    let late = ok(a.report_breaker(&breaker_report("a", false, BreakerResult::Failure)).await, "late").expect("row");
    assert_eq!((late.state, late.open_until), (SharedBreakerState::Open, Some(until)));
    let late = ok(a.report_breaker(&breaker_report("a", false, BreakerResult::Success)).await, "late").expect("row");
    assert_eq!(late.state, SharedBreakerState::Open, "only the probe closes an open breaker");
    let bad = BreakerAsk { key: String::new(), ..breaker_ask("a") };
    assert!(matches!(a.admit_breaker(&bad).await, Err(Error::Invalid(_))), "an empty key is refused");
    let bad = BreakerAsk { probe_lease: Duration::ZERO, ..breaker_ask("a") };
    assert!(matches!(a.admit_breaker(&bad).await, Err(Error::Invalid(_))), "a zero lease is refused");
    let bad = BreakerReport { failures_to_open: 0, ..breaker_report("a", false, BreakerResult::Failure) };
    assert!(matches!(a.report_breaker(&bad).await, Err(Error::Invalid(_))), "failures_to_open 0 is refused");
}

/// Opens [`BREAKER_KEY`] with three failures and moves the clock past
/// `open_for`.
async fn open_then_wait(store: &SharedStore, clock: &ManualClock) {
    for _ in 0..3 {
        ok(store.report_breaker(&breaker_report("x", false, BreakerResult::Failure)).await, "failure");
    }
    clock.advance(Duration::from_secs(10));
}

/// Once an open breaker's time is up, many asks from three processes at
/// once: exactly one goes as the probe; the others are held until its
/// lease ends. The probe's success closes the breaker, and then every ask
/// goes.
pub async fn two_owners_race_for_the_probe_and_exactly_one_wins(harness: &dyn Harness) {
    let clock = harness.clock();
    let stores = [harness.open().await, harness.open().await, harness.open().await];
    open_then_wait(&stores[0], &clock).await;
    let mut asks = tokio::task::JoinSet::new();
    for i in 0..12 {
        let store = stores[i % stores.len()].clone();
        asks.spawn(async move { (i, store.admit_breaker(&breaker_ask(&format!("owner-{i}"))).await) });
    }
    let lease_until = clock.now() + Duration::from_secs(5);
    let mut probes = Vec::new();
    for (i, answer) in asks.join_all().await {
        match ok(answer, "ask").0 {
            BreakerAdmission::Probe { lease_until: until } => {
                assert_eq!(until, lease_until);
                probes.push(i);
            }
            // A loser may have read the row before the winner's write.
            BreakerAdmission::Hold { until } => assert!(until == lease_until || until == clock.now(), "held until {until}"),
            BreakerAdmission::Go => panic!("owner-{i} went through a breaker that is not closed"),
        }
    }
    assert_eq!(probes.len(), 1, "exactly one probe: {probes:?}");
    let holder = format!("owner-{}", probes[0]);
    let row = ok(stores[1].shared_breakers().await, "list").pop().expect("row");
    assert_eq!(
        (row.state, row.probe_holder.as_deref(), row.probe_until),
        (SharedBreakerState::HalfOpen, Some(&*holder), Some(lease_until))
    );
    let (again, _) = ok(stores[2].admit_breaker(&breaker_ask("late")).await, "ask");
    assert_eq!(again, BreakerAdmission::Hold { until: lease_until }, "the probe is out");
    // A success of a call that is not the probe decides nothing.
    let other = ok(stores[2].report_breaker(&breaker_report("late", true, BreakerResult::Success)).await, "not the probe");
    assert_eq!(other.expect("row").state, SharedBreakerState::HalfOpen);
    let closed = ok(stores[0].report_breaker(&breaker_report(&holder, true, BreakerResult::Success)).await, "probe").expect("row");
    assert_eq!(
        (closed.state, closed.consecutive_failures, closed.open_until, closed.probe_holder),
        (SharedBreakerState::Closed, 0, None, None)
    );
    assert_eq!(ok(stores[1].admit_breaker(&breaker_ask("b")).await, "ask").0, BreakerAdmission::Go);
}

/// A probe whose process went silent: once its lease ends another process
/// takes the probe over, and the first one's late result decides nothing.
/// A failed probe opens the breaker again for `open_for`; an abandoned
/// probe hands its lease back at once.
pub async fn an_expired_probe_lease_is_taken_over_and_only_the_probe_decides(harness: &dyn Harness) {
    let clock = harness.clock();
    let (a, b) = (harness.open().await, harness.open().await);
    open_then_wait(&a, &clock).await;
    assert!(matches!(ok(a.admit_breaker(&breaker_ask("a")).await, "ask").0, BreakerAdmission::Probe { .. }));
    clock.advance(Duration::from_secs(5));
    let (taken, row) = ok(b.admit_breaker(&breaker_ask("b")).await, "ask after the lease");
    assert_eq!(taken, BreakerAdmission::Probe { lease_until: clock.now() + Duration::from_secs(5) });
    assert_eq!(row.expect("row").probe_holder.as_deref(), Some("b"));
    let late = ok(a.report_breaker(&breaker_report("a", true, BreakerResult::Success)).await, "late probe").expect("row");
    assert_eq!((late.state, late.probe_holder.as_deref()), (SharedBreakerState::HalfOpen, Some("b")), "a's lease is gone");
    let reopened = ok(b.report_breaker(&breaker_report("b", true, BreakerResult::Failure)).await, "failed probe").expect("row");
    let until = clock.now() + Duration::from_secs(10);
    assert_eq!((reopened.state, reopened.open_until, reopened.probe_holder), (SharedBreakerState::Open, Some(until), None));
    assert_eq!(ok(a.admit_breaker(&breaker_ask("a")).await, "ask").0, BreakerAdmission::Hold { until });
    clock.advance(Duration::from_secs(10));
    assert!(matches!(ok(a.admit_breaker(&breaker_ask("a")).await, "ask").0, BreakerAdmission::Probe { .. }));
    let given_back = ok(a.report_breaker(&breaker_report("a", true, BreakerResult::Abandoned)).await, "abandoned").expect("row");
    assert_eq!((given_back.state, given_back.probe_holder), (SharedBreakerState::HalfOpen, None));
    assert!(matches!(ok(b.admit_breaker(&breaker_ask("b")).await, "ask").0, BreakerAdmission::Probe { .. }), "the lease came back");
}

/// The retention sweep's delete: rows unchanged since the bound go, unless
/// they are open (or hold a probe lease) past it.
pub async fn stale_closed_breakers_are_deleted_and_open_ones_kept(harness: &dyn Harness) {
    let clock = harness.clock();
    let store = harness.open().await;
    let failing = BreakerReport { key: "endpoint:http://failing:80".into(), ..breaker_report("x", false, BreakerResult::Failure) };
    ok(store.report_breaker(&failing).await, "failure");
    let long =
        BreakerReport { failures_to_open: 1, open_for: Duration::from_secs(3_600), ..breaker_report("x", false, BreakerResult::Failure) };
    ok(store.report_breaker(&long).await, "opens for an hour");
    clock.advance(Duration::from_secs(60));
    assert_eq!(ok(store.delete_shared_breakers(clock.now().sub(Duration::from_secs(61))).await, "delete"), 0, "nothing that old");
    assert_eq!(ok(store.delete_shared_breakers(clock.now()).await, "delete"), 1, "the failing one; the open one is kept");
    let left: Vec<String> = ok(store.shared_breakers().await, "list").into_iter().map(|b| b.key).collect();
    assert_eq!(left, [BREAKER_KEY]);
}

// ---------------------------------------------------------------------------
// Schedules.
// ---------------------------------------------------------------------------

fn schedule_name(name: &str) -> ScheduleName {
    ScheduleName::new(name).expect("valid schedule name")
}

/// A schedule of workflow `order` every `cron`, in UTC, from the API.
fn new_schedule(name: &str, cron: &str) -> NewSchedule {
    NewSchedule {
        name: schedule_name(name),
        spec: ScheduleSpec {
            workflow: WorkflowName::new("order").unwrap(),
            cron: cron.to_owned(),
            timezone: "UTC".to_owned(),
            input: json!({"source": name}),
            overlap: Overlap::Skip,
            catch_up: CatchUp::Latest,
        },
        source: ScheduleSource::Api,
    }
}

/// Creating a schedule starts it unpaused with nothing fired before now;
/// creating it again with the same definition is a no-op, with another
/// definition (or from another source) a `Conflict`. Schedules are listed
/// by name and survive a reopen.
pub async fn create_schedule_is_idempotent_and_refuses_another_definition(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let nightly = new_schedule("nightly", "0 0 2 * * *");
    let created = ok(store.create_schedule(&nightly).await, "create");
    assert_eq!((&created.name, &created.spec, created.source), (&nightly.name, &nightly.spec, ScheduleSource::Api));
    assert!(!created.paused, "a new schedule runs");
    assert_eq!(created.progress, ScheduleProgress { fired_through: clock.now(), ..ScheduleProgress::default() }, "nothing fired yet");
    assert_eq!((created.created_at, created.updated_at), (clock.now(), clock.now()));

    clock.advance(SECOND);
    assert_eq!(ok(store.create_schedule(&nightly).await, "create again"), created, "the same definition again writes nothing");
    let mut other = nightly.clone();
    other.spec.cron = "0 0 3 * * *".into();
    assert_err!(store.create_schedule(&other).await, Error::Conflict(_), "another definition under an existing name");
    let mut from_file = nightly.clone();
    from_file.source = ScheduleSource::File;
    assert_err!(store.create_schedule(&from_file).await, Error::Conflict(_), "the same definition from another source");
    assert_eq!(ok(store.schedule(&nightly.name).await, "read").as_ref(), Some(&created), "refused creations change nothing");

    ok(store.create_schedule(&new_schedule("hourly", "0 * * * *")).await, "create another");
    let names: Vec<String> = ok(store.schedules().await, "list").into_iter().map(|s| s.name.to_string()).collect();
    assert_eq!(names, ["hourly", "nightly"], "listed by name");
    assert_eq!(ok(store.schedule(&schedule_name("weekly")).await, "read a missing one"), None);

    let reopened = harness.open().await;
    assert_eq!(ok(reopened.schedule(&nightly.name).await, "read after reopen"), Some(created), "schedules are durable");
}

/// A cron expression or time zone that does not parse is `Invalid`, named
/// in the error, and nothing is stored.
pub async fn invalid_schedules_are_refused_and_store_nothing(harness: &dyn Harness) {
    let store = harness.open().await;
    let bad_cron = new_schedule("bad", "61 * * * *");
    let err = store.create_schedule(&bad_cron).await.expect_err("a bad cron expression");
    assert!(matches!(&err, Error::Invalid(why) if why.contains("cron") && why.contains("61 * * * *")), "got {err:?}");
    let mut bad_zone = new_schedule("bad", "* * * * *");
    bad_zone.spec.timezone = "Mars/Olympus".into();
    let err = store.declare_schedule(&bad_zone).await.expect_err("an unknown time zone");
    assert!(matches!(&err, Error::Invalid(why) if why.contains("timezone") && why.contains("Mars/Olympus")), "got {err:?}");
    assert_eq!(ok(store.schedules().await, "list"), [], "nothing was stored");
}

/// Pausing and resuming are idempotent and bump the version when they
/// change something; resuming fires from now on (fires while paused are
/// not caught up). Deleting removes the schedule; each of the three on a
/// missing schedule is `NotFound`.
pub async fn pause_resume_and_delete_schedules(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let created = ok(store.create_schedule(&new_schedule("nightly", "0 0 2 * * *")).await, "create");
    let name = created.name.clone();
    clock.advance(SECOND);
    let paused = ok(store.pause_schedule(&name).await, "pause");
    assert!(paused.paused);
    assert_eq!((paused.version, paused.updated_at), (created.version + 1, clock.now()), "a pause bumps the version");
    assert_eq!(ok(store.pause_schedule(&name).await, "pause again"), paused, "pausing a paused schedule writes nothing");

    clock.advance(Duration::from_secs(3600));
    let resumed = ok(store.resume_schedule(&name).await, "resume");
    assert!(!resumed.paused);
    assert_eq!(resumed.version, paused.version + 1, "a resume bumps the version");
    assert_eq!(resumed.progress.fired_through, clock.now(), "a resumed schedule fires from now on");
    assert_eq!(ok(store.resume_schedule(&name).await, "resume again"), resumed, "resuming a running schedule writes nothing");

    ok(store.delete_schedule(&name).await, "delete");
    assert_eq!(ok(store.schedule(&name).await, "read"), None, "deleted");
    assert_err!(store.delete_schedule(&name).await, Error::NotFound(_), "deleting a missing schedule");
    assert_err!(store.pause_schedule(&name).await, Error::NotFound(_), "pausing a missing schedule");
    assert_err!(store.resume_schedule(&name).await, Error::NotFound(_), "resuming a missing schedule");
}

/// A schedule's progress is advanced by a compare-and-set on its version:
/// of two leaders that read the same version, one advances and the other
/// gets `Conflict` and writes nothing; a pause in between fences an
/// advance out too. Advancing a missing schedule is `NotFound`.
pub async fn advance_schedule_is_fenced_on_its_version(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let read = ok(store.create_schedule(&new_schedule("every-second", "* * * * * *")).await, "create");
    clock.advance(SECOND * 3);
    let fire = read.progress.fired_through.add(SECOND);
    let progress = ScheduleProgress {
        fired_through: clock.now(),
        last_fire_at: Some(fire),
        last_task: Some(task_id("every-second@fire")),
        buffered_fire_at: Some(clock.now()),
        skipped: 1,
        last_skipped_at: Some(fire.add(SECOND)),
    };
    let advanced = ok(store.advance_schedule(&read.name, read.version, &progress).await, "the first leader advances");
    assert_eq!((&advanced.progress, advanced.version, advanced.updated_at), (&progress, read.version + 1, clock.now()));
    assert_eq!(ok(store.schedule(&read.name).await, "read").as_ref(), Some(&advanced), "the advance is stored");

    let late = ScheduleProgress { fired_through: clock.now(), skipped: 7, ..ScheduleProgress::default() };
    assert_err!(store.advance_schedule(&read.name, read.version, &late).await, Error::Conflict(_), "the second leader on the same read");
    assert_eq!(ok(store.schedule(&read.name).await, "read").as_ref(), Some(&advanced), "a fenced-out advance writes nothing");

    ok(store.pause_schedule(&read.name).await, "pause");
    assert_err!(store.advance_schedule(&read.name, advanced.version, &late).await, Error::Conflict(_), "an advance read before a pause");
    assert_err!(store.advance_schedule(&schedule_name("missing"), 1, &late).await, Error::NotFound(_), "advancing a missing schedule");
}

/// Declaring (a workflow file's schedule) creates, or replaces the
/// definition and source of an existing schedule: a changed definition
/// bumps the version and fires from now on, and the paused flag and the
/// rest of the progress are kept. The same declaration writes nothing.
pub async fn declare_schedule_replaces_the_definition_and_keeps_progress(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let created = ok(store.create_schedule(&new_schedule("nightly", "0 0 2 * * *")).await, "create from the API");
    let progress = ScheduleProgress { last_task: Some(task_id("nightly@before")), skipped: 2, ..created.progress.clone() };
    let advanced = ok(store.advance_schedule(&created.name, created.version, &progress).await, "advance");
    let paused = ok(store.pause_schedule(&created.name).await, "pause");
    clock.advance(Duration::from_secs(60));

    let mut declared = new_schedule("nightly", "0 30 3 * * *");
    declared.source = ScheduleSource::File;
    declared.spec.overlap = Overlap::BufferOne;
    let replaced = ok(store.declare_schedule(&declared).await, "declare over it");
    assert_eq!((&replaced.spec, replaced.source), (&declared.spec, ScheduleSource::File), "the declaration's definition wins");
    assert!(replaced.paused, "an operator's pause is kept");
    assert_eq!(replaced.version, paused.version + 1);
    assert_eq!(replaced.progress.fired_through, clock.now(), "a changed definition fires from now on");
    assert_eq!((&replaced.progress.last_task, replaced.progress.skipped), (&advanced.progress.last_task, 2), "the rest is kept");
    assert_eq!(replaced.created_at, created.created_at);

    clock.advance(SECOND);
    assert_eq!(ok(store.declare_schedule(&declared).await, "declare again"), replaced, "the same declaration writes nothing");
    let mut fresh = new_schedule("weekly", "0 0 9 * * MON");
    fresh.source = ScheduleSource::File;
    let new = ok(store.declare_schedule(&fresh).await, "declare a new one");
    assert_eq!((new.source, new.version, new.progress.fired_through), (ScheduleSource::File, 1, clock.now()));
}

// ---------------------------------------------------------------------------
// Retention.
// ---------------------------------------------------------------------------

/// Creates the task `id` of `workflow` with steps `a` and `b` and moves it,
/// now, to `state`: Processed and Error through a claim and the holder's
/// write, Cancelled by an operator's cancel, Processing by a claim (left
/// leased), Pending as created.
async fn task_in_state(store: &SharedStore, clock: &ManualClock, id: &str, workflow: &str, state: TaskState) {
    create(store, new_task(id, workflow, &["a", "b"], clock.now())).await;
    move_to_state(store, &task_id(id), state, clock.now()).await;
}

/// Moves the created task `id`, at `now`, to `state`, as [`task_in_state`]
/// says.
async fn move_to_state(store: &SharedStore, id: &TaskId, state: TaskState, now: Timestamp) {
    let id = id.clone();
    let next = match state {
        TaskState::Pending => return,
        TaskState::Cancelled => {
            let task = stored(store, &id).await.task;
            (task.clone(), ok(task.cancel(false, now), "cancel"))
        }
        TaskState::Processing | TaskState::Processed | TaskState::Error => {
            let claimed = claim_only(store, &instance("pruner"), 60 * SECOND, &id).await;
            let fence = claimed.fence().expect("a claimed task has a fence");
            let finished = match state {
                TaskState::Processing => return,
                TaskState::Processed => claimed.finish_processed(fence, json!({}), now),
                _ => claimed.fail(fence, "boom".into(), ExhaustedPolicy::Error, now),
            };
            (claimed, ok(finished, "finish"))
        }
        other => panic!("task_in_state: {other:?} is not offered"),
    };
    let event = Event::task(&id, now, EventKind::Processed, json!({}));
    commit(store, Changes { tasks: vec![TaskWrite::replacing(&next.0, next.1)], events: vec![event], ..Changes::default() }, "finish")
        .await;
}

fn pruned_ids(pruned: &crate::Pruned) -> Vec<&str> {
    pruned.tasks.iter().map(|id| id.as_str()).collect()
}

/// `prune_tasks` deletes finished tasks whose end time is strictly before
/// the cutoff, oldest end first, at most `limit` per call, each with its
/// steps and history (and says how many); a running or pending task is
/// never deleted, however old. A prune naming an unfinished state or a
/// limit out of bounds is `Invalid` and deletes nothing.
pub async fn prune_deletes_finished_tasks_oldest_first_in_batches(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    task_in_state(&store, &clock, "old-running", "order", TaskState::Processing).await;
    // Not claimable before the end, so that the claims below take only theirs.
    let mut pending = new_task("old-pending", "order", &["a", "b"], clock.now());
    pending.task.not_before = clock.now().add(Duration::from_secs(24 * 3600));
    create(&store, pending).await;
    for (id, state) in [("done-1", TaskState::Processed), ("failed-2", TaskState::Error), ("cancelled-3", TaskState::Cancelled)] {
        clock.advance(SECOND);
        task_in_state(&store, &clock, id, "order", state).await;
    }
    clock.advance(SECOND);
    let cutoff = clock.now();
    task_in_state(&store, &clock, "done-at-cutoff", "order", TaskState::Processed).await;
    clock.advance(Duration::from_secs(3600));

    let mut running = Prune::finished_before(cutoff, 10);
    running.states.push(TaskState::Processing);
    assert_err!(store.prune_tasks(&running).await, Error::Invalid(_), "a prune naming an unfinished state");
    assert_err!(store.count_prunable(&running).await, Error::Invalid(_), "a count naming an unfinished state");
    assert_err!(store.prune_tasks(&Prune::finished_before(cutoff, 0)).await, Error::Invalid(_), "a limit of 0");
    assert_err!(
        store.prune_tasks(&Prune::finished_before(cutoff, Prune::LIMIT_MAX + 1)).await,
        Error::Invalid(_),
        "a limit over LIMIT_MAX"
    );
    assert!(stored(&store, &task_id("done-1")).await.task.state.is_terminal(), "refused prunes delete nothing");

    let first = ok(store.prune_tasks(&Prune::finished_before(cutoff, 2)).await, "first batch");
    assert_eq!(pruned_ids(&first), ["done-1", "failed-2"], "the two oldest finished tasks first");
    assert_eq!((first.steps, first.events), (4, 6), "two steps each; received, claimed and the finish event each");
    for id in ["done-1", "failed-2"] {
        assert_eq!(ok(store.task(&task_id(id)).await, "task"), None, "{id} is gone");
        assert_eq!(ok(store.history(&task_id(id)).await, "history"), [], "{id}'s history is gone");
    }
    let second = ok(store.prune_tasks(&Prune::finished_before(cutoff, 2)).await, "second batch");
    assert_eq!(pruned_ids(&second), ["cancelled-3"], "then the rest; the one that ended at the cutoff is kept");
    assert_eq!((second.steps, second.events), (2, 2));
    assert!(ok(store.prune_tasks(&Prune::finished_before(cutoff, 2)).await, "third batch").tasks.is_empty(), "nothing left");

    let everything = Prune::finished_before(clock.now().add(Duration::from_secs(3600)), 100);
    assert_eq!(pruned_ids(&ok(store.prune_tasks(&everything).await, "a later cutoff")), ["done-at-cutoff"]);
    for id in ["old-running", "old-pending"] {
        let record = stored(&store, &task_id(id)).await;
        assert_eq!((record.steps.len(), history_kinds(&store, &task_id(id)).await.is_empty()), (2, false), "{id} is untouched");
    }
    let reopened = harness.open().await;
    assert_eq!(ok(reopened.task(&task_id("done-1")).await, "after reopen"), None, "the deletion is durable");
}

/// A prune selects by state and by workflow (one workflow, or all but
/// some), and `count_prunable` counts what the same prune would delete,
/// ignoring the limit, without deleting anything (a dry run).
pub async fn prune_selects_by_state_and_workflow_and_counts_without_deleting(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    for (id, workflow, state) in [
        ("order-done", "order", TaskState::Processed),
        ("order-failed", "order", TaskState::Error),
        ("refund-done", "refund", TaskState::Processed),
        ("mail-done", "mail", TaskState::Processed),
        ("mail-cancelled", "mail", TaskState::Cancelled),
    ] {
        task_in_state(&store, &clock, id, workflow, state).await;
        clock.advance(SECOND);
    }
    let before = clock.now();
    let all = Prune::finished_before(before, 1);
    assert_eq!(ok(store.count_prunable(&all).await, "count all"), 5, "the count ignores the limit");
    assert_eq!(ok(store.count_prunable(&all).await, "count again"), 5, "counting deletes nothing");
    assert!(stored(&store, &task_id("order-done")).await.task.state.is_terminal());

    let errors = Prune { states: vec![TaskState::Error], limit: 10, ..all.clone() };
    assert_eq!(ok(store.count_prunable(&errors).await, "count errors"), 1);
    assert_eq!(pruned_ids(&ok(store.prune_tasks(&errors).await, "prune errors")), ["order-failed"], "only the state asked");

    let mail = Prune { workflows: PruneWorkflows::Only(WorkflowName::new("mail").unwrap()), limit: 10, ..all.clone() };
    assert_eq!(ok(store.count_prunable(&mail).await, "count mail"), 2);
    assert_eq!(pruned_ids(&ok(store.prune_tasks(&mail).await, "prune mail")), ["mail-done", "mail-cancelled"], "only that workflow");

    let not_order = Prune { workflows: PruneWorkflows::Except(vec![WorkflowName::new("order").unwrap()]), limit: 10, ..all.clone() };
    assert_eq!(ok(store.count_prunable(&not_order).await, "count all but order"), 1);
    assert_eq!(pruned_ids(&ok(store.prune_tasks(&not_order).await, "prune all but order")), ["refund-done"], "all but that workflow");
    let nothing_left_out = Prune { workflows: PruneWorkflows::Except(Vec::new()), limit: 10, ..all };
    assert_eq!(pruned_ids(&ok(store.prune_tasks(&nothing_left_out).await, "prune the rest")), ["order-done"], "an empty exception list");
    assert_eq!(ok(store.count_prunable(&nothing_left_out).await, "count none"), 0);
}

/// `prunable_tasks` names the batch `prune_tasks` would delete next (same
/// order and limit) and deletes nothing; a prune restricted to named tasks
/// (`Prune::only`, how an archive deletes what it wrote) deletes only
/// those, and only those the rest of the selection still matches: one
/// resubmitted in between is kept.
pub async fn prunable_tasks_names_the_next_batch_and_only_prunes_just_those(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    for (id, state) in [("first", TaskState::Processed), ("second", TaskState::Error), ("third", TaskState::Processed)] {
        task_in_state(&store, &clock, id, "order", state).await;
        clock.advance(SECOND);
    }
    let all = Prune::finished_before(clock.now(), 2);
    let named = ok(store.prunable_tasks(&all).await, "the next batch");
    assert_eq!(named.iter().map(TaskId::as_str).collect::<Vec<_>>(), ["first", "second"], "oldest end first, at most the limit");
    assert_eq!(ok(store.count_prunable(&all).await, "count"), 3, "naming deletes nothing");

    let failed = stored(&store, &task_id("second")).await.task;
    let again = ok(failed.resubmit(clock.now()), "resubmit");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(&failed, again)], ..Changes::default() }, "resubmit").await;
    let only = Prune { only: Some(named), limit: 10, ..all.clone() };
    assert_eq!(ok(store.count_prunable(&only).await, "count the named"), 1, "the resubmitted one no longer matches");
    let pruned = ok(store.prune_tasks(&only).await, "prune the named");
    assert_eq!(pruned_ids(&pruned), ["first"], "only the named tasks the selection still matches");
    assert!(stored(&store, &task_id("third")).await.task.state.is_terminal(), "a task not named is kept");
    assert_eq!(stored(&store, &task_id("second")).await.task.state, TaskState::Pending, "the resubmitted one is kept");
    let none = Prune { only: Some(Vec::new()), ..all.clone() };
    assert!(ok(store.prune_tasks(&none).await, "prune none").tasks.is_empty(), "an empty list names nothing");
    assert_err!(store.prunable_tasks(&Prune { limit: 0, ..all }).await, Error::Invalid(_), "the same checks as a prune");
}

/// A schedule's task (id `NAME@…`) that finished at or after the
/// schedule's `fired_through` (or its buffered fire, when older) may
/// belong to a fire not yet recorded, which the next leader would submit
/// again: a prune keeps it. Once the progress passes it, it is deleted
/// like any other. A schedule whose `last_task` was deleted reads as
/// before, and other tasks are not held back by schedules.
pub async fn prune_keeps_the_tasks_of_fires_a_schedule_has_not_recorded(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    task_in_state(&store, &clock, "nightly@recorded", "order", TaskState::Processed).await;
    clock.advance(SECOND);
    let created = ok(store.create_schedule(&new_schedule("nightly", "0 0 2 * * *")).await, "create");
    let progress = ScheduleProgress { last_task: Some(task_id("nightly@recorded")), ..created.progress.clone() };
    let recorded = ok(store.advance_schedule(&created.name, created.version, &progress).await, "record a fire");
    clock.advance(SECOND);
    for id in ["nightly@unrecorded", "nightlyx@other", "plain"] {
        task_in_state(&store, &clock, id, "order", TaskState::Processed).await;
        clock.advance(SECOND);
    }
    clock.advance(Duration::from_secs(3600));

    let all = Prune::finished_before(clock.now(), 100);
    assert_eq!(ok(store.count_prunable(&all).await, "count"), 3, "the unrecorded fire's task is not counted");
    let first = ok(store.prune_tasks(&all).await, "prune");
    assert_eq!(pruned_ids(&first), ["nightly@recorded", "nightlyx@other", "plain"], "the unrecorded fire's task is kept");
    assert_eq!(
        ok(store.schedule(&created.name).await, "read"),
        Some(recorded.clone()),
        "the schedule naming a deleted task reads as before"
    );

    let buffered = ScheduleProgress { fired_through: clock.now(), buffered_fire_at: Some(created.progress.fired_through), ..progress };
    let advanced = ok(store.advance_schedule(&created.name, recorded.version, &buffered).await, "advance, with an older fire buffered");
    assert!(ok(store.prune_tasks(&all).await, "prune").tasks.is_empty(), "a buffered fire older than the task keeps it");
    let done = ScheduleProgress { buffered_fire_at: None, ..buffered };
    ok(store.advance_schedule(&created.name, advanced.version, &done).await, "the buffered fire starts");
    assert_eq!(pruned_ids(&ok(store.prune_tasks(&all).await, "prune")), ["nightly@unrecorded"], "recorded now: deleted");
}

/// `sweep_instance` deletes a gone instance's heartbeat and inbox together,
/// and only when nothing of it is still needed: not while its heartbeat is
/// recent, nor while it holds a task's lease, nor while its inbox holds a
/// message or a dead letter. `delete_statuses` deletes the statuses of a
/// prefix not reported since a time.
pub async fn sweep_instance_deletes_only_what_nobody_needs(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    let gone = instance("gone-1");
    let inbox = queue("rota.inbox.gone-1");
    ok(store.report_status("instance/gone-1", &json!({"instance": "gone-1"})).await, "heartbeat");
    ok(store.report_status("breaker/http://old", &json!({})).await, "old breaker");
    send_label(&store, &inbox, "a late reply").await;
    create(&store, new_task("held", "order", &[], clock.now())).await;
    let held = claim_only(&store, &gone, 60 * SECOND, &task_id("held")).await;
    clock.advance(Duration::from_secs(600));
    ok(store.report_status("instance/live-1", &json!({"instance": "live-1"})).await, "a live heartbeat");
    ok(store.report_status("breaker/http://fresh", &json!({})).await, "fresh breaker");
    let sweep = |who: &str| InstanceSweep {
        instance: instance(who),
        heartbeat_key: format!("instance/{who}"),
        gone_before: clock.now().sub(SECOND),
        inbox: Some(queue(&format!("rota.inbox.{who}"))),
    };

    assert_eq!(ok(store.sweep_instance(&sweep("gone-1")).await, "sweep"), Swept::default(), "it still holds a task's lease");
    let fence = held.fence().expect("fence");
    let released = ok(held.release(fence, clock.now()), "release");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(&held, released)], ..Changes::default() }, "recover").await;
    assert_eq!(ok(store.sweep_instance(&sweep("gone-1")).await, "sweep"), Swept::default(), "its inbox holds a message");
    let delivery = receive_one(&store, &inbox, "the late reply").await;
    ok(store.dead_letter(&inbox, delivery.lease_token, "stale".into()).await, "dead-letter it");
    assert_eq!(ok(store.sweep_instance(&sweep("gone-1")).await, "sweep"), Swept::default(), "its inbox holds a dead letter");
    ok(store.purge_dead_letters(&inbox).await, "purge");
    assert_eq!(ok(store.statuses("instance/gone-1").await, "heartbeat").len(), 1, "refused sweeps delete nothing");
    assert!(stats_of(&store, &inbox).await.is_some(), "refused sweeps keep the inbox");

    assert_eq!(ok(store.sweep_instance(&sweep("live-1")).await, "sweep a live one"), Swept::default(), "a recent heartbeat");
    assert_eq!(ok(store.sweep_instance(&sweep("never")).await, "sweep an unknown one"), Swept::default(), "no heartbeat at all");
    assert_eq!(ok(store.sweep_instance(&sweep("gone-1")).await, "sweep"), Swept { heartbeat: true, inbox: true });
    assert_eq!(ok(store.statuses("instance/").await, "heartbeats").len(), 1, "only the live heartbeat is left");
    assert!(stats_of(&store, &inbox).await.is_none(), "the inbox is gone");
    assert_eq!(ok(store.sweep_instance(&sweep("gone-1")).await, "sweep again"), Swept::default(), "nothing left to sweep");
    send_label(&store, &inbox, "after the sweep").await;
    assert_eq!(label(&receive_one(&store, &inbox, "a send recreates the inbox").await), "after the sweep");

    assert_eq!(ok(store.delete_statuses("breaker/", clock.now().sub(SECOND)).await, "delete old breakers"), 1);
    let keys: Vec<String> = ok(store.statuses("breaker/").await, "breakers").into_iter().map(|s| s.key).collect();
    assert_eq!(keys, ["breaker/http://fresh"], "the breaker reported since is kept");
}

// ---------------------------------------------------------------------------
// Child workflows.
// ---------------------------------------------------------------------------

/// A new Pending task like [`new_task`], the child of attempt `attempt` of
/// step `step` of task `parent`, `depth` levels below its top-level task.
fn new_child(id: &str, parent: &str, step: &str, attempt: u32, depth: u32, now: Timestamp) -> NewTask {
    let mut new = new_task(id, "shipping", &["book"], now);
    new.task.parent = Some(ParentLink { task: task_id(parent), step: StepName::new(step).expect("a valid step name"), attempt, depth });
    new
}

/// A child keeps its parent link (task, step, attempt, depth) wherever it
/// is read; `list_tasks` filtered by parent lists a task's children newest
/// first; `stale_children` names the unfinished children whose parent no
/// longer waits for them (the parent is gone or left Pending/Processing,
/// or its step does not run the child's attempt), up to its limit, and
/// none of the others.
pub async fn a_child_keeps_its_parent_link_and_stale_children_are_found(harness: &dyn Harness) {
    let store = harness.open().await;
    let clock = harness.clock();
    create(&store, new_task("parent", "order", &["reserve", "ship"], clock.now())).await;
    let owner = instance("scheduler-children");
    let claimed = claim_only(&store, &owner, LEASE_DEFAULT, &task_id("parent")).await;
    let before = step_of(&stored(&store, &task_id("parent")).await, "ship").clone();
    let running = ok(before.start(json!({ "to": "Lyon" }), clock.now(), 60 * SECOND), "start ship");
    assert_eq!(running.attempt, 1);
    let decided = Task { lease_epoch: claimed.lease_epoch + 1, ..claimed.clone() };
    let changes = Changes {
        tasks: vec![TaskWrite::replacing(&claimed, decided.clone())],
        steps: vec![StepWrite::replacing(&before, running)],
        ..Changes::default()
    };
    commit(&store, changes, "ship runs attempt 1").await;
    clock.advance(SECOND);
    let children = [
        new_child("parent/ship#1", "parent", "ship", 1, 1, clock.now()),
        new_child("parent/ship#0", "parent", "ship", 0, 1, clock.now()),
        new_child("orphan", "gone", "ship", 1, 3, clock.now()),
        new_child("finished", "parent", "ship", 0, 1, clock.now()),
    ];
    for child in children {
        clock.advance(MILLI);
        create(&store, child).await;
    }
    move_to_state(&store, &task_id("finished"), TaskState::Cancelled, clock.now()).await;

    let child = stored(&store, &task_id("parent/ship#1")).await.task;
    let link = ParentLink { task: task_id("parent"), step: StepName::new("ship").unwrap(), attempt: 1, depth: 1 };
    assert_eq!(child.parent, Some(link.clone()), "the link reads back");
    assert_eq!(stored(&store, &task_id("orphan")).await.task.parent.map(|p| p.depth), Some(3), "the depth reads back");
    assert_eq!(stored(&store, &task_id("parent")).await.task.parent, None, "a top-level task has none");
    let by_parent = TaskFilter { parent: Some(task_id("parent")), ..TaskFilter::default() };
    let listed = ok(store.list_tasks(&by_parent).await, "list children");
    assert_eq!(task_ids(&listed), ["finished", "parent/ship#0", "parent/ship#1"], "the parent's children, newest first");
    assert_eq!(listed[2].parent, Some(link), "a listing reads the link too");
    let counted = ok(store.count_tasks(&by_parent).await, "count children");
    assert_eq!(counted.iter().map(|(_, n)| n).sum::<u64>(), 3);
    let none = TaskFilter { parent: Some(task_id("parent/ship#1")), ..TaskFilter::default() };
    assert!(ok(store.list_tasks(&none).await, "list a childless task's children").is_empty());

    let mut stale = ok(store.stale_children(10).await, "stale children");
    stale.sort();
    assert_eq!(
        stale,
        [task_id("orphan"), task_id("parent/ship#0")],
        "a gone parent, another attempt; not the running one, not a finished one"
    );
    assert_eq!(ok(store.stale_children(1).await, "one stale child").len(), 1, "at most the limit");

    // Claimed, a child still belongs to its parent's attempt.
    let claimed_child = claim(&store, &instance("scheduler-child"), LEASE_DEFAULT, 10).await;
    assert!(claimed_child.iter().all(|t| t.parent.is_some()), "a claim reads the link");
    // The parent cancelled: its running child is left too.
    let parent = stored(&store, &task_id("parent")).await.task;
    let cancelled = ok(parent.cancel(false, clock.now()), "cancel the parent");
    commit(&store, Changes { tasks: vec![TaskWrite::replacing(&parent, cancelled)], ..Changes::default() }, "cancel the parent").await;
    let mut stale = ok(store.stale_children(10).await, "stale children after the cancel");
    stale.sort();
    assert_eq!(stale, [task_id("orphan"), task_id("parent/ship#0"), task_id("parent/ship#1")]);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// A case runs only if `conformance_suite!` lists it, and forgetting to
    /// list one compiles and passes everywhere: so this test reads this file
    /// and names every case written but not listed.
    #[test]
    fn every_case_is_listed() {
        let listed: BTreeSet<&str> = crate::conformance_suite! { @list (@names) }.into_iter().collect();
        let written: BTreeSet<&str> = include_str!("conformance.rs")
            .lines()
            .filter_map(|line| line.strip_prefix("pub async fn "))
            .map(|rest| rest.split(['(', '<']).next().unwrap_or(rest).trim())
            .collect();
        let missing: Vec<&str> = written.difference(&listed).copied().collect();
        assert!(missing.is_empty(), "conformance cases that no backend runs: add {missing:?} to the list in `conformance_suite!`");
        assert!(!written.is_empty(), "no case found: the test no longer recognises how cases are written");
    }
}
