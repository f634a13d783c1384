/* The cpu devices' insides that the cpu backends share: how the cpu-strict
 * device's addresses are made and read. Not a public header: only the cpu
 * device (device_cpu.c) and the queued cpu compute (compute_cpu.c), its
 * "kernels", translate device addresses; the engine never does.
 *
 * cpu-strict (docs/gpu.md, "Strict mode") hands out its arena at a tagged,
 * non-canonical address: ST_CPU_STRICT_TAG in the top 16 bits of a real
 * user-space address (which has them clear). Arithmetic on such an address
 * works as on any device pointer; a load or store through it faults on
 * x86-64 (a non-canonical address: #GP, SIGSEGV with si_code SI_KERNEL),
 * as a GPU's address does when the host dereferences it. The top byte
 * 0x4f breaks x86-64's canonical form at 4- and 5-level paging; the next
 * one, 0xa0, is under the top byte that arm64's TBI ignores, so the
 * address faults there too. */
#ifndef STRATA_DEVICE_CPU_H
#define STRATA_DEVICE_CPU_H

#include "strata/device.h"

#include <stdbool.h>
#include <stdint.h>

#define ST_CPU_STRICT_TAG 0x4fa0000000000000ull
#define ST_CPU_STRICT_TAG_MASK 0xffff000000000000ull

static inline bool st_cpu_strict_tagged(const void *p)
{
	return ((uintptr_t)p & ST_CPU_STRICT_TAG_MASK) == ST_CPU_STRICT_TAG;
}

/* The host address behind device address p (NULL stays NULL). */
static inline void *st_cpu_strict_host(const void *p)
{
	return (void *)((uintptr_t)p & ~ST_CPU_STRICT_TAG_MASK);
}

/* The device address of host address p in the arena. */
static inline void *st_cpu_strict_dev(const void *p)
{
	return (void *)((uintptr_t)p | ST_CPU_STRICT_TAG);
}

/* Whether d is the cpu-strict device. */
bool st_device_cpu_strict(const struct st_device *d);

/* Report a host access that strict mode refuses (what, printf-style) with
 * the calling thread's stack on stderr, then abort: the loud failure at
 * the place it happens. */
_Noreturn void st_cpu_strict_fail(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));

#endif
