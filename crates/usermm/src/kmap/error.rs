//! The errors of kernel-mapping construction ([`KmapError`]).

use super::geom::FixSlot;

/// Errors of kernel-mapping construction (Linux: `BUG_ON`, `WARN_ON`, `-ENOMEM`, panic).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KmapError {
    /// `phys` and `virt` have different offsets within a page.
    #[error("physical {phys:#x} and virtual {virt:#x} differ in their offset within a page")]
    OffsetMismatch {
        /// Physical start.
        phys: u64,
        /// Virtual start.
        virt: u64,
    },
    /// The page-table pool has no free table page.
    #[error("page-table pool of {bytes} bytes is exhausted (raise KmapConfig::pool_bytes)")]
    OutOfTables {
        /// Pool size.
        bytes: u64,
    },
    /// A missing table would have to be allocated by a call that may not allocate.
    #[error("level-{level} table needed for {va:#x} but this update may not allocate")]
    NoAllocator {
        /// Address being mapped.
        va: u64,
        /// Level of the missing table.
        level: u32,
    },
    /// A live entry would change in a way that needs break-before-make.
    #[error("unsafe change of a live level-{level} entry at {va:#x}: {old:#x} -> {new:#x}")]
    UnsafeChange {
        /// Address being mapped.
        va: u64,
        /// Level of the entry.
        level: u32,
        /// Current descriptor.
        old: u64,
        /// Refused descriptor.
        new: u64,
    },
    /// A block maps the range, so no table can be walked into.
    #[error("a level-{level} block maps {va:#x}: cannot descend into it")]
    BlockInTheWay {
        /// Address being mapped.
        va: u64,
        /// Level of the block.
        level: u32,
    },
    /// A descriptor that is neither empty, a table nor a block.
    #[error("bad level-{level} descriptor {desc:#x} for {va:#x}")]
    BadDescriptor {
        /// Address being mapped.
        va: u64,
        /// Level of the entry.
        level: u32,
        /// The descriptor.
        desc: u64,
    },
    /// A fixmap slot was set while still in use.
    #[error("fixmap slot {0:?} is already in use")]
    SlotBusy(FixSlot),
    /// A kernel VA does not translate.
    #[error("translation fault at {va:#x} (level {level})")]
    TranslationFault {
        /// Faulting address.
        va: u64,
        /// Level the walk stopped at.
        level: u32,
    },
    /// A TLB hit disagreed with the tables ([`TlbCheck::Verify`](super::TlbCheck::Verify)): a missing TLBI.
    #[error("stale TLB entry for {va:#x}: TLB gives {tlb:#x}, tables give {walk:#x}")]
    StaleTlb {
        /// Address.
        va: u64,
        /// PA from the TLB.
        tlb: u64,
        /// PA from a walk.
        walk: u64,
    },
    /// A physical address outside the page-table pool was accessed.
    #[error("physical address {0:#x} has no backing (not in the page-table pool)")]
    Unbacked(u64),
    /// The RAM layout or configuration is unusable.
    #[error("bad layout: {0}")]
    BadLayout(String),
    /// [`KernelSpace::validate`](super::KernelSpace::validate) found a broken invariant.
    #[error("invariant violated: {0}")]
    Invariant(String),
}
