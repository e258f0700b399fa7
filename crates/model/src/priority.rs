//! A task's priority: Schedulers claim higher priorities first, then in
//! submission order (`not_before`), and take a fixed share of what they
//! claim oldest-first regardless of priority, so that a low priority still
//! progresses (`rota_store::OldestShare`).
//!
//! The range is small and fixed so that a priority is a plain index key
//! and a definition's default and a submission's choice mean the same
//! thing on every store.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

/// The lowest priority a task may have.
pub const PRIORITY_MIN: i32 = -100;
/// The highest priority a task may have.
pub const PRIORITY_MAX: i32 = 100;

/// A task's priority, within [`PRIORITY_MIN`]..=[`PRIORITY_MAX`]; 0 unless
/// the submission or the workflow's definition gives another. Built only
/// through [`Priority::new`] (or deserialisation, which checks the same
/// bounds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Priority(i32);

/// A priority outside [`PRIORITY_MIN`]..=[`PRIORITY_MAX`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a priority must be an integer from {min} to {max}, got {got}", min = PRIORITY_MIN, max = PRIORITY_MAX)]
pub struct PriorityError {
    /// The refused value.
    pub got: i64,
}

impl Priority {
    /// The default priority, 0.
    pub const NORMAL: Priority = Priority(0);

    /// `value` as a priority, if it is within the bounds.
    pub fn new(value: i64) -> Result<Priority, PriorityError> {
        if (i64::from(PRIORITY_MIN)..=i64::from(PRIORITY_MAX)).contains(&value) {
            Ok(Priority(value as i32))
        } else {
            Err(PriorityError { got: value })
        }
    }

    /// The priority as an integer.
    pub fn get(self) -> i32 {
        self.0
    }

    /// Whether it is the default (serialisations leave it out then).
    pub fn is_normal(&self) -> bool {
        *self == Priority::NORMAL
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> Deserialize<'de> for Priority {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Priority, D::Error> {
        let value = i64::deserialize(deserializer)?;
        Priority::new(value).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_inclusive_and_checked() {
        assert_eq!(Priority::new(i64::from(PRIORITY_MIN)).map(Priority::get), Ok(PRIORITY_MIN));
        assert_eq!(Priority::new(i64::from(PRIORITY_MAX)).map(Priority::get), Ok(PRIORITY_MAX));
        assert_eq!(Priority::new(i64::from(PRIORITY_MAX) + 1), Err(PriorityError { got: 101 }));
        assert_eq!(Priority::new(i64::from(PRIORITY_MIN) - 1), Err(PriorityError { got: -101 }));
        assert_eq!(Priority::new(i64::MAX), Err(PriorityError { got: i64::MAX }));
        assert_eq!(Priority::default(), Priority::NORMAL);
    }

    #[test]
    fn deserialising_checks_the_bounds() {
        assert_eq!(serde_json::from_str::<Priority>("7").unwrap(), Priority::new(7).unwrap());
        let err = serde_json::from_str::<Priority>("1000").unwrap_err().to_string();
        assert!(err.contains("from -100 to 100, got 1000"), "{err}");
        assert!(serde_json::from_str::<Priority>("1.5").is_err());
    }
}
