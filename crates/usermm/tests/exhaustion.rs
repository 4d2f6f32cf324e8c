//! Running the simulated machine out of memory, out of commit, out of VMAs, and absurd sizes.
//!
//! The engine's out-of-memory policy: a system call that cannot get memory fails with
//! `ENOMEM` (or `EAGAIN` where Linux uses it) and changes nothing it would have to undo; a
//! page fault that cannot get a frame or a page table delivers `SIGBUS` to the faulting access
//! (`Signal::Bus`). Linux would run the OOM killer instead; the engine has none, and SIGBUS is
//! what Linux gives when a fault's allocation fails without one (hugetlb, a memcg at its limit
//! with the OOM killer disabled). Nothing else is affected: other pages keep their data,
//! `validate()` stays clean, and freeing memory lets the same access succeed.

mod common;
use common::*;
use usermm::pgtable::TASK_SIZE;
use usermm::{
    Access, Advice, Errno, MmapArgs, MremapFlags, Placement, Privilege, Signal, ThpPolicy,
};

const A: u64 = 0x10_0000_0000;
/// The highest page of the 64-bit space.
const TOP: u64 = !4095;

fn at(addr: u64, len: u64) -> MmapArgs {
    MmapArgs {
        placement: Placement::Fixed(addr),
        ..MmapArgs::anon(len, RW)
    }
}

fn norserve(len: u64) -> MmapArgs {
    MmapArgs {
        noreserve: true,
        stack: false,
        ..at(A, len)
    }
}

/// Writes page by page until the machine runs out; returns the address that got SIGBUS.
fn write_until_sigbus(cpu: &usermm::Cpu<'_>, pid: u32, start: u64, len: u64) -> u64 {
    let mut a = start;
    while a < start + len {
        match cpu.write_fill(pid, a, 4 * K, 0xab) {
            Ok(()) => a += 4 * K,
            Err(Signal::Bus(at)) => {
                assert_eq!(at, a, "SIGBUS names the faulting address");
                return at;
            }
            Err(s) => panic!("write at {a:#x}: {s}"),
        }
    }
    panic!("{len:#x} bytes fit in a machine that is smaller");
}

fn machine_with(mem: u64, f: impl FnOnce(&mut usermm::Tunables)) -> usermm::Machine {
    let mut cfg = usermm::MachineConfig {
        memory: mem,
        ..usermm::MachineConfig::default()
    };
    cfg.tunables.check_tlb = true;
    f(&mut cfg.tunables);
    usermm::Machine::new(cfg)
}

/// Exits every process from CPU 1 (the tests hold CPU 0) and checks that nothing leaked.
fn exit_all_and_check_no_leak(m: &usermm::Machine) {
    let cpu = m.enter_cpu(1).unwrap();
    for t in m.tasks() {
        cpu.exit(t.pid).unwrap();
    }
    cpu.lru_add_drain_all();
    valid(m);
    assert_eq!(m.phys.allocated_frames(), 0, "frames leaked");
}

#[test]
fn writing_more_than_ram_gives_sigbus_and_freeing_memory_recovers() {
    let m = machine(16 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    // 64 MiB does not fit in 16 MiB of RAM: only MAP_NORESERVE lets it be mapped.
    assert_eq!(cpu.mmap(p, at(A, 64 * M)), Err(Errno::ENOMEM));
    assert_eq!(cpu.mmap(p, norserve(64 * M)), Ok(A));
    let bus = write_until_sigbus(&cpu, p, A, 64 * M);
    assert!(
        bus > A + 8 * M,
        "most of RAM was usable before SIGBUS ({bus:#x})"
    );
    assert!(m.phys.free_frames() < 8, "SIGBUS only once memory is gone");
    valid(&m);
    // The process is alive, its data intact, and the failing page still unpopulated.
    assert_eq!(cpu.find_mismatch(p, A, bus - A, 0xab), Ok(None));
    assert_eq!(cpu.write_fill(p, bus, 1, 0xab), Err(Signal::Bus(bus)));
    // Freeing memory makes the same access succeed.
    cpu.munmap(p, A, 4 * M).unwrap();
    cpu.write_fill(p, bus, 4 * K, 0xcd).unwrap();
    assert_eq!(cpu.find_mismatch(p, bus, 4 * K, 0xcd), Ok(None));
    valid(&m);
    exit_all_and_check_no_leak(&m);
}

#[test]
fn thp_and_mthp_fall_back_to_small_pages_before_sigbus() {
    let m = machine_with(16 * M, |t| {
        t.thp.top = ThpPolicy::Always;
        t.thp.set_size(64 * K, ThpPolicy::Always).unwrap();
    });
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    cpu.mmap(p, norserve(64 * M)).unwrap();
    let bus = write_until_sigbus(&cpu, p, A, 64 * M);
    // Large folios ran out first; the last pages before SIGBUS are small folios.
    assert_eq!(cpu.folio_order(p, bus - 4 * K), Ok(Some(0)));
    assert!(m.phys.free_frames() < 8);
    valid(&m);
    assert_eq!(cpu.find_mismatch(p, A, bus - A, 0xab), Ok(None));
    // Reads of untouched memory still work: they map the shared zero page.
    let mut buf = [1u8; 16];
    if cpu.read_bytes(p, bus + 4 * M, &mut buf).is_ok() {
        assert_eq!(buf, [0; 16]);
    }
    exit_all_and_check_no_leak(&m);
}

#[test]
fn fork_under_memory_pressure_succeeds_or_fails_with_enomem_and_cow_gets_sigbus() {
    for fill in [9 * M, 12 * M, 14 * M, 15 * M] {
        let m = machine(16 * M);
        let cpu = m.enter_cpu(0).unwrap();
        let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
        cpu.mmap(p, norserve(16 * M)).unwrap();
        let mut written = 0;
        while written < fill {
            if cpu.write_fill(p, A + written, 4 * K, 0x5a).is_err() {
                break;
            }
            written += 4 * K;
        }
        let mut children = Vec::new();
        loop {
            match cpu.fork(p) {
                Ok(c) => children.push(c),
                Err(e) => {
                    assert_eq!(e, Errno::ENOMEM, "fork fails for lack of memory");
                    break;
                }
            }
            if children.len() % 16 == 0 {
                valid(&m);
            }
            assert!(children.len() < 4096, "every child needs page tables");
        }
        valid(&m);
        // The parent is unchanged by the failed fork.
        assert_eq!(cpu.find_mismatch(p, A, written, 0x5a), Ok(None));
        // Children copy on write until memory runs out, then get SIGBUS.
        for &c in &children {
            let mut a = A;
            while a < A + written {
                match cpu.write_fill(c, a, 4 * K, 0xc0) {
                    Ok(()) => a += 4 * K,
                    Err(Signal::Bus(at)) => {
                        assert_eq!(at, a);
                        break;
                    }
                    Err(s) => panic!("child write: {s}"),
                }
            }
            assert_eq!(cpu.find_mismatch(c, A, a - A, 0xc0), Ok(None));
        }
        valid(&m);
        assert_eq!(cpu.find_mismatch(p, A, written, 0x5a), Ok(None));
        exit_all_and_check_no_leak(&m);
    }
}

#[test]
fn spawning_until_no_page_table_is_left_gives_enomem() {
    let m = machine(8 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let mut n = 0;
    loop {
        match cpu.spawn(Privilege::Ordinary, 8 * M) {
            Ok(_) => n += 1,
            Err(e) => {
                assert_eq!(e, Errno::ENOMEM);
                break;
            }
        }
        assert!(n <= 2048, "8 MiB holds at most 2048 root tables");
    }
    assert!(n > 2000, "every free frame became a root table ({n})");
    valid(&m);
    exit_all_and_check_no_leak(&m);
}

#[test]
fn overcommit_heuristic_refuses_one_mapping_larger_than_ram() {
    let m = machine(16 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    assert_eq!(cpu.mmap(p, at(A, 16 * M + 4 * K)), Err(Errno::ENOMEM));
    assert_eq!(cpu.mmap(p, at(A, 16 * M)), Ok(A));
    // Each mapping is judged alone under the heuristic.
    assert_eq!(cpu.mmap(p, at(A + 32 * M, 16 * M)), Ok(A + 32 * M));
    // Read-only or norserve mappings are not charged at all.
    let ro = MmapArgs {
        placement: Placement::Fixed(A + 64 * M),
        ..MmapArgs::anon(1 << 30, RO)
    };
    assert_eq!(cpu.mmap(p, ro), Ok(A + 64 * M));
    valid(&m);
    exit_all_and_check_no_leak(&m);
    assert_eq!(m.committed.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn strict_overcommit_refuses_mmap_mprotect_mremap_brk_and_fork_beyond_the_limit() {
    let m = machine_with(16 * M, |t| t.overcommit_memory = 2);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    // The limit is half of RAM (overcommit_ratio 50, no swap).
    assert_eq!(cpu.mmap(p, at(A, 8 * M + 4 * K)), Err(Errno::ENOMEM));
    assert_eq!(cpu.mmap(p, at(A, 6 * M)), Ok(A));
    cpu.write_fill(p, A, 6 * M, 0x42).unwrap();
    assert_eq!(cpu.mmap(p, at(A + 16 * M, 4 * M)), Err(Errno::ENOMEM));
    // Making a read-only private mapping writable charges it.
    let ro = MmapArgs {
        placement: Placement::Fixed(A + 32 * M),
        ..MmapArgs::anon(4 * M, RO)
    };
    assert_eq!(cpu.mmap(p, ro), Ok(A + 32 * M));
    assert_eq!(cpu.mprotect(p, A + 32 * M, 4 * M, RW), Err(Errno::ENOMEM));
    // Growing in place is charged too.
    assert_eq!(
        cpu.mremap(p, A, 6 * M, 10 * M, MremapFlags::default()),
        Err(Errno::ENOMEM)
    );
    // brk reports failure by leaving the break where it was.
    let brk0 = cpu.brk(p, 0).unwrap();
    assert_eq!(cpu.brk(p, brk0 + 4 * M), Ok(brk0));
    // MAP_NORESERVE is ignored in strict mode.
    let nr = MmapArgs {
        noreserve: true,
        stack: false,
        ..at(A + 48 * M, 4 * M)
    };
    assert_eq!(cpu.mmap(p, nr), Err(Errno::ENOMEM));
    // The child would need another 6 MiB of commit.
    assert_eq!(cpu.fork(p), Err(Errno::ENOMEM));
    valid(&m);
    assert_eq!(cpu.find_mismatch(p, A, 6 * M, 0x42), Ok(None));
    assert_eq!(m.tasks().len(), 1, "no child was left behind");
    // Unmapping returns the charge.
    cpu.munmap(p, A, 6 * M).unwrap();
    assert_eq!(cpu.mmap(p, at(A, 6 * M)), Ok(A));
    exit_all_and_check_no_leak(&m);
    assert_eq!(m.committed.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn the_map_count_limit_gives_enomem_for_mmap_munmap_mprotect_and_eagain_for_madvise() {
    let m = machine_with(16 * M, |t| t.max_map_count = 16);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let mut n = 0u64;
    // Separate mappings (a gap between each) until the limit: Linux refuses a new one once
    // the count is above the limit.
    loop {
        match cpu.mmap(p, at(A + n * 16 * K, 12 * K)) {
            Ok(_) => n += 1,
            Err(e) => {
                assert_eq!(e, Errno::ENOMEM);
                break;
            }
        }
        assert!(n <= 17);
    }
    assert_eq!(n, 17);
    assert_eq!(cpu.maps(p).unwrap().len() as u64, n);
    // Anything that splits a mapping needs one more VMA.
    assert_eq!(cpu.munmap(p, A + 4 * K, 4 * K), Err(Errno::ENOMEM));
    assert_eq!(cpu.mprotect(p, A, 4 * K, RO), Err(Errno::ENOMEM));
    assert_eq!(
        cpu.madvise(p, A, 4 * K, Advice::DontFork),
        Err(Errno::EAGAIN)
    );
    assert_eq!(cpu.maps(p).unwrap().len() as u64, n, "nothing was split");
    // Unmapping whole mappings makes room again.
    cpu.munmap(p, A, 32 * K).unwrap();
    assert_eq!(cpu.mprotect(p, A + 32 * K, 4 * K, RO), Ok(()));
    valid(&m);
    exit_all_and_check_no_leak(&m);
}

#[test]
fn absurd_sizes_get_linux_errnos() {
    let m = machine(16 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let a = cpu.mmap(p, at(A, 64 * K)).unwrap();
    cpu.write_fill(p, a, 64 * K, 7).unwrap();
    let huge = [
        u64::MAX,
        u64::MAX - 4095,
        u64::MAX - 4096,
        1 << 63,
        TASK_SIZE + 4096,
    ];
    for len in huge {
        // do_mmap: PAGE_ALIGN wrapping to 0, or more than TASK_SIZE: ENOMEM.
        assert_eq!(
            cpu.mmap(p, MmapArgs::anon(len, RW)),
            Err(Errno::ENOMEM),
            "mmap {len:#x}"
        );
        let nr = MmapArgs {
            noreserve: true,
            stack: false,
            ..MmapArgs::anon(len, RW)
        };
        assert_eq!(
            cpu.mmap(p, nr),
            Err(Errno::ENOMEM),
            "mmap norserve {len:#x}"
        );
        // do_vmi_munmap: len > TASK_SIZE - start: EINVAL.
        assert_eq!(cpu.munmap(p, a, len), Err(Errno::EINVAL), "munmap {len:#x}");
        // madvise: end wraps: EINVAL.
        if len > u64::MAX - 4095 || a.checked_add((len + 4095) & !4095).is_none() {
            assert_eq!(
                cpu.madvise(p, a, len, Advice::DontNeed),
                Err(Errno::EINVAL),
                "madvise {len:#x}"
            );
        }
        // mprotect: end <= start, or a hole after the mapping: ENOMEM (in the second case the
        // mapping itself has become read-only, as in Linux).
        assert_eq!(
            cpu.mprotect(p, a, len, RO),
            Err(Errno::ENOMEM),
            "mprotect {len:#x}"
        );
        // mremap: a new length wrapping to 0 is EINVAL; one beyond TASK_SIZE cannot be
        // satisfied (EINVAL or ENOMEM).
        let r = cpu.mremap(p, a, 64 * K, len, MremapFlags::default());
        if len > u64::MAX - 4095 {
            assert_eq!(r, Err(Errno::EINVAL), "mremap {len:#x}");
        } else {
            assert!(
                matches!(r, Err(Errno::EINVAL | Errno::ENOMEM)),
                "mremap {len:#x}: {r:?}"
            );
        }
        // Accesses wrap or run off the mapping: SIGSEGV, never a host fault.
        assert!(matches!(cpu.write_fill(p, a, len, 1), Err(Signal::Segv(_))));
        assert!(matches!(
            cpu.touch(p, a, len, Access::Read),
            Err(Signal::Segv(_))
        ));
    }
    // MAP_FIXED at the top of the address space.
    let top = MmapArgs {
        placement: Placement::Fixed(TOP),
        ..MmapArgs::anon(4 * K, RW)
    };
    assert_eq!(cpu.mmap(p, top), Err(Errno::ENOMEM));
    let over = MmapArgs {
        placement: Placement::Fixed(TASK_SIZE),
        ..MmapArgs::anon(8 * K, RW)
    };
    assert_eq!(cpu.mmap(p, over), Err(Errno::ENOMEM));
    // A hint out of range is ignored.
    let hint = MmapArgs {
        placement: Placement::Hint(TOP),
        ..MmapArgs::anon(4 * K, RW)
    };
    assert!(cpu.mmap(p, hint).is_ok_and(|x| x < TASK_SIZE));
    // munmap far above the address space: EINVAL.
    assert_eq!(cpu.munmap(p, TOP, 4 * K), Err(Errno::EINVAL));
    // mlock: PAGE_ALIGN(len) wraps to 0, which locks nothing and succeeds, as in Linux.
    assert_eq!(cpu.mlock(p, a, u64::MAX), Ok(()));
    // brk far away or below the heap start: the break does not move.
    let brk0 = cpu.brk(p, 0).unwrap();
    assert_eq!(cpu.brk(p, u64::MAX), Ok(brk0));
    assert_eq!(cpu.brk(p, TASK_SIZE + 4096), Ok(brk0));
    assert_eq!(cpu.brk(p, 1), Ok(brk0));
    // Pins of absurd ranges (io_uring refuses them with EINVAL, EFAULT or EOVERFLOW).
    let r = cpu.pin(p, a, u64::MAX);
    assert!(
        matches!(r, Err(Errno::EINVAL | Errno::EFAULT | Errno::EOVERFLOW)),
        "{r:?}"
    );
    // The data is intact.
    assert_eq!(cpu.find_mismatch(p, a, 64 * K, 7), Ok(None));
    valid(&m);
    exit_all_and_check_no_leak(&m);
}
