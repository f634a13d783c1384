/* The cuda compute: strata/compute.h over strata/cuda_ops.h, every op queued
 * on one st_cuda_ctx (its own stream and cuBLASLt handle). Matmul operands
 * are fp32 here (the model hands fp32 weights). */
#include "strata/compute.h"
#include "strata/cuda_ops.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The compute and its spans: a timer each, reused once read. */
struct cucompute {
	struct st_compute c;
	struct cuspan {
		const char *name;
		struct st_cuda_timer *t;
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

static int cu_zero(struct st_compute *c, void *p, size_t bytes)
{
	return st_cuda_memset_async(ctx_of(c), p, 0, bytes);
}

static int cu_copy(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	return st_cuda_memcpy_async(ctx_of(c), dst, src, bytes);
}

/* to_host and from_host are synchronous (the host reads or reuses the
 * buffer right after). */
static int cu_copy_sync(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	int rc = st_cuda_memcpy_async(ctx_of(c), dst, src, bytes);

	return rc ? rc : st_cuda_sync(ctx_of(c));
}

static int cu_bf16_to_f32(struct st_compute *c, float *out, const uint16_t *in, size_t n)
{
	return st_cuda_bf16_to_f32(ctx_of(c), out, in, n);
}

static int cu_gemm(struct st_compute *c, int ta, int tb, int M, int N, int K,
		   const float *A, int lda, const float *B, int ldb, float beta, float *C,
		   int ldc)
{
	return st_cuda_gemm(ctx_of(c), ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

static int cu_matmul_fwd(struct st_compute *c, float *out, const float *inp,
			 const float *weight, const float *bias, int N, int IC, int OC)
{
	return st_cuda_matmul_fwd(ctx_of(c), out, inp, weight, bias, N, IC, OC, ST_CUDA_F32);
}

static int cu_matmul_gelu_fwd(struct st_compute *c, float *out, float *pre, const float *inp,
			      const float *weight, const float *bias, int N, int IC, int OC)
{
	return st_cuda_matmul_gelu_fwd(ctx_of(c), out, pre, inp, weight, bias, N, IC, OC);
}

static int cu_matmul_bwd(struct st_compute *c, float *dinp, float *dweight, float *dbias,
			 const float *dout, const float *inp, const float *weight, int N,
			 int IC, int OC)
{
	return st_cuda_matmul_bwd(ctx_of(c), dinp, dweight, dbias, dout, inp, weight, N, IC,
				  OC);
}

static int cu_layernorm_fwd(struct st_compute *c, float *out, float *mean, float *rstd,
			    const float *inp, const float *weight, const float *bias, int N,
			    int C)
{
	return st_cuda_layernorm_fwd(ctx_of(c), out, mean, rstd, inp, weight, bias, N, C);
}

static int cu_layernorm_bwd(struct st_compute *c, float *dinp, float *dweight, float *dbias,
			    const float *dout, const float *inp, const float *weight,
			    const float *mean, const float *rstd, int N, int C)
{
	return st_cuda_layernorm_bwd(ctx_of(c), dinp, dweight, dbias, dout, inp, weight, mean,
				     rstd, N, C);
}

static int cu_gelu_fwd(struct st_compute *c, float *out, const float *inp, size_t n)
{
	return st_cuda_gelu_fwd(ctx_of(c), out, inp, n);
}

static int cu_gelu_bwd(struct st_compute *c, float *dinp, const float *inp,
		       const float *dout, size_t n)
{
	return st_cuda_gelu_bwd(ctx_of(c), dinp, inp, dout, n);
}

static int cu_residual_fwd(struct st_compute *c, float *out, const float *a, const float *b,
			   size_t n)
{
	return st_cuda_residual_fwd(ctx_of(c), out, a, b, n);
}

static int cu_embedding_fwd(struct st_compute *c, float *out, const int32_t *tokens,
			    const float *wte, const float *wpe, int B, int T, int C)
{
	return st_cuda_embedding_fwd(ctx_of(c), out, tokens, wte, wpe, B, T, C);
}

static int cu_embedding_bwd(struct st_compute *c, float *dwte, float *dwpe,
			    const float *dout, const int32_t *tokens, int B, int T, int C)
{
	return st_cuda_embedding_bwd(ctx_of(c), dwte, dwpe, dout, tokens, B, T, C);
}

static int cu_attention_fwd(struct st_compute *c, float *out, float *lse, const float *qkv,
			    int B, int T, int C, int NH)
{
	return st_cuda_attention_fwd(ctx_of(c), out, lse, qkv, B, T, C, NH);
}

static int cu_attention_bwd(struct st_compute *c, float *dqkv, const float *dout,
			    const float *qkv, const float *out, const float *lse, int B, int T,
			    int C, int NH)
{
	return st_cuda_attention_bwd(ctx_of(c), dqkv, dout, qkv, out, lse, B, T, C, NH);
}

static int cu_crossentropy_fwd(struct st_compute *c, float *losses, const float *logits,
			       const int32_t *targets, int N, int V)
{
	return st_cuda_crossentropy_fwd(ctx_of(c), losses, logits, targets, N, V);
}

static int cu_crossentropy_bwd(struct st_compute *c, float *dlogits, float *losses,
			       const float *logits, const int32_t *targets, float dloss, int N,
			       int V)
{
	return st_cuda_crossentropy_bwd(ctx_of(c), dlogits, losses, logits, targets, dloss, N,
					V);
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
	else if ((rc = st_cuda_timer_create(&t)) < 0)
		return rc;
	rc = st_cuda_timer_mark(ctx_of(c), t, 0);
	if (rc < 0) {
		cc->idle[cc->nidle++] = t;
		return rc;
	}
	cc->spans[cc->nspans] = (struct cuspan){ .name = name, .t = t };
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
			out[n++] = (struct st_compute_span){ cc->spans[k].name, t0, t1 };
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
	.sync = cu_sync,
	.destroy = cu_destroy,
	.zero = cu_zero,
	.copy = cu_copy,
	.to_host = cu_copy_sync,
	.from_host = cu_copy_sync,
	.bf16_to_f32 = cu_bf16_to_f32,
	.gemm = cu_gemm,
	.matmul_fwd = cu_matmul_fwd,
	.matmul_gelu_fwd = cu_matmul_gelu_fwd,
	.matmul_bwd = cu_matmul_bwd,
	.layernorm_fwd = cu_layernorm_fwd,
	.layernorm_bwd = cu_layernorm_bwd,
	.gelu_fwd = cu_gelu_fwd,
	.gelu_bwd = cu_gelu_bwd,
	.residual_fwd = cu_residual_fwd,
	.embedding_fwd = cu_embedding_fwd,
	.embedding_bwd = cu_embedding_bwd,
	.attention_fwd = cu_attention_fwd,
	.attention_bwd = cu_attention_bwd,
	.crossentropy_fwd = cu_crossentropy_fwd,
	.crossentropy_bwd = cu_crossentropy_bwd,
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
