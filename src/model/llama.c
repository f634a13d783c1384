/* strata: the LLaMA family's math (LlamaForCausalLM, Qwen2ForCausalLM as
 * Hugging Face's modeling code computes them): its units' layouts with
 * Hugging Face's names and nn.Linear shapes (out,in), init, FLOPs, and
 * its body (body.h): the embedding, the decoder layer's workspace, forward
 * and backward written once for every compute dtype, and the head's
 * tensors, run by the shared unit driver (unit.c) and head (head.c); the
 * config is in llama_config.c, the table that joins them at the end of
 * this file.
 *
 * A decoder layer: h = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)),
 * v_proj(n1))) with n1 = RMSNorm(x); y = h + down_proj(silu(gate_proj(n2))
 * * up_proj(n2)) with n2 = RMSNorm(h). Attention is causal with grouped
 * key/value heads; Qwen2 adds biases to q, k and v. The head is the final
 * RMSNorm and lm_head, which is the embedding's matrix when tied (the head
 * reads unit 0, as GPT-2's does) and a tensor of the head's own unit when
 * not (streamed like any unit). */
#include "llama.h"

#include "body.h"

#include "strata/compute.h"
#include "strata/rope.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- layout ------------------------------------------------------------------- */

static int llama_layout(const struct st_model_config *cfg, struct st_unit_layout *units,
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

/* The element offset of each slot of layer unit u's tensors in its flat
 * buffer (-1 for an absent bias), whatever the buffer's dtype. */
static void layer_offsets(const struct st_model *m, int u, int64_t *off)
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

/* 6 x the matmul parameters (the layers' and lm_head) plus causal
 * attention (QK^T and AV over half of the T x T scores, fwd and bwd). */
static double llama_flops_per_token(const struct st_model *m, int T)
{
	const struct st_dims d = st_dims_of(st_model_config(m));
	double per_layer = (double)d.C * d.Q * 2 + (double)d.C * d.KV * 2 + 3.0 * d.C * d.F;
	return 6.0 * (d.L * per_layer + (double)d.V * d.C) + 6.0 * d.L * (double)T * d.Q;
}

/* The same, unit by unit: a layer's matmuls and attention, the head's
 * lm_head, the embedding's none (a lookup). */
static double llama_unit_flops_per_token(const struct st_model *m, int u, int T)
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
static int llama_init_unit(const struct st_model *m, int u, uint64_t seed, float *params)
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

/* Kernels index B*T*F, B*T*Q and B*H*T with int. */
static int llama_batch_check(const struct st_model *m, int B, int T)
{
	const struct st_dims d = st_dims_of(st_model_config(m));
	int64_t wide = ST_MAX(ST_MAX(d.F, d.Q), d.C);

	if ((int64_t)B * T * wide > INT32_MAX || (int64_t)B * d.H * T > INT32_MAX)
		return st_error_set(-EINVAL, "model: batch B=%d T=%d too large for this LLaMA",
				    B, T);
	return 0;
}

/* Buffers of a layer's forward and backward; "dt" ones in the compute
 * dtype (body.h). */
struct layer_work {
	void *xn, *q, *k, *v, *att, *hn, *gate, *up, *act; /* dt: the saved forward */
	float *rstd1, *lse, *h, *rstd2;
	float *dh;                  /* scratch: the residual's gradient */
	void *dn;                   /* scratch, dt: a norm's output gradient */
	void *dcast;                /* scratch, dt: dy or dh cast (none at fp32) */
	void *datt, *dq, *dk, *dv;  /* dt: the attention's gradients */
};

/* The attention's gradients (datt, dq; dk, dv) come after the MLP's
 * backward, when act, gate and up are dead (read for the last time), so
 * they alias those where they fit (F >= Q and F >= 2 KV in every released
 * shape), else they are carved from sc. A sizing pass gives NULL views. */
static void grads_carve(struct st_carver *sc, struct layer_work *w, size_t N,
			const struct st_dims *d, enum st_dtype dt)
{
	const size_t elem = st_dtype_elem_bytes(dt);

	w->datt = d->Q <= d->F ? w->act : st_carve_dt(sc, N * d->Q, dt);
	w->dq = d->Q <= d->F ? w->gate : st_carve_dt(sc, N * d->Q, dt);
	if (2 * d->KV <= d->F) {
		w->dk = w->up;
		w->dv = w->up ? (char *)w->up + N * d->KV * elem : NULL;
	} else {
		w->dk = st_carve_dt(sc, N * d->KV, dt);
		w->dv = st_carve_dt(sc, N * d->KV, dt);
	}
}

/* The forward's buffers (xn .. act: what the backward reads, the part a
 * kept unit saves) from sv, the backward's own from sc. */
static void layer_carve(const struct st_model *m, int B, int T, struct st_carver *sv,
			struct st_carver *sc, struct layer_work *w)
{
	const enum st_dtype dt = st_mop_of(m).dt;
	const struct st_dims d = st_dims_of(st_model_config(m));
	const size_t N = (size_t)B * T;

	w->xn = st_carve_dt(sv, N * d.C, dt);
	w->rstd1 = st_carve(sv, N);
	w->q = st_carve_dt(sv, N * d.Q, dt);
	w->k = st_carve_dt(sv, N * d.KV, dt);
	w->v = st_carve_dt(sv, N * d.KV, dt);
	w->att = st_carve_dt(sv, N * d.Q, dt);
	w->lse = st_carve(sv, (size_t)B * d.H * T);
	w->h = st_carve(sv, N * d.C);
	w->hn = st_carve_dt(sv, N * d.C, dt);
	w->rstd2 = st_carve(sv, N);
	w->gate = st_carve_dt(sv, N * d.F, dt);
	w->up = st_carve_dt(sv, N * d.F, dt);
	w->act = st_carve_dt(sv, N * d.F, dt);
	w->dh = st_carve(sc, N * d.C);
	w->dn = st_carve_dt(sc, N * d.C, dt);
	w->dcast = st_carve_cast(sc, N * d.C, dt);
	grads_carve(sc, w, N, &d, dt);
}

static void llama_block_carve(const struct st_model *m, int B, int T, struct st_carver *sv,
			      struct st_carver *sc)
{
	struct layer_work w;

	layer_carve(m, B, T, sv, sc, &w);
}

/* ---- decoder layer ------------------------------------------------------------------ */

/* A layer's tensors in base (params in the compute dtype, or the fp32
 * gradient) by slot; NULL for an absent bias. */
static void layer_views(const struct st_model *m, int u, const void *base, size_t elem,
			const void **out)
{
	int64_t off[LT_COUNT];

	layer_offsets(m, u, off);
	for (int k = 0; k < LT_COUNT; k++)
		out[k] = off[k] < 0 ? NULL : (const char *)base + (size_t)off[k] * elem;
}

/* The input norm and the q, k, v projections of x (N rows). */
static void layer_qkv(const struct st_model *m, const struct st_mop *o, const void **p,
		      const struct layer_work *w, const float *x, int N)
{
	const struct st_model_config *cfg = st_model_config(m);
	const struct st_dims d = st_dims_of(cfg);
	const enum st_dtype dt = o->dt;

	st_mop_rmsnorm_fwd(o, w->xn, w->rstd1, x, p[LT_IN_NORM], (float)cfg->norm_eps, N, d.C);
	st_mop_mm_fwd(o, ST_OP_LINEAR_FWD, w->q, dt, w->xn, p[LT_Q_W], p[LT_Q_B], N, d.C, d.Q);
	st_mop_mm_fwd(o, ST_OP_LINEAR_FWD, w->k, dt, w->xn, p[LT_K_W], p[LT_K_B], N, d.C, d.KV);
	st_mop_mm_fwd(o, ST_OP_LINEAR_FWD, w->v, dt, w->xn, p[LT_V_W], p[LT_V_B], N, d.C, d.KV);
}

/* After the attention (att): the output projection into oproj ((N,C)
 * fp32 scratch), the residual and post-attention norm, the MLP's gate, up
 * and activation. */
static void layer_after_att(const struct st_model *m, const struct st_mop *o, const void **p,
			    const struct layer_work *w, const float *x, float *oproj, int N)
{
	const struct st_model_config *cfg = st_model_config(m);
	const struct st_dims d = st_dims_of(cfg);
	const float eps = (float)cfg->norm_eps;
	const enum st_dtype dt = o->dt;

	st_mop_mm_fwd(o, ST_OP_LINEAR_FWD, oproj, ST_DTYPE_F32, w->att, p[LT_O_W], NULL, N, d.Q,
		      d.C);
	/* residual and post-attention norm: one op (the same bits as the two) */
	st_mop_residual_rmsnorm_fwd(o, w->h, w->hn, w->rstd2, x, oproj, p[LT_POST_NORM], eps, N,
				    d.C);
	st_mop_mm_fwd(o, ST_OP_LINEAR_FWD, w->gate, dt, w->hn, p[LT_GATE_W], NULL, N, d.C, d.F);
	st_mop_mm_fwd(o, ST_OP_LINEAR_FWD, w->up, dt, w->hn, p[LT_UP_W], NULL, N, d.C, d.F);
	st_mop_swiglu_fwd(o, w->act, w->gate, w->up, (size_t)N * d.F);
}

/* y = h + act @ W_down */
static void layer_out(const struct st_model *m, const struct st_mop *o, const void **p,
		      const struct layer_work *w, float *y, int N)
{
	const struct st_dims d = st_dims_of(st_model_config(m));

	st_mop_mm_fwd(o, ST_OP_LINEAR_FWD, y, ST_DTYPE_F32, w->act, p[LT_DOWN_W], NULL, N, d.F,
		      d.C);
	st_compute_residual_fwd(o->c, y, w->h, y, (size_t)N * d.C);
}

/* The layer's forward up to the MLP activation, shared by fwd and bwd;
 * oproj is (N,C) fp32 scratch for the attention's projection. */
static void layer_fwd_core(const struct st_model *m, const struct st_mop *o, const void **p,
			   const struct layer_work *w, const float *x, float *oproj, int B, int T,
			   const int32_t *seg)
{
	const struct st_model_config *cfg = st_model_config(m);
	const struct st_dims d = st_dims_of(cfg);
	const struct st_rope_args r = st_rope_of(cfg);

	layer_qkv(m, o, p, w, x, B * T);
	st_mop_rope(o, false, w->q, B, T, d.H, d.hd, d.Q, &r);
	st_mop_rope(o, false, w->k, B, T, d.K, d.hd, d.KV, &r);
	st_mop_gqa_fwd(o, w->att, w->lse, w->q, w->k, w->v, seg, B, T, d.H, d.K, d.hd);
	layer_after_att(m, o, p, w, x, oproj, B * T);
}

static void llama_block_fwd(const struct st_model *m, int u, int B, int T, const int32_t *seg,
			    const void *params,
			    const float *x, float *y, struct st_carver *sv, struct st_carver *sc)
{
	const struct st_mop o = st_mop_of(m);
	const void *p[LT_COUNT];
	struct layer_work w;

	layer_carve(m, B, T, sv, sc, &w);
	layer_views(m, u, params, st_dtype_elem_bytes(o.dt), p);
	layer_fwd_core(m, &o, p, &w, x, y, B, T, seg);
	layer_out(m, &o, p, &w, y, B * T);
}

/* The layer on n new rows at positions pos.. with the KV cache: q, k, v,
 * rotated at their absolute positions, k and v appended to the cache, the
 * attention over it (GQA's shared kv heads), the rest as the forward, on
 * the model's compute. fp32 (st_model_decode_begin checks). */
static int llama_block_decode(const struct st_model *m, int u, int pos, int n,
			       const void *params, const float *x, float *y, float *kc,
			       float *vc, struct st_carver *cv)
{
	const struct st_mop o = st_mop_of(m);
	const struct st_model_config *cfg = st_model_config(m);
	const struct st_dims d = st_dims_of(cfg);
	const struct st_rope_args r = st_rope_of(cfg);
	const size_t row = sizeof(float) * (size_t)d.KV;
	const void *p[LT_COUNT];
	struct layer_work w;

	layer_carve(m, 1, n, cv, cv, &w);
	layer_views(m, u, params, st_dtype_elem_bytes(o.dt), p);
	layer_qkv(m, &o, p, &w, x, n);
	st_mop_rope_at(&o, w.q, n, pos, d.H, d.hd, d.Q, &r);
	st_mop_rope_at(&o, w.k, n, pos, d.K, d.hd, d.KV, &r);
	st_compute_copy(o.c, kc + (size_t)pos * d.KV, w.k, row * (size_t)n);
	st_compute_copy(o.c, vc + (size_t)pos * d.KV, w.v, row * (size_t)n);
	st_mop_decode_attention(&o, w.att, w.q, d.Q, kc, vc, pos, n, d.H, d.K, d.hd);
	layer_after_att(m, &o, p, &w, x, y, n);
	layer_out(m, &o, p, &w, y, n);
	return 0;
}

/* The attention's backward: from datt (N,Q) dt to dn (N,C) dt, the input
 * norm's output gradient, through the rotations undone on dq and dk. */
static void layer_bwd_attn(const struct st_model *m, const struct st_mop *o, const void **p,
			   float **g, const struct layer_work *w, int B, int T, const int32_t *seg)
{
	struct st_compute *c = o->c;
	const struct st_model_config *cfg = st_model_config(m);
	const struct st_dims d = st_dims_of(cfg);
	const struct st_rope_args r = st_rope_of(cfg);
	const int N = B * T;
	const enum st_op_kind lin = ST_OP_LINEAR_BWD;

	st_compute_zero(c, w->dq, st_mop_bytes(o, (size_t)N * d.Q));
	st_compute_zero(c, w->dk, st_mop_bytes(o, (size_t)N * d.KV));
	st_compute_zero(c, w->dv, st_mop_bytes(o, (size_t)N * d.KV));
	st_mop_gqa_bwd(o, w->dq, w->dk, w->dv, w->datt, w->q, w->k, w->v, w->att, w->lse, seg, B,
		       T, d.H, d.K, d.hd);
	st_mop_rope(o, true, w->dq, B, T, d.H, d.hd, d.Q, &r);
	st_mop_rope(o, true, w->dk, B, T, d.K, d.hd, d.KV, &r);
	// q, k, v projections into dn
	st_compute_zero(c, w->dn, st_mop_bytes(o, (size_t)N * d.C));
	st_mop_mm_bwd(o, lin, w->dn, g[LT_Q_W], g[LT_Q_B], w->dq, w->xn, p[LT_Q_W], N, d.C, d.Q);
	st_mop_mm_bwd(o, lin, w->dn, g[LT_K_W], g[LT_K_B], w->dk, w->xn, p[LT_K_W], N, d.C,
		      d.KV);
	st_mop_mm_bwd(o, lin, w->dn, g[LT_V_W], g[LT_V_B], w->dv, w->xn, p[LT_V_W], N, d.C,
		      d.KV);
}

static void llama_block_bwd(const struct st_model *m, int u, int B, int T, const int32_t *seg,
			    const void *params,
			    const float *x, const float *dy, float *dx, float *grad,
			    struct st_carver *sv, struct st_carver *sc, bool kept)
{
	const struct st_mop o = st_mop_of(m);
	struct st_compute *c = o.c;
	const struct st_dims d = st_dims_of(st_model_config(m));
	const enum st_op_kind lin = ST_OP_LINEAR_BWD;
	const int N = B * T;
	const size_t NC = (size_t)N * d.C, NF = (size_t)N * d.F;
	const void *p[LT_COUNT];
	float *g[LT_COUNT];
	struct layer_work w;

	layer_carve(m, B, T, sv, sc, &w);
	layer_views(m, u, params, st_dtype_elem_bytes(o.dt), p);
	layer_views(m, u, grad, sizeof(float), (const void **)g);
	if (!kept)
		layer_fwd_core(m, &o, p, &w, x, w.dh, B, T, seg);

	// MLP: dy in dt; down_proj's dW from act, then dact overwrites act
	const void *dyc = st_mop_cast(&o, w.dcast, dy, NC);
	st_mop_mm_bwd(&o, lin, NULL, g[LT_DOWN_W], NULL, dyc, w.act, p[LT_DOWN_W], N, d.F, d.C);
	st_compute_zero(c, w.act, st_mop_bytes(&o, NF));
	st_mop_mm_bwd(&o, lin, w.act, NULL, NULL, dyc, NULL, p[LT_DOWN_W], N, d.F, d.C);
	// SwiGLU: gate and up become their gradients in place
	st_mop_swiglu_bwd(&o, w.gate, w.up, w.act, w.gate, w.up, NF);
	st_compute_zero(c, w.dn, st_mop_bytes(&o, NC));
	st_mop_mm_bwd(&o, lin, w.dn, g[LT_GATE_W], NULL, w.gate, w.hn, p[LT_GATE_W], N, d.C, d.F);
	st_mop_mm_bwd(&o, lin, w.dn, g[LT_UP_W], NULL, w.up, w.hn, p[LT_UP_W], N, d.C, d.F);
	// residual 2: dh = dy + the post-attention norm's input gradient (fp32)
	st_compute_copy(c, w.dh, dy, sizeof(float) * NC);
	st_mop_rmsnorm_bwd(&o, w.dh, g[LT_POST_NORM], w.dn, o.dt, w.h, p[LT_POST_NORM], w.rstd2,
			   N, d.C);
	// attention's projection: dh in dt
	const void *dhc = st_mop_cast(&o, w.dcast, w.dh, NC);
	st_compute_zero(c, w.datt, st_mop_bytes(&o, (size_t)N * d.Q));
	st_mop_mm_bwd(&o, lin, w.datt, g[LT_O_W], NULL, dhc, w.att, p[LT_O_W], N, d.Q, d.C);
	layer_bwd_attn(m, &o, p, g, &w, B, T, seg);
	// residual 1: dx = dh + the input norm's input gradient
	st_compute_copy(c, dx, w.dh, sizeof(float) * NC);
	st_mop_rmsnorm_bwd(&o, dx, g[LT_IN_NORM], w.dn, o.dt, x, p[LT_IN_NORM], w.rstd1, N, d.C);
}

/* ---- embedding and head ------------------------------------------------------------- */

/* y (N,C) fp32 = the embedding rows of the tokens (exact) */
static void llama_embed_fwd(const struct st_model *m, const struct st_model_batch *b,
			    const void *params, float *y)
{
	const struct st_mop o = st_mop_of(m);
	const int C = st_model_config(m)->dim, V = st_model_config(m)->vocab, N = b->B * b->T;
	struct st_op op = {
		.kind = ST_OP_TOKEN_EMBED_FWD,
		.t = { st_tensor_2d(y, ST_DTYPE_F32, N, C), st_tensor_1d(b->tokens, ST_DTYPE_I32, N),
		       st_tensor_2d(params, o.dt, V, C) },
		.i = { N, C },
	};

	st_compute_run(o.c, &op);
}

/* y (n,C) fp32: the embedding rows (no position: RoPE is in the layers) */
static void llama_embed_at(const struct st_model *m, const int32_t *tokens, int n, int pos,
			   const void *params, float *y)
{
	struct st_model_batch b = { .B = 1, .T = n, .tokens = tokens };

	(void)pos;
	llama_embed_fwd(m, &b, params, y);
}

/* dout and the gradient are fp32 at every compute dtype */
static void llama_embed_bwd(const struct st_model *m, const struct st_model_batch *b,
			    const float *dy, float *grad)
{
	st_compute_token_embed_bwd(st_model_compute(m), grad, dy, b->tokens, b->B * b->T,
				   st_model_config(m)->dim);
}

/* model.norm and lm_head: the head's own, or the embedding's matrix when
 * tied */
static struct st_head llama_head(const struct st_model *m, const void *params,
				 const void *other, float *grad, float *other_grad)
{
	const struct st_mop o = st_mop_of(m);
	const struct st_model_config *cfg = st_model_config(m);
	const struct st_unit_layout *ul = st_model_unit_layout(m, st_model_unit_count(m) - 1);
	const size_t nw = ul->tensors[HT_NORM].offset_elems;
	const size_t wo = cfg->untied ? ul->tensors[HT_LM_HEAD].offset_elems :
					st_model_unit_layout(m, 0)->tensors[0].offset_elems;
	struct st_head h = {
		.norm_w = st_mop_at(&o, params, nw),
		.eps = (float)cfg->norm_eps,
		.W = st_mop_at(&o, cfg->untied ? params : other, wo),
	};

	if (grad) {
		h.dnorm_w = grad + nw;
		h.dW = (cfg->untied ? grad : other_grad) + wo;
	}
	return h;
}

static const struct st_family_body llama_body = {
	.layernorm = false,
	.embed_fwd = llama_embed_fwd,
	.embed_bwd = llama_embed_bwd,
	.block_carve = llama_block_carve,
	.block_fwd = llama_block_fwd,
	.block_bwd = llama_block_bwd,
	.head = llama_head,
	.embed_at = llama_embed_at,
	.block_decode = llama_block_decode,
};

/* mistral: a Mistral whose sliding window covers the whole context (null,
 * absent, or >= max_position_embeddings) is a LLaMA (st_llama_hf_config_read) */
static const char *const st_llama_model_types[] = { "llama", "qwen2", "mistral", NULL };
static const char *const st_llama_architectures[] = { "LlamaForCausalLM", "Qwen2ForCausalLM",
						       "MistralForCausalLM", NULL };
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
	.layout = llama_layout,
	.init_unit = llama_init_unit,
	.work_bytes = st_unit_work_bytes,
	.act_bytes = st_unit_act_bytes,
	.batch_check = llama_batch_check,
	.fwd = st_unit_fwd,
	.bwd = st_unit_bwd,
	.flops_per_token = llama_flops_per_token,
	.logits = st_unit_logits,
	.hf_derived = st_llama_hf_derived,
	.saved_bytes = st_unit_saved_bytes,
	.fwd_save = st_unit_fwd_save,
	.bwd_saved = st_unit_bwd_saved,
	.unit_flops_per_token = llama_unit_flops_per_token,
	.bf16 = true,
	.body = &llama_body,
};
