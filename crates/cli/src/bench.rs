//! `usermm bench`: the engine-core benchmarks (fault-in, per-PTE fork).
//!
//! Each benchmark builds a fresh machine per repetition, measures wall time around the
//! operation only, and reports min/median/max with the exact counters of one repetition
//! (counters are deterministic, so every repetition has the same).

use clap::Args;
use std::time::Instant;
use usermm::tunables::{PteBatching, VmaTreeCopy};
use usermm::{Ev, Machine, MachineConfig, MmapArgs, Privilege, Prot, ThpPolicy};

const RW: Prot = Prot {
    read: true,
    write: true,
    exec: false,
};

/// Arguments of `usermm bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Which benchmark: fault, fork, munmap, spawn, munlock, linear-map, or all.
    #[arg(default_value = "all")]
    which: String,
    /// Size of the memory region, e.g. 256M or 1G.
    #[arg(long, default_value = "256M")]
    size: String,
    /// Seconds per point of the spawn benchmark.
    #[arg(long, default_value_t = 0.3)]
    seconds: f64,
    /// Repetitions per measurement.
    #[arg(long, default_value_t = 5)]
    reps: usize,
}

fn parse_size(s: &str) -> anyhow::Result<u64> {
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| anyhow::anyhow!("bad size `{s}`"))?;
    n.checked_mul(mul)
        .ok_or_else(|| anyhow::anyhow!("size `{s}` overflows"))
}

struct Sample {
    secs: Vec<f64>,
    counters: usermm::Snapshot,
}

impl Sample {
    fn median(&self) -> f64 {
        let mut v = self.secs.clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }
    fn min(&self) -> f64 {
        self.secs.iter().copied().fold(f64::INFINITY, f64::min)
    }
    fn max(&self) -> f64 {
        self.secs.iter().copied().fold(0.0, f64::max)
    }
}

fn machine(size: u64, folio: u64) -> Machine {
    let mut cfg = MachineConfig {
        memory: (size * 2 + (64 << 20)).next_power_of_two(),
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = false;
    let m = Machine::new(cfg);
    m.update_tunables(|t| {
        t.thp.top = ThpPolicy::Never;
        if folio > 4096 {
            let _ = t.thp.set_size(folio, ThpPolicy::Always);
        }
    });
    m
}

/// Faults a region in and unmaps it, so that the host has backed the arena frames the
/// measured run will reuse (the host's own first-touch cost is not the engine's).
fn warm_up(cpu: &usermm::Cpu<'_>, p: usermm::Pid, size: u64) -> anyhow::Result<()> {
    let a = cpu.mmap(p, MmapArgs::anon(size, RW))?;
    cpu.touch(p, a, size, usermm::Access::Write)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    cpu.munmap(p, a, size)?;
    Ok(())
}

/// Times fault-in of `size` bytes in folios of `folio` bytes.
fn bench_fault(size: u64, folio: u64, reps: usize) -> anyhow::Result<Sample> {
    let mut secs = Vec::new();
    let mut counters = usermm::Snapshot::default();
    for _ in 0..reps {
        let m = machine(size, folio);
        let cpu = m.enter_cpu(0)?;
        let p = cpu.spawn(Privilege::Ordinary, 8 << 20)?;
        warm_up(&cpu, p, size)?;
        let a = cpu.mmap(p, MmapArgs::anon(size, RW))?;
        let before = m.counters();
        let t = Instant::now();
        cpu.touch(p, a, size, usermm::Access::Write)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        secs.push(t.elapsed().as_secs_f64());
        counters = m.counters().delta(&before);
    }
    Ok(Sample { secs, counters })
}

/// Times fork of a process with `size` bytes populated in folios of `folio` bytes.
fn bench_fork(size: u64, folio: u64, reps: usize) -> anyhow::Result<Sample> {
    let mut secs = Vec::new();
    let mut counters = usermm::Snapshot::default();
    for _ in 0..reps {
        let m = machine(size, folio);
        let cpu = m.enter_cpu(0)?;
        let p = cpu.spawn(Privilege::Ordinary, 8 << 20)?;
        let a = cpu.mmap(p, MmapArgs::anon(size, RW))?;
        cpu.touch(p, a, size, usermm::Access::Write)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let before = m.counters();
        let t = Instant::now();
        cpu.fork(p)?;
        secs.push(t.elapsed().as_secs_f64());
        counters = m.counters().delta(&before);
    }
    Ok(Sample { secs, counters })
}

fn print_table(title: &str, rows: &[(String, u64, Sample)]) {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header([
        "case",
        "min ms",
        "median ms",
        "max ms",
        "ns/page",
        "faults",
        "pte writes",
        "refcount atomics",
        "pages zeroed",
        "tlb flushes",
    ]);
    for (name, pages, s) in rows {
        let c = &s.counters;
        t.add_row([
            name.clone(),
            format!("{:.2}", s.min() * 1e3),
            format!("{:.2}", s.median() * 1e3),
            format!("{:.2}", s.max() * 1e3),
            format!("{:.1}", s.median() * 1e9 / *pages as f64),
            c.get(Ev::Fault).to_string(),
            c.get(Ev::PteWrite).to_string(),
            c.get(Ev::RefcountAtomic).to_string(),
            c.get(Ev::PagesZeroed).to_string(),
            (c.get(Ev::TlbFlushPage) + c.get(Ev::TlbFlushRange) + c.get(Ev::TlbFlushMm))
                .to_string(),
        ]);
    }
    println!("\n{title}\n{t}");
}

/// Time to zero one 4 KiB frame of the arena (the floor of an anonymous fault).
fn zero_cost(reps: usize) -> f64 {
    let m = machine(64 << 20, 4096);
    let n = 4096u64;
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(3) {
        let t = Instant::now();
        for pfn in 1..n {
            m.phys.arena.zero_frame(pfn);
        }
        best = best.min(t.elapsed().as_secs_f64() / (n - 1) as f64);
    }
    best
}

/// The seed's published fork change per folio size (seed 000, Xeon Silver 4210R).
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

/// What the seed-000 benchmark measures after populating the layout.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ForkOp {
    Fork,
    Munmap,
}

/// Populates `size` bytes in folios of `folio` bytes (2M: PMD THPs remapped by PTEs through an
/// mprotect of one subpage of each block), then times fork or munmap.
fn bench_batching(
    size: u64,
    folio: u64,
    batching: PteBatching,
    op: ForkOp,
    reps: usize,
) -> anyhow::Result<Sample> {
    let mut secs = Vec::new();
    let mut counters = usermm::Snapshot::default();
    for _ in 0..reps {
        let m = machine(size, folio);
        m.update_tunables(|t| {
            t.fork_pte_batch = batching;
            t.zap_pte_batch = batching;
        });
        let cpu = m.enter_cpu(0)?;
        let p = cpu.spawn(Privilege::Ordinary, 8 << 20)?;
        warm_up(&cpu, p, size)?;
        let a = cpu.mmap(p, MmapArgs::anon(size, RW))?;
        cpu.touch(p, a, size, usermm::Access::Write)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if folio == 2 << 20 {
            let ro = Prot {
                read: true,
                write: false,
                exec: false,
            };
            for blk in (a..a + size).step_by(2 << 20) {
                cpu.mprotect(p, blk, 4096, ro)?;
                cpu.mprotect(p, blk, 4096, RW)?;
            }
        }
        let before = m.counters();
        let t = Instant::now();
        match op {
            ForkOp::Fork => {
                cpu.fork(p)?;
            }
            ForkOp::Munmap => cpu.munmap(p, a, size)?,
        }
        secs.push(t.elapsed().as_secs_f64());
        counters = m.counters().delta(&before);
    }
    Ok(Sample { secs, counters })
}

fn pct(new: f64, base: f64) -> String {
    format!("{:+.0}%", (new / base - 1.0) * 100.0)
}

fn bench_seed000(size: u64, reps: usize, op: ForkOp) -> anyhow::Result<()> {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    let name = if op == ForkOp::Fork { "fork" } else { "munmap" };
    t.set_header([
        "folio",
        "per-PTE ms",
        "batched ms",
        "change",
        "speed-up",
        "seed change",
        "batches",
        "PTEs",
        "refcount atomics (per-PTE / batched)",
    ]);
    for (folio, seed) in SEED_FORK {
        let base = bench_batching(size, folio, PteBatching::PerPte, op, reps)?;
        let new = bench_batching(size, folio, PteBatching::Batched, op, reps)?;
        let (bk, pk) = if op == ForkOp::Fork {
            (Ev::ForkBatches, Ev::ForkPtes)
        } else {
            (Ev::ZapBatches, Ev::ZapPtes)
        };
        t.add_row([
            if folio >= 1 << 20 {
                format!("{}M", folio >> 20)
            } else {
                format!("{}K", folio >> 10)
            },
            format!("{:.3}", base.median() * 1e3),
            format!("{:.3}", new.median() * 1e3),
            pct(new.median(), base.median()),
            format!("{:.2}x", base.median() / new.median()),
            if op == ForkOp::Fork {
                seed.to_string()
            } else {
                "n/a".into()
            },
            new.counters.get(bk).to_string(),
            new.counters.get(pk).to_string(),
            format!(
                "{} / {}",
                base.counters.get(Ev::RefcountAtomic),
                new.counters.get(Ev::RefcountAtomic)
            ),
        ]);
    }
    println!(
        "\n{name} of {} MiB of PTE-mapped folios (median of {reps}; seed 000)\n{t}",
        size >> 20
    );
    if op == ForkOp::Fork {
        println!(
            "floor: memcpy of the page-table pages of this layout: {:.3} ms",
            memcpy_floor(size) * 1e3
        );
    }
    Ok(())
}

/// Time to copy the PTE pages that map `size` bytes (one 4K table per 2M), host memcpy.
fn memcpy_floor(size: u64) -> f64 {
    let bytes = (size / (2 << 20)).max(1) as usize * 4096;
    let src = vec![0x5au8; bytes];
    let mut dst = vec![0u8; bytes];
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

/// forks+exits per second of a process with `21 + extra` VMAs, for `secs` seconds.
fn spawn_rate(extra: u64, mode: VmaTreeCopy, secs: f64) -> anyhow::Result<(f64, usermm::Snapshot)> {
    let m = machine(64 << 20, 4096);
    m.update_tunables(|t| t.vma_tree_dup = mode);
    let cpu = m.enter_cpu(0)?;
    let p = cpu.spawn(Privilege::Ordinary, 8 << 20)?;
    let ro = Prot {
        read: true,
        write: false,
        exec: false,
    };
    for i in 0..21 + extra {
        let a = 0x1000_0000 + i * 0x2000;
        let prot = if i < 21 { RW } else { ro };
        let args = MmapArgs {
            placement: usermm::Placement::Fixed(a),
            ..MmapArgs::anon(4096, prot)
        };
        cpu.mmap(p, args)?;
        if i < 21 {
            cpu.write_fill(p, a, 4096, 1)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
    }
    let before = m.counters();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        let c = cpu.fork(p)?;
        cpu.exit(c)?;
        n += 1;
    }
    let per_fork = m.counters().delta(&before);
    Ok((n as f64 / start.elapsed().as_secs_f64(), per_fork))
}

/// Seed 001's spawn benchmark: fork+exit rate, insert vs dup.
fn bench_spawn(secs: f64) -> anyhow::Result<()> {
    let seed = [
        (0u64, "+2%"),
        (100, ""),
        (200, ""),
        (400, ""),
        (800, ""),
        (1600, ""),
        (3200, ""),
        (6400, "+53%"),
    ];
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header([
        "VMAs",
        "insert forks/s",
        "dup forks/s",
        "change",
        "seed change",
    ]);
    for (extra, sd) in seed {
        let (base, _) = spawn_rate(extra, VmaTreeCopy::Insert, secs)?;
        let (new, _) = spawn_rate(extra, VmaTreeCopy::Dup, secs)?;
        t.add_row([
            format!("21+{extra}"),
            format!("{base:.0}"),
            format!("{new:.0}"),
            format!("{:+.0}%", (new / base - 1.0) * 100.0),
            sd.to_string(),
        ]);
    }
    println!("\nspawn: fork+exit loop, {secs} s per point (seed 001)\n{t}");
    Ok(())
}

/// Runs the selected benchmarks.
pub fn main(args: &BenchArgs) -> anyhow::Result<()> {
    let size = parse_size(&args.size)?;
    let pages = size / 4096;
    let reps = args.reps.max(1);
    let all = args.which == "all";
    if args.which == "linear-map" {
        return crate::bench_linear_map::bench_linear_map(&[16, 64, 256, 512], reps);
    }
    if !["all", "fault", "fork", "munmap", "spawn", "munlock", "linear-map"].contains(&args.which.as_str()) {
        anyhow::bail!(
            "unknown benchmark `{}` (fault, fork, munmap, spawn, munlock, all)",
            args.which
        );
    }
    println!(
        "usermm bench: {} MiB, {reps} repetitions, x86_64 page tables",
        size >> 20
    );
    if all || args.which == "fault" {
        let z = zero_cost(reps);
        let rows = vec![
            (
                "fault-in 4K pages".to_string(),
                pages,
                bench_fault(size, 4096, reps)?,
            ),
            (
                "fault-in 64K folios".to_string(),
                pages,
                bench_fault(size, 64 << 10, reps)?,
            ),
        ];
        print_table("Fault-in (write one byte per page)", &rows);
        let per_fault = rows[0].2.median() * 1e9 / pages as f64;
        println!(
            "zeroing one 4K frame: {:.1} ns; 4K fault beyond zeroing: {:.1} ns",
            z * 1e9,
            per_fault - z * 1e9
        );
    }
    if all || args.which == "fork" {
        let rows = vec![(
            "fork, 4K pages, per-PTE".to_string(),
            pages,
            bench_fork(size, 4096, reps)?,
        )];
        print_table(
            "fork of a populated region (copy_page_range one PTE at a time)",
            &rows,
        );
        bench_seed000(size, reps, ForkOp::Fork)?;
    }
    if all || args.which == "munmap" {
        bench_seed000(size, reps, ForkOp::Munmap)?;
    }
    if all || args.which == "spawn" {
        bench_spawn(args.seconds)?;
    }
    if all || args.which == "munlock" {
        crate::bench_munlock::bench_munlock(size, reps)?;
    }
    if all {
        crate::bench_linear_map::bench_linear_map(&[16, 64], reps)?;
    }
    Ok(())
}
