//! The `model:` columns of the bench tables: each engine cell's counters priced with a
//! calibrated profile (or, for the tables outside the calibration, the recipes at this
//! machine's primitives), with intervals, the gain over the baseline, and the accuracy
//! against the host column in the table's notes.

use super::primitives::*;
use crate::model::{Better, Column, Table, Unit, Variant, VariantKind};
use crate::stats::{headline, summary};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use usermm_model::profile::HOST_FAR;
/// Inserts a `model:<v>` column for every engine variant of `table`, before the host
/// column, and notes the model's accuracy against the host column for `host_matches`
/// (`prims`: the median of `all`, the measurements of fresh processes), and how far each
/// process's primitives alone would move it (see `spread_note`).
/// The counters behind a prediction are the engine cell's; a sample is the prediction in
/// the table's unit, repeated once per engine repetition (the model is deterministic).
pub fn add_model_columns(
    table: &mut Table,
    prims: &Primitives,
    host_matches: &str,
    all: &[Primitives],
) {
    let processes = all.len();
    let engines: Vec<(usize, Variant)> = table
        .variants
        .iter()
        .enumerate()
        .filter(|(_, v)| v.kind == VariantKind::Engine)
        .map(|(i, v)| (i, v.clone()))
        .collect();
    if engines.is_empty() {
        return;
    }
    let host = table
        .variants
        .iter()
        .position(|v| v.kind == VariantKind::Host);
    let at = host.unwrap_or(table.variants.len());
    let models: Vec<Variant> = engines
        .iter()
        .map(|(_, v)| Variant {
            name: model_name(&v.name),
            kind: VariantKind::Model,
            about: format!(
                "the cost model's prediction of the host kernel's time for `{}`: its exact counters x this machine's measured primitive costs",
                v.name
            ),
        })
        .collect();
    let mut own_adjacency = 0;
    // Per row: the prediction for `host_matches` with the median primitives and the least
    // and most with one process's own (ns).
    let mut spreads: Vec<(f64, f64, f64)> = Vec::new();
    for row in &mut table.rows {
        // The host layout's own frame steps, where its cell measured them: the walk the
        // model prices is that layout's (a report without the far share has all its
        // non-adjacent steps near).
        let host_counter = |name: &str| {
            host.and_then(|h| row.columns.get(h))
                .and_then(|c| c.counters.get(name))
                .map(|&permille| permille as f64 / 1000.0)
        };
        let steps = host_counter(crate::host::agent::FOLIO_ADJACENCY).map(|adjacent| FrameSteps {
            adjacent,
            far: host_counter(crate::host::agent::FOLIO_FAR).unwrap_or(0.0),
        });
        own_adjacency += usize::from(steps.is_some());
        let priced = |p: &Primitives| steps.map_or(*p, |s| p.with_frame_steps(s));
        let prims = &priced(prims);
        // The prediction for `host_matches` with the median primitives (ns).
        let mut mid = f64::NAN;
        let cells: Vec<Column> = engines
            .iter()
            .map(|(i, v)| {
                let c = &row.columns[*i];
                if c.samples.is_empty() {
                    return Column::unavailable(&model_name(&v.name), "no engine cell");
                }
                let (ns, parts) = predict(prims, &table.id, &c.counters);
                if v.name == host_matches {
                    mid = ns;
                }
                let value = match table.unit {
                    Unit::Seconds => ns * 1e-9,
                    Unit::PerSecond => 1e9 / ns.max(1e-3),
                    Unit::BytesPerSecond => f64::NAN,
                };
                Column::new(&model_name(&v.name), vec![value; c.samples.len()], parts)
            })
            .collect();
        // The least and most with one process's own.
        let (mut lo, mut hi) = (f64::NAN, f64::NAN);
        let matched = engines.iter().find(|(_, v)| v.name == host_matches);
        if let Some((i, _)) = matched.filter(|_| mid.is_finite()) {
            for p in all {
                let ns = predict(&priced(p), &table.id, &row.columns[*i].counters).0;
                (lo, hi) = (lo.min(ns), hi.max(ns));
            }
        }
        spreads.push((mid, lo, hi));
        row.columns.splice(at..at, cells);
    }
    table.variants.splice(at..at, models);
    table.host_matches = Some(host_matches.to_string());
    table.cost_model = Some(*prims);
    if let Some(a) = accuracy(table) {
        table.notes.push(format!(
            "model: {} within ±20 % of the host median on {} of {} rows (median error {:+.0} %, worst {:+.0} % at {}); primitives: {}; counters exact, nothing fitted to these rows",
            model_name(host_matches),
            a.within_20pct,
            a.rows,
            a.median_error_pct,
            a.worst_error_pct,
            a.worst_row,
            if processes == 0 {
                "measured in this process (no agent process could be started)".to_string()
            } else {
                format!("the median of {processes} fresh processes' measurements, before the table and after each row")
            }
        ));
    }
    if let Some(note) = spread_note(table, &spreads, processes) {
        table.notes.push(note);
    }
    if own_adjacency > 0 {
        table.notes.push(format!(
            "model: line_jump priced with the host layout's own frame steps ({}, {}) on {own_adjacency} of {} rows",
            crate::host::agent::FOLIO_ADJACENCY,
            crate::host::agent::FOLIO_FAR,
            table.rows.len()
        ));
    }
    if let Some(note) = slab_note(table, host_matches, prims) {
        table.notes.push(note);
    }
}

/// Counter of a `model:` cell: the low end of the prediction's 95 % interval, ns.
pub const MODEL_CI_LO: &str = "model_ci95_lo_ns";
/// Counter of a `model:` cell: the high end of the prediction's 95 % interval, ns.
pub const MODEL_CI_HI: &str = "model_ci95_hi_ns";

/// Inserts a `model:<v>` column for every engine variant of `table`, before the host
/// column, priced with a calibrated `profile` (`usermm calibrate`) instead of the recipes:
/// each cell is its exact counters × the fitted prices, with the 95 % prediction interval
/// ([`MODEL_CI_LO`], [`MODEL_CI_HI`]) and, beside `model:<baseline>`, the predicted gain's
/// interval (`gain_ci95_pct`). The note says how many rows land within ±20 % of the host,
/// names the rows outside, and gives the fit's leave-one-family-out error; `source` says
/// where the profile came from. Nothing of these rows enters the fit.
pub fn add_profile_columns(
    table: &mut Table,
    profile: &usermm_model::profile::Profile,
    host_matches: &str,
    source: &str,
) {
    let engines: Vec<(usize, String)> = table
        .variants
        .iter()
        .enumerate()
        .filter(|(_, v)| v.kind == VariantKind::Engine)
        .map(|(i, v)| (i, v.name.clone()))
        .collect();
    if engines.is_empty() {
        return;
    }
    let at = table
        .variants
        .iter()
        .position(|v| v.kind == VariantKind::Host)
        .unwrap_or(table.variants.len());
    let base = engines
        .iter()
        .find(|(_, v)| *v == table.baseline)
        .map(|&(i, _)| i);
    let id = table.id.clone();
    let host = table
        .variants
        .iter()
        .position(|v| v.kind == VariantKind::Host);
    for row in &mut table.rows {
        let op = row_op(&id, &row.label);
        // The scatter the host's allocator gave this row's layout, where its cell sampled
        // it: the engine's counters priced on the host's layout.
        let far = host
            .and_then(|h| row.columns.get(h))
            .and_then(|c| c.counters.get(HOST_FAR).copied());
        let with_far = |c: &BTreeMap<String, u64>| {
            let mut c = c.clone();
            if let Some(far) = far {
                c.insert(HOST_FAR.into(), far);
            }
            c
        };
        let base_counters = base
            .and_then(|b| row.columns.get(b))
            .map(|c| with_far(&c.counters));
        let cells: Vec<Column> = engines
            .iter()
            .map(|(i, v)| {
                let c = &row.columns[*i];
                if c.samples.is_empty() {
                    return Column::unavailable(&model_name(v), "no engine cell");
                }
                let counters = with_far(&c.counters);
                let p = profile.predict(op, &counters);
                let value = |ns: f64| match table.unit {
                    Unit::Seconds => ns * 1e-9,
                    Unit::PerSecond => 1e9 / ns.max(1e-3),
                    Unit::BytesPerSecond => f64::NAN,
                };
                let mut parts: BTreeMap<String, u64> = profile
                    .parts(op, &counters)
                    .into_iter()
                    .map(|(k, ns)| (format!("model_{k}_ns"), ns.round() as u64))
                    .collect();
                parts.insert(MODEL_CI_LO.into(), p.ci95[0].round() as u64);
                parts.insert(MODEL_CI_HI.into(), p.ci95[1].round() as u64);
                let mut col =
                    Column::new(&model_name(v), vec![value(p.ns); c.samples.len()], parts);
                if Some(*i) != base {
                    col.gain_ci95_pct = base_counters
                        .as_ref()
                        .and_then(|b| profile.gain(op, &counters, b))
                        .map(|(_, [lo, hi])| match table.better {
                            Better::Lower => [lo, hi],
                            // A rate's gain from a time's: 1/(1 - g) - 1, increasing in g.
                            // The time's interval may pass 100 %, which no time reaches.
                            Better::Higher => {
                                [lo, hi].map(|g| (1.0 / (1.0 - g.min(99.0) / 100.0) - 1.0) * 100.0)
                            }
                        });
                }
                col
            })
            .collect();
        row.columns.splice(at..at, cells);
    }
    let models: Vec<Variant> = engines
        .iter()
        .map(|(_, v)| Variant {
            name: model_name(v),
            kind: VariantKind::Model,
            about: format!(
                "the calibrated model's prediction of the host kernel's time for `{v}`: its exact counters x the prices fitted on this machine's probes"
            ),
        })
        .collect();
    table.variants.splice(at..at, models);
    table.host_matches = Some(host_matches.to_string());
    table.cost_model = Some(profile.primitives);
    let fit = &profile.fit;
    let quality = format!(
        "fit: {} probe points, median error {:.1} % in sample and {:.1} % leaving one probe family out",
        profile.observations.len(),
        fit.in_sample_median_pct,
        fit.held_out_median_pct()
    );
    match accuracy(table) {
        Some(a) => {
            let outside: Vec<&str> = outside_rows(table)
                .into_iter()
                .map(|(r, _)| table.rows[r].label.as_str())
                .collect();
            table.notes.push(format!(
                "model: {} within ±20 % of the host median on {} of {} rows (median error {:+.0} %, worst {:+.0} % at {}){}; {}; profile {source}; {quality}; nothing fitted to these rows",
                model_name(host_matches),
                a.within_20pct,
                a.rows,
                a.median_error_pct,
                a.worst_error_pct,
                a.worst_row,
                if outside.is_empty() {
                    String::new()
                } else {
                    format!("; outside ±20 % (marked !): {}", outside.join(", "))
                },
                host_steadiness(table).map_or_else(String::new, |h| h.describe())
            ));
        }
        None => table
            .notes
            .push(format!("model: profile {source}; {quality}")),
    }
}

/// The operation a row of table `id` times, as `usermm_model::profile::features` names it:
/// its fixed work and its system calls' price.
pub fn row_op<'a>(id: &'a str, label: &str) -> &'a str {
    match id {
        "sharing" => match label.split_whitespace().next().unwrap_or_default() {
            "remap" => "mprotect",
            "munmap" => "munmap",
            "fork" => "fork",
            "pte-dontneed" => "madvise",
            _ => "fault",
        },
        id if id.starts_with("munlock") => "munlock",
        "fork" | "spawn" | "munmap" => id,
        "fault" if label.starts_with("tmpfs-read") => "fault_file",
        _ => "fault",
    }
}

/// The rows (index, error percent) whose `model:<host_matches>` misses the host median by
/// more than 20 %.
pub fn outside_rows(table: &Table) -> Vec<(usize, f64)> {
    (0..table.rows.len())
        .filter_map(|r| model_error_pct(table, r).map(|e| (r, e)))
        .filter(|&(_, e)| e.abs() > 20.0)
        .collect()
}

/// The error of `model:<host_matches>` against the host median on row `row`, percent of the
/// host's time (a rate's error is its inverse's).
pub fn model_error_pct(table: &Table, row: usize) -> Option<f64> {
    let m = table.variant_index(&model_name(table.host_matches.as_deref()?))?;
    let h = table
        .variants
        .iter()
        .position(|v| v.kind == VariantKind::Host)?;
    let r = table.rows.get(row)?;
    let (p, host) = (
        headline(table, &r.columns[m])?,
        headline(table, &r.columns[h])?,
    );
    // Error as a time: a rate's error is that of its inverse.
    let valid = host > 0.0 && p.is_finite() && (table.better == Better::Lower || p > 0.0);
    valid.then(|| match table.better {
        Better::Lower => (p - host) / host * 100.0,
        Better::Higher => (host - p) / p * 100.0,
    })
}

/// What the slab caches' hot objects did to `host_matches`'s predictions (`None` for a
/// table whose forks copy fewer VMAs and nodes than the caches keep hot on every row, or
/// that copies none): how many rows allocate past them, or that the caches could not be read.
fn slab_note(table: &Table, host_matches: &str, prims: &Primitives) -> Option<String> {
    let i = table.variants.iter().position(|v| v.name == host_matches)?;
    let counts: Vec<(u64, u64)> = table
        .rows
        .iter()
        .filter_map(|row| {
            let c = &row.columns.get(i)?.counters;
            let vmas = *c.get("vmas_copied")?;
            Some((vmas, c.get("vma_nodes_allocated").copied().unwrap_or(0)))
        })
        .collect();
    if counts.is_empty() {
        return None;
    }
    let (Some(vma), Some(node)) = (prims.vma_slab, prims.node_slab) else {
        return Some(
            "model: /sys/kernel/slab could not be read (it needs root): no fork is priced for VMAs and tree nodes past what the slab caches keep hot, so rows of many VMAs fall short".into(),
        );
    };
    let past = counts
        .iter()
        .filter(|&&(vmas, nodes)| vmas > vma.hot_objects() || nodes > node.hot_objects())
        .count();
    (past > 0).then(|| {
        format!(
            "model: the slab caches keep {} vm_area_structs and {} maple_nodes hot (/sys/kernel/slab: sheaves, barn, partial slabs); on {past} of {} rows a fork allocates past them and pays a cold line per object beyond",
            vma.hot_objects(),
            node.hot_objects(),
            counts.len()
        )
    })
}

/// How far the primitives' spread over the processes that measured them moves the model:
/// per row, `(median, least, most)` predictions for `host_matches` (ns: [`add_model_columns`]).
/// A row outside ±20 % of the host median under every process's primitives is a miss of the
/// model's structure (recipes, what it leaves out), not of one process's measurement.
fn spread_note(table: &Table, spreads: &[(f64, f64, f64)], processes: usize) -> Option<String> {
    let h = table
        .variants
        .iter()
        .position(|v| v.kind == VariantKind::Host)?;
    let (mut widest, mut widest_row) = (0.0f64, String::new());
    let (mut misses, mut structural) = (0, 0);
    for (row, &(mid, lo, hi)) in table.rows.iter().zip(spreads) {
        if !(mid > 0.0 && lo.is_finite() && hi.is_finite()) {
            continue;
        }
        let width = (hi - lo) / mid * 100.0;
        if width > widest {
            (widest, widest_row) = (width, row.label.clone());
        }
        let Some(host) = headline(table, &row.columns[h]).filter(|v| *v > 0.0) else {
            continue;
        };
        let host_ns = match table.unit {
            Unit::PerSecond => 1e9 / host,
            _ => host * 1e9,
        };
        let err = |ns: f64| (ns - host_ns) / host_ns;
        if err(mid).abs() > 0.2 {
            misses += 1;
            structural += usize::from(err(lo) > 0.2 || err(hi) < -0.2);
        }
    }
    (processes > 1 && !widest_row.is_empty()).then(|| {
        format!(
            "model spread: with one process's primitives instead of the median of {processes}, a row's prediction moves within a band {widest:.0} % of it wide at most ({widest_row}); of the {misses} rows outside ±20 % of the host median, {structural} stay outside with every process's primitives"
        )
    })
}

/// How well the host repeats itself in a table, the scale a prediction of its medians can
/// be judged on: of the rows with host samples, those whose every sample lies within ±20 % of
/// the row's median, and of all the samples, those within ±20 % of their row's median. On
/// this 2-vCPU guest a row's samples often fall into two bands 25-40 % apart (free page
/// reporting, neighbours), so a row can miss ±20 % by where its median falls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostSteadiness {
    /// Rows with host samples.
    pub rows: usize,
    /// Of those, rows whose every sample is within ±20 % of the row's median.
    pub steady_rows: usize,
    /// Host samples in all.
    pub samples: usize,
    /// Of those, samples within ±20 % of their row's median.
    pub samples_within: usize,
}

impl HostSteadiness {
    /// `steady on K of N rows (S % of the samples within ±20 % of their median)`.
    pub fn describe(&self) -> String {
        format!(
            "the host's own samples all lie within ±20 % of their row's median on {} of {} rows ({:.0} % of the samples do)",
            self.steady_rows,
            self.rows,
            self.samples_within as f64 * 100.0 / self.samples.max(1) as f64
        )
    }

    /// The sums of `self` and `other`.
    pub fn add(&mut self, other: &HostSteadiness) {
        self.rows += other.rows;
        self.steady_rows += other.steady_rows;
        self.samples += other.samples;
        self.samples_within += other.samples_within;
    }
}

/// [`HostSteadiness`] of `table`'s host column (`None` without one).
pub fn host_steadiness(table: &Table) -> Option<HostSteadiness> {
    let h = table
        .variants
        .iter()
        .position(|v| v.kind == VariantKind::Host)?;
    let mut st = HostSteadiness::default();
    for r in &table.rows {
        let Some(samples) = r.columns.get(h).map(|c| &c.samples) else {
            continue;
        };
        let Some(median) = summary(crate::model::Stat::Median, samples).filter(|m| *m > 0.0) else {
            continue;
        };
        let within = samples
            .iter()
            .filter(|&&x| (x / median - 1.0).abs() <= 0.2)
            .count();
        st.rows += 1;
        st.steady_rows += usize::from(within == samples.len());
        st.samples += samples.len();
        st.samples_within += within;
    }
    (st.rows > 0).then_some(st)
}

/// How close `model:<host_matches>` comes to the host column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Accuracy {
    /// Rows with both a prediction and a host median.
    pub rows: usize,
    /// Of those, rows whose prediction is within ±20 % of the host median.
    pub within_20pct: usize,
    /// The median signed error, percent of the host median (negative: predicted faster).
    pub median_error_pct: f64,
    /// The largest error by magnitude, percent.
    pub worst_error_pct: f64,
    /// Its row.
    pub worst_row: String,
}

/// The accuracy of a table's model for the variant the host runs, if it has both columns.
pub fn accuracy(table: &Table) -> Option<Accuracy> {
    let errs: Vec<(f64, String)> = (0..table.rows.len())
        .filter_map(|r| Some((model_error_pct(table, r)?, table.rows[r].label.clone())))
        .collect();
    if errs.is_empty() {
        return None;
    }
    let within = errs.iter().filter(|(e, _)| e.abs() <= 20.0).count();
    let worst = errs
        .iter()
        .max_by(|a, b| a.0.abs().total_cmp(&b.0.abs()))?
        .clone();
    let all: Vec<f64> = errs.iter().map(|e| e.0).collect();
    Some(Accuracy {
        rows: errs.len(),
        within_20pct: within,
        median_error_pct: summary(crate::model::Stat::Median, &all)?,
        worst_error_pct: worst.0,
        worst_row: worst.1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slab_note_counts_the_rows_past_the_hot_objects_or_says_it_could_not_read_them() {
        use crate::model::Row;
        let cache = SlabCache {
            object_size: 192,
            objs_per_slab: 21,
            sheaf_capacity: 32,
            cpu_partial: 120,
            min_partial: 5,
        };
        let row = |vmas: u64| Row {
            label: format!("{vmas}"),
            columns: vec![
                Column::new(
                    "dup",
                    vec![1.0],
                    [("vmas_copied".to_string(), vmas)].into_iter().collect(),
                ),
                Column::new("host", vec![1.0], BTreeMap::new()),
            ],
            published: vec![],
            layout: None,
        };
        let table = timed_table("spawn", "dup", vec![row(21), row(821), row(6421)]);
        let known = Primitives {
            vma_slab: Some(cache),
            node_slab: Some(cache),
            ..Primitives::default()
        };
        let note = slab_note(&table, "dup", &known).expect("note");
        assert!(note.contains("keep 630 vm_area_structs"), "{note}");
        assert!(note.contains("on 2 of 3 rows"), "{note}");
        let unread = slab_note(&table, "dup", &Primitives::default()).expect("note");
        assert!(unread.contains("could not be read"), "{unread}");
        // Every fork within the hot objects, or no fork at all: nothing to say.
        let small = timed_table("spawn", "dup", vec![row(21)]);
        assert_eq!(slab_note(&small, "dup", &known), None);
        let fault = timed_table("fault", "dup", vec![]);
        assert_eq!(slab_note(&fault, "dup", &Primitives::default()), None);
    }

    /// A table `id` of times, lower better, with one engine variant `engine` and a host
    /// column, the rows' columns in that order.
    fn timed_table(id: &str, engine: &str, rows: Vec<crate::model::Row>) -> Table {
        Table {
            id: id.into(),
            title: String::new(),
            seed: None,
            metric: String::new(),
            unit: Unit::Seconds,
            better: Better::Lower,
            stats: vec![crate::model::Stat::Median],
            baseline: engine.into(),
            variants: vec![Variant::engine(engine, ""), Variant::host("")],
            row_label: String::new(),
            rows,
            counters_shown: vec![],
            published_source: None,
            notes: vec![],
            host_matches: None,
            cost_model: None,
        }
    }

    #[test]
    fn a_row_with_its_own_adjacency_prices_its_own_line_jump() {
        use crate::model::Row;
        let prims = Primitives {
            line_rand: 22.0,
            atomic_line: 6.0,
            ..Primitives::default()
        }
        .with_frame_steps(FrameSteps::ADJACENT);
        let engine = |n: u64| {
            Column::new(
                "batched",
                vec![1.0],
                [("fork_batches".to_string(), n)].into_iter().collect(),
            )
        };
        let host = |adjacency: Option<u64>| {
            Column::new(
                "host",
                vec![1.0],
                adjacency
                    .map(|a| (crate::host::agent::FOLIO_ADJACENCY.to_string(), a))
                    .into_iter()
                    .collect(),
            )
        };
        let row = |label: &str, adjacency| Row {
            label: label.into(),
            columns: vec![engine(1000), host(adjacency)],
            published: vec![],
            layout: None,
        };
        let rows = vec![row("scattered", Some(250)), row("unmeasured", None)];
        let mut t = timed_table("fork", "batched", rows);
        add_model_columns(&mut t, &prims, "batched", &[prims; 3]);
        let jump = |r: usize| {
            t.rows[r].columns[1]
                .counters
                .get("model_line_jump_ns")
                .copied()
        };
        // 1000 batches x 0.75 x (22 - 6) ns; the other row keeps the agents' adjacency (1).
        assert_eq!(jump(0), Some(12_000));
        assert_eq!(jump(1), Some(0));
        assert!(
            t.notes.iter().any(|n| n.contains("on 1 of 2 rows")),
            "{:?}",
            t.notes
        );
    }

    #[test]
    fn a_miss_under_every_process_primitives_is_structural() {
        use crate::model::Row;
        // 1000 syscalls: 100 us at 100 ns each, 150 us at 150 ns.
        let at = |ns: f64| Primitives {
            syscall: ns,
            ..Primitives::default()
        };
        let row = |label: &str, host_us: f64| Row {
            label: label.into(),
            columns: vec![
                Column::new(
                    "engine",
                    vec![1.0],
                    [("syscalls".to_string(), 1000)].into_iter().collect(),
                ),
                Column::new("host", vec![host_us * 1e-6], BTreeMap::new()),
            ],
            published: vec![],
            layout: None,
        };
        // Predictions 100-150 us (median 120): within ±20 % of 110, outside it for 200 with
        // every process's (structural), outside for 90 with the median's only.
        let rows = vec![row("in", 110.0), row("far", 200.0), row("edge", 90.0)];
        let mut t = timed_table("fault", "engine", rows);
        let all = [at(100.0), at(120.0), at(150.0)];
        add_model_columns(&mut t, &at(120.0), "engine", &all);
        let note = t.notes.iter().find(|n| n.starts_with("model spread"));
        let note = note.expect("a spread note");
        assert!(note.contains("band 42 % of it wide"), "{note}");
        assert!(
            note.contains("of the 2 rows outside ±20 % of the host median, 1 stay"),
            "{note}"
        );
    }

    #[test]
    fn a_profile_prices_every_engine_cell_with_an_interval_and_marks_rows_outside_20_pct() {
        use crate::model::Row;
        use usermm_model::fit::{Fit, Observation};
        use usermm_model::profile::{features, priors, Fingerprint, Profile, PROFILE_VERSION};
        let prims = Primitives {
            syscall: 100.0,
            load_seq: 1.0,
            rmw_seq: 5.0,
            store_seq: 1.0,
            kcall_loop: 3.0,
            ..Primitives::default()
        };
        // Probes: munmap-like calls zapping n entries at 40 ns each over a 1 us call.
        let obs: Vec<Observation> = ["a/4K", "b/4K"]
            .iter()
            .flat_map(|fam| {
                [1u64, 30, 300, 3000].map(|n| {
                    let c: BTreeMap<String, u64> =
                        [("syscalls".to_string(), 1), ("zap_batches".to_string(), n)]
                            .into_iter()
                            .collect();
                    Observation {
                        family: fam.to_string(),
                        op: "munmap".into(),
                        label: n.to_string(),
                        counters: features("munmap", &c, &prims, 0),
                        ns: 1000.0 + 40.0 * n as f64,
                    }
                })
            })
            .collect();
        let profile = Profile {
            version: PROFILE_VERSION,
            model_key: String::new(),
            created_unix: 0,
            fingerprint: Fingerprint::default(),
            primitives: prims,
            fit: Fit::new(&priors(&prims), &obs).expect("fit"),
            observations: obs,
            calibrate_seconds: 0.0,
            llc_bytes: 0,
            far_permille: None,
            timings: Vec::new(),
            timing_key: String::new(),
        };
        let cell = |v: &str, n: u64| {
            Column::new(
                v,
                vec![1.0; 3],
                [("syscalls".to_string(), 1), ("zap_batches".to_string(), n)]
                    .into_iter()
                    .collect(),
            )
        };
        let row = |label: &str, host_us: f64| Row {
            label: label.into(),
            columns: vec![
                cell("per-pte", 10_000),
                cell("batched", 5_000),
                Column::new("host", vec![host_us * 1e-6; 3], BTreeMap::new()),
            ],
            published: vec![],
            layout: None,
        };
        // 10 000 batches: about 401 us; a host at 410 is within 20 %, one at 900 is not.
        let mut t = timed_table(
            "munmap",
            "per-pte",
            vec![row("near", 410.0), row("far", 900.0)],
        );
        t.variants = vec![
            Variant::engine("per-pte", ""),
            Variant::engine("batched", ""),
            Variant::host(""),
        ];
        add_profile_columns(&mut t, &profile, "per-pte", "test");
        let names: Vec<&str> = t.variants.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "per-pte",
                "batched",
                "model:per-pte",
                "model:batched",
                "host"
            ]
        );
        let m = &t.rows[0].columns[2];
        let (lo, hi) = (
            m.counters[MODEL_CI_LO] as f64,
            m.counters[MODEL_CI_HI] as f64,
        );
        let ns = m.samples[0] * 1e9;
        assert!(lo < ns && ns < hi, "{lo} {ns} {hi}");
        assert!((ns - 401_000.0).abs() < 0.05 * 401_000.0, "{ns}");
        // The batched model's gain interval: about 50 %.
        let [glo, ghi] = t.rows[0].columns[3].gain_ci95_pct.expect("a gain interval");
        assert!(glo < 50.0 && 50.0 < ghi + 1.0, "{glo} {ghi}");
        let note = t
            .notes
            .iter()
            .find(|n| n.starts_with("model:"))
            .expect("note");
        assert!(note.contains("on 1 of 2 rows"), "{note}");
        assert!(note.contains("outside ±20 % (marked !): far"), "{note}");
        assert!(
            note.contains("within ±20 % of their row's median on 2 of 2 rows (100 % of"),
            "{note}"
        );
        assert_eq!(
            outside_rows(&t)
                .iter()
                .map(|&(r, _)| &t.rows[r].label)
                .collect::<Vec<_>>(),
            ["far"]
        );
        assert_eq!(row_op("sharing", "remap"), "mprotect");
        assert_eq!(row_op("munlock-one-node", "256M"), "munlock");
    }

    #[test]
    fn host_steadiness_counts_rows_whose_samples_stay_within_20_pct_of_their_median() {
        use crate::model::Row;
        let row = |label: &str, host: Vec<f64>| Row {
            label: label.into(),
            columns: vec![
                Column::new("engine", vec![1.0], BTreeMap::new()),
                Column::new("host", host, BTreeMap::new()),
            ],
            published: vec![],
            layout: None,
        };
        // Median 1.05: 1.0 and 1.1 are within ±20 %. Median 1.0: 1.4 is 40 % off.
        let t = timed_table(
            "fork",
            "engine",
            vec![
                row("steady", vec![1.0, 1.05, 1.1]),
                row("two bands", vec![1.0, 1.0, 1.4]),
                row("no host", vec![]),
            ],
        );
        let h = host_steadiness(&t).expect("a host column");
        assert_eq!(
            h,
            HostSteadiness {
                rows: 2,
                steady_rows: 1,
                samples: 6,
                samples_within: 5,
            }
        );
        assert!(h
            .describe()
            .contains("on 1 of 2 rows (83 % of the samples do)"));
        let mut no_host = t.clone();
        no_host.variants.truncate(1);
        assert_eq!(host_steadiness(&no_host), None);
    }

    #[test]
    fn every_recipe_prices_a_real_counter_once() {
        // The engine's event counters, and the bench-side counters a table's engine cells
        // add: the spawn table's VMA-tree store work.
        let mut names: Vec<&str> = usermm::Ev::ALL.iter().map(|e| e.name()).collect();
        names.extend(crate::spawn::STORE_WORK_COUNTERS);
        for (i, r) in RECIPES.iter().enumerate() {
            assert!(
                names.contains(&r.counter),
                "{} is not an engine counter",
                r.counter
            );
            assert!(
                RECIPES[..i].iter().all(|o| o.counter != r.counter),
                "{} priced twice",
                r.counter
            );
        }
    }
}
