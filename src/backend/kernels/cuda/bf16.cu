/* The cuda bf16 ops (cuda_bf16.h): the host side. Row-major X (r,c)
 * is column-major X^T (c,r), so the matmuls map as matmul.cu's fp32 ones do:
 *   fwd   out^T (OC,N) = W^T (OC,IC) @ inp^T (IC,N), the bias along D's rows
 *   dinp  dinp^T (IC,N) += W (IC,OC) @ dout^T (OC,N)  (A = W transposed)
 *   dW    dW^T (OC,IC) += dout^T (OC,N) @ inp (N,IC)   (B = inp transposed)
 * with bf16 A and B, fp32 accumulation, D bf16 or fp32 (D is C: beta 1
 * accumulates, one rounding of the fp32 sum into a bf16 D). */
extern "C" {
#include "cuda_bf16.h"
}

#include "cuda_internal.h"

#include <errno.h>

#include "ops_kernels.cuh"
#include "bf16_kernels.cuh"
#include "launch.cuh"

#define LAUNCH_CHECK(what) CU_CHECK(cudaGetLastError(), what)

extern "C" {

/* The forward of both weight layouts: W (IC,OC) as GPT-2 stores it
 * (w_out_in 0: A = W as stored, ld OC) or nn.Linear's (OC,IC) (w_out_in 1:
 * A = W transposed, ld IC). */
static int proj_fwd(struct st_cuda_ctx *ctx, const char *what, void *out, int out_bf16,
		    const uint16_t *inp, const uint16_t *weight, const uint16_t *bias, int N,
		    int IC, int OC, int w_out_in)
{
	int rc = st_cuda_ctx_enter(ctx);
	const int ta = w_out_in, lda = w_out_in ? IC : OC;

	if (rc)
		return rc;
	cudaStream_t s = st_cuda_ctx_stream(ctx);
	if (N < 0 || IC < 0 || OC < 0)
		return st_error_set(-EINVAL, "cuda: bf16 %s: bad shape", what);
	if (N == 0 || OC == 0)
		return 0;
	size_t n_out = (size_t)N * OC;
	unsigned g = grid_for(n_out, ST_CUDA_ELEM_BLOCK);
	if (IC > 0) {
		rc = st_cuda_lt_matmul(ctx, ta, 0, (uint64_t)OC, (uint64_t)N, (uint64_t)IC, weight,
				       lda, inp, IC, 1, out, out_bf16, OC, 0.0f, bias, 1, 0, NULL);
		if (rc != -ENOTSUP || !bias)
			return rc;
	}
	/* no fused-bias algorithm (or no input channels): rows = bias, then
	 * the product accumulated onto them */
	if (out_bf16)
		k_fill_rows_b<<<g, ST_CUDA_ELEM_BLOCK, 0, s>>>((uint16_t *)out, bias, (size_t)N, OC);
	else
		k_fill_rows_b<<<g, ST_CUDA_ELEM_BLOCK, 0, s>>>((float *)out, bias, (size_t)N, OC);
	CU_CHECK(cudaGetLastError(), what);
	if (IC == 0)
		return 0;
	return st_cuda_lt_matmul(ctx, ta, 0, (uint64_t)OC, (uint64_t)N, (uint64_t)IC, weight, lda,
				 inp, IC, 1, out, out_bf16, OC, 1.0f, NULL, 1, 0, NULL);
}

/* The backward of both layouts (as proj_fwd): dinp^T (IC,N) += W' @
 * dout^T, dW += the product of dout and inp in W's own layout, dbias the
 * column sums of dout. */
static int proj_bwd(struct st_cuda_ctx *ctx, const char *what, uint16_t *dinp, float *dweight,
		    float *dbias, const uint16_t *dout, const uint16_t *inp,
		    const uint16_t *weight, int N, int IC, int OC, int w_out_in)
{
	int rc = st_cuda_ctx_enter(ctx);

	if (rc)
		return rc;
	if (N < 0 || IC < 0 || OC < 0)
		return st_error_set(-EINVAL, "cuda: bf16 %s: bad shape", what);
	if (dinp && N > 0 && IC > 0 && OC > 0) {
		rc = st_cuda_lt_matmul(ctx, !w_out_in, 0, (uint64_t)IC, (uint64_t)N, (uint64_t)OC,
				       weight, w_out_in ? IC : OC, dout, OC, 1, dinp, 1, IC, 1.0f,
				       NULL, 1, 0, NULL);
		if (rc)
			return rc;
	}
	if (dweight && N > 0 && IC > 0 && OC > 0) {
		/* dW^T (OC,IC) = dout^T @ inp, or for (OC,IC) W: dW^T (IC,OC) = inp^T @ dout */
		if (w_out_in)
			rc = st_cuda_lt_matmul(ctx, 0, 1, (uint64_t)IC, (uint64_t)OC, (uint64_t)N,
					       inp, IC, dout, OC, 1, dweight, 0, IC, 1.0f, NULL, 1,
					       0, NULL);
		else
			rc = st_cuda_lt_matmul(ctx, 0, 1, (uint64_t)OC, (uint64_t)IC, (uint64_t)N,
					       dout, OC, inp, IC, 1, dweight, 0, OC, 1.0f, NULL, 1,
					       0, NULL);
		if (rc)
			return rc;
	}
	if (dbias && N > 0 && OC > 0)
		return st_cuda_colsum(ctx, dbias, NULL, dout, NULL, NULL, NULL, N, OC);
	return 0;
}

int st_cuda_bf16_matmul_fwd(struct st_cuda_ctx *ctx, void *out, int out_bf16,
			    const uint16_t *inp, const uint16_t *weight, const uint16_t *bias,
			    int N, int IC, int OC)
{
	return proj_fwd(ctx, "matmul_fwd", out, out_bf16, inp, weight, bias, N, IC, OC, 0);
}

int st_cuda_bf16_matmul_gelu_fwd(struct st_cuda_ctx *ctx, uint16_t *out, uint16_t *pre,
				 const uint16_t *inp, const uint16_t *weight,
				 const uint16_t *bias, int N, int IC, int OC)
{
	int rc = st_cuda_ctx_enter(ctx);

	if (rc)
		return rc;
	if (N < 0 || IC < 0 || OC < 0 || !pre)
		return st_error_set(-EINVAL, "cuda: bf16 matmul_gelu_fwd: bad shape or no pre");
	if (N == 0 || OC == 0)
		return 0;
	if (IC > 0 && OC % 8 == 0) {
		/* GELU_AUX_BIAS: D = gelu(W^T inp + b), aux = the pre-activation,
		 * both bf16 from the one fp32 value (the cpu's rounding) */
		rc = st_cuda_lt_matmul(ctx, 0, 0, (uint64_t)OC, (uint64_t)N, (uint64_t)IC, weight,
				       OC, inp, IC, 1, out, 1, OC, 0.0f, bias, 1, 1, pre);
		if (rc != -ENOTSUP)
			return rc;
	}
	/* no epilogue algorithm: the matmul into pre, then the GELU kernel
	 * (pre rounded to bf16 before the GELU: within bf16 tolerance) */
	rc = st_cuda_bf16_matmul_fwd(ctx, pre, 1, inp, weight, bias, N, IC, OC);
	if (rc)
		return rc;
	return st_cuda_bf16_gelu_fwd(ctx, out, pre, (size_t)N * OC);
}

int st_cuda_bf16_matmul_bwd(struct st_cuda_ctx *ctx, uint16_t *dinp, float *dweight,
			    float *dbias, const uint16_t *dout, const uint16_t *inp,
			    const uint16_t *weight, int N, int IC, int OC)
{
	return proj_bwd(ctx, "matmul_bwd", dinp, dweight, dbias, dout, inp, weight, N, IC, OC, 0);
}

/* LLaMA's linear (nn.Linear: weight (OC,IC) row-major, which is column-
 * major (IC,OC)), mapped as the matmuls above with W transposed:
 *   fwd   out^T (OC,N) = W (OC,IC) @ inp^T (IC,N)      (A = W transposed)
 *   dinp  dinp^T (IC,N) += W^T (IC,OC) @ dout^T (OC,N)
 *   dW    dW^T (IC,OC) += inp^T (IC,N) @ dout (N,OC)  (B = dout transposed) */
int st_cuda_bf16_linear_fwd(struct st_cuda_ctx *ctx, void *out, int out_bf16,
			    const uint16_t *inp, const uint16_t *weight, const uint16_t *bias,
			    int N, int IC, int OC)
{
	return proj_fwd(ctx, "linear_fwd", out, out_bf16, inp, weight, bias, N, IC, OC, 1);
}

int st_cuda_bf16_linear_bwd(struct st_cuda_ctx *ctx, uint16_t *dinp, float *dweight,
			    float *dbias, const uint16_t *dout, const uint16_t *inp,
			    const uint16_t *weight, int N, int IC, int OC)
{
	return proj_bwd(ctx, "linear_bwd", dinp, dweight, dbias, dout, inp, weight, N, IC, OC, 1);
}

int st_cuda_bf16_gemm(struct st_cuda_ctx *ctx, int trans_a, int trans_b, int M, int N, int K,
		      const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
		      float *C, int ldc)
{
	int rc = st_cuda_ctx_enter(ctx);

	if (rc)
		return rc;
	if (M < 0 || N < 0 || K <= 0)
		return st_error_set(-EINVAL, "cuda: bf16 gemm: bad shape (K must be > 0)");
	if (M == 0 || N == 0)
		return 0;
	return st_cuda_lt_matmul(ctx, trans_b, trans_a, (uint64_t)N, (uint64_t)M, (uint64_t)K, B,
				 ldb, A, lda, 1, C, 0, ldc, beta, NULL, 1, 0, NULL);
}

int st_cuda_bf16_layernorm_fwd(struct st_cuda_ctx *ctx, uint16_t *out, float *mean,
			       float *rstd, const float *inp, const uint16_t *weight,
			       const uint16_t *bias, int N, int C)
{
	int rc = st_cuda_ctx_enter(ctx);

	if (rc)
		return rc;
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: bf16 layernorm_fwd: bad shape");
	if (N == 0 || C == 0)
		return 0;
	k_layernorm_fwd_b<<<grid_warp_rows(N), ST_CUDA_ROW_BLOCK, 0, st_cuda_ctx_stream(ctx)>>>(
		out, mean, rstd, inp, weight, bias, N, C);
	LAUNCH_CHECK("bf16 layernorm_fwd");
	return 0;
}

/* A norm's dweight (and dbias) column sums over N rows of dout (bf16 or
 * fp32), LayerNorm's with mean, RMSNorm's with mean NULL; either output
 * may be NULL: ops.cu's two-pass column sums, as the fp32 ops'. */
static int norm_bwd_dw(struct st_cuda_ctx *ctx, float *dweight, float *dbias, const void *dout,
		       int dout_bf16, const float *inp, const float *mean, const float *rstd,
		       int N, int C)
{
	if (dout_bf16)
		return st_cuda_colsum(ctx, dbias, dweight, (const uint16_t *)dout, inp, mean, rstd,
				      N, C);
	return st_cuda_colsum(ctx, dbias, dweight, (const float *)dout, inp, mean, rstd, N, C);
}

int st_cuda_bf16_layernorm_bwd(struct st_cuda_ctx *ctx, float *dinp, float *dweight,
			       float *dbias, const void *dout, int dout_bf16, const float *inp,
			       const uint16_t *weight, const float *mean, const float *rstd,
			       int N, int C)
{
	int rc = st_cuda_ctx_enter(ctx);

	if (rc)
		return rc;
	cudaStream_t s = st_cuda_ctx_stream(ctx);
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: bf16 layernorm_bwd: bad shape");
	if (N == 0 || C == 0)
		return 0;
	if (dinp) {
		if (dout_bf16)
			k_layernorm_bwd_dinp_b<<<grid_warp_rows(N), ST_CUDA_ROW_BLOCK, 0, s>>>(
				dinp, (const uint16_t *)dout, inp, weight, mean, rstd, N, C);
		else
			k_layernorm_bwd_dinp_b<<<grid_warp_rows(N), ST_CUDA_ROW_BLOCK, 0, s>>>(
				dinp, (const float *)dout, inp, weight, mean, rstd, N, C);
		LAUNCH_CHECK("bf16 layernorm_bwd dinp");
	}
	if (dweight || dbias)
		return norm_bwd_dw(ctx, dweight, dbias, dout, dout_bf16, inp, mean, rstd, N, C);
	return 0;
}

int st_cuda_bf16_gelu_fwd(struct st_cuda_ctx *ctx, uint16_t *out, const uint16_t *inp,
			  size_t n)
{
	return elem_launch(ctx, "bf16 gelu_fwd", n, k_gelu_fwd_b, out, inp, n);
}

int st_cuda_bf16_gelu_bwd(struct st_cuda_ctx *ctx, uint16_t *dinp, const uint16_t *inp,
			  const uint16_t *dout, size_t n)
{
	return elem_launch(ctx, "bf16 gelu_bwd", n, k_gelu_bwd_b, dinp, inp, dout, n);
}

int st_cuda_bf16_embedding_fwd(struct st_cuda_ctx *ctx, float *out, const int32_t *tokens,
			       const uint16_t *wte, const uint16_t *wpe, int B, int T, int C)
{
	int rc = st_cuda_ctx_enter(ctx);

	if (rc)
		return rc;
	if (B < 0 || T < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: bf16 embedding_fwd: bad shape");
	size_t n = (size_t)B * T * C;
	if (n == 0)
		return 0;
	k_embedding_fwd_b<<<grid_for(n, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0,
			    st_cuda_ctx_stream(ctx)>>>(out, tokens, wte, wpe, T, C, n);
	LAUNCH_CHECK("bf16 embedding_fwd");
	return 0;
}

/* ---- LLaMA's: ops_kernels.cuh's templated kernels at bf16 ----------------------- */

int st_cuda_bf16_rmsnorm_fwd(struct st_cuda_ctx *ctx, float *res, uint16_t *out, float *rstd,
			     const float *a, const float *b, const uint16_t *weight, float eps,
			     int N, int C)
{
	int rc = st_cuda_ctx_enter(ctx);

	if (rc)
		return rc;
	cudaStream_t s = st_cuda_ctx_stream(ctx);
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: bf16 rmsnorm_fwd: bad shape");
	if (N == 0 || C == 0)
		return 0;
	if (res)
		k_residual_rmsnorm_fwd<<<grid_warp_rows(N), ST_CUDA_ROW_BLOCK, 0, s>>>(
			res, out, rstd, a, b, weight, eps, N, C);
	else
		k_rmsnorm_fwd<<<grid_warp_rows(N), ST_CUDA_ROW_BLOCK, 0, s>>>(out, rstd, a, weight,
									   eps, N, C);
	LAUNCH_CHECK("bf16 rmsnorm_fwd");
	return 0;
}

int st_cuda_bf16_rmsnorm_bwd(struct st_cuda_ctx *ctx, float *dinp, float *dweight,
			     const void *dout, int dout_bf16, const float *inp,
			     const uint16_t *weight, const float *rstd, int N, int C)
{
	int rc = st_cuda_ctx_enter(ctx);

	if (rc)
		return rc;
	cudaStream_t s = st_cuda_ctx_stream(ctx);
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: bf16 rmsnorm_bwd: bad shape");
	if (N == 0 || C == 0)
		return 0;
	if (dinp) {
		if (dout_bf16)
			k_rmsnorm_bwd_dinp<<<grid_warp_rows(N), ST_CUDA_ROW_BLOCK, 0, s>>>(
				dinp, (const uint16_t *)dout, inp, weight, rstd, N, C);
		else
			k_rmsnorm_bwd_dinp<<<grid_warp_rows(N), ST_CUDA_ROW_BLOCK, 0, s>>>(
				dinp, (const float *)dout, inp, weight, rstd, N, C);
		LAUNCH_CHECK("bf16 rmsnorm_bwd dinp");
	}
	if (dweight) /* the layernorm's column sums with mean NULL */
		return norm_bwd_dw(ctx, dweight, NULL, dout, dout_bf16, inp, NULL, rstd, N, C);
	return 0;
}

int st_cuda_bf16_rope(struct st_cuda_ctx *ctx, int bwd, uint16_t *out, const uint16_t *inp,
		      int B, int T, int pos0, int NH, int hd, int stride, int type,
		      int original_ctx, float theta, float factor, float low_freq_factor,
		      float high_freq_factor)
{
	int rc = st_cuda_ctx_enter(ctx);

	if (rc)
		return rc;
	if (B < 0 || T < 0 || NH < 0 || hd < 2 || hd % 2 || (int64_t)NH * hd > stride)
		return st_error_set(-EINVAL, "cuda: bf16 rope: bad shape");
	size_t n = (size_t)B * T * NH * (hd / 2);
	if (n == 0)
		return 0;
	k_rope<<<grid_for(n, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0,
		 st_cuda_ctx_stream(ctx)>>>(out, inp, T, pos0, NH, hd, stride, n, type, original_ctx,
					    theta, factor, low_freq_factor, high_freq_factor,
					    bwd ? -1.0f : 1.0f);
	LAUNCH_CHECK("bf16 rope");
	return 0;
}

int st_cuda_bf16_swiglu_fwd(struct st_cuda_ctx *ctx, uint16_t *out, const uint16_t *gate,
			    const uint16_t *up, size_t n)
{
	return elem_launch(ctx, "bf16 swiglu_fwd", n, k_swiglu_fwd<uint16_t>, out, gate, up, n);
}

int st_cuda_bf16_swiglu_bwd(struct st_cuda_ctx *ctx, uint16_t *dgate, uint16_t *dup,
			    const uint16_t *dout, const uint16_t *gate, const uint16_t *up,
			    size_t n)
{
	return elem_launch(ctx, "bf16 swiglu_bwd", n, k_swiglu_bwd<uint16_t>, dgate, dup, dout, gate,
			   up, n);
}

int st_cuda_bf16_token_embed_fwd(struct st_cuda_ctx *ctx, float *out, const int32_t *tokens,
				 const uint16_t *wte, int N, int C)
{
	int rc = st_cuda_ctx_enter(ctx);

	if (rc)
		return rc;
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: bf16 token_embed_fwd: bad shape");
	size_t n = (size_t)N * C;
	if (n == 0)
		return 0;
	k_token_embed_fwd<<<grid_for(n, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0,
			    st_cuda_ctx_stream(ctx)>>>(out, tokens, wte, C, n);
	LAUNCH_CHECK("bf16 token_embed_fwd");
	return 0;
}

} /* extern "C" */
