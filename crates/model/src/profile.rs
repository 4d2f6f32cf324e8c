//! A machine profile: the running machine and kernel ([`Fingerprint`]), the probes' points
//! and the fitted prices, saved as JSON so that `usermm bench` predicts without calibrating
//! again, and so that a profile of another machine can predict here (`--profile FILE`).
//!
//! A profile file is read as hostile input: at most [`MAX_PROFILE_BYTES`], opened without
//! following a symbolic link, and every field checked ([`Profile::validate`]) before use.
//! The cache is written safely: a private directory (`$XDG_CACHE_HOME/usermm` or
//! `~/.cache/usermm`, mode 0700, refused if it is a symbolic link or writable by others),
//! a new file under a temporary name (`O_CREAT | O_EXCL | O_NOFOLLOW`), then a rename.

use crate::fit::{Fit, Observation, Prediction};
use crate::prices::{Prim, Primitives, SlabCache};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The profile format's version: bumped on any change of its meaning.
pub const PROFILE_VERSION: u32 = 2;

/// The largest profile file read.
pub const MAX_PROFILE_BYTES: u64 = 4 << 20;

/// A cached profile older than this is not fresh.
pub const MAX_AGE_SECS: u64 = 30 * 24 * 3600;

/// Pseudo-counter: one `fork()` of the bench's agent (the task and the mm created, the
/// agent's own VMAs and page tables copied: fork's fixed work).
pub const OP_FORK: &str = "op_fork";
/// Pseudo-counter: the fixed work of the spawn table's `fork()`, of another process: the
/// static spawn agent, whose own address space the engine counts (21 VMAs with a page
/// each). Priced apart from [`OP_FORK`]: the bench's agent forked with no probe VMA took
/// 169 µs on this AMD guest, the spawn agent's fork, exit and wait with 30 VMAs 114 µs.
/// Over 43 stored calibrations of that guest, `spawn/few` held out at 17 % on average
/// instead of 41 % (`spawn/many` at 29 instead of 20), a calibration's median held-out error
/// at 12.10 % on average instead of 12.18.
pub const OP_SPAWN: &str = "op_spawn";
/// Pseudo-counter: one exit and the parent's wait (spawn's fork + exit + wait).
pub const OP_EXIT: &str = "op_exit";
/// Pseudo-counter: the share of the last-level cache a fork's layout filled as it was
/// written (its pages' bytes over the cache, at most 1): fork's fixed work (the task, the
/// mm, the process's other VMAs and page tables) finds its lines evicted by that much. On
/// this AMD guest a fork of PTE-mapped 2 MiB folios cost about 57 ns a page more at every
/// size, but its fixed part grew from 110 µs (4 MiB written just before) to about 280 µs
/// (96 MiB, or 4 MiB followed by a 96 MiB read that evicted the cache), so that from 4 to
/// 10 MiB a page seemed to cost 85 ns and from 96 to 256 MiB 51: priced per page, a fit
/// of the probes put the 256 MiB rows 20 to 30 % high.
pub const OP_FORK_COLD: &str = "op_fork_cold";
/// The version of [`features`]: part of the model key, so that a profile fitted with other
/// features is made again.
pub const FEATURES_VERSION: u32 = 4;
/// Pseudo-counter: the entries an `mprotect` visits (its `pte_reads`). `change_pte_range`
/// makes about four out-of-line calls per entry that no engine counter names: measured on
/// this AMD guest, 56 ns per zero-page entry and 137 per written one, against the 1 and 14
/// a PTE read and write cost elsewhere; counted as reads and writes they would price every
/// other walk's entries at mprotect's.
pub const MPROTECT_ENTRIES: &str = "mprotect_entries";
/// Pseudo-counter: the entries an `mprotect` rewrites (its `pte_writes`): each also reads
/// its folio's `struct page` (`vm_normal_folio`).
pub const MPROTECT_WRITES: &str = "mprotect_writes";
/// Pseudo-counter: pages zeroed past what the last-level cache holds ([`features`]).
pub const PAGES_ZEROED_COLD: &str = "pages_zeroed_cold";
/// Pseudo-counter: the pages an operation walks (their PTE and `struct page` lines: the
/// most of its PTEs read, copied or cleared, mapcounts and frames touched) past what the
/// last-level cache holds of a layout the user has just written: those lines come from
/// memory. Added after the first run with CPU-timed host cells showed munmap of 256 MiB
/// in 16K-1M folios 20-49 % above a model fitted on probes of at most 12 MiB. Not for
/// fork's and zap's walks, whose cold costs are their folios' ([`FOLIOS_COLD`],
/// [`LARGE_FOLIOS_COLD`], [`PTE_ATOMICS_COLD`]): within a large folio the walk streams (a
/// fork of 2 MiB folios cost 55 ns a page at 96 MiB and 53 at 256), and the price per page
/// fitted from mprotect's and the 2 MiB shared munmap's probes put the 256 MiB rows of
/// 2 MiB folios 10 to 20 % higher. Refits of nine stored calibrations without it for those
/// walks read +52 judged rows over eight reports (five better, three worse) with the
/// held-out error unchanged (16.3 against 16.4 %, 18.3 against 18.0…).
pub const WALK_COLD: &str = "pages_walked_cold";
/// Pseudo-counter: the folios an operation handles one by one (fork's and zap's batches,
/// a file fault's folios mapped, munlock's folios) in the cold share of its walk
/// ([`WALK_COLD`] over the pages walked) that lie far from the folio before them in
/// physical memory ([`HOST_FAR`]): a folio's own work (its
/// `struct page` lines, its LRU and free lists' neighbours, the page allocator's buddies)
/// misses where its lines are cold and no prefetch follows them. On this AMD guest fork of
/// 4 KiB folios cost 119 ns a page at 156 MiB with 99 % of them scattered and 91 ns at
/// 256 MiB with 36 % (the allocator's state decides), and a fit whose cold price was per
/// page over-priced 2 MiB folios, whose pages share one head.
pub const FOLIOS_COLD: &str = "folios_walked_cold";
/// Pseudo-counter: of [`FOLIOS_COLD`], zap's batches of large folios, priced apart. A large
/// folio unmapped and freed touches lines a small one does not (its tail pages' `struct page`,
/// the buddy it merges with outside the per-CPU lists, which take orders up to 3 only
/// after a high-order free drains them), and on this AMD guest only large folios kept
/// getting dearer past the cache: munmap of 64 KiB folios cost 493, 681 and 781 ns a folio
/// at 10, 94 and 156 MiB, of 4 KiB folios 305 and 306 ns at 47 and 156 MiB.
pub const LARGE_FOLIOS_COLD: &str = "large_folios_walked_cold";
/// Pseudo-counter: the locked PTE writes (`pte_atomics`: fork's write-protect of the
/// parent's entries) in the cold share of the walk. A locked RMW waits for its line, so a
/// cold PTE line costs its miss once per eight entries: on this AMD guest fork of anonymous
/// 4 KiB folios cost 83, 111 and 117 ns a page at 12, 47 and 156 MiB, of a private file's
/// (read-only entries, nothing write-protected) 92, 97 and 86. Only fork's entries of
/// single-page batches count: a large folio's entries are write-protected in one run
/// (`wrprotect_ptes`), whose lines the prefetcher streams, and a page of a fork of 2 MiB
/// folios cost 55 ns at 96 MiB and 53 at 256 (of 16 and 64 KiB folios: the same from 10 to
/// 47 and 94 MiB), where priced as a 4 KiB folio's the 256 MiB rows read 20 to 30 % high.
pub const PTE_ATOMICS_COLD: &str = "pte_atomics_cold";
/// Not priced: the host's measured share of folio boundaries far apart in physical memory,
/// per mille, which a host cell or probe adds to the engine's counters to say how
/// scattered its layout was ([`FOLIOS_COLD`]).
pub const HOST_FAR: &str = "host_folio_far_permille";
/// Pseudo-counter: pages copied past half of what the last-level cache holds.
pub const PAGES_COPIED_COLD: &str = "pages_copied_cold";

/// The engine's counter of the accesses its MMU model walked the page table for.
pub const TLB_MISSES: &str = "tlb_misses";

/// The operations whose system calls are one kind of work apart from the plain `syscalls`
/// (`getpid`'s round trip): each has fixed work of its own (a VMA lookup and split, an
/// mmu_gather, an LRU drain), priced as [`SYSCALLS_MM`].
pub const SYSCALL_OPS: [&str; 7] = [
    "munmap", "mprotect", "madvise", "mlock", "munlock", "mremap", "mmap",
];

/// Pseudo-counter: the system calls of [`SYSCALL_OPS`], their own fixed work. One counter
/// for all seven, so that its shared price is what the operations' calls cost together and
/// each operation's own price ([`crate::fit`]'s per-operation level) is pulled toward it:
/// priced apart (`syscalls_<op>`, one counter each), an operation whose call only one probe
/// family times had nothing else to learn it from, and `mmap-vmas`, the only family with an
/// `mmap`, held out at -57 to -71 % on this AMD guest with the call at its recipe, where
/// the other operations' calls fitted at 1.3 to 3.5 times theirs. One counter: over 43
/// stored calibrations of that guest, `mmap-vmas` held out at 32 % on average instead of
/// 52 %, and a calibration's median held-out error at 12.18 % on average instead of 12.54.
pub const SYSCALLS_MM: &str = "syscalls_mm";

/// Pseudo-counter: VMAs one fork copies past what the `vm_area_struct` cache keeps hot.
pub const VMAS_COLD: &str = "vmas_cold";
/// Pseudo-counter: maple nodes one fork allocates past what `maple_node` keeps hot.
pub const NODES_COLD: &str = "nodes_cold";

/// Why a profile cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// Not a profile, or a field out of its bounds.
    #[error("{path}: not a valid usermm profile: {why}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// No cache directory (no `$XDG_CACHE_HOME` nor `$HOME`), or an unsafe one.
    #[error("profile cache: {0}")]
    Cache(String),
}

/// The machine and kernel a profile was calibrated on. Equal fingerprints (less
/// [`Fingerprint::thp`], which calibration sets itself) mean the prices apply.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// `/proc/sys/kernel/osrelease`.
    pub kernel_release: String,
    /// `/proc/version` (the build: compiler, build number and date).
    pub kernel_build: String,
    /// The CPU model (`/proc/cpuinfo`).
    pub cpu_model: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Whether the kernel runs under a hypervisor (the `hypervisor` CPU flag).
    pub hypervisor: bool,
    /// `/sys/devices/system/cpu/vulnerabilities/*`: the mitigations in force.
    pub mitigations: BTreeMap<String, String>,
    /// `/proc/cmdline`.
    pub cmdline: String,
    /// The THP settings when calibration began (`enabled`, `defrag`, `shmem_enabled`, each
    /// `hugepages-*` size's `enabled`); recorded, not compared: the probes set their own.
    pub thp: BTreeMap<String, String>,
}

impl Fingerprint {
    /// The running machine's.
    pub fn read() -> Fingerprint {
        let text = |p: &str| {
            std::fs::read_to_string(p)
                .map(|t| t.trim().to_string())
                .unwrap_or_default()
        };
        let cpuinfo = text("/proc/cpuinfo");
        let field = |k: &str| {
            cpuinfo
                .lines()
                .find(|l| l.starts_with(k))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default()
        };
        let dir_of = |d: &str, file: Option<&str>| -> BTreeMap<String, String> {
            let mut m = BTreeMap::new();
            for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let path = match file {
                    Some(f) => e.path().join(f),
                    None => e.path(),
                };
                if let Ok(v) = std::fs::read_to_string(&path) {
                    m.insert(name, v.trim().to_string());
                }
            }
            m
        };
        let thp_dir = "/sys/kernel/mm/transparent_hugepage";
        let mut thp: BTreeMap<String, String> = ["enabled", "defrag", "shmem_enabled"]
            .iter()
            .map(|k| (k.to_string(), text(&format!("{thp_dir}/{k}"))))
            .collect();
        thp.extend(
            dir_of(thp_dir, Some("enabled"))
                .into_iter()
                .filter(|(k, _)| k.starts_with("hugepages-")),
        );
        Fingerprint {
            kernel_release: text("/proc/sys/kernel/osrelease"),
            kernel_build: text("/proc/version"),
            cpu_model: field("model name"),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            hypervisor: field("flags").split_whitespace().any(|f| f == "hypervisor"),
            mitigations: dir_of("/sys/devices/system/cpu/vulnerabilities", None),
            cmdline: text("/proc/cmdline"),
            thp,
        }
    }

    /// Whether prices calibrated on `self` apply to `other` (everything but THP).
    pub fn same_machine(&self, other: &Fingerprint) -> bool {
        Fingerprint {
            thp: BTreeMap::new(),
            ..self.clone()
        } == Fingerprint {
            thp: BTreeMap::new(),
            ..other.clone()
        }
    }

    /// A short stable key of the machine (the cache file's name): FNV-1a of what
    /// [`Fingerprint::same_machine`] compares.
    pub fn key(&self) -> String {
        let text = serde_json::to_string(&Fingerprint {
            thp: BTreeMap::new(),
            ..self.clone()
        })
        .unwrap_or_default();
        format!("{:016x}", fnv1a(text.as_bytes()))
    }
}

/// FNV-1a, 64 bits.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A calibrated machine profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// [`PROFILE_VERSION`].
    pub version: u32,
    /// The probe catalogue and recipes it was made with (a hash: another build's probes or
    /// recipes make the cached profile stale).
    pub model_key: String,
    /// When, seconds since the Unix epoch.
    pub created_unix: u64,
    /// The machine and kernel.
    pub fingerprint: Fingerprint,
    /// The primitives the recipe priors were priced with.
    pub primitives: Primitives,
    /// The fit: priors, prices, their uncertainty, its validation.
    pub fit: Fit,
    /// The probe points fitted (engine counters, host median times).
    pub observations: Vec<Observation>,
    /// Wall time of the calibration, seconds.
    pub calibrate_seconds: f64,
    /// The machine's last-level cache, bytes (the bench's host side reads it from sysfs,
    /// `usermm_bench::host::llc_bytes`): zeroing and copying beyond it are priced apart.
    #[serde(default)]
    pub llc_bytes: u64,
    /// The median share of folio boundaries far apart in physical memory over the probes
    /// that sampled it, per mille ([`HOST_FAR`]): the scatter a prediction assumes where its
    /// counters carry none (another machine's rows, or no host column).
    #[serde(default)]
    pub far_permille: Option<u64>,
    /// The probe times of the calibrations pooled into [`Profile::observations`]' times,
    /// this one's first ([`crate::pool`]; empty in profiles from before pooling).
    #[serde(default)]
    pub timings: Vec<crate::pool::Timings>,
    /// How the host timed the probes (a hash; empty in profiles from before it): a
    /// calibration pools the probe times of an earlier profile of this machine with the same
    /// timing key even when its model key differs, point by point (a point's family and label:
    /// [`crate::pool::key`]), since the engine's counts, the recipes and the other probes of
    /// the catalogue (which the model key also covers) do not change a host time
    /// ([`Profile::timings_poolable`]).
    #[serde(default)]
    pub timing_key: String,
}

/// The recipe price of every counter and pseudo-counter the model prices, ns per event,
/// from `prims`: the priors of a fit.
pub fn priors(prims: &Primitives) -> BTreeMap<String, f64> {
    let mut p: BTreeMap<String, f64> = crate::prices::RECIPES
        .iter()
        .map(|r| (r.counter.to_string(), prims.recipe_ns(r.counter)))
        .collect();
    // A locked PTE update replaces a set_pte (its recipe is the difference, which a
    // non-negative fit cannot hold): [`features`] counts plain writes and RMWs apart.
    p.insert("pte_atomics".into(), prims.rmw_seq);
    let work = |w: &[(Prim, f64)]| w.iter().map(|&(q, k)| k * prims.get(q)).sum::<f64>();
    let fork = work(crate::prices::fixed_work("fork"));
    p.insert(OP_FORK.into(), fork);
    p.insert(OP_SPAWN.into(), fork);
    // As much again when the cache holds none of it.
    p.insert(OP_FORK_COLD.into(), fork);
    p.insert(
        MPROTECT_ENTRIES.into(),
        prims.load_seq + 4.0 * prims.kcall_loop,
    );
    // A per-page mapcount atomic priced on its own line ([`features`] takes it out of
    // folio_atomics, whose hot price the recipe subtracts).
    p.insert("mapcount_atomics".into(), prims.atomic_line);
    // Not kernel work: a timed loop's own accesses that miss the TLB walk the page table
    // (two-dimensional under a hypervisor): about a dependent random line per level.
    p.insert(TLB_MISSES.into(), 2.0 * prims.line_rand);
    // The zero_page and copy_page primitives stream 256 MiB and 64 MiB: beyond and about
    // at the cache. Within it `dd` from /dev/zero ran 2.7 times as fast on this guest.
    p.insert(PAGES_ZEROED_COLD.into(), prims.zero_page);
    p.insert("pages_zeroed".into(), prims.zero_page / 2.7);
    p.insert(PAGES_COPIED_COLD.into(), prims.copy_page);
    // A PTE line per eight pages and a struct page line per page, from memory.
    p.insert(WALK_COLD.into(), prims.line_seq * 1.125);
    // A folio's head, LRU neighbours and free-list lines, from memory.
    p.insert(FOLIOS_COLD.into(), 3.0 * prims.line_rand);
    p.insert(LARGE_FOLIOS_COLD.into(), 3.0 * prims.line_rand);
    p.insert(PTE_ATOMICS_COLD.into(), prims.line_rand / 8.0);
    p.insert(SYSCALLS_MM.into(), prims.syscall + 20.0 * prims.kcall);
    p.insert(
        MPROTECT_WRITES.into(),
        prims.rmw_seq + prims.line_seq + prims.line_jump,
    );
    // The exit of a task with its mm and the parent's wait: the mm's teardown, two context
    // switches and the wait4 call (the recipes' fork fixed work holds half of that already:
    // the task primitive is a clone, an exit and a wait).
    p.insert(
        OP_EXIT.into(),
        prims.syscall + 0.5 * prims.task + 100.0 * prims.kcall,
    );
    // Fork's and zap's own entries, priced apart from other walks' PTE writes and RMWs
    // ([`features`]): a child PTE set (`set_ptes` through PARAVIRT_XXL), a PTE cleared
    // (`ptep_get_and_clear_full`, an xchg).
    p.insert("fork_ptes".into(), prims.store_seq + prims.kcall_loop);
    p.insert("zap_ptes".into(), prims.load_seq + prims.rmw_seq);
    let cold = |c: Option<SlabCache>| c.map_or(0.0, |c| work(&c.cold_work(c.hot_objects() + 1)));
    p.insert(VMAS_COLD.into(), cold(prims.vma_slab));
    p.insert(NODES_COLD.into(), cold(prims.node_slab));
    p
}

/// The fit's inputs for one operation of table `op` (`fork`, `spawn`, `mprotect`, or
/// anything else) with the engine's `counters`: the counters as numbers, plain PTE writes
/// apart from locked ones, fork's and exit's fixed work, mprotect's entries apart from other
/// walks', and the slab objects past the hot ones (`prims`' caches).
pub fn features(
    op: &str,
    counters: &BTreeMap<String, u64>,
    prims: &Primitives,
    llc_bytes: u64,
) -> BTreeMap<String, f64> {
    let mut f: BTreeMap<String, f64> = counters
        .iter()
        .filter(|(k, _)| *k != HOST_FAR)
        .map(|(k, &v)| (k.clone(), v as f64))
        .collect();
    // Scattered unless measured otherwise: probes of fresh layouts found 96-100 %.
    let far = counters
        .get(HOST_FAR)
        .map_or(1.0, |&p| (p as f64 / 1000.0).min(1.0));
    let get = |k: &str| counters.get(k).copied().unwrap_or(0);
    if let Some(w) = f.get_mut("pte_writes") {
        *w = get("pte_writes").saturating_sub(get("pte_atomics")) as f64;
    }
    // Fork's child PTEs and zap's cleared ones are their own counters (fork_ptes,
    // zap_ptes), taken out of the generic writes and RMWs, which the fault, mprotect and
    // mremap paths price differently.
    let zap = get("zap_ptes");
    let zap_rmw = zap.min(get("pte_atomics"));
    if let Some(a) = f.get_mut("pte_atomics") {
        *a = (get("pte_atomics") - zap_rmw) as f64;
    }
    if let Some(w) = f.get_mut("pte_writes") {
        let plain = (*w as u64)
            .saturating_sub(get("fork_ptes"))
            .saturating_sub(zap - zap_rmw);
        *w = plain as f64;
    }
    if let Some(w) = f.get_mut("folio_atomics") {
        *w = get("folio_atomics").saturating_sub(get("mapcount_atomics")) as f64;
    }
    if op == "mprotect" {
        // The entries change_pte_range visits, and of them those it rewrites; the other
        // writes (a PMD split's table filled) stay plain PTE writes.
        let plain = f.get("pte_writes").copied().unwrap_or(0.0);
        let rewritten = plain.min(get("pte_reads") as f64);
        f.remove("pte_reads");
        f.insert(MPROTECT_ENTRIES.into(), get("pte_reads") as f64);
        f.insert(MPROTECT_WRITES.into(), rewritten);
        f.insert("pte_writes".into(), plain - rewritten);
    }
    // Pages zeroed or copied past what the last-level cache holds run at memory bandwidth:
    // on this guest (32 MiB L3) the probes' pages were zeroed at 55 ns each, the 256 MiB
    // fault rows' at several hundred.
    if llc_bytes > 0 {
        let walked = [
            "pte_reads",
            "fork_ptes",
            "zap_ptes",
            "mapcount_atomics",
            "frames_freed",
            "frames_allocated",
        ]
        .iter()
        .map(|c| get(c))
        .max()
        .unwrap_or(0);
        let cold = walked.saturating_sub(llc_bytes / 4096);
        if cold > 0 {
            // Fork's and zap's cold walks are priced by their folios (WALK_COLD's doc).
            if !matches!(op, "fork" | "munmap" | "madvise") {
                f.insert(WALK_COLD.into(), cold as f64);
            }
            // The folios handled one by one: fork's and zap's batches, the page-cache
            // folios a file fault maps (the faulting one and those mapped around it),
            // the folios munlock visits. Only zap's large ones are priced apart: fork
            // touches a large folio's head as it does a small one's (each page more of a
            // fork of 16 KiB folios cost 69 ns from 2.5 to 10 MiB, 72 from 10 to 47).
            // Zap batches of one folio over several calls (MADV_DONTNEED of one page at a
            // time) walk that folio cold once: at most the folios they free are distinct.
            // The sharing table's pte-dontneed row, 32 768 calls over 64 THPs, read +24
            // to +69 % priced a cold folio a call.
            let freed = get("folios_freed").saturating_sub(get("pgtable_freed"));
            let zap = if get("syscalls") > 1 && freed > 0 {
                get("zap_batches").min(freed)
            } else {
                get("zap_batches")
            };
            let (folios, large) = [
                (get("fork_batches"), 0),
                (zap, get("zap_batches_large").min(zap)),
                (get("fault_around_pages") + get("faults_file"), 0),
                (get("mlock_pte_folios"), 0),
            ]
            .into_iter()
            .max()
            .unwrap_or_default();
            let mut atomics = f.get("pte_atomics").copied().unwrap_or(0.0);
            if get("fork_batches") > 0 {
                let single = get("fork_batches").saturating_sub(get("fork_batches_large"));
                atomics = atomics.min(single as f64);
            }
            if atomics > 0.0 {
                f.insert(
                    PTE_ATOMICS_COLD.into(),
                    atomics * cold as f64 / walked as f64,
                );
            }
            let share = cold as f64 / walked as f64 * far;
            if folios > large && share > 0.0 {
                f.insert(FOLIOS_COLD.into(), (folios - large) as f64 * share);
            }
            if large > 0 && share > 0.0 {
                f.insert(LARGE_FOLIOS_COLD.into(), large as f64 * share);
            }
        }
        for (counter, cold, per) in [
            ("pages_zeroed", PAGES_ZEROED_COLD, 4096),
            ("pages_copied", PAGES_COPIED_COLD, 8192),
        ] {
            let n = get(counter);
            let warm = n.min(llc_bytes / per);
            if n > warm {
                f.insert(counter.into(), warm as f64);
                f.insert(cold.into(), (n - warm) as f64);
            }
        }
    }
    if SYSCALL_OPS.contains(&op) {
        if let Some(n) = f.remove("syscalls") {
            f.insert(SYSCALLS_MM.into(), n);
        }
    }
    let fixed = match op {
        "fork" => Some(OP_FORK),
        "spawn" => Some(OP_SPAWN),
        _ => None,
    };
    if let Some(fixed) = fixed {
        f.insert(fixed.into(), 1.0);
    }
    if op == "fork" && llc_bytes > 0 {
        let written = get("fork_ptes").saturating_mul(4096).min(llc_bytes);
        f.insert(OP_FORK_COLD.into(), written as f64 / llc_bytes as f64);
    }
    if op == "spawn" {
        f.insert(OP_EXIT.into(), 1.0);
    }
    let past =
        |c: Option<SlabCache>, n: u64| c.map_or(0, |c| n.saturating_sub(c.hot_objects())) as f64;
    f.insert(VMAS_COLD.into(), past(prims.vma_slab, get("vmas_copied")));
    f.insert(
        NODES_COLD.into(),
        past(prims.node_slab, get("vma_nodes_allocated")),
    );
    f
}

/// A workload's operations beside their features, as the fit takes them.
fn refs<'a>(
    work: &'a [(&str, &BTreeMap<String, u64>)],
    features: &'a [BTreeMap<String, f64>],
) -> Vec<(&'a str, &'a BTreeMap<String, f64>)> {
    work.iter()
        .zip(features)
        .map(|((op, _), f)| (*op, f))
        .collect()
}

impl Profile {
    /// A small synthetic profile for tests and examples: two probe families of one system
    /// call and N PTE reads (100 ns + 1.5 ns × N), every other price its recipe at round
    /// primitives. It predicts nothing about any machine.
    pub fn example() -> Result<Profile, crate::fit::FitError> {
        let prims = Primitives {
            syscall: 100.0,
            load_seq: 1.0,
            store_seq: 1.0,
            kcall_loop: 2.0,
            ..Primitives::default()
        };
        let observations: Vec<Observation> = ["a", "b"]
            .iter()
            .flat_map(|fam| {
                [1u64, 10, 100].map(|n| {
                    let c: BTreeMap<String, u64> =
                        [("syscalls".to_string(), 1), ("pte_reads".to_string(), n)]
                            .into_iter()
                            .collect();
                    Observation {
                        family: fam.to_string(),
                        op: "probe".into(),
                        label: n.to_string(),
                        counters: features("probe", &c, &prims, 0),
                        ns: 100.0 + 1.5 * n as f64,
                    }
                })
            })
            .collect();
        Ok(Profile {
            version: PROFILE_VERSION,
            model_key: "example".into(),
            created_unix: 0,
            fingerprint: Fingerprint::default(),
            primitives: prims,
            fit: Fit::new(&priors(&prims), &observations)?,
            observations,
            calibrate_seconds: 0.0,
            llc_bytes: 0,
            far_permille: None,
            timings: Vec::new(),
            timing_key: String::new(),
        })
    }

    /// The predicted host time of one operation of table `op` with these engine counters.
    pub fn predict(&self, op: &str, counters: &BTreeMap<String, u64>) -> Prediction {
        self.fit.predict(op, &self.features(op, counters))
    }

    /// The predicted host time of a workload: several operations, each named as
    /// [`features`] names them with its engine counters (a replayed program's faults,
    /// forks, munmaps…), priced together so that its interval keeps the prices' covariance.
    pub fn predict_all(&self, work: &[(&str, &BTreeMap<String, u64>)]) -> Prediction {
        let f = self.features_all(work);
        self.fit.predict_all(&refs(work, &f))
    }

    /// The predicted gain of one workload over another (percent, positive: faster) and its
    /// 95 % interval.
    pub fn gain_all(
        &self,
        variant: &[(&str, &BTreeMap<String, u64>)],
        baseline: &[(&str, &BTreeMap<String, u64>)],
    ) -> Option<(f64, [f64; 2])> {
        let (fv, fb) = (self.features_all(variant), self.features_all(baseline));
        self.fit.gain_all(&refs(variant, &fv), &refs(baseline, &fb))
    }

    fn features_all(&self, work: &[(&str, &BTreeMap<String, u64>)]) -> Vec<BTreeMap<String, f64>> {
        work.iter().map(|(op, c)| self.features(op, c)).collect()
    }

    /// [`features`] with this profile's primitives and cache, and its typical scatter
    /// where `counters` carry no [`HOST_FAR`].
    pub fn features(&self, op: &str, counters: &BTreeMap<String, u64>) -> BTreeMap<String, f64> {
        match self.far_permille {
            Some(far) if !counters.contains_key(HOST_FAR) => {
                let mut c = counters.clone();
                c.insert(HOST_FAR.into(), far);
                features(op, &c, &self.primitives, self.llc_bytes)
            }
            _ => features(op, counters, &self.primitives, self.llc_bytes),
        }
    }

    /// The prediction's parts: each priced counter's events × its fitted price, ns (they
    /// sum to [`Profile::predict`]'s time).
    pub fn parts(&self, op: &str, counters: &BTreeMap<String, u64>) -> BTreeMap<String, f64> {
        self.features(op, counters)
            .into_iter()
            .map(|(k, n)| {
                let ns = n * self.fit.price(op, &k);
                (k, ns)
            })
            .filter(|(_, ns)| *ns > 0.0)
            .collect()
    }

    /// The predicted gain of `variant` over `baseline` (percent, positive: faster) and its
    /// 95 % interval.
    pub fn gain(
        &self,
        op: &str,
        variant: &BTreeMap<String, u64>,
        baseline: &BTreeMap<String, u64>,
    ) -> Option<(f64, [f64; 2])> {
        self.fit.gain(
            op,
            &self.features(op, variant),
            &self.features(op, baseline),
        )
    }

    /// Whether this profile is fresh for `machine` and the model `model_key` at `now`.
    pub fn fresh_for(&self, machine: &Fingerprint, model_key: &str, now: u64) -> bool {
        self.version == PROFILE_VERSION
            && self.model_key == model_key
            && self.fingerprint.same_machine(machine)
            && now.saturating_sub(self.created_unix) <= MAX_AGE_SECS
    }

    /// Whether a calibration of `machine` at `now`, under the model `model_key` and the timing
    /// key `timing_key`, may pool this profile's probe times ([`Profile::timings`]): the
    /// same machine and kernel, and the same model or (when this profile names one) the same
    /// timing key. Each timing's own age is [`crate::pool::pool`]'s to judge.
    pub fn timings_poolable(
        &self,
        machine: &Fingerprint,
        model_key: &str,
        timing_key: &str,
        now: u64,
    ) -> bool {
        self.fresh_for(machine, model_key, now)
            || (self.version == PROFILE_VERSION
                && !self.timing_key.is_empty()
                && self.timing_key == timing_key
                && self.fingerprint.same_machine(machine))
    }

    /// Checks every field against its bounds (a profile file is untrusted).
    pub fn validate(&self) -> Result<(), String> {
        let finite_nonneg = |what: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(format!("{what} = {v}"))
            }
        };
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.len() <= 64
                && n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        if self.version != PROFILE_VERSION {
            return Err(format!(
                "version {} (this build reads {PROFILE_VERSION})",
                self.version
            ));
        }
        let fp = &self.fingerprint;
        let strings = [
            &fp.kernel_release,
            &fp.kernel_build,
            &fp.cpu_model,
            &fp.cmdline,
            &self.model_key,
            &self.timing_key,
        ];
        let maps = fp.mitigations.iter().chain(&fp.thp);
        if strings.iter().any(|s| s.len() > 4096)
            || fp.mitigations.len() + fp.thp.len() > 256
            || maps
                .into_iter()
                .any(|(k, v)| k.len() > 256 || v.len() > 4096)
        {
            return Err("fingerprint field too long".into());
        }
        for &p in Prim::ALL {
            finite_nonneg(crate::prices::prim_name(p), self.primitives.get(p))?;
        }
        let fit = &self.fit;
        let k = fit.prices.len() + fit.op_prices.len();
        if fit.prices.is_empty()
            || fit.prices.len() > 256
            || fit.op_prices.len() > 1024
            || fit.priors.len() > 256
            || fit.covariance.len() != k * k
        {
            return Err(format!(
                "{k} prices, {} covariance entries",
                fit.covariance.len()
            ));
        }
        for (c, &v) in &fit.priors {
            if !name_ok(c) {
                return Err(format!("counter name {c:?}"));
            }
            finite_nonneg(c, v)?;
        }
        for p in &fit.prices {
            if p.counters.is_empty()
                || p.counters.iter().any(|c| !fit.priors.contains_key(c))
                || p.families.len() > 64
                || p.families.iter().any(|f| f.len() > 64)
            {
                return Err(format!("price group {:?}", p.counters));
            }
            finite_nonneg("multiplier", p.multiplier)?;
            finite_nonneg("multiplier_se", p.multiplier_se)?;
        }
        for p in &fit.op_prices {
            if p.group >= fit.prices.len()
                || !name_ok(&p.op)
                || p.families.len() > 64
                || p.families.iter().any(|f| f.len() > 64)
            {
                return Err(format!("operation price {} of group {}", p.op, p.group));
            }
            finite_nonneg("multiplier", p.multiplier)?;
            finite_nonneg("multiplier_se", p.multiplier_se)?;
        }
        finite_nonneg("op_lambda", fit.op_lambda)?;
        if fit.covariance.iter().any(|v| !v.is_finite()) {
            return Err("covariance not finite".into());
        }
        finite_nonneg("lambda", fit.lambda)?;
        finite_nonneg("discrepancy", fit.discrepancy)?;
        if fit.discrepancy > 10.0
            || self.observations.len() > 10_000
            || fit.held_out.len() > 10_000
            || fit.lambda_scan.len() > 64
        {
            return Err("fit quality fields out of bounds".into());
        }
        if self.timings.len() > crate::pool::POOL
            || self.timings.iter().any(|t| {
                t.ns.len() > 10_000
                    || t.ns
                        .iter()
                        .any(|(k, v)| k.len() > 330 || !v.is_finite() || *v <= 0.0)
            })
        {
            return Err("pooled timings out of bounds".into());
        }
        for o in &self.observations {
            finite_nonneg("observation ns", o.ns)?;
            if o.counters.len() > 256
                || o.family.len() > 64
                || o.op.len() > 64
                || o.label.len() > 256
                || o.counters
                    .iter()
                    .any(|(c, v)| !name_ok(c) || !v.is_finite())
            {
                return Err(format!("observation {} {}", o.family, o.label));
            }
        }
        Ok(())
    }

    /// Parses and validates a profile (`path` names it in errors).
    pub fn from_json(text: &str, path: &str) -> Result<Profile, ProfileError> {
        let invalid = |why: String| ProfileError::Invalid {
            path: path.into(),
            why,
        };
        let p: Profile = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
        p.validate().map_err(invalid)?;
        Ok(p)
    }

    /// Reads a profile file: at most [`MAX_PROFILE_BYTES`], not through a symbolic link.
    pub fn load(path: &Path) -> Result<Profile, ProfileError> {
        let shown = path.display().to_string();
        let io = |source| ProfileError::Io {
            path: shown.clone(),
            source,
        };
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(io)?;
        if !f.metadata().map_err(io)?.is_file() {
            return Err(ProfileError::Invalid {
                path: shown,
                why: "not a regular file".into(),
            });
        }
        let mut text = String::new();
        f.take(MAX_PROFILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(io)?;
        if text.len() as u64 > MAX_PROFILE_BYTES {
            return Err(ProfileError::Invalid {
                path: shown,
                why: format!("larger than {MAX_PROFILE_BYTES} bytes"),
            });
        }
        Profile::from_json(&text, &shown)
    }

    /// Writes the profile to `path` safely: a new temporary file beside it (never through a
    /// symbolic link), synced, then renamed over `path`.
    pub fn save(&self, path: &Path) -> Result<(), ProfileError> {
        let shown = path.display().to_string();
        let io = |source| ProfileError::Io {
            path: shown.clone(),
            source,
        };
        let text = serde_json::to_string_pretty(self).map_err(|e| ProfileError::Invalid {
            path: shown.clone(),
            why: e.to_string(),
        })?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = path.with_extension(format!("tmp-{}-{nanos}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(io)?;
        let written = f.write_all(text.as_bytes()).and_then(|()| f.sync_all());
        if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(e));
        }
        Ok(())
    }
}

/// The profile cache directory, created (mode 0700) if missing: `$XDG_CACHE_HOME/usermm`,
/// else `$HOME/.cache/usermm`. Refused if it (or the cache root) is a symbolic link, not a
/// directory, or writable by group or others.
pub fn cache_dir() -> Result<PathBuf, ProfileError> {
    let root = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| Path::new(v).is_absolute())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| Path::new(v).is_absolute())
                .map(|h| Path::new(&h).join(".cache"))
        })
        .ok_or_else(|| {
            ProfileError::Cache("neither XDG_CACHE_HOME nor HOME is an absolute path".into())
        })?;
    let dir = root.join("usermm");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| ProfileError::Cache(format!("{}: {e}", dir.display())))?;
    let meta = std::fs::symlink_metadata(&dir)
        .map_err(|e| ProfileError::Cache(format!("{}: {e}", dir.display())))?;
    if !meta.is_dir() || meta.permissions().mode() & 0o022 != 0 {
        return Err(ProfileError::Cache(format!(
            "{} is not a private directory",
            dir.display()
        )));
    }
    // Another user's directory would let them swap the profile.
    let owner = std::fs::symlink_metadata(&root)
        .map(|m| m.uid())
        .unwrap_or(u32::MAX);
    if meta.uid() != owner && meta.uid() != 0 {
        return Err(ProfileError::Cache(format!(
            "{} is owned by uid {}",
            dir.display(),
            meta.uid()
        )));
    }
    Ok(dir)
}

/// The cache file of `machine`'s profile in `dir`.
pub fn cache_file(dir: &Path, machine: &Fingerprint) -> PathBuf {
    dir.join(format!("profile-{}.json", machine.key()))
}

#[cfg(test)]
mod tests;
