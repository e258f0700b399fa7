//! Agent names and the catalog of agents a definition may name.
//!
//! The catalog is only a set of names: what an agent does, and which queue
//! it listens on, is the engine's business.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use rota_model::{IdError, StepName};
use serde::{Deserialize, Serialize};

/// The name of an agent (`http`, `exec`, `delay`, or a custom one), as a step
/// names it in `agent:`.
///
/// It follows the same rules as a step name (ASCII letters, digits, `-`,
/// `_`, `.`, `:`; at most 100 bytes) because the engine derives queue names
/// from it.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AgentName(String);

impl AgentName {
    /// Validates and wraps `value`.
    pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
        let value = value.into();
        // One rule set for every name: reuse the step name check and relabel
        // the error, rather than copying the charset here.
        match StepName::new(value) {
            Ok(name) => Ok(AgentName(name.into())),
            Err(err) => Err(IdError { kind: "agent name", ..err }),
        }
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for AgentName {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, IdError> {
        AgentName::new(value)
    }
}

impl From<AgentName> for String {
    fn from(name: AgentName) -> String {
        name.0
    }
}

impl FromStr for AgentName {
    type Err = IdError;
    fn from_str(value: &str) -> Result<Self, IdError> {
        AgentName::new(value)
    }
}

impl AsRef<str> for AgentName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for AgentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AgentName({:?})", self.0)
    }
}

/// The agents a definition may name. A step naming any other agent is
/// refused when the definition is parsed, not when the step first runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentCatalog {
    names: BTreeSet<AgentName>,
}

impl AgentCatalog {
    /// The names of the built-in agents.
    pub const BUILTIN: [&'static str; 3] = ["http", "exec", "delay"];

    /// A catalog with no agents at all.
    pub fn empty() -> Self {
        AgentCatalog::default()
    }

    /// The built-in agents: `http`, `exec` and `delay`.
    pub fn builtin() -> Self {
        let names = Self::BUILTIN.iter().map(|name| AgentName::new(*name).expect("built-in agent names are valid")).collect();
        AgentCatalog { names }
    }

    /// The same catalog with one more agent (a custom agent the engine has
    /// registered).
    pub fn with(mut self, name: AgentName) -> Self {
        self.names.insert(name);
        self
    }

    /// Whether `name` is in the catalog.
    pub fn contains(&self, name: &AgentName) -> bool {
        self.names.contains(name)
    }

    /// The names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &AgentName> {
        self.names.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_names_follow_step_name_rules() {
        assert!(AgentName::new("payments.v2").is_ok());
        let err = AgentName::new("has space").unwrap_err();
        assert_eq!(err.kind, "agent name");
        assert!(err.to_string().starts_with("invalid agent name \"has space\""), "{err}");
    }

    #[test]
    fn catalog_holds_builtins_and_custom_agents() {
        let catalog = AgentCatalog::builtin().with(AgentName::new("ledger").unwrap());
        let names: Vec<&str> = catalog.names().map(AgentName::as_str).collect();
        assert_eq!(names, ["delay", "exec", "http", "ledger"]);
        assert!(!AgentCatalog::empty().contains(&AgentName::new("http").unwrap()));
    }
}
