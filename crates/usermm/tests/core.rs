//! Behaviour of the engine core: faults, COW fork, unmap, exit, errno.

mod common;
use common::*;
use usermm::{
    Access, Advice, Errno, Ev, MmapArgs, MremapFlags, Placement, Privilege, Prot, Sharing, Signal,
    ThpPolicy,
};

fn fixed(len: u64, addr: u64) -> MmapArgs {
    MmapArgs {
        placement: Placement::Fixed(addr),
        ..MmapArgs::anon(len, RW)
    }
}

#[test]
fn anon_write_then_read_back() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let a = cpu.mmap(p, MmapArgs::anon(64 * K, RW)).unwrap();
    assert_eq!(
        cpu.find_mismatch(p, a, 64 * K, 0).unwrap(),
        None,
        "fresh memory reads zero"
    );
    assert_eq!(m.counters().get(Ev::FaultZeroPage), 16);
    cpu.write_fill(p, a + 100, 5000, 0x77).unwrap();
    let mut buf = [0u8; 8];
    cpu.read_bytes(p, a + 96, &mut buf).unwrap();
    assert_eq!(buf, [0, 0, 0, 0, 0x77, 0x77, 0x77, 0x77]);
    assert_eq!(
        m.counters().get(Ev::CowCopy),
        2,
        "two zero-page PTEs replaced"
    );
    valid(&m);
    let s = cpu.smaps(p, a, a + 64 * K).unwrap();
    assert_eq!(s[0].1.rss, 8 * K);
    assert_eq!(s[0].1.private_dirty, 8 * K);
    cpu.exit(p).unwrap();
    valid(&m);
    assert_eq!(
        m.phys.allocated_frames(),
        0,
        "every frame is free after the last exit"
    );
}

#[test]
fn fork_cow_keeps_parent_data() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let a = cpu.mmap(p, MmapArgs::anon(M, RW)).unwrap();
    cpu.write_fill(p, a, M, 0xa5).unwrap();
    let before = m.counters();
    let c = cpu.fork(p).unwrap();
    let d = m.counters().delta(&before);
    assert_eq!(d.get(Ev::ForkPtes), 256);
    assert_eq!(d.get(Ev::TlbFlushMm), 1, "parent TLB flushed once");
    valid(&m);
    assert!(!cpu.pagemap(p, a).unwrap().exclusive);
    cpu.write_fill(c, a + 4 * K, 4 * K, 0x5a).unwrap();
    assert_eq!(cpu.find_mismatch(p, a, M, 0xa5).unwrap(), None);
    assert_eq!(cpu.find_mismatch(c, a + 4 * K, 4 * K, 0x5a).unwrap(), None);
    assert!(cpu.pagemap(c, a + 4 * K).unwrap().exclusive);
    let s = cpu.smaps(c, a, a + M).unwrap()[0].1;
    assert_eq!(s.private_dirty, 4 * K);
    assert_eq!(s.shared_dirty, M - 4 * K);
    valid(&m);
    // Parent writes after the child exited: its pages are exclusive again and get reused.
    cpu.exit(c).unwrap();
    let before = m.counters();
    cpu.write_fill(p, a, M, 0x11).unwrap();
    let d = m.counters().delta(&before);
    assert_eq!(d.get(Ev::CowReuse), 256);
    assert_eq!(d.get(Ev::CowCopy), 0);
    valid(&m);
}

#[test]
fn stale_tlb_write_is_caught() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let a = cpu.mmap(p, MmapArgs::anon(8 * K, RW)).unwrap();
    cpu.write_fill(p, a, 8 * K, 1).unwrap();
    m.update_tunables(|t| t.test_skip_tlb_flush = true);
    cpu.munmap(p, a, 4 * K).unwrap();
    let errs = m.validate().unwrap_err();
    assert!(
        errs.iter().any(|e| e.contains("stale TLB entry")),
        "{errs:?}"
    );
    // The write goes through the stale translation (as on hardware) and is counted.
    let _ = cpu.write_fill(p, a, 1, 9);
    assert_eq!(m.counters().get(Ev::TlbStaleHit), 1);
}

#[test]
fn munmap_frees_tables_and_frames() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let a = cpu.mmap(p, MmapArgs::anon(4 * M, RW)).unwrap();
    cpu.write_fill(p, a, 4 * M, 3).unwrap();
    valid(&m);
    let before = m.phys.allocated_frames();
    cpu.munmap(p, a, 4 * M).unwrap();
    valid(&m);
    assert_eq!(
        m.phys.allocated_frames(),
        1,
        "only the pgd is left (freed {})",
        before - 1
    );
    assert_eq!(cpu.touch(p, a, 1, Access::Read), Err(Signal::Segv(a)));
}

#[test]
fn munmap_middle_splits_and_errnos() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let base = 0x10_0000_0000;
    cpu.mmap(p, fixed(64 * K, base)).unwrap();
    cpu.write_fill(p, base, 64 * K, 7).unwrap();
    cpu.munmap(p, base + 16 * K, 16 * K).unwrap();
    assert_eq!(cpu.maps(p).unwrap().len(), 2);
    assert_eq!(cpu.munmap(p, base + 1, 4 * K), Err(Errno::EINVAL));
    assert_eq!(cpu.munmap(p, base, 0), Err(Errno::EINVAL));
    assert_eq!(cpu.munmap(p, !4095, 8 * K), Err(Errno::EINVAL));
    // A hole in the middle at the map-count limit is refused and changes nothing.
    m.update_tunables(|t| t.max_map_count = 2);
    assert_eq!(cpu.munmap(p, base + 40 * K, 4 * K), Err(Errno::ENOMEM));
    assert_eq!(cpu.maps(p).unwrap().len(), 2);
    assert_eq!(
        cpu.find_mismatch(p, base + 32 * K, 32 * K, 7).unwrap(),
        None
    );
    valid(&m);
}

#[test]
fn mmap_errnos() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let r = cpu.spawn(Privilege::Privileged, 8 * M).unwrap();
    assert_eq!(cpu.mmap(p, MmapArgs::anon(0, RW)), Err(Errno::EINVAL));
    assert_eq!(
        cpu.mmap(p, MmapArgs::anon(u64::MAX - 10, RW)),
        Err(Errno::ENOMEM)
    );
    assert_eq!(cpu.mmap(p, fixed(4 * K, 0)), Err(Errno::EPERM));
    assert_eq!(cpu.mmap(r, fixed(4 * K, 0)), Ok(0));
    assert_eq!(cpu.mmap(p, fixed(4 * K, 0x1000_0001)), Err(Errno::EINVAL));
    let a = cpu.mmap(p, fixed(8 * K, 0x1000_0000)).unwrap();
    let nr = MmapArgs {
        placement: Placement::FixedNoReplace(a + 4 * K),
        ..MmapArgs::anon(8 * K, RW)
    };
    assert_eq!(cpu.mmap(p, nr), Err(Errno::EEXIST));
    // A hint that is free is used exactly.
    let h = MmapArgs {
        placement: Placement::Hint(0x2000_0000),
        ..MmapArgs::anon(8 * K, RW)
    };
    assert_eq!(cpu.mmap(p, h), Ok(0x2000_0000));
    // More than RAM cannot be committed with heuristic overcommit, unless norserve.
    assert_eq!(cpu.mmap(p, MmapArgs::anon(128 * M, RW)), Err(Errno::ENOMEM));
    assert!(cpu
        .mmap(
            p,
            MmapArgs {
                noreserve: true,
                stack: false,
                ..MmapArgs::anon(128 * M, RW)
            }
        )
        .is_ok());
    assert_eq!(
        cpu.mmap(
            p,
            MmapArgs {
                locked: true,
                ..MmapArgs::anon(16 * M, RO)
            }
        ),
        Err(Errno::EAGAIN)
    );
    valid(&m);
}

#[test]
fn adjacent_mappings_merge_and_mprotect_splits() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let b = 0x4000_0000;
    let vma_events = |before: &usermm::Snapshot| {
        let d = m.counters().delta(before);
        (d.get(Ev::VmaSplit), d.get(Ev::VmaMerge))
    };
    let before = m.counters();
    cpu.mmap(p, fixed(16 * K, b)).unwrap();
    cpu.mmap(p, fixed(16 * K, b + 16 * K)).unwrap();
    assert_eq!(
        cpu.maps(p).unwrap().len(),
        1,
        "same flags and contiguous pgoff merge"
    );
    assert_eq!(vma_events(&before), (0, 1), "one merge of a new range");
    let before = m.counters();
    cpu.mprotect(p, b + 8 * K, 8 * K, RO).unwrap();
    let maps = cpu.maps(p).unwrap();
    assert_eq!(
        maps.iter().map(|e| e.perms.as_str()).collect::<Vec<_>>(),
        ["rw-p", "r--p", "rw-p"]
    );
    assert_eq!(vma_events(&before), (2, 0), "a middle range splits twice");
    let before = m.counters();
    cpu.mprotect(p, b + 8 * K, 8 * K, RW).unwrap();
    assert_eq!(
        cpu.maps(p).unwrap().len(),
        1,
        "mprotect back merges all three"
    );
    assert_eq!(
        vma_events(&before),
        (0, 1),
        "one merge with both neighbours"
    );
    // mprotect over a hole: applied up to the hole, then ENOMEM.
    cpu.mmap(p, fixed(16 * K, b + 64 * K)).unwrap();
    assert_eq!(cpu.mprotect(p, b, 80 * K, RO), Err(Errno::ENOMEM));
    let maps = cpu.maps(p).unwrap();
    assert_eq!(maps[0].perms, "r--p");
    assert_eq!(maps[1].perms, "rw-p");
    assert_eq!(cpu.mprotect(p, b + 1, 4 * K, RO), Err(Errno::EINVAL));
    cpu.write_fill(p, b + 64 * K, 4 * K, 1).unwrap();
    assert_eq!(cpu.write_fill(p, b, 1, 1), Err(Signal::Segv(b)));
    let before = m.counters();
    cpu.munmap(p, b + 68 * K, 4 * K).unwrap();
    assert_eq!(
        vma_events(&before),
        (2, 0),
        "munmap of an inner page splits at both ends"
    );
    valid(&m);
}

#[test]
fn madvise_dontneed_and_flags() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let b = 0x4000_0000;
    cpu.mmap(p, fixed(64 * K, b)).unwrap();
    cpu.write_fill(p, b, 64 * K, 9).unwrap();
    cpu.madvise(p, b, 16 * K, Advice::DontNeed).unwrap();
    assert_eq!(cpu.find_mismatch(p, b, 16 * K, 0).unwrap(), None);
    assert_eq!(cpu.find_mismatch(p, b + 16 * K, 48 * K, 9).unwrap(), None);
    cpu.madvise(p, b + 32 * K, 16 * K, Advice::DontFork)
        .unwrap();
    assert_eq!(cpu.maps(p).unwrap().len(), 3);
    let c = cpu.fork(p).unwrap();
    assert_eq!(cpu.maps(c).unwrap().len(), 2);
    assert_eq!(
        cpu.touch(c, b + 32 * K, 1, Access::Read),
        Err(Signal::Segv(b + 32 * K))
    );
    cpu.madvise(p, b + 32 * K, 16 * K, Advice::DoFork).unwrap();
    assert_eq!(cpu.maps(p).unwrap().len(), 1);
    // A hole: the advice applies to the mapped parts, then ENOMEM.
    cpu.mmap(p, fixed(16 * K, b + 128 * K)).unwrap();
    assert_eq!(
        cpu.madvise(p, b, 144 * K, Advice::WipeOnFork),
        Err(Errno::ENOMEM)
    );
    assert!(cpu
        .maps(p)
        .unwrap()
        .iter()
        .all(|e| e.flags & 0x2000000 != 0));
    let s = cpu
        .mmap(
            p,
            MmapArgs {
                sharing: Sharing::Shared,
                ..MmapArgs::anon(16 * K, RW)
            },
        )
        .unwrap();
    assert_eq!(
        cpu.madvise(p, s, 16 * K, Advice::WipeOnFork),
        Err(Errno::EINVAL)
    );
    valid(&m);
}

#[test]
fn wipeonfork_child_sees_zero() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let a = cpu.mmap(p, MmapArgs::anon(64 * K, RW)).unwrap();
    cpu.write_fill(p, a, 64 * K, 4).unwrap();
    cpu.madvise(p, a, 64 * K, Advice::WipeOnFork).unwrap();
    let c = cpu.fork(p).unwrap();
    assert_eq!(cpu.find_mismatch(c, a, 64 * K, 0).unwrap(), None);
    let g = cpu.fork(c).unwrap();
    assert_eq!(cpu.find_mismatch(g, a, 64 * K, 0).unwrap(), None);
    assert_eq!(cpu.find_mismatch(p, a, 64 * K, 4).unwrap(), None);
    valid(&m);
}

#[test]
fn shared_anon_is_shared_across_fork() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let s = cpu
        .mmap(
            p,
            MmapArgs {
                sharing: Sharing::Shared,
                ..MmapArgs::anon(64 * K, RW)
            },
        )
        .unwrap();
    cpu.write_fill(p, s, 64 * K, 1).unwrap();
    let c = cpu.fork(p).unwrap();
    cpu.write_fill(c, s, 4 * K, 2).unwrap();
    assert_eq!(cpu.find_mismatch(p, s, 4 * K, 2).unwrap(), None);
    valid(&m);
    cpu.exit(p).unwrap();
    cpu.exit(c).unwrap();
    valid(&m);
    assert_eq!(m.phys.allocated_frames(), 0);
}

#[test]
fn mremap_grow_move_shrink() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let b = 0x4000_0000;
    cpu.mmap(p, fixed(16 * K, b)).unwrap();
    cpu.write_fill(p, b, 16 * K, 5).unwrap();
    assert_eq!(
        cpu.mremap(p, b, 16 * K, 32 * K, MremapFlags::default()),
        Ok(b),
        "grows in place"
    );
    cpu.mmap(p, fixed(4 * K, b + 32 * K)).unwrap();
    assert_eq!(
        cpu.mremap(p, b, 32 * K, 64 * K, MremapFlags::default()),
        Err(Errno::ENOMEM)
    );
    let n = cpu
        .mremap(
            p,
            b,
            32 * K,
            64 * K,
            MremapFlags {
                maymove: true,
                fixed: None,
                dontunmap: false,
            },
        )
        .unwrap();
    assert_ne!(n, b);
    assert_eq!(cpu.find_mismatch(p, n, 16 * K, 5).unwrap(), None);
    assert_eq!(cpu.find_mismatch(p, n + 16 * K, 48 * K, 0).unwrap(), None);
    assert_eq!(cpu.touch(p, b, 1, Access::Read), Err(Signal::Segv(b)));
    assert_eq!(
        cpu.mremap(p, n, 64 * K, 8 * K, MremapFlags::default()),
        Ok(n)
    );
    assert_eq!(
        cpu.mremap(p, b, 4 * K, 8 * K, MremapFlags::default()),
        Err(Errno::EFAULT)
    );
    assert_eq!(
        cpu.mremap(p, n, 8 * K, 0, MremapFlags::default()),
        Err(Errno::EINVAL)
    );
    let f = MremapFlags {
        maymove: true,
        fixed: Some(0x5000_0000),
        dontunmap: false,
    };
    assert_eq!(cpu.mremap(p, n, 8 * K, 8 * K, f), Ok(0x5000_0000));
    assert_eq!(cpu.find_mismatch(p, 0x5000_0000, 8 * K, 5).unwrap(), None);
    valid(&m);
}

#[test]
fn brk_grows_and_shrinks() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let b0 = cpu.brk(p, 0).unwrap();
    assert_eq!(cpu.brk(p, b0 + 64 * K).unwrap(), b0 + 64 * K);
    cpu.write_fill(p, b0, 64 * K, 3).unwrap();
    assert_eq!(cpu.brk(p, b0 + 128 * K).unwrap(), b0 + 128 * K);
    assert_eq!(cpu.maps(p).unwrap().len(), 1);
    assert_eq!(cpu.brk(p, b0 + 16 * K).unwrap(), b0 + 16 * K);
    assert_eq!(
        cpu.touch(p, b0 + 16 * K, 1, Access::Read),
        Err(Signal::Segv(b0 + 16 * K))
    );
    valid(&m);
}

#[test]
fn mthp_and_pmd_thp_faults() {
    let m = machine(64 * M);
    m.update_tunables(|t| {
        t.thp.set_size(64 * K, ThpPolicy::Always).unwrap();
        t.thp.top = ThpPolicy::Always;
    });
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let a = cpu.mmap(p, MmapArgs::anon(4 * M, RW)).unwrap();
    assert_eq!(
        a % (2 * M),
        0,
        "2M-multiple anonymous mappings are PMD aligned"
    );
    let before = m.counters();
    cpu.write_fill(p, a, 1, 1).unwrap();
    assert_eq!(cpu.folio_order(p, a).unwrap(), Some(9));
    let s = cpu.smaps(p, a, a + 4 * M).unwrap()[0].1;
    assert_eq!(s.anon_huge_pages, 2 * M);
    // A PMD THP comes from the per-CPU lists in Linux (pcp order 9): no direct buddy work
    // (its page-table page is order 0).
    assert_eq!(m.counters().delta(&before).get(Ev::FolioBuddyDirect), 0);
    let b = cpu.mmap(p, MmapArgs::anon(192 * K, RW)).unwrap();
    let before = m.counters();
    cpu.write_fill(p, b + 64 * K, 1, 1).unwrap();
    assert_eq!(cpu.folio_order(p, b + 64 * K).unwrap(), Some(4));
    // A 64K folio is not a pcp order: allocated under zone->lock.
    assert_eq!(m.counters().delta(&before).get(Ev::FolioBuddyDirect), 1);
    let before = m.counters();
    cpu.munmap(p, b, 192 * K).unwrap();
    assert_eq!(
        m.counters().delta(&before).get(Ev::FolioBuddyDirect),
        1,
        "and freed under it"
    );
    valid(&m);
    // Fork, then the child's write copies one 4K page of the THP.
    let c = cpu.fork(p).unwrap();
    cpu.write_fill(c, a + 8 * K, 1, 2).unwrap();
    assert_eq!(cpu.folio_order(c, a + 8 * K).unwrap(), Some(0));
    assert_eq!(cpu.folio_order(c, a).unwrap(), Some(9));
    assert_eq!(m.counters().get(Ev::ThpSplitPmd), 1);
    valid(&m);
    // Partial munmap of a THP splits the PMD and keeps the rest.
    cpu.munmap(p, a + 4 * K, 4 * K).unwrap();
    assert_eq!(
        cpu.find_mismatch(p, a + 8 * K, 2 * M - 8 * K, 0).unwrap(),
        None
    );
    valid(&m);
    cpu.exit(c).unwrap();
    cpu.exit(p).unwrap();
    valid(&m);
    assert_eq!(m.phys.allocated_frames(), 0);
}

#[test]
fn pinned_page_is_copied_at_fork() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let a = cpu.mmap(p, MmapArgs::anon(16 * K, RW)).unwrap();
    cpu.write_fill(p, a, 16 * K, 6).unwrap();
    cpu.pin(p, a, 4 * K).unwrap();
    let c = cpu.fork(p).unwrap();
    assert_eq!(m.counters().get(Ev::ForkPinnedCopies), 1);
    assert!(
        cpu.pagemap(p, a).unwrap().exclusive,
        "the pinned page stays exclusive in the parent"
    );
    assert!(!cpu.pagemap(p, a + 4 * K).unwrap().exclusive);
    cpu.write_fill(p, a, 4 * K, 8).unwrap();
    assert_eq!(cpu.find_mismatch(c, a, 4 * K, 6).unwrap(), None);
    valid(&m);
    cpu.unpin(p, a, 4 * K).unwrap();
    assert_eq!(cpu.unpin(p, a, 4 * K), Err(Errno::EINVAL));
    valid(&m);
}

#[test]
fn arm64_tables_behave_the_same() {
    let mut cfg = usermm::MachineConfig {
        memory: 64 * M,
        arch: usermm::Arch::Arm64,
        ..Default::default()
    };
    cfg.tunables.check_tlb = true;
    let m = usermm::Machine::new(cfg);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let a = cpu.mmap(p, MmapArgs::anon(64 * K, RW)).unwrap();
    cpu.write_fill(p, a, 64 * K, 1).unwrap();
    let c = cpu.fork(p).unwrap();
    cpu.write_fill(c, a, 4 * K, 2).unwrap();
    assert_eq!(cpu.find_mismatch(p, a, 64 * K, 1).unwrap(), None);
    cpu.mprotect(p, a, 64 * K, Prot::NONE).unwrap();
    assert_eq!(cpu.touch(p, a, 1, Access::Read), Err(Signal::Segv(a)));
    cpu.mprotect(p, a, 64 * K, RW).unwrap();
    assert_eq!(cpu.find_mismatch(p, a, 64 * K, 1).unwrap(), None);
    valid(&m);
}

#[test]
fn large_folio_is_reused_after_the_child_exits() {
    let m = machine(64 * M);
    m.update_tunables(|t| t.thp.set_size(64 * K, ThpPolicy::Always).unwrap());
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let a = cpu.mmap(p, MmapArgs::anon(256 * K, RW)).unwrap();
    cpu.write_fill(p, a, 256 * K, 1).unwrap();
    let c = cpu.fork(p).unwrap();
    cpu.write_fill(p, a, 1, 2).unwrap();
    assert_eq!(
        cpu.folio_order(p, a).unwrap(),
        Some(0),
        "shared with the child: one page copied"
    );
    valid(&m);
    cpu.exit(c).unwrap();
    let before = m.counters();
    cpu.write_fill(p, a + 64 * K, 64 * K, 3).unwrap();
    let d = m.counters().delta(&before);
    assert_eq!(d.get(Ev::CowCopy), 0, "the folio is ours alone again");
    assert_eq!(d.get(Ev::CowReuse), 16, "each PTE reuses on its own fault");
    assert_eq!(cpu.folio_order(p, a + 64 * K).unwrap(), Some(4));
    assert!(cpu.pagemap(p, a + 64 * K).unwrap().exclusive);
    valid(&m);
}

#[test]
fn every_sharing_tracker_decides_cow_reuse_and_stays_exact() {
    for tracker in [
        "owner",
        "rmap-id",
        "rmap-id-sq",
        "estimate",
        "rmap-id+seed-sizing",
    ] {
        let m = machine(64 * M);
        m.update_tunables(|t| {
            t.thp.set_size(64 * K, ThpPolicy::Always).unwrap();
            t.set("sharing", tracker).unwrap();
            t.sharing_shadow = true;
        });
        let cpu = m.enter_cpu(0).unwrap();
        let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
        let a = cpu.mmap(p, MmapArgs::anon(256 * K, RW)).unwrap();
        cpu.write_fill(p, a, 256 * K, 1).unwrap();
        let c = cpu.fork(p).unwrap();
        let g = cpu.fork(c).unwrap();
        valid(&m);
        assert!(
            cpu.folio_sharing(p, a).unwrap().is_some(),
            "{tracker}: the view answers"
        );
        cpu.exit(g).unwrap();
        cpu.exit(c).unwrap();
        valid(&m);
        let before = m.counters();
        cpu.write_fill(p, a + 64 * K, 64 * K, 3).unwrap();
        let d = m.counters().delta(&before);
        let reuse = if tracker == "estimate" { 0 } else { 16 };
        assert_eq!(d.get(Ev::CowReuse), reuse, "{tracker}");
        assert_eq!(d.get(Ev::CowCopy), 16 - reuse, "{tracker}");
        valid(&m);
    }
}

/// A move whose source and destination are 2 MiB aligned moves whole PTE tables at the PMD
/// level (`move_normal_pmd`), reading no entry and allocating no PTE table, with one TLB
/// flush per table; one that starts inside a 2 MiB with nothing mapped below it on either
/// side, at the same offset on both, is first aligned down to the boundary
/// (`try_realign_addr`); with a VMA below the source, its first, partial table moves PTE by
/// PTE.
#[test]
fn mremap_moves_whole_pte_tables_when_aligned() {
    let m = machine(256 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    // DONTUNMAP leaves the source VMA mapped (empty): the counts are the move's alone.
    let dontunmap = |dst| MremapFlags {
        maymove: true,
        fixed: Some(dst),
        dontunmap: true,
    };
    // Maps `len` bytes at `src`, writes them with `byte`, moves them to `dst`: the move's
    // counters, the contents checked where they went.
    let moved = |src: u64, len: u64, dst: u64, byte: u8| {
        let a = cpu.mmap(p, fixed(len, src)).unwrap();
        cpu.write_fill(p, a, len, byte).unwrap();
        let before = m.counters();
        let b = cpu.mremap(p, a, len, len, dontunmap(dst)).unwrap();
        let d = m.counters().delta(&before);
        assert_eq!(cpu.find_mismatch(p, b, len, byte).unwrap(), None);
        d
    };
    // Aligned: 8 tables move whole.
    let len = 16 * M;
    let d = moved(0x4000_0000, len, 0x8000_0000, 0x5a);
    assert_eq!(d.get(Ev::PteRead), 0);
    // The destination's PMD table only (its 1 GiB had none).
    assert_eq!(d.get(Ev::PgtableAlloc), 1);
    assert_eq!(d.get(Ev::TlbFlushRange), len / (2 * M));
    valid(&m);
    // Realigned: 4 MiB less a page from one page past the boundary, at the same offset on
    // both sides, nothing below either: both tables move whole.
    let len = 4 * M - 4 * K;
    let d = moved(0x4100_1000, len, 0x8100_1000, 0x6b);
    assert_eq!(d.get(Ev::PteRead), 0);
    assert_eq!(d.get(Ev::TlbFlushRange), 2);
    valid(&m);
    // The same with a page mapped below the source in its 2 MiB: the first table's 511
    // entries move one by one into a new table, the second table whole.
    let below = cpu.mmap(p, fixed(4 * K, 0x4200_0000)).unwrap();
    cpu.write_fill(p, below, 4 * K, 1).unwrap();
    let d = moved(0x4200_1000, len, 0x8200_1000, 0x7c);
    assert_eq!(d.get(Ev::PteRead), 511);
    assert_eq!(d.get(Ev::PgtableAlloc), 1);
    assert_eq!(d.get(Ev::TlbFlushRange), 2);
    assert_eq!(cpu.find_mismatch(p, below, 4 * K, 1).unwrap(), None);
    valid(&m);
}

/// mremap and MADV_FREE go through the page-table cursor: each PTE table is locked once
/// per destination table it moves into (mremap: the source and the destination table
/// together) and each entry read once, where they used to walk from the PGD and lock per
/// 4 KiB page.
#[test]
fn mremap_and_madv_free_visit_each_table_once() {
    let m = machine(256 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let len = 64 * M;
    let (tables, ptes) = (len / (2 * M), len / (4 * K));
    let a = cpu.mmap(p, fixed(len, 0x4000_0000)).unwrap();
    cpu.write_fill(p, a, len, 0x3c).unwrap();
    let before = m.counters();
    // One page past a 2 MiB boundary: the tables cannot move whole, so the PTEs move, each
    // source table into two destination tables.
    let flags = MremapFlags {
        maymove: true,
        fixed: Some(0x8000_1000),
        dontunmap: false,
    };
    let b = cpu.mremap(p, a, len, len, flags).unwrap();
    let d = m.counters().delta(&before);
    // The move locks each source table with each of its two destinations and reads each
    // entry once; then the old range is unmapped as Linux does, which zaps (locks, reads)
    // the emptied source tables once more and frees them.
    assert_eq!(d.get(Ev::LockPtl), 2 * 2 * tables + tables);
    assert_eq!(d.get(Ev::PteRead), ptes + ptes);
    // Each entry cleared and written; one PMD table and `tables + 1` PTE tables linked, the
    // source's `tables` and its PMD table unlinked.
    assert_eq!(d.get(Ev::PteWrite), 2 * ptes + (tables + 2) + (tables + 1));
    assert_eq!(d.get(Ev::PgtableAlloc), tables + 2);
    // Each of the two pieces of each source table flushes its range as it moves; the unmap
    // of the emptied range clears no entry but frees tables, which flushes once more
    // (`pte_free_tlb` widens the gather's range and sets `freed_tables`).
    assert_eq!(d.get(Ev::TlbFlushRange), 2 * tables + 1);
    valid(&m);
    let before = m.counters();
    cpu.madvise(p, b, len, Advice::Free).unwrap();
    let d = m.counters().delta(&before);
    // The moved range spans one table more than the source did.
    assert_eq!(d.get(Ev::LockPtl), tables + 1);
    assert_eq!(d.get(Ev::PteRead), ptes);
    valid(&m);
    assert_eq!(
        cpu.find_mismatch(p, b, len, 0x3c).unwrap(),
        None,
        "MADV_FREE keeps data until reclaim"
    );
}

#[test]
fn freed_folios_go_back_a_batch_at_a_time() {
    // folios_put_refs returns up to 31 freed folios together (one memcg uncharge and one
    // per-CPU list round each); a folio freed on its own (one MADV_DONTNEED of a 4 KiB page)
    // is a batch of one.
    const BATCH: u64 = 31;
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let (one, bulk) = (0x4000_0000, 0x4040_0000);
    cpu.mmap(p, fixed(20 * 4 * K, one)).unwrap();
    cpu.mmap(p, fixed(200 * 4 * K, bulk)).unwrap();
    cpu.write_fill(p, one, 20 * 4 * K, 1).unwrap();
    cpu.write_fill(p, bulk, 200 * 4 * K, 2).unwrap();
    let freed = |d: usermm::Snapshot| (d.get(Ev::FolioFree), d.get(Ev::FreeBatch));
    // One call per page, written before the bulk region: the LRU-add batch holds none of
    // them, so each call frees its folio.
    let (_, d) = counted(&m, || {
        (0..20).try_for_each(|i| cpu.madvise(p, one + i * 4 * K, 4 * K, Advice::DontNeed))
    });
    assert_eq!(freed(d), (20, 20));
    // One call over 190 pages (the PTE table stays in use): the per-CPU LRU-add batch still
    // holds the last few pages faulted (220 faults: 7 full batches drained, 3 held), which
    // this range does not reach, so all 190 are freed, 31 at a time.
    let dontneed_bulk = || cpu.madvise(p, bulk, 190 * 4 * K, Advice::DontNeed);
    let (folios, batches) = freed(counted(&m, dontneed_bulk).1);
    assert_eq!(folios, 190);
    assert_eq!(batches, folios.div_ceil(BATCH));
    // Nothing freed, no batch: the pages are gone already.
    assert_eq!(freed(counted(&m, dontneed_bulk).1), (0, 0));
    assert_eq!(
        cpu.find_mismatch(p, bulk + 190 * 4 * K, 10 * 4 * K, 2)
            .unwrap(),
        None
    );
}

#[test]
fn munmap_detaches_each_vma_and_exit_frees_them_without() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let b = 0x4000_0000;
    // Five single-page VMAs with a hole between each two (no merge), four more beyond.
    for i in 0..9 {
        cpu.mmap(p, fixed(4 * K, b + 2 * i * 4 * K)).unwrap();
    }
    let vmas = |d: usermm::Snapshot| (d.get(Ev::VmaDetached), d.get(Ev::VmaFreed));
    assert_eq!(vmas(counted(&m, || cpu.munmap(p, b, 9 * 4 * K)).1), (5, 5));
    let left = cpu.maps(p).unwrap().len() as u64;
    assert!(left >= 4, "{left}");
    assert_eq!(vmas(counted(&m, || cpu.exit(p)).1), (0, left));
}
