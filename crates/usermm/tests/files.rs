//! Files and the page cache beyond what the oracle corpus can show: memory pressure (the host's
//! RAM cannot be shrunk to match), readahead windows, I/O counters, leak-freedom.

mod common;
use common::*;
use usermm::{Errno, Ev, InodeKind, MmapArgs, MsyncFlags, Placement, Privilege, Sharing};

fn file_map(len: u64, sharing: Sharing, f: u32, offset: u64, addr: u64) -> MmapArgs {
    MmapArgs {
        placement: Placement::Fixed(addr),
        sharing,
        file: Some((f, offset)),
        ..MmapArgs::anon(len, RW)
    }
}

#[test]
fn reading_a_file_four_times_larger_than_memory_evicts_clean_page_cache() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let f = cpu
        .file_create(256 * M, InodeKind::Disk, Some(0x5a))
        .unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let args = MmapArgs {
        prot: RO,
        ..file_map(256 * M, Sharing::Private, f, 0, 0x2_0000_0000)
    };
    let a = cpu.mmap(p, args).unwrap();
    assert_eq!(cpu.find_mismatch(p, a, 256 * M, 0x5a).unwrap(), None);
    let c = m.counters();
    assert!(
        c.get(Ev::PgSteal) > 128 * M / 4096,
        "most of the file was evicted"
    );
    assert!(
        c.get(Ev::DiskReadBytes) >= 256 * M,
        "every page was read once at least"
    );
    let cached = cpu.fincore(f, 0, 256 * M).unwrap();
    assert!(cached < 64 * M, "{cached} bytes cached in 64M of memory");
    valid(&m);
    // Reading it again through read(2) works too and finds the same bytes.
    let tail = cpu.pread(f, 200 * M, 64 * 1024).unwrap();
    assert!(tail.iter().all(|&b| b == 0x5a));
    cpu.exit(p).unwrap();
    valid(&m);
}

#[test]
fn dirty_pages_are_written_back_when_memory_runs_out_and_read_back_intact() {
    let m = machine(32 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let f = cpu.file_create(0, InodeKind::Disk, None).unwrap();
    for i in 0..96u64 {
        assert_eq!(
            cpu.pwrite(f, i * M, M, (i % 251) as u8 + 1).unwrap(),
            M,
            "write {i}"
        );
    }
    valid(&m);
    assert!(
        m.counters().get(Ev::DiskWriteBytes) > 32 * M,
        "reclaim wrote dirty pages"
    );
    for i in (0..96u64).step_by(7) {
        let d = cpu.pread(f, i * M, M).unwrap();
        assert_eq!(d.len() as u64, M);
        assert!(d.iter().all(|&b| b == (i % 251) as u8 + 1), "MiB {i}");
    }
    valid(&m);
}

#[test]
fn first_pread_reads_a_four_page_window_and_sequential_reads_ramp_it_up() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let f = cpu.file_create(M, InodeKind::Disk, Some(1)).unwrap();
    cpu.pread(f, 0, 4096).unwrap();
    // get_init_ra_size(1 page, 2048): 4 pages; the marker sits on page 1.
    assert_eq!(cpu.fincore(f, 0, M).unwrap(), 16 * 1024);
    cpu.pread(f, 4096, 4096).unwrap();
    // The marker starts the next window: 4 * 4 = 16 pages after the first 4.
    assert_eq!(cpu.fincore(f, 0, M).unwrap(), 80 * 1024);
    assert_eq!(m.counters().get(Ev::DiskReads), 2);
    assert_eq!(m.counters().get(Ev::DiskReadBytes), 80 * 1024);
    valid(&m);
}

#[test]
fn shared_writes_are_tracked_and_cleaned_by_msync() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let f = cpu
        .file_create(64 * 1024, InodeKind::Disk, Some(0))
        .unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let a = cpu
        .mmap(p, file_map(64 * 1024, Sharing::Shared, f, 0, 0x3_0000_0000))
        .unwrap();
    cpu.write_fill(p, a, 8192, 0x42).unwrap();
    let s = cpu.smaps(p, a, a + 1).unwrap()[0].1;
    assert_eq!(s.shared_dirty + s.private_dirty, 8192);
    cpu.msync(p, a, 64 * 1024, &[MsyncFlags::Sync]).unwrap();
    let s = cpu.smaps(p, a, a + 1).unwrap()[0].1;
    assert_eq!(s.shared_dirty + s.private_dirty, 0, "written back");
    assert_eq!(m.counters().get(Ev::DiskWrites), 1, "one I/O for two pages");
    // The PTEs were write-protected: the next store faults and dirties the page again.
    let wp = m.counters().get(Ev::FaultWp);
    cpu.write_fill(p, a, 1, 0x43).unwrap();
    assert_eq!(m.counters().get(Ev::FaultWp), wp + 1);
    assert_eq!(cpu.pread(f, 0, 2).unwrap(), vec![0x43, 0x42]);
    assert_eq!(
        cpu.msync(p, a + 1, 4096, &[MsyncFlags::Sync]),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        cpu.msync(p, a, 128 * 1024, &[MsyncFlags::Async]),
        Err(Errno::ENOMEM),
        "a hole at the end"
    );
    cpu.exit(p).unwrap();
    valid(&m);
}

#[test]
fn every_frame_of_every_kind_of_file_is_accounted_and_freed() {
    let m = machine(64 * M);
    let cpu = m.enter_cpu(0).unwrap();
    let t = cpu.file_create(M, InodeKind::Tmpfs, Some(7)).unwrap();
    let d = cpu.file_create(M, InodeKind::Disk, Some(8)).unwrap();
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).unwrap();
    let a = cpu
        .mmap(p, file_map(M, Sharing::Private, t, 0, 0x4_0000_0000))
        .unwrap();
    let b = cpu
        .mmap(p, file_map(M, Sharing::Shared, d, 0, 0x5_0000_0000))
        .unwrap();
    cpu.write_fill(p, a, 8192, 1).unwrap();
    cpu.write_fill(p, b, 8192, 2).unwrap();
    let c = cpu.fork(p).unwrap();
    cpu.write_fill(c, a + 8192, 4096, 3).unwrap();
    valid(&m);
    cpu.ftruncate(t, 4096).unwrap();
    cpu.fallocate(d, 0, 64 * 1024, true).unwrap();
    valid(&m);
    cpu.exit(c).unwrap();
    cpu.exit(p).unwrap();
    valid(&m);
    // Only the files' own pages remain: the tmpfs file's one page and the disk file's cache.
    let cached = cpu.fincore(t, 0, M).unwrap() + cpu.fincore(d, 0, M).unwrap();
    assert_eq!(m.phys.allocated_frames() * 4096, cached);
}

/// `rw_verify_area`: a positioned read or write whose range ends past `LLONG_MAX` is `EINVAL`
/// (before the count is clamped to `MAX_RW_COUNT`), not a short transfer; nothing changes.
#[test]
fn pread_and_pwrite_ending_past_llong_max_are_einval() {
    let m = machine(16 * M);
    let cpu = m.enter_cpu(0).unwrap();
    for kind in [InodeKind::Disk, InodeKind::Tmpfs] {
        let f = cpu.file_create(64 * K, kind, Some(0x33)).unwrap();
        let max = i64::MAX as u64;
        for (off, len) in [(max - 1, 4096), (max, 1), (0, max + 1), (4096, u64::MAX)] {
            assert_eq!(
                cpu.pread(f, off, len),
                Err(Errno::EINVAL),
                "{off:#x}+{len:#x}"
            );
            assert_eq!(
                cpu.pwrite(f, off, len, 1),
                Err(Errno::EINVAL),
                "{off:#x}+{len:#x}"
            );
        }
        // Ending exactly at LLONG_MAX is allowed: past the end of file it reads nothing,
        // and a write there is too large for a disk file (ext4's s_maxbytes).
        assert_eq!(cpu.pread(f, max - 4096, 4096).unwrap(), Vec::<u8>::new());
        if kind == InodeKind::Disk {
            assert_eq!(cpu.pwrite(f, max - 4096, 4096, 1), Err(Errno::EFBIG));
        }
        assert_eq!(cpu.pread(f, 0, 2).unwrap(), vec![0x33, 0x33]);
        valid(&m);
    }
}
