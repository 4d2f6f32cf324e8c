//! A cost model that predicts the host kernel's time from the engine's exact counters.
//!
//! The engine does what the kernel does, event for event, but not at the kernel's cost per
//! event: its PTEs are words of an arena behind a software page-table codec, its `struct
//! page` a side array, its faults function calls. Its times therefore do not predict the
//! kernel's, and neither do its gains. This model does: each engine counter names a piece
//! of kernel work (a PTE read, a locked bit clear on a PTE, an atomic on a `struct page`,
//! a page zeroed, a lock taken, a VMA duplicated, …), whose cost on *this* machine is
//! measured during each modelled benchmark by microbenchmarks in fresh processes
//! ([`Primitives`]); the prediction is Σ counter × cost, plus the fixed work of the timed
//! operation (a system call, a task created). Nothing is fitted to the benchmark rows: the primitives are measured, the
//! recipes ([`RECIPES`]) state what the kernel does per event, from reading Linux 6.18.
//!
//! Every table with engine variants gets one `model:<variant>` column per engine variant
//! ([`add_model_columns`]): the time the host kernel would take to run that variant's
//! algorithm. `host_matches` names the variant whose algorithm the host kernel runs; its
//! model column against the measured host column is the model's accuracy, printed under
//! the table. The model's gain over `model:<baseline>` beside the seed's published gain is
//! the project's prediction of what the patch does to a kernel on this machine.
//!
//! The kernel's instruction path is priced as out-of-line calls counted per event from the
//! 6.18 source and the running kernel's configuration: the recipes say which calls. A call
//! has two prices, both calibrated on the host's own `mprotect`, which no benchmark row
//! times: [`Primitives::kcall_loop`] in the loops of one system call that repeat the same
//! calls per page, folio or VMA, and [`Primitives::kcall`] on the long paths (a fault, a
//! system call's own work). The slab objects one fork allocates past what their caches keep
//! hot are priced cold ([`SlabCache`]).
//! Traps, TLB flushes, page zeroing and copying are the host kernel's own, timed from user
//! space by pairs of system calls that differ only in that work ([`Primitives::trap`],
//! [`Primitives::tlb_flush`]). What the model leaves out: work no engine counter names (a
//! task's first run in a new mm, the child's COW faults, RCU callbacks, the user's own
//! stores in a timed loop) and cache state beyond what the streamed primitives see.

use crate::model::{Better, Column, Table, Unit, Variant, VariantKind};
use crate::stats::{headline, summary};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use usermm_model::profile::HOST_FAR;
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
    let mut dst = vec![1u64; words];
    let user_copy = best(&mut || {
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
    let mut bytes = vec![1u8; BUF];
    let copy_page = best(&mut || kernel_copy_ns(&mut bytes).unwrap_or(user_copy));
    drop(bytes);
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
    const MADV_HUGEPAGE: i32 = 14;
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
    const MADV_POPULATE_READ: i32 = 22;
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

/// The host kernel's time to copy a 4 KiB page: `pread` of a written memfd into the
/// populated `buf` (a page-cache page copied to user memory), per page. It includes the
/// page-cache lookup, which a COW copy replaces with its own per-page work.
fn kernel_copy_ns(buf: &mut [u8]) -> Option<f64> {
    use std::os::unix::fs::FileExt;
    let f = oracle::sys::memfd_with(c"usermm-copy", buf).ok()?;
    let t = Instant::now();
    f.read_exact_at(buf, 0).ok()?;
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

/// Inserts a `model:<v>` column for every engine variant of `table`, before the host
/// column, and notes the model's accuracy against the host column for `host_matches`
/// (`prims`: the median of `all`, the measurements of fresh processes), and how far each
/// process's primitives alone would move it (see `spread_note`).
/// The counters behind a prediction are the engine cell's; a sample is the prediction in
/// the table's unit, repeated once per engine repetition (the model is deterministic).
pub fn add_model_columns(
    table: &mut Table,
    prims: &Primitives,
    host_matches: &str,
    all: &[Primitives],
) {
    let processes = all.len();
    let engines: Vec<(usize, Variant)> = table
        .variants
        .iter()
        .enumerate()
        .filter(|(_, v)| v.kind == VariantKind::Engine)
        .map(|(i, v)| (i, v.clone()))
        .collect();
    if engines.is_empty() {
        return;
    }
    let host = table
        .variants
        .iter()
        .position(|v| v.kind == VariantKind::Host);
    let at = host.unwrap_or(table.variants.len());
    let models: Vec<Variant> = engines
        .iter()
        .map(|(_, v)| Variant {
            name: model_name(&v.name),
            kind: VariantKind::Model,
            about: format!(
                "the cost model's prediction of the host kernel's time for `{}`: its exact counters x this machine's measured primitive costs",
                v.name
            ),
        })
        .collect();
    let mut own_adjacency = 0;
    // Per row: the prediction for `host_matches` with the median primitives and the least
    // and most with one process's own (ns).
    let mut spreads: Vec<(f64, f64, f64)> = Vec::new();
    for row in &mut table.rows {
        // The host layout's own frame steps, where its cell measured them: the walk the
        // model prices is that layout's (a report without the far share has all its
        // non-adjacent steps near).
        let host_counter = |name: &str| {
            host.and_then(|h| row.columns.get(h))
                .and_then(|c| c.counters.get(name))
                .map(|&permille| permille as f64 / 1000.0)
        };
        let steps = host_counter(crate::host::agent::FOLIO_ADJACENCY).map(|adjacent| FrameSteps {
            adjacent,
            far: host_counter(crate::host::agent::FOLIO_FAR).unwrap_or(0.0),
        });
        own_adjacency += usize::from(steps.is_some());
        let priced = |p: &Primitives| steps.map_or(*p, |s| p.with_frame_steps(s));
        let prims = &priced(prims);
        // The prediction for `host_matches` with the median primitives (ns).
        let mut mid = f64::NAN;
        let cells: Vec<Column> = engines
            .iter()
            .map(|(i, v)| {
                let c = &row.columns[*i];
                if c.samples.is_empty() {
                    return Column::unavailable(&model_name(&v.name), "no engine cell");
                }
                let (ns, parts) = predict(prims, &table.id, &c.counters);
                if v.name == host_matches {
                    mid = ns;
                }
                let value = match table.unit {
                    Unit::Seconds => ns * 1e-9,
                    Unit::PerSecond => 1e9 / ns.max(1e-3),
                    Unit::BytesPerSecond => f64::NAN,
                };
                Column::new(&model_name(&v.name), vec![value; c.samples.len()], parts)
            })
            .collect();
        // The least and most with one process's own.
        let (mut lo, mut hi) = (f64::NAN, f64::NAN);
        let matched = engines.iter().find(|(_, v)| v.name == host_matches);
        if let Some((i, _)) = matched.filter(|_| mid.is_finite()) {
            for p in all {
                let ns = predict(&priced(p), &table.id, &row.columns[*i].counters).0;
                (lo, hi) = (lo.min(ns), hi.max(ns));
            }
        }
        spreads.push((mid, lo, hi));
        row.columns.splice(at..at, cells);
    }
    table.variants.splice(at..at, models);
    table.host_matches = Some(host_matches.to_string());
    table.cost_model = Some(*prims);
    if let Some(a) = accuracy(table) {
        table.notes.push(format!(
            "model: {} within ±20 % of the host median on {} of {} rows (median error {:+.0} %, worst {:+.0} % at {}); primitives: {}; counters exact, nothing fitted to these rows",
            model_name(host_matches),
            a.within_20pct,
            a.rows,
            a.median_error_pct,
            a.worst_error_pct,
            a.worst_row,
            if processes == 0 {
                "measured in this process (no agent process could be started)".to_string()
            } else {
                format!("the median of {processes} fresh processes' measurements, before the table and after each row")
            }
        ));
    }
    if let Some(note) = spread_note(table, &spreads, processes) {
        table.notes.push(note);
    }
    if own_adjacency > 0 {
        table.notes.push(format!(
            "model: line_jump priced with the host layout's own frame steps ({}, {}) on {own_adjacency} of {} rows",
            crate::host::agent::FOLIO_ADJACENCY,
            crate::host::agent::FOLIO_FAR,
            table.rows.len()
        ));
    }
    if let Some(note) = slab_note(table, host_matches, prims) {
        table.notes.push(note);
    }
}

/// Counter of a `model:` cell: the low end of the prediction's 95 % interval, ns.
pub const MODEL_CI_LO: &str = "model_ci95_lo_ns";
/// Counter of a `model:` cell: the high end of the prediction's 95 % interval, ns.
pub const MODEL_CI_HI: &str = "model_ci95_hi_ns";

/// Inserts a `model:<v>` column for every engine variant of `table`, before the host
/// column, priced with a calibrated `profile` (`usermm calibrate`) instead of the recipes:
/// each cell is its exact counters × the fitted prices, with the 95 % prediction interval
/// ([`MODEL_CI_LO`], [`MODEL_CI_HI`]) and, beside `model:<baseline>`, the predicted gain's
/// interval (`gain_ci95_pct`). The note says how many rows land within ±20 % of the host,
/// names the rows outside, and gives the fit's leave-one-family-out error; `source` says
/// where the profile came from. Nothing of these rows enters the fit.
pub fn add_profile_columns(
    table: &mut Table,
    profile: &usermm_model::profile::Profile,
    host_matches: &str,
    source: &str,
) {
    let engines: Vec<(usize, String)> = table
        .variants
        .iter()
        .enumerate()
        .filter(|(_, v)| v.kind == VariantKind::Engine)
        .map(|(i, v)| (i, v.name.clone()))
        .collect();
    if engines.is_empty() {
        return;
    }
    let at = table
        .variants
        .iter()
        .position(|v| v.kind == VariantKind::Host)
        .unwrap_or(table.variants.len());
    let base = engines
        .iter()
        .find(|(_, v)| *v == table.baseline)
        .map(|&(i, _)| i);
    let id = table.id.clone();
    let host = table
        .variants
        .iter()
        .position(|v| v.kind == VariantKind::Host);
    for row in &mut table.rows {
        let op = row_op(&id, &row.label);
        // The scatter the host's allocator gave this row's layout, where its cell sampled
        // it: the engine's counters priced on the host's layout.
        let far = host
            .and_then(|h| row.columns.get(h))
            .and_then(|c| c.counters.get(HOST_FAR).copied());
        let with_far = |c: &BTreeMap<String, u64>| {
            let mut c = c.clone();
            if let Some(far) = far {
                c.insert(HOST_FAR.into(), far);
            }
            c
        };
        let base_counters = base
            .and_then(|b| row.columns.get(b))
            .map(|c| with_far(&c.counters));
        let cells: Vec<Column> = engines
            .iter()
            .map(|(i, v)| {
                let c = &row.columns[*i];
                if c.samples.is_empty() {
                    return Column::unavailable(&model_name(v), "no engine cell");
                }
                let counters = with_far(&c.counters);
                let p = profile.predict(op, &counters);
                let value = |ns: f64| match table.unit {
                    Unit::Seconds => ns * 1e-9,
                    Unit::PerSecond => 1e9 / ns.max(1e-3),
                    Unit::BytesPerSecond => f64::NAN,
                };
                let mut parts: BTreeMap<String, u64> = profile
                    .parts(op, &counters)
                    .into_iter()
                    .map(|(k, ns)| (format!("model_{k}_ns"), ns.round() as u64))
                    .collect();
                parts.insert(MODEL_CI_LO.into(), p.ci95[0].round() as u64);
                parts.insert(MODEL_CI_HI.into(), p.ci95[1].round() as u64);
                let mut col =
                    Column::new(&model_name(v), vec![value(p.ns); c.samples.len()], parts);
                if Some(*i) != base {
                    col.gain_ci95_pct = base_counters
                        .as_ref()
                        .and_then(|b| profile.gain(op, &counters, b))
                        .map(|(_, [lo, hi])| match table.better {
                            Better::Lower => [lo, hi],
                            // A rate's gain from a time's: 1/(1 - g) - 1, increasing in g.
                            // The time's interval may pass 100 %, which no time reaches.
                            Better::Higher => {
                                [lo, hi].map(|g| (1.0 / (1.0 - g.min(99.0) / 100.0) - 1.0) * 100.0)
                            }
                        });
                }
                col
            })
            .collect();
        row.columns.splice(at..at, cells);
    }
    let models: Vec<Variant> = engines
        .iter()
        .map(|(_, v)| Variant {
            name: model_name(v),
            kind: VariantKind::Model,
            about: format!(
                "the calibrated model's prediction of the host kernel's time for `{v}`: its exact counters x the prices fitted on this machine's probes"
            ),
        })
        .collect();
    table.variants.splice(at..at, models);
    table.host_matches = Some(host_matches.to_string());
    table.cost_model = Some(profile.primitives);
    let fit = &profile.fit;
    let quality = format!(
        "fit: {} probe points, median error {:.1} % in sample and {:.1} % leaving one probe family out",
        profile.observations.len(),
        fit.in_sample_median_pct,
        fit.held_out_median_pct()
    );
    match accuracy(table) {
        Some(a) => {
            let outside = outside_rows(table);
            table.notes.push(format!(
                "model: {} within ±20 % of the host median on {} of {} rows (median error {:+.0} %, worst {:+.0} % at {}){}; profile {source}; {quality}; nothing fitted to these rows",
                model_name(host_matches),
                a.within_20pct,
                a.rows,
                a.median_error_pct,
                a.worst_error_pct,
                a.worst_row,
                if outside.is_empty() {
                    String::new()
                } else {
                    format!("; outside ±20 % (marked !): {}", outside.join(", "))
                }
            ));
        }
        None => table
            .notes
            .push(format!("model: profile {source}; {quality}")),
    }
}

/// The operation a row of table `id` times, as `usermm_model::profile::features` names it:
/// its fixed work and its system calls' price.
pub fn row_op<'a>(id: &'a str, label: &str) -> &'a str {
    match id {
        "sharing" => match label.split_whitespace().next().unwrap_or_default() {
            "remap" => "mprotect",
            "munmap" => "munmap",
            "fork" => "fork",
            "pte-dontneed" => "madvise",
            _ => "fault",
        },
        id if id.starts_with("munlock") => "munlock",
        "fork" | "spawn" | "munmap" => id,
        _ => "fault",
    }
}

/// The rows whose `model:<host_matches>` misses the host median by more than 20 %.
pub fn outside_rows(table: &Table) -> Vec<String> {
    (0..table.rows.len())
        .filter(|&r| model_error_pct(table, r).is_some_and(|e| e.abs() > 20.0))
        .map(|r| table.rows[r].label.clone())
        .collect()
}

/// The error of `model:<host_matches>` against the host median on row `row`, percent of the
/// host's time (a rate's error is its inverse's).
pub fn model_error_pct(table: &Table, row: usize) -> Option<f64> {
    let m = table.variant_index(&model_name(table.host_matches.as_deref()?))?;
    let h = table
        .variants
        .iter()
        .position(|v| v.kind == VariantKind::Host)?;
    let r = table.rows.get(row)?;
    let (p, host) = (
        headline(table, &r.columns[m])?,
        headline(table, &r.columns[h])?,
    );
    // Error as a time: a rate's error is that of its inverse.
    let valid = host > 0.0 && p.is_finite() && (table.better == Better::Lower || p > 0.0);
    valid.then(|| match table.better {
        Better::Lower => (p - host) / host * 100.0,
        Better::Higher => (host - p) / p * 100.0,
    })
}

/// What the slab caches' hot objects did to `host_matches`'s predictions (`None` for a
/// table whose forks copy fewer VMAs and nodes than the caches keep hot on every row, or
/// that copies none): how many rows allocate past them, or that the caches could not be read.
fn slab_note(table: &Table, host_matches: &str, prims: &Primitives) -> Option<String> {
    let i = table.variants.iter().position(|v| v.name == host_matches)?;
    let counts: Vec<(u64, u64)> = table
        .rows
        .iter()
        .filter_map(|row| {
            let c = &row.columns.get(i)?.counters;
            let vmas = *c.get("vmas_copied")?;
            Some((vmas, c.get("vma_nodes_allocated").copied().unwrap_or(0)))
        })
        .collect();
    if counts.is_empty() {
        return None;
    }
    let (Some(vma), Some(node)) = (prims.vma_slab, prims.node_slab) else {
        return Some(
            "model: /sys/kernel/slab could not be read (it needs root): no fork is priced for VMAs and tree nodes past what the slab caches keep hot, so rows of many VMAs fall short".into(),
        );
    };
    let past = counts
        .iter()
        .filter(|&&(vmas, nodes)| vmas > vma.hot_objects() || nodes > node.hot_objects())
        .count();
    (past > 0).then(|| {
        format!(
            "model: the slab caches keep {} vm_area_structs and {} maple_nodes hot (/sys/kernel/slab: sheaves, barn, partial slabs); on {past} of {} rows a fork allocates past them and pays a cold line per object beyond",
            vma.hot_objects(),
            node.hot_objects(),
            counts.len()
        )
    })
}

/// How far the primitives' spread over the processes that measured them moves the model:
/// per row, `(median, least, most)` predictions for `host_matches` (ns: [`add_model_columns`]).
/// A row outside ±20 % of the host median under every process's primitives is a miss of the
/// model's structure (recipes, what it leaves out), not of one process's measurement.
fn spread_note(table: &Table, spreads: &[(f64, f64, f64)], processes: usize) -> Option<String> {
    let h = table
        .variants
        .iter()
        .position(|v| v.kind == VariantKind::Host)?;
    let (mut widest, mut widest_row) = (0.0f64, String::new());
    let (mut misses, mut structural) = (0, 0);
    for (row, &(mid, lo, hi)) in table.rows.iter().zip(spreads) {
        if !(mid > 0.0 && lo.is_finite() && hi.is_finite()) {
            continue;
        }
        let width = (hi - lo) / mid * 100.0;
        if width > widest {
            (widest, widest_row) = (width, row.label.clone());
        }
        let Some(host) = headline(table, &row.columns[h]).filter(|v| *v > 0.0) else {
            continue;
        };
        let host_ns = match table.unit {
            Unit::PerSecond => 1e9 / host,
            _ => host * 1e9,
        };
        let err = |ns: f64| (ns - host_ns) / host_ns;
        if err(mid).abs() > 0.2 {
            misses += 1;
            structural += usize::from(err(lo) > 0.2 || err(hi) < -0.2);
        }
    }
    (processes > 1 && !widest_row.is_empty()).then(|| {
        format!(
            "model spread: with one process's primitives instead of the median of {processes}, a row's prediction moves within a band {widest:.0} % of it wide at most ({widest_row}); of the {misses} rows outside ±20 % of the host median, {structural} stay outside with every process's primitives"
        )
    })
}

/// How close `model:<host_matches>` comes to the host column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Accuracy {
    /// Rows with both a prediction and a host median.
    pub rows: usize,
    /// Of those, rows whose prediction is within ±20 % of the host median.
    pub within_20pct: usize,
    /// The median signed error, percent of the host median (negative: predicted faster).
    pub median_error_pct: f64,
    /// The largest error by magnitude, percent.
    pub worst_error_pct: f64,
    /// Its row.
    pub worst_row: String,
}

/// The accuracy of a table's model for the variant the host runs, if it has both columns.
pub fn accuracy(table: &Table) -> Option<Accuracy> {
    let errs: Vec<(f64, String)> = (0..table.rows.len())
        .filter_map(|r| Some((model_error_pct(table, r)?, table.rows[r].label.clone())))
        .collect();
    if errs.is_empty() {
        return None;
    }
    let within = errs.iter().filter(|(e, _)| e.abs() <= 20.0).count();
    let worst = errs
        .iter()
        .max_by(|a, b| a.0.abs().total_cmp(&b.0.abs()))?
        .clone();
    let all: Vec<f64> = errs.iter().map(|e| e.0).collect();
    Some(Accuracy {
        rows: errs.len(),
        within_20pct: within,
        median_error_pct: summary(crate::model::Stat::Median, &all)?,
        worst_error_pct: worst.0,
        worst_row: worst.1,
    })
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
    fn the_slab_note_counts_the_rows_past_the_hot_objects_or_says_it_could_not_read_them() {
        use crate::model::Row;
        let cache = SlabCache {
            object_size: 192,
            objs_per_slab: 21,
            sheaf_capacity: 32,
            cpu_partial: 120,
            min_partial: 5,
        };
        let row = |vmas: u64| Row {
            label: format!("{vmas}"),
            columns: vec![
                Column::new(
                    "dup",
                    vec![1.0],
                    [("vmas_copied".to_string(), vmas)].into_iter().collect(),
                ),
                Column::new("host", vec![1.0], BTreeMap::new()),
            ],
            published: vec![],
            layout: None,
        };
        let table = timed_table("spawn", "dup", vec![row(21), row(821), row(6421)]);
        let known = Primitives {
            vma_slab: Some(cache),
            node_slab: Some(cache),
            ..Primitives::default()
        };
        let note = slab_note(&table, "dup", &known).expect("note");
        assert!(note.contains("keep 630 vm_area_structs"), "{note}");
        assert!(note.contains("on 2 of 3 rows"), "{note}");
        let unread = slab_note(&table, "dup", &Primitives::default()).expect("note");
        assert!(unread.contains("could not be read"), "{unread}");
        // Every fork within the hot objects, or no fork at all: nothing to say.
        let small = timed_table("spawn", "dup", vec![row(21)]);
        assert_eq!(slab_note(&small, "dup", &known), None);
        let fault = timed_table("fault", "dup", vec![]);
        assert_eq!(slab_note(&fault, "dup", &Primitives::default()), None);
    }

    /// A table `id` of times, lower better, with one engine variant `engine` and a host
    /// column, the rows' columns in that order.
    fn timed_table(id: &str, engine: &str, rows: Vec<crate::model::Row>) -> Table {
        Table {
            id: id.into(),
            title: String::new(),
            seed: None,
            metric: String::new(),
            unit: Unit::Seconds,
            better: Better::Lower,
            stats: vec![crate::model::Stat::Median],
            baseline: engine.into(),
            variants: vec![Variant::engine(engine, ""), Variant::host("")],
            row_label: String::new(),
            rows,
            counters_shown: vec![],
            published_source: None,
            notes: vec![],
            host_matches: None,
            cost_model: None,
        }
    }

    #[test]
    fn a_row_with_its_own_adjacency_prices_its_own_line_jump() {
        use crate::model::Row;
        let prims = Primitives {
            line_rand: 22.0,
            atomic_line: 6.0,
            ..Primitives::default()
        }
        .with_frame_steps(FrameSteps::ADJACENT);
        let engine = |n: u64| {
            Column::new(
                "batched",
                vec![1.0],
                [("fork_batches".to_string(), n)].into_iter().collect(),
            )
        };
        let host = |adjacency: Option<u64>| {
            Column::new(
                "host",
                vec![1.0],
                adjacency
                    .map(|a| (crate::host::agent::FOLIO_ADJACENCY.to_string(), a))
                    .into_iter()
                    .collect(),
            )
        };
        let row = |label: &str, adjacency| Row {
            label: label.into(),
            columns: vec![engine(1000), host(adjacency)],
            published: vec![],
            layout: None,
        };
        let rows = vec![row("scattered", Some(250)), row("unmeasured", None)];
        let mut t = timed_table("fork", "batched", rows);
        add_model_columns(&mut t, &prims, "batched", &[prims; 3]);
        let jump = |r: usize| {
            t.rows[r].columns[1]
                .counters
                .get("model_line_jump_ns")
                .copied()
        };
        // 1000 batches x 0.75 x (22 - 6) ns; the other row keeps the agents' adjacency (1).
        assert_eq!(jump(0), Some(12_000));
        assert_eq!(jump(1), Some(0));
        assert!(
            t.notes.iter().any(|n| n.contains("on 1 of 2 rows")),
            "{:?}",
            t.notes
        );
    }

    #[test]
    fn a_miss_under_every_process_primitives_is_structural() {
        use crate::model::Row;
        // 1000 syscalls: 100 us at 100 ns each, 150 us at 150 ns.
        let at = |ns: f64| Primitives {
            syscall: ns,
            ..Primitives::default()
        };
        let row = |label: &str, host_us: f64| Row {
            label: label.into(),
            columns: vec![
                Column::new(
                    "engine",
                    vec![1.0],
                    [("syscalls".to_string(), 1000)].into_iter().collect(),
                ),
                Column::new("host", vec![host_us * 1e-6], BTreeMap::new()),
            ],
            published: vec![],
            layout: None,
        };
        // Predictions 100-150 us (median 120): within ±20 % of 110, outside it for 200 with
        // every process's (structural), outside for 90 with the median's only.
        let rows = vec![row("in", 110.0), row("far", 200.0), row("edge", 90.0)];
        let mut t = timed_table("fault", "engine", rows);
        let all = [at(100.0), at(120.0), at(150.0)];
        add_model_columns(&mut t, &at(120.0), "engine", &all);
        let note = t.notes.iter().find(|n| n.starts_with("model spread"));
        let note = note.expect("a spread note");
        assert!(note.contains("band 42 % of it wide"), "{note}");
        assert!(
            note.contains("of the 2 rows outside ±20 % of the host median, 1 stay"),
            "{note}"
        );
    }

    #[test]
    fn a_profile_prices_every_engine_cell_with_an_interval_and_marks_rows_outside_20_pct() {
        use crate::model::Row;
        use usermm_model::fit::{Fit, Observation};
        use usermm_model::profile::{features, priors, Fingerprint, Profile, PROFILE_VERSION};
        let prims = Primitives {
            syscall: 100.0,
            load_seq: 1.0,
            rmw_seq: 5.0,
            store_seq: 1.0,
            kcall_loop: 3.0,
            ..Primitives::default()
        };
        // Probes: munmap-like calls zapping n entries at 40 ns each over a 1 us call.
        let obs: Vec<Observation> = ["a/4K", "b/4K"]
            .iter()
            .flat_map(|fam| {
                [1u64, 30, 300, 3000].map(|n| {
                    let c: BTreeMap<String, u64> =
                        [("syscalls".to_string(), 1), ("zap_batches".to_string(), n)]
                            .into_iter()
                            .collect();
                    Observation {
                        family: fam.to_string(),
                        op: "munmap".into(),
                        label: n.to_string(),
                        counters: features("munmap", &c, &prims, 0),
                        ns: 1000.0 + 40.0 * n as f64,
                    }
                })
            })
            .collect();
        let profile = Profile {
            version: PROFILE_VERSION,
            model_key: String::new(),
            created_unix: 0,
            fingerprint: Fingerprint::default(),
            primitives: prims,
            fit: Fit::new(&priors(&prims), &obs).expect("fit"),
            observations: obs,
            calibrate_seconds: 0.0,
            llc_bytes: 0,
            far_permille: None,
        };
        let cell = |v: &str, n: u64| {
            Column::new(
                v,
                vec![1.0; 3],
                [("syscalls".to_string(), 1), ("zap_batches".to_string(), n)]
                    .into_iter()
                    .collect(),
            )
        };
        let row = |label: &str, host_us: f64| Row {
            label: label.into(),
            columns: vec![
                cell("per-pte", 10_000),
                cell("batched", 5_000),
                Column::new("host", vec![host_us * 1e-6; 3], BTreeMap::new()),
            ],
            published: vec![],
            layout: None,
        };
        // 10 000 batches: about 401 us; a host at 410 is within 20 %, one at 900 is not.
        let mut t = timed_table(
            "munmap",
            "per-pte",
            vec![row("near", 410.0), row("far", 900.0)],
        );
        t.variants = vec![
            Variant::engine("per-pte", ""),
            Variant::engine("batched", ""),
            Variant::host(""),
        ];
        add_profile_columns(&mut t, &profile, "per-pte", "test");
        let names: Vec<&str> = t.variants.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "per-pte",
                "batched",
                "model:per-pte",
                "model:batched",
                "host"
            ]
        );
        let m = &t.rows[0].columns[2];
        let (lo, hi) = (
            m.counters[MODEL_CI_LO] as f64,
            m.counters[MODEL_CI_HI] as f64,
        );
        let ns = m.samples[0] * 1e9;
        assert!(lo < ns && ns < hi, "{lo} {ns} {hi}");
        assert!((ns - 401_000.0).abs() < 0.05 * 401_000.0, "{ns}");
        // The batched model's gain interval: about 50 %.
        let [glo, ghi] = t.rows[0].columns[3].gain_ci95_pct.expect("a gain interval");
        assert!(glo < 50.0 && 50.0 < ghi + 1.0, "{glo} {ghi}");
        let note = t
            .notes
            .iter()
            .find(|n| n.starts_with("model:"))
            .expect("note");
        assert!(note.contains("on 1 of 2 rows"), "{note}");
        assert!(note.contains("outside ±20 % (marked !): far"), "{note}");
        assert_eq!(outside_rows(&t), ["far"]);
        assert_eq!(row_op("sharing", "remap"), "mprotect");
        assert_eq!(row_op("munlock-one-node", "256M"), "munlock");
    }

    #[test]
    fn every_recipe_prices_a_real_counter_once() {
        // The engine's event counters, and the bench-side counters a table's engine cells
        // add: the spawn table's VMA-tree store work.
        let mut names: Vec<&str> = usermm::Ev::ALL.iter().map(|e| e.name()).collect();
        names.extend(crate::spawn::STORE_WORK_COUNTERS);
        for (i, r) in RECIPES.iter().enumerate() {
            assert!(
                names.contains(&r.counter),
                "{} is not an engine counter",
                r.counter
            );
            assert!(
                RECIPES[..i].iter().all(|o| o.counter != r.counter),
                "{} priced twice",
                r.counter
            );
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
}
