//! Seed 000: fork and munmap of a layout of PTE-mapped folios of one size (4K…2M), per-PTE
//! against batched (`folio_pte_batch`), and the host kernel with the same layout (mTHP knob
//! of that size; 2M PMD THPs PTE-mapped by an `mprotect` of one subpage per block).
//!
//! Besides seed 000's anonymous layout, each table has rows of file-backed memory, the paths
//! the seed batches as well (`folio_dup_file_rmap_ptes` in fork, the file branch of
//! `zap_present_ptes`): a written `MAP_PRIVATE` tmpfs mapping for fork and `MAP_SHARED` tmpfs
//! mappings of 64K and 2M folios for munmap (see [`Layout`]).
//!
//! Repetitions are interleaved across the three columns, in an order rotated per repetition,
//! so a burst of interference from other work on the machine does not land on one column
//! only. At 4K both engine columns take the per-PTE path, the batched one after testing each
//! page for a large folio (`folio_test_large`, as Linux's batched code does): that row is the
//! near-A/A control, which reads `~` without host columns (see the README on the 1-5 % the
//! extra test costs when host cells churn the caches between repetitions). The true A/A
//! control is the `per-pte again` column: the baseline measured a second time, a cell of
//! its own in every repetition's rotation, whose gain is the noise.

use crate::columns::EngineColumn;
use crate::ctx::Ctx;
use crate::engine::{counters, machine, populate, sig, size_label, warm_up, PMD, RW};
use crate::host::agent::{self, HostCell};
use crate::host::HostSession;
use crate::model::{Better, Column, Published, Row, SeedSign, Stat, Table, Unit, Variant};
use crate::stats::rotation_host_last;
use std::collections::BTreeMap;
use std::time::Instant;
use usermm::tunables::ShmemHuge;
use usermm::{Access, Cpu, Ev, InodeKind, Machine, MmapArgs, Pid, Placement, Prot, Sharing};
use usermm::{Privilege, ThpPolicy};

pub use crate::host::Layout;

/// The folio sizes of the seed's table.
pub const FOLIOS: [u64; 9] = [
    4 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    2 << 20,
];

/// Seed 000's published fork() change per folio size (Xeon Silver 4210R, 1 GiB).
const SEED_FORK: [(u64, &str); 9] = [
    (4 << 10, "-2%"),
    (16 << 10, "-16%"),
    (32 << 10, "-24%"),
    (64 << 10, "-26%"),
    (128 << 10, "-28%"),
    (256 << 10, "-29%"),
    (512 << 10, "-30%"),
    (1 << 20, "-30%"),
    (2 << 20, "-30%"),
];

// The table's side of a layout (the type is the host side's: the agent builds it too).
impl Layout {
    /// The row label's prefix and the JSON's `layout`.
    pub fn describe(self) -> &'static str {
        match self {
            Layout::Anon => "anon",
            Layout::TmpfsPrivate => "tmpfs MAP_PRIVATE, read, one page per 2M written",
            Layout::TmpfsShared => "tmpfs MAP_SHARED, written",
        }
    }

    /// What row labels of this layout start with (none for seed 000's anonymous rows).
    fn prefix(self) -> Option<&'static str> {
        match self {
            Layout::Anon => None,
            Layout::TmpfsPrivate => Some("file-private"),
            Layout::TmpfsShared => Some("tmpfs-shared"),
        }
    }

    fn label(self, folio: u64) -> String {
        match self.prefix() {
            None => size_label(folio),
            Some(p) => format!("{p} {}", size_label(folio)),
        }
    }
}

/// The file rows of each table: (layout, folio size).
const FILE_ROWS: [(Op, Layout, u64); 4] = [
    (Op::Fork, Layout::TmpfsPrivate, 4 << 10),
    (Op::Fork, Layout::TmpfsPrivate, 64 << 10),
    (Op::Munmap, Layout::TmpfsShared, 64 << 10),
    (Op::Munmap, Layout::TmpfsShared, 2 << 20),
];

/// The file rows of `op`'s table.
fn file_rows(op: Op) -> impl Iterator<Item = (Layout, u64)> {
    FILE_ROWS
        .iter()
        .filter(move |r| r.0 == op)
        .map(|&(_, l, f)| (l, f))
}

/// A machine for a file layout: shmem faults and writes allocate folios of `folio` bytes
/// (that size's `shmem_enabled` set to `always`, which reaches tmpfs files), anonymous THP
/// off.
fn file_machine(size: u64, folio: u64) -> Machine {
    let m = machine(size, 4096);
    m.update_tunables(|t| {
        t.thp.top = ThpPolicy::Never;
        if folio > 4096 {
            t.shmem.per_order[folio.trailing_zeros() as usize - 12] = ShmemHuge::Always;
        }
    });
    m
}

/// `[a + skew, a + skew + len)` with `a` PMD-aligned and nothing mapped there: a
/// `PROT_NONE` reservation with its head and tail unmapped again.
pub(crate) fn reserve_aligned(cpu: &Cpu<'_>, p: Pid, len: u64, skew: u64) -> anyhow::Result<u64> {
    let r = cpu.mmap(p, MmapArgs::anon(len + PMD, Prot::NONE))?;
    let a = (r + PMD - 1) & !(PMD - 1);
    cpu.munmap(p, r, len + PMD)?;
    Ok(a + skew)
}

/// Maps and populates a layout of a row; returns its start.
fn populate_layout(
    cpu: &Cpu<'_>,
    p: Pid,
    size: u64,
    folio: u64,
    layout: Layout,
) -> anyhow::Result<u64> {
    match layout {
        Layout::Anon => populate(cpu, p, size, folio == PMD),
        Layout::TmpfsPrivate | Layout::TmpfsShared => populate_tmpfs(cpu, p, size, folio, layout),
    }
}

/// The tmpfs layouts of [`Layout`]: a new sparse file, mapped and populated.
fn populate_tmpfs(
    cpu: &Cpu<'_>,
    p: Pid,
    size: u64,
    folio: u64,
    layout: Layout,
) -> anyhow::Result<u64> {
    let f = cpu.file_create(size, InodeKind::Tmpfs, None)?;
    let map = |addr: u64, sharing: Sharing| {
        cpu.mmap(
            p,
            MmapArgs {
                sharing,
                placement: Placement::Fixed(addr),
                file: Some((f, 0)),
                ..MmapArgs::anon(size, RW)
            },
        )
    };
    if layout == Layout::TmpfsPrivate {
        let a = map(reserve_aligned(cpu, p, size, 0)?, Sharing::Private)?;
        cpu.touch(p, a, size, Access::Read).map_err(sig)?;
        for blk in (a..a + size).step_by(PMD as usize) {
            cpu.touch(p, blk, 4096, Access::Write).map_err(sig)?;
        }
        return Ok(a);
    }
    let mut a = map(reserve_aligned(cpu, p, size, 0)?, Sharing::Shared)?;
    cpu.touch(p, a, size, Access::Write).map_err(sig)?;
    let skew = layout.skew(folio);
    if skew != 0 {
        cpu.munmap(p, a, size)?;
        a = map(reserve_aligned(cpu, p, size, skew)?, Sharing::Shared)?;
        cpu.touch(p, a, size, Access::Read).map_err(sig)?;
    }
    Ok(a)
}

/// What is timed after populating the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `fork()` (the child exits at once; only the call is timed).
    Fork,
    /// `munmap()` of the whole layout.
    Munmap,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Fork => "fork",
            Op::Munmap => "munmap",
        }
    }
}

/// One engine repetition: (seconds, counters of the timed operation).
pub(crate) fn engine_once(
    size: u64,
    folio: u64,
    layout: Layout,
    column: &EngineColumn,
    op: Op,
) -> anyhow::Result<(f64, usermm::Snapshot)> {
    let m = match layout {
        Layout::Anon => machine(size, folio),
        _ => file_machine(size, folio),
    };
    let cpu = m.enter_cpu(0)?;
    let p = cpu.spawn(Privilege::Ordinary, 8 << 20)?;
    // Every column's layout is built alike, the warm-up's munmap zapping with the default
    // batching: only the timed call runs the variant's.
    warm_up(&cpu, p, size)?;
    let a = populate_layout(&cpu, p, size, folio, layout)?;
    column.apply(&m)?;
    let before = m.counters();
    let t = Instant::now();
    match op {
        Op::Fork => {
            cpu.fork(p)?;
        }
        Op::Munmap => cpu.munmap(p, a, size)?,
    }
    let secs = t.elapsed().as_secs_f64();
    Ok((secs, m.counters().delta(&before)))
}

/// One host repetition, in a fresh agent process (see [`crate::host::agent`]).
fn host_once(
    s: &HostSession,
    size: u64,
    folio: u64,
    layout: Layout,
    op: Op,
) -> Result<(f64, BTreeMap<String, u64>), String> {
    match layout {
        Layout::Anon => s.folio(folio)?,
        _ => s.shmem_folio(folio)?,
    }
    agent::measure(&HostCell::ForkOrMunmap {
        size,
        folio,
        layout,
        munmap: op == Op::Munmap,
    })
}

/// The table's own engine columns (the first is the baseline), each setting the batching of
/// fork and zap for the timed call.
fn own_columns() -> Vec<EngineColumn> {
    let both = |b| [("fork_pte_batch", b), ("zap_pte_batch", b)];
    vec![
        EngineColumn::new(
            "per-pte",
            "one PTE, one refcount and one rmap operation at a time (before seed 000)",
            &both("per-pte"),
        ),
        EngineColumn::new(
            "batched",
            "folio_pte_batch: one refcount/rmap operation per run of a folio (seed 000)",
            &both("batched"),
        ),
    ]
}

/// The columns of this table: the engine's, the baseline's A/A control, the host.
fn variants(engine: &[EngineColumn]) -> Vec<Variant> {
    let mut v: Vec<Variant> = engine.iter().map(EngineColumn::variant).collect();
    v.push(Variant::control(&engine[0].name));
    v.push(Variant::host(
        "the host kernel, same layout (mTHP knob of that size; THP knobs restored)",
    ));
    v
}

/// One folio size: every column, repetitions interleaved.
fn row(
    ctx: &Ctx<'_>,
    op: Op,
    layout: Layout,
    folio: u64,
    host: &Result<HostSession, String>,
    engine: &[EngineColumn],
) -> anyhow::Result<Row> {
    let size = ctx.opts.scale;
    let variants = variants(engine);
    let mut cols: Vec<Column> = variants
        .iter()
        .map(|v| Column::new(&v.name, vec![], BTreeMap::new()))
        .collect();
    let label = layout.label(folio);
    let mut reps = ctx.repetitions(&variants, &engine[0].name, Better::Lower);
    while let Some(rep) = reps.next(&cols) {
        // Untimed: the first engine cell after a host cell runs slow (see the rotation).
        engine_once(size, folio, layout, &engine[0], op)?;
        for i in rotation_host_last(rep, cols.len()) {
            // The engine columns' settings, then the A/A control's (the baseline's).
            match engine.get(i).or((i == engine.len()).then(|| &engine[0])) {
                Some(column) => {
                    let (secs, c) = engine_once(size, folio, layout, column, op)?;
                    cols[i].samples.push(secs);
                    cols[i].counters = counters(&c);
                }
                None => cols[i].record(
                    host.as_ref()
                        .map_err(Clone::clone)
                        .and_then(|s| host_once(s, size, folio, layout, op)),
                ),
            }
            ctx.task.step(&format!("{label} {}", cols[i].variant))?;
        }
    }
    let published = match op {
        Op::Fork if layout == Layout::Anon => SEED_FORK
            .iter()
            .filter(|(f, _)| *f == folio)
            .map(|(_, text)| Published::parse("batched", text, SeedSign::TimeChange))
            .collect(),
        _ => vec![],
    };
    Ok(Row {
        label,
        columns: cols,
        published,
        layout: Some(layout.describe().into()),
    })
}

/// Measurements of one table (for the progress bar) with `engine` engine columns (0: the
/// table's own).
pub fn steps(ctx_reps: usize, folios: usize, op: Op, engine: usize) -> u64 {
    let engine = if engine == 0 {
        own_columns().len()
    } else {
        engine
    };
    (ctx_reps * (folios + file_rows(op).count()) * (engine + 2)) as u64
}

/// How the floor's per-PTE work changes entries and `struct page`s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FloorOps {
    /// Plain loads and stores.
    Plain,
    /// The kernel's: a locked write-protect per source entry (`ptep_set_wrprotect`'s `lock
    /// and`), a locked clear of PageAnonExclusive and a locked per-page mapcount increment
    /// on each page's line, two locked adds on each folio's head line.
    Locked,
}

/// The floor of batched fork: the work it must do per PTE, with none of the simulator's or
/// the kernel's other costs, in seconds for a layout of `size` bytes in folios of `folio`
/// bytes. Per source entry: read it, write-protect it, store the child's copy; per page:
/// clear PageAnonExclusive and raise its mapcount on the page's own 64-byte line (a `struct
/// page`, `CONFIG_PAGE_MAPCOUNT`); per folio: its refcount and large mapcount on the head's
/// line. The entries and lines are evicted from L1 and L2 before each run (an 8 MiB stream
/// on a 2 MiB-L2 machine), as they are when fork reaches them after populating the layout.
/// Best of five.
fn fork_floor(size: u64, folio: u64, ops: FloorOps) -> f64 {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
    const RW: u64 = 1 << 1;
    const ANON_EXCLUSIVE: u32 = 1 << 9;
    let n = (size / 4096).max(1) as usize;
    let per = (folio / 4096).clamp(1, n as u64) as usize;
    let src: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let mut dst = vec![0u64; n];
    let memmap: Vec<[AtomicU32; 16]> = (0..n).map(|_| Default::default()).collect();
    let evict = vec![1u8; 8 << 20];
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        for (i, e) in src.iter().enumerate() {
            e.store(((i as u64) << 12) | 0x67, Relaxed);
        }
        for m in &memmap {
            m[0].store(ANON_EXCLUSIVE, Relaxed);
            m[2].store(0, Relaxed);
        }
        std::hint::black_box(evict.iter().step_by(64).map(|&b| u64::from(b)).sum::<u64>());
        let t = Instant::now();
        for f in (0..n).step_by(per) {
            let head = &memmap[f];
            let end = (f + per).min(n);
            match ops {
                FloorOps::Locked => {
                    head[1].fetch_add(per as u32, Relaxed);
                    head[3].fetch_add(per as u32, Relaxed);
                    for i in f..end {
                        dst[i] = src[i].fetch_and(!RW, Relaxed) & !RW;
                        let m = &memmap[i];
                        if m[0].load(Relaxed) & ANON_EXCLUSIVE != 0 {
                            m[0].fetch_and(!ANON_EXCLUSIVE, Relaxed);
                        }
                        m[2].fetch_add(1, Relaxed);
                    }
                }
                FloorOps::Plain => {
                    head[1].store(head[1].load(Relaxed) + per as u32, Relaxed);
                    head[3].store(head[3].load(Relaxed) + per as u32, Relaxed);
                    for i in f..end {
                        let v = src[i].load(Relaxed);
                        src[i].store(v & !RW, Relaxed);
                        dst[i] = v & !RW;
                        let m = &memmap[i];
                        m[0].store(m[0].load(Relaxed) & !ANON_EXCLUSIVE, Relaxed);
                        m[2].store(m[2].load(Relaxed) + 1, Relaxed);
                    }
                }
            }
        }
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

/// The seed-000 table for `op`.
pub fn table(ctx: &Ctx<'_>, op: Op) -> anyhow::Result<Table> {
    let host = ctx.host.session();
    let engine = ctx.engine_columns(own_columns());
    let mut rows = Vec::new();
    for &folio in &ctx.opts.folios {
        rows.push(row(ctx, op, Layout::Anon, folio, &host, &engine)?);
        ctx.row_done();
    }
    for (layout, folio) in file_rows(op) {
        rows.push(row(ctx, op, layout, folio, &host, &engine)?);
        ctx.row_done();
    }
    drop(host);
    let (batches, ptes) = match op {
        Op::Fork => ("fork_batches", "fork_ptes"),
        Op::Munmap => ("zap_batches", "zap_ptes"),
    };
    let mut notes = vec![format!(
        "layout: {} MiB written, in folios of the row's size; 2M: PMD THPs PTE-mapped by mprotect of one subpage per block",
        ctx.opts.scale >> 20
    )];
    for (layout, _) in file_rows(op).take(1) {
        notes.push(format!(
            "{} rows: {} (tmpfs folios of the row's size: that size's shmem_enabled = always on both sides)",
            layout.prefix().unwrap_or_default(),
            layout.describe()
        ));
    }
    if op == Op::Fork {
        let size = ctx.opts.scale;
        let ptes = (size / 4096).max(1) as f64;
        let floor: Vec<String> = [4 << 10, 64 << 10, PMD]
            .iter()
            .map(|&folio| {
                let (plain, locked) = (
                    fork_floor(size, folio, FloorOps::Plain),
                    fork_floor(size, folio, FloorOps::Locked),
                );
                format!(
                    "{}: {:.3} ms ({:.1} ns/PTE) with plain stores, {:.3} ms ({:.1} ns/PTE) with the kernel's locked RMWs",
                    size_label(folio),
                    plain * 1e3,
                    plain * 1e9 / ptes,
                    locked * 1e3,
                    locked * 1e9 / ptes
                )
            })
            .collect();
        notes.push(format!(
            "floor, the anonymous rows' cold per-PTE work alone (read, write-protect and copy each entry; clear PageAnonExclusive and raise the mapcount on each page's line; refcount and large mapcount on each folio's head line): {}",
            floor.join("; ")
        ));
    }
    notes.push(match op {
        Op::Fork => "host: a fresh agent process builds the layout; only its fork() call is timed (the child _exits at once); host_vmas and host_rss_anon_kb describe the agent".into(),
        Op::Munmap => "host: a fresh agent process builds the layout; the munmap() of the whole layout is timed".into(),
    });
    Ok(Table {
        host_matches: None,
        cost_model: None,
        id: op.name().into(),
        title: format!(
            "{}() of {} MiB of PTE-mapped folios, per folio size",
            op.name(),
            ctx.opts.scale >> 20
        ),
        seed: Some("000".into()),
        metric: format!("{}() time", op.name()),
        unit: Unit::Seconds,
        better: Better::Lower,
        stats: vec![Stat::Min, Stat::Median, Stat::Max],
        baseline: engine[0].name.clone(),
        variants: variants(&engine),
        row_label: "folio size".into(),
        rows,
        counters_shown: vec![
            batches.into(),
            ptes.into(),
            Ev::RefcountAtomic.name().into(),
            Ev::MapcountAtomic.name().into(),
            Ev::PteWrite.name().into(),
            "host_mthp_anon_fault_alloc".into(),
            "host_thp_split_pmd".into(),
            "host_mthp_shmem_alloc".into(),
            "host_shmem_pmd_mapped_kb".into(),
            "host_vmas".into(),
            "host_rss_anon_kb".into(),
        ],
        published_source: (op == Op::Fork).then(|| {
            "v6.8-rc1 vs the series, fork() with 1 GiB of PTE-mapped folios, Xeon Silver 4210R (shown as gain: -30% time = 30%)".to_string()
        }),
        notes,
    })
}
