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

/* 8 bf16 -> 8 fp32, exact. */
ST_AVX2_INLINE __m256 avx2_f32_from_bf16(__m128i h)
{
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* W for 8 elements at w16 + i or w32 + i, as the main body writes it. */
ST_AVX2_INLINE void avx2_w_store(uint16_t *w16, float *w32, size_t i, __m256 pn,
				 const enum st_optim_dtype wdt, const int nt)
{
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

/* bf16 W for 16 elements at w16 + i from a (0-7) and b (8-15), as
 * avx2_bf16_from_f32() rounds them but with no NaN case: the caller finds
 * NaNs (an unordered compare of a and b) and writes those lines again.
 * One pack and one permute for the 16; nt: streaming stores, one of 32
 * bytes where w32a says W + i is on 32 bytes. */
ST_AVX2_INLINE void avx2_w_store16_bf16(uint16_t *w16, size_t i, __m256 a, __m256 b, const int nt,
					const int w32a)
{
	const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff);
	__m256i ua = _mm256_castps_si256(a), ub = _mm256_castps_si256(b);
	__m256i ra = _mm256_add_epi32(_mm256_add_epi32(ua, half),
				      _mm256_and_si256(_mm256_srli_epi32(ua, 16), one));
	__m256i rb = _mm256_add_epi32(_mm256_add_epi32(ub, half),
				      _mm256_and_si256(_mm256_srli_epi32(ub, 16), one));
	/* per 128-bit lane: a0-3 b0-3 | a4-7 b4-7, then a0-7 b0-7 */
	__m256i h = _mm256_packus_epi32(_mm256_srli_epi32(ra, 16), _mm256_srli_epi32(rb, 16));

	h = _mm256_permute4x64_epi64(h, 0xd8);
	if (!nt) {
		_mm256_storeu_si256((__m256i *)(w16 + i), h);
	} else if (w32a) {
		_mm256_stream_si256((__m256i *)(w16 + i), h);
	} else {
		_mm_stream_si128((__m128i *)(w16 + i), _mm256_castsi256_si128(h));
		_mm_stream_si128((__m128i *)(w16 + i + 8), _mm256_extracti128_si256(h, 1));
	}
}

/* r >= 0 -> 8 codes in 8 int32 (st_q8_enc()), not yet clamped: the
 * caller clamps (M) or the pack saturates (V) to the same values. The
 * normal path subtracts the exponent's bias before the shift: for
 * u >= 113 << 23, (u - (112 << 23) + round) >> sh equals
 * ((u + round) >> sh) - (112 << mb), one operation fewer. */
ST_AVX2_INLINE __m256i avx2_q8_enc(__m256 r, const unsigned mb)
{
	__m256i u = _mm256_castps_si256(r);
	__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, (int)(23u - mb)), _mm256_set1_epi32(1));
	__m256i cn = _mm256_srli_epi32(
		_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(
			(int)(((1u << (22u - mb)) - 1u) - (112u << 23)))), lsb), (int)(23u - mb));
	__m256i cs = _mm256_cvtps_epi32(_mm256_mul_ps(
		r, _mm256_castsi256_ps(_mm256_set1_epi32((int)((141u + mb) << 23)))));
	__m256i isnorm = _mm256_cmpgt_epi32(u, _mm256_set1_epi32(0x387fffff));

	return _mm256_blendv_epi8(cs, cn, isnorm);
}

/* 8 V codes -> r (st_q8v_decode()). The code's bits shifted into an fp32
 * read as a float with a bias of 127, not 15: normal codes land in normal
 * floats and subnormal codes in subnormal floats (exact), so one exact
 * multiply by 2^112 gives st_q8_dec()'s value for both. */
ST_AVX2_INLINE __m256 avx2_q8v_decode(__m128i bytes)
{
	__m256i c = _mm256_cvtepu8_epi32(bytes);

	return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(c, 23 - ST_Q8_VMB)),
			     _mm256_set1_ps(0x1p112f));
}

/* 8 M codes -> M / m_scale (st_q8m_decode()), as avx2_q8v_decode() with
 * the sign from bit 7. */
ST_AVX2_INLINE __m256 avx2_q8m_decode(__m128i bytes)
{
	__m256i c = _mm256_cvtepu8_epi32(bytes);
	__m256i mag = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x7f)),
					23 - ST_Q8_MMB);
	__m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);

	return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(mag, sign)),
			     _mm256_set1_ps(0x1p112f));
}

/* The block's decode in one multiply: V's code bits read as an fp32 x
 * (avx2_q8v_decode() before its multiply) times vsc * 2^112, which equals
 * (x * 2^112) * vsc, the scalar steps: x * 2^112 is exact, and so is
 * vsc * 2^112 for |vsc| < 2^16 (the caller checks), so both products are
 * the one rounding of the same exact product. */
ST_AVX2_INLINE __m256 avx2_q8v_decode_scaled(const uint8_t *c, __m256 vsc112)
{
	__m256i x = _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)c)),
				      23 - ST_Q8_VMB);

	return _mm256_mul_ps(_mm256_castsi256_ps(x), vsc112);
}

/* M's codes likewise: sign-extended, bit 7 lands in bits 27-31 after the
 * shift, and the mask keeps bit 31 (the sign) and the magnitude's bits. */
ST_AVX2_INLINE __m256 avx2_q8m_decode_scaled(const uint8_t *c, __m256 msc112)
{
	__m256i x = _mm256_and_si256(
		_mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)c)),
				  23 - ST_Q8_MMB),
		_mm256_set1_epi32((int)0x87ffffffu));

	return _mm256_mul_ps(_mm256_castsi256_ps(x), msc112);
}

/* M' and 1 / m_scale -> 8 M codes in 8 int32 (st_q8m_encode()). */
ST_AVX2_INLINE __m256i avx2_q8m_encode(__m256 m, __m256 inv)
{
	__m256i t = _mm256_castps_si256(_mm256_mul_ps(m, inv));
	/* |t|'s code is >= 0 on both of avx2_q8_enc()'s paths (a NaN takes
	 * the normal one): only the top needs the clamp */
	__m256i mag = _mm256_min_epi32(avx2_q8_enc(_mm256_castsi256_ps(_mm256_and_si256(
					       t, _mm256_set1_epi32(0x7fffffff))), ST_Q8_MMB),
				       _mm256_set1_epi32(127));

	return _mm256_or_si256(mag, _mm256_and_si256(_mm256_srli_epi32(t, 24),
						     _mm256_set1_epi32(0x80)));
}

/* 8 M codes (int32 in [0, 255]) to m8, and 8 V codes (int32, any) to
 * v8 clamped to [0, 255] by the saturating packs (int32 -> int16 signed,
 * int16 -> uint8 unsigned: together st_q8_clamp(c, 0, 255)). */
ST_AVX2_INLINE void avx2_store_codes(uint8_t *m8, uint8_t *v8, __m256i qm, __m256i qv)
{
	/* per 128-bit lane: m0-3 v0-3 | m4-7 v4-7 */
	__m256i w = _mm256_packs_epi32(qm, qv);
	/* m0-3 v0-3 m4-7 v4-7, then m0-7 v0-7 */
	__m128i b = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));

	b = _mm_shuffle_epi8(b, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15));
	_mm_storel_epi64((__m128i *)m8, b);
	_mm_storel_epi64((__m128i *)v8, _mm_unpackhi_epi64(b, b));
}

/* 16 elements' codes, as avx2_store_codes() for each 8 (the same packs,
 * so the same clamps), in fewer operations: a and b are elements 0-7 and
 * 8-15. */
ST_AVX2_INLINE void avx2_store_codes16(uint8_t *m8, uint8_t *v8, __m256i qma, __m256i qmb,
				       __m256i qva, __m256i qvb)
{
	/* per 128-bit lane, int16: ma0-3 mb0-3 | ma4-7 mb4-7 (and v) */
	__m256i pm = _mm256_packs_epi32(qma, qmb), pv = _mm256_packs_epi32(qva, qvb);
	/* dwords: ma0-3 mb0-3 va0-3 vb0-3 | ma4-7 mb4-7 va4-7 vb4-7 */
	__m256i x = _mm256_packus_epi16(pm, pv);

	x = _mm256_permutevar8x32_epi32(x, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
	_mm_storeu_si128((__m128i *)m8, _mm256_castsi256_si128(x));
	_mm_storeu_si128((__m128i *)v8, _mm256_extracti128_si256(x, 1));
}

ST_AVX2_INLINE uint32_t avx2_hmax_u32(__m256i x)
{
	__m128i h = _mm_max_epu32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));

	h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
	h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
	return (uint32_t)_mm_cvtsi128_si32(h);
}

ST_AVX2_INLINE uint32_t avx2_hmin_u32(__m256i x)
{
	__m128i h = _mm_min_epu32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));

	h = _mm_min_epu32(h, _mm_shuffle_epi32(h, 0x4e));
	h = _mm_min_epu32(h, _mm_shuffle_epi32(h, 0xb1));
	return (uint32_t)_mm_cvtsi128_si32(h);
}

/* The step's constants, broadcast once per chunk. */
struct avx2_q8_k {
	__m256 gs, b1, omb1, b2, omb2, c2, eps, nstep, decay;
};

ST_AVX2_INLINE struct avx2_q8_k avx2_q8_consts(const struct st_adam_step *s)
{
	return (struct avx2_q8_k){
		.gs = _mm256_set1_ps(s->grad_scale),
		.b1 = _mm256_set1_ps(s->beta1), .omb1 = _mm256_set1_ps(s->one_minus_beta1),
		.b2 = _mm256_set1_ps(s->beta2), .omb2 = _mm256_set1_ps(s->one_minus_beta2),
		.c2 = _mm256_set1_ps(s->rsqrt_bc2), .eps = _mm256_set1_ps(s->eps),
		.nstep = _mm256_set1_ps(s->neg_step_size), .decay = _mm256_set1_ps(s->decay),
	};
}

/* Pass 1 for the 8 elements at i, as one chain (avx2_q8_block()): the
 * recipe on M, V as decoded (mv, vv, from the caller's decode), P and W
 * written, M' and sqrt(V') to *mn_out, *sq_out. Returns the lanes whose
 * scaled gradient was finite (the others keep P and their decoded M, V),
 * as a movemask. */
ST_AVX2_INLINE int avx2_q8_recipe(const struct avx2_q8_k *k, const struct st_adam_bufs *b,
				  size_t i, __m256 mv, __m256 vv, __m256 *mn_out, __m256 *sq_out,
				  const enum st_optim_dtype gdt, const int has_w,
				  const enum st_optim_dtype wdt, const int nt)
{
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	const __m256 inf = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
	float *const p = b->p;
	__m256 g, ok, pv, mn, vn, sq, d, pn;
	int okbits;

	if (gdt == ST_OPTIM_BF16)
		g = avx2_f32_from_bf16(_mm_loadu_si128((const __m128i *)((const uint16_t *)b->g + i)));
	else
		g = _mm256_loadu_ps((const float *)b->g + i);
	g = _mm256_mul_ps(g, k->gs);
	ok = _mm256_cmp_ps(_mm256_and_ps(g, absmask), inf, _CMP_LT_OQ);
	pv = _mm256_loadu_ps(p + i);
	mn = _mm256_fmadd_ps(k->b1, mv, _mm256_mul_ps(k->omb1, g));
	vn = _mm256_fmadd_ps(k->b2, vv, _mm256_mul_ps(_mm256_mul_ps(k->omb2, g), g));
	sq = _mm256_sqrt_ps(vn);
	d = _mm256_fmadd_ps(sq, k->c2, k->eps);
	pn = _mm256_fmadd_ps(k->nstep, _mm256_div_ps(mn, d), _mm256_mul_ps(pv, k->decay));
	okbits = _mm256_movemask_ps(ok);
	if (ST_UNLIKELY(okbits != 0xff)) {
		pn = _mm256_blendv_ps(pv, pn, ok);
		mn = _mm256_blendv_ps(mv, mn, ok);
		vn = _mm256_blendv_ps(vv, vn, ok);
		sq = _mm256_sqrt_ps(vn);
	}
	_mm256_storeu_ps(p + i, pn);
	if (has_w)
		avx2_w_store(b->w, b->w, i, pn, wdt, nt);
	*mn_out = mn;
	*sq_out = sq;
	return okbits;
}

/* One block by the plain steps, any length: pass 1 vector by vector into
 * mo, so (the elements past the last whole vector by st_q8_pass1()), then
 * pass 2. For the chunk's last, short block and for blocks whose scales
 * the fast path does not take (avx2_q8_body()). */
ST_AVX2_INLINE uint64_t avx2_q8_block(const struct avx2_q8_k *k, const struct st_adam_step *s,
				      const struct st_adam_bufs *b, size_t k0, size_t len,
				      float *mo, float *so, const enum st_optim_dtype gdt,
				      const int has_w, const enum st_optim_dtype wdt, const int nt)
{
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	const size_t blk = k0 / ST_Q8_BLOCK;
	const __m256 msc = _mm256_set1_ps(b->m_scale[blk]);
	const __m256 vsc = _mm256_set1_ps(b->v_scale[blk]);
	const uint8_t *const mc = b->mc, *const vc = b->vc;
	__m256i mmaxv = _mm256_setzero_si256(), smaxv = _mm256_setzero_si256();
	uint32_t mmax, smax;
	struct st_q8_scales q;
	uint64_t bad = 0;
	size_t j = 0;

	for (; j + 8 <= len; j += 8) {
		const size_t i = k0 + j;
		__m256 mv, sv, vv, mn, sq;
		int okbits;

		st_optim_prefetch((const char *)b->g + i * (gdt == ST_OPTIM_BF16 ? 2u : 4u),
				  ST_ADAM_PREFETCH_ELEMS * (gdt == ST_OPTIM_BF16 ? 2u : 4u));
		st_optim_prefetch(b->p + i, ST_ADAM_PREFETCH_ELEMS * 4u);
		mv = _mm256_mul_ps(avx2_q8m_decode(_mm_loadl_epi64((const __m128i *)(mc + i))), msc);
		sv = _mm256_mul_ps(avx2_q8v_decode(_mm_loadl_epi64((const __m128i *)(vc + i))), vsc);
		vv = _mm256_mul_ps(sv, sv);
		okbits = avx2_q8_recipe(k, b, i, mv, vv, &mn, &sq, gdt, has_w, wdt, nt);
		bad += 8u - (unsigned)__builtin_popcount((unsigned)okbits);
		_mm256_store_ps(mo + j, mn);
		_mm256_store_ps(so + j, sq);
		mmaxv = _mm256_max_epu32(mmaxv, _mm256_castps_si256(_mm256_and_ps(mn, absmask)));
		smaxv = _mm256_max_epu32(smaxv, _mm256_castps_si256(_mm256_and_ps(sq, absmask)));
	}
	mmax = avx2_hmax_u32(mmaxv);
	smax = avx2_hmax_u32(smaxv);
	for (size_t t = j; t < len; t++)
		bad += (uint64_t)st_q8_pass1(s, b, k0 + t, b->m_scale[blk], b->v_scale[blk],
					     &mo[t], &so[t], &mmax, &smax);
	q = st_q8_block_scales(mmax, smax);
	{
		const __m256 minv = _mm256_set1_ps(q.m_inv), vinv = _mm256_set1_ps(q.v_inv);
		uint8_t *const mw = b->mc, *const vw = b->vc;

		for (j = 0; j + 8 <= len; j += 8)
			avx2_store_codes(mw + k0 + j, vw + k0 + j,
					 avx2_q8m_encode(_mm256_load_ps(mo + j), minv),
					 avx2_q8_enc(_mm256_mul_ps(_mm256_load_ps(so + j), vinv),
						     ST_Q8_VMB));
	}
	for (; j < len; j++)
		st_q8_pass2(b, k0 + j, &q, mo[j], so[j]);
	b->m_scale[blk] = q.m_scale;
	b->v_scale[blk] = q.v_scale;
	return bad;
}

/* A whole block whose pass 2 is still to run: its M' and sqrt(V'), the
 * inverses of its new scales, and whether every code is normal and no
 * larger than 1 + 2^-23 before rounding (avx2_q8_normal_only()). */
struct avx2_q8_pending {
	size_t k0;
	const float *mo, *so;
	__m256 minv, vinv;
	int normal;
};

/* Pass 2 of 16 elements (j in the pending block), any values. */
ST_AVX2_INLINE void avx2_q8_pass2_16(const struct st_adam_bufs *b,
				     const struct avx2_q8_pending *pd, size_t j)
{
	uint8_t *const mc = b->mc, *const vc = b->vc;
	__m256i qma = avx2_q8m_encode(_mm256_load_ps(pd->mo + j), pd->minv);
	__m256i qmb = avx2_q8m_encode(_mm256_load_ps(pd->mo + j + 8), pd->minv);
	__m256i qva = avx2_q8_enc(_mm256_mul_ps(_mm256_load_ps(pd->so + j), pd->vinv), ST_Q8_VMB);
	__m256i qvb = avx2_q8_enc(_mm256_mul_ps(_mm256_load_ps(pd->so + j + 8), pd->vinv),
				  ST_Q8_VMB);

	avx2_store_codes16(mc + pd->k0 + j, vc + pd->k0 + j, qma, qmb, qva, qvb);
}

/* st_q8_enc()'s normal path alone, on r's bits with the sign: for
 * 2^-14 <= |r| <= 1 + 2^-23, the code of |r| plus the sign bit moved to
 * bit 31 - (23 - mb) (the magnitude's part neither borrows from nor
 * carries into bit 31). */
ST_AVX2_INLINE __m256i avx2_q8_enc_normal(__m256 r, const unsigned mb)
{
	__m256i u = _mm256_castps_si256(r);
	__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, (int)(23u - mb)), _mm256_set1_epi32(1));

	return _mm256_srli_epi32(
		_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(
			(int)(((1u << (22u - mb)) - 1u) - (112u << 23)))), lsb), (int)(23u - mb));
}

/* Pass 2 of 16 elements of a block whose codes are all normal and at most
 * 1 + 2^-23 before rounding (pd->normal): no subnormal path, no clamp
 * (the largest code is 120 for M, 240 for V). M's code comes with its sign
 * at bit 11 (0x800 + magnitude, at most 0x878); in 16 bits, 0x800 + c
 * becomes 0x80 + c by min(x, x - 0x780), which leaves c <= 120 as it is
 * (c - 0x780 wraps above it). The same bytes as avx2_q8_pass2_16(). */
ST_AVX2_INLINE void avx2_q8_pass2_16_normal(const struct st_adam_bufs *b,
					    const struct avx2_q8_pending *pd, size_t j)
{
	uint8_t *const mc = b->mc, *const vc = b->vc;
	__m256i qma = avx2_q8_enc_normal(_mm256_mul_ps(_mm256_load_ps(pd->mo + j), pd->minv),
					 ST_Q8_MMB);
	__m256i qmb = avx2_q8_enc_normal(_mm256_mul_ps(_mm256_load_ps(pd->mo + j + 8), pd->minv),
					 ST_Q8_MMB);
	__m256i qva = avx2_q8_enc_normal(_mm256_mul_ps(_mm256_load_ps(pd->so + j), pd->vinv),
					 ST_Q8_VMB);
	__m256i qvb = avx2_q8_enc_normal(_mm256_mul_ps(_mm256_load_ps(pd->so + j + 8), pd->vinv),
					 ST_Q8_VMB);
	__m256i pm = _mm256_packs_epi32(qma, qmb), pv = _mm256_packs_epi32(qva, qvb);
	__m256i x;

	pm = _mm256_min_epu16(pm, _mm256_sub_epi16(pm, _mm256_set1_epi16(0x780)));
	x = _mm256_packus_epi16(pm, pv);
	x = _mm256_permutevar8x32_epi32(x, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
	_mm_storeu_si128((__m128i *)(mc + pd->k0 + j), _mm256_castsi256_si128(x));
	_mm_storeu_si128((__m128i *)(vc + pd->k0 + j), _mm256_extracti128_si256(x, 1));
}

ST_AVX2_INLINE void avx2_q8_pass2(const struct st_adam_bufs *b, const struct avx2_q8_pending *pd,
				  size_t j)
{
	if (pd->normal)
		avx2_q8_pass2_16_normal(b, pd, j);
	else
		avx2_q8_pass2_16(b, pd, j);
}

/* Whether every code of a block is normal and at most 1 + 2^-23 before
 * rounding, from the block's least |M'| and sqrt(V') (bits) and its
 * scales' inverses: the inverses finite (then |M'| * m_inv <= max |M'| *
 * m_inv rounds to at most 1 + 2^-23: each of 1 / max and the product
 * rounds once) and the least value times its inverse at least 2^-14
 * (rounding is monotonic, so every other value's is too). */
static inline int avx2_q8_normal_only(const struct st_q8_scales *q, uint32_t mmin,
				      uint32_t smin)
{
	return st_f32_bits(q->m_inv) < 0x7f800000u && st_f32_bits(q->v_inv) < 0x7f800000u &&
	       st_f32_bits(st_f32_from_bits(mmin) * q->m_inv) > 0x387fffffu &&
	       st_f32_bits(st_f32_from_bits(smin) * q->v_inv) > 0x387fffffu;
}

/* Loop A's results for one block: the maxima and minima of |M'| and
 * sqrt(V') (as unsigned bits), which vectors had a non-finite scaled
 * gradient (okb: a movemask per vector, allok their AND) and how many
 * elements. */
struct avx2_q8_a {
	uint32_t mmax, smax, mmin, smin;
	unsigned char okb[ST_Q8_BLOCK / 8];
	unsigned allok;
	uint64_t bad;
};

/* Loop A of a whole block: decode M, V with the block's old scales (the
 * one-multiply decode: |scale| < 2^16), run the recipe to M' and sqrt(V')
 * and keep them in mo, so. It writes nothing else, so it may run twice.
 * careful = 0 leaves out the per-vector test of the scaled gradient: a
 * non-finite one makes V' +Inf or NaN, so sqrt(V') shows it in a->smax
 * (>= 0x7f800000, as does a V' that overflowed), and then the caller
 * runs the block again with careful = 1, which keeps the decoded M, V of
 * those lanes. sqrt(V') is never negative nor NaN with careful = 1 (V' is
 * built from a finite decoded V and g^2), so its max and min need no
 * mask. */
ST_AVX2_INLINE void avx2_q8_loop_a(const struct avx2_q8_k *k, const struct st_adam_bufs *b,
				   size_t k0, float *mo, float *so, struct avx2_q8_a *a,
				   const int careful, const enum st_optim_dtype gdt)
{
	const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	const __m256 inf = _mm256_castsi256_ps(_mm256_set1_epi32(0x7f800000));
	const size_t blk = k0 / ST_Q8_BLOCK, gb = gdt == ST_OPTIM_BF16 ? 2u : 4u;
	const __m256 msc112 = _mm256_set1_ps(b->m_scale[blk] * 0x1p112f);
	const __m256 vsc112 = _mm256_set1_ps(b->v_scale[blk] * 0x1p112f);
	const uint8_t *const mc = b->mc, *const vc = b->vc;
	__m256i mmaxv = _mm256_setzero_si256(), smaxv = _mm256_setzero_si256();
	__m256i mminv = _mm256_set1_epi32(-1), sminv = _mm256_set1_epi32(-1);

	a->allok = 0xff;
	a->bad = 0;
	for (size_t j = 0; j < ST_Q8_BLOCK; j += 8) {
		const size_t i = k0 + j;
		__m256 g, mv, sv, vv, mn, vn, sq;
		__m256i mabs;

		if (!(j & 15))
			st_optim_prefetch((const char *)b->g + i * gb, ST_ADAM_PREFETCH_ELEMS * gb);
		if (!(j & 63)) { /* a line of codes per 64 elements */
			st_optim_prefetch(mc + i, ST_ADAM_PREFETCH_ELEMS);
			st_optim_prefetch(vc + i, ST_ADAM_PREFETCH_ELEMS);
		}
		if (gdt == ST_OPTIM_BF16)
			g = avx2_f32_from_bf16(_mm_loadu_si128((const __m128i *)((const uint16_t *)b->g + i)));
		else
			g = _mm256_loadu_ps((const float *)b->g + i);
		g = _mm256_mul_ps(g, k->gs);
		mv = avx2_q8m_decode_scaled(mc + i, msc112);
		sv = avx2_q8v_decode_scaled(vc + i, vsc112);
		vv = _mm256_mul_ps(sv, sv);
		mn = _mm256_fmadd_ps(k->b1, mv, _mm256_mul_ps(k->omb1, g));
		vn = _mm256_fmadd_ps(k->b2, vv, _mm256_mul_ps(_mm256_mul_ps(k->omb2, g), g));
		if (careful) {
			__m256 ok = _mm256_cmp_ps(_mm256_and_ps(g, absmask), inf, _CMP_LT_OQ);
			int okbits = _mm256_movemask_ps(ok);

			a->okb[j / 8] = (unsigned char)okbits;
			a->allok &= (unsigned)okbits;
			if (okbits != 0xff) {
				mn = _mm256_blendv_ps(mv, mn, ok);
				vn = _mm256_blendv_ps(vv, vn, ok);
				a->bad += 8u - (unsigned)__builtin_popcount((unsigned)okbits);
			}
		}
		sq = _mm256_sqrt_ps(vn);
		_mm256_store_ps(mo + j, mn);
		_mm256_store_ps(so + j, sq);
		mabs = _mm256_castps_si256(_mm256_and_ps(mn, absmask));
		mmaxv = _mm256_max_epu32(mmaxv, mabs);
		mminv = _mm256_min_epu32(mminv, mabs);
		smaxv = _mm256_max_epu32(smaxv, _mm256_castps_si256(sq));
		sminv = _mm256_min_epu32(sminv, _mm256_castps_si256(sq));
	}
	a->mmax = avx2_hmax_u32(mmaxv);
	a->smax = avx2_hmax_u32(smaxv);
	a->mmin = avx2_hmin_u32(mminv);
	a->smin = avx2_hmin_u32(sminv);
}

/* A whole block (ST_Q8_BLOCK elements at k0) whose old scales are below
 * 2^16 in magnitude, in two loops with short dependency chains (so the
 * out-of-order window holds many vectors' work): A (avx2_q8_loop_a())
 * decodes, runs the recipe up to M' and sqrt(V') and keeps them in mo,
 * so; B finishes P (the division) and writes P and W. Pass 2 of the block
 * before (pd, when has_pd) runs inside loop B. *a gets loop A's results. */
ST_AVX2_INLINE void avx2_q8_block_fast(const struct avx2_q8_k *k, const struct st_adam_bufs *b,
				       size_t k0, float *mo, float *so,
				       const struct avx2_q8_pending *pd, const int has_pd,
				       struct avx2_q8_a *a, const enum st_optim_dtype gdt,
				       const int has_w, const enum st_optim_dtype wdt, const int nt,
				       const int w32a)
{
	float *const p = b->p;
	__m256 nanv = _mm256_setzero_ps();

	avx2_q8_loop_a(k, b, k0, mo, so, a, 0, gdt);
	if (ST_UNLIKELY(a->smax >= 0x7f800000u))
		avx2_q8_loop_a(k, b, k0, mo, so, a, 1, gdt);
	for (size_t j = 0; j < ST_Q8_BLOCK; j += 16) {
		const size_t i = k0 + j;
		__m256 pn[2];

		st_optim_prefetch(p + i, ST_ADAM_PREFETCH_ELEMS * 4u);
		for (size_t h = 0; h < 2; h++) {
			__m256 pv = _mm256_loadu_ps(p + i + 8 * h);
			__m256 d = _mm256_fmadd_ps(_mm256_load_ps(so + j + 8 * h), k->c2, k->eps);

			pn[h] = _mm256_fmadd_ps(k->nstep, _mm256_div_ps(_mm256_load_ps(mo + j + 8 * h), d),
						_mm256_mul_ps(pv, k->decay));
			if (ST_UNLIKELY(a->allok != 0xff && a->okb[j / 8 + h] != 0xff)) {
				const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
				__m256i okm = _mm256_cmpeq_epi32(
					_mm256_and_si256(_mm256_set1_epi32(a->okb[j / 8 + h]), bit), bit);

				pn[h] = _mm256_blendv_ps(pv, pn[h], _mm256_castsi256_ps(okm));
			}
			_mm256_storeu_ps(p + i + 8 * h, pn[h]);
		}
		if (has_w && wdt == ST_OPTIM_BF16) {
			nanv = _mm256_or_ps(nanv, _mm256_cmp_ps(pn[0], pn[1], _CMP_UNORD_Q));
			avx2_w_store16_bf16(b->w, i, pn[0], pn[1], nt, w32a);
		} else if (has_w) {
			avx2_w_store(b->w, b->w, i, pn[0], wdt, nt);
			avx2_w_store(b->w, b->w, i + 8, pn[1], wdt, nt);
		}
		if (has_pd)
			avx2_q8_pass2(b, pd, j);
	}
	/* a NaN in P: W's lines again, by the exact conversion */
	if (has_w && wdt == ST_OPTIM_BF16 && ST_UNLIKELY(_mm256_movemask_ps(nanv)))
		for (size_t j = 0; j < ST_Q8_BLOCK; j += 8)
			avx2_w_store(b->w, b->w, k0 + j, _mm256_loadu_ps(p + k0 + j), wdt, nt);
}

/* Pass 2 of a whole pending block, alone. */
ST_AVX2_INLINE void avx2_q8_drain(const struct st_adam_bufs *b, const struct avx2_q8_pending *pd)
{
	for (size_t j = 0; j < ST_Q8_BLOCK; j += 16)
		avx2_q8_pass2(b, pd, j);
}

/* The q8 state, one chunk (from a block boundary), block by block: pass 1
 * runs the recipe on the dequantized M, V and keeps M' and sqrt(V') in a
 * block buffer, pass 2 quantizes them with the block's new scales. Whole
 * blocks with old scales below 2^16 (all but pathological ones) take
 * avx2_q8_block_fast(): pass 1 as loops A and B, two buffers, and each
 * block's pass 2 inside the next block's loop B (by the normal-only
 * encoder where avx2_q8_normal_only() allows). The rest, and a short last
 * block, take avx2_q8_block() after the pending pass 2. The same steps,
 * the same order per element, so the same bits as st_adam_q8_blocks().
 * Why this shape: the per-vector chain (decode, recipe, sqrt, division,
 * W) is about 60 cycles long, and on a core whose window holds about two
 * such vectors the kernel was bound by that, not by its operation count
 * (docs/optim.md, "Speed"). nt: only when W is vector-aligned at the
 * chunk's start (the caller checks), so every block starts aligned. */
ST_AVX2_INLINE uint64_t avx2_q8_body(const struct st_adam_step *s,
				     const struct st_adam_bufs *b, size_t n,
				     const enum st_optim_dtype gdt, const int has_w,
				     const enum st_optim_dtype wdt, const int nt)
{
	const struct avx2_q8_k k = avx2_q8_consts(s);
	/* W's 16-element groups on 32 bytes (bf16 W): one store each */
	const int w32a = (uintptr_t)b->w % 32u == 0;
	float buf[2][2][ST_Q8_BLOCK] __attribute__((aligned(32))); /* [parity][M', sqrt V'] */
	struct avx2_q8_pending pd = { 0 };
	int has_pd = 0, par = 0;
	uint64_t bad = 0;

	for (size_t k0 = 0; k0 < n; k0 += ST_Q8_BLOCK) {
		const size_t len = ST_MIN((size_t)ST_Q8_BLOCK, n - k0), blk = k0 / ST_Q8_BLOCK;
		float *const mo = buf[par][0], *const so = buf[par][1];
		struct avx2_q8_a a;
		struct st_q8_scales q;

		if (len < ST_Q8_BLOCK || !(fabsf(b->m_scale[blk]) < 0x1p16f) ||
		    !(fabsf(b->v_scale[blk]) < 0x1p16f)) {
			if (has_pd)
				avx2_q8_drain(b, &pd);
			has_pd = 0;
			bad += avx2_q8_block(&k, s, b, k0, len, mo, so, gdt, has_w, wdt, nt);
			continue;
		}
		if (has_pd)
			avx2_q8_block_fast(&k, b, k0, mo, so, &pd, 1, &a, gdt, has_w, wdt, nt, w32a);
		else
			avx2_q8_block_fast(&k, b, k0, mo, so, &pd, 0, &a, gdt, has_w, wdt, nt, w32a);
		bad += a.bad;
		q = st_q8_block_scales(a.mmax, a.smax);
		b->m_scale[blk] = q.m_scale;
		b->v_scale[blk] = q.v_scale;
		pd = (struct avx2_q8_pending){ .k0 = k0, .mo = mo, .so = so,
					       .minv = _mm256_set1_ps(q.m_inv),
					       .vinv = _mm256_set1_ps(q.v_inv),
					       .normal = avx2_q8_normal_only(&q, a.mmin, a.smin) };
		has_pd = 1;
		par ^= 1;
	}
	if (has_pd)
		avx2_q8_drain(b, &pd);
	if (nt)
		_mm_sfence();
	return bad;
}

/* One chunk; gdt, has_w, wdt, nt and st are constants at every call. nt: W
 * by streaming stores (the caller has checked W's elements are aligned).
 * st: the state, F32 or BF16 (Q8: avx2_q8_body()). */
ST_AVX2_INLINE uint64_t avx2_adam_body(const struct st_adam_step *s,
				       const struct st_adam_bufs *b, size_t n,
				       const enum st_optim_dtype gdt, const int has_w,
				       const enum st_optim_dtype wdt, const int nt,
				       const enum st_optim_state st)
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
	uint16_t *const m16 = b->mc, *const v16 = b->vc;
	const size_t sb = st == ST_OPTIM_STATE_BF16 ? 2u : 4u;
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
		if (st == ST_OPTIM_STATE_BF16) {
			st_optim_prefetch(m16 + i, ST_ADAM_PREFETCH_ELEMS * sb);
			st_optim_prefetch(v16 + i, ST_ADAM_PREFETCH_ELEMS * sb);
		} else {
			st_optim_prefetch(m + i, ST_ADAM_PREFETCH_ELEMS * sb);
			st_optim_prefetch(v + i, ST_ADAM_PREFETCH_ELEMS * sb);
		}
		if (gdt == ST_OPTIM_BF16) {
			__m128i h = _mm_loadu_si128((const __m128i *)(g16 + i));
			g = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
		} else {
			g = _mm256_loadu_ps(g32 + i);
		}
		g = _mm256_mul_ps(g, gs);
		ok = _mm256_cmp_ps(_mm256_and_ps(g, absmask), inf, _CMP_LT_OQ);
		pv = _mm256_loadu_ps(p + i);
		if (st == ST_OPTIM_STATE_BF16) {
			mv = avx2_f32_from_bf16(_mm_loadu_si128((const __m128i *)(m16 + i)));
			vv = avx2_f32_from_bf16(_mm_loadu_si128((const __m128i *)(v16 + i)));
		} else {
			mv = _mm256_loadu_ps(m + i);
			vv = _mm256_loadu_ps(v + i);
		}
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
		if (st == ST_OPTIM_STATE_BF16) {
			_mm_storeu_si128((__m128i *)(m16 + i), avx2_bf16_from_f32(mn));
			_mm_storeu_si128((__m128i *)(v16 + i), avx2_bf16_from_f32(vn));
		} else {
			_mm256_storeu_ps(m + i, mn);
			_mm256_storeu_ps(v + i, vn);
		}
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
	const enum st_optim_state st = b->state;
	/* q8 streams W only when W is vector-aligned at the chunk's start */
	const int nt = (kflags & ST_OPTIM_KF_STREAM_W) && b->w && (uintptr_t)b->w % wesz == 0 &&
		       (st != ST_OPTIM_STATE_Q8 || (uintptr_t)b->w % (8u * wesz) == 0);

#define AVX2_BODY(gdt, has_w, wdt, ntv)                                                    	(st == ST_OPTIM_STATE_Q8     ? avx2_q8_body(s, b, n, gdt, has_w, wdt, ntv)         	 : st == ST_OPTIM_STATE_BF16 ? avx2_adam_body(s, b, n, gdt, has_w, wdt, ntv,       						      ST_OPTIM_STATE_BF16)                 				     : avx2_adam_body(s, b, n, gdt, has_w, wdt, ntv,       						      ST_OPTIM_STATE_F32))
#define AVX2_CALL(gdt, has_w, wdt)                                                         	(nt ? AVX2_BODY(gdt, has_w, wdt, 1) : AVX2_BODY(gdt, has_w, wdt, 0))
	if (!b->w)
		return g16 ? AVX2_BODY(ST_OPTIM_BF16, 0, ST_OPTIM_F32, 0)
			   : AVX2_BODY(ST_OPTIM_F32, 0, ST_OPTIM_F32, 0);
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
#undef AVX2_BODY
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
