//! Fuzzing, with proptest (cargo-fuzz needs a nightly compiler): the
//! workflow parser and validator and the template engine, fed arbitrary
//! and mutated input, never panic, and every problem they report points
//! into the text they were given. A hang fails the test by its time limit
//! (the nextest profile's `slow-timeout`).
//!
//! A failing input is shrunk and saved by proptest in
//! `tests/fuzz.proptest-regressions`, which is committed: it runs first on
//! every later run, so a crash found once stays a regression test.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use rota_model::{StepName, TaskId, WorkflowName};
use rota_workflow::{AgentCatalog, DEFINITION_BYTES_MAX, NESTING_MAX, TemplateContext, parse, references, render};
use serde_json::{Value, json};

/// A definition that uses most of the format: every mutation starts here.
const SEED: &str = r#"
name: order
version: 3
deadline: 2m
max_failures: 3
on_exhausted: compensate
steps:
  - name: reserve
    agent: http
    timeout: 5s
    retry: { max_attempts: 5, initial_backoff: 100ms, max_backoff: 2s }
    with: { method: POST, url: "http://127.0.0.1:9100/reserve", body: { order: "{{ input.order_id }}" } }
    compensate: { agent: http, with: { method: POST, url: "http://127.0.0.1:9100/release", body: { order: "{{ input.order_id }}" } } }
  - name: charge
    agent: exec
    depends_on: [reserve]
    with: { command: ["sh", "-c", "cat"], stdin: { hold: "{{ steps.reserve.output.hold_id }}", task: "{{ task.id }}" } }
  - name: notify
    agent: delay
    depends_on: [reserve, charge]
    with: { for: "10ms" }
"#;

/// Pieces of YAML and of templates, so that mutations make near-misses
/// rather than only noise.
const FRAGMENTS: &[&str] = &[
    ":",
    "- ",
    "  ",
    "\n",
    "{",
    "}",
    "[",
    "]",
    ",",
    "\"",
    "'",
    "#",
    "&a",
    "*a",
    "!!str ",
    "|",
    ">",
    "---",
    "...",
    "{{",
    "}}",
    "{{ input.",
    "{{ steps.",
    ".output",
    "{{ task.id }}",
    "depends_on: [",
    "agent: ",
    "name: ",
    "timeout: ",
    "-1s",
    "99999999999d",
    "retry: {",
    "max_attempts: 0",
    "compensate:",
    "null",
    "~",
    "true",
    "1e999",
    "\u{0}",
    "\u{feff}",
    "é",
    "\t",
    "<<: *a",
];

/// `cases` per target, or `ROTA_FUZZ_CASES` for a longer run (see
/// docs/reliability.md).
fn config(cases: u32) -> Config {
    Config {
        cases: fuzz_cases().unwrap_or(cases),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel("proptest-regressions"))),
        ..Config::default()
    }
}

fn fuzz_cases() -> Option<u32> {
    let text = std::env::var("ROTA_FUZZ_CASES").ok()?;
    Some(text.parse().unwrap_or_else(|_| panic!("ROTA_FUZZ_CASES must be a number of cases, got {text:?}")))
}

/// `SEED` with a few edits: a byte range cut, a fragment inserted, a line
/// repeated or dropped.
fn mutated() -> impl Strategy<Value = String> {
    let edit = (0..4usize, any::<prop::sample::Index>(), any::<prop::sample::Index>(), prop::sample::select(FRAGMENTS));
    prop::collection::vec(edit, 1..8).prop_map(|edits| {
        let mut text = SEED.to_owned();
        for (kind, at, len, fragment) in edits {
            let boundaries: Vec<usize> = (0..=text.len()).filter(|i| text.is_char_boundary(*i)).collect();
            let start = boundaries[at.index(boundaries.len())];
            match kind {
                0 => {
                    let after: Vec<usize> = boundaries.iter().copied().filter(|i| *i >= start && *i <= start + 40).collect();
                    let end = after[len.index(after.len())];
                    text.replace_range(start..end, "");
                }
                1 => text.insert_str(start, fragment),
                2 | 3 => {
                    let lines: Vec<&str> = text.lines().collect();
                    let line = at.index(lines.len().max(1)).min(lines.len().saturating_sub(1));
                    let mut edited: Vec<&str> = lines.clone();
                    if kind == 2 {
                        edited.insert(line, lines.get(line).copied().unwrap_or(""));
                    } else if !edited.is_empty() {
                        edited.remove(line);
                    }
                    text = edited.join("\n");
                }
                _ => unreachable!(),
            }
        }
        text
    })
}

/// Any JSON value, a few levels deep: JSON is YAML, so this reaches the
/// validator with every kind in every field.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        "[a-z_{} .0-9-]{0,12}".prop_map(Value::String),
        prop::sample::select(FRAGMENTS).prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(
                    &["name", "version", "steps", "agent", "with", "depends_on", "timeout", "retry", "compensate", "x"][..]
                ),
                inner,
                0..6
            )
            .prop_map(|fields| Value::Object(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

/// A definition of arbitrary fields around one step.
fn shaped() -> impl Strategy<Value = String> {
    (json_value(), json_value(), json_value()).prop_map(|(top, step, with)| {
        let mut document = json!({ "name": "fuzz", "version": 1, "steps": [ { "name": "a", "agent": "delay", "with": with } ] });
        if let (Value::Object(extra), Value::Object(fields)) = (step, &mut document["steps"][0]) {
            fields.extend(extra);
        }
        if let (Value::Object(extra), Value::Object(fields)) = (top, &mut document) {
            fields.extend(extra);
        }
        serde_json::to_string_pretty(&document).unwrap()
    })
}

/// Parses `text` and checks that every problem points into it.
fn parse_checked(text: &str) -> Result<(), TestCaseError> {
    let lines = text.split('\n').count() as u32;
    if let Err(problems) = parse("fuzz.yaml", text, &AgentCatalog::builtin()) {
        prop_assert!(!problems.is_empty(), "an error with no problem in it");
        for problem in problems.iter() {
            prop_assert!(problem.line <= lines + 1, "{problem} is past the last line ({lines})");
            prop_assert!(!problem.message.is_empty() && !problem.message.contains('\n'), "{problem:?} is not one line");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn mutated_definitions_never_panic_and_problems_point_into_the_text(text in mutated()) {
        parse_checked(&text)?;
    }

    #[test]
    fn definitions_of_any_shape_never_panic(text in shaped()) {
        parse_checked(&text)?;
    }

    #[test]
    fn any_text_never_panics_the_parser(text in "\\PC{0,300}") {
        parse_checked(&text)?;
    }

    #[test]
    fn templates_never_panic_and_render_what_they_reference(template in json_value(), input in json_value()) {
        let outputs: BTreeMap<StepName, Value> = [(StepName::new("reserve").unwrap(), json!({ "hold_id": "h-1", "n": [1, 2] }))].into();
        let (task, workflow) = (TaskId::new("t-1").unwrap(), WorkflowName::new("order").unwrap());
        let ctx = TemplateContext { input: &input, outputs: &outputs, task_id: &task, workflow: &workflow, attempt: 1, callback_token: None, item: None };
        let _ = references(&template);
        if let Ok(rendered) = render(&template, &ctx) {
            // Rendering a rendered value again changes nothing unless the
            // values it brought in are themselves templates.
            let brought_in = serde_json::to_string(&input).unwrap().contains("{{");
            if !brought_in && !serde_json::to_string(&rendered).unwrap().contains("{{") {
                prop_assert_eq!(render(&rendered, &ctx).ok(), Some(rendered.clone()));
            }
        }
    }
}

#[test]
fn the_largest_definition_is_refused_with_its_size_not_parsed() {
    let huge = format!("name: big\nversion: 1\nsteps: []\n#{}", "x".repeat(DEFINITION_BYTES_MAX));
    let problems = parse("big.yaml", &huge, &AgentCatalog::builtin()).unwrap_err();
    assert!(problems.iter().any(|p| p.message.contains("at most")), "{problems}");
}

#[test]
fn deeply_nested_input_is_a_problem_not_a_stack_overflow() {
    let nested = |depth: usize| {
        format!(
            "name: deep\nversion: 1\nsteps:\n  - name: a\n    agent: delay\n    with: {{ deep: {}{} }}\n",
            "[".repeat(depth),
            "]".repeat(depth)
        )
    };
    // The step's `with` sits four levels down (mapping, list, mapping, mapping).
    parse("deep.yaml", &nested(NESTING_MAX - 4), &AgentCatalog::builtin()).unwrap_or_else(|problems| panic!("{problems}"));
    for depth in [NESTING_MAX, 60, 1_000, 100_000] {
        let problems = parse("deep.yaml", &nested(depth), &AgentCatalog::builtin()).unwrap_err();
        let shown = problems.to_string();
        let expected = "deep.yaml:6:";
        assert!(
            shown.starts_with(expected)
                && shown.contains(&format!("nested too deep: lists and mappings may nest at most {NESTING_MAX} levels")),
            "{depth}: {shown}"
        );
    }
}
