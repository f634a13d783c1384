/* The op list's names and signatures (strata/op.h), from ST_OP_LIST. */
#include "strata/op.h"

#include <assert.h>
#include <errno.h>
#include <string.h>

#define ST_OP_NAME_(name, str, sig) [ST_OP_##name] = str,
static const char *const op_names[ST_OP_COUNT] = { ST_OP_LIST(ST_OP_NAME_) };
#undef ST_OP_NAME_

#define ST_OP_SIG_(name, str, sig) [ST_OP_##name] = sig,
static const char *const op_sigs[ST_OP_COUNT] = { ST_OP_LIST(ST_OP_SIG_) };
#undef ST_OP_SIG_

const char *st_op_name(enum st_op_kind kind)
{
	return (unsigned)kind < ST_OP_COUNT ? op_names[kind] : "?";
}

int st_op_tensors(enum st_op_kind kind)
{
	assert((unsigned)kind < ST_OP_COUNT);
	return (int)strlen(op_sigs[kind]);
}

enum st_dtype st_op_ref_dtype(enum st_op_kind kind, int slot)
{
	assert(slot >= 0 && slot < st_op_tensors(kind));
	switch (op_sigs[kind][slot]) {
	case 'b':
		return ST_DTYPE_BF16;
	case 'i':
		return ST_DTYPE_I32;
	case 'u':
		return ST_DTYPE_U8;
	default:
		return ST_DTYPE_F32;
	}
}

bool st_op_is_ref(enum st_op_kind kind, const enum st_dtype *dtypes)
{
	int n = st_op_tensors(kind);

	for (int k = 0; k < n; k++)
		if (dtypes[k] != st_op_ref_dtype(kind, k))
			return false;
	return true;
}

const char *st_precision_name(enum st_precision p)
{
	return p == ST_PRECISION_BF16 ? "bf16" : "fp32";
}

int st_precision_parse(const char *s, enum st_precision *out)
{
	if (strcmp(s, "fp32") == 0)
		*out = ST_PRECISION_FP32;
	else if (strcmp(s, "bf16") == 0)
		*out = ST_PRECISION_BF16;
	else
		return -EINVAL;
	return 0;
}

struct st_op st_op_gemm_bf16(int ta, int tb, int M, int N, int K, const uint16_t *A, int lda,
			     const uint16_t *B, int ldb, float beta, float *C, int ldc)
{
	return (struct st_op){
		.kind = ST_OP_GEMM,
		.t = { st_tensor_2d(A, ST_DTYPE_BF16, ta ? K : M, lda),
		       st_tensor_2d(B, ST_DTYPE_BF16, tb ? N : K, ldb),
		       st_tensor_2d(C, ST_DTYPE_F32, M, ldc) },
		.i = { ta, tb, M, N, K, lda, ldb, ldc },
		.f = { beta },
	};
}

/* One GEMM record of the unfolded head, handed to run */
static void head_gemm(void (*run)(void *, const struct st_op *), void *arg, int ta, int tb,
		      int M, int N, int K, const uint16_t *A, int lda, const uint16_t *B, int ldb,
		      float beta, float *C, int ldc)
{
	struct st_op g = st_op_gemm_bf16(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);

	run(arg, &g);
}

void st_op_head_ce_unfold(const struct st_op *op, void (*run)(void *arg, const struct st_op *rec),
			  void *arg)
{
	float *losses = op->t[0].data, *dx = op->t[1].data, *dw = op->t[2].data;
	const uint16_t *x = op->t[3].data, *w = op->t[4].data;
	const int32_t *targets = op->t[5].data;
	float *logits = op->t[6].data;
	uint16_t *dlog = op->t[7].data;
	const int N = (int)op->i[0], C = (int)op->i[1], V = (int)op->i[2], R = (int)op->i[3];

	assert(op->kind == ST_OP_HEAD_CROSSENTROPY && R > 0);
	for (int r0 = 0; r0 < N; r0 += R) {
		const int nr = N - r0 < R ? N - r0 : R;
		const uint16_t *xr = x + (size_t)r0 * C;
		const size_t nv = (size_t)nr * V;

		head_gemm(run, arg, 0, 1, nr, V, C, xr, C, w, C, 0.0f, logits, V);
		if (!dx) {
			struct st_op ce = { .kind = ST_OP_CROSSENTROPY_FWD,
					    .t = { st_tensor_1d(losses + r0, ST_DTYPE_F32, nr),
						   st_tensor_1d(logits, ST_DTYPE_F32, (int64_t)nv),
						   st_tensor_1d(targets + r0, ST_DTYPE_I32, nr) },
					    .i = { nr, V } };
			run(arg, &ce);
			continue;
		}
		struct st_op ce = { .kind = ST_OP_CROSSENTROPY_BWD,
				    .t = { st_tensor_1d(logits, ST_DTYPE_F32, (int64_t)nv),
					   st_tensor_1d(losses + r0, ST_DTYPE_F32, nr),
					   st_tensor_1d(logits, ST_DTYPE_F32, (int64_t)nv),
					   st_tensor_1d(targets + r0, ST_DTYPE_I32, nr) },
				    .i = { nr, V },
				    .f = { op->f[0] } };
		run(arg, &ce);
		struct st_op cast = { .kind = ST_OP_F32_TO_BF16,
				      .t = { st_tensor_1d(dlog, ST_DTYPE_BF16, (int64_t)nv),
					     st_tensor_1d(logits, ST_DTYPE_F32, (int64_t)nv) },
				      .i = { (int64_t)nv } };
		run(arg, &cast);
		/* dx_r (nr,C) += dlogits (nr,V) @ w (V,C); dw (V,C) += dlogits^T @ x_r */
		head_gemm(run, arg, 0, 0, nr, C, V, dlog, V, w, C, 1.0f, dx + (size_t)r0 * C, C);
		head_gemm(run, arg, 1, 0, V, C, nr, dlog, V, xr, C, 1.0f, dw, C);
	}
}
