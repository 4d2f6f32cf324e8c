//! Forks a populated layout many times (for `perf record`): `cargo run --release --example
//! fork_profile -- [folio KiB] [MiB] [forks]`. With `USERMM_PERF_CTL=<fifo>` it writes
//! `enable` and `disable` to a `perf record -D -1 --control fifo:<fifo>,<ack fifo>` around
//! each fork and waits for perf's ack (`USERMM_PERF_ACK=<ack fifo>`), so the profile holds
//! the forks alone (the layout's population dominates otherwise).

use std::time::Instant;
use usermm::{Machine, MachineConfig, MmapArgs, Privilege, Prot};

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let folio = args.first().copied().unwrap_or(64) << 10;
    let size = args.get(1).copied().unwrap_or(256) << 20;
    let forks = args.get(2).copied().unwrap_or(50);
    let mut cfg = MachineConfig {
        memory: (size * 2 + (64 << 20)).next_power_of_two(),
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = false;
    cfg.tunables.sharing_shadow = false;
    let m = Machine::new(cfg);
    m.update_tunables(|t| t.thp.only_folio(folio));
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 << 20).expect("spawn");
    let rw = Prot::RW;
    let ro = Prot::RO;
    let open = |var: &str, write: bool| {
        std::env::var_os(var).map(|path| {
            std::fs::OpenOptions::new()
                .read(!write)
                .write(write)
                .open(path)
                .expect("perf control fifo")
        })
    };
    let mut perf = open("USERMM_PERF_CTL", true).zip(open("USERMM_PERF_ACK", false));
    let mut toggle = |cmd: &[u8]| {
        use std::io::{Read, Write};
        if let Some((ctl, ack)) = perf.as_mut() {
            ctl.write_all(cmd).expect("perf control");
            let mut answer = [0u8; 5];
            ack.read_exact(&mut answer).expect("perf ack");
        }
    };
    let mut best = f64::MAX;
    let mut total = 0.0;
    for _ in 0..forks {
        // A fresh layout each time, as the bench's: the first fork write-protects every PTE
        // and clears every PageAnonExclusive, a second one of the same layout would not.
        let a = cpu.mmap(p, MmapArgs::anon(size, rw)).expect("mmap");
        cpu.write_fill(p, a, size, 1).expect("fill");
        if folio == 2 << 20 {
            for blk in (a..a + size).step_by(2 << 20) {
                cpu.mprotect(p, blk, 4096, ro).expect("mprotect");
                cpu.mprotect(p, blk, 4096, rw).expect("mprotect");
            }
        }
        toggle(b"enable\n");
        let t = Instant::now();
        let c = cpu.fork(p).expect("fork");
        let s = t.elapsed().as_secs_f64();
        toggle(b"disable\n");
        best = best.min(s);
        total += s;
        cpu.exit(c).expect("exit");
        cpu.munmap(p, a, size).expect("munmap");
    }
    println!("mean fork {:.3} ms", total * 1e3 / forks as f64);
    println!(
        "best fork {:.3} ms, {:.2} ns/PTE",
        best * 1e3,
        best * 1e9 / (size >> 12) as f64
    );
}
