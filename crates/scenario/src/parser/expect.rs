//! `expect …`: an expected outcome of an action, or an observation (smaps, status, maps,
//! pagemap, kpageflags, folio, fincore, pread, read) and `expect counters`.

use super::*;

impl Parser {
    pub(super) fn expect(&mut self, c: &mut Cursor<'_, '_>) -> PResult<Expect> {
        let Some(t) = c.peek() else {
            return c.missing("a statement after `expect`");
        };
        if t.kind == TokKind::Word
            && t.text != "spawn"
            && c.peek_at(1).is_some_and(|n| n.kind == TokKind::Eq)
        {
            return fail(
                t.col,
                ErrorKind::BindInExpect {
                    name: t.text.into(),
                },
            );
        }
        if t.kind == TokKind::Word && t.text == "counters" && !self.env.contains_key("counters") {
            c.bump();
            let values = counters(c)?;
            return Ok(Expect::Counters { values });
        }
        if let Some(v) = c.peek_at(1).filter(|v| v.kind == TokKind::Word) {
            if OBSERVATIONS.contains(&v.text) && t.text != "spawn" {
                let task = self.use_name(t, NameKind::Process)?;
                c.bump();
                c.bump();
                let e = self.observation(c, task, v.text)?;
                c.finish()?;
                return Ok(e);
            }
        }
        let action = self.action(c)?;
        if let Action::Pread {
            task,
            file,
            offset,
            len,
        } = &action
        {
            if c.is_word("pattern") {
                let pattern = c.pattern("pread")?;
                c.finish()?;
                return Ok(Expect::Pread {
                    task: task.clone(),
                    file: file.clone(),
                    offset: *offset,
                    len: *len,
                    pattern,
                });
            }
        }
        if let Action::Read { task, addr, len } = &action {
            if c.is_word("pattern") {
                let pattern = c.pattern("read")?;
                c.finish()?;
                return Ok(Expect::Read {
                    task: task.clone(),
                    addr: addr.clone(),
                    len: *len,
                    pattern,
                });
            }
        }
        let what = if matches!(action, Action::Read { .. } | Action::Pread { .. }) {
            "`pattern=0xNN` or `= SIGSEGV|SIGBUS`"
        } else if action.is_access() {
            "`= SIGSEGV|SIGBUS` (the expected signal)"
        } else {
            "`= ERRNO` (the expected error)"
        };
        match c.peek() {
            None => return c.missing(what),
            Some(e) if e.kind == TokKind::Eq => {
                c.bump();
            }
            Some(e) => {
                return fail(
                    e.col,
                    ErrorKind::Unexpected {
                        expected: what.into(),
                        found: e.text.into(),
                    },
                )
            }
        }
        let o = c.word("an errno or a signal")?;
        let outcome = if let Some(e) = Errno::from_keyword(o.text) {
            Outcome::Errno(e)
        } else if let Some(s) = Signal::from_keyword(o.text) {
            Outcome::Signal(s)
        } else {
            return fail(
                o.col,
                unknown_option(
                    o.text,
                    "expect",
                    &format!("{}|{}", Errno::choices(), Signal::choices()),
                ),
            );
        };
        let why = match (action.is_access(), outcome) {
            (true, Outcome::Errno(_)) => Some("a memory access fails with SIGSEGV or SIGBUS"),
            (false, Outcome::Signal(_)) => Some("only read, write and touch raise signals"),
            _ => None,
        };
        if let Some(why) = why {
            return fail(
                o.col,
                ErrorKind::BadOutcome {
                    verb: action.verb().into(),
                    outcome: o.text.into(),
                    why: why.into(),
                },
            );
        }
        c.finish()?;
        Ok(Expect::Outcome { action, outcome })
    }

    fn observation(&self, c: &mut Cursor<'_, '_>, task: Name, verb: &str) -> PResult<Expect> {
        Ok(match verb {
            "smaps" => {
                let m = c.word("a mapping name")?;
                let mapping = self.use_name(m, NameKind::Mapping)?;
                let fields = fields::<SmapsField>(c, "an smaps field")?;
                Expect::Smaps {
                    task,
                    mapping,
                    fields,
                }
            }
            "status" => Expect::Status {
                task,
                fields: fields::<StatusField>(c, "a status field")?,
            },
            "maps" => {
                if c.is_word("count") && c.peek_at(1).is_some_and(|t| t.kind == TokKind::Eq) {
                    c.bump();
                    c.bump();
                    let count = c.number("a VMA count")?;
                    Expect::MapsCount { task, count }
                } else {
                    let addr = self.addr(c, "an address or `count=N`")?;
                    let s = c.word("START-END")?;
                    let start = Cursor::abs_addr(s)?;
                    match c.peek() {
                        Some(m) if m.kind == TokKind::Minus => {
                            c.bump();
                        }
                        None => return c.missing("`-END` after START"),
                        Some(m) => {
                            return fail(
                                m.col,
                                ErrorKind::Unexpected {
                                    expected: "`-END` after START".into(),
                                    found: m.text.into(),
                                },
                            )
                        }
                    }
                    let e = c.word("END")?;
                    let end = Cursor::abs_addr(e)?;
                    if start >= end {
                        return fail(
                            s.col,
                            ErrorKind::Absurd {
                                text: format!("{}-{}", s.text, e.text),
                                why: "START must be below END".into(),
                            },
                        );
                    }
                    let Some((col, text)) = c.glued_run() else {
                        return c.missing("permissions like rw-p");
                    };
                    let perms = Perms::parse(text).ok_or_else(|| Fail {
                        col,
                        kind: ErrorKind::BadPerms { text: text.into() },
                    })?;
                    Expect::MapsVma {
                        task,
                        addr,
                        start,
                        end,
                        perms,
                    }
                }
            }
            "pagemap" => {
                let addr = self.addr(c, "an address")?;
                let mut states = Vec::new();
                loop {
                    let (s, tok) = c.keyword::<PagemapState>("a pagemap state")?;
                    if states.contains(&s) {
                        return fail(
                            tok.col,
                            ErrorKind::Duplicate {
                                option: tok.text.into(),
                            },
                        );
                    }
                    states.push(s);
                    if c.peek().is_none() {
                        break;
                    }
                }
                Expect::Pagemap { task, addr, states }
            }
            "kpageflags" => {
                let addr = self.addr(c, "an address")?;
                let mut flags: Vec<FlagCheck> = Vec::new();
                loop {
                    let set = !c.eat_kind(TokKind::Bang);
                    let (flag, tok) = c.keyword::<KpageFlag>("a page flag")?;
                    if flags.iter().any(|f| f.flag == flag) {
                        return fail(
                            tok.col,
                            ErrorKind::Duplicate {
                                option: tok.text.into(),
                            },
                        );
                    }
                    flags.push(FlagCheck { flag, set });
                    if c.peek().is_none() {
                        break;
                    }
                }
                Expect::Kpageflags { task, addr, flags }
            }
            "fincore" => {
                let (file, offset, len) = self.file_range(c)?;
                let bytes = c.size("the cached bytes")?;
                Expect::Fincore {
                    task,
                    file,
                    offset,
                    len,
                    bytes,
                }
            }
            _ => {
                // "folio", the last of OBSERVATIONS.
                let addr = self.addr(c, "an address")?;
                c.key_eq("order", "folio")?;
                let order = to_u32(c.bounded("a folio order", 0, 63)?);
                Expect::Folio { task, addr, order }
            }
        })
    }
}

/// `Field=SIZE...` (at least one, no repeats) to the end of the line.
fn fields<K: Keyword + PartialEq>(c: &mut Cursor<'_, '_>, what: &str) -> PResult<Vec<(K, u64)>> {
    let mut out: Vec<(K, u64)> = Vec::new();
    loop {
        let (k, tok) = c.keyword::<K>(what)?;
        if out.iter().any(|(f, _)| *f == k) {
            return fail(
                tok.col,
                ErrorKind::Duplicate {
                    option: tok.text.into(),
                },
            );
        }
        c.eq(tok.text)?;
        let v = c.size("a size")?;
        out.push((k, v));
        if c.peek().is_none() {
            return Ok(out);
        }
    }
}

/// `NAME=N...` of `expect counters`: engine counter names (checked, with a suggestion for a
/// misspelt one), each at most once, values as sizes (a count of bytes may say `64K`).
fn counters(c: &mut Cursor<'_, '_>) -> PResult<Vec<(String, u64)>> {
    let names: Vec<&str> = usermm::Ev::ALL.iter().map(|e| e.name()).collect();
    let mut out: Vec<(String, u64)> = Vec::new();
    loop {
        let tok = c.word("a counter name")?;
        if !names.contains(&tok.text) {
            return fail(
                tok.col,
                ErrorKind::UnknownCounter {
                    name: tok.text.into(),
                    suggestion: closest(tok.text, &names),
                },
            );
        }
        if out.iter().any(|(n, _)| n == tok.text) {
            return fail(
                tok.col,
                ErrorKind::Duplicate {
                    option: tok.text.into(),
                },
            );
        }
        c.eq(tok.text)?;
        let v = c.size("a count")?;
        out.push((tok.text.to_owned(), v));
        if c.peek().is_none() {
            return Ok(out);
        }
    }
}
