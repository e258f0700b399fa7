//! Words for JSON values in error messages, shared by every crate that
//! reports a value of the wrong kind (agent inputs, input templates), so
//! that they all name a kind the same way.

use serde_json::Value;

/// The kind of `value` with its article, as an error message names it:
/// "expected a string, got a number".
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::kind;

    #[test]
    fn every_kind_has_its_article() {
        let kinds: Vec<&str> = [json!(null), json!(true), json!(1), json!("x"), json!([]), json!({})].iter().map(kind).collect();
        assert_eq!(kinds, ["null", "a boolean", "a number", "a string", "an array", "an object"]);
    }
}
