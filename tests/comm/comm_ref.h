/* Rank-seeded data for the multi-rank comm tests (test_comm_mpi.c,
 * test_comm_nccl.c): any rank can make any rank's buffer, so each rank
 * computes the reference of a collective from every rank's inputs. */
#ifndef STRATA_TESTS_COMM_REF_H
#define STRATA_TESTS_COMM_REF_H

#include "strata/comm.h"

#include "strata/common.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef CHECK_PROG
/* CHECK(cond, fmt, ...) for a multi-rank test that defines CHECK_PROG
 * before this header and g_comm, g_rank and g_checks after it: counts the
 * check, and on failure names the rank, the place, the condition, the
 * message and strata's last error, then aborts the whole world. */
#define CHECK(cond, ...)                                                              \
	do {                                                                          \
		g_checks++;                                                           \
		if (!(cond)) {                                                        \
			fprintf(stderr, CHECK_PROG ": rank %d: %s:%d: check failed: %s: ", \
				g_rank, __FILE__, __LINE__, #cond);                   \
			fprintf(stderr, __VA_ARGS__);                                 \
			fprintf(stderr, " (%s)\n", st_error_last());                  \
			st_comm_abort(g_comm, 1);                                     \
		}                                                                     \
	} while (0)
#endif

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Element i of rank q's buffer for test salt: magnitudes spread over many
 * binades, so the sum's bits depend on the order of its terms; element 0
 * is -0.0 on every rank (a fold from +0 would give +0.0); element 1 a
 * subnormal in fp32. */
static double value(int q, size_t i, uint64_t salt)
{
	uint64_t h = mix(salt * 1000003u + (uint64_t)q * 7919u + i);
	double m = (double)(h & 0xffffff) / (double)0x1000000 - 0.5;
	int e = (int)((h >> 24) % 40) - 20;

	if (i == 0)
		return -0.0;
	if (i == 1)
		return 1e-41 * (q + 1);
	return ldexp(m, e);
}

static void gen(void *p, size_t n, enum st_comm_dtype dt, int q, uint64_t salt)
{
	for (size_t i = 0; i < n; i++) {
		double v = value(q, i, salt);

		if (dt == ST_COMM_F32)
			((float *)p)[i] = (float)v;
		else if (dt == ST_COMM_F64)
			((double *)p)[i] = v * (1.0 + 1e-9 * (double)q);
		else
			((uint16_t *)p)[i] = (uint16_t)(mix(salt + (uint64_t)q * 31 + i) & 0xffff);
	}
}

/* ref[i] = fold over q of in_q[off + i] (in_q = gen(per_rank elements)),
 * in rank order as strata/comm.h promises, or in reverse (to show the data
 * tells orders apart). 0, or -1 when out of memory. */
static int fold(void *ref, size_t n, size_t off, size_t per_rank, enum st_comm_dtype dt,
		int world, uint64_t salt, bool reverse)
{
	size_t eb = st_comm_dtype_bytes(dt);
	char *all = malloc(per_rank * eb * (size_t)world);

	if (!all)
		return -1;
	for (int q = 0; q < world; q++)
		gen(all + (size_t)q * per_rank * eb, per_rank, dt, q, salt);
	for (size_t i = 0; i < n; i++) {
		int q0 = reverse ? world - 1 : 0;

		if (dt == ST_COMM_F32) {
			const float *a = (const float *)all;
			float acc = a[(size_t)q0 * per_rank + off + i];

			for (int k = 1; k < world; k++) {
				int q = reverse ? world - 1 - k : k;

				acc += a[(size_t)q * per_rank + off + i];
			}
			((float *)ref)[i] = acc;
		} else {
			const double *a = (const double *)all;
			double acc = a[(size_t)q0 * per_rank + off + i];

			for (int k = 1; k < world; k++) {
				int q = reverse ? world - 1 - k : k;

				acc += a[(size_t)q * per_rank + off + i];
			}
			((double *)ref)[i] = acc;
		}
	}
	free(all);
	return 0;
}

#endif
