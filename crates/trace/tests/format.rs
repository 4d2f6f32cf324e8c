//! The trace format: every event round-trips, and no input makes the reader panic.

use proptest::prelude::*;
use trace::format::{self, CachedFolio, Event, FormatError, Header, Image, ImageVma};

fn pid() -> impl Strategy<Value = u32> {
    prop_oneof![1u32..5, any::<u32>()]
}

fn image() -> impl Strategy<Value = Image> {
    let vma = (
        0u64..1 << 35,
        1u64..1 << 20,
        0u8..8,
        0u8..8,
        proptest::option::of(0u32..9),
        any::<u64>(),
    )
        .prop_map(|(s, l, prot, flags, file, offset)| ImageVma {
            start: s << 12,
            end: (s << 12) + (l << 12),
            prot,
            flags,
            file,
            offset,
        });
    (
        proptest::collection::vec(vma, 0..6),
        proptest::collection::vec((0u64..1 << 35, any::<bool>()), 0..20),
    )
        .prop_map(|(vmas, pages)| Image {
            vmas,
            pages: pages.into_iter().map(|(p, w)| (p << 12, w)).collect(),
        })
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        pid().prop_map(|pid| Event::Spawn { pid }),
        (pid(), pid(), 0u8..2).prop_map(|(parent, child, flags)| Event::Fork {
            parent,
            child,
            flags
        }),
        (pid(), image()).prop_map(|(pid, image)| Event::Exec { pid, image }),
        pid().prop_map(|pid| Event::Exit { pid }),
        (
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            "[a-z/é]{0,30}"
        )
            .prop_map(|(id, dev, ino, size, path)| Event::File {
                id,
                dev,
                ino,
                size,
                path
            }),
        (
            pid(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<i32>(),
            any::<u64>(),
            proptest::option::of(0u32..u32::MAX),
            any::<i64>()
        )
            .prop_map(
                |(pid, addr, len, prot, flags, fd, offset, file, ret)| Event::Mmap {
                    pid,
                    addr,
                    len,
                    prot,
                    flags,
                    fd,
                    offset,
                    file,
                    ret
                }
            ),
        (pid(), any::<u64>(), any::<u64>(), any::<i64>()).prop_map(|(pid, addr, len, ret)| {
            Event::Munmap {
                pid,
                addr,
                len,
                ret,
            }
        }),
        (
            pid(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<i64>()
        )
            .prop_map(|(pid, addr, len, prot, ret)| Event::Mprotect {
                pid,
                addr,
                len,
                prot,
                ret
            }),
        (
            pid(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u64>(),
            any::<i64>()
        )
            .prop_map(|(pid, addr, old_len, new_len, flags, new_addr, ret)| {
                Event::Mremap {
                    pid,
                    addr,
                    old_len,
                    new_len,
                    flags,
                    new_addr,
                    ret,
                }
            }),
        (pid(), any::<u64>(), any::<i64>()).prop_map(|(pid, brk, ret)| Event::Brk {
            pid,
            brk,
            ret
        }),
        (
            pid(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<i64>()
        )
            .prop_map(|(pid, addr, len, advice, ret)| Event::Madvise {
                pid,
                addr,
                len,
                advice,
                ret
            }),
        (
            pid(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<i64>()
        )
            .prop_map(|(pid, addr, len, flags, ret)| Event::Mlock {
                pid,
                addr,
                len,
                flags,
                ret
            }),
        (pid(), any::<u64>(), any::<u64>(), any::<i64>()).prop_map(|(pid, addr, len, ret)| {
            Event::Munlock {
                pid,
                addr,
                len,
                ret,
            }
        }),
        (pid(), any::<u32>(), any::<i64>()).prop_map(|(pid, flags, ret)| Event::Mlockall {
            pid,
            flags,
            ret
        }),
        (pid(), any::<i64>()).prop_map(|(pid, ret)| Event::Munlockall { pid, ret }),
        (pid(), 0u64..1 << 52, any::<bool>(), any::<bool>()).prop_map(
            |(pid, page, write, user)| Event::Fault {
                pid,
                addr: page << 12,
                write,
                user
            }
        ),
        (pid(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(pid, a, f, h)| {
            Event::Validate {
                pid,
                rss_anon_kb: a,
                rss_file_kb: f,
                anon_huge_kb: h,
            }
        }),
        any::<u64>().prop_map(|count| Event::Lost { count }),
        (pid(), prop_oneof![Just(7u8), Just(11u8)], any::<u64>())
            .prop_map(|(pid, signo, addr)| Event::Signal { pid, signo, addr }),
        // Any folios: the writer keeps the aligned, ascending, non-overlapping ones.
        (
            0u32..9,
            proptest::collection::vec((0u64..1 << 12, 0u8..12, any::<bool>()), 0..12)
        )
            .prop_map(|(file, f)| Event::Cache {
                file,
                folios: f
                    .into_iter()
                    .map(|(index, order, readahead)| CachedFolio {
                        index,
                        order,
                        readahead
                    })
                    .collect(),
            }),
    ]
}

fn header() -> impl Strategy<Value = Header> {
    (
        "[a-z]{0,8}",
        "[0-9.]{0,8}",
        proptest::collection::vec("[ -~]{0,12}", 0..4),
        "[a-z =]{0,12}",
        any::<u64>(),
    )
        .prop_map(|(host, kernel, command, policy, recorded_at)| Header {
            host,
            kernel,
            command,
            policy,
            recorded_at,
        })
}

/// What the writer makes of `ev`: a file reference to an id no earlier `File` event defined
/// is written as none, and a second `File` event for an id is left out (the reader refuses
/// both).
fn as_written(ev: &[Event]) -> Vec<Event> {
    let mut files = std::collections::HashSet::new();
    let mut out = Vec::new();
    for e in ev {
        let mut e = e.clone();
        match &mut e {
            Event::File { id, .. } if !files.insert(*id) => continue,
            Event::Cache { file, .. } if !files.contains(file) => continue,
            Event::Cache { folios, .. } => {
                let mut end = 0;
                folios.retain(|f| {
                    let ok = f.fits_after(end);
                    if ok {
                        end = f.end();
                    }
                    ok
                });
            }
            Event::Mmap { file, .. } => *file = file.filter(|f| files.contains(f)),
            Event::Exec { image, .. } => {
                for v in &mut image.vmas {
                    v.file = v.file.filter(|f| files.contains(f));
                }
            }
            _ => {}
        }
        out.push(e);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_trace_round_trips(h in header(), ev in proptest::collection::vec(event(), 0..40)) {
        let bytes = format::write(&h, &ev).unwrap();
        let t = format::read(&bytes).unwrap();
        prop_assert_eq!(t.header, h);
        prop_assert_eq!(t.events, as_written(&ev));
    }

    #[test]
    fn random_bytes_are_an_error_not_a_panic(mut b in proptest::collection::vec(any::<u8>(), 0..300), magic in any::<bool>()) {
        if magic && b.len() >= 12 {
            b[..8].copy_from_slice(format::MAGIC);
            b[8..12].copy_from_slice(&[1, 0, 0, 0]);
        }
        prop_assert!(format::read(&b).is_err());
        // The payload decoder alone, on arbitrary bytes: Ok or an error inside the input.
        match format::decode(&b) {
            Ok(_) => {}
            Err(FormatError::Payload { offset, .. }) => prop_assert!(offset <= b.len() as u64),
            Err(e) => prop_assert!(false, "{e}"),
        }
    }

    #[test]
    fn a_flipped_byte_in_a_valid_file_never_panics(ev in proptest::collection::vec(event(), 1..20), at in any::<usize>(), x in 1u8..=255) {
        let mut bytes = format::write(&Header::default(), &ev).unwrap();
        let i = at % bytes.len();
        bytes[i] ^= x;
        let _ = format::read(&bytes);
    }
}

#[test]
fn a_truncated_file_names_an_offset() {
    let ev = vec![Event::Spawn { pid: 1 }, Event::Exit { pid: 1 }];
    let bytes = format::write(&Header::default(), &ev).unwrap();
    for cut in 0..bytes.len() {
        let e = format::read(&bytes[..cut]).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("byte "), "{text}");
    }
}

#[test]
fn bounds_are_enforced() {
    // A header claiming 2000 command arguments is refused at that varint.
    let payload = [0u8, 0, 0xd0, 0x0f];
    match format::decode(&payload) {
        Err(FormatError::Payload { offset: 2, what }) => assert!(what.contains("bound"), "{what}"),
        other => panic!("{other:?}"),
    }
    // A varint of 11 bytes.
    let payload = [0xffu8; 11];
    assert!(matches!(
        format::decode(&payload),
        Err(FormatError::Payload { offset: 0, .. })
    ));
}
