//! The `usermm` command.
//!
//! Exit codes: 0 success; 1 an expectation failed (or a statement failed without `expect`);
//! 2 usage error, unreadable or unparsable file, or a statement the engine cannot run yet.

mod kmap_cmd;
mod oracle_cmd;
mod record_cmd;
mod run_cmd;
mod test_report;
mod trace_cmd;

use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "usermm",
    version,
    about = "The Linux virtual-memory core as an instrumented user-space engine"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run scenario files on the engine.
    Run(run_cmd::RunArgs),
    /// List the runtime switches with their defaults.
    Tunables {
        /// Print a JSON array of {name, value, values, help} (docs/cli-json.md).
        #[arg(long)]
        json: bool,
    },
    /// Build the arm64 kernel linear map for a RAM layout and show it (seed 002).
    Kmap(kmap_cmd::KmapArgs),
    /// Run scenarios on the host kernel and on the engine, and compare what a user observes.
    Oracle(oracle_cmd::OracleArgs),
    /// Run benchmarks: the whole suite at a small scale by default, with an HTML report.
    Bench(Box<usermm_bench::cli::BenchArgs>),
    /// Calibrate the cost model on the running kernel: time the probe workloads on the host,
    /// count them on the engine, fit the per-event prices, and cache the machine profile
    /// `usermm bench` predicts with (root: the probes set the THP knobs).
    Calibrate(usermm_bench::calibrate::CalibrateArgs),
    /// Record a command's memory activity into a trace (root): mm calls, page faults, forks,
    /// execs, and each process's RSS at exit.
    Record(record_cmd::RecordArgs),
    /// Look into a trace: show, stats, export as a scenario.
    Trace(trace_cmd::TraceArgs),
    /// Replay a trace on the engine under chosen tunables and THP policies.
    Replay(trace_cmd::ReplayArgs),
    /// Print a shell completion script on stdout (e.g. `usermm completions bash >
    /// /etc/bash_completion.d/usermm`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print a manual page (roff) on stdout: usermm(1), with a subcommand path that
    /// command's page (`usermm man bench scenario | man -l -`), or `usermm man language`: the
    /// scenario language reference, usermm-language(7).
    Man {
        /// Subcommand path (`run`, `bench compare`), or `language`.
        subcommand: Vec<String>,
    },
}

/// A closed pipe on stdout (`usermm … | head`) ends the program quietly, like other CLI tools.
fn exit_quietly_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or("");
        if msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    exit_quietly_on_broken_pipe();
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Run(args) => run_cmd::run_main(&args),
        Cmd::Tunables { json } => cmd_tunables(json),
        Cmd::Bench(args) => usermm_bench::cli::main(&args),
        Cmd::Calibrate(args) => usermm_bench::calibrate::main(&args),
        Cmd::Oracle(args) => oracle_cmd::oracle_main(&args),
        Cmd::Record(args) => record_cmd::record_main(&args),
        Cmd::Trace(args) => trace_cmd::trace_main(&args),
        Cmd::Replay(args) => trace_cmd::replay_main(&args),
        Cmd::Kmap(args) => kmap_cmd::kmap_main(&args).map(|_| 0),
        Cmd::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "usermm", &mut std::io::stdout());
            Ok(0)
        }
        Cmd::Man { subcommand } => cmd_man(&subcommand),
    };
    match res {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("usermm: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The scenario language reference, as the repository carries it.
const LANGUAGE_MD: &str = include_str!("../../../docs/scenario-language.md");

/// `docs/scenario-language.md` as a roff page: headings become sections, fenced blocks
/// no-fill text, everything else paragraphs (roff's control characters escaped).
fn language_roff(md: &str) -> String {
    let esc = |l: &str| {
        let l = l.replace('\\', "\\e");
        if l.starts_with('.') || l.starts_with('\'') {
            format!("\\&{l}")
        } else {
            l
        }
    };
    let mut out = format!(
        ".TH USERMM-LANGUAGE 7 \"\" \"usermm {}\" \"usermm\"\n",
        env!("CARGO_PKG_VERSION")
    );
    let mut fenced = false;
    for line in md.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            out.push_str(if fenced { ".PP\n.nf\n" } else { ".fi\n" });
        } else if fenced {
            out.push_str(&esc(line));
            out.push('\n');
        } else if let Some(h) = line.strip_prefix("# ") {
            out.push_str(&format!(".SH NAME\nusermm-language \\- {}\n", esc(h)));
        } else if let Some(h) = line.strip_prefix("## ") {
            out.push_str(&format!(
                ".SH \"{}\"\n",
                esc(h).to_uppercase().replace('"', "")
            ));
        } else if let Some(h) = line.strip_prefix("### ") {
            out.push_str(&format!(".SS \"{}\"\n", esc(h).replace('"', "")));
        } else if line.trim().is_empty() {
            out.push_str(".PP\n");
        } else {
            out.push_str(&esc(line));
            out.push('\n');
        }
    }
    out
}

fn cmd_man(path: &[String]) -> anyhow::Result<u8> {
    if path == ["language"] {
        use std::io::Write;
        return match std::io::stdout().write_all(language_roff(LANGUAGE_MD).as_bytes()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
            _ => Ok(0),
        };
    }
    let mut cmd = Cli::command();
    cmd.build();
    let mut name = "usermm".to_string();
    for p in path {
        cmd = cmd
            .find_subcommand(p)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("`{name} {p}`: no such subcommand"))?;
        name = format!("{name}-{p}");
    }
    let version = env!("CARGO_PKG_VERSION");
    let cmd = cmd.name(name).version(version);
    match clap_mangen::Man::new(cmd).render(&mut std::io::stdout()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(0),
    }
}

fn cmd_tunables(json: bool) -> anyhow::Result<u8> {
    // Straight from the registry: the same table `set tunable` parses with and the README shows.
    let registry = usermm::tunables::REGISTRY;
    if json {
        /// One entry of `usermm tunables --json`.
        #[derive(serde::Serialize)]
        struct Entry {
            name: &'static str,
            value: String,
            values: &'static str,
            help: &'static str,
        }
        let out: Vec<Entry> = registry
            .iter()
            .map(|d| Entry {
                name: d.name,
                value: d.default_value(),
                values: d.values,
                help: d.help,
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(0);
    }
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(["tunable", "default", "values", "what it switches"]);
    for d in registry {
        t.add_row([d.name, &d.default_value(), d.values, d.help]);
    }
    println!("{t}");
    println!("THP policy: `set thp SIZE=always|madvise|never|inherit` (defaults: top madvise, 2M inherit, others never).");
    Ok(0)
}
