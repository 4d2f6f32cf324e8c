//! The suite's outputs: counters identical between two runs, the JSON round trip, the text
//! and HTML layouts, and the plots (PNG drawn with the embedded font, SVG).

mod common;

use std::collections::BTreeMap;
use usermm_bench::model::VariantKind;
use usermm_bench::{anon_cow, html, output, text, Report};

/// (table, row, variant) → counters of every engine cell.
fn engine_counters(r: &Report) -> BTreeMap<(String, String, String), BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for t in &r.tables {
        for row in &t.rows {
            for (v, c) in t.variants.iter().zip(&row.columns) {
                if v.kind == VariantKind::Engine {
                    let key = (t.id.clone(), row.label.clone(), v.name.clone());
                    let mut c = c.counters.clone();
                    if t.id == "anon-cow" {
                        // Concurrent instances: the atomics count seqcount contention.
                        c.retain(|k, _| !anon_cow::CONTENDED.contains(&k.as_str()));
                    }
                    out.insert(key, c);
                }
            }
        }
    }
    out
}

#[test]
fn counters_are_identical_between_runs_and_json_round_trips() {
    let a = common::tiny_report();
    let b = common::tiny_report();
    let (ca, cb) = (engine_counters(&a), engine_counters(&b));
    assert!(ca.len() > 50, "only {} engine cells", ca.len());
    assert!(
        ca.values().all(|c| !c.is_empty()),
        "an engine cell without counters"
    );
    for (k, v) in &ca {
        assert_eq!(Some(v), cb.get(k), "counters of {k:?} differ between runs");
    }
    let json = a.to_json().expect("json");
    let back = Report::from_json(&json).expect("parse");
    assert!(back == a, "the report changed in a JSON round trip");
    assert!(json.contains("\"schema_version\": 2"));
    // Each benchmark's wall time, in run order.
    let timed: Vec<&str> = a.bench_seconds.iter().map(|(b, _)| b.as_str()).collect();
    let all: Vec<&str> = usermm_bench::Bench::ALL.iter().map(|b| b.name()).collect();
    assert_eq!(timed, all);
    assert!(a
        .bench_seconds
        .iter()
        .all(|(_, s)| *s > 0.0 && s.is_finite()));
    let ids: Vec<&str> = a.tables.iter().map(|t| t.id.as_str()).collect();
    for id in [
        "fault",
        "fork",
        "munmap",
        "spawn",
        "sharing",
        "anon-cow",
        "munlock-one-node",
        "munlock-interleaved",
        "munlock-thp",
        "munlock-tmpfs",
        "readahead",
        "reclaim",
        "linear-map",
        "linear-map-engine",
    ] {
        assert!(ids.contains(&id), "no table {id} in {ids:?}");
    }
}

/// The engine counters of `table`'s row `row`, column `variant`.
fn cell<'r>(r: &'r Report, table: &str, row: &str, variant: &str) -> &'r BTreeMap<String, u64> {
    let t = r.tables.iter().find(|t| t.id == table).expect("table");
    let i = t
        .variants
        .iter()
        .position(|v| v.name == variant)
        .expect("variant");
    let row = t.rows.iter().find(|x| x.label == row).expect("row");
    &row.columns[i].counters
}

#[test]
fn file_rows_batch_file_folios_and_readahead_reads_every_byte_once() {
    let r = common::tiny_report();
    let scale = common::tiny().scale;
    let pages = scale / 4096;
    // fork of a MAP_PRIVATE tmpfs mapping with 64K folios, one page per 2M written: every
    // PTE is copied; batched, one batch per folio run (1 anon page + 15 file pages in the
    // first folio of each 2M, 16 in the others) instead of one per PTE.
    let per = cell(&r, "fork", "file-private 64K", "per-pte");
    let bat = cell(&r, "fork", "file-private 64K", "batched");
    let blocks = scale >> 21;
    assert_eq!(per["fork_ptes"], pages);
    assert_eq!(bat["fork_ptes"], pages);
    assert_eq!(per["fork_batches"], pages);
    assert_eq!(bat["fork_batches"], pages / 16 + blocks);
    // munmap of MAP_SHARED tmpfs 2M folios mapped 4K off alignment: PTE-mapped, each
    // folio split over two page tables, so two batches per folio.
    let bat = cell(&r, "munmap", "tmpfs-shared 2M", "batched");
    assert_eq!(bat["zap_ptes"], pages);
    assert_eq!(bat["zap_batches"], 2 * blocks);
    // Sequential readahead reads the file once; each window (none reaches max_sectors_kb
    // in a file this small) is one I/O.
    let seq = cell(&r, "readahead", "sequential", "engine");
    assert_eq!(seq["disk_read_bytes"], scale);
    assert_eq!(seq["disk_reads"], seq["readahead"]);
    assert!(seq["readahead"] > 1 && seq["readahead"] < 16, "{seq:?}");
    // ...into folios that grow by two orders per asynchronous window (6.18 on ext4).
    let cached: u64 = seq
        .iter()
        .filter_map(|(k, &n)| {
            // `folios_16K`, `folios_2M`: the report's size labels, read by the one grammar.
            let bytes = usermm::units::parse_size(k.strip_prefix("folios_")?).ok()?;
            Some(n * bytes)
        })
        .sum();
    assert_eq!(cached, scale, "{seq:?}");
    assert!(seq.get("folios_16K").is_some_and(|&n| n > 0), "{seq:?}");
    let t = r.tables.iter().find(|t| t.id == "fork").expect("fork");
    let layouts: Vec<_> = t.rows.iter().filter_map(|x| x.layout.as_deref()).collect();
    assert!(
        layouts.contains(&"anon") && layouts.iter().any(|l| l.starts_with("tmpfs MAP_PRIVATE"))
    );
}

#[test]
fn text_html_and_plots() {
    let r = common::tiny_report();
    let fork = r
        .tables
        .iter()
        .find(|t| t.id == "fork")
        .expect("fork table");
    let txt = text::render(fork);
    assert!(txt.contains("per-pte") && txt.contains("batched") && txt.contains("host"));
    assert!(txt.contains("Median 64K") && txt.contains("Seed 64K") && txt.contains("( 26.00%)"));
    assert!(txt.contains("fork_batches 2M"));
    assert!(txt.contains("host: n/a (left out by the test)"));
    let page = html::report_html(&r).expect("html");
    for t in &r.tables {
        assert!(page.contains(&format!("id=\"table-{}\"", t.id)), "{}", t.id);
        assert!(page.contains(&format!("id=\"plot-{}\"", t.id)), "{}", t.id);
    }
    assert!(
        !page.contains("src=\"http") && !page.contains("href=\"http"),
        "external resource"
    );
    let dir = std::env::temp_dir().join(format!("usermm-bench-test-{}", std::process::id()));
    let files = output::write_plots(&r, &dir).expect("plots");
    let png = files
        .iter()
        .find(|p| p.ends_with("fork.png"))
        .expect("fork.png");
    let bytes = std::fs::read(png).expect("read png");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let svg = std::fs::read_to_string(dir.join("fork.svg")).expect("svg");
    assert!(svg.contains("<svg") && svg.contains("folio size"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every modelled table has one `model:` column per engine variant, whose prediction is the
/// sum of its parts (counters, ns) and whose gain is over `model:<baseline>`; the tables
/// the model does not price have none.
#[test]
fn model_columns_predict_from_the_engine_counters() {
    let r = common::tiny_report();
    let prims = r.cost_model.expect("primitives measured");
    assert!(prims.rmw_seq > 0.0 && prims.syscall > 0.0 && prims.zero_page > 0.0);
    for t in &r.tables {
        let engines: Vec<&str> = t
            .variants
            .iter()
            .filter(|v| v.kind == VariantKind::Engine)
            .map(|v| v.name.as_str())
            .collect();
        let models: Vec<&str> = t
            .variants
            .iter()
            .filter(|v| v.kind == VariantKind::Model)
            .map(|v| v.name.as_str())
            .collect();
        let modelled = !["anon-cow", "readahead", "reclaim"].contains(&t.id.as_str())
            && !t.id.starts_with("linear-map");
        if !modelled {
            assert!(models.is_empty() && t.host_matches.is_none(), "{}", t.id);
            continue;
        }
        let host_matches = t.host_matches.as_deref().expect("host_matches");
        assert!(engines.contains(&host_matches), "{}: {host_matches}", t.id);
        let want: Vec<String> = engines.iter().map(|e| format!("model:{e}")).collect();
        assert_eq!(models, want, "{}", t.id);
        for row in &t.rows {
            for (v, c) in t.variants.iter().zip(&row.columns) {
                if v.kind != VariantKind::Model || c.samples.is_empty() {
                    continue;
                }
                let ns: u64 = c.counters.values().sum();
                let predicted = match t.unit {
                    usermm_bench::model::Unit::Seconds => c.samples[0] * 1e9,
                    _ => 1e9 / c.samples[0],
                };
                // The parts are rounded to whole ns each.
                let slack = c.counters.len() as f64;
                assert!(
                    (predicted - ns as f64).abs() <= slack + predicted * 1e-9,
                    "{} {} {}: {predicted} ns vs parts {ns}",
                    t.id,
                    row.label,
                    v.name
                );
                // Every timed operation enters the kernel: by system calls, or (fault-in)
                // by page faults.
                assert!(
                    ["model_syscall_ns", "model_trap_ns"]
                        .iter()
                        .any(|k| c.counters.contains_key(*k)),
                    "{} {}",
                    t.id,
                    row.label
                );
            }
        }
    }
    let fork = r.tables.iter().find(|t| t.id == "fork").expect("fork");
    let row = fork.rows.iter().find(|r| r.label == "64K").expect("64K");
    let at = |name: &str| fork.variant_index(name).expect(name);
    let (per, batched) = (
        &row.columns[at("model:per-pte")],
        &row.columns[at("model:batched")],
    );
    // Batching saves refcount and rmap atomics: the model must predict a gain.
    assert!(batched.samples[0] < per.samples[0], "{row:?}");
    let gain = usermm_bench::stats::cell_gain(
        fork,
        fork.rows.iter().position(|r| r.label == "64K").unwrap_or(0),
        at("model:batched"),
        usermm_bench::model::Stat::Median,
    )
    .expect("a model gain");
    let direct = (per.samples[0] - batched.samples[0]) / per.samples[0] * 100.0;
    assert!((gain - direct).abs() < 1e-9, "{gain} vs {direct}");
}

/// fork, munmap and spawn carry an A/A control: the baseline measured again in its own cell
/// of every repetition, with the baseline's exact counters, a gain interval over the
/// baseline where there are enough repetitions, and no model column of its own.
#[test]
fn control_columns_repeat_the_baseline() {
    let r = common::tiny_report();
    for id in ["fork", "munmap", "spawn"] {
        let t = r.tables.iter().find(|t| t.id == id).expect(id);
        let controls: Vec<usize> = (0..t.variants.len())
            .filter(|&i| t.variants[i].kind == VariantKind::Control)
            .collect();
        assert_eq!(controls.len(), 1, "{id}: {:?}", t.variants);
        let c = controls[0];
        assert_eq!(
            t.variants[c].name,
            usermm_bench::model::control_name(&t.baseline)
        );
        let b = t.baseline_index().expect("baseline");
        assert!(
            !t.variants
                .iter()
                .any(|v| v.name == format!("model:{}", t.variants[c].name)),
            "{id}: a model column for the control"
        );
        for row in &t.rows {
            let (base, ctl) = (&row.columns[b], &row.columns[c]);
            assert_eq!(ctl.samples.len(), base.samples.len(), "{id} {}", row.label);
            assert!(!ctl.counters.is_empty(), "{id} {}", row.label);
            // spawn's counters are those of one fork of a timed loop: identical too.
            assert_eq!(ctl.counters, base.counters, "{id} {}", row.label);
            // An interval needs three repetitions (the tiny report runs one).
            assert_eq!(
                ctl.gain_ci95_pct.is_some(),
                ctl.samples.len() >= 3,
                "{id} {}",
                row.label
            );
        }
    }
}
