//! The line-oriented recursive-descent parser.
//!
//! Each line is lexed and parsed on its own; an error ends that line's parse and
//! the parser goes on with the next one, so one call reports every bad line. A
//! failed `NAME = ...` line still binds NAME (to a value of unknown kind) so that
//! its later uses do not cascade into "unknown name" errors.

use std::collections::HashMap;

use crate::ast::{
    is_ident, Access, Action, AddrExpr, Advice, Arch, Backing, BenchMark, BrkDelta, Delta, Errno,
    Expect, FileKind, FlagCheck, Keyword, KpageFlag, Limit, Mempolicy, MlockallFlag, MlockallFlags,
    Mmap, MsyncMode, Name, NameKind, Outcome, PagemapState, Perms, Placement, Pos, Prot, Resource,
    Script, Setting, Sharing, ShmemPolicy, ShmemSetting, ShmemTop, Signal, SmapsField, StatusField,
    Stmt, StmtKind, ThpPolicy, ThpSetting, ThpSize, ThpTop,
};
use crate::error::{ErrorKind, ParseError, ParseErrors, MAX_ERRORS};
use crate::lexer::{lex, TokKind, Token};

mod action;
mod expect;
mod settings;

use settings::check_tunable;

/// Parses a whole scenario file.
///
/// `file_name` is only used in messages. On failure every error found is
/// returned (at most one per line), each displayed as `FILE:LINE:COL: message`.
/// Never panics, whatever `text` is.
pub fn parse(file_name: &str, text: &str) -> Result<Script, ParseErrors> {
    parse_with(file_name, text, false)
}

impl Script {
    /// Parses like [`parse`], and also checks every `set tunable NAME=VALUE` against the
    /// engine's tunables ([`usermm::Tunables::set`]): an unknown name or a value the tunable
    /// does not accept is a parse error of that line (with a "did you mean" suggestion when
    /// one is close), so a file meant for the engine fails before anything runs.
    ///
    /// [`parse`] keeps `NAME` and `VALUE` as free text (the language does not know the
    /// engine's switches, and the host ignores them); `usermm run` and `usermm bench
    /// scenario` parse with this.
    ///
    /// ```
    /// let e = scenario::Script::parse_checked("f.scn", "set tunable fork_pte_bach=per-pte\n")
    ///     .unwrap_err();
    /// assert_eq!(
    ///     e.to_string(),
    ///     "f.scn:1:13: unknown tunable `fork_pte_bach`; did you mean `fork_pte_batch`? \
    ///      (see `usermm tunables`)"
    /// );
    /// assert!(scenario::parse("f.scn", "set tunable fork_pte_bach=per-pte\n").is_ok());
    /// ```
    pub fn parse_checked(file_name: &str, text: &str) -> Result<Script, ParseErrors> {
        parse_with(file_name, text, true)
    }
}

impl ErrorKind {
    /// Checks one engine tunable setting as `set tunable NAME=VALUE` (and `usermm run
    /// --tunable`) would apply it: the error is [`ErrorKind::UnknownTunable`] or
    /// [`ErrorKind::BadTunableValue`], with the closest known name or value as a suggestion.
    pub fn check_tunable(name: &str, value: &str) -> Result<(), ErrorKind> {
        check_tunable(name, value)
    }
}

fn parse_with(file_name: &str, text: &str, check_tunables: bool) -> Result<Script, ParseErrors> {
    let mut parser = Parser {
        check_tunables,
        ..Parser::default()
    };
    let mut stmts = Vec::new();
    let mut errors = Vec::new();
    let mut more = 0usize;
    // A byte-order mark some editors put first is not part of the first statement (columns
    // still count from the first character after it).
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    for (i, raw) in text.split('\n').enumerate() {
        let line_no = u32::try_from(i).unwrap_or(u32::MAX - 1).saturating_add(1);
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let toks = lex(line);
        let Some(first) = toks.first() else {
            continue;
        };
        let (body, on) = split_on_cpu(&toks);
        let mut cur = Cursor {
            toks: body,
            i: 0,
            line,
        };
        let parsed = parser
            .statement(&mut cur)
            .and_then(|kind| Ok((parser.on_cpu(&kind, on)?, kind)));
        match parsed {
            Ok((cpu, kind)) => {
                if let StmtKind::Set(Setting::Cpus(n)) = kind {
                    parser.cpus = Some(n);
                }
                stmts.push(Stmt {
                    pos: Pos {
                        line: line_no,
                        col: first.col,
                    },
                    kind,
                    cpu,
                })
            }
            Err(fail) => {
                parser.recover(&toks);
                if errors.len() == MAX_ERRORS {
                    more += 1;
                    continue;
                }
                errors.push(ParseError {
                    file: file_name.to_owned(),
                    pos: Pos {
                        line: line_no,
                        col: fail.col,
                    },
                    kind: fail.kind.clipped(),
                });
            }
        }
    }
    if errors.is_empty() {
        Ok(Script {
            file: file_name.to_owned(),
            stmts,
        })
    } else {
        Err(ParseErrors::new(errors, more))
    }
}

/// Splits a trailing `on cpuN` off a line's tokens: the statement's tokens, and the `on`
/// token with the CPU word when present.
fn split_on_cpu<'t, 'a>(
    toks: &'t [Token<'a>],
) -> (&'t [Token<'a>], Option<(&'t Token<'a>, &'t Token<'a>)>) {
    match toks {
        [body @ .., on, cpu]
            if !body.is_empty()
                && on.kind == TokKind::Word
                && on.text == "on"
                && cpu.kind == TokKind::Word
                && cpu.text.starts_with("cpu") =>
        {
            (body, Some((on, cpu)))
        }
        _ => (toks, None),
    }
}

/// An error at a column of the current line.
struct Fail {
    col: u32,
    kind: ErrorKind,
}

type PResult<T> = Result<T, Fail>;

fn fail<T>(col: u32, kind: ErrorKind) -> PResult<T> {
    Err(Fail { col, kind })
}

/// What a name is bound to so far.
#[derive(Debug, Clone, Copy)]
enum Bound {
    Known(NameKind),
    /// Bound by a line that failed to parse: accept any use.
    Unknown,
}

/// State carried from line to line.
#[derive(Default)]
struct Parser {
    env: HashMap<String, Bound>,
    spawned: bool,
    /// `set cpus N`, if given (`on cpuN` must name one of them).
    cpus: Option<u32>,
    /// Check `set tunable` against the engine's tunables ([`Script::parse_checked`]).
    check_tunables: bool,
    /// A `bench begin` is waiting for its `bench end`.
    bench_open: bool,
}

/// The tokens of one line and a position among them.
struct Cursor<'t, 'a> {
    toks: &'t [Token<'a>],
    i: usize,
    line: &'a str,
}

impl<'t, 'a> Cursor<'t, 'a> {
    fn peek(&self) -> Option<&'t Token<'a>> {
        self.toks.get(self.i)
    }

    fn peek_at(&self, n: usize) -> Option<&'t Token<'a>> {
        self.toks.get(self.i.saturating_add(n))
    }

    fn bump(&mut self) -> Option<&'t Token<'a>> {
        let t = self.toks.get(self.i);
        if t.is_some() {
            self.i += 1;
        }
        t
    }

    /// The column just past the last token.
    fn end_col(&self) -> u32 {
        self.toks.last().map_or(1, |t| t.end_col)
    }

    /// The column of the next token, or the end of the line.
    fn here(&self) -> u32 {
        self.peek().map_or_else(|| self.end_col(), |t| t.col)
    }

    fn missing<T>(&self, what: impl Into<String>) -> PResult<T> {
        fail(
            self.here(),
            ErrorKind::MissingArgument { what: what.into() },
        )
    }

    /// The next token, which must be a word.
    fn word(&mut self, what: &str) -> PResult<&'t Token<'a>> {
        match self.peek() {
            None => self.missing(what),
            Some(t) if t.kind == TokKind::Word => {
                self.i += 1;
                Ok(t)
            }
            Some(t) => fail(
                t.col,
                ErrorKind::Unexpected {
                    expected: what.to_owned(),
                    found: t.text.to_owned(),
                },
            ),
        }
    }

    fn is_word(&self, s: &str) -> bool {
        self.peek()
            .is_some_and(|t| t.kind == TokKind::Word && t.text == s)
    }

    fn is_kind(&self, kind: TokKind) -> bool {
        self.peek().is_some_and(|t| t.kind == kind)
    }

    fn eat_word(&mut self, s: &str) -> bool {
        let yes = self.is_word(s);
        if yes {
            self.i += 1;
        }
        yes
    }

    fn eat_kind(&mut self, kind: TokKind) -> bool {
        let yes = self.is_kind(kind);
        if yes {
            self.i += 1;
        }
        yes
    }

    /// An `=` right after `after`.
    fn eq(&mut self, after: &str) -> PResult<()> {
        match self.peek() {
            Some(t) if t.kind == TokKind::Eq => {
                self.i += 1;
                Ok(())
            }
            None => self.missing(format!("`=` after `{after}`")),
            Some(t) => fail(
                t.col,
                ErrorKind::Unexpected {
                    expected: format!("`=` after `{after}`"),
                    found: t.text.to_owned(),
                },
            ),
        }
    }

    /// The next token and every token glued to it, as one piece of source text.
    fn glued_run(&mut self) -> Option<(u32, &'a str)> {
        let first = self.bump()?;
        let mut end = first.end;
        while let Some(t) = self.peek() {
            if !t.glued {
                break;
            }
            end = t.end;
            self.i += 1;
        }
        Some((first.col, self.line.get(first.start..end).unwrap_or("")))
    }

    /// Fails if anything is left on the line.
    fn finish(&self) -> PResult<()> {
        match self.peek() {
            None => Ok(()),
            Some(t) => fail(
                t.col,
                ErrorKind::TrailingGarbage {
                    text: self.line.get(t.start..).unwrap_or("").trim_end().to_owned(),
                },
            ),
        }
    }

    fn size(&mut self, what: &str) -> PResult<u64> {
        let t = self.word(what)?;
        size_of(t)
    }

    fn number(&mut self, what: &str) -> PResult<u64> {
        let t = self.word(what)?;
        numeric(t, parse_uint, |text| ErrorKind::BadNumber { text })
    }

    /// A number in `lo..=hi`.
    fn bounded(&mut self, what: &str, lo: u64, hi: u64) -> PResult<u64> {
        let col = self.here();
        let v = self.number(what)?;
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            fail(
                col,
                ErrorKind::Absurd {
                    text: v.to_string(),
                    why: format!("must be from {lo} to {hi}"),
                },
            )
        }
    }

    /// One keyword of `K`.
    fn keyword<K: Keyword>(&mut self, context: &str) -> PResult<(K, &'t Token<'a>)> {
        let t = self.word(&format!("{context} ({})", K::choices()))?;
        match K::from_keyword(t.text) {
            Some(k) => Ok((k, t)),
            None => fail(t.col, unknown_option(t.text, context, &K::choices())),
        }
    }

    /// `key=` (the value follows).
    fn key_eq(&mut self, key: &str, context: &str) -> PResult<()> {
        let t = self.word(&format!("`{key}=...`"))?;
        if t.text != key {
            return fail(
                t.col,
                unknown_option(t.text, context, &format!("{key}=...")),
            );
        }
        self.eq(key)
    }

    /// `pattern=0xNN`.
    fn pattern(&mut self, context: &str) -> PResult<u8> {
        self.key_eq("pattern", context)?;
        let t = self.word("a byte pattern 0xNN")?;
        parse_pattern(t.text).ok_or_else(|| Fail {
            col: t.col,
            kind: ErrorKind::BadPattern {
                text: t.text.into(),
            },
        })
    }

    /// An absolute address `0xHEX` in token `t`.
    fn abs_addr(t: &Token<'_>) -> PResult<u64> {
        let hex = t
            .text
            .strip_prefix("0x")
            .or_else(|| t.text.strip_prefix("0X"));
        match hex {
            Some(h) if !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()) => {
                match parse_uint(t.text) {
                    Ok(v) => Ok(v),
                    Err(_) => fail(t.col, too_big(t.text)),
                }
            }
            _ => fail(
                t.col,
                ErrorKind::BadAddress {
                    text: t.text.into(),
                },
            ),
        }
    }
}

/// Why a number cannot be.
fn too_big(text: &str) -> ErrorKind {
    ErrorKind::Absurd {
        text: text.into(),
        why: "does not fit in 64 bits".into(),
    }
}

fn unknown_option(option: &str, context: &str, expected: &str) -> ErrorKind {
    ErrorKind::UnknownOption {
        option: option.into(),
        context: context.into(),
        expected: expected.into(),
    }
}

// Numbers and sizes: the workspace's one grammar (`usermm::units`).
pub(crate) use usermm::units::{parse_size, parse_uint, NumErr};

/// Token `t` read by `parse` (`parse_size` or `parse_uint`): a text of another shape is
/// `bad(text)`, a number past 64 bits is too big. Every size and number of the language is
/// refused through here, so each refusal reads the same.
fn numeric(
    t: &Token<'_>,
    parse: fn(&str) -> Result<u64, NumErr>,
    bad: fn(String) -> ErrorKind,
) -> PResult<u64> {
    parse(t.text).or_else(|e| match e {
        NumErr::Syntax => fail(t.col, bad(t.text.into())),
        NumErr::Overflow => fail(t.col, too_big(t.text)),
    })
}

fn size_of(t: &Token<'_>) -> PResult<u64> {
    numeric(t, parse_size, |text| ErrorKind::BadSize { text })
}

/// `0xN` or `0xNN`.
fn parse_pattern(s: &str) -> Option<u8> {
    let h = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
    if h.is_empty() || h.len() > 2 || !h.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u8::from_str_radix(h, 16).ok()
}

/// Operations that may follow a process name.
const VERBS: &[&str] = &[
    "fork",
    "exit",
    "mmap",
    "munmap",
    "mprotect",
    "mremap",
    "brk",
    "madvise",
    "reclaim",
    "mlock",
    "mlock2",
    "munlock",
    "mlockall",
    "munlockall",
    "pin",
    "unpin",
    "write",
    "touch",
    "pwrite",
    "pread",
    "ftruncate",
    "fallocate",
    "msync",
    "fsync",
    "read",
];

/// Observations, only after `expect`.
const OBSERVATIONS: &[&str] = &[
    "smaps",
    "status",
    "maps",
    "pagemap",
    "kpageflags",
    "fincore",
    "folio",
];

const MMAP_OPTIONS: &str = "none|r|rw|rx|rwx, private|shared, anon, file NAME, offset SIZE, \
                            populate, locked, norserve, fixed ADDR, noreplace ADDR, hint ADDR";

const SETTINGS: &str = "memory|swap|nodes|cpus|arch|tunable|thp|shmem|rlimit|mempolicy";

fn set_flag(flag: &mut bool, t: &Token<'_>) -> PResult<()> {
    if *flag {
        return fail(
            t.col,
            ErrorKind::Duplicate {
                option: t.text.into(),
            },
        );
    }
    *flag = true;
    Ok(())
}

impl Parser {
    /// After a failed line: bind its `NAME =` target, if any, to an unknown kind.
    fn recover(&mut self, toks: &[Token<'_>]) {
        if let [first, second, ..] = toks {
            if second.kind == TokKind::Eq && Name::new(first.text).is_some() {
                self.env.insert(first.text.to_owned(), Bound::Unknown);
            }
        }
    }

    /// Checks a name's use: it must be bound, to `want`.
    fn use_name(&self, t: &Token<'_>, want: NameKind) -> PResult<Name> {
        let what = kind_word(want);
        if t.kind != TokKind::Word || !is_ident(t.text) {
            return fail(
                t.col,
                ErrorKind::Unexpected {
                    expected: format!("a {what} name"),
                    found: t.text.into(),
                },
            );
        }
        let unknown = || Fail {
            col: t.col,
            kind: ErrorKind::UnknownName {
                name: t.text.into(),
            },
        };
        match self.env.get(t.text) {
            None => Err(unknown()),
            Some(Bound::Known(k)) if *k != want => fail(
                t.col,
                ErrorKind::WrongKind {
                    name: t.text.into(),
                    is: kind_word(*k).into(),
                    expected: what.into(),
                },
            ),
            Some(_) => Name::new(t.text).ok_or_else(unknown),
        }
    }

    /// An address expression.
    fn addr(&self, c: &mut Cursor<'_, '_>, what: &str) -> PResult<AddrExpr> {
        let t = c.word(what)?;
        if t.text.starts_with(|ch: char| ch.is_ascii_digit()) {
            return Cursor::abs_addr(t).map(AddrExpr::Abs);
        }
        if !is_ident(t.text) {
            return fail(
                t.col,
                ErrorKind::BadAddress {
                    text: t.text.into(),
                },
            );
        }
        let base = self.use_name(t, NameKind::Mapping)?;
        // `NAME+SIZE-SIZE+…`: the offsets are summed (v3 allows a chain of them).
        let mut offset: i128 = 0;
        loop {
            let col = c.here();
            let sign = if c.eat_kind(TokKind::Plus) {
                1
            } else if c.eat_kind(TokKind::Minus) {
                -1
            } else {
                break;
            };
            let what = if sign > 0 {
                "an offset after `+`"
            } else {
                "an offset after `-`"
            };
            offset += sign * i128::from(c.size(what)?);
            if offset.unsigned_abs() > u128::from(u64::MAX) {
                return fail(
                    col,
                    ErrorKind::Absurd {
                        text: "offset".into(),
                        why: "the offsets add up to more than 2^64".into(),
                    },
                );
            }
        }
        let delta = match u64::try_from(offset.unsigned_abs()) {
            Ok(d) if offset < 0 => Delta::Minus(d),
            Ok(d) => Delta::Plus(d),
            Err(_) => unreachable!("bounded above"),
        };
        Ok(AddrExpr::Rel { base, delta })
    }

    /// Checks a statement's `on cpuN`: only statements of a process run on a CPU, and the
    /// CPU must exist (below `set cpus`, or the engine's default count).
    fn on_cpu(
        &self,
        kind: &StmtKind,
        on: Option<(&Token<'_>, &Token<'_>)>,
    ) -> PResult<Option<u32>> {
        let Some((on, word)) = on else {
            return Ok(None);
        };
        if kind.task().is_none() {
            return fail(
                on.col,
                ErrorKind::Unexpected {
                    expected: "the end of the line (`on cpuN` needs a statement of a process)"
                        .into(),
                    found: "on".into(),
                },
            );
        }
        let digits = &word.text[3..];
        let n = match parse_uint(digits) {
            Ok(n) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => {
                return fail(
                    word.col,
                    ErrorKind::Unexpected {
                        expected: "a CPU (`cpu0`, `cpu1`, …)".into(),
                        found: word.text.into(),
                    },
                )
            }
        };
        let cpus = self
            .cpus
            .unwrap_or(usermm::MachineConfig::default().cpus as u32);
        if n >= u64::from(cpus) {
            return fail(
                word.col,
                ErrorKind::Absurd {
                    text: word.text.into(),
                    why: format!(
                        "the machine has {cpus} CPUs (`set cpus N` before the first spawn)"
                    ),
                },
            );
        }
        Ok(Some(n as u32))
    }

    fn statement(&mut self, c: &mut Cursor<'_, '_>) -> PResult<StmtKind> {
        let Some(first) = c.peek() else {
            return c.missing("a statement");
        };
        if first.kind != TokKind::Word {
            return fail(
                first.col,
                ErrorKind::UnknownStatement {
                    word: first.text.into(),
                },
            );
        }
        let second_is_eq = c.peek_at(1).is_some_and(|t| t.kind == TokKind::Eq);
        if !second_is_eq {
            match first.text {
                "set" => {
                    c.bump();
                    return self.setting(c).map(StmtKind::Set);
                }
                "thp" => {
                    c.bump();
                    let thp = self.thp(c)?;
                    c.finish()?;
                    return Ok(StmtKind::Set(Setting::Thp(thp)));
                }
                "dump" if !self.env.contains_key("dump") => {
                    c.bump();
                    let t = c.word("a process")?;
                    let task = self.use_name(t, NameKind::Process)?;
                    let addr = self.addr(c, "an address")?;
                    let len = c.size("a length")?;
                    c.finish()?;
                    return Ok(StmtKind::Dump { task, addr, len });
                }
                "bench" if !self.env.contains_key("bench") => {
                    c.bump();
                    let (m, tok) = c.keyword::<BenchMark>("`begin` or `end`")?;
                    c.finish()?;
                    let open = m == BenchMark::Begin;
                    if self.bench_open == open {
                        let why = if open {
                            "a `bench begin` is already open (close it with `bench end` first)"
                        } else {
                            "`bench end` without a `bench begin` before it"
                        };
                        return fail(
                            tok.col,
                            ErrorKind::Absurd {
                                text: tok.text.into(),
                                why: why.into(),
                            },
                        );
                    }
                    self.bench_open = open;
                    return Ok(StmtKind::Bench(m));
                }
                "expect" => {
                    c.bump();
                    let e = self.expect(c)?;
                    if matches!(
                        e,
                        Expect::Outcome {
                            action: Action::Spawn { .. },
                            ..
                        }
                    ) {
                        self.spawned = true;
                    }
                    return Ok(StmtKind::Expect(e));
                }
                _ => {}
            }
        }
        let bind = if second_is_eq {
            if !is_ident(first.text) {
                return fail(
                    first.col,
                    ErrorKind::Unexpected {
                        expected: "a name to bind".into(),
                        found: first.text.into(),
                    },
                );
            }
            let Some(name) = Name::new(first.text) else {
                return fail(
                    first.col,
                    ErrorKind::ReservedName {
                        name: first.text.into(),
                    },
                );
            };
            c.bump();
            c.bump();
            Some(name)
        } else {
            None
        };
        let start = c.i;
        let action = self.action(c)?;
        let yields = action.yields();
        if bind.is_some() && yields.is_none() {
            let col = c.toks.get(start + 1).map_or(first.col, |t| t.col);
            return fail(
                col,
                ErrorKind::NothingToBind {
                    verb: action.verb().into(),
                },
            );
        }
        c.finish()?;
        if let (Some(name), Some(kind)) = (&bind, yields) {
            self.env
                .insert(name.as_str().to_owned(), Bound::Known(kind));
        }
        // A process or a file builds the machine: machine settings must come before either.
        if matches!(action, Action::Spawn { .. } | Action::File { .. }) {
            self.spawned = true;
        }
        Ok(StmtKind::Action { bind, action })
    }
}

/// The candidate closest to `word` by edit distance (adjacent swaps count one), if it is
/// close enough to be a typo of it: at most a third of the word's length, and at least one.
/// Words longer than 64 characters get no suggestion (no typo of a tunable is that long,
/// and the distance costs their length times the candidate's).
fn closest(word: &str, candidates: &[&str]) -> Option<String> {
    let len = word.chars().count();
    if len > 64 {
        return None;
    }
    let limit = (len / 3).max(1);
    candidates
        .iter()
        .filter(|c| c.chars().count().abs_diff(len) <= limit)
        .map(|c| (edit_distance(word, c), *c))
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c.to_string())
}

/// Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of
/// adjacent characters each cost one.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let w = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * w];
    for i in 0..=a.len() {
        for j in 0..=b.len() {
            d[i * w + j] = if i == 0 || j == 0 {
                i + j
            } else {
                let cost = usize::from(a[i - 1] != b[j - 1]);
                let mut v = (d[(i - 1) * w + j] + 1)
                    .min(d[i * w + j - 1] + 1)
                    .min(d[(i - 1) * w + j - 1] + cost);
                if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                    v = v.min(d[(i - 2) * w + j - 2] + 1);
                }
                v
            };
        }
    }
    d[a.len() * w + b.len()]
}

fn to_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn kind_word(k: NameKind) -> &'static str {
    match k {
        NameKind::Process => "process",
        NameKind::Mapping => "mapping",
        NameKind::File => "file",
    }
}

#[cfg(test)]
mod tests {
    use super::settings::accepted_values;
    use super::*;

    #[test]
    fn tunable_suggestions() {
        assert_eq!(edit_distance("fork_pte_bach", "fork_pte_batch"), 1);
        assert_eq!(edit_distance("ab", "ba"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(
            accepted_values("stage0..stage2|modern"),
            ["stage0", "stage1", "stage2", "modern"]
        );
        assert_eq!(
            accepted_values("owner|rmap-id[+shared|+cmpxchg][+all]"),
            ["owner", "rmap-id"]
        );
        assert_eq!(accepted_values("integer"), ["integer"]);
        assert_eq!(
            closest("perpte", &["batched", "per-pte"]).as_deref(),
            Some("per-pte")
        );
        assert_eq!(closest("zzz", &["batched", "per-pte"]), None);
        assert!(check_tunable("fork_pte_batch", "per-pte").is_ok());
        assert!(matches!(
            check_tunable("munlock", "stage9"),
            Err(ErrorKind::BadTunableValue { suggestion: Some(s), .. }) if s == "stage0" || s == "stage7"
        ));
    }

    #[test]
    fn patterns() {
        assert_eq!(parse_pattern("0xA5"), Some(0xa5));
        assert_eq!(parse_pattern("0x1"), Some(1));
        assert_eq!(parse_pattern("0x100"), None);
        assert_eq!(parse_pattern("165"), None);
        assert_eq!(parse_pattern("0x"), None);
        assert_eq!(parse_pattern("0xg1"), None);
    }
}
