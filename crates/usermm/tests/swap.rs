//! Swap: large folios swapped out whole and shared by fork, copy-on-write after swap-in,
//! lazy-free discard, slot accounting — contents, counters and invariants after each step.

mod common;
use common::*;
use usermm::views::kpf;
use usermm::{Advice, Ev, Machine, MachineConfig, MmapArgs, Privilege, ThpPolicy};

/// A machine of `mem` with a swap area of `swap` bytes on a solid-state device (large
/// folios may be swapped whole) and 64K mTHP always on.
fn swap_machine(mem: u64, swap: u64) -> Machine {
    machine_with_swap(mem, swap, true)
}

/// [`swap_machine`] on a solid-state or a rotational device.
fn machine_with_swap(mem: u64, swap: u64, ssd: bool) -> Machine {
    let mut cfg = MachineConfig {
        memory: mem,
        swap,
        swap_ssd: ssd,
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = true;
    cfg.tunables
        .thp
        .set_size(64 * K, ThpPolicy::Always)
        .expect("64K");
    Machine::new(cfg)
}

fn smaps_of(cpu: &usermm::Cpu<'_>, p: usermm::Pid, a: u64, len: u64) -> usermm::views::Smaps {
    let mut t = usermm::views::Smaps::default();
    for (_, s) in cpu.smaps(p, a, a + len).expect("smaps") {
        t.add(&s);
    }
    t
}

#[test]
fn forked_large_folios_swap_out_whole_and_copy_on_write_after_swap_in() {
    let m = swap_machine(64 * M, 256 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    let a = cpu.mmap(p, MmapArgs::anon(M, RW)).expect("mmap");
    cpu.write_fill(p, a, M, 0x5a).expect("write");
    assert_eq!(cpu.folio_order(p, a).expect("order"), Some(4));
    let c = cpu.fork(p).expect("fork");
    valid(&m);

    // MADV_PAGEOUT leaves folios another process maps alone.
    let (_, d) = counted(&m, || cpu.madvise(p, a, M, Advice::PageOut));
    assert_eq!(d.get(Ev::PswpOut), 0, "shared folios are not paged out");
    assert_eq!(smaps_of(&cpu, p, a, M).swap, 0);

    // Reclaim sees every mapping through the rmap walk: the first look finds both
    // mappings young and activates, later passes age and swap the folios out whole.
    let (freed, d) = counted(&m, || Ok::<_, ()>(cpu.reclaim(8 * M)));
    assert!(freed >= M, "reclaim freed {freed} bytes");
    assert_eq!(d.get(Ev::ThpSwpOut), 16, "16 folios of 64K swapped whole");
    assert_eq!(d.get(Ev::ThpSwpOutFallback), 0);
    assert_eq!(d.get(Ev::PswpOut), 256);
    assert_eq!(d.get(Ev::PgStealAnon), 256);
    for pid in [p, c] {
        let s = smaps_of(&cpu, pid, a, M);
        assert_eq!((s.rss, s.swap), (0, M), "all swapped out");
        assert_eq!(s.swap_pss, M / 2, "each slot named by two entries");
        assert_eq!(cpu.status(pid).expect("status").vm_swap, M);
        let pm = cpu.pagemap(pid, a + 4 * K).expect("pagemap");
        assert!(pm.swapped && !pm.present && !pm.exclusive, "{pm:?}");
    }
    assert_eq!(m.swap.as_ref().expect("swap").inuse(), 256);

    // The child writes a page: it is read in (with readahead), mapped read-only because
    // the entry was shared, and copied.
    let (_, d) = counted(&m, || cpu.write_fill(c, a, 4 * K, 0x11));
    assert_eq!(d.get(Ev::FaultSwap), 1);
    assert_eq!(d.get(Ev::PswpIn), 1 + d.get(Ev::SwapRa));
    assert_eq!(
        d.get(Ev::CowCopy),
        1,
        "the swapped-in page is shared: copied"
    );
    assert_eq!(
        cpu.folio_order(c, a).expect("order"),
        Some(0),
        "swap-in is order 0"
    );
    // The parent still reads its bytes, from the swap cache or the device.
    let (_, d) = counted(&m, || cpu.find_mismatch(p, a, M, 0x5a));
    assert_eq!(cpu.find_mismatch(p, a, M, 0x5a).expect("read"), None);
    assert_eq!(d.get(Ev::CowCopy), 0);
    assert_eq!(cpu.find_mismatch(c, a, 4 * K, 0x11).expect("read"), None);
    assert_eq!(
        cpu.find_mismatch(c, a + 4 * K, M - 4 * K, 0x5a)
            .expect("read"),
        None
    );
    // Both now map the untouched pages from the swap cache; the slots stay while cached.
    let s = smaps_of(&cpu, c, a, M);
    assert_eq!((s.rss, s.swap), (M, 0));
    valid(&m);

    // The parent writes a page the child maps too: copied, the child's bytes stay.
    let (_, d) = counted(&m, || cpu.write_fill(p, a + 8 * K, 4 * K, 0x22));
    assert_eq!(d.get(Ev::CowCopy), 1);
    assert_eq!(
        cpu.find_mismatch(c, a + 8 * K, 4 * K, 0x5a).expect("read"),
        None
    );

    // The child exits: its entries give up their references; the parent alone maps the
    // rest and a write reuses in place once the swap cache lets go (`folio_free_swap`).
    cpu.exit(c).expect("exit");
    valid(&m);
    let (_, d) = counted(&m, || cpu.write_fill(p, a + 12 * K, 4 * K, 0x33));
    assert_eq!(d.get(Ev::CowCopy), 0, "sole user: reused");
    assert_eq!(d.get(Ev::CowReuse), 1);
    let f = cpu
        .kpageflags(p, a + 12 * K)
        .expect("flags")
        .expect("mapped");
    assert!(
        f >> kpf::SWAPBACKED & 1 == 1 && f >> kpf::DIRTY & 1 == 1,
        "{f:#x}"
    );
    assert_eq!(
        cpu.find_mismatch(p, a + 8 * K, 4 * K, 0x22).expect("read"),
        None
    );

    // Unmapping frees every slot.
    cpu.munmap(p, a, M).expect("munmap");
    valid(&m);
    assert_eq!(m.swap.as_ref().expect("swap").inuse(), 0);
    assert_eq!(cpu.status(p).expect("status").vm_swap, 0);
}

#[test]
fn swapped_entries_survive_mremap_and_mprotect_and_fork_counts_them() {
    let m = swap_machine(64 * M, 64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    let a = cpu.mmap(p, MmapArgs::anon(256 * K, RW)).expect("mmap");
    cpu.write_fill(p, a, 256 * K, 7).expect("write");
    let (_, d) = counted(&m, || cpu.madvise(p, a, 256 * K, Advice::PageOut));
    assert_eq!(d.get(Ev::ThpSwpOut), 4);
    assert_eq!(smaps_of(&cpu, p, a, 256 * K).swap, 256 * K);
    // mprotect leaves swap entries as they are; the swap fault maps with the VMA's
    // protection.
    cpu.mprotect(p, a, 256 * K, RO).expect("mprotect");
    valid(&m);
    assert_eq!(cpu.find_mismatch(p, a, 4 * K, 7).expect("read"), None);
    cpu.mprotect(p, a, 256 * K, RW).expect("mprotect");
    // mremap moves the entries: the data follows.
    let b = cpu
        .mremap(
            p,
            a,
            256 * K,
            512 * K,
            usermm::MremapFlags {
                maymove: true,
                ..Default::default()
            },
        )
        .expect("mremap");
    valid(&m);
    assert_eq!(cpu.find_mismatch(p, b, 256 * K, 7).expect("read"), None);
    cpu.madvise(p, b, 256 * K, Advice::PageOut)
        .expect("pageout");
    let c = cpu.fork(p).expect("fork");
    valid(&m);
    assert_eq!(cpu.status(c).expect("status").vm_swap, 256 * K);
    cpu.exit(c).expect("exit");
    cpu.exit(p).expect("exit");
    valid(&m);
    assert_eq!(
        m.swap.as_ref().expect("swap").inuse(),
        0,
        "exit frees every slot"
    );
}

#[test]
fn lazy_free_is_discarded_by_pageout_unless_written_again() {
    let m = swap_machine(64 * M, 64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    let a = cpu.mmap(p, MmapArgs::anon(128 * K, RW)).expect("mmap");
    cpu.write_fill(p, a, 128 * K, 9).expect("write");
    cpu.madvise(p, a, 128 * K, Advice::Free).expect("free");
    assert_eq!(smaps_of(&cpu, p, a, 128 * K).lazyfree, 128 * K);
    cpu.write_fill(p, a + 64 * K, 1, 10).expect("redirty");
    let (_, d) = counted(&m, || cpu.madvise(p, a, 128 * K, Advice::PageOut));
    assert_eq!(d.get(Ev::PgLazyFreed), 16, "the clean folio is dropped");
    // The written one is made swap-backed again and kept (`try_to_unmap_one` restores its
    // entries), to be swapped by a later pass like any other.
    assert_eq!(d.get(Ev::PswpOut), 0);
    let s = smaps_of(&cpu, p, a, 128 * K);
    assert_eq!((s.rss, s.swap, s.lazyfree), (64 * K, 0, 0));
    let (_, d) = counted(&m, || cpu.madvise(p, a, 128 * K, Advice::PageOut));
    assert_eq!(d.get(Ev::PswpOut), 16);
    let s = smaps_of(&cpu, p, a, 128 * K);
    assert_eq!((s.rss, s.swap), (0, 64 * K));
    assert_eq!(cpu.find_mismatch(p, a, 64 * K, 0).expect("read"), None);
    assert_eq!(cpu.find_mismatch(p, a + 64 * K, 1, 10).expect("read"), None);
    assert_eq!(
        cpu.find_mismatch(p, a + 64 * K + 1, 64 * K - 1, 9)
            .expect("read"),
        None
    );
    // MADV_FREE of swapped-out pages drops them with their slots.
    cpu.madvise(p, a, 128 * K, Advice::PageOut)
        .expect("pageout");
    cpu.madvise(p, a, 128 * K, Advice::Free).expect("free");
    valid(&m);
    assert_eq!(m.swap.as_ref().expect("swap").inuse(), 0);
    assert_eq!(cpu.find_mismatch(p, a, 128 * K, 0).expect("read"), None);
}

#[test]
fn without_swap_pageout_splits_large_folios_and_keeps_them() {
    let m = swap_machine(64 * M, 0);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    let a = cpu.mmap(p, MmapArgs::anon(128 * K, RW)).expect("mmap");
    cpu.write_fill(p, a, 128 * K, 3).expect("write");
    let (_, d) = counted(&m, || cpu.madvise(p, a, 128 * K, Advice::PageOut));
    assert_eq!(
        d.get(Ev::ThpSplitFolio),
        2,
        "measured on 6.18: order 4 becomes order 0"
    );
    assert_eq!(d.get(Ev::PswpOut), 0);
    assert_eq!(cpu.folio_order(p, a).expect("order"), Some(0));
    let f = cpu.kpageflags(p, a).expect("flags").expect("mapped");
    assert!(f >> kpf::LRU & 1 == 1, "{f:#x}");
    assert_eq!(smaps_of(&cpu, p, a, 128 * K).rss, 128 * K);
    assert_eq!(cpu.find_mismatch(p, a, 128 * K, 3).expect("read"), None);
}

#[test]
fn a_file_page_refaulting_within_the_workingset_starts_active() {
    use usermm::InodeKind;
    let m = swap_machine(64 * M, 0);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    // 1M that stays active (read twice through read(2): `folio_mark_accessed`), and 256K
    // that is evicted and read again.
    let hot = cpu.file_create(M, InodeKind::Disk, Some(1)).expect("file");
    cpu.pread(hot, 0, M).expect("read");
    cpu.pread(hot, 0, M).expect("read again");
    let g = cpu
        .file_create(256 * K, InodeKind::Disk, Some(2))
        .expect("file");
    let a = cpu
        .mmap(
            p,
            MmapArgs {
                file: Some((g, 0)),
                ..MmapArgs::anon(256 * K, RO)
            },
        )
        .expect("mmap");
    cpu.find_mismatch(p, a, 256 * K, 2).expect("read");
    let (_, d) = counted(&m, || cpu.madvise(p, a, 256 * K, Advice::PageOut));
    assert!(d.get(Ev::PageCacheEvict) > 0, "{d:?}");
    let (_, d) = counted(&m, || cpu.find_mismatch(p, a, 256 * K, 2));
    assert_eq!(d.get(Ev::WorkingsetRefault), 64, "every page had a shadow");
    assert_eq!(
        d.get(Ev::WorkingsetActivate),
        64,
        "evicted 64 pages ago at most: < 256 active"
    );
    let f = cpu.kpageflags(p, a).expect("flags").expect("mapped");
    assert!(f >> kpf::ACTIVE & 1 == 1, "{f:#x}");
    // A truncation forgets the shadows.
    cpu.madvise(p, a, 256 * K, Advice::PageOut)
        .expect("pageout");
    cpu.munmap(p, a, 256 * K).expect("munmap");
    cpu.ftruncate(g, 0).expect("truncate");
    cpu.ftruncate(g, 256 * K).expect("grow");
    let (_, d) = counted(&m, || cpu.pread(g, 0, 256 * K));
    assert_eq!(d.get(Ev::WorkingsetRefault), 0);
}

#[test]
fn shmem_pages_go_to_swap_and_come_back_through_faults_and_reads() {
    use usermm::{InodeKind, Sharing};
    let m = swap_machine(64 * M, 64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    let f = cpu
        .file_create(256 * K, InodeKind::Tmpfs, None)
        .expect("file");
    let a = cpu
        .mmap(
            p,
            MmapArgs {
                sharing: Sharing::Shared,
                file: Some((f, 0)),
                ..MmapArgs::anon(256 * K, RW)
            },
        )
        .expect("mmap");
    cpu.write_fill(p, a, 256 * K, 0x44).expect("write");
    let (_, d) = counted(&m, || cpu.madvise(p, a, 128 * K, Advice::PageOut));
    assert_eq!(d.get(Ev::PswpOut), 32, "shmem_writeout");
    let s = smaps_of(&cpu, p, a, 256 * K);
    assert_eq!(
        (s.rss, s.swap),
        (128 * K, 128 * K),
        "the object's swap shows in smaps"
    );
    assert_eq!(
        cpu.status(p).expect("status").vm_swap,
        0,
        "not the process's swap entries"
    );
    assert_eq!(m.swap.as_ref().expect("swap").inuse(), 32);
    // A fault brings a page back through the page cache; read(2) another.
    let (_, d) = counted(&m, || cpu.find_mismatch(p, a, 4 * K, 0x44));
    assert_eq!(d.get(Ev::PswpIn), 1);
    assert_eq!(
        cpu.pread(f, 64 * K, 4 * K).expect("pread"),
        vec![0x44; 4096]
    );
    assert_eq!(m.swap.as_ref().expect("swap").inuse(), 30);
    // Truncation gives the rest of the slots up.
    cpu.munmap(p, a, 256 * K).expect("munmap");
    cpu.ftruncate(f, 0).expect("truncate");
    valid(&m);
    assert_eq!(m.swap.as_ref().expect("swap").inuse(), 0);
}

#[test]
fn a_rotational_swap_device_splits_large_folios_first() {
    // This host's disk is rotational: 6.18 gives a large folio no run of slots there and
    // splits it (measured: thp_swpout 0, thp_swpout_fallback per folio).
    let m = machine_with_swap(64 * M, 64 * M, false);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    let a = cpu.mmap(p, MmapArgs::anon(256 * K, RW)).expect("mmap");
    cpu.write_fill(p, a, 256 * K, 5).expect("write");
    // MADV_PAGEOUT splits before reclaiming.
    let (_, d) = counted(&m, || cpu.madvise(p, a, 128 * K, Advice::PageOut));
    assert_eq!(d.get(Ev::ThpSwpOut), 0);
    assert_eq!(d.get(Ev::ThpSwpOutFallback), 2);
    assert_eq!(d.get(Ev::ThpSplitFolio), 2);
    assert_eq!(d.get(Ev::PswpOut), 32);
    // Reclaim splits an isolated folio one process maps, under its page-table lock.
    let (_, d) = counted(&m, || Ok::<_, ()>(cpu.reclaim(8 * M)));
    assert_eq!(d.get(Ev::ThpSwpOut), 0);
    assert_eq!(d.get(Ev::ThpSplitFolio), 2, "{d:?}");
    assert_eq!(smaps_of(&cpu, p, a, 256 * K).swap, 256 * K);
    assert_eq!(cpu.find_mismatch(p, a, 256 * K, 5).expect("read"), None);
    assert_eq!(cpu.folio_order(p, a + 128 * K).expect("order"), Some(0));
    // Folios two processes map are swapped whole instead (a deliberate difference).
    let b = cpu.mmap(p, MmapArgs::anon(128 * K, RW)).expect("mmap");
    cpu.write_fill(p, b, 128 * K, 6).expect("write");
    let c = cpu.fork(p).expect("fork");
    let (_, d) = counted(&m, || Ok::<_, ()>(cpu.reclaim(8 * M)));
    assert_eq!(d.get(Ev::ThpSwpOut), 2, "{d:?}");
    // `b` merged with `a` into one VMA: all of it is swapped out in the child too.
    assert_eq!(smaps_of(&cpu, c, b, 128 * K).swap, 384 * K);
    assert_eq!(cpu.find_mismatch(c, b, 128 * K, 6).expect("read"), None);
}
