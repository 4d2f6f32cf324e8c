//! Reclaim of clean and written-back page-cache folios under memory pressure.
//!
//! Linux counterparts: `mm/vmscan.c` (`shrink_inactive_list`, `shrink_folio_list`,
//! `folio_check_references`, `__remove_mapping`, the direct-reclaim loop of
//! `try_to_free_pages` with its falling priorities, `reclaim_pages` for `MADV_PAGEOUT`) and
//! `mm/rmap.c` (`folio_referenced`). The watermark is one low mark; kswapd is the
//! scenario's `reclaim` statement ([`Cpu::reclaim`]). Anonymous memory is reclaimed to
//! swap by [`anon`].

use crate::filemap::cache::{delete_from_page_cache, file_range_in};
use crate::filemap::{Inode, PAGE_SIZE};
use crate::machine::Cpu;
use crate::mlock::lru_relist;
use crate::mm::Mm;
use crate::page_writeback::writeback_range;
use crate::pgtable::cursor::{PmdKind, PteLock};
use crate::phys::{PageFlag, Pfn};
use crate::rmap_walk::Held;
use crate::stats::Ev;
use crate::tlb::{FlushScope, TlbFlushPending};
use crate::truncate::{drop_cache_pages, unmap_mapping_range};
use crate::vaddr::VirtAddr;
use crate::vma::Vma;
use crate::zap::{zap_vma_range_details, GatherScope, MmuGather, ZapDetails};

pub(crate) mod anon;

/// Free pages under which an allocation reclaims page cache first (a low watermark).
const LOW_WATERMARK: u64 = 256;

/// The least reclaim gathers at once (`SWAP_CLUSTER_MAX`).
const SWAP_CLUSTER_MAX: u64 = 32;

/// Reclaim passes one allocation may make.
const RECLAIM_PASSES: u32 = 4;

/// Pages one reclaim pass may look at beyond what it frees.
const MAX_SCAN: u64 = 4 * SWAP_CLUSTER_MAX;

/// What reclaim does with a folio it judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Back on the inactive list.
    Keep,
    /// Onto the active list.
    Activate,
}

/// The free frames under which reclaim starts.
pub(crate) fn low_watermark<'m>(cpu: &Cpu<'m>) -> u64 {
    LOW_WATERMARK.min(cpu.m.phys.nr_frames() / 64)
}

/// Whether `pages` can be allocated without reclaim ([`reclaim_for`] would do
/// nothing).
pub(crate) fn enough_free<'m>(cpu: &Cpu<'m>, pages: u64) -> bool {
    cpu.m.phys.free_frames() >= pages + low_watermark(cpu)
}

/// Direct reclaim before an allocation of `pages` (`__alloc_pages_direct_reclaim`): when
/// free memory would drop under a low watermark, reclaim page cache first. Called with no
/// cache, PTE or LRU lock held (an mmap lock for reading may be held).
pub(crate) fn reclaim_for<'m>(cpu: &Cpu<'m>, pages: u64) {
    reclaim_for_held(cpu, None, pages);
}

/// [`reclaim_for`] by a caller that holds `held`'s mmap lock (fork, for its page tables):
/// that mm's folios are reclaimed through the caller's view of its VMAs.
pub(crate) fn reclaim_for_held<'m>(cpu: &Cpu<'m>, held: Option<Held<'_>>, pages: u64) {
    let phys = &cpu.m.phys;
    let low = low_watermark(cpu);
    // A few passes, as reclaim raises its priority: a mapped folio is only marked
    // referenced by the first look and reclaimed by the next.
    for priority in (0..RECLAIM_PASSES).rev() {
        let free = phys.free_frames();
        if free >= pages + low {
            return;
        }
        let want = (pages + low - free).max(SWAP_CLUSTER_MAX);
        let got = shrink_file_lru(cpu, want, priority);
        if got < want {
            anon::shrink_anon_lru(cpu, held, want - got, priority);
        }
    }
}

impl Cpu<'_> {
    /// Runs reclaim as kswapd would (the scenario's `reclaim`): the file lists, then the
    /// anonymous ones when there is swap, at falling priorities until `bytes` are freed or
    /// a pass at the highest priority frees nothing. Returns the bytes freed.
    pub fn reclaim(&self, bytes: u64) -> u64 {
        self.c().add(Ev::Syscall, 1);
        let want = bytes.div_ceil(PAGE_SIZE);
        let mut freed = 0;
        for priority in (0..=DEF_PRIORITY).rev() {
            if freed >= want {
                break;
            }
            let batch = (want - freed).max(SWAP_CLUSTER_MAX).min(want - freed);
            let got = shrink_file_lru(self, batch, priority);
            freed += got;
            if freed < want {
                freed += anon::shrink_anon_lru(self, None, (want - freed).min(batch), priority);
            }
        }
        freed.min(want) * PAGE_SIZE
    }
}

/// The lowest reclaim priority (`DEF_PRIORITY`): a pass scans `1/2^priority` of the lists.
const DEF_PRIORITY: u32 = 12;

/// Reclaim of the file LRU (`shrink_inactive_list` and `shrink_active_list` for file
/// folios, on every node): folios from the tail of the inactive file list, refilled from
/// the active one, are judged as `folio_check_references` does for file folios:
/// - mapped and young in a page table (the young bits are cleared on the way): kept on
///   the inactive list and marked referenced the first time, activated when it was
///   already referenced or is young in several mappings;
/// - otherwise reclaimed: unmapped from every mapping, written back when dirty (what the
///   flushers would have done), dropped from the cache and freed.
///
/// Folios held by anything but the cache and their mappings (pins, batches) stay. Returns
/// the pages freed; scans each list at most once.
///
/// # Context
/// No cache, PTE or LRU lock held; takes each mm's mmap lock for reading (recursively).
pub(crate) fn shrink_file_lru<'m>(cpu: &Cpu<'m>, want: u64, priority: u32) -> u64 {
    use crate::phys::lru::LruList;
    cpu.lru_add_drain_all();
    let phys = &cpu.m.phys;
    let mem = &phys.memmap;
    let files = cpu.m.files();
    let mut freed = 0;
    for node in 0..phys.nr_nodes().max(1) {
        let lruvec = phys.lruvec_of_node(node);
        let budget = {
            let l = lruvec.lock();
            l.pages(LruList::InactiveFile) + l.pages(LruList::ActiveFile)
        };
        // A pass looks at `want` plus a share of the lists that doubles as the priority
        // drops (`nr_to_scan = lru_size >> priority`), the last one at everything twice,
        // so an allocation usually costs a short scan, and a full one only when nothing
        // easier is left.
        let limit = if priority == 0 {
            2 * budget
        } else {
            (want + MAX_SCAN + (budget >> (2 * priority))).min(2 * budget)
        };
        let mut scanned = 0;
        while freed < want && scanned < limit {
            let folio = {
                cpu.c().add(Ev::LockLru, 1);
                let mut l = lruvec.lock();
                let Some(folio) = l.tail(LruList::InactiveFile) else {
                    // Refill the inactive list from the active one.
                    let Some(f) = l.tail(LruList::ActiveFile) else {
                        break;
                    };
                    let f = mem.folio(f);
                    let nr = f.nr_pages();
                    l.del(f, nr);
                    // `shrink_active_list` marks what it deactivates as working set.
                    f.clear(PageFlag::Active);
                    f.set(PageFlag::Workingset);
                    l.add(f, nr);
                    scanned += nr;
                    cpu.c().add(Ev::PgDeactivate, nr);
                    continue;
                };
                let f = mem.folio(folio);
                let nr = f.nr_pages();
                scanned += nr;
                cpu.c().add(Ev::PgScan, nr);
                // Isolate it: off the list while it is judged.
                l.del(f, nr);
                f.clear(PageFlag::Lru);
                folio
            };
            let nr = 1u64 << mem.order(folio);
            if mem.test(folio, PageFlag::Anon) {
                // A lazily freed anonymous folio sits on the file list (not swap-backed):
                // reclaim discards it unless it was written again, swap or not.
                crate::rmap::folio_ref_add(cpu.c(), phys.memmap.folio(folio), 1);
                let outcome = anon::reclaim_anon_folio(cpu, None, folio, true);
                if outcome == anon::Outcome::Freed {
                    freed += nr;
                }
                anon::putback(cpu, folio, outcome);
                continue;
            }
            let inode = files.iter().find(|f| f.id == mem.mapping(folio));
            let verdict = match inode {
                None => Verdict::Keep,
                Some(inode) => {
                    let idx = mem.index(folio);
                    let young = folio_referenced(cpu, inode, idx, nr);
                    let referenced = mem.test_and_clear(folio, PageFlag::Referenced);
                    if young > 0 && (referenced || young > 1) {
                        Verdict::Activate
                    } else if young > 0 {
                        mem.set(folio, PageFlag::Referenced);
                        Verdict::Keep
                    } else if reclaim_folio(cpu, inode, folio) {
                        freed += nr;
                        continue;
                    } else {
                        Verdict::Keep
                    }
                }
            };
            // Put back (`folio_putback_lru`), on the active list if it earned it.
            if verdict == Verdict::Activate {
                mem.set(folio, PageFlag::Active);
            }
            cpu.c().add(Ev::LockLru, 1);
            let mut l = lruvec.lock();
            mem.set(folio, PageFlag::Lru);
            l.add(mem.folio(folio), nr);
        }
    }
    freed
}

/// `folio_referenced` for a page-cache folio: how many mappings found it young, clearing
/// the young bits (with a TLB flush) on the way.
pub(crate) fn folio_referenced<'m>(cpu: &Cpu<'m>, inode: &Inode, idx: u64, nr: u64) -> u32 {
    let mut young = 0;
    for task in cpu.m.tasks() {
        let mm = &task.mm;
        let st = mm.lock.read_recursive();
        for id in st.vmas.all() {
            let vma = st.vmas.get(id);
            let Some((start, end)) = file_range_in(vma, inode, idx, idx + nr) else {
                continue;
            };
            let pt = cpu.tables(mm);
            let arch = pt.arch;
            let mut hit = TlbFlushPending::none();
            // A young PMD leaf is counted but not aged here: it owes no flush, yet the
            // mapping is flushed all the same.
            let mut young_pmd = false;
            for step in pt.pmd_walk(start, end) {
                match step.kind {
                    PmdKind::Table(table) => {
                        let mut ptes = PteLock::lock(pt, cpu.c(), table);
                        let (i0, i1) = step.pte_indexes();
                        for i in i0..i1 {
                            let e = ptes.get(i);
                            if !e.is_none() && arch.present(e) && arch.young(e) {
                                hit.merge(ptes.replace(i, arch.mkold(e)));
                            }
                        }
                    }
                    PmdKind::Huge(e) => young_pmd |= arch.young(e),
                }
            }
            if hit.is_owed() || young_pmd {
                young += 1;
                hit.flushed(cpu.flush_tlb(mm, FlushScope::Range(start, end)));
            }
        }
    }
    young
}

/// `shrink_folio_list` for a shmem folio reclaim isolated from the anonymous lists (it is
/// swap-backed) and holds one reference on: judged by its references as a mapped file
/// folio, then unmapped everywhere and written to swap.
pub(crate) fn reclaim_shmem_folio<'m>(cpu: &Cpu<'m>, folio: Pfn) -> anon::Outcome {
    let mem = &cpu.m.phys.memmap;
    let Some(inode) = shmem_inode(cpu, mem.mapping(folio)) else {
        return anon::Outcome::Keep;
    };
    let idx = mem.index(folio);
    let nr = 1u64 << mem.order(folio);
    let young = folio_referenced(cpu, &inode, idx, nr);
    let referenced = mem.test_and_clear(folio, PageFlag::Referenced);
    if young > 0 {
        if referenced || young > 1 {
            return anon::Outcome::Activate;
        }
        mem.set(folio, PageFlag::Referenced);
        return anon::Outcome::Keep;
    }
    if crate::rmap::page_mapcount(&cpu.m.phys, folio) > 0 || mem.entire_mapcount(folio) > 0 {
        unmap_mapping_range(cpu, &inode, idx, idx + nr, ZapDetails::FilePagesOnly);
    }
    if crate::swap_state::shmem_writeout(cpu, &inode, folio, 1) {
        anon::Outcome::Freed
    } else {
        anon::Outcome::Activate
    }
}

/// The shmem object with owner id `id`: a scenario file, or the object of a shared
/// anonymous mapping (found through the VMAs that map it).
fn shmem_inode<'m>(cpu: &Cpu<'m>, id: u32) -> Option<std::sync::Arc<Inode>> {
    if let Some(f) = cpu.m.files().into_iter().find(|f| f.id == id) {
        return Some(f);
    }
    cpu.m.tasks().iter().find_map(|t| {
        let st = t.mm.lock.try_read_recursive()?;
        st.vmas
            .all()
            .into_iter()
            .filter_map(|vid| st.vmas.get(vid).file.clone())
            .find(|f| f.id == id)
    })
}

/// Reclaims one isolated page-cache folio (`shrink_folio_list`'s unmap, pageout and
/// `__remove_mapping`): true if it was freed. A folio something else holds stays.
pub(crate) fn reclaim_folio<'m>(cpu: &Cpu<'m>, inode: &Inode, folio: Pfn) -> bool {
    let mem = &cpu.m.phys.memmap;
    let idx = mem.index(folio);
    let nr = 1u64 << mem.order(folio);
    if inode.kind.is_shmem() {
        return false; // no swap
    }
    if crate::rmap::page_mapcount(&cpu.m.phys, folio) > 0 || mem.entire_mapcount(folio) > 0 {
        unmap_mapping_range(cpu, inode, idx, idx + nr, ZapDetails::FilePagesOnly);
    }
    if mem.refcount(folio) != nr as i32 {
        return false;
    }
    if mem.test(folio, PageFlag::Dirty) {
        writeback_range(cpu, inode, idx, idx + nr);
    }
    crate::workingset::workingset_eviction(cpu, inode, idx, folio);
    let removed: Vec<Pfn> = {
        let mut cache = inode.pages.lock();
        (idx..idx + nr).filter_map(|i| cache.remove(i)).collect()
    };
    cpu.c().add(Ev::PgSteal, nr);
    cpu.c().add(Ev::PageCacheEvict, 1);
    drop_cache_pages(cpu, removed);
    true
}

/// `MADV_PAGEOUT` of a page-cache folio mapped only here (`shrink_folio_list`): unmapped
/// first, then dropped from the cache when it is a clean disk page, or written to swap when
/// it is shmem and there is swap ([`crate::swap_state::shmem_writeout`]); a dirty disk one
/// (only kswapd writes back file pages) or a shmem one without swap stays and is activated.
pub(crate) fn pageout_file_folio<'m>(cpu: &Cpu<'m>, mm: &Mm, vma: &Vma, addr: VirtAddr, head: Pfn) {
    let Some(inode) = &vma.file else { return };
    let mem = &cpu.m.phys.memmap;
    let nr = 1u64 << mem.order(head);
    let mut tlb = MmuGather::new(cpu, mm, GatherScope::Range);
    zap_vma_range_details(
        cpu,
        &mut tlb,
        mm,
        vma,
        addr,
        addr.add(nr * PAGE_SIZE),
        ZapDetails::FilePagesOnly,
    );
    tlb.finish();
    cpu.lru_add_drain();
    if inode.kind.is_shmem() && crate::swap_state::shmem_writeout(cpu, inode, head, 0) {
        return;
    }
    if inode.kind.is_shmem() || mem.test(head, PageFlag::Dirty) {
        // Without swap a shmem folio cannot be written out, and only kswapd writes
        // back dirty file folios: either way reclaim has already unmapped it and now
        // puts it back on the active list.
        lru_relist(cpu, cpu.m.phys.memmap.folio(head), |_| {
            mem.set(head, PageFlag::Active)
        });
        return;
    }
    // Only the page cache holds it now (one reference per page): drop it.
    let idx = mem.index(head);
    let removed: Vec<Pfn> = {
        let mut cache = inode.pages.lock();
        if cache.get(idx) == Some(head) && mem.refcount(head) == nr as i32 {
            (idx..idx + nr).filter_map(|i| cache.remove(i)).collect()
        } else {
            Vec::new()
        }
    };
    if !removed.is_empty() {
        cpu.c().add(Ev::PageCacheEvict, 1);
        crate::workingset::workingset_eviction(cpu, inode, idx, head);
    }
    for p in removed {
        delete_from_page_cache(cpu, p);
    }
}
