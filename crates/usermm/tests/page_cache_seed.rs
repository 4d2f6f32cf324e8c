//! `Cpu::page_cache_seed`: the page cache a program finds when it starts (what `usermm
//! replay` builds from a recording's `CACHE` events). A seeded folio is cached with its order
//! and readahead mark, read and uptodate; a fault then finds it as it would a warm host's.

mod common;
use common::*;
use usermm::{Access, Errno, Ev, InodeKind, MmapArgs, Placement, Sharing};

const FILE: u64 = 256 * 4096;
const AT: u64 = 0x5_0000_0000;

#[test]
fn seeded_folios_are_cached_with_their_order_and_refused_where_linux_could_not_hold_them() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let f = cpu.file_create(FILE, InodeKind::Disk, Some(0x5a)).unwrap();
    let (added, d) = counted(&m, || cpu.page_cache_seed(f, 32, 5, false));
    assert_eq!(added, 32);
    // Seeding is state, not a call the program made.
    assert_eq!(d.get(Ev::Syscall), 0);
    valid(&m);
    assert_eq!(cpu.fincore(f, 0, FILE).unwrap(), 32 * 4096);
    let by_order = cpu.file_folios_by_order(f).unwrap();
    assert_eq!(by_order[5], 1);
    assert_eq!(by_order.iter().sum::<u64>(), 1);
    // Its bytes are the file's.
    assert_eq!(cpu.pread(f, 40 * 4096, 4).unwrap(), vec![0x5a; 4]);
    // Overlapping what is cached: nothing is done.
    assert_eq!(cpu.page_cache_seed(f, 48, 0, false), Ok(0));
    assert_eq!(cpu.page_cache_seed(f, 0, 6, false), Ok(0));
    // Past the end of the file: nothing; crossing it: its pages up to the end, order 0.
    assert_eq!(cpu.page_cache_seed(f, 256, 0, false), Ok(0));
    let g = cpu
        .file_create(10 * 4096, InodeKind::Disk, Some(1))
        .unwrap();
    assert_eq!(cpu.page_cache_seed(g, 8, 3, false), Ok(2));
    assert_eq!(cpu.file_folios_by_order(g).unwrap()[0], 2);
    assert_eq!(cpu.fincore(g, 0, 10 * 4096).unwrap(), 2 * 4096);
    // What no page cache holds: a misaligned folio, one above PMD order, a tmpfs file, no file.
    assert_eq!(cpu.page_cache_seed(f, 4, 3, false), Err(Errno::EINVAL));
    assert_eq!(cpu.page_cache_seed(f, 0, 10, false), Err(Errno::EINVAL));
    let s = cpu.file_create(FILE, InodeKind::Tmpfs, None).unwrap();
    assert_eq!(cpu.page_cache_seed(s, 0, 0, false), Err(Errno::EINVAL));
    assert_eq!(cpu.page_cache_seed(999, 0, 0, false), Err(Errno::EBADF));
    valid(&m);
}

/// A read fault at page 0 of a 256-page read-only mapping of `f`: the pages it mapped.
fn mapped_by_first_fault(seed: &[(u64, u32, bool)]) -> u64 {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let f = cpu.file_create(FILE, InodeKind::Disk, Some(0x5a)).unwrap();
    for &(index, order, readahead) in seed {
        assert_eq!(
            cpu.page_cache_seed(f, index, order, readahead),
            Ok(1 << order)
        );
        valid(&m);
    }
    let p = cpu.spawn(usermm::Privilege::Ordinary, 8 * M).unwrap();
    let args = MmapArgs {
        placement: Placement::Fixed(AT),
        sharing: Sharing::Private,
        file: Some((f, 0)),
        ..MmapArgs::anon(FILE, RO)
    };
    cpu.mmap(p, args).unwrap();
    let (_, d) = counted(&m, || cpu.touch(p, AT, 1, Access::Read));
    valid(&m);
    let present = cpu.present_pages(p, AT, AT + FILE).unwrap().len() as u64;
    assert_eq!(d.get(Ev::Readahead) > 0, seed.is_empty());
    present
}

#[test]
fn a_fault_on_a_seeded_cache_maps_what_a_warm_host_maps() {
    // Cold: the fault reads around and fault-around maps its 16-page window.
    assert_eq!(mapped_by_first_fault(&[]), 16);
    // Warm, with holes: only what is cached in the window.
    assert_eq!(mapped_by_first_fault(&[(0, 0, false), (2, 0, false)]), 2);
    // The readahead mark on page 1 (a `read` of the header left it): fault-around skips it.
    let marked: Vec<_> = (0..16).map(|i| (i, 0, i == 1)).collect();
    assert_eq!(mapped_by_first_fault(&marked), 15);
    // A 32-page folio: 6.18 maps it whole.
    assert_eq!(mapped_by_first_fault(&[(0, 5, false)]), 32);
}
