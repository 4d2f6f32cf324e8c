#!/bin/bash
# Reproduces every number of docs/research/kernel-calls-6.18.md §9.
# usage: run.sh [OUTDIR]        (default: a new private directory from mktemp -d; needs root, gcc, python3)
#
# 1. probe: which function-entry counters the kernel allows (ftrace function tracer,
#    BPF fentry, perf kernel breakpoints, PMU). On 6.18.44-fc-v669 all are refused, so
# 2. trace: counts the kernel's tracepoints (the memcg stat chains, page allocations and
#    frees, per-CPU list refills and drains, LRU insertions, slab allocations, RSS counter
#    updates, TLB flushes, mmap_lock, faults, ...) of one operation of kc_ops.c, in a
#    tracefs instance limited to CPU 0, between the program's own trace_marker writes
#    (kcB/kcE), for its pid, outside interrupt context; each op at N=512 (one PTE table),
#    N=4096 (eight) and N=512 at offset 256 pages (two), three runs each (median);
# 3. trace64: the same for 64 KiB folios (hugepages-64kB/enabled=always meanwhile);
# 4. analyze.py solves count = fixed + per_page*N + per_table*T and writes results.md.
# Every tracefs/THP change is made under /run/lock/usermm/oracle.lock and undone by a trap.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
T=/sys/kernel/tracing
LOCK=/run/lock/usermm/oracle.lock
I=$T/instances/kcalls
THP64=/sys/kernel/mm/transparent_hugepage/hugepages-64kB/enabled
REPS=${REPS:-3}
OPS4K=${OPS4K:-"fault_w fault_r populate_r populate_w munmap dontneed fork cow reuse mlock munlock mprotect_ro mprotect_rw shm_shared_dense shm_shared_sparse shm_private_dense shm_private_sparse shm_shared_new_w shm_shared_new_r"}
OPS64K=${OPS64K:-"null fault_w64 munmap64 dontneed64 fork64"}
CONFIGS="512:0 4096:0 512:256"
EVENTS="kmem:mm_page_alloc kmem:mm_page_free kmem:mm_page_free_batched kmem:mm_page_pcpu_drain
 kmem:mm_page_alloc_zone_locked kmem:kmem_cache_alloc kmem:kmem_cache_free kmem:kmalloc kmem:kfree
 kmem:rss_stat memcg:mod_memcg_lruvec_state memcg:mod_memcg_state memcg:count_memcg_events
 memcg:memcg_flush_stats pagemap:mm_lru_insertion pagemap:mm_lru_activate tlb:tlb_flush
 mmap_lock:mmap_lock_acquire_returned exceptions:page_fault_user filemap:mm_filemap_fault
 filemap:mm_filemap_map_pages filemap:mm_filemap_add_to_page_cache
 filemap:mm_filemap_delete_from_page_cache percpu:percpu_alloc_percpu percpu:percpu_free_percpu
 cgroup:cgroup_rstat_locked lock:contention_begin sched:sched_switch sched:sched_process_fork
 sched:sched_wakeup_new irq:irq_handler_entry irq:softirq_entry"

phase_probe() { # $1 = OUTDIR; under the lock
    out=$1 P=$T/instances/kcalls_probe
    mkdir "$P" || return 1
    trap 'echo nop > "$P/current_tracer" 2>/dev/null; rmdir "$P"' EXIT
    trap 'exit 1' INT TERM
    if echo function > "$P/current_tracer" 2>"$out/probe_ftrace.err"; then r=ok; else r="refused: $(sed 's/.*: //' "$out/probe_ftrace.err")"; fi
    echo nop > "$P/current_tracer"
    {
        echo "uname -r: $(uname -r)"
        printf '%-44s %s\n' "ftrace function tracer (instance):" "$r"
        for f in set_ftrace_pid set_ftrace_filter available_filter_functions; do
            if head -c1 "$T/$f" >/dev/null 2>&1; then r=ok; else r="open refused"; fi
            printf '%-44s %s\n' "read $f:" "$r"
        done
        printf '%-44s %s\n' "function_graph tracer built:" "$(grep -qw function_graph $T/available_tracers && echo yes || echo no)"
        printf '%-44s %s\n' "CONFIG_KPROBES:" "$(zcat /proc/config.gz | grep -E '^# CONFIG_KPROBES |^CONFIG_KPROBES=' )"
        "$out/bin/probe" "$(awk '$3=="handle_mm_fault"{print $1}' /proc/kallsyms)" \
            "$(python3 "$HERE/btf_ids.py" | awk '$1=="F" && $3=="handle_mm_fault"{print $2}')"
    } > "$out/probe.txt"
    cat "$out/probe.txt"
}

phase_trace() { # $1 = OUTDIR, $2 = tag (4k|64k), $3 = ops; under the lock
    out=$1 tag=$2 ops=$3
    old64=$(sed 's/.*\[\(.*\)\].*/\1/' "$THP64")
    mkdir "$I" || return 1
    cleanup() {
        exec 9>&- 2>/dev/null
        echo 0 > "$I/tracing_on" 2>/dev/null
        echo 0 > "$I/events/enable" 2>/dev/null
        rmdir "$I" 2>/dev/null
        echo "$old64" > "$THP64"
    }
    trap cleanup EXIT
    trap 'exit 1' INT TERM
    echo 0 > "$I/tracing_on"
    echo 1 > "$I/tracing_cpumask"
    echo 32768 > "$I/buffer_size_kb"
    for e in $EVENTS; do echo "$e" >> "$I/set_event" || echo "no event $e" >&2; done
    [ "$tag" = 64k ] && echo always > "$THP64"
    exec 9> "$I/trace_marker"
    export KCOUNT_MARKER_FD=9
    echo 1 > "$I/tracing_on"
    for rep in $(seq "$REPS"); do
        for op in $ops; do
            for cfg in $CONFIGS; do
                n=${cfg%:*} off=${cfg#*:}
                echo > "$I/trace"
                taskset -c 0 "$out/bin/kc_ops" "$op" "$n" "$off" || echo "FAILED $op $n $off" >&2
                python3 "$HERE/analyze.py" count < "$I/trace" > "$out/counts/$op.$n.$off.$rep"
            done
        done
    done
    echo 0 > "$I/tracing_on"
}

case "${1:-}" in
--probe) phase_probe "$2"; exit ;;
--trace) phase_trace "$2" "$3" "$4"; exit ;;
esac

# A fixed name under /tmp could be planted by another user (a symlink): make a new one.
OUT=${1:-$(mktemp -d -t kcalls-out.XXXXXX)} || exit 1
echo "output: $OUT"
mkdir -p "$OUT/bin" "$OUT/counts" /run/lock/usermm
gcc -O2 -Wall -o "$OUT/bin/kc_ops" "$HERE/kc_ops.c" || exit 1
gcc -O2 -Wall -o "$OUT/bin/probe" "$HERE/probe.c" || exit 1
gcc -O2 -Wall -o "$OUT/bin/kcount" "$HERE/kcount.c" || exit 1
cp /proc/vmstat "$OUT/vmstat.txt"
before="$(cat $T/current_tracer $T/tracing_on $T/buffer_size_kb; cat /sys/kernel/mm/transparent_hugepage/hugepages-*/enabled)"
flock -w 300 "$LOCK" "$0" --probe "$OUT"
# a few ops per lock hold, so no hold lasts more than about a minute
set -- $OPS4K
while [ $# -gt 0 ]; do
    chunk="null ${1:-} ${2:-} ${3:-} ${4:-}"; shift $(( $# < 4 ? $# : 4 ))
    flock -w 300 "$LOCK" "$0" --trace "$OUT" 4k "$chunk"
done
flock -w 300 "$LOCK" "$0" --trace "$OUT" 64k "$OPS64K"
after="$(cat $T/current_tracer $T/tracing_on $T/buffer_size_kb; cat /sys/kernel/mm/transparent_hugepage/hugepages-*/enabled)"
[ "$before" = "$after" ] && echo "tracefs and THP knobs as before" || { echo "STATE CHANGED:"; diff <(echo "$before") <(echo "$after"); }
ls "$T/instances"
python3 "$HERE/analyze.py" report "$OUT" > "$OUT/results.md"
echo "results: $OUT/results.md"
