//! The host side of the anon-cow benchmark (`crate::anon_cow`): the writers' page order
//! ([`Order`], [`page_order`]) and the writers themselves (`host_writers`), forked by the
//! agent from the process that populated the area.

use super::errno_text;
use super::measure::{fork_with_socket, Forked};
use super::region::Region;
use super::vmstat;
use oracle::sys;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;
/// The byte every instance writes.
pub(crate) const FILL: u8 = 0x5a;
/// Seed of the `rand` page orders (instance `i` uses `SEED ^ i`).
const SEED: u64 = 0x5eed_0003_c0de_0073;

/// The page order of the writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Order {
    /// Ascending (`case-anon-cow-seq`).
    Seq,
    /// A pseudo-random permutation of the pages (`case-anon-cow-rand`).
    Rand,
}

/// Both, in the seed's column order.
pub const ORDERS: [Order; 2] = [Order::Seq, Order::Rand];

impl Order {
    /// The row label.
    pub fn name(self) -> &'static str {
        match self {
            Order::Seq => "seq",
            Order::Rand => "rand",
        }
    }
}

/// splitmix64: a small, fixed, portable generator (the permutation must not depend on a crate
/// version).
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Byte offsets of the pages of `area` in the order instance `instance` writes them (`seq`:
/// ascending; `rand`: a Fisher–Yates shuffle seeded by the instance).
pub fn page_order(area: u64, order: Order, instance: usize) -> Vec<u64> {
    let mut pages: Vec<u64> = (0..area / PAGE).map(|i| i * PAGE).collect();
    if order == Order::Rand {
        let mut st = SEED ^ instance as u64;
        for i in (1..pages.len()).rev() {
            let j = (splitmix(&mut st) % (i as u64 + 1)) as usize;
            pages.swap(i, j);
        }
    }
    pages
}

/// Summed throughput: `Σ area / tᵢ`.
pub(crate) fn throughput(area: u64, times: &[Duration]) -> f64 {
    times
        .iter()
        .map(|t| area as f64 / t.as_secs_f64().max(1e-9))
        .sum()
}

/// A forked host child that waits for the start, writes the area in its page order, and
/// reports its elapsed time.
struct HostChild {
    pid: i32,
    /// Our end of its socket: one ready byte, then its elapsed nanoseconds (8 bytes).
    fd: i32,
}

impl HostChild {
    /// Forks an instance that writes `pages` of `r`; it starts when `go_read` reads EOF (the
    /// parent closed `go_write`, which the child closes at once).
    fn fork(r: &Region, pages: &[u64], go_read: i32, go_write: i32) -> Result<HostChild, String> {
        let (pid, ours) = match fork_with_socket()? {
            Forked::Parent { pid, fd } => (pid, fd),
            Forked::Child { fd: theirs } => {
                // The child: only allocation-free calls (this process may have other threads).
                sys::close(go_write);
                let ok = sys::write(theirs, b"r") == Ok(1);
                let mut b = [0u8; 1];
                let _ = sys::read(go_read, &mut b);
                let t = Instant::now();
                let mut failed = !ok;
                for &off in pages {
                    if sys::fill(r.addr + off, PAGE, FILL).is_err() {
                        failed = true;
                        break;
                    }
                }
                let ns = t.elapsed().as_nanos() as u64;
                let _ = sys::write(theirs, &ns.to_le_bytes());
                sys::exit_now(i32::from(failed));
            }
        };
        Ok(HostChild { pid, fd: ours })
    }

    /// Reads exactly `buf.len()` bytes from the child.
    fn read_exact(&self, buf: &mut [u8]) -> Result<(), String> {
        let mut got = 0;
        while got < buf.len() {
            match sys::read(self.fd, &mut buf[got..]) {
                Ok(0) => return Err("an instance died".into()),
                Ok(k) => got += k,
                Err(4) => {} // EINTR
                Err(e) => return Err(errno_text("read", e)),
            }
        }
        Ok(())
    }

    /// Waits for the child; its elapsed time.
    fn finish(self) -> Result<Duration, String> {
        let mut b = [0u8; 8];
        let r = self.read_exact(&mut b);
        sys::close(self.fd);
        let status = sys::wait_child(self.pid).map_err(|e| errno_text("waitpid", e))?;
        r?;
        if status != 0 {
            return Err(format!("an instance failed (status {status})"));
        }
        Ok(Duration::from_nanos(u64::from_le_bytes(b)))
    }
}

/// The host side of one repetition, in the process that populated `r` (the host agent's):
/// forks `instances` writers of `r` (each in its [`page_order`]), starts them together and
/// sums their throughput. Adds `host_thp_split_pmd` (machine-wide, over the writes) to `c`.
pub(crate) fn host_writers(
    r: &Region,
    order: Order,
    instances: usize,
    c: &mut BTreeMap<String, u64>,
) -> Result<f64, String> {
    let area = r.len;
    let orders: Vec<Vec<u64>> = (0..instances).map(|i| page_order(area, order, i)).collect();
    let (go_write, go_read) = sys::socketpair().map_err(|e| errno_text("socketpair", e))?;
    let split0 = vmstat("thp_split_pmd").unwrap_or(0);
    let mut kids = Vec::new();
    let mut err = None;
    for pages in &orders {
        match HostChild::fork(r, pages, go_read, go_write) {
            Ok(k) => kids.push(k),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    // Every child is ready (or failed) before the start: its first byte.
    for k in &kids {
        let mut b = [0u8; 1];
        if let Err(e) = k.read_exact(&mut b) {
            err.get_or_insert(e);
        }
    }
    // Start: closing the last write end wakes every child's read with EOF at once.
    sys::close(go_write);
    let mut times = Vec::new();
    for k in kids {
        match k.finish() {
            Ok(t) => times.push(t),
            Err(e) => {
                err.get_or_insert(e);
            }
        }
    }
    sys::close(go_read);
    let split = vmstat("thp_split_pmd").unwrap_or(0).saturating_sub(split0);
    if let Some(e) = err {
        return Err(e);
    }
    c.insert("host_thp_split_pmd".to_string(), split);
    Ok(throughput(area, &times))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::PMD;

    #[test]
    fn page_orders_are_permutations_and_fixed() {
        let seq = page_order(8 << 20, Order::Seq, 0);
        assert_eq!(seq.len(), 2048);
        assert!(seq.windows(2).all(|w| w[1] == w[0] + PAGE));
        let r0 = page_order(8 << 20, Order::Rand, 0);
        let r1 = page_order(8 << 20, Order::Rand, 1);
        assert_ne!(r0, seq);
        assert_ne!(r0, r1);
        assert_eq!(r0, page_order(8 << 20, Order::Rand, 0));
        let mut sorted = r0.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, seq);
    }

    #[test]
    fn host_writers_copy_the_area_and_leave_the_parents_alone() {
        // In this process (the agent's part): two writers COW a small area; each child's
        // writes must land in its own copy, so the parent's bytes stay what it populated.
        let r = Region::anon(PMD).expect("mmap");
        r.populate().expect("populate");
        for order in ORDERS {
            let mut c = BTreeMap::new();
            let rate = host_writers(&r, order, 2, &mut c).expect("writers");
            assert!(rate.is_finite() && rate > 0.0, "{rate}");
            assert!(c.contains_key("host_thp_split_pmd"), "{c:?}");
            assert_eq!(sys::check_bytes(r.addr, r.len, 0), Ok(None), "{order:?}");
        }
    }

    #[test]
    fn throughput_sums_instances() {
        let t = [Duration::from_secs(1), Duration::from_secs(2)];
        assert_eq!(throughput(4096, &t), 4096.0 + 2048.0);
    }
}
