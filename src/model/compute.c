/* Compute: the sticky-error wrappers, the cpu compute (the cpu kernels as
 * they are), the queued cpu compute (the same kernels on a queue of the cpu
 * device) and the choice of compute for a device. */
#include "strata/compute.h"

#include "strata/device.h"
#include "strata/kernels.h"

#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- the cpu compute -------------------------------------------------------- */

static int cpu_sync(struct st_compute *c)
{
	(void)c;
	return 0;
}

static void cpu_destroy(struct st_compute *c)
{
	(void)c;
}

static int cpu_zero(struct st_compute *c, void *p, size_t bytes)
{
	(void)c;
	memset(p, 0, bytes);
	return 0;
}

/* copy, to_host and from_host: device memory is host memory. */
static int cpu_copy(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	(void)c;
	memcpy(dst, src, bytes);
	return 0;
}

static int cpu_bf16_to_f32(struct st_compute *c, float *out, const uint16_t *in, size_t n)
{
	(void)c;
	st_cpu_bf16_to_f32(out, in, n);
	return 0;
}

static int cpu_gemm(struct st_compute *c, int ta, int tb, int M, int N, int K,
		    const float *A, int lda, const float *B, int ldb, float beta, float *C,
		    int ldc)
{
	(void)c;
	st_cpu_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
	return 0;
}

static int cpu_matmul_fwd(struct st_compute *c, float *out, const float *inp,
			  const float *weight, const float *bias, int N, int IC, int OC)
{
	(void)c;
	st_cpu_matmul_fwd(out, inp, weight, bias, N, IC, OC);
	return 0;
}

static int cpu_matmul_bwd(struct st_compute *c, float *dinp, float *dweight, float *dbias,
			  const float *dout, const float *inp, const float *weight, int N,
			  int IC, int OC)
{
	(void)c;
	st_cpu_matmul_bwd(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
	return 0;
}

static int cpu_layernorm_fwd(struct st_compute *c, float *out, float *mean, float *rstd,
			     const float *inp, const float *weight, const float *bias, int N,
			     int C)
{
	(void)c;
	st_cpu_layernorm_fwd(out, mean, rstd, inp, weight, bias, N, C);
	return 0;
}

static int cpu_layernorm_bwd(struct st_compute *c, float *dinp, float *dweight,
			     float *dbias, const float *dout, const float *inp,
			     const float *weight, const float *mean, const float *rstd, int N,
			     int C)
{
	(void)c;
	st_cpu_layernorm_bwd(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
	return 0;
}

static int cpu_gelu_fwd(struct st_compute *c, float *out, const float *inp, size_t n)
{
	(void)c;
	st_cpu_gelu_fwd(out, inp, n);
	return 0;
}

static int cpu_gelu_bwd(struct st_compute *c, float *dinp, const float *inp,
			const float *dout, size_t n)
{
	(void)c;
	st_cpu_gelu_bwd(dinp, inp, dout, n);
	return 0;
}

static int cpu_residual_fwd(struct st_compute *c, float *out, const float *a,
			    const float *b, size_t n)
{
	(void)c;
	st_cpu_residual_fwd(out, a, b, n);
	return 0;
}

static int cpu_embedding_fwd(struct st_compute *c, float *out, const int32_t *tokens,
			     const float *wte, const float *wpe, int B, int T, int C)
{
	(void)c;
	st_cpu_embedding_fwd(out, tokens, wte, wpe, B, T, C);
	return 0;
}

static int cpu_embedding_bwd(struct st_compute *c, float *dwte, float *dwpe,
			     const float *dout, const int32_t *tokens, int B, int T, int C)
{
	(void)c;
	st_cpu_embedding_bwd(dwte, dwpe, dout, tokens, B, T, C);
	return 0;
}

static int cpu_attention_fwd(struct st_compute *c, float *out, float *lse,
			     const float *qkv, int B, int T, int C, int NH)
{
	(void)c;
	st_cpu_attention_fwd(out, lse, qkv, B, T, C, NH);
	return 0;
}

static int cpu_attention_bwd(struct st_compute *c, float *dqkv, const float *dout,
			     const float *qkv, const float *out, const float *lse, int B,
			     int T, int C, int NH)
{
	(void)c;
	st_cpu_attention_bwd(dqkv, dout, qkv, out, lse, B, T, C, NH);
	return 0;
}

static int cpu_crossentropy_fwd(struct st_compute *c, float *losses, const float *logits,
				const int32_t *targets, int N, int V)
{
	(void)c;
	st_cpu_crossentropy_fwd(losses, logits, targets, N, V);
	return 0;
}

static int cpu_crossentropy_bwd(struct st_compute *c, float *dlogits, float *losses,
				const float *logits, const int32_t *targets, float dloss,
				int N, int V)
{
	(void)c;
	st_cpu_crossentropy_bwd(dlogits, losses, logits, targets, dloss, N, V);
	return 0;
}

static const struct st_compute_ops cpu_ops = {
	.name = "cpu",
	.sync = cpu_sync,
	.destroy = cpu_destroy,
	.zero = cpu_zero,
	.copy = cpu_copy,
	.to_host = cpu_copy,
	.from_host = cpu_copy,
	.bf16_to_f32 = cpu_bf16_to_f32,
	.gemm = cpu_gemm,
	.matmul_fwd = cpu_matmul_fwd,
	.matmul_bwd = cpu_matmul_bwd,
	.layernorm_fwd = cpu_layernorm_fwd,
	.layernorm_bwd = cpu_layernorm_bwd,
	.gelu_fwd = cpu_gelu_fwd,
	.gelu_bwd = cpu_gelu_bwd,
	.residual_fwd = cpu_residual_fwd,
	.embedding_fwd = cpu_embedding_fwd,
	.embedding_bwd = cpu_embedding_bwd,
	.attention_fwd = cpu_attention_fwd,
	.attention_bwd = cpu_attention_bwd,
	.crossentropy_fwd = cpu_crossentropy_fwd,
	.crossentropy_bwd = cpu_crossentropy_bwd,
};

static struct st_compute cpu_compute = { .ops = &cpu_ops };

struct st_compute *st_compute_cpu(void)
{
	return &cpu_compute;
}


/* ---- the queued cpu compute ------------------------------------------------- */

/* Every op becomes a record run by a host function on the compute's queue,
 * so the host goes on while the kernels run, as with a GPU stream, and the
 * engine's ordering (events, syncs) is exercised where there is no GPU.
 * The kernels are the same, so are the bits. */

enum qkind { Q_ZERO, Q_COPY, Q_BF16, Q_GEMM, Q_MM_FWD, Q_MM_BWD, Q_LN_FWD, Q_LN_BWD,
	     Q_GELU_FWD, Q_GELU_BWD, Q_RES, Q_EMB_FWD, Q_EMB_BWD, Q_ATT_FWD, Q_ATT_BWD,
	     Q_CE_FWD, Q_CE_BWD, Q_SPAN_BEGIN, Q_SPAN_END };

struct qcompute;

/* One queued op: its kernel's arguments in order, pointers in p, ints in i. */
struct qop {
	struct qcompute *qc;
	enum qkind kind;
	int threads; /* the caller's OpenMP thread count, which a thread does not inherit */
	void *p[8];
	int i[8];
	size_t n;
	float f;
};

struct qcompute {
	struct st_compute c;
	struct st_device *dev; /* borrowed */
	struct st_queue *q;
	pthread_mutex_t lock;  /* spans: the worker stamps, the host appends and takes */
	struct qspan {
		struct st_compute_span s;
		int done;
	} *spans;
	int nspans, cap, open; /* open: index of the open span, or -1 */
	uint64_t taken;        /* spans ever taken: spans[i] is span number taken + i */
};

static struct qcompute *qc_of(struct st_compute *c)
{
	return (struct qcompute *)c;
}

/* Stamp span number id (counted from the first ever: the ones before it
 * may have been taken, moving it down the array, since it was queued). */
static void q_span_stamp(struct qcompute *qc, uint64_t id, bool end)
{
	uint64_t now = st_now_ns();
	int idx;

	pthread_mutex_lock(&qc->lock);
	idx = (int)(id - qc->taken);
	if (end) {
		qc->spans[idx].s.t1_ns = now;
		qc->spans[idx].done = 1;
	} else {
		qc->spans[idx].s.t0_ns = now;
	}
	pthread_mutex_unlock(&qc->lock);
}

static void q_run(void *arg)
{
	struct qop *o = arg;
	void **p = o->p;
	int *i = o->i;

	if (omp_get_max_threads() != o->threads)
		omp_set_num_threads(o->threads);
	switch (o->kind) {
	case Q_ZERO:
		memset(p[0], 0, o->n);
		break;
	case Q_COPY:
		memcpy(p[0], p[1], o->n);
		break;
	case Q_BF16:
		st_cpu_bf16_to_f32(p[0], p[1], o->n);
		break;
	case Q_GEMM:
		st_cpu_sgemm(i[0], i[1], i[2], i[3], i[4], 1.0f, p[0], i[5], p[1], i[6], o->f,
			     p[2], i[7]);
		break;
	case Q_MM_FWD:
		st_cpu_matmul_fwd(p[0], p[1], p[2], p[3], i[0], i[1], i[2]);
		break;
	case Q_MM_BWD:
		st_cpu_matmul_bwd(p[0], p[1], p[2], p[3], p[4], p[5], i[0], i[1], i[2]);
		break;
	case Q_LN_FWD:
		st_cpu_layernorm_fwd(p[0], p[1], p[2], p[3], p[4], p[5], i[0], i[1]);
		break;
	case Q_LN_BWD:
		st_cpu_layernorm_bwd(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], i[0], i[1]);
		break;
	case Q_GELU_FWD:
		st_cpu_gelu_fwd(p[0], p[1], o->n);
		break;
	case Q_GELU_BWD:
		st_cpu_gelu_bwd(p[0], p[1], p[2], o->n);
		break;
	case Q_RES:
		st_cpu_residual_fwd(p[0], p[1], p[2], o->n);
		break;
	case Q_EMB_FWD:
		st_cpu_embedding_fwd(p[0], p[1], p[2], p[3], i[0], i[1], i[2]);
		break;
	case Q_EMB_BWD:
		st_cpu_embedding_bwd(p[0], p[1], p[2], p[3], i[0], i[1], i[2]);
		break;
	case Q_ATT_FWD:
		st_cpu_attention_fwd(p[0], p[1], p[2], i[0], i[1], i[2], i[3]);
		break;
	case Q_ATT_BWD:
		st_cpu_attention_bwd(p[0], p[1], p[2], p[3], p[4], i[0], i[1], i[2], i[3]);
		break;
	case Q_CE_FWD:
		st_cpu_crossentropy_fwd(p[0], p[1], p[2], i[0], i[1]);
		break;
	case Q_CE_BWD:
		st_cpu_crossentropy_bwd(p[0], p[1], p[2], p[3], o->f, i[0], i[1]);
		break;
	case Q_SPAN_BEGIN:
	case Q_SPAN_END:
		q_span_stamp(o->qc, o->n, o->kind == Q_SPAN_END);
		break;
	}
	free(o);
}

/* A zeroed record of kind k. */
static struct qop *q_new(struct st_compute *c, enum qkind k)
{
	struct qop *o = calloc(1, sizeof(*o));

	if (!o) {
		st_error_set(-ENOMEM, "compute: out of memory queueing an op");
		return NULL;
	}
	o->qc = qc_of(c);
	o->kind = k;
	o->threads = omp_get_max_threads();
	return o;
}

static int q_put(struct st_compute *c, struct qop *o)
{
	struct qcompute *qc = qc_of(c);
	int ret;

	if (!o)
		return -ENOMEM;
	ret = st_device_host_fn(qc->dev, qc->q, q_run, o);
	if (ret < 0)
		free(o);
	return ret;
}

#define Q_PTR(x) ((void *)(uintptr_t)(x)) /* the record drops const */

static int q_sync(struct st_compute *c)
{
	return st_queue_sync(qc_of(c)->dev, qc_of(c)->q);
}

static void q_destroy(struct st_compute *c)
{
	struct qcompute *qc = qc_of(c);

	st_queue_sync(qc->dev, qc->q);
	st_queue_destroy(qc->dev, qc->q);
	pthread_mutex_destroy(&qc->lock);
	free(qc->spans);
	free(qc);
}

static int q_zero(struct st_compute *c, void *p, size_t bytes)
{
	struct qop *o = q_new(c, Q_ZERO);

	if (o) {
		o->p[0] = p;
		o->n = bytes;
	}
	return q_put(c, o);
}

static int q_copy(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	struct qop *o = q_new(c, Q_COPY);

	if (o) {
		o->p[0] = dst;
		o->p[1] = Q_PTR(src);
		o->n = bytes;
	}
	return q_put(c, o);
}

/* to_host, from_host: in queue order, then waited for. */
static int q_copy_sync(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	int ret = q_copy(c, dst, src, bytes);

	return ret ? ret : q_sync(c);
}

static int q_bf16_to_f32(struct st_compute *c, float *out, const uint16_t *in, size_t n)
{
	struct qop *o = q_new(c, Q_BF16);

	if (o) {
		o->p[0] = out;
		o->p[1] = Q_PTR(in);
		o->n = n;
	}
	return q_put(c, o);
}

static int q_gemm(struct st_compute *c, int ta, int tb, int M, int N, int K, const float *A,
		  int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
	struct qop *o = q_new(c, Q_GEMM);

	if (o) {
		int v[8] = { ta, tb, M, N, K, lda, ldb, ldc };

		memcpy(o->i, v, sizeof(v));
		o->p[0] = Q_PTR(A);
		o->p[1] = Q_PTR(B);
		o->p[2] = C;
		o->f = beta;
	}
	return q_put(c, o);
}

static int q_matmul_fwd(struct st_compute *c, float *out, const float *inp,
			const float *weight, const float *bias, int N, int IC, int OC)
{
	struct qop *o = q_new(c, Q_MM_FWD);

	if (o) {
		void *v[4] = { out, Q_PTR(inp), Q_PTR(weight), Q_PTR(bias) };

		memcpy(o->p, v, sizeof(v));
		o->i[0] = N, o->i[1] = IC, o->i[2] = OC;
	}
	return q_put(c, o);
}

static int q_matmul_bwd(struct st_compute *c, float *dinp, float *dweight, float *dbias,
			const float *dout, const float *inp, const float *weight, int N, int IC,
			int OC)
{
	struct qop *o = q_new(c, Q_MM_BWD);

	if (o) {
		void *v[6] = { dinp, dweight, dbias, Q_PTR(dout), Q_PTR(inp), Q_PTR(weight) };

		memcpy(o->p, v, sizeof(v));
		o->i[0] = N, o->i[1] = IC, o->i[2] = OC;
	}
	return q_put(c, o);
}

static int q_layernorm_fwd(struct st_compute *c, float *out, float *mean, float *rstd,
			   const float *inp, const float *weight, const float *bias, int N, int C)
{
	struct qop *o = q_new(c, Q_LN_FWD);

	if (o) {
		void *v[6] = { out, mean, rstd, Q_PTR(inp), Q_PTR(weight), Q_PTR(bias) };

		memcpy(o->p, v, sizeof(v));
		o->i[0] = N, o->i[1] = C;
	}
	return q_put(c, o);
}

static int q_layernorm_bwd(struct st_compute *c, float *dinp, float *dweight, float *dbias,
			   const float *dout, const float *inp, const float *weight,
			   const float *mean, const float *rstd, int N, int C)
{
	struct qop *o = q_new(c, Q_LN_BWD);

	if (o) {
		void *v[8] = { dinp, dweight, dbias, Q_PTR(dout), Q_PTR(inp), Q_PTR(weight),
			       Q_PTR(mean), Q_PTR(rstd) };

		memcpy(o->p, v, sizeof(v));
		o->i[0] = N, o->i[1] = C;
	}
	return q_put(c, o);
}

static int q_gelu_fwd(struct st_compute *c, float *out, const float *inp, size_t n)
{
	struct qop *o = q_new(c, Q_GELU_FWD);

	if (o) {
		o->p[0] = out;
		o->p[1] = Q_PTR(inp);
		o->n = n;
	}
	return q_put(c, o);
}

static int q_gelu_bwd(struct st_compute *c, float *dinp, const float *inp, const float *dout,
		      size_t n)
{
	struct qop *o = q_new(c, Q_GELU_BWD);

	if (o) {
		o->p[0] = dinp;
		o->p[1] = Q_PTR(inp);
		o->p[2] = Q_PTR(dout);
		o->n = n;
	}
	return q_put(c, o);
}

static int q_residual_fwd(struct st_compute *c, float *out, const float *a, const float *b,
			  size_t n)
{
	struct qop *o = q_new(c, Q_RES);

	if (o) {
		o->p[0] = out;
		o->p[1] = Q_PTR(a);
		o->p[2] = Q_PTR(b);
		o->n = n;
	}
	return q_put(c, o);
}

static int q_embedding_fwd(struct st_compute *c, float *out, const int32_t *tokens,
			   const float *wte, const float *wpe, int B, int T, int C)
{
	struct qop *o = q_new(c, Q_EMB_FWD);

	if (o) {
		void *v[4] = { out, Q_PTR(tokens), Q_PTR(wte), Q_PTR(wpe) };

		memcpy(o->p, v, sizeof(v));
		o->i[0] = B, o->i[1] = T, o->i[2] = C;
	}
	return q_put(c, o);
}

static int q_embedding_bwd(struct st_compute *c, float *dwte, float *dwpe, const float *dout,
			   const int32_t *tokens, int B, int T, int C)
{
	struct qop *o = q_new(c, Q_EMB_BWD);

	if (o) {
		void *v[4] = { dwte, dwpe, Q_PTR(dout), Q_PTR(tokens) };

		memcpy(o->p, v, sizeof(v));
		o->i[0] = B, o->i[1] = T, o->i[2] = C;
	}
	return q_put(c, o);
}

static int q_attention_fwd(struct st_compute *c, float *out, float *lse, const float *qkv,
			   int B, int T, int C, int NH)
{
	struct qop *o = q_new(c, Q_ATT_FWD);

	if (o) {
		o->p[0] = out;
		o->p[1] = lse;
		o->p[2] = Q_PTR(qkv);
		o->i[0] = B, o->i[1] = T, o->i[2] = C, o->i[3] = NH;
	}
	return q_put(c, o);
}

static int q_attention_bwd(struct st_compute *c, float *dqkv, const float *dout,
			   const float *qkv, const float *out, const float *lse, int B, int T,
			   int C, int NH)
{
	struct qop *o = q_new(c, Q_ATT_BWD);

	if (o) {
		void *v[5] = { dqkv, Q_PTR(dout), Q_PTR(qkv), Q_PTR(out), Q_PTR(lse) };

		memcpy(o->p, v, sizeof(v));
		o->i[0] = B, o->i[1] = T, o->i[2] = C, o->i[3] = NH;
	}
	return q_put(c, o);
}

static int q_crossentropy_fwd(struct st_compute *c, float *losses, const float *logits,
			      const int32_t *targets, int N, int V)
{
	struct qop *o = q_new(c, Q_CE_FWD);

	if (o) {
		o->p[0] = losses;
		o->p[1] = Q_PTR(logits);
		o->p[2] = Q_PTR(targets);
		o->i[0] = N, o->i[1] = V;
	}
	return q_put(c, o);
}

static int q_crossentropy_bwd(struct st_compute *c, float *dlogits, float *losses,
			      const float *logits, const int32_t *targets, float dloss, int N,
			      int V)
{
	struct qop *o = q_new(c, Q_CE_BWD);

	if (o) {
		void *v[4] = { dlogits, losses, Q_PTR(logits), Q_PTR(targets) };

		memcpy(o->p, v, sizeof(v));
		o->f = dloss;
		o->i[0] = N, o->i[1] = V;
	}
	return q_put(c, o);
}

static int q_record(struct st_compute *c, struct st_event *e)
{
	return st_event_record(qc_of(c)->dev, e, qc_of(c)->q);
}

static int q_wait(struct st_compute *c, struct st_event *e)
{
	return st_queue_wait(qc_of(c)->dev, qc_of(c)->q, e);
}

static int q_span(struct st_compute *c, const char *name)
{
	struct qcompute *qc = qc_of(c);
	struct qop *o;
	int idx, ret;

	if (!name && qc->open < 0)
		return 0;
	if (name && qc->open >= 0) { /* an unclosed span ends here, uncounted */
		pthread_mutex_lock(&qc->lock);
		qc->spans[qc->open].s.name = NULL;
		pthread_mutex_unlock(&qc->lock);
		ret = q_span(c, NULL);
		if (ret < 0)
			return ret;
	}
	o = q_new(c, name ? Q_SPAN_BEGIN : Q_SPAN_END);
	if (!o)
		return -ENOMEM;
	pthread_mutex_lock(&qc->lock);
	if (name && qc->nspans == qc->cap) {
		int cap = qc->cap ? 2 * qc->cap : 64;
		struct qspan *n = realloc(qc->spans, (size_t)cap * sizeof(*n));

		if (!n) {
			pthread_mutex_unlock(&qc->lock);
			free(o);
			return st_error_set(-ENOMEM, "compute: out of memory for spans");
		}
		qc->spans = n;
		qc->cap = cap;
	}
	if (name) {
		idx = qc->nspans++;
		qc->spans[idx] = (struct qspan){ .s = { .name = name } };
		qc->open = idx;
	} else {
		idx = qc->open;
		qc->open = -1;
	}
	o->n = qc->taken + (uint64_t)idx;
	pthread_mutex_unlock(&qc->lock);
	return q_put(c, o);
}

static int q_take_spans(struct st_compute *c, struct st_compute_span *out, int max)
{
	struct qcompute *qc = qc_of(c);
	int n = 0, k = 0;

	pthread_mutex_lock(&qc->lock);
	/* spans finish in queue order: the done ones are a prefix */
	while (k < qc->nspans && qc->spans[k].done && n < max) {
		if (qc->spans[k].s.name)
			out[n++] = qc->spans[k].s;
		k++;
	}
	memmove(qc->spans, qc->spans + k, (size_t)(qc->nspans - k) * sizeof(*qc->spans));
	qc->nspans -= k;
	qc->taken += (uint64_t)k;
	if (qc->open >= 0)
		qc->open -= k;
	pthread_mutex_unlock(&qc->lock);
	return n;
}

static const struct st_compute_ops cpu_queued_ops = {
	.name = "cpu",
	.sync = q_sync,
	.destroy = q_destroy,
	.zero = q_zero,
	.copy = q_copy,
	.to_host = q_copy_sync,
	.from_host = q_copy_sync,
	.bf16_to_f32 = q_bf16_to_f32,
	.gemm = q_gemm,
	.matmul_fwd = q_matmul_fwd,
	.matmul_bwd = q_matmul_bwd,
	.layernorm_fwd = q_layernorm_fwd,
	.layernorm_bwd = q_layernorm_bwd,
	.gelu_fwd = q_gelu_fwd,
	.gelu_bwd = q_gelu_bwd,
	.residual_fwd = q_residual_fwd,
	.embedding_fwd = q_embedding_fwd,
	.embedding_bwd = q_embedding_bwd,
	.attention_fwd = q_attention_fwd,
	.attention_bwd = q_attention_bwd,
	.crossentropy_fwd = q_crossentropy_fwd,
	.crossentropy_bwd = q_crossentropy_bwd,
	.record = q_record,
	.wait = q_wait,
	.span = q_span,
	.take_spans = q_take_spans,
};

static int cpu_queued_create(struct st_device *d, struct st_compute **out)
{
	struct qcompute *qc = calloc(1, sizeof(*qc));
	int ret;

	if (!qc)
		return st_error_set(-ENOMEM, "compute: out of memory");
	ret = st_queue_create(d, &qc->q);
	if (ret < 0) {
		free(qc);
		return ret;
	}
	qc->c.ops = &cpu_queued_ops;
	qc->dev = d;
	qc->open = -1;
	pthread_mutex_init(&qc->lock, NULL);
	*out = &qc->c;
	return 0;
}

/* ---- instances --------------------------------------------------------------- */

int st_compute_create(struct st_device *d, struct st_compute **out)
{
	const char *name = st_device_name(d);

	*out = NULL;
	if (strcmp(name, "cpu") == 0)
		return cpu_queued_create(d, out);
#ifdef ST_HAVE_CUDA
	if (strcmp(name, "cuda") == 0)
		return st_compute_cuda_create(st_device_ordinal(d), out);
#endif
	return st_error_set(-ENODEV, "compute: no compute for device '%s'", name);
}

void st_compute_destroy(struct st_compute *c)
{
	if (c && c != &cpu_compute)
		c->ops->destroy(c);
}

const char *st_compute_name(const struct st_compute *c)
{
	return c->ops->name;
}

int st_compute_take_error(struct st_compute *c)
{
	int err = c->err;

	c->err = 0;
	return err;
}

int st_compute_sync(struct st_compute *c)
{
	int ret = c->ops->sync(c);

	if (c->err)
		ret = c->err;
	c->err = 0;
	return ret;
}

/* ---- the ops: skipped while an error is sticky ---------------------------------- */

#define OP(call)                            \
	do {                                \
		if (c->err == 0) {          \
			int r_ = c->ops->call; \
			if (r_)             \
				c->err = r_; \
		}                           \
	} while (0)

void st_compute_zero(struct st_compute *c, void *p, size_t bytes)
{
	OP(zero(c, p, bytes));
}

void st_compute_copy(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	OP(copy(c, dst, src, bytes));
}

void st_compute_to_host(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	OP(to_host(c, dst, src, bytes));
}

void st_compute_from_host(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	OP(from_host(c, dst, src, bytes));
}

void st_compute_bf16_to_f32(struct st_compute *c, float *out, const uint16_t *in, size_t n)
{
	OP(bf16_to_f32(c, out, in, n));
}

void st_compute_gemm(struct st_compute *c, int trans_a, int trans_b, int M, int N, int K,
		     const float *A, int lda, const float *B, int ldb, float beta, float *C,
		     int ldc)
{
	OP(gemm(c, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc));
}

void st_compute_matmul_fwd(struct st_compute *c, float *out, const float *inp,
			   const float *weight, const float *bias, int N, int IC, int OC)
{
	OP(matmul_fwd(c, out, inp, weight, bias, N, IC, OC));
}

void st_compute_matmul_gelu_fwd(struct st_compute *c, float *out, float *pre,
				const float *inp, const float *weight, const float *bias, int N,
				int IC, int OC)
{
	float *mid = pre ? pre : out;

	if (c->ops->matmul_gelu_fwd) {
		OP(matmul_gelu_fwd(c, out, pre, inp, weight, bias, N, IC, OC));
		return;
	}
	OP(matmul_fwd(c, mid, inp, weight, bias, N, IC, OC));
	OP(gelu_fwd(c, out, mid, (size_t)N * OC));
}

void st_compute_matmul_bwd(struct st_compute *c, float *dinp, float *dweight, float *dbias,
			   const float *dout, const float *inp, const float *weight, int N,
			   int IC, int OC)
{
	OP(matmul_bwd(c, dinp, dweight, dbias, dout, inp, weight, N, IC, OC));
}

void st_compute_layernorm_fwd(struct st_compute *c, float *out, float *mean, float *rstd,
			      const float *inp, const float *weight, const float *bias,
			      int N, int C)
{
	OP(layernorm_fwd(c, out, mean, rstd, inp, weight, bias, N, C));
}

void st_compute_layernorm_bwd(struct st_compute *c, float *dinp, float *dweight,
			      float *dbias, const float *dout, const float *inp,
			      const float *weight, const float *mean, const float *rstd,
			      int N, int C)
{
	OP(layernorm_bwd(c, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C));
}

void st_compute_gelu_fwd(struct st_compute *c, float *out, const float *inp, size_t n)
{
	OP(gelu_fwd(c, out, inp, n));
}

void st_compute_gelu_bwd(struct st_compute *c, float *dinp, const float *inp,
			 const float *dout, size_t n)
{
	OP(gelu_bwd(c, dinp, inp, dout, n));
}

void st_compute_residual_fwd(struct st_compute *c, float *out, const float *a,
			     const float *b, size_t n)
{
	OP(residual_fwd(c, out, a, b, n));
}

void st_compute_embedding_fwd(struct st_compute *c, float *out, const int32_t *tokens,
			      const float *wte, const float *wpe, int B, int T, int C)
{
	OP(embedding_fwd(c, out, tokens, wte, wpe, B, T, C));
}

void st_compute_embedding_bwd(struct st_compute *c, float *dwte, float *dwpe,
			      const float *dout, const int32_t *tokens, int B, int T, int C)
{
	OP(embedding_bwd(c, dwte, dwpe, dout, tokens, B, T, C));
}

void st_compute_attention_fwd(struct st_compute *c, float *out, float *lse,
			      const float *qkv, int B, int T, int C, int NH)
{
	OP(attention_fwd(c, out, lse, qkv, B, T, C, NH));
}

void st_compute_attention_bwd(struct st_compute *c, float *dqkv, const float *dout,
			      const float *qkv, const float *out, const float *lse, int B,
			      int T, int C, int NH)
{
	OP(attention_bwd(c, dqkv, dout, qkv, out, lse, B, T, C, NH));
}

void st_compute_crossentropy_fwd(struct st_compute *c, float *losses, const float *logits,
				 const int32_t *targets, int N, int V)
{
	OP(crossentropy_fwd(c, losses, logits, targets, N, V));
}

void st_compute_crossentropy_bwd(struct st_compute *c, float *dlogits, float *losses,
				 const float *logits, const int32_t *targets, float dloss,
				 int N, int V)
{
	OP(crossentropy_bwd(c, dlogits, losses, logits, targets, dloss, N, V));
}

void st_compute_record(struct st_compute *c, struct st_event *e)
{
	if (c->err == 0 && !c->ops->record)
		c->err = st_error_set(-ENOTSUP, "compute '%s' has no queue to record an event on",
				      c->ops->name);
	OP(record(c, e));
}

void st_compute_wait(struct st_compute *c, struct st_event *e)
{
	if (c->err == 0 && !c->ops->wait)
		c->err = st_error_set(-ENOTSUP, "compute '%s' has no queue to wait on",
				      c->ops->name);
	OP(wait(c, e));
}

void st_compute_span_begin(struct st_compute *c, const char *name)
{
	if (c->ops->span)
		OP(span(c, name));
}

void st_compute_span_end(struct st_compute *c)
{
	if (c->ops->span)
		OP(span(c, NULL));
}

int st_compute_take_spans(struct st_compute *c, struct st_compute_span *out, int max)
{
	return c->ops->take_spans ? c->ops->take_spans(c, out, max) : 0;
}
