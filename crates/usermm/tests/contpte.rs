//! arm64 contpte: set_ptes folds aligned 64K blocks, single-entry changes unfold them,
//! batched fork and zap keep whole blocks folded; every fold and unfold is counted.

mod common;
use common::*;
use usermm::tunables::PteBatching;
use usermm::{Arch, Ev, Machine, MachineConfig, MmapArgs, Privilege, ThpPolicy};

const CONT: u64 = 1 << 52;

fn arm_machine(batching: PteBatching) -> Machine {
    let mut cfg = MachineConfig {
        memory: 64 * M,
        arch: Arch::Arm64,
        ..MachineConfig::default()
    };
    cfg.tunables.check_tlb = true;
    cfg.tunables.fork_pte_batch = batching;
    cfg.tunables.zap_pte_batch = batching;
    let m = Machine::new(cfg);
    m.update_tunables(|t| t.thp.set_size(64 * K, ThpPolicy::Always).expect("size"));
    m
}

fn cont_entries(cpu: &usermm::Cpu<'_>, p: usermm::Pid) -> usize {
    cpu.page_table_dump(p)
        .expect("dump")
        .iter()
        .filter(|l| l.entry.val() & CONT != 0)
        .count()
}

#[test]
fn mthp_fault_maps_folded_blocks_and_cow_unfolds_one() {
    let m = arm_machine(PteBatching::Batched);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    let a = cpu.mmap(p, MmapArgs::anon(256 * K, RW)).expect("mmap");
    cpu.write_fill(p, a, 256 * K, 1).expect("write");
    assert_eq!(
        cont_entries(&cpu, p),
        64,
        "four 64K folios, each one folded block"
    );
    valid(&m);
    let before = m.counters();
    let c = cpu.fork(p).expect("fork");
    let d = m.counters().delta(&before);
    assert_eq!(
        d.get(Ev::ContUnfold),
        0,
        "batched fork write-protects whole blocks in place"
    );
    assert_eq!(cont_entries(&cpu, p), 64);
    assert_eq!(
        cont_entries(&cpu, c),
        64,
        "the child's set_ptes writes folded blocks"
    );
    let before = m.counters();
    cpu.write_fill(c, a + 4 * K, 1, 2).expect("COW one page");
    let d = m.counters().delta(&before);
    assert_eq!(
        d.get(Ev::ContUnfold),
        1,
        "changing one entry unfolds its block"
    );
    assert_eq!(cont_entries(&cpu, c), 48);
    assert_eq!(cpu.find_mismatch(p, a, 256 * K, 1).expect("read"), None);
    valid(&m);
    let before = m.counters();
    cpu.munmap(p, a + 128 * K + 32 * K, 64 * K)
        .expect("munmap across two blocks");
    let d = m.counters().delta(&before);
    assert_eq!(
        d.get(Ev::ContUnfold),
        2,
        "the two partly covered blocks are unfolded"
    );
    valid(&m);
}

#[test]
fn per_pte_fork_unfolds_the_parent_and_refolds_the_child() {
    let m = arm_machine(PteBatching::PerPte);
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    let a = cpu.mmap(p, MmapArgs::anon(256 * K, RW)).expect("mmap");
    cpu.write_fill(p, a, 256 * K, 1).expect("write");
    let before = m.counters();
    let c = cpu.fork(p).expect("fork");
    let d = m.counters().delta(&before);
    assert_eq!(
        d.get(Ev::ContUnfold),
        4,
        "one write-protect of one entry per block"
    );
    assert_eq!(
        d.get(Ev::ContFold),
        4,
        "the child's last set_pte of each block folds it"
    );
    assert_eq!(cont_entries(&cpu, p), 0);
    assert_eq!(cont_entries(&cpu, c), 64);
    valid(&m);
}
