//! Seed 003's eight micro benchmarks on a layout of PMD THPs (2 MiB): remap, munmap, fork,
//! cow, cow-byte, cow-reuse, cow-reuse-byte, pte-dontneed — one engine column per stage of the
//! series ([`STAGES`]: the v6.7 baseline, each cumulative patch group, then upstream's owner
//! tracking and the exact two-counter tracker), the seed's published change beside each, and
//! the host kernel with the same layout.

use crate::columns::EngineColumn;
use crate::ctx::Ctx;
use crate::engine::{counters, machine_with_cpus, populate, sig, PMD, RO};
use crate::host::agent::{self, CellResult, HostCell};
use crate::host::HostSession;
use crate::model::{Better, Column, Published, Row, SeedSign, Stat, Table, Unit, Variant};
use std::collections::BTreeMap;
use std::time::Instant;
use usermm::{Access, Advice, Ev, Privilege};

pub use crate::host::sharing::{Micro, MICROS};

/// One engine configuration: a stage of seed 003 (cumulative), or an alternative tracker.
#[derive(Clone, Copy, Debug)]
pub struct Stage {
    /// Column name (the seed's stage names).
    pub name: &'static str,
    /// What the configuration is.
    pub about: &'static str,
    /// Tunables it sets on a fresh machine (everything else at its default).
    pub tunables: &'static [(&'static str, &'static str)],
}

/// The seed's stages in its order (the baseline first), then upstream's and the exact tracker.
/// The seed's stages fork and zap one PTE at a time, as v6.7-rc1 and the series itself did
/// (its cover letter names rmap batching of fork and unmap as the next step; seed 000's
/// batching came in 6.9), so each PTE pays the stage's tracking cost as it did there. `owner`
/// and `rmap-id-sq` are upstream configurations and batch.
pub const STAGES: [Stage; 9] = [
    Stage {
        name: "baseline",
        about: "v6.7-rc1: first-page estimate, no folio-wide mapcount, per-PTE rmap when a PMD is PTE-remapped, large folios never reused",
        tunables: &[("sharing", "estimate"), ("remap_rmap_batch", "per-pte"), ("fork_pte_batch", "per-pte"), ("zap_pte_batch", "per-pte")],
    },
    Stage {
        name: "mapcount",
        about: "patches 1-3: a folio-wide total mapcount and the improved estimate",
        tunables: &[("sharing", "mapcount"), ("remap_rmap_batch", "per-pte"), ("fork_pte_batch", "per-pte"), ("zap_pte_batch", "per-pte")],
    },
    Stage {
        name: "rmap-id",
        about: "patches 4-11: rmap IDs, the atomic seqcount (shared writers), COW reuse; the seed's sub-ID sizing",
        tunables: &[("sharing", "rmap-id+shared+seed-sizing+atomic-pages"), ("remap_rmap_batch", "per-pte"), ("fork_pte_batch", "per-pte"), ("zap_pte_batch", "per-pte")],
    },
    Stage {
        name: "batch",
        about: "patches 12-14: one batched rmap update when a PMD is PTE-remapped",
        tunables: &[("sharing", "rmap-id+shared+seed-sizing+atomic-pages"), ("remap_rmap_batch", "batched"), ("fork_pte_batch", "per-pte"), ("zap_pte_batch", "per-pte")],
    },
    Stage {
        name: "exclusive",
        about: "patches 16-17: the exclusive-writer seqcount (cmpxchg to enter)",
        tunables: &[("sharing", "rmap-id+cmpxchg+seed-sizing+atomic-pages"), ("remap_rmap_batch", "batched"), ("fork_pte_batch", "per-pte"), ("zap_pte_batch", "per-pte")],
    },
    Stage {
        name: "nocmpxchg",
        about: "patch 18: add-return instead of cmpxchg to enter the seqcount",
        tunables: &[("sharing", "rmap-id+add-return+seed-sizing+atomic-pages"), ("remap_rmap_batch", "batched"), ("fork_pte_batch", "per-pte"), ("zap_pte_batch", "per-pte")],
    },
    Stage {
        name: "all",
        about: "patches 19-20: the per-page mapcounts updated under the seqcount too (plain stores when exclusive)",
        tunables: &[("sharing", "rmap-id+add-return+seed-sizing+all"), ("remap_rmap_batch", "batched"), ("fork_pte_batch", "per-pte"), ("zap_pte_batch", "per-pte")],
    },
    Stage {
        name: "owner",
        about: "upstream v6.15: MM owner tracking (two slots and a maybe-shared bit); the engine's default",
        tunables: &[("sharing", "owner"), ("remap_rmap_batch", "batched")],
    },
    Stage {
        name: "rmap-id-sq",
        about: "the exact two-counter tracker (Σid, Σid²) under the same seqcount",
        tunables: &[("sharing", "rmap-id-sq"), ("remap_rmap_batch", "batched")],
    },
];

impl Stage {
    /// Its engine column: its name, what it is with its switches, its tunables.
    pub fn column(&self) -> EngineColumn {
        let switches: Vec<String> = self
            .tunables
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let about = format!("{} [{}]", self.about, switches.join(", "));
        EngineColumn::new(self.name, &about, self.tunables)
    }
}

/// A fresh machine with `cpus` CPU slots for `size` bytes of PMD THPs configured as `stage`.
pub fn stage_machine(size: u64, cpus: usize, stage: &Stage) -> anyhow::Result<usermm::Machine> {
    column_machine(size, cpus, &stage.column())
}

/// A fresh machine with `cpus` CPU slots for `size` bytes of PMD THPs configured as `column`.
pub fn column_machine(
    size: u64,
    cpus: usize,
    column: &EngineColumn,
) -> anyhow::Result<usermm::Machine> {
    let m = machine_with_cpus(size, PMD, cpus);
    column.apply(&m)?;
    Ok(m)
}

/// One engine repetition.
fn engine_once(
    size: u64,
    micro: Micro,
    column: &EngineColumn,
) -> anyhow::Result<(f64, usermm::Snapshot)> {
    let m = column_machine(size, usermm::MachineConfig::default().cpus, column)?;
    let cpu = m.enter_cpu(0)?;
    let p = cpu.spawn(Privilege::Ordinary, 8 << 20)?;
    // Back every frame the run may touch on the host first, the copies' too: a host page fault
    // inside the timed part would be charged to whichever column copies (the baseline).
    let copies = match micro {
        Micro::Cow | Micro::CowByte | Micro::CowReuse | Micro::CowReuseByte => size,
        _ => 0,
    };
    crate::engine::warm_up(&cpu, p, size + copies)?;
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

/// One host repetition, in a fresh agent process (see [`crate::host::agent`]); the THP knob
/// is set here, under the session's machine-wide lock.
fn host_once(s: &HostSession, size: u64, micro: Micro) -> CellResult {
    s.folio(PMD)?;
    agent::measure(&HostCell::Sharing { size, micro })
}

/// Measurements (for the progress bar).
/// Measurements of the table (for the progress bar) with `engine` engine columns (0: the
/// stages).
pub fn steps(reps: usize, engine: usize) -> u64 {
    let engine = if engine == 0 { STAGES.len() } else { engine };
    (reps * MICROS.len() * (engine + 1)) as u64
}

/// Seed 003's published change per stage (Xeon Silver 4210R, 1 GiB; negative is faster), in
/// [`MICROS`] order. The "123" stage (1–3 rmap values for small orders) has no column here.
const SEED_INTEL: [(&str, [&str; 8]); 6] = [
    (
        "mapcount",
        [
            "13.4%", "0.3%", "14.2%", "0.5%", "0.2%", "-0.2%", "-0.4%", "2.8%",
        ],
    ),
    (
        "rmap-id",
        [
            "123.7%", "48.8%", "105.9%", "3.0%", "3.2%", "-30.0%", "-64.2%", "14.8%",
        ],
    ),
    (
        "batch",
        [
            "-8.1%", "41.4%", "95.5%", "1.5%", "2.2%", "-29.7%", "-64.2%", "5.7%",
        ],
    ),
    (
        "exclusive",
        [
            "-8.8%", "15.1%", "40.5%", "1.1%", "0.9%", "-29.6%", "-64.0%", "1.1%",
        ],
    ),
    (
        "nocmpxchg",
        [
            "-10.4%", "12.6%", "46.4%", "0.9%", "1.4%", "-30.0%", "-64.3%", "0.8%",
        ],
    ),
    (
        "all",
        [
            "-34.8%", "1.0%", "27.8%", "0.7%", "0.4%", "-30.0%", "-63.9%", "-0.5%",
        ],
    ),
];

fn published(micro: Micro) -> Vec<Published> {
    let col = MICROS.iter().position(|m| *m == micro).unwrap_or(0);
    SEED_INTEL
        .iter()
        .map(|(stage, row)| Published::parse(*stage, row[col], SeedSign::TimeChange))
        .collect()
}

/// The stages' engine columns.
pub fn stage_columns() -> Vec<EngineColumn> {
    STAGES.iter().map(Stage::column).collect()
}

/// One engine variant per column, then the host described by `host`.
pub fn column_variants(engine: &[EngineColumn], host: &str) -> Vec<Variant> {
    let mut v: Vec<Variant> = engine.iter().map(EngineColumn::variant).collect();
    v.push(Variant::host(host));
    v
}

/// The micro-benchmark table.
pub fn table(ctx: &Ctx<'_>) -> anyhow::Result<Table> {
    let size = ctx.opts.sharing_scale;
    let host = ctx.host.session();
    let engine = ctx.engine_columns(stage_columns());
    let variants = column_variants(
        &engine,
        "the host kernel, same layout (PMD THP always; THP knobs restored)",
    );
    let mut rows = Vec::new();
    for micro in MICROS {
        let mut cols: Vec<Column> = variants
            .iter()
            .map(|v| Column::new(&v.name, vec![], BTreeMap::new()))
            .collect();
        let host_col = cols.len() - 1;
        let mut reps = ctx.repetitions(&variants, &engine[0].name, Better::Lower);
        while let Some(rep) = reps.next(&cols) {
            // Untimed: the first engine cell after a host cell runs slow (see the rotation).
            engine_once(size, micro, &engine[0])?;
            for i in crate::stats::rotation_host_last(rep, cols.len()) {
                if let Some(column) = engine.get(i) {
                    let (secs, c) = engine_once(size, micro, column)?;
                    cols[i].samples.push(secs);
                    cols[i].counters = counters(&c);
                } else {
                    let res = host
                        .as_ref()
                        .map_err(Clone::clone)
                        .and_then(|s| host_once(s, size, micro));
                    cols[host_col].record(res);
                }
                ctx.task
                    .step(&format!("{} {}", micro.name(), cols[i].variant))?;
            }
        }
        ctx.row_done();
        rows.push(Row {
            label: micro.name().into(),
            columns: cols,
            published: published(micro),
            layout: None,
        });
    }
    drop(host);
    Ok(Table {
        host_matches: None,
        cost_model: None,
        id: "sharing".into(),
        title: format!("seed 003 micro benchmarks on {} MiB of PMD THPs", size >> 20),
        seed: Some("003".into()),
        metric: "operation time".into(),
        unit: Unit::Seconds,
        better: Better::Lower,
        stats: vec![Stat::Min, Stat::Median, Stat::Max],
        baseline: engine[0].name.clone(),
        variants,
        row_label: "benchmark".into(),
        rows,
        counters_shown: [
            Ev::CowCopy,
            Ev::CowReuse,
            Ev::ThpSplitPmd,
            Ev::MapcountAtomic,
            Ev::RefcountAtomic,
            Ev::FolioAtomic,
        ]
        .iter()
        .map(|e| e.name().to_string())
        .collect(),
        published_source: Some(
            "seed 003 cover letter, runtime change vs v6.7-rc1 on a 2-socket Xeon Silver 4210R, 1 GiB of THP".into(),
        ),
        notes: vec![
            "every benchmark but remap first PTE-maps each THP by mprotect of one subpage (remap times that step), as the seed does".into(),
            "baseline … all fork and zap one PTE at a time, as v6.7-rc1 and the series did (rmap batching of fork/unmap was its next step; seed 000 came in 6.9); owner and rmap-id-sq batch, as upstream".into(),
        ],
    })
}
