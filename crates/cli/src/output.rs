//! What the operator commands print: one JSON shape per record (for
//! `--json` and for `consume`'s JSON lines) and plain aligned tables for
//! people. Times are RFC 3339 in UTC with milliseconds in both.
//!
//! The JSON shapes are the CLI's own, not the HTTP API's wire types: they
//! are built here from store records or from the API's views (which the
//! operator commands get from either backend) and only ever serialized.

use std::io::{self, Write};
use std::time::{Duration, UNIX_EPOCH};

use rota_api::wire::{DeadLetterView, QueueView};
use rota_model::Timestamp;
use rota_store::Delivery;
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// How many characters of a body a table shows before cutting it.
const TABLE_BODY_CHARS_MAX: usize = 60;

/// A timestamp as RFC 3339 in UTC, with milliseconds.
pub fn rfc3339(at: Timestamp) -> String {
    let millis = u64::try_from(at.as_millis()).unwrap_or(0);
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(millis)).to_string()
}

/// A time in epoch milliseconds (as the API's views carry it) as RFC 3339.
pub fn rfc3339_millis(millis: i64) -> String {
    rfc3339(Timestamp::from_millis(millis))
}

/// A leased message, as `receive --json` and `consume` print it.
#[derive(Serialize)]
pub struct DeliveryJson<'a> {
    queue: &'a str,
    id: &'a str,
    body: &'a RawValue,
    lease_token: String,
    delivery_count: u32,
    enqueued_at: String,
    lease_until: String,
    ordering_key: Option<&'a str>,
}

impl<'a> From<&'a Delivery> for DeliveryJson<'a> {
    fn from(delivery: &'a Delivery) -> Self {
        DeliveryJson {
            queue: delivery.queue.as_str(),
            id: delivery.id.as_str(),
            body: &delivery.body,
            lease_token: delivery.lease_token.to_string(),
            delivery_count: delivery.delivery_count,
            enqueued_at: rfc3339(delivery.enqueued_at),
            lease_until: rfc3339(delivery.lease_until),
            ordering_key: delivery.ordering_key.as_deref(),
        }
    }
}

/// A dead letter, as `dlq list --json` prints it.
#[derive(Serialize)]
pub struct DeadLetterJson<'a> {
    queue: &'a str,
    id: &'a str,
    body: &'a Value,
    reason: &'a str,
    delivery_count: u32,
    enqueued_at: String,
    dead_lettered_at: String,
    ordering_key: Option<&'a str>,
}

impl<'a> From<&'a DeadLetterView> for DeadLetterJson<'a> {
    fn from(letter: &'a DeadLetterView) -> Self {
        DeadLetterJson {
            queue: &letter.queue,
            id: &letter.id,
            body: &letter.body,
            reason: &letter.reason,
            delivery_count: letter.delivery_count,
            enqueued_at: rfc3339_millis(letter.enqueued_at),
            dead_lettered_at: rfc3339_millis(letter.dead_lettered_at),
            ordering_key: letter.ordering_key.as_deref(),
        }
    }
}

/// One queue's counts, as `queue stats --json` prints them.
#[derive(Serialize)]
pub struct StatsJson<'a> {
    queue: &'a str,
    ready: u64,
    leased: u64,
    delayed: u64,
    dead_lettered: u64,
    paused: bool,
    oldest_ready_at: Option<String>,
}

impl<'a> From<&'a QueueView> for StatsJson<'a> {
    fn from(stats: &'a QueueView) -> Self {
        StatsJson {
            queue: &stats.queue,
            ready: stats.ready,
            leased: stats.leased,
            delayed: stats.delayed,
            dead_lettered: stats.dead_lettered,
            paused: stats.paused,
            oldest_ready_at: stats.oldest_ready_at.map(rfc3339_millis),
        }
    }
}

/// Writes `text` and a newline to stdout and flushes, so that a reader of a
/// pipe sees each line as soon as it is printed.
pub fn line(text: &str) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{text}")?;
    stdout.flush()
}

/// Prints `value` as pretty JSON.
pub fn json<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    line(&text)?;
    Ok(())
}

/// A body cut to fit a table cell.
pub fn body_cell(body: &RawValue) -> String {
    text_cell(body.get())
}

/// A JSON value (a dead letter's body) cut to fit a table cell.
pub fn value_cell(value: &Value) -> String {
    text_cell(&value.to_string())
}

fn text_cell(text: &str) -> String {
    if text.chars().count() <= TABLE_BODY_CHARS_MAX {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(TABLE_BODY_CHARS_MAX - 1).collect();
    cut.push('…');
    cut
}

/// Renders rows under headers, columns padded to their widest cell. The last
/// column is not padded, so long bodies and reasons do not leave trailing
/// blanks.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|header| header.chars().count()).collect();
    for row in rows {
        debug_assert_eq!(row.len(), headers.len());
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let headers: Vec<String> = headers.iter().map(|header| (*header).to_owned()).collect();
    for row in std::iter::once(&headers).chain(rows) {
        let last = row.len().saturating_sub(1);
        for (column, cell) in row.iter().enumerate() {
            if column == last {
                out.push_str(cell);
            } else {
                let pad = widths[column] - cell.chars().count();
                out.push_str(cell);
                out.extend(std::iter::repeat_n(' ', pad + 2));
            }
        }
        out.push('\n');
    }
    out.pop();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_leave_the_last_one_ragged() {
        let rows = vec![vec!["a".to_owned(), "1".to_owned(), "x".to_owned()], vec!["bbb".to_owned(), "22".to_owned(), "yy".to_owned()]];
        assert_eq!(table(&["NAME", "N", "BODY"], &rows), "NAME  N   BODY\na     1   x\nbbb   22  yy");
    }

    #[test]
    fn times_are_rfc3339_utc_with_millis() {
        assert_eq!(rfc3339(Timestamp::from_millis(1_767_225_600_123)), "2026-01-01T00:00:00.123Z");
    }

    #[test]
    fn long_bodies_are_cut() {
        let body = RawValue::from_string(format!("\"{}\"", "x".repeat(100))).unwrap();
        assert_eq!(body_cell(&body).chars().count(), TABLE_BODY_CHARS_MAX);
    }
}
