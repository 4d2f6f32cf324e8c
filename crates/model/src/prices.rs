//! What the kernel pays per event: this machine's primitive costs ([`Primitives`]), the
//! recipes that say which primitives each engine counter's event is made of in Linux 6.18
//! ([`RECIPES`], the priors of a calibration), and the recipe prediction ([`predict`]).
//!
//! The primitives are measured by the bench crate (`usermm_bench::costmodel::measure`,
//! which needs the host); everything here is arithmetic on them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Costs of the machine's primitive operations, nanoseconds each, measured by
/// `usermm_bench::costmodel::measure` (the median of several runs).
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
    /// correction for frame adjacency. On the Intel 6.18 guest this was written on 15.5 ns
    /// per entry, about 2.5 ns per call, half of [`Primitives::kcall`]; on the AMD EPYC guest
    /// (6.18.44-fc-v657) about 70 ns per entry and 16 ns per call, again half of `kcall`.
    /// Long paths keep `kcall` even where they repeat: a fault, a system call. `dup_mmap`'s
    /// and `exit_mmap`'s per-VMA work is a loop too (some forty functions per VMA, the same
    /// for every VMA of one fork): the host's fork+exit cost 172-180 ns per added empty VMA
    /// up to 421 VMAs on the Intel guest, less than those calls would at `kcall` alone.
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
    /// Copying a 4 KiB page of cold memory (`copy_mc_user_highpage` of a COW fault, the
    /// same string moves): a user-space copy of 64 MiB in 4 KiB chunks, per page. A system
    /// call that copies adds its own path: a `pread` of a written memfd read 2 250-3 450 ns
    /// a page on this guest, five times this copy and the COW probes' fitted copy price.
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
    pub fn recipe_ns(&self, counter: &str) -> f64 {
        recipe(counter).map_or(0.0, |r| r.work.iter().map(|&(p, k)| k * self.get(p)).sum())
    }
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
        counter: "fork_batches_large",
        work: &[(Prim::KCallLoop, 2.0), (Prim::LineJump, 1.0)],
        kernel: "of fork's batches, those of a large folio: folio_pte_batch's walk set up (the folio's range, the expected entry), folio_try_dup_anon_rmap_ptes' loop over the run's pages for PageAnonExclusive, the large mapcount; measured apart because on this AMD guest fork cost 73 and 49 ns a page in 16K and 64K folios where a per-page and a per-folio price from 4K and 2M folios gave 52 and 39",
    },
    Recipe {
        counter: "zap_batches",
        work: &[(Prim::KCallLoop, 10.0), (Prim::LineJump, 1.0)],
        kernel: "zap_present_ptes (inlined) per batch: vm_normal_page, folio_remove_rmap_ptes, the NR_ANON_MAPPED stat chain (__lruvec_stat_mod_folio: rcu lock/unlock, __mod_lruvec_state, __mod_node_page_state, mod_memcg_lruvec_state, css_rstat_updated), __tlb_remove_folio_pages; the folio's first struct page line, off the stream when the folio is not physically next to the last (line_jump)",
    },
    Recipe {
        counter: "zap_batches_large",
        work: &[(Prim::KCallLoop, 2.0), (Prim::LineJump, 1.0)],
        kernel: "of zap's batches, those of a large folio: folio_pte_batch's walk set up, folio_remove_rmap_ptes' per-page loop and the deferred-split check of a partially mapped large folio",
    },
    Recipe {
        counter: "mprotect_batches",
        work: &[(Prim::KCallLoop, 3.0), (Prim::LineSeq, 1.0)],
        kernel: "change_pte_range per batch (since 6.17): vm_normal_page and its folio's first struct page line, mprotect_folio_pte_batch set up, pte_modify and the writable decision once, tlb_flush_pte_range; a small folio or the zero page is a batch of one",
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
        kernel: "tlb_finish_mmu/tlb_flush_mmu with something gathered: tlb_flush_mmu_tlbonly, tlb_batch_pages_flush, free_pages_and_swap_cache and its batch loop, tlb_table_flush (about 12 calls; the flush itself is tlb_flush_range, the batches' frees free_batches; neither zap_page_range_single nor free_pages_and_swap_cache drains the LRU-add batches in 6.18, as they did before)",
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
        kernel: "a folio freed after a TLB flush (its struct page line is still cached: the rmap removal of the same batch touched it; zap_batches prices that first touch): free_swap_cache, lruvec_del_folio with its LRU-size stats, uncharge_folio, free_pages_prepare, get_pfnblock_migratetype, free_frozen_page_commit (the batch's own work is free_batches); no share of free_pcppages_bulk: traced on this 6.18 guest, a 16 MiB munmap of 4 KiB folios sent no page from the per-CPU lists back to the buddy lists (docs/research/kernel-calls-6.18.md §9); 16 and 32 KiB folios do past a few hundred (§13), which no counter names yet",
    },
    Recipe {
        counter: "free_batches",
        work: &[(Prim::AtomicHot, 4.0), (Prim::KCall, 20.0)],
        kernel: "a batch of freed folios returned together (folios_put_refs, or __folio_put of one): memcg uncharge_batch (page_counter_uncharge up the cgroup levels, css_put_many, the PGPGOUT event) and free_unref_folios' per-CPU list trylock and unlock with interrupts saved, once per batch; one MADV_DONTNEED of a 4 KiB page pays it whole for one folio",
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
        counter: "vmas_detached",
        work: &[
            (Prim::KCallLoop, 12.0),
            (Prim::AtomicHot, 2.0),
            (Prim::LineRand, 1.0),
        ],
        kernel: "an unmap's VMA taken out of the tree one by one (vms_gather_munmap_vmas: vma_start_write, mas_store_gfp into the side tree of detached VMAs with its nodes, the locked_vm and accounting sums; then vms_complete_munmap_vmas walks that tree), which exit_mmap does not do; priced apart from vmas_freed, leaving spawn/many out missed it by 17 % on average instead of 26 % over 43 stored calibrations of this AMD guest (one munmap of 1 800 VMAs cost 0.8 µs a VMA, a spawn's exit about 0.4)",
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
        counter: "folios_mlocked",
        work: &[(Prim::KCallLoop, 19.0), (Prim::AtomicHot, 4.0)],
        kernel: "mlock_folio and __mlock_folio in the batch: NR_MLOCK stat, folio_evictable (rcu, folio_mapping), LRU moves with their LRU-size stats; flag bits",
    },
    Recipe {
        counter: "folios_munlocked",
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
        kernel: "mlock_pte_range per small folio or large folio's batch: vm_normal_folio, then folio_test_large and the mlock or munlock test on the folio's first struct page line, its first touch (folios_mlocked and folios_munlocked price the folio's atomics as hot; one of them is this touch): streamed, and off the stream when the folio is not physically next to the last (line_jump)",
    },
    Recipe {
        counter: "gup_follows",
        work: &[
            (Prim::KCallLoop, 8.0),
            (Prim::LockPair, 1.0),
            (Prim::LoadSeq, 4.0),
        ],
        kernel: "one page of __get_user_pages' loop as populate (mlock, MAP_POPULATE, MADV_POPULATE_*) and pins run it: the signal and resched checks, follow_page_mask down p4d, pud and pmd (each level's entry read again, hot) to follow_page_pte, which maps and locks the PTE table (pte_offset_map_lock: the PTE lock taken and dropped for every page), vm_normal_page and FOLL_TOUCH's folio_mark_accessed: about 8 calls. A PMD-mapped folio is one lookup (follow_huge_pmd), its other pages stepped over",
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

/// The median of `v` (the upper of the two middle values for an even count); `None` if empty.
pub fn median(v: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
