//! Record a real program's memory activity and replay it on the engine.
//!
//! | module | what |
//! |---|---|
//! | [`format`](mod@format) | the versioned binary trace format (`docs/trace-format.md`): writer and reader |
//! | [`record`](mod@record) | `usermm record`: perf tracepoints and ptrace stops of a command and its children |
//! | [`replay`](mod@replay) | `usermm replay`: the trace's processes, calls and faults on a [`usermm::Machine`] |
//! | [`export`] | a small trace as a scenario file (`usermm trace export --scenario`) |
//! | [`args`] | the command-line flags of a [`Budget`] |
//! | [`sys`] | the raw system calls of the recorder (all `unsafe` of the crate) |
//!
//! Every reader of a trace streams it ([`Decoder`]) within a [`Budget`] of events, seconds,
//! image pages, bytes made present, bytes walked and text written, so that a small hostile
//! file cannot make a command amplify it; trace strings are printed through [`escape`].

pub mod args;
pub mod export;
pub mod format;
pub mod record;
pub mod replay;
mod stack;
pub mod sys;

pub use args::BudgetArgs;
pub use format::{read, read_file, Decoder, Event, Header, Image, ImageVma, Trace};
pub use record::{record, RecordOptions, RecordSummary};
pub use replay::{replay, ReplayOptions, ReplayReport};

/// End of the x86-64 user address space (47-bit): faults above it (vsyscall, kernel
/// addresses) are not user memory.
pub const USER_TOP: u64 = 0x7fff_ffff_f000;

/// Where a recorded `mmap` goes on replay and export: where the host placed it when the call
/// succeeded (a trace keeps the host's addresses), else where its flags and address
/// argument asked ([`usermm::MapFlags::placement`]).
pub fn placed_at(flags: usermm::MapFlags, addr: u64, ret: i64) -> usermm::Placement {
    match u64::try_from(ret) {
        Ok(at) => usermm::Placement::Fixed(at),
        Err(_) => flags.placement(addr),
    }
}

/// `s` with every character that could act on a terminal or end a line escaped, as Rust
/// writes them (`\n`, `\u{1b}`; `\` itself doubled): C0 and C1 controls, DEL, and the
/// invisible format characters that reorder or hide text (bidirectional overrides and
/// isolates, zero-width characters, line and paragraph separators, the byte-order mark).
/// `trace show` and `trace export` print a trace's strings through this, so a recorded
/// command or path can neither move the cursor nor become a scenario statement.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let hidden = matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}' | '\u{feff}' | '\u{061c}' | '\u{180e}');
        if c == '\\' {
            out.push_str("\\\\");
        } else if c.is_control() || hidden {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// How much work reading a trace may cost, whatever the file holds. A trace is a compressed
/// stream: a 100-byte file can decode to megabytes of events, and one event can ask for
/// gigabytes (`mmap` with `MAP_POPULATE`, an exec image of 2²⁴ pages). Every reader (`trace
/// show|stats|export`, `replay`, `bench replay`) stops with an error naming the budget and the
/// payload byte where it ran out; the defaults fit every trace `record` writes of a program
/// that touches up to 256 MiB in up to a million events, and keep each command on a hostile
/// file within seconds and a few hundred MB.
#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    /// Most events decoded (`--max-events`).
    pub max_events: u64,
    /// Most wall-clock seconds a command reads or replays (`--max-seconds`).
    pub max_seconds: f64,
    /// Most exec-image pages and cached folios (`CACHE` events) decoded over the whole trace
    /// (`--max-image-pages`): an image or a file's cache is held in memory while it is
    /// replayed or exported, 16 bytes a page or folio.
    pub max_image_pages: u64,
    /// Most bytes the replay may make present (`--max-touch`): the sum of what the events
    /// ask for (4 KiB a fault or image page, the length of a populating or locking call, the
    /// resident memory a fork copies, 64 KiB a new process, 4 KiB an image mapping), and
    /// also the engine's frames in use at any time (page cache read-ahead, page tables and
    /// large folios included).
    pub max_touch: u64,
    /// Most bytes of ranges the replay's calls may walk over what is already mapped
    /// (`--max-walk`): an mprotect, mremap, madvise, mlock, munlock or munmap, or an mmap
    /// placed over a mapping, is charged its range when at most 2 MiB, else 4 KiB per
    /// present page in the range and per VMA of the process. These cost time, not memory:
    /// 200 MiB populated once and protected back and forth took 1 ms a call.
    pub max_walk: u64,
    /// Most bytes of text `trace show` and `trace export` write (`--max-output`).
    pub max_output: u64,
}

impl Budget {
    /// The budget of a trusted caller: everything the format allows (and no time limit).
    pub const UNLIMITED: Budget = Budget {
        max_events: u64::MAX,
        max_seconds: f64::INFINITY,
        max_image_pages: u64::MAX,
        max_touch: u64::MAX,
        max_walk: u64::MAX,
        max_output: u64::MAX,
    };

    /// When the budget's seconds run out, counted from now (`None`: never).
    pub fn deadline(&self) -> Option<std::time::Instant> {
        if !(self.max_seconds.is_finite() && self.max_seconds >= 0.0) {
            return None;
        }
        std::time::Duration::try_from_secs_f64(self.max_seconds)
            .ok()
            .and_then(|d| std::time::Instant::now().checked_add(d))
    }
}

impl Default for Budget {
    /// A million events (the shipped traces have 332 to 3 869; a replay runs 0.05 to 1.2 M
    /// events/s), 60 s, 2²⁰ image pages (16 MiB of memory), 256 MiB touched, 64 GiB walked
    /// (16 M page-table entries, about a third of a second), 64 MiB of text.
    fn default() -> Self {
        Budget {
            max_events: 1 << 20,
            max_seconds: 60.0,
            max_image_pages: 1 << 20,
            max_touch: 256 << 20,
            max_walk: 64 << 30,
            max_output: 64 << 20,
        }
    }
}
