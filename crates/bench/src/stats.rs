//! Summary statistics of a cell and the gain against the baseline (mmtests convention).

use crate::model::{Better, Column, Stat, Table, VariantKind};

/// The value of `stat` over `samples`, or `None` without samples.
pub fn summary(stat: Stat, samples: &[f64]) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let n = samples.len() as f64;
    let mean = samples.iter().sum::<f64>() / n;
    Some(match stat {
        Stat::Min => samples.iter().copied().fold(f64::INFINITY, f64::min),
        Stat::Max => samples.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        Stat::Mean => mean,
        Stat::Stddev => (samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt(),
        Stat::Median => {
            let mut v = samples.to_vec();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        }
    })
}

/// The widest gap between two consecutive sorted samples, relative to the lower one, at
/// which a cell's samples count as two speed bands.
pub const BAND_GAP: f64 = 0.2;

/// The host's speed bands of a cell: when its sorted samples split in two at a gap wider
/// than [`BAND_GAP`] of the lower side (the widest such gap), each side holding at least two
/// samples, the (median, samples) of the lower and of the upper band. Measured on the AMD
/// EPYC guest of kernel v782: one process forking the same 256 MiB took 9–11 ms or 14–16 ms
/// for seconds at a time as the guest's memory system changed speed, so the median of seven
/// samples lands in one band or the other; a reader needs to see both.
pub fn bands(samples: &[f64]) -> Option<[(f64, usize); 2]> {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let (cut, _) = (2..v.len().saturating_sub(1))
        .filter(|&i| v[i - 1] > 0.0)
        .map(|i| (i, (v[i] - v[i - 1]) / v[i - 1]))
        .filter(|&(_, gap)| gap > BAND_GAP)
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    let (lo, hi) = v.split_at(cut);
    let median = |s: &[f64]| summary(Stat::Median, s).unwrap_or(f64::NAN);
    Some([(median(lo), lo.len()), (median(hi), hi.len())])
}

/// The gain of `value` over `base` in percent, positive when better (as mmtests prints it).
pub fn gain_pct(value: f64, base: f64, better: Better) -> Option<f64> {
    if base == 0.0 || !base.is_finite() || !value.is_finite() {
        return None;
    }
    Some(match better {
        Better::Lower => (base - value) / base * 100.0,
        Better::Higher => (value - base) / base * 100.0,
    })
}

/// The gain of cell `col` of `row` over the baseline cell for `stat`; `None` for host
/// columns (another system), unmeasured cells, or a zero baseline. A model column's gain
/// is over the baseline's model column (`model:<baseline>`): the predicted gain.
pub fn cell_gain(table: &Table, row: usize, col: usize, stat: Stat) -> Option<f64> {
    let r = table.rows.get(row)?;
    let base_col = match table.variants.get(col)?.kind {
        VariantKind::Host => return None,
        VariantKind::Engine | VariantKind::Control => table.baseline_index()?,
        VariantKind::Model => {
            table.variant_index(&usermm_model::prices::model_name(&table.baseline))?
        }
    };
    let base = summary(stat, &r.columns.get(base_col)?.samples)?;
    let v = summary(stat, &r.columns.get(col)?.samples)?;
    gain_pct(v, base, table.better)
}

/// The order in which repetition `rep` measures `n` variants: rotated by one each repetition,
/// so that a variant is not always measured first (cold) or right after the same neighbour,
/// and a drift of the machine's load spreads over all of them.
pub fn rotation(rep: usize, n: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (rep + k) % n)
}

/// [`rotation`] of the engine columns `0..n-1`, then the host column `n-1` last. The host
/// cell (another process populating and freeing a whole layout; after the last repetition,
/// the cost model's agents) leaves the machine in a different state than an engine cell:
/// over four full runs the first engine cell of a repetition ran 1.0-4.2 % slower on average
/// than the others in fork and munmap (spawn: 0.5-1.1 % fewer forks). The rotation cannot
/// share that place evenly (with 7 repetitions and 3 engine columns the first takes it 3
/// times, the others twice, which biased the A/A control), so each table's repetition
/// starts with one untimed engine cell of its first column, whose time and counters are
/// dropped.
pub fn rotation_host_last(rep: usize, n: usize) -> impl Iterator<Item = usize> {
    let engines = n.saturating_sub(1);
    rotation(rep, engines).chain((n > 0).then_some(n - 1))
}

/// The 95 % confidence interval of the median gain of `col` over `base`, from the gains of
/// the repetitions paired by index (a repetition measures every variant, in rotated order,
/// so drift of the machine's load cancels within a pair): `None` with fewer than 3 pairs.
///
/// The interval is distribution-free: the order statistics `[g(k), g(n+1-k)]` of the `n`
/// paired gains with the largest `k` whose miss probability, `2 P(Binomial(n, 1/2) < k)`,
/// is at most 5 % (the sign-test interval of a median). A percentile bootstrap of the
/// median, used before, lands on `[g(2), g(6)]` with 7 repetitions: an 87.5 % interval, which
/// read a 4K fork row whose paired gains were 0.1 … 15.1 % as a gain of 1.5 … 6.4 %. With 7
/// repetitions the interval is `[min, max]` (98.4 %); with 3 to 5, which cannot reach 95 %,
/// it is `[min, max]` as well (75 %, 87.5 %, 93.75 %).
pub fn gain_ci95(col: &[f64], base: &[f64], better: Better) -> Option<[f64; 2]> {
    let mut gains: Vec<f64> = col
        .iter()
        .zip(base)
        .filter_map(|(&v, &b)| gain_pct(v, b, better))
        .collect();
    let n = gains.len();
    if n < 3 {
        return None;
    }
    gains.sort_by(f64::total_cmp);
    let k = sign_test_rank(n);
    Some([gains[k - 1], gains[n - k]])
}

/// The largest `k >= 1` with `2 P(Binomial(n, 1/2) <= k - 1) <= 0.05` (1 when none is).
pub(crate) fn sign_test_rank(n: usize) -> usize {
    // C(n, i) / 2^n summed in floating point: exact enough for the repetition counts used.
    let mut below = 0.0; // P(X <= k - 1)
    let mut choose = 1.0; // C(n, k - 1)
    let total = 2f64.powi(n as i32);
    let mut k = 1;
    while k < n {
        below += choose / total;
        if 2.0 * below > 0.05 {
            break;
        }
        choose = choose * (n - (k - 1)) as f64 / k as f64;
        k += 1;
    }
    // `k` is one past the last rank that kept the miss probability within 5 %.
    (k - 1).max(1)
}

/// The 95 % confidence interval of the shift `b - a` between two independent sets of
/// samples (two runs of the same cell: different processes, maybe different days), `None`
/// when either has fewer than 3. Distribution-free: the order statistics `[d(k),
/// d(nm+1-k)]` of the `n m` pairwise differences `b_j - a_i`, with the largest `k` whose
/// miss probability `2 P(U < k)` under the exact Mann-Whitney null distribution is at most
/// 5 % (the interval of the Hodges-Lehmann shift); `[min, max]` where no `k` reaches 95 %
/// (3 against 3: 90 %). A percentile bootstrap of the difference of medians, used before,
/// covers less than it says at such sample sizes, as it did for the paired gains.
pub fn shift_ci95(a: &[f64], b: &[f64]) -> Option<[f64; 2]> {
    let (n, m) = (a.len(), b.len());
    if n < 3 || m < 3 {
        return None;
    }
    let mut d: Vec<f64> = b
        .iter()
        .flat_map(|&y| a.iter().map(move |&x| y - x))
        .collect();
    d.sort_by(f64::total_cmp);
    let k = mann_whitney_rank(n, m);
    Some([d[k - 1], d[n * m - k]])
}

/// The largest `k >= 1` with `2 P(U <= k - 1) <= 0.05` for the Mann-Whitney statistic of
/// samples of `n` and `m` under the null hypothesis (1 when none is): exact up to 10 000
/// pairs, beyond that from the normal approximation (bounded time and memory for any
/// repetition count).
fn mann_whitney_rank(n: usize, m: usize) -> usize {
    let max_u = n * m;
    if max_u > 10_000 {
        let sd = (max_u as f64 * (n + m + 1) as f64 / 12.0).sqrt();
        let k = (max_u as f64 / 2.0 - 1.959_964 * sd).floor();
        return (k as usize).max(1);
    }
    // prev[i][u] / cur[i][u]: arrangements of i values of the first sample and j - 1 / j of
    // the second with statistic u, by which sample holds the largest value.
    let mut prev = vec![vec![0.0f64; max_u + 1]; n + 1];
    for row in &mut prev {
        row[0] = 1.0; // j = 0: one arrangement, U = 0
    }
    // The layer before `prev` is reused: row i of layer j is written for every u up to i j,
    // past everything an older layer left there, and row 0 is the same in every layer.
    let mut cur = prev.clone();
    for j in 1..=m {
        for i in 1..=n {
            for u in 0..=i * j {
                let largest_first = if u >= j { cur[i - 1][u - j] } else { 0.0 };
                cur[i][u] = largest_first + prev[i][u];
            }
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    let ways = &prev[n];
    let total: f64 = ways.iter().sum();
    let mut below = 0.0; // P(U <= k - 1)
    let mut k = 1;
    while k <= max_u / 2 {
        below += ways[k - 1] / total;
        if 2.0 * below > 0.05 {
            break;
        }
        k += 1;
    }
    (k - 1).max(1)
}

/// Whether an interval says the gain may be nothing (it contains 0).
pub fn is_noise(ci: Option<[f64; 2]>) -> bool {
    ci.is_some_and(|[lo, hi]| lo <= 0.0 && hi >= 0.0)
}

/// Fills [`Column::gain_ci95_pct`] of every engine and control column of `table` against its baseline.
pub fn add_intervals(table: &mut Table) {
    let Some(b) = table.baseline_index() else {
        return;
    };
    let better = table.better;
    let kinds: Vec<VariantKind> = table.variants.iter().map(|v| v.kind).collect();
    for row in &mut table.rows {
        let base = row
            .columns
            .get(b)
            .map(|c| c.samples.clone())
            .unwrap_or_default();
        for (i, c) in row.columns.iter_mut().enumerate() {
            if i != b
                && matches!(
                    kinds.get(i),
                    Some(VariantKind::Engine | VariantKind::Control)
                )
            {
                c.gain_ci95_pct = gain_ci95(&c.samples, &base, better);
            }
        }
    }
}

/// The headline value of a cell: its median (or mean when the table shows no median).
pub fn headline(table: &Table, c: &Column) -> Option<f64> {
    let stat = if table.stats.contains(&Stat::Median) {
        Stat::Median
    } else {
        Stat::Mean
    };
    summary(stat, &c.samples)
}

#[cfg(test)]
mod tests {

    #[test]
    fn two_speed_bands_are_told_apart_and_one_outlier_is_not_a_band() {
        // The fork of 256 MiB on the v782 guest: four fast and three slow samples.
        let fork = [9.5, 14.2, 9.0, 14.5, 10.0, 13.9, 9.8];
        assert_eq!(bands(&fork), Some([(9.8, 4), (14.2, 3)]));
        // One band with a 10 % spread; a single slow sample.
        assert_eq!(bands(&[10.0, 10.5, 11.0, 11.2]), None);
        assert_eq!(bands(&[10.0, 10.1, 10.0, 10.2, 20.0]), None);
        // Too few samples to hold two bands of two.
        assert_eq!(bands(&[1.0, 2.0, 3.0]), None);
    }
    use super::*;

    #[test]
    fn summaries() {
        let s = [3.0, 1.0, 2.0, 6.0];
        assert_eq!(summary(Stat::Min, &s), Some(1.0));
        assert_eq!(summary(Stat::Max, &s), Some(6.0));
        assert_eq!(summary(Stat::Median, &s), Some(3.0));
        assert_eq!(summary(Stat::Mean, &s), Some(3.0));
        assert_eq!(summary(Stat::Stddev, &[1.0, 3.0]), Some(1.0));
        assert_eq!(summary(Stat::Min, &[]), None);
    }

    #[test]
    fn rotations_visit_every_column_once_per_repetition() {
        for rep in 0..5 {
            let mut r: Vec<usize> = rotation(rep, 4).collect();
            assert_eq!(r[0], rep % 4);
            r.sort_unstable();
            assert_eq!(r, [0, 1, 2, 3]);
            let h: Vec<usize> = rotation_host_last(rep, 3).collect();
            assert_eq!(h.len(), 3);
            assert_eq!(h[2], 2, "host last");
            assert_eq!(h[0], rep % 2);
        }
    }

    #[test]
    fn intervals_separate_a_real_gain_from_noise() {
        let base = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02];
        let same = [1.01, 1.09, 0.92, 1.04, 0.96, 0.99, 1.0];
        let faster = [0.5, 0.56, 0.44, 0.52, 0.48, 0.51, 0.5];
        let ci = gain_ci95(&same, &base, Better::Lower);
        assert!(is_noise(ci), "{ci:?}");
        let ci = gain_ci95(&faster, &base, Better::Lower).expect("interval");
        assert!(ci[0] > 40.0 && ci[1] < 60.0, "{ci:?}");
        assert!(!is_noise(Some(ci)));
        assert_eq!(gain_ci95(&[1.0, 2.0], &[1.0, 2.0], Better::Lower), None);
    }

    #[test]
    fn the_interval_is_the_sign_test_one() {
        // 2 P(X <= k-1) <= 5 %: n = 7 only [min, max] (k = 1); n = 9: k = 2 (3.9 %);
        // n = 17: k = 5 (2 * 0.0245 = 4.9 %); below 6 nothing reaches 95 %: k = 1.
        assert_eq!(
            [3, 5, 6, 7, 8, 9, 17, 20].map(sign_test_rank),
            [1, 1, 1, 1, 1, 2, 5, 6]
        );
        // The paired gains of a 4K fork row that a bootstrap read as 1.5 ... 6.4 %.
        let base = [100.0; 7];
        let col = [98.5, 99.9, 93.6, 96.2, 84.9, 97.3, 97.5];
        let ci = gain_ci95(&col, &base, Better::Lower).expect("interval");
        assert!(
            (ci[0] - 0.1).abs() < 1e-9 && (ci[1] - 15.1).abs() < 1e-9,
            "{ci:?}"
        );
        let nine = [99.0, 98.0, 97.0, 96.0, 95.0, 94.0, 93.0, 92.0, 91.0];
        let ci = gain_ci95(&nine, &[100.0; 9], Better::Lower).expect("interval");
        assert!(
            (ci[0] - 2.0).abs() < 1e-9 && (ci[1] - 8.0).abs() < 1e-9,
            "{ci:?}"
        );
    }

    #[test]
    fn the_shift_interval_is_the_mann_whitney_one() {
        // Two-sided 5 % critical values of U from the tables: 5 and 5: 2; 7 and 7: 8;
        // 8 and 8: 13; 10 and 10: 23; 5 and 10: 8. The rank is one more; 3 and 3 has none.
        assert_eq!(
            [(3, 3), (5, 5), (7, 7), (8, 8), (10, 10), (5, 10)]
                .map(|(n, m)| mann_whitney_rank(n, m)),
            [1, 3, 9, 14, 24, 9]
        );
        // Past 10 000 pairs the normal approximation takes over; at 100 and 100, the last
        // exact size, it agrees with the exact rank to within 0.5 %.
        let exact = mann_whitney_rank(100, 100) as f64;
        let approx = mann_whitney_rank(100, 101) as f64 * 10_000.0 / 10_100.0;
        assert!((approx / exact - 1.0).abs() < 0.005, "{exact} {approx}");
        let a = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0];
        let later: Vec<f64> = a.iter().map(|x| x + 100.0).collect();
        let [lo, hi] = shift_ci95(&a, &later).expect("interval");
        // Every pairwise difference lies in 94 ..= 106; the 9th smallest is 97.
        assert!(
            (lo - 97.0).abs() < 1e-9 && (hi - 103.0).abs() < 1e-9,
            "{lo} {hi}"
        );
        let [lo, hi] = shift_ci95(&a, &a).expect("interval");
        assert!(lo < 0.0 && hi > 0.0, "the same samples: no shift");
        assert_eq!(shift_ci95(&a[..2], &a), None);
    }

    #[test]
    fn gains_follow_mmtests() {
        assert_eq!(
            gain_pct(0.7, 1.0, Better::Lower).map(|g| g.round()),
            Some(30.0)
        );
        assert_eq!(
            gain_pct(153.0, 100.0, Better::Higher).map(|g| g.round()),
            Some(53.0)
        );
        assert_eq!(gain_pct(1.0, 0.0, Better::Lower), None);
    }
}
