//! The example definitions shipped in `examples/workflows` stay valid, and
//! mean what the README says they mean.

use std::path::PathBuf;
use std::time::Duration;

use rota_model::{ExhaustedPolicy, RetryPolicy, StepName};
use rota_workflow::{AgentCatalog, Target, load_dir, load_file, references};
use serde_json::json;

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/workflows")
}

#[test]
fn the_order_workflow_parses_with_the_issue_s_dependencies() {
    let order = load_file(examples().join("order.yaml"), &AgentCatalog::builtin()).unwrap_or_else(|problems| panic!("{problems}"));
    assert_eq!((order.name().as_str(), order.version()), ("order", 3));
    assert_eq!((order.deadline(), order.on_exhausted(), order.max_failures()), (Duration::from_secs(120), ExhaustedPolicy::Compensate, 3));

    let names: Vec<&str> = order.topological_order().iter().map(|s| s.name().as_str()).collect();
    assert_eq!(names, ["reserve", "charge", "ship", "notify"]);
    let deps: Vec<(&str, Vec<&str>)> =
        order.steps().iter().map(|s| (s.name().as_str(), s.depends_on().iter().map(StepName::as_str).collect())).collect();
    assert_eq!(deps, [("reserve", vec![]), ("charge", vec!["reserve"]), ("ship", vec!["charge"]), ("notify", vec!["ship"])]);

    let reserve = &order.steps()[0];
    assert_eq!(reserve.timeout(), Duration::from_secs(5));
    assert_eq!(reserve.retry(), &RetryPolicy::new(5, Duration::from_millis(100), Duration::from_secs(2)).unwrap());
    assert_eq!(
        reserve.with(),
        &json!({ "method": "POST", "url": "http://127.0.0.1:9100/reserve", "body": { "order": "{{ input.order_id }}" } })
    );
    let release = reserve.compensate().expect("reserve is undone by release");
    assert_eq!(release.with()["url"], "http://127.0.0.1:9100/release");
    assert_eq!((release.timeout(), release.retry()), (reserve.timeout(), reserve.retry()), "inherited from the step");

    let compensated: Vec<&str> = order.steps().iter().filter(|s| s.compensate().is_some()).map(|s| s.name().as_str()).collect();
    assert_eq!(compensated, ["reserve", "charge"]);

    let charge_refs: Vec<Target> = references(order.steps()[1].with()).into_iter().map(|r| r.target.unwrap()).collect();
    assert_eq!(
        charge_refs,
        [
            Target::Input { path: vec!["amount".into()] },
            Target::StepOutput { step: StepName::new("reserve").unwrap(), path: vec!["hold_id".into()] },
        ]
    );
}

#[test]
fn every_example_is_valid() {
    let (workflows, problems) = load_dir(examples(), &AgentCatalog::builtin());
    assert!(problems.is_empty(), "{problems}");
    assert!(!workflows.is_empty());
}
