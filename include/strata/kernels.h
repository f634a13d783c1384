/* strata: cpu device kernels (OpenMP + BLAS), the numerical reference.
 *
 * llm.c style: the output comes first, shapes are said in a comment, every
 * tensor is row-major fp32. B is the batch, T the sequence length, C the
 * channels, NH the heads, V the vocabulary. "N rows" means B*T.
 *
 * Conventions shared by every kernel:
 *  - forward kernels overwrite their outputs;
 *  - backward kernels ACCUMULATE (+=) into every gradient they are given
 *    (dinp, dweight, dbias...), so the caller zeroes what must start at 0;
 *    two exceptions overwrite so they can run in place, and say so:
 *    st_cpu_gelu_bwd and st_cpu_crossentropy_bwd;
 *  - results are bit-identical at any OpenMP thread count: reductions are
 *    split by a fixed partition that depends only on the shapes (never on
 *    the thread count), and there are no atomics. Every matmul goes through
 *    st_cpu_sgemm(), which tiles the output by shape and runs one
 *    single-threaded BLAS call per tile, because OpenBLAS's own threading
 *    is not bitwise stable across thread counts (measured: 0.3.21 sgemm
 *    256x768x2304 differs in 9% of the elements between 1 and 2 threads).
 * Kernels never allocate and never fail: shapes are the caller's contract
 * (asserted). */
#ifndef STRATA_KERNELS_H
#define STRATA_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- bf16 <-> fp32 --------------------------------------------------------
 * bf16 is the top half of an fp32. fp32 -> bf16 rounds to nearest, ties to
 * even; a NaN stays a NaN (made quiet, sign kept); infinities and denormals
 * pass through (no flushing). bf16 -> fp32 is exact. */
static inline uint16_t st_cpu_bf16_from_f32(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign, set quiet bit */
		return (uint16_t)((u >> 16) | 0x0040u);
	u += 0x7fffu + ((u >> 16) & 1u); /* RNE; overflow carries into inf */
	return (uint16_t)(u >> 16);
}

static inline float st_cpu_f32_from_bf16(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* out is (n), in is (n). Whole flat buffers; OpenMP over fixed chunks. */
void st_cpu_bf16_to_f32(float *out, const uint16_t *in, size_t n_elems);
void st_cpu_f32_to_bf16(uint16_t *out, const float *in, size_t n_elems);

/* memset(p, 0, bytes) and memcpy(dst, src, bytes) (not overlapping), in
 * fixed chunks over OpenMP's threads: one core does not fill the memory's
 * bandwidth. */
void st_cpu_zero(void *p, size_t bytes);
void st_cpu_copy(void *dst, const void *src, size_t bytes);

/* ---- matmul ---------------------------------------------------------------
 * Row-major C (M,N) = alpha * op(A) @ op(B) + beta * C, with op = transpose
 * when trans_* is nonzero (A is then stored (K,M), B (N,K)). Tiled over the
 * output by a shape-only partition; deterministic at any thread count. When
 * called from inside an active OpenMP region it runs on the calling thread. */
void st_cpu_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha,
		  const float *A, int lda, const float *B, int ldb, float beta,
		  float *C, int ldc);

/* The tile st_cpu_sgemm cuts an (M,N) output into: at least a few tiles
 * where the shape allows, in the grid that re-packs the fewest elements of
 * A and B. A function of M and N alone (tools/gemm-split prints it). */
void st_cpu_gemm_tiles(int M, int N, int *tile_m, int *tile_n);

/* Conv1D layout (Hugging Face GPT-2): y = x @ W + b with W stored (in,out).
 * out is (N,OC), inp is (N,IC), weight is (IC,OC), bias is (OC) or NULL. */
void st_cpu_matmul_fwd(float *out, const float *inp, const float *weight,
		       const float *bias, int N, int IC, int OC);
/* The same with bf16 operands: out (N,OC) = inp (N,IC) @ weight (IC,OC) +
 * bias (OC, or NULL), inp and weight bf16, out and bias fp32. Each output
 * is bias (or 0) plus the products in input-channel order, accumulated in
 * fp32 (the products of two bf16 are exact in fp32); rows are split over
 * threads, so the bits do not depend on the thread count. A reference
 * loop, not a fast path: nothing in the step uses it. */
void st_cpu_matmul_fwd_bf16(float *out, const uint16_t *inp, const uint16_t *weight,
			    const float *bias, int N, int IC, int OC);
/* dinp (N,IC) += dout @ weight^T; dweight (IC,OC) += inp^T @ dout;
 * dbias (OC) += column sums of dout. Any of dinp, dweight, dbias may be NULL
 * (that gradient is skipped). dout is (N,OC). */
void st_cpu_matmul_bwd(float *dinp, float *dweight, float *dbias,
		       const float *dout, const float *inp, const float *weight,
		       int N, int IC, int OC);

/* ---- layernorm (eps 1e-5, biased variance, as torch) -------------------- */
/* out is (N,C); mean and rstd are (N) and are kept for the backward. */
void st_cpu_layernorm_fwd(float *out, float *mean, float *rstd,
			  const float *inp, const float *weight,
			  const float *bias, int N, int C);
/* dinp (N,C) +=; dweight (C) +=; dbias (C) +=. dout, inp are (N,C). */
void st_cpu_layernorm_bwd(float *dinp, float *dweight, float *dbias,
			  const float *dout, const float *inp,
			  const float *weight, const float *mean,
			  const float *rstd, int N, int C);

/* ---- GELU, tanh approximation (GPT-2's "gelu_new") ----------------------
 * out is (n), inp is (n); out may equal inp. */
void st_cpu_gelu_fwd(float *out, const float *inp, size_t n);
/* dinp (n) = gelu'(inp) * dout: OVERWRITES, elementwise, so dinp may equal
 * inp or dout (the block turns its saved pre-activation into its gradient
 * in place instead of holding a third 4C-wide buffer). */
void st_cpu_gelu_bwd(float *dinp, const float *inp, const float *dout,
		     size_t n);

/* ---- residual --------------------------------------------------------------
 * out = a + b, all (n); out may equal a or b. */
void st_cpu_residual_fwd(float *out, const float *a, const float *b, size_t n);
/* da += dout; db += dout. */
void st_cpu_residual_bwd(float *da, float *db, const float *dout, size_t n);

/* ---- embedding -------------------------------------------------------------
 * out is (B,T,C): out[b,t] = wte[tokens[b,t]] + wpe[t]. tokens is (B,T) with
 * every value in [0,V) (the caller checks). wte is (V,C), wpe is (>=T,C). */
void st_cpu_embedding_fwd(float *out, const int32_t *tokens, const float *wte,
			  const float *wpe, int B, int T, int C);
/* dwte (V,C) += scatter of dout rows by token; dwpe (T,C) += sum over b.
 * dout is (B,T,C). */
void st_cpu_embedding_bwd(float *dwte, float *dwpe, const float *dout,
			  const int32_t *tokens, int B, int T, int C);

/* ---- causal self-attention -------------------------------------------------
 * Flash-style: query blocks against key blocks with an online softmax, so no
 * (B,NH,T,T) tensor exists; scratch is a few KiB per thread on the stack.
 * qkv is (B,T,3C) = [q | k | v], each split in NH heads of C/NH channels.
 * out is (B,T,C); lse is (B,NH,T), the log-sum-exp of each query's scores,
 * kept for the backward. Scale 1/sqrt(C/NH). */
void st_cpu_attention_fwd(float *out, float *lse, const float *qkv, int B,
			  int T, int C, int NH);
/* dqkv (B,T,3C) += gradient through attention. dout, out are (B,T,C); out
 * and lse are the forward's results for this qkv. Deterministic: each
 * (b,head) pair is one task that runs serially. */
void st_cpu_attention_bwd(float *dqkv, const float *dout, const float *qkv,
			  const float *out, const float *lse, int B, int T,
			  int C, int NH);
/* The same with segments: seg (B,T) int32 holds, for each query position
 * t of a row, s(t), the position in the row where t's document starts
 * (0 <= s(t) <= t); t attends to keys [s(t), t] only (packed documents
 * that do not attend across each other: strata train --packing isolated).
 * NULL: causal over the whole row, bit for bit the functions above. */
void st_cpu_attention_fwd_seg(float *out, float *lse, const float *qkv, int B, int T, int C,
			      int NH, const int32_t *seg);
void st_cpu_attention_bwd_seg(float *dqkv, const float *dout, const float *qkv,
			      const float *out, const float *lse, int B, int T, int C, int NH,
			      const int32_t *seg);

/* ---- fused softmax + cross-entropy ---------------------------------------
 * losses (N) = logsumexp(logits[n]) - logits[n, targets[n]]. logits is
 * (N,V), targets (N) in [0,V). */
void st_cpu_crossentropy_fwd(float *losses, const float *logits,
			     const int32_t *targets, int N, int V);
/* dlogits (N,V) = dloss * (softmax(logits) - onehot(targets)): OVERWRITES
 * (the one exception to "backward accumulates", so it can run in place:
 * dlogits may equal logits). losses (N) gets the loss of each row, or is
 * NULL. */
void st_cpu_crossentropy_bwd(float *dlogits, float *losses,
			     const float *logits, const int32_t *targets,
			     float dloss, int N, int V);

/* ---- LLaMA's ops -------------------------------------------------------------
 * nn.Linear layout: y = x @ W^T + b with W stored (out,in). out is (N,OC),
 * inp (N,IC), weight (OC,IC), bias (OC) or NULL. */
void st_cpu_linear_fwd(float *out, const float *inp, const float *weight,
		       const float *bias, int N, int IC, int OC);
/* dinp (N,IC) += dout @ weight; dweight (OC,IC) += dout^T @ inp; dbias
 * (OC) += column sums of dout. Any of the three may be NULL. */
void st_cpu_linear_bwd(float *dinp, float *dweight, float *dbias,
		       const float *dout, const float *inp, const float *weight,
		       int N, int IC, int OC);

/* RMSNorm as LLaMA's: out = weight * (x * rstd), rstd = 1/sqrt(mean(x^2) +
 * eps), in fp32. out is (N,C), rstd (N) kept for the backward. */
void st_cpu_rmsnorm_fwd(float *out, float *rstd, const float *inp,
			const float *weight, float eps, int N, int C);
/* dinp (N,C) +=; dweight (C) += (column blocks, rows in order). */
void st_cpu_rmsnorm_bwd(float *dinp, float *dweight, const float *dout,
			const float *inp, const float *weight,
			const float *rstd, int N, int C);

/* Rotary embeddings (strata/rope.h) on B*T rows of `stride` floats, each
 * starting with NH heads of hd channels (the rest of the row is left
 * alone); row r is at position pos0 + r % T. out may equal inp. The
 * backward rotates by the opposite angle: dinp = R^T dout, OVERWRITING (in
 * place). */
void st_cpu_rope_fwd(float *out, const float *inp, int B, int T, int pos0, int NH, int hd,
		     int stride, int type, int original_ctx, float theta,
		     float factor, float low_freq_factor, float high_freq_factor);
void st_cpu_rope_bwd(float *dinp, const float *dout, int B, int T, int pos0, int NH, int hd,
		     int stride, int type, int original_ctx, float theta,
		     float factor, float low_freq_factor, float high_freq_factor);
/* The decoder's attention (op.h's DECODE_ATTENTION): out (n, NH*hd), query
 * row i (q + i * sq) at position pos + i over cache rows 0 .. pos + i of kc
 * and vc (rows of NKV*hd), softmax(q.k / sqrt(hd)) with the max taken
 * first and the sum in double. */
void st_cpu_decode_attention(float *out, const float *q, const float *kc, const float *vc,
			     int n, int pos, int NH, int NKV, int hd, int sq);

/* SwiGLU: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)); all (n).
 * The backward OVERWRITES dgate and dup (either may be the gate or up it
 * reads: each element is read before it is written). */
void st_cpu_swiglu_fwd(float *out, const float *gate, const float *up, size_t n);
void st_cpu_swiglu_bwd(float *dgate, float *dup, const float *dout,
		       const float *gate, const float *up, size_t n);

/* Token embedding without positions: out (N,C) = wte[tokens]; the
 * backward scatter-adds dout rows into dwte (V,C), column blocks. */
void st_cpu_token_embed_fwd(float *out, const int32_t *tokens, const float *wte,
			    int N, int C);
void st_cpu_token_embed_bwd(float *dwte, const float *dout, const int32_t *tokens,
			    int N, int C);

/* Causal grouped-query attention, flash-style as st_cpu_attention_fwd: q
 * is (B,T,NH*hd), k and v (B,T,NKV*hd); query head h reads key/value head
 * h / (NH/NKV) (Hugging Face's repeat_kv). out is (B,T,NH*hd), lse
 * (B,NH,T). Scale 1/sqrt(hd). NKV divides NH. */
void st_cpu_gqa_attention_fwd(float *out, float *lse, const float *q, const float *k,
			      const float *v, int B, int T, int NH, int NKV, int hd);
/* dq (B,T,NH*hd), dk and dv (B,T,NKV*hd) +=. Each (batch, kv head) is one
 * serial task running its query heads in order, so the sums into dk and dv
 * of the heads that share them have a fixed order. */
void st_cpu_gqa_attention_bwd(float *dq, float *dk, float *dv, const float *dout,
			      const float *q, const float *k, const float *v,
			      const float *out, const float *lse, int B, int T,
			      int NH, int NKV, int hd);
/* With segments, as st_cpu_attention_fwd_seg(); NULL: the two above. */
void st_cpu_gqa_attention_fwd_seg(float *out, float *lse, const float *q, const float *k,
				  const float *v, int B, int T, int NH, int NKV, int hd,
				  const int32_t *seg);
void st_cpu_gqa_attention_bwd_seg(float *dq, float *dk, float *dv, const float *dout,
				  const float *q, const float *k, const float *v,
				  const float *out, const float *lse, int B, int T, int NH,
				  int NKV, int hd, const int32_t *seg);

#endif
