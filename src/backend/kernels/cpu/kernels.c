/* strata: cpu device kernels. See include/strata/kernels.h for the
 * conventions (output first, backward accumulates, deterministic at any
 * thread count). */
#include "strata/kernels.h"

#include "strata/common.h"

#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <string.h>

/* Fixed partitions. They depend only on shapes, never on the thread count,
 * which is what makes every reduction bit-identical at any thread count. */
#define ST_GEMM_TILES 4        /* matmul tasks: 2 each for 2 threads */
#define ST_GEMM_TILE_MIN 64    /* a tile's least rows or columns */
#define ST_COL_BLOCK 64        /* columns per task in reductions over rows */
#define ST_CONV_CHUNK 65536    /* elements per task in bf16 conversions */
#define ST_FILL_CHUNK (1u << 20) /* bytes per task in zeroing and copies */

#include "cpu_attention.h" /* st_att_online_softmax(), ST_ATT_BLOCK */
#include "cpu_expf.h" /* st_expf() */
#include "cpu_isa.h"

/* ---- the elementwise loops' ISA (cpu_isa.h) ----------------------------------- */

static int isa_cached = -1; /* -1: not yet read from the cpu */

static enum st_cpu_isa isa_of_cpu(void)
{
#if defined(ST_X86_64)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f"))
		return ST_CPU_ISA_AVX512;
	if (__builtin_cpu_supports("avx2"))
		return ST_CPU_ISA_AVX2;
#endif
	return ST_CPU_ISA_BASE;
}

enum st_cpu_isa st_cpu_isa(void)
{
	int isa = __atomic_load_n(&isa_cached, __ATOMIC_RELAXED);

	if (isa < 0) {
		isa = (int)isa_of_cpu();
		__atomic_store_n(&isa_cached, isa, __ATOMIC_RELAXED);
	}
	return (enum st_cpu_isa)isa;
}

enum st_cpu_isa st_cpu_isa_set(enum st_cpu_isa isa)
{
	enum st_cpu_isa top = isa_of_cpu();

	__atomic_store_n(&isa_cached, (int)(isa < top ? isa : top), __ATOMIC_RELAXED);
	return st_cpu_isa();
}

const char *st_cpu_isa_name(enum st_cpu_isa isa)
{
	switch (isa) {
	case ST_CPU_ISA_BASE: return "base";
	case ST_CPU_ISA_AVX2: return "avx2";
	case ST_CPU_ISA_AVX512: return "avx512";
	}
	return "unknown";
}

/* ST_ISA_VARIANTS(name, (params), (args)): name_run(isa, params) runs the
 * always-inlined name_span(args) compiled for the baseline, AVX2 or
 * AVX-512F. The span's loop must be elementwise: then every variant gives
 * the baseline's bits (no fma: -ffp-contract=off). */
#define ST_SPAN static inline __attribute__((always_inline))
#if defined(ST_X86_64)
#define ST_ISA_VARIANTS(name, params, args)                                              \
	static void name##_base params { name##_span args; }                             \
	__attribute__((target("avx2"))) static void name##_avx2 params { name##_span args; } \
	__attribute__((target("avx512f"))) static void name##_avx512 params               \
	{                                                                                \
		name##_span args;                                                        \
	}                                                                                \
	static void name##_run(enum st_cpu_isa isa, ST_UNPAREN params)                   \
	{                                                                                \
		if (isa == ST_CPU_ISA_AVX512)                                            \
			name##_avx512 args;                                              \
		else if (isa == ST_CPU_ISA_AVX2)                                         \
			name##_avx2 args;                                                \
		else                                                                     \
			name##_base args;                                                \
	}
#else
#define ST_ISA_VARIANTS(name, params, args)                                              \
	static void name##_run(enum st_cpu_isa isa, ST_UNPAREN params)                   \
	{                                                                                \
		(void)isa;                                                               \
		name##_span args;                                                        \
	}
#endif
#define ST_UNPAREN(...) __VA_ARGS__

/* ---- bf16 ------------------------------------------------------------------ */

void st_cpu_bf16_to_f32(float *out, const uint16_t *in, size_t n_elems)
{
	size_t n_chunks = (n_elems + ST_CONV_CHUNK - 1) / ST_CONV_CHUNK;
#pragma omp parallel for schedule(static)
	for (size_t ch = 0; ch < n_chunks; ch++) {
		size_t lo = ch * ST_CONV_CHUNK;
		size_t hi = ST_MIN(lo + ST_CONV_CHUNK, n_elems);
#pragma omp simd
		for (size_t i = lo; i < hi; i++) {
			uint32_t u = (uint32_t)in[i] << 16;
			memcpy(&out[i], &u, sizeof(u));
		}
	}
}

void st_cpu_f32_to_bf16(uint16_t *out, const float *in, size_t n_elems)
{
	size_t n_chunks = (n_elems + ST_CONV_CHUNK - 1) / ST_CONV_CHUNK;
#pragma omp parallel for schedule(static)
	for (size_t ch = 0; ch < n_chunks; ch++) {
		size_t lo = ch * ST_CONV_CHUNK;
		size_t hi = ST_MIN(lo + ST_CONV_CHUNK, n_elems);
		for (size_t i = lo; i < hi; i++)
			out[i] = st_cpu_bf16_from_f32(in[i]);
	}
}

void st_cpu_zero(void *p, size_t bytes)
{
	size_t n_chunks = (bytes + ST_FILL_CHUNK - 1) / ST_FILL_CHUNK;
#pragma omp parallel for schedule(static) if (n_chunks > 1)
	for (size_t ch = 0; ch < n_chunks; ch++) {
		size_t lo = ch * ST_FILL_CHUNK;
		memset((char *)p + lo, 0, ST_MIN(ST_FILL_CHUNK, bytes - lo));
	}
}

void st_cpu_copy(void *dst, const void *src, size_t bytes)
{
	size_t n_chunks = (bytes + ST_FILL_CHUNK - 1) / ST_FILL_CHUNK;
#pragma omp parallel for schedule(static) if (n_chunks > 1)
	for (size_t ch = 0; ch < n_chunks; ch++) {
		size_t lo = ch * ST_FILL_CHUNK;
		memcpy((char *)dst + lo, (const char *)src + lo, ST_MIN(ST_FILL_CHUNK, bytes - lo));
	}
}

/* ---- matmul ---------------------------------------------------------------- */

/* Every BLAS call packs its slices of A (rows x K) and B (K x columns) again,
 * so a grid of a x b tiles packs b*M*K + a*K*N elements where one call packs
 * M*K + K*N. Of the grids with at least ST_GEMM_TILES tiles of at least
 * ST_GEMM_TILE_MIN rows and columns, this takes the one that packs least
 * (on a tie, the one with fewer rows of tiles), its sizes rounded up to 16
 * floats (a cache line). From the shape alone: the tiles, so the bits,
 * never depend on the thread count. */
void st_cpu_gemm_tiles(int M, int N, int *tile_m, int *tile_n)
{
	int max_a = ST_MAX(1, M / ST_GEMM_TILE_MIN), max_b = ST_MAX(1, N / ST_GEMM_TILE_MIN);
	int want = ST_MIN(ST_GEMM_TILES, max_a * max_b);
	int best_a = 1, best_b = 1;
	double best = -1;

	for (int a = 1; a <= ST_MIN(want, max_a); a++) {
		int b = (want + a - 1) / a;
		if (b > max_b)
			continue;
		double packed = (double)b * M + (double)a * N;
		if (best < 0 || packed < best) {
			best = packed;
			best_a = a;
			best_b = b;
		}
	}
	*tile_m = ST_MIN(M, ((M + best_a - 1) / best_a + 15) / 16 * 16);
	*tile_n = ST_MIN(N, ((N + best_b - 1) / best_b + 15) / 16 * 16);
}

void st_cpu_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha,
		  const float *A, int lda, const float *B, int ldb, float beta,
		  float *C, int ldc)
{
	assert(M >= 0 && N >= 0 && K >= 0);
	if (M == 0 || N == 0)
		return;
	enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
	enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
	if (omp_in_parallel()) {
		/* OpenBLAS (OpenMP build) runs on this thread alone here. */
		cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B,
			    ldb, beta, C, ldc);
		return;
	}
	int tile_m, tile_n;
	st_cpu_gemm_tiles(M, N, &tile_m, &tile_n);
	int tiles_m = (M + tile_m - 1) / tile_m;
	int tiles_n = (N + tile_n - 1) / tile_n;
	/* Even a single tile goes through the parallel region: inside it
	 * OpenBLAS is single-threaded, so the tile's arithmetic never depends
	 * on how many threads exist. */
#pragma omp parallel for schedule(dynamic, 1)
	for (int t = 0; t < tiles_m * tiles_n; t++) {
		int i0 = (t / tiles_n) * tile_m;
		int j0 = (t % tiles_n) * tile_n;
		int m = ST_MIN(tile_m, M - i0);
		int n = ST_MIN(tile_n, N - j0);
		const float *a = trans_a ? A + i0 : A + (size_t)i0 * lda;
		const float *b = trans_b ? B + (size_t)j0 * ldb : B + j0;
		cblas_sgemm(CblasRowMajor, ta, tb, m, n, K, alpha, a, lda, b,
			    ldb, beta, C + (size_t)i0 * ldc + j0, ldc);
	}
}

void st_cpu_matmul_fwd(float *out, const float *inp, const float *weight,
		       const float *bias, int N, int IC, int OC)
{
	// out is (N,OC), inp is (N,IC), weight is (IC,OC), bias is (OC)
	if (bias) {
#pragma omp parallel for schedule(static)
		for (int n = 0; n < N; n++)
			memcpy(out + (size_t)n * OC, bias, sizeof(float) * OC);
	}
	st_cpu_sgemm(0, 0, N, OC, IC, 1.0f, inp, IC, weight, OC,
		     bias ? 1.0f : 0.0f, out, OC);
}

void st_cpu_matmul_fwd_bf16(float *out, const uint16_t *inp, const uint16_t *weight,
			    const float *bias, int N, int IC, int OC)
{
	// out is (N,OC), inp is (N,IC), weight is (IC,OC), bias is (OC)
	assert(N >= 0 && IC >= 0 && OC >= 0);
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++) {
		float *o = out + (size_t)n * OC;
		const uint16_t *x = inp + (size_t)n * IC;

		for (int j = 0; j < OC; j++)
			o[j] = bias ? bias[j] : 0.0f;
		for (int k = 0; k < IC; k++) {
			float a = st_cpu_f32_from_bf16(x[k]);
			const uint16_t *w = weight + (size_t)k * OC;
#pragma omp simd
			for (int j = 0; j < OC; j++)
				o[j] += a * st_cpu_f32_from_bf16(w[j]);
		}
	}
}

void st_cpu_matmul_bwd(float *dinp, float *dweight, float *dbias,
		       const float *dout, const float *inp, const float *weight,
		       int N, int IC, int OC)
{
	// dinp (N,IC) += dout (N,OC) @ weight^T (OC,IC)
	if (dinp)
		st_cpu_sgemm(0, 1, N, IC, OC, 1.0f, dout, OC, weight, OC, 1.0f,
			     dinp, IC);
	// dweight (IC,OC) += inp^T (IC,N) @ dout (N,OC)
	if (dweight)
		st_cpu_sgemm(1, 0, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f,
			     dweight, OC);
	if (dbias) {
		int n_blocks = (OC + ST_COL_BLOCK - 1) / ST_COL_BLOCK;
#pragma omp parallel for schedule(static)
		for (int blk = 0; blk < n_blocks; blk++) {
			int c0 = blk * ST_COL_BLOCK;
			int nc = ST_MIN(ST_COL_BLOCK, OC - c0);
			float acc[ST_COL_BLOCK] = {0};
			for (int n = 0; n < N; n++) {
				const float *row = dout + (size_t)n * OC + c0;
#pragma omp simd
				for (int c = 0; c < nc; c++)
					acc[c] += row[c];
			}
			for (int c = 0; c < nc; c++)
				dbias[c0 + c] += acc[c];
		}
	}
}

/* ---- layernorm --------------------------------------------------------------- */

void st_cpu_layernorm_fwd(float *out, float *mean, float *rstd,
			  const float *inp, const float *weight,
			  const float *bias, int N, int C)
{
	// out is (N,C), mean and rstd are (N)
	const float eps = 1e-5f;
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++) {
		const float *x = inp + (size_t)n * C;
		float *o = out + (size_t)n * C;
		float s = 0.0f;
#pragma omp simd reduction(+ : s)
		for (int c = 0; c < C; c++)
			s += x[c];
		float m = s / (float)C;
		float v = 0.0f;
#pragma omp simd reduction(+ : v)
		for (int c = 0; c < C; c++) {
			float d = x[c] - m;
			v += d * d;
		}
		float r = 1.0f / sqrtf(v / (float)C + eps);
#pragma omp simd
		for (int c = 0; c < C; c++)
			o[c] = (x[c] - m) * r * weight[c] + bias[c];
		mean[n] = m;
		rstd[n] = r;
	}
}

void st_cpu_layernorm_bwd(float *dinp, float *dweight, float *dbias,
			  const float *dout, const float *inp,
			  const float *weight, const float *mean,
			  const float *rstd, int N, int C)
{
	// dinp, dout, inp are (N,C); dweight, dbias, weight are (C)
	if (dinp) {
#pragma omp parallel for schedule(static)
		for (int n = 0; n < N; n++) {
			const float *x = inp + (size_t)n * C;
			const float *g = dout + (size_t)n * C;
			float *dx = dinp + (size_t)n * C;
			float m = mean[n], r = rstd[n];
			float s_dn = 0.0f, s_dnn = 0.0f;
#pragma omp simd reduction(+ : s_dn, s_dnn)
			for (int c = 0; c < C; c++) {
				float norm = (x[c] - m) * r;
				float dnorm = weight[c] * g[c];
				s_dn += dnorm;
				s_dnn += dnorm * norm;
			}
			s_dn /= (float)C;
			s_dnn /= (float)C;
#pragma omp simd
			for (int c = 0; c < C; c++) {
				float norm = (x[c] - m) * r;
				float dnorm = weight[c] * g[c];
				dx[c] += (dnorm - s_dn - norm * s_dnn) * r;
			}
		}
	}
	if (dweight || dbias) {
		int n_blocks = (C + ST_COL_BLOCK - 1) / ST_COL_BLOCK;
#pragma omp parallel for schedule(static)
		for (int blk = 0; blk < n_blocks; blk++) {
			int c0 = blk * ST_COL_BLOCK;
			int nc = ST_MIN(ST_COL_BLOCK, C - c0);
			float aw[ST_COL_BLOCK] = {0}, ab[ST_COL_BLOCK] = {0};
			for (int n = 0; n < N; n++) {
				const float *x = inp + (size_t)n * C + c0;
				const float *g = dout + (size_t)n * C + c0;
				float m = mean[n], r = rstd[n];
#pragma omp simd
				for (int c = 0; c < nc; c++) {
					aw[c] += g[c] * ((x[c] - m) * r);
					ab[c] += g[c];
				}
			}
			for (int c = 0; c < nc; c++) {
				if (dweight)
					dweight[c0 + c] += aw[c];
				if (dbias)
					dbias[c0 + c] += ab[c];
			}
		}
	}
}

/* ---- GELU ------------------------------------------------------------------- */

#define ST_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define ST_GELU_A 0.044715f

/* With e = exp(2u) and a = 1/(e+1): 1 + tanh(u) = 2ea and 1 - tanh(u) = 2a.
 * Written this way there is no cancellation for negative inputs (where
 * 1 + tanh(u) -> 0), the limits are exact, and the loop vectorises. */
#define ST_ELEM_CHUNK 16384 /* elements per task in elementwise kernels */

ST_SPAN void gelu_fwd_span(float *out, const float *inp, size_t lo, size_t hi)
{
#pragma omp simd
	for (size_t i = lo; i < hi; i++) {
		float x = inp[i];
		float e = st_expf(2.0f * ST_GELU_K * (x + ST_GELU_A * x * x * x));
		float a = 1.0f / (e + 1.0f);
		out[i] = x * (e * a); /* 0.5 x (1 + tanh) */
	}
}
ST_ISA_VARIANTS(gelu_fwd, (float *out, const float *inp, size_t lo, size_t hi),
		(out, inp, lo, hi))

void st_cpu_gelu_fwd(float *out, const float *inp, size_t n)
{
	size_t n_chunks = (n + ST_ELEM_CHUNK - 1) / ST_ELEM_CHUNK;
	enum st_cpu_isa isa = st_cpu_isa();
#pragma omp parallel for schedule(static)
	for (size_t ch = 0; ch < n_chunks; ch++) {
		size_t lo = ch * ST_ELEM_CHUNK, hi = ST_MIN(lo + ST_ELEM_CHUNK, n);
		gelu_fwd_run(isa, out, inp, lo, hi);
	}
}

/* dinp may be inp (elementwise, each read before its write). */
ST_SPAN void gelu_bwd_span(float *dinp, const float *inp, const float *dout, size_t lo,
			   size_t hi)
{
#pragma omp simd
	for (size_t i = lo; i < hi; i++) {
		float x = inp[i];
		float e = st_expf(2.0f * ST_GELU_K * (x + ST_GELU_A * x * x * x));
		float a = 1.0f / (e + 1.0f);
		float ea = e * a;
		float du = ST_GELU_K * (1.0f + 3.0f * ST_GELU_A * x * x);
		/* 0.5 (1 + t) + 0.5 x (1 - t^2) du, 1 - t^2 = 4 e a^2 */
		float g = ea + 2.0f * x * (ea * a) * du;
		dinp[i] = g * dout[i];
	}
}
ST_ISA_VARIANTS(gelu_bwd,
		(float *dinp, const float *inp, const float *dout, size_t lo, size_t hi),
		(dinp, inp, dout, lo, hi))

void st_cpu_gelu_bwd(float *dinp, const float *inp, const float *dout,
		     size_t n)
{
	size_t n_chunks = (n + ST_ELEM_CHUNK - 1) / ST_ELEM_CHUNK;
	enum st_cpu_isa isa = st_cpu_isa();
#pragma omp parallel for schedule(static)
	for (size_t ch = 0; ch < n_chunks; ch++) {
		size_t lo = ch * ST_ELEM_CHUNK, hi = ST_MIN(lo + ST_ELEM_CHUNK, n);
		gelu_bwd_run(isa, dinp, inp, dout, lo, hi);
	}
}

/* ---- residual ----------------------------------------------------------------- */

void st_cpu_residual_fwd(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++)
		out[i] = a[i] + b[i];
}

void st_cpu_residual_bwd(float *da, float *db, const float *dout, size_t n)
{
#pragma omp parallel for simd schedule(static)
	for (size_t i = 0; i < n; i++) {
		da[i] += dout[i];
		db[i] += dout[i];
	}
}

/* ---- embedding ------------------------------------------------------------------ */

void st_cpu_embedding_fwd(float *out, const int32_t *tokens, const float *wte,
			  const float *wpe, int B, int T, int C)
{
	// out is (B,T,C), tokens (B,T), wte (V,C), wpe (T,C)
#pragma omp parallel for schedule(static)
	for (int bt = 0; bt < B * T; bt++) {
		const float *e = wte + (size_t)tokens[bt] * C;
		const float *p = wpe + (size_t)(bt % T) * C;
		float *o = out + (size_t)bt * C;
#pragma omp simd
		for (int c = 0; c < C; c++)
			o[c] = e[c] + p[c];
	}
}

void st_cpu_embedding_bwd(float *dwte, float *dwpe, const float *dout,
			  const int32_t *tokens, int B, int T, int C)
{
	// Scatter-add by token: a column block per task, rows in order, so
	// repeated tokens add up in the same order at any thread count.
	int n_blocks = (C + ST_COL_BLOCK - 1) / ST_COL_BLOCK;
#pragma omp parallel for schedule(static)
	for (int blk = 0; blk < n_blocks; blk++) {
		int c0 = blk * ST_COL_BLOCK;
		int nc = ST_MIN(ST_COL_BLOCK, C - c0);
		for (int bt = 0; bt < B * T; bt++) {
			float *d = dwte + (size_t)tokens[bt] * C + c0;
			const float *g = dout + (size_t)bt * C + c0;
#pragma omp simd
			for (int c = 0; c < nc; c++)
				d[c] += g[c];
		}
	}
#pragma omp parallel for schedule(static)
	for (int t = 0; t < T; t++) {
		float *d = dwpe + (size_t)t * C;
		for (int b = 0; b < B; b++) {
			const float *g = dout + ((size_t)b * T + t) * C;
#pragma omp simd
			for (int c = 0; c < C; c++)
				d[c] += g[c];
		}
	}
}

/* ---- attention ---------------------------------------------------------------------- */

/* One (batch, head) of the causal attention's forward: q with row stride
 * sq, o with so, k and v with sk (GPT-2's q, k, v interleaved in qkv:
 * sq = sk = 3C, so = C; a grouped-query head: sq = so = NH hd, sk = NKV hd). */
void st_att_fwd_head(float *o, float *l_out, const float *q, const float *k, const float *v,
		     int T, int hd, int sq, int so, int sk, float scale, const int32_t *seg)
{
	float s[ST_ATT_BLOCK * ST_ATT_BLOCK];
	float mrow[ST_ATT_BLOCK], lrow[ST_ATT_BLOCK];
	for (int i0 = 0; i0 < T; i0 += ST_ATT_BLOCK) {
		int ni = ST_MIN(ST_ATT_BLOCK, T - i0);
		for (int r = 0; r < ni; r++) {
			mrow[r] = -INFINITY;
			lrow[r] = 0.0f;
			memset(o + (size_t)(i0 + r) * so, 0, sizeof(float) * hd);
		}
		// key blocks from the one holding the rows' first segment start
		int jfirst = st_att_seg_min(seg, i0, ni) / ST_ATT_BLOCK * ST_ATT_BLOCK;
		for (int j0 = jfirst; j0 < i0 + ni; j0 += ST_ATT_BLOCK) {
			int nj = ST_MIN(ST_ATT_BLOCK, i0 + ni - j0);
			// s (ni,nj) = scale * q_i @ k_j^T
			st_cpu_sgemm(0, 1, ni, nj, hd, scale, q + (size_t)i0 * sq, sq,
				     k + (size_t)j0 * sk, sk, 0.0f, s, ST_ATT_BLOCK);
			st_att_online_softmax(s, ni, nj, i0, j0, mrow, lrow, o, so, hd, seg);
			// o_i (ni,hd) += p (ni,nj) @ v_j (nj,hd)
			st_cpu_sgemm(0, 0, ni, hd, nj, 1.0f, s, ST_ATT_BLOCK, v + (size_t)j0 * sk,
				     sk, 1.0f, o + (size_t)i0 * so, so);
		}
		for (int r = 0; r < ni; r++) {
			float inv = 1.0f / lrow[r];
			float *orow = o + (size_t)(i0 + r) * so;
			for (int d = 0; d < hd; d++)
				orow[d] *= inv;
			l_out[i0 + r] = mrow[r] + logf(lrow[r]);
		}
	}
}

void st_cpu_attention_fwd(float *out, float *lse, const float *qkv, int B,
			  int T, int C, int NH)
{
	st_cpu_attention_fwd_seg(out, lse, qkv, B, T, C, NH, NULL);
}

void st_cpu_attention_fwd_seg(float *out, float *lse, const float *qkv, int B, int T, int C,
			      int NH, const int32_t *seg)
{
	// out is (B,T,C), lse is (B,NH,T), qkv is (B,T,3C)
	assert(C % NH == 0);
	const int hs = C / NH, C3 = 3 * C;
	const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(dynamic, 1)
	for (int bh = 0; bh < B * NH; bh++) {
		int b = bh / NH, h = bh % NH;
		const float *q = qkv + (size_t)b * T * C3 + h * hs;
		st_att_fwd_head(out + (size_t)b * T * C + h * hs, lse + (size_t)bh * T, q, q + C,
				q + 2 * C, T, hs, C3, C, C3, scale,
				seg ? seg + (size_t)b * T : NULL);
	}
}

/* One (batch, head) of the backward, accumulating into dq (stride sq, as
 * q), dk and dv (stride sk, as k and v: a grouped-query head's are its kv
 * head's, shared); dout and o have stride so. */
void st_att_bwd_head(float *dq, float *dk, float *dv, const float *dout, const float *q,
		     const float *k, const float *v, const float *o, const float *l_in, int T,
		     int hd, int sq, int so, int sk, float scale, const int32_t *seg)
{
	float p[ST_ATT_BLOCK * ST_ATT_BLOCK];
	float dp[ST_ATT_BLOCK * ST_ATT_BLOCK];
	float drow[ST_ATT_BLOCK];
	for (int j0 = 0; j0 < T; j0 += ST_ATT_BLOCK) {
		int nj = ST_MIN(ST_ATT_BLOCK, T - j0);
		// query blocks that see some key of this block
		for (int i0 = (j0 / ST_ATT_BLOCK) * ST_ATT_BLOCK; i0 < T; i0 += ST_ATT_BLOCK) {
			int ni = ST_MIN(ST_ATT_BLOCK, T - i0);
			// no row of the block sees a key of this one
			if (st_att_seg_min(seg, i0, ni) >= j0 + nj)
				continue;
			// p (ni,nj) = exp(scale q_i k_j^T - lse_i), causal
			st_cpu_sgemm(0, 1, ni, nj, hd, scale, q + (size_t)i0 * sq, sq,
				     k + (size_t)j0 * sk, sk, 0.0f, p, ST_ATT_BLOCK);
			for (int r = 0; r < ni; r++) {
				float *pr = p + r * ST_ATT_BLOCK;
				int lo, nvalid;
				st_att_row_keys(i0 + r, j0, nj, seg, &lo, &nvalid);
				lo = ST_MIN(lo, nvalid);
				float li = l_in[i0 + r];
#pragma omp simd
				for (int c = lo; c < nvalid; c++)
					pr[c] = st_expf(pr[c] - li);
				for (int c = 0; c < lo; c++)
					pr[c] = 0.0f;
				for (int c = nvalid; c < nj; c++)
					pr[c] = 0.0f;
				// D_i = dout_i . out_i
				const float *gr = dout + (size_t)(i0 + r) * so;
				const float *orow = o + (size_t)(i0 + r) * so;
				float d = 0.0f;
				for (int e = 0; e < hd; e++)
					d += gr[e] * orow[e];
				drow[r] = d;
			}
			// dv_j (nj,hd) += p^T (nj,ni) @ dout_i (ni,hd)
			st_cpu_sgemm(1, 0, nj, hd, ni, 1.0f, p, ST_ATT_BLOCK,
				     dout + (size_t)i0 * so, so, 1.0f, dv + (size_t)j0 * sk, sk);
			// dp (ni,nj) = dout_i @ v_j^T
			st_cpu_sgemm(0, 1, ni, nj, hd, 1.0f, dout + (size_t)i0 * so, so,
				     v + (size_t)j0 * sk, sk, 0.0f, dp, ST_ATT_BLOCK);
			// ds = p * (dp - D_i), into dp
			for (int r = 0; r < ni; r++) {
				float *pr = p + r * ST_ATT_BLOCK;
				float *dr = dp + r * ST_ATT_BLOCK;
#pragma omp simd
				for (int c = 0; c < nj; c++)
					dr[c] = pr[c] * (dr[c] - drow[r]);
			}
			// dq_i (ni,hd) += scale ds @ k_j
			st_cpu_sgemm(0, 0, ni, hd, nj, scale, dp, ST_ATT_BLOCK,
				     k + (size_t)j0 * sk, sk, 1.0f, dq + (size_t)i0 * sq, sq);
			// dk_j (nj,hd) += scale ds^T @ q_i
			st_cpu_sgemm(1, 0, nj, hd, ni, scale, dp, ST_ATT_BLOCK,
				     q + (size_t)i0 * sq, sq, 1.0f, dk + (size_t)j0 * sk, sk);
		}
	}
}

void st_cpu_attention_bwd(float *dqkv, const float *dout, const float *qkv,
			  const float *out, const float *lse, int B, int T,
			  int C, int NH)
{
	st_cpu_attention_bwd_seg(dqkv, dout, qkv, out, lse, B, T, C, NH, NULL);
}

void st_cpu_attention_bwd_seg(float *dqkv, const float *dout, const float *qkv,
			      const float *out, const float *lse, int B, int T, int C, int NH,
			      const int32_t *seg)
{
	assert(C % NH == 0);
	const int hs = C / NH, C3 = 3 * C;
	const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(dynamic, 1)
	for (int bh = 0; bh < B * NH; bh++) {
		int b = bh / NH, h = bh % NH;
		size_t qoff = (size_t)b * T * C3 + h * hs;
		size_t ooff = (size_t)b * T * C + h * hs;
		const float *q = qkv + qoff;
		float *dq = dqkv + qoff;
		st_att_bwd_head(dq, dq + C, dq + 2 * C, dout + ooff, q, q + C, q + 2 * C,
				out + ooff, lse + (size_t)bh * T, T, hs, C3, C, C3, scale,
				seg ? seg + (size_t)b * T : NULL);
	}
}

/* ---- cross-entropy ----------------------------------------------------------- */

/* The row's max: exact in any order (a NaN never wins a compare; which of
 * +0 and -0 wins a tie changes nothing below, as x - mx and mx + log(sum)
 * come out the same for either), so it may run at any width. */
ST_SPAN void row_max_span(const float *x, int V, float *out)
{
	float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
	for (int i = 0; i < V; i++)
		mx = x[i] > mx ? x[i] : mx;
	*out = mx;
}
ST_ISA_VARIANTS(row_max, (const float *x, int V, float *out), (x, V, out))

static float row_max_of(const float *x, int V)
{
	float mx;

	row_max_run(st_cpu_isa(), x, V, &mx);
	return mx;
}

/* dx = exp(x - mx), elementwise (dx may be x). */
ST_SPAN void exp_shift_span(float *dx, const float *x, float mx, int V)
{
#pragma omp simd
	for (int i = 0; i < V; i++)
		dx[i] = st_expf(x[i] - mx);
}
ST_ISA_VARIANTS(exp_shift, (float *dx, const float *x, float mx, int V), (dx, x, mx, V))

ST_SPAN void scale_span(float *dx, float s, int V)
{
#pragma omp simd
	for (int i = 0; i < V; i++)
		dx[i] *= s;
}
ST_ISA_VARIANTS(scale, (float *dx, float s, int V), (dx, s, V))

/* The sum of the row's exponentials, in the baseline loop's order, which is
 * the order the fused loop of crossentropy_bwd_row_base sums them in (the
 * same reduction over the same values, one vector of partial sums). */
static float row_sum(const float *e, int V)
{
	float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
	for (int i = 0; i < V; i++)
		sum += e[i];
	return sum;
}

void st_cpu_crossentropy_fwd(float *losses, const float *logits,
			     const int32_t *targets, int N, int V)
{
	// losses (N), logits (N,V), targets (N)
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++) {
		const float *x = logits + (size_t)n * V;
		if (targets[n] < 0) { /* ignored (masked out): no loss */
			losses[n] = 0.0f;
			continue;
		}
		float mx = row_max_of(x, V);
		float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
		for (int i = 0; i < V; i++)
			sum += st_expf(x[i] - mx);
		losses[n] = mx + logf(sum) - x[targets[n]];
	}
}

/* One row of the backward as the baseline runs it: exp and sum fused. */
static float crossentropy_bwd_row_base(float *dx, const float *x, float mx, int V)
{
	float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
	for (int i = 0; i < V; i++) {
		float e = st_expf(x[i] - mx);
		dx[i] = e;
		sum += e;
	}
	return sum;
}

void st_cpu_crossentropy_bwd(float *dlogits, float *losses,
			     const float *logits, const int32_t *targets,
			     float dloss, int N, int V)
{
	enum st_cpu_isa isa = st_cpu_isa();
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++) {
		const float *x = logits + (size_t)n * V;
		float *dx = dlogits + (size_t)n * V;
		int32_t t = targets[n];
		if (t < 0) { /* ignored (masked out): no loss, no gradient */
			if (losses)
				losses[n] = 0.0f;
			memset(dx, 0, (size_t)V * sizeof(float));
			continue;
		}
		float xt = x[t]; /* read before dx (maybe x) is overwritten */
		float mx, sum;
		row_max_run(isa, x, V, &mx);
		if (isa == ST_CPU_ISA_BASE) {
			sum = crossentropy_bwd_row_base(dx, x, mx, V);
		} else { /* the exponentials wide, then the same sum */
			exp_shift_run(isa, dx, x, mx, V);
			sum = row_sum(dx, V);
		}
		if (losses)
			losses[n] = mx + logf(sum) - xt;
		float s = dloss / sum;
		scale_run(isa, dx, s, V);
		dx[t] -= dloss;
	}
}
