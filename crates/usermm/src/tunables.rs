//! Runtime switches: every optimization of a seed is one of these, with its honest baseline.
//!
//! `usermm tunables` lists them with their defaults. Defaults are the best configuration.
//! Each tunable is one entry of [`REGISTRY`]: its name, accepted values, help, getter and
//! parser; listing, setting, the CLI and the README table all read that one table.
//! Seed issues add their switches here; the engine core adds the debugging switches.

use crate::errno::Errno;

/// Per-size THP policy (the meaning of `/sys/kernel/mm/transparent_hugepage/hugepages-*/enabled`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThpPolicy {
    /// Use this size for every eligible anonymous fault.
    Always,
    /// Use it only in VMAs with `MADV_HUGEPAGE`.
    Madvise,
    /// Never.
    Never,
    /// Follow the top-level policy.
    Inherit,
}

impl ThpPolicy {
    /// Parses `always|madvise|never|inherit`.
    pub fn parse(s: &str) -> Option<ThpPolicy> {
        Some(match s {
            "always" => ThpPolicy::Always,
            "madvise" => ThpPolicy::Madvise,
            "never" => ThpPolicy::Never,
            "inherit" => ThpPolicy::Inherit,
            _ => return None,
        })
    }

    /// The sysfs spelling.
    pub fn name(self) -> &'static str {
        match self {
            ThpPolicy::Always => "always",
            ThpPolicy::Madvise => "madvise",
            ThpPolicy::Never => "never",
            ThpPolicy::Inherit => "inherit",
        }
    }
}

/// Highest folio order the THP policy covers (2 MiB with 4 KiB pages).
pub const PMD_ORDER: u32 = 9;

/// THP settings: the top-level policy and one per anonymous folio order 2..=9.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThpSettings {
    /// `/sys/kernel/mm/transparent_hugepage/enabled` (never `Inherit`).
    pub top: ThpPolicy,
    /// Per order (index = order; orders 0 and 1 are unused).
    pub(crate) per_order: [ThpPolicy; PMD_ORDER as usize + 1],
    /// `use_zero_page`: map the huge zero page on read faults of PMD-sized regions.
    pub(crate) use_zero_page: bool,
}

impl Default for ThpSettings {
    /// Linux's defaults: top `madvise`, 2M `inherit`, every other size `never`.
    fn default() -> Self {
        let mut per_order = [ThpPolicy::Never; PMD_ORDER as usize + 1];
        per_order[PMD_ORDER as usize] = ThpPolicy::Inherit;
        ThpSettings {
            top: ThpPolicy::Madvise,
            per_order,
            use_zero_page: true,
        }
    }
}

impl ThpSettings {
    /// Whether `order` may be used in a VMA with or without `MADV_HUGEPAGE`.
    pub(crate) fn order_allowed(&self, order: u32, vma_hugepage: bool) -> bool {
        let Some(p) = self.per_order.get(order as usize) else {
            return false;
        };
        let p = if *p == ThpPolicy::Inherit {
            self.top
        } else {
            *p
        };
        match p {
            ThpPolicy::Always => true,
            ThpPolicy::Madvise => vma_hugepage,
            ThpPolicy::Never | ThpPolicy::Inherit => false,
        }
    }

    /// Sets the policy of one folio size in bytes (16K..=2M, a power of two).
    pub fn set_size(&mut self, bytes: u64, p: ThpPolicy) -> Result<(), Errno> {
        if !bytes.is_power_of_two() || !(16 << 10..=2 << 20).contains(&bytes) {
            return Err(Errno::EINVAL);
        }
        let order = bytes.trailing_zeros() - 12;
        self.per_order[order as usize] = p;
        Ok(())
    }

    /// Anonymous faults allocate folios of `bytes` (a page: order 0): the top-level policy
    /// `never` and, above a page, that size `always`; the other sizes keep their policies
    /// (Linux's defaults leave them `never` or, for 2M, inheriting `never`). A size with no
    /// knob is left out, so its faults stay order 0. The one-folio-size machines of the
    /// benchmarks and the fork profile set it, as the host's `HostSession::folio` sets the
    /// knobs.
    pub fn only_folio(&mut self, bytes: u64) {
        self.top = ThpPolicy::Never;
        if bytes > 4096 {
            // Ignored as the benchmarks always have: an engine without the size runs order 0.
            let _ = self.set_size(bytes, ThpPolicy::Always);
        }
    }

    /// Sets the top-level policy (`size` `None`; `inherit` is refused there) or one folio
    /// size's ([`ThpSettings::set_size`]).
    pub fn set_policy(&mut self, size: Option<u64>, p: ThpPolicy) -> Result<(), Errno> {
        match size {
            None if p == ThpPolicy::Inherit => Err(Errno::EINVAL),
            None => {
                self.top = p;
                Ok(())
            }
            Some(bytes) => self.set_size(bytes, p),
        }
    }
}

/// A `shmem_enabled` policy: the top-level knob
/// (`/sys/kernel/mm/transparent_hugepage/shmem_enabled`) or one size's
/// (`hugepages-<size>kB/shmem_enabled`; only the top level takes `deny` and `force`, only a
/// size takes `inherit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmemHuge {
    /// Huge folios wherever they fit.
    Always,
    /// Only folios that lie within `i_size`.
    WithinSize,
    /// Only in `MADV_HUGEPAGE` regions.
    Advise,
    /// Never.
    Never,
    /// Top level: off for every mount.
    Deny,
    /// Top level: PMD folios for every mount (testing).
    Force,
    /// Size: follow the top level.
    Inherit,
}

impl ShmemHuge {
    /// Parses the sysfs spelling.
    pub fn parse(s: &str) -> Option<ShmemHuge> {
        Some(match s {
            "always" => ShmemHuge::Always,
            "within_size" => ShmemHuge::WithinSize,
            "advise" => ShmemHuge::Advise,
            "never" => ShmemHuge::Never,
            "deny" => ShmemHuge::Deny,
            "force" => ShmemHuge::Force,
            "inherit" => ShmemHuge::Inherit,
            _ => return None,
        })
    }
}

/// The `shmem_enabled` knobs: which folio orders shmem faults may allocate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmemSettings {
    /// The top-level policy (never `Inherit`).
    pub top: ShmemHuge,
    /// Per order 2..=9 (never `Deny`/`Force`).
    pub per_order: [ShmemHuge; PMD_ORDER as usize + 1],
}

impl Default for ShmemSettings {
    /// Linux's defaults: top `never`, 2M `inherit`, every other size `never`.
    fn default() -> Self {
        let mut per_order = [ShmemHuge::Never; PMD_ORDER as usize + 1];
        per_order[PMD_ORDER as usize] = ShmemHuge::Inherit;
        ShmemSettings {
            top: ShmemHuge::Never,
            per_order,
        }
    }
}

impl ShmemSettings {
    /// The orders (a bit mask) a shmem page fault at page `index` may allocate, in a file of
    /// `size_pages` pages, for shared anonymous memory (`anon_shmem`) or a file on the
    /// scenario's tmpfs (mounted `huge=never`), with or without `MADV_HUGEPAGE`.
    ///
    /// Linux counterpart: `shmem_allowable_huge_orders` with `shmem_huge_global_enabled`.
    /// Measured on 6.18: sizes set to `always` (and `within_size`/`advise` where they apply)
    /// reach tmpfs file mappings too, while the sizes that `inherit` follow the mount's own
    /// policy (`huge=never` for tmpfs files, the top level for shared anonymous memory);
    /// `deny` turns everything off and `force` gives every mapping the inheriting sizes.
    pub(crate) fn fault_orders(
        &self,
        anon_shmem: bool,
        hugepage: bool,
        index: u64,
        size_pages: u64,
    ) -> u32 {
        let within = |order: usize| (index >> order << order) + (1 << order) <= size_pages;
        let by = |p: ShmemHuge| -> u32 {
            let mut m = 0;
            for order in 2..=PMD_ORDER as usize {
                if self.per_order[order] == p {
                    m |= 1 << order;
                }
            }
            m
        };
        match self.top {
            ShmemHuge::Deny => return 0,
            ShmemHuge::Force => return by(ShmemHuge::Inherit),
            _ => {}
        }
        let mut mask = by(ShmemHuge::Always);
        for order in 2..=PMD_ORDER as usize {
            if self.per_order[order] == ShmemHuge::WithinSize && within(order) {
                mask |= 1 << order;
            }
        }
        if hugepage {
            mask |= by(ShmemHuge::Advise);
        }
        let global = anon_shmem
            && match self.top {
                ShmemHuge::Always => true,
                ShmemHuge::WithinSize => within(PMD_ORDER as usize),
                ShmemHuge::Advise => hugepage,
                _ => false,
            };
        if global {
            mask |= by(ShmemHuge::Inherit);
        }
        mask
    }
}

/// Whether fork/zap process PTEs one at a time or in folio batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PteBatching {
    /// The pre-seed algorithm: one PTE, one refcount op, one rmap op at a time.
    PerPte,
    /// Seed 000: `folio_pte_batch` runs of one folio handled with one op each.
    Batched,
}

/// Which munlock algorithm runs (seed 004).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MunlockDesign {
    /// The 3.11 design plus the first N patches of the 2013 series (0..=7): a munlock pass
    /// over the range before unmapping, pages isolated from the unevictable list.
    Stage(u8),
    /// The current design (5.18+): munlock at rmap removal, `mlock_count`, per-CPU mlock batch.
    Modern,
}

impl MunlockDesign {
    /// Every variant in benchmark order.
    pub const ALL: [MunlockDesign; 9] = [
        MunlockDesign::Stage(0),
        MunlockDesign::Stage(1),
        MunlockDesign::Stage(2),
        MunlockDesign::Stage(3),
        MunlockDesign::Stage(4),
        MunlockDesign::Stage(5),
        MunlockDesign::Stage(6),
        MunlockDesign::Stage(7),
        MunlockDesign::Modern,
    ];

    /// `stage0`…`stage7` or `modern`.
    pub fn name(self) -> String {
        match self {
            MunlockDesign::Stage(n) => format!("stage{n}"),
            MunlockDesign::Modern => "modern".into(),
        }
    }

    /// Parses a name.
    pub(crate) fn parse(s: &str) -> Option<MunlockDesign> {
        if s == "modern" {
            return Some(MunlockDesign::Modern);
        }
        let n: u8 = s.strip_prefix("stage")?.parse().ok()?;
        (n <= 7).then_some(MunlockDesign::Stage(n))
    }

    /// Whether patch `n` (1..=7) of the series is applied.
    pub(crate) fn has_patch(self, n: u8) -> bool {
        match self {
            MunlockDesign::Stage(s) => s >= n,
            MunlockDesign::Modern => true,
        }
    }
}

/// How fork builds the child's VMA tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmaTreeCopy {
    /// The pre-seed algorithm (Linux 6.1-6.5): build the child's tree VMA by VMA in the maple
    /// tree's bulk mode (preallocated nodes, full leaves, appended at the right edge).
    Insert,
    /// Seed 001: duplicate the tree's node structure top-down (`__mt_dup`), then replace entries.
    Dup,
}

/// Runtime switches of one machine.
#[derive(Clone, Debug)]
pub struct Tunables {
    /// THP policy.
    pub thp: ThpSettings,
    /// shmem_enabled policy (shared anonymous memory and tmpfs).
    pub shmem: ShmemSettings,
    /// `vm.max_map_count`.
    pub max_map_count: u64,
    /// `vm.overcommit_memory` (0 heuristic, 1 always, 2 never).
    pub overcommit_memory: u32,
    /// Seed 000: PTE batching in fork's `copy_pte_range`.
    pub fork_pte_batch: PteBatching,
    /// Seed 000 follow-up: PTE batching in zap (munmap, dontneed, exit).
    pub zap_pte_batch: PteBatching,
    /// Seed 003 patches 12-14: one batched rmap update (and one `set_ptes`) when a PMD-mapped
    /// THP is PTE-remapped, instead of one per page (v6.7 `__split_huge_pmd_locked`).
    pub remap_rmap_batch: PteBatching,
    /// Seed 001: how fork copies the VMA tree.
    pub vma_tree_dup: VmaTreeCopy,
    /// Seed 004: the munlock algorithm.
    pub munlock: MunlockDesign,
    /// Seed 002: how kernel page tables are reached while the linear map is built.
    pub(crate) linear_map: crate::kmap::LinearMapVariant,
    /// Seed 003: the tracker that answers "is this large folio mapped only by this mm?".
    pub sharing: crate::sharing::SharingTracker,
    /// Keep every side-table tracker up to date so `validate` compares them all.
    pub sharing_shadow: bool,
    /// The disk's `read_ahead_kb` (`bdi->ra_pages` in KiB): the readahead window of disk files.
    pub(crate) read_ahead_kb: u64,
    /// The disk's `max_sectors_kb` (`bdi->io_pages` in KiB): the cap of one forced readahead.
    pub(crate) max_sectors_kb: u64,
    /// `fault_around_bytes`: the window a read fault on a file maps from the page cache.
    pub(crate) fault_around_bytes: u64,
    /// Debug: verify every TLB hit against the page table and count stale hits.
    pub check_tlb: bool,
    /// Test switch: skip the TLB flush of munmap/mprotect/fork (makes the missing flush detectable).
    pub test_skip_tlb_flush: bool,
    /// Test switch: flush only the CPU that changed the entries, never another CPU's TLB (a
    /// missing shootdown: only a scenario that uses a second CPU can catch it).
    pub test_local_flush_only: bool,
    /// Test switch: do not write-protect the parent's PTEs at fork (a deliberately wrong engine).
    pub test_skip_fork_wrprotect: bool,
}

impl Default for Tunables {
    fn default() -> Self {
        Tunables {
            thp: ThpSettings::default(),
            shmem: ShmemSettings::default(),
            max_map_count: 65530,
            overcommit_memory: 0,
            fork_pte_batch: PteBatching::Batched,
            zap_pte_batch: PteBatching::Batched,
            remap_rmap_batch: PteBatching::Batched,
            vma_tree_dup: VmaTreeCopy::Dup,
            munlock: MunlockDesign::Modern,
            linear_map: crate::kmap::LinearMapVariant::SingleMap,
            sharing: crate::sharing::SharingTracker::Owner,
            sharing_shadow: cfg!(debug_assertions),
            // The scenario host's virtio disk (Linux 6.18.44): /sys/block/vda/queue/read_ahead_kb
            // reads 8192 and max_sectors_kb 4096, so readahead windows are 2048 pages and a
            // forced readahead (MADV_WILLNEED) is capped at 1024 pages. Linux's own default
            // for a plain disk is 128 (`VM_READAHEAD_PAGES`).
            read_ahead_kb: 8192,
            max_sectors_kb: 4096,
            // Linux's default (debugfs fault_around_bytes): 16 pages.
            fault_around_bytes: 64 << 10,
            check_tlb: cfg!(debug_assertions),
            test_skip_tlb_flush: false,
            test_local_flush_only: false,
            test_skip_fork_wrprotect: false,
        }
    }
}

/// A tunable as listed by `usermm tunables`.
#[derive(Clone, Debug)]
pub struct TunableInfo {
    /// Name used by `set tunable NAME=VALUE`.
    pub name: &'static str,
    /// Current value.
    pub value: String,
    /// Accepted values.
    pub values: &'static str,
    /// One-line description.
    pub help: &'static str,
}

/// One entry of the tunables registry ([`REGISTRY`]): everything `usermm tunables`, `set
/// tunable`, the Python binding and the README's table know about one switch.
pub struct TunableDef {
    /// Name used by `set tunable NAME=VALUE`.
    pub name: &'static str,
    /// Accepted values, as shown to users and in [`TunableError::BadValue`].
    pub values: &'static str,
    /// One-line description.
    pub help: &'static str,
    /// The default is `cfg!(debug_assertions)` (on in debug builds, off in release builds).
    pub(crate) debug_default: bool,
    /// The current value, in a spelling that `set` accepts.
    pub(crate) get: fn(&Tunables) -> String,
    /// Parses and stores a value; `None` (nothing changed) if it is not accepted.
    pub(crate) set: fn(&mut Tunables, &str) -> Option<()>,
}

impl TunableDef {
    /// The value in [`Tunables::default`].
    pub fn default_value(&self) -> String {
        (self.get)(&Tunables::default())
    }

    /// The registry entry of `name`.
    pub(crate) fn find(name: &str) -> Option<&'static TunableDef> {
        REGISTRY.iter().find(|d| d.name == name)
    }
}

impl std::fmt::Debug for TunableDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunableDef")
            .field("name", &self.name)
            .field("values", &self.values)
            .finish_non_exhaustive()
    }
}

fn batching_name(b: PteBatching) -> &'static str {
    match b {
        PteBatching::PerPte => "per-pte",
        PteBatching::Batched => "batched",
    }
}

fn parse_batching(v: &str) -> Option<PteBatching> {
    match v {
        "per-pte" | "off" | "0" | "false" => Some(PteBatching::PerPte),
        "batched" | "on" | "1" | "true" => Some(PteBatching::Batched),
        _ => None,
    }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "on" | "1" | "true" | "yes" => Some(true),
        "off" | "0" | "false" | "no" => Some(false),
        _ => None,
    }
}

/// A KiB size of the disk queue (`read_ahead_kb`, `max_sectors_kb`): at most 1 GiB.
fn parse_kib(v: &str) -> Option<u64> {
    v.parse().ok().filter(|&v| v <= 1 << 20)
}

/// One `true|false` tunable stored in the field `$($f).+`.
macro_rules! bool_tunable {
    ($name:literal, $help:literal, $debug_default:literal, $($f:ident).+) => {
        TunableDef {
            name: $name,
            values: "true|false",
            help: $help,
            debug_default: $debug_default,
            get: |t| t.$($f).+.to_string(),
            set: |t, v| {
                t.$($f).+ = parse_bool(v)?;
                Some(())
            },
        }
    };
}

/// One `batched|per-pte` tunable stored in the field `$f`.
macro_rules! batching_tunable {
    ($name:literal, $help:literal, $f:ident) => {
        TunableDef {
            name: $name,
            values: "batched|per-pte",
            help: $help,
            debug_default: false,
            get: |t| batching_name(t.$f).into(),
            set: |t, v| {
                t.$f = parse_batching(v)?;
                Some(())
            },
        }
    };
}

/// Every tunable, in the order `usermm tunables` lists them.
pub const REGISTRY: &[TunableDef] = &[
    batching_tunable!(
        "fork_pte_batch",
        "seed 000: batch consecutive PTEs of one large folio in fork",
        fork_pte_batch
    ),
    batching_tunable!(
        "zap_pte_batch",
        "seed 000 follow-up: batch PTEs of one folio in munmap/dontneed/exit",
        zap_pte_batch
    ),
    batching_tunable!(
        "remap_rmap_batch",
        "seed 003: one rmap update for all PTEs when a PMD-mapped THP is PTE-remapped",
        remap_rmap_batch
    ),
    TunableDef {
        name: "vma_tree_dup",
        values: "dup|insert",
        help: "seed 001: fork duplicates the VMA tree structurally (dup) instead of building it in bulk mode (insert, Linux 6.1-6.5)",
        debug_default: false,
        get: |t| {
            match t.vma_tree_dup {
                VmaTreeCopy::Dup => "dup",
                VmaTreeCopy::Insert => "insert",
            }
            .into()
        },
        set: |t, v| {
            t.vma_tree_dup = match v {
                "dup" | "on" | "1" | "true" => VmaTreeCopy::Dup,
                "insert" | "off" | "0" | "false" => VmaTreeCopy::Insert,
                _ => return None,
            };
            Some(())
        },
    },
    TunableDef {
        name: "munlock",
        values: "stage0..stage7|modern",
        help: "seed 004: the 2013 munlock batching patches applied cumulatively, or the current design",
        debug_default: false,
        get: |t| t.munlock.name(),
        set: |t, v| {
            t.munlock = MunlockDesign::parse(v)?;
            Some(())
        },
    },
    TunableDef {
        name: "linear_map",
        values: crate::kmap::LinearMapVariant::VALUES,
        help: "seed 002: fixmap remaps per kernel page table (33/2/1 TLBIs; va_late 0 for late changes)",
        debug_default: false,
        get: |t| t.linear_map.name().into(),
        set: |t, v| {
            t.linear_map = crate::kmap::LinearMapVariant::parse(v)?;
            Some(())
        },
    },
    TunableDef {
        name: "sharing",
        values: crate::sharing::SharingTracker::VALUES,
        help: "seed 003: tracker of 'mapped shared' for large anon folios (decides COW reuse)",
        debug_default: false,
        get: |t| t.sharing.name(),
        set: |t, v| {
            t.sharing = crate::sharing::SharingTracker::parse(v)?;
            Some(())
        },
    },
    bool_tunable!(
        "sharing_shadow",
        "debug: maintain every sharing tracker so validate() compares them with the truth",
        true,
        sharing_shadow
    ),
    TunableDef {
        name: "max_map_count",
        values: "integer",
        help: "vm.max_map_count",
        debug_default: false,
        get: |t| t.max_map_count.to_string(),
        set: |t, v| {
            t.max_map_count = v.parse().ok()?;
            Some(())
        },
    },
    TunableDef {
        name: "overcommit_memory",
        values: "0|1|2",
        help: "vm.overcommit_memory (0 heuristic, 1 always, 2 never)",
        debug_default: false,
        get: |t| t.overcommit_memory.to_string(),
        set: |t, v| {
            t.overcommit_memory = match v {
                "0" => 0,
                "1" => 1,
                "2" => 2,
                _ => return None,
            };
            Some(())
        },
    },
    bool_tunable!(
        "thp_use_zero_page",
        "map the huge zero page on PMD-sized read faults",
        false,
        thp.use_zero_page
    ),
    TunableDef {
        name: "read_ahead_kb",
        values: "integer (KiB)",
        help: "the disk's read_ahead_kb: readahead window of disk files",
        debug_default: false,
        get: |t| t.read_ahead_kb.to_string(),
        set: |t, v| {
            t.read_ahead_kb = parse_kib(v)?;
            Some(())
        },
    },
    TunableDef {
        name: "max_sectors_kb",
        values: "integer (KiB)",
        help: "the disk's max_sectors_kb: cap of a forced readahead (MADV_WILLNEED)",
        debug_default: false,
        get: |t| t.max_sectors_kb.to_string(),
        set: |t, v| {
            t.max_sectors_kb = parse_kib(v)?;
            Some(())
        },
    },
    TunableDef {
        name: "fault_around_bytes",
        values: "4096..=65536, power of two",
        help: "fault_around_bytes: how much a file read fault maps from the page cache",
        debug_default: false,
        get: |t| t.fault_around_bytes.to_string(),
        set: |t, v| {
            t.fault_around_bytes = v
                .parse()
                .ok()
                .filter(|&v: &u64| v.is_power_of_two() && (4096..=65536).contains(&v))?;
            Some(())
        },
    },
    bool_tunable!(
        "check_tlb",
        "debug: verify every TLB hit against the page table",
        true,
        check_tlb
    ),
    bool_tunable!(
        "test_skip_tlb_flush",
        "test only: skip TLB flushes (a deliberately broken engine)",
        false,
        test_skip_tlb_flush
    ),
    bool_tunable!(
        "test_local_flush_only",
        "test only: flush the local TLB alone, no shootdown of other CPUs (a deliberately broken engine)",
        false,
        test_local_flush_only
    ),
    bool_tunable!(
        "test_skip_fork_wrprotect",
        "test only: fork does not write-protect the parent (a deliberately broken engine)",
        false,
        test_skip_fork_wrprotect
    ),
];

/// The README's table of tunables (between `<!-- tunables:begin -->` and
/// `<!-- tunables:end -->`): name, accepted values, default, what it switches.
pub fn markdown_table() -> String {
    // A `|` inside a cell (even inside a code span) must be escaped in a GitHub table.
    let cell = |s: &str| s.replace('|', "\\|");
    let mut out =
        String::from("| tunable | values | default | what it switches |\n|---|---|---|---|\n");
    for d in REGISTRY {
        let default = if d.debug_default {
            "`true` in debug builds, `false` in release builds".to_string()
        } else {
            format!("`{}`", cell(&d.default_value()))
        };
        out.push_str(&format!(
            "| `{}` | `{}` | {} | {} |\n",
            d.name,
            cell(d.values),
            default,
            cell(d.help)
        ));
    }
    out
}

/// Error from [`Tunables::set`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TunableError {
    /// No tunable of that name.
    #[error("unknown tunable `{0}` (see `usermm tunables`)")]
    Unknown(String),
    /// The value is not accepted.
    #[error("bad value `{value}` for tunable `{name}` (accepted: {accepted})")]
    BadValue {
        /// Tunable name.
        name: String,
        /// Rejected value.
        value: String,
        /// Accepted values.
        accepted: &'static str,
    },
}

impl Tunables {
    /// Lists every tunable with its current value.
    pub fn list(&self) -> Vec<TunableInfo> {
        REGISTRY
            .iter()
            .map(|d| TunableInfo {
                name: d.name,
                value: (d.get)(self),
                values: d.values,
                help: d.help,
            })
            .collect()
    }

    /// Sets one tunable by name.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), TunableError> {
        let d = TunableDef::find(name).ok_or_else(|| TunableError::Unknown(name.to_string()))?;
        (d.set)(self, value).ok_or_else(|| TunableError::BadValue {
            name: name.to_string(),
            value: value.to_string(),
            accepted: d.values,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(t: &Tunables) -> Vec<String> {
        REGISTRY.iter().map(|d| (d.get)(t)).collect()
    }

    #[test]
    fn every_entry_round_trips_its_default() {
        let base = Tunables::default();
        for d in REGISTRY {
            let mut t = Tunables::default();
            t.set(d.name, &d.default_value())
                .unwrap_or_else(|e| panic!("{}: {e}", d.name));
            assert_eq!(values(&t), values(&base), "{}", d.name);
            assert_eq!((d.get)(&t), d.default_value());
        }
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<&str> = REGISTRY.iter().map(|d| d.name).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate tunable names");
    }

    #[test]
    fn a_bad_value_names_the_entrys_accepted_values() {
        for d in REGISTRY {
            let mut t = Tunables::default();
            let before = values(&t);
            assert_eq!(
                t.set(d.name, "no such value"),
                Err(TunableError::BadValue {
                    name: d.name.into(),
                    value: "no such value".into(),
                    accepted: d.values,
                }),
            );
            assert_eq!(
                values(&t),
                before,
                "{}: a rejected value changed it",
                d.name
            );
        }
        assert_eq!(
            Tunables::default().set("nope", "1"),
            Err(TunableError::Unknown("nope".into()))
        );
    }

    #[test]
    fn debug_defaults_follow_the_build() {
        for d in REGISTRY.iter().filter(|d| d.debug_default) {
            assert_eq!(
                d.default_value(),
                cfg!(debug_assertions).to_string(),
                "{}",
                d.name
            );
        }
    }

    #[test]
    fn bounds_and_aliases() {
        let mut t = Tunables::default();
        for (n, ok, bad) in [
            ("read_ahead_kb", "1048576", "1048577"),
            ("max_sectors_kb", "0", "1048577"),
            ("fault_around_bytes", "4096", "8192000"),
            ("fault_around_bytes", "65536", "12288"),
            ("overcommit_memory", "2", "3"),
            ("vma_tree_dup", "on", "yes"),
            ("fork_pte_batch", "true", "yes"),
            ("check_tlb", "yes", "2"),
        ] {
            assert_eq!(t.set(n, ok), Ok(()), "{n}={ok}");
            assert!(t.set(n, bad).is_err(), "{n}={bad}");
        }
        assert_eq!(t.fault_around_bytes, 65536);
        assert_eq!(t.vma_tree_dup, VmaTreeCopy::Dup);
    }
}
