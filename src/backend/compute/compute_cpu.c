/* The cpu computes: the one cpu dispatch (a table of kernel calls, indexed
 * by op), the direct compute that runs it on the calling thread, and the
 * queued compute that runs it on a queue of the cpu device. Both give the
 * cpu kernels' bits: the queue only changes where and when they run. */
#include "compute_internal.h"

#include "../device/device_cpu.h"
#include "strata/kernels.h"
#include "kernels_bf16.h"
#include "strata/optim.h"

#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- the dispatch: one row per op ------------------------------------------- */

/* Slot k's pointer, and the integer parameters as the kernels take them. */
#define P(k) (op->t[k].data)
#define I(k) ((int)op->i[k])
#define Z(k) ((size_t)op->i[k])

static void k_zero(const struct st_op *op)
{
	st_cpu_zero(P(0), Z(0));
}

static void k_copy(const struct st_op *op)
{
	st_cpu_copy(P(0), P(1), Z(0));
}

static void k_bf16_to_f32(const struct st_op *op)
{
	st_cpu_bf16_to_f32(P(0), P(1), Z(0));
}

static void k_gemm(const struct st_op *op)
{
	st_cpu_sgemm(I(0), I(1), I(2), I(3), I(4), 1.0f, P(0), I(5), P(1), I(6), op->f[0],
		     P(2), I(7));
}

static void k_matmul_fwd(const struct st_op *op)
{
	if (op->t[1].dtype == ST_DTYPE_BF16)
		st_cpu_matmul_fwd_bf16(P(0), P(1), P(2), P(3), I(0), I(1), I(2));
	else
		st_cpu_matmul_fwd(P(0), P(1), P(2), P(3), I(0), I(1), I(2));
}

/* The matmul into pre (or out), then gelu: what the unfused path does. */
static void k_matmul_gelu_fwd(const struct st_op *op)
{
	float *mid = P(1) ? P(1) : P(0);

	st_cpu_matmul_fwd(mid, P(2), P(3), P(4), I(0), I(1), I(2));
	st_cpu_gelu_fwd(P(0), mid, (size_t)op->i[0] * (size_t)op->i[2]);
}

static void k_matmul_bwd(const struct st_op *op)
{
	st_cpu_matmul_bwd(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), I(2));
}

static void k_layernorm_fwd(const struct st_op *op)
{
	st_cpu_layernorm_fwd(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1));
}

static void k_layernorm_bwd(const struct st_op *op)
{
	st_cpu_layernorm_bwd(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), I(0), I(1));
}

static void k_gelu_fwd(const struct st_op *op)
{
	st_cpu_gelu_fwd(P(0), P(1), Z(0));
}

static void k_gelu_bwd(const struct st_op *op)
{
	st_cpu_gelu_bwd(P(0), P(1), P(2), Z(0));
}

static void k_residual_fwd(const struct st_op *op)
{
	st_cpu_residual_fwd(P(0), P(1), P(2), Z(0));
}

static void k_embedding_fwd(const struct st_op *op)
{
	st_cpu_embedding_fwd(P(0), P(1), P(2), P(3), I(0), I(1), I(2));
}

static void k_embedding_bwd(const struct st_op *op)
{
	st_cpu_embedding_bwd(P(0), P(1), P(2), P(3), I(0), I(1), I(2));
}

static void k_attention_fwd(const struct st_op *op)
{
	st_cpu_attention_fwd_seg(P(0), P(1), P(2), I(0), I(1), I(2), I(3), P(3));
}

static void k_attention_bwd(const struct st_op *op)
{
	st_cpu_attention_bwd_seg(P(0), P(1), P(2), P(3), P(4), I(0), I(1), I(2), I(3), P(5));
}

static void k_crossentropy_fwd(const struct st_op *op)
{
	st_cpu_crossentropy_fwd(P(0), P(1), P(2), I(0), I(1));
}

static void k_crossentropy_bwd(const struct st_op *op)
{
	st_cpu_crossentropy_bwd(P(0), P(1), P(2), P(3), op->f[0], I(0), I(1));
}

static void k_linear_fwd(const struct st_op *op)
{
	st_cpu_linear_fwd(P(0), P(1), P(2), P(3), I(0), I(1), I(2));
}

static void k_linear_bwd(const struct st_op *op)
{
	st_cpu_linear_bwd(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1), I(2));
}

static void k_rmsnorm_fwd(const struct st_op *op)
{
	st_cpu_rmsnorm_fwd(P(0), P(1), P(2), P(3), op->f[0], I(0), I(1));
}

static void k_rmsnorm_bwd(const struct st_op *op)
{
	st_cpu_rmsnorm_bwd(P(0), P(1), P(2), P(3), P(4), P(5), I(0), I(1));
}

static void k_rope_fwd(const struct st_op *op)
{
	st_cpu_rope_fwd(P(0), P(1), I(0), I(1), I(7), I(2), I(3), I(4), I(5), I(6), op->f[0],
			op->f[1], op->f[2], op->f[3]);
}

static void k_rope_bwd(const struct st_op *op)
{
	st_cpu_rope_bwd(P(0), P(1), I(0), I(1), I(7), I(2), I(3), I(4), I(5), I(6), op->f[0],
			op->f[1], op->f[2], op->f[3]);
}

static void k_swiglu_fwd(const struct st_op *op)
{
	st_cpu_swiglu_fwd(P(0), P(1), P(2), Z(0));
}

static void k_swiglu_bwd(const struct st_op *op)
{
	st_cpu_swiglu_bwd(P(0), P(1), P(2), P(3), P(4), Z(0));
}

static void k_token_embed_fwd(const struct st_op *op)
{
	st_cpu_token_embed_fwd(P(0), P(1), P(2), I(0), I(1));
}

static void k_token_embed_bwd(const struct st_op *op)
{
	st_cpu_token_embed_bwd(P(0), P(1), P(2), I(0), I(1));
}

static void k_gqa_attention_fwd(const struct st_op *op)
{
	st_cpu_gqa_attention_fwd_seg(P(0), P(1), P(2), P(3), P(4), I(0), I(1), I(2), I(3), I(4),
				     P(5));
}

static void k_decode_attention(const struct st_op *op)
{
	st_cpu_decode_attention(P(0), P(1), P(2), P(3), I(0), I(1), I(2), I(3), I(4), I(5));
}

static void k_gqa_attention_bwd(const struct st_op *op)
{
	st_cpu_gqa_attention_bwd_seg(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), I(0),
				     I(1), I(2), I(3), I(4), P(9));
}

/* The host's AdamW (src/optim) over the op's tensors: the same call the
 * engine's update sweep makes, so the bits are the host placement's. */
static void k_adamw(const struct st_op *op)
{
	struct st_adam_step s = {
		.grad_scale = op->f[0], .beta1 = op->f[1], .one_minus_beta1 = op->f[2],
		.beta2 = op->f[3], .one_minus_beta2 = op->f[4], .rsqrt_bc2 = op->f[5],
		.eps = op->f[6], .neg_step_size = op->f[7], .decay = op->f[8],
		.path = st_optim_path_get(),
	};
	struct st_adam_bufs b = {
		.g = P(0), .g_dtype = ST_OPTIM_F32, .p = P(1), .m = P(2), .v = P(3), .w = P(4),
		.w_dtype = op->t[4].dtype == ST_DTYPE_BF16 ? ST_OPTIM_BF16 : ST_OPTIM_F32,
	};
	uint64_t bad = 0;
	uint32_t *cnt = P(5);

	(void)st_adam_apply(&s, &b, Z(0), ST_ADAM_GRAD_CHECKED, &bad);
	*cnt += (uint32_t)bad;
}

static void k_grad_sumsq(const struct st_op *op)
{
	struct st_compute_sumsq r = { 0 };

	r.nonfinite = st_grad_sumsq(P(2), ST_OPTIM_F32, Z(0), &r.sumsq) < 0;
	memcpy(P(0), &r, sizeof(r));
}

/* The unfused kernels in turn: their bits (no speed claimed on the cpu). */
static void k_residual_layernorm_fwd(const struct st_op *op)
{
	st_cpu_residual_fwd(P(0), P(4), P(5), (size_t)op->i[0] * (size_t)op->i[1]);
	st_cpu_layernorm_fwd(P(1), P(2), P(3), P(0), P(6), P(7), I(0), I(1));
}

static void k_residual_rmsnorm_fwd(const struct st_op *op)
{
	st_cpu_residual_fwd(P(0), P(3), P(4), (size_t)op->i[0] * (size_t)op->i[1]);
	st_cpu_rmsnorm_fwd(P(1), P(2), P(0), P(5), op->f[0], I(0), I(1));
}

static void k_f32_to_bf16(const struct st_op *op)
{
	st_cpu_f32_to_bf16(P(0), P(1), Z(0));
}

static void head_rec(void *arg, const struct st_op *rec)
{
	(void)arg;
	st_cpu_op_run(rec);
}

/* The bf16 head as its unfused records, run here in turn (their bits). */
static void k_head_crossentropy(const struct st_op *op)
{
	st_op_head_ce_unfold(op, head_rec, NULL);
}

typedef void (*cpu_kernel)(const struct st_op *op);

static const cpu_kernel cpu_kernels[ST_OP_COUNT] = {
	[ST_OP_ZERO] = k_zero,
	[ST_OP_COPY] = k_copy,
	[ST_OP_BF16_TO_F32] = k_bf16_to_f32,
	[ST_OP_GEMM] = k_gemm,
	[ST_OP_MATMUL_FWD] = k_matmul_fwd,
	[ST_OP_MATMUL_GELU_FWD] = k_matmul_gelu_fwd,
	[ST_OP_MATMUL_BWD] = k_matmul_bwd,
	[ST_OP_LAYERNORM_FWD] = k_layernorm_fwd,
	[ST_OP_LAYERNORM_BWD] = k_layernorm_bwd,
	[ST_OP_GELU_FWD] = k_gelu_fwd,
	[ST_OP_GELU_BWD] = k_gelu_bwd,
	[ST_OP_RESIDUAL_FWD] = k_residual_fwd,
	[ST_OP_EMBEDDING_FWD] = k_embedding_fwd,
	[ST_OP_EMBEDDING_BWD] = k_embedding_bwd,
	[ST_OP_ATTENTION_FWD] = k_attention_fwd,
	[ST_OP_ATTENTION_BWD] = k_attention_bwd,
	[ST_OP_CROSSENTROPY_FWD] = k_crossentropy_fwd,
	[ST_OP_CROSSENTROPY_BWD] = k_crossentropy_bwd,
	[ST_OP_LINEAR_FWD] = k_linear_fwd,
	[ST_OP_LINEAR_BWD] = k_linear_bwd,
	[ST_OP_RMSNORM_FWD] = k_rmsnorm_fwd,
	[ST_OP_RMSNORM_BWD] = k_rmsnorm_bwd,
	[ST_OP_ROPE_FWD] = k_rope_fwd,
	[ST_OP_ROPE_BWD] = k_rope_bwd,
	[ST_OP_SWIGLU_FWD] = k_swiglu_fwd,
	[ST_OP_SWIGLU_BWD] = k_swiglu_bwd,
	[ST_OP_TOKEN_EMBED_FWD] = k_token_embed_fwd,
	[ST_OP_TOKEN_EMBED_BWD] = k_token_embed_bwd,
	[ST_OP_GQA_ATTENTION_FWD] = k_gqa_attention_fwd,
	[ST_OP_GQA_ATTENTION_BWD] = k_gqa_attention_bwd,
	[ST_OP_ADAMW] = k_adamw,
	[ST_OP_GRAD_SUMSQ] = k_grad_sumsq,
	[ST_OP_RESIDUAL_LAYERNORM_FWD] = k_residual_layernorm_fwd,
	[ST_OP_RESIDUAL_RMSNORM_FWD] = k_residual_rmsnorm_fwd,
	[ST_OP_F32_TO_BF16] = k_f32_to_bf16,
	[ST_OP_HEAD_CROSSENTROPY] = k_head_crossentropy,
	[ST_OP_DECODE_ATTENTION] = k_decode_attention,
};

/* matmul_fwd with bf16 inp and weight, fp32 out and bias: its own kernel
 * (st_cpu_matmul_fwd_bf16), older than the widening of kernels_bf16.c. */
static bool matmul_fwd_bf16_in(enum st_op_kind kind, const enum st_dtype *dt)
{
	return kind == ST_OP_MATMUL_FWD && dt[1] == ST_DTYPE_BF16 && dt[2] == ST_DTYPE_BF16 &&
	       dt[0] == ST_DTYPE_F32 && dt[3] == ST_DTYPE_F32;
}

bool st_cpu_op_supports(enum st_op_kind kind, const enum st_dtype *dt)
{
	if ((unsigned)kind >= ST_OP_COUNT || !cpu_kernels[kind])
		return false;
	if (matmul_fwd_bf16_in(kind, dt))
		return true;
	if (kind == ST_OP_ADAMW && dt[4] == ST_DTYPE_BF16)
		return dt[0] == ST_DTYPE_F32 && dt[1] == ST_DTYPE_F32 && dt[2] == ST_DTYPE_F32 &&
		       dt[3] == ST_DTYPE_F32 && dt[5] == ST_DTYPE_U8;
	/* any other fp32 / bf16 mix: widened (kernels_bf16.h) */
	return st_op_is_ref(kind, dt) || st_cpu_bf16_supports(kind, dt);
}

void st_cpu_op_run(const struct st_op *op)
{
	enum st_dtype dt[ST_OP_MAX_TENSORS];
	int n = st_op_tensors(op->kind);

	for (int k = 0; k < n; k++)
		dt[k] = op->t[k].dtype;
	if (!st_op_is_ref(op->kind, dt) && !matmul_fwd_bf16_in(op->kind, dt) &&
	    st_cpu_bf16_supports(op->kind, dt))
		st_cpu_op_run_bf16(op);
	else
		cpu_kernels[op->kind](op);
}

static bool cpu_supports(const struct st_compute *c, enum st_op_kind kind,
			 const enum st_dtype *dt)
{
	(void)c;
	return st_cpu_op_supports(kind, dt);
}

/* ---- the direct cpu compute --------------------------------------------------- */

static int cpu_run(struct st_compute *c, const struct st_op *op)
{
	(void)c;
	st_cpu_op_run(op);
	return 0;
}

static int cpu_sync(struct st_compute *c)
{
	(void)c;
	return 0;
}

static void cpu_destroy(struct st_compute *c)
{
	(void)c;
}

/* to_host and from_host: device memory is host memory. */
static int cpu_copy(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	(void)c;
	memcpy(dst, src, bytes);
	return 0;
}

static const struct st_compute_ops cpu_ops = {
	.name = "cpu",
	.run = cpu_run,
	.supports = cpu_supports,
	.sync = cpu_sync,
	.destroy = cpu_destroy,
	.to_host = cpu_copy,
	.from_host = cpu_copy,
	/* record, wait, span, take_spans: absent (no queue) */
};

static struct st_compute cpu_compute = { .ops = &cpu_ops };

struct st_compute *st_compute_cpu(void)
{
	return &cpu_compute;
}

/* ---- the queued cpu compute --------------------------------------------------- */

/* Every op is copied into a slot of a ring made at create and run by a
 * host function on the compute's queue, so the host goes on while the
 * kernels run, as with a GPU stream, and the engine's ordering (events,
 * syncs) is exercised where there is no GPU. The queue runs slots in the
 * order they were filled, so they finish in that order too: a slot is free
 * again once `done` has passed it. A full ring blocks the caller (one
 * thread calls a compute at a time) until the oldest slot has run. */

struct qcompute;

enum qslot_what { QS_OP, QS_SPAN_BEGIN, QS_SPAN_END };

struct qslot {
	struct qcompute *qc;
	enum qslot_what what;
	int threads;      /* the caller's OpenMP thread count, which a thread does not inherit */
	uint64_t span_id; /* QS_SPAN_*: the span's number, counted from the first ever */
	struct st_op op;  /* QS_OP */
};

struct qcompute {
	struct st_compute c;
	struct st_device *dev; /* borrowed */
	bool strict;           /* dev is cpu-strict: ops get tagged addresses */
	struct st_queue *q;
	struct qslot *ring;    /* ST_COMPUTE_CPU_RING_OPS slots */
	pthread_mutex_t ring_lock;
	pthread_cond_t ring_cond; /* signalled when a slot finishes */
	uint64_t ring_put;        /* slots ever queued (the caller's) */
	uint64_t ring_done;       /* slots ever finished (the worker's, under ring_lock) */
	pthread_mutex_t lock;     /* spans: the worker stamps, the host appends and takes */
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

/* The host function: run one slot, then free it. */
static void q_run(void *arg)
{
	struct qslot *s = arg;
	struct qcompute *qc = s->qc;

	if (s->what == QS_OP) {
		if (omp_get_max_threads() != s->threads)
			omp_set_num_threads(s->threads);
		st_cpu_op_run(&s->op);
	} else {
		q_span_stamp(qc, s->span_id, s->what == QS_SPAN_END);
	}
	pthread_mutex_lock(&qc->ring_lock);
	qc->ring_done++;
	pthread_cond_signal(&qc->ring_cond);
	pthread_mutex_unlock(&qc->ring_lock);
}

/* The next free slot, waiting for one when all are in flight. */
static struct qslot *q_slot(struct qcompute *qc, enum qslot_what what)
{
	struct qslot *s;

	pthread_mutex_lock(&qc->ring_lock);
	while (qc->ring_put - qc->ring_done >= ST_COMPUTE_CPU_RING_OPS)
		pthread_cond_wait(&qc->ring_cond, &qc->ring_lock);
	pthread_mutex_unlock(&qc->ring_lock);
	s = &qc->ring[qc->ring_put % ST_COMPUTE_CPU_RING_OPS];
	s->qc = qc;
	s->what = what;
	s->threads = omp_get_max_threads();
	return s;
}

/* Queue slot s (the one q_slot() gave). */
static int q_put(struct qcompute *qc, struct qslot *s)
{
	int ret;

	qc->ring_put++;
	ret = st_device_host_fn(qc->dev, qc->q, q_run, s);
	if (ret < 0)
		qc->ring_put--; /* not queued: the slot is still free */
	return ret;
}

/* Queue op as it is: its tensors are host addresses the kernels can use. */
static int q_enqueue(struct qcompute *qc, const struct st_op *op)
{
	struct qslot *s = q_slot(qc, QS_OP);

	s->op = *op;
	return q_put(qc, s);
}

/* cpu-strict: every tensor of an op is a device address (or NULL, where the
 * op allows it), as a GPU kernel's are; the kernels get the host addresses
 * behind them. A host address here is a kernel reading host memory. */
static void strict_translate(struct st_op *op)
{
	int n = st_op_tensors(op->kind);

	for (int k = 0; k < n; k++) {
		void *p = op->t[k].data;

		if (!p)
			continue;
		if (!st_cpu_strict_tagged(p))
			st_cpu_strict_fail("op %s is given the host address %p as its tensor %d: "
					   "a GPU's kernel cannot read host memory",
					   st_op_name(op->kind), p, k);
		op->t[k].data = st_cpu_strict_host(p);
	}
}

static int q_run_op(struct st_compute *c, const struct st_op *op)
{
	struct qcompute *qc = qc_of(c);
	struct st_op o;

	if (!qc->strict)
		return q_enqueue(qc, op);
	o = *op;
	strict_translate(&o);
	return q_enqueue(qc, &o);
}

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
	pthread_mutex_destroy(&qc->ring_lock);
	pthread_cond_destroy(&qc->ring_cond);
	free(qc->spans);
	free(qc->ring);
	free(qc);
}

/* A copy between host and device memory in queue order, not waited for.
 * cpu-strict: the device side must be a device address, the host side a
 * host one (a copy the wrong way round), and the kernel gets both as host
 * addresses. */
static int q_copy(struct st_compute *c, void *dst, const void *src, size_t bytes, bool to_host)
{
	struct qcompute *qc = qc_of(c);

	if (qc->strict) {
		const void *dev = to_host ? src : dst, *host = to_host ? dst : src;

		if (!st_cpu_strict_tagged(dev) || st_cpu_strict_tagged(host))
			st_cpu_strict_fail("a %s copy of %zu bytes from %p to %p: the %s side must be "
					   "device memory and the %s side host memory",
					   to_host ? "to_host" : "from_host", bytes, src, dst,
					   to_host ? "source" : "destination",
					   to_host ? "destination" : "source");
		dst = st_cpu_strict_host(dst);
		src = st_cpu_strict_host(src);
	}
	struct st_op op = { .kind = ST_OP_COPY,
			    .t = { st_tensor_1d(dst, ST_DTYPE_U8, (int64_t)bytes),
				   st_tensor_1d(src, ST_DTYPE_U8, (int64_t)bytes) },
			    .i = { (int64_t)bytes } };

	return q_enqueue(qc, &op);
}

static int q_from_host_async(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	return q_copy(c, dst, src, bytes, false);
}

/* to_host, from_host: the copy, then waited for. */
static int q_to_host(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	int ret = q_copy(c, dst, src, bytes, true);

	return ret ? ret : q_sync(c);
}

static int q_from_host(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	int ret = q_copy(c, dst, src, bytes, false);

	return ret ? ret : q_sync(c);
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
	struct qslot *s;
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
	pthread_mutex_lock(&qc->lock);
	/* grows only past the most spans ever pending at once (a few per step) */
	if (name && qc->nspans == qc->cap) {
		int cap = qc->cap ? 2 * qc->cap : 64;
		struct qspan *n = realloc(qc->spans, (size_t)cap * sizeof(*n));

		if (!n) { /* this span goes uncounted; the ops still run */
			pthread_mutex_unlock(&qc->lock);
			return 0;
		}
		qc->spans = n;
		qc->cap = cap;
	}
	if (name) {
		idx = qc->nspans++;
		qc->spans[idx] = (struct qspan){ .s = { .name = name, .tq_ns = st_now_ns() } };
		qc->open = idx;
	} else {
		idx = qc->open;
		qc->open = -1;
	}
	pthread_mutex_unlock(&qc->lock);
	s = q_slot(qc, name ? QS_SPAN_BEGIN : QS_SPAN_END);
	pthread_mutex_lock(&qc->lock);
	s->span_id = qc->taken + (uint64_t)idx;
	pthread_mutex_unlock(&qc->lock);
	return q_put(qc, s);
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
	.run = q_run_op,
	.supports = cpu_supports,
	.sync = q_sync,
	.destroy = q_destroy,
	.to_host = q_to_host,
	.from_host = q_from_host,
	.from_host_async = q_from_host_async,
	.record = q_record,
	.wait = q_wait,
	.span = q_span,
	.take_spans = q_take_spans,
};

int st_compute_cpu_queued_create(struct st_device *d, struct st_compute **out)
{
	struct qcompute *qc = calloc(1, sizeof(*qc));
	int ret;

	*out = NULL;
	if (qc) {
		qc->ring = calloc(ST_COMPUTE_CPU_RING_OPS, sizeof(*qc->ring));
		/* room for the spans a step leaves pending (it grows past that) */
		qc->cap = 64;
		qc->spans = calloc((size_t)qc->cap, sizeof(*qc->spans));
	}
	if (!qc || !qc->ring || !qc->spans) {
		if (qc) {
			free(qc->ring);
			free(qc->spans);
		}
		free(qc);
		return st_error_set(-ENOMEM, "compute: out of memory");
	}
	ret = st_queue_create(d, &qc->q);
	if (ret < 0) {
		free(qc->spans);
		free(qc->ring);
		free(qc);
		return ret;
	}
	qc->c.ops = &cpu_queued_ops;
	qc->dev = d;
	qc->strict = st_device_cpu_strict(d);
	qc->open = -1;
	pthread_mutex_init(&qc->lock, NULL);
	pthread_mutex_init(&qc->ring_lock, NULL);
	pthread_cond_init(&qc->ring_cond, NULL);
	*out = &qc->c;
	return 0;
}
