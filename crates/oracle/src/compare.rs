//! Runs one scenario on the engine and on the host in lockstep and compares what they report.
//!
//! Two [`Runner`]s execute each statement in turn. Compared per statement: the action's outcome
//! (success, errno or signal), every `expect` verdict, the addresses of results placed at a
//! given address (`fixed`, `noreplace`, `hint`, MREMAP_FIXED), and after each statement that
//! may change an address space, for every live process: its scenario VMAs (ranges relative to
//! the mapping names, permissions, VM_LOCKED and the smaps fields), the scenario status (VmRSS,
//! VmLck, RssFile, RssShmem), pagemap present/exclusive of every page, and for a sample of
//! pages the kpageflags bits of [`COMPARED_FLAGS`] and the folio order. A VMA's key names what
//! it maps when that is not private anonymous memory (`shared-anon`, `tmpfs`, `disk`); the
//! pages of a `disk` file are compared without what readahead and the host's flusher threads
//! decide (folio sizes, dirty, writeback), and the LRU aging bits only on anonymous pages
//! ([`AGING_FLAGS`]). [`observables`] lists all of it, with the reasons for what is left out.
//!
//! Pages are observed sparsely: each side lists only the pages it shows (present or
//! exclusive), in address order — the host reads pagemap a bounded chunk at a time and
//! keeps those entries, the engine walks its page tables skipping empty upper levels — and
//! the two lists are merged, a page missing from one list being absent there. So the time
//! and memory of a comparison follow the pages mapped, not the size of the mappings (a
//! 64 GiB `norserve` reservation costs what its few written pages cost), and the
//! differences reported are the ones a page-by-page comparison would report.

use crate::host::HostBackend;
use crate::knobs::ThpKnobs;
use crate::report::{Difference, OracleReport};
use crate::{procfs, sys, HostError};
use scenario::backend::{Backend, Fail, Res, SmapsView, VmaKind};
use scenario::engine::EngineBackend;
use scenario::run::{fail_name, Abort, Runner, Step};
use scenario::{Expect, Keyword, KpageFlag, Name, Script, StmtKind};
use std::collections::HashSet;

/// The kpageflags bits compared for every sampled present page (with the exceptions of
/// [`AGING_FLAGS`]). Bits that are always clear for a user page (`slab`, `buddy`, `pgtable`,
/// …) are compared too: a stray one is a bug on either side.
pub const COMPARED_FLAGS: [KpageFlag; 28] = [
    KpageFlag::Locked,
    KpageFlag::Error,
    KpageFlag::Referenced,
    KpageFlag::Uptodate,
    KpageFlag::Dirty,
    KpageFlag::Lru,
    KpageFlag::Active,
    KpageFlag::Slab,
    KpageFlag::Writeback,
    KpageFlag::Reclaim,
    KpageFlag::Buddy,
    KpageFlag::Mmap,
    KpageFlag::Anon,
    KpageFlag::Swapcache,
    KpageFlag::Swapbacked,
    KpageFlag::CompoundHead,
    KpageFlag::CompoundTail,
    KpageFlag::Huge,
    KpageFlag::Unevictable,
    KpageFlag::Hwpoison,
    KpageFlag::Nopage,
    KpageFlag::Ksm,
    KpageFlag::Thp,
    KpageFlag::Offline,
    KpageFlag::ZeroPage,
    KpageFlag::Pgtable,
    KpageFlag::Reserved,
    KpageFlag::Mlocked,
];

/// The kpageflags bits never compared, and why (measured on 6.18; `usermm oracle
/// --observables` prints this list).
pub const UNCOMPARED_FLAGS: [(KpageFlag, &str); 9] = [
    (
        KpageFlag::Idle,
        "page-idle tracking state (PG_idle): set by whoever writes /sys/kernel/mm/page_idle; \
         the tail pages of a large folio read the tail's own flag word",
    ),
    (
        KpageFlag::Mappedtodisk,
        "on anonymous pages the bit is PG_anon_exclusive, kept per page only for PTE-mapped \
         folios (exclusivity is compared through pagemap's exclusive bit instead)",
    ),
    (
        KpageFlag::Private,
        "file-system private data (ext4 buffer heads): not modelled",
    ),
    (
        KpageFlag::Private2,
        "file-system private data: not modelled",
    ),
    (
        KpageFlag::OwnerPrivate,
        "owner-private flag of the page's owner: not modelled",
    ),
    (
        KpageFlag::Arch,
        "architecture flag (PG_arch_1: icache state): not modelled",
    ),
    (KpageFlag::Uncached, "architecture flag: not modelled"),
    (KpageFlag::Softdirty, "soft-dirty tracking: not modelled"),
    (KpageFlag::Arch2, "architecture flag: not modelled"),
];

/// Bits of the LRU's aging state, compared on anonymous pages only. On page-cache pages
/// (tmpfs, shared anonymous memory, disk files) and the shared zero pages they follow what
/// the engine does not model page-exactly: the order in which the per-CPU LRU and mlock
/// batches drain relative to each mark-accessed, the host's own reclaim and its workingset
/// refault activation, and every other process on the machine (the zero pages). A scenario
/// still checks them where it asks (`expect … kpageflags … referenced`).
pub const AGING_FLAGS: [KpageFlag; 2] = [KpageFlag::Referenced, KpageFlag::Active];

/// One observable of [`observables`]: what, when, and how it is compared (or why not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observable {
    /// The observable (`outcome`, `smaps Rss`, `kpageflags dirty`, …).
    pub name: String,
    /// Whether it is compared.
    pub compared: bool,
    /// When and how it is compared, or why it is not.
    pub how: String,
}

/// Everything the oracle compares after each statement, and what it leaves out and why
/// (`usermm oracle --observables`).
pub fn observables() -> Vec<Observable> {
    let yes = |name: &str, how: &str| Observable {
        name: name.to_string(),
        compared: true,
        how: how.to_string(),
    };
    let no = |name: &str, how: &str| Observable {
        name: name.to_string(),
        compared: false,
        how: how.to_string(),
    };
    let mut v = vec![
        yes("outcome", "every action: success, the errno, or the signal"),
        yes("expect", "every expectation's verdict, on both sides"),
        yes(
            "address",
            "the address bound by mmap with `fixed`/`noreplace` and by mremap with \
             MREMAP_FIXED: absolute; with `hint`: whether the hint was taken; any other \
             mremap: whether it moved",
        ),
        yes(
            "maps",
            "after each statement that may change an address space, for every live \
             process: its scenario VMAs (ranges relative to the mapping names, page-rounded \
             lengths), permissions, VM_LOCKED and what each maps (private anonymous, \
             shared-anon, tmpfs, disk)",
        ),
    ];
    for (f, _) in SmapsView::default().fields() {
        v.push(yes(&format!("smaps {f}"), "every scenario VMA, in kB"));
    }
    for f in STATUS_FIELDS {
        v.push(yes(&format!("status {f}"), "every live process, in kB"));
    }
    v.push(yes("pagemap present", "every page of every scenario VMA"));
    v.push(yes("pagemap exclusive", "every page of every scenario VMA"));
    v.push(yes(
        "sampling",
        &format!(
            "the page sample: every present page of a VMA of up to {SAMPLE_ALL_PAGES} pages, \
             else every {SAMPLE_STRIDE}th page and the first and the last"
        ),
    ));
    let sample = "the page sample".to_string();
    v.push(yes(
        "folio order",
        &format!("{sample}; not on disk-file pages (readahead chooses their folio sizes)"),
    ));
    for f in COMPARED_FLAGS {
        let how = if AGING_FLAGS.contains(&f) {
            format!("{sample}; anonymous pages only: on page-cache and zero pages it follows per-CPU batch drains, the host's reclaim and other processes")
        } else if matches!(
            f,
            KpageFlag::Thp | KpageFlag::CompoundHead | KpageFlag::CompoundTail
        ) {
            format!("{sample}; not on disk-file pages (folio sizes follow readahead)")
        } else if f == KpageFlag::Locked {
            format!("{sample}; a host page read locked is read again, 1 ms apart, for up to 50 ms: no scenario process holds a folio lock at a statement boundary, but the host's reclaim, khugepaged, compaction and readahead reads take it for microseconds")
        } else if matches!(f, KpageFlag::Dirty | KpageFlag::Writeback) {
            format!("{sample}; not on disk-file pages (the host's flusher threads write them back on their own schedule)")
        } else {
            sample.clone()
        };
        v.push(yes(&format!("kpageflags {}", f.as_str()), &how));
    }
    for (f, why) in UNCOMPARED_FLAGS {
        v.push(no(&format!("kpageflags {}", f.as_str()), why));
    }
    v.push(yes(
        "set memory",
        "applied on the host too: the scenario's processes run in a memory cgroup of their \
         own (cgroup v2 memory.max where the host's cgroup2 has the memory controller, else v1 \
         memory.limit_in_bytes) of set memory plus 1 MiB per live process for what a host \
         process charges itself, so both sides reclaim at the same size; without set swap the \
         cgroup never swaps (v2 memory.swap.max 0, v1 memsw limit = memory limit and \
         swappiness 0)",
    ));
    v.push(yes(
        "set swap",
        "applied on the host too: a swap file of that size (at most 8 GiB, room left on the \
         disk) added with swapon (priority 100) under the machine-wide lock, the cgroup allowed \
         that much swap; removed after the file, and by the next run or --restore-knobs after \
         a kill. Other swap the host already has is warned about (results may use it)",
    ));
    v.push(yes(
        "reclaim",
        "the host reclaims from the scenario's cgroup (v2 memory.reclaim, v1 a limit lowered \
         to usage - SIZE and put back); `nothing more can be reclaimed` is success on both \
         sides",
    ));
    for f in ["smaps Swap", "smaps SwapPss"] {
        v.push(no(
            f,
            "read on the host from /proc/PID/smaps and checked by `expect smaps` on each side; \
             not compared after each statement until the engine swaps (scenario v3 work)",
        ));
    }
    v.push(no(
        "status VmSwap",
        "`expect status VmSwap` reads 0 on both sides for now: the scenario status does not \
         carry it yet; the host's /proc/PID/status has it",
    ));
    v.push(no(
        "pagemap swapped",
        "bit 62, checked by `expect pagemap … swapped` on each side; not compared page by page: \
         the engine's page walk lists present pages only",
    ));
    v.push(no(
        "counters",
        "the engine's event counters have no host counterpart; `usermm run` prints them",
    ));
    v.push(no(
        "VMAs the scenario did not create",
        "the host process's own mappings (its binary, stack, heap) are left out",
    ));
    v
}

/// VMAs up to this many pages have every page's flags compared.
const SAMPLE_ALL_PAGES: usize = 64;
/// Otherwise every this many pages (plus the first and the last).
const SAMPLE_STRIDE: usize = 16;
/// Page-difference lines reported per process and statement.
const MAX_PAGE_LINES: usize = 16;

/// How to compare.
#[derive(Clone, Debug, Default)]
pub struct CompareOptions {
    /// Engine tunables applied before the file's own settings.
    pub tunables: Vec<(String, String)>,
    /// Print each statement and both outcomes.
    pub verbose: bool,
}

/// A live oracle: root checked, stop signals caught, the THP knobs saved (and restored when
/// this is dropped).
#[derive(Debug)]
pub struct Session {
    knobs: ThpKnobs,
}

/// What one page looks like.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageObs {
    /// pagemap bit 63.
    pub present: bool,
    /// pagemap bit 56.
    pub exclusive: bool,
    /// The compared kpageflags bits (sampled pages that are present).
    pub flags: Option<u64>,
    /// Folio order (sampled pages that are present).
    pub order: Option<u32>,
}

/// The pages of one VMA that are shown, sparsely: `(index, page)` in index order for every
/// page whose observation is not [`PageObs::default`] (absent and not exclusive), out of
/// `count` pages; every page not listed is absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmaPages {
    /// Pages in the VMA.
    pub count: usize,
    /// The pages shown.
    pub shown: Vec<(usize, PageObs)>,
}

impl VmaPages {
    fn new(start: u64, end: u64) -> VmaPages {
        VmaPages {
            count: (end.saturating_sub(start) / 4096) as usize,
            shown: Vec::new(),
        }
    }

    /// Records page `addr` (from the VMA at `start`) unless it shows nothing.
    fn push(&mut self, start: u64, addr: u64, o: PageObs) {
        if o != PageObs::default() {
            self.shown.push((((addr - start) / 4096) as usize, o));
        }
    }
}

/// Whether page `i` of `n` has its flags compared.
pub fn sampled(i: usize, n: usize) -> bool {
    n <= SAMPLE_ALL_PAGES || i == 0 || i + 1 == n || i.is_multiple_of(SAMPLE_STRIDE)
}

fn aging_mask() -> u64 {
    AGING_FLAGS.iter().fold(0, |m, f| m | f.mask())
}

/// The compared bits of a kpageflags word: [`COMPARED_FLAGS`], less the [`AGING_FLAGS`] of
/// a page that is not anonymous.
fn compared_bits(flags: u64) -> u64 {
    let mask = COMPARED_FLAGS.iter().fold(0, |m, f| m | f.mask());
    if flags & KpageFlag::Anon.mask() == 0 {
        flags & mask & !aging_mask()
    } else {
        flags & mask
    }
}

/// Reads the pages of `[start, end)`: pagemap bits of all, flags and order of the sample.
pub trait ObservePages {
    /// The pages shown and the reasons anything was left out.
    fn observe_pages(&mut self, p: u32, start: u64, end: u64) -> Res<(VmaPages, Vec<String>)>;

    /// Why the VMA `[start, end)` cannot be compared, if it cannot.
    fn vma_problem(&self, _p: u32, _start: u64, _end: u64) -> Option<String> {
        None
    }
}

impl ObservePages for EngineBackend {
    fn observe_pages(&mut self, p: u32, start: u64, end: u64) -> Res<(VmaPages, Vec<String>)> {
        let mut out = VmaPages::new(start, end);
        let n = out.count;
        // The engine shows a page as exclusive only when it is present, so its present pages
        // are all the pages it shows. Any CPU slot will do for this read-only walk.
        let present = {
            let cpu = self
                .machine()?
                .enter_cpu(0)
                .map_err(|e| Fail::Unsupported(e.to_string()))?;
            cpu.present_pages(p, start, end)
                .map_err(|e| Fail::Unsupported(format!("page tables: {}", e.name())))?
        };
        for addr in present {
            let v = self.page(p, addr)?;
            let keep = v.present && sampled(((addr - start) / 4096) as usize, n);
            out.push(
                start,
                addr,
                PageObs {
                    present: v.present,
                    exclusive: v.exclusive,
                    flags: v.kpageflags.filter(|_| keep).map(compared_bits),
                    order: v.folio_order.filter(|_| keep),
                },
            );
        }
        Ok((out, Vec::new()))
    }
}

impl ObservePages for HostBackend<'_> {
    fn vma_problem(&self, p: u32, start: u64, end: u64) -> Option<String> {
        self.own_overlap(p, start, end).map(|(a, b)| {
            format!(
                "the VMA {start:#x}-{end:#x} merged with the oracle server's own mapping \
                 {a:#x}-{b:#x}: place the scenario's mappings elsewhere"
            )
        })
    }

    fn observe_pages(&mut self, p: u32, start: u64, end: u64) -> Res<(VmaPages, Vec<String>)> {
        let mut out = VmaPages::new(start, end);
        let n = out.count;
        let shown = procfs::PM_PRESENT | procfs::PM_EXCLUSIVE;
        let entries = self.pagemap_entries(p, start, end, shown)?;
        let mut skipped = Vec::new();
        for (addr, e) in entries {
            let mut o = PageObs {
                present: e & procfs::PM_PRESENT != 0,
                exclusive: e & procfs::PM_EXCLUSIVE != 0,
                ..PageObs::default()
            };
            let i = ((addr - start) / 4096) as usize;
            if o.present && sampled(i, n) && skipped.is_empty() {
                match self.frame(e) {
                    Ok((f, ord)) => {
                        o.flags = f.map(compared_bits);
                        o.order = ord;
                    }
                    Err(f) => {
                        skipped.push(format!("kpageflags and folio order: {}", fail_name(&f)))
                    }
                }
            }
            out.push(start, addr, o);
        }
        Ok((out, skipped))
    }
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
const STATUS_FIELDS: [&str; 4] = ["VmRSS", "VmLck", "RssFile", "RssShmem"];

/// A disk-file page as compared: without what follows the folio's size, which readahead
/// chooses (folio order, `thp`, the compound bits), and without `dirty` and `writeback`,
/// which the host's flusher threads change on their own schedule (`dirty_expire_centisecs`,
/// and at once when the machine's dirty memory passes `dirty_background_ratio`). A scenario
/// still checks them where it asks.
fn disk_page(o: &PageObs) -> PageObs {
    let mask = KpageFlag::Thp.mask()
        | KpageFlag::CompoundHead.mask()
        | KpageFlag::CompoundTail.mask()
        | KpageFlag::Dirty.mask()
        | KpageFlag::Writeback.mask();
    PageObs {
        flags: o.flags.map(|f| f & !mask),
        order: None,
        ..*o
    }
}

/// The pages of a disk-file VMA as compared ([`disk_page`]).
fn disk_pages(pages: &VmaPages) -> VmaPages {
    VmaPages {
        count: pages.count,
        shown: pages
            .shown
            .iter()
            .map(|&(i, o)| (i, disk_page(&o)))
            .collect(),
    }
}

/// What one process looks like after a statement.
#[derive(Debug, Default)]
struct ProcObs {
    vmas: Vec<VmaObs>,
    /// [`STATUS_FIELDS`].
    status: Option<[u64; 4]>,
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
        Ok(s) => o.status = Some([s.vm_rss, s.vm_lck, s.rss_file, s.rss_shmem]),
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
        for stmt in &script.stmts {
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
                let mut d = Diff {
                    line,
                    out: &mut rep,
                };
                compare_processes(&mut eng, &mut host, &dead, &mut d);
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
fn has_reclaim(script: &Script) -> bool {
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
        compare_obs(name.as_str(), &eo, &ho, d, host);
    }
}

fn compare_obs(
    proc_name: &str,
    e: &ProcObs,
    h: &ProcObs,
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
            if a != b {
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
        for ((f, a), (_, b)) in ev.smaps.fields().iter().zip(hv.smaps.fields().iter()) {
            if a != b {
                d.add(
                    Some(proc_name),
                    format!("smaps {} {f}", ev.key),
                    kb(*a),
                    kb(*b),
                );
            }
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

/// One compared property of a page.
#[derive(Clone, Copy, Debug)]
enum PageField {
    Present,
    Exclusive,
    Order,
    Flag(KpageFlag),
}

impl PageField {
    fn name(self) -> &'static str {
        match self {
            PageField::Present => "present",
            PageField::Exclusive => "exclusive",
            PageField::Order => "folio order",
            PageField::Flag(f) => f.as_str(),
        }
    }

    /// The field's value on page `o` (`None`: not observed there).
    fn get(self, o: &PageObs) -> Option<String> {
        match self {
            PageField::Present => Some(u8::from(o.present).to_string()),
            PageField::Exclusive => Some(u8::from(o.exclusive).to_string()),
            PageField::Order => o.order.map(|x| x.to_string()),
            PageField::Flag(f) => o
                .flags
                .map(|w| if w & f.mask() != 0 { "1" } else { "0" }.to_string()),
        }
    }
}

/// Every compared page field: pagemap's two bits, the folio order, [`COMPARED_FLAGS`].
fn page_fields() -> impl Iterator<Item = PageField> {
    [PageField::Present, PageField::Exclusive, PageField::Order]
        .into_iter()
        .chain(COMPARED_FLAGS.into_iter().map(PageField::Flag))
}

/// The pages either side shows, merged by index: `(index, engine, host)`, an unlisted page
/// being absent on its side.
fn merge_pages(e: &VmaPages, h: &VmaPages) -> Vec<(usize, PageObs, PageObs)> {
    let absent = PageObs::default();
    let mut out = Vec::with_capacity(e.shown.len().max(h.shown.len()));
    let (mut ei, mut hi) = (e.shown.iter().peekable(), h.shown.iter().peekable());
    loop {
        let next = match (ei.peek(), hi.peek()) {
            (None, None) => break,
            (Some(&&(i, eo)), Some(&&(j, ho))) if i == j => {
                ei.next();
                hi.next();
                (i, eo, ho)
            }
            (Some(&&(i, eo)), Some(&&(j, _))) if i < j => {
                ei.next();
                (i, eo, absent)
            }
            (Some(&&(i, eo)), None) => {
                ei.next();
                (i, eo, absent)
            }
            (_, Some(&&(j, ho))) => {
                hi.next();
                (j, absent, ho)
            }
        };
        out.push(next);
    }
    out
}

fn compare_pages(
    proc_name: &str,
    host_start: u64,
    ep: &VmaPages,
    hp: &VmaPages,
    d: &mut Diff<'_>,
    relative: &dyn Fn(u64) -> String,
) {
    let mut lines = 0usize;
    let mut more = 0usize;
    let merged = merge_pages(ep, hp);
    let absent = PageObs::default();
    for field in page_fields() {
        let (name, get) = (field.name(), |o: &PageObs| field.get(o));
        // Pages absent on both sides agree on this field (a flushed run) if it is defined
        // for an absent page; otherwise they are skipped, as a page-by-page walk would.
        let absent_agrees = get(&absent).is_some();
        // Runs of pages with the same (engine, host) disagreement.
        let mut run: Option<(usize, usize, String, String)> = None;
        let mut flush = |run: &mut Option<(usize, usize, String, String)>, d: &mut Diff<'_>| {
            if let Some((a, b, ev, hv)) = run.take() {
                if lines >= MAX_PAGE_LINES {
                    more += 1;
                    return;
                }
                lines += 1;
                let at = |i: usize| relative(host_start + i as u64 * 4096);
                let what = if a == b {
                    format!("page {} {name}", at(a))
                } else {
                    format!("pages {}..{} {name}", at(a), at(b + 1))
                };
                d.add(Some(proc_name), what, ev, hv);
            }
        };
        let mut next = 0usize;
        for &(i, eo, ho) in &merged {
            if i > next && absent_agrees {
                flush(&mut run, d);
            }
            next = i + 1;
            let (ev, hv) = (get(&eo), get(&ho));
            let (Some(ev), Some(hv)) = (ev, hv) else {
                continue;
            };
            if ev == hv {
                flush(&mut run, d);
                continue;
            }
            match &mut run {
                Some((_, b, rev, rhv)) if *rev == ev && *rhv == hv => *b = i,
                _ => {
                    flush(&mut run, d);
                    run = Some((i, i, ev, hv));
                }
            }
        }
        flush(&mut run, d);
    }
    if more > 0 {
        d.add(
            Some(proc_name),
            "pages".into(),
            format!("{more} more page differences"),
            String::new(),
        );
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
            },
        ),
        Err(e) => {
            let mut rep = OracleReport::new(&script.file);
            rep.cannot_run = Some((0, format!("host: {e}")));
            rep
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page-by-page comparison the sparse one replaced, kept as its reference.
    fn dense(ep: &[PageObs], hp: &[PageObs], d: &mut Diff<'_>) {
        let mut lines = 0usize;
        let mut more = 0usize;
        for field in page_fields() {
            let (name, get) = (field.name(), |o: &PageObs| field.get(o));
            let mut run: Option<(usize, usize, String, String)> = None;
            let mut flush = |run: &mut Option<(usize, usize, String, String)>, d: &mut Diff<'_>| {
                if let Some((a, b, ev, hv)) = run.take() {
                    if lines >= MAX_PAGE_LINES {
                        more += 1;
                        return;
                    }
                    lines += 1;
                    let what = if a == b {
                        format!("page {a:#x} {name}")
                    } else {
                        format!("pages {a:#x}..{:#x} {name}", b + 1)
                    };
                    d.add(Some("p0"), what, ev, hv);
                }
            };
            for (i, (eo, ho)) in ep.iter().zip(hp).enumerate() {
                let (Some(ev), Some(hv)) = (get(eo), get(ho)) else {
                    continue;
                };
                if ev == hv {
                    flush(&mut run, d);
                    continue;
                }
                match &mut run {
                    Some((_, b, rev, rhv)) if *rev == ev && *rhv == hv => *b = i,
                    _ => {
                        flush(&mut run, d);
                        run = Some((i, i, ev, hv));
                    }
                }
            }
            flush(&mut run, d);
        }
        if more > 0 {
            d.add(
                Some("p0"),
                "pages".into(),
                format!("{more} more page differences"),
                String::new(),
            );
        }
    }

    fn sparse(pages: &[PageObs]) -> VmaPages {
        let mut v = VmaPages {
            count: pages.len(),
            shown: Vec::new(),
        };
        for (i, o) in pages.iter().enumerate() {
            v.push(0, i as u64 * 4096, *o);
        }
        v
    }

    /// A page drawn from a few states, so runs, gaps and one-sided pages all occur.
    fn page(r: u64) -> PageObs {
        let flags = [
            None,
            Some(0),
            Some(KpageFlag::Lru.mask()),
            Some(KpageFlag::Anon.mask()),
        ];
        match r % 6 {
            0..=2 => PageObs::default(),
            3 => PageObs {
                present: true,
                exclusive: true,
                flags: flags[(r / 6 % 4) as usize],
                order: Some((r / 24 % 2) as u32),
            },
            4 => PageObs {
                present: true,
                ..PageObs::default()
            },
            _ => PageObs {
                exclusive: true,
                ..PageObs::default()
            },
        }
    }

    #[test]
    fn sparse_comparison_reports_what_the_dense_one_did() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            seed >> 33
        };
        for case in 0..400 {
            let n = 1 + (next() % 80) as usize;
            let mut ep: Vec<PageObs> = (0..n).map(|_| page(next())).collect();
            // Mostly agreeing sides, with a few pages changed on the host.
            let mut hp = ep.clone();
            for _ in 0..(next() % 6) {
                let i = (next() % n as u64) as usize;
                hp[i] = page(next());
            }
            if case % 7 == 0 {
                ep.iter_mut().for_each(|p| *p = PageObs::default());
            }
            let mut want = OracleReport::new("t");
            dense(
                &ep,
                &hp,
                &mut Diff {
                    line: 1,
                    out: &mut want,
                },
            );
            let mut got = OracleReport::new("t");
            let at = |a: u64| format!("{:#x}", a / 4096);
            compare_pages(
                "p0",
                0,
                &sparse(&ep),
                &sparse(&hp),
                &mut Diff {
                    line: 1,
                    out: &mut got,
                },
                &at,
            );
            assert_eq!(
                got.differences, want.differences,
                "case {case}: {ep:?} / {hp:?}"
            );
        }
    }
}
