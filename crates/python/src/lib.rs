//! Python bindings of the engine: `import usermm`.
//!
//! A [`Machine`] is one simulated machine. Its methods are the engine's system calls and
//! memory accesses on CPU slot 0, with sizes as numbers of bytes or strings (`"2M"`), and
//! its views return plain dicts:
//!
//! ```python
//! import usermm
//! m = usermm.Machine(memory="256M", tunables={"fork_pte_batch": "batched"})
//! p = m.spawn()
//! a = m.mmap(p, "8M", prot="rw")          # private anonymous
//! m.touch(p, a, "8M", write=True)         # fault it in
//! c = m.fork(p)
//! m.touch(c, a, "4K", write=True)         # one copy-on-write copy
//! assert m.counters()["cow_copies"] == 1
//! assert m.status(p)["RssAnon"] == 8 << 20
//! ```
//!
//! Errors are Python exceptions: `OSError` with Linux's errno for a failed system call,
//! `RuntimeError` for a fatal signal (`SIGSEGV at 0x…`) or a broken invariant (`validate`),
//! `ValueError` for a bad size, protection or tunable. Build: `cargo build --release -p
//! usermm-python`, then copy `target/release/libusermm_python.so` to `usermm.so` on Python's
//! path (no maturin needed; the module uses the stable ABI, Python ≥ 3.8).

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::HashMap;
use usermm::{Access, Errno, MachineConfig, MmapArgs, Privilege, Prot, Sharing};

/// A size: an int (bytes) or a string such as `"4K"`, `"2M"`, `"1G"`.
#[derive(FromPyObject)]
enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    fn bytes(&self) -> PyResult<u64> {
        match self {
            Size::Bytes(b) => Ok(*b),
            Size::Text(s) => parse_size(s),
        }
    }
}

fn parse_size(s: &str) -> PyResult<u64> {
    let bad = || PyValueError::new_err(format!("bad size {s:?} (e.g. 4096, \"64K\", \"2M\")"));
    let t = s.trim();
    let (num, shift) = match t.as_bytes().last() {
        Some(b'K' | b'k') => (&t[..t.len() - 1], 10),
        Some(b'M' | b'm') => (&t[..t.len() - 1], 20),
        Some(b'G' | b'g') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: u64 = if let Some(h) = num.strip_prefix("0x") {
        u64::from_str_radix(h, 16).map_err(|_| bad())?
    } else {
        num.parse().map_err(|_| bad())?
    };
    n.checked_mul(1 << shift).ok_or_else(bad)
}

fn prot(s: &str) -> PyResult<Prot> {
    if s.chars().any(|c| !"rwx-".contains(c)) {
        return Err(PyValueError::new_err(format!(
            "bad protection {s:?} (letters r, w, x, e.g. \"rw\")"
        )));
    }
    Ok(Prot {
        read: s.contains('r'),
        write: s.contains('w'),
        exec: s.contains('x'),
    })
}

fn errno(e: Errno) -> PyErr {
    PyOSError::new_err((e as i32, format!("{e:?}")))
}

fn engine_err(e: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// One simulated machine (`usermm.Machine(memory="1G", cpus=2, tunables={...})`).
#[pyclass(unsendable, module = "usermm")]
pub struct Machine {
    m: usermm::Machine,
}

#[pymethods]
impl Machine {
    /// A machine with `memory` of RAM, `cpus` CPU slots and tunables set by name (the names
    /// and values `usermm tunables` lists).
    #[new]
    #[pyo3(signature = (memory = Size::Text("1G".into()), cpus = 2, tunables = None))]
    fn new(memory: Size, cpus: usize, tunables: Option<HashMap<String, String>>) -> PyResult<Self> {
        let mut cfg = MachineConfig {
            memory: memory.bytes()?,
            cpus: cpus.max(1),
            ..MachineConfig::default()
        };
        for (k, v) in tunables.unwrap_or_default() {
            cfg.tunables
                .set(&k, &v)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        }
        let m = usermm::Machine::new(cfg);
        if m.phys.nr_frames() == 0 {
            return Err(PyValueError::new_err("cannot back that much simulated RAM"));
        }
        Ok(Machine { m })
    }

    /// Sets a tunable by name while the machine runs.
    fn set_tunable(&self, name: &str, value: &str) -> PyResult<()> {
        let mut res = Ok(());
        self.m.update_tunables(|t| res = t.set(name, value));
        res.map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// A new process (an empty address space); returns its pid.
    #[pyo3(signature = (privileged = false))]
    fn spawn(&self, privileged: bool) -> PyResult<u32> {
        let who = if privileged {
            Privilege::Privileged
        } else {
            Privilege::Ordinary
        };
        self.cpu()?.spawn(who, 8 << 20).map_err(errno)
    }

    /// `mmap` of anonymous memory (`shared=True`: MAP_SHARED); returns the address.
    #[pyo3(signature = (pid, length, prot = "rw", shared = false, populate = false))]
    fn mmap(
        &self,
        pid: u32,
        length: Size,
        prot: &str,
        shared: bool,
        populate: bool,
    ) -> PyResult<u64> {
        let args = MmapArgs {
            sharing: if shared {
                Sharing::Shared
            } else {
                Sharing::Private
            },
            populate,
            ..MmapArgs::anon(length.bytes()?, self::prot(prot)?)
        };
        self.cpu()?.mmap(pid, args).map_err(errno)
    }

    /// `munmap`.
    fn munmap(&self, pid: u32, addr: u64, length: Size) -> PyResult<()> {
        self.cpu()?
            .munmap(pid, addr, length.bytes()?)
            .map_err(errno)
    }

    /// `mprotect`.
    fn mprotect(&self, pid: u32, addr: u64, length: Size, prot: &str) -> PyResult<()> {
        let p = self::prot(prot)?;
        self.cpu()?
            .mprotect(pid, addr, length.bytes()?, p)
            .map_err(errno)
    }

    /// `fork`; returns the child's pid.
    fn fork(&self, pid: u32) -> PyResult<u32> {
        self.cpu()?.fork(pid).map_err(errno)
    }

    /// The process exits (its memory is torn down).
    fn exit(&self, pid: u32) -> PyResult<()> {
        self.cpu()?.exit(pid).map_err(errno)
    }

    /// One access per page of `[addr, addr + length)`, faulting as needed.
    #[pyo3(signature = (pid, addr, length, write = false))]
    fn touch(&self, pid: u32, addr: u64, length: Size, write: bool) -> PyResult<()> {
        let access = if write { Access::Write } else { Access::Read };
        self.cpu()?
            .touch(pid, addr, length.bytes()?, access)
            .map_err(engine_err)
    }

    /// The machine's event counters (name → count, the non-zero ones).
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.m.counters().nonzero() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// `/proc/PID/status` memory lines in bytes (`VmRSS`, `RssAnon`, …, `map_count`).
    fn status<'py>(&self, py: Python<'py>, pid: u32) -> PyResult<Bound<'py, PyDict>> {
        let s = self.cpu()?.status(pid).map_err(errno)?;
        let d = PyDict::new(py);
        for (k, v) in [
            ("VmSize", s.vm_size),
            ("VmRSS", s.vm_rss),
            ("RssAnon", s.rss_anon),
            ("RssShmem", s.rss_shmem),
            ("RssFile", s.rss_file),
            ("VmLck", s.vm_lck),
            ("VmPin", s.vm_pin),
            ("VmData", s.vm_data),
            ("map_count", s.map_count),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Checks every invariant of the engine's state; raises with the violations.
    fn validate(&self) -> PyResult<()> {
        self.m
            .validate()
            .map_err(|v| PyRuntimeError::new_err(v.join("\n")))
    }
}

impl Machine {
    /// CPU slot 0 for the calling thread, for the duration of one call.
    fn cpu(&self) -> PyResult<usermm::Cpu<'_>> {
        self.m.enter_cpu(0).map_err(engine_err)
    }
}

/// The `usermm` Python module.
#[pymodule]
#[pyo3(name = "usermm")]
fn usermm_python(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Machine>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
