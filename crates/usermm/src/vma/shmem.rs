//! Shared anonymous memory: the shmem object behind `MAP_SHARED|MAP_ANONYMOUS`.
//!
//! Linux counterpart: `mm/shmem.c` (`shmem_zero_setup`, `shmem_fault`). The object is a page
//! cache indexed by page offset; it holds one reference on each of its folios. Every VMA that
//! maps it counts as a user; when the last user goes, the pages are released.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A shmem object.
#[derive(Debug)]
pub struct Shmem {
    /// Identifier (stored as the folios' mapping).
    pub id: u32,
    /// Page cache: page offset -> pfn.
    pub pages: Mutex<HashMap<u64, u64>>,
    /// Size of the object in pages (`i_size`): faults beyond it get SIGBUS.
    pub size_pages: u64,
    users: AtomicU64,
}

impl Shmem {
    /// A new empty object with one user.
    pub fn new(id: u32, size_pages: u64) -> Shmem {
        Shmem {
            id,
            pages: Mutex::new(HashMap::new()),
            size_pages,
            users: AtomicU64::new(1),
        }
    }

    /// Adds a mapping user.
    pub fn get(&self) {
        self.users.fetch_add(1, Relaxed);
    }

    /// Drops a mapping user; true when it was the last one.
    pub fn put(&self) -> bool {
        self.users.fetch_sub(1, Relaxed) == 1
    }

    /// Removes and returns every cached page.
    pub fn take_pages(&self) -> Vec<u64> {
        self.pages.lock().drain().map(|(_, p)| p).collect()
    }
}
