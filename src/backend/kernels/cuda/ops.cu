/* strata: the cuda device's ops (cuda_ops.h) that are kernels of
 * ops_kernels.cuh: casts, layernorm and rmsnorm (also fused with the
 * residual), gelu, residual, swiglu, rope, the embeddings and the
 * cross-entropy; and the column sums the matmuls' bias gradients take
 * too. The matmuls are matmul.cu's, attention is attention.cu's. The cpu
 * kernels (src/backend/kernels/cpu/kernels.c) are the reference for every op's
 * semantics. Every CUDA status is checked and turned into -errno; the
 * native message is kept in st_error_last().
 *
 * Reductions are deterministic: no float atomics anywhere. Column sums over
 * rows (matmul dbias, layernorm dweight/dbias) go in two passes (partial
 * sums over fixed row chunks, then the chunks in order); the embedding's
 * scatter-add by token gives each distinct token to one thread block, which
 * adds that token's rows in position order (the cpu kernel's order). */
#include <cuda_runtime.h>

#include <errno.h>
#include <stdint.h>

extern "C" {
#include "cuda_ops.h"
}
#include "context.cuh"

/* At least `bytes` of scratch on the context's device. Growing waits for
 * the stream: queued work may still read the old buffer. */
static int scratch_get(struct st_cuda_ctx *ctx, size_t bytes, void **out)
{
	if (ctx->scratch_bytes < bytes) {
		size_t want = st_align_up(bytes, (size_t)1 << 20);
		CU_CHECK(cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
		if (ctx->scratch)
			CU_IGNORE(cudaFree(ctx->scratch));
		ctx->scratch = NULL;
		ctx->scratch_bytes = 0;
		CU_CHECK(cudaMalloc(&ctx->scratch, want), "cudaMalloc(scratch)");
		ctx->scratch_bytes = want;
	}
	*out = ctx->scratch;
	return 0;
}

#include "ops_kernels.cuh"
#include "launch.cuh"

/* out1 (C) += column sums of g (N,C, fp32 or bf16); out2 (C) += column
 * sums of g * (inp - mean) * rstd when inp is given. Either output may be
 * NULL. */
template <typename TG>
static int colsum_t(struct st_cuda_ctx *ctx, float *out1, float *out2, const TG *g,
		    const float *inp, const float *mean, const float *rstd, int N, int C)
{
	if (N == 0 || C == 0 || (!out1 && !out2))
		return 0;
	int n_chunks = colsum_chunks(N);
	size_t part_elems = (size_t)n_chunks * C;
	void *scratch = NULL;
	int rc = scratch_get(ctx, 2 * part_elems * sizeof(float), &scratch);
	if (rc)
		return rc;
	float *p1 = (float *)scratch, *p2 = p1 + part_elems;
	dim3 block = colsum_block();
	dim3 grid = colsum_grid(C, n_chunks);
	k_colsum_partial<TG><<<grid, block, 0, ctx->stream>>>(p1, inp ? p2 : NULL, g, inp, mean,
							      rstd, N, C, n_chunks);
	LAUNCH_CHECK("colsum partial");
	unsigned fg = grid_for((size_t)C, ST_CUDA_ELEM_BLOCK);
	if (out1) {
		k_colsum_final<<<fg, ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(out1, p1, C, n_chunks);
		LAUNCH_CHECK("colsum final");
	}
	if (out2 && inp) {
		k_colsum_final<<<fg, ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(out2, p2, C, n_chunks);
		LAUNCH_CHECK("colsum final");
	}
	return 0;
}

int st_cuda_colsum(struct st_cuda_ctx *ctx, float *out1, float *out2, const float *g,
		   const float *inp, const float *mean, const float *rstd, int N, int C)
{
	return colsum_t(ctx, out1, out2, g, inp, mean, rstd, N, C);
}

int st_cuda_colsum(struct st_cuda_ctx *ctx, float *out1, float *out2, const uint16_t *g,
		   const float *inp, const float *mean, const float *rstd, int N, int C)
{
	return colsum_t(ctx, out1, out2, g, inp, mean, rstd, N, C);
}

extern "C" {

/* ---- public: casts ----------------------------------------------------------------- */

int st_cuda_bf16_to_f32(struct st_cuda_ctx *ctx, float *out, const uint16_t *in, size_t n)
{
	return elem_launch(ctx, "bf16_to_f32", n, k_bf16_to_f32, out, in, n);
}

int st_cuda_f32_to_bf16(struct st_cuda_ctx *ctx, uint16_t *out, const float *in, size_t n)
{
	return elem_launch(ctx, "f32_to_bf16", n, k_f32_to_bf16, out, in, n);
}

/* ---- public: the rest ------------------------------------------------------------------ */

int st_cuda_layernorm_fwd(struct st_cuda_ctx *ctx, float *out, float *mean, float *rstd,
			  const float *inp, const float *weight, const float *bias, int N,
			  int C)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: layernorm_fwd: bad shape");
	if (N == 0 || C == 0)
		return 0;
	k_layernorm_fwd<<<grid_warp_rows(N), ST_CUDA_ROW_BLOCK, 0, ctx->stream>>>(
		out, mean, rstd, inp, weight, bias, N, C);
	LAUNCH_CHECK("layernorm_fwd");
	return 0;
}

int st_cuda_layernorm_bwd(struct st_cuda_ctx *ctx, float *dinp, float *dweight,
			  float *dbias, const float *dout, const float *inp,
			  const float *weight, const float *mean, const float *rstd, int N,
			  int C)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: layernorm_bwd: bad shape");
	if (N == 0 || C == 0)
		return 0;
	if (dinp) {
		k_layernorm_bwd_dinp<<<grid_warp_rows(N), ST_CUDA_ROW_BLOCK, 0, ctx->stream>>>(
			dinp, dout, inp, weight, mean, rstd, N, C);
		LAUNCH_CHECK("layernorm_bwd dinp");
	}
	if (dweight || dbias)
		return st_cuda_colsum(ctx, dbias, dweight, dout, inp, mean, rstd, N, C);
	return 0;
}

int st_cuda_gelu_fwd(struct st_cuda_ctx *ctx, float *out, const float *inp, size_t n)
{
	return elem_launch(ctx, "gelu_fwd", n, k_gelu_fwd, out, inp, n);
}

int st_cuda_gelu_bwd(struct st_cuda_ctx *ctx, float *dinp, const float *inp,
		     const float *dout, size_t n)
{
	return elem_launch(ctx, "gelu_bwd", n, k_gelu_bwd, dinp, inp, dout, n);
}

int st_cuda_residual_fwd(struct st_cuda_ctx *ctx, float *out, const float *a,
			 const float *b, size_t n)
{
	return elem_launch(ctx, "residual_fwd", n, k_residual_fwd, out, a, b, n);
}

int st_cuda_residual_bwd(struct st_cuda_ctx *ctx, float *da, float *db, const float *dout,
			 size_t n)
{
	return elem_launch(ctx, "residual_bwd", n, k_residual_bwd, da, db, dout, n);
}

int st_cuda_embedding_fwd(struct st_cuda_ctx *ctx, float *out, const int32_t *tokens,
			  const float *wte, const float *wpe, int B, int T, int C)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (B < 0 || T < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: embedding_fwd: bad shape");
	size_t n = (size_t)B * T * C;
	if (n == 0)
		return 0;
	k_embedding_fwd<<<grid_for(n, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(
		out, tokens, wte, wpe, T, C, n);
	LAUNCH_CHECK("embedding_fwd");
	return 0;
}

int st_cuda_embedding_bwd(struct st_cuda_ctx *ctx, float *dwte, float *dwpe,
			  const float *dout, const int32_t *tokens, int B, int T, int C)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (B < 0 || T < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: embedding_bwd: bad shape");
	if ((size_t)B * T * C == 0)
		return 0;
	int BT = B * T;
	if (dwte) {
		k_embedding_bwd_wte<<<grid_block_items(BT), ST_CUDA_EMB_BLOCK, 0,
				      ctx->stream>>>(dwte, dout, tokens, BT, C);
		LAUNCH_CHECK("embedding_bwd wte");
	}
	if (dwpe) {
		k_embedding_bwd_wpe<<<grid_for((size_t)T * C, ST_CUDA_ELEM_BLOCK),
				      ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(dwpe, dout, B, T, C);
		LAUNCH_CHECK("embedding_bwd wpe");
	}
	return 0;
}

int st_cuda_crossentropy_fwd(struct st_cuda_ctx *ctx, float *losses, const float *logits,
			     const int32_t *targets, int N, int V)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || V <= 0)
		return st_error_set(-EINVAL, "cuda: crossentropy_fwd: bad shape");
	if (N == 0)
		return 0;
	k_crossentropy_fwd<<<grid_block_items(N), ST_CUDA_CE_BLOCK, 0,
			     ctx->stream>>>(losses, logits, targets, N, V);
	LAUNCH_CHECK("crossentropy_fwd");
	return 0;
}

int st_cuda_crossentropy_bwd(struct st_cuda_ctx *ctx, float *dlogits, float *losses,
			     const float *logits, const int32_t *targets, float dloss, int N,
			     int V)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || V <= 0)
		return st_error_set(-EINVAL, "cuda: crossentropy_bwd: bad shape");
	if (N == 0)
		return 0;
	k_crossentropy_bwd<<<grid_block_items(N), ST_CUDA_CE_BLOCK, 0,
			     ctx->stream>>>(dlogits, losses, logits, targets, dloss, N, V);
	LAUNCH_CHECK("crossentropy_bwd");
	return 0;
}



int st_cuda_rmsnorm_fwd(struct st_cuda_ctx *ctx, float *out, float *rstd, const float *inp,
			const float *weight, float eps, int N, int C)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: rmsnorm_fwd: bad shape");
	if (N == 0 || C == 0)
		return 0;
	k_rmsnorm_fwd<<<grid_warp_rows(N), ST_CUDA_ROW_BLOCK, 0, ctx->stream>>>(out, rstd, inp,
										  weight, eps, N, C);
	LAUNCH_CHECK("rmsnorm_fwd");
	return 0;
}

int st_cuda_rmsnorm_bwd(struct st_cuda_ctx *ctx, float *dinp, float *dweight,
			const float *dout, const float *inp, const float *weight,
			const float *rstd, int N, int C)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: rmsnorm_bwd: bad shape");
	if (N == 0 || C == 0)
		return 0;
	if (dinp) {
		k_rmsnorm_bwd_dinp<<<grid_warp_rows(N), ST_CUDA_ROW_BLOCK, 0, ctx->stream>>>(
			dinp, dout, inp, weight, rstd, N, C);
		LAUNCH_CHECK("rmsnorm_bwd dinp");
	}
	/* dweight += column sums of g * x * rstd (mean NULL) */
	if (dweight)
		return st_cuda_colsum(ctx, NULL, dweight, dout, inp, NULL, rstd, N, C);
	return 0;
}

static_assert(ST_CUDA_DEC_MAX_HD == ST_CUDA_DEC_MAX_HD_HOST, "cuda_ops.h's decoder bound");

int st_cuda_decode_attention(struct st_cuda_ctx *ctx, float *out, const float *q,
			     const float *kc, const float *vc, int n, int pos, int NH, int NKV,
			     int hd, int sq)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (n < 0 || pos < 0 || NKV < 1 || NH < NKV || NH % NKV || hd < 1 ||
	    hd > ST_CUDA_DEC_MAX_HD || sq < NH * hd || n > ST_CUDA_MAX_GRID)
		return st_error_set(-EINVAL, "cuda: decode_attention: bad shape (n %d, heads %d/%d, "
				    "head %d: at most %d)", n, NH, NKV, hd, ST_CUDA_DEC_MAX_HD);
	if (n == 0 || NH == 0)
		return 0;
	k_decode_attention<<<dim3((unsigned)NH, (unsigned)n), 32 * ST_CUDA_DEC_WARPS, 0,
			     ctx->stream>>>(out, q, kc, vc, pos, NH, NKV, hd, sq);
	LAUNCH_CHECK("decode_attention");
	return 0;
}

int st_cuda_rope(struct st_cuda_ctx *ctx, int bwd, float *out, const float *inp, int B, int T,
		 int pos0, int NH, int hd, int stride, int type, int original_ctx, float theta,
		 float factor, float low_freq_factor, float high_freq_factor)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (B < 0 || T < 0 || NH < 0 || hd < 2 || hd % 2 || (int64_t)NH * hd > stride)
		return st_error_set(-EINVAL, "cuda: rope: bad shape");
	size_t n = (size_t)B * T * NH * (hd / 2);
	if (n == 0)
		return 0;
	k_rope<<<grid_for(n, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0, ctx->stream>>>(
		out, inp, T, pos0, NH, hd, stride, n, type, original_ctx, theta, factor,
		low_freq_factor, high_freq_factor, bwd ? -1.0f : 1.0f);
	LAUNCH_CHECK("rope");
	return 0;
}

int st_cuda_swiglu_fwd(struct st_cuda_ctx *ctx, float *out, const float *gate,
		       const float *up, size_t n)
{
	return elem_launch(ctx, "swiglu_fwd", n, k_swiglu_fwd<float>, out, gate, up, n);
}

int st_cuda_swiglu_bwd(struct st_cuda_ctx *ctx, float *dgate, float *dup, const float *dout,
		       const float *gate, const float *up, size_t n)
{
	return elem_launch(ctx, "swiglu_bwd", n, k_swiglu_bwd<float>, dgate, dup, dout, gate, up, n);
}

int st_cuda_token_embed_fwd(struct st_cuda_ctx *ctx, float *out, const int32_t *tokens,
			    const float *wte, int N, int C)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: token_embed_fwd: bad shape");
	size_t n = (size_t)N * C;
	if (n == 0)
		return 0;
	k_token_embed_fwd<<<grid_for(n, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0,
			    ctx->stream>>>(out, tokens, wte, C, n);
	LAUNCH_CHECK("token_embed_fwd");
	return 0;
}

int st_cuda_token_embed_bwd(struct st_cuda_ctx *ctx, float *dwte, const float *dout,
			    const int32_t *tokens, int N, int C)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: token_embed_bwd: bad shape");
	if ((size_t)N * C == 0)
		return 0;
	k_embedding_bwd_wte<<<grid_block_items(N), ST_CUDA_EMB_BLOCK, 0, ctx->stream>>>(
		dwte, dout, tokens, N, C);
	LAUNCH_CHECK("token_embed_bwd");
	return 0;
}

} /* extern "C" */


int st_cuda_residual_layernorm_fwd(struct st_cuda_ctx *ctx, float *res, float *out, float *mean,
				   float *rstd, const float *a, const float *b,
				   const float *weight, const float *bias, int N, int C)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: residual_layernorm_fwd: bad shape");
	if (N == 0 || C == 0)
		return 0;
	k_residual_layernorm_fwd<<<grid_warp_rows(N), ST_CUDA_ROW_BLOCK, 0, ctx->stream>>>(
		res, out, mean, rstd, a, b, weight, bias, N, C);
	LAUNCH_CHECK("residual_layernorm_fwd");
	return 0;
}

int st_cuda_residual_rmsnorm_fwd(struct st_cuda_ctx *ctx, float *res, float *out, float *rstd,
				 const float *a, const float *b, const float *weight, float eps,
				 int N, int C)
{
	int rc = ctx_enter(ctx);
	if (rc)
		return rc;
	if (N < 0 || C < 0)
		return st_error_set(-EINVAL, "cuda: residual_rmsnorm_fwd: bad shape");
	if (N == 0 || C == 0)
		return 0;
	k_residual_rmsnorm_fwd<<<grid_warp_rows(N), ST_CUDA_ROW_BLOCK, 0, ctx->stream>>>(
		res, out, rstd, a, b, weight, eps, N, C);
	LAUNCH_CHECK("residual_rmsnorm_fwd");
	return 0;
}
