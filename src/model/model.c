/* strata: the model instance (strata/model.h): the layouts its family
 * builds, and the wrappers that check each call and run the family's
 * hooks. Nothing here knows a family's shape. */
#include "strata/family.h"

#include "strata/compute.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct st_model {
	struct st_model_config cfg;
	const struct st_family_ops *family;
	int n_units;
	struct st_unit_layout *units;     /* (n_units) */
	struct st_tensor_layout *tensors; /* all units' tensors, unit order */
	uint64_t param_count;
	struct st_compute *cx; /* where fwd and bwd run; the cpu by default */
	enum st_precision precision; /* the dtypes between ops (fp32 by default) */
};

int st_model_create(const struct st_model_config *cfg, struct st_model **out)
{
	const struct st_family_ops *f = st_model_config_family(cfg);
	int n_units = 0, n_tensors = 0;
	int err = f->config_check(cfg);

	if (err)
		return err;
	err = f->layout(cfg, NULL, NULL, &n_units, &n_tensors);
	if (err)
		return err;
	assert(n_units >= 2);
	struct st_model *m = calloc(1, sizeof(*m));
	if (!m)
		return st_error_set(-ENOMEM, "model: out of memory");
	m->cfg = *cfg;
	m->cfg.family = f;
	m->family = f;
	m->cx = st_compute_cpu();
	m->n_units = n_units;
	m->units = calloc((size_t)n_units, sizeof(*m->units));
	m->tensors = calloc((size_t)ST_MAX(n_tensors, 1), sizeof(*m->tensors));
	if (!m->units || !m->tensors) {
		st_model_destroy(m);
		return st_error_set(-ENOMEM, "model: out of memory");
	}
	err = f->layout(&m->cfg, m->units, m->tensors, &n_units, &n_tensors);
	if (err) {
		st_model_destroy(m);
		return err;
	}
	for (int u = 0; u < m->n_units; u++) {
		struct st_unit_layout *ul = &m->units[u];

		assert(ul->reads_unit >= -1 && ul->reads_unit < m->n_units &&
		       ul->reads_unit != u);
		assert(ul->reads_unit < 0 || m->units[ul->reads_unit].resident);
		ul->elems = st_align_up(ul->elems, ST_MODEL_UNIT_ALIGN_ELEMS);
		m->param_count += ul->param_elems;
	}
	*out = m;
	return 0;
}

void st_model_set_compute(struct st_model *m, struct st_compute *c)
{
	m->cx = c ? c : st_compute_cpu();
}

int st_model_set_precision(struct st_model *m, enum st_precision p)
{
	if (p != ST_PRECISION_FP32 && !m->family->bf16)
		return st_error_set(-ENOTSUP, "--compute-dtype %s: the %s family has no %s path",
				    st_precision_name(p), m->family->title, st_precision_name(p));
	m->precision = p;
	return 0;
}

enum st_precision st_model_precision(const struct st_model *m)
{
	return m->precision;
}

/* Buffers for one dry call: real host memory of the sizes a call at B = T
 * = 1 takes (the dry compute never touches them, so they stay untouched
 * virtual memory). */
static void *dry_buf(void **bufs, int *n, size_t bytes)
{
	void *p = malloc(ST_MAX(bytes, (size_t)64));

	bufs[(*n)++] = p;
	return p;
}

int st_model_precision_check(struct st_model *m)
{
	struct st_compute *real = m->cx, *dry;
	int32_t ids[1] = { 0 };
	struct st_model_batch b = { .B = 1, .T = 1, .tokens = ids, .targets = ids,
				    .loss_scale = 1.0f };
	bool seen[3] = { false, false, false };
	int ret = st_compute_dry_create(real, &dry);

	if (ret < 0)
		return ret;
	m->cx = dry;
	for (int u = 0; u < m->n_units && ret == 0; u++) {
		const struct st_unit_layout *ul = &m->units[u];
		void *bufs[12];
		int nb = 0, k = ul->reads_unit;
		size_t scratch = 0, saved_bytes = st_model_saved_bytes(m, u, 1, 1, &scratch);
		size_t work_bytes = ST_MAX(st_model_work_bytes(m, u, 1, 1), scratch);
		size_t act = ST_MAX(st_model_act_bytes(m, u, 1, 1), (size_t)(m->cfg.dim * 4));
		float loss;

		if (seen[ul->kind])
			continue;
		seen[ul->kind] = true;
		/* one buffer of the larger unit serves params, other and both
		 * gradients: nothing reads or writes them */
		size_t pbytes = ST_MAX(ul->elems, k >= 0 ? m->units[k].elems : 0) * sizeof(float);
		float *pbuf = dry_buf(bufs, &nb, pbytes);
		const float *params = pbuf, *other = k >= 0 ? pbuf : NULL;
		float *grad = pbuf, *ograd = k >= 0 ? pbuf : NULL;
		float *x = dry_buf(bufs, &nb, act), *y = dry_buf(bufs, &nb, act);
		float *dy = dry_buf(bufs, &nb, act), *dx = dry_buf(bufs, &nb, act);
		void *work = dry_buf(bufs, &nb, work_bytes);
		void *saved = saved_bytes ? dry_buf(bufs, &nb, saved_bytes) : NULL;
		bool ok = true;

		for (int i = 0; i < nb; i++)
			ok = ok && bufs[i];
		if (!ok)
			ret = st_error_set(-ENOMEM, "model: out of memory");
		/* the calls a step makes: fwd, bwd, and a kept forward's pair */
		if (ret == 0)
			ret = st_model_fwd(m, u, &b, params, other, ul->kind == ST_UNIT_EMBED ? NULL : x,
					   ul->kind == ST_UNIT_HEAD ? NULL : y, &loss, work,
					   work_bytes);
		if (ret == 0)
			ret = st_model_bwd(m, u, &b, params, other, ul->kind == ST_UNIT_EMBED ? NULL : x,
					   dy, u ? dx : NULL, grad, ograd, &loss, work, work_bytes);
		if (ret == 0 && saved)
			ret = st_model_fwd_save(m, u, &b, params, other, x, y, &loss, saved,
						saved_bytes, work, work_bytes);
		if (ret == 0 && saved)
			ret = st_model_bwd_saved(m, u, &b, params, other, x, dy, dx, grad, ograd,
						 &loss, saved, saved_bytes, work, work_bytes);
		if (ret == 0)
			ret = st_compute_sync(dry);
		for (int i = 0; i < nb; i++)
			free(bufs[i]);
	}
	m->cx = real;
	st_compute_destroy(dry);
	if (ret < 0)
		return st_error_set(ret, "--compute-dtype %s: %s", st_precision_name(m->precision),
				    st_error_last());
	return 0;
}

struct st_compute *st_model_compute(const struct st_model *m)
{
	return m->cx;
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

const struct st_family_ops *st_model_family(const struct st_model *m)
{
	return m->family;
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
	return m->family->flops_per_token(m, T);
}

double st_model_unit_flops_per_token(const struct st_model *m, int u, int T)
{
	int blocks = 0;

	assert(u >= 0 && u < m->n_units);
	if (m->family->unit_flops_per_token)
		return m->family->unit_flops_per_token(m, u, T);
	for (int i = 0; i < m->n_units; i++)
		blocks += m->units[i].kind == ST_UNIT_BLOCK;
	return m->units[u].kind == ST_UNIT_BLOCK ? m->family->flops_per_token(m, T) / blocks : 0.0;
}

int st_model_init_unit(const struct st_model *m, int u, uint64_t seed,
		       float *params)
{
	if (u < 0 || u >= m->n_units)
		return st_error_set(-EINVAL, "model: unit %d out of 0..%d", u,
				    m->n_units - 1);
	return m->family->init_unit(m, u, seed, params);
}

size_t st_model_work_bytes(const struct st_model *m, int u, int B, int T)
{
	assert(u >= 0 && u < m->n_units && B > 0 && T > 0);
	return m->family->work_bytes(m, u, B, T);
}

size_t st_model_act_bytes(const struct st_model *m, int u, int B, int T)
{
	assert(u >= 0 && u < m->n_units && B > 0 && T > 0);
	return u == m->n_units - 1 ? 0 : m->family->act_bytes(m, u, B, T);
}

/* ---- argument checks ------------------------------------------------------------------ */

/* ignored: the value ST_TARGET_IGNORED passes (targets of a masked batch) */
static int ids_check(const int32_t *ids, size_t n, int V, const char *what, bool ignored)
{
	for (size_t i = 0; i < n; i++)
		if ((ids[i] < 0 || ids[i] >= V) && !(ignored && ids[i] == ST_TARGET_IGNORED))
			return st_error_set(-EINVAL, "model: %s[%zu] = %d is outside the vocabulary 0..%d",
					    what, i, ids[i], V - 1);
	return 0;
}

static int call_check(const struct st_model *m, int u,
		      const struct st_model_batch *b, size_t work_bytes,
		      bool bwd, bool kept, size_t saved_bytes)
{
	if (u < 0 || u >= m->n_units)
		return st_error_set(-EINVAL, "model: unit %d out of 0..%d", u,
				    m->n_units - 1);
	if (!b || b->B < 1 || b->T < 1 || b->T > m->cfg.ctx)
		return st_error_set(-EINVAL, "model: batch B=%d T=%d: need B >= 1 and 1 <= T <= ctx (%d)",
				    b ? b->B : 0, b ? b->T : 0, m->cfg.ctx);
	if (m->family->batch_check) {
		int err = m->family->batch_check(m, b->B, b->T);
		if (err)
			return err;
	}
	size_t need = m->family->work_bytes(m, u, b->B, b->T);
	if (kept) {
		size_t saved = m->family->saved_bytes(m, u, b->B, b->T, &need);
		if (saved_bytes < saved)
			return st_error_set(-EINVAL, "model: unit %d keeps %zu bytes of its forward, "
					    "got a saved buffer of %zu", u, saved, saved_bytes);
	}
	if (work_bytes < need)
		return st_error_set(-EINVAL, "model: unit %d needs %zu workspace bytes, got %zu",
				    u, need, work_bytes);
	size_t n = (size_t)b->B * b->T;
	enum st_unit_kind kind = m->units[u].kind;
	if (kind == ST_UNIT_EMBED) {
		if (!b->tokens)
			return st_error_set(-EINVAL, "model: the embedding needs tokens");
		return ids_check(b->host_tokens ? b->host_tokens : b->tokens, n,
				 m->cfg.vocab, "tokens", false);
	}
	if (kind == ST_UNIT_HEAD) {
		if (!b->targets)
			return st_error_set(-EINVAL, "model: the head needs targets");
		if (bwd && (!(b->loss_scale == b->loss_scale) || b->loss_scale == 0.0f ||
			    isinf(b->loss_scale)))
			return st_error_set(-EINVAL, "model: loss_scale must be finite and nonzero, got %g",
					    (double)b->loss_scale);
		return ids_check(b->host_targets ? b->host_targets : b->targets, n,
				 m->cfg.vocab, "targets", b->count > 0);
	}
	return 0;
}

int st_model_fwd(const struct st_model *m, int u,
		 const struct st_model_batch *batch, const void *params,
		 const void *other, const float *x, float *y, float *loss,
		 void *work, size_t work_bytes)
{
	int err = call_check(m, u, batch, work_bytes, false, false, 0);
	if (err)
		return err;
	assert(params);
	assert(m->units[u].reads_unit < 0 || other);
	return m->family->fwd(m, u, batch, params, other, x, y, loss, work, work_bytes);
}

int st_model_bwd(const struct st_model *m, int u,
		 const struct st_model_batch *batch, const void *params,
		 const void *other, const float *x, const float *dy, float *dx,
		 float *grad, float *other_grad, float *loss, void *work,
		 size_t work_bytes)
{
	int err = call_check(m, u, batch, work_bytes, true, false, 0);
	if (err)
		return err;
	assert(params && grad);
	assert(m->units[u].reads_unit < 0 || (other && other_grad));
	return m->family->bwd(m, u, batch, params, other, x, dy, dx, grad, other_grad, loss,
			      work, work_bytes);
}

/* Does unit u keep its forward in saved (the family can, and saved is
 * given)? */
static bool keeps(const struct st_model *m, int u, int B, int T, const void *saved)
{
	size_t scratch;

	return saved && m->family->saved_bytes && m->family->fwd_save && m->family->bwd_saved &&
	       u >= 0 && u < m->n_units && B >= 1 && T >= 1 &&
	       m->family->saved_bytes(m, u, B, T, &scratch) > 0;
}

size_t st_model_saved_bytes(const struct st_model *m, int u, int B, int T,
			    size_t *scratch_bytes)
{
	assert(u >= 0 && u < m->n_units && B >= 1 && T >= 1 && scratch_bytes);
	*scratch_bytes = m->family->work_bytes(m, u, B, T);
	if (!m->family->saved_bytes || !m->family->fwd_save || !m->family->bwd_saved)
		return 0;
	size_t scratch, saved = m->family->saved_bytes(m, u, B, T, &scratch);
	if (saved)
		*scratch_bytes = scratch;
	return saved;
}

int st_model_fwd_save(const struct st_model *m, int u, const struct st_model_batch *batch,
		      const void *params, const void *other, const float *x, float *y,
		      float *loss, void *saved, size_t saved_bytes, void *work,
		      size_t work_bytes)
{
	if (!batch || !keeps(m, u, batch->B, batch->T, saved))
		return st_model_fwd(m, u, batch, params, other, x, y, loss, work, work_bytes);
	int err = call_check(m, u, batch, work_bytes, false, true, saved_bytes);
	if (err)
		return err;
	assert(params);
	assert(m->units[u].reads_unit < 0 || other);
	return m->family->fwd_save(m, u, batch, params, other, x, y, loss, saved, saved_bytes,
				   work, work_bytes);
}

int st_model_bwd_saved(const struct st_model *m, int u, const struct st_model_batch *batch,
		       const void *params, const void *other, const float *x,
		       const float *dy, float *dx, float *grad, float *other_grad,
		       float *loss, void *saved, size_t saved_bytes, void *work,
		       size_t work_bytes)
{
	if (!batch || !keeps(m, u, batch->B, batch->T, saved))
		return st_model_bwd(m, u, batch, params, other, x, dy, dx, grad, other_grad,
				    loss, work, work_bytes);
	int err = call_check(m, u, batch, work_bytes, true, true, saved_bytes);
	if (err)
		return err;
	assert(params && grad);
	assert(m->units[u].reads_unit < 0 || (other && other_grad));
	return m->family->bwd_saved(m, u, batch, params, other, x, dy, dx, grad, other_grad,
				    loss, saved, saved_bytes, work, work_bytes);
}

int st_model_logits(const struct st_model *m, const void *params, const void *other,
		    const float *x, float *logits, void *work, size_t work_bytes)
{
	int H = m->n_units - 1;

	if (!m->family->logits)
		return st_error_set(-ENOTSUP, "model: the %s family does not generate",
				    m->family->name);
	size_t need = m->family->work_bytes(m, H, 1, 1);
	if (work_bytes < need)
		return st_error_set(-EINVAL, "model: unit %d needs %zu workspace bytes, got %zu",
				    H, need, work_bytes);
	assert(params && x && logits);
	assert(m->units[H].reads_unit < 0 || other);
	return m->family->logits(m, params, other, x, logits, work, work_bytes);
}
