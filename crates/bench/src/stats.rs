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
/// columns (another system), unmeasured cells, or a zero baseline.
pub fn cell_gain(table: &Table, row: usize, col: usize, stat: Stat) -> Option<f64> {
    let r = table.rows.get(row)?;
    if table.variants.get(col)?.kind == VariantKind::Host {
        return None;
    }
    let base = summary(stat, &r.columns.get(table.baseline_index()?)?.samples)?;
    let v = summary(stat, &r.columns.get(col)?.samples)?;
    gain_pct(v, base, table.better)
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
