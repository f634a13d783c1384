/* The forward alone (st_engine_eval): the losses of batches, for validation
 * and `strata eval`. Each batch runs the forward of every unit as a step's
 * first micro-batch does, W fetched through the same pipeline (the fetch
 * sequence cut to the forward's units 0..U-1: the head's W is the
 * backward's first fetch), with the same ops on the same W, so its losses
 * are the step's bit for bit. Nothing is kept for a backward: x and y take
 * turns in the two activation-gradient buffers, a unit that keeps its
 * forward writes it into its saved extent as scratch, and the head's
 * per-token losses go to the step scalars' (read back when masked). No dW,
 * G or update; the training state and the step's cursor stay as they
 * were. */
#include "engine_internal.h"

#include <errno.h>

/* The next batch of ld into host pair 0 and vram, copied before it
 * returns (its queue's order: the forward comes after). */
static int eval_draw(struct st_engine *e, struct st_loader *ld)
{
	size_t bytes = (size_t)e->cfg.train.batch * e->cfg.train.seq * sizeof(int32_t);
	int ret = st_event_sync(e->dev, e->batch.ev_copied[0]);

	if (ret < 0)
		return ret;
	st_loader_next(ld, e->batch.tokens_buf[0], e->batch.targets_buf[0]);
	st_compute_from_host(e->cx, e->batch.tokens, e->batch.tokens_buf[0], bytes);
	st_compute_from_host(e->cx, e->batch.targets, e->batch.targets_buf[0], bytes);
	return st_compute_take_error(e->cx);
}

/* One batch's forward: unit u reads x, writes y (the two swap); the head
 * leaves its B*T losses in dev_losses and their mean (masked: their sum)
 * in *l, on the host when it returns. */
static int eval_forward(struct st_engine *e, const struct st_model_batch *b, float *l)
{
	float *x = NULL, *y = e->act.grad_a;
	int ret = 0;

	st_eng_fetch_restart(e, e->n_units);
	for (int u = 0; ret == 0 && u < e->n_units; u++) {
		void *w = bufs_of(e, u)->w_compute;

		ret = st_eng_acquire_w(e, u, w);
		if (ret < 0)
			break;
		st_compute_span_begin(e->cx, "eval");
		ret = u < e->n_units - 1
			? st_model_fwd_save(e->model, u, b, w, other_w(e, u), x, y, NULL,
					    e->act.saved[u], e->act.saved_bytes, e->work,
					    e->work_bytes)
			: st_model_fwd(e->model, u, b, w, other_w(e, u), x, NULL, l, e->work,
				       e->work_bytes);
		st_compute_span_end(e->cx);
		x = y;
		y = y == e->act.grad_a ? e->act.grad_b : e->act.grad_a;
	}
	return ret ? ret : st_compute_take_error(e->cx);
}

static int eval_batches(struct st_engine *e, struct st_loader *ld, int n_batches, double *sum)
{
	const struct st_train_config *c = &e->cfg.train;
	const size_t n = (size_t)c->batch * (size_t)c->seq;
	const bool masked = st_loader_masked(ld);
	/* masked: count 1, the head's loss is the batch's sum (unread) */
	struct st_model_batch b = { .B = c->batch, .T = c->seq, .tokens = e->batch.tokens,
				    .targets = e->batch.targets, .loss_scale = 1.0f,
				    .count = masked ? 1 : 0,
				    .host_tokens = e->batch.tokens_buf[0],
				    .host_targets = e->batch.targets_buf[0],
				    .losses = e->grad.dev_losses };
	const float *losses = e->grad.host_scalars;
	int ret = 0;

	for (int i = 0; i < n_batches && ret == 0; i++) {
		float l = 0;

		ret = eval_draw(e, ld);
		if (ret == 0)
			ret = eval_forward(e, &b, &l);
		if (ret < 0 || !masked) {
			*sum += l;
			continue;
		}
		/* masked: the counted targets' losses summed in double, as the
		 * reference trainer sums them (st_trainer_eval_sum) */
		st_compute_to_host(e->cx, e->grad.host_scalars, e->grad.dev_losses,
				   n * sizeof(float));
		ret = st_compute_take_error(e->cx);
		*sum += st_model_sum_losses(losses, n);
	}
	return ret;
}

int st_engine_eval(struct st_engine *e, struct st_loader *ld, int n_batches, double *sum,
		   uint64_t *count)
{
	int n_seq = e->fetch.n_seq, ret;

	*sum = 0;
	*count = 0;
	if (e->err)
		return st_error_set(e->err, "%s", e->errmsg);
	if (e->fwd_ready)
		return st_error_set(-EINVAL, "engine: eval after a step that ran the next one's "
				    "forward (next_follows)");
	if (n_batches < 0 || ld->cur.batch != (uint32_t)e->cfg.train.batch ||
	    ld->cur.seq != (uint32_t)e->cfg.train.seq)
		return st_error_set(-EINVAL, "engine: eval of %d batches of %u x %u tokens, the "
				    "engine's are %d x %d", n_batches, ld->cur.batch, ld->cur.seq,
				    e->cfg.train.batch, e->cfg.train.seq);
	*count = st_loader_masked(ld) ? st_loader_count(ld, (uint32_t)n_batches)
				      : (uint64_t)n_batches;
	e->fetch.n_seq = e->n_units;
	ret = eval_batches(e, ld, n_batches, sum);
	e->fetch.n_seq = n_seq;
	if (ret == 0)
		ret = st_eng_compute_drain(e);
	if (ret == 0)
		ret = st_eng_pump(e, false);
	if (ret < 0) {
		st_eng_fail(e, ret);
		return st_error_set(e->err, "%s", e->errmsg);
	}
	return 0;
}
