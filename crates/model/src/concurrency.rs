//! A task's concurrency key: at most `limit` tasks with the same key (within
//! one workflow) are started and unfinished at once, across every process.
//! A task takes one of its key's slots at its first claim and keeps it until
//! it ends (Processed, Error, Cancelled, Compensated), also while its holder
//! is gone and the task waits, Pending, to be taken over; the store frees the
//! slot in the commit that ends the task.
//!
//! The key is computed once, at submission, from the workflow's
//! `concurrency:` (a CEL expression over the input) or `max_in_flight:` (one
//! key for the whole workflow), and never changes.

use serde::{Deserialize, Serialize};

/// The highest `limit` a key may have: slots are numbered 0..limit and a
/// claim looks for a free one among them.
pub const CONCURRENCY_LIMIT_MAX: u32 = 10_000;

/// The longest key, in bytes: it is a column of every task and of the slot
/// table's primary key.
pub const CONCURRENCY_KEY_BYTES_MAX: usize = 256;

/// The key of every task of a workflow with `max_in_flight:` (a key written
/// from an expression always holds `=`, so the two never meet).
pub const MAX_IN_FLIGHT_KEY: &str = "max_in_flight";

/// A task's concurrency key and its limit, as its submission computed them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConcurrencyKey {
    /// `NAME=VALUE` (the expression's name, the value it gave) or
    /// [`MAX_IN_FLIGHT_KEY`]; a slot's namespace is the task's workflow.
    pub key: String,
    /// At most this many tasks of the key hold a slot, 1..=[`CONCURRENCY_LIMIT_MAX`].
    pub limit: u32,
}

impl ConcurrencyKey {
    /// Whether this is a workflow's `max_in_flight` rather than a key.
    pub fn is_max_in_flight(&self) -> bool {
        self.key == MAX_IN_FLIGHT_KEY
    }

    /// How a waiting task's status reads, with `in_use` of the `limit`
    /// slots taken: `waiting for concurrency key customer=c1 (1/1 in use)`.
    pub fn waiting_reason(&self, in_use: u32) -> String {
        if self.is_max_in_flight() {
            format!("waiting for the workflow's max_in_flight ({in_use}/{} in use)", self.limit)
        } else {
            format!("waiting for concurrency key {} ({in_use}/{} in use)", self.key, self.limit)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_task_says_what_it_waits_for() {
        let key = ConcurrencyKey { key: "customer=c1".into(), limit: 1 };
        assert_eq!(key.waiting_reason(1), "waiting for concurrency key customer=c1 (1/1 in use)");
        let all = ConcurrencyKey { key: MAX_IN_FLIGHT_KEY.into(), limit: 3 };
        assert!(all.is_max_in_flight());
        assert_eq!(all.waiting_reason(3), "waiting for the workflow's max_in_flight (3/3 in use)");
    }
}
