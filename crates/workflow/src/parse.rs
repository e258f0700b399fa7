//! Reading a definition from YAML or JSON text.
//!
//! serde-saphyr reads the text into a [`Node`] tree in which every node,
//! mapping keys included, carries its line and column. The decoder then
//! walks that tree by hand instead of deriving `Deserialize` for the
//! definition: a derived decoder stops at the first problem, and the CLI's
//! `rota validate` must report all of them, each at the node it is about.
//! While walking, it records every node's position under its JSON pointer,
//! so that validation (shared with the builder) can place its diagnostics.

use std::fmt;
use std::time::Duration;

use rota_model::{ExhaustedPolicy, FailureClass, FailureKind, RateLimit, RetryPolicy, RetryPolicyError};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Number, Value};

use crate::agent::AgentCatalog;
use crate::definition::Workflow;
use crate::diagnostic::{Diagnostic, Diagnostics, FileLocator, Pos, Positions, child};
use crate::spec::{CompensateSpec, ConcurrencySpec, ScheduleSpec, Spec, StepSpec};
use crate::validate::validate_into;

/// The largest definition text accepted, in bytes. A definition is a
/// handful of steps; anything near this size is a mistake, and the bound
/// keeps a bad file from costing much.
pub const DEFINITION_BYTES_MAX: usize = 1 << 20;

/// The deepest nesting of lists and mappings a definition may have. Every
/// level costs stack in the parser and in each walk over the tree; a
/// definition needs a handful, and a few dozen would overflow a thread's
/// stack in a debug build.
pub const NESTING_MAX: usize = 32;

const WORKFLOW_FIELDS: &[&str] = &[
    "name",
    "version",
    "deadline",
    "warn_after",
    "retention",
    "on_exhausted",
    "max_failures",
    "priority",
    "concurrency",
    "max_in_flight",
    "steps",
    "schedules",
];
const CONCURRENCY_FIELDS: &[&str] = &["key", "limit"];
const SCHEDULE_FIELDS: &[&str] = &["name", "cron", "timezone", "input", "overlap", "catch_up"];
const STEP_FIELDS: &[&str] = &[
    "name",
    "agent",
    "wait",
    "workflow",
    "version",
    "when",
    "for_each",
    "max_parallel",
    "callback",
    "with",
    "timeout",
    "warn_after",
    "retry",
    "rate_limit",
    "compensate",
    "depends_on",
];
const RATE_LIMIT_FIELDS: &[&str] = &["rate", "burst"];
const RETRY_FIELDS: &[&str] = &["attempts", "backoff", "max_backoff", "multiplier", "jitter", "non_retryable"];
const COMPENSATE_FIELDS: &[&str] = &["agent", "with", "timeout", "retry"];

/// Parses and validates one workflow definition.
///
/// `source` names the text in diagnostics (usually its file name); its
/// extension also picks the format: `.json` is read as JSON, `.yaml` and
/// `.yml` as YAML, and anything else as JSON when it starts with `{` and is
/// valid JSON, else as YAML. (JSON is YAML too; reading it as JSON first
/// gives JSON's own error messages, and refuses what YAML would tolerate,
/// such as trailing commas.)
///
/// Every problem is reported, each as `FILE:LINE:COL: message` at the node
/// it is about, except that a syntax error stops the parse.
pub fn parse(source: &str, text: &str, agents: &AgentCatalog) -> Result<Workflow, Diagnostics> {
    parse_with_positions(source, text, agents).0
}

/// [`parse`], also returning the positions of the nodes (empty after a
/// syntax error), so that callers can place diagnostics of their own.
pub(crate) fn parse_with_positions(source: &str, text: &str, agents: &AgentCatalog) -> (Result<Workflow, Diagnostics>, Positions) {
    let mut decoder = Decoder { file: source, problems: Vec::new(), positions: Positions::default() };
    if text.len() > DEFINITION_BYTES_MAX {
        let message = format!("a definition may be at most {DEFINITION_BYTES_MAX} bytes, this one is {}", text.len());
        decoder.problem(Pos { line: 1, column: 1 }, message);
        return (Err(Diagnostics::from(decoder.problems)), decoder.positions);
    }
    let root = match read_tree(source, text) {
        Ok(root) => root,
        Err(problem) => return (Err(Diagnostics::from(vec![problem])), decoder.positions),
    };
    let spec = decoder.workflow(&root);
    let Decoder { problems: mut found, positions, .. } = decoder;
    let workflow = validate_into(spec, &FileLocator { file: source, positions: &positions, text }, Some(agents), &mut found);
    let result = match workflow {
        Some(workflow) if found.is_empty() => Ok(workflow),
        _ => Err(Diagnostics::from(found).sorted()),
    };
    (result, positions)
}

/// A YAML node with the position where it starts (for a mapping entry's
/// key, where the key starts).
#[derive(Debug)]
struct Node {
    pos: Pos,
    value: NodeValue,
}

#[derive(Debug)]
enum NodeValue {
    Null,
    Bool(bool),
    Signed(i64),
    Unsigned(u64),
    Float(f64),
    String(String),
    List(Vec<Node>),
    Mapping(Vec<(Node, Node)>),
}

impl NodeValue {
    /// What kind of value this is, for "found ..." in messages.
    fn kind(&self) -> &'static str {
        match self {
            NodeValue::Null => "null",
            NodeValue::Bool(_) => "a boolean",
            NodeValue::Signed(_) | NodeValue::Unsigned(_) => "an integer",
            NodeValue::Float(_) => "a number",
            NodeValue::String(_) => "a string",
            NodeValue::List(_) => "a list",
            NodeValue::Mapping(_) => "a mapping",
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // `Spanned` asks serde-saphyr for the node's location, then reads
        // the value itself through `NodeValue`, recursively.
        let spanned = serde_saphyr::Spanned::<NodeValue>::deserialize(deserializer)?;
        let pos = Pos {
            line: u32::try_from(spanned.referenced.line()).unwrap_or(u32::MAX),
            column: u32::try_from(spanned.referenced.column()).unwrap_or(u32::MAX),
        };
        Ok(Node { pos, value: spanned.value })
    }
}

impl<'de> Deserialize<'de> for NodeValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = NodeValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_unit<E>(self) -> Result<NodeValue, E> {
        Ok(NodeValue::Null)
    }
    fn visit_none<E>(self) -> Result<NodeValue, E> {
        Ok(NodeValue::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<NodeValue, E> {
        Ok(NodeValue::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<NodeValue, E> {
        Ok(NodeValue::Signed(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<NodeValue, E> {
        Ok(NodeValue::Unsigned(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<NodeValue, E> {
        Ok(NodeValue::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<NodeValue, E> {
        Ok(NodeValue::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<NodeValue, E> {
        Ok(NodeValue::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NodeValue, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(NodeValue::List(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NodeValue, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Node>()? {
            let value = map.next_value::<Node>()?;
            entries.push((key, value));
        }
        Ok(NodeValue::Mapping(entries))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    Yaml,
    Json,
    Unknown,
}

fn format_of(source: &str) -> Format {
    let extension = std::path::Path::new(source).extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("json") => Format::Json,
        Some("yaml" | "yml") => Format::Yaml,
        _ => Format::Unknown,
    }
}

/// Reads `text` into a positioned tree, or says why it is not valid YAML
/// (or JSON).
fn read_tree(source: &str, text: &str) -> Result<Node, Diagnostic> {
    let format = format_of(source);
    let looks_like_json = format == Format::Json || (format == Format::Unknown && text.trim_start().starts_with('{'));
    if looks_like_json && let Err(err) = serde_json::from_str::<Value>(text) {
        // Outside a `.json` file, text that merely starts with `{` may be a
        // YAML flow mapping: only JSON's verdict on a `.json` file is final.
        if format == Format::Json || read_yaml(source, text).is_err() {
            return Err(json_problem(source, &err));
        }
    }
    read_yaml(source, text)
}

fn read_yaml(source: &str, text: &str) -> Result<Node, Diagnostic> {
    let mut budget = serde_saphyr::budget::Budget::default();
    budget.max_depth = NESTING_MAX;
    let options = serde_saphyr::options! {
        // YAML 1.2 booleans only: `y`, `on` and `no` stay strings, as in JSON.
        strict_booleans: true,
        with_snippet: false,
        budget: Some(budget),
    };
    serde_saphyr::from_str_with_options::<Node>(text, options).map_err(|err| {
        let (line, column) = err.location().map(|l| (l.line(), l.column())).unwrap_or((0, 0));
        let rendered = err.render_with_formatter(&serde_saphyr::UserMessageFormatter);
        let message = rendered.strip_suffix(&format!(" at line {line}, column {column}")).unwrap_or(&rendered);
        // The parser's words for its two nesting limits, said plainly.
        let too_deep = message.contains("limits breached: Depth") || message.contains("recursion limit exceeded");
        let message =
            if too_deep { &format!("nested too deep: lists and mappings may nest at most {NESTING_MAX} levels") } else { message };
        Diagnostic {
            file: source.to_owned(),
            line: u32::try_from(line).unwrap_or(u32::MAX),
            column: u32::try_from(column).unwrap_or(u32::MAX),
            message: message.to_owned(),
        }
    })
}

fn json_problem(source: &str, err: &serde_json::Error) -> Diagnostic {
    let rendered = err.to_string();
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    let message = rendered.strip_suffix(&suffix).unwrap_or(&rendered);
    Diagnostic {
        file: source.to_owned(),
        line: u32::try_from(err.line()).unwrap_or(u32::MAX),
        column: u32::try_from(err.column()).unwrap_or(u32::MAX),
        message: format!("invalid JSON: {message}"),
    }
}

/// Walks the tree, building a [`Spec`] from what is usable and reporting
/// the rest.
struct Decoder<'a> {
    file: &'a str,
    problems: Vec<Diagnostic>,
    positions: Positions,
}

/// A mapping entry with a string key.
struct Field<'n> {
    key: &'n str,
    value: &'n Node,
}

impl Decoder<'_> {
    fn problem(&mut self, pos: Pos, message: String) {
        self.problems.push(Diagnostic { file: self.file.to_owned(), line: pos.line, column: pos.column, message });
    }

    fn record(&mut self, pointer: String, value: Pos) {
        self.positions.insert(pointer, value);
    }

    /// The entries of a mapping with known keys, each position recorded.
    /// Reports a node that is not a mapping, keys that are not strings and
    /// unknown fields. `prefix` starts messages ("step `a`: "), `inside`
    /// ends them (" in `retry`").
    fn fields<'n>(&mut self, node: &'n Node, pointer: &str, prefix: &str, inside: &str, allowed: &[&str]) -> Option<Vec<Field<'n>>> {
        let NodeValue::Mapping(entries) = &node.value else {
            let what = if inside.is_empty() { "a mapping".to_owned() } else { format!("a mapping{inside}") };
            self.problem(node.pos, format!("{prefix}expected {what}, found {}", node.value.kind()));
            return None;
        };
        let mut fields = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            let NodeValue::String(name) = &key.value else {
                self.problem(key.pos, format!("{prefix}field names must be strings, found {}{inside}", key.value.kind()));
                continue;
            };
            if !allowed.contains(&name.as_str()) {
                self.problem(
                    key.pos,
                    format!("{prefix}unknown field `{}`{inside} (expected one of: {})", name.escape_debug(), allowed.join(", ")),
                );
                continue;
            }
            self.record(child(pointer, name), value.pos);
            fields.push(Field { key: name, value });
        }
        Some(fields)
    }

    fn require(&mut self, node: &Node, fields: &[Field<'_>], required: &[&str], prefix: &str, inside: &str) {
        for name in required {
            if !fields.iter().any(|field| field.key == *name) {
                self.problem(node.pos, format!("{prefix}missing required field `{name}`{inside}"));
            }
        }
    }

    fn string(&mut self, node: &Node, prefix: &str, what: &str) -> Option<String> {
        match &node.value {
            NodeValue::String(s) => Some(s.clone()),
            other => {
                self.problem(node.pos, format!("{prefix}`{what}` must be a string, found {}", other.kind()));
                None
            }
        }
    }

    fn boolean(&mut self, node: &Node, prefix: &str, what: &str) -> Option<bool> {
        match &node.value {
            NodeValue::Bool(b) => Some(*b),
            other => {
                self.problem(node.pos, format!("{prefix}`{what}` must be true or false, found {}", other.kind()));
                None
            }
        }
    }

    fn unsigned(&mut self, node: &Node, prefix: &str, what: &str) -> Option<u32> {
        let number = match &node.value {
            NodeValue::Unsigned(n) => Some(*n),
            NodeValue::Signed(n) => u64::try_from(*n).ok(),
            other => {
                self.problem(node.pos, format!("{prefix}`{what}` must be an integer, found {}", other.kind()));
                return None;
            }
        };
        let in_range = number.and_then(|n| u32::try_from(n).ok());
        if in_range.is_none() {
            let found = match &node.value {
                NodeValue::Signed(n) => n.to_string(),
                NodeValue::Unsigned(n) => n.to_string(),
                _ => unreachable!("only integers get here"),
            };
            self.problem(node.pos, format!("{prefix}`{what}` must be between 0 and {}, found {found}", u32::MAX));
        }
        in_range
    }

    fn signed(&mut self, node: &Node, prefix: &str, what: &str) -> Option<i64> {
        match &node.value {
            NodeValue::Signed(n) => Some(*n),
            NodeValue::Unsigned(n) => Some(i64::try_from(*n).unwrap_or(i64::MAX)),
            other => {
                self.problem(node.pos, format!("{prefix}`{what}` must be an integer, found {}", other.kind()));
                None
            }
        }
    }

    fn float(&mut self, node: &Node, prefix: &str, what: &str) -> Option<f64> {
        match &node.value {
            NodeValue::Float(n) => Some(*n),
            // Integers are numbers too; precision loss above 2^53 does not
            // matter for a multiplier or a fraction.
            #[allow(clippy::cast_precision_loss)]
            NodeValue::Unsigned(n) => Some(*n as f64),
            #[allow(clippy::cast_precision_loss)]
            NodeValue::Signed(n) => Some(*n as f64),
            other => {
                self.problem(node.pos, format!("{prefix}`{what}` must be a number, found {}", other.kind()));
                None
            }
        }
    }

    fn duration(&mut self, node: &Node, prefix: &str, what: &str) -> Option<Duration> {
        let NodeValue::String(text) = &node.value else {
            let message = format!("{prefix}`{what}` must be a duration such as \"5s\" or \"100ms\", found {}", node.value.kind());
            self.problem(node.pos, message);
            return None;
        };
        match humantime::parse_duration(text) {
            Ok(duration) => Some(duration),
            Err(err) => {
                self.problem(node.pos, format!("{prefix}invalid duration {text:?} for `{what}`: {err}"));
                None
            }
        }
    }

    /// Converts a node to JSON, recording the position of every node below
    /// `pointer` so that template problems can point inside it.
    fn json(&mut self, node: &Node, pointer: &str, prefix: &str) -> Value {
        match &node.value {
            NodeValue::Null => Value::Null,
            NodeValue::Bool(b) => Value::Bool(*b),
            NodeValue::Signed(n) => Value::from(*n),
            NodeValue::Unsigned(n) => Value::from(*n),
            NodeValue::Float(n) => match Number::from_f64(*n) {
                Some(n) => Value::Number(n),
                None => {
                    self.problem(node.pos, format!("{prefix}{n} cannot be represented in JSON"));
                    Value::Null
                }
            },
            NodeValue::String(s) => Value::String(s.clone()),
            NodeValue::List(items) => Value::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| {
                        let at = child(pointer, &i.to_string());
                        self.record(at.clone(), item.pos);
                        self.json(item, &at, prefix)
                    })
                    .collect(),
            ),
            NodeValue::Mapping(entries) => {
                let mut object = serde_json::Map::with_capacity(entries.len());
                for (key, value) in entries {
                    // JSON keys are strings; YAML users write `200: ok`, so
                    // scalar keys become their text.
                    let key_text = match &key.value {
                        NodeValue::String(s) => s.clone(),
                        NodeValue::Bool(b) => b.to_string(),
                        NodeValue::Signed(n) => n.to_string(),
                        NodeValue::Unsigned(n) => n.to_string(),
                        NodeValue::Float(n) => n.to_string(),
                        other => {
                            self.problem(key.pos, format!("{prefix}keys in `with` must be strings or numbers, found {}", other.kind()));
                            continue;
                        }
                    };
                    let at = child(pointer, &key_text);
                    self.record(at.clone(), value.pos);
                    let value = self.json(value, &at, prefix);
                    object.insert(key_text, value);
                }
                Value::Object(object)
            }
        }
    }

    fn workflow(&mut self, root: &Node) -> Spec {
        let mut spec = Spec::default();
        if matches!(root.value, NodeValue::Null) {
            self.problem(root.pos, "the definition is empty: expected a mapping with `name`, `version` and `steps`".into());
            return spec;
        }
        if !matches!(root.value, NodeValue::Mapping(_)) {
            let message =
                format!("a workflow definition must be a mapping with `name`, `version` and `steps`, found {}", root.value.kind());
            self.problem(root.pos, message);
            return spec;
        }
        self.record(String::new(), root.pos);
        let Some(fields) = self.fields(root, "", "", "", WORKFLOW_FIELDS) else { return spec };
        self.require(root, &fields, &["name", "version", "steps"], "", "");
        for Field { key, value } in fields {
            match key {
                "name" => spec.name = self.string(value, "", key),
                "version" => spec.version = self.unsigned(value, "", key),
                "deadline" => spec.deadline = self.duration(value, "", key),
                "warn_after" => spec.warn_after = self.duration(value, "", key),
                "retention" => spec.retention = self.duration(value, "", key),
                "on_exhausted" => spec.on_exhausted = self.exhausted(value),
                "max_failures" => spec.max_failures = self.unsigned(value, "", key),
                "priority" => spec.priority = self.signed(value, "", key),
                "concurrency" => spec.concurrency = self.concurrency(value),
                "max_in_flight" => spec.max_in_flight = self.unsigned(value, "", key),
                "steps" => spec.steps = self.steps(value),
                "schedules" => spec.schedules = self.schedules(value),
                _ => unreachable!("`fields` only returns allowed keys"),
            }
        }
        spec
    }

    fn concurrency(&mut self, node: &Node) -> Option<ConcurrencySpec> {
        let fields = self.fields(node, "/concurrency", "", " in `concurrency`", CONCURRENCY_FIELDS)?;
        self.require(node, &fields, &["key", "limit"], "", " in `concurrency`");
        let mut spec = ConcurrencySpec::default();
        for Field { key, value } in fields {
            match key {
                "key" => spec.key = self.string(value, "", "concurrency.key"),
                "limit" => spec.limit = self.unsigned(value, "", "concurrency.limit"),
                _ => unreachable!("`fields` only returns allowed keys"),
            }
        }
        Some(spec)
    }

    fn schedules(&mut self, node: &Node) -> Option<Vec<ScheduleSpec>> {
        let NodeValue::List(items) = &node.value else {
            self.problem(node.pos, format!("`schedules` must be a list of schedules, found {}", node.value.kind()));
            return None;
        };
        Some(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    let at = format!("/schedules/{i}");
                    self.record(at.clone(), item.pos);
                    self.schedule(item, i, &at)
                })
                .collect(),
        )
    }

    fn schedule(&mut self, node: &Node, index: usize, at: &str) -> ScheduleSpec {
        let mut spec = ScheduleSpec::default();
        let name = match &node.value {
            NodeValue::Mapping(entries) => entries.iter().find_map(|(key, value)| match (&key.value, &value.value) {
                (NodeValue::String(key), NodeValue::String(name)) if key == "name" => Some(name.as_str()),
                _ => None,
            }),
            _ => None,
        };
        let prefix = match name {
            Some(name) => format!("schedule `{}`: ", name.escape_debug()),
            None => format!("schedule {}: ", index + 1),
        };
        let Some(fields) = self.fields(node, at, &prefix, "", SCHEDULE_FIELDS) else { return spec };
        self.require(node, &fields, &["name", "cron"], &prefix, "");
        for Field { key, value } in fields {
            match key {
                "name" => spec.name = self.string(value, &prefix, key),
                "cron" => spec.cron = self.string(value, &prefix, key),
                "timezone" => spec.timezone = self.string(value, &prefix, key),
                "input" => spec.input = Some(self.json(value, &child(at, key), &prefix)),
                "overlap" => spec.overlap = self.string(value, &prefix, key),
                "catch_up" => spec.catch_up = self.string(value, &prefix, key),
                _ => unreachable!("`fields` only returns allowed keys"),
            }
        }
        spec
    }

    fn exhausted(&mut self, node: &Node) -> Option<ExhaustedPolicy> {
        match &node.value {
            NodeValue::String(s) if s == "error" => Some(ExhaustedPolicy::Error),
            NodeValue::String(s) if s == "compensate" => Some(ExhaustedPolicy::Compensate),
            NodeValue::String(s) => {
                self.problem(node.pos, format!("`on_exhausted` must be `error` or `compensate`, found `{s}`"));
                None
            }
            other => {
                self.problem(node.pos, format!("`on_exhausted` must be `error` or `compensate`, found {}", other.kind()));
                None
            }
        }
    }

    fn steps(&mut self, node: &Node) -> Option<Vec<StepSpec>> {
        let NodeValue::List(items) = &node.value else {
            self.problem(node.pos, format!("`steps` must be a list of steps, found {}", node.value.kind()));
            return None;
        };
        // Every item keeps its index, even one that is not a mapping, so
        // that `/steps/N` means the same in the spec and in the positions.
        Some(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    let at = format!("/steps/{i}");
                    self.record(at.clone(), item.pos);
                    self.step(item, i, &at)
                })
                .collect(),
        )
    }

    fn step(&mut self, node: &Node, index: usize, at: &str) -> StepSpec {
        let mut spec = StepSpec::default();
        // Messages name the step, so find its name before anything else.
        let name = match &node.value {
            NodeValue::Mapping(entries) => entries.iter().find_map(|(key, value)| match (&key.value, &value.value) {
                (NodeValue::String(key), NodeValue::String(name)) if key == "name" => Some(name.as_str()),
                _ => None,
            }),
            _ => None,
        };
        let prefix = match name {
            Some(name) => format!("step `{}`: ", name.escape_debug()),
            None => format!("step {}: ", index + 1),
        };
        let Some(fields) = self.fields(node, at, &prefix, "", STEP_FIELDS) else {
            spec.unreadable = true;
            return spec;
        };
        // `agent`, or `wait` instead, is required too: validation says so,
        // for the builder's steps as well.
        self.require(node, &fields, &["name"], &prefix, "");
        for Field { key, value } in fields {
            let field_at = child(at, key);
            match key {
                "name" => spec.name = self.string(value, &prefix, key),
                "agent" => spec.agent = self.string(value, &prefix, key),
                "wait" => spec.wait = self.string(value, &prefix, key),
                "workflow" => spec.workflow = self.string(value, &prefix, key),
                "version" => spec.workflow_version = self.unsigned(value, &prefix, key),
                "when" => spec.when = self.string(value, &prefix, key),
                "for_each" => spec.for_each = self.string(value, &prefix, key),
                "max_parallel" => spec.max_parallel = self.unsigned(value, &prefix, key),
                "callback" => spec.callback = self.boolean(value, &prefix, key),
                "with" => spec.with = self.json(value, &field_at, &prefix),
                "timeout" => spec.timeout = self.duration(value, &prefix, key),
                "warn_after" => spec.warn_after = self.duration(value, &prefix, key),
                "retry" => spec.retry = self.retry(value, &field_at, &prefix, "retry"),
                "rate_limit" => spec.rate_limit = self.rate_limit(value, &field_at, &prefix),
                "compensate" => spec.compensate = self.compensate(value, &field_at, &prefix),
                "depends_on" => spec.depends_on = self.depends_on(value, &field_at, &prefix),
                _ => unreachable!("`fields` only returns allowed keys"),
            }
        }
        spec
    }

    /// A `rate_limit`: `20/s`, or `{ rate: 20/s, burst: 5 }`.
    fn rate_limit(&mut self, node: &Node, at: &str, prefix: &str) -> Option<RateLimit> {
        let (rate, burst) = match &node.value {
            NodeValue::String(_) => (node, None),
            NodeValue::Mapping(_) => {
                let fields = self.fields(node, at, prefix, " in `rate_limit`", RATE_LIMIT_FIELDS)?;
                self.require(node, &fields, &["rate"], prefix, " in `rate_limit`");
                let rate = fields.iter().find(|f| f.key == "rate")?.value;
                (rate, fields.iter().find(|f| f.key == "burst").map(|f| f.value))
            }
            other => {
                let message =
                    format!("{prefix}`rate_limit` must be a rate such as \"20/s\" or a mapping {{ rate, burst }}, found {}", other.kind());
                self.problem(node.pos, message);
                return None;
            }
        };
        let what = if burst.is_some() || !matches!(node.value, NodeValue::String(_)) { "rate_limit.rate" } else { "rate_limit" };
        let text = self.string(rate, prefix, what)?;
        let limit = match text.parse::<RateLimit>() {
            Ok(limit) => limit,
            Err(err) => {
                self.problem(rate.pos, format!("{prefix}`{what}`: {err}"));
                return None;
            }
        };
        let Some(burst_node) = burst else { return Some(limit) };
        let burst = self.unsigned(burst_node, prefix, "rate_limit.burst")?;
        match limit.with_burst(burst) {
            Ok(limit) => Some(limit),
            Err(err) => {
                self.problem(burst_node.pos, format!("{prefix}`rate_limit.burst`: {err}"));
                None
            }
        }
    }

    /// `what` is the field's name in messages: `retry` or `compensate.retry`.
    fn retry(&mut self, node: &Node, at: &str, prefix: &str, what: &str) -> Option<RetryPolicy> {
        let fields = self.fields(node, at, prefix, &format!(" in `{what}`"), RETRY_FIELDS)?;
        let defaults = RetryPolicy::default();
        let (mut attempts, mut backoff, mut backoff_max) =
            (Some(defaults.attempts_max()), Some(defaults.backoff_initial()), Some(defaults.backoff_max()));
        let (mut multiplier, mut jitter, mut non_retryable) = (None, None, Vec::new());
        let mut positions = [None; RETRY_FIELDS.len()];
        for Field { key, value } in &fields {
            let name = format!("{what}.{key}");
            match *key {
                "attempts" => attempts = self.unsigned(value, prefix, &name),
                "backoff" => backoff = self.duration(value, prefix, &name),
                "max_backoff" => backoff_max = self.duration(value, prefix, &name),
                "multiplier" => multiplier = Some(self.float(value, prefix, &name)),
                "jitter" => jitter = Some(self.float(value, prefix, &name)),
                "non_retryable" => non_retryable = self.non_retryable(value, &child(at, key), prefix, &name),
                _ => unreachable!("`fields` only returns allowed keys"),
            }
            let slot = RETRY_FIELDS.iter().position(|f| f == key).expect("allowed key");
            positions[slot] = Some(value.pos);
        }
        // A field of the wrong type was reported; the policy is unusable.
        let (attempts, backoff, backoff_max) = (attempts?, backoff?, backoff_max?);
        // Not given: keep the model's default. Given but of the wrong type:
        // already reported.
        let multiplier = match multiplier {
            Some(given) => Some(given?),
            None => None,
        };
        let jitter = match jitter {
            Some(given) => Some(given?),
            None => None,
        };
        let mut policy = RetryPolicy::new(attempts, backoff, backoff_max);
        if let Some(multiplier) = multiplier {
            policy = policy.and_then(|policy| policy.with_multiplier(multiplier));
        }
        if let Some(jitter) = jitter {
            policy = policy.and_then(|policy| policy.with_jitter_fraction(jitter));
        }
        match policy {
            Ok(policy) => Some(policy.with_non_retryable(non_retryable)),
            Err(err) => {
                // Point at the field the error is about, or at `retry`
                // itself when that field took its default.
                let slot = match err {
                    RetryPolicyError::Attempts(_) => 0,
                    RetryPolicyError::CapBelowInitial { .. } if positions[2].is_some() => 2,
                    RetryPolicyError::CapBelowInitial { .. } => 1,
                    RetryPolicyError::Multiplier(_) => 3,
                    RetryPolicyError::Jitter(_) => 4,
                    RetryPolicyError::Status(_) => 5,
                };
                self.problem(positions[slot].unwrap_or(node.pos), format!("{prefix}invalid retry policy: {err}"));
                None
            }
        }
    }

    /// A `non_retryable` list: HTTP statuses as numbers, failure kinds as
    /// names. Every bad entry is reported at its own position; the good
    /// ones are kept.
    fn non_retryable(&mut self, node: &Node, at: &str, prefix: &str, what: &str) -> Vec<FailureClass> {
        let NodeValue::List(items) = &node.value else {
            self.problem(
                node.pos,
                format!("{prefix}`{what}` must be a list of HTTP statuses and failure kinds, found {}", node.value.kind()),
            );
            return Vec::new();
        };
        let mut classes = Vec::with_capacity(items.len());
        for item in items {
            let class = match &item.value {
                NodeValue::Unsigned(n) => u16::try_from(*n)
                    .ok()
                    .and_then(|n| FailureClass::status(n).ok())
                    .ok_or_else(|| format!("`{what}`: HTTP status must be between 100 and 599, found {n}")),
                NodeValue::Signed(n) => Err(format!("`{what}`: HTTP status must be between 100 and 599, found {n}")),
                NodeValue::String(name) => FailureKind::parse(name).map(FailureClass::Kind).ok_or_else(|| {
                    let known: Vec<&str> = FailureKind::ALL.iter().map(|k| k.as_str()).collect();
                    format!(
                        "`{what}`: unknown failure kind `{}` (expected an HTTP status or one of: {})",
                        name.escape_debug(),
                        known.join(", ")
                    )
                }),
                other => Err(format!("`{what}` entries must be HTTP statuses or failure kinds, found {}", other.kind())),
            };
            match class {
                Ok(class) => {
                    self.record(child(at, &classes.len().to_string()), item.pos);
                    classes.push(class);
                }
                Err(message) => self.problem(item.pos, format!("{prefix}{message}")),
            }
        }
        classes
    }

    fn compensate(&mut self, node: &Node, at: &str, prefix: &str) -> Option<CompensateSpec> {
        let inside = " in `compensate`";
        let fields = self.fields(node, at, prefix, inside, COMPENSATE_FIELDS)?;
        self.require(node, &fields, &["agent"], prefix, inside);
        let mut spec = CompensateSpec::default();
        for Field { key, value } in fields {
            let field_at = child(at, key);
            let name = format!("compensate.{key}");
            match key {
                "agent" => spec.agent = self.string(value, prefix, &name),
                "with" => spec.with = self.json(value, &field_at, prefix),
                "timeout" => spec.timeout = self.duration(value, prefix, &name),
                "retry" => spec.retry = self.retry(value, &field_at, prefix, &name),
                _ => unreachable!("`fields` only returns allowed keys"),
            }
        }
        Some(spec)
    }

    fn depends_on(&mut self, node: &Node, at: &str, prefix: &str) -> Option<Vec<String>> {
        let NodeValue::List(items) = &node.value else {
            self.problem(node.pos, format!("{prefix}`depends_on` must be a list of step names, found {}", node.value.kind()));
            return None;
        };
        let mut names = Vec::with_capacity(items.len());
        for item in items {
            match &item.value {
                NodeValue::String(name) => {
                    // Recorded under the index the entry gets in the spec,
                    // which skips entries that are not strings.
                    self.record(child(at, &names.len().to_string()), item.pos);
                    names.push(name.clone());
                }
                other => self.problem(item.pos, format!("{prefix}`depends_on` entries must be step names, found {}", other.kind())),
            }
        }
        Some(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::AgentName;
    use rota_model::{CatchUp, Overlap, Priority};

    /// Parses `text` as `wf.yaml` with the built-in agents and `ledger`, and
    /// returns the diagnostics as displayed (empty when it is valid).
    fn check(text: &str) -> Vec<String> {
        check_as("wf.yaml", text)
    }

    fn check_as(source: &str, text: &str) -> Vec<String> {
        let agents = AgentCatalog::builtin().with(AgentName::new("ledger").unwrap());
        match parse(source, text, &agents) {
            Ok(_) => Vec::new(),
            Err(problems) => problems.iter().map(ToString::to_string).collect(),
        }
    }

    fn valid(text: &str) -> Workflow {
        parse("wf.yaml", text, &AgentCatalog::builtin()).unwrap_or_else(|problems| panic!("{problems}"))
    }

    const MINIMAL: &str = "name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n";

    #[test]
    fn a_minimal_definition_takes_every_default() {
        let workflow = valid(MINIMAL);
        assert_eq!(workflow.name().as_str(), "w");
        assert_eq!(workflow.version(), 1);
        assert_eq!(workflow.deadline(), crate::DEADLINE_DEFAULT);
        assert_eq!(workflow.on_exhausted(), ExhaustedPolicy::Error);
        assert_eq!(workflow.max_failures(), crate::MAX_FAILURES_DEFAULT);
        let step = &workflow.steps()[0];
        assert_eq!((step.name().as_str(), step.agent().map(AgentName::as_str).unwrap_or_default()), ("a", "http"));
        assert_eq!(step.with(), &Value::Null);
        assert_eq!(step.timeout(), crate::TIMEOUT_DEFAULT);
        assert_eq!(step.retry(), &RetryPolicy::default());
        assert!(step.compensate().is_none());
        assert!(step.depends_on().is_empty());
    }

    #[test]
    fn schedules_are_read_with_their_defaults_and_kept_out_of_the_version() {
        let text = format!(
            "{MINIMAL}schedules:\n  - name: nightly\n    cron: \"0 30 2 * * *\"\n    timezone: Europe/Paris\n    input: {{ full: true }}\n\
             \x20   overlap: buffer-one\n    catch_up: all\n  - name: often\n    cron: \"*/10 * * * * *\"\n"
        );
        let workflow = valid(&text);
        let [nightly, often] = workflow.schedules() else { panic!("two schedules") };
        assert_eq!((nightly.name.as_str(), nightly.cron.as_str(), nightly.timezone.as_str()), ("nightly", "0 30 2 * * *", "Europe/Paris"));
        assert_eq!(
            (nightly.input.clone(), nightly.overlap, nightly.catch_up),
            (serde_json::json!({"full": true}), Overlap::BufferOne, CatchUp::All)
        );
        assert_eq!((often.timezone.as_str(), often.input.clone()), ("UTC", serde_json::json!({})));
        assert_eq!((often.overlap, often.catch_up), (Overlap::Skip, CatchUp::Latest), "the defaults");
        assert_eq!(workflow.to_json(), valid(MINIMAL).to_json(), "schedules are not part of the stored version");
    }

    #[test]
    fn bad_schedules_are_reported_at_their_field() {
        let text = format!(
            "{MINIMAL}schedules:\n  - name: a\n    cron: \"61 * * * *\"\n  - name: b\n    cron: \"* * * * *\"\n    timezone: Mars/Olympus\n\
             \x20 - name: a\n    cron: \"* * * * *\"\n    overlap: sometimes\n  - cron: \"* * * * *\"\n    color: red\n"
        );
        assert_eq!(
            check(&text),
            [
                "wf.yaml:8:11: schedule `a`: invalid cron expression \"61 * * * *\": Component error: Number out of bounds.",
                "wf.yaml:11:15: schedule `b`: unknown time zone \"Mars/Olympus\": expected an IANA name such as UTC, Europe/Paris or America/New_York",
                "wf.yaml:12:11: schedule `a`: the name is already used by schedule 1",
                "wf.yaml:14:14: schedule `a`: invalid overlap \"sometimes\": expected one of skip, allow, buffer-one",
                "wf.yaml:15:5: schedule 4: missing required field `name`",
                "wf.yaml:16:5: schedule 4: unknown field `color` (expected one of: name, cron, timezone, input, overlap, catch_up)",
            ]
        );
    }

    #[test]
    fn every_field_is_read() {
        let workflow = valid(
            "name: w\nversion: 7\ndeadline: 90s\non_exhausted: compensate\nmax_failures: 5\nsteps:\n\
             - name: a\n  agent: http\n  with: { n: 1, f: 2.5, t: true, s: 'x', l: [null], 200: ok }\n  timeout: 1m\n\
             \x20 retry: { attempts: 9, backoff: 10ms, max_backoff: 1s, multiplier: 3, jitter: 0 }\n\
             \x20 compensate: { agent: exec, with: [a], timeout: 2s, retry: { attempts: 2 } }\n\
             - name: b\n  agent: delay\n  compensate: { agent: exec }\n  depends_on: []\n",
        );
        assert_eq!((workflow.version(), workflow.deadline(), workflow.max_failures()), (7, Duration::from_secs(90), 5));
        assert_eq!(workflow.on_exhausted(), ExhaustedPolicy::Compensate);
        let [a, b] = workflow.steps() else { panic!("two steps") };
        assert_eq!(a.with(), &serde_json::json!({ "n": 1, "f": 2.5, "t": true, "s": "x", "l": [null], "200": "ok" }));
        assert_eq!(a.timeout(), Duration::from_secs(60));
        let retry = RetryPolicy::new(9, Duration::from_millis(10), Duration::from_secs(1))
            .and_then(|p| p.with_multiplier(3.0))
            .and_then(|p| p.with_jitter_fraction(0.0))
            .unwrap();
        assert_eq!(a.retry(), &retry);
        let compensate = a.compensate().unwrap();
        assert_eq!(
            (compensate.agent().as_str(), compensate.with(), compensate.timeout()),
            ("exec", &serde_json::json!(["a"]), Duration::from_secs(2))
        );
        assert_eq!(compensate.retry(), &RetryPolicy::new(2, Duration::from_millis(100), Duration::from_secs(10)).unwrap());
        // A compensation without timeout or retry inherits the step's.
        let compensate = b.compensate().unwrap();
        assert_eq!((compensate.timeout(), compensate.retry()), (b.timeout(), b.retry()));
        assert!(b.depends_on().is_empty(), "an explicit empty list makes a second root");
    }

    #[test]
    fn warnings_are_read_at_both_levels_and_default_to_none() {
        assert_eq!(valid(MINIMAL).warn_after(), None);
        assert_eq!(valid(MINIMAL).steps()[0].warn_after(), None);
        let workflow = valid(
            "name: w\nversion: 1\ndeadline: 1m\nwarn_after: 45s\nsteps:\n  - name: a\n    agent: http\n    timeout: 10s\n    warn_after: 8s\n",
        );
        assert_eq!(workflow.warn_after(), Some(Duration::from_secs(45)));
        assert_eq!(workflow.steps()[0].warn_after(), Some(Duration::from_secs(8)));
    }

    #[test]
    fn priority_is_read_checked_and_stored_with_the_definition() {
        assert_eq!(valid(MINIMAL).priority(), Priority::NORMAL, "0 unless given");
        let workflow = valid("name: w\nversion: 1\npriority: -20\nsteps:\n  - name: a\n    agent: http\n");
        assert_eq!(workflow.priority().get(), -20);
        let stored = workflow.to_json();
        assert_eq!(Workflow::from_json(&stored).expect("stored form").priority(), workflow.priority(), "kept through the store");
        assert!(!valid(MINIMAL).to_json().to_string().contains("priority"), "the default leaves the stored form unchanged");
        assert_eq!(
            check("name: w\nversion: 1\npriority: 101\nsteps:\n  - name: a\n    agent: http\n"),
            ["wf.yaml:3:11: `priority` must be an integer from -100 to 100, found 101"]
        );
        assert_eq!(
            check("name: w\nversion: 1\npriority: high\nsteps:\n  - name: a\n    agent: http\n"),
            ["wf.yaml:3:11: `priority` must be an integer, found a string"]
        );
    }

    #[test]
    fn concurrency_keys_are_read_checked_placed_and_stored_with_the_definition() {
        let workflow = valid("name: w\nversion: 1\nconcurrency: { key: input.customer, limit: 2 }\nsteps:\n  - name: a\n    agent: http\n");
        let concurrency = workflow.concurrency().expect("concurrency");
        assert_eq!((concurrency.key().source(), concurrency.limit(), concurrency.name()), ("input.customer", 2, "customer"));
        let key = workflow.concurrency_key(&serde_json::json!({ "customer": "c1" })).unwrap().expect("a key");
        assert_eq!((key.key.as_str(), key.limit), ("customer=c1", 2));
        let numbered = workflow.concurrency_key(&serde_json::json!({ "customer": 7 })).unwrap().expect("a key");
        assert_eq!(numbered.key, "customer=7", "an integer is its decimal text");
        assert_eq!(
            workflow.concurrency_key(&serde_json::json!({ "customer": [1] })),
            Err("it gave a list, not a string or an integer".to_owned())
        );
        assert_eq!(workflow.concurrency_key(&serde_json::json!({})), Err("no field `customer`".to_owned()));
        assert_eq!(Workflow::from_json(&workflow.to_json()).expect("stored form"), workflow, "kept through the store");
        assert!(!valid(MINIMAL).to_json().contains("concurrency"), "left out when none: stored definitions keep their bytes");
        assert_eq!(valid(MINIMAL).concurrency_key(&serde_json::json!({})), Ok(None));

        let whole = valid("name: w\nversion: 1\nmax_in_flight: 3\nsteps:\n  - name: a\n    agent: http\n");
        let key = whole.concurrency_key(&serde_json::json!({})).unwrap().expect("the workflow's key");
        assert!(key.is_max_in_flight() && key.limit == 3);
        assert_eq!(Workflow::from_json(&whole.to_json()).expect("stored form"), whole);

        assert_eq!(
            check("name: w\nversion: 1\nconcurrency:\n  key: input.a +\n  limit: 1\nsteps:\n  - name: a\n    agent: http\n")[0]
                .split(" expecting")
                .next()
                .unwrap(),
            "wf.yaml:4:17: `concurrency.key`: Syntax error: mismatched input '<EOF>'"
        );
        assert_eq!(
            check("name: w\nversion: 1\nconcurrency: { key: steps.a.output, limit: 1 }\nsteps:\n  - name: a\n    agent: http\n"),
            ["wf.yaml:3:21: `concurrency.key` may use only `input`: a task's key is computed when it is submitted, before any step ran"]
        );
        assert_eq!(
            check("name: w\nversion: 1\nconcurrency: { key: input.a, limit: 0 }\nsteps:\n  - name: a\n    agent: http\n"),
            ["wf.yaml:3:37: `concurrency.limit` must be from 1 to 10000, found 0"]
        );
        assert_eq!(
            check("name: w\nversion: 1\nconcurrency: { key: input.a }\nsteps:\n  - name: a\n    agent: http\n"),
            ["wf.yaml:3:14: missing required field `limit` in `concurrency`"]
        );
        assert_eq!(
            check("name: w\nversion: 1\nmax_in_flight: 2\nconcurrency: { key: input.a, limit: 1 }\nsteps:\n  - name: a\n    agent: http\n"),
            [
                "wf.yaml:3:16: a workflow has `concurrency` or `max_in_flight`, not both: a task holds one slot (bound the whole workflow with a `max_in_flight`, or each key with `concurrency`)"
            ]
        );
    }

    #[test]
    fn retention_is_read_checked_and_stored_with_the_definition() {
        assert_eq!(valid(MINIMAL).retention(), None, "the store's default applies");
        let workflow = valid("name: w\nversion: 1\nretention: 30d\nsteps:\n  - name: a\n    agent: http\n");
        assert_eq!(workflow.retention(), Some(Duration::from_secs(30 * 24 * 3600)));
        let stored = workflow.to_json();
        assert_eq!(Workflow::from_json(&stored).expect("stored form").retention(), workflow.retention(), "kept through the store");
        assert_eq!(
            check("name: w\nversion: 1\nretention: 30 parsecs\nsteps:\n  - name: a\n    agent: http\n"),
            [
                "wf.yaml:3:12: invalid duration \"30 parsecs\" for `retention`: unknown time unit \"parsecs\", supported units: ns, us/µs, ms, sec, min, hours, days, weeks, months, years (and few variations)"
            ]
        );
        assert_eq!(
            check("name: w\nversion: 1\nretention: 0s\nsteps:\n  - name: a\n    agent: http\n"),
            ["wf.yaml:3:12: `retention` must be longer than 0"]
        );
        assert_eq!(
            check("name: w\nversion: 1\nretention: 7\nsteps:\n  - name: a\n    agent: http\n"),
            ["wf.yaml:3:12: `retention` must be a duration such as \"5s\" or \"100ms\", found an integer"]
        );
    }

    #[test]
    fn a_warning_must_come_before_the_complete_by_it_warns_about() {
        assert_eq!(
            check(
                "name: w\nversion: 1\ndeadline: 1m\nwarn_after: 1m\nsteps:\n\
                 \x20 - name: a\n    agent: http\n    timeout: 10s\n    warn_after: 20s\n\
                 \x20 - name: b\n    agent: http\n    warn_after: 30s\n\
                 \x20 - name: c\n    agent: http\n    warn_after: 0s\n\
                 \x20 - name: d\n    agent: http\n    warn_after: 1500us\n    timeout: 1s\n\
                 \x20 - name: e\n    agent: http\n    warn_after: 5\n"
            ),
            [
                "wf.yaml:4:13: `warn_after` (1m) must be shorter than `deadline` (1m): the warning must come while there is still time to act",
                "wf.yaml:9:17: step `a`: `warn_after` (20s) must be shorter than `timeout` (10s): the warning must come while there is still time to act",
                "wf.yaml:12:17: step `b`: `warn_after` (30s) must be shorter than `timeout` (30s): the warning must come while there is still time to act",
                "wf.yaml:15:17: step `c`: `warn_after` must be longer than 0",
                "wf.yaml:18:17: step `d`: `warn_after` must be a whole number of milliseconds, got 1ms 500us",
                "wf.yaml:22:17: step `e`: `warn_after` must be a duration such as \"5s\" or \"100ms\", found an integer",
            ],
            "a step without `timeout` is bounded by the default timeout"
        );
    }

    #[test]
    fn yaml_1_1_booleans_stay_strings() {
        let workflow = valid("name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n    with: { a: y, b: no, c: on, d: true }\n");
        assert_eq!(workflow.steps()[0].with(), &serde_json::json!({ "a": "y", "b": "no", "c": "on", "d": true }));
    }

    const APPROVAL: &str = "name: w\nversion: 1\ndeadline: 2d\nsteps:\n  - name: reserve\n    agent: http\n\
        \x20 - name: approval\n    wait: approved\n    timeout: 1d\n\
        \x20 - name: charge\n    agent: http\n    with: { by: \"{{ steps.approval.output.by }}\" }\n";

    #[test]
    fn a_step_may_wait_for_a_signal_instead_of_calling_an_agent() {
        let workflow = valid(APPROVAL);
        let approval = &workflow.steps()[1];
        assert_eq!(approval.waits_for().map(rota_model::SignalName::as_str), Some("approved"));
        assert_eq!(approval.agent(), None);
        assert_eq!(approval.timeout(), Duration::from_secs(86_400));
        assert_eq!(
            workflow.step_waiting_for(&rota_model::SignalName::new("approved").unwrap()).map(|s| s.name().as_str()),
            Some("approval")
        );
        assert_eq!(workflow.step_waiting_for(&rota_model::SignalName::new("other").unwrap()), None);
        // The canonical form reads back equal, and a step that calls an agent
        // is written without a `wait` key (as before waiting steps existed).
        let json = workflow.to_json();
        assert!(json.contains(r#""wait":"approved""#), "{json}");
        assert!(!json.contains(r#""agent":null"#) && !json.contains(r#""wait":null"#), "{json}");
        assert_eq!(Workflow::from_json(&json).unwrap(), workflow);
    }

    #[test]
    fn a_step_may_run_a_child_workflow_and_is_checked_like_every_other_field() {
        let workflow = valid(
            "name: w\nversion: 1\nsteps:\n  - name: ship\n    workflow: shipping\n    version: 2\n    timeout: 1m\n    with: { to: x }\n",
        );
        let ship = &workflow.steps()[0];
        let child = ship.child().expect("a child workflow step");
        assert_eq!((child.name().as_str(), child.version()), ("shipping", Some(2)));
        assert_eq!((ship.agent(), ship.waits_for()), (None, None));
        let json = workflow.to_json();
        assert!(json.contains(r#""workflow":"shipping","workflow_version":2"#), "{json}");
        assert_eq!(crate::Workflow::from_json(&json).unwrap(), workflow, "the stored form reads back");
        let step = |body: &str| format!("name: w\nversion: 1\ndeadline: 5m\nsteps:\n  - name: a\n{body}");
        assert_eq!(
            check(&step("    workflow: shipping\n")),
            ["wf.yaml:6:15: step `a`: a step that runs a child workflow needs a `timeout`: how long to wait for `shipping` to finish"]
        );
        assert_eq!(
            check(&step("    workflow: shipping\n    agent: http\n    timeout: 1s\n")),
            [
                "wf.yaml:6:15: step `a`: a step runs a child workflow (`workflow`), or calls an agent (`agent`), or waits for a signal (`wait`): one of them"
            ]
        );
        assert_eq!(
            check(&step("    agent: http\n    version: 2\n")),
            ["wf.yaml:7:14: step `a`: `version` pins the version of a child workflow, and this step has no `workflow`"]
        );
        assert_eq!(
            check(&step("    workflow: shipping\n    timeout: 10m\n")),
            [
                "wf.yaml:7:14: step `a`: waits up to 10m for its child, longer than the workflow's `deadline` of 5m (raise `deadline`: the task must outlive its children)"
            ]
        );
        assert_eq!(
            check(&step("    workflow: shipping\n    timeout: 1s\n    retry: { attempts: 2 }\n    for_each: input.items\n")),
            [
                "wf.yaml:8:12: step `a`: a step that runs a child workflow calls no agent to retry (a failed child is retried as a new one, counted by `max_failures`), so no `retry`",
                "wf.yaml:9:15: step `a`: a step that runs a child workflow cannot run `for_each` (it starts one child)",
            ]
        );
    }

    #[test]
    fn a_waiting_step_is_checked_like_every_other_field() {
        let step = |body: &str| check(&format!("name: w\nversion: 1\nsteps:\n  - name: a\n{body}"));
        assert_eq!(
            step("    wait: approved\n"),
            ["wf.yaml:5:11: step `a`: a step that waits needs a `timeout`: how long to wait for signal `approved` before the step fails"]
        );
        assert_eq!(
            step("    agent: http\n    wait: approved\n    timeout: 1s\n"),
            ["wf.yaml:6:11: step `a`: a step either calls an agent (`agent`) or waits for a signal (`wait`), not both"]
        );
        assert_eq!(
            step("    wait: approved\n    timeout: 10m\n"),
            [
                "wf.yaml:6:14: step `a`: waits up to 10m, longer than the workflow's `deadline` of 5m (raise `deadline`: the task must outlive its waits)"
            ]
        );
        assert_eq!(
            step("    wait: no spaces\n    timeout: 1s\n"),
            ["wf.yaml:5:11: step `a`: invalid signal name \"no spaces\": may only contain ASCII letters, digits, '-', '_', '.' and ':'"]
        );
        assert_eq!(
            step("    wait: ok\n    timeout: 1s\n    with: { a: 1 }\n    retry: { attempts: 2 }\n    compensate: { agent: http }\n"),
            [
                "wf.yaml:7:11: step `a`: a step that waits for a signal takes no `with` (the signal's payload is its output)",
                "wf.yaml:8:12: step `a`: a step that waits for a signal calls no agent to retry (`max_failures` counts its timeouts), so no `retry`",
                "wf.yaml:9:17: step `a`: a step that waits for a signal has nothing to undo, so no `compensate`",
            ]
        );
        assert_eq!(
            check("name: w\nversion: 1\nsteps:\n  - { name: a, wait: ok, timeout: 1s }\n  - { name: b, wait: ok, timeout: 1s }\n"),
            ["wf.yaml:5:22: step `b`: signal `ok` is already awaited by step `a`: a signal may be awaited by one step"]
        );
    }

    #[test]
    fn a_callback_step_is_read_checked_and_stored() {
        let workflow = valid(
            "name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n    callback: true\n\
             \x20   with: { token: \"{{ callback.token }}\" }\n  - name: b\n    agent: http\n    callback: false\n",
        );
        assert!(workflow.steps()[0].completes_by_callback());
        assert!(!workflow.steps()[1].completes_by_callback());
        // Stored with `callback` only where it is true, and read back equal.
        let json = workflow.to_json();
        assert_eq!(json.matches(r#""callback":true"#).count(), 1, "{json}");
        assert!(!json.contains(r#""callback":false"#), "{json}");
        assert_eq!(Workflow::from_json(&json).unwrap(), workflow);

        let step = |body: &str| check(&format!("name: w\nversion: 1\nsteps:\n  - name: a\n{body}"));
        assert_eq!(
            step("    agent: http\n    with: { t: \"{{ callback.token }}\" }\n"),
            ["wf.yaml:6:16: step `a`: template `{{ callback.token }}`: only a step with `callback: true` has a callback token"]
        );
        assert_eq!(
            step("    agent: http\n    callback: true\n    compensate: { agent: http, with: \"{{ callback.token }}\" }\n"),
            [
                "wf.yaml:7:38: step `a`: compensation template `{{ callback.token }}`: only a step with `callback: true` has a callback token"
            ]
        );
        assert_eq!(
            step("    wait: ok\n    timeout: 1s\n    callback: true\n"),
            ["wf.yaml:7:15: step `a`: a step that waits for a signal is completed by the signal, so no `callback`"]
        );
        assert_eq!(
            step("    agent: http\n    callback: yes\n"),
            ["wf.yaml:6:15: step `a`: `callback` must be true or false, found a string"]
        );
    }

    #[test]
    fn syntax_errors_stop_the_parse_with_their_position() {
        assert_eq!(check("name: w\nversion: 1\nsteps: [\n"), ["wf.yaml:3:8: unclosed bracket '['"]);
        assert_eq!(check("name: w\nname: v\n"), ["wf.yaml:2:1: duplicate mapping key `name` is not allowed here"]);
        assert_eq!(check("name: a: b\n"), ["wf.yaml:1:8: mapping values are not allowed in this context"]);
    }

    #[test]
    fn unknown_fields_are_reported_at_their_key() {
        assert_eq!(
            check("name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n    colour: red\n"),
            [
                "wf.yaml:6:5: step `a`: unknown field `colour` (expected one of: name, agent, wait, workflow, version, when, for_each, max_parallel, callback, with, timeout, warn_after, retry, rate_limit, compensate, depends_on)"
            ]
        );
        assert_eq!(
            check(
                "name: w\nversion: 1\nowner: me\nsteps:\n  - name: a\n    agent: http\n    retry: { tries: 3 }\n    compensate: { agent: http, when: x }\n"
            ),
            [
                "wf.yaml:3:1: unknown field `owner` (expected one of: name, version, deadline, warn_after, retention, on_exhausted, max_failures, priority, concurrency, max_in_flight, steps, schedules)",
                "wf.yaml:7:14: step `a`: unknown field `tries` in `retry` (expected one of: attempts, backoff, max_backoff, multiplier, jitter, non_retryable)",
                "wf.yaml:8:32: step `a`: unknown field `when` in `compensate` (expected one of: agent, with, timeout, retry)",
            ]
        );
    }

    #[test]
    fn missing_required_fields_are_reported_on_the_mapping_that_lacks_them() {
        assert_eq!(check("name: w\nversion: 1\n"), ["wf.yaml:1:1: missing required field `steps`"]);
        assert_eq!(
            check("version: 1\nsteps:\n  - agent: http\n  - name: b\n"),
            [
                "wf.yaml:1:1: missing required field `name`",
                "wf.yaml:3:5: step 1: missing required field `name`",
                "wf.yaml:4:5: step `b`: missing required field `agent` (or `wait`, for a step that waits for a signal, or `workflow`, for a child workflow)",
            ]
        );
        assert_eq!(
            check("name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n    compensate: { with: 1 }\n"),
            ["wf.yaml:6:17: step `a`: missing required field `agent` in `compensate`"]
        );
    }

    #[test]
    fn wrong_types_are_reported_at_the_value() {
        assert_eq!(
            check(
                "name: 5\nversion: \"1\"\nmax_failures: -1\non_exhausted: [x]\nsteps:\n  - name: a\n    agent: http\n    timeout: 5\n    depends_on: a\n    retry: { attempts: x, jitter: high }\n  - 17\n"
            ),
            [
                "wf.yaml:1:7: `name` must be a string, found an integer",
                "wf.yaml:2:10: `version` must be an integer, found a string",
                "wf.yaml:3:15: `max_failures` must be between 0 and 4294967295, found -1",
                "wf.yaml:4:15: `on_exhausted` must be `error` or `compensate`, found a list",
                "wf.yaml:8:14: step `a`: `timeout` must be a duration such as \"5s\" or \"100ms\", found an integer",
                "wf.yaml:9:17: step `a`: `depends_on` must be a list of step names, found a string",
                "wf.yaml:10:24: step `a`: `retry.attempts` must be an integer, found a string",
                "wf.yaml:10:35: step `a`: `retry.jitter` must be a number, found a string",
                "wf.yaml:11:5: step 2: expected a mapping, found an integer",
            ]
        );
        assert_eq!(check("steps: {}\nname: w\nversion: 1\n"), ["wf.yaml:1:8: `steps` must be a list of steps, found a mapping"]);
        assert_eq!(check(""), ["wf.yaml:1:1: the definition is empty: expected a mapping with `name`, `version` and `steps`"]);
        assert_eq!(
            check("- 1\n"),
            ["wf.yaml:1:1: a workflow definition must be a mapping with `name`, `version` and `steps`, found a list"]
        );
    }

    #[test]
    fn bad_durations_are_reported_at_the_value() {
        assert_eq!(
            check(
                "name: w\nversion: 1\ndeadline: 1x\nsteps:\n  - name: a\n    agent: http\n    timeout: 0s\n  - name: b\n    agent: http\n    timeout: 1500us\n    retry: { backoff: soon }\n"
            ),
            [
                "wf.yaml:3:11: invalid duration \"1x\" for `deadline`: unknown time unit \"x\", supported units: ns, us/µs, ms, sec, min, hours, days, weeks, months, years (and few variations)",
                "wf.yaml:7:14: step `a`: `timeout` must be longer than 0",
                "wf.yaml:10:14: step `b`: `timeout` must be a whole number of milliseconds, got 1ms 500us",
                "wf.yaml:11:23: step `b`: invalid duration \"soon\" for `retry.backoff`: expected number at 0",
            ]
        );
    }

    #[test]
    fn unknown_agents_are_reported_with_the_known_ones() {
        assert_eq!(
            check(
                "name: w\nversion: 1\nsteps:\n  - name: a\n    agent: htp\n    compensate: { agent: \"led ger\" }\n  - name: b\n    agent: ledger\n"
            ),
            [
                "wf.yaml:5:12: step `a`: unknown agent `htp` (known agents: delay, exec, http, ledger)",
                "wf.yaml:6:26: step `a`: invalid agent name \"led ger\": may only contain ASCII letters, digits, '-', '_', '.' and ':'",
            ]
        );
    }

    #[test]
    fn step_names_must_be_valid_and_unique() {
        assert_eq!(
            check(
                "name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n  - name: a\n    agent: http\n  - name: c d\n    agent: http\n"
            ),
            [
                "wf.yaml:6:11: duplicate step name `a` (step 1 has it too)",
                "wf.yaml:8:11: invalid step name \"c d\": may only contain ASCII letters, digits, '-', '_', '.' and ':'",
            ]
        );
    }

    #[test]
    fn dependencies_must_name_steps_once() {
        assert_eq!(
            check(
                "name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n  - name: b\n    agent: http\n    depends_on: [a, nope, a, 3]\n"
            ),
            [
                "wf.yaml:8:21: step `b`: depends on unknown step `nope`",
                "wf.yaml:8:27: step `b`: `depends_on` lists `a` twice",
                "wf.yaml:8:30: step `b`: `depends_on` entries must be step names, found an integer",
            ]
        );
    }

    #[test]
    fn cycles_name_their_steps() {
        // `a` waits for `c`; `b` and `c` follow the step before them.
        assert_eq!(
            check(
                "name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n    depends_on: [c]\n  - name: b\n    agent: http\n  - name: c\n    agent: http\n"
            ),
            ["wf.yaml:6:18: dependency cycle: `a` depends on `c`, which depends on `b`, which depends on `a`"]
        );
        assert_eq!(
            check("name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n    depends_on: [a]\n"),
            ["wf.yaml:6:18: dependency cycle: `a` depends on `a`"]
        );
    }

    #[test]
    fn templates_may_only_reach_upstream_steps() {
        let text = "name: w\nversion: 1\nsteps:\n\
            \x20 - name: a\n    agent: http\n    with: { x: \"{{ steps.b.output.y }}\" }\n\
            \x20 - name: b\n    agent: http\n    depends_on: []\n\
            \x20 - name: c\n    agent: http\n    depends_on: [a, b]\n\
            \x20   with: { a: \"{{ steps.a.output }}\", b: \"{{ steps.b.output.id }}\", z: \"{{ steps.zz.output }}\" }\n\
            \x20   compensate: { agent: http, with: { own: \"{{ steps.c.output.id }}\", up: \"{{ steps.a.output }}\" } }\n\
            \x20 - name: d\n    agent: http\n    with: [\"{{ steps.a.output }}\", \"{{ steps.d.output }}\"]\n    compensate: { agent: http, with: \"{{ steps.e.output }}\" }\n\
            \x20 - name: e\n    agent: http\n";
        assert_eq!(
            check(text),
            [
                "wf.yaml:6:16: step `a`: template `{{ steps.b.output.y }}` refers to step `b`, which is not upstream (add it to `depends_on`)",
                "wf.yaml:13:73: step `c`: template `{{ steps.zz.output }}` refers to unknown step `zz`",
                "wf.yaml:17:36: step `d`: template `{{ steps.d.output }}` refers to step `d`, which is not upstream (add it to `depends_on`)",
                "wf.yaml:18:38: step `d`: compensation template `{{ steps.e.output }}` refers to step `e`, which is not upstream (add it to `depends_on`)",
            ]
        );
    }

    #[test]
    fn conditions_are_read_and_checked_where_they_are_written() {
        let workflow =
            valid("name: w\nversion: 1\nsteps:\n  - { name: a, agent: http }\n  - name: b\n    agent: http\n    when: steps.a.output.ok\n");
        assert_eq!(workflow.steps()[0].when(), None);
        assert_eq!(workflow.steps()[1].when().map(crate::Condition::source), Some("steps.a.output.ok"));
        let text = "name: w\nversion: 1\nsteps:\n\
            \x20 - name: a\n    agent: http\n    when: input.amount >\n\
            \x20 - name: b\n    agent: http\n    depends_on: []\n    when: \"input.x || steps.a.output.ok\"\n\
            \x20 - name: c\n    agent: http\n    when: 'has(steps.zz) && steps.c.output'\n\
            \x20 - name: d\n    agent: http\n    when: 3\n";
        assert_eq!(
            check(text),
            [
                "wf.yaml:6:25: step `a`: `when`: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}",
                "wf.yaml:10:23: step `b`: `when` refers to step `a`, which is not upstream (add it to `depends_on`)",
                "wf.yaml:13:16: step `c`: `when` refers to unknown step `zz`",
                "wf.yaml:13:29: step `c`: `when` refers to step `c`, which is not upstream (add it to `depends_on`)",
                "wf.yaml:16:11: step `d`: `when` must be a string, found an integer",
            ]
        );
        // JSON: every string is quoted.
        let json = r#"{"name": "w", "version": 1, "steps": [{"name": "a", "agent": "http", "when": "input.x && y"}]}"#;
        assert_eq!(
            check_as("wf.json", json),
            ["wf.json:1:90: step `a`: `when`: unknown name `y`: a condition may refer to `input` and to upstream steps as `steps.NAME`"]
        );
    }

    #[test]
    fn for_each_is_read_and_checked_where_it_is_written() {
        let workflow = valid(
            "name: w\nversion: 1\nsteps:\n  - { name: list, agent: http }\n  - name: charge\n    agent: http\n    for_each: steps.list.output.ids\n    max_parallel: 5\n    with: { id: '{{ item }}', n: '{{ index }}' }\n    compensate: { agent: http, with: { id: '{{ item }}', done: '{{ steps.charge.output }}' } }\n  - { name: after, agent: http, with: '{{ steps.charge.output }}' }\n",
        );
        let charge = &workflow.steps()[1];
        let for_each = charge.for_each().expect("a for_each step");
        assert_eq!((for_each.items().source(), for_each.max_parallel()), ("steps.list.output.ids", 5));
        assert_eq!(workflow.steps()[0].for_each(), None);
        let instance = rota_model::StepName::new("charge[7]").unwrap();
        assert_eq!(workflow.step(&instance).map(crate::StepDef::name), Some(charge.name()), "an instance runs as its step");
        assert_eq!(workflow.step(&rota_model::StepName::new("list[0]").unwrap()), None, "a step without for_each has no instances");
        let text = "name: w\nversion: 1\nsteps:\n\
            \x20 - name: a\n    agent: http\n    for_each: input.xs.map(x,\n    max_parallel: 0\n\
            \x20 - name: b\n    agent: http\n    for_each: steps.c.output\n    with: '{{ item.id }}'\n\
            \x20 - name: c\n    agent: http\n    max_parallel: 3\n    with: { n: '{{ index }}' }\n\
            \x20 - name: d\n    wait: go\n    timeout: 1m\n    for_each: input.xs\n\
            \x20 - name: 'e[1]'\n    agent: http\n";
        assert_eq!(
            check(text),
            [
                "wf.yaml:6:30: step `a`: `for_each`: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}",
                "wf.yaml:7:19: step `a`: `max_parallel` must be at least 1",
                "wf.yaml:10:15: step `b`: `for_each` refers to step `c`, which is not upstream (add it to `depends_on`)",
                "wf.yaml:14:19: step `c`: `max_parallel` bounds the instances of a `for_each` step, and this step has no `for_each`",
                "wf.yaml:15:16: step `c`: template `{{ index }}`: only a step with `for_each` has an item and an index",
                "wf.yaml:19:15: step `d`: a step that waits for a signal cannot run `for_each` (a signal completes one step)",
                "wf.yaml:20:11: step `e[1]`: a step's name may not end with `[N]`: that names an instance of a `for_each` step",
            ]
        );
    }

    #[test]
    fn templates_may_only_use_known_roots() {
        assert_eq!(
            check(
                "name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n    with:\n      x: [1, \"id {{ env.HOME }}\"]\n      y: \"{{ input.a\"\n      z: \"{{ }}\"\n"
            ),
            [
                "wf.yaml:7:14: step `a`: template: `{{ env.HOME }}` is not a reference: templates may refer only to input.*, steps.<name>.output*, task.id, task.workflow, attempt, callback.token, item.* and index",
                "wf.yaml:8:10: step `a`: template: unterminated `{{` in \"{{ input.a\"",
                "wf.yaml:9:10: step `a`: template: empty template expression `{{ }}`",
            ]
        );
    }

    #[test]
    fn invalid_retry_policies_point_at_the_field_at_fault() {
        let step = |retry: &str| check(&format!("name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n    retry: {retry}\n"));
        assert_eq!(step("{ attempts: 0 }"), ["wf.yaml:6:24: step `a`: invalid retry policy: attempts must be between 1 and 1000, got 0"]);
        assert_eq!(
            step("{ backoff: 5s, max_backoff: 1s }"),
            ["wf.yaml:6:40: step `a`: invalid retry policy: max backoff (1s) is shorter than the initial backoff (5s)"]
        );
        assert_eq!(
            step("{ backoff: 20s }"),
            ["wf.yaml:6:23: step `a`: invalid retry policy: max backoff (10s) is shorter than the initial backoff (20s)"],
            "with the default cap, the given backoff is at fault"
        );
        assert_eq!(
            step("{ multiplier: 0.5 }"),
            ["wf.yaml:6:26: step `a`: invalid retry policy: backoff multiplier must be a number >= 1, got 0.5"]
        );
        assert_eq!(step("{ jitter: 2 }"), ["wf.yaml:6:22: step `a`: invalid retry policy: jitter must be between 0 and 1, got 2"]);
        assert_eq!(
            step("{ backoff: 1500us }"),
            ["wf.yaml:6:23: step `a`: `retry.backoff` must be a whole number of milliseconds, got 1ms 500us"]
        );
        assert_eq!(step("[3]"), ["wf.yaml:6:12: step `a`: expected a mapping in `retry`, found a list"]);
    }

    #[test]
    fn rate_limits_are_a_rate_or_a_rate_and_a_burst_and_kept_in_the_stored_form() {
        let step = |limit: &str| format!("name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n    rate_limit: {limit}\n");
        let short = valid(&step("20/s"));
        assert_eq!(short.steps()[0].rate_limit(), Some(&"20/s".parse().unwrap()));
        let full = valid(&step("{ rate: 100/m, burst: 5 }"));
        let limit = *full.steps()[0].rate_limit().unwrap();
        assert_eq!((limit.to_string(), limit.burst()), ("100/m".to_owned(), 5));
        let stored = full.to_json();
        assert!(stored.contains(r#""rate_limit":{"rate":"100/m","burst":5}"#), "{stored}");
        assert_eq!(Workflow::from_json(&stored).unwrap(), full, "the stored form reads back");
        assert!(!valid(MINIMAL).to_json().contains("rate_limit"), "left out when none: stored definitions keep their bytes");
        assert_eq!(
            check(&step("20")),
            ["wf.yaml:6:17: step `a`: `rate_limit` must be a rate such as \"20/s\" or a mapping { rate, burst }, found an integer"]
        );
        assert_eq!(
            check(&step("20/d")),
            ["wf.yaml:6:17: step `a`: `rate_limit`: expected a rate such as \"20/s\", \"100/m\" or \"500/h\", got \"20/d\""]
        );
        assert_eq!(
            check(&step("{ rate: 0/s, burst: 0 }")),
            ["wf.yaml:6:25: step `a`: `rate_limit.rate`: the rate must allow between 1 and 1000000 calls per unit, got 0"]
        );
        assert_eq!(
            check(&step("{ rate: 5/s, burst: 0 }")),
            ["wf.yaml:6:37: step `a`: `rate_limit.burst`: the burst must be between 1 and 100000, got 0"]
        );
        assert_eq!(check(&step("{ burst: 2 }")), ["wf.yaml:6:17: step `a`: missing required field `rate` in `rate_limit`"]);
        assert_eq!(
            check(&step("{ rate: 5/s, per: 1 }")),
            ["wf.yaml:6:30: step `a`: unknown field `per` in `rate_limit` (expected one of: rate, burst)"]
        );
        assert_eq!(
            check("name: w\nversion: 1\nsteps:\n  - name: a\n    wait: go\n    timeout: 1m\n    rate_limit: 1/s\n"),
            ["wf.yaml:7:17: step `a`: a step that waits for a signal calls no agent, so no `rate_limit`"]
        );
    }

    #[test]
    fn non_retryable_lists_statuses_and_kinds() {
        let text = "name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n    retry: { attempts: 3, non_retryable: [404, 503, timeout, 404] }\n\
                    \x20   compensate: { agent: http, retry: { non_retryable: [circuit_open] } }\n";
        let workflow = valid(text);
        let [a] = workflow.steps() else { panic!("one step") };
        assert_eq!(a.retry().attempts_max(), 3);
        assert_eq!(
            a.retry().non_retryable(),
            [FailureClass::Status(404), FailureClass::Status(503), FailureClass::Kind(FailureKind::Timeout)]
        );
        assert_eq!(a.compensate().unwrap().retry().non_retryable(), [FailureClass::Kind(FailureKind::CircuitOpen)]);
        // The stored form keeps the list, and a definition without one reads as before.
        let stored = workflow.to_json();
        assert!(stored.contains(r#""non_retryable":[404,503,"timeout"]"#), "{stored}");
        assert!(!valid(MINIMAL).to_json().contains("non_retryable"));

        let step = |list: &str| {
            check(&format!("name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n    retry: {{ non_retryable: {list} }}\n"))
        };
        assert_eq!(
            step("[404, 600, teapot, 99, -1, [1]]"),
            [
                "wf.yaml:6:35: step `a`: `retry.non_retryable`: HTTP status must be between 100 and 599, found 600",
                "wf.yaml:6:40: step `a`: `retry.non_retryable`: unknown failure kind `teapot` (expected an HTTP status or one of: \
                 timeout, connection, circuit_open, exit_tempfail, killed, start_failed)",
                "wf.yaml:6:48: step `a`: `retry.non_retryable`: HTTP status must be between 100 and 599, found 99",
                "wf.yaml:6:52: step `a`: `retry.non_retryable`: HTTP status must be between 100 and 599, found -1",
                "wf.yaml:6:56: step `a`: `retry.non_retryable` entries must be HTTP statuses or failure kinds, found a list",
            ]
        );
        assert_eq!(
            step("404"),
            ["wf.yaml:6:29: step `a`: `retry.non_retryable` must be a list of HTTP statuses and failure kinds, found an integer"]
        );
    }

    #[test]
    fn workflow_level_rules() {
        assert_eq!(
            check("name: w\nversion: 0\nmax_failures: 0\ndeadline: 0ms\nsteps: []\n"),
            [
                "wf.yaml:2:10: `version` must be at least 1",
                "wf.yaml:3:15: `max_failures` must be at least 1",
                "wf.yaml:4:11: `deadline` must be longer than 0",
                "wf.yaml:5:8: `steps` must list at least one step",
            ]
        );
        assert_eq!(
            check("name: \"bad name\"\nversion: 4294967296\nsteps:\n  - name: a\n    agent: http\n"),
            [
                "wf.yaml:1:7: invalid workflow name \"bad name\": may only contain ASCII letters, digits, '-', '_', '.' and ':'",
                "wf.yaml:2:10: `version` must be between 0 and 4294967295, found 4294967296",
            ]
        );
        let big = format!("# {}\n{MINIMAL}", "x".repeat(DEFINITION_BYTES_MAX));
        assert_eq!(check(&big), [format!("wf.yaml:1:1: a definition may be at most 1048576 bytes, this one is {}", big.len())]);
    }

    #[test]
    fn every_problem_is_reported_in_one_pass_in_source_order() {
        let text = "name: w\nversion: 0\nsteps:\n\
            \x20 - name: a\n    agent: htp\n    timeout: 5 parsecs\n    colour: red\n\
            \x20 - name: b\n    agent: http\n    depends_on: [a, ghost]\n    with: { x: \"{{ steps.c.output }}\" }\n\
            \x20 - name: c\n    agent: http\n    depends_on: [c]\n";
        assert_eq!(
            check(text),
            [
                "wf.yaml:2:10: `version` must be at least 1",
                "wf.yaml:5:12: step `a`: unknown agent `htp` (known agents: delay, exec, http, ledger)",
                "wf.yaml:6:14: step `a`: invalid duration \"5 parsecs\" for `timeout`: unknown time unit \"parsecs\", supported units: ns, us/µs, ms, sec, min, hours, days, weeks, months, years (and few variations)",
                "wf.yaml:7:5: step `a`: unknown field `colour` (expected one of: name, agent, wait, workflow, version, when, for_each, max_parallel, callback, with, timeout, warn_after, retry, rate_limit, compensate, depends_on)",
                "wf.yaml:10:21: step `b`: depends on unknown step `ghost`",
                "wf.yaml:11:16: step `b`: template `{{ steps.c.output }}` refers to step `c`, which is not upstream (add it to `depends_on`)",
                "wf.yaml:14:18: dependency cycle: `c` depends on `c`",
            ]
        );
    }

    #[test]
    fn json_is_read_as_json() {
        let json = r#"{
  "name": "w", "version": 1,
  "steps": [{ "name": "a", "agent": "http", "with": { "x": "{{ input.x }}" } }]
}"#;
        assert_eq!(parse("wf.json", json, &AgentCatalog::builtin()).unwrap(), valid(MINIMAL_WITH_X));
        assert_eq!(parse("<stdin>", json, &AgentCatalog::builtin()).unwrap(), valid(MINIMAL_WITH_X), "sniffed by its `{{`");
        // Tabs, which YAML forbids for indentation, are fine in JSON.
        let tabbed = json.replace("  ", "\t");
        assert!(parse("wf.json", &tabbed, &AgentCatalog::builtin()).is_ok());
        // YAML would accept the trailing comma; JSON does not.
        assert_eq!(check_as("wf.json", "{\"steps\": [1,]}"), ["wf.json:1:14: invalid JSON: trailing comma"]);
        assert_eq!(check_as("<stdin>", "{\"name\": \"w\",\n\"version\": [}"), ["<stdin>:2:13: invalid JSON: expected value"]);
        // Semantic problems in JSON are positioned too.
        assert_eq!(
            check_as("wf.json", "{\"name\": \"w\", \"version\": 1,\n \"steps\": [{\"name\": \"a\", \"agent\": \"nope\"}]}"),
            ["wf.json:2:35: step `a`: unknown agent `nope` (known agents: delay, exec, http, ledger)"]
        );
        // A YAML flow mapping in a file without an extension is still YAML.
        assert!(parse("wf", "{name: w, version: 1, steps: [{name: a, agent: http}]}", &AgentCatalog::builtin()).is_ok());
    }

    const MINIMAL_WITH_X: &str = "name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n    with: { x: \"{{ input.x }}\" }\n";
}
