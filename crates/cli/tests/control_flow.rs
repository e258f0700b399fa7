//! Conditions, `for_each` and child workflows end to end, with real
//! processes: the example workflow `onboarding`
//! (examples/workflows/onboarding.yaml, its URLs pointed at a service in
//! this test process) branches on its first step's output (`when:`), calls
//! the service once per element of a 50-item list with `max_parallel: 5`
//! (`for_each:`), and runs the child workflow `welcome` (`workflow:`),
//! whose output its last step sends on. Three tasks, two gold customers
//! and a basic one, run on one `rota serve`, which is SIGKILLed in the
//! middle of the fan-out while the service holds the item calls then in
//! flight; a second `rota serve` takes the tasks over once their leases
//! (the example's 30 s deadline) expire, and sends the held calls again.
//!
//! The service is the witness. It counts each task's item calls in flight
//! (never more than 5, and 5 reached: the fan-out was real), applies each
//! item's effect on the first delivery of its idempotency key and counts
//! deliveries apart from effects (every held call is delivered again, and
//! each item's effect happens once), and records which branch was called
//! for which task.
//!
//! No timing is asserted: the test waits for conditions within generous
//! bounds. Runs on SQLite, and on PostgreSQL when `ROTA_TEST_POSTGRES_URL`
//! is set (a `SKIP` line otherwise).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use common::{Rota, Serve};
use rota_testkit::postgres::TestSchema;
use serde_json::{Value, json};

/// The example's bound on item calls in flight per task.
const MAX_PARALLEL: usize = 5;
const ITEMS: usize = 50;
/// Task ids and their customers; the service says `basic` for bob and
/// `gold` for everyone else.
const TASKS: [(&str, &str); 3] = [("onboard-ann", "ann"), ("onboard-bob", "bob"), ("onboard-cy", "cy")];
/// Item calls answered before the service holds the rest until the kill.
const ITEM_CALLS_BEFORE_HOLD: usize = 40;
/// How many calls are held before the first process is killed.
const HELD_AT_KILL: usize = 5;
/// How long an item call waits for others of its task to arrive, so that
/// parallelism beyond the bound would show (not a timing assertion: a
/// call alone just waits this long), and how long it stays once they have.
const COMPANY_WAIT: Duration = Duration::from_secs(1);
const LINGER: Duration = Duration::from_millis(20);
/// Calls an agent runs at once: far more than the tasks' bound, so that
/// only `max_parallel` keeps a task's calls at 5.
const AGENT_CONCURRENCY: &str = "64";
/// How long the run may take before the test fails (not a timing
/// assertion: a hung run must end).
const RUN_TIMEOUT: Duration = Duration::from_secs(240);

fn tier_of(customer: &str) -> &'static str {
    if customer == "bob" { "basic" } else { "gold" }
}

fn items_of(customer: &str) -> Vec<String> {
    (0..ITEMS).map(|i| format!("{customer}-item-{i:02}")).collect()
}

/// An item's effect, applied at the first delivery of its idempotency key.
#[derive(Debug, Clone, PartialEq)]
struct Effect {
    task: String,
    item: Value,
    index: Value,
}

/// What the service saw.
#[derive(Default)]
struct Seen {
    /// Calls of the other endpoints by (endpoint, task), with the last body.
    calls: BTreeMap<(String, String), (usize, Value)>,
    /// Item calls in flight per task, and the most ever seen at once.
    in_flight: BTreeMap<String, usize>,
    max_in_flight: BTreeMap<String, usize>,
    /// Item calls delivered, per idempotency key.
    deliveries: BTreeMap<String, usize>,
    effects: BTreeMap<String, Effect>,
    /// A delivery whose body differs from the first one of its key.
    mismatches: Vec<String>,
    item_calls: usize,
    /// The keys of the calls held until the kill.
    held: Vec<String>,
}

struct Service {
    seen: Mutex<Seen>,
    release: tokio::sync::watch::Sender<bool>,
}

/// Takes an item call out of `in_flight` when its handler ends, also when
/// the connection's end drops the handler.
struct InFlight {
    service: Arc<Service>,
    task: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.service.seen.lock().unwrap().in_flight.get_mut(&self.task).expect("counted on arrival") -= 1;
    }
}

async fn answer(service: Arc<Service>, endpoint: String, headers: HeaderMap, body: Value) -> axum::Json<Value> {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok()).unwrap_or_default().to_owned();
    let task = header("rota-task-id");
    if endpoint == "import" {
        return import(service, task, header("idempotency-key"), body).await;
    }
    let customer = body["customer"].as_str().unwrap_or_default().to_owned();
    {
        let mut seen = service.seen.lock().unwrap();
        let call = seen.calls.entry((endpoint.clone(), task)).or_insert((0, Value::Null));
        call.0 += 1;
        call.1 = body.clone();
    }
    axum::Json(match endpoint.as_str() {
        "lookup" => json!({ "tier": tier_of(&customer) }),
        "perks" => json!({ "perks": ["lounge"] }),
        "offer" => json!({ "offer": "10% off" }),
        "welcome" => {
            let items = body["items"].as_array().map_or(0, Vec::len);
            json!({ "letter": format!("Welcome, {customer} ({}): {items} items imported", body["tier"].as_str().unwrap_or("?")) })
        }
        _ => json!({ "ok": true }),
    })
}

async fn import(service: Arc<Service>, task: String, key: String, body: Value) -> axum::Json<Value> {
    let effect = Effect { task: task.clone(), item: body["item"].clone(), index: body["index"].clone() };
    let held = {
        let mut seen = service.seen.lock().unwrap();
        seen.item_calls += 1;
        let in_flight = seen.in_flight.entry(task.clone()).or_default();
        *in_flight += 1;
        let now = *in_flight;
        let max = seen.max_in_flight.entry(task.clone()).or_default();
        *max = (*max).max(now);
        *seen.deliveries.entry(key.clone()).or_default() += 1;
        let first = seen.effects.entry(key.clone()).or_insert_with(|| effect.clone()).clone();
        if first != effect {
            seen.mismatches.push(format!("{key}: first {first:?}, then {effect:?}"));
        }
        let hold = seen.item_calls > ITEM_CALLS_BEFORE_HOLD && !*service.release.borrow();
        if hold {
            seen.held.push(key);
        }
        hold
    };
    let _in_flight = InFlight { service: service.clone(), task: task.clone() };
    if held {
        let _ = service.release.subscribe().wait_for(|go| *go).await;
    } else {
        // Every task's fan-out starts before any item is answered, so that
        // all three are mid-fan-out, held by the first process, when the
        // calls are held and it is killed (a fast engine could otherwise
        // spend the answered calls on the tasks submitted first).
        while service.seen.lock().unwrap().in_flight.len() < TASKS.len() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Wait for others of the task, so that more than the bound in
        // flight would be seen rather than slip by between short calls.
        let arrived = Instant::now();
        while service.seen.lock().unwrap().in_flight[&task] < MAX_PARALLEL && arrived.elapsed() < COMPANY_WAIT {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(LINGER).await;
    }
    axum::Json(json!({ "imported": body["item"], "index": body["index"] }))
}

/// Starts the service on a free port; its base URL.
fn start_service() -> (String, Arc<Service>) {
    let service = Arc::new(Service { seen: Mutex::default(), release: tokio::sync::watch::channel(false).0 });
    let shared = service.clone();
    let (ready, address) = mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(async move {
            let route = move |axum::extract::Path(endpoint): axum::extract::Path<String>,
                              headers: HeaderMap,
                              axum::Json(body): axum::Json<Value>| answer(shared.clone(), endpoint, headers, body);
            let app = axum::Router::new().route("/{endpoint}", axum::routing::post(route));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            ready.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (format!("http://{}", address.recv().unwrap()), service)
}

/// The example workflows, written to `dir` with their URLs pointed at
/// `base`; their paths.
fn write_workflows(dir: &Path, base: &str) -> Vec<PathBuf> {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workflows");
    ["onboarding.yaml", "welcome.yaml"]
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(examples.join(file)).unwrap();
            assert!(text.contains("http://127.0.0.1:9100/"), "{file} calls the example service");
            let path = dir.join(file);
            std::fs::write(&path, text.replace("http://127.0.0.1:9100", base)).unwrap();
            path
        })
        .collect()
}

/// Waits until `done` holds, failing with `what` after the run's bound.
fn wait_until(started: Instant, what: &str, mut done: impl FnMut() -> bool) {
    while !done() {
        assert!(started.elapsed() < RUN_TIMEOUT, "{what} within {RUN_TIMEOUT:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn step<'s>(status: &'s Value, name: &str) -> &'s Value {
    let steps = status["steps"].as_array().expect("steps");
    steps.iter().find(|step| step["name"] == name).unwrap_or_else(|| panic!("no step {name} in {status}"))
}

fn history_has(status: &Value, kind: &str, step_name: Option<&str>) -> bool {
    status["history"].as_array().expect("history").iter().any(|event| event["kind"] == kind && event["step"].as_str() == step_name)
}

/// The whole scenario against the store at `store_url`.
fn branch_fan_out_and_child_survive_a_sigkill(store_url: &str) {
    let (base, service) = start_service();
    let rota = Rota::with_store(store_url);
    let workflows = rota.dir().join("workflows");
    std::fs::create_dir(&workflows).unwrap();
    let files = write_workflows(&workflows, &base);
    let files: Vec<&str> = files.iter().map(|path| path.to_str().unwrap()).collect();
    let validated = rota.ok(&[&["validate"], &files[..]].concat());
    assert_eq!(validated.matches(": ok (workflow").count(), 2, "rota validate accepts both: {validated}");

    let serve = |id: &str| {
        let args = [
            "--workflows",
            workflows.to_str().unwrap(),
            "--instance-id",
            id,
            "--supervisor-interval",
            "200ms",
            "--listen",
            "none",
            "--agent-concurrency",
            AGENT_CONCURRENCY,
        ];
        Serve::start(store_url, &args)
    };
    let mut first = serve("a");
    for (id, customer) in TASKS {
        let input = json!({ "customer": customer, "items": items_of(customer) }).to_string();
        rota.ok(&["submit", "onboarding", "--id", id, "--input", &input]);
    }
    let started = Instant::now();

    // Mid-fan-out: item calls held (their effects applied, their answers
    // never sent), the process killed, the calls let go.
    wait_until(started, "item calls held", || service.seen.lock().unwrap().held.len() >= HELD_AT_KILL);
    assert_eq!(unsafe { libc::kill(first.pid(), libc::SIGKILL) }, 0);
    let _ = first.child.wait();
    let first_log = first.log();
    drop(first);
    service.release.send_replace(true);
    wait_until(started, "the held calls ended", || service.seen.lock().unwrap().in_flight.values().all(|n| *n == 0));
    let held = service.seen.lock().unwrap().held.clone();

    let second = serve("b");
    let status = |id: &str| rota.json(&["status", id, "--json"]);
    let ended = |state: &Value| ["processed", "error", "compensated", "cancelled"].iter().any(|end| state == end);
    wait_until(started, "every task ended", || TASKS.iter().all(|(id, _)| ended(&status(id)["state"])));
    let elapsed = started.elapsed();

    let seen = service.seen.lock().unwrap();
    let calls_of = |endpoint: &str, task: &str| seen.calls.get(&(endpoint.to_owned(), task.to_owned())).map_or(0, |(n, _)| *n);
    let mut redelivered = 0;
    for (id, customer) in TASKS {
        let parent = status(id);
        assert_eq!(parent["state"], "processed", "{id}:\n{parent:#}\nfirst process:\n{first_log}\nsecond:\n{}", second.log());

        // Taken over: the killed process's lease expired, the second one claimed it.
        let history = parent["history"].as_array().expect("history");
        let owners: Vec<&str> =
            history.iter().filter(|event| event["kind"] == "claimed").filter_map(|event| event["detail"]["owner"].as_str()).collect();
        assert!(history_has(&parent, "expired", None), "{id}: its lease, held by the killed process, expired");
        assert_eq!((owners.first(), owners.last()), (Some(&"a"), Some(&"b")), "{id}: claimed by a, then taken over by b");

        // The branch: one step ran, the other was skipped and never called.
        let (ran, skipped) = if tier_of(customer) == "gold" { ("perks", "offer") } else { ("offer", "perks") };
        assert_eq!(step(&parent, "lookup")["output"], json!({ "tier": tier_of(customer) }));
        assert_eq!(step(&parent, ran)["state"], "completed", "{id}: {ran} ran");
        assert_eq!(step(&parent, skipped)["state"], "skipped", "{id}: {skipped} was skipped");
        assert!(history_has(&parent, "step_skipped", Some(skipped)), "{id}: a step_skipped event for {skipped}");
        assert_eq!(calls_of(ran, id), 1, "{id}: {ran} called once");
        assert_eq!(calls_of(skipped, id), 0, "{id}: {skipped} never called");

        // The fan-out: at most 5 at once, and 5 reached.
        assert_eq!(
            seen.max_in_flight.get(id),
            Some(&MAX_PARALLEL),
            "{id}: item calls in flight at most, and at some point, {MAX_PARALLEL}"
        );
        // Each item's effect once, under its own key, with its own item.
        let items = items_of(customer);
        let effects: BTreeMap<&String, &Effect> = seen.effects.iter().filter(|(_, effect)| effect.task == id).collect();
        let expected: BTreeMap<String, Effect> = (0..ITEMS)
            .map(|i| (format!("{id}/import[{i}]"), Effect { task: id.to_owned(), item: json!(items[i]), index: json!(i) }))
            .collect();
        assert_eq!(effects.len(), ITEMS, "{id}: one effect per item");
        for (key, effect) in &expected {
            assert_eq!(effects.get(key).copied(), Some(effect), "{id}: the effect under {key}");
        }
        let output: Vec<Value> = (0..ITEMS).map(|i| json!({ "imported": items[i], "index": i })).collect();
        assert_eq!(step(&parent, "import")["output"], json!(output), "{id}: the items' outputs, in item order");
        for i in 0..ITEMS {
            assert_eq!(step(&parent, &format!("import[{i}]"))["state"], "completed", "{id}: import[{i}]");
        }
        redelivered += expected.keys().filter(|key| seen.deliveries[*key] > 1).count();

        // The child: linked to its parent, ended Processed, its output the
        // parent step's, the letter sent on by the last step.
        let children = parent["children"].as_array().expect("children");
        assert_eq!(children.len(), 1, "{id}: one child: {children:?}");
        assert_eq!((&children[0]["workflow"], &children[0]["step"]), (&json!("welcome"), &json!("welcome")));
        let child = status(children[0]["id"].as_str().unwrap());
        assert_eq!(child["state"], "processed", "{id}'s child: {child:#}");
        assert_eq!((&child["parent"]["task"], &child["parent"]["step"]), (&json!(id), &json!("welcome")));
        assert_eq!(child["input"]["imported"], json!(output), "{id}: the child got the imported items");
        let letter = format!("Welcome, {customer} ({}): {ITEMS} items imported", tier_of(customer));
        assert_eq!(child["output"], json!({ "send": { "letter": letter } }), "{id}'s child output");
        assert_eq!(step(&parent, "welcome")["output"], child["output"], "{id}: the child's output is the step's");
        assert_eq!(parent["output"]["welcome"], child["output"]);
        let (notified, notice) = seen.calls.get(&("notify".to_owned(), id.to_owned())).cloned().unwrap_or_default();
        assert_eq!((notified, &notice["letter"]), (1, &json!(letter)), "{id}: notify sent the child's letter");
    }
    assert!(seen.mismatches.is_empty(), "a redelivery carried another item: {:?}", seen.mismatches);
    // The calls held at the kill had their effect but no answer: each was
    // delivered again, and applied once.
    let held_again: Vec<&String> = held.iter().filter(|key| seen.deliveries[*key] < 2).collect();
    assert!(held_again.is_empty(), "held at the kill but never delivered again: {held_again:?}");
    assert!(!second.log().contains("panicked"), "the second process panicked:\n{}", second.log());
    let deliveries: usize = seen.deliveries.values().sum();
    eprintln!(
        "{} tasks of {ITEMS} items in {elapsed:?} across a SIGKILL: {deliveries} item deliveries, {} effects, \
         {redelivered} items delivered more than once ({} held at the kill), max in flight per task {:?}",
        TASKS.len(),
        seen.effects.len(),
        held.len(),
        seen.max_in_flight
    );
}

#[test]
fn on_sqlite_a_branch_a_fan_out_and_a_child_survive_a_sigkill() {
    let rota = Rota::new();
    branch_fan_out_and_child_survive_a_sigkill(rota.url());
}

#[test]
fn on_postgres_a_branch_a_fan_out_and_a_child_survive_a_sigkill() {
    let Some(schema) = TestSchema::new("control flow across a SIGKILL on PostgreSQL") else { return };
    branch_fan_out_and_child_survive_a_sigkill(&format!("{}?schema={}&connections=4", schema.url, schema.name));
}
