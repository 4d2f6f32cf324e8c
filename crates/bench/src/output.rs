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

fn create_parent(p: &Path) -> anyhow::Result<()> {
    if let Some(d) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    Ok(())
}

fn write_file(p: &Path, text: &str) -> anyhow::Result<()> {
    create_parent(p)?;
    std::fs::write(p, text).with_context(|| format!("cannot write {}", p.display()))
}

/// Writes every plot of the report into `dir` as `<id>.png` and `<id>.svg`.
pub fn write_plots(r: &Report, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut out = Vec::new();
    for t in &r.tables {
        for (stem, data) in plot::plots(t) {
            let svg = dir.join(format!("{stem}.svg"));
            write_file(&svg, &plot::svg(&data)?)?;
            let png = dir.join(format!("{stem}.png"));
            plot::png(&data, &png).with_context(|| format!("cannot write {}", png.display()))?;
            out.extend([png, svg]);
        }
    }
    Ok(out)
}

/// Writes the outputs; returns the files written.
pub fn write(r: &Report, o: &Outputs) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    if let Some(p) = &o.json {
        write_file(p, &r.to_json()?)?;
        written.push(p.clone());
    }
    if let Some(p) = &o.html {
        write_file(p, &html::report_html(r)?)?;
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
