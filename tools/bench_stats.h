/* What the benchmarks (tools/adam_bench.c, train_bench.c and the others)
 * share: one order and one median, so every tool's "median of N" means the
 * same thing, and one reading of an integer option. */
#ifndef STRATA_TOOLS_BENCH_STATS_H
#define STRATA_TOOLS_BENCH_STATS_H

#include <errno.h>
#include <stdlib.h>

/* qsort's order of doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* The median of v[0..n) (n >= 1); sorts v in place. */
static inline double bench_median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), bench_cmp_double);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* s as a whole decimal integer in lo..hi into *out: 0, or -1 (nothing
 * else in s, no overflow). */
static inline int bench_parse_int(const char *s, int lo, int hi, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*out = (int)v;
	return 0;
}

#endif
