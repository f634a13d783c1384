/* strata: the bf16 paths' head (bf16_head.h), one function for every
 * family: the final norm is the only thing that differs, LayerNorm (GPT-2)
 * or RMSNorm (LLaMA). bf16: the normalised input and the logits' gradient
 * fed to the matmuls; fp32: x, the norm's statistics, the logits, the
 * loss, dx and every dW. */
#include "bf16_head.h"

void st_bf16_gemm(struct st_compute *c, int ta, int tb, int M, int N, int K, const bf16 *A,
		  int lda, const bf16 *Bm, int ldb, float beta, float *C, int ldc)
{
	struct st_op op = st_op_gemm_bf16(ta, tb, M, N, K, A, lda, Bm, ldb, beta, C, ldc);

	st_compute_run(c, &op);
}

void st_bf16_layernorm_fwd(struct st_compute *c, bf16 *out, float *mean, float *rstd,
			   const float *inp, const bf16 *w, const bf16 *b, int N, int C)
{
	size_t NC = (size_t)N * C;
	struct st_op op = { .kind = ST_OP_LAYERNORM_FWD,
			    .t = { TB(out, NC), TF(mean, N), TF(rstd, N), TF(inp, NC), TB(w, C),
				   TB(b, C) },
			    .i = { N, C } };

	st_compute_run(c, &op);
}

void st_bf16_layernorm_bwd(struct st_compute *c, float *dinp, float *dw, float *db,
			   const void *dout, bool dout_f32, const float *inp, const bf16 *w,
			   const float *mean, const float *rstd, int N, int C)
{
	size_t NC = (size_t)N * C;
	struct st_op op = { .kind = ST_OP_LAYERNORM_BWD,
			    .t = { TF(dinp, NC), TF(dw, C), TF(db, C),
				   dout_f32 ? TF(dout, NC) : TB(dout, NC), TF(inp, NC), TB(w, C),
				   TF(mean, N), TF(rstd, N) },
			    .i = { N, C } };

	st_compute_run(c, &op);
}

void st_bf16_rmsnorm_fwd(struct st_compute *c, bf16 *out, float *rstd, const float *inp,
			 const bf16 *w, float eps, int N, int C)
{
	size_t NC = (size_t)N * C;
	struct st_op op = { .kind = ST_OP_RMSNORM_FWD,
			    .t = { TB(out, NC), TF(rstd, N), TF(inp, NC), TB(w, C) },
			    .i = { N, C }, .f = { eps } };

	st_compute_run(c, &op);
}

void st_bf16_rmsnorm_bwd(struct st_compute *c, float *dinp, float *dw, const void *dout,
			 bool dout_f32, const float *inp, const bf16 *w, const float *rstd, int N,
			 int C)
{
	size_t NC = (size_t)N * C;
	struct st_op op = { .kind = ST_OP_RMSNORM_BWD,
			    .t = { TF(dinp, NC), TF(dw, C), dout_f32 ? TF(dout, NC) : TB(dout, NC),
				   TF(inp, NC), TB(w, C), TF(rstd, N) },
			    .i = { N, C } };

	st_compute_run(c, &op);
}

void st_bf16_mm_fwd(struct st_compute *c, enum st_op_kind kind, void *out, bool out_f32,
		    const bf16 *inp, const bf16 *w, const bf16 *bias, int N, int IC, int OC)
{
	size_t NO = (size_t)N * OC;
	struct st_op op = { .kind = kind,
			    .t = { out_f32 ? TF(out, NO) : TB(out, NO), TB(inp, (size_t)N * IC),
				   TB(w, (size_t)IC * OC), TB(bias, OC) },
			    .i = { N, IC, OC } };

	st_compute_run(c, &op);
}

void st_bf16_mm_bwd(struct st_compute *c, enum st_op_kind kind, bf16 *dinp, float *dw,
		    float *db, const bf16 *dout, const bf16 *inp, const bf16 *w, int N, int IC,
		    int OC)
{
	struct st_op op = { .kind = kind,
			    .t = { TB(dinp, (size_t)N * IC), TF(dw, (size_t)IC * OC), TF(db, OC),
				   TB(dout, (size_t)N * OC), TB(inp, (size_t)N * IC),
				   TB(w, (size_t)IC * OC) },
			    .i = { N, IC, OC } };

	st_compute_run(c, &op);
}

struct hwork {
	bf16 *xn, *dlog16;
	float *mean, *rstd, *dxn, *logits, *losses;
};

static void head_carve(struct st_carver *cv, struct hwork *w, size_t N, size_t C, size_t V)
{
	size_t R = ST_MIN(N, (size_t)ST_MODEL_CE_CHUNK_ROWS);

	w->xn = st_carve_bf16(cv, N * C);
	w->mean = st_carve(cv, N);
	w->rstd = st_carve(cv, N);
	w->dxn = st_carve(cv, N * C);
	w->logits = st_carve(cv, R * V);
	w->dlog16 = st_carve_bf16(cv, R * V);
	w->losses = st_carve(cv, N);
}

size_t st_bf16_head_work_bytes(size_t N, size_t C, size_t V)
{
	struct st_carver cv;
	struct hwork w;

	st_carver_init(&cv, NULL, 0);
	head_carve(&cv, &w, N, C, V);
	return cv.need_bytes;
}

/* xn (N,C) bf16 = norm(x (N,C) fp32) */
static void norm_fwd(struct st_compute *c, const struct st_bf16_head *h, const struct hwork *w,
		     const float *x, int N, int C)
{
	if (h->norm_b)
		st_bf16_layernorm_fwd(c, w->xn, w->mean, w->rstd, x, h->norm_w, h->norm_b, N, C);
	else
		st_bf16_rmsnorm_fwd(c, w->xn, w->rstd, x, h->norm_w, h->eps, N, C);
}

/* dx (N,C) fp32 += the norm's backward of dxn (fp32) */
static void norm_bwd(struct st_compute *c, const struct st_bf16_head *h, const struct hwork *w,
		     const float *x, float *dx, int N, int C)
{
	if (h->norm_b)
		st_bf16_layernorm_bwd(c, dx, h->dnorm_w, h->dnorm_b, w->dxn, true, x, h->norm_w,
				      w->mean, w->rstd, N, C);
	else
		st_bf16_rmsnorm_bwd(c, dx, h->dnorm_w, w->dxn, true, x, h->norm_w, w->rstd, N, C);
}

/* The head's matmul and cross-entropy as one HEAD_CROSSENTROPY op where
 * the compute has it (the cpu: the chunk loop below, bit for bit; cuda:
 * fused, the logits never written); false: the caller runs the chunks. */
static bool head_ce_fused(struct st_compute *c, const struct st_bf16_head *h,
			  const struct hwork *w, const int32_t *targets, float dloss, bool bwd,
			  int N, int C, int V)
{
	const int R = ST_MIN(N, ST_MODEL_CE_CHUNK_ROWS);
	const size_t NC = (size_t)N * C, VC = (size_t)V * C, RV = (size_t)R * V;
	struct st_op op = { .kind = ST_OP_HEAD_CROSSENTROPY,
			    .t = { TF(w->losses, N), TF(bwd ? w->dxn : NULL, NC),
				   TF(bwd ? h->dW : NULL, VC), TB(w->xn, NC), TB(h->W, VC),
				   st_tensor_1d(targets, ST_DTYPE_I32, N), TF(w->logits, RV),
				   TB(w->dlog16, RV) },
			    .i = { N, C, V, R },
			    .f = { dloss } };

	/* the cuda op keeps lse and its partials in the logits scratch */
	if (RV < 4 * (size_t)N || !st_compute_supports_op(c, &op))
		return false;
	st_compute_run(c, &op);
	return true;
}

void st_bf16_head_run(const struct st_model *m, const struct st_model_batch *b,
		      const struct st_bf16_head *h, const float *x, float *dx, float *loss,
		      void *work, size_t work_bytes)
{
	struct st_compute *c = st_model_compute(m);
	const int C = st_model_config(m)->dim, V = st_model_config(m)->vocab, N = b->B * b->T;
	const bool bwd = dx != NULL;
	struct st_carver cv;
	struct hwork w;

	st_carver_init(&cv, work, work_bytes);
	head_carve(&cv, &w, (size_t)N, (size_t)C, (size_t)V);
	norm_fwd(c, h, &w, x, N, C);
	if (bwd)
		st_compute_zero(c, w.dxn, sizeof(float) * (size_t)N * C);
	const float dloss = b->loss_scale / (float)N;
	/* the chunks, unless the fused op did the whole head */
	const bool fused = head_ce_fused(c, h, &w, b->targets, dloss, bwd, N, C, V);
	for (int r0 = fused ? N : 0; r0 < N; r0 += ST_MODEL_CE_CHUNK_ROWS) {
		int nr = ST_MIN(ST_MODEL_CE_CHUNK_ROWS, N - r0);
		const bf16 *xr = w.xn + (size_t)r0 * C;
		// logits (nr,V) fp32 = xn_r (nr,C) @ W^T (C,V)
		st_bf16_gemm(c, 0, 1, nr, V, C, xr, C, h->W, C, 0.0f, w.logits, V);
		if (!bwd) {
			st_compute_crossentropy_fwd(c, w.losses + r0, w.logits, b->targets + r0,
						    nr, V);
			continue;
		}
		st_compute_crossentropy_bwd(c, w.logits, w.losses + r0, w.logits, b->targets + r0,
					    dloss, nr, V);
		st_compute_f32_to_bf16(c, w.dlog16, w.logits, (size_t)nr * V);
		// dxn_r (nr,C) += dlogits (nr,V) @ W (V,C)
		st_bf16_gemm(c, 0, 0, nr, C, V, w.dlog16, V, h->W, C, 1.0f,
			     w.dxn + (size_t)r0 * C, C);
		// dW (V,C) += dlogits^T (V,nr) @ xn_r (nr,C)
		st_bf16_gemm(c, 1, 0, V, C, nr, w.dlog16, V, xr, C, 1.0f, h->dW, C);
	}
	if (loss)
		*loss = st_family_mean_loss(c, w.losses, (size_t)N);
	if (bwd) {
		st_compute_zero(c, dx, sizeof(float) * (size_t)N * C);
		norm_bwd(c, h, &w, x, dx, N, C);
	}
}

int st_bf16_head_logits(const struct st_model *m, const struct st_bf16_head *h,
			const float *x, float *logits, void *work, size_t work_bytes)
{
	struct st_compute *c = st_model_compute(m);
	const int C = st_model_config(m)->dim, V = st_model_config(m)->vocab;
	struct st_carver cv;
	struct hwork w;

	st_carver_init(&cv, work, work_bytes);
	head_carve(&cv, &w, 1, (size_t)C, (size_t)V);
	norm_fwd(c, h, &w, x, 1, C);
	st_bf16_gemm(c, 0, 1, 1, V, C, w.xn, C, h->W, C, 0.0f, logits, V);
	return st_compute_sync(c);
}
