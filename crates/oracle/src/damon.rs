//! The host's DAMON monitors (`/sys/kernel/mm/damon/admin/kdamonds`), paused while the
//! oracle lock is held.
//!
//! A running kdamond changes the pages the oracle compares and the benchmarks time, behind
//! their backs: its physical-address monitoring clears the accessed bits of the pages it
//! samples (and sets their idle flags), and a scheme acts on what it finds cold. The guest
//! this was written on boots with one kdamond whose scheme pages out page-cache folios that
//! no process maps once they have been cold for a minute (`action pageout`, age ≥ 12
//! aggregations of 5 s, `anon` rejected, `unmapped` allowed). A long trace export then
//! lost readahead folios of a disk file that the engine still had: at the next fault,
//! fault-around on the host found fewer pages to map (1–3 pages of text at the last
//! observation of an 188 000-statement python export, and a different count on each run).
//!
//! So [`ThpKnobs::acquire`](crate::knobs::ThpKnobs::acquire) saves the `state` of every
//! kdamond that is `on` with the THP knobs — journaled before anything changes, restored on
//! drop, by the emergency handler and from the journal after a SIGKILL — and then writes
//! `off`. Writing `on` back starts the kdamond again from its sysfs parameters, which stay
//! as they were; what it had learnt about region ages starts over. A kdamond that cannot
//! be stopped is left running, with a note.
//!
//! `USERMM_DAMON_DIR` ([`DAMON_DIR_ENV`]) redirects the directory (tests use a fake tree);
//! a run on a fake THP tree (`USERMM_THP_DIR`) leaves the real DAMON alone unless it names
//! a DAMON directory too.

use std::fs;
use std::path::{Path, PathBuf};

/// The sysfs directory of the kdamonds (the default of [`damon_dir`]).
pub const DAMON_DIR: &str = "/sys/kernel/mm/damon/admin/kdamonds";
/// The environment variable that overrides [`DAMON_DIR`].
pub const DAMON_DIR_ENV: &str = "USERMM_DAMON_DIR";
/// The value a saved kdamond state is restored to (only running ones are saved).
pub const ON: &str = "on";
/// What is written to pause one.
pub const OFF: &str = "off";
/// Kdamond directories looked at, at most (sysfs numbers them from 0).
const MAX_KDAMONDS: usize = 64;

/// The kdamond directory: `$USERMM_DAMON_DIR` if set and not empty; none on a fake THP
/// tree; else [`DAMON_DIR`] if this kernel has it.
pub fn damon_dir() -> Option<PathBuf> {
    match std::env::var_os(DAMON_DIR_ENV) {
        Some(d) if !d.is_empty() => Some(PathBuf::from(d)),
        _ if std::env::var_os(crate::knobs::THP_DIR_ENV).is_some_and(|d| !d.is_empty()) => None,
        _ => Some(PathBuf::from(DAMON_DIR)).filter(|d| d.is_dir()),
    }
}

/// Whether `name` is a kdamond's directory name (a decimal index).
fn is_index(name: &str) -> bool {
    !name.is_empty() && name.len() <= 4 && name.bytes().all(|b| b.is_ascii_digit())
}

/// The `state` files of the kdamonds under `dir` that are running, in index order.
pub fn running(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(u32, PathBuf)> = rd
        .flatten()
        .take(MAX_KDAMONDS + 1)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let n = is_index(&name).then(|| name.parse().ok()).flatten()?;
            let state = e.path().join("state");
            let text = fs::read_to_string(&state).ok()?;
            (text.trim() == ON).then_some((n, state))
        })
        .collect();
    out.sort();
    out.into_iter().map(|(_, p)| p).collect()
}

/// Whether `path` = `value` is a line the journal may restore: the `state` file of a
/// kdamond under `dir`, set back to `on`. Components are compared as text, so `..` or a
/// name of another shape never matches.
pub fn is_journal_line(dir: &Path, path: &Path, value: &str) -> bool {
    value == ON
        && path
            .strip_prefix(dir)
            .ok()
            .and_then(Path::to_str)
            .and_then(|rel| rel.split_once('/'))
            .is_some_and(|(n, f)| is_index(n) && f == "state")
}

/// Whether the knob at `path` already reads `value` (a kdamond refuses `on` while it
/// runs, so restoring one that is on again is nothing to do).
pub fn already(path: &Path, value: &str) -> bool {
    fs::read_to_string(path).is_ok_and(|t| t.trim() == value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_running_kdamonds_are_listed_in_index_order() {
        let d = std::env::temp_dir().join(format!("usermm-damon-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        for (n, s) in [("10", "on\n"), ("2", "on\n"), ("1", "off\n"), ("x", "on\n")] {
            fs::create_dir_all(d.join(n)).unwrap();
            fs::write(d.join(n).join("state"), s).unwrap();
        }
        fs::write(d.join("nr_kdamonds"), "3\n").unwrap();
        assert_eq!(
            running(&d),
            vec![d.join("2/state"), d.join("10/state")],
            "off and non-index entries are not listed"
        );
        assert!(already(&d.join("2/state"), ON));
        assert!(!already(&d.join("1/state"), ON));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn journal_lines_name_a_state_file_set_on() {
        let d = Path::new("/sys/kernel/mm/damon/admin/kdamonds");
        assert!(is_journal_line(d, &d.join("0/state"), ON));
        assert!(!is_journal_line(d, &d.join("0/state"), OFF));
        assert!(!is_journal_line(d, &d.join("0/pid"), ON));
        assert!(!is_journal_line(d, &d.join("../0/state"), ON));
        assert!(!is_journal_line(d, &d.join("0/contexts/state"), ON));
        assert!(!is_journal_line(d, Path::new("/etc/passwd"), ON));
    }
}
