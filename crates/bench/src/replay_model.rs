//! The `model:` cells of `usermm replay` and `usermm bench replay`: a replayed program's
//! engine counters, filed per operation by the replay (`trace::ReplayReport::ops`, see
//! `crates/trace/src/replay/ops.rs`), priced with a calibrated machine profile
//! (`usermm_model::profile::Profile`) as the kernel's predicted mm time of the workload,
//! with its 95 % interval, and the predicted gain of one replay over another.
//!
//! Every distinct call the replay filed is priced as its own operation (its features, e.g.
//! a fork's fixed work and the zeroing past the last-level cache, are those of one call)
//! times its multiplicity; the calls' design vectors are summed, so the prediction and the
//! gain keep the prices' covariance across the operations. This is
//! `Profile::predict_all` / `Profile::gain_all` with each call once (the fit is linear in
//! the features), without building one feature map per call: a replay files hundreds of
//! thousands of faults but only hundreds of distinct ones. The engine's creation of the
//! recorded files (`file`) is no work of the program and is not priced.
//!
//! The profile is `--profile FILE`, else this machine's cached one (`usermm calibrate`
//! writes it, as root); nothing here calibrates. No profile: the cells say so and the
//! counters are unchanged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use trace::ReplayReport;
use usermm_model::fit::Prediction;
use usermm_model::profile::{cache_dir, cache_file, Fingerprint, Profile};

/// The profile a replay is priced with, or why there is none.
pub enum ModelProfile {
    /// A profile, and where it came from (for the output's note).
    Loaded(Box<Profile>, String),
    /// No profile: why, and how to get one.
    Missing(String),
}

impl ModelProfile {
    /// The profile, if any.
    pub fn profile(&self) -> Option<&Profile> {
        match self {
            ModelProfile::Loaded(p, _) => Some(p),
            ModelProfile::Missing(_) => None,
        }
    }

    /// One line: which profile, or that there is none.
    pub fn note(&self) -> String {
        match self {
            ModelProfile::Loaded(_, s) => format!("model: profile {s}"),
            ModelProfile::Missing(s) => format!("model: no profile ({s})"),
        }
    }
}

/// `explicit` (an error if it cannot be read: the user named it), else this machine's
/// cached profile, else [`ModelProfile::Missing`]. Never calibrates.
pub fn load_profile(explicit: Option<&Path>) -> anyhow::Result<ModelProfile> {
    if let Some(path) = explicit {
        let p = Profile::load(path)
            .map_err(|e| anyhow::anyhow!("--profile {}: {e}", path.display()))?;
        let s = format!("{} {}", path.display(), made(&p));
        return Ok(ModelProfile::Loaded(Box::new(p), s));
    }
    let machine = Fingerprint::read();
    let path: PathBuf = match cache_dir() {
        Ok(d) => cache_file(&d, &machine),
        Err(e) => return Ok(ModelProfile::Missing(format!("no profile cache: {e}"))),
    };
    if !path.exists() {
        return Ok(ModelProfile::Missing(format!(
            "none cached for this machine at {}: run `usermm calibrate` as root, or pass --profile FILE",
            path.display()
        )));
    }
    match Profile::load(&path) {
        Ok(p) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let stale = if p.fresh_for(&machine, &crate::calibrate::model_key(), now) {
                ""
            } else {
                "; stale (older than 30 days, or made by other probes or recipes: `usermm calibrate` renews it)"
            };
            let s = format!("{} (cached) {}{stale}", path.display(), made(&p));
            Ok(ModelProfile::Loaded(Box::new(p), s))
        }
        Err(e) => Ok(ModelProfile::Missing(format!(
            "the cached {} cannot be read: {e}",
            path.display()
        ))),
    }
}

fn made(p: &Profile) -> String {
    format!(
        "of {} ({}), {} probe points",
        p.fingerprint.cpu_model,
        p.fingerprint.kernel_release,
        p.observations.len()
    )
}

/// A replay's workload as the fit takes it: per priced operation, the sum over its
/// distinct calls of the call's features × its multiplicity.
pub fn workload(profile: &Profile, r: &ReplayReport) -> Vec<(&'static str, BTreeMap<String, f64>)> {
    let mut per_op: BTreeMap<&'static str, BTreeMap<String, f64>> = BTreeMap::new();
    for c in &r.op_distinct {
        if !trace::replay::MODEL_OPS.contains(&c.op) {
            continue;
        }
        let sum = per_op.entry(c.op).or_default();
        for (k, v) in profile.features(c.op, &c.counter_map()) {
            *sum.entry(k).or_insert(0.0) += v * c.count as f64;
        }
    }
    per_op.into_iter().collect()
}

fn refs<'a>(
    w: &'a [(&'static str, BTreeMap<String, f64>)],
) -> Vec<(&'static str, &'a BTreeMap<String, f64>)> {
    w.iter().map(|(op, f)| (*op, f)).collect()
}

/// The predicted kernel time of the replayed workload (ns, 95 % interval).
pub fn predict(profile: &Profile, r: &ReplayReport) -> Prediction {
    profile.fit.predict_all(&refs(&workload(profile, r)))
}

/// The predicted gain of `variant` over `baseline` (percent of the baseline's time,
/// positive: faster) with its 95 % interval; `None` when the baseline is priced at 0.
pub fn gain(
    profile: &Profile,
    variant: &ReplayReport,
    baseline: &ReplayReport,
) -> Option<(f64, [f64; 2])> {
    let (v, b) = (workload(profile, variant), workload(profile, baseline));
    profile.fit.gain_all(&refs(&v), &refs(&b))
}

/// A model cell as JSON carries it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelCell {
    /// Predicted kernel mm time of the workload, ns.
    pub ns: f64,
    /// Its 95 % interval, ns.
    pub ci95_ns: [f64; 2],
    /// The predicted gain over the column's baseline, percent (positive: faster).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gain_pct: Option<f64>,
    /// Its 95 % interval, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gain_ci95_pct: Option<[f64; 2]>,
    /// The column the gain is over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
}

/// The cell of `r`, with its gain over `base` (named `base_name`) if given.
pub fn cell(profile: &Profile, r: &ReplayReport, base: Option<(&str, &ReplayReport)>) -> ModelCell {
    let p = predict(profile, r);
    let g = base.and_then(|(_, b)| gain(profile, r, b));
    ModelCell {
        ns: p.ns,
        ci95_ns: p.ci95,
        gain_pct: g.map(|g| g.0),
        gain_ci95_pct: g.map(|g| g.1),
        baseline: base.map(|(n, _)| n.to_string()),
    }
}

/// A time in ns as ms with its interval: `1.234 ms [1.100, 1.370]`.
pub fn fmt_ms(ns: f64, ci: [f64; 2]) -> String {
    format!(
        "{:.3} ms [{:.3}, {:.3}]",
        ns / 1e6,
        ci[0] / 1e6,
        ci[1] / 1e6
    )
}

/// A gain with its interval: `+1.2% [-0.3, +2.7]`.
pub fn fmt_gain(g: f64, ci: [f64; 2]) -> String {
    format!("{g:+.1}% [{:+.1}, {:+.1}]", ci[0], ci[1])
}

/// A small synthetic profile for tests and examples ([`Profile::example`]). It predicts
/// nothing about any machine.
pub fn example_profile() -> anyhow::Result<Profile> {
    Profile::example().map_err(|e| anyhow::anyhow!("{e}"))
}
