//! A calibration's probe times pooled with the machine's recent calibrations.
//!
//! One probe point's host time moves between two calibrations of the same machine minutes
//! apart by a median of 7 to 9 % either way, and by more than 20 % for 11 to 26 % of the
//! points (this AMD guest, 6.18.44-fc-v782, after their common shift is taken out): the
//! probes' own noise, which each calibration's three passes only partly average. A profile
//! keeps the probe times of its last [`POOL`] calibrations (its own first), and a new
//! calibration fits each point's median over them: each earlier calibration's times scaled
//! to the new one's level first (the median ratio over their common points), so that a
//! machine that has become slower or faster as a whole (1.36 times between the morning and
//! the evening of one day here) is priced at its speed now, and only the point-to-point
//! noise is averaged. Calibrations older than [`POOL_MAX_AGE_SECS`], or of another machine
//! or kernel build, are not pooled, nor those of another model unless the host timed its
//! probes the same way (`Profile::timing_key`); the times pool point by point, by [`key`],
//! so a probe added to the catalogue or dropped leaves the others' pools whole. On a
//! noisier day of the same guest (6.18.44-fc-v657), of three calibrations a minute apart
//! the last ran ×0.83 of both others' times as a whole and its points a median 10 and 13 %
//! off that; [`drift`] measures it, and `usermm calibrate --show` prints it beside the
//! fit's held-out error, part of which it is.
//!
//! How many to pool was chosen on that day's twelve calibrations (45 minutes): the newest
//! alone, or pooled with the next 2, 4, 6, 8 or all 11, each fitted again and judged by its
//! held-out error and by the rows of six bench reports (three pairs of runs: one made
//! between the calibrations, one just after them and one an hour later; nothing of the
//! reports is fitted, they only judged the choice) within ±20 % of the host:
//!
//! | pooled | held-out median error | rows of 43, pair by pair | mean |
//! |---|---|---|---|
//! | 1 | 17.7 % | 38/36, 39/36, 37/41 | 37.8 |
//! | 3 | 12.0 % | 40/35, 40/35, 40/40 | 38.3 |
//! | 5 | 13.5 % | 39/35, 39/36, 39/43 | 38.5 |
//! | 7 | 11.6 % | 40/37, 37/33, 36/36 | 36.5 |
//! | 9 | 12.1 % | 39/38, 39/36, 40/42 | 39.0 |
//! | 12 | 11.3 % | 40/39, 40/36, 40/43 | 39.7 |
//!
//! A profile of one calibration errs by its points' noise, which the rows inherit as the
//! prices it sets; each further calibration pooled narrows that. Twelve is the most the
//! day's data could try; a day's calibrations of one machine rarely reach it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The calibrations a profile pools, its own included.
pub const POOL: usize = 12;

/// The oldest calibration pooled, seconds before the new one.
pub const POOL_MAX_AGE_SECS: u64 = 24 * 3600;

/// One calibration's probe times, at its own level.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// When it was made, seconds since the Unix epoch.
    pub created_unix: u64,
    /// Each probe point's median host time, ns, by [`key`].
    pub ns: BTreeMap<String, f64>,
}

/// A probe point's key in [`Timings::ns`]: its family and label.
pub fn key(family: &str, label: &str) -> String {
    format!("{family} {label}")
}

/// What [`pool`] made: each point's pooled time and how each earlier calibration was scaled.
#[derive(Clone, Debug, PartialEq)]
pub struct Pooled {
    /// Each of `new`'s points: the median of its time and the earlier ones' scaled times.
    pub ns: BTreeMap<String, f64>,
    /// The earlier calibrations pooled (indices into the `earlier` given) and the scale
    /// applied to each (its times × the scale are at the new calibration's level).
    pub used: Vec<(usize, f64)>,
}

/// How one calibration's times moved from another's: the machine as a whole, and each
/// point apart from that.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Drift {
    /// The median over their common points of the new time over the old: the old times ×
    /// this are at the new level.
    pub scale: f64,
    /// The median over the points of |new / (old × scale) − 1|, percent: one point's own
    /// noise between two calibrations, which no fit of one calibration can follow.
    pub point_pct: f64,
    /// The share of points off by more than 20 % that way, percent.
    pub over_20_pct: f64,
}

/// How `new` moved from `old` over their common points (`None` without one).
pub fn drift(new: &Timings, old: &Timings) -> Option<Drift> {
    let mut ratios: Vec<f64> = new
        .ns
        .iter()
        .filter_map(|(k, &v)| Some(v / old.ns.get(k).filter(|&&o| o > 0.0)?))
        .filter(|r| r.is_finite() && *r > 0.0)
        .collect();
    let scale = median(&mut ratios)?;
    let mut off: Vec<f64> = ratios
        .iter()
        .map(|r| (r / scale - 1.0).abs() * 100.0)
        .collect();
    let over = off.iter().filter(|&&d| d > 20.0).count() as f64 * 100.0 / off.len() as f64;
    Some(Drift {
        scale,
        point_pct: median(&mut off)?,
        over_20_pct: over,
    })
}

/// The median, the two middle values averaged for an even count (a pool of two keeps both
/// calibrations' say).
fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Pools `new` with `earlier` (newest first; those older than [`POOL_MAX_AGE_SECS`] before
/// `new`, without a common point, and past the first `POOL - 1` are left out).
pub fn pool(new: &Timings, earlier: &[Timings]) -> Pooled {
    let usable = |t: &Timings| {
        t.created_unix <= new.created_unix && new.created_unix - t.created_unix <= POOL_MAX_AGE_SECS
    };
    let mut scaled: Vec<(f64, &Timings)> = Vec::new();
    let mut used = Vec::new();
    for (i, t) in earlier.iter().enumerate().filter(|(_, t)| usable(t)) {
        if scaled.len() + 1 >= POOL {
            break;
        }
        if let Some(d) = drift(new, t) {
            scaled.push((d.scale, t));
            used.push((i, d.scale));
        }
    }
    let ns = new
        .ns
        .iter()
        .map(|(k, &v)| {
            let mut all = vec![v];
            all.extend(
                scaled
                    .iter()
                    .filter_map(|(s, t)| t.ns.get(k).map(|o| o * s))
                    .filter(|x| x.is_finite() && *x > 0.0),
            );
            (k.clone(), median(&mut all).unwrap_or(v))
        })
        .collect();
    Pooled { ns, used }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timings(at: u64, points: &[(&str, f64)]) -> Timings {
        Timings {
            created_unix: at,
            ns: points.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
        }
    }

    #[test]
    fn earlier_calibrations_are_scaled_to_the_new_level_and_each_point_takes_the_median() {
        let new = timings(10_000, &[("a", 100.0), ("b", 200.0), ("c", 300.0)]);
        // Twice as fast as a whole, one point off; then the same level, one point off.
        let e1 = timings(9_000, &[("a", 50.0), ("b", 130.0), ("c", 150.0)]);
        let e2 = timings(8_000, &[("a", 100.0), ("b", 200.0), ("c", 390.0)]);
        let p = pool(&new, &[e1, e2]);
        assert_eq!(p.used, vec![(0, 2.0), (1, 1.0)]);
        // a: 100, 100, 100; b: 200, 260, 200; c: 300, 300, 390.
        assert_eq!(p.ns["a"], 100.0);
        assert_eq!(p.ns["b"], 200.0);
        assert_eq!(p.ns["c"], 300.0);
    }

    #[test]
    fn drift_is_the_common_scale_and_each_point_off_it() {
        let new = timings(
            10_000,
            &[("a", 100.0), ("b", 200.0), ("c", 390.0), ("d", 80.0)],
        );
        let old = timings(
            9_000,
            &[("a", 50.0), ("b", 100.0), ("c", 150.0), ("z", 1.0)],
        );
        // Ratios 2, 2, 2.6 over the common points: scale 2; a and b on it, c 30 % off.
        let d = drift(&new, &old).expect("common points");
        assert_eq!(d.scale, 2.0);
        assert_eq!(d.point_pct, 0.0);
        assert!((d.over_20_pct - 100.0 / 3.0).abs() < 1e-9, "{d:?}");
        assert_eq!(drift(&new, &timings(1, &[("z", 1.0)])), None);
    }

    #[test]
    fn old_foreign_and_surplus_calibrations_are_left_out() {
        let new = timings(100_000, &[("a", 100.0), ("b", 100.0)]);
        let old = timings(100_000 - POOL_MAX_AGE_SECS - 1, &[("a", 50.0), ("b", 50.0)]);
        let future = timings(200_000, &[("a", 1.0)]);
        let disjoint = timings(99_000, &[("z", 1.0)]);
        let p = pool(&new, &[future, old, disjoint]);
        assert!(p.used.is_empty());
        assert_eq!(p.ns, new.ns);
        // Of POOL + 1 usable ones, the newest POOL - 1 are pooled.
        let same = |at| timings(at, &[("a", 100.0), ("b", 140.0)]);
        let usable: Vec<Timings> = (1..=POOL as u64 + 1)
            .map(|i| same(100_000 - 10 * i))
            .collect();
        let p = pool(&new, &usable);
        assert_eq!(
            p.used.iter().map(|u| u.0).collect::<Vec<_>>(),
            (0..POOL - 1).collect::<Vec<_>>()
        );
        // Scaled by 6/7 (the median of a's ratio 1 and b's 5/7), b's 140 read 120 each time.
        assert!((p.ns["b"] - 120.0).abs() < 1e-9, "{:?}", p.ns);
    }
}
