//! `usermm trace show|stats|export`, `usermm replay` (crate `trace`).

use anyhow::Context;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Arguments of `usermm trace`.
#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    #[command(subcommand)]
    cmd: TraceCmd,
}

#[derive(clap::Subcommand, Debug)]
enum TraceCmd {
    /// Print the header and the events, one a line.
    Show {
        /// Trace file.
        file: PathBuf,
        /// At most this many events.
        #[arg(long, default_value_t = usize::MAX)]
        limit: usize,
    },
    /// Print the header, event counts per kind, processes, bytes per event.
    Stats {
        /// Trace file.
        file: PathBuf,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Write a small trace as a scenario file (`../shared/SCENARIO.md`).
    Export {
        /// Trace file.
        file: PathBuf,
        /// Scenario file to write (`-`: standard output).
        #[arg(long, value_name = "FILE")]
        scenario: String,
    },
}

/// Arguments of `usermm replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// Trace file.
    pub trace: PathBuf,
    /// A tunable, NAME=VALUE (repeatable; `usermm tunables` lists them).
    #[arg(long = "tunable", value_name = "NAME=VALUE")]
    pub tunables: Vec<String>,
    /// A THP policy over the recorded one (every size `never`): SIZE=POLICY or top=POLICY
    /// (repeatable), e.g. `--thp 64K=always`.
    #[arg(long = "thp", value_name = "SIZE=POLICY")]
    pub thp: Vec<String>,
    /// Check every engine invariant after the replay.
    #[arg(long)]
    pub validate: bool,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

fn read(p: &std::path::Path) -> anyhow::Result<trace::Trace> {
    Ok(trace::read_file(p)?)
}

/// `usermm trace …`.
pub fn trace_main(a: &TraceArgs) -> anyhow::Result<u8> {
    match &a.cmd {
        TraceCmd::Show { file, limit } => {
            let t = read(file)?;
            print_header(&t);
            for (i, e) in t.events.iter().take(*limit).enumerate() {
                println!("{i:>8} {e:x?}");
            }
        }
        TraceCmd::Stats { file, json } => {
            let t = read(file)?;
            let mut kinds: BTreeMap<&str, u64> = BTreeMap::new();
            for e in &t.events {
                *kinds.entry(e.kind()).or_default() += 1;
            }
            let n = t.events.len().max(1) as f64;
            if *json {
                let v = serde_json::json!({
                    "command": t.header.command,
                    "host": t.header.host,
                    "kernel": t.header.kernel,
                    "policy": t.header.policy,
                    "events": t.events.len(),
                    "file_bytes": t.file_bytes,
                    "payload_bytes": t.payload_bytes,
                    "bytes_per_event": t.file_bytes as f64 / n,
                    "kinds": kinds,
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print_header(&t);
                println!(
                    "events {}  file {} bytes ({:.2}/event)  payload {} bytes ({:.2}/event)",
                    t.events.len(),
                    t.file_bytes,
                    t.file_bytes as f64 / n,
                    t.payload_bytes,
                    t.payload_bytes as f64 / n
                );
                for (k, v) in kinds {
                    println!("  {k:<20} {v:>10}");
                }
            }
        }
        TraceCmd::Export { file, scenario } => {
            let t = read(file)?;
            let text = trace::export::to_scenario(&t)?;
            if scenario == "-" {
                print!("{text}");
            } else {
                std::fs::write(scenario, text).with_context(|| scenario.clone())?;
            }
        }
    }
    Ok(0)
}

fn print_header(t: &trace::Trace) {
    println!(
        "trace of `{}` on {} (Linux {}), policy {}, recorded at {} (unix)",
        t.header.command.join(" "),
        t.header.host,
        t.header.kernel,
        t.header.policy,
        t.header.recorded_at
    );
}

fn pairs(v: &[String], what: &str) -> anyhow::Result<Vec<(String, String)>> {
    v.iter()
        .map(|s| {
            s.split_once('=')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| anyhow::anyhow!("{what} {s}: expected NAME=VALUE"))
        })
        .collect()
}

/// `usermm replay`.
pub fn replay_main(a: &ReplayArgs) -> anyhow::Result<u8> {
    let t = read(&a.trace)?;
    let opts = trace::ReplayOptions {
        tunables: pairs(&a.tunables, "--tunable")?,
        thp: pairs(&a.thp, "--thp")?,
        validate: a.validate,
        ..Default::default()
    };
    let r = trace::replay(&t, &opts)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(0);
    }
    println!(
        "replayed {}: {} events ({} faults, {} calls, {} processes) in {:.3} s = {:.2} M events/s",
        a.trace.display(),
        r.events,
        r.faults,
        r.syscalls,
        r.processes,
        r.wall_seconds,
        r.events_per_sec / 1e6
    );
    println!(
        "errno mismatches {}; faults answered by a signal {}; file mappings replayed as anonymous {}; unsupported calls {}; unknown-process events {}; lost records {}; brk as mmap {}",
        r.errno_mismatches,
        r.fault_signals,
        r.file_as_anon,
        r.unsupported,
        r.unknown_process,
        r.lost,
        r.brk_as_mmap
    );
    for m in &r.mismatches {
        println!(
            "  event {}: {} host {} engine {}",
            m.event, m.call, m.host, m.engine
        );
    }
    for c in &r.rss {
        println!(
            "  exit of {}: RssAnon host {} kB engine {} kB ({:+.1}%), RssFile host {} kB engine {} kB",
            c.pid,
            c.host_anon_kb,
            c.engine_anon_kb,
            (c.engine_anon_kb as f64 - c.host_anon_kb as f64) / c.host_anon_kb.max(1) as f64 * 100.0,
            c.host_file_kb,
            c.engine_file_kb
        );
    }
    if let Some(v) = &r.validate {
        println!("validate: {v}");
    }
    println!("counters:");
    for (k, v) in &r.counters {
        println!("  {k:<28} {v:>12}");
    }
    Ok(0)
}
