//! The conformance suite: what every backend must do, written once against
//! the [`Store`](crate::Store) traits and run unchanged on each backend.
//!
//! A backend's test crate implements [`Harness`] and expands
//! [`conformance_suite!`](crate::conformance_suite) with it, which generates
//! one `#[tokio::test]` per case so that each shows up (and fails) on its
//! own. Cases control time through the harness's [`ManualClock`].

use std::sync::Arc;

use async_trait::async_trait;
use rota_model::ManualClock;

use crate::SharedStore;

/// What a backend provides to run the suite.
#[async_trait]
pub trait Harness: Send + Sync {
    /// Opens a store on this harness's database. Every call opens a new
    /// handle on the *same* database (as a restarted process would), all
    /// reading time from [`Harness::clock`].
    async fn open(&self) -> SharedStore;

    /// The clock every store opened by this harness reads.
    fn clock(&self) -> Arc<ManualClock>;
}

/// Generates one test per conformance case. `$make` is an expression that
/// builds a fresh harness (a new, empty database) each time it is evaluated.
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!(@cases $make;
            placeholder_case
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness = $make;
                $crate::conformance::$case(&harness).await;
            }
        )*
    };
}

/// Placeholder until the cases land.
pub async fn placeholder_case(harness: &dyn Harness) {
    let _ = harness.open().await;
}
