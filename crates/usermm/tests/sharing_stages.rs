//! Seed 003's stages as engine configurations: every `sharing` tracker (v6.7 estimate,
//! total mapcount, rmap-ID writer modes with atomic or seqcount-protected per-page counts,
//! the exact tracker, owner) and both PMD-remap rmap modes give the same memory contents and
//! pass `validate()` after every step; COW reuse happens exactly for the trackers that can
//! prove exclusivity; the per-stage counter differences are the ones the seed describes.

mod common;
use common::*;
use usermm::sharing::SharingTracker;
use usermm::tunables::PteBatching;
use usermm::{Cpu, Ev, Machine, MachineConfig, MmapArgs, Pid, Placement, Privilege, ThpPolicy};

const BASE: u64 = 0x4000_0000;
const THPS: u64 = 4;
const SPAN: u64 = THPS * 2 * M;
const PAGES: u64 = SPAN / 4096;

fn build(tracker: SharingTracker, remap: PteBatching) -> Machine {
    let mut cfg = MachineConfig {
        memory: 64 * M,
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = true;
    cfg.tunables.sharing = tracker;
    cfg.tunables.sharing_shadow = false;
    cfg.tunables.remap_rmap_batch = remap;
    let m = Machine::new(cfg);
    m.update_tunables(|t| {
        t.thp.top = ThpPolicy::Always;
    });
    m
}

/// Maps and populates `SPAN` of PMD THPs, then PTE-remaps each (mprotect of one subpage).
fn populate_remapped(cpu: &Cpu<'_>, m: &Machine, p: Pid) {
    let args = MmapArgs {
        placement: Placement::Fixed(BASE),
        ..MmapArgs::anon(SPAN, RW)
    };
    cpu.mmap(p, args).expect("mmap");
    cpu.write_fill(p, BASE, SPAN, 0x11).expect("populate");
    valid(m);
    for blk in (BASE..BASE + SPAN).step_by(2 * M as usize) {
        cpu.mprotect(p, blk, 4096, RO).expect("remap");
        valid(m);
        cpu.mprotect(p, blk, 4096, RW).expect("remap back");
        valid(m);
    }
}

fn byte_at(cpu: &Cpu<'_>, p: Pid, a: u64) -> u8 {
    let mut b = [0u8];
    cpu.read_bytes(p, a, &mut b).expect("read");
    b[0]
}

/// Whether COW of a PTE-mapped large folio can be reused under `t` (the seed's point).
fn reuses(t: SharingTracker) -> bool {
    matches!(
        t,
        SharingTracker::RmapId(_) | SharingTracker::RmapIdSq | SharingTracker::Owner
    )
}

#[test]
fn every_stage_keeps_contents_and_reuses_only_when_it_can_prove_exclusivity() {
    for t in SharingTracker::all() {
        for remap in [PteBatching::PerPte, PteBatching::Batched] {
            let m = build(t, remap);
            let cpu = m.enter_cpu(0).expect("cpu");
            let p = cpu.spawn(Privilege::Ordinary, 64 * M).expect("spawn");
            populate_remapped(&cpu, &m, p);
            // cow: the child is alive; every parent write copies.
            let c = cpu.fork(p).expect("fork");
            valid(&m);
            let before = m.counters();
            cpu.touch(p, BASE, SPAN / 2, usermm::Access::Write)
                .expect("cow");
            let d = m.counters().delta(&before);
            assert_eq!(d.get(Ev::CowReuse), 0, "{}: reuse while shared", t.name());
            assert_eq!(d.get(Ev::CowCopy), PAGES / 2, "{}", t.name());
            valid(&m);
            cpu.write_fill(c, BASE + SPAN / 2, 4096, 0x33)
                .expect("child write");
            assert_eq!(byte_at(&cpu, p, BASE + SPAN / 2), 0x11);
            // cow-reuse: after the child exits, the untouched half is this mm's alone.
            cpu.exit(c).expect("exit");
            valid(&m);
            let before = m.counters();
            cpu.write_fill(p, BASE + SPAN / 2, SPAN / 2, 0x44)
                .expect("cow-reuse");
            let d = m.counters().delta(&before);
            let want = if reuses(t) { PAGES / 2 } else { 0 };
            assert_eq!(d.get(Ev::CowReuse), want, "{} {remap:?}", t.name());
            assert_eq!(d.get(Ev::CowCopy), PAGES / 2 - want, "{}", t.name());
            valid(&m);
            assert_eq!(byte_at(&cpu, p, BASE), 0x11);
            assert_eq!(byte_at(&cpu, p, BASE + SPAN - 1), 0x44);
            cpu.munmap(p, BASE + 4096, SPAN / 4).expect("munmap");
            valid(&m);
            cpu.exit(p).expect("exit");
            valid(&m);
            assert_eq!(m.phys.allocated_frames(), 0, "{}: frames left", t.name());
        }
    }
}

/// Mapcount atomics of PTE-remapping `THPS` PMD THPs under `t` and `remap`.
fn remap_mapcount_atomics(t: SharingTracker, remap: PteBatching) -> u64 {
    remap_atomics(t, remap).0
}

/// Mapcount and folio atomics of PTE-remapping `THPS` PMD THPs under `t` and `remap`.
fn remap_atomics(t: SharingTracker, remap: PteBatching) -> (u64, u64) {
    let m = build(t, remap);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 64 * M).expect("spawn");
    let args = MmapArgs {
        placement: Placement::Fixed(BASE),
        ..MmapArgs::anon(SPAN, RW)
    };
    cpu.mmap(p, args).expect("mmap");
    cpu.write_fill(p, BASE, SPAN, 0x11).expect("populate");
    let before = m.counters();
    for blk in (BASE..BASE + SPAN).step_by(2 * M as usize) {
        cpu.mprotect(p, blk, 4096, RO).expect("remap");
    }
    let d = m.counters().delta(&before);
    valid(&m);
    assert_eq!(d.get(Ev::ThpSplitPmd), THPS);
    (d.get(Ev::MapcountAtomic), d.get(Ev::FolioAtomic))
}

#[test]
fn remap_batching_saves_one_total_mapcount_update_per_page_but_the_first() {
    let parse = |s| SharingTracker::parse(s).expect("tracker");
    // v6.7 keeps no total: per page one mapcount atomic either way, plus the PMD's entire
    // mapcount.
    let est = parse("estimate");
    assert_eq!(remap_mapcount_atomics(est, PteBatching::PerPte), THPS * 513);
    assert_eq!(
        remap_mapcount_atomics(est, PteBatching::Batched),
        THPS * 513
    );
    // With a total mapcount, the per-page path updates it 512 times, the batch once.
    let t = parse("mapcount");
    assert_eq!(
        remap_mapcount_atomics(t, PteBatching::PerPte),
        THPS * (512 + 512 + 2)
    );
    assert_eq!(
        remap_mapcount_atomics(t, PteBatching::Batched),
        THPS * (512 + 1 + 2)
    );
    // With owner tracking (`CONFIG_MM_ID`) the total is a plain read and set under the folio's
    // bit lock: the per-page path takes that lock 512 times, the batch once; the mapcount
    // atomics are the per-page ones either way.
    let owner = parse("owner");
    let (per_pte, per_pte_folio) = remap_atomics(owner, PteBatching::PerPte);
    let (batched, batched_folio) = remap_atomics(owner, PteBatching::Batched);
    assert_eq!(per_pte, THPS * (512 + 1));
    assert_eq!(batched, THPS * (512 + 1));
    assert_eq!(per_pte_folio - batched_folio, THPS * 511);
}

/// Folio atomics of forking `THPS` PTE-remapped THPs under `t` (single writer).
fn fork_atomics(t: &str) -> (u64, u64) {
    let m = build(
        SharingTracker::parse(t).expect("tracker"),
        PteBatching::Batched,
    );
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 64 * M).expect("spawn");
    populate_remapped(&cpu, &m, p);
    let before = m.counters();
    cpu.fork(p).expect("fork");
    let d = m.counters().delta(&before);
    valid(&m);
    (d.get(Ev::MapcountAtomic), d.get(Ev::FolioAtomic))
}

#[test]
fn stage_all_updates_per_page_mapcounts_with_plain_stores_when_exclusive() {
    let (atomic_pages, _) = fork_atomics("rmap-id+seed-sizing+atomic-pages");
    let (all, _) = fork_atomics("rmap-id+seed-sizing+all");
    // One fork batch per folio (a PTE table holds one 2 MiB folio): 512 per-page atomics each,
    // gone when the exclusive writer holds the seqcount.
    assert_eq!(atomic_pages - all, THPS * 512);
    // The exclusive-writer modes enter with one atomic and update the values without any; the
    // shared writer pays one atomic per value and the total.
    let (_, shared) = fork_atomics("rmap-id+shared+seed-sizing+atomic-pages");
    let (_, excl) = fork_atomics("rmap-id+add-return+seed-sizing+atomic-pages");
    assert!(shared > excl, "shared {shared} exclusive {excl}");
}

#[test]
fn switching_trackers_mid_life_never_reuses_an_untracked_folio() {
    let m = build(SharingTracker::Estimate, PteBatching::Batched);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 64 * M).expect("spawn");
    populate_remapped(&cpu, &m, p); // folios without total mapcount or owner slots
    m.update_tunables(|t| t.sharing = SharingTracker::Owner);
    valid(&m);
    let c = cpu.fork(p).expect("fork");
    cpu.exit(c).expect("exit");
    valid(&m);
    let before = m.counters();
    cpu.touch(p, BASE, SPAN, usermm::Access::Write)
        .expect("write");
    let d = m.counters().delta(&before);
    assert_eq!(d.get(Ev::CowReuse), 0, "old folios carry no owner slots");
    assert_eq!(d.get(Ev::CowCopy), PAGES);
    valid(&m);
    // Folios allocated after the switch are owner-tracked and reused.
    let q = cpu.spawn(Privilege::Ordinary, 64 * M).expect("spawn");
    populate_remapped(&cpu, &m, q);
    let c = cpu.fork(q).expect("fork");
    cpu.exit(c).expect("exit");
    let before = m.counters();
    cpu.touch(q, BASE, SPAN, usermm::Access::Write)
        .expect("write");
    assert_eq!(m.counters().delta(&before).get(Ev::CowReuse), PAGES);
    valid(&m);
}

#[test]
fn a_pmd_split_sets_page_anon_exclusive_on_every_page() {
    // `folio_add_anon_rmap_ptes(.., RMAP_EXCLUSIVE)` sets PageAnonExclusive page by page
    // with a locked bit operation, beside each page's mapcount atomic; the other folio
    // atomics are the PMD's entire mapcount (a mapcount atomic too) and the refcount add.
    for remap in [PteBatching::PerPte, PteBatching::Batched] {
        let (map, folio) = remap_atomics(SharingTracker::Estimate, remap);
        assert_eq!(folio - map, THPS * (512 + 1), "{remap:?}");
    }
}
