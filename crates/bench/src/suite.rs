//! The suite: running a selection of its benchmarks ([`Bench`], listed with their
//! [`Options`] in [`crate::options`]) into one [`Report`], and the options' defaults.

use crate::costmodel::calibrate::Source;
use crate::costmodel::Primitives;
use crate::ctx::Ctx;
use crate::host::{kernel_release, on_last_cpu, HostSide};
use crate::model::{HostInfo, Report, RunInfo, Table, SCHEMA_VERSION};
use crate::progress::Progress;
use crate::{anon_cow, fault, fork, linear_map, munlock, readahead, reclaim, sharing, spawn};
use std::cell::RefCell;
use std::time::Instant;

pub use crate::options::{Bench, Options};

impl Bench {
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

// The defaults are the benchmarks' own sizes: here, above them, not beside `Options`.
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

/// Fresh agent processes that measure the primitives before a modelled benchmark.
const PRIMITIVES_BEFORE: usize = 3;

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
    let mut profile = which
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
    let mut modelled = 0;
    for &b in which {
        // The cached profile checked again before each modelled benchmark but the first
        // (checked above), and calibrated again where the machine has moved
        // (`calibrate::recheck`); another machine's profile (`--profile`) is not.
        if b.host_matches().is_some() {
            modelled += 1;
            if modelled > 1 {
                profile = match profile.take() {
                    Some((p, Source::Cached(path, _) | Source::Calibrated(Some(path), _))) => {
                        Some(progress.suspend(|| {
                            crate::calibrate::recheck(host, p, path, &mut |m| {
                                eprintln!("calibrate: {m}")
                            })
                        }))
                    }
                    other => other,
                };
            }
        }
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
