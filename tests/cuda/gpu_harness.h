/* What the GPU tests that run one op record through the cuda compute share
 * (test_cuda_attention_bf16.c, test_cuda_head_ce.c): the compute, the fail
 * count, a seeded random source, device buffers filled from the host or
 * poisoned, results fetched back, and the two comparisons (relative L2
 * within a tolerance, the same bits). One translation unit each: the state
 * is static, the helpers static inline. Setup failures end the program. */
#ifndef STRATA_TESTS_CUDA_GPU_HARNESS_H
#define STRATA_TESTS_CUDA_GPU_HARNESS_H

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute_internal.h"
#include "strata/compute.h"
#include "cuda_ops.h"
#include "strata/kernels.h"

static int fails;
static struct st_compute *cx;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static inline float rng_uniform(float a)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return a * (2.0f * (float)((rng_state >> 40) * (1.0 / 16777216.0)) - 1.0f);
}

static inline void die(const char *what, int rc)
{
	fprintf(stderr, "FAIL %s: %d: %s\n", what, rc, st_error_last());
	exit(1);
}

/* The cuda compute on device 0 into cx; without a GPU or driver "no GPU:
 * skipped" and exit 77 (meson's SKIP). */
static inline void gpu_open(void)
{
	if (!st_cuda_available()) {
		printf("no GPU: skipped\n");
		exit(77);
	}
	int rc = st_compute_cuda_create(0, &cx);
	if (rc)
		die("st_compute_cuda_create", rc);
}

static inline void *xmalloc(size_t bytes)
{
	void *p = malloc(bytes ? bytes : 4);

	if (!p)
		die("malloc", -ENOMEM);
	return p;
}

static inline void *dev_from(const void *src, size_t bytes)
{
	void *d = NULL;
	int rc = st_cuda_alloc(&d, bytes ? bytes : 4);

	if (rc)
		die("st_cuda_alloc", rc);
	if (bytes && (rc = st_cuda_h2d(d, src, bytes)))
		die("st_cuda_h2d", rc);
	return d;
}

/* A device buffer of 0xff bytes (NaN as fp32 and bf16): an element the
 * kernel forgets to write fails the comparison. */
static inline void *dev_poison(size_t bytes)
{
	void *d = NULL;
	int rc = st_cuda_alloc(&d, bytes ? bytes : 4);
	if (rc || (rc = st_cuda_memset(d, 0xff, bytes ? bytes : 4)))
		die("poison", rc);
	return d;
}

/* n values back from the device (after the compute's queue drains): fp32,
 * or bf16 widened. */
static inline float *back(const void *dev, size_t n, bool bf16)
{
	float *f = xmalloc(4 * n);
	int rc = st_compute_sync(cx);

	if (rc)
		die("st_compute_sync", rc);
	if (bf16) {
		uint16_t *h = xmalloc(2 * n);
		if ((rc = st_cuda_d2h(h, dev, 2 * n)))
			die("st_cuda_d2h", rc);
		for (size_t i = 0; i < n; i++)
			f[i] = st_cpu_f32_from_bf16(h[i]);
		free(h);
	} else if ((rc = st_cuda_d2h(f, dev, 4 * n))) {
		die("st_cuda_d2h", rc);
	}
	return f;
}

/* got within tol of ref (relative L2; of the increments over base when
 * base is not NULL), every element finite. */
static inline void expect(const char *shape, const char *what, const float *got,
			  const float *ref, const float *base, size_t n, double tol)
{
	double num = 0.0, den = 0.0;

	for (size_t i = 0; i < n; i++) {
		if (!isfinite(got[i])) {
			fprintf(stderr, "FAIL %s %s: element %zu of %zu is %g\n", shape, what, i, n,
				(double)got[i]);
			fails++;
			return;
		}
		const double g = base ? (double)got[i] - base[i] : got[i];
		const double r = base ? (double)ref[i] - base[i] : ref[i];
		num += (g - r) * (g - r);
		den += r * r;
	}
	const double rel = den > 0.0 ? sqrt(num / den) : sqrt(num);
	if (!(rel <= tol)) {
		fprintf(stderr, "FAIL %s %s: relative error %.3g > %.1g\n", shape, what, rel, tol);
		fails++;
		return;
	}
	printf("ok   %s %-22s n=%-9zu rel %.2e\n", shape, what, n, rel);
}

/* a and b the same bits (a second run, or the forward alone against the
 * backward call). */
static inline void expect_same(const char *shape, const char *what, const float *a,
			       const float *b, size_t n)
{
	if (memcmp(a, b, 4 * n) != 0) {
		fprintf(stderr, "FAIL %s %s: not the same bits\n", shape, what);
		fails++;
	}
}

#endif
