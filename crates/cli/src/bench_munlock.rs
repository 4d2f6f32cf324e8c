//! `usermm bench munlock`: seed 004's timedmunlock, one column per munlock design.
//!
//! Maps `size` bytes `MAP_LOCKED | MAP_POPULATE`, then times `munlock` of all of it, for
//! stage0…stage7 (the 2013 series applied cumulatively) and the modern design, in three
//! setups: one node without THP, two nodes with interleaved placement, THP on. Tables follow
//! mmtests' compare layout (min/mean/stddev/max with % change against stage0).

use std::time::Instant;
use usermm::machine::MemPolicy;
use usermm::tunables::MunlockDesign;
use usermm::{Ev, Machine, MachineConfig, MmapArgs, Privilege, Prot, ThpPolicy};

const RW: Prot = Prot {
    read: true,
    write: true,
    exec: false,
};

/// One benchmark setup.
#[derive(Clone, Copy, Debug)]
pub enum Setup {
    /// One node, THP off.
    OneNode,
    /// Two nodes, interleaved placement.
    Interleaved,
    /// One node, THP on.
    Thp,
}

impl Setup {
    fn title(self) -> &'static str {
        match self {
            Setup::OneNode => "one node, THP off",
            Setup::Interleaved => "2 nodes, interleaved (numactl --interleave)",
            Setup::Thp => "THP on",
        }
    }

    /// The seed's stage7 improvement of the mean for this setup.
    fn seed(self) -> &'static str {
        match self {
            Setup::OneNode => "43.46%",
            Setup::Interleaved => "16.59%",
            Setup::Thp => "5.22%",
        }
    }
}

struct Column {
    name: String,
    secs: Vec<f64>,
    counters: usermm::Snapshot,
}

fn one_run(
    size: u64,
    setup: Setup,
    design: MunlockDesign,
) -> anyhow::Result<(f64, usermm::Snapshot)> {
    let nodes = if matches!(setup, Setup::Interleaved) {
        2
    } else {
        1
    };
    let mut cfg = MachineConfig {
        memory: (size + (256 << 20)).next_power_of_two().max(512 << 20) * nodes as u64,
        nodes,
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = false;
    cfg.tunables.munlock = design;
    let m = Machine::new(cfg);
    m.update_tunables(|t| {
        t.thp.top = if matches!(setup, Setup::Thp) {
            ThpPolicy::Always
        } else {
            ThpPolicy::Never
        }
    });
    if matches!(setup, Setup::Interleaved) {
        m.set_mempolicy(MemPolicy::Interleave);
    }
    let cpu = m.enter_cpu(0)?;
    let p = cpu.spawn(Privilege::Privileged, u64::MAX)?;
    let a = cpu.mmap(
        p,
        MmapArgs {
            locked: true,
            populate: true,
            ..MmapArgs::anon(size, RW)
        },
    )?;
    cpu.lru_add_drain();
    let before = m.counters();
    let t = Instant::now();
    cpu.munlock(p, a, size)?;
    let secs = t.elapsed().as_secs_f64();
    Ok((secs, m.counters().delta(&before)))
}

fn stats(v: &[f64]) -> (f64, f64, f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    (min, mean, sd, max)
}

fn print_mmtests(setup: Setup, size: u64, cols: &[Column]) {
    println!(
        "\ntimedmunlock: {} MiB, {} (seed stage7 mean: {})",
        size >> 20,
        setup.title(),
        setup.seed()
    );
    let w = 20;
    let mut header = format!("{:<22}", "");
    for c in cols {
        header.push_str(&format!("{:>w$}", c.name));
    }
    println!("{header}");
    let base = stats(&cols[0].secs);
    let rows: [(&str, fn((f64, f64, f64, f64)) -> f64); 4] = [
        ("Elapsed min", |s| s.0),
        ("Elapsed mean", |s| s.1),
        ("Elapsed stddev", |s| s.2),
        ("Elapsed max", |s| s.3),
    ];
    for (name, pick) in rows {
        let mut line = format!("{name:<22}");
        for c in cols {
            let v = pick(stats(&c.secs));
            let b = pick(base);
            let pct = if b > 0.0 { (b - v) / b * 100.0 } else { 0.0 };
            line.push_str(&format!("{:>w$}", format!("{:.4} ({:6.2}%)", v * 1e3, pct)));
        }
        println!("{line}");
    }
    for (name, ev) in [
        ("lru_lock acquisitions", Ev::LockLru),
        ("refcount atomics", Ev::RefcountAtomic),
        ("NR_MLOCK updates", Ev::NrMlockUpdate),
        ("batch drains", Ev::BatchDrain),
        ("PTL acquisitions", Ev::LockPtl),
        ("PTE reads", Ev::PteRead),
    ] {
        let mut line = format!("{name:<22}");
        for c in cols {
            line.push_str(&format!("{:>w$}", c.counters.get(ev)));
        }
        println!("{line}");
    }
    println!("(times in ms; % is the improvement over stage0, as in the seed)");
}

/// Runs the three tables.
pub fn bench_munlock(size: u64, reps: usize) -> anyhow::Result<()> {
    for setup in [Setup::OneNode, Setup::Interleaved, Setup::Thp] {
        let mut cols = Vec::new();
        for design in MunlockDesign::ALL {
            let mut secs = Vec::new();
            let mut counters = usermm::Snapshot::default();
            for _ in 0..reps {
                let (s, c) = one_run(size, setup, design)?;
                secs.push(s);
                counters = c;
            }
            cols.push(Column {
                name: design.name(),
                secs,
                counters,
            });
        }
        print_mmtests(setup, size, &cols);
    }
    Ok(())
}
