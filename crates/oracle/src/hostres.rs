//! The host resources a run adds for one scenario file — a swap file ([`crate::swapfile`])
//! and a memory cgroup ([`crate::cgroup`]) — and their journal.
//!
//! Like the THP knobs ([`crate::knobs`]), they change the whole machine and must not
//! outlive the run. Before the swap file is turned on, and before the cgroup is made, the
//! run writes `resources.journal` in the lock directory (atomically, under the machine-wide
//! lock): its pid, the boot id, and one line per resource (`swapfile PATH`, `cgroup PATH`).
//! The journal is rewritten when one goes and deleted when none is left. A journal still
//! there when the lock is next taken is what a killed run left: [`replay`] turns the swap
//! off, deletes the file, kills the processes left in the cgroup and removes it — after
//! checking that each path is one the oracle makes (anything else is reported, not touched).
//! After a reboot only the swap file is left (the cgroup and the swap area went with the
//! boot) and is deleted.

use crate::cgroup::{self, MemCgroup};
use crate::knobs::{self, ThpKnobs};
use crate::swapfile::{self, SwapFile};
use crate::sys;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The journal's first line (its format and version).
pub const MAGIC: &str = "usermm-oracle-resources 1";

/// The resources a run holds now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entries {
    /// The swap file, from just before `swapon` until it is deleted.
    pub swapfile: Option<PathBuf>,
    /// The memory cgroup, from just before it is made until it is removed.
    pub cgroup: Option<PathBuf>,
}

impl Entries {
    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.swapfile.is_none() && self.cgroup.is_none()
    }

    /// The journal's text for this process.
    pub fn journal_text(&self) -> String {
        let mut t = format!("{MAGIC}\npid {}\n", sys::getpid());
        let boot = boot_id();
        if !boot.is_empty() {
            let _ = writeln!(t, "boot {boot}");
        }
        for (word, p) in [("swapfile", &self.swapfile), ("cgroup", &self.cgroup)] {
            if let Some(p) = p {
                let _ = writeln!(t, "{word} {}", p.display());
            }
        }
        t
    }
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// What [`replay`] did with a killed run's journal.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cleanup {
    /// The pid of the run that wrote it.
    pub pid: i32,
    /// What was removed, one line each.
    pub done: Vec<String>,
    /// What could not be removed (the journal is kept), one line each.
    pub left: Vec<String>,
    /// Lines not acted on, each with why.
    pub ignored: Vec<String>,
}

impl Cleanup {
    /// Prints what was done to stderr.
    pub fn print(&self) {
        for d in &self.done {
            eprintln!("usermm: removed {d} left by killed run pid {}", self.pid);
        }
        for l in &self.left {
            eprintln!("usermm: could not remove {l}");
        }
        for i in &self.ignored {
            eprintln!(
                "usermm: {}: ignored {i}",
                knobs::resource_journal_path().display()
            );
        }
    }
}

/// Removes what the journal `text` names; an error if it is not a journal of ours.
pub fn replay(text: &str) -> Result<Cleanup, String> {
    let (pid, lines) = knobs::journal_header(text, MAGIC)?;
    let mut c = Cleanup {
        pid,
        ..Cleanup::default()
    };
    let rest: Vec<&str> = lines.collect();
    let now = boot_id();
    let earlier_boot = rest
        .iter()
        .find_map(|l| l.strip_prefix("boot "))
        .is_some_and(|b| !now.is_empty() && b != now);
    // The cgroup first: its processes hold the swapped pages swapoff would bring back.
    let mut ordered: Vec<(usize, &str)> = rest.iter().copied().enumerate().collect();
    ordered.sort_by_key(|(_, l)| !l.starts_with("cgroup "));
    for (i, line) in ordered {
        let at = |why: String| format!("line {}: {why}", i + 3);
        if let Some(p) = line.strip_prefix("swapfile ") {
            match swapfile::journaled_dir(Path::new(p)) {
                Err(why) => c.ignored.push(at(why)),
                Ok(dir) => match swapfile::remove_left(&dir) {
                    Ok(true) => c.done.push(format!("swap file {p}")),
                    Ok(false) => {}
                    Err(m) => c.left.push(format!("swap file {p}: {m}")),
                },
            }
        } else if let Some(p) = line.strip_prefix("cgroup ") {
            if earlier_boot {
                continue;
            }
            if let Err(why) = cgroup::journaled(Path::new(p)) {
                c.ignored.push(at(why));
                continue;
            }
            match cgroup::remove_left(Path::new(p)) {
                Ok(true) => c.done.push(format!("memory cgroup {p}")),
                Ok(false) => {}
                Err(m) => c.left.push(format!("memory cgroup {p}: {m}")),
            }
        } else if !line.is_empty() && !line.starts_with("boot ") {
            c.ignored
                .push(at(format!("{line:?} is not a resource line")));
        }
    }
    Ok(c)
}

/// A scenario file's machine on the host: `set memory`, `set swap`, and the swap file and
/// memory cgroup that apply them ([`crate::host::HostBackend`] holds one).
#[derive(Debug, Default)]
pub struct Machine {
    memory: Option<u64>,
    /// `reclaim` statements follow: a cgroup even without `set memory`.
    confine: bool,
    swap: Option<SwapFile>,
    cgroup: Option<MemCgroup>,
}

impl Machine {
    /// `set memory SIZE`.
    pub fn set_memory(&mut self, bytes: u64) {
        self.memory = Some(bytes);
    }

    /// Makes a cgroup (of the controller's limit) even without `set memory`: the file has
    /// `reclaim` statements.
    pub fn set_confine(&mut self, on: bool) {
        self.confine = on;
    }

    fn entries(&self) -> Entries {
        Entries {
            swapfile: self.swap.as_ref().map(|s| s.path().to_path_buf()),
            cgroup: self.cgroup.as_ref().map(|c| c.path().to_path_buf()),
        }
    }

    /// `set swap SIZE` (0: none): a swap file made, journaled, then turned on. A second
    /// `set swap` replaces the first.
    pub fn set_swap(&mut self, knobs: &ThpKnobs, size: u64) -> Result<(), String> {
        self.drop_swap(knobs)?;
        if size == 0 {
            return Ok(());
        }
        let mut swap = SwapFile::create(size)?;
        let mut e = self.entries();
        e.swapfile = Some(swap.path().to_path_buf());
        knobs.journal_resources(&e).map_err(|e| e.to_string())?;
        let on = swap.activate();
        self.swap = Some(swap);
        on
    }

    fn drop_swap(&mut self, knobs: &ThpKnobs) -> Result<(), String> {
        if let Some(s) = self.swap.take() {
            s.remove()?;
            knobs
                .journal_resources(&self.entries())
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The swap file's size (0: none).
    pub fn swap_size(&self) -> u64 {
        self.swap.as_ref().map_or(0, SwapFile::size)
    }

    /// The cgroup, once made.
    pub fn cgroup(&self) -> Option<&MemCgroup> {
        self.cgroup.as_ref()
    }

    /// Before a server is spawned or forked, with `servers` live after it: makes the cgroup
    /// on the first call if the file needs one, and raises its limit. The descriptor a
    /// spawned server joins it through, if there is a cgroup.
    pub fn before_new_server(
        &mut self,
        knobs: &ThpKnobs,
        servers: u64,
    ) -> Result<Option<i32>, String> {
        let wanted = self.memory.is_some() || self.swap.is_some() || self.confine;
        if self.cgroup.is_none() && wanted {
            let place = cgroup::locate()?;
            let mut e = self.entries();
            let cg = MemCgroup::create(&place, self.memory, self.swap_size(), |p| {
                e.cgroup = Some(p.to_path_buf());
                knobs.journal_resources(&e).map_err(|e| e.to_string())
            })?;
            self.cgroup = Some(cg);
        }
        match &mut self.cgroup {
            Some(cg) => {
                cg.set_processes(servers)?;
                Ok(Some(cg.procs_fd()))
            }
            None => Ok(None),
        }
    }

    /// After a server ended, with `servers` left: lowers the limit again.
    pub fn after_exit(&mut self, servers: u64) -> Result<(), String> {
        match &mut self.cgroup {
            Some(cg) => cg.set_processes(servers),
            None => Ok(()),
        }
    }

    /// `reclaim LEN` with `servers` live.
    pub fn reclaim(&mut self, len: u64, servers: u64) -> Result<(), String> {
        match &mut self.cgroup {
            Some(cg) => cg.reclaim(len, servers),
            None => Err(
                "reclaim: the host has no memory cgroup for this file (no set memory,                  set swap or reclaim before the first spawn)"
                    .into(),
            ),
        }
    }

    /// Removes the cgroup (after the servers were killed) and then the swap file, keeping
    /// the journal for what could not be removed.
    pub fn teardown(&mut self, knobs: &ThpKnobs) {
        if let Some(cg) = self.cgroup.take() {
            let path = cg.path().to_path_buf();
            drop(cg);
            if path.exists() {
                eprintln!(
                    "usermm oracle: keeping {} in the journal to remove later",
                    path.display()
                );
                return;
            }
        }
        if let Err(m) = self.drop_swap(knobs) {
            eprintln!("usermm oracle: {m}; the journal keeps it for the next run");
            return;
        }
        if let Err(e) = knobs.journal_resources(&self.entries()) {
            eprintln!("usermm oracle: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_round_trip_and_checks() {
        let e = Entries {
            swapfile: Some("/var/tmp/usermm-oracle-1-0123456789abcdef/swap".into()),
            cgroup: None,
        };
        let t = e.journal_text();
        assert!(t.starts_with(MAGIC));
        assert!(t.contains("\nswapfile /var/tmp/usermm-oracle-1-0123456789abcdef/swap\n"));
        assert!(replay("nonsense\n").is_err());
        assert!(replay(&format!("{MAGIC}\npid x\n")).is_err());
        // Paths the oracle does not make are reported and left alone.
        let c = replay(&format!(
            "{MAGIC}\npid 7\nswapfile /etc/passwd\ncgroup /etc\nwhat\n"
        ))
        .unwrap_or_default();
        assert_eq!(c.pid, 7);
        assert_eq!(c.ignored.len(), 3, "{c:?}");
        assert!(c.left.is_empty(), "{c:?}");
        assert!(c.done.is_empty());
    }
}
