//! `usermm bench compare A.json B.json [C.json…]`: the runs of several reports side by side
//! in the mmtests compare layout. For every table present in all reports, every row and
//! engine variant present in all of them gets one line: the median of each run, and for
//! B, C, … the gain over A (mmtests convention: positive is better) with `~` when the 95 %
//! interval of the shift between the runs contains 0. The runs are independent (different
//! processes, maybe different days), so the interval is the distribution-free Mann-Whitney
//! one of two independent samples ([`crate::stats::shift_ci95`]); the suite's own
//! `gain_ci95` pairs repetitions of one run.
//!
//! Beside the times, each line carries the exact counters of its cell in every run and their
//! difference from the first run ([`CounterCmp`]): in JSON all of them, in text the table's
//! chosen counters and those that differ, so a change of time comes with what the engine did
//! differently (or the news that it did exactly the same work).

use crate::model::{Better, Report, Stat, Table, VariantKind};
use crate::stats::{gain_pct, shift_ci95, summary};
use crate::text::{display_scale, fmt_gain, fmt_noise, unit_text};
use anyhow::Context;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Arguments of `usermm bench compare`.
#[derive(clap::Args, Debug, Clone)]
pub struct CompareArgs {
    /// Bench reports (`usermm bench --json FILE`, `report.json`): the first is the baseline.
    #[arg(required = true, num_args = 2.., value_name = "REPORT.json")]
    pub reports: Vec<PathBuf>,
    /// Print the comparison as JSON instead of text (docs/cli-json.md).
    #[arg(long)]
    pub json: bool,
    /// Compare reports that were not run alike (another scale or reclaim memory,
    /// repetitions, kernel or CPU count): without it such a pair is refused, since a layout's times say nothing of
    /// another's.
    #[arg(long)]
    pub force: bool,
}

/// One run of the comparison.
#[derive(Clone, Debug, Serialize)]
pub struct RunRef {
    /// Column name: the file stem (made unique).
    pub name: String,
    /// The path given.
    pub path: String,
    /// The report's generator.
    pub generator: String,
}

/// The change of one run against the baseline run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Change {
    /// Gain over the baseline's median in percent (positive is better).
    pub gain_pct: Option<f64>,
    /// 95 % interval of the shift `run - baseline` (Mann-Whitney, distribution-free), in the
    /// table's unit.
    pub diff_ci95: Option<[f64; 2]>,
    /// The interval contains 0: the change may be nothing (`~`).
    pub noise: bool,
}

/// One row and variant across the runs.
#[derive(Clone, Debug, Serialize)]
pub struct Line {
    /// The row label (`64K`).
    pub row: String,
    /// The engine variant (`batched`).
    pub variant: String,
    /// Median of each run, in the table's unit (`None`: unmeasured).
    pub medians: Vec<Option<f64>>,
    /// Change of each run against the first (`None` for the first).
    pub changes: Vec<Option<Change>>,
    /// Every counter of the cell in any run, by name.
    pub counters: Vec<CounterCmp>,
}

/// One counter of a line across the runs.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CounterCmp {
    /// Counter name (`fork_batches`).
    pub name: String,
    /// Its value in each run's cell (`None`: that cell has no such counter, or is
    /// unmeasured).
    pub values: Vec<Option<u64>>,
    /// Each run's value minus the first run's (`None` for the first run and where either
    /// value is missing).
    pub diffs: Vec<Option<i64>>,
}

impl CounterCmp {
    /// Whether the runs disagree on it (a missing value counts as a difference).
    pub fn differs(&self) -> bool {
        self.values.iter().any(|v| *v != self.values[0])
    }
}

/// The counters of the cells `cells` (one per run, `None` where unmeasured), every name
/// present in any, with their differences from the first.
fn counter_cmps(cells: &[Option<&BTreeMap<String, u64>>]) -> Vec<CounterCmp> {
    let names: BTreeSet<&String> = cells.iter().flatten().flat_map(|c| c.keys()).collect();
    names
        .into_iter()
        .map(|name| {
            let values: Vec<Option<u64>> = cells
                .iter()
                .map(|c| c.and_then(|c| c.get(name)).copied())
                .collect();
            let diffs = values
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    let (Some(v), Some(b)) = (v, values[0]) else {
                        return None;
                    };
                    (i > 0).then(|| {
                        let d = i128::from(*v) - i128::from(b);
                        i64::try_from(d).unwrap_or(if d < 0 { i64::MIN } else { i64::MAX })
                    })
                })
                .collect();
            CounterCmp {
                name: name.clone(),
                values,
                diffs,
            }
        })
        .collect()
}

/// One table across the runs.
#[derive(Clone, Debug, Serialize)]
pub struct TableCmp {
    /// Table id.
    pub id: String,
    /// Title.
    pub title: String,
    /// What a sample is.
    pub metric: String,
    /// Unit of the medians (as in the reports: seconds, per_second, bytes_per_second).
    pub unit: crate::model::Unit,
    /// Which direction is better.
    pub better: Better,
    /// The lines.
    pub lines: Vec<Line>,
}

/// The whole comparison.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// The runs, baseline first.
    pub runs: Vec<RunRef>,
    /// Tables present in every report (in the baseline's order).
    pub tables: Vec<TableCmp>,
    /// Tables of some report that are not in all of them.
    pub skipped_tables: Vec<String>,
}

fn median_of(t: &Table, row: &str, variant: &str) -> Option<Vec<f64>> {
    let c = cell_of(t, row, variant)?;
    (c.unavailable.is_none()).then(|| c.samples.clone())
}

/// The measured cell of `variant` in `row`.
fn cell_of<'t>(t: &'t Table, row: &str, variant: &str) -> Option<&'t crate::model::Column> {
    let vi = t.variant_index(variant)?;
    let r = t.rows.iter().find(|r| r.label == row)?;
    r.columns.get(vi).filter(|c| c.unavailable.is_none())
}

/// Compares `reports` (baseline first), named by `names`.
pub fn compare(reports: &[Report], names: Vec<RunRef>) -> Comparison {
    let mut tables = Vec::new();
    let mut skipped = Vec::new();
    let Some(base) = reports.first() else {
        return Comparison {
            runs: names,
            tables,
            skipped_tables: skipped,
        };
    };
    for r in reports {
        for t in &r.tables {
            let everywhere = reports
                .iter()
                .all(|o| o.tables.iter().any(|u| u.id == t.id));
            if !everywhere && !skipped.contains(&t.id) {
                skipped.push(t.id.clone());
            }
        }
    }
    for t in &base.tables {
        let all: Option<Vec<&Table>> = reports
            .iter()
            .map(|r| r.tables.iter().find(|u| u.id == t.id))
            .collect();
        let Some(all) = all else { continue };
        let mut lines = Vec::new();
        for row in &t.rows {
            for v in t.variants.iter().filter(|v| v.kind == VariantKind::Engine) {
                let present = all.iter().all(|u| {
                    u.rows.iter().any(|r| r.label == row.label)
                        && u.variants
                            .iter()
                            .any(|w| w.name == v.name && w.kind == VariantKind::Engine)
                });
                if !present {
                    continue;
                }
                let samples: Vec<Option<Vec<f64>>> = all
                    .iter()
                    .map(|u| median_of(u, &row.label, &v.name))
                    .collect();
                let medians: Vec<Option<f64>> = samples
                    .iter()
                    .map(|s| s.as_deref().and_then(|s| summary(Stat::Median, s)))
                    .collect();
                let changes = samples
                    .iter()
                    .zip(&medians)
                    .enumerate()
                    .map(|(i, (s, m))| {
                        if i == 0 {
                            return None;
                        }
                        let (Some(base_s), Some(s)) = (&samples[0], s) else {
                            return None;
                        };
                        let ci = shift_ci95(base_s, s);
                        Some(Change {
                            gain_pct: m
                                .zip(medians[0])
                                .and_then(|(m, b)| gain_pct(m, b, t.better)),
                            diff_ci95: ci,
                            noise: ci.is_some_and(|[lo, hi]| lo <= 0.0 && hi >= 0.0),
                        })
                    })
                    .collect();
                let cells: Vec<Option<&BTreeMap<String, u64>>> = all
                    .iter()
                    .map(|u| cell_of(u, &row.label, &v.name).map(|c| &c.counters))
                    .collect();
                lines.push(Line {
                    row: row.label.clone(),
                    variant: v.name.clone(),
                    medians,
                    changes,
                    counters: counter_cmps(&cells),
                });
            }
        }
        tables.push(TableCmp {
            id: t.id.clone(),
            title: t.title.clone(),
            metric: t.metric.clone(),
            unit: t.unit,
            better: t.better,
            lines,
        });
    }
    Comparison {
        runs: names,
        tables,
        skipped_tables: skipped,
    }
}

/// Column names from the paths: file stems, made unique with `#N`.
pub fn run_names(paths: &[PathBuf], reports: &[Report]) -> Vec<RunRef> {
    let mut out: Vec<RunRef> = Vec::new();
    for (i, (p, r)) in paths.iter().zip(reports).enumerate() {
        let stem = p
            .file_stem()
            .map_or_else(|| format!("run{i}"), |s| s.to_string_lossy().into_owned());
        let clash = paths
            .iter()
            .filter(|q| q.file_stem() == p.file_stem())
            .count()
            > 1;
        out.push(RunRef {
            name: if clash {
                format!("{stem}#{}", i + 1)
            } else {
                stem
            },
            path: p.display().to_string(),
            generator: r.generator.clone(),
        });
    }
    out
}

/// The comparison as text, one block per table.
pub fn render(c: &Comparison, reports: &[Report]) -> String {
    let mut out = String::new();
    for t in &c.tables {
        let Some(table) = reports
            .first()
            .and_then(|r| r.tables.iter().find(|u| u.id == t.id))
        else {
            continue;
        };
        let scale = display_scale(table);
        let dir = match t.better {
            Better::Lower => "lower is better",
            Better::Higher => "higher is better",
        };
        out.push_str(&format!(
            "\n{}: {}\n  median {} in {}, {dir}; (%) = gain over {base} (positive is better); \
             (~%) = the 95% interval of the shift between the runs (Mann-Whitney) contains 0\n  \
             under each line its counters (the table's and those that differ): the value in each \
             run, (+n) its difference from {base}, (=) the same, - none\n",
            t.id,
            t.title,
            t.metric,
            unit_text(table),
            base = c.runs.first().map_or("", |r| r.name.as_str()),
        ));
        let rows: Vec<(String, Vec<String>)> = t
            .lines
            .iter()
            .flat_map(|l| -> Vec<(String, Vec<String>)> {
                let max = l
                    .medians
                    .iter()
                    .flatten()
                    .fold(0.0f64, |m, v| m.max(v * scale));
                let dec = crate::text::decimals_for(max);
                let cells = l
                    .medians
                    .iter()
                    .zip(&l.changes)
                    .enumerate()
                    .map(|(i, (m, ch))| {
                        let Some(m) = m else {
                            return "n/a".to_string();
                        };
                        let v = format!("{:.dec$}", m * scale);
                        match ch
                            .as_ref()
                            .and_then(|ch| ch.gain_pct.map(|g| (g, ch.noise)))
                        {
                            Some((g, true)) => format!("{v} {}", fmt_noise(g)),
                            Some((g, false)) => format!("{v} {}", fmt_gain(g)),
                            // The baseline, as mmtests prints it.
                            None if i == 0 => format!("{v} {}", fmt_gain(0.0)),
                            None => v,
                        }
                    })
                    .collect();
                let mut out = vec![(format!("Median {} {}", l.row, l.variant), cells)];
                out.extend(counter_lines(l, &table.counters_shown));
                out
            })
            .collect();
        let left = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0).max(8) + 2;
        let width = rows
            .iter()
            .flat_map(|(_, cs)| cs.iter().map(String::len))
            .chain(c.runs.iter().map(|r| r.name.len()))
            .max()
            .unwrap_or(0)
            + 3;
        out.push_str(&format!("{:left$}", ""));
        for r in &c.runs {
            out.push_str(&format!("{:>width$}", r.name));
        }
        out.push('\n');
        for (label, cells) in &rows {
            out.push_str(&format!("{label:<left$}"));
            for cell in cells {
                out.push_str(&format!("{cell:>width$}"));
            }
            out.push('\n');
        }
    }
    if !c.skipped_tables.is_empty() {
        out.push_str(&format!(
            "\nnot in every report (skipped): {}\n",
            c.skipped_tables.join(", ")
        ));
    }
    out
}

/// Most counters of a line printed in text because they differ between the runs, beside the
/// table's chosen ones (`--json` has them all).
const MAX_DIFFERING_SHOWN: usize = 12;

/// The text lines of a line's counters under its `Median` line: the table's chosen counters
/// (`shown`) and those that differ between the runs, each value with its difference from the
/// first run (`=` when the same); then how many more differ, if any were left out.
fn counter_lines(l: &Line, shown: &[String]) -> Vec<(String, Vec<String>)> {
    let chosen = l.counters.iter().filter(|c| shown.contains(&c.name));
    let differing: Vec<&CounterCmp> = l
        .counters
        .iter()
        .filter(|c| c.differs() && !shown.contains(&c.name))
        .collect();
    let more = differing.len().saturating_sub(MAX_DIFFERING_SHOWN);
    let mut out: Vec<(String, Vec<String>)> = chosen
        .chain(differing.into_iter().take(MAX_DIFFERING_SHOWN))
        .map(|c| {
            let cells = c
                .values
                .iter()
                .zip(&c.diffs)
                .enumerate()
                .map(|(i, (v, d))| match (v, d) {
                    (None, _) => "-".to_string(),
                    (Some(v), _) if i == 0 => v.to_string(),
                    (Some(v), Some(0)) => format!("{v} (=)"),
                    (Some(v), Some(d)) => format!("{v} ({d:+})"),
                    (Some(v), None) => v.to_string(),
                })
                .collect();
            (format!("  {} {} {}", c.name, l.row, l.variant), cells)
        })
        .collect();
    if more > 0 {
        out.push((
            format!("  ({more} more counters differ: --json lists every counter)"),
            Vec::new(),
        ));
    }
    out
}

/// The largest report read (a full suite at a large scale is a few MiB).
const MAX_REPORT_BYTES: u64 = 256 << 20;

/// Loads one report: at most 256 MiB, of the schema this build writes, and every
/// sample a positive finite number (a time or a rate), so no median or interval is computed
/// from a value no benchmark can produce.
pub fn load(path: &Path) -> anyhow::Result<Report> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_REPORT_BYTES + 1).read_to_string(&mut text))
        .with_context(|| format!("cannot read {}", path.display()))?;
    anyhow::ensure!(
        text.len() as u64 <= MAX_REPORT_BYTES,
        "{}: larger than {} MiB: not a bench report",
        path.display(),
        MAX_REPORT_BYTES >> 20
    );
    let r = Report::from_json(&text)
        .with_context(|| format!("{}: not a bench report", path.display()))?;
    for t in &r.tables {
        for row in &t.rows {
            for c in &row.columns {
                if let Some(bad) = c.samples.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
                    anyhow::bail!(
                        "{}: table {}, row {}, column {}: sample {bad} is not a positive finite \
                         {}",
                        path.display(),
                        t.id,
                        row.label,
                        c.variant,
                        if t.unit == crate::model::Unit::Seconds {
                            "time"
                        } else {
                            "rate"
                        }
                    );
                }
            }
        }
    }
    Ok(r)
}

/// What makes the runs' numbers incomparable, one line each: a different scale, reclaim
/// memory (where both reports say), repetition count, kernel or CPU count than the first
/// report's.
fn mismatches(reports: &[Report], names: &[RunRef]) -> Vec<String> {
    let Some(base) = reports.first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (r, n) in reports.iter().zip(names).skip(1) {
        let base_name = names.first().map_or("the first", |b| b.name.as_str());
        if r.run.scale_bytes != base.run.scale_bytes {
            out.push(format!(
                "{} ran at {} MiB, {base_name} at {} MiB: layouts differ, so do the times",
                n.name,
                r.run.scale_bytes >> 20,
                base.run.scale_bytes >> 20
            ));
        }
        let (rm, bm) = (r.run.reclaim_memory_bytes, base.run.reclaim_memory_bytes);
        if rm != bm && rm != 0 && bm != 0 {
            out.push(format!(
                "{} ran reclaim in {} MiB, {base_name} in {} MiB: its working sets differ",
                n.name,
                rm >> 20,
                bm >> 20
            ));
        }
        if r.run.reps != base.run.reps || r.run.max_reps != base.run.max_reps {
            out.push(format!(
                "{} ran {}..{} repetitions, {base_name} {}..{}",
                n.name, r.run.reps, r.run.max_reps, base.run.reps, base.run.max_reps
            ));
        }
        if r.host.kernel != base.host.kernel || r.host.cpus != base.host.cpus {
            out.push(format!(
                "{} ran on kernel {} with {} CPUs, {base_name} on {} with {}",
                n.name, r.host.kernel, r.host.cpus, base.host.kernel, base.host.cpus
            ));
        }
    }
    out
}

/// Runs `usermm bench compare`.
pub fn main(args: &CompareArgs) -> anyhow::Result<u8> {
    let reports = args
        .reports
        .iter()
        .map(|p| load(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let names = run_names(&args.reports, &reports);
    let differ = mismatches(&reports, &names);
    if !differ.is_empty() && !args.force {
        anyhow::bail!(
            "the reports were not run alike (--force compares them anyway):\n  {}",
            differ.join("\n  ")
        );
    }
    for m in &differ {
        eprintln!("warning: {m}");
    }
    let c = compare(&reports, names);
    if c.tables.is_empty() {
        anyhow::bail!("no table is in every report: nothing to compare");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        print!("{}", render(&c, &reports));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unpaired_interval_separates_a_shift_from_noise() {
        let a = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02];
        let same = [1.01, 0.92, 1.09, 0.96, 1.04, 1.0, 0.99];
        let slower = [2.0, 2.1, 1.9, 2.05, 1.95, 2.0, 2.02];
        let ci = shift_ci95(&a, &same).expect("interval");
        assert!(ci[0] <= 0.0 && ci[1] >= 0.0, "{ci:?}");
        let ci = shift_ci95(&a, &slower).expect("interval");
        assert!(ci[0] > 0.8 && ci[1] < 1.2, "{ci:?}");
        assert_eq!(shift_ci95(&a, &[1.0, 2.0]), None);
    }
}
