//! Errors that point at the file, line and column of the problem.
//!
//! Decoders work with byte offsets into the source ([`Diag`]); the public
//! [`JobspecError`] is made once, at the edge, by turning the offset into a
//! line and column of the file the offset belongs to.

use std::fmt;

/// What kind of problem a [`JobspecError`] reports, for callers that branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The text is not valid HCL.
    Syntax,
    /// A block is missing, repeated, or has the wrong number of labels.
    Structure,
    /// An attribute or block that the enclosing block does not have.
    UnknownKey,
    /// A value of the wrong type, such as a string where a number belongs.
    Type,
    /// A duration string that does not parse, such as `"5x"`.
    Duration,
    /// A value of the right type that is not allowed, such as `type = "daemon"`.
    InvalidValue,
    /// An expression that cannot be evaluated (unknown function, bad operands, ...).
    Expression,
    /// An input variable problem: unset, undeclared, or of the wrong type.
    Variable,
}

/// A 1-based line and column (columns count characters, not bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1.
    pub column: usize,
}

/// A job file that could not be turned into a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct JobspecError {
    /// What kind of problem this is.
    pub kind: ErrorKind,
    /// The file the problem is in (the job file or a variable file).
    pub file: String,
    /// Where in the file, when the problem has a place (an unknown `-var` has none).
    pub position: Option<Position>,
    /// What is wrong, lowercase, without the location.
    pub message: String,
}

impl fmt::Display for JobspecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some(p) => write!(f, "{}:{}:{}: {}", self.file, p.line, p.column, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// A problem found while decoding, located by byte offset into its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Diag {
    pub kind: ErrorKind,
    pub offset: Option<usize>,
    pub message: String,
}

pub(crate) type DResult<T> = Result<T, Diag>;

impl Diag {
    pub fn new(kind: ErrorKind, offset: Option<usize>, message: impl Into<String>) -> Diag {
        Diag { kind, offset, message: message.into() }
    }

    /// Turns the offset into a line and column of `text`, the source named `file`.
    pub fn locate(self, file: &str, text: &str) -> JobspecError {
        JobspecError { kind: self.kind, file: file.to_string(), position: self.offset.map(|o| position_of(text, o)), message: self.message }
    }
}

/// Line and column of a byte offset; offsets past the end or inside a
/// character are clamped rather than trusted.
pub(crate) fn position_of(text: &str, offset: usize) -> Position {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    Position { line: before.matches('\n').count() + 1, column: before[line_start..].chars().count() + 1 }
}

/// The candidate closest to a misspelt name, if one is close enough to be what was meant.
pub(crate) fn did_you_mean<'c>(name: &str, candidates: impl IntoIterator<Item = &'c str>) -> Option<&'c str> {
    let limit = (name.chars().count() / 3).clamp(1, 3);
    candidates.into_iter().map(|c| (edit_distance(name, c), c)).filter(|(d, _)| *d <= limit).min_by_key(|(d, _)| *d).map(|(_, c)| c)
}

/// Edit distance counting a swap of neighbours as one edit ("jbo" is one from "job").
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    d[0] = (0..=b.len()).collect();
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

/// Appends `; did you mean "x"?` when a close candidate exists.
pub(crate) fn with_suggestion<'c>(message: String, name: &str, candidates: impl IntoIterator<Item = &'c str>) -> String {
    match did_you_mean(name, candidates) {
        Some(s) => format!("{message}; did you mean \"{s}\"?"),
        None => message,
    }
}
