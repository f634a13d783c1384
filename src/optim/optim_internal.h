/* src/optim internals: the kernel table and the scalar recipe every vector
 * path must reproduce bit for bit. Tests include this to run each kernel
 * (including the AVX-512 variant without VCVTNEPS2BF16) directly. */
#ifndef STRATA_OPTIM_INTERNAL_H
#define STRATA_OPTIM_INTERNAL_H

#include "strata/optim.h"

#include <math.h>
#include <stdint.h>

/* Chunk sizes are part of the determinism contract of st_grad_sumsq(); the
 * Adam chunk only sets the OpenMP grain (the update is element-wise). Both
 * are multiples of 16 so vector bodies never straddle a chunk. */
#define ST_ADAM_CHUNK_ELEMS 16384u
#define ST_GSTAT_CHUNK_ELEMS 16384u
#define ST_GSTAT_LANES 8u

/* How far ahead of the element being updated the vector kernels prefetch
 * each input stream (G, P, M, V), in elements: 512 fp32 elements are 2 KiB,
 * 32 cache lines per stream. The hardware prefetcher alone kept too few
 * lines in flight for a single core here (docs/optim.md, "Speed"). Only
 * where the data is read; never changes a bit. */
#ifndef ST_ADAM_PREFETCH_ELEMS /* -D for tuning runs only */
#define ST_ADAM_PREFETCH_ELEMS 512u
#endif

/* Flags of st_optim_kernel.adam(). */
enum {
	/* Write W with non-temporal (streaming) stores, from the first element
	 * where W is vector-aligned: W is written and never read in the step,
	 * so its lines need not be read for ownership first. For calls too
	 * big to stay in cache; the bits are the same either way. */
	ST_OPTIM_KF_STREAM_W = 1u << 0,
};

/* st_adam_apply() streams W when one call touches at least this many bytes
 * (G, P, M, V and W): past any L2 and most of an L3, so W would be evicted
 * before anyone reads it anyway. */
#define ST_ADAM_STREAM_MIN_BYTES (32ull << 20)

/* One kernel variant. adam() and gstat() work on one chunk, single thread. */
struct st_optim_kernel {
	const char *name;            /* "scalar", "avx2", "avx512", "avx512bf16" */
	enum st_optim_path path;
	int (*supported)(void);      /* CPU and OS can run it */
	/* Update n elements of b (pointers already at the chunk's start);
	 * kflags: ST_OPTIM_KF_*. Returns how many elements had a non-finite
	 * scaled gradient (those are left unchanged). */
	uint64_t (*adam)(const struct st_adam_step *s, const struct st_adam_bufs *b, size_t n,
			 unsigned kflags);
	/* lanes[j] = sum over i = j mod 8 (in increasing i) of g[i]^2 in fp64;
	 * *absmax_bits = max over i of (bits(g[i]) & 0x7fffffff). n <= chunk. */
	void (*gstat)(const void *g, enum st_optim_dtype g_dtype, size_t n,
		      double lanes[ST_GSTAT_LANES], uint32_t *absmax_bits);
};

extern const struct st_optim_kernel st_optim_kernel_scalar;
#if defined(__x86_64__) && defined(__GNUC__)
#define ST_OPTIM_HAVE_X86 1
extern const struct st_optim_kernel st_optim_kernel_avx2;
extern const struct st_optim_kernel st_optim_kernel_avx512;
extern const struct st_optim_kernel st_optim_kernel_avx512bf16;

#include <cpuid.h>

/* F16C from cpuid (leaf 1, ecx bit 29): clang's __builtin_cpu_supports()
 * does not know the "f16c" string that gcc's does. */
static inline int st_cpu_has_f16c(void)
{
	unsigned a, b, c, d;

	return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

/* All kernels compiled in, scalar first; *count gets their number. */
const struct st_optim_kernel *const *st_optim_kernels(size_t *count);

/* The kernel that runs path (resolved; the CPU must support it). */
const struct st_optim_kernel *st_optim_kernel_for(enum st_optim_path path);

/* The recipe of one element (optim.h). Returns 1 and changes nothing when
 * the scaled gradient is NaN or Inf, else updates *p, *m, *v and returns 0.
 * Vector paths run exactly these operations in this order. */
static inline int st_adam_elem(const struct st_adam_step *s, float graw,
			       float *p, float *m, float *v)
{
	float g = graw * s->grad_scale;
	float mn, vn, d, pn;

	if (!isfinite(g))
		return 1;
	mn = fmaf(s->beta1, *m, s->one_minus_beta1 * g);
	vn = fmaf(s->beta2, *v, (s->one_minus_beta2 * g) * g);
	d = fmaf(sqrtf(vn), s->rsqrt_bc2, s->eps);
	pn = fmaf(s->neg_step_size, mn / d, *p * s->decay);
	*p = pn;
	*m = mn;
	*v = vn;
	return 0;
}

/* Scalar tail shared by every kernel: elements [i, n) of b. */
static inline uint64_t st_adam_tail(const struct st_adam_step *s,
				    const struct st_adam_bufs *b, size_t i, size_t n)
{
	uint64_t bad = 0;

	for (; i < n; i++) {
		float graw = b->g_dtype == ST_OPTIM_BF16
			? st_f32_from_bf16(((const uint16_t *)b->g)[i])
			: ((const float *)b->g)[i];

		bad += (uint64_t)st_adam_elem(s, graw, &b->p[i], &b->m[i], &b->v[i]);
		if (!b->w)
			continue;
		switch (b->w_dtype) {
		case ST_OPTIM_BF16:
			((uint16_t *)b->w)[i] = st_bf16_from_f32(b->p[i]);
			break;
		case ST_OPTIM_F16:
			((uint16_t *)b->w)[i] = st_f16_from_f32(b->p[i]);
			break;
		case ST_OPTIM_F32:
			((float *)b->w)[i] = b->p[i];
			break;
		}
	}
	return bad;
}

/* A prefetch hint for the line byte_off bytes past base (which may lie past
 * the end of the array: a prefetch never faults). Integer arithmetic, so no
 * out-of-bounds pointer is formed. */
static inline void st_optim_prefetch(const void *base, size_t byte_off)
{
	__builtin_prefetch((const void *)((uintptr_t)base + byte_off), 0, 3);
}

/* Scalar tail of gstat: elements [i, n), lane = i mod 8. */
static inline void st_gstat_tail(const void *g, enum st_optim_dtype g_dtype, size_t i,
				 size_t n, double lanes[ST_GSTAT_LANES], uint32_t *absmax_bits)
{
	for (; i < n; i++) {
		uint32_t u = g_dtype == ST_OPTIM_BF16
			? (uint32_t)((const uint16_t *)g)[i] << 16
			: st_f32_bits(((const float *)g)[i]);
		double d = (double)st_f32_from_bits(u);

		/* d * d is exact in fp64 (24-bit significands), so this equals
		 * the vector paths' fma. */
		lanes[i % ST_GSTAT_LANES] += d * d;
		if ((u & 0x7fffffffu) > *absmax_bits)
			*absmax_bits = u & 0x7fffffffu;
	}
}

#endif
