//! Seed 003, section 7.3 "VM scalability": vm-scalability's `case-anon-cow-seq` and
//! `case-anon-cow-rand` — concurrent copy-on-write of the same PMD THPs by one process per CPU.
//!
//! vm-scalability runs `usemem -n $nr_task --prealloc --prefault [--random] $((mem / nr_task /
//! 2))`: the usemem process maps the area (`MAP_POPULATE`) *before* forking, then forks
//! `nr_task` children; the children report ready over a pipe, are released together, and each
//! writes the whole shared area once — every 8-byte word in ascending order, or (`--random`)
//! as many words at random offsets — and prints bytes / elapsed; the result is the sum over the
//! children. Here, per repetition and per engine stage ([`STAGES`] by default, fresh machine from
//! [`column_machine`]): the parent process populates `area` bytes of PMD THPs on CPU 0 and forks
//! one child per instance; then one host thread per instance enters its own CPU, all wait on a
//! barrier, and each writes every 4 KiB page of its child's copy of the area once — `seq`: one
//! `write_fill` over the area (every byte, ascending), `rand`: one 4 KiB `write_fill` per page
//! in a per-instance pseudo-random permutation (fixed seed). Each child's first write into a
//! THP PTE-remaps its PMD and every page is then copied, while the other instances (un)map
//! pages of the same folios. The sample is the summed throughput `Σ area / tᵢ`, `tᵢ` from the
//! barrier's release to instance `i`'s last write. The host column does the same with real
//! `fork()`s of a fresh agent process (the `usermm` binary re-executed, as every host cell
//! is), which holds nothing but its program and the area: `host_vmas` and `host_rss_anon_kb`
//! describe it. Its writers run on whichever CPUs the scheduler gives them, as the engine's
//! instance threads do.

use crate::columns::EngineColumn;
use crate::ctx::Ctx;
use crate::engine::{counters, populate, sig, warm_up, PMD};
use crate::host::agent::{self, CellResult, HostCell};
use crate::host::anon_cow::{throughput, FILL};
use crate::host::HostSession;
use crate::model::{Better, Column, Published, Row, SeedSign, Stat, Table, Unit};
use crate::sharing::{column_machine, stage_columns, STAGES};
use std::collections::BTreeMap;
use std::sync::Barrier;
use std::time::{Duration, Instant};
use usermm::{Ev, Pid, Privilege};

pub use crate::host::anon_cow::{page_order, Order, ORDERS};

const PAGE: u64 = 4096;
/// Counters of this table that depend on how the instances interleave: in the stages with an
/// exclusive seqcount writer (plain stores), a writer that finds another one inside the folio's
/// seqcount falls back to atomic adds, so these count the contention; every other counter is
/// exact and identical between runs.
pub const CONTENDED: [&str; 2] = ["folio_atomics", "mapcount_atomics"];

/// Instances: one per host CPU (each gets a CPU slot of the engine machine).
pub fn instances() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// One instance: writes its child's copy of the area in `order`.
fn engine_writes(
    cpu: &usermm::Cpu<'_>,
    child: Pid,
    a: u64,
    area: u64,
    pages: &[u64],
    order: Order,
) -> anyhow::Result<()> {
    match order {
        Order::Seq => cpu.write_fill(child, a, area, FILL).map_err(sig),
        Order::Rand => {
            for &off in pages {
                cpu.write_fill(child, a + off, PAGE, FILL).map_err(sig)?;
            }
            Ok(())
        }
    }
}

/// One engine repetition: (bytes per second summed over instances, counters of the timed part).
fn engine_once(
    area: u64,
    order: Order,
    column: &EngineColumn,
    n: usize,
    orders: &[Vec<u64>],
) -> anyhow::Result<(f64, usermm::Snapshot)> {
    // The parent's area, one copy per child, page tables: `column_machine(s)` has 2s + 64 MiB.
    let m = column_machine((area * (n as u64 + 1)).div_ceil(2), n, column)?;
    let (parent, a, children) = {
        let cpu = m.enter_cpu(0)?;
        let p = cpu.spawn(Privilege::Ordinary, 8 << 20)?;
        // Back every arena frame the run will use (the host's first touch is not the engine's).
        warm_up(&cpu, p, area * (n as u64 + 1))?;
        let a = populate(&cpu, p, area, false)?;
        let kids = (0..n).map(|_| cpu.fork(p)).collect::<Result<Vec<_>, _>>()?;
        (p, a, kids)
    };
    let barrier = Barrier::new(n);
    let before = m.counters();
    let results: Vec<anyhow::Result<Duration>> = std::thread::scope(|s| {
        let handles: Vec<_> = children
            .iter()
            .enumerate()
            .map(|(i, &child)| {
                let (m, barrier, pages) = (&m, &barrier, &orders[i]);
                s.spawn(move || -> anyhow::Result<Duration> {
                    let cpu = m.enter_cpu(i);
                    // Every thread reaches the barrier, even one whose CPU could not be entered.
                    barrier.wait();
                    let cpu = cpu?;
                    let t = Instant::now();
                    engine_writes(&cpu, child, a, area, pages, order)?;
                    Ok(t.elapsed())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("instance thread panicked")))
            })
            .collect()
    });
    let times = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let delta = m.counters().delta(&before);
    // Spot check, first and last page of every THP: the parent's are untouched (zero), every
    // child's are its own copy (the full check would cost more than the timed part).
    let cpu = m.enter_cpu(0)?;
    for blk in (a..a + area).step_by(PMD as usize) {
        for pg in [blk, blk + PMD - PAGE] {
            let bad = |pid: Pid, byte: u8| -> anyhow::Result<bool> {
                Ok(cpu
                    .find_mismatch(pid, pg, PAGE, byte)
                    .map_err(sig)?
                    .is_some())
            };
            anyhow::ensure!(
                !bad(parent, 0)?,
                "column {}: the parent's area changed",
                column.name
            );
            for &c in &children {
                anyhow::ensure!(
                    !bad(c, FILL)?,
                    "column {}: a child's page was not written",
                    column.name
                );
            }
        }
    }
    Ok((throughput(area, &times), delta))
}

/// One host repetition, in a fresh agent process (see [`crate::host::agent`]): the THP knob
/// is set here, under the session's machine-wide lock; the agent populates the area and forks
/// the writers ([`host_writers`](crate::host::anon_cow::host_writers)).
fn host_once(s: &HostSession, area: u64, order: Order, instances: usize) -> CellResult {
    s.folio(PMD)?;
    agent::measure(&HostCell::AnonCow {
        area,
        order,
        instances,
    })
}

/// Measurements (for the progress bar) with `engine` engine columns (0: the stages).
pub fn steps(reps: usize, engine: usize) -> u64 {
    let engine = if engine == 0 { STAGES.len() } else { engine };
    (reps * ORDERS.len() * (engine + 1)) as u64
}

/// Seed 003's published throughput change per stage (Xeon Silver 4210R, 20 cores, 1 GiB per
/// instance; positive is more throughput): (stage, seq, rand). Its "123" stage has no column.
const SEED_INTEL: [(&str, &str, &str); 6] = [
    ("mapcount", "-8.2%", "-0.1%"),
    ("rmap-id", "-16.2%", "-0.3%"),
    ("batch", "-8.3%", "-0.4%"),
    ("exclusive", "-7.1%", "0.4%"),
    ("nocmpxchg", "-6.6%", "-0.3%"),
    ("all", "-5.6%", "-0.3%"),
];

fn published(order: Order) -> Vec<Published> {
    SEED_INTEL
        .iter()
        .map(|&(stage, seq, rand)| {
            let text = if order == Order::Seq { seq } else { rand };
            Published::parse(stage, text, SeedSign::Gain)
        })
        .collect()
}

/// The counters shown: the COW outcome, the PMD remaps, folio atomics, and any seqcount
/// retry/contention counter the engine has.
fn counters_shown() -> Vec<String> {
    let mut v: Vec<String> = [
        Ev::CowCopy,
        Ev::CowReuse,
        Ev::ThpSplitPmd,
        Ev::FolioAtomic,
        Ev::MapcountAtomic,
    ]
    .iter()
    .map(|e| e.name().to_string())
    .collect();
    v.extend(
        Ev::ALL
            .iter()
            .map(|e| e.name())
            .filter(|n| n.contains("seq") || n.contains("retr") || n.contains("contend"))
            .map(String::from),
    );
    v.extend(
        [
            "host_thp_split_pmd",
            "host_anon_huge_kb",
            "host_vmas",
            "host_rss_anon_kb",
        ]
        .map(String::from),
    );
    v
}

/// The anon-cow table.
pub fn table(ctx: &Ctx<'_>) -> anyhow::Result<Table> {
    let area = ctx.opts.anon_cow_scale;
    anyhow::ensure!(
        area >= PMD && area.is_multiple_of(PMD),
        "the anon-cow area must be a multiple of 2M"
    );
    let n = instances();
    let host = ctx.host.session();
    let engine = ctx.engine_columns(stage_columns());
    let variants = crate::sharing::column_variants(
        &engine,
        "the host kernel: a fresh agent process populates the area (PMD THP always; THP knobs restored) and forks one writer per instance",
    );
    let mut rows = Vec::new();
    for order in ORDERS {
        let pages: Vec<Vec<u64>> = (0..n).map(|i| page_order(area, order, i)).collect();
        let mut cols: Vec<Column> = variants
            .iter()
            .map(|v| Column::new(&v.name, vec![], BTreeMap::new()))
            .collect();
        let host_col = cols.len() - 1;
        let mut reps = ctx.repetitions(&variants, &engine[0].name, Better::Higher);
        while let Some(rep) = reps.next(&cols) {
            // Untimed: the first engine cell after a host cell runs slow (see the rotation).
            engine_once(area, order, &engine[0], n, &pages)?;
            for i in crate::stats::rotation_host_last(rep, cols.len()) {
                if let Some(column) = engine.get(i) {
                    let (rate, c) = engine_once(area, order, column, n, &pages)?;
                    cols[i].samples.push(rate);
                    cols[i].counters = counters(&c);
                } else {
                    let res = host
                        .as_ref()
                        .map_err(Clone::clone)
                        .and_then(|s| host_once(s, area, order, n));
                    cols[host_col].record(res);
                }
                ctx.task
                    .step(&format!("{} {}", order.name(), cols[i].variant))?;
            }
        }
        rows.push(Row {
            label: order.name().into(),
            columns: cols,
            published: published(order),
            layout: None,
        });
    }
    drop(host);
    let mut notes = vec![
        format!(
            "follows vm-scalability's `usemem -n N --prealloc --prefault [--random]`: one parent populates {} MiB of PMD THPs, then forks N = {n} children (one per host CPU, each on an engine CPU slot of its own); the children start together and each writes the whole shared area once; sample = Σ area / tᵢ, tᵢ from the common start to child i's last write (usemem: bytes / elapsed per child, summed)",
            area >> 20
        ),
        "differences from usemem: it writes every 8-byte word (--random: as many words at random offsets, with repetition) and times from before the parent's populate; here seq is one memset of the area, rand one 4 KiB memset per page in a fixed-seed random permutation (every page once), and only the COW phase is timed".into(),
        "each child's first write to a THP PTE-remaps the PMD in that child, then every page is copied: no stage can reuse (the parent keeps every folio mapped), so cow_copies = pages x N and thp_split_pmd = THPs x N in every column".into(),
        format!(
            "counters: of the timed part, all instances; {} vary between runs in the stages with an exclusive seqcount writer (a writer that met another inside a folio's seqcount used atomic adds): the excess over the lowest value is the contention",
            CONTENDED.join(" and ")
        ),
        "engine: one host thread per instance, each on its own engine CPU; the rand row calls the access API once per page (a process lookup and mmap_lock per call), so compare rows by their gains, not absolutely".into(),
    ];
    notes.extend(host_split_note(&rows, (area / PMD) * n as u64));
    Ok(Table {
        host_matches: None,
        cost_model: None,
        id: "anon-cow".into(),
        title: format!(
            "vm-scalability case-anon-cow-seq/-rand: {n} instances, each COWing {} MiB of shared PMD THPs",
            area >> 20
        ),
        seed: Some("003".into()),
        metric: "COW throughput summed over instances".into(),
        unit: Unit::BytesPerSecond,
        better: Better::Higher,
        stats: vec![Stat::Min, Stat::Median, Stat::Max],
        baseline: engine[0].name.clone(),
        variants,
        row_label: "page order".into(),
        rows,
        counters_shown: counters_shown(),
        published_source: Some(
            "seed 003 cover letter 7.3, throughput change vs v6.7-rc1, one instance per core of a 2-socket Xeon Silver 4210R (20 cores), 1 GiB per instance".into(),
        ),
        notes,
    })
}

/// A note where a host cell split fewer PMDs than the writers met THPs (`thps`): part of the
/// host's area was not PMD-mapped (no THP to be had), so its writers copied pages without
/// the remap the engine's did. `None` where every host cell split them all, or none ran.
fn host_split_note(rows: &[Row], thps: u64) -> Option<String> {
    let short: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let split = *r.columns.last()?.counters.get("host_thp_split_pmd")?;
            (split < thps).then(|| format!("{} {split}", r.label))
        })
        .collect();
    (!short.is_empty()).then(|| {
        format!(
            "host: fewer PMD splits than the writers met THPs ({thps}): {}; part of the host's area was not THP-backed, so its throughput is not this layout's",
            short.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_cell_short_of_splits_is_named() {
        let row = |label: &str, split: u64| Row {
            label: label.into(),
            columns: vec![Column::new(
                "host",
                vec![1.0],
                BTreeMap::from([("host_thp_split_pmd".to_string(), split)]),
            )],
            published: vec![],
            layout: None,
        };
        assert_eq!(
            host_split_note(&[row("seq", 32), row("rand", 32)], 32),
            None
        );
        let note = host_split_note(&[row("seq", 17), row("rand", 32)], 32).expect("a note");
        assert!(note.contains("(32): seq 17;"), "{note}");
        assert!(!note.contains("rand"), "{note}");
    }
}
