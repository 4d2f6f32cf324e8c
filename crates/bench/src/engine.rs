//! Engine helpers shared by the benchmarks: a fresh machine per repetition, warm-up, the
//! seed-000 layout (populated folios of one size, 2M ones PTE-mapped by an `mprotect` of one
//! subpage per block), size labels, and counters as a name → value map.

use std::collections::BTreeMap;
use usermm::{Cpu, Machine, MachineConfig, MmapArgs, Pid, Prot, Snapshot};

/// Read-write (the engine's `PROT_READ | PROT_WRITE`).
pub const RW: Prot = Prot::RW;
/// Read-only (`PROT_READ`).
pub const RO: Prot = Prot::RO;
/// PMD size.
pub const PMD: u64 = 2 << 20;

/// A machine large enough for two copies of `size` bytes, anonymous faults allocating folios
/// of `folio` bytes, TLB checking off (it is a debugging aid, not part of the model's cost).
pub fn machine(size: u64, folio: u64) -> Machine {
    machine_with_cpus(size, folio, MachineConfig::default().cpus)
}

/// [`machine`] with `cpus` CPU slots.
pub fn machine_with_cpus(size: u64, folio: u64, cpus: usize) -> Machine {
    let mut cfg = MachineConfig {
        memory: (size * 2 + (64 << 20)).next_power_of_two(),
        cpus,
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = false;
    let m = Machine::new(cfg);
    m.update_tunables(|t| t.thp.only_folio(folio));
    m
}

/// An engine error as `anyhow`.
pub fn sig(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// Faults a region in and unmaps it, so that the host has backed the arena frames the
/// measured run will reuse (the host's own first-touch cost is not the engine's).
pub fn warm_up(cpu: &Cpu<'_>, p: Pid, size: u64) -> anyhow::Result<()> {
    let a = cpu.mmap(p, MmapArgs::anon(size, RW))?;
    cpu.touch(p, a, size, usermm::Access::Write).map_err(sig)?;
    cpu.munmap(p, a, size)?;
    Ok(())
}

/// Maps and write-faults `size` bytes; with `remap`, PTE-maps PMD THPs by an `mprotect` of
/// the first subpage of each 2 MiB block to read-only and back.
pub fn populate(cpu: &Cpu<'_>, p: Pid, size: u64, remap: bool) -> anyhow::Result<u64> {
    let a = cpu.mmap(p, MmapArgs::anon(size, RW))?;
    cpu.touch(p, a, size, usermm::Access::Write).map_err(sig)?;
    if remap {
        for blk in (a..a + size).step_by(PMD as usize) {
            cpu.mprotect(p, blk, 4096, RO)?;
            cpu.mprotect(p, blk, 4096, RW)?;
        }
    }
    Ok(a)
}

/// The non-zero counters by name.
pub fn counters(s: &Snapshot) -> BTreeMap<String, u64> {
    s.nonzero()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// `4K`, `64K`, `2M`, `1G`.
pub fn size_label(bytes: u64) -> String {
    if bytes >= 1 << 30 && bytes & ((1 << 30) - 1) == 0 {
        format!("{}G", bytes >> 30)
    } else if bytes >= 1 << 20 && bytes & ((1 << 20) - 1) == 0 {
        format!("{}M", bytes >> 20)
    } else {
        format!("{}K", bytes >> 10)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::size_label(64 << 10), "64K");
        assert_eq!(super::size_label(2 << 20), "2M");
    }
}
