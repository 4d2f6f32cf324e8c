//! The engine as a scenario [`Backend`].

use crate::ast::Keyword;
use crate::ast::{
    Advice, Arch, Errno, FileKind, MlockallFlags, MsyncMode, Outcome, Prot, Setting, Sharing,
    ShmemSetting, Signal, ThpSetting,
};
use crate::backend::{
    Backend, Fail, FileId, LockOp, MmapReq, MremapOpts, PageView, Place, ProcId, Res, StatusView,
    VmaKind, VmaView,
};
use crate::thp::apply_thp;
use usermm::{Machine, MachineConfig, MmapArgs, Privilege};

/// Runs scenarios on a [`usermm::Machine`], built at the first statement that needs it.
#[derive(Debug, Default)]
pub struct EngineBackend {
    cfg: MachineConfig,
    machine: Option<Machine>,
    pending: Vec<(String, String)>,
    thp: Vec<ThpSetting>,
    shmem: Vec<ShmemSetting>,
    /// The CPU slot the next statement runs on (`on cpuN`).
    cpu: usize,
}

/// Refuses simulated RAM the host could not back. The arena and memmap are allocated zeroed
/// (untouched host pages), so a machine costs the host what its scenario writes: RAM, 64
/// bytes of memmap per frame, and the page tables and caches around them. A `set memory`
/// close to the host's size would let one scenario push the shared host into its OOM killer;
/// so the machine may be at most what `MemAvailable` says now, less an eighth of it (at least
/// 256 MiB) left for everyone else. A host whose `/proc/meminfo` cannot be read is not
/// checked (the arena's own allocation still fails cleanly past what can be mapped).
fn host_can_back(memory: u64) -> Result<(), String> {
    let Some(avail) = host_mem_available() else {
        return Ok(());
    };
    let need = memory.saturating_add(memory / 32);
    let limit = host_memory_room(avail);
    if need > limit {
        return Err(format!(
            "set memory {memory}: the host has {} MiB available, so at most {} MiB of simulated \
             RAM (with its memmap) can be backed without pressing on the shared host",
            avail >> 20,
            (limit / 33 * 32) >> 20
        ));
    }
    Ok(())
}

/// What one scenario may take of the host's `avail` bytes of available memory: all but an
/// eighth of it (at least 256 MiB), left for the host's other users. The engine's RAM and the
/// oracle's tmpfs files are both bounded by it.
pub fn host_memory_room(avail: u64) -> u64 {
    avail.saturating_sub((avail / 8).max(256 << 20))
}

/// `MemAvailable` from `/proc/meminfo`, in bytes (the first 8 KiB read: the field is near
/// the top). The oracle bounds what it stages on tmpfs with it too.
pub fn host_mem_available() -> Option<u64> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open("/proc/meminfo")
        .ok()?
        .take(8192)
        .read_to_string(&mut text)
        .ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

impl From<usermm::Errno> for Errno {
    /// The scenario errno of an engine errno, by number: each engine errno is Linux's
    /// (`usermm::Errno::code`), and each has its scenario name (the match is total, and
    /// `tests::every_engine_errno_keeps_its_number` checks the numbers agree).
    fn from(e: usermm::Errno) -> Errno {
        use usermm::Errno as E;
        match e {
            E::EPERM => Errno::EPERM,
            E::ENOENT => Errno::ENOENT,
            E::ESRCH => Errno::ESRCH,
            E::EINTR => Errno::EINTR,
            E::EIO => Errno::EIO,
            E::EBADF => Errno::EBADF,
            E::EAGAIN => Errno::EAGAIN,
            E::ENOMEM => Errno::ENOMEM,
            E::EACCES => Errno::EACCES,
            E::EFAULT => Errno::EFAULT,
            E::EBUSY => Errno::EBUSY,
            E::EEXIST => Errno::EEXIST,
            E::ENODEV => Errno::ENODEV,
            E::EINVAL => Errno::EINVAL,
            E::ENFILE => Errno::ENFILE,
            E::EMFILE => Errno::EMFILE,
            E::EFBIG => Errno::EFBIG,
            E::ENOSPC => Errno::ENOSPC,
            E::EOVERFLOW => Errno::EOVERFLOW,
        }
    }
}

fn errno(e: usermm::Errno) -> Fail {
    Fail::Outcome(Outcome::Errno(e.into()))
}

fn signal(s: usermm::Signal) -> Fail {
    match s {
        usermm::Signal::Bus(_) => Fail::Outcome(Outcome::Signal(Signal::Sigbus)),
        usermm::Signal::Segv(_) => Fail::Outcome(Outcome::Signal(Signal::Sigsegv)),
        usermm::Signal::NoProcess => Fail::Unsupported("no such process".into()),
    }
}

/// The engine's protection for a scenario `prot` (through the `PROT_*` bits:
/// `usermm::Prot::from_bits`, the workspace's one conversion).
pub fn prot(p: Prot) -> usermm::Prot {
    usermm::Prot::from_bits(p.bits())
}

fn apply_shmem(t: &mut usermm::Tunables, s: &ShmemSetting) {
    match s {
        ShmemSetting::Top(top) => {
            if let Some(p) = usermm::ShmemHuge::parse(top.as_str()) {
                t.shmem.top = p;
            }
        }
        ShmemSetting::Size { size, policy } => {
            if let Some(p) = usermm::ShmemHuge::parse(policy.as_str()) {
                t.shmem.per_order[size.order() as usize] = p;
            }
        }
    }
}

impl EngineBackend {
    /// A backend with default settings and `tunables` to apply when the machine is built.
    pub fn new(tunables: Vec<(String, String)>) -> EngineBackend {
        EngineBackend {
            pending: tunables,
            ..EngineBackend::default()
        }
    }

    /// The machine (built on first use).
    pub fn machine(&mut self) -> Res<&Machine> {
        if self.machine.is_none() {
            let mut cfg = self.cfg.clone();
            for (k, v) in &self.pending {
                cfg.tunables
                    .set(k, v)
                    .map_err(|e| Fail::Unsupported(e.to_string()))?;
            }
            for s in &self.thp {
                apply_thp(&mut cfg.tunables, s);
            }
            for s in &self.shmem {
                apply_shmem(&mut cfg.tunables, s);
            }
            let (memory, swap) = (cfg.memory, cfg.swap);
            // The swap area's bytes are host memory too (lazily backed, like the RAM).
            host_can_back(memory.saturating_add(cfg.swap)).map_err(Fail::Unsupported)?;
            let m = Machine::new(cfg);
            if m.phys.nr_frames() == 0 && memory >= 4 << 20 {
                return Err(Fail::Unsupported(format!(
                    "set memory {memory}: the host cannot back that much simulated RAM"
                )));
            }
            if swap >= 8192 && m.swap.is_none() {
                return Err(Fail::Unsupported(format!(
                    "set swap {swap}: the host cannot back a swap area that large"
                )));
            }
            self.machine = Some(m);
        }
        self.machine
            .as_ref()
            .ok_or_else(|| Fail::Unsupported("no machine".into()))
    }

    /// The machine if it was built.
    pub fn built(&self) -> Option<&Machine> {
        self.machine.as_ref()
    }

    fn with<T>(&mut self, f: impl FnOnce(&usermm::Cpu<'_>) -> Res<T>) -> Res<T> {
        let id = self.cpu;
        let m = self.machine()?;
        let cpu = m
            .enter_cpu(id)
            .map_err(|e| Fail::Unsupported(e.to_string()))?;
        f(&cpu)
    }
}

impl Backend for EngineBackend {
    fn name(&self) -> &'static str {
        "engine"
    }

    fn on_cpu(&mut self, _p: ProcId, cpu: u32) -> Res<()> {
        let n = self.machine()?.nr_cpus();
        if cpu as usize >= n {
            return Err(Fail::Unsupported(format!(
                "cpu{cpu}: the machine has {n} CPUs"
            )));
        }
        self.cpu = cpu as usize;
        Ok(())
    }

    fn set_thp(&mut self, settings: &[ThpSetting]) -> Res<()> {
        match &self.machine {
            Some(m) => m.update_tunables(|t| settings.iter().for_each(|s| apply_thp(t, s))),
            None => self.thp.extend(settings.iter().cloned()),
        }
        Ok(())
    }

    fn set_engine(&mut self, s: &Setting) -> Res<()> {
        let late = |what: &str| {
            Fail::Unsupported(format!("set {what} must come before the first process"))
        };
        match s {
            Setting::Memory(b) if self.machine.is_none() => self.cfg.memory = *b,
            Setting::Swap(b, ssd) if self.machine.is_none() => {
                self.cfg.swap = *b;
                self.cfg.swap_ssd = *ssd;
            }
            Setting::Nodes(n) if self.machine.is_none() => self.cfg.nodes = *n,
            Setting::Cpus(n) if self.machine.is_none() => self.cfg.cpus = *n as usize,
            Setting::Arch(a) if self.machine.is_none() => {
                self.cfg.arch = match a {
                    Arch::X86_64 => usermm::Arch::X86_64,
                    Arch::Arm64 => usermm::Arch::Arm64,
                }
            }
            Setting::Memory(_) => return Err(late("memory")),
            Setting::Swap(..) => return Err(late("swap")),
            Setting::Nodes(_) => return Err(late("nodes")),
            Setting::Cpus(_) => return Err(late("cpus")),
            Setting::Arch(_) => return Err(late("arch")),
            Setting::Tunable { name, value } => match &self.machine {
                Some(m) => {
                    let mut res = Ok(());
                    m.update_tunables(|t| res = t.set(name, value));
                    res.map_err(|e| Fail::Unsupported(e.to_string()))?;
                }
                None => {
                    let mut probe = usermm::Tunables::default();
                    probe
                        .set(name, value)
                        .map_err(|e| Fail::Unsupported(e.to_string()))?;
                    self.pending.push((name.clone(), value.clone()));
                }
            },
            _ => {}
        }
        Ok(())
    }

    fn set_mempolicy(&mut self, interleave: bool) -> Res<()> {
        let p = if interleave {
            usermm::machine::MemPolicy::Interleave
        } else {
            usermm::machine::MemPolicy::Default
        };
        self.machine()?.set_mempolicy(p);
        Ok(())
    }

    fn spawn(&mut self, privileged: bool, rlimit_memlock: Option<u64>) -> Res<ProcId> {
        let pr = if privileged {
            Privilege::Privileged
        } else {
            Privilege::Ordinary
        };
        let limit = rlimit_memlock.unwrap_or(u64::MAX);
        self.with(|cpu| cpu.spawn(pr, limit).map_err(errno))
    }

    fn fork(&mut self, p: ProcId) -> Res<ProcId> {
        self.with(|cpu| cpu.fork(p).map_err(errno))
    }

    fn exit(&mut self, p: ProcId) -> Res<()> {
        self.with(|cpu| cpu.exit(p).map_err(errno))
    }

    fn mmap(&mut self, p: ProcId, r: &MmapReq) -> Res<u64> {
        let args = MmapArgs {
            len: r.len,
            prot: prot(r.prot),
            sharing: match r.sharing {
                Sharing::Private => usermm::Sharing::Private,
                Sharing::Shared => usermm::Sharing::Shared,
            },
            placement: match r.place {
                Place::Anywhere => usermm::Placement::Any,
                Place::Hint(a) => usermm::Placement::Hint(a),
                Place::Fixed(a) => usermm::Placement::Fixed(a),
                Place::FixedNoreplace(a) => usermm::Placement::FixedNoReplace(a),
            },
            populate: r.populate,
            locked: r.locked,
            noreserve: r.noreserve,
            stack: false,
            file: r.file,
        };
        self.with(|cpu| cpu.mmap(p, args).map_err(errno))
    }

    fn munmap(&mut self, p: ProcId, addr: u64, len: u64) -> Res<()> {
        self.with(|cpu| cpu.munmap(p, addr, len).map_err(errno))
    }

    fn mprotect(&mut self, p: ProcId, addr: u64, len: u64, pr: Prot) -> Res<()> {
        self.with(|cpu| cpu.mprotect(p, addr, len, prot(pr)).map_err(errno))
    }

    fn mremap(&mut self, p: ProcId, addr: u64, old: u64, new: u64, o: MremapOpts) -> Res<u64> {
        let f = usermm::MremapFlags {
            maymove: o.maymove,
            dontunmap: o.dontunmap,
            fixed: o.fixed,
        };
        self.with(|cpu| cpu.mremap(p, addr, old, new, f).map_err(errno))
    }

    fn brk(&mut self, p: ProcId, new: u64) -> Res<u64> {
        self.with(|cpu| cpu.brk(p, new).map_err(errno))
    }

    fn madvise(&mut self, p: ProcId, addr: u64, len: u64, a: Advice) -> Res<()> {
        let adv = usermm::Advice::from(a);
        self.with(|cpu| cpu.madvise(p, addr, len, adv).map_err(errno))
    }

    fn set_shmem(&mut self, settings: &[ShmemSetting]) -> Res<()> {
        // The knobs as they would be afterwards, checked as Linux's `shmem_enabled_store`
        // checks them: `force` only while exactly the PMD size inherits (measured: `2M=never`
        // then `top=force` is EINVAL on 6.18; the oracle's host side gives up the same way).
        let mut after = usermm::Tunables::default();
        match &self.machine {
            Some(m) => after.shmem = m.tunables().shmem.clone(),
            None => self.shmem.iter().for_each(|s| apply_shmem(&mut after, s)),
        }
        settings.iter().for_each(|s| apply_shmem(&mut after, s));
        let inherit: Vec<usize> = (0..after.shmem.per_order.len())
            .filter(|&o| after.shmem.per_order[o] == usermm::ShmemHuge::Inherit)
            .collect();
        if after.shmem.top == usermm::ShmemHuge::Force
            && inherit != [usermm::tunables::PMD_ORDER as usize]
        {
            return Err(Fail::Unsupported(
                "shmem_enabled: Invalid argument (`force` needs exactly the 2M size to inherit)"
                    .into(),
            ));
        }
        match &self.machine {
            Some(m) => m.update_tunables(|t| settings.iter().for_each(|s| apply_shmem(t, s))),
            None => self.shmem.extend_from_slice(settings),
        }
        Ok(())
    }

    fn file_create(&mut self, size: u64, kind: FileKind, pattern: Option<u8>) -> Res<FileId> {
        let kind = match kind {
            FileKind::Tmpfs => usermm::InodeKind::Tmpfs,
            FileKind::Disk => usermm::InodeKind::Disk,
        };
        self.with(|cpu| cpu.file_create(size, kind, pattern).map_err(errno))
    }

    fn pwrite(&mut self, _p: ProcId, f: FileId, offset: u64, len: u64, byte: u8) -> Res<()> {
        self.with(|cpu| cpu.pwrite(f, offset, len, byte).map(|_| ()).map_err(errno))
    }

    fn pread(&mut self, _p: ProcId, f: FileId, offset: u64, len: u64) -> Res<Vec<u8>> {
        self.with(|cpu| cpu.pread(f, offset, len).map_err(errno))
    }

    fn ftruncate(&mut self, _p: ProcId, f: FileId, size: u64) -> Res<()> {
        self.with(|cpu| cpu.ftruncate(f, size).map_err(errno))
    }

    fn fallocate(&mut self, _p: ProcId, f: FileId, off: u64, len: u64, punch: bool) -> Res<()> {
        self.with(|cpu| cpu.fallocate(f, off, len, punch).map_err(errno))
    }

    fn msync(&mut self, p: ProcId, addr: u64, len: u64, mode: MsyncMode) -> Res<()> {
        let flags = [match mode {
            MsyncMode::Sync => usermm::MsyncFlags::Sync,
            MsyncMode::Async => usermm::MsyncFlags::Async,
            MsyncMode::Invalidate => usermm::MsyncFlags::Invalidate,
        }];
        self.with(|cpu| cpu.msync(p, addr, len, &flags).map_err(errno))
    }

    fn fsync(&mut self, _p: ProcId, f: FileId) -> Res<()> {
        self.with(|cpu| cpu.fsync(f).map_err(errno))
    }

    fn fincore(&mut self, _p: ProcId, f: FileId, offset: u64, len: u64) -> Res<u64> {
        self.with(|cpu| cpu.fincore(f, offset, len).map_err(errno))
    }

    fn mlock(&mut self, p: ProcId, addr: u64, len: u64, op: LockOp) -> Res<()> {
        self.with(|cpu| {
            match op {
                LockOp::Mlock => cpu.mlock(p, addr, len),
                LockOp::Mlock2Onfault => cpu.mlock2(p, addr, len, true),
                LockOp::Munlock => cpu.munlock(p, addr, len),
            }
            .map_err(errno)
        })
    }

    fn mlockall(&mut self, p: ProcId, flags: MlockallFlags) -> Res<()> {
        let f = usermm::MlockallFlags {
            current: flags.current,
            future: flags.future,
            onfault: flags.onfault,
        };
        self.with(|cpu| cpu.mlockall(p, f).map_err(errno))
    }

    fn munlockall(&mut self, p: ProcId) -> Res<()> {
        self.with(|cpu| cpu.munlockall(p).map_err(errno))
    }

    fn pin(&mut self, p: ProcId, addr: u64, len: u64) -> Res<()> {
        self.with(|cpu| cpu.pin(p, addr, len).map_err(errno))
    }

    fn unpin(&mut self, p: ProcId, addr: u64, len: u64) -> Res<()> {
        self.with(|cpu| cpu.unpin(p, addr, len).map_err(errno))
    }

    fn write(&mut self, p: ProcId, addr: u64, len: u64, byte: u8) -> Res<()> {
        self.with(|cpu| cpu.write_fill(p, addr, len, byte).map_err(signal))
    }

    fn touch(&mut self, p: ProcId, addr: u64, len: u64, write: bool) -> Res<()> {
        let acc = if write {
            usermm::Access::Write
        } else {
            usermm::Access::Read
        };
        self.with(|cpu| cpu.touch(p, addr, len, acc).map_err(signal))
    }

    fn check(&mut self, p: ProcId, addr: u64, len: u64, byte: u8) -> Res<Option<(u64, u8)>> {
        self.with(|cpu| {
            let Some(at) = cpu.find_mismatch(p, addr, len, byte).map_err(signal)? else {
                return Ok(None);
            };
            let mut b = [0u8; 1];
            cpu.read_bytes(p, at, &mut b).map_err(signal)?;
            Ok(Some((at - addr, b[0])))
        })
    }

    fn vmas(&mut self, p: ProcId) -> Res<Vec<VmaView>> {
        self.with(|cpu| {
            let list = cpu.smaps(p, 0, u64::MAX).map_err(errno)?;
            Ok(list
                .into_iter()
                .map(|(e, s)| VmaView {
                    start: e.start,
                    end: e.end,
                    perms: e.perms.clone(),
                    locked: e.flags & usermm::vma::VmFlags::LOCKED != 0,
                    kind: match e.backing {
                        usermm::views::Backing::Anon => VmaKind::Anon,
                        usermm::views::Backing::SharedAnon => VmaKind::SharedAnon,
                        usermm::views::Backing::Tmpfs => VmaKind::TmpfsFile,
                        usermm::views::Backing::Disk => VmaKind::DiskFile,
                    },
                    smaps: s,
                })
                .collect())
        })
    }

    fn status(&mut self, p: ProcId) -> Res<StatusView> {
        self.with(|cpu| {
            Ok(StatusView {
                vm_pin: cpu.status(p).map_err(errno)?.vm_pin,
            })
        })
    }

    fn reclaim(&mut self, _p: ProcId, len: u64) -> Res<()> {
        self.with(|cpu| {
            cpu.reclaim(len);
            Ok(())
        })
    }

    fn counters(&mut self) -> Res<Vec<(&'static str, u64)>> {
        Ok(self.machine()?.counters().all())
    }

    fn dump(&mut self, p: ProcId, addr: u64, len: u64) -> Res<String> {
        self.with(|cpu| usermm::dump::dump_range(cpu, p, addr, len).map_err(errno))
    }

    fn page(&mut self, p: ProcId, addr: u64) -> Res<PageView> {
        self.with(|cpu| {
            let pm = cpu.pagemap(p, addr).map_err(errno)?;
            Ok(PageView {
                present: pm.present,
                exclusive: pm.exclusive,
                swapped: pm.swapped,
                kpageflags: cpu.kpageflags(p, addr).map_err(errno)?,
                folio_order: cpu.folio_order(p, addr).map_err(errno)?,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::prot;
    use crate::ast::{Advice, Errno, Keyword, Prot};

    #[test]
    fn every_engine_errno_keeps_its_number() {
        // Linux's numbers (include/uapi/asm-generic/errno-base.h, errno.h; x86_64 and arm64).
        let linux = |name: &str| match name {
            "EPERM" => 1,
            "ENOENT" => 2,
            "ESRCH" => 3,
            "EINTR" => 4,
            "EIO" => 5,
            "EBADF" => 9,
            "EAGAIN" => 11,
            "ENOMEM" => 12,
            "EACCES" => 13,
            "EFAULT" => 14,
            "EBUSY" => 16,
            "EEXIST" => 17,
            "ENODEV" => 19,
            "EINVAL" => 22,
            "ENFILE" => 23,
            "EMFILE" => 24,
            "EFBIG" => 27,
            "ENOSPC" => 28,
            "EOVERFLOW" => 75,
            _ => -1,
        };
        for &e in usermm::Errno::ALL {
            let s = Errno::from(e);
            assert_eq!(s.number(), e.code(), "{e}");
            assert_eq!(s.number(), linux(e.name()), "{e}");
            assert_eq!(s.as_str(), e.name());
            assert_eq!(Errno::from_number(e.code()), Some(s));
        }
    }

    #[test]
    fn every_advice_keeps_its_linux_number() {
        // include/uapi/asm-generic/mman-common.h.
        let linux = [
            ("normal", 0),
            ("random", 1),
            ("sequential", 2),
            ("willneed", 3),
            ("dontneed", 4),
            ("free", 8),
            ("remove", 9),
            ("dontfork", 10),
            ("dofork", 11),
            ("mergeable", 12),
            ("unmergeable", 13),
            ("hugepage", 14),
            ("nohugepage", 15),
            ("dontdump", 16),
            ("dodump", 17),
            ("wipeonfork", 18),
            ("keeponfork", 19),
            ("cold", 20),
            ("pageout", 21),
            ("populate_read", 22),
            ("populate_write", 23),
            ("dontneed_locked", 24),
            ("collapse", 25),
        ];
        assert_eq!(Advice::ALL.len(), linux.len());
        for (word, n) in linux {
            let a = Advice::from_keyword(word).unwrap_or_else(|| panic!("{word}"));
            assert_eq!(a.number(), n, "{word}");
            assert_eq!(
                usermm::Advice::from_number(n.into()),
                Some(a.into()),
                "{word}"
            );
        }
    }

    #[test]
    fn prot_goes_through_the_bits() {
        for &p in Prot::ALL {
            assert_eq!(prot(p).bits(), p.bits(), "{p}");
            assert_eq!(Prot::from_bits(p.bits()), p, "{p}");
        }
    }

    #[test]
    fn every_prot_combination_has_its_nearest_keyword() {
        // Write or exec without read is written with read; bits past EXEC are left out.
        let expected = ["none", "r", "rw", "rw", "rx", "rx", "rwx", "rwx"];
        for (bits, word) in (0..8u32).zip(expected) {
            assert_eq!(Prot::from_bits(bits).as_str(), word, "{bits}");
            assert_eq!(Prot::from_bits(bits | 0x0100_0000).as_str(), word, "{bits}");
        }
    }
}
