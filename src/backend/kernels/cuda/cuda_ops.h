/* strata: the cuda device's ops (.cu files in src/backend/kernels/cuda, behind a C
 * interface). Every op of strata/kernels.h, with the same shapes, argument
 * order and conventions (forward overwrites; backward accumulates, except
 * gelu_bwd and crossentropy_bwd which overwrite), on device pointers, queued
 * on the context's stream. Activations and gradients are fp32; matmul
 * operands may be bf16 (storage) with fp32 accumulation. The cpu kernels are
 * the reference: tests/cuda/test_cuda_ops.c holds each op to relative error
 * ||out - ref|| / ||ref|| <= 1e-2 with bf16 operands and 1e-5 in fp32.
 *
 * The cuda compute (src/backend/compute/compute_cuda.c) reaches these
 * through the op seam (strata/op.h): one case of its run() per op.
 *
 * Built only with nvcc (ST_HAVE_CUDA). Without a GPU, st_cuda_ctx_create()
 * returns -ENODEV and the tests exit 77. Functions return 0 or -errno; the
 * CUDA/cuBLAS message is kept in st_error_last(). Ops only queue work:
 * call st_cuda_sync() before reading results on the host. */
#ifndef STRATA_CUDA_OPS_H
#define STRATA_CUDA_OPS_H

#include "strata/common.h"
#include "strata/cuda.h" /* st_cuda_available(), st_cuda_info(), st_cuda_blas_load() */

#ifdef __cplusplus
extern "C" {
#endif

struct st_cuda_ctx; /* a stream, a cuBLASLt handle and its workspace */

enum st_cuda_dtype { ST_CUDA_F32, ST_CUDA_BF16 };

/* Make a context on GPU `ordinal` with its own stream. -ENODEV without a
 * GPU. *out goes back with st_cuda_ctx_destroy(). */
int st_cuda_ctx_create(int ordinal, struct st_cuda_ctx **out);
void st_cuda_ctx_destroy(struct st_cuda_ctx *ctx);
/* Wait for everything queued on the context. */
int st_cuda_sync(struct st_cuda_ctx *ctx);

/* Order between the context's stream and the cuda device's queues: e is an
 * event of the cuda device (strata/device.h) on the same GPU. record marks
 * the end of what is queued on the context; wait holds what is queued next
 * until e is done (cudaStreamWaitEvent). */
struct st_event;
int st_cuda_ctx_record(struct st_cuda_ctx *ctx, struct st_event *e);
int st_cuda_ctx_wait(struct st_cuda_ctx *ctx, struct st_event *e);

/* A timer: a start and a stop marked on the context's stream (timing
 * events, made on ctx's GPU, whatever the calling thread's current one).
 * read returns 0 while the stop has not been reached, else 1 with the
 * host-clock times (st_now_ns()) the GPU reached start and stop. */
struct st_cuda_timer;
int st_cuda_timer_create(struct st_cuda_ctx *ctx, struct st_cuda_timer **out);
void st_cuda_timer_destroy(struct st_cuda_timer *t);
int st_cuda_timer_mark(struct st_cuda_ctx *ctx, struct st_cuda_timer *t, int stop);
int st_cuda_timer_read(struct st_cuda_ctx *ctx, struct st_cuda_timer *t, uint64_t *t0_ns,
		       uint64_t *t1_ns);

/* Device memory for tests and tools (the engine uses the vram tier). */
int st_cuda_alloc(void **ptr, size_t bytes);
void st_cuda_free(void *ptr);
int st_cuda_h2d(void *dst, const void *src, size_t bytes);
int st_cuda_d2h(void *dst, const void *src, size_t bytes);
/* Fill bytes of device memory with the byte value (poisoning outputs). */
int st_cuda_memset(void *ptr, int value, size_t bytes);

/* Queued on the context's stream (ordered with its ops): fill bytes with
 * the byte value; copy bytes between any two of device memory and host
 * memory (direction from the pointers; a copy from or to pageable host
 * memory is done when it returns, so wait with st_cuda_sync() to read). */
int st_cuda_memset_async(struct st_cuda_ctx *ctx, void *ptr, int value, size_t bytes);
int st_cuda_memcpy_async(struct st_cuda_ctx *ctx, void *dst, const void *src, size_t bytes);

/* ---- casts -------------------------------------------------------------- */
int st_cuda_bf16_to_f32(struct st_cuda_ctx *ctx, float *out, const uint16_t *in, size_t n);
int st_cuda_f32_to_bf16(struct st_cuda_ctx *ctx, uint16_t *out, const float *in, size_t n);

/* ---- matmul (cuBLASLt), Conv1D layout ------------------------------------
 * out (N,OC) = inp (N,IC) @ weight (IC,OC) + bias (OC or NULL); inp and
 * weight are of dtype (fp32 or bf16), out and bias fp32. */
int st_cuda_matmul_fwd(struct st_cuda_ctx *ctx, float *out, const void *inp,
		       const void *weight, const float *bias, int N, int IC, int OC,
		       enum st_cuda_dtype dtype);
/* out (N,OC) = gelu(inp @ weight + bias), fp32, GELU (GPT-2's tanh form) in
 * cuBLASLt's epilogue; pre (N,OC), when not NULL, also gets inp @ weight +
 * bias (the epilogue's aux output). Falls back to matmul_fwd then gelu_fwd
 * where cuBLASLt takes no GELU epilogue for the case. */
int st_cuda_matmul_gelu_fwd(struct st_cuda_ctx *ctx, float *out, float *pre, const float *inp,
			    const float *weight, const float *bias, int N, int IC, int OC);
/* How many matmul_gelu_fwd calls of ctx took the epilogue, and how many the
 * matmul-then-gelu path. */
void st_cuda_ctx_gelu_counts(struct st_cuda_ctx *ctx, uint64_t *fused, uint64_t *unfused);
/* dinp (N,IC) += dout @ weight^T; dweight (IC,OC) += inp^T @ dout;
 * dbias (OC) += column sums of dout; any may be NULL. All fp32. */
int st_cuda_matmul_bwd(struct st_cuda_ctx *ctx, float *dinp, float *dweight, float *dbias,
		       const float *dout, const float *inp, const float *weight, int N,
		       int IC, int OC);

/* Row-major C (M,N) = op(A) @ op(B) + beta * C, op = transpose when
 * trans_* is nonzero (A stored (K,M), B (N,K)), as st_cpu_sgemm() with
 * alpha 1. All fp32. */
int st_cuda_gemm(struct st_cuda_ctx *ctx, int trans_a, int trans_b, int M, int N, int K,
		 const float *A, int lda, const float *B, int ldb, float beta, float *C,
		 int ldc);

/* ---- the rest: as strata/kernels.h --------------------------------------- */
int st_cuda_layernorm_fwd(struct st_cuda_ctx *ctx, float *out, float *mean, float *rstd,
			  const float *inp, const float *weight, const float *bias, int N,
			  int C);
int st_cuda_layernorm_bwd(struct st_cuda_ctx *ctx, float *dinp, float *dweight,
			  float *dbias, const float *dout, const float *inp,
			  const float *weight, const float *mean, const float *rstd, int N,
			  int C);
int st_cuda_gelu_fwd(struct st_cuda_ctx *ctx, float *out, const float *inp, size_t n);
int st_cuda_gelu_bwd(struct st_cuda_ctx *ctx, float *dinp, const float *inp,
		     const float *dout, size_t n);
int st_cuda_residual_fwd(struct st_cuda_ctx *ctx, float *out, const float *a,
			 const float *b, size_t n);
int st_cuda_residual_bwd(struct st_cuda_ctx *ctx, float *da, float *db, const float *dout,
			 size_t n);
int st_cuda_embedding_fwd(struct st_cuda_ctx *ctx, float *out, const int32_t *tokens,
			  const float *wte, const float *wpe, int B, int T, int C);
int st_cuda_embedding_bwd(struct st_cuda_ctx *ctx, float *dwte, float *dwpe,
			  const float *dout, const int32_t *tokens, int B, int T, int C);
/* Flash-style causal attention: no (B,NH,T,T) tensor in memory. */
int st_cuda_attention_fwd(struct st_cuda_ctx *ctx, float *out, float *lse,
			  const float *qkv, int B, int T, int C, int NH);
int st_cuda_attention_bwd(struct st_cuda_ctx *ctx, float *dqkv, const float *dout,
			  const float *qkv, const float *out, const float *lse, int B, int T,
			  int C, int NH);
/* With seg (B,T) int32 in device memory, query t attends to keys
 * [seg[t], t] only (strata/kernels.h's st_cpu_attention_fwd_seg); NULL:
 * the two above. */
int st_cuda_attention_fwd_seg(struct st_cuda_ctx *ctx, float *out, float *lse,
			      const float *qkv, int B, int T, int C, int NH, const int32_t *seg);
int st_cuda_attention_bwd_seg(struct st_cuda_ctx *ctx, float *dqkv, const float *dout,
			      const float *qkv, const float *out, const float *lse, int B, int T,
			      int C, int NH, const int32_t *seg);
int st_cuda_crossentropy_fwd(struct st_cuda_ctx *ctx, float *losses, const float *logits,
			     const int32_t *targets, int N, int V);
int st_cuda_crossentropy_bwd(struct st_cuda_ctx *ctx, float *dlogits, float *losses,
			     const float *logits, const int32_t *targets, float dloss, int N,
			     int V);

/* ---- LLaMA's ops: as strata/kernels.h ------------------------------------
 * nn.Linear (weight (OC,IC)) through cuBLASLt; RMSNorm a warp per row (its
 * dweight through the deterministic column sums); rotary embeddings with
 * strata/rope.h's frequencies; SwiGLU elementwise; the token embedding's
 * scatter as embedding_bwd's (one owner per row); grouped-query attention
 * with the flash kernels' tiles (head size <= 128). */
int st_cuda_linear_fwd(struct st_cuda_ctx *ctx, float *out, const float *inp,
		       const float *weight, const float *bias, int N, int IC, int OC);
int st_cuda_linear_bwd(struct st_cuda_ctx *ctx, float *dinp, float *dweight, float *dbias,
		       const float *dout, const float *inp, const float *weight, int N,
		       int IC, int OC);
int st_cuda_rmsnorm_fwd(struct st_cuda_ctx *ctx, float *out, float *rstd, const float *inp,
			const float *weight, float eps, int N, int C);
int st_cuda_rmsnorm_bwd(struct st_cuda_ctx *ctx, float *dinp, float *dweight,
			const float *dout, const float *inp, const float *weight,
			const float *rstd, int N, int C);
/* DECODE_ATTENTION (strata/op.h): fp32, head size at most this
 * (ops_kernels.cuh's ST_CUDA_DEC_MAX_HD, held equal in ops.cu). */
#define ST_CUDA_DEC_MAX_HD_HOST 256
int st_cuda_decode_attention(struct st_cuda_ctx *ctx, float *out, const float *q,
			     const float *kc, const float *vc, int n, int pos, int NH, int NKV,
			     int hd, int sq);
int st_cuda_rope(struct st_cuda_ctx *ctx, int bwd, float *out, const float *inp, int B, int T,
		 int pos0, int NH, int hd, int stride, int type, int original_ctx, float theta,
		 float factor, float low_freq_factor, float high_freq_factor);
int st_cuda_swiglu_fwd(struct st_cuda_ctx *ctx, float *out, const float *gate,
		       const float *up, size_t n);
int st_cuda_swiglu_bwd(struct st_cuda_ctx *ctx, float *dgate, float *dup, const float *dout,
		       const float *gate, const float *up, size_t n);
int st_cuda_token_embed_fwd(struct st_cuda_ctx *ctx, float *out, const int32_t *tokens,
			    const float *wte, int N, int C);
int st_cuda_token_embed_bwd(struct st_cuda_ctx *ctx, float *dwte, const float *dout,
			    const int32_t *tokens, int N, int C);
int st_cuda_gqa_attention_fwd(struct st_cuda_ctx *ctx, float *out, float *lse,
			      const float *q, const float *k, const float *v, int B, int T,
			      int NH, int NKV, int hd);
int st_cuda_gqa_attention_bwd(struct st_cuda_ctx *ctx, float *dq, float *dk, float *dv,
			      const float *dout, const float *q, const float *k,
			      const float *v, const float *out, const float *lse, int B, int T,
			      int NH, int NKV, int hd);
/* With seg, as st_cuda_attention_fwd_seg(). */
int st_cuda_gqa_attention_fwd_seg(struct st_cuda_ctx *ctx, float *out, float *lse,
				  const float *q, const float *k, const float *v, int B, int T,
				  int NH, int NKV, int hd, const int32_t *seg);
int st_cuda_gqa_attention_bwd_seg(struct st_cuda_ctx *ctx, float *dq, float *dk, float *dv,
				  const float *dout, const float *q, const float *k,
				  const float *v, const float *out, const float *lse, int B,
				  int T, int NH, int NKV, int hd, const int32_t *seg);

/* The optimizer on the GPU (src/backend/kernels/cuda/optim.cu; strata/op.h's ADAMW
 * and GRAD_SUMSQ, bit for bit st_adam_apply(..., ST_ADAM_GRAD_CHECKED) and
 * st_grad_sumsq()). c: the 9 floats of struct st_adam_step in its order.
 * w is fp32 or, with w_bf16, bf16; NULL for none. *bad (device) gets the
 * count of elements left unchanged added to it. */
int st_cuda_adamw(struct st_cuda_ctx *ctx, const float c[9], const float *g, float *p,
		  float *m, float *v, void *w, int w_bf16, uint32_t *bad, size_t n);
/* out (device, 16 bytes): double sumsq, u32 nonfinite, u32 0; scratch of
 * 16 bytes per 16384 elements of g. */
int st_cuda_grad_sumsq(struct st_cuda_ctx *ctx, void *out, void *scratch, const float *g,
		       size_t n);
/* res = a + b, then layernorm / rmsnorm of res, one warp per row (ops.cu):
 * the same bits as st_cuda_residual_fwd then st_cuda_layernorm_fwd /
 * st_cuda_rmsnorm_fwd, with the row read back from where this thread wrote
 * it instead of from memory a second kernel reads. */
int st_cuda_residual_layernorm_fwd(struct st_cuda_ctx *ctx, float *res, float *out, float *mean,
				   float *rstd, const float *a, const float *b,
				   const float *weight, const float *bias, int N, int C);
int st_cuda_residual_rmsnorm_fwd(struct st_cuda_ctx *ctx, float *res, float *out, float *rstd,
				 const float *a, const float *b, const float *weight, float eps,
				 int N, int C);

/* bf16 flash-style causal attention on tensor cores (attention_bf16.cu,
 * mma.sync on sm_80+): the shapes and conventions of st_cuda_attention_fwd
 * /bwd and st_cuda_gqa_attention_fwd/bwd with bf16 q, k, v (or qkv), out
 * and dout, fp32 lse, and gradients (accumulated into) fp32, or bf16 when
 * grad_bf16 (read, added in fp32, rounded). Every sum fp32; the backward
 * deterministic (no atomics). Head size 64 or 128 and 4-byte aligned
 * tensors, else -EINVAL. */
int st_cuda_attention_fwd_bf16(struct st_cuda_ctx *ctx, uint16_t *out, float *lse,
			       const uint16_t *qkv, int B, int T, int C, int NH);
int st_cuda_attention_bwd_bf16(struct st_cuda_ctx *ctx, void *dqkv, int grad_bf16,
			       const uint16_t *dout, const uint16_t *qkv, const uint16_t *out,
			       const float *lse, int B, int T, int C, int NH);
int st_cuda_gqa_attention_fwd_bf16(struct st_cuda_ctx *ctx, uint16_t *out, float *lse,
				   const uint16_t *q, const uint16_t *k, const uint16_t *v, int B,
				   int T, int NH, int NKV, int hd);
int st_cuda_gqa_attention_bwd_bf16(struct st_cuda_ctx *ctx, void *dq, void *dk, void *dv,
				   int grad_bf16, const uint16_t *dout, const uint16_t *q,
				   const uint16_t *k, const uint16_t *v, const uint16_t *out,
				   const float *lse, int B, int T, int NH, int NKV, int hd);
/* The same with seg (B,T) int32 in device memory: query t attends to keys
 * [seg[t], t] only (packed documents, st_cuda_attention_fwd_seg()); NULL:
 * the four above. */
int st_cuda_attention_fwd_bf16_seg(struct st_cuda_ctx *ctx, uint16_t *out, float *lse,
				   const uint16_t *qkv, int B, int T, int C, int NH,
				   const int32_t *seg);
int st_cuda_attention_bwd_bf16_seg(struct st_cuda_ctx *ctx, void *dqkv, int grad_bf16,
				   const uint16_t *dout, const uint16_t *qkv,
				   const uint16_t *out, const float *lse, int B, int T, int C,
				   int NH, const int32_t *seg);
int st_cuda_gqa_attention_fwd_bf16_seg(struct st_cuda_ctx *ctx, uint16_t *out, float *lse,
				       const uint16_t *q, const uint16_t *k, const uint16_t *v,
				       int B, int T, int NH, int NKV, int hd, const int32_t *seg);
int st_cuda_gqa_attention_bwd_bf16_seg(struct st_cuda_ctx *ctx, void *dq, void *dk, void *dv,
				       int grad_bf16, const uint16_t *dout, const uint16_t *q,
				       const uint16_t *k, const uint16_t *v, const uint16_t *out,
				       const float *lse, int B, int T, int NH, int NKV, int hd,
				       const int32_t *seg);
/* Whether the bf16 attention runs head size hs (64 or 128): the rule the
 * four calls above check, for the cuda compute's supports_shape (the model
 * refuses a bf16 step it would fail before the step). Pure: no GPU. */
int st_cuda_attention_bf16_head_ok(int hs);

#ifdef __cplusplus
}
#endif

#endif
