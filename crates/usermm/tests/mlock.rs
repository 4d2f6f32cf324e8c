//! mlock, munlock, mlockall and the LRU: accounting, flags, errno, partial application.

mod common;
use common::*;
use usermm::views::kpf;
use usermm::{Errno, MlockallFlags, MmapArgs, Placement, Privilege};

fn flags(cpu: &usermm::Cpu<'_>, p: usermm::Pid, a: u64) -> u64 {
    cpu.kpageflags(p, a).expect("kpageflags").expect("mapped")
}

fn has(word: u64, bit: u32) -> bool {
    word >> bit & 1 == 1
}

#[test]
fn mlock_populates_and_accounts() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    let a = cpu.mmap(p, MmapArgs::anon(64 * K, RW)).expect("mmap");
    cpu.mlock(p, a, 64 * K).expect("mlock");
    valid(&m);
    assert_eq!(cpu.status(p).expect("status").vm_lck, 64 * K);
    assert_eq!(
        cpu.smaps(p, a, a + 64 * K).expect("smaps")[0].1.rss,
        64 * K,
        "populated"
    );
    let f = flags(&cpu, p, a);
    assert!(
        has(f, kpf::MLOCKED) && has(f, kpf::UNEVICTABLE) && has(f, kpf::LRU),
        "{f:#x}"
    );
    assert_eq!(m.nr_mlock(), 16);
    cpu.munlock(p, a, 64 * K).expect("munlock");
    valid(&m);
    let f = flags(&cpu, p, a);
    assert!(
        !has(f, kpf::MLOCKED) && !has(f, kpf::UNEVICTABLE) && has(f, kpf::LRU),
        "{f:#x}"
    );
    assert_eq!(m.nr_mlock(), 0);
    assert_eq!(cpu.status(p).expect("status").vm_lck, 0);
}

#[test]
fn one_folio_locked_by_two_vmas_stays_locked_until_both_go() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    let s = cpu
        .mmap(
            p,
            MmapArgs {
                sharing: usermm::Sharing::Shared,
                ..MmapArgs::anon(4 * K, RW)
            },
        )
        .expect("mmap");
    cpu.write_fill(p, s, 4 * K, 1).expect("write");
    let c = cpu.fork(p).expect("fork");
    cpu.mlock(p, s, 4 * K).expect("mlock parent");
    cpu.mlock(c, s, 4 * K).expect("mlock child");
    cpu.lru_add_drain_all();
    valid(&m);
    cpu.munlock(p, s, 4 * K).expect("munlock parent");
    let f = flags(&cpu, c, s);
    assert!(has(f, kpf::MLOCKED), "still locked by the child: {f:#x}");
    valid(&m);
    cpu.exit(c).expect("exit");
    cpu.lru_add_drain_all();
    let f = flags(&cpu, p, s);
    assert!(!has(f, kpf::MLOCKED) && !has(f, kpf::UNEVICTABLE), "{f:#x}");
    valid(&m);
}

#[test]
fn mlock_over_a_hole_applies_partially_then_enomem() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    let b = 0x1000_0000;
    cpu.mmap(
        p,
        MmapArgs {
            placement: Placement::Fixed(b),
            ..MmapArgs::anon(16 * K, RW)
        },
    )
    .expect("mmap");
    cpu.mmap(
        p,
        MmapArgs {
            placement: Placement::Fixed(b + 32 * K),
            ..MmapArgs::anon(16 * K, RW)
        },
    )
    .expect("mmap");
    assert_eq!(cpu.mlock(p, b, 48 * K), Err(Errno::ENOMEM));
    assert_eq!(
        cpu.status(p).expect("status").vm_lck,
        16 * K,
        "the VMA before the hole is locked"
    );
    assert_eq!(
        cpu.mlock(p, b + 16 * K, 4 * K),
        Err(Errno::ENOMEM),
        "start in a hole"
    );
    valid(&m);
}

#[test]
fn mlock_errnos_and_limits() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let zero = cpu.spawn(Privilege::Ordinary, 0).expect("spawn");
    let a = cpu.mmap(zero, MmapArgs::anon(4 * K, RW)).expect("mmap");
    assert_eq!(cpu.mlock(zero, a, 4 * K), Err(Errno::EPERM));
    assert_eq!(
        cpu.mlockall(
            zero,
            MlockallFlags {
                current: true,
                ..Default::default()
            }
        ),
        Err(Errno::EPERM)
    );
    let p = cpu.spawn(Privilege::Ordinary, 64 * K).expect("spawn");
    let a = cpu.mmap(p, MmapArgs::anon(128 * K, RW)).expect("mmap");
    assert_eq!(
        cpu.mlock(p, a, 128 * K),
        Err(Errno::ENOMEM),
        "over RLIMIT_MEMLOCK"
    );
    cpu.mlock(p, a, 64 * K).expect("within the limit");
    cpu.mlock(p, a, 64 * K)
        .expect("already locked pages do not count twice");
    assert_eq!(
        cpu.mlockall(
            p,
            MlockallFlags {
                onfault: true,
                ..Default::default()
            }
        ),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        cpu.mlockall(p, MlockallFlags::default()),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        cpu.mmap(
            p,
            MmapArgs {
                locked: true,
                ..MmapArgs::anon(64 * K, RW)
            }
        ),
        Err(Errno::EAGAIN)
    );
    let r = cpu.spawn(Privilege::Privileged, 0).expect("spawn");
    let a = cpu.mmap(r, MmapArgs::anon(128 * K, RW)).expect("mmap");
    cpu.mlock(r, a, 128 * K)
        .expect("CAP_IPC_LOCK ignores the limit");
    valid(&m);
}

#[test]
fn onfault_locks_only_what_is_touched_and_fork_does_not_inherit() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    let a = cpu.mmap(p, MmapArgs::anon(64 * K, RW)).expect("mmap");
    cpu.mlock2(p, a, 64 * K, true).expect("mlock2 onfault");
    assert_eq!(cpu.smaps(p, a, a + 64 * K).expect("smaps")[0].1.rss, 0);
    cpu.write_fill(p, a, 8 * K, 3).expect("write");
    assert!(has(flags(&cpu, p, a), kpf::MLOCKED));
    cpu.mlock(p, a, 64 * K)
        .expect("turn onfault off: no double count");
    assert_eq!(cpu.status(p).expect("status").vm_lck, 64 * K);
    let c = cpu.fork(p).expect("fork");
    assert_eq!(cpu.status(c).expect("status").vm_lck, 0);
    cpu.write_fill(c, a, 4 * K, 9).expect("child COW");
    assert!(
        !has(flags(&cpu, c, a), kpf::MLOCKED),
        "the child's copy is not locked"
    );
    valid(&m);
    cpu.munmap(p, a + 16 * K, 16 * K)
        .expect("partial munmap of a locked range");
    assert_eq!(cpu.status(p).expect("status").vm_lck, 48 * K);
    valid(&m);
}

#[test]
fn mlockall_current_and_future() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    let a = cpu.mmap(p, MmapArgs::anon(32 * K, RW)).expect("mmap");
    cpu.mlockall(
        p,
        MlockallFlags {
            current: true,
            future: true,
            onfault: false,
        },
    )
    .expect("mlockall");
    let b = cpu.mmap(p, MmapArgs::anon(32 * K, RW)).expect("mmap");
    assert_eq!(cpu.status(p).expect("status").vm_lck, 64 * K);
    assert!(
        has(flags(&cpu, p, b), kpf::MLOCKED),
        "future mappings are locked and populated"
    );
    assert!(has(flags(&cpu, p, a), kpf::MLOCKED));
    cpu.munlockall(p).expect("munlockall");
    assert_eq!(cpu.status(p).expect("status").vm_lck, 0);
    let c = cpu.mmap(p, MmapArgs::anon(32 * K, RW)).expect("mmap");
    cpu.write_fill(p, c, 4 * K, 1).expect("write");
    assert!(
        !has(flags(&cpu, p, c), kpf::MLOCKED),
        "no longer locked by default"
    );
    assert!(
        !has(flags(&cpu, p, a), kpf::MLOCKED),
        "munlockall unlocked the pages"
    );
    valid(&m);
    cpu.exit(p).expect("exit");
    valid(&m);
    assert_eq!(m.phys.allocated_frames(), 0);
    assert_eq!(m.nr_mlock(), 0);
}

fn all_designs() -> Vec<usermm::tunables::MunlockDesign> {
    usermm::tunables::MunlockDesign::ALL.to_vec()
}

#[test]
fn every_munlock_design_gives_the_same_result() {
    let mut seen = Vec::new();
    for design in all_designs() {
        let m = machine(64 * M);
        m.update_tunables(|t| t.munlock = design);
        let cpu = m.enter_cpu(0).expect("cpu");
        let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
        let a = cpu
            .mmap(
                p,
                MmapArgs {
                    locked: true,
                    populate: true,
                    ..MmapArgs::anon(256 * K, RW)
                },
            )
            .expect("mmap");
        let s = cpu
            .mmap(
                p,
                MmapArgs {
                    sharing: usermm::Sharing::Shared,
                    ..MmapArgs::anon(8 * K, RW)
                },
            )
            .expect("mmap");
        cpu.write_fill(p, s, 8 * K, 1).expect("write");
        let c = cpu.fork(p).expect("fork");
        cpu.mlock(p, s, 8 * K).expect("mlock");
        cpu.mlock(c, s, 8 * K).expect("mlock");
        cpu.lru_add_drain_all();
        valid(&m);
        assert_eq!(m.nr_mlock(), 64 + 2, "{design:?}");
        cpu.munlock(p, a, 128 * K).expect("munlock half");
        cpu.munlock(p, s, 8 * K).expect("munlock shared in parent");
        cpu.lru_add_drain_all();
        valid(&m);
        let shared_locked = has(flags(&cpu, p, s), kpf::MLOCKED);
        assert!(
            shared_locked,
            "{design:?}: the child still locks the shared page"
        );
        cpu.munmap(p, a + 128 * K, 128 * K)
            .expect("munmap locked half");
        cpu.exit(c).expect("exit");
        cpu.lru_add_drain_all();
        valid(&m);
        seen.push((
            m.nr_mlock(),
            has(flags(&cpu, p, s), kpf::MLOCKED),
            has(flags(&cpu, p, a), kpf::UNEVICTABLE),
        ));
        cpu.exit(p).expect("exit");
        valid(&m);
        assert_eq!(m.phys.allocated_frames(), 0, "{design:?}");
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
    assert_eq!(seen[0], (0, false, false));
}

/// The 2013 accounting leak: a page whose PG_mlocked was cleared but whose isolation failed
/// (it was not on an LRU yet) must still be subtracted from NR_MLOCK (stages 4+ batch the
/// update; the fixed version counts every successful clear).
#[test]
fn munlock_of_pages_not_yet_on_the_lru_keeps_nr_mlock_exact() {
    for design in all_designs() {
        let m = machine(64 * M);
        m.update_tunables(|t| t.munlock = design);
        let cpu = m.enter_cpu(0).expect("cpu");
        let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
        // 8 pages: the mlock batch (31 entries) is not full, so they are not on an LRU yet.
        let a = cpu
            .mmap(
                p,
                MmapArgs {
                    locked: true,
                    ..MmapArgs::anon(32 * K, RW)
                },
            )
            .expect("mmap");
        assert!(
            m.cpu_batches(0).lock().folios().count() >= 8,
            "pages still in the per-CPU batch"
        );
        cpu.munmap(p, a, 32 * K).expect("munmap");
        cpu.lru_add_drain_all();
        assert_eq!(m.nr_mlock(), 0, "{design:?}");
        valid(&m);
    }
}

#[test]
fn munlock_of_a_pmd_thp_takes_its_pmd_lock_once() {
    // `mlock_pte_range` reads a huge PMD again under `pmd_trans_huge_lock` and mlocks or
    // munlocks its folio there: one split PMD lock per THP (the stage designs' munlock goes
    // through follow_page, which takes it too).
    for design in all_designs() {
        let m = machine(64 * M);
        m.update_tunables(|t| {
            t.thp.top = usermm::ThpPolicy::Always;
            t.munlock = design;
        });
        let cpu = m.enter_cpu(0).expect("cpu");
        let p = cpu.spawn(Privilege::Privileged, u64::MAX).expect("spawn");
        let a = cpu.mmap(p, MmapArgs::anon(8 * M, RW)).expect("mmap");
        assert_eq!(
            a % (2 * M),
            0,
            "a THP-sized anonymous mapping is PMD-aligned"
        );
        cpu.write_fill(p, a, 8 * M, 1).expect("fill");
        // The split page-table locks one call takes.
        let ptl_locks = |d: usermm::Snapshot| d.get(usermm::Ev::LockPtl);
        // mlock walks with mlock_pte_range on every design (the designs differ in munlock).
        let locks = ptl_locks(counted(&m, || cpu.mlock(p, a, 8 * M)).1);
        assert_eq!(m.nr_mlock(), 2048, "{design:?}: four THPs mlocked");
        assert_eq!(locks, 4, "{design:?}: mlock, one lock per THP");
        let locks = ptl_locks(counted(&m, || cpu.munlock(p, a, 8 * M)).1);
        assert_eq!(m.nr_mlock(), 0, "{design:?}");
        assert_eq!(locks, 4, "{design:?}: one PMD lock per THP");
        assert!(!has(flags(&cpu, p, a + 2 * M), kpf::MLOCKED), "{design:?}");
    }
}

/// Makes anonymous faults allocate folios of `folio` bytes: 4 KiB, 64 KiB (mTHP) or 2 MiB
/// (PMD THP).
fn anon_folios(m: &usermm::Machine, folio: u64) {
    let policy = |on: bool| {
        if on {
            usermm::ThpPolicy::Always
        } else {
            usermm::ThpPolicy::Never
        }
    };
    m.update_tunables(|t| {
        t.thp.top = policy(folio == 2 * M);
        t.thp
            .set_size(64 * K, policy(folio == 64 * K))
            .expect("64K");
    });
}

#[test]
fn walks_count_each_folio_whose_struct_page_they_touch() {
    // The cost model prices a walk's first touch of each folio's `struct page`:
    // `mlock_pte_folios` per small folio or large folio's batch that mlock_pte_range reaches
    // through PTEs, `pmd_folio_visits` per PMD-mapped folio reached by mlock_pte_range's huge
    // arm or by copy_huge_pmd.
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Privileged, u64::MAX).expect("spawn");
    let walk = |d: usermm::Snapshot| {
        (
            d.get(usermm::Ev::MlockPteFolio),
            d.get(usermm::Ev::PmdFolioVisit),
        )
    };
    // Folios of 4 KiB, 64 KiB and 2 MiB in turn: 8 MiB of each.
    for (folio, pte_folios, pmd_folios) in [(4 * K, 2048, 0), (64 * K, 128, 0), (2 * M, 0, 4)] {
        anon_folios(&m, folio);
        let a = cpu.mmap(p, MmapArgs::anon(8 * M, RW)).expect("mmap");
        cpu.write_fill(p, a, 8 * M, 1).expect("fill");
        let d = counted(&m, || cpu.mlock(p, a, 8 * M)).1;
        assert_eq!(
            walk(d.clone()),
            (pte_folios, pmd_folios),
            "mlock of {folio} B folios"
        );
        // mlock's populate looks every PTE-mapped page up on its own, a PMD-mapped folio once.
        let follows = if folio == 2 * M { 4 } else { 2048 };
        assert_eq!(
            d.get(usermm::Ev::GupFollow),
            follows,
            "mlock of {folio} B folios"
        );
        let d = counted(&m, || cpu.munlock(p, a, 8 * M)).1;
        assert_eq!(
            walk(d.clone()),
            (pte_folios, pmd_folios),
            "munlock of {folio} B folios"
        );
        assert_eq!(d.get(usermm::Ev::GupFollow), 0, "munlock populates nothing");
        // mlock_pte_range reads every entry it walks: a small folio's, a large folio's first
        // and then the rest in folio_pte_batch; a PMD-mapped folio's entry is the PMD.
        let reads = if folio == 2 * M { 0 } else { 2048 };
        assert_eq!(
            d.get(usermm::Ev::PteRead),
            reads,
            "munlock of {folio} B folios"
        );
        let forked = walk(counted(&m, || cpu.fork(p)).1);
        assert_eq!(forked, (0, pmd_folios), "fork of {folio} B folios");
        cpu.munmap(p, a, 8 * M).expect("munmap");
    }
}

#[test]
fn unevictable_statistics_count_a_folios_pages() {
    // 6.18's mlock_folio, __mlock_folio and __munlock_folio add folio_nr_pages to
    // UNEVICTABLE_PGMLOCKED, PGCULLED, PGMUNLOCKED and PGRESCUED; the folio counters are the
    // cost model's.
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Privileged, u64::MAX).expect("spawn");
    for (folio, folios) in [(4 * K, 2048), (64 * K, 128), (2 * M, 4)] {
        anon_folios(&m, folio);
        let a = cpu.mmap(p, MmapArgs::anon(8 * M, RW)).expect("mmap");
        cpu.write_fill(p, a, 8 * M, 1).expect("fill");
        let ev = |d: &usermm::Snapshot, names: &[usermm::Ev]| -> Vec<u64> {
            names.iter().map(|&e| d.get(e)).collect()
        };
        use usermm::Ev::{Culled, FolioMlocked, FolioMunlocked, Mlocked, Munlocked, Rescued};
        let d = counted(&m, || cpu.mlock(p, a, 8 * M)).1;
        assert_eq!(
            ev(&d, &[Mlocked, Culled, FolioMlocked]),
            [2048, 2048, folios],
            "mlock of {folio} B folios"
        );
        let d = counted(&m, || cpu.munlock(p, a, 8 * M)).1;
        assert_eq!(
            ev(
                &d,
                &[Munlocked, Rescued, FolioMunlocked, usermm::Ev::Stranded]
            ),
            [2048, 2048, folios, 0],
            "munlock of {folio} B folios"
        );
        cpu.munmap(p, a, 8 * M).expect("munmap");
        valid(&m);
    }
}
