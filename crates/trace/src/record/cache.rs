//! The host's page cache of a file when the recording first sees it mapped: which of its
//! pages are cached, in folios of which order, and which folio carries the readahead mark
//! ([`crate::format::Event::Cache`]). A replay starts from it instead of a cold cache: on a warm cache
//! fault-around maps whatever is cached around a fault and readahead reads nothing, on a
//! cold one every first fault reads a window and marks a page in it, and the folios'
//! orders decide how much a fault maps (6.18 maps a large folio whole). Measured on 6.18:
//! replayed cold, a recording of `node -e 1` made right after evicting node's binary had
//! 292 kB less RssFile than the host; the host's cache held 810 order-2 folios of the binary
//! that exec's read of the ELF header had started.
//!
//! Read without changing it, as far as user space can: the file is opened through the
//! stopped process's descriptor (`/proc/PID/fd/N` reopens that very file) or, for a mapping
//! seen only in its `MMAP2` record, by the path the kernel reported, refused unless it is the
//! regular file of the recorded device and inode (`O_NOFOLLOW`, no symlink followed, nothing
//! created or truncated); it is mapped read-only and shared with `MADV_RANDOM` (our faults
//! read nothing ahead) in 64 MiB windows.
//! `mincore` says which pages are cached; `MADV_POPULATE_READ` maps each run of them into
//! our page tables without a signal if the file shrank meanwhile (a page evicted between the
//! two is read back in: a race this accepts); `/proc/self/pagemap` gives their frames, and
//! `/proc/kpageflags` the folio structure (`KPF_COMPOUND_TAIL`) and the readahead mark
//! (`KPF_RECLAIM`: `PG_readahead` shares `PG_reclaim`'s bit, checked on 6.18: after a
//! 832-byte `read` of an evicted file, page 1 of the 4-page window reports it). Our mapping
//! makes the pages young once, which reclaim's aging sees.
//!
//! A snapshot is taken when the recorder first sees the file, and again when a mapping
//! reaches past the size the last one saw (a file the program writes and maps as it grows):
//! at exec for the image's files (the process is stopped: the cache is what exec's reads
//! left), and at every `mmap` of a file, which a seccomp filter stops before it runs
//! (`sys::spawn_traced`; x86-64). Where the filter is missing (another architecture), the
//! drain loop takes it when it meets the `MMAP2` record, about a millisecond after the
//! `mmap`, when the process's first faults may have read ahead already: measured on git,
//! that later snapshot left exits up to 1.9 % over the host's RssFile.

use crate::format::{CachedFolio, MAX_CACHE_FOLIOS, MAX_CACHE_ORDER};
use crate::sys::FileWindow;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};

/// Bytes mapped at a time: bounds the page tables a snapshot takes (a multiple of 2 MiB,
/// so no folio crosses two windows).
const WINDOW_PAGES: u64 = (64 << 20) / 4096;
/// `/proc/kpageflags` bit of `PG_reclaim`, which `PG_readahead` aliases.
const KPF_RECLAIM: u64 = 9;
/// `/proc/kpageflags` bit of a compound page's tail page.
const KPF_COMPOUND_TAIL: u64 = 16;
/// Most pages all snapshots of a recording read (16 GiB of cache): each costs two reads
/// of procfs, so this bounds the recorder's time.
pub(super) const MAX_SNAPSHOT_PAGES: u64 = 1 << 22;

/// A snapshot: the file's size when it was taken, and its cached folios.
#[derive(Clone, Debug)]
pub(super) struct Snapshot {
    /// Bytes.
    pub(super) size: u64,
    /// In index order.
    pub(super) folios: Vec<CachedFolio>,
}

/// A folio being assembled from its head page and the tails after it.
#[derive(Clone, Copy)]
struct Run {
    index: u64,
    pages: u64,
    readahead: bool,
}

/// Appends `run` as one folio when it is one (a power of two of pages, aligned, at most
/// [`MAX_CACHE_ORDER`]), else as its pages one by one (the mark on the first).
fn flush(run: &mut Option<Run>, out: &mut Vec<CachedFolio>) {
    let Some(r) = run.take() else { return };
    let order = r.pages.trailing_zeros();
    if r.pages.is_power_of_two()
        && order <= u32::from(MAX_CACHE_ORDER)
        && r.index.is_multiple_of(r.pages)
    {
        out.push(CachedFolio {
            index: r.index,
            order: order as u8,
            readahead: r.readahead,
        });
        return;
    }
    for i in 0..r.pages {
        out.push(CachedFolio {
            index: r.index + i,
            order: 0,
            readahead: r.readahead && i == 0,
        });
    }
}

/// Opens `path` for reading only if it is a regular file: first as `O_PATH` (which runs no
/// driver's or FIFO's open: a mapped device such as a GPU's must not be opened by the
/// recorder), then reopened through that descriptor, so both are the same file.
fn open_regular(path: &str, flags: i32) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd;
    let p = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | flags)
        .open(path)
        .ok()?;
    let id = identity(&p)?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(format!("/proc/self/fd/{}", p.as_raw_fd()))
        .ok()?;
    (identity(&f)? == id).then_some(f)
}

/// Opens the regular file `path` if it is the file (`dev`, `ino`): no symlink followed,
/// nothing created.
pub(super) fn open_verified(path: &str, dev: u64, ino: u64) -> Option<std::fs::File> {
    open_regular(path, libc::O_NOFOLLOW).filter(|f| identity(f) == Some((dev, ino)))
}

/// Opens the file a stopped process `pid` has open as `fd`, if it is a regular file (its
/// `/proc` link reopens that very file, whatever its path now names).
pub(super) fn open_fd(pid: i32, fd: i32) -> Option<std::fs::File> {
    open_regular(&format!("/proc/{pid}/fd/{fd}"), 0)
}

/// (device as `major << 20 | minor`, inode) of a regular file.
pub(super) fn identity(f: &std::fs::File) -> Option<(u64, u64)> {
    let m = f.metadata().ok()?;
    let dev = super::dev_of(
        u64::from(libc::major(m.dev())),
        u64::from(libc::minor(m.dev())),
    );
    m.file_type().is_file().then_some((dev, m.ino()))
}

/// The page cache of `f`, reading at most `budget` pages (which it lowers by what it
/// read); `None` if it cannot be read.
pub(super) fn snapshot(f: &std::fs::File, budget: &mut u64) -> Option<Snapshot> {
    let m = f.metadata().ok()?;
    let pagemap = std::fs::File::open("/proc/self/pagemap").ok()?;
    let kpageflags = std::fs::File::open("/proc/kpageflags").ok()?;
    let pages = m.len().div_ceil(4096);
    let mut out = Vec::new();
    let mut run: Option<Run> = None;
    let mut start = 0u64;
    while start < pages && (out.len() as u64) < MAX_CACHE_FOLIOS && *budget > 0 {
        let n = (pages - start).min(WINDOW_PAGES).min(*budget);
        *budget -= n;
        let w = FileWindow::map(f, start * 4096, (n * 4096) as usize).ok()?;
        let cached = w.mincore().ok()?;
        let mut i = 0usize;
        while i < n as usize {
            if cached[i] & 1 == 0 {
                flush(&mut run, &mut out);
                i += 1;
                continue;
            }
            let j = i + cached[i..].iter().take_while(|&&c| c & 1 != 0).count();
            let mut entries = vec![0u8; (j - i) * 8];
            if w.populate(i, j - i).is_err()
                || pagemap
                    .read_exact_at(&mut entries, (w.addr() / 4096 + i as u64) * 8)
                    .is_err()
            {
                flush(&mut run, &mut out);
                i = j;
                continue;
            }
            for (k, e) in entries.chunks_exact(8).enumerate() {
                let e = u64::from_le_bytes(e.try_into().unwrap_or([0; 8]));
                let pfn = e & ((1 << 55) - 1);
                let mut fl = [0u8; 8];
                if e >> 63 == 0 || pfn == 0 || kpageflags.read_exact_at(&mut fl, pfn * 8).is_err() {
                    flush(&mut run, &mut out);
                    continue;
                }
                let flags = u64::from_le_bytes(fl);
                let index = start + (i + k) as u64;
                match run.as_mut() {
                    Some(r)
                        if flags >> KPF_COMPOUND_TAIL & 1 != 0 && r.index + r.pages == index =>
                    {
                        r.pages += 1;
                    }
                    _ => {
                        flush(&mut run, &mut out);
                        run = Some(Run {
                            index,
                            pages: 1,
                            readahead: flags >> KPF_RECLAIM & 1 != 0,
                        });
                    }
                }
            }
            i = j;
        }
        start += n;
    }
    flush(&mut run, &mut out);
    out.truncate(MAX_CACHE_FOLIOS as usize);
    Some(Snapshot {
        size: m.len(),
        folios: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    fn root() -> bool {
        std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .is_some_and(|l| l.split_whitespace().nth(2) == Some("0"))
        })
    }

    /// A cold file read by a 832-byte `read` of its header (what ld.so does before mapping
    /// a library): the snapshot shows the first readahead window, in order-0 folios, with
    /// the mark on its second page (checked on 6.18).
    #[test]
    fn a_header_read_of_a_cold_file_shows_its_window_and_mark() {
        if !root() {
            eprintln!("skipped: /proc/kpageflags needs root");
            return;
        }
        let path = std::env::temp_dir().join(format!("usermm-cache-{}.so", std::process::id()));
        let mut f = std::fs::File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        f.write_all(&vec![7u8; 64 << 10]).unwrap();
        f.sync_all().unwrap();
        drop(f);
        let f = std::fs::File::open(&path).unwrap();
        crate::sys::fadvise_dontneed(&f).unwrap();
        let m = f.metadata().unwrap();
        let dev = super::super::dev_of(
            u64::from(libc::major(m.dev())),
            u64::from(libc::minor(m.dev())),
        );
        let p = path.to_str().unwrap();
        let mut budget = 1 << 20;
        let cold = snapshot(&open_verified(p, dev, m.ino()).unwrap(), &mut budget)
            .unwrap()
            .folios;
        let warm = {
            let mut buf = [0u8; 832];
            f.read_exact_at(&mut buf, 0).unwrap();
            snapshot(&open_verified(p, dev, m.ino()).unwrap(), &mut budget)
                .unwrap()
                .folios
        };
        let other = open_verified(p, dev, m.ino() + 1);
        let _ = std::fs::remove_file(&path);
        if !cold.is_empty() {
            eprintln!("skipped: the file system keeps the file cached (tmpfs?)");
            return;
        }
        assert_eq!(warm[0].index, 0);
        assert!(warm.iter().all(|c| c.order == 0), "{warm:?}");
        let marked: Vec<u64> = warm
            .iter()
            .filter(|c| c.readahead)
            .map(|c| c.index)
            .collect();
        if warm.len() > 1 {
            assert_eq!(marked, vec![1], "{warm:?}");
        }
        // Another inode at that path: no snapshot.
        assert!(other.is_none());
        // The budget was charged the 16 pages of each snapshot read.
        assert_eq!(budget, (1 << 20) - 2 * 16);
    }
}
