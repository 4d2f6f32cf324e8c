//! `usermm bench TABLE --variants NAME=V1,V2`: the engine columns come from the tunables
//! registry (one per value, the first the baseline), each cell runs with exactly that switch,
//! and without `--variants` a table keeps its own columns.

mod common;

use std::collections::BTreeMap;
use usermm_bench::columns::parse_variants;
use usermm_bench::host::HostSide;
use usermm_bench::model::{Table, VariantKind};
use usermm_bench::progress::Progress;
use usermm_bench::{suite, Bench, Options};

fn run(b: Bench, variants: &[&str]) -> Table {
    let opts = Options {
        folios: vec![64 << 10],
        variants: parse_variants(
            &variants.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            &[b],
        )
        .expect("--variants"),
        ..common::tiny()
    };
    let host = HostSide::disabled("left out by the test");
    let progress = Progress::new(1, false);
    let mut r = suite::run(&[b], &opts, &host, &progress, |_| {})
        .unwrap_or_else(|e| panic!("{} failed: {e:#}", b.name()));
    r.tables.remove(0)
}

/// (kind, name) of every column.
fn columns(t: &Table) -> Vec<(VariantKind, &str)> {
    t.variants
        .iter()
        .map(|v| (v.kind, v.name.as_str()))
        .filter(|(k, _)| *k != VariantKind::Model)
        .collect()
}

/// The counters of column `name` in row `row`.
fn cell<'t>(t: &'t Table, row: &str, name: &str) -> &'t BTreeMap<String, u64> {
    let i = t
        .variants
        .iter()
        .position(|v| v.name == name)
        .unwrap_or_else(|| panic!("no column {name}"));
    let r = t.rows.iter().find(|r| r.label == row).expect("row");
    &r.columns[i].counters
}

#[test]
fn fork_columns_from_the_registry_run_that_switch_and_the_default_is_unchanged() {
    let own = run(Bench::Fork, &[]);
    assert_eq!(
        columns(&own),
        [
            (VariantKind::Engine, "per-pte"),
            (VariantKind::Engine, "batched"),
            (VariantKind::Control, "per-pte again"),
            (VariantKind::Host, "host"),
        ]
    );
    assert_eq!(own.baseline, "per-pte");
    assert!(own.rows.iter().any(|r| !r.published.is_empty()));

    // The registry's order, reversed: batched is now the baseline and has the A/A control.
    let swept = run(Bench::Fork, &["fork_pte_batch=batched,per-pte"]);
    assert_eq!(
        columns(&swept),
        [
            (VariantKind::Engine, "batched"),
            (VariantKind::Engine, "per-pte"),
            (VariantKind::Control, "batched again"),
            (VariantKind::Host, "host"),
        ]
    );
    assert_eq!(swept.baseline, "batched");
    assert!(swept.rows.iter().all(|r| r.published.is_empty()));
    assert!(
        swept
            .notes
            .iter()
            .any(|n| n.contains("--variants fork_pte_batch=batched,per-pte")),
        "{:?}",
        swept.notes
    );
    // 4 MiB of 64K folios: 1024 PTEs, in 64 batches when batched, 1024 one at a time.
    let row = "64K";
    for (name, batches) in [("batched", 64), ("per-pte", 1024)] {
        let c = cell(&swept, row, name);
        assert_eq!(c["fork_ptes"], 1024, "{name}");
        assert_eq!(c["fork_batches"], batches, "{name}");
        assert_eq!(c, cell(&own, row, name), "{name}: not the table's own cell");
    }
}

#[test]
fn munlock_takes_any_registered_design_as_a_column() {
    let t = run(Bench::Munlock, &["munlock=stage6,modern"]);
    assert_eq!(
        columns(&t),
        [
            (VariantKind::Engine, "stage6"),
            (VariantKind::Engine, "modern"),
            (VariantKind::Host, "host"),
        ]
    );
    let row = &t.rows[0].label;
    let (old, new) = (cell(&t, row, "stage6"), cell(&t, row, "modern"));
    assert!(old["lock_lru"] > 0 && old != new, "{old:?} vs {new:?}");
}

#[test]
fn bad_variants_are_refused_with_the_accepted_values() {
    let e = parse_variants(&["munlock=stage9".into()], &[Bench::Munlock])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`munlock`") && e.contains("stage0..stage7|modern"),
        "{e}"
    );
    let e = parse_variants(&["munlok=modern".into()], &[Bench::Munlock])
        .unwrap_err()
        .to_string();
    assert!(e.contains("did you mean `munlock`"), "{e}");
    assert!(parse_variants(&["munlock=modern".into()], &[Bench::Fault]).is_err());
    assert!(parse_variants(&["munlock=".into()], &[Bench::Munlock]).is_err());
}
