/* strata: LLaMA's bf16 compute path (--compute-dtype bf16; docs/model.md,
 * "bf16 compute"). The same units, ops and order as llama.c's fp32 path,
 * with the rules of GPT-2's (gpt2_bf16.c):
 *   bf16  W as it is stored (never widened); every tensor a matmul, RoPE,
 *         the attention or SwiGLU reads or writes inside a layer: xn, q, k,
 *         v, att, hn, gate, up, act (the saved forward) and their
 *         gradients; the head's normalised input and its logits' gradient
 *   fp32  the residual stream between units and inside a layer (x, h, y and
 *         their gradients dx, dh, dy), the norms' rstd, the attention's
 *         lse, the logits, the loss, and every dW (accumulated into the
 *         unit's fp32 gradient)
 * RMSNorm, softmax and cross-entropy compute in fp32; a matmul takes bf16
 * operands and accumulates in fp32 (its bf16 output rounded once). */
#include "llama_bf16.h"

#include "bf16_head.h"
#include "llama.h"
#include "strata/compute.h"

#include <errno.h>

/* ---- the op records (each an st_compute_run) ------------------------------------ */

/* res (N,C) fp32 = a + b, then out (bf16) = rmsnorm(res): one record */
static void res_rms_fwd(struct st_compute *c, float *res, bf16 *out, float *rstd,
			const float *a, const float *b, const bf16 *w, float eps, int N, int C)
{
	size_t NC = (size_t)N * C;
	struct st_op op = { .kind = ST_OP_RESIDUAL_RMSNORM_FWD,
			    .t = { TF(res, NC), TB(out, NC), TF(rstd, N), TF(a, NC), TF(b, NC),
				   TB(w, C) },
			    .i = { N, C }, .f = { eps } };

	st_compute_run(c, &op);
}

static void lin_fwd(struct st_compute *c, void *out, bool out_f32, const bf16 *inp,
		    const bf16 *w, const bf16 *bias, int N, int IC, int OC)
{
	st_bf16_mm_fwd(c, ST_OP_LINEAR_FWD, out, out_f32, inp, w, bias, N, IC, OC);
}

static void lin_bwd(struct st_compute *c, bf16 *dinp, float *dw, float *db, const bf16 *dout,
		    const bf16 *inp, const bf16 *w, int N, int IC, int OC)
{
	st_bf16_mm_bwd(c, ST_OP_LINEAR_BWD, dinp, dw, db, dout, inp, w, N, IC, OC);
}

/* the rotation of NH heads in rows of `stride` bf16 elements, in place */
static void rope(struct st_compute *c, bool bwd, bf16 *x, int B, int T, int NH, int hd,
		 int stride, const struct st_rope_args *r)
{
	size_t n = (size_t)B * T * stride;
	struct st_op op = { .kind = bwd ? ST_OP_ROPE_BWD : ST_OP_ROPE_FWD,
			    .t = { TB(x, n), TB(x, n) },
			    .i = { B, T, NH, hd, stride, r->type, r->original_ctx },
			    .f = { r->theta, r->factor, r->low_freq_factor, r->high_freq_factor } };

	st_compute_run(c, &op);
}

static void swiglu_fwd(struct st_compute *c, bf16 *out, const bf16 *gate, const bf16 *up,
		       size_t n)
{
	struct st_op op = { .kind = ST_OP_SWIGLU_FWD,
			    .t = { TB(out, n), TB(gate, n), TB(up, n) },
			    .i = { (int64_t)n } };

	st_compute_run(c, &op);
}

/* dgate, dup (bf16, overwritten; may be gate and up) from dout */
static void swiglu_bwd(struct st_compute *c, bf16 *dgate, bf16 *dup, const bf16 *dout,
		       const bf16 *gate, const bf16 *up, size_t n)
{
	struct st_op op = { .kind = ST_OP_SWIGLU_BWD,
			    .t = { TB(dgate, n), TB(dup, n), TB(dout, n), TB(gate, n), TB(up, n) },
			    .i = { (int64_t)n } };

	st_compute_run(c, &op);
}

static void gqa_fwd(struct st_compute *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k,
		    const bf16 *v, int B, int T, int NH, int NKV, int hd)
{
	size_t NQ = (size_t)B * T * NH * hd, NK = (size_t)B * T * NKV * hd;
	struct st_op op = { .kind = ST_OP_GQA_ATTENTION_FWD,
			    .t = { TB(out, NQ), TF(lse, (size_t)B * NH * T), TB(q, NQ), TB(k, NK),
				   TB(v, NK) },
			    .i = { B, T, NH, NKV, hd } };

	st_compute_run(c, &op);
}

static void gqa_bwd(struct st_compute *c, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
		    const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out,
		    const float *lse, int B, int T, int NH, int NKV, int hd)
{
	size_t NQ = (size_t)B * T * NH * hd, NK = (size_t)B * T * NKV * hd;
	struct st_op op = { .kind = ST_OP_GQA_ATTENTION_BWD,
			    .t = { TB(dq, NQ), TB(dk, NK), TB(dv, NK), TB(dout, NQ), TB(q, NQ),
				   TB(k, NK), TB(v, NK), TB(out, NQ),
				   TF(lse, (size_t)B * NH * T) },
			    .i = { B, T, NH, NKV, hd } };

	st_compute_run(c, &op);
}

/* ---- workspace -------------------------------------------------------------------- */

/* As llama.c's, the saved forward in bf16 but for rstd1, lse, h and rstd2;
 * datt, dq, dk, dv alias act, gate and up where they fit. */
struct lwork {
	bf16 *xn, *q, *k, *v, *att, *hn, *gate, *up, *act;
	float *rstd1, *lse, *h, *rstd2;
	float *dh;       /* scratch: the residual's gradient (fp32) */
	bf16 *dn, *db16; /* scratch: a norm's output gradient; dy or dh in bf16 */
	bf16 *datt, *dq, *dk, *dv;
};

static void layer_carve(struct st_carver *sv, struct st_carver *sc, struct lwork *w, size_t N,
			const struct st_dims *d, size_t BHT)
{
	w->xn = st_carve_bf16(sv, N * d->C);
	w->rstd1 = st_carve(sv, N);
	w->q = st_carve_bf16(sv, N * d->Q);
	w->k = st_carve_bf16(sv, N * d->KV);
	w->v = st_carve_bf16(sv, N * d->KV);
	w->att = st_carve_bf16(sv, N * d->Q);
	w->lse = st_carve(sv, BHT);
	w->h = st_carve(sv, N * d->C);
	w->hn = st_carve_bf16(sv, N * d->C);
	w->rstd2 = st_carve(sv, N);
	w->gate = st_carve_bf16(sv, N * d->F);
	w->up = st_carve_bf16(sv, N * d->F);
	w->act = st_carve_bf16(sv, N * d->F);
	w->dh = st_carve(sc, N * d->C);
	w->dn = st_carve_bf16(sc, N * d->C);
	w->db16 = st_carve_bf16(sc, N * d->C);
	ST_LLAMA_GRADS_CARVE(sc, w, N, d);
}

size_t st_llama_bf16_work_bytes(const struct st_model *m, int u, int B, int T)
{
	const struct st_dims d = st_dims_of(st_model_config(m));
	struct st_carver cv;
	size_t N = (size_t)B * T;

	switch (st_model_unit_layout(m, u)->kind) {
	case ST_UNIT_BLOCK: {
		struct lwork w;
		st_carver_init(&cv, NULL, 0);
		layer_carve(&cv, &cv, &w, N, &d, (size_t)B * d.H * T);
		return cv.need_bytes;
	}
	case ST_UNIT_HEAD: return st_bf16_head_work_bytes(N, (size_t)d.C, (size_t)d.V);
	default: return 0;
	}
}

size_t st_llama_bf16_saved_bytes(const struct st_model *m, int u, int B, int T,
				 size_t *scratch_bytes)
{
	const struct st_dims d = st_dims_of(st_model_config(m));
	struct st_carver sv, sc;
	struct lwork w;

	if (st_model_unit_layout(m, u)->kind != ST_UNIT_BLOCK) {
		*scratch_bytes = st_llama_bf16_work_bytes(m, u, B, T);
		return 0;
	}
	st_carver_init(&sv, NULL, 0);
	st_carver_init(&sc, NULL, 0);
	layer_carve(&sv, &sc, &w, (size_t)B * T, &d, (size_t)B * d.H * T);
	*scratch_bytes = sc.need_bytes;
	return sv.need_bytes;
}

/* ---- decoder layer ------------------------------------------------------------------ */

static void views(const struct st_model *m, int u, const void *base, const bf16 **p)
{
	int64_t off[LT_COUNT];

	st_llama_layer_offsets(m, u, off);
	for (int k = 0; k < LT_COUNT; k++)
		p[k] = off[k] < 0 ? NULL : (const bf16 *)base + off[k];
}

/* The forward up to the MLP activation; oproj (N,C) fp32 scratch. */
static void layer_fwd_core(const struct st_model *m, const bf16 **p, const struct lwork *w,
			   const float *x, float *oproj, int B, int T)
{
	struct st_compute *c = st_model_compute(m);
	const struct st_model_config *cfg = st_model_config(m);
	const struct st_dims d = st_dims_of(cfg);
	const struct st_rope_args r = st_rope_of(cfg);
	const float eps = (float)cfg->norm_eps;
	const int N = B * T;

	st_bf16_rmsnorm_fwd(c, w->xn, w->rstd1, x, p[LT_IN_NORM], eps, N, d.C);
	lin_fwd(c, w->q, false, w->xn, p[LT_Q_W], p[LT_Q_B], N, d.C, d.Q);
	lin_fwd(c, w->k, false, w->xn, p[LT_K_W], p[LT_K_B], N, d.C, d.KV);
	lin_fwd(c, w->v, false, w->xn, p[LT_V_W], p[LT_V_B], N, d.C, d.KV);
	rope(c, false, w->q, B, T, d.H, d.hd, d.Q, &r);
	rope(c, false, w->k, B, T, d.K, d.hd, d.KV, &r);
	gqa_fwd(c, w->att, w->lse, w->q, w->k, w->v, B, T, d.H, d.K, d.hd);
	lin_fwd(c, oproj, true, w->att, p[LT_O_W], NULL, N, d.Q, d.C);
	res_rms_fwd(c, w->h, w->hn, w->rstd2, x, oproj, p[LT_POST_NORM], eps, N, d.C);
	lin_fwd(c, w->gate, false, w->hn, p[LT_GATE_W], NULL, N, d.C, d.F);
	lin_fwd(c, w->up, false, w->hn, p[LT_UP_W], NULL, N, d.C, d.F);
	swiglu_fwd(c, w->act, w->gate, w->up, (size_t)N * d.F);
}

static void layer_fwd(const struct st_model *m, int u, int B, int T, const float *params,
		      const float *x, float *y, const struct lwork *w)
{
	struct st_compute *c = st_model_compute(m);
	const struct st_dims d = st_dims_of(st_model_config(m));
	const int N = B * T;
	const bf16 *p[LT_COUNT];

	views(m, u, params, p);
	layer_fwd_core(m, p, w, x, y, B, T);
	lin_fwd(c, y, true, w->act, p[LT_DOWN_W], NULL, N, d.F, d.C);
	st_compute_residual_fwd(c, y, w->h, y, (size_t)N * d.C);
}

static void layer_bwd(const struct st_model *m, int u, int B, int T, const float *params,
		      const float *x, const float *dy, float *dx, float *grad,
		      const struct lwork *w, bool kept)
{
	struct st_compute *c = st_model_compute(m);
	const struct st_model_config *cfg = st_model_config(m);
	const struct st_dims d = st_dims_of(cfg);
	const struct st_rope_args r = st_rope_of(cfg);
	const int N = B * T;
	const size_t NC = (size_t)N * d.C, NF = (size_t)N * d.F;
	const bf16 *p[LT_COUNT];
	float *g[LT_COUNT];
	int64_t off[LT_COUNT];

	views(m, u, params, p);
	st_llama_layer_offsets(m, u, off);
	for (int k = 0; k < LT_COUNT; k++)
		g[k] = off[k] < 0 ? NULL : grad + off[k];
	if (!kept)
		layer_fwd_core(m, p, w, x, w->dh, B, T);

	// MLP: dy in bf16; down_proj's dW from act, then dact overwrites act
	st_compute_f32_to_bf16(c, w->db16, dy, NC);
	lin_bwd(c, NULL, g[LT_DOWN_W], NULL, w->db16, w->act, p[LT_DOWN_W], N, d.F, d.C);
	st_compute_zero(c, w->act, sizeof(bf16) * NF);
	lin_bwd(c, w->act, NULL, NULL, w->db16, NULL, p[LT_DOWN_W], N, d.F, d.C);
	// SwiGLU: gate and up become their gradients in place
	swiglu_bwd(c, w->gate, w->up, w->act, w->gate, w->up, NF);
	st_compute_zero(c, w->dn, sizeof(bf16) * NC);
	lin_bwd(c, w->dn, g[LT_GATE_W], NULL, w->gate, w->hn, p[LT_GATE_W], N, d.C, d.F);
	lin_bwd(c, w->dn, g[LT_UP_W], NULL, w->up, w->hn, p[LT_UP_W], N, d.C, d.F);
	// residual 2: dh = dy + the post-attention norm's input gradient (fp32)
	st_compute_copy(c, w->dh, dy, sizeof(float) * NC);
	st_bf16_rmsnorm_bwd(c, w->dh, g[LT_POST_NORM], w->dn, false, w->h, p[LT_POST_NORM],
			    w->rstd2, N, d.C);
	// attention's projection: dh in bf16
	st_compute_f32_to_bf16(c, w->db16, w->dh, NC);
	st_compute_zero(c, w->datt, sizeof(bf16) * (size_t)N * d.Q);
	lin_bwd(c, w->datt, g[LT_O_W], NULL, w->db16, w->att, p[LT_O_W], N, d.Q, d.C);
	// attention, then the rotations undone on dq and dk
	st_compute_zero(c, w->dq, sizeof(bf16) * (size_t)N * d.Q);
	st_compute_zero(c, w->dk, sizeof(bf16) * (size_t)N * d.KV);
	st_compute_zero(c, w->dv, sizeof(bf16) * (size_t)N * d.KV);
	gqa_bwd(c, w->dq, w->dk, w->dv, w->datt, w->q, w->k, w->v, w->att, w->lse, B, T, d.H,
		d.K, d.hd);
	rope(c, true, w->dq, B, T, d.H, d.hd, d.Q, &r);
	rope(c, true, w->dk, B, T, d.K, d.hd, d.KV, &r);
	// q, k, v projections into dn (the input norm's output gradient)
	st_compute_zero(c, w->dn, sizeof(bf16) * NC);
	lin_bwd(c, w->dn, g[LT_Q_W], g[LT_Q_B], w->dq, w->xn, p[LT_Q_W], N, d.C, d.Q);
	lin_bwd(c, w->dn, g[LT_K_W], g[LT_K_B], w->dk, w->xn, p[LT_K_W], N, d.C, d.KV);
	lin_bwd(c, w->dn, g[LT_V_W], g[LT_V_B], w->dv, w->xn, p[LT_V_W], N, d.C, d.KV);
	// residual 1: dx = dh + the input norm's input gradient
	st_compute_copy(c, dx, w->dh, sizeof(float) * NC);
	st_bf16_rmsnorm_bwd(c, dx, g[LT_IN_NORM], w->dn, false, x, p[LT_IN_NORM], w->rstd1, N,
			    d.C);
}

/* ---- head and embedding ------------------------------------------------------------- */

/* The shared head over model.norm and lm_head (the head's own, or the
 * embedding's matrix when tied), bf16; grad NULL for the forward. */
static struct st_bf16_head head_of(const struct st_model *m, const float *params,
				   const float *other, float *grad, float *other_grad)
{
	const struct st_model_config *cfg = st_model_config(m);
	const struct st_unit_layout *ul = st_model_unit_layout(m, st_model_unit_count(m) - 1);
	const size_t nw = ul->tensors[HT_NORM].offset_elems;
	const size_t wo = cfg->untied ? ul->tensors[HT_LM_HEAD].offset_elems :
					st_model_unit_layout(m, 0)->tensors[0].offset_elems;
	struct st_bf16_head h = {
		.norm_w = (const bf16 *)(const void *)params + nw,
		.eps = (float)cfg->norm_eps,
		.W = (const bf16 *)(const void *)(cfg->untied ? params : other) + wo,
	};

	if (grad) {
		h.dnorm_w = grad + nw;
		h.dW = (cfg->untied ? grad : other_grad) + wo;
	}
	return h;
}

/* y (N,C) fp32 = the bf16 embedding rows of the tokens (exact) */
static void embed_fwd(const struct st_model *m, const struct st_model_batch *b,
		      const float *params, float *y)
{
	const int C = st_model_config(m)->dim, V = st_model_config(m)->vocab, N = b->B * b->T;
	struct st_op op = {
		.kind = ST_OP_TOKEN_EMBED_FWD,
		.t = { TF(y, (size_t)N * C), st_tensor_1d(b->tokens, ST_DTYPE_I32, N),
		       st_tensor_2d(params, ST_DTYPE_BF16, V, C) },
		.i = { N, C },
	};

	st_compute_run(st_model_compute(m), &op);
}

/* A layer's buffers for a hook: the forward's from saved (a kept unit's)
 * or, without it, from work with the backward's own */
static void block_carve(const struct st_model *m, int B, int T, void *saved,
			size_t saved_bytes, void *work, size_t work_bytes, struct lwork *w)
{
	const struct st_dims d = st_dims_of(st_model_config(m));
	struct st_carver cv, cs;

	st_carver_init(&cv, work, work_bytes);
	st_carver_init(&cs, saved, saved_bytes);
	layer_carve(saved ? &cs : &cv, &cv, w, (size_t)B * T, &d, (size_t)B * d.H * T);
}

/* ---- the hooks' bf16 halves ------------------------------------------------------------- */

int st_llama_bf16_fwd_save(const struct st_model *m, int u, const struct st_model_batch *batch,
			   const float *params, const float *other, const float *x, float *y,
			   float *loss, void *saved, size_t saved_bytes, void *work,
			   size_t work_bytes)
{
	const int B = batch->B, T = batch->T;
	struct st_compute *c = st_model_compute(m);

	switch (st_model_unit_layout(m, u)->kind) {
	case ST_UNIT_EMBED:
		embed_fwd(m, batch, params, y);
		return st_compute_take_error(c);
	case ST_UNIT_BLOCK: {
		struct lwork w;
		block_carve(m, B, T, saved, saved_bytes, work, work_bytes, &w);
		layer_fwd(m, u, B, T, params, x, y, &w);
		return st_compute_take_error(c);
	}
	case ST_UNIT_HEAD: {
		struct st_bf16_head h = head_of(m, params, other, NULL, NULL);
		st_bf16_head_run(m, batch, &h, x, NULL, loss, work, work_bytes);
		return st_compute_take_error(c);
	}
	}
	return st_error_set(-EINVAL, "model: unit %d has no kind", u);
}

int st_llama_bf16_bwd_saved(const struct st_model *m, int u,
			    const struct st_model_batch *batch, const float *params,
			    const float *other, const float *x, const float *dy, float *dx,
			    float *grad, float *other_grad, float *loss, void *saved,
			    size_t saved_bytes, void *work, size_t work_bytes)
{
	const int B = batch->B, T = batch->T;
	const struct st_dims d = st_dims_of(st_model_config(m));
	struct st_compute *c = st_model_compute(m);

	switch (st_model_unit_layout(m, u)->kind) {
	case ST_UNIT_EMBED:
		/* dout and the gradient are fp32: the reference op */
		st_compute_token_embed_bwd(c, grad, dy, batch->tokens, B * T, d.C);
		return st_compute_take_error(c);
	case ST_UNIT_BLOCK: {
		struct lwork w;
		block_carve(m, B, T, saved, saved_bytes, work, work_bytes, &w);
		layer_bwd(m, u, B, T, params, x, dy, dx, grad, &w, saved != NULL);
		return st_compute_take_error(c);
	}
	case ST_UNIT_HEAD: {
		struct st_bf16_head h = head_of(m, params, other, grad, other_grad);
		st_bf16_head_run(m, batch, &h, x, dx, loss, work, work_bytes);
		return st_compute_take_error(c);
	}
	}
	return st_error_set(-EINVAL, "model: unit %d has no kind", u);
}

int st_llama_bf16_logits(const struct st_model *m, const float *params, const float *other,
			 const float *x, float *logits, void *work, size_t work_bytes)
{
	struct st_bf16_head h = head_of(m, params, other, NULL, NULL);

	return st_bf16_head_logits(m, &h, x, logits, work, work_bytes);
}
