//! What the host kernel shows about a process: `/proc/PID/smaps`, `/proc/PID/status`,
//! `/proc/PID/pagemap` and `/proc/kpageflags`, parsed into the backend's views.
//!
//! Folio order is derived from kpageflags: a compound page's head has KPF_COMPOUND_HEAD and
//! its tails KPF_COMPOUND_TAIL, so the folio is the run from the head over the tails.

use scenario::backend::VmaView;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// pagemap: page present.
pub const PM_PRESENT: u64 = 1 << 63;
/// pagemap: exclusively mapped.
pub const PM_EXCLUSIVE: u64 = 1 << 56;
/// pagemap bit 62: the entry is a swap entry.
pub const PM_SWAP: u64 = 1 << 62;
/// pagemap: the PFN bits.
pub const PM_PFN: u64 = (1 << 55) - 1;
/// kpageflags: the head page of a compound page (a large folio).
pub const KPF_COMPOUND_HEAD: u64 = 1 << 15;
/// kpageflags: a tail page of a compound page.
pub const KPF_COMPOUND_TAIL: u64 = 1 << 16;
/// Pages looked at around a compound page (orders up to 10).
const MAX_FOLIO_PAGES: u64 = 1024;

/// Parses `/proc/PID/smaps` text.
pub fn parse_smaps(text: &str) -> Vec<VmaView> {
    parse_smaps_named(text)
        .into_iter()
        .map(|(v, _)| v)
        .collect()
}

/// Parses `/proc/PID/smaps` text, with each VMA's name column (empty for anonymous
/// memory; `/dev/zero (deleted)` for shared anonymous memory; a file's path).
pub fn parse_smaps_named(text: &str) -> Vec<(VmaView, String)> {
    let mut out: Vec<(VmaView, String)> = Vec::new();
    for line in text.lines() {
        if let Some(v) = parse_header(line) {
            out.push((v, header_name(line).to_string()));
            continue;
        }
        let Some((cur, _)) = out.last_mut() else {
            continue;
        };
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        if key == "VmFlags" {
            cur.locked = rest.split_whitespace().any(|f| f == "lo");
            continue;
        }
        if key == "THPeligible" {
            // A flag, not a size.
            cur.smaps.thp_eligible = u64::from(rest.trim() == "1");
            continue;
        }
        // The struct's one table of line names (`usermm::views::Smaps::line_mut`); a line
        // it does not hold (VmFlags, a newer kernel's) is passed over.
        if let (Some(bytes), Some(line)) = (parse_kb(rest), cur.smaps.line_mut(key)) {
            *line = bytes;
        }
    }
    out
}

fn parse_header(line: &str) -> Option<VmaView> {
    let mut it = line.split_whitespace();
    let (s, e) = it.next()?.split_once('-')?;
    let start = u64::from_str_radix(s, 16).ok()?;
    let end = u64::from_str_radix(e, 16).ok()?;
    let perms = it.next()?;
    if perms.len() != 4 {
        return None;
    }
    Some(VmaView {
        start,
        end,
        perms: perms.to_string(),
        ..VmaView::default()
    })
}

/// The name column of a maps header line: what follows the inode (spaces kept).
fn header_name(line: &str) -> &str {
    let mut rest = line;
    for _ in 0..5 {
        rest = rest.trim_start();
        match rest.find(char::is_whitespace) {
            Some(i) => rest = &rest[i..],
            None => return "",
        }
    }
    rest.trim()
}

fn parse_kb(rest: &str) -> Option<u64> {
    let mut it = rest.split_whitespace();
    let n: u64 = it.next()?.parse().ok()?;
    (it.next()? == "kB").then_some(n * 1024)
}

/// A `kB` line of `/proc/PID/status` (or `smaps_rollup`), in bytes.
pub fn status_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(parse_kb)
}

/// [`status_field`] in kB, 0 where the line is absent or unreadable (the host side's
/// counters: bench's host cells and `usermm record`'s exit snapshots).
pub fn status_kb(text: &str, key: &str) -> u64 {
    status_field(text, key).map_or(0, |bytes| bytes >> 10)
}

/// A `/proc/vmstat` counter (`None` where the line is absent or unreadable).
pub fn vmstat(name: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/vmstat").ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The `Tgid:` line of `/proc/PID/status`: the thread group (process) a task belongs to.
pub fn status_tgid(text: &str) -> Option<i32> {
    text.lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

fn read_words(f: &File, index: u64, out: &mut [u64]) -> io::Result<()> {
    let mut buf = vec![0u8; out.len() * 8];
    f.read_exact_at(&mut buf, index * 8)?;
    for (w, c) in out.iter_mut().zip(buf.chunks_exact(8)) {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        *w = u64::from_le_bytes(b);
    }
    Ok(())
}

/// The pagemap entries of `count` pages from virtual page `vpn`.
pub fn pagemap(f: &File, vpn: u64, count: usize) -> io::Result<Vec<u64>> {
    let mut out = vec![0u64; count];
    read_words(f, vpn, &mut out)?;
    Ok(out)
}

/// pagemap entries read at once by [`scan_pagemap`] (4 KiB): its memory is bounded
/// whatever the size of the range.
pub const PAGEMAP_CHUNK: usize = 512;

/// Calls `visit(vpn, entry)` for the pagemap entry of each of the `count` pages from virtual
/// page `vpn`, in order, reading [`PAGEMAP_CHUNK`] entries at a time into a stack buffer.
pub fn scan_pagemap(
    f: &File,
    vpn: u64,
    count: u64,
    mut visit: impl FnMut(u64, u64),
) -> io::Result<()> {
    let mut buf = [0u8; PAGEMAP_CHUNK * 8];
    let mut done = 0u64;
    while done < count {
        let n = (count - done).min(PAGEMAP_CHUNK as u64) as usize;
        let first = vpn + done;
        let offset = first
            .checked_mul(8)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let bytes = &mut buf[..n * 8];
        f.read_exact_at(bytes, offset)?;
        for (i, c) in bytes.chunks_exact(8).enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            visit(first + i as u64, u64::from_le_bytes(w));
        }
        done += n as u64;
    }
    Ok(())
}

/// The kpageflags word of `pfn`.
pub fn kpageflags(f: &File, pfn: u64) -> io::Result<u64> {
    let mut w = [0u64; 1];
    read_words(f, pfn, &mut w)?;
    Ok(w[0])
}

/// Order of the folio that contains `pfn` (whose flags are `flags`).
///
/// The words around the page are read in growing chunks (`FOLIO_SCAN_FIRST` words, then
/// twice as many each time) up to `MAX_FOLIO_PAGES`: a long trace's oracle run reads the
/// order of thousands of sampled pages after every statement, and reading the whole
/// 1024-page neighbourhood of each (what a 2 MiB folio needs) made a 64K folio cost
/// sixty times its size in kernel `stable_page_flags` calls.
pub fn folio_order(f: &File, pfn: u64, flags: u64) -> io::Result<u32> {
    if flags & (KPF_COMPOUND_HEAD | KPF_COMPOUND_TAIL) == 0 {
        return Ok(0);
    }
    let head = if flags & KPF_COMPOUND_HEAD != 0 {
        pfn
    } else {
        find_head(f, pfn)?
    };
    let mut n = 1u64;
    let mut chunk = FOLIO_SCAN_FIRST;
    while n < MAX_FOLIO_PAGES {
        let mut tails = vec![0u64; chunk.min(MAX_FOLIO_PAGES - n) as usize];
        read_words(f, head + n, &mut tails)?;
        let t = tails
            .iter()
            .take_while(|w| **w & KPF_COMPOUND_TAIL != 0)
            .count();
        n += t as u64;
        if t < tails.len() {
            break;
        }
        chunk *= 2;
    }
    Ok(63 - n.leading_zeros())
}

/// Words [`folio_order`] reads first on either side of a page.
const FOLIO_SCAN_FIRST: u64 = 16;

/// The compound head at or before `pfn`, at most `MAX_FOLIO_PAGES - 1` pages back: the
/// nearest one, looked for in growing chunks as [`folio_order`] reads its tails.
fn find_head(f: &File, pfn: u64) -> io::Result<u64> {
    let floor = pfn.saturating_sub(MAX_FOLIO_PAGES - 1);
    let mut end = pfn;
    let mut chunk = FOLIO_SCAN_FIRST;
    while end > floor {
        let first = end.saturating_sub(chunk).max(floor);
        let mut before = vec![0u64; (end - first) as usize];
        read_words(f, first, &mut before)?;
        if let Some(i) = before.iter().rposition(|w| w & KPF_COMPOUND_HEAD != 0) {
            return Ok(first + i as u64);
        }
        end = first;
        chunk *= 2;
    }
    Err(io::Error::other(format!(
        "no compound head before pfn {pfn:#x}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_smaps_and_status() {
        let text = "\
10000000-10004000 rw-p 00000000 00:00 0 
Size:                 16 kB
Rss:                   8 kB
Pss:                   4 kB
Shared_Dirty:          4 kB
Private_Dirty:         4 kB
Anonymous:             8 kB
AnonHugePages:         0 kB
ShmemPmdMapped:     2048 kB
FilePmdMapped:         4 kB
Locked:                0 kB
VmFlags: rd wr mr mw me lo ac
7f0000000000-7f0000001000 r--s 00000000 00:01 5   /dev/zero (deleted)
Size:                  4 kB
VmFlags: rd sh mr mw me ms
";
        let v = parse_smaps(text);
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[0].start, v[0].end, v[0].perms.as_str()),
            (0x1000_0000, 0x1000_4000, "rw-p")
        );
        assert!(v[0].locked && !v[1].locked);
        assert_eq!(v[0].smaps.rss, 8192);
        assert_eq!(v[0].smaps.pss, 4096);
        assert_eq!(v[0].smaps.shmem_pmd_mapped, 2 << 20);
        assert_eq!(v[0].smaps.file_pmd_mapped, 4096);
        assert_eq!(v[1].perms, "r--s");
        let named = parse_smaps_named(text);
        assert_eq!(named[0].1, "");
        assert_eq!(named[1].1, "/dev/zero (deleted)");
        assert_eq!(
            header_name("1000-2000 rw-s 00000000 00:1a 7   /dev/shm/d/#7 (deleted)"),
            "/dev/shm/d/#7 (deleted)"
        );
        assert_eq!(
            status_field("VmPin:\t     12 kB\nVmLck: 0 kB\n", "VmPin"),
            Some(12288)
        );
    }

    #[test]
    fn status_kb_and_tgid() {
        let status = "Name:\tpython3\nTgid:\t4242\nPid:\t4243\nRssAnon:\t    1536 kB\n";
        assert_eq!(status_kb(status, "RssAnon"), 1536);
        // Absent, or a line without its unit: 0 (the host's counter is unknown).
        assert_eq!(status_kb(status, "RssFile"), 0);
        assert_eq!(status_kb("RssFile:\t12\n", "RssFile"), 0);
        assert_eq!(status_tgid(status), Some(4242));
        assert_eq!(status_tgid("Pid:\t1\n"), None);
        assert_eq!(status_tgid("Tgid:\tx\n"), None);
    }
}
