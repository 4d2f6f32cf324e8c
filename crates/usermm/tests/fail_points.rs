//! Fault injection: make the N-th allocation fail, for every N a workload reaches.
//!
//! Each workload below is a fixed sequence of system calls and memory accesses made through
//! the engine API. It is first run without injection (the reference), which also measures how
//! many allocations of each kind it makes. Then, for each fail-point kind
//!
//! - `folio`: the N-th allocation of an anonymous or shmem folio (`PhysMem::fail_folio`),
//! - `pgtable`: the N-th page-table page, including a new process's root table
//!   (`PhysMem::fail_pgtable`),
//! - `fork tree`: the N-th VMA-tree node allocated while fork duplicates the tree
//!   (`Machine::fail_next_fork_tree_alloc`, armed just before each fork of the workload),
//!
//! it is re-run once per N = 1, 2, ... until a run behaves exactly like the reference (same
//! results, same counters: the N-th allocation does not exist). For page tables the count is
//! known from the reference's counters and must match; folio allocations are bounded by the
//! frames allocated.
//! (The engine has no separate `anon_vma` allocation to fail: an anon_vma is an identifier.
//! `Ev::VmaNodeAlloc` is never counted, so the fork-tree sweep runs until a run no longer
//! meets the failure instead of measuring first.)
//!
//! What each injected run must show:
//! - the step that hits the failure fails the way Linux fails for lack of memory: `ENOMEM` or
//!   `EAGAIN` from a system call, `SIGBUS` from an access (the engine's OOM policy), or the
//!   call succeeds anyway (populate and mlock ignore fault failures, mTHP falls back to a
//!   smaller folio);
//! - every later call on that process returns a value or an errno Linux can return for it;
//! - processes the failure did not touch see exactly the reference results: a failed fork
//!   leaves the parent as it was, so its later reads match the reference;
//! - `validate()` is clean after every step, and once every process has exited (and the
//!   per-CPU batches are drained) no frame is left allocated.
//!
//! The number of fail points tried is printed (`--nocapture`).

mod common;
use common::*;
use std::collections::HashMap;
use usermm::machine::START_BRK;
use usermm::{
    Access, Advice, Arch, Errno, Ev, Machine, MachineConfig, MmapArgs, MremapFlags, Placement,
    Privilege, Prot, Sharing, Signal, Snapshot, ThpPolicy,
};

/// Index of a process in a workload (the n-th `Spawn`/`Fork` creates slot n).
type Slot = usize;

/// One step of a workload.
#[derive(Clone, Debug)]
enum Op {
    Spawn(Privilege),
    Fork(Slot),
    Exit(Slot),
    Mmap(Slot, MmapArgs),
    Munmap(Slot, u64, u64),
    Mprotect(Slot, u64, u64, Prot),
    Madvise(Slot, u64, u64, Advice),
    Mlock(Slot, u64, u64),
    Mlock2Onfault(Slot, u64, u64),
    Munlock(Slot, u64, u64),
    Mremap(Slot, u64, u64, u64, MremapFlags),
    Brk(Slot, u64),
    Pin(Slot, u64, u64),
    Unpin(Slot, u64, u64),
    Write(Slot, u64, u64, u8),
    Touch(Slot, u64, u64, Access),
    /// `find_mismatch` against a byte.
    Check(Slot, u64, u64, u8),
}

impl Op {
    fn slot(&self) -> Option<Slot> {
        use Op::*;
        match *self {
            Spawn(_) => None,
            Fork(s)
            | Exit(s)
            | Mmap(s, _)
            | Munmap(s, ..)
            | Mprotect(s, ..)
            | Madvise(s, ..)
            | Mlock(s, ..)
            | Mlock2Onfault(s, ..)
            | Munlock(s, ..)
            | Mremap(s, ..)
            | Brk(s, _)
            | Pin(s, ..)
            | Unpin(s, ..)
            | Write(s, ..)
            | Touch(s, ..)
            | Check(s, ..) => Some(s),
        }
    }

    fn is_access(&self) -> bool {
        matches!(self, Op::Write(..) | Op::Touch(..) | Op::Check(..))
    }

    /// Errnos Linux documents for this call (man-pages 6.x).
    fn linux_errnos(&self) -> &'static [Errno] {
        use Errno::*;
        match self {
            Op::Spawn(_) | Op::Fork(_) => &[EAGAIN, ENOMEM],
            Op::Exit(_) => &[],
            Op::Mmap(..) => &[
                EACCES, EAGAIN, EEXIST, EINVAL, ENFILE, ENOMEM, EOVERFLOW, EPERM,
            ],
            Op::Munmap(..) => &[EINVAL, ENOMEM],
            Op::Mprotect(..) => &[EACCES, EINVAL, ENOMEM],
            Op::Madvise(..) => &[EACCES, EAGAIN, EINVAL, EIO, ENOMEM, EPERM],
            Op::Mlock(..) | Op::Mlock2Onfault(..) | Op::Munlock(..) => {
                &[EAGAIN, EINVAL, ENOMEM, EPERM]
            }
            Op::Mremap(..) => &[EAGAIN, EFAULT, EINVAL, ENOMEM],
            // brk reports failure by returning the old break.
            Op::Brk(..) => &[],
            // io_uring buffer registration.
            Op::Pin(..) => &[EFAULT, EINVAL, ENOMEM, EOVERFLOW, EBUSY],
            Op::Unpin(..) => &[EINVAL],
            Op::Write(..) | Op::Touch(..) | Op::Check(..) => &[],
        }
    }

    /// Errnos that mean "no memory" for this call.
    fn oom_errnos(&self) -> &'static [Errno] {
        use Errno::*;
        match self {
            Op::Brk(..) | Op::Exit(_) | Op::Unpin(..) => &[],
            _ => &[ENOMEM, EAGAIN],
        }
    }
}

/// The result of one step.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Out {
    /// Success, with the value the call returned (address, pid slot, mismatch offset + 1, ...).
    Ok(u64),
    Errno(Errno),
    Signal(Signal),
    /// The process does not exist (its spawn or fork failed).
    Skipped,
}

/// Where to inject a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inject {
    None,
    Folio(u64),
    Pgtable(u64),
    /// The n-th VMA-tree node of the fork at step `.0`.
    ForkTree(usize, u64),
}

/// A named workload.
struct Workload {
    name: &'static str,
    arch: Arch,
    thp_top: ThpPolicy,
    mthp_64k: bool,
    /// Processes share memory (shared anon mappings): a failure in one may change what the
    /// others see.
    shares: bool,
    ops: Vec<Op>,
}

/// What a run produced.
struct Run {
    outs: Vec<Out>,
    counters: Snapshot,
    /// VMA-tree nodes allocated by each fork step.
    fork_nodes: HashMap<usize, u64>,
}

fn machine_for(w: &Workload) -> Machine {
    let mut cfg = MachineConfig {
        memory: 64 * M,
        cpus: 1,
        arch: w.arch,
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = true;
    cfg.tunables.thp.top = w.thp_top;
    if w.mthp_64k {
        cfg.tunables
            .thp
            .set_size(64 * K, ThpPolicy::Always)
            .unwrap();
    }
    Machine::new(cfg)
}

/// Runs `w` with one injected failure, checking `validate()` after every step and that no
/// frame is left once every process exited.
fn run(w: &Workload, inject: Inject) -> Run {
    let m = machine_for(w);
    let cpu = m.enter_cpu(0).unwrap();
    match inject {
        Inject::Folio(n) => m.phys.fail_folio.arm(Some(n)),
        Inject::Pgtable(n) => m.phys.fail_pgtable.arm(Some(n)),
        _ => {}
    }
    let mut pids: Vec<Option<u32>> = Vec::new();
    let mut outs = Vec::new();
    let mut fork_nodes = HashMap::new();
    let sys = |r: Result<u64, Errno>| match r {
        Ok(v) => Out::Ok(v),
        Err(e) => Out::Errno(e),
    };
    let unit = |r: Result<(), Errno>| sys(r.map(|_| 0));
    let acc = |r: Result<(), Signal>| match r {
        Ok(()) => Out::Ok(0),
        Err(s) => Out::Signal(s),
    };
    for (i, op) in w.ops.iter().enumerate() {
        let pid = op.slot().map(|s| pids[s]);
        if pid == Some(None) {
            if matches!(op, Op::Fork(_)) {
                pids.push(None);
            }
            outs.push(Out::Skipped);
            continue;
        }
        let p = pid.flatten().unwrap_or(0);
        let before = m.counters().get(Ev::VmaNodeAlloc);
        let out = match op {
            Op::Spawn(pr) => {
                let r = cpu.spawn(*pr, 8 * M);
                pids.push(r.ok());
                sys(r.map(|_| pids.len() as u64 - 1))
            }
            Op::Fork(_) => {
                if let Inject::ForkTree(at, n) = inject {
                    if at == i {
                        m.fail_next_fork_tree_alloc(Some(n));
                    }
                }
                let r = cpu.fork(p);
                pids.push(r.ok());
                fork_nodes.insert(i, m.counters().get(Ev::VmaNodeAlloc) - before);
                sys(r.map(|_| pids.len() as u64 - 1))
            }
            Op::Exit(s) => {
                let r = cpu.exit(p);
                pids[*s] = None;
                unit(r)
            }
            Op::Mmap(_, a) => sys(cpu.mmap(p, *a)),
            Op::Munmap(_, a, l) => unit(cpu.munmap(p, *a, *l)),
            Op::Mprotect(_, a, l, pr) => unit(cpu.mprotect(p, *a, *l, *pr)),
            Op::Madvise(_, a, l, adv) => unit(cpu.madvise(p, *a, *l, *adv)),
            Op::Mlock(_, a, l) => unit(cpu.mlock(p, *a, *l)),
            Op::Mlock2Onfault(_, a, l) => unit(cpu.mlock2(p, *a, *l, true)),
            Op::Munlock(_, a, l) => unit(cpu.munlock(p, *a, *l)),
            Op::Mremap(_, a, o, n, f) => sys(cpu.mremap(p, *a, *o, *n, *f)),
            Op::Brk(_, b) => sys(cpu.brk(p, *b)),
            Op::Pin(_, a, l) => unit(cpu.pin(p, *a, *l)),
            Op::Unpin(_, a, l) => unit(cpu.unpin(p, *a, *l)),
            Op::Write(_, a, l, v) => acc(cpu.write_fill(p, *a, *l, *v)),
            Op::Touch(_, a, l, x) => acc(cpu.touch(p, *a, *l, *x)),
            Op::Check(_, a, l, v) => match cpu.find_mismatch(p, *a, *l, *v) {
                Ok(None) => Out::Ok(0),
                Ok(Some(at)) => Out::Ok(at - a + 1),
                Err(s) => Out::Signal(s),
            },
        };
        outs.push(out);
        if let Err(e) = m.validate() {
            panic!(
                "{} with {inject:?}: validate failed after step {i} ({op:?} -> {:?}):\n{}",
                w.name,
                outs[i],
                e.join("\n")
            );
        }
    }
    m.phys.fail_folio.arm(None);
    m.phys.fail_pgtable.arm(None);
    let counters = m.counters();
    for p in pids.into_iter().flatten() {
        cpu.exit(p).unwrap();
    }
    cpu.lru_add_drain_all();
    if let Err(e) = m.validate() {
        panic!(
            "{} with {inject:?}: validate failed after exit:\n{}",
            w.name,
            e.join("\n")
        );
    }
    assert_eq!(
        m.phys.allocated_frames(),
        0,
        "{} with {inject:?}: frames leaked after every process exited",
        w.name
    );
    Run {
        outs,
        counters,
        fork_nodes,
    }
}

/// Checks an injected run against the reference; returns whether the failure was hit at all.
fn check(w: &Workload, inject: Inject, reference: &Run, got: &Run) -> bool {
    let ctx = |i: usize| {
        format!(
            "{} with {inject:?}, step {i} {:?}: reference {:?}, got {:?}",
            w.name, w.ops[i], reference.outs[i], got.outs[i]
        )
    };
    // Slots whose results may differ from the reference.
    let mut tainted: Vec<bool> = Vec::new();
    let mut first_divergence = None;
    for (i, op) in w.ops.iter().enumerate() {
        let (want, out) = (&reference.outs[i], &got.outs[i]);
        let slot = op.slot();
        let is_tainted = slot.is_some_and(|s| tainted[s]);
        match op {
            Op::Spawn(_) => tainted.push(false),
            Op::Fork(s) => tainted.push(tainted[*s]),
            _ => {}
        }
        if out == want {
            continue;
        }
        if first_divergence.is_none() {
            first_divergence = Some(i);
        }
        if !is_tainted {
            // The step that met the failure: it must fail for lack of memory.
            let oom = match out {
                Out::Errno(e) => op.oom_errnos().contains(e),
                Out::Signal(Signal::Bus(_)) => op.is_access(),
                _ => false,
            };
            assert!(oom, "{}: not an out-of-memory failure", ctx(i));
        } else {
            let allowed = match out {
                Out::Ok(_) | Out::Skipped => true,
                Out::Errno(e) => op.linux_errnos().contains(e),
                Out::Signal(Signal::Segv(_) | Signal::Bus(_)) => op.is_access(),
                Out::Signal(Signal::NoProcess) => false,
            };
            assert!(
                allowed,
                "{}: not a result Linux gives for this call",
                ctx(i)
            );
        }
        match op {
            // A failed fork leaves the parent as it was; the child does not exist.
            Op::Spawn(_) | Op::Fork(_) => {
                let last = tainted.len() - 1;
                tainted[last] = true;
            }
            _ => {
                if w.shares {
                    tainted.iter_mut().for_each(|t| *t = true);
                } else if let Some(s) = slot {
                    tainted[s] = true;
                }
            }
        }
    }
    first_divergence.is_some() || got.counters != reference.counters
}

/// Figures of one sweep.
#[derive(Default)]
struct Tried {
    folio: u64,
    pgtable: u64,
    fork_tree: u64,
}

/// Sweeps every fail point of every kind over `w`.
fn sweep(w: &Workload) -> Tried {
    let reference = run(w, Inject::None);
    // Sanity: the workload itself succeeds where it is meant to.
    assert!(
        !reference.outs.iter().any(|o| matches!(o, Out::Skipped)),
        "{}: reference run skipped steps: {:?}",
        w.name,
        reference.outs
    );
    let c = &reference.counters;
    let pgtables = c.get(Ev::PgtableAlloc);
    // Every folio allocation takes at least one frame.
    let folio_bound = c.get(Ev::FramesAlloc) - pgtables;
    let mut t = Tried::default();

    let mut n = 1;
    loop {
        let inj = Inject::Folio(n);
        let got = run(w, inj);
        let hit = check(w, inj, &reference, &got);
        if !hit {
            break;
        }
        assert!(
            n <= folio_bound,
            "{}: folio fail point {n} still fires beyond {folio_bound} frames",
            w.name
        );
        t.folio += 1;
        n += 1;
    }
    assert!(
        t.folio > 0 || folio_bound == 0,
        "{}: no folio allocation failed",
        w.name
    );

    for n in 1..=pgtables + 1 {
        let inj = Inject::Pgtable(n);
        let got = run(w, inj);
        let hit = check(w, inj, &reference, &got);
        assert_eq!(
            hit,
            n <= pgtables,
            "{}: page-table fail point {n} of {pgtables}",
            w.name
        );
        t.pgtable += u64::from(hit);
    }

    // The engine does not count VMA-tree nodes (`Ev::VmaNodeAlloc` stays 0), so each fork's
    // sweep runs until a run no longer meets the failure.
    let mut forks: Vec<usize> = reference.fork_nodes.keys().copied().collect();
    forks.sort();
    for at in forks {
        let mut n = 1;
        loop {
            let inj = Inject::ForkTree(at, n);
            let got = run(w, inj);
            if !check(w, inj, &reference, &got) {
                break;
            }
            assert!(
                matches!(got.outs[at], Out::Errno(Errno::ENOMEM)),
                "{}: fork with a failed tree node allocation: {:?}",
                w.name,
                got.outs[at]
            );
            assert!(
                n < 10_000,
                "{}: fork at step {at} never stops failing",
                w.name
            );
            t.fork_tree += 1;
            n += 1;
        }
        assert!(
            n > 1,
            "{}: the fork at step {at} allocated no tree node",
            w.name
        );
    }
    println!(
        "fail points {}: {} folio + {} page-table + {} fork-tree = {} tried, nothing leaked",
        w.name,
        t.folio,
        t.pgtable,
        t.fork_tree,
        t.folio + t.pgtable + t.fork_tree
    );
    t
}

// ---------------------------------------------------------------------------------------------
// Workloads.
// ---------------------------------------------------------------------------------------------

const A: u64 = 0x10_0000_0000;
const B: u64 = 0x20_0000_0000;

fn at(addr: u64, len: u64, prot: Prot) -> MmapArgs {
    MmapArgs {
        placement: Placement::Fixed(addr),
        ..MmapArgs::anon(len, prot)
    }
}

fn base(name: &'static str, ops: Vec<Op>) -> Workload {
    Workload {
        name,
        arch: Arch::X86_64,
        thp_top: ThpPolicy::Madvise,
        mthp_64k: false,
        shares: false,
        ops,
    }
}

/// Faults, fork, COW on both sides, partial unmap and mprotect, dontneed.
fn cow_ops(len: u64) -> Vec<Op> {
    use Op::*;
    vec![
        Spawn(Privilege::Ordinary),
        Mmap(0, at(A, len, RW)),
        Write(0, A, len, 0x11),
        Touch(0, A + len, 4 * K, Access::Read), // past the end: SIGSEGV
        Mmap(0, at(B, 64 * K, RW)),
        Touch(0, B, 64 * K, Access::Read), // zero pages
        Fork(0),
        Write(1, A + 16 * K, 8 * K, 0x22),
        Write(0, A + 64 * K, 4 * K, 0x33),
        Write(1, B + 4 * K, 4 * K, 0x44),
        Check(0, A, 16 * K, 0x11),
        Check(0, A + 16 * K, 8 * K, 0x11),
        Check(1, A + 16 * K, 8 * K, 0x22),
        Check(1, A + 64 * K, 4 * K, 0x11),
        Check(0, A + 64 * K, 4 * K, 0x33),
        Check(0, B, 64 * K, 0),
        Munmap(0, A + 128 * K, 32 * K),
        Mprotect(0, A + 32 * K, 16 * K, RO),
        Write(0, A + 32 * K, 4 * K, 0x55), // SIGSEGV
        Madvise(1, A, 8 * K, Advice::DontNeed),
        Check(1, A, 8 * K, 0),
        Fork(1),
        Write(2, A + 8 * K, 4 * K, 0x66),
        Check(1, A + 8 * K, 4 * K, 0x11),
        Exit(1),
        Write(0, A, 16 * K, 0x77),
        Check(0, A, 16 * K, 0x77),
        Check(2, A + 8 * K, 4 * K, 0x66),
        Check(2, A + 64 * K, 4 * K, 0x11),
        Exit(2),
        Mprotect(0, A + 32 * K, 16 * K, RW),
        Write(0, A + 32 * K, 16 * K, 0x12),
        Check(0, A + 16 * K, 48 * K, 0x12), // 16K..32K still 0x11: first mismatch reported
    ]
}

fn small_pages() -> Workload {
    base(
        "4K folios: fork, COW, munmap, mprotect, dontneed",
        cow_ops(192 * K),
    )
}

fn mthp() -> Workload {
    Workload {
        mthp_64k: true,
        ..base(
            "64K mTHP: fork, COW, munmap, mprotect, dontneed",
            cow_ops(256 * K),
        )
    }
}

fn mthp_arm64() -> Workload {
    Workload {
        arch: Arch::Arm64,
        mthp_64k: true,
        ..base("arm64 64K mTHP (contpte)", cow_ops(256 * K))
    }
}

fn pmd_thp() -> Workload {
    use Op::*;
    let ops = vec![
        Spawn(Privilege::Ordinary),
        Mmap(0, at(A, 4 * M, RW)),
        Write(0, A, 4 * M, 0x21),
        Mmap(0, at(B, 2 * M, RW)),
        Touch(0, B, 2 * M, Access::Read), // huge zero page
        Fork(0),
        Write(1, A + 8 * K, 1, 0x31), // split + COW one page in the child
        Write(0, B + 4 * K, 4 * K, 0x32), // huge zero page -> THP
        Check(0, A + 8 * K, 4 * K, 0x21),
        Check(1, A + 8 * K, 1, 0x31),
        Check(1, A + 2 * M, 2 * M, 0x21),
        Munmap(0, A + 4 * K, 4 * K),
        Mprotect(0, A + 2 * M, 64 * K, RO),
        Madvise(1, A + 2 * M, 2 * M, Advice::DontNeed),
        Check(1, A + 2 * M, 2 * M, 0),
        Write(1, A + 2 * M, 2 * M, 0x41),
        Check(0, A + 2 * M, 2 * M, 0x21),
        Check(0, A + 8 * K, 4 * K, 0x21),
        Exit(1),
        Write(0, A, 4 * K, 0x51),
        Check(0, A, 4 * K, 0x51),
    ];
    Workload {
        thp_top: ThpPolicy::Always,
        ..base("PMD THP: fork, split, COW, huge zero page", ops)
    }
}

fn mlock() -> Workload {
    use Op::*;
    let ops = vec![
        Spawn(Privilege::Ordinary),
        Mmap(
            0,
            MmapArgs {
                locked: true,
                ..at(A, 64 * K, RW)
            },
        ),
        Mmap(0, at(B, 64 * K, RW)),
        Mlock2Onfault(0, B, 64 * K),
        Write(0, B, 16 * K, 0x13),
        Write(0, A, 64 * K, 0x14),
        Fork(0),
        Write(1, A + 16 * K, 4 * K, 0x15),
        Check(0, A + 16 * K, 4 * K, 0x14),
        Munlock(0, A, 64 * K),
        Mlock(0, A, 32 * K),
        Munmap(0, A + 8 * K, 8 * K),
        Check(0, A + 16 * K, 16 * K, 0x14),
        Check(1, A + 32 * K, 32 * K, 0x14),
        Check(1, B, 16 * K, 0x13),
        Exit(1),
    ];
    base("mlock, MAP_LOCKED, mlock2 onfault", ops)
}

fn pins() -> Workload {
    use Op::*;
    let ops = vec![
        Spawn(Privilege::Privileged),
        Mmap(0, at(A, 64 * K, RW)),
        Write(0, A, 64 * K, 0x14),
        Pin(0, A + 16 * K, 16 * K),
        Fork(0), // pinned exclusive pages are copied for the child
        Write(1, A + 16 * K, 4 * K, 0x15),
        Check(0, A + 16 * K, 4 * K, 0x14),
        Unpin(0, A + 16 * K, 16 * K),
        Check(1, A + 20 * K, 12 * K, 0x14),
        Exit(1),
    ];
    base("pins copied at fork", ops)
}

fn mremap() -> Workload {
    use Op::*;
    let ops = vec![
        Spawn(Privilege::Ordinary),
        Mmap(0, at(A, 64 * K, RW)),
        Write(0, A, 64 * K, 0x16),
        Mremap(
            0,
            A,
            64 * K,
            128 * K,
            MremapFlags {
                maymove: true,
                fixed: Some(B),
                dontunmap: false,
            },
        ),
        Check(0, B, 64 * K, 0x16),
        Write(0, B + 64 * K, 64 * K, 0x17),
        Mremap(0, B, 128 * K, 64 * K, MremapFlags::default()),
        Check(0, B, 64 * K, 0x16),
    ];
    base("mremap move and shrink", ops)
}

fn brk_and_shared() -> Workload {
    use Op::*;
    let ops = vec![
        Spawn(Privilege::Ordinary),
        Brk(0, START_BRK + 64 * K),
        Write(0, START_BRK, 64 * K, 0x18),
        Brk(0, START_BRK + 16 * K),
        Check(0, START_BRK, 16 * K, 0x18),
        Mmap(
            0,
            MmapArgs {
                sharing: Sharing::Shared,
                ..at(A, 32 * K, RW)
            },
        ),
        Write(0, A, 16 * K, 0x19),
        Fork(0),
        Write(1, A + 16 * K, 16 * K, 0x1a),
        Check(0, A + 16 * K, 16 * K, 0x1a),
        Check(1, A, 16 * K, 0x19),
        Check(1, START_BRK, 16 * K, 0x18),
        Exit(0),
        Check(1, A, 32 * K, 0x19),
    ];
    Workload {
        shares: true,
        ..base("brk, shared anon across fork", ops)
    }
}

/// Enough VMAs that the VMA tree has several levels of nodes to duplicate at fork.
fn many_vmas() -> Workload {
    use Op::*;
    let mut ops = vec![Spawn(Privilege::Ordinary)];
    for i in 0..48 {
        let prot = if i % 2 == 0 { RW } else { RO };
        ops.push(Mmap(0, at(A + i * 8 * K, 4 * K, prot)));
        if i % 2 == 0 {
            ops.push(Write(0, A + i * 8 * K, 4 * K, i as u8 + 1));
        }
    }
    ops.push(Fork(0));
    ops.push(Write(1, A, 4 * K, 0xee));
    ops.push(Fork(1));
    ops.push(Check(0, A, 4 * K, 1));
    ops.push(Check(2, A, 4 * K, 0xee));
    ops.push(Check(2, A + 16 * K, 4 * K, 3));
    base("48 VMAs, two forks (tree duplication)", ops)
}

#[test]
fn every_folio_pgtable_and_fork_tree_allocation_can_fail_cleanly_small_pages() {
    sweep(&small_pages());
}

#[test]
fn every_allocation_can_fail_cleanly_with_mthp() {
    sweep(&mthp());
}

#[test]
fn every_allocation_can_fail_cleanly_with_mthp_on_arm64() {
    sweep(&mthp_arm64());
}

#[test]
fn every_allocation_can_fail_cleanly_with_pmd_thp() {
    sweep(&pmd_thp());
}

#[test]
fn every_allocation_can_fail_cleanly_with_mlock() {
    sweep(&mlock());
}

#[test]
fn every_allocation_can_fail_cleanly_with_pins_at_fork() {
    sweep(&pins());
}

#[test]
fn every_allocation_can_fail_cleanly_in_mremap() {
    sweep(&mremap());
}

#[test]
fn every_allocation_can_fail_cleanly_with_brk_and_shared_memory() {
    sweep(&brk_and_shared());
}

#[test]
fn every_allocation_can_fail_cleanly_while_forking_many_vmas() {
    let t = sweep(&many_vmas());
    assert!(
        t.fork_tree >= 2,
        "the tree of 48 VMAs has several nodes to fail"
    );
}

// ---------------------------------------------------------------------------------------------
// Minimal reproductions of the engine bugs the sweeps found.
// ---------------------------------------------------------------------------------------------

/// A fork that runs out of memory while copying a pinned page for the child must tear the
/// child down completely. The PTEs `copy_pte_range` had already copied into the child's
/// table are not counted in the table's entry count (the early return skips it), so the
/// teardown does not drop their references and the folios leak.
#[test]
fn failed_fork_while_copying_a_pinned_page_leaks_nothing() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Privileged, 8 * M).unwrap();
    let a = cpu.mmap(p, MmapArgs::anon(64 * K, RW)).unwrap();
    cpu.write_fill(p, a, 64 * K, 1).unwrap();
    cpu.pin(p, a + 16 * K, 4 * K).unwrap();
    m.phys.fail_folio.arm(Some(1)); // the child's copy of the pinned page
    assert_eq!(cpu.fork(p), Err(Errno::ENOMEM));
    valid(&m);
    assert_eq!(cpu.find_mismatch(p, a, 64 * K, 1), Ok(None));
    cpu.unpin(p, a + 16 * K, 4 * K).unwrap();
    cpu.exit(p).unwrap();
    cpu.lru_add_drain_all();
    assert_eq!(m.phys.allocated_frames(), 0);
}

/// mremap that cannot allocate a page table at the destination must fail with ENOMEM and
/// leave the old mapping and its data in place (Linux moves back what it moved). The engine
/// skips the entries it cannot move, unmaps the old range and reports success: the data is
/// lost.
#[test]
fn mremap_without_memory_for_a_page_table_keeps_the_data() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    cpu.mmap(p, at(A, 8 * K, RW)).unwrap();
    cpu.write_fill(p, A, 8 * K, 0x16).unwrap();
    // The destination needs a PMD table (preallocated), then a PTE table: fail the second.
    m.phys.fail_pgtable.arm(Some(2));
    let moved = MremapFlags {
        maymove: true,
        fixed: Some(B),
        dontunmap: false,
    };
    let r = cpu.mremap(p, A, 8 * K, 8 * K, moved);
    let now = match r {
        Ok(addr) => addr,
        Err(e) => {
            assert_eq!(e, Errno::ENOMEM);
            A
        }
    };
    assert_eq!(
        cpu.find_mismatch(p, now, 8 * K, 0x16),
        Ok(None),
        "mremap returned {r:?}; the data must be at {now:#x}"
    );
    valid(&m);
}

/// `MADV_POPULATE_WRITE` (and `_READ`) whose fault cannot get memory fails with ENOMEM in
/// Linux (`madvise_populate` passes -ENOMEM through; only SIGBUS/SIGSEGV become EFAULT). The
/// engine maps every failed fault to EFAULT. Found by the fail-point sweep of
/// `scenarios/madvise.scn`.
#[test]
fn madvise_populate_without_memory_fails_with_enomem() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    cpu.mmap(p, at(A, 16 * K, RW)).unwrap();
    m.phys.fail_folio.arm(Some(1));
    assert_eq!(
        cpu.madvise(p, A, 16 * K, Advice::PopulateWrite),
        Err(Errno::ENOMEM)
    );
    // A read populate that cannot get a page table.
    cpu.mmap(p, at(B, 16 * K, RW)).unwrap();
    m.phys.fail_pgtable.arm(Some(1));
    assert_eq!(
        cpu.madvise(p, B, 16 * K, Advice::PopulateRead),
        Err(Errno::ENOMEM)
    );
    valid(&m);
}
