//! `mmap` of anonymous memory, and `get_unmapped_area`.
//!
//! Linux counterparts: `mm/mmap.c` (`do_mmap`, `__get_unmapped_area`,
//! `generic_get_unmapped_area_topdown`, `round_hint_to_min`), `mm/vma.c` (`mmap_region`),
//! `mm/huge_memory.c` (`thp_get_unmapped_area_vmflags`), `mm/util.c` (`__vm_enough_memory`).

use super::{aligned, page_align};
use crate::access::gup_touch_page;
use crate::errno::{Errno, SysResult};
use crate::filemap::{Inode, InodeKind};
use crate::machine::{Cpu, MMAP_MIN_ADDR};
use crate::mm::{Mm, MmState, Pid, Privilege, Task};
use crate::ops::munmap::{do_munmap, split_range_edges};
use crate::ops::{vm_enough_memory, vm_unacct};
use crate::pgtable::{Access, Prot, PMD_SIZE, TASK_SIZE};
use crate::vm_fault::FaultSource;
use crate::vma::merge::{self, Proposal};
use crate::vma::{AnonLink, VmFlags};
use std::sync::Arc;

/// Private or shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// `MAP_PRIVATE`.
    Private,
    /// `MAP_SHARED`.
    Shared,
}

/// Where to place the mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The kernel chooses.
    Any,
    /// A hint the kernel uses if the range is free.
    Hint(u64),
    /// `MAP_FIXED`: replace whatever is there.
    Fixed(u64),
    /// `MAP_FIXED_NOREPLACE`: exactly there, or `EEXIST`.
    FixedNoReplace(u64),
}

/// The `flags` word of Linux's `mmap` (`MAP_*`, the same bits on x86-64 and arm64:
/// `uapi/linux/mman.h`, `uapi/asm-generic/mman-common.h`, `mman.h`), for a caller that holds
/// the raw word, as a recorded trace does; the engine's own calls take [`MmapArgs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapFlags(pub u32);

impl MapFlags {
    /// `MAP_PRIVATE` (the low bits: `MAP_SHARED` is 1, `MAP_SHARED_VALIDATE` 3).
    pub const PRIVATE: u32 = 0x02;
    /// `MAP_FIXED`.
    pub const FIXED: u32 = 0x10;
    /// `MAP_ANONYMOUS`.
    pub const ANONYMOUS: u32 = 0x20;
    /// `MAP_LOCKED`.
    pub const LOCKED: u32 = 0x2000;
    /// `MAP_NORESERVE`.
    pub const NORESERVE: u32 = 0x4000;
    /// `MAP_POPULATE`.
    pub const POPULATE: u32 = 0x8000;
    /// `MAP_STACK`.
    pub const STACK: u32 = 0x20000;
    /// `MAP_HUGETLB`.
    pub const HUGETLB: u32 = 0x40000;
    /// `MAP_FIXED_NOREPLACE`.
    pub const FIXED_NOREPLACE: u32 = 0x100000;

    fn has(self, bit: u32) -> bool {
        self.0 & bit != 0
    }

    /// Private for `MAP_PRIVATE`, shared for `MAP_SHARED` and `MAP_SHARED_VALIDATE`.
    pub fn sharing(self) -> Sharing {
        if self.0 & 3 == Self::PRIVATE {
            Sharing::Private
        } else {
            Sharing::Shared
        }
    }

    /// `MAP_ANONYMOUS`.
    pub fn anonymous(self) -> bool {
        self.has(Self::ANONYMOUS)
    }

    /// `MAP_HUGETLB` (the engine has no hugetlbfs).
    pub fn hugetlb(self) -> bool {
        self.has(Self::HUGETLB)
    }

    /// `MAP_POPULATE`.
    pub fn populate(self) -> bool {
        self.has(Self::POPULATE)
    }

    /// `MAP_LOCKED`.
    pub fn locked(self) -> bool {
        self.has(Self::LOCKED)
    }

    /// `MAP_NORESERVE`.
    pub fn noreserve(self) -> bool {
        self.has(Self::NORESERVE)
    }

    /// `MAP_STACK`.
    pub fn stack(self) -> bool {
        self.has(Self::STACK)
    }

    /// Where a call with these flags and address argument asks to map: `MAP_FIXED_NOREPLACE`
    /// before `MAP_FIXED` (the kernel's order), a non-zero address without either a hint.
    pub fn placement(self, addr: u64) -> Placement {
        if self.has(Self::FIXED_NOREPLACE) {
            Placement::FixedNoReplace(addr)
        } else if self.has(Self::FIXED) {
            Placement::Fixed(addr)
        } else if addr != 0 {
            Placement::Hint(addr)
        } else {
            Placement::Any
        }
    }
}

/// Arguments of an anonymous `mmap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmapArgs {
    /// Length in bytes.
    pub len: u64,
    /// Protection.
    pub prot: Prot,
    /// Private or shared.
    pub sharing: Sharing,
    /// Placement.
    pub placement: Placement,
    /// `MAP_POPULATE`.
    pub populate: bool,
    /// `MAP_LOCKED`.
    pub locked: bool,
    /// `MAP_NORESERVE`.
    pub noreserve: bool,
    /// `MAP_STACK`: since 6.7 the VMA is `VM_NOHUGEPAGE` (`calc_vm_flag_bits`), so glibc's
    /// thread stacks never take a large folio whatever the THP policy.
    pub stack: bool,
    /// A file (an open file of the machine) and the byte offset of the mapping in it;
    /// `None` for `MAP_ANONYMOUS`.
    pub file: Option<(crate::machine::FileId, u64)>,
}

impl MmapArgs {
    /// A private anonymous mapping anywhere.
    pub fn anon(len: u64, prot: Prot) -> MmapArgs {
        MmapArgs {
            len,
            prot,
            sharing: Sharing::Private,
            placement: Placement::Any,
            populate: false,
            locked: false,
            noreserve: false,
            stack: false,
            file: None,
        }
    }
}

/// `calc_vm_prot_bits` plus the MAY bits every anonymous mapping gets.
pub(crate) fn prot_flags(prot: Prot) -> u64 {
    let mut f = 0;
    if prot.read {
        f |= VmFlags::READ;
    }
    if prot.write {
        f |= VmFlags::WRITE;
    }
    if prot.exec {
        f |= VmFlags::EXEC;
    }
    f
}

/// What `get_unmapped_area` may do with the address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AreaRequest {
    /// Exactly this address.
    Fixed(u64),
    /// Try this hint, else search (0 = no hint).
    Hint(u64),
}

impl<'m> Cpu<'m> {
    /// Maps anonymous memory into process `pid`.
    ///
    /// # Errors
    /// `EINVAL` (zero length, unaligned fixed address), `ENOMEM` (overflow, map count, no
    /// space, overcommit), `EPERM` (below `mmap_min_addr`), `EEXIST` (noreplace overlap),
    /// `EAGAIN` (locked beyond RLIMIT_MEMLOCK).
    pub fn mmap(&self, pid: Pid, args: MmapArgs) -> SysResult<u64> {
        self.c().add(crate::stats::Ev::Syscall, 1);
        let task = self.m.task(pid)?;
        let mm = &task.mm;
        self.c().add(crate::stats::Ev::LockMmap, 1);
        let mut st = mm.lock.write();
        let (addr, flags) = do_mmap(self, &task, &mut st, args)?;
        let want_populate =
            args.populate || (flags.has(VmFlags::LOCKED) && !flags.has(VmFlags::LOCKONFAULT));
        drop(st);
        if want_populate {
            populate(
                self,
                mm,
                addr,
                addr + page_align(args.len).unwrap_or(0),
                flags,
            );
        }
        Ok(addr)
    }

    /// The main stack's growth on a fault below it (`expand_downwards`, reached from the
    /// fault path: no system call is counted): maps `[from, from + len)` private anonymous
    /// with `prot`, fixed, just below the stack, whose VMA it merges into. The engine has no
    /// `VM_GROWSDOWN`; the caller that models a stack (the replay, `trace::stack`) decides
    /// when and by how much. Nothing is populated: the fault that grew the stack maps its
    /// page.
    pub fn expand_stack(&self, pid: Pid, from: u64, len: u64, prot: Prot) -> SysResult<()> {
        let task = self.m.task(pid)?;
        self.c().add(crate::stats::Ev::LockMmap, 1);
        let mut st = task.mm.lock.write();
        let args = MmapArgs {
            placement: Placement::Fixed(from),
            ..MmapArgs::anon(len, prot)
        };
        do_mmap(self, &task, &mut st, args).map(|_| ())
    }
}

fn do_mmap<'m>(
    cpu: &Cpu<'m>,
    task: &Task,
    st: &mut MmState,
    args: MmapArgs,
) -> SysResult<(u64, VmFlags)> {
    let file = match args.file {
        None => None,
        Some((f, offset)) => {
            let inode = cpu.m.file(f)?;
            if offset % 4096 != 0 {
                return Err(Errno::EINVAL);
            }
            Some((inode, offset >> 12))
        }
    };
    if args.len == 0 {
        return Err(Errno::EINVAL);
    }
    if let Some((_, pgoff)) = &file {
        // `do_mmap`'s offset checks: the page range must not wrap, and must fit below
        // MAX_LFS_FILESIZE (`file_mmap_ok`).
        let pages = page_align(args.len).ok_or(Errno::ENOMEM)? >> 12;
        if pgoff.checked_add(pages).is_none() {
            return Err(Errno::EOVERFLOW);
        }
        let max = (i64::MAX as u64).checked_sub(pages << 12);
        if max.is_none_or(|max| *pgoff > max >> 12) {
            return Err(Errno::EOVERFLOW);
        }
    }
    let req = match args.placement {
        Placement::Any => AreaRequest::Hint(0),
        Placement::Hint(h) => AreaRequest::Hint(round_hint_to_min(h)),
        Placement::Fixed(a) | Placement::FixedNoReplace(a) => AreaRequest::Fixed(a),
    };
    let len = page_align(args.len)
        .filter(|&l| l != 0)
        .ok_or(Errno::ENOMEM)?;
    let max = cpu.m.tunables().max_map_count;
    if st.vmas.count() as u64 > max {
        return Err(Errno::ENOMEM);
    }
    let thp_align = args.sharing == Sharing::Private
        && file.is_none()
        && req == AreaRequest::Hint(0)
        && len % PMD_SIZE == 0;
    let addr = get_unmapped_area(task, st, req, len, thp_align)?;
    if matches!(args.placement, Placement::FixedNoReplace(_))
        && !st.vmas.overlapping(addr, addr + len).is_empty()
    {
        return Err(Errno::EEXIST);
    }
    let mut flags = prot_flags(args.prot)
        | VmFlags::MAYREAD
        | VmFlags::MAYWRITE
        | VmFlags::MAYEXEC
        | st.def_flags;
    if args.locked {
        // MAP_LOCKED needs `can_do_mlock` first: EPERM with RLIMIT_MEMLOCK 0 (6.18).
        if !super::mlock::can_do_mlock(task) {
            return Err(Errno::EPERM);
        }
        flags |= VmFlags::LOCKED;
    }
    if flags & VmFlags::LOCKED != 0 {
        mlock_future_ok(task, st, len)?;
    }
    if args.sharing == Sharing::Shared {
        flags |= VmFlags::SHARED | VmFlags::MAYSHARE;
    }
    if args.noreserve && cpu.m.tunables().overcommit_memory != 2 {
        flags |= VmFlags::NORESERVE;
    }
    if args.stack {
        flags |= VmFlags::NOHUGEPAGE;
    }
    let accountable =
        args.sharing == Sharing::Private && args.prot.write && flags & VmFlags::NORESERVE == 0;
    if let AreaRequest::Fixed(_) = req {
        if accountable {
            // `__mmap_prepare` charges the new pages less those of the accounted VMAs it
            // replaces before anything is unmapped; a failed charge leaves the old VMAs
            // and their pages, only split at the range's edges (measured on 6.18: a
            // failed 1024G MAP_FIXED over the tail of a VMA keeps its data).
            let old: u64 = st
                .vmas
                .overlapping(addr, addr + len)
                .into_iter()
                .map(|id| st.vmas.get(id))
                .filter(|v| v.flags.has(VmFlags::ACCOUNT))
                .map(|v| (v.end.min(addr + len) - v.start.max(addr)) >> 12)
                .sum();
            let new = (len >> 12).saturating_sub(old);
            if let Err(e) = vm_enough_memory(cpu, new) {
                split_range_edges(cpu, st, addr, addr + len)?;
                return Err(e);
            }
            // Charged for real below, once the old VMAs' charge is given back.
            vm_unacct(cpu, new);
        }
        do_munmap(cpu, &task.mm, st, addr, addr + len)?;
    }
    if accountable {
        vm_enough_memory(cpu, len >> 12)?;
        flags |= VmFlags::ACCOUNT;
    }
    let flags = VmFlags(flags | VmFlags::SOFTDIRTY);
    let res = insert_mapping(cpu, st, addr, len, flags, args.sharing, file);
    if res.is_err() && accountable {
        vm_unacct(cpu, len >> 12);
    }
    res?;
    if flags.has(VmFlags::LOCKED) {
        st.locked_vm += len >> 12;
    }
    Ok((addr, flags))
}

fn insert_mapping<'m>(
    cpu: &Cpu<'m>,
    st: &mut MmState,
    addr: u64,
    len: u64,
    flags: VmFlags,
    sharing: Sharing,
    file: Option<(Arc<Inode>, u64)>,
) -> SysResult<()> {
    // A shared anonymous mapping gets a shmem object of its own (`shmem_zero_setup`),
    // created with one user that the new VMA replaces.
    let anon_shmem = file.is_none() && sharing == Sharing::Shared;
    let (file, pgoff) = match file {
        Some((f, pgoff)) => (Some(f), pgoff),
        None if anon_shmem => {
            let id = cpu.m.alloc_shmem_id();
            (Some(Arc::new(Inode::new(id, InodeKind::ShmemAnon, len))), 0)
        }
        None => (None, addr >> 12),
    };
    let p = Proposal {
        start: addr,
        end: addr + len,
        flags,
        pgoff,
        anon_vma: AnonLink::default(),
        file: file.as_ref(),
    };
    merge::insert_new(&mut st.vmas, cpu.c(), p)?;
    if let (Some(s), true) = (&file, anon_shmem) {
        s.put();
    }
    Ok(())
}

/// `mlock_future_ok`: may `len` more bytes be locked?
pub(crate) fn mlock_future_ok(task: &Task, st: &MmState, len: u64) -> SysResult<()> {
    if task.privilege == Privilege::Privileged {
        return Ok(());
    }
    let limit = task.rlimit_memlock >> 12;
    if st.locked_vm + (len >> 12) > limit {
        return Err(Errno::EAGAIN);
    }
    Ok(())
}

/// Faults in `[start, end)` as `populate_vma_page_range` does: writes for private
/// writable mappings, reads otherwise. Failures are ignored, as in Linux.
pub(crate) fn populate<'m>(cpu: &Cpu<'m>, mm: &Mm, start: u64, end: u64, flags: VmFlags) {
    let access = if flags.0 & (VmFlags::WRITE | VmFlags::SHARED) == VmFlags::WRITE {
        Access::Write
    } else {
        Access::Read
    };
    let st = mm.lock.read();
    let mut a = start;
    while a < end {
        match st.vmas.find(a) {
            // `populate_vma_page_range` does nothing for LOCKONFAULT VMAs, whoever asks.
            Some(id)
                if st.vmas.get(id).flags.has(VmFlags::READ | VmFlags::WRITE)
                    && !st.vmas.get(id).flags.has(VmFlags::LOCKONFAULT) =>
            {
                let _ = gup_touch_page(cpu, mm, &st, a, access, FaultSource::Populate);
            }
            _ => {}
        }
        a += 4096;
    }
}

/// Chooses an address for `len` bytes (`__get_unmapped_area`).
pub(crate) fn get_unmapped_area(
    task: &Task,
    st: &MmState,
    req: AreaRequest,
    len: u64,
    thp_align: bool,
) -> SysResult<u64> {
    if len > TASK_SIZE - MMAP_MIN_ADDR {
        return Err(Errno::ENOMEM);
    }
    let addr = match req {
        AreaRequest::Fixed(a) => {
            if a > TASK_SIZE - len {
                return Err(Errno::ENOMEM);
            }
            if !aligned(a) {
                return Err(Errno::EINVAL);
            }
            a
        }
        AreaRequest::Hint(h) => search_area(st, h, len, thp_align)?,
    };
    if addr < MMAP_MIN_ADDR && task.privilege != Privilege::Privileged {
        return Err(Errno::EPERM);
    }
    Ok(addr)
}

fn search_area(st: &MmState, hint: u64, len: u64, thp_align: bool) -> SysResult<u64> {
    if hint != 0 {
        let h = page_align(hint).unwrap_or(0);
        if h != 0 && h <= TASK_SIZE - len && st.vmas.overlapping(h, h + len).is_empty() {
            return Ok(h);
        }
    }
    let low = MMAP_MIN_ADDR.max(4096);
    if thp_align {
        if let Some((_, gap_end)) = st
            .vmas
            .tree
            .empty_area_rev(low, st.mmap_base, len + PMD_SIZE)
        {
            return Ok((gap_end - len) & !(PMD_SIZE - 1));
        }
    }
    if let Some((_, gap_end)) = st.vmas.tree.empty_area_rev(low, st.mmap_base, len) {
        return Ok(gap_end - len);
    }
    st.vmas
        .tree
        .empty_area(st.mmap_base, TASK_SIZE, len)
        .ok_or(Errno::ENOMEM)
}

/// `round_hint_to_min`: hints below `mmap_min_addr` are raised to it.
fn round_hint_to_min(hint: u64) -> u64 {
    // The hint is masked to its page (rounded down; checked on 6.18: 0x7e0000000800 gives
    // 0x7e0000000000), then raised to mmap_min_addr.
    let h = hint & !4095;
    if h != 0 && h < MMAP_MIN_ADDR {
        MMAP_MIN_ADDR
    } else {
        h
    }
}
