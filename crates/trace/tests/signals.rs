//! Fault signals: a recorded host signal (`Event::Signal`) is matched with the engine's answer
//! to the fault before it, so a program that faults on purpose (a JVM's polling page) replays
//! clean under `--strict`, while a signal only one side sent is still a problem; a signal
//! record that is not `SIGSEGV` or `SIGBUS` is refused by the reader.

use trace::format::{self, Event, Header, Image, ImageVma};
use trace::{replay, Budget, ReplayOptions, Trace};

/// A read-only page: a write to it is `SIGSEGV` on both sides, a read is not.
const PAGE: u64 = 0x1000_0000;

fn trace(write: bool, host_signal: bool) -> Trace {
    let ro = ImageVma {
        start: PAGE,
        end: PAGE + 0x1000,
        prot: 1,
        flags: 0,
        file: None,
        offset: 0,
    };
    let mut events = vec![
        Event::Spawn { pid: 1 },
        Event::Exec {
            pid: 1,
            image: Image {
                vmas: vec![ro],
                pages: vec![],
            },
        },
        Event::Fault {
            pid: 1,
            addr: PAGE,
            write,
            user: true,
        },
    ];
    if host_signal {
        events.push(Event::Signal {
            pid: 1,
            signo: libc::SIGSEGV as u8,
            addr: PAGE + 0x18,
        });
    }
    events.push(Event::Exit { pid: 1 });
    Trace {
        header: Header::default(),
        events,
        file_bytes: 0,
        payload_bytes: 0,
    }
}

fn counts(t: &Trace) -> (u64, u64, u64, u64, usize) {
    let r = replay(t, &ReplayOptions::default()).expect("replays");
    (
        r.host_signals,
        r.signals_matched,
        r.fault_signals,
        r.signals_missed,
        r.problems().len(),
    )
}

#[test]
fn a_signal_both_sides_sent_is_no_problem() {
    assert_eq!(counts(&trace(true, true)), (1, 1, 0, 0, 0));
}

#[test]
fn a_signal_only_the_engine_sent_is_a_problem() {
    assert_eq!(counts(&trace(true, false)), (0, 0, 1, 0, 1));
}

#[test]
fn a_signal_only_the_host_sent_is_a_problem() {
    assert_eq!(counts(&trace(false, true)), (1, 0, 0, 1, 1));
}

#[test]
fn a_signal_record_round_trips_and_another_signal_is_refused() {
    let h = Header::default();
    let t = trace(true, true);
    let (bytes, dropped) = format::write_counted(&h, &t.events).expect("written");
    assert_eq!(dropped, 0);
    let back = format::read_with(&bytes, &Budget::UNLIMITED).expect("read");
    assert_eq!(back.events, t.events);
    let mut bad = t.events.clone();
    bad[3] = Event::Signal {
        pid: 1,
        signo: libc::SIGKILL as u8,
        addr: PAGE,
    };
    let (bytes, _) = format::write_counted(&h, &bad).expect("written");
    let e = format::read_with(&bytes, &Budget::UNLIMITED).expect_err("refused");
    assert!(
        e.to_string().contains("signal 9 is not SIGSEGV or SIGBUS"),
        "{e}"
    );
}
