/* cpu kernels against float64 references, finite differences and
 * themselves at other thread counts. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "strata/kernels.h"
#include "cpu_isa.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x853c49e6748fea9bull;

static uint64_t rng_u64(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static float rng_f(void)
{
	return (float)((double)(rng_u64() >> 11) * 0x1.0p-52 - 1.0);
}

static float *rand_buf(size_t n, float scale)
{
	float *p = malloc(n * sizeof(float));
	assert_non_null(p);
	for (size_t i = 0; i < n; i++)
		p[i] = rng_f() * scale;
	return p;
}

static float *zero_buf(size_t n)
{
	float *p = calloc(n, sizeof(float));
	assert_non_null(p);
	return p;
}

/* |a - b| <= atol + rtol * |b| elementwise, b the reference. */
static void assert_close(const float *a, const double *b, size_t n, double atol,
			 double rtol)
{
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)a[i] - b[i]);
		if (!(d <= atol + rtol * fabs(b[i])))
			fail_msg("element %zu: got %.9g want %.9g (diff %.3g)", i,
				 (double)a[i], b[i], d);
	}
}

/* Central difference of f along v versus the analytic <g, v>: the
 * directional derivative averages the per-element noise of fp32, so a
 * relative tolerance of 1e-3 separates rounding from a wrong formula (a
 * missing term typically costs >= 1e-2). */
typedef double (*loss_fn)(void *ctx);

static void check_direction(loss_fn f, void *ctx, float *x, size_t n,
			    const float *g, float eps, const char *what)
{
	float *v = rand_buf(n, 1.0f);
	float *x0 = malloc(n * sizeof(float));
	memcpy(x0, x, n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		x[i] = x0[i] + eps * v[i];
	double lp = f(ctx);
	for (size_t i = 0; i < n; i++)
		x[i] = x0[i] - eps * v[i];
	double lm = f(ctx);
	memcpy(x, x0, n * sizeof(float));
	double fd = (lp - lm) / (2.0 * eps);
	double an = 0.0, gn = 0.0;
	for (size_t i = 0; i < n; i++) {
		an += (double)g[i] * v[i];
		gn += (double)g[i] * g[i];
	}
	double scale = fmax(fmax(fabs(fd), fabs(an)), 1e-3 * sqrt(gn));
	if (fabs(fd - an) > 1e-3 * scale + 1e-6)
		fail_msg("%s: finite difference %.9g, analytic %.9g", what, fd, an);
	free(v);
	free(x0);
}

/* sum(out * r) in double: the random projection that turns an output into a
 * scalar loss whose gradient wrt out is r. */
static double project(const float *out, const float *r, size_t n)
{
	double s = 0.0;
	for (size_t i = 0; i < n; i++)
		s += (double)out[i] * r[i];
	return s;
}

/* ---- bf16 ------------------------------------------------------------------- */

/* Reference RNE by exact comparison of the two neighbours in double. */
static uint16_t ref_bf16(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	if (isnan(f))
		return (uint16_t)((u >> 16) | 0x40);
	uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
	float flo, fhi;
	memcpy(&flo, &lo, 4);
	if ((lo & 0x7fffffffu) == 0x7f800000u)
		return (uint16_t)(lo >> 16); /* infinity */
	memcpy(&fhi, &hi, 4);
	double dlo = fabs((double)f - flo), dhi;
	if ((hi & 0x7f800000u) == 0x7f800000u) /* hi is inf: use its exact
						   double (max + 1 ulp) */
		dhi = fabs(ldexp(1.0, 128) - fabs((double)f));
	else
		dhi = fabs((double)fhi - f);
	if (dlo < dhi)
		return (uint16_t)(lo >> 16);
	if (dhi < dlo)
		return (uint16_t)(hi >> 16);
	return (uint16_t)(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

static void test_bf16(void **state)
{
	(void)state;
	/* every bf16 value round-trips (NaNs come back quiet) */
	for (uint32_t h = 0; h < 65536; h++) {
		float f = st_cpu_f32_from_bf16((uint16_t)h);
		uint16_t back = st_cpu_bf16_from_f32(f);
		if (isnan(f))
			assert_int_equal(back, h | 0x40);
		else
			assert_int_equal(back, h);
	}
	/* random and edge bit patterns against the reference rounding */
	static const uint32_t edges[] = {
		0x3f808000u, /* 1 + 2^-8: tie, to even (down) */
		0x3f818000u, /* tie, to even (up) */
		0x3f808001u, 0x7f7fffffu, /* max finite rounds to inf */
		0x7f7f7fffu, 0x00000001u, 0x00008000u, 0x00018000u,
		0x807fffffu, 0x7f800000u, 0xff800000u, 0x7f800001u,
		0xffc00000u, 0x80000000u,
	};
	for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++) {
		float f;
		memcpy(&f, &edges[i], 4);
		assert_int_equal(st_cpu_bf16_from_f32(f), ref_bf16(edges[i]));
	}
	assert_int_equal(st_cpu_bf16_from_f32(1.00390625f), 0x3f80);
	size_t n = 1 << 20;
	float *f = malloc(n * 4);
	uint16_t *h = malloc(n * 2);
	float *back = malloc(n * 4);
	for (size_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)rng_u64();
		memcpy(&f[i], &u, 4);
	}
	st_cpu_f32_to_bf16(h, f, n);
	st_cpu_bf16_to_f32(back, h, n);
	for (size_t i = 0; i < n; i++) {
		uint32_t u;
		memcpy(&u, &f[i], 4);
		assert_int_equal(h[i], ref_bf16(u));
		assert_int_equal(h[i], st_cpu_bf16_from_f32(f[i]));
		float b = st_cpu_f32_from_bf16(h[i]);
		assert_memory_equal(&back[i], &b, 4);
	}
	free(f);
	free(h);
	free(back);
}

/* ---- matmul -------------------------------------------------------------------- */

static void test_matmul(void **state)
{
	(void)state;
	const int N = 37, IC = 29, OC = 301; /* odd: partial tiles */
	float *inp = rand_buf((size_t)N * IC, 1.0f), *w = rand_buf((size_t)IC * OC, 1.0f);
	float *b = rand_buf(OC, 1.0f), *out = zero_buf((size_t)N * OC);
	double *ref = malloc(sizeof(double) * N * OC);
	st_cpu_matmul_fwd(out, inp, w, b, N, IC, OC);
	for (int n = 0; n < N; n++)
		for (int o = 0; o < OC; o++) {
			double s = b[o];
			for (int i = 0; i < IC; i++)
				s += (double)inp[n * IC + i] * w[i * OC + o];
			ref[n * OC + o] = s;
		}
	assert_close(out, ref, (size_t)N * OC, 1e-5, 1e-5);

	/* backward accumulates onto what is there */
	float *dout = rand_buf((size_t)N * OC, 1.0f);
	float *dinp = rand_buf((size_t)N * IC, 1.0f), *dw = rand_buf((size_t)IC * OC, 1.0f);
	float *db = rand_buf(OC, 1.0f);
	double *rdi = malloc(sizeof(double) * N * IC), *rdw = malloc(sizeof(double) * IC * OC);
	double *rdb = malloc(sizeof(double) * OC);
	for (int i = 0; i < N * IC; i++)
		rdi[i] = dinp[i];
	for (int i = 0; i < IC * OC; i++)
		rdw[i] = dw[i];
	for (int i = 0; i < OC; i++)
		rdb[i] = db[i];
	for (int n = 0; n < N; n++)
		for (int o = 0; o < OC; o++) {
			double g = dout[n * OC + o];
			rdb[o] += g;
			for (int i = 0; i < IC; i++) {
				rdi[n * IC + i] += g * w[i * OC + o];
				rdw[i * OC + o] += g * inp[n * IC + i];
			}
		}
	st_cpu_matmul_bwd(dinp, dw, db, dout, inp, w, N, IC, OC);
	assert_close(dinp, rdi, (size_t)N * IC, 1e-4, 1e-5);
	assert_close(dw, rdw, (size_t)IC * OC, 1e-4, 1e-5);
	assert_close(db, rdb, OC, 1e-4, 1e-5);
	free(inp); free(w); free(b); free(out); free(ref); free(dout);
	free(dinp); free(dw); free(db); free(rdi); free(rdw); free(rdb);
}

/* ---- layernorm --------------------------------------------------------------------- */

struct ln_ctx {
	float *out, *mean, *rstd, *inp, *w, *b, *r;
	int N, C;
};

static double ln_loss(void *p)
{
	struct ln_ctx *c = p;
	st_cpu_layernorm_fwd(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
	return project(c->out, c->r, (size_t)c->N * c->C);
}

static void test_layernorm(void **state)
{
	(void)state;
	const int N = 7, C = 67;
	struct ln_ctx c = {.N = N, .C = C};
	c.inp = rand_buf((size_t)N * C, 2.0f);
	for (int i = 0; i < N * C; i++)
		c.inp[i] += 0.5f; /* nonzero mean */
	c.w = rand_buf(C, 1.0f);
	c.b = rand_buf(C, 1.0f);
	c.r = rand_buf((size_t)N * C, 1.0f);
	c.out = zero_buf((size_t)N * C);
	c.mean = zero_buf(N);
	c.rstd = zero_buf(N);
	ln_loss(&c);
	double *ref = malloc(sizeof(double) * N * C);
	for (int n = 0; n < N; n++) {
		double m = 0, v = 0;
		for (int i = 0; i < C; i++)
			m += c.inp[n * C + i];
		m /= C;
		for (int i = 0; i < C; i++)
			v += (c.inp[n * C + i] - m) * (c.inp[n * C + i] - m);
		v /= C;
		for (int i = 0; i < C; i++)
			ref[n * C + i] = (c.inp[n * C + i] - m) / sqrt(v + 1e-5) * c.w[i] + c.b[i];
	}
	assert_close(c.out, ref, (size_t)N * C, 1e-5, 1e-5);
	float *dinp = zero_buf((size_t)N * C), *dw = zero_buf(C), *db = zero_buf(C);
	st_cpu_layernorm_bwd(dinp, dw, db, c.r, c.inp, c.w, c.mean, c.rstd, N, C);
	check_direction(ln_loss, &c, c.inp, (size_t)N * C, dinp, 1e-2f, "ln dinp");
	check_direction(ln_loss, &c, c.w, C, dw, 1e-2f, "ln dweight");
	check_direction(ln_loss, &c, c.b, C, db, 1e-2f, "ln dbias");
	free(c.inp); free(c.w); free(c.b); free(c.r); free(c.out); free(c.mean);
	free(c.rstd); free(ref); free(dinp); free(dw); free(db);
}

/* ---- gelu and residual ---------------------------------------------------------------- */

static void test_gelu(void **state)
{
	(void)state;
	const size_t n = 40000; /* several elementwise chunks */
	float *x = rand_buf(n, 8.0f), *out = zero_buf(n), *dout = rand_buf(n, 1.0f);
	float *dx = zero_buf(n);
	x[0] = 100.0f;
	x[1] = -100.0f;
	x[2] = 0.0f;
	double *ref = malloc(n * sizeof(double)), *rd = malloc(n * sizeof(double));
	const double k = sqrt(2.0 / M_PI);
	for (size_t i = 0; i < n; i++) {
		double v = x[i], u = k * (v + 0.044715 * v * v * v), t = tanh(u);
		ref[i] = 0.5 * v * (1.0 + t);
		double du = k * (1.0 + 3.0 * 0.044715 * v * v);
		rd[i] = (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du) * dout[i];
	}
	st_cpu_gelu_fwd(out, x, n);
	assert_close(out, ref, n, 1e-6, 1e-5);
	st_cpu_gelu_bwd(dx, x, dout, n);
	assert_close(dx, rd, n, 1e-6, 1e-5);
	/* in place, as the block uses it */
	float *y = malloc(n * sizeof(float));
	memcpy(y, x, n * sizeof(float));
	st_cpu_gelu_bwd(y, y, dout, n);
	assert_memory_equal(y, dx, n * sizeof(float));

	float *a = rand_buf(n, 1.0f), *b = rand_buf(n, 1.0f), *s = zero_buf(n);
	float *da = zero_buf(n), *dbb = rand_buf(n, 1.0f);
	st_cpu_residual_fwd(s, a, b, n);
	for (size_t i = 0; i < n; i++)
		assert_true(s[i] == a[i] + b[i]);
	memcpy(s, dbb, n * sizeof(float));
	st_cpu_residual_bwd(da, dbb, dout, n);
	for (size_t i = 0; i < n; i++) {
		assert_true(da[i] == dout[i]);
		assert_true(dbb[i] == s[i] + dout[i]);
	}
	free(x); free(out); free(dout); free(dx); free(ref); free(rd); free(y);
	free(a); free(b); free(s); free(da); free(dbb);
}

/* ---- embedding ----------------------------------------------------------------------------- */

/* NaN and Inf inputs through every kernel built on the polynomial exp
 * (gelu, cross-entropy): a NaN comes out NaN, nothing is undefined (the
 * sanitizer build runs this with halt_on_error), and the finite elements
 * beside them give the bits they give alone. */
static void test_nonfinite(void **state)
{
	(void)state;
	const size_t n = 64;
	float *x = rand_buf(n, 8.0f), *dout = rand_buf(n, 1.0f);
	float *ref = zero_buf(n), *dref = zero_buf(n), *out = zero_buf(n), *dx = zero_buf(n);
	const size_t bad[] = { 3, 17, 40 };
	const float vals[] = { NAN, INFINITY, -INFINITY };

	st_cpu_gelu_fwd(ref, x, n);
	st_cpu_gelu_bwd(dref, x, dout, n);
	for (size_t k = 0; k < 3; k++)
		x[bad[k]] = vals[k];
	st_cpu_gelu_fwd(out, x, n);
	st_cpu_gelu_bwd(dx, x, dout, n);
	for (size_t i = 0; i < n; i++) {
		if (i == bad[0]) {
			assert_true(isnan(out[i]) && isnan(dx[i]));
		} else if (i == bad[1]) {
			assert_true(isinf(out[i]) && out[i] > 0); /* gelu(x) -> x */
		} else if (i != bad[2]) {
			assert_memory_equal(&out[i], &ref[i], sizeof(float));
			assert_memory_equal(&dx[i], &dref[i], sizeof(float));
		}
	}

	/* rows of 16 logits: finite, one NaN, one +Inf (inf - max is NaN),
	 * one -Inf (a zero probability: finite loss) */
	enum { N = 4, V = 16 };
	float logits[N * V], losses[N], dl[N * V], lref[N], dlref[N * V];
	int32_t targets[N] = { 1, 2, 3, 4 };
	for (int i = 0; i < N * V; i++)
		logits[i] = rng_f() * 4.0f;
	for (int r = 1; r < N; r++)
		memcpy(logits + r * V, logits, V * sizeof(float));
	st_cpu_crossentropy_fwd(lref, logits, targets, N, V);
	st_cpu_crossentropy_bwd(dlref, NULL, logits, targets, 1.0f, N, V);
	logits[1 * V + 7] = NAN;
	logits[2 * V + 7] = INFINITY;
	logits[3 * V + 7] = -INFINITY;
	st_cpu_crossentropy_fwd(losses, logits, targets, N, V);
	st_cpu_crossentropy_bwd(dl, NULL, logits, targets, 1.0f, N, V);
	assert_memory_equal(&losses[0], &lref[0], sizeof(float));
	assert_memory_equal(dl, dlref, V * sizeof(float));
	assert_true(isnan(losses[1]) && isnan(dl[1 * V + 7]));
	assert_true(!isfinite(losses[2]));
	assert_true(isfinite(losses[3]) && dl[3 * V + 7] == 0.0f);
	free(x);
	free(dout);
	free(ref);
	free(dref);
	free(out);
	free(dx);
}

static void test_embedding(void **state)
{
	(void)state;
	const int B = 3, T = 5, C = 70, V = 11;
	int32_t tok[15];
	for (int i = 0; i < B * T; i++)
		tok[i] = (int32_t)(rng_u64() % 4); /* repeats */
	float *wte = rand_buf((size_t)V * C, 1.0f), *wpe = rand_buf((size_t)T * C, 1.0f);
	float *out = zero_buf((size_t)B * T * C), *dout = rand_buf((size_t)B * T * C, 1.0f);
	st_cpu_embedding_fwd(out, tok, wte, wpe, B, T, C);
	for (int bt = 0; bt < B * T; bt++)
		for (int c = 0; c < C; c++)
			assert_true(out[bt * C + c] == wte[tok[bt] * C + c] + wpe[(bt % T) * C + c]);
	float *dwte = zero_buf((size_t)V * C), *dwpe = zero_buf((size_t)T * C);
	double *rwte = calloc((size_t)V * C, sizeof(double)), *rwpe = calloc((size_t)T * C, sizeof(double));
	for (int bt = 0; bt < B * T; bt++)
		for (int c = 0; c < C; c++) {
			rwte[tok[bt] * C + c] += dout[bt * C + c];
			rwpe[(bt % T) * C + c] += dout[bt * C + c];
		}
	st_cpu_embedding_bwd(dwte, dwpe, dout, tok, B, T, C);
	assert_close(dwte, rwte, (size_t)V * C, 1e-6, 1e-6);
	assert_close(dwpe, rwpe, (size_t)T * C, 1e-6, 1e-6);
	free(wte); free(wpe); free(out); free(dout); free(dwte); free(dwpe);
	free(rwte); free(rwpe);
}

/* ---- attention ------------------------------------------------------------------------------ */

struct att_ctx {
	float *out, *lse, *qkv, *r;
	int B, T, C, NH;
};

static double att_loss(void *p)
{
	struct att_ctx *c = p;
	st_cpu_attention_fwd(c->out, c->lse, c->qkv, c->B, c->T, c->C, c->NH);
	return project(c->out, c->r, (size_t)c->B * c->T * c->C);
}

static void test_attention(void **state)
{
	(void)state;
	/* T = 150: three query and key blocks, the last partial */
	const int B = 2, T = 150, C = 16, NH = 2, hs = C / NH;
	struct att_ctx c = {.B = B, .T = T, .C = C, .NH = NH};
	size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
	c.qkv = rand_buf(nqkv, 1.5f);
	c.r = rand_buf(nout, 1.0f);
	c.out = zero_buf(nout);
	c.lse = zero_buf((size_t)B * NH * T);
	att_loss(&c);
	/* naive float64 reference */
	double *ref = calloc(nout, sizeof(double)), *rl = calloc((size_t)B * NH * T, sizeof(double));
	double *sc = malloc(sizeof(double) * T);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++)
			for (int i = 0; i < T; i++) {
				const float *q = c.qkv + ((size_t)b * T + i) * 3 * C + h * hs;
				double mx = -INFINITY, sum = 0;
				for (int j = 0; j <= i; j++) {
					const float *k = c.qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
					double s = 0;
					for (int d = 0; d < hs; d++)
						s += (double)q[d] * k[d];
					sc[j] = s / sqrt((double)hs);
					mx = fmax(mx, sc[j]);
				}
				for (int j = 0; j <= i; j++)
					sum += exp(sc[j] - mx);
				for (int j = 0; j <= i; j++) {
					const float *v = c.qkv + ((size_t)b * T + j) * 3 * C + 2 * C + h * hs;
					double p = exp(sc[j] - mx) / sum;
					for (int d = 0; d < hs; d++)
						ref[((size_t)b * T + i) * C + h * hs + d] += p * v[d];
				}
				rl[((size_t)b * NH + h) * T + i] = mx + log(sum);
			}
	assert_close(c.out, ref, nout, 1e-5, 1e-4);
	assert_close(c.lse, rl, (size_t)B * NH * T, 1e-5, 1e-5);
	float *dqkv = zero_buf(nqkv);
	st_cpu_attention_bwd(dqkv, c.r, c.qkv, c.out, c.lse, B, T, C, NH);
	check_direction(att_loss, &c, c.qkv, nqkv, dqkv, 1e-2f, "attention dqkv");
	/* q, k and v separately: a direction restricted to each part, so an
	 * error in one cannot hide behind the others */
	for (int part = 0; part < 3; part++) {
		size_t rows = (size_t)B * T;
		float *sub = malloc(rows * C * sizeof(float)), *gsub = malloc(rows * C * sizeof(float));
		for (size_t r = 0; r < rows; r++) {
			memcpy(sub + r * C, c.qkv + r * 3 * C + part * C, C * sizeof(float));
			memcpy(gsub + r * C, dqkv + r * 3 * C + part * C, C * sizeof(float));
		}
		/* a direction on sub, mapped into qkv by the loss wrapper */
		float *v = rand_buf(rows * C, 1.0f);
		float eps = 1e-2f;
		double l[2];
		for (int s = 0; s < 2; s++) {
			for (size_t r = 0; r < rows; r++)
				for (int d = 0; d < C; d++)
					c.qkv[r * 3 * C + part * C + d] =
						sub[r * C + d] + (s ? -eps : eps) * v[r * C + d];
			l[s] = att_loss(&c);
		}
		for (size_t r = 0; r < rows; r++)
			memcpy(c.qkv + r * 3 * C + part * C, sub + r * C, C * sizeof(float));
		double fd = (l[0] - l[1]) / (2.0 * eps), an = 0;
		for (size_t i = 0; i < rows * C; i++)
			an += (double)gsub[i] * v[i];
		if (fabs(fd - an) > 1e-3 * fmax(fabs(fd), fabs(an)) + 1e-6)
			fail_msg("attention part %d: fd %.9g analytic %.9g", part, fd, an);
		free(sub); free(gsub); free(v);
	}
	free(c.qkv); free(c.r); free(c.out); free(c.lse); free(ref); free(rl);
	free(sc); free(dqkv);
}

/* ---- attention of packed documents (seg) ------------------------------------------------------- */

/* seg (B,T) from each row's document starts (starts[b] ends with -1) */
static int32_t *seg_of(const int (*starts)[8], int B, int T)
{
	int32_t *seg = malloc(sizeof(int32_t) * (size_t)B * T);
	assert_non_null(seg);
	for (int b = 0; b < B; b++)
		for (int t = 0, k = 0, s = 0; t < T; t++) {
			while (starts[b][k] >= 0 && starts[b][k] <= t)
				s = starts[b][k++];
			seg[(size_t)b * T + t] = s;
		}
	return seg;
}

struct seg_ctx {
	struct att_ctx a;
	const int32_t *seg;
};

static double seg_loss(void *p)
{
	struct seg_ctx *c = p;
	st_cpu_attention_fwd_seg(c->a.out, c->a.lse, c->a.qkv, c->a.B, c->a.T, c->a.C, c->a.NH,
				 c->seg);
	return project(c->a.out, c->a.r, (size_t)c->a.B * c->a.T * c->a.C);
}

/* a float buffer's rows [r0, r0 + n) of width w, out of rows of stride */
static float *rows_of(const float *p, int r0, int n, int w, int stride)
{
	float *o = malloc(sizeof(float) * (size_t)n * w);
	assert_non_null(o);
	for (int r = 0; r < n; r++)
		memcpy(o + (size_t)r * w, p + (size_t)(r0 + r) * stride, sizeof(float) * w);
	return o;
}

static void near_rows(const float *got, int stride, const float *want, int n, int w, double tol,
		      const char *what)
{
	for (int r = 0; r < n; r++)
		for (int d = 0; d < w; d++) {
			double g = got[(size_t)r * stride + d], e = want[(size_t)r * w + d];
			if (!(fabs(g - e) <= tol * (1.0 + fabs(e))))
				fail_msg("%s: row %d [%d]: packed %.9g, alone %.9g", what, r, d, g, e);
		}
}

/* Query t sees keys [seg[t], t] only: a float64 reference, finite
 * differences of the backward, each document run alone (the plain causal
 * kernel on its rows), and seg all 0 = NULL bit for bit. T = 150 spans
 * three blocks; documents of one position, ones that cross a block edge,
 * one that starts a block, and a row of one document. */
static void test_attention_seg(void **state)
{
	(void)state;
	const int B = 3, T = 150, C = 16, NH = 2, hs = C / NH, C3 = 3 * C;
	static const int starts[3][8] = { { 0, 5, 70, 71, 100, 140, -1 },
					   { 0, 63, 64, 128, 129, -1 },
					   { 0, -1 } };
	int32_t *seg = seg_of(starts, B, T);
	struct seg_ctx c = { .a = { .B = B, .T = T, .C = C, .NH = NH }, .seg = seg };
	size_t nqkv = (size_t)B * T * C3, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
	c.a.qkv = rand_buf(nqkv, 1.5f);
	c.a.r = rand_buf(nout, 1.0f);
	c.a.out = zero_buf(nout);
	c.a.lse = zero_buf(nl);
	seg_loss(&c);
	double *ref = calloc(nout, sizeof(double)), *rl = calloc(nl, sizeof(double));
	double *sc = malloc(sizeof(double) * T);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < NH; h++)
			for (int i = 0; i < T; i++) {
				const float *q = c.a.qkv + ((size_t)b * T + i) * C3 + h * hs;
				int s0 = seg[(size_t)b * T + i];
				double mx = -INFINITY, sum = 0;
				for (int j = s0; j <= i; j++) {
					const float *k = c.a.qkv + ((size_t)b * T + j) * C3 + C + h * hs;
					double s = 0;
					for (int d = 0; d < hs; d++)
						s += (double)q[d] * k[d];
					sc[j] = s / sqrt((double)hs);
					mx = fmax(mx, sc[j]);
				}
				for (int j = s0; j <= i; j++)
					sum += exp(sc[j] - mx);
				for (int j = s0; j <= i; j++) {
					const float *v = c.a.qkv + ((size_t)b * T + j) * C3 + 2 * C + h * hs;
					double p = exp(sc[j] - mx) / sum;
					for (int d = 0; d < hs; d++)
						ref[((size_t)b * T + i) * C + h * hs + d] += p * v[d];
				}
				rl[((size_t)b * NH + h) * T + i] = mx + log(sum);
			}
	assert_close(c.a.out, ref, nout, 1e-5, 1e-4);
	assert_close(c.a.lse, rl, nl, 1e-5, 1e-5);
	float *dqkv = zero_buf(nqkv);
	st_cpu_attention_bwd_seg(dqkv, c.a.r, c.a.qkv, c.a.out, c.a.lse, B, T, C, NH, seg);
	check_direction(seg_loss, &c, c.a.qkv, nqkv, dqkv, 1e-2f, "attention seg dqkv");
	seg_loss(&c); /* out and lse of qkv itself again */

	/* each document alone: out, lse and dqkv of its rows */
	for (int b = 0; b < B; b++)
		for (int k = 0; starts[b][k] >= 0; k++) {
			int a = starts[b][k], e = starts[b][k + 1] >= 0 ? starts[b][k + 1] : T;
			int L = e - a;
			float *q1 = rows_of(c.a.qkv + (size_t)b * T * C3, a, L, C3, C3);
			float *r1 = rows_of(c.a.r + (size_t)b * T * C, a, L, C, C);
			float *o1 = zero_buf((size_t)L * C), *l1 = zero_buf((size_t)NH * L);
			float *d1 = zero_buf((size_t)L * C3);
			st_cpu_attention_fwd(o1, l1, q1, 1, L, C, NH);
			st_cpu_attention_bwd(d1, r1, q1, o1, l1, 1, L, C, NH);
			near_rows(c.a.out + ((size_t)b * T + a) * C, C, o1, L, C, 1e-5, "out");
			for (int h = 0; h < NH; h++)
				near_rows(c.a.lse + ((size_t)b * NH + h) * T + a, 1, l1 + (size_t)h * L,
					  L, 1, 1e-5, "lse");
			near_rows(dqkv + ((size_t)b * T + a) * C3, C3, d1, L, C3, 1e-5, "dqkv");
			free(q1); free(r1); free(o1); free(l1); free(d1);
		}

	/* one document per row (seg all 0) is the causal kernel, bit for bit */
	int32_t *zero = calloc((size_t)B * T, sizeof(int32_t));
	float *o0 = zero_buf(nout), *l0 = zero_buf(nl), *o2 = zero_buf(nout), *l2 = zero_buf(nl);
	float *d0 = zero_buf(nqkv), *d2 = zero_buf(nqkv);
	st_cpu_attention_fwd(o0, l0, c.a.qkv, B, T, C, NH);
	st_cpu_attention_fwd_seg(o2, l2, c.a.qkv, B, T, C, NH, zero);
	st_cpu_attention_bwd(d0, c.a.r, c.a.qkv, o0, l0, B, T, C, NH);
	st_cpu_attention_bwd_seg(d2, c.a.r, c.a.qkv, o0, l0, B, T, C, NH, zero);
	assert_memory_equal(o0, o2, nout * sizeof(float));
	assert_memory_equal(l0, l2, nl * sizeof(float));
	assert_memory_equal(d0, d2, nqkv * sizeof(float));
	free(zero); free(o0); free(l0); free(o2); free(l2); free(d0); free(d2);
	free(c.a.qkv); free(c.a.r); free(c.a.out); free(c.a.lse); free(ref); free(rl);
	free(sc); free(dqkv); free(seg);
}

/* The grouped-query attention with seg: each document alone, as above
 * (two query heads per kv head, so dk and dv sum over both). */
static void test_gqa_attention_seg(void **state)
{
	(void)state;
	const int B = 2, T = 140, NH = 4, NKV = 2, hd = 8, sq = NH * hd, sk = NKV * hd;
	static const int starts[2][8] = { { 0, 3, 64, 65, 90, -1 }, { 0, 70, 139, -1 } };
	int32_t *seg = seg_of(starts, B, T);
	size_t nq = (size_t)B * T * sq, nk = (size_t)B * T * sk, nl = (size_t)B * NH * T;
	float *q = rand_buf(nq, 1.5f), *k = rand_buf(nk, 1.5f), *v = rand_buf(nk, 1.0f);
	float *r = rand_buf(nq, 1.0f), *o = zero_buf(nq), *l = zero_buf(nl);
	float *dq = zero_buf(nq), *dk = zero_buf(nk), *dv = zero_buf(nk);
	st_cpu_gqa_attention_fwd_seg(o, l, q, k, v, B, T, NH, NKV, hd, seg);
	st_cpu_gqa_attention_bwd_seg(dq, dk, dv, r, q, k, v, o, l, B, T, NH, NKV, hd, seg);
	for (int b = 0; b < B; b++)
		for (int j = 0; starts[b][j] >= 0; j++) {
			int a = starts[b][j], e = starts[b][j + 1] >= 0 ? starts[b][j + 1] : T;
			int L = e - a;
			float *q1 = rows_of(q + (size_t)b * T * sq, a, L, sq, sq);
			float *k1 = rows_of(k + (size_t)b * T * sk, a, L, sk, sk);
			float *v1 = rows_of(v + (size_t)b * T * sk, a, L, sk, sk);
			float *r1 = rows_of(r + (size_t)b * T * sq, a, L, sq, sq);
			float *o1 = zero_buf((size_t)L * sq), *l1 = zero_buf((size_t)NH * L);
			float *dq1 = zero_buf((size_t)L * sq), *dk1 = zero_buf((size_t)L * sk);
			float *dv1 = zero_buf((size_t)L * sk);
			st_cpu_gqa_attention_fwd(o1, l1, q1, k1, v1, 1, L, NH, NKV, hd);
			st_cpu_gqa_attention_bwd(dq1, dk1, dv1, r1, q1, k1, v1, o1, l1, 1, L, NH, NKV,
						 hd);
			near_rows(o + ((size_t)b * T + a) * sq, sq, o1, L, sq, 1e-5, "gqa out");
			near_rows(dq + ((size_t)b * T + a) * sq, sq, dq1, L, sq, 1e-5, "gqa dq");
			near_rows(dk + ((size_t)b * T + a) * sk, sk, dk1, L, sk, 1e-5, "gqa dk");
			near_rows(dv + ((size_t)b * T + a) * sk, sk, dv1, L, sk, 1e-5, "gqa dv");
			for (int h = 0; h < NH; h++)
				near_rows(l + ((size_t)b * NH + h) * T + a, 1, l1 + (size_t)h * L, L, 1,
					  1e-5, "gqa lse");
			free(q1); free(k1); free(v1); free(r1); free(o1); free(l1);
			free(dq1); free(dk1); free(dv1);
		}
	free(q); free(k); free(v); free(r); free(o); free(l); free(dq); free(dk); free(dv);
	free(seg);
}

/* ---- cross-entropy ----------------------------------------------------------------------------- */

static void test_crossentropy(void **state)
{
	(void)state;
	const int N = 9, V = 1001;
	float *logits = rand_buf((size_t)N * V, 6.0f), *losses = zero_buf(N);
	int32_t tg[9];
	for (int i = 0; i < N; i++)
		tg[i] = (int32_t)(rng_u64() % V);
	logits[5] = 90.0f; /* a large logit: the max subtraction matters */
	st_cpu_crossentropy_fwd(losses, logits, tg, N, V);
	double rl[9], *rd = malloc(sizeof(double) * N * V);
	const float dloss = 0.37f;
	for (int n = 0; n < N; n++) {
		double mx = -INFINITY, s = 0;
		for (int v = 0; v < V; v++)
			mx = fmax(mx, logits[n * V + v]);
		for (int v = 0; v < V; v++)
			s += exp(logits[n * V + v] - mx);
		rl[n] = mx + log(s) - logits[n * V + tg[n]];
		for (int v = 0; v < V; v++)
			rd[n * V + v] = dloss * (exp(logits[n * V + v] - mx) / s - (v == tg[n]));
	}
	assert_close(losses, rl, N, 1e-5, 1e-5);
	float *l2 = zero_buf(N);
	/* in place */
	st_cpu_crossentropy_bwd(logits, l2, logits, tg, dloss, N, V);
	assert_close(l2, rl, N, 1e-5, 1e-5);
	assert_close(logits, rd, (size_t)N * V, 1e-7, 1e-5);
	free(logits); free(losses); free(rd); free(l2);
}

/* ---- determinism ------------------------------------------------------------------------------- */

static void test_threads_bitwise(void **state)
{
	(void)state;
	/* shapes where OpenBLAS's own threading is not bitwise stable */
	const int M = 300, N = 700, K = 513;
	float *A = rand_buf((size_t)M * K, 1.0f), *B = rand_buf((size_t)K * N, 1.0f);
	float *Cs[3];
	float *qkv = rand_buf((size_t)2 * 130 * 3 * 32, 1.0f);
	float *ao[3], *al[3], *ad[3];
	float *dout = rand_buf((size_t)2 * 130 * 32, 1.0f);
	int saved = omp_get_max_threads();
	float *Ct[3][2];
	for (int t = 0; t < 3; t++) {
		omp_set_num_threads(t + 1);
		Cs[t] = zero_buf((size_t)M * N);
		st_cpu_sgemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, Cs[t], N);
		/* the other two layouts the step runs: A B^T (B read as (N,K)), A^T B */
		Ct[t][0] = zero_buf((size_t)M * N);
		st_cpu_sgemm(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, Ct[t][0], N);
		Ct[t][1] = zero_buf((size_t)M * N);
		st_cpu_sgemm(1, 0, M, N, K, 1.0f, A, M, B, N, 0.0f, Ct[t][1], N);
		ao[t] = zero_buf((size_t)2 * 130 * 32);
		al[t] = zero_buf((size_t)2 * 4 * 130);
		ad[t] = zero_buf((size_t)2 * 130 * 3 * 32);
		st_cpu_attention_fwd(ao[t], al[t], qkv, 2, 130, 32, 4);
		st_cpu_attention_bwd(ad[t], dout, qkv, ao[t], al[t], 2, 130, 32, 4);
	}
	omp_set_num_threads(saved);
	for (int t = 1; t < 3; t++) {
		assert_memory_equal(Cs[0], Cs[t], (size_t)M * N * sizeof(float));
		assert_memory_equal(Ct[0][0], Ct[t][0], (size_t)M * N * sizeof(float));
		assert_memory_equal(Ct[0][1], Ct[t][1], (size_t)M * N * sizeof(float));
		assert_memory_equal(ao[0], ao[t], (size_t)2 * 130 * 32 * sizeof(float));
		assert_memory_equal(ad[0], ad[t], (size_t)2 * 130 * 96 * sizeof(float));
	}
	for (int t = 0; t < 3; t++) {
		free(Cs[t]); free(Ct[t][0]); free(Ct[t][1]); free(ao[t]); free(al[t]); free(ad[t]);
	}
	free(A); free(B); free(qkv); free(dout);
}

/* st_cpu_zero and st_cpu_copy against memset and memcpy, at 1 to 3 threads,
 * over sizes that end inside a chunk, and leave the bytes around alone. */
static void test_fill(void **state)
{
	(void)state;
	const size_t sizes[] = { 0, 1, 4095, (size_t)1 << 20, ((size_t)7 << 19) + 13 };
	const int saved = omp_get_max_threads();
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		const size_t n = sizes[si];
		unsigned char *src = malloc(n + 2), *dst = malloc(n + 2), *want = malloc(n + 2);
		assert_non_null(src);
		assert_non_null(dst);
		assert_non_null(want);
		for (size_t i = 0; i < n + 2; i++)
			src[i] = (unsigned char)(rng_u64() >> 56);
		for (int t = 1; t <= 3; t++) {
			omp_set_num_threads(t);
			memset(dst, 0xa5, n + 2);
			memcpy(want, dst, n + 2);
			memcpy(want + 1, src + 1, n);
			st_cpu_copy(dst + 1, src + 1, n);
			assert_memory_equal(dst, want, n + 2);
			memset(want + 1, 0, n);
			st_cpu_zero(dst + 1, n);
			assert_memory_equal(dst, want, n + 2);
		}
		free(src);
		free(dst);
		free(want);
	}
	omp_set_num_threads(saved);
}

/* The matmul tiles: they cover the output in at least 4 tiles where the
 * shape has room for 4 of 64 x 64, and re-pack no more than any other grid
 * of that many tiles (brute force), nor than the old fixed policy (tiles of
 * at most 256 x 512, at least 6 of them). */
static void test_gemm_tiles(void **state)
{
	(void)state;
	static const int shapes[][2] = {
		{ 256, 2304 }, { 256, 768 },  { 768, 2304 }, { 3072, 768 }, { 256, 50257 },
		{ 50257, 768 }, { 64, 64 },   { 100, 30 },   { 130, 4000 }, { 1, 1 },
		{ 517, 515 },  { 8192, 256 },
	};
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		const int M = shapes[i][0], N = shapes[i][1];
		int tm, tn;

		st_cpu_gemm_tiles(M, N, &tm, &tn);
		assert_true(tm >= 1 && tm <= M && tn >= 1 && tn <= N);
		assert_true(tm == M || tm % 16 == 0);
		assert_true(tn == N || tn % 16 == 0);
		const int a = (M + tm - 1) / tm, b = (N + tn - 1) / tn;
		const int room = (M / 64 > 0 ? M / 64 : 1) * (N / 64 > 0 ? N / 64 : 1);
		assert_true(a * b >= (room < 4 ? room : 4));
		const double packed = (double)b * M + (double)a * N;
		for (int x = 1; x <= M / 64; x++)
			for (int y = 1; y <= N / 64; y++)
				if (x * y >= 4)
					assert_true(packed <= (double)y * M + (double)x * N);
		int om = 256, on = 512;
#define OLD_TILES(p, q) (((M + (p)-1) / (p)) * ((N + (q)-1) / (q)))
		while (on > 128 && OLD_TILES(om, on) < 6)
			on /= 2;
		while (om > 128 && OLD_TILES(om, on) < 6)
			om /= 2;
#undef OLD_TILES
		if (M >= 256 && N >= 256)
			assert_true(packed <= (double)((N + on - 1) / on) * M +
						      (double)((M + om - 1) / om) * N);
	}
}


/* ---- the elementwise loops' ISA ------------------------------------------------------------------ */

/* What the ISA-dependent kernels give: gelu forward, backward and backward
 * in place, cross-entropy forward and backward (in place, with losses). */
struct isa_out {
	float *gf, *gb, *gi, *lf, *lb, *dl;
};

static void isa_run(struct isa_out *o, const float *x, const float *dout, size_t n,
		    const float *logits, const int32_t *tg, int N, int V)
{
	o->gf = zero_buf(n);
	o->gb = zero_buf(n);
	o->gi = malloc(n * sizeof(float));
	memcpy(o->gi, x, n * sizeof(float));
	st_cpu_gelu_fwd(o->gf, x, n);
	st_cpu_gelu_bwd(o->gb, x, dout, n);
	st_cpu_gelu_bwd(o->gi, o->gi, dout, n);
	o->lf = zero_buf(N);
	o->lb = zero_buf(N);
	o->dl = malloc((size_t)N * V * sizeof(float));
	memcpy(o->dl, logits, (size_t)N * V * sizeof(float));
	st_cpu_crossentropy_fwd(o->lf, logits, tg, N, V);
	st_cpu_crossentropy_bwd(o->dl, o->lb, o->dl, tg, 0.37f, N, V);
}

static void isa_free(struct isa_out *o)
{
	free(o->gf); free(o->gb); free(o->gi); free(o->lf); free(o->lb); free(o->dl);
}

/* Every ISA this cpu has, at 1, 2 and 3 threads, against the baseline loops
 * at one thread, bit for bit: sizes with every remainder of 16 lanes, the
 * gpt2 vocabulary, NaN, infinities, zeros of both signs and saturating
 * inputs. */
static void test_isa_bitwise(void **state)
{
	(void)state;
	const enum st_cpu_isa top = st_cpu_isa();
	const int saved = omp_get_max_threads();
	const size_t sizes[] = { 1, 15, 17, 40000 + 13 };
	const int vocabs[] = { 1, 7, 33, 1001, 50257 };
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		for (size_t vi = 0; vi < sizeof(vocabs) / sizeof(vocabs[0]); vi++) {
			const size_t n = sizes[si];
			const int V = vocabs[vi], N = 3;
			float *x = rand_buf(n, 8.0f), *dout = rand_buf(n, 1.0f);
			float *logits = rand_buf((size_t)N * V, 6.0f);
			const float special[] = { NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 100.0f, -100.0f, 88.5f, -87.5f };
			int32_t tg[3];
			for (size_t k = 0; k < sizeof(special) / sizeof(special[0]) && k < n; k++)
				x[n - 1 - k] = special[k];
			for (int r = 0; r < N; r++)
				tg[r] = (int32_t)(rng_u64() % (uint64_t)V);
			if (V > 20) { /* row 1: ties of zeros and a large logit; row 2 one Inf */
				for (int v = 0; v < V; v++)
					logits[(size_t)V + v] = (v % 2) ? 0.0f : -0.0f;
				logits[(size_t)V + 3] = 90.0f;
				logits[(size_t)2 * V + 5] = -INFINITY;
			}
			struct isa_out ref, got;
			omp_set_num_threads(1);
			assert_int_equal(st_cpu_isa_set(ST_CPU_ISA_BASE), ST_CPU_ISA_BASE);
			isa_run(&ref, x, dout, n, logits, tg, N, V);
			for (int isa = ST_CPU_ISA_BASE; isa <= (int)top; isa++) {
				assert_int_equal(st_cpu_isa_set((enum st_cpu_isa)isa), isa);
				for (int t = 1; t <= 3; t++) {
					omp_set_num_threads(t);
					isa_run(&got, x, dout, n, logits, tg, N, V);
					assert_memory_equal(got.gf, ref.gf, n * sizeof(float));
					assert_memory_equal(got.gb, ref.gb, n * sizeof(float));
					assert_memory_equal(got.gi, ref.gi, n * sizeof(float));
					assert_memory_equal(got.lf, ref.lf, (size_t)N * sizeof(float));
					assert_memory_equal(got.lb, ref.lb, (size_t)N * sizeof(float));
					assert_memory_equal(got.dl, ref.dl, (size_t)N * V * sizeof(float));
					isa_free(&got);
				}
			}
			isa_free(&ref);
			free(x); free(dout); free(logits);
		}
	}
	omp_set_num_threads(saved);
	assert_int_equal(st_cpu_isa_set(top), top);
	print_message("elementwise ISA: %s (every one up to it checked)\n", st_cpu_isa_name(top));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bf16),
		cmocka_unit_test(test_matmul),
		cmocka_unit_test(test_layernorm),
		cmocka_unit_test(test_gelu),
		cmocka_unit_test(test_nonfinite),
		cmocka_unit_test(test_embedding),
		cmocka_unit_test(test_attention),
		cmocka_unit_test(test_attention_seg),
		cmocka_unit_test(test_gqa_attention_seg),
		cmocka_unit_test(test_crossentropy),
		cmocka_unit_test(test_threads_bitwise),
		cmocka_unit_test(test_gemm_tiles),
		cmocka_unit_test(test_fill),
		cmocka_unit_test(test_isa_bitwise),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
