//! The command-line flags of a [`Budget`], shared by `usermm trace`, `usermm replay` and
//! `usermm bench replay`.

use crate::Budget;

/// A byte count in the workspace's one size grammar (`usermm::units::parse_size`: decimal or
/// `0x` hex, an optional K, M or G, powers of 1024).
fn bytes(s: &str) -> Result<u64, String> {
    usermm::units::parse_size(s)
        .map_err(|_| format!("`{s}`: expected a byte count such as 4096, 64K, 256M"))
}

/// What reading the trace may cost (defaults: `trace::Budget::default()`).
#[derive(clap::Args, Debug, Clone)]
pub struct BudgetArgs {
    /// Stop with an error after this many events.
    #[arg(long, value_name = "N", default_value_t = Budget::default().max_events)]
    pub max_events: u64,
    /// Stop with an error after this many seconds of reading or replaying.
    #[arg(long, value_name = "SECONDS", default_value_t = Budget::default().max_seconds)]
    pub max_seconds: f64,
    /// Stop with an error past this many exec-image pages and cached folios (`CACHE` events)
    /// in all (16 bytes of memory each).
    #[arg(long, value_name = "N", default_value_t = Budget::default().max_image_pages)]
    pub max_image_pages: u64,
    /// replay: the most memory the trace may make the engine populate, copy or hold
    /// (faults, populating and locking calls, forks, frames in use).
    #[arg(long, value_name = "BYTES", value_parser = bytes, default_value = "256M")]
    pub max_touch: u64,
    /// replay: the most bytes of already-mapped ranges the calls may walk (mprotect,
    /// mremap, madvise, munlock, munmap, mmap over a mapping).
    #[arg(long, value_name = "BYTES", value_parser = bytes, default_value = "64G")]
    pub max_walk: u64,
    /// show, export: the most text written.
    #[arg(long, value_name = "BYTES", value_parser = bytes, default_value = "64M")]
    pub max_output: u64,
}

impl BudgetArgs {
    /// The budget these flags give.
    ///
    /// # Errors
    /// A negative or NaN `--max-seconds`.
    pub fn budget(&self) -> Result<Budget, String> {
        if self.max_seconds.is_nan() || self.max_seconds < 0.0 {
            return Err(format!(
                "--max-seconds {}: expected a number of seconds, 0 or more",
                self.max_seconds
            ));
        }
        Ok(Budget {
            max_events: self.max_events,
            max_seconds: self.max_seconds,
            max_image_pages: self.max_image_pages,
            max_touch: self.max_touch,
            max_walk: self.max_walk,
            max_output: self.max_output,
        })
    }
}
