//! Component statuses: what running processes report about themselves in
//! the store (`Tasks::report_status`), so that any other process can show
//! it. Every key is made and read here, so that the process that writes a
//! status and the commands that read it cannot disagree on where it is.
//! The [`Reporter`] writes a process's heartbeat and breakers.
//!
//! - `instance/<id>`: a process's heartbeat ([`instance_key`],
//!   [`live_heartbeat_age`], [`instances`], with the Supervisor's leader
//!   lease beside them: [`supervisor_leader`]).
//! - `breaker/<endpoint>`: an `http` agent's circuit breaker, as the
//!   process that runs it saw it last ([`breaker_key`], [`breakers`],
//!   [`breaker_endpoint`]).
//! - `webhooks/cursor`: how far the webhook follower has read the event
//!   log ([`WEBHOOK_CURSOR_KEY`]).
//!
//! Deliberately left out: the shape of the documents' views for clients
//! (the API's wire types).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rota_agent::{AgentRegistry, BreakerSnapshot};
use rota_model::{Clock, InstanceId, Timestamp};
use rota_store::{ComponentStatus, LeaderLease, SharedStore};
use serde_json::{Value, json};
use tracing::warn;

use crate::Shutdown;

/// The key prefix of the processes' heartbeats.
pub const INSTANCE_PREFIX: &str = "instance/";

/// The key prefix of the circuit breakers.
pub const BREAKER_PREFIX: &str = "breaker/";

/// The key of the webhook follower's cursor (`{"seq": N}`).
pub const WEBHOOK_CURSOR_KEY: &str = "webhooks/cursor";

/// The key of `instance`'s heartbeat.
pub fn instance_key(instance: &InstanceId) -> String {
    format!("{INSTANCE_PREFIX}{instance}")
}

/// The key of the circuit breaker that guards `endpoint`.
pub fn breaker_key(endpoint: &str) -> String {
    format!("{BREAKER_PREFIX}{endpoint}")
}

/// The endpoint a breaker's key names (the key itself if it is not a
/// breaker's).
pub fn breaker_endpoint(key: &str) -> &str {
    key.strip_prefix(BREAKER_PREFIX).unwrap_or(key)
}

/// Every reported circuit breaker, sorted by key.
pub async fn breakers(store: &SharedStore) -> rota_store::Result<Vec<ComponentStatus>> {
    store.statuses(BREAKER_PREFIX).await
}

/// How often a [`Reporter`] writes the heartbeat and the changed breakers.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(2);
/// How often an unchanged breaker is reported again (so that its
/// `reported_at` shows it is still current).
const BREAKER_REFRESH_INTERVAL: Duration = Duration::from_secs(30);
/// The most breakers reported per round; the rest wait for the next rounds.
const BREAKERS_REPORTED_MAX: usize = 256;
/// A heartbeat younger than this many report intervals, from a process that
/// did not say it stopped, counts as a live process.
const LIVE_INTERVALS: u32 = 3;
/// How long [`instances`] keeps listing a process after its last heartbeat.
/// Default instance ids change at every start (`<host>-<pid>`), and their
/// heartbeats stay in the store: without this, every restart would add a
/// dead process to the list for good.
pub const INSTANCES_LISTED_FOR: Duration = Duration::from_secs(24 * 3600);

/// What a process says about itself in its heartbeat.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    /// The process's instance id.
    pub instance: InstanceId,
    /// The roles it runs (`scheduler`, `agent`, `supervisor`).
    pub roles: Vec<String>,
    /// The agents it runs.
    pub agents: Vec<String>,
    /// The workflow definitions it registered, as `(name, version)`.
    pub workflows: Vec<(String, u32)>,
    /// When it started.
    pub started_at: Timestamp,
}

impl Heartbeat {
    /// The document written under [`instance_key`].
    fn value(&self, stopped: bool) -> Value {
        json!({
            "instance": self.instance.as_str(),
            "pid": std::process::id(),
            "roles": self.roles,
            "agents": self.agents,
            "workflows": self.workflows.iter().map(|(name, version)| json!({ "name": name, "version": version })).collect::<Vec<_>>(),
            "started_at": self.started_at,
            "stopped": stopped,
        })
    }
}

/// How long ago `instance` last reported a heartbeat, if that heartbeat
/// says it still runs and is recent enough to be believed: two live
/// processes with one instance id would share an inbox and each other's
/// leases. `None` when there is no such heartbeat or it cannot be read.
pub async fn live_heartbeat_age(store: &SharedStore, instance: &InstanceId, now: Timestamp) -> Option<Duration> {
    let key = instance_key(instance);
    let statuses = store.statuses(&key).await.ok()?;
    let last = statuses.into_iter().find(|status| status.key == key)?;
    is_live(&last, now).then(|| now.since(last.reported_at))
}

/// Whether a heartbeat says its process still runs and is recent enough to
/// be believed.
fn is_live(heartbeat: &ComponentStatus, now: Timestamp) -> bool {
    heartbeat.value["stopped"] != Value::Bool(true) && now.since(heartbeat.reported_at) < REPORT_INTERVAL * LIVE_INTERVALS
}

/// A process as its last heartbeat shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    /// Its instance id (the key's, if the document lacks one).
    pub instance: String,
    /// The roles it runs.
    pub roles: Vec<String>,
    /// The agents it runs.
    pub agents: Vec<String>,
    /// The workflow definitions it registered, as `(name, version)`.
    pub workflows: Vec<(String, u64)>,
    /// Its process id, on its own machine.
    pub pid: Option<u64>,
    /// When it started.
    pub started_at: Option<Timestamp>,
    /// Whether its last heartbeat said it stopped (cleanly).
    pub stopped: bool,
    /// When it last reported.
    pub last_heartbeat: Timestamp,
    /// Whether it runs, as [`live_heartbeat_age`] decides: not stopped and
    /// heard from within three report intervals.
    pub live: bool,
}

impl Instance {
    fn of(status: &ComponentStatus, now: Timestamp) -> Instance {
        let value = &status.value;
        let texts = |field: &str| -> Vec<String> {
            value[field]
                .as_array()
                .map(|items| items.iter().filter_map(|item| item.as_str().map(str::to_owned)).collect())
                .unwrap_or_default()
        };
        let workflows = value["workflows"]
            .as_array()
            .map(|items| items.iter().filter_map(|item| Some((item["name"].as_str()?.to_owned(), item["version"].as_u64()?))).collect())
            .unwrap_or_default();
        Instance {
            instance: value["instance"].as_str().unwrap_or_else(|| status.key.trim_start_matches(INSTANCE_PREFIX)).to_owned(),
            roles: texts("roles"),
            agents: texts("agents"),
            workflows,
            pid: value["pid"].as_u64(),
            started_at: value["started_at"].as_i64().map(Timestamp::from_millis),
            stopped: value["stopped"] == Value::Bool(true),
            last_heartbeat: status.reported_at,
            live: is_live(status, now),
        }
    }
}

/// Every process that reported a heartbeat to this store within
/// [`INSTANCES_LISTED_FOR`], live or not, sorted by instance id.
pub async fn instances(store: &SharedStore, now: Timestamp) -> rota_store::Result<Vec<Instance>> {
    let statuses = store.statuses(INSTANCE_PREFIX).await?;
    Ok(statuses
        .iter()
        .filter(|status| now.since(status.reported_at) <= INSTANCES_LISTED_FOR)
        .map(|status| Instance::of(status, now))
        .collect())
}

/// The Supervisors' leader lease while someone holds it.
pub async fn supervisor_leader(store: &SharedStore) -> rota_store::Result<Option<LeaderLease>> {
    store.leader(crate::supervisor::LEADER_LEASE).await
}

/// Writes this process's heartbeat and its agents' circuit breakers to the
/// store every [`REPORT_INTERVAL`], and a last heartbeat marked `stopped`
/// at shutdown.
///
/// Breakers live in each process: with several processes the last report
/// of an endpoint wins, and its value names the instance that made it.
pub struct Reporter {
    store: SharedStore,
    clock: Arc<dyn Clock>,
    agents: AgentRegistry,
    heartbeat: Heartbeat,
}

impl Reporter {
    /// A reporter of `heartbeat` and of the breakers of `agents`.
    pub fn new(store: SharedStore, clock: Arc<dyn Clock>, agents: AgentRegistry, heartbeat: Heartbeat) -> Self {
        Reporter { store, clock, agents, heartbeat }
    }

    /// Reports until `shutdown`, then once more with the heartbeat marked
    /// stopped. Failures to write are logged and tried again next round.
    pub async fn run(self, shutdown: Shutdown) {
        let mut reported: HashMap<String, (BreakerSnapshot, Timestamp)> = HashMap::new();
        let mut ticks = tokio::time::interval(REPORT_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = shutdown.triggered() => break,
            }
            self.report_once(&mut reported, false).await;
        }
        self.report_once(&mut reported, true).await;
    }

    /// Reports the heartbeat and every breaker that changed since this
    /// process last reported it, or was last reported long ago.
    async fn report_once(&self, reported: &mut HashMap<String, (BreakerSnapshot, Timestamp)>, stopped: bool) {
        let now = self.clock.now();
        let instance = &self.heartbeat.instance;
        if let Err(err) = self.store.report_status(&instance_key(instance), &self.heartbeat.value(stopped)).await {
            warn!("cannot report the heartbeat of instance {instance}: {err}");
        }
        let due: Vec<(String, BreakerSnapshot)> = self
            .agents
            .breakers()
            .into_iter()
            .filter(|(_, snapshot)| match reported.get(&snapshot.endpoint) {
                Some((last, at)) => last != snapshot || now.since(*at) >= BREAKER_REFRESH_INTERVAL,
                None => true,
            })
            .take(BREAKERS_REPORTED_MAX)
            .collect();
        for (agent, snapshot) in due {
            let value = json!({
                "agent": agent,
                "endpoint": snapshot.endpoint,
                "state": snapshot.state.as_str(),
                "consecutive_failures": snapshot.consecutive_failures,
                "open_until": snapshot.open_until,
                "instance": instance.as_str(),
            });
            match self.store.report_status(&breaker_key(&snapshot.endpoint), &value).await {
                Ok(()) => {
                    reported.insert(snapshot.endpoint.clone(), (snapshot, now));
                }
                Err(err) => warn!("cannot report the circuit breaker of {}: {err}", snapshot.endpoint),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_keys_give_back_their_endpoint() {
        let key = breaker_key("http://127.0.0.1:9100");
        assert_eq!(key, "breaker/http://127.0.0.1:9100");
        assert_eq!(breaker_endpoint(&key), "http://127.0.0.1:9100");
        assert_eq!(instance_key(&InstanceId::new("serve-1").unwrap()), "instance/serve-1");
    }
}
