//! Fault-in cost: write one byte per page of a fresh anonymous region, 4K pages and 64K
//! folios; and read one byte per page of a fresh `MAP_SHARED` mapping of a tmpfs file, sparse
//! (every read fault allocates and zeroes a page-cache page, `shmem_fault`) or already
//! written (the pages are cached: read faults map them, 16 per fault by fault-around,
//! `filemap_map_pages`); on the engine and on the host kernel.

use crate::ctx::Ctx;
use crate::engine::{counters, machine, size_label, warm_up, RO, RW};
use crate::host::agent::HostCell;
use crate::host::HostSession;
use crate::model::{Better, Column, Row, Stat, Table, Unit, Variant};
use std::collections::BTreeMap;
use std::time::Instant;
use usermm::{Access, Ev, InodeKind, MmapArgs, Pfn, Privilege, Sharing};

/// What a row faults in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Anonymous memory in folios of this size, by writes.
    Anon(u64),
    /// A tmpfs file, by reads: sparse (`false`) or already written (`true`).
    TmpfsRead { cached: bool },
}

/// The rows.
const ROWS: [Kind; 4] = [
    Kind::Anon(4 << 10),
    Kind::Anon(64 << 10),
    Kind::TmpfsRead { cached: false },
    Kind::TmpfsRead { cached: true },
];

impl Kind {
    fn label(self) -> String {
        match self {
            Kind::Anon(folio) => size_label(folio),
            Kind::TmpfsRead { cached: false } => "tmpfs-read sparse".into(),
            Kind::TmpfsRead { cached: true } => "tmpfs-read cached".into(),
        }
    }

    fn layout(self) -> &'static str {
        match self {
            Kind::Anon(_) => "anon, written",
            Kind::TmpfsRead { cached: false } => "tmpfs MAP_SHARED, sparse file, read",
            Kind::TmpfsRead { cached: true } => "tmpfs MAP_SHARED, written file, read",
        }
    }
}

/// One engine repetition.
fn engine_once(size: u64, kind: Kind) -> anyhow::Result<(f64, usermm::Snapshot)> {
    let folio = match kind {
        Kind::Anon(f) => f,
        Kind::TmpfsRead { .. } => 4096,
    };
    let m = machine(size, folio);
    let cpu = m.enter_cpu(0)?;
    let p = cpu.spawn(Privilege::Ordinary, 8 << 20)?;
    warm_up(&cpu, p, size)?;
    let (a, access) = match kind {
        Kind::Anon(_) => (cpu.mmap(p, MmapArgs::anon(size, RW))?, Access::Write),
        Kind::TmpfsRead { cached } => {
            let f = cpu.file_create(size, InodeKind::Tmpfs, cached.then_some(0x5a))?;
            let args = MmapArgs {
                sharing: Sharing::Shared,
                file: Some((f, 0)),
                ..MmapArgs::anon(size, RO)
            };
            (cpu.mmap(p, args)?, Access::Read)
        }
    };
    let before = m.counters();
    let t = Instant::now();
    cpu.touch(p, a, size, access).map_err(crate::engine::sig)?;
    let secs = t.elapsed().as_secs_f64();
    Ok((secs, m.counters().delta(&before)))
}

/// One host repetition in a fresh agent: one access per page of a fresh mapping.
fn host_once(
    s: &HostSession,
    size: u64,
    kind: Kind,
) -> Result<(f64, BTreeMap<String, u64>), String> {
    let cell = match kind {
        Kind::Anon(folio) => {
            s.folio(folio)?;
            HostCell::Fault { size, folio }
        }
        Kind::TmpfsRead { cached } => {
            s.shmem_folio(4096)?;
            HostCell::TmpfsRead { size, cached }
        }
    };
    crate::host::agent::measure(&cell)
}

/// Time to zero one 4 KiB frame of the arena (the floor of an anonymous fault).
fn zero_cost() -> f64 {
    let m = machine(64 << 20, 4096);
    let n = 4096u64;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        for pfn in Pfn::new(1).range_to(Pfn::new(n)) {
            m.phys.arena.zero_frame(pfn);
        }
        best = best.min(t.elapsed().as_secs_f64() / (n - 1) as f64);
    }
    best
}

/// Measurements (for the progress bar).
pub fn steps(reps: usize) -> u64 {
    (reps * ROWS.len() * 2) as u64
}

fn variants() -> Vec<Variant> {
    vec![
        Variant::engine("engine", "the usermm engine, default tunables"),
        Variant::host(
            "the host kernel: one write per page of a fresh mapping (mTHP knob of that size)",
        ),
    ]
}

/// The fault-in table.
pub fn table(ctx: &Ctx<'_>) -> anyhow::Result<Table> {
    let size = ctx.opts.scale;
    let host = ctx.host.session();
    let mut rows = Vec::new();
    for kind in ROWS {
        let label = kind.label();
        let mut cols = vec![
            Column::new("engine", vec![], BTreeMap::new()),
            Column::new("host", vec![], BTreeMap::new()),
        ];
        for rep in 0..ctx.opts.reps {
            for i in crate::stats::rotation_host_last(rep, 2) {
                if i == 0 {
                    let (secs, c) = engine_once(size, kind)?;
                    cols[0].samples.push(secs);
                    cols[0].counters = counters(&c);
                } else {
                    cols[1].record(
                        host.as_ref()
                            .map_err(Clone::clone)
                            .and_then(|s| host_once(s, size, kind)),
                    );
                }
                ctx.task.step(&format!("{label} {}", cols[i].variant))?;
            }
        }
        ctx.row_done();
        rows.push(Row {
            label,
            columns: cols,
            published: vec![],
            layout: Some(kind.layout().into()),
        });
    }
    drop(host);
    let pages = size / 4096;
    let z = zero_cost() * 1e9;
    let mut notes = vec![format!("zeroing one 4K frame of the arena: {z:.1} ns")];
    for r in &rows {
        if let Some(m) = crate::stats::summary(Stat::Median, &r.columns[0].samples) {
            let per = m * 1e9 / pages as f64;
            notes.push(format!(
                "{}: engine {per:.1} ns per page ({:.1} ns beyond zeroing)",
                r.label,
                per - z
            ));
        }
    }
    Ok(Table {
        host_matches: None,
        cost_model: None,
        id: "fault".into(),
        title: format!(
            "fault-in of {} MiB (anon: write one byte per page; tmpfs: read one)",
            size >> 20
        ),
        seed: None,
        metric: "fault-in time".into(),
        unit: Unit::Seconds,
        better: Better::Lower,
        stats: vec![Stat::Min, Stat::Median, Stat::Max],
        baseline: "engine".into(),
        variants: variants(),
        row_label: "folio size".into(),
        rows,
        counters_shown: [
            Ev::Fault,
            Ev::FaultAnonMthp,
            Ev::FaultAroundPages,
            Ev::PageCacheAdd,
            Ev::PteWrite,
            Ev::RefcountAtomic,
            Ev::PagesZeroed,
        ]
        .iter()
        .map(|e| e.name().to_string())
        .chain(
            ["host_mthp_anon_fault_alloc", "host_faults"]
                .iter()
                .map(|s| s.to_string()),
        )
        .collect(),
        published_source: None,
        notes,
    })
}
