/* strata: the cuda device's bf16 ops (src/backend/kernels/cuda/bf16.cu), the ones
 * the GPT-2 bf16 compute path runs (docs/model.md, "bf16 compute"), each
 * the cuda side of an op record the cpu runs by widening
 * (kernels_bf16.h): bf16 operands, fp32 accumulation and
 * arithmetic, each bf16 output rounded once to nearest even. Shapes and
 * conventions as strata/kernels.h (forward overwrites, backward
 * accumulates, gelu_bwd overwrites). The matmuls are cuBLASLt with bf16 A
 * and B and CUBLAS_COMPUTE_32F, the bias through the BIAS epilogue (bf16
 * bias); the rest are kernels in bf16_kernels.cuh, held to the cpu ops on
 * the cpu by tests/cuda/test_bf16_emu.cpp and on a GPU by
 * tests/cuda/test_cuda_bf16.c. 0 or -errno; ops only queue work. */
#ifndef STRATA_CUDA_BF16_H
#define STRATA_CUDA_BF16_H

#include "cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out (N,OC) = inp (N,IC) @ weight (IC,OC) + bias (OC, or NULL); inp,
 * weight, bias bf16; out bf16 (out_bf16) or fp32. */
int st_cuda_bf16_matmul_fwd(struct st_cuda_ctx *ctx, void *out, int out_bf16,
			    const uint16_t *inp, const uint16_t *weight, const uint16_t *bias,
			    int N, int IC, int OC);
/* out (N,OC) = gelu(pre), pre = inp @ weight + bias, all bf16 (pre is
 * required: the backward reads it): cuBLASLt's GELU_AUX_BIAS epilogue,
 * else the matmul then the GELU kernel. */
int st_cuda_bf16_matmul_gelu_fwd(struct st_cuda_ctx *ctx, uint16_t *out, uint16_t *pre,
				 const uint16_t *inp, const uint16_t *weight,
				 const uint16_t *bias, int N, int IC, int OC);
/* dinp (N,IC, bf16) += dout @ weight^T; dweight (IC,OC, fp32) += inp^T @
 * dout; dbias (OC, fp32) += column sums of dout; dout, inp, weight bf16;
 * any gradient NULL is skipped. */
int st_cuda_bf16_matmul_bwd(struct st_cuda_ctx *ctx, uint16_t *dinp, float *dweight,
			    float *dbias, const uint16_t *dout, const uint16_t *inp,
			    const uint16_t *weight, int N, int IC, int OC);
/* Row-major C (M,N) fp32 = op(A) @ op(B) + beta * C, A and B bf16. */
int st_cuda_bf16_gemm(struct st_cuda_ctx *ctx, int trans_a, int trans_b, int M, int N, int K,
		      const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta,
		      float *C, int ldc);
/* out (N,C) bf16 = layernorm of inp (N,C) fp32, weight and bias bf16. */
int st_cuda_bf16_layernorm_fwd(struct st_cuda_ctx *ctx, uint16_t *out, float *mean,
			       float *rstd, const float *inp, const uint16_t *weight,
			       const uint16_t *bias, int N, int C);
/* dinp, dweight, dbias fp32 +=; dout bf16 (dout_bf16) or fp32; weight bf16. */
int st_cuda_bf16_layernorm_bwd(struct st_cuda_ctx *ctx, float *dinp, float *dweight,
			       float *dbias, const void *dout, int dout_bf16, const float *inp,
			       const uint16_t *weight, const float *mean, const float *rstd,
			       int N, int C);
int st_cuda_bf16_gelu_fwd(struct st_cuda_ctx *ctx, uint16_t *out, const uint16_t *inp,
			  size_t n);
int st_cuda_bf16_gelu_bwd(struct st_cuda_ctx *ctx, uint16_t *dinp, const uint16_t *inp,
			  const uint16_t *dout, size_t n);
/* out (B,T,C) fp32 = wte[tokens] + wpe[t], the tables bf16. */
int st_cuda_bf16_embedding_fwd(struct st_cuda_ctx *ctx, float *out, const int32_t *tokens,
			       const uint16_t *wte, const uint16_t *wpe, int B, int T, int C);

/* The head's matmul fused with the cross-entropy (head_ce_bf16.cu, on
 * tensor cores; strata/op.h's HEAD_CROSSENTROPY): losses (N) fp32 =
 * cross-entropy of logits = x (N,C) @ w (V,C)^T against targets, the
 * logits never written; with dx and dw (both, or neither) also dx (N,C)
 * += dloss dlogits @ w and dw (V,C) += dloss dlogits^T @ x, dlogits
 * rounded to bf16 as the unfused path's. scratch (scratch_elems fp32) holds
 * lse and the forward's per-split partials: at least 4 N elements.
 * Deterministic (no atomics). Any N, C, V; x and w 4-byte aligned. */
int st_cuda_head_ce_bf16(struct st_cuda_ctx *ctx, float *losses, float *dx, float *dw,
			 const uint16_t *x, const uint16_t *w, const int32_t *targets,
			 float *scratch, size_t scratch_elems, float dloss, int N, int C,
			 int V);
/* LLaMA's nn.Linear, weight (OC,IC) bf16: out (N,OC) = inp @ weight^T +
 * bias, out bf16 (out_bf16) or fp32; and its backward as matmul_bwd's
 * (dinp bf16 +=, dweight (OC,IC) and dbias fp32 +=). */
int st_cuda_bf16_linear_fwd(struct st_cuda_ctx *ctx, void *out, int out_bf16,
			    const uint16_t *inp, const uint16_t *weight, const uint16_t *bias,
			    int N, int IC, int OC);
int st_cuda_bf16_linear_bwd(struct st_cuda_ctx *ctx, uint16_t *dinp, float *dweight,
			    float *dbias, const uint16_t *dout, const uint16_t *inp,
			    const uint16_t *weight, int N, int IC, int OC);
/* LLaMA's (ops_kernels.cuh's kernels, instantiated at bf16): out (N,C)
 * bf16 = rmsnorm of a (N,C) fp32, weight bf16; with res not NULL, res
 * (fp32) = a + b first and the norm is of res (RESIDUAL_RMSNORM_FWD). */
int st_cuda_bf16_rmsnorm_fwd(struct st_cuda_ctx *ctx, float *res, uint16_t *out, float *rstd,
			     const float *a, const float *b, const uint16_t *weight, float eps,
			     int N, int C);
/* dinp, dweight fp32 +=; dout bf16 (dout_bf16) or fp32; weight bf16. */
int st_cuda_bf16_rmsnorm_bwd(struct st_cuda_ctx *ctx, float *dinp, float *dweight,
			     const void *dout, int dout_bf16, const float *inp,
			     const uint16_t *weight, const float *rstd, int N, int C);
/* ROPE_FWD / ROPE_BWD (bwd) on bf16 rows; out may be inp. */
int st_cuda_bf16_rope(struct st_cuda_ctx *ctx, int bwd, uint16_t *out, const uint16_t *inp,
		      int B, int T, int pos0, int NH, int hd, int stride, int type,
		      int original_ctx, float theta, float factor, float low_freq_factor,
		      float high_freq_factor);
int st_cuda_bf16_swiglu_fwd(struct st_cuda_ctx *ctx, uint16_t *out, const uint16_t *gate,
			    const uint16_t *up, size_t n);
/* dgate, dup overwritten (either may be gate or up). */
int st_cuda_bf16_swiglu_bwd(struct st_cuda_ctx *ctx, uint16_t *dgate, uint16_t *dup,
			    const uint16_t *dout, const uint16_t *gate, const uint16_t *up,
			    size_t n);
/* out (N,C) fp32 = wte[tokens], the table bf16. */
int st_cuda_bf16_token_embed_fwd(struct st_cuda_ctx *ctx, float *out, const int32_t *tokens,
				 const uint16_t *wte, int N, int C);

#ifdef __cplusplus
}
#endif

#endif
