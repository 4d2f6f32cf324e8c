//! `usermm bench`: the engine-core benchmarks (fault-in, per-PTE fork).
//!
//! Each benchmark builds a fresh machine per repetition, measures wall time around the
//! operation only, and reports min/median/max with the exact counters of one repetition
//! (counters are deterministic, so every repetition has the same).

use clap::Args;
use std::time::Instant;
use usermm::{Ev, Machine, MachineConfig, MmapArgs, Privilege, Prot, ThpPolicy};

const RW: Prot = Prot {
    read: true,
    write: true,
    exec: false,
};

/// Arguments of `usermm bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Which benchmark: fault, fork, or all.
    #[arg(default_value = "all")]
    which: String,
    /// Size of the memory region, e.g. 256M or 1G.
    #[arg(long, default_value = "256M")]
    size: String,
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

/// Runs the selected benchmarks.
pub fn main(args: &BenchArgs) -> anyhow::Result<()> {
    let size = parse_size(&args.size)?;
    let pages = size / 4096;
    let reps = args.reps.max(1);
    let all = args.which == "all";
    if !all && args.which != "fault" && args.which != "fork" {
        anyhow::bail!("unknown benchmark `{}` (fault, fork, all)", args.which);
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
    }
    Ok(())
}
