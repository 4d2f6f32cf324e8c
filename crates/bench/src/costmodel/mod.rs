//! The cost model's host side: what the engine's exact counters cost on the running kernel.
//!
//! The model itself — recipes, the fit, machine profiles — is the `usermm-model` crate (its
//! `lib.rs` is the design note: `time = Σ counter × price`, recipes as priors, prices
//! fitted on this machine's probes with each operation's own prices pooled toward shared
//! ones). This folder holds what needs the host and the engine:
//!
//! | module | what |
//! |---|---|
//! | [`primitives`] | the machine's primitive costs measured from user space (they price the recipes, the fit's priors), and the physical adjacency of a layout's folios |
//! | [`probes`] | the calibration probes: ≥ 12 operations swept over pages, VMAs, folio order and calls, timed on the host in fresh agent processes and counted on the engine; none is a benchmark row |
//! | [`calibrate`] | `usermm calibrate`: runs the probes, fits, caches the profile per machine and kernel; `--evaluate` prices a saved report with a profile, `--refit` fits a profile's probe points again |
//! | [`repeat`] | how well the host repeats itself between runs: the ceiling of the ±20 % count, from several reports (`--evaluate A B …`) |
//! | [`freshness`] | whether a cached profile still describes the machine: one probe point of each operation timed again before a bench predicts with it |
//! | [`columns`] | the tables' `model:` columns: each engine cell priced with the profile (the host's measured scatter of the row's layout as a covariate), 95 % intervals, gains with intervals, accuracy against the host column in the notes |
//!
//! How a prediction is made, for a row of table `t`: the row's operation ([`row_op`]), the
//! engine cell's counters plus the host cell's scatter of the layout
//! (`usermm_model::profile::HOST_FAR`), turned into features (`profile::features`: fork's
//! and zap's entries apart, cold walks past the last-level cache, system calls priced per
//! operation), priced with that operation's fitted prices. Nothing is fitted to the rows:
//! the profile is made from the probes alone, before the rows are run.
//!
//! What it leaves out, and the table notes say when it matters: work no engine counter
//! names (a task's first run in a new mm, RCU callbacks, the hypervisor's free-page
//! reporting that contends for the zone lock when hundreds of MiB go back to the buddy
//! allocator), cache state beyond the cold walk and scatter features, and remote TLB
//! shootdowns (the engine does not count them apart).

pub mod calibrate;
pub mod columns;
pub mod freshness;
pub mod primitives;
pub mod probes;
pub mod repeat;

pub use columns::*;
pub use primitives::*;
