/* strata: the one unit driver of every family with a body (body.h): the
 * embed / blocks / head switch, the workspace carving and the kept forward
 * (fwd_save / bwd_saved), behind the st_family_ops hooks, for both compute
 * dtypes. A family gives its embedding, its block and its head's tensors
 * (st_family_ops' body). */
#include "body.h"

#include <assert.h>
#include <errno.h>

static const struct st_family_body *body_of(const struct st_model *m)
{
	const struct st_family_body *b = st_model_family(m)->body;

	assert(b);
	return b;
}

size_t st_unit_work_bytes(const struct st_model *m, int u, int B, int T)
{
	const struct st_family_body *body = body_of(m);
	struct st_carver cv;

	switch (st_model_unit_layout(m, u)->kind) {
	case ST_UNIT_BLOCK:
		st_carver_init(&cv, NULL, 0);
		body->block_carve(m, B, T, &cv, &cv);
		return cv.need_bytes;
	case ST_UNIT_HEAD: return st_head_work_bytes(m, body->layernorm, (size_t)B * T);
	default: return 0;
	}
}

/* A block keeps its forward's buffers; its scratch is the rest. The
 * embedding and the head recompute nothing. */
size_t st_unit_saved_bytes(const struct st_model *m, int u, int B, int T,
			   size_t *scratch_bytes)
{
	struct st_carver sv, sc;

	if (st_model_unit_layout(m, u)->kind != ST_UNIT_BLOCK) {
		*scratch_bytes = st_unit_work_bytes(m, u, B, T);
		return 0;
	}
	st_carver_init(&sv, NULL, 0);
	st_carver_init(&sc, NULL, 0);
	body_of(m)->block_carve(m, B, T, &sv, &sc);
	*scratch_bytes = sc.need_bytes;
	return sv.need_bytes;
}

size_t st_unit_act_bytes(const struct st_model *m, int u, int B, int T)
{
	(void)u;
	return (size_t)B * T * st_model_config(m)->dim * sizeof(float);
}

/* saved NULL: one workspace (the backward recomputes); else a block's
 * forward buffers are carved from saved and its scratch from work. */
int st_unit_fwd_save(const struct st_model *m, int u, const struct st_model_batch *batch,
		     const void *params, const void *other, const float *x, float *y,
		     float *loss, void *saved, size_t saved_bytes, void *work,
		     size_t work_bytes)
{
	const struct st_family_body *body = body_of(m);
	struct st_compute *c = st_model_compute(m);
	struct st_carver cv, cs;

	st_carver_init(&cv, work, work_bytes);
	st_carver_init(&cs, saved, saved_bytes);
	switch (st_model_unit_layout(m, u)->kind) {
	case ST_UNIT_EMBED:
		assert(y);
		body->embed_fwd(m, batch, params, y);
		return st_compute_take_error(c);
	case ST_UNIT_BLOCK:
		assert(x && y);
		body->block_fwd(m, u, batch->B, batch->T, batch->seg, params, x, y, saved ? &cs : &cv, &cv);
		return st_compute_take_error(c);
	case ST_UNIT_HEAD: {
		assert(x && loss);
		struct st_head h = body->head(m, params, other, NULL, NULL);
		st_head_run(m, batch, &h, x, NULL, loss, work, work_bytes);
		return st_compute_take_error(c);
	}
	}
	return st_error_set(-EINVAL, "model: unit %d has no kind", u);
}

int st_unit_bwd_saved(const struct st_model *m, int u, const struct st_model_batch *batch,
		      const void *params, const void *other, const float *x, const float *dy,
		      float *dx, float *grad, float *other_grad, float *loss, void *saved,
		      size_t saved_bytes, void *work, size_t work_bytes)
{
	const struct st_family_body *body = body_of(m);
	struct st_compute *c = st_model_compute(m);
	struct st_carver cv, cs;

	st_carver_init(&cv, work, work_bytes);
	st_carver_init(&cs, saved, saved_bytes);
	switch (st_model_unit_layout(m, u)->kind) {
	case ST_UNIT_EMBED:
		assert(dy);
		body->embed_bwd(m, batch, dy, grad);
		return st_compute_take_error(c);
	case ST_UNIT_BLOCK:
		assert(x && dy && dx);
		body->block_bwd(m, u, batch->B, batch->T, batch->seg, params, x, dy, dx, grad,
				saved ? &cs : &cv, &cv, saved != NULL);
		return st_compute_take_error(c);
	case ST_UNIT_HEAD: {
		assert(x && dx);
		struct st_head h = body->head(m, params, other, grad, other_grad);
		st_head_run(m, batch, &h, x, dx, loss, work, work_bytes);
		return st_compute_take_error(c);
	}
	}
	return st_error_set(-EINVAL, "model: unit %d has no kind", u);
}

int st_unit_fwd(const struct st_model *m, int u, const struct st_model_batch *batch,
		const void *params, const void *other, const float *x, float *y, float *loss,
		void *work, size_t work_bytes)
{
	return st_unit_fwd_save(m, u, batch, params, other, x, y, loss, NULL, 0, work,
				work_bytes);
}

int st_unit_bwd(const struct st_model *m, int u, const struct st_model_batch *batch,
		const void *params, const void *other, const float *x, const float *dy,
		float *dx, float *grad, float *other_grad, float *loss, void *work,
		size_t work_bytes)
{
	return st_unit_bwd_saved(m, u, batch, params, other, x, dy, dx, grad, other_grad, loss,
				 NULL, 0, work, work_bytes);
}

/* One position's logits: norm(x) @ W^T through the head's workspace at
 * B = T = 1. */
int st_unit_logits(const struct st_model *m, const void *params, const void *other,
		   const float *x, float *logits, void *work, size_t work_bytes)
{
	struct st_head h = body_of(m)->head(m, params, other, NULL, NULL);

	return st_head_logits(m, &h, x, logits, work, work_bytes);
}
