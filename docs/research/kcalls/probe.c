/* probe: which kernel function-entry counters this kernel lets root use.
 * Prints one line per method: a BPF fentry program load (BPF_PROG_TYPE_TRACING), a
 * BPF raw tracepoint program load (for contrast), and a perf hardware execute
 * breakpoint on a kernel function (argv[1], hex address). The ftrace function tracer
 * is probed by run.sh (echo function > current_tracer of an instance). */
#include <errno.h>
#include <linux/bpf.h>
#include <linux/hw_breakpoint.h>
#include <linux/perf_event.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static void bpf_try(const char *what, int type, int eat, int btf) {
    struct bpf_insn p[] = {{BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0}, {BPF_JMP | BPF_EXIT, 0, 0, 0, 0}};
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.prog_type = type;
    a.expected_attach_type = eat;
    a.attach_btf_id = btf;
    a.insns = (uint64_t)(uintptr_t)p;
    a.insn_cnt = 2;
    a.license = (uint64_t)(uintptr_t) "GPL";
    int fd = syscall(SYS_bpf, BPF_PROG_LOAD, &a, sizeof a);
    printf("%-44s %s\n", what, fd < 0 ? strerror(errno) : "ok");
    if (fd >= 0) close(fd);
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: probe KERNEL_FUNC_ADDR_HEX FUNC_BTF_ID\n"); return 2; }
    bpf_try("bpf fentry (tracing) program load:", BPF_PROG_TYPE_TRACING, BPF_TRACE_FENTRY, atoi(argv[2]));
    bpf_try("bpf raw_tracepoint program load:", BPF_PROG_TYPE_RAW_TRACEPOINT, 0, 0);
    struct perf_event_attr a;
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_BREAKPOINT;
    a.size = sizeof a;
    a.bp_type = HW_BREAKPOINT_X;
    a.bp_addr = strtoull(argv[1], 0, 16);
    a.bp_len = sizeof(long);
    a.exclude_user = 1;
    int fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    printf("%-44s %s\n", "perf kernel execute breakpoint:", fd < 0 ? strerror(errno) : "ok");
    memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_HARDWARE;
    a.size = sizeof a;
    a.config = PERF_COUNT_HW_BRANCH_INSTRUCTIONS;
    a.exclude_user = 1;
    fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    printf("%-44s %s\n", "perf hardware branch counter (PMU):", fd < 0 ? strerror(errno) : "ok");
    return 0;
}
