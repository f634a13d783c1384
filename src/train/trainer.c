/* The in-memory trainer: every state of every unit in host RAM, the step of
 * docs/design.md run unit by unit. The reference the tiered engine matches
 * bit for bit. */
#include "strata/train.h"
#include "strata/ckpt.h"
#include "strata/io.h"
#include "strata/kernels.h"
#include "strata/optim.h"
#include "strata/weights.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct st_trainer {
	struct st_train_config cfg;
	struct st_model *model;
	int U;             /* units */
	uint64_t *elems;   /* per unit flat length */
	float **P, **M, **V, **G;
	void **W;          /* bf16 (uint16_t) or fp32 working weights */
	float *wf;         /* fp32 compute copy of the unit being run */
	float **wr;        /* fp32 copy of each resident unit (another reads it), else NULL */
	size_t x_elems;    /* the largest unit output, in floats */
	float *acts;       /* x[1..U-1], each x_elems */
	float *dA, *dB;    /* x_elems each: gradient ping-pong */
	void *work;
	size_t work_bytes;
	int32_t *tokens, *targets; /* (B,T) */
	int32_t *seg;              /* (B,T): --packing isolated's, else NULL */
	float *losses;             /* (B,T): the head's per-target losses */
};

void st_train_config_default(struct st_train_config *c)
{
	memset(c, 0, sizeof(*c));
	st_model_config_parse("tiny", &c->model);
	c->batch = 8;
	c->seq = 128;
	c->grad_accum = 1;
	c->lr = 1e-3;
	c->min_lr_frac = 0.1;
	c->schedule = ST_LR_COSINE;
	c->warmup = 10;
	c->steps = 100;
	c->wd = 0.1;
	c->beta1 = 0.9;
	c->beta2 = 0.95;
	c->eps = 1e-8;
	c->clip = 1.0;
	c->seed = 1337;
	c->bf16 = true;
}

static float *act(struct st_trainer *t, int u) /* input of unit u, u >= 1 */
{
	return t->acts + (size_t)(u - 1) * t->x_elems;
}

/* W[u] as fp32 into dst (once per use); at bf16 compute as bf16 (a copy of
 * bf16 W, fp32 W rounded), what the model's bf16 path reads. */
static void widen(struct st_trainer *t, int u, float *dst)
{
	if (st_model_precision(t->model) == ST_PRECISION_BF16) {
		if (t->cfg.bf16)
			memcpy(dst, t->W[u], t->elems[u] * sizeof(uint16_t));
		else
			st_cpu_f32_to_bf16((uint16_t *)(void *)dst, t->W[u], t->elems[u]);
		return;
	}
	if (t->cfg.bf16)
		st_cpu_bf16_to_f32(dst, t->W[u], t->elems[u]);
	else
		memcpy(dst, t->W[u], t->elems[u] * sizeof(float));
}

/* W[u] from P[u] with the optimizer's rounding (init and load). */
static void narrow(struct st_trainer *t, int u)
{
	if (t->cfg.bf16)
		st_cpu_f32_to_bf16(t->W[u], t->P[u], t->elems[u]);
	else
		memcpy(t->W[u], t->P[u], t->elems[u] * sizeof(float));
}

static void *xcalloc(size_t n, size_t size, int *err)
{
	void *p;

	if (*err)
		return NULL;
	/* 4 KiB aligned, zeroed: flat buffers move as pages later. */
	size_t bytes = n * size;

	if (posix_memalign(&p, ST_PAGE_BYTES, st_align_up(bytes ? bytes : 1, 64))) {
		*err = -ENOMEM;
		return NULL;
	}
	memset(p, 0, n * size);
	return p;
}

void st_trainer_destroy(struct st_trainer *t)
{
	if (!t)
		return;
	for (int u = 0; u < t->U; u++) {
		if (t->P)
			free(t->P[u]);
		if (t->M)
			free(t->M[u]);
		if (t->V)
			free(t->V[u]);
		if (t->G)
			free(t->G[u]);
		if (t->W)
			free(t->W[u]);
		if (t->wr)
			free(t->wr[u]);
	}
	free(t->P);
	free(t->M);
	free(t->V);
	free(t->G);
	free(t->W);
	free(t->elems);
	free(t->wf);
	free(t->wr);
	free(t->acts);
	free(t->dA);
	free(t->dB);
	free(t->work);
	free(t->tokens);
	free(t->targets);
	free(t->seg);
	free(t->losses);
	st_model_destroy(t->model);
	free(t);
}

int st_trainer_create(const struct st_train_config *cfg, struct st_trainer **out)
{
	struct st_trainer *t;
	uint64_t max_elems = 0;
	int err = 0, ret;

	*out = NULL;
	if (cfg->batch <= 0 || cfg->seq <= 0 || cfg->grad_accum <= 0)
		return st_error_set(-EINVAL, "batch, seq and grad-accum must be positive");
	if (cfg->seq > cfg->model.ctx)
		return st_error_set(-EINVAL, "--seq %d is longer than the model's context of %d",
				    cfg->seq, cfg->model.ctx);
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->cfg = *cfg;
	ret = st_model_create(&cfg->model, &t->model);
	if (ret < 0) {
		free(t);
		return ret;
	}
	t->U = st_model_unit_count(t->model);
	t->elems = calloc((size_t)t->U, sizeof(*t->elems));
	t->P = calloc((size_t)t->U, sizeof(float *));
	t->M = calloc((size_t)t->U, sizeof(float *));
	t->V = calloc((size_t)t->U, sizeof(float *));
	t->G = calloc((size_t)t->U, sizeof(float *));
	t->W = calloc((size_t)t->U, sizeof(void *));
	t->wr = calloc((size_t)t->U, sizeof(float *));
	if (!t->elems || !t->P || !t->M || !t->V || !t->G || !t->W || !t->wr) {
		st_trainer_destroy(t);
		return -ENOMEM;
	}
	for (int u = 0; u < t->U; u++) {
		size_t work = st_model_work_bytes(t->model, u, cfg->batch, cfg->seq);

		t->elems[u] = st_model_unit_layout(t->model, u)->elems;
		max_elems = ST_MAX(max_elems, t->elems[u]);
		t->work_bytes = ST_MAX(t->work_bytes, work);
		t->P[u] = xcalloc(t->elems[u], sizeof(float), &err);
		t->M[u] = xcalloc(t->elems[u], sizeof(float), &err);
		t->V[u] = xcalloc(t->elems[u], sizeof(float), &err);
		t->G[u] = xcalloc(t->elems[u], sizeof(float), &err);
		t->W[u] = xcalloc(t->elems[u], cfg->bf16 ? 2 : 4, &err);
		if (st_model_unit_layout(t->model, u)->resident)
			t->wr[u] = xcalloc(t->elems[u], sizeof(float), &err);
		t->x_elems = ST_MAX(t->x_elems, st_model_act_bytes(t->model, u, cfg->batch,
								   cfg->seq) / sizeof(float));
	}
	t->wf = xcalloc(max_elems, sizeof(float), &err);
	t->acts = xcalloc(t->x_elems * (size_t)(t->U - 1), sizeof(float), &err);
	t->dA = xcalloc(t->x_elems, sizeof(float), &err);
	t->dB = xcalloc(t->x_elems, sizeof(float), &err);
	t->work = xcalloc(t->work_bytes, 1, &err);
	t->tokens = xcalloc((size_t)cfg->batch * cfg->seq, sizeof(int32_t), &err);
	t->targets = xcalloc((size_t)cfg->batch * cfg->seq, sizeof(int32_t), &err);
	if (cfg->isolate)
		t->seg = xcalloc((size_t)cfg->batch * cfg->seq, sizeof(int32_t), &err);
	t->losses = xcalloc((size_t)cfg->batch * cfg->seq, sizeof(float), &err);
	if (err) {
		st_trainer_destroy(t);
		return st_error_set(err, "cannot allocate the model's buffers");
	}
	for (int u = 0; u < t->U; u++) {
		ret = st_model_init_unit(t->model, u, cfg->seed, t->P[u]);
		if (ret < 0) {
			st_trainer_destroy(t);
			return ret;
		}
		narrow(t, u);
	}
	*out = t;
	return 0;
}

const struct st_model *st_trainer_model(const struct st_trainer *t)
{
	return t->model;
}

int st_trainer_set_precision(struct st_trainer *t, enum st_precision p)
{
	size_t need = 0;
	int ret = st_model_set_precision(t->model, p);

	if (ret == 0 && p != ST_PRECISION_FP32)
		ret = st_model_precision_check(t->model);
	if (ret < 0)
		return ret;
	for (int u = 0; u < t->U; u++)
		need = ST_MAX(need, st_model_work_bytes(t->model, u, t->cfg.batch, t->cfg.seq));
	if (need > t->work_bytes) {
		void *w = calloc(need, 1);

		if (!w)
			return st_error_set(-ENOMEM, "cannot allocate the model's workspace");
		free(t->work);
		t->work = w;
		t->work_bytes = need;
	}
	return 0;
}

int st_trainer_read_master(const struct st_trainer *t, int u, float *p)
{
	if (u < 0 || u >= t->U)
		return -EINVAL;
	memcpy(p, t->P[u], t->elems[u] * sizeof(float));
	return 0;
}

int st_trainer_write_master(struct st_trainer *t, int u, const float *p)
{
	if (u < 0 || u >= t->U)
		return -EINVAL;
	memcpy(t->P[u], p, t->elems[u] * sizeof(float));
	narrow(t, u);
	return 0;
}

/* Unit u's fp32 weights: a resident unit's copy (widened by the forward,
 * kept to the end of the backward), else W[u] widened into wf now. */
static float *weights(struct st_trainer *t, int u)
{
	if (t->wr[u])
		return t->wr[u];
	widen(t, u, t->wf);
	return t->wf;
}

int st_trainer_unit_weights(struct st_trainer *t, int u, void *dst)
{
	if (u < 0 || u >= t->U)
		return -EINVAL;
	widen(t, u, dst);
	return 0;
}

/* The weights unit u reads of another unit (layout.reads_unit), or NULL. */
static const float *other_of(struct st_trainer *t, int u)
{
	int k = st_model_unit_layout(t->model, u)->reads_unit;

	return k >= 0 ? t->wr[k] : NULL;
}

/* Forward of every unit but the last; leaves x[1..U-1] in acts and each
 * resident unit's fp32 weights in wr. */
static int forward_body(struct st_trainer *t, const struct st_model_batch *b)
{
	int ret = 0;

	for (int u = 0; ret == 0 && u < t->U - 1; u++) {
		if (t->wr[u])
			widen(t, u, t->wr[u]);
		ret = st_model_fwd(t->model, u, b, weights(t, u), other_of(t, u),
				   u ? act(t, u) : NULL, act(t, u + 1), NULL, t->work,
				   t->work_bytes);
	}
	return ret;
}

/* One micro-batch's forward and backward; *loss: its mean loss, or with a
 * loss mask (count > 0) the sum of its losses (in double, as the engine). */
static int micro_step(struct st_trainer *t, struct st_loader *ld, float loss_scale,
		      uint64_t count, double *loss)
{
	struct st_model_batch b = { .B = t->cfg.batch, .T = t->cfg.seq, .tokens = t->tokens,
				    .targets = t->targets, .loss_scale = loss_scale,
				    .losses = t->losses, .count = count, .seg = t->seg };
	int H = t->U - 1, ret;
	float l = 0, *dy = NULL, *dx = t->dA;

	st_loader_next_seg(ld, t->tokens, t->targets, t->seg);
	ret = forward_body(t, &b);
	/* Backward from the last unit, whose backward computes its forward
	 * (and the loss) itself; each unit's dx is the previous one's dy. */
	for (int u = H; ret == 0 && u >= 0; u--) {
		int k = st_model_unit_layout(t->model, u)->reads_unit;

		ret = st_model_bwd(t->model, u, &b, weights(t, u), other_of(t, u),
				   u ? act(t, u) : NULL, dy, u ? dx : NULL, t->G[u],
				   k >= 0 ? t->G[k] : NULL, u == H ? &l : NULL, t->work,
				   t->work_bytes);
		dy = dx;
		dx = dx == t->dA ? t->dB : t->dA;
	}
	*loss = count ? st_model_sum_losses(t->losses, (size_t)b.B * (size_t)b.T) : l;
	return ret;
}

int st_trainer_step(struct st_trainer *t, struct st_loader *ld, int step,
		    struct st_step_result *res)
{
	const struct st_train_config *c = &t->cfg;
	struct st_adam_step with_wd, without_wd;
	double loss_sum = 0, sumsq = 0;
	/* a loss mask: the step's counted targets, the loss's divisor */
	const bool masked = st_loader_masked(ld);
	const uint64_t count = masked ? st_loader_count(ld, (uint32_t)c->grad_accum) : 0;
	int ret;

	memset(res, 0, sizeof(*res));
	for (int u = 0; u < t->U; u++)
		memset(t->G[u], 0, t->elems[u] * sizeof(float));
	for (int a = 0; a < c->grad_accum; a++) {
		double l;

		/* masked: loss_scale 1 over the count (1 when none: every
		 * target ignored, the gradients 0) */
		ret = micro_step(t, ld, masked ? 1.0f : 1.0f / (float)c->grad_accum,
				 masked ? ST_MAX(count, 1) : 0, &l);
		if (ret < 0)
			return ret;
		loss_sum += l;
	}
	res->loss = !masked ? loss_sum / c->grad_accum : count ? loss_sum / (double)count : 0.0;
	res->lr = st_lr_at(c, step);
	if (masked && !count) { /* nothing to learn: no update */
		res->empty = true;
		return 0;
	}
	/* Global norm: whole units, in unit order, fp64: deterministic. */
	for (int u = 0; u < t->U; u++) {
		double s;

		ret = st_grad_sumsq(t->G[u], ST_OPTIM_F32, t->elems[u], &s);
		if (ret == -ERANGE) {
			res->grad_norm = NAN;
			res->skipped = true;
			return 0;
		}
		if (ret < 0)
			return ret;
		sumsq += s;
	}
	res->grad_norm = sqrt(sumsq);
	ret = st_train_adam_prep(c, step, res->grad_norm, &with_wd, &without_wd);
	if (ret < 0)
		return ret;
	for (int u = 0; u < t->U; u++) {
		const struct st_unit_layout *ul = st_model_unit_layout(t->model, u);

		for (int i = 0; i < ul->n_tensors; i++) {
			const struct st_tensor_layout *tl = &ul->tensors[i];
			size_t o = tl->offset_elems;
			struct st_adam_bufs bufs = {
				.g = t->G[u] + o, .g_dtype = ST_OPTIM_F32, .p = t->P[u] + o,
				.m = t->M[u] + o, .v = t->V[u] + o,
				.w = c->bf16 ? (void *)((uint16_t *)t->W[u] + o)
					     : (void *)((float *)t->W[u] + o),
				.w_dtype = c->bf16 ? ST_OPTIM_BF16 : ST_OPTIM_F32,
			};

			/* The norm pass already proved G finite. */
			ret = st_adam_apply(tl->decay ? &with_wd : &without_wd, &bufs, tl->n_elems,
					    ST_ADAM_GRAD_CHECKED, NULL);
			if (ret < 0)
				return ret;
		}
	}
	return 0;
}

/* The next batch of ld through the forward and the head: its loss in *l
 * (the mean, or with b->losses the per-token losses there). */
static int eval_batch(struct st_trainer *t, struct st_loader *ld, const struct st_model_batch *b,
		      float *l)
{
	int H = t->U - 1, ret;

	st_loader_next(ld, t->tokens, t->targets);
	ret = forward_body(t, b);
	if (ret == 0)
		ret = st_model_fwd(t->model, H, b, weights(t, H), other_of(t, H), act(t, H), NULL,
				   l, t->work, t->work_bytes);
	return ret;
}

int st_trainer_eval_sum(struct st_trainer *t, struct st_loader *ld, int n_batches,
			double *sum, uint64_t *count)
{
	/* count 1: the loss written is the batch's sum (unread) */
	struct st_model_batch b = { .B = t->cfg.batch, .T = t->cfg.seq, .tokens = t->tokens,
				    .targets = t->targets, .loss_scale = 1.0f,
				    .losses = t->losses, .count = 1 };
	const size_t n = (size_t)b.B * (size_t)b.T;
	int ret = 0;

	*sum = 0;
	*count = st_loader_count(ld, (uint32_t)ST_MAX(n_batches, 0));
	for (int i = 0; i < n_batches && ret == 0; i++) {
		float l = 0;

		ret = eval_batch(t, ld, &b, &l);
		*sum += st_model_sum_losses(t->losses, n);
	}
	return ret;
}

int st_trainer_eval(struct st_trainer *t, struct st_loader *ld, int n_batches,
		    double *mean_loss)
{
	struct st_model_batch b = { .B = t->cfg.batch, .T = t->cfg.seq, .tokens = t->tokens,
				    .targets = t->targets, .loss_scale = 1.0f };
	double sum = 0;
	uint64_t count;
	int ret = 0;

	if (st_loader_masked(ld)) { /* the mean over the counted targets */
		ret = st_trainer_eval_sum(t, ld, n_batches, &sum, &count);
		*mean_loss = count ? sum / (double)count : NAN;
		return ret;
	}
	for (int i = 0; i < n_batches && ret == 0; i++) {
		float l = 0;

		ret = eval_batch(t, ld, &b, &l);
		sum += l;
	}
	*mean_loss = n_batches ? sum / n_batches : NAN;
	return ret;
}

int st_trainer_logits(struct st_trainer *t, const int32_t *tokens, int n, float *logits)
{
	struct st_model_batch b;
	int H = t->U - 1, T = ST_MIN(n, t->cfg.seq), ret;
	size_t row_elems = st_model_act_bytes(t->model, H - 1, 1, 1) / sizeof(float);

	if (n <= 0)
		return st_error_set(-EINVAL, "no tokens to continue");
	if (t->cfg.batch < 1)
		return -EINVAL;
	memcpy(t->tokens, tokens + (n - T), (size_t)T * sizeof(int32_t));
	memset(t->targets, 0, (size_t)T * sizeof(int32_t));
	b = (struct st_model_batch){ .B = 1, .T = T, .tokens = t->tokens, .targets = t->targets,
				     .loss_scale = 1.0f };
	ret = forward_body(t, &b);
	if (ret < 0)
		return ret;
	/* the last unit on the last position only */
	return st_model_logits(t->model, weights(t, H), other_of(t, H),
			       act(t, H) + (size_t)(T - 1) * row_elems, logits, t->work,
			       t->work_bytes);
}

int st_trainer_load_weights(struct st_trainer *t, struct st_weights *w)
{
	int ret = 0;

	for (int u = 0; ret == 0 && u < t->U; u++)
		ret = st_weights_read_unit(w, t->model, u, t->P[u]);
	if (ret < 0)
		return ret;
	for (int u = 0; u < t->U; u++) {
		memset(t->M[u], 0, t->elems[u] * sizeof(float));
		memset(t->V[u], 0, t->elems[u] * sizeof(float));
		narrow(t, u);
	}
	return 0;
}
