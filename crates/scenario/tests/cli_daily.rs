//! Tunables checked at parse time (`Script::parse_checked`, used by `usermm run` and
//! `usermm bench scenario`): an unknown name or a refused value is a parse error of its line,
//! with a "did you mean" suggestion; `parse` keeps tunables as free text.

use scenario::{parse, ErrorKind, Pos, Script, Setting, StmtKind};

fn checked_errs(text: &str) -> Vec<String> {
    match Script::parse_checked("f.scn", text) {
        Ok(s) => panic!("parsed: {text}\n{s}"),
        Err(e) => e.errors().iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn a_misspelt_name_is_an_error_with_a_suggestion() {
    assert_eq!(
        checked_errs("p0 = spawn\nset tunable fork_pte_bach=per-pte\n"),
        [
            "f.scn:2:13: unknown tunable `fork_pte_bach`; did you mean `fork_pte_batch`? \
          (see `usermm tunables`)"
        ]
    );
    assert_eq!(
        checked_errs("set tunable zap_batch = batched\n"),
        ["f.scn:1:13: unknown tunable `zap_batch` (see `usermm tunables`)"]
    );
    assert_eq!(
        checked_errs("set tunable sharing_shadwo=true\n"),
        [
            "f.scn:1:13: unknown tunable `sharing_shadwo`; did you mean `sharing_shadow`? \
          (see `usermm tunables`)"
        ]
    );
}

#[test]
fn a_refused_value_is_an_error_at_the_value() {
    assert_eq!(
        checked_errs("set tunable fork_pte_batch=perpte\n"),
        [
            "f.scn:1:28: bad value `perpte` for tunable `fork_pte_batch` (accepted: \
          batched|per-pte); did you mean `per-pte`?"
        ]
    );
    // `NAME = VALUE` with spaces: the column is the value's.
    assert_eq!(
        checked_errs("set tunable vma_tree_dup = insrt\n"),
        [
            "f.scn:1:28: bad value `insrt` for tunable `vma_tree_dup` (accepted: dup|insert); \
          did you mean `insert`?"
        ]
    );
    assert_eq!(
        checked_errs("set tunable munlock=stage12\n"),
        [
            "f.scn:1:21: bad value `stage12` for tunable `munlock` (accepted: \
          stage0..stage7|modern); did you mean `stage1`?"
        ]
    );
    assert_eq!(
        checked_errs("set tunable max_map_count=lots\n"),
        ["f.scn:1:27: bad value `lots` for tunable `max_map_count` (accepted: integer)"]
    );
}

#[test]
fn every_bad_line_is_reported_and_good_tunables_parse() {
    let e = checked_errs(
        "set tunable fork_pte_bach=per-pte\nset tunable fork_pte_batch=per-pte\n\
         p0 = spawn\nset tunable zap_pte_batch=perpte\np0 frob\n",
    );
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(e[0].starts_with("f.scn:1:13: unknown tunable"));
    assert!(e[1].starts_with("f.scn:4:27: bad value `perpte`"));
    assert!(e[2].starts_with("f.scn:5:4: unknown statement"));

    let text = "set tunable fork_pte_batch=per-pte\nset tunable sharing=rmap-id+shared\n\
                set tunable munlock=stage3\np0 = spawn\nset tunable max_map_count=8\n";
    let s = Script::parse_checked("f.scn", text).expect("valid tunables");
    assert_eq!(s, parse("f.scn", text).expect("parse"));
    assert_eq!(s.stmts[0].pos, Pos { line: 1, col: 1 });
    assert_eq!(
        s.stmts[0].kind,
        StmtKind::Set(Setting::Tunable {
            name: "fork_pte_batch".into(),
            value: "per-pte".into()
        })
    );
}

#[test]
fn plain_parse_keeps_tunables_as_text() {
    assert!(parse("f.scn", "set tunable fork_pte_bach=per-pte\n").is_ok());
    assert!(parse("f.scn", "set tunable NAME=VALUE\n").is_ok());
}

#[test]
fn check_tunable_is_what_the_cli_uses() {
    assert_eq!(
        ErrorKind::check_tunable("fork_pte_batch", "batched"),
        Ok(())
    );
    assert_eq!(
        ErrorKind::check_tunable("fork_pte_bach", "batched"),
        Err(ErrorKind::UnknownTunable {
            name: "fork_pte_bach".into(),
            suggestion: Some("fork_pte_batch".into())
        })
    );
    assert_eq!(
        ErrorKind::check_tunable("nope", "1")
            .map_err(|e| e.to_string())
            .unwrap_err(),
        "unknown tunable `nope` (see `usermm tunables`)"
    );
    let long = "x".repeat(500);
    let e = ErrorKind::check_tunable(&long, "1").unwrap_err();
    assert!(matches!(
        e,
        ErrorKind::UnknownTunable {
            suggestion: None,
            ..
        }
    ));
    // A long name from a file is clipped in the message like any other echoed text.
    let errs = checked_errs(&format!("set tunable {long}=1\n"));
    assert!(errs[0].len() < 200, "{}", errs[0]);
}
