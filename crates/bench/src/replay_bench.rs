//! `usermm bench replay [TRACE…] [--json] [--profile FILE]`: the shipped real-program traces
//! (`traces/*.umt`, recorded on a host with `usermm record`) replayed on the engine under the
//! seeds' switches at three folio policies. One table per trace and policy: the policy's
//! baseline (4K: the recorded policy, THP `never` everywhere; 64K: 64K mTHP `always`; 2M:
//! PMD THP `always`; every seed at its modern default) first, then one switch changed at a
//! time ([`SWITCHES`], each at the policies where it can change anything). Rows are the
//! engine's exact counters, RssAnon summed over the recorded exits, errno mismatches, faults
//! answered by a signal, the replay time, and, with a calibrated profile, the `model:` rows:
//! the kernel's predicted mm time of the workload with its 95 % interval and the predicted
//! gain over the policy's baseline (a policy's baseline: over the 4K baseline), see
//! [`crate::replay_model`]. A closing list per trace reads each switch's predicted effect at
//! each policy; a summary table has one row per trace.

use crate::replay_model::{self, ModelCell, ModelProfile};
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
    /// The machine profile the `model:` rows predict with (default: this machine's cached
    /// one, made by `usermm calibrate`; without one the rows say so).
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// What each replay may cost (the defaults are `usermm replay`'s: a large recording
    /// needs `--max-touch`, e.g. 3G for a 500 MB heap that forks).
    #[command(flatten)]
    pub budget: trace::BudgetArgs,
}

/// A folio policy: its name and THP settings over the recorded policy.
pub type Policy = (&'static str, &'static [(&'static str, &'static str)]);

/// The folio policies, in order; the first is the recorded one.
pub const POLICIES: [Policy; 3] = [
    ("4K", &[]),
    ("64K", &[("64K", "always")]),
    ("2M", &[("2M", "always")]),
];

/// One seed switch: a column name, its tunables, and the policies where it applies.
pub struct Switch {
    /// Column name.
    pub name: &'static str,
    /// Tunables it sets over the defaults.
    pub tunables: &'static [(&'static str, &'static str)],
    /// The policies where it can change anything.
    pub policies: &'static [&'static str],
}

const ALL: &[&str] = &["4K", "64K", "2M"];
/// Large anonymous folios only: the sharing trackers decide their COW reuse.
const LARGE: &[&str] = &["64K", "2M"];

/// The switches, one at a time: seed 000 (fork and zap batching), seed 001 (the VMA tree's
/// copy), seed 003 (the 'mapped shared' trackers, the remap batching of a PTE-mapped PMD
/// THP), seed 004 (munlock). The trackers' names are those of `usermm bench sharing`.
pub const SWITCHES: &[Switch] = &[
    Switch {
        name: "fork=per-pte",
        tunables: &[("fork_pte_batch", "per-pte")],
        policies: ALL,
    },
    Switch {
        name: "zap=per-pte",
        tunables: &[("zap_pte_batch", "per-pte")],
        policies: ALL,
    },
    Switch {
        name: "tree=insert",
        tunables: &[("vma_tree_dup", "insert")],
        policies: ALL,
    },
    Switch {
        name: "munlock=stage0",
        tunables: &[("munlock", "stage0")],
        policies: ALL,
    },
    Switch {
        name: "sharing=estimate",
        tunables: &[("sharing", "estimate")],
        policies: LARGE,
    },
    Switch {
        name: "sharing=mapcount",
        tunables: &[("sharing", "mapcount")],
        policies: LARGE,
    },
    Switch {
        name: "sharing=rmap-id",
        tunables: &[("sharing", "rmap-id+add-return+seed-sizing+all")],
        policies: LARGE,
    },
    Switch {
        name: "sharing=rmap-id-sq",
        tunables: &[("sharing", "rmap-id-sq")],
        policies: LARGE,
    },
    Switch {
        name: "remap=per-pte",
        tunables: &[("remap_rmap_batch", "per-pte")],
        policies: &["2M"],
    },
];

/// One column: a policy and at most one switch.
#[derive(Clone, Debug)]
pub struct Variant {
    /// Column name: the policy, then the switch (`64K sharing=estimate`).
    pub name: String,
    /// The policy.
    pub policy: &'static str,
    /// The switch's name (`None`: the policy's baseline).
    pub switch: Option<&'static str>,
    /// Tunables.
    pub tunables: &'static [(&'static str, &'static str)],
    /// THP settings over the recorded policy.
    pub thp: &'static [(&'static str, &'static str)],
}

/// The columns: each policy's baseline, then its switches.
pub fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for (policy, thp) in POLICIES {
        v.push(Variant {
            name: policy.to_string(),
            policy,
            switch: None,
            tunables: &[],
            thp,
        });
        for s in SWITCHES.iter().filter(|s| s.policies.contains(&policy)) {
            v.push(Variant {
                name: format!("{policy} {}", s.name),
                policy,
                switch: Some(s.name),
                tunables: s.tunables,
                thp,
            });
        }
    }
    v
}

/// The column a variant's gains are read against: its policy's baseline, or for a policy's
/// baseline the first policy's (`None` for that one).
pub fn baseline_of(vs: &[Variant], i: usize) -> Option<usize> {
    let v = vs.get(i)?;
    let target = if v.switch.is_some() {
        v.policy
    } else {
        POLICIES[0].0
    };
    let b = vs
        .iter()
        .position(|w| w.switch.is_none() && w.policy == target)?;
    (b != i).then_some(b)
}

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

/// A column's replay options: its policy set whole (`never` at every size, then the
/// policy's), whatever the trace was recorded under, and its switch's tunables.
fn opts(v: &Variant, budget: &trace::Budget) -> ReplayOptions {
    let mut thp = trace::replay::baseline_policy();
    thp.extend(v.thp.iter().map(|(a, b)| (a.to_string(), b.to_string())));
    ReplayOptions {
        tunables: v
            .tunables
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
        thp,
        budget: budget.clone(),
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
    /// The columns ([`variants`]).
    pub variants: Vec<Variant>,
    /// One report per variant.
    pub reports: Vec<ReplayReport>,
    /// One model cell per variant (none without a profile).
    pub model: Vec<Option<ModelCell>>,
    /// The THP policy the trace was recorded under (its header's).
    pub recorded: String,
    /// The column of the policy it was recorded under ([`recorded_column`]).
    pub recorded_col: usize,
}

/// The baseline column of the policy a trace was recorded under: `2M` or `64K` where its
/// header has that size `always`, else `4K` (THP off, the recorder's default). The other
/// policies' columns replay its faults under them: what-ifs, and for a policy of smaller
/// folios than the recording's, short of the touches made inside its folios.
pub fn recorded_column(vs: &[Variant], policy: &str) -> usize {
    // A header replay cannot read never gets this far (the replay refused it).
    let pairs = trace::replay::recorded_pairs(policy).unwrap_or_default();
    let always = |size: &str| {
        pairs
            .iter()
            .rev()
            .find(|(k, _)| k == size)
            .is_some_and(|(_, v)| v == "always")
    };
    let name = if always("2048K") {
        "2M"
    } else if always("64K") {
        "64K"
    } else {
        "4K"
    };
    vs.iter()
        .position(|v| v.switch.is_none() && v.policy == name)
        .unwrap_or(0)
}

fn run_trace(
    path: &Path,
    reps: usize,
    budget: &trace::Budget,
    profile: &ModelProfile,
) -> anyhow::Result<TraceTable> {
    let t = trace::format::read_file_with(path, budget)?;
    let vs = variants();
    let mut reports = Vec::new();
    for v in &vs {
        let mut best: Option<ReplayReport> = None;
        for _ in 0..reps.max(1) {
            let r = trace::replay(&t, &opts(v, budget))
                .map_err(|e| anyhow::anyhow!("column {}: {e}", v.name))?;
            if best
                .as_ref()
                .is_none_or(|b| r.wall_seconds < b.wall_seconds)
            {
                best = Some(r);
            }
        }
        reports.extend(best);
    }
    let model = model_cells(profile.profile(), &vs, &reports);
    let recorded_col = recorded_column(&vs, &t.header.policy);
    Ok(TraceTable {
        name: path
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned()),
        events: t.events.len() as u64,
        bytes: t.file_bytes,
        host_rss_anon_kb: reports
            .first()
            .map_or(0, |r| r.rss.iter().map(|c| c.host_anon_kb).sum()),
        variants: vs,
        reports,
        model,
        recorded: t.header.policy.clone(),
        recorded_col,
    })
}

/// Each column's model cell, its gain over [`baseline_of`] the column.
pub fn model_cells(
    profile: Option<&usermm_model::profile::Profile>,
    vs: &[Variant],
    reports: &[ReplayReport],
) -> Vec<Option<ModelCell>> {
    (0..reports.len())
        .map(|i| {
            let p = profile?;
            let base = baseline_of(vs, i).map(|b| (vs[b].name.as_str(), &reports[b]));
            Some(replay_model::cell(p, &reports[i], base))
        })
        .collect()
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

/// The text tables of one trace: one block per policy, then each switch's predicted effect.
pub fn render(t: &TraceTable) -> String {
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
    if t.recorded_col != 0 {
        let _ = writeln!(
            s,
            "recorded under {} (the {} columns); the other policies' columns are what-ifs, short of the touches inside its folios where their folios are smaller",
            t.recorded,
            t.variants[t.recorded_col].policy
        );
    }
    let w = 22;
    for (policy, _) in POLICIES {
        let cols: Vec<usize> = (0..t.variants.len())
            .filter(|&i| t.variants[i].policy == policy)
            .collect();
        if cols.is_empty() {
            continue;
        }
        let _ = write!(s, "\n{:<20}", format!("{policy} policy"));
        for &i in &cols {
            let v = &t.variants[i];
            let _ = write!(s, "{:>w$}", v.switch.unwrap_or(policy));
        }
        let _ = writeln!(s);
        let mut line = |label: &str, val: &dyn Fn(&ReplayReport) -> u64| {
            let _ = write!(s, "{label:<20}");
            let base = val(&t.reports[cols[0]]);
            for &i in &cols {
                let v = val(&t.reports[i]);
                let _ = write!(s, "{:>w$}", format!("{v}{}", gain(base, v)));
            }
            let _ = writeln!(s);
        };
        for (label, evs) in ROWS {
            line(label, &|r| value(r, evs));
        }
        line("rss_anon_kb", &engine_rss);
        line("errno_mismatches", &|r| r.errno_mismatches);
        line("fault_signals", &|r| r.fault_signals);
        let _ = write!(s, "{:<20}", "replay_ms");
        for &i in &cols {
            let _ = write!(s, "{:>w$.2}", t.reports[i].wall_seconds * 1e3);
        }
        let _ = writeln!(s);
        if t.model.iter().any(Option::is_some) {
            let _ = write!(s, "{:<20}", "model: kernel ms");
            for &i in &cols {
                let c = t.model[i].as_ref().map_or_else(String::new, |m| {
                    format!(
                        "{:.3} [{:.3},{:.3}]",
                        m.ns / 1e6,
                        m.ci95_ns[0] / 1e6,
                        m.ci95_ns[1] / 1e6
                    )
                });
                let _ = write!(s, "{c:>w$}");
            }
            let _ = writeln!(s);
            let _ = write!(s, "{:<20}", "model: gain");
            for &i in &cols {
                let c = t.model[i].as_ref().map_or_else(String::new, short_gain);
                let _ = write!(s, "{c:>w$}");
            }
            let _ = writeln!(s);
        }
    }
    if t.model.iter().any(Option::is_some) {
        let _ = writeln!(
            s,
            "\npredicted effect on {} (gain over the policy's baseline, 95 % interval; positive: faster):",
            t.name
        );
        for (policy, _) in POLICIES.iter().skip(1) {
            if let Some(i) = t
                .variants
                .iter()
                .position(|v| v.switch.is_none() && v.policy == *policy)
            {
                if let Some(m) = &t.model[i] {
                    let _ = writeln!(s, "  {:<20} {}", format!("{policy} over 4K"), long_gain(m));
                }
            }
        }
        for sw in SWITCHES {
            let cells: Vec<String> = (0..t.variants.len())
                .filter(|&i| t.variants[i].switch == Some(sw.name))
                .filter_map(|i| {
                    let m = t.model[i].as_ref()?;
                    Some(format!("{} {}", t.variants[i].policy, long_gain(m)))
                })
                .collect();
            if !cells.is_empty() {
                let _ = writeln!(s, "  {:<20} {}", sw.name, cells.join("; "));
            }
        }
    }
    s
}

fn short_gain(m: &ModelCell) -> String {
    match (m.gain_pct, m.gain_ci95_pct) {
        (Some(g), Some(ci)) => format!("{g:+.1}% [{:+.1},{:+.1}]", ci[0], ci[1]),
        _ => String::new(),
    }
}

fn long_gain(m: &ModelCell) -> String {
    match (m.gain_pct, m.gain_ci95_pct) {
        (Some(g), Some(ci)) => replay_model::fmt_gain(g, ci),
        _ => "no gain (baseline priced at 0)".to_string(),
    }
}

/// The JSON document (`usermm-bench-replay/2`, `docs/bench-schema.md`).
pub fn json(
    tables: &[TraceTable],
    failed: &[(String, String)],
    profile: &ModelProfile,
) -> serde_json::Value {
    let summary: Vec<_> = tables
        .iter()
        .map(|t| {
            let b = &t.reports[t.recorded_col];
            serde_json::json!({
                "trace": t.name,
                "recorded_policy": t.recorded,
                "recorded_column": t.variants[t.recorded_col].name,
                "events": t.events,
                "bytes": t.bytes,
                "bytes_per_event": t.bytes as f64 / t.events.max(1) as f64,
                "host_rss_anon_kb": t.host_rss_anon_kb,
                "engine_rss_anon_kb": engine_rss(b),
                "host_rss_file_kb": b.rss.iter().map(|c| c.host_file_kb).sum::<u64>(),
                "engine_rss_file_kb": b.rss.iter().map(|c| c.engine_file_kb).sum::<u64>(),
                "max_rss_anon_rel_err": b.max_anon_err(),
                "errno_mismatches": b.errno_mismatches,
                "fault_signals": b.fault_signals,
                "events_per_sec": b.events_per_sec,
                "model": t.model.get(t.recorded_col).cloned().flatten(),
            })
        })
        .collect();
    let per_trace: Vec<_> = tables
        .iter()
        .map(|t| {
            let col = |f: &dyn Fn(&ReplayReport) -> serde_json::Value| {
                serde_json::Value::Array(t.reports.iter().map(f).collect())
            };
            let rows: serde_json::Map<String, serde_json::Value> = ROWS
                .iter()
                .map(|(label, evs)| (label.to_string(), col(&|r| value(r, evs).into())))
                .chain([
                    ("rss_anon_kb".to_string(), col(&|r| engine_rss(r).into())),
                    (
                        "errno_mismatches".to_string(),
                        col(&|r| r.errno_mismatches.into()),
                    ),
                    (
                        "fault_signals".to_string(),
                        col(&|r| r.fault_signals.into()),
                    ),
                    (
                        "replay_seconds".to_string(),
                        col(&|r| r.wall_seconds.into()),
                    ),
                ])
                .collect();
            serde_json::json!({
                "trace": t.name,
                "host_rss_anon_kb": t.host_rss_anon_kb,
                "columns": t.variants.iter().map(|v| v.name.clone()).collect::<Vec<_>>(),
                "policies": t.variants.iter().map(|v| v.policy).collect::<Vec<_>>(),
                "baselines": (0..t.variants.len())
                    .map(|i| baseline_of(&t.variants, i).map(|b| t.variants[b].name.clone()))
                    .collect::<Vec<_>>(),
                "rows": rows,
                "ops": t.reports.iter().map(|r| &r.ops).collect::<Vec<_>>(),
                "model": t.model,
            })
        })
        .collect();
    serde_json::json!({
        "schema": "usermm-bench-replay/2",
        "model": profile.note(),
        "summary": summary,
        "tables": per_trace,
        "failed": failed
            .iter()
            .map(|(t, e)| serde_json::json!({ "trace": t, "error": e }))
            .collect::<Vec<_>>(),
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
    let profile = replay_model::load_profile(a.profile.as_deref())?;
    if !a.json {
        println!("{}", profile.note());
    }
    let budget = a.budget.budget().map_err(anyhow::Error::msg)?;
    let mut tables = Vec::new();
    // A trace that cannot be read or replayed is named and skipped, the others still run;
    // the exit status says some failed.
    let mut failed = Vec::new();
    for p in &paths {
        match run_trace(p, a.reps, &budget, &profile) {
            Ok(t) => {
                if !a.json {
                    print!("{}", render(&t));
                }
                tables.push(t);
            }
            Err(e) => {
                eprintln!("{}: {e:#}", p.display());
                failed.push((p.display().to_string(), format!("{e:#}")));
            }
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json(&tables, &failed, &profile))?
        );
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
            let b = &t.reports[t.recorded_col];
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
        for (p, _) in &failed {
            println!("{p}: not replayed (the error is above)");
        }
    }
    Ok(u8::from(!failed.is_empty()))
}
