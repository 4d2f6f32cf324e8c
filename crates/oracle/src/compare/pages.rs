//! The page-by-page comparison: what each side shows of a VMA's pages, and the differences.
//!
//! Pages are observed sparsely: each side lists only the pages it shows (present, a swap
//! entry, or exclusive), in address order — the host reads pagemap a bounded chunk at a time
//! and keeps those entries, the engine walks its page tables skipping empty upper levels
//! (and, in a process with swap entries, its page-table dump for them) — and the two lists
//! are merged, a page missing from one list being absent there. So the time
//! and memory of a comparison follow the pages mapped, not the size of the mappings (a
//! 64 GiB `norserve` reservation costs what its few written pages cost), and the
//! differences reported are the ones a page-by-page comparison would report.

use super::observables::{AGING_FLAGS, COMPARED_FLAGS};
use super::Diff;
use crate::host::HostBackend;
use crate::procfs;
use scenario::backend::{Backend, Fail, Res};
use scenario::engine::EngineBackend;
use scenario::run::fail_name;
use scenario::{Keyword, KpageFlag};

/// VMAs up to this many pages have every page's flags compared.
pub(super) const SAMPLE_ALL_PAGES: usize = 64;
/// Otherwise every this many pages (plus the first and the last).
pub(super) const SAMPLE_STRIDE: usize = 16;
/// Page-difference lines reported per process and statement.
const MAX_PAGE_LINES: usize = 16;

/// What one page looks like as compared: the backends' one page view (pagemap and
/// kpageflags, `scenario::backend::PageView`), with only the compared kpageflags bits and,
/// like the folio order, only on sampled pages that are present.
pub type PageObs = scenario::backend::PageView;

/// The pages of one VMA that are shown, sparsely: `(index, page)` in index order for every
/// page whose observation is not [`PageObs::default`] (absent, no swap entry, not exclusive), out of
/// `count` pages; every page not listed is absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmaPages {
    /// Pages in the VMA.
    pub count: usize,
    /// The pages shown.
    pub shown: Vec<(usize, PageObs)>,
}

impl VmaPages {
    fn new(start: u64, end: u64) -> VmaPages {
        VmaPages {
            count: (end.saturating_sub(start) / 4096) as usize,
            shown: Vec::new(),
        }
    }

    /// Records page `addr` (from the VMA at `start`) unless it shows nothing.
    fn push(&mut self, start: u64, addr: u64, o: PageObs) {
        if o != PageObs::default() {
            self.shown.push((((addr - start) / 4096) as usize, o));
        }
    }
}

/// Whether page `i` of `n` has its flags compared.
pub fn sampled(i: usize, n: usize) -> bool {
    n <= SAMPLE_ALL_PAGES || i == 0 || i + 1 == n || i.is_multiple_of(SAMPLE_STRIDE)
}

fn aging_mask() -> u64 {
    AGING_FLAGS.iter().fold(0, |m, f| m | f.mask())
}

/// The compared bits of a kpageflags word: [`COMPARED_FLAGS`], less the [`AGING_FLAGS`] of
/// a page that is not anonymous.
fn compared_bits(flags: u64) -> u64 {
    let mask = COMPARED_FLAGS.iter().fold(0, |m, f| m | f.mask());
    if flags & KpageFlag::Anon.mask() == 0 {
        flags & mask & !aging_mask()
    } else {
        flags & mask
    }
}

/// Reads the pages of `[start, end)`: pagemap bits of all, flags and order of the sample.
pub trait ObservePages {
    /// The pages shown and the reasons anything was left out.
    fn observe_pages(&mut self, p: u32, start: u64, end: u64) -> Res<(VmaPages, Vec<String>)>;

    /// Why the VMA `[start, end)` cannot be compared, if it cannot.
    fn vma_problem(&self, _p: u32, _start: u64, _end: u64) -> Option<String> {
        None
    }
}

impl ObservePages for EngineBackend {
    fn observe_pages(&mut self, p: u32, start: u64, end: u64) -> Res<(VmaPages, Vec<String>)> {
        let mut out = VmaPages::new(start, end);
        let n = out.count;
        // The engine shows a page only when it is present or a swap entry (it sets pagemap's
        // bit 56 on nothing else), so those are all the pages it shows. Any CPU slot will do
        // for these read-only walks.
        let (present, swapped) = {
            let cpu = self
                .machine()?
                .enter_cpu(0)
                .map_err(|e| Fail::Unsupported(e.to_string()))?;
            let tables = |e: usermm::Errno| Fail::Unsupported(format!("page tables: {}", e.name()));
            let present = cpu.present_pages(p, start, end).map_err(tables)?;
            // Swap entries: the present-page walk skips them, and the engine has no walk of
            // a range that lists them, so the process's raw page-table dump is searched —
            // only when it has any (MM_SWAPENTS, status VmSwap), so a file without swap
            // costs what it did. Each non-present entry of the range is read as pagemap
            // reads it, bit 56 included: a swap entry with it set is a difference from Linux.
            let mut swapped = Vec::new();
            if cpu.status(p).map_err(tables)?.vm_swap > 0 {
                for leaf in cpu.page_table_dump(p).map_err(tables)? {
                    let a = leaf.addr;
                    if a < start || a >= end || present.binary_search(&a).is_ok() {
                        continue;
                    }
                    let pm = cpu.pagemap(p, a).map_err(tables)?;
                    if pm.swapped {
                        swapped.push((a, pm.exclusive));
                    }
                }
            }
            (present, swapped)
        };
        let mut pages: Vec<(u64, PageObs)> = swapped
            .into_iter()
            .map(|(a, exclusive)| {
                let o = PageObs {
                    swapped: true,
                    exclusive,
                    ..PageObs::default()
                };
                (a, o)
            })
            .collect();
        for addr in present {
            let v = self.page(p, addr)?;
            let keep = v.present && sampled(((addr - start) / 4096) as usize, n);
            pages.push((
                addr,
                PageObs {
                    kpageflags: v.kpageflags.filter(|_| keep).map(compared_bits),
                    folio_order: v.folio_order.filter(|_| keep),
                    ..v
                },
            ));
        }
        pages.sort_unstable_by_key(|&(a, _)| a);
        for (addr, o) in pages {
            out.push(start, addr, o);
        }
        Ok((out, Vec::new()))
    }
}

impl ObservePages for HostBackend<'_> {
    fn vma_problem(&self, p: u32, start: u64, end: u64) -> Option<String> {
        self.own_overlap(p, start, end).map(|(a, b)| {
            format!(
                "the VMA {start:#x}-{end:#x} merged with the oracle server's own mapping \
                 {a:#x}-{b:#x}: place the scenario's mappings elsewhere"
            )
        })
    }

    fn observe_pages(&mut self, p: u32, start: u64, end: u64) -> Res<(VmaPages, Vec<String>)> {
        let mut out = VmaPages::new(start, end);
        let n = out.count;
        let shown = procfs::PM_PRESENT | procfs::PM_EXCLUSIVE | procfs::PM_SWAP;
        let entries = self.pagemap_entries(p, start, end, shown)?;
        let mut skipped = Vec::new();
        for (addr, e) in entries {
            let mut o = PageObs {
                present: e & procfs::PM_PRESENT != 0,
                exclusive: e & procfs::PM_EXCLUSIVE != 0,
                swapped: e & procfs::PM_SWAP != 0,
                ..PageObs::default()
            };
            let i = ((addr - start) / 4096) as usize;
            if o.present && sampled(i, n) && skipped.is_empty() {
                match self.frame(e) {
                    Ok((f, ord)) => {
                        o.kpageflags = f.map(compared_bits);
                        o.folio_order = ord;
                    }
                    Err(f) => {
                        skipped.push(format!("kpageflags and folio order: {}", fail_name(&f)))
                    }
                }
            }
            out.push(start, addr, o);
        }
        Ok((out, skipped))
    }
}

/// A disk-file page as compared: without what follows the folio's size, which readahead
/// chooses (folio order, `thp`, the compound bits), and without `dirty` and `writeback`,
/// which the host's flusher threads change on their own schedule (`dirty_expire_centisecs`,
/// and at once when the machine's dirty memory passes `dirty_background_ratio`). A scenario
/// still checks them where it asks.
fn disk_page(o: &PageObs) -> PageObs {
    let mask = KpageFlag::Thp.mask()
        | KpageFlag::CompoundHead.mask()
        | KpageFlag::CompoundTail.mask()
        | KpageFlag::Dirty.mask()
        | KpageFlag::Writeback.mask();
    PageObs {
        kpageflags: o.kpageflags.map(|f| f & !mask),
        folio_order: None,
        ..*o
    }
}

/// The pages of a disk-file VMA as compared ([`disk_page`]).
pub(super) fn disk_pages(pages: &VmaPages) -> VmaPages {
    VmaPages {
        count: pages.count,
        shown: pages
            .shown
            .iter()
            .map(|&(i, o)| (i, disk_page(&o)))
            .collect(),
    }
}

/// One compared property of a page.
#[derive(Clone, Copy, Debug)]
enum PageField {
    Present,
    Exclusive,
    Swapped,
    Order,
    Flag(KpageFlag),
}

impl PageField {
    fn name(self) -> &'static str {
        match self {
            PageField::Present => "present",
            PageField::Exclusive => "exclusive",
            PageField::Swapped => "swapped",
            PageField::Order => "folio order",
            PageField::Flag(f) => f.as_str(),
        }
    }

    /// Whether the field is observed on page `o` (what [`PageField::get`] answers `Some`
    /// for, without building the text).
    fn defined(self, o: &PageObs) -> bool {
        match self {
            PageField::Present | PageField::Exclusive | PageField::Swapped => true,
            PageField::Order => o.folio_order.is_some(),
            PageField::Flag(_) => o.kpageflags.is_some(),
        }
    }

    /// The field's value on page `o` (`None`: not observed there).
    fn get(self, o: &PageObs) -> Option<String> {
        match self {
            PageField::Present => Some(u8::from(o.present).to_string()),
            PageField::Exclusive => Some(u8::from(o.exclusive).to_string()),
            PageField::Swapped => Some(u8::from(o.swapped).to_string()),
            PageField::Order => o.folio_order.map(|x| x.to_string()),
            PageField::Flag(f) => o
                .kpageflags
                .map(|w| if w & f.mask() != 0 { "1" } else { "0" }.to_string()),
        }
    }
}

/// Every compared page field: pagemap's three bits, the folio order, [`COMPARED_FLAGS`].
fn page_fields() -> impl Iterator<Item = PageField> {
    [
        PageField::Present,
        PageField::Exclusive,
        PageField::Swapped,
        PageField::Order,
    ]
    .into_iter()
    .chain(COMPARED_FLAGS.into_iter().map(PageField::Flag))
}

/// The pages either side shows, merged by index: `(index, engine, host)`, an unlisted page
/// being absent on its side.
fn merge_pages(e: &VmaPages, h: &VmaPages) -> Vec<(usize, PageObs, PageObs)> {
    let absent = PageObs::default();
    let mut out = Vec::with_capacity(e.shown.len().max(h.shown.len()));
    let (mut ei, mut hi) = (e.shown.iter().peekable(), h.shown.iter().peekable());
    loop {
        let next = match (ei.peek(), hi.peek()) {
            (None, None) => break,
            (Some(&&(i, eo)), Some(&&(j, ho))) if i == j => {
                ei.next();
                hi.next();
                (i, eo, ho)
            }
            (Some(&&(i, eo)), Some(&&(j, _))) if i < j => {
                ei.next();
                (i, eo, absent)
            }
            (Some(&&(i, eo)), None) => {
                ei.next();
                (i, eo, absent)
            }
            (_, Some(&&(j, ho))) => {
                hi.next();
                (j, absent, ho)
            }
        };
        out.push(next);
    }
    out
}

pub(super) fn compare_pages(
    proc_name: &str,
    host_start: u64,
    ep: &VmaPages,
    hp: &VmaPages,
    d: &mut Diff<'_>,
    relative: &dyn Fn(u64) -> String,
) {
    let mut lines = 0usize;
    let mut more = 0usize;
    let merged = merge_pages(ep, hp);
    // Most pages agree on everything: no field's text is built for them (a long trace's
    // oracle run compares thousands of pages after every statement).
    if merged.iter().all(|(_, eo, ho)| eo == ho) {
        return;
    }
    let absent = PageObs::default();
    for field in page_fields() {
        let (name, get) = (field.name(), |o: &PageObs| field.get(o));
        // Pages absent on both sides agree on this field (a flushed run) if it is defined
        // for an absent page; otherwise they are skipped, as a page-by-page walk would.
        let absent_agrees = get(&absent).is_some();
        // Runs of pages with the same (engine, host) disagreement.
        let mut run: Option<(usize, usize, String, String)> = None;
        let mut flush = |run: &mut Option<(usize, usize, String, String)>, d: &mut Diff<'_>| {
            if let Some((a, b, ev, hv)) = run.take() {
                if lines >= MAX_PAGE_LINES {
                    more += 1;
                    return;
                }
                lines += 1;
                let at = |i: usize| relative(host_start + i as u64 * 4096);
                let what = if a == b {
                    format!("page {} {name}", at(a))
                } else {
                    format!("pages {}..{} {name}", at(a), at(b + 1))
                };
                d.add(Some(proc_name), what, ev, hv);
            }
        };
        let mut next = 0usize;
        for &(i, eo, ho) in &merged {
            if i > next && absent_agrees {
                flush(&mut run, d);
            }
            next = i + 1;
            if eo == ho {
                // Equal pages agree on the field; one where it is not observed is skipped.
                if field.defined(&eo) {
                    flush(&mut run, d);
                }
                continue;
            }
            let (ev, hv) = (get(&eo), get(&ho));
            let (Some(ev), Some(hv)) = (ev, hv) else {
                continue;
            };
            if ev == hv {
                flush(&mut run, d);
                continue;
            }
            match &mut run {
                Some((_, b, rev, rhv)) if *rev == ev && *rhv == hv => *b = i,
                _ => {
                    flush(&mut run, d);
                    run = Some((i, i, ev, hv));
                }
            }
        }
        flush(&mut run, d);
    }
    if more > 0 {
        d.add(
            Some(proc_name),
            "pages".into(),
            format!("{more} more page differences"),
            String::new(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::OracleReport;

    /// The page-by-page comparison the sparse one replaced, kept as its reference.
    fn dense(ep: &[PageObs], hp: &[PageObs], d: &mut Diff<'_>) {
        let mut lines = 0usize;
        let mut more = 0usize;
        for field in page_fields() {
            let (name, get) = (field.name(), |o: &PageObs| field.get(o));
            let mut run: Option<(usize, usize, String, String)> = None;
            let mut flush = |run: &mut Option<(usize, usize, String, String)>, d: &mut Diff<'_>| {
                if let Some((a, b, ev, hv)) = run.take() {
                    if lines >= MAX_PAGE_LINES {
                        more += 1;
                        return;
                    }
                    lines += 1;
                    let what = if a == b {
                        format!("page {a:#x} {name}")
                    } else {
                        format!("pages {a:#x}..{:#x} {name}", b + 1)
                    };
                    d.add(Some("p0"), what, ev, hv);
                }
            };
            for (i, (eo, ho)) in ep.iter().zip(hp).enumerate() {
                let (Some(ev), Some(hv)) = (get(eo), get(ho)) else {
                    continue;
                };
                if ev == hv {
                    flush(&mut run, d);
                    continue;
                }
                match &mut run {
                    Some((_, b, rev, rhv)) if *rev == ev && *rhv == hv => *b = i,
                    _ => {
                        flush(&mut run, d);
                        run = Some((i, i, ev, hv));
                    }
                }
            }
            flush(&mut run, d);
        }
        if more > 0 {
            d.add(
                Some("p0"),
                "pages".into(),
                format!("{more} more page differences"),
                String::new(),
            );
        }
    }

    fn sparse(pages: &[PageObs]) -> VmaPages {
        let mut v = VmaPages {
            count: pages.len(),
            shown: Vec::new(),
        };
        for (i, o) in pages.iter().enumerate() {
            v.push(0, i as u64 * 4096, *o);
        }
        v
    }

    /// A page drawn from a few states, so runs, gaps and one-sided pages all occur.
    fn page(r: u64) -> PageObs {
        let flags = [
            None,
            Some(0),
            Some(KpageFlag::Lru.mask()),
            Some(KpageFlag::Anon.mask()),
        ];
        match r % 6 {
            0..=2 => PageObs::default(),
            3 => PageObs {
                present: true,
                exclusive: true,
                kpageflags: flags[(r / 6 % 4) as usize],
                folio_order: Some((r / 24 % 2) as u32),
                ..PageObs::default()
            },
            4 => PageObs {
                present: true,
                ..PageObs::default()
            },
            // A swap entry, its slot used once or more (exclusive or not), or (not swapped)
            // an exclusive page that is not present, which neither side shows but the merge
            // must still handle.
            _ => PageObs {
                exclusive: !(r / 6).is_multiple_of(3),
                swapped: r / 6 % 3 != 2,
                ..PageObs::default()
            },
        }
    }

    #[test]
    fn sparse_comparison_reports_what_the_dense_one_did() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            seed >> 33
        };
        for case in 0..400 {
            let n = 1 + (next() % 80) as usize;
            let mut ep: Vec<PageObs> = (0..n).map(|_| page(next())).collect();
            // Mostly agreeing sides, with a few pages changed on the host.
            let mut hp = ep.clone();
            for _ in 0..(next() % 6) {
                let i = (next() % n as u64) as usize;
                hp[i] = page(next());
            }
            if case % 7 == 0 {
                ep.iter_mut().for_each(|p| *p = PageObs::default());
            }
            let mut want = OracleReport::new("t");
            dense(
                &ep,
                &hp,
                &mut Diff {
                    line: 1,
                    out: &mut want,
                },
            );
            let mut got = OracleReport::new("t");
            let at = |a: u64| format!("{:#x}", a / 4096);
            compare_pages(
                "p0",
                0,
                &sparse(&ep),
                &sparse(&hp),
                &mut Diff {
                    line: 1,
                    out: &mut got,
                },
                &at,
            );
            assert_eq!(
                got.differences, want.differences,
                "case {case}: {ep:?} / {hp:?}"
            );
        }
    }

    /// A page swapped out on one side only, and a swap entry whose slot is shared on one
    /// side only, are each reported with the field that differs.
    #[test]
    fn swapped_pages_are_compared() {
        let swapped = PageObs {
            swapped: true,
            exclusive: true,
            ..PageObs::default()
        };
        let present = PageObs {
            present: true,
            exclusive: true,
            ..PageObs::default()
        };
        let shared_slot = PageObs {
            swapped: true,
            ..PageObs::default()
        };
        let e = sparse(&[swapped, swapped, present, swapped]);
        let h = sparse(&[swapped, present, present, shared_slot]);
        let mut got = OracleReport::new("t");
        let at = |a: u64| format!("{:#x}", a / 4096);
        let mut d = Diff {
            line: 7,
            out: &mut got,
        };
        compare_pages("p0", 0, &e, &h, &mut d, &at);
        let found: Vec<(String, String, String)> = got
            .differences
            .iter()
            .map(|x| (x.field.clone(), x.engine.clone(), x.host.clone()))
            .collect();
        let want = [
            ("page 0x1 present", "0", "1"),
            ("page 0x3 exclusive", "1", "0"),
            ("page 0x1 swapped", "1", "0"),
        ];
        let want: Vec<(String, String, String)> = want
            .iter()
            .map(|&(f, a, b)| (f.to_string(), a.to_string(), b.to_string()))
            .collect();
        assert_eq!(found, want);
        // Agreeing swap entries report nothing.
        let mut same = OracleReport::new("t");
        let mut d = Diff {
            line: 7,
            out: &mut same,
        };
        compare_pages("p0", 0, &e, &e, &mut d, &at);
        assert!(same.differences.is_empty(), "{same}");
    }
}
