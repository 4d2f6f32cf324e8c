//! Seed 004: timedmunlock — map `MAP_LOCKED | MAP_POPULATE`, then time `munlock` of all of
//! it, for stage0…stage7 (the 2013 series applied cumulatively), the modern design, and the
//! host kernel; three setups: one node without THP, two nodes interleaved, THP on. The
//! tables show min/mean/stddev/max as the seed's mmtests output does.

use crate::columns::EngineColumn;
use crate::ctx::Ctx;
use crate::engine::{counters, RW};
use crate::host::agent::{self, CellResult, HostCell};
use crate::host::HostSession;
use crate::model::{Better, Column, Published, Row, SeedSign, Stat, Table, Unit, Variant};
use std::collections::BTreeMap;
use std::time::Instant;
use usermm::machine::MemPolicy;
use usermm::tunables::MunlockDesign;
use usermm::{Ev, InodeKind, Machine, MachineConfig, MmapArgs, Privilege, Sharing, ThpPolicy};

/// One benchmark setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    /// One node, THP off.
    OneNode,
    /// Two nodes, interleaved placement.
    Interleaved,
    /// One node, THP on.
    Thp,
    /// One node, a tmpfs file mapped `MAP_SHARED` (page-cache pages: the 2013 series
    /// batched them too, on the file LRU).
    Tmpfs,
}

/// The setups: the seed's three, then a tmpfs file.
pub const SETUPS: [Setup; 4] = [Setup::OneNode, Setup::Interleaved, Setup::Thp, Setup::Tmpfs];

impl Setup {
    fn id(self) -> &'static str {
        match self {
            Setup::OneNode => "munlock-one-node",
            Setup::Interleaved => "munlock-interleaved",
            Setup::Thp => "munlock-thp",
            Setup::Tmpfs => "munlock-tmpfs",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Setup::OneNode => "one node, THP off",
            Setup::Interleaved => "2 nodes, interleaved (numactl --interleave)",
            Setup::Thp => "THP on",
            Setup::Tmpfs => "a tmpfs file mapped MAP_SHARED, THP off",
        }
    }

    /// The seed's "Elapsed mean" gains of stage1…stage7 for this setup (none for tmpfs:
    /// the seed measured anonymous memory only).
    fn seed_mean(self) -> [&'static str; 7] {
        match self {
            Setup::Tmpfs => [""; 7],
            Setup::OneNode => [
                "-0.23%", "11.33%", "20.26%", "21.21%", "29.88%", "34.93%", "43.46%",
            ],
            Setup::Interleaved => [
                "0.51%", "3.49%", "6.84%", "7.48%", "6.69%", "11.27%", "16.59%",
            ],
            Setup::Thp => [
                "-0.27%", "6.39%", "5.30%", "5.32%", "5.03%", "5.97%", "5.22%",
            ],
        }
    }
}

/// One engine repetition.
fn engine_once(
    size: u64,
    setup: Setup,
    column: &EngineColumn,
) -> anyhow::Result<(f64, usermm::Snapshot)> {
    let nodes = if setup == Setup::Interleaved { 2 } else { 1 };
    let mut cfg = MachineConfig {
        memory: (size + (256 << 20)).next_power_of_two().max(512 << 20) * nodes as u64,
        nodes,
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = false;
    column.apply_to(&mut cfg.tunables)?;
    let m = Machine::new(cfg);
    m.update_tunables(|t| {
        t.thp.top = if setup == Setup::Thp {
            ThpPolicy::Always
        } else {
            ThpPolicy::Never
        }
    });
    if setup == Setup::Interleaved {
        m.set_mempolicy(MemPolicy::Interleave);
    }
    let cpu = m.enter_cpu(0)?;
    let p = cpu.spawn(Privilege::Privileged, u64::MAX)?;
    let mut args = MmapArgs {
        locked: true,
        populate: true,
        ..MmapArgs::anon(size, RW)
    };
    if setup == Setup::Tmpfs {
        let f = cpu.file_create(size, InodeKind::Tmpfs, None)?;
        args.file = Some((f, 0));
        args.sharing = Sharing::Shared;
    }
    let a = cpu.mmap(p, args)?;
    cpu.lru_add_drain();
    let before = m.counters();
    let t = Instant::now();
    cpu.munlock(p, a, size)?;
    let secs = t.elapsed().as_secs_f64();
    Ok((secs, m.counters().delta(&before)))
}

/// One host repetition, in a fresh agent process: `MAP_LOCKED | MAP_POPULATE`, drain the LRU
/// batches, time munlock. The THP knob is set here, under the session's machine-wide lock.
fn host_once(s: &HostSession, size: u64, setup: Setup, nodes: usize) -> CellResult {
    s.thp(setup == Setup::Thp)?;
    agent::measure(&HostCell::Munlock {
        size,
        folio: if setup == Setup::Thp { 2 << 20 } else { 4096 },
        tmpfs: setup == Setup::Tmpfs,
        interleave: if setup == Setup::Interleaved {
            nodes
        } else {
            0
        },
    })
}

/// The table's own engine columns: every munlock design (stage0, the baseline, first).
fn own_columns() -> Vec<EngineColumn> {
    MunlockDesign::ALL
        .iter()
        .map(|d| {
            let about = match d {
                MunlockDesign::Stage(0) => "3.11-rc3: munlock page by page".to_string(),
                MunlockDesign::Stage(n) => {
                    format!("3.11-rc3 plus patches 1..{n} of the 2013 series")
                }
                MunlockDesign::Modern => {
                    "the current design (5.18+): munlock at rmap removal, per-CPU mlock batch"
                        .into()
                }
            };
            EngineColumn::new(&d.name(), &about, &[("munlock", &d.name())])
        })
        .collect()
}

/// The columns: the engine's, then the host.
fn variants(engine: &[EngineColumn]) -> Vec<Variant> {
    let mut v: Vec<Variant> = engine.iter().map(EngineColumn::variant).collect();
    v.push(Variant::host(
        "the host kernel: MAP_LOCKED|MAP_POPULATE, then munlock timed",
    ));
    v
}

/// Measurements of one table (for the progress bar) with `engine` engine columns (0: the
/// table's own).
pub fn steps(reps: usize, engine: usize) -> u64 {
    let engine = if engine == 0 {
        own_columns().len()
    } else {
        engine
    };
    (reps * (engine + 1)) as u64
}

/// The table of one setup: every design and the host, repetitions interleaved in an order
/// rotated per repetition (a drift of the machine's load must not land on one stage).
pub fn table(ctx: &Ctx<'_>, setup: Setup) -> anyhow::Result<Table> {
    let size = ctx.opts.munlock_scale;
    let nodes = ctx.host.nodes();
    let session = if setup == Setup::Interleaved && nodes < 2 {
        Err(format!("{nodes} node"))
    } else {
        ctx.host.session()
    };
    let engine = ctx.engine_columns(own_columns());
    let variants = variants(&engine);
    let mut cols: Vec<Column> = variants
        .iter()
        .map(|v| Column::new(&v.name, vec![], BTreeMap::new()))
        .collect();
    let mut reps = ctx.repetitions(&variants, &engine[0].name, Better::Lower);
    while let Some(rep) = reps.next(&cols) {
        // Untimed: the first engine cell after a host cell runs slow (see the rotation).
        engine_once(size, setup, &engine[0])?;
        for i in crate::stats::rotation_host_last(rep, cols.len()) {
            match engine.get(i) {
                Some(column) => {
                    let (secs, c) = engine_once(size, setup, column)?;
                    cols[i].samples.push(secs);
                    cols[i].counters = counters(&c);
                }
                None => {
                    let res = session
                        .as_ref()
                        .map_err(Clone::clone)
                        .and_then(|s| host_once(s, size, setup, nodes));
                    cols[i].record(res);
                }
            }
            ctx.task.step(&cols[i].variant.clone())?;
        }
    }
    drop(session);
    ctx.row_done();
    let published = setup
        .seed_mean()
        .iter()
        .enumerate()
        .filter(|(_, t)| !t.is_empty())
        .map(|(i, t)| Published::parse(format!("stage{}", i + 1), t, SeedSign::Gain))
        .collect();
    Ok(Table {
        host_matches: None,
        cost_model: None,
        id: setup.id().into(),
        title: format!("timedmunlock: {} MiB, {}", size >> 20, setup.title()),
        seed: Some("004".into()),
        metric: "munlock() time".into(),
        unit: Unit::Seconds,
        better: Better::Lower,
        stats: vec![Stat::Min, Stat::Mean, Stat::Stddev, Stat::Max],
        baseline: engine[0].name.clone(),
        variants,
        row_label: "size".into(),
        rows: vec![Row {
            label: crate::engine::size_label(size),
            columns: cols,
            published,
            layout: None,
        }],
        counters_shown: [
            Ev::LockLru,
            Ev::RefcountAtomic,
            Ev::NrMlockUpdate,
            Ev::BatchDrain,
            Ev::LockPtl,
            Ev::PteRead,
        ]
        .iter()
        .map(|e| e.name().to_string())
        .collect(),
        published_source: (setup != Setup::Tmpfs).then(|| {
            "3.11-rc3 + the 2013 series, 'Elapsed mean' of mmtests timedmunlock (56 GB); the Seed row holds the mean's gain".into()
        }),
        notes: vec![],
    })
}
