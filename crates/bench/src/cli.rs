//! `usermm bench [fault|fork|munmap|spawn|sharing|anon-cow|munlock|linear-map|readahead|reclaim|all]`:
//! arguments and the command itself. With no benchmark named it runs the whole suite at the
//! small default scale and writes `report.html`, `report.json` and `plots/` to
//! `target/usermm-bench/`. `usermm bench compare A.json B.json…` compares reports
//! ([`crate::compare`]); `usermm bench scenario FILE… --sweep NAME=V1,V2` times scenario
//! files under tunable sweeps ([`crate::scenario_bench`]).

use crate::host::HostSide;
use crate::output::{self, Outputs};
use crate::progress::Progress;
use crate::suite::{self, Bench, Options};
use crate::text;
use std::io::IsTerminal;
use std::path::PathBuf;

/// Arguments of `usermm bench`.
#[derive(clap::Args, Debug, Clone)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// `compare` or `scenario` instead of a benchmark of the suite.
    #[command(subcommand)]
    pub cmd: Option<BenchCmd>,
    /// Which benchmark: all (the default: the whole suite, report written), fault, fork,
    /// munmap, spawn, sharing, anon-cow, munlock, linear-map, readahead, reclaim.
    #[arg(default_value = "all")]
    pub which: String,
    /// Size of the memory layouts (fault, fork, munmap, munlock, readahead's file, default
    /// 256M; sharing, default 128M; anon-cow: the area every instance copies, default 32M),
    /// e.g. 256M or 1G.
    #[arg(long = "scale", visible_alias = "size", value_name = "SIZE")]
    pub scale: Option<String>,
    /// Memory of the reclaim benchmark's machine and host memory cgroup (default 64M; swap
    /// is 4 times as much, the working sets up to 4 times as much), e.g. 256M or 1G.
    #[arg(long, value_name = "SIZE")]
    pub reclaim_memory: Option<String>,
    /// Repetitions per measurement (each gain gets a 95% interval from them; at least 3).
    #[arg(long, default_value_t = 7)]
    pub reps: usize,
    /// Most repetitions of a row with gains: after --reps, a row repeats while a gain's 95%
    /// interval is wider than --tight, to the next count where the interval can narrow (9,
    /// then 12 after 7), up to this many and while the extra repetitions take no longer than
    /// the first did (default: --reps, which turns it off; e.g. 12 to tighten the gains'
    /// intervals at up to twice the time).
    #[arg(long, value_name = "N")]
    pub max_reps: Option<usize>,
    /// Percentage points: a gain's interval no wider than this is tight.
    #[arg(long, default_value_t = 10.0, value_name = "PP")]
    pub tight: f64,
    /// Seconds per point of the spawn benchmark.
    #[arg(long, default_value_t = 0.1)]
    pub seconds: f64,
    /// RAM sizes of the linear-map benchmark in GiB (default 16,64; 16,64,256,512 when
    /// linear-map runs alone).
    #[arg(long, value_delimiter = ',', value_name = "GIB")]
    pub ram: Vec<u64>,
    /// Modelled hardware latency of one TLBI in the linear-map benchmark, ns.
    #[arg(long, value_name = "NS")]
    pub tlbi_ns: Option<u64>,
    /// Write the JSON report here (schema: docs/bench-schema.md).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the self-contained HTML report here (plots go to `plots/` beside it).
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Write report.html, report.json and plots/ into this directory (default for the whole
    /// suite: target/usermm-bench).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// The engine columns of the one benchmark named, from the tunables registry instead of
    /// the table's own: NAME=V1,V2[,…] gives one column per value (the first is the baseline;
    /// repeatable: every combination), that switch set where the table sets its own columns'
    /// (e.g. `usermm bench fork --variants fork_pte_batch=per-pte,batched`).
    #[arg(long = "variants", value_name = "NAME=V1,V2")]
    pub variants: Vec<String>,
    /// Leave out the host-kernel columns.
    #[arg(long)]
    pub no_host: bool,
    /// Predict the `model:` columns with this machine profile (`usermm calibrate --out`),
    /// e.g. another machine's; default: this machine's cached profile, calibrated once if
    /// there is none.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
}

/// The subcommands of `usermm bench` beside the suite's benchmarks.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum BenchCmd {
    /// Compare bench reports (JSON) side by side: the median of each run per row and engine
    /// variant, and the gain over the first report, `~` when within the noise.
    Compare(crate::compare::CompareArgs),
    /// Time your scenario files (the part between `bench begin` and `bench end`) on the engine
    /// under every combination of swept tunables (`--sweep fork_pte_batch=per-pte,batched`)
    /// and THP policies (`--sweep thp=never,always`), and on the host kernel (root).
    Scenario(crate::scenario_bench::ScenarioArgs),
    /// Replay the shipped real-program traces (`traces/*.umt`) under the seeds' switches and
    /// mTHP policies: one counter table per trace.
    Replay(crate::replay_bench::ReplayArgs),
}

/// The options these arguments select.
pub fn options(args: &BenchArgs, which: &[Bench]) -> anyhow::Result<Options> {
    let mut o = Options::default();
    if let Some(s) = &args.scale {
        o.scale = usermm::units::parse_size_arg(s)?;
        o.sharing_scale = o.scale;
        o.munlock_scale = o.scale;
        o.anon_cow_scale = o.scale;
    }
    anyhow::ensure!(
        o.scale >= 2 << 20 && o.scale % (2 << 20) == 0,
        "--scale must be a multiple of 2M"
    );
    if let Some(s) = &args.reclaim_memory {
        o.reclaim_memory = usermm::units::parse_size_arg(s)?;
        anyhow::ensure!(
            o.reclaim_memory >= 4 << 20 && o.reclaim_memory % (1 << 20) == 0,
            "--reclaim-memory must be a multiple of 1M, at least 4M"
        );
    }
    o.reps = args.reps.max(1);
    o.max_reps = args.max_reps.unwrap_or(o.max_reps).max(o.reps);
    anyhow::ensure!(
        args.tight.is_finite() && args.tight > 0.0,
        "--tight must be a positive number of percentage points"
    );
    o.tight_pp = args.tight;
    o.spawn_seconds = args.seconds;
    if !args.ram.is_empty() {
        o.linear_map_gib = args.ram.clone();
    } else if which == [Bench::LinearMap] {
        o.linear_map_gib = vec![16, 64, 256, 512];
    }
    if let Some(ns) = args.tlbi_ns {
        o.tlbi_ns = ns;
    }
    o.profile = args.profile.clone();
    o.variants = crate::columns::parse_variants(&args.variants, which)?;
    Ok(o)
}

/// Where the outputs go.
fn outputs(args: &BenchArgs, whole_suite: bool) -> Outputs {
    let mut o = match (
        &args.out,
        whole_suite && args.json.is_none() && args.report.is_none(),
    ) {
        (Some(d), _) => Outputs::in_dir(d),
        (None, true) => Outputs::in_dir(&output::default_dir()),
        (None, false) => Outputs::default(),
    };
    if let Some(j) = &args.json {
        o.json = Some(j.clone());
    }
    if let Some(r) = &args.report {
        o.html = Some(r.clone());
        if o.plots.is_none() {
            let dir = r.parent().map(PathBuf::from).unwrap_or_default();
            o.plots = Some(dir.join("plots"));
        }
    }
    o
}

/// Runs the command; returns the exit code.
pub fn main(args: &BenchArgs) -> anyhow::Result<u8> {
    match &args.cmd {
        Some(BenchCmd::Compare(a)) => return crate::compare::main(a),
        Some(BenchCmd::Scenario(a)) => return crate::scenario_bench::main(a),
        Some(BenchCmd::Replay(a)) => return crate::replay_bench::main(a),
        None => {}
    }
    if args.which == crate::host::agent::AGENT_ARG {
        return crate::host::agent::serve().map(|()| 0);
    }
    let which = Bench::parse(&args.which).ok_or_else(|| {
        let names: Vec<_> = Bench::ALL.iter().map(|b| b.name()).collect();
        anyhow::anyhow!(
            "unknown benchmark `{}` (all, {})",
            args.which,
            names.join(", ")
        )
    })?;
    let opts = options(args, &which)?;
    let outs = outputs(args, args.which == "all");
    output::check(&outs)?;
    let host = HostSide::probe(!args.no_host);
    println!(
        "usermm bench {}: layouts {} MiB, sharing {} MiB, munlock {} MiB, anon-cow {} MiB per instance, reclaim {} MiB of memory, {} repetitions (up to {} while a gain's interval is wider than {} points), spawn {} s per point; host kernel columns: {}",
        args.which,
        opts.scale >> 20,
        opts.sharing_scale >> 20,
        opts.munlock_scale >> 20,
        opts.anon_cow_scale >> 20,
        opts.reclaim_memory >> 20,
        opts.reps,
        opts.max_reps,
        opts.tight_pp,
        opts.spawn_seconds,
        host.describe()
    );
    let progress = Progress::new(which.len() as u64, std::io::stderr().is_terminal());
    let report = suite::run(&which, &opts, &host, &progress, |t| {
        print!("{}", text::render(t))
    })?;
    let written = output::write(&report, &outs)?;
    let parts: Vec<String> = report
        .bench_seconds
        .iter()
        .map(|(b, s)| format!("{b} {s:.0} s"))
        .collect();
    println!(
        "\nsuite wall time: {:.1} s{}",
        report.wall_seconds,
        if parts.len() > 1 {
            format!(" ({})", parts.join(", "))
        } else {
            String::new()
        }
    );
    if let Some(h) = &outs.html {
        println!("report: {}", absolute(h).display());
    }
    if let Some(j) = &outs.json {
        println!("json:   {}", absolute(j).display());
    }
    if let Some(d) = &outs.plots {
        let n = written.iter().filter(|p| p.starts_with(d)).count();
        println!("plots:  {} ({n} files, PNG and SVG)", absolute(d).display());
    }
    Ok(0)
}

fn absolute(p: &std::path::Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}
