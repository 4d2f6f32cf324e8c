//! mlock and the LRU hooks: per-CPU folio batches, the mlock state machine of a folio.
//!
//! Linux counterparts: `mm/mlock.c` (current design: `mlock_folio`, `munlock_folio`,
//! `mlock_new_folio`, `__mlock_folio`, `__munlock_folio`, `mlock_folio_batch`,
//! `mlock_vma_folio`, `munlock_vma_folio`) and `mm/swap.c` (`folio_add_lru`,
//! `folio_add_lru_vma`, `lru_add_drain`). New folios and (un)mlock requests go through a
//! per-CPU batch of up to [`FOLIO_BATCH_SIZE`] entries; each entry holds a folio reference;
//! the batch is processed under the lru_lock (re-taken only when the node changes) when it
//! fills up, when a large folio is queued, or on a drain. `PG_mlocked` and `NR_MLOCK` are
//! updated when mlock is requested; the unevictable list and `mlock_count` when the batch is
//! processed. Munlock clears `PG_mlocked` only when the last locking mapping goes
//! (`mlock_count` reaches zero).
//!
//! # Locking
//! The per-CPU batch lock stands for Linux's `local_lock` (which only disables preemption).
//! It is a leaf: a full batch is taken out and the lock released while the batch is processed
//! under the lru_lock. A walk that queues many folios ([`MlockQueue`]) holds it across one PTE
//! table instead of taking it per folio, the one cost of the engine's lock Linux does not pay.

use crate::machine::Cpu;
pub(crate) use crate::phys::lru::{CpuBatches, FolioBatch, MlockOp, FOLIO_BATCH_SIZE};
use crate::phys::{Folio, PageFlag, Pfn};
use crate::stats::Ev;
use crate::vma::{VmFlags, Vma};

/// This CPU's mlock batch with its lock held (see the module's locking notes).
pub(crate) struct MlockQueue<'a, 'm> {
    cpu: &'a Cpu<'m>,
    batches: parking_lot::MutexGuard<'m, CpuBatches>,
}

impl MlockQueue<'_, '_> {
    /// Queues `op` for a folio, taking a reference for the batch; processes the batch (with the
    /// lock released) when it is full or the folio is large.
    pub(crate) fn push(&mut self, folio: Folio<'_>, op: MlockOp) {
        let cpu = self.cpu;
        crate::rmap::folio_ref_add(cpu.c(), folio, 1);
        self.batches.mlock.push((folio.pfn(), op));
        if self.batches.mlock.len() >= FOLIO_BATCH_SIZE || folio.is_large() {
            // Processed in place under the batch lock, as `mlock_folio_batch` runs under the
            // local lock, then emptied (`folio_batch_reinit`): no copy of the batch.
            process_mlock(cpu, &self.batches.mlock);
            self.batches.mlock.clear();
        }
    }

    /// `mlock_folio`: marks mlocked now, moves to the unevictable list when the batch runs.
    pub(crate) fn mlock(&mut self, folio: Folio<'_>) {
        set_mlocked(self.cpu, folio);
        self.push(folio, MlockOp::Mlock);
    }

    /// `munlock_folio`: the decision is deferred to the batch (it may be locked elsewhere).
    pub(crate) fn munlock(&mut self, folio: Folio<'_>) {
        self.push(folio, MlockOp::Munlock);
    }

    /// [`MlockQueue::mlock`] (`lock`) or [`MlockQueue::munlock`].
    pub(crate) fn mlock_or_munlock(&mut self, folio: Folio<'_>, lock: bool) {
        if lock {
            self.mlock(folio);
        } else {
            self.munlock(folio);
        }
    }
}

/// Whether a VMA's pages are kept mlocked (`VM_LOCKED` and not `VM_SPECIAL`).
pub(crate) fn vma_locked(vma: &Vma) -> bool {
    vma.flags.has(VmFlags::LOCKED)
}

impl<'m> Cpu<'m> {
    /// The folio headed by `head`.
    fn folio(&self, head: Pfn) -> Folio<'m> {
        self.m.phys.memmap.folio(head)
    }

    /// Drains this CPU's batches (`lru_add_drain`).
    pub fn lru_add_drain(&self) {
        drain_lru_add(self);
        drain_mlock(self);
    }

    /// Drains every CPU's batches (`lru_add_drain_all`).
    pub fn lru_add_drain_all(&self) {
        for cpu in 0..self.m.nr_cpus() {
            let mut b = self.m.cpu_batches(cpu).lock();
            process_lru_add(self, &b.lru_add);
            b.lru_add.clear();
            process_mlock(self, &b.mlock);
            b.mlock.clear();
        }
    }
}

/// Queues a new folio for the LRU (`folio_add_lru`).
pub(crate) fn folio_add_lru<'m>(cpu: &Cpu<'m>, folio: Folio<'_>) {
    crate::rmap::folio_ref_add(cpu.c(), folio, 1);
    let full = {
        let mut b = cpu.batches().lock();
        b.lru_add.push(folio.pfn());
        b.lru_add.len() >= FOLIO_BATCH_SIZE || folio.is_large()
    };
    if full {
        drain_lru_add(cpu);
    }
}

/// Queues a new folio of `vma` for the LRU, mlocked if the VMA is (`folio_add_lru_vma`).
pub(crate) fn folio_add_lru_vma<'m>(cpu: &Cpu<'m>, folio: Folio<'_>, vma: &Vma) {
    if vma_locked(vma) {
        mlock_new_folio(cpu, folio);
    } else {
        folio_add_lru(cpu, folio);
    }
}

/// This CPU's mlock batch, held for queueing several folios.
pub(crate) fn mlock_queue<'a, 'm>(cpu: &'a Cpu<'m>) -> MlockQueue<'a, 'm> {
    MlockQueue {
        cpu,
        batches: cpu.batches().lock(),
    }
}

fn set_mlocked<'m>(cpu: &Cpu<'m>, folio: Folio<'_>) {
    if !folio.test_and_set(PageFlag::Mlocked) {
        cpu.m
            .phys
            .mod_nr_mlock(cpu.c(), folio.pfn(), folio.nr_pages() as i64);
        cpu.c().add(Ev::NrMlockUpdate, 1);
        cpu.c().add(Ev::Mlocked, folio.nr_pages());
        cpu.c().add(Ev::FolioMlocked, 1);
    }
}

/// `mlock_new_folio`.
pub(crate) fn mlock_new_folio<'m>(cpu: &Cpu<'m>, folio: Folio<'_>) {
    set_mlocked(cpu, folio);
    mlock_queue(cpu).push(folio, MlockOp::New);
}

/// `mlock_folio` of one folio.
pub(crate) fn mlock_folio<'m>(cpu: &Cpu<'m>, folio: Folio<'_>) {
    mlock_queue(cpu).mlock(folio);
}

/// `munlock_folio` of one folio.
pub(crate) fn munlock_folio<'m>(cpu: &Cpu<'m>, folio: Folio<'_>) {
    mlock_queue(cpu).munlock(folio);
}

/// `mlock_vma_folio`: a small folio newly mapped into a locked VMA.
pub(crate) fn mlock_vma_folio<'m>(cpu: &Cpu<'m>, folio: Folio<'_>, vma: &Vma) {
    if vma_locked(vma) && !folio.is_large() {
        mlock_folio(cpu, folio);
    }
}

/// `__folio_add_file_rmap`'s mlock (6.18): a page-cache folio newly mapped into a locked
/// VMA is mlocked when one rmap call maps it whole (`nr` is all its pages: a small folio,
/// a large folio by all its PTEs, or a PMD); a large folio mapped in part is not
/// (measured: a 64K tmpfs folio faulted whole into a locked VMA reads `mlocked`).
pub(crate) fn mlock_vma_file_folio<'m>(cpu: &Cpu<'m>, folio: Folio<'_>, vma: &Vma, nr: u64) {
    if vma_locked(vma) && nr == folio.nr_pages() {
        mlock_folio(cpu, folio);
    }
}

/// `munlock_vma_folio`: a mapping of the folio in a locked VMA went away.
///
/// With a 2013 munlock design the munlock pass ran before the unmap, so nothing is done.
pub(crate) fn munlock_vma_folio<'m>(cpu: &Cpu<'m>, folio: Folio<'_>, vma: &Vma) {
    if vma_locked(vma) && cpu.m.tunables().munlock == crate::tunables::MunlockDesign::Modern {
        munlock_folio(cpu, folio);
    }
}

/// Whether [`munlock_vma_folio`] acts in `vma`: read once by walkers that unmap
/// many folios of one VMA, instead of taking the tunables lock per folio.
pub(crate) fn munlocks_at_unmap<'m>(cpu: &Cpu<'m>, vma: &Vma) -> bool {
    vma_locked(vma) && cpu.m.tunables().munlock == crate::tunables::MunlockDesign::Modern
}

/// Drains the lru_add batch in place under its lock (`folio_batch_move_lru`).
fn drain_lru_add<'m>(cpu: &Cpu<'m>) {
    let mut b = cpu.batches().lock();
    process_lru_add(cpu, &b.lru_add);
    b.lru_add.clear();
}

/// Drains the mlock batch in place under its lock (`mlock_folio_batch`).
fn drain_mlock<'m>(cpu: &Cpu<'m>) {
    let mut b = cpu.batches().lock();
    process_mlock(cpu, &b.mlock);
    b.mlock.clear();
}

/// Drops the batch's folio references (`folios_put`).
fn release_batch<'m>(cpu: &Cpu<'m>, folios: impl Iterator<Item = Pfn>) {
    let refs: FolioBatch<(Pfn, i32)> = folios.map(|f| (f, 1)).collect();
    cpu.m.phys.folios_put_refs(cpu.c(), &refs);
}

fn process_lru_add<'m>(cpu: &Cpu<'m>, folios: &[Pfn]) {
    if folios.is_empty() {
        return;
    }
    cpu.c().add(Ev::BatchDrain, 1);
    let mem = &cpu.m.phys.memmap;
    cpu.m.phys.with_lru_locks(
        cpu.c(),
        folios,
        |f| f,
        |lists, f| {
            let folio = mem.folio(f);
            let nr = folio.nr_pages();
            if folio.test(PageFlag::Mlocked) {
                folio.set(PageFlag::Unevictable);
                folio.set_mlock_count(0);
                cpu.c().add(Ev::Culled, nr);
            }
            lists.add(folio, nr);
            folio.set(PageFlag::Lru);
        },
    );
    release_batch(cpu, folios.iter().copied());
}

fn process_mlock<'m>(cpu: &Cpu<'m>, entries: &[(Pfn, MlockOp)]) {
    if entries.is_empty() {
        return;
    }
    cpu.c().add(Ev::BatchDrain, 1);
    cpu.m.phys.with_lru_locks(
        cpu.c(),
        entries,
        |(f, _)| f,
        |lists, (f, op)| match op {
            MlockOp::New => mlock_new_locked(cpu, lists, f),
            MlockOp::Mlock => mlock_locked(cpu, lists, f),
            MlockOp::Munlock => munlock_locked(cpu, lists, f),
        },
    );
    release_batch(cpu, entries.iter().map(|&(f, _)| f));
}

/// `__mlock_new_folio`.
fn mlock_new_locked<'m>(cpu: &Cpu<'m>, lists: &mut crate::phys::lru::Lists, f: Pfn) {
    let folio = cpu.folio(f);
    let nr = folio.nr_pages();
    if folio.test(PageFlag::Mlocked) {
        folio.set(PageFlag::Unevictable);
        folio.set_mlock_count(1);
        cpu.c().add(Ev::Culled, nr);
    }
    lists.add(folio, nr);
    folio.set(PageFlag::Lru);
}

/// `__mlock_folio`.
fn mlock_locked<'m>(cpu: &Cpu<'m>, lists: &mut crate::phys::lru::Lists, f: Pfn) {
    let folio = cpu.folio(f);
    let nr = folio.nr_pages();
    if !folio.test_and_clear(PageFlag::Lru) {
        return;
    }
    let mlocked = folio.test(PageFlag::Mlocked);
    let unevictable = folio.test(PageFlag::Unevictable);
    if !mlocked {
        if unevictable {
            lists.del(folio, nr);
            folio.clear(PageFlag::Unevictable);
            lists.add(folio, nr);
            cpu.c().add(Ev::Rescued, nr);
        }
    } else if unevictable {
        folio.set_mlock_count(folio.mlock_count() + 1);
    } else {
        lists.del(folio, nr);
        folio.clear(PageFlag::Active);
        folio.set(PageFlag::Unevictable);
        folio.set_mlock_count(1);
        lists.add(folio, nr);
        cpu.c().add(Ev::Culled, nr);
    }
    folio.set(PageFlag::Lru);
}

/// `__munlock_folio`.
fn munlock_locked<'m>(cpu: &Cpu<'m>, lists: &mut crate::phys::lru::Lists, f: Pfn) {
    let folio = cpu.folio(f);
    let nr = folio.nr_pages();
    let isolated = folio.test_and_clear(PageFlag::Lru);
    let unevictable = folio.test(PageFlag::Unevictable);
    if isolated && unevictable {
        let count = folio.mlock_count();
        if count > 0 {
            folio.set_mlock_count(count - 1);
            if count - 1 > 0 {
                folio.set(PageFlag::Lru);
                return;
            }
        }
    }
    if folio.test_and_clear(PageFlag::Mlocked) {
        cpu.m.phys.mod_nr_mlock(cpu.c(), f, -(nr as i64));
        cpu.c().add(Ev::NrMlockUpdate, 1);
        cpu.c().add(Ev::FolioMunlocked, 1);
        // Off its LRU and still unevictable, the folio stays there until reclaim finds it.
        let stat = if isolated || !unevictable {
            Ev::Munlocked
        } else {
            Ev::Stranded
        };
        cpu.c().add(stat, nr);
    }
    if isolated && unevictable && !folio.test(PageFlag::Mlocked) {
        lists.del(folio, nr);
        folio.clear(PageFlag::Unevictable);
        folio.set_mlock_count(0);
        lists.add(folio, nr);
        cpu.c().add(Ev::Rescued, nr);
    }
    if isolated {
        folio.set(PageFlag::Lru);
    }
}

/// Changes the flags that choose a folio's LRU list (`change(on_lru)`) under its lruvec
/// lock, taking it off its evictable list first and putting it back on the new one.
pub(crate) fn lru_relist<'m>(cpu: &Cpu<'m>, folio: Folio<'_>, change: impl FnOnce(bool)) {
    use crate::phys::PageFlag;
    let phys = &cpu.m.phys;
    let nr = folio.nr_pages();
    cpu.c().add(Ev::LockLru, 1);
    let mut lists = phys.lruvec_of(folio.pfn()).lock();
    let on_lru = folio.test(PageFlag::Lru) && !folio.test(PageFlag::Unevictable);
    if on_lru {
        lists.del(folio, nr);
    }
    change(on_lru);
    if on_lru {
        lists.add(folio, nr);
    }
}
