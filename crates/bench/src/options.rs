//! The suite's benchmarks and options: which benchmarks exist ([`Bench`]) and what to run at
//! which scale ([`Options`]; its defaults, the benchmarks' own sizes, are in [`crate::suite`],
//! which runs them).

/// One benchmark of the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bench {
    /// Fault-in cost.
    Fault,
    /// Seed 000: fork of PTE-mapped folios.
    Fork,
    /// Seed 000: munmap of PTE-mapped folios.
    Munmap,
    /// Seed 001: fork+exit rate with many VMAs.
    Spawn,
    /// Seed 003: the eight micro benchmarks.
    Sharing,
    /// Seed 003: vm-scalability's concurrent COW of shared THPs (case-anon-cow-seq/-rand).
    AnonCow,
    /// Seed 004: timedmunlock, three setups.
    Munlock,
    /// Seed 002: arm64 linear map creation.
    LinearMap,
    /// The page cache: readahead of a disk file, sequential and random.
    Readahead,
    /// Reclaim and swap: anonymous working sets larger than memory, MADV_PAGEOUT, page
    /// cache, engine vs a memory cgroup of the host.
    Reclaim,
}

impl Bench {
    /// The whole suite in run order.
    pub const ALL: [Bench; 10] = [
        Bench::Fault,
        Bench::Fork,
        Bench::Munmap,
        Bench::Spawn,
        Bench::Sharing,
        Bench::AnonCow,
        Bench::Munlock,
        Bench::LinearMap,
        Bench::Readahead,
        Bench::Reclaim,
    ];

    /// The subcommand name.
    pub fn name(self) -> &'static str {
        match self {
            Bench::Fault => "fault",
            Bench::Fork => "fork",
            Bench::Munmap => "munmap",
            Bench::Spawn => "spawn",
            Bench::Sharing => "sharing",
            Bench::AnonCow => "anon-cow",
            Bench::Munlock => "munlock",
            Bench::LinearMap => "linear-map",
            Bench::Readahead => "readahead",
            Bench::Reclaim => "reclaim",
        }
    }

    /// Parses a subcommand name; `all` is every benchmark.
    pub fn parse(s: &str) -> Option<Vec<Bench>> {
        if s == "all" {
            return Some(Bench::ALL.to_vec());
        }
        Bench::ALL.iter().find(|b| b.name() == s).map(|b| vec![*b])
    }

    /// The engine variant whose algorithm the host kernel runs, for the tables the cost
    /// model predicts (`None` for the others: linear-map has no host to compare with,
    /// anon-cow's concurrent copies contend in ways no counter prices, readahead's time is
    /// the device's, reclaim has no calibrated recipe).
    pub fn host_matches(self) -> Option<&'static str> {
        match self {
            Bench::Fault => Some("engine"),
            Bench::Fork | Bench::Munmap => Some("batched"),
            Bench::Spawn => Some("dup"),
            Bench::Sharing => Some("owner"),
            Bench::Munlock => Some("modern"),
            Bench::AnonCow | Bench::LinearMap | Bench::Readahead | Bench::Reclaim => None,
        }
    }
}

/// What to run and at which scale.
#[derive(Clone, Debug)]
pub struct Options {
    /// Size of the fault, fork and munmap layouts, bytes.
    pub scale: u64,
    /// Size of the sharing layouts, bytes (8 rows of 6 trackers and the host: half the
    /// others' by default, so that the suite stays within 5 minutes).
    pub sharing_scale: u64,
    /// Size of the munlock layout, bytes.
    pub munlock_scale: u64,
    /// The area every anon-cow instance copies (the parent's shared THPs), bytes.
    pub anon_cow_scale: u64,
    /// Repetitions per measurement: every row runs this many at least (see
    /// [`Repetitions`](crate::ctx::Repetitions)).
    pub reps: usize,
    /// Repetitions a row may run at most while its gain intervals are wide.
    pub max_reps: usize,
    /// A row's gain intervals are tight when none is wider than this, percentage points.
    pub tight_pp: f64,
    /// Memory of the reclaim benchmark's machine and host cgroup, bytes (its swap is
    /// [`reclaim::SWAP_MULT`](crate::reclaim::SWAP_MULT) times as much).
    pub reclaim_memory: u64,
    /// Seconds per point of the spawn benchmark.
    pub spawn_seconds: f64,
    /// Extra VMA counts of the spawn benchmark.
    pub spawn_extra: Vec<u64>,
    /// Folio sizes of the fork and munmap tables.
    pub folios: Vec<u64>,
    /// RAM sizes of the linear-map benchmark, GiB.
    pub linear_map_gib: Vec<u64>,
    /// Modelled latency of one TLBI, ns.
    pub tlbi_ns: u64,
    /// The machine profile the `model:` columns predict with (`--profile`); `None`: this
    /// machine's cached profile, calibrated once if there is none.
    pub profile: Option<std::path::PathBuf>,
    /// Price the `model:` columns by the recipes with primitives measured around each
    /// benchmark, as before calibration existed: no profile read or made (the tests' tiny
    /// runs, which must not depend on what the machine's cache holds).
    pub recipe_model: bool,
    /// `--variants NAME=V1,V2`: the engine columns of the (one) benchmark run, one per
    /// combination of values, instead of its own (see [`crate::columns`]); empty: its own.
    pub variants: Vec<crate::sweep::Sweep>,
}
