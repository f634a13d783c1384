/* strata: what a family's body is written with, internal to src/model: the
 * typed op records of its layers (ops.c), the one unit driver every
 * family's fwd/bwd hooks are (unit.c) and the one head (head.c).
 *
 * The dtype is data. A body is written once; its records carry the
 * model's compute dtype (st_model_precision(): fp32, or bf16 under
 * --compute-dtype bf16; docs/model.md, "bf16 compute") on these tensors:
 *   dt    W as it is stored (never widened), and every tensor a matmul, the
 *         attention, RoPE, GELU or SwiGLU reads or writes inside a block
 *         (the saved forward and its gradients); the head's normalised
 *         input and its logits' gradient
 *   fp32  the residual stream between units and inside a block (x, y and
 *         their gradients), the norms' statistics, the attention's lse,
 *         the logits, the loss, and every dW (accumulated into the unit's
 *         fp32 gradient)
 * Norms, softmax and cross-entropy compute in fp32; a matmul accumulates
 * in fp32. The casts the bf16 path needs (an fp32 gradient fed to a
 * matmul) are st_mop_cast(), which does nothing at fp32: at fp32 every
 * record is the reference one, bit for bit the fp32 path. */
#ifndef STRATA_MODEL_BODY_H
#define STRATA_MODEL_BODY_H

#include "strata/compute.h"
#include "strata/family.h"

#include <stdbool.h>
#include <stdint.h>

/* ---- typed records ---- */

/* What a body's records are built with: the model's compute and its
 * compute dtype (weights and activations between ops). */
struct st_mop {
	struct st_compute *c;
	enum st_dtype dt;
};

static inline struct st_mop st_mop_of(const struct st_model *m)
{
	struct st_mop o = { st_model_compute(m), st_model_precision(m) == ST_PRECISION_BF16
							 ? ST_DTYPE_BF16
							 : ST_DTYPE_F32 };
	return o;
}

/* Bytes of n elements of the compute dtype. */
static inline size_t st_mop_bytes(const struct st_mop *o, size_t n)
{
	return n * st_dtype_elem_bytes(o->dt);
}

/* Tensor k of a flat buffer (its element offset off), whatever the
 * buffer's dtype. */
static inline const void *st_mop_at(const struct st_mop *o, const void *base, size_t off)
{
	return (const char *)base + st_mop_bytes(o, off);
}

/* n elements of dtype dt from cv (64-byte aligned, as st_carve). */
static inline void *st_carve_dt(struct st_carver *cv, size_t n, enum st_dtype dt)
{
	return st_carve(cv, (n * st_dtype_elem_bytes(dt) + sizeof(float) - 1) / sizeof(float));
}

/* Room for st_mop_cast() of n fp32 elements to dt: none at fp32 (the cast
 * is the fp32 tensor itself). */
static inline void *st_carve_cast(struct st_carver *cv, size_t n, enum st_dtype dt)
{
	return dt == ST_DTYPE_F32 ? NULL : st_carve_dt(cv, n, dt);
}

/* src (n fp32) in the compute dtype: src itself at fp32 (no record, no
 * copy), else dst (carved by st_carve_cast) after an F32_TO_BF16 record. */
const void *st_mop_cast(const struct st_mop *o, void *dst, const float *src, size_t n);

/* The records, each one st_compute_run() (shapes and conventions as
 * strata/op.h's; "dt" tensors in o->dt, the others fp32). */

/* out (N,C) dt = layernorm(inp (N,C) fp32) with dt weight and bias */
void st_mop_layernorm_fwd(const struct st_mop *o, void *out, float *mean, float *rstd,
			  const float *inp, const void *w, const void *b, int N, int C);
/* dinp (N,C) fp32 += the backward of dout (dtype dout_dt); dw, db += */
void st_mop_layernorm_bwd(const struct st_mop *o, float *dinp, float *dw, float *db,
			  const void *dout, enum st_dtype dout_dt, const float *inp,
			  const void *w, const float *mean, const float *rstd, int N, int C);
/* res (N,C) fp32 = a + b, then out (dt) = layernorm(res): one record where
 * the compute has it (the same bits as the two), else the two */
void st_mop_residual_layernorm_fwd(const struct st_mop *o, float *res, void *out, float *mean,
				   float *rstd, const float *a, const float *b, const void *w,
				   const void *bias, int N, int C);
/* out (N,C) dt = rmsnorm(inp (N,C) fp32) with a dt weight */
void st_mop_rmsnorm_fwd(const struct st_mop *o, void *out, float *rstd, const float *inp,
			const void *w, float eps, int N, int C);
void st_mop_rmsnorm_bwd(const struct st_mop *o, float *dinp, float *dw, const void *dout,
			enum st_dtype dout_dt, const float *inp, const void *w,
			const float *rstd, int N, int C);
/* res = a + b, then out (dt) = rmsnorm(res): likewise */
void st_mop_residual_rmsnorm_fwd(const struct st_mop *o, float *res, void *out, float *rstd,
				 const float *a, const float *b, const void *w, float eps, int N,
				 int C);
/* kind MATMUL_FWD (weight (IC,OC), GPT-2) or LINEAR_FWD (weight (OC,IC),
 * LLaMA): out (N,OC) = inp (N,IC) @ weight + bias; inp, weight, bias dt,
 * out dtype out_dt (fp32 for what feeds the residual stream) */
void st_mop_mm_fwd(const struct st_mop *o, enum st_op_kind kind, void *out,
		   enum st_dtype out_dt, const void *inp, const void *w, const void *bias, int N,
		   int IC, int OC);
/* kind MATMUL_BWD or LINEAR_BWD: dinp (dt) += dout @ weight's transpose;
 * dw, db (fp32) += ...; dout, inp, weight dt. NULL skips a gradient. */
void st_mop_mm_bwd(const struct st_mop *o, enum st_op_kind kind, void *dinp, float *dw,
		   float *db, const void *dout, const void *inp, const void *w, int N, int IC,
		   int OC);
/* gel (N,OC) = gelu(pre), pre = inp @ W + b, both dt: one record where the
 * compute has it, else the two */
void st_mop_mm_gelu_fwd(const struct st_mop *o, void *gel, void *pre, const void *inp,
			const void *w, const void *bias, int N, int IC, int OC);
void st_mop_gelu_bwd(const struct st_mop *o, void *dinp, const void *inp, const void *dout,
		     size_t n);
/* GPT-2's attention over qkv (B,T,3C); lse (B,NH,T) fp32 */
void st_mop_attention_fwd(const struct st_mop *o, void *out, float *lse, const void *qkv,
			  const int32_t *seg, int B, int T, int C, int NH);
void st_mop_attention_bwd(const struct st_mop *o, void *dqkv, const void *dout,
			  const void *qkv, const void *out, const float *lse, const int32_t *seg,
			  int B, int T, int C, int NH);
/* LLaMA's grouped attention; lse (B,NH,T) fp32. seg (B,T) int32 or NULL,
 * as strata/op.h's ATTENTION_FWD (the record's slot is I32 either way) */
void st_mop_gqa_fwd(const struct st_mop *o, void *out, float *lse, const void *q,
		    const void *k, const void *v, const int32_t *seg, int B, int T, int NH,
		    int NKV, int hd);
void st_mop_gqa_bwd(const struct st_mop *o, void *dq, void *dk, void *dv, const void *dout,
		    const void *q, const void *k, const void *v, const void *out,
		    const float *lse, const int32_t *seg, int B, int T, int NH, int NKV, int hd);
/* the rotation of NH heads in rows of stride elements of x, in place */
void st_mop_rope(const struct st_mop *o, bool bwd, void *x, int B, int T, int NH, int hd,
		 int stride, const struct st_rope_args *r);
/* The decoder's (fp32): the rotation of n rows of x at positions pos..,
 * and the attention of n query rows (q, rows of sq) at pos.. over the
 * cache's rows 0 .. pos + i (strata/op.h's DECODE_ATTENTION) */
void st_mop_rope_at(const struct st_mop *o, float *x, int n, int pos, int NH, int hd,
		    int stride, const struct st_rope_args *r);
void st_mop_decode_attention(const struct st_mop *o, float *out, const float *q, int sq,
			     const float *kc, const float *vc, int pos, int n, int NH, int NKV,
			     int hd);
void st_mop_swiglu_fwd(const struct st_mop *o, void *out, const void *gate, const void *up,
		       size_t n);
/* dgate, dup (overwritten; may be gate and up) from dout */
void st_mop_swiglu_bwd(const struct st_mop *o, void *dgate, void *dup, const void *dout,
		       const void *gate, const void *up, size_t n);
/* Row-major C (M,N) fp32 = op(A) @ op(B) + beta C, A and B dt */
void st_mop_gemm(const struct st_mop *o, int ta, int tb, int M, int N, int K, const void *A,
		 int lda, const void *Bm, int ldb, float beta, float *C, int ldc);

/* ---- the head ---- */

/* The head of every family: the final norm (LayerNorm with a bias, or
 * RMSNorm with eps when norm_b is NULL) of the fp32 x, then logits = xn @
 * W^T with W (V,C), the cross-entropy in row chunks of
 * ST_MODEL_CE_CHUNK_ROWS, and the gradients: dW (V,C) fp32 and the norm's
 * dweight, dbias (fp32) accumulated, dx fp32 overwritten. The norm's
 * weights and W are in the compute dtype. */
struct st_head {
	const void *norm_w, *norm_b; /* norm_b NULL: RMSNorm */
	float eps;                   /* RMSNorm's */
	const void *W;               /* (V,C) */
	float *dnorm_w, *dnorm_b;    /* the backward's; dnorm_b with norm_b */
	float *dW;                   /* (V,C) */
};

/* The head's workspace for N rows (layernorm: the final norm is
 * LayerNorm, else RMSNorm). */
size_t st_head_work_bytes(const struct st_model *m, bool layernorm, size_t N);
/* The forward (dx NULL: the loss only) or the forward and backward of the
 * head on batch b; *loss (when loss is not NULL) the mean loss. Queues on
 * the model's compute; the caller takes its error. */
void st_head_run(const struct st_model *m, const struct st_model_batch *b,
		 const struct st_head *h, const float *x, float *dx, float *loss, void *work,
		 size_t work_bytes);
/* One position's logits (V fp32) of x (C fp32); 0 or -errno (synced). */
int st_head_logits(const struct st_model *m, const struct st_head *h, const float *x,
		   float *logits, void *work, size_t work_bytes);

/* ---- the unit driver ---- */

/* What a family's body gives the driver (its st_family_ops' body): the
 * embedding, the block and the head's tensors. Every hook queues on the
 * model's compute (st_mop_of(m)); the driver takes the errors. */
struct st_family_body {
	/* The final norm is LayerNorm (else RMSNorm): the head's workspace. */
	bool layernorm;
	/* y (B,T,C) fp32 from batch b's tokens and unit 0's params */
	void (*embed_fwd)(const struct st_model *m, const struct st_model_batch *b,
			  const void *params, float *y);
	/* unit 0's grad (fp32) += from dy (B,T,C) fp32 */
	void (*embed_bwd)(const struct st_model *m, const struct st_model_batch *b,
			  const float *dy, float *grad);
	/* A block's buffers for B x T: the forward's (what the backward reads:
	 * a kept unit's saved part) from sv, the backward's scratch from sc;
	 * sv and sc are one carver when the backward recomputes the forward.
	 * Sizes only: the driver's work_bytes and saved_bytes. */
	void (*block_carve)(const struct st_model *m, int B, int T, struct st_carver *sv,
			    struct st_carver *sc);
	/* Block unit u's forward, its buffers carved from sv and sc as
	 * block_carve does; seg the batch's (B,T) segment starts or NULL
	 * (strata/model.h's struct st_model_batch), for the attention. */
	void (*block_fwd)(const struct st_model *m, int u, int B, int T, const int32_t *seg,
			  const void *params,
			  const float *x, float *y, struct st_carver *sv, struct st_carver *sc);
	/* Its backward; kept: the forward's buffers hold this unit's forward
	 * (block_fwd ran into them with the same params and x), else they
	 * are recomputed. */
	void (*block_bwd)(const struct st_model *m, int u, int B, int T, const int32_t *seg,
			  const void *params,
			  const float *x, const float *dy, float *dx, float *grad,
			  struct st_carver *sv, struct st_carver *sc, bool kept);
	/* The head's tensors: params the head unit's, other its reads_unit's
	 * (NULL when none); grad and other_grad NULL for the forward. */
	struct st_head (*head)(const struct st_model *m, const void *params, const void *other,
			       float *grad, float *other_grad);
	/* Decoding with a KV cache (decode.c; NULL: the family does not
	 * decode). y (n,C) fp32 from the n tokens at positions pos.. */
	void (*embed_at)(const struct st_model *m, const int32_t *tokens, int n, int pos,
			 const void *params, float *y);
	/* Block unit u on the n rows of x at positions pos..pos+n-1: their K
	 * and V (fp32, rows of st_decode_kv_dim(), after RoPE) go into rows
	 * pos.. of kc and vc, each row attends over rows 0..its own; buffers
	 * carved from cv as block_carve(m, 1, n, cv, cv) does. y (n,C) fp32.
	 * 0 or -errno (the compute's errors are taken by the caller). */
	int (*block_decode)(const struct st_model *m, int u, int pos, int n, const void *params,
			     const float *x, float *y, float *kc, float *vc, struct st_carver *cv);
};

/* ---- decoding (decode.c) ---- */

/* Channels of a position's K (and of its V): kv heads x head_dim. */
int st_decode_kv_dim(const struct st_model_config *cfg);
/* The st_family_ops hooks of a family with a body (strata/family.h's
 * contracts): the embed / blocks / head switch, the workspace carving and
 * the kept forward, written once. */
size_t st_unit_work_bytes(const struct st_model *m, int u, int B, int T);
size_t st_unit_saved_bytes(const struct st_model *m, int u, int B, int T,
			   size_t *scratch_bytes);
/* Every unit's output is (B,T,C) fp32. */
size_t st_unit_act_bytes(const struct st_model *m, int u, int B, int T);
int st_unit_fwd(const struct st_model *m, int u, const struct st_model_batch *batch,
		const void *params, const void *other, const float *x, float *y, float *loss,
		void *work, size_t work_bytes);
int st_unit_bwd(const struct st_model *m, int u, const struct st_model_batch *batch,
		const void *params, const void *other, const float *x, const float *dy,
		float *dx, float *grad, float *other_grad, float *loss, void *work,
		size_t work_bytes);
int st_unit_fwd_save(const struct st_model *m, int u, const struct st_model_batch *batch,
		     const void *params, const void *other, const float *x, float *y,
		     float *loss, void *saved, size_t saved_bytes, void *work,
		     size_t work_bytes);
int st_unit_bwd_saved(const struct st_model *m, int u, const struct st_model_batch *batch,
		      const void *params, const void *other, const float *x, const float *dy,
		      float *dx, float *grad, float *other_grad, float *loss, void *saved,
		      size_t saved_bytes, void *work, size_t work_bytes);
int st_unit_logits(const struct st_model *m, const void *params, const void *other,
		   const float *x, float *logits, void *work, size_t work_bytes);

#endif
