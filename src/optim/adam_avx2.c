/* The AVX2 + FMA + F16C kernel, 8 lanes. Compiled with a per-function target
 * so the same binary runs anywhere; it is only called when cpuid says the
 * CPU has these features, and it never uses an AVX-512 instruction. */
#include "optim_internal.h"

#include "strata/common.h"

#if defined(ST_OPTIM_HAVE_X86)
#include <immintrin.h>

#define ST_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ST_AVX2_INLINE ST_AVX2 static inline __attribute__((always_inline))

static int avx2_supported(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
	       st_cpu_has_f16c();
}

/* 8 fp32 -> 8 bf16, exactly st_bf16_from_f32(). */
ST_AVX2_INLINE __m128i avx2_bf16_from_f32(__m256 x)
{
	__m256i u = _mm256_castps_si256(x);
	__m256i hi = _mm256_srli_epi32(u, 16);
	__m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
	__m256i r = _mm256_srli_epi32(
		_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
	__m256i qnan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
	__m256 isnan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);

	r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r),
						 _mm256_castsi256_ps(qnan), isnan));
	/* values fit in 16 bits, so unsigned saturation is exact */
	r = _mm256_packus_epi32(r, r);
	r = _mm256_permute4x64_epi64(r, 0x08);
	return _mm256_castsi256_si128(r);
}

/* One chunk; gdt, has_w, wdt and nt are constants at every call. nt: W by
 * streaming stores (the caller has checked W's elements are aligned). */
ST_AVX2_INLINE uint64_t avx2_adam_body(const struct st_adam_step *s,
				       const struct st_adam_bufs *b, size_t n,
				       const enum st_optim_dtype gdt, const int has_w,
				       const enum st_optim_dtype wdt, const int nt)
{
	const __m256 gs = _mm256_set1_ps(s->grad_scale);
	const __m256 b1 = _mm256_set1_ps(s->beta1), omb1 = _mm256_set1_ps(s->one_minus_beta1);
	const __m256 b2 = _mm256_set1_ps(s->beta2), omb2 = _mm256_set1_ps(s->one_minus_beta2);
	const __m256 c2 = _mm256_set1_ps(s->rsqrt_bc2), eps = _mm256_set1_ps(s->eps);
	const __m256 nstep = _mm256_set1_ps(s->neg_step_size), decay = _mm256_set1_ps(s->decay);
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	const __m256 inf = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
	const size_t gb = gdt == ST_OPTIM_BF16 ? 2u : 4u;
	const size_t wvec = wdt == ST_OPTIM_F32 ? 32u : 16u; /* bytes of W per vector */
	/* Locals: stores through P, M, V cannot make the compiler reload them. */
	const float *const g32 = b->g;
	const uint16_t *const g16 = b->g;
	float *const p = b->p, *const m = b->m, *const v = b->v;
	uint16_t *const w16 = b->w;
	float *const w32 = b->w;
	uint64_t bad = 0;
	size_t i = 0;

	if (nt) {
		size_t mis = (size_t)((uintptr_t)b->w % wvec);

		i = ST_MIN(n, mis ? (wvec - mis) / (wvec / 8u) : 0u);
		bad += st_adam_tail(s, b, 0, i);
	}
	for (; i + 8 <= n; i += 8) {
		__m256 g, ok, pv, mv, vv, mn, vn, d, pn;
		int okbits;

		/* every other iteration repeats a line: cheaper than a branch */
		st_optim_prefetch(gdt == ST_OPTIM_BF16 ? (const void *)(g16 + i) : (const void *)(g32 + i),
				  ST_ADAM_PREFETCH_ELEMS * gb);
		st_optim_prefetch(p + i, ST_ADAM_PREFETCH_ELEMS * 4u);
		st_optim_prefetch(m + i, ST_ADAM_PREFETCH_ELEMS * 4u);
		st_optim_prefetch(v + i, ST_ADAM_PREFETCH_ELEMS * 4u);
		if (gdt == ST_OPTIM_BF16) {
			__m128i h = _mm_loadu_si128((const __m128i *)(g16 + i));
			g = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
		} else {
			g = _mm256_loadu_ps(g32 + i);
		}
		g = _mm256_mul_ps(g, gs);
		ok = _mm256_cmp_ps(_mm256_and_ps(g, absmask), inf, _CMP_LT_OQ);
		pv = _mm256_loadu_ps(p + i);
		mv = _mm256_loadu_ps(m + i);
		vv = _mm256_loadu_ps(v + i);
		mn = _mm256_fmadd_ps(b1, mv, _mm256_mul_ps(omb1, g));
		vn = _mm256_fmadd_ps(b2, vv, _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
		d = _mm256_fmadd_ps(_mm256_sqrt_ps(vn), c2, eps);
		pn = _mm256_fmadd_ps(nstep, _mm256_div_ps(mn, d), _mm256_mul_ps(pv, decay));
		okbits = _mm256_movemask_ps(ok);
		if (ST_UNLIKELY(okbits != 0xff)) {
			pn = _mm256_blendv_ps(pv, pn, ok);
			mn = _mm256_blendv_ps(mv, mn, ok);
			vn = _mm256_blendv_ps(vv, vn, ok);
			bad += 8u - (unsigned)__builtin_popcount((unsigned)okbits);
		}
		_mm256_storeu_ps(p + i, pn);
		_mm256_storeu_ps(m + i, mn);
		_mm256_storeu_ps(v + i, vn);
		if (!has_w)
			continue;
		if (wdt == ST_OPTIM_F32) {
			if (nt)
				_mm256_stream_ps(w32 + i, pn);
			else
				_mm256_storeu_ps(w32 + i, pn);
		} else {
			__m128i h = wdt == ST_OPTIM_BF16
				? avx2_bf16_from_f32(pn)
				: _mm256_cvtps_ph(pn, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);

			if (nt)
				_mm_stream_si128((__m128i *)(w16 + i), h);
			else
				_mm_storeu_si128((__m128i *)(w16 + i), h);
		}
	}
	bad += st_adam_tail(s, b, i, n);
	if (nt)
		_mm_sfence(); /* the streamed lines are visible before we return */
	return bad;
}

ST_AVX2 static uint64_t avx2_adam(const struct st_adam_step *s, const struct st_adam_bufs *b,
				  size_t n, unsigned kflags)
{
	const int g16 = b->g_dtype == ST_OPTIM_BF16;
	const size_t wesz = b->w_dtype == ST_OPTIM_F32 ? 4u : 2u;
	const int nt = (kflags & ST_OPTIM_KF_STREAM_W) && b->w && (uintptr_t)b->w % wesz == 0;

#define AVX2_CALL(gdt, has_w, wdt)                                                         \
	(nt ? avx2_adam_body(s, b, n, gdt, has_w, wdt, 1)                                  \
	    : avx2_adam_body(s, b, n, gdt, has_w, wdt, 0))
	if (!b->w)
		return g16 ? avx2_adam_body(s, b, n, ST_OPTIM_BF16, 0, ST_OPTIM_F32, 0)
			   : avx2_adam_body(s, b, n, ST_OPTIM_F32, 0, ST_OPTIM_F32, 0);
	switch (b->w_dtype) {
	case ST_OPTIM_BF16:
		return g16 ? AVX2_CALL(ST_OPTIM_BF16, 1, ST_OPTIM_BF16)
			   : AVX2_CALL(ST_OPTIM_F32, 1, ST_OPTIM_BF16);
	case ST_OPTIM_F16:
		return g16 ? AVX2_CALL(ST_OPTIM_BF16, 1, ST_OPTIM_F16)
			   : AVX2_CALL(ST_OPTIM_F32, 1, ST_OPTIM_F16);
	default:
		return g16 ? AVX2_CALL(ST_OPTIM_BF16, 1, ST_OPTIM_F32)
			   : AVX2_CALL(ST_OPTIM_F32, 1, ST_OPTIM_F32);
	}
#undef AVX2_CALL
}

ST_AVX2 static void avx2_gstat(const void *g, enum st_optim_dtype g_dtype, size_t n,
			       double lanes[ST_GSTAT_LANES], uint32_t *absmax_bits)
{
	__m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd(); /* lanes 0-3, 4-7 */
	__m256i amax = _mm256_setzero_si256();
	const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
	uint32_t am[8];
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256i u;
		__m256 x;
		__m256d lo, hi;

		if (g_dtype == ST_OPTIM_BF16)
			u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(
				(const __m128i *)((const uint16_t *)g + i))), 16);
		else
			u = _mm256_loadu_si256((const __m256i *)((const float *)g + i));
		x = _mm256_castsi256_ps(u);
		lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
		hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
		acc0 = _mm256_fmadd_pd(lo, lo, acc0);
		acc1 = _mm256_fmadd_pd(hi, hi, acc1);
		amax = _mm256_max_epu32(amax, _mm256_and_si256(u, absmask));
	}
	_mm256_storeu_pd(lanes, acc0);
	_mm256_storeu_pd(lanes + 4, acc1);
	_mm256_storeu_si256((__m256i *)am, amax);
	*absmax_bits = 0;
	for (int j = 0; j < 8; j++)
		if (am[j] > *absmax_bits)
			*absmax_bits = am[j];
	st_gstat_tail(g, g_dtype, i, n, lanes, absmax_bits);
}

const struct st_optim_kernel st_optim_kernel_avx2 = {
	.name = "avx2",
	.path = ST_OPTIM_PATH_AVX2,
	.supported = avx2_supported,
	.adam = avx2_adam,
	.gstat = avx2_gstat,
};

#endif
