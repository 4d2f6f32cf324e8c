//! The host's THP policy knobs under `/sys/kernel/mm/transparent_hugepage`.
//!
//! [`ThpKnobs`] saves every knob the oracle may write, sets Linux's defaults before each
//! file, applies `set thp`, and restores the saved values when dropped (at the end, on an
//! error, and after SIGINT/SIGTERM, which the controller turns into an orderly return). It
//! also holds an exclusive lock so that two oracle runs never fight over the global knobs.
//!
//! Besides the anonymous THP policies it pins the shmem policies (shared anonymous memory
//! follows those) to their defaults and slows khugepaged down for the run, so a background
//! collapse cannot change a page between two observations.

use crate::HostError;
use scenario::{ThpPolicy, ThpSetting, ThpTop};
use std::fs::{self, File};
use std::path::{Path, PathBuf};

/// The sysfs directory of the THP knobs.
pub const THP_DIR: &str = "/sys/kernel/mm/transparent_hugepage";
/// PMD size in kB.
const PMD_KB: u64 = 2048;
/// khugepaged's sleep between scans during a run (ms).
const KHUGEPAGED_SLEEP_MS: &str = "3600000";
const LOCK_FILE: &str = "/run/lock/usermm-oracle.lock";

/// Saved THP knobs and the oracle's lock; restores the knobs when dropped.
#[derive(Debug)]
pub struct ThpKnobs {
    dir: PathBuf,
    saved: Vec<(PathBuf, String)>,
    _lock: File,
}

/// The current value of a knob: the bracketed choice, or the whole text.
pub fn current(text: &str) -> String {
    match (text.find('['), text.find(']')) {
        (Some(a), Some(b)) if a < b => text[a + 1..b].to_string(),
        _ => text.trim().to_string(),
    }
}

fn size_dirs(dir: &Path) -> Result<Vec<(u64, PathBuf)>, HostError> {
    let mut out = Vec::new();
    let rd = fs::read_dir(dir).map_err(|e| HostError::Knob(dir.display().to_string(), e))?;
    for ent in rd.flatten() {
        let name = ent.file_name().to_string_lossy().to_string();
        if let Some(kb) = name
            .strip_prefix("hugepages-")
            .and_then(|r| r.strip_suffix("kB"))
            .and_then(|n| n.parse::<u64>().ok())
        {
            out.push((kb, ent.path()));
        }
    }
    out.sort();
    Ok(out)
}

impl ThpKnobs {
    /// Takes the oracle lock (waiting for another run to finish) and saves every knob.
    pub fn acquire() -> Result<ThpKnobs, HostError> {
        let dir = PathBuf::from(THP_DIR);
        let lock = File::create(LOCK_FILE)
            .or_else(|_| File::create(std::env::temp_dir().join("usermm-oracle.lock")))
            .map_err(|e| HostError::Knob(LOCK_FILE.into(), e))?;
        lock.lock()
            .map_err(|e| HostError::Knob(LOCK_FILE.into(), e))?;
        let mut saved = Vec::new();
        for p in Self::paths(&dir)? {
            let text =
                fs::read_to_string(&p).map_err(|e| HostError::Knob(p.display().to_string(), e))?;
            saved.push((p, current(&text)));
        }
        crate::sys::arm_emergency_restore(
            saved
                .iter()
                .filter_map(|(p, v)| {
                    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).ok()?;
                    Some((c, v.clone().into_bytes()))
                })
                .collect(),
        );
        Ok(ThpKnobs {
            dir,
            saved,
            _lock: lock,
        })
    }

    fn paths(dir: &Path) -> Result<Vec<PathBuf>, HostError> {
        let mut v = vec![
            dir.join("enabled"),
            dir.join("use_zero_page"),
            dir.join("shmem_enabled"),
            dir.join("khugepaged/scan_sleep_millisecs"),
        ];
        for (_, d) in size_dirs(dir)? {
            for f in ["enabled", "shmem_enabled"] {
                if d.join(f).exists() {
                    v.push(d.join(f));
                }
            }
        }
        Ok(v)
    }

    fn write(&self, rel: &Path, value: &str) -> Result<(), HostError> {
        let p = self.dir.join(rel);
        fs::write(&p, value).map_err(|e| HostError::Knob(p.display().to_string(), e))
    }

    /// Linux's defaults: top `madvise`, 2M `inherit`, other sizes `never`, the zero page
    /// used; shmem THP off except 2M `inherit`; khugepaged asleep.
    pub fn set_defaults(&self) -> Result<(), HostError> {
        self.write(Path::new("enabled"), "madvise")?;
        self.write(Path::new("use_zero_page"), "1")?;
        self.write(Path::new("shmem_enabled"), "never")?;
        self.write(
            Path::new("khugepaged/scan_sleep_millisecs"),
            KHUGEPAGED_SLEEP_MS,
        )?;
        for (kb, d) in size_dirs(&self.dir)? {
            let v = if kb == PMD_KB { "inherit" } else { "never" };
            for f in ["enabled", "shmem_enabled"] {
                if d.join(f).exists() {
                    self.write(&d.join(f), v)?;
                }
            }
        }
        Ok(())
    }

    /// Applies `set thp` settings.
    pub fn apply(&self, settings: &[ThpSetting]) -> Result<(), HostError> {
        for s in settings {
            match s {
                ThpSetting::Top(t) => self.write(Path::new("enabled"), top_word(*t))?,
                ThpSetting::Size { size, policy } => {
                    let rel = format!("hugepages-{}kB/enabled", size.bytes() / 1024);
                    self.write(Path::new(&rel), policy_word(*policy))?
                }
            }
        }
        Ok(())
    }

    /// `use_zero_page` (the engine's tunable `thp_use_zero_page`).
    pub fn set_use_zero_page(&self, on: bool) -> Result<(), HostError> {
        self.write(Path::new("use_zero_page"), if on { "1" } else { "0" })
    }

    /// Writes the saved values back; returns the knobs that could not be restored.
    pub fn restore(&self) -> Vec<String> {
        let mut failed = Vec::new();
        for (p, v) in &self.saved {
            if let Err(e) = fs::write(p, v) {
                failed.push(format!("{}: {e}", p.display()));
            }
        }
        failed
    }

    /// The saved values (path, value).
    pub fn saved(&self) -> &[(PathBuf, String)] {
        &self.saved
    }
}

impl Drop for ThpKnobs {
    fn drop(&mut self) {
        for f in self.restore() {
            eprintln!("usermm oracle: could not restore THP knob {f}");
        }
    }
}

fn top_word(t: ThpTop) -> &'static str {
    match t {
        ThpTop::Always => "always",
        ThpTop::Madvise => "madvise",
        ThpTop::Never => "never",
    }
}

fn policy_word(p: ThpPolicy) -> &'static str {
    match p {
        ThpPolicy::Always => "always",
        ThpPolicy::Madvise => "madvise",
        ThpPolicy::Never => "never",
        ThpPolicy::Inherit => "inherit",
    }
}

/// Reads every knob's current value (for tests and reports).
pub fn snapshot() -> Result<Vec<(PathBuf, String)>, HostError> {
    let dir = PathBuf::from(THP_DIR);
    let mut out = Vec::new();
    for p in ThpKnobs::paths(&dir)? {
        let text =
            fs::read_to_string(&p).map_err(|e| HostError::Knob(p.display().to_string(), e))?;
        out.push((p, current(&text)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_bracketed_choice() {
        assert_eq!(super::current("always [madvise] never\n"), "madvise");
        assert_eq!(super::current("1\n"), "1");
    }
}
