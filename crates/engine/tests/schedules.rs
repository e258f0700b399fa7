//! Schedules fired by the Supervisor leader, on both backends, under a
//! manual clock: the derived task ids, one task per fire time however many
//! leaders fire, the catch-up policies after downtime, the overlap
//! policies, daylight-saving changes as croner defines them, pause and
//! resume, the manual trigger, and the operator's refusals.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Backend;
use rota_engine::ops::Operator;
use rota_engine::schedules::{self, Firing};
use rota_engine::{Client, Completions, Supervisor, Workflows, ops, supervisor};
use rota_model::schedule::rfc3339_seconds;
use rota_model::{CatchUp, Clock, InstanceId, ManualClock, Overlap, ScheduleName, TaskId, Timestamp, WorkflowName};
use rota_store::{AuditAction, AuditFilter, EventKind, NewSchedule, ScheduleSource, ScheduleSpec, SharedStore, TaskFilter};
use rota_workflow::{AgentCatalog, StepDef, Workflow};
use serde_json::json;

/// Who acts on schedules in these tests.
const OPERATOR: Operator<'static> = Operator { by: "ops-team", reason: Some("maintenance") };
/// 2027-01-15T08:00:00Z, a whole minute.
const START: Timestamp = Timestamp::from_millis(1_800_000_000_000);
const SECOND: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);

struct Rig {
    store: SharedStore,
    clock: Arc<ManualClock>,
    client: Client,
    supervisor: Supervisor,
    _keep: common::TestStore,
}

async fn rig(backend: Backend, start: Timestamp, schedules: schedules::Config) -> Option<Rig> {
    let clock = Arc::new(ManualClock::new(start));
    let keep = common::open(backend, clock.clone()).await?;
    let store = keep.store.clone();
    let workflows = Workflows::new(store.clone());
    let workflow = Workflow::builder("report", 1).step(StepDef::new("nap", "delay")).build(&AgentCatalog::builtin()).unwrap();
    workflows.register(&workflow).await.unwrap();
    let client = Client::new(store.clone(), clock.clone(), workflows.clone(), None);
    let mut config = supervisor::Config::new(InstanceId::new("sup-1").unwrap());
    config.schedules = schedules;
    let supervisor = Supervisor::new(store.clone(), clock.clone(), workflows, Completions::default(), config).unwrap();
    Some(Rig { store, clock, client, supervisor, _keep: keep })
}

fn name(name: &str) -> ScheduleName {
    ScheduleName::new(name).unwrap()
}

fn schedule(schedule: &str, cron: &str, overlap: Overlap, catch_up: CatchUp) -> NewSchedule {
    NewSchedule {
        name: name(schedule),
        spec: ScheduleSpec {
            workflow: WorkflowName::new("report").unwrap(),
            cron: cron.into(),
            timezone: "UTC".into(),
            input: json!({"from": schedule}),
            overlap,
            catch_up,
        },
        source: ScheduleSource::Api,
    }
}

/// The ids of every task, oldest first.
async fn task_ids(store: &SharedStore) -> Vec<String> {
    let filter = TaskFilter { limit: 10_000, ..TaskFilter::default() };
    let mut ids: Vec<String> = store.list_tasks(&filter).await.unwrap().into_iter().map(|t| t.id.to_string()).collect();
    ids.reverse();
    ids
}

/// The ids a schedule's cron fires at `START` plus each offset get.
fn fire_ids(schedule: &str, offsets: &[Duration]) -> Vec<String> {
    offsets.iter().map(|offset| format!("{schedule}@{}", rfc3339_seconds(START.add(*offset)))).collect()
}

async fn round(rig: &Rig) -> schedules::Round {
    let round = rig.supervisor.run_once().await.unwrap();
    assert!(round.leader, "the only Supervisor leads");
    round.schedules
}

async fn fires_start_one_task_per_fire_time_with_derived_ids(backend: Backend) {
    let Some(rig) = rig(backend, START, schedules::Config::default()).await else { return };
    rig.client.create_schedule(&schedule("tick", "*/10 * * * * *", Overlap::Allow, CatchUp::All)).await.unwrap();
    assert_eq!(round(&rig).await.started, 0, "nothing before the first fire time");

    rig.clock.advance(SECOND * 10);
    let first = round(&rig).await;
    assert_eq!((first.started, first.next_fire), (1, Some(START.add(SECOND * 20))), "one fire, and the next one is known");
    assert_eq!(task_ids(&rig.store).await, fire_ids("tick", &[SECOND * 10]));
    let id = TaskId::new(&fire_ids("tick", &[SECOND * 10])[0]).unwrap();
    let received = rig.store.history(&id).await.unwrap().into_iter().find(|e| e.kind == EventKind::Received).unwrap();
    assert_eq!(received.detail["schedule"], json!({"name": "tick", "fire_at": "2027-01-15T08:00:10.000Z", "manual": false}));
    let task = rig.store.task(&id).await.unwrap().unwrap().task;
    assert_eq!(task.input, json!({"from": "tick"}), "the schedule's input");

    assert_eq!(round(&rig).await.started, 0, "a fire time is fired once");
    rig.clock.advance(SECOND * 25);
    assert_eq!(round(&rig).await.started, 2);
    assert_eq!(task_ids(&rig.store).await, fire_ids("tick", &[SECOND * 10, SECOND * 20, SECOND * 30]));
    let stored = rig.client.schedule(&name("tick")).await.unwrap();
    assert_eq!(stored.record.progress.fired_through, rig.clock.now());
    assert_eq!(stored.next_fire, Some(START.add(SECOND * 40)));
}

/// Two leaders at once (a failover while the old leader still runs its
/// round): each fires what it reads as due, the derived ids make the store
/// create one task per fire time, and the fenced advance lets one of them
/// record the progress.
async fn two_leaders_never_start_a_fire_twice(backend: Backend) {
    let Some(rig) = rig(backend, START, schedules::Config::default()).await else { return };
    rig.client.create_schedule(&schedule("tick", "* * * * * *", Overlap::Allow, CatchUp::All)).await.unwrap();
    let one = Firing::new(rig.client.clone(), schedules::Config::default()).unwrap();
    let two = Firing::new(rig.client.clone(), schedules::Config::default()).unwrap();
    for _ in 0..10 {
        rig.clock.advance(SECOND);
        let (a, b) = tokio::join!(one.run_once(), two.run_once());
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(a.started + b.started >= 1, "at least one of them fired");
    }
    let offsets: Vec<Duration> = (1..=10).map(|s| SECOND * s).collect();
    assert_eq!(task_ids(&rig.store).await, fire_ids("tick", &offsets), "exactly one task per fire time");
    let stored = rig.client.schedule(&name("tick")).await.unwrap().record;
    assert_eq!(stored.progress.fired_through, rig.clock.now(), "the progress is recorded");
}

/// After ten and a half minutes with no leader, an every-minute schedule
/// has nine missed fires (older than the minute of lateness allowed) and
/// one on time: `none` starts the one on time, `latest` the newest missed
/// one too, `all` every fire, a bounded number per round.
async fn missed_fires_follow_the_catch_up_policy(backend: Backend) {
    let config = schedules::Config { late_max: MINUTE, fires_per_round: 4 };
    let Some(rig) = rig(backend, START, config).await else { return };
    for (schedule_name, catch_up) in [("none", CatchUp::None), ("latest", CatchUp::Latest), ("all", CatchUp::All)] {
        rig.client.create_schedule(&schedule(schedule_name, "0 * * * * *", Overlap::Allow, catch_up)).await.unwrap();
    }
    rig.clock.advance(MINUTE * 10 + SECOND * 30);
    let first = round(&rig).await;
    assert_eq!(first.missed, 4 + 4, "none and latest skipped the missed fires, counted up to the round's bound");
    let ids = |prefix: &'static str, all: Vec<String>| all.into_iter().filter(move |id| id.starts_with(prefix)).collect::<Vec<_>>();
    assert_eq!(ids("none@", task_ids(&rig.store).await), fire_ids("none", &[MINUTE * 10]));
    assert_eq!(ids("latest@", task_ids(&rig.store).await), fire_ids("latest", &[MINUTE * 9, MINUTE * 10]));
    let minutes: Vec<Duration> = (1..=10).map(|m| MINUTE * m).collect();
    assert_eq!(ids("all@", task_ids(&rig.store).await), fire_ids("all", &minutes[..4]), "at most four per round, oldest first");
    round(&rig).await;
    round(&rig).await;
    assert_eq!(ids("all@", task_ids(&rig.store).await), fire_ids("all", &minutes), "the rest in the next rounds");
    let all = rig.client.schedule(&name("all")).await.unwrap().record;
    assert_eq!(all.progress.fired_through, rig.clock.now());
    assert_eq!(round(&rig).await.started, 0, "nothing is fired twice");
}

/// While the last fire's task runs: `skip` skips (and counts it), `allow`
/// starts another, `buffer-one` keeps one waiting fire (skipping the
/// next) and starts it, with its own fire time's id, once the task ends.
async fn a_running_task_follows_the_overlap_policy(backend: Backend) {
    let Some(rig) = rig(backend, START, schedules::Config::default()).await else { return };
    for (schedule_name, overlap) in [("skip", Overlap::Skip), ("allow", Overlap::Allow), ("buffer", Overlap::BufferOne)] {
        rig.client.create_schedule(&schedule(schedule_name, "*/10 * * * * *", overlap, CatchUp::All)).await.unwrap();
    }
    // Nothing runs the tasks: each stays Pending, unfinished.
    for _ in 0..3 {
        rig.clock.advance(SECOND * 10);
        round(&rig).await;
    }
    let ids = |prefix: &'static str, all: Vec<String>| all.into_iter().filter(move |id| id.starts_with(prefix)).collect::<Vec<_>>();
    let tens = [SECOND * 10, SECOND * 20, SECOND * 30];
    assert_eq!(ids("skip@", task_ids(&rig.store).await), fire_ids("skip", &tens[..1]));
    assert_eq!(ids("allow@", task_ids(&rig.store).await), fire_ids("allow", &tens));
    assert_eq!(ids("buffer@", task_ids(&rig.store).await), fire_ids("buffer", &tens[..1]));
    let skip = rig.client.schedule(&name("skip")).await.unwrap().record.progress;
    assert_eq!((skip.skipped, skip.last_skipped_at), (2, Some(START.add(SECOND * 30))), "skipped fires are counted");
    let buffer = rig.client.schedule(&name("buffer")).await.unwrap().record.progress;
    assert_eq!((buffer.buffered_fire_at, buffer.skipped), (Some(START.add(SECOND * 20)), 1), "one waits, the next is skipped");

    // The first tasks end: the buffered fire starts at the next round, with
    // its own fire time, and skip fires again at the next fire time.
    for first in [&fire_ids("buffer", &tens[..1])[0], &fire_ids("skip", &tens[..1])[0]] {
        rig.client.cancel(&TaskId::new(first.as_str()).unwrap(), rota_engine::ops::Operator { by: "test", reason: None }).await.unwrap();
    }
    round(&rig).await;
    assert_eq!(ids("buffer@", task_ids(&rig.store).await), fire_ids("buffer", &tens[..2]), "the buffered fire starts");
    let buffer = rig.client.schedule(&name("buffer")).await.unwrap().record.progress;
    assert_eq!(buffer.buffered_fire_at, None);
    rig.clock.advance(SECOND * 10);
    round(&rig).await;
    assert_eq!(ids("skip@", task_ids(&rig.store).await), fire_ids("skip", &[SECOND * 10, SECOND * 40]));
    assert_eq!(
        ids("buffer@", task_ids(&rig.store).await),
        fire_ids("buffer", &tens[..2]),
        "the buffered fire's task runs: the next fire waits again"
    );
    let buffer = rig.client.schedule(&name("buffer")).await.unwrap().record.progress;
    assert_eq!(buffer.buffered_fire_at, Some(START.add(SECOND * 40)));
}

/// Over Berlin's daylight-saving changes of 2026, as croner defines them: a
/// job at 02:30 runs at 03:00 CEST on the day 02:00–03:00 is skipped, and
/// once on the day 02:00–03:00 repeats; a job every half hour of 02:xx
/// runs four times that day.
async fn daylight_saving_changes_fire_as_croner_defines(backend: Backend) {
    let spring = Timestamp::from_millis(1_774_699_200_000); // 2026-03-28T12:00:00Z
    let Some(rig) = rig(backend, spring, schedules::Config::default()).await else { return };
    let berlin = |mut new: NewSchedule| {
        new.spec.timezone = "Europe/Berlin".into();
        new
    };
    rig.client.create_schedule(&berlin(schedule("fixed", "0 30 2 * * *", Overlap::Allow, CatchUp::All))).await.unwrap();
    for _ in 0..(24 * 4) {
        rig.clock.advance(MINUTE * 15);
        round(&rig).await;
    }
    assert_eq!(task_ids(&rig.store).await, ["fixed@2026-03-29T01:00:00Z"], "the skipped 02:30 runs right after the gap");

    let autumn = Timestamp::from_millis(1_792_843_200_000); // 2026-10-24T12:00:00Z
    rig.clock.set(autumn);
    rig.client.delete_schedule(&name("fixed"), OPERATOR).await.unwrap();
    rig.client.create_schedule(&berlin(schedule("fixed", "0 30 2 * * *", Overlap::Allow, CatchUp::All))).await.unwrap();
    rig.client.create_schedule(&berlin(schedule("halves", "0 */30 2 * * *", Overlap::Allow, CatchUp::All))).await.unwrap();
    for _ in 0..(24 * 4) {
        rig.clock.advance(MINUTE * 15);
        round(&rig).await;
    }
    let mut ids = task_ids(&rig.store).await;
    ids.sort();
    assert_eq!(
        ids,
        [
            "fixed@2026-03-29T01:00:00Z",
            "fixed@2026-10-25T00:30:00Z",
            "halves@2026-10-25T00:00:00Z",
            "halves@2026-10-25T00:30:00Z",
            "halves@2026-10-25T01:00:00Z",
            "halves@2026-10-25T01:30:00Z",
        ]
    );
}

/// A paused schedule does not fire, and a resumed one fires from the
/// resume on: what it would have fired while paused is not caught up.
async fn paused_schedules_do_not_fire_and_resume_from_now(backend: Backend) {
    let Some(rig) = rig(backend, START, schedules::Config::default()).await else { return };
    rig.client.create_schedule(&schedule("tick", "*/10 * * * * *", Overlap::Allow, CatchUp::All)).await.unwrap();
    let paused = rig.client.pause_schedule(&name("tick"), OPERATOR).await.unwrap();
    assert_eq!((paused.record.paused, paused.next_fire), (true, None), "a paused schedule has no next fire");
    rig.clock.advance(MINUTE);
    assert_eq!(round(&rig).await.started, 0, "paused");
    let resumed = rig.client.resume_schedule(&name("tick"), OPERATOR).await.unwrap();
    assert_eq!(resumed.next_fire, Some(START.add(MINUTE + SECOND * 10)));
    rig.clock.advance(SECOND * 10);
    assert_eq!(round(&rig).await.started, 1);
    assert_eq!(task_ids(&rig.store).await, fire_ids("tick", &[MINUTE + SECOND * 10]), "only fires after the resume");
}

/// `trigger` fires now, paused or not, with an id no cron fire has, and
/// leaves the schedule's progress alone.
async fn trigger_fires_now_with_its_own_id(backend: Backend) {
    let Some(rig) = rig(backend, START, schedules::Config::default()).await else { return };
    let created = rig.client.create_schedule(&schedule("tick", "0 0 * * * *", Overlap::Skip, CatchUp::All)).await.unwrap();
    rig.client.pause_schedule(&name("tick"), OPERATOR).await.unwrap();
    rig.clock.advance(Duration::from_millis(1_250));
    let submitted = rig.client.trigger_schedule(&name("tick"), OPERATOR).await.unwrap();
    assert_eq!(submitted.id.as_str(), "tick@manual@2027-01-15T08:00:01.250Z");
    assert!(submitted.created);
    let received = rig.store.history(&submitted.id).await.unwrap().into_iter().find(|e| e.kind == EventKind::Received).unwrap();
    assert_eq!(received.detail["schedule"], json!({"name": "tick", "fire_at": "2027-01-15T08:00:01.250Z", "manual": true}));
    rig.clock.advance(SECOND);
    rig.client.trigger_schedule(&name("tick"), OPERATOR).await.unwrap();
    assert_eq!(task_ids(&rig.store).await.len(), 2, "each trigger starts a task");
    let after = rig.client.schedule(&name("tick")).await.unwrap().record;
    assert_eq!(after.progress, created.0.record.progress, "a manual fire leaves the cron's progress alone");
    let err = rig.client.trigger_schedule(&name("nope"), OPERATOR).await.unwrap_err();
    assert!(matches!(err, ops::Error::ScheduleNotFound(_)), "{err}");
    assert_eq!(err.to_string(), "schedule nope not found");

    // Each action is in the audit log, newest first, with who and why;
    // the refused trigger is not.
    let audit = rig.client.audit(&AuditFilter { limit: 10, ..AuditFilter::default() }).await.unwrap();
    let listed: Vec<(AuditAction, &str, &str, Option<&str>)> =
        audit.iter().map(|e| (e.action, e.target.as_str(), e.by.as_str(), e.reason.as_deref())).collect();
    let done = (OPERATOR.by, OPERATOR.reason);
    assert_eq!(
        listed,
        [
            (AuditAction::ScheduleTrigger, "tick", done.0, done.1),
            (AuditAction::ScheduleTrigger, "tick", done.0, done.1),
            (AuditAction::SchedulePause, "tick", done.0, done.1),
        ]
    );
    assert_eq!(audit[1].detail["task"], json!(submitted.id.as_str()), "a trigger names the task it started");
}

/// Creating checks the expression, the zone and the workflow, and refuses
/// a name taken by another definition; nothing is written.
async fn bad_schedules_are_refused_with_the_field(backend: Backend) {
    let Some(rig) = rig(backend, START, schedules::Config::default()).await else { return };
    let err = rig.client.create_schedule(&schedule("bad", "* * *", Overlap::Skip, CatchUp::All)).await.unwrap_err();
    assert!(err.to_string().starts_with("cron: invalid cron expression \"* * *\""), "{err}");
    let mut zone = schedule("bad", "* * * * *", Overlap::Skip, CatchUp::All);
    zone.spec.timezone = "Europe/Pariss".into();
    let err = rig.client.create_schedule(&zone).await.unwrap_err();
    assert!(err.to_string().starts_with("timezone: unknown time zone \"Europe/Pariss\""), "{err}");
    let mut unknown = schedule("bad", "* * * * *", Overlap::Skip, CatchUp::All);
    unknown.spec.workflow = WorkflowName::new("nope").unwrap();
    let err = rig.client.create_schedule(&unknown).await.unwrap_err();
    assert!(matches!(err, ops::Error::UnknownWorkflow(_)), "{err}");
    assert!(rig.client.schedules().await.unwrap().is_empty(), "nothing was written");

    let good = schedule("good", "* * * * *", Overlap::Skip, CatchUp::All);
    assert!(rig.client.create_schedule(&good).await.unwrap().1, "created");
    assert!(!rig.client.create_schedule(&good).await.unwrap().1, "the same definition again: nothing created");
    let mut other = good.clone();
    other.spec.catch_up = CatchUp::None;
    let err = rig.client.create_schedule(&other).await.unwrap_err();
    assert_eq!(err.to_string(), "schedule good already exists with a different definition (delete it first)");
    for err in [
        rig.client.pause_schedule(&name("nope"), OPERATOR).await.unwrap_err(),
        rig.client.resume_schedule(&name("nope"), OPERATOR).await.unwrap_err(),
        rig.client.delete_schedule(&name("nope"), OPERATOR).await.unwrap_err(),
        rig.client.schedule(&name("nope")).await.unwrap_err(),
    ] {
        assert_eq!(err.to_string(), "schedule nope not found");
    }
}

#[test]
fn schedule_bounds_are_checked() {
    let zero = schedules::Config { fires_per_round: 0, ..schedules::Config::default() };
    assert!(zero.validate().unwrap_err().to_string().contains("schedules.fires_per_round"));
    let short = schedules::Config { late_max: Duration::from_millis(10), ..schedules::Config::default() };
    assert!(short.validate().unwrap_err().to_string().contains("schedules.late_max"));
    let mut config = supervisor::Config::new(InstanceId::new("s").unwrap());
    config.schedules = short;
    assert!(config.validate().is_err(), "the Supervisor checks its schedules' bounds");
}

on_each_backend!(
    fires_start_one_task_per_fire_time_with_derived_ids,
    two_leaders_never_start_a_fire_twice,
    missed_fires_follow_the_catch_up_policy,
    a_running_task_follows_the_overlap_policy,
    daylight_saving_changes_fire_as_croner_defines,
    paused_schedules_do_not_fire_and_resume_from_now,
    trigger_fires_now_with_its_own_id,
    bad_schedules_are_refused_with_the_field,
);
