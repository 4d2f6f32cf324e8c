//! The machine's primitive costs, measured from user space in this process (the caller
//! pins the thread): memory streams and chases, atomics, calls, traps, TLB flushes, page
//! zeroing and copying, and the physical adjacency of a layout's folios. They price the
//! recipes, the priors of a calibration ([`usermm_model::profile::priors`]).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;
/// Bytes of the buffers the memory primitives stream through: larger than L2, inside the
/// LLC, like the page tables and `struct page`s of a layout the kernel just populated.
const BUF: usize = 64 << 20;

/// Bytes the `zero_page` primitive zeroes per run: more than this machine's caches keep.
const ZERO_BUF: usize = 256 << 20;

pub use usermm_model::prices::*;

/// Measures every primitive on this machine (about a second; the caller pins the
/// thread). Each is the median of five runs.
pub fn measure() -> Primitives {
    let words = BUF / 8;
    let mut buf: Vec<u64> = (0..words as u64).collect();
    let atoms: Vec<AtomicU64> = (0..words as u64).map(AtomicU64::new).collect();
    // The median of the runs: on this 2-vCPU guest the minimum of nine, in processes a
    // few seconds apart, put kcall anywhere from 6.0 to 10.5 ns and the TLB flush from
    // 81 to 457 ns, a lucky run against an unlucky one.
    let best = |f: &mut dyn FnMut() -> f64| median((0..RUNS).map(|_| f())).unwrap_or(f64::MAX);
    let load_seq = best(&mut || {
        let t = Instant::now();
        let mut s = 0u64;
        for w in black_box(&buf).iter() {
            s = s.wrapping_add(*w);
        }
        black_box(s);
        ns_per(t, words)
    });
    let store_seq = best(&mut || {
        let t = Instant::now();
        for (i, w) in black_box(&mut buf).iter_mut().enumerate() {
            *w = i as u64;
        }
        black_box(&buf);
        ns_per(t, words)
    });
    let rmw_seq = best(&mut || {
        let t = Instant::now();
        for a in black_box(&atoms).iter() {
            a.fetch_and(!2, Ordering::Relaxed);
        }
        ns_per(t, words)
    });
    let line_seq = best(&mut || {
        let t = Instant::now();
        for (i, w) in black_box(&mut buf).iter_mut().step_by(8).enumerate() {
            *w = i as u64;
        }
        black_box(&buf);
        ns_per(t, words / 8)
    });
    let atomic_line = best(&mut || {
        let t = Instant::now();
        for a in black_box(&atoms).iter().step_by(8) {
            a.fetch_add(1, Ordering::Relaxed);
        }
        ns_per(t, words / 8)
    });
    let atomic_hot = best(&mut || {
        // Three words of one line in turn, as fork's refcount, PageAnonExclusive and
        // _mapcount updates of one struct page are.
        let line = HotLine::default();
        let n = 1 << 20;
        let t = Instant::now();
        for i in 0..n {
            black_box(&line).0[[0, 6, 7][i % 3]].fetch_add(1, Ordering::Relaxed);
        }
        ns_per(t, n)
    });
    let call = best(&mut || {
        let n = 1 << 20;
        let t = Instant::now();
        let mut acc = 0u64;
        for i in 0..n {
            acc = out_of_line(black_box(acc), i as u64);
        }
        black_box(acc);
        ns_per(t, n)
    });
    // One random cycle through the buffer's lines, for both chases.
    let next = chase_cycle(words / 8);
    // Its table of line numbers itself (4 MiB of u32), followed for 256 Ki steps.
    let line_rand = best(&mut || chase_ns(1 << 18, |at| next[at] as usize));
    let line_far = best(&mut || far_line_ns(&next));
    // A kernel call, calibrated on the host's own mprotect: per 4 KiB entry of
    // change_pte_range, 6.18 makes four out-of-line calls (vm_normal_page,
    // __ptep_modify_prot_start, __ptep_modify_prot_commit, native_set_pte under
    // PARAVIRT_XXL) around one PTE load, one xchg, one store and one struct page line
    // (the folio's, read by vm_normal_folio); what the entry costs beyond those is four
    // calls' worth. The struct page lines follow the region's frames, and how many of
    // them sit next to each other varies: standalone on an idle guest most do and
    // kcall read 2.2-2.5 ns, inside a bench run almost none do (line_jump: adjacency
    // 0.01) and it read 6.2-7.2. The rows run on such scattered frames, so each entry
    // is priced as if its frame were scattered too: the adjacent share of the region
    // is charged the random line it would have cost. With every call priced at this
    // loop's own price instead (the scattered share taken out: 0.8-1.3 ns), the model
    // fell short of the host by 30-60 % on most rows (17 of 45 within 20 % in one full
    // run): the calls on the long paths, after a trap or a system call, cost about as
    // much as mprotect's whole per-entry remainder on scattered frames. The tight loops'
    // own price is kcall_loop, measured where no struct page is read at all.
    let entries: Vec<(f64, f64)> = (0..RUNS)
        .filter_map(|_| kernel_pte_loop_ns(LoopPages::Written))
        .collect();
    let kcall = match median(entries.iter().map(|e| e.0)) {
        None => call,
        Some(entry) => {
            let adjacency = median(entries.iter().map(|e| e.1)).unwrap_or_default();
            let as_scattered = adjacency * (line_rand - line_seq).max(0.0);
            ((entry + as_scattered - load_seq - rmw_seq - store_seq - line_seq) / 4.0).max(call)
        }
    };
    let kcall_loop =
        median((0..RUNS).filter_map(|_| kernel_pte_loop_ns(LoopPages::ZeroPage).map(|e| e.0)))
            .map_or(call, |entry| {
                ((entry - load_seq - rmw_seq - store_seq) / 4.0).max(call)
            });
    let pages = BUF / 4096;
    let user_zero = best(&mut || {
        let t = Instant::now();
        for p in black_box(&mut buf).chunks_mut(512) {
            p.fill(0);
        }
        black_box(&buf);
        ns_per(t, pages)
    });
    // The kernel's page copy (`copy_mc_user_highpage` of a COW fault: `copy_page`'s string
    // moves over 4 KiB) is the same work as a user-space copy of 4 KiB chunks of cold
    // memory. No system call isolates it: on this AMD guest a `pread` of a written memfd
    // took 2 250-3 450 ns a page (into a hot 1 MiB buffer as well: shmem's read path, not
    // the copy) and `process_vm_readv` 800-1 100 ns (a GUP a page), where this copy takes
    // 530-600 and the calibrations priced the COW probes' own copies at 470-690.
    let mut dst = vec![1u64; words];
    let copy_page = best(&mut || {
        let t = Instant::now();
        for (d, s) in dst.chunks_mut(512).zip(black_box(&buf).chunks(512)) {
            d.copy_from_slice(s);
        }
        black_box(&dst);
        ns_per(t, pages)
    });
    drop(dst);
    let mut cold = vec![1u8; ZERO_BUF];
    let zero_page = best(&mut || kernel_zero_ns(&mut cold).unwrap_or(user_zero));
    drop(cold);
    drop((buf, atoms));
    let lock_pair = best(&mut || {
        let l = AtomicBool::new(false);
        let n = 1 << 20;
        let t = Instant::now();
        for _ in 0..n {
            let l = black_box(&l);
            while l
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {}
            l.store(false, Ordering::Release);
        }
        ns_per(t, n)
    });
    let syscall = best(&mut || {
        let n = 20_000;
        let t = Instant::now();
        for _ in 0..n {
            black_box(oracle::sys::getpid());
        }
        ns_per(t, n)
    });
    let slab_pair = best(&mut || {
        let n = 1 << 18;
        let t = Instant::now();
        for i in 0..n {
            black_box(Box::new([i as u8; 192]));
        }
        ns_per(t, n)
    });
    let task = best(&mut || {
        let n = 200;
        let t = Instant::now();
        for _ in 0..n {
            if oracle::sys::spawn_task_sharing_mm().is_err() {
                return f64::MAX;
            }
        }
        ns_per(t, n)
    });
    let trap = best(&mut || trap_ns().unwrap_or(f64::MAX));
    let mut p = Primitives {
        load_seq,
        store_seq,
        rmw_seq,
        line_seq,
        atomic_line,
        atomic_hot,
        kcall,
        kcall_loop,
        call,
        line_rand,
        line_far,
        line_jump: 0.0,
        zero_page,
        copy_page,
        lock_pair,
        syscall,
        trap: if trap == f64::MAX { syscall } else { trap },
        tlb_flush: 0.0,
        slab_pair,
        task: if task == f64::MAX { 0.0 } else { task },
        vma_slab: SlabCache::read("vm_area_struct"),
        node_slab: SlabCache::read("maple_node"),
    };
    p = p.with_frame_steps(frame_steps().unwrap_or(FrameSteps::ADJACENT));
    let zap_one = best(&mut || dontneed_difference_ns().unwrap_or(f64::MAX));
    p.tlb_flush = if zap_one == f64::MAX {
        0.0
    } else {
        // The zapped entry: its batch, the xchg of the PTE, the folio's reference.
        (zap_one - p.recipe_ns("zap_batches") - p.rmw_seq - p.atomic_hot).max(0.0)
    };
    p
}

/// `MADV_DONTNEED` of a mapped page less `MADV_DONTNEED` of an unmapped page in the same
/// page table, ns: a two-page shared mapping of a one-page memfd (so fault-around cannot
/// map the second) whose first page is read-faulted in before each pair (untimed); the
/// first call zaps one entry and flushes it from the TLB, the second finds nothing.
/// `None` if the host refuses a step.
fn dontneed_difference_ns() -> Option<f64> {
    use crate::host::region::{Region, MADV_DONTNEED};
    const N: u32 = 2000;
    let f = oracle::sys::memfd_with(c"usermm-flush", &[1u8; 4096]).ok()?;
    let r = Region::file(8192, std::os::fd::AsRawFd::as_raw_fd(&f), true, 0).ok()?;
    let (mapped, unmapped) = (r.addr, r.addr + 4096);
    let (mut with, mut without) = (0.0, 0.0);
    for _ in 0..N {
        oracle::sys::touch(mapped, 4096, false).ok()?;
        let t = Instant::now();
        oracle::sys::madvise(mapped, 4096, MADV_DONTNEED).ok()?;
        with += t.elapsed().as_secs_f64();
        let t = Instant::now();
        oracle::sys::madvise(unmapped, 4096, MADV_DONTNEED).ok()?;
        without += t.elapsed().as_secs_f64();
    }
    Some((with - without) * 1e9 / f64::from(N))
}

/// A dependent load of a random line of [`BUF`] bytes of fresh anonymous memory, asked for
/// in 2 MiB pages (`MADV_HUGEPAGE` on the 2 MiB-aligned part before any page is touched; the
/// host may refuse it): each line holds the number of its successor in the cycle `next`
/// (one entry per line), followed for 64 Ki steps.
fn far_line_ns(next: &[u32]) -> f64 {
    const MADV_HUGEPAGE: i32 = usermm::Advice::HugePage.number();
    const PMD: u64 = 2 << 20;
    let mut words: Vec<u64> = Vec::with_capacity(BUF / 8 + (PMD / 8) as usize);
    let start = (words.as_ptr() as u64).next_multiple_of(PMD);
    let _ = oracle::sys::madvise(start, BUF as u64, MADV_HUGEPAGE);
    words.resize(words.capacity(), 0);
    let skip = ((start - words.as_ptr() as u64) / 8) as usize;
    let words = &mut words[skip..skip + BUF / 8];
    for (line, &n) in next.iter().enumerate() {
        words[line * 8] = u64::from(n);
    }
    chase_ns(1 << 16, |at| words[at * 8] as usize)
}

/// ns per step of `steps` dependent steps `at = step(at)` from 0.
fn chase_ns(steps: usize, step: impl Fn(usize) -> usize) -> f64 {
    let t = Instant::now();
    let mut at = 0usize;
    for _ in 0..steps {
        at = black_box(step(at));
    }
    black_box(at);
    ns_per(t, steps)
}

/// A 64-byte line of atomics.
#[derive(Default)]
#[repr(align(64))]
struct HotLine([AtomicU64; 8]);

/// What the pages of [`kernel_pte_loop_ns`]'s region hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LoopPages {
    /// Written: each entry maps its own frame, whose `struct page` the loop reads.
    Written,
    /// Read-faulted: every entry maps the shared zero page, which has no `struct page` to
    /// read.
    ZeroPage,
}

/// The host kernel's time per entry of `change_pte_range`: `mprotect(PROT_READ)` of 64 MiB
/// of 4 KiB pages (`MADV_NOHUGEPAGE`) holding `pages`, divided by the entries, with the
/// fraction of the region's consecutive pages whose frames are adjacent ([`adjacency`]; 0 for
/// the zero page and where the host hides frame numbers); `None` if the host refuses a step.
/// No benchmark row times mprotect.
fn kernel_pte_loop_ns(pages: LoopPages) -> Option<(f64, f64)> {
    const LEN: u64 = 64 << 20;
    let r = crate::host::region::Region::anon_small_pages(LEN).ok()?;
    let adjacent = match pages {
        LoopPages::Written => {
            r.write_each_page().ok()?;
            adjacency(&r, LEN >> 12).unwrap_or(0.0)
        }
        LoopPages::ZeroPage => {
            r.read_each_page().ok()?;
            0.0
        }
    };
    let t = Instant::now();
    oracle::sys::mprotect(r.addr, LEN, crate::host::region::RO).ok()?;
    Some((ns_per(t, (LEN >> 12) as usize), adjacent))
}

/// How the frames of consecutive 4 KiB pages of 16 MiB of freshly written anonymous memory
/// (`MADV_NOHUGEPAGE`) follow each other; `None` if the host refuses a step or shows no
/// frame numbers.
fn frame_steps() -> Option<FrameSteps> {
    const PAGES: u64 = 4096;
    let r = crate::host::region::Region::anon_small_pages(PAGES << 12).ok()?;
    r.write_each_page().ok()?;
    folio_steps(r.addr, PAGES, 1, 0, Samples::Spread)
}

/// The fraction of the first `pages` consecutive 4 KiB pages of `r` (written) whose frames
/// are adjacent (one apart, either way), from `/proc/self/pagemap`; `None` if it cannot be
/// read or shows no frame numbers (without `CAP_SYS_ADMIN` they read 0).
///
/// It reads every entry, and so every page's `struct page`: the calibration of
/// [`Primitives::kcall`] times its `mprotect` right after, on a cache that holds them, so
/// that what it subtracts for each entry's line (a streamed one) is what the line cost and
/// the rest is the calls. Measured with a sampled read instead (a cold memmap), kcall read
/// 7.4-9.2 ns against 5.5-6.0, and spawn's model, which is mostly calls, rose by half;
/// cold `struct page`s are `line_jump`'s to price, per row, not the calls'.
fn adjacency(r: &crate::host::region::Region, pages: u64) -> Option<f64> {
    folio_steps(r.addr, pages, 1, 0, Samples::All).map(|s| s.adjacent)
}

/// How many folio boundaries [`folio_steps`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Samples {
    /// Every one.
    All,
    /// At most [`ADJACENCY_SAMPLES`], spread evenly.
    Spread,
}

/// Of the present pages of the `pages` from `addr` that begin a folio of `folio_pages` pages
/// (their page number `phase` more than a multiple of it: 0 where the mapping is aligned to the
/// folios) with the page before present, how far each frame is from that page's: adjacent
/// means a walk of the range steps from one folio's `struct page`s to the next folio's without
/// leaving the stream (what [`Primitives::line_jump`] prices the complement of). `None` if
/// `/proc/self/pagemap` cannot be read, shows no frame numbers, or no such pair exists.
///
/// With [`Samples::Spread`], at most [`ADJACENCY_SAMPLES`] folio boundaries are read, spread
/// evenly over the range, two entries each: reading `pagemap` walks the page table and reads each present page's
/// `struct page` (for `PM_MMAP_EXCLUSIVE`), so reading all of a layout right before a timed
/// `fork` or `munmap` would hand that call a cache holding every line it is about to walk.
pub(crate) fn folio_steps(
    addr: u64,
    pages: u64,
    folio_pages: u64,
    phase: u64,
    samples: Samples,
) -> Option<FrameSteps> {
    let f = std::fs::File::open("/proc/self/pagemap").ok()?;
    let step = folio_pages.max(1);
    let first_vpn = addr >> 12;
    // The folio boundaries with a page before them in the range, in page numbers.
    let first = {
        let b = first_vpn + (phase % step + step - first_vpn % step) % step;
        if b == first_vpn {
            b + step
        } else {
            b
        }
    };
    let end = first_vpn + pages;
    if first >= end {
        return None;
    }
    let boundaries = (end - 1 - first) / step + 1;
    let stride = match samples {
        Samples::All => 1,
        Samples::Spread => boundaries.div_ceil(ADJACENCY_SAMPLES).max(1),
    };
    // Every entry at once where every boundary is read; otherwise two per boundary.
    let all = match samples {
        Samples::All => Some(oracle::procfs::pagemap(&f, first_vpn, pages as usize).ok()?),
        Samples::Spread => None,
    };
    let pair = |vpn: u64| match &all {
        Some(all) => {
            let i = (vpn - first_vpn) as usize;
            Some([all[i - 1], all[i]])
        }
        None => oracle::procfs::pagemap(&f, vpn - 1, 2)
            .ok()
            .map(|e| [e[0], e[1]]),
    };
    let (mut adjacent, mut far, mut pairs) = (0u64, 0u64, 0u64);
    let mut shown = false;
    // One boundary at a pseudo-random place in each window of `stride`: a fixed stride
    // would meet the allocator's own period (frames come in runs of a power of two), and
    // read 0.002 where every boundary reads 0.34.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for window in (0..boundaries).step_by(stride as usize) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = window + x % stride.min(boundaries - window);
        let vpn = first + k * step;
        let e = pair(vpn)?;
        let present = |w: u64| w & oracle::procfs::PM_PRESENT != 0;
        let pfn = |w: u64| w & oracle::procfs::PM_PFN;
        shown |= pfn(e[0]) != 0 || pfn(e[1]) != 0;
        if present(e[0]) && present(e[1]) {
            let apart = pfn(e[1]).abs_diff(pfn(e[0]));
            pairs += 1;
            adjacent += u64::from(apart == 1);
            far += u64::from(apart >= FAR_FRAMES);
        }
    }
    (shown && pairs > 0).then(|| FrameSteps {
        adjacent: adjacent as f64 / pairs as f64,
        far: far as f64 / pairs as f64,
    })
}

/// The most folio boundaries [`folio_steps`] reads: enough for the fractions to within
/// about 4 points (95 %), few enough to touch about 1 in 32 of a 256 MiB layout's 4 KiB
/// pages' `struct page` lines.
const ADJACENCY_SAMPLES: u64 = 1024;

/// A page fault's round trip on this host: per 4 KiB page of 32 MiB of never-touched
/// anonymous memory (`MADV_NOHUGEPAGE`), a read from user space, which faults and maps the
/// shared zero page, less `MADV_POPULATE_READ` of as much such memory, which does the same
/// kernel work without the exception; `None` if the host refuses a step (before 5.14).
fn trap_ns() -> Option<f64> {
    const LEN: u64 = 32 << 20;
    const MADV_POPULATE_READ: i32 = usermm::Advice::PopulateRead.number();
    let per_page = |populate: bool| -> Option<f64> {
        let r = crate::host::region::Region::anon_small_pages(LEN).ok()?;
        let t = Instant::now();
        if populate {
            oracle::sys::madvise(r.addr, LEN, MADV_POPULATE_READ).ok()?;
        } else {
            r.read_each_page().ok()?;
        }
        Some(ns_per(t, (LEN >> 12) as usize))
    };
    let faulted = per_page(false)?;
    let populated = per_page(true)?;
    Some((faulted - populated).max(0.0))
}

/// The host kernel's time to zero a 4 KiB page of user memory: `read` of `/dev/zero` into
/// the populated `buf` (`clear_user`, the same string store `clear_page` uses), per page.
fn kernel_zero_ns(buf: &mut [u8]) -> Option<f64> {
    use std::io::Read;
    let mut f = std::fs::File::open("/dev/zero").ok()?;
    let t = Instant::now();
    f.read_exact(buf).ok()?;
    Some(ns_per(t, buf.len() / 4096))
}

/// Nanoseconds per item of `n` since `t`.
fn ns_per(t: Instant, n: usize) -> f64 {
    t.elapsed().as_secs_f64() * 1e9 / n as f64
}

/// A call that is not inlined and does a few instructions of work (a kernel helper's
/// call, return and prologue).
#[inline(never)]
fn out_of_line(acc: u64, i: u64) -> u64 {
    black_box(acc.rotate_left(5) ^ i)
}

/// Runs per primitive; the median is kept.
const RUNS: usize = 5;

/// `next[i]`: the line after line `i` in one random cycle through all `n` lines (Sattolo's
/// shuffle with a fixed xorshift stream, so every run chases the same cycle).
fn chase_cycle(n: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mut s = 0x2545_f491_4f6c_dd1du64;
    for i in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        order.swap(i, (s % i as u64) as usize);
    }
    let mut next = vec![0u32; n];
    for w in 0..n {
        next[order[w] as usize] = order[(w + 1) % n];
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chase_is_one_cycle_through_every_line() {
        let next = chase_cycle(1000);
        let mut seen = vec![false; 1000];
        let mut at = 0;
        for _ in 0..1000 {
            assert!(!seen[at], "line {at} visited twice");
            seen[at] = true;
            at = next[at] as usize;
        }
        assert_eq!(at, 0);
    }

    #[test]
    fn sampled_adjacency_matches_every_boundary_read_when_all_fit() {
        let r = crate::host::region::Region::anon_small_pages(64 << 20).unwrap();
        r.write_each_page().unwrap();
        for (fp, ph) in [(1, 0), (4, 0), (8, 3), (16, 0)] {
            // 1023 boundaries: every one read.
            let pages = ADJACENCY_SAMPLES * fp;
            let s = folio_steps(r.addr, pages, fp, ph, Samples::Spread).map(|s| s.adjacent);
            assert_eq!(
                s,
                folio_steps(r.addr, pages, fp, ph, Samples::All).map(|s| s.adjacent)
            );
            let f = adjacency_of_all(r.addr, pages, fp, ph);
            if f.is_some() && s.is_some() {
                assert_eq!(s, f);
            }
        }
        // 8191 boundaries, 1024 of them read: the sample's fraction is close to the whole's.
        let r = crate::host::region::Region::anon_small_pages(32 << 20).unwrap();
        r.write_each_page().unwrap();
        if let (Some(s), Some(f)) = (
            folio_steps(r.addr, 8192, 1, 0, Samples::Spread).map(|s| s.adjacent),
            adjacency_of_all(r.addr, 8192, 1, 0),
        ) {
            assert!((s - f).abs() < 0.1, "sampled {s}, all {f}");
        }
    }

    /// Every boundary's pair read, as `folio_steps` did before it sampled: the adjacent share.
    fn adjacency_of_all(addr: u64, pages: u64, folio_pages: u64, phase: u64) -> Option<f64> {
        let f = std::fs::File::open("/proc/self/pagemap").ok()?;
        let step = folio_pages.max(1);
        let mut prev: Option<u64> = None;
        let (mut adjacent, mut pairs) = (0u64, 0u64);
        oracle::procfs::scan_pagemap(&f, addr >> 12, pages, |vpn, e| {
            let present = e & oracle::procfs::PM_PRESENT != 0;
            let pfn = e & oracle::procfs::PM_PFN;
            if let (true, Some(q)) = (present, prev) {
                if vpn % step == phase % step {
                    pairs += 1;
                    adjacent += u64::from(pfn.abs_diff(q) == 1);
                }
            }
            prev = present.then_some(pfn);
        })
        .ok()?;
        (pairs > 0).then(|| adjacent as f64 / pairs as f64)
    }
}
