//! SQL text with the store's schema filled in. Statements are written with
//! `rota.` before every table name; [`Names`] rewrites that once per
//! statement to the configured schema and keeps the result, so that the
//! driver's prepared-statement cache sees one stable text per statement.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sqlx::AssertSqlSafe;

/// How many bits of an event-writer lock key carry the sequence value; the
/// bits above carry the schema's tag.
const EVENT_LOCK_VALUE_BITS: u32 = 41;

/// The schema's name and the statements rewritten for it.
#[derive(Debug)]
pub(crate) struct Names {
    quoted: String,
    tag: u32,
    cache: Mutex<HashMap<usize, Arc<str>>>,
}

/// FNV-1a: a hash that every build and platform computes alike, so that all
/// processes sharing a schema agree on its advisory-lock keys.
fn stable_hash(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |hash, byte| (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193))
}

impl Names {
    /// Names for `schema`, which the caller has validated.
    pub(crate) fn new(schema: &str) -> Names {
        Names { quoted: format!("\"{schema}\""), tag: stable_hash(schema), cache: Mutex::new(HashMap::new()) }
    }

    /// The schema's name, quoted for SQL.
    pub(crate) fn quoted(&self) -> &str {
        &self.quoted
    }

    /// `sql` with `rota.` replaced by the quoted schema.
    pub(crate) fn qualify(&self, sql: &str) -> String {
        sql.replace("rota.", &format!("{}.", self.quoted))
    }

    /// The statement `sql` for this schema, rewritten once and then reused.
    pub(crate) fn sql(&self, sql: &'static str) -> AssertSqlSafe<Arc<str>> {
        let key = sql.as_ptr() as usize;
        let mut cache = self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let text = cache.entry(key).or_insert_with(|| Arc::from(self.qualify(sql))).clone();
        AssertSqlSafe(text)
    }

    /// A one-off statement built at run time from validated parts.
    pub(crate) fn raw(&self, sql: &str) -> AssertSqlSafe<String> {
        AssertSqlSafe(sql.to_owned())
    }

    /// The two-part advisory-lock key that serializes migrations of this schema.
    pub(crate) fn migration_lock(&self) -> (i32, i32) {
        (self.tag as i32, 0x726f_7461) // "rota"
    }

    /// The first advisory-lock key of this schema's event writers: a writer
    /// holds `base + n` where n is the event sequence's value when it began.
    pub(crate) fn event_lock_base(&self) -> i64 {
        i64::from(self.tag >> (32 - (63 - EVENT_LOCK_VALUE_BITS))) << EVENT_LOCK_VALUE_BITS
    }

    /// The largest sequence value an event-writer lock key can carry.
    pub(crate) fn event_lock_span() -> i64 {
        (1_i64 << EVENT_LOCK_VALUE_BITS) - 1
    }
}

/// Whether `schema` is a plain identifier rota accepts as its schema name
/// (it is spliced into SQL, so nothing else is allowed).
pub(crate) fn check_schema(schema: &str) -> Result<(), String> {
    let valid_start = schema.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    if schema.is_empty()
        || schema.len() > 48
        || !valid_start
        || !schema.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return Err(format!(
            "schema {schema:?} must be 1 to 48 characters of lowercase ASCII letters, digits and '_', starting with a letter or '_'"
        ));
    }
    Ok(())
}
