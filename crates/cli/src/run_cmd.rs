//! `usermm run FILE…`: runs scenario files on the engine and summarizes each, as text or as
//! one JSON document for the whole invocation (`docs/cli-json.md`).

use crate::test_report::{junit, tap, TestPoint};
use scenario::run::{run, Abort, RunOptions};
use scenario::{ErrorKind, Script};
use serde::ser::SerializeMap;
use serde::Serialize;

/// Arguments of `usermm run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Scenario files (`-` reads standard input).
    #[arg(required = true)]
    pub files: Vec<String>,
    /// Print each statement as it runs.
    #[arg(short, long)]
    pub verbose: bool,
    /// Print one JSON document for the whole invocation on stdout (docs/cli-json.md);
    /// the same as `--format json`.
    #[arg(long)]
    pub json: bool,
    /// Output format: text (default), json, tap (TAP version 13, one test per file) or
    /// junit (one JUnit XML testsuite, one testcase per file), for CI systems.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Run the whole-state invariant checker after every statement.
    #[arg(long)]
    pub validate: bool,
    /// Print each statement with the counters it moved (in JSON: `stats`, one entry a
    /// statement).
    #[arg(long)]
    pub stats: bool,
    /// Set a tunable before each file runs (NAME=VALUE; repeatable; see `usermm tunables`).
    #[arg(long = "tunable", value_name = "NAME=VALUE")]
    pub tunables: Vec<String>,
}

/// How `usermm run` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Per-file summary lines and counters.
    Text,
    /// One JSON document (docs/cli-json.md).
    Json,
    /// TAP version 13: one test point per file, failures as YAML diagnostics.
    Tap,
    /// JUnit XML: one testsuite, one testcase per file.
    Junit,
}

/// A position and a message.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Located {
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
    /// What went wrong.
    pub message: String,
}

/// Why a run stopped before the end of the file.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct AbortInfo {
    /// 1-based line of the statement.
    pub line: u32,
    /// 1-based column of the statement.
    pub col: u32,
    /// What happened.
    pub message: String,
    /// `failed` (a statement failed without `expect`: exit 1) or `cannot_run` (the engine
    /// cannot run it, or a setting is invalid: exit 2).
    pub kind: &'static str,
}

/// What happened to one file.
#[derive(Clone, Debug, Serialize)]
pub struct FileResult {
    /// The path as given.
    pub file: String,
    /// 0 all held, 1 an expectation or a statement failed, 2 not run (unreadable,
    /// unparsable, or a statement the engine cannot run).
    pub exit_code: u8,
    /// Why the file could not be read, if it could not.
    pub read_error: Option<String>,
    /// Parse errors (at most one per line; then nothing ran).
    pub parse_errors: Vec<Located>,
    /// Parse errors found beyond the ones listed.
    pub parse_errors_omitted: usize,
    /// Statements executed.
    pub statements: usize,
    /// Failed expectations (the run went on after each).
    pub failures: Vec<Located>,
    /// Why the run stopped early, if it did.
    pub abort: Option<AbortInfo>,
    /// Wall time of the run, seconds (0 when nothing ran).
    pub wall_seconds: f64,
    /// Every engine counter at the end of the run, zeros included (all zero when nothing ran).
    pub counters: Counters,
    /// What each `dump` statement printed, by line.
    pub dumps: Vec<Dump>,
    /// With `--stats`: each statement and the counters it moved.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stats: Vec<StatementStats>,
}

/// One statement and the counters it moved (`--stats`).
#[derive(Clone, Debug, Serialize)]
pub struct StatementStats {
    /// Its line.
    pub line: u32,
    /// The statement.
    pub statement: String,
    /// Counter name → delta (the non-zero ones).
    pub counters: Counters,
}

/// The text one `dump` statement printed.
#[derive(Clone, Debug, Serialize)]
pub struct Dump {
    /// Its line.
    pub line: u32,
    /// The VMAs, page-table entries and folios of the range, one a line.
    pub text: String,
}

/// Every counter by name, in the engine's order (a JSON object).
#[derive(Clone, Debug, Default)]
pub struct Counters(pub Vec<(&'static str, u64)>);

impl Counters {
    fn of(s: &usermm::Snapshot) -> Counters {
        Counters(s.all())
    }
}

impl Serialize for Counters {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// The whole invocation.
#[derive(Clone, Debug, Serialize)]
pub struct RunSummary {
    /// One entry per file, in command-line order.
    pub files: Vec<FileResult>,
    /// The worst exit code of the files (the process's exit code).
    pub exit_code: u8,
}

impl FileResult {
    fn not_run(file: &str) -> FileResult {
        FileResult {
            file: file.to_string(),
            exit_code: 2,
            read_error: None,
            parse_errors: Vec::new(),
            parse_errors_omitted: 0,
            statements: 0,
            failures: Vec::new(),
            abort: None,
            wall_seconds: 0.0,
            counters: Counters::of(&usermm::Snapshot::default()),
            dumps: Vec::new(),
            stats: Vec::new(),
        }
    }
}

/// Splits and checks `--tunable NAME=VALUE` options; the error blames the option.
pub fn parse_tunable_options(opts: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    opts.iter()
        .map(|t| {
            let (k, v) = t
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--tunable {t}: expected NAME=VALUE"))?;
            ErrorKind::check_tunable(k, v).map_err(|e| anyhow::anyhow!("--tunable {t}: {e}"))?;
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

/// Reads, parses (tunables checked) and runs one file.
pub fn run_file(file: &str, opts: &RunOptions) -> FileResult {
    let text = match scenario::read_source(file) {
        Ok(t) => t,
        Err(e) => {
            return FileResult {
                read_error: Some(e.to_string()),
                ..FileResult::not_run(file)
            }
        }
    };
    let script = match Script::parse_checked(file, &text) {
        Ok(s) => s,
        Err(errs) => {
            return FileResult {
                parse_errors: errs
                    .errors()
                    .iter()
                    .map(|e| Located {
                        line: e.pos.line,
                        col: e.pos.col,
                        message: e.kind.to_string(),
                    })
                    .collect(),
                parse_errors_omitted: errs.more(),
                ..FileResult::not_run(file)
            }
        }
    };
    let report = run(&script, opts);
    let located = |f: &scenario::run::Failure| Located {
        line: f.line,
        col: f.col,
        message: f.message.clone(),
    };
    FileResult {
        file: file.to_string(),
        exit_code: u8::try_from(report.exit_code()).unwrap_or(2),
        read_error: None,
        parse_errors: Vec::new(),
        parse_errors_omitted: 0,
        statements: report.statements,
        failures: report.failures.iter().map(located).collect(),
        abort: report.abort.as_ref().map(|(f, a)| AbortInfo {
            line: f.line,
            col: f.col,
            message: f.message.clone(),
            kind: match a {
                Abort::Failed(_) => "failed",
                Abort::CannotRun(_) => "cannot_run",
            },
        }),
        wall_seconds: report.wall.as_secs_f64(),
        counters: Counters::of(&report.counters),
        dumps: report
            .dumps
            .iter()
            .map(|(line, text)| Dump {
                line: *line,
                text: text.clone(),
            })
            .collect(),
        stats: report
            .stats
            .iter()
            .map(|s| StatementStats {
                line: s.line,
                statement: s.text.clone(),
                counters: Counters(s.deltas.clone()),
            })
            .collect(),
    }
}

/// Prints a file's diagnostics on stderr as `FILE:LINE:COL: message`.
fn diagnostics(r: &FileResult) {
    if let Some(e) = &r.read_error {
        eprintln!("{e}");
    }
    for e in &r.parse_errors {
        eprintln!("{}:{}:{}: {}", r.file, e.line, e.col, e.message);
    }
    if r.parse_errors_omitted > 0 {
        eprintln!("{}: … and {} more errors", r.file, r.parse_errors_omitted);
    }
    for f in &r.failures {
        eprintln!("{}:{}:{}: {}", r.file, f.line, f.col, f.message);
    }
    if let Some(a) = &r.abort {
        eprintln!("{}:{}:{}: {}", r.file, a.line, a.col, a.message);
    }
}

/// Runs `usermm run`; the exit code is the worst file's.
pub fn run_main(args: &RunArgs) -> anyhow::Result<u8> {
    let format = if args.json { Format::Json } else { args.format };
    let opts = RunOptions {
        verbose: args.verbose,
        validate: args.validate,
        stats: args.stats,
        tunables: parse_tunable_options(&args.tunables)?,
    };
    let mut summary = RunSummary {
        files: Vec::new(),
        exit_code: 0,
    };
    for file in &args.files {
        let r = run_file(file, &opts);
        diagnostics(&r);
        if format == Format::Text {
            for s in &r.stats {
                let moved: Vec<String> = s
                    .counters
                    .0
                    .iter()
                    .map(|(k, v)| format!("{k} +{v}"))
                    .collect();
                println!(
                    "{}:{}: {}  [{}]",
                    r.file,
                    s.line,
                    s.statement,
                    moved.join(", ")
                );
            }
            for d in &r.dumps {
                print!("{}:{}: dump\n{}", r.file, d.line, d.text);
            }
        }
        if format == Format::Text && r.read_error.is_none() && r.parse_errors.is_empty() {
            let status = match r.exit_code {
                0 => "ok",
                1 => "FAILED",
                _ => "NOT RUN",
            };
            println!(
                "{}: {status}: {} statements, {} failed expectations, {:.3} ms",
                r.file,
                r.statements,
                r.failures.len(),
                r.wall_seconds * 1e3
            );
            for (k, v) in r.counters.0.iter().filter(|(_, v)| *v != 0) {
                println!("  {k:<22} {v}");
            }
        }
        summary.exit_code = summary.exit_code.max(r.exit_code);
        summary.files.push(r);
    }
    match format {
        Format::Text => {}
        Format::Json => println!("{}", serde_json::to_string_pretty(&summary)?),
        Format::Tap => print!("{}", tap(&points(&summary))),
        Format::Junit => print!("{}", junit("usermm run", &points(&summary))),
    }
    Ok(summary.exit_code)
}

/// Everything that went wrong in a file, one line each.
fn problems(r: &FileResult) -> Vec<String> {
    let mut out: Vec<String> = r.read_error.iter().cloned().collect();
    let at = |l: &Located| format!("{}:{}:{}: {}", r.file, l.line, l.col, l.message);
    out.extend(r.parse_errors.iter().map(at));
    out.extend(r.failures.iter().map(at));
    if let Some(a) = &r.abort {
        out.push(format!("{}:{}:{}: {}", r.file, a.line, a.col, a.message));
    }
    out
}

/// The summary's files as test points.
fn points(summary: &RunSummary) -> Vec<TestPoint> {
    summary
        .files
        .iter()
        .map(|r| TestPoint {
            name: r.file.clone(),
            exit_code: r.exit_code,
            messages: problems(r),
            seconds: r.wall_seconds,
        })
        .collect()
}
