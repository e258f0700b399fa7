//! rota's Agents: the half of the pattern that calls remote services.
//!
//! An Agent receives a [`Request`] (one attempt of one step, with its
//! complete-by time and idempotency key), calls the service, and ends in an
//! [`Outcome`]. This crate owns everything between those two points:
//!
//! - the [`Agent`] trait, one try of a call, which classifies each failure
//!   as [`StepError::Retryable`] or [`StepError::Permanent`] where it
//!   happens;
//! - [`run_until_deadline`], the retry loop: jittered backoff from the step's
//!   [`RetryPolicy`](rota_model::RetryPolicy), `Retry-After` honoured, every
//!   try cut at the deadline, and silence ([`Outcome::DeadlinePassed`]) once
//!   the complete-by time has passed; [`run_gated`] lets a [`Gate`] (the
//!   engine's shared rate limits) hold each try back first;
//! - per-endpoint [circuit breakers](breaker), driven by the injected clock;
//! - the built-in agents [`HttpAgent`] (`http`), [`ExecAgent`] (`exec`) and
//!   [`DelayAgent`] (`delay`), and the [`AgentRegistry`] that names them;
//! - the [egress allow-list](egress) of the hosts `http` steps (and the
//!   engine's webhooks) may reach;
//! - [`http_client`], the one way the workspace builds an HTTP client (with
//!   the TLS crypto provider installed first).
//!
//! Time comes from an injected [`Clock`](rota_model::Clock) and randomness
//! from an injected RNG, so the loop and the breakers are tested with a
//! manual clock and fixed seeds.
//!
//! Deliberately left out: queues, the state store, leases, replies and
//! fencing. The engine wraps an agent in a queue consumer, renews the lease
//! while [`run_until_deadline`] runs, and turns the [`Outcome`] into a reply
//! to the Scheduler (or into no reply at all). This crate spawns no futures.

pub mod breaker;
mod delay;
pub mod egress;
mod error;
mod exec;
mod http;
mod input;
mod request;
mod run;
mod tls;

mod agent;

pub use agent::{Agent, AgentRegistry};
pub use breaker::{BreakerConfig, BreakerSnapshot, BreakerState, CircuitBreaker, Health};
pub use delay::DelayAgent;
pub use egress::Egress;
pub use error::{Error, Result, StepError, StepResultExt};
pub use exec::{ENV_INHERITED, EXIT_TEMPFAIL, ExecAgent, ExecConfig, PATH_DEFAULT, STDOUT_BYTES_LIMIT};
pub use http::{HttpAgent, HttpConfig, RESPONSE_BYTES_LIMIT};
pub use request::Request;
pub use run::{Gate, Hold, Open, Outcome, run_gated, run_until_deadline};
pub use tls::{http_client, install_crypto_provider};
