/* The cpu device's bf16 ops (kernels_bf16.h): widen the bf16
 * operands into fp32 scratch, run the op's fp32 kernel, round the bf16
 * outputs back. One adapter for every op, so the bf16 path's reference is
 * the fp32 path's kernels and nothing else. */
#include "kernels_bf16.h"

#include "compute_internal.h"
#include "strata/kernels.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define ST_BIT(k) (1u << (k))

/* The slots each op writes, from strata/op.h's list (outputs and what a
 * backward accumulates into). */
static const unsigned op_written[ST_OP_COUNT] = {
	[ST_OP_GEMM] = ST_BIT(2),
	[ST_OP_MATMUL_FWD] = ST_BIT(0),
	[ST_OP_MATMUL_GELU_FWD] = ST_BIT(0) | ST_BIT(1),
	[ST_OP_MATMUL_BWD] = ST_BIT(0) | ST_BIT(1) | ST_BIT(2),
	[ST_OP_LAYERNORM_FWD] = ST_BIT(0) | ST_BIT(1) | ST_BIT(2),
	[ST_OP_LAYERNORM_BWD] = ST_BIT(0) | ST_BIT(1) | ST_BIT(2),
	[ST_OP_GELU_FWD] = ST_BIT(0),
	[ST_OP_GELU_BWD] = ST_BIT(0),
	[ST_OP_RESIDUAL_FWD] = ST_BIT(0),
	[ST_OP_EMBEDDING_FWD] = ST_BIT(0),
	[ST_OP_EMBEDDING_BWD] = ST_BIT(0) | ST_BIT(1),
	[ST_OP_ATTENTION_FWD] = ST_BIT(0) | ST_BIT(1),
	[ST_OP_ATTENTION_BWD] = ST_BIT(0),
	[ST_OP_CROSSENTROPY_FWD] = ST_BIT(0),
	[ST_OP_CROSSENTROPY_BWD] = ST_BIT(0) | ST_BIT(1),
	[ST_OP_LINEAR_FWD] = ST_BIT(0),
	[ST_OP_LINEAR_BWD] = ST_BIT(0) | ST_BIT(1) | ST_BIT(2),
	[ST_OP_RMSNORM_FWD] = ST_BIT(0) | ST_BIT(1),
	[ST_OP_RMSNORM_BWD] = ST_BIT(0) | ST_BIT(1),
	[ST_OP_ROPE_FWD] = ST_BIT(0),
	[ST_OP_ROPE_BWD] = ST_BIT(0),
	[ST_OP_SWIGLU_FWD] = ST_BIT(0),
	[ST_OP_SWIGLU_BWD] = ST_BIT(0) | ST_BIT(1),
	[ST_OP_TOKEN_EMBED_FWD] = ST_BIT(0),
	[ST_OP_TOKEN_EMBED_BWD] = ST_BIT(0),
	[ST_OP_GQA_ATTENTION_FWD] = ST_BIT(0) | ST_BIT(1),
	[ST_OP_GQA_ATTENTION_BWD] = ST_BIT(0) | ST_BIT(1) | ST_BIT(2),
	[ST_OP_RESIDUAL_LAYERNORM_FWD] = ST_BIT(0) | ST_BIT(1) | ST_BIT(2) | ST_BIT(3),
	[ST_OP_RESIDUAL_RMSNORM_FWD] = ST_BIT(0) | ST_BIT(1) | ST_BIT(2),
};

unsigned st_cpu_op_written(enum st_op_kind kind)
{
	return (unsigned)kind < ST_OP_COUNT ? op_written[kind] : 0;
}

bool st_cpu_bf16_supports(enum st_op_kind kind, const enum st_dtype *dt)
{
	int n, nbf = 0;

	/* the ops with no entry are byte moves, conversions and the optimizer's */
	if ((unsigned)kind >= ST_OP_COUNT || !op_written[kind])
		return false;
	n = st_op_tensors(kind);
	for (int k = 0; k < n; k++) {
		enum st_dtype ref = st_op_ref_dtype(kind, k);

		if (dt[k] == ST_DTYPE_BF16 && ref == ST_DTYPE_F32)
			nbf++;
		else if (dt[k] != ref)
			return false;
	}
	return nbf > 0;
}

/* The scratch pool: one fp32 buffer per slot, grown to the largest op seen
 * and kept (reachable from here, so not a leak), under one lock. */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	float *p;
	size_t cap_elems;
} pool[ST_OP_MAX_TENSORS];

static float *pool_get(int k, size_t elems)
{
	if (pool[k].cap_elems < elems) {
		/* a few spare elements, so that a kernel's vector tail stays inside */
		float *p = realloc(pool[k].p, (elems + 16) * sizeof(float));

		if (!p) {
			/* the cpu kernels never fail: out of memory here is fatal */
			fprintf(stderr, "strata: bf16 scratch of %zu bytes: out of memory\n",
				elems * sizeof(float));
			abort();
		}
		pool[k].p = p;
		pool[k].cap_elems = elems;
	}
	return pool[k].p;
}

void st_cpu_op_run_bf16(const struct st_op *op)
{
	struct st_op w = *op;
	unsigned written = op_written[op->kind];
	int n = st_op_tensors(op->kind);

	pthread_mutex_lock(&pool_lock);
	for (int k = 0; k < n; k++) {
		const struct st_tensor *t = &op->t[k];

		if (t->dtype != ST_DTYPE_BF16)
			continue;
		w.t[k].dtype = ST_DTYPE_F32; /* a NULL (skipped) slot too */
		if (!t->data)
			continue;
		int64_t elems = st_tensor_elems(t);

		assert(elems >= 0); /* a whole shape: no -1 dimension */
		float *f = pool_get(k, (size_t)elems);

		/* an output the op overwrites need not be read, but widening it
		 * keeps the rule simple and the cost is the same order as the op */
		st_cpu_bf16_to_f32(f, t->data, (size_t)elems);
		w.t[k].data = f;
		w.t[k].dtype = ST_DTYPE_F32;
	}
	st_cpu_op_run(&w);
	for (int k = 0; k < n; k++) {
		const struct st_tensor *t = &op->t[k];

		if (t->dtype == ST_DTYPE_BF16 && t->data && (written & ST_BIT(k)))
			st_cpu_f32_to_bf16(t->data, w.t[k].data, (size_t)st_tensor_elems(t));
	}
	pthread_mutex_unlock(&pool_lock);
}

void st_cpu_attention_fwd_bf16(uint16_t *out, float *lse, const uint16_t *qkv, int B, int T,
			       int C, int NH)
{
	struct st_op op = { .kind = ST_OP_ATTENTION_FWD,
			    .t = { st_tensor_3d(out, ST_DTYPE_BF16, B, T, C),
				   st_tensor_3d(lse, ST_DTYPE_F32, B, NH, T),
				   st_tensor_3d(qkv, ST_DTYPE_BF16, B, T, 3 * (int64_t)C),
				   st_tensor_2d(NULL, ST_DTYPE_I32, B, T) },
			    .i = { B, T, C, NH } };

	st_cpu_op_run_bf16(&op);
}

void st_cpu_attention_bwd_bf16(uint16_t *dqkv, const uint16_t *dout, const uint16_t *qkv,
			       const uint16_t *out, const float *lse, int B, int T, int C,
			       int NH)
{
	struct st_op op = { .kind = ST_OP_ATTENTION_BWD,
			    .t = { st_tensor_3d(dqkv, ST_DTYPE_BF16, B, T, 3 * (int64_t)C),
				   st_tensor_3d(dout, ST_DTYPE_BF16, B, T, C),
				   st_tensor_3d(qkv, ST_DTYPE_BF16, B, T, 3 * (int64_t)C),
				   st_tensor_3d(out, ST_DTYPE_BF16, B, T, C),
				   st_tensor_3d(lse, ST_DTYPE_F32, B, NH, T),
				   st_tensor_2d(NULL, ST_DTYPE_I32, B, T) },
			    .i = { B, T, C, NH } };

	st_cpu_op_run_bf16(&op);
}
