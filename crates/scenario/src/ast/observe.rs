//! The vocabulary of what a scenario observes: the fields of `/proc/PID/smaps` and
//! `/proc/PID/status`, the pagemap states, the `/proc/kpageflags` bits and the permissions
//! column of `/proc/PID/maps`.

use super::Keyword;

keyword_enum! {
    /// A field of `/proc/PID/smaps`.
    pub enum SmapsField {
        /// Size.
        Size = "Size",
        /// Rss.
        Rss = "Rss",
        /// Pss.
        Pss = "Pss",
        /// Shared_Clean.
        SharedClean = "Shared_Clean",
        /// Shared_Dirty.
        SharedDirty = "Shared_Dirty",
        /// Private_Clean.
        PrivateClean = "Private_Clean",
        /// Private_Dirty.
        PrivateDirty = "Private_Dirty",
        /// Referenced.
        Referenced = "Referenced",
        /// Anonymous.
        Anonymous = "Anonymous",
        /// AnonHugePages.
        AnonHugePages = "AnonHugePages",
        /// ShmemPmdMapped (shmem folios mapped by a PMD).
        ShmemPmdMapped = "ShmemPmdMapped",
        /// FilePmdMapped (other file folios mapped by a PMD).
        FilePmdMapped = "FilePmdMapped",
        /// Swap.
        Swap = "Swap",
        /// Locked.
        Locked = "Locked",
        /// KernelPageSize (the page size backing the VMA: 4 kB here, no hugetlb).
        KernelPageSize = "KernelPageSize",
        /// MMUPageSize.
        MmuPageSize = "MMUPageSize",
        /// Pss_Dirty: the proportional share of dirty pages.
        PssDirty = "Pss_Dirty",
        /// Pss_Anon (printed by `smaps_rollup`; here of the VMAs summed).
        PssAnon = "Pss_Anon",
        /// Pss_File (as Pss_Anon).
        PssFile = "Pss_File",
        /// Pss_Shmem (as Pss_Anon).
        PssShmem = "Pss_Shmem",
        /// KSM: pages merged by KSM.
        Ksm = "KSM",
        /// LazyFree: clean anonymous pages MADV_FREE made droppable.
        LazyFree = "LazyFree",
        /// Shared_Hugetlb.
        SharedHugetlb = "Shared_Hugetlb",
        /// Private_Hugetlb.
        PrivateHugetlb = "Private_Hugetlb",
        /// SwapPss: the proportional share of swapped-out pages.
        SwapPss = "SwapPss",
        /// THPeligible: 1 when THP may back the VMA, else 0 (a flag: compared exactly).
        ThpEligible = "THPeligible",
    }
}

keyword_enum! {
    /// A field of `/proc/PID/status`.
    pub enum StatusField {
        /// VmPeak.
        VmPeak = "VmPeak",
        /// VmSize.
        VmSize = "VmSize",
        /// VmLck.
        VmLck = "VmLck",
        /// VmPin.
        VmPin = "VmPin",
        /// VmHWM.
        VmHWM = "VmHWM",
        /// VmRSS.
        VmRSS = "VmRSS",
        /// RssAnon.
        RssAnon = "RssAnon",
        /// RssFile.
        RssFile = "RssFile",
        /// RssShmem.
        RssShmem = "RssShmem",
        /// VmData.
        VmData = "VmData",
        /// VmPTE.
        VmPTE = "VmPTE",
        /// VmSwap.
        VmSwap = "VmSwap",
    }
}

keyword_enum! {
    /// A `/proc/PID/pagemap` state of one page.
    pub enum PagemapState {
        /// Bit 56 set: exclusively mapped.
        Exclusive = "exclusive",
        /// Present and bit 56 clear.
        Shared = "shared",
        /// Bit 63 set.
        Present = "present",
        /// Bit 63 clear.
        Absent = "absent",
        /// Bit 62 set: swapped out (the entry is a swap entry).
        Swapped = "swapped",
    }
}

/// One check of `expect ... kpageflags`: `flag` (must be set) or `!flag` (clear).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlagCheck {
    /// The flag.
    pub flag: KpageFlag,
    /// `true` for `flag`, `false` for `!flag`.
    pub set: bool,
}

keyword_enum! {
    /// A `/proc/kpageflags` bit (include/uapi/linux/kernel-page-flags.h; bits 32
    /// and up are the kernel-internal ones fs/proc/page.c exports).
    pub enum KpageFlag {
        /// KPF_LOCKED (0).
        Locked = "locked",
        /// KPF_ERROR (1).
        Error = "error",
        /// KPF_REFERENCED (2).
        Referenced = "referenced",
        /// KPF_UPTODATE (3).
        Uptodate = "uptodate",
        /// KPF_DIRTY (4).
        Dirty = "dirty",
        /// KPF_LRU (5).
        Lru = "lru",
        /// KPF_ACTIVE (6).
        Active = "active",
        /// KPF_SLAB (7).
        Slab = "slab",
        /// KPF_WRITEBACK (8).
        Writeback = "writeback",
        /// KPF_RECLAIM (9).
        Reclaim = "reclaim",
        /// KPF_BUDDY (10).
        Buddy = "buddy",
        /// KPF_MMAP (11).
        Mmap = "mmap",
        /// KPF_ANON (12).
        Anon = "anon",
        /// KPF_SWAPCACHE (13).
        Swapcache = "swapcache",
        /// KPF_SWAPBACKED (14).
        Swapbacked = "swapbacked",
        /// KPF_COMPOUND_HEAD (15).
        CompoundHead = "compound_head",
        /// KPF_COMPOUND_TAIL (16).
        CompoundTail = "compound_tail",
        /// KPF_HUGE (17).
        Huge = "huge",
        /// KPF_UNEVICTABLE (18).
        Unevictable = "unevictable",
        /// KPF_HWPOISON (19).
        Hwpoison = "hwpoison",
        /// KPF_NOPAGE (20).
        Nopage = "nopage",
        /// KPF_KSM (21).
        Ksm = "ksm",
        /// KPF_THP (22).
        Thp = "thp",
        /// KPF_OFFLINE (23).
        Offline = "offline",
        /// KPF_ZERO_PAGE (24).
        ZeroPage = "zero_page",
        /// KPF_IDLE (25).
        Idle = "idle",
        /// KPF_PGTABLE (26).
        Pgtable = "pgtable",
        /// KPF_RESERVED (32).
        Reserved = "reserved",
        /// KPF_MLOCKED (33).
        Mlocked = "mlocked",
        /// KPF_MAPPEDTODISK (34).
        Mappedtodisk = "mappedtodisk",
        /// KPF_PRIVATE (35).
        Private = "private",
        /// KPF_PRIVATE_2 (36).
        Private2 = "private_2",
        /// KPF_OWNER_PRIVATE (37).
        OwnerPrivate = "owner_private",
        /// KPF_ARCH (38).
        Arch = "arch",
        /// KPF_UNCACHED (39).
        Uncached = "uncached",
        /// KPF_SOFTDIRTY (40).
        Softdirty = "softdirty",
        /// KPF_ARCH_2 (41).
        Arch2 = "arch_2",
    }
}

impl KpageFlag {
    /// The bit number in a `/proc/kpageflags` entry.
    pub fn bit(self) -> u32 {
        match self {
            KpageFlag::Locked => 0,
            KpageFlag::Error => 1,
            KpageFlag::Referenced => 2,
            KpageFlag::Uptodate => 3,
            KpageFlag::Dirty => 4,
            KpageFlag::Lru => 5,
            KpageFlag::Active => 6,
            KpageFlag::Slab => 7,
            KpageFlag::Writeback => 8,
            KpageFlag::Reclaim => 9,
            KpageFlag::Buddy => 10,
            KpageFlag::Mmap => 11,
            KpageFlag::Anon => 12,
            KpageFlag::Swapcache => 13,
            KpageFlag::Swapbacked => 14,
            KpageFlag::CompoundHead => 15,
            KpageFlag::CompoundTail => 16,
            KpageFlag::Huge => 17,
            KpageFlag::Unevictable => 18,
            KpageFlag::Hwpoison => 19,
            KpageFlag::Nopage => 20,
            KpageFlag::Ksm => 21,
            KpageFlag::Thp => 22,
            KpageFlag::Offline => 23,
            KpageFlag::ZeroPage => 24,
            KpageFlag::Idle => 25,
            KpageFlag::Pgtable => 26,
            KpageFlag::Reserved => 32,
            KpageFlag::Mlocked => 33,
            KpageFlag::Mappedtodisk => 34,
            KpageFlag::Private => 35,
            KpageFlag::Private2 => 36,
            KpageFlag::OwnerPrivate => 37,
            KpageFlag::Arch => 38,
            KpageFlag::Uncached => 39,
            KpageFlag::Softdirty => 40,
            KpageFlag::Arch2 => 41,
        }
    }

    /// The mask `1 << bit`.
    pub fn mask(self) -> u64 {
        1u64 << self.bit()
    }
}

/// The permissions column of `/proc/PID/maps`, e.g. `rw-p`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Perms {
    /// `r`.
    pub read: bool,
    /// `w`.
    pub write: bool,
    /// `x`.
    pub exec: bool,
    /// `s` (shared) rather than `p` (private).
    pub shared: bool,
}

impl Perms {
    /// Parses the four characters `[r-][w-][x-][ps]`.
    pub fn parse(s: &str) -> Option<Perms> {
        let b = s.as_bytes();
        if b.len() != 4 {
            return None;
        }
        let flag = |c: u8, yes: u8| match c {
            _ if c == yes => Some(true),
            b'-' => Some(false),
            _ => None,
        };
        Some(Perms {
            read: flag(b[0], b'r')?,
            write: flag(b[1], b'w')?,
            exec: flag(b[2], b'x')?,
            shared: match b[3] {
                b's' => true,
                b'p' => false,
                _ => return None,
            },
        })
    }
}
