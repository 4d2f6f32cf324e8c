//! `usermm bench replay [TRACE…] [--json]`: the shipped real-program traces (`traces/*.umt`,
//! recorded on a host with `usermm record`) replayed on the engine under the seeds' switches
//! and mTHP policies. One table per trace: columns are the variants (the recorded 4K policy
//! with every seed at its modern default first, then one switch changed at a time, then 64K
//! mTHP), rows are the engine's exact counters, the replay time, and the RssAnon summed over
//! the recorded exits beside the host's. A summary table has one row per trace.

use std::path::{Path, PathBuf};
use trace::{ReplayOptions, ReplayReport};
use usermm::Ev;

/// Arguments of `usermm bench replay`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplayArgs {
    /// Trace files (default: every `traces/*.umt` of the repository).
    pub traces: Vec<PathBuf>,
    /// Print one JSON document on standard output instead of the tables.
    #[arg(long)]
    pub json: bool,
    /// Replays per variant (the time row is the fastest; counters are identical).
    #[arg(long, default_value_t = 1)]
    pub reps: usize,
}

/// One column: a name, tunables, THP settings.
pub struct Variant {
    /// Column name.
    pub name: &'static str,
    /// Tunables.
    pub tunables: &'static [(&'static str, &'static str)],
    /// THP settings over the recorded policy.
    pub thp: &'static [(&'static str, &'static str)],
}

/// The columns, baseline first.
pub const VARIANTS: &[Variant] = &[
    Variant {
        name: "4K",
        tunables: &[],
        thp: &[],
    },
    Variant {
        name: "fork=per-pte",
        tunables: &[("fork_pte_batch", "per-pte")],
        thp: &[],
    },
    Variant {
        name: "zap=per-pte",
        tunables: &[("zap_pte_batch", "per-pte")],
        thp: &[],
    },
    Variant {
        name: "tree=insert",
        tunables: &[("vma_tree_dup", "insert")],
        thp: &[],
    },
    Variant {
        name: "munlock=stage0",
        tunables: &[("munlock", "stage0")],
        thp: &[],
    },
    Variant {
        name: "64K=always",
        tunables: &[],
        thp: &[("64K", "always")],
    },
    Variant {
        name: "64K,per-pte",
        tunables: &[("fork_pte_batch", "per-pte"), ("zap_pte_batch", "per-pte")],
        thp: &[("64K", "always")],
    },
];

/// The counter rows.
pub const ROWS: &[(&str, &[Ev])] = &[
    ("faults", &[Ev::Fault]),
    ("faults_anon_mthp", &[Ev::FaultAnonMthp]),
    ("cow_copies", &[Ev::CowCopy]),
    ("cow_reuses", &[Ev::CowReuse]),
    ("frames_allocated", &[Ev::FramesAlloc]),
    ("fork_batches", &[Ev::ForkBatches]),
    ("fork_ptes", &[Ev::ForkPtes]),
    ("zap_batches", &[Ev::ZapBatches]),
    ("zap_ptes", &[Ev::ZapPtes]),
    ("pte_writes", &[Ev::PteWrite]),
    (
        "tlb_flushes",
        &[Ev::TlbFlushPage, Ev::TlbFlushRange, Ev::TlbFlushMm],
    ),
    ("vma_nodes_allocated", &[Ev::VmaNodeAlloc]),
    ("refcount_atomics", &[Ev::RefcountAtomic]),
    ("mapcount_atomics", &[Ev::MapcountAtomic]),
];

/// The repository's shipped traces.
pub fn default_traces() -> Vec<PathBuf> {
    let candidates = [
        PathBuf::from("traces"),
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces"),
    ];
    for d in candidates {
        if let Ok(rd) = std::fs::read_dir(&d) {
            let mut v: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "umt"))
                .collect();
            if !v.is_empty() {
                v.sort();
                return v;
            }
        }
    }
    Vec::new()
}

fn opts(v: &Variant) -> ReplayOptions {
    ReplayOptions {
        tunables: v
            .tunables
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        thp: v
            .thp
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn value(r: &ReplayReport, evs: &[Ev]) -> u64 {
    evs.iter().map(|&e| r.snapshot.get(e)).sum()
}

/// One trace under every variant.
pub struct TraceTable {
    /// Trace name (file stem).
    pub name: String,
    /// Events.
    pub events: u64,
    /// File bytes.
    pub bytes: u64,
    /// Host RssAnon summed over recorded exits (kB).
    pub host_rss_anon_kb: u64,
    /// One report per variant.
    pub reports: Vec<ReplayReport>,
}

fn run_trace(path: &Path, reps: usize) -> anyhow::Result<TraceTable> {
    let t = trace::read_file(path)?;
    let mut reports = Vec::new();
    for v in VARIANTS {
        let mut best: Option<ReplayReport> = None;
        for _ in 0..reps.max(1) {
            let r = trace::replay(&t, &opts(v))?;
            if best
                .as_ref()
                .is_none_or(|b| r.wall_seconds < b.wall_seconds)
            {
                best = Some(r);
            }
        }
        reports.extend(best);
    }
    Ok(TraceTable {
        name: path
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned()),
        events: t.events.len() as u64,
        bytes: t.file_bytes,
        host_rss_anon_kb: reports
            .first()
            .map_or(0, |r| r.rss.iter().map(|c| c.host_anon_kb).sum()),
        reports,
    })
}

fn engine_rss(r: &ReplayReport) -> u64 {
    r.rss.iter().map(|c| c.engine_anon_kb).sum()
}

fn gain(base: u64, v: u64) -> String {
    if base == 0 || base == v {
        String::new()
    } else {
        format!(" ({:+.0}%)", (v as f64 - base as f64) / base as f64 * 100.0)
    }
}

fn render(t: &TraceTable) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nreplay {}: {} events, {} bytes ({:.2} bytes/event), host RssAnon at exits {} kB",
        t.name,
        t.events,
        t.bytes,
        t.bytes as f64 / t.events.max(1) as f64,
        t.host_rss_anon_kb
    );
    let w = 22;
    let _ = write!(s, "{:<20}", "");
    for v in VARIANTS {
        let _ = write!(s, "{:>w$}", v.name);
    }
    let _ = writeln!(s);
    let mut line = |label: &str, vals: Vec<u64>| {
        let _ = write!(s, "{label:<20}");
        let base = vals[0];
        for v in vals {
            let _ = write!(s, "{:>w$}", format!("{v}{}", gain(base, v)));
        }
        let _ = writeln!(s);
    };
    for (label, evs) in ROWS {
        line(label, t.reports.iter().map(|r| value(r, evs)).collect());
    }
    line("rss_anon_kb", t.reports.iter().map(engine_rss).collect());
    line(
        "errno_mismatches",
        t.reports.iter().map(|r| r.errno_mismatches).collect(),
    );
    let _ = write!(s, "{:<20}", "replay_ms");
    for r in &t.reports {
        let _ = write!(s, "{:>w$.2}", r.wall_seconds * 1e3);
    }
    let _ = writeln!(s);
    s
}

fn json(tables: &[TraceTable]) -> serde_json::Value {
    let summary: Vec<_> = tables
        .iter()
        .map(|t| {
            let b = &t.reports[0];
            serde_json::json!({
                "trace": t.name,
                "events": t.events,
                "bytes": t.bytes,
                "bytes_per_event": t.bytes as f64 / t.events.max(1) as f64,
                "host_rss_anon_kb": t.host_rss_anon_kb,
                "engine_rss_anon_kb": engine_rss(b),
                "host_rss_file_kb": b.rss.iter().map(|c| c.host_file_kb).sum::<u64>(),
                "engine_rss_file_kb": b.rss.iter().map(|c| c.engine_file_kb).sum::<u64>(),
                "max_rss_anon_rel_err": b.max_anon_err(),
                "errno_mismatches": b.errno_mismatches,
                "events_per_sec": b.events_per_sec,
            })
        })
        .collect();
    let per_trace: Vec<_> = tables
        .iter()
        .map(|t| {
            let rows: serde_json::Map<String, serde_json::Value> = ROWS
                .iter()
                .map(|(label, evs)| {
                    let v: Vec<u64> = t.reports.iter().map(|r| value(r, evs)).collect();
                    (label.to_string(), serde_json::json!(v))
                })
                .chain([
                    (
                        "rss_anon_kb".to_string(),
                        serde_json::json!(t.reports.iter().map(engine_rss).collect::<Vec<_>>()),
                    ),
                    (
                        "replay_seconds".to_string(),
                        serde_json::json!(t
                            .reports
                            .iter()
                            .map(|r| r.wall_seconds)
                            .collect::<Vec<_>>()),
                    ),
                ])
                .collect();
            serde_json::json!({
                "trace": t.name,
                "host_rss_anon_kb": t.host_rss_anon_kb,
                "columns": VARIANTS.iter().map(|v| v.name).collect::<Vec<_>>(),
                "rows": rows,
            })
        })
        .collect();
    serde_json::json!({
        "schema": "usermm-bench-replay/1",
        "summary": summary,
        "tables": per_trace,
    })
}

/// Runs `usermm bench replay`.
pub fn main(a: &ReplayArgs) -> anyhow::Result<u8> {
    let paths = if a.traces.is_empty() {
        default_traces()
    } else {
        a.traces.clone()
    };
    anyhow::ensure!(
        !paths.is_empty(),
        "no traces given and no traces/*.umt found"
    );
    let mut tables = Vec::new();
    for p in &paths {
        let t = run_trace(p, a.reps)?;
        if !a.json {
            print!("{}", render(&t));
        }
        tables.push(t);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&json(&tables))?);
    } else {
        println!(
            "\n{:<16}{:>8}{:>10}{:>12}{:>12}{:>12}{:>12}{:>8}{:>9}",
            "summary",
            "events",
            "bytes/ev",
            "host anon",
            "engine anon",
            "host file",
            "engine file",
            "errno≠",
            "M ev/s"
        );
        for t in &tables {
            let b = &t.reports[0];
            let file = |f: fn(&trace::replay::RssCheck) -> u64| b.rss.iter().map(f).sum::<u64>();
            println!(
                "{:<16}{:>8}{:>10.2}{:>12}{:>12}{:>12}{:>12}{:>8}{:>9.3}",
                t.name,
                t.events,
                t.bytes as f64 / t.events.max(1) as f64,
                t.host_rss_anon_kb,
                engine_rss(b),
                file(|c| c.host_file_kb),
                file(|c| c.engine_file_kb),
                b.errno_mismatches,
                b.events_per_sec / 1e6
            );
        }
        println!("(RSS in kB, summed over the recorded process exits)");
    }
    Ok(0)
}
