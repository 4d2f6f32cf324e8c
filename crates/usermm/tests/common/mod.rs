//! Shared helpers for the engine's integration tests.
#![allow(dead_code)]

use usermm::{Machine, MachineConfig, Prot};

pub const RW: Prot = Prot::RW;
pub const RO: Prot = Prot::RO;
pub const K: u64 = 1024;
pub const M: u64 = 1024 * 1024;

/// A small machine for tests (64 MiB unless asked otherwise), TLB checking on.
pub fn machine(mem: u64) -> Machine {
    let mut cfg = MachineConfig {
        memory: mem,
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = true;
    Machine::new(cfg)
}

/// Panics with the violations if the machine is inconsistent.
#[track_caller]
pub fn valid(m: &Machine) {
    if let Err(e) = m.validate() {
        panic!("validate failed:\n{}", e.join("\n"));
    }
}

/// What `call` returned and the counters it moved, the machine validated after it (the
/// call must succeed).
#[track_caller]
pub fn counted<T, E: std::fmt::Debug>(
    m: &Machine,
    call: impl FnOnce() -> Result<T, E>,
) -> (T, usermm::Snapshot) {
    let before = m.counters();
    let out = call().expect("call");
    valid(m);
    (out, m.counters().delta(&before))
}
