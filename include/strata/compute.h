/* strata: compute, the ops a model runs on a device.
 *
 * A st_compute runs op records (strata/op.h) on one device: every op of
 * strata/kernels.h (same shapes, argument order and conventions: forward
 * overwrites, backward accumulates except gelu_bwd and crossentropy_bwd),
 * plus the few memory moves a model needs, through one run hook of one ops
 * table. Pointers are the device's (its vram arena, or workspace carved
 * from it):
 *   cpu   - the cpu kernels themselves (OpenMP inside), queued on a worker
 *           thread of the cpu device (st_compute_create), or run on the
 *           calling thread (st_compute_cpu()); device pointers are host
 *           pointers. The numbers are the cpu kernels' bit for bit. On
 *           cpu-strict the same, queued, with every tensor a device address
 *           that the queue turns into its host one (a host address aborts:
 *           docs/gpu.md, "Strict mode").
 *           (src/backend/compute/compute_cpu.c)
 *   cuda  - the cuda ops (src/backend/kernels/cuda/cuda_ops.h) on a stream of its own; ops only queue work.
 *           (src/backend/compute/compute_cuda.c)
 * Both run every op in fp32, and matmul_fwd with bf16 inp and weight too
 * (st_compute_supports()).
 *
 * Errors are sticky, as CUDA's: an op that fails keeps its -errno (and
 * st_error_last() its message), and every later op is skipped until
 * st_compute_take_error() or st_compute_sync() hands the error back. So a
 * model can queue a whole unit and check once. The cpu ops never fail.
 *
 * Ordering: ops run in call order, on the compute's own queue of its device
 * (a CUDA stream; on the cpu device a worker thread, as the device's copy
 * queues are). Between that queue and the device's others, order goes
 * through the device's events: st_compute_record() marks the end of what was
 * called so far, so a copy queue can wait for it (st_tier_io.after), and
 * st_compute_wait() makes later ops wait for an event of another queue.
 * st_compute_sync() returns when every op called so far has finished: only
 * then may the host reuse what they read or read what they wrote.
 * to_host() and from_host() are synchronous.
 *
 * Spans: st_compute_span_begin()/end() bracket ops, and the device times
 * them (from reaching the first op to finishing the last): the compute
 * lane's busy time and its trace, whatever the host was doing meanwhile.
 *
 * st_compute_cpu() is the exception: no queue, ops run at the call, no
 * events and no spans. */
#ifndef STRATA_COMPUTE_H
#define STRATA_COMPUTE_H

#include "strata/common.h"
#include "strata/op.h"

struct st_device;
struct st_event;
struct st_compute;

/* A finished span, in host time (st_now_ns()): the device ran it from t0
 * to t1; the host queued it (called span_begin) at tq, so a compute idle
 * before t0 but after tq had work and waited on the device, and one idle
 * before tq waited for the host (tools/trace-gaps). */
struct st_compute_span {
	const char *name; /* as given to span_begin (not copied) */
	uint64_t t0_ns, t1_ns;
	uint64_t tq_ns;
};

/* A compute backend is one ops table: every op goes through run(), one
 * dispatch per backend (a table or a switch over enum st_op_kind), and
 * supports() says which ops and dtypes it runs. The core calls the
 * wrappers below, never the hooks. */
struct st_compute_ops {
	const char *name;
	/* Required. Queue (or, on the direct cpu compute, run) op; op is
	 * borrowed for the call only (a queue copies it). Called only for
	 * ops supports() accepts. 0 or -errno. */
	int (*run)(struct st_compute *c, const struct st_op *op);
	/* Required. Whether run() takes op `kind` with these tensor dtypes
	 * (dtypes[k] for slot k, st_op_tensors(kind) of them). Never fails. */
	bool (*supports)(const struct st_compute *c, enum st_op_kind kind,
			 const enum st_dtype *dtypes);
	/* Required. Wait for every op run so far. 0 or -errno. */
	int (*sync)(struct st_compute *c);
	/* Required. Finish queued work and free the instance. */
	void (*destroy)(struct st_compute *c);
	/* Required. Synchronous copies between device memory and host
	 * memory: in queue order, and done on return. 0 or -errno. */
	int (*to_host)(struct st_compute *c, void *dst, const void *src, size_t bytes);
	int (*from_host)(struct st_compute *c, void *dst, const void *src, size_t bytes);

	/* Optional (absent: the wrappers fail with -ENOTSUP). e is an event
	 * of the compute's device: record marks the end of the ops called so
	 * far; wait holds later ops until e is done. */
	int (*record)(struct st_compute *c, struct st_event *e);
	int (*wait)(struct st_compute *c, struct st_event *e);
	/* Optional (absent: no spans). Open a span called name, or close the
	 * open one (name NULL). */
	int (*span)(struct st_compute *c, const char *name);
	/* Optional. Move up to max finished spans, oldest first, into out;
	 * returns how many. */
	int (*take_spans)(struct st_compute *c, struct st_compute_span *out, int max);
	/* Optional (absent: from_host, synchronous). Queue a copy from host
	 * memory src into device memory dst, in queue order, and return at
	 * once: src must stay unchanged until an event recorded after it is
	 * done. 0 or -errno. */
	int (*from_host_async)(struct st_compute *c, void *dst, const void *src, size_t bytes);
	/* Optional (absent: every shape of what supports() takes). Whether
	 * run() takes op at its shapes (its integer parameters), once
	 * supports() took its dtypes: a kernel that runs only some shapes
	 * (the cuda bf16 attention: head size 64 or 128) says so here, so
	 * that st_compute_run() refuses the record before anything is queued
	 * and a model's precision check (st_model_precision_check()) refuses
	 * the configuration before the first step. When it does not, one
	 * short clause saying why goes to why (why_bytes > 0). Never fails. */
	bool (*supports_shape)(const struct st_compute *c, const struct st_op *op, char *why,
			       size_t why_bytes);
};

/* An instance: the table, the sticky error and the implementation's own
 * state. Only src/backend/compute/compute.c and the implementations touch the
 * fields. */
struct st_compute {
	const struct st_compute_ops *ops;
	int err;
	void *impl;
};

/* The cpu compute: one shared instance (the cpu ops never fail, so its
 * sticky error is never set). Never destroyed. */
struct st_compute *st_compute_cpu(void);

/* The compute for device d, with a queue of its own on d: the cpu kernels
 * on a worker thread of the cpu device, or the cuda ops on a stream of the
 * device's GPU. *out goes back with st_compute_destroy(), before d.
 * -ENODEV when the device has no compute built in, -ENOMEM. */
int st_compute_create(struct st_device *d, struct st_compute **out);
/* A dry compute: runs nothing (every op is dropped; to_host zero-fills,
 * from_host, record and wait do nothing) but answers supports() as `real`
 * (borrowed) does, so that a caller's sequence of ops can be checked
 * against real without touching memory: an op real does not run sets the
 * sticky -ENOTSUP naming the op and its dtypes, as st_compute_run() does
 * on real. *out goes back with st_compute_destroy(). 0 or -ENOMEM. */
int st_compute_dry_create(struct st_compute *real, struct st_compute **out);
/* Finishes queued work first. The cpu instance is left alone. */
void st_compute_destroy(struct st_compute *c);
const char *st_compute_name(const struct st_compute *c);

/* Wait for every op called so far; returns (and clears) the sticky error
 * or what waiting found. */
int st_compute_sync(struct st_compute *c);
/* The sticky error, cleared; 0 when none. Does not wait. */
int st_compute_take_error(struct st_compute *c);

/* Events: e belongs to the compute's device (st_event_create on it). */
void st_compute_record(struct st_compute *c, struct st_event *e);
void st_compute_wait(struct st_compute *c, struct st_event *e);
/* Spans do not nest: begin closes nothing, end closes the open one. */
void st_compute_span_begin(struct st_compute *c, const char *name);
void st_compute_span_end(struct st_compute *c);
/* Finished spans, oldest first (all of them after st_compute_sync()), up
 * to max; returns the count moved. */
int st_compute_take_spans(struct st_compute *c, struct st_compute_span *out, int max);

/* Run op on c, in call order: the one entry every op goes through (the
 * typed st_compute_<op>() below fill a record and call it). Skipped while
 * an error is sticky; an op c does not support (st_compute_supports_op():
 * its dtypes, or its shapes) sets -ENOTSUP as the sticky error, with one
 * line naming the op and why, and runs nothing; a failing run sets its
 * -errno. op is borrowed for the call only. */
void st_compute_run(struct st_compute *c, const struct st_op *op);
/* Whether c runs op `kind` with these dtypes (dtypes[k] for slot k,
 * st_op_tensors(kind) of them). */
bool st_compute_supports(const struct st_compute *c, enum st_op_kind kind,
			 const enum st_dtype *dtypes);
/* Whether c runs op as it is: the dtypes of its tensors and, where the
 * compute runs only some shapes of an op (supports_shape), its shapes.
 * What st_compute_run() checks. */
bool st_compute_supports_op(const struct st_compute *c, const struct st_op *op);

/* The typed conveniences: each fills a record (fp32 tensors, the
 * kernel's argument order) and calls st_compute_run(), so each is
 * skipped while an error is sticky. */
/* zero and copy move bytes. */
void st_compute_zero(struct st_compute *c, void *p, size_t bytes);
void st_compute_copy(struct st_compute *c, void *dst, const void *src, size_t bytes);
/* Synchronous: dst (host) holds the bytes on return, when no error. */
void st_compute_to_host(struct st_compute *c, void *dst, const void *src, size_t bytes);
/* Synchronous: src (host) may be reused on return. */
void st_compute_from_host(struct st_compute *c, void *dst, const void *src, size_t bytes);
/* Queued: src (host) may be reused once an event recorded after this
 * (st_compute_record) is done. Synchronous where the compute has no
 * from_host_async hook. */
void st_compute_from_host_async(struct st_compute *c, void *dst, const void *src,
				size_t bytes);
void st_compute_bf16_to_f32(struct st_compute *c, float *out, const uint16_t *in,
			    size_t n);
/* out (N,OC) = inp (N,IC) @ weight (IC,OC) + bias (OC; NULL: none). */
void st_compute_matmul_fwd(struct st_compute *c, float *out, const float *inp,
			   const float *weight, const float *bias, int N, int IC, int OC);
/* The same with bf16 inp (N,IC) and weight (IC,OC), fp32 accumulation;
 * out and bias fp32. -ENOTSUP (sticky) where the compute has no bf16
 * matmul; both the cpu and the cuda computes have one. */
void st_compute_matmul_fwd_bf16(struct st_compute *c, float *out, const uint16_t *inp,
				const uint16_t *weight, const float *bias, int N, int IC,
				int OC);
/* out (N,OC) = gelu(inp @ weight + bias); pre (N,OC), when not NULL, gets
 * inp @ weight + bias. One op (ST_OP_MATMUL_GELU_FWD) where the compute
 * supports it (the cpu computes: matmul_fwd then gelu_fwd; the cuda
 * compute: cuBLASLt's GELU epilogue), else matmul_fwd into pre (or out)
 * then gelu_fwd. */
void st_compute_matmul_gelu_fwd(struct st_compute *c, float *out, float *pre,
				const float *inp, const float *weight, const float *bias, int N,
				int IC, int OC);
void st_compute_gelu_fwd(struct st_compute *c, float *out, const float *inp, size_t n);
void st_compute_residual_fwd(struct st_compute *c, float *out, const float *a,
			     const float *b, size_t n);
void st_compute_embedding_bwd(struct st_compute *c, float *dwte, float *dwpe,
			      const float *dout, const int32_t *tokens, int B, int T, int C);
void st_compute_crossentropy_fwd(struct st_compute *c, float *losses, const float *logits,
				 const int32_t *targets, int N, int V);
void st_compute_crossentropy_bwd(struct st_compute *c, float *dlogits, float *losses,
				 const float *logits, const int32_t *targets, float dloss,
				 int N, int V);

/* The rotation of strata/rope.h; its parameters as the op's (strata/op.h). */
struct st_rope_args {
	int type, original_ctx;
	float theta, factor, low_freq_factor, high_freq_factor;
};
/* LLaMA's embedding gradient (strata/kernels.h, st_cpu_token_embed_bwd). */
void st_compute_token_embed_bwd(struct st_compute *c, float *dwte, const float *dout,
				const int32_t *tokens, int N, int C);

/* The optimizer on the device (docs/gpu.md): AdamW over n fp32 elements of
 * G, P, M, V in the compute's memory, W (fp32, or bf16 when w_bf16; NULL:
 * none) written from the new P, with the constants of step (strata/optim.h),
 * st_adam_apply(step, ..., ST_ADAM_GRAD_CHECKED) bit for bit; the number of
 * elements left unchanged (a NaN or Inf scaled gradient) is ADDED to the
 * uint32 at *bad (device memory). One op, ST_OP_ADAMW. */
struct st_adam_step;
void st_compute_adamw(struct st_compute *c, const struct st_adam_step *step, const float *g,
		      float *p, float *m, float *v, void *w, bool w_bf16, uint32_t *bad,
		      size_t n);
/* st_grad_sumsq(g, f32, n) on the device into out (device memory,
 * struct st_compute_sumsq), through scratch of
 * st_compute_sumsq_scratch_bytes(n) bytes. ST_OP_GRAD_SUMSQ. */
struct st_compute_sumsq {
	double sumsq;
	uint32_t nonfinite; /* 1: G holds a NaN or Inf (sumsq is then NaN or Inf) */
	uint32_t zero;
};
size_t st_compute_sumsq_scratch_bytes(size_t n);
void st_compute_grad_sumsq(struct st_compute *c, struct st_compute_sumsq *out, void *scratch,
			   const float *g, size_t n);
/* out (n, bf16) = in (n, fp32) rounded to nearest even. ST_OP_F32_TO_BF16. */
void st_compute_f32_to_bf16(struct st_compute *c, uint16_t *out, const float *in, size_t n);

#endif
