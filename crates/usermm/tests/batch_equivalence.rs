//! Seed 000: batched fork and zap give exactly what the per-PTE algorithms give — the same
//! page tables bit for bit, the same folio counts and data — over random layouts that mix
//! folio sizes, dirty/clean and writable/read-only entries, folios cut by VMA and page-table
//! edges, and pinned pages. Counters that must match (RSS, mapcounts via validate) match;
//! refcount atomics per fork equal the number of batches.

mod common;
use common::*;
use proptest::prelude::*;
use usermm::tunables::PteBatching;
use usermm::{
    Advice, Arch, Ev, Machine, MachineConfig, MmapArgs, MremapFlags, Placement, Privilege,
    ThpPolicy,
};

#[derive(Clone, Debug)]
enum Op {
    Write { off: u64, len: u64, byte: u8 },
    Protect { off: u64, len: u64, write: bool },
    DontNeed { off: u64, len: u64 },
    Pin { off: u64 },
    Move { off: u64, len: u64 },
}

const BASE: u64 = 0x4000_0000;
const SPAN: u64 = 4 * M;

fn op() -> impl Strategy<Value = Op> {
    let page = 0..(SPAN / 4096);
    prop_oneof![
        4 => (page.clone(), 1..256u64, any::<u8>()).prop_map(|(o, l, b)| Op::Write { off: o * 4096, len: l * 4096, byte: b }),
        2 => (page.clone(), 1..64u64, any::<bool>()).prop_map(|(o, l, w)| Op::Protect { off: o * 4096, len: l * 4096, write: w }),
        1 => (page.clone(), 1..32u64).prop_map(|(o, l)| Op::DontNeed { off: o * 4096, len: l * 4096 }),
        1 => page.clone().prop_map(|o| Op::Pin { off: o * 4096 }),
        1 => (page, 1..16u64).prop_map(|(o, l)| Op::Move { off: o * 4096, len: l * 4096 }),
    ]
}

fn build(arch: Arch, folio: u64, batching: PteBatching) -> Machine {
    let mut cfg = MachineConfig {
        memory: 128 * M,
        arch,
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = true;
    cfg.tunables.fork_pte_batch = batching;
    cfg.tunables.zap_pte_batch = batching;
    let m = Machine::new(cfg);
    m.update_tunables(|t| {
        t.thp.top = ThpPolicy::Never;
        if folio > 4096 {
            t.thp
                .set_size(folio, ThpPolicy::Always)
                .expect("valid size");
        }
    });
    m
}

/// Runs the layout, forks, writes in the child, unmaps half, exits; returns the observations.
fn run(arch: Arch, folio: u64, batching: PteBatching, ops: &[Op]) -> (Vec<String>, u64, u64) {
    let m = build(arch, folio, batching);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 64 * M).expect("spawn");
    let args = MmapArgs {
        placement: Placement::Fixed(BASE),
        ..MmapArgs::anon(SPAN, RW)
    };
    cpu.mmap(p, args).expect("mmap");
    cpu.write_fill(p, BASE, SPAN, 0x11).expect("populate");
    let mut moved = 0x8000_0000u64;
    for o in ops {
        match *o {
            Op::Write { off, len, byte } => {
                let _ = cpu.write_fill(p, BASE + off, len.min(SPAN - off), byte);
            }
            Op::Protect { off, len, write } => {
                let _ = cpu.mprotect(
                    p,
                    BASE + off,
                    len.min(SPAN - off),
                    if write { RW } else { RO },
                );
            }
            Op::DontNeed { off, len } => {
                let _ = cpu.madvise(p, BASE + off, len.min(SPAN - off), Advice::DontNeed);
            }
            Op::Pin { off } => {
                let _ = cpu.pin(p, BASE + off, 4096);
            }
            Op::Move { off, len } => {
                let f = MremapFlags {
                    maymove: true,
                    fixed: Some(moved + 4096),
                    dontunmap: false,
                };
                let _ = cpu.mremap(p, BASE + off, len.min(SPAN - off), len.min(SPAN - off), f);
                moved += 2 * M;
            }
        }
    }
    valid(&m);
    let before = m.counters();
    let c = cpu.fork(p).expect("fork");
    let d = m.counters().delta(&before);
    let pinned = ops.iter().any(|o| matches!(o, Op::Pin { .. }));
    if !pinned {
        assert_eq!(
            d.get(Ev::RefcountAtomic),
            d.get(Ev::ForkBatches),
            "one refcount atomic per batch"
        );
    }
    valid(&m);
    let mut obs = Vec::new();
    // arm64: per-PTE fork unfolds the parent's contiguous blocks, batched fork keeps them;
    // everything but the CONT bit must agree ("modulo contpte folding").
    let dump = |pid| -> Vec<(u64, u64, bool)> {
        let cont = if arch == Arch::Arm64 { 1u64 << 52 } else { 0 };
        cpu.page_table_dump(pid)
            .expect("dump")
            .iter()
            .map(|l| (l.addr, l.entry.val() & !cont, l.entry.is_pmd()))
            .collect()
    };
    for pid in [p, c] {
        obs.push(format!("{:?}", dump(pid)));
        obs.push(format!("{:?}", cpu.status(pid).expect("status")));
        obs.push(format!("{:?}", cpu.smaps(pid, 0, u64::MAX).expect("smaps")));
    }
    let _ = cpu.write_fill(c, BASE, SPAN / 2, 0x22);
    let _ = cpu.munmap(p, BASE + SPAN / 4, SPAN / 2);
    valid(&m);
    for pid in [p, c] {
        obs.push(format!("{:?}", dump(pid)));
        let mut buf = vec![0u8; SPAN as usize];
        let _ = cpu.read_bytes(pid, BASE, &mut buf[..(SPAN / 4) as usize]);
        obs.push(format!(
            "{:x}",
            buf.iter()
                .fold(0u64, |h, &b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
        ));
    }
    let batches = d.get(Ev::ForkBatches);
    let ptes = d.get(Ev::ForkPtes);
    cpu.exit(c).expect("exit");
    cpu.exit(p).expect("exit");
    valid(&m);
    assert_eq!(m.phys.allocated_frames(), 0);
    (obs, batches, ptes)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn batched_fork_and_zap_equal_per_pte(
        folio in prop::sample::select(vec![4096u64, 16 * K, 64 * K, 256 * K, M]),
        arm in any::<bool>(),
        ops in prop::collection::vec(op(), 0..12),
    ) {
        let arch = if arm { Arch::Arm64 } else { Arch::X86_64 };
        let (a, batches, ptes) = run(arch, folio, PteBatching::Batched, &ops);
        let (b, base_batches, base_ptes) = run(arch, folio, PteBatching::PerPte, &ops);
        prop_assert_eq!(a, b);
        prop_assert_eq!(ptes, base_ptes);
        prop_assert_eq!(base_batches, base_ptes, "per-PTE: every PTE is its own batch");
        if folio > 4096 && ops.is_empty() {
            prop_assert_eq!(batches * (folio / 4096), ptes, "untouched layout: one batch per folio");
        }
    }
}

/// Of fork's and zap's batches, those of a large folio's run (`folio_pte_batch`) are counted
/// apart: the cost model prices them apart from a small folio's.
#[test]
fn large_folio_batches_are_counted_apart() {
    for (folio, batching, large) in [
        (64 * K, PteBatching::Batched, 16),
        (64 * K, PteBatching::PerPte, 0),
        (4096, PteBatching::Batched, 0),
    ] {
        let m = build(Arch::X86_64, folio, batching);
        let cpu = m.enter_cpu(0).expect("cpu");
        let p = cpu.spawn(Privilege::Ordinary, 64 * M).expect("spawn");
        let args = MmapArgs {
            placement: Placement::Fixed(BASE),
            ..MmapArgs::anon(M, RW)
        };
        cpu.mmap(p, args).expect("mmap");
        cpu.write_fill(p, BASE, M, 0x5a).expect("fill");
        let before = m.counters();
        let c = cpu.fork(p).expect("fork");
        let d = m.counters().delta(&before);
        let label = format!("{folio} {batching:?}");
        assert_eq!(d.get(Ev::ForkBatchesLarge), large, "fork {label}");
        let batches = if large > 0 { large } else { 256 };
        assert_eq!(d.get(Ev::ForkBatches), batches, "fork {label}");
        let before = m.counters();
        cpu.munmap(p, BASE, M).expect("munmap");
        let d = m.counters().delta(&before);
        assert_eq!(d.get(Ev::ZapBatchesLarge), large, "zap {label}");
        assert_eq!(d.get(Ev::ZapBatches), batches, "zap {label}");
        valid(&m);
        cpu.exit(c).expect("exit");
        cpu.exit(p).expect("exit");
    }
}

/// mprotect changes a large folio's entries as one batch (6.17's `mprotect_folio_pte_batch`,
/// not a seed switch): one `mprotect_batches` per 64 KiB folio, one per entry for small
/// folios; and every entry of a batch comes back with the accessed bit any of them had.
#[test]
fn mprotect_batches_a_large_folios_entries() {
    const A: u64 = 0x20; // x86-64 _PAGE_ACCESSED
    for (folio, batches) in [(64 * K, 1), (4096, 16)] {
        let m = build(Arch::X86_64, folio, PteBatching::Batched);
        let cpu = m.enter_cpu(0).expect("cpu");
        let p = cpu.spawn(Privilege::Ordinary, 64 * M).expect("spawn");
        let args = MmapArgs {
            placement: Placement::Fixed(BASE),
            ..MmapArgs::anon(64 * K, RW)
        };
        cpu.mmap(p, args).expect("mmap");
        cpu.write_fill(p, BASE, 64 * K, 0x5a).expect("fill");
        // All old, then page 3 read: only its entry is young again.
        cpu.madvise(p, BASE, 64 * K, Advice::Cold).expect("cold");
        let mut b = [0u8; 1];
        cpu.read_bytes(p, BASE + 3 * 4096, &mut b).expect("read");
        let young = |cpu: &usermm::Cpu<'_>| -> Vec<bool> {
            let text = usermm::dump::dump_range(cpu, p, BASE, 64 * K).expect("dump");
            text.lines()
                .filter(|l| l.starts_with("pte "))
                .map(|l| {
                    let v = l
                        .split(" = ")
                        .nth(1)
                        .and_then(|r| r.split(' ').next())
                        .expect("entry");
                    u64::from_str_radix(v.trim_start_matches("0x"), 16).expect("hex") & A != 0
                })
                .collect()
        };
        let before = young(&cpu);
        assert_eq!(
            before.iter().filter(|&&y| y).count(),
            1,
            "{folio}: {before:?}"
        );
        let c0 = m.counters();
        cpu.mprotect(p, BASE, 64 * K, RO).expect("mprotect");
        let d = m.counters().delta(&c0);
        assert_eq!(d.get(Ev::MprotectBatch), batches, "{folio}");
        let after = young(&cpu);
        let expect_young = if folio > 4096 { 16 } else { 1 };
        assert_eq!(
            after.iter().filter(|&&y| y).count(),
            expect_young,
            "{folio}: {after:?}"
        );
        valid(&m);
        cpu.exit(p).expect("exit");
    }
}
