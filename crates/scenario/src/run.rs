//! Runs a parsed scenario on a [`Backend`].
//!
//! Statements execute in order. An action that fails without an `expect` aborts the run; a
//! failed `expect` is recorded and the run goes on. With [`RunOptions::validate`] the engine's
//! whole-state checker runs after every statement and any violation is a failure.

use crate::ast::{
    Action, AddrExpr, Backing, BrkDelta, Expect, Keyword, Limit, Name, Outcome, PagemapState,
    Placement, Setting, SmapsField, StatusField, Stmt, StmtKind,
};
use crate::backend::{
    Backend, Fail, FileId, LockOp, MmapReq, MremapOpts, Place, ProcId, Res, SmapsView, VmaKind,
    VmaView,
};
use std::collections::HashMap;

mod whole;
pub use whole::{run, RunOptions, RunReport, StmtStats};

/// The most one `pread` statement reads (64 MiB).
pub const MAX_PREAD: u64 = 64 << 20;

/// One failed expectation (or an aborting error).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
    /// What was expected and what was found.
    pub message: String,
}

/// Why a run stopped early.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Abort {
    /// A statement failed without an `expect` (exit 1).
    Failed(String),
    /// The statement cannot be run by this backend, or a setting is invalid (exit 2).
    CannotRun(String),
}

/// What one statement did.
#[derive(Clone, Debug, Default)]
pub struct Step {
    /// The action's result, for statements that perform one.
    pub outcome: Option<Result<String, Fail>>,
    /// A failed expectation.
    pub expect_failure: Option<String>,
    /// Set when the run must stop.
    pub abort: Option<Abort>,
    /// Whether the statement may have changed an address space.
    pub changes_space: bool,
    /// Text the statement prints (`dump`).
    pub output: Option<String>,
}

/// A mapping name's binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// Start address on this backend.
    pub addr: u64,
    /// Length the statement asked for.
    pub len: u64,
}

/// Executes statements on one backend, keeping the names the script binds.
#[derive(Debug)]
pub struct Runner<B> {
    /// The backend.
    pub backend: B,
    procs: HashMap<Name, ProcId>,
    maps: HashMap<Name, Binding>,
    /// Address ranges each process's statements created (what `maps`/`smaps` consider).
    ranges: HashMap<ProcId, Vec<(u64, u64)>>,
    /// Files by name (v2).
    files: HashMap<Name, FileId>,
    rlimit: Option<u64>,
    /// The counters at the previous `expect counters` (none yet: the run's start, all zero).
    counter_base: HashMap<&'static str, u64>,
}

fn outcome_name(o: &Outcome) -> String {
    match o {
        Outcome::Errno(e) => e.as_str().to_string(),
        Outcome::Signal(s) => s.as_str().to_string(),
    }
}

/// Printable result of an action.
pub fn fail_name(f: &Fail) -> String {
    match f {
        Fail::Outcome(o) => outcome_name(o),
        Fail::Unsupported(m) => format!("unsupported ({m})"),
    }
}

fn kb(v: u64) -> String {
    if v.is_multiple_of(1024) {
        format!("{}K", v / 1024)
    } else {
        format!("{v}")
    }
}

/// Status lines computed from the scenario's VMAs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScenarioStatus {
    /// VmRSS.
    pub vm_rss: u64,
    /// RssAnon.
    pub rss_anon: u64,
    /// RssShmem.
    pub rss_shmem: u64,
    /// RssFile.
    pub rss_file: u64,
    /// VmLck.
    pub vm_lck: u64,
    /// VmSize.
    pub vm_size: u64,
    /// VmData.
    pub vm_data: u64,
    /// VmPin.
    pub vm_pin: u64,
    /// VmSwap: the swap entries of the scenario's mappings (smaps `Swap` summed).
    pub vm_swap: u64,
}

impl<B: Backend> Runner<B> {
    /// A runner with no processes.
    pub fn new(backend: B) -> Self {
        Runner {
            backend,
            procs: HashMap::new(),
            maps: HashMap::new(),
            ranges: HashMap::new(),
            files: HashMap::new(),
            rlimit: Some(usermm::machine::DEFAULT_RLIMIT_MEMLOCK),
            counter_base: HashMap::new(),
        }
    }

    /// The live processes by name (sorted).
    pub fn processes(&self) -> Vec<(Name, ProcId)> {
        let mut v: Vec<_> = self.procs.iter().map(|(n, p)| (n.clone(), *p)).collect();
        v.sort();
        v
    }

    /// The mapping bindings by name.
    pub fn bindings(&self) -> &HashMap<Name, Binding> {
        &self.maps
    }

    /// Expresses `addr` relative to the binding whose range contains it (`a+0x1000`).
    pub fn relative(&self, addr: u64) -> String {
        let mut best: Option<(&Name, &Binding)> = None;
        for (n, b) in &self.maps {
            if addr >= b.addr
                && addr <= b.addr + b.len
                && best.is_none_or(|(bn, bb)| (b.addr, n) > (bb.addr, bn))
            {
                best = Some((n, b));
            }
        }
        match best {
            Some((n, b)) if addr == b.addr => n.as_str().to_string(),
            Some((n, b)) => format!("{}+{:#x}", n.as_str(), addr - b.addr),
            None => format!("{addr:#x}"),
        }
    }

    fn pid(&self, n: &Name) -> Result<ProcId, Abort> {
        self.procs
            .get(n)
            .copied()
            .ok_or_else(|| Abort::CannotRun(format!("process `{}` does not exist", n.as_str())))
    }

    /// A `pread` returns its bytes: its length is bounded so a statement cannot make the
    /// runner allocate gigabytes (a larger read is refused before anything runs).
    fn pread_len(len: u64) -> Result<u64, Abort> {
        if len > MAX_PREAD {
            return Err(Abort::CannotRun(format!(
                "pread of {len} bytes: at most {} MiB per statement",
                MAX_PREAD >> 20
            )));
        }
        Ok(len)
    }

    fn file(&self, n: &Name) -> Result<FileId, Abort> {
        self.files
            .get(n)
            .copied()
            .ok_or_else(|| Abort::CannotRun(format!("file `{}` does not exist", n.as_str())))
    }

    /// The address `a` names on this backend, if its names are bound.
    pub fn resolve(&self, a: &AddrExpr) -> Option<u64> {
        a.resolve(|n| self.maps.get(n).map(|m| m.addr))
    }

    fn addr(&self, a: &AddrExpr) -> Result<u64, Abort> {
        a.resolve(|n| self.maps.get(n).map(|m| m.addr))
            .ok_or_else(|| Abort::CannotRun("address expression cannot be resolved".into()))
    }

    /// The VMAs of `p` that overlap ranges its statements created.
    pub fn scenario_vmas(&mut self, p: ProcId) -> Res<Vec<VmaView>> {
        let ranges = self.ranges.get(&p).cloned().unwrap_or_default();
        let all = self.backend.vmas(p)?;
        Ok(all
            .into_iter()
            .filter(|v| ranges.iter().any(|&(s, e)| v.start < e && s < v.end))
            .collect())
    }

    /// `status` as the scenario sees it: its own mappings only.
    pub fn scenario_status(&mut self, p: ProcId) -> Res<ScenarioStatus> {
        let vmas = self.scenario_vmas(p)?;
        let mut s = ScenarioStatus {
            vm_pin: self.backend.status(p)?.vm_pin,
            ..ScenarioStatus::default()
        };
        for v in &vmas {
            s.vm_rss += v.smaps.rss;
            s.rss_anon += v.smaps.anonymous;
            // VmSwap is the swap entries in the page tables (`MM_SWAPENTS`): a shared
            // shmem mapping's Swap is its object's, not the process's.
            let shared_object = v.kind != VmaKind::Anon && v.perms.ends_with('s');
            if !shared_object {
                s.vm_swap += v.smaps.swap;
            }
            // Pages that are not anonymous are the file's: shmem for tmpfs and shared
            // anonymous memory (MM_SHMEMPAGES), file pages otherwise (MM_FILEPAGES).
            let file_pages = v.smaps.rss.saturating_sub(v.smaps.anonymous);
            match v.kind {
                VmaKind::Anon => {}
                VmaKind::SharedAnon | VmaKind::TmpfsFile => s.rss_shmem += file_pages,
                VmaKind::DiskFile => s.rss_file += file_pages,
            }
            if v.locked {
                s.vm_lck += v.end - v.start;
            }
            s.vm_size += v.end - v.start;
            if v.perms.as_bytes().get(1) == Some(&b'w') && v.perms.ends_with('p') {
                s.vm_data += v.end - v.start;
            }
        }
        Ok(s)
    }

    fn track(&mut self, p: ProcId, start: u64, len: u64) {
        self.ranges
            .entry(p)
            .or_default()
            .push((start, start.saturating_add(len.max(1))));
    }

    /// Runs one statement on the CPU it names (`on cpuN`, else cpu0).
    pub fn run_stmt(&mut self, stmt: &Stmt) -> Step {
        if let Some(task) = stmt.kind.task() {
            // An unknown process is the statement's own error, reported by `step`.
            if let Ok(p) = self.pid(task) {
                if let Err(f) = self.backend.on_cpu(p, stmt.cpu.unwrap_or(0)) {
                    return Step {
                        abort: Some(Abort::CannotRun(format!("on cpu: {}", fail_name(&f)))),
                        ..Step::default()
                    };
                }
            }
        }
        self.step(&stmt.kind)
    }

    /// Runs one statement's action or check (on the CPU last chosen by [`Runner::run_stmt`]).
    pub fn step(&mut self, kind: &StmtKind) -> Step {
        match kind {
            StmtKind::Set(s) => Step {
                abort: self.set(s).err(),
                ..Step::default()
            },
            StmtKind::Action { bind, action } => {
                let mut step = Step {
                    changes_space: !matches!(action, Action::Read { .. } | Action::Pread { .. }),
                    ..Step::default()
                };
                match self.action(bind.as_ref(), action) {
                    Err(a) => step.abort = Some(a),
                    Ok(Ok(desc)) => step.outcome = Some(Ok(desc)),
                    Ok(Err(Fail::Unsupported(m))) => {
                        step.abort = Some(Abort::CannotRun(format!("{}: {m}", action.verb())));
                        step.outcome = Some(Err(Fail::Unsupported(m)));
                    }
                    Ok(Err(f)) => {
                        step.abort = Some(Abort::Failed(format!(
                            "{} failed: {}",
                            action.verb(),
                            fail_name(&f)
                        )));
                        step.outcome = Some(Err(f));
                    }
                }
                step
            }
            StmtKind::Expect(Expect::Outcome { action, outcome }) => {
                let mut step = Step {
                    changes_space: true,
                    ..Step::default()
                };
                match self.action(None, action) {
                    Err(a) => step.abort = Some(a),
                    Ok(Ok(desc)) => {
                        step.expect_failure = Some(format!(
                            "expected {} = {}, but it succeeded",
                            action.verb(),
                            outcome_name(outcome)
                        ));
                        step.outcome = Some(Ok(desc));
                    }
                    Ok(Err(Fail::Unsupported(m))) => {
                        step.abort = Some(Abort::CannotRun(format!("{}: {m}", action.verb())))
                    }
                    Ok(Err(Fail::Outcome(got))) => {
                        if got != *outcome {
                            step.expect_failure = Some(format!(
                                "expected {} = {}, found {}",
                                action.verb(),
                                outcome_name(outcome),
                                outcome_name(&got)
                            ));
                        }
                        step.outcome = Some(Err(Fail::Outcome(got)));
                    }
                }
                step
            }
            StmtKind::Bench(_) => Step::default(),
            StmtKind::Dump { task, addr, len } => {
                let dumped = self.pid(task).and_then(|p| {
                    let a = self.addr(addr)?;
                    Ok(self.backend.dump(p, a, *len))
                });
                match dumped {
                    Err(a) => Step {
                        abort: Some(a),
                        ..Step::default()
                    },
                    Ok(Ok(text)) => Step {
                        output: Some(text),
                        ..Step::default()
                    },
                    Ok(Err(Fail::Unsupported(m))) => Step {
                        abort: Some(Abort::CannotRun(format!("dump: {m}"))),
                        ..Step::default()
                    },
                    Ok(Err(f)) => Step {
                        abort: Some(Abort::Failed(format!("dump failed: {}", fail_name(&f)))),
                        ..Step::default()
                    },
                }
            }
            StmtKind::Expect(x) => match self.expect(x) {
                Ok(msg) => Step {
                    expect_failure: msg,
                    ..Step::default()
                },
                Err(a) => Step {
                    abort: Some(a),
                    ..Step::default()
                },
            },
        }
    }

    fn set(&mut self, s: &Setting) -> Result<(), Abort> {
        let unsupported = |f: Fail| Abort::CannotRun(fail_name(&f));
        match s {
            Setting::Thp(list) => self.backend.set_thp(list).map_err(unsupported),
            Setting::Shmem(list) => self.backend.set_shmem(list).map_err(unsupported),
            Setting::Rlimit { limit, .. } => {
                self.rlimit = match limit {
                    Limit::Bytes(b) => Some(*b),
                    Limit::Unlimited => None,
                };
                Ok(())
            }
            Setting::Mempolicy(m) => self
                .backend
                .set_mempolicy(m.as_str() == "interleave")
                .map_err(unsupported),
            other => self.backend.set_engine(other).map_err(unsupported),
        }
    }

    /// Resolves the addresses of an action, runs it, and binds the result.
    fn action(&mut self, bind: Option<&Name>, a: &Action) -> Result<Res<String>, Abort> {
        let p = match a.task() {
            Some(t) => self.pid(t)?,
            None => 0,
        };
        let b = &mut self.backend;
        let res = match a {
            Action::Spawn { privileged } => b.spawn(*privileged, self.rlimit).map(|np| {
                if let Some(n) = bind {
                    self.procs.insert(n.clone(), np);
                }
                format!("pid {np}")
            }),
            Action::Fork { .. } => b.fork(p).map(|np| {
                let inherited = self.ranges.get(&p).cloned().unwrap_or_default();
                self.ranges.insert(np, inherited);
                if let Some(n) = bind {
                    self.procs.insert(n.clone(), np);
                }
                format!("pid {np}")
            }),
            Action::Exit { .. } => b.exit(p).map(|_| {
                self.ranges.remove(&p);
                String::new()
            }),
            Action::Mmap { mmap, .. } => {
                let place = match &mmap.placement {
                    Placement::Anywhere => Place::Anywhere,
                    Placement::Hint(x) => Place::Hint(self.addr(x)?),
                    Placement::Fixed(x) => Place::Fixed(self.addr(x)?),
                    Placement::FixedNoreplace(x) => Place::FixedNoreplace(self.addr(x)?),
                };
                let file = match &mmap.backing {
                    Backing::Anon => None,
                    Backing::File { file, offset } => Some((self.file(file)?, *offset)),
                };
                let req = MmapReq {
                    file,
                    len: mmap.len,
                    prot: mmap.prot,
                    sharing: mmap.sharing,
                    populate: mmap.populate,
                    locked: mmap.locked,
                    noreserve: mmap.noreserve,
                    place,
                };
                let r = self.backend.mmap(p, &req);
                if let Ok(addr) = r {
                    self.bind_map(bind, p, addr, mmap.len);
                }
                r.map(|addr| format!("{addr:#x}"))
            }
            Action::Munmap { addr, len, .. } => {
                let a = self.addr(addr)?;
                self.backend.munmap(p, a, *len).map(|_| String::new())
            }
            Action::Mprotect {
                addr, len, prot, ..
            } => {
                let a = self.addr(addr)?;
                self.backend
                    .mprotect(p, a, *len, *prot)
                    .map(|_| String::new())
            }
            Action::Mremap {
                addr,
                old_len,
                new_len,
                maymove,
                dontunmap,
                fixed,
                ..
            } => {
                let a = self.addr(addr)?;
                let fixed = match fixed {
                    Some(x) => Some(self.addr(x)?),
                    None => None,
                };
                let opts = MremapOpts {
                    maymove: *maymove,
                    dontunmap: *dontunmap,
                    fixed,
                };
                let r = self.backend.mremap(p, a, *old_len, *new_len, opts);
                if let Ok(na) = r {
                    self.bind_map(bind, p, na, *new_len);
                }
                r.map(|na| format!("{na:#x}"))
            }
            Action::Brk { delta, .. } => {
                let cur = match self.backend.brk(p, 0) {
                    Ok(c) => c,
                    Err(f) => return Ok(Err(f)),
                };
                let (want, len) = match delta {
                    BrkDelta::Grow(d) => (cur.checked_add(*d), *d),
                    BrkDelta::Shrink(d) => (cur.checked_sub(*d), *d),
                };
                let enomem = Fail::Outcome(Outcome::Errno(crate::ast::Errno::ENOMEM));
                match want {
                    None => Err(enomem),
                    Some(w) => match self.backend.brk(p, w) {
                        Ok(got) if got == w => {
                            let start = cur.min(w);
                            self.bind_map(bind, p, cur, len);
                            self.track(p, start, len);
                            Ok(format!("{cur:#x}"))
                        }
                        Ok(_) => Err(enomem),
                        Err(f) => Err(f),
                    },
                }
            }
            Action::Madvise {
                addr, len, advice, ..
            } => {
                let a = self.addr(addr)?;
                self.backend
                    .madvise(p, a, *len, *advice)
                    .map(|_| String::new())
            }
            Action::Reclaim { len, .. } => self.backend.reclaim(p, *len).map(|_| String::new()),
            Action::Mlock { addr, len, .. } => {
                let a = self.addr(addr)?;
                self.backend
                    .mlock(p, a, *len, LockOp::Mlock)
                    .map(|_| String::new())
            }
            Action::Mlock2 {
                addr, len, onfault, ..
            } => {
                let a = self.addr(addr)?;
                let op = if *onfault {
                    LockOp::Mlock2Onfault
                } else {
                    LockOp::Mlock
                };
                self.backend.mlock(p, a, *len, op).map(|_| String::new())
            }
            Action::Munlock { addr, len, .. } => {
                let a = self.addr(addr)?;
                self.backend
                    .mlock(p, a, *len, LockOp::Munlock)
                    .map(|_| String::new())
            }
            Action::Mlockall { flags, .. } => {
                self.backend.mlockall(p, *flags).map(|_| String::new())
            }
            Action::Munlockall { .. } => self.backend.munlockall(p).map(|_| String::new()),
            Action::Pin { addr, len, .. } => {
                let a = self.addr(addr)?;
                self.backend.pin(p, a, *len).map(|_| String::new())
            }
            Action::Unpin { addr, len, .. } => {
                let a = self.addr(addr)?;
                self.backend.unpin(p, a, *len).map(|_| String::new())
            }
            Action::Write {
                addr, len, pattern, ..
            } => {
                let a = self.addr(addr)?;
                self.backend
                    .write(p, a, *len, *pattern)
                    .map(|_| String::new())
            }
            Action::Touch {
                addr, len, access, ..
            } => {
                let a = self.addr(addr)?;
                self.backend
                    .touch(p, a, *len, access.as_str() == "write")
                    .map(|_| String::new())
            }
            Action::Read { addr, len, .. } => {
                let a = self.addr(addr)?;
                self.backend.touch(p, a, *len, false).map(|_| String::new())
            }
            Action::File {
                size,
                kind,
                pattern,
            } => self.backend.file_create(*size, *kind, *pattern).map(|f| {
                if let Some(n) = bind {
                    self.files.insert(n.clone(), f);
                }
                format!("file {f}")
            }),
            Action::Pwrite {
                file,
                offset,
                len,
                pattern,
                ..
            } => {
                let f = self.file(file)?;
                self.backend
                    .pwrite(p, f, *offset, *len, *pattern)
                    .map(|_| String::new())
            }
            Action::Pread {
                file, offset, len, ..
            } => {
                let f = self.file(file)?;
                let len = Self::pread_len(*len)?;
                self.backend
                    .pread(p, f, *offset, len)
                    .map(|d| format!("{} bytes", d.len()))
            }
            Action::Ftruncate { file, size, .. } => {
                let f = self.file(file)?;
                self.backend.ftruncate(p, f, *size).map(|_| String::new())
            }
            Action::Fallocate {
                file,
                offset,
                len,
                punch,
                ..
            } => {
                let f = self.file(file)?;
                self.backend
                    .fallocate(p, f, *offset, *len, *punch)
                    .map(|_| String::new())
            }
            Action::Msync {
                addr, len, mode, ..
            } => {
                let a = self.addr(addr)?;
                self.backend.msync(p, a, *len, *mode).map(|_| String::new())
            }
            Action::Fsync { file, .. } => {
                let f = self.file(file)?;
                self.backend.fsync(p, f).map(|_| String::new())
            }
        };
        Ok(res)
    }

    fn bind_map(&mut self, bind: Option<&Name>, p: ProcId, addr: u64, len: u64) {
        // The kernel maps whole pages: a 4097-byte mapping is 8K long (smaps Size, clipping).
        let len = len.checked_next_multiple_of(4096).unwrap_or(len);
        self.track(p, addr, len);
        if let Some(n) = bind {
            self.maps.insert(n.clone(), Binding { addr, len });
        }
    }

    fn expect(&mut self, x: &Expect) -> Result<Option<String>, Abort> {
        let p = match x.task() {
            Some(t) => self.pid(t)?,
            None => 0,
        };
        let cannot = |f: Fail| Abort::CannotRun(fail_name(&f));
        match x {
            Expect::Outcome { .. } => Ok(None),
            Expect::Counters { values } => {
                let now: HashMap<&'static str, u64> = self
                    .backend
                    .counters()
                    .map_err(cannot)?
                    .into_iter()
                    .collect();
                let wrong: Vec<String> = values
                    .iter()
                    .filter_map(|(name, want)| {
                        let cur = now.get(name.as_str()).copied().unwrap_or(0);
                        let base = self.counter_base.get(name.as_str()).copied().unwrap_or(0);
                        let got = cur.wrapping_sub(base);
                        (got != *want).then(|| format!("{name}={got} (expected {want})"))
                    })
                    .collect();
                self.counter_base = now;
                Ok((!wrong.is_empty()).then(|| format!("counters: {}", wrong.join(", "))))
            }
            Expect::Read {
                addr, len, pattern, ..
            } => {
                let a = self.addr(addr)?;
                Ok(match self.backend.check(p, a, *len, *pattern) {
                    Ok(None) => None,
                    Ok(Some((off, v))) => Some(format!(
                        "read: expected pattern={pattern:#04x}, found {v:#04x} at offset {off:#x}"
                    )),
                    Err(Fail::Unsupported(m)) => return Err(Abort::CannotRun(m)),
                    Err(f) => Some(format!(
                        "read: expected pattern={pattern:#04x}, found {}",
                        fail_name(&f)
                    )),
                })
            }
            Expect::Smaps {
                mapping, fields, ..
            } => {
                let b = *self.maps.get(mapping).ok_or_else(|| {
                    Abort::CannotRun(format!("unknown mapping `{}`", mapping.as_str()))
                })?;
                let (s, e) = (b.addr, b.addr + b.len);
                let mut total = SmapsView::default();
                for v in self
                    .backend
                    .vmas(p)
                    .map_err(cannot)?
                    .iter()
                    .filter(|v| v.start < e && s < v.end)
                {
                    total.add(&v.smaps);
                    total.size -= v.smaps.size;
                    total.size += v.end.min(e) - v.start.max(s);
                }
                let mut bad = Vec::new();
                for (f, want) in fields {
                    let Some(got) = smaps_field(&total, *f) else {
                        return Err(Abort::CannotRun(format!(
                            "smaps {}: not told apart per mapping here",
                            f.as_str()
                        )));
                    };
                    // Sizes are printed in kB; THPeligible is a flag.
                    let unit = if *f == SmapsField::ThpEligible {
                        1
                    } else {
                        1024
                    };
                    if got / unit != want / unit {
                        bad.push(format!(
                            "{}: expected {}, found {}",
                            f.as_str(),
                            kb(*want),
                            kb(got)
                        ));
                    }
                }
                Ok((!bad.is_empty()).then(|| format!("smaps {}", bad.join(", "))))
            }
            Expect::Status { fields, .. } => {
                let s = self.scenario_status(p).map_err(cannot)?;
                let bad: Vec<String> = fields
                    .iter()
                    .filter_map(|(f, want)| {
                        let got = match f {
                            StatusField::VmSize | StatusField::VmPeak => s.vm_size,
                            StatusField::VmLck => s.vm_lck,
                            StatusField::VmPin => s.vm_pin,
                            StatusField::VmRSS | StatusField::VmHWM => s.vm_rss,
                            StatusField::RssAnon => s.rss_anon,
                            StatusField::RssShmem => s.rss_shmem,
                            StatusField::RssFile => s.rss_file,
                            StatusField::VmSwap => s.vm_swap,
                            StatusField::VmPTE => 0,
                            StatusField::VmData => s.vm_data,
                        };
                        (got / 1024 != want / 1024).then(|| {
                            format!("{}: expected {}, found {}", f.as_str(), kb(*want), kb(got))
                        })
                    })
                    .collect();
                Ok((!bad.is_empty()).then(|| format!("status {}", bad.join(", "))))
            }
            Expect::MapsCount { count, .. } => {
                let n = self.scenario_vmas(p).map_err(cannot)?.len() as u64;
                Ok((n != *count).then(|| format!("maps count: expected {count}, found {n}")))
            }
            Expect::MapsVma {
                addr,
                start,
                end,
                perms,
                ..
            } => {
                let a = self.addr(addr)?;
                let want = format!("{start:#x}-{end:#x} {perms}");
                let vmas = self.backend.vmas(p).map_err(cannot)?;
                Ok(match vmas.iter().find(|v| v.start <= a && a < v.end) {
                    None => Some(format!("maps: expected {want}, found no mapping at {a:#x}")),
                    Some(v) => {
                        let got = format!("{:#x}-{:#x} {}", v.start, v.end, v.perms);
                        (got != want).then(|| format!("maps: expected {want}, found {got}"))
                    }
                })
            }
            Expect::Pagemap { addr, states, .. } => {
                let a = self.addr(addr)?;
                let pv = self.backend.page(p, a).map_err(cannot)?;
                let bad: Vec<&str> = states
                    .iter()
                    .filter(|s| !match s {
                        PagemapState::Exclusive => pv.present && pv.exclusive,
                        PagemapState::Shared => pv.present && !pv.exclusive,
                        PagemapState::Present => pv.present,
                        PagemapState::Absent => !pv.present,
                        PagemapState::Swapped => pv.swapped,
                    })
                    .map(|s| s.as_str())
                    .collect();
                Ok((!bad.is_empty()).then(|| {
                    format!(
                        "pagemap: expected {}, found present={} exclusive={} swapped={}",
                        bad.join(" "),
                        pv.present,
                        pv.exclusive,
                        pv.swapped
                    )
                }))
            }
            Expect::Kpageflags { addr, flags, .. } => {
                let a = self.addr(addr)?;
                let pv = self.backend.page(p, a).map_err(cannot)?;
                let Some(word) = pv.kpageflags else {
                    return Ok(Some("kpageflags: no page mapped".into()));
                };
                let bad: Vec<String> = flags
                    .iter()
                    .filter(|f| (word >> f.flag.bit() & 1 == 1) != f.set)
                    .map(|f| format!("{}{}", if f.set { "" } else { "!" }, f.flag.as_str()))
                    .collect();
                Ok((!bad.is_empty()).then(|| {
                    format!(
                        "kpageflags: expected {}, flags are {word:#x}",
                        bad.join(" ")
                    )
                }))
            }
            Expect::Pread {
                file,
                offset,
                len,
                pattern,
                ..
            } => {
                let f = self.file(file)?;
                let len = Self::pread_len(*len)?;
                Ok(match self.backend.pread(p, f, *offset, len) {
                    Err(Fail::Unsupported(m)) => return Err(Abort::CannotRun(m)),
                    Err(e) => Some(format!(
                        "pread: expected pattern={pattern:#04x}, found {}",
                        fail_name(&e)
                    )),
                    Ok(data) => match data.iter().position(|b| b != pattern) {
                        Some(off) => Some(format!(
                            "pread: expected pattern={pattern:#04x}, found {:#04x} at offset {off:#x}",
                            data[off]
                        )),
                        None if (data.len() as u64) < len => Some(format!(
                            "pread: expected {len:#x} bytes, read {:#x} (end of file)",
                            data.len()
                        )),
                        None => None,
                    },
                })
            }
            Expect::Fincore {
                file,
                offset,
                len,
                bytes,
                ..
            } => {
                let f = self.file(file)?;
                let got = self.backend.fincore(p, f, *offset, *len).map_err(cannot)?;
                Ok((got != *bytes)
                    .then(|| format!("fincore: expected {}, found {}", kb(*bytes), kb(got))))
            }
            Expect::Folio { addr, order, .. } => {
                let a = self.addr(addr)?;
                let pv = self.backend.page(p, a).map_err(cannot)?;
                Ok(match pv.folio_order {
                    Some(o) if o == *order => None,
                    Some(o) => Some(format!("folio: expected order={order}, found order={o}")),
                    None => Some(format!(
                        "folio: expected order={order}, found no page mapped"
                    )),
                })
            }
        }
    }
}

/// One smaps field of a sum (`None`: this side cannot tell it): the line of that name
/// (`usermm::views::Smaps::line`, the one table of smaps names), or the Pss split.
pub fn smaps_field(t: &SmapsView, f: SmapsField) -> Option<u64> {
    let kind = |i: usize| t.pss_by_kind.map(|k| k[i]);
    match f {
        SmapsField::PssAnon => kind(0),
        SmapsField::PssFile => kind(1),
        SmapsField::PssShmem => kind(2),
        _ => t.line(f.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::{smaps_field, SmapsField, SmapsView};
    use crate::ast::Keyword;

    #[test]
    fn every_smaps_field_reads_its_own_line() {
        // Each field but the Pss split names a line of the engine's table, none another's.
        let mut t = SmapsView::default();
        for (n, f) in (1u64..).zip(SmapsField::ALL) {
            if let Some(line) = t.line_mut(f.as_str()) {
                *line = n;
            }
        }
        for (n, f) in (1u64..).zip(SmapsField::ALL) {
            let want = match f {
                SmapsField::PssAnon | SmapsField::PssFile | SmapsField::PssShmem => 0,
                _ => n,
            };
            assert_eq!(smaps_field(&t, *f), Some(want), "{f}");
        }
    }
}
