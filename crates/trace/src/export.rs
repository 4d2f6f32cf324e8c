//! A small trace as a scenario file (`../shared/SCENARIO.md`), for the oracle and for reading.
//!
//! Processes are spawned privileged; an exec is a new `spawn` whose recorded image is mapped
//! with `fixed` and whose present pages are touched; every call uses the host's addresses
//! (`fixed` at the returned address); a failed call becomes `expect … = ERRNO`; every fault is
//! a `touch` of its page; `brk` becomes fixed anonymous mmap/munmap (as in the replay); the
//! recorded RSS at each exit is a comment.

use crate::format::{Event, Trace, FORK_SHARES_VM, IMG_SHARED, IMG_STACK};
use std::collections::HashMap;
use std::fmt::Write as _;

/// Largest trace exported (events).
pub const MAX_EXPORT_EVENTS: usize = 50_000;

/// Why a trace cannot be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Too many events for a readable scenario.
    #[error("the trace has {0} events; export is for traces of at most {MAX_EXPORT_EVENTS}")]
    TooBig(usize),
}

fn prot_word(p: u32) -> &'static str {
    match (p & 1 != 0, p & 2 != 0, p & 4 != 0) {
        (_, true, true) => "rwx",
        (_, true, false) => "rw",
        (_, false, true) => "rx",
        (true, false, false) => "r",
        (false, false, false) => "none",
    }
}

fn errno_name(ret: i64) -> Option<&'static str> {
    Some(match -ret {
        1 => "EPERM",
        9 => "EBADF",
        11 => "EAGAIN",
        12 => "ENOMEM",
        13 => "EACCES",
        14 => "EFAULT",
        17 => "EEXIST",
        19 => "ENODEV",
        22 => "EINVAL",
        75 => "EOVERFLOW",
        _ => return None,
    })
}

fn advice_word(a: u32) -> Option<&'static str> {
    Some(match a {
        0 => "normal",
        1 => "random",
        2 => "sequential",
        3 => "willneed",
        4 => "dontneed",
        8 => "free",
        9 => "remove",
        10 => "dontfork",
        11 => "dofork",
        14 => "hugepage",
        15 => "nohugepage",
        16 => "dontdump",
        17 => "dodump",
        18 => "wipeonfork",
        19 => "keeponfork",
        20 => "cold",
        21 => "pageout",
        _ => return None,
    })
}

/// The scenario text of `trace`.
pub fn to_scenario(trace: &Trace) -> Result<String, ExportError> {
    if trace.events.len() > MAX_EXPORT_EVENTS {
        return Err(ExportError::TooBig(trace.events.len()));
    }
    let mut s = String::new();
    let h = &trace.header;
    let _ = writeln!(s, "# usermm trace export: {}", h.command.join(" "));
    let _ = writeln!(
        s,
        "# recorded on {} (Linux {}), host policy: {}",
        h.host, h.kernel, h.policy
    );
    let _ = writeln!(s, "set thp top=never");
    let _ = writeln!(s, "set rlimit memlock unlimited");
    let mut names: HashMap<u32, String> = HashMap::new();
    let mut brk: HashMap<String, u64> = HashMap::new();
    let mut gen = 0u64;
    let mut fresh = |base: &str| {
        gen += 1;
        format!("{base}_{gen}")
    };
    // A failed call: `expect STMT = ERRNO`, or a comment when the errno has no keyword.
    let outcome = |s: &mut String, stmt: String, ret: i64| {
        if ret >= 0 {
            let _ = writeln!(s, "{stmt}");
        } else if let Some(e) = errno_name(ret) {
            let _ = writeln!(s, "expect {stmt} = {e}");
        } else {
            let _ = writeln!(s, "# host: errno {} for: {stmt}", -ret);
        }
    };
    for ev in &trace.events {
        let name = ev.pid().and_then(|p| names.get(&p).cloned());
        match ev {
            Event::Spawn { pid } => {
                let n = fresh(&format!("p{pid}"));
                let _ = writeln!(s, "{n} = spawn privileged");
                names.insert(*pid, n);
            }
            Event::Fork { child, flags, .. } => {
                let Some(p) = name else { continue };
                if flags & FORK_SHARES_VM != 0 {
                    let _ = writeln!(s, "# p{child}: vfork child of {p}, shares its memory");
                    names.insert(*child, p);
                } else {
                    let n = fresh(&format!("p{child}"));
                    let _ = writeln!(s, "{n} = {p} fork");
                    if let Some(&b) = brk.get(&p) {
                        brk.insert(n.clone(), b);
                    }
                    names.insert(*child, n);
                }
            }
            Event::Exec { pid, image } => {
                if let Some(old) = names.remove(pid) {
                    if !names.values().any(|v| *v == old) {
                        let _ = writeln!(s, "{old} exit");
                    }
                }
                let n = fresh(&format!("p{pid}"));
                let _ = writeln!(s, "# exec of trace pid {pid}");
                let _ = writeln!(s, "{n} = spawn privileged");
                let mut prev_end = 0x10000u64;
                for v in &image.vmas {
                    let mut start = v.start;
                    if v.flags & IMG_STACK != 0 {
                        start = v.end.saturating_sub(8 << 20).max(prev_end).min(v.start);
                    }
                    let share = if v.flags & IMG_SHARED != 0 {
                        "shared"
                    } else {
                        "private"
                    };
                    let backing = match v.file {
                        Some(f) => format!("file f{f} offset {:#x}", v.offset),
                        None => "anon".into(),
                    };
                    let m = fresh("m");
                    let _ = writeln!(
                        s,
                        "{m} = {n} mmap {:#x} {} {share} {backing} fixed {start:#x}",
                        v.end - start,
                        prot_word(v.prot as u32)
                    );
                    prev_end = v.end;
                }
                for &(a, w) in &image.pages {
                    let acc = if w { "write" } else { "read" };
                    let _ = writeln!(s, "{n} touch {a:#x} 4K {acc}");
                }
                names.insert(*pid, n);
            }
            Event::Exit { pid } => {
                let Some(n) = names.remove(pid) else { continue };
                if names.values().any(|v| *v == n) {
                    continue; // a vfork child leaving its parent's memory
                }
                let _ = writeln!(s, "{n} exit");
            }
            Event::File { id, size, path, .. } => {
                let _ = writeln!(s, "# {path}");
                let _ = writeln!(
                    s,
                    "f{id} = file {:#x} disk",
                    (size.saturating_add(4095) & !4095).max(4096)
                );
            }
            Event::Validate {
                rss_anon_kb,
                rss_file_kb,
                ..
            } => {
                let _ = writeln!(
                    s,
                    "# host at exit of {}: RssAnon {rss_anon_kb} kB, RssFile {rss_file_kb} kB",
                    name.unwrap_or_default()
                );
            }
            Event::Lost { count } => {
                let _ = writeln!(s, "# {count} records lost while recording");
            }
            Event::Fault { addr, write, .. } => {
                let Some(n) = name else { continue };
                let acc = if *write { "write" } else { "read" };
                let _ = writeln!(s, "{n} touch {addr:#x} 4K {acc}");
            }
            Event::Mmap {
                addr,
                len,
                prot,
                flags,
                offset,
                file,
                ret,
                ..
            } => {
                let Some(n) = name else { continue };
                let share = if flags & 3 == 2 { "private" } else { "shared" };
                let backing = match (flags & 0x20 != 0, file) {
                    (false, Some(f)) => format!("file f{f} offset {offset:#x}"),
                    _ => "anon".into(),
                };
                let place = if *ret >= 0 {
                    format!(" fixed {ret:#x}")
                } else if flags & 0x100000 != 0 {
                    format!(" noreplace {addr:#x}")
                } else if flags & 0x10 != 0 {
                    format!(" fixed {addr:#x}")
                } else if *addr != 0 {
                    format!(" hint {addr:#x}")
                } else {
                    String::new()
                };
                let mut extra = String::new();
                for (bit, w) in [
                    (0x8000, " populate"),
                    (0x2000, " locked"),
                    (0x4000, " norserve"),
                ] {
                    if flags & bit != 0 {
                        extra.push_str(w);
                    }
                }
                let m = fresh("m");
                let stmt = format!(
                    "{n} mmap {len:#x} {} {share} {backing}{place}{extra}",
                    prot_word(*prot)
                );
                if *ret >= 0 {
                    let _ = writeln!(s, "{m} = {stmt}");
                } else {
                    outcome(&mut s, stmt, *ret);
                }
            }
            Event::Munmap { addr, len, ret, .. } => {
                let Some(n) = name else { continue };
                outcome(&mut s, format!("{n} munmap {addr:#x} {len:#x}"), *ret);
            }
            Event::Mprotect {
                addr,
                len,
                prot,
                ret,
                ..
            } => {
                let Some(n) = name else { continue };
                outcome(
                    &mut s,
                    format!("{n} mprotect {addr:#x} {len:#x} {}", prot_word(*prot)),
                    *ret,
                );
            }
            Event::Mremap {
                addr,
                old_len,
                new_len,
                ret,
                ..
            } => {
                let Some(n) = name else { continue };
                let m = fresh("m");
                if *ret >= 0 && *ret as u64 != *addr {
                    let _ = writeln!(
                        s,
                        "{m} = {n} mremap {addr:#x} {old_len:#x} {new_len:#x} maymove fixed {ret:#x}"
                    );
                } else if *ret >= 0 {
                    let _ = writeln!(s, "{m} = {n} mremap {addr:#x} {old_len:#x} {new_len:#x}");
                } else {
                    outcome(
                        &mut s,
                        format!("{n} mremap {addr:#x} {old_len:#x} {new_len:#x} maymove"),
                        *ret,
                    );
                }
            }
            Event::Brk { ret, .. } => {
                let Some(n) = name else { continue };
                if *ret < 0 {
                    continue;
                }
                let new = *ret as u64;
                if let Some(old) = brk.insert(n.clone(), new) {
                    let (o, w) = (
                        old.saturating_add(4095) & !4095,
                        new.saturating_add(4095) & !4095,
                    );
                    if w > o {
                        let m = fresh("heap");
                        let _ = writeln!(
                            s,
                            "{m} = {n} mmap {:#x} rw private anon fixed {o:#x}",
                            w - o
                        );
                    } else if w < o {
                        let _ = writeln!(s, "{n} munmap {w:#x} {:#x}", o - w);
                    }
                }
            }
            Event::Madvise {
                addr,
                len,
                advice,
                ret,
                ..
            } => {
                let Some(n) = name else { continue };
                match advice_word(*advice) {
                    Some(a) => outcome(&mut s, format!("{n} madvise {addr:#x} {len:#x} {a}"), *ret),
                    None => {
                        let _ = writeln!(s, "# {n} madvise {addr:#x} {len:#x} advice {advice}");
                    }
                }
            }
            Event::Mlock {
                addr,
                len,
                flags,
                ret,
                ..
            } => {
                let Some(n) = name else { continue };
                let stmt = if flags & 1 != 0 {
                    format!("{n} mlock2 {addr:#x} {len:#x} onfault")
                } else {
                    format!("{n} mlock {addr:#x} {len:#x}")
                };
                outcome(&mut s, stmt, *ret);
            }
            Event::Munlock { addr, len, ret, .. } => {
                let Some(n) = name else { continue };
                outcome(&mut s, format!("{n} munlock {addr:#x} {len:#x}"), *ret);
            }
            Event::Mlockall { flags, ret, .. } => {
                let Some(n) = name else { continue };
                let mut w = Vec::new();
                for (b, k) in [(1, "current"), (2, "future"), (4, "onfault")] {
                    if flags & b != 0 {
                        w.push(k);
                    }
                }
                outcome(&mut s, format!("{n} mlockall {}", w.join(" ")), *ret);
            }
            Event::Munlockall { ret, .. } => {
                let Some(n) = name else { continue };
                outcome(&mut s, format!("{n} munlockall"), *ret);
            }
        }
    }
    Ok(s)
}
