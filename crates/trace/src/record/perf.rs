//! Decoding what perf recorded: each CPU's ring data split into records (samples of the
//! syscall and fault tracepoints, `FORK`/`EXIT`/`COMM`/`MMAP2` side-band records), then
//! merged by time into the trace's [`Event`]s with what ptrace learnt.

use super::*;

/// One decoded perf record.
#[derive(Debug)]
enum Rec {
    Sample {
        id: u64,
        pid: u32,
        tid: u32,
        raw: Vec<u8>,
    },
    Mmap2 {
        tid: u32,
        map: LastMap,
    },
    Comm {
        pid: u32,
        exec: bool,
    },
    Fork {
        pid: u32,
        ppid: u32,
    },
    Exit {
        pid: u32,
        tid: u32,
    },
    Lost(u64),
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    b.get(o..o + 4)
        .map_or(0, |s| u32::from_le_bytes(s.try_into().unwrap_or([0; 4])))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    b.get(o..o + 8)
        .map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
}

fn field(raw: &[u8], (o, s): (usize, usize)) -> u64 {
    match s {
        8 => u64_at(raw, o),
        4 => u32_at(raw, o) as i32 as i64 as u64,
        _ => 0,
    }
}

/// Splits one CPU's ring data into (time, record).
fn parse_cpu(data: &[u8], out: &mut Vec<(u64, Rec)>) {
    parse_records(data, out, false);
}

/// Appends the records of `data` to `out` (only the `MMAP2` ones with `only_mmap2`), up to
/// the last whole one; returns the bytes they take.
fn parse_records(data: &[u8], out: &mut Vec<(u64, Rec)>, only_mmap2: bool) -> usize {
    let mut at = 0;
    while at + 8 <= data.len() {
        let ty = u32_at(data, at);
        let misc = u16::from_le_bytes([data[at + 4], data[at + 5]]);
        let size = u16::from_le_bytes([data[at + 6], data[at + 7]]) as usize;
        if size < 8 || at + size > data.len() {
            break;
        }
        let r = &data[at..at + size];
        at += size;
        if only_mmap2 && ty != 10 {
            continue;
        }
        // sample_id_all tail: pid, tid (8), time (8), identifier (8).
        let tail_time = if size >= 32 { u64_at(r, size - 16) } else { 0 };
        let rec = match ty {
            9 => {
                let id = u64_at(r, 8);
                let pid = u32_at(r, 16);
                let tid = u32_at(r, 20);
                let time = u64_at(r, 24);
                let n = u32_at(r, 32) as usize;
                let raw = r.get(36..36 + n).unwrap_or(&[]).to_vec();
                out.push((time, Rec::Sample { id, pid, tid, raw }));
                continue;
            }
            10 => {
                let tid = u32_at(r, 12);
                let addr = u64_at(r, 16);
                let len = u64_at(r, 24);
                let pgoff = u64_at(r, 32);
                let build_id = misc & (1 << 14) != 0;
                let (dev, ino, generation) = if build_id {
                    (0, 0, 0)
                } else {
                    (
                        dev_of(u32_at(r, 40) as u64, u32_at(r, 44) as u64),
                        u64_at(r, 48),
                        u64_at(r, 56),
                    )
                };
                let name = r.get(72..size.saturating_sub(24)).unwrap_or(&[]);
                let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
                Rec::Mmap2 {
                    tid,
                    map: LastMap {
                        addr,
                        pgoff,
                        dev,
                        ino,
                        generation,
                        len,
                        path: String::from_utf8_lossy(&name[..end]).into_owned(),
                    },
                }
            }
            3 => Rec::Comm {
                pid: u32_at(r, 8),
                exec: misc & (1 << 13) != 0,
            },
            7 => Rec::Fork {
                pid: u32_at(r, 8),
                ppid: u32_at(r, 12),
            },
            4 => Rec::Exit {
                pid: u32_at(r, 8),
                tid: u32_at(r, 16),
            },
            2 => Rec::Lost(u64_at(r, 16)),
            _ => continue,
        };
        out.push((tail_time, rec));
    }
    at
}

/// The files (device, inode, path, the mapping's end in the file) of the `MMAP2` records in
/// `data` from byte `*from`, which moves past the last whole record.
pub(super) fn new_files(data: &[u8], from: &mut usize) -> Vec<(u64, u64, String, u64)> {
    let mut recs = Vec::new();
    let used = parse_records(&data[(*from).min(data.len())..], &mut recs, true);
    *from += used;
    recs.into_iter()
        .filter_map(|(_, r)| match r {
            Rec::Mmap2 { map, .. } if map.ino != 0 => Some((
                map.dev,
                map.ino,
                map.path,
                map.pgoff.saturating_add(map.len),
            )),
            _ => None,
        })
        .collect()
}

/// A `PERF_RECORD_MMAP2` (a thread's last one is the VMA its `mmap` made or grew).
#[derive(Debug)]
struct LastMap {
    addr: u64,
    /// The VMA's offset in the file, bytes (perf reports `vm_pgoff << PAGE_SHIFT`).
    pgoff: u64,
    dev: u64,
    ino: u64,
    /// The inode's generation (`ino_generation`): tells a reused inode number apart.
    generation: u64,
    len: u64,
    path: String,
}

impl LastMap {
    /// Whether this record is the VMA of an `mmap` that returned `ret`: one that starts
    /// there, or one the new mapping merged into (a mapping placed right after a VMA of the
    /// same file at the next offset extends it, and perf reports the merged VMA: Java's
    /// second `classes.jsa` mapping). Its extent covers the new mapping's either way.
    fn names(&self, ret: u64) -> bool {
        self.ino != 0 && self.addr <= ret && ret - self.addr < self.len
    }
}

pub(super) fn build_events(
    root: u32,
    cpus: &[Vec<u8>],
    ids: &HashMap<u64, usize>,
    tps: &[TpFormat],
    mut side: Side,
    mut files: Files,
    summary: &mut RecordSummary,
) -> Vec<Event> {
    let mut recs = Vec::new();
    for c in cpus {
        parse_cpu(c, &mut recs);
    }
    // Each CPU's records are in time order; a stable sort merges them.
    recs.sort_by_key(|(t, _)| *t);
    let mut out = Vec::new();
    let mut pending: HashMap<u32, (usize, Vec<u64>)> = HashMap::new();
    let mut last_map: HashMap<u32, LastMap> = HashMap::new();
    let emit_files = |files: &mut Files, out: &mut Vec<Event>| {
        while files.emitted < files.list.len() {
            let (dev, ino, size, path) = files.list[files.emitted].clone();
            out.push(Event::File {
                id: files.emitted as u32,
                dev,
                ino,
                size,
                path,
            });
            if let Some(folios) = files.cache_for(dev, ino, size).filter(|f| !f.is_empty()) {
                out.push(Event::Cache {
                    file: files.emitted as u32,
                    folios: folios.to_vec(),
                });
            }
            files.emitted += 1;
        }
    };
    let mut take_image = |pid: u32, files: &mut Files, out: &mut Vec<Event>| {
        let image = side
            .images
            .get_mut(&pid)
            .and_then(|q| q.pop_front())
            .unwrap_or_default();
        emit_files(files, out);
        out.push(Event::Exec { pid, image });
    };
    out.push(Event::Spawn { pid: root });
    take_image(root, &mut files, &mut out);
    let mut root_exec_seen = false;
    let mut procs: HashSet<u32> = HashSet::from([root]);
    // Each fault signal goes right after the records stamped before its delivery (its fault's
    // among them).
    let mut signals = std::mem::take(&mut side.signals).into_iter().peekable();
    for (t, rec) in recs {
        while let Some((_, pid, signo, addr)) = signals.next_if(|s| s.0 <= t) {
            out.push(Event::Signal { pid, signo, addr });
        }
        match rec {
            Rec::Lost(n) => {
                summary.lost = summary.lost.saturating_add(n);
                out.push(Event::Lost { count: n });
            }
            Rec::Comm { pid, exec: true } => {
                if pid == root && !root_exec_seen {
                    root_exec_seen = true;
                    continue;
                }
                if procs.contains(&pid) {
                    take_image(pid, &mut files, &mut out);
                }
            }
            Rec::Comm { .. } => {}
            Rec::Fork { pid, ppid } => {
                if pid != ppid && procs.contains(&ppid) {
                    procs.insert(pid);
                    let shares = side.shares_vm.get(&pid).copied().unwrap_or(false);
                    out.push(Event::Fork {
                        parent: ppid,
                        child: pid,
                        flags: if shares { format::FORK_SHARES_VM } else { 0 },
                    });
                }
            }
            Rec::Exit { pid, tid } => {
                if pid == tid && procs.remove(&pid) {
                    if let Some((a, f, h)) = side.rss.get_mut(&pid).and_then(|q| q.pop_front()) {
                        out.push(Event::Validate {
                            pid,
                            rss_anon_kb: a,
                            rss_file_kb: f,
                            anon_huge_kb: h,
                        });
                    }
                    out.push(Event::Exit { pid });
                }
            }
            Rec::Mmap2 { tid, map } => {
                last_map.insert(tid, map);
            }
            Rec::Sample { id, pid, tid, raw } => {
                let Some(&i) = ids.get(&id) else {
                    continue;
                };
                if !procs.contains(&pid) {
                    continue;
                }
                let f = &tps[i];
                match f.tp {
                    Tp::Enter(s) => {
                        let args = f.fields.iter().map(|&fl| field(&raw, fl)).collect();
                        pending.insert(tid, (s, args));
                        if s == 0 {
                            last_map.remove(&tid);
                        }
                    }
                    Tp::Exit(s) => {
                        let ret = field(&raw, f.fields[0]) as i64;
                        let Some((s0, a)) = pending.remove(&tid) else {
                            continue;
                        };
                        if s0 != s {
                            continue;
                        }
                        let g = |k: usize| a.get(k).copied().unwrap_or(0);
                        let e = match SYSCALLS[s] {
                            "mmap" => {
                                let flags = g(3) as u32;
                                let fd = g(4) as i64 as i32;
                                let mut file = None;
                                if !usermm::MapFlags(flags).anonymous() && fd >= 0 && ret >= 0 {
                                    match last_map.remove(&tid) {
                                        Some(m) if m.names(ret as u64) => {
                                            file = Some(files.id(
                                                m.dev,
                                                m.ino,
                                                Some(m.generation),
                                                &m.path,
                                                m.pgoff + m.len,
                                            ));
                                            emit_files(&mut files, &mut out);
                                        }
                                        _ => summary.file_as_anon += 1,
                                    }
                                }
                                Event::Mmap {
                                    pid,
                                    addr: g(0),
                                    len: g(1),
                                    prot: g(2) as u32,
                                    flags,
                                    fd,
                                    offset: g(5),
                                    file,
                                    ret,
                                }
                            }
                            "munmap" => Event::Munmap {
                                pid,
                                addr: g(0),
                                len: g(1),
                                ret,
                            },
                            "mprotect" => Event::Mprotect {
                                pid,
                                addr: g(0),
                                len: g(1),
                                prot: g(2) as u32,
                                ret,
                            },
                            "mremap" => Event::Mremap {
                                pid,
                                addr: g(0),
                                old_len: g(1),
                                new_len: g(2),
                                flags: g(3) as u32,
                                new_addr: g(4),
                                ret,
                            },
                            "brk" => Event::Brk {
                                pid,
                                brk: g(0),
                                ret,
                            },
                            "madvise" => Event::Madvise {
                                pid,
                                addr: g(0),
                                len: g(1),
                                advice: g(2) as u32,
                                ret,
                            },
                            "mlock" => Event::Mlock {
                                pid,
                                addr: g(0),
                                len: g(1),
                                flags: 0,
                                ret,
                            },
                            "mlock2" => Event::Mlock {
                                pid,
                                addr: g(0),
                                len: g(1),
                                flags: g(2) as u32,
                                ret,
                            },
                            "munlock" => Event::Munlock {
                                pid,
                                addr: g(0),
                                len: g(1),
                                ret,
                            },
                            "mlockall" => Event::Mlockall {
                                pid,
                                flags: g(0) as u32,
                                ret,
                            },
                            _ => Event::Munlockall { pid, ret },
                        };
                        out.push(e);
                    }
                    Tp::FaultUser | Tp::FaultKernel => {
                        let addr = field(&raw, f.fields[0]);
                        let code = field(&raw, f.fields[1]);
                        if addr >= crate::USER_TOP {
                            summary.faults_outside_user += 1;
                            continue;
                        }
                        out.push(Event::Fault {
                            pid,
                            addr: addr & !4095,
                            write: code & 2 != 0,
                            user: f.tp == Tp::FaultUser,
                        });
                    }
                }
            }
        }
    }
    out.extend(signals.map(|(_, pid, signo, addr)| Event::Signal { pid, signo, addr }));
    summary.processes = out
        .iter()
        .filter(|e| matches!(e, Event::Spawn { .. } | Event::Fork { .. }))
        .count() as u64;
    out
}
