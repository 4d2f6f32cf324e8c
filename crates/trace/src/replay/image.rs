//! An exec image on replay: its mappings and present pages, and its main stack's growth
//! on faults below it (`crate::stack`).

use super::Replayer;
use crate::format::{Image, IMG_SHARED, IMG_SPECIAL};
use crate::stack::Stack;
use std::collections::HashSet;
use usermm::{Access, MmapArgs, Pid, Placement, Prot, Sharing};

/// A process's `[vdso]` (the executable special mapping of its image) and the pages it
/// faulted there. The engine maps the image's special mappings as anonymous memory, where a
/// read maps the zero page; 6.18 maps a vdso page through `vdso_fault` and `finish_fault`,
/// which counts it in `RssFile`, and fork copies none of them (the VMA has no `anon_vma`
/// and no `VM_PFNMAP`), so a child faults them again. Each replayed exit's RssFile adds
/// them: measured on 6.18, every exit of seven programs was 4 kB short of the host without
/// it (the one vdso page `ld.so` reads).
#[derive(Clone, Debug)]
pub(super) struct Vdso {
    start: u64,
    end: u64,
    pages: HashSet<u64>,
}

impl Vdso {
    fn new(start: u64, end: u64) -> Vdso {
        Vdso {
            start,
            end,
            pages: HashSet::new(),
        }
    }

    /// A fork child's: the same range, no page mapped.
    pub(super) fn forked(&self) -> Vdso {
        Vdso::new(self.start, self.end)
    }

    /// A recorded fault at `addr`.
    pub(super) fn fault(&mut self, addr: u64) {
        if (self.start..self.end).contains(&addr) {
            self.pages.insert(addr & !4095);
        }
    }

    /// What its mapped pages add to `RssFile` (kB).
    pub(super) fn rss_kb(&self) -> u64 {
        self.pages.len() as u64 * 4
    }
}

impl Replayer<'_, '_> {
    pub(super) fn image(&mut self, e: Pid, img: &Image) {
        for v in &img.vmas {
            if let Some(stack) = Stack::of(v) {
                self.stacks.insert(e, stack);
            }
            if v.flags & IMG_SPECIAL != 0 && v.prot & 4 != 0 {
                self.vdso.insert(e, Vdso::new(v.start, v.end));
            }
            let file = v
                .file
                .and_then(|f| self.files.get(&f).copied())
                .map(|f| (f, v.offset));
            let args = MmapArgs {
                // Saturating: a trace built in memory (not decoded) may hold any range.
                len: v.end.saturating_sub(v.start),
                prot: Prot::from_bits(v.prot as u32),
                sharing: if v.flags & IMG_SHARED != 0 {
                    Sharing::Shared
                } else {
                    Sharing::Private
                },
                placement: Placement::Fixed(v.start),
                populate: false,
                locked: false,
                noreserve: false,
                stack: false,
                file,
            };
            if self.cpu.mmap(e, args).is_err() {
                self.r.image_errors += 1;
            }
            self.ops.settle(self.m, "mmap");
        }
        // The pages present after exec are 4 KiB folios whatever the THP policy: exec copies
        // argv, envp and the auxiliary vector into a stack VMA that covers only them, and the
        // ELF loader's zeroing of the data page's tail is a file COW. Faulted under the
        // recorded policy instead, the first stack page of a 64K=always trace took a 64 KiB
        // folio whenever the stack's top was 64 KiB aligned (1 recording of sqlite in 7 on
        // 6.18: the exit of `sh` 52 kB over the host's RssAnon).
        let policy = self.m.tunables().thp;
        self.m.update_tunables(|t| {
            t.thp.top = usermm::ThpPolicy::Never;
            // Every anonymous folio size, 16K to 2M.
            for shift in 14..=21 {
                let _ = t.thp.set_size(1 << shift, usermm::ThpPolicy::Never);
            }
        });
        for &(a, write) in &img.pages {
            let acc = if write { Access::Write } else { Access::Read };
            self.r.image_pages += 1;
            if self.cpu.touch(e, a, 1, acc).is_err() {
                self.r.image_errors += 1;
            }
            self.ops.settle(self.m, "fault");
        }
        self.m.update_tunables(|t| t.thp = policy);
    }

    /// A fault below `e`'s main stack first grows the stack to the faulting page, when the
    /// kernel would (see the `stack` module), with the engine's `Cpu::expand_stack`.
    pub(super) fn grow_stack(&mut self, e: Pid, addr: u64) {
        let Some(stack) = self.stacks.get(&e).copied() else {
            return;
        };
        // Most faults are not below the stack; one too deep to grow to needs no lookup.
        if stack.growth(addr, 0, false).is_none() {
            return;
        }
        let Ok(maps) = self.cpu.maps(e) else { return };
        let prev = maps
            .iter()
            .filter(|v| v.start < stack.start)
            .max_by_key(|v| v.start);
        let (prev_end, accessible) = prev.map_or((0, false), |v| {
            (v.end, v.perms.bytes().take(3).any(|b| b != b'-'))
        });
        let Some((from, len)) = stack.growth(addr, prev_end, accessible) else {
            return;
        };
        let prot = Prot::from_bits(stack.prot as u32);
        if self.cpu.expand_stack(e, from, len, prot).is_ok() {
            if let Some(s) = self.stacks.get_mut(&e) {
                s.grown(from);
            }
        }
    }
}
