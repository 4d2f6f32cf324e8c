//! One self-contained HTML report: every table as an HTML table in the mmtests layout, every
//! plot inlined as SVG, the CSS inline, no external resource. A three-line script counts the
//! tables into `<body data-report-ok=N>`, so a headless browser that dumps the DOM proves
//! that the page loaded and its script ran without an error.

use crate::model::{Report, Table};
use crate::plot;
use crate::text::{cells, footnotes, heading, legend, Cell, LineKind};
use std::fmt::Write;

const STYLE: &str = "
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1400px;color:#222;padding:0 1em}
h1{margin-bottom:.2em} h2{margin-top:2.2em;border-bottom:1px solid #ccc}
table.mmtests{border-collapse:collapse;font-family:ui-monospace,monospace;font-size:13px}
table.mmtests th,table.mmtests td{padding:2px 10px;text-align:right;white-space:nowrap}
table.mmtests th.left{text-align:left}
table.mmtests thead th{border-bottom:2px solid #888;position:sticky;top:0;background:#fff}
table.mmtests tbody{border-top:1px solid #ccc}
tr.seed td{color:#6a3d9a;font-style:italic} tr.counter td,tr.counter th{color:#555}
td.host{background:#f4f8ff} .up{color:#1a7f37} .down{color:#c62828} .noise{color:#777}
.legend{color:#555;font-size:14px} ul.notes{font-size:13px;color:#444}
figure{margin:1em 0} figure svg{max-width:100%;height:auto}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:2px 14px}
dl.meta dt{font-weight:bold}
";

/// Escapes text for HTML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn cell_html(c: &Cell, host: bool) -> String {
    let class = if host { " class=\"host\"" } else { "" };
    let gain = match c.gain {
        Some(g) if c.noise => {
            format!(" <span class=\"noise\" title=\"95% interval contains 0\">(~{g:.2}%)</span>")
        }
        Some(g) => {
            let cls = if g >= 0.0 { "up" } else { "down" };
            format!(" <span class=\"{cls}\">({g:.2}%)</span>")
        }
        None => String::new(),
    };
    format!("<td{class}>{}{gain}</td>", esc(&c.text))
}

/// The `<table>` of one benchmark table.
pub fn table_html(t: &Table) -> String {
    let mut s = format!(
        "<table class=\"mmtests\" id=\"table-{}\">\n<thead><tr><th class=\"left\"></th>",
        esc(&t.id)
    );
    for v in &t.variants {
        let _ = write!(s, "<th title=\"{}\">{}</th>", esc(&v.about), esc(&v.name));
    }
    s.push_str("</tr></thead>\n");
    let host: Vec<bool> = t
        .variants
        .iter()
        .map(|v| v.kind == crate::model::VariantKind::Host)
        .collect();
    for group in cells(t) {
        s.push_str("<tbody>\n");
        for line in group {
            let cls = match line.kind {
                LineKind::Stat => "stat",
                LineKind::Seed => "seed",
                LineKind::Counter => "counter",
            };
            let _ = write!(
                s,
                "<tr class=\"{cls}\"><th class=\"left\">{}</th>",
                esc(&line.label)
            );
            for (i, c) in line.cells.iter().enumerate() {
                s.push_str(&cell_html(c, host.get(i).copied().unwrap_or(false)));
            }
            s.push_str("</tr>\n");
        }
        s.push_str("</tbody>\n");
    }
    s.push_str("</table>\n");
    s
}

/// The section of one table: heading, legend, table, notes, plots.
fn section(t: &Table) -> anyhow::Result<String> {
    let mut s = format!(
        "<section id=\"{}\" class=\"bench\">\n<h2>{}</h2>\n<p class=\"legend\">{}</p>\n",
        esc(&t.id),
        esc(&heading(t)),
        esc(&legend(t))
    );
    s.push_str(&table_html(t));
    let notes = footnotes(t);
    if !notes.is_empty() {
        s.push_str("<ul class=\"notes\">\n");
        for n in notes {
            let _ = writeln!(s, "<li>{}</li>", esc(&n));
        }
        s.push_str("</ul>\n");
    }
    for (stem, data) in plot::plots(t) {
        let svg = plot::svg(&data)?;
        let _ = writeln!(s, "<figure id=\"plot-{}\">{svg}</figure>", esc(&stem));
    }
    s.push_str("</section>\n");
    Ok(s)
}

fn meta(r: &Report) -> String {
    let rows = [
        ("generator", r.generator.clone()),
        ("git commit", r.meta.git_commit.clone()),
        ("started (Unix time)", r.meta.started_unix.to_string()),
        ("command line", r.meta.command_line.clone()),
        ("CPU model", r.meta.cpu_model.clone()),
        ("load average at start", r.meta.loadavg.clone()),
        ("benchmarks", r.run.which.clone()),
        ("layout size", format!("{} MiB", r.run.scale_bytes >> 20)),
        (
            "repetitions",
            if r.run.max_reps > r.run.reps {
                format!(
                    "{} to {} (more while a gain's interval is wider than {} points)",
                    r.run.reps, r.run.max_reps, r.run.tight_pp
                )
            } else {
                r.run.reps.to_string()
            },
        ),
        ("spawn seconds per point", r.run.spawn_seconds.to_string()),
        ("kernel", r.host.kernel.clone()),
        (
            "CPUs / NUMA nodes",
            format!("{} / {}", r.host.cpus, r.host.numa_nodes),
        ),
        ("host-kernel columns", r.host.host_columns.clone()),
        ("wall time", format!("{:.1} s", r.wall_seconds)),
        ("JSON schema", format!("version {}", r.schema_version)),
    ];
    let mut s = String::from("<dl class=\"meta\">\n");
    for (k, v) in rows {
        let _ = writeln!(s, "<dt>{}</dt><dd>{}</dd>", esc(k), esc(&v));
    }
    s.push_str("</dl>\n");
    s
}

/// The whole report page.
pub fn report_html(r: &Report) -> anyhow::Result<String> {
    let mut s = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>usermm bench report</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>usermm bench</h1>\n<p class=\"legend\">Engine variants and the host kernel \
         side by side in one run. Times are per operation; (%) is the gain over the \
         baseline column as mmtests prints it (positive is better); Seed rows are the \
         published gains of the seed's cover letter; counters are exact per repetition.</p>\n"
    );
    s.push_str(&meta(r));
    s.push_str("<nav><ul>\n");
    for t in &r.tables {
        let _ = writeln!(
            s,
            "<li><a href=\"#{}\">{}</a></li>",
            esc(&t.id),
            esc(&heading(t))
        );
    }
    s.push_str("</ul></nav>\n");
    for t in &r.tables {
        s.push_str(&section(t)?);
    }
    s.push_str(
        "<script>\n(function(){var n=document.querySelectorAll('table.mmtests').length;\
         document.body.setAttribute('data-report-ok',String(n));})();\n</script>\n</body>\n</html>\n",
    );
    Ok(s)
}
