//! Input templates: JSON values whose strings may hold `{{ expr }}`
//! references to the task input, earlier step outputs, the task id, the
//! workflow name, the attempt number and, in a callback step, the
//! attempt's callback token.
//!
//! The language is deliberately tiny: an expression is a dotted path and
//! nothing else (no filters, no arithmetic, no defaults), so every reference
//! can be checked against the DAG when the definition is loaded. Only string
//! values are templates; object keys are taken literally.
//!
//! ```
//! use std::collections::BTreeMap;
//! use rota_model::{StepName, TaskId, WorkflowName};
//! use rota_workflow::{render, TemplateContext};
//! use serde_json::json;
//!
//! let outputs = BTreeMap::from([(StepName::new("reserve").unwrap(), json!({ "hold_id": 7 }))]);
//! let ctx = TemplateContext {
//!     input: &json!({ "order_id": "A-1" }),
//!     outputs: &outputs,
//!     task_id: &TaskId::new("t1").unwrap(),
//!     workflow: &WorkflowName::new("order").unwrap(),
//!     attempt: 2,
//!     callback_token: None,
//!     item: None,
//! };
//! let template = json!({ "hold": "{{ steps.reserve.output.hold_id }}", "note": "order {{ input.order_id }}" });
//! assert_eq!(render(&template, &ctx).unwrap(), json!({ "hold": 7, "note": "order A-1" }));
//! ```

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use rota_model::json::kind;
use rota_model::{StepName, TaskId, WorkflowName};
use serde_json::Value;

use crate::diagnostic::child;

/// Why a template cannot be rendered (or, at load time, is invalid).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A `{{` without a closing `}}`.
    #[error("unterminated `{{{{` in {text:?}")]
    Unterminated {
        /// The whole string holding it.
        text: String,
    },
    /// `{{ }}` with nothing inside.
    #[error("empty template expression `{{{{ }}}}`")]
    Empty,
    /// An expression that is not one of the allowed references.
    #[error(
        "`{{{{ {expr} }}}}` is not a reference: templates may refer only to input.*, steps.<name>.output*, task.id, task.workflow, attempt, callback.token, item.* and index"
    )]
    Unsupported {
        /// The expression, trimmed.
        expr: String,
    },
    /// The referenced value does not exist in this task. The engine treats
    /// this as a permanent step failure: retrying would render the same.
    #[error("template refers to `{path}`, which is missing: {why}")]
    Missing {
        /// The full path as written.
        path: String,
        /// The deepest part that does exist, and what it lacks.
        why: String,
    },
}

/// What an expression refers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `input` or `input.<path>`: the task input.
    Input {
        /// The path below `input`, possibly empty.
        path: Vec<String>,
    },
    /// `steps.<name>.output` or `steps.<name>.output.<path>`.
    StepOutput {
        /// The step whose output is read. A step name may itself contain
        /// dots: the name runs up to the first `output` segment.
        step: StepName,
        /// The path below `output`, possibly empty.
        path: Vec<String>,
    },
    /// `task.id`.
    TaskId,
    /// `task.workflow`: the workflow's name.
    Workflow,
    /// `attempt`: the step's attempt number, from 1.
    Attempt,
    /// `callback.token`: the token a callback step's remote service
    /// completes the step with (only in a step with `callback: true`).
    CallbackToken,
    /// `item` or `item.<path>`: the item of a `for_each` step's instance
    /// (only in a step with `for_each`).
    Item {
        /// The path below `item`, possibly empty.
        path: Vec<String>,
    },
    /// `index`: the 0-based index of a `for_each` step's instance's item.
    Index,
}

/// One `{{ expr }}` found in a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// Where the string holding it sits in the template, as a JSON pointer
    /// (`""` for the template itself, `/body/order` below it).
    pub pointer: String,
    /// The expression between the braces, trimmed (for an unterminated
    /// `{{`, the text from it to the end of the string).
    pub expr: String,
    /// What it refers to, or why it refers to nothing allowed.
    pub target: Result<Target, TemplateError>,
}

/// The outputs of a task's completed steps, as templates see them.
/// Implemented for maps so that the engine can pass whatever it holds.
pub trait StepOutputs {
    /// The output of `step`, if it has completed.
    fn output(&self, step: &StepName) -> Option<&Value>;
}

impl StepOutputs for BTreeMap<StepName, Value> {
    fn output(&self, step: &StepName) -> Option<&Value> {
        self.get(step)
    }
}

impl<S: std::hash::BuildHasher> StepOutputs for HashMap<StepName, Value, S> {
    fn output(&self, step: &StepName) -> Option<&Value> {
        self.get(step)
    }
}

/// Everything a template may refer to when a step's request is built.
#[derive(Clone, Copy)]
pub struct TemplateContext<'a> {
    /// The task input.
    pub input: &'a Value,
    /// Outputs of the task's completed steps.
    pub outputs: &'a dyn StepOutputs,
    /// The task's id.
    pub task_id: &'a TaskId,
    /// The workflow's name.
    pub workflow: &'a WorkflowName,
    /// The attempt number of the step being rendered, from 1.
    pub attempt: u32,
    /// The attempt's callback token, in a step completed by a callback.
    pub callback_token: Option<&'a str>,
    /// The item and its index, in an instance of a `for_each` step.
    pub item: Option<(&'a Value, usize)>,
}

/// Renders `template` against `ctx`.
///
/// - A string that is exactly one `{{ expr }}` becomes the referenced value
///   with its JSON type: a number stays a number, an object an object.
/// - `{{ expr }}` inside a longer string is replaced by its text: strings
///   as they are, anything else as compact JSON.
/// - Arrays and objects are rendered element by element; other values are
///   copied.
///
/// A reference to something missing is an error naming the path.
pub fn render(template: &Value, ctx: &TemplateContext<'_>) -> Result<Value, TemplateError> {
    match template {
        Value::String(text) => render_string(text, ctx),
        Value::Array(items) => items.iter().map(|item| render(item, ctx)).collect::<Result<_, _>>().map(Value::Array),
        Value::Object(fields) => {
            fields.iter().map(|(key, value)| Ok((key.clone(), render(value, ctx)?))).collect::<Result<_, _>>().map(Value::Object)
        }
        other => Ok(other.clone()),
    }
}

/// Every `{{ expr }}` in `template`, in document order (object keys
/// sorted), with what each refers to. Loading a definition uses it to check
/// that references name only upstream steps.
pub fn references(template: &Value) -> Vec<Reference> {
    let mut found = Vec::new();
    collect_references(template, String::new(), &mut found);
    found
}

fn collect_references(template: &Value, pointer: String, found: &mut Vec<Reference>) {
    match template {
        Value::String(text) => {
            for piece in pieces(text) {
                match piece {
                    Piece::Text(_) => {}
                    Piece::Expr(expr) => {
                        found.push(Reference { pointer: pointer.clone(), expr: expr.to_owned(), target: parse_expr(expr) })
                    }
                    Piece::Unterminated(rest) => found.push(Reference {
                        pointer: pointer.clone(),
                        expr: rest.to_owned(),
                        target: Err(TemplateError::Unterminated { text: text.clone() }),
                    }),
                }
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                collect_references(item, child(&pointer, &index.to_string()), found);
            }
        }
        Value::Object(fields) => {
            for (key, value) in fields {
                collect_references(value, child(&pointer, key), found);
            }
        }
        _ => {}
    }
}

/// A piece of a template string.
#[derive(Debug, PartialEq)]
enum Piece<'a> {
    Text(&'a str),
    /// The trimmed text between `{{` and `}}`.
    Expr(&'a str),
    /// From an unclosed `{{` to the end.
    Unterminated(&'a str),
}

fn pieces(mut text: &str) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    while !text.is_empty() {
        let Some(open) = text.find("{{") else {
            out.push(Piece::Text(text));
            break;
        };
        if open > 0 {
            out.push(Piece::Text(&text[..open]));
        }
        let rest = &text[open + 2..];
        let Some(close) = rest.find("}}") else {
            out.push(Piece::Unterminated(&text[open..]));
            break;
        };
        out.push(Piece::Expr(rest[..close].trim()));
        text = &rest[close + 2..];
    }
    out
}

/// Parses the inside of `{{ }}`.
fn parse_expr(expr: &str) -> Result<Target, TemplateError> {
    if expr.is_empty() {
        return Err(TemplateError::Empty);
    }
    let unsupported = || TemplateError::Unsupported { expr: expr.to_owned() };
    if expr.chars().any(char::is_whitespace) {
        return Err(unsupported());
    }
    let segments: Vec<&str> = expr.split('.').collect();
    if segments.iter().any(|segment| segment.is_empty()) {
        return Err(unsupported());
    }
    let owned = |segments: &[&str]| segments.iter().map(|s| (*s).to_owned()).collect();
    match segments.as_slice() {
        ["input", path @ ..] => Ok(Target::Input { path: owned(path) }),
        ["task", "id"] => Ok(Target::TaskId),
        ["task", "workflow"] => Ok(Target::Workflow),
        ["attempt"] => Ok(Target::Attempt),
        ["callback", "token"] => Ok(Target::CallbackToken),
        ["item", path @ ..] => Ok(Target::Item { path: owned(path) }),
        ["index"] => Ok(Target::Index),
        ["steps", rest @ ..] => {
            // Step names may contain dots, so the name is everything before
            // the first `output` segment.
            let output = rest.iter().skip(1).position(|segment| *segment == "output").map(|i| i + 1).ok_or_else(unsupported)?;
            let step = StepName::new(rest[..output].join(".")).map_err(|_| unsupported())?;
            Ok(Target::StepOutput { step, path: owned(&rest[output + 1..]) })
        }
        _ => Err(unsupported()),
    }
}

fn render_string(text: &str, ctx: &TemplateContext<'_>) -> Result<Value, TemplateError> {
    let pieces = pieces(text);
    match pieces.as_slice() {
        [] | [Piece::Text(_)] => Ok(Value::String(text.to_owned())),
        [Piece::Expr(expr)] => lookup(expr, ctx).map(Cow::into_owned),
        _ => {
            let mut out = String::with_capacity(text.len());
            for piece in &pieces {
                match piece {
                    Piece::Text(t) => out.push_str(t),
                    Piece::Expr(expr) => match lookup(expr, ctx)?.as_ref() {
                        Value::String(s) => out.push_str(s),
                        other => out.push_str(&other.to_string()),
                    },
                    Piece::Unterminated(_) => return Err(TemplateError::Unterminated { text: text.to_owned() }),
                }
            }
            Ok(Value::String(out))
        }
    }
}

fn lookup<'v>(expr: &str, ctx: &TemplateContext<'v>) -> Result<Cow<'v, Value>, TemplateError> {
    match parse_expr(expr)? {
        Target::Input { path } => walk(ctx.input, "input", &path, expr).map(Cow::Borrowed),
        Target::StepOutput { step, path } => {
            let output = ctx.outputs.output(&step).ok_or_else(|| TemplateError::Missing {
                path: expr.to_owned(),
                why: format!("step `{step}` has no output (it has not completed)"),
            })?;
            walk(output, &format!("steps.{step}.output"), &path, expr).map(Cow::Borrowed)
        }
        Target::TaskId => Ok(Cow::Owned(Value::String(ctx.task_id.to_string()))),
        Target::Workflow => Ok(Cow::Owned(Value::String(ctx.workflow.to_string()))),
        Target::Attempt => Ok(Cow::Owned(Value::from(ctx.attempt))),
        Target::CallbackToken => ctx.callback_token.map(|token| Cow::Owned(Value::String(token.to_owned()))).ok_or_else(|| {
            TemplateError::Missing { path: expr.to_owned(), why: "only a step with `callback: true` has a callback token".into() }
        }),
        Target::Item { path } => {
            let (item, _) = ctx.item.ok_or_else(|| not_an_instance(expr))?;
            walk(item, "item", &path, expr).map(Cow::Borrowed)
        }
        Target::Index => ctx.item.map(|(_, index)| Cow::Owned(Value::from(index))).ok_or_else(|| not_an_instance(expr)),
    }
}

fn not_an_instance(expr: &str) -> TemplateError {
    TemplateError::Missing { path: expr.to_owned(), why: "only the instances of a step with `for_each` have an item".into() }
}

/// Follows `path` from `root` (named `root_name` in messages); a segment of
/// digits indexes an array.
fn walk<'v>(root: &'v Value, root_name: &str, path: &[String], expr: &str) -> Result<&'v Value, TemplateError> {
    let mut current = root;
    let mut reached = root_name.to_owned();
    for segment in path {
        let next = match current {
            Value::Object(fields) => fields.get(segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|index| items.get(index)),
            _ => None,
        };
        let Some(next) = next else {
            let why = match current {
                Value::Object(_) => format!("`{reached}` has no field `{segment}`"),
                Value::Array(items) => format!("`{reached}` has {} elements, no `{segment}`", items.len()),
                other => format!("`{reached}` is {}, not an object or array", kind(other)),
            };
            return Err(TemplateError::Missing { path: expr.to_owned(), why });
        };
        current = next;
        reached.push('.');
        reached.push_str(segment);
    }
    Ok(current)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn step(name: &str) -> StepName {
        StepName::new(name).unwrap()
    }

    /// Renders `template` against a fixed task: input `{order_id: "A-1",
    /// amount: 12.5, items: [{sku: "x"}, {sku: "y"}]}`, step `reserve`
    /// completed with `{hold_id: 7, ok: true}`, attempt 2.
    fn check(template: Value) -> Result<Value, TemplateError> {
        let input = json!({ "order_id": "A-1", "amount": 12.5, "items": [{ "sku": "x" }, { "sku": "y" }], "meta": null });
        let outputs = BTreeMap::from([(step("reserve"), json!({ "hold_id": 7, "ok": true })), (step("v1.fetch"), json!("raw"))]);
        let task_id = TaskId::new("task-1").unwrap();
        let workflow = WorkflowName::new("order").unwrap();
        let ctx = TemplateContext {
            input: &input,
            outputs: &outputs,
            task_id: &task_id,
            workflow: &workflow,
            attempt: 2,
            callback_token: None,
            item: None,
        };
        render(&template, &ctx)
    }

    #[test]
    fn a_whole_string_reference_keeps_the_json_type() {
        assert_eq!(check(json!("{{ input.amount }}")), Ok(json!(12.5)));
        assert_eq!(check(json!("{{input.items}}")), Ok(json!([{ "sku": "x" }, { "sku": "y" }])));
        assert_eq!(check(json!("{{  steps.reserve.output  }}")), Ok(json!({ "hold_id": 7, "ok": true })));
        assert_eq!(check(json!("{{ steps.reserve.output.ok }}")), Ok(json!(true)));
        assert_eq!(check(json!("{{ input.meta }}")), Ok(Value::Null));
        assert_eq!(check(json!("{{ attempt }}")), Ok(json!(2)));
        assert_eq!(check(json!("{{ task.id }}")), Ok(json!("task-1")));
        assert_eq!(check(json!("{{ task.workflow }}")), Ok(json!("order")));
        assert_eq!(check(json!("{{ input.items.1.sku }}")), Ok(json!("y")));
        assert_eq!(check(json!("{{ steps.v1.fetch.output }}")), Ok(json!("raw")), "dotted step names resolve");
    }

    #[test]
    fn a_callback_token_renders_only_where_there_is_one() {
        let err = check(json!("{{ callback.token }}")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "template refers to `callback.token`, which is missing: only a step with `callback: true` has a callback token"
        );
        let (input, outputs) = (json!({}), BTreeMap::new());
        let (task_id, workflow) = (TaskId::new("task-1").unwrap(), WorkflowName::new("order").unwrap());
        let ctx = TemplateContext {
            input: &input,
            outputs: &outputs,
            task_id: &task_id,
            workflow: &workflow,
            attempt: 1,
            callback_token: Some("tok"),
            item: None,
        };
        let template = json!({ "token": "{{ callback.token }}", "url": "https://rota.example/v1/callbacks/{{ callback.token }}" });
        assert_eq!(render(&template, &ctx), Ok(json!({ "token": "tok", "url": "https://rota.example/v1/callbacks/tok" })));
    }

    #[test]
    fn an_item_and_its_index_render_only_in_an_instance() {
        let err = check(json!("{{ item.sku }}")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "template refers to `item.sku`, which is missing: only the instances of a step with `for_each` have an item"
        );
        assert!(check(json!("{{ index }}")).is_err());
        let (input, outputs, item) = (json!({}), BTreeMap::new(), json!({ "sku": "y", "n": 2 }));
        let (task_id, workflow) = (TaskId::new("task-1").unwrap(), WorkflowName::new("order").unwrap());
        let ctx = TemplateContext {
            input: &input,
            outputs: &outputs,
            task_id: &task_id,
            workflow: &workflow,
            attempt: 1,
            callback_token: None,
            item: Some((&item, 4)),
        };
        let template =
            json!({ "whole": "{{ item }}", "sku": "{{ item.sku }}", "at": "{{ index }}", "note": "#{{ index }}: {{ item.sku }}" });
        let rendered = json!({ "whole": { "sku": "y", "n": 2 }, "sku": "y", "at": 4, "note": "#4: y" });
        assert_eq!(render(&template, &ctx), Ok(rendered));
        let err = render(&json!("{{ item.price }}"), &ctx).unwrap_err();
        assert_eq!(err.to_string(), "template refers to `item.price`, which is missing: `item` has no field `price`");
    }

    #[test]
    fn an_embedded_reference_becomes_text() {
        assert_eq!(check(json!("order {{ input.order_id }}!")), Ok(json!("order A-1!")));
        assert_eq!(check(json!("n={{input.amount}}")), Ok(json!("n=12.5")));
        assert_eq!(check(json!("{{ input.items.0 }} and {{ input.meta }}")), Ok(json!("{\"sku\":\"x\"} and null")));
        assert_eq!(check(json!(" {{ attempt }}")), Ok(json!(" 2")), "outside whitespace makes it embedded");
        assert_eq!(check(json!("{{ task.id }}/{{ attempt }}")), Ok(json!("task-1/2")));
    }

    #[test]
    fn containers_render_recursively_and_the_rest_is_copied() {
        let template = json!({ "a": ["{{ input.amount }}", 1, null, { "b": "x{{ attempt }}" }], "{{ input.order_id }}": false });
        assert_eq!(check(template), Ok(json!({ "a": [12.5, 1, null, { "b": "x2" }], "{{ input.order_id }}": false })));
        assert_eq!(check(json!("no braces")), Ok(json!("no braces")));
        assert_eq!(check(json!("")), Ok(json!("")));
        assert_eq!(check(json!("a } and { b")), Ok(json!("a } and { b")));
    }

    #[test]
    fn missing_values_are_errors_that_name_the_path() {
        let err = check(json!({ "x": ["{{ input.nope.deeper }}"] })).unwrap_err();
        assert_eq!(err.to_string(), "template refers to `input.nope.deeper`, which is missing: `input` has no field `nope`");
        let err = check(json!("{{ steps.charge.output.id }}")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "template refers to `steps.charge.output.id`, which is missing: step `charge` has no output (it has not completed)"
        );
        let err = check(json!("{{ input.items.5 }}")).unwrap_err();
        assert_eq!(err.to_string(), "template refers to `input.items.5`, which is missing: `input.items` has 2 elements, no `5`");
        let err = check(json!("id {{ input.amount.x }}")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "template refers to `input.amount.x`, which is missing: `input.amount` is a number, not an object or array"
        );
    }

    #[test]
    fn malformed_expressions_are_errors() {
        assert_eq!(check(json!("{{ input.a")), Err(TemplateError::Unterminated { text: "{{ input.a".into() }));
        assert_eq!(check(json!("{{ }}")), Err(TemplateError::Empty));
        for expr in ["env.HOME", "input..a", "steps.reserve", "steps.reserve.result", "task", "task.id.x", "attempt.1", "input.a b"] {
            let err = check(json!(format!("{{{{ {expr} }}}}"))).unwrap_err();
            assert_eq!(err, TemplateError::Unsupported { expr: expr.into() }, "{expr}");
        }
        assert_eq!(
            TemplateError::Unsupported { expr: "env.HOME".into() }.to_string(),
            "`{{ env.HOME }}` is not a reference: templates may refer only to input.*, steps.<name>.output*, task.id, task.workflow, attempt, callback.token, item.* and index"
        );
    }

    #[test]
    fn references_lists_every_expression_with_its_pointer() {
        let template = json!({ "body": { "hold": "{{ steps.reserve.output.hold_id }}", "a/b": ["x {{ input.id }} {{ attempt }}"] }, "bad": "{{ nope" });
        let found: Vec<(String, String, Result<Target, TemplateError>)> =
            references(&template).into_iter().map(|r| (r.pointer, r.expr, r.target)).collect();
        assert_eq!(
            found,
            [
                ("/bad".into(), "{{ nope".into(), Err(TemplateError::Unterminated { text: "{{ nope".into() })),
                ("/body/a~1b/0".into(), "input.id".into(), Ok(Target::Input { path: vec!["id".into()] })),
                ("/body/a~1b/0".into(), "attempt".into(), Ok(Target::Attempt)),
                (
                    "/body/hold".into(),
                    "steps.reserve.output.hold_id".into(),
                    Ok(Target::StepOutput { step: step("reserve"), path: vec!["hold_id".into()] })
                ),
            ]
        );
        assert!(references(&json!("plain")).is_empty());
    }
}
