/*
 * usermm's static spawn agent: the host side of seed 001's spawn benchmark.
 *
 * A freestanding x86-64 Linux program (no libc, raw system calls), so that the process it
 * forks holds only what the row asks for: its own text, data and stack, the vDSO, and the
 * anonymous single-page VMAs it adds until the process has exactly `vmas` VMAs, the first
 * ones written (seed 001's 21 touched VMAs) and the rest read-only and empty.
 *
 * usage: spawn_agent VMAS MILLISECONDS
 * prints: "<forks> <elapsed ns> <vmas> <RssAnon kB> <CPU ns>\n" (the CPU time of the loop:
 * this process's and its reaped children's, preemption left out), or exits non-zero.
 */

typedef unsigned long u64;
typedef long s64;

static s64 sys6(s64 n, s64 a, s64 b, s64 c, s64 d, s64 e, s64 f)
{
	s64 ret;
	register s64 r10 __asm__("r10") = d;
	register s64 r8 __asm__("r8") = e;
	register s64 r9 __asm__("r9") = f;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}

#define SYS_read 0
#define SYS_write 1
#define SYS_open 2
#define SYS_close 3
#define SYS_mmap 9
#define SYS_fork 57
#define SYS_exit 60
#define SYS_wait4 61
#define SYS_clock_gettime 228
#define SYS_getrusage 98

static void quit(int code)
{
	for (;;)
		sys6(SYS_exit, code, 0, 0, 0, 0, 0);
}

static u64 now_ns(void)
{
	s64 ts[2];
	sys6(SYS_clock_gettime, 1 /* CLOCK_MONOTONIC */, (s64)ts, 0, 0, 0, 0);
	return (u64)ts[0] * 1000000000ul + (u64)ts[1];
}

/* CPU time (user and system) of this process (who = 0) or of its reaped children (-1), ns. */
static u64 cpu_ns(s64 who)
{
	s64 ru[18];
	sys6(SYS_getrusage, who, (s64)ru, 0, 0, 0, 0);
	return (u64)(ru[0] + ru[2]) * 1000000000ul + (u64)(ru[1] + ru[3]) * 1000ul;
}

static u64 parse(const char *s)
{
	u64 v = 0;
	while (*s >= '0' && *s <= '9')
		v = v * 10 + (u64)(*s++ - '0');
	return v;
}

static char buf[1 << 20];

/* Reads a /proc file into buf; returns its length. */
static s64 slurp(const char *path)
{
	s64 fd = sys6(SYS_open, (s64)path, 0, 0, 0, 0, 0), n = 0, r;
	if (fd < 0)
		return -1;
	while (n < (s64)sizeof(buf) - 1 &&
	       (r = sys6(SYS_read, fd, (s64)(buf + n), (s64)sizeof(buf) - 1 - n, 0, 0, 0)) > 0)
		n += r;
	sys6(SYS_close, fd, 0, 0, 0, 0, 0);
	buf[n < 0 ? 0 : n] = 0;
	return n;
}

static u64 vma_count(void)
{
	u64 lines = 0;
	s64 n = slurp("/proc/self/maps");
	for (s64 i = 0; i < n; i++)
		lines += buf[i] == '\n';
	return lines;
}

static u64 rss_anon_kb(void)
{
	s64 n = slurp("/proc/self/status");
	static const char key[] = "RssAnon:";
	for (s64 i = 0; i + 8 < n; i++) {
		int k = 0;
		while (k < 8 && buf[i + k] == key[k])
			k++;
		if (k == 8) {
			const char *p = buf + i + 8;
			while (*p == ' ' || *p == '\t')
				p++;
			return parse(p);
		}
	}
	return 0;
}

static char *put(char *p, u64 v)
{
	char tmp[24];
	int n = 0;
	do
		tmp[n++] = (char)('0' + v % 10);
	while (v /= 10);
	while (n)
		*p++ = tmp[--n];
	return p;
}

static int agent(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	u64 vmas = parse(argv[1]), ms = parse(argv[2]);
	/* Single pages two apart (a gap keeps them from merging), far from everything else. */
	u64 base = 0x100000000000ul, have = vma_count();
	for (u64 i = 0; have + i < vmas; i++) {
		int rw = have + i < 21;
		s64 a = sys6(SYS_mmap, (s64)(base + i * 0x2000), 4096, rw ? 3 : 1,
			     0x22 | 0x100000 /* PRIVATE|ANONYMOUS|FIXED_NOREPLACE */, -1, 0);
		if (a < 0)
			return 3;
		if (rw)
			*(volatile char *)a = 1;
	}
	u64 got = vma_count(), rss = rss_anon_kb();
	u64 cpu0 = cpu_ns(0);
	u64 forks = 0, start = now_ns(), end = start + ms * 1000000ul, t;
	do {
		s64 pid = sys6(SYS_fork, 0, 0, 0, 0, 0, 0);
		if (pid == 0)
			quit(0);
		if (pid < 0)
			return 4;
		int status;
		sys6(SYS_wait4, pid, (s64)&status, 0, 0, 0, 0);
		forks++;
	} while ((t = now_ns()) < end);
	u64 cpu = cpu_ns(0) - cpu0 + cpu_ns(-1);
	char out[160], *p = out;
	p = put(p, forks);
	*p++ = ' ';
	p = put(p, t - start);
	*p++ = ' ';
	p = put(p, got);
	*p++ = ' ';
	p = put(p, rss);
	*p++ = ' ';
	p = put(p, cpu);
	*p++ = '\n';
	sys6(SYS_write, 1, (s64)out, p - out, 0, 0, 0);
	return 0;
}

/* The entry point: argc, argv on the stack as the kernel leaves them. */
__attribute__((used)) void agent_main(s64 *sp)
{
	quit(agent((int)sp[0], (char **)(sp + 1)));
}

__asm__(".text\n.global _start\n_start:\n"
	"xor %rbp,%rbp\nmov %rsp,%rdi\nand $-16,%rsp\ncall agent_main\nhlt\n");
