//! `CACHE` events: the host's page cache of a file when the recording first saw it mapped.
//! The reader refuses what no page cache holds, the replay starts from what the event says
//! (not from a cold cache), and the recorder reads it from the host without a signal.

use trace::format::{self, CachedFolio, Event, FormatError, Header, Image};

/// A payload: an empty header, FILE 0 and then `tail` (a CACHE event's body), END.
fn payload(tail: &[u8]) -> Vec<u8> {
    let mut p = vec![0, 0, 0, 0, 0]; // host, kernel, no command, policy, recorded_at
    p.extend([5, 0, 0, 0, 8, 0]); // FILE id 0, dev 0, ino 0, 8 bytes, path ""
    p.push(23); // CACHE
    p.extend_from_slice(tail);
    p.push(0);
    p
}

fn error(tail: &[u8]) -> String {
    match format::decode(&payload(tail)) {
        Err(FormatError::Payload { what, .. }) => what,
        r => panic!("expected a payload error, got {r:?}"),
    }
}

#[test]
fn the_reader_refuses_folios_no_page_cache_holds() {
    // File 0, two folios: page 0 order 0, then page 4 (gap 3 after page 1) order 2, marked.
    let t = format::decode(&payload(&[0, 2, 0, 0, 3, 0x82])).unwrap();
    assert_eq!(
        t.events[1],
        Event::Cache {
            file: 0,
            folios: vec![
                CachedFolio {
                    index: 0,
                    order: 0,
                    readahead: false
                },
                CachedFolio {
                    index: 4,
                    order: 2,
                    readahead: true
                },
            ],
        }
    );
    assert!(error(&[1, 0]).contains("file id 1 is used before a FILE event defines it"));
    assert!(error(&[0, 1, 0, 10]).contains("folio order 10 above 9"));
    assert!(error(&[0, 1, 2, 2]).contains("not aligned to its order 2"));
    let mut past = vec![0, 1];
    past.extend([0xff; 9]);
    past.extend([0x01, 0]);
    assert!(error(&past).contains("past the largest page index"));
    // More folios than the format allows, and than the budget (shared with exec pages).
    assert!(error(&[0, 0x80, 0x80, 0x80, 0x04]).contains("cached folio count"));
    let small = trace::Budget {
        max_image_pages: 1,
        ..Default::default()
    };
    let e = format::decode_with(&payload(&[0, 2, 0, 0, 0, 0]), &small).unwrap_err();
    assert!(e.to_string().contains("--max-image-pages"), "{e}");
    // Truncated inside a folio.
    assert!(format::decode(&payload(&[0, 2, 0])).is_err());
}

/// A process mapping 64 pages of FILE 0 read-only and reading page 0, after `cache`: the
/// engine's RssFile at its exit (kB).
fn rss_file_after_first_fault(cache: Option<Vec<CachedFolio>>) -> u64 {
    let addr = 0x7f00_0000_0000u64;
    let mut events = vec![
        Event::Spawn { pid: 1 },
        Event::Exec {
            pid: 1,
            image: Image::default(),
        },
        Event::File {
            id: 0,
            dev: 1,
            ino: 2,
            size: 64 * 4096,
            path: "/f".into(),
        },
    ];
    events.extend(cache.map(|folios| Event::Cache { file: 0, folios }));
    events.extend([
        Event::Mmap {
            pid: 1,
            addr: 0,
            len: 64 * 4096,
            prot: 1,
            flags: 2,
            fd: 3,
            offset: 0,
            file: Some(0),
            ret: addr as i64,
        },
        Event::Fault {
            pid: 1,
            addr,
            write: false,
            user: true,
        },
        Event::Validate {
            pid: 1,
            rss_anon_kb: 0,
            rss_file_kb: 0,
            anon_huge_kb: 0,
        },
        Event::Exit { pid: 1 },
    ]);
    // Through the writer and the reader, as a recording would come.
    let bytes = format::write(&Header::default(), &events).unwrap();
    let t = format::read(&bytes).unwrap();
    let opts = trace::ReplayOptions {
        validate: true,
        ..Default::default()
    };
    let r = trace::replay(&t, &opts).unwrap();
    assert_eq!(r.validate.as_deref(), Some("ok"));
    assert_eq!(r.cache_errors, 0);
    r.rss[0].engine_file_kb
}

#[test]
fn a_replay_starts_from_the_recorded_page_cache() {
    let folio = |index, order, readahead| CachedFolio {
        index,
        order,
        readahead,
    };
    // Cold: read-around, then fault-around maps the 16-page window.
    assert_eq!(rss_file_after_first_fault(None), 64);
    // Pages 0 and 2 cached on the host: the fault finds page 0 and maps those two only.
    assert_eq!(
        rss_file_after_first_fault(Some(vec![folio(0, 0, false), folio(2, 0, false)])),
        8
    );
    // exec's or ld.so's read of the header marked page 1: fault-around leaves it out.
    let header = (0..16).map(|i| folio(i, 0, i == 1)).collect();
    assert_eq!(rss_file_after_first_fault(Some(header)), 60);
    // A 32-page folio the host read ahead: mapped whole (6.18).
    assert_eq!(
        rss_file_after_first_fault(Some(vec![folio(0, 5, false)])),
        128
    );
}
