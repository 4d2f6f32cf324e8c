//! The one shape every benchmark produces: a [`Table`] of rows × variants, each cell a
//! [`Column`] of timed samples plus the exact counters of one repetition; and the
//! [`Report`] that collects the tables of a run. This is also the JSON schema
//! (`docs/bench-schema.md`): every type here serializes as documented there.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the JSON layout; bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 2;

/// What a sample measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Elapsed time of one operation, seconds.
    Seconds,
    /// Operations per second.
    PerSecond,
    /// Bytes per second (memory throughput); shown in MiB/s.
    BytesPerSecond,
}

/// Which direction is an improvement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    /// Less is better (time).
    Lower,
    /// More is better (rate).
    Higher,
}

/// A summary row of the mmtests layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stat {
    /// Smallest sample.
    Min,
    /// Median sample (the upper one of an even count).
    Median,
    /// Arithmetic mean.
    Mean,
    /// Population standard deviation.
    Stddev,
    /// Largest sample.
    Max,
}

impl Stat {
    /// The row name as mmtests prints it.
    pub fn label(self) -> &'static str {
        match self {
            Stat::Min => "Min",
            Stat::Median => "Median",
            Stat::Mean => "Mean",
            Stat::Stddev => "Stddev",
            Stat::Max => "Max",
        }
    }
}

/// Where a column's numbers come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VariantKind {
    /// The usermm engine with one setting of its tunables; counters are exact and
    /// identical between runs.
    Engine,
    /// The host's Linux kernel running the same layout; counters are what the host reports
    /// (they may vary between runs).
    Host,
    /// The cost model's prediction of the host kernel's time for an engine variant
    /// (`model:<variant>`): that variant's exact counters times this machine's measured
    /// primitive costs (`crate::costmodel`); its counters are the prediction's parts, ns.
    Model,
    /// The baseline engine variant measured a second time (`<baseline> again`), a cell of its
    /// own in every repetition's rotation: an A/A control. Its gain over the baseline is the
    /// table's noise, so its interval must contain 0 (read `~`); a row where it does not was
    /// measured under a systematic disturbance, and its other gains with it.
    Control,
}

/// One column of a table: an engine setting or the host kernel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    /// Short name, the column header (`per-pte`, `stage3`, `host`).
    pub name: String,
    /// Engine or host.
    pub kind: VariantKind,
    /// One sentence on what this variant is.
    pub about: String,
}

impl Variant {
    /// An engine variant.
    pub fn engine(name: &str, about: &str) -> Variant {
        Variant {
            name: name.into(),
            kind: VariantKind::Engine,
            about: about.into(),
        }
    }

    /// The A/A control of the baseline variant `baseline` (see [`VariantKind::Control`]).
    pub fn control(baseline: &str) -> Variant {
        Variant {
            name: control_name(baseline),
            kind: VariantKind::Control,
            about: format!(
                "A/A control: `{baseline}` measured again, in the same rotation; its gain over `{baseline}` is the noise and must read ~"
            ),
        }
    }

    /// The host-kernel variant.
    pub fn host(about: &str) -> Variant {
        Variant {
            name: "host".into(),
            kind: VariantKind::Host,
            about: about.into(),
        }
    }
}

/// The name of the A/A control column of `baseline`.
pub fn control_name(baseline: &str) -> String {
    format!("{baseline} again")
}

/// One cell: the samples of one variant for one row, and its counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Column {
    /// The variant's name.
    pub variant: String,
    /// One sample per repetition, in [`Table::unit`].
    pub samples: Vec<f64>,
    /// Counters of one repetition (engine: exact; host: as the host reports them).
    pub counters: BTreeMap<String, u64>,
    /// Why there are no samples (`"not root"`, `"1 NUMA node"`), if there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    /// Engine columns other than the baseline: the 95 % interval of the median gain over the
    /// baseline (the sign-test interval, [`crate::stats::gain_ci95`]), from the repetitions
    /// paired by index (`[lo, hi]`, percent; an interval
    /// containing 0 is shown as `~`, not a gain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gain_ci95_pct: Option<[f64; 2]>,
}

impl Column {
    /// A measured cell.
    pub fn new(variant: &str, samples: Vec<f64>, counters: BTreeMap<String, u64>) -> Column {
        Column {
            variant: variant.into(),
            samples,
            counters,
            ..Column::default()
        }
    }

    /// Adds one host repetition: its sample and counters, or the reason it failed (which
    /// makes the whole cell unavailable).
    pub fn record(&mut self, res: Result<(f64, BTreeMap<String, u64>), String>) {
        if self.unavailable.is_some() {
            return;
        }
        match res {
            Ok((s, c)) => {
                self.samples.push(s);
                self.counters = c;
            }
            Err(why) => *self = Column::unavailable(&self.variant, &why),
        }
    }

    /// A cell that could not be measured, with the reason.
    pub fn unavailable(variant: &str, reason: &str) -> Column {
        Column {
            variant: variant.into(),
            unavailable: Some(reason.into()),
            ..Column::default()
        }
    }
}

/// A number the seed's cover letter published, next to ours.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Published {
    /// The variant of ours it corresponds to.
    pub variant: String,
    /// The published change as a gain over the seed's baseline, in the mmtests convention:
    /// positive is better (a time that fell 30 % is `30.0`; a rate that rose 53 % is `53.0`).
    pub gain_pct: f64,
    /// The number as the seed printed it (`"-30%"`, `"43.46%"`).
    pub text: String,
}

/// How a seed printed a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeedSign {
    /// The change of a time (`"-30%"`: it fell, which is better).
    TimeChange,
    /// Already a gain in the mmtests convention, or the change of a rate (positive is better).
    Gain,
}

impl Published {
    /// The seed's `text` (`"-30%"`, `"43.46%"`) for our `variant`.
    pub fn parse(variant: impl Into<String>, text: &str, sign: SeedSign) -> Published {
        let v: f64 = text.trim_end_matches('%').parse().unwrap_or(0.0);
        Published {
            variant: variant.into(),
            gain_pct: if sign == SeedSign::TimeChange { -v } else { v },
            text: text.into(),
        }
    }
}

/// One row: a parameter value (a folio size, a VMA count) with one cell per variant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The parameter value (`"64K"`, `"21+6400"`).
    pub label: String,
    /// One cell per variant, in [`Table::variants`] order.
    pub columns: Vec<Column>,
    /// The seed's published numbers for this row.
    #[serde(default)]
    pub published: Vec<Published>,
    /// What the row's memory is when a table mixes kinds (`"anon"`, `"tmpfs MAP_SHARED"`):
    /// absent where every row of the table is the same kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
}

/// A benchmark table in the mmtests compare layout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// Stable identifier (`fork`, `munlock-one-node`): the HTML anchor and plot file name.
    pub id: String,
    /// Human title.
    pub title: String,
    /// The seed this table reproduces (`"000"`), if any.
    pub seed: Option<String>,
    /// What a sample is (`"fork() time"`).
    pub metric: String,
    /// Unit of the samples.
    pub unit: Unit,
    /// Which direction is an improvement.
    pub better: Better,
    /// The summary rows shown (min/median/max, or min/mean/stddev/max).
    pub stats: Vec<Stat>,
    /// The variant every gain is computed against.
    pub baseline: String,
    /// The columns, baseline and stages first, the host last.
    pub variants: Vec<Variant>,
    /// What the row labels are (`"folio size"`).
    pub row_label: String,
    /// The rows.
    pub rows: Vec<Row>,
    /// The counters shown under the timings (all counters are in the JSON).
    pub counters_shown: Vec<String>,
    /// Where the published numbers come from (machine, size), if any.
    pub published_source: Option<String>,
    /// Remarks printed under the table.
    pub notes: Vec<String>,
    /// The engine variant whose algorithm the host kernel runs: its `model:` column is
    /// compared with the host column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_matches: Option<String>,
    /// The primitive costs the table's `model:` columns were computed from, measured just
    /// before the table ran (the machine's state drifts over a run: on this 2-vCPU guest
    /// `kcall` read from 4 to 8 ns in one afternoon, with the host rows moving alike).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_model: Option<usermm_model::prices::Primitives>,
}

impl Table {
    /// Index of a variant.
    pub fn variant_index(&self, name: &str) -> Option<usize> {
        self.variants.iter().position(|v| v.name == name)
    }

    /// Index of the baseline variant.
    pub fn baseline_index(&self) -> Option<usize> {
        self.variant_index(&self.baseline)
    }
}

/// How the run was configured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// The benchmarks run (`all`, `fork`, …).
    pub which: String,
    /// Size of the memory layouts, bytes.
    pub scale_bytes: u64,
    /// Repetitions per measurement (the least a row runs).
    pub reps: usize,
    /// The most a row with gains runs while a gain's interval is wider than `tight_pp`
    /// (0 in reports from before adaptive repetitions).
    #[serde(default)]
    pub max_reps: usize,
    /// Percentage points: the interval width below which a row stops repeating (0 where
    /// rows do not adapt: reports from before, `bench scenario`).
    #[serde(default)]
    pub tight_pp: f64,
    /// Seconds per point of the spawn benchmark.
    pub spawn_seconds: f64,
    /// RAM sizes of the linear-map benchmark, GiB.
    pub linear_map_gib: Vec<u64>,
    /// Memory of the reclaim benchmark's machine and host cgroup, bytes (0 in reports from
    /// before it, and in `bench scenario` reports).
    #[serde(default)]
    pub reclaim_memory_bytes: u64,
}

/// The machine the run was on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostInfo {
    /// `uname -r`-style kernel release (from /proc), or empty.
    pub kernel: String,
    /// Online CPUs.
    pub cpus: usize,
    /// NUMA nodes with memory.
    pub numa_nodes: usize,
    /// Whether the host-kernel columns could be measured, or why not.
    pub host_columns: String,
}

/// When, how and from what a run was made (for comparing runs later).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    /// Start of the run, seconds since the Unix epoch.
    pub started_unix: u64,
    /// The command line.
    pub command_line: String,
    /// The git commit the binary was built from (empty outside a checkout).
    pub git_commit: String,
    /// The CPU model (`/proc/cpuinfo`).
    pub cpu_model: String,
    /// `/proc/loadavg` at the start.
    pub loadavg: String,
}

impl RunMeta {
    /// This run's metadata, read now.
    pub fn collect() -> RunMeta {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        RunMeta {
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            command_line: std::env::args().collect::<Vec<_>>().join(" "),
            git_commit: env!("USERMM_GIT_COMMIT").to_string(),
            cpu_model: cpuinfo
                .lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|v| v.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default(),
            loadavg: std::fs::read_to_string("/proc/loadavg")
                .map(|t| t.trim().to_string())
                .unwrap_or_default(),
        }
    }
}

/// Everything one `usermm bench` run produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// When, how and from what the run was made (absent in reports of older versions).
    #[serde(default)]
    pub meta: RunMeta,
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// `usermm-bench <version>`.
    pub generator: String,
    /// Configuration.
    pub run: RunInfo,
    /// The machine.
    pub host: HostInfo,
    /// Wall time of the whole run, seconds.
    pub wall_seconds: f64,
    /// Wall time of each benchmark, seconds, in run order (absent in older reports).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bench_seconds: Vec<(String, f64)>,
    /// The tables, in run order.
    pub tables: Vec<Table>,
    /// This machine's primitive costs as measured before the first modelled benchmark
    /// (absent when the run had no model columns); each table's own are in its `cost_model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_model: Option<usermm_model::prices::Primitives>,
}

impl Report {
    /// Serializes as pretty JSON.
    pub fn to_json(&self) -> anyhow::Result<String> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// Parses a report, refusing another schema version.
    pub fn from_json(text: &str) -> anyhow::Result<Report> {
        let r: Report = serde_json::from_str(text)?;
        anyhow::ensure!(
            r.schema_version == SCHEMA_VERSION,
            "report schema {} is not {SCHEMA_VERSION}",
            r.schema_version
        );
        Ok(r)
    }
}
