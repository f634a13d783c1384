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

static inline float st_adam_graw(const struct st_adam_bufs *b, size_t i)
{
	return b->g_dtype == ST_OPTIM_BF16 ? st_f32_from_bf16(((const uint16_t *)b->g)[i])
					   : ((const float *)b->g)[i];
}

/* W[i] from P[i]. */
static inline void st_adam_w_store(const struct st_adam_bufs *b, size_t i)
{
	if (!b->w)
		return;
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

/* Scalar tail shared by every kernel: elements [i, n) of b, state F32 or
 * BF16 (Q8 goes by blocks: st_adam_q8_blocks()). */
static inline uint64_t st_adam_tail(const struct st_adam_step *s,
				    const struct st_adam_bufs *b, size_t i, size_t n)
{
	uint64_t bad = 0;

	for (; i < n; i++) {
		float graw = st_adam_graw(b, i);

		if (b->state == ST_OPTIM_STATE_BF16) {
			uint16_t *mc = b->mc, *vc = b->vc;
			float m = st_f32_from_bf16(mc[i]), v = st_f32_from_bf16(vc[i]);

			bad += (uint64_t)st_adam_elem(s, graw, &b->p[i], &m, &v);
			mc[i] = st_bf16_from_f32(m);
			vc[i] = st_bf16_from_f32(v);
		} else {
			bad += (uint64_t)st_adam_elem(s, graw, &b->p[i], &b->m[i], &b->v[i]);
		}
		st_adam_w_store(b, i);
	}
	return bad;
}

/* --- the q8 state: the scalar steps every vector path reproduces ---------- */

/* fp32 -> int32 as CVTPS2DQ does under the default MXCSR: round to nearest
 * even; NaN and out of range give INT32_MIN. */
static inline int32_t st_q8_cvt_i32(float x)
{
	float r = rintf(x);

	return (r >= -0x1p31f && r < 0x1p31f) ? (int32_t)r : INT32_MIN;
}

static inline int32_t st_q8_clamp(int32_t x, int32_t lo, int32_t hi)
{
	return x < lo ? lo : x > hi ? hi : x;
}

/* The q8 codes are small unsigned floats relative to the block's scale: a
 * 4-bit exponent (bias 15) and mb mantissa bits (V: 4, M: 3, plus a sign
 * bit), normal from 2^-14, subnormal below in steps of 2^-(14 + mb).
 * Code c -> r. */
static inline float st_q8_dec(uint32_t c, unsigned mb)
{
	return c >= (1u << mb) ? st_f32_from_bits((c + (112u << mb)) << (23u - mb))
			       : (float)c * st_f32_from_bits((127u - 14u - mb) << 23);
}

/* r >= 0 -> code, round to nearest even, saturating at the largest code. */
static inline uint32_t st_q8_enc(float r, unsigned mb)
{
	uint32_t u = st_f32_bits(r), sh = 23u - mb;
	int32_t c;

	if ((int32_t)u > 0x387fffff) /* r >= 2^-14: normal */
		c = (int32_t)((u + ((1u << (sh - 1u)) - 1u) + ((u >> sh) & 1u)) >> sh) -
		    (int32_t)(112u << mb);
	else
		c = st_q8_cvt_i32(r * st_f32_from_bits((127u + 14u + mb) << 23));
	return (uint32_t)st_q8_clamp(c, 0, (int32_t)(1u << (mb + 4u)) - 1);
}

#define ST_Q8_VMB 4u /* V's mantissa bits */
#define ST_Q8_MMB 3u /* M's mantissa bits (and a sign bit) */

/* V's code -> r = sqrt(V) / v_scale (optim.h). */
static inline float st_q8v_decode(uint32_t c)
{
	return st_q8_dec(c, ST_Q8_VMB);
}

static inline uint8_t st_q8v_encode(float r)
{
	return (uint8_t)st_q8_enc(r, ST_Q8_VMB);
}

/* M's code -> M / m_scale: the sign bit 7 on the magnitude's code. */
static inline float st_q8m_decode(uint32_t c)
{
	return st_f32_from_bits(st_f32_bits(st_q8_dec(c & 0x7fu, ST_Q8_MMB)) | ((c & 0x80u) << 24));
}

/* M and 1 / m_scale -> M's code. */
static inline uint8_t st_q8m_encode(float m, float inv)
{
	uint32_t t = st_f32_bits(m * inv);

	return (uint8_t)(st_q8_enc(st_f32_from_bits(t & 0x7fffffffu), ST_Q8_MMB) |
			 ((t >> 24) & 0x80u));
}

/* A block's scales from max |M'| and max sqrt(V') (as bits: the vector
 * paths take the max as unsigned integers), and their inverses for the
 * encoding. Shared by every path: one set of divisions per block. */
struct st_q8_scales {
	float m_scale, m_inv, v_scale, v_inv;
};

static inline struct st_q8_scales st_q8_block_scales(uint32_t mmax_bits, uint32_t smax_bits)
{
	float am = st_f32_from_bits(mmax_bits), sm = st_f32_from_bits(smax_bits);
	struct st_q8_scales q;

	q.m_scale = am;
	q.m_inv = am > 0.0f ? 1.0f / am : 0.0f;
	q.v_scale = sm;
	q.v_inv = sm > 0.0f ? 1.0f / sm : 0.0f;
	return q;
}

/* Pass 1 of a q8 block for element i: dequantize M[i], V[i] with the
 * block's old scales, run the recipe, write P[i] and W[i]; M' goes to *mo,
 * sqrt(V') to *so, and their magnitudes into the block's maxima. */
static inline int st_q8_pass1(const struct st_adam_step *s, const struct st_adam_bufs *b,
			      size_t i, float msc, float vsc, float *mo, float *so,
			      uint32_t *mmax, uint32_t *smax)
{
	float m = st_q8m_decode(((const uint8_t *)b->mc)[i]) * msc;
	float sv = st_q8v_decode(((const uint8_t *)b->vc)[i]) * vsc;
	float v = sv * sv, sq;
	int bad = st_adam_elem(s, st_adam_graw(b, i), &b->p[i], &m, &v);

	st_adam_w_store(b, i);
	sq = sqrtf(v);
	*mo = m;
	*so = sq;
	if ((st_f32_bits(m) & 0x7fffffffu) > *mmax)
		*mmax = st_f32_bits(m) & 0x7fffffffu;
	if ((st_f32_bits(sq) & 0x7fffffffu) > *smax)
		*smax = st_f32_bits(sq) & 0x7fffffffu;
	return bad;
}

/* Pass 2 for element i: quantize M' and sqrt(V') with the new scales. */
static inline void st_q8_pass2(const struct st_adam_bufs *b, size_t i,
			       const struct st_q8_scales *q, float mo, float so)
{
	((uint8_t *)b->mc)[i] = st_q8m_encode(mo, q->m_inv);
	((uint8_t *)b->vc)[i] = st_q8v_encode(so * q->v_inv);
}

/* The scalar q8 kernel: elements [0, n) of b, by blocks from b's start. */
static inline uint64_t st_adam_q8_blocks(const struct st_adam_step *s,
					 const struct st_adam_bufs *b, size_t n)
{
	float mo[ST_Q8_BLOCK], so[ST_Q8_BLOCK];
	uint64_t bad = 0;

	for (size_t k0 = 0; k0 < n; k0 += ST_Q8_BLOCK) {
		size_t len = n - k0 < ST_Q8_BLOCK ? n - k0 : ST_Q8_BLOCK, blk = k0 / ST_Q8_BLOCK;
		uint32_t mmax = 0, smax = 0;
		struct st_q8_scales q;

		for (size_t j = 0; j < len; j++)
			bad += (uint64_t)st_q8_pass1(s, b, k0 + j, b->m_scale[blk],
						     b->v_scale[blk], &mo[j], &so[j], &mmax, &smax);
		q = st_q8_block_scales(mmax, smax);
		for (size_t j = 0; j < len; j++)
			st_q8_pass2(b, k0 + j, &q, mo[j], so[j]);
		b->m_scale[blk] = q.m_scale;
		b->v_scale[blk] = q.v_scale;
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
