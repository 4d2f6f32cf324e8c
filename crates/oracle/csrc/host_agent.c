/*
 * usermm oracle host agent: one real process of a scenario, driven by the controller.
 *
 * The controller (the `usermm` binary, 9 MB of text, threads and a heap) used to fork
 * itself to make a host process, so every scenario process started out holding all of that:
 * mlockall(MCL_CURRENT) compares the whole address space (total_vm) with RLIMIT_MEMLOCK,
 * and an ordinary process that a minimal C program could lock got ENOMEM. This program is
 * what the controller executes instead (from an in-memory file, see src/agent.rs): a small
 * statically linked process that sets itself up as src/server.rs documents (cgroup,
 * descriptors, signals, memlock limit, fences and heap, credentials), says hello and serves
 * the requests of src/proto.rs, one at a time, until end of file or an exit request.
 *
 * usage: host_agent CONN CGROUP_FD PRIVILEGED MEMLOCK START_BRK FENCE_ALIGN
 *   CONN        descriptor of the connection (moved to 3)
 *   CGROUP_FD   open `cgroup.procs` of the scenario's cgroup, or -1
 *   PRIVILEGED  1 keeps root's credentials, 0 becomes nobody
 *   MEMLOCK     RLIMIT_MEMLOCK in bytes, or "inf"
 *   START_BRK   where the scenario's heap goes when that place is free (the engine's)
 *   FENCE_ALIGN the boundary the first scenario mapping ends at (a power of two)
 *
 * It never allocates: state is fixed-size and buffers live in static storage or on the
 * stack, so the process holds no mapping of its own beyond its program, stack, vDSO and
 * fences once it has said hello.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "access.c"

#define REQ_BYTES 48
#define REPLY_BYTES 24
#define CONN_FD 3
#define MAX_PINS 64
#define NOBODY 65534
#define FORK_CONNECTION 6
#define MAPS_BUF (16 * 1024)
#define MAX_MAPS 512
#define FENCE_FLAGS (MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE)

/* Setup steps (src/server.rs `Step`). */
enum step {
	STEP_SIGNALS = 1,
	STEP_RLIMIT = 2,
	STEP_LAYOUT = 3,
	STEP_CREDENTIALS = 4,
	STEP_DESCRIPTORS = 5,
	STEP_CGROUP = 6,
	STEP_ARGUMENTS = 8,
};

/* Operations (src/proto.rs `Op`). */
enum op {
	OP_MMAP = 1,
	OP_MUNMAP,
	OP_MPROTECT,
	OP_MREMAP,
	OP_BRK,
	OP_MADVISE,
	OP_MLOCK2,
	OP_MUNLOCK,
	OP_MLOCKALL,
	OP_MUNLOCKALL,
	OP_PIN,
	OP_UNPIN,
	OP_FILL,
	OP_TOUCH,
	OP_CHECK,
	OP_FORK,
	OP_EXIT,
	OP_MMAP_FILE,
	OP_MSYNC,
};

/* Reply kinds (src/proto.rs `Reply`). */
enum kind { REPLY_OK = 0, REPLY_ERRNO = 1, REPLY_SIGNAL = 2, REPLY_REFUSED = 3 };

struct reply {
	uint64_t kind, a, b;
};

struct pin {
	uint64_t addr, len;
	int fd;
};

static int conn = -1;
static int passed = -1;
static struct pin pins[MAX_PINS];
static char maps_text[MAPS_BUF];

static struct reply ok(uint64_t a, uint64_t b)
{
	return (struct reply){ REPLY_OK, a, b };
}

static struct reply err(int e)
{
	return (struct reply){ REPLY_ERRNO, (uint64_t)(int64_t)e, 0 };
}

static struct reply refused(uint64_t code, int e)
{
	return (struct reply){ REPLY_REFUSED, code, (uint64_t)(int64_t)e };
}

/* A system call's result: 0 (or the value) on success, the errno otherwise. */
static struct reply unit(int r)
{
	return r ? err(errno) : ok(0, 0);
}

static struct reply value_ptr(void *p)
{
	return p == MAP_FAILED ? err(errno) : ok((uint64_t)(uintptr_t)p, 0);
}

static struct reply value_long(long r)
{
	return r < 0 ? err(errno) : ok((uint64_t)r, 0);
}

static void put(uint8_t *b, int word, uint64_t v)
{
	int i;

	for (i = 0; i < 8; i++)
		b[word * 8 + i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get(const uint8_t *b, int word)
{
	uint64_t v = 0;
	int i;

	for (i = 7; i >= 0; i--)
		v = v << 8 | b[word * 8 + i];
	return v;
}

static void encode(const struct reply *r, uint8_t *b)
{
	put(b, 0, r->kind);
	put(b, 1, r->a);
	put(b, 2, r->b);
}

/* Writes b[from..] completely; 0 when the connection is gone. */
static int send_from(int fd, const uint8_t *b, size_t from)
{
	while (from < REPLY_BYTES) {
		ssize_t n = write(fd, b + from, REPLY_BYTES - from);
		if (n > 0)
			from += (size_t)n;
		else if (n < 0 && errno == EINTR)
			continue;
		else
			return 0;
	}
	return 1;
}

static int send_reply(int fd, struct reply r)
{
	uint8_t b[REPLY_BYTES];

	encode(&r, b);
	return send_from(fd, b, 0);
}

/* Sends `r` with descriptor `fd` attached to its first byte (SCM_RIGHTS). */
static int send_with_fd(struct reply r, int fd)
{
	uint8_t b[REPLY_BYTES];
	union {
		struct cmsghdr h;
		char space[CMSG_SPACE(sizeof(int))];
	} c;
	struct iovec iov;
	struct msghdr msg;
	struct cmsghdr *h;
	ssize_t n;

	encode(&r, b);
	memset(&c, 0, sizeof(c));
	memset(&msg, 0, sizeof(msg));
	iov.iov_base = b;
	iov.iov_len = REPLY_BYTES;
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = c.space;
	msg.msg_controllen = sizeof(c.space);
	h = CMSG_FIRSTHDR(&msg);
	h->cmsg_level = SOL_SOCKET;
	h->cmsg_type = SCM_RIGHTS;
	h->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(h), &fd, sizeof(int));
	do
		n = sendmsg(conn, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n <= 0)
		return 0;
	return send_from(conn, b, (size_t)n);
}

/* Reads a whole request; the first descriptor attached to it goes to `passed`, others are
 * closed. 0 at end of file or on an error. */
static int read_request(uint8_t *b)
{
	size_t got = 0;

	while (got < REQ_BYTES) {
		union {
			struct cmsghdr h;
			char space[CMSG_SPACE(4 * sizeof(int))];
		} c;
		struct iovec iov = { b + got, REQ_BYTES - got };
		struct msghdr msg;
		struct cmsghdr *h;
		ssize_t n;

		memset(&msg, 0, sizeof(msg));
		msg.msg_iov = &iov;
		msg.msg_iovlen = 1;
		msg.msg_control = c.space;
		msg.msg_controllen = sizeof(c.space);
		n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return 0;
		for (h = CMSG_FIRSTHDR(&msg); h; h = CMSG_NXTHDR(&msg, h)) {
			size_t i, k;
			if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
				continue;
			k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (i = 0; i < k; i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
				if (passed < 0)
					passed = fd;
				else
					close(fd);
			}
		}
		got += (size_t)n;
	}
	return 1;
}

/* ---- long-term pins: the fixed buffer of an io_uring ---- */

static struct reply pin(uint64_t addr, uint64_t len)
{
	uint64_t params[15];
	struct iovec iov;
	long fd;
	int i;

	for (i = 0; i < MAX_PINS && pins[i].fd >= 0; i++)
		;
	if (i == MAX_PINS)
		return refused(0, ENOSPC);
	memset(params, 0, sizeof(params));
	fd = syscall(SYS_io_uring_setup, 1u, params);
	if (fd < 0)
		return err(errno);
	iov.iov_base = (void *)(uintptr_t)addr;
	iov.iov_len = (size_t)len;
	if (syscall(SYS_io_uring_register, (int)fd, 0u /* REGISTER_BUFFERS */, &iov, 1u) < 0) {
		int e = errno;
		close((int)fd);
		return err(e);
	}
	pins[i] = (struct pin){ addr, len, (int)fd };
	return ok(0, 0);
}

/* Unregisters synchronously (a ring's own teardown at close is deferred), then closes. */
static int unpin_fd(int fd)
{
	long r = syscall(SYS_io_uring_register, fd, 1u /* UNREGISTER_BUFFERS */, NULL, 0u);
	int e = errno;

	close(fd);
	errno = e;
	return r < 0 ? -1 : 0;
}

static struct reply unpin(uint64_t addr, uint64_t len)
{
	int i;

	for (i = 0; i < MAX_PINS; i++) {
		if (pins[i].fd >= 0 && pins[i].addr == addr && pins[i].len == len) {
			int r = unpin_fd(pins[i].fd);
			pins[i].fd = -1;
			return unit(r);
		}
	}
	return err(EINVAL);
}

static void leave(int code)
{
	int i;

	for (i = 0; i < MAX_PINS; i++)
		if (pins[i].fd >= 0)
			unpin_fd(pins[i].fd);
	_exit(code);
}

/* ---- fork: the child connects back over a socket pair made before forking ---- */

static int do_fork(struct reply *out)
{
	int sv[2], i;
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
		*out = refused(FORK_CONNECTION, errno);
		return 1;
	}
	pid = fork();
	if (pid == 0) {
		close(sv[0]);
		close(conn);
		for (i = 0; i < MAX_PINS; i++) {
			if (pins[i].fd >= 0) {
				close(pins[i].fd);
				pins[i].fd = -1;
			}
		}
		conn = sv[1];
		if (!send_reply(conn, ok((uint64_t)getpid(), 0)))
			_exit(3);
		return 0;
	}
	if (pid < 0) {
		int e = errno;
		close(sv[0]);
		close(sv[1]);
		*out = err(e);
		return 1;
	}
	close(sv[1]);
	i = send_with_fd(ok((uint64_t)pid, 0), sv[0]);
	close(sv[0]);
	if (!i)
		leave(0); /* the child has no controller and sees end of file; so do we */
	return 0;
}

/* Performs one request; 0 when there is nothing to reply (a fork). */
static int handle(const uint8_t *b, struct reply *out)
{
	uint64_t a0 = get(b, 1), a1 = get(b, 2), a2 = get(b, 3), a3 = get(b, 4), a4 = get(b, 5);
	void *p = (void *)(uintptr_t)a0;
	size_t n = (size_t)a1;

	switch (get(b, 0)) {
	case OP_MMAP:
		*out = value_ptr(mmap(p, n, (int)a2, (int)a3, -1, 0));
		break;
	case OP_MMAP_FILE:
		if (passed < 0)
			*out = refused(0, EBADF);
		else
			*out = value_ptr(mmap(p, n, (int)a2, (int)a3, passed, (off_t)a4));
		break;
	case OP_MSYNC:
		*out = unit(msync(p, n, (int)a2));
		break;
	case OP_MUNMAP:
		*out = unit(munmap(p, n));
		break;
	case OP_MPROTECT:
		*out = unit(mprotect(p, n, (int)a2));
		break;
	case OP_MREMAP:
		*out = value_long(syscall(SYS_mremap, a0, a1, a2, (int)a3, a4));
		break;
	case OP_BRK:
		*out = ok((uint64_t)syscall(SYS_brk, a0), 0);
		break;
	case OP_MADVISE:
		*out = unit(madvise(p, n, (int)a2));
		break;
	case OP_MLOCK2:
		*out = value_long(syscall(SYS_mlock2, a0, a1, (unsigned)a2));
		if (out->kind == REPLY_OK)
			out->a = 0;
		break;
	case OP_MUNLOCK:
		*out = unit(munlock(p, n));
		break;
	case OP_MLOCKALL:
		*out = unit(mlockall((int)a0));
		break;
	case OP_MUNLOCKALL:
		*out = unit(munlockall());
		break;
	case OP_PIN:
		*out = pin(a0, a1);
		break;
	case OP_UNPIN:
		*out = unpin(a0, a1);
		break;
	case OP_FILL: {
		int sig = usermm_oracle_fill((uintptr_t)a0, n, (uint8_t)a2);
		*out = sig ? (struct reply){ REPLY_SIGNAL, (uint64_t)sig, 0 } : ok(0, 0);
		break;
	}
	case OP_TOUCH: {
		int sig = usermm_oracle_touch((uintptr_t)a0, n, a2 != 0);
		*out = sig ? (struct reply){ REPLY_SIGNAL, (uint64_t)sig, 0 } : ok(0, 0);
		break;
	}
	case OP_CHECK: {
		size_t at = 0;
		uint8_t found = 0;
		int sig = usermm_oracle_check((uintptr_t)a0, n, (uint8_t)a2, &at, &found);
		if (sig)
			*out = (struct reply){ REPLY_SIGNAL, (uint64_t)sig, 0 };
		else if (at >= n)
			*out = ok(UINT64_MAX, 0);
		else
			*out = ok(at, found);
		break;
	}
	case OP_FORK:
		return do_fork(out);
	case OP_EXIT:
		leave(0);
		break;
	default:
		*out = refused(0, EINVAL);
	}
	return 1;
}

static void serve(void)
{
	for (;;) {
		uint8_t b[REQ_BYTES];
		struct reply r;
		int has;

		if (!read_request(b))
			leave(0);
		has = handle(b, &r);
		if (passed >= 0) {
			close(passed);
			passed = -1;
		}
		if (has && !send_reply(conn, r))
			leave(0);
	}
}

/* ---- layout: fences and the heap (src/server.rs documents why) ---- */

struct range {
	uint64_t start, end;
};

static int read_file(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t len = 0;

	if (fd < 0)
		return -1;
	while (len + 1 < cap) {
		ssize_t n = read(fd, buf + len, cap - 1 - len);
		if (n == 0)
			break;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			close(fd);
			return -1;
		}
		len += (size_t)n;
	}
	close(fd);
	buf[len] = 0;
	return (int)len;
}

/* The address ranges of /proc/self/maps, in address order (the vsyscall page left out). */
static int read_maps(struct range *out, int cap)
{
	char *line = maps_text;
	int n = 0;

	if (read_file("/proc/self/maps", maps_text, sizeof(maps_text)) < 0)
		return -1;
	while (*line && n < cap) {
		char *end;
		uint64_t s = strtoull(line, &end, 16), e;
		if (*end == '-') {
			e = strtoull(end + 1, &end, 16);
			if (s < 0xffff800000000000ull)
				out[n++] = (struct range){ s, e };
		}
		line = strchr(line, '\n');
		if (!line)
			break;
		line++;
	}
	return n;
}

static void *fence(uint64_t start, uint64_t end)
{
	return mmap((void *)(uintptr_t)start, (size_t)(end - start), PROT_NONE,
		    FENCE_FLAGS | MAP_FIXED_NOREPLACE, -1, 0);
}

/* Fences every hole a top-down search could choose above the first FENCE_ALIGN boundary
 * below the program's lowest mmap-area mapping, and that boundary's last page, so the
 * scenario's first mapping ends at the boundary, as the engine's ends at its aligned
 * mmap_base. A one-page probe shows where a search lands: the top of the highest hole. */
static int place_fences(uint64_t align)
{
	static struct range maps[MAX_MAPS];
	int round, i, n;

	for (round = 0; round < 256; round++) {
		uint64_t p, b, floor = 0;
		void *v = mmap(NULL, 4096, PROT_NONE, FENCE_FLAGS, -1, 0);
		if (v == MAP_FAILED)
			return errno;
		p = (uint64_t)(uintptr_t)v;
		if (((p + 4096) & (align - 1)) == 0) {
			/* The probe ends at a boundary: the place is ready. */
			munmap(v, 4096);
			return 0;
		}
		/* Keep the probe as a fence, and fence down to the boundary below it. */
		b = p & ~(align - 1);
		if (b == p || fence(b, p) != MAP_FAILED)
			continue;
		if (errno != EEXIST)
			return errno;
		/* A mapping lies between: the probe found a hole; fence the rest of it. */
		n = read_maps(maps, MAX_MAPS);
		if (n < 0)
			return errno;
		for (i = 0; i < n; i++)
			if (maps[i].end <= p && maps[i].end > floor)
				floor = maps[i].end;
		if (floor < p && fence(floor, p) == MAP_FAILED)
			return errno;
	}
	return ELOOP;
}

/* The numeric fields of /proc/self/stat by their 1-based number in proc(5). */
static int stat_fields(uint64_t *f, int count)
{
	static char text[4096];
	char *s, *end;
	int i;

	if (read_file("/proc/self/stat", text, sizeof(text)) < 0)
		return -1;
	s = strrchr(text, ')');
	if (!s)
		return -1;
	s += 2; /* past ") " to field 3, the state */
	while (*s && *s != ' ')
		s++;
	for (i = 4; i < count; i++) {
		f[i] = strtoull(s, &end, 10);
		if (end == s)
			break;
		s = end;
	}
	return 0;
}

/* Moves start_brk and brk to the engine's heap start when nothing is mapped from 2 MiB below
 * it to 64 GiB above (room to grow, and no neighbour to merge with), else to the middle of
 * the largest gap, 1 GiB aligned. */
static int move_heap(uint64_t start_brk)
{
	static struct range maps[MAX_MAPS];
	const uint64_t room = 1ull << 30;
	uint64_t f[53] = { 0 }, lo = start_brk - (2u << 20), hi = start_brk + 64 * room, at = start_brk;
	struct prctl_mm_map m;
	int n = read_maps(maps, MAX_MAPS), i, busy = 0;

	if (n < 0 || stat_fields(f, 53))
		return errno ? errno : EINVAL;
	for (i = 0; i < n; i++)
		if (maps[i].start < hi && lo < maps[i].end)
			busy = 1;
	if (busy) {
		uint64_t best = 0;
		for (i = 1; i < n; i++) {
			uint64_t gap = maps[i].start - maps[i - 1].end;
			if (gap > best) {
				best = gap;
				at = (maps[i - 1].end / 2 + maps[i].start / 2) & ~(room - 1);
			}
		}
	}
	memset(&m, 0, sizeof(m));
	m.start_code = f[26];
	m.end_code = f[27];
	m.start_stack = f[28];
	m.start_data = f[45];
	m.end_data = f[46];
	m.start_brk = at;
	m.brk = at;
	m.arg_start = f[48];
	m.arg_end = f[49];
	m.env_start = f[50];
	m.env_end = f[51];
	m.exe_fd = (uint32_t)-1;
	if (prctl(PR_SET_MM, PR_SET_MM_MAP, (unsigned long)&m, sizeof(m), 0))
		return errno;
	return 0;
}

/* ---- setup ---- */

static int set_default(int sig, void (*h)(int))
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = h;
	sigemptyset(&sa.sa_mask);
	return sigaction(sig, &sa, NULL);
}

static int parse_u64(const char *s, uint64_t *v)
{
	char *end;

	errno = 0;
	*v = strtoull(s, &end, 0);
	return errno || end == s || *end;
}

int main(int argc, char **argv)
{
	uint64_t c, g, priv, memlock = RLIM_INFINITY, start_brk, align;
	struct rlimit rl;
	sigset_t none;
	int i, e;

	if (argc != 7 || parse_u64(argv[1], &c) || c > 1 << 20)
		_exit(2);
	conn = (int)c;
	for (i = 0; i < MAX_PINS; i++)
		pins[i].fd = -1;
	if (parse_u64(argv[3], &priv) || priv > 1 || parse_u64(argv[5], &start_brk) ||
	    parse_u64(argv[6], &align) || !align || (align & (align - 1)) ||
	    (strcmp(argv[4], "inf") && parse_u64(argv[4], &memlock)) ||
	    (strcmp(argv[2], "-1") && parse_u64(argv[2], &g))) {
		send_reply(conn, refused(STEP_ARGUMENTS, EINVAL));
		_exit(2);
	}
	if (strcmp(argv[2], "-1")) {
		/* "0" is the writer itself (cgroup v1 and v2). */
		if (write((int)g, "0", 1) != 1) {
			send_reply(conn, refused(STEP_CGROUP, errno));
			_exit(2);
		}
		if ((int)g != conn)
			close((int)g);
	}
	if (conn != CONN_FD) {
		if (dup2(conn, CONN_FD) < 0) {
			send_reply(conn, refused(STEP_DESCRIPTORS, errno));
			_exit(2);
		}
		conn = CONN_FD;
	}
	syscall(SYS_close_range, CONN_FD + 1, ~0u, 0);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	if (set_default(SIGINT, SIG_DFL) || set_default(SIGTERM, SIG_DFL) ||
	    set_default(SIGHUP, SIG_DFL) || set_default(SIGCHLD, SIG_IGN) ||
	    set_default(SIGPIPE, SIG_IGN) || usermm_oracle_install_fault_handler()) {
		send_reply(conn, refused(STEP_SIGNALS, errno));
		_exit(2);
	}
	/* A privileged process's limit does not matter (CAP_IPC_LOCK); without
	 * CAP_SYS_RESOURCE a limit above the hard one cannot be set, so do not insist there. */
	rl.rlim_cur = rl.rlim_max = memlock;
	if (setrlimit(RLIMIT_MEMLOCK, &rl) && !priv) {
		send_reply(conn, refused(STEP_RLIMIT, errno));
		_exit(2);
	}
	e = move_heap(start_brk);
	if (!e)
		e = place_fences(align);
	if (e) {
		send_reply(conn, refused(STEP_LAYOUT, e));
		_exit(2);
	}
	if (!priv && (setgroups(0, NULL) || setresgid(NOBODY, NOBODY, NOBODY) ||
		      setresuid(NOBODY, NOBODY, NOBODY))) {
		send_reply(conn, refused(STEP_CREDENTIALS, errno));
		_exit(2);
	}
	if (!send_reply(conn, ok((uint64_t)getpid(), 0)))
		_exit(2);
	serve();
	return 0;
}
