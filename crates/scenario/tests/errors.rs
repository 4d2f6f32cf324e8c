//! Malformed inputs: exact `FILE:LINE:COL: message` text, several errors per file,
//! and unknown-name detection.

use scenario::{parse, ErrorKind, Pos};

/// Binds `p0` (a process) and `a` (a mapping) on lines 1 and 2.
const PRE: &str = "p0 = spawn\na = p0 mmap 1G rw private anon\n";

/// The error messages of `text`, which must fail.
fn errs(text: &str) -> Vec<String> {
    match parse("f.scn", text) {
        Ok(s) => panic!("parsed: {text}\n{s}"),
        Err(e) => e.errors().iter().map(ToString::to_string).collect(),
    }
}

/// The single error of PRE + `line` (on line 3).
fn err3(line: &str) -> String {
    let e = errs(&format!("{PRE}{line}\n"));
    assert_eq!(e.len(), 1, "{e:?}");
    e.into_iter().next().unwrap_or_default()
}

#[test]
fn exact_messages() {
    let cases: &[(&str, &str)] = &[
        ("frob a b", "f.scn:3:1: unknown statement `frob`"),
        ("p0 frob a", "f.scn:3:4: unknown statement `frob`"),
        ("@", "f.scn:3:1: unknown statement `@`"),
        (
            "p0 mmap 4Q rw private anon",
            "f.scn:3:9: bad size `4Q` (expected a decimal or 0x hex number with an optional K, M or G)",
        ),
        (
            "p0 munmap a 1.5G",
            "f.scn:3:13: bad size `1.5G` (expected a decimal or 0x hex number with an optional K, M or G)",
        ),
        (
            "p0 munmap a 0x",
            "f.scn:3:13: bad size `0x` (expected a decimal or 0x hex number with an optional K, M or G)",
        ),
        ("set nodes two", "f.scn:3:11: bad number `two`"),
        ("expect p0 maps count=3K", "f.scn:3:22: bad number `3K`"),
        (
            "p0 mmap 4K rw private anon bogus",
            "f.scn:3:28: unknown option `bogus` for mmap (expected none|r|rw|rx|rwx, private|shared, \
             anon, file NAME, offset SIZE, populate, locked, norserve, fixed ADDR, noreplace ADDR, hint ADDR)",
        ),
        (
            "spawn child",
            "f.scn:3:7: unknown option `child` for spawn (expected privileged)",
        ),
        (
            "p0 mprotect a 4K wx",
            "f.scn:3:18: unknown option `wx` for a protection (expected none|r|rw|rx|rwx)",
        ),
        (
            "set thp top=inherit",
            "f.scn:3:13: unknown option `inherit` for the top-level THP policy (expected always|madvise|never)",
        ),
        ("p0 munmap a", "f.scn:3:12: missing argument: a size"),
        (
            "p0 mlockall",
            "f.scn:3:12: missing argument: an mlockall flag (current|future|onfault)",
        ),
        (
            "p0 mmap 4K rw private",
            "f.scn:3:22: missing argument: `anon` or `file NAME`",
        ),
        (
            "expect p0 read a 4K",
            "f.scn:3:20: missing argument: `pattern=0xNN` or `= SIGSEGV|SIGBUS`",
        ),
        (
            "expect p0 mmap 4K rw private anon",
            "f.scn:3:34: missing argument: `= ERRNO` (the expected error)",
        ),
        ("p0", "f.scn:3:3: missing argument: an operation after `p0`"),
        ("set tunable x", "f.scn:3:14: missing argument: `=VALUE` after `x`"),
        (
            "p0 munmap a 4K extra stuff  ",
            "f.scn:3:16: trailing garbage `extra stuff`",
        ),
        ("p0 munlockall now # c", "f.scn:3:15: trailing garbage `now # c`"),
        ("p0 munmap zz 4K", "f.scn:3:11: unknown name `zz`"),
        ("p1 fork", "f.scn:3:1: unknown name `p1`"),
        ("a mmap 4K rw private anon", "f.scn:3:1: `a` is a mapping, not a process"),
        ("p0 munmap p0 4K", "f.scn:3:11: `p0` is a process, not a mapping"),
        (
            "p0 write a 4K pattern=0x100",
            "f.scn:3:23: bad pattern `0x100` (expected a byte 0x00..0xFF)",
        ),
        (
            "p0 write a 4K pattern=165",
            "f.scn:3:23: bad pattern `165` (expected a byte 0x00..0xFF)",
        ),
        (
            "p0 munmap a 17179869184G",
            "f.scn:3:13: absurd value `17179869184G`: does not fit in 64 bits",
        ),
        (
            "p0 munmap a+0x10000000000000000 4K",
            "f.scn:3:13: absurd value `0x10000000000000000`: does not fit in 64 bits",
        ),
        ("set cpus 0", "f.scn:3:10: absurd value `0`: must be from 1 to 8192"),
        (
            "expect p0 folio a order=99",
            "f.scn:3:25: absurd value `99`: must be from 0 to 63",
        ),
        (
            "expect p0 maps a 0x2000-0x1000 rw-p",
            "f.scn:3:18: absurd value `0x2000-0x1000`: START must be below END",
        ),
        (
            "set thp 3K=always",
            "f.scn:3:9: bad THP size `3K` (expected a power of two from 16K to 2M)",
        ),
        (
            "set thp 4M=always",
            "f.scn:3:9: bad THP size `4M` (expected a power of two from 16K to 2M)",
        ),
        (
            "p0 munmap 4096 4K",
            "f.scn:3:11: bad address `4096` (expected NAME, NAME+SIZE, NAME-SIZE or a 0x hex address)",
        ),
        (
            "expect p0 maps a 0x1000-0x2000 rwzp",
            "f.scn:3:32: bad permissions `rwzp` (expected four characters like rw-p or r--s)",
        ),
        ("p0 brk 64K", "f.scn:3:8: expected `+SIZE` or `-SIZE`, found `64K`"),
        ("a = p0 munmap a 4K", "f.scn:3:8: `munmap` returns nothing to bind"),
        (
            "expect b = p0 mmap 4K rw private anon = EPERM",
            "f.scn:3:8: `expect` cannot bind `b`: an expected failure returns nothing",
        ),
        (
            "p0 smaps a Rss=0",
            "f.scn:3:4: `smaps` is an observation: write `expect TASK smaps ...`",
        ),
        (
            "expect p0 read a 4K = EFAULT",
            "f.scn:3:23: `read` cannot end in `EFAULT` (a memory access fails with SIGSEGV or SIGBUS)",
        ),
        (
            "expect p0 munmap a 4K = SIGSEGV",
            "f.scn:3:25: `munmap` cannot end in `SIGSEGV` (only read, write and touch raise signals)",
        ),
        ("set memory 1G", "f.scn:3:5: `set memory` must come before the first `spawn` or `file`"),
        ("set cpus 2", "f.scn:3:5: `set cpus` must come before the first `spawn` or `file`"),
        ("expect p0 kpageflags a dirty !dirty", "f.scn:3:31: duplicate option `dirty`"),
        ("p0 mlockall current current", "f.scn:3:21: duplicate option `current`"),
        ("expect p0 status VmRSS=1G VmRSS=0", "f.scn:3:27: duplicate option `VmRSS`"),
        (
            "p0 mmap 4K rw private anon fixed 0x1000 hint 0x2000",
            "f.scn:3:41: option `hint` conflicts with `fixed`",
        ),
        ("p0 mmap 4K rw r private anon", "f.scn:3:15: option `r` conflicts with `rw`"),
        ("set = spawn", "f.scn:3:1: `set` is reserved and cannot be bound"),
    ];
    for (line, want) in cases {
        assert_eq!(err3(line), *want, "input: {line}");
    }
}

#[test]
fn every_error_is_reported_in_line_order() {
    let text = "\
p0 = spawn
p0 mmap 4Q rw private anon
# fine
p0 frob
a = p0 mmap 4K rw private anon
p0 munmap a 4K junk
q0 exit
";
    assert_eq!(
        errs(text),
        vec![
            "f.scn:2:9: bad size `4Q` (expected a decimal or 0x hex number with an optional K, M or G)",
            "f.scn:4:4: unknown statement `frob`",
            "f.scn:6:16: trailing garbage `junk`",
            "f.scn:7:1: unknown name `q0`",
        ]
    );
    let e = parse("x.scn", text).expect_err("errors");
    assert_eq!(e.len(), 4);
    assert_eq!(e.errors()[1].pos, Pos { line: 4, col: 4 });
    assert!(matches!(
        e.errors()[1].kind,
        ErrorKind::UnknownStatement { .. }
    ));
    // The whole set displays one per line.
    assert_eq!(e.to_string().lines().count(), 4);
    assert!(e.to_string().starts_with("x.scn:2:9: bad size"));
}

#[test]
fn names_are_bound_in_file_order() {
    // Used before bound.
    assert_eq!(
        errs("p0 = spawn\np0 munmap a 4K\na = p0 mmap 4K rw private anon\n"),
        vec!["f.scn:2:11: unknown name `a`"]
    );
    assert_eq!(
        errs("p1 = p0 fork\np0 = spawn\n"),
        vec!["f.scn:1:6: unknown name `p0`"]
    );
    // Names bound by brk and mremap are mappings; by fork, processes.
    assert!(parse(
        "f",
        "p0 = spawn\nh = p0 brk +4K\nc = p0 fork\nb = c mremap h 4K 8K maymove\nexpect c pagemap b absent\n"
    )
    .is_ok());
    // Rebinding changes the kind.
    assert_eq!(
        errs("p0 = spawn\nx = p0 mmap 4K rw private anon\nx = p0 fork\np0 munmap x 4K\n"),
        vec!["f.scn:4:11: `x` is a process, not a mapping"]
    );
    // Observations check their names too.
    assert_eq!(
        errs("p0 = spawn\nexpect p0 smaps zz Rss=0\nexpect q pagemap 0x1000 absent\n"),
        vec![
            "f.scn:2:17: unknown name `zz`",
            "f.scn:3:8: unknown name `q`"
        ]
    );
    // The name inside an address expression, and in mmap placement.
    assert_eq!(
        errs("p0 = spawn\np0 mmap 4K rw private anon fixed zz+4K\n"),
        vec!["f.scn:2:34: unknown name `zz`"]
    );
    // An exited process stays known.
    assert!(parse("f", "p0 = spawn\np0 exit\nexpect p0 maps count=0\n").is_ok());
}

#[test]
fn failed_binding_does_not_cascade() {
    let text = "p0 = spawn\na = p0 mmap 4Q rw private anon\np0 munmap a 4K\n";
    assert_eq!(
        errs(text),
        vec!["f.scn:2:13: bad size `4Q` (expected a decimal or 0x hex number with an optional K, M or G)"]
    );
}

#[test]
fn odd_inputs_do_not_crash_and_point_right() {
    // Non-ASCII: columns count characters.
    assert_eq!(
        errs("p0 = spawn\np0 munmap é 4K\n"),
        vec!["f.scn:2:11: expected an address, found `é`"]
    );
    assert_eq!(
        errs("ü = spawn\n"),
        vec!["f.scn:1:1: unknown statement `ü`"]
    );
    // An error on the last line without a newline.
    assert_eq!(
        errs("p0 = spawn\np0 exit x"),
        vec!["f.scn:2:9: trailing garbage `x`"]
    );
    // Only the lines with errors are reported; CRLF does not shift columns.
    assert_eq!(
        errs("p0 = spawn\r\np0 brk\r\n"),
        vec!["f.scn:2:7: missing argument: `+SIZE` or `-SIZE`"]
    );
}

/// A file builds the machine as a process does: a machine setting after it is a parse error
/// (it used to parse and then stop the run).
#[test]
fn machine_settings_come_before_the_first_file_too() {
    let e = scenario::parse("f.scn", "g = file 4K\nset memory 1G\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e.trim_end(),
        "f.scn:2:5: `set memory` must come before the first `spawn` or `file`"
    );
    assert!(scenario::parse("f.scn", "set memory 1G\ng = file 4K\n").is_ok());
}
