/* strata: the LLaMA family's math (LlamaForCausalLM, Qwen2ForCausalLM as
 * Hugging Face's modeling code computes them): its units' layouts with
 * Hugging Face's names and nn.Linear shapes (out,in), init, workspace,
 * fwd(u), bwd(u), logits and FLOPs; the config is in llama_config.c, the
 * table that joins them at the end of this file.
 *
 * A decoder layer: h = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)),
 * v_proj(n1))) with n1 = RMSNorm(x); y = h + down_proj(silu(gate_proj(n2))
 * * up_proj(n2)) with n2 = RMSNorm(h). Attention is causal with grouped
 * key/value heads; Qwen2 adds biases to q, k and v. The head is the final
 * RMSNorm and lm_head, which is the embedding's matrix when tied (the head
 * reads unit 0, as GPT-2's does) and a tensor of the head's own unit when
 * not (streamed like any unit). */
#include "llama.h"
#include "llama_bf16.h"

#include "strata/compute.h"
#include "strata/rope.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- layout ------------------------------------------------------------------- */

static int st_llama_layout(const struct st_model_config *cfg, struct st_unit_layout *units,
			   struct st_tensor_layout *tensors, int *n_units, int *n_tensors)
{
	const struct st_dims d = st_dims_of(cfg);
	const int per_layer = LT_COUNT - (cfg->qkv_bias ? 0 : 3);

	*n_units = d.L + 2;
	*n_tensors = 1 + per_layer * d.L + (cfg->untied ? 2 : 1);
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
			ul->resident = !cfg->untied; /* a tied head reads it */
			st_unit_tensor_add(ul, t++, "model.embed_tokens.weight", d.V, d.C, true);
		} else if (u <= d.L) {
			const struct {
				const char *suffix;
				int64_t d0, d1;
				bool decay;
			} lt[LT_COUNT] = {
				{ "input_layernorm.weight", d.C, 0, false },
				{ "self_attn.q_proj.weight", d.Q, d.C, true },
				{ "self_attn.q_proj.bias", d.Q, 0, false },
				{ "self_attn.k_proj.weight", d.KV, d.C, true },
				{ "self_attn.k_proj.bias", d.KV, 0, false },
				{ "self_attn.v_proj.weight", d.KV, d.C, true },
				{ "self_attn.v_proj.bias", d.KV, 0, false },
				{ "self_attn.o_proj.weight", d.C, d.Q, true },
				{ "post_attention_layernorm.weight", d.C, 0, false },
				{ "mlp.gate_proj.weight", d.F, d.C, true },
				{ "mlp.up_proj.weight", d.F, d.C, true },
				{ "mlp.down_proj.weight", d.C, d.F, true },
			};
			ul->kind = ST_UNIT_BLOCK;
			ul->block = u - 1;
			for (int k = 0; k < LT_COUNT; k++) {
				if (!cfg->qkv_bias && (k == LT_Q_B || k == LT_K_B || k == LT_V_B))
					continue;
				snprintf(name, sizeof(name), "model.layers.%d.%s", u - 1,
					 lt[k].suffix);
				st_unit_tensor_add(ul, t++, name, lt[k].d0, lt[k].d1, lt[k].decay);
			}
		} else {
			ul->kind = ST_UNIT_HEAD;
			ul->block = -1;
			st_unit_tensor_add(ul, t++, "model.norm.weight", d.C, 0, false);
			if (cfg->untied)
				st_unit_tensor_add(ul, t++, "lm_head.weight", d.V, d.C, true);
			else
				ul->reads_unit = 0; /* the tie: logits = norm(x) @ embed^T */
		}
	}
	return 0;
}

void st_llama_layer_offsets(const struct st_model *m, int u, int64_t *off)
{
	const struct st_unit_layout *ul = st_model_unit_layout(m, u);
	const bool bias = st_model_config(m)->qkv_bias;
	int t = 0;
	for (int k = 0; k < LT_COUNT; k++) {
		if (!bias && (k == LT_Q_B || k == LT_K_B || k == LT_V_B)) {
			off[k] = -1;
			continue;
		}
		off[k] = (int64_t)ul->tensors[t++].offset_elems;
	}
	assert(t == ul->n_tensors);
}

/* Pointers to a layer's tensors by slot (NULL for an absent bias). */
static void st_layer_views(const struct st_model *m, int u, const float *base,
			   const float **out)
{
	int64_t off[LT_COUNT];

	st_llama_layer_offsets(m, u, off);
	for (int k = 0; k < LT_COUNT; k++)
		out[k] = off[k] < 0 ? NULL : base + off[k];
}

/* 6 x the matmul parameters (the layers' and lm_head) plus causal
 * attention (QK^T and AV over half of the T x T scores, fwd and bwd). */
static double st_llama_flops_per_token(const struct st_model *m, int T)
{
	const struct st_dims d = st_dims_of(st_model_config(m));
	double per_layer = (double)d.C * d.Q * 2 + (double)d.C * d.KV * 2 + 3.0 * d.C * d.F;
	return 6.0 * (d.L * per_layer + (double)d.V * d.C) + 6.0 * d.L * (double)T * d.Q;
}

/* The same, unit by unit: a layer's matmuls and attention, the head's
 * lm_head, the embedding's none (a lookup). */
static double st_llama_unit_flops_per_token(const struct st_model *m, int u, int T)
{
	const struct st_dims d = st_dims_of(st_model_config(m));
	double per_layer = (double)d.C * d.Q * 2 + (double)d.C * d.KV * 2 + 3.0 * d.C * d.F;

	switch (st_model_unit_layout(m, u)->kind) {
	case ST_UNIT_BLOCK: return 6.0 * per_layer + 6.0 * (double)T * d.Q;
	case ST_UNIT_HEAD: return 6.0 * (double)d.V * d.C;
	default: return 0.0;
	}
}

/* ---- init ----------------------------------------------------------------------- */

#define ST_INIT_CHUNK 65536

/* Hugging Face's _init_weights with initializer_range 0.02: every matrix
 * and the embedding normal(0, 0.02), biases 0, RMSNorm gains 1. */
static int st_llama_init_unit(const struct st_model *m, int u, uint64_t seed, float *params)
{
	const struct st_unit_layout *ul = st_model_unit_layout(m, u);
	memset(params, 0, ul->elems * sizeof(float));
	uint64_t unit_key = st_family_mix64(st_family_mix64(seed) ^ (uint64_t)u);
	for (int k = 0; k < ul->n_tensors; k++) {
		const struct st_tensor_layout *t = &ul->tensors[k];
		float *p = params + t->offset_elems;
		const char *dot = strrchr(t->name, '.');
		if (dot && !strcmp(dot, ".bias"))
			continue; /* zero */
		if (strstr(t->name, "norm")) {
			for (uint64_t i = 0; i < t->n_elems; i++)
				p[i] = 1.0f;
			continue;
		}
		uint64_t tkey = st_family_mix64(unit_key ^ ((uint64_t)k << 32));
		int64_t n_chunks = (int64_t)((t->n_elems + ST_INIT_CHUNK - 1) / ST_INIT_CHUNK);
#pragma omp parallel for schedule(dynamic, 1)
		for (int64_t ch = 0; ch < n_chunks; ch++) {
			uint64_t lo = (uint64_t)ch * ST_INIT_CHUNK;
			uint64_t len = ST_MIN((uint64_t)ST_INIT_CHUNK, t->n_elems - lo);
			st_family_fill_normal(p + lo, len, st_family_mix64(tkey + (uint64_t)ch), 0.02);
		}
	}
	return 0;
}

/* ---- workspace --------------------------------------------------------------------- */

/* (the carver: st_carve(), strata/family.h) */

/* Buffers of a layer's forward and backward (datt, dq, dk, dv alias act,
 * gate and up where they fit: st_layer_carve). */
struct st_layer_work {
	float *xn, *rstd1, *q, *k, *v, *att, *lse, *h, *hn, *rstd2, *gate, *up, *act;
	float *dh, *dn, *datt, *dq, *dk, *dv;
};

/* The forward's buffers (xn .. act: what the backward reads, the part a
 * kept unit saves) from sv, the backward's own from sc; sv and sc are one
 * carver when the backward recomputes the forward. */
static void st_layer_carve(struct st_carver *sv, struct st_carver *sc,
			   struct st_layer_work *w, size_t N, const struct st_dims *d, size_t BHT)
{
	w->xn = st_carve(sv, N * d->C);
	w->rstd1 = st_carve(sv, N);
	w->q = st_carve(sv, N * d->Q);
	w->k = st_carve(sv, N * d->KV);
	w->v = st_carve(sv, N * d->KV);
	w->att = st_carve(sv, N * d->Q);
	w->lse = st_carve(sv, BHT);
	w->h = st_carve(sv, N * d->C);
	w->hn = st_carve(sv, N * d->C);
	w->rstd2 = st_carve(sv, N);
	w->gate = st_carve(sv, N * d->F);
	w->up = st_carve(sv, N * d->F);
	w->act = st_carve(sv, N * d->F);
	w->dh = st_carve(sc, N * d->C);
	w->dn = st_carve(sc, N * d->C);
	ST_LLAMA_GRADS_CARVE(sc, w, N, d);
}

struct st_head_work {
	float *xn, *rstd, *dxn, *logits, *losses;
};

static void st_head_carve(struct st_carver *cv, struct st_head_work *w, size_t N, size_t C,
			  size_t V)
{
	w->xn = st_carve(cv, N * C);
	w->rstd = st_carve(cv, N);
	w->dxn = st_carve(cv, N * C);
	w->logits = st_carve(cv, ST_MIN(N, (size_t)ST_MODEL_CE_CHUNK_ROWS) * V);
	w->losses = st_carve(cv, N);
}

static size_t st_llama_work_bytes(const struct st_model *m, int u, int B, int T)
{
	if (st_model_precision(m) == ST_PRECISION_BF16)
		return st_llama_bf16_work_bytes(m, u, B, T);
	const struct st_dims d = st_dims_of(st_model_config(m));
	struct st_carver cv;
	size_t N = (size_t)B * T;

	st_carver_init(&cv, NULL, 0);
	if (st_model_unit_layout(m, u)->kind == ST_UNIT_BLOCK) {
		struct st_layer_work w;
		st_layer_carve(&cv, &cv, &w, N, &d, (size_t)B * d.H * T);
	} else if (st_model_unit_layout(m, u)->kind == ST_UNIT_HEAD) {
		struct st_head_work w;
		st_head_carve(&cv, &w, N, (size_t)d.C, (size_t)d.V);
	} else {
		return 0;
	}
	return cv.need_bytes;
}

/* A layer keeps xn .. act; its scratch is dh, dn (and the attention's
 * gradients where they do not fit in act, gate and up). The embedding and
 * the head recompute nothing. */
static size_t st_llama_saved_bytes(const struct st_model *m, int u, int B, int T,
				   size_t *scratch_bytes)
{
	if (st_model_precision(m) == ST_PRECISION_BF16)
		return st_llama_bf16_saved_bytes(m, u, B, T, scratch_bytes);
	const struct st_dims d = st_dims_of(st_model_config(m));
	struct st_carver sv, sc;
	struct st_layer_work w;

	if (st_model_unit_layout(m, u)->kind != ST_UNIT_BLOCK) {
		*scratch_bytes = st_llama_work_bytes(m, u, B, T);
		return 0;
	}
	st_carver_init(&sv, NULL, 0);
	st_carver_init(&sc, NULL, 0);
	st_layer_carve(&sv, &sc, &w, (size_t)B * T, &d, (size_t)B * d.H * T);
	*scratch_bytes = sc.need_bytes;
	return sv.need_bytes;
}

/* Every unit's output is (B,T,C). */
static size_t st_llama_act_bytes(const struct st_model *m, int u, int B, int T)
{
	(void)u;
	return (size_t)B * T * st_model_config(m)->dim * sizeof(float);
}

/* Kernels index B*T*F, B*T*Q and B*H*T with int. */
static int st_llama_batch_check(const struct st_model *m, int B, int T)
{
	const struct st_dims d = st_dims_of(st_model_config(m));
	int64_t wide = ST_MAX(ST_MAX(d.F, d.Q), d.C);

	if ((int64_t)B * T * wide > INT32_MAX || (int64_t)B * d.H * T > INT32_MAX)
		return st_error_set(-EINVAL, "model: batch B=%d T=%d too large for this LLaMA",
				    B, T);
	return 0;
}

/* ---- decoder layer ------------------------------------------------------------------ */

/* The layer's forward up to the MLP activation, shared by fwd and bwd;
 * oproj is (N,C) scratch for the attention's projection. */
static void st_layer_fwd_core(const struct st_model *m, const float **p,
			      const struct st_layer_work *w, const float *x, float *oproj,
			      int B, int T)
{
	struct st_compute *c = st_model_compute(m);
	const struct st_model_config *cfg = st_model_config(m);
	const struct st_dims d = st_dims_of(cfg);
	const struct st_rope_args r = st_rope_of(cfg);
	const float eps = (float)cfg->norm_eps;
	const int N = B * T;

	st_compute_rmsnorm_fwd(c, w->xn, w->rstd1, x, p[LT_IN_NORM], eps, N, d.C);
	st_compute_linear_fwd(c, w->q, w->xn, p[LT_Q_W], p[LT_Q_B], N, d.C, d.Q);
	st_compute_linear_fwd(c, w->k, w->xn, p[LT_K_W], p[LT_K_B], N, d.C, d.KV);
	st_compute_linear_fwd(c, w->v, w->xn, p[LT_V_W], p[LT_V_B], N, d.C, d.KV);
	st_compute_rope(c, false, w->q, w->q, B, T, d.H, d.hd, d.Q, &r);
	st_compute_rope(c, false, w->k, w->k, B, T, d.K, d.hd, d.KV, &r);
	st_compute_gqa_attention_fwd(c, w->att, w->lse, w->q, w->k, w->v, B, T, d.H, d.K, d.hd);
	st_compute_linear_fwd(c, oproj, w->att, p[LT_O_W], NULL, N, d.Q, d.C);
	/* residual and post-attention norm: one op (the same bits as the two) */
	st_compute_residual_rmsnorm_fwd(c, w->h, w->hn, w->rstd2, x, oproj, p[LT_POST_NORM], eps,
					N, d.C);
	st_compute_linear_fwd(c, w->gate, w->hn, p[LT_GATE_W], NULL, N, d.C, d.F);
	st_compute_linear_fwd(c, w->up, w->hn, p[LT_UP_W], NULL, N, d.C, d.F);
	st_compute_swiglu_fwd(c, w->act, w->gate, w->up, (size_t)N * d.F);
}

static void st_layer_fwd(const struct st_model *m, int u, int B, int T, const float *params,
			 const float *x, float *y, const struct st_layer_work *w)
{
	struct st_compute *c = st_model_compute(m);
	const struct st_dims d = st_dims_of(st_model_config(m));
	const int N = B * T;
	const float *p[LT_COUNT];

	st_layer_views(m, u, params, p);
	st_layer_fwd_core(m, p, w, x, y, B, T);
	st_compute_linear_fwd(c, y, w->act, p[LT_DOWN_W], NULL, N, d.F, d.C);
	st_compute_residual_fwd(c, y, w->h, y, (size_t)N * d.C);
}

/* kept: w's forward buffers hold this unit's forward (st_layer_fwd ran
 * into them with the same params and x); else they are recomputed. */
static void st_layer_bwd(const struct st_model *m, int u, int B, int T, const float *params,
			 const float *x, const float *dy, float *dx, float *grad,
			 const struct st_layer_work *w, bool kept)
{
	struct st_compute *c = st_model_compute(m);
	const struct st_model_config *cfg = st_model_config(m);
	const struct st_dims d = st_dims_of(cfg);
	const struct st_rope_args r = st_rope_of(cfg);
	const int N = B * T;
	const size_t NC = (size_t)N * d.C, NF = (size_t)N * d.F;
	const float *p[LT_COUNT];
	float *g[LT_COUNT];

	st_layer_views(m, u, params, p);
	st_layer_views(m, u, grad, (const float **)g);
	if (!kept)
		st_layer_fwd_core(m, p, w, x, w->dh, B, T);

	// MLP: down_proj's dW from act, then dact overwrites act
	st_compute_linear_bwd(c, NULL, g[LT_DOWN_W], NULL, dy, w->act, p[LT_DOWN_W], N, d.F,
			      d.C);
	st_compute_zero(c, w->act, sizeof(float) * NF);
	st_compute_linear_bwd(c, w->act, NULL, NULL, dy, NULL, p[LT_DOWN_W], N, d.F, d.C);
	// SwiGLU: gate and up become their gradients in place
	st_compute_swiglu_bwd(c, w->gate, w->up, w->act, w->gate, w->up, NF);
	st_compute_zero(c, w->dn, sizeof(float) * NC);
	st_compute_linear_bwd(c, w->dn, g[LT_GATE_W], NULL, w->gate, w->hn, p[LT_GATE_W], N,
			      d.C, d.F);
	st_compute_linear_bwd(c, w->dn, g[LT_UP_W], NULL, w->up, w->hn, p[LT_UP_W], N, d.C,
			      d.F);
	// residual 2: dh = dy + the post-attention norm's input gradient
	st_compute_copy(c, w->dh, dy, sizeof(float) * NC);
	st_compute_rmsnorm_bwd(c, w->dh, g[LT_POST_NORM], w->dn, w->h, p[LT_POST_NORM],
			       w->rstd2, N, d.C);
	// attention's projection
	st_compute_zero(c, w->datt, sizeof(float) * (size_t)N * d.Q);
	st_compute_linear_bwd(c, w->datt, g[LT_O_W], NULL, w->dh, w->att, p[LT_O_W], N, d.Q,
			      d.C);
	// attention, then the rotations undone on dq and dk
	st_compute_zero(c, w->dq, sizeof(float) * (size_t)N * d.Q);
	st_compute_zero(c, w->dk, sizeof(float) * (size_t)N * d.KV);
	st_compute_zero(c, w->dv, sizeof(float) * (size_t)N * d.KV);
	st_compute_gqa_attention_bwd(c, w->dq, w->dk, w->dv, w->datt, w->q, w->k, w->v, w->att,
				     w->lse, B, T, d.H, d.K, d.hd);
	st_compute_rope(c, true, w->dq, w->dq, B, T, d.H, d.hd, d.Q, &r);
	st_compute_rope(c, true, w->dk, w->dk, B, T, d.K, d.hd, d.KV, &r);
	// q, k, v projections into dn (the input norm's output gradient)
	st_compute_zero(c, w->dn, sizeof(float) * NC);
	st_compute_linear_bwd(c, w->dn, g[LT_Q_W], g[LT_Q_B], w->dq, w->xn, p[LT_Q_W], N, d.C,
			      d.Q);
	st_compute_linear_bwd(c, w->dn, g[LT_K_W], g[LT_K_B], w->dk, w->xn, p[LT_K_W], N, d.C,
			      d.KV);
	st_compute_linear_bwd(c, w->dn, g[LT_V_W], g[LT_V_B], w->dv, w->xn, p[LT_V_W], N, d.C,
			      d.KV);
	// residual 1: dx = dh + the input norm's input gradient
	st_compute_copy(c, dx, w->dh, sizeof(float) * NC);
	st_compute_rmsnorm_bwd(c, dx, g[LT_IN_NORM], w->dn, x, p[LT_IN_NORM], w->rstd1, N, d.C);
}

/* ---- head ----------------------------------------------------------------------------- */

/* lm_head's matrix (V,C) and its gradient: the head's own, or the
 * embedding's when tied. */
static const float *st_head_matrix(const struct st_model *m, const float *params,
				   const float *other)
{
	const struct st_unit_layout *ul = st_model_unit_layout(m, st_model_unit_count(m) - 1);
	if (st_model_config(m)->untied)
		return params + ul->tensors[HT_LM_HEAD].offset_elems;
	return other + st_model_unit_layout(m, 0)->tensors[0].offset_elems;
}

static void st_head_run(const struct st_model *m, const struct st_model_batch *b,
			const float *params, const float *other, const float *x, float *dx,
			float *grad, float *other_grad, float *loss,
			const struct st_head_work *w)
{
	struct st_compute *c = st_model_compute(m);
	const struct st_model_config *cfg = st_model_config(m);
	const int C = cfg->dim, V = cfg->vocab, N = b->B * b->T;
	const struct st_unit_layout *ul = st_model_unit_layout(m, st_model_unit_count(m) - 1);
	const float *nw = params + ul->tensors[HT_NORM].offset_elems;
	const float *W = st_head_matrix(m, params, other);
	const bool bwd = dx != NULL;
	float *dW = NULL;

	if (bwd)
		dW = cfg->untied ? grad + ul->tensors[HT_LM_HEAD].offset_elems :
				   other_grad + st_model_unit_layout(m, 0)->tensors[0].offset_elems;
	st_compute_rmsnorm_fwd(c, w->xn, w->rstd, x, nw, (float)cfg->norm_eps, N, C);
	if (bwd)
		st_compute_zero(c, w->dxn, sizeof(float) * (size_t)N * C);
	const float dloss = b->loss_scale / (float)N;
	for (int r0 = 0; r0 < N; r0 += ST_MODEL_CE_CHUNK_ROWS) {
		int nr = ST_MIN(ST_MODEL_CE_CHUNK_ROWS, N - r0);
		const float *xr = w->xn + (size_t)r0 * C;
		// logits (nr,V) = xn_r (nr,C) @ W^T (C,V)
		st_compute_gemm(c, 0, 1, nr, V, C, xr, C, W, C, 0.0f, w->logits, V);
		if (!bwd) {
			st_compute_crossentropy_fwd(c, w->losses + r0, w->logits, b->targets + r0,
						    nr, V);
			continue;
		}
		st_compute_crossentropy_bwd(c, w->logits, w->losses + r0, w->logits,
					    b->targets + r0, dloss, nr, V);
		// dxn_r (nr,C) += dlogits (nr,V) @ W (V,C)
		st_compute_gemm(c, 0, 0, nr, C, V, w->logits, V, W, C, 1.0f,
				w->dxn + (size_t)r0 * C, C);
		// dW (V,C) += dlogits^T (V,nr) @ xn_r (nr,C)
		st_compute_gemm(c, 1, 0, V, C, nr, w->logits, V, xr, C, 1.0f, dW, C);
	}
	if (loss)
		*loss = st_family_mean_loss(c, w->losses, (size_t)N);
	if (bwd) {
		st_compute_zero(c, dx, sizeof(float) * (size_t)N * C);
		st_compute_rmsnorm_bwd(c, dx, grad + ul->tensors[HT_NORM].offset_elems, w->dxn, x,
				       nw, w->rstd, N, C);
	}
}

/* ---- fwd / bwd -------------------------------------------------------------------------------- */

/* saved NULL: one workspace (the backward recomputes); else a layer's
 * forward buffers are carved from saved and its scratch from work. */
static int st_llama_fwd_save(const struct st_model *m, int u, const struct st_model_batch *batch,
			     const float *params, const float *other, const float *x, float *y,
			     float *loss, void *saved, size_t saved_bytes, void *work,
			     size_t work_bytes)
{
	if (st_model_precision(m) == ST_PRECISION_BF16)
		return st_llama_bf16_fwd_save(m, u, batch, params, other, x, y, loss, saved,
					      saved_bytes, work, work_bytes);
	const int B = batch->B, T = batch->T;
	const struct st_dims d = st_dims_of(st_model_config(m));
	struct st_compute *c = st_model_compute(m);
	struct st_carver cv, cs;

	st_carver_init(&cv, work, work_bytes);
	st_carver_init(&cs, saved, saved_bytes);
	switch (st_model_unit_layout(m, u)->kind) {
	case ST_UNIT_EMBED:
		assert(y);
		st_compute_token_embed_fwd(c, y, batch->tokens, params, B * T, d.C);
		return st_compute_take_error(c);
	case ST_UNIT_BLOCK: {
		assert(x && y);
		struct st_layer_work w;
		st_layer_carve(saved ? &cs : &cv, &cv, &w, (size_t)B * T, &d, (size_t)B * d.H * T);
		st_layer_fwd(m, u, B, T, params, x, y, &w);
		return st_compute_take_error(c);
	}
	case ST_UNIT_HEAD: {
		assert(x && loss);
		struct st_head_work w;
		st_head_carve(&cv, &w, (size_t)B * T, (size_t)d.C, (size_t)d.V);
		st_head_run(m, batch, params, other, x, NULL, NULL, NULL, loss, &w);
		return st_compute_take_error(c);
	}
	}
	return st_error_set(-EINVAL, "model: unit %d has no kind", u);
}

static int st_llama_bwd_saved(const struct st_model *m, int u,
			      const struct st_model_batch *batch, const float *params,
			      const float *other, const float *x, const float *dy, float *dx,
			      float *grad, float *other_grad, float *loss, void *saved,
			      size_t saved_bytes, void *work, size_t work_bytes)
{
	if (st_model_precision(m) == ST_PRECISION_BF16)
		return st_llama_bf16_bwd_saved(m, u, batch, params, other, x, dy, dx, grad,
					       other_grad, loss, saved, saved_bytes, work,
					       work_bytes);
	const int B = batch->B, T = batch->T;
	const struct st_dims d = st_dims_of(st_model_config(m));
	struct st_compute *c = st_model_compute(m);
	struct st_carver cv, cs;

	st_carver_init(&cv, work, work_bytes);
	st_carver_init(&cs, saved, saved_bytes);
	switch (st_model_unit_layout(m, u)->kind) {
	case ST_UNIT_EMBED:
		assert(dy);
		(void)params;
		st_compute_token_embed_bwd(c, grad, dy, batch->tokens, B * T, d.C);
		return st_compute_take_error(c);
	case ST_UNIT_BLOCK: {
		assert(x && dy && dx);
		struct st_layer_work w;
		st_layer_carve(saved ? &cs : &cv, &cv, &w, (size_t)B * T, &d, (size_t)B * d.H * T);
		st_layer_bwd(m, u, B, T, params, x, dy, dx, grad, &w, saved != NULL);
		return st_compute_take_error(c);
	}
	case ST_UNIT_HEAD: {
		assert(x && dx);
		struct st_head_work w;
		st_head_carve(&cv, &w, (size_t)B * T, (size_t)d.C, (size_t)d.V);
		st_head_run(m, batch, params, other, x, dx, grad, other_grad, loss, &w);
		return st_compute_take_error(c);
	}
	}
	return st_error_set(-EINVAL, "model: unit %d has no kind", u);
}

static int st_llama_fwd(const struct st_model *m, int u, const struct st_model_batch *batch,
			const float *params, const float *other, const float *x, float *y,
			float *loss, void *work, size_t work_bytes)
{
	return st_llama_fwd_save(m, u, batch, params, other, x, y, loss, NULL, 0, work,
				 work_bytes);
}

static int st_llama_bwd(const struct st_model *m, int u, const struct st_model_batch *batch,
			const float *params, const float *other, const float *x,
			const float *dy, float *dx, float *grad, float *other_grad,
			float *loss, void *work, size_t work_bytes)
{
	return st_llama_bwd_saved(m, u, batch, params, other, x, dy, dx, grad, other_grad,
				  loss, NULL, 0, work, work_bytes);
}

/* One position's logits: norm(x) @ W^T through the head's workspace at
 * B = T = 1. */
static int st_llama_logits(const struct st_model *m, const float *params, const float *other,
			   const float *x, float *logits, void *work, size_t work_bytes)
{
	if (st_model_precision(m) == ST_PRECISION_BF16)
		return st_llama_bf16_logits(m, params, other, x, logits, work, work_bytes);
	struct st_compute *c = st_model_compute(m);
	const struct st_model_config *cfg = st_model_config(m);
	const int C = cfg->dim, V = cfg->vocab;
	const struct st_unit_layout *ul = st_model_unit_layout(m, st_model_unit_count(m) - 1);
	struct st_carver cv;
	struct st_head_work w;

	st_carver_init(&cv, work, work_bytes);
	st_head_carve(&cv, &w, 1, (size_t)C, (size_t)V);
	st_compute_rmsnorm_fwd(c, w.xn, w.rstd, x, params + ul->tensors[HT_NORM].offset_elems,
			       (float)cfg->norm_eps, 1, C);
	st_compute_gemm(c, 0, 1, 1, V, C, w.xn, C, st_head_matrix(m, params, other), C, 0.0f,
			logits, V);
	return st_compute_sync(c);
}

static const char *const st_llama_model_types[] = { "llama", "qwen2", NULL };
static const char *const st_llama_architectures[] = { "LlamaForCausalLM", "Qwen2ForCausalLM",
						       NULL };
/* What transformers' LLaMA / Qwen2 files may hold besides the model: a
 * tied head's copy of the embedding and, in older files, the rotary
 * inv_freq buffers. (An untied lm_head.weight is the model's own.) */
static const char *const st_llama_hf_derived[] = { "lm_head.weight",
						    "model.layers.*.self_attn.rotary_emb.inv_freq",
						    NULL };

const struct st_family_ops st_family_llama = {
	.name = "llama",
	.abi = ST_FAMILY_ABI,
	.title = "LLaMA",
	.presets = "smollm2-135m,smollm2-360m,smollm2-1.7b,tinyllama-1.1b,llama3.2-1b,"
		   "llama3.2-3b,llama3.1-8b,llama3.1-70b,qwen2.5-0.5b,qwen2.5-7b",
	.hf_model_types = st_llama_model_types,
	.hf_architectures = st_llama_architectures,
	.config_preset = st_llama_config_preset,
	.config_parse = st_llama_config_parse,
	.config_check = st_llama_config_check,
	.config_format = st_llama_config_format,
	.config_describe = st_llama_config_describe,
	.config_fields = st_llama_config_fields,
	.hf_config_read = st_llama_hf_config_read,
	.hf_config_write = st_llama_hf_config_write,
	.hf_config_check = st_llama_hf_config_check,
	.layout = st_llama_layout,
	.init_unit = st_llama_init_unit,
	.work_bytes = st_llama_work_bytes,
	.act_bytes = st_llama_act_bytes,
	.batch_check = st_llama_batch_check,
	.fwd = st_llama_fwd,
	.bwd = st_llama_bwd,
	.flops_per_token = st_llama_flops_per_token,
	.logits = st_llama_logits,
	.hf_derived = st_llama_hf_derived,
	.saved_bytes = st_llama_saved_bytes,
	.fwd_save = st_llama_fwd_save,
	.bwd_saved = st_llama_bwd_saved,
	.unit_flops_per_token = st_llama_unit_flops_per_token,
	.bf16 = true,
};
