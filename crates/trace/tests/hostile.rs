//! Hostile traces (issue 34, findings 4, 5 and 7): a small file may not make a reader use
//! unbounded memory, time or output; counts saturate; strings cannot escape their comment or
//! reach a terminal raw; the writer never writes what the reader refuses; a file reference
//! to an undefined file is refused by every reader; `--thp` sizes neither panic nor wrap.

mod common;

use common::{Payload, EVIL, POPULATE_FIXED};
use trace::format::{self, Decoder, Event, FormatError, Header, Image, ImageVma, Writer};
use trace::replay::{machine_config, replay, replay_decoder, thp_size, ReplayError};
use trace::{Budget, ReplayOptions, Trace};

fn budget_err(r: Result<Trace, FormatError>) -> (u64, String) {
    match r {
        Err(FormatError::Budget { offset, what }) => (offset, what),
        other => panic!(
            "expected a budget error, got {:?}",
            other.map(|t| t.events.len())
        ),
    }
}

#[test]
fn a_small_file_of_millions_of_events_stops_at_the_event_budget() {
    let mut p = Payload::new(&["x"]);
    p.spawn().faults(3 << 20, 0);
    let bytes = p.file_bytes();
    assert!(bytes.len() < 1024, "{} bytes", bytes.len());
    let (offset, what) = budget_err(format::read(&bytes));
    assert!(what.contains("--max-events"), "{what}");
    // The tag of event 2^20 + 1: header (10 bytes), spawn (2), then 2 bytes a fault.
    assert_eq!(offset, 10 + 2 + 2 * ((1 << 20) - 1));
    // Streamed with the budget raised, every event comes out one at a time.
    let b = Budget {
        max_events: u64::MAX,
        ..Budget::default()
    };
    let mut d = Decoder::from_bytes(&bytes, &b).unwrap();
    let mut n = 0u64;
    while d.next_event().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 1 + (3 << 20));
    assert_eq!(d.payload_bytes(), p.end().len() as u64);
}

#[test]
fn an_exec_image_past_the_page_budget_is_refused_before_it_is_held() {
    let mut p = Payload::new(&["x"]);
    p.spawn().exec_pages(1 << 24);
    let bytes = p.file_bytes();
    assert!(bytes.len() < 2048, "{} bytes", bytes.len());
    let (offset, what) = budget_err(format::read(&bytes));
    // The page count's varint: header 10, spawn 2, exec tag 1, VMA count 1.
    assert_eq!(offset, 14);
    assert!(what.contains("--max-image-pages"), "{what}");
    // The budget counts pages over the whole trace, not per image.
    let mut p = Payload::new(&["x"]);
    p.spawn().exec_pages(3 << 18).exec_pages(3 << 18);
    let (_, what) = budget_err(format::read(&p.file_bytes()));
    assert!(what.contains("in all"), "{what}");
}

#[test]
fn a_zstd_window_past_16_mib_is_refused() {
    // A frame compressed with a 128 MiB window (what zstd's reader accepted by default).
    let payload = Payload::new(&["x"]).end();
    let mut bytes = b"UMMTRACE\x01\x00\x00\x00".to_vec();
    let mut z = Vec::new();
    {
        let mut enc = zstd::stream::write::Encoder::new(&mut z, 19).unwrap();
        enc.set_parameter(zstd::zstd_safe::CParameter::WindowLog(27))
            .unwrap();
        enc.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
            .unwrap();
        std::io::Write::write_all(&mut enc, &payload).unwrap();
        enc.finish().unwrap();
    }
    bytes.extend_from_slice(&z);
    match format::read(&bytes) {
        Err(FormatError::File { offset: 12, what }) => {
            assert!(what.contains("too much memory"), "{what}")
        }
        other => panic!("{other:?}"),
    }
    // The same payload as the writer compresses it reads.
    assert!(format::read(&format::seal(&payload).unwrap()).is_ok());
}

#[test]
fn export_text_stops_at_the_output_budget() {
    let mut p = Payload::new(&["x"]);
    p.spawn().exec_pages(1 << 16);
    let t = format::read(&p.file_bytes()).unwrap();
    let small = Budget {
        max_output: 1 << 20,
        ..Budget::default()
    };
    match trace::export::to_scenario_with(&t, &small) {
        Err(trace::export::ExportError::Output(1, max)) => assert_eq!(max, 1 << 20),
        other => panic!("{:?}", other.map(|s| s.len())),
    }
    // The default budget: the most image pages a trace may hold export within 64 MiB.
    let mut p = Payload::new(&["x"]);
    p.spawn().exec_pages(1 << 20);
    let t = format::read(&p.file_bytes()).unwrap();
    let text = trace::export::to_scenario(&t).unwrap();
    assert!(text.len() as u64 <= Budget::default().max_output);
    assert_eq!(
        text.lines().filter(|l| l.contains(" touch ")).count(),
        1 << 20
    );
}

fn populate_loop() -> Payload {
    let a = 0x1000_0000u64;
    let mut p = Payload::new(&["x"]);
    p.spawn().exec(&[]);
    for _ in 0..100 {
        p.mmap(a, 3 << 30, POPULATE_FIXED, 0, a as i64)
            .madvise(a, 3 << 30, 4);
    }
    p
}

#[test]
fn a_populate_past_the_touch_budget_is_refused_before_it_runs() {
    let p = populate_loop();
    let bytes = p.file_bytes();
    assert!(bytes.len() < 128, "{} bytes", bytes.len());
    // Refused at event 2, before it runs (the event and offset say so: no timing needed).
    let mut d = Decoder::from_bytes(&bytes, &Budget::default()).unwrap();
    match replay_decoder(&mut d, &ReplayOptions::default()) {
        Err(ReplayError::Budget {
            event: 2,
            offset: Some(15),
            what,
        }) => assert!(
            what.contains("--max-touch") && what.contains("3221225472"),
            "{what}"
        ),
        other => panic!("{:?}", other.map(|r| r.events)),
    }
    // With the budget raised to 4 GiB of work, the first populate runs and the second is
    // refused: the budget is a sum over the replay, not a per-event cap.
    let opts = ReplayOptions {
        memory: 4 << 30,
        budget: Budget {
            max_touch: 4 << 30,
            ..Budget::default()
        },
        ..ReplayOptions::default()
    };
    let t = format::read(&bytes).unwrap();
    match replay(&t, &opts) {
        Err(ReplayError::Budget { event: 4, what, .. }) => {
            assert!(what.contains("spent"), "{what}")
        }
        other => panic!("{:?}", other.map(|r| r.events)),
    }
}

#[test]
fn frames_in_use_past_the_budget_stop_the_replay() {
    // Faults 2 MiB apart in an aligned 1 GiB mapping under 2M THP: each is charged 4 KiB
    // but allocates a PMD folio; the check after each event sees the frames.
    let a = 0x4000_0000u64;
    let mut p = Payload::new(&["x"]);
    p.spawn().exec(&[(a, 1 << 30, 3, 0)]);
    p.byte(17 | common::SAME).signed((a >> 12) as i64);
    for _ in 0..200 {
        p.byte(17 | common::SAME).signed(512); // a write: a read would map the zero page
    }
    let t = format::read(&p.file_bytes()).unwrap();
    let opts = ReplayOptions {
        thp: vec![("2M".into(), "always".into())],
        budget: Budget {
            max_touch: 16 << 20,
            ..Budget::default()
        },
        ..ReplayOptions::default()
    };
    match replay(&t, &opts) {
        Err(ReplayError::Budget { event, what, .. }) => {
            assert!(what.contains("holds"), "{what}");
            assert!((3..20).contains(&event), "{event}");
        }
        other => panic!("{:?}", other.map(|r| r.counters)),
    }
}

#[test]
fn the_seconds_budget_stops_decoding_and_replay() {
    let mut p = Payload::new(&["x"]);
    p.spawn().faults(4096, 0);
    let b = Budget {
        max_seconds: 0.0,
        ..Budget::default()
    };
    let (_, what) = budget_err(format::read_with(&p.file_bytes(), &b));
    assert!(what.contains("--max-seconds"), "{what}");
    let t = format::read(&p.file_bytes()).unwrap();
    let opts = ReplayOptions {
        budget: b,
        ..ReplayOptions::default()
    };
    match replay(&t, &opts) {
        Err(ReplayError::Budget { what, .. }) => assert!(what.contains("--max-seconds"), "{what}"),
        other => panic!("{:?}", other.map(|r| r.events)),
    }
}

#[test]
fn lost_record_counts_saturate() {
    let mut p = Payload::new(&["x"]);
    p.lost(1 << 63).lost(1 << 63);
    let t = format::read(&p.file_bytes()).unwrap();
    let r = replay(&t, &ReplayOptions::default()).unwrap();
    assert_eq!(r.lost, u64::MAX, "two LOST 2^63 once read as 0");
}

#[test]
fn the_writer_never_writes_what_the_reader_refuses() {
    // 5000 arguments of 5000 bytes: 1023 kept (cut to 4096 bytes), the last says the rest.
    let arg = "é".repeat(2500);
    let h = Header {
        command: vec![arg.clone(); 5000],
        ..Header::default()
    };
    let mut w = Writer::new(&h);
    // An image with an empty VMA, a wrapping one, 70 000 good ones and a file reference to
    // an undefined file; a mapping of an undefined file; a file defined twice.
    let mut vmas = vec![
        ImageVma {
            start: 0x1000,
            end: 0x1000,
            prot: 3,
            flags: 0,
            file: None,
            offset: 0,
        },
        ImageVma {
            start: 0x3000,
            end: 0x2000,
            prot: 3,
            flags: 0,
            file: None,
            offset: 0,
        },
    ];
    for i in 0..70_000u64 {
        vmas.push(ImageVma {
            start: (i + 16) << 13,
            end: ((i + 16) << 13) + 4096,
            prot: 1,
            flags: 0,
            file: Some(9),
            offset: 0,
        });
    }
    let file = |id| Event::File {
        id,
        dev: 0,
        ino: 0,
        size: 1,
        path: "f".into(),
    };
    let events = [
        file(1),
        file(1),
        Event::Spawn { pid: 1 },
        Event::Exec {
            pid: 1,
            image: Image {
                vmas,
                pages: vec![],
            },
        },
        Event::Mmap {
            pid: 1,
            addr: 0,
            len: 4096,
            prot: 3,
            flags: 2,
            fd: 3,
            offset: 0,
            file: Some(7),
            ret: 0x1000,
        },
        Event::Mmap {
            pid: 1,
            addr: 0,
            len: 4096,
            prot: 3,
            flags: 2,
            fd: 3,
            offset: 0,
            file: Some(1),
            ret: 0x1000,
        },
    ];
    for e in &events {
        w.push(e);
    }
    // 3977 arguments, one file event, 2 + 4464 VMAs, 65 536 file references, one mapping.
    assert_eq!(w.dropped(), 3977 + 1 + 2 + (70_000 - 65_536) + 65_536 + 1);
    let bytes = w.finish().unwrap();
    let (same, dropped) = format::write_counted(&h, &events).unwrap();
    assert_eq!(
        (same.as_slice(), dropped),
        (bytes.as_slice(), 3977 + 1 + 2 + 4464 + 65_536 + 1)
    );
    let t = format::read_with(&bytes, &Budget::UNLIMITED).unwrap();
    assert_eq!(t.header.command.len(), 1024);
    assert_eq!(
        t.header.command[0].len(),
        4096,
        "cut at a character boundary"
    );
    assert_eq!(t.header.command[1023], "[3977 more arguments not recorded]");
    let Event::Exec { image, .. } = &t.events[2] else {
        panic!("{:?}", t.events[2]);
    };
    assert_eq!(image.vmas.len(), 65_536);
    assert!(image.vmas.iter().all(|v| v.file.is_none()));
    assert!(matches!(t.events[3], Event::Mmap { file: None, .. }));
    assert!(matches!(t.events[4], Event::Mmap { file: Some(1), .. }));
    assert_eq!(t.events.len(), 5);
}

#[test]
fn an_undefined_or_redefined_file_is_refused_by_every_reader() {
    // An exec image mapping file id 41 (ref 42), never defined.
    let mut p = Payload::new(&["x"]);
    p.spawn().exec(&[(0x40_0000, 4096, 5, 42)]);
    match format::read(&p.file_bytes()) {
        Err(FormatError::Payload { offset, what }) => {
            // Header 10, spawn 2, exec tag and count 2, start 4, length 2, prot 1, flags 1.
            assert_eq!(offset, 22);
            assert!(what.contains("file id 41"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    // An mmap of one.
    let mut p = Payload::new(&["x"]);
    p.spawn().exec(&[]).mmap(0, 4096, 2, 3, 0x1000);
    assert!(format::read(&p.file_bytes()).is_err());
    // A file defined twice.
    let mut p = Payload::new(&["x"]);
    p.file(3, 1, "a").file(3, 1, "b");
    match format::read(&p.file_bytes()) {
        Err(FormatError::Payload { what, .. }) => assert!(what.contains("twice"), "{what}"),
        other => panic!("{other:?}"),
    }
    // A trace built in memory: export refuses it too (it would reference `f41`).
    let t = Trace {
        events: vec![
            Event::Spawn { pid: 1 },
            Event::Exec {
                pid: 1,
                image: Image {
                    vmas: vec![ImageVma {
                        start: 0x40_0000,
                        end: 0x40_1000,
                        prot: 5,
                        flags: 0,
                        file: Some(41),
                        offset: 0,
                    }],
                    pages: vec![],
                },
            },
        ],
        ..Trace::default()
    };
    assert!(matches!(
        trace::export::to_scenario(&t),
        Err(trace::export::ExportError::UndefinedFile(1, 41))
    ));
}

#[test]
fn export_keeps_trace_strings_inside_their_comments() {
    let t = format::read(&common::evil_strings().file_bytes()).unwrap();
    assert_eq!(t.header.host, EVIL);
    let text = trace::export::to_scenario(&t).unwrap();
    // Every line the strings could have made is a comment or one the exporter writes.
    let statements: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    assert_eq!(
        statements,
        [
            "set thp top=never 16K=never 32K=never 64K=never 128K=never 256K=never 512K=never 1024K=never 2048K=never",
            "set rlimit memlock unlimited",
            "f0 = file 0x1000 disk",
            "p1_1 = spawn privileged",
            "p1_1 exit",
            "p1_2 = spawn privileged",
            "m_3 = p1_2 mmap 0x1000 rx private file f0 offset 0x0 fixed 0x400000",
        ],
        "{text}"
    );
    assert!(
        !text
            .chars()
            .any(|c| c != '\n' && (c.is_control() || c == '\u{202e}')),
        "{text:?}"
    );
    assert!(
        text.contains(r"x\nset memory 1G\np9 = spawn\r\n\u{1b}[2J"),
        "{text}"
    );
    // It parses, and runs.
    let script = scenario::parse("evil", &text).unwrap();
    let r = scenario::run::run(&script, &scenario::run::RunOptions::default());
    assert_eq!(r.exit_code(), 0, "{:?}", r.abort);
}

#[test]
fn escape_leaves_no_control_or_invisible_character() {
    let e = trace::escape(EVIL);
    assert!(!e.chars().any(|c| c.is_control()), "{e:?}");
    assert!(!e.contains('\u{202e}'), "{e:?}");
    assert_eq!(trace::escape("a\\b é"), "a\\\\b é");
    assert_eq!(trace::escape("\u{1b}[2J"), "\\u{1b}[2J");
    // `trace show` prints events with Debug, which escapes their strings the same way.
    let t = format::read(&common::evil_strings().file_bytes()).unwrap();
    for e in &t.events {
        let line = format!("{e:x?}");
        assert!(
            !line.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{line:?}"
        );
    }
}

#[test]
fn thp_sizes_neither_panic_nor_wrap() {
    assert_eq!(thp_size("64K"), Some(64 << 10));
    assert_eq!(thp_size("2M"), Some(2 << 20));
    assert_eq!(thp_size("16k"), Some(16 << 10));
    for bad in [
        "64é",
        "é",
        "",
        "K",
        "+64K",
        "-64K",
        "64",
        "64G",
        // 2^64 / 1024 + 64 kB: the product wraps to 64K.
        "18014398509481984064K",
        "99999999999999999999999K",
    ] {
        assert_eq!(thp_size(bad), None, "{bad}");
        let opts = ReplayOptions {
            thp: vec![(bad.into(), "always".into())],
            ..ReplayOptions::default()
        };
        assert!(machine_config(&opts).is_err(), "{bad}");
    }
    // A well-formed size that is not a folio size is refused by the engine.
    let opts = ReplayOptions {
        thp: vec![("48K".into(), "always".into())],
        ..ReplayOptions::default()
    };
    assert!(machine_config(&opts).is_err());
}

#[test]
fn calls_that_walk_populated_memory_stop_at_the_walk_budget() {
    // 200 MiB populated once, then protected back and forth: 1 ms a call, no memory.
    let a = 0x1000_0000u64;
    let mut p = Payload::new(&["x"]);
    p.spawn()
        .exec(&[])
        .mmap(a, 200 << 20, POPULATE_FIXED, 0, a as i64);
    for _ in 0..100_000 {
        p.mprotect(a, 200 << 20, 1).mprotect(a, 200 << 20, 3);
    }
    let bytes = p.file_bytes();
    assert!(bytes.len() < 400, "{} bytes", bytes.len());
    let mut d = Decoder::from_bytes(&bytes, &Budget::default()).unwrap();
    match replay_decoder(&mut d, &ReplayOptions::default()) {
        Err(ReplayError::Budget { event, what, .. }) => {
            assert!(what.contains("--max-walk"), "{what}");
            // 64 GiB at 200 MiB (and a page a VMA) a call.
            assert!((300..340).contains(&event), "{event}");
        }
        other => panic!("{:?}", other.map(|r| r.events)),
    }
    // A call over at most 2 MiB is charged its length, without a walk.
    let mut p = Payload::new(&["x"]);
    p.spawn()
        .exec(&[(a, 1 << 20, 3, 0)])
        .mprotect(a, 1 << 20, 1)
        .mprotect(a, 4096, 3);
    let r = replay(
        &format::read(&p.file_bytes()).unwrap(),
        &ReplayOptions::default(),
    )
    .unwrap();
    assert_eq!(r.walked, (1 << 20) + 4096);
    // A status read per VALIDATE walks every VMA: charged a page a VMA.
    let vmas: Vec<_> = (0..1000u64).map(|i| (a + i * 8192, 4096, 1, 0)).collect();
    let mut p = Payload::new(&["x"]);
    p.spawn().exec(&vmas);
    for _ in 0..10 {
        p.byte(20 | common::SAME).varint(0).varint(0).varint(0);
    }
    let r = replay(
        &format::read(&p.file_bytes()).unwrap(),
        &ReplayOptions::default(),
    )
    .unwrap();
    assert_eq!(r.walked, 10 * 1000 * 4096);
    assert_eq!(r.rss_compared, 10);
}

/// Every trace carries its payload's checksum: a shipped trace with any single byte of its
/// zstd frame flipped (three bits each) is refused, or decodes to the very same trace (a
/// flip that changes no decoded byte); before the checksum 7-9 % of flips decoded to another
/// valid trace.
#[test]
fn a_flipped_byte_of_a_trace_is_refused_or_changes_nothing() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/sh-pipeline.umt");
    let bytes = std::fs::read(path).expect("shipped trace");
    let good = format::read(&bytes).expect("the shipped trace reads");
    let (mut refused, mut same) = (0, 0);
    for i in format::PREAMBLE..bytes.len() {
        for bit in [0x01u8, 0x10, 0x80] {
            let mut z = bytes.clone();
            z[i] ^= bit;
            match format::read(&z) {
                Err(_) => refused += 1,
                Ok(t) => {
                    assert_eq!(
                        (&t.header, &t.events),
                        (&good.header, &good.events),
                        "byte {i} ^ {bit:#x}"
                    );
                    same += 1;
                }
            }
        }
    }
    assert!(
        refused > 0 && refused > 10 * same,
        "{refused} refused, {same} the same"
    );
}

/// A trace written without a checksum (as before) is refused with the way out, and
/// `reseal` gives it one: the same trace, which then reads.
#[test]
fn a_trace_without_a_checksum_is_refused_and_resealed() {
    let payload = Payload::new(&["x"]).end();
    let mut old = b"UMMTRACE\x01\x00\x00\x00".to_vec();
    old.extend_from_slice(&zstd::bulk::compress(&payload, 3).unwrap());
    match format::read(&old) {
        Err(FormatError::File { offset: 16, what }) => assert!(what.contains("reseal"), "{what}"),
        other => panic!("{other:?}"),
    }
    let sealed = format::reseal(&old, &trace::Budget::default()).expect("reseal");
    assert_eq!(
        format::read(&sealed).expect("resealed trace reads"),
        format::read(&format::seal(&payload).unwrap()).expect("sealed"),
        "the same trace"
    );
    // Not a trace: refused, not sealed.
    assert!(format::reseal(b"UMMTRACE\x01\x00\x00\x00junk", &trace::Budget::default()).is_err());
    let garbage = format::seal(&[0xff; 8]).unwrap();
    assert!(format::reseal(&garbage, &trace::Budget::default()).is_err());
}

/// The recorded THP policy comes from the trace's header: the `--thp` form is applied, and
/// refused when it does not parse or names a bad size or policy; any other text (an older
/// recorder's all-`never` note, none) is the baseline.
#[test]
fn the_recorded_thp_policy_is_read_or_refused() {
    use trace::replay::{machine_config_recorded, recorded_policy};
    assert_eq!(recorded_policy("").ok(), Some(vec![]));
    assert_eq!(
        recorded_policy("thp top=never; 16K,32K,64K never").ok(),
        Some(vec![])
    );
    assert_eq!(
        recorded_policy("thp top=never 64K=always 2048K=never").ok(),
        Some(vec![
            ("top".into(), "never".into()),
            ("64K".into(), "always".into()),
            ("2048K".into(), "never".into())
        ])
    );
    for old in ["p", "top=never", "always", "\u{0}thp top=never"] {
        assert_eq!(recorded_policy(old).ok(), Some(vec![]), "{old:?}");
    }
    for bad in ["thp 64K", "thp 64K=always junk", "thp =x y"] {
        assert!(recorded_policy(bad).is_err(), "{bad:?}");
    }
    let opts = ReplayOptions::default();
    assert!(machine_config_recorded("thp top=never 64K=always", &opts).is_ok());
    for bad in [
        "thp 48K=always",
        "thp 64K=sometimes",
        "thp top=inherit",
        "thp 99999999999999999999K=always",
    ] {
        assert!(machine_config_recorded(bad, &opts).is_err(), "{bad}");
    }
}
