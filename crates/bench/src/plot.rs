//! Plots of a table, as SVG (inlined in the HTML report) and PNG, drawn with `plotters`.
//!
//! Text is laid out with the DejaVu Sans font compiled into the binary (`ab_glyph`), so no
//! system font or fontconfig is needed. Two plots per table: the time (or rate) of every
//! variant per row with min–max whiskers on a log axis, and, where the table has stages, the
//! gain over the baseline next to the seed's published gain.

use crate::model::{Stat, Table, VariantKind};
use crate::stats::{cell_gain, summary};
use crate::text::{display_scale, unit_text};
use plotters::coord::ranged1d::{SegmentValue, SegmentedCoord};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::sync::Once;

/// Pixel size of every plot.
pub const SIZE: (u32, u32) = (960, 540);
const FONT: &str = "sans-serif";

/// One line of a plot: a value (with a min–max range) per x category.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// `(x index, low, value, high)`.
    pub points: Vec<(usize, f64, f64, f64)>,
    /// Draw as markers only (published numbers).
    pub markers_only: bool,
}

/// Everything needed to draw one plot.
#[derive(Clone, Debug)]
pub struct PlotData {
    /// Caption.
    pub title: String,
    /// Category names along x.
    pub x_labels: Vec<String>,
    /// What x is.
    pub x_desc: String,
    /// What y is.
    pub y_desc: String,
    /// Logarithmic y axis.
    pub log_y: bool,
    /// The lines.
    pub series: Vec<Series>,
    /// x indexes that start a new group of rows (another `layout`): lines are not drawn
    /// across them, since the rows on either side measure different kinds of memory.
    pub breaks: Vec<usize>,
}

/// Where a table's rows change `layout` (see [`PlotData::breaks`]).
fn layout_breaks(table: &Table) -> Vec<usize> {
    if table.rows.len() < 2 {
        return Vec::new();
    }
    (1..table.rows.len())
        .filter(|&i| table.rows[i].layout != table.rows[i - 1].layout)
        .collect()
}

static FONTS: Once = Once::new();

/// Registers the embedded font once per process.
fn ensure_fonts() {
    FONTS.call_once(|| {
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold());
    });
}

/// The statistic plotted: the median, or the mean when the table shows none.
fn headline_stat(table: &Table) -> Stat {
    if table.stats.contains(&Stat::Median) {
        Stat::Median
    } else {
        Stat::Mean
    }
}

/// `(min, headline, max)` of samples in display units.
fn spread(table: &Table, samples: &[f64]) -> Option<(f64, f64, f64)> {
    let scale = display_scale(table);
    Some((
        summary(Stat::Min, samples)? * scale,
        summary(headline_stat(table), samples)? * scale,
        summary(Stat::Max, samples)? * scale,
    ))
}

/// What x is: the row parameter, or the variants of a single-row table.
fn x_desc(table: &Table) -> String {
    if table.rows.len() == 1 {
        "variant".into()
    } else {
        table.row_label.clone()
    }
}

/// One row: the engine variants as one line along the variants, the host beside it.
fn value_series_single_row(table: &Table) -> (Vec<String>, Vec<Series>) {
    let r = &table.rows[0];
    let points = |kind: VariantKind| -> Vec<(usize, f64, f64, f64)> {
        r.columns
            .iter()
            .enumerate()
            .filter(|(i, _)| table.variants.get(*i).map(|v| v.kind) == Some(kind))
            .filter_map(|(i, c)| spread(table, &c.samples).map(|(a, b, d)| (i, a, b, d)))
            .collect()
    };
    let name = format!(
        "{} {}",
        headline_stat(table).label().to_lowercase(),
        r.label
    );
    let labels = table.variants.iter().map(|v| v.name.clone()).collect();
    let series = vec![
        Series {
            name,
            points: points(VariantKind::Engine),
            markers_only: false,
        },
        Series {
            name: "host".into(),
            points: points(VariantKind::Host),
            markers_only: false,
        },
    ];
    (
        labels,
        series
            .into_iter()
            .filter(|s| !s.points.is_empty())
            .collect(),
    )
}

/// Several rows: one series per variant along the rows.
fn value_series_per_variant(table: &Table) -> (Vec<String>, Vec<Series>) {
    let labels = table.rows.iter().map(|r| r.label.clone()).collect();
    let series = (0..table.variants.len())
        .map(|i| Series {
            name: table.variants[i].name.clone(),
            points: table
                .rows
                .iter()
                .enumerate()
                .filter_map(|(x, r)| {
                    let (a, b, d) = spread(table, &r.columns.get(i)?.samples)?;
                    Some((x, a, b, d))
                })
                .collect(),
            markers_only: false,
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    (labels, series)
}

/// The time/rate plot: one series per measured variant.
pub fn value_plot(table: &Table) -> PlotData {
    let (x_labels, series) = if table.rows.len() == 1 {
        value_series_single_row(table)
    } else {
        value_series_per_variant(table)
    };
    let stat = headline_stat(table).label().to_lowercase();
    PlotData {
        title: format!("{} ({stat}, whiskers min..max)", table.title),
        breaks: if table.rows.len() == 1 {
            Vec::new()
        } else {
            layout_breaks(table)
        },
        x_labels,
        x_desc: x_desc(table),
        y_desc: format!("{} ({})", table.metric, unit_text(table)),
        log_y: true,
        series,
    }
}

/// Engine variants other than the baseline.
fn stage_columns(table: &Table) -> Vec<usize> {
    let base = table.baseline_index();
    (0..table.variants.len())
        .filter(|&i| table.variants[i].kind == VariantKind::Engine && Some(i) != base)
        .collect()
}

/// The published gain of variant `col` in row `row`.
fn published_gain(table: &Table, row: usize, col: usize) -> Option<f64> {
    let name = &table.variants.get(col)?.name;
    let p = table
        .rows
        .get(row)?
        .published
        .iter()
        .find(|p| &p.variant == name)?;
    Some(p.gain_pct)
}

/// A series of gains at `(x, gain)` points.
fn gain_series(name: String, points: impl Iterator<Item = (usize, f64)>, seed: bool) -> Series {
    Series {
        name,
        points: points.map(|(x, g)| (x, g, g, g)).collect(),
        markers_only: seed,
    }
}

/// One row: ours and the seed's along the stages.
fn gain_series_single_row(table: &Table, stages: &[usize]) -> (Vec<String>, Vec<Series>) {
    let stat = headline_stat(table);
    let labels = stages
        .iter()
        .map(|&i| table.variants[i].name.clone())
        .collect();
    let ours = stages
        .iter()
        .enumerate()
        .filter_map(|(x, &i)| Some((x, cell_gain(table, 0, i, stat)?)));
    let seed = stages
        .iter()
        .enumerate()
        .filter_map(|(x, &i)| Some((x, published_gain(table, 0, i)?)));
    let series = vec![
        gain_series("usermm".into(), ours, false),
        gain_series("seed (published)".into(), seed, true),
    ];
    (labels, series)
}

/// Several rows: for each stage with published numbers (else every stage), ours and the
/// seed's along the rows.
fn gain_series_per_stage(table: &Table, stages: &[usize]) -> (Vec<String>, Vec<Series>) {
    let stat = headline_stat(table);
    let rows = 0..table.rows.len();
    let seeded: Vec<usize> = stages
        .iter()
        .copied()
        .filter(|&i| rows.clone().any(|r| published_gain(table, r, i).is_some()))
        .collect();
    let shown = if seeded.is_empty() {
        stages
    } else {
        &seeded[..]
    };
    let mut series = Vec::new();
    for &i in shown {
        let name = &table.variants[i].name;
        let ours = rows
            .clone()
            .filter_map(|x| Some((x, cell_gain(table, x, i, stat)?)));
        series.push(gain_series(format!("{name} (usermm)"), ours, false));
        let seed = rows
            .clone()
            .filter_map(|x| Some((x, published_gain(table, x, i)?)));
        series.push(gain_series(format!("{name} (seed, published)"), seed, true));
    }
    (table.rows.iter().map(|r| r.label.clone()).collect(), series)
}

/// The gain plot: ours against the seed's published gain; `None` without stages.
pub fn gain_plot(table: &Table) -> Option<PlotData> {
    let stages = stage_columns(table);
    if stages.is_empty() || table.rows.is_empty() {
        return None;
    }
    let (x_labels, mut series) = if table.rows.len() == 1 {
        gain_series_single_row(table, &stages)
    } else {
        gain_series_per_stage(table, &stages)
    };
    series.retain(|s| !s.points.is_empty());
    Some(PlotData {
        title: format!("{}: gain over {}", table.title, table.baseline),
        breaks: if table.rows.len() == 1 {
            Vec::new()
        } else {
            layout_breaks(table)
        },
        x_labels,
        x_desc: x_desc(table),
        y_desc: format!("gain over {} (%), positive is better", table.baseline),
        log_y: false,
        series,
    })
}

fn y_bounds(data: &PlotData) -> (f64, f64) {
    let vals = data
        .series
        .iter()
        .flat_map(|s| s.points.iter().flat_map(|p| [p.1, p.3]))
        .filter(|v| v.is_finite());
    let (lo, hi) = vals.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
        (a.min(v), b.max(v))
    });
    if !lo.is_finite() {
        return if data.log_y {
            (0.1, 10.0)
        } else {
            (-10.0, 10.0)
        };
    }
    if data.log_y {
        let lo = if lo > 0.0 { lo } else { hi.max(1e-9) * 1e-3 };
        (lo / 1.6, hi * 1.6)
    } else {
        let pad = ((hi - lo).abs() * 0.1).max(2.0);
        (lo.min(0.0) - pad, hi.max(0.0) + pad)
    }
}

fn fmt_tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

type Err = anyhow::Error;

fn perr<E: std::fmt::Display>(e: E) -> Err {
    anyhow::anyhow!("plot: {e}")
}

/// Tick label size: 13, smaller when the category labels would not fit their slots (about
/// 900 px of plot width shared by the categories, ~7 px per character at size 13).
fn x_label_font(labels: &[String], n: usize) -> u32 {
    let widest = labels
        .iter()
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(1)
        .max(1);
    let per_slot = 900 / n.max(1);
    (per_slot * 13 / (widest * 7 + 6)).clamp(9, 13) as u32
}

/// Configures and draws the mesh of a chart (log or linear y).
macro_rules! mesh {
    ($chart:expr, $data:expr, $n:expr, $xfmt:expr, $yfmt:expr) => {
        $chart
            .configure_mesh()
            .x_labels($n as usize)
            .y_labels(12)
            .x_label_formatter($xfmt)
            .y_label_formatter($yfmt)
            .x_desc($data.x_desc.as_str())
            .y_desc($data.y_desc.as_str())
            .label_style((FONT, 13))
            .x_label_style((FONT, x_label_font(&$data.x_labels, $n as usize)))
            .axis_desc_style((FONT, 14))
            .disable_x_mesh()
            .light_line_style(WHITE)
            .draw()
            .map_err(perr)
    };
}

/// Draws `data` on `root`.
fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, data: &PlotData) -> Result<(), Err> {
    ensure_fonts();
    root.fill(&WHITE).map_err(perr)?;
    let n = data.x_labels.len().max(1) as i32;
    // A discrete i32 range includes its end: 0..last gives one segment per category.
    let last = (n - 1).max(1);
    let (lo, hi) = y_bounds(data);
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(&data.title, (FONT, 18))
        .margin(14)
        .x_label_area_size(46)
        .y_label_area_size(72);
    let labels = data.x_labels.clone();
    let xfmt = move |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
        _ => String::new(),
    };
    let yfmt = |v: &f64| fmt_tick(*v);
    let x = (0..last).into_segmented();
    if data.log_y {
        let mut chart = builder
            .build_cartesian_2d(x, (lo..hi).log_scale())
            .map_err(perr)?;
        mesh!(chart, data, n, &xfmt, &yfmt)?;
        draw_series(&mut chart, data)
    } else {
        let mut chart = builder.build_cartesian_2d(x, lo..hi).map_err(perr)?;
        mesh!(chart, data, n, &xfmt, &yfmt)?;
        let zero = [
            (SegmentValue::Exact(0), 0.0),
            (SegmentValue::Exact(last + 1), 0.0),
        ];
        chart
            .draw_series(LineSeries::new(zero, BLACK.mix(0.5)))
            .map_err(perr)?;
        draw_series(&mut chart, data)
    }
}

/// Tableau-10 colours; the host kernel's line is black.
fn series_color(k: usize, name: &str) -> RGBAColor {
    const TAB10: [(u8, u8, u8); 10] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
    ];
    if name == "host" {
        return BLACK.to_rgba();
    }
    let (r, g, b) = TAB10[k % TAB10.len()];
    RGBColor(r, g, b).to_rgba()
}

/// Draws every series with markers, whiskers and a legend.
fn draw_series<'a, DB, Y>(
    chart: &mut ChartContext<
        'a,
        DB,
        Cartesian2d<SegmentedCoord<plotters::coord::types::RangedCoordi32>, Y>,
    >,
    data: &PlotData,
) -> Result<(), Err>
where
    DB: DrawingBackend + 'a,
    Y: Ranged<ValueType = f64>,
{
    for (k, s) in data.series.iter().enumerate() {
        let color = series_color(k, &s.name);
        let at = |p: &(usize, f64, f64, f64)| (SegmentValue::CenterOf(p.0 as i32), p.2);
        if s.markers_only {
            chart
                .draw_series(
                    s.points
                        .iter()
                        .map(|p| Cross::new(at(p), 7, color.stroke_width(3))),
                )
                .map_err(perr)?
                .label(s.name.clone())
                .legend(move |(x, y)| Cross::new((x + 8, y), 6, color.stroke_width(3)));
            continue;
        }
        // One line per group of rows: no line across a layout break.
        let mut runs: Vec<Vec<(SegmentValue<i32>, f64)>> = Vec::new();
        for (j, p) in s.points.iter().enumerate() {
            let new_run = j == 0
                || data
                    .breaks
                    .iter()
                    .any(|&b| s.points[j - 1].0 < b && b <= p.0);
            if new_run {
                runs.push(Vec::new());
            }
            if let Some(r) = runs.last_mut() {
                r.push(at(p));
            }
        }
        for (j, run) in runs.into_iter().enumerate() {
            let drawn = chart
                .draw_series(LineSeries::new(run, color.stroke_width(2)))
                .map_err(perr)?;
            if j == 0 {
                drawn.label(s.name.clone()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            }
        }
        chart
            .draw_series(
                s.points
                    .iter()
                    .map(|p| Circle::new(at(p), 4, color.filled())),
            )
            .map_err(perr)?;
        chart
            .draw_series(s.points.iter().filter(|p| p.1 != p.3).map(|p| {
                ErrorBar::new_vertical(
                    SegmentValue::CenterOf(p.0 as i32),
                    p.1,
                    p.2,
                    p.3,
                    color.stroke_width(1),
                    8,
                )
            }))
            .map_err(perr)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 13))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(perr)?;
    Ok(())
}

/// The plot as an SVG document.
pub fn svg(data: &PlotData) -> Result<String, Err> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        draw(&root, data)?;
        root.present().map_err(perr)?;
    }
    Ok(out)
}

/// The plot as PNG bytes (drawn in memory; the caller writes the file).
pub fn png(data: &PlotData) -> Result<Vec<u8>, Err> {
    use image::ImageEncoder;
    let (w, h) = SIZE;
    let mut rgb = vec![0u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area();
        draw(&root, data)?;
        root.present().map_err(perr)?;
    }
    let mut out = Vec::new();
    image::codecs::png::PngEncoder::new(&mut out)
        .write_image(&rgb, w, h, image::ColorType::Rgb8)
        .map_err(perr)?;
    Ok(out)
}

/// The plots of a table: `(file stem, data)`.
pub fn plots(table: &Table) -> Vec<(String, PlotData)> {
    let mut v = vec![(table.id.clone(), value_plot(table))];
    if let Some(g) = gain_plot(table) {
        v.push((format!("{}-gain", table.id), g));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The caption is drawn with the embedded font: dark pixels in the top band of an
    /// otherwise white bitmap, with no system font involved.
    #[test]
    fn bitmap_text_uses_the_embedded_font() {
        let data = PlotData {
            title: "caption".into(),
            x_labels: vec!["a".into(), "b".into()],
            x_desc: "x".into(),
            y_desc: "y".into(),
            log_y: true,
            series: vec![Series {
                name: "s".into(),
                points: vec![(0, 1.0, 2.0, 3.0), (1, 2.0, 3.0, 4.0)],
                markers_only: false,
            }],
            breaks: vec![],
        };
        let (w, h) = SIZE;
        let mut buf = vec![0u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area();
            draw(&root, &data).expect("draw");
            root.present().expect("present");
        }
        let band = &buf[..(w * 40 * 3) as usize];
        let dark = band
            .chunks(3)
            .filter(|p| p.iter().all(|&c| c < 128))
            .count();
        assert!(dark > 20, "caption not drawn ({dark} dark pixels)");
    }
}
