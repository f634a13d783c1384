/* The AVX-512 kernel body, 16 lanes, included twice by adam_avx512.c:
 * once for CPUs with AVX512_BF16 (W via VCVTNEPS2BF16) and once for CPUs
 * without it (W via integer round-to-nearest-even). Expects:
 *   ST_K_TARGET      the target attribute
 *   ST_K_BF16_INS    1 to use VCVTNEPS2BF16
 *   ST_K(name)       the name prefix for this variant */

ST_K_TARGET static inline __attribute__((always_inline)) __m256i
ST_K(bf16_from_f32)(__m512 x)
{
	__m512i u = _mm512_castps_si512(x);
	__m512i hi = _mm512_srli_epi32(u, 16);
	__m512i r = _mm512_srli_epi32(_mm512_add_epi32(
		_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
		_mm512_and_si512(hi, _mm512_set1_epi32(1))), 16);
	__mmask16 isnan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);

	r = _mm512_mask_mov_epi32(r, isnan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
	return _mm512_cvtepi32_epi16(r);
}

#if ST_K_BF16_INS
/* VCVTNEPS2BF16 flushes subnormal inputs to signed zero; st_bf16_from_f32()
 * keeps them. Lanes holding a nonzero subnormal (rare) take the integer
 * rounding, so the result is the same bits as every other path. */
ST_K_TARGET static inline __attribute__((always_inline)) __m256i
ST_K(bf16_from_f32_ins)(__m512 x)
{
	__m256bh h = _mm512_cvtneps_pbh(x);
	__m512i u = _mm512_castps_si512(x);
	__m256i r;
	__mmask16 sub = _mm512_mask_test_epi32_mask(
		_mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)), u,
		_mm512_set1_epi32(0x007fffff));

	memcpy(&r, &h, sizeof(r));
	if (ST_UNLIKELY(sub))
		r = _mm256_mask_mov_epi16(r, sub, ST_K(bf16_from_f32)(x));
	return r;
}
#endif

/* 16 bf16 -> 16 fp32, exact. */
ST_K_TARGET static inline __attribute__((always_inline)) __m512
ST_K(f32_from_bf16)(__m256i h)
{
	return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* W for 16 elements, as the main body writes it. */
ST_K_TARGET static inline __attribute__((always_inline)) void
ST_K(w_store)(uint16_t *w16, float *w32, size_t i, __m512 pn, const enum st_optim_dtype wdt,
	      const int nt)
{
	if (wdt == ST_OPTIM_F32) {
		if (nt)
			_mm512_stream_ps(w32 + i, pn);
		else
			_mm512_storeu_ps(w32 + i, pn);
	} else {
		__m256i h;

		if (wdt == ST_OPTIM_BF16)
#if ST_K_BF16_INS
			h = ST_K(bf16_from_f32_ins)(pn);
#else
			h = ST_K(bf16_from_f32)(pn);
#endif
		else
			h = _mm512_cvtps_ph(pn, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		if (nt)
			_mm256_stream_si256((__m256i *)(w16 + i), h);
		else
			_mm256_storeu_si256((__m256i *)(w16 + i), h);
	}
}

/* r >= 0 -> 16 codes in 16 int32 (st_q8_enc()). */
ST_K_TARGET static inline __attribute__((always_inline)) __m512i
ST_K(q8_enc)(__m512 r, const unsigned mb)
{
	__m512i u = _mm512_castps_si512(r);
	__m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 23u - mb), _mm512_set1_epi32(1));
	__m512i cn = _mm512_sub_epi32(
		_mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(
			u, _mm512_set1_epi32((int)((1u << (22u - mb)) - 1u))), lsb), 23u - mb),
		_mm512_set1_epi32((int)(112u << mb)));
	__m512i cs = _mm512_cvtps_epi32(_mm512_mul_ps(
		r, _mm512_castsi512_ps(_mm512_set1_epi32((int)((141u + mb) << 23)))));
	__mmask16 isnorm = _mm512_cmpgt_epi32_mask(u, _mm512_set1_epi32(0x387fffff));
	__m512i c = _mm512_mask_blend_epi32(isnorm, cs, cn);

	return _mm512_min_epi32(_mm512_max_epi32(c, _mm512_setzero_si512()),
				_mm512_set1_epi32((int)(1u << (mb + 4u)) - 1));
}

/* 16 V codes -> r (st_q8v_decode()): the code's bits read as an fp32
 * with a bias of 127 (subnormal codes as subnormal floats, exact), times
 * 2^112 (exact), as the AVX2 kernel does. */
ST_K_TARGET static inline __attribute__((always_inline)) __m512
ST_K(q8v_decode)(__m128i bytes)
{
	__m512i c = _mm512_cvtepu8_epi32(bytes);

	return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(c, 23 - ST_Q8_VMB)),
			     _mm512_set1_ps(0x1p112f));
}

/* 16 M codes -> M / m_scale (st_q8m_decode()), the sign from bit 7. */
ST_K_TARGET static inline __attribute__((always_inline)) __m512
ST_K(q8m_decode)(__m128i bytes)
{
	__m512i c = _mm512_cvtepu8_epi32(bytes);
	__m512i mag = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x7f)),
					23 - ST_Q8_MMB);
	__m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);

	return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_or_si512(mag, sign)),
			     _mm512_set1_ps(0x1p112f));
}

/* M' and 1 / m_scale -> 16 M codes in 16 int32 (st_q8m_encode()). */
ST_K_TARGET static inline __attribute__((always_inline)) __m512i
ST_K(q8m_encode)(__m512 m, __m512 inv)
{
	__m512i t = _mm512_castps_si512(_mm512_mul_ps(m, inv));
	__m512i mag = ST_K(q8_enc)(_mm512_castsi512_ps(_mm512_and_si512(
					   t, _mm512_set1_epi32(0x7fffffff))), ST_Q8_MMB);

	return _mm512_or_si512(mag, _mm512_and_si512(_mm512_srli_epi32(t, 24),
						     _mm512_set1_epi32(0x80)));
}

/* The q8 state, one chunk (from a block boundary), block by block: the
 * same two passes as the AVX2 kernel's avx2_q8_body(), 16 lanes. */
ST_K_TARGET static inline __attribute__((always_inline)) uint64_t
ST_K(q8_body)(const struct st_adam_step *s, const struct st_adam_bufs *b, size_t n,
	      const enum st_optim_dtype gdt, const int has_w, const enum st_optim_dtype wdt,
	      const int nt)
{
	const __m512 gs = _mm512_set1_ps(s->grad_scale);
	const __m512 b1 = _mm512_set1_ps(s->beta1), omb1 = _mm512_set1_ps(s->one_minus_beta1);
	const __m512 b2 = _mm512_set1_ps(s->beta2), omb2 = _mm512_set1_ps(s->one_minus_beta2);
	const __m512 c2 = _mm512_set1_ps(s->rsqrt_bc2), eps = _mm512_set1_ps(s->eps);
	const __m512 nstep = _mm512_set1_ps(s->neg_step_size), decay = _mm512_set1_ps(s->decay);
	const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
	const size_t gb = gdt == ST_OPTIM_BF16 ? 2u : 4u;
	const float *const g32 = b->g;
	const uint16_t *const g16 = b->g;
	float *const p = b->p;
	uint8_t *const mc = b->mc;
	uint8_t *const vc = b->vc;
	uint16_t *const w16 = b->w;
	float *const w32 = b->w;
	float mo[ST_Q8_BLOCK] __attribute__((aligned(64)));
	float so[ST_Q8_BLOCK] __attribute__((aligned(64)));
	uint64_t bad = 0;

	for (size_t k0 = 0; k0 < n; k0 += ST_Q8_BLOCK) {
		const size_t len = ST_MIN((size_t)ST_Q8_BLOCK, n - k0), blk = k0 / ST_Q8_BLOCK;
		const __m512 msc = _mm512_set1_ps(b->m_scale[blk]);
		const __m512 vsc = _mm512_set1_ps(b->v_scale[blk]);
		__m512i mmaxv = _mm512_setzero_si512(), smaxv = _mm512_setzero_si512();
		uint32_t mmax, smax;
		struct st_q8_scales q;
		size_t j = 0;

		for (; j + 16 <= len; j += 16) {
			const size_t i = k0 + j;
			__m512 g, pv, mv, vv, sv, mn, vn, sq, d, pn;
			__mmask16 nf;

			st_optim_prefetch(gdt == ST_OPTIM_BF16 ? (const void *)(g16 + i)
							       : (const void *)(g32 + i),
					  ST_ADAM_PREFETCH_ELEMS * gb);
			st_optim_prefetch(p + i, ST_ADAM_PREFETCH_ELEMS * 4u);
			if (!(j & 63)) { /* a line of codes per 64 elements */
				st_optim_prefetch(mc + i, ST_ADAM_PREFETCH_ELEMS);
				st_optim_prefetch(vc + i, ST_ADAM_PREFETCH_ELEMS);
			}
			if (gdt == ST_OPTIM_BF16)
				g = ST_K(f32_from_bf16)(_mm256_loadu_si256((const __m256i *)(g16 + i)));
			else
				g = _mm512_loadu_ps(g32 + i);
			g = _mm512_mul_ps(g, gs);
			pv = _mm512_loadu_ps(p + i);
			mv = _mm512_mul_ps(ST_K(q8m_decode)(
				_mm_loadu_si128((const __m128i *)(mc + i))), msc);
			sv = _mm512_mul_ps(ST_K(q8v_decode)(
				_mm_loadu_si128((const __m128i *)(vc + i))), vsc);
			vv = _mm512_mul_ps(sv, sv);
			mn = _mm512_fmadd_ps(b1, mv, _mm512_mul_ps(omb1, g));
			vn = _mm512_fmadd_ps(b2, vv, _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
			sq = _mm512_sqrt_ps(vn);
			d = _mm512_fmadd_ps(sq, c2, eps);
			pn = _mm512_fmadd_ps(nstep, _mm512_div_ps(mn, d), _mm512_mul_ps(pv, decay));
			nf = _mm512_fpclass_ps_mask(g, 0x99);
			if (ST_UNLIKELY(nf)) {
				pn = _mm512_mask_mov_ps(pn, nf, pv);
				mn = _mm512_mask_mov_ps(mn, nf, mv);
				vn = _mm512_mask_mov_ps(vn, nf, vv);
				sq = _mm512_sqrt_ps(vn);
				bad += (unsigned)__builtin_popcount((unsigned)nf);
			}
			_mm512_storeu_ps(p + i, pn);
			_mm512_store_ps(mo + j, mn);
			_mm512_store_ps(so + j, sq);
			mmaxv = _mm512_max_epu32(mmaxv, _mm512_and_si512(_mm512_castps_si512(mn), absmask));
			smaxv = _mm512_max_epu32(smaxv, _mm512_and_si512(_mm512_castps_si512(sq), absmask));
			if (has_w)
				ST_K(w_store)(w16, w32, i, pn, wdt, nt);
		}
		mmax = (uint32_t)_mm512_reduce_max_epu32(mmaxv);
		smax = (uint32_t)_mm512_reduce_max_epu32(smaxv);
		for (size_t t = j; t < len; t++)
			bad += (uint64_t)st_q8_pass1(s, b, k0 + t, b->m_scale[blk], b->v_scale[blk],
						     &mo[t], &so[t], &mmax, &smax);
		q = st_q8_block_scales(mmax, smax);
		{
			const __m512 minv = _mm512_set1_ps(q.m_inv), vinv = _mm512_set1_ps(q.v_inv);

			for (j = 0; j + 16 <= len; j += 16) {
				_mm_storeu_si128((__m128i *)(mc + k0 + j), _mm512_cvtepi32_epi8(
					ST_K(q8m_encode)(_mm512_load_ps(mo + j), minv)));
				_mm_storeu_si128((__m128i *)(vc + k0 + j),
						 _mm512_cvtepi32_epi8(ST_K(q8_enc)(
							 _mm512_mul_ps(_mm512_load_ps(so + j), vinv),
							 ST_Q8_VMB)));
			}
		}
		for (; j < len; j++)
			st_q8_pass2(b, k0 + j, &q, mo[j], so[j]);
		b->m_scale[blk] = q.m_scale;
		b->v_scale[blk] = q.v_scale;
	}
	if (nt)
		_mm_sfence();
	return bad;
}

/* One chunk. gdt, has_w, wdt and nt are constants at every call, so each
 * combination compiles to its own loop. nt: W by streaming stores (the
 * caller has checked that W's elements are naturally aligned). */
ST_K_TARGET static inline __attribute__((always_inline)) uint64_t
ST_K(adam_body)(const struct st_adam_step *s, const struct st_adam_bufs *b, size_t n,
		const enum st_optim_dtype gdt, const int has_w, const enum st_optim_dtype wdt,
		const int nt, const enum st_optim_state st)
{
	const __m512 gs = _mm512_set1_ps(s->grad_scale);
	const __m512 b1 = _mm512_set1_ps(s->beta1), omb1 = _mm512_set1_ps(s->one_minus_beta1);
	const __m512 b2 = _mm512_set1_ps(s->beta2), omb2 = _mm512_set1_ps(s->one_minus_beta2);
	const __m512 c2 = _mm512_set1_ps(s->rsqrt_bc2), eps = _mm512_set1_ps(s->eps);
	const __m512 nstep = _mm512_set1_ps(s->neg_step_size), decay = _mm512_set1_ps(s->decay);
	const size_t gb = gdt == ST_OPTIM_BF16 ? 2u : 4u;
	const size_t wvec = wdt == ST_OPTIM_F32 ? 64u : 32u; /* bytes of W per vector */
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
		/* Streaming stores need W vector-aligned: the elements before
		 * that take the scalar recipe, as a tail would. */
		size_t mis = (size_t)((uintptr_t)b->w % wvec);

		i = ST_MIN(n, mis ? (wvec - mis) / (wvec / 16u) : 0u);
		bad += st_adam_tail(s, b, 0, i);
	}
	for (; i + 16 <= n; i += 16) {
		__m512 g, pv, mv, vv, mn, vn, d, pn;
		__mmask16 nf;

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
			__m256i h = _mm256_loadu_si256((const __m256i *)(g16 + i));
			g = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
		} else {
			g = _mm512_loadu_ps(g32 + i);
		}
		g = _mm512_mul_ps(g, gs);
		pv = _mm512_loadu_ps(p + i);
		if (st == ST_OPTIM_STATE_BF16) {
			mv = ST_K(f32_from_bf16)(_mm256_loadu_si256((const __m256i *)(m16 + i)));
			vv = ST_K(f32_from_bf16)(_mm256_loadu_si256((const __m256i *)(v16 + i)));
		} else {
			mv = _mm512_loadu_ps(m + i);
			vv = _mm512_loadu_ps(v + i);
		}
		mn = _mm512_fmadd_ps(b1, mv, _mm512_mul_ps(omb1, g));
		vn = _mm512_fmadd_ps(b2, vv, _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
		d = _mm512_fmadd_ps(_mm512_sqrt_ps(vn), c2, eps);
		pn = _mm512_fmadd_ps(nstep, _mm512_div_ps(mn, d), _mm512_mul_ps(pv, decay));
		/* fpclass 0x99: QNaN | +Inf | -Inf | SNaN. Such lanes keep P, M
		 * and V; the blend is only paid when a vector has one. */
		nf = _mm512_fpclass_ps_mask(g, 0x99);
		if (ST_UNLIKELY(nf)) {
			pn = _mm512_mask_mov_ps(pn, nf, pv);
			mn = _mm512_mask_mov_ps(mn, nf, mv);
			vn = _mm512_mask_mov_ps(vn, nf, vv);
			bad += (unsigned)__builtin_popcount((unsigned)nf);
		}
		_mm512_storeu_ps(p + i, pn);
		if (st == ST_OPTIM_STATE_BF16) {
			_mm256_storeu_si256((__m256i *)(m16 + i), ST_K(bf16_from_f32)(mn));
			_mm256_storeu_si256((__m256i *)(v16 + i), ST_K(bf16_from_f32)(vn));
		} else {
			_mm512_storeu_ps(m + i, mn);
			_mm512_storeu_ps(v + i, vn);
		}
		if (!has_w)
			continue;
		if (wdt == ST_OPTIM_F32) {
			if (nt)
				_mm512_stream_ps(w32 + i, pn);
			else
				_mm512_storeu_ps(w32 + i, pn);
		} else {
			__m256i h;

			if (wdt == ST_OPTIM_BF16)
#if ST_K_BF16_INS
				h = ST_K(bf16_from_f32_ins)(pn);
#else
				h = ST_K(bf16_from_f32)(pn);
#endif
			else
				h = _mm512_cvtps_ph(pn, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
			if (nt)
				_mm256_stream_si256((__m256i *)(w16 + i), h);
			else
				_mm256_storeu_si256((__m256i *)(w16 + i), h);
		}
	}
	bad += st_adam_tail(s, b, i, n);
	if (nt)
		_mm_sfence(); /* the streamed lines are visible before we return */
	return bad;
}

ST_K_TARGET static uint64_t ST_K(adam)(const struct st_adam_step *s,
				       const struct st_adam_bufs *b, size_t n, unsigned kflags)
{
	const int g16 = b->g_dtype == ST_OPTIM_BF16;
	const size_t wesz = b->w_dtype == ST_OPTIM_F32 ? 4u : 2u;
	const enum st_optim_state st = b->state;
	/* q8 streams W only when W is vector-aligned at the chunk's start */
	const int nt = (kflags & ST_OPTIM_KF_STREAM_W) && b->w && (uintptr_t)b->w % wesz == 0 &&
		       (st != ST_OPTIM_STATE_Q8 || (uintptr_t)b->w % (16u * wesz) == 0);

#define ST_K_BODY(gdt, has_w, wdt, ntv)                                                    \
	(st == ST_OPTIM_STATE_Q8     ? ST_K(q8_body)(s, b, n, gdt, has_w, wdt, ntv)        \
	 : st == ST_OPTIM_STATE_BF16 ? ST_K(adam_body)(s, b, n, gdt, has_w, wdt, ntv,      \
						       ST_OPTIM_STATE_BF16)                \
				     : ST_K(adam_body)(s, b, n, gdt, has_w, wdt, ntv,      \
						       ST_OPTIM_STATE_F32))
#define ST_K_CALL(gdt, has_w, wdt)                                                         \
	(nt ? ST_K_BODY(gdt, has_w, wdt, 1) : ST_K_BODY(gdt, has_w, wdt, 0))
	if (!b->w)
		return g16 ? ST_K_BODY(ST_OPTIM_BF16, 0, ST_OPTIM_F32, 0)
			   : ST_K_BODY(ST_OPTIM_F32, 0, ST_OPTIM_F32, 0);
	switch (b->w_dtype) {
	case ST_OPTIM_BF16:
		return g16 ? ST_K_CALL(ST_OPTIM_BF16, 1, ST_OPTIM_BF16)
			   : ST_K_CALL(ST_OPTIM_F32, 1, ST_OPTIM_BF16);
	case ST_OPTIM_F16:
		return g16 ? ST_K_CALL(ST_OPTIM_BF16, 1, ST_OPTIM_F16)
			   : ST_K_CALL(ST_OPTIM_F32, 1, ST_OPTIM_F16);
	default:
		return g16 ? ST_K_CALL(ST_OPTIM_BF16, 1, ST_OPTIM_F32)
			   : ST_K_CALL(ST_OPTIM_F32, 1, ST_OPTIM_F32);
	}
#undef ST_K_CALL
#undef ST_K_BODY
}

ST_K_TARGET static void ST_K(gstat)(const void *g, enum st_optim_dtype g_dtype, size_t n,
				    double lanes[ST_GSTAT_LANES], uint32_t *absmax_bits)
{
	__m512d acc = _mm512_setzero_pd();
	__m512i amax = _mm512_setzero_si512();
	const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m512i u;
		__m512d lo, hi;

		if (g_dtype == ST_OPTIM_BF16)
			u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(
				(const __m256i *)((const uint16_t *)g + i))), 16);
		else
			u = _mm512_loadu_si512((const void *)((const float *)g + i));
		/* lane j takes element i+j, then i+8+j: index order per lane */
		lo = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_castsi512_si256(u)));
		hi = _mm512_cvtps_pd(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(u, 1)));
		acc = _mm512_fmadd_pd(lo, lo, acc);
		acc = _mm512_fmadd_pd(hi, hi, acc);
		amax = _mm512_max_epu32(amax, _mm512_and_si512(u, absmask));
	}
	_mm512_storeu_pd(lanes, acc);
	*absmax_bits = (uint32_t)_mm512_reduce_max_epu32(amax);
	st_gstat_tail(g, g_dtype, i, n, lanes, absmax_bits);
}
