//! Swept tunables: `NAME=V1,V2` options (`usermm bench scenario --sweep`, `usermm bench TABLE
//! --variants`) parsed and checked against the tunables registry, every combination of their
//! values, and a combination's column name.

use scenario::{ErrorKind, Script, Setting, Stmt, StmtKind};

/// One swept tunable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sweep {
    /// Tunable name.
    pub name: String,
    /// Values, in the order given.
    pub values: Vec<String>,
}

/// The name `--sweep` gives the THP policy (not a tunable: `set thp`, on both sides).
pub const THP: &str = "thp";

/// The `set thp` statement of a `--sweep thp=` value: `never`, `madvise` or `always` is the
/// top-level policy (`top=`), anything else `set thp` pairs joined by `+`
/// (`64K=always+top=never`).
pub fn thp_statement(value: &str) -> String {
    let pairs: Vec<String> = value
        .split('+')
        .map(|p| {
            if p.contains('=') {
                p.to_string()
            } else {
                format!("top={p}")
            }
        })
        .collect();
    format!("set thp {}", pairs.join(" "))
}

/// The parsed `set thp` statement of a `--sweep thp=` value.
pub(crate) fn thp_stmt(value: &str) -> anyhow::Result<Stmt> {
    let text = thp_statement(value);
    let script = Script::parse_checked("--sweep thp", &text).map_err(|e| {
        anyhow::anyhow!(
            "`{value}` is not a THP policy (never, madvise, always, or SIZE=POLICY pairs joined by +): `{text}`: {}",
            e.to_string().trim_end()
        )
    })?;
    match script.stmts.as_slice() {
        [st] if matches!(st.kind, StmtKind::Set(Setting::Thp(_))) => Ok(st.clone()),
        _ => anyhow::bail!("`{value}` is not a THP policy"),
    }
}

/// Parses and checks `--sweep NAME=V1,V2` options: every value against the engine's
/// registry, or, for `thp`, as a `set thp` policy.
pub fn parse_sweeps(opts: &[String]) -> anyhow::Result<Vec<Sweep>> {
    parse_sweeps_with("--sweep", opts, true)
}

/// Parses and checks the `NAME=V1,V2` options of the flag `flag` (`--sweep`, `--variants`):
/// every value against the tunables registry; errors start with the flag.
pub fn parse_sweeps_for(flag: &str, opts: &[String]) -> anyhow::Result<Vec<Sweep>> {
    parse_sweeps_with(flag, opts, false)
}

fn parse_sweeps_with(flag: &str, opts: &[String], thp: bool) -> anyhow::Result<Vec<Sweep>> {
    let mut out: Vec<Sweep> = Vec::new();
    for o in opts {
        let (name, values) = o
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("{flag} {o}: expected NAME=V1,V2[,...]"))?;
        let values: Vec<String> = values.split(',').map(str::to_string).collect();
        anyhow::ensure!(
            values.iter().all(|v| !v.is_empty()),
            "{flag} {o}: an empty value"
        );
        for v in &values {
            if thp && name == THP {
                thp_stmt(v).map_err(|e| anyhow::anyhow!("{flag} {o}: {e}"))?;
            } else {
                ErrorKind::check_tunable(name, v)
                    .map_err(|e| anyhow::anyhow!("{flag} {o}: {e}"))?;
            }
        }
        anyhow::ensure!(
            !out.iter().any(|s| s.name == name),
            "{flag} {o}: `{name}` is given twice"
        );
        out.push(Sweep {
            name: name.to_string(),
            values,
        });
    }
    Ok(out)
}

/// Every combination of the sweeps' values, the first value of each sweep first (the last
/// sweep varies fastest). One empty combination without sweeps.
pub fn combinations(sweeps: &[Sweep]) -> Vec<Vec<(String, String)>> {
    let mut out = vec![Vec::new()];
    for s in sweeps {
        out = out
            .into_iter()
            .flat_map(|combo: Vec<(String, String)>| {
                s.values.iter().map(move |v| {
                    let mut c = combo.clone();
                    c.push((s.name.clone(), v.clone()));
                    c
                })
            })
            .collect();
    }
    out
}

/// A combination's column name: its values joined by `/` (`default` without sweeps).
pub fn column_name(combo: &[(String, String)]) -> String {
    if combo.is_empty() {
        return "default".into();
    }
    combo
        .iter()
        .map(|(_, v)| v.as_str())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combinations_are_the_cartesian_product_baseline_first() {
        let s = parse_sweeps(&[
            "fork_pte_batch=per-pte,batched".into(),
            "vma_tree_dup=dup,insert".into(),
        ])
        .expect("sweeps");
        let names: Vec<String> = combinations(&s).iter().map(|c| column_name(c)).collect();
        assert_eq!(
            names,
            [
                "per-pte/dup",
                "per-pte/insert",
                "batched/dup",
                "batched/insert"
            ]
        );
        assert_eq!(combinations(&[]), vec![Vec::new()]);
        let e = parse_sweeps(&["fork_pte_bach=per-pte".into()]).unwrap_err();
        assert!(
            e.to_string().contains("did you mean `fork_pte_batch`"),
            "{e}"
        );
        assert!(parse_sweeps(&["fork_pte_batch=perpte".into()]).is_err());
        assert!(parse_sweeps(&["fork_pte_batch".into()]).is_err());
    }
}
