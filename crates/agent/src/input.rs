//! Reading a step's input object: field access that turns every shape error
//! into a [`StepError::Permanent`] naming the field, so that a typo in a
//! workflow file shows up in the task history as `input.timeout: …`.
//!
//! Deliberately left out: templates. The Scheduler resolves them before the
//! request is sent; agents see plain JSON.

use std::time::Duration;

use rota_model::json::kind;
use serde_json::{Map, Value};

use crate::StepError;

/// The step input as an object, refusing fields not in `known`.
pub(crate) fn object<'a>(input: &'a Value, known: &[&str]) -> Result<&'a Map<String, Value>, StepError> {
    let Some(fields) = input.as_object() else {
        return Err(StepError::permanent(format!("input: expected an object with {}, got {}", known.join(", "), kind(input))));
    };
    if let Some(unknown) = fields.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(StepError::permanent(format!("input.{unknown}: unknown field (expected one of {})", known.join(", "))));
    }
    Ok(fields)
}

/// A required string field.
pub(crate) fn string<'a>(fields: &'a Map<String, Value>, name: &str) -> Result<&'a str, StepError> {
    match fields.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(StepError::permanent(format!("input.{name}: expected a string, got {}", kind(other)))),
        None => Err(StepError::permanent(format!("input.{name}: missing"))),
    }
}

/// An optional object of string values (headers, environment variables).
pub(crate) fn string_map<'a>(fields: &'a Map<String, Value>, name: &str) -> Result<Vec<(&'a str, &'a str)>, StepError> {
    let Some(value) = fields.get(name) else { return Ok(Vec::new()) };
    let Some(map) = value.as_object() else {
        return Err(StepError::permanent(format!("input.{name}: expected an object of strings, got {}", kind(value))));
    };
    map.iter()
        .map(|(key, value)| match value {
            Value::String(s) => Ok((key.as_str(), s.as_str())),
            other => Err(StepError::permanent(format!("input.{name}.{key}: expected a string, got {}", kind(other)))),
        })
        .collect()
}

/// An optional duration: a string such as `"1.5s"`, `"250ms"` or `"2m"`, or
/// a number of milliseconds.
pub(crate) fn duration(fields: &Map<String, Value>, name: &str) -> Result<Option<Duration>, StepError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => parse_duration(value).map(Some).map_err(|why| StepError::permanent(format!("input.{name}: {why}"))),
    }
}

/// A duration from a humantime string or a whole number of milliseconds.
pub(crate) fn parse_duration(value: &Value) -> Result<Duration, String> {
    match value {
        Value::String(text) => humantime::parse_duration(text).map_err(|e| format!("invalid duration {text:?}: {e}")),
        Value::Number(n) => n.as_u64().map(Duration::from_millis).ok_or_else(|| format!("expected whole milliseconds, got {n}")),
        other => Err(format!("expected a duration such as \"5s\" or a number of milliseconds, got {}", kind(other))),
    }
}

/// At most `chars` characters of `text`, marked when cut. Error messages
/// carry excerpts of remote output, never all of it.
pub(crate) fn excerpt(text: &str, chars: usize) -> String {
    let text = text.trim();
    match text.char_indices().nth(chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn shape_errors_name_the_field() {
        let input = json!({"url": 3, "headers": {"a": 1}, "timeout": "soon"});
        let fields = object(&input, &["url", "headers", "timeout"]).unwrap();
        assert_eq!(string(fields, "url").unwrap_err().message(), "input.url: expected a string, got a number");
        assert_eq!(string(fields, "method").unwrap_err().message(), "input.method: missing");
        assert_eq!(string_map(fields, "headers").unwrap_err().message(), "input.headers.a: expected a string, got a number");
        assert!(duration(fields, "timeout").unwrap_err().message().starts_with("input.timeout: invalid duration \"soon\""));
        let err = object(&input, &["url"]).unwrap_err();
        assert!(err.message().starts_with("input.headers: unknown field"), "{err}");
        assert!(!err.is_retryable());
        assert!(object(&json!([1]), &["url"]).unwrap_err().message().contains("got an array"));
    }

    #[test]
    fn durations_are_strings_or_milliseconds() {
        assert_eq!(parse_duration(&json!("1.5s")), Ok(Duration::from_millis(1_500)));
        assert_eq!(parse_duration(&json!("250ms")), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration(&json!(2000)), Ok(Duration::from_secs(2)));
        assert!(parse_duration(&json!(-1)).is_err());
        assert!(parse_duration(&json!(true)).is_err());
    }

    #[test]
    fn excerpts_cut_on_character_boundaries() {
        assert_eq!(excerpt("  short ", 10), "short");
        assert_eq!(excerpt("ééééé", 3), "ééé…");
    }
}
