//! Parse errors: `FILE:LINE:COL: message`.

use std::fmt;

use crate::ast::Pos;

/// What is wrong at a position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ErrorKind {
    /// The line does not start a known statement, or names an unknown operation.
    #[error("unknown statement `{word}`")]
    UnknownStatement {
        /// The offending word.
        word: String,
    },
    /// A size is not `DIGITS[K|M|G]` or `0xHEX[K|M|G]`.
    #[error("bad size `{text}` (expected a decimal or 0x hex number with an optional K, M or G)")]
    BadSize {
        /// The offending text.
        text: String,
    },
    /// A THP size is not a power of two from 16K to 2M.
    #[error("bad THP size `{text}` (expected a power of two from 16K to 2M)")]
    BadThpSize {
        /// The offending text.
        text: String,
    },
    /// A count is not a decimal or `0x` hex number.
    #[error("bad number `{text}`")]
    BadNumber {
        /// The offending text.
        text: String,
    },
    /// An address expression is malformed.
    #[error("bad address `{text}` (expected NAME, NAME+SIZE, NAME-SIZE or a 0x hex address)")]
    BadAddress {
        /// The offending text.
        text: String,
    },
    /// A byte pattern is not `0x00`..`0xFF`.
    #[error("bad pattern `{text}` (expected a byte 0x00..0xFF)")]
    BadPattern {
        /// The offending text.
        text: String,
    },
    /// A maps permission string is not `[r-][w-][x-][ps]`.
    #[error("bad permissions `{text}` (expected four characters like rw-p or r--s)")]
    BadPerms {
        /// The offending text.
        text: String,
    },
    /// A word is not one of the options allowed here.
    #[error("unknown option `{option}` for {context} (expected {expected})")]
    UnknownOption {
        /// The offending word.
        option: String,
        /// Where it appeared (`mmap`, `set`, ...).
        context: String,
        /// What would have been accepted.
        expected: String,
    },
    /// The line ends before a required argument.
    #[error("missing argument: {what}")]
    MissingArgument {
        /// What was missing.
        what: String,
    },
    /// A token of the wrong kind.
    #[error("expected {expected}, found `{found}`")]
    Unexpected {
        /// What was expected.
        expected: String,
        /// The offending token.
        found: String,
    },
    /// Tokens after a complete statement.
    #[error("trailing garbage `{text}`")]
    TrailingGarbage {
        /// The rest of the line.
        text: String,
    },
    /// A name no earlier statement bound.
    #[error("unknown name `{name}`")]
    UnknownName {
        /// The name.
        name: String,
    },
    /// A process name where a mapping is needed, or the reverse.
    #[error("`{name}` is a {is}, not a {expected}")]
    WrongKind {
        /// The name.
        name: String,
        /// What it is bound to.
        is: String,
        /// What was needed.
        expected: String,
    },
    /// A value that cannot be meant (overflow, zero CPUs, start >= end...).
    #[error("absurd value `{text}`: {why}")]
    Absurd {
        /// The offending text.
        text: String,
        /// Why.
        why: String,
    },
    /// An option or field given twice.
    #[error("duplicate option `{option}`")]
    Duplicate {
        /// The option.
        option: String,
    },
    /// Two options that exclude each other.
    #[error("option `{option}` conflicts with `{with}`")]
    Conflict {
        /// The later option.
        option: String,
        /// The earlier one.
        with: String,
    },
    /// `NAME = ACTION` where the action returns nothing.
    #[error("`{verb}` returns nothing to bind")]
    NothingToBind {
        /// The action's verb.
        verb: String,
    },
    /// `expect NAME = ...`.
    #[error("`expect` cannot bind `{name}`: an expected failure returns nothing")]
    BindInExpect {
        /// The name.
        name: String,
    },
    /// Binding a reserved word.
    #[error("`{name}` is reserved and cannot be bound")]
    ReservedName {
        /// The word.
        name: String,
    },
    /// An observation without `expect`.
    #[error("`{verb}` is an observation: write `expect TASK {verb} ...`")]
    ExpectOnly {
        /// The observation's verb.
        verb: String,
    },
    /// A signal expected from a syscall, or an errno from an access.
    #[error("`{verb}` cannot end in `{outcome}` ({why})")]
    BadOutcome {
        /// The action's verb.
        verb: String,
        /// The expected outcome.
        outcome: String,
        /// Why not.
        why: String,
    },
    /// `set tunable NAME=VALUE` with a NAME the engine does not have
    /// ([`crate::Script::parse_checked`]).
    #[error("unknown tunable `{name}`{} (see `usermm tunables`)", did_you_mean(.suggestion))]
    UnknownTunable {
        /// The name.
        name: String,
        /// The closest known name, if one is close.
        suggestion: Option<String>,
    },
    /// `expect counters NAME=N` with a NAME that is not an engine counter.
    #[error("unknown counter `{name}`{} (the counter names `usermm run` prints)", did_you_mean(.suggestion))]
    UnknownCounter {
        /// The name.
        name: String,
        /// The closest known name, if one is close.
        suggestion: Option<String>,
    },
    /// `set tunable NAME=VALUE` with a VALUE the tunable does not accept
    /// ([`crate::Script::parse_checked`]).
    #[error("bad value `{value}` for tunable `{name}` (accepted: {accepted}){}", did_you_mean(.suggestion))]
    BadTunableValue {
        /// The tunable.
        name: String,
        /// The value.
        value: String,
        /// What the tunable accepts (as `usermm tunables` lists it).
        accepted: String,
        /// The closest accepted value, if one is close.
        suggestion: Option<String>,
    },
    /// A machine setting after the first `spawn`.
    #[error("`set {what}` must come before the first `spawn` or `file`")]
    MachineAfterSpawn {
        /// The setting.
        what: String,
    },
}

/// `; did you mean `X`?` or nothing.
fn did_you_mean(s: &Option<String>) -> String {
    s.as_ref()
        .map_or_else(String::new, |s| format!("; did you mean `{s}`?"))
}

/// The longest piece of a file echoed in a message, in characters: a 10 MB token must not
/// become a 10 MB error line.
pub const MAX_ECHO: usize = 80;

/// Errors reported per file; the rest are counted (`… and N more errors`).
pub const MAX_ERRORS: usize = 50;

/// `text` cut to [`MAX_ECHO`] characters (an ellipsis marks the cut).
fn clip(text: &mut String) {
    if let Some((at, _)) = text.char_indices().nth(MAX_ECHO) {
        text.truncate(at);
        text.push('…');
    }
}

impl ErrorKind {
    /// Every piece of file text in the message cut to [`MAX_ECHO`] characters.
    pub(crate) fn clipped(mut self) -> ErrorKind {
        use ErrorKind as E;
        match &mut self {
            E::MissingArgument { .. } => {}
            E::UnknownStatement { word: a }
            | E::BadSize { text: a }
            | E::BadThpSize { text: a }
            | E::BadNumber { text: a }
            | E::BadAddress { text: a }
            | E::BadPattern { text: a }
            | E::BadPerms { text: a }
            | E::TrailingGarbage { text: a }
            | E::UnknownName { name: a }
            | E::Duplicate { option: a }
            | E::NothingToBind { verb: a }
            | E::BindInExpect { name: a }
            | E::ReservedName { name: a }
            | E::ExpectOnly { verb: a }
            | E::MachineAfterSpawn { what: a } => clip(a),
            E::UnknownOption { option: a, .. }
            | E::Unexpected { found: a, .. }
            | E::Absurd { text: a, .. }
            | E::BadOutcome { verb: a, .. } => clip(a),
            E::WrongKind { name: a, .. }
            | E::UnknownTunable { name: a, .. }
            | E::UnknownCounter { name: a, .. } => clip(a),
            E::BadTunableValue {
                name: a, value: b, ..
            } => {
                clip(a);
                clip(b);
            }
            E::Conflict { option: a, with: b } => {
                clip(a);
                clip(b);
            }
        }
        self
    }
}

/// One error, displayed as `FILE:LINE:COL: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{}:{}: {kind}", .pos.line, .pos.col)]
pub struct ParseError {
    /// The file name given to [`crate::parse`].
    pub file: String,
    /// Line and column of the offending token.
    pub pos: Pos,
    /// What is wrong.
    pub kind: ErrorKind,
}

/// The errors found in a file (at most one per line, in line order; never empty): the
/// first [`MAX_ERRORS`], and how many more there were. Displayed one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseErrors {
    errors: Vec<ParseError>,
    more: usize,
}

impl ParseErrors {
    /// Wraps a non-empty list and the count of errors left out of it.
    pub(crate) fn new(errors: Vec<ParseError>, more: usize) -> ParseErrors {
        ParseErrors { errors, more }
    }

    /// How many errors were found but not kept (beyond [`MAX_ERRORS`]).
    pub fn more(&self) -> usize {
        self.more
    }

    /// The errors, in line order.
    pub fn errors(&self) -> &[ParseError] {
        &self.errors
    }

    /// How many errors are kept.
    pub fn len(&self) -> usize {
        self.errors.len()
    }

    /// Always false (kept for the `len` convention).
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// The first error.
    pub fn first(&self) -> Option<&ParseError> {
        self.errors.first()
    }
}

impl IntoIterator for ParseErrors {
    type Item = ParseError;
    type IntoIter = std::vec::IntoIter<ParseError>;
    fn into_iter(self) -> Self::IntoIter {
        self.errors.into_iter()
    }
}

impl<'a> IntoIterator for &'a ParseErrors {
    type Item = &'a ParseError;
    type IntoIter = std::slice::Iter<'a, ParseError>;
    fn into_iter(self) -> Self::IntoIter {
        self.errors.iter()
    }
}

impl fmt::Display for ParseErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        if self.more > 0 {
            let file = self.errors.first().map_or("", |e| e.file.as_str());
            write!(f, "\n{file}: … and {} more errors", self.more)?;
        }
        Ok(())
    }
}

impl std::error::Error for ParseErrors {}
