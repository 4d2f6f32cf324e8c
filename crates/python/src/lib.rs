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
//! A [`Session`] runs the scenario language (`docs/scenario-language.md`) on one engine
//! machine, a few statements at a time, and reads the names it bound: every statement and
//! observable of the language is there (THP and shmem policy, madvise, mremap, mlock, files,
//! smaps, pagemap, kpageflags, `dump`, `expect counters`):
//!
//! ```python
//! s = usermm.Session()
//! s.run("set thp 64K=always\np0 = spawn\na = p0 mmap 1M rw private anon")
//! s.run("p0 write a 1M pattern=0x5a\np1 = p0 fork\np1 write a 4K pattern=0x1")
//! assert s.smaps("p0", "a")["Pss"] == 1024 * 1024 - 32 * 1024
//! print(s.dump("p1", "a", "64K"))
//! assert usermm.run_scenario(open("f.scn").read())["exit_code"] == 0
//! ```
//!
//! Every call that does mm work records what it cost: `m.last_counters()` (and
//! `s.last_counters()`) are the non-zero counter deltas of the most recent such call (a
//! system call, an access, a `run` chunk; views such as `counters`, `status` or `smaps` leave
//! them alone), also set when the call raised; `Session.run` returns them as `"counters"` too:
//!
//! ```python
//! m.fork(p)
//! assert m.last_counters()["fork_batches"] == 2048
//! ```
//!
//! Errors are Python exceptions: `OSError` with Linux's errno for a failed system call,
//! `RuntimeError` for a fatal signal (`SIGSEGV at 0x…`) or a broken invariant (`validate`),
//! `ValueError` for a bad size, protection or tunable. Install: `pip install crates/python`
//! (maturin builds the module; `pyproject.toml`), or `cargo build --release -p
//! usermm-python` and copy `target/release/libusermm_python.so` to `usermm.so` on Python's
//! path. The module uses the stable ABI: one build serves every CPython ≥ 3.8.

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use scenario::engine::EngineBackend;
use scenario::run::{Abort, RunOptions, Runner};
use std::cell::RefCell;
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
            Size::Text(s) => size_text(s),
        }
    }
}

/// A size in the workspace's one grammar (`usermm::units`), spaces around it allowed.
fn size_text(s: &str) -> PyResult<u64> {
    usermm::units::parse_size(s.trim()).map_err(|e| {
        PyValueError::new_err(format!("bad size {s:?}: {e} (e.g. 4096, \"64K\", \"2M\")"))
    })
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
    /// The counter deltas of the most recent call that did mm work.
    last: RefCell<usermm::Snapshot>,
}

/// The non-zero counters of `c` as a dict.
fn counters_dict<'py>(py: Python<'py>, c: &usermm::Snapshot) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in c.nonzero() {
        d.set_item(k, v)?;
    }
    Ok(d)
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
        Ok(Machine {
            m,
            last: RefCell::default(),
        })
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
        self.counted(|c| c.spawn(who, 8 << 20).map_err(errno))
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
        self.counted(|c| c.mmap(pid, args).map_err(errno))
    }

    /// `munmap`.
    fn munmap(&self, pid: u32, addr: u64, length: Size) -> PyResult<()> {
        let len = length.bytes()?;
        self.counted(|c| c.munmap(pid, addr, len).map_err(errno))
    }

    /// `mprotect`.
    fn mprotect(&self, pid: u32, addr: u64, length: Size, prot: &str) -> PyResult<()> {
        let (p, len) = (self::prot(prot)?, length.bytes()?);
        self.counted(|c| c.mprotect(pid, addr, len, p).map_err(errno))
    }

    /// `fork`; returns the child's pid.
    fn fork(&self, pid: u32) -> PyResult<u32> {
        self.counted(|c| c.fork(pid).map_err(errno))
    }

    /// The process exits (its memory is torn down).
    fn exit(&self, pid: u32) -> PyResult<()> {
        self.counted(|c| c.exit(pid).map_err(errno))
    }

    /// One access per page of `[addr, addr + length)`, faulting as needed.
    #[pyo3(signature = (pid, addr, length, write = false))]
    fn touch(&self, pid: u32, addr: u64, length: Size, write: bool) -> PyResult<()> {
        let access = if write { Access::Write } else { Access::Read };
        let len = length.bytes()?;
        self.counted(|c| c.touch(pid, addr, len, access).map_err(engine_err))
    }

    /// The machine's event counters since it was made (name → count, the non-zero ones).
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        counters_dict(py, &self.m.counters())
    }

    /// What the most recent call that did mm work (`spawn`, `mmap`, `munmap`, `mprotect`,
    /// `fork`, `exit`, `touch`) moved: counter name → delta, the non-zero ones; set even when
    /// the call raised. Empty before the first such call.
    fn last_counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        counters_dict(py, &self.last.borrow())
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

    /// Runs `f` on CPU slot 0 and keeps what it moved as [`Machine::last_counters`] (the CPU
    /// left first, so its counters are all in).
    fn counted<T>(&self, f: impl FnOnce(&usermm::Cpu<'_>) -> PyResult<T>) -> PyResult<T> {
        let before = self.m.counters();
        let r = self.cpu().and_then(|c| f(&c));
        *self.last.borrow_mut() = self.m.counters().delta(&before);
        r
    }
}

/// Scenario statements run on one engine machine, a few at a time
/// (`usermm.Session(tunables={...}, validate=True)`).
#[pyclass(unsendable, module = "usermm")]
pub struct Session {
    runner: Runner<EngineBackend>,
    /// Every statement accepted so far (a later chunk is parsed after them, so the names
    /// they bound stay known).
    text: String,
    /// Statements of `text` already run.
    done: usize,
    validate: bool,
    /// The counter deltas of the most recent `run`.
    last: usermm::Snapshot,
}

/// The most text one session accumulates (the scenario files' own bound).
const SESSION_MAX_TEXT: usize = 64 << 20;

#[pymethods]
impl Session {
    /// A session on a fresh machine; `validate` checks every invariant after each statement.
    #[new]
    #[pyo3(signature = (tunables = None, validate = true))]
    fn new(tunables: Option<HashMap<String, String>>, validate: bool) -> PyResult<Self> {
        let tunables: Vec<(String, String)> = tunables.unwrap_or_default().into_iter().collect();
        let mut check = usermm::Tunables::default();
        for (k, v) in &tunables {
            check
                .set(k, v)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        }
        Ok(Session {
            runner: Runner::new(EngineBackend::new(tunables)),
            text: String::new(),
            done: 0,
            validate,
            last: usermm::Snapshot::default(),
        })
    }

    /// Runs statements (one a line). Returns `{"failures": [...], "dumps": [...],
    /// "counters": {...}}` (failed expectations, what `dump` printed, the non-zero counter
    /// deltas of the chunk, as [`Session::last_counters`]); raises `ValueError` for a parse
    /// error (nothing of the chunk runs) and `RuntimeError` when a statement fails without
    /// `expect` or cannot run (the statements before it have run; `last_counters` has what
    /// they moved).
    fn run<'py>(&mut self, py: Python<'py>, statements: &str) -> PyResult<Bound<'py, PyDict>> {
        let before = self.snapshot();
        let res = self.run_chunk(py, statements);
        self.last = self.snapshot().delta(&before);
        let d = res?;
        d.set_item("counters", counters_dict(py, &self.last)?)?;
        Ok(d)
    }

    /// What the most recent `run` moved: counter name → delta, the non-zero ones (empty
    /// before the first, and after a chunk that did not parse).
    fn last_counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        counters_dict(py, &self.last)
    }

    /// The address a name was bound to (`a = p0 mmap …`).
    fn addr(&self, name: &str) -> PyResult<u64> {
        self.runner
            .bindings()
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, b)| b.addr)
            .ok_or_else(|| PyValueError::new_err(format!("no mapping named `{name}`")))
    }

    /// Every smaps field (as `/proc/PID/smaps` names them, in bytes) summed over the VMAs
    /// of process `task` that overlap mapping `name`.
    fn smaps<'py>(
        &mut self,
        py: Python<'py>,
        task: &str,
        name: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (start, len) = self
            .runner
            .bindings()
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .map(|(_, b)| (b.addr, b.len))
            .ok_or_else(|| PyValueError::new_err(format!("no mapping named `{name}`")))?;
        let p = self.pid(task)?;
        let end = start.saturating_add(len);
        let mut total = scenario::backend::SmapsView::default();
        let vmas = scenario::backend::Backend::vmas(&mut self.runner.backend, p)
            .map_err(|f| PyRuntimeError::new_err(scenario::run::fail_name(&f)))?;
        for v in vmas.iter().filter(|v| v.start < end && start < v.end) {
            total.add(&v.smaps);
            total.size -= v.smaps.size;
            total.size += v.end.min(end) - v.start.max(start);
        }
        let d = PyDict::new(py);
        for f in <scenario::SmapsField as scenario::Keyword>::ALL {
            if let Some(v) = scenario::run::smaps_field(&total, *f) {
                d.set_item(scenario::Keyword::as_str(*f), v)?;
            }
        }
        Ok(d)
    }

    /// pagemap and kpageflags of the page at `addr` (an address expression: `a+4K`) of
    /// process `task`: `present`, `exclusive`, `swapped`, `kpageflags`, `folio_order`.
    fn page<'py>(
        &mut self,
        py: Python<'py>,
        task: &str,
        addr: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let p = self.pid(task)?;
        let a = self.resolve(addr)?;
        let v = scenario::backend::Backend::page(&mut self.runner.backend, p, a)
            .map_err(|f| PyRuntimeError::new_err(scenario::run::fail_name(&f)))?;
        let d = PyDict::new(py);
        d.set_item("present", v.present)?;
        d.set_item("exclusive", v.exclusive)?;
        d.set_item("swapped", v.swapped)?;
        d.set_item("kpageflags", v.kpageflags)?;
        d.set_item("folio_order", v.folio_order)?;
        Ok(d)
    }

    /// The text of `dump task addr length`: the range's VMAs, entries and folios.
    fn dump(&mut self, task: &str, addr: &str, length: Size) -> PyResult<String> {
        let p = self.pid(task)?;
        let a = self.resolve(addr)?;
        scenario::backend::Backend::dump(&mut self.runner.backend, p, a, length.bytes()?)
            .map_err(|f| PyRuntimeError::new_err(scenario::run::fail_name(&f)))
    }

    /// Every engine counter since the machine was made (name → count, the non-zero ones).
    fn counters<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        if let Some(m) = self.runner.backend.built() {
            for (k, v) in m.counters().nonzero() {
                d.set_item(k, v)?;
            }
        }
        Ok(d)
    }
}

impl Session {
    /// The machine's counters (zero before the first statement that builds it).
    fn snapshot(&mut self) -> usermm::Snapshot {
        self.runner
            .backend
            .built()
            .map(|m| m.counters())
            .unwrap_or_default()
    }

    /// [`Session::run`] without the counters.
    fn run_chunk<'py>(
        &mut self,
        py: Python<'py>,
        statements: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut text = self.text.clone();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(statements);
        if text.len() > SESSION_MAX_TEXT {
            return Err(PyValueError::new_err(
                "a session holds at most 64 MiB of statements",
            ));
        }
        let script = scenario::Script::parse_checked("<session>", &text)
            .map_err(|e| PyValueError::new_err(e.to_string().trim_end().to_string()))?;
        self.text = text;
        let (failures, dumps) = (
            pyo3::types::PyList::empty(py),
            pyo3::types::PyList::empty(py),
        );
        let new = script.stmts.get(self.done..).unwrap_or_default().to_vec();
        for stmt in &new {
            self.done += 1;
            let step = self.runner.run_stmt(stmt);
            if let Some(out) = step.output {
                dumps.append(out)?;
            }
            if let Some(m) = step.expect_failure {
                failures.append(format!("line {}: {m}", stmt.pos.line))?;
            }
            if let Some(a) = step.abort {
                let (Abort::Failed(m) | Abort::CannotRun(m)) = a;
                return Err(PyRuntimeError::new_err(format!(
                    "line {}: {m}",
                    stmt.pos.line
                )));
            }
            if self.validate {
                if let Some(m) = self.runner.backend.built() {
                    m.validate()
                        .map_err(|v| PyRuntimeError::new_err(v.join("\n")))?;
                }
            }
        }
        let d = PyDict::new(py);
        d.set_item("failures", failures)?;
        d.set_item("dumps", dumps)?;
        Ok(d)
    }

    fn pid(&self, task: &str) -> PyResult<u32> {
        self.runner
            .processes()
            .into_iter()
            .find(|(n, _)| n.as_str() == task)
            .map(|(_, p)| p)
            .ok_or_else(|| PyValueError::new_err(format!("no process named `{task}`")))
    }

    /// An address expression of the language (`a`, `a+4K`, `0x7f0000000000`).
    fn resolve(&self, expr: &str) -> PyResult<u64> {
        let bad =
            || PyValueError::new_err(format!("bad address {expr:?} (NAME, NAME+SIZE or 0x…)"));
        let mut parts = expr.split('+').map(str::trim);
        let base = parts.next().ok_or_else(bad)?;
        let mut a = if base.starts_with("0x") {
            usermm::units::parse_uint(base).map_err(|_| bad())?
        } else {
            self.addr(base)?
        };
        for p in parts {
            a = a.checked_add(size_text(p)?).ok_or_else(bad)?;
        }
        Ok(a)
    }
}

/// Runs a whole scenario file's text on a fresh engine, as `usermm run` does:
/// `{"exit_code", "failures", "abort", "counters", "dumps"}`.
#[pyfunction]
#[pyo3(signature = (text, validate = true, tunables = None))]
fn run_scenario<'py>(
    py: Python<'py>,
    text: &str,
    validate: bool,
    tunables: Option<HashMap<String, String>>,
) -> PyResult<Bound<'py, PyDict>> {
    let script = scenario::Script::parse_checked("<text>", text)
        .map_err(|e| PyValueError::new_err(e.to_string().trim_end().to_string()))?;
    let opts = RunOptions {
        validate,
        tunables: tunables.unwrap_or_default().into_iter().collect(),
        ..RunOptions::default()
    };
    let r = scenario::run::run(&script, &opts);
    let d = PyDict::new(py);
    d.set_item("exit_code", r.exit_code())?;
    let failures: Vec<String> = r
        .failures
        .iter()
        .map(|f| format!("line {}: {}", f.line, f.message))
        .collect();
    d.set_item("failures", failures)?;
    d.set_item(
        "abort",
        r.abort
            .as_ref()
            .map(|(f, _)| format!("line {}: {}", f.line, f.message)),
    )?;
    let counters = PyDict::new(py);
    for (k, v) in r.counters.nonzero() {
        counters.set_item(k, v)?;
    }
    d.set_item("counters", counters)?;
    let dumps: Vec<String> = r.dumps.into_iter().map(|(_, t)| t).collect();
    d.set_item("dumps", dumps)?;
    Ok(d)
}

/// The `usermm` Python module.
#[pymodule]
#[pyo3(name = "usermm")]
fn usermm_python(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Machine>()?;
    m.add_class::<Session>()?;
    m.add_function(wrap_pyfunction!(run_scenario, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
