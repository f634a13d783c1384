/* strata: GPT-2's bf16 compute path (--compute-dtype bf16; docs/model.md,
 * "bf16 compute"). The same units, ops and order as gpt2.c's fp32 path,
 * with these dtypes:
 *   bf16  W as it is stored (never widened); every tensor a matmul,
 *         the attention or the GELU reads or writes inside a block: ln1,
 *         qkv, atty, ln2, fch, gel (the saved forward) and their gradients;
 *         the head's normalised input and its logits' gradient
 *   fp32  the residual stream between units and inside a block (x, res, y
 *         and their gradients dx, dres, dy), the norms' statistics, the
 *         attention's lse, the logits, the loss, and every dW (accumulated
 *         into the unit's fp32 gradient)
 * Norms, softmax and cross-entropy compute in fp32; a matmul takes bf16
 * operands and accumulates in fp32 (its bf16 output rounded once). */
#include "gpt2_bf16.h"

#include "bf16_head.h"
#include "strata/compute.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <string.h>

/* The block's tensors, in layout order (as gpt2.c). */
enum { LN1_W, LN1_B, ATTN_W, ATTN_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCP_W,
       FCP_B, BT_COUNT };

/* ---- the op records (each an st_compute_run) ------------------------------------ */

static void mm_fwd(struct st_compute *c, void *out, bool out_f32, const bf16 *inp,
		   const bf16 *w, const bf16 *bias, int N, int IC, int OC)
{
	st_bf16_mm_fwd(c, ST_OP_MATMUL_FWD, out, out_f32, inp, w, bias, N, IC, OC);
}

static void mm_bwd(struct st_compute *c, bf16 *dinp, float *dw, float *db, const bf16 *dout,
		   const bf16 *inp, const bf16 *w, int N, int IC, int OC)
{
	st_bf16_mm_bwd(c, ST_OP_MATMUL_BWD, dinp, dw, db, dout, inp, w, N, IC, OC);
}

/* gel (N,OC) = gelu(pre), pre = inp @ W + b, both bf16: one op where the
 * compute has it (one rounding of each from fp32), else the two */
static void mm_gelu_fwd(struct st_compute *c, bf16 *gel, bf16 *pre, const bf16 *inp,
			const bf16 *w, const bf16 *bias, int N, int IC, int OC)
{
	size_t NO = (size_t)N * OC;
	struct st_op op = { .kind = ST_OP_MATMUL_GELU_FWD,
			    .t = { TB(gel, NO), TB(pre, NO), TB(inp, (size_t)N * IC),
				   TB(w, (size_t)IC * OC), TB(bias, OC) },
			    .i = { N, IC, OC } };

	if (st_compute_supports_op(c, &op)) {
		st_compute_run(c, &op);
		return;
	}
	mm_fwd(c, pre, false, inp, w, bias, N, IC, OC);
	struct st_op g = { .kind = ST_OP_GELU_FWD, .t = { TB(gel, NO), TB(pre, NO) },
			   .i = { (int64_t)NO } };
	st_compute_run(c, &g);
}

static void gelu_bwd(struct st_compute *c, bf16 *dinp, const bf16 *inp, const bf16 *dout,
		     size_t n)
{
	struct st_op op = { .kind = ST_OP_GELU_BWD, .t = { TB(dinp, n), TB(inp, n), TB(dout, n) },
			    .i = { (int64_t)n } };

	st_compute_run(c, &op);
}

static void att_fwd(struct st_compute *c, bf16 *out, float *lse, const bf16 *qkv, int B, int T,
		    int C, int NH)
{
	struct st_op op = { .kind = ST_OP_ATTENTION_FWD,
			    .t = { st_tensor_3d(out, ST_DTYPE_BF16, B, T, C),
				   st_tensor_3d(lse, ST_DTYPE_F32, B, NH, T),
				   st_tensor_3d(qkv, ST_DTYPE_BF16, B, T, 3 * (int64_t)C) },
			    .i = { B, T, C, NH } };

	st_compute_run(c, &op);
}

static void att_bwd(struct st_compute *c, bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
		    const bf16 *out, const float *lse, int B, int T, int C, int NH)
{
	struct st_op op = { .kind = ST_OP_ATTENTION_BWD,
			    .t = { st_tensor_3d(dqkv, ST_DTYPE_BF16, B, T, 3 * (int64_t)C),
				   st_tensor_3d(dout, ST_DTYPE_BF16, B, T, C),
				   st_tensor_3d(qkv, ST_DTYPE_BF16, B, T, 3 * (int64_t)C),
				   st_tensor_3d(out, ST_DTYPE_BF16, B, T, C),
				   st_tensor_3d(lse, ST_DTYPE_F32, B, NH, T) },
			    .i = { B, T, C, NH } };

	st_compute_run(c, &op);
}

/* ---- workspace -------------------------------------------------------------------- */

struct bwork {
	bf16 *ln1, *qkv, *atty, *ln2, *fch, *gel;
	float *mean1, *rstd1, *lse, *res, *mean2, *rstd2;
	float *dres; /* scratch: the residual's gradient (fp32) */
	bf16 *dln, *db16; /* scratch: a norm's output gradient; dy or dres in bf16 */
};

static void block_carve(struct st_carver *sv, struct st_carver *sc, struct bwork *w, size_t N,
			size_t C, size_t BH_T)
{
	w->ln1 = st_carve_bf16(sv, N * C);
	w->mean1 = st_carve(sv, N);
	w->rstd1 = st_carve(sv, N);
	w->qkv = st_carve_bf16(sv, 3 * N * C);
	w->atty = st_carve_bf16(sv, N * C);
	w->lse = st_carve(sv, BH_T);
	w->res = st_carve(sv, N * C);
	w->ln2 = st_carve_bf16(sv, N * C);
	w->mean2 = st_carve(sv, N);
	w->rstd2 = st_carve(sv, N);
	w->fch = st_carve_bf16(sv, 4 * N * C);
	w->gel = st_carve_bf16(sv, 4 * N * C);
	w->dres = st_carve(sc, N * C);
	w->dln = st_carve_bf16(sc, N * C);
	w->db16 = st_carve_bf16(sc, N * C);
}

static size_t bh_t(const struct st_model *m, int B, int T)
{
	return (size_t)B * st_model_config(m)->n_head * T;
}

size_t st_gpt2_bf16_work_bytes(const struct st_model *m, int u, int B, int T)
{
	struct st_carver cv;
	size_t N = (size_t)B * T, C = (size_t)st_model_config(m)->dim;

	st_carver_init(&cv, NULL, 0);
	if (st_model_unit_layout(m, u)->kind == ST_UNIT_BLOCK) {
		struct bwork w;
		block_carve(&cv, &cv, &w, N, C, bh_t(m, B, T));
	} else if (st_model_unit_layout(m, u)->kind == ST_UNIT_HEAD) {
		return st_bf16_head_work_bytes(N, C, (size_t)st_model_config(m)->vocab);
	} else {
		return 0;
	}
	return cv.need_bytes;
}

size_t st_gpt2_bf16_saved_bytes(const struct st_model *m, int u, int B, int T,
				size_t *scratch_bytes)
{
	struct st_carver sv, sc;
	struct bwork w;

	if (st_model_unit_layout(m, u)->kind != ST_UNIT_BLOCK) {
		*scratch_bytes = st_gpt2_bf16_work_bytes(m, u, B, T);
		return 0;
	}
	st_carver_init(&sv, NULL, 0);
	st_carver_init(&sc, NULL, 0);
	block_carve(&sv, &sc, &w, (size_t)B * T, (size_t)st_model_config(m)->dim,
		    bh_t(m, B, T));
	*scratch_bytes = sc.need_bytes;
	return sv.need_bytes;
}

/* ---- block ---------------------------------------------------------------------------- */

static void views(const struct st_model *m, int u, const float *params, const bf16 **p)
{
	const struct st_unit_layout *ul = st_model_unit_layout(m, u);

	for (int k = 0; k < BT_COUNT; k++)
		p[k] = (const bf16 *)(const void *)params + ul->tensors[k].offset_elems;
}

/* The forward up to the MLP activation; attproj (N,C) fp32 scratch. */
static void block_fwd_core(const struct st_model *m, const bf16 **p, const struct bwork *w,
			   const float *x, float *attproj, int B, int T)
{
	struct st_compute *c = st_model_compute(m);
	const int C = st_model_config(m)->dim, NH = st_model_config(m)->n_head, N = B * T;

	st_bf16_layernorm_fwd(c, w->ln1, w->mean1, w->rstd1, x, p[LN1_W], p[LN1_B], N, C);
	mm_fwd(c, w->qkv, false, w->ln1, p[ATTN_W], p[ATTN_B], N, C, 3 * C);
	att_fwd(c, w->atty, w->lse, w->qkv, B, T, C, NH);
	mm_fwd(c, attproj, true, w->atty, p[PROJ_W], p[PROJ_B], N, C, C);
	st_compute_residual_fwd(c, w->res, x, attproj, (size_t)N * C);
	st_bf16_layernorm_fwd(c, w->ln2, w->mean2, w->rstd2, w->res, p[LN2_W], p[LN2_B], N, C);
	mm_gelu_fwd(c, w->gel, w->fch, w->ln2, p[FC_W], p[FC_B], N, C, 4 * C);
}

static void block_fwd(const struct st_model *m, int u, int B, int T, const float *params,
		      const float *x, float *y, const struct bwork *w)
{
	struct st_compute *c = st_model_compute(m);
	const int C = st_model_config(m)->dim, N = B * T;
	const bf16 *p[BT_COUNT];

	views(m, u, params, p);
	block_fwd_core(m, p, w, x, y, B, T);
	mm_fwd(c, y, true, w->gel, p[FCP_W], p[FCP_B], N, 4 * C, C);
	st_compute_residual_fwd(c, y, w->res, y, (size_t)N * C);
}

static void block_bwd(const struct st_model *m, int u, int B, int T, const float *params,
		      const float *x, const float *dy, float *dx, float *grad,
		      const struct bwork *w, bool kept)
{
	struct st_compute *c = st_model_compute(m);
	const int C = st_model_config(m)->dim, NH = st_model_config(m)->n_head, N = B * T;
	const size_t NC = (size_t)N * C;
	const struct st_unit_layout *ul = st_model_unit_layout(m, u);
	const bf16 *p[BT_COUNT];
	float *g[BT_COUNT];

	views(m, u, params, p);
	for (int k = 0; k < BT_COUNT; k++)
		g[k] = grad + ul->tensors[k].offset_elems;
	if (!kept)
		block_fwd_core(m, p, w, x, w->dres, B, T);

	// MLP projection: dy in bf16; dW from gel, then dgel overwrites gel
	st_compute_f32_to_bf16(c, w->db16, dy, NC);
	mm_bwd(c, NULL, g[FCP_W], g[FCP_B], w->db16, w->gel, p[FCP_W], N, 4 * C, C);
	st_compute_zero(c, w->gel, sizeof(bf16) * 4 * NC);
	mm_bwd(c, w->gel, NULL, NULL, w->db16, NULL, p[FCP_W], N, 4 * C, C);
	gelu_bwd(c, w->fch, w->fch, w->gel, 4 * NC);
	st_compute_zero(c, w->dln, sizeof(bf16) * NC);
	mm_bwd(c, w->dln, g[FC_W], g[FC_B], w->fch, w->ln2, p[FC_W], N, C, 4 * C);
	// residual 2: dres = dy + ln2's input gradient (fp32)
	st_compute_copy(c, w->dres, dy, sizeof(float) * NC);
	st_bf16_layernorm_bwd(c, w->dres, g[LN2_W], g[LN2_B], w->dln, false, w->res, p[LN2_W],
			      w->mean2, w->rstd2, N, C);
	// attention projection: dres in bf16; datty reuses ln2
	bf16 *datty = w->ln2;
	st_compute_f32_to_bf16(c, w->db16, w->dres, NC);
	st_compute_zero(c, datty, sizeof(bf16) * NC);
	mm_bwd(c, datty, g[PROJ_W], g[PROJ_B], w->db16, w->atty, p[PROJ_W], N, C, C);
	// attention; dqkv reuses gel (4NC >= 3NC)
	bf16 *dqkv = w->gel;
	st_compute_zero(c, dqkv, sizeof(bf16) * 3 * NC);
	att_bwd(c, dqkv, datty, w->qkv, w->atty, w->lse, B, T, C, NH);
	st_compute_zero(c, w->dln, sizeof(bf16) * NC);
	mm_bwd(c, w->dln, g[ATTN_W], g[ATTN_B], dqkv, w->ln1, p[ATTN_W], N, C, 3 * C);
	// residual 1: dx = dres + ln1's input gradient
	st_compute_copy(c, dx, w->dres, sizeof(float) * NC);
	st_bf16_layernorm_bwd(c, dx, g[LN1_W], g[LN1_B], w->dln, false, x, p[LN1_W], w->mean1,
			      w->rstd1, N, C);
}

/* ---- head ------------------------------------------------------------------------------ */

/* The shared head over ln_f (unit U-1: weight, bias) and wte (unit 0), bf16;
 * grad and other_grad NULL for the forward. */
static struct st_bf16_head head_of(const struct st_model *m, const float *params,
				   const float *other, float *grad, float *other_grad)
{
	const struct st_unit_layout *ul = st_model_unit_layout(m, st_model_unit_count(m) - 1);
	const size_t wte = st_model_unit_layout(m, 0)->tensors[0].offset_elems;
	const bf16 *p = (const bf16 *)(const void *)params;
	struct st_bf16_head h = {
		.norm_w = p + ul->tensors[0].offset_elems,
		.norm_b = p + ul->tensors[1].offset_elems,
		.W = (const bf16 *)(const void *)other + wte,
	};

	if (grad) {
		h.dnorm_w = grad + ul->tensors[0].offset_elems;
		h.dnorm_b = grad + ul->tensors[1].offset_elems;
		h.dW = other_grad + wte;
	}
	return h;
}

/* ---- the hooks' bf16 halves ------------------------------------------------------------- */

static void embed_fwd(const struct st_model *m, const struct st_model_batch *b,
		      const float *params, float *y)
{
	struct st_compute *c = st_model_compute(m);
	const struct st_unit_layout *ul = st_model_unit_layout(m, 0);
	const int C = st_model_config(m)->dim, V = st_model_config(m)->vocab;
	const bf16 *base = (const bf16 *)(const void *)params;
	/* wte is (V,C); of wpe (ctx,C) the op reads rows 0..T-1 */
	struct st_op op = {
		.kind = ST_OP_EMBEDDING_FWD,
		.t = { st_tensor_3d(y, ST_DTYPE_F32, b->B, b->T, C),
		       st_tensor_2d(b->tokens, ST_DTYPE_I32, b->B, b->T),
		       st_tensor_2d(base + ul->tensors[0].offset_elems, ST_DTYPE_BF16, V, C),
		       st_tensor_2d(base + ul->tensors[1].offset_elems, ST_DTYPE_BF16, b->T, C) },
		.i = { b->B, b->T, C },
	};

	st_compute_run(c, &op);
}

int st_gpt2_bf16_fwd_save(const struct st_model *m, int u, const struct st_model_batch *batch,
			  const float *params, const float *other, const float *x, float *y,
			  float *loss, void *saved, size_t saved_bytes, void *work,
			  size_t work_bytes)
{
	const int B = batch->B, T = batch->T, C = st_model_config(m)->dim;
	struct st_compute *c = st_model_compute(m);
	struct st_carver cv, cs;

	st_carver_init(&cv, work, work_bytes);
	st_carver_init(&cs, saved, saved_bytes);
	switch (st_model_unit_layout(m, u)->kind) {
	case ST_UNIT_EMBED:
		embed_fwd(m, batch, params, y);
		return st_compute_take_error(c);
	case ST_UNIT_BLOCK: {
		struct bwork w;
		block_carve(saved ? &cs : &cv, &cv, &w, (size_t)B * T, (size_t)C, bh_t(m, B, T));
		block_fwd(m, u, B, T, params, x, y, &w);
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

int st_gpt2_bf16_bwd_saved(const struct st_model *m, int u, const struct st_model_batch *batch,
			   const float *params, const float *other, const float *x,
			   const float *dy, float *dx, float *grad, float *other_grad,
			   float *loss, void *saved, size_t saved_bytes, void *work,
			   size_t work_bytes)
{
	const int B = batch->B, T = batch->T, C = st_model_config(m)->dim;
	struct st_compute *c = st_model_compute(m);
	struct st_carver cv, cs;

	st_carver_init(&cv, work, work_bytes);
	st_carver_init(&cs, saved, saved_bytes);
	switch (st_model_unit_layout(m, u)->kind) {
	case ST_UNIT_EMBED: {
		/* dout and the gradients are fp32: the reference op */
		const struct st_unit_layout *ul = st_model_unit_layout(m, 0);
		st_compute_embedding_bwd(c, grad + ul->tensors[0].offset_elems,
					 grad + ul->tensors[1].offset_elems, dy, batch->tokens, B,
					 T, C);
		return st_compute_take_error(c);
	}
	case ST_UNIT_BLOCK: {
		struct bwork w;
		block_carve(saved ? &cs : &cv, &cv, &w, (size_t)B * T, (size_t)C, bh_t(m, B, T));
		block_bwd(m, u, B, T, params, x, dy, dx, grad, &w, saved != NULL);
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

int st_gpt2_bf16_logits(const struct st_model *m, const float *params, const float *other,
			const float *x, float *logits, void *work, size_t work_bytes)
{
	struct st_bf16_head h = head_of(m, params, other, NULL, NULL);

	return st_bf16_head_logits(m, &h, x, logits, work, work_bytes);
}
