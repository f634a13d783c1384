/* Values that are not finite, found in one pass over bytes already read
 * (loading weights, resuming, saving): st_f32_find_bad(). */
#include "strata/common.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Block of elements whose flags are OR-ed before any branch: the loop over
 * one block has no early exit, so the compiler vectorises it. */
#define ST_FINITE_BLOCK_ELEMS 1024u

static inline bool f32_bad(uint32_t u, bool nonneg)
{
	/* all exponent bits set: Inf or NaN; with nonneg, the sign bit set on
	 * anything but -0 */
	return (u & 0x7f800000u) == 0x7f800000u || (nonneg && u > 0x80000000u);
}

uint64_t st_f32_find_bad(const float *x, uint64_t n_elems, bool nonneg)
{
	for (uint64_t lo = 0; lo < n_elems; lo += ST_FINITE_BLOCK_ELEMS) {
		uint64_t hi = ST_MIN(lo + ST_FINITE_BLOCK_ELEMS, n_elems);
		unsigned bad = 0;

		for (uint64_t i = lo; i < hi; i++) {
			uint32_t u;

			memcpy(&u, &x[i], sizeof(u));
			bad |= f32_bad(u, nonneg);
		}
		if (ST_LIKELY(!bad))
			continue;
		for (uint64_t i = lo; i < hi; i++) {
			uint32_t u;

			memcpy(&u, &x[i], sizeof(u));
			if (f32_bad(u, nonneg))
				return i;
		}
	}
	return n_elems;
}

const char *st_f32_name(float v, char *buf, size_t bytes)
{
	if (isnan(v))
		snprintf(buf, bytes, "nan");
	else if (isinf(v))
		snprintf(buf, bytes, "%sinf", v < 0 ? "-" : "");
	else
		snprintf(buf, bytes, "%g", (double)v);
	return buf;
}
