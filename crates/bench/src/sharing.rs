//! Seed 003's eight micro benchmarks on a layout of PMD THPs (2 MiB): remap, munmap, fork,
//! cow, cow-byte, cow-reuse, cow-reuse-byte, pte-dontneed — the engine with its default
//! sharing tracker, and the host kernel with the same layout.
//!
//! The engine column is one today; when the sharing tracker becomes a tunable, each tracker
//! (and each stage of the seed) becomes a column here, with the seed's published change
//! beside it. Until then the seed's numbers are listed under the table.

use crate::engine::{counters, machine, populate, sig, PMD, RO};
use crate::host::measure::{fork_time, timed, LiveChild};
use crate::host::region::{Region, RO as HOST_RO};
use crate::host::HostSession;
use crate::model::{Better, Column, Row, Stat, Table, Unit, Variant};
use crate::suite::Ctx;
use std::collections::BTreeMap;
use std::time::Instant;
use usermm::{Access, Advice, Ev, Privilege};

/// The micro benchmarks in the seed's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Micro {
    /// mprotect of one subpage of each THP (PTE-remaps it).
    Remap,
    /// munmap of the PTE-remapped layout.
    Munmap,
    /// fork of the PTE-remapped layout.
    Fork,
    /// memset of the layout while a forked child is alive.
    Cow,
    /// One byte written per page while a forked child is alive.
    CowByte,
    /// memset after the forked child exited.
    CowReuse,
    /// One byte per page after the forked child exited.
    CowReuseByte,
    /// MADV_DONTNEED of every 4 KiB subpage.
    PteDontneed,
}

/// All eight.
pub const MICROS: [Micro; 8] = [
    Micro::Remap,
    Micro::Munmap,
    Micro::Fork,
    Micro::Cow,
    Micro::CowByte,
    Micro::CowReuse,
    Micro::CowReuseByte,
    Micro::PteDontneed,
];

impl Micro {
    fn name(self) -> &'static str {
        match self {
            Micro::Remap => "remap",
            Micro::Munmap => "munmap",
            Micro::Fork => "fork",
            Micro::Cow => "cow",
            Micro::CowByte => "cow-byte",
            Micro::CowReuse => "cow-reuse",
            Micro::CowReuseByte => "cow-reuse-byte",
            Micro::PteDontneed => "pte-dontneed",
        }
    }

    /// The seed's change for its final stage ("all") against v6.7-rc1, Xeon Silver 4210R.
    fn seed_all(self) -> &'static str {
        match self {
            Micro::Remap => "-34.8%",
            Micro::Munmap => "1.0%",
            Micro::Fork => "27.8%",
            Micro::Cow => "0.7%",
            Micro::CowByte => "0.4%",
            Micro::CowReuse => "-30.0%",
            Micro::CowReuseByte => "-63.9%",
            Micro::PteDontneed => "-0.5%",
        }
    }

    /// Whether the layout is PTE-remapped before the timed operation.
    fn remapped(self) -> bool {
        // The seed PTE-maps every THP first in all benchmarks but `remap` (which times it).
        !matches!(self, Micro::Remap)
    }
}

/// One engine repetition.
fn engine_once(size: u64, micro: Micro, tracker: &str) -> anyhow::Result<(f64, usermm::Snapshot)> {
    let m = machine(size, PMD);
    let mut err = None;
    m.update_tunables(|t| err = t.set("sharing", tracker).err());
    if let Some(e) = err {
        anyhow::bail!("{e}");
    }
    let cpu = m.enter_cpu(0)?;
    let p = cpu.spawn(Privilege::Ordinary, 8 << 20)?;
    crate::engine::warm_up(&cpu, p, size)?;
    let a = populate(&cpu, p, size, micro.remapped())?;
    let child = match micro {
        Micro::Cow | Micro::CowByte | Micro::CowReuse | Micro::CowReuseByte => Some(cpu.fork(p)?),
        _ => None,
    };
    if let (Some(c), Micro::CowReuse | Micro::CowReuseByte) = (child, micro) {
        cpu.exit(c)?;
    }
    let before = m.counters();
    let t = Instant::now();
    match micro {
        Micro::Remap => {
            for blk in (a..a + size).step_by(PMD as usize) {
                cpu.mprotect(p, blk, 4096, RO)?;
            }
        }
        Micro::Munmap => cpu.munmap(p, a, size)?,
        Micro::Fork => {
            cpu.fork(p)?;
        }
        Micro::Cow | Micro::CowReuse => cpu.write_fill(p, a, size, 0x5a).map_err(sig)?,
        Micro::CowByte | Micro::CowReuseByte => {
            cpu.touch(p, a, size, Access::Write).map_err(sig)?
        }
        Micro::PteDontneed => {
            for pg in (a..a + size).step_by(4096) {
                cpu.madvise(p, pg, 4096, Advice::DontNeed)?;
            }
        }
    }
    let secs = t.elapsed().as_secs_f64();
    Ok((secs, m.counters().delta(&before)))
}

/// One host repetition.
fn host_once(s: &HostSession, size: u64, micro: Micro) -> Result<f64, String> {
    s.folio(PMD)?;
    let r = Region::anon(size)?;
    r.populate()?;
    if micro.remapped() {
        r.remap_ptes()?;
    }
    match micro {
        Micro::Remap => timed(|| r.protect_subpages(HOST_RO)),
        Micro::Munmap => r.unmap_timed(),
        Micro::Fork => fork_time(),
        Micro::Cow | Micro::CowByte => {
            let child = LiveChild::fork()?;
            let secs = write(&r, micro);
            drop(child);
            secs
        }
        Micro::CowReuse | Micro::CowReuseByte => {
            drop(LiveChild::fork()?);
            write(&r, micro)
        }
        Micro::PteDontneed => timed(|| r.dontneed_each_page()),
    }
}

/// memset or one byte per page, timed.
fn write(r: &Region, micro: Micro) -> Result<f64, String> {
    match micro {
        Micro::Cow | Micro::CowReuse => timed(|| r.fill(0x5a)),
        _ => timed(|| r.write_each_page()),
    }
}

/// Measurements (for the progress bar).
pub fn steps(reps: usize) -> u64 {
    (reps * MICROS.len() * (trackers().len() + 1)) as u64
}

/// One engine column per sharing tracker, the pre-6.15 estimate first (the baseline).
fn trackers() -> Vec<String> {
    let mut names: Vec<String> = usermm::sharing::SharingTracker::all()
        .iter()
        .map(|t| t.name())
        .collect();
    names.sort_by_key(|n| n != "estimate");
    names
}

fn variants() -> Vec<Variant> {
    let mut v: Vec<Variant> = trackers()
        .into_iter()
        .map(|n| {
            let about = format!("engine with sharing={n}");
            Variant::engine(&n, &about)
        })
        .collect();
    v.push(Variant::host(
        "the host kernel, same layout (PMD THP always; THP knobs restored)",
    ));
    v
}

/// The micro-benchmark table.
pub fn table(ctx: &Ctx<'_>) -> anyhow::Result<Table> {
    let size = ctx.opts.scale;
    let host = ctx.host.session();
    let mut rows = Vec::new();
    for micro in MICROS {
        let names = trackers();
        let mut cols: Vec<Column> = names
            .iter()
            .map(|n| Column::new(n, vec![], BTreeMap::new()))
            .collect();
        cols.push(Column::new("host", vec![], BTreeMap::new()));
        let host_col = cols.len() - 1;
        for _ in 0..ctx.opts.reps {
            for (i, name) in names.iter().enumerate() {
                let (secs, c) = engine_once(size, micro, name)?;
                cols[i].samples.push(secs);
                cols[i].counters = counters(&c);
                ctx.task.step(&format!("{} {name}", micro.name()))?;
            }
            let res = host
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|s| host_once(s, size, micro));
            cols[host_col].record(res.map(|secs| (secs, BTreeMap::new())));
            ctx.task.step(&format!("{} host", micro.name()))?;
        }
        rows.push(Row {
            label: micro.name().into(),
            columns: cols,
            published: vec![],
        });
    }
    drop(host);
    let seed: Vec<String> = MICROS
        .iter()
        .map(|m| format!("{} {}", m.name(), m.seed_all()))
        .collect();
    Ok(Table {
        id: "sharing".into(),
        title: format!("seed 003 micro benchmarks on {} MiB of PMD THPs", size >> 20),
        seed: Some("003".into()),
        metric: "operation time".into(),
        unit: Unit::Seconds,
        better: Better::Lower,
        stats: vec![Stat::Min, Stat::Median, Stat::Max],
        baseline: "estimate".into(),
        variants: variants(),
        row_label: "benchmark".into(),
        rows,
        counters_shown: [Ev::CowCopy, Ev::CowReuse, Ev::ThpSplitPmd, Ev::MapcountAtomic, Ev::RefcountAtomic]
            .iter()
            .map(|e| e.name().to_string())
            .collect(),
        published_source: None,
        notes: vec![
            format!(
                "seed 003, runtime change of its final stage ('all') vs v6.7-rc1 on a Xeon Silver 4210R (negative is faster): {}",
                seed.join(", ")
            ),
            "every benchmark but remap first PTE-maps each THP by mprotect of one subpage (remap times that step), as the seed does".into(),
        ],
    })
}
