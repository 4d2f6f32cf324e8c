//! The suite: which benchmarks exist, their options, and running a selection of them into
//! one [`Report`].

use crate::columns::EngineColumn;
use crate::costmodel::Primitives;
use crate::host::{kernel_release, HostSide};
use crate::model::{
    Better, Column, HostInfo, Report, RunInfo, Table, Variant, VariantKind, SCHEMA_VERSION,
};
use crate::progress::{Progress, Task};
use crate::{anon_cow, fault, fork, linear_map, munlock, readahead, reclaim, sharing, spawn};
use std::cell::RefCell;
use std::time::{Duration, Instant};

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

    /// Measurements it makes (for the progress bar).
    fn steps(self, o: &Options) -> u64 {
        // The engine columns of `--variants` (0: the tables' own).
        let engine = crate::columns::count(&o.variants);
        match self {
            Bench::Fault => fault::steps(o.reps),
            Bench::Fork => fork::steps(o.reps, o.folios.len(), fork::Op::Fork, engine),
            Bench::Munmap => fork::steps(o.reps, o.folios.len(), fork::Op::Munmap, engine),
            Bench::Spawn => spawn::steps(o.reps, o.spawn_extra.len(), engine),
            Bench::Sharing => sharing::steps(o.reps, engine),
            Bench::AnonCow => anon_cow::steps(o.reps, engine),
            Bench::Munlock => munlock::SETUPS.len() as u64 * munlock::steps(o.reps, engine),
            Bench::LinearMap => linear_map::steps(o.reps, o.linear_map_gib.len()),
            Bench::Readahead => readahead::steps(o.reps),
            Bench::Reclaim => reclaim::steps(o.reps),
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
    /// [`Repetitions`]).
    pub reps: usize,
    /// Repetitions a row may run at most while its gain intervals are wide.
    pub max_reps: usize,
    /// A row's gain intervals are tight when none is wider than this, percentage points.
    pub tight_pp: f64,
    /// Memory of the reclaim benchmark's machine and host cgroup, bytes (its swap is
    /// [`reclaim::SWAP_MULT`] times as much).
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
    pub variants: Vec<crate::scenario_bench::Sweep>,
}

impl Default for Options {
    /// The small default scale of `usermm bench`: a few minutes on 2 cores.
    fn default() -> Options {
        Options {
            scale: 256 << 20,
            sharing_scale: 128 << 20,
            munlock_scale: 256 << 20,
            anon_cow_scale: 32 << 20,
            reclaim_memory: reclaim::DEFAULT_MEMORY,
            reps: 7,
            // Rows do not repeat past `reps` unless asked (`--max-reps`): the suite stays
            // within 5 minutes on 2 cores.
            max_reps: 7,
            tight_pp: 10.0,
            spawn_seconds: 0.1,
            spawn_extra: spawn::EXTRA.to_vec(),
            folios: fork::FOLIOS.to_vec(),
            linear_map_gib: vec![16, 64],
            tlbi_ns: linear_map::DEFAULT_TLBI_NS,
            profile: None,
            recipe_model: false,
            variants: Vec::new(),
        }
    }
}

/// What a benchmark sees while it runs.
pub struct Ctx<'a> {
    /// The options.
    pub opts: &'a Options,
    /// Whether and how host columns are measured.
    pub host: &'a HostSide,
    /// Its progress bar.
    pub task: &'a Task,
    /// The cost model's primitives measured so far for this benchmark (modelled benchmarks
    /// only): see [`Ctx::row_done`].
    pub primitives: Option<&'a RefCell<Vec<Primitives>>>,
}

/// Fresh agent processes that measure the primitives before a modelled benchmark.
const PRIMITIVES_BEFORE: usize = 3;

impl Ctx<'_> {
    /// The engine columns of a table whose own are `defaults`: those, or `--variants`'.
    pub fn engine_columns(&self, defaults: Vec<EngineColumn>) -> Vec<EngineColumn> {
        crate::columns::engine_columns(&self.opts.variants, defaults)
    }

    /// Called by a modelled benchmark after each row: one more fresh process measures the
    /// primitives, so that the table is priced with the median over processes spread
    /// through its run (three before it, one after each row), not only with the state of
    /// the machine before it. One process's own memory moves its primitives too:
    /// back-to-back fresh processes read `kcall` from 5.5 to 9.4 ns, and one table's three
    /// processes read it at 9.5 ns where the next table's read 4.5.
    pub fn row_done(&self) {
        if let Some(all) = self.primitives {
            if let Some(p) = crate::host::agent::fresh_primitives() {
                all.borrow_mut().push(p);
            }
        }
    }

    /// The repetitions of a row of a table whose columns are `variants`, its gains taken
    /// against the one named `baseline`, `better` their direction.
    pub fn repetitions(
        &self,
        variants: &[Variant],
        baseline: &str,
        better: Better,
    ) -> Repetitions<'_> {
        let base = variants.iter().position(|v| v.name == baseline);
        let gains = (0..variants.len())
            .filter(|&i| Some(i) != base)
            .filter(|&i| matches!(variants[i].kind, VariantKind::Engine | VariantKind::Control))
            .collect();
        Repetitions {
            opts: self.opts,
            task: self.task,
            steps: variants.len() as u64,
            base,
            gains,
            better,
            started: Instant::now(),
            first: None,
            done: 0,
            until: self.opts.reps,
        }
    }
}

/// The repetitions of one row of a table with gains: [`Options::reps`] of them always; then,
/// while some engine or control column's 95 % gain interval is wider than
/// [`Options::tight_pp`], more, up to [`Options::max_reps`] in all and while the extra
/// repetitions take no longer than the first ones did (the time budget: a row at most about
/// doubles). More repetitions go straight to the next count at which the sign-test interval
/// can narrow: 7 repetitions give their lowest and highest gain, so one outlier widens it; 8
/// cannot do better, 9 leave the outermost out on each side, 12 two (so 9, then 12).
#[must_use = "a row runs its repetitions by calling next until it returns None"]
pub struct Repetitions<'a> {
    opts: &'a Options,
    task: &'a Task,
    steps: u64,
    /// The baseline's column, if the table has it.
    base: Option<usize>,
    /// The engine and control columns whose gains get intervals.
    gains: Vec<usize>,
    better: Better,
    started: Instant,
    first: Option<Duration>,
    done: usize,
    until: usize,
}

impl Repetitions<'_> {
    /// The next repetition's number (for the rotation), or `None` when the row is done.
    /// `cols` are the row's cells so far, one per variant.
    pub fn next(&mut self, cols: &[Column]) -> Option<usize> {
        let n = self.done;
        if n >= self.until {
            let first = *self.first.get_or_insert_with(|| self.started.elapsed());
            let widest = self
                .base
                .and_then(|b| widest_gain_interval(cols, b, &self.gains, self.better));
            let more = more_repetitions(self.opts, n, widest, self.started.elapsed(), first)?;
            self.task.extend(self.steps * (more - n) as u64);
            self.until = more;
        }
        self.done += 1;
        Some(n)
    }
}

/// How many repetitions in all a row that has run `done` (at least [`Options::reps`]), the
/// first [`Options::reps`] of them in `first`, all of them in `elapsed`, with its widest gain
/// interval `widest`, goes on to: `None` when the interval is tight (or there is none), or the
/// next count at which the interval can narrow is beyond [`Options::max_reps`] or would take
/// the row past twice `first` at the first repetitions' pace.
fn more_repetitions(
    opts: &Options,
    done: usize,
    widest: Option<f64>,
    elapsed: Duration,
    first: Duration,
) -> Option<usize> {
    if !widest.is_some_and(|w| w > opts.tight_pp) {
        return None;
    }
    let rank = crate::stats::sign_test_rank(done);
    let target = (done + 1..=opts.max_reps).find(|&n| crate::stats::sign_test_rank(n) > rank)?;
    let pace = first.div_f64(opts.reps.max(1) as f64);
    (elapsed + pace.mul_f64((target - done) as f64) <= first * 2).then_some(target)
}

/// The widest 95 % gain interval, percentage points, of the columns `gains` against
/// `cols[base]`; `None` when none has one yet.
fn widest_gain_interval(
    cols: &[Column],
    base: usize,
    gains: &[usize],
    better: Better,
) -> Option<f64> {
    let b = &cols.get(base)?.samples;
    gains
        .iter()
        .filter_map(|&i| cols.get(i))
        .filter_map(|c| crate::stats::gain_ci95(&c.samples, b, better))
        .map(|[lo, hi]| hi - lo)
        .reduce(f64::max)
}

/// Runs one benchmark.
fn run_one(b: Bench, ctx: &Ctx<'_>) -> anyhow::Result<Vec<Table>> {
    Ok(match b {
        Bench::Fault => vec![fault::table(ctx)?],
        Bench::Fork => vec![fork::table(ctx, fork::Op::Fork)?],
        Bench::Munmap => vec![fork::table(ctx, fork::Op::Munmap)?],
        Bench::Spawn => vec![spawn::table(ctx)?],
        Bench::Sharing => vec![sharing::table(ctx)?],
        Bench::AnonCow => vec![anon_cow::table(ctx)?],
        Bench::Munlock => munlock::SETUPS
            .iter()
            .map(|&s| munlock::table(ctx, s))
            .collect::<anyhow::Result<_>>()?,
        Bench::LinearMap => linear_map::tables(ctx)?,
        Bench::Readahead => vec![readahead::table(ctx)?],
        Bench::Reclaim => vec![reclaim::table(ctx)?],
    })
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

/// Runs `which`, calling `each` with every finished table (to print it at once).
pub fn run(
    which: &[Bench],
    opts: &Options,
    host: &HostSide,
    progress: &Progress,
    mut each: impl FnMut(&Table),
) -> anyhow::Result<Report> {
    let start = Instant::now();
    let meta = crate::model::RunMeta::collect();
    let mut tables = Vec::new();
    let mut first_prims = None;
    let mut bench_seconds = Vec::new();
    // Read once, and only for a run with a modelled table: the running kernel's functions
    // against the recipes' call counts.
    let symbol_drift = which
        .iter()
        .any(|b| b.host_matches().is_some())
        .then(usermm_model::recipe_symbols::Drift::read)
        .flatten()
        .and_then(|d| d.note());
    // The calibrated profile, where one can be had (cached, or calibrated once now); else
    // the recipes priced with primitives measured around each modelled benchmark.
    let profile = which
        .iter()
        .any(|b| b.host_matches().is_some() && !opts.recipe_model)
        .then(|| {
            progress.suspend(|| {
                crate::calibrate::profile_for_bench(host, opts.profile.as_deref(), &mut |m| {
                    eprintln!("calibrate: {m}")
                })
            })
        })
        .and_then(|r| {
            r.map_err(|e| eprintln!("model: no calibrated profile ({e:#}): the recipes priced with measured primitives instead"))
                .ok()
        });
    if let Some((p, src)) = &profile {
        progress.suspend(|| println!("model: profile {}", src.describe(p)));
    }
    for &b in which {
        // The primitives are measured again for each modelled benchmark, each time by a
        // fresh process (measured in the bench process after the sharing and anon-cow
        // benchmarks, the host's mprotect per entry, and so `kcall`, read 2.3 times what a
        // fresh process read a minute later, while the host rows had not moved): several
        // before it, one after each of its rows (`Ctx::row_done`), so that its model and its
        // host column see the machine in the same states.
        let samples = RefCell::new(Vec::new());
        if b.host_matches().is_some() && profile.is_none() {
            on_last_cpu(|| {
                samples.borrow_mut().extend(
                    (0..PRIMITIVES_BEFORE).filter_map(|_| crate::host::agent::fresh_primitives()),
                )
            });
        }
        let bench_start = Instant::now();
        let task = progress.task(b.name(), b.steps(opts));
        let ctx = Ctx {
            opts,
            host,
            task: &task,
            primitives: b
                .host_matches()
                .filter(|_| profile.is_none())
                .map(|_| &samples),
        };
        // One CPU for the whole measurement of a single-threaded benchmark: the engine thread
        // and the host helpers it forks (which inherit it) never migrate mid-sample. anon-cow
        // runs one instance per CPU and places its threads itself.
        let mut ts = if b == Bench::AnonCow {
            run_one(b, &ctx)
        } else {
            on_last_cpu(|| run_one(b, &ctx))
        }?;
        if !opts.variants.is_empty() {
            ts.iter_mut()
                .for_each(|t| crate::columns::mark_variants(t, &opts.variants));
        }
        ts.iter_mut().for_each(crate::stats::add_intervals);
        if let (Some(v), Some((p, src))) = (b.host_matches(), &profile) {
            for t in &mut ts {
                crate::costmodel::add_profile_columns(t, p, v, &src.describe(p));
                t.notes.extend(symbol_drift.clone());
            }
            first_prims = first_prims.or(Some(p.primitives));
        } else if let Some(v) = b.host_matches() {
            let samples = samples.into_inner();
            let p = Primitives::median_of(&samples).unwrap_or_else(crate::costmodel::measure);
            for t in &mut ts {
                crate::costmodel::add_model_columns(t, &p, v, &samples);
                t.notes.extend(symbol_drift.clone());
            }
            first_prims = first_prims.or(Some(p));
        }
        progress.done(task);
        bench_seconds.push((b.name().to_string(), bench_start.elapsed().as_secs_f64()));
        for t in &ts {
            progress.suspend(|| each(t));
        }
        tables.extend(ts);
    }
    progress.finish();
    Ok(Report {
        schema_version: SCHEMA_VERSION,
        generator: format!("usermm-bench {}", env!("CARGO_PKG_VERSION")),
        meta,
        run: RunInfo {
            which: which.iter().map(|b| b.name()).collect::<Vec<_>>().join(","),
            scale_bytes: opts.scale,
            reps: opts.reps,
            max_reps: opts.max_reps,
            tight_pp: opts.tight_pp,
            spawn_seconds: opts.spawn_seconds,
            linear_map_gib: opts.linear_map_gib.clone(),
            reclaim_memory_bytes: opts.reclaim_memory,
        },
        host: HostInfo {
            kernel: kernel_release(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            numa_nodes: host.nodes(),
            host_columns: host.describe(),
        },
        wall_seconds: start.elapsed().as_secs_f64(),
        bench_seconds,
        tables,
        cost_model: first_prims,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_row_repeats_to_where_a_wide_interval_can_narrow_within_the_limit_and_the_budget() {
        let more = |opts: &Options, done, widest, elapsed| {
            let (elapsed, first) = (Duration::from_secs(elapsed), Duration::from_secs(7));
            more_repetitions(opts, done, widest, elapsed, first)
        };
        let opts = Options {
            max_reps: 12,
            ..Options::default()
        };
        // 7 repetitions in 7 s: the interval narrows at 9 and at 12, not at 8, 10 or 11.
        assert_eq!(more(&opts, 7, Some(10.5), 7), Some(9), "wide: on to 9");
        assert_eq!(
            more(&opts, 9, Some(10.5), 9),
            Some(12),
            "still wide: on to 12"
        );
        assert_eq!(more(&opts, 7, Some(9.5), 7), None, "tight: done");
        assert_eq!(more(&opts, 7, None, 7), None, "no interval: done");
        assert_eq!(more(&opts, 12, Some(40.0), 12), None, "at max_reps");
        assert_eq!(
            more(&opts, 9, Some(40.0), 12),
            None,
            "slow repetitions spent the budget"
        );
        let more_allowed = Options {
            max_reps: 15,
            ..Options::default()
        };
        assert_eq!(
            more(&more_allowed, 12, Some(40.0), 12),
            None,
            "15 would take 15 s of a 14 s budget"
        );
        assert_eq!(more(&more_allowed, 9, Some(40.0), 9), Some(12));
    }

    #[test]
    fn a_rows_gains_are_its_engine_and_control_columns_against_the_baseline() {
        let opts = Options::default();
        let host = HostSide::disabled("test");
        let progress = Progress::new(1, false);
        let task = progress.task("t", 0);
        let ctx = Ctx {
            opts: &opts,
            host: &host,
            task: &task,
            primitives: None,
        };
        let variants = [
            Variant::engine("a", ""),
            Variant::engine("b", ""),
            Variant::control("b"),
            Variant::host(""),
        ];
        let reps = ctx.repetitions(&variants, "b", Better::Lower);
        assert_eq!((reps.base, reps.gains.as_slice()), (Some(1), &[0, 2][..]));
        let reps = ctx.repetitions(&variants, "none", Better::Lower);
        assert_eq!(
            reps.base, None,
            "no baseline: no intervals, the least repetitions"
        );
    }

    #[test]
    fn the_widest_interval_is_of_the_gain_columns_only() {
        let col = |samples: &[f64]| Column::new("c", samples.to_vec(), BTreeMap::new());
        let base = col(&[1.0; 7]);
        // Gains of 0 % and 10 %... 30 %, and a host column far off that must not count.
        let engine = col(&[1.0, 0.9, 0.8, 0.7, 0.9, 0.8, 1.0]);
        let control = col(&[1.0; 7]);
        let host = col(&[5.0, 0.1, 5.0, 0.1, 5.0, 0.1, 5.0]);
        let cols = [base, engine, control, host];
        let w = widest_gain_interval(&cols, 0, &[1, 2], Better::Lower).expect("intervals");
        assert!((w - 30.0).abs() < 1e-9, "{w}");
        assert_eq!(widest_gain_interval(&cols, 0, &[], Better::Lower), None);
    }
}
