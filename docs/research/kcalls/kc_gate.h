/* Counting window of one operation.
 * KCOUNT_MARKER_FD set (run.sh): writes "kcB"/"kcE" to that trace_marker fd, delimiting the
 *   window in a tracefs instance's trace (the tracepoint counts of run.sh).
 * KCOUNT_MAP_FD set (kcount.c): stores the caller's pid / 0 in the BPF gate map, so the
 *   fentry counters count only inside the window (refused on this kernel: kernel-calls-6.18.md §9).
 * Neither: no-op. */
#ifndef KC_GATE_H
#define KC_GATE_H
#include <linux/bpf.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int kc_map_fd = -2, kc_marker_fd = -2;

static void kc_set(uint64_t v) {
    if (kc_map_fd == -2) {
        const char *e = getenv("KCOUNT_MAP_FD");
        kc_map_fd = e ? atoi(e) : -1;
        e = getenv("KCOUNT_MARKER_FD");
        kc_marker_fd = e ? atoi(e) : -1;
    }
    if (kc_marker_fd >= 0) {
        if (write(kc_marker_fd, v ? "kcB" : "kcE", 3) != 3) abort();
        return;
    }
    if (kc_map_fd < 0) return;
    uint32_t key = 0;
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_fd = kc_map_fd;
    a.key = (uint64_t)(uintptr_t)&key;
    a.value = (uint64_t)(uintptr_t)&v;
    a.flags = BPF_ANY;
    syscall(SYS_bpf, BPF_MAP_UPDATE_ELEM, &a, sizeof a);
}
static inline void gate_on(void) { kc_set((uint64_t)getpid()); }
static inline void gate_off(void) { kc_set(0); }
#endif
