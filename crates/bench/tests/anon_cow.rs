//! The anon-cow table (seed 003, 7.3) at a tiny scale: its shape, and the counters that do not
//! depend on timing — every child copies every page and PTE-remaps every THP once, whatever
//! the stage, because the parent keeps every folio mapped.

mod common;

use usermm::Ev;
use usermm_bench::host::HostSide;
use usermm_bench::model::{Better, Unit, VariantKind};
use usermm_bench::progress::Progress;
use usermm_bench::sharing::STAGES;
use usermm_bench::{anon_cow, suite, text, Bench, Options};

#[test]
fn anon_cow_table_at_a_tiny_scale() {
    let opts = Options {
        anon_cow_scale: 4 << 20,
        reps: 2,
        ..common::tiny()
    };
    let host = HostSide::disabled("left out by the test");
    let progress = Progress::new(1, false);
    let report = match suite::run(&[Bench::AnonCow], &opts, &host, &progress, |_| {}) {
        Ok(r) => r,
        Err(e) => panic!("anon-cow failed: {e:#}"),
    };
    assert_eq!(report.tables.len(), 1);
    let t = &report.tables[0];
    assert_eq!(t.id, "anon-cow");
    assert_eq!((t.unit, t.better), (Unit::BytesPerSecond, Better::Higher));
    assert_eq!(t.baseline, STAGES[0].name);
    let names: Vec<&str> = t.variants.iter().map(|v| v.name.as_str()).collect();
    let mut want: Vec<&str> = STAGES.iter().map(|s| s.name).collect();
    want.push("host");
    assert_eq!(names, want);
    let labels: Vec<&str> = t.rows.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(labels, ["seq", "rand"]);

    let n = anon_cow::instances() as u64;
    let pages = (opts.anon_cow_scale / 4096) * n;
    let thps = (opts.anon_cow_scale / (2 << 20)) * n;
    for row in &t.rows {
        assert_eq!(row.columns.len(), t.variants.len());
        assert_eq!(row.published.len(), 6, "{}", row.label);
        for (v, c) in t.variants.iter().zip(&row.columns) {
            let at = format!("{} {}", row.label, v.name);
            if v.kind == VariantKind::Host {
                assert!(c.samples.is_empty() && c.unavailable.is_some(), "{at}");
                continue;
            }
            assert_eq!(c.samples.len(), 2, "{at}");
            assert!(
                c.samples.iter().all(|s| s.is_finite() && *s > 0.0),
                "{at}: {:?}",
                c.samples
            );
            let get = |e: Ev| c.counters.get(e.name()).copied().unwrap_or(0);
            assert_eq!(get(Ev::CowCopy), pages, "{at}");
            assert_eq!(get(Ev::PagesCopied), pages, "{at}");
            assert_eq!(get(Ev::CowReuse), 0, "{at}");
            assert_eq!(get(Ev::ThpSplitPmd), thps, "{at}");
            assert!(get(Ev::FolioAtomic) > 0, "{at}");
        }
    }
    let txt = text::render(t);
    assert!(txt.contains("MiB/s") && txt.contains("Median seq") && txt.contains("Seed rand"));
    assert!(txt.contains("cow_copies seq") && txt.contains("thp_split_pmd rand"));
}
