//! The usermm cost model: what the engine's exact counters cost on a real kernel.
//!
//! # Design
//!
//! The engine does what Linux does event for event (PTEs read and written, folio atomics,
//! locks, faults, TLB flushes, VMAs copied…) and counts every event exactly, but not at the
//! kernel's price. The model predicts the kernel's time of an operation as
//!
//! ```text
//! time = Σ_c  n_c × price_c          (n: the engine's counters and a few pseudo-counters)
//! ```
//!
//! where the pseudo-counters carry what the engine does not count itself: the fixed work
//! of a fork and of an exit (`op_fork`, `op_exit`), the mm system calls' own fixed work
//! (`syscalls_mm`, priced by each operation), mprotect's per-entry calls, the slab objects a fork
//! allocates past what the caches keep hot, pages zeroed or copied past the last-level
//! cache ([`profile::features`]).
//!
//! **Recipes are priors, the running kernel sets the prices.** Each counter has a recipe:
//! the kernel work per event in primitives (out-of-line calls, locked RMWs, cache lines,
//! spinlocks, traps, page zeroing…), read from Linux 6.18 ([`prices::RECIPES`]). Priced
//! with this machine's primitives, measured from user space, the recipes are one build's
//! call counts at one CPU's call price: on an AMD guest with Safe-RET returns they missed
//! the host by −40…+140 % where they had fit an Intel guest. So `usermm calibrate` times
//! probe workloads on the host (`usermm_bench::probes`: ≥ 12 operations, each a family
//! swept over pages, VMAs, folio order or stride, none a benchmark row's layout), counts the
//! same workloads on the engine, and fits ([`fit`]):
//!
//! ```text
//! min Σ_i ((pred_i − t_i)/t_i)² + λ Σ_g (m_g − μ)² + ε (μ − 1)²,   m, μ ≥ 0
//! price_c = m_g(c) × recipe_c
//! ```
//!
//! non-negative least squares on relative error, at two levels: each counter group's
//! shared multiplier is pulled toward a common scale μ (the recipes' relative prices are
//! trusted more than their level), and each operation whose probes spend a share of their
//! time on the group gets its own multiplier pulled toward the shared one (λ_o): one counter
//! names different kernel work in different paths (a PTE read in fork's batched copy, in
//! zap's walk), and a single price per counter missed fork's rows by +54 % at 2 MiB folios
//! where fork's own probes put them within 15 %. λ and λ_o are chosen by leaving one probe
//! family out at a time; counters whose probe columns are proportional are merged and named
//! (only their sum is determined); a counter no probe excites is priced at μ × its recipe
//! and says so. Every price has a standard error (the ridge posterior), and the families
//! that determine it. The host's physical scatter of a layout (the share of folio
//! boundaries far apart, sampled from `pagemap` by the probes and the bench's host cells)
//! enters as a covariate of the cold walk ([`profile::FOLIOS_COLD`]): on this AMD guest a
//! fork of 4 KiB folios cost 91 to 125 ns a page at the same size as the allocator's state
//! changed. Large folios' cold batches are priced apart ([`profile::LARGE_FOLIOS_COLD`]):
//! their frees go through the buddy allocator's merging, and munmap of 64 KiB folios grew
//! from 493 to 781 ns a folio between 10 and 156 MiB where 4 KiB folios stayed flat. A file
//! fault is its own operation (`fault_file`: `filemap_map_pages`' fault-around, not the
//! anonymous fault's zeroing), so its prices are not the anonymous fault's. Fork's fixed
//! work is dearer after its layout was written through the cache ([`profile::OP_FORK_COLD`]:
//! 110 µs after 4 MiB, about 280 after 96 MiB on this guest), and only single-page
//! batches' write-protects pay a cold PTE line ([`profile::PTE_ATOMICS_COLD`]): with both,
//! the fork rows of 256 KiB to 2 MiB folios, 20 to 30 % high before, came within ±20 %.
//!
//! **Profiles.** A calibration is saved as a machine profile ([`profile::Profile`]: the
//! machine's fingerprint — CPU, kernel build, mitigations, THP settings —, the priors, the
//! probe points, the prices, the fit's quality), cached per machine and kernel under
//! `~/.cache/usermm`, reused by `usermm bench` while fresh (the same machine, kernel build
//! and probes, and its probe points still timed at its times: the bench's freshness check),
//! and portable: `usermm bench --profile FILE` predicts with another machine's prices. A
//! profile file is untrusted input (bounded, validated, never read or written through a
//! symbolic link).
//!
//! **Honest output.** A prediction carries a 95 % interval from the prices' covariance
//! plus the fit's transfer error (the leave-one-family-out errors' spread); a predicted
//! gain carries the interval of the prices' uncertainty. The benchmark rows are judged
//! against the host, never fitted.
//!
//! **Limits.** A counter has one price in every context; where one counter names different
//! kernel work in different paths the pseudo-counters split it (fork's and zap's entries,
//! mprotect's), and where no counter varies with the host's cost (the maple tree's depth in
//! an mmap among thousands of VMAs, remote TLB shootdowns) the model cannot follow.
//!
//! | module | what |
//! |---|---|
//! | [`prices`] | the machine's primitive costs, the recipes (Linux 6.18's work per counter event, in primitives) and the recipe prediction |
//! | [`fit`] | per-event prices fitted to probe timings: NNLS with a ridge pull toward the recipes, λ by leaving one probe family out |
//! | [`pool`] | a calibration's probe times pooled with the machine's recent ones (each point's median, earlier ones scaled to the new level) |
//! | [`profile`] | a machine profile: fingerprint, probe points, fitted prices; read as hostile input, cached safely |
//! | [`recipe_symbols`] | whether the running kernel inlines what the recipes' call counts assume |

pub mod fit;
pub mod pool;
pub mod prices;
pub mod profile;
pub mod recipe_symbols;
