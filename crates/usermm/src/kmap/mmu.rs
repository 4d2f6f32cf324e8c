//! The boot CPU's software MMU for kernel addresses: a small TLB, a stage-1 table walker, and
//! TLB maintenance with its barriers.
//!
//! Linux counterparts: none in C (this is the hardware), but the operations mirror
//! `arch/arm64/include/asm/tlbflush.h` (`flush_tlb_kernel_range`: `DSB ISHST`,
//! `TLBI VAALE1IS` per page, `DSB ISH`, `ISB`; `flush_tlb_all`) and `asm/barrier.h`.
//!
//! Every kernel-VA access the model makes (through a fixmap slot or the linear map) goes
//! through `Mmu::translate`: a hit in the direct-mapped TLB, or a walk of the kernel tables
//! from `TTBR1` reading descriptors by physical address, as the hardware walker does. A fixmap
//! slot that is rewritten without a TLBI therefore keeps translating to the *old* table, which
//! is why clearing a slot must invalidate it; [`TlbCheck::Verify`] turns such a stale hit into
//! an error.
//!
//! # Cost model
//! A DSB is a host `SeqCst` fence; an ISB is counted only. A broadcast TLBI costs hardware time
//! a software TLB cannot reproduce (waiting for every PE in the inner-shareable domain), so it
//! may be charged as a busy-wait of `tlbi_latency` ([`SEED_TLBI_NS`] is derived from the seed's
//! own measurements). With latency 0 the model's time is the engine's work only.

use super::desc::{classify, desc_pa, DescKind, PXN_TABLE, UXN_TABLE};
use super::geom::Granule;
use super::pool::TablePool;
use super::stats::KmapStats;
use super::KmapError;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

/// TLB entries (direct mapped by virtual page number).
pub(crate) const TLB_ENTRIES: usize = 64;

/// Per-TLBI hardware latency calibrated from seed 002 (Ampere Altra, 512 GiB, 4 KiB pages):
/// removing one fixmap remap per table saved (1656 − 1257) ms over 262 657 tables ≈ 1.52 µs,
/// and removing 31 per-chunk remaps per table saved (17447 − 3779) ms / (31 × 262 657) ≈
/// 1.68 µs; 1.5 µs is the rounded-down figure.
pub const SEED_TLBI_NS: u64 = 1500;

/// Whether TLB hits are double-checked against a fresh walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TlbCheck {
    /// Use cached translations as hardware does.
    #[default]
    Trust,
    /// Walk on every hit too and fail with [`KmapError::StaleTlb`] on a mismatch.
    Verify,
}

/// A completed translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// Physical address of the byte at the translated VA.
    pub pa: u64,
    /// The leaf descriptor.
    pub desc: u64,
    /// Level of the leaf (1 or 2: block; 3: page).
    pub level: u32,
    /// Bytes mapped by the leaf descriptor.
    pub(crate) size: u64,
    /// Some table descriptor on the way set PXNTable.
    pub pxn_table: bool,
    /// Every table descriptor on the way set UXNTable.
    pub uxn_table: bool,
}

#[derive(Clone, Copy, Debug)]
struct TlbEntry {
    vpn: u64,
    pa_page: u64,
}

const INVALID_VPN: u64 = u64::MAX;

/// Walks the kernel tables rooted at `pgd` for `va`, reading descriptors by physical address.
pub(crate) fn walk(
    pool: &TablePool,
    pgd: u64,
    granule: Granule,
    va: u64,
) -> Result<Translation, KmapError> {
    if va >> 48 != 0xffff {
        return Err(KmapError::TranslationFault {
            va,
            level: granule.top_level(),
        });
    }
    let (mut table, mut pxn_table, mut uxn_table) = (pgd, false, true);
    for level in granule.top_level()..=3 {
        let desc = pool.load(table + granule.index(va, level) * 8)?;
        match classify(desc, level, granule) {
            DescKind::Table => {
                pxn_table |= desc & PXN_TABLE != 0;
                uxn_table &= desc & UXN_TABLE != 0;
                table = desc_pa(desc, granule);
            }
            DescKind::Block | DescKind::Page => {
                let size = granule.entry_size(level);
                return Ok(Translation {
                    pa: desc_pa(desc, granule) + (va & (size - 1)),
                    desc,
                    level,
                    size,
                    pxn_table,
                    uxn_table,
                });
            }
            DescKind::Invalid | DescKind::Reserved => {
                return Err(KmapError::TranslationFault { va, level })
            }
        }
    }
    Err(KmapError::TranslationFault { va, level: 3 })
}

/// The boot CPU's MMU state for the kernel half (`TTBR1_EL1` = `pgd`).
#[derive(Debug)]
pub(crate) struct Mmu {
    tlb: Box<[TlbEntry]>,
    granule: Granule,
    pgd: u64,
    check: TlbCheck,
    tlbi_latency: Duration,
}

impl Mmu {
    /// A cold MMU translating through `pgd`.
    pub(crate) fn new(granule: Granule, pgd: u64, check: TlbCheck, tlbi_latency: Duration) -> Mmu {
        Mmu {
            tlb: vec![
                TlbEntry {
                    vpn: INVALID_VPN,
                    pa_page: 0
                };
                TLB_ENTRIES
            ]
            .into_boxed_slice(),
            granule,
            pgd,
            check,
            tlbi_latency,
        }
    }

    /// Translates a kernel VA for a load or store: TLB hit, or walk and fill.
    #[inline]
    pub(crate) fn translate(
        &mut self,
        pool: &TablePool,
        va: u64,
        stats: &mut KmapStats,
    ) -> Result<u64, KmapError> {
        let shift = self.granule.page_shift();
        let vpn = va >> shift;
        let e = self.tlb[(vpn as usize) % TLB_ENTRIES];
        if e.vpn == vpn && self.check == TlbCheck::Trust {
            stats.tlb_hits += 1;
            return Ok(e.pa_page | (va & ((1 << shift) - 1)));
        }
        self.translate_slow(pool, va, stats)
    }

    /// A TLB miss (walk and fill), or a hit to be verified.
    #[cold]
    fn translate_slow(
        &mut self,
        pool: &TablePool,
        va: u64,
        stats: &mut KmapStats,
    ) -> Result<u64, KmapError> {
        let shift = self.granule.page_shift();
        let vpn = va >> shift;
        let slot = (vpn as usize) % TLB_ENTRIES;
        let e = self.tlb[slot];
        let t = walk(pool, self.pgd, self.granule, va)?;
        if e.vpn == vpn {
            stats.tlb_hits += 1;
            let pa = e.pa_page | (va & ((1 << shift) - 1));
            if t.pa != pa {
                return Err(KmapError::StaleTlb {
                    va,
                    tlb: pa,
                    walk: t.pa,
                });
            }
            return Ok(pa);
        }
        stats.tlb_misses += 1;
        self.tlb[slot] = TlbEntry {
            vpn,
            pa_page: t.pa & !((1 << shift) - 1),
        };
        Ok(t.pa)
    }

    /// `TLBI VAALE1IS`: drops the last-level translation of `va` on every PE, charged to the
    /// table level the invalidated mapping was used for.
    pub(crate) fn tlbi_va(&mut self, va: u64, level: u32, stats: &mut KmapStats) {
        let vpn = va >> self.granule.page_shift();
        let e = &mut self.tlb[(vpn as usize) % TLB_ENTRIES];
        if e.vpn == vpn {
            e.vpn = INVALID_VPN;
        }
        stats.tlbi_page += 1;
        stats.tlbi_page_by_level[level.min(3) as usize] += 1;
        self.hw_latency();
    }

    /// `TLBI VMALLE1IS` (what `flush_tlb_kernel_range` falls back to for large ranges).
    pub(crate) fn tlbi_all(&mut self, stats: &mut KmapStats) {
        for e in self.tlb.iter_mut() {
            e.vpn = INVALID_VPN;
        }
        stats.tlbi_all += 1;
        self.hw_latency();
    }

    /// `DSB`: a full host fence.
    #[inline]
    pub(crate) fn dsb(&self, stats: &mut KmapStats) {
        fence(Ordering::SeqCst);
        stats.dsb += 1;
    }

    /// `ISB`: counted (the host has no pipeline to resynchronise for us).
    #[inline]
    pub(crate) fn isb(&self, stats: &mut KmapStats) {
        stats.isb += 1;
    }

    /// Valid TLB entries whose VA lies in `[start, end)`.
    pub(crate) fn cached_in(&self, start: u64, end: u64) -> usize {
        let shift = self.granule.page_shift();
        self.tlb
            .iter()
            .filter(|e| e.vpn != INVALID_VPN)
            .filter(|e| {
                let va = e.vpn << shift;
                va >= start && va < end
            })
            .count()
    }

    fn hw_latency(&self) {
        if self.tlbi_latency.is_zero() {
            return;
        }
        let t = Instant::now();
        while t.elapsed() < self.tlbi_latency {
            std::hint::spin_loop();
        }
    }
}
