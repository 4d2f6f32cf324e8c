//! The whole-state invariant checker.
//!
//! Linux counterparts: `mt_validate` (`lib/maple_tree.c`), `CONFIG_DEBUG_VM` checks,
//! `check_mm`. Everything is recomputed from the page tables and compared with the stored
//! counters: per-page and per-folio mapcounts, refcounts (exactly: one per mapping, plus pins,
//! plus the shmem page cache), RSS, PageAnonExclusive rules, page-table entry counts, frame
//! accounting against the buddy allocator, and the TLBs (no translation may outlive its PTE).
//!
//! # Context
//! Call at a quiescent point (no operation in flight on any CPU).

use crate::machine::Machine;
use crate::mm::{mm_counter_file, Mm, RssKind};
use crate::pgtable::cursor::walk_leaves;
use crate::pgtable::{AnyLeaf, PageTables, PTRS_PER_TABLE};
use crate::phys::{PageFlag, Pfn, HPAGE_PMD_ORDER};
use crate::rmap::GUP_PIN_COUNTING_BIAS;
use crate::vma::VmFlags;
use std::collections::{BTreeMap, HashMap, HashSet};

/// What one folio is expected to look like after a recount.
#[derive(Debug, Default, Clone)]
struct FolioRecount {
    pte_maps: BTreeMap<Pfn, i32>,
    pmd_maps: i32,
    refs: i32,
    /// Mappings from `VM_LOCKED` VMAs.
    locked_maps: u32,
    /// Mappings from ranges that lost `VM_LOCKED` in `MREMAP_DONTUNMAP` (`MmState::mlock_stale`):
    /// their folios may still be mlocked, as on Linux.
    stale_maps: u32,
    /// Mappings per mm.
    per_mm: BTreeMap<u32, i32>,
    /// mms mapping each exclusive page.
    excl_mms: HashMap<Pfn, HashSet<u32>>,
}

/// Collected invariant violations.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// One line per violation.
    pub(crate) errors: Vec<String>,
}

impl Report {
    fn err(&mut self, s: String) {
        if self.errors.len() < 50 {
            self.errors.push(s);
        }
    }
}

impl Machine {
    /// Checks every invariant; returns the violations found.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut r = Report::default();
        let mut folios: BTreeMap<Pfn, FolioRecount> = BTreeMap::new();
        let mut frames_used = 0u64;
        let mut shmem_seen = HashSet::new();
        for task in self.tasks() {
            let mm = &task.mm;
            frames_used += self.validate_mm(mm, &mut folios, &mut r);
            let st = mm.lock.read();
            for rec in &st.pins {
                for &pfn in &rec.pfns {
                    let head = self.phys.memmap.folio_of(pfn);
                    let large = self.phys.memmap.test(head, PageFlag::Head);
                    folios.entry(head).or_default().refs +=
                        if large { 1 } else { GUP_PIN_COUNTING_BIAS };
                }
            }
            for id in st.vmas.all() {
                if let Some(s) = &st.vmas.get(id).file {
                    if shmem_seen.insert(s.id) {
                        self.check_page_cache(s, &mut folios, &mut r);
                    }
                }
            }
        }
        for f in self.files() {
            if shmem_seen.insert(f.id) {
                self.check_page_cache(&f, &mut folios, &mut r);
            }
        }
        for cpu in 0..self.nr_cpus() {
            for f in self.cpu_batches(cpu).lock().folios() {
                folios.entry(f).or_default().refs += 1;
            }
        }
        self.check_swap(&mut folios, &mut r);
        frames_used += self.check_folios(&folios, &mut r);
        self.check_lru(&folios, &mut r);
        self.check_buddy(&mut r);
        // The zero page is taken at boot from the first 4 MiB block; a machine of less RAM
        // has no frames and no zero page.
        let reserved = u64::from(self.phys.nr_frames() > 0)
            + if self.phys.huge_zero_pfn_if_allocated() {
                1 << HPAGE_PMD_ORDER
            } else {
                0
            };
        if self.phys.allocated_frames() != frames_used {
            r.err(format!(
                "frame leak: {} frames allocated, {} accounted for by tables and mapped/cached folios",
                self.phys.allocated_frames(),
                frames_used
            ));
        }
        if self.phys.free_frames() + self.phys.allocated_frames() + reserved
            != self.phys.nr_frames()
        {
            r.err(format!(
                "buddy: free {} + allocated {} + reserved {} != total {}",
                self.phys.free_frames(),
                self.phys.allocated_frames(),
                reserved,
                self.phys.nr_frames()
            ));
        }
        if r.errors.is_empty() {
            Ok(())
        } else {
            Err(r.errors)
        }
    }

    /// The buddy free lists: every free block is aligned to its order, its head says
    /// PG_buddy with that order, no two blocks overlap, and each zone's blocks add up to its
    /// free count.
    fn check_buddy(&self, r: &mut Report) {
        let mem = &self.phys.memmap;
        for (z, zone) in self.phys.zones().iter().enumerate() {
            let mut blocks = zone.free_blocks(mem);
            let sum: u64 = blocks.iter().map(|&(_, o)| 1u64 << o).sum();
            let counted = zone.free_pages();
            if sum != counted {
                r.err(format!(
                    "buddy zone {z}: free lists hold {sum} pages, the counts say {counted}"
                ));
            }
            blocks.sort_unstable();
            let mut end = Pfn::new(0);
            for &(pfn, order) in &blocks {
                if !pfn.is_aligned(order) {
                    r.err(format!(
                        "buddy: free block {pfn:#x} not aligned to order {order}"
                    ));
                }
                if !mem.test(pfn, PageFlag::Buddy) || mem.order(pfn) != order {
                    r.err(format!(
                        "buddy: free block {pfn:#x} of order {order} is not marked PG_buddy with that order"
                    ));
                }
                if pfn < end {
                    r.err(format!(
                        "buddy: free block {pfn:#x} overlaps the one before it"
                    ));
                }
                end = end.max(pfn.add(1 << order));
            }
        }
    }

    /// A file's page cache: each page holds one reference, names the file and its index, and
    /// belongs to a folio that starts below the end of file; disk pages are on the file LRU, shmem ones swap-backed.
    fn check_page_cache(
        &self,
        f: &crate::filemap::Inode,
        folios: &mut BTreeMap<Pfn, FolioRecount>,
        r: &mut Report,
    ) {
        let mem = &self.phys.memmap;
        let size_pages = f.size_pages();
        for (idx, pfn) in f.pages.lock().iter() {
            let head = mem.folio_of(pfn);
            folios.entry(head).or_default().refs += 1;
            if mem.mapping(head) != f.id || mem.index(head) + pfn.offset_from(head) != idx {
                r.err(format!(
                    "file {}: cache page {idx} (pfn {pfn:#x}) names file {} index {}",
                    f.id,
                    mem.mapping(head),
                    mem.index(head) + pfn.offset_from(head)
                ));
            }
            // A huge shmem folio may reach past the end of file (`always`/`force` make one for
            // a small file); a folio may not start there.
            if idx >= size_pages && (head == pfn || mem.index(head) >= size_pages) {
                r.err(format!(
                    "file {}: cache page {idx} lies past the end of file ({size_pages} pages)",
                    f.id
                ));
            }
            if mem.test(head, PageFlag::Anon)
                || mem.test(head, PageFlag::SwapBacked) != f.kind.is_shmem()
            {
                r.err(format!(
                    "file {}: cache page {idx} has the wrong kind (anon or swap-backed flag)",
                    f.id
                ));
            }
            if mem.test(head, PageFlag::Writeback) {
                r.err(format!(
                    "file {}: cache page {idx} left under writeback",
                    f.id
                ));
            }
        }
    }

    /// Validates one mm; returns the page-table frames it owns.
    fn validate_mm(
        &self,
        mm: &Mm,
        folios: &mut BTreeMap<Pfn, FolioRecount>,
        r: &mut Report,
    ) -> u64 {
        let st = mm.lock.read();
        if let Err(e) = st.vmas.tree.validate() {
            r.err(format!("mm {}: vma tree: {e}", mm.id));
        }
        if st.vmas.slab_live() != st.vmas.count() {
            r.err(format!(
                "mm {}: {} VMA bodies for {} tree entries",
                mm.id,
                st.vmas.slab_live(),
                st.vmas.count()
            ));
        }
        let mut locked = 0;
        for (s, e, id) in st.vmas.tree.iter() {
            let v = st.vmas.get(id);
            if v.start != s || v.end != e || s >= e || s & 4095 != 0 || e & 4095 != 0 {
                r.err(format!(
                    "mm {}: VMA {:#x}-{:#x} stored as {s:#x}-{e:#x}",
                    mm.id, v.start, v.end
                ));
            }
            if v.flags.has(VmFlags::LOCKED) {
                locked += v.len() >> 12;
            }
        }
        if locked + st.locked_vm_orphaned != st.locked_vm {
            r.err(format!(
                "mm {}: locked_vm {} but VM_LOCKED VMAs span {} pages (+{} orphaned)",
                mm.id, st.locked_vm, locked, st.locked_vm_orphaned
            ));
        }
        let pt = PageTables {
            phys: &self.phys,
            arch: self.arch,
            pgd: mm.pgd,
        };
        let mut tables = 0u64;
        let mut rss = [0i64; 3];
        pt.for_each_table(|level, table| {
            tables += 1;
            let used = (0..PTRS_PER_TABLE)
                .filter(|&i| !pt.ptep_get_raw(table, i).is_none())
                .count() as u32;
            if used != self.phys.memmap.pt_entries(table) {
                r.err(format!(
                    "mm {}: table {table:#x} has {used} entries, counted {}",
                    mm.id,
                    self.phys.memmap.pt_entries(table)
                ));
            }
            if level == 3 {
                if let Err(e) = pt.check_contpte(table) {
                    r.err(format!("mm {}: {e}", mm.id));
                }
            }
        });
        self.recount_leaves(mm, &st, pt, folios, &mut rss, r);
        tables += mm.deposited.len() as u64;
        for (kind, n) in [
            (RssKind::Anon, rss[0]),
            (RssKind::Shmem, rss[1]),
            (RssKind::File, rss[2]),
        ] {
            if mm.rss(kind) != n {
                r.err(format!(
                    "mm {}: rss {:?} is {} but page tables map {}",
                    mm.id,
                    kind,
                    mm.rss(kind),
                    n
                ));
            }
        }
        self.check_tlbs(mm, pt, r);
        tables
    }

    fn recount_leaves(
        &self,
        mm: &Mm,
        st: &crate::mm::MmState,
        pt: PageTables<'_>,
        folios: &mut BTreeMap<Pfn, FolioRecount>,
        rss: &mut [i64; 3],
        r: &mut Report,
    ) {
        let arch = self.arch;
        let mem = &self.phys.memmap;
        let mut visit = |addr: u64, e: AnyLeaf| {
            if let AnyLeaf::Pte(pte) = e {
                if arch.is_swap_pte(pte) {
                    return; // counted by `check_swap`
                }
            }
            let huge = e.is_pmd();
            let Some(id) = st.vmas.find(addr) else {
                r.err(format!(
                    "mm {}: entry {:#x} at {addr:#x} outside any VMA",
                    mm.id,
                    e.val()
                ));
                return;
            };
            let vma = st.vmas.get(id);
            let pfn = arch.pfn(e);
            if self.phys.is_zero_pfn(pfn) {
                if arch.write(e) {
                    r.err(format!(
                        "mm {}: zero page mapped writable at {addr:#x}",
                        mm.id
                    ));
                }
                return;
            }
            let head = mem.folio_of(pfn);
            let f = folios.entry(head).or_default();
            let anon = mem.test(head, PageFlag::Anon);
            let kind = if anon {
                0
            } else {
                mm_counter_file(vma) as usize
            };
            if vma.flags.has(VmFlags::LOCKED) {
                f.locked_maps += 1;
            } else if st.mlock_stale.iter().any(|&(s, e)| s <= addr && addr < e) {
                f.stale_maps += 1;
            }
            *f.per_mm.entry(mm.id).or_default() += 1;
            if huge {
                f.pmd_maps += 1;
                f.refs += 1;
                rss[kind] += 1 << HPAGE_PMD_ORDER;
                if mem.test(head, PageFlag::AnonExclusive) {
                    f.excl_mms.entry(head).or_default().insert(mm.id);
                }
            } else {
                *f.pte_maps.entry(pfn).or_default() += 1;
                f.refs += 1;
                rss[kind] += 1;
                if mem.test(pfn, PageFlag::AnonExclusive) {
                    f.excl_mms.entry(pfn).or_default().insert(mm.id);
                }
            }
            if anon
                && arch.write(e)
                && !mem.test(if huge { head } else { pfn }, PageFlag::AnonExclusive)
            {
                r.err(format!(
                    "mm {}: writable anon entry at {addr:#x} maps a page that is not exclusive",
                    mm.id
                ));
            }
            if arch.write(e) && !vma.flags.has(VmFlags::WRITE) {
                r.err(format!(
                    "mm {}: writable entry at {addr:#x} in a VMA without VM_WRITE",
                    mm.id
                ));
            }
        };
        walk_leaves(pt, &mut visit);
    }

    /// The swap area against the page tables: every swap entry lies in a private
    /// anonymous VMA and names a slot in use; each slot's count is the swap entries naming
    /// it; each mm's `MM_SWAPENTS` is its swap entries; a slot owned by the cache has its
    /// page there, a folio with `PG_swapcache` whose `folio->swap` covers the slot (and the
    /// cache's reference is counted for the folio); `inuse` is the slots in use.
    fn check_swap(&self, folios: &mut BTreeMap<Pfn, FolioRecount>, r: &mut Report) {
        let arch = self.arch;
        let mut named: BTreeMap<u64, u32> = BTreeMap::new();
        for task in self.tasks() {
            let mm = &task.mm;
            let st = mm.lock.read();
            let pt = PageTables {
                phys: &self.phys,
                arch,
                pgd: mm.pgd,
            };
            let mut entries = 0i64;
            walk_leaves(pt, &mut |addr, e| {
                let AnyLeaf::Pte(pte) = e else { return };
                if !arch.is_swap_pte(pte) {
                    return;
                }
                entries += 1;
                *named.entry(arch.swp_entry(pte).offset()).or_default() += 1;
                let anon = st
                    .vmas
                    .find(addr)
                    .is_some_and(|id| st.vmas.get(id).is_anon_private());
                if !anon {
                    r.err(format!(
                        "mm {}: swap entry {:#x} at {addr:#x} outside a private anonymous VMA",
                        mm.id,
                        pte.val()
                    ));
                }
            });
            if mm.rss(RssKind::Swap) != entries {
                r.err(format!(
                    "mm {}: MM_SWAPENTS is {} but page tables hold {entries} swap entries",
                    mm.id,
                    mm.rss(RssKind::Swap)
                ));
            }
        }
        // The swap entries of shmem objects: the scenario's files and the objects of
        // shared anonymous mappings.
        let mut objects = self.files();
        for task in self.tasks() {
            let st = task.mm.lock.read();
            for id in st.vmas.all() {
                if let Some(f) = &st.vmas.get(id).file {
                    if !objects.iter().any(|o| o.id == f.id) {
                        objects.push(f.clone());
                    }
                }
            }
        }
        for o in &objects {
            let cache = o.pages.lock();
            for (&idx, e) in o.swapped.lock().iter() {
                *named.entry(e.offset()).or_default() += 1;
                if cache.get(idx).is_some() {
                    r.err(format!(
                        "object {}: page {idx} both cached and swapped",
                        o.id
                    ));
                }
            }
        }
        let Some(swap) = self.swap.as_ref() else {
            if !named.is_empty() {
                r.err(format!("{} swap entries but no swap area", named.len()));
            }
            return;
        };
        let mem = &self.phys.memmap;
        for (slot, count, cached, page) in swap.snapshot() {
            let n = named.remove(&slot).unwrap_or(0);
            if u32::from(count) != n {
                r.err(format!(
                    "swap slot {slot}: count {count} but {n} swap entries name it"
                ));
            }
            match (cached, page) {
                (true, Some(page)) => {
                    let head = mem.folio_of(page);
                    let first = mem.swap_entry(head).offset();
                    let nr = 1u64 << mem.order(head);
                    if !mem.test(head, PageFlag::SwapCache)
                        || slot < first
                        || slot >= first + nr
                        || page.offset_from(head) != slot - first
                    {
                        r.err(format!(
                            "swap slot {slot}: cached page {page:#x} is not that slot's page of \
                             a swap-cache folio"
                        ));
                    }
                    folios.entry(head).or_default().refs += 1;
                }
                (true, None) => r.err(format!("swap slot {slot}: owned by the cache, no page")),
                (false, Some(_)) => r.err(format!("swap slot {slot}: a page but no cache bit")),
                (false, None) => {}
            }
        }
        for (slot, n) in named {
            r.err(format!(
                "swap slot {slot}: free but {n} swap entries name it"
            ));
        }
        let (inuse, counted) = swap.inuse_counted();
        if inuse != counted {
            r.err(format!("swap: inuse {inuse} but {counted} slots in use"));
        }
    }

    fn check_tlbs(&self, mm: &Mm, pt: PageTables<'_>, r: &mut Report) {
        for (cpu, tlb) in self.tlbs().iter().enumerate() {
            for e in tlb.entries() {
                if e.mm != mm.id {
                    continue;
                }
                let addr = e.vpn << 12;
                let ok = match crate::pgtable::leaf_at(pt, addr) {
                    Some(l) => {
                        l.pfn == e.pfn
                            && self.arch.accessible(l.entry)
                            && (!e.writable || self.arch.write(l.entry))
                    }
                    None => false,
                };
                if !ok {
                    r.err(format!(
                        "cpu {cpu}: stale TLB entry mm {} va {addr:#x} -> pfn {:#x}",
                        mm.id, e.pfn
                    ));
                }
            }
        }
    }

    /// LRU lists are consistent with the flags; NR_MLOCK equals the mlocked folios; every
    /// mapped folio is on an LRU or in a batch.
    fn check_lru(&self, folios: &BTreeMap<Pfn, FolioRecount>, r: &mut Report) {
        let mem = &self.phys.memmap;
        let mut on_lru = HashSet::new();
        for lv in &self.phys.lruvecs {
            let lists = lv.lock();
            for list in crate::phys::lru::LruList::ALL {
                let mut pages = 0;
                for f in lists.folios(mem, list) {
                    let folio = mem.folio(f);
                    pages += folio.nr_pages();
                    if !folio.test(PageFlag::Lru) || crate::phys::lru::folio_lru_list(folio) != list
                    {
                        r.err(format!(
                            "folio {f:#x} on list {list:?} but flags say otherwise"
                        ));
                    }
                    if !on_lru.insert(f) {
                        r.err(format!("folio {f:#x} on two LRU lists"));
                    }
                }
                if pages != lists.pages(list) {
                    r.err(format!(
                        "list {list:?} counts {} pages, holds {pages}",
                        lists.pages(list)
                    ));
                }
            }
        }
        let mut batched = HashSet::new();
        for cpu in 0..self.nr_cpus() {
            batched.extend(self.cpu_batches(cpu).lock().folios());
        }
        let mut mlocked = 0i64;
        for &head in folios.keys() {
            if mem.test(head, PageFlag::Mlocked) {
                mlocked += 1i64 << mem.order(head);
            }
            if mem.test(head, PageFlag::Lru) != on_lru.contains(&head) {
                r.err(format!(
                    "folio {head:#x}: PG_lru={} but on a list={}",
                    mem.test(head, PageFlag::Lru),
                    on_lru.contains(&head)
                ));
            }
            if !on_lru.contains(&head) && !batched.contains(&head) {
                r.err(format!(
                    "folio {head:#x} is neither on an LRU nor in a per-CPU batch"
                ));
            }
            if batched.contains(&head) {
                continue;
            }
            let f = &folios[&head];
            if f.locked_maps + f.stale_maps == 0 && mem.test(head, PageFlag::Mlocked) {
                r.err(format!(
                    "folio {head:#x} stays mlocked with no locking mapping"
                ));
            }
            if mem.test(head, PageFlag::Unevictable)
                && mem.mlock_count(head) > f.locked_maps + f.stale_maps
            {
                r.err(format!(
                    "folio {head:#x}: mlock_count {} > {} locking mappings",
                    mem.mlock_count(head),
                    f.locked_maps
                ));
            }
            if mem.test(head, PageFlag::Mlocked)
                && mem.test(head, PageFlag::Lru)
                && !mem.test(head, PageFlag::Unevictable)
            {
                r.err(format!(
                    "folio {head:#x} is mlocked but on an evictable list"
                ));
            }
        }
        if mlocked != self.nr_mlock() {
            r.err(format!(
                "NR_MLOCK is {} pages but {} pages are PG_mlocked",
                self.nr_mlock(),
                mlocked
            ));
        }
    }

    /// The MM-owner tracker of a large folio: tracked slots count exactly their mm's mappings,
    /// and "exclusive" (the shared bit clear) is never claimed while two mms map the folio.
    fn check_owner(&self, head: Pfn, f: &FolioRecount, r: &mut Report) {
        for (id, cnt) in crate::rmap::owner::slots(self.phys.memmap.folio(head)) {
            // A slot may under-count (its mm mapped pages while untracked, as in Linux) but never
            // over-count.
            if id != 0 && cnt > f.per_mm.get(&id).copied().unwrap_or(0) {
                r.err(format!(
                    "folio {head:#x}: owner slot of mm {id} counts {cnt}, mm maps it {:?}",
                    f.per_mm.get(&id)
                ));
            }
        }
        let truth: Vec<(u32, u64)> = f
            .per_mm
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(&id, &n)| (id, n as u64))
            .collect();
        for e in self
            .phys
            .sharing
            .verify(head, self.phys.memmap.order(head), &truth)
        {
            r.err(format!("folio {head:#x}: sharing tracker: {e}"));
        }
        let mms = f.per_mm.values().filter(|&&n| n > 0).count();
        let owner_tracked = self.phys.memmap.test(head, PageFlag::OwnerTracked);
        if owner_tracked
            && mms > 1
            && !crate::rmap::owner::maybe_mapped_shared(self.phys.memmap.folio(head))
        {
            r.err(format!(
                "folio {head:#x}: owner tracker says exclusive but {mms} mms map it"
            ));
        }
    }

    /// Compares recounts with the memmap; returns the frames the folios occupy.
    fn check_folios(&self, folios: &BTreeMap<Pfn, FolioRecount>, r: &mut Report) -> u64 {
        let mem = &self.phys.memmap;
        let mut frames = 0;
        for (&head, f) in folios {
            let order = mem.order(head);
            let nr = 1u64 << order;
            frames += nr;
            let large = mem.test(head, PageFlag::Head);
            if mem.refcount(head) != f.refs {
                r.err(format!(
                    "folio {head:#x}: refcount {} but {} references found",
                    mem.refcount(head),
                    f.refs
                ));
            }
            for p in head.range(nr) {
                let want = f.pte_maps.get(&p).copied().unwrap_or(0);
                if mem.mapcount(p) != want {
                    r.err(format!(
                        "page {p:#x}: mapcount {} but {} PTEs map it",
                        mem.mapcount(p),
                        want
                    ));
                }
                if let Some(set) = f.excl_mms.get(&p) {
                    let maps = want + f.pmd_maps;
                    if set.len() > 1 || maps > 1 {
                        r.err(format!(
                            "page {p:#x}: PageAnonExclusive but mapped {maps} times by {} mms",
                            set.len()
                        ));
                    }
                }
            }
            if large && mem.test(head, PageFlag::Anon) {
                self.check_owner(head, f, r);
            }
            if large {
                // `folio_mapcount` reads the maintained total or scans the per-page counts.
                let total: i32 = f.pte_maps.values().sum::<i32>() + f.pmd_maps;
                if mem.folio_mapcount(head) != total || mem.entire_mapcount(head) != f.pmd_maps {
                    r.err(format!(
                        "folio {head:#x}: folio_mapcount {} entire {} but recount {} / {}",
                        mem.folio_mapcount(head),
                        mem.entire_mapcount(head),
                        total,
                        f.pmd_maps
                    ));
                }
                if !mem.test(head, PageFlag::TotalMapcount) && mem.large_mapcount(head) != 0 {
                    r.err(format!(
                        "folio {head:#x}: a total mapcount it does not maintain"
                    ));
                }
            }
        }
        frames
    }
}
