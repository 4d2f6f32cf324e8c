//! The usermm benchmark suite (`usermm bench`).
//!
//! Every benchmark puts the engine's variants (baseline → stages → best) and, where it can be
//! measured, the host kernel side by side in one run, on the same layout, and produces the
//! same shape: a [`model::Table`] of rows (a folio size, a VMA count) × variants, each cell
//! the timed samples of every repetition plus the exact counters of one.
//!
//! | module | what |
//! |---|---|
//! | [`model`] | the table model and the report; the JSON schema (`docs/bench-schema.md`) |
//! | [`stats`] | min/median/mean/stddev/max and the gain over the baseline |
//! | [`costmodel`] | the cost model's host side: measuring this machine's primitives, and the `model:` columns (the model itself is the `usermm-model` crate) |
//! | [`text`] | mmtests compare layout as text |
//! | [`plot`] | PNG and SVG plots (`plotters`, embedded font) |
//! | [`html`] | the self-contained HTML report |
//! | [`output`] | writing JSON, HTML and plots |
//! | [`options`] | the benchmark list and the options |
//! | [`ctx`] | what a benchmark sees while it runs; a row's repetitions |
//! | [`suite`] | running a selection of the benchmarks into one report; the options' defaults |
//! | [`host`] | the host-kernel columns (THP knobs saved and restored); the agent's cells and their timed parts, below every benchmark |
//! | [`fault`], [`fork`], [`spawn`], [`sharing`], [`anon_cow`], [`munlock`], [`linear_map`] | the benchmarks (seeds 000–004) |
//! | [`readahead`] | the page cache: sequential and random reads of a disk file |
//! | [`reclaim`] | reclaim and swap: anonymous working sets larger than memory, `MADV_PAGEOUT`, page-cache reclaim |
//! | [`calibrate`] | `usermm calibrate`: probes → fit → machine profile; the cached profile `usermm bench` predicts with |
//! | [`probes`] | the calibration probes: small mm workloads the host times and the engine counts |
//! | [`compare`] | `usermm bench compare`: reports side by side |
//! | [`scenario_bench`] | `usermm bench scenario`: scenario files under tunable sweeps |
//! | [`replay_bench`] | `usermm bench replay`: the shipped real-program traces under the switches |
//! | [`replay_model`] | the `model:` cells of a replay: its per-operation counters priced with a calibrated profile |
//! | [`columns`] | a table's engine columns as tunables settings; `--variants NAME=V1,V2` |
//! | [`sweep`] | `NAME=V1,V2` options of `--sweep` and `--variants`, their combinations |
//! | [`cli`] | `usermm bench` |

pub mod anon_cow;
pub mod cli;
pub mod columns;
pub mod compare;
pub mod costmodel;
pub mod ctx;
pub mod engine;
pub mod fault;
pub mod fork;
pub mod host;
pub mod html;
pub mod linear_map;
pub mod model;
pub mod munlock;
pub mod options;
pub mod output;
pub mod plot;
pub mod progress;
pub mod readahead;
pub mod reclaim;
pub mod replay_bench;
pub mod replay_model;
pub mod scenario_bench;
pub mod sharing;
pub mod spawn;
pub mod stats;
pub mod suite;
pub mod sweep;
pub mod text;

pub use costmodel::{calibrate, probes};
pub use model::{Report, Table, SCHEMA_VERSION};
pub use options::{Bench, Options};
