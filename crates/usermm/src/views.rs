//! What `/proc` shows: maps, smaps, status, pagemap, kpageflags, and folio orders.
//!
//! Linux counterparts: `fs/proc/task_mmu.c` (`show_map_vma`, `smaps_pte_entry`,
//! `smaps_pmd_entry`, `smaps_account`, `smaps_page_accumulate`, `pte_to_pagemap_entry`),
//! `fs/proc/array.c` / `task_mmu.c` (`task_mem`), `fs/proc/page.c` (`stable_page_flags`).
//! The host's build uses per-page mapcounts (CONFIG_PAGE_MAPCOUNT); these views follow it:
//! a page counts as shared when its precise mapcount is two or more, and a folio whose
//! refcount is one is private without looking further.

use crate::errno::SysResult;
use crate::machine::Cpu;
use crate::mm::{Mm, Pid, RssKind};
use crate::pgtable::cursor::PmdKind;
use crate::pgtable::{leaf_at, AnyLeaf, PMD_SIZE};
use crate::phys::{PageFlag, Pfn, PhysMem, HPAGE_PMD_ORDER};
use crate::rmap::page_mapcount;
use crate::vaddr::VirtAddr;
use crate::vma::{VmFlags, Vma};

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MapsEntry {
    /// Start.
    pub start: u64,
    /// End.
    pub end: u64,
    /// `rwxp` / `rw-s`.
    pub perms: String,
    /// Page offset in bytes (the column Linux prints).
    pub offset: u64,
    /// VMA flags (for `usermm` views; Linux shows them in smaps `VmFlags`).
    pub flags: u64,
    /// What the VMA maps (the name column).
    pub backing: Backing,
}

/// What a VMA maps: the name column of `/proc/PID/maps`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backing {
    /// Private anonymous memory (no name).
    Anon,
    /// Shared anonymous memory (`/dev/zero (deleted)`).
    SharedAnon,
    /// A tmpfs file.
    Tmpfs,
    /// A disk file.
    Disk,
}

impl Backing {
    fn of(v: &Vma) -> Backing {
        match v.file.as_ref().map(|f| f.kind) {
            None => Backing::Anon,
            Some(crate::filemap::InodeKind::ShmemAnon) => Backing::SharedAnon,
            Some(crate::filemap::InodeKind::Tmpfs) => Backing::Tmpfs,
            Some(crate::filemap::InodeKind::Disk) => Backing::Disk,
        }
    }
}

/// What `smaps_account` accumulates over one VMA (Linux's `struct mem_size_stats`): the
/// lines counted in whole bytes go straight into the [`Smaps`] they are printed as (one list
/// of smaps fields in the workspace, not a second struct copied field by field); the Pss
/// family is kept apart in Linux's `PSS_SHIFT` fixed point, and [`MemSizeStats::view`]
/// truncates it into those lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MemSizeStats {
    /// Size, Rss, Shared_*/Private_*, Referenced (pages whose PTE is young or whose folio is
    /// referenced), Anonymous, AnonHugePages, ShmemPmdMapped (shmem folios mapped by a PMD),
    /// FilePmdMapped (other page-cache folios mapped by a PMD), LazyFree (anonymous folios
    /// MADV_FREE made clean and not swap-backed, whose entry is clean too: reclaim may drop
    /// them without writing them anywhere) and Swap (pages of the VMA whose entry is a swap
    /// entry), in bytes. Its Pss family, Locked, SwapPss and constant lines are
    /// [`MemSizeStats::view`]'s to fill.
    pub(crate) lines: Smaps,
    /// Pss in bytes << 12 (Linux's `PSS_SHIFT` fixed point).
    pub(crate) pss_fixed: u64,
    /// Locked (Pss of a locked VMA, fixed point like `pss_fixed`).
    pub(crate) locked_fixed: u64,
    /// Pss_Dirty: the Pss of dirty pages (fixed point).
    pub(crate) pss_dirty_fixed: u64,
    /// The Pss of anonymous folios (`smaps_rollup`'s Pss_Anon, here per VMA; fixed point).
    pub(crate) pss_anon_fixed: u64,
    /// The Pss of page-cache folios that are not shmem (Pss_File; fixed point).
    pub(crate) pss_file_fixed: u64,
    /// The Pss of shmem folios (Pss_Shmem; fixed point).
    pub(crate) pss_shmem_fixed: u64,
    /// SwapPss: each swapped page divided by the swap entries naming its slot (fixed point).
    pub(crate) swap_pss_fixed: u64,
    /// THPeligible: whether a THP of some enabled size may back the VMA.
    pub(crate) thp_eligible: bool,
}

impl MemSizeStats {
    /// Pss in bytes (truncated, as Linux prints it in kB).
    fn pss(&self) -> u64 {
        self.pss_fixed >> 12
    }

    /// Locked in bytes.
    fn locked(&self) -> u64 {
        self.locked_fixed >> 12
    }

    /// SwapPss in bytes.
    fn swap_pss(&self) -> u64 {
        self.swap_pss_fixed >> 12
    }

    /// Pss_Dirty in bytes.
    fn pss_dirty(&self) -> u64 {
        self.pss_dirty_fixed >> 12
    }

    /// Pss of anonymous, file and shmem folios in bytes (the rollup's Pss_Anon, Pss_File,
    /// Pss_Shmem for this VMA).
    fn pss_by_kind(&self) -> [u64; 3] {
        [
            self.pss_anon_fixed >> 12,
            self.pss_file_fixed >> 12,
            self.pss_shmem_fixed >> 12,
        ]
    }
}

/// The lines `/proc/PID/smaps` prints for one VMA (or a sum of VMAs), in bytes: the Pss
/// family truncated to whole kB as Linux prints it. The engine's come from its accumulator
/// (`MemSizeStats::view`, crate-private); the oracle fills the same struct from the host's
/// text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Smaps {
    /// Size.
    pub size: u64,
    /// Rss.
    pub rss: u64,
    /// Pss (bytes, truncated to whole kB as `/proc` prints it).
    pub pss: u64,
    /// Shared_Clean.
    pub shared_clean: u64,
    /// Shared_Dirty.
    pub shared_dirty: u64,
    /// Private_Clean.
    pub private_clean: u64,
    /// Private_Dirty.
    pub private_dirty: u64,
    /// Anonymous.
    pub anonymous: u64,
    /// AnonHugePages.
    pub anon_huge_pages: u64,
    /// ShmemPmdMapped.
    pub shmem_pmd_mapped: u64,
    /// FilePmdMapped.
    pub file_pmd_mapped: u64,
    /// Locked.
    pub locked: u64,
    /// Referenced.
    pub referenced: u64,
    /// Pss_Dirty.
    pub pss_dirty: u64,
    /// Pss of anonymous, file and shmem folios (`smaps_rollup`'s Pss_Anon, Pss_File,
    /// Pss_Shmem of these VMAs); `None` where this side cannot tell (the host's smaps has
    /// no per-VMA split, see `scenario::backend::split_pss_by_kind`).
    pub pss_by_kind: Option<[u64; 3]>,
    /// LazyFree.
    pub lazyfree: u64,
    /// KSM.
    pub ksm: u64,
    /// Swap.
    pub swap: u64,
    /// SwapPss.
    pub swap_pss: u64,
    /// Shared_Hugetlb.
    pub shared_hugetlb: u64,
    /// Private_Hugetlb.
    pub private_hugetlb: u64,
    /// KernelPageSize (the largest of the VMAs summed).
    pub kernel_page_size: u64,
    /// MMUPageSize (the largest of the VMAs summed).
    pub mmu_page_size: u64,
    /// THPeligible: 1 when THP may back the VMA (of the VMAs summed: 1 if any is).
    pub thp_eligible: u64,
}

impl Default for Smaps {
    /// No pages: every field 0 (the Pss split known, all 0).
    fn default() -> Self {
        Smaps {
            size: 0,
            rss: 0,
            pss: 0,
            shared_clean: 0,
            shared_dirty: 0,
            private_clean: 0,
            private_dirty: 0,
            anonymous: 0,
            anon_huge_pages: 0,
            shmem_pmd_mapped: 0,
            file_pmd_mapped: 0,
            locked: 0,
            referenced: 0,
            pss_dirty: 0,
            pss_by_kind: Some([0; 3]),
            lazyfree: 0,
            ksm: 0,
            swap: 0,
            swap_pss: 0,
            shared_hugetlb: 0,
            private_hugetlb: 0,
            thp_eligible: 0,
            kernel_page_size: 0,
            mmu_page_size: 0,
        }
    }
}

impl Smaps {
    /// Adds another VMA's fields.
    pub fn add(&mut self, o: &Smaps) {
        self.size += o.size;
        self.rss += o.rss;
        self.pss += o.pss;
        self.shared_clean += o.shared_clean;
        self.shared_dirty += o.shared_dirty;
        self.private_clean += o.private_clean;
        self.private_dirty += o.private_dirty;
        self.anonymous += o.anonymous;
        self.anon_huge_pages += o.anon_huge_pages;
        self.shmem_pmd_mapped += o.shmem_pmd_mapped;
        self.file_pmd_mapped += o.file_pmd_mapped;
        self.locked += o.locked;
        self.referenced += o.referenced;
        self.pss_dirty += o.pss_dirty;
        self.pss_by_kind = match (self.pss_by_kind, o.pss_by_kind) {
            (Some(a), Some(b)) => Some([a[0] + b[0], a[1] + b[1], a[2] + b[2]]),
            _ => None,
        };
        self.lazyfree += o.lazyfree;
        self.ksm += o.ksm;
        self.swap += o.swap;
        self.swap_pss += o.swap_pss;
        self.shared_hugetlb += o.shared_hugetlb;
        self.private_hugetlb += o.private_hugetlb;
        self.kernel_page_size = self.kernel_page_size.max(o.kernel_page_size);
        self.mmu_page_size = self.mmu_page_size.max(o.mmu_page_size);
        self.thp_eligible = self.thp_eligible.max(o.thp_eligible);
    }

    /// The number on the line `name` (`Rss`, `Shared_Clean`, `THPeligible`: the names
    /// `/proc/PID/smaps` prints), to read or set; `None` for any other name, and for the Pss
    /// split, which is not one number ([`Smaps::pss_by_kind`]). The oracle fills the struct
    /// from the host's text with it, and the scenario language's `expect smaps` and `dump`
    /// read it.
    pub fn line_mut(&mut self, name: &str) -> Option<&mut u64> {
        let &(_, field) = SMAPS_LINES.iter().find(|&&(n, _)| n == name)?;
        Some(field(self))
    }

    /// The number on the line `name` ([`Smaps::line_mut`]).
    pub fn line(&self, name: &str) -> Option<u64> {
        // A copy (the struct is a few hundred bytes) lets the one mutable table serve reads.
        let mut copy = *self;
        copy.line_mut(name).copied()
    }

    /// The lines reports show and the oracle compares, as (name, value) pairs: the first
    /// twelve of the table, Size to Locked.
    pub fn fields(&self) -> [(&'static str, u64); 12] {
        let mut copy = *self;
        std::array::from_fn(|i| {
            let (name, field) = SMAPS_LINES[i];
            (name, *field(&mut copy))
        })
    }
}

/// One line of [`SMAPS_LINES`]: its name and its field.
type SmapsLine = (&'static str, fn(&mut Smaps) -> &mut u64);

/// Each line a [`Smaps`] holds as one number, by the name `/proc/PID/smaps` prints it, with
/// its field: the workspace's one table of smaps line names. The first twelve are
/// [`Smaps::fields`].
const SMAPS_LINES: [SmapsLine; 23] = [
    ("Size", |s| &mut s.size),
    ("Rss", |s| &mut s.rss),
    ("Pss", |s| &mut s.pss),
    ("Shared_Clean", |s| &mut s.shared_clean),
    ("Shared_Dirty", |s| &mut s.shared_dirty),
    ("Private_Clean", |s| &mut s.private_clean),
    ("Private_Dirty", |s| &mut s.private_dirty),
    ("Anonymous", |s| &mut s.anonymous),
    ("AnonHugePages", |s| &mut s.anon_huge_pages),
    ("ShmemPmdMapped", |s| &mut s.shmem_pmd_mapped),
    ("FilePmdMapped", |s| &mut s.file_pmd_mapped),
    ("Locked", |s| &mut s.locked),
    ("Referenced", |s| &mut s.referenced),
    ("Pss_Dirty", |s| &mut s.pss_dirty),
    ("LazyFree", |s| &mut s.lazyfree),
    ("KSM", |s| &mut s.ksm),
    ("Swap", |s| &mut s.swap),
    ("SwapPss", |s| &mut s.swap_pss),
    ("Shared_Hugetlb", |s| &mut s.shared_hugetlb),
    ("Private_Hugetlb", |s| &mut s.private_hugetlb),
    ("KernelPageSize", |s| &mut s.kernel_page_size),
    ("MMUPageSize", |s| &mut s.mmu_page_size),
    ("THPeligible", |s| &mut s.thp_eligible),
];

impl MemSizeStats {
    /// The printed lines: the byte counts as accumulated, the Pss family in whole kB; the
    /// engine has no KSM and no hugetlb, and maps 4 KiB pages (KernelPageSize and
    /// MMUPageSize).
    pub(crate) fn view(&self) -> Smaps {
        Smaps {
            pss: self.pss() & !1023,
            locked: self.locked() & !1023,
            pss_dirty: self.pss_dirty() & !1023,
            pss_by_kind: Some(self.pss_by_kind().map(|b| b & !1023)),
            swap_pss: self.swap_pss() & !1023,
            ksm: 0,
            shared_hugetlb: 0,
            private_hugetlb: 0,
            kernel_page_size: 4096,
            mmu_page_size: 4096,
            thp_eligible: u64::from(self.thp_eligible),
            ..self.lines
        }
    }
}

/// `/proc/PID/status` memory lines, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    /// VmSize.
    pub vm_size: u64,
    /// VmRSS.
    pub vm_rss: u64,
    /// RssAnon.
    pub rss_anon: u64,
    /// RssShmem.
    pub rss_shmem: u64,
    /// RssFile.
    pub rss_file: u64,
    /// VmSwap: the swap entries in the page tables (`MM_SWAPENTS`).
    pub vm_swap: u64,
    /// VmLck.
    pub vm_lck: u64,
    /// VmPin.
    pub vm_pin: u64,
    /// VmData (private writable, non-stack).
    pub vm_data: u64,
    /// Number of VMAs.
    pub map_count: u64,
}

/// One pagemap entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Pagemap {
    /// Bit 63.
    pub present: bool,
    /// Bit 56 (`PM_MMAP_EXCLUSIVE`).
    pub exclusive: bool,
    /// Bit 61 (`PM_FILE`: page cache or shared anon).
    pub(crate) file: bool,
    /// Bit 55 (soft-dirty).
    pub(crate) soft_dirty: bool,
    /// Bit 62 (`PM_SWAP`): the entry is a swap entry.
    pub swapped: bool,
}

/// `/proc/kpageflags` bit numbers.
#[allow(missing_docs)]
pub mod kpf {
    pub const LOCKED: u32 = 0;
    pub const REFERENCED: u32 = 2;
    pub const UPTODATE: u32 = 3;
    pub const DIRTY: u32 = 4;
    pub const LRU: u32 = 5;
    pub const ACTIVE: u32 = 6;
    pub const BUDDY: u32 = 10;
    pub const MMAP: u32 = 11;
    pub const ANON: u32 = 12;
    pub const SWAPCACHE: u32 = 13;
    pub const SWAPBACKED: u32 = 14;
    pub const COMPOUND_HEAD: u32 = 15;
    pub const COMPOUND_TAIL: u32 = 16;
    pub const UNEVICTABLE: u32 = 18;
    pub const THP: u32 = 22;
    pub const ZERO_PAGE: u32 = 24;
    pub const PGTABLE: u32 = 26;
    pub const RESERVED: u32 = 32;
    pub const MLOCKED: u32 = 33;
    pub const MAPPEDTODISK: u32 = 34;
    pub const WRITEBACK: u32 = 8;
}

/// What one mapping of a folio adds to smaps.
#[derive(Clone, Copy, Debug)]
struct Charge {
    /// Bytes mapped.
    size: u64,
    /// Their proportional share (fixed point, 12 fractional bits).
    pss: u64,
    /// The entry is dirty.
    dirty: bool,
    /// The VMA is locked.
    locked: bool,
    /// Mapped once (Private_*), else Shared_*.
    private: bool,
}

fn accumulate(s: &mut MemSizeStats, phys: &PhysMem, head: Pfn, ch: Charge) {
    s.pss_fixed += ch.pss;
    if phys.memmap.test(head, PageFlag::Anon) {
        s.pss_anon_fixed += ch.pss;
    } else if phys.memmap.test(head, PageFlag::SwapBacked) {
        s.pss_shmem_fixed += ch.pss;
    } else {
        s.pss_file_fixed += ch.pss;
    }
    if ch.locked {
        s.locked_fixed += ch.pss;
    }
    let dirty = ch.dirty || phys.memmap.test(head, PageFlag::Dirty);
    if dirty {
        s.pss_dirty_fixed += ch.pss;
    }
    match (dirty, ch.private) {
        (true, true) => s.lines.private_dirty += ch.size,
        (true, false) => s.lines.shared_dirty += ch.size,
        (false, true) => s.lines.private_clean += ch.size,
        (false, false) => s.lines.shared_clean += ch.size,
    }
}

/// `smaps_account` for `nr` pages from `page` mapped by one entry.
fn smaps_account(
    s: &mut MemSizeStats,
    phys: &PhysMem,
    page: Pfn,
    nr: u64,
    dirty: bool,
    young: bool,
    locked: bool,
) {
    let head = phys.memmap.folio_of(page);
    let size = nr * 4096;
    if young || phys.memmap.test(head, PageFlag::Referenced) {
        s.lines.referenced += size;
    }
    if phys.memmap.test(head, PageFlag::Anon) {
        s.lines.anonymous += size;
        let clean = !dirty && !phys.memmap.test(head, PageFlag::Dirty);
        if clean && !phys.memmap.test(head, PageFlag::SwapBacked) {
            s.lines.lazyfree += size;
        }
    }
    s.lines.rss += size;
    if phys.memmap.refcount(head) == 1 {
        let ch = Charge {
            size,
            pss: size << 12,
            dirty,
            locked,
            private: true,
        };
        accumulate(s, phys, head, ch);
        return;
    }
    for p in page.range(nr) {
        let mapcount = page_mapcount(phys, p).max(1) as u64;
        let pss = (4096u64 << 12) / mapcount;
        let ch = Charge {
            size: 4096,
            pss,
            dirty,
            locked,
            private: mapcount < 2,
        };
        accumulate(s, phys, head, ch);
    }
}

impl<'m> Cpu<'m> {
    /// `/proc/PID/maps`.
    pub fn maps(&self, pid: Pid) -> SysResult<Vec<MapsEntry>> {
        let task = mm_of(self, pid)?;
        let st = task.mm.lock.read();
        Ok(st
            .vmas
            .all()
            .into_iter()
            .map(|id| {
                let v = st.vmas.get(id);
                let offset = if v.file.is_some() { v.pgoff << 12 } else { 0 };
                MapsEntry {
                    start: v.start,
                    end: v.end,
                    perms: v.flags.perms(),
                    offset,
                    flags: v.flags.0,
                    backing: Backing::of(v),
                }
            })
            .collect())
    }

    /// `/proc/PID/smaps`: one entry per VMA overlapping `[start, end)`, each for the whole VMA.
    pub fn smaps(&self, pid: Pid, start: u64, end: u64) -> SysResult<Vec<(MapsEntry, Smaps)>> {
        let task = mm_of(self, pid)?;
        let st = task.mm.lock.read();
        let mut out = Vec::new();
        for id in st.vmas.overlapping(start, end) {
            let v = st.vmas.get(id);
            let e = MapsEntry {
                start: v.start,
                end: v.end,
                perms: v.flags.perms(),
                offset: if v.file.is_some() { v.pgoff << 12 } else { 0 },
                flags: v.flags.0,
                backing: Backing::of(v),
            };
            out.push((e, smaps_vma(self, &task.mm, v).view()));
        }
        Ok(out)
    }

    /// `/proc/PID/status` memory lines.
    pub fn status(&self, pid: Pid) -> SysResult<Status> {
        let task = mm_of(self, pid)?;
        let mm = &task.mm;
        let st = mm.lock.read();
        let mut s = Status {
            rss_anon: mm.rss(RssKind::Anon).max(0) as u64 * 4096,
            rss_shmem: mm.rss(RssKind::Shmem).max(0) as u64 * 4096,
            rss_file: mm.rss(RssKind::File).max(0) as u64 * 4096,
            vm_swap: mm.rss(RssKind::Swap).max(0) as u64 * 4096,
            vm_lck: st.locked_vm * 4096,
            vm_pin: st.pinned_vm * 4096,
            map_count: st.vmas.count() as u64,
            ..Status::default()
        };
        s.vm_rss = s.rss_anon + s.rss_shmem + s.rss_file;
        for id in st.vmas.all() {
            let v = st.vmas.get(id);
            s.vm_size += v.len();
            if v.flags.0 & (VmFlags::WRITE | VmFlags::SHARED | VmFlags::GROWSDOWN) == VmFlags::WRITE
            {
                s.vm_data += v.len();
            }
        }
        Ok(s)
    }

    /// `/proc/PID/pagemap` for the page containing `addr`.
    pub fn pagemap(&self, pid: Pid, addr: u64) -> SysResult<Pagemap> {
        let task = mm_of(self, pid)?;
        let _st = task.mm.lock.read();
        let pt = self.tables(&task.mm);
        let phys = &self.m.phys;
        let Some(leaf) = leaf_at(pt, addr) else {
            // A swap entry: bit 62 only (measured on 6.18: bit 56, "exclusively mapped", is
            // never set for one, whatever the slot's count).
            if let crate::pgtable::Walk::Pte { entry, .. } = pt.walk(VirtAddr::new(addr)) {
                if pt.arch.is_swap_pte(entry) {
                    return Ok(Pagemap {
                        swapped: true,
                        ..Pagemap::default()
                    });
                }
            }
            return Ok(Pagemap::default());
        };
        let mut pm = Pagemap {
            present: true,
            soft_dirty: pt.arch.soft_dirty(leaf.entry),
            ..Pagemap::default()
        };
        if !phys.is_zero_pfn(leaf.pfn) {
            let head = phys.memmap.folio_of(leaf.pfn);
            pm.file = !phys.memmap.test(head, PageFlag::Anon);
            // For a PMD mapping Linux judges every entry by the PMD's first page
            // (`pagemap_pmd_range_thp` does not advance the page it checks).
            let judged = if leaf.entry.is_pmd() {
                pt.arch.pfn(leaf.entry)
            } else {
                leaf.pfn
            };
            pm.exclusive = page_mapcount(phys, judged) == 1;
        }
        Ok(pm)
    }

    /// `/proc/kpageflags` of the page mapped at `addr`, after draining every CPU's batches
    /// (the scenario language defines page flags that way).
    pub fn kpageflags(&self, pid: Pid, addr: u64) -> SysResult<Option<u64>> {
        let task = mm_of(self, pid)?;
        self.lru_add_drain_all();
        let _st = task.mm.lock.read();
        let pt = self.tables(&task.mm);
        let Some(leaf) = leaf_at(pt, addr) else {
            return Ok(None);
        };
        Ok(Some(stable_page_flags(&self.m.phys, leaf.pfn)))
    }

    /// Every sharing tracker's answer for the large anon folio mapping `addr` (seed 003).
    pub fn folio_sharing(
        &self,
        pid: Pid,
        addr: u64,
    ) -> SysResult<Option<crate::sharing::SharingAnswers>> {
        let task = mm_of(self, pid)?;
        let _st = task.mm.lock.read();
        let pt = self.tables(&task.mm);
        let Some(leaf) = leaf_at(pt, addr) else {
            return Ok(None);
        };
        let mem = &self.m.phys.memmap;
        let head = mem.folio_of(leaf.pfn);
        if !(mem.test(head, PageFlag::Head) && mem.test(head, PageFlag::Anon)) {
            return Ok(None);
        }
        Ok(Some(self.m.phys.sharing.answers(
            mem.folio(head),
            task.mm.id,
            task.mm.id,
        )))
    }

    /// Order of the folio mapping `addr`.
    pub fn folio_order(&self, pid: Pid, addr: u64) -> SysResult<Option<u32>> {
        let task = mm_of(self, pid)?;
        let _st = task.mm.lock.read();
        let pt = self.tables(&task.mm);
        let Some(leaf) = leaf_at(pt, addr) else {
            return Ok(None);
        };
        let head = self.m.phys.memmap.folio_of(leaf.pfn);
        Ok(Some(self.m.phys.memmap.order(head)))
    }
}

fn mm_of<'m>(cpu: &Cpu<'m>, pid: Pid) -> SysResult<std::sync::Arc<crate::mm::Task>> {
    cpu.m.task(pid)
}

fn smaps_vma<'m>(cpu: &Cpu<'m>, mm: &Mm, v: &Vma) -> MemSizeStats {
    let phys = &cpu.m.phys;
    let pt = cpu.tables(mm);
    let locked = v.flags.has(VmFlags::LOCKED);
    let swap = cpu.m.swap.as_ref();
    let mut s = MemSizeStats {
        lines: Smaps {
            size: v.len(),
            ..Smaps::default()
        },
        thp_eligible: thp_eligible(&cpu.m.tunables(), v),
        ..MemSizeStats::default()
    };
    if let Some(f) = v.file.as_ref().filter(|f| f.kind.is_shmem()) {
        // `shmem_swap_usage`: the object's pages in the VMA's range that are out on swap
        // (no SwapPss: they are the object's, not any process's).
        let last = v.pgoff + (v.len() >> 12);
        s.lines.swap += f.swapped.lock().range(v.pgoff..last).count() as u64 * 4096;
    }
    for step in pt.pmd_walk(v.vm_start(), v.vm_end()) {
        match step.kind {
            PmdKind::Huge(entry) => {
                let pfn = pt.arch.pfn(entry);
                if !phys.is_zero_pfn(pfn) {
                    smaps_account(
                        &mut s,
                        phys,
                        pfn,
                        1 << HPAGE_PMD_ORDER,
                        pt.arch.dirty(entry),
                        pt.arch.young(entry),
                        locked,
                    );
                    if phys.memmap.test(pfn, PageFlag::Anon) {
                        s.lines.anon_huge_pages += PMD_SIZE;
                    } else if phys.memmap.test(pfn, PageFlag::SwapBacked) {
                        s.lines.shmem_pmd_mapped += PMD_SIZE;
                    } else {
                        s.lines.file_pmd_mapped += PMD_SIZE;
                    }
                }
            }
            PmdKind::Table(table) => {
                let (i0, i1) = step.pte_indexes();
                for i in i0..i1 {
                    let e = pt.ptep_get_raw(table, i);
                    if pt.arch.is_swap_pte(e) {
                        // `smaps_pte_entry` of a swap entry: Swap, and SwapPss shared by
                        // the entries that name the slot.
                        let n = swap.map_or(1, |sw| sw.swapcount(pt.arch.swp_entry(e)).max(1));
                        s.lines.swap += 4096;
                        s.swap_pss_fixed += (4096u64 << 12) / u64::from(n);
                        continue;
                    }
                    if e.is_none() || !pt.arch.present(e) {
                        continue;
                    }
                    if pt.vm_normal_folio(e).is_some() {
                        smaps_account(
                            &mut s,
                            phys,
                            pt.arch.pfn(e),
                            1,
                            pt.arch.dirty(e),
                            pt.arch.young(e),
                            locked,
                        );
                    }
                }
            }
        }
    }
    s
}

/// smaps `THPeligible` (`thp_vma_allowable_orders(…, TVA_SMAPS, THP_ORDERS_ALL)`): some folio
/// size the policy enables for the VMA (anonymous memory: `set thp`; shmem and tmpfs:
/// `shmem_enabled`; other files: never, as the scenario's files are open for writing) fits
/// naturally aligned in it, placed at its end (the smaps check is not tied to an address).
fn thp_eligible(t: &crate::tunables::Tunables, v: &Vma) -> bool {
    if v.flags.has(VmFlags::NOHUGEPAGE) {
        return false;
    }
    let hugepage = v.flags.has(VmFlags::HUGEPAGE);
    let allowed = |order: u32| match &v.file {
        None => t.thp.order_allowed(order, hugepage),
        Some(f) if f.kind.is_shmem() => {
            let mask = t.shmem.fault_orders(
                f.kind == crate::filemap::InodeKind::ShmemAnon,
                hugepage,
                0,
                f.size_pages(),
            );
            mask & (1 << order) != 0
        }
        Some(_) => false,
    };
    (2..=HPAGE_PMD_ORDER).any(|order| {
        let size = 4096u64 << order;
        let Some(last) = v.end.checked_sub(size) else {
            return false;
        };
        allowed(order) && last & !(size - 1) >= v.start
    })
}

/// The kpageflags word of a frame (`stable_page_flags`).
pub(crate) fn stable_page_flags(phys: &PhysMem, pfn: Pfn) -> u64 {
    let mm = &phys.memmap;
    let head = mm.folio_of(pfn);
    let mut u = 0u64;
    let mut set = |bit: u32, on: bool| {
        if on {
            u |= 1 << bit;
        }
    };
    let large = mm.test(head, PageFlag::Head);
    if phys.is_zero_pfn(pfn) {
        set(kpf::ZERO_PAGE, true);
        // The small zero page is a page of the kernel image: PG_reserved.
        set(kpf::RESERVED, !large);
        set(kpf::THP, large);
        set(kpf::COMPOUND_HEAD, large && pfn == head);
        set(kpf::COMPOUND_TAIL, large && pfn != head);
        return u;
    }
    let mapped = if large {
        mm.folio_mapcount(head) > 0
    } else {
        mm.mapcount(head) > 0
    };
    set(kpf::MMAP, mapped);
    set(kpf::ANON, mm.test(head, PageFlag::Anon));
    set(kpf::COMPOUND_HEAD, large && pfn == head);
    set(kpf::COMPOUND_TAIL, large && pfn != head);
    set(kpf::THP, large && mm.test(head, PageFlag::LargeRmappable));
    set(kpf::LOCKED, mm.test(head, PageFlag::Locked));
    set(kpf::REFERENCED, mm.test(head, PageFlag::Referenced));
    set(kpf::UPTODATE, mm.test(head, PageFlag::Uptodate));
    set(kpf::DIRTY, mm.test(head, PageFlag::Dirty));
    set(kpf::LRU, mm.test(head, PageFlag::Lru));
    set(kpf::ACTIVE, mm.test(head, PageFlag::Active));
    set(kpf::SWAPBACKED, mm.test(head, PageFlag::SwapBacked));
    set(kpf::SWAPCACHE, mm.test(head, PageFlag::SwapCache));
    set(kpf::UNEVICTABLE, mm.test(head, PageFlag::Unevictable));
    set(kpf::MLOCKED, mm.test(head, PageFlag::Mlocked));
    // PG_anon_exclusive shares its bit with PG_mappedtodisk (a per-page flag).
    set(
        kpf::MAPPEDTODISK,
        if mm.test(head, PageFlag::Anon) {
            mm.test(pfn, PageFlag::AnonExclusive)
        } else {
            mm.test(head, PageFlag::MappedToDisk)
        },
    );
    set(kpf::WRITEBACK, mm.test(head, PageFlag::Writeback));
    set(kpf::PGTABLE, mm.test(head, PageFlag::Pgtable));
    u
}

/// One leaf page-table entry of a dump.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LeafEntry {
    /// Virtual address mapped.
    pub addr: u64,
    /// The entry: a PTE, or a PMD leaf (2 MiB); [`AnyLeaf::val`] gives its raw bits.
    pub entry: AnyLeaf,
}

impl<'m> Cpu<'m> {
    /// Every non-empty leaf entry of process `pid`, in address order (a raw page-table dump).
    pub fn page_table_dump(&self, pid: Pid) -> SysResult<Vec<LeafEntry>> {
        let task = mm_of(self, pid)?;
        let _st = task.mm.lock.read();
        let mut out = Vec::new();
        crate::pgtable::cursor::walk_leaves(self.tables(&task.mm), &mut |addr, entry| {
            out.push(LeafEntry { addr, entry })
        });
        Ok(out)
    }
}

impl<'m> Cpu<'m> {
    /// The pages of `[start, end)` that `/proc/PID/pagemap` shows present, in address order.
    ///
    /// A walk that steps over empty PGD, PUD and PMD entries whole, so its cost follows what
    /// is mapped rather than the size of the range: the oracle compares a 64 GiB
    /// reservation with one written page this way. A PMD leaf yields each of its pages that
    /// lie in the range. Present means what [`Cpu::pagemap`] reports as present.
    pub fn present_pages(&self, pid: Pid, start: u64, end: u64) -> SysResult<Vec<u64>> {
        let task = mm_of(self, pid)?;
        let _st = task.mm.lock.read();
        let pt = self.tables(&task.mm);
        let mut out = Vec::new();
        let (start, end) = (VirtAddr::new(start).page_align_down(), VirtAddr::new(end));
        for step in pt.pmd_walk(start, end) {
            match step.kind {
                PmdKind::Huge(pmd) => {
                    if pt.arch.present(pmd) {
                        out.extend((step.start.val()..step.end.val()).step_by(4096));
                    }
                }
                PmdKind::Table(table) => {
                    let (i0, i1) = step.pte_indexes();
                    out.extend((i0..i1).filter_map(|i| {
                        let e = pt.ptep_get_raw(table, i);
                        (!e.is_none() && pt.arch.present(e)).then(|| step.pte_addr(i).val())
                    }));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{Smaps, SMAPS_LINES};

    #[test]
    fn lines_are_set_and_read_by_name() {
        // Every name the scenario language knows is checked there (`scenario::run`); here
        // the table's own, in its order.
        let mut s = Smaps::default();
        for (n, &(name, _)) in (1u64..).zip(&SMAPS_LINES) {
            *s.line_mut(name).unwrap_or_else(|| panic!("{name}")) = n << 12;
        }
        // Each name is its own field: every value read back as set.
        for (n, &(name, _)) in (1u64..).zip(&SMAPS_LINES) {
            assert_eq!(s.line(name), Some(n << 12), "{name}");
        }
        assert_eq!(s.fields()[0], ("Size", 1 << 12));
        assert_eq!(s.fields()[11], ("Locked", 12 << 12));
        assert_eq!(
            (s.size, s.ksm, s.thp_eligible),
            (1 << 12, 16 << 12, 23 << 12)
        );
        for name in ["Pss_Anon", "VmFlags", "rss", ""] {
            assert_eq!(s.line(name), None, "{name}");
        }
    }
}
