/* strata: cpu kernels of LLaMA's ops (nn.Linear, RMSNorm, rotary
 * embeddings, SwiGLU, token embedding, grouped-query attention). The
 * conventions are strata/kernels.h's: output first, backward accumulates
 * unless it says it overwrites, fixed partitions so that the bits never
 * depend on the thread count, no atomics. */
#include "strata/kernels.h"

#include "strata/common.h"
#include "strata/rope.h"

#include "cpu_attention.h" /* st_att_online_softmax(), ST_ATT_BLOCK */
#include "cpu_expf.h"

#include <assert.h>
#include <math.h>
#include <omp.h>

#define ST_COL_BLOCK 64       /* columns per task in reductions over rows */
#define ST_ELEM_CHUNK 16384   /* elements per task in elementwise kernels */
#define ST_ROPE_MAX_HALF 1024 /* hd/2 at most (the config checks hd) */

/* ---- linear ------------------------------------------------------------------ */

void st_cpu_linear_fwd(float *out, const float *inp, const float *weight,
		       const float *bias, int N, int IC, int OC)
{
	// out (N,OC) = inp (N,IC) @ weight^T (IC,OC) + bias
	if (bias) {
#pragma omp parallel for schedule(static)
		for (int n = 0; n < N; n++)
			memcpy(out + (size_t)n * OC, bias, sizeof(float) * OC);
	}
	st_cpu_sgemm(0, 1, N, OC, IC, 1.0f, inp, IC, weight, IC, bias ? 1.0f : 0.0f, out,
		     OC);
}

void st_cpu_linear_bwd(float *dinp, float *dweight, float *dbias,
		       const float *dout, const float *inp, const float *weight,
		       int N, int IC, int OC)
{
	// dinp (N,IC) += dout (N,OC) @ weight (OC,IC)
	if (dinp)
		st_cpu_sgemm(0, 0, N, IC, OC, 1.0f, dout, OC, weight, IC, 1.0f, dinp, IC);
	// dweight (OC,IC) += dout^T (OC,N) @ inp (N,IC)
	if (dweight)
		st_cpu_sgemm(1, 0, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
	// dbias: the column sums of matmul_bwd
	if (dbias)
		st_cpu_matmul_bwd(NULL, NULL, dbias, dout, NULL, NULL, N, IC, OC);
}

/* ---- RMSNorm ------------------------------------------------------------------- */

void st_cpu_rmsnorm_fwd(float *out, float *rstd, const float *inp,
			const float *weight, float eps, int N, int C)
{
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++) {
		const float *x = inp + (size_t)n * C;
		float *o = out + (size_t)n * C;
		float s = 0.0f;
#pragma omp simd reduction(+ : s)
		for (int c = 0; c < C; c++)
			s += x[c] * x[c];
		float r = 1.0f / sqrtf(s / (float)C + eps);
#pragma omp simd
		for (int c = 0; c < C; c++)
			o[c] = weight[c] * (x[c] * r);
		rstd[n] = r;
	}
}

void st_cpu_rmsnorm_bwd(float *dinp, float *dweight, const float *dout,
			const float *inp, const float *weight,
			const float *rstd, int N, int C)
{
	// y = w x r: dx = r (w g) - x r^3 mean(w g x); dw += g x r
	if (dinp) {
#pragma omp parallel for schedule(static)
		for (int n = 0; n < N; n++) {
			const float *x = inp + (size_t)n * C;
			const float *g = dout + (size_t)n * C;
			float *dx = dinp + (size_t)n * C;
			float r = rstd[n], s = 0.0f;
#pragma omp simd reduction(+ : s)
			for (int c = 0; c < C; c++)
				s += weight[c] * g[c] * x[c];
			float k = s / (float)C * r * r * r;
#pragma omp simd
			for (int c = 0; c < C; c++)
				dx[c] += weight[c] * g[c] * r - x[c] * k;
		}
	}
	if (dweight) {
		int n_blocks = (C + ST_COL_BLOCK - 1) / ST_COL_BLOCK;
#pragma omp parallel for schedule(static)
		for (int blk = 0; blk < n_blocks; blk++) {
			int c0 = blk * ST_COL_BLOCK;
			int nc = ST_MIN(ST_COL_BLOCK, C - c0);
			float aw[ST_COL_BLOCK] = { 0 };
			for (int n = 0; n < N; n++) {
				const float *x = inp + (size_t)n * C + c0;
				const float *g = dout + (size_t)n * C + c0;
				float r = rstd[n];
#pragma omp simd
				for (int c = 0; c < nc; c++)
					aw[c] += g[c] * (x[c] * r);
			}
			for (int c = 0; c < nc; c++)
				dweight[c0 + c] += aw[c];
		}
	}
}

/* ---- rotary embeddings --------------------------------------------------------------- */

static void rope(float *out, const float *inp, int B, int T, int pos0, int NH, int hd,
		 int stride, int type, int original_ctx, float theta, float factor, float lo,
		 float hi, float sign)
{
	const int half = hd / 2;
	assert(hd % 2 == 0 && half <= ST_ROPE_MAX_HALF && NH * hd <= stride);
	float inv[ST_ROPE_MAX_HALF];
	for (int i = 0; i < half; i++)
		inv[i] = st_rope_inv_freq(i, hd, theta, type, factor, lo, hi, original_ctx);
#pragma omp parallel for schedule(static)
	for (int row = 0; row < B * T; row++) {
		float cs[ST_ROPE_MAX_HALF], sn[ST_ROPE_MAX_HALF];
		int pos = pos0 + row % T;
		for (int i = 0; i < half; i++) {
			st_rope_cos_sin(inv[i], pos, &cs[i], &sn[i]);
			sn[i] *= sign;
		}
		for (int h = 0; h < NH; h++) {
			const float *x = inp + (size_t)row * stride + (size_t)h * hd;
			float *o = out + (size_t)row * stride + (size_t)h * hd;
#pragma omp simd
			for (int i = 0; i < half; i++) {
				float x1 = x[i], x2 = x[i + half];
				o[i] = x1 * cs[i] - x2 * sn[i];
				o[i + half] = x2 * cs[i] + x1 * sn[i];
			}
		}
	}
}

void st_cpu_rope_fwd(float *out, const float *inp, int B, int T, int pos0, int NH, int hd,
		     int stride, int type, int original_ctx, float theta,
		     float factor, float low_freq_factor, float high_freq_factor)
{
	rope(out, inp, B, T, pos0, NH, hd, stride, type, original_ctx, theta, factor,
	     low_freq_factor, high_freq_factor, 1.0f);
}

void st_cpu_rope_bwd(float *dinp, const float *dout, int B, int T, int pos0, int NH, int hd,
		     int stride, int type, int original_ctx, float theta,
		     float factor, float low_freq_factor, float high_freq_factor)
{
	rope(dinp, dout, B, T, pos0, NH, hd, stride, type, original_ctx, theta, factor,
	     low_freq_factor, high_freq_factor, -1.0f);
}

/* ---- the decoder's attention ------------------------------------------------------------ */

/* q's row of hd channels . cache row t's, in order (the same value each
 * time it is taken: the three passes below read it again instead of
 * keeping pos + n scores). */
static float dec_dot(const float *qr, const float *k, int hd)
{
	float dot = 0;

	for (int d = 0; d < hd; d++)
		dot += qr[d] * k[d];
	return dot;
}

void st_cpu_decode_attention(float *out, const float *q, const float *kc, const float *vc,
			     int n, int pos, int NH, int NKV, int hd, int sq)
{
	const int rep = NH / NKV, skv = NKV * hd;
	const float scale = 1.0f / sqrtf((float)hd);

#pragma omp parallel for schedule(dynamic, 1)
	for (int ih = 0; ih < n * NH; ih++) {
		int i = ih / NH, h = ih % NH, T = pos + i + 1;
		const float *qr = q + (size_t)i * sq + (size_t)h * hd;
		const float *k = kc + (size_t)(h / rep) * hd, *v = vc + (size_t)(h / rep) * hd;
		float *o = out + (size_t)i * NH * hd + (size_t)h * hd, mx = -INFINITY;
		double sum = 0;

		for (int t = 0; t < T; t++) {
			float s = dec_dot(qr, k + (size_t)t * skv, hd) * scale;

			mx = s > mx ? s : mx;
		}
		for (int t = 0; t < T; t++)
			sum += expf(dec_dot(qr, k + (size_t)t * skv, hd) * scale - mx);
		for (int d = 0; d < hd; d++)
			o[d] = 0;
		for (int t = 0; t < T; t++) {
			float w = (float)(expf(dec_dot(qr, k + (size_t)t * skv, hd) * scale - mx) /
					  sum);

			for (int d = 0; d < hd; d++)
				o[d] += w * v[(size_t)t * skv + d];
		}
	}
}

/* ---- SwiGLU ------------------------------------------------------------------------------ */

void st_cpu_swiglu_fwd(float *out, const float *gate, const float *up, size_t n)
{
	size_t n_chunks = (n + ST_ELEM_CHUNK - 1) / ST_ELEM_CHUNK;
#pragma omp parallel for schedule(static)
	for (size_t ch = 0; ch < n_chunks; ch++) {
		size_t lo = ch * ST_ELEM_CHUNK, hi = ST_MIN(lo + ST_ELEM_CHUNK, n);
#pragma omp simd
		for (size_t i = lo; i < hi; i++) {
			float g = gate[i];
			float s = 1.0f / (1.0f + st_expf(-g));
			out[i] = g * s * up[i];
		}
	}
}

void st_cpu_swiglu_bwd(float *dgate, float *dup, const float *dout,
		       const float *gate, const float *up, size_t n)
{
	size_t n_chunks = (n + ST_ELEM_CHUNK - 1) / ST_ELEM_CHUNK;
#pragma omp parallel for schedule(static)
	for (size_t ch = 0; ch < n_chunks; ch++) {
		size_t lo = ch * ST_ELEM_CHUNK, hi = ST_MIN(lo + ST_ELEM_CHUNK, n);
#pragma omp simd
		for (size_t i = lo; i < hi; i++) {
			float g = gate[i], u = up[i], d = dout[i];
			float s = 1.0f / (1.0f + st_expf(-g));
			float silu = g * s;
			/* silu'(g) = s (1 + g (1 - s)) */
			dgate[i] = d * u * (s * (1.0f + g * (1.0f - s)));
			dup[i] = d * silu;
		}
	}
}

/* ---- token embedding ------------------------------------------------------------------ */

void st_cpu_token_embed_fwd(float *out, const int32_t *tokens, const float *wte,
			    int N, int C)
{
#pragma omp parallel for schedule(static)
	for (int n = 0; n < N; n++)
		memcpy(out + (size_t)n * C, wte + (size_t)tokens[n] * C, sizeof(float) * C);
}

void st_cpu_token_embed_bwd(float *dwte, const float *dout, const int32_t *tokens,
			    int N, int C)
{
	// a column block per task, rows in order: repeated tokens add up in
	// the same order at any thread count
	int n_blocks = (C + ST_COL_BLOCK - 1) / ST_COL_BLOCK;
#pragma omp parallel for schedule(static)
	for (int blk = 0; blk < n_blocks; blk++) {
		int c0 = blk * ST_COL_BLOCK;
		int nc = ST_MIN(ST_COL_BLOCK, C - c0);
		for (int n = 0; n < N; n++) {
			float *d = dwte + (size_t)tokens[n] * C + c0;
			const float *g = dout + (size_t)n * C + c0;
#pragma omp simd
			for (int c = 0; c < nc; c++)
				d[c] += g[c];
		}
	}
}

/* ---- grouped-query attention ---------------------------------------------------------------- */

void st_cpu_gqa_attention_fwd(float *out, float *lse, const float *q, const float *k,
			      const float *v, int B, int T, int NH, int NKV, int hd)
{
	st_cpu_gqa_attention_fwd_seg(out, lse, q, k, v, B, T, NH, NKV, hd, NULL);
}

void st_cpu_gqa_attention_fwd_seg(float *out, float *lse, const float *q, const float *k,
				  const float *v, int B, int T, int NH, int NKV, int hd,
				  const int32_t *seg)
{
	assert(NKV >= 1 && NH % NKV == 0);
	const int sq = NH * hd, sk = NKV * hd, rep = NH / NKV;
	const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for schedule(dynamic, 1)
	for (int bh = 0; bh < B * NH; bh++) {
		int b = bh / NH, h = bh % NH, kh = h / rep;
		size_t qo = (size_t)b * T * sq + (size_t)h * hd;
		size_t ko = (size_t)b * T * sk + (size_t)kh * hd;
		st_att_fwd_head(out + qo, lse + (size_t)bh * T, q + qo, k + ko, v + ko, T, hd,
				sq, sq, sk, scale, seg ? seg + (size_t)b * T : NULL);
	}
}

void st_cpu_gqa_attention_bwd(float *dq, float *dk, float *dv, const float *dout,
			      const float *q, const float *k, const float *v,
			      const float *out, const float *lse, int B, int T,
			      int NH, int NKV, int hd)
{
	st_cpu_gqa_attention_bwd_seg(dq, dk, dv, dout, q, k, v, out, lse, B, T, NH, NKV, hd, NULL);
}

void st_cpu_gqa_attention_bwd_seg(float *dq, float *dk, float *dv, const float *dout,
				  const float *q, const float *k, const float *v,
				  const float *out, const float *lse, int B, int T, int NH,
				  int NKV, int hd, const int32_t *seg)
{
	assert(NKV >= 1 && NH % NKV == 0);
	const int sq = NH * hd, sk = NKV * hd, rep = NH / NKV;
	const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for schedule(dynamic, 1)
	for (int bk = 0; bk < B * NKV; bk++) {
		int b = bk / NKV, kh = bk % NKV;
		size_t ko = (size_t)b * T * sk + (size_t)kh * hd;
		for (int g = 0; g < rep; g++) {
			int h = kh * rep + g;
			size_t qo = (size_t)b * T * sq + (size_t)h * hd;
			st_att_bwd_head(dq + qo, dk + ko, dv + ko, dout + qo, q + qo, k + ko,
					v + ko, out + qo, lse + ((size_t)b * NH + h) * T, T, hd,
					sq, sq, sk, scale, seg ? seg + (size_t)b * T : NULL);
		}
	}
}
