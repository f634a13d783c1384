/* strata: the op seam. An op is a record: what to run (an entry of
 * ST_OP_LIST), its typed tensors and its scalar parameters. A compute
 * (strata/compute.h) runs records through one hook, so an op is data that
 * every backend can queue, copy, test and refuse, instead of a function
 * signature written out per backend.
 *
 * Adding an op: one line in ST_OP_LIST below (its tensors in the kernel's
 * argument order and their reference dtypes), one cpu kernel and its row
 * in src/backend/compute/compute_cpu.c's table, one cuda kernel and its case in
 * src/backend/compute/compute_cuda.c's switch, and one row in the shared op
 * cases (tests/compute_cases.h), which holds the queued cpu compute to the
 * direct one bit for bit and the cuda compute to the cpu one (docs/model.md,
 * "The op seam"). A typed st_compute_<op>() convenience is optional.
 *
 * Nothing here allocates; a record is plain data, copied freely (a queued
 * compute copies it into its ring). Tensor pointers are borrowed: they are
 * the compute's device pointers and must stay valid until the op has run
 * (st_compute_sync()). */
#ifndef STRATA_OP_H
#define STRATA_OP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types. U8 is raw bytes (zero, copy). */
enum st_dtype {
	ST_DTYPE_F32,
	ST_DTYPE_BF16,
	ST_DTYPE_I32,
	ST_DTYPE_U8,
};

/* Bytes per element of dt. */
static inline size_t st_dtype_elem_bytes(enum st_dtype dt)
{
	return dt == ST_DTYPE_BF16 ? 2 : dt == ST_DTYPE_U8 ? 1 : 4;
}

#define ST_TENSOR_MAX_DIMS 4

/* A tensor descriptor: a borrowed device pointer, its dtype and its
 * row-major shape (ndim dims, outermost first; -1 for a dim the caller
 * does not know, e.g. an embedding table's rows). data may be NULL where
 * the op says the tensor is optional (a bias, a gradient to skip). The
 * backends take sizes from the op's integer parameters; the shape
 * describes the tensor (traces, checks, tests). */
struct st_tensor {
	void *data;
	enum st_dtype dtype;
	int ndim;
	int64_t shape[ST_TENSOR_MAX_DIMS];
};

/* Elements of t (1 for ndim 0). */
static inline int64_t st_tensor_elems(const struct st_tensor *t)
{
	int64_t n = 1;

	for (int d = 0; d < t->ndim; d++)
		n *= t->shape[d];
	return n;
}

/* Descriptors of 1, 2 or 3 dims; p may be const (the record drops it, as
 * the kernels' argument lists say which tensors are written). */
static inline struct st_tensor st_tensor_1d(const void *p, enum st_dtype dt, int64_t d0)
{
	struct st_tensor t = { (void *)(uintptr_t)p, dt, 1, { d0, 0, 0, 0 } };
	return t;
}

static inline struct st_tensor st_tensor_2d(const void *p, enum st_dtype dt, int64_t d0,
					    int64_t d1)
{
	struct st_tensor t = { (void *)(uintptr_t)p, dt, 2, { d0, d1, 0, 0 } };
	return t;
}

static inline struct st_tensor st_tensor_3d(const void *p, enum st_dtype dt, int64_t d0,
					    int64_t d1, int64_t d2)
{
	struct st_tensor t = { (void *)(uintptr_t)p, dt, 3, { d0, d1, d2, 0 } };
	return t;
}

/* Every op: X(ENUM, "name", "signature"). The signature has one letter per
 * tensor slot, in order, giving its reference dtype: f fp32, b bf16, i
 * int32, u bytes. Slots, integer parameters i[] and float parameters f[]
 * follow strata/kernels.h's argument order (shapes and conventions as
 * there: forward overwrites, backward accumulates except gelu_bwd and
 * crossentropy_bwd):
 *
 *   ZERO              t: p                                   i: bytes
 *   COPY              t: dst, src                            i: bytes
 *   BF16_TO_F32       t: out (f32), in (bf16)                i: n
 *   GEMM              t: A, B, C       i: trans_a, trans_b, M, N, K, lda, ldb, ldc
 *                                                            f: beta (alpha is 1)
 *   MATMUL_FWD        t: out, inp, weight, bias?             i: N, IC, OC
 *                     inp and weight may both be bf16 (fp32 accumulation,
 *                     out and bias fp32): st_compute_supports() says where
 *   MATMUL_GELU_FWD   t: out, pre?, inp, weight, bias?       i: N, IC, OC
 *   MATMUL_BWD        t: dinp?, dweight?, dbias?, dout, inp, weight
 *                                                            i: N, IC, OC
 *   LAYERNORM_FWD     t: out, mean, rstd, inp, weight, bias  i: N, C
 *   LAYERNORM_BWD     t: dinp, dweight, dbias, dout, inp, weight, mean, rstd
 *                                                            i: N, C
 *   GELU_FWD          t: out, inp                            i: n
 *   GELU_BWD          t: dinp, inp, dout                     i: n
 *   RESIDUAL_FWD      t: out, a, b                           i: n
 *   EMBEDDING_FWD     t: out, tokens, wte, wpe               i: B, T, C
 *   EMBEDDING_BWD     t: dwte, dwpe, dout, tokens            i: B, T, C
 *   ATTENTION_FWD     t: out, lse, qkv, seg?                 i: B, T, C, NH
 *   ATTENTION_BWD     t: dqkv, dout, qkv, out, lse, seg?     i: B, T, C, NH
 *                     seg (B,T) int32, NULL: causal; else query t attends
 *                     to keys [seg[t], t] only (its document in a packed
 *                     row, st_cpu_attention_fwd_seg()); the slot's dtype
 *                     is I32 even when it is NULL
 *   CROSSENTROPY_FWD  t: losses, logits, targets             i: N, V
 *   CROSSENTROPY_BWD  t: dlogits, losses?, logits, targets   i: N, V
 *                                                            f: dloss
 * LLaMA's (nn.Linear weights (out,in); heads of hd channels, hd even):
 *   LINEAR_FWD        t: out, inp, weight, bias?             i: N, IC, OC
 *   LINEAR_BWD        t: dinp?, dweight?, dbias?, dout, inp, weight
 *                                                            i: N, IC, OC
 *   RMSNORM_FWD       t: out, rstd, inp, weight              i: N, C  f: eps
 *   RMSNORM_BWD       t: dinp, dweight, dout, inp, weight, rstd
 *                                                            i: N, C
 *   ROPE_FWD          t: out, inp (may be the same)
 *                     i: B, T, NH, hd, stride, rope type, original ctx, pos0
 *                     f: theta, factor, low freq factor, high freq factor
 *                     row r is at position pos0 + r % T (pos0 0 in training;
 *                     the decoder's rows at their absolute positions)
 *   ROPE_BWD          as ROPE_FWD (the inverse rotation; OVERWRITES)
 *   SWIGLU_FWD        t: out, gate, up                       i: n
 *   SWIGLU_BWD        t: dgate, dup, dout, gate, up (OVERWRITES) i: n
 *   TOKEN_EMBED_FWD   t: out, tokens, wte                    i: N, C
 *   TOKEN_EMBED_BWD   t: dwte, dout, tokens                  i: N, C
 *   GQA_ATTENTION_FWD t: out, lse, q, k, v, seg?             i: B, T, NH, NKV, hd
 *   GQA_ATTENTION_BWD t: dq, dk, dv, dout, q, k, v, out, lse, seg?
 *                                                     i: B, T, NH, NKV, hd
 *                     seg as ATTENTION_FWD's
 *   DECODE_ATTENTION  t: out (n, NH*hd), q (n rows of sq), kc, vc (rows of NKV*hd)
 *                     i: n, pos, NH, NKV, hd, sq
 *                     the decoder's attention (docs/model.md, "Decoding"): row
 *                     i, at position pos + i, attends over cache rows
 *                     0 .. pos + i with softmax(q.k / sqrt(hd)); head h reads
 *                     kv head h / (NH / NKV)
 * The optimizer on the device (the compute's queue; docs/gpu.md), over
 * fp32 G, P, M, V of n elements:
 *   ADAMW             t: g, p, m, v, w (f32 or bf16; may be NULL), bad (u32)
 *                     i: n   f: grad_scale, beta1, 1-beta1, beta2, 1-beta2,
 *                        1/sqrt(bc2), eps, -step size, decay (struct
 *                        st_adam_step's, in its order)
 *                     st_adam_apply(..., ST_ADAM_GRAD_CHECKED) bit for bit:
 *                     P, M, V updated, W = round(P); elements whose scaled
 *                     gradient is NaN or Inf are left unchanged and their
 *                     number is ADDED to *bad
 *   GRAD_SUMSQ        t: out (16 bytes: double sumsq, u32 nonfinite, u32 0),
 *                     scratch (st_compute_sumsq_scratch_bytes(n) bytes), g
 *                     i: n   st_grad_sumsq(g, f32, n) bit for bit; nonfinite
 *                     is 1 when G holds a NaN or Inf (it returned -ERANGE)
 * Residual + norm (the residual stream's sum kept, then normalised):
 *   RESIDUAL_LAYERNORM_FWD t: res, out, mean, rstd, a, b, weight, bias
 *                     i: N, C   res = a + b, then LAYERNORM_FWD of res:
 *                     residual_fwd then layernorm_fwd bit for bit
 *   RESIDUAL_RMSNORM_FWD t: res, out, rstd, a, b, weight   i: N, C  f: eps
 *                     res = a + b, then RMSNORM_FWD of res, likewise
 * The bf16 compute path (--compute-dtype bf16; docs/model.md):
 *   F32_TO_BF16       t: out (bf16), in (f32)                i: n
 *                     round to nearest even (st_cpu_bf16_from_f32)
 *   HEAD_CROSSENTROPY t: losses, dx?, dw?, x (bf16), w (bf16), targets,
 *                     logits (f32 scratch), dlogits (bf16 scratch)
 *                                                  i: N, C, V, R  f: dloss
 *                     the bf16 head's matmul and cross-entropy in one op:
 *                     losses (N) = crossentropy of x (N,C) @ w (V,C)^T;
 *                     with dx and dw (both or neither) also dx (N,C) +=
 *                     dlogits @ w, dw (V,C) += dlogits^T @ x, dlogits =
 *                     dloss (softmax - onehot) rounded to bf16. The
 *                     scratches hold R x V elements each (R >= 1, and R x V
 *                     >= 4 N). The cpu runs it R rows at a time as GEMM,
 *                     CROSSENTROPY_FWD/BWD, F32_TO_BF16, GEMM, GEMM, bit
 *                     for bit the records one would make; the cuda compute
 *                     fuses it so the logits are never written
 * (? = may be NULL.) New ops go at the end, before ST_OP_COUNT.
 *
 * Dtypes other than the reference: a compute says which it runs through
 * supports(). The cpu compute runs every op whose fp32 slots are given in
 * any mix of fp32 and bf16 (src/backend/compute/kernels_bf16.h: bf16 operands widened
 * exactly, the fp32 kernel, bf16 outputs rounded to nearest even); the
 * model's bf16 path says which records it makes (docs/model.md). */
#define ST_OP_LIST(X)                                   \
	X(ZERO, "zero", "u")                            \
	X(COPY, "copy", "uu")                           \
	X(BF16_TO_F32, "bf16_to_f32", "fb")             \
	X(GEMM, "gemm", "fff")                          \
	X(MATMUL_FWD, "matmul_fwd", "ffff")             \
	X(MATMUL_GELU_FWD, "matmul_gelu_fwd", "fffff")  \
	X(MATMUL_BWD, "matmul_bwd", "ffffff")           \
	X(LAYERNORM_FWD, "layernorm_fwd", "ffffff")     \
	X(LAYERNORM_BWD, "layernorm_bwd", "ffffffff")   \
	X(GELU_FWD, "gelu_fwd", "ff")                   \
	X(GELU_BWD, "gelu_bwd", "fff")                  \
	X(RESIDUAL_FWD, "residual_fwd", "fff")          \
	X(EMBEDDING_FWD, "embedding_fwd", "fiff")       \
	X(EMBEDDING_BWD, "embedding_bwd", "fffi")       \
	X(ATTENTION_FWD, "attention_fwd", "fffi")       \
	X(ATTENTION_BWD, "attention_bwd", "fffffi")     \
	X(CROSSENTROPY_FWD, "crossentropy_fwd", "ffi")  \
	X(CROSSENTROPY_BWD, "crossentropy_bwd", "fffi")  \
	X(LINEAR_FWD, "linear_fwd", "ffff")             \
	X(LINEAR_BWD, "linear_bwd", "ffffff")           \
	X(RMSNORM_FWD, "rmsnorm_fwd", "ffff")           \
	X(RMSNORM_BWD, "rmsnorm_bwd", "ffffff")         \
	X(ROPE_FWD, "rope_fwd", "ff")                   \
	X(ROPE_BWD, "rope_bwd", "ff")                   \
	X(SWIGLU_FWD, "swiglu_fwd", "fff")              \
	X(SWIGLU_BWD, "swiglu_bwd", "fffff")            \
	X(TOKEN_EMBED_FWD, "token_embed_fwd", "fif")    \
	X(TOKEN_EMBED_BWD, "token_embed_bwd", "ffi")    \
	X(GQA_ATTENTION_FWD, "gqa_attention_fwd", "fffffi") \
	X(GQA_ATTENTION_BWD, "gqa_attention_bwd", "fffffffffi") \
	X(ADAMW, "adamw", "fffffu")                     \
	X(GRAD_SUMSQ, "grad_sumsq", "uuf")              \
	X(RESIDUAL_LAYERNORM_FWD, "residual_layernorm_fwd", "ffffffff") \
	X(RESIDUAL_RMSNORM_FWD, "residual_rmsnorm_fwd", "ffffff") \
	X(F32_TO_BF16, "f32_to_bf16", "bf")             \
	X(HEAD_CROSSENTROPY, "head_crossentropy", "fffbbifb") \
	X(DECODE_ATTENTION, "decode_attention", "ffff")

#define ST_OP_ENUM_(name, str, sig) ST_OP_##name,
enum st_op_kind { ST_OP_LIST(ST_OP_ENUM_) ST_OP_COUNT };
#undef ST_OP_ENUM_

#define ST_OP_MAX_TENSORS 10
#define ST_OP_MAX_INTS 8
#define ST_OP_MAX_FLOATS 10

/* An op record. Slots past the op's tensor count, and parameters it does
 * not take, are ignored (zero them: designated initialisers do). */
struct st_op {
	enum st_op_kind kind;
	struct st_tensor t[ST_OP_MAX_TENSORS];
	int64_t i[ST_OP_MAX_INTS];
	float f[ST_OP_MAX_FLOATS];
};

/* The op's name ("matmul_fwd"), or "?" past the list. */
const char *st_op_name(enum st_op_kind kind);
/* How many tensor slots the op has (its signature's length). */
int st_op_tensors(enum st_op_kind kind);
/* The reference dtype of slot `slot` of the op (the fp32 signature every
 * compute runs); slot must be below st_op_tensors(kind). */
enum st_dtype st_op_ref_dtype(enum st_op_kind kind, int slot);
/* Whether dtypes (one per slot, st_op_tensors(kind) of them) is the op's
 * reference signature. */
bool st_op_is_ref(enum st_op_kind kind, const enum st_dtype *dtypes);

/* The GEMM record C (M,N) fp32 = op(A) @ op(B) + beta C, row-major, A and
 * B bf16 (ta, tb: transposed): the one builder of the bf16 heads' matmuls
 * (the model's unfused head and st_op_head_ce_unfold's records). */
struct st_op st_op_gemm_bf16(int ta, int tb, int M, int N, int K, const uint16_t *A, int lda,
			     const uint16_t *B, int ldb, float beta, float *C, int ldc);

/* The records a HEAD_CROSSENTROPY op stands for, R rows at a time, each
 * handed to run(arg, rec) in order (rec borrowed for the call): GEMM
 * (logits), then CROSSENTROPY_FWD, or CROSSENTROPY_BWD, F32_TO_BF16 and
 * the two gradient GEMMs; the scratches hold the chunk's logits and
 * dlogits. What the cpu compute runs as the op (bit for bit the model's
 * unfused head), and what the fused op is timed against. */
void st_op_head_ce_unfold(const struct st_op *op, void (*run)(void *arg, const struct st_op *rec),
			  void *arg);

/* The precision a model runs its ops at (strata train --compute-dtype):
 * FP32, every tensor between ops fp32 (the reference, the zero value); BF16,
 * the tensors between ops bf16, with norms, softmax, the loss and the
 * gradient accumulation in fp32 (docs/model.md, "bf16 compute"). */
enum st_precision { ST_PRECISION_FP32, ST_PRECISION_BF16 };
/* "fp32" or "bf16". */
const char *st_precision_name(enum st_precision p);
/* "fp32" or "bf16" into *out: 0, or -EINVAL (nothing set). */
int st_precision_parse(const char *s, enum st_precision *out);

#ifdef __cplusplus
}
#endif

#endif
