#!/usr/bin/env python3
"""analyze.py count < trace  -> "count key" lines for the kc_ops window (run.sh)
   analyze.py report OUTDIR  -> markdown tables: fixed / per page / per PTE table

count: events of the pid that wrote trace_marker "kcB", up to its "kcE"; events in hard or
soft interrupt context are keyed "irq:" (not part of the operation). A key is the event
name and the fields that tell its kind (order, item, cache name, call site, reason)."""
import collections, os, re, statistics, sys

LINE = re.compile(r'^\s*(.+?)-(\d+)\s+\[\d+\]\s+(\S+)\s+[\d.]+:\s+(\w+):\s?(.*)$')
FIELDS = {
    'mm_page_alloc': ['order'], 'mm_page_free': ['order'], 'mm_page_pcpu_drain': ['order'],
    'mm_page_alloc_zone_locked': ['order', 'percpu_refill'],
    'kmem_cache_alloc': ['name'], 'kmem_cache_free': ['name'],
    'kmalloc': ['call_site'], 'kfree': ['call_site'],
    'rss_stat': ['type'], 'mod_memcg_lruvec_state': ['item'], 'mod_memcg_state': ['item'],
    'count_memcg_events': ['item'], 'tlb_flush': ['reason'],
    'mmap_lock_acquire_returned': ['write'], 'percpu_alloc_percpu': ['call_site'],
    'percpu_free_percpu': [], 'mm_lru_insertion': ['lru'],
}


def key_of(ev, rest):
    parts = [ev]
    for f in FIELDS.get(ev, []):
        m = re.search(r'\b%s[=:](\S+)' % f, rest)
        if m:
            v = m.group(1)
            if f == 'call_site':
                v = v.split('+')[0]
            parts.append('%s=%s' % (f, v))
    if ev == 'tlb_flush':
        m = re.search(r'pages:(-?\d+)', rest)
        parts.append('pages=%s' % ('all' if m and m.group(1) == '-1' else 'range'))
    if ev == 'mod_memcg_lruvec_state':
        m = re.search(r'val=(-?\d+)', rest)
        parts.append('sign=%s' % ('-' if m and int(m.group(1)) < 0 else '+'))
    return ' '.join(parts)


def count(inp, out):
    active = None
    c = collections.Counter()
    for line in inp:
        m = LINE.match(line)
        if not m:
            continue
        comm, pid, flags, ev, rest = m.groups()
        pid = int(pid)
        if ev == 'tracing_mark_write':
            if rest.startswith('kcB'):
                active = pid
            elif rest.startswith('kcE') and pid == active:
                active = None
            continue
        if active is None or pid != active:
            continue
        irq = len(flags) > 2 and flags[2] in 'ZzHhs'
        c[('irq: ' if irq else '') + key_of(ev, rest)] += 1
    for k, v in sorted(c.items()):
        out.write('%d %s\n' % (v, k))


def names(outdir):
    """node_stat_item / vm_event_item / memcg_stat_item index -> name, from /proc/vmstat order."""
    keys = [l.split()[0] for l in open(os.path.join(outdir, 'vmstat.txt'))]
    node0 = keys.index('nr_inactive_anon')          # NR_LRU_BASE = 0
    ev0 = keys.index('pgpgin')                       # vm_event_item 0
    nnode = keys.index('nr_dirty_threshold') - node0   # NR_VM_NODE_STAT_ITEMS
    node = {i - node0: keys[i] for i in range(node0, node0 + nnode)}
    # memcg_stat_item follows the node items (include/linux/memcontrol.h, 6.18)
    for j, nm in enumerate(['MEMCG_SWAP', 'MEMCG_SOCK', 'MEMCG_PERCPU_B', 'MEMCG_VMALLOC',
                            'MEMCG_KMEM', 'MEMCG_ZSWAP_B', 'MEMCG_ZSWAPPED']):
        node[nnode + j] = nm
    return node, {i - ev0: keys[i] for i in range(ev0, len(keys))}


def pretty(k, node, ev):
    def sub(m):
        i = int(m.group(1))
        if k.startswith('count_memcg_events'):
            return 'item=' + ev.get(i, str(i))
        return 'item=' + node.get(i, 'memcg_item%d' % i)
    return re.sub(r'item=(\d+)', sub, k)


CONFIGS = [(512, 0, 1), (4096, 0, 8), (512, 256, 2)]


def report(outdir):
    node, ev = names(outdir)
    runs = collections.defaultdict(lambda: collections.defaultdict(list))
    for fn in os.listdir(os.path.join(outdir, 'counts')):
        op, n, off, rep = fn.split('.')
        d = {}
        for l in open(os.path.join(outdir, 'counts', fn)):
            v, k = l.rstrip('\n').split(' ', 1)
            d[k] = int(v)
        runs[op][(int(n), int(off))].append(d)
    med = {}
    for op, cfgs in runs.items():
        med[op] = {}
        for cfg, ds in cfgs.items():
            keys = set().union(*ds)
            med[op][cfg] = {k: statistics.median([d.get(k, 0) for d in ds]) for k in keys}
    null = {}
    for op in ('null',):
        if op in med:
            null = med[op].get((512, 0), {})
    print('# Tracepoint counts per operation (run.sh, %s)\n' % open('/proc/sys/kernel/osrelease').read().strip())
    print('count = fixed + per_page*N + per_table*T, from N=512/T=1, N=4096/T=8, N=512/T=2 '
          '(median of the runs); fixed has the null window (two marker writes) subtracted. '
          '"irq:" rows happened in interrupt context inside the window (not the operation).\n')
    for op in sorted(med):
        if op == 'null':
            continue
        c = med[op]
        if not all((n, off) in c for n, off, _ in CONFIGS):
            continue
        a, b, t = (c[(n, off)] for n, off, _ in CONFIGS)
        keys = sorted(set(a) | set(b) | set(t))
        big = op.endswith('64')
        print('## %s\n' % op)
        print('| tracepoint | fixed | per page | per PTE table |%s N=512 | N=4096 | N=512,T=2 |' % (' per 64K folio |' if big else ''))
        print('|---|---|---|---|%s---|---|---|' % ('---|' if big else ''))
        for k in keys:
            x, y, z = a.get(k, 0), b.get(k, 0), t.get(k, 0)
            per_t = z - x
            per_p = (y - x - 7 * per_t) / 3584
            fixed = x - 512 * per_p - per_t - null.get(k, 0)
            fol = ' %.3f |' % (16 * per_p) if big else ''
            print('| %s | %.1f | %.4f | %.1f |%s %d | %d | %d |' % (pretty(k, node, ev), fixed, per_p, per_t, fol, x, y, z))
        print()
    print('## null window (subtracted from fixed)\n')
    for k, v in sorted(null.items()):
        print('* %s: %s' % (k, v))


if __name__ == '__main__':
    if sys.argv[1] == 'count':
        count(sys.stdin, sys.stdout)
    else:
        report(sys.argv[2])
