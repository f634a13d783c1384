/* strata: the head of every family and both compute dtypes (body.h): the
 * final norm, LayerNorm (GPT-2) or RMSNorm (LLaMA), tied or untied W; in
 * the compute dtype the normalised input and the logits' gradient fed to
 * the matmuls; fp32: x, the norm's statistics, the logits, the loss, dx
 * and every dW. */
#include "body.h"

struct hwork {
	void *xn, *dlog; /* dlog: the logits' gradient cast (NULL at fp32) */
	float *mean, *rstd, *dxn, *logits, *losses;
};

/* mean is LayerNorm's; the bf16 head has always carved it for RMSNorm
 * too, and the planner sizes pools by these bytes */
static void head_carve(struct st_carver *cv, struct hwork *w, enum st_dtype dt, bool layernorm,
		       size_t N, size_t C, size_t V)
{
	size_t R = ST_MIN(N, (size_t)ST_MODEL_CE_CHUNK_ROWS);

	w->xn = st_carve_dt(cv, N * C, dt);
	w->mean = layernorm || dt != ST_DTYPE_F32 ? st_carve(cv, N) : NULL;
	w->rstd = st_carve(cv, N);
	w->dxn = st_carve(cv, N * C);
	w->logits = st_carve(cv, R * V);
	w->dlog = st_carve_cast(cv, R * V, dt);
	w->losses = st_carve(cv, N);
}

size_t st_head_work_bytes(const struct st_model *m, bool layernorm, size_t N)
{
	const struct st_mop o = st_mop_of(m);
	struct st_carver cv;
	struct hwork w;

	st_carver_init(&cv, NULL, 0);
	head_carve(&cv, &w, o.dt, layernorm, N, (size_t)st_model_config(m)->dim,
		   (size_t)st_model_config(m)->vocab);
	return cv.need_bytes;
}

/* xn (N,C) dt = norm(x (N,C) fp32) */
static void norm_fwd(const struct st_mop *o, const struct st_head *h, const struct hwork *w,
		     const float *x, int N, int C)
{
	if (h->norm_b)
		st_mop_layernorm_fwd(o, w->xn, w->mean, w->rstd, x, h->norm_w, h->norm_b, N, C);
	else
		st_mop_rmsnorm_fwd(o, w->xn, w->rstd, x, h->norm_w, h->eps, N, C);
}

/* dx (N,C) fp32 += the norm's backward of dxn (fp32) */
static void norm_bwd(const struct st_mop *o, const struct st_head *h, const struct hwork *w,
		     const float *x, float *dx, int N, int C)
{
	if (h->norm_b)
		st_mop_layernorm_bwd(o, dx, h->dnorm_w, h->dnorm_b, w->dxn, ST_DTYPE_F32, x,
				     h->norm_w, w->mean, w->rstd, N, C);
	else
		st_mop_rmsnorm_bwd(o, dx, h->dnorm_w, w->dxn, ST_DTYPE_F32, x, h->norm_w, w->rstd,
				   N, C);
}

/* The head's matmul and cross-entropy as one HEAD_CROSSENTROPY op where
 * the compute has it (the cpu: the chunk loop below, bit for bit; cuda:
 * fused, the logits never written); false: the caller runs the chunks.
 * The op rounds the logits' gradient to bf16: only the bf16 head has it. */
static bool head_ce_fused(const struct st_mop *o, const struct st_head *h,
			  const struct hwork *w, const int32_t *targets, float dloss, bool bwd,
			  int N, int C, int V)
{
	const int R = ST_MIN(N, ST_MODEL_CE_CHUNK_ROWS);
	const size_t NC = (size_t)N * C, VC = (size_t)V * C, RV = (size_t)R * V;
	struct st_op op = {
		.kind = ST_OP_HEAD_CROSSENTROPY,
		.t = { st_tensor_1d(w->losses, ST_DTYPE_F32, N),
		       st_tensor_1d(bwd ? w->dxn : NULL, ST_DTYPE_F32, (int64_t)NC),
		       st_tensor_1d(bwd ? h->dW : NULL, ST_DTYPE_F32, (int64_t)VC),
		       st_tensor_1d(w->xn, o->dt, (int64_t)NC), st_tensor_1d(h->W, o->dt, (int64_t)VC),
		       st_tensor_1d(targets, ST_DTYPE_I32, N),
		       st_tensor_1d(w->logits, ST_DTYPE_F32, (int64_t)RV),
		       st_tensor_1d(w->dlog, o->dt, (int64_t)RV) },
		.i = { N, C, V, R },
		.f = { dloss },
	};

	/* the cuda op keeps lse and its partials in the logits scratch */
	if (o->dt != ST_DTYPE_BF16 || RV < 4 * (size_t)N || !st_compute_supports_op(o->c, &op))
		return false;
	st_compute_run(o->c, &op);
	return true;
}

void st_head_run(const struct st_model *m, const struct st_model_batch *b,
		 const struct st_head *h, const float *x, float *dx, float *loss, void *work,
		 size_t work_bytes)
{
	const struct st_mop o = st_mop_of(m);
	struct st_compute *c = o.c;
	const int C = st_model_config(m)->dim, V = st_model_config(m)->vocab, N = b->B * b->T;
	const bool bwd = dx != NULL;
	struct st_carver cv;
	struct hwork w;

	st_carver_init(&cv, work, work_bytes);
	head_carve(&cv, &w, o.dt, h->norm_b != NULL, (size_t)N, (size_t)C, (size_t)V);
	if (b->losses) /* the caller's: read once per step, not here */
		w.losses = b->losses;
	norm_fwd(&o, h, &w, x, N, C);
	if (bwd)
		st_compute_zero(c, w.dxn, sizeof(float) * (size_t)N * C);
	/* a masked step divides by its count; the plain rule is unchanged */
	const float dloss = b->count ? b->loss_scale / (float)b->count
				     : b->loss_scale / (float)N;
	/* the chunks, unless the fused op did the whole head */
	const bool fused = head_ce_fused(&o, h, &w, b->targets, dloss, bwd, N, C, V);
	for (int r0 = fused ? N : 0; r0 < N; r0 += ST_MODEL_CE_CHUNK_ROWS) {
		int nr = ST_MIN(ST_MODEL_CE_CHUNK_ROWS, N - r0);
		const void *xr = (const char *)w.xn + st_mop_bytes(&o, (size_t)r0 * C);
		// logits (nr,V) fp32 = xn_r (nr,C) @ W^T (C,V)
		st_mop_gemm(&o, 0, 1, nr, V, C, xr, C, h->W, C, 0.0f, w.logits, V);
		if (!bwd) {
			st_compute_crossentropy_fwd(c, w.losses + r0, w.logits, b->targets + r0,
						    nr, V);
			continue;
		}
		st_compute_crossentropy_bwd(c, w.logits, w.losses + r0, w.logits, b->targets + r0,
					    dloss, nr, V);
		const void *dlog = st_mop_cast(&o, w.dlog, w.logits, (size_t)nr * V);
		// dxn_r (nr,C) += dlogits (nr,V) @ W (V,C)
		st_mop_gemm(&o, 0, 0, nr, C, V, dlog, V, h->W, C, 1.0f, w.dxn + (size_t)r0 * C,
			    C);
		// dW (V,C) += dlogits^T (V,nr) @ xn_r (nr,C)
		st_mop_gemm(&o, 1, 0, V, C, nr, dlog, V, xr, C, 1.0f, h->dW, C);
	}
	if (loss)
		*loss = b->count ? st_family_sum_loss(c, w.losses, (size_t)N, b->count)
				 : st_family_mean_loss(c, w.losses, (size_t)N);
	if (bwd) {
		st_compute_zero(c, dx, sizeof(float) * (size_t)N * C);
		norm_bwd(&o, h, &w, x, dx, N, C);
	}
}

int st_head_logits(const struct st_model *m, const struct st_head *h, const float *x,
		   float *logits, void *work, size_t work_bytes)
{
	const struct st_mop o = st_mop_of(m);
	const int C = st_model_config(m)->dim, V = st_model_config(m)->vocab;
	struct st_carver cv;
	struct hwork w;

	st_carver_init(&cv, work, work_bytes);
	head_carve(&cv, &w, o.dt, h->norm_b != NULL, 1, (size_t)C, (size_t)V);
	norm_fwd(&o, h, &w, x, 1, C);
	st_mop_gemm(&o, 0, 1, 1, V, C, w.xn, C, h->W, C, 0.0f, logits, V);
	return st_compute_sync(o.c);
}
