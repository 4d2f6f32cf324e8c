//! Property tests: generated valid scripts round-trip through `Display`, and no
//! input (arbitrary text, word salad, byte mutations of a valid file) panics.

use proptest::prelude::*;
use proptest::sample::{select, subsequence};
use scenario::{
    parse, Access, Action, AddrExpr, Advice, Arch, Backing, BrkDelta, Delta, Errno, Expect,
    FlagCheck, Keyword, KpageFlag, Limit, Mempolicy, MlockallFlags, Mmap, Name, Outcome,
    PagemapState, Perms, Placement, Prot, Resource, Script, Setting, Sharing, Signal, SmapsField,
    StatusField, StmtKind, ThpPolicy, ThpSetting, ThpSize, ThpTop,
};

/// Binds every name the generated statements use (processes p0 p1 child,
/// mappings a b h).
const PRELUDE: &str = "\
p0 = spawn
p1 = p0 fork
child = spawn privileged
a = p0 mmap 1G rw private anon
b = p1 mmap 2M rw shared anon
h = p0 brk +64K
";

fn name(s: &str) -> Name {
    Name::new(s).unwrap_or_else(|| panic!("bad test name {s}"))
}

fn kw<K: Keyword + std::fmt::Debug>() -> impl Strategy<Value = K> {
    select(K::ALL.to_vec())
}

fn task() -> impl Strategy<Value = Name> {
    select(vec!["p0", "p1", "child"]).prop_map(name)
}

fn mapping() -> impl Strategy<Value = Name> {
    select(vec!["a", "b", "h"]).prop_map(name)
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        0u64..5000,
        (0u64..4096).prop_map(|k| k << 10),
        (0u64..4096).prop_map(|m| m << 20),
        (0u64..64).prop_map(|g| g << 30),
    ]
}

fn addr() -> impl Strategy<Value = AddrExpr> {
    let delta = prop_oneof![
        size().prop_map(Delta::Plus),
        (1..=u64::MAX).prop_map(Delta::Minus)
    ];
    prop_oneof![
        any::<u64>().prop_map(AddrExpr::Abs),
        (mapping(), delta).prop_map(|(base, delta)| AddrExpr::Rel { base, delta }),
    ]
}

fn placement() -> impl Strategy<Value = Placement> {
    prop_oneof![
        Just(Placement::Anywhere),
        addr().prop_map(Placement::Hint),
        addr().prop_map(Placement::Fixed),
        addr().prop_map(Placement::FixedNoreplace),
    ]
}

fn mmap() -> impl Strategy<Value = Mmap> {
    (
        size(),
        kw::<Prot>(),
        kw::<Sharing>(),
        any::<(bool, bool, bool)>(),
        placement(),
    )
        .prop_map(
            |(len, prot, sharing, (populate, locked, noreserve), placement)| Mmap {
                len,
                prot,
                sharing,
                backing: Backing::Anon,
                populate,
                locked,
                noreserve,
                placement,
            },
        )
}

/// Actions yielding a process, a mapping, or nothing.
fn action() -> impl Strategy<Value = Action> {
    let range = || (task(), addr(), size());
    prop_oneof![
        any::<bool>().prop_map(|privileged| Action::Spawn { privileged }),
        task().prop_map(|task| Action::Fork { task }),
        task().prop_map(|task| Action::Exit { task }),
        (task(), mmap()).prop_map(|(task, mmap)| Action::Mmap { task, mmap }),
        range().prop_map(|(task, addr, len)| Action::Munmap { task, addr, len }),
        (range(), kw::<Prot>()).prop_map(|((task, addr, len), prot)| Action::Mprotect {
            task,
            addr,
            len,
            prot
        }),
        (
            range(),
            size(),
            any::<(bool, bool)>(),
            proptest::option::of(addr())
        )
            .prop_map(
                |((task, addr, old_len), new_len, (maymove, dontunmap), fixed)| Action::Mremap {
                    task,
                    addr,
                    old_len,
                    new_len,
                    maymove,
                    dontunmap,
                    fixed
                }
            ),
        (
            task(),
            prop_oneof![
                size().prop_map(BrkDelta::Grow),
                size().prop_map(BrkDelta::Shrink)
            ]
        )
            .prop_map(|(task, delta)| Action::Brk { task, delta }),
        (range(), kw::<Advice>()).prop_map(|((task, addr, len), advice)| Action::Madvise {
            task,
            addr,
            len,
            advice
        }),
        range().prop_map(|(task, addr, len)| Action::Mlock { task, addr, len }),
        (range(), any::<bool>()).prop_map(|((task, addr, len), onfault)| Action::Mlock2 {
            task,
            addr,
            len,
            onfault
        }),
        range().prop_map(|(task, addr, len)| Action::Munlock { task, addr, len }),
        (task(), any::<(bool, bool, bool)>())
            .prop_filter("one flag", |(_, (c, f, o))| *c || *f || *o)
            .prop_map(|(task, (current, future, onfault))| Action::Mlockall {
                task,
                flags: MlockallFlags {
                    current,
                    future,
                    onfault
                }
            }),
        task().prop_map(|task| Action::Munlockall { task }),
        range().prop_map(|(task, addr, len)| Action::Pin { task, addr, len }),
        range().prop_map(|(task, addr, len)| Action::Unpin { task, addr, len }),
        (range(), any::<u8>()).prop_map(|((task, addr, len), pattern)| Action::Write {
            task,
            addr,
            len,
            pattern
        }),
        (range(), kw::<Access>()).prop_map(|((task, addr, len), access)| Action::Touch {
            task,
            addr,
            len,
            access
        }),
        range().prop_map(|(task, addr, len)| Action::Read { task, addr, len }),
    ]
}

/// An action statement, binding a name of the right kind when it can.
fn action_stmt() -> impl Strategy<Value = StmtKind> {
    (action(), any::<bool>(), task(), mapping()).prop_map(|(action, bind, t, m)| {
        let bind = match action.yields() {
            Some(scenario::NameKind::Process) if bind => Some(t),
            Some(scenario::NameKind::Mapping) if bind => Some(m),
            _ => None,
        };
        StmtKind::Action { bind, action }
    })
}

/// Keeps the first of each key.
fn unique<K: PartialEq + Copy, V>(v: Vec<(K, V)>) -> Vec<(K, V)> {
    let mut out: Vec<(K, V)> = Vec::new();
    for (k, x) in v {
        if !out.iter().any(|(o, _)| *o == k) {
            out.push((k, x));
        }
    }
    out
}

fn expect() -> impl Strategy<Value = Expect> {
    let errno = kw::<Errno>().prop_map(Outcome::Errno);
    let signal = kw::<Signal>().prop_map(Outcome::Signal);
    prop_oneof![
        (action(), errno, signal).prop_map(|(action, e, s)| {
            let outcome = if action.is_access() { s } else { e };
            Expect::Outcome { action, outcome }
        }),
        (task(), addr(), size(), any::<u8>()).prop_map(|(task, addr, len, pattern)| Expect::Read {
            task,
            addr,
            len,
            pattern
        }),
        (
            task(),
            mapping(),
            prop::collection::vec((kw::<SmapsField>(), size()), 1..5)
        )
            .prop_map(|(task, mapping, f)| Expect::Smaps {
                task,
                mapping,
                fields: unique(f)
            }),
        (
            task(),
            prop::collection::vec((kw::<StatusField>(), size()), 1..5)
        )
            .prop_map(|(task, f)| Expect::Status {
                task,
                fields: unique(f)
            }),
        (task(), any::<u64>()).prop_map(|(task, count)| Expect::MapsCount { task, count }),
        (
            task(),
            addr(),
            any::<u64>(),
            any::<u64>(),
            any::<[bool; 4]>()
        )
            .prop_filter("start < end", |(_, _, x, y, _)| x != y)
            .prop_map(
                |(task, addr, x, y, [read, write, exec, shared])| Expect::MapsVma {
                    task,
                    addr,
                    start: x.min(y),
                    end: x.max(y),
                    perms: Perms {
                        read,
                        write,
                        exec,
                        shared
                    }
                }
            ),
        (
            task(),
            addr(),
            subsequence(PagemapState::ALL.to_vec(), 1..=4).prop_shuffle()
        )
            .prop_map(|(task, addr, states)| Expect::Pagemap { task, addr, states }),
        (
            task(),
            addr(),
            subsequence(KpageFlag::ALL.to_vec(), 1..8).prop_shuffle(),
            any::<u64>()
        )
            .prop_map(|(task, addr, flags, signs)| Expect::Kpageflags {
                task,
                addr,
                flags: flags
                    .into_iter()
                    .enumerate()
                    .map(|(i, flag)| FlagCheck {
                        flag,
                        set: signs >> i & 1 == 1
                    })
                    .collect()
            }),
        (task(), addr(), 0u32..64).prop_map(|(task, addr, order)| Expect::Folio {
            task,
            addr,
            order
        }),
    ]
}

fn thp() -> impl Strategy<Value = Vec<ThpSetting>> {
    let sizes: Vec<ThpSize> = (14..=21)
        .filter_map(|shift| ThpSize::new(1u64 << shift))
        .collect();
    (
        proptest::option::of(kw::<ThpTop>()),
        subsequence(sizes, 0..=8).prop_shuffle(),
        prop::collection::vec(kw::<ThpPolicy>(), 8),
        any::<bool>(),
    )
        .prop_filter("non-empty", |(top, sizes, _, _)| {
            top.is_some() || !sizes.is_empty()
        })
        .prop_map(|(top, sizes, policies, top_first)| {
            let mut v: Vec<ThpSetting> = sizes
                .into_iter()
                .zip(policies)
                .map(|(size, policy)| ThpSetting::Size { size, policy })
                .collect();
            if let Some(t) = top {
                if top_first {
                    v.insert(0, ThpSetting::Top(t));
                } else {
                    v.push(ThpSetting::Top(t));
                }
            }
            v
        })
}

/// Settings allowed anywhere.
fn policy_setting() -> impl Strategy<Value = Setting> {
    prop_oneof![
        ("[A-Za-z0-9_.+!|,:/-]{1,12}", "[A-Za-z0-9_.=+!|,:/-]{1,12}")
            .prop_map(|(name, value)| Setting::Tunable { name, value }),
        thp().prop_map(Setting::Thp),
        prop_oneof![size().prop_map(Limit::Bytes), Just(Limit::Unlimited)].prop_map(|limit| {
            Setting::Rlimit {
                resource: Resource::Memlock,
                limit,
            }
        }),
        kw::<Mempolicy>().prop_map(Setting::Mempolicy),
    ]
}

/// Settings allowed only before the first spawn.
fn machine_setting() -> impl Strategy<Value = Setting> {
    prop_oneof![
        (1..=u64::MAX).prop_map(Setting::Memory),
        (1u32..=1024).prop_map(Setting::Nodes),
        (1u32..=8192).prop_map(Setting::Cpus),
        kw::<Arch>().prop_map(Setting::Arch),
    ]
}

fn body_stmt() -> impl Strategy<Value = StmtKind> {
    prop_oneof![
        3 => action_stmt(),
        3 => expect().prop_map(StmtKind::Expect),
        1 => policy_setting().prop_map(StmtKind::Set),
    ]
}

/// (machine settings, body statements).
fn script() -> impl Strategy<Value = (Vec<StmtKind>, Vec<StmtKind>)> {
    (
        prop::collection::vec(machine_setting().prop_map(StmtKind::Set), 0..4),
        prop::collection::vec(body_stmt(), 0..24),
    )
}

fn text_of(head: &[StmtKind], body: &[StmtKind]) -> String {
    let mut s = String::new();
    for k in head {
        s.push_str(&format!("{k}\n"));
    }
    s.push_str(PRELUDE);
    for k in body {
        s.push_str(&format!("{k}\n"));
    }
    s
}

fn kinds(s: &Script) -> Vec<StmtKind> {
    s.stmts.iter().map(|s| s.kind.clone()).collect()
}

/// A valid file exercising every statement form (the mutation seed).
const SEED: &str = "\
set memory 4G
set nodes 2
set cpus 2
set arch arm64
set tunable fork.batch=on
set thp 64K=always 2M=madvise top=never
set rlimit memlock 64K
set mempolicy interleave
p0 = spawn
r = spawn privileged
p1 = p0 fork
a = p0 mmap 1G rw private anon populate locked norserve fixed 0x7f0000000000
s = p0 mmap 64K rw shared anon hint a+1G
p0 munmap a+4K 8K
p0 mprotect a 2M r
b = p0 mremap a 1G 2G maymove fixed 0x600000000000
h = p0 brk +64K
p0 brk -4K
p0 madvise a 1G hugepage
p0 mlock a 1G
p0 mlock2 a 1G onfault
p0 munlock a-4K 1G
p0 mlockall current|future onfault
p0 munlockall
p0 pin a+4K 4K
p0 unpin a+4K 4K
p0 write a 1G pattern=0xA5
p0 touch a 1G read
p0 read a 4K
expect p1 read a 4K = SIGSEGV
expect p0 read a+4K 4K pattern=0xA5
expect p0 mmap 4K rw private anon fixed 0x0 = EPERM
expect p0 smaps a Rss=1G Private_Dirty=1G Shared_Dirty=0 AnonHugePages=0 Locked=0
expect p0 status VmLck=0 VmRSS=1G
expect p0 maps count=3
expect p0 maps a 0x7f0000000000-0x7f0040000000 rw-p
expect p0 pagemap a+4K present exclusive
expect p0 kpageflags a+4K mlocked unevictable thp anon lru !dirty
expect p0 folio a+4K order=4
thp 16K=inherit
p1 exit
";

/// If `text` parses, its canonical print parses to the same statements and is a
/// fixpoint of printing.
fn check_roundtrip(text: &str) -> Result<(), TestCaseError> {
    if let Ok(s) = parse("fuzz.scn", text) {
        let printed = s.to_string();
        let again = parse("fuzz.scn", &printed);
        prop_assert!(
            again.is_ok(),
            "reprint failed: {:?}\n{printed}",
            again.err()
        );
        if let Ok(again) = again {
            prop_assert_eq!(kinds(&again), kinds(&s));
            prop_assert_eq!(again.to_string(), printed);
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Mutation {
    Delete(usize),
    Insert(usize, u8),
    Replace(usize, u8),
    Swap(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let byte = prop_oneof![
        select(b" \n\t=+-!|#0123456789abcdefxKMGpaq_".to_vec()),
        any::<u8>()
    ];
    prop_oneof![
        any::<usize>().prop_map(Mutation::Delete),
        (any::<usize>(), byte.clone()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<usize>(), byte).prop_map(|(i, b)| Mutation::Replace(i, b)),
        (any::<usize>(), any::<usize>()).prop_map(|(i, j)| Mutation::Swap(i, j)),
    ]
}

fn mutate(mut bytes: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        let n = bytes.len();
        match *m {
            Mutation::Delete(i) if n > 0 => {
                bytes.remove(i % n);
            }
            Mutation::Insert(i, b) => bytes.insert(i % (n + 1), b),
            Mutation::Replace(i, b) if n > 0 => bytes[i % n] = b,
            Mutation::Swap(i, j) if n > 0 => bytes.swap(i % n, j % n),
            _ => {}
        }
    }
    bytes
}

const VOCAB: &[&str] = &[
    "p0",
    "p1",
    "a",
    "b",
    "=",
    "spawn",
    "fork",
    "exit",
    "mmap",
    "munmap",
    "mremap",
    "brk",
    "madvise",
    "mlock",
    "mlockall",
    "write",
    "touch",
    "read",
    "expect",
    "set",
    "thp",
    "smaps",
    "maps",
    "pagemap",
    "kpageflags",
    "folio",
    "status",
    "4K",
    "1G",
    "0x1000",
    "0x",
    "+",
    "-",
    "+4K",
    "a+4K",
    "rw",
    "private",
    "shared",
    "anon",
    "fixed",
    "hint",
    "pattern=0xA5",
    "pattern=",
    "EPERM",
    "SIGSEGV",
    "count=3",
    "order=",
    "Rss=0",
    "!dirty",
    "rw-p",
    "|",
    "current",
    "top=always",
    "64K=never",
    "memory",
    "tunable",
    "x=y",
    "#",
    "\n",
    "é",
    "18446744073709551616G",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn generated_scripts_round_trip((head, body) in script()) {
        let text = text_of(&head, &body);
        let first = parse("gen.scn", &text);
        prop_assert!(first.is_ok(), "{:?}\n{}", first.as_ref().err(), text);
        let first = first.map_err(|e| TestCaseError::fail(e.to_string()))?;
        // The parse gives back exactly the generated statements.
        let got = kinds(&first);
        prop_assert_eq!(&got[..head.len()], &head[..]);
        prop_assert_eq!(&got[got.len() - body.len()..], &body[..]);
        // parse(print(parse(x))) == parse(x), positions included (canonical layout).
        let second = parse("gen.scn", &first.to_string())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&second, &first);
        prop_assert_eq!(second.to_string(), first.to_string());
    }

    #[test]
    fn layout_does_not_matter(
        (head, body) in script(),
        pads in prop::collection::vec((0usize..3, any::<bool>(), any::<bool>()), 64),
    ) {
        // Indentation, trailing comments, blank lines and CRLF change positions only.
        let canonical = text_of(&head, &body);
        let mut noisy = String::new();
        for (i, line) in canonical.lines().enumerate() {
            let (indent, comment, blank) = pads[i % pads.len()];
            if blank {
                noisy.push_str("  # a comment line\n\n");
            }
            noisy.push_str(&" \t".repeat(indent));
            noisy.push_str(line);
            if comment {
                noisy.push_str("   # trailing # comment = SIGSEGV");
            }
            noisy.push_str(if i % 2 == 0 { "\r\n" } else { "\n" });
        }
        let a = parse("n", &canonical).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let b = parse("n", &noisy).map_err(|e| TestCaseError::fail(format!("{e}\n{noisy}")))?;
        prop_assert_eq!(kinds(&a), kinds(&b));
    }

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        let _ = parse("any.scn", &text);
        check_roundtrip(&text)?;
    }

    #[test]
    fn word_salad_never_panics(words in prop::collection::vec(select(VOCAB.to_vec()), 0..40),
                                glue in prop::collection::vec(select(vec![" ", "", "\n", "  "]), 40)) {
        let mut text = String::new();
        for (i, w) in words.iter().enumerate() {
            text.push_str(w);
            text.push_str(glue[i % glue.len()]);
        }
        let full = format!("{PRELUDE}{text}");
        match parse("salad.scn", &full) {
            Ok(_) => check_roundtrip(&full)?,
            Err(e) => {
                // Every error points inside the file.
                let lines: Vec<&str> = full.split('\n').collect();
                for err in e.errors() {
                    let line = lines.get(err.pos.line as usize - 1);
                    prop_assert!(line.is_some());
                    let width = line.map_or(0, |l| l.chars().count()) as u32;
                    prop_assert!(err.pos.col >= 1 && err.pos.col <= width + 1, "{err}");
                    prop_assert!(err.to_string().starts_with("salad.scn:"));
                }
            }
        }
    }

    #[test]
    fn mutated_valid_file_never_panics(muts in prop::collection::vec(mutation(), 1..8)) {
        let bytes = mutate(SEED.as_bytes().to_vec(), &muts);
        let text = String::from_utf8_lossy(&bytes);
        let _ = parse("mut.scn", &text);
        check_roundtrip(&text)?;
    }
}

#[test]
fn seed_is_valid_and_round_trips() {
    let s = parse("seed.scn", SEED).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.stmts.len(), SEED.lines().count());
    let again = parse("seed.scn", &s.to_string()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(kinds(&again), kinds(&s));
}
