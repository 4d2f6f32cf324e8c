//! The pages an exec image has present are replayed as 4 KiB folios whatever the THP policy,
//! as exec leaves them on 6.18 (it copies the arguments into a stack VMA that covers only
//! them): a stack whose top is 64 KiB aligned must not take a 64 KiB folio for its first
//! page under `64K=always`, while a later fault lower in the stack still may.

use trace::format::{Event, Header, Image, ImageVma, IMG_STACK};
use trace::{replay, ReplayOptions, Trace};

const TOP: u64 = 0x7fff_5765_0000;

fn trace(later_fault: u64) -> Trace {
    let stack = ImageVma {
        start: TOP - (132 << 10),
        end: TOP,
        prot: 3,
        flags: IMG_STACK,
        file: None,
        offset: 0,
    };
    let events = vec![
        Event::Spawn { pid: 1 },
        Event::Exec {
            pid: 1,
            image: Image {
                vmas: vec![stack],
                pages: vec![(TOP - 0x1000, true), (TOP - 0x2000, true)],
            },
        },
        Event::Fault {
            pid: 1,
            addr: later_fault,
            write: true,
            user: true,
        },
        Event::Validate {
            pid: 1,
            rss_anon_kb: 0,
            rss_file_kb: 0,
            anon_huge_kb: 0,
        },
        Event::Exit { pid: 1 },
    ];
    Trace {
        header: Header::default(),
        events,
        file_bytes: 0,
        payload_bytes: 0,
    }
}

fn engine_anon_kb(t: &Trace) -> u64 {
    let opts = ReplayOptions {
        thp: vec![("64K".into(), "always".into())],
        ..ReplayOptions::default()
    };
    let r = replay(t, &opts).expect("replays");
    assert_eq!(r.image_errors, 0);
    assert_eq!(r.rss.len(), 1);
    r.rss[0].engine_anon_kb
}

#[test]
fn exec_pages_are_small_folios_under_64k_always() {
    // A fault in the image pages' own 64 KiB block finds them and stays 4 KiB: 3 pages.
    assert_eq!(engine_anon_kb(&trace(TOP - 0x3000)), 12);
    // A fault in an empty, aligned 64 KiB block of the stack takes a whole 64 KiB folio.
    assert_eq!(engine_anon_kb(&trace(TOP - (100 << 10))), 8 + 64);
}
