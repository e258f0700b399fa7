//! Concurrency keys with real processes on PostgreSQL: two `rota serve`
//! processes run 200 tasks over four customers of a workflow with
//! `concurrency: { key: input.customer, limit: 1 }`, each task one `http`
//! call to a service in this test process, which counts the calls of each
//! customer in flight. Mid-run the service holds its calls, the process
//! holding the most of the held calls' tasks is SIGKILLed, and the calls
//! are let go. Afterwards: the service never saw two calls of
//! one customer at once, every task ended Processed, and the killed
//! process's tasks were taken over (expired, then claimed again) without
//! any other task of their customers starting meanwhile.
//!
//! No timing is asserted: the test waits for conditions (calls held, tasks
//! ended) within generous bounds. Needs `ROTA_TEST_POSTGRES_URL`; prints a
//! `SKIP` line without it.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use common::{Serve, open_postgres};
use rota_engine::{Client, Submission, Workflows};
use rota_model::{Clock, InstanceId, SystemClock, TaskId, TaskState, WorkflowName};
use rota_store::{EventKind, SharedStore, TaskFilter};
use rota_testkit::postgres::TestSchema;
use serde_json::{Value, json};

const TASKS: usize = 200;
const CUSTOMERS: usize = 4;
/// Calls answered at once before the service starts holding them.
const CALLS_BEFORE_HOLD: usize = 40;
/// How long the run may take before the test fails (not a timing
/// assertion: a hung run must end).
const RUN_TIMEOUT: Duration = Duration::from_secs(180);

/// What the service saw.
#[derive(Default)]
struct Seen {
    /// Calls in flight per customer, with their task's number.
    in_flight: BTreeMap<String, Vec<u64>>,
    /// Each time a call arrived while another of its customer was in flight.
    overlaps: Vec<String>,
    /// Calls per task number.
    calls: BTreeMap<u64, usize>,
}

struct Service {
    seen: Mutex<Seen>,
    started: AtomicUsize,
    /// The tasks (by number) whose calls wait for `release`.
    held: Mutex<Vec<u64>>,
    release: tokio::sync::watch::Sender<bool>,
}

/// Takes a call out of `in_flight` when its handler ends, also when the
/// connection's end drops the handler.
struct InFlight {
    service: Arc<Service>,
    customer: String,
    n: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut seen = self.service.seen.lock().unwrap();
        let calls = seen.in_flight.get_mut(&self.customer).expect("counted on arrival");
        let at = calls.iter().position(|n| *n == self.n).expect("counted on arrival");
        calls.remove(at);
    }
}

async fn call(service: Arc<Service>, body: Value) -> axum::Json<Value> {
    let customer = body["customer"].as_str().unwrap_or_default().to_owned();
    // A template of a whole value keeps its type; accept its text too.
    let n = body["n"].as_u64().or_else(|| body["n"].as_str()?.parse().ok()).unwrap_or(u64::MAX);
    {
        let mut seen = service.seen.lock().unwrap();
        let calls = seen.in_flight.entry(customer.clone()).or_default();
        if !calls.is_empty() {
            let overlap = format!("{customer}: task {n} called while {calls:?} were in flight");
            seen.overlaps.push(overlap);
        }
        seen.in_flight.get_mut(&customer).unwrap().push(n);
        *seen.calls.entry(n).or_default() += 1;
    }
    let _in_flight = InFlight { service: service.clone(), customer, n };
    if service.started.fetch_add(1, Ordering::SeqCst) >= CALLS_BEFORE_HOLD {
        let mut released = service.release.subscribe();
        if !*released.borrow() {
            service.held.lock().unwrap().push(n);
            let _ = released.wait_for(|go| *go).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    axum::Json(json!({ "ok": true }))
}

fn start_service() -> (String, Arc<Service>) {
    let service = Arc::new(Service {
        seen: Mutex::default(),
        started: AtomicUsize::new(0),
        held: Mutex::default(),
        release: tokio::sync::watch::channel(false).0,
    });
    let shared = service.clone();
    let (ready, address) = mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(async move {
            let app = axum::Router::new()
                .route("/call", axum::routing::post(move |axum::Json(body): axum::Json<Value>| call(shared.clone(), body)));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            ready.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (format!("http://{}/call", address.recv().unwrap()), service)
}

/// Waits until `done` holds, failing with `what` after the run's bound.
fn wait_until(started: Instant, what: &str, mut done: impl FnMut() -> bool) {
    while !done() {
        assert!(started.elapsed() < RUN_TIMEOUT, "{what} within {RUN_TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn tasks_in(store: &SharedStore, state: TaskState) -> Vec<rota_model::Task> {
    let filter = TaskFilter { state: Some(state), limit: (TASKS + 1) as u32, ..TaskFilter::default() };
    store.list_tasks(&filter).await.expect("list tasks")
}

#[test]
fn a_concurrency_key_is_never_exceeded_across_processes_and_a_sigkill() {
    let Some(schema) = TestSchema::new("concurrency keys across processes with a SIGKILL") else { return };
    let store_url = format!("{}?schema={}&connections=4", schema.url, schema.name);
    let (url, service) = start_service();
    let dir = tempfile::tempdir().unwrap();
    let workflows = dir.path().join("workflows");
    std::fs::create_dir(&workflows).unwrap();
    std::fs::write(
        workflows.join("calls.yaml"),
        format!(
            "name: calls\nversion: 1\ndeadline: 6s\nmax_failures: 100\nconcurrency: {{ key: input.customer, limit: 1 }}\nsteps:\n  \
             - name: call\n    agent: http\n    timeout: 5s\n    with: {{ method: POST, url: \"{url}\", body: {{ customer: \"{{{{ input.customer }}}}\", n: \"{{{{ input.n }}}}\" }} }}\n"
        ),
    )
    .unwrap();
    let serve = |id: &str| {
        let args = ["--workflows", workflows.to_str().unwrap(), "--instance-id", id, "--supervisor-interval", "200ms", "--listen", "none"];
        Serve::start(&store_url, &args)
    };
    let mut serves = vec![("a", serve("a")), ("b", serve("b"))];

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let store = open_postgres(&runtime, &schema);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let client = Client::new(store.clone(), clock, Workflows::new(store.clone()), None);
    runtime.block_on(async {
        for n in 0..TASKS {
            let input = json!({ "customer": format!("c{}", n % CUSTOMERS), "n": n });
            let id = TaskId::new(format!("t-{n:03}")).unwrap();
            client.submit(Submission::new(WorkflowName::new("calls").unwrap(), input).with_id(id)).await.expect("submit");
        }
    });
    let started = Instant::now();

    // Mid-run: calls held (a held call's task cannot end), then the process
    // holding the most of their tasks killed at once (the hold stays far
    // shorter than the step's timeout, so no call is tried again meanwhile).
    wait_until(started, "a call held", || !service.held.lock().unwrap().is_empty());
    let held: Vec<String> = service.held.lock().unwrap().iter().map(|n| format!("t-{n:03}")).collect();
    let processing = runtime.block_on(tasks_in(&store, TaskState::Processing));
    let mut held_by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for task in processing.iter().filter(|task| held.contains(&task.id.to_string())) {
        let owner = task.locked_by.as_ref().map(InstanceId::to_string).unwrap_or_default();
        held_by.entry(owner).or_default().push(task.id.to_string());
    }
    let victim = if held_by.get("a").map_or(0, Vec::len) >= held_by.get("b").map_or(0, Vec::len) { "a" } else { "b" };
    let stranded = held_by.get(victim).cloned().unwrap_or_default();
    assert!(!stranded.is_empty(), "the held calls' tasks {held:?} are Processing, held by a or b: {held_by:?}");
    let at = serves.iter().position(|(id, _)| *id == victim).unwrap();
    let (_, mut killed) = serves.remove(at);
    assert_eq!(unsafe { libc::kill(killed.pid(), libc::SIGKILL) }, 0);
    let _ = killed.child.wait();
    service.release.send_replace(true);

    wait_until(started, "every task ended", || {
        let ended = runtime.block_on(tasks_in(&store, TaskState::Processed)).len();
        ended == TASKS
    });
    let elapsed = started.elapsed();

    let seen = service.seen.lock().unwrap();
    assert!(seen.overlaps.is_empty(), "calls of one customer overlapped: {:?}", seen.overlaps);
    let never_called: Vec<usize> = (0..TASKS).filter(|n| !seen.calls.contains_key(&(*n as u64))).collect();
    assert!(never_called.is_empty(), "tasks never called: {never_called:?}");
    let calls: usize = seen.calls.values().sum();
    for id in &stranded {
        let history = runtime.block_on(store.history(&TaskId::new(id.clone()).unwrap())).unwrap();
        let kinds: Vec<EventKind> = history.iter().map(|e| e.kind).collect();
        assert!(kinds.contains(&EventKind::Expired), "{id}, held by the killed process, was never expired: {kinds:?}");
        let owners: Vec<&str> =
            history.iter().filter(|e| e.kind == EventKind::Claimed).filter_map(|e| e.detail["owner"].as_str()).collect();
        assert_eq!(owners.last().copied(), Some(if victim == "a" { "b" } else { "a" }), "{id} was taken over: {owners:?}");
    }
    for (_, serve) in &serves {
        assert!(!serve.log().contains("panicked"), "the surviving process panicked:\n{}", serve.log());
    }
    eprintln!(
        "{TASKS} tasks over {CUSTOMERS} customers (limit 1) in {elapsed:?}: {calls} calls, {} tasks of the killed process {victim} taken over",
        stranded.len()
    );
    drop(seen);
    drop(serves);
    // The store's connections go back to its pool inside the runtime.
    let entered = runtime.enter();
    drop((client, store));
    drop(entered);
    drop(runtime);
}
