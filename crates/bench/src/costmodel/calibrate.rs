//! `usermm calibrate`: runs the probes ([`crate::probes`]) on the host and on the engine,
//! fits the prices ([`usermm_model::fit`]) and writes a machine profile
//! ([`usermm_model::profile`]); and the cached profile `usermm bench` predicts with.

use crate::costmodel::freshness::{self, SpeedCheck};
use crate::host::HostSide;
use crate::probes::{catalogue, engine_counters, host_ns};
use std::path::{Path, PathBuf};
use std::time::Instant;
use usermm_model::fit::{Fit, Observation};
use usermm_model::pool;
use usermm_model::prices::{Primitives, RECIPES};
use usermm_model::profile::{
    cache_dir, cache_file, features, fnv1a, priors, Fingerprint, Profile, FEATURES_VERSION,
    HOST_FAR, PROFILE_VERSION,
};

/// Fresh agent processes that measure the primitives the priors are priced with.
const PRIOR_AGENTS: usize = 2;

/// Passes over the catalogue; each point's time is the median of its passes. One pass's
/// agent (7 repetitions in a row) can fall entirely into a disturbance: in the first
/// calibration on this shared 2-vCPU guest, spawn with 300 VMAs read 2.5 ms between 0.98 ms
/// at 1200 and 0.11 ms at none.
const PASSES: usize = 3;

/// How the host times the probes: raised when a probe's timing changes under the same
/// family and label (2: the strided tmpfs reads in one guarded call; 3: the probe times pool
/// point by point, see [`timing_key`]), so that profiles timed the old way are made again and
/// their times pool no more.
const PROBE_METHOD: u32 = 3;

/// How the engine counts the probes, beside how the host times them: raised when the
/// engine's counters of a probe change (1: mremap moves whole PTE tables at the PMD level, as
/// Linux does, where it moved every PTE; 2: a gather that frees page tables flushes even when
/// it cleared no entry, one flush more in four mremap points; 3: the walk of mlock and munlock
/// counts the PTEs it reads; 4: the unevictable statistics count a folio's pages, as Linux's
/// do, and the recipes of a folio's mlock and munlock work price `folios_mlocked` and
/// `folios_munlocked`; 5: a batch of freed folios counts `free_batches`; 6: an unmap counts
/// the VMAs it detaches, `vmas_detached`, which exit does not), so that profiles fitted to the
/// old counts are made again (their probe times still pool: [`timing_key`]).
const ENGINE_COUNTS: u32 = 6;

/// How the primitives the priors are priced with are measured: raised when a primitive's
/// measurement changes (1: `copy_page` is a user-space copy of 4 KiB chunks where it was a
/// `pread` of a memfd, five times the copy on this guest), so that profiles with the old
/// priors are fitted again (their probe times still pool: [`timing_key`]).
const PRIMITIVES_METHOD: u32 = 1;

/// The probes, recipes and fit strengths of this build, hashed: a profile made with others is
/// stale.
pub fn model_key() -> String {
    let recipes: Vec<String> = RECIPES
        .iter()
        .map(|r| format!("{}{:?}", r.counter, r.work))
        .collect();
    // The fit's strength grids too: a profile fitted over another grid is fitted again.
    let text = format!(
        "{PROFILE_VERSION}{PROBE_METHOD}{ENGINE_COUNTS}{PRIMITIVES_METHOD}{FEATURES_VERSION}{:?}{recipes:?}{:?}{:?}",
        catalogue(),
        usermm_model::fit::LAMBDAS,
        usermm_model::fit::OP_LAMBDAS,
    );
    format!("{:016x}", fnv1a(text.as_bytes()))
}

/// How the host times the probes, hashed. Two profiles with the same timing key timed each
/// point the same way, and a point is one workload by its family and label ([`pool::key`]:
/// no two probes of the catalogue share one), so a calibration pools the earlier times
/// point by point across a change of the engine, the recipes or the catalogue itself: a
/// probe added starts from its own times and leaves the day's other points pooled (when the
/// key hashed the catalogue, each new family restarted every point's pool).
pub fn timing_key() -> String {
    let text = format!("{PROFILE_VERSION}{PROBE_METHOD}");
    format!("{:016x}", fnv1a(text.as_bytes()))
}

/// Runs every probe and fits a profile of this machine, each point's time pooled with
/// `earlier`'s recent calibrations where it is a profile of this machine and kernel, and of
/// this model or [`timing_key`] (`usermm_model::pool`); `log` hears each step. Needs the
/// host side (root: the probes set the THP knobs, under the oracle's machine-wide lock).
pub fn calibrate(
    host: &HostSide,
    earlier: Option<&Profile>,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<Profile> {
    let start = Instant::now();
    let fingerprint = Fingerprint::read();
    let session = host
        .session()
        .map_err(|e| anyhow::anyhow!("calibration needs the host side: {e}"))?;
    let prims = crate::host::on_last_cpu(|| {
        let all: Vec<Primitives> = (0..PRIOR_AGENTS)
            .filter_map(|_| crate::host::agent::fresh_primitives())
            .collect();
        Primitives::median_of(&all).unwrap_or_else(crate::costmodel::measure)
    });
    log(&format!(
        "primitives for the priors: {:.1} s",
        start.elapsed().as_secs_f64()
    ));
    let probes = catalogue();
    // Families interleaved (a stride through the catalogue), so that a drift of the
    // machine's load spreads over all of them instead of biasing the last.
    let n = probes.len();
    let stride = (1..n)
        .rev()
        .find(|s| gcd(*s, n) == 1 && *s <= n / 3 + 1)
        .unwrap_or(1);
    let llc = crate::host::llc_bytes();
    let counters: Vec<_> = probes
        .iter()
        .map(engine_counters)
        .collect::<anyhow::Result<_>>()?;
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut fars: Vec<Vec<f64>> = vec![Vec::new(); n];
    // Wall seconds per family (agents, setups and repetitions), for the log.
    let mut wall: std::collections::BTreeMap<String, f64> = Default::default();
    for pass in 0..PASSES {
        for k in 0..n {
            let at = (k * stride + pass) % n;
            let t = Instant::now();
            let timed = crate::host::on_last_cpu(|| host_ns(&session, &probes[at]));
            *wall.entry(probes[at].family()).or_default() += t.elapsed().as_secs_f64();
            match timed {
                Ok((ns, far)) => {
                    times[at].push(ns);
                    fars[at].extend(far.map(|f| f as f64));
                }
                Err(e) => log(&format!(
                    "probe {} {}: {e}",
                    probes[at].family(),
                    probes[at].label()
                )),
            }
        }
        log(&format!(
            "pass {}/{PASSES}: {:.1} s",
            pass + 1,
            start.elapsed().as_secs_f64()
        ));
    }
    let mut costliest: Vec<(String, f64)> = wall.into_iter().collect();
    costliest.sort_by(|a, b| b.1.total_cmp(&a.1));
    log(&format!(
        "the costliest families: {}",
        costliest
            .iter()
            .take(8)
            .map(|(f, s)| format!("{f} {s:.1} s"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let median = |v: &[f64]| usermm_model::prices::median(v.iter().copied());
    let observations: Vec<Observation> = (0..n)
        .filter_map(|i| {
            // The host's scatter of this probe's layouts beside the engine's counters.
            let mut c = counters[i].clone();
            if let Some(far) = median(&fars[i]) {
                c.insert(HOST_FAR.into(), far.round() as u64);
            }
            Some(Observation {
                family: probes[i].family(),
                op: probes[i].op().into(),
                label: probes[i].label(),
                counters: features(probes[i].op(), &c, &prims, llc),
                ns: median(&times[i])?,
            })
        })
        .collect();
    let all_fars: Vec<f64> = fars.iter().filter_map(|f| median(f)).collect();
    drop(session);
    log(&format!(
        "{} probe points measured: {:.1} s",
        observations.len(),
        start.elapsed().as_secs_f64()
    ));
    let created = now();
    let (observations, timings) = pooled(observations, created, &fingerprint, earlier, log);
    let fit = Fit::new(&priors(&prims), &observations)?;
    Ok(Profile {
        version: PROFILE_VERSION,
        model_key: model_key(),
        created_unix: created,
        fingerprint,
        primitives: prims,
        fit,
        observations,
        calibrate_seconds: start.elapsed().as_secs_f64(),
        llc_bytes: llc,
        far_permille: median(&all_fars).map(|f| f.round() as u64),
        timings,
        timing_key: timing_key(),
    })
}

/// `observations` with each time pooled with `earlier`'s recent calibrations, where
/// `earlier` is a profile of this machine and kernel, and of this model or this timing key
/// ([`Profile::timings_poolable`]); and the timings the new profile keeps (its own first).
fn pooled(
    mut observations: Vec<Observation>,
    created: u64,
    machine: &Fingerprint,
    earlier: Option<&Profile>,
    log: &mut dyn FnMut(&str),
) -> (Vec<Observation>, Vec<pool::Timings>) {
    let own = pool::Timings {
        created_unix: created,
        ns: observations
            .iter()
            .map(|o| (pool::key(&o.family, &o.label), o.ns))
            .collect(),
    };
    let earlier: &[pool::Timings] = match earlier {
        Some(p) if p.timings_poolable(machine, &model_key(), &timing_key(), created) => &p.timings,
        _ => &[],
    };
    let pooled = pool::pool(&own, earlier);
    if !pooled.used.is_empty() {
        log(&format!(
            "probe times: each point's median with {} earlier calibration(s) of the last {} h, scaled ×{}",
            pooled.used.len(),
            pool::POOL_MAX_AGE_SECS / 3600,
            pooled
                .used
                .iter()
                .map(|(_, s)| format!("{s:.3}"))
                .collect::<Vec<_>>()
                .join(", ×")
        ));
    }
    for o in &mut observations {
        if let Some(&ns) = pooled.ns.get(&pool::key(&o.family, &o.label)) {
            o.ns = ns;
        }
    }
    let kept = std::iter::once(own)
        .chain(pooled.used.iter().map(|&(i, _)| earlier[i].clone()))
        .collect();
    (observations, kept)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Where a run's profile came from.
pub enum Source {
    /// `--profile FILE`.
    File(PathBuf),
    /// The cache, fresh: its probe points timed again at the start of the run (none when
    /// the host side could not run them).
    Cached(PathBuf, Option<SpeedCheck>),
    /// Calibrated now (and cached at the path, if it could be), with the check that found
    /// the cached profile stale, if that is why.
    Calibrated(Option<PathBuf>, Option<SpeedCheck>),
}

impl Source {
    /// Where the profile came from and what it was made on, for a table's note.
    pub fn describe(&self, p: &Profile) -> String {
        let made = format!(
            "of {} ({}), {} probe points",
            p.fingerprint.cpu_model,
            p.fingerprint.kernel_release,
            p.observations.len()
        );
        let here = Fingerprint::read();
        let foreign = if p.fingerprint.same_machine(&here) {
            ""
        } else {
            ", another machine or kernel than this one"
        };
        let check = |c: &Option<SpeedCheck>, what: &str| {
            c.map_or(String::new(), |c| format!("; {what} {}", c.describe()))
        };
        match self {
            Source::File(f) => format!("{} {made}{foreign}", f.display()),
            Source::Cached(f, c) => format!(
                "{} (cached) {made}{}",
                f.display(),
                check(c, "checked before the benchmark,")
            ),
            Source::Calibrated(f, c) => format!(
                "{} {made}{}",
                f.as_ref()
                    .map_or("calibrated now, not cached,".into(), |f| format!(
                        "{} (calibrated now)",
                        f.display()
                    )),
                check(c, "the cached profile was stale:")
            ),
        }
    }
}

/// The profile `usermm bench` predicts with: `explicit` if given (another machine's may
/// predict here), else the cached profile of this machine when fresh — made by this build's
/// probes on this machine and kernel, and its probe points still running at its times
/// ([`crate::costmodel::freshness`], [`recheck`]) —, else a calibration now (cached for the
/// next run). `Err` when none can be had (no host side to calibrate).
pub fn profile_for_bench(
    host: &HostSide,
    explicit: Option<&Path>,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<(Profile, Source)> {
    if let Some(path) = explicit {
        let p = Profile::load(path)?;
        return Ok((p, Source::File(path.to_path_buf())));
    }
    let machine = Fingerprint::read();
    let cached = cache_dir().map(|d| cache_file(&d, &machine));
    let mut stale = None;
    if let Ok(path) = &cached {
        if let Ok(p) = Profile::load(path) {
            if p.fresh_for(&machine, &model_key(), now()) {
                return Ok(recheck(host, p, path.clone(), log));
            }
            // Another build's profile: its probe times may still pool (`pooled`).
            stale = Some(p);
        }
    }
    log("no fresh profile of this machine: calibrating once (usermm calibrate)");
    let p = calibrate(host, stale.as_ref(), log)?;
    let saved = match cached {
        Ok(path) => cache(&p, path, log),
        Err(e) => {
            log(&format!("profile not cached: {e}"));
            None
        }
    };
    Ok((p, Source::Calibrated(saved, None)))
}

/// The cached profile `p` (at `path`) checked against the machine now: `p` while its probe
/// points still run at its times (or no check can run), else a calibration now pooled with
/// it and cached in its place (`p` again if that calibration fails: a stale profile still
/// predicts better than the recipes). `usermm bench` checks before each modelled
/// benchmark, not only at the start: on this AMD guest (6.18.44-fc-v657) a suite run that
/// started with the profile at ×1.00 of its times found it at ×1.31 six minutes later,
/// and the first run's tables, priced with it all through, read 34 of 43 rows within ±20 %
/// where a profile of the later state read 38.
pub fn recheck(
    host: &HostSide,
    p: Profile,
    path: PathBuf,
    log: &mut dyn FnMut(&str),
) -> (Profile, Source) {
    // Without the host side no check can run, and no calibration either.
    let Ok(session) = host.session() else {
        return (p, Source::Cached(path, None));
    };
    let check = freshness::check(&session, &p);
    drop(session);
    let c = match check {
        Some(c) if !c.fresh() => c,
        c => return (p, Source::Cached(path, c)),
    };
    log(&format!(
        "the cached profile no longer describes this machine: {}; calibrating again",
        c.describe()
    ));
    match calibrate(host, Some(&p), log) {
        Ok(new) => {
            let saved = cache(&new, path, log);
            (new, Source::Calibrated(saved, Some(c)))
        }
        Err(e) => {
            log(&format!(
                "calibration failed ({e:#}): predicting with the stale profile"
            ));
            (p, Source::Cached(path, Some(c)))
        }
    }
}

/// Saves `p` as the cached profile at `path`; the path if it could.
fn cache(p: &Profile, path: PathBuf, log: &mut dyn FnMut(&str)) -> Option<PathBuf> {
    match p.save(&path) {
        Ok(()) => Some(path),
        Err(e) => {
            log(&format!("profile not cached: {e}"));
            None
        }
    }
}

/// A profile as text: the machine, the fit's quality, and every price.
pub fn describe(p: &Profile) -> String {
    use std::fmt::Write;
    let fit = &p.fit;
    let mut s = String::new();
    let fp = &p.fingerprint;
    let _ = writeln!(
        s,
        "machine: {} x{} ({}), kernel {}",
        fp.cpu_model,
        fp.cpus,
        if fp.hypervisor { "guest" } else { "bare metal" },
        fp.kernel_release
    );
    let _ = writeln!(
        s,
        "probes: {} points of {} families; calibration {:.0} s{}",
        p.observations.len(),
        families(p),
        p.calibrate_seconds,
        match p.timings.len() {
            0 | 1 => String::new(),
            n => format!(
                "; each point's time the median of {n} calibrations (the oldest {} min before)",
                p.created_unix
                    .saturating_sub(p.timings.iter().map(|t| t.created_unix).min().unwrap_or(0))
                    / 60
            ),
        }
    );
    // The probes' own noise beside the fit's errors: part of every held-out error.
    if let Some((own, earlier)) = p.timings.split_first() {
        let moved: Vec<String> = earlier
            .iter()
            .filter_map(|t| pool::drift(own, t))
            .map(|d| {
                format!(
                    "×{:.2} of its times as a whole, a point a median {:.1} % off that ({:.0} % of points over 20 %)",
                    d.scale, d.point_pct, d.over_20_pct
                )
            })
            .collect();
        if !moved.is_empty() {
            let _ = writeln!(
                s,
                "probe noise: this calibration ran, against each earlier one pooled, {}",
                moved.join("; ")
            );
        }
    }
    let _ = writeln!(
        s,
        "fit: median |error| {:.1} % in sample, {:.1} % leaving one family out, {:.1} % leaving one operation out (λ = {}, λ_o = {}; discrepancy {:.0} %)",
        fit.in_sample_median_pct,
        fit.held_out_median_pct(),
        fit.operation_held_out_median_pct,
        fit.lambda,
        fit.op_lambda,
        fit.discrepancy * 100.0
    );
    let _ = writeln!(
        s,
        "{:<44} {:>10} {:>10} {:>8}  determined by",
        "price (ns per event)", "recipe", "fitted", "±se"
    );
    for (g, price) in fit.prices.iter().enumerate() {
        let prior: f64 = price.counters.iter().map(|c| fit.priors[c]).sum();
        let name = price.counters.join("+");
        let by = if price.families.is_empty() {
            "no probe: the recipe at the common scale".to_string()
        } else {
            price.families.join(", ")
        };
        let _ = writeln!(
            s,
            "{name:<44} {prior:>10.1} {:>10.1} {:>8.1}  {by}",
            prior * price.multiplier,
            prior * price.multiplier_se
        );
        for op in fit.op_prices.iter().filter(|p| p.group == g) {
            let _ = writeln!(
                s,
                "{:<44} {:>10} {:>10.1} {:>8.1}  {}",
                format!("  in {}", op.op),
                "",
                prior * op.multiplier,
                prior * op.multiplier_se,
                op.families.join(", ")
            );
        }
    }
    let mut worst: Vec<_> = fit.held_out.iter().collect();
    worst.sort_by(|a, b| b.error_pct().abs().total_cmp(&a.error_pct().abs()));
    let _ = write!(s, "worst held-out points:");
    for h in worst.iter().take(5) {
        let _ = write!(s, " {} {} {:+.0} %;", h.family, h.label, h.error_pct());
    }
    s.push('\n');
    s
}

fn families(p: &Profile) -> usize {
    p.observations
        .iter()
        .map(|o| o.family.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

/// `p`'s probe points with this build's engine counters and features, their host times kept
/// (`--recount`).
fn recount(p: &Profile) -> anyhow::Result<Vec<Observation>> {
    let probes = catalogue();
    p.observations
        .iter()
        .filter_map(|o| {
            let probe = probes
                .iter()
                .find(|q| q.family() == o.family && q.label() == o.label)?;
            Some(engine_counters(probe).map(|c| Observation {
                op: probe.op().into(),
                counters: p.features(probe.op(), &c),
                ..o.clone()
            }))
        })
        .collect()
}

/// Arguments of `usermm calibrate`.
#[derive(clap::Args, Debug, Clone)]
pub struct CalibrateArgs {
    /// Also write the profile here (it is always cached for `usermm bench`; copy it to
    /// another machine and predict there with `usermm bench --profile FILE`).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Print the profile as JSON instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Show this profile (a file) instead of calibrating.
    #[arg(long, value_name = "FILE", conflicts_with = "out")]
    pub show: Option<PathBuf>,
    /// Price a bench report's modelled tables (JSON) with the profile (`--show`'s, else
    /// this machine's cached one) and print how many rows land within ±20 % of the host and
    /// each seed row's predicted gain; nothing is fitted to the report. Given twice or more,
    /// also how well the reports' host columns predict one another (the ceiling).
    #[arg(long, value_name = "REPORT", num_args = 1..)]
    pub evaluate: Vec<PathBuf>,
    /// Fit this calibration's probe times alone, not each point's median with the cached
    /// profile's recent calibrations (of the last day, this machine and kernel, and this model
    /// or the same probes timed the same way).
    #[arg(long, conflicts_with_all = ["show", "refit", "evaluate"])]
    pub no_pool: bool,
    /// Fit the profile's probe points again with this build's fit (`--show`'s profile, else
    /// the cached one) instead of calibrating: the same host timings, the fit as it is now.
    #[arg(long)]
    pub refit: bool,
    /// With `--refit`: count the profile's probe points again with this build's engine and
    /// features first (the host times kept; each layout's physical scatter taken as the
    /// profile's typical one, its own being no longer known; points no longer in the catalogue
    /// left out), so that a change of the engine's counters or the features can be tried on
    /// stored calibrations.
    #[arg(long, requires = "refit")]
    pub recount: bool,
    /// Time the check `usermm bench` makes before each modelled benchmark against the
    /// profile (`--show`'s, else the cached one) and print whether it still describes this
    /// machine (exit status 1 if not); nothing is calibrated or cached (root: the probes set
    /// the THP knobs).
    #[arg(long, conflicts_with_all = ["out", "json", "evaluate", "no_pool", "refit"])]
    pub check: bool,
}

/// `usermm calibrate`: runs the probes, fits, caches the profile (and writes `--out`).
pub fn main(args: &CalibrateArgs) -> anyhow::Result<u8> {
    let cached = || -> anyhow::Result<Profile> {
        Ok(Profile::load(&cache_file(
            &cache_dir()?,
            &Fingerprint::read(),
        ))?)
    };
    let loaded = |path: &Option<PathBuf>| -> anyhow::Result<Profile> {
        let mut p = match path {
            Some(path) => Profile::load(path)?,
            None => cached()?,
        };
        if args.recount {
            p.observations = recount(&p)?;
            p.model_key = model_key();
        }
        if args.refit {
            p.fit = Fit::new(&priors(&p.primitives), &p.observations)?;
        }
        Ok(p)
    };
    if !args.evaluate.is_empty() {
        // Bounded and checked as `bench compare` reads reports (files from outside), all
        // before the profile is priced on any.
        let reports = args
            .evaluate
            .iter()
            .map(|r| Ok((r.display().to_string(), crate::compare::load(r)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let profile = loaded(&args.show)?;
        for (name, report) in &reports {
            println!("{name}:");
            print!("{}", evaluate(&profile, report));
        }
        // With two reports or more, the ceiling the host's own repeatability sets.
        if let Some(s) = crate::costmodel::repeat::repeatability(&reports, &JUDGED) {
            print!("{s}");
        }
        return Ok(0);
    }
    if args.check {
        let profile = loaded(&args.show)?;
        let session = HostSide::probe(true)
            .session()
            .map_err(|e| anyhow::anyhow!("the check needs the host side: {e}"))?;
        let Some(c) = freshness::check(&session, &profile) else {
            anyhow::bail!("no check point could be timed and compared with the profile");
        };
        let verdict = if c.fresh() { "fresh" } else { "stale" };
        println!("{verdict}: {}", c.describe());
        return Ok(if c.fresh() { 0 } else { 1 });
    }
    let profile = match &args.show {
        Some(_) => loaded(&args.show)?,
        None if args.refit => {
            let p = loaded(&None)?;
            if let Some(out) = &args.out {
                p.save(out)?;
                eprintln!("calibrate: wrote {}", out.display());
            }
            p
        }
        None => {
            let host = HostSide::probe(true);
            // The cached profile's recent calibrations are pooled unless told not to.
            let earlier = if args.no_pool { None } else { cached().ok() };
            let p = calibrate(&host, earlier.as_ref(), &mut |m| {
                eprintln!("calibrate: {m}")
            })?;
            let machine = Fingerprint::read();
            match cache_dir().and_then(|d| {
                let f = cache_file(&d, &machine);
                p.save(&f).map(|()| f)
            }) {
                Ok(f) => eprintln!("calibrate: cached {}", f.display()),
                Err(e) => eprintln!("calibrate: not cached: {e}"),
            }
            if let Some(out) = &args.out {
                p.save(out)?;
                eprintln!("calibrate: wrote {}", out.display());
            }
            p
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&profile)?);
    } else {
        print!("{}", describe(&profile));
    }
    Ok(0)
}

/// The tables the model is judged on (the calibration issue's must-show list).
pub const JUDGED: [&str; 6] = [
    "fault",
    "fork",
    "munmap",
    "spawn",
    "sharing",
    "munlock-one-node",
];

/// A bench report's modelled tables priced again with `profile` (their rows are read, never
/// fitted: the fit is the profile's, made from the probes alone): per table, the rows within
/// ±20 % of the host median and those outside; the total over [`JUDGED`]; and each seed
/// row's predicted gain with its interval beside the published one.
pub fn evaluate(profile: &Profile, report: &crate::model::Report) -> String {
    use crate::model::VariantKind;
    use std::fmt::Write;
    let mut s = String::new();
    let (mut within, mut rows) = (0, 0);
    let mut host = crate::costmodel::HostSteadiness::default();
    for t in &report.tables {
        let Some(host_matches) = t.host_matches.clone() else {
            continue;
        };
        let mut t = t.clone();
        // The report's own model columns out, the profile's in.
        let keep: Vec<bool> = t
            .variants
            .iter()
            .map(|v| v.kind != VariantKind::Model)
            .collect();
        t.variants.retain(|v| v.kind != VariantKind::Model);
        for r in &mut t.rows {
            let mut k = keep.iter();
            r.columns.retain(|_| *k.next().unwrap_or(&true));
        }
        t.notes.clear();
        crate::costmodel::add_profile_columns(&mut t, profile, &host_matches, "evaluated");
        let Some(a) = crate::costmodel::accuracy(&t) else {
            continue;
        };
        let outside = crate::costmodel::outside_rows(&t);
        let model = t.variant_index(&crate::costmodel::model_name(&host_matches));
        let _ = writeln!(
            s,
            "{}: {} of {} rows within ±20 % (median error {:+.0} %){}",
            t.id,
            a.within_20pct,
            a.rows,
            a.median_error_pct,
            if outside.is_empty() {
                String::new()
            } else {
                let rows: Vec<String> = outside
                    .iter()
                    .map(|&(r, e)| format!("{} {e:+.0} %", t.rows[r].label))
                    .collect();
                format!("; outside: {}", rows.join(", "))
            }
        );
        // What the model's time of each outside row is made of, largest part first: the
        // counters to look at when a row misses.
        for &(r, _) in &outside {
            let Some(m) = model else { break };
            let _ = writeln!(
                s,
                "  {}: {}",
                t.rows[r].label,
                largest_parts(&t.rows[r].columns[m])
            );
        }
        if JUDGED.contains(&t.id.as_str()) {
            within += a.within_20pct;
            rows += a.rows;
            if let Some(h) = crate::costmodel::host_steadiness(&t) {
                host.add(&h);
            }
        }
        for (ri, r) in t.rows.iter().enumerate() {
            for p in &r.published {
                let Some(i) = t.variant_index(&crate::costmodel::model_name(&p.variant)) else {
                    continue;
                };
                let gain = crate::stats::cell_gain(&t, ri, i, crate::model::Stat::Median);
                let ci = r.columns[i].gain_ci95_pct;
                let _ = writeln!(
                    s,
                    "  seed {} {} {}: published {:+.1} %, predicted {} {}",
                    t.id,
                    r.label,
                    p.variant,
                    p.gain_pct,
                    gain.map_or("-".into(), |g| format!("{g:+.1} %")),
                    ci.map_or(String::new(), |[lo, hi]| format!("[{lo:+.1}, {hi:+.1}]"))
                );
            }
        }
    }
    let _ = writeln!(
        s,
        "judged tables ({}): {within} of {rows} rows within ±20 %; {}",
        JUDGED.join(", "),
        host.describe()
    );
    s
}

/// A model cell's five largest parts (its `model_<counter>_ns` counters), as
/// `counter 1200 µs (34 %)`.
fn largest_parts(cell: &crate::model::Column) -> String {
    let mut parts: Vec<(&str, u64)> = cell
        .counters
        .iter()
        .filter_map(|(k, &v)| {
            let name = k.strip_prefix("model_")?.strip_suffix("_ns")?;
            (!name.starts_with("ci95")).then_some((name, v))
        })
        .collect();
    let total: u64 = parts.iter().map(|p| p.1).sum();
    parts.sort_by_key(|p| std::cmp::Reverse(p.1));
    parts
        .iter()
        .take(5)
        .map(|(k, v)| {
            format!(
                "{k} {:.0} µs ({:.0} %)",
                *v as f64 / 1e3,
                *v as f64 / total.max(1) as f64 * 100.0
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An earlier calibration of this machine: the example's points at half their times
    /// (the first at a quarter), made a minute before `now`, under `model` and `timing`.
    fn earlier(now: u64, model: &str, timing: &str) -> Profile {
        let p = Profile::example().expect("example");
        let ns = p
            .observations
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let k = if i == 0 { 0.25 } else { 0.5 };
                (pool::key(&o.family, &o.label), o.ns * k)
            })
            .collect();
        Profile {
            model_key: model.into(),
            timing_key: timing.into(),
            fingerprint: Fingerprint::read(),
            created_unix: now - 60,
            timings: vec![pool::Timings {
                created_unix: now - 60,
                ns,
            }],
            ..p
        }
    }

    #[test]
    fn another_models_probe_times_pool_when_the_host_timed_the_same_probes_the_same_way() {
        let now = 10_000_000;
        let machine = Fingerprint::read();
        let own = Profile::example().expect("example").observations;
        let first = (own[0].ns, own[1].ns);
        let pool_with = |p: &Profile| pooled(own.clone(), now, &machine, Some(p), &mut |_| {});
        // Another model (the engine's counts or a recipe changed), the same timing key: the
        // earlier times, scaled ×2 to this level, pool. The first point read half its time
        // at this level, so its median with this calibration's is three quarters of it.
        let (obs, kept) = pool_with(&earlier(now, "another model", &timing_key()));
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[0].created_unix, now);
        assert!(
            (obs[0].ns - 0.75 * first.0).abs() < 1e-6,
            "{} {}",
            obs[0].ns,
            first.0
        );
        assert!((obs[1].ns - first.1).abs() < 1e-6);
        // Other probes or another timing method: nothing pooled; nor a profile without a
        // timing key from another model.
        for p in [
            earlier(now, "another model", "other probes"),
            earlier(now, "another model", ""),
        ] {
            let (obs, kept) = pool_with(&p);
            assert_eq!(kept.len(), 1);
            assert_eq!((obs[0].ns, obs[1].ns), first);
        }
    }
}
