//! The choice of tracker: [`SharingTracker`] and the seed's stages of `rmap-id`
//! ([`RmapIdOptions`]), the value of the tunable `sharing`.
//!
//! A leaf of the sharing module: the tunables name a tracker without depending on the
//! trackers' machinery (see the table in [`super`]).

use super::seqcount::WriterMode;
use super::subid::Sizing;

/// Options of the `rmap-id` tracker: the seed's stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RmapIdOptions {
    /// How writers enter the seqcount (patch 06 / 17 / 18).
    pub writer: WriterMode,
    /// Sub-ID sizing: the seed's table or the corrected one.
    pub sizing: Sizing,
    /// Where the per-page mapcounts are updated (patches 19-20 move them under the seqcount).
    pub pages: PageMapcounts,
}

/// Where an rmap operation on a tracked folio updates the per-page mapcounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageMapcounts {
    /// Outside the seqcount, one atomic add per page (patches 1-18).
    Atomic,
    /// Inside the folio's seqcount write section: plain stores for the exclusive writer,
    /// atomic adds for shared writers (seed 003 patches 19-20, stage "all").
    UnderSeqcount,
}

impl Default for RmapIdOptions {
    /// The seed's final stage with the corrected sizing.
    fn default() -> Self {
        RmapIdOptions {
            writer: WriterMode::ExclusiveAddReturn,
            sizing: Sizing::Safe,
            pages: PageMapcounts::UnderSeqcount,
        }
    }
}

/// Which tracker answers "is this large folio mapped exclusively by this MM".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SharingTracker {
    /// v6.7: the first page's mapcount (`folio_estimated_sharers`), no folio-wide mapcount;
    /// large folios are never reused.
    Estimate,
    /// Seed 003 patches 1-3 (upstream 6.9-6.14): a folio-wide total mapcount and the estimate
    /// improved by it (`folio_likely_mapped_shared`); large folios are still never reused.
    Mapcount,
    /// Seed 003: per-MM rmap IDs, sub-IDs, per-folio rmap values, the atomic seqcount.
    RmapId(RmapIdOptions),
    /// Total mapcount + Σid + Σid² under the same seqcount (exclusive-writer, add-return).
    RmapIdSq,
    /// Upstream 6.15 MM owner tracking (two slots + "maybe mapped shared").
    Owner,
}

impl Default for SharingTracker {
    /// The current upstream behaviour (see the crate's tunables for the chosen default).
    fn default() -> Self {
        SharingTracker::Owner
    }
}

impl SharingTracker {
    /// Accepted spellings, for `usermm tunables`.
    pub(crate) const VALUES: &'static str =
        "owner|rmap-id-sq|estimate|mapcount|rmap-id[+shared|+cmpxchg|+add-return][+seed-sizing][+atomic-pages|+all]";

    /// Every tracker the benchmarks compare, including the seed's stages.
    pub fn all() -> Vec<SharingTracker> {
        let st = |writer, sizing, pages| {
            SharingTracker::RmapId(RmapIdOptions {
                writer,
                sizing,
                pages,
            })
        };
        use PageMapcounts::{Atomic, UnderSeqcount};
        vec![
            SharingTracker::Estimate,
            SharingTracker::Mapcount,
            st(WriterMode::Shared, Sizing::Seed, Atomic),
            st(WriterMode::ExclusiveCmpxchg, Sizing::Seed, Atomic),
            st(WriterMode::ExclusiveAddReturn, Sizing::Seed, Atomic),
            st(WriterMode::ExclusiveAddReturn, Sizing::Seed, UnderSeqcount),
            st(WriterMode::ExclusiveAddReturn, Sizing::Safe, UnderSeqcount),
            SharingTracker::RmapIdSq,
            SharingTracker::Owner,
        ]
    }

    /// Parses `estimate`, `mapcount`, `owner`, `rmap-id-sq`, or `rmap-id` with `+shared`
    /// (patch 10: shared writers only), `+cmpxchg` (patch 17), `+add-return` (patch 18, the
    /// default), `+seed-sizing` (the series' sub-ID table) / `+safe-sizing` (the default), and
    /// `+atomic-pages` (per-page mapcounts outside the seqcount, before patches 19-20) /
    /// `+all` (under it, the default).
    pub fn parse(s: &str) -> Option<SharingTracker> {
        match s {
            "estimate" => return Some(SharingTracker::Estimate),
            "mapcount" => return Some(SharingTracker::Mapcount),
            "owner" => return Some(SharingTracker::Owner),
            "rmap-id-sq" => return Some(SharingTracker::RmapIdSq),
            _ => {}
        }
        let mut parts = s.split('+');
        if parts.next()? != "rmap-id" {
            return None;
        }
        let mut o = RmapIdOptions::default();
        for p in parts {
            match p {
                "shared" => o.writer = WriterMode::Shared,
                "cmpxchg" => o.writer = WriterMode::ExclusiveCmpxchg,
                "add-return" => o.writer = WriterMode::ExclusiveAddReturn,
                "seed-sizing" => o.sizing = Sizing::Seed,
                "safe-sizing" => o.sizing = Sizing::Safe,
                "atomic-pages" => o.pages = PageMapcounts::Atomic,
                "all" => o.pages = PageMapcounts::UnderSeqcount,
                _ => return None,
            }
        }
        Some(SharingTracker::RmapId(o))
    }

    /// Canonical spelling (parses back to `self`).
    pub fn name(self) -> String {
        match self {
            SharingTracker::Estimate => "estimate".into(),
            SharingTracker::Mapcount => "mapcount".into(),
            SharingTracker::Owner => "owner".into(),
            SharingTracker::RmapIdSq => "rmap-id-sq".into(),
            SharingTracker::RmapId(o) => {
                let mut s = String::from("rmap-id");
                if o.writer != WriterMode::ExclusiveAddReturn {
                    s.push('+');
                    s.push_str(o.writer.name());
                }
                if o.sizing == Sizing::Seed {
                    s.push_str("+seed-sizing");
                }
                if o.pages == PageMapcounts::Atomic {
                    s.push_str("+atomic-pages");
                }
                s
            }
        }
    }

    /// Whether the tracker can never call a shared folio exclusive (safe for COW reuse).
    pub fn never_falsely_exclusive(self) -> bool {
        match self {
            SharingTracker::Estimate | SharingTracker::Mapcount => false,
            SharingTracker::RmapId(o) => o.sizing == Sizing::Safe,
            SharingTracker::RmapIdSq | SharingTracker::Owner => true,
        }
    }

    /// The tracker's code in the side table's configuration word (see [`super::Sharing`]).
    pub(crate) fn code(self) -> u64 {
        match self {
            SharingTracker::Estimate => 0,
            SharingTracker::Owner => 1,
            SharingTracker::RmapIdSq => 2,
            SharingTracker::Mapcount => 15,
            SharingTracker::RmapId(o) => {
                let w = match o.writer {
                    WriterMode::Shared => 0,
                    WriterMode::ExclusiveCmpxchg => 1,
                    WriterMode::ExclusiveAddReturn => 2,
                };
                3 + w * 2
                    + u64::from(o.sizing == Sizing::Seed)
                    + 6 * u64::from(o.pages == PageMapcounts::Atomic)
            }
        }
    }

    /// The tracker a configuration word's code names ([`SharingTracker::code`]).
    pub(crate) fn from_code(c: u64) -> SharingTracker {
        match c {
            0 => SharingTracker::Estimate,
            2 => SharingTracker::RmapIdSq,
            15 => SharingTracker::Mapcount,
            3..=14 => {
                let k = (c - 3) % 6;
                let writer = match k / 2 {
                    0 => WriterMode::Shared,
                    1 => WriterMode::ExclusiveCmpxchg,
                    _ => WriterMode::ExclusiveAddReturn,
                };
                let sizing = if k % 2 == 1 {
                    Sizing::Seed
                } else {
                    Sizing::Safe
                };
                let pages = if c >= 9 {
                    PageMapcounts::Atomic
                } else {
                    PageMapcounts::UnderSeqcount
                };
                SharingTracker::RmapId(RmapIdOptions {
                    writer,
                    sizing,
                    pages,
                })
            }
            _ => SharingTracker::Owner,
        }
    }
}
