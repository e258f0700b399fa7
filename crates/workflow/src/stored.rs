//! The canonical JSON form of a [`Workflow`], the one the engine stores per
//! version so that a running task keeps the definition it started with.
//!
//! Reading it back runs the stored form through the same validation as a
//! file (but not against the agent catalog), so a hand-edited or corrupted
//! row cannot produce a cyclic graph.

use std::time::Duration;

use rota_model::{ExhaustedPolicy, Priority, RateLimit, RetryPolicy, SignalName, StepName, WorkflowName};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::agent::AgentName;
use crate::definition::{StepAction, Workflow};
use crate::diagnostic::{Diagnostics, TextlessLocator};
use crate::spec::{CompensateSpec, ConcurrencySpec, Spec, StepSpec};

impl Workflow {
    /// The canonical JSON form: the resolved definition with durations in
    /// whole milliseconds and object keys sorted. [`Workflow::from_json`]
    /// reads it back into an equal workflow.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a workflow always serializes: its maps have string keys")
    }

    /// Reads the canonical JSON form back, validating it again (but not the
    /// agent names: the set of registered agents may have changed since the
    /// version was stored, and a running task must still load).
    pub fn from_json(json: &str) -> Result<Workflow, serde_json::Error> {
        serde_json::from_str(json)
    }
}

impl Serialize for Workflow {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        WorkflowRepr::from(self.clone()).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Workflow {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let repr = WorkflowRepr::deserialize(deserializer)?;
        Workflow::try_from(repr).map_err(serde::de::Error::custom)
    }
}

/// The stored shape of a [`Workflow`]. Durations are whole milliseconds, the
/// unit of every stored time in rota; validation guarantees nothing finer
/// is lost.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkflowRepr {
    name: WorkflowName,
    version: u32,
    deadline_ms: u64,
    /// Left out when not given, so that the canonical form of a definition
    /// registered before warnings existed is unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    warn_after_ms: Option<u64>,
    /// Left out when not given, like `warn_after_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retention_ms: Option<u64>,
    on_exhausted: ExhaustedPolicy,
    max_failures: u32,
    /// Left out when it is the default, like `warn_after_ms`.
    #[serde(default, skip_serializing_if = "Priority::is_normal")]
    priority: Priority,
    /// Left out when not given, like `warn_after_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    concurrency: Option<ConcurrencyRepr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_in_flight: Option<u32>,
    steps: Vec<StepRepr>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConcurrencyRepr {
    /// The key expression as written.
    key: String,
    limit: u32,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepRepr {
    name: StepName,
    /// Exactly one of `agent` and `wait`. A step that calls an agent is
    /// written as it was before waiting steps existed (no `wait` key), so
    /// registering an unchanged definition again still matches the stored
    /// version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent: Option<AgentName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wait: Option<SignalName>,
    /// A `workflow:` step's child workflow and pinned version, left out
    /// for the other steps like `wait`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workflow: Option<WorkflowName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    workflow_version: Option<u32>,
    /// Written only when true, for the same reason.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    callback: bool,
    with: Value,
    timeout_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    warn_after_ms: Option<u64>,
    /// The condition as written; left out when there is none, so that the
    /// canonical form of a definition registered before conditions existed
    /// is unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    when: Option<String>,
    /// The `for_each` expression as written, and its `max_parallel`; left
    /// out for a step without, like `when`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    for_each: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_parallel: Option<u32>,
    /// Written for a waiting step too (the default), and ignored when read.
    retry: RetryPolicy,
    /// Left out when there is none, so that the canonical form of a
    /// definition registered before rate limits existed is unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rate_limit: Option<RateLimit>,
    compensate: Option<CompensateRepr>,
    depends_on: Vec<StepName>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompensateRepr {
    agent: AgentName,
    with: Value,
    timeout_ms: u64,
    retry: RetryPolicy,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl From<Workflow> for WorkflowRepr {
    fn from(w: Workflow) -> Self {
        WorkflowRepr {
            name: w.name,
            version: w.version,
            deadline_ms: millis(w.deadline),
            warn_after_ms: w.warn_after.map(millis),
            retention_ms: w.retention.map(millis),
            on_exhausted: w.on_exhausted,
            max_failures: w.max_failures,
            priority: w.priority,
            concurrency: w.concurrency.map(|c| ConcurrencyRepr { key: c.key.source().to_owned(), limit: c.limit }),
            max_in_flight: w.max_in_flight,
            steps: w
                .steps
                .into_iter()
                .map(|s| StepRepr {
                    agent: match &s.action {
                        StepAction::Call(agent) => Some(agent.clone()),
                        StepAction::Wait(_) | StepAction::Child(_) => None,
                    },
                    wait: match &s.action {
                        StepAction::Wait(signal) => Some(signal.clone()),
                        StepAction::Call(_) | StepAction::Child(_) => None,
                    },
                    workflow: match &s.action {
                        StepAction::Child(child) => Some(child.name.clone()),
                        StepAction::Call(_) | StepAction::Wait(_) => None,
                    },
                    workflow_version: match &s.action {
                        StepAction::Child(child) => child.version,
                        StepAction::Call(_) | StepAction::Wait(_) => None,
                    },
                    name: s.name,
                    callback: s.callback,
                    with: s.with,
                    timeout_ms: millis(s.timeout),
                    warn_after_ms: s.warn_after.map(millis),
                    when: s.when.map(|c| c.source().to_owned()),
                    max_parallel: s.for_each.as_ref().map(|f| f.max_parallel),
                    for_each: s.for_each.map(|f| f.items.source().to_owned()),
                    retry: s.retry,
                    rate_limit: s.rate_limit,
                    compensate: s.compensate.map(|c| CompensateRepr {
                        agent: c.agent,
                        with: c.with,
                        timeout_ms: millis(c.timeout),
                        retry: c.retry,
                    }),
                    depends_on: s.depends_on,
                })
                .collect(),
        }
    }
}

impl TryFrom<WorkflowRepr> for Workflow {
    type Error = Diagnostics;

    /// Runs the stored form through the same validation as a file, so a
    /// hand-edited or corrupted row cannot produce a cyclic graph.
    fn try_from(r: WorkflowRepr) -> Result<Self, Diagnostics> {
        let spec = Spec {
            name: Some(r.name.into()),
            version: Some(r.version),
            deadline: Some(Duration::from_millis(r.deadline_ms)),
            warn_after: r.warn_after_ms.map(Duration::from_millis),
            retention: r.retention_ms.map(Duration::from_millis),
            on_exhausted: Some(r.on_exhausted),
            max_failures: Some(r.max_failures),
            priority: Some(i64::from(r.priority.get())),
            concurrency: r.concurrency.map(|c| ConcurrencySpec { key: Some(c.key), limit: Some(c.limit) }),
            max_in_flight: r.max_in_flight,
            schedules: None,
            steps: Some(
                r.steps
                    .into_iter()
                    .map(|s| StepSpec {
                        name: Some(s.name.into()),
                        retry: if s.wait.is_some() || s.workflow.is_some() { None } else { Some(s.retry) },
                        agent: s.agent.map(Into::into),
                        wait: s.wait.map(Into::into),
                        workflow: s.workflow.map(Into::into),
                        workflow_version: s.workflow_version,
                        callback: s.callback.then_some(true),
                        with: s.with,
                        timeout: Some(Duration::from_millis(s.timeout_ms)),
                        warn_after: s.warn_after_ms.map(Duration::from_millis),
                        when: s.when,
                        for_each: s.for_each,
                        max_parallel: s.max_parallel,
                        rate_limit: s.rate_limit,
                        compensate: s.compensate.map(|c| CompensateSpec {
                            agent: Some(c.agent.into()),
                            with: c.with,
                            timeout: Some(Duration::from_millis(c.timeout_ms)),
                            retry: Some(c.retry),
                        }),
                        depends_on: Some(s.depends_on.into_iter().map(String::from).collect()),
                        unreadable: false,
                    })
                    .collect(),
            ),
        };
        crate::validate::validate(spec, &TextlessLocator { file: "<stored>" }, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::AgentCatalog;
    use serde_json::json;

    fn order() -> Workflow {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/workflows/order.yaml")).unwrap();
        crate::parse("order.yaml", &text, &AgentCatalog::builtin()).unwrap()
    }

    #[test]
    fn canonical_json_round_trips_exactly() {
        let workflow = order();
        let json = workflow.to_json();
        let back = Workflow::from_json(&json).unwrap();
        assert_eq!(back, workflow);
        assert_eq!(back.to_json(), json, "the form is canonical: a second trip gives the same text");
    }

    #[test]
    fn canonical_json_has_the_documented_shape() {
        let workflow = Workflow::builder("w", 2)
            .step(crate::StepDef::new("a", "http").with_input(json!({ "b": 1, "a": "{{ input.x }}" })))
            .build(&AgentCatalog::builtin())
            .unwrap();
        assert_eq!(
            workflow.to_json(),
            r#"{"name":"w","version":2,"deadline_ms":300000,"on_exhausted":"error","max_failures":3,"steps":[{"name":"a","agent":"http","with":{"a":"{{ input.x }}","b":1},"timeout_ms":30000,"retry":{"attempts_max":5,"backoff_initial_ms":100,"backoff_max_ms":10000,"multiplier":2.0,"jitter":0.5},"compensate":null,"depends_on":[]}]}"#
        );
    }

    #[test]
    fn warnings_are_stored_only_when_given() {
        let workflow = Workflow::builder("w", 2)
            .warn_after(Duration::from_secs(200))
            .step(crate::StepDef::new("a", "http").warn_after(Duration::from_secs(20)))
            .build(&AgentCatalog::builtin())
            .unwrap();
        let json = workflow.to_json();
        assert!(json.contains(r#""deadline_ms":300000,"warn_after_ms":200000,"#), "{json}");
        assert!(json.contains(r#""timeout_ms":30000,"warn_after_ms":20000,"#), "{json}");
        let back = Workflow::from_json(&json).unwrap();
        assert_eq!(back, workflow);
        assert_eq!(back.to_json(), json);
        let bad = json.replace(r#""warn_after_ms":20000"#, r#""warn_after_ms":30000"#);
        let err = Workflow::from_json(&bad).unwrap_err().to_string();
        assert!(err.contains("step `a`: `warn_after` (30s) must be shorter than `timeout` (30s)"), "{err}");
    }

    #[test]
    fn conditions_are_stored_only_when_given() {
        let workflow = Workflow::builder("w", 2)
            .step(crate::StepDef::new("a", "http"))
            .step(crate::StepDef::new("b", "http").when("input.x > 1"))
            .build(&AgentCatalog::builtin())
            .unwrap();
        let json = workflow.to_json();
        assert_eq!(json.matches(r#""when":"input.x > 1""#).count(), 1, "{json}");
        let back = Workflow::from_json(&json).unwrap();
        assert_eq!(back, workflow);
        assert_eq!(back.to_json(), json);
        let bad = json.replace(r#""when":"input.x > 1""#, r#""when":"inputs.x > 1""#);
        let err = Workflow::from_json(&bad).unwrap_err().to_string();
        assert!(err.contains("<stored>:2:0: step `b`: `when`: unknown name `inputs`"), "{err}");
    }

    #[test]
    fn for_each_is_stored_only_when_given() {
        let workflow = Workflow::builder("w", 2)
            .step(crate::StepDef::new("a", "http"))
            .step(crate::StepDef::new("b", "http").for_each("input.xs").max_parallel(4).with_input(serde_json::json!("{{ item }}")))
            .build(&AgentCatalog::builtin())
            .unwrap();
        let json = workflow.to_json();
        assert_eq!(json.matches(r#""for_each":"input.xs","max_parallel":4"#).count(), 1, "{json}");
        assert_eq!(json.matches("for_each").count(), 1, "a step without it writes nothing: {json}");
        let back = Workflow::from_json(&json).unwrap();
        assert_eq!(back, workflow);
        assert_eq!(back.to_json(), json);
    }

    #[test]
    fn stored_json_is_validated_again_but_not_against_the_agent_catalog() {
        let json = order().to_json();
        // An agent unknown today still loads: a running task must finish.
        let renamed = json.replace(r#""agent":"http""#, r#""agent":"retired""#);
        assert!(Workflow::from_json(&renamed).is_ok());
        // A cycle does not: every workflow in memory is a DAG.
        let cyclic = json.replacen(r#""depends_on":[]"#, r#""depends_on":["notify"]"#, 1);
        let err = Workflow::from_json(&cyclic).unwrap_err().to_string();
        assert!(err.starts_with("<stored>:1:0: dependency cycle: `reserve` depends on `notify`"), "{err}");
        let unknown = json.replacen(r#""version":3"#, r#""version":3,"extra":1"#, 1);
        assert!(Workflow::from_json(&unknown).unwrap_err().to_string().contains("unknown field `extra`"));
    }
}
