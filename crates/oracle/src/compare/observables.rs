//! What the oracle compares after each statement, and what it leaves out and why
//! (`usermm oracle --observables`).

use super::pages::{SAMPLE_ALL_PAGES, SAMPLE_STRIDE};
use super::{smaps_fields, STATUS_FIELDS};
use scenario::backend::SmapsView;
use scenario::{Keyword, KpageFlag};

/// The kpageflags bits compared for every sampled present page (with the exceptions of
/// [`AGING_FLAGS`]). Bits that are always clear for a user page (`slab`, `buddy`, `pgtable`,
/// …) are compared too: a stray one is a bug on either side.
pub const COMPARED_FLAGS: [KpageFlag; 28] = [
    KpageFlag::Locked,
    KpageFlag::Error,
    KpageFlag::Referenced,
    KpageFlag::Uptodate,
    KpageFlag::Dirty,
    KpageFlag::Lru,
    KpageFlag::Active,
    KpageFlag::Slab,
    KpageFlag::Writeback,
    KpageFlag::Reclaim,
    KpageFlag::Buddy,
    KpageFlag::Mmap,
    KpageFlag::Anon,
    KpageFlag::Swapcache,
    KpageFlag::Swapbacked,
    KpageFlag::CompoundHead,
    KpageFlag::CompoundTail,
    KpageFlag::Huge,
    KpageFlag::Unevictable,
    KpageFlag::Hwpoison,
    KpageFlag::Nopage,
    KpageFlag::Ksm,
    KpageFlag::Thp,
    KpageFlag::Offline,
    KpageFlag::ZeroPage,
    KpageFlag::Pgtable,
    KpageFlag::Reserved,
    KpageFlag::Mlocked,
];

/// The kpageflags bits never compared, and why (measured on 6.18; `usermm oracle
/// --observables` prints this list).
pub const UNCOMPARED_FLAGS: [(KpageFlag, &str); 9] = [
    (
        KpageFlag::Idle,
        "page-idle tracking state (PG_idle): set by whoever writes /sys/kernel/mm/page_idle; \
         the tail pages of a large folio read the tail's own flag word",
    ),
    (
        KpageFlag::Mappedtodisk,
        "on anonymous pages the bit is PG_anon_exclusive, kept per page only for PTE-mapped \
         folios (exclusivity is compared through pagemap's exclusive bit instead)",
    ),
    (
        KpageFlag::Private,
        "file-system private data (ext4 buffer heads): not modelled",
    ),
    (
        KpageFlag::Private2,
        "file-system private data: not modelled",
    ),
    (
        KpageFlag::OwnerPrivate,
        "owner-private flag of the page's owner: not modelled",
    ),
    (
        KpageFlag::Arch,
        "architecture flag (PG_arch_1: icache state): not modelled",
    ),
    (KpageFlag::Uncached, "architecture flag: not modelled"),
    (KpageFlag::Softdirty, "soft-dirty tracking: not modelled"),
    (KpageFlag::Arch2, "architecture flag: not modelled"),
];

/// Bits of the LRU's aging state, compared on anonymous pages only. On page-cache pages
/// (tmpfs, shared anonymous memory, disk files) and the shared zero pages they follow what
/// the engine does not model page-exactly: the order in which the per-CPU LRU and mlock
/// batches drain relative to each mark-accessed, the host's own reclaim and its workingset
/// refault activation, and every other process on the machine (the zero pages). A scenario
/// still checks them where it asks (`expect … kpageflags … referenced`).
pub const AGING_FLAGS: [KpageFlag; 2] = [KpageFlag::Referenced, KpageFlag::Active];

/// One observable of [`observables`]: what, when, and how it is compared (or why not).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observable {
    /// The observable (`outcome`, `smaps Rss`, `kpageflags dirty`, …).
    pub name: String,
    /// Whether it is compared.
    pub compared: bool,
    /// When and how it is compared, or why it is not.
    pub how: String,
}

/// Everything the oracle compares after each statement, and what it leaves out and why
/// (`usermm oracle --observables`).
pub fn observables() -> Vec<Observable> {
    let yes = |name: &str, how: &str| Observable {
        name: name.to_string(),
        compared: true,
        how: how.to_string(),
    };
    let no = |name: &str, how: &str| Observable {
        name: name.to_string(),
        compared: false,
        how: how.to_string(),
    };
    let mut v = vec![
        yes("outcome", "every action: success, the errno, or the signal"),
        yes("expect", "every expectation's verdict, on both sides"),
        yes(
            "address",
            "the address bound by mmap with `fixed`/`noreplace` and by mremap with \
             MREMAP_FIXED: absolute; with `hint`: whether the hint was taken; any other \
             mremap: whether it moved",
        ),
        yes(
            "maps",
            "after each statement that may change an address space, for every live \
             process: its scenario VMAs (ranges relative to the mapping names, page-rounded \
             lengths), permissions, VM_LOCKED and what each maps (private anonymous, \
             shared-anon, tmpfs, disk)",
        ),
    ];
    for (f, _) in smaps_fields(&SmapsView::default()) {
        v.push(yes(&format!("smaps {f}"), "every scenario VMA, in kB"));
    }
    for f in STATUS_FIELDS {
        v.push(yes(&format!("status {f}"), "every live process, in kB"));
    }
    v.push(yes("pagemap present", "every page of every scenario VMA"));
    v.push(yes(
        "pagemap exclusive",
        "every page of every scenario VMA, swap entries included (Linux 6.18 leaves it clear \
         on them: `pte_to_pagemap_entry` tests the mapcount of present pages only)",
    ));
    v.push(yes(
        "pagemap swapped",
        "bit 62, every page of every scenario VMA: the engine lists its swap entries from \
         its page-table dump when the process has any (status VmSwap), the host from pagemap",
    ));
    v.push(yes(
        "after memory pressure",
        "from the first statement that reclaimed under pressure (the engine scanned its LRU \
         lists: direct reclaim or `reclaim`; not `madvise … pageout`) on: smaps Rss, Pss, \
         Shared/Private Clean/Dirty, Anonymous, AnonHugePages, Swap, SwapPss and status \
         VmRSS, RssFile, RssShmem, VmSwap within the larger of 4 MiB and 1/32 of `set memory` \
         (each side picks its own victims from lists that differ in the host's own pages and \
         batch sizes); a private anonymous VMA's Rss+Swap exactly unless the file uses \
         `madvise … free`; its pages no longer one by one",
    ));
    v.push(yes(
        "sampling",
        &format!(
            "the page sample: every present page of a VMA of up to {SAMPLE_ALL_PAGES} pages, \
             else every {SAMPLE_STRIDE}th page and the first and the last"
        ),
    ));
    let sample = "the page sample".to_string();
    v.push(yes(
        "folio order",
        &format!("{sample}; not on disk-file pages (readahead chooses their folio sizes)"),
    ));
    for f in COMPARED_FLAGS {
        let how = if AGING_FLAGS.contains(&f) {
            format!("{sample}; anonymous pages only: on page-cache and zero pages it follows per-CPU batch drains, the host's reclaim and other processes")
        } else if matches!(
            f,
            KpageFlag::Thp | KpageFlag::CompoundHead | KpageFlag::CompoundTail
        ) {
            format!("{sample}; not on disk-file pages (folio sizes follow readahead)")
        } else if f == KpageFlag::Locked {
            format!("{sample}; a host page read locked is read again, 1 ms apart, for up to 50 ms: no scenario process holds a folio lock at a statement boundary, but the host's reclaim, khugepaged, compaction and readahead reads take it for microseconds")
        } else if matches!(f, KpageFlag::Dirty | KpageFlag::Writeback) {
            format!("{sample}; not on disk-file pages (the host's flusher threads write them back on their own schedule)")
        } else {
            sample.clone()
        };
        v.push(yes(&format!("kpageflags {}", f.as_str()), &how));
    }
    for (f, why) in UNCOMPARED_FLAGS {
        v.push(no(&format!("kpageflags {}", f.as_str()), why));
    }
    v.push(yes(
        "set memory",
        "applied on the host too: the scenario's processes run in a memory cgroup of their \
         own (cgroup v2 memory.max where the host's cgroup2 has the memory controller, else v1 \
         memory.limit_in_bytes) of set memory plus 1 MiB per live process for what a host \
         process charges itself, so both sides reclaim at the same size; without set swap the \
         cgroup never swaps (v2 memory.swap.max 0, v1 memsw limit = memory limit and \
         swappiness 0)",
    ));
    v.push(yes(
        "set swap",
        "applied on the host too: a swap file of that size (at most 8 GiB, room left on the \
         disk) added with swapon (priority 100) under the machine-wide lock, the cgroup allowed \
         that much swap; removed after the file, and by the next run or --restore-knobs after \
         a kill. Other swap the host already has is warned about (results may use it)",
    ));
    v.push(yes(
        "reclaim",
        "the host reclaims from the scenario's cgroup (v2 memory.reclaim, v1 a limit lowered \
         to usage - SIZE and put back); `nothing more can be reclaimed` is success on both \
         sides",
    ));
    v.push(no(
        "counters",
        "the engine's event counters have no host counterpart; `usermm run` prints them",
    ));
    v.push(no(
        "VMAs the scenario did not create",
        "the host process's own mappings (its binary, stack, heap) are left out",
    ));
    v
}
