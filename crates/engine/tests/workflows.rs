//! Which version a submission without one runs: the latest registered, as
//! the process's `Workflows` knows it. A registration through it is the
//! latest at once; one made by another process is seen once the latest read
//! from the registry is older than the refresh. On both backends, under a
//! manual clock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rota_engine::Workflows;
use rota_engine::workflows::LATEST_REFRESH_DEFAULT;
use rota_model::{ManualClock, WorkflowName};
use rota_workflow::{AgentCatalog, StepDef, Workflow};

use common::Backend;

fn order(version: u32, steps: &[&str]) -> Workflow {
    let mut builder = Workflow::builder("order", version);
    for step in steps {
        builder = builder.step(StepDef::new(*step, "delay"));
    }
    builder.build(&AgentCatalog::builtin()).unwrap()
}

async fn the_latest_version_is_read_again_once_its_refresh_has_passed(backend: Backend) {
    let clock = Arc::new(ManualClock::default());
    let Some(db) = common::open(backend, clock.clone()).await else { return };
    let name = WorkflowName::new("order").unwrap();
    let here = Workflows::new(db.store.clone()).clock(clock.clone());
    let elsewhere = Workflows::new(db.store.clone()).clock(clock.clone());
    let eager = Workflows::new(db.store.clone()).clock(clock.clone()).latest_refresh(Duration::ZERO);

    here.register(&order(1, &["charge"])).await.unwrap();
    assert_eq!(here.get(&name, None).await.unwrap().version(), 1);
    assert_eq!(elsewhere.get(&name, None).await.unwrap().version(), 1, "read from the registry");

    here.register(&order(2, &["charge", "ship"])).await.unwrap();
    assert_eq!(here.get(&name, None).await.unwrap().version(), 2, "registered here: the latest at once");
    assert_eq!(here.clone().get(&name, None).await.unwrap().version(), 2, "clones share what they know");
    assert_eq!(eager.get(&name, None).await.unwrap().version(), 2, "no refresh: read at every lookup");
    clock.advance(LATEST_REFRESH_DEFAULT - Duration::from_millis(1));
    assert_eq!(elsewhere.get(&name, None).await.unwrap().version(), 1, "another process's registration, within the refresh");
    clock.advance(Duration::from_millis(1));
    let latest = elsewhere.get(&name, None).await.unwrap();
    assert_eq!((latest.version(), latest.steps().len()), (2, 2), "read again once the refresh has passed");

    // An older version registered later does not become the latest.
    let late = Workflows::new(db.store.clone()).clock(clock.clone());
    assert_eq!(late.get(&name, None).await.unwrap().version(), 2);
    late.register(&order(1, &["charge"])).await.unwrap();
    assert_eq!(late.get(&name, None).await.unwrap().version(), 2, "re-registering version 1 keeps version 2 the latest");
    assert_eq!(late.get(&name, Some(1)).await.unwrap().version(), 1, "a named version is still found");
}

on_each_backend!(the_latest_version_is_read_again_once_its_refresh_has_passed);
