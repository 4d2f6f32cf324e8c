//! Files and the page cache: the object behind every non-anonymous VMA.
//!
//! Linux counterparts: `struct address_space` and `struct inode` (`include/linux/fs.h`),
//! `mm/filemap.c` (the page cache, `filemap_fault`, `filemap_map_pages`, `filemap_read`),
//! `mm/shmem.c` (tmpfs and shared anonymous memory: `shmem_fault`, `shmem_get_folio`,
//! `shmem_fallocate`, `shmem_setattr`), `mm/truncate.c`, `mm/readahead.c`,
//! `mm/page-writeback.c`. This module holds the state: the size, the cache (page index to
//! frame) and, for disk files, the device's blocks. The operations live in the files of
//! Linux's map: [`cache`] and [`io`] (`filemap.c`), [`crate::readahead`], [`crate::truncate`],
//! [`crate::page_writeback`], [`crate::vmscan`], [`crate::shmem`], and the system calls in
//! [`crate::ops::file`].
//!
//! Three kinds of [`Inode`] exist, as in Linux:
//! - [`InodeKind::ShmemAnon`]: the object `shmem_zero_setup` creates for a
//!   `MAP_SHARED|MAP_ANONYMOUS` mapping. It has no name and dies with its last mapping.
//! - [`InodeKind::Tmpfs`]: a file in a tmpfs mounted like `/dev/shm` (`huge=never`). Its
//!   pages are the file: a page is created by the first fault or write and lives until the
//!   file is truncated, punched or removed. Reads of holes (`read(2)`) do not create pages.
//! - [`InodeKind::Disk`]: a file on a block device. The cache holds copies of the device's
//!   blocks; misses read from the device (with readahead), dirty pages are written back by
//!   `fsync`/`msync`. The device is a sparse block map kept here ([`DiskStore`]).
//!
//! Deliberate differences: every folio in the cache is order 0 (Linux 6.18 makes large
//! folios for tmpfs only under `shmem_enabled=force`, and for ext4 from readahead; the
//! scenario contract compares disk folio orders only where asked); writeback completes
//! synchronously (PG_writeback is set and cleared within one call); there is no dirty
//! throttling (`balance_dirty_pages`).
//!
//! # Locking
//! `pages` is the cache's lock (Linux: the xarray lock plus the folio locks). Fault-around
//! holds it while taking a PTE lock; nothing takes it under a PTE lock.

pub(crate) mod cache;
pub(crate) mod io;
pub(crate) mod xarray;

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use xarray::XArray;

/// Bytes in a page.
pub(crate) const PAGE_SIZE: u64 = 4096;

/// Whether a fault found its page in the cache or had to create or read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CacheLookup {
    /// Found (a minor fault).
    Hit,
    /// Created or read from the device (a major fault for disk files).
    Miss,
}

/// What kind of file an `Inode` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InodeKind {
    /// The shmem object of a shared anonymous mapping.
    ShmemAnon,
    /// A tmpfs file (shmem).
    Tmpfs,
    /// A file on a block device.
    Disk,
}

impl InodeKind {
    /// Shmem (swap-backed) pages: shared anonymous memory and tmpfs.
    pub(crate) fn is_shmem(self) -> bool {
        matches!(self, InodeKind::ShmemAnon | InodeKind::Tmpfs)
    }
}

/// One block of a disk file's device.
#[derive(Debug)]
enum Block {
    /// Written data.
    Data(Box<[u8]>),
    /// A punched hole (reads as zeroes, no block).
    Hole,
}

/// The device behind a disk file: a sparse map of its 4 KiB blocks.
///
/// A file created with a fill byte has allocated blocks holding that byte up to `fill_end`;
/// blocks written back later are stored explicitly; holes read as zeroes.
#[derive(Debug, Default)]
pub struct DiskStore {
    fill: u8,
    fill_end: u64,
    blocks: BTreeMap<u64, Block>,
}

/// What a block of a disk file holds, for a read into a frame.
#[derive(Debug)]
pub(crate) enum BlockContents<'a> {
    /// An allocated block of the file's fill byte: the first `len` bytes, zeroes after.
    Fill {
        /// The byte.
        byte: u8,
        /// Bytes of it (the rest of the page is past the end of the fill or of the file).
        len: usize,
    },
    /// A written block.
    Data(&'a [u8]),
    /// A hole: zeroes, no I/O.
    Hole,
}

impl DiskStore {
    /// What block `idx` of a file of `size` bytes holds (the bytes past `size` read as zero).
    pub(crate) fn contents(&self, idx: u64, size: u64) -> BlockContents<'_> {
        let start = idx * PAGE_SIZE;
        let in_file = size.saturating_sub(start).min(PAGE_SIZE) as usize;
        match self.blocks.get(&idx) {
            Some(Block::Data(d)) => BlockContents::Data(&d[..in_file.min(d.len())]),
            Some(Block::Hole) => BlockContents::Hole,
            None if start < self.fill_end => BlockContents::Fill {
                byte: self.fill,
                len: ((self.fill_end - start).min(PAGE_SIZE) as usize).min(in_file),
            },
            None => BlockContents::Hole,
        }
    }

    /// Whether block `idx` is allocated.
    pub(crate) fn mapped(&self, idx: u64) -> bool {
        match self.blocks.get(&idx) {
            Some(Block::Data(_)) => true,
            Some(Block::Hole) => false,
            None => idx * PAGE_SIZE < self.fill_end,
        }
    }

    /// Writes block `idx` (writeback of one page).
    pub(crate) fn write(&mut self, idx: u64, data: &[u8]) {
        self.blocks.insert(idx, Block::Data(data.into()));
    }

    /// Frees the blocks `first..last` (a punched hole).
    pub(crate) fn punch(&mut self, first: u64, last: u64) {
        let fill_pages = self.fill_end.div_ceil(PAGE_SIZE);
        let stored: Vec<u64> = self.blocks.range(first..last).map(|(&i, _)| i).collect();
        for i in stored {
            self.blocks.remove(&i);
        }
        for i in first..last.min(fill_pages) {
            self.blocks.insert(i, Block::Hole);
        }
    }

    /// Frees every block at or past `size` (truncate), zeroing the tail of a partial one.
    pub(crate) fn truncate(&mut self, size: u64) {
        let keep = size.div_ceil(PAGE_SIZE);
        self.blocks.split_off(&keep);
        if let Some(Block::Data(d)) = self.blocks.get_mut(&(size / PAGE_SIZE)) {
            d[(size % PAGE_SIZE) as usize..].fill(0);
        }
        if self.fill_end > size {
            self.fill_end = size;
        }
        let holes: Vec<u64> = self
            .blocks
            .iter()
            .filter(|(&i, b)| matches!(b, Block::Hole) && i * PAGE_SIZE >= self.fill_end)
            .map(|(&i, _)| i)
            .collect();
        for i in holes {
            self.blocks.remove(&i);
        }
    }
}

/// Readahead state of an open file (`struct file_ra_state`), in pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RaState {
    /// First page of the current window.
    pub(crate) start: u64,
    /// Pages in the window.
    pub(crate) size: u64,
    /// Pages from the window's end where the next async readahead is triggered.
    pub(crate) async_size: u64,
    /// Where the last read ended (bytes; `prev_pos`), `u64::MAX` before the first read.
    pub(crate) prev_pos: u64,
    /// Folio order of the last window (`ra->order`, 6.17+): synchronous windows reset it to
    /// 0, each asynchronous one raises it by 2 (clamped by `page_cache_ra_order`).
    pub(crate) order: u32,
    /// Fault misses less hits (`ra->mmap_miss`): a miss that may read around adds one (up
    /// to [`crate::readahead::MMAP_LOTSAMISS`] × 10), a fault's hit takes one and
    /// fault-around takes the pages it looked at; past `MMAP_LOTSAMISS` a miss reads its
    /// page alone (the rules: [`crate::readahead`]).
    pub(crate) mmap_miss: u16,
}

/// A file (an inode and its address_space).
#[derive(Debug)]
pub struct Inode {
    /// Identifier (stored as the folios' mapping).
    pub(crate) id: u32,
    /// What kind of file it is.
    pub(crate) kind: InodeKind,
    size: AtomicU64,
    /// The page cache (`i_pages`): page index -> frame.
    pub pages: Mutex<XArray>,
    /// The device of a disk file.
    pub disk: Mutex<DiskStore>,
    /// Readahead state (one open file per inode: every process shares the descriptor).
    pub(crate) ra: Mutex<RaState>,
    /// Shadows of evicted pages: index → the node's non-resident age at eviction, and
    /// whether the page was `PG_workingset` ([`crate::workingset`]).
    pub(crate) shadows: Mutex<std::collections::BTreeMap<u64, u64>>,
    /// Pages of a shmem object that are out on swap: index → slot (the page cache's swap
    /// entries, [`crate::swap_state::shmem_writeout`]).
    pub(crate) swapped: Mutex<std::collections::BTreeMap<u64, crate::phys::SwpEntry>>,
    users: AtomicU64,
}

impl Inode {
    /// A new empty file of `size` bytes with one user (its creator).
    pub fn new(id: u32, kind: InodeKind, size: u64) -> Inode {
        Inode {
            id,
            kind,
            size: AtomicU64::new(size),
            pages: Mutex::new(XArray::new()),
            disk: Mutex::new(DiskStore::default()),
            ra: Mutex::new(RaState {
                prev_pos: u64::MAX,
                ..RaState::default()
            }),
            shadows: Mutex::new(std::collections::BTreeMap::new()),
            swapped: Mutex::new(std::collections::BTreeMap::new()),
            users: AtomicU64::new(1),
        }
    }

    /// A disk file whose first `fill_end` bytes are allocated blocks holding `fill`.
    pub(crate) fn with_disk_fill(self, fill: u8, fill_end: u64) -> Inode {
        {
            let mut d = self.disk.lock();
            d.fill = fill;
            d.fill_end = fill_end;
        }
        self
    }

    /// `i_size` in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size.load(Relaxed)
    }

    /// Sets `i_size`.
    pub(crate) fn set_size(&self, size: u64) {
        self.size.store(size, Relaxed);
    }

    /// Pages covering `i_size` (a fault at or past this page index is SIGBUS).
    pub(crate) fn size_pages(&self) -> u64 {
        self.size().div_ceil(PAGE_SIZE)
    }

    /// Whether a fault may map the folio of the `nr` pages from page index `index` whole:
    /// when it lies before the end of the file (a folio truncated into is not, to keep
    /// SIGBUS past EOF), or always on shmem, which 6.18 exempts (`finish_fault`'s and
    /// `filemap_map_pages`' `shmem_mapping` exception; measured: a 64K tmpfs folio of a 20K
    /// file maps all 64K and reads zeroes past EOF).
    pub(crate) fn may_map_whole(&self, index: u64, nr: u64) -> bool {
        self.kind.is_shmem() || index.saturating_add(nr) <= self.size_pages()
    }

    /// Adds a user (a VMA, or the scenario's open file).
    pub(crate) fn get(&self) {
        self.users.fetch_add(1, Relaxed);
    }

    /// Drops a user; true when it was the last one.
    pub(crate) fn put(&self) -> bool {
        self.users.fetch_sub(1, Relaxed) == 1
    }

    /// Removes and returns every cached page.
    pub(crate) fn take_pages(&self) -> Vec<crate::phys::Pfn> {
        std::mem::take(&mut *self.pages.lock())
            .iter()
            .map(|(_, p)| p)
            .collect()
    }
}
