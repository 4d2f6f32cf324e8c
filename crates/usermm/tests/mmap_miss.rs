//! `mmap_miss` as Linux 6.18 counts it (`crates/usermm/src/readahead.rs` has the rules): misses
//! of page faults net of their hits, read-around stopping past `MMAP_LOTSAMISS` (100), and what
//! counts as a hit — a fault finding its page, and every page fault-around looks at unless it
//! is `PG_workingset`. The host agrees on the first two (`scenarios/oracle/files-disk-mmap-miss*.scn`);
//! the working-set rule needs reclaim of chosen pages, which only the engine can arrange.

mod common;
use common::*;
use usermm::{Access, Advice, Cpu, Ev, FileId, InodeKind, MmapArgs, Pid, Placement, Sharing};

const FILE: u64 = 2 * M;
const PRIVATE: u64 = 0x5_0000_0000;
const READER: u64 = 0x6_0000_0000;

/// A 2 MiB disk file (its blocks all 0x5a), a process, a private writable mapping of the file
/// at [`PRIVATE`] and a read-only one at [`READER`].
fn setup(cpu: &Cpu<'_>) -> (FileId, Pid) {
    let f = cpu.file_create(FILE, InodeKind::Disk, Some(0x5a)).unwrap();
    let p = cpu.spawn(usermm::Privilege::Ordinary, 8 * M).unwrap();
    for (addr, prot) in [(PRIVATE, RW), (READER, RO)] {
        let args = MmapArgs {
            placement: Placement::Fixed(addr),
            sharing: Sharing::Private,
            file: Some((f, 0)),
            ..MmapArgs::anon(FILE, prot)
        };
        cpu.mmap(p, args).unwrap();
    }
    (f, p)
}

/// `n` misses: cold write faults of the private mapping from page `first` on (COW: no
/// fault-around, and the retry after each read is FAULT_FLAG_TRIED, which counts no hit),
/// the file punched empty after each, so the next one misses too.
fn misses(cpu: &Cpu<'_>, f: FileId, p: Pid, first: u64, n: u64) {
    for i in first..first + n {
        cpu.touch(p, PRIVATE + i * 4096, 1, Access::Write).unwrap();
        cpu.fallocate(f, 0, FILE, true).unwrap();
    }
    assert_eq!(cpu.fincore(f, 0, FILE).unwrap(), 0);
}

/// A cold read fault at `off` in the read-only mapping: the counters it moved.
fn read_fault(m: &usermm::Machine, cpu: &Cpu<'_>, p: Pid, off: u64) -> usermm::Snapshot {
    counted(m, || cpu.touch(p, READER + off, 1, Access::Read)).1
}

#[test]
fn read_around_stops_once_misses_exceed_hits_by_more_than_100() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let (f, p) = setup(&cpu);
    misses(&cpu, f, p, 0, 101);
    // 101 + 1 > 100: the page is read alone, and the retry's fault-around finds only it
    // (one hit: 101). (The punched file is all holes: reads cache pages without I/O.)
    let d = read_fault(&m, &cpu, p, M);
    assert_eq!(d.get(Ev::Readahead), 0);
    assert_eq!(d.get(Ev::FaultFileMajor), 1);
    assert_eq!(d.get(Ev::FaultAroundPages), 0);
    assert_eq!(cpu.fincore(f, 0, FILE).unwrap(), 4096);
    // A write fault that finds its page is a hit (100); the next miss counts 101: alone again.
    cpu.touch(p, PRIVATE + M, 1, Access::Write).unwrap();
    let d = read_fault(&m, &cpu, p, M + 64 * K);
    assert_eq!(d.get(Ev::Readahead), 0);
    assert_eq!(cpu.fincore(f, 0, FILE).unwrap(), 2 * 4096);
    // One more hit (99): the next miss counts 100, not past the limit, and reads around
    // (2048 pages centred on page 288: the whole file, read in two parts around the two
    // cached pages).
    cpu.touch(p, PRIVATE + M + 64 * K, 1, Access::Write)
        .unwrap();
    let d = read_fault(&m, &cpu, p, M + 128 * K);
    assert_eq!(d.get(Ev::Readahead), 2);
    assert_eq!(d.get(Ev::FaultAroundPages), 15);
    assert_eq!(cpu.fincore(f, 0, FILE).unwrap(), FILE);
    valid(&m);
}

#[test]
fn fault_around_counts_every_page_it_looks_at_mapped_or_not() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let (f, p) = setup(&cpu);
    misses(&cpu, f, p, 0, 101);
    // read(2) caches 16 pages without touching mmap_miss; a read fault maps all of them:
    // 16 hits (85).
    cpu.pread(f, M, 64 * K).unwrap();
    let d = read_fault(&m, &cpu, p, M);
    assert_eq!(d.get(Ev::FaultAroundPages), 15);
    assert_eq!(d.get(Ev::Readahead), 0);
    // One page unmapped and faulted again: fault-around maps only it, but looks at 16 (69).
    cpu.madvise(p, READER + M, 4096, Advice::DontNeed).unwrap();
    let d = read_fault(&m, &cpu, p, M);
    assert_eq!(d.get(Ev::FaultAroundPages), 0);
    // 30 misses (99): the next one counts 100 and reads around; had the second fault-around
    // counted only the page it mapped, it would count 115 and read one page.
    misses(&cpu, f, p, 101, 30);
    read_fault(&m, &cpu, p, 1536 * K);
    assert_eq!(cpu.fincore(f, 0, FILE).unwrap(), FILE);
    valid(&m);
}

#[test]
fn pages_of_a_refaulted_working_set_are_not_hits() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let (f, p) = setup(&cpu);
    misses(&cpu, f, p, 0, 101);
    // Two reads of the whole file activate every page; reclaim of 64K deactivates the 16
    // oldest (pages 0-15), which marks them PG_workingset, and evicts them.
    cpu.pread(f, 0, FILE).unwrap();
    cpu.pread(f, 0, FILE).unwrap();
    assert_eq!(cpu.reclaim(64 * K), 64 * K);
    assert_eq!(cpu.fincore(f, 0, 64 * K).unwrap(), 0);
    assert_eq!(cpu.fincore(f, 0, FILE).unwrap(), FILE - 64 * K);
    // Read again, they refault within reach of the working set: active and PG_workingset.
    let d = counted(&m, || cpu.pread(f, 0, 64 * K)).1;
    assert_eq!(d.get(Ev::WorkingsetActivate), 16);
    // Fault-around maps the 16 pages and counts none of them (101 still).
    let d = read_fault(&m, &cpu, p, 0);
    assert_eq!(d.get(Ev::FaultAroundPages), 15);
    // So a miss counts 102 and reads its page alone; with the 16 as hits it would count 86
    // and read around (the 256 punched pages).
    cpu.fallocate(f, M, M, true).unwrap();
    let d = read_fault(&m, &cpu, p, M + 512 * K);
    assert_eq!(d.get(Ev::Readahead), 0);
    assert_eq!(cpu.fincore(f, M, M).unwrap(), 4096);
    valid(&m);
}
