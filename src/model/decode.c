/* strata: decoding with a KV cache (strata/model.h, st_model_decode_*): the
 * driver over a family body's embed_at and block_decode hooks (body.h).
 * Every step runs through the model's compute (the rotation at absolute
 * positions and the attention over the cache are its ROPE_FWD and
 * DECODE_ATTENTION ops), so the decoder runs where the compute does: host
 * memory it allocates itself (st_model_decode_begin), or a device's memory
 * the caller lends (st_model_decode_begin_in). */
#include "body.h"

#include "strata/model.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct st_decode {
	const struct st_model *m;
	struct st_compute *c;
	int max_T, pos, kv_dim;
	float *cache;    /* per layer: K (max_T, kv_dim), then V */
	/* for steps of up to `rows` tokens, carved by decode_carve() */
	float *x, *y;    /* (rows, C) */
	int32_t *tok;    /* (rows) */
	float *logits;   /* (V) */
	void *work;
	size_t work_bytes;
	int rows;
	void *host;      /* the carving's host block (begin's) */
	bool lent;       /* cache and carving in memory lent (begin_in) */
};

static int head_dim(const struct st_model_config *cfg)
{
	return cfg->head_dim ? cfg->head_dim : cfg->dim / cfg->n_head;
}

int st_decode_kv_dim(const struct st_model_config *cfg)
{
	return (cfg->n_kv_head ? cfg->n_kv_head : cfg->n_head) * head_dim(cfg);
}

size_t st_model_decode_cache_bytes(const struct st_model_config *cfg, int max_tokens)
{
	return (size_t)cfg->n_layer * (size_t)max_tokens * (size_t)st_decode_kv_dim(cfg) * 2 *
	       sizeof(float);
}

/* x, y, the tokens, the logits and the workspace for steps of `rows` tokens
 * carved from base (NULL: the bytes only, returned either way). */
static size_t decode_carve(const struct st_model *m, int rows, void *base, struct st_decode *d)
{
	const struct st_model_config *cfg = st_model_config(m);
	const size_t C = (size_t)cfg->dim;
	struct st_carver cv, wk;
	size_t work;

	st_carver_init(&wk, NULL, 0);
	st_model_family(m)->body->block_carve(m, 1, rows, &wk, &wk);
	work = ST_MAX(wk.need_bytes, st_model_work_bytes(m, st_model_unit_count(m) - 1, 1, 1));
	st_carver_init(&cv, base, base ? SIZE_MAX : 0);
	d->x = st_carve(&cv, C * (size_t)rows);
	d->y = st_carve(&cv, C * (size_t)rows);
	d->tok = (int32_t *)st_carve(&cv, (size_t)rows);
	d->logits = st_carve(&cv, (size_t)cfg->vocab);
	d->work = st_carve(&cv, work / sizeof(float) + 1);
	d->work_bytes = work;
	d->rows = base ? rows : 0;
	return cv.need_bytes;
}

size_t st_model_decode_bytes(const struct st_model *m, int max_tokens, int max_rows)
{
	struct st_decode d;

	if (!st_model_decodes(m))
		return 0;
	return st_align_up(st_model_decode_cache_bytes(st_model_config(m), max_tokens),
			   ST_WORK_ALIGN) +
	       decode_carve(m, max_rows, NULL, &d);
}

bool st_model_decodes(const struct st_model *m)
{
	const struct st_family_body *b = st_model_family(m)->body;

	return b && b->embed_at && b->block_decode &&
	       st_model_precision(m) == ST_PRECISION_FP32;
}

static int decode_check(const struct st_model *m, int max_tokens)
{
	const struct st_model_config *cfg = st_model_config(m);
	const struct st_family_body *b = st_model_family(m)->body;

	if (!b || !b->embed_at || !b->block_decode)
		return st_error_set(-ENOTSUP, "model: the %s family does not decode with a cache",
				    st_model_family(m)->name);
	if (st_model_precision(m) != ST_PRECISION_FP32)
		return st_error_set(-ENOTSUP, "model: the KV cache decodes in fp32 only");
	if (max_tokens < 1 || max_tokens > cfg->ctx)
		return st_error_set(-EINVAL, "model: %d positions to decode: want 1 .. ctx %d",
				    max_tokens, cfg->ctx);
	return 0;
}

static int decode_new(const struct st_model *m, int max_tokens, struct st_decode **out)
{
	struct st_decode *d = calloc(1, sizeof(*d));

	if (!d)
		return st_error_set(-ENOMEM, "out of memory");
	d->m = m;
	d->c = st_model_compute(m);
	d->max_T = max_tokens;
	d->kv_dim = st_decode_kv_dim(st_model_config(m));
	*out = d;
	return 0;
}

int st_model_decode_begin(const struct st_model *m, int max_tokens, struct st_decode **out)
{
	const struct st_model_config *cfg = st_model_config(m);
	int ret;

	*out = NULL;
	if ((ret = decode_check(m, max_tokens)) < 0)
		return ret;
	if (st_model_compute(m) != st_compute_cpu())
		return st_error_set(-ENOTSUP, "model: a decoder in host memory runs on the cpu "
				    "compute (st_model_decode_begin_in lends a device's)");
	if ((ret = decode_new(m, max_tokens, out)) < 0)
		return ret;
	(*out)->cache = malloc(st_model_decode_cache_bytes(cfg, max_tokens));
	if (!(*out)->cache) {
		free(*out);
		*out = NULL;
		return st_error_set(-ENOMEM, "cannot allocate the KV cache (%zu bytes)",
				    st_model_decode_cache_bytes(cfg, max_tokens));
	}
	return 0;
}

int st_model_decode_begin_in(const struct st_model *m, int max_tokens, int max_rows, void *mem,
			     size_t mem_bytes, struct st_decode **out)
{
	size_t need;
	int ret;

	*out = NULL;
	if ((ret = decode_check(m, max_tokens)) < 0)
		return ret;
	need = st_model_decode_bytes(m, max_tokens, max_rows);
	if (max_rows < 1 || max_rows > max_tokens)
		return st_error_set(-EINVAL, "model: steps of %d tokens: want 1 .. %d", max_rows,
				    max_tokens);
	if (!mem || mem_bytes < need)
		return st_error_set(-ENOSPC, "model: the decoder needs %zu bytes, lent %zu", need,
				    mem_bytes);
	if ((ret = decode_new(m, max_tokens, out)) < 0)
		return ret;
	(*out)->cache = mem;
	(*out)->lent = true;
	decode_carve(m, max_rows,
		     (char *)mem + st_align_up(st_model_decode_cache_bytes(st_model_config(m),
									   max_tokens),
					       ST_WORK_ALIGN),
		     *out);
	return 0;
}

/* Room for steps of n tokens: a lent decoder has what it was lent; one in
 * host memory grows its block (the prompt's is the largest, each token's
 * then reuses it). */
static int decode_room(struct st_decode *d, int n)
{
	size_t need;

	if (n <= d->rows)
		return 0;
	if (d->lent)
		return st_error_set(-EINVAL, "model: %d tokens in one step: the decoder was lent "
				    "room for %d", n, d->rows);
	need = decode_carve(d->m, n, NULL, d);
	free(d->host);
	d->host = malloc(need);
	if (!d->host)
		return st_error_set(-ENOMEM, "cannot allocate the decoder's workspace");
	decode_carve(d->m, n, d->host, d);
	return 0;
}

int st_model_decode_step(struct st_decode *d, const void *const *params, const int32_t *tokens,
			 int n, float *logits)
{
	const struct st_model *m = d->m;
	const struct st_family_body *b = st_model_family(m)->body;
	const struct st_model_config *cfg = st_model_config(m);
	const int U = st_model_unit_count(m), rd = st_model_unit_layout(m, U - 1)->reads_unit;
	const size_t C = (size_t)cfg->dim, layer = (size_t)d->max_T * (size_t)d->kv_dim;
	struct st_head h;
	int ret;

	if (n < 1 || n > d->max_T - d->pos)
		return st_error_set(-EINVAL, "model: %d tokens at position %d: past the %d the "
				    "decoder holds", n, d->pos, d->max_T);
	for (int i = 0; i < n; i++)
		if (tokens[i] < 0 || tokens[i] >= cfg->vocab)
			return st_error_set(-EINVAL, "model: token %d out of range [0,%d)",
					    tokens[i], cfg->vocab);
	if ((ret = decode_room(d, n)) < 0)
		return ret;
	st_compute_from_host(d->c, d->tok, tokens, sizeof(int32_t) * (size_t)n);
	b->embed_at(m, d->tok, n, d->pos, params[0], d->x);
	for (int u = 1; u < U - 1; u++) {
		float *kc = d->cache + (size_t)(u - 1) * 2 * layer, *t;
		struct st_carver cv;

		st_carver_init(&cv, d->work, d->work_bytes);
		ret = b->block_decode(m, u, d->pos, n, params[u], d->x, d->y, kc, kc + layer, &cv);
		if (ret == 0)
			ret = st_compute_take_error(d->c);
		if (ret < 0)
			return ret;
		t = d->x;
		d->x = d->y;
		d->y = t;
	}
	d->pos += n;
	h = b->head(m, params[U - 1], rd >= 0 ? params[rd] : NULL, NULL, NULL);
	if ((ret = st_head_logits(m, &h, d->x + (size_t)(n - 1) * C, d->logits, d->work,
				  d->work_bytes)) < 0)
		return ret;
	st_compute_to_host(d->c, logits, d->logits, sizeof(float) * (size_t)cfg->vocab);
	return st_compute_take_error(d->c);
}

int st_model_decode_pos(const struct st_decode *d)
{
	return d->pos;
}

void st_model_decode_end(struct st_decode *d)
{
	if (!d)
		return;
	if (!d->lent) {
		free(d->cache);
		free(d->host);
	}
	free(d);
}
