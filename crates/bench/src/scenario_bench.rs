//! `usermm bench scenario FILE… --sweep NAME=V1,V2 [--sweep …]`: times whole runs of the
//! user's own scenario files on the engine under every combination of the swept tunables
//! (the cartesian product, the first value of each sweep first: that combination is the
//! baseline), repetitions interleaved in rotated order ([`rotation`]), and prints the same
//! table as the suite's benchmarks: one row per file, one column per combination, the counters
//! of one run under the timings, and the gain over the baseline with its 95 % interval.
//!
//! `--sweep thp=never,always` sweeps the THP policy (`set thp`, the host's
//! `/sys/kernel/mm/transparent_hugepage/…/enabled`) like a tunable: each value becomes a `set
//! thp` statement put before the file's first. Beside the engine's columns, a host column per
//! THP policy runs the same statements on the Linux kernel underneath through the oracle's
//! host backend (`oracle::timed`; root), timed between the same `bench begin`/`bench end`
//! marks; engine switches do not reach the host.

use crate::model::{
    Better, Column, HostInfo, Report, Row, RunInfo, Stat, Table, Unit, Variant, SCHEMA_VERSION,
};
use crate::progress::Progress;
use crate::stats::{add_intervals, rotation};
use crate::sweep::thp_stmt;
use crate::text;
use anyhow::Context;
use scenario::run::{run, RunOptions};
use scenario::{Script, Setting, StmtKind};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

pub use crate::sweep::{
    column_name, combinations, parse_sweeps, parse_sweeps_for, thp_statement, Sweep, THP,
};

/// Arguments of `usermm bench scenario`.
#[derive(clap::Args, Debug, Clone)]
pub struct ScenarioArgs {
    /// Scenario files (`-` reads standard input).
    #[arg(required = true)]
    pub files: Vec<String>,
    /// A tunable and the values to try, NAME=V1,V2[,…] (repeatable: every combination runs;
    /// the first values form the baseline column).
    #[arg(long = "sweep", value_name = "NAME=V1,V2")]
    pub sweeps: Vec<String>,
    /// Repetitions per combination (the gain's 95 % interval needs at least 3).
    #[arg(long, default_value_t = 7)]
    pub reps: usize,
    /// Leave out the host-kernel columns (without root they read n/a).
    #[arg(long)]
    pub no_host: bool,
    /// Write the JSON report here (schema: docs/bench-schema.md).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// Reads and parses a file (tunables checked), refusing a file that sets a swept tunable
/// (or, under a THP sweep, the THP policy) itself: its own setting would override the sweep.
fn load(file: &str, sweeps: &[Sweep]) -> anyhow::Result<Script> {
    let text = scenario::read_source(file)?;
    let script = Script::parse_checked(file, &text)
        .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
    for st in &script.stmts {
        if let StmtKind::Set(Setting::Tunable { name, .. }) = &st.kind {
            anyhow::ensure!(
                !sweeps.iter().any(|s| &s.name == name),
                "{file}:{}:{}: the file sets `{name}` itself, which would override --sweep {name}=…",
                st.pos.line,
                st.pos.col
            );
        }
        if let StmtKind::Set(Setting::Thp(_)) = &st.kind {
            anyhow::ensure!(
                !sweeps.iter().any(|s| s.name == THP),
                "{file}:{}:{}: the file sets the THP policy itself, which would override --sweep thp=…",
                st.pos.line,
                st.pos.col
            );
        }
    }
    Ok(script)
}

/// `script` under a combination: its `thp` value's `set thp` put first; and the tunables
/// of the combination, the rest.
fn under(script: &Script, combo: &[(String, String)]) -> (Script, Vec<(String, String)>) {
    let mut s = script.clone();
    let mut tunables = Vec::new();
    for (k, v) in combo {
        if k == THP {
            // Checked by `parse_sweeps`.
            if let Ok(st) = thp_stmt(v) {
                s.stmts.insert(0, st);
            }
        } else {
            tunables.push((k.clone(), v.clone()));
        }
    }
    (s, tunables)
}

/// The host columns: one per THP policy swept (`host/VALUE`), or one (`host`); each with
/// the combination that sets it.
fn host_columns(sweeps: &[Sweep]) -> Vec<(String, Vec<(String, String)>)> {
    match sweeps.iter().find(|s| s.name == THP) {
        None => vec![("host".into(), Vec::new())],
        Some(s) => s
            .values
            .iter()
            .map(|v| (format!("host/{v}"), vec![(THP.to_string(), v.clone())]))
            .collect(),
    }
}

/// What the runs of one cell found besides their times.
#[derive(Default)]
struct CellRuns {
    samples: Vec<f64>,
    counters: Option<BTreeMap<String, u64>>,
    /// First failure (`FILE:LINE:COL: message`) and the worst exit code.
    problem: Option<(u8, String)>,
}

/// Times every combination on every file, and on the host each THP policy (`host`:
/// the oracle's session, or why there is none); returns the table and the worst exit code
/// of the engine's runs (0 all held, 1 an expectation failed, 2 a statement could not run).
pub fn measure(
    files: &[(String, Script)],
    sweeps: &[Sweep],
    reps: usize,
    progress: &Progress,
    host: &mut Result<oracle::Session, String>,
) -> anyhow::Result<(Table, u8)> {
    let combos = combinations(sweeps);
    let hosts = host_columns(sweeps);
    let mut variants: Vec<Variant> = combos
        .iter()
        .map(|c| {
            let about = if c.is_empty() {
                "the engine's default tunables".to_string()
            } else {
                c.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            Variant::engine(&column_name(c), &about)
        })
        .collect();
    let engines = variants.len();
    variants.extend(hosts.iter().map(|(name, combo)| Variant {
        name: name.clone(),
        kind: crate::model::VariantKind::Host,
        about: format!(
            "the host kernel: the same statements in the oracle's server processes{}, wall time between the marks (one socket round trip per statement included); engine switches do not reach it",
            combo
                .first()
                .map(|(_, v)| format!(", {}", thp_statement(v)))
                .unwrap_or_default()
        ),
    }));
    let mut worst = 0u8;
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for (file, script) in files {
        let task = progress.task(file, (reps * variants.len()) as u64);
        let mut cells: Vec<CellRuns> = variants.iter().map(|_| CellRuns::default()).collect();
        let runs: Vec<(Script, Vec<(String, String)>)> =
            combos.iter().map(|c| under(script, c)).collect();
        let host_scripts: Vec<Script> = hosts.iter().map(|(_, c)| under(script, c).0).collect();
        for rep in 0..reps {
            for k in rotation(rep, combos.len()) {
                let opts = RunOptions {
                    tunables: runs[k].1.clone(),
                    ..RunOptions::default()
                };
                let t = Instant::now();
                let report = run(&runs[k].0, &opts);
                // With `bench begin`/`bench end` only what lies between them is timed (and
                // counted): the setup around a change no longer swamps it.
                let (secs, counted) = match &report.timed {
                    Some((d, c)) => (d.as_secs_f64(), c),
                    None => (t.elapsed().as_secs_f64(), &report.counters),
                };
                let cell = &mut cells[k];
                let code = u8::try_from(report.exit_code()).unwrap_or(2);
                let first = report
                    .abort
                    .as_ref()
                    .map(|(f, _)| f)
                    .or(report.failures.first());
                if let (Some(f), None) = (first, &cell.problem) {
                    cell.problem =
                        Some((code, format!("{file}:{}:{}: {}", f.line, f.col, f.message)));
                }
                worst = worst.max(code);
                cell.samples.push(secs);
                cell.counters
                    .get_or_insert_with(|| crate::engine::counters(counted));
                task.step(&variants[k].name)?;
            }
            // The host cells last (another process's work must not land before one engine
            // column only).
            for (j, s) in host_scripts.iter().enumerate() {
                let cell = &mut cells[engines + j];
                match host.as_mut() {
                    Ok(session) => {
                        let h = session.time_host(s);
                        if let (Some(p), None) = (&h.problem, &cell.problem) {
                            cell.problem = Some((h.code, format!("{file}:{p}")));
                        }
                        cell.samples.push(h.secs);
                        cell.counters.get_or_insert_with(|| {
                            BTreeMap::from([("host_statements".to_string(), h.statements as u64)])
                        });
                    }
                    Err(why) => {
                        cell.problem.get_or_insert((2, why.clone()));
                    }
                }
                task.step(&variants[engines + j].name)?;
                crate::progress::check_stop()?;
            }
        }
        progress.done(task);
        let columns = cells
            .into_iter()
            .zip(&variants)
            .map(|(c, v)| match c.problem {
                Some((2, why)) if host.is_err() && v.kind == crate::model::VariantKind::Host => {
                    Column::unavailable(&v.name, &why)
                }
                Some((2, why)) => Column::unavailable(&v.name, &format!("cannot run: {why}")),
                problem => {
                    if let Some((_, why)) = problem {
                        notes.push(format!("{}: an expectation failed: {why}", v.name));
                    }
                    Column::new(&v.name, c.samples, c.counters.unwrap_or_default())
                }
            })
            .collect();
        rows.push(Row {
            label: file.clone(),
            columns,
            published: Vec::new(),
            layout: None,
        });
    }
    let counters_shown = differing_counters(&rows, engines);
    if counters_shown.is_empty() && combos.len() > 1 {
        notes.push("every counter is the same in every column".into());
    }
    let mut table = Table {
        host_matches: None,
        cost_model: None,
        id: "scenario".into(),
        title: "runs of scenario files under tunable sweeps".into(),
        seed: None,
        metric: "run time between the file's `bench begin` and `bench end` (the whole file, \
                 machine built, where it has no marks)"
            .into(),
        unit: Unit::Seconds,
        better: Better::Lower,
        stats: vec![Stat::Min, Stat::Median, Stat::Max],
        baseline: variants.first().map(|v| v.name.clone()).unwrap_or_default(),
        variants,
        row_label: "file".into(),
        rows,
        counters_shown,
        published_source: None,
        notes,
    };
    add_intervals(&mut table);
    Ok((table, worst))
}

/// The counters that differ between the engine columns (the first `engines`) of a row (what
/// explains a difference), in name order; at most 16.
fn differing_counters(rows: &[Row], engines: usize) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for r in rows {
        let cols = &r.columns[..engines.min(r.columns.len())];
        let keys: std::collections::BTreeSet<&String> =
            cols.iter().flat_map(|c| c.counters.keys()).collect();
        for k in keys {
            let mut vals = cols
                .iter()
                .filter(|c| c.unavailable.is_none())
                .map(|c| c.counters.get(k).copied().unwrap_or(0));
            let first = vals.next();
            if vals.any(|v| Some(v) != first) && !names.contains(k) {
                names.push(k.clone());
            }
        }
    }
    names.sort();
    names.truncate(16);
    names
}

/// Runs `usermm bench scenario`; the exit code is the worst of the runs'.
pub fn main(args: &ScenarioArgs) -> anyhow::Result<u8> {
    let sweeps = parse_sweeps(&args.sweeps)?;
    anyhow::ensure!(args.reps >= 1, "--reps must be at least 1");
    let files = args
        .files
        .iter()
        .map(|f| Ok((f.clone(), load(f, &sweeps)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let combos = combinations(&sweeps);
    // The oracle's session: root, the machine-wide lock (it says when it waits), the THP
    // knobs saved and restored when it ends.
    let mut host = if args.no_host {
        Err("n/a (left out: --no-host)".to_string())
    } else {
        oracle::Session::new().map_err(|e| format!("n/a ({e})"))
    };
    let host_columns = match &host {
        Ok(_) => "measured (the oracle's host backend)".to_string(),
        Err(why) => why.clone(),
    };
    println!(
        "usermm bench scenario: {} file(s), {} combination(s), {} repetitions; host kernel columns: {host_columns}",
        files.len(),
        combos.len(),
        args.reps
    );
    let start = Instant::now();
    let progress = Progress::new(files.len() as u64, std::io::stderr().is_terminal());
    let res =
        crate::host::on_last_cpu(|| measure(&files, &sweeps, args.reps, &progress, &mut host));
    drop(host);
    progress.finish();
    let (table, worst) = res?;
    print!("{}", text::render(&table));
    if let Some(path) = &args.json {
        let report = Report {
            cost_model: None,
            schema_version: SCHEMA_VERSION,
            generator: format!("usermm-bench {}", env!("CARGO_PKG_VERSION")),
            meta: crate::model::RunMeta::collect(),
            run: RunInfo {
                which: "scenario".into(),
                scale_bytes: 0,
                reps: args.reps,
                max_reps: args.reps,
                tight_pp: 0.0,
                spawn_seconds: 0.0,
                linear_map_gib: Vec::new(),
                reclaim_memory_bytes: 0,
            },
            host: HostInfo {
                kernel: crate::host::kernel_release(),
                cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
                numa_nodes: crate::host::numa_nodes(),
                host_columns,
            },
            wall_seconds: start.elapsed().as_secs_f64(),
            bench_seconds: Vec::new(),
            tables: vec![table],
        };
        let out = crate::output::Outputs {
            json: Some(path.clone()),
            ..crate::output::Outputs::default()
        };
        crate::output::write(&report, &out).context("writing the JSON report")?;
        println!("json:   {}", path.display());
    }
    Ok(worst)
}
