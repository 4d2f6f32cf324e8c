//! Readahead: a sequential and a random `pread` pass over a disk file whose blocks are all
//! on the device and none of it cached, on the engine (its model of `mm/readahead.c`:
//! `page_cache_sync_ra`/`page_cache_async_ra` with the device's `read_ahead_kb` and
//! `max_sectors_kb`, over the simulated block device) and on the host kernel (an unnamed
//! ext4 file in a private directory on `/var/tmp`, written and `fsync`ed once per table, its
//! page cache dropped with `POSIX_FADV_DONTNEED` before each repetition).
//!
//! Time, I/Os and bytes read, and the folio sizes the page cache holds afterwards (engine:
//! its cache index; host: `/proc/kpageflags` of the cached pages, found with `mincore` and
//! mapped with `MADV_RANDOM` so that looking does not read more). The engine's time has no
//! device in it: an I/O costs only the copy into the frames, so its column is the
//! bookkeeping of readahead, not the disk; the host's is mostly the disk.
//!
//! The folio counters show 6.18's large-folio readahead on both sides: synchronous windows
//! in 4K folios, each asynchronous window two orders larger (`page_cache_ra_order`), up to
//! 2M.

use crate::ctx::Ctx;
use crate::engine::{counters, size_label, warm_up};
use crate::host::errno_text;
use crate::model::{Better, Column, Row, Stat, Table, Unit, Variant};
use oracle::files::{check_ext4, ScratchDir, DISK_PARENT};
use oracle::{procfs, sys};
use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::time::Instant;
use usermm::{Ev, InodeKind, Machine, MachineConfig, Privilege};

/// Bytes per `pread` of the sequential pass (what `cat` and `cp` ask for).
const SEQ_CHUNK: u64 = 128 << 10;
/// One page in this many is read by the random pass.
const RANDOM_FRACTION: u64 = 16;
const PAGE: u64 = 4096;
/// The byte every block of the file holds.
const FILL: u8 = 0x5a;

/// How the file is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pattern {
    /// `pread` of [`SEQ_CHUNK`] bytes from offset 0 to the end.
    Sequential,
    /// `pread` of 4 KiB at pseudo-random pages, one page in [`RANDOM_FRACTION`].
    Random,
}

const PATTERNS: [Pattern; 2] = [Pattern::Sequential, Pattern::Random];

impl Pattern {
    fn label(self) -> &'static str {
        match self {
            Pattern::Sequential => "sequential",
            Pattern::Random => "random",
        }
    }

    /// The (offset, length) of each `pread`, the same on both sides.
    fn reads(self, size: u64) -> Vec<(u64, u64)> {
        match self {
            Pattern::Sequential => (0..size.div_ceil(SEQ_CHUNK))
                .map(|i| (i * SEQ_CHUNK, SEQ_CHUNK.min(size - i * SEQ_CHUNK)))
                .collect(),
            Pattern::Random => {
                let pages = size / PAGE;
                // A fixed 64-bit LCG (Knuth's MMIX constants): the same pages every run.
                let mut x = 0x2545_f491_4f6c_dd1du64;
                (0..(pages / RANDOM_FRACTION).max(1))
                    .map(|_| {
                        x = x
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1_442_695_040_888_963_407);
                        ((x >> 33) % pages * PAGE, PAGE)
                    })
                    .collect()
            }
        }
    }
}

/// The counter name of the folios of `order` (`folios_64K`).
fn folio_counter(prefix: &str, order: usize) -> String {
    format!("{prefix}folios_{}", size_label(PAGE << order))
}

/// One engine repetition.
fn engine_once(size: u64, reads: &[(u64, u64)]) -> anyhow::Result<(f64, BTreeMap<String, u64>)> {
    let mut cfg = MachineConfig {
        memory: (size * 2 + (64 << 20)).next_power_of_two(),
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = false;
    let m = Machine::new(cfg);
    let cpu = m.enter_cpu(0)?;
    let p = cpu.spawn(Privilege::Ordinary, 8 << 20)?;
    warm_up(&cpu, p, size)?;
    let f = cpu.file_create(size, InodeKind::Disk, Some(FILL))?;
    let mut buf = vec![0u8; SEQ_CHUNK as usize];
    let before = m.counters();
    let t = Instant::now();
    for &(off, len) in reads {
        cpu.pread_into(f, off, &mut buf[..len as usize])?;
        std::hint::black_box(&buf);
    }
    let secs = t.elapsed().as_secs_f64();
    let mut c = counters(&m.counters().delta(&before));
    for (order, &n) in cpu.file_folios_by_order(f)?.iter().enumerate() {
        if n > 0 {
            c.insert(folio_counter("", order), n);
        }
    }
    Ok((secs, c))
}

/// The host's file: written and synced once; every repetition drops its cache first.
struct HostFile {
    file: File,
    _dir: ScratchDir,
    /// `/sys/dev/block/MAJ:MIN/stat` of the device it is on.
    stat: String,
}

/// `(read I/Os completed, bytes read)` of a block device (all its users, not only ours).
fn disk_reads(stat: &str) -> Result<(u64, u64), String> {
    let text = std::fs::read_to_string(stat).map_err(|e| format!("{stat}: {e}"))?;
    let f: Vec<u64> = text
        .split_whitespace()
        .map(|w| w.parse().unwrap_or(0))
        .collect();
    match (f.first(), f.get(2)) {
        (Some(&ios), Some(&sectors)) => Ok((ios, sectors * 512)),
        _ => Err(format!("{stat}: unexpected contents")),
    }
}

impl HostFile {
    fn create(size: u64) -> Result<HostFile, String> {
        let dir = ScratchDir::create(std::path::Path::new(DISK_PARENT))?;
        check_ext4(&dir)?;
        let file = dir.tmpfile()?;
        let buf = vec![FILL; 1 << 20];
        let mut off = 0;
        while off < size {
            let n = (size - off).min(buf.len() as u64) as usize;
            off += sys::pwrite(file.as_raw_fd(), &buf[..n], off)
                .map_err(|e| errno_text("pwrite", e))? as u64;
        }
        sys::fsync(file.as_raw_fd()).map_err(|e| errno_text("fsync", e))?;
        let dev = file.metadata().map_err(|e| e.to_string())?.dev();
        // glibc's gnu_dev_major/minor split of a dev_t.
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        Ok(HostFile {
            file,
            _dir: dir,
            stat: format!("/sys/dev/block/{major}:{minor}/stat"),
        })
    }

    /// One repetition: drop the file's cache, read, count the device's I/Os.
    fn read_once(&self, reads: &[(u64, u64)]) -> Result<(f64, BTreeMap<String, u64>), String> {
        let fd = self.file.as_raw_fd();
        sys::drop_cache(fd).map_err(|e| errno_text("posix_fadvise", e))?;
        let mut buf = vec![0u8; SEQ_CHUNK as usize];
        let (io0, b0) = disk_reads(&self.stat)?;
        let t = Instant::now();
        for &(off, len) in reads {
            sys::pread(fd, &mut buf[..len as usize], off).map_err(|e| errno_text("pread", e))?;
        }
        let secs = t.elapsed().as_secs_f64();
        let (io1, b1) = disk_reads(&self.stat)?;
        let mut c = BTreeMap::new();
        c.insert("host_disk_reads".into(), io1.saturating_sub(io0));
        c.insert("host_disk_read_bytes".into(), b1.saturating_sub(b0));
        Ok((secs, c))
    }

    /// The folios of the file's page cache by order (needs root for `/proc/kpageflags`).
    fn folios_by_order(&self, size: u64) -> Result<BTreeMap<String, u64>, String> {
        const MADV_RANDOM: i32 = usermm::Advice::Random.number();
        const PROT_READ: i32 = usermm::Prot::RO.bits() as i32;
        const MAP_SHARED: i32 = oracle::sys::MAP_SHARED;
        let flags = File::open("/proc/kpageflags").map_err(|e| format!("kpageflags: {e}"))?;
        let pagemap = File::open("/proc/self/pagemap").map_err(|e| format!("pagemap: {e}"))?;
        let addr = sys::mmap_fd(0, size, PROT_READ, MAP_SHARED, self.file.as_raw_fd(), 0)
            .map_err(|e| errno_text("mmap", e))?;
        let res = (|| {
            sys::madvise(addr, size, MADV_RANDOM).map_err(|e| errno_text("madvise", e))?;
            let cached = sys::mincore(addr, size).map_err(|e| errno_text("mincore", e))?;
            for (i, &b) in cached.iter().enumerate() {
                if b & 1 != 0 {
                    sys::touch(addr + i as u64 * PAGE, PAGE, false)
                        .map_err(|s| format!("signal {s} reading"))?;
                }
            }
            let mut out = BTreeMap::new();
            let mut err = None;
            procfs::scan_pagemap(&pagemap, addr / PAGE, size / PAGE, |_, e| {
                let pfn = e & ((1 << 55) - 1);
                if e >> 63 == 0 || pfn == 0 || err.is_some() {
                    return;
                }
                let f = match procfs::kpageflags(&flags, pfn) {
                    Ok(f) => f,
                    Err(e) => return err = Some(e.to_string()),
                };
                if f & procfs::KPF_COMPOUND_TAIL != 0 {
                    return;
                }
                match procfs::folio_order(&flags, pfn, f) {
                    Ok(o) => *out.entry(folio_counter("host_", o as usize)).or_insert(0) += 1,
                    Err(e) => err = Some(e.to_string()),
                }
            })
            .map_err(|e| format!("pagemap: {e}"))?;
            err.map_or(Ok(out), Err)
        })();
        let _ = sys::munmap(addr, size);
        res
    }
}

/// Measurements (for the progress bar).
pub fn steps(reps: usize) -> u64 {
    (reps * PATTERNS.len() * 2) as u64
}

fn variants() -> Vec<Variant> {
    vec![
        Variant::engine(
            "engine",
            "the usermm engine: its readahead model over the simulated block device (no device time)",
        ),
        Variant::host("the host kernel: an ext4 file on /var/tmp, cache dropped before each pass"),
    ]
}

/// The readahead table.
pub fn table(ctx: &Ctx<'_>) -> anyhow::Result<Table> {
    let size = ctx.opts.scale;
    let host = ctx.host.enabled().and_then(|()| HostFile::create(size));
    let mut rows = Vec::new();
    for pattern in PATTERNS {
        let reads = pattern.reads(size);
        let mut cols = vec![
            Column::new("engine", vec![], BTreeMap::new()),
            Column::new("host", vec![], BTreeMap::new()),
        ];
        let mut host_folios = BTreeMap::new();
        for rep in 0..ctx.opts.reps {
            for i in crate::stats::rotation_host_last(rep, 2) {
                if i == 0 {
                    let (secs, c) = engine_once(size, &reads)?;
                    cols[0].samples.push(secs);
                    cols[0].counters = c;
                } else {
                    let h = host.as_ref().map_err(Clone::clone);
                    cols[1].record(h.and_then(|f| f.read_once(&reads)));
                    if rep == 0 {
                        if let Ok(f) = &host {
                            host_folios = f.folios_by_order(size).unwrap_or_else(|why| {
                                BTreeMap::from([(format!("host_folios n/a: {why}"), 0)])
                            });
                        }
                    }
                }
                ctx.task
                    .step(&format!("{} {}", pattern.label(), cols[i].variant))?;
            }
        }
        if cols[1].unavailable.is_none() {
            cols[1].counters.extend(host_folios);
        }
        rows.push(Row {
            label: pattern.label().into(),
            columns: cols,
            published: vec![],
            layout: None,
        });
    }
    drop(host);
    let mut shown: Vec<String> = [
        Ev::Readahead,
        Ev::DiskReads,
        Ev::DiskReadBytes,
        Ev::PageCacheAdd,
    ]
    .iter()
    .map(|e| e.name().to_string())
    .collect();
    shown.extend(["host_disk_reads", "host_disk_read_bytes"].map(String::from));
    for order in 0..=9 {
        shown.push(folio_counter("", order));
        shown.push(folio_counter("host_", order));
    }
    Ok(Table {
        host_matches: None,
        cost_model: None,
        id: "readahead".into(),
        title: format!(
            "readahead: pread of a {} MiB disk file, none of it cached",
            size >> 20
        ),
        seed: None,
        metric: "read time".into(),
        unit: Unit::Seconds,
        better: Better::Lower,
        stats: vec![Stat::Min, Stat::Median, Stat::Max],
        baseline: "engine".into(),
        variants: variants(),
        row_label: "pattern".into(),
        rows,
        counters_shown: shown,
        published_source: None,
        notes: vec![
            format!(
                "sequential: pread of {} KiB from 0 to the end; random: pread of 4 KiB at 1 page in {RANDOM_FRACTION}, a fixed pseudo-random sequence",
                SEQ_CHUNK >> 10
            ),
            "engine: read_ahead_kb 8192 and max_sectors_kb 4096 as this host's vda; disk I/Os split at max_sectors_kb; no device latency is modelled, so engine time is readahead's bookkeeping and copying only".into(),
            "host: disk reads and bytes are the device's (/sys/dev/block/…/stat), so other users of the disk add to them; folio sizes from /proc/kpageflags after the first pass".into(),
            "folio sizes: synchronous windows in 4K folios, each asynchronous window two orders larger, up to 2M (6.18 page_cache_ra_order on ext4; the engine models the same rule)".into(),
        ],
    })
}
