//! Memory accesses through the MMU: TLB, page-table walk, page fault.
//!
//! Linux counterpart: what the CPU does (x86 `page walk`, arm64 stage-1 translation with
//! hardware access/dirty management) plus `arch/x86/mm/fault.c` (`do_user_addr_fault`).
//! Every byte a scenario reads or writes goes through [`translate`]: a TLB hit uses the
//! cached frame; a miss walks the tables, sets the accessed/dirty bits like the hardware does,
//! and fills the TLB; a missing or insufficient entry raises a page fault.

use crate::fault::handle_mm_fault;
use crate::filemap::cache::folio_mark_accessed;
use crate::machine::Cpu;
use crate::mm::{Mm, MmState, Pid};
use crate::pgtable::{Access, AnyLeaf, PageTables, Walk};
use crate::phys::{PageFlag, Pfn};
use crate::stats::Ev;
use crate::tlb::TlbEntry;
use crate::vaddr::VirtAddr;
use crate::vm_fault::{FaultOutcome, FaultSource};

/// A signal delivered to the accessing process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Signal {
    /// Invalid access (no mapping, or against its protection).
    #[error("SIGSEGV at {0:#x}")]
    Segv(u64),
    /// The fault could not be satisfied (out of memory; the engine's policy).
    #[error("SIGBUS at {0:#x}")]
    Bus(u64),
    /// The process does not exist.
    #[error("no such process")]
    NoProcess,
}

/// What a walker does with the leaf it found.
enum LeafUse {
    /// Done: this frame.
    Take(Pfn),
    /// The entry changed under us: walk again without faulting.
    Rewalk,
    /// Not usable as it is: fault, then walk again.
    Fault,
}

/// A translated page: the frame and the leaf entry's location.
#[derive(Clone, Copy, Debug)]
struct Leaf {
    pfn: Pfn,
    table: Pfn,
    idx: usize,
    /// The entry as the walk read it: a PTE, or a PMD leaf (a PMD-mapped THP or the huge
    /// zero folio).
    entry: AnyLeaf,
}

impl<'m> Cpu<'m> {
    /// Fills `[addr, addr+len)` of process `pid` with `byte`.
    pub fn write_fill(&self, pid: Pid, addr: u64, len: u64, byte: u8) -> Result<(), Signal> {
        let arena = &self.m.phys.arena;
        with_mm(self, pid, |mm, st| {
            for_each_piece(self, mm, st, addr, len, Access::Write, |pfn, off, n, _| {
                arena.fill(pfn, off, n, byte)
            })
        })
    }

    /// Reads `out.len()` bytes at `addr` of process `pid`.
    pub fn read_bytes(&self, pid: Pid, addr: u64, out: &mut [u8]) -> Result<(), Signal> {
        let arena = &self.m.phys.arena;
        let len = out.len() as u64;
        with_mm(self, pid, |mm, st| {
            for_each_piece(
                self,
                mm,
                st,
                addr,
                len,
                Access::Read,
                |pfn, off, n, done| {
                    arena.read(pfn, off, &mut out[done as usize..done as usize + n])
                },
            )
        })
    }

    /// Reads `[addr, addr+len)` and returns the address of the first byte that differs from
    /// `byte`, if any.
    pub fn find_mismatch(
        &self,
        pid: Pid,
        addr: u64,
        len: u64,
        byte: u8,
    ) -> Result<Option<u64>, Signal> {
        let arena = &self.m.phys.arena;
        let mut first = None;
        with_mm(self, pid, |mm, st| {
            for_each_piece(
                self,
                mm,
                st,
                addr,
                len,
                Access::Read,
                |pfn, off, n, done| {
                    if first.is_none() {
                        first = arena
                            .first_mismatch(pfn, off, n, byte)
                            .map(|i| addr + done + i as u64);
                    }
                },
            )
        })?;
        Ok(first)
    }

    /// One access per page of `[addr, addr+len)`; a write access keeps the contents.
    pub fn touch(&self, pid: Pid, addr: u64, len: u64, access: Access) -> Result<(), Signal> {
        with_mm(self, pid, |mm, st| {
            let end = addr.checked_add(len).ok_or(Signal::Segv(addr))?;
            let mut a = addr;
            while a < end {
                translate(self, mm, st, a, access)?;
                a = (a & !4095) + 4096;
            }
            Ok(())
        })
    }
}

/// Translates the page containing `addr` for `access`, faulting as needed.
pub(crate) fn translate<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &MmState,
    addr: u64,
    access: Access,
) -> Result<Pfn, Signal> {
    translate_or_fault(cpu, mm, st, addr, access).map_err(|o| match o {
        FaultOutcome::Sigsegv => Signal::Segv(addr),
        _ => Signal::Bus(addr),
    })
}

/// [`translate`] telling why a fault failed (GUP maps the reasons to different
/// errnos): `Sigsegv`, `Oom` or `Sigbus` (also after 64 retries that did not settle).
pub(crate) fn translate_or_fault<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &MmState,
    addr: u64,
    access: Access,
) -> Result<Pfn, FaultOutcome> {
    // Checked before the TLB: an alias of a mapped address (a non-canonical x86-64
    // address, arm64 bits 55:48) would otherwise get a TLB entry of its own that no
    // flush of the real address reaches.
    let addr = cpu.m.arch.user_va(addr).ok_or(FaultOutcome::Sigsegv)?;
    let c = cpu.c();
    let vpn = addr >> 12;
    if let Some(e) = cpu.tlb().lookup(mm.id, vpn) {
        if access == Access::Read || e.writable {
            c.add(Ev::TlbHit, 1);
            if cpu.m.check_tlb() {
                check_tlb_entry(cpu, mm, addr, e, access);
            }
            return Ok(e.pfn);
        }
    }
    c.add(Ev::TlbMiss, 1);
    let pt = cpu.tables(mm);
    walk_or_fault(cpu, mm, st, addr, access, FaultSource::User, |leaf| {
        if !hw_permits(cpu, leaf.entry, access) {
            LeafUse::Fault
        } else {
            match hw_fill(cpu, mm, pt, leaf, vpn, access) {
                Some(pfn) => LeafUse::Take(pfn),
                None => LeafUse::Rewalk,
            }
        }
    })
}

/// The loop both the MMU and GUP run: walk to the leaf, let `judge` take it, walk again,
/// or fault (taken by `src`) and walk again. A page that keeps faulting after 64 rounds is
/// a SIGBUS (a livelock guard; Linux's callers retry without bound).
fn walk_or_fault<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &MmState,
    addr: u64,
    access: Access,
    src: FaultSource,
    mut judge: impl FnMut(Leaf) -> LeafUse,
) -> Result<Pfn, FaultOutcome> {
    let pt = cpu.tables(mm);
    for _ in 0..64 {
        match walk_leaf(cpu, pt, addr).map_or(LeafUse::Fault, &mut judge) {
            LeafUse::Take(pfn) => return Ok(pfn),
            LeafUse::Rewalk => continue,
            LeafUse::Fault => {
                match handle_mm_fault(cpu, mm, st, VirtAddr::new(addr), access, src) {
                    FaultOutcome::Completed => {}
                    failed => return Err(failed),
                }
            }
        }
    }
    Err(FaultOutcome::Sigbus)
}

/// `gup_fast` for one page: a present leaf that permits `access` gives its page (no
/// fault, no TLB fill, the entry's accessed and dirty bits left alone) and its folio is
/// marked referenced (`folio_set_referenced`, no LRU activation); anything else is
/// `None`, and the caller goes on with the slow path ([`gup_touch_page`]).
pub(crate) fn gup_fast_page<'m>(cpu: &Cpu<'m>, mm: &Mm, addr: u64, access: Access) -> Option<Pfn> {
    let pt = cpu.tables(mm);
    let addr = pt.arch.user_va(addr)?;
    let leaf = walk_leaf(cpu, pt, addr)?;
    if !(hw_permits(cpu, leaf.entry, access) && pt.arch.present(leaf.entry)) {
        return None;
    }
    let mem = &cpu.m.phys.memmap;
    mem.set(mem.folio_of(leaf.pfn), PageFlag::Referenced);
    Some(leaf.pfn)
}

/// GUP's slow path with FOLL_TOUCH (`follow_page_pte`), as the populate paths use it
/// (`populate_vma_page_range` for mlock and MAP_POPULATE, `faultin_page_range` for
/// MADV_POPULATE_*) and a pin past its fast part: a present entry that permits `access`
/// gives its page, anything else is faulted in first; then the folio of a PTE-mapped
/// page is marked accessed and, for a write through an entry that is not dirty, dirty
/// (`follow_huge_pmd` only makes a PMD young). Unlike an access by the MMU model, the
/// entry's accessed and dirty bits stay as they are and no TLB entry is filled. The shared
/// zero pages are left alone: their flags are machine-wide state on Linux, touched by every
/// process (measured on 6.18: the host's zero page's `referenced` flips between runs).
/// `src` says which caller's retry rules a fault follows.
pub(crate) fn gup_touch_page<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &MmState,
    addr: u64,
    access: Access,
    src: FaultSource,
) -> Result<Pfn, FaultOutcome> {
    let arch = cpu.tables(mm).arch;
    let addr = arch.user_va(addr).ok_or(FaultOutcome::Sigsegv)?;
    let (mut clean, mut pmd) = (false, false);
    let pfn = walk_or_fault(cpu, mm, st, addr, access, src, |leaf| {
        if hw_permits(cpu, leaf.entry, access) && arch.present(leaf.entry) {
            (clean, pmd) = (!arch.dirty(leaf.entry), leaf.entry.is_pmd());
            LeafUse::Take(leaf.pfn)
        } else {
            LeafUse::Fault
        }
    })?;
    // `__get_user_pages` steps over the rest of a PMD-mapped folio after one lookup.
    if !pmd || addr % crate::vaddr::PMD_SIZE == 0 {
        cpu.c().add(Ev::GupFollow, 1);
    }
    let phys = &cpu.m.phys;
    let head = phys.memmap.folio_of(pfn);
    // A PMD leaf is only made young (and dirty) by `touch_pmd`; its folio's flags stay.
    if phys.is_zero_pfn(pfn) || pmd {
        return Ok(pfn);
    }
    if access == Access::Write && clean {
        phys.memmap.set(head, PageFlag::Dirty);
    }
    folio_mark_accessed(cpu, head);
    Ok(pfn)
}

fn walk_leaf<'m>(cpu: &Cpu<'m>, pt: PageTables<'m>, addr: u64) -> Option<Leaf> {
    let c = cpu.c();
    match pt.walk(VirtAddr::new(addr)) {
        Walk::Pte { table, idx, entry } if !entry.is_none() => {
            c.add(Ev::PteRead, 1);
            Some(Leaf {
                pfn: pt.arch.pfn(entry),
                table,
                idx,
                entry: AnyLeaf::Pte(entry),
            })
        }
        Walk::PmdLeaf { table, idx, entry } => {
            let pfn = pt.arch.pfn(entry).add((addr >> 12) & 511);
            Some(Leaf {
                pfn,
                table,
                idx,
                entry: AnyLeaf::Pmd(entry),
            })
        }
        _ => None,
    }
}

fn hw_permits<'m>(cpu: &Cpu<'m>, e: AnyLeaf, access: Access) -> bool {
    let a = cpu.m.arch;
    match access {
        Access::Read => a.hw_user_readable(e),
        Access::Write => a.hw_user_readable(e) && a.hw_writable(e),
    }
}

/// Sets accessed/dirty like the hardware walker and caches the translation.
fn hw_fill<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    pt: PageTables<'m>,
    leaf: Leaf,
    vpn: u64,
    access: Access,
) -> Option<Pfn> {
    let write = access == Access::Write;
    let mut cur = leaf.entry;
    loop {
        let new = pt.arch.hw_access(cur, access);
        if new == cur || pt.cmpxchg(leaf.table, leaf.idx, cur, new) {
            break;
        }
        cur = pt.reread(leaf.table, leaf.idx, cur);
        if !hw_permits(cpu, cur, access) {
            break;
        }
    }
    let writable = write || (pt.arch.hw_writable(cur) && pt.arch.dirty(cur));
    cpu.tlb().fill(TlbEntry {
        mm: mm.id,
        vpn,
        pfn: leaf.pfn,
        writable,
    });
    // The walk and the fill are two steps: if the entry changed meanwhile (a COW on
    // another CPU whose shootdown may already have passed), drop what we cached and walk
    // again, as a hardware walker's atomic fill would never have cached it.
    let now = pt.reread(leaf.table, leaf.idx, cur);
    if now != cur && (pt.arch.pfn(now) != pt.arch.pfn(cur) || !hw_permits(cpu, now, access)) {
        cpu.tlb().invalidate(mm.id, vpn, vpn + 1);
        return None;
    }
    if !hw_permits(cpu, cur, access) {
        cpu.tlb().invalidate(mm.id, vpn, vpn + 1);
        return None;
    }
    Some(leaf.pfn)
}

/// Verifies a TLB hit against the page table; a mismatch means a flush was missed.
fn check_tlb_entry<'m>(cpu: &Cpu<'m>, mm: &Mm, addr: u64, e: TlbEntry, access: Access) {
    let pt = cpu.tables(mm);
    let ok = match walk_leaf(cpu, pt, addr) {
        Some(leaf) => leaf.pfn == e.pfn && hw_permits(cpu, leaf.entry, access),
        None => false,
    };
    if !ok {
        cpu.c().add(Ev::TlbStaleHit, 1);
    }
}

fn with_mm<'m, T>(
    cpu: &Cpu<'m>,
    pid: Pid,
    f: impl FnOnce(&Mm, &MmState) -> Result<T, Signal>,
) -> Result<T, Signal> {
    let task = cpu.m.task(pid).map_err(|_| Signal::NoProcess)?;
    cpu.c().add(Ev::LockMmap, 1);
    let st = task.mm.lock.read();
    f(&task.mm, &st)
}

/// Calls `f(pfn, offset_in_page, len)` for each page piece of `[addr, addr+len)`.
fn for_each_piece<'m>(
    cpu: &Cpu<'m>,
    mm: &Mm,
    st: &MmState,
    addr: u64,
    len: u64,
    access: Access,
    mut f: impl FnMut(Pfn, usize, usize, u64),
) -> Result<(), Signal> {
    let end = addr.checked_add(len).ok_or(Signal::Segv(addr))?;
    let c = cpu.c();
    let warmed = || c.read(Ev::PagesZeroed) + c.read(Ev::PagesCopied);
    let mut a = addr;
    while a < end {
        let n = (4096 - (a & 4095)).min(end - a);
        let before = (access == Access::Write).then(warmed);
        let pfn = translate(cpu, mm, st, a, access)?;
        if before.is_some_and(|b| warmed() == b) {
            c.add(Ev::UserBytesCold, n);
        }
        f(pfn, (a & 4095) as usize, n as usize, a - addr);
        a += n;
    }
    Ok(())
}
