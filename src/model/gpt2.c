/* strata: the GPT-2 family's math: its units' layouts with Hugging Face's
 * names, init, workspace, fwd(u), bwd(u), logits and FLOPs; the config is
 * in gpt2_config.c, the table that joins them at the end of this file. A
 * new family starts from a copy of these two files (docs/model.md). */
#include "gpt2.h"
#include "gpt2_bf16.h"

#include "strata/compute.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tensors of a block, in layout order. */
enum {
	BT_LN1_W,
	BT_LN1_B,
	BT_ATTN_W,
	BT_ATTN_B,
	BT_PROJ_W,
	BT_PROJ_B,
	BT_LN2_W,
	BT_LN2_B,
	BT_FC_W,
	BT_FC_B,
	BT_FCP_W,
	BT_FCP_B,
	BT_COUNT,
};
enum { ET_WTE, ET_WPE, ET_COUNT };
enum { HT_LNF_W, HT_LNF_B, HT_COUNT };

/* ---- layout ------------------------------------------------------------------- */

static int st_gpt2_layout(const struct st_model_config *cfg, struct st_unit_layout *units,
			  struct st_tensor_layout *tensors, int *n_units, int *n_tensors)
{
	const int L = cfg->n_layer;
	const int64_t C = cfg->dim, V = cfg->vocab, T = cfg->ctx;

	*n_units = L + 2;
	*n_tensors = ET_COUNT + BT_COUNT * L + HT_COUNT;
	if (!units)
		return 0;
	struct st_tensor_layout *t = tensors;
	char name[ST_MODEL_NAME_BYTES];
	for (int u = 0; u < *n_units; u++) {
		struct st_unit_layout *ul = &units[u];
		ul->tensors = t;
		ul->reads_unit = -1;
		if (u == 0) {
			ul->kind = ST_UNIT_EMBED;
			ul->block = -1;
			ul->resident = true; /* the head reads wte */
			st_unit_tensor_add(ul, t++, "wte.weight", V, C, true);
			st_unit_tensor_add(ul, t++, "wpe.weight", T, C, true);
		} else if (u <= L) {
			int i = u - 1;
			ul->kind = ST_UNIT_BLOCK;
			ul->block = i;
			static const struct {
				const char *suffix;
				int d0, d1; /* in multiples of C; 0 = absent */
				bool decay;
			} bt[BT_COUNT] = {
				{"ln_1.weight", 1, 0, false},
				{"ln_1.bias", 1, 0, false},
				{"attn.c_attn.weight", 1, 3, true},
				{"attn.c_attn.bias", 3, 0, false},
				{"attn.c_proj.weight", 1, 1, true},
				{"attn.c_proj.bias", 1, 0, false},
				{"ln_2.weight", 1, 0, false},
				{"ln_2.bias", 1, 0, false},
				{"mlp.c_fc.weight", 1, 4, true},
				{"mlp.c_fc.bias", 4, 0, false},
				{"mlp.c_proj.weight", 4, 1, true},
				{"mlp.c_proj.bias", 1, 0, false},
			};
			for (int k = 0; k < BT_COUNT; k++) {
				snprintf(name, sizeof(name), "h.%d.%s", i, bt[k].suffix);
				st_unit_tensor_add(ul, t++, name, bt[k].d0 * C,
						   bt[k].d1 * C, bt[k].decay);
			}
		} else {
			ul->kind = ST_UNIT_HEAD;
			ul->block = -1;
			ul->reads_unit = 0; /* the tie: logits = ln_f(x) @ wte^T */
			st_unit_tensor_add(ul, t++, "ln_f.weight", C, 0, false);
			st_unit_tensor_add(ul, t++, "ln_f.bias", C, 0, false);
		}
	}
	return 0;
}

static double st_gpt2_flops_per_token(const struct st_model *m, int T)
{
	const struct st_model_config *cfg = st_model_config(m);
	const double L = cfg->n_layer, C = cfg->dim, V = cfg->vocab;
	double n_mm = L * 12.0 * C * C + V * C;
	return 6.0 * n_mm + 6.0 * L * (double)T * C;
}

/* The same, unit by unit: a block's 6 * 12 C^2 + 6 T C, the head's 6 V C
 * (the tied matmul), the embedding's none. */
static double st_gpt2_unit_flops_per_token(const struct st_model *m, int u, int T)
{
	const struct st_model_config *cfg = st_model_config(m);
	const double C = cfg->dim, V = cfg->vocab;

	switch (st_model_unit_layout(m, u)->kind) {
	case ST_UNIT_BLOCK: return 6.0 * 12.0 * C * C + 6.0 * (double)T * C;
	case ST_UNIT_HEAD: return 6.0 * V * C;
	default: return 0.0;
	}
}

/* ---- init ----------------------------------------------------------------------- */

#define ST_INIT_CHUNK 65536

static int st_gpt2_init_unit(const struct st_model *m, int u, uint64_t seed,
			     float *params)
{
	const struct st_unit_layout *ul = st_model_unit_layout(m, u);
	memset(params, 0, ul->elems * sizeof(float));
	const double res_scale = 1.0 / sqrt(2.0 * st_model_config(m)->n_layer);
	uint64_t unit_key = st_family_mix64(st_family_mix64(seed) ^ (uint64_t)u);
	for (int k = 0; k < ul->n_tensors; k++) {
		const struct st_tensor_layout *t = &ul->tensors[k];
		float *p = params + t->offset_elems;
		const char *dot = strrchr(t->name, '.');
		bool is_bias = dot && !strcmp(dot, ".bias");
		bool is_norm = strstr(t->name, "ln_") != NULL;
		if (is_bias)
			continue; /* zero */
		if (is_norm) {
			for (uint64_t i = 0; i < t->n_elems; i++)
				p[i] = 1.0f;
			continue;
		}
		double std = 0.02;
		if (strstr(t->name, "c_proj.weight"))
			std *= res_scale;
		uint64_t tkey = st_family_mix64(unit_key ^ ((uint64_t)k << 32));
		int64_t n_chunks = (int64_t)((t->n_elems + ST_INIT_CHUNK - 1) / ST_INIT_CHUNK);
#pragma omp parallel for schedule(dynamic, 1)
		for (int64_t ch = 0; ch < n_chunks; ch++) {
			uint64_t lo = (uint64_t)ch * ST_INIT_CHUNK;
			uint64_t len = ST_MIN((uint64_t)ST_INIT_CHUNK, t->n_elems - lo);
			st_family_fill_normal(p + lo, len, st_family_mix64(tkey + (uint64_t)ch), std);
		}
	}
	return 0;
}

/* ---- workspace --------------------------------------------------------------------- */

/* (the carver: st_carve(), strata/family.h) */

/* Buffers of a block's forward and backward. */
struct st_block_work {
	float *ln1, *mean1, *rstd1, *qkv, *atty, *lse, *res, *ln2, *mean2,
		*rstd2, *fch, *gel, *dres, *dln;
};

/* The forward's buffers (ln1 .. gel: what the backward reads, the part a
 * kept unit saves) from sv, the backward's scratch (dres, dln) from sc; sv
 * and sc are one carver when the backward recomputes the forward. */
static void st_block_carve(struct st_carver *sv, struct st_carver *sc,
			   struct st_block_work *w, size_t N, size_t C, size_t BH_T)
{
	w->ln1 = st_carve(sv, N * C);
	w->mean1 = st_carve(sv, N);
	w->rstd1 = st_carve(sv, N);
	w->qkv = st_carve(sv, 3 * N * C);
	w->atty = st_carve(sv, N * C);
	w->lse = st_carve(sv, BH_T);
	w->res = st_carve(sv, N * C);
	w->ln2 = st_carve(sv, N * C);
	w->mean2 = st_carve(sv, N);
	w->rstd2 = st_carve(sv, N);
	w->fch = st_carve(sv, 4 * N * C);
	w->gel = st_carve(sv, 4 * N * C);
	w->dres = st_carve(sc, N * C);
	w->dln = st_carve(sc, N * C);
}

struct st_head_work {
	float *xln, *mean, *rstd, *dxln, *logits, *losses;
};

static void st_head_carve(struct st_carver *cv, struct st_head_work *w,
			  size_t N, size_t C, size_t V)
{
	w->xln = st_carve(cv, N * C);
	w->mean = st_carve(cv, N);
	w->rstd = st_carve(cv, N);
	w->dxln = st_carve(cv, N * C);
	w->logits = st_carve(cv, ST_MIN(N, (size_t)ST_MODEL_CE_CHUNK_ROWS) * V);
	w->losses = st_carve(cv, N);
}

static size_t st_work_need(const struct st_model *m, int u, int B, int T)
{
	struct st_carver cv;
	st_carver_init(&cv, NULL, 0);
	size_t N = (size_t)B * T, C = (size_t)st_model_config(m)->dim;
	if (st_model_unit_layout(m, u)->kind == ST_UNIT_BLOCK) {
		struct st_block_work w;
		st_block_carve(&cv, &cv, &w, N, C, (size_t)B * st_model_config(m)->n_head * T);
	} else if (st_model_unit_layout(m, u)->kind == ST_UNIT_HEAD) {
		struct st_head_work w;
		st_head_carve(&cv, &w, N, C, (size_t)st_model_config(m)->vocab);
	} else {
		return 0;
	}
	return cv.need_bytes;
}

static size_t st_gpt2_work_bytes(const struct st_model *m, int u, int B, int T)
{
	if (st_model_precision(m) == ST_PRECISION_BF16)
		return st_gpt2_bf16_work_bytes(m, u, B, T);
	return st_work_need(m, u, B, T);
}

/* A block keeps ln1 .. gel (15 N C + 4 N + B H T floats); its scratch is
 * dres and dln. The embedding and the head recompute nothing. */
static size_t st_gpt2_saved_bytes(const struct st_model *m, int u, int B, int T,
				  size_t *scratch_bytes)
{
	struct st_carver sv, sc;
	struct st_block_work w;
	size_t N = (size_t)B * T, C = (size_t)st_model_config(m)->dim;

	if (st_model_precision(m) == ST_PRECISION_BF16)
		return st_gpt2_bf16_saved_bytes(m, u, B, T, scratch_bytes);
	if (st_model_unit_layout(m, u)->kind != ST_UNIT_BLOCK) {
		*scratch_bytes = st_work_need(m, u, B, T);
		return 0;
	}
	st_carver_init(&sv, NULL, 0);
	st_carver_init(&sc, NULL, 0);
	st_block_carve(&sv, &sc, &w, N, C, (size_t)B * st_model_config(m)->n_head * T);
	*scratch_bytes = sc.need_bytes;
	return sv.need_bytes;
}

/* Every unit's output is (B,T,C): the embedding's and each block's. */
static size_t st_gpt2_act_bytes(const struct st_model *m, int u, int B, int T)
{
	(void)u;
	return (size_t)B * T * st_model_config(m)->dim * sizeof(float);
}

/* Kernels index B*T*4C and B*H*T with int. */
static int st_gpt2_batch_check(const struct st_model *m, int B, int T)
{
	const struct st_model_config *cfg = st_model_config(m);

	if ((int64_t)B * T * 4 * cfg->dim > INT32_MAX ||
	    (int64_t)B * cfg->n_head * T > INT32_MAX)
		return st_error_set(-EINVAL, "model: batch B=%d T=%d too large for dim %d",
				    B, T, cfg->dim);
	return 0;
}

/* ---- block --------------------------------------------------------------------------------- */

struct st_block_params {
	const float *t[BT_COUNT];
};

static void st_block_views(const struct st_model *m, int u, const float *params,
			   const float **out)
{
	const struct st_unit_layout *ul = st_model_unit_layout(m, u);
	for (int k = 0; k < BT_COUNT; k++)
		out[k] = params + ul->tensors[k].offset_elems;
}

/* The block's forward up to the MLP activation, shared by fwd and bwd.
 * attproj is (N,C) scratch for the attention projection. */
static void st_block_fwd_core(const struct st_model *m, const float **p,
			      const struct st_block_work *w, const float *x,
			      float *attproj, int B, int T)
{
	struct st_compute *c = st_model_compute(m);
	const int C = st_model_config(m)->dim, NH = st_model_config(m)->n_head, N = B * T;
	// ln1, qkv, attention, projection, residual
	st_compute_layernorm_fwd(c, w->ln1, w->mean1, w->rstd1, x, p[BT_LN1_W],
				 p[BT_LN1_B], N, C);
	st_compute_matmul_fwd(c, w->qkv, w->ln1, p[BT_ATTN_W], p[BT_ATTN_B], N, C, 3 * C);
	st_compute_attention_fwd(c, w->atty, w->lse, w->qkv, B, T, C, NH);
	st_compute_matmul_fwd(c, attproj, w->atty, p[BT_PROJ_W], p[BT_PROJ_B], N, C, C);
	// residual and ln2: one op (the same bits as the two)
	st_compute_residual_layernorm_fwd(c, w->res, w->ln2, w->mean2, w->rstd2, x, attproj,
					  p[BT_LN2_W], p[BT_LN2_B], N, C);
	// fc and gelu (one op where the compute fuses them; fch is kept for
	// the backward)
	st_compute_matmul_gelu_fwd(c, w->gel, w->fch, w->ln2, p[BT_FC_W], p[BT_FC_B], N, C,
				   4 * C);
}

static void st_block_fwd(const struct st_model *m, int u, int B, int T,
			 const float *params, const float *x, float *y,
			 const struct st_block_work *w)
{
	struct st_compute *c = st_model_compute(m);
	const int C = st_model_config(m)->dim, N = B * T;
	const float *p[BT_COUNT];
	st_block_views(m, u, params, p);
	st_block_fwd_core(m, p, w, x, y, B, T);
	// y = res + gel @ W_fcp + b
	st_compute_matmul_fwd(c, y, w->gel, p[BT_FCP_W], p[BT_FCP_B], N, 4 * C, C);
	st_compute_residual_fwd(c, y, w->res, y, (size_t)N * C);
}

/* kept: w's forward buffers hold this unit's forward (st_block_fwd ran
 * into them with the same params and x); else they are recomputed. */
static void st_block_bwd(const struct st_model *m, int u, int B, int T,
			 const float *params, const float *x, const float *dy,
			 float *dx, float *grad, const struct st_block_work *w, bool kept)
{
	struct st_compute *c = st_model_compute(m);
	const int C = st_model_config(m)->dim, NH = st_model_config(m)->n_head, N = B * T;
	const size_t NC = (size_t)N * C;
	const struct st_unit_layout *ul = st_model_unit_layout(m, u);
	const float *p[BT_COUNT];
	float *g[BT_COUNT];
	st_block_views(m, u, params, p);
	for (int k = 0; k < BT_COUNT; k++)
		g[k] = grad + ul->tensors[k].offset_elems;

	if (!kept)
		st_block_fwd_core(m, p, w, x, w->dres, B, T);

	// MLP projection: dW from gel, then dgel overwrites gel
	st_compute_matmul_bwd(c, NULL, g[BT_FCP_W], g[BT_FCP_B], dy, w->gel,
			      p[BT_FCP_W], N, 4 * C, C);
	st_compute_zero(c, w->gel, sizeof(float) * 4 * NC);
	st_compute_matmul_bwd(c, w->gel, NULL, NULL, dy, NULL, p[BT_FCP_W], N, 4 * C, C);
	// gelu: the pre-activation becomes its gradient in place
	st_compute_gelu_bwd(c, w->fch, w->fch, w->gel, 4 * NC);
	st_compute_zero(c, w->dln, sizeof(float) * NC);
	st_compute_matmul_bwd(c, w->dln, g[BT_FC_W], g[BT_FC_B], w->fch, w->ln2,
			      p[BT_FC_W], N, C, 4 * C);
	// residual 2: dres = dy + ln2's input gradient
	st_compute_copy(c, w->dres, dy, sizeof(float) * NC);
	st_compute_layernorm_bwd(c, w->dres, g[BT_LN2_W], g[BT_LN2_B], w->dln, w->res,
				 p[BT_LN2_W], w->mean2, w->rstd2, N, C);
	// attention projection; datty reuses ln2 (no longer needed)
	float *datty = w->ln2;
	st_compute_zero(c, datty, sizeof(float) * NC);
	st_compute_matmul_bwd(c, datty, g[BT_PROJ_W], g[BT_PROJ_B], w->dres, w->atty,
			      p[BT_PROJ_W], N, C, C);
	// attention; dqkv reuses gel (4NC >= 3NC)
	float *dqkv = w->gel;
	st_compute_zero(c, dqkv, sizeof(float) * 3 * NC);
	st_compute_attention_bwd(c, dqkv, datty, w->qkv, w->atty, w->lse, B, T, C, NH);
	st_compute_zero(c, w->dln, sizeof(float) * NC);
	st_compute_matmul_bwd(c, w->dln, g[BT_ATTN_W], g[BT_ATTN_B], dqkv, w->ln1,
			      p[BT_ATTN_W], N, C, 3 * C);
	// residual 1: dx = dres + ln1's input gradient
	st_compute_copy(c, dx, w->dres, sizeof(float) * NC);
	st_compute_layernorm_bwd(c, dx, g[BT_LN1_W], g[BT_LN1_B], w->dln, x,
				 p[BT_LN1_W], w->mean1, w->rstd1, N, C);
}

/* ---- head ----------------------------------------------------------------------------------- */

static void st_head_run(const struct st_model *m, const struct st_model_batch *b,
			const float *params, const float *other, const float *x,
			float *dx, float *grad, float *other_grad, float *loss,
			const struct st_head_work *w)
{
	struct st_compute *c = st_model_compute(m);
	const int C = st_model_config(m)->dim, V = st_model_config(m)->vocab, N = b->B * b->T;
	const struct st_unit_layout *ul = st_model_unit_layout(m, st_model_unit_count(m) - 1);
	const float *lnw = params + ul->tensors[HT_LNF_W].offset_elems;
	const float *lnb = params + ul->tensors[HT_LNF_B].offset_elems;
	const float *wte = other + st_model_unit_layout(m, 0)->tensors[ET_WTE].offset_elems;
	const bool bwd = dx != NULL;

	st_compute_layernorm_fwd(c, w->xln, w->mean, w->rstd, x, lnw, lnb, N, C);
	if (bwd)
		st_compute_zero(c, w->dxln, sizeof(float) * (size_t)N * C);
	const float dloss = b->loss_scale / (float)N;
	for (int r0 = 0; r0 < N; r0 += ST_MODEL_CE_CHUNK_ROWS) {
		int nr = ST_MIN(ST_MODEL_CE_CHUNK_ROWS, N - r0);
		const float *xr = w->xln + (size_t)r0 * C;
		// logits (nr,V) = xln_r (nr,C) @ wte^T (C,V)
		st_compute_gemm(c, 0, 1, nr, V, C, xr, C, wte, C, 0.0f,
				w->logits, V);
		if (!bwd) {
			st_compute_crossentropy_fwd(c, w->losses + r0, w->logits,
						    b->targets + r0, nr, V);
			continue;
		}
		st_compute_crossentropy_bwd(c, w->logits, w->losses + r0, w->logits,
					    b->targets + r0, dloss, nr, V);
		// dxln_r (nr,C) += dlogits (nr,V) @ wte (V,C)
		st_compute_gemm(c, 0, 0, nr, C, V, w->logits, V, wte, C, 1.0f,
				w->dxln + (size_t)r0 * C, C);
		// dwte (V,C) += dlogits^T (V,nr) @ xln_r (nr,C)
		float *dwte = other_grad + st_model_unit_layout(m, 0)->tensors[ET_WTE].offset_elems;
		st_compute_gemm(c, 1, 0, V, C, nr, w->logits, V, xr, C, 1.0f,
				dwte, C);
	}
	if (loss)
		*loss = st_family_mean_loss(c, w->losses, (size_t)N);
	if (bwd) {
		st_compute_zero(c, dx, sizeof(float) * (size_t)N * C);
		st_compute_layernorm_bwd(c, dx, grad + ul->tensors[HT_LNF_W].offset_elems,
					 grad + ul->tensors[HT_LNF_B].offset_elems,
					 w->dxln, x, lnw, w->mean, w->rstd, N, C);
	}
}

/* ---- fwd / bwd -------------------------------------------------------------------------------- */

/* saved NULL: one workspace (the backward recomputes); else a block's
 * forward buffers are carved from saved and its scratch from work. */
static int st_gpt2_fwd_save(const struct st_model *m, int u,
		 const struct st_model_batch *batch, const float *params,
		 const float *other, const float *x, float *y, float *loss,
		 void *saved, size_t saved_bytes, void *work, size_t work_bytes)
{
	if (st_model_precision(m) == ST_PRECISION_BF16)
		return st_gpt2_bf16_fwd_save(m, u, batch, params, other, x, y, loss, saved,
					     saved_bytes, work, work_bytes);
	const int B = batch->B, T = batch->T, C = st_model_config(m)->dim;
	struct st_compute *c = st_model_compute(m);
	struct st_carver cv, cs;
	st_carver_init(&cv, work, work_bytes);
	st_carver_init(&cs, saved, saved_bytes);
	switch (st_model_unit_layout(m, u)->kind) {
	case ST_UNIT_EMBED: {
		assert(y);
		const struct st_unit_layout *ul = st_model_unit_layout(m, 0);
		st_compute_embedding_fwd(c, y, batch->tokens,
					 params + ul->tensors[ET_WTE].offset_elems,
					 params + ul->tensors[ET_WPE].offset_elems, B,
					 T, C);
		return st_compute_take_error(c);
	}
	case ST_UNIT_BLOCK: {
		assert(x && y);
		struct st_block_work w;
		st_block_carve(saved ? &cs : &cv, &cv, &w, (size_t)B * T, (size_t)C,
			       (size_t)B * st_model_config(m)->n_head * T);
		st_block_fwd(m, u, B, T, params, x, y, &w);
		return st_compute_take_error(c);
	}
	case ST_UNIT_HEAD: {
		assert(x && other && loss);
		struct st_head_work w;
		st_head_carve(&cv, &w, (size_t)B * T, (size_t)C,
			      (size_t)st_model_config(m)->vocab);
		st_head_run(m, batch, params, other, x, NULL, NULL, NULL, loss, &w);
		return st_compute_take_error(c);
	}
	}
	return st_error_set(-EINVAL, "model: unit %d has no kind", u);
}

static int st_gpt2_bwd_saved(const struct st_model *m, int u,
		 const struct st_model_batch *batch, const float *params,
		 const float *other, const float *x, const float *dy, float *dx,
		 float *grad, float *other_grad, float *loss, void *saved,
		 size_t saved_bytes, void *work, size_t work_bytes)
{
	if (st_model_precision(m) == ST_PRECISION_BF16)
		return st_gpt2_bf16_bwd_saved(m, u, batch, params, other, x, dy, dx, grad,
					      other_grad, loss, saved, saved_bytes, work,
					      work_bytes);
	const int B = batch->B, T = batch->T, C = st_model_config(m)->dim;
	struct st_compute *c = st_model_compute(m);
	struct st_carver cv, cs;
	st_carver_init(&cv, work, work_bytes);
	st_carver_init(&cs, saved, saved_bytes);
	switch (st_model_unit_layout(m, u)->kind) {
	case ST_UNIT_EMBED: {
		assert(dy);
		const struct st_unit_layout *ul = st_model_unit_layout(m, 0);
		st_compute_embedding_bwd(c, grad + ul->tensors[ET_WTE].offset_elems,
					 grad + ul->tensors[ET_WPE].offset_elems, dy,
					 batch->tokens, B, T, C);
		return st_compute_take_error(c);
	}
	case ST_UNIT_BLOCK: {
		assert(x && dy && dx);
		struct st_block_work w;
		st_block_carve(saved ? &cs : &cv, &cv, &w, (size_t)B * T, (size_t)C,
			       (size_t)B * st_model_config(m)->n_head * T);
		st_block_bwd(m, u, B, T, params, x, dy, dx, grad, &w, saved != NULL);
		return st_compute_take_error(c);
	}
	case ST_UNIT_HEAD: {
		assert(x && dx && other && other_grad);
		struct st_head_work w;
		st_head_carve(&cv, &w, (size_t)B * T, (size_t)C,
			      (size_t)st_model_config(m)->vocab);
		st_head_run(m, batch, params, other, x, dx, grad, other_grad, loss, &w);
		return st_compute_take_error(c);
	}
	}
	return st_error_set(-EINVAL, "model: unit %d has no kind", u);
}

static int st_gpt2_fwd(const struct st_model *m, int u,
		 const struct st_model_batch *batch, const float *params,
		 const float *other, const float *x, float *y, float *loss,
		 void *work, size_t work_bytes)
{
	return st_gpt2_fwd_save(m, u, batch, params, other, x, y, loss, NULL, 0, work,
				work_bytes);
}

static int st_gpt2_bwd(const struct st_model *m, int u,
		 const struct st_model_batch *batch, const float *params,
		 const float *other, const float *x, const float *dy, float *dx,
		 float *grad, float *other_grad, float *loss, void *work,
		 size_t work_bytes)
{
	return st_gpt2_bwd_saved(m, u, batch, params, other, x, dy, dx, grad, other_grad,
				 loss, NULL, 0, work, work_bytes);
}

/* One position's logits: ln_f(x) @ wte^T, through the head's workspace at
 * B = T = 1 (xln, mean, rstd). */
static int st_gpt2_logits(const struct st_model *m, const float *params, const float *other,
			  const float *x, float *logits, void *work, size_t work_bytes)
{
	if (st_model_precision(m) == ST_PRECISION_BF16)
		return st_gpt2_bf16_logits(m, params, other, x, logits, work, work_bytes);
	struct st_compute *c = st_model_compute(m);
	const int C = st_model_config(m)->dim, V = st_model_config(m)->vocab;
	const struct st_unit_layout *ul = st_model_unit_layout(m, st_model_unit_count(m) - 1);
	const float *wte = other + st_model_unit_layout(m, 0)->tensors[ET_WTE].offset_elems;
	struct st_carver cv;
	struct st_head_work w;

	st_carver_init(&cv, work, work_bytes);
	st_head_carve(&cv, &w, 1, (size_t)C, (size_t)V);
	st_compute_layernorm_fwd(c, w.xln, w.mean, w.rstd, x,
				 params + ul->tensors[HT_LNF_W].offset_elems,
				 params + ul->tensors[HT_LNF_B].offset_elems, 1, C);
	st_compute_gemm(c, 0, 1, 1, V, C, w.xln, C, wte, C, 0.0f, logits, V);
	return st_compute_sync(c);
}

static const char *const st_gpt2_model_types[] = { "gpt2", NULL };
static const char *const st_gpt2_architectures[] = { "GPT2LMHeadModel", "GPT2Model", NULL };
/* What transformers' GPT-2 files hold besides the model: the tied head's
 * copy and, in older files, the causal mask buffers. */
static const char *const st_gpt2_hf_derived[] = { "lm_head.weight", "h.*.attn.bias",
						  "h.*.attn.masked_bias", NULL };

const struct st_family_ops st_family_gpt2 = {
	.name = "gpt2",
	.abi = ST_FAMILY_ABI,
	.title = "GPT-2",
	.presets = "tiny,gpt2,gpt2-medium,gpt2-large,gpt2-xl",
	.hf_model_types = st_gpt2_model_types,
	.hf_architectures = st_gpt2_architectures,
	.config_preset = st_gpt2_config_preset,
	.config_parse = st_gpt2_config_parse,
	.config_check = st_gpt2_config_check,
	.config_format = st_gpt2_config_format,
	.config_describe = st_gpt2_config_describe,
	.config_fields = st_gpt2_config_fields,
	.hf_config_read = st_gpt2_hf_config_read,
	.hf_config_write = st_gpt2_hf_config_write,
	.hf_config_check = st_gpt2_hf_config_check,
	.layout = st_gpt2_layout,
	.init_unit = st_gpt2_init_unit,
	.work_bytes = st_gpt2_work_bytes,
	.act_bytes = st_gpt2_act_bytes,
	.batch_check = st_gpt2_batch_check,
	.fwd = st_gpt2_fwd,
	.bwd = st_gpt2_bwd,
	.flops_per_token = st_gpt2_flops_per_token,
	.logits = st_gpt2_logits,
	.hf_derived = st_gpt2_hf_derived,
	.saved_bytes = st_gpt2_saved_bytes,
	.fwd_save = st_gpt2_fwd_save,
	.bwd_saved = st_gpt2_bwd_saved,
	.unit_flops_per_token = st_gpt2_unit_flops_per_token,
	.bf16 = true,
};
