//! Seed 002: `map_mem` time — creating the arm64 kernel linear map for 16…512 GiB of RAM,
//! page-granular and with blocks, for every `linear_map` variant, with TLBIs and tables.
//!
//! Each measurement builds a fresh kernel address space whose table pool is pre-faulted (the
//! host's first-touch cost is not the model's), then times `map_mem` only. Two tables from
//! the same measurements: the engine alone (TLBI latency 0), and with the hardware TLBI
//! latency calibrated from the seed added to each sample as TLBIs × latency. The engine can
//! spin for that latency at each TLBI instead (`usermm kmap --tlbi-ns`); the expectation is
//! the same, and the suite saves the spinning (12 s of the 64 GiB page-granular row alone).
//! The seed's "before" is `remap_alloc_populate` (patches 1–2 applied), its "after"
//! `single_map`, so that is the baseline here. The host cannot run this (arm64 boot code).

use crate::ctx::Ctx;
use crate::model::{Better, Column, Published, Row, SeedSign, Stat, Table, Unit, Variant};
use std::collections::BTreeMap;
use std::time::Instant;
use usermm::kmap::{
    Granule, KernelSpace, KmapConfig, KmapStats, LinearGranularity, LinearMapVariant, Prefault,
    RamLayout, SEED_TLBI_NS,
};

/// Seed 002's published `map_mem` change, merged patch vs before (16/64/256/512 GiB).
const SEED: [(u64, &str); 4] = [(16, "-15%"), (64, "-33%"), (256, "-31%"), (512, "-24%")];
const BASELINE: &str = "remap_alloc_populate";

/// Builds a pre-faulted kernel space for `gib` of RAM and times one `map_mem` (TLBI latency 0).
fn run_once(
    gib: u64,
    gran: LinearGranularity,
    variant: LinearMapVariant,
) -> anyhow::Result<(f64, KmapStats)> {
    let layout = RamLayout::single(gib << 30);
    let mut cfg = KmapConfig::for_layout(&layout, Granule::K4, gran);
    cfg.tlbi_latency_ns = 0;
    cfg.prefault = Prefault::Touch;
    let mut ks = KernelSpace::new(&layout, &cfg)?;
    let t = Instant::now();
    ks.map_mem(gran, variant)?;
    let secs = t.elapsed().as_secs_f64();
    Ok((secs, ks.stats().clone()))
}

/// The kmap statistics as counters.
fn kmap_counters(s: &KmapStats) -> BTreeMap<String, u64> {
    [
        ("tables", s.tables_total()),
        ("tlbi", s.tlbi()),
        ("tlbi_page", s.tlbi_page),
        ("tlbi_all", s.tlbi_all),
        ("tables_zeroed", s.tables_zeroed),
        ("fixmap_maps", s.fixmap_maps),
        ("fixmap_unmaps", s.fixmap_unmaps),
        ("entries_written", s.entries_written),
        ("dsb", s.dsb),
        ("isb", s.isb),
        ("tlb_hits", s.tlb_hits),
        ("tlb_misses", s.tlb_misses),
    ]
    .into_iter()
    .filter(|(_, v)| *v != 0)
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// One row: every variant, repetitions interleaved across variants (TLBI latency 0).
fn row(ctx: &Ctx<'_>, gib: u64, gran: LinearGranularity) -> anyhow::Result<Row> {
    let mut cols: Vec<Column> = LinearMapVariant::ALL
        .iter()
        .map(|v| Column::new(v.name(), vec![], BTreeMap::new()))
        .collect();
    let label = format!("{gib}G {}", gran.name());
    let mut reps = ctx.repetitions(&variants(), BASELINE, Better::Lower);
    while let Some(rep) = reps.next(&cols) {
        for i in crate::stats::rotation(rep, LinearMapVariant::ALL.len()) {
            let v = LinearMapVariant::ALL[i];
            let (secs, st) = run_once(gib, gran, v)?;
            cols[i].samples.push(secs);
            cols[i].counters = kmap_counters(&st);
            ctx.task.step(&format!("{label} {}", v.name()))?;
        }
    }
    let published = SEED
        .iter()
        .filter(|(g, _)| *g == gib && gran == LinearGranularity::ForcePages)
        .map(|(_, t)| Published::parse("single_map", t, SeedSign::TimeChange))
        .collect();
    Ok(Row {
        label,
        columns: cols,
        published,
        layout: None,
    })
}

/// Measurements of both tables (for the progress bar).
pub fn steps(reps: usize, sizes: usize) -> u64 {
    (reps * sizes * 2 * LinearMapVariant::ALL.len()) as u64
}

/// `row` with `tlbi_ns` added to every sample per TLBI its variant made.
fn with_tlbi_latency(row: &Row, tlbi_ns: u64) -> Row {
    let mut out = row.clone();
    for c in &mut out.columns {
        let extra = c.counters.get("tlbi").copied().unwrap_or(0) as f64 * tlbi_ns as f64 * 1e-9;
        for s in &mut c.samples {
            *s += extra;
        }
    }
    out
}

fn variants() -> Vec<Variant> {
    LinearMapVariant::ALL
        .iter()
        .map(|v| {
            let about = match v {
                LinearMapVariant::RemapPerCont => "before the series: a fixmap remap per contiguous chunk plus one to zero (33 TLBIs per table)",
                LinearMapVariant::RemapAllocPopulate => "patches 1-2: one remap to zero, one to populate (2 TLBIs per table); the seed's 'before'",
                LinearMapVariant::SingleMap => "merged: one remap per table for zeroing and populating (1 TLBI); the seed's 'after'",
                LinearMapVariant::VaLate => "the v1 idea: as single_map early, no fixmap once the linear map exists",
            };
            Variant::engine(v.name(), about)
        })
        .collect()
}

/// The two tables: with the TLBI latency model, and the engine alone.
pub fn tables(ctx: &Ctx<'_>) -> anyhow::Result<Vec<Table>> {
    let mut measured = Vec::new();
    for &gib in &ctx.opts.linear_map_gib {
        for gran in [LinearGranularity::ForcePages, LinearGranularity::Blocks] {
            measured.push(row(ctx, gib, gran)?);
        }
    }
    let mut out = Vec::new();
    for (id, tlbi_ns) in [("linear-map", ctx.opts.tlbi_ns), ("linear-map-engine", 0)] {
        let rows = measured
            .iter()
            .map(|r| with_tlbi_latency(r, tlbi_ns))
            .collect();
        let title = if tlbi_ns == 0 {
            "arm64 linear map creation (map_mem), engine only (TLBI latency 0)".to_string()
        } else {
            format!("arm64 linear map creation (map_mem), {tlbi_ns} ns per TLBI (calibrated from the seed)")
        };
        out.push(Table {
        host_matches: None,
        cost_model: None,
            id: id.into(),
            title,
            seed: Some("002".into()),
            metric: "map_mem() time".into(),
            unit: Unit::Seconds,
            better: Better::Lower,
            stats: vec![Stat::Min, Stat::Median, Stat::Max],
            baseline: BASELINE.into(),
            variants: variants(),
            row_label: "RAM and leaves".into(),
            rows,
            counters_shown: vec!["tables".into(), "tlbi".into(), "fixmap_maps".into(), "entries_written".into()],
            published_source: Some(
                "map_mem() before/after patch 3/4 (Apple M2 VM 16G, Ampere Altra VM 64G/256G, metal 512G), page-granular".into(),
            ),
            notes: vec![
                format!(
                    "4K granule; RAM at 1 GiB with a {} MiB kernel image hole; table pool pre-faulted",
                    usermm::kmap::KERNEL_IMAGE_SIZE >> 20
                ),
                "TLBIs per fully populated table: remap_per_cont 33, remap_alloc_populate 2, single_map 1 (va_late: 1 early, 0 late)".into(),
                "both tables come from the same measurements (TLBI latency 0); with a latency, each sample is the measured time plus TLBIs × the latency".into(),
                "host: n/a (arm64 boot-time code; not reachable from user space)".into(),
            ],
        });
    }
    Ok(out)
}

/// The default TLBI latency of the model.
pub const DEFAULT_TLBI_NS: u64 = SEED_TLBI_NS;
