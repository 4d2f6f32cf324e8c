//! Errno of bad input, after the error tables of LTP's mmap01..mmap20, munmap03, mprotect01,
//! mremap01..mremap05 and madvise02: each case checks the exact errno and that nothing else
//! changed (maps, status, the bytes of every mapping), and that the machine is consistent.
//!
//! Tests marked `#[ignore = "engine differs from Linux: ..."]` are written to Linux's behaviour
//! (mm/mremap.c, mm/mmap.c, mm/gup.c of 6.x) where the engine does something else; the section
//! before them holds corner cases where the engine used to differ and now follows Linux.

mod common;
use common::*;
use usermm::machine::START_BRK;
use usermm::pgtable::TASK_SIZE;
use usermm::vma::VmFlags;
use usermm::{
    Access, Advice, Cpu, Errno, Machine, MmapArgs, MremapFlags, Pid, Placement, Privilege, Prot,
    Sharing, Signal, SysResult,
};

/// Private read-write, filled with 0xa1.
const A: u64 = 0x1000_0000;
const A_LEN: u64 = 64 * K;
/// Shared read-write, filled with 0xb2; 64K of hole before it.
const B: u64 = 0x1002_0000;
const B_LEN: u64 = 32 * K;
/// Private read-only, filled with 0xc3 before the mprotect; 96K of hole before it.
const C: u64 = 0x1004_0000;
const C_LEN: u64 = 16 * K;
/// The fixture's mappings and their bytes.
const FILLED: [(u64, u64, u8); 3] = [(A, A_LEN, 0xa1), (B, B_LEN, 0xb2), (C, C_LEN, 0xc3)];
/// A page in the hole between A and B.
const HOLE: u64 = A + A_LEN;

const MAYMOVE: MremapFlags = MremapFlags {
    maymove: true,
    fixed: None,
    dontunmap: false,
};

fn fixed(addr: u64, len: u64) -> MmapArgs {
    MmapArgs {
        placement: Placement::Fixed(addr),
        ..MmapArgs::anon(len, RW)
    }
}

fn to(addr: u64) -> MremapFlags {
    MremapFlags {
        maymove: true,
        fixed: Some(addr),
        dontunmap: false,
    }
}

/// An ordinary process with the three mappings A, B, C (three VMAs), all bytes written.
fn fixture(cpu: &Cpu<'_>) -> Pid {
    let p = cpu
        .spawn(Privilege::Ordinary, 8 * M)
        .expect("spawn on an empty machine");
    cpu.mmap(p, fixed(A, A_LEN)).expect("map A");
    cpu.mmap(
        p,
        MmapArgs {
            sharing: Sharing::Shared,
            ..fixed(B, B_LEN)
        },
    )
    .expect("map B");
    cpu.mmap(p, fixed(C, C_LEN)).expect("map C");
    for (addr, len, byte) in FILLED {
        cpu.write_fill(p, addr, len, byte).expect("fill");
    }
    cpu.mprotect(p, C, C_LEN, RO).expect("C read-only");
    let perms: Vec<String> = cpu
        .maps(p)
        .expect("maps")
        .into_iter()
        .map(|e| e.perms)
        .collect();
    assert_eq!(perms, ["rw-p", "rw-s", "r--p"], "fixture layout");
    p
}

/// Grows the shared mapping B in place to twice its size: its second half lies beyond the
/// shmem object (which keeps the size of the mmap), where faults raise SIGBUS.
fn grow_shared_beyond_its_object(cpu: &Cpu<'_>, p: Pid) {
    assert_eq!(
        cpu.mremap(p, B, B_LEN, 2 * B_LEN, MremapFlags::default()),
        Ok(B)
    );
}

fn map_count(cpu: &Cpu<'_>, p: Pid) -> u64 {
    cpu.status(p).expect("status").map_count
}

/// Asserts that the bytes of every fixture mapping are intact.
#[track_caller]
fn data_intact(cpu: &Cpu<'_>, p: Pid) {
    for (addr, len, byte) in FILLED {
        assert_eq!(
            cpu.find_mismatch(p, addr, len, byte),
            Ok(None),
            "the bytes of [{addr:#x}, +{len:#x}) changed"
        );
    }
}

/// Runs `call`, asserts it returns `want`, and that maps, status and data did not change.
#[track_caller]
fn no_change<T: std::fmt::Debug + PartialEq>(
    m: &Machine,
    cpu: &Cpu<'_>,
    p: Pid,
    want: SysResult<T>,
    call: impl FnOnce() -> SysResult<T>,
) {
    let maps = cpu.maps(p).expect("maps");
    let status = cpu.status(p).expect("status");
    assert_eq!(call(), want);
    assert_eq!(cpu.maps(p).expect("maps"), maps, "maps changed");
    assert_eq!(cpu.status(p).expect("status"), status, "status changed");
    data_intact(cpu, p);
    valid(m);
}

// ---------------------------------------------------------------------------------------------
// mmap
// ---------------------------------------------------------------------------------------------

#[test]
fn mmap_of_zero_length_is_einval() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    no_change(&m, &cpu, p, Err(Errno::EINVAL), || {
        cpu.mmap(p, MmapArgs::anon(0, RW))
    });
    no_change(&m, &cpu, p, Err(Errno::EINVAL), || {
        cpu.mmap(p, fixed(HOLE, 0))
    });
}

#[test]
fn mmap_fixed_at_an_unaligned_address_is_einval() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    for addr in [A + 1, HOLE + 2048, B + 4095] {
        no_change(&m, &cpu, p, Err(Errno::EINVAL), || {
            cpu.mmap(p, fixed(addr, 4 * K))
        });
        no_change(&m, &cpu, p, Err(Errno::EINVAL), || {
            cpu.mmap(
                p,
                MmapArgs {
                    placement: Placement::FixedNoReplace(addr),
                    ..MmapArgs::anon(4 * K, RW)
                },
            )
        });
    }
}

#[test]
fn mmap_of_an_overflowing_length_is_enomem() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    // PAGE_ALIGN wraps to 0, or the length is larger than the address space.
    for len in [u64::MAX, u64::MAX - 4094, 1 << 63, TASK_SIZE + 4096] {
        no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
            cpu.mmap(p, MmapArgs::anon(len, RW))
        });
        no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
            cpu.mmap(p, fixed(A, len))
        });
    }
    // A fixed range that ends beyond TASK_SIZE.
    no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
        cpu.mmap(p, fixed(TASK_SIZE - 4 * K, 8 * K))
    });
}

#[test]
fn mmap_fixed_below_mmap_min_addr_needs_privilege() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    no_change(&m, &cpu, p, Err(Errno::EPERM), || {
        cpu.mmap(p, fixed(0, 4 * K))
    });
    no_change(&m, &cpu, p, Err(Errno::EPERM), || {
        cpu.mmap(
            p,
            MmapArgs {
                placement: Placement::FixedNoReplace(0),
                ..MmapArgs::anon(4 * K, RW)
            },
        )
    });
    let r = cpu
        .spawn(Privilege::Privileged, 8 * M)
        .expect("spawn privileged");
    assert_eq!(cpu.mmap(r, fixed(0, 4 * K)), Ok(0));
    cpu.write_fill(r, 0, 4 * K, 7).expect("page 0 is usable");
    assert_eq!(cpu.maps(r).expect("maps")[0].start, 0);
    data_intact(&cpu, p);
    valid(&m);
}

#[test]
fn mmap_fixed_noreplace_over_a_mapping_is_eexist() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    let noreplace = |addr, len| MmapArgs {
        placement: Placement::FixedNoReplace(addr),
        ..MmapArgs::anon(len, RW)
    };
    // Inside A, over its end, over all of B, and one page overlapping C's start.
    for (addr, len) in [
        (A + 4 * K, 4 * K),
        (A + A_LEN - 4 * K, 16 * K),
        (B - 4 * K, B_LEN + 8 * K),
        (C - 8 * K, 12 * K),
    ] {
        no_change(&m, &cpu, p, Err(Errno::EEXIST), || {
            cpu.mmap(p, noreplace(addr, len))
        });
    }
    // The hole itself is fine.
    assert_eq!(cpu.mmap(p, noreplace(HOLE, A_LEN)), Ok(HOLE));
    data_intact(&cpu, p);
    valid(&m);
}

#[test]
fn mmap_locked_beyond_rlimit_memlock_is_eagain() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    no_change(&m, &cpu, p, Err(Errno::EAGAIN), || {
        cpu.mmap(
            p,
            MmapArgs {
                locked: true,
                ..MmapArgs::anon(16 * M, RO)
            },
        )
    });
}

#[test]
fn mmap_is_enomem_once_the_map_count_exceeds_the_limit() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    assert_eq!(map_count(&cpu, p), 3);
    m.update_tunables(|t| t.max_map_count = 3);
    // At the limit a fixed mapping in the middle of A needs a split: refused.
    no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
        cpu.mmap(
            p,
            MmapArgs {
                prot: RO,
                ..fixed(A + 16 * K, 4 * K)
            },
        )
    });
    // At the limit (not above it) a new mapping is still allowed ...
    let d = cpu
        .mmap(p, fixed(0x2000_0000, 4 * K))
        .expect("count == limit still maps");
    assert_eq!(d, 0x2000_0000);
    assert_eq!(map_count(&cpu, p), 4);
    // ... but above it nothing is, not even one that would merge.
    no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
        cpu.mmap(p, fixed(0x3000_0000, 4 * K))
    });
    no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
        cpu.mmap(p, fixed(A + A_LEN, 4 * K))
    });
    no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
        cpu.mmap(p, MmapArgs::anon(4 * K, RW))
    });
}

// ---------------------------------------------------------------------------------------------
// munmap
// ---------------------------------------------------------------------------------------------

#[test]
fn munmap_of_bad_ranges_is_einval() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    for (addr, len) in [
        (A + 1, 4 * K),
        (A + 2048, A_LEN),
        (A, 0),
        (HOLE, 0),
        (A, u64::MAX),
        (A, u64::MAX - A - 4095),
        (TASK_SIZE - 4 * K, 8 * K),
        (TASK_SIZE + 4 * K, 4 * K),
        (!4095, 4 * K),
    ] {
        no_change(&m, &cpu, p, Err(Errno::EINVAL), || cpu.munmap(p, addr, len));
    }
    // Unmapping a hole is not an error.
    no_change(&m, &cpu, p, Ok(()), || cpu.munmap(p, HOLE, 16 * K));
}

#[test]
fn munmap_punching_a_hole_at_the_map_count_limit_is_enomem() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    m.update_tunables(|t| t.max_map_count = 3);
    no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
        cpu.munmap(p, A + 16 * K, 4 * K)
    });
    // Trimming an end splits only temporarily: allowed at the limit.
    assert_eq!(cpu.munmap(p, A, 4 * K), Ok(()));
    assert_eq!(cpu.munmap(p, B + B_LEN - 4 * K, 4 * K), Ok(()));
    assert_eq!(map_count(&cpu, p), 3);
    assert_eq!(
        cpu.touch(p, A, 1, Access::Read),
        Err(Signal::Segv(A)),
        "the head of A is gone"
    );
    assert_eq!(
        cpu.find_mismatch(p, A + 4 * K, A_LEN - 4 * K, 0xa1),
        Ok(None)
    );
    valid(&m);
}

// ---------------------------------------------------------------------------------------------
// mprotect
// ---------------------------------------------------------------------------------------------

#[test]
fn mprotect_at_an_unaligned_address_is_einval() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    for addr in [A + 1, A + 2048, B + 4095] {
        no_change(&m, &cpu, p, Err(Errno::EINVAL), || {
            cpu.mprotect(p, addr, 4 * K, RO)
        });
    }
    // Even with a zero length: the address is checked first.
    no_change(&m, &cpu, p, Err(Errno::EINVAL), || {
        cpu.mprotect(p, A + 1, 0, RO)
    });
}

#[test]
fn mprotect_of_zero_length_succeeds_and_changes_nothing() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    no_change(&m, &cpu, p, Ok(()), || cpu.mprotect(p, A, 0, Prot::NONE));
    no_change(&m, &cpu, p, Ok(()), || cpu.mprotect(p, HOLE, 0, RO));
}

#[test]
fn mprotect_of_an_overflowing_range_is_enomem() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    for len in [u64::MAX, u64::MAX - 4094, u64::MAX - A + 1] {
        no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
            cpu.mprotect(p, A, len, RO)
        });
    }
}

#[test]
fn mprotect_starting_in_a_hole_is_enomem_and_changes_nothing() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
        cpu.mprotect(p, HOLE, 4 * K, RO)
    });
    // From the hole into B: nothing is applied to B.
    no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
        cpu.mprotect(p, B - 4 * K, 8 * K, RO)
    });
    // Beyond every mapping.
    no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
        cpu.mprotect(p, 0x7000_0000, 4 * K, RO)
    });
}

#[test]
fn mprotect_over_a_hole_applies_up_to_the_hole() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    let before = cpu.maps(p).expect("maps");
    // A, the hole, B: A changes, B does not.
    assert_eq!(cpu.mprotect(p, A, B + B_LEN - A, RO), Err(Errno::ENOMEM));
    let maps = cpu.maps(p).expect("maps");
    assert_eq!(maps.len(), 3);
    assert_eq!((maps[0].start, maps[0].end), (A, A + A_LEN));
    assert_eq!(maps[0].perms, "r--p", "the part before the hole is changed");
    assert_eq!(maps[1], before[1], "B, after the hole, is not");
    assert_eq!(maps[2], before[2]);
    assert_eq!(cpu.write_fill(p, A, 1, 0), Err(Signal::Segv(A)));
    cpu.write_fill(p, B, 1, 0xb2).expect("B is still writable");
    data_intact(&cpu, p);
    valid(&m);
    // A range that starts in A's second half and runs past the last mapping: the tail of A
    // becomes PROT_NONE (a split), then ENOMEM.
    assert_eq!(
        cpu.mprotect(p, A + 32 * K, 0x100_0000, Prot::NONE),
        Err(Errno::ENOMEM)
    );
    let maps = cpu.maps(p).expect("maps");
    assert_eq!(
        maps.iter()
            .map(|e| (e.start, e.end, e.perms.as_str()))
            .collect::<Vec<_>>(),
        [
            (A, A + 32 * K, "r--p"),
            (A + 32 * K, A + A_LEN, "---p"),
            (B, B + B_LEN, "rw-s"),
            (C, C + C_LEN, "r--p"),
        ]
    );
    assert_eq!(
        cpu.touch(p, A + 32 * K, 1, Access::Read),
        Err(Signal::Segv(A + 32 * K))
    );
    valid(&m);
}

#[test]
fn mprotect_split_at_the_map_count_limit_is_enomem() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    m.update_tunables(|t| t.max_map_count = 3);
    // The middle, the head and the tail of A all need a split.
    for (addr, len) in [(A + 16 * K, 4 * K), (A, 4 * K), (A + A_LEN - 4 * K, 4 * K)] {
        no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
            cpu.mprotect(p, addr, len, RO)
        });
    }
    // The whole of A needs none.
    assert_eq!(cpu.mprotect(p, A, A_LEN, RO), Ok(()));
    assert_eq!(cpu.maps(p).expect("maps")[0].perms, "r--p");
    data_intact(&cpu, p);
    valid(&m);
}

#[test]
fn mprotect_of_a_middle_piece_one_below_the_limit_keeps_the_first_split() {
    // vma_modify() splits at the start (allowed), then at the end (refused): Linux returns
    // ENOMEM and leaves A in two pieces with the old protection.
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    m.update_tunables(|t| t.max_map_count = 4);
    assert_eq!(cpu.mprotect(p, A + 16 * K, 4 * K, RO), Err(Errno::ENOMEM));
    let maps = cpu.maps(p).expect("maps");
    assert_eq!(
        maps.iter()
            .map(|e| (e.start, e.end, e.perms.as_str()))
            .collect::<Vec<_>>(),
        [
            (A, A + 16 * K, "rw-p"),
            (A + 16 * K, A + A_LEN, "rw-p"),
            (B, B + B_LEN, "rw-s"),
            (C, C + C_LEN, "r--p"),
        ]
    );
    data_intact(&cpu, p);
    cpu.write_fill(p, A + 16 * K, 4 * K, 0xa1)
        .expect("the protection did not change");
    valid(&m);
}

// ---------------------------------------------------------------------------------------------
// madvise
// ---------------------------------------------------------------------------------------------

#[test]
fn madvise_of_bad_ranges_is_einval() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    for (addr, len) in [
        (A + 1, 4 * K),
        (A + 2048, 0),
        (A, u64::MAX),
        (A, u64::MAX - 4094),
        (A, u64::MAX - A + 1),
    ] {
        for advice in [Advice::DontNeed, Advice::DontFork, Advice::HugePage] {
            no_change(&m, &cpu, p, Err(Errno::EINVAL), || {
                cpu.madvise(p, addr, len, advice)
            });
        }
    }
    // A zero length is a successful no-op, even over a hole.
    no_change(&m, &cpu, p, Ok(()), || {
        cpu.madvise(p, HOLE, 0, Advice::DontNeed)
    });
}

#[test]
fn madvise_over_a_hole_applies_to_the_mapped_parts_and_is_enomem() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    // Only a hole: nothing to apply.
    no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
        cpu.madvise(p, HOLE, 16 * K, Advice::DontFork)
    });
    // A, the hole, B, the hole, C.
    assert_eq!(
        cpu.madvise(p, A, C + C_LEN - A, Advice::DontFork),
        Err(Errno::ENOMEM)
    );
    let maps = cpu.maps(p).expect("maps");
    assert_eq!(maps.len(), 3);
    assert!(
        maps.iter().all(|e| e.flags & VmFlags::DONTCOPY != 0),
        "every mapped part got the advice: {maps:?}"
    );
    data_intact(&cpu, p);
    // DONTNEED over a hole zaps the private pages it reaches, keeps the shared ones.
    assert_eq!(
        cpu.madvise(p, A + 32 * K, B + B_LEN - A - 32 * K, Advice::DontNeed),
        Err(Errno::ENOMEM)
    );
    assert_eq!(cpu.find_mismatch(p, A, 32 * K, 0xa1), Ok(None));
    assert_eq!(cpu.find_mismatch(p, A + 32 * K, 32 * K, 0), Ok(None));
    assert_eq!(cpu.find_mismatch(p, B, B_LEN, 0xb2), Ok(None));
    valid(&m);
}

#[test]
fn madvise_wipeonfork_on_shared_memory_is_einval() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    no_change(&m, &cpu, p, Err(Errno::EINVAL), || {
        cpu.madvise(p, B, B_LEN, Advice::WipeOnFork)
    });
    // Over A, the hole and B: A is advised, then B stops the walk with EINVAL (not ENOMEM).
    assert_eq!(
        cpu.madvise(p, A, B + B_LEN - A, Advice::WipeOnFork),
        Err(Errno::EINVAL)
    );
    let maps = cpu.maps(p).expect("maps");
    assert!(maps[0].flags & VmFlags::WIPEONFORK != 0, "{maps:?}");
    assert!(maps[1].flags & VmFlags::WIPEONFORK == 0, "{maps:?}");
    data_intact(&cpu, p);
    valid(&m);
}

#[test]
fn madvise_split_at_the_map_count_limit_is_eagain() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    m.update_tunables(|t| t.max_map_count = 3);
    for advice in [Advice::DontFork, Advice::WipeOnFork, Advice::HugePage] {
        no_change(&m, &cpu, p, Err(Errno::EAGAIN), || {
            cpu.madvise(p, A + 16 * K, 4 * K, advice)
        });
    }
    // DONTNEED changes no flags: no split, no error.
    assert_eq!(cpu.madvise(p, A + 16 * K, 4 * K, Advice::DontNeed), Ok(()));
    valid(&m);
}

// ---------------------------------------------------------------------------------------------
// mremap
// ---------------------------------------------------------------------------------------------

#[test]
fn mremap_with_bad_arguments_is_einval() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    let plain = MremapFlags::default();
    let cases: [(u64, u64, u64, MremapFlags); 10] = [
        // Unaligned old address.
        (A + 1, 4 * K, 8 * K, MAYMOVE),
        // New length zero (also after rounding an overflowing length).
        (A, A_LEN, 0, MAYMOVE),
        (A, A_LEN, u64::MAX, MAYMOVE),
        // FIXED without MAYMOVE.
        (
            A,
            A_LEN,
            A_LEN,
            MremapFlags {
                maymove: false,
                fixed: Some(0x3000_0000),
                dontunmap: false,
            },
        ),
        // Unaligned new address.
        (A, A_LEN, A_LEN, to(0x3000_0001)),
        // The new range overlaps the old one (either end).
        (A, A_LEN, A_LEN, to(A + 16 * K)),
        (A, A_LEN, A_LEN, to(A - 16 * K)),
        (A, 4 * K, A_LEN, to(A - 32 * K)),
        // The new range is beyond TASK_SIZE.
        (A, A_LEN, 8 * K, to(TASK_SIZE - 4 * K)),
        // old_len 0 duplicates only shared mappings.
        (A, 0, 8 * K, MAYMOVE),
    ];
    for (addr, old, new, flags) in cases {
        no_change(&m, &cpu, p, Err(Errno::EINVAL), || {
            cpu.mremap(p, addr, old, new, flags)
        });
    }
    no_change(&m, &cpu, p, Err(Errno::EINVAL), || {
        cpu.mremap(p, A, 0, 8 * K, plain)
    });
    // Shrinking with an old length that runs past the address space: the tail's unmap is
    // refused (EINVAL), B and C stay. It used to wrap and unmap them.
    for old in [0xffff_0000_0000, 0xffff_ffff_ffff_f000, TASK_SIZE] {
        for flags in [plain, MAYMOVE] {
            no_change(&m, &cpu, p, Err(Errno::EINVAL), || {
                cpu.mremap(p, A, old, 8 * K, flags)
            });
        }
    }
}

#[test]
fn mremap_of_an_unmapped_address_is_efault() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    for flags in [MremapFlags::default(), MAYMOVE, to(0x3000_0000)] {
        no_change(&m, &cpu, p, Err(Errno::EFAULT), || {
            cpu.mremap(p, HOLE, 4 * K, 8 * K, flags)
        });
        no_change(&m, &cpu, p, Err(Errno::EFAULT), || {
            cpu.mremap(p, HOLE, 8 * K, 4 * K, flags)
        });
    }
}

#[test]
fn mremap_growing_a_range_that_spans_two_vmas_is_efault() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    // A and the hole after it.
    for flags in [MremapFlags::default(), MAYMOVE] {
        no_change(&m, &cpu, p, Err(Errno::EFAULT), || {
            cpu.mremap(p, A, A_LEN + 4 * K, A_LEN + 64 * K, flags)
        });
    }
    // Two adjacent VMAs: A split by a protection change.
    cpu.mprotect(p, A + 32 * K, 32 * K, RO).expect("split A");
    for flags in [MremapFlags::default(), MAYMOVE] {
        no_change(&m, &cpu, p, Err(Errno::EFAULT), || {
            cpu.mremap(p, A, A_LEN, 2 * A_LEN, flags)
        });
    }
}

#[test]
fn mremap_growing_in_place_without_maymove_is_enomem_when_the_next_page_is_taken() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    // A can grow by the 64K hole, not by one page more (B starts there).
    no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
        cpu.mremap(p, A, A_LEN, A_LEN + 68 * K, MremapFlags::default())
    });
    // A range that does not end at the end of its VMA cannot grow in place either.
    no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
        cpu.mremap(p, A, 16 * K, 32 * K, MremapFlags::default())
    });
    // The hole itself is enough.
    assert_eq!(
        cpu.mremap(p, A, A_LEN, A_LEN + 64 * K, MremapFlags::default()),
        Ok(A)
    );
    assert_eq!(cpu.find_mismatch(p, A + A_LEN, 64 * K, 0), Ok(None));
    data_intact(&cpu, p);
    valid(&m);
}

#[test]
fn mremap_fixed_onto_a_mapping_replaces_it() {
    // mremap05: MREMAP_FIXED over an existing mapping unmaps it first.
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    assert_eq!(cpu.mremap(p, C, C_LEN, C_LEN, to(A)), Ok(A));
    let maps = cpu.maps(p).expect("maps");
    assert_eq!(
        maps.iter()
            .map(|e| (e.start, e.end, e.perms.as_str()))
            .collect::<Vec<_>>(),
        [
            (A, A + C_LEN, "r--p"),
            (A + C_LEN, A + A_LEN, "rw-p"),
            (B, B + B_LEN, "rw-s")
        ]
    );
    assert_eq!(cpu.find_mismatch(p, A, C_LEN, 0xc3), Ok(None));
    assert_eq!(
        cpu.find_mismatch(p, A + C_LEN, A_LEN - C_LEN, 0xa1),
        Ok(None)
    );
    assert_eq!(cpu.touch(p, C, 1, Access::Read), Err(Signal::Segv(C)));
    valid(&m);
}

// ---------------------------------------------------------------------------------------------
// brk, pins
// ---------------------------------------------------------------------------------------------

#[test]
fn brk_below_its_start_returns_the_old_break() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    assert_eq!(cpu.brk(p, 0), Ok(START_BRK));
    assert_eq!(
        cpu.brk(p, START_BRK + 64 * K + 100),
        Ok(START_BRK + 64 * K + 100)
    );
    cpu.write_fill(p, START_BRK, 64 * K, 0x5b).expect("heap");
    let cur = START_BRK + 64 * K + 100;
    for req in [START_BRK - 4 * K, START_BRK - 1, 1, 0] {
        no_change(&m, &cpu, p, Ok(cur), || cpu.brk(p, req));
    }
    assert_eq!(cpu.find_mismatch(p, START_BRK, 64 * K, 0x5b), Ok(None));
}

#[test]
fn unpin_of_something_never_pinned_is_einval() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    no_change(&m, &cpu, p, Err(Errno::EINVAL), || cpu.unpin(p, A, 4 * K));
    cpu.pin(p, A, 8 * K).expect("pin two pages of A");
    // Only the exact (addr, len) of a pin releases it.
    for (addr, len) in [(A, 4 * K), (A + 4 * K, 4 * K), (A, 16 * K), (B, 8 * K)] {
        no_change(&m, &cpu, p, Err(Errno::EINVAL), || cpu.unpin(p, addr, len));
    }
    assert_eq!(cpu.status(p).expect("status").vm_pin, 8 * K);
    assert_eq!(cpu.unpin(p, A, 8 * K), Ok(()));
    no_change(&m, &cpu, p, Err(Errno::EINVAL), || cpu.unpin(p, A, 8 * K));
}

#[test]
fn pin_of_an_unaligned_address_pins_every_page_it_touches() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    cpu.pin(p, A + 1, 4 * K)
        .expect("io_uring takes unaligned buffers");
    assert_eq!(cpu.status(p).expect("status").vm_pin, 8 * K);
    no_change(&m, &cpu, p, Err(Errno::EINVAL), || cpu.unpin(p, A, 4 * K));
    assert_eq!(cpu.unpin(p, A + 1, 4 * K), Ok(()));
    assert_eq!(cpu.status(p).expect("status").vm_pin, 0);
    m.validate().expect("valid");
}

#[test]
fn pin_of_an_unmapped_or_read_only_range_is_efault() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    for (addr, len) in [
        (HOLE, 4 * K),
        (A + A_LEN - 4 * K, 8 * K),
        (B - 4 * K, 8 * K),
        (C, 4 * K),
    ] {
        no_change(&m, &cpu, p, Err(Errno::EFAULT), || cpu.pin(p, addr, len));
    }
    // io_uring's buffer checks: an empty buffer, a null address and one over 1 GiB are
    // EFAULT before any page is touched (a 254 GiB pin used to abort the process allocating
    // its page list); a wrapping range is EOVERFLOW.
    no_change(&m, &cpu, p, Err(Errno::EFAULT), || cpu.pin(p, A, 0));
    no_change(&m, &cpu, p, Err(Errno::EFAULT), || cpu.pin(p, 0, 4 * K));
    no_change(&m, &cpu, p, Err(Errno::EFAULT), || {
        cpu.pin(p, A, (1 << 30) + 4 * K)
    });
    no_change(&m, &cpu, p, Err(Errno::EFAULT), || {
        cpu.pin(p, A, 0x7f00_0000_0000)
    });
    no_change(&m, &cpu, p, Err(Errno::EOVERFLOW), || {
        cpu.pin(p, 0xffff_ffff_ffff_f000, 8 * K)
    });
    // More than RLIMIT_MEMLOCK (8M) for an ordinary process.
    no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
        cpu.pin(p, A, 8 * M + 4 * K)
    });
}

// ---------------------------------------------------------------------------------------------
// Linux corner cases (the engine used to differ on these).
// ---------------------------------------------------------------------------------------------

#[test]
fn mremap_shrinking_a_range_that_spans_vmas_unmaps_the_tail() {
    // Linux: only growing or moving checks that [addr, addr+old_len) lies in one VMA
    // (remap_is_valid); a shrink just munmaps [addr+new_len, addr+old_len).
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    cpu.mprotect(p, A + 32 * K, 32 * K, RO).expect("split A");
    assert_eq!(
        cpu.mremap(p, A, A_LEN, 16 * K, MremapFlags::default()),
        Ok(A)
    );
    assert_eq!(
        cpu.touch(p, A + 16 * K, 1, Access::Read),
        Err(Signal::Segv(A + 16 * K))
    );
    assert_eq!(cpu.find_mismatch(p, A, 16 * K, 0xa1), Ok(None));
    // Same size over A and the hole: a no-op that returns the address.
    assert_eq!(
        cpu.mremap(p, A, 32 * K, 32 * K, MremapFlags::default()),
        Ok(A)
    );
    valid(&m);
}

#[test]
fn mremap_fixed_of_a_spanning_range_moves_every_vma() {
    // Linux 6.17+: a fixed move of unchanged length over several VMAs moves each of them.
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    cpu.mprotect(p, A + 32 * K, 32 * K, RO).expect("split A");
    let target = 0x3000_0000;
    assert_eq!(cpu.mremap(p, A, A_LEN, A_LEN, to(target)), Ok(target));
    assert_eq!(cpu.find_mismatch(p, target, A_LEN, 0xa1), Ok(None));
    assert_eq!(cpu.touch(p, A, 1, Access::Read), Err(Signal::Segv(A)));
    let maps = cpu.maps(p).expect("maps");
    assert!(maps
        .iter()
        .any(|e| e.start == target && e.end == target + 32 * K));
    assert!(maps
        .iter()
        .any(|e| e.start == target + 32 * K && e.end == target + A_LEN));
    // Growing across VMAs is still EFAULT, found before anything is unmapped
    // (`check_prep_vma`, 6.17+): the target keeps its mapping and its bytes.
    assert_eq!(
        cpu.mremap(p, target, A_LEN, 2 * A_LEN, to(C)),
        Err(Errno::EFAULT)
    );
    assert_eq!(cpu.find_mismatch(p, C, C_LEN, 0xc3), Ok(None));
    valid(&m);
}

#[test]
fn mremap_of_shared_memory_with_old_len_zero_duplicates_it() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    let d = cpu
        .mremap(p, B, 0, B_LEN, MAYMOVE)
        .expect("Linux duplicates a shared mapping");
    assert_ne!(d, B);
    assert_eq!(cpu.find_mismatch(p, d, B_LEN, 0xb2), Ok(None));
    cpu.write_fill(p, d, 4 * K, 0x11)
        .expect("write the duplicate");
    assert_eq!(cpu.find_mismatch(p, B, 4 * K, 0x11), Ok(None));
    data_intact_except_b(&cpu, p);
    valid(&m);
}

fn data_intact_except_b(cpu: &Cpu<'_>, p: Pid) {
    assert_eq!(cpu.find_mismatch(p, A, A_LEN, 0xa1), Ok(None));
    assert_eq!(cpu.find_mismatch(p, C, C_LEN, 0xc3), Ok(None));
}

#[test]
fn shared_memory_grown_past_its_size_faults_with_sigbus() {
    // The shmem object behind MAP_SHARED|MAP_ANONYMOUS has the size of the mmap; mremap can
    // grow the mapping, but shmem_fault() refuses pages at or beyond i_size.
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    grow_shared_beyond_its_object(&cpu, p);
    cpu.write_fill(p, B, B_LEN, 0xb3)
        .expect("the original size is fine");
    assert_eq!(
        cpu.touch(p, B + B_LEN, 1, Access::Read),
        Err(Signal::Bus(B + B_LEN))
    );
    valid(&m);
}

#[test]
fn brk_shrink_over_an_unmapped_heap_keeps_the_break() {
    // SYSCALL_DEFINE1(brk): "mapping intersects with an existing non-brk vma" when no VMA is
    // found in [newbrk, oldbrk).
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    let top = START_BRK + 64 * K;
    assert_eq!(cpu.brk(p, top), Ok(top));
    cpu.munmap(p, START_BRK, 64 * K).expect("unmap the heap");
    no_change(&m, &cpu, p, Ok(top), || cpu.brk(p, START_BRK + 16 * K));
    assert_eq!(cpu.brk(p, 0), Ok(top));
}
// ---------------------------------------------------------------------------------------------
// Where the engine differs from Linux.
// ---------------------------------------------------------------------------------------------

// Checked against Linux 6.18 with `usermm oracle`: the overlap check comes first.
#[test]
fn mremap_fixed_of_an_unmapped_address_overlapping_its_target_is_einval() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    no_change(&m, &cpu, p, Err(Errno::EINVAL), || {
        cpu.mremap(p, HOLE, 8 * K, 8 * K, to(HOLE + 4 * K))
    });
}

// Measured on Linux 6.18 (vm.max_map_count at map_count + 5: ENOMEM, + 6: moved).
#[test]
fn mremap_fixed_within_five_of_the_map_count_limit_is_enomem() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    // check_mremap_params(): map_count (3) + 2 >= max_map_count (8) - 3.
    m.update_tunables(|t| t.max_map_count = 8);
    no_change(&m, &cpu, p, Err(Errno::ENOMEM), || {
        cpu.mremap(p, C, C_LEN, C_LEN, to(0x3000_0000))
    });
    // One more allowed map and the move goes through.
    m.update_tunables(|t| t.max_map_count = 9);
    assert_eq!(
        cpu.mremap(p, C, C_LEN, C_LEN, to(0x3000_0000)),
        Ok(0x3000_0000)
    );
    valid(&m);
}

// Checked against Linux 6.18 with `usermm oracle`: a new length above TASK_SIZE is EINVAL.
#[test]
fn mremap_growing_beyond_the_address_space_is_einval() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    for flags in [MremapFlags::default(), MAYMOVE] {
        no_change(&m, &cpu, p, Err(Errno::EINVAL), || {
            cpu.mremap(p, A, A_LEN, TASK_SIZE + 4 * K, flags)
        });
    }
}

// Checked against Linux 6.18 with `usermm oracle`: EINVAL, and the target stays mapped.
#[test]
fn mremap_fixed_with_old_len_zero_of_private_memory_is_einval_and_keeps_the_target() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    no_change(&m, &cpu, p, Err(Errno::EINVAL), || {
        cpu.mremap(p, A, 0, C_LEN, to(C))
    });
}

// GUP turns VM_FAULT_SIGBUS into EFAULT (mm/gup.c), only VM_FAULT_OOM into ENOMEM.
#[test]
fn pin_of_shared_memory_beyond_its_size_is_efault() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    grow_shared_beyond_its_object(&cpu, p);
    no_change(&m, &cpu, p, Err(Errno::EFAULT), || {
        cpu.pin(p, B + B_LEN, 4 * K)
    });
}

// `madvise_populate` reports a fault's SIGBUS (beyond a shared object) as EFAULT and keeps
// ENOMEM for out of memory; the pages before the object's end are populated.
#[test]
fn populate_of_shared_memory_beyond_its_size_is_efault() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = fixture(&cpu);
    grow_shared_beyond_its_object(&cpu, p);
    for advice in [Advice::PopulateRead, Advice::PopulateWrite] {
        assert_eq!(
            cpu.madvise(p, B, 2 * B_LEN, advice),
            Err(Errno::EFAULT),
            "{advice:?}"
        );
        valid(&m);
    }
    let mut b = [0u8; 1];
    cpu.read_bytes(p, B + B_LEN - 1, &mut b)
        .expect("inside the object");
    assert_eq!(b[0], 0xb2);
}
