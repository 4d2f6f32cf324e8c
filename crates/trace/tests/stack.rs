//! The main stack grows on replay as 6.18 grows it: a fault below it moves its start to the
//! faulting page only, within 8 MiB and the 256-page guard gap. Under `2M=always` or
//! `64K=always` a stack grown page by page therefore takes 4 KiB folios, as the host gave
//! (a program recursing 6 MiB deep: `AnonHugePages` 0 kB at exit on the host, 6 144 kB when
//! the replay mapped the stack 8 MiB deep from the start). A `MAP_STACK` mapping (a thread
//! stack) takes no large folio at all: 6.18 makes it `VM_NOHUGEPAGE`.

use trace::format::{Event, Header, Image, ImageVma, IMG_STACK};
use trace::{replay, ReplayOptions, ReplayReport, Trace};

const TOP: u64 = 0x7ffc_8d60_b000;
const EXEC_STACK: u64 = 132 << 10;

fn vma(start: u64, end: u64, flags: u8) -> ImageVma {
    ImageVma {
        start,
        end,
        prot: 3,
        flags,
        file: None,
        offset: 0,
    }
}

/// A process whose image has `below` (if any) and the stack, faulting at `faults` in order.
fn trace(below: Option<ImageVma>, faults: &[u64]) -> Trace {
    let mut vmas: Vec<ImageVma> = below.into_iter().collect();
    vmas.push(vma(TOP - EXEC_STACK, TOP, IMG_STACK));
    let mut events = vec![
        Event::Spawn { pid: 1 },
        Event::Exec {
            pid: 1,
            image: Image {
                vmas,
                pages: vec![(TOP - 0x1000, true)],
            },
        },
    ];
    events.extend(faults.iter().map(|&addr| Event::Fault {
        pid: 1,
        addr,
        write: true,
        user: true,
    }));
    events.push(Event::Validate {
        pid: 1,
        rss_anon_kb: 0,
        rss_file_kb: 0,
        anon_huge_kb: 0,
    });
    events.push(Event::Exit { pid: 1 });
    Trace {
        header: Header::default(),
        events,
        file_bytes: 0,
        payload_bytes: 0,
    }
}

fn run(t: &Trace, size: &str) -> ReplayReport {
    let opts = ReplayOptions {
        thp: vec![(size.into(), "always".into())],
        ..ReplayOptions::default()
    };
    let r = replay(t, &opts).expect("replays");
    assert_eq!(r.image_errors, 0);
    assert_eq!(r.rss.len(), 1);
    r
}

/// Faults one page below another, from just under exec's stack down `bytes`.
fn descending(bytes: u64) -> Vec<u64> {
    let low = TOP - EXEC_STACK;
    (1..=bytes / 4096).map(|i| low - i * 4096).collect()
}

#[test]
fn a_stack_grown_page_by_page_takes_small_folios_under_thp_always() {
    let faults = descending(3 << 20);
    for size in ["2M", "64K"] {
        let r = run(&trace(None, &faults), size);
        assert_eq!(r.fault_signals, 0, "{size}");
        // The exec page and every fault's page, each 4 KiB.
        assert_eq!(r.rss[0].engine_anon_kb, 4 + (3 << 10), "{size}");
        if size == "2M" {
            assert_eq!(r.rss[0].anon_huge_kb.map(|(_, e)| e), Some(0));
        }
    }
}

#[test]
fn a_jump_to_an_aligned_block_below_takes_a_thp_as_on_the_host() {
    // The first fault far below, at a 2 MiB boundary: the stack's start becomes that page,
    // so the whole aligned block [addr, addr + 2M) lies in the stack and is empty.
    let addr = (TOP - (4 << 20)) & !((2 << 20) - 1);
    let r = run(&trace(None, &[addr]), "2M");
    assert_eq!(r.fault_signals, 0);
    assert_eq!(r.rss[0].anon_huge_kb.map(|(_, e)| e), Some(2048));
    assert_eq!(r.rss[0].engine_anon_kb, 4 + 2048);
}

#[test]
fn the_stack_limit_and_the_guard_gap_end_growth_with_a_signal() {
    // 8 MiB deep is the last page allowed; one below faults.
    let r = run(&trace(None, &[TOP - (8 << 20)]), "2M");
    assert_eq!(r.fault_signals, 0);
    let r = run(&trace(None, &[TOP - (8 << 20) - 4096]), "2M");
    assert_eq!(r.fault_signals, 1);
    // A mapping 1 MiB + 1 page below exec's stack: growth into the page right above the
    // 256-page gap works, one page lower does not.
    let low = TOP - EXEC_STACK;
    let below_end = low - (1 << 20) - 4096 - (1 << 20);
    let below = vma(below_end - (64 << 10), below_end, 0);
    let ok = below_end + (1 << 20);
    let r = run(&trace(Some(below.clone()), &[ok]), "2M");
    assert_eq!(r.fault_signals, 0);
    let r = run(&trace(Some(below), &[ok - 4096]), "2M");
    assert_eq!(r.fault_signals, 1);
}

/// A thread stack as glibc maps it (`MAP_STACK`), touched at its top, under `size=always`.
fn thread_stack(flags: u32, size: &str) -> ReplayReport {
    const AT: u64 = 0x7f00_0000_0000;
    let mut t = trace(None, &[]);
    let mmap = Event::Mmap {
        pid: 1,
        addr: 0,
        len: 8 << 20,
        prot: 3,
        flags,
        fd: -1,
        offset: 0,
        file: None,
        ret: AT as i64,
    };
    let touch = Event::Fault {
        pid: 1,
        addr: AT + (8 << 20) - 4096,
        write: true,
        user: true,
    };
    t.events.splice(2..2, [mmap, touch]);
    run(&t, size)
}

#[test]
fn a_map_stack_mapping_takes_no_large_folio_as_6_18_makes_it_nohugepage() {
    const PRIVATE_ANON: u32 = 0x22;
    const MAP_STACK: u32 = 0x20000;
    for (size, folio_kb) in [("2M", 2048), ("64K", 64)] {
        // Without MAP_STACK the top page's empty aligned block is one large folio.
        let r = thread_stack(PRIVATE_ANON, size);
        assert_eq!(r.rss[0].engine_anon_kb, 4 + folio_kb, "{size}");
        // With it, the VMA is VM_NOHUGEPAGE: one 4 KiB page.
        let r = thread_stack(PRIVATE_ANON | MAP_STACK, size);
        assert_eq!(r.rss[0].engine_anon_kb, 4 + 4, "{size}");
    }
}
