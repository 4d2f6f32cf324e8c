//! An anonymous mapping of the host kernel, aligned and exactly the requested size, unmapped
//! when dropped (unless [`Region::unmap_timed`] already did, timing it).

use super::errno_text;
use oracle::files::{ScratchDir, TMPFS_PARENT};
use oracle::sys::{
    self, MAP_ANONYMOUS, MAP_FIXED, MAP_LOCKED, MAP_POPULATE, MAP_PRIVATE, MAP_SHARED,
};
use std::os::fd::AsRawFd;
use usermm::{Advice, Prot};

// The host's protections and advice are the engine's tables' numbers (`Prot::bits`,
// `Advice::number`: Linux's ABI, written once in the workspace); the mapping flags are
// libc's, through `oracle::sys`.

/// `PROT_READ | PROT_WRITE`.
pub const RW: i32 = Prot::RW.bits() as i32;
/// `PROT_READ`.
pub const RO: i32 = Prot::RO.bits() as i32;
/// `PROT_NONE`.
const NONE: i32 = Prot::NONE.bits() as i32;
const PMD: u64 = 2 << 20;
const PAGE: u64 = 4096;

/// `MADV_DONTNEED`.
pub const MADV_DONTNEED: i32 = Advice::DontNeed.number();
/// `MADV_NOHUGEPAGE`.
pub const MADV_NOHUGEPAGE: i32 = Advice::NoHugePage.number();
/// `MADV_POPULATE_WRITE` (Linux 5.14+).
const MADV_POPULATE_WRITE: i32 = Advice::PopulateWrite.number();
/// `MAP_PRIVATE | MAP_ANONYMOUS`.
pub const PRIVATE_ANON: i32 = MAP_PRIVATE | MAP_ANONYMOUS;

/// A private anonymous mapping `[addr, addr + len)`.
#[derive(Debug)]
pub struct Region {
    /// Start (2 MiB aligned).
    pub addr: u64,
    /// Length.
    pub len: u64,
    mapped: bool,
}

impl Region {
    /// Reserves `len` bytes aligned to 2 MiB, `PROT_NONE`.
    fn reserve(len: u64) -> Result<Region, String> {
        let flags = PRIVATE_ANON;
        let map = sys::mmap(0, len + PMD, NONE, flags).map_err(|e| errno_text("mmap", e))?;
        let addr = (map + PMD - 1) & !(PMD - 1);
        if addr > map {
            sys::munmap(map, addr - map).map_err(|e| errno_text("munmap", e))?;
        }
        let tail = map + len + PMD - (addr + len);
        if tail > 0 {
            sys::munmap(addr + len, tail).map_err(|e| errno_text("munmap", e))?;
        }
        Ok(Region {
            addr,
            len,
            mapped: true,
        })
    }

    /// Maps `extra_flags` anonymous memory over the reservation.
    fn map_over(len: u64, prot: i32, extra_flags: i32) -> Result<Region, String> {
        let r = Region::reserve(len)?;
        let flags = PRIVATE_ANON | MAP_FIXED | extra_flags;
        sys::mmap(r.addr, len, prot, flags).map_err(|e| errno_text("mmap", e))?;
        Ok(r)
    }

    /// A read-write mapping of `len` bytes of the file `fd` from offset 0 (`MAP_SHARED`
    /// or `MAP_PRIVATE`), placed `skew` bytes past a 2 MiB boundary, not populated.
    pub fn file(len: u64, fd: i32, shared: bool, skew: u64) -> Result<Region, String> {
        let r = Region::reserve(len + PMD)?;
        let addr = r.addr + skew;
        let kind = if shared { MAP_SHARED } else { MAP_PRIVATE };
        // MAP_FIXED over our own reservation, then the reservation's rest goes.
        sys::mmap_fd(addr, len, RW, kind | MAP_FIXED, fd, 0).map_err(|e| errno_text("mmap", e))?;
        let ends = [(r.addr, skew), (addr + len, PMD - skew)];
        std::mem::forget(r);
        for (a, n) in ends {
            if n > 0 {
                sys::munmap(a, n).map_err(|e| errno_text("munmap", e))?;
            }
        }
        Ok(Region {
            addr,
            len,
            mapped: true,
        })
    }

    /// A `MAP_SHARED | MAP_LOCKED | MAP_POPULATE` mapping of the file `fd`.
    pub fn file_locked(len: u64, fd: i32) -> Result<Region, String> {
        let r = Region::reserve(len)?;
        let flags = MAP_SHARED | MAP_FIXED | MAP_LOCKED | MAP_POPULATE;
        sys::mmap_fd(r.addr, len, RW, flags, fd, 0).map_err(|e| errno_text("mmap", e))?;
        Ok(r)
    }

    /// One read access per page.
    pub fn read_each_page(&self) -> Result<(), String> {
        sys::touch(self.addr, self.len, false).map_err(|s| format!("signal {s} reading"))
    }

    /// A read-write anonymous mapping, not populated.
    pub fn anon(len: u64) -> Result<Region, String> {
        Region::map_over(len, RW, 0)
    }

    /// A read-write anonymous mapping kept to 4 KiB pages (`MADV_NOHUGEPAGE`: no THP, no
    /// mTHP), for measurements per small page; an error if the host refuses the advice.
    pub fn anon_small_pages(len: u64) -> Result<Region, String> {
        let r = Region::anon(len)?;
        sys::madvise(r.addr, r.len, MADV_NOHUGEPAGE)
            .map_err(|e| errno_text("madvise(MADV_NOHUGEPAGE)", e))?;
        Ok(r)
    }

    /// A read-write mapping populated and mlocked at mmap (`MAP_LOCKED | MAP_POPULATE`).
    pub fn locked(len: u64) -> Result<Region, String> {
        Region::map_over(len, RW, MAP_LOCKED | MAP_POPULATE)
    }

    /// Write-faults every page in (`MADV_POPULATE_WRITE`, else one write per page), so the
    /// folios have the size the mTHP policy gives.
    pub fn populate(&self) -> Result<(), String> {
        if sys::madvise(self.addr, self.len, MADV_POPULATE_WRITE).is_ok() {
            return Ok(());
        }
        self.write_each_page()
    }

    /// One write access per page (keeping the contents).
    pub fn write_each_page(&self) -> Result<(), String> {
        sys::touch(self.addr, self.len, true).map_err(|s| format!("signal {s} writing"))
    }

    /// Writes every byte (`memset`).
    pub fn fill(&self, byte: u8) -> Result<(), String> {
        sys::fill(self.addr, self.len, byte).map_err(|s| format!("signal {s} writing"))
    }

    /// PTE-maps every PMD-mapped THP: `mprotect` of one subpage of each 2 MiB block to
    /// read-only and back, as seed 000 does.
    pub fn remap_ptes(&self) -> Result<(), String> {
        self.protect_subpages(RO)?;
        self.protect_subpages(RW)
    }

    /// `mprotect` of the first subpage of each 2 MiB block.
    pub fn protect_subpages(&self, prot: i32) -> Result<(), String> {
        for blk in (self.addr..self.addr + self.len).step_by(PMD as usize) {
            sys::mprotect(blk, PAGE, prot).map_err(|e| errno_text("mprotect", e))?;
        }
        Ok(())
    }

    /// `MADV_DONTNEED` of every 4 KiB subpage, one call each.
    pub fn dontneed_each_page(&self) -> Result<(), String> {
        for a in (self.addr..self.addr + self.len).step_by(PAGE as usize) {
            sys::madvise(a, PAGE, MADV_DONTNEED).map_err(|e| errno_text("madvise", e))?;
        }
        Ok(())
    }

    /// Unmaps the region and returns how long `munmap` took.
    pub fn unmap_timed(mut self) -> Result<f64, String> {
        let t = super::measure::Stamp::now();
        let r = sys::munmap(self.addr, self.len);
        let secs = t.secs();
        self.mapped = false;
        r.map_err(|e| errno_text("munmap", e))?;
        Ok(secs)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.mapped {
            let _ = sys::munmap(self.addr, self.len);
        }
    }
}

/// `n` single-page read-only VMAs (a read-only mapping of `2n` pages with every second page
/// unmapped), not populated; unmapped when dropped.
pub struct SparseVmas {
    regions: Vec<Region>,
}

impl SparseVmas {
    /// Maps them.
    pub fn new(n: u64) -> Result<SparseVmas, String> {
        if n == 0 {
            return Ok(SparseVmas { regions: vec![] });
        }
        let r = Region::map_over(2 * n * PAGE, RO, 0)?;
        for i in 0..n {
            sys::munmap(r.addr + (2 * i + 1) * PAGE, PAGE).map_err(|e| errno_text("munmap", e))?;
        }
        let regions = (0..n)
            .map(|i| Region {
                addr: r.addr + 2 * i * PAGE,
                len: PAGE,
                mapped: true,
            })
            .collect();
        std::mem::forget(r);
        Ok(SparseVmas { regions })
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// Unmaps them all with one `munmap()` of their span, holes and all.
    pub fn unmap_span(&mut self) -> Result<(), String> {
        let (Some(first), Some(last)) = (self.regions.first(), self.regions.last()) else {
            return Ok(());
        };
        sys::munmap(first.addr, last.addr + last.len - first.addr)
            .map_err(|e| errno_text("munmap", e))?;
        for r in &mut self.regions {
            r.mapped = false;
        }
        Ok(())
    }

    /// Reads each VMA's page (a read fault: the zero page mapped).
    pub fn read_each(&self) -> Result<(), String> {
        self.regions.iter().try_for_each(Region::read_each_page)
    }

    /// None at all.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }
}

/// An unnamed tmpfs file of ours, in a private directory on `/dev/shm` (huge=never) made as
/// the oracle makes them ([`ScratchDir`]); file and directory go when dropped (the file
/// also when this process is killed: it has no name).
pub struct HostTmpfs {
    file: std::fs::File,
    _dir: ScratchDir,
}

impl HostTmpfs {
    /// A sparse file of `size` bytes.
    pub fn new(size: u64) -> Result<HostTmpfs, String> {
        let dir = ScratchDir::create(std::path::Path::new(TMPFS_PARENT))?;
        let file = dir.tmpfile()?;
        sys::ftruncate(file.as_raw_fd(), size).map_err(|e| errno_text("ftruncate", e))?;
        Ok(HostTmpfs { file, _dir: dir })
    }

    /// Writes `len` bytes of `byte` from offset 0 (`pwrite`, 1 MiB at a time).
    pub fn fill(&self, len: u64, byte: u8) -> Result<(), String> {
        let buf = vec![byte; 1 << 20];
        let mut off = 0;
        while off < len {
            let n = (len - off).min(buf.len() as u64) as usize;
            let w = sys::pwrite(self.fd(), &buf[..n], off).map_err(|e| errno_text("pwrite", e))?;
            off += w as u64;
        }
        Ok(())
    }

    /// Its descriptor.
    pub fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }
}
