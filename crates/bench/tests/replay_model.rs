//! `usermm bench replay`'s columns and `model:` cells: every switch at each policy where it
//! applies with the right baseline, and the model cells' arithmetic with a synthetic profile
//! (`replay_model::example_profile`): the workload priced from the distinct calls equals
//! `Profile::predict_all` / `gain_all` with every call listed once, the gain is the
//! predictions' ratio, and no profile means no cells. No timing is asserted.

use std::collections::BTreeMap;
use std::path::PathBuf;
use trace::{replay, ReplayOptions, ReplayReport};
use usermm_bench::replay_bench::{baseline_of, json, model_cells, variants, SWITCHES};
use usermm_bench::replay_model::{self, example_profile, ModelProfile};

fn as_refs<'a>(
    w: &'a [(&'static str, BTreeMap<String, u64>)],
) -> Vec<(&'static str, &'a BTreeMap<String, u64>)> {
    w.iter().map(|(o, c)| (*o, c)).collect()
}

fn trace(name: &str) -> trace::Trace {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../traces/{name}.umt"));
    trace::read_file(&p).expect("shipped trace")
}

fn run(t: &trace::Trace, v: &usermm_bench::replay_bench::Variant) -> ReplayReport {
    let pairs = |x: &[(&str, &str)]| -> Vec<(String, String)> {
        x.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    replay(
        t,
        &ReplayOptions {
            tunables: pairs(v.tunables),
            thp: pairs(v.thp),
            ..Default::default()
        },
    )
    .expect("replay")
}

#[test]
fn every_switch_has_a_column_at_each_policy_with_its_baseline() {
    let vs = variants();
    let names: Vec<&str> = vs.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names[0], "4K");
    assert!(names.contains(&"64K") && names.contains(&"2M"));
    for s in SWITCHES {
        for p in s.policies {
            let name = format!("{p} {}", s.name);
            let i = names.iter().position(|n| *n == name).expect(&name);
            // A switch is read against its own policy's baseline, with that policy's THP.
            assert_eq!(baseline_of(&vs, i).map(|b| names[b]), Some(*p), "{name}");
            assert_eq!(
                vs[i].thp,
                vs[names.iter().position(|n| n == p).unwrap()].thp
            );
        }
    }
    for s in [
        "sharing=estimate",
        "sharing=mapcount",
        "sharing=rmap-id",
        "sharing=rmap-id-sq",
    ] {
        assert!(names.contains(&format!("64K {s}").as_str()), "{s}");
        assert!(names.contains(&format!("2M {s}").as_str()), "{s}");
        assert!(
            !names.contains(&format!("4K {s}").as_str()),
            "{s}: no large folio at 4K"
        );
    }
    assert!(names.contains(&"2M remap=per-pte"));
    // Policies' baselines are read against the recorded 4K one; that one against nothing.
    assert_eq!(baseline_of(&vs, 0), None);
    let i = names.iter().position(|n| *n == "2M").unwrap();
    assert_eq!(baseline_of(&vs, i), Some(0));
    assert_eq!(vs[i].thp, &[("2M", "always")]);
}

#[test]
fn model_cells_price_the_workload_call_by_call() {
    let profile = example_profile().expect("example profile");
    let t = trace("sh-pipeline");
    let vs = variants();
    let picks = ["4K", "4K fork=per-pte", "64K", "64K sharing=estimate"];
    let sel: Vec<_> = vs
        .iter()
        .filter(|v| picks.contains(&v.name.as_str()))
        .cloned()
        .collect();
    let reports: Vec<ReplayReport> = sel.iter().map(|v| run(&t, v)).collect();
    let cells = model_cells(Some(&profile), &sel, &reports);
    // Every distinct call listed as many times as it ran, through the profile's own API.
    let expanded = |r: &ReplayReport| -> Vec<(&'static str, BTreeMap<String, u64>)> {
        r.op_distinct
            .iter()
            .filter(|c| trace::replay::MODEL_OPS.contains(&c.op))
            .flat_map(|c| std::iter::repeat_n((c.op, c.counter_map()), c.count as usize))
            .collect()
    };
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
    for (i, r) in reports.iter().enumerate() {
        let c = cells[i].as_ref().expect("a cell with a profile");
        let w = expanded(r);
        let p = profile.predict_all(&as_refs(&w));
        assert!(c.ns > 0.0, "{}", sel[i].name);
        assert!(close(c.ns, p.ns), "{}: {} vs {}", sel[i].name, c.ns, p.ns);
        assert!(close(c.ci95_ns[0], p.ci95[0]) && close(c.ci95_ns[1], p.ci95[1]));
        assert!(c.ci95_ns[0] <= c.ns && c.ns <= c.ci95_ns[1]);
        match baseline_of(&sel, i) {
            None => {
                assert!(
                    c.gain_pct.is_none() && c.baseline.is_none(),
                    "{}",
                    sel[i].name
                );
            }
            Some(b) => {
                let base = cells[b].as_ref().unwrap();
                assert_eq!(c.baseline.as_deref(), Some(sel[b].name.as_str()));
                let g = c.gain_pct.expect("a gain");
                // The gain is the two predictions' ratio, and Profile::gain_all's.
                assert!(close(g, (1.0 - c.ns / base.ns) * 100.0), "{g}");
                let (g2, ci2) = profile
                    .gain_all(&as_refs(&w), &as_refs(&expanded(&reports[b])))
                    .expect("gain_all");
                let ci = c.gain_ci95_pct.unwrap();
                assert!(close(g, g2) && close(ci[0], ci2[0]) && close(ci[1], ci2[1]));
                assert!(ci[0] <= g && g <= ci[1]);
            }
        }
    }
    // Forks are priced: the forking trace's workload holds fork's fixed work once per fork.
    let w = replay_model::workload(&profile, &reports[0]);
    let fork = w.iter().find(|(op, _)| *op == "fork").expect("fork priced");
    assert_eq!(
        fork.1.get(usermm_model::profile::OP_FORK).copied(),
        Some(reports[0].op_calls["fork"] as f64)
    );
    // The engine's file creation is never priced.
    assert!(w.iter().all(|(op, _)| *op != "file"));
    // 64K faults fewer times than 4K: a policy's gain is not zero.
    assert!(cells[2].as_ref().unwrap().gain_pct.unwrap() != 0.0);
    // Without a profile there are no cells, and the JSON says why.
    assert!(model_cells(None, &sel, &reports)
        .iter()
        .all(Option::is_none));
    let missing = ModelProfile::Missing("none cached".into());
    assert!(missing.note().contains("no profile"));
}

#[test]
fn the_json_document_carries_columns_rows_and_model_cells() {
    let profile = ModelProfile::Loaded(Box::new(example_profile().unwrap()), "example".into());
    let t = trace("sqlite3-query");
    let vs = variants();
    let reports: Vec<ReplayReport> = vs.iter().map(|v| run(&t, v)).collect();
    let table = usermm_bench::replay_bench::TraceTable {
        name: "sqlite3-query".into(),
        events: t.events.len() as u64,
        bytes: t.file_bytes,
        host_rss_anon_kb: 0,
        model: model_cells(profile.profile(), &vs, &reports),
        variants: vs.clone(),
        reports,
        recorded: t.header.policy.clone(),
        recorded_col: 0,
    };
    let failed = [("bad.umt".to_string(), "not a trace".to_string())];
    let j = json(std::slice::from_ref(&table), &failed, &profile);
    assert_eq!(j["failed"][0]["trace"], "bad.umt");
    assert_eq!(j["failed"][0]["error"], "not a trace");
    assert_eq!(j["schema"], "usermm-bench-replay/2");
    assert_eq!(j["model"], "model: profile example");
    let tab = &j["tables"][0];
    let n = vs.len();
    assert_eq!(tab["columns"].as_array().unwrap().len(), n);
    assert_eq!(tab["policies"].as_array().unwrap().len(), n);
    assert_eq!(tab["baselines"][0], serde_json::Value::Null);
    assert_eq!(tab["rows"]["faults"].as_array().unwrap().len(), n);
    assert_eq!(tab["rows"]["fault_signals"][0], 0);
    assert_eq!(tab["ops"].as_array().unwrap().len(), n);
    let m = tab["model"].as_array().unwrap();
    assert_eq!(m.len(), n);
    assert!(m[0]["ns"].as_f64().unwrap() > 0.0);
    assert!(m[0].get("gain_pct").is_none());
    assert!(m[1]["gain_pct"].is_number() && m[1]["baseline"] == "4K");
    // The text names each switch's predicted effect at each of its policies.
    let text = usermm_bench::replay_bench::render(&table);
    assert!(text.contains("model: kernel ms") && text.contains("predicted effect"));
    assert!(text.contains("sharing=estimate") && text.contains("2M over 4K"));
}
