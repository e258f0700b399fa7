//! Test support shared by rota's test suites, and the fault-injecting TCP
//! proxy ([`proxy`]) that `rota demo --chaos` also runs.
//!
//! Tests that need PostgreSQL read its URL from `ROTA_TEST_POSTGRES_URL`
//! (`.ci/run` sets it and starts the server). Without it they print one
//! clear `SKIP` line and return: never a silent pass, and CI always runs them.
//!
//! Deliberately left out: fakes of rota's own components. Tests run the real
//! stores and engine.

pub mod postgres;
pub mod proxy;
