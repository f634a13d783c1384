/* Every op of cuda_ops.h against its cpu kernel (strata/kernels.h),
 * the numerical reference.
 *
 * Each op gets seeded random inputs; outputs a forward (or overwriting
 * backward) writes are poisoned with 0xFF bytes (a NaN) before the GPU run,
 * so an element the kernel forgets fails; gradients that accumulate start
 * from the same random values on both sides, so an op that overwrites
 * instead fails. Every element must be finite, then the relative error
 * ||gpu - cpu|| / ||cpu|| must be within 1e-5 (fp32) or 1e-2 (bf16 matmul
 * operands). The casts are compared bit for bit, specials included.
 *
 * Without a GPU or driver the program prints "no GPU: skipped" and exits 77. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute_internal.h"
#include "compute_cases.h"
#include "strata/compute.h"
#include "cuda_ops.h"
#include "strata/device.h"
#include "strata/kernels.h"

#define TOL_F32 1e-5
#define TOL_BF16 1e-2

static struct st_cuda_ctx *ctx;

/* ---- helpers ------------------------------------------------------------ */

static uint64_t rng_state;

static void rng_seed(uint64_t seed)
{
	rng_state = seed * 0x9e3779b97f4a7c15ull + 1;
}

static uint32_t rng_u32(void)
{
	/* xorshift64*: reproducible everywhere, no libc dependence */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

/* uniform in [-scale, scale) */
static float rng_f32(float scale)
{
	return scale * ((float)(rng_u32() >> 8) / 8388608.0f - 1.0f);
}

static float *host_rand(size_t n, float scale)
{
	float *p = malloc(sizeof(float) * (n ? n : 1));

	assert_non_null(p);
	for (size_t i = 0; i < n; i++)
		p[i] = rng_f32(scale);
	return p;
}

static void check_rc(int rc, const char *what)
{
	if (rc != 0) {
		fprintf(stderr, "FAIL %s: returned %d: %s\n", what, rc, st_error_last());
		fail();
	}
}

/* A device copy of n bytes of host memory. */
static void *dev_from(const void *src, size_t bytes)
{
	void *d = NULL;

	check_rc(st_cuda_alloc(&d, bytes ? bytes : 4), "st_cuda_alloc");
	if (bytes)
		check_rc(st_cuda_h2d(d, src, bytes), "st_cuda_h2d");
	return d;
}

/* Device memory whose every byte is 0xFF (each float a NaN). */
static void *dev_poisoned(size_t bytes)
{
	void *d = NULL;

	check_rc(st_cuda_alloc(&d, bytes ? bytes : 4), "st_cuda_alloc");
	check_rc(st_cuda_memset(d, 0xFF, bytes ? bytes : 4), "st_cuda_memset");
	return d;
}

/* Wait for the op, bring n floats back and hold them to ref: all finite,
 * then ||got - ref|| / ||ref|| <= tol (absolute when ref is all zero). */
static void expect_close(const char *what, const float *dev, const float *ref, size_t n,
			 double tol)
{
	float *got = malloc(sizeof(float) * (n ? n : 1));
	double num = 0.0, den = 0.0, max_abs = 0.0;
	size_t max_at = 0;

	assert_non_null(got);
	check_rc(st_cuda_sync(ctx), what);
	check_rc(st_cuda_d2h(got, dev, sizeof(float) * n), "st_cuda_d2h");
	for (size_t i = 0; i < n; i++) {
		if (!isfinite(got[i])) {
			fprintf(stderr,
				"FAIL %s: element %zu of %zu is %g (ref %g): unwritten or "
				"overflowed\n",
				what, i, n, (double)got[i], (double)ref[i]);
			num = NAN;
			break;
		}
		double d = (double)got[i] - (double)ref[i];
		num += d * d;
		den += (double)ref[i] * (double)ref[i];
		if (fabs(d) > max_abs) {
			max_abs = fabs(d);
			max_at = i;
		}
	}
	if (isnan(num)) {
		free(got);
		fail();
		return;
	}
	double rel = den > 0.0 ? sqrt(num / den) : sqrt(num);
	if (!(rel <= tol)) {
		fprintf(stderr,
			"FAIL %s: relative error %.3g > %.1g over %zu elements (largest "
			"|diff| %.3g at %zu: gpu %.9g cpu %.9g)\n",
			what, rel, tol, n, max_abs, max_at, (double)got[max_at],
			(double)ref[max_at]);
		free(got);
		fail();
	}
	printf("ok   %-40s n=%-9zu rel %.2e\n", what, n, rel);
	free(got);
}

/* ---- casts ---------------------------------------------------------------- */

static float f32_bits(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static void test_f32_to_bf16(void **state)
{
	static const uint32_t specials[] = {
		0x00000000u, 0x80000000u,                           /* +-0 */
		0x7f800000u, 0xff800000u,                           /* +-inf */
		0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, /* NaNs, quiet */
		0x7fbfffffu, 0x7f810000u, 0xffff0000u, 0x7fffffffu, /* and signalling */
		0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu, /* denormals */
		0x00008000u, 0x00018000u, 0x00010000u, 0x0000ffffu,
		0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f817fffu, /* ties, RNE */
		0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu, /* round to inf */
		0x3f800000u, 0xbf800000u, 0x00800000u, 0x80800000u,
	};
	const size_t n_spec = sizeof(specials) / sizeof(specials[0]);
	const size_t n = 100003 + n_spec;
	float *in = malloc(sizeof(float) * n);
	uint16_t *ref = malloc(sizeof(uint16_t) * n), *got = malloc(sizeof(uint16_t) * n);

	ST_UNUSED(state);
	assert_true(in && ref && got);
	rng_seed(11);
	for (size_t i = 0; i < n_spec; i++)
		in[i] = f32_bits(specials[i]);
	for (size_t i = n_spec; i < n; i++) /* any bit pattern, specials too */
		in[i] = f32_bits(rng_u32());
	for (size_t i = 0; i < n; i++)
		ref[i] = st_cpu_bf16_from_f32(in[i]);
	float *d_in = dev_from(in, sizeof(float) * n);
	uint16_t *d_out = dev_poisoned(sizeof(uint16_t) * n);
	check_rc(st_cuda_f32_to_bf16(ctx, d_out, d_in, n), "st_cuda_f32_to_bf16");
	check_rc(st_cuda_sync(ctx), "f32_to_bf16 sync");
	check_rc(st_cuda_d2h(got, d_out, sizeof(uint16_t) * n), "st_cuda_d2h");
	size_t bad = 0;
	for (size_t i = 0; i < n; i++) {
		if (got[i] != ref[i] && bad++ < 8) {
			uint32_t u;
			memcpy(&u, &in[i], sizeof(u));
			fprintf(stderr, "FAIL f32_to_bf16: in 0x%08x -> gpu 0x%04x, cpu 0x%04x\n",
				u, got[i], ref[i]);
		}
	}
	if (bad)
		fprintf(stderr, "FAIL f32_to_bf16: %zu of %zu differ\n", bad, n);
	assert_int_equal(bad, 0);
	printf("ok   %-40s n=%-9zu bit-exact\n", "f32_to_bf16", n);
	st_cuda_free(d_in);
	st_cuda_free(d_out);
	free(in);
	free(ref);
	free(got);
}

static void test_bf16_to_f32(void **state)
{
	const size_t n = 65536 + 7; /* every bf16 value, and an odd tail */
	uint16_t *in = malloc(sizeof(uint16_t) * n);
	float *got = malloc(sizeof(float) * n);

	ST_UNUSED(state);
	assert_true(in && got);
	for (size_t i = 0; i < n; i++)
		in[i] = (uint16_t)(i * 40503u);
	uint16_t *d_in = dev_from(in, sizeof(uint16_t) * n);
	float *d_out = dev_poisoned(sizeof(float) * n);
	check_rc(st_cuda_bf16_to_f32(ctx, d_out, d_in, n), "st_cuda_bf16_to_f32");
	check_rc(st_cuda_sync(ctx), "bf16_to_f32 sync");
	check_rc(st_cuda_d2h(got, d_out, sizeof(float) * n), "st_cuda_d2h");
	size_t bad = 0;
	for (size_t i = 0; i < n; i++) {
		float ref = st_cpu_f32_from_bf16(in[i]);
		if (memcmp(&ref, &got[i], sizeof(float)) != 0 && bad++ < 8) {
			uint32_t ug, ur;
			memcpy(&ug, &got[i], 4);
			memcpy(&ur, &ref, 4);
			fprintf(stderr, "FAIL bf16_to_f32: 0x%04x -> gpu 0x%08x, cpu 0x%08x\n",
				in[i], ug, ur);
		}
	}
	if (bad)
		fprintf(stderr, "FAIL bf16_to_f32: %zu of %zu differ\n", bad, n);
	assert_int_equal(bad, 0);
	printf("ok   %-40s n=%-9zu bit-exact\n", "bf16_to_f32", n);
	st_cuda_free(d_in);
	st_cuda_free(d_out);
	free(in);
	free(got);
}

/* ---- matmul ----------------------------------------------------------------- */

static void matmul_fwd_case(int N, int IC, int OC, int with_bias, enum st_cuda_dtype dt)
{
	char what[96];
	float *inp = host_rand((size_t)N * IC, 1.0f);
	float *w = host_rand((size_t)IC * OC, 0.1f);
	float *bias = host_rand(OC, 0.5f);
	float *ref = malloc(sizeof(float) * N * OC);
	void *d_inp, *d_w;

	assert_non_null(ref);
	if (dt == ST_CUDA_BF16) {
		/* the reference sees the operands the GPU sees: rounded to bf16 */
		uint16_t *hi = malloc(2 * (size_t)N * IC), *hw = malloc(2 * (size_t)IC * OC);
		assert_true(hi && hw);
		for (size_t i = 0; i < (size_t)N * IC; i++) {
			hi[i] = st_cpu_bf16_from_f32(inp[i]);
			inp[i] = st_cpu_f32_from_bf16(hi[i]);
		}
		for (size_t i = 0; i < (size_t)IC * OC; i++) {
			hw[i] = st_cpu_bf16_from_f32(w[i]);
			w[i] = st_cpu_f32_from_bf16(hw[i]);
		}
		d_inp = dev_from(hi, 2 * (size_t)N * IC);
		d_w = dev_from(hw, 2 * (size_t)IC * OC);
		free(hi);
		free(hw);
	} else {
		d_inp = dev_from(inp, sizeof(float) * N * IC);
		d_w = dev_from(w, sizeof(float) * IC * OC);
	}
	st_cpu_matmul_fwd(ref, inp, w, with_bias ? bias : NULL, N, IC, OC);
	float *d_bias = dev_from(bias, sizeof(float) * OC);
	float *d_out = dev_poisoned(sizeof(float) * N * OC);
	snprintf(what, sizeof(what), "matmul_fwd %s N=%d IC=%d OC=%d%s",
		 dt == ST_CUDA_BF16 ? "bf16" : "f32", N, IC, OC, with_bias ? " +b" : "");
	check_rc(st_cuda_matmul_fwd(ctx, d_out, d_inp, d_w, with_bias ? d_bias : NULL, N, IC,
				    OC, dt),
		 what);
	expect_close(what, d_out, ref, (size_t)N * OC, dt == ST_CUDA_BF16 ? TOL_BF16 : TOL_F32);
	st_cuda_free(d_inp);
	st_cuda_free(d_w);
	st_cuda_free(d_bias);
	st_cuda_free(d_out);
	free(inp);
	free(w);
	free(bias);
	free(ref);
}

static void test_matmul_fwd(void **state)
{
	ST_UNUSED(state);
	rng_seed(21);
	matmul_fwd_case(37, 96, 253, 1, ST_CUDA_F32);
	matmul_fwd_case(37, 96, 253, 0, ST_CUDA_F32);
	matmul_fwd_case(1, 3, 5, 1, ST_CUDA_F32);
	matmul_fwd_case(37, 96, 253, 1, ST_CUDA_BF16);
	matmul_fwd_case(512, 768, 2304, 1, ST_CUDA_F32); /* GPT-2 qkv */
	matmul_fwd_case(512, 768, 2304, 1, ST_CUDA_BF16);
}

/* The GELU epilogue against the cpu's matmul then gelu: out, and pre when
 * asked for (both poisoned first). OC not a multiple of 8 with pre takes
 * the unfused path. */
static void matmul_gelu_case(int N, int IC, int OC, int with_bias, int with_pre)
{
	char what[96];
	size_t n_out = (size_t)N * OC;
	float *inp = host_rand((size_t)N * IC, 1.0f);
	float *w = host_rand((size_t)IC * OC, 0.1f);
	float *bias = host_rand(OC, 0.5f);
	float *pre = malloc(sizeof(float) * n_out), *out = malloc(sizeof(float) * n_out);

	assert_true(pre && out);
	st_cpu_matmul_fwd(pre, inp, w, with_bias ? bias : NULL, N, IC, OC);
	st_cpu_gelu_fwd(out, pre, n_out);
	float *d_inp = dev_from(inp, sizeof(float) * N * IC);
	float *d_w = dev_from(w, sizeof(float) * IC * OC);
	float *d_bias = dev_from(bias, sizeof(float) * OC);
	float *d_out = dev_poisoned(sizeof(float) * n_out);
	float *d_pre = dev_poisoned(sizeof(float) * n_out);
	uint64_t fused0, unfused0, fused1, unfused1;
	snprintf(what, sizeof(what), "matmul_gelu_fwd N=%d IC=%d OC=%d%s%s", N, IC, OC,
		 with_bias ? " +b" : "", with_pre ? " +pre" : "");
	st_cuda_ctx_gelu_counts(ctx, &fused0, &unfused0);
	check_rc(st_cuda_matmul_gelu_fwd(ctx, d_out, with_pre ? d_pre : NULL, d_inp, d_w,
					 with_bias ? d_bias : NULL, N, IC, OC),
		 what);
	st_cuda_ctx_gelu_counts(ctx, &fused1, &unfused1);
	assert_int_equal(fused1 + unfused1, fused0 + unfused0 + 1);
	/* which path ran goes to the log: cuBLASLt decides what it offers */
	printf("note %s: %s%s\n", what,
	       fused1 > fused0 ? "cuBLASLt GELU epilogue" : "matmul, then the gelu kernel; last error: ",
	       fused1 > fused0 ? "" : st_error_last());
	expect_close(what, d_out, out, n_out, TOL_F32);
	if (with_pre) {
		snprintf(what, sizeof(what), "matmul_gelu_fwd N=%d IC=%d OC=%d pre", N, IC, OC);
		expect_close(what, d_pre, pre, n_out, TOL_F32);
	}
	st_cuda_free(d_inp);
	st_cuda_free(d_w);
	st_cuda_free(d_bias);
	st_cuda_free(d_out);
	st_cuda_free(d_pre);
	free(inp);
	free(w);
	free(bias);
	free(pre);
	free(out);
}

static void test_matmul_gelu_fwd(void **state)
{
	ST_UNUSED(state);
	rng_seed(23);
	matmul_gelu_case(37, 96, 384, 1, 1);
	matmul_gelu_case(37, 96, 384, 1, 0);
	matmul_gelu_case(37, 96, 384, 0, 1);
	matmul_gelu_case(37, 96, 253, 1, 1); /* aux ld not a multiple of 8 */
	matmul_gelu_case(512, 768, 3072, 1, 1); /* GPT-2 fc */
}

/* which: bit 0 dinp, bit 1 dweight, bit 2 dbias */
static void matmul_bwd_case(int N, int IC, int OC, int which)
{
	char what[96];
	float *dout = host_rand((size_t)N * OC, 1.0f);
	float *inp = host_rand((size_t)N * IC, 1.0f);
	float *w = host_rand((size_t)IC * OC, 0.1f);
	float *dinp = host_rand((size_t)N * IC, 1.0f);
	float *dw = host_rand((size_t)IC * OC, 1.0f);
	float *db = host_rand(OC, 1.0f);
	float *d_dout = dev_from(dout, sizeof(float) * N * OC);
	float *d_inp = dev_from(inp, sizeof(float) * N * IC);
	float *d_w = dev_from(w, sizeof(float) * IC * OC);
	float *d_dinp = dev_from(dinp, sizeof(float) * N * IC);
	float *d_dw = dev_from(dw, sizeof(float) * IC * OC);
	float *d_db = dev_from(db, sizeof(float) * OC);

	st_cpu_matmul_bwd(which & 1 ? dinp : NULL, which & 2 ? dw : NULL, which & 4 ? db : NULL,
			  dout, inp, w, N, IC, OC);
	snprintf(what, sizeof(what), "matmul_bwd N=%d IC=%d OC=%d", N, IC, OC);
	check_rc(st_cuda_matmul_bwd(ctx, which & 1 ? d_dinp : NULL, which & 2 ? d_dw : NULL,
				    which & 4 ? d_db : NULL, d_dout, d_inp, d_w, N, IC, OC),
		 what);
	/* a gradient not asked for must be left alone: compare it too */
	snprintf(what, sizeof(what), "matmul_bwd dinp N=%d IC=%d OC=%d%s", N, IC, OC,
		 which & 1 ? "" : " (NULL)");
	expect_close(what, d_dinp, dinp, (size_t)N * IC, TOL_F32);
	snprintf(what, sizeof(what), "matmul_bwd dweight N=%d IC=%d OC=%d%s", N, IC, OC,
		 which & 2 ? "" : " (NULL)");
	expect_close(what, d_dw, dw, (size_t)IC * OC, TOL_F32);
	snprintf(what, sizeof(what), "matmul_bwd dbias N=%d IC=%d OC=%d%s", N, IC, OC,
		 which & 4 ? "" : " (NULL)");
	expect_close(what, d_db, db, OC, TOL_F32);
	st_cuda_free(d_dout);
	st_cuda_free(d_inp);
	st_cuda_free(d_w);
	st_cuda_free(d_dinp);
	st_cuda_free(d_dw);
	st_cuda_free(d_db);
	free(dout);
	free(inp);
	free(w);
	free(dinp);
	free(dw);
	free(db);
}

static void test_matmul_bwd(void **state)
{
	ST_UNUSED(state);
	rng_seed(22);
	matmul_bwd_case(37, 96, 253, 7);
	matmul_bwd_case(37, 96, 253, 1);
	matmul_bwd_case(37, 96, 253, 6);
	matmul_bwd_case(512, 768, 2304, 7);
}

/* ---- gemm (the head's tied matmuls) ---------------------------------------------- */

/* Row-major C (M,N) = op(A) @ op(B) + beta * C with leading dimensions pad
 * wider than the rows (the columns past them must stay untouched). */
static void gemm_case(int ta, int tb, int M, int N, int K, float beta, int pad)
{
	char what[96];
	int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
	size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb;
	size_t nc = (size_t)M * ldc;
	float *a = host_rand(na, 1.0f), *b = host_rand(nb, 0.1f), *c = host_rand(nc, 1.0f);
	float *d_a = dev_from(a, sizeof(float) * na), *d_b = dev_from(b, sizeof(float) * nb);
	float *d_c = dev_from(c, sizeof(float) * nc);

	st_cpu_sgemm(ta, tb, M, N, K, 1.0f, a, lda, b, ldb, beta, c, ldc);
	snprintf(what, sizeof(what), "gemm %c%c M=%d N=%d K=%d beta %g pad %d", ta ? 'T' : 'N',
		 tb ? 'T' : 'N', M, N, K, (double)beta, pad);
	check_rc(st_cuda_gemm(ctx, ta, tb, M, N, K, d_a, lda, d_b, ldb, beta, d_c, ldc), what);
	expect_close(what, d_c, c, nc, TOL_F32);
	st_cuda_free(d_a);
	st_cuda_free(d_b);
	st_cuda_free(d_c);
	free(a);
	free(b);
	free(c);
}

static void test_gemm(void **state)
{
	ST_UNUSED(state);
	rng_seed(23);
	for (int ta = 0; ta < 2; ta++)
		for (int tb = 0; tb < 2; tb++) {
			gemm_case(ta, tb, 37, 253, 96, 0.0f, 0);
			gemm_case(ta, tb, 37, 253, 96, 1.0f, 3);
		}
	gemm_case(0, 0, 5, 7, 0, 1.0f, 2); /* K = 0: C = beta * C */
	gemm_case(0, 0, 5, 7, 0, 0.0f, 2);
	/* GPT-2's head, one chunk of 256 rows: logits = x @ wte^T, then
	 * dx += dlogits @ wte, dwte += dlogits^T @ x (V = 50257, odd ld). */
	gemm_case(0, 1, 256, 50257, 768, 0.0f, 0);
	gemm_case(0, 0, 256, 768, 50257, 1.0f, 0);
	gemm_case(1, 0, 50257, 768, 256, 1.0f, 0);
}

/* The context's own memset and copies, ordered with its ops. */
static void test_memory_on_stream(void **state)
{
	const size_t n = 100003;
	float *h = host_rand(n, 1.0f), *back = malloc(sizeof(float) * n);
	float *d1 = dev_poisoned(sizeof(float) * n), *d2 = dev_poisoned(sizeof(float) * n);
	float *zeros = calloc(n, sizeof(float));

	ST_UNUSED(state);
	assert_non_null(back);
	assert_non_null(zeros);
	check_rc(st_cuda_memcpy_async(ctx, d1, h, sizeof(float) * n), "memcpy_async h2d");
	check_rc(st_cuda_memcpy_async(ctx, d2, d1, sizeof(float) * n), "memcpy_async d2d");
	check_rc(st_cuda_memcpy_async(ctx, back, d2, sizeof(float) * n), "memcpy_async d2h");
	check_rc(st_cuda_sync(ctx), "sync");
	assert_memory_equal(back, h, sizeof(float) * n);
	check_rc(st_cuda_memset_async(ctx, d2, 0, sizeof(float) * n), "memset_async");
	expect_close("memset_async 0", d2, zeros, n, 0.0);
	st_cuda_free(d1);
	st_cuda_free(d2);
	free(h);
	free(back);
	free(zeros);
}

/* ---- layernorm ---------------------------------------------------------------- */

static void layernorm_case(int N, int C)
{
	char what[96];
	size_t nc = (size_t)N * C;
	float *inp = host_rand(nc, 2.0f), *w = host_rand(C, 1.0f), *b = host_rand(C, 1.0f);
	float *out = malloc(sizeof(float) * nc), *mean = malloc(sizeof(float) * N);
	float *rstd = malloc(sizeof(float) * N);
	float *dout = host_rand(nc, 1.0f), *dinp = host_rand(nc, 1.0f);
	float *dw = host_rand(C, 1.0f), *db = host_rand(C, 1.0f);

	assert_true(out && mean && rstd);
	for (size_t i = 0; i < nc; i++) /* an offset, as real activations have */
		inp[i] += 3.0f;
	float *d_inp = dev_from(inp, sizeof(float) * nc);
	float *d_w = dev_from(w, sizeof(float) * C), *d_b = dev_from(b, sizeof(float) * C);
	float *d_out = dev_poisoned(sizeof(float) * nc);
	float *d_mean = dev_poisoned(sizeof(float) * N), *d_rstd = dev_poisoned(sizeof(float) * N);
	st_cpu_layernorm_fwd(out, mean, rstd, inp, w, b, N, C);
	snprintf(what, sizeof(what), "layernorm_fwd N=%d C=%d", N, C);
	check_rc(st_cuda_layernorm_fwd(ctx, d_out, d_mean, d_rstd, d_inp, d_w, d_b, N, C), what);
	expect_close(what, d_out, out, nc, TOL_F32);
	snprintf(what, sizeof(what), "layernorm_fwd mean N=%d C=%d", N, C);
	expect_close(what, d_mean, mean, N, TOL_F32);
	snprintf(what, sizeof(what), "layernorm_fwd rstd N=%d C=%d", N, C);
	expect_close(what, d_rstd, rstd, N, TOL_F32);

	/* backward from the cpu's mean/rstd so only the backward is measured */
	float *d_mean_ref = dev_from(mean, sizeof(float) * N);
	float *d_rstd_ref = dev_from(rstd, sizeof(float) * N);
	float *d_dout = dev_from(dout, sizeof(float) * nc), *d_dinp = dev_from(dinp, sizeof(float) * nc);
	float *d_dw = dev_from(dw, sizeof(float) * C), *d_db = dev_from(db, sizeof(float) * C);
	st_cpu_layernorm_bwd(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
	snprintf(what, sizeof(what), "layernorm_bwd N=%d C=%d", N, C);
	check_rc(st_cuda_layernorm_bwd(ctx, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean_ref,
				       d_rstd_ref, N, C),
		 what);
	snprintf(what, sizeof(what), "layernorm_bwd dinp N=%d C=%d", N, C);
	expect_close(what, d_dinp, dinp, nc, TOL_F32);
	snprintf(what, sizeof(what), "layernorm_bwd dweight N=%d C=%d", N, C);
	expect_close(what, d_dw, dw, C, TOL_F32);
	snprintf(what, sizeof(what), "layernorm_bwd dbias N=%d C=%d", N, C);
	expect_close(what, d_db, db, C, TOL_F32);

	void *devs[] = { d_inp, d_w, d_b, d_out, d_mean, d_rstd, d_mean_ref, d_rstd_ref,
			 d_dout, d_dinp, d_dw, d_db };
	for (size_t i = 0; i < sizeof(devs) / sizeof(devs[0]); i++)
		st_cuda_free(devs[i]);
	void *hosts[] = { inp, w, b, out, mean, rstd, dout, dinp, dw, db };
	for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++)
		free(hosts[i]);
}

static void test_layernorm(void **state)
{
	ST_UNUSED(state);
	rng_seed(31);
	layernorm_case(37, 96);
	layernorm_case(5, 1);
	layernorm_case(3, 1001);
	layernorm_case(512, 768);
}

/* ---- elementwise: gelu, residual ---------------------------------------------- */

static void test_gelu(void **state)
{
	ST_UNUSED(state);
	rng_seed(41);
	const size_t sizes[] = { 1, 37 * 96 + 5, 512 * 3072 };
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		size_t n = sizes[s];
		char what[96];
		float *inp = host_rand(n, 6.0f), *dout = host_rand(n, 1.0f);
		float *out = malloc(sizeof(float) * n), *dinp = malloc(sizeof(float) * n);
		assert_true(out && dinp);
		float *d_inp = dev_from(inp, sizeof(float) * n), *d_dout = dev_from(dout, sizeof(float) * n);
		float *d_out = dev_poisoned(sizeof(float) * n);
		st_cpu_gelu_fwd(out, inp, n);
		snprintf(what, sizeof(what), "gelu_fwd n=%zu", n);
		check_rc(st_cuda_gelu_fwd(ctx, d_out, d_inp, n), what);
		expect_close(what, d_out, out, n, TOL_F32);
		/* gelu_bwd overwrites: poisoned again */
		check_rc(st_cuda_memset(d_out, 0xFF, sizeof(float) * n), "st_cuda_memset");
		st_cpu_gelu_bwd(dinp, inp, dout, n);
		snprintf(what, sizeof(what), "gelu_bwd n=%zu", n);
		check_rc(st_cuda_gelu_bwd(ctx, d_out, d_inp, d_dout, n), what);
		expect_close(what, d_out, dinp, n, TOL_F32);
		st_cuda_free(d_inp);
		st_cuda_free(d_dout);
		st_cuda_free(d_out);
		free(inp);
		free(dout);
		free(out);
		free(dinp);
	}
}

static void test_residual(void **state)
{
	ST_UNUSED(state);
	rng_seed(51);
	const size_t sizes[] = { 1, 37 * 96 + 5, 512 * 768 };
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		size_t n = sizes[s], bytes = sizeof(float) * n;
		char what[96];
		float *a = host_rand(n, 1.0f), *b = host_rand(n, 1.0f), *dout = host_rand(n, 1.0f);
		float *da = host_rand(n, 1.0f), *db = host_rand(n, 1.0f);
		float *out = malloc(bytes);
		assert_non_null(out);
		float *d_a = dev_from(a, bytes), *d_b = dev_from(b, bytes), *d_out = dev_poisoned(bytes);
		float *d_dout = dev_from(dout, bytes), *d_da = dev_from(da, bytes);
		float *d_db = dev_from(db, bytes);
		st_cpu_residual_fwd(out, a, b, n);
		snprintf(what, sizeof(what), "residual_fwd n=%zu", n);
		check_rc(st_cuda_residual_fwd(ctx, d_out, d_a, d_b, n), what);
		expect_close(what, d_out, out, n, TOL_F32);
		st_cpu_residual_bwd(da, db, dout, n);
		snprintf(what, sizeof(what), "residual_bwd n=%zu", n);
		check_rc(st_cuda_residual_bwd(ctx, d_da, d_db, d_dout, n), what);
		snprintf(what, sizeof(what), "residual_bwd da n=%zu", n);
		expect_close(what, d_da, da, n, TOL_F32);
		snprintf(what, sizeof(what), "residual_bwd db n=%zu", n);
		expect_close(what, d_db, db, n, TOL_F32);
		void *devs[] = { d_a, d_b, d_out, d_dout, d_da, d_db };
		for (size_t i = 0; i < 6; i++)
			st_cuda_free(devs[i]);
		void *hosts[] = { a, b, dout, da, db, out };
		for (size_t i = 0; i < 6; i++)
			free(hosts[i]);
	}
}

/* ---- embedding ------------------------------------------------------------------ */

static void embedding_case(int B, int T, int C, int V)
{
	char what[96];
	size_t btc = (size_t)B * T * C;
	int32_t *tok = malloc(sizeof(int32_t) * B * T);
	float *wte = host_rand((size_t)V * C, 1.0f), *wpe = host_rand((size_t)T * C, 1.0f);
	float *out = malloc(sizeof(float) * btc), *dout = host_rand(btc, 1.0f);
	float *dwte = host_rand((size_t)V * C, 1.0f), *dwpe = host_rand((size_t)T * C, 1.0f);

	assert_true(tok && out);
	for (int i = 0; i < B * T; i++) /* repeats on purpose: the scatter adds */
		tok[i] = (int32_t)(rng_u32() % (uint32_t)(i % 3 == 0 ? 7 : V));
	int32_t *d_tok = dev_from(tok, sizeof(int32_t) * B * T);
	float *d_wte = dev_from(wte, sizeof(float) * V * C), *d_wpe = dev_from(wpe, sizeof(float) * T * C);
	float *d_out = dev_poisoned(sizeof(float) * btc), *d_dout = dev_from(dout, sizeof(float) * btc);
	float *d_dwte = dev_from(dwte, sizeof(float) * V * C);
	float *d_dwpe = dev_from(dwpe, sizeof(float) * T * C);
	st_cpu_embedding_fwd(out, tok, wte, wpe, B, T, C);
	snprintf(what, sizeof(what), "embedding_fwd B=%d T=%d C=%d V=%d", B, T, C, V);
	check_rc(st_cuda_embedding_fwd(ctx, d_out, d_tok, d_wte, d_wpe, B, T, C), what);
	expect_close(what, d_out, out, btc, TOL_F32);
	st_cpu_embedding_bwd(dwte, dwpe, dout, tok, B, T, C);
	snprintf(what, sizeof(what), "embedding_bwd B=%d T=%d C=%d V=%d", B, T, C, V);
	check_rc(st_cuda_embedding_bwd(ctx, d_dwte, d_dwpe, d_dout, d_tok, B, T, C), what);
	snprintf(what, sizeof(what), "embedding_bwd dwte B=%d T=%d C=%d", B, T, C);
	expect_close(what, d_dwte, dwte, (size_t)V * C, TOL_F32);
	snprintf(what, sizeof(what), "embedding_bwd dwpe B=%d T=%d C=%d", B, T, C);
	expect_close(what, d_dwpe, dwpe, (size_t)T * C, TOL_F32);
	void *devs[] = { d_tok, d_wte, d_wpe, d_out, d_dout, d_dwte, d_dwpe };
	for (size_t i = 0; i < 7; i++)
		st_cuda_free(devs[i]);
	void *hosts[] = { tok, wte, wpe, out, dout, dwte, dwpe };
	for (size_t i = 0; i < 7; i++)
		free(hosts[i]);
}

/* The fused residual + norm kernels against the cuda pair they replace,
 * bit for bit (same row code, so nvcc's rounding choices are the same):
 * at GPT-2's shape (512 x 768) and an odd one; the cpu comparison of the
 * fused ops is the seam rows'. */
static void test_residual_norm(void **state)
{
	ST_UNUSED(state);
	rng_seed(57);
	const int shapes[][2] = { { 37, 96 }, { 512, 768 } };
	for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
		int N = shapes[s][0], C = shapes[s][1];
		size_t n = (size_t)N * C, bytes = sizeof(float) * n;
		float *a = host_rand(n, 2.0f), *b = host_rand(n, 2.0f), *w = host_rand((size_t)C, 1.0f);
		float *bias = host_rand((size_t)C, 0.5f);
		float *d_a = dev_from(a, bytes), *d_b = dev_from(b, bytes);
		float *d_w = dev_from(w, sizeof(float) * C), *d_bias = dev_from(bias, sizeof(float) * C);
		for (int rms = 0; rms < 2; rms++) {
			float *r[2], *o[2], *m[2], *sd[2];
			for (int k = 0; k < 2; k++) {
				r[k] = dev_poisoned(bytes);
				o[k] = dev_poisoned(bytes);
				m[k] = dev_poisoned(sizeof(float) * N);
				sd[k] = dev_poisoned(sizeof(float) * N);
			}
			check_rc(st_cuda_residual_fwd(ctx, r[0], d_a, d_b, n), "residual_fwd");
			if (rms) {
				check_rc(st_cuda_rmsnorm_fwd(ctx, o[0], sd[0], r[0], d_w, 1e-5f, N, C),
					 "rmsnorm_fwd");
				check_rc(st_cuda_residual_rmsnorm_fwd(ctx, r[1], o[1], sd[1], d_a, d_b, d_w,
								      1e-5f, N, C),
					 "residual_rmsnorm_fwd");
			} else {
				check_rc(st_cuda_layernorm_fwd(ctx, o[0], m[0], sd[0], r[0], d_w, d_bias, N,
							       C), "layernorm_fwd");
				check_rc(st_cuda_residual_layernorm_fwd(ctx, r[1], o[1], m[1], sd[1], d_a,
									d_b, d_w, d_bias, N, C),
					 "residual_layernorm_fwd");
			}
			check_rc(st_cuda_sync(ctx), "sync");
			float *const pairs[][2] = { { r[0], r[1] }, { o[0], o[1] }, { sd[0], sd[1] },
						    { m[0], m[1] } };
			const size_t lens[] = { n, n, (size_t)N, (size_t)N };
			for (int q = 0; q < (rms ? 3 : 4); q++) {
				size_t nb = sizeof(float) * lens[q];
				float *x = malloc(nb), *y = malloc(nb);
				assert_true(x && y);
				check_rc(st_cuda_d2h(x, pairs[q][0], nb), "st_cuda_d2h");
				check_rc(st_cuda_d2h(y, pairs[q][1], nb), "st_cuda_d2h");
				if (memcmp(x, y, nb)) {
					fprintf(stderr, "FAIL residual_%s_fwd (%d,%d) output %d: not the "
						"unfused pair's bits\n", rms ? "rmsnorm" : "layernorm", N, C, q);
					fail();
				}
				free(x);
				free(y);
			}
			printf("ok   residual_%s_fwd (%d,%d) = residual_fwd + %s_fwd bit for bit\n",
			       rms ? "rmsnorm" : "layernorm", N, C, rms ? "rmsnorm" : "layernorm");
			for (int k = 0; k < 2; k++) {
				st_cuda_free(r[k]);
				st_cuda_free(o[k]);
				st_cuda_free(m[k]);
				st_cuda_free(sd[k]);
			}
		}
		st_cuda_free(d_a);
		st_cuda_free(d_b);
		st_cuda_free(d_w);
		st_cuda_free(d_bias);
		free(a);
		free(b);
		free(w);
		free(bias);
	}
}

static void test_embedding(void **state)
{
	ST_UNUSED(state);
	rng_seed(61);
	embedding_case(3, 37, 96, 253);
	embedding_case(2, 256, 768, 50257);
}

/* ---- attention ---------------------------------------------------------------------- */

static void attention_case(int B, int T, int C, int NH)
{
	char what[96];
	size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C;
	size_t n_lse = (size_t)B * NH * T;
	float *qkv = host_rand(n_qkv, 2.0f), *out = malloc(sizeof(float) * n_out);
	float *lse = malloc(sizeof(float) * n_lse), *dout = host_rand(n_out, 1.0f);
	float *dqkv = host_rand(n_qkv, 1.0f);

	assert_true(out && lse);
	float *d_qkv = dev_from(qkv, sizeof(float) * n_qkv);
	float *d_out = dev_poisoned(sizeof(float) * n_out);
	float *d_lse = dev_poisoned(sizeof(float) * n_lse);
	st_cpu_attention_fwd(out, lse, qkv, B, T, C, NH);
	snprintf(what, sizeof(what), "attention_fwd B=%d T=%d C=%d NH=%d", B, T, C, NH);
	check_rc(st_cuda_attention_fwd(ctx, d_out, d_lse, d_qkv, B, T, C, NH), what);
	expect_close(what, d_out, out, n_out, TOL_F32);
	snprintf(what, sizeof(what), "attention_fwd lse B=%d T=%d C=%d NH=%d", B, T, C, NH);
	expect_close(what, d_lse, lse, n_lse, TOL_F32);

	/* backward from the cpu's out and lse so only the backward is measured */
	float *d_out_ref = dev_from(out, sizeof(float) * n_out);
	float *d_lse_ref = dev_from(lse, sizeof(float) * n_lse);
	float *d_dout = dev_from(dout, sizeof(float) * n_out);
	float *d_dqkv = dev_from(dqkv, sizeof(float) * n_qkv);
	st_cpu_attention_bwd(dqkv, dout, qkv, out, lse, B, T, C, NH);
	snprintf(what, sizeof(what), "attention_bwd B=%d T=%d C=%d NH=%d", B, T, C, NH);
	check_rc(st_cuda_attention_bwd(ctx, d_dqkv, d_dout, d_qkv, d_out_ref, d_lse_ref, B, T, C,
				       NH),
		 what);
	expect_close(what, d_dqkv, dqkv, n_qkv, TOL_F32);

	/* deterministic: the same call on the same inputs gives the same bits */
	float *d_dqkv2 = dev_from(qkv, sizeof(float) * n_qkv);
	float *d_dqkv3 = dev_from(qkv, sizeof(float) * n_qkv);
	float *h2 = malloc(sizeof(float) * n_qkv), *h3 = malloc(sizeof(float) * n_qkv);
	assert_true(h2 && h3);
	check_rc(st_cuda_attention_bwd(ctx, d_dqkv2, d_dout, d_qkv, d_out_ref, d_lse_ref, B, T,
				       C, NH),
		 what);
	check_rc(st_cuda_attention_bwd(ctx, d_dqkv3, d_dout, d_qkv, d_out_ref, d_lse_ref, B, T,
				       C, NH),
		 what);
	check_rc(st_cuda_sync(ctx), what);
	check_rc(st_cuda_d2h(h2, d_dqkv2, sizeof(float) * n_qkv), "st_cuda_d2h");
	check_rc(st_cuda_d2h(h3, d_dqkv3, sizeof(float) * n_qkv), "st_cuda_d2h");
	if (memcmp(h2, h3, sizeof(float) * n_qkv) != 0) {
		fprintf(stderr, "FAIL %s: two runs differ (not deterministic)\n", what);
		fail();
	}
	void *devs[] = { d_qkv, d_out, d_lse, d_out_ref, d_lse_ref, d_dout, d_dqkv, d_dqkv2, d_dqkv3 };
	for (size_t i = 0; i < sizeof(devs) / sizeof(devs[0]); i++)
		st_cuda_free(devs[i]);
	void *hosts[] = { qkv, out, lse, dout, dqkv, h2, h3 };
	for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++)
		free(hosts[i]);
}

static void test_attention(void **state)
{
	ST_UNUSED(state);
	rng_seed(71);
	attention_case(2, 37, 96, 4);   /* hs 24, a partial tile */
	attention_case(1, 1, 8, 2);     /* one token */
	attention_case(3, 70, 256, 2);  /* hs 128, the largest supported */
	attention_case(1, 100, 60, 3);  /* hs 20 */
	attention_case(2, 256, 768, 12); /* a GPT-2 block */
}

static void test_attention_refuses(void **state)
{
	ST_UNUSED(state);
	/* shapes the kernels cannot take are refused, not run */
	assert_int_equal(st_cuda_attention_fwd(ctx, NULL, NULL, NULL, 1, 4, 10, 3), -EINVAL);
	assert_int_equal(st_cuda_attention_fwd(ctx, NULL, NULL, NULL, 1, 4, 512, 2), -EINVAL);
	assert_int_equal(st_cuda_attention_bwd(ctx, NULL, NULL, NULL, NULL, NULL, 1, 4, 512, 2),
			 -EINVAL);
	assert_non_null(strstr(st_error_last(), "head size"));
}

/* ---- cross-entropy ------------------------------------------------------------------- */

static void crossentropy_case(int N, int V)
{
	char what[96];
	size_t nv = (size_t)N * V;
	float *logits = host_rand(nv, 8.0f), *losses = malloc(sizeof(float) * N);
	float *dlogits = malloc(sizeof(float) * nv), *losses2 = malloc(sizeof(float) * N);
	int32_t *tgt = malloc(sizeof(int32_t) * N);
	const float dloss = 1.0f / (float)N;

	assert_true(losses && dlogits && losses2 && tgt);
	for (int i = 0; i < N; i++)
		tgt[i] = (int32_t)(rng_u32() % (uint32_t)V);
	float *d_logits = dev_from(logits, sizeof(float) * nv);
	int32_t *d_tgt = dev_from(tgt, sizeof(int32_t) * N);
	float *d_losses = dev_poisoned(sizeof(float) * N);
	float *d_dlogits = dev_poisoned(sizeof(float) * nv);
	st_cpu_crossentropy_fwd(losses, logits, tgt, N, V);
	snprintf(what, sizeof(what), "crossentropy_fwd N=%d V=%d", N, V);
	check_rc(st_cuda_crossentropy_fwd(ctx, d_losses, d_logits, d_tgt, N, V), what);
	expect_close(what, d_losses, losses, N, TOL_F32);

	check_rc(st_cuda_memset(d_losses, 0xFF, sizeof(float) * N), "st_cuda_memset");
	st_cpu_crossentropy_bwd(dlogits, losses2, logits, tgt, dloss, N, V);
	snprintf(what, sizeof(what), "crossentropy_bwd N=%d V=%d", N, V);
	check_rc(st_cuda_crossentropy_bwd(ctx, d_dlogits, d_losses, d_logits, d_tgt, dloss, N, V),
		 what);
	expect_close(what, d_dlogits, dlogits, nv, TOL_F32);
	snprintf(what, sizeof(what), "crossentropy_bwd losses N=%d V=%d", N, V);
	expect_close(what, d_losses, losses2, N, TOL_F32);

	/* in place (dlogits == logits), without losses */
	check_rc(st_cuda_crossentropy_bwd(ctx, d_logits, NULL, d_logits, d_tgt, dloss, N, V),
		 what);
	snprintf(what, sizeof(what), "crossentropy_bwd in place N=%d V=%d", N, V);
	expect_close(what, d_logits, dlogits, nv, TOL_F32);

	st_cuda_free(d_logits);
	st_cuda_free(d_tgt);
	st_cuda_free(d_losses);
	st_cuda_free(d_dlogits);
	free(logits);
	free(losses);
	free(dlogits);
	free(losses2);
	free(tgt);
}

static void test_crossentropy(void **state)
{
	ST_UNUSED(state);
	rng_seed(81);
	crossentropy_case(37, 253);
	crossentropy_case(1, 1);
	crossentropy_case(64, 50257);
}


/* ---- the context's stream against the cuda device's queues ----------------- */

/* Both ways through events (st_cuda_ctx_wait, st_cuda_ctx_record), with
 * copies long enough (256 MiB) that a missing wait reads the old bytes:
 *   queue -> context: an H2D into A on a device queue, then the context
 *     copies A to B after waiting for the queue's event: B must be the host
 *     bytes;
 *   context -> queue: the context waits for another long H2D, then sets A
 *     to 0x11 and records; a device queue waits for that event before its
 *     D2H of A: the host must see 0x11 everywhere. */
static void test_ctx_events(void **state)
{
	const size_t bytes = 256ull << 20;
	struct st_device_config cfg = { .mem_bytes = 3 * bytes, .ordinal = 0 };
	struct st_device *dev = NULL;
	struct st_queue *q = NULL, *q2 = NULL;
	struct st_event *ev = NULL, *ev2 = NULL;
	uint64_t arena_bytes;
	unsigned char *host, *back;

	ST_UNUSED(state);
	check_rc(st_device_create(&st_device_cuda_ops, &cfg, &dev), "st_device_create(cuda)");
	char *arena = st_device_arena(dev, &arena_bytes);
	unsigned char *A = (unsigned char *)arena, *B = A + bytes, *C = B + bytes;
	host = malloc(bytes);
	back = malloc(bytes);
	assert_true(host && back);
	for (size_t i = 0; i < bytes; i++)
		host[i] = (unsigned char)(i * 2654435761u >> 24);
	check_rc(st_device_pin_host(dev, host, bytes), "pin host");
	check_rc(st_device_pin_host(dev, back, bytes), "pin back");
	check_rc(st_queue_create(dev, &q), "queue");
	check_rc(st_queue_create(dev, &q2), "queue 2");
	check_rc(st_event_create(dev, &ev), "event");
	check_rc(st_event_create(dev, &ev2), "event 2");
	check_rc(st_cuda_memset(A, 0, 2 * bytes), "clear A, B");

	check_rc(st_device_memcpy_async(dev, q, A, host, bytes, ST_COPY_H2D), "h2d A");
	check_rc(st_event_record(dev, ev, q), "record on the queue");
	check_rc(st_cuda_ctx_wait(ctx, ev), "context waits");
	check_rc(st_cuda_memcpy_async(ctx, B, A, bytes), "context copies A -> B");
	check_rc(st_cuda_sync(ctx), "sync context");
	check_rc(st_cuda_d2h(back, B, bytes), "d2h B");
	if (memcmp(back, host, bytes))
		fail_msg("queue -> context: B is not what the queue copied into A");

	check_rc(st_device_memcpy_async(dev, q2, C, host, bytes, ST_COPY_H2D), "h2d C");
	check_rc(st_event_record(dev, ev2, q2), "record on queue 2");
	check_rc(st_cuda_ctx_wait(ctx, ev2), "context waits for queue 2");
	check_rc(st_cuda_memset_async(ctx, A, 0x11, bytes), "context sets A");
	check_rc(st_cuda_ctx_record(ctx, ev), "context records");
	check_rc(st_queue_wait(dev, q, ev), "queue waits for the context");
	check_rc(st_device_memcpy_async(dev, q, back, A, bytes, ST_COPY_D2H), "d2h A");
	check_rc(st_queue_sync(dev, q), "sync queue");
	for (size_t i = 0; i < bytes; i++)
		if (back[i] != 0x11)
			fail_msg("context -> queue: byte %zu of A is %#x, not 0x11", i, back[i]);
	printf("ok   context/queue events both ways (256 MiB copies)\n");

	/* a timer around a 256 MiB memset: read 0 until the stop is reached,
	 * then a span of the host clock that ends no later than now */
	struct st_cuda_timer *t = NULL;
	uint64_t t0 = 0, t1 = 0, before = st_now_ns();
	check_rc(st_cuda_timer_create(ctx, &t), "timer");
	check_rc(st_cuda_timer_mark(ctx, t, 0), "timer start");
	check_rc(st_cuda_memset_async(ctx, A, 0x22, bytes), "timed memset");
	check_rc(st_cuda_timer_mark(ctx, t, 1), "timer stop");
	check_rc(st_cuda_sync(ctx), "sync context");
	assert_int_equal(st_cuda_timer_read(ctx, t, &t0, &t1), 1);
	uint64_t after = st_now_ns();
	if (!(t1 > t0 && t1 <= after + 1000000 && t0 + 1000000 >= before))
		fail_msg("timer: span %llu..%llu ns outside the host's %llu..%llu",
			 (unsigned long long)t0, (unsigned long long)t1,
			 (unsigned long long)before, (unsigned long long)after);
	printf("ok   timer: 256 MiB memset took %.3f ms\n", (double)(t1 - t0) / 1e6);
	st_cuda_timer_destroy(t);

	check_rc(st_queue_sync(dev, q2), "sync queue 2");
	st_event_destroy(dev, ev);
	st_event_destroy(dev, ev2);
	st_queue_destroy(dev, q);
	st_queue_destroy(dev, q2);
	st_device_unpin_host(dev, host);
	st_device_unpin_host(dev, back);
	st_device_destroy(dev);
	free(host);
	free(back);
}

/* ---- the op seam ----------------------------------------------------------------- */

/* Every row of tests/compute_cases.h through the cuda compute
 * (st_compute_run) against the cpu compute on the same inputs: outputs
 * start poisoned on both sides, accumulated gradients from the same
 * values; bytes and casts bit for bit, the rest to the row's relative
 * error. Also: supports() takes what the rows take, bf16 matmul operands
 * included. */
static void test_seam_rows(void **state)
{
	struct st_compute *cx = NULL;

	ST_UNUSED(state);
	check_rc(st_compute_cuda_create(0, &cx), "st_compute_cuda_create");
	for (size_t r = 0; r < N_OP_CASES; r++) {
		const struct op_case *c = &op_cases[r];
		void *h[ST_OP_MAX_TENSORS], *d[ST_OP_MAX_TENSORS] = { 0 };
		struct st_op oh, od;
		int n = st_op_tensors(c->kind);
		char what[96];

		case_fill(c, r + 1, h, &oh);
		od = oh;
		for (int k = 0; k < n; k++)
			if (h[k])
				od.t[k].data = d[k] = dev_from(h[k], case_bytes(&c->t[k]));
		snprintf(what, sizeof(what), "seam %s", c->what);
		assert_true(st_compute_supports_op(cx, &od));
		st_compute_run(cx, &od);
		check_rc(st_compute_sync(cx), what);
		st_compute_run(st_compute_cpu(), &oh);
		check_rc(st_compute_take_error(st_compute_cpu()), what);
		for (int k = 0; k < n; k++) {
			if (!h[k] || !case_written(c, k))
				continue;
			size_t bytes = case_bytes(&c->t[k]);
			snprintf(what, sizeof(what), "seam %s slot %d", c->what, k);
			if (c->tol == 0.0 || c->t[k].dtype != ST_DTYPE_F32) {
				void *got = malloc(bytes ? bytes : 1);
				assert_non_null(got);
				check_rc(st_cuda_d2h(got, d[k], bytes), "st_cuda_d2h");
				if (memcmp(got, h[k], bytes) != 0) {
					fprintf(stderr, "FAIL %s: not bit for bit\n", what);
					fail();
				}
				printf("ok   %-40s bytes=%zu bit for bit\n", what, bytes);
				free(got);
			} else {
				expect_close(what, d[k], h[k], (size_t)c->t[k].elems, c->tol);
			}
		}
		for (int k = 0; k < n; k++)
			st_cuda_free(d[k]);
		case_free(h);
	}
	st_compute_destroy(cx);
}

int main(void)
{
	if (!st_cuda_available()) {
		printf("no GPU: skipped\n");
		return 77;
	}
	int rc = st_cuda_ctx_create(0, &ctx);
	if (rc != 0) {
		fprintf(stderr, "st_cuda_ctx_create: %d: %s\n", rc, st_error_last());
		return 1;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_f32_to_bf16),
		cmocka_unit_test(test_bf16_to_f32),
		cmocka_unit_test(test_matmul_fwd),
		cmocka_unit_test(test_matmul_gelu_fwd),
		cmocka_unit_test(test_matmul_bwd),
		cmocka_unit_test(test_gemm),
		cmocka_unit_test(test_memory_on_stream),
		cmocka_unit_test(test_ctx_events),
		cmocka_unit_test(test_layernorm),
		cmocka_unit_test(test_gelu),
		cmocka_unit_test(test_residual),
		cmocka_unit_test(test_residual_norm),
		cmocka_unit_test(test_embedding),
		cmocka_unit_test(test_attention),
		cmocka_unit_test(test_attention_refuses),
		cmocka_unit_test(test_crossentropy),
		cmocka_unit_test(test_seam_rows),
	};
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	st_cuda_ctx_destroy(ctx);
	return rc;
}
