//! Writing a report: JSON, the HTML page, and every plot as PNG and SVG.

use crate::model::Report;
use crate::{html, plot};
use anyhow::Context;
use std::path::{Path, PathBuf};

/// Where each output goes; `None` skips it.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    /// The JSON report.
    pub json: Option<PathBuf>,
    /// The HTML report.
    pub html: Option<PathBuf>,
    /// The directory of the PNG and SVG plots.
    pub plots: Option<PathBuf>,
}

impl Outputs {
    /// `report.json`, `report.html` and `plots/` in `dir`.
    pub fn in_dir(dir: &Path) -> Outputs {
        Outputs {
            json: Some(dir.join("report.json")),
            html: Some(dir.join("report.html")),
            plots: Some(dir.join("plots")),
        }
    }
}

/// Writes `bytes` to `p` without following a link or writing into a directory another user
/// controls (see [`oracle::output`]); missing directories are created.
fn write_file(p: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    oracle::output::write_file(p, bytes).with_context(|| format!("cannot write {}", p.display()))
}

/// Checks, before a benchmark runs, that every output can be written: each directory is
/// reached safely (and created if missing). A path that would be refused at the end fails
/// now instead of after the run.
pub fn check(o: &Outputs) -> anyhow::Result<()> {
    let parent = |p: &Path| match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let dirs = [
        o.json.as_deref().map(parent),
        o.html.as_deref().map(parent),
        o.plots.clone(),
    ];
    for d in dirs.into_iter().flatten() {
        oracle::output::open_dir(&d, true)
            .with_context(|| format!("cannot write into {}", d.display()))?;
    }
    Ok(())
}

/// Writes every plot of the report into `dir` as `<id>.png` and `<id>.svg`.
pub fn write_plots(r: &Report, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for t in &r.tables {
        for (stem, data) in plot::plots(t) {
            let svg = dir.join(format!("{stem}.svg"));
            write_file(&svg, plot::svg(&data)?.as_bytes())?;
            let png = dir.join(format!("{stem}.png"));
            write_file(&png, &plot::png(&data)?)?;
            out.extend([png, svg]);
        }
    }
    Ok(out)
}

/// Writes the outputs; returns the files written.
pub fn write(r: &Report, o: &Outputs) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    if let Some(p) = &o.json {
        write_file(p, r.to_json()?.as_bytes())?;
        written.push(p.clone());
    }
    if let Some(p) = &o.html {
        write_file(p, html::report_html(r)?.as_bytes())?;
        written.push(p.clone());
    }
    if let Some(d) = &o.plots {
        written.extend(write_plots(r, d)?);
    }
    Ok(written)
}

/// The default output directory: `target/usermm-bench` of the workspace the binary was
/// built in (found from the executable's path), else `target/usermm-bench` here.
pub fn default_dir() -> PathBuf {
    let from_exe = std::env::current_exe().ok().and_then(|exe| {
        let target = exe.parent()?.parent()?;
        (target.file_name()? == "target").then(|| target.join("usermm-bench"))
    });
    from_exe.unwrap_or_else(|| PathBuf::from("target/usermm-bench"))
}
