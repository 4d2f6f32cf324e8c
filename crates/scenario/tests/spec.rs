//! Every statement form of SCENARIO.md and the DESIGN.md example parse, with the
//! expected tree, and print back to text that parses to the same tree.

use scenario::{
    parse, Access, Action, AddrExpr, Advice, Arch, Backing, BrkDelta, Delta, Errno, Expect,
    FlagCheck, Keyword, KpageFlag, Limit, Mempolicy, MlockallFlags, Mmap, Name, Outcome,
    PagemapState, Perms, Placement, Pos, Prot, Resource, Script, Setting, Sharing, Signal,
    SmapsField, StatusField, StmtKind, ThpPolicy, ThpSetting, ThpSize, ThpTop,
};

/// Binds the names the SCENARIO.md snippets use.
const PRELUDE: &str = "p0 = spawn\np1 = p0 fork\na = p0 mmap 1G rw private anon\n";

fn ok(text: &str) -> Script {
    match parse("t.scn", text) {
        Ok(s) => s,
        Err(e) => panic!("{text}\n---\n{e}"),
    }
}

fn kinds(s: &Script) -> Vec<StmtKind> {
    s.stmts.iter().map(|s| s.kind.clone()).collect()
}

/// Parses PRELUDE + `line`, checks the round trip, returns the last statement.
fn stmt(line: &str) -> StmtKind {
    let script = ok(&format!("{PRELUDE}{line}\n"));
    let again = ok(&script.to_string());
    assert_eq!(kinds(&again), kinds(&script), "round trip of {line}");
    script
        .stmts
        .last()
        .map(|s| s.kind.clone())
        .expect("a statement")
}

/// Parses a lone `set` line.
fn setting(line: &str) -> Setting {
    let script = ok(line);
    assert_eq!(kinds(&ok(&script.to_string())), kinds(&script));
    match &script.stmts[..] {
        [s] => match &s.kind {
            StmtKind::Set(set) => set.clone(),
            k => panic!("not a setting: {k:?}"),
        },
        _ => panic!("one statement expected"),
    }
}

fn n(s: &str) -> Name {
    Name::new(s).expect("valid name")
}

fn a() -> AddrExpr {
    AddrExpr::Rel {
        base: n("a"),
        delta: Delta::Plus(0),
    }
}

fn a_plus(d: u64) -> AddrExpr {
    AddrExpr::Rel {
        base: n("a"),
        delta: Delta::Plus(d),
    }
}

fn act(bind: Option<&str>, action: Action) -> StmtKind {
    StmtKind::Action {
        bind: bind.map(n),
        action,
    }
}

fn p0() -> Name {
    n("p0")
}

const K: u64 = 1 << 10;
const M: u64 = 1 << 20;
const G: u64 = 1 << 30;

#[test]
fn machine_and_policy_settings() {
    assert_eq!(setting("set memory 4G"), Setting::Memory(4 * G));
    assert_eq!(setting("set nodes 2"), Setting::Nodes(2));
    assert_eq!(setting("set cpus 2"), Setting::Cpus(2));
    assert_eq!(setting("set arch x86_64"), Setting::Arch(Arch::X86_64));
    assert_eq!(setting("set arch arm64"), Setting::Arch(Arch::Arm64));
    assert_eq!(
        setting("set tunable NAME=VALUE"),
        Setting::Tunable {
            name: "NAME".into(),
            value: "VALUE".into()
        }
    );
    assert_eq!(
        setting("set tunable fork.batch=per-pte"),
        Setting::Tunable {
            name: "fork.batch".into(),
            value: "per-pte".into()
        }
    );
    let size = |b| ThpSize::new(b).expect("thp size");
    assert_eq!(
        setting("set thp 64K=always 2M=madvise"),
        Setting::Thp(vec![
            ThpSetting::Size {
                size: size(64 * K),
                policy: ThpPolicy::Always
            },
            ThpSetting::Size {
                size: size(2 * M),
                policy: ThpPolicy::Madvise
            },
        ])
    );
    for (word, top) in [
        ("always", ThpTop::Always),
        ("madvise", ThpTop::Madvise),
        ("never", ThpTop::Never),
    ] {
        assert_eq!(
            setting(&format!("set thp top={word}")),
            Setting::Thp(vec![ThpSetting::Top(top)])
        );
    }
    for p in ThpPolicy::ALL {
        for kib in [16u64, 32, 64, 128, 256, 512, 1024, 2048] {
            assert_eq!(
                setting(&format!("set thp {kib}K={p}")),
                Setting::Thp(vec![ThpSetting::Size {
                    size: size(kib * K),
                    policy: *p
                }])
            );
        }
    }
    assert_eq!(
        setting("set rlimit memlock 64K"),
        Setting::Rlimit {
            resource: Resource::Memlock,
            limit: Limit::Bytes(64 * K)
        }
    );
    assert_eq!(
        setting("set rlimit memlock unlimited"),
        Setting::Rlimit {
            resource: Resource::Memlock,
            limit: Limit::Unlimited
        }
    );
    assert_eq!(
        setting("set mempolicy interleave"),
        Setting::Mempolicy(Mempolicy::Interleave)
    );
    assert_eq!(
        setting("set mempolicy default"),
        Setting::Mempolicy(Mempolicy::Default)
    );
}

#[test]
fn processes() {
    let s = ok("p0 = spawn\nr = spawn privileged\np1 = p0 fork\np1 exit\n");
    assert_eq!(
        kinds(&s),
        vec![
            act(Some("p0"), Action::Spawn { privileged: false }),
            act(Some("r"), Action::Spawn { privileged: true }),
            act(Some("p1"), Action::Fork { task: p0() }),
            act(None, Action::Exit { task: n("p1") }),
        ]
    );
    let pos: Vec<Pos> = s.stmts.iter().map(|s| s.pos).collect();
    assert_eq!(pos[3], Pos { line: 4, col: 1 });
}

fn mmap(len: u64, prot: Prot, sharing: Sharing) -> Mmap {
    Mmap {
        len,
        prot,
        sharing,
        backing: Backing::Anon,
        populate: false,
        locked: false,
        noreserve: false,
        placement: Placement::Anywhere,
    }
}

#[test]
fn mmap_forms() {
    let base = mmap(G, Prot::Rw, Sharing::Private);
    assert_eq!(
        stmt("a = p0 mmap 1G rw private anon"),
        act(
            Some("a"),
            Action::Mmap {
                task: p0(),
                mmap: base.clone()
            }
        )
    );
    assert_eq!(
        stmt("s = p0 mmap 64K rw shared anon"),
        act(
            Some("s"),
            Action::Mmap {
                task: p0(),
                mmap: mmap(64 * K, Prot::Rw, Sharing::Shared)
            }
        )
    );
    let with = |f: &dyn Fn(&mut Mmap)| {
        let mut m = base.clone();
        f(&mut m);
        act(
            Some("a"),
            Action::Mmap {
                task: p0(),
                mmap: m,
            },
        )
    };
    assert_eq!(
        stmt("a = p0 mmap 1G rw private anon populate"),
        with(&|m| m.populate = true)
    );
    assert_eq!(
        stmt("a = p0 mmap 1G rw private anon locked"),
        with(&|m| m.locked = true)
    );
    assert_eq!(
        stmt("a = p0 mmap 1G rw private anon norserve"),
        with(&|m| m.noreserve = true)
    );
    assert_eq!(
        stmt("a = p0 mmap 1G rw private anon populate locked norserve"),
        with(&|m| {
            m.populate = true;
            m.locked = true;
            m.noreserve = true;
        })
    );
    let abs = AddrExpr::Abs(0x7f00_0000_0000);
    assert_eq!(
        stmt("a = p0 mmap 1G rw private anon fixed 0x7f0000000000"),
        with(&|m| m.placement = Placement::Fixed(abs.clone()))
    );
    assert_eq!(
        stmt("a = p0 mmap 1G rw private anon noreplace 0x7f0000000000"),
        with(&|m| m.placement = Placement::FixedNoreplace(abs.clone()))
    );
    assert_eq!(
        stmt("a = p0 mmap 1G rw private anon hint a+2G"),
        with(&|m| m.placement = Placement::Hint(a_plus(2 * G)))
    );
    assert_eq!(
        stmt("a = p0 mmap 1G rw private anon populate locked norserve fixed a"),
        with(&|m| {
            m.populate = true;
            m.locked = true;
            m.noreserve = true;
            m.placement = Placement::Fixed(a());
        })
    );
    for p in Prot::ALL {
        let k = stmt(&format!("b = p0 mmap 4K {p} private anon"));
        assert_eq!(
            k,
            act(
                Some("b"),
                Action::Mmap {
                    task: p0(),
                    mmap: mmap(4 * K, *p, Sharing::Private)
                }
            )
        );
    }
}

#[test]
fn address_space_calls() {
    assert_eq!(
        stmt("p0 munmap a+4K 8K"),
        act(
            None,
            Action::Munmap {
                task: p0(),
                addr: a_plus(4 * K),
                len: 8 * K
            }
        )
    );
    assert_eq!(
        stmt("p0 mprotect a 2M r              # prot: none | r | rw | rx | rwx"),
        act(
            None,
            Action::Mprotect {
                task: p0(),
                addr: a(),
                len: 2 * M,
                prot: Prot::R
            }
        )
    );
    let mremap = |fixed| Action::Mremap {
        task: p0(),
        addr: a(),
        old_len: G,
        new_len: 2 * G,
        maymove: true,
        dontunmap: false,
        fixed,
    };
    assert_eq!(
        stmt("b = p0 mremap a 1G 2G maymove"),
        act(Some("b"), mremap(None))
    );
    assert_eq!(
        stmt("b = p0 mremap a 1G 2G maymove fixed 0x600000000000"),
        act(Some("b"), mremap(Some(AddrExpr::Abs(0x6000_0000_0000))))
    );
    assert_eq!(
        stmt("p0 brk +64K                     # grow the heap; `p0 brk -64K` shrinks it"),
        act(
            None,
            Action::Brk {
                task: p0(),
                delta: BrkDelta::Grow(64 * K)
            }
        )
    );
    assert_eq!(
        stmt("p0 brk -64K"),
        act(
            None,
            Action::Brk {
                task: p0(),
                delta: BrkDelta::Shrink(64 * K)
            }
        )
    );
    assert_eq!(
        stmt("h = p0 brk +64K                 # h: the old break, i.e. the start of the new heap area"),
        act(
            Some("h"),
            Action::Brk {
                task: p0(),
                delta: BrkDelta::Grow(64 * K)
            }
        )
    );
    for advice in [
        "dontneed",
        "hugepage",
        "nohugepage",
        "dontfork",
        "dofork",
        "wipeonfork",
        "keeponfork",
    ] {
        let k = stmt(&format!("p0 madvise a 1G {advice}"));
        let want = Advice::from_keyword(advice).expect("advice");
        assert_eq!(
            k,
            act(
                None,
                Action::Madvise {
                    task: p0(),
                    addr: a(),
                    len: G,
                    advice: want
                }
            )
        );
    }
    assert_eq!(Advice::Dontneed.number(), 4);
    assert_eq!(Advice::Wipeonfork.number(), 18);
    for advice in Advice::ALL {
        stmt(&format!("p0 madvise a 1G {advice}"));
    }
    let range = |verb: &str| stmt(&format!("p0 {verb} a 1G"));
    assert_eq!(
        range("mlock"),
        act(
            None,
            Action::Mlock {
                task: p0(),
                addr: a(),
                len: G
            }
        )
    );
    assert_eq!(
        range("munlock"),
        act(
            None,
            Action::Munlock {
                task: p0(),
                addr: a(),
                len: G
            }
        )
    );
    assert_eq!(
        range("mlock2"),
        act(
            None,
            Action::Mlock2 {
                task: p0(),
                addr: a(),
                len: G,
                onfault: false
            }
        )
    );
    assert_eq!(
        stmt("p0 mlock2 a 1G onfault"),
        act(
            None,
            Action::Mlock2 {
                task: p0(),
                addr: a(),
                len: G,
                onfault: true
            }
        )
    );
    let mcl = |current, future, onfault| {
        act(
            None,
            Action::Mlockall {
                task: p0(),
                flags: MlockallFlags {
                    current,
                    future,
                    onfault,
                },
            },
        )
    };
    assert_eq!(stmt("p0 mlockall current"), mcl(true, false, false));
    assert_eq!(stmt("p0 mlockall future"), mcl(false, true, false));
    assert_eq!(stmt("p0 mlockall onfault"), mcl(false, false, true));
    assert_eq!(
        stmt("p0 mlockall current future onfault"),
        mcl(true, true, true)
    );
    assert_eq!(stmt("p0 mlockall future|current"), mcl(true, true, false));
    assert_eq!(
        stmt("p0 munlockall"),
        act(None, Action::Munlockall { task: p0() })
    );
    assert_eq!(
        stmt("p0 pin a+4K 4K                  # long-term pin (FOLL_PIN/FOLL_LONGTERM) until `unpin`"),
        act(
            None,
            Action::Pin {
                task: p0(),
                addr: a_plus(4 * K),
                len: 4 * K
            }
        )
    );
    assert_eq!(
        stmt("p0 unpin a+4K 4K"),
        act(
            None,
            Action::Unpin {
                task: p0(),
                addr: a_plus(4 * K),
                len: 4 * K
            }
        )
    );
}

#[test]
fn memory_access() {
    assert_eq!(
        stmt("p0 write a 1G pattern=0xA5      # fill with a byte"),
        act(
            None,
            Action::Write {
                task: p0(),
                addr: a(),
                len: G,
                pattern: 0xa5
            }
        )
    );
    assert_eq!(
        stmt("p0 write a+4K 1 pattern=0x01    # one byte"),
        act(
            None,
            Action::Write {
                task: p0(),
                addr: a_plus(4 * K),
                len: 1,
                pattern: 1
            }
        )
    );
    for (word, access) in [("read", Access::Read), ("write", Access::Write)] {
        assert_eq!(
            stmt(&format!("p0 touch a 1G {word}")),
            act(
                None,
                Action::Touch {
                    task: p0(),
                    addr: a(),
                    len: G,
                    access
                }
            )
        );
    }
    assert_eq!(
        stmt("p0 read a 4K"),
        act(
            None,
            Action::Read {
                task: p0(),
                addr: a(),
                len: 4 * K
            }
        )
    );
    assert_eq!(
        stmt("expect p1 read a 4K = SIGSEGV"),
        StmtKind::Expect(Expect::Outcome {
            action: Action::Read {
                task: n("p1"),
                addr: a(),
                len: 4 * K
            },
            outcome: Outcome::Signal(Signal::Sigsegv)
        })
    );
}

#[test]
fn expectations() {
    assert_eq!(
        stmt("expect p0 read a+4K 4K pattern=0xA5"),
        StmtKind::Expect(Expect::Read {
            task: p0(),
            addr: a_plus(4 * K),
            len: 4 * K,
            pattern: 0xa5
        })
    );
    assert_eq!(
        stmt("expect p0 mmap 4K rw private anon fixed 0x0 = EPERM      # any statement, expecting an errno"),
        StmtKind::Expect(Expect::Outcome {
            action: Action::Mmap {
                task: p0(),
                mmap: Mmap {
                    placement: Placement::Fixed(AddrExpr::Abs(0)),
                    ..mmap(4 * K, Prot::Rw, Sharing::Private)
                }
            },
            outcome: Outcome::Errno(Errno::EPERM)
        })
    );
    assert_eq!(
        stmt("expect p0 smaps a Rss=1G Private_Dirty=1G Shared_Dirty=0 AnonHugePages=0 Locked=0"),
        StmtKind::Expect(Expect::Smaps {
            task: p0(),
            mapping: n("a"),
            fields: vec![
                (SmapsField::Rss, G),
                (SmapsField::PrivateDirty, G),
                (SmapsField::SharedDirty, 0),
                (SmapsField::AnonHugePages, 0),
                (SmapsField::Locked, 0),
            ]
        })
    );
    assert_eq!(
        stmt("expect p0 status VmLck=0 VmRSS=1G"),
        StmtKind::Expect(Expect::Status {
            task: p0(),
            fields: vec![(StatusField::VmLck, 0), (StatusField::VmRSS, G)]
        })
    );
    stmt("expect p0 status RssAnon=4K VmSize=1G VmPin=0 VmData=8K");
    assert_eq!(
        stmt("expect p0 maps count=3"),
        StmtKind::Expect(Expect::MapsCount {
            task: p0(),
            count: 3
        })
    );
    assert_eq!(
        stmt("expect p0 maps a 0x7f0000000000-0x7f0040000000 rw-p"),
        StmtKind::Expect(Expect::MapsVma {
            task: p0(),
            addr: a(),
            start: 0x7f00_0000_0000,
            end: 0x7f00_4000_0000,
            perms: Perms {
                read: true,
                write: true,
                exec: false,
                shared: false
            }
        })
    );
    for perms in ["r--s", "---p", "rwxs", "r-xp"] {
        match stmt(&format!("expect p0 maps a 0x1000-0x2000 {perms}")) {
            StmtKind::Expect(Expect::MapsVma { perms: p, .. }) => {
                assert_eq!(p.to_string(), perms)
            }
            k => panic!("{k:?}"),
        }
    }
    for s in PagemapState::ALL {
        assert_eq!(
            stmt(&format!("expect p0 pagemap a+4K {s}")),
            StmtKind::Expect(Expect::Pagemap {
                task: p0(),
                addr: a_plus(4 * K),
                states: vec![*s]
            })
        );
    }
    stmt("expect p0 pagemap a present exclusive");
    let check = |flag, set| FlagCheck { flag, set };
    assert_eq!(
        stmt("expect p0 kpageflags a+4K mlocked unevictable thp anon lru !dirty   # !flag: must be clear"),
        StmtKind::Expect(Expect::Kpageflags {
            task: p0(),
            addr: a_plus(4 * K),
            flags: vec![
                check(KpageFlag::Mlocked, true),
                check(KpageFlag::Unevictable, true),
                check(KpageFlag::Thp, true),
                check(KpageFlag::Anon, true),
                check(KpageFlag::Lru, true),
                check(KpageFlag::Dirty, false),
            ]
        })
    );
    assert_eq!(
        stmt("expect p0 folio a+4K order=4                             # size of the folio mapping this page"),
        StmtKind::Expect(Expect::Folio {
            task: p0(),
            addr: a_plus(4 * K),
            order: 4
        })
    );
}

#[test]
fn every_keyword_of_the_lists() {
    for e in Errno::ALL {
        stmt(&format!("expect p0 munmap a 4K = {e}"));
    }
    for e in [
        "EPERM",
        "ENOENT",
        "EINTR",
        "EIO",
        "ENOMEM",
        "EACCES",
        "EFAULT",
        "EBUSY",
        "EEXIST",
        "EINVAL",
        "ENFILE",
        "EMFILE",
        "EFBIG",
        "ENOSPC",
        "EAGAIN",
        "EOVERFLOW",
    ] {
        assert!(Errno::from_keyword(e).is_some(), "{e}");
    }
    assert_eq!(Errno::ENOMEM.number(), 12);
    assert_eq!(Errno::from_number(22), Some(Errno::EINVAL));
    stmt("expect p0 touch a 4K write = SIGBUS");
    for f in SmapsField::ALL {
        stmt(&format!("expect p0 smaps a {f}=4K"));
    }
    for f in StatusField::ALL {
        stmt(&format!("expect p0 status {f}=0"));
    }
    for f in KpageFlag::ALL {
        stmt(&format!("expect p0 kpageflags a {f} "));
        stmt(&format!("expect p0 kpageflags a !{f}"));
    }
    for required in [
        "locked",
        "error",
        "referenced",
        "uptodate",
        "dirty",
        "lru",
        "active",
        "slab",
        "writeback",
        "reclaim",
        "buddy",
        "mmap",
        "anon",
        "swapcache",
        "swapbacked",
        "compound_head",
        "compound_tail",
        "huge",
        "unevictable",
        "hwpoison",
        "nopage",
        "ksm",
        "thp",
        "offline",
        "zero_page",
        "idle",
        "pgtable",
        "mlocked",
        "softdirty",
    ] {
        assert!(KpageFlag::from_keyword(required).is_some(), "{required}");
    }
    assert_eq!(KpageFlag::Locked.bit(), 0);
    assert_eq!(KpageFlag::Thp.bit(), 22);
    assert_eq!(KpageFlag::ZeroPage.bit(), 24);
    assert_eq!(KpageFlag::Pgtable.bit(), 26);
    assert_eq!(KpageFlag::Mlocked.bit(), 33);
    assert_eq!(KpageFlag::Softdirty.bit(), 40);
}

/// The SCENARIO.md snippets as one file, with the notational `a|b` and `[opt]`
/// replaced by one concrete choice and the machine settings first.
const SCENARIO_MD: &str = "\
set memory 4G                      # engine: size of simulated physical memory
set nodes 2                        # engine: NUMA nodes
set cpus 2                         # engine: CPUs (host threads)
set arch x86_64                    # engine: page-table format
set tunable NAME=VALUE             # engine: an optimization switch (see `usermm tunables`)
set thp 64K=always 2M=madvise      # per-size policy: always|madvise|never|inherit (sysfs meaning)
set thp top=madvise                # the top-level policy that `inherit` follows
set rlimit memlock 64K             # RLIMIT_MEMLOCK of processes spawned after this line
set mempolicy interleave           # NUMA placement of pages faulted after this line

p0 = spawn                         # an ordinary process with an empty address space
r = spawn privileged               # one with root's capabilities
p1 = p0 fork                       # fork (the child is a new process)
a = p0 mmap 1G rw private anon populate locked norserve fixed 0x7f0000000000
s = p0 mmap 64K rw shared anon
p0 munmap a+4K 8K
p0 mprotect a 2M r              # prot: none | r | rw | rx | rwx
b = p0 mremap a 1G 2G maymove fixed 0x600000000000
p0 brk +64K                     # grow the heap; `p0 brk -64K` shrinks it
h = p0 brk +64K                 # h: the old break, i.e. the start of the new heap area
p0 madvise a 1G dontneed
p0 mlock a 1G
p0 mlock2 a 1G onfault
p0 munlock a 1G
p0 mlockall current future
p0 munlockall
p0 pin a+4K 4K                  # long-term pin (FOLL_PIN/FOLL_LONGTERM) until `unpin`
p0 unpin a+4K 4K
p0 write a 1G pattern=0xA5      # fill with a byte
p0 write a+4K 1 pattern=0x01    # one byte
p0 touch a 1G write             # one access per page; a write access keeps the contents
expect p1 read a 4K = SIGSEGV
expect p0 read a+4K 4K pattern=0xA5
expect p0 mmap 4K rw private anon fixed 0x0 = EPERM      # any statement, expecting an errno
expect p0 smaps a Rss=1G Private_Dirty=1G Shared_Dirty=0 AnonHugePages=0 Locked=0
expect p0 status VmLck=0 VmRSS=1G
expect p0 maps count=3
expect p0 maps a 0x7f0000000000-0x7f0040000000 rw-p
expect p0 pagemap a+4K exclusive
expect p0 kpageflags a+4K mlocked unevictable thp anon lru !dirty   # !flag: must be clear
expect p0 folio a+4K order=4                             # size of the folio mapping this page
p1 exit                            # exit: all its mappings are torn down
";

const DESIGN_MD: &str = "\
# 1 GiB of 64K folios, fork, child writes, parent still sees its data
thp 64K=always
p0 = spawn
a = p0 mmap 1G rw private anon
p0 write a 1G pattern=0xA5
p1 = p0 fork
p1 write a+4K 4K pattern=0x5A
expect p0 read a+4K 4K pattern=0xA5
expect p1 smaps a Private_Dirty=4K
p1 exit
";

#[test]
fn scenario_md_as_one_file() {
    let s = ok(SCENARIO_MD);
    assert_eq!(s.stmts.len(), 41);
    assert_eq!(s.file, "t.scn");
    // Line numbers skip the blank line; columns are 1.
    assert_eq!(s.stmts[9].pos, Pos { line: 11, col: 1 });
    let again = ok(&s.to_string());
    assert_eq!(again, ok(&s.to_string()));
    assert_eq!(kinds(&again), kinds(&s));
    // Canonical text is a fixpoint.
    assert_eq!(again.to_string(), s.to_string());
}

#[test]
fn design_md_example() {
    let s = ok(DESIGN_MD);
    assert_eq!(s.stmts.len(), 9);
    assert_eq!(
        s.stmts[0].kind,
        StmtKind::Set(Setting::Thp(vec![ThpSetting::Size {
            size: ThpSize::new(64 * K).expect("size"),
            policy: ThpPolicy::Always
        }]))
    );
    assert_eq!(s.stmts[0].pos, Pos { line: 2, col: 1 });
    assert_eq!(
        s.stmts[7].kind,
        StmtKind::Expect(Expect::Smaps {
            task: n("p1"),
            mapping: n("a"),
            fields: vec![(SmapsField::PrivateDirty, 4 * K)]
        })
    );
    let printed = s.to_string();
    assert!(
        printed.starts_with("set thp 64K=always\np0 = spawn\n"),
        "{printed}"
    );
    assert_eq!(kinds(&ok(&printed)), kinds(&s));
}

#[test]
fn lexical_variants() {
    // Lower-case units, hex sizes, NAME-SIZE, no spaces around `=`, indentation, CRLF.
    let s = ok("p0=spawn\r\n  a = p0 mmap 0x10m rw private anon\r\n\tp0 munmap a-4k 0x1000\n");
    assert_eq!(s.stmts[1].pos, Pos { line: 2, col: 3 });
    assert_eq!(
        s.stmts[2].kind,
        act(
            None,
            Action::Munmap {
                task: p0(),
                addr: AddrExpr::Rel {
                    base: n("a"),
                    delta: Delta::Minus(4 * K)
                },
                len: 4 * K
            }
        )
    );
    assert_eq!(s.stmts[2].pos, Pos { line: 3, col: 2 });
    match &s.stmts[1].kind {
        StmtKind::Action {
            action: Action::Mmap { mmap, .. },
            ..
        } => assert_eq!(mmap.len, 16 * M),
        k => panic!("{k:?}"),
    }
    // `a-0` is `a`; options in any order; noreserve spelling.
    assert_eq!(
        stmt("p0 munmap a-0 4K"),
        stmt("p0 munmap a 4K"),
        "a-0 normalises to a"
    );
    assert_eq!(
        stmt("b = p0 mmap 4K anon noreserve private rw"),
        stmt("b = p0 mmap 4K rw private anon norserve")
    );
    // A process stays known after exit.
    ok("p0 = spawn\np1 = p0 fork\np1 exit\nexpect p1 read 0x1000 1 = SIGSEGV\n");
    // Comments and blank lines only.
    assert!(ok("\n# nothing\n   \n").stmts.is_empty());
    assert!(ok("").stmts.is_empty());
}

#[test]
fn display_examples() {
    let s = ok(&format!(
        "{PRELUDE}p0 munmap a+0x1000 4097\nexpect p0 maps a 0x1000-0x2000 ---p\nb = p0 mmap 3M none shared anon hint 0x7F0000000000\n"
    ));
    let text = s.to_string();
    assert!(text.contains("p0 munmap a+4K 4097\n"), "{text}");
    assert!(
        text.contains("expect p0 maps a 0x1000-0x2000 ---p\n"),
        "{text}"
    );
    assert!(
        text.contains("b = p0 mmap 3M none shared anon hint 0x7f0000000000\n"),
        "{text}"
    );
    assert_eq!(s.stmts[3].to_string(), "p0 munmap a+4K 4097");
    assert_eq!(scenario::Bytes(0).to_string(), "0");
    assert_eq!(Pos { line: 3, col: 7 }.to_string(), "3:7");
    assert_eq!(scenario::Bytes(1536 * K).to_string(), "1536K");
    assert_eq!(scenario::Bytes(u64::MAX).to_string(), u64::MAX.to_string());
}
