//! The host side of seed 003's micro benchmarks (`crate::sharing`): which micro benchmark a
//! host cell runs ([`Micro`]) and its timed part, run by the agent on the layout it built.

use super::measure::{fork_time, timed, LiveChild};
use super::region::{Region, RO as HOST_RO};
use serde::{Deserialize, Serialize};

/// The micro benchmarks in the seed's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Micro {
    /// mprotect of one subpage of each THP (PTE-remaps it).
    Remap,
    /// munmap of the PTE-remapped layout.
    Munmap,
    /// fork of the PTE-remapped layout.
    Fork,
    /// memset of the layout while a forked child is alive.
    Cow,
    /// One byte written per page while a forked child is alive.
    CowByte,
    /// memset after the forked child exited.
    CowReuse,
    /// One byte per page after the forked child exited.
    CowReuseByte,
    /// MADV_DONTNEED of every 4 KiB subpage.
    PteDontneed,
}

/// All eight.
pub const MICROS: [Micro; 8] = [
    Micro::Remap,
    Micro::Munmap,
    Micro::Fork,
    Micro::Cow,
    Micro::CowByte,
    Micro::CowReuse,
    Micro::CowReuseByte,
    Micro::PteDontneed,
];

impl Micro {
    /// The row label.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Micro::Remap => "remap",
            Micro::Munmap => "munmap",
            Micro::Fork => "fork",
            Micro::Cow => "cow",
            Micro::CowByte => "cow-byte",
            Micro::CowReuse => "cow-reuse",
            Micro::CowReuseByte => "cow-reuse-byte",
            Micro::PteDontneed => "pte-dontneed",
        }
    }

    /// Whether the layout is PTE-remapped before the timed operation.
    pub(crate) fn remapped(self) -> bool {
        // The seed PTE-maps every THP first in all benchmarks but `remap` (which times it).
        !matches!(self, Micro::Remap)
    }
}

/// The timed part of `micro` on its layout `r`, in this process (the host agent's); `after`
/// runs once the call is timed, while the layout is still mapped (munmap's is not).
pub(crate) fn host_timed(
    r: Region,
    size: u64,
    micro: Micro,
    after: impl FnOnce(),
) -> Result<f64, String> {
    let secs = match micro {
        Micro::Remap => timed(|| r.protect_subpages(HOST_RO)),
        Micro::Munmap => return r.unmap_timed(),
        Micro::Fork => fork_time(),
        Micro::Cow | Micro::CowByte => {
            // The copies are new pages: backed ones, as the engine's arena is.
            super::prime(size);
            let child = LiveChild::fork()?;
            let secs = write(&r, micro);
            drop(child);
            secs
        }
        Micro::CowReuse | Micro::CowReuseByte => {
            drop(LiveChild::fork()?);
            write(&r, micro)
        }
        Micro::PteDontneed => timed(|| r.dontneed_each_page()),
    };
    after();
    secs
}

/// memset or one byte per page, timed.
fn write(r: &Region, micro: Micro) -> Result<f64, String> {
    match micro {
        Micro::Cow | Micro::CowReuse => timed(|| r.fill(0x5a)),
        _ => timed(|| r.write_each_page()),
    }
}
