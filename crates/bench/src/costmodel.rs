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
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// Bytes of the buffers the memory primitives stream through: larger than L2, inside the
/// LLC, like the page tables and `struct page`s of a layout the kernel just populated.
const BUF: usize = 64 << 20;

/// Bytes the `zero_page` primitive zeroes per run: more than this machine's caches keep.
const ZERO_BUF: usize = 256 << 20;

/// Costs of the machine's primitive operations, nanoseconds each, measured by
/// [`Primitives::measure`] (the median of several runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Primitives {
    /// A load of the next 8-byte word of a stream (`ptep_get` in a page-table walk).
    pub load_seq: f64,
    /// A store to the next 8-byte word of a stream (`set_pte`).
    pub store_seq: f64,
    /// A locked read-modify-write of the next 8-byte word of a stream (x86-64's
    /// `ptep_set_wrprotect` `lock btr`, `ptep_get_and_clear` `xchg`).
    pub rmw_seq: f64,
    /// A store to the first word of the next 64-byte line of a stream (initialising or
    /// first touching a `struct page`).
    pub line_seq: f64,
    /// An atomic add to the first word of the next 64-byte line of a stream (the first
    /// atomic on a `struct page`: the line's fetch and the locked add).
    pub atomic_line: f64,
    /// An atomic add to a line already in L1, three words of it in turn (further atomics on
    /// the same `struct page`: refcount, flags, mapcount).
    pub atomic_hot: f64,
    /// An out-of-line kernel function on a long path, entered once per trap or system call
    /// (call, prologue, a few tests, return through this kernel's return thunk): the
    /// host's `mprotect` time per 4 KiB entry of 64 MiB on scattered frames, less that entry's
    /// memory operations, over its four calls (falls back to [`Primitives::call`] if the host
    /// refuses the mapping). Where the host hides frame numbers the region's frames count as
    /// scattered already. Loops that repeat their calls per page, folio or VMA pay
    /// [`Primitives::kcall_loop`] instead.
    pub kcall: f64,
    /// An out-of-line kernel call of a tight loop that repeats a few functions per page or
    /// folio inside one kernel entry (the per-batch calls of fork's copy and of zap, `set_pte`,
    /// the batch frees, munlock's walk and drains, fault-around's pages): the host's
    /// `mprotect` time per 4 KiB entry of 64 MiB that maps the shared zero page, less that
    /// entry's memory operations, over its four calls. `vm_normal_page` finds no `struct
    /// page` behind the zero page, so these entries read no page line and the price needs no
    /// correction for frame adjacency. On this 6.18 guest 15.5 ns per entry, about 2.5 ns per
    /// call, half of [`Primitives::kcall`]. Long paths keep `kcall` even where they repeat:
    /// a fault, a system call. `dup_mmap`'s and `exit_mmap`'s per-VMA work is a loop too
    /// (some forty functions per VMA, the same for every VMA of one fork): the host's
    /// fork+exit costs 172-180 ns per added empty VMA up to 421 VMAs on this guest, less than
    /// those calls would at `kcall` alone.
    pub kcall_loop: f64,
    /// A user-space out-of-line call and return with a few instructions of work.
    pub call: f64,
    /// A dependent load of a random entry of a 4 MiB table (a pointer chase through a
    /// working set the size of a 256 MiB layout's `struct page`s, about what L2 holds: a
    /// tree node, a list link, a `struct page` a few frames from the last one).
    pub line_rand: f64,
    /// A dependent load of a random 64-byte line of 64 MiB mapped by 2 MiB pages where the
    /// host gives them, as the kernel's direct map and `vmemmap` are (a pointer chase
    /// beyond what the caches keep: the `struct page` of a folio far from the last one in
    /// a memmap no walk has just read). On this 6.18 guest 150-170 ns, against
    /// [`Primitives::line_rand`]'s 22: a chase over 4 MiB reads 36 ns, over 16 MiB 73.
    pub line_far: f64,
    /// What a walk's first `struct page` line of a folio costs beyond a streamed one, on
    /// average: `near x (line_rand - atomic_line) + far x (line_far - atomic_line)`. Of the
    /// folio boundaries, `far` is the fraction whose frames are [`FAR_FRAMES`] or more apart
    /// (the next folio's `struct page` in another 4 KiB of memmap, which no stream brought
    /// in) and `near` the others that are not adjacent ([`FrameSteps`], from
    /// `/proc/self/pagemap`; where it shows no frame numbers, as without root, `line_jump`
    /// is 0). A row whose host cell read its own layout's steps is priced with them; the
    /// default is from 16 MiB of freshly faulted 4 KiB pages. On this 6.18 guest the
    /// adjacent share is 0.2-0.7 per process, 0.34 typically: the per-CPU lists hand out
    /// order-0 pages in LIFO order, so two folios in three that a walk meets sit on a
    /// `struct page` line that no stream brought in. The engine's frames are sequential; the
    /// host's are not.
    pub line_jump: f64,
    /// Zeroing a 4 KiB page that no cache holds, by the host kernel (`clear_page` of a
    /// fault's fresh page): a `read` of `/dev/zero` into 256 MiB of populated memory,
    /// per page (user-space `memset` if that fails). A layout's fresh pages are as large as
    /// the layout, beyond the caches, so zeroing them runs at memory bandwidth: on this
    /// guest `dd` from `/dev/zero` reads 24 GB/s into a 64 MiB buffer and 9 GB/s into a
    /// 256 MiB one (170 against 455 ns per page).
    pub zero_page: f64,
    /// Copying a 4 KiB page, by the host kernel (`copy_mc_user_highpage` of a COW fault):
    /// a `pread` of a written memfd into populated memory, per page, lookup included
    /// (user-space `memcpy` if that fails). On this guest 780 ns against 510.
    pub copy_page: f64,
    /// An uncontended spinlock acquire and release on a hot line.
    pub lock_pair: f64,
    /// A null system call's round trip (`getpid`): kernel entry and exit.
    pub syscall: f64,
    /// A page fault's exception round trip as this machine takes it: the host's time per
    /// read fault of never-touched anonymous memory (which maps the shared zero page) less
    /// its time per page to map the same with `MADV_POPULATE_READ`, which does the fault's
    /// kernel work without the exception ([`Primitives::syscall`] where the host lacks it).
    /// On this 6.18 guest 340 ns (450 against 110), where `getpid` takes 72.
    pub trap: f64,
    /// A TLB flush of one page or range by the host kernel (`flush_tlb_mm_range` and the
    /// `invlpg`, or its hypercall under a hypervisor): `MADV_DONTNEED` of a mapped page of a
    /// shared memfd (whose folio the page cache keeps) less `MADV_DONTNEED` of an unmapped
    /// page of the same table, less the recipe of the one PTE zapped. User space cannot time
    /// an `invlpg`, so the flush is what remains of the first call; 0 where the host
    /// refuses a step.
    pub tlb_flush: f64,
    /// A small allocation and its free (`malloc`/`free` of 192 bytes: the stand-in for a
    /// slab allocation and free of a VMA, an anon_vma or a maple node).
    pub slab_pair: f64,
    /// Creating a task that shares the mm, its exit and reaping it
    /// (`clone(CLONE_VM | CLONE_VFORK)` + `exit` + `waitpid`): fork's and exit's work that
    /// is not the mm's.
    pub task: f64,
    /// The host's `vm_area_struct` slab cache (`None` where `/sys/kernel/slab` cannot be
    /// read, as without root): the VMAs one operation allocates beyond what it keeps hot
    /// are priced cold ([`SlabCache::cold_work`]). A kernel fact, not a time: the same in
    /// every process.
    pub vma_slab: Option<SlabCache>,
    /// The host's `maple_node` slab cache, as [`Primitives::vma_slab`].
    pub node_slab: Option<SlabCache>,
}

/// Declares [`Prim`], one variant per field of [`Primitives`], with the table that maps
/// between them: [`Prim::ALL`], [`Primitives::get`], [`Primitives::get_mut`], [`prim_name`].
macro_rules! primitives {
    ($($variant:ident => $field:ident,)*) => {
        /// One primitive of [`Primitives`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Prim {
            $(
                #[doc = concat!("[`Primitives::", stringify!($field), "`].")]
                $variant,
            )*
        }

        impl Prim {
            /// Every primitive, in declaration order.
            pub const ALL: &'static [Prim] = &[$(Prim::$variant,)*];
        }

        impl Primitives {
            /// The cost of one primitive, ns.
            pub fn get(&self, p: Prim) -> f64 {
                match p {
                    $(Prim::$variant => self.$field,)*
                }
            }

            /// The cost of one primitive, ns, to set.
            pub fn get_mut(&mut self, p: Prim) -> &mut f64 {
                match p {
                    $(Prim::$variant => &mut self.$field,)*
                }
            }
        }

        /// The snake-case name of a primitive (its field's).
        pub fn prim_name(p: Prim) -> &'static str {
            match p {
                $(Prim::$variant => stringify!($field),)*
            }
        }
    };
}

primitives! {
    LoadSeq => load_seq,
    StoreSeq => store_seq,
    RmwSeq => rmw_seq,
    LineSeq => line_seq,
    AtomicLine => atomic_line,
    AtomicHot => atomic_hot,
    KCall => kcall,
    KCallLoop => kcall_loop,
    Call => call,
    LineRand => line_rand,
    LineFar => line_far,
    LineJump => line_jump,
    ZeroPage => zero_page,
    CopyPage => copy_page,
    LockPair => lock_pair,
    Syscall => syscall,
    Trap => trap,
    TlbFlush => tlb_flush,
    SlabPair => slab_pair,
    Task => task,
}

impl Primitives {
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

    /// These primitives with [`Primitives::line_jump`] priced for a layout whose folios sit
    /// next to the previous folio's frames, a few frames away or far away as `steps` says.
    pub fn with_frame_steps(mut self, steps: FrameSteps) -> Primitives {
        let adjacent = steps.adjacent.clamp(0.0, 1.0);
        let far = steps.far.clamp(0.0, 1.0 - adjacent);
        let near = 1.0 - adjacent - far;
        self.line_jump = near * (self.line_rand - self.atomic_line).max(0.0)
            + far * (self.line_far - self.atomic_line).max(0.0);
        self
    }

    /// Each primitive's median over `all` (`None` if `all` is empty; the upper of the two
    /// middle values for an even count).
    pub fn median_of(all: &[Primitives]) -> Option<Primitives> {
        let mut out = *all.first()?;
        for &p in Prim::ALL {
            *out.get_mut(p) = median(all.iter().map(|x| x.get(p)))?;
        }
        Some(out)
    }

    /// The price of one event of `counter` by its recipe (0 for an unpriced counter).
    fn recipe_ns(&self, counter: &str) -> f64 {
        recipe(counter).map_or(0.0, |r| r.work.iter().map(|&(p, k)| k * self.get(p)).sum())
    }
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

/// The most full sheaves a node's barn keeps for a slab cache before a free goes back to
/// the slabs (`MAX_FULL_SHEAVES` of 6.18's SLUB).
const BARN_FULL_SHEAVES: u64 = 10;

/// A slab cache of the host's, as `/sys/kernel/slab/<name>` describes it: what decides how
/// many objects a burst of allocations finds hot after a burst of frees.
///
/// A fork+exit allocates the child's VMAs and tree nodes and frees them all again. Up to
/// [`SlabCache::hot_objects`] of them the next fork gets back from the per-CPU sheaves, the
/// barn and the slabs kept on the per-CPU and node partial lists: objects written by the
/// last exit, still cached. Beyond that the cache has let the emptied slabs go (through RCU
/// for `vm_area_struct`, `SLAB_TYPESAFE_BY_RCU`) and takes new slabs or other partial
/// slabs, whose lines no cache holds. Measured on this 6.18 guest with the static spawn
/// agent (`kmem:mm_page_alloc` per fork+exit): 10.3-10.4 pages at 221 to 821 VMAs, 28.5 at 1 221,
/// 63.6 at 1 621, 136 at 3 221; and the host's cost per added VMA rose from 172-180 ns below
/// 421 VMAs to 360-390 above 1 600. Another process holding 5 600 free `vm_area_struct`s
/// in its partial slabs (so no fork needed a new slab) changed no rate by more than 5 %:
/// what costs is the cold line, not the new slab.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SlabCache {
    /// Bytes per object (`object_size`).
    pub object_size: u64,
    /// Objects per slab (`objs_per_slab`).
    pub objs_per_slab: u64,
    /// Objects per sheaf (`sheaf_capacity`; 0 where the cache has no sheaves).
    pub sheaf_capacity: u64,
    /// Free objects kept on the per-CPU partial slabs (`cpu_partial`).
    pub cpu_partial: u64,
    /// Empty slabs a node keeps before it frees one (`min_partial`).
    pub min_partial: u64,
}

impl SlabCache {
    /// The cache `name` as `/sys/kernel/slab` shows it (`None` if a file cannot be read).
    pub fn read(name: &str) -> Option<SlabCache> {
        let dir = std::path::Path::new("/sys/kernel/slab").join(name);
        let field = |f: &str| -> Option<u64> {
            let text = std::fs::read_to_string(dir.join(f)).ok()?;
            text.split_whitespace().next()?.parse().ok()
        };
        Some(SlabCache {
            object_size: field("object_size")?,
            objs_per_slab: field("objs_per_slab")?.max(1),
            sheaf_capacity: field("sheaf_capacity").unwrap_or(0),
            cpu_partial: field("cpu_partial")?,
            min_partial: field("min_partial")?,
        })
    }

    /// The objects a burst of frees leaves where the next burst of allocations on the same
    /// CPU finds them hot: the CPU's two sheaves and the barn's full ones, the per-CPU
    /// partial slabs' objects, and the node's kept empty slabs with the CPU's own slab.
    pub fn hot_objects(&self) -> u64 {
        self.sheaf_capacity * (2 + BARN_FULL_SHEAVES)
            + self.cpu_partial
            + (self.min_partial + 1) * self.objs_per_slab
    }

    /// The work `allocated` objects of one operation do beyond their hot price: each object
    /// past [`SlabCache::hot_objects`] has its first line far ([`Prim::LineFar`]), its other
    /// lines streamed after it, and its share of a slab taken and later let go
    /// (`allocate_slab` through the page allocator's per-CPU lists, the freelist shuffled,
    /// the discard and `__free_pages`: about 30 calls).
    pub fn cold_work(&self, allocated: u64) -> [(Prim, f64); 3] {
        let cold = allocated.saturating_sub(self.hot_objects()) as f64;
        let lines = self.object_size.div_ceil(64).max(1) as f64;
        [
            (Prim::LineFar, cold),
            (Prim::LineSeq, cold * (lines - 1.0)),
            (Prim::KCall, cold * 30.0 / self.objs_per_slab as f64),
        ]
    }
}

/// Frames this many or more apart count as far: their `struct page`s (64 bytes each) lie in
/// different 4 KiB of memmap, where no stream of the last one's reaches.
pub const FAR_FRAMES: u64 = 64;

/// How a walk of a layout steps from one folio's frames to the next folio's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FrameSteps {
    /// The fraction of folio boundaries whose frames are adjacent (one apart, either way).
    pub adjacent: f64,
    /// The fraction whose frames are [`FAR_FRAMES`] or more apart.
    pub far: f64,
}

impl FrameSteps {
    /// Every folio next to the last.
    pub const ADJACENT: FrameSteps = FrameSteps {
        adjacent: 1.0,
        far: 0.0,
    };
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

/// The median of `v` ([`summary`]'s: the upper of the two middle values for an even count);
/// `None` if empty.
fn median(v: impl Iterator<Item = f64>) -> Option<f64> {
    summary(crate::model::Stat::Median, &v.collect::<Vec<f64>>())
}

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

/// What the kernel does per event of one engine counter, in primitives.
#[derive(Clone, Copy, Debug)]
pub struct Recipe {
    /// The engine counter.
    pub counter: &'static str,
    /// Primitives per event (a negative count replaces work another recipe charged).
    pub work: &'static [(Prim, f64)],
    /// The kernel's work per event (Linux 6.18, x86-64).
    pub kernel: &'static str,
}

/// A spinlock round trip of 6.18 on this VM (KVM paravirt spinlocks): `_raw_spin_lock`
/// (a locked cmpxchg), `_raw_spin_unlock` calling the paravirt unlock (another locked
/// cmpxchg): three calls and two locked RMWs.
const SPIN: [(Prim, f64); 3] = [
    (Prim::LockPair, 1.0),
    (Prim::AtomicHot, 1.0),
    (Prim::KCall, 3.0),
];

/// Every counter the model prices. Counters not listed cost nothing in the model (they
/// are subsets of listed ones, or not work the kernel does: TLB hits of the engine's MMU).
///
/// The kernel's work per event is from reading 6.15-6.18 (`mm/memory.c`, `mm/rmap.c`,
/// `mm/swap.c`, `mm/page_alloc.c`, `mm/memcontrol.c`, `mm/mlock.c`, `mm/mmap.c`; the counts
/// per path are in `docs/research/kernel-calls-6.18.md`) and the
/// running 6.18.44's configuration and symbol table (`/proc/config.gz`, `/proc/kallsyms`:
/// which helpers are out of line): PREEMPT_RCU (each `rcu_read_lock`/`unlock` is a call),
/// DEBUG_LIST (each list add/del is a call), PARAVIRT_XXL (`set_pte` is a call to
/// `native_set_pte`), paravirt spinlocks, CONFIG_PAGE_MAPCOUNT, memcg v1 hooks compiled in.
pub const RECIPES: &[Recipe] = &[
    Recipe {
        counter: "syscalls",
        work: &[(Prim::Syscall, 1.0)],
        kernel: "a system call's entry and exit",
    },
    Recipe {
        counter: "pte_reads",
        work: &[(Prim::LoadSeq, 1.0)],
        kernel: "ptep_get: a load of the next entry of a page-table page",
    },
    Recipe {
        counter: "pte_writes",
        work: &[(Prim::StoreSeq, 1.0), (Prim::KCallLoop, 1.0)],
        kernel: "set_pte: a call to native_set_pte (PARAVIRT_XXL) storing the next entry",
    },
    Recipe {
        counter: "pte_atomics",
        work: &[(Prim::RmwSeq, 1.0), (Prim::StoreSeq, -1.0), (Prim::KCallLoop, -1.0)],
        kernel: "ptep_set_wrprotect (lock cmpxchg) and ptep_get_and_clear (xchg): inline locked RMWs instead of set_pte calls",
    },
    Recipe {
        counter: "folio_atomics",
        work: &[(Prim::AtomicHot, 1.0)],
        kernel: "atomic_inc/add/dec on _refcount, _mapcount, _large_mapcount; PageAnonExclusive and other flag bitops",
    },
    Recipe {
        counter: "mapcount_atomics",
        work: &[(Prim::AtomicLine, 1.0), (Prim::AtomicHot, -1.0)],
        kernel: "per-page _mapcount (CONFIG_PAGE_MAPCOUNT): the first atomic on each struct page's line, streamed",
    },
    Recipe {
        counter: "fork_batches",
        work: &[(Prim::KCallLoop, 1.0), (Prim::LineJump, 1.0)],
        kernel: "copy_present_ptes (inlined) per batch: vm_normal_page; folio_pte_batch_flags is inlined; the folio's first struct page line, off the stream when the folio is not physically next to the last (line_jump)",
    },
    Recipe {
        counter: "zap_batches",
        work: &[(Prim::KCallLoop, 10.0), (Prim::LineJump, 1.0)],
        kernel: "zap_present_ptes (inlined) per batch: vm_normal_page, folio_remove_rmap_ptes, the NR_ANON_MAPPED stat chain (__lruvec_stat_mod_folio: rcu lock/unlock, __mod_lruvec_state, __mod_node_page_state, mod_memcg_lruvec_state, css_rstat_updated), __tlb_remove_folio_pages; the folio's first struct page line, off the stream when the folio is not physically next to the last (line_jump)",
    },
    Recipe {
        counter: "lock_ptl",
        work: &SPIN,
        kernel: "pte_offset_map_lock/pte_unmap_unlock: a split PTE-table spinlock (the rcu read lock around it is two more calls, counted in the 3)",
    },
    Recipe {
        counter: "lock_page_table",
        work: &SPIN,
        kernel: "mm->page_table_lock",
    },
    Recipe {
        counter: "lock_mmap",
        work: &[(Prim::AtomicHot, 2.0), (Prim::KCall, 2.0)],
        kernel: "mmap_read_lock/mmap_write_lock: an uncontended rwsem (a locked cmpxchg each way, two calls)",
    },
    Recipe {
        counter: "lock_zone",
        work: &[],
        kernel: "the engine takes the zone lock per folio; Linux goes through the per-CPU lists for orders 0-3 and 9 (priced in folios_allocated and folios_freed) and takes zone->lock for the others (folios_buddy_direct)",
    },
    Recipe {
        counter: "folios_buddy_direct",
        work: &[
            (Prim::LockPair, 1.0),
            (Prim::AtomicHot, 1.0),
            (Prim::KCall, 6.0),
            (Prim::LineRand, 1.0),
        ],
        kernel: "a 64K-1M folio allocated (rmqueue_buddy) or freed (free_one_page) in the buddy lists: zone->lock with interrupts off (spin_lock_irqsave and its paravirt unlock), __rmqueue_smallest or __free_one_page with the buddy's struct page and the free-list links (traced on this 6.18 guest: each 64K folio took zone->lock once to be allocated and once to be freed, §9)",
    },
    Recipe {
        counter: "lock_lru",
        work: &SPIN,
        kernel: "lruvec->lru_lock (spin_lock_irq)",
    },
    Recipe {
        counter: "batch_drains",
        work: &[(Prim::KCallLoop, 5.0)],
        kernel: "a per-CPU folio batch drained (folio_batch_move_lru or mlock_folio_batch, folios_put_refs; its lru_lock is lock_lru)",
    },
    Recipe {
        counter: "tlb_flush_page",
        work: &[(Prim::TlbFlush, 1.0)],
        kernel: "flush_tlb_page of one user address (ptep_clear_flush of a COW fault)",
    },
    Recipe {
        counter: "tlb_flush_range",
        work: &[(Prim::TlbFlush, 1.0)],
        kernel: "flush_tlb_range / tlb_flush_mmu of a range (invlpg per page up to 33 pages, else the whole TLB)",
    },
    Recipe {
        counter: "tlb_flush_mm",
        work: &[(Prim::TlbFlush, 1.0)],
        kernel: "flush_tlb_mm of the whole address space (fork's write-protect, exit)",
    },
    Recipe {
        counter: "gather_flushes",
        work: &[(Prim::KCall, 12.0)],
        kernel: "tlb_finish_mmu/tlb_flush_mmu with something gathered: tlb_flush_mmu_tlbonly, tlb_batch_pages_flush, free_pages_and_swap_cache and its batch loop, tlb_table_flush, plus the lru_add_drain of zap_page_range_single (about 12 calls; the flush itself is tlb_flush_range)",
    },
    Recipe {
        counter: "pgtable_allocated",
        work: &[
            (Prim::KCall, 33.0),
            (Prim::LockPair, 1.0),
            (Prim::AtomicHot, 3.0),
        ],
        kernel: "__pte_alloc: pte_alloc_one (a page from the per-CPU lists, memcg kmem charge, pagetable_pte_ctor: ptlock init, NR_PAGETABLE stat: about 30 calls and 2 locked RMWs) and pmd_install under the PMD lock (one spinlock round trip); the zeroing is pages_zeroed",
    },
    Recipe {
        counter: "pgtable_freed",
        work: &[(Prim::KCall, 4.0)],
        kernel: "free_pte_range -> pte_free_tlb -> tlb_remove_table: the synchronous part; pagetable_dtor (NR_PAGETABLE stat, memcg kmem uncharge) and the page's free run later from an RCU callback, outside the timed call (traced, §9)",
    },
    Recipe {
        counter: "cow_reuses",
        work: &[(Prim::KCall, 8.0), (Prim::AtomicHot, 3.0)],
        kernel: "wp_page_reuse of an exclusive anon folio: folio_trylock/unlock, the refcount and swapcache checks of wp_can_reuse_anon_folio, ptep_set_access_flags (and its local flush_tlb_fix_spurious_fault)",
    },
    Recipe {
        counter: "pages_zeroed",
        work: &[(Prim::ZeroPage, 1.0)],
        kernel: "clear_page_erms of a new anonymous, shmem or page-table page",
    },
    Recipe {
        counter: "user_bytes_cold",
        work: &[(Prim::ZeroPage, 1.0 / 4096.0)],
        kernel: "not kernel work: the user's own stores inside the timed operation (a memset of pages the write's fault neither zeroed nor copied, as after a COW reuse), a store stream to memory beyond the caches like clear_page's: zero_page per 4 KiB",
    },
    Recipe {
        counter: "pages_copied",
        work: &[(Prim::CopyPage, 1.0)],
        kernel: "copy_mc_user_highpage of a COW copy",
    },
    Recipe {
        counter: "faults",
        work: &[
            (Prim::Trap, 1.0),
            (Prim::KCall, 22.0),
            (Prim::AtomicHot, 2.0),
            (Prim::LineRand, 3.0),
        ],
        kernel: "the exception's round trip (trap); lock_vma_under_rcu (mas_walk over about three nodes, the VMA refcount taken and dropped: two locked RMWs); handle_mm_fault with PGFAULT memcg accounting; set_ptes and unlock: about 22 calls besides the folio's allocation",
    },
    Recipe {
        counter: "folios_allocated",
        work: &[
            (Prim::KCall, 60.0),
            (Prim::AtomicHot, 4.0),
            (Prim::LineRand, 1.0),
        ],
        kernel: "a folio for a fault: vma_alloc_folio -> get_page_from_freelist -> rmqueue_pcplist (15 calls, pcp trylock), __mem_cgroup_charge (19 calls on a per-CPU stock hit, and 2 more for the PGPGIN event memcg v1 counts on every charge, traced in §9), folio_add_new_anon_rmap and its stat chain (9), folio_add_lru and its share of the 31-folio drain (15); locked: pcp lock, SetPageAnonExclusive, folio_get, LRU flag bits",
    },
    Recipe {
        counter: "frames_allocated",
        work: &[(Prim::LineSeq, 1.0)],
        kernel: "post_alloc_hook initialises each struct page of a new folio",
    },
    Recipe {
        counter: "folios_freed",
        work: &[(Prim::KCallLoop, 15.0)],
        kernel: "a folio freed after a TLB flush (its struct page line is still cached: the rmap removal of the same batch touched it; zap_batches prices that first touch): free_swap_cache, lruvec_del_folio with its LRU-size stats, uncharge_folio, free_pages_prepare, get_pfnblock_migratetype, free_frozen_page_commit, its share of the 31-folio batch (folios_put_refs, memcg uncharge_batch, pcp trylock); no share of free_pcppages_bulk: traced on this 6.18 guest, a 16 MiB munmap sent no page from the per-CPU lists back to the buddy lists (docs/research/kernel-calls-6.18.md §9)",
    },
    Recipe {
        counter: "frames_freed",
        work: &[(Prim::LineSeq, 1.0)],
        kernel: "free_pages_prepare checks and clears each struct page (tail pages too)",
    },
    Recipe {
        counter: "vmas_copied",
        work: &[
            (Prim::KCallLoop, 17.0),
            (Prim::AtomicHot, 3.0),
            (Prim::SlabPair, 0.5),
            (Prim::LineSeq, 3.0),
        ],
        kernel: "dup_mmap per VMA: mas_find, vma_start_write on the parent (three locked RMWs), vm_area_dup (slab allocation with its memcg hook, a 184-byte copy), vma_dup_policy, dup_userfaultfd, anon_vma_fork, mas_store, copy_page_range; the same calls for every VMA of one fork, so at the loop price (kcall_loop: on this 6.18 guest the host's fork+exit costs 172-180 ns per added empty VMA up to 421 VMAs, less than these and vmas_freed's 38 calls at kcall alone, 255 ns); a VMA past what the slab cache keeps hot is priced cold besides (SlabCache::cold_work)",
    },
    Recipe {
        counter: "vmas_freed",
        work: &[
            (Prim::KCallLoop, 21.0),
            (Prim::AtomicHot, 4.0),
            (Prim::SlabPair, 0.5),
        ],
        kernel: "exit_mmap or munmap per VMA: unmap_single_vma, free_pgtables' share (vma_start_write, unlink_anon_vmas, unlink_file_vma_batch_add), vma_mark_detached, remove_vma -> vm_area_free (slab free with its memcg hook); the same calls for every VMA of one exit or munmap, at the loop price as vmas_copied's",
    },
    Recipe {
        counter: "anon_vma_forks",
        work: &[
            (Prim::KCallLoop, 20.0),
            (Prim::SlabPair, 3.0),
            (Prim::LockPair, 2.0),
            (Prim::AtomicHot, 1.0),
            (Prim::LineSeq, 4.0),
        ],
        kernel: "anon_vma_fork past its early return, for a parent VMA on a chain of one anon_vma (its own, as a process's writes make it): anon_vma_clone (anon_vma_chain_alloc, the root's rwsem taken and dropped, anon_vma_chain_link with its interval-tree insert), anon_vma_alloc and its root reference (one locked RMW), the child's own chain link under its lock: about 20 calls of dup_mmap's per-VMA loop, two chain links (64 bytes each) and an anon_vma (104 bytes) allocated, written and, at exit, freed",
    },
    Recipe {
        counter: "anon_vma_unlinks",
        work: &[
            (Prim::KCallLoop, 15.0),
            (Prim::LockPair, 1.0),
            (Prim::AtomicHot, 2.0),
        ],
        kernel: "unlink_anon_vmas of a VMA on a chain of one or two links (a process's own, or a fork child's): each link's interval-tree removal and list_del under the root's rwsem, the anon_vma's put (a locked RMW; the last frees it and drops the root's reference, another) and the links freed (their slab frees are anon_vma_forks'): about 15 calls",
    },
    Recipe {
        counter: "vma_nodes_allocated",
        work: &[(Prim::SlabPair, 1.0), (Prim::LineSeq, 4.0)],
        kernel: "a maple node of the child's tree allocated (and freed at exit) and its 256 bytes written",
    },
    // The child's VMA tree built store by store (the spawn table's insert column: seed 001's
    // baseline, 6.5.0-next-20230829, not 6.18; see maple's bulk module). The walk of each
    // store is vmas_copied's mas_store call, on both columns; a node's first write is
    // vma_nodes_allocated's. Nodes the stores touch again are hot (the leaf the walk just
    // read, the rightmost path, the big node on the stack, pool nodes freed by the last
    // split and popped again: the tree is out of RCU mode), priced at one streamed word
    // (load_seq, store_seq) per 64-byte line. Their calls run inside dup_mmap's per-VMA
    // loop, at the loop price as vmas_copied's (pricing the baseline's store work at kcall
    // while the loop around it pays kcall_loop would inflate the seed's predicted gain).
    Recipe {
        counter: "maple_appends",
        work: &[(Prim::KCallLoop, 4.0), (Prim::LoadSeq, 4.0), (Prim::StoreSeq, 3.0)],
        kernel: "a store appended in place in the rightmost leaf (next-20230829): mas_wr_modify -> mas_wr_new_end, mas_wr_append (the old end's pivot moved to new_end and new_end into the metadata below offset 15, then the entry's and the NULL's slots and pivots: one or two ranges, about 6 words on 3 of the leaf's lines), mas_update_gap -> mas_leaf_max_gap scanning the leaf's 4 lines and the parent's recorded gap compared (each slot the climb then writes is maple_gap_updates): about 4 calls",
    },
    Recipe {
        counter: "maple_gap_updates",
        work: &[(Prim::KCallLoop, 1.0), (Prim::LoadSeq, 2.0), (Prim::StoreSeq, 2.0)],
        kernel: "one level of mas_parent_gap's climb: the parent's gap slot written; the trailing gap, the node's largest, shrank, so ma_max_gap rescans its up to 10 gaps (2 lines) and the offset goes back into the metadata (ma_set_meta_gap), then mte_parent, mas_parent_type and mte_parent_slot lead to the grandparent: about 1 call",
    },
    Recipe {
        counter: "maple_splits",
        work: &[(Prim::KCallLoop, 27.0), (Prim::StoreSeq, 45.0), (Prim::LoadSeq, 16.0)],
        kernel: "one node split by mas_split in bulk mode, with the slow path's share of the store (charged to each split and push, though only the first level's store pays it: about 1 in 9 is over-charged 15 calls): per level mas_new_ma_node twice, mas_push_data left (mas_prev_sibling up and down, the sibling's end) and right (no sibling), mab_calc_split, mast_split_data (mab_mas_cp into both halves, mas_set_split_parent), mast_fill_bnode (the big node zeroed, the parent copied in around the halves, mab_set_b_end twice, mas_ascend): about 12 calls; per store mas_wr_bnode (the big node zeroed, mas_store_b_node), mas_commit_b_node, mas_split_final_node, mas_wmb_replace -> mas_replace_node, mas_adopt_children, mas_free of the replaced nodes into the pool, mtree_range_walk, mas_update_gap: about 15. Lines: the two halves and the parent written (12; hot pool nodes), about 6 children's parent pointers, the 9-line big node zeroed twice and filled (27); the overfull node and the parent copied in and the re-walk (16 read)",
    },
    Recipe {
        counter: "maple_pushes",
        work: &[(Prim::KCallLoop, 32.0), (Prim::StoreSeq, 45.0), (Prim::LoadSeq, 20.0)],
        kernel: "an overfull node shared out with its left sibling (mas_push_data succeeding, in mas_split) with the slow path's share of the store as in maple_splits: mas_prev_sibling, the sibling's end and its 4 lines copied into the big node (mas_mab_cp, mab_shift_right), mab_calc_split, mast_split_data (mab_mas_cp into two new nodes, mas_set_split_parent), mast_fill_bnode, mas_split_final_node (the new parent): about 17 calls, and about 15 per store as for a split (three nodes freed into the pool); lines as a split's plus the sibling's 4 read",
    },
    Recipe {
        counter: "pgmlocked",
        work: &[(Prim::KCallLoop, 19.0), (Prim::AtomicHot, 4.0)],
        kernel: "mlock_folio and __mlock_folio in the batch: NR_MLOCK stat, folio_evictable (rcu, folio_mapping), LRU moves with their LRU-size stats; flag bits",
    },
    Recipe {
        counter: "pgmunlocked",
        work: &[(Prim::KCallLoop, 19.0), (Prim::AtomicHot, 4.0)],
        kernel: "vm_normal_folio and munlock_folio per PTE, __munlock_folio in the batch: NR_MLOCK stat, folio_evictable (rcu, folio_mapping), lruvec_del_folio/lruvec_add_folio with LRU-size stats; test-and-clear LRU and mlocked, clear unevictable, set LRU",
    },
    Recipe {
        counter: "mlock_pte_folios",
        work: &[
            (Prim::AtomicLine, 1.0),
            (Prim::AtomicHot, -1.0),
            (Prim::LineJump, 1.0),
        ],
        kernel: "mlock_pte_range per small folio or large folio's batch: vm_normal_folio, then folio_test_large and the mlock or munlock test on the folio's first struct page line, its first touch (pgmlocked and pgmunlocked price the folio's atomics as hot; one of them is this touch): streamed, and off the stream when the folio is not physically next to the last (line_jump)",
    },
    Recipe {
        counter: "pmd_folio_visits",
        work: &[(Prim::LineFar, 1.0), (Prim::AtomicHot, -1.0)],
        kernel: "a PMD-mapped folio reached by mlock_pte_range's huge arm or copy_huge_pmd: the head's struct page line, 32 KiB of memmap from the last head, which no stream brought in (line_far; one of the folio's atomics priced hot is this touch). Measured on this 6.18 guest: munlock of 128 locked THPs took 50-56 us as the bench times it and 26-28 us when smaps_rollup had read every head just before",
    },
    Recipe {
        counter: "lru_isolated",
        work: &[(Prim::KCallLoop, 7.0), (Prim::AtomicHot, 1.0)],
        kernel: "folio_isolate_lru: clear PG_lru, lruvec_del_folio (a list-debug call and the LRU-size stat chain)",
    },
    Recipe {
        counter: "faults_file",
        work: &[(Prim::KCall, 23.0), (Prim::AtomicHot, 2.0)],
        kernel: "a file fault beyond what faults prices: do_read_fault's fault-around attempt, __do_fault and shmem_fault, finish_fault and set_pte_range, folio_add_file_rmap_ptes with its NR_FILE_MAPPED chain, folio_unlock (docs/research/kernel-calls-6.18.md §8)",
    },
    Recipe {
        counter: "pagecache_add",
        work: &[
            (Prim::KCall, 42.0),
            (Prim::LockPair, 3.0),
            (Prim::AtomicHot, 3.0),
            (Prim::LineSeq, 0.2),
        ],
        kernel: "a shmem folio added to the page cache: memcg charge, __filemap_add_folio under the xarray lock, the NR_FILE_PAGES and NR_SHMEM stat chains, inode block accounting under i_lock, shmem_recalc_inode under info->lock (three spinlock round trips), folio_mark_uptodate; less the anon rmap folios_allocated prices (§8)",
    },
    Recipe {
        counter: "fault_around_pages",
        work: &[
            (Prim::KCallLoop, 12.0),
            (Prim::AtomicHot, 3.0),
            (Prim::AtomicLine, 1.0),
            (Prim::LineJump, 1.0),
            (Prim::LineSeq, 0.25),
        ],
        kernel: "filemap_map_pages per extra page: next_uptodate_folio (xarray step, folio_try_get, trylock, checks), set_pte_range, folio_add_file_rmap_ptes and its stat chain, folio_unlock; the atomics beyond the two the engine counts (§8). folio_try_get is the first touch of the folio's struct page, written when the file was and since evicted by its data: streamed, and off the stream when the folio is not physically next to the last (line_jump)",
    },
    Recipe {
        counter: "cow_copies",
        work: &[(Prim::KCall, 9.0), (Prim::AtomicHot, 3.0)],
        kernel: "wp_page_copy besides the new folio, the copy and the flush (priced in folios_allocated, pages_copied, tlb_flush_page): the second PTE lock's map and rcu calls, the copy's calls, ptep_clear_flush's clear, folio_remove_rmap_pte of the old page (no stat chain: the child still maps it), the extra folio get and put (§8)",
    },
    Recipe {
        counter: "vma_splits",
        work: &[
            (Prim::KCall, 40.0),
            (Prim::SlabPair, 3.0),
            (Prim::AtomicHot, 6.0),
            (Prim::LineSeq, 4.0),
        ],
        kernel: "__split_vma (mm/vma.c): vma_iter_prealloc (a maple node), vm_area_dup (slab allocation with its memcg hook, the VMA's lines copied), vma_dup_policy, anon_vma_clone (an anon_vma_chain allocated and linked under the anon_vma root's rwsem), vma_start_write of both halves, vma_prepare/vma_adjust_trans_huge/vma_complete, the maple store; read from the source, not traced: this kernel refuses function tracing (§9)",
    },
    Recipe {
        counter: "vma_merges",
        work: &[
            (Prim::KCall, 35.0),
            (Prim::SlabPair, 2.0),
            (Prim::AtomicHot, 6.0),
        ],
        kernel: "vma_merge_existing_range / vma_merge_new_range (vma_expand): vma_start_write of the VMAs involved, vma_prepare under the anon_vma lock, the maple store (a node preallocated), vma_complete, and for each VMA absorbed remove_vma -> vm_area_free and unlink_anon_vmas (which vmas_freed does not count); read from the source, not traced (§9)",
    },
    Recipe {
        counter: "thp_split_pmd",
        work: &[(Prim::KCall, 30.0)],
        kernel: "__split_huge_pmd: pmd lock, pgtable_trans_huge_withdraw, the PTE table filled (its stores counted), stats",
    },
];

/// The recipe of a counter.
pub fn recipe(counter: &str) -> Option<&'static Recipe> {
    RECIPES.iter().find(|r| r.counter == counter)
}

/// The fixed kernel work of one timed operation of a table besides its counters (its
/// system calls are counted: `syscalls`).
pub fn fixed_work(table_id: &str) -> &'static [(Prim, f64)] {
    match table_id {
        // fork(): the task (clone without CLONE_VM copies creds, files, signal handlers, pid,
        // cgroup links) plus the mm's own creation and teardown (mm_struct, per-CPU RSS
        // counters, pgd page, IDs: about 150 calls); exit is not timed, but the task
        // primitive includes its share (a bounded over-estimate).
        "fork" => &[
            (Prim::Task, 1.0),
            (Prim::KCall, 150.0),
            (Prim::ZeroPage, 1.0),
        ],
        // One fork + exit + wait per sample (the counters are of one fork+exit; the
        // parent's wait4 is not an engine system call).
        "spawn" => &[
            (Prim::Syscall, 1.0),
            (Prim::Task, 1.0),
            (Prim::KCall, 150.0),
            (Prim::ZeroPage, 1.0),
        ],
        _ => &[],
    }
}

/// The predicted kernel time of a cell (ns) and its parts by primitive, from the exact
/// counters of one repetition (`counters`) and the fixed work of one operation of the
/// table.
pub fn predict(
    prims: &Primitives,
    table_id: &str,
    counters: &BTreeMap<String, u64>,
) -> (f64, BTreeMap<String, u64>) {
    let mut parts: BTreeMap<&'static str, f64> = BTreeMap::new();
    let mut charge = |p: Prim, n: f64| {
        *parts.entry(prim_name(p)).or_default() += n * prims.get(p);
    };
    for (name, &n) in counters {
        if let Some(r) = recipe(name) {
            for &(p, k) in r.work {
                charge(p, k * n as f64);
            }
        }
    }
    for &(p, k) in fixed_work(table_id) {
        charge(p, k);
    }
    // The VMAs and tree nodes of one fork past what their slab caches keep hot (a
    // repetition is one fork in every table that copies VMAs).
    let slabs = [
        (prims.vma_slab, "vmas_copied"),
        (prims.node_slab, "vma_nodes_allocated"),
    ];
    for (cache, counter) in slabs {
        if let (Some(cache), Some(&n)) = (cache, counters.get(counter)) {
            for (p, k) in cache.cold_work(n) {
                charge(p, k);
            }
        }
    }
    let total = parts.values().sum::<f64>().max(0.0);
    let parts = parts
        .into_iter()
        .map(|(k, v)| (format!("model_{k}_ns"), v.max(0.0).round() as u64))
        .collect();
    (total, parts)
}

/// The name of the model column of an engine variant.
pub fn model_name(variant: &str) -> String {
    format!("model:{variant}")
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
    let m = table.variant_index(&model_name(table.host_matches.as_deref()?))?;
    let h = table
        .variants
        .iter()
        .position(|v| v.kind == VariantKind::Host)?;
    let mut errs: Vec<(f64, String)> = Vec::new();
    for row in &table.rows {
        let (Some(p), Some(host)) = (
            headline(table, &row.columns[m]),
            headline(table, &row.columns[h]),
        ) else {
            continue;
        };
        if host > 0.0 && p.is_finite() {
            // Error as a time: a rate's error is that of its inverse.
            let err = match table.better {
                Better::Lower => (p - host) / host,
                Better::Higher => (host - p) / p,
            };
            errs.push((err * 100.0, row.label.clone()));
        }
    }
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
    fn a_prediction_is_counters_times_costs() {
        let prims = Primitives {
            load_seq: 1.0,
            store_seq: 2.0,
            rmw_seq: 5.0,
            syscall: 100.0,
            ..Primitives::default()
        };
        let c: BTreeMap<String, u64> = [
            ("pte_reads".to_string(), 10),
            ("pte_writes".to_string(), 20),
            ("pte_atomics".to_string(), 4),
            ("tlb_hits".to_string(), 1000),
        ]
        .into_iter()
        .collect();
        let c: BTreeMap<String, u64> = c.into_iter().chain([("syscalls".to_string(), 1)]).collect();
        let (ns, parts) = predict(&prims, "munmap", &c);
        // 10 loads + 20 stores, 4 of which are RMWs instead, + one system call.
        assert_eq!(ns, 10.0 + 16.0 * 2.0 + 4.0 * 5.0 + 100.0);
        assert_eq!(parts["model_rmw_seq_ns"], 20);
        assert_eq!(parts["model_store_seq_ns"], 32);
        assert_eq!(parts["model_syscall_ns"], 100);
    }

    #[test]
    fn tight_loops_pay_the_loop_price_and_long_paths_the_entry_price() {
        let prims = Primitives {
            kcall: 100.0,
            kcall_loop: 1.0,
            ..Primitives::default()
        };
        let one = |counter: &str| {
            let c: BTreeMap<String, u64> = [(counter.to_string(), 1)].into_iter().collect();
            predict(&prims, "munmap", &c).0
        };
        // zap_present_ptes' ten calls per batch, free's fifteen per folio: a loop each.
        assert_eq!(one("zap_batches"), 10.0);
        assert_eq!(one("folios_freed"), 15.0);
        // A fault's calls are a long path; a VMA's copy and free repeat per VMA of a fork.
        assert_eq!(one("faults"), 2200.0);
        assert_eq!(one("vmas_copied"), 17.0);
        assert_eq!(one("vmas_freed"), 21.0);
    }

    #[test]
    fn a_fork_pays_cold_lines_for_the_objects_its_slab_caches_do_not_keep_hot() {
        // vm_area_struct and maple_node as this 6.18 guest's /sys/kernel/slab shows them.
        let vma = SlabCache {
            object_size: 192,
            objs_per_slab: 21,
            sheaf_capacity: 32,
            cpu_partial: 120,
            min_partial: 5,
        };
        let node = SlabCache {
            object_size: 256,
            objs_per_slab: 16,
            sheaf_capacity: 32,
            cpu_partial: 52,
            min_partial: 5,
        };
        // Twelve sheaves, the per-CPU partial objects, six slabs.
        assert_eq!(vma.hot_objects(), 384 + 120 + 6 * 21);
        assert_eq!(node.hot_objects(), 384 + 52 + 6 * 16);
        let prims = Primitives {
            line_far: 100.0,
            line_seq: 2.0,
            kcall: 7.0,
            vma_slab: Some(vma),
            node_slab: Some(node),
            ..Primitives::default()
        };
        let fork = |vmas: u64, nodes: u64| {
            let c: BTreeMap<String, u64> = [
                ("vmas_copied".to_string(), vmas),
                ("vma_nodes_allocated".to_string(), nodes),
            ]
            .into_iter()
            .collect();
            predict(&prims, "spawn", &c).0
                - predict(
                    &Primitives {
                        vma_slab: None,
                        node_slab: None,
                        ..prims
                    },
                    "spawn",
                    &c,
                )
                .0
        };
        assert_eq!(fork(630, 532), 0.0, "every object hot");
        // Ten VMAs past: a far line, two streamed ones and 30/21 of a slab's calls each.
        assert!((fork(640, 0) - 10.0 * (100.0 + 4.0 + 10.0)).abs() < 1e-9);
        // Four nodes past: a far line, three streamed ones and 30/16 of a slab's calls.
        assert!((fork(0, 536) - 4.0 * (100.0 + 6.0 + 30.0 * 7.0 / 16.0)).abs() < 1e-9);
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

    #[test]
    fn the_median_is_taken_per_primitive() {
        let p = |kcall, trap| Primitives {
            kcall,
            trap,
            ..Primitives::default()
        };
        let m = Primitives::median_of(&[p(9.0, 1.0), p(5.0, 3.0), p(6.0, 2.0)]).expect("three");
        assert_eq!((m.kcall, m.trap, m.syscall), (6.0, 2.0, 0.0));
        assert_eq!(Primitives::median_of(&[p(4.0, 7.0)]), Some(p(4.0, 7.0)));
        assert_eq!(Primitives::median_of(&[]), None);
    }

    #[test]
    fn line_jump_is_the_scattered_share_of_a_random_line() {
        let p = Primitives {
            line_rand: 22.0,
            line_far: 162.0,
            atomic_line: 6.0,
            line_jump: 3.0,
            ..Primitives::default()
        };
        let steps = |adjacent, far| p.with_frame_steps(FrameSteps { adjacent, far }).line_jump;
        assert_eq!(steps(1.0, 0.0), 0.0);
        assert_eq!(
            steps(0.0, 0.0),
            16.0,
            "all near: a random line of the small table"
        );
        assert_eq!(steps(0.25, 0.0), 12.0);
        assert_eq!(steps(0.0, 1.0), 156.0, "all far: a line beyond the caches");
        assert_eq!(steps(0.5, 0.25), 0.25 * 16.0 + 0.25 * 156.0);
        assert_eq!(steps(7.0, 0.0), 0.0, "clamped");
        assert_eq!(
            steps(0.5, 0.9),
            0.5 * 156.0,
            "no more far than not adjacent"
        );
        assert_eq!(
            p.with_frame_steps(FrameSteps::ADJACENT).kcall,
            p.kcall,
            "nothing else moves"
        );
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
