/* strata: what the families' bf16 compute paths share (gpt2_bf16.c,
 * llama_bf16.c; docs/model.md, "bf16 compute"): typed descriptors, the
 * norm and matmul records both blocks build, the
 * bf16 carving, and the head (the final norm, the chunked matmul with the
 * vocabulary and the cross-entropy), written once over the final norm.
 * Internal to src/model; the hooks' contracts are strata/family.h's. */
#ifndef STRATA_MODEL_BF16_HEAD_H
#define STRATA_MODEL_BF16_HEAD_H

#include "strata/compute.h"
#include "strata/family.h"

#include <stdbool.h>
#include <stdint.h>

typedef uint16_t bf16;

#define TB(p, n) st_tensor_1d((p), ST_DTYPE_BF16, (int64_t)(n))
#define TF(p, n) st_tensor_1d((p), ST_DTYPE_F32, (int64_t)(n))

/* n bf16 elements from cv (64-byte aligned, as st_carve). */
static inline bf16 *st_carve_bf16(struct st_carver *cv, size_t n)
{
	return (bf16 *)st_carve(cv, (n + 1) / 2);
}

/* Row-major C (M,N) fp32 = op(A) @ op(B) + beta C, A and B bf16. */
void st_bf16_gemm(struct st_compute *c, int ta, int tb, int M, int N, int K, const bf16 *A,
		  int lda, const bf16 *Bm, int ldb, float beta, float *C, int ldc);

/* The op records every bf16 path builds (each an st_compute_run), with
 * the dtypes of docs/model.md's "bf16 compute": a norm's input, statistics
 * and gradients fp32, its weight and output bf16; a matmul's operands bf16. */

/* out (N,C) bf16 = layernorm(inp (N,C) fp32) with bf16 weight and bias */
void st_bf16_layernorm_fwd(struct st_compute *c, bf16 *out, float *mean, float *rstd,
			   const float *inp, const bf16 *w, const bf16 *b, int N, int C);
/* dinp (N,C) fp32 += layernorm backward of dout (bf16, or fp32 with
 * dout_f32); dw, db (fp32) += ... */
void st_bf16_layernorm_bwd(struct st_compute *c, float *dinp, float *dw, float *db,
			   const void *dout, bool dout_f32, const float *inp, const bf16 *w,
			   const float *mean, const float *rstd, int N, int C);
/* out (N,C) bf16 = rmsnorm(inp (N,C) fp32) with a bf16 weight */
void st_bf16_rmsnorm_fwd(struct st_compute *c, bf16 *out, float *rstd, const float *inp,
			 const bf16 *w, float eps, int N, int C);
/* dinp (N,C) fp32 += rmsnorm backward of dout (bf16, or fp32 with
 * dout_f32); dw (fp32) += ... */
void st_bf16_rmsnorm_bwd(struct st_compute *c, float *dinp, float *dw, const void *dout,
			 bool dout_f32, const float *inp, const bf16 *w, const float *rstd, int N,
			 int C);
/* kind MATMUL_FWD (weight (IC,OC), GPT-2) or LINEAR_FWD (weight (OC,IC),
 * LLaMA): out (N,OC) = inp (N,IC) @ weight + bias, bf16 operands; out bf16,
 * or fp32 with out_f32 (what feeds the residual stream). The two records
 * have the same slots and sizes. */
void st_bf16_mm_fwd(struct st_compute *c, enum st_op_kind kind, void *out, bool out_f32,
		    const bf16 *inp, const bf16 *w, const bf16 *bias, int N, int IC, int OC);
/* kind MATMUL_BWD or LINEAR_BWD: dinp (bf16) += dout @ weight's transpose;
 * dweight, dbias (fp32) += ...; dout, inp, weight bf16. NULL skips a
 * gradient (inp may then be NULL too). */
void st_bf16_mm_bwd(struct st_compute *c, enum st_op_kind kind, bf16 *dinp, float *dw,
		    float *db, const bf16 *dout, const bf16 *inp, const bf16 *w, int N, int IC,
		    int OC);

/* The head of a bf16 path: the final norm (LayerNorm with a bias, or
 * RMSNorm with eps when bias is NULL) of the fp32 x, then logits = xn @
 * W^T with W (V,C) bf16, the cross-entropy in row chunks of
 * ST_MODEL_CE_CHUNK_ROWS, and the gradients: dW (V,C) fp32 and the norm's
 * dweight, dbias (fp32) accumulated, dx fp32 overwritten. */
struct st_bf16_head {
	const bf16 *norm_w, *norm_b; /* norm_b NULL: RMSNorm */
	float eps;                   /* RMSNorm's */
	const bf16 *W;               /* (V,C) */
	float *dnorm_w, *dnorm_b;    /* the backward's; dnorm_b with norm_b */
	float *dW;                   /* (V,C) */
};

/* The head's workspace for N rows of C channels and V logits. */
size_t st_bf16_head_work_bytes(size_t N, size_t C, size_t V);
/* The forward (dx NULL: the loss only) or the forward and backward of the
 * head on batch b; *loss (when loss is not NULL) the mean loss. Queues on
 * the model's compute; the caller takes its error. */
void st_bf16_head_run(const struct st_model *m, const struct st_model_batch *b,
		      const struct st_bf16_head *h, const float *x, float *dx, float *loss,
		      void *work, size_t work_bytes);
/* One position's logits (V fp32) of x (C fp32); 0 or -errno (synced). */
int st_bf16_head_logits(const struct st_model *m, const struct st_bf16_head *h,
			const float *x, float *logits, void *work, size_t work_bytes);

#endif
