//! Seed 001: fork duplicates the VMA tree structurally; the result equals inserting VMA by
//! VMA, and a node allocation failure at any point leaves the child torn down and the parent
//! untouched.

mod common;
use common::*;
use usermm::tunables::VmaTreeCopy;
use usermm::{Advice, Errno, Ev, MmapArgs, Placement, Privilege};

fn setup(m: &usermm::Machine, nr: u64) -> usermm::Pid {
    let cpu = m.enter_cpu(0).expect("cpu");
    let p = cpu.spawn(Privilege::Ordinary, 8 * M).expect("spawn");
    for i in 0..nr {
        let a = 0x1000_0000 + i * 8 * K;
        let args = MmapArgs {
            placement: Placement::Fixed(a),
            ..MmapArgs::anon(4 * K, if i % 3 == 0 { RO } else { RW })
        };
        cpu.mmap(p, args).expect("mmap");
        if i % 3 != 0 {
            cpu.write_fill(p, a, 4 * K, i as u8).expect("write");
        }
        if i % 7 == 0 {
            cpu.madvise(p, a, 4 * K, Advice::DontFork)
                .expect("dontfork");
        }
    }
    p
}

#[test]
fn dup_and_insert_build_the_same_child() {
    let mut results = Vec::new();
    for mode in [VmaTreeCopy::Dup, VmaTreeCopy::Insert] {
        let m = machine(64 * M);
        m.update_tunables(|t| t.vma_tree_dup = mode);
        let p = setup(&m, 300);
        let cpu = m.enter_cpu(0).expect("cpu");
        let c = cpu.fork(p).expect("fork");
        valid(&m);
        let maps = cpu.maps(c).expect("maps");
        assert_eq!(maps.len(), 300 - 43, "dontfork VMAs are not copied");
        for (i, e) in maps
            .iter()
            .enumerate()
            .filter(|(_, e)| e.perms == "rw-p")
            .take(20)
        {
            let v = ((e.start - 0x1000_0000) / (8 * K)) as u8;
            assert_eq!(
                cpu.find_mismatch(c, e.start, 4 * K, v).expect("read"),
                None,
                "entry {i}"
            );
        }
        results.push((maps, cpu.page_table_dump(c).expect("dump").len()));
    }
    assert_eq!(results[0], results[1]);
}

#[test]
fn dup_failure_at_every_node_allocation_tears_the_child_down() {
    failure_at_every_node_allocation_tears_the_child_down(VmaTreeCopy::Dup);
}

#[test]
fn bulk_insert_failure_at_every_node_allocation_tears_the_child_down() {
    failure_at_every_node_allocation_tears_the_child_down(VmaTreeCopy::Insert);
}

fn failure_at_every_node_allocation_tears_the_child_down(mode: VmaTreeCopy) {
    let m = machine(64 * M);
    m.update_tunables(|t| t.vma_tree_dup = mode);
    let p = setup(&m, 200);
    let cpu = m.enter_cpu(0).expect("cpu");
    let maps = cpu.maps(p).expect("maps");
    let frames = m.phys.allocated_frames();
    let committed = m.committed.load(std::sync::atomic::Ordering::Relaxed);
    let mut failures = 0;
    for n in 1..200 {
        m.fail_next_fork_tree_alloc(Some(n));
        match cpu.fork(p) {
            Err(e) => {
                assert_eq!(e, Errno::ENOMEM);
                failures += 1;
                assert_eq!(cpu.maps(p).expect("maps"), maps, "parent untouched");
                assert_eq!(m.phys.allocated_frames(), frames, "no frame leaked (n={n})");
                assert_eq!(
                    m.committed.load(std::sync::atomic::Ordering::Relaxed),
                    committed
                );
                assert_eq!(m.tasks().len(), 1, "no child left behind");
                valid(&m);
            }
            Ok(c) => {
                // Past the number of nodes the dup allocates: it succeeded.
                cpu.exit(c).expect("exit");
                break;
            }
        }
    }
    assert!(
        failures >= 10,
        "{mode:?} allocates several nodes ({failures})"
    );
    valid(&m);
}

#[test]
fn fork_and_teardown_count_each_vma_with_an_anon_vma() {
    let m = machine(64 * M);
    // 30 VMAs: 20 written (i % 3 != 0), five of them not copied (i % 7 == 0: 7, 14, 28
    // written), and one more written VMA wiped on fork.
    let p = setup(&m, 30);
    let cpu = m.enter_cpu(0).expect("cpu");
    let wiped = 0x1000_0000 + 8 * K;
    cpu.madvise(p, wiped, 4 * K, Advice::WipeOnFork)
        .expect("wipeonfork");
    let (c, fork) = counted(&m, || cpu.fork(p));
    assert_eq!(fork.get(Ev::VmaCopied), 25);
    assert_eq!(
        fork.get(Ev::AnonVmaFork),
        16,
        "the 17 written VMAs copied, less the wiped one"
    );
    let (_, exit) = counted(&m, || cpu.exit(c));
    assert_eq!(exit.get(Ev::VmaFreed), 25);
    assert_eq!(exit.get(Ev::AnonVmaUnlink), 16);
    // In the parent: a written VMA has one, a read-only one never faulted has none.
    let (_, written) = counted(&m, || cpu.munmap(p, 0x1000_0000 + 2 * 8 * K, 4 * K));
    assert_eq!(
        (written.get(Ev::VmaFreed), written.get(Ev::AnonVmaUnlink)),
        (1, 1)
    );
    let (_, untouched) = counted(&m, || cpu.munmap(p, 0x1000_0000 + 3 * 8 * K, 4 * K));
    assert_eq!(
        (
            untouched.get(Ev::VmaFreed),
            untouched.get(Ev::AnonVmaUnlink)
        ),
        (1, 0)
    );
}
