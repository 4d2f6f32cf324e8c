//! Keeping a host server's own mappings out of the scenario's way.
//!
//! A server is a fork of the controller, so its address space already holds the
//! controller's program, libraries, heap and stacks. The engine's processes start empty. To
//! make the scenario's mappings land, merge and align as in an empty process, a new server:
//! - fills every hole between its own mappings in the mmap area, and the space below the
//!   lowest of them down to a 1 GiB boundary, with *fences*: PROT_NONE shared anonymous
//!   mappings, which never merge with anything and are never chosen by a top-down search
//!   again; so the scenario's first `mmap` lands right below a 1 GiB boundary, as the
//!   engine's lands right below its aligned `mmap_base`;
//! - moves its heap (`start_brk`/`brk`) to an empty place, so the scenario's `brk` grows a
//!   heap of its own: at the engine's start address when that is free.
//!
//! All of it runs in the freshly forked server, reading `/proc/self/maps` into stack
//! buffers: nothing here allocates.

use crate::sys;

/// The engine's heap start (`usermm::machine::START_BRK`).
const ENGINE_START_BRK: u64 = usermm::machine::START_BRK;
/// Alignment of the bottom fence (larger than any folio).
const FENCE_ALIGN: u64 = 1 << 30;
const PAGE: u64 = 4096;
/// Mappings read from /proc/self/maps at most.
const MAX_MAPS: usize = 2048;
/// Bytes of /proc/self/maps read at most.
const MAPS_BUF: usize = 192 * 1024;

/// Flags of a fence mapping.
const FENCE_FLAGS: i32 = libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;

/// One mapping: start, end, and whether it is the main stack (or above it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Range {
    /// Start address.
    pub start: u64,
    /// End address.
    pub end: u64,
    /// `[stack]`.
    pub stack: bool,
}

/// Parses the address ranges of `/proc/PID/maps` text into `out`; returns how many.
pub fn parse_maps(text: &[u8], out: &mut [Range]) -> usize {
    let mut n = 0;
    for line in text.split(|&c| c == b'\n') {
        if n == out.len() {
            break;
        }
        let Some((start, end)) = parse_range(line) else {
            continue;
        };
        if start >= 0xffff_8000_0000_0000 {
            continue; // [vsyscall]
        }
        out[n] = Range {
            start,
            end,
            stack: contains(line, b"[stack]"),
        };
        n += 1;
    }
    out[..n].sort_unstable_by_key(|r| r.start);
    n
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn parse_range(line: &[u8]) -> Option<(u64, u64)> {
    let field = line.split(|&c| c == b' ').next()?;
    let mut parts = field.split(|&c| c == b'-');
    let start = parse_hex(parts.next()?)?;
    let end = parse_hex(parts.next()?)?;
    Some((start, end))
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    let mut v = 0u64;
    for &c in s {
        let d = (c as char).to_digit(16)?;
        v = v << 4 | u64::from(d);
    }
    Some(v)
}

/// The mmap area of a sorted map list: the mappings above the largest gap and below the
/// stack. Returns the index range.
pub fn mmap_area(maps: &[Range]) -> (usize, usize) {
    let top = maps.iter().position(|r| r.stack).unwrap_or(maps.len());
    let mut best = (0u64, 0usize);
    for i in 1..top {
        let gap = maps[i].start.saturating_sub(maps[i - 1].end);
        if gap > best.0 {
            best = (gap, i);
        }
    }
    (best.1, top)
}

/// Where the scenario's heap goes: the engine's start address if it is far from every
/// mapping, else the middle of the largest gap.
pub fn brk_area(maps: &[Range]) -> u64 {
    let (lo, hi) = (
        ENGINE_START_BRK - FENCE_ALIGN,
        ENGINE_START_BRK + 64 * FENCE_ALIGN,
    );
    if !maps.iter().any(|r| r.start < hi && lo < r.end) {
        return ENGINE_START_BRK;
    }
    let (i, _) = mmap_area(maps);
    let (below, above) = match i {
        0 => (0, maps.first().map_or(1 << 46, |r| r.start)),
        _ => (maps[i - 1].end, maps[i].start),
    };
    (below / 2 + above / 2) & !(FENCE_ALIGN - 1)
}

fn fence(start: u64, end: u64) {
    if start < end {
        let _ = sys::mmap(
            start,
            end - start,
            libc::PROT_NONE,
            FENCE_FLAGS | libc::MAP_FIXED_NOREPLACE,
        );
    }
}

/// Builds the fences and moves the heap (in a new server, before dropping privileges).
pub fn prepare() -> Result<(), sys::Errno> {
    let mut text = [0u8; MAPS_BUF];
    let len = read_self_maps(&mut text)?;
    let mut maps = [Range::default(); MAX_MAPS];
    let n = parse_maps(&text[..len], &mut maps);
    let maps = &maps[..n];
    move_heap(brk_area(maps))?;
    let (first, top) = mmap_area(maps);
    let Some(lowest) = maps.get(first).filter(|_| first < top).map(|r| r.start) else {
        return Ok(());
    };
    for w in maps[first..top].windows(2) {
        fence(w[0].end, w[1].start);
    }
    fence((lowest - 1) & !(FENCE_ALIGN - 1), lowest);
    fill_missed_holes(maps, lowest);
    Ok(())
}

/// Probes where a top-down search lands; while it is above the bottom fence, fences the
/// hole it found (one the map list did not show, e.g. below `mmap_base`).
fn fill_missed_holes(maps: &[Range], lowest: u64) {
    for _ in 0..256 {
        let Ok(p) = sys::mmap(0, PAGE, libc::PROT_NONE, FENCE_FLAGS) else {
            return;
        };
        if p < lowest {
            let _ = sys::munmap(p, PAGE);
            return;
        }
        let floor = maps
            .iter()
            .filter(|r| r.end <= p)
            .map(|r| r.end)
            .max()
            .unwrap_or(p);
        fence(floor, p);
    }
}

/// Moves start_brk and brk to `addr`, keeping every other field of the memory map (read
/// from `/proc/self/stat`).
fn move_heap(addr: u64) -> Result<(), sys::Errno> {
    let mut text = [0u8; 4096];
    let len = read_file(c"/proc/self/stat", &mut text)?;
    let f = stat_fields(&text[..len]).ok_or(libc::EINVAL)?;
    let map = sys::MmMap {
        start_code: f[26],
        end_code: f[27],
        start_data: f[45],
        end_data: f[46],
        start_brk: addr,
        brk: addr,
        start_stack: f[28],
        arg_start: f[48],
        arg_end: f[49],
        env_start: f[50],
        env_end: f[51],
        auxv: 0,
        auxv_size: 0,
        exe_fd: u32::MAX,
    };
    sys::set_mm_map(&map)
}

/// The numeric fields of `/proc/PID/stat`, indexed by their 1-based number in proc(5)
/// (fields 1 and 2, the pid and the command, read as 0).
pub fn stat_fields(text: &[u8]) -> Option<[u64; 53]> {
    let close = text.iter().rposition(|&c| c == b')')?;
    let mut out = [0u64; 53];
    let fields = text[close + 1..]
        .split(|c| c.is_ascii_whitespace())
        .filter(|t| !t.is_empty());
    for (i, tok) in fields.enumerate().skip(1) {
        let Some(slot) = out.get_mut(i + 3) else {
            break;
        };
        *slot = parse_dec(tok).unwrap_or(0);
    }
    Some(out)
}

fn parse_dec(s: &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for &c in s {
        v = v
            .checked_mul(10)?
            .checked_add(u64::from((c as char).to_digit(10)?))?;
    }
    Some(v)
}

fn read_self_maps(buf: &mut [u8]) -> Result<usize, sys::Errno> {
    read_file(c"/proc/self/maps", buf)
}

fn read_file(path: &std::ffi::CStr, buf: &mut [u8]) -> Result<usize, sys::Errno> {
    let fd = sys::open_read(path)?;
    let mut len = 0;
    while len < buf.len() {
        match sys::read(fd, &mut buf[len..]) {
            Ok(0) => break,
            Ok(k) => len += k,
            Err(libc::EINTR) => continue,
            Err(e) => {
                sys::close(fd);
                return Err(e);
            }
        }
    }
    sys::close(fd);
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
5600a0000000-5600a0010000 r-xp 00000000 08:01 1 /bin/x
5600a0010000-5600a0020000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000100000 r-xp 00000000 08:01 2 /lib/libc.so
7f0000200000-7f0000300000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]
";

    #[test]
    fn finds_mmap_area_and_heap_place() {
        let mut maps = [Range::default(); 16];
        let n = parse_maps(MAPS.as_bytes(), &mut maps);
        assert_eq!(n, 5);
        assert!(maps[4].stack);
        assert_eq!(mmap_area(&maps[..n]), (2, 4));
        assert_eq!(brk_area(&maps[..n]), ENGINE_START_BRK);
    }

    #[test]
    fn reads_stat_fields() {
        let stat =
            b"42 (a b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26";
        let f = stat_fields(stat).unwrap_or([0; 53]);
        assert_eq!((f[4], f[28]), (1, 25));
    }
}
