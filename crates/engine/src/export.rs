//! The export format and its two directions: `rota export` writes tasks
//! out, one JSON line each, and `rota import` reads them back into an
//! empty store for inspection. Retention's archive ([`crate::archive`])
//! writes the same lines.
//!
//! A line is one task, its steps and its whole history:
//!
//! ```json
//! {"rota_export":1,"task":{…},"steps":[{…}],"history":[{…}]}
//! ```
//!
//! `rota_export` is the format's version, on every line so that any line
//! (or any file of an archive, or their concatenation) reads alone.
//! `task` and `steps` are the stored records as the store's types
//! serialize them; `history` is the task's events, oldest first. A reader
//! refuses a version it does not know, naming it. Fields added later keep
//! the version when an older reader can ignore them.
//!
//! An export is streamed in pages of a [`TaskFilter`]'s `limit`, newest
//! first (the listing's keyset order), so its memory does not grow with the
//! store: one page of tasks and one task's history at a time.
//!
//! Each history event carries its `hash`, its link in the task's hash
//! chain (`rota_store::chain`): [`Line::verify`] checks a line's history on
//! its own, and [`verify`] checks every history in a store, so a row
//! changed, deleted or moved in a file or in the database is found and
//! named.
//!
//! Deliberately left out: workflow definitions and queues (an imported
//! store is for reading tasks and their histories; it runs nothing), and
//! a consistent snapshot (a task that changes during an export is written
//! as it was when its page was read).

use std::collections::HashSet;

use rota_model::{Step, Task, TaskId};
use rota_store::chain::{self, Broken, Whole};
use rota_store::{Created, Event, NewTask, SharedStore, TaskFilter, TaskRecord};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Error, Result};

/// The version of the line format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// The most tasks an export reads per page (one listing, one read of their
/// steps): bigger pages hold more tasks in memory at once.
pub const PAGE_MAX: u32 = 1_000;

/// One task as an export line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    /// The format's version: [`FORMAT_VERSION`].
    pub rota_export: u32,
    /// The task.
    pub task: Task,
    /// Its steps, by position.
    pub steps: Vec<Step>,
    /// Its history, oldest first.
    pub history: Vec<Event>,
}

impl Line {
    /// The line for a task read from a store.
    pub fn new(record: TaskRecord, history: Vec<Event>) -> Line {
        Line { rota_export: FORMAT_VERSION, task: record.task, steps: record.steps, history }
    }

    /// The line's JSON text, without its newline.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an export line always serializes")
    }

    /// Reads one line's text. The error says what is wrong with it (the
    /// caller adds where the line is).
    pub fn parse(text: &str) -> std::result::Result<Line, String> {
        let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        match value.get("rota_export") {
            Some(Value::Number(n)) if n.as_u64() == Some(u64::from(FORMAT_VERSION)) => {}
            Some(Value::Number(n)) => {
                return Err(format!("rota_export version {n} is not one this rota reads (it reads version {FORMAT_VERSION})"));
            }
            Some(other) => return Err(format!("rota_export: expected a number, got {}", rota_model::json::kind(other))),
            None => return Err("no rota_export field: not a rota export line".into()),
        }
        let line: Line = serde_json::from_value(value).map_err(|e| e.to_string())?;
        line.check()?;
        Ok(line)
    }

    /// Checks the hash chain of the line's history.
    pub fn verify(&self) -> std::result::Result<Whole, Broken> {
        chain::verify(&self.history)
    }

    /// Refuses a line whose steps or events are of another task.
    fn check(&self) -> std::result::Result<(), String> {
        let id = &self.task.id;
        if let Some(step) = self.steps.iter().find(|step| step.task_id != *id) {
            return Err(format!("step {} belongs to task {}, not {id}", step.name, step.task_id));
        }
        if let Some(event) = self.history.iter().find(|event| event.task_id != *id) {
            return Err(format!("history event {} belongs to task {}, not {id}", event.seq, event.task_id));
        }
        Ok(())
    }
}

/// Reads the lines of the tasks `ids` names (those still there), with
/// their histories, in the order of `ids`.
pub async fn lines(store: &SharedStore, ids: &[TaskId]) -> Result<Vec<Line>> {
    let mut lines = Vec::with_capacity(ids.len());
    for record in store.tasks(ids).await? {
        let history = store.history(&record.task.id).await?;
        lines.push(Line::new(record, history));
    }
    Ok(lines)
}

/// Writes every task `filter` selects, newest first, one page of
/// `filter.limit` tasks at a time, each through `write`; returns how many.
/// `filter.before` is the cursor it moves; where it starts, the export
/// starts.
pub async fn export(store: &SharedStore, mut filter: TaskFilter, mut write: impl FnMut(&Line) -> std::io::Result<()>) -> Result<u64> {
    if !(1..=PAGE_MAX).contains(&filter.limit) {
        return Err(Error::OutOfBounds { field: "export.page", why: format!("must be between 1 and {PAGE_MAX}, got {}", filter.limit) });
    }
    let mut written = 0;
    loop {
        let page = store.list_tasks(&filter).await?;
        let Some(last) = page.last() else { break };
        filter.before = Some(last.id.clone());
        let ids: Vec<TaskId> = page.iter().map(|task| task.id.clone()).collect();
        for line in lines(store, &ids).await? {
            write(&line).map_err(|e| Error::Export(format!("cannot write task {}: {e}", line.task.id)))?;
            written += 1;
        }
        if page.len() < filter.limit as usize {
            break;
        }
    }
    Ok(written)
}

/// What [`verify`] found in a store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verified {
    /// Tasks whose history was checked.
    pub tasks: u64,
    /// History rows whose hash was checked.
    pub rows: u64,
    /// Tasks with rows written before the chain existed (not checked).
    pub unchained_tasks: u64,
    /// Tasks whose chain is broken.
    pub broken: u64,
}

/// Checks the hash chain of every task's history in `store`, reading
/// `page` tasks at a time (newest first); `broken` hears of each task whose
/// chain breaks, and where.
pub async fn verify(store: &SharedStore, page: u32, mut broken: impl FnMut(&TaskId, &Broken)) -> Result<Verified> {
    if !(1..=PAGE_MAX).contains(&page) {
        return Err(Error::OutOfBounds { field: "verify.page", why: format!("must be between 1 and {PAGE_MAX}, got {page}") });
    }
    let mut filter = TaskFilter { limit: page, ..TaskFilter::default() };
    let mut verified = Verified::default();
    loop {
        let tasks = store.list_tasks(&filter).await?;
        let Some(last) = tasks.last() else { break };
        filter.before = Some(last.id.clone());
        for task in &tasks {
            let history = store.history(&task.id).await?;
            verified.tasks += 1;
            match chain::verify(&history) {
                Ok(whole) => {
                    verified.rows += whole.chained as u64;
                    verified.unchained_tasks += u64::from(whole.unchained > 0);
                }
                Err(at) => {
                    verified.broken += 1;
                    broken(&task.id, &at);
                }
            }
        }
        if tasks.len() < page as usize {
            break;
        }
    }
    Ok(verified)
}

/// What [`Import::finish`] reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Imported {
    /// Tasks written.
    pub tasks: u64,
    /// Lines of a task already imported from an earlier line (an archive
    /// may hold a task twice: see [`crate::archive`]); the first is kept.
    pub duplicates: u64,
    /// Tasks written although their history's hash chain was broken
    /// ([`Import::accepting_broken_chains`]); the store chains them anew.
    pub broken_chains: u64,
}

/// An import into an empty store, line by line.
pub struct Import {
    store: SharedStore,
    seen: HashSet<TaskId>,
    imported: Imported,
    accept_broken_chains: bool,
}

impl Import {
    /// Starts an import into `store`, which must hold no task: an import
    /// never mixes its tasks with a store's own.
    pub async fn start(store: SharedStore) -> Result<Import> {
        let any = store.list_tasks(&TaskFilter { limit: 1, ..TaskFilter::default() }).await?;
        if let Some(task) = any.first() {
            return Err(Error::Export(format!(
                "the store is not empty (it holds task {} and maybe more): rota import writes only into an empty store",
                task.id
            )));
        }
        Ok(Import { store, seen: HashSet::new(), imported: Imported::default(), accept_broken_chains: false })
    }

    /// Imports lines whose history's hash chain is broken too, counted in
    /// [`Imported::broken_chains`], instead of refusing them. The store
    /// chains their rows anew, so the copy no longer shows the break: the
    /// file does (`rota verify FILE`).
    pub fn accepting_broken_chains(mut self) -> Import {
        self.accept_broken_chains = true;
        self
    }

    /// Writes one line's task with its steps and history, as they were
    /// (states, times, attempts); the history gets the store's own
    /// sequence numbers, in the line's order. Sends no message: nothing
    /// will run it. A line whose history's hash chain is broken (changed
    /// after it was written) is refused, naming the row, and nothing of it
    /// is written, unless the import accepts broken chains.
    pub async fn write(&mut self, line: Line) -> Result<()> {
        if self.seen.contains(&line.task.id) {
            self.imported.duplicates += 1;
            return Ok(());
        }
        if let Err(broken) = line.verify() {
            if !self.accept_broken_chains {
                return Err(Error::Export(format!(
                    "task {}: the hash chain of its history is broken at {broken}: the line was changed after it was written \
                     (`rota verify` lists every such task; `rota import --accept-broken-chains` imports them anyway)",
                    line.task.id
                )));
            }
            self.imported.broken_chains += 1;
        }
        self.seen.insert(line.task.id.clone());
        // The store chains the rows again as it appends them: the same
        // content in the same order gives the same hashes.
        let events = line.history.into_iter().map(|event| Event { seq: 0, hash: None, ..event }).collect();
        let new = NewTask { task: line.task, steps: line.steps, messages: Vec::new(), events };
        match self.store.create_task(new).await? {
            Created::New => self.imported.tasks += 1,
            Created::Existing(record) => {
                return Err(Error::Export(format!("task {} was written into the store by someone else during the import", record.task.id)));
            }
        }
        Ok(())
    }

    /// What was imported.
    pub fn finish(self) -> Imported {
        self.imported
    }
}

#[cfg(test)]
mod tests {
    use rota_model::{StepName, TaskState, Timestamp, WorkflowName};
    use rota_store::EventKind;
    use serde_json::json;

    use super::*;

    fn line() -> Line {
        let now = Timestamp::from_millis(1_700_000_000_000);
        let id = TaskId::new("order-1").unwrap();
        let mut task = Task::new(id.clone(), WorkflowName::new("order").unwrap(), 2, json!({"sku": 7}), now);
        task.state = TaskState::Processed;
        let step = Step::new(id.clone(), StepName::new("charge").unwrap(), 0, now);
        let history =
            vec![Event::task(&id, now, EventKind::Received, json!({})), Event::step(&step, now, EventKind::StepStarted, json!({}))];
        Line::new(TaskRecord { task, steps: vec![step] }, history)
    }

    #[test]
    fn a_line_reads_back_as_written() {
        let line = line();
        let text = line.to_json();
        assert!(text.starts_with(r#"{"rota_export":1,"task":{"#), "the version comes first: {text}");
        assert!(!text.contains('\n'), "one line");
        assert_eq!(Line::parse(&text), Ok(line));
    }

    #[test]
    fn a_bad_line_is_refused_saying_why() {
        let refused = |text: &str| Line::parse(text).expect_err("refused");
        assert!(refused("{").starts_with("not JSON"), "{}", refused("{"));
        assert_eq!(refused("{}"), "no rota_export field: not a rota export line");
        assert_eq!(refused(r#"{"rota_export":9}"#), "rota_export version 9 is not one this rota reads (it reads version 1)");
        assert_eq!(refused(r#"{"rota_export":"1"}"#), "rota_export: expected a number, got a string");
        let mut foreign = line();
        foreign.history[1].task_id = TaskId::new("order-2").unwrap();
        assert_eq!(refused(&foreign.to_json()), "history event 0 belongs to task order-2, not order-1");
        let mut foreign = line();
        foreign.steps[0].task_id = TaskId::new("order-2").unwrap();
        assert_eq!(refused(&foreign.to_json()), "step charge belongs to task order-2, not order-1");
    }
}
