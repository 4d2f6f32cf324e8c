//! Seed 001: the spawn benchmark — fork+exit rate of a process with 21 + N VMAs, the child
//! VMA tree built by insertion (before) or by `__mt_dup` (seed 001), and the host kernel's
//! fork+exit+wait rate with N extra single-page VMAs.

use crate::columns::EngineColumn;
use crate::ctx::Ctx;
use crate::engine::{counters, machine, RO, RW};
use crate::host::agent::{self, HostCell};
use crate::model::{Better, Column, Published, Row, SeedSign, Stat, Table, Unit, Variant};
use std::collections::BTreeMap;
use std::time::Instant;
use usermm::tunables::VmaTreeCopy;
use usermm::{Ev, MmapArgs, Placement, Privilege};

/// The extra VMA counts of the seed's table.
pub const EXTRA: [u64; 8] = [0, 100, 200, 400, 800, 1600, 3200, 6400];

/// Seed 001's published change (forks per 10 s, next-20230829 vs the series).
const SEED: [(u64, &str); 8] = [
    (0, "+2.37%"),
    (100, "+13.09%"),
    (200, "+20.23%"),
    (400, "+26.39%"),
    (800, "+38.18%"),
    (1600, "+44.66%"),
    (3200, "+47.92%"),
    (6400, "+52.98%"),
];

/// The counters of the work of the bulk-load stores that built the child's VMA tree
/// (`maple::StoreWork`), as the spawn table reports them; the cost model prices them.
pub const STORE_WORK_COUNTERS: [&str; 4] = [
    "maple_appends",
    "maple_gap_updates",
    "maple_splits",
    "maple_pushes",
];

/// A machine with one process of `21 + extra` VMAs (21 written, `extra` read-only, empty),
/// set as `column`.
fn setup(extra: u64, column: &EngineColumn) -> anyhow::Result<(usermm::Machine, usermm::Pid)> {
    let m = machine(64 << 20, 4096);
    column.apply(&m)?;
    let p;
    {
        let cpu = m.enter_cpu(0)?;
        p = cpu.spawn(Privilege::Ordinary, 8 << 20)?;
        for i in 0..21 + extra {
            let a = 0x1000_0000 + i * 0x2000;
            let args = MmapArgs {
                placement: Placement::Fixed(a),
                ..MmapArgs::anon(4096, if i < 21 { RW } else { RO })
            };
            cpu.mmap(p, args)?;
            if i < 21 {
                cpu.write_fill(p, a, 4096, 1).map_err(crate::engine::sig)?;
            }
        }
    }
    Ok((m, p))
}

/// The node statistics of a process's VMA tree and the work its bulk-load stores did.
fn tree_stats(
    m: &usermm::Machine,
    p: usermm::Pid,
) -> anyhow::Result<(maple::TreeStats, maple::StoreWork)> {
    let task = m.task(p)?;
    let st = task.mm.lock.read();
    Ok((st.vmas.tree.stats(), st.vmas.tree.store_work()))
}

/// Forks+exits per second for `secs`, and the exact counters of one fork+exit, with the
/// child's VMA-tree nodes: allocated while it was built (`maple_nodes_allocated`; the
/// inserted tree has a node cache of its own, the duplicated one shares the parent's) and
/// in the finished tree (`maple_tree_nodes`); and the work of the stores that built it
/// ([`STORE_WORK_COUNTERS`], see `maple::StoreWork`; all 0 for `dup`, which stores
/// nothing).
fn engine_rate(
    extra: u64,
    column: &EngineColumn,
    secs: f64,
) -> anyhow::Result<(f64, BTreeMap<String, u64>)> {
    let (m, p) = setup(extra, column)?;
    let mode = m.tunables().vma_tree_dup;
    let cpu = m.enter_cpu(0)?;
    let before = m.counters();
    let (parent, _) = tree_stats(&m, p)?;
    let c = cpu.fork(p)?;
    let (child, work) = tree_stats(&m, c)?;
    cpu.exit(c)?;
    let mut one = counters(&m.counters().delta(&before));
    let allocated = match mode {
        VmaTreeCopy::Insert => child.allocated,
        VmaTreeCopy::Dup => child.allocated.saturating_sub(parent.allocated),
    };
    one.insert("maple_nodes_allocated".into(), allocated);
    one.insert("maple_tree_nodes".into(), child.nodes as u64);
    let work = [work.appends, work.gap_updates, work.splits, work.pushes];
    for (name, n) in STORE_WORK_COUNTERS.into_iter().zip(work) {
        one.insert(name.into(), n);
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        let c = cpu.fork(p)?;
        cpu.exit(c)?;
        n += 1;
    }
    Ok((n as f64 / start.elapsed().as_secs_f64(), one))
}

/// The host's rate for a process of `21 + extra` VMAs in all, measured by a fresh agent
/// process that adds as many single-page VMAs as it lacks.
fn host_rate(extra: u64, secs: f64) -> Result<(f64, BTreeMap<String, u64>), String> {
    agent::measure(&HostCell::Spawn {
        vmas: 21 + extra,
        secs,
    })
}

/// Measurements (for the progress bar) with `engine` engine columns (0: the table's own).
pub fn steps(reps: usize, points: usize, engine: usize) -> u64 {
    let engine = if engine == 0 {
        own_columns().len()
    } else {
        engine
    };
    (reps * points * (engine + 2)) as u64
}

/// The table's own engine columns (the first is the baseline).
fn own_columns() -> Vec<EngineColumn> {
    vec![
        EngineColumn::new("insert", "the child's VMA tree built in bulk mode, VMA by VMA into full leaves (dup_mmap of Linux 6.1 until seed 001, as in its baseline next-20230829)", &[("vma_tree_dup", "insert")]),
        EngineColumn::new("dup", "__mt_dup: the tree's nodes duplicated top-down, entries replaced (seed 001)", &[("vma_tree_dup", "dup")]),
    ]
}

/// The columns: the engine's, the baseline's A/A control, the host.
fn variants(engine: &[EngineColumn]) -> Vec<Variant> {
    let mut v: Vec<Variant> = engine.iter().map(EngineColumn::variant).collect();
    v.push(Variant::control(&engine[0].name));
    v.push(Variant::host("the host kernel: fork + child _exit + waitpid of a fresh agent process with 21 + N VMAs in all (the static spawn agent where the build has one)"));
    v
}

fn published(extra: u64) -> Vec<Published> {
    SEED.iter()
        .filter(|(e, _)| *e == extra)
        .map(|(_, t)| Published::parse("dup", t, SeedSign::Gain))
        .collect()
}

/// The spawn table.
pub fn table(ctx: &Ctx<'_>) -> anyhow::Result<Table> {
    let secs = ctx.opts.spawn_seconds;
    let host_ok = ctx.host.enabled();
    // The machine-wide lock when it can be had (root), as the other host tables hold it: no
    // oracle run or recording beside the timed cells, and a running DAMON monitor paused.
    // Without it the host column still runs (spawn needs no knob).
    let _session = host_ok.as_ref().ok().and_then(|_| ctx.host.session().ok());
    let engine = ctx.engine_columns(own_columns());
    let variants = variants(&engine);
    let mut rows = Vec::new();
    for &extra in &ctx.opts.spawn_extra {
        let label = format!("21+{extra}");
        let mut cols: Vec<Column> = variants
            .iter()
            .map(|v| Column::new(&v.name, vec![], BTreeMap::new()))
            .collect();
        let mut reps = ctx.repetitions(&variants, &engine[0].name, Better::Higher);
        while let Some(rep) = reps.next(&cols) {
            // Untimed: the first engine cell after a host cell runs slow (see the rotation).
            engine_rate(extra, &engine[0], secs)?;
            for i in crate::stats::rotation_host_last(rep, cols.len()) {
                // The engine columns' settings, then the A/A control's (the baseline's).
                match engine.get(i).or((i == engine.len()).then(|| &engine[0])) {
                    Some(column) => {
                        let (rate, c) = engine_rate(extra, column, secs)?;
                        cols[i].samples.push(rate);
                        cols[i].counters = c;
                    }
                    None => cols[i].record(host_ok.clone().and_then(|_| host_rate(extra, secs))),
                }
                ctx.task.step(&format!("{label} {}", cols[i].variant))?;
            }
        }
        ctx.row_done();
        rows.push(Row {
            label,
            columns: cols,
            published: published(extra),
            layout: None,
        });
    }
    Ok(Table {
        host_matches: None,
        cost_model: None,
        id: "spawn".into(),
        title: format!("fork+exit rate with 21 + N VMAs, {secs} s per point"),
        seed: Some("001".into()),
        metric: "fork+exit rate".into(),
        unit: Unit::PerSecond,
        better: Better::Higher,
        stats: vec![Stat::Min, Stat::Median, Stat::Max],
        baseline: engine[0].name.clone(),
        variants,
        row_label: "VMAs".into(),
        rows,
        counters_shown: ["maple_nodes_allocated", "maple_tree_nodes"]
            .into_iter()
            .chain(STORE_WORK_COUNTERS)
            .chain([Ev::AnonVmaFork.name(), Ev::PteRead.name(), Ev::LockPtl.name()])
            .chain(["host_vmas", "host_rss_anon_kb"])
            .map(String::from)
            .collect(),
        published_source: Some(
            "6.5.0-next-20230829 vs the series, forks per 10 s of byte-unixbench spawn bound to one CPU".into(),
        ),
        notes: vec![
            "engine counters: one fork+exit (the timed loop runs as many as fit in the time)".into(),
            if crate::host::agent::has_static_spawn_agent() {
                "host: the static spawn agent (a freestanding program without libc, run from memory, pinned like the engine) with exactly 21 + N VMAs: its text, data, stack and vDSO, then single pages, the first written up to 21, the rest read-only; host_vmas and host_rss_anon_kb describe it".into()
            } else {
                "host: a fresh agent process (the usermm binary re-executed, pinned like the engine; this build has no C compiler for the static agent) with 21 + N VMAs in all: its own program, libraries and stack plus single-page VMAs; host_vmas and host_rss_anon_kb describe it (at 21+0 it has more than 21 of its own)".into()
            },
        ],
    })
}
