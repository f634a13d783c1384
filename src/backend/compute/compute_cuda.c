/* The cuda compute: strata/compute.h over cuda_ops.h, every op queued
 * on one st_cuda_ctx (its own stream and cuBLASLt handle). matmul_fwd takes
 * fp32 or bf16 operands (the model hands fp32 weights today), the attention
 * ops bf16 activations (tensor cores; cu_supports says which dtypes); every
 * other op is fp32. */
#include "compute_internal.h"
#include "cuda_bf16.h"
#include "cuda_ops.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The compute and its spans: a timer each, reused once read. */
struct cucompute {
	struct st_compute c;
	struct cuspan {
		const char *name;
		struct st_cuda_timer *t;
		uint64_t tq_ns; /* queued (host clock) */
	} *spans;
	int nspans, cap, open; /* open: index of the open span, or -1 */
	struct st_cuda_timer **idle;
	int nidle;
};

static struct st_cuda_ctx *ctx_of(struct st_compute *c)
{
	return c->impl;
}

static struct cucompute *cc_of(struct st_compute *c)
{
	return (struct cucompute *)c;
}

static int cu_sync(struct st_compute *c)
{
	return st_cuda_sync(ctx_of(c));
}

static void cu_destroy(struct st_compute *c)
{
	struct cucompute *cc = cc_of(c);

	st_cuda_ctx_destroy(ctx_of(c)); /* waits for the stream first */
	for (int i = 0; i < cc->nspans; i++)
		st_cuda_timer_destroy(cc->spans[i].t);
	for (int i = 0; i < cc->nidle; i++)
		st_cuda_timer_destroy(cc->idle[i]);
	free(cc->spans);
	free(cc->idle);
	free(cc);
}

/* The one dispatch: each op to its cuda_ops.h call. Slot k's
 * pointer is P(k); integer parameters as the ops take them. */
#define P(k) (op->t[k].data)
#define I(k) ((int)op->i[k])
#define Z(k) ((size_t)op->i[k])

/* The bf16 compute path's records this compute runs (cuda_bf16.h),
 * one signature each (a letter per slot as strata/op.h's: f fp32, b bf16,
 * i int32): what the GPT-2 bf16 path makes, less what is not here yet. A
 * new bf16 kernel is a row here and a case in cu_run_bf16(). */
static const struct {
	enum st_op_kind kind;
	const char *sig;
} cu_bf16_sigs[] = {
	{ ST_OP_MATMUL_FWD, "bbbb" },      { ST_OP_MATMUL_FWD, "fbbb" },
	{ ST_OP_MATMUL_BWD, "bffbbb" },    { ST_OP_GEMM, "bbf" },
	{ ST_OP_LAYERNORM_FWD, "bfffbb" }, { ST_OP_LAYERNORM_BWD, "fffbfbff" },
	{ ST_OP_LAYERNORM_BWD, "fffffbff" }, { ST_OP_GELU_FWD, "bb" },
	{ ST_OP_GELU_BWD, "bbb" },         { ST_OP_EMBEDDING_FWD, "fibb" },
	{ ST_OP_MATMUL_GELU_FWD, "bbbbb" },
	/* its reference signature is already bf16 (x and w) */
	{ ST_OP_HEAD_CROSSENTROPY, "fffbbifb" },
	/* LLaMA's (its GQA attention at bf16 is cu_supports()' own case) */
	{ ST_OP_LINEAR_FWD, "bbbb" },      { ST_OP_LINEAR_FWD, "fbbb" },
	{ ST_OP_LINEAR_BWD, "bffbbb" },
	{ ST_OP_RMSNORM_FWD, "bffb" },     { ST_OP_RESIDUAL_RMSNORM_FWD, "fbfffb" },
	{ ST_OP_RMSNORM_BWD, "ffbfbf" },   { ST_OP_RMSNORM_BWD, "ffffbf" },
	{ ST_OP_ROPE_FWD, "bb" },          { ST_OP_ROPE_BWD, "bb" },
	{ ST_OP_SWIGLU_FWD, "bbb" },       { ST_OP_SWIGLU_BWD, "bbbbb" },
	{ ST_OP_TOKEN_EMBED_FWD, "fib" },
};

static bool sig_is(const char *sig, const enum st_dtype *dt)
{
	static const char letter[] = { 'f', 'b', 'i', 'u' };

	for (int k = 0; sig[k]; k++)
		if (letter[dt[k] & 3] != sig[k])
			return false;
	return true;
}

static bool cu_bf16_supports(enum st_op_kind kind, const enum st_dtype *dt)
{
	for (size_t r = 0; r < sizeof(cu_bf16_sigs) / sizeof(cu_bf16_sigs[0]); r++)
		if (cu_bf16_sigs[r].kind == kind && sig_is(cu_bf16_sigs[r].sig, dt))
			return true;
	return false;
}

#define BF(k) (op->t[k].dtype == ST_DTYPE_BF16)

/* A record of cu_bf16_sigs[] (supports() let it through). */
static int cu_run_bf16(struct st_cuda_ctx *ctx, const struct st_op *op)
{
	switch (op->kind) {
	case ST_OP_MATMUL_FWD:
		return st_cuda_bf16_matmul_fwd(ctx, P(0), BF(0), P(1), P(2), P(3), I(0), I(1),
					       I(2));
	case ST_OP_MATMUL_GELU_FWD:
		if (!P(1))
			return st_error_set(-EINVAL, "cuda compute: bf16 matmul_gelu_fwd needs pre");
		return st_cuda_bf16_matmul_gelu_fwd(ctx, P(0), P(1), P(2), P(3), P(4), I(0), I(1),
						    I(2));
	case ST_OP_MATMUL_BWD:
		return st_cuda_bf16_matmul_bwd(ctx, P(0), P(1), P(2), P(3), P(4), P(5), I(0),
					       I(1), I(2));
	case ST_OP_GEMM:
		return st_cuda_bf16_gemm(ctx, I(0), I(1), I(2), I(3), I(4), P(0), I(5), P(1),
					 I(6), op->f[0], P(2), I(7));
	case ST_OP_LAYERNORM_FWD:
		return st_cuda_bf16_layernorm_fwd(ctx, P(0), P(1), P(2), P(3), P(4), P(5), I(0),
						  I(1));
	case ST_OP_LAYERNORM_BWD:
		return st_cuda_bf16_layernorm_bwd(ctx, P(0), P(1), P(2), P(3), BF(3), P(4), P(5),
						  P(6), P(7), I(0), I(1));
	case ST_OP_GELU_FWD:
		return st_cuda_bf16_gelu_fwd(ctx, P(0), P(1), Z(0));
	case ST_OP_GELU_BWD:
		return st_cuda_bf16_gelu_bwd(ctx, P(0), P(1), P(2), Z(0));
	case ST_OP_EMBEDDING_FWD:
		return st_cuda_bf16_embedding_fwd(ctx, P(0), P(1), P(2), P(3), I(0), I(1), I(2));
	case ST_OP_HEAD_CROSSENTROPY: /* the logits scratch holds lse and partials */
		return st_cuda_head_ce_bf16(ctx, P(0), P(1), P(2), P(3), P(4), P(5), P(6),
					    (size_t)op->i[3] * (size_t)op->i[2], op->f[0], I(0),
					    I(1), I(2));
	case ST_OP_LINEAR_FWD:
		return st_cuda_bf16_linear_fwd(ctx, P(0), BF(0), P(1), P(2), P(3), I(0), I(1), I(2));
	case ST_OP_LINEAR_BWD:
		return st_cuda_bf16_linear_bwd(ctx, P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1),
					       I(2));
	case ST_OP_RMSNORM_FWD:
		return st_cuda_bf16_rmsnorm_fwd(ctx, NULL, P(0), P(1), P(2), NULL, P(3), op->f[0],
						I(0), I(1));
	case ST_OP_RESIDUAL_RMSNORM_FWD:
		return st_cuda_bf16_rmsnorm_fwd(ctx, P(0), P(1), P(2), P(3), P(4), P(5), op->f[0],
						I(0), I(1));
	case ST_OP_RMSNORM_BWD:
		return st_cuda_bf16_rmsnorm_bwd(ctx, P(0), P(1), P(2), BF(2), P(3), P(4), P(5), I(0),
						I(1));
	case ST_OP_ROPE_FWD:
	case ST_OP_ROPE_BWD:
		return st_cuda_bf16_rope(ctx, op->kind == ST_OP_ROPE_BWD, P(0), P(1), I(0), I(1),
					 I(7), I(2), I(3), I(4), I(5), I(6), op->f[0], op->f[1],
					 op->f[2], op->f[3]);
	case ST_OP_SWIGLU_FWD:
		return st_cuda_bf16_swiglu_fwd(ctx, P(0), P(1), P(2), Z(0));
	case ST_OP_SWIGLU_BWD:
		return st_cuda_bf16_swiglu_bwd(ctx, P(0), P(1), P(2), P(3), P(4), Z(0));
	case ST_OP_TOKEN_EMBED_FWD:
		return st_cuda_bf16_token_embed_fwd(ctx, P(0), P(1), P(2), I(0), I(1));
	default:
		break;
	}
	return st_error_set(-ENOTSUP, "cuda compute: no bf16 %s", st_op_name(op->kind));
}

static int cu_run(struct st_compute *c, const struct st_op *op)
{
	struct st_cuda_ctx *ctx = ctx_of(c);
	enum st_dtype dt[ST_OP_MAX_TENSORS];

	for (int k = 0; k < st_op_tensors(op->kind); k++)
		dt[k] = op->t[k].dtype;
	if (cu_bf16_supports(op->kind, dt))
		return cu_run_bf16(ctx, op);

	switch (op->kind) {
	case ST_OP_ZERO:
		return st_cuda_memset_async(ctx, P(0), 0, Z(0));
	case ST_OP_COPY:
		return st_cuda_memcpy_async(ctx, P(0), P(1), Z(0));
	case ST_OP_BF16_TO_F32:
		return st_cuda_bf16_to_f32(ctx, P(0), P(1), Z(0));
	case ST_OP_F32_TO_BF16:
		return st_cuda_f32_to_bf16(ctx, P(0), P(1), Z(0));
	case ST_OP_GEMM:
		return st_cuda_gemm(ctx, I(0), I(1), I(2), I(3), I(4), P(0), I(5), P(1), I(6),
				    op->f[0], P(2), I(7));
	case ST_OP_MATMUL_FWD:
		return st_cuda_matmul_fwd(ctx, P(0), P(1), P(2), P(3), I(0), I(1), I(2),
					  op->t[1].dtype == ST_DTYPE_BF16 ? ST_CUDA_BF16
									  : ST_CUDA_F32);
	case ST_OP_MATMUL_GELU_FWD:
		return st_cuda_matmul_gelu_fwd(ctx, P(0), P(1), P(2), P(3), P(4), I(0), I(1),
					       I(2));
	case ST_OP_MATMUL_BWD:
		return st_cuda_matmul_bwd(ctx, P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1),
					  I(2));
	case ST_OP_LAYERNORM_FWD:
		return st_cuda_layernorm_fwd(ctx, P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1));
	case ST_OP_LAYERNORM_BWD:
		return st_cuda_layernorm_bwd(ctx, P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7),
					     I(0), I(1));
	case ST_OP_GELU_FWD:
		return st_cuda_gelu_fwd(ctx, P(0), P(1), Z(0));
	case ST_OP_GELU_BWD:
		return st_cuda_gelu_bwd(ctx, P(0), P(1), P(2), Z(0));
	case ST_OP_RESIDUAL_FWD:
		return st_cuda_residual_fwd(ctx, P(0), P(1), P(2), Z(0));
	case ST_OP_EMBEDDING_FWD:
		return st_cuda_embedding_fwd(ctx, P(0), P(1), P(2), P(3), I(0), I(1), I(2));
	case ST_OP_EMBEDDING_BWD:
		return st_cuda_embedding_bwd(ctx, P(0), P(1), P(2), P(3), I(0), I(1), I(2));
	case ST_OP_ATTENTION_FWD:
		if (op->t[2].dtype == ST_DTYPE_BF16)
			return st_cuda_attention_fwd_bf16_seg(ctx, P(0), P(1), P(2), I(0), I(1),
							      I(2), I(3), P(3));
		return st_cuda_attention_fwd_seg(ctx, P(0), P(1), P(2), I(0), I(1), I(2), I(3),
						 P(3));
	case ST_OP_ATTENTION_BWD:
		if (op->t[2].dtype == ST_DTYPE_BF16)
			return st_cuda_attention_bwd_bf16_seg(
				ctx, P(0), op->t[0].dtype == ST_DTYPE_BF16, P(1), P(2), P(3), P(4), I(0),
				I(1), I(2), I(3), P(5));
		return st_cuda_attention_bwd_seg(ctx, P(0), P(1), P(2), P(3), P(4), I(0), I(1), I(2),
						 I(3), P(5));
	case ST_OP_CROSSENTROPY_FWD:
		return st_cuda_crossentropy_fwd(ctx, P(0), P(1), P(2), I(0), I(1));
	case ST_OP_CROSSENTROPY_BWD:
		return st_cuda_crossentropy_bwd(ctx, P(0), P(1), P(2), P(3), op->f[0], I(0), I(1));
	case ST_OP_LINEAR_FWD:
		return st_cuda_linear_fwd(ctx, P(0), P(1), P(2), P(3), I(0), I(1), I(2));
	case ST_OP_LINEAR_BWD:
		return st_cuda_linear_bwd(ctx, P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1),
					  I(2));
	case ST_OP_RMSNORM_FWD:
		return st_cuda_rmsnorm_fwd(ctx, P(0), P(1), P(2), P(3), op->f[0], I(0), I(1));
	case ST_OP_RMSNORM_BWD:
		return st_cuda_rmsnorm_bwd(ctx, P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1));
	case ST_OP_ADAMW:
		return st_cuda_adamw(ctx, op->f, P(0), P(1), P(2), P(3), P(4),
				     op->t[4].dtype == ST_DTYPE_BF16, P(5), Z(0));
	case ST_OP_GRAD_SUMSQ:
		return st_cuda_grad_sumsq(ctx, P(0), P(1), P(2), Z(0));
	case ST_OP_RESIDUAL_LAYERNORM_FWD:
		return st_cuda_residual_layernorm_fwd(ctx, P(0), P(1), P(2), P(3), P(4), P(5), P(6),
						      P(7), I(0), I(1));
	case ST_OP_RESIDUAL_RMSNORM_FWD:
		return st_cuda_residual_rmsnorm_fwd(ctx, P(0), P(1), P(2), P(3), P(4), P(5),
						    op->f[0], I(0), I(1));
	case ST_OP_ROPE_FWD:
	case ST_OP_ROPE_BWD:
		return st_cuda_rope(ctx, op->kind == ST_OP_ROPE_BWD, P(0), P(1), I(0), I(1), I(7),
				    I(2), I(3), I(4), I(5), I(6), op->f[0], op->f[1], op->f[2],
				    op->f[3]);
	case ST_OP_DECODE_ATTENTION:
		return st_cuda_decode_attention(ctx, P(0), P(1), P(2), P(3), I(0), I(1), I(2), I(3),
						I(4), I(5));
	case ST_OP_SWIGLU_FWD:
		return st_cuda_swiglu_fwd(ctx, P(0), P(1), P(2), Z(0));
	case ST_OP_SWIGLU_BWD:
		return st_cuda_swiglu_bwd(ctx, P(0), P(1), P(2), P(3), P(4), Z(0));
	case ST_OP_TOKEN_EMBED_FWD:
		return st_cuda_token_embed_fwd(ctx, P(0), P(1), P(2), I(0), I(1));
	case ST_OP_TOKEN_EMBED_BWD:
		return st_cuda_token_embed_bwd(ctx, P(0), P(1), P(2), I(0), I(1));
	case ST_OP_GQA_ATTENTION_FWD:
		if (op->t[2].dtype == ST_DTYPE_BF16)
			return st_cuda_gqa_attention_fwd_bf16_seg(ctx, P(0), P(1), P(2), P(3), P(4),
								  I(0), I(1), I(2), I(3), I(4), P(5));
		return st_cuda_gqa_attention_fwd_seg(ctx, P(0), P(1), P(2), P(3), P(4), I(0), I(1),
						     I(2), I(3), I(4), P(5));
	case ST_OP_GQA_ATTENTION_BWD:
		if (op->t[4].dtype == ST_DTYPE_BF16)
			return st_cuda_gqa_attention_bwd_bf16_seg(
				ctx, P(0), P(1), P(2), op->t[0].dtype == ST_DTYPE_BF16, P(3), P(4),
				P(5), P(6), P(7), P(8), I(0), I(1), I(2), I(3), I(4), P(9));
		return st_cuda_gqa_attention_bwd_seg(ctx, P(0), P(1), P(2), P(3), P(4), P(5), P(6),
						     P(7), P(8), I(0), I(1), I(2), I(3), I(4), P(9));
	case ST_OP_HEAD_CROSSENTROPY: /* cu_bf16_sigs' */
	case ST_OP_COUNT:
		break;
	}
	return st_error_set(-ENOTSUP, "cuda compute: no op %d", (int)op->kind);
}

/* Whether dt (n slots) is sig, one letter a slot: b bf16, f fp32, g the
 * gradient's dtype (fp32 or bf16, the same in every g slot). */
static bool cu_sig(const enum st_dtype *dt, const char *sig)
{
	const enum st_dtype g = dt[0];

	if (g != ST_DTYPE_F32 && g != ST_DTYPE_BF16)
		return false;
	for (int k = 0; sig[k]; k++) {
		const enum st_dtype want = sig[k] == 'b' ? ST_DTYPE_BF16
					   : sig[k] == 'g' ? g
							   : ST_DTYPE_F32;
		if (dt[k] != want)
			return false;
	}
	return true;
}

/* Every op at its reference dtypes; matmul_fwd also with bf16 inp and
 * weight (cuBLASLt, fp32 accumulation); the attention ops also on tensor
 * cores with bf16 activations, fp32 lse and fp32 or bf16 gradients
 * (attention_bf16.cu: head size 64 or 128, which cu_supports_shape()
 * holds the records to). */
static bool cu_supports(const struct st_compute *c, enum st_op_kind kind,
			const enum st_dtype *dt)
{
	(void)c;
	if ((unsigned)kind >= ST_OP_COUNT)
		return false;
	if (kind == ST_OP_MATMUL_FWD && dt[1] == ST_DTYPE_BF16 && dt[2] == ST_DTYPE_BF16 &&
	    dt[0] == ST_DTYPE_F32 && dt[3] == ST_DTYPE_F32)
		return true;
	if (kind == ST_OP_ADAMW && dt[4] == ST_DTYPE_BF16)
		return dt[0] == ST_DTYPE_F32 && dt[1] == ST_DTYPE_F32 && dt[2] == ST_DTYPE_F32 &&
		       dt[3] == ST_DTYPE_F32 && dt[5] == ST_DTYPE_U8;
	if (kind == ST_OP_ATTENTION_FWD && dt[2] == ST_DTYPE_BF16)
		return cu_sig(dt, "bfb");
	if (kind == ST_OP_ATTENTION_BWD && dt[2] == ST_DTYPE_BF16)
		return cu_sig(dt, "gbbbf");
	if (kind == ST_OP_GQA_ATTENTION_FWD && dt[2] == ST_DTYPE_BF16)
		return cu_sig(dt, "bfbbb");
	if (kind == ST_OP_GQA_ATTENTION_BWD && dt[4] == ST_DTYPE_BF16)
		return cu_sig(dt, "gggbbbbbf");
	if (cu_bf16_supports(kind, dt))
		return true;
	return st_op_is_ref(kind, dt);
}

/* The shapes: the bf16 attention runs head size 64 or 128 only (its
 * tiles are the head wide), where cu_run() sends the record: the
 * attention ops with bf16 q (slot 2; gqa_attention_bwd's slot 4). Every
 * other record cu_supports() takes runs at any shape. */
bool st_compute_cuda_supports_shape(const struct st_op *op, char *why, size_t why_bytes)
{
	int64_t hs;

	switch (op->kind) {
	case ST_OP_ATTENTION_FWD:
	case ST_OP_ATTENTION_BWD: /* i: B, T, C, NH */
		if (op->t[2].dtype != ST_DTYPE_BF16)
			return true;
		hs = op->i[3] > 0 && op->i[2] % op->i[3] == 0 ? op->i[2] / op->i[3] : 0;
		break;
	case ST_OP_GQA_ATTENTION_FWD:
	case ST_OP_GQA_ATTENTION_BWD: /* i: B, T, NH, NKV, hd */
		if (op->t[op->kind == ST_OP_GQA_ATTENTION_FWD ? 2 : 4].dtype != ST_DTYPE_BF16)
			return true;
		hs = op->i[4];
		break;
	case ST_OP_DECODE_ATTENTION: /* i: n, pos, NH, NKV, hd, sq */
		if (op->i[4] <= ST_CUDA_DEC_MAX_HD_HOST)
			return true;
		snprintf(why, why_bytes, "head size %lld; the decoder's attention runs up to %d",
			 (long long)op->i[4], ST_CUDA_DEC_MAX_HD_HOST);
		return false;
	default:
		return true;
	}
	if (hs > 0 && hs <= INT32_MAX && st_cuda_attention_bf16_head_ok((int)hs))
		return true;
	snprintf(why, why_bytes,
		 "head size %lld; the bf16 attention on tensor cores runs head size 64 or 128",
		 (long long)hs);
	return false;
}

static bool cu_supports_shape(const struct st_compute *c, const struct st_op *op, char *why,
			      size_t why_bytes)
{
	(void)c;
	return st_compute_cuda_supports_shape(op, why, why_bytes);
}

/* to_host and from_host are synchronous (the host reads or reuses the
 * buffer right after). */
static int cu_copy_sync(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	int rc = st_cuda_memcpy_async(ctx_of(c), dst, src, bytes);

	return rc ? rc : st_cuda_sync(ctx_of(c));
}

/* from_host_async: on the stream, not waited for (an event after it says
 * when src may be reused). */
static int cu_copy_async(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	return st_cuda_memcpy_async(ctx_of(c), dst, src, bytes);
}

static int cu_record(struct st_compute *c, struct st_event *e)
{
	return st_cuda_ctx_record(ctx_of(c), e);
}

static int cu_wait(struct st_compute *c, struct st_event *e)
{
	return st_cuda_ctx_wait(ctx_of(c), e);
}

static int cu_span(struct st_compute *c, const char *name)
{
	struct cucompute *cc = cc_of(c);
	struct st_cuda_timer *t = NULL;
	int rc;

	if (!name) {
		if (cc->open < 0)
			return 0;
		rc = st_cuda_timer_mark(ctx_of(c), cc->spans[cc->open].t, 1);
		if (rc < 0) { /* no stop: the span goes, its timer back to idle */
			cc->idle[cc->nidle++] = cc->spans[cc->open].t;
			memmove(cc->spans + cc->open, cc->spans + cc->open + 1,
				(size_t)(cc->nspans - cc->open - 1) * sizeof(*cc->spans));
			cc->nspans--;
		}
		cc->open = -1;
		return rc;
	}
	if (cc->open >= 0) { /* an unclosed span ends here, uncounted */
		cc->spans[cc->open].name = NULL;
		rc = cu_span(c, NULL);
		if (rc < 0)
			return rc;
	}
	if (cc->nspans == cc->cap) {
		int cap = cc->cap ? 2 * cc->cap : 64;
		struct cuspan *s = realloc(cc->spans, (size_t)cap * sizeof(*s));
		struct st_cuda_timer **i = realloc(cc->idle, (size_t)cap * sizeof(*i));

		if (s)
			cc->spans = s;
		if (i)
			cc->idle = i;
		if (!s || !i)
			return st_error_set(-ENOMEM, "compute: out of memory for spans");
		cc->cap = cap;
	}
	if (cc->nidle)
		t = cc->idle[--cc->nidle];
	else if ((rc = st_cuda_timer_create(ctx_of(c), &t)) < 0)
		return rc;
	rc = st_cuda_timer_mark(ctx_of(c), t, 0);
	if (rc < 0) {
		cc->idle[cc->nidle++] = t;
		return rc;
	}
	cc->spans[cc->nspans] = (struct cuspan){ .name = name, .t = t, .tq_ns = st_now_ns() };
	cc->open = cc->nspans++;
	return 0;
}

static int cu_take_spans(struct st_compute *c, struct st_compute_span *out, int max)
{
	struct cucompute *cc = cc_of(c);
	int n = 0, k = 0;

	/* the stream reaches them in order: the finished ones are a prefix */
	while (k < cc->nspans && k != cc->open && n < max) {
		uint64_t t0, t1;

		int rc = st_cuda_timer_read(ctx_of(c), cc->spans[k].t, &t0, &t1);

		if (rc < 0 && c->err == 0) /* sticky: the next sync reports it */
			c->err = rc;
		if (rc != 1)
			break;
		if (cc->spans[k].name)
			out[n++] = (struct st_compute_span){ cc->spans[k].name, t0, t1,
							     cc->spans[k].tq_ns };
		cc->idle[cc->nidle++] = cc->spans[k].t;
		k++;
	}
	memmove(cc->spans, cc->spans + k, (size_t)(cc->nspans - k) * sizeof(*cc->spans));
	cc->nspans -= k;
	if (cc->open >= 0)
		cc->open -= k;
	return n;
}

static const struct st_compute_ops cuda_ops = {
	.name = "cuda",
	.run = cu_run,
	.supports = cu_supports,
	.supports_shape = cu_supports_shape,
	.sync = cu_sync,
	.destroy = cu_destroy,
	.to_host = cu_copy_sync,
	.from_host = cu_copy_sync,
	.from_host_async = cu_copy_async,
	.record = cu_record,
	.wait = cu_wait,
	.span = cu_span,
	.take_spans = cu_take_spans,
};

int st_compute_cuda_create(int ordinal, struct st_compute **out)
{
	struct cucompute *cc = calloc(1, sizeof(*cc));
	struct st_cuda_ctx *ctx = NULL;
	int rc;

	*out = NULL;
	if (!cc)
		return st_error_set(-ENOMEM, "compute: out of memory");
	rc = st_cuda_ctx_create(ordinal, &ctx);
	if (rc) {
		free(cc);
		return rc;
	}
	cc->c.ops = &cuda_ops;
	cc->c.impl = ctx;
	cc->open = -1;
	*out = &cc->c;
	return 0;
}
