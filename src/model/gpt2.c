/* strata: the GPT-2 family's math: its units' layouts with Hugging Face's
 * names, init, FLOPs, and its body (body.h): the embedding, the block's
 * workspace, forward and backward written once for every compute dtype,
 * and the head's tensors, which the shared unit driver (unit.c) and head
 * (head.c) run; the config is in gpt2_config.c, the table that joins them
 * at the end of this file. A new family starts from a copy of these two
 * files (docs/model.md). */
#include "gpt2.h"

#include "body.h"

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

static int gpt2_layout(const struct st_model_config *cfg, struct st_unit_layout *units,
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

static double gpt2_flops_per_token(const struct st_model *m, int T)
{
	const struct st_model_config *cfg = st_model_config(m);
	const double L = cfg->n_layer, C = cfg->dim, V = cfg->vocab;
	double n_mm = L * 12.0 * C * C + V * C;
	return 6.0 * n_mm + 6.0 * L * (double)T * C;
}

/* The same, unit by unit: a block's 6 * 12 C^2 + 6 T C, the head's 6 V C
 * (the tied matmul), the embedding's none. */
static double gpt2_unit_flops_per_token(const struct st_model *m, int u, int T)
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

static int gpt2_init_unit(const struct st_model *m, int u, uint64_t seed,
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

/* Kernels index B*T*4C and B*H*T with int. */
static int gpt2_batch_check(const struct st_model *m, int B, int T)
{
	const struct st_model_config *cfg = st_model_config(m);

	if ((int64_t)B * T * 4 * cfg->dim > INT32_MAX ||
	    (int64_t)B * cfg->n_head * T > INT32_MAX)
		return st_error_set(-EINVAL, "model: batch B=%d T=%d too large for dim %d",
				    B, T, cfg->dim);
	return 0;
}

/* Buffers of a block's forward and backward; "dt" ones in the compute
 * dtype (body.h). */
struct block_work {
	void *ln1, *qkv, *atty, *ln2, *fch, *gel; /* dt: the saved forward */
	float *mean1, *rstd1, *lse, *res, *mean2, *rstd2;
	float *dres; /* scratch: the residual's gradient */
	void *dln;   /* scratch, dt: a norm's output gradient */
	void *dcast; /* scratch, dt: dy or dres cast (none at fp32) */
};

/* The forward's buffers (ln1 .. gel: what the backward reads, the part a
 * kept unit saves; 15 N C + 4 N + B H T elements) from sv, the backward's
 * scratch from sc. */
static void block_carve(const struct st_model *m, int B, int T, struct st_carver *sv,
			struct st_carver *sc, struct block_work *w)
{
	const enum st_dtype dt = st_mop_of(m).dt;
	const size_t N = (size_t)B * T, C = (size_t)st_model_config(m)->dim;

	w->ln1 = st_carve_dt(sv, N * C, dt);
	w->mean1 = st_carve(sv, N);
	w->rstd1 = st_carve(sv, N);
	w->qkv = st_carve_dt(sv, 3 * N * C, dt);
	w->atty = st_carve_dt(sv, N * C, dt);
	w->lse = st_carve(sv, (size_t)B * st_model_config(m)->n_head * T);
	w->res = st_carve(sv, N * C);
	w->ln2 = st_carve_dt(sv, N * C, dt);
	w->mean2 = st_carve(sv, N);
	w->rstd2 = st_carve(sv, N);
	w->fch = st_carve_dt(sv, 4 * N * C, dt);
	w->gel = st_carve_dt(sv, 4 * N * C, dt);
	w->dres = st_carve(sc, N * C);
	w->dln = st_carve_dt(sc, N * C, dt);
	w->dcast = st_carve_cast(sc, N * C, dt);
}

static void gpt2_block_carve(const struct st_model *m, int B, int T, struct st_carver *sv,
			     struct st_carver *sc)
{
	struct block_work w;

	block_carve(m, B, T, sv, sc, &w);
}

/* ---- block --------------------------------------------------------------------------------- */

/* Unit u's tensors in params (the compute dtype) by slot. */
static void block_views(const struct st_model *m, const struct st_mop *o, int u,
			const void *params, const void **p)
{
	const struct st_unit_layout *ul = st_model_unit_layout(m, u);

	for (int k = 0; k < BT_COUNT; k++)
		p[k] = st_mop_at(o, params, ul->tensors[k].offset_elems);
}

/* ln1 and the qkv projection of x (N rows). */
static void block_qkv(const struct st_model *m, const struct st_mop *o, const void **p,
		      const struct block_work *w, const float *x, int N)
{
	const int C = st_model_config(m)->dim;

	st_mop_layernorm_fwd(o, w->ln1, w->mean1, w->rstd1, x, p[BT_LN1_W], p[BT_LN1_B], N, C);
	st_mop_mm_fwd(o, ST_OP_MATMUL_FWD, w->qkv, o->dt, w->ln1, p[BT_ATTN_W], p[BT_ATTN_B], N,
		      C, 3 * C);
}

/* After the attention (atty): the projection, residual and ln2, fc and
 * gelu. attproj is (N,C) fp32 scratch. */
static void block_after_att(const struct st_model *m, const struct st_mop *o, const void **p,
			    const struct block_work *w, const float *x, float *attproj, int N)
{
	const int C = st_model_config(m)->dim;

	st_mop_mm_fwd(o, ST_OP_MATMUL_FWD, attproj, ST_DTYPE_F32, w->atty, p[BT_PROJ_W],
		      p[BT_PROJ_B], N, C, C);
	// residual and ln2 (one op where the compute has it: the same bits)
	st_mop_residual_layernorm_fwd(o, w->res, w->ln2, w->mean2, w->rstd2, x, attproj,
				      p[BT_LN2_W], p[BT_LN2_B], N, C);
	// fc and gelu (fch is kept for the backward)
	st_mop_mm_gelu_fwd(o, w->gel, w->fch, w->ln2, p[BT_FC_W], p[BT_FC_B], N, C, 4 * C);
}

/* y = res + gel @ W_fcp + b */
static void block_out(const struct st_model *m, const struct st_mop *o, const void **p,
		      const struct block_work *w, float *y, int N)
{
	const int C = st_model_config(m)->dim;

	st_mop_mm_fwd(o, ST_OP_MATMUL_FWD, y, ST_DTYPE_F32, w->gel, p[BT_FCP_W], p[BT_FCP_B], N,
		      4 * C, C);
	st_compute_residual_fwd(o->c, y, w->res, y, (size_t)N * C);
}

/* The block's forward up to the MLP activation, shared by fwd and bwd.
 * attproj is (N,C) fp32 scratch for the attention projection. */
static void block_fwd_core(const struct st_model *m, const struct st_mop *o, const void **p,
			   const struct block_work *w, const float *x, float *attproj, int B,
			   int T, const int32_t *seg)
{
	const int C = st_model_config(m)->dim, NH = st_model_config(m)->n_head;

	block_qkv(m, o, p, w, x, B * T);
	st_mop_attention_fwd(o, w->atty, w->lse, w->qkv, seg, B, T, C, NH);
	block_after_att(m, o, p, w, x, attproj, B * T);
}

static void gpt2_block_fwd(const struct st_model *m, int u, int B, int T, const int32_t *seg,
			   const void *params,
			   const float *x, float *y, struct st_carver *sv, struct st_carver *sc)
{
	const struct st_mop o = st_mop_of(m);
	const void *p[BT_COUNT];
	struct block_work w;

	block_carve(m, B, T, sv, sc, &w);
	block_views(m, &o, u, params, p);
	block_fwd_core(m, &o, p, &w, x, y, B, T, seg);
	block_out(m, &o, p, &w, y, B * T);
}

/* The block on n new rows at positions pos.. with the KV cache: qkv, the
 * rows' K and V appended, their attention over the cache, the rest as the
 * forward, on the model's compute. fp32 (st_model_decode_begin checks). */
static int gpt2_block_decode(const struct st_model *m, int u, int pos, int n,
			      const void *params, const float *x, float *y, float *kc, float *vc,
			      struct st_carver *cv)
{
	const struct st_mop o = st_mop_of(m);
	const int C = st_model_config(m)->dim, NH = st_model_config(m)->n_head;
	const void *p[BT_COUNT];
	struct block_work w;

	block_carve(m, 1, n, cv, cv, &w);
	block_views(m, &o, u, params, p);
	block_qkv(m, &o, p, &w, x, n);
	for (int i = 0; i < n; i++) {
		const float *r = (const float *)w.qkv + (size_t)i * 3 * C;

		st_compute_copy(o.c, kc + (size_t)(pos + i) * C, r + C, sizeof(float) * (size_t)C);
		st_compute_copy(o.c, vc + (size_t)(pos + i) * C, r + 2 * C,
				sizeof(float) * (size_t)C);
	}
	st_mop_decode_attention(&o, w.atty, w.qkv, 3 * C, kc, vc, pos, n, NH, NH, C / NH);
	block_after_att(m, &o, p, &w, x, y, n);
	block_out(m, &o, p, &w, y, n);
	return 0;
}

static void gpt2_block_bwd(const struct st_model *m, int u, int B, int T, const int32_t *seg,
			   const void *params,
			   const float *x, const float *dy, float *dx, float *grad,
			   struct st_carver *sv, struct st_carver *sc, bool kept)
{
	const struct st_mop o = st_mop_of(m);
	struct st_compute *c = o.c;
	const int C = st_model_config(m)->dim, NH = st_model_config(m)->n_head, N = B * T;
	const size_t NC = (size_t)N * C;
	const struct st_unit_layout *ul = st_model_unit_layout(m, u);
	const void *p[BT_COUNT];
	float *g[BT_COUNT];
	struct block_work w;

	block_carve(m, B, T, sv, sc, &w);
	block_views(m, &o, u, params, p);
	for (int k = 0; k < BT_COUNT; k++)
		g[k] = grad + ul->tensors[k].offset_elems;
	if (!kept)
		block_fwd_core(m, &o, p, &w, x, w.dres, B, T, seg);

	// MLP projection: dy in dt; dW from gel, then dgel overwrites gel
	const void *dyc = st_mop_cast(&o, w.dcast, dy, NC);
	st_mop_mm_bwd(&o, ST_OP_MATMUL_BWD, NULL, g[BT_FCP_W], g[BT_FCP_B], dyc, w.gel,
		      p[BT_FCP_W], N, 4 * C, C);
	st_compute_zero(c, w.gel, st_mop_bytes(&o, 4 * NC));
	st_mop_mm_bwd(&o, ST_OP_MATMUL_BWD, w.gel, NULL, NULL, dyc, NULL, p[BT_FCP_W], N, 4 * C,
		      C);
	// gelu: the pre-activation becomes its gradient in place
	st_mop_gelu_bwd(&o, w.fch, w.fch, w.gel, 4 * NC);
	st_compute_zero(c, w.dln, st_mop_bytes(&o, NC));
	st_mop_mm_bwd(&o, ST_OP_MATMUL_BWD, w.dln, g[BT_FC_W], g[BT_FC_B], w.fch, w.ln2,
		      p[BT_FC_W], N, C, 4 * C);
	// residual 2: dres = dy + ln2's input gradient (fp32)
	st_compute_copy(c, w.dres, dy, sizeof(float) * NC);
	st_mop_layernorm_bwd(&o, w.dres, g[BT_LN2_W], g[BT_LN2_B], w.dln, o.dt, w.res,
			     p[BT_LN2_W], w.mean2, w.rstd2, N, C);
	// attention projection: dres in dt; datty reuses ln2 (no longer needed)
	void *datty = w.ln2;
	const void *dresc = st_mop_cast(&o, w.dcast, w.dres, NC);
	st_compute_zero(c, datty, st_mop_bytes(&o, NC));
	st_mop_mm_bwd(&o, ST_OP_MATMUL_BWD, datty, g[BT_PROJ_W], g[BT_PROJ_B], dresc, w.atty,
		      p[BT_PROJ_W], N, C, C);
	// attention; dqkv reuses gel (4NC >= 3NC)
	void *dqkv = w.gel;
	st_compute_zero(c, dqkv, st_mop_bytes(&o, 3 * NC));
	st_mop_attention_bwd(&o, dqkv, datty, w.qkv, w.atty, w.lse, seg, B, T, C, NH);
	st_compute_zero(c, w.dln, st_mop_bytes(&o, NC));
	st_mop_mm_bwd(&o, ST_OP_MATMUL_BWD, w.dln, g[BT_ATTN_W], g[BT_ATTN_B], dqkv, w.ln1,
		      p[BT_ATTN_W], N, C, 3 * C);
	// residual 1: dx = dres + ln1's input gradient
	st_compute_copy(c, dx, w.dres, sizeof(float) * NC);
	st_mop_layernorm_bwd(&o, dx, g[BT_LN1_W], g[BT_LN1_B], w.dln, o.dt, x, p[BT_LN1_W],
			     w.mean1, w.rstd1, N, C);
}

/* ---- embedding and head ----------------------------------------------------------------------- */

/* y (B,T,C) fp32 = wte[tokens] + wpe[t] */
static void gpt2_embed_fwd(const struct st_model *m, const struct st_model_batch *b,
			   const void *params, float *y)
{
	const struct st_mop o = st_mop_of(m);
	const struct st_unit_layout *ul = st_model_unit_layout(m, 0);
	const int C = st_model_config(m)->dim, V = st_model_config(m)->vocab;
	/* wte is (V,C); of wpe (ctx,C) the op reads rows 0..T-1 */
	struct st_op op = {
		.kind = ST_OP_EMBEDDING_FWD,
		.t = { st_tensor_3d(y, ST_DTYPE_F32, b->B, b->T, C),
		       st_tensor_2d(b->tokens, ST_DTYPE_I32, b->B, b->T),
		       st_tensor_2d(st_mop_at(&o, params, ul->tensors[ET_WTE].offset_elems), o.dt,
				    V, C),
		       st_tensor_2d(st_mop_at(&o, params, ul->tensors[ET_WPE].offset_elems), o.dt,
				    b->T, C) },
		.i = { b->B, b->T, C },
	};

	st_compute_run(o.c, &op);
}

/* y (n,C) fp32 = wte[tokens] + wpe[pos + i]: the op on wpe's rows from pos */
static void gpt2_embed_at(const struct st_model *m, const int32_t *tokens, int n, int pos,
			  const void *params, float *y)
{
	const struct st_mop o = st_mop_of(m);
	const struct st_unit_layout *ul = st_model_unit_layout(m, 0);
	const int C = st_model_config(m)->dim, V = st_model_config(m)->vocab;
	const size_t wpe = ul->tensors[ET_WPE].offset_elems + (size_t)pos * C;
	struct st_op op = {
		.kind = ST_OP_EMBEDDING_FWD,
		.t = { st_tensor_3d(y, ST_DTYPE_F32, 1, n, C),
		       st_tensor_2d(tokens, ST_DTYPE_I32, 1, n),
		       st_tensor_2d(st_mop_at(&o, params, ul->tensors[ET_WTE].offset_elems), o.dt,
				    V, C),
		       st_tensor_2d(st_mop_at(&o, params, wpe), o.dt, n, C) },
		.i = { 1, n, C },
	};

	st_compute_run(o.c, &op);
}

/* dout and the gradients are fp32 at every compute dtype */
static void gpt2_embed_bwd(const struct st_model *m, const struct st_model_batch *b,
			   const float *dy, float *grad)
{
	const struct st_unit_layout *ul = st_model_unit_layout(m, 0);

	st_compute_embedding_bwd(st_model_compute(m), grad + ul->tensors[ET_WTE].offset_elems,
				 grad + ul->tensors[ET_WPE].offset_elems, dy, b->tokens, b->B,
				 b->T, st_model_config(m)->dim);
}

/* ln_f (unit U-1: weight, bias) and the tie: W is wte (unit 0) */
static struct st_head gpt2_head(const struct st_model *m, const void *params,
				const void *other, float *grad, float *other_grad)
{
	const struct st_mop o = st_mop_of(m);
	const struct st_unit_layout *ul = st_model_unit_layout(m, st_model_unit_count(m) - 1);
	const size_t wte = st_model_unit_layout(m, 0)->tensors[ET_WTE].offset_elems;
	const size_t lnw = ul->tensors[HT_LNF_W].offset_elems;
	const size_t lnb = ul->tensors[HT_LNF_B].offset_elems;
	struct st_head h = {
		.norm_w = st_mop_at(&o, params, lnw),
		.norm_b = st_mop_at(&o, params, lnb),
		.W = st_mop_at(&o, other, wte),
	};

	if (grad) {
		h.dnorm_w = grad + lnw;
		h.dnorm_b = grad + lnb;
		h.dW = other_grad + wte;
	}
	return h;
}

static const struct st_family_body gpt2_body = {
	.layernorm = true,
	.embed_fwd = gpt2_embed_fwd,
	.embed_bwd = gpt2_embed_bwd,
	.block_carve = gpt2_block_carve,
	.block_fwd = gpt2_block_fwd,
	.block_bwd = gpt2_block_bwd,
	.head = gpt2_head,
	.embed_at = gpt2_embed_at,
	.block_decode = gpt2_block_decode,
};

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
	.layout = gpt2_layout,
	.init_unit = gpt2_init_unit,
	.work_bytes = st_unit_work_bytes,
	.act_bytes = st_unit_act_bytes,
	.batch_check = gpt2_batch_check,
	.fwd = st_unit_fwd,
	.bwd = st_unit_bwd,
	.flops_per_token = gpt2_flops_per_token,
	.logits = st_unit_logits,
	.hf_derived = st_gpt2_hf_derived,
	.saved_bytes = st_unit_saved_bytes,
	.fwd_save = st_unit_fwd_save,
	.bwd_saved = st_unit_bwd_saved,
	.unit_flops_per_token = gpt2_unit_flops_per_token,
	.bf16 = true,
	.body = &gpt2_body,
};
