//! Workflow definitions: what a task runs, and nothing about running it.
//!
//! This crate owns
//! - the resolved, validated definition ([`Workflow`], [`StepDef`],
//!   [`CompensateDef`]) and its canonical JSON form, which the engine stores
//!   per version so that a running task keeps the definition it started with;
//! - reading definitions from YAML or JSON ([`parse`], [`load_file`],
//!   [`load_dir`]) and from Rust ([`Workflow::builder`]), both checked by the
//!   same validation and both reporting *every* problem as a positioned
//!   [`Diagnostic`] (`FILE:LINE:COL: message`);
//! - the step DAG the Scheduler walks ([`Workflow::ready`],
//!   [`Workflow::topological_order`], [`Workflow::upstream`]);
//! - input templates (`"{{ steps.reserve.output.hold_id }}"`): [`render`]
//!   and [`references`];
//! - step conditions (`when: input.amount > 100`), in CEL: [`Condition`].
//!
//! It deliberately leaves out everything that happens at run time: step and
//! task state, queues, agents' behaviour, the clock. It is pure and
//! synchronous; the only IO is reading a definition file in [`load_file`]
//! and [`load_dir`].
//!
//! ```
//! use rota_workflow::{AgentCatalog, StepDef, Workflow};
//! use serde_json::json;
//!
//! let yaml = r#"
//! name: order
//! version: 1
//! steps:
//!   - name: reserve
//!     agent: http
//!     with: { url: "http://127.0.0.1:9100/reserve", order: "{{ input.order_id }}" }
//!   - name: charge
//!     agent: http
//!     with: { hold: "{{ steps.reserve.output.hold_id }}" }
//! "#;
//! let parsed = rota_workflow::parse("order.yaml", yaml, &AgentCatalog::builtin()).unwrap();
//!
//! let built = Workflow::builder("order", 1)
//!     .step(StepDef::new("reserve", "http")
//!         .with_input(json!({ "url": "http://127.0.0.1:9100/reserve", "order": "{{ input.order_id }}" })))
//!     .step(StepDef::new("charge", "http").with_input(json!({ "hold": "{{ steps.reserve.output.hold_id }}" })))
//!     .build(&AgentCatalog::builtin())
//!     .unwrap();
//! assert_eq!(parsed, built);
//! ```
//!
//! Inside, the modules form a line, each using only those before it (and
//! the leaves `agent`, `condition`, `diagnostic` and `template`): `spec` (a definition as written, unvalidated) → `definition` (the
//! resolved types) → `dag` → `validate` (the one place a [`Workflow`] is
//! made) → `builder`, `stored` (the canonical JSON form) and `parse` →
//! `load`.
//!
//! Errors: parsing and building fail with [`Diagnostics`], a list meant for a
//! person to read and fix; rendering a template fails with one
//! [`TemplateError`], which the engine treats as a permanent step failure.
//! The two are kept apart because their callers handle them differently.

mod agent;
mod builder;
mod condition;
mod dag;
mod definition;
mod diagnostic;
mod load;
mod parse;
mod spec;
mod stored;
mod template;
mod validate;

pub use agent::{AgentCatalog, AgentName};
pub use builder::{CompensateBuilder, StepBuilder, WorkflowBuilder};
pub use condition::{CONDITION_BYTES_MAX, Condition, ConditionError, ConditionProblem, StepReference};
pub use definition::{
    ChildWorkflow, CompensateDef, Concurrency, DEADLINE_DEFAULT, ForEach, MAX_FAILURES_DEFAULT, MAX_PARALLEL_DEFAULT, SCHEDULES_MAX,
    STEPS_MAX, ScheduleDef, StepAction, StepDef, TIMEOUT_DEFAULT, Workflow,
};
pub use diagnostic::{Diagnostic, Diagnostics};
pub use load::{load_dir, load_file};
pub use parse::{DEFINITION_BYTES_MAX, NESTING_MAX, parse};
pub use template::{Reference, StepOutputs, Target, TemplateContext, TemplateError, references, render};
