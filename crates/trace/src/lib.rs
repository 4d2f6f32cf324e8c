//! Record a real program's memory activity and replay it on the engine.
//!
//! | module | what |
//! |---|---|
//! | [`format`](mod@format) | the versioned binary trace format (`docs/trace-format.md`): writer and reader |
//! | [`record`](mod@record) | `usermm record`: perf tracepoints and ptrace stops of a command and its children |
//! | [`replay`](mod@replay) | `usermm replay`: the trace's processes, calls and faults on a [`usermm::Machine`] |
//! | [`export`] | a small trace as a scenario file (`usermm trace export --scenario`) |
//! | [`sys`] | the raw system calls of the recorder (all `unsafe` of the crate) |

pub mod export;
pub mod format;
pub mod record;
pub mod replay;
pub mod sys;

pub use format::{read, read_file, Event, Header, Image, ImageVma, Trace};
pub use record::{record, RecordOptions, RecordSummary};
pub use replay::{replay, ReplayOptions, ReplayReport};

/// End of the x86-64 user address space (47-bit): faults above it (vsyscall, kernel
/// addresses) are not user memory.
pub const USER_TOP: u64 = 0x7fff_ffff_f000;
