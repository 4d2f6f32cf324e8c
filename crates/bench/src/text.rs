//! Plain-text rendering in the layout of mmtests' compare output (seed 004 shows it): one
//! column per variant, one line per summary statistic and row, `value (gain%)` against the
//! baseline column, then the seed's published gain and the counters that explain the
//! difference. The same cells feed the HTML tables ([`cells`]).

use crate::model::{Better, Stat, Table, Unit, VariantKind};
use crate::stats::{cell_gain, is_noise, summary};

/// One rendered line: its left label and one string per variant.
pub struct Line {
    /// `Min 64K`, `Seed 64K`, `refcount_atomics 64K`.
    pub label: String,
    /// What kind of line (for styling).
    pub kind: LineKind,
    /// One cell per variant.
    pub cells: Vec<Cell>,
}

/// One rendered cell: a value and, for engine stages, its gain over the baseline.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cell {
    /// The value, `n/a`, or empty.
    pub text: String,
    /// The gain over the baseline in percent (positive is better).
    pub gain: Option<f64>,
    /// The gain's 95 % interval contains 0: shown as `~`, never coloured.
    pub noise: bool,
}

impl Cell {
    fn plain(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            ..Cell::default()
        }
    }

    /// `value (gain%)`, `value (~gain%)` when the gain is within the noise, or the value.
    pub fn render(&self) -> String {
        let g = match self.gain {
            Some(g) if self.noise => fmt_noise(g),
            Some(g) => fmt_gain(g),
            None => return self.text.clone(),
        };
        if self.text.is_empty() {
            g
        } else {
            format!("{} {g}", self.text)
        }
    }
}

/// The kind of a rendered line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineKind {
    /// A summary statistic of the samples.
    Stat,
    /// The seed's published gain.
    Seed,
    /// A counter.
    Counter,
}

/// The display unit of the table's values.
pub fn unit_text(table: &Table) -> &'static str {
    match table.unit {
        Unit::Seconds => "ms",
        Unit::PerSecond => "per second",
        Unit::BytesPerSecond => "MiB/s",
    }
}

/// Decimals that keep a row's largest value readable (about four significant digits).
fn decimals(table: &Table, row: usize) -> usize {
    let scale = display_scale(table);
    let max = table.rows[row]
        .columns
        .iter()
        .flat_map(|c| c.samples.iter())
        .fold(0.0f64, |m, v| m.max(v * scale));
    decimals_for(max)
}

/// Decimals that print `max` with about four significant digits.
pub fn decimals_for(max: f64) -> usize {
    match max {
        m if m >= 1000.0 => 0,
        m if m >= 100.0 => 1,
        m if m >= 10.0 => 2,
        m if m >= 1.0 => 3,
        // Below 0.1 (a time per page in ms): more decimals, still about four digits.
        m if m >= 0.1 || m <= 0.0 || !m.is_finite() => 4,
        m if m >= 0.01 => 5,
        m if m >= 0.001 => 6,
        _ => 7,
    }
}

/// Multiplier from the stored unit to the display unit.
pub fn display_scale(table: &Table) -> f64 {
    match table.unit {
        Unit::Seconds => 1e3,
        Unit::PerSecond => 1.0,
        Unit::BytesPerSecond => 1.0 / (1u64 << 20) as f64,
    }
}

/// A gain as mmtests prints it: `( 43.46%)`.
pub fn fmt_gain(g: f64) -> String {
    format!("({g:6.2}%)")
}

/// A gain whose 95 % interval contains 0: `(~ 1.23%)`.
pub fn fmt_noise(g: f64) -> String {
    format!("(~{g:5.2}%)")
}

fn stat_cell(table: &Table, row: usize, col: usize, stat: Stat, dec: usize) -> Cell {
    let c = &table.rows[row].columns[col];
    if c.unavailable.is_some() {
        return Cell::plain("n/a");
    }
    let Some(v) = summary(stat, &c.samples) else {
        return Cell::plain("-");
    };
    Cell {
        text: format!("{:.dec$}", v * display_scale(table)),
        // A spread has no "better": its change is not a gain.
        gain: (stat != Stat::Stddev)
            .then(|| cell_gain(table, row, col, stat))
            .flatten(),
        noise: is_noise(c.gain_ci95_pct),
    }
}

fn seed_line(table: &Table, row: usize) -> Option<Line> {
    let r = &table.rows[row];
    if r.published.is_empty() {
        return None;
    }
    let mut cells = vec![Cell::default(); table.variants.len()];
    for p in &r.published {
        if let Some(i) = table.variant_index(&p.variant) {
            cells[i].gain = Some(p.gain_pct);
        }
    }
    Some(Line {
        label: format!("Seed {}", r.label),
        kind: LineKind::Seed,
        cells,
    })
}

/// Under a row priced with a calibrated profile: each `model:` cell's 95 % prediction
/// interval, and in the host column the model's error against the host median, `!` when it
/// is outside ±20 %.
fn model_interval_line(table: &Table, row: usize) -> Option<Line> {
    use crate::costmodel::columns::{model_error_pct, MODEL_CI_HI, MODEL_CI_LO};
    let r = &table.rows[row];
    let scale = display_scale(table);
    let mut any = false;
    let cells = table
        .variants
        .iter()
        .zip(&r.columns)
        .map(|(v, c)| match v.kind {
            VariantKind::Model => {
                match (c.counters.get(MODEL_CI_LO), c.counters.get(MODEL_CI_HI)) {
                    (Some(&lo), Some(&hi)) => {
                        any = true;
                        let shown = |ns: u64| match table.unit {
                            // A rate's interval from a time's: no lower time, no upper rate.
                            Unit::PerSecond if ns == 0 => f64::INFINITY,
                            Unit::PerSecond => 1e9 / ns as f64,
                            _ => ns as f64 * 1e-9 * scale,
                        };
                        let (a, b) = (shown(lo).min(shown(hi)), shown(lo).max(shown(hi)));
                        let dec = decimals_for(if b.is_finite() { b } else { a });
                        let b = if b.is_finite() {
                            format!("{b:.dec$}")
                        } else {
                            "inf".into()
                        };
                        Cell::plain(format!("[{a:.dec$}, {b}]"))
                    }
                    _ => Cell::default(),
                }
            }
            VariantKind::Host => match model_error_pct(table, row) {
                Some(e) => {
                    Cell::plain(format!("{e:+.0}%{}", if e.abs() > 20.0 { "!" } else { "" }))
                }
                None => Cell::default(),
            },
            _ => Cell::default(),
        })
        .collect();
    any.then(|| Line {
        label: format!("Model95 {}", r.label),
        kind: LineKind::Counter,
        cells,
    })
}

/// Under a row whose host samples fall in two speed bands ([`crate::stats::bands`]): in the
/// host column each band's median and how many samples it holds, lower band first.
fn host_bands_line(table: &Table, row: usize) -> Option<Line> {
    let h = table
        .variants
        .iter()
        .position(|v| v.kind == VariantKind::Host)?;
    let [(a, n), (b, m)] = crate::stats::bands(&table.rows[row].columns[h].samples)?;
    let scale = display_scale(table);
    let dec = decimals_for(b * scale);
    let mut cells = vec![Cell::default(); table.variants.len()];
    cells[h] = Cell::plain(format!("{:.dec$}×{n} | {:.dec$}×{m}", a * scale, b * scale));
    Some(Line {
        label: format!("Bands {}", table.rows[row].label),
        kind: LineKind::Counter,
        cells,
    })
}

/// The counters of a row that at least one cell has, one line each.
fn counter_lines(table: &Table, row: usize) -> Vec<Line> {
    let r = &table.rows[row];
    table
        .counters_shown
        .iter()
        .filter(|name| r.columns.iter().any(|c| c.counters.contains_key(*name)))
        .map(|name| Line {
            label: format!("{name} {}", r.label),
            kind: LineKind::Counter,
            cells: r
                .columns
                .iter()
                .map(|c| match (c.counters.get(name), &c.unavailable) {
                    (Some(v), _) => Cell::plain(v.to_string()),
                    (None, Some(_)) => Cell::default(),
                    (None, None) => Cell::plain("-"),
                })
                .collect(),
        })
        .collect()
}

/// Every line of the table body, row group by row group.
pub fn cells(table: &Table) -> Vec<Vec<Line>> {
    (0..table.rows.len())
        .map(|row| {
            let dec = decimals(table, row);
            let mut lines: Vec<Line> = table
                .stats
                .iter()
                .map(|&stat| Line {
                    label: format!("{} {}", stat.label(), table.rows[row].label),
                    kind: LineKind::Stat,
                    cells: (0..table.variants.len())
                        .map(|col| stat_cell(table, row, col, stat, dec))
                        .collect(),
                })
                .collect();
            lines.extend(seed_line(table, row));
            lines.extend(model_interval_line(table, row));
            lines.extend(host_bands_line(table, row));
            lines.extend(counter_lines(table, row));
            lines
        })
        .collect()
}

/// The explanation line under the title.
pub fn legend(table: &Table) -> String {
    let dir = match table.better {
        Better::Lower => "lower is better",
        Better::Higher => "higher is better",
    };
    let mut s = format!(
        "{} in {}, {dir}; (%) = gain over {} (mmtests convention: positive is better); \
         (~%) = its 95% interval (sign test of the per-repetition gains) contains 0",
        table.metric,
        unit_text(table),
        table.baseline
    );
    if table.rows.iter().any(|r| !r.published.is_empty()) {
        s.push_str("; Seed = the seed's published gain");
    }
    if table.rows.iter().any(|r| {
        r.columns.iter().any(|c| {
            c.counters
                .contains_key(crate::costmodel::columns::MODEL_CI_LO)
        })
    }) {
        s.push_str("; Model95 = the calibrated model's 95% prediction interval, and under host the model's error against the host median (! outside ±20%); a model gain's (~%) is its interval from the fitted prices");
    }
    let host = table
        .variants
        .iter()
        .position(|v| v.kind == VariantKind::Host);
    if host.is_some_and(|h| {
        table
            .rows
            .iter()
            .any(|r| crate::stats::bands(&r.columns[h].samples).is_some())
    }) {
        s.push_str("; Bands = the host's samples fell in two speed bands more than 20% apart (each band's median × its samples): the machine's memory speed changed during the row, and the host median is the band most samples fell in");
    }
    if let Some(v) = table
        .variants
        .iter()
        .find(|v| v.kind == VariantKind::Control)
    {
        s.push_str(&format!(
            "; {} = A/A control: the baseline measured again, its gain is the noise",
            v.name
        ));
    }
    s
}

/// The remarks under a table: unavailable columns, where published numbers come from, notes.
pub fn footnotes(table: &Table) -> Vec<String> {
    let mut out = Vec::new();
    for (i, v) in table.variants.iter().enumerate() {
        let why = table
            .rows
            .iter()
            .find_map(|r| r.columns.get(i).and_then(|c| c.unavailable.clone()));
        if let Some(why) = why {
            out.push(format!("{}: n/a ({why})", v.name));
        }
    }
    if let Some(src) = &table.published_source {
        out.push(format!("seed: {src}"));
    }
    out.extend(table.notes.iter().cloned());
    out
}

/// The title line.
pub fn heading(table: &Table) -> String {
    match &table.seed {
        Some(s) => format!("{}: {} (seed {s})", table.id, table.title),
        None => format!("{}: {}", table.id, table.title),
    }
}

/// The whole table as text.
pub fn render(table: &Table) -> String {
    let groups = cells(table);
    let left = groups
        .iter()
        .flatten()
        .map(|l| l.label.len())
        .max()
        .unwrap_or(0)
        .max(8)
        + 2;
    let width = groups
        .iter()
        .flatten()
        .flat_map(|l| l.cells.iter().map(|c| c.render().len()))
        .chain(table.variants.iter().map(|v| v.name.len()))
        .max()
        .unwrap_or(0)
        + 3;
    let mut out = format!("\n{}\n  {}\n", heading(table), legend(table));
    out.push_str(&format!("{:left$}", ""));
    for v in &table.variants {
        out.push_str(&format!("{:>width$}", v.name));
    }
    out.push('\n');
    let spaced = groups.len() > 1 && groups.iter().any(|g| g.len() > table.stats.len());
    for (gi, g) in groups.iter().enumerate() {
        if spaced && gi > 0 {
            out.push('\n');
        }
        for line in g {
            out.push_str(&format!("{:<left$}", line.label));
            for c in &line.cells {
                out.push_str(&format!("{:>width$}", c.render()));
            }
            out.push('\n');
        }
    }
    for f in footnotes(table) {
        out.push_str(&format!("  {f}\n"));
    }
    out
}
