//! The replay's budget: what each event may make the engine populate, copy or walk,
//! charged before it runs against [`Budget`]'s bounds, so a hostile trace cannot make the
//! replay exhaust the host.

use super::*;

/// End of the user address space the replay's machine has (x86-64, 47 bits).
const USER_END: u64 = 1 << 47;
/// Bytes charged for a new engine process (its page-table root, mm and bookkeeping).
const PROCESS_COST: u64 = 64 << 10;
/// Bytes charged for a page (a fault, an exec-image page or mapping).
const PAGE_COST: u64 = 4096;

impl Replayer<'_, '_> {
    /// What `ev` can make the engine populate or copy, charged before it runs (see
    /// [`Budget::max_touch`]). Conservative where the engine's state decides: a process that
    /// ever locked memory is charged the full length of its later mappings, growths and
    /// protection changes (with `VM_LOCKED` or `MCL_FUTURE` each of them may populate).
    fn cost(&self, ev: &Event) -> u64 {
        let engine = |pid: u32| self.procs.get(&pid).copied();
        let locked = |pid: u32| engine(pid).is_some_and(|e| self.locked.contains(&e));
        let status = |pid: u32| engine(pid).and_then(|e| self.cpu.status(e).ok());
        match *ev {
            Event::Spawn { .. } => PROCESS_COST,
            Event::Fork { parent, flags, .. } if flags & FORK_SHARES_VM == 0 => {
                // The child's page tables copy every present entry of the parent's, and its
                // VMA tree every VMA.
                PROCESS_COST.saturating_add(status(parent).map_or(0, |s| {
                    s.vm_rss
                        .saturating_add(s.map_count.saturating_mul(PAGE_COST))
                }))
            }
            Event::File { .. } => PAGE_COST,
            Event::Cache { ref folios, .. } => folios
                .iter()
                .fold(0u64, |a, f| a.saturating_add(1 << f.order))
                .saturating_mul(PAGE_COST),
            Event::Exec { ref image, .. } => PROCESS_COST.saturating_add(
                (image.vmas.len() as u64)
                    .saturating_add(image.pages.len() as u64)
                    .saturating_mul(PAGE_COST),
            ),
            Event::Fault { .. } => PAGE_COST,
            Event::Mmap {
                pid, len, flags, ..
            } if MapFlags(flags).populate() || MapFlags(flags).locked() || locked(pid) => {
                page_up(len)
            }
            Event::Mremap {
                pid,
                old_len,
                new_len,
                ..
            } if locked(pid) => page_up(new_len).saturating_sub(page_up(old_len)),
            Event::Mprotect { pid, len, .. } if locked(pid) => page_up(len),
            Event::Brk { pid, ret, .. } if locked(pid) && ret >= 0 => {
                let old = engine(pid).and_then(|e| self.brk.get(&e).copied());
                old.map_or(0, |o| page_up(ret as u64).saturating_sub(page_up(o)))
            }
            // WILLNEED reads a file range ahead, POPULATE_(READ|WRITE) fault it in.
            Event::Madvise { len, advice, .. }
                if matches!(
                    Advice::from_number(i64::from(advice)),
                    Some(Advice::WillNeed | Advice::PopulateRead | Advice::PopulateWrite)
                ) =>
            {
                page_up(len)
            }
            Event::Mlock { len, flags, .. } if flags & MLOCK_ONFAULT == 0 => page_up(len),
            Event::Mlockall { pid, flags, .. }
                if MlockallFlags::from_bits(flags).current
                    && !MlockallFlags::from_bits(flags).onfault =>
            {
                status(pid).map_or(0, |s| s.vm_size)
            }
            _ => 0,
        }
    }

    /// The bytes of present memory and VMAs a call that works on a range may walk, charged
    /// before it runs (see [`Budget::max_walk`]): the range itself when it is at most 2 MiB,
    /// otherwise a page per present page in it (the engine's page-table walk, which skips
    /// empty tables as the call does) and a page per VMA of the process (`status`, which
    /// counts them, walks them all).
    fn walk_cost(&self, ev: &Event) -> u64 {
        const SMALL: u64 = 2 << 20;
        let engine = |pid: u32| self.procs.get(&pid).copied();
        let whole = |pid: u32| {
            engine(pid)
                .and_then(|e| self.cpu.status(e).ok())
                .map_or(0, |s| {
                    s.vm_rss
                        .saturating_add(s.map_count.saturating_mul(PAGE_COST))
                })
        };
        let range = |pid: u32, addr: u64, len: u64| {
            let len = page_up(len);
            if len <= SMALL {
                return len;
            }
            let Some(e) = engine(pid) else { return 0 };
            let vmas = self.cpu.status(e).map_or(0, |s| s.map_count);
            // Only user addresses have page tables to walk.
            let (start, end) = (addr.min(USER_END), addr.saturating_add(len).min(USER_END));
            let present = if start < end {
                self.cpu
                    .present_pages(e, start, end)
                    .map_or(0, |p| p.len() as u64)
            } else {
                0
            };
            present.saturating_add(vmas).saturating_mul(PAGE_COST)
        };
        match *ev {
            // An mmap is placed MAP_FIXED at the host's address: it unmaps what was there.
            Event::Mmap {
                pid,
                addr,
                len,
                ret,
                ..
            } => range(pid, if ret >= 0 { ret as u64 } else { addr }, len),
            Event::Munmap { pid, addr, len, .. }
            | Event::Mprotect { pid, addr, len, .. }
            | Event::Madvise { pid, addr, len, .. }
            | Event::Mlock { pid, addr, len, .. }
            | Event::Munlock { pid, addr, len, .. } => range(pid, addr, len),
            Event::Mremap {
                pid,
                addr,
                old_len,
                new_len,
                ret,
                ..
            } => {
                // The pages moved, and whatever a move to a new place unmaps there.
                let to = if ret >= 0 && ret as u64 != addr {
                    range(pid, ret as u64, new_len)
                } else {
                    0
                };
                range(pid, addr, old_len).saturating_add(to)
            }
            Event::Brk { pid, ret, .. } if ret >= 0 => {
                let old = engine(pid).and_then(|e| self.brk.get(&e).copied());
                old.map_or(0, |o| {
                    let (o, n) = (page_up(o), page_up(ret as u64));
                    range(pid, o.min(n), o.abs_diff(n))
                })
            }
            Event::Mlockall { pid, .. } | Event::Munlockall { pid, .. } => whole(pid),
            // Reading `status` walks every VMA.
            Event::Validate { pid, .. } => engine(pid)
                .and_then(|e| self.cpu.status(e).ok())
                .map_or(0, |s| s.map_count.saturating_mul(PAGE_COST)),
            _ => 0,
        }
    }

    /// Charges `ev`, or says why it is over the budget.
    pub(super) fn charge(&mut self, ev: &Event) -> Result<(), String> {
        let walk = self.walk_cost(ev);
        let max = self.budget.max_walk;
        if walk > max.saturating_sub(self.walked) {
            return Err(format!(
                "{} may walk {walk} bytes of present memory and VMAs; {} of the budget of \
                 {max} are spent (--max-walk)",
                ev.kind(),
                self.walked
            ));
        }
        self.walked += walk;
        let cost = self.cost(ev);
        let max = self.budget.max_touch;
        if cost > max.saturating_sub(self.touched) {
            return Err(format!(
                "{} asks the engine to make {cost} bytes present; {} of the budget of {max} \
                 are spent (--max-touch)",
                ev.kind(),
                self.touched
            ));
        }
        self.touched += cost;
        Ok(())
    }

    /// After an event: the engine's frames in use stay within the budget.
    pub(super) fn resident(&self, ev: &Event) -> Result<(), String> {
        let used = self.m.phys.allocated_frames().saturating_mul(PAGE_COST);
        let max = self.budget.max_touch;
        if used > max {
            return Err(format!(
                "after this {} the engine holds {used} bytes of frames, over the budget of \
                 {max} (--max-touch)",
                ev.kind()
            ));
        }
        Ok(())
    }
}
