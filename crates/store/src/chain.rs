//! The hash chain of a task's history: each history row stores the
//! SHA-256 of the previous row's hash (of the same task, in `seq` order;
//! nothing for the first) followed by the row's own content, so that a row
//! changed, deleted or moved after it was written breaks the chain at that
//! row or the next, and [`verify`] names it.
//!
//! A row's content is its task id, time (epoch ms), kind, step (empty when
//! none), attempt (empty when none) and detail (the JSON text `serde_json`
//! writes, object keys sorted), joined by the unit separator (U+001F),
//! which no id, name or kind may contain; the detail comes last. The
//! sequence number is not part of it, so a history imported into another
//! store chains to the same hashes.
//!
//! Backends compute the chain where they append history: SQLite in the
//! writer's transaction ([`link`]), PostgreSQL in a trigger of the events
//! table that does the same in SQL. Rows written before the chain existed
//! have no hash; [`verify`] counts them and checks the chain from the first
//! row that has one.
//!
//! Deliberately left out: a row deleted from the end of a history (the
//! newest rows) leaves a shorter chain that is still whole: the chain
//! proves the order and content of what is there, not that nothing came
//! after it.

use sha2::{Digest, Sha256};

use crate::Event;

/// The separator of a row's fields in its hashed content.
const SEPARATOR: char = '\u{1f}';

/// The content of `event` that its hash covers.
pub fn content(event: &Event) -> String {
    let step = event.step.as_ref().map(|step| step.as_str()).unwrap_or("");
    let attempt = event.attempt.map(|attempt| attempt.to_string()).unwrap_or_default();
    let fields =
        [event.task_id.as_str(), &event.at.as_millis().to_string(), event.kind.as_str(), step, &attempt, &event.detail.to_string()];
    fields.join(&SEPARATOR.to_string())
}

/// The hash of `event` following a row whose hash is `previous` (`None`
/// for a task's first row, or one written before the chain).
pub fn link(previous: Option<&[u8]>, event: &Event) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(previous.unwrap_or_default());
    hasher.update(content(event).as_bytes());
    hasher.finalize().into()
}

/// A hash as text (lower-case hex), as [`Event::hash`] holds it.
pub fn hex(hash: &[u8]) -> String {
    hash.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A hash's bytes from its text, or `None` if it is not 64 hex digits.
pub fn from_hex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut bytes = [0u8; 32];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(bytes)
}

/// A history whose chain holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Whole {
    /// Rows whose hash was checked.
    pub chained: usize,
    /// Rows written before the chain existed (first in the history, no hash).
    pub unchained: usize,
}

/// Where a history's chain breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// The row's position in the history (1 for the oldest).
    pub row: usize,
    /// Its sequence number in the store it was read from.
    pub seq: i64,
    /// What is wrong with it.
    pub why: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "row {} (seq {}): {}", self.row, self.seq, self.why)
    }
}

/// Checks the chain of one task's `history`, oldest first: every row's hash
/// must be [`link`] of the row before and its own content. Rows without a
/// hash may only come first (written before the chain).
pub fn verify(history: &[Event]) -> Result<Whole, Broken> {
    let mut previous: Option<[u8; 32]> = None;
    let mut unchained = 0;
    for (index, event) in history.iter().enumerate() {
        let broken = |why: String| Broken { row: index + 1, seq: event.seq, why };
        let Some(text) = &event.hash else {
            if previous.is_some() {
                return Err(broken("has no hash, yet follows rows that have one (its hash was removed)".into()));
            }
            unchained += 1;
            continue;
        };
        let stored = from_hex(text).ok_or_else(|| broken(format!("its hash {text:?} is not 64 hex digits")))?;
        let expected = link(previous.as_ref().map(|hash| hash.as_slice()), event);
        if stored != expected {
            return Err(broken(
                "its hash does not match its content and the row before it: this row was changed, or a row before it was changed, deleted or moved"
                    .into(),
            ));
        }
        previous = Some(stored);
    }
    Ok(Whole { chained: history.len() - unchained, unchained })
}

/// Fills in the hashes of `history` (oldest first) as a backend writes
/// them, chaining from `previous`. For tests and tools that build a
/// history by hand.
pub fn seal(previous: Option<[u8; 32]>, history: &mut [Event]) {
    let mut previous = previous;
    for event in history {
        let hash = link(previous.as_ref().map(|hash| hash.as_slice()), event);
        event.hash = Some(hex(&hash));
        previous = Some(hash);
    }
}

#[cfg(test)]
mod tests {
    use rota_model::{TaskId, Timestamp};
    use serde_json::json;

    use super::*;
    use crate::EventKind;

    fn history() -> Vec<Event> {
        let id = TaskId::new("order-1").unwrap();
        let at = |ms| Timestamp::from_millis(ms);
        let mut history = vec![
            Event::task(&id, at(1), EventKind::Received, json!({"b": 1, "a": [1.5, "x"]})),
            Event::task(&id, at(2), EventKind::Claimed, json!({"owner": "s1"})),
            Event::task(&id, at(3), EventKind::Processed, json!({})),
        ];
        for (seq, event) in history.iter_mut().enumerate() {
            event.seq = seq as i64 + 10;
        }
        seal(None, &mut history);
        history
    }

    #[test]
    fn content_joins_the_fields_with_the_detail_last_and_keys_sorted() {
        let first = &history()[0];
        assert_eq!(content(first), "order-1\u{1f}1\u{1f}received\u{1f}\u{1f}\u{1f}{\"a\":[1.5,\"x\"],\"b\":1}");
        assert_eq!(first.hash.as_deref(), Some(hex(&Sha256::digest(content(first).as_bytes())).as_str()), "the first row has no previous");
        assert_eq!(from_hex(first.hash.as_deref().unwrap()).map(|hash| hex(&hash)), first.hash.clone());
        assert_eq!(from_hex("zz"), None);
    }

    #[test]
    fn a_whole_chain_verifies_and_each_break_is_named() {
        let whole = history();
        assert_eq!(verify(&whole), Ok(Whole { chained: 3, unchained: 0 }));

        let mut changed = whole.clone();
        changed[1].detail = json!({"owner": "s2"});
        assert_eq!(verify(&changed).unwrap_err().row, 2, "a changed row");
        let mut deleted = whole.clone();
        deleted.remove(1);
        assert_eq!(verify(&deleted).unwrap_err().seq, 12, "the row after a deleted one");
        let mut reordered = whole.clone();
        reordered.swap(0, 1);
        assert_eq!(verify(&reordered).unwrap_err().row, 1, "rows moved");
        let mut stripped = whole.clone();
        stripped[2].hash = None;
        assert_eq!(verify(&stripped).unwrap_err().why, "has no hash, yet follows rows that have one (its hash was removed)");
        let mut garbled = whole.clone();
        garbled[0].hash = Some("beef".into());
        assert_eq!(verify(&garbled).unwrap_err().to_string(), "row 1 (seq 10): its hash \"beef\" is not 64 hex digits");

        let mut legacy = whole;
        legacy[0].hash = None;
        seal(None, &mut legacy[1..]);
        assert_eq!(verify(&legacy), Ok(Whole { chained: 2, unchained: 1 }), "rows from before the chain come first");
    }
}
