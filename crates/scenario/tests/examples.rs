//! Every scenario in `scenarios/` runs on the engine with `validate()` after each statement
//! and all its expectations hold.

use scenario::run::{run, RunOptions};

#[test]
fn example_scenarios_pass_with_validation_after_every_step() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scenarios");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("scenarios directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "scn"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "example scenarios present");
    for f in files {
        let text = std::fs::read_to_string(&f).expect("readable");
        let name = f.display().to_string();
        let script = scenario::parse(&name, &text).unwrap_or_else(|e| panic!("{e}"));
        let report = run(
            &script,
            &RunOptions {
                validate: true,
                ..RunOptions::default()
            },
        );
        assert!(
            report.abort.is_none(),
            "{name}: aborted: {:?}",
            report.abort
        );
        assert!(report.failures.is_empty(), "{name}: {:?}", report.failures);
    }
}

#[test]
fn failed_expectation_exits_1_and_a_refused_setting_exits_2() {
    let s = scenario::parse(
        "t.scn",
        "p0 = spawn\na = p0 mmap 4K rw private anon\nexpect p0 read a 4K pattern=0x01\n",
    )
    .expect("parses");
    let r = run(&s, &RunOptions::default());
    assert_eq!(r.exit_code(), 1);
    assert_eq!(r.failures[0].line, 3);
    assert!(
        r.failures[0].message.contains("found 0x00"),
        "{}",
        r.failures[0].message
    );
    // A setting Linux refuses (`force` while 2M does not inherit) cannot run: exit 2.
    let s = scenario::parse(
        "t.scn",
        "set shmem 2M=never\nset shmem top=force\np0 = spawn\n",
    )
    .expect("parses");
    assert_eq!(run(&s, &RunOptions::default()).exit_code(), 2);
    let s = scenario::parse("t.scn", "p0 = spawn\np0 munmap 0x1001 4K\n").expect("parses");
    let r = run(&s, &RunOptions::default());
    assert_eq!(r.exit_code(), 1, "an errno without expect aborts the run");
}
