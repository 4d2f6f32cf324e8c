/* kc_ops: one memory-management operation over N pages, its counting window opened and
 * closed around the operation only (kc_gate.h); setup and teardown are outside it.
 *
 * usage: kc_ops OP NPAGES [OFFSET_PAGES]
 * The region starts OFFSET_PAGES pages past a 2 MiB boundary (so N=512, OFFSET=0 is one
 * PTE table and N=512, OFFSET=256 spans two). 4K ops use MADV_NOHUGEPAGE; ops ending in
 * "64" leave THP advice alone so the hugepages-64kB knob (set by run.sh) gives 64K folios.
 */
#define _GNU_SOURCE
#include "kc_gate.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PG 4096UL
#define PMD (2UL << 20)
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif

static void die(const char *m) { perror(m); exit(1); }

static char *region(size_t n, size_t off, int nohuge) {
    size_t len = n * PG, span = len + off * PG + 2 * PMD;
    char *r = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) die("mmap");
    char *a = (char *)(((unsigned long)r + PMD - 1) & ~(PMD - 1)) + off * PG;
    /* keep only [a, a+len) so no neighbouring VMA is merged into the operation */
    if (a > r) munmap(r, a - r);
    if (r + span > a + len) munmap(a + len, r + span - (a + len));
    if (nohuge && madvise(a, len, MADV_NOHUGEPAGE)) die("madvise nohuge");
    return a;
}

static void write_each(char *a, size_t n) { for (size_t i = 0; i < n; i++) a[i * PG] = 1; }
static unsigned long read_each(char *a, size_t n, size_t stride) {
    unsigned long s = 0;
    for (size_t i = 0; i < n; i += stride) s += ((volatile char *)a)[i * PG];
    return s;
}

static long thp64_allocs(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/hugepages-64kB/stats/anon_fault_alloc", "r");
    long v = -1;
    if (f) { if (fscanf(f, "%ld", &v) != 1) v = -1; fclose(f); }
    return v;
}

/* a populated region: 4K pages (MADV_NOHUGEPAGE) or 64K folios (checked) */
static char *populated(size_t n, size_t off, int big) {
    char *a = region(n, off, !big);
    long before = big ? thp64_allocs() : 0;
    write_each(a, n);
    if (big) {
        long got = thp64_allocs() - before;
        /* the counter is machine-wide: other processes may add to it meanwhile */
        if (got < (long)(n / 16)) {
            fprintf(stderr, "expected %zu 64K folios, got %ld\n", n / 16, got);
            exit(3);
        }
    }
    return a;
}

static int memfd_pages(size_t n, size_t every) {
    int fd = memfd_create("kc", 0);
    if (fd < 0) die("memfd");
    if (ftruncate(fd, n * PG)) die("ftruncate");
    char buf[PG];
    memset(buf, 7, sizeof buf);
    for (size_t i = 0; every && i < n; i += every)
        if (pwrite(fd, buf, PG, i * PG) != (ssize_t)PG) die("pwrite");
    return fd;
}

static char *map_file(int fd, size_t n, size_t off, int flags) {
    /* OFF pages past a 2 MiB boundary, as region() does */
    size_t len = n * PG, span = len + off * PG + 2 * PMD;
    char *r = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) die("mmap");
    char *a = (char *)(((unsigned long)r + PMD - 1) & ~(PMD - 1)) + off * PG;
    if (mmap(a, len, PROT_READ | PROT_WRITE, flags | MAP_FIXED, fd, 0) != a) die("mmap file");
    if (a > r) munmap(r, a - r);
    if (r + span > a + len) munmap(a + len, r + span - (a + len));
    return a;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: kc_ops OP NPAGES [OFFSET]\n"); return 2; }
    const char *op = argv[1];
    size_t n = strtoul(argv[2], 0, 0), off = argc > 3 ? strtoul(argv[3], 0, 0) : 0;
    size_t len = n * PG;
    int big = strlen(op) > 2 && !strcmp(op + strlen(op) - 2, "64");
    char *a;
    if (!strcmp(op, "null")) {
        gate_on(); gate_off();
    } else if (!strcmp(op, "fault_w") || !strcmp(op, "fault_w64")) {
        a = region(n, off, !big);
        long before = big ? thp64_allocs() : 0;
        gate_on(); write_each(a, n); gate_off();
        if (big && thp64_allocs() - before < (long)(n / 16)) { fprintf(stderr, "not 64K\n"); return 3; }
    } else if (!strcmp(op, "fault_r")) {
        a = region(n, off, 1);
        gate_on(); read_each(a, n, 1); gate_off();
    } else if (!strcmp(op, "populate_r")) {
        a = region(n, off, 1);
        gate_on(); if (madvise(a, len, MADV_POPULATE_READ)) die("populate"); gate_off();
    } else if (!strcmp(op, "populate_w")) {
        a = region(n, off, 1);
        gate_on(); if (madvise(a, len, MADV_POPULATE_WRITE)) die("populate"); gate_off();
    } else if (!strcmp(op, "munmap") || !strcmp(op, "munmap64")) {
        a = populated(n, off, big);
        gate_on(); if (munmap(a, len)) die("munmap"); gate_off();
    } else if (!strcmp(op, "dontneed") || !strcmp(op, "dontneed64")) {
        a = populated(n, off, big);
        gate_on(); if (madvise(a, len, MADV_DONTNEED)) die("dontneed"); gate_off();
    } else if (!strcmp(op, "fork") || !strcmp(op, "fork64")) {
        a = populated(n, off, big);
        gate_on();
        pid_t p = fork();
        if (p == 0) _exit(0);
        gate_off();
        if (p < 0) die("fork");
        waitpid(p, 0, 0);
    } else if (!strcmp(op, "cow") || !strcmp(op, "reuse")) {
        a = populated(n, off, 0);
        int pp[2];
        if (pipe(pp)) die("pipe");
        pid_t p = fork();
        if (p == 0) { char c; close(pp[1]); if (read(pp[0], &c, 1) < 0) _exit(1); _exit(0); }
        close(pp[0]);
        if (!strcmp(op, "reuse")) { close(pp[1]); waitpid(p, 0, 0); }
        gate_on(); write_each(a, n); gate_off();
        if (!strcmp(op, "cow")) { close(pp[1]); waitpid(p, 0, 0); }
    } else if (!strcmp(op, "mlock")) {
        a = populated(n, off, 0);
        gate_on(); if (mlock(a, len)) die("mlock"); gate_off();
    } else if (!strcmp(op, "munlock")) {
        a = populated(n, off, 0);
        if (mlock(a, len)) die("mlock");
        gate_on(); if (munlock(a, len)) die("munlock"); gate_off();
    } else if (!strcmp(op, "mprotect_ro")) {
        a = populated(n, off, 0);
        gate_on(); if (mprotect(a, len, PROT_READ)) die("mprotect"); gate_off();
    } else if (!strcmp(op, "mprotect_rw")) {
        a = populated(n, off, 0);
        if (mprotect(a, len, PROT_READ)) die("mprotect");
        gate_on(); if (mprotect(a, len, PROT_READ | PROT_WRITE)) die("mprotect"); gate_off();
    } else if (!strncmp(op, "shm_", 4)) {
        /* shm_{shared,private}_{dense,sparse}: read faults of cached memfd pages; dense:
         * every page cached, one fault per 16-page fault-around window; sparse: only every
         * 16th page cached, the same faults map one page each.
         * shm_{shared}_{new_w,new_r}: first touch of pages not in the page cache. */
        int shared = strstr(op, "shared") != NULL;
        int flags = shared ? MAP_SHARED : MAP_PRIVATE;
        if (strstr(op, "dense") || strstr(op, "sparse")) {
            int fd = memfd_pages(n, strstr(op, "dense") ? 1 : 16);
            a = map_file(fd, n, off, flags);
            if (madvise(a, len, MADV_NOHUGEPAGE)) die("nohuge");
            gate_on(); read_each(a, n, 16); gate_off();
        } else {
            int fd = memfd_pages(n, 0);
            a = map_file(fd, n, off, flags);
            if (madvise(a, len, MADV_NOHUGEPAGE)) die("nohuge");
            if (strstr(op, "new_w")) { gate_on(); write_each(a, n); gate_off(); }
            else { gate_on(); read_each(a, n, 1); gate_off(); }
        }
    } else {
        fprintf(stderr, "unknown op %s\n", op);
        return 2;
    }
    return 0;
}
