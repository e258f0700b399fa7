//! A task's tags: `key=value` labels given at submission, never changed,
//! by which operators find and act on tasks (`rota tasks --tag`).
//!
//! The bounds keep a tag an index entry rather than a payload: a few short
//! labels per task, each stored once more in the store's tag index.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

/// How many tags a task may have.
pub const TAGS_PER_TASK_MAX: usize = 16;
/// The longest tag key, in bytes.
pub const TAG_KEY_BYTES_MAX: usize = 64;
/// The longest tag value, in bytes.
pub const TAG_VALUE_BYTES_MAX: usize = 256;

/// A task's tags, by key. Built only through [`Tags::new`] (or
/// deserialisation, which checks the same rules), so every value of this
/// type is within the bounds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Tags(BTreeMap<String, String>);

/// Why a tag or a set of tags was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagError {
    /// More than [`TAGS_PER_TASK_MAX`].
    #[error("a task has at most {max} tags, got {got}")]
    TooMany { got: usize, max: usize },
    /// The key is empty, too long, or has a character outside
    /// `A-Z a-z 0-9 _ - . / :`.
    #[error("tag key {key:?} must be 1 to {max} characters of A-Z, a-z, 0-9, '_', '-', '.', '/', ':'", max = TAG_KEY_BYTES_MAX)]
    Key { key: String },
    /// The value is too long or has a control character.
    #[error("the value of tag {key:?} must be at most {max} bytes without control characters", max = TAG_VALUE_BYTES_MAX)]
    Value { key: String },
    /// A `key=value` text without the `=`.
    #[error("expected a tag as key=value, got {text:?}")]
    Form { text: String },
    /// The same key twice.
    #[error("tag key {key:?} is given twice")]
    Repeated { key: String },
}

impl Tags {
    /// Tags from `pairs`, checked; a key given twice is refused rather
    /// than one of them kept silently.
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Result<Tags, TagError> {
        let mut tags = BTreeMap::new();
        for (key, value) in pairs {
            check_tag(&key, &value)?;
            if tags.contains_key(&key) {
                return Err(TagError::Repeated { key });
            }
            tags.insert(key, value);
        }
        if tags.len() > TAGS_PER_TASK_MAX {
            return Err(TagError::TooMany { got: tags.len(), max: TAGS_PER_TASK_MAX });
        }
        Ok(Tags(tags))
    }

    /// No tags.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The value of `key`, if the task has that tag.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Every tag, by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(key, value)| (key.as_str(), value.as_str()))
    }

    /// The tags as a JSON object (how both stores keep them with the task).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.0).expect("a map of strings serialises")
    }

    /// The tags a store kept with [`Tags::to_json`].
    pub fn from_json(text: &str) -> Result<Tags, String> {
        let map: BTreeMap<String, String> =
            serde_json::from_str(text).map_err(|err| format!("tags are not a JSON object of strings: {err}"))?;
        Tags::new(map).map_err(|err| err.to_string())
    }
}

impl<'de> Deserialize<'de> for Tags {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, String>::deserialize(deserializer)?;
        Tags::new(map).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Tags {
    /// `key=value key=value`, by key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (key, value)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{key}={value}")?;
        }
        Ok(())
    }
}

/// Checks one tag against the bounds.
pub fn check_tag(key: &str, value: &str) -> Result<(), TagError> {
    let key_ok = !key.is_empty()
        && key.len() <= TAG_KEY_BYTES_MAX
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/' | b':'));
    if !key_ok {
        return Err(TagError::Key { key: key.to_owned() });
    }
    if value.len() > TAG_VALUE_BYTES_MAX || value.chars().any(char::is_control) {
        return Err(TagError::Value { key: key.to_owned() });
    }
    Ok(())
}

/// One tag written `key=value` (as `--tag` takes it); the value may hold
/// further `=` signs and may be empty.
pub fn parse_tag(text: &str) -> Result<(String, String), TagError> {
    let (key, value) = text.split_once('=').ok_or_else(|| TagError::Form { text: text.to_owned() })?;
    check_tag(key, value)?;
    Ok((key.to_owned(), value.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(key: &str, value: &str) -> (String, String) {
        (key.to_owned(), value.to_owned())
    }

    #[test]
    fn tags_within_the_bounds_are_kept_by_key() {
        let tags = Tags::new([pair("region", "eu-west"), pair("customer", "c-42")]).unwrap();
        assert_eq!(tags.to_string(), "customer=c-42 region=eu-west");
        assert_eq!(tags.get("region"), Some("eu-west"));
        assert_eq!(Tags::from_json(&tags.to_json()).unwrap(), tags);
    }

    #[test]
    fn each_bound_is_enforced_and_named() {
        let many = (0..=TAGS_PER_TASK_MAX).map(|i| pair(&format!("k{i}"), "v"));
        assert_eq!(Tags::new(many), Err(TagError::TooMany { got: TAGS_PER_TASK_MAX + 1, max: TAGS_PER_TASK_MAX }));
        assert!(matches!(Tags::new([pair("", "v")]), Err(TagError::Key { .. })));
        assert!(matches!(Tags::new([pair(&"k".repeat(TAG_KEY_BYTES_MAX + 1), "v")]), Err(TagError::Key { .. })));
        assert!(matches!(Tags::new([pair("has space", "v")]), Err(TagError::Key { .. })));
        assert!(matches!(Tags::new([pair("k", &"v".repeat(TAG_VALUE_BYTES_MAX + 1))]), Err(TagError::Value { .. })));
        assert!(matches!(Tags::new([pair("k", "line\nbreak")]), Err(TagError::Value { .. })));
        assert!(Tags::new([pair(&"k".repeat(TAG_KEY_BYTES_MAX), &"v".repeat(TAG_VALUE_BYTES_MAX))]).is_ok());
        assert_eq!(Tags::new([pair("k", "1"), pair("k", "2")]), Err(TagError::Repeated { key: "k".into() }));
    }

    #[test]
    fn a_tag_is_written_key_equals_value() {
        assert_eq!(parse_tag("env=prod"), Ok(pair("env", "prod")));
        assert_eq!(parse_tag("query=a=b"), Ok(pair("query", "a=b")));
        assert_eq!(parse_tag("empty="), Ok(pair("empty", "")));
        assert_eq!(parse_tag("no-equals"), Err(TagError::Form { text: "no-equals".into() }));
    }

    #[test]
    fn deserialising_checks_the_bounds() {
        assert!(serde_json::from_str::<Tags>(r#"{"ok": "yes"}"#).is_ok());
        let err = serde_json::from_str::<Tags>(r#"{"bad key": "x"}"#).unwrap_err().to_string();
        assert!(err.contains("tag key"), "{err}");
    }
}
