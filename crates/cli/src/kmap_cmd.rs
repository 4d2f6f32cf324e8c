//! `usermm kmap`: build the arm64 kernel linear map for a RAM layout and show the result —
//! coalesced runs of leaves, leaf sizes, tables per level, and what it cost (TLBIs, fixmap
//! remaps, barriers, time). Seed 002.

use anyhow::Context;
use clap::Args;
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use std::time::Instant;
use usermm::kmap::dump::{human, leaf_label};
use usermm::kmap::{
    desc::{MemType, RDONLY, WRITE},
    Granule, KernelSpace, KmapConfig, LinearGranularity, LinearMapVariant, PhysRange, Prefault,
    RamLayout, SEED_TLBI_NS,
};

/// Arguments of `usermm kmap`.
#[derive(Args, Debug)]
pub struct KmapArgs {
    /// RAM size when --ranges is not given: one range at 1 GiB (e.g. 4G, 512G).
    #[arg(long, default_value = "4G")]
    pub ram: String,
    /// RAM ranges instead: START-END or START+SIZE, comma separated (e.g. 1G+3G,8G-9G).
    /// The kernel image sits 2 MiB into the first range.
    #[arg(long)]
    pub ranges: Option<String>,
    /// Force page granularity (rodata=full, debug_pagealloc): no blocks, no contiguous runs.
    #[arg(long)]
    pub pages: bool,
    /// How tables are reached: remap_per_cont, remap_alloc_populate, single_map, va_late.
    #[arg(long, default_value = "single_map")]
    pub variant: String,
    /// Translation granule: 4K, 16K or 64K.
    #[arg(long, default_value = "4K")]
    pub granule: String,
    /// Hardware latency charged per TLBI, in ns (0 = engine time only).
    #[arg(long, default_value_t = SEED_TLBI_NS,
          value_parser = clap::value_parser!(u64).range(0..=MAX_TLBI_NS))]
    pub tlbi_ns: u64,
    /// Print every run of leaves (by default at most 64).
    #[arg(long)]
    pub all_runs: bool,
    /// Print the result as one JSON document (every run of leaves; docs/cli-json.md).
    #[arg(long)]
    pub json: bool,
}

/// The largest TLBI latency accepted (100 µs, ~70x the seed's 1.5 µs): each TLBI busy-waits
/// this long, and a map has hundreds of thousands of them.
const MAX_TLBI_NS: u64 = 100_000;

/// A size of `--ram` or `--ranges` (`4096`, `0x1000`, `64K`, `2M`, `1G`: the workspace's one
/// grammar, `usermm::units::parse_size_arg`), spaces around it allowed (`0-1G, 2G+1G`).
fn size_arg(s: &str) -> anyhow::Result<u64> {
    Ok(usermm::units::parse_size_arg(s.trim())?)
}

/// Parses `START-END` / `START+SIZE` lists.
fn parse_ranges(s: &str) -> anyhow::Result<Vec<PhysRange>> {
    s.split(',')
        .map(|part| {
            if let Some((a, b)) = part.split_once('+') {
                let start = size_arg(a)?;
                let end = start
                    .checked_add(size_arg(b)?)
                    .with_context(|| format!("range `{part}` overflows"))?;
                Ok(PhysRange::new(start, end))
            } else if let Some((a, b)) = part.split_once('-') {
                Ok(PhysRange::new(size_arg(a)?, size_arg(b)?))
            } else {
                anyhow::bail!("range `{part}` is not START-END or START+SIZE")
            }
        })
        .collect()
}

fn prot_label(prot: usermm::kmap::Pgprot) -> String {
    let ty = MemType::of(prot.0).map_or("?", MemType::name);
    let rw = if prot.0 & RDONLY != 0 || prot.0 & WRITE == 0 {
        "ro"
    } else {
        "rw"
    };
    format!("{rw} {ty}")
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header(header.iter().copied());
    t
}

/// Runs `usermm kmap`.
pub fn kmap_main(args: &KmapArgs) -> anyhow::Result<()> {
    let granule = Granule::parse(&args.granule)
        .with_context(|| format!("unknown granule `{}` (4K, 16K, 64K)", args.granule))?;
    let variant = LinearMapVariant::parse(&args.variant).with_context(|| {
        format!(
            "unknown variant `{}` ({})",
            args.variant,
            LinearMapVariant::VALUES
        )
    })?;
    let layout = match &args.ranges {
        Some(r) => RamLayout::with_ranges(parse_ranges(r)?),
        None => RamLayout::single(size_arg(&args.ram)?),
    };
    let gran = if args.pages {
        LinearGranularity::ForcePages
    } else {
        LinearGranularity::Blocks
    };
    let mut cfg = KmapConfig::for_layout(&layout, granule, gran);
    cfg.tlbi_latency_ns = args.tlbi_ns;
    cfg.prefault = Prefault::Touch;
    let mut ks = KernelSpace::new(&layout, &cfg)?;
    let t = Instant::now();
    ks.map_mem(gran, variant)?;
    let elapsed = t.elapsed();
    ks.validate()?;
    let summary = ks.summary()?;
    let st = ks.stats();
    if args.json {
        let runs: Vec<_> = summary
            .runs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "va": r.va, "pa": r.pa, "size": r.size,
                    "leaf": leaf_label(r.kind, granule), "entries": r.entries,
                    "prot": prot_label(r.prot),
                })
            })
            .collect();
        let leaves: Vec<_> = summary
            .leaves
            .iter()
            .map(|(kind, n)| {
                serde_json::json!({
                    "leaf": leaf_label(*kind, granule), "descriptors": n,
                    "bytes": n * granule.entry_size(kind.level),
                })
            })
            .collect();
        let levels: Vec<_> = (granule.top_level() + 1..=3)
            .map(|level| {
                let l = level as usize;
                serde_json::json!({
                    "level": level, "name": granule.level_name(level),
                    "tables_allocated": st.tables_allocated[l],
                    "reachable": summary.tables[l], "tlbi": st.tlbi_page_by_level[l],
                })
            })
            .collect();
        let cost: serde_json::Map<String, serde_json::Value> = st
            .pairs()
            .into_iter()
            .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
            .collect();
        let out = serde_json::json!({
            "ram_bytes": layout.total(),
            "ranges": layout.ranges.iter().map(|r| [r.start, r.end]).collect::<Vec<_>>(),
            "kernel_image": [layout.kernel_image.start, layout.kernel_image.end],
            "granule": granule.name(),
            "granularity": gran.name(),
            "variant": variant.name(),
            "tlbi_ns": args.tlbi_ns,
            "map_mem_seconds": elapsed.as_secs_f64(),
            "phys_offset": ks.phys_offset(),
            "image_tables": ks.image_tables(),
            "runs": runs,
            "leaves": leaves,
            "levels": levels,
            "cost": cost,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }

    println!(
        "linear map of {} in {} range(s), {} granule, {}, variant {} (TLBI latency {} ns)",
        human(layout.total()),
        layout.ranges.len(),
        granule.name(),
        gran.name(),
        variant.name(),
        args.tlbi_ns
    );
    println!(
        "map_mem: {:.3} ms; PHYS_OFFSET {:#x}; kernel image (NOMAP during the loop) {:#x}-{:#x}; table pool {:#x}-{:#x}",
        elapsed.as_secs_f64() * 1e3,
        ks.phys_offset(),
        layout.kernel_image.start,
        layout.kernel_image.end,
        ks.pool_range().start,
        ks.pool_range().end
    );

    let mut runs = table(&["virtual", "physical", "size", "leaves", "entries", "prot"]);
    let limit = if args.all_runs { usize::MAX } else { 64 };
    for r in summary.runs.iter().take(limit) {
        runs.add_row([
            format!("{:#x}-{:#x}", r.va, r.va + r.size),
            format!("{:#x}", r.pa),
            human(r.size),
            leaf_label(r.kind, granule),
            r.entries.to_string(),
            prot_label(r.prot),
        ]);
    }
    println!("\nMapped ranges (coalesced runs of identical leaves)\n{runs}");
    if summary.runs.len() > limit {
        println!("... {} more runs (--all-runs)", summary.runs.len() - limit);
    }

    let mut leaves = table(&["leaf", "descriptors", "bytes mapped"]);
    let mut kinds: Vec<_> = summary.leaves.iter().collect();
    kinds.sort_by_key(|(k, _)| {
        std::cmp::Reverse(
            granule.entry_size(k.level)
                * if k.cont {
                    granule.cont_entries(k.level)
                } else {
                    1
                },
        )
    });
    for (kind, n) in kinds {
        leaves.add_row([
            leaf_label(*kind, granule),
            n.to_string(),
            human(n * granule.entry_size(kind.level)),
        ]);
    }
    println!("\nLeaf sizes\n{leaves}");

    let mut tables = table(&["level", "tables allocated", "reachable", "TLBIs charged"]);
    for level in granule.top_level() + 1..=3 {
        let l = level as usize;
        tables.add_row([
            format!("L{level} ({})", granule.level_name(level)),
            st.tables_allocated[l].to_string(),
            summary.tables[l].to_string(),
            st.tlbi_page_by_level[l].to_string(),
        ]);
    }
    println!(
        "\nTables ({} KiB each; plus {} image tables: swapper_pg_dir and the fixmap's)\n{tables}",
        granule.page_size() >> 10,
        ks.image_tables()
    );

    let mut cost = table(&["counter", "value"]);
    for (k, v) in st.pairs() {
        cost.add_row([k.to_string(), v.to_string()]);
    }
    let per_table = st.tlbi() as f64 / st.tables_total().max(1) as f64;
    cost.add_row(["TLBIs per table".to_string(), format!("{per_table:.2}")]);
    println!("\nCost\n{cost}");
    Ok(())
}
