/* strata: the typed op records every family's body builds (body.h): one
 * builder per op, its "dt" tensors in the model's compute dtype, so that
 * one body serves fp32 and bf16. At fp32 each is the all-fp32 record the
 * cpu kernels' reference runs; the fused ops fall back to their two
 * records where the compute lacks them. */
#include "body.h"

#define TD(o, p, n) st_tensor_1d((p), (o)->dt, (int64_t)(n))
#define TF(p, n) st_tensor_1d((p), ST_DTYPE_F32, (int64_t)(n))
#define TT(p, dt, n) st_tensor_1d((p), (dt), (int64_t)(n))

static void run(const struct st_mop *o, const struct st_op *op)
{
	st_compute_run(o->c, op);
}

const void *st_mop_cast(const struct st_mop *o, void *dst, const float *src, size_t n)
{
	if (o->dt == ST_DTYPE_F32)
		return src;
	struct st_op op = { .kind = ST_OP_F32_TO_BF16, .t = { TD(o, dst, n), TF(src, n) },
			    .i = { (int64_t)n } };

	run(o, &op);
	return dst;
}

void st_mop_layernorm_fwd(const struct st_mop *o, void *out, float *mean, float *rstd,
			  const float *inp, const void *w, const void *b, int N, int C)
{
	size_t NC = (size_t)N * C;
	struct st_op op = { .kind = ST_OP_LAYERNORM_FWD,
			    .t = { TD(o, out, NC), TF(mean, N), TF(rstd, N), TF(inp, NC),
				   TD(o, w, C), TD(o, b, C) },
			    .i = { N, C } };

	run(o, &op);
}

void st_mop_layernorm_bwd(const struct st_mop *o, float *dinp, float *dw, float *db,
			  const void *dout, enum st_dtype dout_dt, const float *inp,
			  const void *w, const float *mean, const float *rstd, int N, int C)
{
	size_t NC = (size_t)N * C;
	struct st_op op = { .kind = ST_OP_LAYERNORM_BWD,
			    .t = { TF(dinp, NC), TF(dw, C), TF(db, C), TT(dout, dout_dt, NC),
				   TF(inp, NC), TD(o, w, C), TF(mean, N), TF(rstd, N) },
			    .i = { N, C } };

	run(o, &op);
}

void st_mop_residual_layernorm_fwd(const struct st_mop *o, float *res, void *out, float *mean,
				   float *rstd, const float *a, const float *b, const void *w,
				   const void *bias, int N, int C)
{
	size_t NC = (size_t)N * C;
	struct st_op op = { .kind = ST_OP_RESIDUAL_LAYERNORM_FWD,
			    .t = { TF(res, NC), TD(o, out, NC), TF(mean, N), TF(rstd, N),
				   TF(a, NC), TF(b, NC), TD(o, w, C), TD(o, bias, C) },
			    .i = { N, C } };

	if (st_compute_supports_op(o->c, &op)) {
		run(o, &op);
		return;
	}
	st_compute_residual_fwd(o->c, res, a, b, NC);
	st_mop_layernorm_fwd(o, out, mean, rstd, res, w, bias, N, C);
}

void st_mop_rmsnorm_fwd(const struct st_mop *o, void *out, float *rstd, const float *inp,
			const void *w, float eps, int N, int C)
{
	size_t NC = (size_t)N * C;
	struct st_op op = { .kind = ST_OP_RMSNORM_FWD,
			    .t = { TD(o, out, NC), TF(rstd, N), TF(inp, NC), TD(o, w, C) },
			    .i = { N, C },
			    .f = { eps } };

	run(o, &op);
}

void st_mop_rmsnorm_bwd(const struct st_mop *o, float *dinp, float *dw, const void *dout,
			enum st_dtype dout_dt, const float *inp, const void *w,
			const float *rstd, int N, int C)
{
	size_t NC = (size_t)N * C;
	struct st_op op = { .kind = ST_OP_RMSNORM_BWD,
			    .t = { TF(dinp, NC), TF(dw, C), TT(dout, dout_dt, NC), TF(inp, NC),
				   TD(o, w, C), TF(rstd, N) },
			    .i = { N, C } };

	run(o, &op);
}

void st_mop_residual_rmsnorm_fwd(const struct st_mop *o, float *res, void *out, float *rstd,
				 const float *a, const float *b, const void *w, float eps, int N,
				 int C)
{
	size_t NC = (size_t)N * C;
	struct st_op op = { .kind = ST_OP_RESIDUAL_RMSNORM_FWD,
			    .t = { TF(res, NC), TD(o, out, NC), TF(rstd, N), TF(a, NC), TF(b, NC),
				   TD(o, w, C) },
			    .i = { N, C },
			    .f = { eps } };

	if (st_compute_supports_op(o->c, &op)) {
		run(o, &op);
		return;
	}
	st_compute_residual_fwd(o->c, res, a, b, NC);
	st_mop_rmsnorm_fwd(o, out, rstd, res, w, eps, N, C);
}

void st_mop_mm_fwd(const struct st_mop *o, enum st_op_kind kind, void *out,
		   enum st_dtype out_dt, const void *inp, const void *w, const void *bias, int N,
		   int IC, int OC)
{
	size_t NO = (size_t)N * OC;
	struct st_op op = { .kind = kind,
			    .t = { TT(out, out_dt, NO), TD(o, inp, (size_t)N * IC),
				   TD(o, w, (size_t)IC * OC), TD(o, bias, OC) },
			    .i = { N, IC, OC } };

	run(o, &op);
}

void st_mop_mm_bwd(const struct st_mop *o, enum st_op_kind kind, void *dinp, float *dw,
		   float *db, const void *dout, const void *inp, const void *w, int N, int IC,
		   int OC)
{
	struct st_op op = { .kind = kind,
			    .t = { TD(o, dinp, (size_t)N * IC), TF(dw, (size_t)IC * OC), TF(db, OC),
				   TD(o, dout, (size_t)N * OC), TD(o, inp, (size_t)N * IC),
				   TD(o, w, (size_t)IC * OC) },
			    .i = { N, IC, OC } };

	run(o, &op);
}

void st_mop_mm_gelu_fwd(const struct st_mop *o, void *gel, void *pre, const void *inp,
			const void *w, const void *bias, int N, int IC, int OC)
{
	size_t NO = (size_t)N * OC;
	struct st_op op = { .kind = ST_OP_MATMUL_GELU_FWD,
			    .t = { TD(o, gel, NO), TD(o, pre, NO), TD(o, inp, (size_t)N * IC),
				   TD(o, w, (size_t)IC * OC), TD(o, bias, OC) },
			    .i = { N, IC, OC } };

	if (st_compute_supports_op(o->c, &op)) {
		run(o, &op);
		return;
	}
	st_mop_mm_fwd(o, ST_OP_MATMUL_FWD, pre, o->dt, inp, w, bias, N, IC, OC);
	struct st_op g = { .kind = ST_OP_GELU_FWD, .t = { TD(o, gel, NO), TD(o, pre, NO) },
			   .i = { (int64_t)NO } };
	run(o, &g);
}

void st_mop_gelu_bwd(const struct st_mop *o, void *dinp, const void *inp, const void *dout,
		     size_t n)
{
	struct st_op op = { .kind = ST_OP_GELU_BWD,
			    .t = { TD(o, dinp, n), TD(o, inp, n), TD(o, dout, n) },
			    .i = { (int64_t)n } };

	run(o, &op);
}

void st_mop_attention_fwd(const struct st_mop *o, void *out, float *lse, const void *qkv,
			  const int32_t *seg, int B, int T, int C, int NH)
{
	struct st_op op = { .kind = ST_OP_ATTENTION_FWD,
			    .t = { st_tensor_3d(out, o->dt, B, T, C),
				   st_tensor_3d(lse, ST_DTYPE_F32, B, NH, T),
				   st_tensor_3d(qkv, o->dt, B, T, 3 * (int64_t)C),
				   st_tensor_2d(seg, ST_DTYPE_I32, B, T) },
			    .i = { B, T, C, NH } };

	run(o, &op);
}

void st_mop_attention_bwd(const struct st_mop *o, void *dqkv, const void *dout,
			  const void *qkv, const void *out, const float *lse, const int32_t *seg,
			  int B, int T, int C, int NH)
{
	struct st_op op = { .kind = ST_OP_ATTENTION_BWD,
			    .t = { st_tensor_3d(dqkv, o->dt, B, T, 3 * (int64_t)C),
				   st_tensor_3d(dout, o->dt, B, T, C),
				   st_tensor_3d(qkv, o->dt, B, T, 3 * (int64_t)C),
				   st_tensor_3d(out, o->dt, B, T, C),
				   st_tensor_3d(lse, ST_DTYPE_F32, B, NH, T),
				   st_tensor_2d(seg, ST_DTYPE_I32, B, T) },
			    .i = { B, T, C, NH } };

	run(o, &op);
}

void st_mop_gqa_fwd(const struct st_mop *o, void *out, float *lse, const void *q,
		    const void *k, const void *v, const int32_t *seg, int B, int T, int NH, int NKV,
		    int hd)
{
	size_t NQ = (size_t)B * T * NH * hd, NK = (size_t)B * T * NKV * hd;
	struct st_op op = { .kind = ST_OP_GQA_ATTENTION_FWD,
			    .t = { TD(o, out, NQ), TF(lse, (size_t)B * NH * T), TD(o, q, NQ),
				   TD(o, k, NK), TD(o, v, NK), st_tensor_2d(seg, ST_DTYPE_I32, B, T) },
			    .i = { B, T, NH, NKV, hd } };

	run(o, &op);
}

void st_mop_gqa_bwd(const struct st_mop *o, void *dq, void *dk, void *dv, const void *dout,
		    const void *q, const void *k, const void *v, const void *out,
		    const float *lse, const int32_t *seg, int B, int T, int NH, int NKV, int hd)
{
	size_t NQ = (size_t)B * T * NH * hd, NK = (size_t)B * T * NKV * hd;
	struct st_op op = { .kind = ST_OP_GQA_ATTENTION_BWD,
			    .t = { TD(o, dq, NQ), TD(o, dk, NK), TD(o, dv, NK), TD(o, dout, NQ),
				   TD(o, q, NQ), TD(o, k, NK), TD(o, v, NK), TD(o, out, NQ),
				   TF(lse, (size_t)B * NH * T), st_tensor_2d(seg, ST_DTYPE_I32, B, T) },
			    .i = { B, T, NH, NKV, hd } };

	run(o, &op);
}

void st_mop_rope(const struct st_mop *o, bool bwd, void *x, int B, int T, int NH, int hd,
		 int stride, const struct st_rope_args *r)
{
	size_t n = (size_t)B * T * stride;
	struct st_op op = { .kind = bwd ? ST_OP_ROPE_BWD : ST_OP_ROPE_FWD,
			    .t = { TD(o, x, n), TD(o, x, n) },
			    .i = { B, T, NH, hd, stride, r->type, r->original_ctx },
			    .f = { r->theta, r->factor, r->low_freq_factor, r->high_freq_factor } };

	run(o, &op);
}

void st_mop_rope_at(const struct st_mop *o, float *x, int n, int pos, int NH, int hd,
		    int stride, const struct st_rope_args *r)
{
	size_t len = (size_t)n * stride;
	struct st_op op = { .kind = ST_OP_ROPE_FWD,
			    .t = { TF(x, len), TF(x, len) },
			    .i = { 1, n, NH, hd, stride, r->type, r->original_ctx, pos },
			    .f = { r->theta, r->factor, r->low_freq_factor, r->high_freq_factor } };

	run(o, &op);
}

void st_mop_decode_attention(const struct st_mop *o, float *out, const float *q, int sq,
			     const float *kc, const float *vc, int pos, int n, int NH, int NKV,
			     int hd)
{
	size_t rows = (size_t)pos + (size_t)n, kv = (size_t)NKV * hd;
	struct st_op op = { .kind = ST_OP_DECODE_ATTENTION,
			    .t = { TF(out, (size_t)n * NH * hd), TF(q, (size_t)n * sq),
				   TF(kc, rows * kv), TF(vc, rows * kv) },
			    .i = { n, pos, NH, NKV, hd, sq } };

	run(o, &op);
}

void st_mop_swiglu_fwd(const struct st_mop *o, void *out, const void *gate, const void *up,
		       size_t n)
{
	struct st_op op = { .kind = ST_OP_SWIGLU_FWD,
			    .t = { TD(o, out, n), TD(o, gate, n), TD(o, up, n) },
			    .i = { (int64_t)n } };

	run(o, &op);
}

void st_mop_swiglu_bwd(const struct st_mop *o, void *dgate, void *dup, const void *dout,
		       const void *gate, const void *up, size_t n)
{
	struct st_op op = { .kind = ST_OP_SWIGLU_BWD,
			    .t = { TD(o, dgate, n), TD(o, dup, n), TD(o, dout, n), TD(o, gate, n),
				   TD(o, up, n) },
			    .i = { (int64_t)n } };

	run(o, &op);
}

void st_mop_gemm(const struct st_mop *o, int ta, int tb, int M, int N, int K, const void *A,
		 int lda, const void *Bm, int ldb, float beta, float *C, int ldc)
{
	/* A is stored (M,K) or, transposed, (K,M); B (K,N) or (N,K) */
	struct st_op op = {
		.kind = ST_OP_GEMM,
		.t = { st_tensor_2d(A, o->dt, ta ? K : M, lda), st_tensor_2d(Bm, o->dt, tb ? N : K, ldb),
		       st_tensor_2d(C, ST_DTYPE_F32, M, ldc) },
		.i = { ta, tb, M, N, K, lda, ldb, ldc },
		.f = { beta },
	};

	run(o, &op);
}
