/* Shared helpers for the optim tests: a seeded RNG, buffers with sentinels
 * around them, and the double-precision AdamW reference. */
#ifndef STRATA_OPTIM_TEST_UTIL_H
#define STRATA_OPTIM_TEST_UTIL_H

#include "strata/common.h"
#include "strata/optim.h"
#include "optim_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline uint64_t tu_rand_u64(uint64_t *s)
{
	/* splitmix64 */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static inline float tu_rand_f(uint64_t *s, float lo, float hi)
{
	double u = (double)(tu_rand_u64(s) >> 11) * (1.0 / 9007199254740992.0);

	return (float)(lo + (hi - lo) * u);
}

/* Bytes of sentinel after (and before) each test array. */
#define TU_GUARD_BYTES 64
#define TU_SENTINEL 0xa5

/* A buffer of n elements of elem_bytes, starting offset_elems elements past
 * a 64-byte boundary, with sentinel bytes on both sides. */
struct tu_buf {
	unsigned char *raw;
	void *data;
	size_t bytes;
	size_t raw_bytes;
};

static inline void tu_buf_alloc(struct tu_buf *b, size_t n, size_t elem_bytes,
				size_t offset_elems)
{
	size_t lead = TU_GUARD_BYTES + offset_elems * elem_bytes;

	b->bytes = n * elem_bytes;
	b->raw_bytes = lead + b->bytes + TU_GUARD_BYTES;
	b->raw = aligned_alloc(64, st_align_up(b->raw_bytes, 64));
	if (!b->raw)
		abort();
	memset(b->raw, TU_SENTINEL, b->raw_bytes);
	b->data = b->raw + lead;
}

static inline int tu_buf_guards_ok(const struct tu_buf *b)
{
	const unsigned char *d = b->data;

	for (const unsigned char *q = b->raw; q < d; q++)
		if (*q != TU_SENTINEL)
			return 0;
	for (const unsigned char *q = d + b->bytes; q < b->raw + b->raw_bytes; q++)
		if (*q != TU_SENTINEL)
			return 0;
	return 1;
}

static inline void tu_buf_free(struct tu_buf *b)
{
	free(b->raw);
	b->raw = NULL;
}

static inline size_t tu_dtype_bytes(enum st_optim_dtype dt)
{
	return dt == ST_OPTIM_F32 ? 4u : 2u;
}

static inline float tu_g_at(const void *g, enum st_optim_dtype dt, size_t i)
{
	return dt == ST_OPTIM_BF16 ? st_f32_from_bf16(((const uint16_t *)g)[i])
				   : ((const float *)g)[i];
}

/* Textbook AdamW in double for one element; returns the new p and sets
 * *m, *v. *scale gets the magnitude the float result's error is relative to. */
static inline double tu_adam_ref(const struct st_adam_hparams *hp, double graw, double *p,
				 double *m, double *v, double *p_scale, double *m_scale)
{
	double b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr;
	double g = graw * (double)hp->grad_scale;
	double bc1 = 1.0 - pow(b1, (double)hp->step), bc2 = 1.0 - pow(b2, (double)hp->step);
	double mhat, vhat, upd;

	*m_scale = b1 * fabs(*m) + (1.0 - b1) * fabs(g);
	*m = b1 * *m + (1.0 - b1) * g;
	*v = b2 * *v + (1.0 - b2) * g * g;
	mhat = *m / bc1;
	vhat = *v / bc2;
	upd = mhat / (sqrt(vhat) + (double)hp->eps);
	*p_scale = fabs(*p * (1.0 - lr * hp->weight_decay)) +
		   lr * (*m_scale / bc1) / (sqrt(vhat) + (double)hp->eps);
	*p = *p * (1.0 - lr * (double)hp->weight_decay) - lr * upd;
	return *p;
}

/* Run the kernel over the whole range in one call (no OpenMP split), with
 * the kernel flags kflags (ST_OPTIM_KF_*). */
static inline uint64_t tu_kernel_run_flags(const struct st_optim_kernel *k,
					   const struct st_adam_hparams *hp,
					   const struct st_adam_bufs *b, size_t n, unsigned kflags)
{
	struct st_adam_step s;

	if (st_adam_prep(&s, hp))
		abort();
	return k->adam(&s, b, n, kflags);
}

static inline uint64_t tu_kernel_run(const struct st_optim_kernel *k,
				     const struct st_adam_hparams *hp,
				     const struct st_adam_bufs *b, size_t n)
{
	return tu_kernel_run_flags(k, hp, b, n, 0);
}

#endif
