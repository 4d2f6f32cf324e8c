//! The usermm scenario language (v3: anonymous memory, files, inspection): parser, typed
//! syntax tree, and the runner over a backend (the engine, or the host through the oracle).
//!
//! A scenario is a plain-text file, one statement per line, run by the engine
//! (`usermm run`) and by the host kernel (`usermm oracle`). The complete reference, with its
//! grammar, is `docs/scenario-language.md` (also `usermm man language`); a test keeps it and
//! this parser in step. The summary grammar below is the v1 core. [`parse`] turns a file into a [`Script`] of [`Stmt`]s (each with its
//! line and column), or reports every bad line as `FILE:LINE:COL: message`
//! ([`ParseErrors`]). `Display` on the tree prints canonical scenario text that
//! parses back to the same tree. This crate does not run anything.
//!
//! # Example
//!
//! ```
//! let text = "p0 = spawn\na = p0 mmap 2M rw private anon   # 2 MiB\n";
//! let script = scenario::parse("demo.scn", text).unwrap();
//! assert_eq!(script.stmts[1].pos, scenario::Pos { line: 2, col: 1 });
//! assert_eq!(script.to_string(), "p0 = spawn\na = p0 mmap 2M rw private anon\n");
//!
//! let err = scenario::parse("bad.scn", "p0 = spawn\np0 munmap b 4K\np0 mmap 4Q\n").unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "bad.scn:2:11: unknown name `b`\n\
//!      bad.scn:3:9: bad size `4Q` (expected a decimal or 0x hex number with an optional K, M or G)"
//! );
//! ```
//!
//! # Grammar
//!
//! ```text
//! file      = { line "\n" } ;                 (* "\r\n" accepted too *)
//! line      = [ stmt ] [ "#" comment ] ;
//! stmt      = "set" setting | "thp" thp-pair { thp-pair }
//!           | [ NAME "=" ] action
//!           | "expect" ( action "=" outcome
//!                      | TASK "read" addr SIZE "pattern=" BYTE
//!                      | TASK observation ) ;
//! setting   = "memory" SIZE | "nodes" NUM | "cpus" NUM | "arch" ( "x86_64" | "arm64" )
//!           | "tunable" TEXT "=" TEXT | "thp" thp-pair { thp-pair }
//!           | "rlimit" "memlock" ( SIZE | "unlimited" )
//!           | "mempolicy" ( "interleave" | "default" ) ;
//! thp-pair  = ( SIZE | "top" ) "=" ( "always" | "madvise" | "never" | "inherit" ) ;
//! action    = "spawn" [ "privileged" ]
//!           | TASK "fork" | TASK "exit"
//!           | TASK "mmap" SIZE { mmap-opt }   (* needs a prot, private|shared, anon *)
//!           | TASK "munmap" addr SIZE
//!           | TASK "mprotect" addr SIZE prot
//!           | TASK "mremap" addr SIZE SIZE { "maymove" | "dontunmap" | "fixed" addr }
//!           | TASK "brk" ( "+" | "-" ) SIZE
//!           | TASK "madvise" addr SIZE advice
//!           | TASK ( "mlock" | "munlock" | "pin" | "unpin" | "read" ) addr SIZE
//!           | TASK "mlock2" addr SIZE [ "onfault" ]
//!           | TASK "mlockall" mcl { [ "|" ] mcl } | TASK "munlockall"
//!           | TASK "write" addr SIZE "pattern=" BYTE
//!           | TASK "touch" addr SIZE ( "read" | "write" ) ;
//! mmap-opt  = prot | "private" | "shared" | "anon" | "populate" | "locked"
//!           | "norserve" | "noreserve" | ( "fixed" | "noreplace" | "hint" ) addr ;
//! prot      = "none" | "r" | "rw" | "rx" | "rwx" ;
//! outcome   = ERRNO | "SIGSEGV" | "SIGBUS" ;
//! observation = "smaps" NAME smaps-field "=" SIZE { ... }
//!           | "status" status-field "=" SIZE { ... }
//!           | "maps" "count=" NUM | "maps" addr HEX "-" HEX PERMS
//!           | "pagemap" addr pm-state { pm-state }
//!           | "kpageflags" addr [ "!" ] kflag { [ "!" ] kflag }
//!           | "folio" addr "order=" NUM ;
//! addr      = NAME [ ( "+" | "-" ) SIZE ] | HEX ;
//! SIZE      = ( DEC | HEX ) [ "K" | "M" | "G" ] ;      (* powers of 1024 *)
//! NUM       = DEC | HEX ;   HEX = "0x" hexdigits ;   BYTE = "0x" 1-2 hexdigits ;
//! NAME      = [A-Za-z_][A-Za-z0-9_]* ;                (* not set|thp|expect|spawn *)
//! PERMS     = [r-][w-][x-][ps] ;
//! ```
//! Keyword sets are the variants of the [`Keyword`] enums: [`Prot`], [`Advice`],
//! [`MlockallFlag`], [`Access`], [`Errno`], [`Signal`], [`SmapsField`],
//! [`StatusField`], [`PagemapState`], [`KpageFlag`], [`ThpPolicy`], [`ThpTop`],
//! [`Arch`], [`Mempolicy`], [`Resource`]; `Keyword::ALL` lists them.
//!
//! # Decisions where SCENARIO.md is silent
//!
//! - Units may also be written `k`, `m`, `g`: no hex digit and no other suffix uses
//!   these letters, so they are unambiguous; they mean powers of 1024 too.
//! - Tokens need no spaces around `=`, `+`, `-`, `!`, `|` (`a = p0 ...` and
//!   `a=p0 ...` are the same); `rw-p`, `START-END` and tunables are read as glued
//!   text.
//! - Absolute addresses are hex (`0x...`) without unit; a decimal address is an error.
//! - `NAME-SIZE` is accepted as well as `NAME+SIZE`.
//! - Names are bound in file order by `NAME = spawn|fork|mmap|mremap|brk`; a later
//!   binding of the same name replaces the earlier one. A process name stays known
//!   after `exit`. Using a mapping where a process is needed (or the reverse) is an
//!   error. Binding any other action is an error.
//! - `expect NAME = ...` is an error: an expected failure returns nothing to bind.
//!   `expect ACTION` needs `= OUTCOME`; accesses (`read`, `write`, `touch`) expect a
//!   signal, every other action an errno.
//! - `mmap` options may come in any order after the size; `anon` is required; an
//!   option may not repeat; at most one of `fixed`/`noreplace`/`hint`.
//!   `noreserve` is accepted for `norserve`. `mremap` also takes `dontunmap`.
//! - `mlockall` flags may be separated by spaces or `|`.
//! - `set memory|nodes|cpus|arch` must come before the first `spawn` or `file`; memory is
//!   non-zero, nodes 1..=1024, cpus 1..=8192. `set tunable` takes one NAME=VALUE.
//! - `maps NAME START-END PERMS` accepts any address expression for NAME.
//! - Sizes of zero are accepted everywhere except `set memory` (the kernel's
//!   EINVAL for a zero length is something a scenario may want to expect).
//!
//! One error is reported per bad line (the first found, left to right). A bad
//! `NAME = ...` line still binds NAME, so its later uses do not add errors.

mod ast;
pub mod backend;
mod display;
pub mod engine;
mod error;
mod lexer;
mod parser;
pub mod run;
mod source;
mod thp;

pub use ast::{
    Access, Action, AddrExpr, Advice, Arch, BenchMark, BrkDelta, Delta, Errno, Expect, FlagCheck,
    Keyword, KpageFlag, Limit, Mempolicy, MlockallFlag, MlockallFlags, Mmap, Name, NameKind,
    Outcome, PagemapState, Perms, Placement, Pos, Prot, Resource, Script, Setting, Sharing, Signal,
    SmapsField, StatusField, Stmt, StmtKind, ThpPolicy, ThpSetting, ThpSize, ThpTop,
};
pub use ast::{Backing, FileKind, MsyncMode, ShmemPolicy, ShmemSetting, ShmemTop};
pub use display::Bytes;
pub use error::{ErrorKind, ParseError, ParseErrors, MAX_ECHO, MAX_ERRORS};
pub use parser::parse;
pub use source::{read_source, SourceError, MAX_SOURCE};
pub use thp::{apply_thp, ThpPairError};
