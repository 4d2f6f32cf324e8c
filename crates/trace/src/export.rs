//! A trace as a scenario file (`../shared/SCENARIO.md`), for the oracle and for reading.
//!
//! Processes are spawned privileged; an exec is a new `spawn` whose recorded image is mapped
//! with `fixed` and whose present pages are touched; every call uses the host's addresses
//! (`fixed` at the returned address); a failed call becomes `expect … = ERRNO`; every fault is
//! a `touch` of its page; `brk` becomes fixed anonymous mmap/munmap (as in the replay);
//! `MAP_STACK`, which the language lacks, becomes a `madvise … nohugepage` after the mmap
//! (6.18 makes such a VMA `VM_NOHUGEPAGE`); the main stack is mapped as exec left it and
//! grows before a fault below it, as in the replay (`stack` module; the mapping below it is
//! looked for in the exec image only); the recorded RSS at each exit is a comment.
//!
//! The trace's strings (command, host, kernel, policy, file paths) appear only in comments,
//! escaped ([`crate::escape`]): a newline or any control character in them can never end
//! the comment and start a statement. The text is built event by event as the trace is
//! decoded and stops at the budget's output size ([`Budget::max_output`], 64 MiB by
//! default: about 1.5 M lines): an exec image of 2²⁴ pages is 2²⁴ `touch` lines. There is
//! no cap on events beyond the decoder's ([`Budget::max_events`]): what the exporter keeps
//! besides the text is one name per live process and one id per defined file, so memory is
//! bounded by the output budget plus the trace's processes and files. A file reference to a
//! file the trace never defined is refused, as the reader refuses it.

use crate::format::{Event, Header, Trace, FORK_SHARES_VM, IMG_SHARED};
use crate::stack::Stack;
use crate::{escape, placed_at, Budget};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use usermm::{Placement, Sharing};

/// Why a trace cannot be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The text would be larger than the budget.
    #[error("event {0}: the scenario text would exceed {1} bytes (--max-output)")]
    Output(usize, u64),
    /// A mapping names a file the trace never defined.
    #[error("event {0}: file id {1} is used before a FILE event defines it")]
    UndefinedFile(usize, u32),
    /// A file id defined twice.
    #[error("event {0}: file id {1} defined twice")]
    FileTwice(usize, u32),
    /// The header's THP policy cannot be read or set.
    #[error("{0}")]
    Policy(String),
}

/// The errnos an export asserts (`expect STMT = E`); a recorded failure with any other becomes
/// a `# host: errno N` comment. Their names and numbers are the scenario language's one table
/// (`scenario::Errno::from_number`), not written again here.
const ASSERTED_ERRNOS: [scenario::Errno; 10] = {
    use scenario::Errno as E;
    [
        E::EPERM,
        E::EBADF,
        E::EAGAIN,
        E::ENOMEM,
        E::EACCES,
        E::EFAULT,
        E::EEXIST,
        E::ENODEV,
        E::EINVAL,
        E::EOVERFLOW,
    ]
};

fn errno_name(ret: i64) -> Option<&'static str> {
    // `checked_neg`: a recorded result of i64::MIN has no negation (the fuzzer's first find).
    let n = i32::try_from(ret.checked_neg()?).ok()?;
    scenario::Errno::from_number(n)
        .filter(|e| ASSERTED_ERRNOS.contains(e))
        .map(scenario::Keyword::as_str)
}

/// The scenario keyword of `MADV_*` number `a` (the engine's one table through the scenario
/// language's keywords), `None` for one the language has no word for.
fn advice_word(a: u32) -> Option<&'static str> {
    <scenario::Advice as scenario::Keyword>::ALL
        .iter()
        .find(|k| i64::from(k.number()) == i64::from(a))
        .map(|&k| scenario::Keyword::as_str(k))
}

/// The scenario text of `trace`, within the default [`Budget`].
pub fn to_scenario(trace: &Trace) -> Result<String, ExportError> {
    to_scenario_with(trace, &Budget::default())
}

/// The scenario text of `trace`, within `budget`.
pub fn to_scenario_with(trace: &Trace, budget: &Budget) -> Result<String, ExportError> {
    let mut x = Exporter::new(&trace.header, budget)?;
    for ev in &trace.events {
        x.event(ev)?;
    }
    Ok(x.finish())
}

/// Builds the scenario text one event at a time (a trace is exported as it is decoded).
#[derive(Debug)]
pub struct Exporter {
    s: String,
    max_output: u64,
    names: HashMap<u32, String>,
    brk: HashMap<String, u64>,
    /// Each process's main stack, with the end of the image mapping below it and whether
    /// that mapping is accessible.
    stacks: HashMap<String, (Stack, u64, bool)>,
    files: HashSet<u32>,
    gen: u64,
    events: usize,
}

impl Exporter {
    /// An exporter whose text starts with the header's comments and settings.
    pub fn new(h: &Header, budget: &Budget) -> Result<Exporter, ExportError> {
        let mut x = Exporter {
            s: String::new(),
            max_output: budget.max_output,
            names: HashMap::new(),
            brk: HashMap::new(),
            stacks: HashMap::new(),
            files: HashSet::new(),
            gen: 0,
            events: 0,
        };
        let command: Vec<String> = h.command.iter().map(|a| escape(a)).collect();
        x.line(format_args!("# usermm trace export: {}", command.join(" ")))?;
        x.line(format_args!(
            "# recorded on {} (Linux {}), host policy: {}",
            escape(&h.host),
            escape(&h.kernel),
            escape(&h.policy)
        ))?;
        // `never` at every size, then the recorded policy (each pair checked by the engine's
        // parser, so a header replay cannot read is refused here too, and spelt one way).
        let mut pairs = crate::replay::baseline_policy();
        for (key, policy) in crate::replay::recorded_pairs(&h.policy)
            .map_err(|e| ExportError::Policy(e.to_string()))?
        {
            match pairs.iter_mut().find(|(k, _)| *k == key) {
                Some(pair) => pair.1 = policy,
                None => pairs.push((key, policy)),
            }
        }
        let pairs: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        x.line(format_args!("set thp {}", pairs.join(" ")))?;
        x.line(format_args!("set rlimit memlock unlimited"))?;
        Ok(x)
    }

    /// The text so far.
    pub fn finish(self) -> String {
        self.s
    }

    /// Appends one line, within the output budget.
    fn line(&mut self, args: std::fmt::Arguments<'_>) -> Result<(), ExportError> {
        let at = self.s.len();
        let _ = self.s.write_fmt(args);
        self.s.push('\n');
        if self.s.len() as u64 > self.max_output {
            self.s.truncate(at);
            return Err(ExportError::Output(self.events, self.max_output));
        }
        Ok(())
    }

    fn fresh(&mut self, base: &str) -> String {
        self.gen += 1;
        format!("{base}_{}", self.gen)
    }

    /// A failed call: `expect STMT = ERRNO`, or a comment when the errno has no keyword.
    fn outcome(&mut self, stmt: String, ret: i64) -> Result<(), ExportError> {
        if ret >= 0 {
            self.line(format_args!("{stmt}"))
        } else if let Some(e) = errno_name(ret) {
            self.line(format_args!("expect {stmt} = {e}"))
        } else {
            self.line(format_args!(
                "# host: errno {} for: {stmt}",
                ret.unsigned_abs()
            ))
        }
    }

    /// Appends one event.
    pub fn event(&mut self, ev: &Event) -> Result<(), ExportError> {
        self.export(ev)?;
        self.events += 1;
        Ok(())
    }

    fn export(&mut self, ev: &Event) -> Result<(), ExportError> {
        let name = ev.pid().and_then(|p| self.names.get(&p).cloned());
        match ev {
            Event::Spawn { pid } => {
                let n = self.fresh(&format!("p{pid}"));
                self.line(format_args!("{n} = spawn privileged"))?;
                self.names.insert(*pid, n);
            }
            Event::Fork { child, flags, .. } => {
                let Some(p) = name else { return Ok(()) };
                if flags & FORK_SHARES_VM != 0 {
                    self.line(format_args!(
                        "# p{child}: vfork child of {p}, shares its memory"
                    ))?;
                    self.names.insert(*child, p);
                } else {
                    let n = self.fresh(&format!("p{child}"));
                    self.line(format_args!("{n} = {p} fork"))?;
                    if let Some(&b) = self.brk.get(&p) {
                        self.brk.insert(n.clone(), b);
                    }
                    if let Some(&s) = self.stacks.get(&p) {
                        self.stacks.insert(n.clone(), s);
                    }
                    self.names.insert(*child, n);
                }
            }
            Event::Exec { pid, image } => {
                if let Some(old) = self.names.remove(pid) {
                    if !self.names.values().any(|v| *v == old) {
                        self.line(format_args!("{old} exit"))?;
                    }
                }
                let n = self.fresh(&format!("p{pid}"));
                self.line(format_args!("# exec of trace pid {pid}"))?;
                self.line(format_args!("{n} = spawn privileged"))?;
                let mut prev = (0u64, false);
                for v in &image.vmas {
                    if let Some(stack) = Stack::of(v) {
                        self.stacks.insert(n.clone(), (stack, prev.0, prev.1));
                    }
                    let share = if v.flags & IMG_SHARED != 0 {
                        "shared"
                    } else {
                        "private"
                    };
                    let backing = match v.file {
                        Some(f) if !self.files.contains(&f) => {
                            return Err(ExportError::UndefinedFile(self.events, f))
                        }
                        Some(f) => format!("file f{f} offset {:#x}", v.offset),
                        None => "anon".into(),
                    };
                    let m = self.fresh("m");
                    self.line(format_args!(
                        "{m} = {n} mmap {:#x} {} {share} {backing} fixed {:#x}",
                        v.end.saturating_sub(v.start),
                        scenario::Prot::from_bits(v.prot as u32),
                        v.start
                    ))?;
                    prev = (v.end, v.prot & 7 != 0);
                }
                for &(a, w) in &image.pages {
                    let acc = if w { "write" } else { "read" };
                    self.line(format_args!("{n} touch {a:#x} 4K {acc}"))?;
                }
                self.names.insert(*pid, n);
            }
            Event::Exit { pid } => {
                let Some(n) = self.names.remove(pid) else {
                    return Ok(());
                };
                if self.names.values().any(|v| *v == n) {
                    return Ok(()); // a vfork child leaving its parent's memory
                }
                self.stacks.remove(&n);
                self.line(format_args!("{n} exit"))?;
            }
            Event::File { id, size, path, .. } => {
                if !self.files.insert(*id) {
                    return Err(ExportError::FileTwice(self.events, *id));
                }
                self.line(format_args!("# {}", escape(path)))?;
                self.line(format_args!(
                    "f{id} = file {:#x} disk",
                    (size.saturating_add(4095) & !4095).max(4096)
                ))?;
            }
            Event::Cache { file, folios } => {
                // The language cannot place folios in the host's page cache: the scenario
                // starts cold on both sides of the oracle (replay seeds them).
                let pages: u64 = folios.iter().map(|f| 1u64 << f.order).sum();
                let marked = folios.iter().filter(|f| f.readahead).count();
                self.line(format_args!(
                    "# host page cache of f{file} when first mapped: {} folios, {pages} pages, {marked} marked for readahead (not exported)",
                    folios.len()
                ))?;
            }
            Event::Validate {
                rss_anon_kb,
                rss_file_kb,
                ..
            } => {
                self.line(format_args!(
                    "# host at exit of {}: RssAnon {rss_anon_kb} kB, RssFile {rss_file_kb} kB",
                    name.unwrap_or_default()
                ))?;
            }
            Event::Lost { count } => {
                self.line(format_args!("# {count} records lost while recording"))?;
            }
            Event::Signal { signo, addr, .. } => {
                // The touch before it faults on both sides; the oracle compares the signal.
                let sig = if i32::from(*signo) == libc::SIGBUS {
                    "SIGBUS"
                } else {
                    "SIGSEGV"
                };
                self.line(format_args!(
                    "# host: {sig} at {addr:#x} in {}",
                    name.unwrap_or_default()
                ))?;
            }
            Event::Fault { addr, write, .. } => {
                let Some(n) = name else { return Ok(()) };
                if let Some((stack, prev_end, accessible)) = self.stacks.get_mut(&n) {
                    if let Some((from, len)) = stack.growth(*addr, *prev_end, *accessible) {
                        stack.grown(from);
                        let prot = scenario::Prot::from_bits(stack.prot as u32);
                        let m = self.fresh("m");
                        self.line(format_args!("# the stack of {n} grows"))?;
                        self.line(format_args!(
                            "{m} = {n} mmap {len:#x} {prot} private anon fixed {from:#x}"
                        ))?;
                    }
                }
                let acc = if *write { "write" } else { "read" };
                self.line(format_args!("{n} touch {addr:#x} 4K {acc}"))?;
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
                let Some(n) = name else { return Ok(()) };
                let mf = usermm::MapFlags(*flags);
                let share = match mf.sharing() {
                    Sharing::Private => "private",
                    Sharing::Shared => "shared",
                };
                let backing = match (mf.anonymous(), file) {
                    (false, Some(f)) if !self.files.contains(f) => {
                        return Err(ExportError::UndefinedFile(self.events, *f))
                    }
                    (false, Some(f)) => format!("file f{f} offset {offset:#x}"),
                    _ => "anon".into(),
                };
                let place = match placed_at(mf, *addr, *ret) {
                    Placement::Fixed(a) => format!(" fixed {a:#x}"),
                    Placement::FixedNoReplace(a) => format!(" noreplace {a:#x}"),
                    Placement::Hint(a) => format!(" hint {a:#x}"),
                    Placement::Any => String::new(),
                };
                let mut extra = String::new();
                for (set, w) in [
                    (mf.populate(), " populate"),
                    (mf.locked(), " locked"),
                    (mf.noreserve(), " norserve"),
                ] {
                    if set {
                        extra.push_str(w);
                    }
                }
                let m = self.fresh("m");
                let stmt = format!(
                    "{n} mmap {len:#x} {} {share} {backing}{place}{extra}",
                    scenario::Prot::from_bits(*prot)
                );
                if *ret >= 0 {
                    self.line(format_args!("{m} = {stmt}"))?;
                    if mf.stack() {
                        // The language has no MAP_STACK; 6.18 makes such a VMA
                        // VM_NOHUGEPAGE, and so does this advice.
                        self.line(format_args!("{n} madvise {m} {len:#x} nohugepage"))?;
                    }
                } else {
                    self.outcome(stmt, *ret)?;
                }
            }
            Event::Munmap { addr, len, ret, .. } => {
                let Some(n) = name else { return Ok(()) };
                self.outcome(format!("{n} munmap {addr:#x} {len:#x}"), *ret)?;
            }
            Event::Mprotect {
                addr,
                len,
                prot,
                ret,
                ..
            } => {
                let Some(n) = name else { return Ok(()) };
                self.outcome(
                    format!(
                        "{n} mprotect {addr:#x} {len:#x} {}",
                        scenario::Prot::from_bits(*prot)
                    ),
                    *ret,
                )?;
            }
            Event::Mremap {
                addr,
                old_len,
                new_len,
                ret,
                ..
            } => {
                let Some(n) = name else { return Ok(()) };
                let m = self.fresh("m");
                if *ret >= 0 && *ret as u64 != *addr {
                    self.line(format_args!(
                        "{m} = {n} mremap {addr:#x} {old_len:#x} {new_len:#x} maymove fixed {ret:#x}"
                    ))?;
                } else if *ret >= 0 {
                    self.line(format_args!(
                        "{m} = {n} mremap {addr:#x} {old_len:#x} {new_len:#x}"
                    ))?;
                } else {
                    self.outcome(
                        format!("{n} mremap {addr:#x} {old_len:#x} {new_len:#x} maymove"),
                        *ret,
                    )?;
                }
            }
            Event::Brk { ret, .. } => {
                let Some(n) = name else { return Ok(()) };
                if *ret < 0 {
                    return Ok(());
                }
                let new = *ret as u64;
                if let Some(old) = self.brk.insert(n.clone(), new) {
                    let (o, w) = (
                        old.saturating_add(4095) & !4095,
                        new.saturating_add(4095) & !4095,
                    );
                    if w > o {
                        let m = self.fresh("heap");
                        self.line(format_args!(
                            "{m} = {n} mmap {:#x} rw private anon fixed {o:#x}",
                            w - o
                        ))?;
                    } else if w < o {
                        self.line(format_args!("{n} munmap {w:#x} {:#x}", o - w))?;
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
                let Some(n) = name else { return Ok(()) };
                match advice_word(*advice) {
                    Some(a) => self.outcome(format!("{n} madvise {addr:#x} {len:#x} {a}"), *ret)?,
                    None => {
                        self.line(format_args!(
                            "# {n} madvise {addr:#x} {len:#x} advice {advice}"
                        ))?;
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
                let Some(n) = name else { return Ok(()) };
                let stmt = if flags & usermm::MLOCK_ONFAULT != 0 {
                    format!("{n} mlock2 {addr:#x} {len:#x} onfault")
                } else {
                    format!("{n} mlock {addr:#x} {len:#x}")
                };
                self.outcome(stmt, *ret)?;
            }
            Event::Munlock { addr, len, ret, .. } => {
                let Some(n) = name else { return Ok(()) };
                self.outcome(format!("{n} munlock {addr:#x} {len:#x}"), *ret)?;
            }
            Event::Mlockall { flags, ret, .. } => {
                let Some(n) = name else { return Ok(()) };
                let f = usermm::MlockallFlags::from_bits(*flags);
                let mut w = Vec::new();
                for (set, k) in [
                    (f.current, "current"),
                    (f.future, "future"),
                    (f.onfault, "onfault"),
                ] {
                    if set {
                        w.push(k);
                    }
                }
                self.outcome(format!("{n} mlockall {}", w.join(" ")), *ret)?;
            }
            Event::Munlockall { ret, .. } => {
                let Some(n) = name else { return Ok(()) };
                self.outcome(format!("{n} munlockall"), *ret)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::errno_name;

    #[test]
    fn asserted_errnos_by_number() {
        for (ret, name) in [
            (-1, "EPERM"),
            (-9, "EBADF"),
            (-11, "EAGAIN"),
            (-12, "ENOMEM"),
            (-13, "EACCES"),
            (-14, "EFAULT"),
            (-17, "EEXIST"),
            (-19, "ENODEV"),
            (-22, "EINVAL"),
            (-75, "EOVERFLOW"),
        ] {
            assert_eq!(errno_name(ret), Some(name), "{ret}");
        }
        // Others stay comments: not asserted (ENOENT, ENOSYS), unknown, or not an error.
        for ret in [-2, -38, -4096, 0, 22, i64::MIN, -(1i64 << 40)] {
            assert_eq!(errno_name(ret), None, "{ret}");
        }
    }
}
