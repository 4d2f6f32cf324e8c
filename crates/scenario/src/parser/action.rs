//! The actions: what may follow a process name (`fork`, `mmap`, `madvise`, `write`, …) and
//! the file statements, with the `mmap` and `mremap` options.

use super::*;

impl Parser {
    /// `spawn [privileged]` or `TASK VERB ARGS...` (stops before `=` or the end).
    pub(super) fn action(&mut self, c: &mut Cursor<'_, '_>) -> PResult<Action> {
        let t = c.word("a process name or `spawn`")?;
        if t.text == "spawn" {
            if let Some(w) = c.peek().filter(|w| w.kind == TokKind::Word) {
                if w.text != "privileged" {
                    return fail(w.col, unknown_option(w.text, "spawn", "privileged"));
                }
            }
            let privileged = c.eat_word("privileged");
            return Ok(Action::Spawn { privileged });
        }
        if t.text == "file" {
            return self.file(c);
        }
        if !is_ident(t.text) {
            return fail(
                t.col,
                ErrorKind::UnknownStatement {
                    word: t.text.into(),
                },
            );
        }
        let verb = c.peek();
        let verb_text = verb
            .filter(|v| v.kind == TokKind::Word)
            .map(|v| v.text)
            .unwrap_or("");
        if !VERBS.contains(&verb_text) {
            let known = self.env.contains_key(t.text);
            return match verb {
                None if known => c.missing(format!("an operation after `{}`", t.text)),
                Some(v) if known => {
                    if OBSERVATIONS.contains(&v.text) {
                        fail(
                            v.col,
                            ErrorKind::ExpectOnly {
                                verb: v.text.into(),
                            },
                        )
                    } else {
                        fail(
                            v.col,
                            ErrorKind::UnknownStatement {
                                word: v.text.into(),
                            },
                        )
                    }
                }
                _ => fail(
                    t.col,
                    ErrorKind::UnknownStatement {
                        word: t.text.into(),
                    },
                ),
            };
        }
        let task = self.use_name(t, NameKind::Process)?;
        c.bump();
        let action = match verb_text {
            "fork" => Action::Fork { task },
            "exit" => Action::Exit { task },
            "mmap" => Action::Mmap {
                task,
                mmap: self.mmap(c)?,
            },
            "munmap" => {
                let (addr, len) = self.range(c)?;
                Action::Munmap { task, addr, len }
            }
            "mprotect" => {
                let (addr, len) = self.range(c)?;
                let (prot, _) = c.keyword::<Prot>("a protection")?;
                Action::Mprotect {
                    task,
                    addr,
                    len,
                    prot,
                }
            }
            "mremap" => self.mremap(c, task)?,
            "brk" => {
                let delta = match c.peek() {
                    Some(s) if s.kind == TokKind::Plus => {
                        c.bump();
                        BrkDelta::Grow(c.size("a size after `+`")?)
                    }
                    Some(s) if s.kind == TokKind::Minus => {
                        c.bump();
                        BrkDelta::Shrink(c.size("a size after `-`")?)
                    }
                    None => return c.missing("`+SIZE` or `-SIZE`"),
                    Some(s) => {
                        return fail(
                            s.col,
                            ErrorKind::Unexpected {
                                expected: "`+SIZE` or `-SIZE`".into(),
                                found: s.text.into(),
                            },
                        )
                    }
                };
                Action::Brk { task, delta }
            }
            "madvise" => {
                let (addr, len) = self.range(c)?;
                let (advice, _) = c.keyword::<Advice>("an advice")?;
                Action::Madvise {
                    task,
                    addr,
                    len,
                    advice,
                }
            }
            "mlock" => {
                let (addr, len) = self.range(c)?;
                Action::Mlock { task, addr, len }
            }
            "mlock2" => {
                let (addr, len) = self.range(c)?;
                let onfault = self.optional_flag(c, "onfault", "mlock2")?;
                Action::Mlock2 {
                    task,
                    addr,
                    len,
                    onfault,
                }
            }
            "munlock" => {
                let (addr, len) = self.range(c)?;
                Action::Munlock { task, addr, len }
            }
            "mlockall" => {
                let mut flags = MlockallFlags::default();
                loop {
                    let (f, tok) = c.keyword::<MlockallFlag>("an mlockall flag")?;
                    if flags.has(f) {
                        return fail(
                            tok.col,
                            ErrorKind::Duplicate {
                                option: tok.text.into(),
                            },
                        );
                    }
                    flags.set(f);
                    if c.eat_kind(TokKind::Pipe) || c.is_kind(TokKind::Word) {
                        continue;
                    }
                    break;
                }
                Action::Mlockall { task, flags }
            }
            "munlockall" => Action::Munlockall { task },
            "pin" => {
                let (addr, len) = self.range(c)?;
                Action::Pin { task, addr, len }
            }
            "unpin" => {
                let (addr, len) = self.range(c)?;
                Action::Unpin { task, addr, len }
            }
            "write" => {
                let (addr, len) = self.range(c)?;
                let pattern = c.pattern("write")?;
                Action::Write {
                    task,
                    addr,
                    len,
                    pattern,
                }
            }
            "touch" => {
                let (addr, len) = self.range(c)?;
                let (access, _) = c.keyword::<Access>("an access")?;
                Action::Touch {
                    task,
                    addr,
                    len,
                    access,
                }
            }
            "pwrite" => {
                let (file, offset, len) = self.file_range(c)?;
                let pattern = c.pattern("pwrite")?;
                Action::Pwrite {
                    task,
                    file,
                    offset,
                    len,
                    pattern,
                }
            }
            "pread" => {
                let (file, offset, len) = self.file_range(c)?;
                Action::Pread {
                    task,
                    file,
                    offset,
                    len,
                }
            }
            "ftruncate" => {
                let file = self.file_name(c)?;
                let size = c.size("a file size")?;
                Action::Ftruncate { task, file, size }
            }
            "fallocate" => {
                let (file, offset, len) = self.file_range(c)?;
                let punch = self.optional_flag(c, "punch", "fallocate")?;
                Action::Fallocate {
                    task,
                    file,
                    offset,
                    len,
                    punch,
                }
            }
            "msync" => {
                let (addr, len) = self.range(c)?;
                let (mode, _) = c.keyword::<MsyncMode>("an msync mode")?;
                Action::Msync {
                    task,
                    addr,
                    len,
                    mode,
                }
            }
            "fsync" => Action::Fsync {
                task,
                file: self.file_name(c)?,
            },
            "reclaim" => Action::Reclaim {
                task,
                len: c.size("a size to reclaim")?,
            },
            _ => {
                // "read", the last of VERBS.
                let (addr, len) = self.range(c)?;
                Action::Read { task, addr, len }
            }
        };
        Ok(action)
    }

    /// `file SIZE [disk] [pattern=0xNN]` (after the word `file`).
    fn file(&self, c: &mut Cursor<'_, '_>) -> PResult<Action> {
        let size = c.size("a file size")?;
        let mut kind = FileKind::Tmpfs;
        let mut pattern = None;
        let mut disk = false;
        while let Some(t) = c.peek().filter(|t| t.kind == TokKind::Word) {
            match t.text {
                "disk" => {
                    c.bump();
                    set_flag(&mut disk, t)?;
                    kind = FileKind::Disk;
                }
                "tmpfs" => {
                    c.bump();
                    set_flag(&mut disk, t)?;
                }
                "pattern" => {
                    if pattern.is_some() {
                        return fail(
                            t.col,
                            ErrorKind::Duplicate {
                                option: t.text.into(),
                            },
                        );
                    }
                    pattern = Some(c.pattern("file")?);
                }
                _ => {
                    return fail(
                        t.col,
                        unknown_option(t.text, "file", "disk, tmpfs, pattern=0xNN"),
                    )
                }
            }
        }
        Ok(Action::File {
            size,
            kind,
            pattern,
        })
    }

    /// A file name.
    fn file_name(&self, c: &mut Cursor<'_, '_>) -> PResult<Name> {
        let t = c.word("a file name")?;
        self.use_name(t, NameKind::File)
    }

    /// `FILE OFFSET SIZE`.
    pub(super) fn file_range(&self, c: &mut Cursor<'_, '_>) -> PResult<(Name, u64, u64)> {
        let file = self.file_name(c)?;
        let offset = c.size("a file offset")?;
        let len = c.size("a size")?;
        Ok((file, offset, len))
    }

    /// `ADDR SIZE`.
    fn range(&self, c: &mut Cursor<'_, '_>) -> PResult<(AddrExpr, u64)> {
        let addr = self.addr(c, "an address")?;
        let len = c.size("a size")?;
        Ok((addr, len))
    }

    /// An optional trailing word `flag`; any other word is an unknown option.
    fn optional_flag(&self, c: &mut Cursor<'_, '_>, flag: &str, context: &str) -> PResult<bool> {
        match c.peek() {
            Some(t) if t.kind == TokKind::Word => {
                if t.text == flag {
                    c.bump();
                    Ok(true)
                } else {
                    fail(t.col, unknown_option(t.text, context, flag))
                }
            }
            _ => Ok(false),
        }
    }

    fn mmap(&self, c: &mut Cursor<'_, '_>) -> PResult<Mmap> {
        let len = c.size("a size")?;
        let mut prot: Option<(Prot, &str)> = None;
        let mut sharing: Option<(Sharing, &str)> = None;
        let mut backing: Option<(Backing, &str)> = None;
        let mut offset: Option<u64> = None;
        let (mut populate, mut locked, mut noreserve) = (false, false, false);
        let mut placement: Option<(Placement, &str)> = None;
        while let Some(t) = c.peek().filter(|t| t.kind == TokKind::Word) {
            c.bump();
            let conflict = |prev: &str| {
                let kind = if prev == t.text {
                    ErrorKind::Duplicate {
                        option: t.text.into(),
                    }
                } else {
                    ErrorKind::Conflict {
                        option: t.text.into(),
                        with: prev.into(),
                    }
                };
                Fail { col: t.col, kind }
            };
            if let Some(p) = Prot::from_keyword(t.text) {
                if let Some((_, prev)) = prot {
                    return Err(conflict(prev));
                }
                prot = Some((p, t.text));
                continue;
            }
            if let Some(s) = Sharing::from_keyword(t.text) {
                if let Some((_, prev)) = sharing {
                    return Err(conflict(prev));
                }
                sharing = Some((s, t.text));
                continue;
            }
            match t.text {
                "anon" | "file" => {
                    if let Some((_, prev)) = backing {
                        return Err(conflict(prev));
                    }
                    let b = if t.text == "anon" {
                        Backing::Anon
                    } else {
                        Backing::File {
                            file: self.file_name(c)?,
                            offset: 0,
                        }
                    };
                    backing = Some((b, t.text));
                }
                "offset" => {
                    if offset.is_some() {
                        return Err(conflict("offset"));
                    }
                    // An unaligned offset is the call's EINVAL, not a syntax error.
                    offset = Some(c.size("a file offset after `offset`")?);
                }
                "populate" => set_flag(&mut populate, t)?,
                "locked" => set_flag(&mut locked, t)?,
                "norserve" | "noreserve" => set_flag(&mut noreserve, t)?,
                "fixed" | "noreplace" | "hint" => {
                    if let Some((_, prev)) = placement {
                        return Err(conflict(prev));
                    }
                    let a = self.addr(c, &format!("an address after `{}`", t.text))?;
                    let p = match t.text {
                        "fixed" => Placement::Fixed(a),
                        "noreplace" => Placement::FixedNoreplace(a),
                        _ => Placement::Hint(a),
                    };
                    placement = Some((p, t.text));
                }
                _ => return fail(t.col, unknown_option(t.text, "mmap", MMAP_OPTIONS)),
            }
        }
        let Some((prot, _)) = prot else {
            return c.missing("a protection (none|r|rw|rx|rwx)");
        };
        let Some((sharing, _)) = sharing else {
            return c.missing("private or shared");
        };
        let backing = match (backing, offset) {
            (None, _) => return c.missing("`anon` or `file NAME`"),
            (Some((Backing::Anon, _)), Some(_)) => {
                return c.missing("`file NAME` (`offset` needs a file)")
            }
            (Some((Backing::File { file, .. }, _)), Some(o)) => Backing::File { file, offset: o },
            (Some((b, _)), None) => b,
        };
        Ok(Mmap {
            len,
            prot,
            sharing,
            backing,
            populate,
            locked,
            noreserve,
            placement: placement.map_or(Placement::Anywhere, |(p, _)| p),
        })
    }

    fn mremap(&self, c: &mut Cursor<'_, '_>, task: Name) -> PResult<Action> {
        let addr = self.addr(c, "an address")?;
        let old_len = c.size("the old size")?;
        let new_len = c.size("the new size")?;
        let (mut maymove, mut dontunmap) = (false, false);
        let mut fixed = None;
        while let Some(t) = c.peek().filter(|t| t.kind == TokKind::Word) {
            c.bump();
            match t.text {
                "maymove" => set_flag(&mut maymove, t)?,
                "dontunmap" => set_flag(&mut dontunmap, t)?,
                "fixed" => {
                    if fixed.is_some() {
                        return fail(
                            t.col,
                            ErrorKind::Duplicate {
                                option: t.text.into(),
                            },
                        );
                    }
                    fixed = Some(self.addr(c, "an address after `fixed`")?);
                }
                _ => {
                    return fail(
                        t.col,
                        unknown_option(t.text, "mremap", "maymove, dontunmap, fixed ADDR"),
                    )
                }
            }
        }
        Ok(Action::Mremap {
            task,
            addr,
            old_len,
            new_len,
            maymove,
            dontunmap,
            fixed,
        })
    }
}
