//! Runs a parsed scenario on the engine.
//!
//! Statements execute in order on one [`usermm::Machine`], built at the first statement that
//! is not a machine setting. An action that fails without an `expect` aborts the run; a failed
//! `expect` is recorded and the run goes on. With [`RunOptions::validate`] the whole-state
//! checker runs after every statement and any violation is a failure.

use crate::ast::{
    Access, Action, AddrExpr, Advice, Arch, BrkDelta, Expect, Keyword, Limit, Name, Outcome,
    PagemapState, Placement, Prot, Script, Setting, Sharing, Signal, SmapsField, StatusField,
    StmtKind, ThpPolicy, ThpSetting, ThpTop,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use usermm::{Machine, MachineConfig, MmapArgs, Pid, Privilege, Snapshot};

/// How to run.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Print each statement as it runs.
    pub verbose: bool,
    /// Run `validate()` after every statement.
    pub validate: bool,
    /// Tunables applied when the machine is built (before the file's own `set tunable`).
    pub tunables: Vec<(String, String)>,
}

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
    Failed(Failure),
    /// The statement cannot be run by this engine yet, or a setting is invalid (exit 2).
    CannotRun(Failure),
}

/// Result of a run.
#[derive(Debug)]
pub struct RunReport {
    /// Failed expectations.
    pub failures: Vec<Failure>,
    /// Set if the run stopped early.
    pub abort: Option<Abort>,
    /// Counters of the whole run.
    pub counters: Snapshot,
    /// Wall time of the run.
    pub wall: Duration,
    /// Statements executed.
    pub statements: usize,
}

impl RunReport {
    /// Exit code: 0 all held, 1 an expectation failed, 2 the file could not be run.
    pub fn exit_code(&self) -> i32 {
        match (&self.abort, self.failures.is_empty()) {
            (Some(Abort::CannotRun(_)), _) => 2,
            (Some(Abort::Failed(_)), _) | (None, false) => 1,
            (None, true) => 0,
        }
    }
}

struct Mapping {
    addr: u64,
    len: u64,
}

struct Runner {
    cfg: MachineConfig,
    machine: Option<Machine>,
    thp: Vec<ThpSetting>,
    tunables: Vec<(String, String)>,
    rlimit: u64,
    procs: HashMap<Name, Pid>,
    maps: HashMap<Name, Mapping>,
}

/// The result of executing one action.
enum Done {
    Pid(Pid),
    Map(u64, u64),
    Nothing,
}

type Step = Result<Done, Outcome>;

fn err_msg(line: u32, col: u32, message: String) -> Failure {
    Failure { line, col, message }
}

/// Runs `script` on a fresh engine.
pub fn run(script: &Script, opts: &RunOptions) -> RunReport {
    let start = Instant::now();
    let mut r = Runner {
        cfg: MachineConfig::default(),
        machine: None,
        thp: Vec::new(),
        tunables: opts.tunables.clone(),
        rlimit: usermm::machine::DEFAULT_RLIMIT_MEMLOCK,
        procs: HashMap::new(),
        maps: HashMap::new(),
    };
    let mut failures = Vec::new();
    let mut abort = None;
    let mut statements = 0;
    for stmt in &script.stmts {
        let (line, col) = (stmt.pos.line, stmt.pos.col);
        if opts.verbose {
            eprintln!("{}:{line}: {stmt}", script.file);
        }
        statements += 1;
        match r.stmt(&stmt.kind) {
            Ok(None) => {}
            Ok(Some(msg)) => failures.push(err_msg(line, col, msg)),
            Err(a) => {
                abort = Some(match a {
                    StepAbort::Failed(m) => Abort::Failed(err_msg(line, col, m)),
                    StepAbort::CannotRun(m) => Abort::CannotRun(err_msg(line, col, m)),
                });
                break;
            }
        }
        if opts.validate {
            if let Some(m) = &r.machine {
                if let Err(errs) = m.validate() {
                    failures.push(err_msg(line, col, format!("validate: {}", errs.join("; "))));
                }
            }
        }
    }
    let counters = r.machine.as_ref().map(|m| m.counters()).unwrap_or_default();
    RunReport {
        failures,
        abort,
        counters,
        wall: start.elapsed(),
        statements,
    }
}

enum StepAbort {
    Failed(String),
    CannotRun(String),
}

fn outcome_name(o: &Outcome) -> String {
    match o {
        Outcome::Errno(e) => e.as_str().to_string(),
        Outcome::Signal(s) => s.as_str().to_string(),
    }
}

fn errno_outcome(e: usermm::Errno) -> Outcome {
    match crate::ast::Errno::from_keyword(e.name()) {
        Some(x) => Outcome::Errno(x),
        None => Outcome::Errno(crate::ast::Errno::EINVAL),
    }
}

fn signal_outcome(s: usermm::Signal) -> Outcome {
    match s {
        usermm::Signal::Bus(_) => Outcome::Signal(Signal::Sigbus),
        usermm::Signal::Segv(_) | usermm::Signal::NoProcess => Outcome::Signal(Signal::Sigsegv),
    }
}

fn prot(p: Prot) -> usermm::Prot {
    let bits = p.bits();
    usermm::Prot {
        read: bits & 1 != 0,
        write: bits & 2 != 0,
        exec: bits & 4 != 0,
    }
}

fn thp_policy(p: ThpPolicy) -> usermm::ThpPolicy {
    match p {
        ThpPolicy::Always => usermm::ThpPolicy::Always,
        ThpPolicy::Madvise => usermm::ThpPolicy::Madvise,
        ThpPolicy::Never => usermm::ThpPolicy::Never,
        ThpPolicy::Inherit => usermm::ThpPolicy::Inherit,
    }
}

fn thp_top(p: ThpTop) -> usermm::ThpPolicy {
    match p {
        ThpTop::Always => usermm::ThpPolicy::Always,
        ThpTop::Madvise => usermm::ThpPolicy::Madvise,
        ThpTop::Never => usermm::ThpPolicy::Never,
    }
}

fn kb(v: u64) -> String {
    if v % 1024 == 0 {
        format!("{}K", v / 1024)
    } else {
        format!("{v}")
    }
}

impl Runner {
    fn machine(&mut self) -> Result<&Machine, StepAbort> {
        if self.machine.is_none() {
            let m = Machine::new(self.cfg.clone());
            let mut err = None;
            m.update_tunables(|t| {
                for (k, v) in &self.tunables {
                    if let Err(e) = t.set(k, v) {
                        err = Some(e.to_string());
                    }
                }
                for s in &self.thp {
                    apply_thp(t, s);
                }
            });
            if let Some(e) = err {
                return Err(StepAbort::CannotRun(e));
            }
            self.machine = Some(m);
        }
        self.machine
            .as_ref()
            .ok_or(StepAbort::CannotRun("no machine".into()))
    }

    fn stmt(&mut self, kind: &StmtKind) -> Result<Option<String>, StepAbort> {
        match kind {
            StmtKind::Set(s) => self.set(s).map(|_| None),
            StmtKind::Action { bind, action } => {
                match self.action(action)? {
                    Ok(done) => self.bind(bind.as_ref(), done),
                    Err(o) => {
                        return Err(StepAbort::Failed(format!(
                            "{} failed: {}",
                            action.verb(),
                            outcome_name(&o)
                        )))
                    }
                }
                Ok(None)
            }
            StmtKind::Expect(e) => self.expect(e),
        }
    }

    fn bind(&mut self, bind: Option<&Name>, done: Done) {
        let Some(name) = bind else { return };
        match done {
            Done::Pid(p) => {
                self.procs.insert(name.clone(), p);
            }
            Done::Map(addr, len) => {
                self.maps.insert(name.clone(), Mapping { addr, len });
            }
            Done::Nothing => {}
        }
    }

    fn set(&mut self, s: &Setting) -> Result<(), StepAbort> {
        match s {
            Setting::Memory(b) => self.cfg.memory = *b,
            Setting::Nodes(n) => self.cfg.nodes = *n,
            Setting::Cpus(n) => self.cfg.cpus = *n as usize,
            Setting::Arch(a) => {
                self.cfg.arch = match a {
                    Arch::X86_64 => usermm::Arch::X86_64,
                    Arch::Arm64 => usermm::Arch::Arm64,
                }
            }
            Setting::Tunable { name, value } => {
                if let Some(m) = &self.machine {
                    let mut res = Ok(());
                    m.update_tunables(|t| res = t.set(name, value));
                    res.map_err(|e| StepAbort::CannotRun(e.to_string()))?;
                } else {
                    let mut probe = usermm::Tunables::default();
                    probe
                        .set(name, value)
                        .map_err(|e| StepAbort::CannotRun(e.to_string()))?;
                    self.tunables.push((name.clone(), value.clone()));
                }
            }
            Setting::Thp(list) => {
                if let Some(m) = &self.machine {
                    m.update_tunables(|t| list.iter().for_each(|s| apply_thp(t, s)));
                } else {
                    self.thp.extend(list.iter().cloned());
                }
            }
            Setting::Rlimit { limit, .. } => {
                self.rlimit = match limit {
                    Limit::Bytes(b) => *b,
                    Limit::Unlimited => u64::MAX,
                }
            }
            Setting::Mempolicy(_) => {
                return Err(StepAbort::CannotRun(
                    "set mempolicy: not implemented yet (NUMA placement)".into(),
                ))
            }
        }
        Ok(())
    }

    fn pid(&self, n: &Name) -> Result<Pid, StepAbort> {
        self.procs
            .get(n)
            .copied()
            .ok_or_else(|| StepAbort::CannotRun(format!("unknown process `{}`", n.as_str())))
    }

    fn addr(&self, a: &AddrExpr) -> Result<u64, StepAbort> {
        a.resolve(|n| self.maps.get(n).map(|m| m.addr))
            .ok_or_else(|| StepAbort::CannotRun("address expression cannot be resolved".into()))
    }

    /// Runs an action; `Ok(Err(outcome))` is an errno or signal result.
    fn action(&mut self, a: &Action) -> Result<Step, StepAbort> {
        let rlimit = self.rlimit;
        let task = a.task().map(|t| self.pid(t)).transpose()?;
        let p = task.unwrap_or(0);
        let resolved = match a {
            Action::Munmap { addr, .. }
            | Action::Mprotect { addr, .. }
            | Action::Mremap { addr, .. }
            | Action::Madvise { addr, .. }
            | Action::Mlock { addr, .. }
            | Action::Mlock2 { addr, .. }
            | Action::Munlock { addr, .. }
            | Action::Pin { addr, .. }
            | Action::Unpin { addr, .. }
            | Action::Write { addr, .. }
            | Action::Touch { addr, .. }
            | Action::Read { addr, .. } => self.addr(addr)?,
            _ => 0,
        };
        let placement = match a {
            Action::Mmap { mmap, .. } => match &mmap.placement {
                Placement::Anywhere => usermm::Placement::Any,
                Placement::Hint(x) => usermm::Placement::Hint(self.addr(x)?),
                Placement::Fixed(x) => usermm::Placement::Fixed(self.addr(x)?),
                Placement::FixedNoreplace(x) => usermm::Placement::FixedNoReplace(self.addr(x)?),
            },
            _ => usermm::Placement::Any,
        };
        let fixed = match a {
            Action::Mremap { fixed: Some(x), .. } => Some(self.addr(x)?),
            _ => None,
        };
        let m = self.machine()?;
        let cpu = m
            .enter_cpu(0)
            .map_err(|e| StepAbort::CannotRun(e.to_string()))?;
        let e = errno_outcome;
        Ok(match a {
            Action::Spawn { privileged } => {
                let pr = if *privileged {
                    Privilege::Privileged
                } else {
                    Privilege::Ordinary
                };
                cpu.spawn(pr, rlimit).map(Done::Pid).map_err(e)
            }
            Action::Fork { .. } => cpu.fork(p).map(Done::Pid).map_err(e),
            Action::Exit { .. } => cpu.exit(p).map(|_| Done::Nothing).map_err(e),
            Action::Mmap { mmap, .. } => {
                let args = MmapArgs {
                    len: mmap.len,
                    prot: prot(mmap.prot),
                    sharing: match mmap.sharing {
                        Sharing::Private => usermm::Sharing::Private,
                        Sharing::Shared => usermm::Sharing::Shared,
                    },
                    placement,
                    populate: mmap.populate,
                    locked: mmap.locked,
                    noreserve: mmap.noreserve,
                };
                cpu.mmap(p, args)
                    .map(|addr| Done::Map(addr, mmap.len))
                    .map_err(e)
            }
            Action::Munmap { len, .. } => cpu
                .munmap(p, resolved, *len)
                .map(|_| Done::Nothing)
                .map_err(e),
            Action::Mprotect { len, prot: pr, .. } => cpu
                .mprotect(p, resolved, *len, prot(*pr))
                .map(|_| Done::Nothing)
                .map_err(e),
            Action::Mremap {
                old_len,
                new_len,
                maymove,
                dontunmap,
                ..
            } => {
                if *dontunmap {
                    return Err(StepAbort::CannotRun(
                        "mremap dontunmap: not implemented yet".into(),
                    ));
                }
                let f = usermm::MremapFlags {
                    maymove: *maymove,
                    fixed,
                };
                cpu.mremap(p, resolved, *old_len, *new_len, f)
                    .map(|na| Done::Map(na, *new_len))
                    .map_err(e)
            }
            Action::Brk { delta, .. } => {
                let cur = cpu
                    .brk(p, 0)
                    .map_err(|x| StepAbort::Failed(x.to_string()))?;
                let (want, len) = match delta {
                    BrkDelta::Grow(d) => (cur.checked_add(*d), *d),
                    BrkDelta::Shrink(d) => (cur.checked_sub(*d), *d),
                };
                match want {
                    Some(w) => match cpu.brk(p, w) {
                        Ok(got) if got == w => Ok(Done::Map(cur, len)),
                        Ok(_) => Err(Outcome::Errno(crate::ast::Errno::ENOMEM)),
                        Err(x) => Err(e(x)),
                    },
                    None => Err(Outcome::Errno(crate::ast::Errno::ENOMEM)),
                }
            }
            Action::Madvise { len, advice, .. } => match advice_of(*advice) {
                Some(adv) => cpu
                    .madvise(p, resolved, *len, adv)
                    .map(|_| Done::Nothing)
                    .map_err(e),
                None => {
                    return Err(StepAbort::CannotRun(format!(
                        "madvise {advice}: not implemented yet"
                    )))
                }
            },
            Action::Mlock { .. }
            | Action::Mlock2 { .. }
            | Action::Munlock { .. }
            | Action::Mlockall { .. }
            | Action::Munlockall { .. } => {
                return Err(StepAbort::CannotRun(format!(
                    "{}: not implemented yet (mlock subsystem)",
                    a.verb()
                )))
            }
            Action::Pin { len, .. } => cpu.pin(p, resolved, *len).map(|_| Done::Nothing).map_err(e),
            Action::Unpin { len, .. } => cpu
                .unpin(p, resolved, *len)
                .map(|_| Done::Nothing)
                .map_err(e),
            Action::Write { len, pattern, .. } => cpu
                .write_fill(p, resolved, *len, *pattern)
                .map(|_| Done::Nothing)
                .map_err(signal_outcome),
            Action::Touch { len, access, .. } => {
                let acc = match access {
                    Access::Read => usermm::Access::Read,
                    Access::Write => usermm::Access::Write,
                };
                cpu.touch(p, resolved, *len, acc)
                    .map(|_| Done::Nothing)
                    .map_err(signal_outcome)
            }
            Action::Read { len, .. } => cpu
                .touch(p, resolved, *len, usermm::Access::Read)
                .map(|_| Done::Nothing)
                .map_err(signal_outcome),
        })
    }

    fn expect(&mut self, x: &Expect) -> Result<Option<String>, StepAbort> {
        if let Expect::Outcome { action, outcome } = x {
            return Ok(match self.action(action)? {
                Ok(_) => Some(format!(
                    "expected {} = {}, but it succeeded",
                    action.verb(),
                    outcome_name(outcome)
                )),
                Err(got) if got == *outcome => None,
                Err(got) => Some(format!(
                    "expected {} = {}, found {}",
                    action.verb(),
                    outcome_name(outcome),
                    outcome_name(&got)
                )),
            });
        }
        let p = match x.task() {
            Some(t) => self.pid(t)?,
            None => 0,
        };
        let addr = match x {
            Expect::Read { addr, .. }
            | Expect::MapsVma { addr, .. }
            | Expect::Pagemap { addr, .. }
            | Expect::Kpageflags { addr, .. }
            | Expect::Folio { addr, .. } => self.addr(addr)?,
            _ => 0,
        };
        let range = match x {
            Expect::Smaps { mapping, .. } => {
                let m = self.maps.get(mapping).ok_or_else(|| {
                    StepAbort::CannotRun(format!("unknown mapping `{}`", mapping.as_str()))
                })?;
                (m.addr, m.addr + m.len)
            }
            _ => (0, 0),
        };
        let m = self.machine()?;
        let cpu = m
            .enter_cpu(0)
            .map_err(|e| StepAbort::CannotRun(e.to_string()))?;
        let fail = |s: String| Ok(Some(s));
        let gone = |e: usermm::Errno| StepAbort::Failed(format!("process: {e}"));
        match x {
            Expect::Outcome { .. } => Ok(None),
            Expect::Read { len, pattern, .. } => match cpu.find_mismatch(p, addr, *len, *pattern) {
                Ok(None) => Ok(None),
                Ok(Some(at)) => {
                    let mut b = [0u8; 1];
                    let _ = cpu.read_bytes(p, at, &mut b);
                    fail(format!(
                        "read: expected pattern={pattern:#04x}, found {:#04x} at offset {:#x}",
                        b[0],
                        at - addr
                    ))
                }
                Err(s) => fail(format!(
                    "read: expected pattern={pattern:#04x}, found {}",
                    outcome_name(&signal_outcome(s))
                )),
            },
            Expect::Smaps { fields, .. } => {
                let mut total = usermm::views::Smaps::default();
                let mut size = 0;
                for (e, s) in cpu.smaps(p, range.0, range.1).map_err(gone)? {
                    total.add(&s);
                    size += e.end.min(range.1) - e.start.max(range.0);
                }
                let mut bad = Vec::new();
                for (f, want) in fields {
                    let got = match f {
                        SmapsField::Size => size,
                        SmapsField::Rss => total.rss,
                        SmapsField::Pss => total.pss(),
                        SmapsField::SharedClean => total.shared_clean,
                        SmapsField::SharedDirty => total.shared_dirty,
                        SmapsField::PrivateClean => total.private_clean,
                        SmapsField::PrivateDirty => total.private_dirty,
                        SmapsField::Anonymous => total.anonymous,
                        SmapsField::AnonHugePages => total.anon_huge_pages,
                        SmapsField::Locked => total.locked(),
                        SmapsField::Referenced => total.rss,
                        SmapsField::Swap => 0,
                    };
                    if got / 1024 != want / 1024 {
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
                let s = cpu.status(p).map_err(gone)?;
                let mut bad = Vec::new();
                for (f, want) in fields {
                    let got = match f {
                        StatusField::VmSize | StatusField::VmPeak => s.vm_size,
                        StatusField::VmLck => s.vm_lck,
                        StatusField::VmPin => s.vm_pin,
                        StatusField::VmRSS | StatusField::VmHWM => s.vm_rss,
                        StatusField::RssAnon => s.rss_anon,
                        StatusField::RssShmem => s.rss_shmem,
                        StatusField::RssFile | StatusField::VmSwap | StatusField::VmPTE => 0,
                        StatusField::VmData => s.vm_data,
                    };
                    if got / 1024 != want / 1024 {
                        bad.push(format!(
                            "{}: expected {}, found {}",
                            f.as_str(),
                            kb(*want),
                            kb(got)
                        ));
                    }
                }
                Ok((!bad.is_empty()).then(|| format!("status {}", bad.join(", "))))
            }
            Expect::MapsCount { count, .. } => {
                let n = cpu.maps(p).map_err(gone)?.len() as u64;
                Ok((n != *count).then(|| format!("maps count: expected {count}, found {n}")))
            }
            Expect::MapsVma {
                start, end, perms, ..
            } => {
                let maps = cpu.maps(p).map_err(gone)?;
                let want = format!("{:#x}-{:#x} {}", start, end, perms);
                match maps.iter().find(|e| e.start <= addr && addr < e.end) {
                    None => fail(format!(
                        "maps: expected {want}, found no mapping at {addr:#x}"
                    )),
                    Some(e) => {
                        let got = format!("{:#x}-{:#x} {}", e.start, e.end, e.perms);
                        Ok((got != want).then(|| format!("maps: expected {want}, found {got}")))
                    }
                }
            }
            Expect::Pagemap { states, .. } => {
                let pm = cpu.pagemap(p, addr).map_err(gone)?;
                let bad: Vec<String> = states
                    .iter()
                    .filter(|s| !match s {
                        PagemapState::Exclusive => pm.present && pm.exclusive,
                        PagemapState::Shared => pm.present && !pm.exclusive,
                        PagemapState::Present => pm.present,
                        PagemapState::Absent => !pm.present,
                    })
                    .map(|s| s.as_str().to_string())
                    .collect();
                Ok((!bad.is_empty()).then(|| {
                    format!(
                        "pagemap: expected {}, found present={} exclusive={}",
                        bad.join(" "),
                        pm.present,
                        pm.exclusive
                    )
                }))
            }
            Expect::Kpageflags { flags, .. } => {
                let Some(word) = cpu.kpageflags(p, addr).map_err(gone)? else {
                    return fail("kpageflags: no page mapped".into());
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
            Expect::Folio { order, .. } => match cpu.folio_order(p, addr).map_err(gone)? {
                Some(o) if o == *order => Ok(None),
                Some(o) => fail(format!("folio: expected order={order}, found order={o}")),
                None => fail(format!(
                    "folio: expected order={order}, found no page mapped"
                )),
            },
        }
    }
}

fn apply_thp(t: &mut usermm::Tunables, s: &ThpSetting) {
    match s {
        ThpSetting::Top(top) => t.thp.top = thp_top(*top),
        ThpSetting::Size { size, policy } => {
            let _ = t.thp.set_size(size.bytes(), thp_policy(*policy));
        }
    }
}

fn advice_of(a: Advice) -> Option<usermm::Advice> {
    Some(match a {
        Advice::Dontneed => usermm::Advice::DontNeed,
        Advice::Hugepage => usermm::Advice::HugePage,
        Advice::Nohugepage => usermm::Advice::NoHugePage,
        Advice::Dontfork => usermm::Advice::DontFork,
        Advice::Dofork => usermm::Advice::DoFork,
        Advice::Wipeonfork => usermm::Advice::WipeOnFork,
        Advice::Keeponfork => usermm::Advice::KeepOnFork,
        _ => return None,
    })
}
