//! Finishing started work first, on either backend: when the agents cannot
//! keep up, a Scheduler stops claiming new tasks once
//! `agent_backlog_max` requests wait for them, so the tasks it started
//! move on instead of queueing behind every Pending task's first step.
//!
//! The agent counts the tasks in progress (first step called, last step
//! not yet answered) at each call. With the bound, that count stays
//! within what the bound lets wait plus what the agent holds; without it
//! (`agent_backlog_max: 0`), the same run starts most tasks before
//! finishing any, which is what the bound is for.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rota_agent::{Agent, Request, StepError};
use rota_engine::engine::Config;
use rota_engine::{Engine, Shutdown, Submission};
use rota_model::{InstanceId, SystemClock, TaskId, TaskState};
use rota_store::SharedStore;
use rota_workflow::{AgentCatalog, StepDef, Workflow};
use serde_json::{Value, json};

use common::Backend;

const TASKS: usize = 60;
const AGENT_CONCURRENCY: usize = 2;
const CLAIM_BATCH: u32 = 4;
const BACKLOG_MAX: u32 = 4;

/// An agent that takes a little while per call and counts the tasks in
/// progress: those whose first step it was called for and whose last step
/// it has not answered yet.
#[derive(Default)]
struct Busy {
    progress: Mutex<Progress>,
}

#[derive(Default)]
struct Progress {
    started: BTreeSet<String>,
    finished: BTreeSet<String>,
    most_in_progress: usize,
}

#[async_trait]
impl Agent for Busy {
    fn name(&self) -> &str {
        "busy"
    }

    async fn call(&self, request: &Request) -> Result<Value, StepError> {
        let task = request.task_id.to_string();
        if request.step.as_str() == "first" {
            let mut progress = self.progress.lock().unwrap();
            progress.started.insert(task.clone());
            let in_progress = progress.started.len() - progress.finished.len();
            progress.most_in_progress = progress.most_in_progress.max(in_progress);
        }
        // Long enough that the agent, two calls at a time, falls behind a
        // Scheduler that claims everything it can.
        tokio::time::sleep(Duration::from_millis(20)).await;
        if request.step.as_str() == "last" {
            self.progress.lock().unwrap().finished.insert(task);
        }
        Ok(json!({}))
    }
}

fn chain() -> Workflow {
    let catalog = AgentCatalog::builtin().with(rota_workflow::AgentName::new("busy").unwrap());
    Workflow::builder("chain", 1)
        .step(StepDef::new("first", "busy"))
        .step(StepDef::new("middle", "busy"))
        .step(StepDef::new("last", "busy"))
        .build(&catalog)
        .unwrap()
}

/// Runs `TASKS` chains with the given bound; the most tasks ever in
/// progress at once.
async fn most_in_progress(store: &SharedStore, agent_backlog_max: u32) -> usize {
    let agent = Arc::new(Busy::default());
    let mut config = Config::new(InstanceId::new(format!("saturated-{agent_backlog_max}")).unwrap());
    config.agent_concurrency = AGENT_CONCURRENCY;
    config.scheduler.claim_batch = CLAIM_BATCH;
    config.scheduler.agent_backlog_max = agent_backlog_max;
    let engine = Engine::new(store.clone(), Arc::new(SystemClock), config).agent(agent.clone()).workflow(chain());
    engine.register_workflows().await.unwrap();
    let client = engine.client();
    let mut ids: Vec<TaskId> = Vec::new();
    for n in 0..TASKS {
        let id = TaskId::new(format!("bound-{agent_backlog_max}-{n}")).unwrap();
        ids.push(client.submit(Submission::new(chain().name().clone(), json!({})).with_id(id)).await.unwrap().id);
    }
    // Submitted before the engine runs: every task is claimable at once.
    let shutdown = Shutdown::new();
    let running = tokio::spawn(engine.run(shutdown.clone()));
    for id in &ids {
        let state = client.wait(id, Duration::from_secs(60)).await.unwrap();
        assert_eq!(state, TaskState::Processed, "task {id}");
    }
    shutdown.trigger();
    running.await.unwrap().unwrap();
    let progress = agent.progress.lock().unwrap();
    assert_eq!(progress.finished.len(), TASKS, "every task's last step ran");
    progress.most_in_progress
}

async fn a_saturated_agent_holds_back_claims_until_started_tasks_move_on(backend: Backend) {
    let Some(db) = common::open(backend, Arc::new(SystemClock)).await else { return };
    let bounded = most_in_progress(&db.store, BACKLOG_MAX).await;
    let unbounded = most_in_progress(&db.store, 0).await;
    eprintln!("most in progress: {bounded} with the bound, {unbounded} without");
    // In progress, a task's request waits ready (under the bound when a
    // claim starts, plus that claim's first steps), is leased by the agent
    // (its calls and as many prefetched), or its reply waits to be
    // decided; the last is not bounded by a claim, and grows on a loaded
    // machine, hence twice the rest.
    let allowed = 2 * ((BACKLOG_MAX + CLAIM_BATCH) as usize + 2 * AGENT_CONCURRENCY);
    assert!(bounded <= allowed, "with the bound at most {allowed} tasks in progress at once, saw {bounded}");
    // The same run without the bound shows that the agent did fall behind.
    assert!(unbounded > allowed, "without the bound the run starts most tasks first: {unbounded} in progress at once");
    let left = db.store.backlogs(&[rota_engine::protocol::agent_queue("busy")], 100).await.unwrap();
    assert!(left.iter().all(|b| b.ready == 0 && !b.leased), "nothing left behind: {left:?}");
}

on_each_backend!(a_saturated_agent_holds_back_claims_until_started_tasks_move_on);
