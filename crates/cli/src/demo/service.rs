//! The simulated remote payment service of `rota demo`: an axum server on
//! loopback with the order workflow's endpoints (`/reserve`, `/release`,
//! `/charge`, `/refund`, `/ship`, `/notify`).
//!
//! It behaves as a well-built remote service does under at-least-once
//! delivery: every request must carry an `Idempotency-Key`; the first
//! request with a key applies the operation and stores its response, and
//! every later request with that key gets the stored response back without
//! applying anything again. It counts, per key, the requests received and
//! the effects applied, and keeps a small ledger per order so that the demo
//! can check the outcome of every task against what the service did.
//!
//! Faults are drawn per request from a hash of (seed, key, how many requests
//! that key had), so a run is reproducible up to timing:
//!
//! * `503 Service Unavailable` (transient, nothing applied);
//! * a *late* request: it hangs past the step's timeout, then applies its
//!   effect (in a spawned task, so that the effect lands even though the
//!   client has hung up) and answers nobody;
//! * a *lost* response: the effect is applied at once, the answer never
//!   comes back in time.
//!
//! Business outcomes come from the order's data, like test cards do:
//! a card ending in `0000` is declined (`402`, permanent), an address
//! `undeliverable` cannot be shipped to (`422`), an email at
//! `blackhole.invalid` makes `/notify` hang every time (a long-lasting
//! fault), and a refund to a card ending in `4040` is refused (`409`: the
//! card account was closed), which leaves its order for an operator.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// The card suffix the service declines.
pub const DECLINED_CARD_SUFFIX: &str = "0000";
/// The card suffix whose refunds are refused.
pub const CLOSED_CARD_SUFFIX: &str = "4040";
/// The address the service cannot ship to.
pub const UNDELIVERABLE_ADDRESS: &str = "undeliverable";
/// The email domain whose notifications hang forever.
pub const BLACKHOLE_DOMAIN: &str = "blackhole.invalid";

/// How often each fault happens, per request.
#[derive(Debug, Clone)]
pub struct Faults {
    /// Share of requests answered `503`.
    pub unavailable: f64,
    /// Share of requests that hang past the step timeout, then apply their effect.
    pub late: f64,
    /// Share of requests that apply their effect, then hang past the step timeout.
    pub lost: f64,
    /// How long a late or lost request hangs.
    pub hang: Duration,
}

/// The operations, one per endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Reserve,
    Release,
    Charge,
    Refund,
    Ship,
    Notify,
}

impl Op {
    pub const ALL: [Op; 6] = [Op::Reserve, Op::Release, Op::Charge, Op::Refund, Op::Ship, Op::Notify];

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Reserve => "reserve",
            Op::Release => "release",
            Op::Charge => "charge",
            Op::Refund => "refund",
            Op::Ship => "ship",
            Op::Notify => "notify",
        }
    }

    fn parse(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.as_str() == name)
    }
}

/// A stored response, replayed to every later request with the same key.
#[derive(Debug, Clone)]
struct Stored {
    status: StatusCode,
    body: Value,
}

impl IntoResponse for Stored {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body)).into_response()
    }
}

/// What the service knows about one idempotency key.
#[derive(Debug, Default)]
struct KeyRecord {
    requests: u32,
    effects: u32,
    response: Option<Stored>,
}

/// The effects applied to one order, per operation.
#[derive(Debug, Default, Clone)]
pub struct OrderLedger {
    /// How many times each operation took effect for the order.
    pub applied: HashMap<Op, u32>,
    /// The card charged, if any.
    pub card: Option<String>,
    /// Operations undone before they took effect: a compensation that found
    /// nothing to undo leaves this mark, so that the original request, if it
    /// lands late, is refused instead of taking effect after its undo.
    pub voided: Vec<Op>,
}

impl OrderLedger {
    pub fn count(&self, op: Op) -> u32 {
        self.applied.get(&op).copied().unwrap_or(0)
    }
}

/// Counts of what the service saw, for the final table.
#[derive(Debug, Default, Clone)]
pub struct Counters {
    pub requests: u64,
    pub unavailable: u64,
    pub late: u64,
    pub lost: u64,
    pub blackholed: u64,
    pub replayed: u64,
}

#[derive(Debug, Default)]
struct Ledger {
    keys: HashMap<String, KeyRecord>,
    orders: HashMap<String, OrderLedger>,
    counters: Counters,
    next_id: u64,
}

/// What the service did, read at the end of the run.
#[derive(Debug, Clone)]
pub struct Report {
    pub counters: Counters,
    /// Requests received per idempotency key.
    pub requests_per_key: HashMap<String, u32>,
    /// Effects applied per idempotency key.
    pub effects_per_key: HashMap<String, u32>,
    /// The ledger of every order.
    pub orders: HashMap<String, OrderLedger>,
}

/// The simulated service.
pub struct Service {
    seed: u64,
    faults: Faults,
    ledger: Mutex<Ledger>,
}

enum Fault {
    None,
    Unavailable,
    Late,
    Lost,
}

impl Service {
    pub fn new(seed: u64, faults: Faults) -> Arc<Service> {
        Arc::new(Service { seed, faults, ledger: Mutex::new(Ledger::default()) })
    }

    /// Serves on a fresh loopback port; returns its address and the server's task.
    pub async fn start(self: &Arc<Self>) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new().route("/{op}", post(handle)).with_state(self.clone());
        let server = tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, app).await {
                tracing::error!("the simulated payment service stopped: {err}");
            }
        });
        Ok((addr, server))
    }

    /// Everything the service counted so far.
    pub fn report(&self) -> Report {
        let ledger = self.ledger.lock().expect("service ledger");
        Report {
            counters: ledger.counters.clone(),
            requests_per_key: ledger.keys.iter().map(|(k, r)| (k.clone(), r.requests)).collect(),
            effects_per_key: ledger.keys.iter().map(|(k, r)| (k.clone(), r.effects)).collect(),
            orders: ledger.orders.clone(),
        }
    }

    /// Counts a request and draws its fault.
    fn receive(&self, key: &str) -> Fault {
        let mut ledger = self.ledger.lock().expect("service ledger");
        ledger.counters.requests += 1;
        let record = ledger.keys.entry(key.to_owned()).or_default();
        record.requests += 1;
        let draw = unit(self.seed, key, record.requests);
        let f = &self.faults;
        if draw < f.unavailable {
            ledger.counters.unavailable += 1;
            Fault::Unavailable
        } else if draw < f.unavailable + f.late {
            ledger.counters.late += 1;
            Fault::Late
        } else if draw < f.unavailable + f.late + f.lost {
            ledger.counters.lost += 1;
            Fault::Lost
        } else {
            Fault::None
        }
    }

    /// Applies `op` once per key: the first call decides the response and
    /// every later call with the same key gets it back.
    fn apply(&self, op: Op, key: &str, body: &Value) -> Stored {
        let mut ledger = self.ledger.lock().expect("service ledger");
        if let Some(stored) = ledger.keys.get(key).and_then(|r| r.response.clone()) {
            ledger.counters.replayed += 1;
            return stored;
        }
        let stored = ledger.decide(op, body);
        let record = ledger.keys.entry(key.to_owned()).or_default();
        if stored.status.is_success() {
            record.effects += 1;
        }
        record.response = Some(stored.clone());
        stored
    }

    fn blackholed(&self) {
        self.ledger.lock().expect("service ledger").counters.blackholed += 1;
    }
}

impl Ledger {
    /// A compensation that found nothing to undo: remember it.
    fn void(&mut self, order: &str, op: Op) -> Stored {
        self.orders.entry(order.to_owned()).or_default().voided.push(op);
        Stored { status: StatusCode::OK, body: json!({ "nothing_to_undo": true }) }
    }

    /// How many times `op` took effect for `order`.
    fn applied(&self, order: &str, op: Op) -> u32 {
        self.orders.get(order).and_then(|o| o.applied.get(&op)).copied().unwrap_or(0)
    }

    /// The business logic: the response to the first request of a key, and
    /// its effect on the order's ledger when it succeeds.
    fn decide(&mut self, op: Op, body: &Value) -> Stored {
        let order = text(body, "order");
        if order.is_empty() {
            return Stored { status: StatusCode::BAD_REQUEST, body: json!({ "error": "the body names no order" }) };
        }
        if self.orders.get(&order).is_some_and(|o| o.voided.contains(&op)) {
            let error = "already undone: this order's request was compensated before it arrived";
            return Stored { status: StatusCode::CONFLICT, body: json!({ "error": error }) };
        }
        self.next_id += 1;
        let id = self.next_id;
        let (status, response) = match op {
            Op::Reserve => (StatusCode::OK, json!({ "hold_id": format!("hold-{id}") })),
            // Undoing what never happened is a success with no effect: a
            // compensation may be sent for a step whose effect is in doubt.
            Op::Release if self.applied(&order, Op::Reserve) == 0 => return self.void(&order, Op::Reserve),
            Op::Release => (StatusCode::OK, json!({ "released": true })),
            Op::Charge => {
                let card = text(body, "card");
                if card.ends_with(DECLINED_CARD_SUFFIX) {
                    (StatusCode::PAYMENT_REQUIRED, json!({ "error": "card declined" }))
                } else {
                    self.orders.entry(order.clone()).or_default().card = Some(card);
                    (StatusCode::OK, json!({ "charge_id": format!("ch-{id}") }))
                }
            }
            Op::Refund if self.applied(&order, Op::Charge) == 0 => return self.void(&order, Op::Charge),
            Op::Refund => {
                let card = self.orders.get(&order).and_then(|o| o.card.clone()).unwrap_or_default();
                if card.ends_with(CLOSED_CARD_SUFFIX) {
                    (StatusCode::CONFLICT, json!({ "error": "refund refused: the card account is closed" }))
                } else {
                    (StatusCode::OK, json!({ "refund_id": format!("re-{id}") }))
                }
            }
            Op::Ship => {
                if text(body, "address") == UNDELIVERABLE_ADDRESS {
                    (StatusCode::UNPROCESSABLE_ENTITY, json!({ "error": "address undeliverable" }))
                } else {
                    (StatusCode::OK, json!({ "tracking": format!("trk-{id}") }))
                }
            }
            Op::Notify => (StatusCode::OK, json!({ "message_id": format!("msg-{id}") })),
        };
        if status.is_success() {
            *self.orders.entry(order).or_default().applied.entry(op).or_default() += 1;
        }
        Stored { status, body: response }
    }
}

async fn handle(State(service): State<Arc<Service>>, Path(op): Path<String>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let Some(op) = Op::parse(&op) else {
        return (StatusCode::NOT_FOUND, axum::Json(json!({ "error": format!("no endpoint /{op}") }))).into_response();
    };
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_owned) else {
        return (StatusCode::BAD_REQUEST, axum::Json(json!({ "error": "Idempotency-Key header required" }))).into_response();
    };
    let body: Value = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(err) => return (StatusCode::BAD_REQUEST, axum::Json(json!({ "error": format!("body: {err}") }))).into_response(),
    };
    let fault = service.receive(&key);
    if op == Op::Notify && text(&body, "email").ends_with(BLACKHOLE_DOMAIN) {
        // The mail relay for this domain never answers.
        service.blackholed();
        tokio::time::sleep(Duration::from_secs(120)).await;
        return StatusCode::GATEWAY_TIMEOUT.into_response();
    }
    let hang = service.faults.hang;
    match fault {
        Fault::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({ "error": "temporarily unavailable" }))).into_response(),
        Fault::Late => {
            // Spawned, so that the late effect lands even if the client hangs up.
            let late = tokio::spawn(async move {
                tokio::time::sleep(hang).await;
                service.apply(op, &key, &body)
            });
            match late.await {
                Ok(stored) => stored.into_response(),
                Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
            }
        }
        Fault::Lost => {
            let stored = service.apply(op, &key, &body);
            tokio::time::sleep(hang).await;
            stored.into_response()
        }
        Fault::None => service.apply(op, &key, &body).into_response(),
    }
}

fn text(body: &Value, field: &str) -> String {
    match body.get(field) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// A number in [0, 1) drawn from (seed, key, n).
fn unit(seed: u64, key: &str, n: u32) -> f64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for byte in key.bytes() {
        h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    let x = splitmix64(h ^ (u64::from(n) << 32));
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// One step of SplitMix64.
pub fn splitmix64(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quiet() -> Arc<Service> {
        Service::new(1, Faults { unavailable: 0.0, late: 0.0, lost: 0.0, hang: Duration::from_millis(1) })
    }

    #[test]
    fn a_repeated_key_replays_the_first_response_without_a_second_effect() {
        let service = quiet();
        let body = json!({ "order": "o-1", "card": "4242" });
        let first = service.apply(Op::Charge, "o-1/charge", &body);
        let again = service.apply(Op::Charge, "o-1/charge", &body);
        assert_eq!(first.body, again.body);
        let report = service.report();
        assert_eq!(report.effects_per_key["o-1/charge"], 1);
        assert_eq!(report.orders["o-1"].count(Op::Charge), 1);
        assert_eq!(report.counters.replayed, 1);
    }

    #[test]
    fn declines_and_refusals_are_permanent_and_apply_nothing() {
        let service = quiet();
        let declined = service.apply(Op::Charge, "o-2/charge", &json!({ "order": "o-2", "card": "4000000000000000" }));
        assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
        service.apply(Op::Charge, "o-3/charge", &json!({ "order": "o-3", "card": "4000000000004040" }));
        let refused = service.apply(Op::Refund, "o-3/charge/compensate", &json!({ "order": "o-3" }));
        assert_eq!(refused.status, StatusCode::CONFLICT);
        let report = service.report();
        assert_eq!(report.effects_per_key["o-2/charge"], 0);
        assert_eq!(report.orders["o-3"].count(Op::Refund), 0);
    }

    #[test]
    fn draws_are_spread_and_reproducible() {
        let draws: Vec<f64> = (0..1000).map(|i| unit(7, &format!("order-{i}/charge"), 1)).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        let low = draws.iter().filter(|d| **d < 0.1).count();
        assert!((60..140).contains(&low), "{low}");
        assert_eq!(unit(7, "k", 2), unit(7, "k", 2));
        assert_ne!(unit(7, "k", 2), unit(8, "k", 2));
    }
}
