//! The `usermm` command.
//!
//! Exit codes: 0 success; 1 an expectation failed (or a statement failed without `expect`);
//! 2 usage error, unreadable or unparsable file, or a statement the engine cannot run yet.

mod kmap_cmd;
mod oracle_cmd;

use anyhow::Context;
use clap::{Parser, Subcommand};
use scenario::run::{run, RunOptions};
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
    Run {
        /// Scenario files.
        #[arg(required = true)]
        files: Vec<String>,
        /// Print each statement as it runs.
        #[arg(short, long)]
        verbose: bool,
        /// Print the summary as JSON.
        #[arg(long)]
        json: bool,
        /// Run the whole-state invariant checker after every statement.
        #[arg(long)]
        validate: bool,
        /// Set a tunable before the file runs (NAME=VALUE; repeatable).
        #[arg(long = "tunable", value_name = "NAME=VALUE")]
        tunables: Vec<String>,
    },
    /// List the runtime switches with their defaults.
    Tunables,
    /// Build the arm64 kernel linear map for a RAM layout and show it (seed 002).
    Kmap(kmap_cmd::KmapArgs),
    /// Run scenarios on the host kernel and on the engine, and compare what a user observes.
    Oracle(oracle_cmd::OracleArgs),
    /// Run benchmarks: the whole suite at a small scale by default, with an HTML report.
    Bench(usermm_bench::cli::BenchArgs),
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
        Cmd::Run {
            files,
            verbose,
            json,
            validate,
            tunables,
        } => cmd_run(&files, verbose, json, validate, &tunables),
        Cmd::Tunables => cmd_tunables(),
        Cmd::Bench(args) => usermm_bench::cli::main(&args).map(|_| 0),
        Cmd::Oracle(args) => oracle_cmd::oracle_main(&args),
        Cmd::Kmap(args) => kmap_cmd::kmap_main(&args).map(|_| 0),
    };
    match res {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("usermm: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn cmd_tunables() -> anyhow::Result<u8> {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    t.set_header(["tunable", "default", "values", "what it switches"]);
    for i in usermm::Tunables::default().list() {
        t.add_row([i.name, &i.value, i.values, i.help]);
    }
    println!("{t}");
    println!("THP policy: `set thp SIZE=always|madvise|never|inherit` (defaults: top madvise, 2M inherit, others never).");
    Ok(0)
}

fn cmd_run(
    files: &[String],
    verbose: bool,
    json: bool,
    validate: bool,
    tunables: &[String],
) -> anyhow::Result<u8> {
    let mut tun = Vec::new();
    for t in tunables {
        let (k, v) = t.split_once('=').context("--tunable takes NAME=VALUE")?;
        tun.push((k.to_string(), v.to_string()));
    }
    let opts = RunOptions {
        verbose,
        validate,
        tunables: tun,
    };
    let mut worst = 0u8;
    for file in files {
        let text = match scenario::read_source(file) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{e}");
                worst = worst.max(2);
                continue;
            }
        };
        let script = match scenario::parse(file, &text) {
            Ok(s) => s,
            Err(errs) => {
                eprintln!("{}", errs.to_string().trim_end());
                worst = worst.max(2);
                continue;
            }
        };
        let report = run(&script, &opts);
        for f in &report.failures {
            eprintln!("{file}:{}:{}: {}", f.line, f.col, f.message);
        }
        if let Some((f, _)) = &report.abort {
            eprintln!("{file}:{}:{}: {}", f.line, f.col, f.message);
        }
        if json {
            let counters: serde_json::Map<String, serde_json::Value> = report
                .counters
                .nonzero()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.into()))
                .collect();
            let out = serde_json::json!({
                "file": file,
                "exit_code": report.exit_code(),
                "statements": report.statements,
                "failures": report.failures.iter().map(|f| serde_json::json!({"line": f.line, "col": f.col, "message": f.message})).collect::<Vec<_>>(),
                "wall_seconds": report.wall.as_secs_f64(),
                "counters": counters,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        } else {
            let status = match report.exit_code() {
                0 => "ok",
                1 => "FAILED",
                _ => "NOT RUN",
            };
            println!(
                "{file}: {status}: {} statements, {} failed expectations, {:.3} ms",
                report.statements,
                report.failures.len(),
                report.wall.as_secs_f64() * 1e3
            );
            for (k, v) in report.counters.nonzero() {
                println!("  {k:<22} {v}");
            }
        }
        worst = worst.max(report.exit_code() as u8);
    }
    Ok(worst)
}
