/* Compute: the wrappers every caller goes through (sticky errors, the
 * supports() check, defaults for optional hooks), the typed conveniences
 * that fill op records, and the choice of compute for a device. The
 * backends are src/backend/compute/compute_cpu.c and
 * src/backend/compute/compute_cuda.c. */
#include "strata/compute.h"

#include "compute_internal.h"
#include "strata/device.h"
#include "strata/optim.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- instances --------------------------------------------------------------- */

int st_compute_create(struct st_device *d, struct st_compute **out)
{
	const char *name = st_device_name(d);

	*out = NULL;
	if (strcmp(name, "cpu") == 0 || strcmp(name, "cpu-strict") == 0)
		return st_compute_cpu_queued_create(d, out);
#ifdef ST_HAVE_CUDA
	if (strcmp(name, "cuda") == 0)
		return st_compute_cuda_create(st_device_ordinal(d), out);
#endif
	return st_error_set(-ENODEV, "compute: no compute for device '%s'", name);
}

void st_compute_destroy(struct st_compute *c)
{
	if (c && c != st_compute_cpu())
		c->ops->destroy(c);
}

/* Whether c runs op at its shapes (the optional supports_shape hook);
 * why gets the reason when not. */
static bool shape_ok(const struct st_compute *c, const struct st_op *op, char *why,
		     size_t why_bytes)
{
	assert(why && why_bytes > 0);
	why[0] = '\0';
	return !c->ops->supports_shape || c->ops->supports_shape(c, op, why, why_bytes);
}

/* ---- the dry compute ------------------------------------------------------------- */

struct dry {
	struct st_compute c;
	struct st_compute *real;
};

static int dry_run(struct st_compute *c, const struct st_op *op)
{
	(void)c;
	(void)op;
	return 0;
}

static bool dry_supports(const struct st_compute *c, enum st_op_kind kind,
			 const enum st_dtype *dtypes)
{
	const struct dry *d = (const struct dry *)c;

	return st_compute_supports(d->real, kind, dtypes);
}

static bool dry_supports_shape(const struct st_compute *c, const struct st_op *op, char *why,
			       size_t why_bytes)
{
	const struct dry *d = (const struct dry *)c;

	return shape_ok(d->real, op, why, why_bytes);
}

static int dry_nothing(struct st_compute *c)
{
	(void)c;
	return 0;
}

static void dry_destroy(struct st_compute *c)
{
	free(c);
}

static int dry_to_host(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	(void)c;
	(void)src;
	memset(dst, 0, bytes);
	return 0;
}

static int dry_from_host(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	(void)c;
	(void)dst;
	(void)src;
	(void)bytes;
	return 0;
}

static int dry_event(struct st_compute *c, struct st_event *e)
{
	(void)c;
	(void)e;
	return 0;
}

static const struct st_compute_ops dry_ops = {
	.name = "dry",
	.run = dry_run,
	.supports = dry_supports,
	.supports_shape = dry_supports_shape,
	.sync = dry_nothing,
	.destroy = dry_destroy,
	.to_host = dry_to_host,
	.from_host = dry_from_host,
	.record = dry_event,
	.wait = dry_event,
};

int st_compute_dry_create(struct st_compute *real, struct st_compute **out)
{
	struct dry *d = calloc(1, sizeof(*d));

	*out = NULL;
	if (!d)
		return st_error_set(-ENOMEM, "compute: out of memory");
	d->c.ops = &dry_ops;
	d->real = real;
	*out = &d->c;
	return 0;
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

/* Call hook `call` unless an error is sticky; keep its error. */
#define OP(call)                                \
	do {                                    \
		if (c->err == 0) {              \
			int r_ = c->ops->call;  \
			if (r_)                 \
				c->err = r_;    \
		}                               \
	} while (0)

void st_compute_to_host(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	OP(to_host(c, dst, src, bytes));
}

void st_compute_from_host(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	OP(from_host(c, dst, src, bytes));
}

void st_compute_from_host_async(struct st_compute *c, void *dst, const void *src,
				size_t bytes)
{
	if (!c->ops->from_host_async)
		OP(from_host(c, dst, src, bytes));
	else
		OP(from_host_async(c, dst, src, bytes));
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

/* ---- the op seam ------------------------------------------------------------- */

bool st_compute_supports(const struct st_compute *c, enum st_op_kind kind,
			 const enum st_dtype *dtypes)
{
	assert(c && (unsigned)kind < ST_OP_COUNT && dtypes);
	return c->ops->supports(c, kind, dtypes);
}

/* The dtypes of op's tensors, into dt. */
static void op_dtypes(const struct st_op *op, enum st_dtype *dt)
{
	for (int k = 0; k < st_op_tensors(op->kind); k++)
		dt[k] = op->t[k].dtype;
}

bool st_compute_supports_op(const struct st_compute *c, const struct st_op *op)
{
	enum st_dtype dt[ST_OP_MAX_TENSORS];
	char why[160];

	op_dtypes(op, dt);
	return st_compute_supports(c, op->kind, dt) && shape_ok(c, op, why, sizeof(why));
}

void st_compute_run(struct st_compute *c, const struct st_op *op)
{
	enum st_dtype dt[ST_OP_MAX_TENSORS];
	char why[160];
	bool dtypes_ok;

	assert(c && op && (unsigned)op->kind < ST_OP_COUNT);
	if (c->err)
		return;
	op_dtypes(op, dt);
	dtypes_ok = st_compute_supports(c, op->kind, dt);
	if (!dtypes_ok || !shape_ok(c, op, why, sizeof(why))) {
		static const char *const dn[] = { "f32", "bf16", "i32", "u8" };
		const char *name = c->ops == &dry_ops ? ((struct dry *)c)->real->ops->name
						      : c->ops->name;
		char sig[ST_OP_MAX_TENSORS * 5 + 1] = "";
		size_t len = 0;

		for (int k = 0; k < st_op_tensors(op->kind); k++)
			len += (size_t)snprintf(sig + len, sizeof(sig) - len, "%s%s", k ? "," : "",
						dn[op->t[k].dtype & 3]);
		if (!dtypes_ok)
			c->err = st_error_set(-ENOTSUP,
					      "compute '%s' does not run %s with these dtypes (%s)",
					      name, st_op_name(op->kind), sig);
		else
			c->err = st_error_set(-ENOTSUP,
					      "compute '%s' does not run %s (%s) at this shape: %s",
					      name, st_op_name(op->kind), sig,
					      why[0] ? why : "no reason given");
		return;
	}
	OP(run(c, op));
}

/* ---- the typed conveniences: fp32 records -------------------------------------- */

#define F1(p, n) st_tensor_1d((p), ST_DTYPE_F32, (int64_t)(n))
#define F2(p, r, k) st_tensor_2d((p), ST_DTYPE_F32, (int64_t)(r), (int64_t)(k))
#define I2(p, r, k) st_tensor_2d((p), ST_DTYPE_I32, (int64_t)(r), (int64_t)(k))
#define U1(p, n) st_tensor_1d((p), ST_DTYPE_U8, (int64_t)(n))

void st_compute_zero(struct st_compute *c, void *p, size_t bytes)
{
	struct st_op op = { .kind = ST_OP_ZERO, .t = { U1(p, bytes) }, .i = { (int64_t)bytes } };

	st_compute_run(c, &op);
}

void st_compute_copy(struct st_compute *c, void *dst, const void *src, size_t bytes)
{
	struct st_op op = { .kind = ST_OP_COPY,
			    .t = { U1(dst, bytes), U1(src, bytes) },
			    .i = { (int64_t)bytes } };

	st_compute_run(c, &op);
}

void st_compute_bf16_to_f32(struct st_compute *c, float *out, const uint16_t *in, size_t n)
{
	struct st_op op = { .kind = ST_OP_BF16_TO_F32,
			    .t = { F1(out, n), st_tensor_1d(in, ST_DTYPE_BF16, (int64_t)n) },
			    .i = { (int64_t)n } };

	st_compute_run(c, &op);
}

void st_compute_matmul_fwd(struct st_compute *c, float *out, const float *inp,
			   const float *weight, const float *bias, int N, int IC, int OC)
{
	struct st_op op = { .kind = ST_OP_MATMUL_FWD,
			    .t = { F2(out, N, OC), F2(inp, N, IC), F2(weight, IC, OC),
				   F1(bias, OC) },
			    .i = { N, IC, OC } };

	st_compute_run(c, &op);
}

void st_compute_matmul_fwd_bf16(struct st_compute *c, float *out, const uint16_t *inp,
				const uint16_t *weight, const float *bias, int N, int IC,
				int OC)
{
	struct st_op op = { .kind = ST_OP_MATMUL_FWD,
			    .t = { F2(out, N, OC), st_tensor_2d(inp, ST_DTYPE_BF16, N, IC),
				   st_tensor_2d(weight, ST_DTYPE_BF16, IC, OC), F1(bias, OC) },
			    .i = { N, IC, OC } };

	st_compute_run(c, &op);
}

void st_compute_matmul_gelu_fwd(struct st_compute *c, float *out, float *pre,
				const float *inp, const float *weight, const float *bias, int N,
				int IC, int OC)
{
	static const enum st_dtype f32[ST_OP_MAX_TENSORS] = { 0 }; /* ST_DTYPE_F32 is 0 */
	float *mid = pre ? pre : out;

	if (st_compute_supports(c, ST_OP_MATMUL_GELU_FWD, f32)) {
		struct st_op op = { .kind = ST_OP_MATMUL_GELU_FWD,
				    .t = { F2(out, N, OC), F2(pre, N, OC), F2(inp, N, IC),
					   F2(weight, IC, OC), F1(bias, OC) },
				    .i = { N, IC, OC } };

		st_compute_run(c, &op);
		return;
	}
	st_compute_matmul_fwd(c, mid, inp, weight, bias, N, IC, OC);
	st_compute_gelu_fwd(c, out, mid, (size_t)N * OC);
}

void st_compute_gelu_fwd(struct st_compute *c, float *out, const float *inp, size_t n)
{
	struct st_op op = { .kind = ST_OP_GELU_FWD,
			    .t = { F1(out, n), F1(inp, n) },
			    .i = { (int64_t)n } };

	st_compute_run(c, &op);
}

void st_compute_residual_fwd(struct st_compute *c, float *out, const float *a,
			     const float *b, size_t n)
{
	struct st_op op = { .kind = ST_OP_RESIDUAL_FWD,
			    .t = { F1(out, n), F1(a, n), F1(b, n) },
			    .i = { (int64_t)n } };

	st_compute_run(c, &op);
}

void st_compute_embedding_bwd(struct st_compute *c, float *dwte, float *dwpe,
			      const float *dout, const int32_t *tokens, int B, int T, int C)
{
	struct st_op op = { .kind = ST_OP_EMBEDDING_BWD,
			    .t = { F2(dwte, -1, C), F2(dwpe, T, C),
				   st_tensor_3d(dout, ST_DTYPE_F32, B, T, C), I2(tokens, B, T) },
			    .i = { B, T, C } };

	st_compute_run(c, &op);
}

void st_compute_crossentropy_fwd(struct st_compute *c, float *losses, const float *logits,
				 const int32_t *targets, int N, int V)
{
	struct st_op op = { .kind = ST_OP_CROSSENTROPY_FWD,
			    .t = { F1(losses, N), F2(logits, N, V),
				   st_tensor_1d(targets, ST_DTYPE_I32, N) },
			    .i = { N, V } };

	st_compute_run(c, &op);
}

void st_compute_crossentropy_bwd(struct st_compute *c, float *dlogits, float *losses,
				 const float *logits, const int32_t *targets, float dloss,
				 int N, int V)
{
	struct st_op op = { .kind = ST_OP_CROSSENTROPY_BWD,
			    .t = { F2(dlogits, N, V), F1(losses, N), F2(logits, N, V),
				   st_tensor_1d(targets, ST_DTYPE_I32, N) },
			    .i = { N, V },
			    .f = { dloss } };

	st_compute_run(c, &op);
}

/* ---- LLaMA's ops ------------------------------------------------------------------ */

void st_compute_token_embed_bwd(struct st_compute *c, float *dwte, const float *dout,
				const int32_t *tokens, int N, int C)
{
	struct st_op op = { .kind = ST_OP_TOKEN_EMBED_BWD,
			    .t = { F2(dwte, -1, C), F2(dout, N, C),
				   st_tensor_1d(tokens, ST_DTYPE_I32, N) },
			    .i = { N, C } };

	st_compute_run(c, &op);
}

/* ---- the optimizer on the device ----------------------------------------- */

void st_compute_adamw(struct st_compute *c, const struct st_adam_step *s, const float *g,
		      float *p, float *m, float *v, void *w, bool w_bf16, uint32_t *bad,
		      size_t n)
{
	struct st_op op = { .kind = ST_OP_ADAMW,
			    .t = { F1(g, n), F1(p, n), F1(m, n), F1(v, n),
				   st_tensor_1d(w, w_bf16 ? ST_DTYPE_BF16 : ST_DTYPE_F32,
						(int64_t)n),
				   st_tensor_1d(bad, ST_DTYPE_U8, 4) },
			    .i = { (int64_t)n },
			    .f = { s->grad_scale, s->beta1, s->one_minus_beta1, s->beta2,
				   s->one_minus_beta2, s->rsqrt_bc2, s->eps, s->neg_step_size,
				   s->decay } };

	st_compute_run(c, &op);
}

size_t st_compute_sumsq_scratch_bytes(size_t n)
{
	/* a (double, u32 absmax, u32) per chunk of ST_GSTAT_CHUNK_ELEMS */
	return 16 * ((n + 16383) / 16384);
}

void st_compute_grad_sumsq(struct st_compute *c, struct st_compute_sumsq *out, void *scratch,
			   const float *g, size_t n)
{
	struct st_op op = { .kind = ST_OP_GRAD_SUMSQ,
			    .t = { st_tensor_1d(out, ST_DTYPE_U8, sizeof(*out)),
				   st_tensor_1d(scratch, ST_DTYPE_U8,
						(int64_t)st_compute_sumsq_scratch_bytes(n)),
				   F1(g, n) },
			    .i = { (int64_t)n } };

	st_compute_run(c, &op);
}

/* ---- residual + norm ------------------------------------------------------ */

/* ---- the bf16 compute path ------------------------------------------------ */

void st_compute_f32_to_bf16(struct st_compute *c, uint16_t *out, const float *in, size_t n)
{
	struct st_op op = { .kind = ST_OP_F32_TO_BF16,
			    .t = { st_tensor_1d(out, ST_DTYPE_BF16, (int64_t)n), F1(in, n) },
			    .i = { (int64_t)n } };

	st_compute_run(c, &op);
}
