/* Compact optimizer state (bf16, q8): every kernel bitwise against the
 * scalar one (every tail, misaligned starts, streaming W, non-finite
 * gradients), threads and tiles on block boundaries bitwise, the codes
 * against an independent nearest-value search, round-trip error bounds,
 * and a few hundred AdamW steps on a quadratic against fp32 state. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "optim_test_util.h"

#include <errno.h>
#include <omp.h>

/* One problem in a compact state: G, P, W and the codes and scales. */
struct sc {
	size_t n, nb;
	enum st_optim_state st;
	enum st_optim_dtype gdt, wdt;
	int has_w;
	struct tu_buf g, p, mc, vc, ms, vs, w;
};

static size_t code_bytes(enum st_optim_state st)
{
	return st == ST_OPTIM_STATE_BF16 ? 2u : 1u;
}

static void sc_init(struct sc *t, enum st_optim_state st, size_t n, size_t off,
		    enum st_optim_dtype gdt, int has_w, enum st_optim_dtype wdt)
{
	t->n = n;
	t->nb = (n + ST_Q8_BLOCK - 1) / ST_Q8_BLOCK;
	t->st = st;
	t->gdt = gdt;
	t->wdt = wdt;
	t->has_w = has_w;
	tu_buf_alloc(&t->g, n, tu_dtype_bytes(gdt), off);
	tu_buf_alloc(&t->p, n, 4, (off + 1) % 16);
	tu_buf_alloc(&t->mc, n, code_bytes(st), (off + 2) % 16);
	tu_buf_alloc(&t->vc, n, code_bytes(st), (off + 3) % 16);
	tu_buf_alloc(&t->ms, t->nb, 4, (off + 4) % 16);
	tu_buf_alloc(&t->vs, t->nb, 4, (off + 6) % 16);
	tu_buf_alloc(&t->w, has_w ? n : 0, tu_dtype_bytes(wdt), (off + 5) % 16);
}

static struct st_adam_bufs sc_bufs(struct sc *t)
{
	return (struct st_adam_bufs){
		.g = t->g.data, .g_dtype = t->gdt, .p = t->p.data,
		.w = t->has_w ? t->w.data : NULL, .w_dtype = t->wdt,
		.state = t->st, .mc = t->mc.data, .vc = t->vc.data,
		.m_scale = t->ms.data, .v_scale = t->vs.data,
	};
}

/* Random G, P and a state made by quantizing random M, V (V over many
 * decades, so the codes' whole range is used); nan_every > 0 puts a NaN or
 * Inf gradient at every nan_every-th element. */
static void sc_fill(struct sc *t, uint64_t seed, size_t nan_every)
{
	uint64_t s = seed;
	float *m = malloc((t->n + 1) * sizeof(float)), *v = malloc((t->n + 1) * sizeof(float));
	struct st_adam_bufs b = sc_bufs(t);

	for (size_t i = 0; i < t->n; i++) {
		float g = tu_rand_f(&s, -2.0f, 2.0f);

		if (nan_every && i % nan_every == nan_every - 1)
			g = (i / nan_every) % 2 ? NAN : -INFINITY;
		if (t->gdt == ST_OPTIM_BF16)
			((uint16_t *)t->g.data)[i] = st_bf16_from_f32(g);
		else
			((float *)t->g.data)[i] = g;
		((float *)t->p.data)[i] = tu_rand_f(&s, -1.0f, 1.0f);
		m[i] = tu_rand_f(&s, -0.2f, 0.2f);
		v[i] = 0.5f * powf(10.0f, tu_rand_f(&s, -8.0f, 0.0f));
		if (tu_rand_u64(&s) % 50 == 0)
			v[i] = 0.0f;
	}
	st_optim_state_store(&b, t->n, m, v);
	free(m);
	free(v);
}

static void sc_copy(struct sc *dst, const struct sc *src)
{
	memcpy(dst->g.raw, src->g.raw, src->g.raw_bytes);
	memcpy(dst->p.raw, src->p.raw, src->p.raw_bytes);
	memcpy(dst->mc.raw, src->mc.raw, src->mc.raw_bytes);
	memcpy(dst->vc.raw, src->vc.raw, src->vc.raw_bytes);
	memcpy(dst->ms.raw, src->ms.raw, src->ms.raw_bytes);
	memcpy(dst->vs.raw, src->vs.raw, src->vs.raw_bytes);
	memcpy(dst->w.raw, src->w.raw, src->w.raw_bytes);
}

static int sc_same(const struct sc *a, const struct sc *b)
{
	return !memcmp(a->p.data, b->p.data, a->p.bytes) &&
	       !memcmp(a->mc.data, b->mc.data, a->mc.bytes) &&
	       !memcmp(a->vc.data, b->vc.data, a->vc.bytes) &&
	       (a->st != ST_OPTIM_STATE_Q8 || (!memcmp(a->ms.data, b->ms.data, a->ms.bytes) &&
					       !memcmp(a->vs.data, b->vs.data, a->vs.bytes))) &&
	       !memcmp(a->w.data, b->w.data, a->w.bytes);
}

static void sc_check_guards(const struct sc *t)
{
	assert_true(tu_buf_guards_ok(&t->g) && tu_buf_guards_ok(&t->p) &&
		    tu_buf_guards_ok(&t->mc) && tu_buf_guards_ok(&t->vc) &&
		    tu_buf_guards_ok(&t->ms) && tu_buf_guards_ok(&t->vs) &&
		    tu_buf_guards_ok(&t->w));
}

static void sc_free(struct sc *t)
{
	tu_buf_free(&t->g);
	tu_buf_free(&t->p);
	tu_buf_free(&t->mc);
	tu_buf_free(&t->vc);
	tu_buf_free(&t->ms);
	tu_buf_free(&t->vs);
	tu_buf_free(&t->w);
}

static const struct st_adam_hparams hp0 = {
	.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
	.weight_decay = 0.01f, .grad_scale = 0.5f, .step = 7,
};

static const enum st_optim_state states[] = { ST_OPTIM_STATE_BF16, ST_OPTIM_STATE_Q8 };

/* Every kernel this CPU has against the scalar kernel, bitwise: both
 * compact formats, fp32 and bf16 G, every W dtype and none, plain and
 * streaming W, lengths 0..~1100 (every tail of a block and of a vector),
 * misaligned starts, with and without non-finite gradients. */
static void test_kernels_bitwise(void **state)
{
	static const size_t lens[] = { 0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 255, 256, 257,
				       300, 511, 512, 513, 777, 1024, 1031 };
	static const enum st_optim_dtype wdts[] = { ST_OPTIM_BF16, ST_OPTIM_F16, ST_OPTIM_F32 };
	size_t nk, ran = 0;
	const struct st_optim_kernel *const *ks = st_optim_kernels(&nk);

	(void)state;
	for (size_t si = 0; si < ST_ARRAY_LEN(states); si++)
	for (size_t li = 0; li < ST_ARRAY_LEN(lens); li++)
	for (int gi = 0; gi < 2; gi++)
	for (int wi = 0; wi < 4; wi++)
	for (int nanv = 0; nanv < 2; nanv++) {
		size_t n = lens[li], off = (li * 3 + (size_t)wi) % 16;
		enum st_optim_dtype gdt = gi ? ST_OPTIM_BF16 : ST_OPTIM_F32;
		enum st_optim_dtype wdt = wi < 3 ? wdts[wi] : ST_OPTIM_BF16;
		int has_w = wi < 3;
		struct sc in, ref, out;
		struct st_adam_bufs b;
		uint64_t bad_ref;

		/* off 0 everywhere once: W vector-aligned, so q8 streams W */
		if (nanv)
			off = 0;
		sc_init(&in, states[si], n, off, gdt, has_w, wdt);
		sc_init(&ref, states[si], n, off, gdt, has_w, wdt);
		sc_init(&out, states[si], n, off, gdt, has_w, wdt);
		sc_fill(&in, 100 + li, nanv ? 13 : 0);
		sc_copy(&ref, &in);
		b = sc_bufs(&ref);
		bad_ref = tu_kernel_run(&st_optim_kernel_scalar, &hp0, &b, n);
		if (nanv && n >= 13)
			assert_true(bad_ref > 0);
		for (size_t k = 1; k < nk; k++) {
			if (!ks[k]->supported())
				continue;
			for (unsigned kf = 0; kf <= ST_OPTIM_KF_STREAM_W; kf++) {
				sc_copy(&out, &in);
				b = sc_bufs(&out);
				assert_int_equal(tu_kernel_run_flags(ks[k], &hp0, &b, n, kf),
						 bad_ref);
				sc_check_guards(&out);
				if (!sc_same(&out, &ref))
					fail_msg("%s %s n=%zu g=%d w=%d nan=%d kf=%u: differs",
						 ks[k]->name, st_optim_state_name(states[si]), n, gi,
						 wi, nanv, kf);
				ran++;
			}
		}
		sc_free(&in);
		sc_free(&ref);
		sc_free(&out);
	}
	printf("optim: %zu compact-state kernel runs bitwise equal to scalar\n", ran);
}

/* q8 blocks of every kind a vector kernel treats apart, in one array, so
 * each path also follows and precedes the others (the AVX2 kernel runs
 * one block's pass 2 inside the next block's pass 1): per block of
 * ST_Q8_BLOCK, by index k:
 *   0, 3  narrow range: every code normal (the encoder's normal-only path)
 *   1     M and V with zeros and values below 2^-14 of the block's max
 *         (subnormal codes) next to normal ones
 *   2     old m_scale 2^16, 4 old v_scale 1e5 (at or past the one-multiply
 *         decode's bound: the plain per-block steps); 5 m_scale just below
 *   6     M, V and G all zero (scales 0, inverses 0)
 *   7     one G of 1e30 (finite: V' overflows to +Inf, no lane skipped)
 *   8     one NaN G (that lane keeps P, M, V)
 *   9     P NaNs with payloads that the bf16 rounding would carry into
 *         (W from a NaN)
 *   10    a third of sqrt(V') nonzero but below 2^-14 of the max (M' normal)
 *   11    M' about 1e-39: the inverse of M's new scale is +Inf
 *   12    a third of M' nonzero but below 2^-14 of the max (sqrt(V') normal)
 *   13    a short last block (n = 13 blocks + 100)
 * fp32 and bf16 G, every W dtype and none, plain and streaming W with W on
 * 32 bytes and on 16 bytes only, three steps; every kernel bitwise against
 * the scalar one. */
static void q8_fill_kinds(struct sc *t)
{
	uint64_t s = 77;
	float *m = malloc(t->n * sizeof(float)), *v = malloc(t->n * sizeof(float));
	float *g = malloc(t->n * sizeof(float));
	float *p = t->p.data, *ms = t->ms.data, *vs = t->vs.data;
	struct st_adam_bufs b = sc_bufs(t);

	for (size_t i = 0; i < t->n; i++) {
		size_t k = i / ST_Q8_BLOCK, r = i % ST_Q8_BLOCK;
		float sign = tu_rand_u64(&s) % 2 ? -1.0f : 1.0f;

		m[i] = sign * tu_rand_f(&s, 0.5f, 1.0f) * 0.01f;
		v[i] = tu_rand_f(&s, 0.25f, 1.0f) * 1e-4f;
		g[i] = tu_rand_f(&s, -1.0f, 1.0f) * 0.01f;
		p[i] = tu_rand_f(&s, -1.0f, 1.0f);
		if (k == 1 && r % 3 == 0) {
			m[i] = r % 2 ? 0.0f : -1e-9f;
			v[i] = r % 2 ? 0.0f : 1e-20f;
			g[i] = r % 2 ? 0.0f : 1e-12f;
		}
		if (k == 6)
			m[i] = v[i] = g[i] = 0.0f;
		if (k == 7 && r == 17)
			g[i] = 1e30f;
		if (k == 8 && r == 40)
			g[i] = NAN;
		if (k == 9 && r % 50 == 49)
			p[i] = st_f32_from_bits(r % 100 == 49 ? 0x7fc08001u : 0xffd0ffffu);
		if (k == 10 && r % 3 == 0) {
			v[i] = 0.0f;
			g[i] = sign * 3e-6f;
		}
		if (k == 12 && r % 3 == 0) {
			m[i] = 0.0f;
			g[i] = sign * 3e-6f;
			v[i] = 1e-4f;
		}
		if (k == 11) {
			m[i] = sign * 1e-39f;
			g[i] = 0.0f;
		}
	}
	for (size_t i = 0; i < t->n; i++) {
		if (t->gdt == ST_OPTIM_BF16)
			((uint16_t *)t->g.data)[i] = st_bf16_from_f32(g[i]);
		else
			((float *)t->g.data)[i] = g[i];
	}
	st_optim_state_store(&b, t->n, m, v);
	ms[2] = 0x1p16f;
	vs[4] = 1e5f;
	ms[5] = 0x1.fffffep15f;
	free(m);
	free(v);
	free(g);
}

static void test_q8_block_kinds(void **state)
{
	static const enum st_optim_dtype wdts[] = { ST_OPTIM_BF16, ST_OPTIM_F16, ST_OPTIM_F32 };
	static const size_t offs[] = { 11, 3 }; /* W at offset 0 (32 bytes), 8 (16 bytes) */
	const size_t n = 13 * ST_Q8_BLOCK + 100;
	size_t nk, ran = 0;
	const struct st_optim_kernel *const *ks = st_optim_kernels(&nk);

	(void)state;
	for (int gi = 0; gi < 2; gi++)
	for (int wi = 0; wi < 4; wi++)
	for (size_t oi = 0; oi < ST_ARRAY_LEN(offs); oi++) {
		enum st_optim_dtype gdt = gi ? ST_OPTIM_BF16 : ST_OPTIM_F32;
		enum st_optim_dtype wdt = wi < 3 ? wdts[wi] : ST_OPTIM_BF16;
		struct sc in, ref, out;
		struct st_adam_bufs b;
		uint64_t bad_ref = 0;

		sc_init(&in, ST_OPTIM_STATE_Q8, n, offs[oi], gdt, wi < 3, wdt);
		sc_init(&ref, ST_OPTIM_STATE_Q8, n, offs[oi], gdt, wi < 3, wdt);
		sc_init(&out, ST_OPTIM_STATE_Q8, n, offs[oi], gdt, wi < 3, wdt);
		q8_fill_kinds(&in);
		sc_copy(&ref, &in);
		b = sc_bufs(&ref);
		for (int step = 0; step < 3; step++)
			bad_ref += tu_kernel_run(&st_optim_kernel_scalar, &hp0, &b, n);
		assert_true(bad_ref == 3);
		for (size_t k = 1; k < nk; k++) {
			if (!ks[k]->supported())
				continue;
			for (unsigned kf = 0; kf <= ST_OPTIM_KF_STREAM_W; kf++) {
				uint64_t bad = 0;

				sc_copy(&out, &in);
				b = sc_bufs(&out);
				for (int step = 0; step < 3; step++)
					bad += tu_kernel_run_flags(ks[k], &hp0, &b, n, kf);
				assert_true(bad == bad_ref);
				sc_check_guards(&out);
				if (!sc_same(&out, &ref))
					fail_msg("%s q8 block kinds g=%d w=%d off=%zu kf=%u: differs",
						 ks[k]->name, gi, wi, offs[oi], kf);
				ran++;
			}
		}
		sc_free(&in);
		sc_free(&ref);
		sc_free(&out);
	}
	printf("optim: %zu q8 block-kind kernel runs bitwise equal to scalar\n", ran);
}

/* Through st_adam_apply(): 1, 2, 3 threads on every path, and tiles of
 * random whole blocks (bf16: any length), give the scalar path's bits over
 * several chunks; q8 tiles cut inside a block do not. */
static void test_threads_and_tiles(void **state)
{
	const size_t n = 3 * ST_ADAM_CHUNK_ELEMS + 1237;
	static const enum st_optim_path paths[] = { ST_OPTIM_PATH_SCALAR, ST_OPTIM_PATH_AVX2,
						    ST_OPTIM_PATH_AVX512 };

	(void)state;
	for (size_t si = 0; si < ST_ARRAY_LEN(states); si++) {
		enum st_optim_state st = states[si];
		struct sc in, ref, out;
		struct st_adam_step step;
		struct st_adam_bufs b;

		sc_init(&in, st, n, 0, ST_OPTIM_F32, 1, ST_OPTIM_BF16);
		sc_init(&ref, st, n, 0, ST_OPTIM_F32, 1, ST_OPTIM_BF16);
		sc_init(&out, st, n, 0, ST_OPTIM_F32, 1, ST_OPTIM_BF16);
		sc_fill(&in, 9, 0);
		assert_int_equal(st_optim_path_set(ST_OPTIM_PATH_SCALAR), 0);
		omp_set_num_threads(1);
		sc_copy(&ref, &in);
		b = sc_bufs(&ref);
		assert_int_equal(st_adam_update(&hp0, &b, n, 0, NULL), 0);
		for (size_t pi = 0; pi < ST_ARRAY_LEN(paths); pi++) {
			uint64_t seed = 5;

			if (!st_optim_path_supported(paths[pi])) {
				printf("optim: path %s skipped: this CPU lacks it\n",
				       st_optim_path_name(paths[pi]));
				continue;
			}
			assert_int_equal(st_optim_path_set(paths[pi]), 0);
			for (int threads = 1; threads <= 3; threads++) {
				omp_set_num_threads(threads);
				sc_copy(&out, &in);
				b = sc_bufs(&out);
				assert_int_equal(st_adam_update(&hp0, &b, n, ST_ADAM_GRAD_CHECKED,
								NULL), 0);
				sc_check_guards(&out);
				assert_true(sc_same(&out, &ref));
			}
			omp_set_num_threads(2);
			sc_copy(&out, &in);
			assert_int_equal(st_adam_prep(&step, &hp0), 0);
			for (size_t off = 0; off < n;) {
				size_t len = 1 + (size_t)(tu_rand_u64(&seed) % 40000);
				struct st_adam_bufs tb = sc_bufs(&out);
				size_t cb = code_bytes(st);

				if (st == ST_OPTIM_STATE_Q8)
					len = st_align_up(len, ST_Q8_BLOCK);
				len = ST_MIN(n - off, len);
				tb.g = (const float *)tb.g + off;
				tb.p += off;
				tb.w = (uint16_t *)tb.w + off;
				tb.mc = (char *)tb.mc + off * cb;
				tb.vc = (char *)tb.vc + off * cb;
				tb.m_scale += off / ST_Q8_BLOCK;
				tb.v_scale += off / ST_Q8_BLOCK;
				assert_int_equal(st_adam_apply(&step, &tb, len, 0, NULL), 0);
				off += len;
			}
			assert_true(sc_same(&out, &ref));
		}
		if (st == ST_OPTIM_STATE_Q8) {
			/* the contract is needed: a cut at element 100 changes bits */
			struct st_adam_bufs tb;

			sc_copy(&out, &in);
			b = sc_bufs(&out);
			assert_int_equal(st_adam_prep(&step, &hp0), 0);
			assert_int_equal(st_adam_apply(&step, &b, 100, 0, NULL), 0);
			tb = b;
			tb.g = (const float *)tb.g + 100;
			tb.p += 100;
			tb.w = (uint16_t *)tb.w + 100;
			tb.mc = (char *)tb.mc + 100;
			tb.vc = (char *)tb.vc + 100;
			assert_int_equal(st_adam_apply(&step, &tb, n - 100, 0, NULL), 0);
			assert_false(sc_same(&out, &ref));
		}
		sc_free(&in);
		sc_free(&ref);
		sc_free(&out);
	}
	assert_int_equal(st_optim_path_set(ST_OPTIM_PATH_AUTO), 0);
	omp_set_num_threads(2);
}

/* The decoded value of each code with mb mantissa bits, in fp64. */
static double code_value(unsigned c, unsigned mb)
{
	unsigned e = c >> mb, m = c & ((1u << mb) - 1u);

	return e ? ldexp(1.0 + (double)m / (1u << mb), (int)e - 15)
		 : ldexp((double)m, -14 - (int)mb);
}

/* Each code is the nearest code (ties to the even code) by a search over
 * all codes in fp64, for every midpoint, its neighbours and random r; M's
 * sign goes to bit 7. */
static void test_codes_nearest(void **state)
{
	uint64_t s = 3;

	(void)state;
	for (unsigned mb = 3; mb <= 4; mb++) {
		unsigned ncodes = 1u << (mb + 4u);

		for (unsigned c = 0; c < ncodes; c++)
			assert_true(st_q8_dec(c, mb) == (float)code_value(c, mb));
		for (unsigned t = 0; t < 200000; t++) {
			float r;
			unsigned best = 0, c;
			double bd = INFINITY;

			if (t < (ncodes - 1) * 3) {
				double mid = 0.5 * (code_value(t / 3, mb) + code_value(t / 3 + 1, mb));

				r = (float)mid;
				r = t % 3 == 1 ? nextafterf(r, 0.0f)
				    : t % 3 == 2 ? nextafterf(r, 2.0f) : r;
			} else {
				r = powf(2.0f, tu_rand_f(&s, -22.0f, 0.0f));
			}
			for (unsigned k = 0; k < ncodes; k++) {
				double d = fabs(code_value(k, mb) - (double)r);

				if (d < bd || (d == bd && !(k & 1u))) {
					bd = d;
					best = k;
				}
			}
			c = st_q8_enc(r, mb);
			if (c != best)
				fail_msg("mb=%u r=%a: code %u, nearest %u", mb, (double)r, c, best);
		}
	}
	assert_int_equal(st_q8v_encode(0.0f), 0);
	assert_int_equal(st_q8v_encode(-0.0f), 0);
	assert_int_equal(st_q8v_encode(1.0f), 240);
	assert_int_equal(st_q8v_encode(100.0f), 255);
	assert_int_equal(st_q8m_encode(1.0f, 1.0f), 120);
	assert_int_equal(st_q8m_encode(-1.0f, 1.0f), 0x80 | 120);
	assert_true(st_q8m_decode(0x80 | 120) == -1.0f);
	assert_int_equal(st_q8m_encode(-0.75f, 0.5f), 0x80 | 108); /* 0.375 = 2^-2 * (1 + 4/8) */
	assert_true(st_q8m_decode(0x80 | 108) == -0.375f);
}

/* store then load: bf16 within half an ulp (2^-8 relative); q8 M within
 * 2^-4 relative (normal codes) or 2^-18 of the block's max |M| (subnormal),
 * sqrt(V) within 2^-5 relative or 2^-19 of the block's max sqrt(V). */
static void test_round_trip(void **state)
{
	const size_t n = 10 * ST_Q8_BLOCK + 77;
	float *m = malloc(n * 4), *v = malloc(n * 4), *m2 = malloc(n * 4), *v2 = malloc(n * 4);
	uint64_t s = 11;

	(void)state;
	for (size_t i = 0; i < n; i++) {
		m[i] = tu_rand_f(&s, -1.0f, 1.0f) * powf(10.0f, tu_rand_f(&s, -6.0f, 0.0f));
		v[i] = powf(10.0f, tu_rand_f(&s, -12.0f, 0.0f));
	}
	for (size_t si = 0; si < ST_ARRAY_LEN(states); si++) {
		struct sc t;
		struct st_adam_bufs b;

		sc_init(&t, states[si], n, 0, ST_OPTIM_F32, 0, ST_OPTIM_BF16);
		b = sc_bufs(&t);
		st_optim_state_store(&b, n, m, v);
		st_optim_state_load(&b, n, m2, v2);
		for (size_t i = 0; i < n; i++) {
			if (states[si] == ST_OPTIM_STATE_BF16) {
				assert_true(fabs(m2[i] - m[i]) <= ldexp(fabs(m[i]), -8));
				assert_true(fabs(v2[i] - v[i]) <= ldexp(fabs(v[i]), -8));
			} else {
				size_t k0 = i / ST_Q8_BLOCK * ST_Q8_BLOCK;
				size_t k1 = ST_MIN(n, k0 + ST_Q8_BLOCK);
				double am = 0, sm = 0, sq = sqrt((double)v[i]);

				for (size_t j = k0; j < k1; j++) {
					am = fmax(am, fabs(m[j]));
					sm = fmax(sm, sqrt((double)v[j]));
				}
				if (fabs(m[i]) >= ldexp(am, -14))
					assert_true(fabs(m2[i] - m[i]) <= ldexp(fabs(m[i]), -4) *
									   (1 + 1e-5));
				else
					assert_true(fabs(m2[i] - m[i]) <= ldexp(am, -18) * (1 + 1e-5));
				if (sq >= ldexp(sm, -14))
					assert_true(fabs(sqrt((double)v2[i]) - sq) <=
						    ldexp(sq, -5) * (1 + 1e-5));
				else
					assert_true(fabs(sqrt((double)v2[i]) - sq) <=
						    ldexp(sm, -19) * (1 + 1e-5));
			}
		}
		sc_check_guards(&t);
		sc_free(&t);
	}
	free(m);
	free(v);
	free(m2);
	free(v2);
}

/* The state after some kernel steps, decoded and encoded again, is the
 * same codes and scales bit for bit (what a checkpoint's resume relies
 * on: docs/optim.md), also for blocks whose M and V span decades and for
 * a short last block. */
static void test_reencode(void **state)
{
	const size_t n = 7 * ST_Q8_BLOCK + 45;
	float *m = malloc(n * 4), *v = malloc(n * 4);

	(void)state;
	for (size_t si = 0; si < ST_ARRAY_LEN(states); si++) {
		struct sc t, u;
		struct st_adam_bufs b, bu;

		sc_init(&t, states[si], n, 0, ST_OPTIM_F32, 1, ST_OPTIM_BF16);
		sc_init(&u, states[si], n, 0, ST_OPTIM_F32, 1, ST_OPTIM_BF16);
		sc_fill(&t, 77, 0);
		b = sc_bufs(&t);
		for (uint64_t k = 1; k <= 5; k++) {
			struct st_adam_hparams hp = hp0;

			hp.step = k;
			assert_int_equal(st_adam_update(&hp, &b, n, 0, NULL), 0);
		}
		st_optim_state_load(&b, n, m, v);
		bu = sc_bufs(&u);
		st_optim_state_store(&bu, n, m, v);
		assert_memory_equal(t.mc.data, u.mc.data, t.mc.bytes);
		assert_memory_equal(t.vc.data, u.vc.data, t.vc.bytes);
		if (states[si] == ST_OPTIM_STATE_Q8) {
			assert_memory_equal(t.ms.data, u.ms.data, t.ms.bytes);
			assert_memory_equal(t.vs.data, u.vs.data, t.vs.bytes);
		}
		sc_free(&t);
		sc_free(&u);
	}
	free(m);
	free(v);
}

/* A noisy quadratic, f(x) = sum a_i (x_i - c_i)^2 / 2 with curvatures
 * over four decades and uniform gradient noise in [-1, 1) (the same noise
 * for each format), 400 AdamW steps at lr 2e-3 from x = 0 with fp32 G and
 * each state format. Measured here: fp32 state's loss 463, bf16 435 and
 * max |x - x_fp32| 0.029, q8 444 and 0.092 (a linear int8 M code gave
 * 0.77). Held: max |x - x_fp32| <= 0.06 (bf16), 0.2 (q8); loss within 10%
 * of fp32's. */
#define LR 2e-3f
#define NOISE 1.0f
static void test_quadratic(void **state)
{
	const size_t n = 4096;
	const int steps = 400;
	float *x[3], *mf = calloc(n, 4), *vf = calloc(n, 4), *g = malloc(n * 4);
	float *a = malloc(n * 4), *c = malloc(n * 4);
	double loss[3];
	uint64_t s = 21;

	(void)state;
	for (size_t i = 0; i < n; i++) {
		a[i] = powf(10.0f, tu_rand_f(&s, -2.0f, 2.0f));
		c[i] = tu_rand_f(&s, -1.0f, 1.0f);
	}
	for (int f = 0; f < 3; f++) {
		struct sc t;
		struct st_adam_bufs b;

		x[f] = calloc(n, 4);
		sc_init(&t, f ? states[f - 1] : ST_OPTIM_STATE_BF16, n, 0, ST_OPTIM_F32, 0,
			ST_OPTIM_BF16);
		memset(t.mc.data, 0, t.mc.bytes);
		memset(t.vc.data, 0, t.vc.bytes);
		memset(t.ms.data, 0, t.ms.bytes);
		memset(t.vs.data, 0, t.vs.bytes);
		memset(mf, 0, n * 4);
		memset(vf, 0, n * 4);
		b = sc_bufs(&t);
		b.g = g;
		b.p = x[f];
		if (!f) {
			b.state = ST_OPTIM_STATE_F32;
			b.m = mf;
			b.v = vf;
		}
		for (int k = 1; k <= steps; k++) {
			struct st_adam_hparams hp = {
				.lr = LR, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
				.grad_scale = 1.0f, .step = (uint64_t)k,
			};

			uint64_t ns = 1000 + (uint64_t)k; /* the same noise for each format */

			for (size_t i = 0; i < n; i++)
				g[i] = a[i] * (x[f][i] - c[i]) + NOISE * tu_rand_f(&ns, -1.0f, 1.0f);
			assert_int_equal(st_adam_update(&hp, &b, n, ST_ADAM_GRAD_CHECKED, NULL), 0);
		}
		loss[f] = 0;
		for (size_t i = 0; i < n; i++)
			loss[f] += 0.5 * a[i] * ((double)x[f][i] - c[i]) * ((double)x[f][i] - c[i]);
		sc_free(&t);
	}
	for (int f = 1; f < 3; f++) {
		double dmax = 0;

		for (size_t i = 0; i < n; i++)
			dmax = fmax(dmax, fabs((double)x[f][i] - x[0][i]));
		printf("optim: quadratic, %d steps: loss fp32 %.6g, %s %.6g, max |x - x_fp32| %.3g\n",
		       steps, loss[0], st_optim_state_name(states[f - 1]), loss[f], dmax);
		assert_true(dmax <= (f == 1 ? 0.06 : 0.2));
		assert_true(fabs(loss[f] - loss[0]) <= 0.1 * loss[0]);
	}
	for (int f = 0; f < 3; f++)
		free(x[f]);
	free(mf);
	free(vf);
	free(g);
	free(a);
	free(c);
}

/* Bad formats and missing arrays: -EINVAL, nothing written. */
static void test_invalid(void **state)
{
	float g = 1, p = 1;
	uint16_t mc = 0, vc = 0;
	struct st_adam_bufs b = { .g = &g, .g_dtype = ST_OPTIM_F32, .p = &p,
				  .state = ST_OPTIM_STATE_BF16, .mc = &mc, .vc = &vc };
	enum st_optim_state st;

	(void)state;
	assert_int_equal(st_adam_update(&hp0, &b, 1, 0, NULL), 0);
	b.state = ST_OPTIM_STATE_Q8; /* no scales */
	assert_int_equal(st_adam_update(&hp0, &b, 1, 0, NULL), -EINVAL);
	b.state = (enum st_optim_state)7;
	assert_int_equal(st_adam_update(&hp0, &b, 1, 0, NULL), -EINVAL);
	b.state = ST_OPTIM_STATE_BF16;
	b.vc = NULL;
	p = 1;
	assert_int_equal(st_adam_update(&hp0, &b, 1, 0, NULL), -EINVAL);
	assert_true(p == 1);
	assert_int_equal(st_optim_state_parse("q8", &st), 0);
	assert_int_equal(st, ST_OPTIM_STATE_Q8);
	assert_int_equal(st_optim_state_parse("bf16", &st), 0);
	assert_int_equal(st_optim_state_parse("fp32", &st), 0);
	assert_int_equal(st_optim_state_parse("fp16", &st), -EINVAL);
	assert_int_equal(st_optim_state_bytes(ST_OPTIM_STATE_F32, 1000), 8000);
	assert_int_equal(st_optim_state_bytes(ST_OPTIM_STATE_BF16, 1000), 4000);
	assert_int_equal(st_optim_state_bytes(ST_OPTIM_STATE_Q8, 1000), 2000 + 8 * 4);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kernels_bitwise),
		cmocka_unit_test(test_q8_block_kinds),
		cmocka_unit_test(test_threads_and_tiles),
		cmocka_unit_test(test_codes_nearest),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_reencode),
		cmocka_unit_test(test_quadratic),
		cmocka_unit_test(test_invalid),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
