//! Printing the syntax tree back as canonical scenario text.
//!
//! The canonical form is one statement per line, single spaces, no comments;
//! sizes in the largest unit that divides them exactly (`4K`, `1G`, `4097`),
//! absolute addresses in lower-case hex (`0x7f0000000000`), byte patterns as
//! `0xNN` in upper case, `thp` always with its `set`. Parsing the printed text
//! gives back the same statements.

use std::fmt::{self, Display, Formatter};

use crate::ast::{
    Action, AddrExpr, Backing, BrkDelta, Delta, Expect, FileKind, FlagCheck, Limit, MlockallFlags,
    Mmap, Name, Outcome, Perms, Placement, Pos, Script, Setting, ShmemSetting, Stmt, StmtKind,
    ThpSetting, ThpSize,
};

/// A byte count, displayed canonically: `0`, `4K`, `2M`, `1G`, `4097`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bytes(pub u64);

impl Display for Bytes {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let v = self.0;
        for (shift, unit) in [(30u32, 'G'), (20, 'M'), (10, 'K')] {
            if v != 0 && v.trailing_zeros() >= shift {
                return write!(f, "{}{unit}", v >> shift);
            }
        }
        write!(f, "{v}")
    }
}

/// A byte pattern, displayed `0xNN`.
struct Pattern(u8);

impl Display for Pattern {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:02X}", self.0)
    }
}

impl Display for Pos {
    /// `LINE:COL`, as in messages (`format!("{file}:{pos}: ...")`).
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

impl Display for Name {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Display for AddrExpr {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            AddrExpr::Abs(a) => write!(f, "{a:#x}"),
            AddrExpr::Rel { base, delta } => match delta {
                Delta::Plus(0) => write!(f, "{base}"),
                Delta::Plus(d) => write!(f, "{base}+{}", Bytes(*d)),
                Delta::Minus(d) => write!(f, "{base}-{}", Bytes(*d)),
            },
        }
    }
}

impl Display for ThpSize {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        Bytes(self.bytes()).fmt(f)
    }
}

impl Display for ThpSetting {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            ThpSetting::Top(p) => write!(f, "top={p}"),
            ThpSetting::Size { size, policy } => write!(f, "{size}={policy}"),
        }
    }
}

impl Display for ShmemSetting {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            ShmemSetting::Top(p) => write!(f, "top={p}"),
            ShmemSetting::Size { size, policy } => write!(f, "{size}={policy}"),
        }
    }
}

impl Display for Limit {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Bytes(b) => Bytes(*b).fmt(f),
            Limit::Unlimited => f.write_str("unlimited"),
        }
    }
}

impl Display for Setting {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str("set ")?;
        match self {
            Setting::Memory(m) => write!(f, "memory {}", Bytes(*m)),
            Setting::Swap(m, ssd) => {
                write!(f, "swap {}", Bytes(*m))?;
                if *ssd {
                    f.write_str(" ssd")?;
                }
                Ok(())
            }
            Setting::Nodes(n) => write!(f, "nodes {n}"),
            Setting::Cpus(n) => write!(f, "cpus {n}"),
            Setting::Arch(a) => write!(f, "arch {a}"),
            Setting::Tunable { name, value } => write!(f, "tunable {name}={value}"),
            Setting::Thp(pairs) => {
                f.write_str("thp")?;
                for p in pairs {
                    write!(f, " {p}")?;
                }
                Ok(())
            }
            Setting::Rlimit { resource, limit } => write!(f, "rlimit {resource} {limit}"),
            Setting::Mempolicy(p) => write!(f, "mempolicy {p}"),
            Setting::Shmem(pairs) => {
                f.write_str("shmem")?;
                for p in pairs {
                    write!(f, " {p}")?;
                }
                Ok(())
            }
        }
    }
}

impl Display for MlockallFlags {
    /// The set flags separated by spaces (nothing if none is set).
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let words = [
            (self.current, "current"),
            (self.future, "future"),
            (self.onfault, "onfault"),
        ];
        let mut first = true;
        for (_, w) in words.iter().filter(|(on, _)| *on) {
            if !first {
                f.write_str(" ")?;
            }
            f.write_str(w)?;
            first = false;
        }
        Ok(())
    }
}

impl Display for Mmap {
    /// The arguments after `mmap`.
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", Bytes(self.len), self.prot, self.sharing)?;
        match &self.backing {
            Backing::Anon => f.write_str(" anon")?,
            Backing::File { file, offset: 0 } => write!(f, " file {file}")?,
            Backing::File { file, offset } => write!(f, " file {file} offset {}", Bytes(*offset))?,
        }
        if self.populate {
            f.write_str(" populate")?;
        }
        if self.locked {
            f.write_str(" locked")?;
        }
        if self.noreserve {
            f.write_str(" norserve")?;
        }
        match &self.placement {
            Placement::Anywhere => Ok(()),
            Placement::Hint(a) => write!(f, " hint {a}"),
            Placement::Fixed(a) => write!(f, " fixed {a}"),
            Placement::FixedNoreplace(a) => write!(f, " noreplace {a}"),
        }
    }
}

impl Display for Action {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let verb = self.verb();
        match self {
            Action::Spawn { privileged } => {
                f.write_str("spawn")?;
                if *privileged {
                    f.write_str(" privileged")?;
                }
                Ok(())
            }
            Action::Fork { task } | Action::Exit { task } | Action::Munlockall { task } => {
                write!(f, "{task} {verb}")
            }
            Action::Mmap { task, mmap } => write!(f, "{task} mmap {mmap}"),
            Action::Munmap { task, addr, len }
            | Action::Mlock { task, addr, len }
            | Action::Munlock { task, addr, len }
            | Action::Pin { task, addr, len }
            | Action::Unpin { task, addr, len }
            | Action::Read { task, addr, len } => write!(f, "{task} {verb} {addr} {}", Bytes(*len)),
            Action::Mprotect {
                task,
                addr,
                len,
                prot,
            } => write!(f, "{task} mprotect {addr} {} {prot}", Bytes(*len)),
            Action::Mremap {
                task,
                addr,
                old_len,
                new_len,
                maymove,
                dontunmap,
                fixed,
            } => {
                write!(
                    f,
                    "{task} mremap {addr} {} {}",
                    Bytes(*old_len),
                    Bytes(*new_len)
                )?;
                if *maymove {
                    f.write_str(" maymove")?;
                }
                if *dontunmap {
                    f.write_str(" dontunmap")?;
                }
                if let Some(a) = fixed {
                    write!(f, " fixed {a}")?;
                }
                Ok(())
            }
            Action::Brk { task, delta } => match delta {
                BrkDelta::Grow(d) => write!(f, "{task} brk +{}", Bytes(*d)),
                BrkDelta::Shrink(d) => write!(f, "{task} brk -{}", Bytes(*d)),
            },
            Action::Madvise {
                task,
                addr,
                len,
                advice,
            } => write!(f, "{task} madvise {addr} {} {advice}", Bytes(*len)),
            Action::Mlock2 {
                task,
                addr,
                len,
                onfault,
            } => {
                write!(f, "{task} mlock2 {addr} {}", Bytes(*len))?;
                if *onfault {
                    f.write_str(" onfault")?;
                }
                Ok(())
            }
            Action::Mlockall { task, flags } => write!(f, "{task} mlockall {flags}"),
            Action::Write {
                task,
                addr,
                len,
                pattern,
            } => write!(
                f,
                "{task} write {addr} {} pattern={}",
                Bytes(*len),
                Pattern(*pattern)
            ),
            Action::Touch {
                task,
                addr,
                len,
                access,
            } => write!(f, "{task} touch {addr} {} {access}", Bytes(*len)),
            Action::File {
                size,
                kind,
                pattern,
            } => {
                write!(f, "file {}", Bytes(*size))?;
                if *kind == FileKind::Disk {
                    f.write_str(" disk")?;
                }
                if let Some(p) = pattern {
                    write!(f, " pattern={}", Pattern(*p))?;
                }
                Ok(())
            }
            Action::Pwrite {
                task,
                file,
                offset,
                len,
                pattern,
            } => write!(
                f,
                "{task} pwrite {file} {} {} pattern={}",
                Bytes(*offset),
                Bytes(*len),
                Pattern(*pattern)
            ),
            Action::Pread {
                task,
                file,
                offset,
                len,
            } => write!(f, "{task} pread {file} {} {}", Bytes(*offset), Bytes(*len)),
            Action::Ftruncate { task, file, size } => {
                write!(f, "{task} ftruncate {file} {}", Bytes(*size))
            }
            Action::Fallocate {
                task,
                file,
                offset,
                len,
                punch,
            } => {
                write!(
                    f,
                    "{task} fallocate {file} {} {}",
                    Bytes(*offset),
                    Bytes(*len)
                )?;
                if *punch {
                    f.write_str(" punch")?;
                }
                Ok(())
            }
            Action::Msync {
                task,
                addr,
                len,
                mode,
            } => write!(f, "{task} msync {addr} {} {mode}", Bytes(*len)),
            Action::Fsync { task, file } => write!(f, "{task} fsync {file}"),
            Action::Reclaim { task, len } => write!(f, "{task} reclaim {}", Bytes(*len)),
        }
    }
}

impl Display for Outcome {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Errno(e) => e.fmt(f),
            Outcome::Signal(s) => s.fmt(f),
        }
    }
}

impl Display for Perms {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let c = |on: bool, ch: char| if on { ch } else { '-' };
        write!(
            f,
            "{}{}{}{}",
            c(self.read, 'r'),
            c(self.write, 'w'),
            c(self.exec, 'x'),
            if self.shared { 's' } else { 'p' }
        )
    }
}

impl Display for FlagCheck {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if !self.set {
            f.write_str("!")?;
        }
        self.flag.fmt(f)
    }
}

impl Display for Expect {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str("expect ")?;
        match self {
            Expect::Outcome { action, outcome } => write!(f, "{action} = {outcome}"),
            Expect::Read {
                task,
                addr,
                len,
                pattern,
            } => write!(
                f,
                "{task} read {addr} {} pattern={}",
                Bytes(*len),
                Pattern(*pattern)
            ),
            Expect::Smaps {
                task,
                mapping,
                fields,
            } => {
                write!(f, "{task} smaps {mapping}")?;
                for (k, v) in fields {
                    write!(f, " {k}={}", Bytes(*v))?;
                }
                Ok(())
            }
            Expect::Counters { values } => {
                f.write_str("counters")?;
                for (k, v) in values {
                    write!(f, " {k}={v}")?;
                }
                Ok(())
            }
            Expect::Status { task, fields } => {
                write!(f, "{task} status")?;
                for (k, v) in fields {
                    write!(f, " {k}={}", Bytes(*v))?;
                }
                Ok(())
            }
            Expect::MapsCount { task, count } => write!(f, "{task} maps count={count}"),
            Expect::MapsVma {
                task,
                addr,
                start,
                end,
                perms,
            } => write!(f, "{task} maps {addr} {start:#x}-{end:#x} {perms}"),
            Expect::Pagemap { task, addr, states } => {
                write!(f, "{task} pagemap {addr}")?;
                for s in states {
                    write!(f, " {s}")?;
                }
                Ok(())
            }
            Expect::Kpageflags { task, addr, flags } => {
                write!(f, "{task} kpageflags {addr}")?;
                for c in flags {
                    write!(f, " {c}")?;
                }
                Ok(())
            }
            Expect::Folio { task, addr, order } => write!(f, "{task} folio {addr} order={order}"),
            Expect::Pread {
                task,
                file,
                offset,
                len,
                pattern,
            } => write!(
                f,
                "{task} pread {file} {} {} pattern={}",
                Bytes(*offset),
                Bytes(*len),
                Pattern(*pattern)
            ),
            Expect::Fincore {
                task,
                file,
                offset,
                len,
                bytes,
            } => write!(
                f,
                "{task} fincore {file} {} {} {}",
                Bytes(*offset),
                Bytes(*len),
                Bytes(*bytes)
            ),
        }
    }
}

impl Display for StmtKind {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            StmtKind::Set(s) => s.fmt(f),
            StmtKind::Action { bind, action } => {
                if let Some(name) = bind {
                    write!(f, "{name} = ")?;
                }
                action.fmt(f)
            }
            StmtKind::Expect(e) => e.fmt(f),
            StmtKind::Dump { task, addr, len } => write!(f, "dump {task} {addr} {}", Bytes(*len)),
            StmtKind::Bench(m) => write!(f, "bench {m}"),
        }
    }
}

impl Display for Stmt {
    /// The statement's canonical text (without its position).
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        self.kind.fmt(f)?;
        match self.cpu {
            Some(n) => write!(f, " on cpu{n}"),
            None => Ok(()),
        }
    }
}

impl Display for Script {
    /// One canonical statement per line, each ending in a newline.
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        for s in &self.stmts {
            writeln!(f, "{s}")?;
        }
        Ok(())
    }
}
