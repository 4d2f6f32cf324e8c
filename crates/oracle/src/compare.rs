//! Runs one scenario on the engine and on the host in lockstep and compares what they report.
//!
//! Two [`Runner`]s execute each statement in turn. Compared per statement: the action's outcome
//! (success, errno or signal), every `expect` verdict, the addresses of results placed at a
//! given address (`fixed`, `noreplace`, `hint`, MREMAP_FIXED), and after each statement that
//! may change an address space, for every live process: its scenario VMAs (ranges relative to
//! the mapping names, permissions, VM_LOCKED and the smaps fields, Swap and SwapPss among
//! them), the scenario status (VmRSS, VmLck, RssFile, RssShmem, VmSwap), pagemap
//! present/exclusive/swapped of every page, and for a sample of pages the kpageflags bits of
//! [`COMPARED_FLAGS`] and the folio order. A VMA's key names what it maps when that is not
//! private anonymous memory (`shared-anon`, `tmpfs`, `disk`); the pages of a `disk` file are
//! compared without what readahead and the host's flusher threads decide (folio sizes, dirty,
//! writeback), and the LRU aging bits only on anonymous pages ([`AGING_FLAGS`]). [`observables`] lists all of it, with the reasons for what is left out.
//!
//! The lists of what is compared are in `observables.rs`; the page-by-page comparison, with
//! how each side lists its pages, in `pages.rs`.

mod observables;
mod pages;
mod pressure;

pub use observables::{observables, Observable, AGING_FLAGS, COMPARED_FLAGS, UNCOMPARED_FLAGS};
pub use pages::{sampled, ObservePages, PageObs, VmaPages};

use crate::host::HostBackend;
use crate::knobs::ThpKnobs;
use crate::report::{Difference, OracleReport};
use crate::{sys, HostError};
use pages::{compare_pages, disk_pages};
use pressure::{is_reclaim, Pressure, RESIDENCY_SMAPS, RESIDENCY_STATUS};
use scenario::backend::{Backend, SmapsView, VmaKind};
use scenario::engine::EngineBackend;
use scenario::run::{fail_name, Abort, Runner, Step};
use scenario::{Expect, Name, Script, StmtKind};
use std::collections::HashSet;

/// How to compare.
#[derive(Clone, Debug, Default)]
pub struct CompareOptions {
    /// Engine tunables applied before the file's own settings.
    pub tunables: Vec<(String, String)>,
    /// Print each statement and both outcomes.
    pub verbose: bool,
    /// Compare the processes' state (VMAs, smaps, status, pages) after every this-many
    /// statements that may change an address space, and always before a process exits and
    /// after the last statement; 0 or 1: after each one. Outcomes, expectations and placed
    /// addresses are compared at every statement whatever it is. For long trace exports:
    /// observing every page of a 600 MB heap after each of 100 000 touches takes hours,
    /// and a divergence that lasts shows at the next observation (one that heals before it
    /// is not seen).
    pub observe_every: usize,
}

/// Whether statement `i` of `script` is followed by a process's exit (its state must be
/// observed before it goes).
fn exit_follows(script: &Script, i: usize) -> bool {
    matches!(
        script.stmts.get(i + 1).map(|s| &s.kind),
        Some(StmtKind::Action {
            action: scenario::Action::Exit { .. },
            ..
        })
    )
}

/// A live oracle: root checked, stop signals caught, the THP knobs saved (and restored when
/// this is dropped).
#[derive(Debug)]
pub struct Session {
    knobs: ThpKnobs,
}

/// One scenario VMA, as compared.
#[derive(Clone, Debug, PartialEq, Eq)]
struct VmaObs {
    /// `a-a+0x4000 rw-p` (with ` locked` for VM_LOCKED, and what it maps unless it is
    /// private anonymous memory: ` shared-anon`, ` tmpfs`, ` disk`).
    key: String,
    start: u64,
    end: u64,
    kind: VmaKind,
    smaps: SmapsView,
}

/// The word a VMA key gives its kind (empty for private anonymous memory).
fn kind_word(k: VmaKind) -> &'static str {
    match k {
        VmaKind::Anon => "",
        VmaKind::SharedAnon => " shared-anon",
        VmaKind::TmpfsFile => " tmpfs",
        VmaKind::DiskFile => " disk",
    }
}

/// The scenario status lines compared.
const STATUS_FIELDS: [&str; 5] = ["VmRSS", "VmLck", "RssFile", "RssShmem", "VmSwap"];

/// The smaps fields compared: [`SmapsView::fields`] (the list `expect smaps` and `dump`
/// share, which the oracle may not change) and the swap pair, `Swap` (the swap entries of
/// the VMA, `smaps_pte_entry`'s `mss->swap`) and `SwapPss` (each entry's share of its slot,
/// by the slot's swap count).
fn smaps_fields(s: &SmapsView) -> impl Iterator<Item = (&'static str, u64)> {
    s.fields()
        .into_iter()
        .chain([("Swap", s.swap), ("SwapPss", s.swap_pss)])
}

/// What one process looks like after a statement.
#[derive(Debug, Default)]
struct ProcObs {
    vmas: Vec<VmaObs>,
    /// [`STATUS_FIELDS`].
    status: Option<[u64; 5]>,
    /// Per VMA; `None` where pagemap could not be read.
    pages: Vec<Option<VmaPages>>,
    skipped: Vec<String>,
}

fn observe<B: Backend + ObservePages>(r: &mut Runner<B>, pid: u32) -> ProcObs {
    let mut o = ProcObs::default();
    let vmas = match r.scenario_vmas(pid) {
        Ok(v) => v,
        Err(f) => {
            o.skipped.push(format!("maps and smaps: {}", fail_name(&f)));
            return o;
        }
    };
    for v in &vmas {
        if let Some(m) = r.backend.vma_problem(pid, v.start, v.end) {
            o.skipped.push(m);
        }
        let lock = if v.locked { " locked" } else { "" };
        o.vmas.push(VmaObs {
            key: format!(
                "{}-{} {}{lock}{}",
                r.relative(v.start),
                r.relative(v.end),
                v.perms,
                kind_word(v.kind)
            ),
            start: v.start,
            end: v.end,
            kind: v.kind,
            smaps: v.smaps,
        });
    }
    match r.scenario_status(pid) {
        Ok(s) => o.status = Some([s.vm_rss, s.vm_lck, s.rss_file, s.rss_shmem, s.vm_swap]),
        Err(f) => o.skipped.push(format!("status: {}", fail_name(&f))),
    }
    for v in &vmas {
        match r.backend.observe_pages(pid, v.start, v.end) {
            Ok((pages, skipped)) => {
                o.pages.push(Some(pages));
                o.skipped.extend(skipped);
            }
            Err(f) => {
                o.skipped.push(format!("pagemap: {}", fail_name(&f)));
                o.pages.push(None);
            }
        }
    }
    o
}

fn kb(v: u64) -> String {
    if v.is_multiple_of(1024) {
        format!("{}K", v / 1024)
    } else {
        v.to_string()
    }
}

/// Collects the differences of one statement.
struct Diff<'r> {
    line: u32,
    out: &'r mut OracleReport,
}

impl Diff<'_> {
    fn add(&mut self, process: Option<&str>, field: String, engine: String, host: String) {
        self.out.differences.push(Difference {
            line: self.line,
            process: process.map(str::to_string),
            field,
            engine,
            host,
        });
    }
}

/// Runs one statement on the engine, then on the host; `None` if a stop signal came.
fn step_both(
    eng: &mut Runner<EngineBackend>,
    host: &mut Runner<HostBackend<'_>>,
    stmt: &scenario::Stmt,
) -> Option<(Step, Step)> {
    if sys::stop_requested() {
        return None;
    }
    // `run_stmt`, not `step`: each side runs the statement on its CPU (`on cpuN`; cpu0 by
    // default), the engine in that CPU slot, the host with the server pinned there (a CPU
    // the host lacks cannot run).
    let e = eng.run_stmt(stmt);
    if sys::stop_requested() {
        return None;
    }
    let pagemap_only = matches!(stmt.kind, StmtKind::Expect(Expect::Pagemap { .. }));
    host.backend.set_page_frames(!pagemap_only);
    let h = host.run_stmt(stmt);
    host.backend.set_page_frames(true);
    Some((e, h))
}

/// A result whose address is compared as it is, not relative to its name: a mapping
/// placed with `fixed` or `noreplace` and an `mremap` with MREMAP_FIXED land at the same
/// absolute address on both sides; a `hint` must be taken on both sides or on neither, and
/// any other `mremap` must stay in place on both sides or move on both (where else is the
/// kernel's choice among free ranges, which differ: the host process has mappings of its
/// own).
struct Placed {
    /// The name the statement binds.
    name: Name,
    /// The address the result is judged against, on the engine and on the host: the address
    /// asked for (`fixed`, `noreplace`, MREMAP_FIXED, `hint`) or the old one (`mremap`).
    reference: (Option<u64>, Option<u64>),
    how: PlacedBy,
}

/// How a [`Placed`] result is compared with its reference address.
#[derive(Clone, Copy, Debug)]
enum PlacedBy {
    /// At the same offset from it on both sides (the same absolute address when the request
    /// is absolute; a request relative to a name such as the break differs by as much as the
    /// name does).
    Fixed,
    /// At it on both sides or on neither; the words say which (at, elsewhere).
    AtOrNot(&'static str, &'static str),
}

impl Placed {
    fn of(
        kind: &StmtKind,
        eng: &Runner<EngineBackend>,
        host: &Runner<HostBackend<'_>>,
    ) -> Option<Placed> {
        let StmtKind::Action {
            bind: Some(name),
            action,
        } = kind
        else {
            return None;
        };
        // A hint is taken page-rounded down (`round_hint_to_min`): the mask for each case.
        let (at, how, mask) = match action {
            scenario::Action::Mmap { mmap, .. } => match &mmap.placement {
                scenario::Placement::Anywhere => return None,
                scenario::Placement::Hint(a) => {
                    (a, PlacedBy::AtOrNot("at the hint", "elsewhere"), !4095)
                }
                scenario::Placement::Fixed(a) | scenario::Placement::FixedNoreplace(a) => {
                    (a, PlacedBy::Fixed, u64::MAX)
                }
            },
            scenario::Action::Mremap { fixed: Some(a), .. } => (a, PlacedBy::Fixed, u64::MAX),
            scenario::Action::Mremap { addr, .. } => {
                (addr, PlacedBy::AtOrNot("in place", "moved"), u64::MAX)
            }
            _ => return None,
        };
        let round = |x: u64| x & mask;
        Some(Placed {
            name: name.clone(),
            reference: (eng.resolve(at).map(round), host.resolve(at).map(round)),
            how,
        })
    }

    fn compare(
        self,
        eng: &Runner<EngineBackend>,
        host: &Runner<HostBackend<'_>>,
        d: &mut Diff<'_>,
    ) {
        let (Some(ea), Some(ha), (Some(er), Some(hr))) = (
            eng.bindings().get(&self.name).map(|b| b.addr),
            host.bindings().get(&self.name).map(|b| b.addr),
            self.reference,
        ) else {
            return;
        };
        let (engine, host) = match self.how {
            PlacedBy::Fixed if ea.wrapping_sub(er) != ha.wrapping_sub(hr) => {
                (format!("{ea:#x}"), format!("{ha:#x}"))
            }
            PlacedBy::AtOrNot(at, not) if (ea == er) != (ha == hr) => {
                let word = |yes: bool| if yes { at } else { not }.to_string();
                (word(ea == er), word(ha == hr))
            }
            _ => return,
        };
        d.add(
            None,
            format!("address {}", self.name.as_str()),
            engine,
            host,
        );
    }
}

fn outcome_class(s: &Step) -> Option<String> {
    s.outcome.as_ref().map(|o| match o {
        Ok(_) => "success".to_string(),
        Err(f) => fail_name(f),
    })
}

impl Session {
    /// Checks for root, catches SIGINT/SIGTERM/SIGHUP, saves the THP knobs.
    pub fn new() -> Result<Session, HostError> {
        if sys::geteuid() != 0 {
            return Err(HostError::NotRoot);
        }
        sys::install_stop_handler().map_err(HostError::Signals)?;
        Ok(Session {
            knobs: ThpKnobs::acquire()?,
        })
    }

    /// The saved knobs.
    pub fn knobs(&self) -> &ThpKnobs {
        &self.knobs
    }

    /// Runs `script` on both sides and compares.
    pub fn compare(&mut self, script: &Script, opts: &CompareOptions) -> OracleReport {
        let mut rep = OracleReport::new(&script.file);
        if let Err(e) = self.knobs.set_defaults() {
            rep.cannot_run = Some((0, format!("host: {e}")));
            return rep;
        }
        let host = match HostBackend::new(&self.knobs) {
            Ok(mut h) => {
                h.set_confine(has_reclaim(script));
                h
            }
            Err(e) => {
                rep.cannot_run = Some((0, format!("host: cannot start: {e}")));
                return rep;
            }
        };
        let mut eng = Runner::new(EngineBackend::new(opts.tunables.clone()));
        let mut host = Runner::new(host);
        let mut dead: HashSet<Name> = HashSet::new();
        let mut pressure = Pressure::new(script);
        // Space-changing statements not yet followed by an observation.
        let mut unobserved = 0usize;
        for (i, stmt) in script.stmts.iter().enumerate() {
            let line = stmt.pos.line;
            rep.statements += 1;
            let placed = Placed::of(&stmt.kind, &eng, &host);
            let Some((e, h)) = step_both(&mut eng, &mut host, stmt) else {
                rep.cannot_run = Some((line, "interrupted".into()));
                break;
            };
            if opts.verbose {
                eprintln!(
                    "{}:{line}: {stmt}  [engine {} | host {}]",
                    script.file,
                    outcome_class(&e).unwrap_or_default(),
                    outcome_class(&h).unwrap_or_default()
                );
            }
            track_exits(&stmt.kind, &e, &h, &mut dead);
            // Only a process's statement can reclaim (and asking a machine that does not
            // exist yet for its counters would build it before the machine settings).
            if stmt.kind.task().is_some() {
                if let Ok(c) = eng.backend.counters() {
                    pressure.note(line, &c, is_reclaim(&stmt.kind));
                }
            }
            let h = unobservable_expect(&stmt.kind, h, line, &mut rep);
            if self.statement(&mut rep, line, &e, &h) {
                break;
            }
            if let (Some(p), Some(Ok(_)), Some(Ok(_))) = (placed, &e.outcome, &h.outcome) {
                p.compare(
                    &eng,
                    &host,
                    &mut Diff {
                        line,
                        out: &mut rep,
                    },
                );
            }
            if e.changes_space || h.changes_space {
                unobserved += 1;
            }
            if unobserved > 0
                && (unobserved >= opts.observe_every
                    || exit_follows(script, i)
                    || i + 1 == script.stmts.len())
            {
                unobserved = 0;
                let mut d = Diff {
                    line,
                    out: &mut rep,
                };
                compare_processes(&mut eng, &mut host, &dead, &pressure, &mut d);
            }
        }
        drop(host);
        rep.dedup_skipped();
        rep
    }

    /// Runs `script` on the host alone, printing each failed expectation and where the run
    /// stopped (statements with their outcomes too when `verbose`); the exit code: 0 all
    /// held, 1 an expectation failed or a statement failed, 2 the file cannot run here.
    pub fn run_host(&mut self, script: &Script, verbose: bool) -> u8 {
        let file = &script.file;
        if let Err(e) = self.knobs.set_defaults() {
            eprintln!("{file}: host: {e}");
            return 2;
        }
        let host = match HostBackend::new(&self.knobs) {
            Ok(mut h) => {
                h.set_confine(has_reclaim(script));
                h
            }
            Err(e) => {
                eprintln!("{file}: host: cannot start: {e}");
                return 2;
            }
        };
        let mut host = Runner::new(host);
        let mut code = 0u8;
        for stmt in &script.stmts {
            let line = stmt.pos.line;
            if sys::stop_requested() {
                println!("{file}:{line}: interrupted");
                return 2;
            }
            let h = host.run_stmt(stmt);
            if verbose {
                eprintln!(
                    "{file}:{line}: {stmt}  [host {}]",
                    match &h.outcome {
                        Some(Ok(d)) if d.is_empty() => "success".to_string(),
                        Some(Ok(d)) => format!("success: {d}"),
                        Some(Err(f)) => fail_name(f),
                        None => String::new(),
                    }
                );
            }
            if let Some(m) = &h.expect_failure {
                println!("{file}:{line}: host: {m}");
                code = code.max(1);
            }
            match &h.abort {
                Some(Abort::Failed(m)) => {
                    println!("{file}:{line}: host: {m}; stopped");
                    return code.max(1);
                }
                Some(Abort::CannotRun(m)) => {
                    println!("{file}:{line}: host cannot run this: {m}");
                    return 2;
                }
                None => {}
            }
        }
        if code == 0 {
            println!("{file}: host: all {} statements held", script.stmts.len());
        }
        code
    }

    /// Compares outcomes and verdicts of one statement; true when the run must stop.
    fn statement(&self, rep: &mut OracleReport, line: u32, e: &Step, h: &Step) -> bool {
        for (side, s) in [("engine", e), ("host", h)] {
            if let Some(Abort::CannotRun(m)) = &s.abort {
                rep.cannot_run = Some((line, format!("{side}: {m}")));
                return true;
            }
        }
        let (eo, ho) = (outcome_class(e), outcome_class(h));
        if eo != ho {
            let mut d = Diff { line, out: rep };
            d.add(
                None,
                "outcome".into(),
                eo.clone().unwrap_or_else(|| "-".into()),
                ho.clone().unwrap_or_else(|| "-".into()),
            );
        }
        match (&e.expect_failure, &h.expect_failure) {
            (Some(a), Some(b)) if a == b => rep.expect_failures.push((line, "both", a.clone())),
            (a, b) => {
                if let Some(m) = a {
                    rep.expect_failures.push((line, "engine", m.clone()));
                }
                if let Some(m) = b {
                    rep.expect_failures.push((line, "host", m.clone()));
                }
            }
        }
        match (&e.abort, &h.abort) {
            (Some(Abort::Failed(m)), Some(Abort::Failed(_))) if eo == ho => {
                rep.failed = Some((line, m.clone()));
                true
            }
            (None, None) => false,
            _ => {
                rep.failed = Some((line, "the two sides diverged; stopped".into()));
                true
            }
        }
    }
}

/// Whether `script` has a `reclaim` statement (the host then runs it in a memory cgroup,
/// which `reclaim` reclaims from, even without `set memory`).
pub(crate) fn has_reclaim(script: &Script) -> bool {
    script.stmts.iter().any(|s| {
        matches!(
            &s.kind,
            StmtKind::Action {
                action: scenario::Action::Reclaim { .. },
                ..
            }
        )
    })
}

/// An observation `expect` the host cannot evaluate (a `/proc` file unreadable) skips that
/// check, reported as skipped, instead of stopping the file.
fn unobservable_expect(kind: &StmtKind, mut h: Step, line: u32, rep: &mut OracleReport) -> Step {
    // `dump` is an observation too: of the engine's structures, which the host does not have.
    let observation = matches!(kind, StmtKind::Dump { .. })
        || matches!(kind, StmtKind::Expect(x) if !matches!(x, Expect::Outcome { .. } | Expect::Read { .. }));
    if let (true, Some(Abort::CannotRun(m))) = (observation, &h.abort) {
        rep.skip(line, format!("host cannot evaluate this expect: {m}"));
        h.abort = None;
    }
    h
}

fn track_exits(kind: &StmtKind, e: &Step, h: &Step, dead: &mut HashSet<Name>) {
    if let StmtKind::Action {
        action: scenario::Action::Exit { task },
        ..
    } = kind
    {
        if matches!(e.outcome, Some(Ok(_))) || matches!(h.outcome, Some(Ok(_))) {
            dead.insert(task.clone());
        }
    }
}

fn compare_processes(
    eng: &mut Runner<EngineBackend>,
    host: &mut Runner<HostBackend<'_>>,
    dead: &HashSet<Name>,
    pressure: &Pressure,
    d: &mut Diff<'_>,
) {
    let hp: std::collections::HashMap<Name, u32> = host.processes().into_iter().collect();
    for (name, ep) in eng.processes() {
        let Some(&hpid) = hp.get(&name) else {
            continue;
        };
        if dead.contains(&name) {
            continue;
        }
        let eo = observe(eng, ep);
        let ho = observe(host, hpid);
        compare_obs(name.as_str(), &eo, &ho, pressure, d, host);
    }
}

fn compare_obs(
    proc_name: &str,
    e: &ProcObs,
    h: &ProcObs,
    pressure: &Pressure,
    d: &mut Diff<'_>,
    host: &Runner<HostBackend<'_>>,
) {
    for s in &e.skipped {
        d.out.skip(d.line, format!("{proc_name} engine {s}"));
    }
    for s in &h.skipped {
        d.out.skip(d.line, format!("{proc_name} host {s}"));
    }
    if let (Some(es), Some(hs)) = (e.status, h.status) {
        for ((f, a), b) in STATUS_FIELDS.iter().zip(es).zip(hs) {
            if !pressure.agree(f, a, b, RESIDENCY_STATUS) {
                d.add(Some(proc_name), format!("status {f}"), kb(a), kb(b));
            }
        }
    }
    let ek: Vec<&str> = e.vmas.iter().map(|v| v.key.as_str()).collect();
    let hk: Vec<&str> = h.vmas.iter().map(|v| v.key.as_str()).collect();
    if ek != hk {
        if !e.skipped.is_empty() || !h.skipped.is_empty() {
            return;
        }
        d.add(
            Some(proc_name),
            "maps".into(),
            format!("[{}]", ek.join(", ")),
            format!("[{}]", hk.join(", ")),
        );
        return;
    }
    for (i, (ev, hv)) in e.vmas.iter().zip(&h.vmas).enumerate() {
        for ((f, a), (_, b)) in smaps_fields(&ev.smaps).zip(smaps_fields(&hv.smaps)) {
            if !pressure.agree(f, a, b, RESIDENCY_SMAPS) {
                d.add(
                    Some(proc_name),
                    format!("smaps {} {f}", ev.key),
                    kb(a),
                    kb(b),
                );
            }
        }
        if let Some(line) = pressure.since {
            // Which pages stayed is each side's reclaim's choice: see `pressure.rs`.
            let (a, b) = (ev.smaps.rss + ev.smaps.swap, hv.smaps.rss + hv.smaps.swap);
            if hv.kind == VmaKind::Anon && pressure.anon_total_exact && a != b {
                d.add(
                    Some(proc_name),
                    format!("smaps {} Rss+Swap", ev.key),
                    kb(a),
                    kb(b),
                );
            }
            d.out.skip(
                d.line,
                format!(
                    "{proc_name} pages: not compared one by one after memory pressure \
                     (line {line}); sizes within {}",
                    kb(pressure.tolerance)
                ),
            );
            continue;
        }
        if let (Some(Some(ep)), Some(Some(hp))) = (e.pages.get(i), h.pages.get(i)) {
            if ep.count == hp.count && ep.count > 0 {
                let at = |a: u64| host.relative(a);
                if hv.kind == VmaKind::DiskFile {
                    let (ep, hp) = (disk_pages(ep), disk_pages(hp));
                    compare_pages(proc_name, hv.start, &ep, &hp, d, &at);
                } else {
                    compare_pages(proc_name, hv.start, ep, hp, d, &at);
                }
            }
        }
    }
}

/// Runs `script` on the engine (with `engine_tunables`) and on the host, and compares.
/// The THP knobs are saved and restored around the run.
pub fn compare(script: &Script, engine_tunables: &[(String, String)]) -> OracleReport {
    match Session::new() {
        Ok(mut s) => s.compare(
            script,
            &CompareOptions {
                tunables: engine_tunables.to_vec(),
                verbose: false,
                observe_every: 1,
            },
        ),
        Err(e) => {
            let mut rep = OracleReport::new(&script.file);
            rep.cannot_run = Some((0, format!("host: {e}")));
            rep
        }
    }
}
