/* AdamW kernels: every path, with plain and streaming W stores, against a
 * double-precision reference and bitwise against the scalar path, over all
 * tail lengths and misaligned starts; non-finite gradients bitwise; threads
 * and tiling bitwise; a call big enough to stream; bias correction; lr = 0;
 * NaN/Inf. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "optim_test_util.h"

#include <errno.h>
#include <omp.h>

/* One problem: inputs G, P, M, V and the outputs of one run. */
struct tc {
	size_t n;
	enum st_optim_dtype gdt, wdt;
	int has_w;
	struct tu_buf g, p, m, v, w;
};

static void tc_init(struct tc *t, size_t n, size_t off, enum st_optim_dtype gdt,
		    int has_w, enum st_optim_dtype wdt)
{
	t->n = n;
	t->gdt = gdt;
	t->wdt = wdt;
	t->has_w = has_w;
	tu_buf_alloc(&t->g, n, tu_dtype_bytes(gdt), off);
	tu_buf_alloc(&t->p, n, 4, (off + 1) % 16);
	tu_buf_alloc(&t->m, n, 4, (off + 2) % 16);
	tu_buf_alloc(&t->v, n, 4, (off + 3) % 16);
	tu_buf_alloc(&t->w, has_w ? n : 0, tu_dtype_bytes(wdt), (off + 5) % 16);
}

static void tc_fill(struct tc *t, uint64_t seed)
{
	uint64_t s = seed;

	for (size_t i = 0; i < t->n; i++) {
		float g = tu_rand_f(&s, -2.0f, 2.0f);

		if (t->gdt == ST_OPTIM_BF16)
			((uint16_t *)t->g.data)[i] = st_bf16_from_f32(g);
		else
			((float *)t->g.data)[i] = g;
		((float *)t->p.data)[i] = tu_rand_f(&s, -1.0f, 1.0f);
		((float *)t->m.data)[i] = tu_rand_f(&s, -0.2f, 0.2f);
		((float *)t->v.data)[i] = tu_rand_f(&s, 0.0f, 0.5f);
	}
}

/* Copy the inputs (and W's contents) of src into dst of the same shape. */
static void tc_copy(struct tc *dst, const struct tc *src)
{
	memcpy(dst->g.raw, src->g.raw, src->g.raw_bytes);
	memcpy(dst->p.raw, src->p.raw, src->p.raw_bytes);
	memcpy(dst->m.raw, src->m.raw, src->m.raw_bytes);
	memcpy(dst->v.raw, src->v.raw, src->v.raw_bytes);
	memcpy(dst->w.raw, src->w.raw, src->w.raw_bytes);
}

static struct st_adam_bufs tc_bufs(struct tc *t)
{
	struct st_adam_bufs b = {
		.g = t->g.data, .g_dtype = t->gdt,
		.p = t->p.data, .m = t->m.data, .v = t->v.data,
		.w = t->has_w ? t->w.data : NULL, .w_dtype = t->wdt,
	};
	return b;
}

static int tc_same(const struct tc *a, const struct tc *b)
{
	return !memcmp(a->p.raw, b->p.raw, a->p.raw_bytes) &&
	       !memcmp(a->m.raw, b->m.raw, a->m.raw_bytes) &&
	       !memcmp(a->v.raw, b->v.raw, a->v.raw_bytes) &&
	       !memcmp(a->w.raw, b->w.raw, a->w.raw_bytes) &&
	       !memcmp(a->g.raw, b->g.raw, a->g.raw_bytes);
}

static void tc_check_guards(const struct tc *t)
{
	assert_true(tu_buf_guards_ok(&t->g));
	assert_true(tu_buf_guards_ok(&t->p));
	assert_true(tu_buf_guards_ok(&t->m));
	assert_true(tu_buf_guards_ok(&t->v));
	assert_true(tu_buf_guards_ok(&t->w));
}

static void tc_free(struct tc *t)
{
	tu_buf_free(&t->g);
	tu_buf_free(&t->p);
	tu_buf_free(&t->m);
	tu_buf_free(&t->v);
	tu_buf_free(&t->w);
}

/* W must be exactly the conversion of the new P. */
static void tc_check_w(const struct tc *t)
{
	const float *p = t->p.data;

	if (!t->has_w)
		return;
	for (size_t i = 0; i < t->n; i++) {
		if (t->wdt == ST_OPTIM_BF16)
			assert_int_equal(((uint16_t *)t->w.data)[i], st_bf16_from_f32(p[i]));
		else if (t->wdt == ST_OPTIM_F16)
			assert_int_equal(((uint16_t *)t->w.data)[i], st_f16_from_f32(p[i]));
		else
			assert_int_equal(st_f32_bits(((float *)t->w.data)[i]), st_f32_bits(p[i]));
	}
}

/* Compare the result of one step (after) with the double reference from
 * the inputs (before). */
static void tc_check_ref(const struct tc *before, const struct tc *after,
			 const struct st_adam_hparams *hp)
{
	for (size_t i = 0; i < before->n; i++) {
		double p = ((float *)before->p.data)[i], m = ((float *)before->m.data)[i];
		double v = ((float *)before->v.data)[i], ps, ms;
		double g = tu_g_at(before->g.data, before->gdt, i);
		double pk = ((float *)after->p.data)[i], mk = ((float *)after->m.data)[i];
		double vk = ((float *)after->v.data)[i];

		tu_adam_ref(hp, g, &p, &m, &v, &ps, &ms);
		if (fabs(pk - p) > 2e-6 * ps + 1e-30 || fabs(mk - m) > 1e-6 * ms + 1e-30 ||
		    fabs(vk - v) > 1e-6 * v + 1e-30) {
			print_error("elem %zu of %zu: p %.9g ref %.9g (scale %g), m %.9g ref %.9g, "
				    "v %.9g ref %.9g\n", i, before->n, pk, p, ps, mk, m, vk, v);
			fail();
		}
	}
	tc_check_w(after);
}

static const struct st_adam_hparams hp_sets[] = {
	{ .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
	  .grad_scale = 0.5f, .step = 7 },
	{ .lr = 0.1f, .beta1 = 0.5f, .beta2 = 0.9f, .eps = 1e-3f, .weight_decay = 0.1f,
	  .grad_scale = 3.0f, .step = 1 },
	{ .lr = 3e-4f, .beta1 = 0.95f, .beta2 = 0.98f, .eps = 1e-6f, .weight_decay = 0.0f,
	  .grad_scale = 1.0f / 1024.0f, .step = 12345 },
};

static const struct st_optim_kernel *const *kernels(size_t *count)
{
	return st_optim_kernels(count);
}

static void print_skips(void)
{
	size_t nk;
	const struct st_optim_kernel *const *ks = kernels(&nk);

	for (size_t i = 0; i < nk; i++)
		if (!ks[i]->supported())
			printf("optim: kernel %s skipped: this CPU lacks it\n", ks[i]->name);
}

/* Every kernel, every dtype pair, lengths 0..10000 (every tail size below
 * 70 and around each power of two), misaligned starts. */
static void test_paths_vs_reference(void **state)
{
	static const size_t lens_big[] = { 127, 128, 129, 255, 256, 257, 1000, 1023, 1024,
					   1025, 4095, 4096, 4097, 9999, 10000 };
	static const enum st_optim_dtype wdts[] = { ST_OPTIM_BF16, ST_OPTIM_F16, ST_OPTIM_F32 };
	size_t nk, n_lens = 70 + ST_ARRAY_LEN(lens_big);
	const struct st_optim_kernel *const *ks = kernels(&nk);
	uint64_t seed = 1;

	(void)state;
	for (size_t li = 0; li < n_lens; li++) {
		size_t n = li < 70 ? li : lens_big[li - 70];

		for (int gi = 0; gi < 2; gi++) {
			for (size_t wi = 0; wi < 4; wi++) {
				enum st_optim_dtype gdt = gi ? ST_OPTIM_BF16 : ST_OPTIM_F32;
				int has_w = wi < 3;
				enum st_optim_dtype wdt = has_w ? wdts[wi] : ST_OPTIM_BF16;
				size_t off = (li + wi + (size_t)gi) % 7;
				const struct st_adam_hparams *hp = &hp_sets[li % 3];
				struct tc in, ref, out;
				uint64_t bad;

				tc_init(&in, n, off, gdt, has_w, wdt);
				tc_init(&ref, n, off, gdt, has_w, wdt);
				tc_init(&out, n, off, gdt, has_w, wdt);
				tc_fill(&in, seed++);
				tc_copy(&ref, &in);
				struct st_adam_bufs b = tc_bufs(&ref);
				bad = tu_kernel_run(&st_optim_kernel_scalar, hp, &b, n);
				assert_int_equal(bad, 0);
				tc_check_guards(&ref);
				tc_check_ref(&in, &ref, hp);
				for (size_t k = 1; k < 2 * nk; k++) {
					/* each kernel with plain and with streaming W stores */
					unsigned kf = k >= nk ? ST_OPTIM_KF_STREAM_W : 0u;

					if (!ks[k % nk]->supported())
						continue;
					tc_copy(&out, &in);
					b = tc_bufs(&out);
					bad = tu_kernel_run_flags(ks[k % nk], hp, &b, n, kf);
					assert_int_equal(bad, 0);
					tc_check_guards(&out);
					if (!tc_same(&out, &ref)) {
						print_error("kernel %s (flags %u) differs from scalar: n %zu "
							    "off %zu g %d w %d/%d\n", ks[k % nk]->name, kf,
							    n, off, gdt, has_w, wdt);
						fail();
					}
				}
				tc_free(&in);
				tc_free(&ref);
				tc_free(&out);
			}
		}
	}
}

/* Several steps in a row stay close to the double reference. */
static void test_multi_step(void **state)
{
	const size_t n = 3000;
	struct st_adam_hparams hp = hp_sets[0];
	struct tc t;
	double *rp = malloc(n * sizeof(double)), *rm = malloc(n * sizeof(double));
	double *rv = malloc(n * sizeof(double));

	(void)state;
	tc_init(&t, n, 3, ST_OPTIM_F32, 1, ST_OPTIM_BF16);
	tc_fill(&t, 99);
	for (size_t i = 0; i < n; i++) {
		rp[i] = ((float *)t.p.data)[i];
		rm[i] = 0.0;
		rv[i] = 0.0;
		((float *)t.m.data)[i] = 0.0f;
		((float *)t.v.data)[i] = 0.0f;
	}
	for (uint64_t step = 1; step <= 20; step++) {
		struct st_adam_bufs b = tc_bufs(&t);

		hp.step = step;
		assert_int_equal(st_adam_update(&hp, &b, n, 0, NULL), 0);
		for (size_t i = 0; i < n; i++) {
			double ps, ms;

			tu_adam_ref(&hp, ((float *)t.g.data)[i], &rp[i], &rm[i], &rv[i], &ps, &ms);
			assert_true(fabs(((float *)t.p.data)[i] - rp[i]) <= 1e-6 * (fabs(rp[i]) + 1.0));
		}
	}
	tc_free(&t);
	free(rp);
	free(rm);
	free(rv);
}

/* 1, 2 and 3 threads, and any tiling, give the same bits on every path. */
static void test_threads_and_tiles(void **state)
{
	const size_t n = 5 * ST_ADAM_CHUNK_ELEMS + 1237;
	static const enum st_optim_path paths[] = { ST_OPTIM_PATH_SCALAR, ST_OPTIM_PATH_AVX2,
						    ST_OPTIM_PATH_AVX512 };
	const struct st_adam_hparams *hp = &hp_sets[0];
	struct tc in, ref, out;
	struct st_adam_step step;
	struct st_adam_bufs b;

	(void)state;
	tc_init(&in, n, 1, ST_OPTIM_BF16, 1, ST_OPTIM_BF16);
	tc_init(&ref, n, 1, ST_OPTIM_BF16, 1, ST_OPTIM_BF16);
	tc_init(&out, n, 1, ST_OPTIM_BF16, 1, ST_OPTIM_BF16);
	tc_fill(&in, 7);

	assert_int_equal(st_optim_path_set(ST_OPTIM_PATH_SCALAR), 0);
	omp_set_num_threads(1);
	tc_copy(&ref, &in);
	b = tc_bufs(&ref);
	assert_int_equal(st_adam_update(hp, &b, n, 0, NULL), 0);
	tc_check_ref(&in, &ref, hp);

	for (size_t pi = 0; pi < ST_ARRAY_LEN(paths); pi++) {
		if (!st_optim_path_supported(paths[pi])) {
			printf("optim: path %s skipped: this CPU lacks it\n",
			       st_optim_path_name(paths[pi]));
			continue;
		}
		assert_int_equal(st_optim_path_set(paths[pi]), 0);
		assert_int_equal(st_optim_path_get(), paths[pi]);
		for (int threads = 1; threads <= 3; threads++) {
			omp_set_num_threads(threads);
			tc_copy(&out, &in);
			b = tc_bufs(&out);
			assert_int_equal(st_adam_update(hp, &b, n, ST_ADAM_GRAD_CHECKED, NULL), 0);
			tc_check_guards(&out);
			assert_true(tc_same(&out, &ref));
		}
		/* Tiles of uneven sizes, each with its own view of the arrays. */
		omp_set_num_threads(2);
		tc_copy(&out, &in);
		assert_int_equal(st_adam_prep(&step, hp), 0);
		uint64_t seed = 5;
		for (size_t off = 0; off < n;) {
			size_t len = ST_MIN(n - off, 1 + (size_t)(tu_rand_u64(&seed) % 40000));
			struct st_adam_bufs tb = tc_bufs(&out);

			tb.g = (const uint16_t *)tb.g + off;
			tb.p += off;
			tb.m += off;
			tb.v += off;
			tb.w = (uint16_t *)tb.w + off;
			assert_int_equal(st_adam_apply(&step, &tb, len, 0, NULL), 0);
			off += len;
		}
		assert_true(tc_same(&out, &ref));
	}
	assert_int_equal(st_optim_path_set(ST_OPTIM_PATH_AUTO), 0);
	omp_set_num_threads(2);
	tc_free(&in);
	tc_free(&ref);
	tc_free(&out);
}

/* At step 1 from zero moments, bias correction makes the update
 * lr * g / (|g| + eps) (plus decay). */
static void test_bias_correction_step1(void **state)
{
	const size_t n = 1000;
	const struct st_adam_hparams hp = { .lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f,
					    .eps = 1e-8f, .weight_decay = 0.1f,
					    .grad_scale = 2.0f, .step = 1 };
	size_t nk;
	const struct st_optim_kernel *const *ks = kernels(&nk);
	struct tc in, out;

	(void)state;
	tc_init(&in, n, 0, ST_OPTIM_F32, 1, ST_OPTIM_F32);
	tc_init(&out, n, 0, ST_OPTIM_F32, 1, ST_OPTIM_F32);
	tc_fill(&in, 11);
	memset(in.m.data, 0, n * 4);
	memset(in.v.data, 0, n * 4);
	for (size_t k = 0; k < nk; k++) {
		if (!ks[k]->supported())
			continue;
		tc_copy(&out, &in);
		struct st_adam_bufs b = tc_bufs(&out);
		assert_int_equal(tu_kernel_run(ks[k], &hp, &b, n), 0);
		for (size_t i = 0; i < n; i++) {
			double g = (double)((float *)in.g.data)[i] * hp.grad_scale;
			double p0 = ((float *)in.p.data)[i];
			double want = p0 * (1.0 - (double)hp.lr * hp.weight_decay) -
				      (double)hp.lr * g / (fabs(g) + (double)hp.eps);

			assert_true(fabs(((float *)out.p.data)[i] - want) <= 1e-6 * (fabs(want) + hp.lr));
			/* M = (1 - beta1) g, V = (1 - beta2) g^2 */
			double omb1 = 1.0 - (double)hp.beta1, omb2 = 1.0 - (double)hp.beta2;

			assert_true(fabs(((float *)out.m.data)[i] - omb1 * g) <= 1e-6 * fabs(omb1 * g));
			assert_true(fabs(((float *)out.v.data)[i] - omb2 * g * g) <=
				    1e-6 * omb2 * g * g + 1e-30);
		}
	}
	tc_free(&in);
	tc_free(&out);
}

/* lr = 0 leaves P bit for bit (the decay 1 - lr * wd is exactly 1), while
 * M and V move; W is the exact conversion of P, special values included. */
static void test_lr_zero(void **state)
{
	static const uint32_t specials[] = {
		0x00000001u, 0x00400000u, 0x007fffffu, 0x80400001u, /* subnormals */
		0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, /* bf16 ties and near */
		0x7f7fffffu, 0xff7f8000u, 0x7f7f7fffu,             /* bf16 overflow edge */
		0x477ff000u, 0x477fefffu, 0x33000000u, 0x33000001u, /* fp16 edges */
		0x387fc000u, 0x38800000u, 0x7f800000u, 0xff800000u, /* fp16 subnormal, inf */
		0x7fc00001u, 0xffa00000u,                           /* NaNs */
	};
	const size_t n = 300;
	const struct st_adam_hparams hp = { .lr = 0.0f, .beta1 = 0.9f, .beta2 = 0.999f,
					    .eps = 1e-8f, .weight_decay = 0.1f,
					    .grad_scale = 1.0f, .step = 3 };
	static const enum st_optim_dtype wdts[] = { ST_OPTIM_BF16, ST_OPTIM_F16, ST_OPTIM_F32 };
	size_t nk;
	const struct st_optim_kernel *const *ks = kernels(&nk);

	(void)state;
	for (size_t wi = 0; wi < 3; wi++) {
		struct tc in, ref, out;

		tc_init(&in, n, 1, ST_OPTIM_F32, 1, wdts[wi]);
		tc_init(&ref, n, 1, ST_OPTIM_F32, 1, wdts[wi]);
		tc_init(&out, n, 1, ST_OPTIM_F32, 1, wdts[wi]);
		tc_fill(&in, 21 + wi);
		for (size_t i = 0; i < ST_ARRAY_LEN(specials); i++)
			((float *)in.p.data)[40 + 3 * i] = st_f32_from_bits(specials[i]);
		for (size_t k = 0; k < nk; k++) {
			struct tc *t = k ? &out : &ref;

			if (!ks[k]->supported())
				continue;
			tc_copy(t, &in);
			struct st_adam_bufs b = tc_bufs(t);
			assert_int_equal(tu_kernel_run(ks[k], &hp, &b, n), 0);
			for (size_t i = 0; i < n; i++) {
				float p0 = ((float *)in.p.data)[i], p1 = ((float *)t->p.data)[i];

				if (isnan(p0))
					assert_true(isnan(p1));
				else
					assert_int_equal(st_f32_bits(p0), st_f32_bits(p1));
				assert_true(((float *)t->m.data)[i] != ((float *)in.m.data)[i] ||
					    ((float *)in.g.data)[i] == 0.0f);
			}
			tc_check_w(t);
			if (k)
				assert_true(tc_same(&out, &ref));
		}
		tc_free(&in);
		tc_free(&ref);
		tc_free(&out);
	}
}

/* A NaN or Inf gradient: the default mode changes nothing at all; the
 * fused mode leaves exactly the bad elements unchanged; both report. */
static void test_nonfinite(void **state)
{
	const size_t n = 1000;
	static const size_t bad_at[] = { 0, 17, 500, 999 };
	static const uint32_t bad_bits[] = { 0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f800001u };
	static const enum st_optim_path paths[] = { ST_OPTIM_PATH_SCALAR, ST_OPTIM_PATH_AVX2,
						    ST_OPTIM_PATH_AVX512 };
	const struct st_adam_hparams *hp = &hp_sets[0];

	(void)state;
	for (int gi = 0; gi < 2; gi++) {
		enum st_optim_dtype gdt = gi ? ST_OPTIM_BF16 : ST_OPTIM_F32;

		for (size_t pi = 0; pi < ST_ARRAY_LEN(paths); pi++) {
			struct tc in, out, clean;
			uint64_t cnt = 99;

			if (!st_optim_path_supported(paths[pi]))
				continue;
			assert_int_equal(st_optim_path_set(paths[pi]), 0);
			tc_init(&in, n, 2, gdt, 1, ST_OPTIM_BF16);
			tc_init(&out, n, 2, gdt, 1, ST_OPTIM_BF16);
			tc_init(&clean, n, 2, gdt, 1, ST_OPTIM_BF16);
			tc_fill(&in, 31);
			tc_copy(&clean, &in);
			for (size_t j = 0; j < ST_ARRAY_LEN(bad_at); j++) {
				if (gdt == ST_OPTIM_BF16)
					((uint16_t *)in.g.data)[bad_at[j]] = (uint16_t)(bad_bits[j] >> 16);
				else
					((float *)in.g.data)[bad_at[j]] = st_f32_from_bits(bad_bits[j]);
				if (gdt == ST_OPTIM_BF16)
					((uint16_t *)clean.g.data)[bad_at[j]] = 0;
				else
					((float *)clean.g.data)[bad_at[j]] = 0.0f;
			}
			/* default: nothing written */
			tc_copy(&out, &in);
			struct st_adam_bufs b = tc_bufs(&out);
			assert_int_equal(st_adam_update(hp, &b, n, 0, &cnt), -ERANGE);
			assert_int_equal(cnt, ST_ARRAY_LEN(bad_at));
			assert_true(tc_same(&out, &in));

			/* fused: bad elements untouched, the others updated */
			b = tc_bufs(&out);
			assert_int_equal(st_adam_update(hp, &b, n, ST_ADAM_GRAD_CHECKED, &cnt), -ERANGE);
			assert_int_equal(cnt, ST_ARRAY_LEN(bad_at));
			b = tc_bufs(&clean);
			assert_int_equal(st_adam_update(hp, &b, n, 0, &cnt), 0);
			assert_int_equal(cnt, 0);
			for (size_t i = 0, j = 0; i < n; i++) {
				const struct tc *want = &clean;

				if (j < ST_ARRAY_LEN(bad_at) && i == bad_at[j]) {
					want = &in;
					j++;
				}
				assert_int_equal(st_f32_bits(((float *)out.p.data)[i]),
						 st_f32_bits(((float *)want->p.data)[i]));
				assert_int_equal(st_f32_bits(((float *)out.m.data)[i]),
						 st_f32_bits(((float *)want->m.data)[i]));
				assert_int_equal(st_f32_bits(((float *)out.v.data)[i]),
						 st_f32_bits(((float *)want->v.data)[i]));
			}
			tc_check_w(&out);
			tc_free(&in);
			tc_free(&out);
			tc_free(&clean);
		}
	}
	assert_int_equal(st_optim_path_set(ST_OPTIM_PATH_AUTO), 0);
}

/* Non-finite scaled gradients scattered through the vectors (one lane,
 * several lanes, a whole vector, in the tails): every kernel, plain and
 * streaming W, gives the scalar path's bits and count. Bad values: NaNs
 * (quiet, signalling, negative), +-Inf, and finite gradients that the
 * scale makes overflow. */
static void test_nonfinite_paths(void **state)
{
	static const uint32_t bad_bits[] = { 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7f800000u,
					     0xff800000u, 0x7f000000u, 0xfe800000u };
	static const size_t lens[] = { 1, 15, 16, 17, 31, 33, 47, 64, 100, 257, 1000, 1023 };
	static const enum st_optim_dtype wdts[] = { ST_OPTIM_BF16, ST_OPTIM_F16, ST_OPTIM_F32 };
	/* grad_scale 4: 0x7f000000 (1.7e38) and 0xfe800000 overflow when scaled */
	struct st_adam_hparams hp = hp_sets[0];
	size_t nk;
	const struct st_optim_kernel *const *ks = kernels(&nk);
	uint64_t seed = 77;

	(void)state;
	hp.grad_scale = 4.0f;
	for (size_t li = 0; li < ST_ARRAY_LEN(lens); li++) {
		for (int gi = 0; gi < 2; gi++) {
			for (size_t wi = 0; wi < 4; wi++) {
				size_t n = lens[li], off = (li + wi) % 5;
				enum st_optim_dtype gdt = gi ? ST_OPTIM_BF16 : ST_OPTIM_F32;
				int has_w = wi < 3;
				enum st_optim_dtype wdt = has_w ? wdts[wi] : ST_OPTIM_BF16;
				struct tc in, ref, out;
				uint64_t want_bad, bad;

				tc_init(&in, n, off, gdt, has_w, wdt);
				tc_init(&ref, n, off, gdt, has_w, wdt);
				tc_init(&out, n, off, gdt, has_w, wdt);
				tc_fill(&in, seed++);
				for (size_t i = 0; i < n; i++) {
					/* about one element in five, the last one (a tail
					 * lane) and, when n >= 64, all of the second vector */
					uint64_t r = tu_rand_u64(&seed);
					uint32_t bits;

					if (r % 5 != 0 && i != n - 1 && !(i >= 16 && i < 32 && n >= 64))
						continue;
					bits = bad_bits[(r >> 8) % ST_ARRAY_LEN(bad_bits)];
					if (gdt == ST_OPTIM_BF16)
						((uint16_t *)in.g.data)[i] = (uint16_t)(bits >> 16);
					else
						((float *)in.g.data)[i] = st_f32_from_bits(bits);
				}
				tc_copy(&ref, &in);
				struct st_adam_bufs b = tc_bufs(&ref);
				want_bad = tu_kernel_run(&st_optim_kernel_scalar, &hp, &b, n);
				assert_true(want_bad > 0);
				for (size_t k = 1; k < 2 * nk; k++) {
					unsigned kf = k >= nk ? ST_OPTIM_KF_STREAM_W : 0u;

					if (!ks[k % nk]->supported())
						continue;
					tc_copy(&out, &in);
					b = tc_bufs(&out);
					bad = tu_kernel_run_flags(ks[k % nk], &hp, &b, n, kf);
					tc_check_guards(&out);
					if (bad != want_bad || !tc_same(&out, &ref)) {
						print_error("kernel %s (flags %u), non-finite G: %llu bad "
							    "(scalar %llu), n %zu g %d w %d/%d: %s\n",
							    ks[k % nk]->name, kf, (unsigned long long)bad,
							    (unsigned long long)want_bad, n, gdt, has_w,
							    wdt, tc_same(&out, &ref) ? "same bits"
										     : "bits differ");
						fail();
					}
				}
				tc_free(&in);
				tc_free(&ref);
				tc_free(&out);
			}
		}
	}
}

/* A call big enough for st_adam_apply() to stream W (and odd in length,
 * with W off its vector alignment, so every chunk peels a head): the same
 * bits as the scalar path, at 1 and 2 threads, on every path. */
static void test_streaming_call(void **state)
{
	const size_t n = ST_ADAM_STREAM_MIN_BYTES / 30 + 4099;
	static const enum st_optim_path paths[] = { ST_OPTIM_PATH_AVX2, ST_OPTIM_PATH_AVX512 };
	const struct st_adam_hparams *hp = &hp_sets[2];
	struct tc in, ref, out;
	struct st_adam_bufs b;
	uint64_t cnt;

	(void)state;
	assert_true(n * 30 >= ST_ADAM_STREAM_MIN_BYTES);
	tc_init(&in, n, 3, ST_OPTIM_F32, 1, ST_OPTIM_BF16);
	tc_init(&ref, n, 3, ST_OPTIM_F32, 1, ST_OPTIM_BF16);
	tc_init(&out, n, 3, ST_OPTIM_F32, 1, ST_OPTIM_BF16);
	tc_fill(&in, 91);
	((float *)in.g.data)[n / 2] = st_f32_from_bits(0x7fc00000u);
	((float *)in.g.data)[n - 1] = st_f32_from_bits(0xff800000u);
	assert_int_equal(st_optim_path_set(ST_OPTIM_PATH_SCALAR), 0);
	omp_set_num_threads(2);
	tc_copy(&ref, &in);
	b = tc_bufs(&ref);
	assert_int_equal(st_adam_update(hp, &b, n, ST_ADAM_GRAD_CHECKED, &cnt), -ERANGE);
	assert_int_equal(cnt, 2);
	for (size_t pi = 0; pi < ST_ARRAY_LEN(paths); pi++) {
		if (!st_optim_path_supported(paths[pi]))
			continue;
		assert_int_equal(st_optim_path_set(paths[pi]), 0);
		for (int threads = 1; threads <= 2; threads++) {
			omp_set_num_threads(threads);
			tc_copy(&out, &in);
			b = tc_bufs(&out);
			assert_int_equal(st_adam_update(hp, &b, n, ST_ADAM_GRAD_CHECKED, &cnt),
					 -ERANGE);
			assert_int_equal(cnt, 2);
			tc_check_guards(&out);
			assert_true(tc_same(&out, &ref));
		}
	}
	assert_int_equal(st_optim_path_set(ST_OPTIM_PATH_AUTO), 0);
	omp_set_num_threads(2);
	tc_free(&in);
	tc_free(&ref);
	tc_free(&out);
}

/* A finite gradient whose scaled value overflows counts as Inf. */
static void test_scale_overflow(void **state)
{
	const size_t n = 100;
	struct st_adam_hparams hp = hp_sets[0];
	struct tc in, out;
	uint64_t cnt;

	(void)state;
	hp.grad_scale = 1e10f;
	tc_init(&in, n, 0, ST_OPTIM_F32, 1, ST_OPTIM_BF16);
	tc_init(&out, n, 0, ST_OPTIM_F32, 1, ST_OPTIM_BF16);
	tc_fill(&in, 41);
	((float *)in.g.data)[50] = -1e30f;
	tc_copy(&out, &in);
	struct st_adam_bufs b = tc_bufs(&out);
	assert_int_equal(st_adam_update(&hp, &b, n, 0, &cnt), -ERANGE);
	assert_int_equal(cnt, 1);
	assert_true(tc_same(&out, &in));
	assert_int_equal(st_adam_update(&hp, &b, n, ST_ADAM_GRAD_CHECKED, &cnt), -ERANGE);
	assert_int_equal(cnt, 1);
	assert_int_equal(st_f32_bits(((float *)out.p.data)[50]),
			 st_f32_bits(((float *)in.p.data)[50]));
	tc_free(&in);
	tc_free(&out);
}

static void test_invalid(void **state)
{
	struct st_adam_step s;
	struct st_adam_hparams hp;
	float x = 0.0f;
	uint16_t h = 0;
	struct st_adam_bufs b = { .g = &x, .g_dtype = ST_OPTIM_F32, .p = &x, .m = &x, .v = &x,
				  .w = &h, .w_dtype = ST_OPTIM_BF16 };

	(void)state;
	hp = hp_sets[0]; hp.step = 0;
	assert_int_equal(st_adam_prep(&s, &hp), -EINVAL);
	hp = hp_sets[0]; hp.beta1 = 1.0f;
	assert_int_equal(st_adam_prep(&s, &hp), -EINVAL);
	hp = hp_sets[0]; hp.beta2 = -0.1f;
	assert_int_equal(st_adam_prep(&s, &hp), -EINVAL);
	hp = hp_sets[0]; hp.lr = NAN;
	assert_int_equal(st_adam_prep(&s, &hp), -EINVAL);
	hp = hp_sets[0]; hp.eps = -1.0f;
	assert_int_equal(st_adam_prep(&s, &hp), -EINVAL);
	hp = hp_sets[0]; hp.grad_scale = INFINITY;
	assert_int_equal(st_adam_prep(&s, &hp), -EINVAL);
	hp = hp_sets[0]; hp.weight_decay = -0.5f;
	assert_int_equal(st_adam_prep(&s, &hp), -EINVAL);
	assert_int_equal(st_adam_update(&hp_sets[0], &b, 1, 0, NULL), 0);
	b.g_dtype = ST_OPTIM_F16;
	assert_int_equal(st_adam_update(&hp_sets[0], &b, 1, 0, NULL), -EINVAL);
	b.g_dtype = ST_OPTIM_F32;
	b.w_dtype = (enum st_optim_dtype)7;
	assert_int_equal(st_adam_update(&hp_sets[0], &b, 1, 0, NULL), -EINVAL);
	b.w_dtype = ST_OPTIM_BF16;
	b.p = NULL;
	assert_int_equal(st_adam_update(&hp_sets[0], &b, 1, 0, NULL), -EINVAL);
	assert_int_equal(st_adam_update(&hp_sets[0], &b, 0, 0, NULL), 0);
}

static void test_path_api(void **state)
{
	enum st_optim_path p;

	(void)state;
	for (int i = ST_OPTIM_PATH_AUTO; i <= ST_OPTIM_PATH_AVX512; i++) {
		assert_int_equal(st_optim_path_parse(st_optim_path_name((enum st_optim_path)i), &p), 0);
		assert_int_equal(p, i);
		if (st_optim_path_supported((enum st_optim_path)i)) {
			assert_int_equal(st_optim_path_set((enum st_optim_path)i), 0);
			assert_true(st_optim_path_get() != ST_OPTIM_PATH_AUTO);
		} else {
			printf("optim: path %s not supported here\n", st_optim_path_name((enum st_optim_path)i));
			assert_int_equal(st_optim_path_set((enum st_optim_path)i), -ENOTSUP);
		}
	}
	assert_int_equal(st_optim_path_parse("avx9", &p), -EINVAL);
	assert_int_equal(st_optim_path_parse(NULL, &p), -EINVAL);
	assert_int_equal(st_optim_path_set((enum st_optim_path)9), -EINVAL);
	assert_string_equal(st_optim_path_name((enum st_optim_path)9), "?");
	assert_int_equal(st_optim_path_set(ST_OPTIM_PATH_AUTO), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_paths_vs_reference),
		cmocka_unit_test(test_multi_step),
		cmocka_unit_test(test_threads_and_tiles),
		cmocka_unit_test(test_bias_correction_step1),
		cmocka_unit_test(test_lr_zero),
		cmocka_unit_test(test_nonfinite),
		cmocka_unit_test(test_nonfinite_paths),
		cmocka_unit_test(test_streaming_call),
		cmocka_unit_test(test_scale_overflow),
		cmocka_unit_test(test_invalid),
		cmocka_unit_test(test_path_api),
	};

	print_skips();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
