//! Reading definitions from files: the only IO in this crate.

use std::collections::HashMap;
use std::path::Path;

use crate::agent::AgentCatalog;
use crate::definition::Workflow;
use crate::diagnostic::{Diagnostic, Diagnostics, FileLocator, Locate};
use crate::parse::{DEFINITION_BYTES_MAX, parse_with_positions};

/// Reads and parses one definition file (YAML, or JSON for `.json`).
/// Diagnostics name the file as `path` displays.
pub fn load_file(path: impl AsRef<Path>, agents: &AgentCatalog) -> Result<Workflow, Diagnostics> {
    let path = path.as_ref();
    let source = path.display().to_string();
    let text = read(path, &source)?;
    parse_with_positions(&source, &text, agents).0
}

/// Loads every `*.yaml`, `*.yml` and `*.json` file directly in `dir`, in
/// file name order. Returns the workflows that are valid and the problems of
/// the others, so that one bad file does not hide the rest. Two files
/// defining the same name and version is a problem of the second.
pub fn load_dir(dir: impl AsRef<Path>, agents: &AgentCatalog) -> (Vec<Workflow>, Diagnostics) {
    let dir = dir.as_ref();
    let mut workflows = Vec::new();
    let mut problems = Diagnostics::new();
    let mut paths: Vec<_> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.filter_map(Result::ok).map(|entry| entry.path()).filter(|path| is_definition(path)).collect(),
        Err(err) => {
            problems.push(unpositioned(&dir.display().to_string(), format!("cannot read directory: {err}")));
            return (workflows, problems);
        }
    };
    paths.sort();
    let mut seen: HashMap<(String, u32), String> = HashMap::new();
    for path in paths {
        let source = path.display().to_string();
        let text = match read(&path, &source) {
            Ok(text) => text,
            Err(err) => {
                problems.extend(err);
                continue;
            }
        };
        match parse_with_positions(&source, &text, agents) {
            (Ok(workflow), positions) => {
                let key = (workflow.name().to_string(), workflow.version());
                if let Some(first) = seen.get(&key) {
                    let locator = FileLocator { file: &source, positions: &positions, text: &text };
                    problems.push(
                        locator.at_value("/version", format!("workflow `{}` version {} is already defined in {first}", key.0, key.1)),
                    );
                } else {
                    seen.insert(key, source);
                    workflows.push(workflow);
                }
            }
            (Err(err), _) => problems.extend(err),
        }
    }
    (workflows, problems)
}

fn is_definition(path: &Path) -> bool {
    path.is_file()
        && path.extension().and_then(|e| e.to_str()).is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "yaml" | "yml" | "json"))
}

fn read(path: &Path, source: &str) -> Result<String, Diagnostics> {
    let size = std::fs::metadata(path).map_err(|err| Diagnostics::from(vec![unpositioned(source, format!("cannot read: {err}"))]))?.len();
    // Checked before reading so that a huge file is never loaded.
    if size > DEFINITION_BYTES_MAX as u64 {
        let message = format!("a definition may be at most {DEFINITION_BYTES_MAX} bytes, this one is {size}");
        return Err(Diagnostics::from(vec![unpositioned(source, message)]));
    }
    std::fs::read_to_string(path).map_err(|err| Diagnostics::from(vec![unpositioned(source, format!("cannot read: {err}"))]))
}

fn unpositioned(file: &str, message: String) -> Diagnostic {
    Diagnostic { file: file.to_owned(), line: 0, column: 0, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "name: w\nversion: 1\nsteps:\n  - name: a\n    agent: http\n";

    fn lines(problems: &Diagnostics) -> Vec<String> {
        problems.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_directory_loads_its_good_files_and_reports_the_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        write("a.yaml", VALID);
        write("b.yml", &VALID.replace("version: 1", "version: 2"));
        write("c.json", r#"{"name": "v", "version": 1, "steps": [{"name": "a", "agent": "exec"}]}"#);
        write("d.yaml", "name: bad\nversion: 1\nsteps:\n  - name: a\n    agent: nope\n");
        write("e.yaml", VALID);
        write("notes.txt", "not a workflow");
        std::fs::create_dir(dir.path().join("sub.yaml")).unwrap();

        let (workflows, problems) = load_dir(dir.path(), &AgentCatalog::builtin());
        let loaded: Vec<(&str, u32)> = workflows.iter().map(|w| (w.name().as_str(), w.version())).collect();
        assert_eq!(loaded, [("w", 1), ("w", 2), ("v", 1)]);
        let d = dir.path().join("d.yaml").display().to_string();
        let e = dir.path().join("e.yaml").display().to_string();
        let a = dir.path().join("a.yaml").display().to_string();
        assert_eq!(
            lines(&problems),
            [
                format!("{d}:5:12: step `a`: unknown agent `nope` (known agents: delay, exec, http)"),
                format!("{e}:2:10: workflow `w` version 1 is already defined in {a}"),
            ]
        );
    }

    #[test]
    fn unreadable_paths_are_diagnostics_without_a_position() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.yaml");
        let err = load_file(&missing, &AgentCatalog::builtin()).unwrap_err();
        let line = lines(&err).join("\n");
        assert!(line.starts_with(&format!("{}:0:0: cannot read: ", missing.display())), "{line}");
        let (workflows, problems) = load_dir(dir.path().join("nope"), &AgentCatalog::builtin());
        assert!(workflows.is_empty());
        assert!(lines(&problems)[0].contains(":0:0: cannot read directory: "));
    }

    #[test]
    fn a_file_loads_like_parsed_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.yaml");
        std::fs::write(&path, VALID).unwrap();
        let loaded = load_file(&path, &AgentCatalog::builtin()).unwrap();
        assert_eq!(loaded, crate::parse("x.yaml", VALID, &AgentCatalog::builtin()).unwrap());
    }
}
