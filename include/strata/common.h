/* strata: common macros, error context and small helpers shared by every seam.
 *
 * Errors follow liburing's convention: library functions return 0 (or a
 * byte count) on success and -errno on failure, and never touch errno.
 * The human-readable detail of the most recent failure on this thread
 * (file, offset, native CUDA/hwloc message...) is kept by st_error_set()
 * and read back with st_error_last(); only main() and tools print it. */
#ifndef STRATA_COMMON_H
#define STRATA_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ST_VERSION_MAJOR 0
#define ST_VERSION_MINOR 1

#define ST_KiB (1024ull)
#define ST_MiB (1024ull * 1024ull)
#define ST_GiB (1024ull * 1024ull * 1024ull)

/* Alignment of every flat buffer, extent and O_DIRECT transfer. */
#define ST_PAGE_BYTES 4096u

#define ST_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ST_MAX(a, b) ((a) > (b) ? (a) : (b))
#define ST_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define ST_UNUSED(x) ((void)(x))

#if defined(__GNUC__)
#define ST_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define ST_LIKELY(x) __builtin_expect(!!(x), 1)
#define ST_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define ST_PRINTF(f, a)
#define ST_LIKELY(x) (x)
#define ST_UNLIKELY(x) (x)
#endif

/* Round up to a multiple of a power of two. */
static inline uint64_t st_align_up(uint64_t x, uint64_t align)
{
	return (x + align - 1) & ~(align - 1);
}

static inline int st_is_pow2(uint64_t x)
{
	return x && !(x & (x - 1));
}

/* Record the detail of a failure for this thread and return err unchanged,
 * so call sites read `return st_error_set(-EIO, "read %s: ...", path);`.
 * err must be a negative errno. An argument may be st_error_last(), to add
 * context to the detail a callee recorded. */
int st_error_set(int err, const char *fmt, ...) ST_PRINTF(2, 3);

/* The detail recorded by the last st_error_set() on this thread, or "" when
 * none. Borrowed: valid until the next st_error_set() on this thread. */
const char *st_error_last(void);

/* Forget the recorded detail. */
void st_error_clear(void);

/* Monotonic clock in nanoseconds. */
uint64_t st_now_ns(void);

/* Parse a byte size such as "4096", "128K", "1M", "4G", "1.5G" (binary units,
 * optional trailing 'B' or 'iB'). Returns 0 and sets *out_bytes, or -EINVAL
 * when the text is not a size (empty, negative, garbage, overflow). */
int st_parse_size(const char *text, uint64_t *out_bytes);
/* As st_parse_size(), but a fraction that does not come to whole bytes
 * ("2.3G") rounds down to a multiple of page (a budget on the command
 * line); an exact size is kept as it is. */
int st_parse_size_paged(const char *text, uint64_t page, uint64_t *out_bytes);

/* Format a byte count as "1.50 GiB" into buf (at least 16 bytes). */
const char *st_format_bytes(uint64_t bytes, char *buf, size_t buf_len);

/* Format a time left as "12s", "3m04s" or "2h05m" into buf ("?" for a
 * negative or non-finite number of seconds); returns buf. */
const char *st_format_eta(double seconds, char *buf, size_t buf_len);

/* Warnings the library prints once (e.g. "mlock refused"); a library never
 * prints anything else. Goes to stderr prefixed with "strata: warning: ".
 * Set ST_QUIET=1 in the environment to silence them. */
void st_warn(const char *fmt, ...) ST_PRINTF(1, 2);

/* The index of the first of x's n_elems values that is NaN or +-Inf or,
 * with nonneg, below zero (-0 passes); n_elems when every value passes.
 * One read of x, in blocks with no branch inside, so a finite tensor costs
 * about what reading it from cache does (src/util/finite.c). */
uint64_t st_f32_find_bad(const float *x, uint64_t n_elems, bool nonneg);

/* v as a message says it: "nan", "inf", "-inf", or "%g". Returns buf. */
const char *st_f32_name(float v, char *buf, size_t bytes);

#endif
