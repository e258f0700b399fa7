//! Step conditions: `when: <expression>` on a step, written in CEL (the
//! Common Expression Language, through the `cel` crate) over the task's
//! `input` and the outputs of the step's upstream steps.
//!
//! ```
//! use std::collections::BTreeMap;
//! use rota_model::StepName;
//! use rota_workflow::Condition;
//! use serde_json::json;
//!
//! let when = Condition::parse("input.amount > 100 && steps.check.output.risk != 'low'").unwrap();
//! let outputs = BTreeMap::from([(StepName::new("check").unwrap(), json!({ "risk": "high" }))]);
//! assert_eq!(when.evaluate(&json!({ "amount": 250 }), &outputs), Ok(true));
//! assert_eq!(when.evaluate(&json!({ "amount": 50 }), &outputs), Ok(false));
//! ```
//!
//! What an expression sees: `input`, the task input, and `steps`, a map
//! holding `{"output": ...}` for each upstream step that completed. A step
//! that was skipped is not in `steps`, so `has(steps.b)` (or `"b" in
//! steps`) tells whether it ran. JSON numbers are CEL `int` when whole and
//! within i64, `uint` beyond, `double` otherwise.
//!
//! Checked when a definition is loaded: the expression parses, and it
//! names nothing but `input`, `steps.<name>` / `steps["<name>"]` (the
//! caller checks that each named step is upstream), the variables of its
//! own comprehensions (`exists(x, ...)`) and CEL's type names. Left out,
//! deliberately: type checking against a schema (the input has none), so an
//! expression that is well formed but meets a value of the wrong kind fails
//! when it is evaluated, which the engine treats as a permanent failure of
//! the step.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use cel::common::ast::{Expr, IdedExpr, LiteralValue};
use rota_model::StepName;
use serde_json::Value;

use crate::template::StepOutputs;

/// The longest condition, in bytes: the expression is parsed on every load
/// and evaluated as the step becomes ready, so it stays a condition, not a
/// program.
pub const CONDITION_BYTES_MAX: usize = 4 * 1024;

/// The names a condition may use besides `input`, `steps` and its own
/// comprehension variables: CEL's type names, for `type(x) == string`.
const TYPE_NAMES: &[&str] = &["bool", "bytes", "double", "int", "list", "map", "null_type", "string", "type", "uint"];

/// A step's `when` condition, parsed. Two conditions are equal when they
/// are written the same.
#[derive(Clone)]
pub struct Condition {
    source: String,
    program: Arc<cel::Program>,
    steps: Vec<StepReference>,
}

/// A step an expression refers to (`steps.NAME` or `steps["NAME"]`), with
/// where it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepReference {
    /// The step's name as written (not yet checked to be a step name).
    pub name: String,
    /// Where, in the expression: 1-based line and column (in characters).
    pub at: (u32, u32),
}

/// Why an expression is not a valid condition, and where in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionProblem {
    /// 1-based line and column (in characters) in the expression.
    pub at: (u32, u32),
    /// What is wrong.
    pub message: String,
}

/// Why a condition could not be decided for one task. The engine treats it
/// as a permanent failure of the step: evaluating again would give the same.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("condition `{source_text}` could not be evaluated: {reason}")]
pub struct ConditionError {
    /// The expression.
    pub source_text: String,
    /// Why, in words.
    pub reason: String,
}

impl Condition {
    /// Parses `source` and checks the names it uses. Every problem found is
    /// returned, each with its position in `source`.
    pub fn parse(source: &str) -> Result<Condition, Vec<ConditionProblem>> {
        if source.len() > CONDITION_BYTES_MAX {
            let message = format!("a condition may be at most {CONDITION_BYTES_MAX} bytes, this one is {}", source.len());
            return Err(vec![ConditionProblem { at: (1, 1), message }]);
        }
        if source.trim().is_empty() {
            return Err(vec![ConditionProblem { at: (1, 1), message: "the condition is empty".into() }]);
        }
        let program = cel::Program::compile(source).map_err(|errors| {
            errors
                .errors
                .iter()
                .map(|e| ConditionProblem { at: (clamp(e.pos.0), clamp(e.pos.1)), message: e.msg.clone() })
                .collect::<Vec<_>>()
        })?;
        let mut walk = Walk { source, program: &program, bound: Vec::new(), steps: Vec::new(), problems: Vec::new() };
        walk.expr(program.expression());
        let Walk { steps, problems, .. } = walk;
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Condition { source: source.to_owned(), program: Arc::new(program), steps })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The steps it refers to, in the order written.
    pub fn steps(&self) -> &[StepReference] {
        &self.steps
    }

    /// Decides the condition for a task with `input` whose completed steps
    /// have `outputs`. Anything but `true` or `false` is an error, as is a
    /// missing field or a value of the wrong kind.
    pub fn evaluate(&self, input: &Value, outputs: &dyn StepOutputs) -> Result<bool, ConditionError> {
        match self.execute(input, outputs)? {
            cel::Value::Bool(decided) => Ok(decided),
            other => Err(self.error(format!("it gave {}, not true or false", kind_of(&other)))),
        }
    }

    /// Evaluates the expression as a `for_each` step's items: it must give
    /// a list, whose elements come back as JSON (a map's keys as strings).
    /// The error is the reason, in words, for the caller to place.
    pub fn evaluate_list(&self, input: &Value, outputs: &dyn StepOutputs) -> Result<Vec<Value>, String> {
        match self.execute(input, outputs).map_err(|e| e.reason)? {
            cel::Value::List(items) => items.iter().map(from_cel).collect(),
            other => Err(format!("it gave {}, not a list", kind_of(&other))),
        }
    }

    /// Evaluates the expression as a concurrency key over `input` alone: a
    /// string is the key, an integer its decimal text; anything else is
    /// refused, with the reason in words.
    pub fn evaluate_key(&self, input: &Value) -> Result<String, String> {
        let no_steps: std::collections::BTreeMap<StepName, Value> = std::collections::BTreeMap::new();
        match self.execute(input, &no_steps).map_err(|e| e.reason)? {
            cel::Value::String(key) if key.is_empty() => Err("it gave an empty string".into()),
            cel::Value::String(key) => Ok(key.as_str().to_owned()),
            cel::Value::Int(n) => Ok(n.to_string()),
            cel::Value::UInt(n) => Ok(n.to_string()),
            other => Err(format!("it gave {}, not a string or an integer", kind_of(&other))),
        }
    }

    fn execute(&self, input: &Value, outputs: &dyn StepOutputs) -> Result<cel::Value, ConditionError> {
        let mut steps: HashMap<String, cel::Value> = HashMap::new();
        for reference in &self.steps {
            let Ok(name) = StepName::new(reference.name.as_str()) else { continue };
            if let Some(output) = outputs.output(&name) {
                steps.insert(reference.name.clone(), cel::Value::from(HashMap::from([("output".to_owned(), to_cel(output))])));
            }
        }
        let mut context = cel::Context::default();
        context.add_variable_from_value("input", to_cel(input));
        context.add_variable_from_value("steps", steps.clone());
        match self.program.execute(&context) {
            Ok(value) => Ok(value),
            Err(cel::ExecutionError::NoSuchKey(key)) if self.steps.iter().any(|s| s.name == *key) && !steps.contains_key(&*key) => {
                Err(self.error(format!(
                    "step `{key}` has no output: it was skipped (test whether a step ran with `has(steps.{key})` or `\"{key}\" in steps`)"
                )))
            }
            Err(cel::ExecutionError::NoSuchKey(key)) => Err(self.error(format!("no field `{key}`"))),
            Err(err) => Err(self.error(err.to_string())),
        }
    }

    fn error(&self, reason: String) -> ConditionError {
        ConditionError { source_text: self.source.clone(), reason }
    }
}

impl fmt::Debug for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Condition").field(&self.source).finish()
    }
}

impl PartialEq for Condition {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

fn clamp(n: isize) -> u32 {
    u32::try_from(n.max(1)).unwrap_or(u32::MAX)
}

/// The free names of an expression, checked, and its step references.
struct Walk<'a> {
    source: &'a str,
    program: &'a cel::Program,
    /// Comprehension variables in scope.
    bound: Vec<String>,
    steps: Vec<StepReference>,
    problems: Vec<ConditionProblem>,
}

impl Walk<'_> {
    /// Line and column of a node, from its character offset.
    fn at(&self, id: u64) -> (u32, u32) {
        let Some((start, _)) = self.program.source_info().offset_for(id) else { return (1, 1) };
        let mut line = 1;
        let mut column = 1;
        for c in self.source.chars().take(start as usize) {
            if c == '\n' {
                line += 1;
                column = 1;
            } else {
                column += 1;
            }
        }
        (line, column)
    }

    fn problem(&mut self, id: u64, message: String) {
        let at = self.at(id);
        self.problems.push(ConditionProblem { at, message });
    }

    fn is_steps(&self, expr: &IdedExpr) -> bool {
        matches!(&expr.expr, Expr::Ident(name) if name == "steps" && !self.bound.contains(name))
    }

    fn step(&mut self, id: u64, name: &str) {
        let at = self.at(id);
        self.steps.push(StepReference { name: name.to_owned(), at });
    }

    fn expr(&mut self, expr: &IdedExpr) {
        match &expr.expr {
            Expr::Ident(name) if self.bound.contains(name) || name == "input" || TYPE_NAMES.contains(&name.as_str()) => {}
            Expr::Ident(name) if name == "steps" => {
                self.problem(expr.id, "`steps` is used only as `steps.NAME` or `steps[\"NAME\"]`, naming an upstream step".into())
            }
            Expr::Ident(name) => self
                .problem(expr.id, format!("unknown name `{name}`: a condition may refer to `input` and to upstream steps as `steps.NAME`")),
            Expr::Select(select) if self.is_steps(&select.operand) => self.step(select.operand.id, &select.field),
            Expr::Select(select) => self.expr(&select.operand),
            Expr::Call(call) => {
                let literal_key = |arg: &IdedExpr| match &arg.expr {
                    Expr::Literal(LiteralValue::String(key)) => Some(key.inner().to_owned()),
                    _ => None,
                };
                match (call.func_name.as_str(), call.target.as_deref(), call.args.as_slice()) {
                    // steps["NAME"]
                    ("_[_]", None, [operand, key]) if self.is_steps(operand) => match literal_key(key) {
                        Some(name) => self.step(operand.id, &name),
                        None => self.problem(key.id, "a step is named by a string literal: `steps[\"NAME\"]`".into()),
                    },
                    // "NAME" in steps
                    ("@in", None, [key, operand]) if self.is_steps(operand) => match literal_key(key) {
                        Some(name) => self.step(operand.id, &name),
                        None => self.problem(key.id, "a step is named by a string literal: `\"NAME\" in steps`".into()),
                    },
                    (_, target, args) => {
                        if let Some(target) = target {
                            self.expr(target);
                        }
                        for arg in args {
                            self.expr(arg);
                        }
                    }
                }
            }
            Expr::Comprehension(comprehension) => {
                self.expr(&comprehension.iter_range);
                self.expr(&comprehension.accu_init);
                let before = self.bound.len();
                self.bound.push(comprehension.iter_var.clone());
                self.bound.extend(comprehension.iter_var2.clone());
                self.bound.push(comprehension.accu_var.clone());
                self.expr(&comprehension.loop_cond);
                self.expr(&comprehension.loop_step);
                self.expr(&comprehension.result);
                self.bound.truncate(before);
            }
            Expr::List(list) => list.elements.iter().for_each(|e| self.expr(e)),
            Expr::Map(map) => {
                for entry in &map.entries {
                    if let cel::common::ast::EntryExpr::MapEntry(entry) = &entry.expr {
                        self.expr(&entry.key);
                        self.expr(&entry.value);
                    }
                }
            }
            Expr::Struct(structure) => self.problem(expr.id, format!("`{}{{...}}`: a condition builds no messages", structure.type_name)),
            Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
}

/// A JSON value as CEL sees it.
fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(fields) => {
            cel::Value::from(fields.iter().map(|(k, v)| (k.clone(), to_cel(v))).collect::<HashMap<String, cel::Value>>())
        }
    }
}

/// A CEL value as JSON: the inverse of [`to_cel`] for what JSON can hold
/// (a map's non-string keys become their text); anything else is refused.
fn from_cel(value: &cel::Value) -> Result<Value, String> {
    Ok(match value {
        cel::Value::Null => Value::Null,
        cel::Value::Bool(b) => Value::Bool(*b),
        cel::Value::Int(i) => Value::from(*i),
        cel::Value::UInt(u) => Value::from(*u),
        cel::Value::Float(f) => {
            serde_json::Number::from_f64(*f).map(Value::Number).ok_or_else(|| format!("it gave {f}, which JSON cannot hold"))?
        }
        cel::Value::String(s) => Value::String(s.as_str().to_owned()),
        cel::Value::List(items) => Value::Array(items.iter().map(from_cel).collect::<Result<_, _>>()?),
        cel::Value::Map(map) => {
            let mut fields = serde_json::Map::new();
            for (key, value) in map.map.iter() {
                let key = match key {
                    cel::objects::Key::String(s) => s.as_str().to_owned(),
                    cel::objects::Key::Int(i) => i.to_string(),
                    cel::objects::Key::Uint(u) => u.to_string(),
                    cel::objects::Key::Bool(b) => b.to_string(),
                };
                fields.insert(key, from_cel(value)?);
            }
            Value::Object(fields)
        }
        other => return Err(format!("it gave {}, which JSON cannot hold", kind_of(other))),
    })
}

/// The kind of a CEL value, as an error names it.
fn kind_of(value: &cel::Value) -> &'static str {
    match value {
        cel::Value::List(_) => "a list",
        cel::Value::Map(_) => "a map",
        cel::Value::Int(_) | cel::Value::UInt(_) => "an integer",
        cel::Value::Float(_) => "a double",
        cel::Value::String(_) => "a string",
        cel::Value::Bytes(_) => "bytes",
        cel::Value::Null => "null",
        _ => "a value",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn outputs(pairs: &[(&str, Value)]) -> BTreeMap<StepName, Value> {
        pairs.iter().map(|(n, v)| (StepName::new(*n).unwrap(), v.clone())).collect()
    }

    fn check(source: &str, input: Value, done: &[(&str, Value)]) -> Result<bool, String> {
        Condition::parse(source).unwrap().evaluate(&input, &outputs(done)).map_err(|e| e.to_string())
    }

    fn problems(source: &str) -> Vec<String> {
        Condition::parse(source).err().unwrap_or_default().into_iter().map(|p| format!("{}:{}: {}", p.at.0, p.at.1, p.message)).collect()
    }

    #[test]
    fn conditions_read_the_input_and_completed_steps() {
        let input = json!({ "amount": 12, "price": 2.5, "tags": ["vip"], "big": u64::MAX });
        assert_eq!(check("input.amount == 12 && input.amount > 10", input.clone(), &[]), Ok(true));
        assert_eq!(check("input.price < 3", input.clone(), &[]), Ok(true));
        assert_eq!(check("input.big > 0u", input.clone(), &[]), Ok(true));
        assert_eq!(check("'vip' in input.tags && input.tags.exists(t, t == 'vip')", input.clone(), &[]), Ok(true));
        let done = [("check", json!({ "ok": false })), ("my-step", json!(3))];
        assert_eq!(check("steps.check.output.ok", input.clone(), &done), Ok(false));
        assert_eq!(check("steps['my-step'].output == 3", input.clone(), &done), Ok(true));
        assert_eq!(check("has(steps.check) && !has(steps.other)", input.clone(), &done), Ok(true));
        assert_eq!(check("'check' in steps", input, &done), Ok(true));
    }

    #[test]
    fn evaluation_errors_say_what_went_wrong() {
        let input = json!({ "name": "x" });
        let err = check("input.amount > 1", input.clone(), &[]).unwrap_err();
        assert_eq!(err, "condition `input.amount > 1` could not be evaluated: no field `amount`");
        let err = check("steps.b.output.ok", input.clone(), &[]).unwrap_err();
        assert!(err.contains("step `b` has no output: it was skipped (test whether a step ran with `has(steps.b)`"), "{err}");
        let err = check("input.name > 1", input.clone(), &[]).unwrap_err();
        assert!(err.starts_with("condition `input.name > 1` could not be evaluated: "), "{err}");
        let err = check("input.name", input, &[]).unwrap_err();
        assert!(err.ends_with("it gave a string, not true or false"), "{err}");
    }

    #[test]
    fn bad_expressions_are_reported_where_they_are_wrong() {
        let syntax = problems("input.amount >");
        assert_eq!(syntax.len(), 1, "{syntax:?}");
        assert!(syntax[0].starts_with("1:15: Syntax error"), "{syntax:?}");
        assert_eq!(
            problems("amount > 1 || input.x"),
            ["1:1: unknown name `amount`: a condition may refer to `input` and to upstream steps as `steps.NAME`"]
        );
        assert_eq!(
            problems("size(steps) > 0"),
            ["1:6: `steps` is used only as `steps.NAME` or `steps[\"NAME\"]`, naming an upstream step"]
        );
        assert_eq!(problems("steps[input.s].output"), ["1:12: a step is named by a string literal: `steps[\"NAME\"]`"]);
        assert_eq!(problems(" "), ["1:1: the condition is empty"]);
        assert_eq!(
            problems("input.a &&\n  x"),
            ["2:3: unknown name `x`: a condition may refer to `input` and to upstream steps as `steps.NAME`"]
        );
        assert!(problems(&"1 == 1 && ".repeat(500)).iter().any(|p| p.contains("at most 4096 bytes")));
        // Comprehension variables and type names are not free names.
        assert_eq!(problems("input.xs.all(x, type(x) == int) && [1].map(y, y + 1).size() == 1"), Vec::<String>::new());
    }

    #[test]
    fn lists_are_evaluated_into_json() {
        let list =
            |source: &str, input: Value, done: &[(&str, Value)]| Condition::parse(source).unwrap().evaluate_list(&input, &outputs(done));
        let input = json!({ "orders": [{ "id": 1 }, { "id": 2, "big": true }], "n": 2.5 });
        assert_eq!(list("input.orders", input.clone(), &[]), Ok(vec![json!({ "id": 1 }), json!({ "id": 2, "big": true })]));
        assert_eq!(list("input.orders.map(o, o.id * 10)", input.clone(), &[]), Ok(vec![json!(10), json!(20)]));
        assert_eq!(list("[input.n, 'x', null]", input.clone(), &[]), Ok(vec![json!(2.5), json!("x"), Value::Null]));
        assert_eq!(list("steps.a.output.ids", input.clone(), &[("a", json!({ "ids": [7] }))]), Ok(vec![json!(7)]));
        assert_eq!(list("input.n", input.clone(), &[]), Err("it gave a double, not a list".to_owned()));
        assert_eq!(list("input.missing", input, &[]), Err("no field `missing`".to_owned()));
    }

    #[test]
    fn step_references_are_listed_with_their_positions() {
        let when = Condition::parse("has(steps.a) || steps['b-c'].output.x == 1 || 'd' in steps").unwrap();
        let names: Vec<(&str, (u32, u32))> = when.steps().iter().map(|s| (s.name.as_str(), s.at)).collect();
        assert_eq!(names, [("a", (1, 5)), ("b-c", (1, 17)), ("d", (1, 54))]);
    }
}
