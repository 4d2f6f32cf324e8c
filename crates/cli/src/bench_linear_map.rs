//! `usermm bench linear-map`: seed 002's table — `map_mem` time for 16…512 GiB of RAM,
//! page-granular and with blocks, for every `linear_map` variant, with TLBIs and tables.
//!
//! Each measurement builds a fresh kernel address space whose table pool is pre-faulted (the
//! host's first-touch cost is not the model's), then times `map_mem` only. Time is reported
//! twice: with the hardware TLBI latency calibrated from the seed ([`SEED_TLBI_NS`]) and with
//! the engine alone (latency 0). Counters are deterministic, so one repetition's are shown.
//! The page-table pool holds every table: a 512 GiB page-granular map needs about 1 GiB.

use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use std::time::Instant;
use usermm::kmap::{
    Granule, KernelSpace, KmapConfig, KmapStats, LinearGranularity, LinearMapVariant, Prefault,
    RamLayout, SEED_TLBI_NS,
};

/// Seed 002's published `map_mem` change, merged patch vs before (16/64/256/512 GiB).
const SEED: [(u64, &str); 4] = [(16, "-15%"), (64, "-33%"), (256, "-31%"), (512, "-24%")];

/// One measured configuration.
struct Cell {
    ms: f64,
    stats: KmapStats,
}

/// Best of the repetitions: the host is shared, and interference only ever adds time.
fn best(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn ms(v: f64) -> String {
    if v < 1.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.1}")
    }
}

/// Builds a pre-faulted kernel space for `gib` of RAM and times one `map_mem`.
fn run_once(
    gib: u64,
    gran: LinearGranularity,
    variant: LinearMapVariant,
    tlbi_ns: u64,
) -> anyhow::Result<(f64, KmapStats)> {
    let layout = RamLayout::single(gib << 30);
    let mut cfg = KmapConfig::for_layout(&layout, Granule::K4, gran);
    cfg.tlbi_latency_ns = tlbi_ns;
    cfg.prefault = Prefault::Touch;
    let mut ks = KernelSpace::new(&layout, &cfg)?;
    let t = Instant::now();
    ks.map_mem(gran, variant)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    Ok((ms, ks.stats().clone()))
}

fn pct(new: f64, base: f64) -> String {
    format!("{:+.0}%", (new / base - 1.0) * 100.0)
}

/// Every variant for one row; repetitions are interleaved across variants so that a burst of
/// host interference does not land on one variant only.
fn row_cells(
    gib: u64,
    gran: LinearGranularity,
    tlbi_ns: u64,
    reps: usize,
) -> anyhow::Result<Vec<Cell>> {
    let mut times = vec![Vec::with_capacity(reps); LinearMapVariant::ALL.len()];
    let mut stats = vec![KmapStats::default(); LinearMapVariant::ALL.len()];
    for _ in 0..reps.max(1) {
        for (i, &v) in LinearMapVariant::ALL.iter().enumerate() {
            let (ms, st) = run_once(gib, gran, v, tlbi_ns)?;
            times[i].push(ms);
            stats[i] = st;
        }
    }
    Ok(times
        .iter()
        .zip(stats)
        .map(|(t, stats)| Cell { ms: best(t), stats })
        .collect())
}

fn print_table(title: &str, rows: &[(u64, LinearGranularity, Vec<Cell>)]) {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    let mut header = vec!["RAM".to_string(), "leaves".into(), "tables".into()];
    for v in LinearMapVariant::ALL {
        header.push(format!("{}\nms (% vs rpc)", v.name()));
        header.push("TLBIs".into());
    }
    header.push("single_map vs\nremap_alloc_populate".into());
    header.push("seed\n(merged vs before)".into());
    t.set_header(header);
    for (gib, gran, cells) in rows {
        let base = cells[0].ms;
        let mut row = vec![
            format!("{gib}G"),
            gran.name().to_string(),
            cells[2].stats.tables_total().to_string(),
        ];
        for (i, c) in cells.iter().enumerate() {
            if i == 0 {
                row.push(ms(c.ms));
            } else {
                row.push(format!("{} ({})", ms(c.ms), pct(c.ms, base)));
            }
            row.push(c.stats.tlbi().to_string());
        }
        row.push(pct(cells[2].ms, cells[1].ms));
        let seed = SEED
            .iter()
            .find(|(g, _)| g == gib)
            .filter(|_| *gran == LinearGranularity::ForcePages)
            .map_or("", |(_, s)| s);
        row.push(seed.to_string());
        t.add_row(row);
    }
    println!("\n{title}\n{t}");
}

/// Runs the seed-002 benchmark for the given RAM sizes (GiB) with `reps` repetitions.
pub fn bench_linear_map(sizes_gib: &[u64], reps: usize) -> anyhow::Result<()> {
    bench_linear_map_with(sizes_gib, reps, SEED_TLBI_NS)
}

/// As [`bench_linear_map`] with an explicit per-TLBI hardware latency (ns).
pub fn bench_linear_map_with(sizes_gib: &[u64], reps: usize, tlbi_ns: u64) -> anyhow::Result<()> {
    println!(
        "linear map creation (map_mem), 4K granule, best of {reps}; RAM at 1 GiB with a {} MiB kernel image hole",
        usermm::kmap::KERNEL_IMAGE_SIZE >> 20
    );
    println!(
        "table pool sized per run (512G page-granular: {} MiB, pre-faulted)",
        usermm::kmap::pool_bytes_for(
            &RamLayout::single(512 << 30),
            Granule::K4,
            LinearGranularity::ForcePages,
            0
        ) >> 20
    );
    let mut modelled = Vec::new();
    let mut engine = Vec::new();
    for &gib in sizes_gib {
        for gran in [LinearGranularity::ForcePages, LinearGranularity::Blocks] {
            modelled.push((gib, gran, row_cells(gib, gran, tlbi_ns, reps)?));
            if tlbi_ns != 0 {
                engine.push((gib, gran, row_cells(gib, gran, 0, reps)?));
            }
        }
    }
    print_table(
        &format!("with the hardware TLBI latency model ({tlbi_ns} ns per TLBI, calibrated from the seed)"),
        &modelled,
    );
    if !engine.is_empty() {
        print_table("engine only (TLBI latency 0): the software cost of the same work", &engine);
    }
    println!("TLBIs per fully populated table: remap_per_cont 33, remap_alloc_populate 2, single_map 1 (va_late: 1 early, 0 late)");
    Ok(())
}
