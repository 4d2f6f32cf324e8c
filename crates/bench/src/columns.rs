//! A table's engine columns as settings of the tunables registry, and `usermm bench TABLE
//! --variants NAME=V1,V2`, which replaces a table's own columns by one per value.
//!
//! Linux counterpart: none — this is the harness. Each column is one setting of the engine's
//! runtime switches (`usermm::tunables::REGISTRY`: the seeds' patches, sysctls such as
//! `vm.max_map_count`, the disk's `read_ahead_kb`), applied where the table applies its own
//! columns' settings (for the timed call, or on the fresh machine the table builds). A new
//! value of a registered switch thus gets a column without editing the table; a value the
//! registry refuses is an error naming the switch and its accepted values. Without
//! `--variants` every table keeps exactly its own columns.

use crate::model::{Table, Variant};
use crate::options::Bench;
use crate::sweep::{column_name, combinations, parse_sweeps_for, Sweep};
use usermm::{Machine, Tunables};

/// One engine column of a table: its name, what it is, and the tunables it sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineColumn {
    /// The column header (`per-pte`, `stage3`).
    pub name: String,
    /// One sentence on what it is.
    pub about: String,
    /// The registry's switches it sets, `(name, value)`, in order; everything else stays
    /// as the table's machine has it.
    pub tunables: Vec<(String, String)>,
}

impl EngineColumn {
    /// A column setting `tunables`.
    pub fn new(name: &str, about: &str, tunables: &[(&str, &str)]) -> EngineColumn {
        EngineColumn {
            name: name.into(),
            about: about.into(),
            tunables: tunables
                .iter()
                .map(|&(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// Its variant in the table.
    pub fn variant(&self) -> Variant {
        Variant::engine(&self.name, &self.about)
    }

    /// Sets its tunables on `t` (stops at the first one the registry refuses).
    pub fn apply_to(&self, t: &mut Tunables) -> anyhow::Result<()> {
        for (k, v) in &self.tunables {
            t.set(k, v)
                .map_err(|e| anyhow::anyhow!("column `{}`: {e}", self.name))?;
        }
        Ok(())
    }

    /// Sets its tunables on the machine `m`.
    pub fn apply(&self, m: &Machine) -> anyhow::Result<()> {
        let mut res = Ok(());
        m.update_tunables(|t| res = self.apply_to(t));
        res
    }
}

/// The engine columns of `--variants` (one per combination of the sweeps' values, the first
/// values first: the baseline), or `defaults` (the table's own) without them.
pub fn engine_columns(variants: &[Sweep], defaults: Vec<EngineColumn>) -> Vec<EngineColumn> {
    if variants.is_empty() {
        return defaults;
    }
    combinations(variants)
        .into_iter()
        .map(|c| {
            let about = c
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ");
            EngineColumn {
                name: column_name(&c),
                about: format!(
                    "--variants: {about} (everything else as the table's own columns' machine)"
                ),
                tunables: c,
            }
        })
        .collect()
}

/// How many engine columns `--variants` gives (0 without them: the tables' own).
pub fn count(variants: &[Sweep]) -> usize {
    if variants.is_empty() {
        0
    } else {
        variants.iter().map(|s| s.values.len()).product()
    }
}

/// The benchmarks whose engine columns `--variants` can replace: those with engine variants
/// (fault, readahead and reclaim have one engine column, the defaults; linear-map's columns
/// are the `linear_map` switch's values, arm64 boot-time layouts built outside a machine).
pub fn takes_variants(b: Bench) -> bool {
    matches!(
        b,
        Bench::Fork
            | Bench::Munmap
            | Bench::Spawn
            | Bench::Sharing
            | Bench::AnonCow
            | Bench::Munlock
    )
}

/// Parses `--variants NAME=V1,V2[,…]` options (each value checked against the registry) for
/// the benchmarks `which`: one benchmark that takes them.
pub fn parse_variants(opts: &[String], which: &[Bench]) -> anyhow::Result<Vec<Sweep>> {
    if opts.is_empty() {
        return Ok(Vec::new());
    }
    let sweeps = parse_sweeps_for("--variants", opts)?;
    match which {
        [b] if takes_variants(*b) => Ok(sweeps),
        [b] => {
            let takes: Vec<&str> = Bench::ALL
                .iter()
                .filter(|b| takes_variants(**b))
                .map(|b| b.name())
                .collect();
            anyhow::bail!(
                "--variants: `{}` has no engine variants to replace (the benchmarks that take it: {}; for any workload, `usermm bench scenario FILE --sweep NAME=V1,V2`)",
                b.name(),
                takes.join(", ")
            )
        }
        _ => anyhow::bail!(
            "--variants names the engine columns of one benchmark: name it (e.g. `usermm bench fork --variants fork_pte_batch=per-pte,batched`)"
        ),
    }
}

/// Marks a table whose engine columns came from `--variants`: a note naming them, and the
/// seed's published numbers left out (they are gains of the table's own columns over its own
/// baseline).
pub fn mark_variants(t: &mut Table, variants: &[Sweep]) {
    let given: Vec<String> = variants
        .iter()
        .map(|s| format!("{}={}", s.name, s.values.join(",")))
        .collect();
    let mut note = format!(
        "engine columns from --variants {} (the first is the baseline), each setting only that where the table sets its own columns'",
        given.join(" --variants ")
    );
    if t.rows.iter().any(|r| !r.published.is_empty()) {
        note.push_str(
            "; the seed's published numbers are left out (they belong to the table's own columns)",
        );
    }
    for r in &mut t.rows {
        r.published.clear();
    }
    t.published_source = None;
    t.notes.push(note);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_replace_the_defaults_baseline_first() {
        let own = vec![EngineColumn::new("x", "", &[("munlock", "stage0")])];
        assert_eq!(engine_columns(&[], own.clone()), own);
        let s = parse_variants(&["fork_pte_batch=per-pte,batched".into()], &[Bench::Fork])
            .expect("parse");
        let cols = engine_columns(&s, own);
        let names: Vec<&str> = cols.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["per-pte", "batched"]);
        assert_eq!(
            cols[1].tunables,
            [("fork_pte_batch".to_string(), "batched".to_string())]
        );
        let mut t = Tunables::default();
        cols[0].apply_to(&mut t).expect("apply");
        assert_eq!(t.fork_pte_batch, usermm::tunables::PteBatching::PerPte);
    }

    #[test]
    fn refused_values_and_benchmarks_are_errors() {
        let e = parse_variants(&["fork_pte_batch=per-pte,triple".into()], &[Bench::Fork])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--variants")
                && e.contains("fork_pte_batch")
                && e.contains("batched|per-pte"),
            "{e}"
        );
        let e = parse_variants(&["munlock=stage0".into()], &Bench::ALL)
            .unwrap_err()
            .to_string();
        assert!(e.contains("one benchmark"), "{e}");
        let e = parse_variants(&["munlock=stage0".into()], &[Bench::LinearMap])
            .unwrap_err()
            .to_string();
        assert!(e.contains("linear-map"), "{e}");
    }
}
