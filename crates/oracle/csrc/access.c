/*
 * Memory accessors of the usermm oracle's host servers.
 *
 * Each accessor touches scenario memory of the calling process and returns 0, or the
 * number of the signal (SIGSEGV, SIGBUS) the access raised. The fault handler jumps back
 * only while an accessor is running ("armed"); any other fault gets the default action.
 * Accesses go page by page in address order, so a range that runs into a hole is written
 * up to the hole, as the engine does. A range that wraps past the top of the address space
 * (addr + len beyond 2^64) is SIGSEGV before any byte is touched, as in the engine: no
 * accessor ever computes a wrapped address.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PAGE 4096UL

static sigjmp_buf fault_env;
static volatile sig_atomic_t armed;

static void on_fault(int sig, siginfo_t *info, void *uc)
{
	(void)info;
	(void)uc;
	if (armed) {
		armed = 0;
		siglongjmp(fault_env, sig);
	}
	signal(sig, SIG_DFL);
}

int usermm_oracle_install_fault_handler(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_fault;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, NULL) || sigaction(SIGBUS, &sa, NULL))
		return -1;
	return 0;
}

/* Whether [addr, addr+len) wraps: addr + len does not fit in an address. */
static int wraps(uintptr_t addr, size_t len)
{
	return len > UINTPTR_MAX - addr;
}

static size_t chunk(uintptr_t a, size_t left)
{
	size_t room = PAGE - (a & (PAGE - 1));
	return left < room ? left : room;
}

/* A write access that keeps the byte: one locked read-modify-write instruction. */
static inline void rmw_keep(uint8_t *p)
{
#if defined(__x86_64__)
	__asm__ volatile("lock orb $0, %0" : "+m"(*p) : : "memory");
#else
	__atomic_fetch_or(p, 0, __ATOMIC_RELAXED);
#endif
}

/* Fills [addr, addr+len) with `byte`, page by page. */
int usermm_oracle_fill(uintptr_t addr, size_t len, uint8_t byte)
{
	volatile uintptr_t a = addr;
	volatile size_t left = len;
	int sig;

	if (wraps(addr, len))
		return SIGSEGV;
	sig = sigsetjmp(fault_env, 1);
	if (sig)
		return sig;
	armed = 1;
	while (left) {
		size_t n = chunk(a, left);
		memset((void *)a, byte, n);
		a += n;
		left -= n;
	}
	armed = 0;
	return 0;
}

/* One access every `step` pages (at least one), starting at addr, within one armed
 * region: a caller timing strided reads must not pay a sigsetjmp per read (it saves the
 * signal mask, a system call). A write access is one atomic read-modify-write that keeps
 * the byte (a write fault, never a read fault first). */
int usermm_oracle_touch_every(uintptr_t addr, size_t len, size_t step, int write)
{
	volatile uintptr_t a = addr;
	uintptr_t end;
	size_t stride;
	int sig;

	if (wraps(addr, len))
		return SIGSEGV;
	if (step == 0)
		step = 1;
	if (step > SIZE_MAX / PAGE)
		step = SIZE_MAX / PAGE;
	stride = step * PAGE;
	end = addr + len;
	sig = sigsetjmp(fault_env, 1);
	if (sig)
		return sig;
	armed = 1;
	while (a < end) {
		uint8_t *p = (uint8_t *)a;
		uintptr_t next;
		if (write)
			rmw_keep(p);
		else
			(void)*(volatile uint8_t *)p;
		/* Stop when the next access would pass the end (or wrap the address space). */
		next = (a & ~(uintptr_t)(PAGE - 1)) + stride;
		if (next < a || next >= end)
			break;
		a = next;
	}
	armed = 0;
	return 0;
}

/* One access per page, starting at addr. */
int usermm_oracle_touch(uintptr_t addr, size_t len, int write)
{
	return usermm_oracle_touch_every(addr, len, 1, write);
}

/* Finds the first byte of [addr, addr+len) that is not `byte`: *at = its offset (or
 * len if none) and *found = its value. */
int usermm_oracle_check(uintptr_t addr, size_t len, uint8_t byte, size_t *at, uint8_t *found)
{
	volatile size_t off = 0;
	int sig;

	*at = len;
	if (wraps(addr, len))
		return SIGSEGV;
	sig = sigsetjmp(fault_env, 1);
	if (sig)
		return sig;
	armed = 1;
	while (off < len) {
		const volatile uint8_t *p = (const volatile uint8_t *)(addr + off);
		size_t n = chunk(addr + off, len - off), i;
		for (i = 0; i < n; i++) {
			if (p[i] != byte) {
				*at = off + i;
				*found = p[i];
				armed = 0;
				return 0;
			}
		}
		off += n;
	}
	armed = 0;
	return 0;
}
