//! System calls of the address space, one file per call.
//!
//! Linux counterparts are named in each file. Every call returns `Result<_, Errno>` with the
//! errno Linux returns, checked in Linux's order, and leaves nothing half-changed except where
//! Linux itself applies a call partially (mprotect and madvise over holes).
use crate::errno::{Errno, SysResult};
use crate::machine::Cpu;

pub(crate) mod brk;
pub(crate) mod exit;
pub(crate) mod file;
pub(crate) mod fork;
pub(crate) mod madvise;
pub(crate) mod mlock;
pub(crate) mod mmap;
pub(crate) mod mprotect;
pub(crate) mod mremap;
pub(crate) mod munmap;
pub(crate) mod pin;

/// Page-aligns a length; `None` on overflow.
pub(crate) fn page_align(len: u64) -> Option<u64> {
    len.checked_add(4095).map(|v| v & !4095)
}

/// Whether `[start, start+len)` lies inside the user address space, as `do_vmi_munmap`
/// requires (`start > TASK_SIZE || len > TASK_SIZE - start` is `EINVAL`). Written without
/// the sum so that a huge `len` cannot wrap around to a small end.
pub(crate) fn user_range_ok(start: u64, len: u64) -> bool {
    start <= crate::pgtable::TASK_SIZE && len <= crate::pgtable::TASK_SIZE - start
}

/// Whether an address is page aligned.
pub(crate) fn aligned(addr: u64) -> bool {
    addr & 4095 == 0
}

/// Overcommit check and charge (`__vm_enough_memory`).
pub(crate) fn vm_enough_memory<'m>(cpu: &Cpu<'m>, pages: u64) -> SysResult<()> {
    let t = cpu.m.tunables();
    let total = cpu.m.phys.nr_frames();
    // Swap counts as memory (`total_swap_pages`) in both heuristics.
    let swap = cpu.m.swap.as_ref().map_or(0, |s| s.pages());
    let ok = match t.overcommit_memory {
        1 => true,
        2 => {
            let limit = total / 2 + swap;
            let committed = cpu
                .m
                .committed
                .load(std::sync::atomic::Ordering::Relaxed)
                .max(0) as u64;
            committed + pages <= limit
        }
        _ => pages <= total + swap,
    };
    if !ok {
        return Err(Errno::ENOMEM);
    }
    cpu.m
        .committed
        .fetch_add(pages as i64, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// Returns an overcommit charge.
pub(crate) fn vm_unacct<'m>(cpu: &Cpu<'m>, pages: u64) {
    cpu.m
        .committed
        .fetch_sub(pages as i64, std::sync::atomic::Ordering::Relaxed);
}
