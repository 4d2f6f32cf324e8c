//! `usermm trace show|stats|export|reseal`, `usermm replay` (crate `trace`).
//!
//! Every command that reads a trace streams it (`trace::Decoder`): the file is never held
//! whole, and each runs within a `trace::Budget` whose defaults a small hostile file cannot
//! amplify past (`--max-events`, `--max-seconds`, `--max-image-pages`, `--max-touch`,
//! `--max-output`). The trace's strings are printed escaped (`trace::escape`).

use anyhow::Context;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use trace::{Budget, BudgetArgs};

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
        #[command(flatten)]
        budget: BudgetArgs,
    },
    /// Print the header, event counts per kind, processes, bytes per event.
    Stats {
        /// Trace file.
        file: PathBuf,
        /// JSON output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        budget: BudgetArgs,
    },
    /// Write a trace recorded before traces carried a checksum again, with one (the events
    /// byte for byte the same); the reader refuses a trace without.
    Reseal {
        /// Trace file.
        file: PathBuf,
        /// The new trace file (a new path: nothing there is followed or overwritten).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        #[command(flatten)]
        budget: BudgetArgs,
    },
    /// Write a small trace as a scenario file (`../shared/SCENARIO.md`).
    Export {
        /// Trace file.
        file: PathBuf,
        /// Scenario file to write (`-`: standard output).
        #[arg(long, value_name = "FILE")]
        scenario: String,
        #[command(flatten)]
        budget: BudgetArgs,
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
    /// A THP policy over the recorded one (the trace header's: every size `never` unless
    /// recorded with `--thp`): SIZE=POLICY or top=POLICY
    /// (repeatable), e.g. `--thp 64K=always`.
    #[arg(long = "thp", value_name = "SIZE=POLICY")]
    pub thp: Vec<String>,
    /// Check every engine invariant after the replay.
    #[arg(long)]
    pub validate: bool,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
    /// Exit with status 1 when the replay disagrees with what the host recorded (errno
    /// mismatches, a fault signal only one side sent, file mappings replayed as anonymous,
    /// unsupported calls, unknown processes, lost records, a failed --validate, an exit's
    /// RssAnon or AnonHugePages), after printing the report and each disagreement.
    #[arg(long)]
    pub strict: bool,
    /// The machine profile the `model:` line predicts the kernel's mm time with (default:
    /// this machine's cached one, made by `usermm calibrate`; nothing is calibrated here).
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    #[command(flatten)]
    pub budget: BudgetArgs,
}

fn open(
    p: &std::path::Path,
    b: &Budget,
) -> anyhow::Result<trace::Decoder<Box<dyn std::io::BufRead>>> {
    Ok(trace::Decoder::open(p, b)?)
}

/// A decoding error of `file`, with the file's name.
fn named(file: &std::path::Path, e: trace::format::FormatError) -> anyhow::Error {
    anyhow::anyhow!("{}: {e}", file.display())
}

/// Standard output within the output budget; a closed pipe ends the command quietly.
struct Out {
    w: std::io::BufWriter<std::io::StdoutLock<'static>>,
    written: u64,
    max: u64,
}

impl Out {
    fn new(max: u64) -> Out {
        Out {
            w: std::io::BufWriter::new(std::io::stdout().lock()),
            written: 0,
            max,
        }
    }

    /// Writes `text`; `Ok(false)` when the reader went away (stop quietly).
    fn put(&mut self, text: &str) -> anyhow::Result<bool> {
        self.written = self.written.saturating_add(text.len() as u64);
        anyhow::ensure!(
            self.written <= self.max,
            "output larger than {} bytes: over the budget (--max-output)",
            self.max
        );
        match self.w.write_all(text.as_bytes()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
            r => r.map(|()| true).map_err(Into::into),
        }
    }

    fn finish(mut self) -> anyhow::Result<()> {
        match self.w.flush() {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
            _ => Ok(()),
        }
    }
}

/// `usermm trace …`.
pub fn trace_main(a: &TraceArgs) -> anyhow::Result<u8> {
    match &a.cmd {
        TraceCmd::Reseal { file, out, budget } => {
            let b = budget.budget().map_err(anyhow::Error::msg)?;
            let len = std::fs::metadata(file)
                .with_context(|| format!("{}", file.display()))?
                .len();
            // The compressed file of the largest payload the reader takes is smaller.
            anyhow::ensure!(
                len <= trace::format::MAX_PAYLOAD,
                "{}: {len} bytes: larger than any trace",
                file.display()
            );
            let bytes = std::fs::read(file).with_context(|| format!("{}", file.display()))?;
            let sealed = trace::format::reseal(&bytes, &b).map_err(|e| named(file, e))?;
            anyhow::ensure!(
                out.symlink_metadata().is_err(),
                "{}: exists (reseal writes a new file)",
                out.display()
            );
            oracle::output::write_file(out, &sealed)?;
            println!("{}: {} bytes, checksummed", out.display(), sealed.len());
        }
        TraceCmd::Show {
            file,
            limit,
            budget,
        } => {
            let b = budget.budget().map_err(anyhow::Error::msg)?;
            let mut d = open(file, &b)?;
            let mut out = Out::new(b.max_output);
            if !out.put(&header_line(d.header()))? {
                return Ok(0);
            }
            let mut i = 0usize;
            while i < *limit {
                let Some(e) = d.next_event().map_err(|e| named(file, e))? else {
                    break;
                };
                // Debug output escapes every string (control and invisible characters
                // included); the header is escaped by `header_line`.
                if !out.put(&format!("{i:>8} {e:x?}\n"))? {
                    return Ok(0);
                }
                i += 1;
            }
            out.finish()?;
        }
        TraceCmd::Stats { file, json, budget } => {
            let b = budget.budget().map_err(anyhow::Error::msg)?;
            let mut d = open(file, &b)?;
            let mut kinds: BTreeMap<&str, u64> = BTreeMap::new();
            let mut lost = 0u64;
            while let Some(e) = d.next_event().map_err(|e| named(file, e))? {
                if let trace::Event::Lost { count } = e {
                    lost = lost.saturating_add(count);
                }
                *kinds.entry(e.kind()).or_default() += 1;
            }
            let events = d.events();
            let (file_bytes, payload_bytes) = (d.file_bytes(), d.payload_bytes());
            let n = events.max(1) as f64;
            let h = d.header();
            if *json {
                let v = serde_json::json!({
                    "command": h.command,
                    "host": h.host,
                    "kernel": h.kernel,
                    "policy": h.policy,
                    "events": events,
                    "lost_records": lost,
                    "file_bytes": file_bytes,
                    "payload_bytes": payload_bytes,
                    "bytes_per_event": file_bytes as f64 / n,
                    "kinds": kinds,
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", header_line(h));
                println!(
                    "events {events}  file {file_bytes} bytes ({:.2}/event)  payload {payload_bytes} bytes ({:.2}/event)  lost records {lost}",
                    file_bytes as f64 / n,
                    payload_bytes as f64 / n
                );
                for (k, v) in kinds {
                    println!("  {k:<20} {v:>10}");
                }
            }
        }
        TraceCmd::Export {
            file,
            scenario,
            budget,
        } => {
            let b = budget.budget().map_err(anyhow::Error::msg)?;
            let mut d = open(file, &b)?;
            let mut x = trace::export::Exporter::new(d.header(), &b)?;
            while let Some(e) = d.next_event().map_err(|e| named(file, e))? {
                x.event(&e)
                    .with_context(|| format!("{}: payload byte {}", file.display(), d.offset()))?;
            }
            let text = x.finish();
            if scenario == "-" {
                let mut out = Out::new(b.max_output);
                out.put(&text)?;
                out.finish()?;
            } else {
                // Created safely on a shared host (no symlink followed, temporary name, rename).
                oracle::output::write_file(std::path::Path::new(scenario), text.as_bytes())
                    .with_context(|| scenario.clone())?;
            }
        }
    }
    Ok(0)
}

/// The header as one line, its strings escaped.
fn header_line(h: &trace::Header) -> String {
    let command: Vec<String> = h.command.iter().map(|a| trace::escape(a)).collect();
    format!(
        "trace of `{}` on {} (Linux {}), policy {}, recorded at {} (unix)\n",
        command.join(" "),
        trace::escape(&h.host),
        trace::escape(&h.kernel),
        trace::escape(&h.policy),
        h.recorded_at
    )
}

pub(crate) fn pairs(v: &[String], what: &str) -> anyhow::Result<Vec<(String, String)>> {
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
    let budget = a.budget.budget().map_err(anyhow::Error::msg)?;
    let opts = trace::ReplayOptions {
        tunables: pairs(&a.tunables, "--tunable")?,
        thp: pairs(&a.thp, "--thp")?,
        validate: a.validate,
        budget: budget.clone(),
        ..Default::default()
    };
    // Settings are checked before the trace is opened (a bad one is an error, nothing runs).
    trace::replay::machine_config(&opts)?;
    // So is the profile (a named one that cannot be read is an error before the replay).
    let profile = usermm_bench::replay_model::load_profile(a.profile.as_deref())?;
    let mut d = open(&a.trace, &budget)?;
    let r = trace::replay::replay_decoder(&mut d, &opts)
        .with_context(|| a.trace.display().to_string())?;
    let model = profile
        .profile()
        .map(|p| usermm_bench::replay_model::cell(p, &r, None));
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "model".into(),
                serde_json::json!({ "profile": profile.note(), "prediction": model }),
            );
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(strict_status(a.strict, &r));
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
        "errno mismatches {}; faults answered by a signal the host did not send {}; host fault signals {} ({} sent by the engine too, {} not); file mappings replayed as anonymous {}; unsupported calls {}; unknown-process events {}; lost records {}; brk as mmap {}; page cache seeded {} pages ({} folios failed)",
        r.errno_mismatches,
        r.fault_signals,
        r.host_signals,
        r.signals_matched,
        r.signals_missed,
        r.file_as_anon,
        r.unsupported,
        r.unknown_process,
        r.lost,
        r.brk_as_mmap,
        r.cache_seeded,
        r.cache_errors
    );
    for m in &r.mismatches {
        println!(
            "  event {}: {} host {} engine {}",
            m.event, m.call, m.host, m.engine
        );
    }
    for c in &r.rss {
        let huge = c.anon_huge_kb.map_or(String::new(), |(h, e)| {
            format!(", AnonHugePages host {h} kB engine {e} kB")
        });
        println!(
            "  exit of {}: RssAnon host {} kB engine {} kB ({:+.1}%), RssFile host {} kB engine {} kB{huge}",
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
    println!("counters per operation (calls; the counters that sum to the above):");
    for (op, c) in &r.ops {
        let calls = r.op_calls.get(op).copied().unwrap_or(0);
        let list: Vec<String> = c.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("  {op:<10} {calls:>8}  {}", list.join(", "));
    }
    println!("{}", profile.note());
    if let Some(m) = &model {
        println!(
            "model: kernel mm time of the workload {} (95 %)",
            usermm_bench::replay_model::fmt_ms(m.ns, m.ci95_ns)
        );
    }
    Ok(strict_status(a.strict, &r))
}

/// `replay`'s exit status: 1 under `--strict` when the replay disagrees with the host
/// (each disagreement on standard error), else 0.
fn strict_status(strict: bool, r: &trace::ReplayReport) -> u8 {
    let problems = r.problems();
    if !strict || problems.is_empty() {
        return 0;
    }
    for p in &problems {
        eprintln!("strict: {p}");
    }
    1
}
