/* kcount: count kernel function entries of one process window with BPF fentry programs.
 *
 * usage: kcount PREEMPT_COUNT_BTF_ID FUNCS CMDS
 *   PREEMPT_COUNT_BTF_ID: BTF id of the per-CPU variable __preempt_count
 *   FUNCS: lines "btf_id name" (vmlinux BTF FUNC ids, from btf_ids.py)
 *   CMDS:  lines "label<TAB>shell command"; each command runs once (sh -c) with
 *          KCOUNT_MAP_FD set; the command's program opens the counting window with
 *          gate_on() (kc_gate.h) and closes it with gate_off().
 * For every function one fentry program is attached: it adds 1 to the function's
 * counter if the current task's pid equals map[0] and the CPU is not serving a hard or
 * soft interrupt or an NMI (__preempt_count & 0xff0100 == 0).
 * Output per command: "# label", then "count name" for every non-zero counter.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/bpf.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long sys_bpf(int cmd, union bpf_attr *a) { return syscall(SYS_bpf, cmd, a, sizeof *a); }

#define I(c, d, s, o, i) ((struct bpf_insn){c, d, s, o, i})
#define LD64(d, s, imm) I(BPF_LD | BPF_DW | BPF_IMM, d, s, 0, imm), I(0, 0, 0, 0, 0)
#define CALL(f) I(BPF_JMP | BPF_CALL, 0, 0, 0, f)

static char logbuf[1 << 16];

static int load_prog(int btf_id, int gate_fd, int cnt_fd, int idx, int pc_btf_id) {
    struct bpf_insn p[] = {
        /* 0 */ LD64(BPF_REG_1, BPF_PSEUDO_BTF_ID, pc_btf_id),
        /* 2 */ CALL(BPF_FUNC_this_cpu_ptr),
        /* 3 */ I(BPF_LDX | BPF_W | BPF_MEM, BPF_REG_1, BPF_REG_0, 0, 0),
        /* 4 */ I(BPF_ALU64 | BPF_AND | BPF_K, BPF_REG_1, 0, 0, 0x00ff0100),
        /* 5 */ I(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_1, 0, 27 - 6, 0),
        /* 6 */ CALL(BPF_FUNC_get_current_pid_tgid),
        /* 7 */ I(BPF_ALU | BPF_MOV | BPF_X, BPF_REG_6, BPF_REG_0, 0, 0),
        /* 8 */ I(BPF_ST | BPF_W | BPF_MEM, BPF_REG_10, 0, -4, 0),
        /* 9 */ I(BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_2, BPF_REG_10, 0, 0),
        /* 10 */ I(BPF_ALU64 | BPF_ADD | BPF_K, BPF_REG_2, 0, 0, -4),
        /* 11 */ LD64(BPF_REG_1, BPF_PSEUDO_MAP_FD, gate_fd),
        /* 13 */ CALL(BPF_FUNC_map_lookup_elem),
        /* 14 */ I(BPF_JMP | BPF_JEQ | BPF_K, BPF_REG_0, 0, 27 - 15, 0),
        /* 15 */ I(BPF_LDX | BPF_DW | BPF_MEM, BPF_REG_1, BPF_REG_0, 0, 0),
        /* 16 */ I(BPF_JMP | BPF_JNE | BPF_X, BPF_REG_1, BPF_REG_6, 27 - 17, 0),
        /* 17 */ I(BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_2, BPF_REG_10, 0, 0),
        /* 18 */ I(BPF_ALU64 | BPF_ADD | BPF_K, BPF_REG_2, 0, 0, -4),
        /* 19 */ LD64(BPF_REG_1, BPF_PSEUDO_MAP_FD, cnt_fd),
        /* 21 */ CALL(BPF_FUNC_map_lookup_elem),
        /* 22 */ I(BPF_JMP | BPF_JEQ | BPF_K, BPF_REG_0, 0, 27 - 23, 0),
        /* 23 */ I(BPF_ALU64 | BPF_ADD | BPF_K, BPF_REG_0, 0, 0, 8 * idx),
        /* 24 */ I(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_1, 0, 0, 1),
        /* 25 */ I(BPF_STX | BPF_DW | BPF_ATOMIC, BPF_REG_0, BPF_REG_1, 0, BPF_ADD),
        /* 26 */ I(BPF_JMP | BPF_JA, 0, 0, 0, 0),
        /* 27 */ I(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0),
        /* 28 */ I(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
    };
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.prog_type = BPF_PROG_TYPE_TRACING;
    a.expected_attach_type = BPF_TRACE_FENTRY;
    a.attach_btf_id = btf_id;
    a.insns = (uint64_t)(uintptr_t)p;
    a.insn_cnt = sizeof p / sizeof p[0];
    a.license = (uint64_t)(uintptr_t) "GPL";
    a.log_buf = (uint64_t)(uintptr_t)logbuf;
    a.log_size = sizeof logbuf;
    a.log_level = 0;
    int fd = sys_bpf(BPF_PROG_LOAD, &a);
    if (fd < 0 && getenv("KCOUNT_VERBOSE")) {
        a.log_level = 1;
        logbuf[0] = 0;
        sys_bpf(BPF_PROG_LOAD, &a);
        fprintf(stderr, "load %d: %s\n%s\n", btf_id, strerror(errno), logbuf);
    }
    return fd;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: kcount PREEMPT_COUNT_BTF_ID FUNCS CMDS\n");
        return 2;
    }
    int pc_id = atoi(argv[1]);
    struct rlimit rl = {1 << 16, 1 << 16};
    setrlimit(RLIMIT_NOFILE, &rl);
    FILE *f = fopen(argv[2], "r");
    if (!f) { perror(argv[2]); return 1; }
    int n = 0, cap = 1024;
    int *ids = malloc(cap * sizeof *ids);
    char **names = malloc(cap * sizeof *names);
    char nm[256];
    int id;
    while (fscanf(f, "%d %255s", &id, nm) == 2) {
        if (n == cap) { cap *= 2; ids = realloc(ids, cap * sizeof *ids); names = realloc(names, cap * sizeof *names); }
        ids[n] = id; names[n] = strdup(nm); n++;
    }
    fclose(f);
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_type = BPF_MAP_TYPE_ARRAY;
    a.key_size = 4;
    a.value_size = 8;
    a.max_entries = 1;
    strcpy(a.map_name, "kcount_gate");
    int gate = sys_bpf(BPF_MAP_CREATE, &a);
    memset(&a, 0, sizeof a);
    a.map_type = BPF_MAP_TYPE_ARRAY;
    a.key_size = 4;
    a.value_size = 8 * n;
    a.max_entries = 1;
    strcpy(a.map_name, "kcount_cnt");
    int cnt = sys_bpf(BPF_MAP_CREATE, &a);
    if (gate < 0 || cnt < 0) { perror("map create"); return 1; }
    uint64_t *vals = calloc(n, 8), *zeros = calloc(n, 8);
    /* one big value array read with lookups of each key: simple, n is small */
    int *att = calloc(n, sizeof *att);
    int attached = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        int pfd = load_prog(ids[i], gate, cnt, i, pc_id);
        if (pfd < 0) { fprintf(stderr, "skip %s: load: %s\n", names[i], strerror(errno)); continue; }
        memset(&a, 0, sizeof a);
        a.raw_tracepoint.prog_fd = pfd;
        int lfd = sys_bpf(BPF_RAW_TRACEPOINT_OPEN, &a);
        if (lfd < 0) { fprintf(stderr, "skip %s: attach: %s\n", names[i], strerror(errno)); close(pfd); continue; }
        att[i] = 1;
        attached++;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fprintf(stderr, "attached %d of %d in %.1f s\n", attached, n,
            (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    printf("#attached");
    for (int i = 0; i < n; i++) if (att[i]) printf(" %s", names[i]);
    printf("\n");
    char env[32];
    snprintf(env, sizeof env, "%d", gate);
    setenv("KCOUNT_MAP_FD", env, 1);
    FILE *c = fopen(argv[3], "r");
    if (!c) { perror(argv[3]); return 1; }
    char line[4096];
    while (fgets(line, sizeof line, c)) {
        line[strcspn(line, "\n")] = 0;
        char *tab = strchr(line, '\t');
        if (!tab || line[0] == '#') continue;
        *tab = 0;
        fflush(stdout);
        pid_t p = fork();
        if (p == 0) {
            execl("/bin/sh", "sh", "-c", tab + 1, (char *)0);
            _exit(127);
        }
        int st;
        waitpid(p, &st, 0);
        printf("# %s status=%d\n", line, st);
        uint32_t k = 0;
        memset(&a, 0, sizeof a);
        a.map_fd = cnt;
        a.key = (uint64_t)(uintptr_t)&k;
        a.value = (uint64_t)(uintptr_t)vals;
        if (sys_bpf(BPF_MAP_LOOKUP_ELEM, &a) != 0) { perror("lookup"); return 1; }
        uint64_t tot = 0;
        for (int i = 0; i < n; i++)
            if (vals[i]) { printf("%llu %s\n", (unsigned long long)vals[i], names[i]); tot += vals[i]; }
        printf("%llu TOTAL\n", (unsigned long long)tot);
        a.value = (uint64_t)(uintptr_t)zeros;
        sys_bpf(BPF_MAP_UPDATE_ELEM, &a);
    }
    fflush(stdout);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* links and programs are released at exit */
    return 0;
}
