/* strata: GPT-2 as a list of units (layouts, init, fwd(u), bwd(u)). */
#include "strata/model.h"

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

struct st_model {
	struct st_model_config cfg;
	int n_units;
	struct st_unit_layout *units;     /* (n_units) */
	struct st_tensor_layout *tensors; /* all units' tensors, unit order */
	uint64_t param_count;
	struct st_compute *cx; /* where fwd and bwd run; the cpu by default */
};

/* ---- config ------------------------------------------------------------------ */

static const struct {
	const char *name;
	struct st_model_config cfg;
} st_presets[] = {
	/* byte-level, for tests and smoke runs */
	{"tiny", {.n_layer = 4, .n_embd = 128, .n_head = 4, .vocab = 256, .ctx = 256}},
	{"gpt2", {.n_layer = 12, .n_embd = 768, .n_head = 12, .vocab = 50257, .ctx = 1024}},
	{"gpt2-medium", {.n_layer = 24, .n_embd = 1024, .n_head = 16, .vocab = 50257, .ctx = 1024}},
	{"gpt2-large", {.n_layer = 36, .n_embd = 1280, .n_head = 20, .vocab = 50257, .ctx = 1024}},
	{"gpt2-xl", {.n_layer = 48, .n_embd = 1600, .n_head = 25, .vocab = 50257, .ctx = 1024}},
};

const char *st_model_preset_list(void)
{
	return "tiny,gpt2,gpt2-medium,gpt2-large,gpt2-xl";
}

/* Limits keep every B*T*4C product and tensor offset far from overflow. */
#define ST_MAX_DIM (1 << 16)
#define ST_MAX_VOCAB (1 << 24)
#define ST_MAX_LAYERS 4096

static int st_config_check(const struct st_model_config *c)
{
	if (c->n_layer < 1 || c->n_layer > ST_MAX_LAYERS)
		return st_error_set(-EINVAL, "model: layers must be in 1..%d, got %d",
				    ST_MAX_LAYERS, c->n_layer);
	if (c->n_embd < 1 || c->n_embd > ST_MAX_DIM)
		return st_error_set(-EINVAL, "model: dim must be in 1..%d, got %d",
				    ST_MAX_DIM, c->n_embd);
	if (c->n_head < 1 || c->n_embd % c->n_head != 0)
		return st_error_set(-EINVAL,
				    "model: heads (%d) must be >= 1 and divide dim (%d)",
				    c->n_head, c->n_embd);
	if (c->vocab < 1 || c->vocab > ST_MAX_VOCAB)
		return st_error_set(-EINVAL, "model: vocab must be in 1..%d, got %d",
				    ST_MAX_VOCAB, c->vocab);
	if (c->ctx < 1 || c->ctx > ST_MAX_DIM)
		return st_error_set(-EINVAL, "model: ctx must be in 1..%d, got %d",
				    ST_MAX_DIM, c->ctx);
	return 0;
}

static int st_parse_posint(const char *s, size_t len, int *out)
{
	long v = 0;
	if (len == 0 || len > 9)
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		v = v * 10 + (s[i] - '0');
	}
	*out = (int)v;
	return 0;
}

int st_model_config_parse(const char *text, struct st_model_config *out)
{
	if (!text || !*text)
		return st_error_set(-EINVAL, "model: empty model name");
	for (size_t i = 0; i < ST_ARRAY_LEN(st_presets); i++) {
		if (strcmp(text, st_presets[i].name) == 0) {
			*out = st_presets[i].cfg;
			return 0;
		}
	}
	if (!strchr(text, '='))
		return st_error_set(-EINVAL,
				    "model: unknown model '%s' (presets: %s, or "
				    "layers=L,dim=C,heads=H,vocab=V,ctx=T)",
				    text, st_model_preset_list());
	static const char *keys[] = {"layers", "dim", "heads", "vocab", "ctx"};
	int vals[5], seen[5] = {0};
	const char *p = text;
	while (*p) {
		const char *comma = strchr(p, ',');
		size_t item_len = comma ? (size_t)(comma - p) : strlen(p);
		const char *eq = memchr(p, '=', item_len);
		if (!eq)
			return st_error_set(-EINVAL, "model: '%.*s' in '%s' is not key=value",
					    (int)item_len, p, text);
		size_t key_len = (size_t)(eq - p);
		int k = -1;
		for (int i = 0; i < 5; i++)
			if (strlen(keys[i]) == key_len && !strncmp(p, keys[i], key_len))
				k = i;
		if (k < 0)
			return st_error_set(-EINVAL,
					    "model: unknown key '%.*s' in '%s' (keys: layers, dim, heads, vocab, ctx)",
					    (int)key_len, p, text);
		if (seen[k])
			return st_error_set(-EINVAL, "model: key '%s' given twice in '%s'",
					    keys[k], text);
		if (st_parse_posint(eq + 1, item_len - key_len - 1, &vals[k]))
			return st_error_set(-EINVAL,
					    "model: '%s' needs a positive integer, got '%.*s'",
					    keys[k], (int)(item_len - key_len - 1), eq + 1);
		seen[k] = 1;
		if (!comma)
			break;
		p = comma + 1;
		if (!*p)
			return st_error_set(-EINVAL, "model: trailing ',' in '%s'", text);
	}
	for (int i = 0; i < 5; i++)
		if (!seen[i])
			return st_error_set(-EINVAL, "model: '%s' lacks key '%s' (need layers, dim, heads, vocab, ctx)",
					    text, keys[i]);
	struct st_model_config c = {.n_layer = vals[0], .n_embd = vals[1],
				    .n_head = vals[2], .vocab = vals[3], .ctx = vals[4]};
	int err = st_config_check(&c);
	if (err)
		return err;
	*out = c;
	return 0;
}

/* ---- layout ------------------------------------------------------------------- */

static void st_tensor_add(struct st_unit_layout *ul, struct st_tensor_layout *t,
			  uint64_t *off, const char *name, int64_t d0, int64_t d1,
			  bool decay)
{
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->ndim = d1 ? 2 : 1;
	t->shape[0] = d0;
	t->shape[1] = d1 ? d1 : 1;
	t->n_elems = (uint64_t)d0 * (uint64_t)(d1 ? d1 : 1);
	t->offset_elems = *off;
	t->decay = decay;
	*off = st_align_up(*off + t->n_elems, ST_MODEL_TENSOR_ALIGN_ELEMS);
	ul->param_elems += t->n_elems;
	ul->n_tensors++;
}

int st_model_create(const struct st_model_config *cfg, struct st_model **out)
{
	int err = st_config_check(cfg);
	if (err)
		return err;
	struct st_model *m = calloc(1, sizeof(*m));
	if (!m)
		return st_error_set(-ENOMEM, "model: out of memory");
	m->cfg = *cfg;
	m->cx = st_compute_cpu();
	const int L = cfg->n_layer;
	const int64_t C = cfg->n_embd, V = cfg->vocab, T = cfg->ctx;
	m->n_units = L + 2;
	m->units = calloc((size_t)m->n_units, sizeof(*m->units));
	m->tensors = calloc((size_t)(ET_COUNT + BT_COUNT * L + HT_COUNT),
			    sizeof(*m->tensors));
	if (!m->units || !m->tensors) {
		st_model_destroy(m);
		return st_error_set(-ENOMEM, "model: out of memory");
	}
	struct st_tensor_layout *t = m->tensors;
	char name[ST_MODEL_NAME_BYTES];
	for (int u = 0; u < m->n_units; u++) {
		struct st_unit_layout *ul = &m->units[u];
		uint64_t off = 0;
		ul->tensors = t;
		ul->reads_unit = u == L + 1 ? 0 : -1; /* the tied head reads wte */
		ul->resident = u == 0;
		if (u == 0) {
			ul->kind = ST_UNIT_EMBED;
			ul->block = -1;
			st_tensor_add(ul, t++, &off, "wte.weight", V, C, true);
			st_tensor_add(ul, t++, &off, "wpe.weight", T, C, true);
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
				st_tensor_add(ul, t++, &off, name, bt[k].d0 * C,
					      bt[k].d1 * C, bt[k].decay);
			}
		} else {
			ul->kind = ST_UNIT_HEAD;
			ul->block = -1;
			st_tensor_add(ul, t++, &off, "ln_f.weight", C, 0, false);
			st_tensor_add(ul, t++, &off, "ln_f.bias", C, 0, false);
		}
		ul->elems = st_align_up(off, ST_MODEL_UNIT_ALIGN_ELEMS);
		m->param_count += ul->param_elems;
	}
	*out = m;
	return 0;
}

void st_model_set_compute(struct st_model *m, struct st_compute *c)
{
	m->cx = c ? c : st_compute_cpu();
}

void st_model_destroy(struct st_model *m)
{
	if (!m)
		return;
	free(m->units);
	free(m->tensors);
	free(m);
}

const struct st_model_config *st_model_config(const struct st_model *m)
{
	return &m->cfg;
}

int st_model_unit_count(const struct st_model *m)
{
	return m->n_units;
}

const struct st_unit_layout *st_model_unit_layout(const struct st_model *m,
						  int u)
{
	assert(u >= 0 && u < m->n_units);
	return &m->units[u];
}

size_t st_model_act_bytes(const struct st_model *m, int u, int B, int T)
{
	assert(u >= 0 && u < m->n_units);
	return u == m->n_units - 1 ? 0 : (size_t)B * T * m->cfg.n_embd * sizeof(float);
}

uint64_t st_model_param_count(const struct st_model *m)
{
	return m->param_count;
}

int st_model_find_tensor(const struct st_model *m, const char *name,
			 int *unit, int *tensor)
{
	for (int u = 0; u < m->n_units; u++)
		for (int k = 0; k < m->units[u].n_tensors; k++)
			if (!strcmp(m->units[u].tensors[k].name, name)) {
				*unit = u;
				*tensor = k;
				return 0;
			}
	return -ENOENT;
}

double st_model_flops_per_token(const struct st_model *m, int T)
{
	const double L = m->cfg.n_layer, C = m->cfg.n_embd, V = m->cfg.vocab;
	double n_mm = L * 12.0 * C * C + V * C;
	return 6.0 * n_mm + 6.0 * L * (double)T * C;
}

/* ---- init ----------------------------------------------------------------------- */

static uint64_t st_mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* ln(s) for s in (0,1] with frexp (exact) and an atanh series in basic
 * operations only: libm's log may differ in the last bit between
 * machines, this does not (IEEE double, no contraction under -std=c11). */
static double st_det_log(double s)
{
	int e;
	double mant = frexp(s, &e); /* s = mant * 2^e, mant in [0.5,1) */
	if (mant < 0.70710678118654752) {
		mant *= 2.0;
		e -= 1;
	}
	double t = (mant - 1.0) / (mant + 1.0), t2 = t * t;
	double sum = 0.0;
	for (int k = 21; k >= 1; k -= 2)
		sum = sum * t2 + 1.0 / (double)k;
	return 2.0 * t * sum + (double)e * 0.69314718055994530942;
}

#define ST_INIT_CHUNK 65536

/* One chunk of normal(0, std) values: Marsaglia's polar method on a
 * splitmix64 stream keyed by (seed, unit, tensor, chunk), so chunks can be
 * filled in parallel and in any order. */
static void st_fill_normal(float *out, size_t n, uint64_t key, double std)
{
	uint64_t state = key;
	size_t i = 0;
	while (i < n) {
		double v1, v2, s;
		do {
			state += 0x9e3779b97f4a7c15ull;
			v1 = (double)(st_mix64(state) >> 11) * 0x1.0p-52 - 1.0;
			state += 0x9e3779b97f4a7c15ull;
			v2 = (double)(st_mix64(state) >> 11) * 0x1.0p-52 - 1.0;
			s = v1 * v1 + v2 * v2;
		} while (s >= 1.0 || s == 0.0);
		double f = sqrt(-2.0 * st_det_log(s) / s);
		out[i++] = (float)(v1 * f * std);
		if (i < n)
			out[i++] = (float)(v2 * f * std);
	}
}

int st_model_init_unit(const struct st_model *m, int u, uint64_t seed,
		       float *params)
{
	if (u < 0 || u >= m->n_units)
		return st_error_set(-EINVAL, "model: unit %d out of 0..%d", u,
				    m->n_units - 1);
	const struct st_unit_layout *ul = &m->units[u];
	memset(params, 0, ul->elems * sizeof(float));
	const double res_scale = 1.0 / sqrt(2.0 * m->cfg.n_layer);
	uint64_t unit_key = st_mix64(st_mix64(seed) ^ (uint64_t)u);
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
		uint64_t tkey = st_mix64(unit_key ^ ((uint64_t)k << 32));
		int64_t n_chunks = (int64_t)((t->n_elems + ST_INIT_CHUNK - 1) / ST_INIT_CHUNK);
#pragma omp parallel for schedule(dynamic, 1)
		for (int64_t ch = 0; ch < n_chunks; ch++) {
			uint64_t lo = (uint64_t)ch * ST_INIT_CHUNK;
			uint64_t len = ST_MIN((uint64_t)ST_INIT_CHUNK, t->n_elems - lo);
			st_fill_normal(p + lo, len, st_mix64(tkey + (uint64_t)ch), std);
		}
	}
	return 0;
}

/* ---- workspace --------------------------------------------------------------------- */

#define ST_WORK_ALIGN 64

struct st_carver {
	char *p;
	size_t left_bytes;
	size_t need_bytes; /* what the carving asked for, fits or not */
};

static float *st_carve(struct st_carver *cv, size_t n_floats)
{
	size_t bytes = st_align_up(n_floats * sizeof(float), ST_WORK_ALIGN);
	cv->need_bytes += bytes;
	if (!cv->p || bytes > cv->left_bytes) {
		cv->p = NULL;
		return NULL;
	}
	float *r = (float *)cv->p;
	cv->p += bytes;
	cv->left_bytes -= bytes;
	return r;
}

static void st_carver_init(struct st_carver *cv, void *work, size_t work_bytes)
{
	cv->need_bytes = ST_WORK_ALIGN; /* room to align the base */
	cv->p = NULL;
	cv->left_bytes = 0;
	if (!work)
		return;
	uintptr_t base = (uintptr_t)work;
	uintptr_t aligned = (base + ST_WORK_ALIGN - 1) & ~(uintptr_t)(ST_WORK_ALIGN - 1);
	if (work_bytes < aligned - base)
		return;
	cv->p = (char *)aligned;
	cv->left_bytes = work_bytes - (aligned - base);
}

/* Buffers of a block's forward and backward. */
struct st_block_work {
	float *ln1, *mean1, *rstd1, *qkv, *atty, *lse, *res, *ln2, *mean2,
		*rstd2, *fch, *gel, *dres, *dln;
};

static void st_block_carve(struct st_carver *cv, struct st_block_work *w,
			   size_t N, size_t C, size_t BH_T)
{
	w->ln1 = st_carve(cv, N * C);
	w->mean1 = st_carve(cv, N);
	w->rstd1 = st_carve(cv, N);
	w->qkv = st_carve(cv, 3 * N * C);
	w->atty = st_carve(cv, N * C);
	w->lse = st_carve(cv, BH_T);
	w->res = st_carve(cv, N * C);
	w->ln2 = st_carve(cv, N * C);
	w->mean2 = st_carve(cv, N);
	w->rstd2 = st_carve(cv, N);
	w->fch = st_carve(cv, 4 * N * C);
	w->gel = st_carve(cv, 4 * N * C);
	w->dres = st_carve(cv, N * C);
	w->dln = st_carve(cv, N * C);
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
	size_t N = (size_t)B * T, C = (size_t)m->cfg.n_embd;
	if (m->units[u].kind == ST_UNIT_BLOCK) {
		struct st_block_work w;
		st_block_carve(&cv, &w, N, C, (size_t)B * m->cfg.n_head * T);
	} else if (m->units[u].kind == ST_UNIT_HEAD) {
		struct st_head_work w;
		st_head_carve(&cv, &w, N, C, (size_t)m->cfg.vocab);
	} else {
		return 0;
	}
	return cv.need_bytes;
}

size_t st_model_work_bytes(const struct st_model *m, int u, int B, int T)
{
	assert(u >= 0 && u < m->n_units && B > 0 && T > 0);
	return st_work_need(m, u, B, T);
}

/* ---- argument checks ------------------------------------------------------------------ */

static int st_ids_check(const int32_t *ids, size_t n, int V, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= V)
			return st_error_set(-EINVAL, "model: %s[%zu] = %d is outside the vocabulary 0..%d",
					    what, i, ids[i], V - 1);
	return 0;
}

static int st_call_check(const struct st_model *m, int u,
			 const struct st_model_batch *b, size_t work_bytes,
			 bool bwd)
{
	if (u < 0 || u >= m->n_units)
		return st_error_set(-EINVAL, "model: unit %d out of 0..%d", u,
				    m->n_units - 1);
	if (!b || b->B < 1 || b->T < 1 || b->T > m->cfg.ctx)
		return st_error_set(-EINVAL, "model: batch B=%d T=%d: need B >= 1 and 1 <= T <= ctx (%d)",
				    b ? b->B : 0, b ? b->T : 0, m->cfg.ctx);
	if ((int64_t)b->B * b->T * 4 * m->cfg.n_embd > INT32_MAX ||
	    (int64_t)b->B * m->cfg.n_head * b->T > INT32_MAX)
		return st_error_set(-EINVAL, "model: batch B=%d T=%d too large for dim %d",
				    b->B, b->T, m->cfg.n_embd);
	size_t need = st_work_need(m, u, b->B, b->T);
	if (work_bytes < need)
		return st_error_set(-EINVAL, "model: unit %d needs %zu workspace bytes, got %zu",
				    u, need, work_bytes);
	size_t n = (size_t)b->B * b->T;
	enum st_unit_kind kind = m->units[u].kind;
	if (kind == ST_UNIT_EMBED) {
		if (!b->tokens)
			return st_error_set(-EINVAL, "model: the embedding needs tokens");
		return st_ids_check(b->host_tokens ? b->host_tokens : b->tokens, n,
				    m->cfg.vocab, "tokens");
	}
	if (kind == ST_UNIT_HEAD) {
		if (!b->targets)
			return st_error_set(-EINVAL, "model: the head needs targets");
		if (bwd && (!(b->loss_scale == b->loss_scale) || b->loss_scale == 0.0f ||
			    isinf(b->loss_scale)))
			return st_error_set(-EINVAL, "model: loss_scale must be finite and nonzero, got %g",
					    (double)b->loss_scale);
		return st_ids_check(b->host_targets ? b->host_targets : b->targets, n,
				    m->cfg.vocab, "targets");
	}
	return 0;
}

/* ---- block --------------------------------------------------------------------------------- */

struct st_block_params {
	const float *t[BT_COUNT];
};

static void st_block_views(const struct st_model *m, int u, const float *params,
			   const float **out)
{
	const struct st_unit_layout *ul = &m->units[u];
	for (int k = 0; k < BT_COUNT; k++)
		out[k] = params + ul->tensors[k].offset_elems;
}

/* The block's forward up to the MLP activation, shared by fwd and bwd.
 * attproj is (N,C) scratch for the attention projection. */
static void st_block_fwd_core(const struct st_model *m, const float **p,
			      const struct st_block_work *w, const float *x,
			      float *attproj, int B, int T)
{
	struct st_compute *c = m->cx;
	const int C = m->cfg.n_embd, NH = m->cfg.n_head, N = B * T;
	// ln1, qkv, attention, projection, residual
	st_compute_layernorm_fwd(c, w->ln1, w->mean1, w->rstd1, x, p[BT_LN1_W],
				 p[BT_LN1_B], N, C);
	st_compute_matmul_fwd(c, w->qkv, w->ln1, p[BT_ATTN_W], p[BT_ATTN_B], N, C, 3 * C);
	st_compute_attention_fwd(c, w->atty, w->lse, w->qkv, B, T, C, NH);
	st_compute_matmul_fwd(c, attproj, w->atty, p[BT_PROJ_W], p[BT_PROJ_B], N, C, C);
	st_compute_residual_fwd(c, w->res, x, attproj, (size_t)N * C);
	// ln2, fc and gelu (one op where the compute fuses them; fch is kept
	// for the backward)
	st_compute_layernorm_fwd(c, w->ln2, w->mean2, w->rstd2, w->res, p[BT_LN2_W],
				 p[BT_LN2_B], N, C);
	st_compute_matmul_gelu_fwd(c, w->gel, w->fch, w->ln2, p[BT_FC_W], p[BT_FC_B], N, C,
				   4 * C);
}

static void st_block_fwd(const struct st_model *m, int u, int B, int T,
			 const float *params, const float *x, float *y,
			 const struct st_block_work *w)
{
	struct st_compute *c = m->cx;
	const int C = m->cfg.n_embd, N = B * T;
	const float *p[BT_COUNT];
	st_block_views(m, u, params, p);
	st_block_fwd_core(m, p, w, x, y, B, T);
	// y = res + gel @ W_fcp + b
	st_compute_matmul_fwd(c, y, w->gel, p[BT_FCP_W], p[BT_FCP_B], N, 4 * C, C);
	st_compute_residual_fwd(c, y, w->res, y, (size_t)N * C);
}

static void st_block_bwd(const struct st_model *m, int u, int B, int T,
			 const float *params, const float *x, const float *dy,
			 float *dx, float *grad, const struct st_block_work *w)
{
	struct st_compute *c = m->cx;
	const int C = m->cfg.n_embd, NH = m->cfg.n_head, N = B * T;
	const size_t NC = (size_t)N * C;
	const struct st_unit_layout *ul = &m->units[u];
	const float *p[BT_COUNT];
	float *g[BT_COUNT];
	st_block_views(m, u, params, p);
	for (int k = 0; k < BT_COUNT; k++)
		g[k] = grad + ul->tensors[k].offset_elems;

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

/* Mean of the per-row losses (device memory), summed in row order in
 * double; brought to the host a chunk at a time (each a wait for the
 * device: 4096 rows, so B x T = 8192 costs two). */
static float st_mean_loss(struct st_compute *c, const float *losses, size_t n)
{
	float chunk[4096];
	double s = 0.0;

	for (size_t i0 = 0; i0 < n; i0 += ST_ARRAY_LEN(chunk)) {
		size_t len = ST_MIN(ST_ARRAY_LEN(chunk), n - i0);

		st_compute_to_host(c, chunk, losses + i0, len * sizeof(float));
		if (c->err)
			return NAN;
		for (size_t i = 0; i < len; i++)
			s += chunk[i];
	}
	return (float)(s / (double)n);
}

static void st_head_run(const struct st_model *m, const struct st_model_batch *b,
			const float *params, const float *tied, const float *x,
			float *dx, float *grad, float *tied_grad, float *loss,
			const struct st_head_work *w)
{
	struct st_compute *c = m->cx;
	const int C = m->cfg.n_embd, V = m->cfg.vocab, N = b->B * b->T;
	const struct st_unit_layout *ul = &m->units[m->n_units - 1];
	const float *lnw = params + ul->tensors[HT_LNF_W].offset_elems;
	const float *lnb = params + ul->tensors[HT_LNF_B].offset_elems;
	const float *wte = tied + m->units[0].tensors[ET_WTE].offset_elems;
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
		float *dwte = tied_grad + m->units[0].tensors[ET_WTE].offset_elems;
		st_compute_gemm(c, 1, 0, V, C, nr, w->logits, V, xr, C, 1.0f,
				dwte, C);
	}
	if (loss)
		*loss = st_mean_loss(c, w->losses, (size_t)N);
	if (bwd) {
		st_compute_zero(c, dx, sizeof(float) * (size_t)N * C);
		st_compute_layernorm_bwd(c, dx, grad + ul->tensors[HT_LNF_W].offset_elems,
					 grad + ul->tensors[HT_LNF_B].offset_elems,
					 w->dxln, x, lnw, w->mean, w->rstd, N, C);
	}
}

/* ---- fwd / bwd -------------------------------------------------------------------------------- */

int st_model_fwd(const struct st_model *m, int u,
		 const struct st_model_batch *batch, const float *params,
		 const float *tied, const float *x, float *y, float *loss,
		 void *work, size_t work_bytes)
{
	int err = st_call_check(m, u, batch, work_bytes, false);
	if (err)
		return err;
	const int B = batch->B, T = batch->T, C = m->cfg.n_embd;
	struct st_compute *c = m->cx;
	struct st_carver cv;
	st_carver_init(&cv, work, work_bytes);
	assert(params);
	switch (m->units[u].kind) {
	case ST_UNIT_EMBED: {
		assert(y);
		const struct st_unit_layout *ul = &m->units[0];
		st_compute_embedding_fwd(c, y, batch->tokens,
					 params + ul->tensors[ET_WTE].offset_elems,
					 params + ul->tensors[ET_WPE].offset_elems, B,
					 T, C);
		return st_compute_take_error(c);
	}
	case ST_UNIT_BLOCK: {
		assert(x && y);
		struct st_block_work w;
		st_block_carve(&cv, &w, (size_t)B * T, (size_t)C,
			       (size_t)B * m->cfg.n_head * T);
		st_block_fwd(m, u, B, T, params, x, y, &w);
		return st_compute_take_error(c);
	}
	case ST_UNIT_HEAD: {
		assert(x && tied && loss);
		struct st_head_work w;
		st_head_carve(&cv, &w, (size_t)B * T, (size_t)C,
			      (size_t)m->cfg.vocab);
		st_head_run(m, batch, params, tied, x, NULL, NULL, NULL, loss, &w);
		return st_compute_take_error(c);
	}
	}
	return st_error_set(-EINVAL, "model: unit %d has no kind", u);
}

int st_model_bwd(const struct st_model *m, int u,
		 const struct st_model_batch *batch, const float *params,
		 const float *tied, const float *x, const float *dy, float *dx,
		 float *grad, float *tied_grad, float *loss, void *work,
		 size_t work_bytes)
{
	int err = st_call_check(m, u, batch, work_bytes, true);
	if (err)
		return err;
	const int B = batch->B, T = batch->T, C = m->cfg.n_embd;
	struct st_compute *c = m->cx;
	struct st_carver cv;
	st_carver_init(&cv, work, work_bytes);
	assert(params && grad);
	switch (m->units[u].kind) {
	case ST_UNIT_EMBED: {
		assert(dy);
		const struct st_unit_layout *ul = &m->units[0];
		st_compute_embedding_bwd(c, grad + ul->tensors[ET_WTE].offset_elems,
					 grad + ul->tensors[ET_WPE].offset_elems, dy,
					 batch->tokens, B, T, C);
		return st_compute_take_error(c);
	}
	case ST_UNIT_BLOCK: {
		assert(x && dy && dx);
		struct st_block_work w;
		st_block_carve(&cv, &w, (size_t)B * T, (size_t)C,
			       (size_t)B * m->cfg.n_head * T);
		st_block_bwd(m, u, B, T, params, x, dy, dx, grad, &w);
		return st_compute_take_error(c);
	}
	case ST_UNIT_HEAD: {
		assert(x && dx && tied && tied_grad);
		struct st_head_work w;
		st_head_carve(&cv, &w, (size_t)B * T, (size_t)C,
			      (size_t)m->cfg.vocab);
		st_head_run(m, batch, params, tied, x, dx, grad, tied_grad, loss, &w);
		return st_compute_take_error(c);
	}
	}
	return st_error_set(-EINVAL, "model: unit %d has no kind", u);
}
