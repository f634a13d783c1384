/* strata: decoding with a KV cache (strata/model.h, st_model_decode_*): the
 * driver over a family body's embed_at and block_decode hooks (body.h), and
 * the attention of new rows over the cache and their rotation at absolute
 * positions, on the host. */
#include "body.h"

#include "strata/model.h"
#include "strata/rope.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define ST_DECODE_MAX_HALF 1024 /* hd / 2 at most, as the cpu's rope */

struct st_decode {
	const struct st_model *m;
	int max_T, pos, kv_dim;
	float *cache;    /* per layer: K (max_T, kv_dim), then V */
	float *x, *y;    /* (rows, C) */
	int rows;        /* x, y and work hold this many rows */
	void *work;
	size_t work_bytes;
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

int st_decode_attend(float *out, const float *q, int sq, const float *kc, const float *vc,
		     int pos, int n, int NH, int NKV, int hd)
{
	const int rep = NH / NKV, skv = NKV * hd, nt = omp_get_max_threads();
	const float scale = 1.0f / sqrtf((float)hd);
	/* each thread's scores of one row: pos + n at most */
	float *scores = malloc(sizeof(float) * (size_t)nt * (size_t)(pos + n));

	if (!scores)
		return st_error_set(-ENOMEM, "model: out of memory for the attention's scores");
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
	for (int ih = 0; ih < n * NH; ih++) {
		int i = ih / NH, h = ih % NH, T = pos + i + 1;
		const float *qr = q + (size_t)i * sq + (size_t)h * hd;
		const float *k = kc + (size_t)(h / rep) * hd, *v = vc + (size_t)(h / rep) * hd;
		float *o = out + (size_t)i * NH * hd + (size_t)h * hd, mx = -INFINITY;
		float *s = scores + (size_t)omp_get_thread_num() * (size_t)(pos + n);
		double sum = 0;

		for (int t = 0; t < T; t++) {
			float dot = 0;

			for (int d = 0; d < hd; d++)
				dot += qr[d] * k[(size_t)t * skv + d];
			s[t] = dot * scale;
			mx = s[t] > mx ? s[t] : mx;
		}
		for (int t = 0; t < T; t++) {
			s[t] = expf(s[t] - mx);
			sum += s[t];
		}
		for (int d = 0; d < hd; d++)
			o[d] = 0;
		for (int t = 0; t < T; t++) {
			float w = (float)(s[t] / sum);

			for (int d = 0; d < hd; d++)
				o[d] += w * v[(size_t)t * skv + d];
		}
	}
	free(scores);
	return 0;
}

void st_decode_rope(float *x, int n, int pos, int NH, int hd, int stride,
		    const struct st_rope_args *r)
{
	const int half = hd / 2;
	float inv[ST_DECODE_MAX_HALF], cs[ST_DECODE_MAX_HALF], sn[ST_DECODE_MAX_HALF];

	for (int i = 0; i < half; i++)
		inv[i] = st_rope_inv_freq(i, hd, r->theta, r->type, r->factor,
					  r->low_freq_factor, r->high_freq_factor,
					  r->original_ctx);
	for (int row = 0; row < n; row++) {
		for (int i = 0; i < half; i++)
			st_rope_cos_sin(inv[i], pos + row, &cs[i], &sn[i]);
		for (int h = 0; h < NH; h++) {
			float *o = x + (size_t)row * stride + (size_t)h * hd;

			for (int i = 0; i < half; i++) {
				float x1 = o[i], x2 = o[i + half];

				o[i] = x1 * cs[i] - x2 * sn[i];
				o[i + half] = x2 * cs[i] + x1 * sn[i];
			}
		}
	}
}

int st_model_decode_begin(const struct st_model *m, int max_tokens, struct st_decode **out)
{
	const struct st_model_config *cfg = st_model_config(m);
	const struct st_family_body *b = st_model_family(m)->body;
	struct st_decode *d;

	*out = NULL;
	if (!b || !b->embed_at || !b->block_decode)
		return st_error_set(-ENOTSUP, "model: the %s family does not decode with a cache",
				    st_model_family(m)->name);
	if (st_model_precision(m) != ST_PRECISION_FP32 || st_model_compute(m) != st_compute_cpu())
		return st_error_set(-ENOTSUP, "model: the KV cache decodes in fp32 on the cpu only");
	if (max_tokens < 1 || max_tokens > cfg->ctx)
		return st_error_set(-EINVAL, "model: %d positions to decode: want 1 .. ctx %d",
				    max_tokens, cfg->ctx);
	if (head_dim(cfg) / 2 > ST_DECODE_MAX_HALF)
		return st_error_set(-ENOTSUP, "model: head_dim %d too wide to decode",
				    head_dim(cfg));
	d = calloc(1, sizeof(*d));
	if (!d)
		return st_error_set(-ENOMEM, "out of memory");
	d->m = m;
	d->max_T = max_tokens;
	d->kv_dim = st_decode_kv_dim(cfg);
	d->cache = malloc(st_model_decode_cache_bytes(cfg, max_tokens));
	if (!d->cache) {
		free(d);
		return st_error_set(-ENOMEM, "cannot allocate the KV cache (%zu bytes)",
				    st_model_decode_cache_bytes(cfg, max_tokens));
	}
	*out = d;
	return 0;
}

/* x, y and the workspace for n rows (grown, never shrunk: the prompt's
 * are the largest, each token's then reuse them). */
static int decode_room(struct st_decode *d, int n)
{
	const struct st_model *m = d->m;
	const size_t C = (size_t)st_model_config(m)->dim;
	struct st_carver cv;
	size_t need;

	if (n <= d->rows)
		return 0;
	st_carver_init(&cv, NULL, 0);
	st_model_family(m)->body->block_carve(m, 1, n, &cv, &cv);
	need = ST_MAX(cv.need_bytes, st_model_work_bytes(m, st_model_unit_count(m) - 1, 1, 1));
	free(d->x);
	free(d->y);
	free(d->work);
	d->x = malloc(sizeof(float) * C * (size_t)n);
	d->y = malloc(sizeof(float) * C * (size_t)n);
	d->work = malloc(need);
	d->rows = 0;
	if (!d->x || !d->y || !d->work)
		return st_error_set(-ENOMEM, "cannot allocate the decoder's workspace");
	d->work_bytes = need;
	d->rows = n;
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
	b->embed_at(m, tokens, n, d->pos, params[0], d->x);
	for (int u = 1; u < U - 1; u++) {
		float *kc = d->cache + (size_t)(u - 1) * 2 * layer, *t;
		struct st_carver cv;

		st_carver_init(&cv, d->work, d->work_bytes);
		ret = b->block_decode(m, u, d->pos, n, params[u], d->x, d->y, kc, kc + layer, &cv);
		if (ret == 0)
			ret = st_compute_take_error(st_model_compute(m));
		if (ret < 0)
			return ret;
		t = d->x;
		d->x = d->y;
		d->y = t;
	}
	d->pos += n;
	h = b->head(m, params[U - 1], rd >= 0 ? params[rd] : NULL, NULL, NULL);
	return st_head_logits(m, &h, d->x + (size_t)(n - 1) * C, logits, d->work,
			      d->work_bytes);
}

int st_model_decode_pos(const struct st_decode *d)
{
	return d->pos;
}

void st_model_decode_end(struct st_decode *d)
{
	if (!d)
		return;
	free(d->cache);
	free(d->x);
	free(d->y);
	free(d->work);
	free(d);
}
