//! Positioned problems in a definition, and where in the source each part of
//! a definition came from.
//!
//! Decoding and validation address parts of a definition by JSON pointer
//! (`/steps/1/depends_on/0`). A [`Locate`] turns a pointer into a line and
//! column: for a file it looks the pointer up in the [`Positions`] recorded
//! while decoding; for the builder there is no text, so it names the step.

use std::collections::HashMap;
use std::fmt;

/// One problem in a workflow definition.
///
/// It displays as `FILE:LINE:COL: message`, the form editors and CI logs turn
/// into links. Lines and columns are 1-based; 0 means "no position" (an
/// unreadable file, or a definition built in Rust).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Diagnostic {
    /// The file name as given to [`crate::parse`], or `<builder>`.
    pub file: String,
    /// 1-based line, or 0 when there is none.
    pub line: u32,
    /// 1-based column (in characters), or 0 when there is none.
    pub column: u32,
    /// What is wrong, in one line.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.column, self.message)
    }
}

/// Every problem found in one or more definitions, in source order. Never
/// empty when returned as an error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnostics(Vec<Diagnostic>);

impl Diagnostics {
    /// No problems.
    pub fn new() -> Self {
        Diagnostics(Vec::new())
    }

    /// Whether there are no problems.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many problems.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The problems, in source order.
    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.0.iter()
    }

    /// Adds one problem.
    pub fn push(&mut self, diagnostic: Diagnostic) {
        self.0.push(diagnostic);
    }

    /// Adds all of `other`'s problems.
    pub fn extend(&mut self, other: Diagnostics) {
        self.0.extend(other.0);
    }

    /// Sorts by file, line and column, keeping the order of problems found
    /// at one position, and drops exact repeats.
    pub(crate) fn sorted(mut self) -> Self {
        self.0.sort_by(|a, b| (&a.file, a.line, a.column).cmp(&(&b.file, b.line, b.column)));
        self.0.dedup();
        self
    }
}

impl fmt::Display for Diagnostics {
    /// One problem per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, diagnostic) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{diagnostic}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

impl IntoIterator for Diagnostics {
    type Item = Diagnostic;
    type IntoIter = std::vec::IntoIter<Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a Diagnostics {
    type Item = &'a Diagnostic;
    type IntoIter = std::slice::Iter<'a, Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl From<Vec<Diagnostic>> for Diagnostics {
    fn from(list: Vec<Diagnostic>) -> Self {
        Diagnostics(list)
    }
}

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Pos {
    pub line: u32,
    pub column: u32,
}

/// Where each value of one source file starts, by JSON pointer.
#[derive(Debug, Default)]
pub(crate) struct Positions {
    values: HashMap<String, Pos>,
}

impl Positions {
    pub fn insert(&mut self, pointer: String, pos: Pos) {
        self.values.insert(pointer, pos);
    }

    /// The position of `pointer`, or of its nearest recorded ancestor: a
    /// default that breaks a rule is reported on the mapping that lacks the
    /// field.
    fn nearest(&self, mut pointer: &str) -> Option<Pos> {
        loop {
            if let Some(pos) = self.values.get(pointer) {
                return Some(*pos);
            }
            let (parent, _) = pointer.rsplit_once('/')?;
            pointer = parent;
        }
    }
}

/// Turns pointers into positions for diagnostics.
pub(crate) trait Locate {
    fn file(&self) -> &str;
    /// The position of the value at `pointer`.
    fn value(&self, pointer: &str) -> Pos;

    /// The position of `at` (1-based line and column) inside the string
    /// at `pointer`; the string's own position where it cannot be told.
    fn inside(&self, pointer: &str, _at: (u32, u32)) -> Pos {
        self.value(pointer)
    }

    fn at_value(&self, pointer: &str, message: String) -> Diagnostic {
        let pos = self.value(pointer);
        Diagnostic { file: self.file().to_owned(), line: pos.line, column: pos.column, message }
    }

    /// A problem at `at` inside the string at `pointer` (an expression).
    fn at_inside(&self, pointer: &str, at: (u32, u32), message: String) -> Diagnostic {
        let pos = self.inside(pointer, at);
        Diagnostic { file: self.file().to_owned(), line: pos.line, column: pos.column, message }
    }
}

/// Positions in a parsed file.
pub(crate) struct FileLocator<'a> {
    pub file: &'a str,
    pub positions: &'a Positions,
    /// The file's text, to place positions inside a string value.
    pub text: &'a str,
}

impl Locate for FileLocator<'_> {
    fn file(&self) -> &str {
        self.file
    }

    fn value(&self, pointer: &str) -> Pos {
        self.positions.nearest(pointer).unwrap_or(Pos { line: 1, column: 1 })
    }

    /// Exact on the first line of a plain or quoted scalar written on one
    /// line (every JSON string and the usual YAML `when: input.x > 1`),
    /// provided no escape sequence comes before the point; elsewhere (block
    /// scalars, later lines of a folded one) the string's own position.
    fn inside(&self, pointer: &str, at: (u32, u32)) -> Pos {
        let start = self.value(pointer);
        let (line, column) = at;
        let Some(text_line) = self.text.lines().nth(start.line.saturating_sub(1) as usize) else { return start };
        let rest: String = text_line.chars().skip(start.column.saturating_sub(1) as usize).collect();
        let quote: u32 = match rest.chars().next() {
            Some('"' | '\'') => 1,
            Some('|' | '>') | None => return start,
            Some(_) => 0,
        };
        // Inside the line, and the text up to the point matches the
        // expression as read (no escapes, no folding).
        let before: String = rest.chars().skip(quote as usize).take(column.saturating_sub(1) as usize).collect();
        if line != 1 || before.contains('\\') || before.chars().count() + 1 < column as usize {
            return start;
        }
        Pos { line: start.line, column: start.column + quote + column - 1 }
    }
}

/// "Positions" in a definition built in Rust or read back from its stored
/// JSON: there is no text, so a problem in step N (0-based) is reported at
/// line N + 1, column 0, and a problem of the workflow itself at 0:0. The
/// message names the step too.
pub(crate) struct TextlessLocator<'a> {
    pub file: &'a str,
}

impl TextlessLocator<'_> {
    fn pos(pointer: &str) -> Pos {
        let step = pointer.strip_prefix("/steps/").and_then(|rest| rest.split('/').next()).and_then(|index| index.parse::<u32>().ok());
        match step {
            Some(index) => Pos { line: index.saturating_add(1), column: 0 },
            None => Pos::default(),
        }
    }
}

impl Locate for TextlessLocator<'_> {
    fn file(&self) -> &str {
        self.file
    }

    fn value(&self, pointer: &str) -> Pos {
        Self::pos(pointer)
    }
}

/// Appends `token` to a JSON pointer, escaping as RFC 6901 says.
pub(crate) fn child(pointer: &str, token: &str) -> String {
    let mut out = String::with_capacity(pointer.len() + token.len() + 1);
    out.push_str(pointer);
    out.push('/');
    for c in token.chars() {
        match c {
            '~' => out.push_str("~0"),
            '/' => out.push_str("~1"),
            c => out.push(c),
        }
    }
    out
}
