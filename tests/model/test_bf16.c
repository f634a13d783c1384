/* The bf16 ops of the cpu compute (kernels_bf16.h) against float64
 * references written here on the same bf16 inputs: each op the GPT-2 bf16
 * path runs, at the dtypes it runs them. A bf16 output may be one bf16
 * rounding away from the float64 value rounded (fp32 accumulation can
 * cross a rounding boundary), so outputs are held to 2^-7 relative (one
 * bf16 ulp) plus a small absolute term; fp32 outputs to 1e-5. Also the
 * rounding itself (ties to even, NaN, overflow), the dry compute and the
 * model's precision check against a compute that lacks one op. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "strata/compute.h"
#include "strata/kernels.h"
#include "compute_internal.h"
#include "kernels_bf16.h"
#include "strata/model.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint16_t bf16;

static uint64_t rng = 1;

static float urand(float s)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return s * ((float)(rng >> 40) / (float)(1u << 24) * 2.0f - 1.0f);
}

static bf16 *bf_rand(size_t n, float s)
{
	bf16 *p = malloc(n * sizeof(bf16));

	for (size_t i = 0; i < n; i++)
		p[i] = st_cpu_bf16_from_f32(urand(s));
	return p;
}

static float *f_rand(size_t n, float s)
{
	float *p = malloc(n * sizeof(float));

	for (size_t i = 0; i < n; i++)
		p[i] = urand(s);
	return p;
}

static double w(const bf16 *p, size_t i)
{
	return (double)st_cpu_f32_from_bf16(p[i]);
}

/* every got[i] (bf16) within one bf16 ulp of ref[i] */
static void near_bf(const char *what, const bf16 *got, const double *ref, size_t n, double abs)
{
	for (size_t i = 0; i < n; i++) {
		double g = w(got, i), tol = fabs(ref[i]) * 0x1p-7 + abs;

		if (!(fabs(g - ref[i]) <= tol))
			fail_msg("%s[%zu]: got %.9g, float64 %.9g", what, i, g, ref[i]);
	}
}

static void near_f(const char *what, const float *got, const double *ref, size_t n,
		   double rel, double abs)
{
	for (size_t i = 0; i < n; i++)
		if (!(fabs((double)got[i] - ref[i]) <= fabs(ref[i]) * rel + abs))
			fail_msg("%s[%zu]: got %.9g, float64 %.9g", what, i, (double)got[i], ref[i]);
}

static void run(struct st_op *op)
{
	st_compute_run(st_compute_cpu(), op);
	assert_int_equal(st_compute_take_error(st_compute_cpu()), 0);
}

#define TB(p, n) st_tensor_1d((p), ST_DTYPE_BF16, (int64_t)(n))
#define TF(p, n) st_tensor_1d((p), ST_DTYPE_F32, (int64_t)(n))

/* ---- rounding ------------------------------------------------------------------ */

/* The nearest bf16 by float64 arithmetic: the two neighbours, the nearer,
 * ties to the even one. */
static bf16 round_ref(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	bf16 lo = (bf16)(u >> 16), hi = (bf16)(lo + 1);
	double dl = fabs((double)f - w(&lo, 0)), dh = fabs((double)f - w(&hi, 0));

	if ((lo & 0x7f80) == 0x7f80) /* inf or NaN: not this test's */
		return lo;
	if (dl < dh)
		return lo;
	if (dh < dl)
		return hi;
	return (lo & 1) ? hi : lo;
}

static void test_round(void **state)
{
	(void)state;
	enum { N = 100000 };
	float *in = malloc(N * sizeof(float));
	bf16 *out = malloc(N * sizeof(bf16));

	for (int i = 0; i < N; i++) {
		uint32_t u = (uint32_t)(rng = rng * 6364136223846793005ull + 1) >> 7;

		u = (u & 0x807fffffu) | ((uint32_t)(100 + i % 50) << 23);
		if (i % 7 == 0)
			u = (u & 0xffff0000u) | 0x8000u; /* an exact tie */
		memcpy(&in[i], &u, 4);
	}
	struct st_op op = { .kind = ST_OP_F32_TO_BF16, .t = { TB(out, N), TF(in, N) },
			    .i = { N } };
	run(&op);
	for (int i = 0; i < N; i++)
		if (out[i] != round_ref(in[i]))
			fail_msg("f32_to_bf16(%a) = 0x%04x, want 0x%04x", (double)in[i], out[i],
				 round_ref(in[i]));
	/* NaN stays NaN, the largest floats round to inf, inf stays */
	float sp[3] = { NAN, 3.4028235e38f, -INFINITY };
	bf16 so[3];
	st_cpu_f32_to_bf16(so, sp, 3);
	assert_true(isnan(st_cpu_f32_from_bf16(so[0])));
	assert_true(isinf(st_cpu_f32_from_bf16(so[1])));
	assert_true(st_cpu_f32_from_bf16(so[2]) == -INFINITY);
	free(in);
	free(out);
}

/* ---- matmuls ---------------------------------------------------------------------- */

enum { MN = 45, MIC = 72, MOC = 56 };

static void test_matmul_fwd(void **state)
{
	(void)state;
	bf16 *inp = bf_rand(MN * MIC, 1.0f), *wt = bf_rand(MIC * MOC, 0.3f);
	bf16 *bias = bf_rand(MOC, 0.5f), *out = malloc(MN * MOC * 2);
	float *outf = malloc(MN * MOC * 4);
	double *ref = malloc(MN * MOC * sizeof(double));

	for (int n = 0; n < MN; n++)
		for (int o = 0; o < MOC; o++) {
			double s = w(bias, o);
			for (int i = 0; i < MIC; i++)
				s += w(inp, n * MIC + i) * w(wt, i * MOC + o);
			ref[n * MOC + o] = s;
		}
	struct st_op op = { .kind = ST_OP_MATMUL_FWD,
			    .t = { TB(out, MN * MOC), TB(inp, MN * MIC), TB(wt, MIC * MOC),
				   TB(bias, MOC) },
			    .i = { MN, MIC, MOC } };
	run(&op);
	near_bf("matmul_fwd bbbb", out, ref, MN * MOC, 1e-6);
	op.t[0] = TF(outf, MN * MOC);
	run(&op);
	near_f("matmul_fwd fbbb", outf, ref, MN * MOC, 1e-5, 1e-6);
	/* a kernel that dropped the bias would not pass */
	op.t[3] = TB(NULL, MOC);
	run(&op);
	int off = 0;
	for (int i = 0; i < MN * MOC; i++)
		off += fabs(outf[i] - ref[i]) > 1e-3;
	assert_true(off > MN * MOC / 2);
	free(inp); free(wt); free(bias); free(out); free(outf); free(ref);
}

static void test_matmul_bwd(void **state)
{
	(void)state;
	bf16 *dout = bf_rand(MN * MOC, 1.0f), *inp = bf_rand(MN * MIC, 1.0f);
	bf16 *wt = bf_rand(MIC * MOC, 0.3f), *dinp = bf_rand(MN * MIC, 0.5f);
	float *dw = f_rand(MIC * MOC, 0.5f), *db = f_rand(MOC, 0.5f);
	double *rdi = malloc(MN * MIC * 8), *rdw = malloc(MIC * MOC * 8), *rdb = malloc(MOC * 8);

	for (int n = 0; n < MN; n++)
		for (int i = 0; i < MIC; i++) {
			double s = w(dinp, n * MIC + i);
			for (int o = 0; o < MOC; o++)
				s += w(dout, n * MOC + o) * w(wt, i * MOC + o);
			rdi[n * MIC + i] = s;
		}
	for (int i = 0; i < MIC; i++)
		for (int o = 0; o < MOC; o++) {
			double s = dw[i * MOC + o];
			for (int n = 0; n < MN; n++)
				s += w(inp, n * MIC + i) * w(dout, n * MOC + o);
			rdw[i * MOC + o] = s;
		}
	for (int o = 0; o < MOC; o++) {
		double s = db[o];
		for (int n = 0; n < MN; n++)
			s += w(dout, n * MOC + o);
		rdb[o] = s;
	}
	struct st_op op = { .kind = ST_OP_MATMUL_BWD,
			    .t = { TB(dinp, MN * MIC), TF(dw, MIC * MOC), TF(db, MOC),
				   TB(dout, MN * MOC), TB(inp, MN * MIC), TB(wt, MIC * MOC) },
			    .i = { MN, MIC, MOC } };
	run(&op);
	near_bf("matmul_bwd dinp", dinp, rdi, MN * MIC, 1e-6);
	near_f("matmul_bwd dweight", dw, rdw, MIC * MOC, 1e-5, 1e-5);
	near_f("matmul_bwd dbias", db, rdb, MOC, 1e-5, 1e-5);
	free(dout); free(inp); free(wt); free(dinp); free(dw); free(db);
	free(rdi); free(rdw); free(rdb);
}

/* the head's: C fp32 (+)= op(A) @ op(B), A and B bf16, each transpose */
static void test_gemm(void **state)
{
	(void)state;
	enum { M = 23, N = 41, K = 37 };
	for (int ta = 0; ta < 2; ta++)
		for (int tb = 0; tb < 2; tb++) {
			int lda = ta ? M : K, ldb = tb ? K : N;
			bf16 *A = bf_rand((size_t)(ta ? K : M) * lda, 1.0f);
			bf16 *B = bf_rand((size_t)(tb ? N : K) * ldb, 1.0f);
			float *C = f_rand(M * N, 1.0f);
			double ref[M * N];

			for (int i = 0; i < M; i++)
				for (int j = 0; j < N; j++) {
					double s = C[i * N + j];
					for (int k = 0; k < K; k++)
						s += w(A, ta ? (size_t)k * lda + i : (size_t)i * lda + k) *
						     w(B, tb ? (size_t)j * ldb + k : (size_t)k * ldb + j);
					ref[i * N + j] = s;
				}
			struct st_op op = st_op_gemm_bf16(ta, tb, M, N, K, A, lda, B, ldb, 1.0f, C, N);
			run(&op);
			near_f("gemm bbf", C, ref, M * N, 1e-5, 1e-5);
			free(A); free(B); free(C);
		}
}

/* ---- norms, GELU, embedding ----------------------------------------------------------- */

enum { LN = 19, LC = 96 };

static void test_layernorm(void **state)
{
	(void)state;
	float *x = f_rand(LN * LC, 2.0f), *mean = malloc(LN * 4), *rstd = malloc(LN * 4);
	bf16 *g = bf_rand(LC, 1.0f), *b = bf_rand(LC, 0.5f), *out = malloc(LN * LC * 2);
	double ref[LN * LC], rm[LN], rr[LN];

	for (int n = 0; n < LN; n++) {
		double m = 0, v = 0;
		for (int c = 0; c < LC; c++)
			m += x[n * LC + c];
		m /= LC;
		for (int c = 0; c < LC; c++)
			v += (x[n * LC + c] - m) * (x[n * LC + c] - m);
		v /= LC;
		rm[n] = m;
		rr[n] = 1.0 / sqrt(v + 1e-5);
		for (int c = 0; c < LC; c++)
			ref[n * LC + c] = (x[n * LC + c] - m) * rr[n] * w(g, c) + w(b, c);
	}
	struct st_op op = { .kind = ST_OP_LAYERNORM_FWD,
			    .t = { TB(out, LN * LC), TF(mean, LN), TF(rstd, LN), TF(x, LN * LC),
				   TB(g, LC), TB(b, LC) },
			    .i = { LN, LC } };
	run(&op);
	near_bf("layernorm_fwd out", out, ref, LN * LC, 1e-6);
	near_f("layernorm_fwd mean", mean, rm, LN, 1e-5, 1e-6);
	near_f("layernorm_fwd rstd", rstd, rr, LN, 1e-5, 1e-6);

	/* backward: dx (fp32) += d/dx of sum(dout * out), dout bf16 */
	bf16 *dout = bf_rand(LN * LC, 1.0f);
	float *dx = f_rand(LN * LC, 0.5f), *dg = f_rand(LC, 0.5f), *dbb = f_rand(LC, 0.5f);
	double rdx[LN * LC], rdg[LC], rdb[LC];
	for (int c = 0; c < LC; c++) {
		rdg[c] = dg[c];
		rdb[c] = dbb[c];
	}
	for (int n = 0; n < LN; n++) {
		double s1 = 0, s2 = 0;
		for (int c = 0; c < LC; c++) {
			double xh = (x[n * LC + c] - rm[n]) * rr[n], dh = w(dout, n * LC + c) * w(g, c);
			s1 += dh;
			s2 += dh * xh;
			rdg[c] += w(dout, n * LC + c) * xh;
			rdb[c] += w(dout, n * LC + c);
		}
		for (int c = 0; c < LC; c++) {
			double xh = (x[n * LC + c] - rm[n]) * rr[n], dh = w(dout, n * LC + c) * w(g, c);
			rdx[n * LC + c] = dx[n * LC + c] + rr[n] * (dh - s1 / LC - xh * s2 / LC);
		}
	}
	struct st_op ob = { .kind = ST_OP_LAYERNORM_BWD,
			    .t = { TF(dx, LN * LC), TF(dg, LC), TF(dbb, LC), TB(dout, LN * LC),
				   TF(x, LN * LC), TB(g, LC), TF(mean, LN), TF(rstd, LN) },
			    .i = { LN, LC } };
	run(&ob);
	near_f("layernorm_bwd dx", dx, rdx, LN * LC, 1e-4, 1e-5);
	near_f("layernorm_bwd dweight", dg, rdg, LC, 1e-4, 1e-5);
	near_f("layernorm_bwd dbias", dbb, rdb, LC, 1e-5, 1e-5);
	free(x); free(mean); free(rstd); free(g); free(b); free(out);
	free(dout); free(dx); free(dg); free(dbb);
}

/* LLaMA's norm: out (bf16) = x * rstd * g from the fp32 residual stream;
 * the backward's dx fp32, from a bf16 dout */
static void test_rmsnorm(void **state)
{
	(void)state;
	float *x = f_rand(LN * LC, 2.0f), *rstd = malloc(LN * 4);
	bf16 *g = bf_rand(LC, 1.0f), *out = malloc(LN * LC * 2), *dout = bf_rand(LN * LC, 1.0f);
	float *dx = f_rand(LN * LC, 0.5f), *dg = f_rand(LC, 0.5f);
	double ref[LN * LC], rr[LN], rdx[LN * LC], rdg[LC];

	for (int n = 0; n < LN; n++) {
		double ms = 0;
		for (int c = 0; c < LC; c++)
			ms += (double)x[n * LC + c] * x[n * LC + c];
		rr[n] = 1.0 / sqrt(ms / LC + 1e-5);
		for (int c = 0; c < LC; c++)
			ref[n * LC + c] = x[n * LC + c] * rr[n] * w(g, c);
	}
	struct st_op op = { .kind = ST_OP_RMSNORM_FWD,
			    .t = { TB(out, LN * LC), TF(rstd, LN), TF(x, LN * LC), TB(g, LC) },
			    .i = { LN, LC }, .f = { 1e-5f } };
	run(&op);
	near_bf("rmsnorm_fwd out", out, ref, LN * LC, 1e-6);
	near_f("rmsnorm_fwd rstd", rstd, rr, LN, 1e-5, 1e-6);

	for (int c = 0; c < LC; c++)
		rdg[c] = dg[c];
	for (int n = 0; n < LN; n++) {
		double s = 0;
		for (int c = 0; c < LC; c++) {
			double xh = x[n * LC + c] * rr[n];
			s += w(dout, n * LC + c) * w(g, c) * xh;
			rdg[c] += w(dout, n * LC + c) * xh;
		}
		for (int c = 0; c < LC; c++) {
			double xh = x[n * LC + c] * rr[n];
			rdx[n * LC + c] = dx[n * LC + c] +
					  rr[n] * (w(dout, n * LC + c) * w(g, c) - xh * s / LC);
		}
	}
	struct st_op ob = { .kind = ST_OP_RMSNORM_BWD,
			    .t = { TF(dx, LN * LC), TF(dg, LC), TB(dout, LN * LC), TF(x, LN * LC),
				   TB(g, LC), TF(rstd, LN) },
			    .i = { LN, LC } };
	run(&ob);
	near_f("rmsnorm_bwd dx", dx, rdx, LN * LC, 1e-4, 1e-5);
	near_f("rmsnorm_bwd dweight", dg, rdg, LC, 1e-4, 1e-5);
	free(x); free(rstd); free(g); free(out); free(dout); free(dx); free(dg);
}

static double silu(double x)
{
	return x / (1.0 + exp(-x));
}

/* LLaMA's MLP activation: act = silu(gate) * up, all bf16; the backward
 * overwrites dgate and dup (bf16) */
static void test_swiglu(void **state)
{
	(void)state;
	enum { N = 5000 };
	bf16 *ga = bf_rand(N, 6.0f), *up = bf_rand(N, 2.0f), *dy = bf_rand(N, 1.0f);
	bf16 *y = malloc(N * 2), *dg = malloc(N * 2), *du = malloc(N * 2);
	double ref[N], rg[N], ru[N];

	for (int i = 0; i < N; i++) {
		double a = w(ga, i), s = 1.0 / (1.0 + exp(-a));
		ref[i] = silu(a) * w(up, i);
		rg[i] = w(dy, i) * w(up, i) * s * (1.0 + a * (1.0 - s));
		ru[i] = w(dy, i) * silu(a);
	}
	struct st_op op = { .kind = ST_OP_SWIGLU_FWD, .t = { TB(y, N), TB(ga, N), TB(up, N) },
			    .i = { N } };
	run(&op);
	near_bf("swiglu_fwd", y, ref, N, 1e-6);
	struct st_op ob = { .kind = ST_OP_SWIGLU_BWD,
			    .t = { TB(dg, N), TB(du, N), TB(dy, N), TB(ga, N), TB(up, N) },
			    .i = { N } };
	run(&ob);
	near_bf("swiglu_bwd dgate", dg, rg, N, 1e-5);
	near_bf("swiglu_bwd dup", du, ru, N, 1e-5);
	free(ga); free(up); free(dy); free(y); free(dg); free(du);
}

static double gelu(double x)
{
	return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void test_gelu(void **state)
{
	(void)state;
	enum { N = 5000 };
	bf16 *x = bf_rand(N, 4.0f), *y = malloc(N * 2), *dy = bf_rand(N, 1.0f);
	bf16 *dx = malloc(N * 2);
	double ref[N], rd[N];

	for (int i = 0; i < N; i++) {
		double v = w(x, i), h = 1e-6;
		ref[i] = gelu(v);
		rd[i] = w(dy, i) * (gelu(v + h) - gelu(v - h)) / (2 * h);
	}
	struct st_op op = { .kind = ST_OP_GELU_FWD, .t = { TB(y, N), TB(x, N) }, .i = { N } };
	run(&op);
	near_bf("gelu_fwd", y, ref, N, 1e-6);
	struct st_op ob = { .kind = ST_OP_GELU_BWD, .t = { TB(dx, N), TB(x, N), TB(dy, N) },
			    .i = { N } };
	run(&ob);
	near_bf("gelu_bwd", dx, rd, N, 1e-5);
	free(x); free(y); free(dy); free(dx);
}

static void test_embedding(void **state)
{
	(void)state;
	enum { B = 2, T = 7, C = 32, V = 11 };
	int32_t tok[B * T];
	bf16 *wte = bf_rand(V * C, 1.0f), *wpe = bf_rand(T * C, 1.0f);
	float out[B * T * C];
	double ref[B * T * C];

	for (int i = 0; i < B * T; i++)
		tok[i] = (i * 5 + 3) % V;
	for (int i = 0; i < B * T; i++)
		for (int c = 0; c < C; c++)
			ref[i * C + c] = w(wte, tok[i] * C + c) + w(wpe, (i % T) * C + c);
	struct st_op op = { .kind = ST_OP_EMBEDDING_FWD,
			    .t = { TF(out, B * T * C), st_tensor_1d(tok, ST_DTYPE_I32, B * T),
				   st_tensor_2d(wte, ST_DTYPE_BF16, V, C),
				   st_tensor_2d(wpe, ST_DTYPE_BF16, T, C) },
			    .i = { B, T, C } };
	run(&op);
	near_f("embedding_fwd fibb", out, ref, B * T * C, 1e-7, 0);
	free(wte); free(wpe);
}

/* ---- attention (the reference the cuda bf16 attention is held to) ------------------ */

enum { AB = 2, AT = 29, AC = 64, ANH = 4 };

/* float64 causal attention of the bf16 qkv, and its backward */
static void att_ref(const bf16 *qkv, const bf16 *dout, double *out, double *lse, double *dqkv)
{
	const int hd = AC / ANH, C3 = 3 * AC;
	const double sc = 1.0 / sqrt(hd);
	double P[AT][AT], dP[AT][AT];

	for (int b = 0; b < AB; b++)
		for (int h = 0; h < ANH; h++) {
#define Q(t, d) w(qkv, ((size_t)b * AT + (t)) * C3 + h * hd + (d))
#define K(t, d) w(qkv, ((size_t)b * AT + (t)) * C3 + AC + h * hd + (d))
#define Vv(t, d) w(qkv, ((size_t)b * AT + (t)) * C3 + 2 * AC + h * hd + (d))
#define DO(t, d) w(dout, ((size_t)b * AT + (t)) * AC + h * hd + (d))
			for (int i = 0; i < AT; i++) {
				double mx = -INFINITY, s = 0;
				for (int j = 0; j <= i; j++) {
					double d = 0;
					for (int k = 0; k < hd; k++)
						d += Q(i, k) * K(j, k);
					P[i][j] = d * sc;
					mx = fmax(mx, P[i][j]);
				}
				for (int j = 0; j <= i; j++)
					s += exp(P[i][j] - mx);
				lse[((size_t)b * ANH + h) * AT + i] = mx + log(s);
				for (int j = 0; j <= i; j++)
					P[i][j] = exp(P[i][j] - mx) / s;
				for (int k = 0; k < hd; k++) {
					double o = 0;
					for (int j = 0; j <= i; j++)
						o += P[i][j] * Vv(j, k);
					out[((size_t)b * AT + i) * AC + h * hd + k] = o;
				}
			}
			for (int i = 0; i < AT; i++) {
				double rs = 0;
				for (int j = 0; j <= i; j++) {
					double d = 0;
					for (int k = 0; k < hd; k++)
						d += DO(i, k) * Vv(j, k);
					dP[i][j] = d;
					rs += d * P[i][j];
				}
				for (int j = 0; j <= i; j++)
					dP[i][j] = P[i][j] * (dP[i][j] - rs) * sc; /* dS */
			}
			for (int i = 0; i < AT; i++)
				for (int k = 0; k < hd; k++) {
					double dq = 0, dk = 0, dv = 0;
					for (int j = 0; j <= i; j++)
						dq += dP[i][j] * K(j, k);
					for (int j = i; j < AT; j++) {
						dk += dP[j][i] * Q(j, k);
						dv += P[j][i] * DO(j, k);
					}
					size_t r = ((size_t)b * AT + i) * C3 + h * hd + k;
					dqkv[r] += dq;
					dqkv[r + AC] += dk;
					dqkv[r + 2 * AC] += dv;
				}
#undef Q
#undef K
#undef Vv
#undef DO
		}
}

static void test_attention(void **state)
{
	(void)state;
	const size_t NC = (size_t)AB * AT * AC;
	bf16 *qkv = bf_rand(3 * NC, 1.5f), *dout = bf_rand(NC, 1.0f), *out = malloc(NC * 2);
	bf16 *dqkv = bf_rand(3 * NC, 0.25f);
	float *lse = malloc(AB * ANH * AT * 4);
	double *rout = malloc(NC * 8), *rlse = malloc(AB * ANH * AT * 8);
	double *rdq = malloc(3 * NC * 8);

	for (size_t i = 0; i < 3 * NC; i++)
		rdq[i] = w(dqkv, i);
	att_ref(qkv, dout, rout, rlse, rdq);
	st_cpu_attention_fwd_bf16(out, lse, qkv, AB, AT, AC, ANH);
	near_bf("attention_fwd out", out, rout, NC, 1e-5);
	near_f("attention_fwd lse", lse, rlse, AB * ANH * AT, 1e-5, 1e-5);
	st_cpu_attention_bwd_bf16(dqkv, dout, qkv, out, lse, AB, AT, AC, ANH);
	/* the kernel's row sums use the bf16 out it is given: a bf16 error
	 * of the gradient's scale */
	for (size_t i = 0; i < 3 * NC; i++) {
		double g = w(dqkv, i);
		if (!(fabs(g - rdq[i]) <= fabs(rdq[i]) * 0x1p-6 + 4e-3))
			fail_msg("attention_bwd dqkv[%zu]: got %.9g, float64 %.9g", i, g, rdq[i]);
	}
	/* the op record and the named function are the same thing */
	bf16 *out2 = malloc(NC * 2);
	float *lse2 = malloc(AB * ANH * AT * 4);
	struct st_op op = { .kind = ST_OP_ATTENTION_FWD,
			    .t = { TB(out2, NC), TF(lse2, AB * ANH * AT), TB(qkv, 3 * NC),
				   st_tensor_1d(NULL, ST_DTYPE_I32, AB * AT) },
			    .i = { AB, AT, AC, ANH } };
	run(&op);
	assert_memory_equal(out, out2, NC * 2);
	free(qkv); free(dout); free(out); free(dqkv); free(lse); free(rout); free(rlse);
	free(rdq); free(out2); free(lse2);
}

/* ---- the precision check ---------------------------------------------------------------- */

/* A compute that runs what the cpu does except attention_bwd and
 * gqa_attention_bwd in bf16: a device that lacks one op of each family's
 * bf16 path. */
static bool lacks_supports(const struct st_compute *c, enum st_op_kind kind,
			   const enum st_dtype *dt)
{
	(void)c;
	if ((kind == ST_OP_ATTENTION_BWD || kind == ST_OP_GQA_ATTENTION_BWD) &&
	    dt[0] == ST_DTYPE_BF16)
		return false;
	return st_compute_supports(st_compute_cpu(), kind, dt);
}

static int nop(struct st_compute *c)
{
	(void)c;
	return 0;
}

static int nop_run(struct st_compute *c, const struct st_op *op)
{
	(void)c;
	(void)op;
	return 0;
}

static void nop_destroy(struct st_compute *c)
{
	(void)c;
}

static int nop_copy(struct st_compute *c, void *d, const void *s, size_t n)
{
	(void)c;
	memcpy(d, s, n);
	return 0;
}

static void test_precision_check(void **state)
{
	(void)state;
	static const struct st_compute_ops lacks_ops = {
		.name = "lacks", .run = nop_run, .supports = lacks_supports, .sync = nop,
		.destroy = nop_destroy, .to_host = nop_copy, .from_host = nop_copy,
	};
	struct st_compute lacks = { .ops = &lacks_ops };
	struct st_model_config cfg;
	struct st_model *m;

	assert_int_equal(st_model_config_parse("layers=2,dim=64,heads=4,vocab=300,ctx=32", &cfg), 0);
	assert_int_equal(st_model_create(&cfg, &m), 0);
	assert_int_equal(st_model_precision_check(m), 0); /* fp32 on the cpu */
	assert_int_equal(st_model_set_precision(m, ST_PRECISION_BF16), 0);
	assert_int_equal(st_model_precision_check(m), 0); /* bf16 on the cpu */
	st_model_set_compute(m, &lacks);
	assert_int_equal(st_model_precision_check(m), 0 - ENOTSUP);
	assert_non_null(strstr(st_error_last(), "attention_bwd"));
	assert_non_null(strstr(st_error_last(), "'lacks'"));
	assert_non_null(strstr(st_error_last(), "bf16"));
	assert_int_equal(st_model_set_precision(m, ST_PRECISION_FP32), 0);
	assert_int_equal(st_model_precision_check(m), 0); /* fp32 needs no bf16 op */
	st_model_destroy(m);
	/* LLaMA likewise */
	assert_int_equal(st_model_config_parse("llama:layers=2,dim=64,heads=4,kv-heads=2,ffn=96,"
					       "vocab=300,ctx=32,bias=1",
					       &cfg),
			 0);
	assert_int_equal(st_model_create(&cfg, &m), 0);
	assert_int_equal(st_model_set_precision(m, ST_PRECISION_BF16), 0);
	assert_int_equal(st_model_precision_check(m), 0); /* bf16 on the cpu */
	st_model_set_compute(m, &lacks);
	assert_int_equal(st_model_precision_check(m), 0 - ENOTSUP);
	assert_non_null(strstr(st_error_last(), "gqa_attention_bwd"));
	assert_int_equal(st_model_set_precision(m, ST_PRECISION_FP32), 0);
	assert_int_equal(st_model_precision_check(m), 0);
	st_model_destroy(m);
}

/* A compute that runs what the cpu does, but the bf16 attention ops only
 * at head size 64 or 128 (its supports_shape hook: the cuda compute's
 * rule, st_compute_cuda_supports_shape(), where the build has it). The
 * dtypes alone let every record through: only the shapes refuse. */
static bool heads_shape(const struct st_compute *c, const struct st_op *op, char *why,
			size_t why_bytes)
{
	(void)c;
#ifdef ST_HAVE_CUDA
	return st_compute_cuda_supports_shape(op, why, why_bytes);
#else
	int64_t hs;

	if ((op->kind == ST_OP_ATTENTION_FWD || op->kind == ST_OP_ATTENTION_BWD) &&
	    op->t[2].dtype == ST_DTYPE_BF16)
		hs = op->i[2] / op->i[3];
	else if (op->kind == ST_OP_GQA_ATTENTION_FWD && op->t[2].dtype == ST_DTYPE_BF16)
		hs = op->i[4];
	else if (op->kind == ST_OP_GQA_ATTENTION_BWD && op->t[4].dtype == ST_DTYPE_BF16)
		hs = op->i[4];
	else
		return true;
	if (hs == 64 || hs == 128)
		return true;
	snprintf(why, why_bytes, "head size %lld", (long long)hs);
	return false;
#endif
}

static bool cpu_supports(const struct st_compute *c, enum st_op_kind kind,
			 const enum st_dtype *dt)
{
	(void)c;
	return st_compute_supports(st_compute_cpu(), kind, dt);
}

/* The precision check refuses, before any step, a bf16 model whose
 * attention the compute runs at its dtypes but not at its head size (one
 * line naming the op and the head size), and passes the same family at a
 * head size the compute runs, and at fp32. The dry compute the check runs
 * on must ask the real one's shape rule for that (without it the check
 * passes and the step fails on the GPU). */
static void test_precision_check_shapes(void **state)
{
	(void)state;
	static const struct st_compute_ops heads_ops = {
		.name = "heads", .run = nop_run, .supports = cpu_supports, .sync = nop,
		.destroy = nop_destroy, .to_host = nop_copy, .from_host = nop_copy,
		.supports_shape = heads_shape,
	};
	struct st_compute heads = { .ops = &heads_ops };
	static const struct {
		const char *model, *op;
		bool ok;
	} rows[] = {
		{ "layers=1,dim=64,heads=4,vocab=300,ctx=32", "attention_fwd", false }, /* 16 */
		{ "layers=1,dim=96,heads=4,vocab=300,ctx=32", "attention_fwd", false }, /* 24 */
		{ "layers=1,dim=64,heads=1,vocab=300,ctx=32", NULL, true },             /* 64 */
		{ "layers=1,dim=256,heads=2,vocab=300,ctx=32", NULL, true },            /* 128 */
		{ "llama:layers=1,dim=64,heads=4,kv-heads=2,ffn=96,vocab=300,ctx=32",
		  "gqa_attention_fwd", false },
		{ "llama:layers=1,dim=128,heads=2,kv-heads=1,ffn=96,vocab=300,ctx=32", NULL, true },
	};

	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
		struct st_model_config cfg;
		struct st_model *m;

		assert_int_equal(st_model_config_parse(rows[r].model, &cfg), 0);
		assert_int_equal(st_model_create(&cfg, &m), 0);
		st_model_set_compute(m, &heads);
		assert_int_equal(st_model_precision_check(m), 0); /* fp32: no bf16 attention */
		assert_int_equal(st_model_set_precision(m, ST_PRECISION_BF16), 0);
		if (rows[r].ok) {
			if (st_model_precision_check(m) != 0)
				fail_msg("%s: refused: %s", rows[r].model, st_error_last());
		} else {
			char hs[32];

			snprintf(hs, sizeof(hs), "head size %d", cfg.dim / cfg.n_head);
			assert_int_equal(st_model_precision_check(m), 0 - ENOTSUP);
			if (!strstr(st_error_last(), rows[r].op) || !strstr(st_error_last(), hs) ||
			    !strstr(st_error_last(), "'heads'") ||
			    !strstr(st_error_last(), "--compute-dtype bf16") ||
			    strchr(st_error_last(), '\n'))
				fail_msg("%s: the refusal is not one line naming %s and %s: %s",
					 rows[r].model, rows[r].op, hs, st_error_last());
		}
		st_model_destroy(m);
	}

	/* the seam itself: supports_op and run see the shape, supports() does not */
	enum { B = 1, T = 4, C = 64, NH = 4 };
	struct st_op op = { .kind = ST_OP_ATTENTION_FWD,
			    .t = { st_tensor_1d(NULL, ST_DTYPE_BF16, B * T * C),
				   st_tensor_1d(NULL, ST_DTYPE_F32, B * NH * T),
				   st_tensor_1d(NULL, ST_DTYPE_BF16, B * T * 3 * C),
				   st_tensor_1d(NULL, ST_DTYPE_I32, B * T) },
			    .i = { B, T, C, NH } };
	enum st_dtype dt[4] = { ST_DTYPE_BF16, ST_DTYPE_F32, ST_DTYPE_BF16, ST_DTYPE_I32 };

	assert_true(st_compute_supports(&heads, op.kind, dt));
	assert_false(st_compute_supports_op(&heads, &op));
	st_compute_run(&heads, &op);
	assert_int_equal(st_compute_take_error(&heads), 0 - ENOTSUP);
	assert_non_null(strstr(st_error_last(), "at this shape: head size 16"));
	op.i[3] = 1; /* head size 64 */
	assert_true(st_compute_supports_op(&heads, &op));
}

/* ---- the head's fused op ------------------------------------------------------------- */

/* The cpu compute, counting HEAD_CROSSENTROPY records (wrap_ops) or
 * refusing them (refuse_ops): the model must then run its chunk loop. */
static int head_ops_run;

static bool wrap_supports(const struct st_compute *c, enum st_op_kind kind,
			  const enum st_dtype *dt)
{
	(void)c;
	return st_compute_supports(st_compute_cpu(), kind, dt);
}

static bool refuse_supports(const struct st_compute *c, enum st_op_kind kind,
			    const enum st_dtype *dt)
{
	return kind != ST_OP_HEAD_CROSSENTROPY && wrap_supports(c, kind, dt);
}

static int wrap_run(struct st_compute *c, const struct st_op *op)
{
	(void)c;
	head_ops_run += op->kind == ST_OP_HEAD_CROSSENTROPY;
	st_compute_run(st_compute_cpu(), op);
	return st_compute_take_error(st_compute_cpu());
}

/* The bf16 head's forward and backward through HEAD_CROSSENTROPY give the
 * chunk loop's bits (two chunks: 320 rows), loss, dx and both gradients:
 * the cpu device's numbers do not change with the fused op. One head for
 * every family (head.c): GPT-2's over LayerNorm and the tied wte,
 * LLaMA's over RMSNorm with its own lm_head, and tied. */
static void head_fused_bits(const char *model)
{
	static const struct st_compute_ops wrap_ops = {
		.name = "wrap", .run = wrap_run, .supports = wrap_supports, .sync = nop,
		.destroy = nop_destroy, .to_host = nop_copy, .from_host = nop_copy,
	};
	static const struct st_compute_ops refuse_ops = {
		.name = "refuse", .run = wrap_run, .supports = refuse_supports, .sync = nop,
		.destroy = nop_destroy, .to_host = nop_copy, .from_host = nop_copy,
	};
	struct st_compute wrap = { .ops = &wrap_ops }, refuse = { .ops = &refuse_ops };
	struct st_compute *cs[2] = { &wrap, &refuse };
	struct st_model_config cfg;
	struct st_model *m;
	const int B = 10, T = 32;

	assert_int_equal(st_model_config_parse(model, &cfg), 0);
	assert_int_equal(st_model_create(&cfg, &m), 0);
	assert_int_equal(st_model_set_precision(m, ST_PRECISION_BF16), 0);
	const int H = st_model_unit_count(m) - 1, N = B * T, C = cfg.dim;
	const size_t eh = st_model_unit_layout(m, H)->elems, e0 = st_model_unit_layout(m, 0)->elems;
	float *f = malloc(4 * (eh > e0 ? eh : e0));
	bf16 *ph = malloc(2 * eh), *p0 = malloc(2 * e0);
	assert_int_equal(st_model_init_unit(m, H, 5, f), 0);
	st_cpu_f32_to_bf16(ph, f, eh);
	assert_int_equal(st_model_init_unit(m, 0, 5, f), 0);
	st_cpu_f32_to_bf16(p0, f, e0);
	float *x = malloc(4 * (size_t)N * C);
	int32_t *tgt = malloc(4 * (size_t)N), *tok = calloc((size_t)N, 4);
	for (size_t i = 0; i < (size_t)N * C; i++)
		x[i] = urand(2.0f);
	for (int i = 0; i < N; i++)
		tgt[i] = (int32_t)(urand(0.5f) * 299.0f + 150.0f);
	struct st_model_batch b = { .B = B, .T = T, .tokens = tok, .targets = tgt,
				    .loss_scale = 1.0f };
	const size_t wb = st_model_work_bytes(m, H, B, T);
	void *work = malloc(wb);
	float *dx[2], *gh[2], *g0[2], loss[2], lf[2];

	for (int k = 0; k < 2; k++) {
		dx[k] = malloc(4 * (size_t)N * C);
		gh[k] = calloc(eh, 4);
		g0[k] = calloc(e0, 4);
		st_model_set_compute(m, cs[k]);
		head_ops_run = 0;
		assert_int_equal(st_model_bwd(m, H, &b, (const float *)ph, (const float *)p0, x, NULL,
					      dx[k], gh[k], g0[k], &loss[k], work, wb),
				 0);
		assert_int_equal(st_model_fwd(m, H, &b, (const float *)ph, (const float *)p0, x, NULL,
					      &lf[k], work, wb),
				 0);
		assert_int_equal(head_ops_run, k == 0 ? 2 : 0); /* bwd and fwd: one op each */
	}
	assert_true(isfinite(loss[0]) && loss[0] > 0.0f);
	assert_memory_equal(&loss[0], &loss[1], sizeof(float));
	assert_memory_equal(&lf[0], &lf[1], sizeof(float));
	assert_memory_equal(dx[0], dx[1], 4 * (size_t)N * C);
	assert_memory_equal(gh[0], gh[1], 4 * eh);
	assert_memory_equal(g0[0], g0[1], 4 * e0);
	for (int k = 0; k < 2; k++)
		free(dx[k]), free(gh[k]), free(g0[k]);
	free(f), free(ph), free(p0), free(x), free(tgt), free(tok), free(work);
	st_model_destroy(m);
}

static void test_head_fused_bits(void **state)
{
	(void)state;
	head_fused_bits("layers=1,dim=64,heads=4,vocab=300,ctx=32");
	head_fused_bits("llama:layers=1,dim=64,heads=4,kv-heads=2,ffn=96,vocab=300,ctx=32");
	head_fused_bits("llama:layers=1,dim=64,heads=4,kv-heads=2,ffn=96,vocab=300,ctx=32,tied=1");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round),
		cmocka_unit_test(test_matmul_fwd),
		cmocka_unit_test(test_matmul_bwd),
		cmocka_unit_test(test_gemm),
		cmocka_unit_test(test_layernorm),
		cmocka_unit_test(test_rmsnorm),
		cmocka_unit_test(test_swiglu),
		cmocka_unit_test(test_gelu),
		cmocka_unit_test(test_embedding),
		cmocka_unit_test(test_attention),
		cmocka_unit_test(test_precision_check),
		cmocka_unit_test(test_precision_check_shapes),
		cmocka_unit_test(test_head_fused_bits),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
