//! Reading back a kernel address space: leaf census, coalesced runs, and invariant checks.
//!
//! Linux counterpart: `arch/arm64/mm/ptdump.c` (the `kernel_page_tables` debugfs file), which
//! walks the tables and prints runs of identical leaves. Reads here go straight to the table
//! frames by physical address, like the hardware walker, and change no counter. The checks of
//! [`KernelSpace::validate`] are the invariants of `research/kernel-algorithms.md` §4.5.

use super::desc::{classify, desc_pa, leaf_prot, DescKind, Pgprot, CONT, TABLE_AF, UXN_TABLE};
use super::geom::{LINEAR_SIZE, PAGE_OFFSET};
use super::{KernelSpace, KmapError};
use std::collections::BTreeMap;

/// The shape of a leaf: level and contiguous hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeafKind {
    /// Hardware level (1 or 2: block; 3: page).
    pub level: u32,
    /// Part of a contiguous run.
    pub cont: bool,
}

/// A run of adjacent leaves of one kind and protection mapping contiguous physical memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeafRun {
    /// First VA.
    pub va: u64,
    /// First PA.
    pub pa: u64,
    /// Bytes.
    pub size: u64,
    /// Leaf shape.
    pub kind: LeafKind,
    /// Leaf protection (see [`super::desc::leaf_prot`]).
    pub prot: Pgprot,
    /// Descriptors in the run.
    pub entries: u64,
}

/// What the linear region of a kernel address space contains.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KmapSummary {
    /// Leaf descriptors by kind.
    pub leaves: BTreeMap<LeafKind, u64>,
    /// Tables reachable in the linear region, by hardware level (the PGD not counted).
    pub tables: [u64; 4],
    /// Coalesced runs, in VA order.
    pub runs: Vec<LeafRun>,
}

impl KmapSummary {
    /// Bytes mapped.
    pub fn mapped_bytes(&self) -> u64 {
        self.runs.iter().map(|r| r.size).sum()
    }
}

/// One step of a walk over the linear region.
enum Visit {
    /// A table descriptor at `level` pointing at a table of `level + 1`.
    Table { level: u32, desc: u64 },
    /// A leaf.
    Leaf { level: u32, va: u64, desc: u64 },
}

impl KernelSpace {
    fn visit_linear(
        &self,
        f: &mut dyn FnMut(&KernelSpace, Visit) -> Result<(), KmapError>,
    ) -> Result<(), KmapError> {
        let g = self.granule;
        let top = g.top_level();
        let first = g.index(PAGE_OFFSET, top);
        let last = g.index(PAGE_OFFSET + LINEAR_SIZE - 1, top);
        for i in first..=last {
            let va = PAGE_OFFSET | (i << g.shift(top));
            let desc = self.pool.load(self.pgd + i * 8)?;
            self.visit_entry(top, va, desc, f)?;
        }
        Ok(())
    }

    fn visit_entry(
        &self,
        level: u32,
        va: u64,
        desc: u64,
        f: &mut dyn FnMut(&KernelSpace, Visit) -> Result<(), KmapError>,
    ) -> Result<(), KmapError> {
        let g = self.granule;
        match classify(desc, level, g) {
            DescKind::Invalid if desc == 0 => Ok(()),
            DescKind::Table => {
                f(self, Visit::Table { level, desc })?;
                let table = desc_pa(desc, g);
                let child = level + 1;
                for i in 0..g.entries(child) {
                    let d = self.pool.load(table + i * 8)?;
                    self.visit_entry(child, va + (i << g.shift(child)), d, f)?;
                }
                Ok(())
            }
            DescKind::Block | DescKind::Page => f(self, Visit::Leaf { level, va, desc }),
            DescKind::Invalid | DescKind::Reserved => {
                Err(KmapError::BadDescriptor { va, level, desc })
            }
        }
    }

    /// Census and runs of the linear region.
    pub fn summary(&self) -> Result<KmapSummary, KmapError> {
        let g = self.granule;
        let mut s = KmapSummary::default();
        let mut cur: Option<LeafRun> = None;
        self.visit_linear(&mut |_, v| {
            match v {
                Visit::Table { level, .. } => s.tables[(level + 1) as usize] += 1,
                Visit::Leaf { level, va, desc } => {
                    let kind = LeafKind {
                        level,
                        cont: desc & CONT != 0,
                    };
                    *s.leaves.entry(kind).or_default() += 1;
                    let (pa, size, prot) =
                        (desc_pa(desc, g), g.entry_size(level), leaf_prot(desc, g));
                    match &mut cur {
                        Some(r)
                            if r.kind == kind
                                && r.prot == prot
                                && r.va + r.size == va
                                && r.pa + r.size == pa =>
                        {
                            r.size += size;
                            r.entries += 1;
                        }
                        _ => {
                            if let Some(r) = cur.take() {
                                s.runs.push(r);
                            }
                            cur = Some(LeafRun {
                                va,
                                pa,
                                size,
                                kind,
                                prot,
                                entries: 1,
                            });
                        }
                    }
                }
            }
            Ok(())
        })?;
        s.runs.extend(cur);
        Ok(s)
    }

    /// Checks the structural invariants of the kernel tables:
    /// * every table allocated is reachable (none leaked, none replaced by a block);
    /// * every leaf's VA and PA are aligned to its size, and VA maps to `__va(PA)`;
    /// * contiguous groups are whole: aligned, all valid with CONT, consecutive PAs, one prot;
    /// * every table descriptor has UXNTable and the table AF;
    /// * no fixmap slot is set and no TLB entry caches one.
    pub fn validate(&self) -> Result<(), KmapError> {
        let g = self.granule;
        let bad = |s: String| Err(KmapError::Invariant(s));
        let mut reachable = 0u64;
        let mut problem: Option<String> = None;
        self.visit_linear(&mut |ks, v| {
            match v {
                Visit::Table { level, desc } => {
                    reachable += 1;
                    if desc & UXN_TABLE == 0 || desc & TABLE_AF == 0 {
                        problem.get_or_insert(format!(
                            "table descriptor {desc:#x} at level {level} lacks UXNTable/AF"
                        ));
                    }
                    if level + 1 >= 2 {
                        if let Err(e) = ks.check_cont_groups(desc_pa(desc, g), level + 1) {
                            problem.get_or_insert(e);
                        }
                    }
                }
                Visit::Leaf { level, va, desc } => {
                    let size = g.entry_size(level);
                    let pa = desc_pa(desc, g);
                    if (va | pa) & (size - 1) != 0 {
                        problem.get_or_insert(format!(
                            "misaligned level-{level} leaf {va:#x} -> {pa:#x}"
                        ));
                    }
                    if ks.phys_to_virt(pa) != va {
                        problem
                            .get_or_insert(format!("{va:#x} maps {pa:#x}, not its linear address"));
                    }
                }
            }
            Ok(())
        })?;
        if let Some(p) = problem {
            return bad(p);
        }
        let fixmap_tables = self.image_tables - 1;
        let in_use = self.pool.tables_in_use();
        if reachable + self.image_tables != in_use {
            return bad(format!(
                "{in_use} tables allocated but {reachable} linear + {fixmap_tables} fixmap + pgd reachable"
            ));
        }
        let slots = self.fixmap_slots_in_use();
        if !slots.is_empty() || self.slots.iter().any(Option::is_some) {
            return bad(format!("fixmap slots still set: {slots:?}"));
        }
        if self.fixmap_tlb_entries() != 0 {
            return bad("a TLB entry still caches a fixmap slot".into());
        }
        Ok(())
    }

    /// Checks every contiguous group of one PMD/PTE table.
    fn check_cont_groups(&self, table: u64, level: u32) -> Result<(), String> {
        let g = self.granule;
        let n = g.cont_entries(level);
        let size = g.entry_size(level);
        let load = |i: u64| self.pool.load(table + i * 8).map_err(|e| e.to_string());
        for group in 0..g.entries(level) / n {
            let base = group * n;
            let first = load(base)?;
            let any_cont = (base..base + n)
                .try_fold(false, |acc, i| Ok::<_, String>(acc || load(i)? & CONT != 0))?;
            if !any_cont {
                continue;
            }
            let leaf = |d: u64| matches!(classify(d, level, g), DescKind::Block | DescKind::Page);
            let pa0 = desc_pa(first, g);
            if pa0 & (g.cont_size(level) - 1) != 0 {
                return Err(format!("contiguous group at {pa0:#x} not aligned"));
            }
            for (k, i) in (base..base + n).enumerate() {
                let d = load(i)?;
                if !leaf(d) || d & CONT == 0 {
                    return Err(format!("incomplete contiguous group: entry {i} = {d:#x}"));
                }
                if desc_pa(d, g) != pa0 + k as u64 * size || leaf_prot(d, g) != leaf_prot(first, g)
                {
                    return Err(format!(
                        "contiguous group entry {i} = {d:#x} breaks the run"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Human label of a leaf kind for a granule, e.g. `2M block`, `64K cont (16x4K)`.
pub fn leaf_label(kind: LeafKind, granule: super::Granule) -> String {
    let size = granule.entry_size(kind.level);
    let what = if kind.level == 3 { "page" } else { "block" };
    if kind.cont {
        let n = granule.cont_entries(kind.level);
        format!("{} cont {what}s ({n}x{})", human(size * n), human(size))
    } else {
        format!("{} {what}", human(size))
    }
}

/// `4K`, `2M`, `1G`, ... (two decimals when not a whole number of the largest unit).
pub fn human(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "T"),
        (1 << 30, "G"),
        (1 << 20, "M"),
        (1 << 10, "K"),
    ];
    for (u, s) in UNITS {
        if bytes >= u {
            return if bytes & (u - 1) == 0 {
                format!("{}{s}", bytes / u)
            } else {
                format!("{:.2}{s}", bytes as f64 / u as f64)
            };
        }
    }
    format!("{bytes}")
}
