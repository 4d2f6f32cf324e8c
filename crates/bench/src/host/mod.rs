//! The host-kernel columns: the same layouts and operations run by the Linux kernel this
//! process is on, measured in the same run as the engine.
//!
//! The host's mTHP policy is set per layout through the sysfs knobs
//! (`hugepages-<N>kB/enabled`), which needs root; [`HostSide::session`] saves every knob and
//! takes the oracle's lock (so an oracle run and a benchmark never fight over them), and the
//! [`HostSession`] restores them when dropped. Without root, or when the knobs cannot be
//! written, every host cell says why ("n/a (not root)"). Only [`oracle::sys`] touches libc.
//!
//! This folder is the bench's ground floor: nothing in it imports a benchmark (only the cost
//! model's primitive measurements, `crate::costmodel::primitives`, which import [`region`]).
//! What a host cell asks for and times is here, beside the [`agent`] that measures it: the
//! layouts ([`Layout`]), seed 003's micro benchmarks ([`sharing`]), the anon-cow writers
//! ([`anon_cow`]) and the calibration probes ([`probe`]); the benchmarks import them.

pub mod agent;
pub mod anon_cow;
pub mod measure;
pub mod probe;
pub mod region;
pub mod sharing;

use oracle::knobs::{ThpKnobs, THP_DIR};
use oracle::sys;
use scenario::{ShmemPolicy, ShmemSetting, ThpPolicy, ThpSetting, ThpSize, ThpTop};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The memory a row is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layout {
    /// Private anonymous memory, every page written (seed 000's layout); 2M THPs PTE-mapped
    /// by an `mprotect` of one subpage per block.
    Anon,
    /// A tmpfs file of the layout's size mapped `MAP_PRIVATE` read-write: every page read
    /// (page-cache folios of the row's size mapped by the faults and fault-around), then
    /// the first page of every 2 MiB written (a COW copy: the VMA gets an anon_vma, so fork
    /// must copy its page tables, `vma_needs_copy`). Fork copies 511 file PTEs per 2 MiB.
    TmpfsPrivate,
    /// A tmpfs file filled through a `MAP_SHARED` mapping (every page written: dirty
    /// page-cache folios of the row's size). 2M folios are then mapped again 4 KiB off PMD
    /// alignment and read page by page, so they are PTE-mapped (a misaligned mapping cannot
    /// take a PMD), as seed 000's 2M rows are.
    TmpfsShared,
}

impl Layout {
    /// Where the mapping goes relative to PMD alignment.
    pub fn skew(self, folio: u64) -> u64 {
        if self == Layout::TmpfsShared && folio == 2 << 20 {
            4096
        } else {
            0
        }
    }
}

/// Whether host columns can be measured on this machine.
#[derive(Clone, Debug)]
pub struct HostSide {
    /// Why no host column is measured at all (`--no-host`).
    disabled: Option<String>,
    /// Why the THP knobs cannot be set (not root, no sysfs).
    reason: Option<String>,
    nodes: usize,
}

/// The THP knobs held for one table; restored on drop.
pub struct HostSession {
    knobs: ThpKnobs,
}

/// NUMA nodes with memory.
pub fn numa_nodes() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/node/has_memory")
        .or_else(|_| std::fs::read_to_string("/sys/devices/system/node/online"))
        .unwrap_or_default();
    let n: usize = text
        .trim()
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|part| match part.split_once('-') {
            Some((a, b)) => {
                let a: usize = a.parse().unwrap_or(0);
                let b: usize = b.parse().unwrap_or(a);
                b.saturating_sub(a) + 1
            }
            None => 1,
        })
        .sum();
    n.max(1)
}

/// The running kernel's release.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

impl HostSide {
    /// Probes this machine; `enabled: false` leaves the host columns out.
    pub fn probe(enabled: bool) -> HostSide {
        let disabled = (!enabled).then(|| "left out (--no-host)".to_string());
        let reason = if sys::geteuid() != 0 {
            Some("not root: the mTHP knobs need root".to_string())
        } else if !Path::new(THP_DIR).exists() {
            Some(format!("no {THP_DIR}"))
        } else {
            None
        };
        HostSide {
            disabled,
            reason,
            nodes: numa_nodes(),
        }
    }

    /// Host columns that are never measured.
    pub fn disabled(reason: &str) -> HostSide {
        HostSide {
            disabled: Some(reason.into()),
            reason: None,
            nodes: numa_nodes(),
        }
    }

    /// "measured" or why not.
    pub fn describe(&self) -> String {
        match (&self.disabled, &self.reason) {
            (Some(r), _) => format!("n/a ({r})"),
            (None, Some(r)) => {
                format!("only those that need no THP knob (spawn); others n/a ({r})")
            }
            (None, None) => "measured (THP knobs saved and restored per table)".into(),
        }
    }

    /// NUMA nodes with memory.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Whether host columns that need no knob (spawn) are measured.
    pub fn enabled(&self) -> Result<(), String> {
        match &self.disabled {
            Some(r) => Err(r.clone()),
            None => Ok(()),
        }
    }

    /// Saves the THP knobs (waiting for a running oracle) and sets Linux's defaults.
    pub fn session(&self) -> Result<HostSession, String> {
        self.enabled()?;
        if let Some(r) = &self.reason {
            return Err(r.clone());
        }
        sys::install_stop_handler().map_err(|e| format!("signal handlers: errno {e}"))?;
        let knobs = ThpKnobs::acquire().map_err(|e| format!("THP knobs unwritable: {e}"))?;
        knobs
            .set_defaults()
            .map_err(|e| format!("THP knobs unwritable: {e}"))?;
        Ok(HostSession { knobs })
    }
}

impl HostSession {
    /// The THP knobs held (and the machine-wide lock with them): what the oracle's host
    /// backend needs to apply a scenario's settings (`crate::reclaim`).
    pub fn knobs(&self) -> &ThpKnobs {
        &self.knobs
    }

    /// Anonymous faults allocate folios of `bytes` (4K: order 0; 16K…2M: that mTHP size).
    pub fn folio(&self, bytes: u64) -> Result<(), String> {
        self.knobs.set_defaults().map_err(|e| e.to_string())?;
        let mut settings = vec![ThpSetting::Top(ThpTop::Never)];
        if bytes > 4096 {
            let size = ThpSize::new(bytes).ok_or(format!("no mTHP size {bytes}"))?;
            settings.push(ThpSetting::Size {
                size,
                policy: ThpPolicy::Always,
            });
        }
        self.knobs.apply(&settings).map_err(|e| e.to_string())
    }

    /// Shmem and tmpfs faults and writes allocate folios of `bytes` (that size's
    /// `shmem_enabled` = `always`, which reaches tmpfs files on a huge=never mount);
    /// anonymous THP off.
    pub fn shmem_folio(&self, bytes: u64) -> Result<(), String> {
        self.knobs.set_defaults().map_err(|e| e.to_string())?;
        self.knobs
            .apply(&[ThpSetting::Top(ThpTop::Never)])
            .map_err(|e| e.to_string())?;
        if bytes > 4096 {
            let size = ThpSize::new(bytes).ok_or(format!("no mTHP size {bytes}"))?;
            self.knobs
                .apply_shmem(&[ShmemSetting::Size {
                    size,
                    policy: ShmemPolicy::Always,
                }])
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// PMD THP always (`on`) or never, other sizes off.
    pub fn thp(&self, on: bool) -> Result<(), String> {
        self.knobs.set_defaults().map_err(|e| e.to_string())?;
        let top = if on { ThpTop::Always } else { ThpTop::Never };
        self.knobs
            .apply(&[ThpSetting::Top(top)])
            .map_err(|e| e.to_string())
    }
}

/// The last-level cache of CPU 0, bytes (`/sys/devices/system/cpu/cpu0/cache/index*`, the
/// highest level); 0 if unknown. Sysfs writes the size as `32K` or `16M`, which the
/// workspace's one size grammar (`usermm::units::parse_size`) reads.
pub fn llc_bytes() -> u64 {
    let mut best = (0u64, 0u64);
    for i in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        let read =
            |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).map(|t| t.trim().to_string());
        let (Ok(level), Ok(size)) = (read("level"), read("size")) else {
            continue;
        };
        let level: u64 = level.parse().unwrap_or(0);
        let bytes = usermm::units::parse_size(&size).unwrap_or(0);
        if level >= best.0 {
            best = (level, bytes);
        }
    }
    best.1
}

pub use oracle::procfs::vmstat;

/// An mTHP statistic of one size (`anon_fault_alloc`), summed over CPUs by the kernel.
pub fn mthp_stat(bytes: u64, name: &str) -> Option<u64> {
    let p = format!("{THP_DIR}/hugepages-{}kB/stats/{name}", bytes >> 10);
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Where this kernel counts the free memory it has reported to the hypervisor (free page
/// reporting: a guest hands free blocks of at least `page_reporting_order` back to the host,
/// which discards them and repopulates each page on its next touch). Upstream kernels have
/// only the order parameter; the counter is what this VM's kernel adds.
const REPORTED_KIB: &str = "/sys/module/page_reporting/parameters/reported_kib";

/// KiB of free memory reported to the hypervisor so far (machine-wide), where the kernel
/// counts it.
pub fn reported_kib() -> Option<u64> {
    std::fs::read_to_string(REPORTED_KIB)
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Backs `len` bytes of free memory by touching them once and freeing them again
/// (`MADV_POPULATE_WRITE` of a fresh mapping, then `munmap`), so that a measurement right
/// after allocates pages the hypervisor has backed. Under free page reporting a page the
/// guest has reported costs the hypervisor's repopulation on first touch: measured on
/// this 6.18 guest, a 4 KiB write fault took 1.2 µs on backed memory and 4.6–9.9 µs after
/// 3 s idle. The engine's arena gets the same treatment (`engine::warm_up`). Best effort:
/// a refused mapping primes nothing.
pub fn prime(len: u64) {
    if let Ok(r) = region::Region::anon(len) {
        let _ = sys::madvise(r.addr, r.len, region::MADV_NOHUGEPAGE);
        let _ = r.populate();
    }
}

/// Runs `f` with the calling thread pinned to the last CPU it may use (unpinned if the host
/// refuses), then gives the thread back the CPUs it had. Host helpers forked meanwhile
/// inherit the pinning.
pub(crate) fn on_last_cpu<T>(f: impl FnOnce() -> T) -> T {
    let had = oracle::sys::affinity(0).ok().filter(|all| {
        all.last()
            .is_some_and(|&last| oracle::sys::pin_to_cpu(0, last).is_ok())
    });
    let r = f();
    if let Some(all) = had {
        let _ = oracle::sys::set_affinity(0, &all);
    }
    r
}

/// Describes an errno.
pub fn errno_text(what: &str, e: i32) -> String {
    format!("{what}: {}", sys::errno_text(e))
}
