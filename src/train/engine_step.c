/* The tiered engine's step: the step of docs/design.md over shards in
 * their homes.
 *
 * Queues: compute runs on the compute's own queue of the device (a CUDA
 * stream; a worker thread on the cpu device); CPU AdamW runs on the calling
 * thread (OpenMP inside); copies run on the device's h2d/d2h queues (the vram
 * tier); NVMe I/O runs in the kernel (io_uring, the nvme tier). The pump
 * (engine_lanes.c) reaps completions from both tiers and moves each chain
 * on; waits are pump loops, so transfers for the next units proceed while a
 * unit computes. The host queues a unit's compute and goes on; between the
 * compute queue and the copy queues, order goes through device events, never
 * through the host waiting for compute:
 *   copy -> compute  the compute waits for the event the h2d queue records
 *                    after a W copy (ev_h2d): the host queues the unit once
 *                    the copy is queued;
 *   compute -> copy  a W slot is free once its copy is reaped: the next copy
 *                    into it waits for the event recorded after the widen
 *                    (ev_widen); dW's d2h waits for the event recorded after
 *                    the backward that wrote it (ubufs.ev_dw), and dW has
 *                    two buffers, so the backward of unit u-1 runs while
 *                    unit u's dW is copied out and added into G on the CPU.
 * The step ends with the compute drained, its spans (device-timed) counted
 * as the compute lane's busy time.
 *
 * Pipelines: the W fetch (engine_fetch.c), the gradient gather
 * (engine_grad.c) and the update sweep (engine_update.c). The units are the
 * model's: each unit's input is the previous one's output, the last unit
 * computes the loss inside its backward, a unit may read another's W (and
 * add into its gradient: reads_unit), and a resident unit keeps its widened
 * W and its dW for the micro-batch. The same operations happen in the same
 * order whatever the homes: only the memory they happen in differs, so the
 * bits do not. */
#include "engine_internal.h"

#include <errno.h>
#include <math.h>
#include <string.h>

/* Checkpoint u: unit u's input, in vram or in its slot (engine_act.c). */
static float *act(struct st_engine *e, int u)
{
	return st_eng_act(e, u);
}

/* Layer-first: checkpoint u of micro-batch a (engine_act.c): N of each
 * boundary, in vram or in their slot's block on the way to the host. */
static float *act_mb(struct st_engine *e, int u, int a)
{
	return st_eng_act_mb(e, u, a);
}

static float *other_grad(struct st_engine *e, int u)
{
	int r = st_model_unit_layout(e->model, u)->reads_unit;

	return r >= 0 ? e->unit_bufs[r].dw : NULL;
}

/* Layer-first: micro-batch a's saved-forward extent of unit u (a unit
 * that keeps its forward has N, NULL for one that recomputes). */
static void *saved_mb(struct st_engine *e, int u, int a)
{
	return e->act.saved_mb[(size_t)u * (size_t)e->cfg.train.grad_accum + (size_t)a];
}

/* Layer-first: micro-batch a's dW of resident unit r (NULL: r < 0). */
static float *grad_mb(struct st_engine *e, int r, int a)
{
	return r >= 0 ? e->unit_bufs[r].dw_mb[a] : NULL;
}

static struct st_model_batch batch_of(const struct st_engine *e)
{
	const struct st_train_config *c = &e->cfg.train;

	return (struct st_model_batch){ .B = c->batch, .T = c->seq, .tokens = e->batch.tokens,
					.targets = e->batch.targets,
					/* the mean over every rank's micro-batches; masked:
					 * over their counted targets (a step with none
					 * divides by 1, its gradients all 0, and is skipped) */
					.loss_scale = e->batch.masked ? 1.0f
						: 1.0f / (float)(c->grad_accum * e->world),
					.count = e->batch.masked ? ST_MAX(e->batch.count, 1) : 0,
					.host_tokens = e->batch.tokens_host,
					.host_targets = e->batch.targets_host,
					.seg = e->batch.seg };
}

/* Layer-first: micro-batch a's batch (its tokens at a * B*T in vram, its
 * host pair a). */
static struct st_model_batch batch_mb(const struct st_engine *e, int a)
{
	struct st_model_batch b = batch_of(e);
	size_t n = (size_t)b.B * (size_t)b.T;

	b.tokens = e->batch.tokens + (size_t)a * n;
	b.targets = e->batch.targets + (size_t)a * n;
	b.host_tokens = e->batch.tokens_buf[a];
	b.host_targets = e->batch.targets_buf[a];
	b.seg = e->batch.seg ? e->batch.seg + (size_t)a * n : NULL;
	return b;
}

/* At a step's first draw: a masked step's count, every rank's N
 * micro-batches from the same cursor (the same on every rank). */
static void step_count(struct st_engine *e, const struct st_loader *ld)
{
	e->batch.masked = st_loader_masked(ld);
	e->batch.count = e->batch.masked
		? st_loader_count(ld, (uint32_t)(e->cfg.train.grad_accum * e->world)) : 0;
}

/* Draw the next batch and start the W fetch sequence over. w_ready is the
 * number of units (from 0) whose W may be fetched now: all of them, except
 * while the update sweep is still writing the new W (fused forward). first:
 * the step's first micro-batch. */
static int begin_micro_batch(struct st_engine *e, struct st_loader *ld, int w_ready, bool first)
{
	size_t bytes = (size_t)e->cfg.train.batch * e->cfg.train.seq * sizeof(int32_t);
	unsigned i = e->batch.turn++ % (unsigned)e->batch.n_pairs;
	uint64_t t0 = st_now_ns();
	int ret;

	/* The copies are queued, not waited for: the compute still runs the
	 * last micro-batch's backward (or the sweep's AdamW comes next), and
	 * waiting here left it idle while the host queued the forward. The
	 * pair drawn into is the one of two micro-batches ago, whose copies
	 * are long done (its event). */
	ret = st_event_sync(e->dev, e->batch.ev_copied[i]);
	if (ret < 0)
		return ret;
	e->batch.tokens_host = e->batch.tokens_buf[i];
	e->batch.targets_host = e->batch.targets_buf[i];
	e->batch.seg_host = e->batch.seg_buf[i];
	if (first)
		step_count(e, ld);
	/* rank r takes micro-batch r of each group of N: N ranks read what
	 * one reads at N times the micro-batches, in the same order */
	for (int q = 0; q < e->world; q++)
		if (q == e->rank)
			st_loader_next_seg(ld, e->batch.tokens_host, e->batch.targets_host,
					   e->batch.seg_host);
		else
			st_loader_skip(ld);
	if (e->host_waits) {
		st_compute_from_host(e->cx, e->batch.tokens, e->batch.tokens_host, bytes);
		st_compute_from_host(e->cx, e->batch.targets, e->batch.targets_host, bytes);
		if (e->batch.seg)
			st_compute_from_host(e->cx, e->batch.seg, e->batch.seg_host, bytes);
	} else {
		st_compute_from_host_async(e->cx, e->batch.tokens, e->batch.tokens_host, bytes);
		st_compute_from_host_async(e->cx, e->batch.targets, e->batch.targets_host, bytes);
		if (e->batch.seg)
			st_compute_from_host_async(e->cx, e->batch.seg, e->batch.seg_host, bytes);
	}
	st_compute_record(e->cx, e->batch.ev_copied[i]);
	st_eng_host_wait(e, "tokens h2d", t0);
	st_eng_fetch_restart(e, w_ready);
	return st_compute_take_error(e->cx);
}

/* Queue the forward of unit u (0 <= u <= U-2); its output is kept as unit
 * u+1's checkpoint for the backward, and a unit that keeps its forward
 * (plan.keep) writes it into its saved extent, for its backward. */
static int forward_unit(struct st_engine *e, int u)
{
	struct st_model_batch b = batch_of(e);
	void *w = bufs_of(e, u)->w_compute;
	int ret = st_eng_acquire_w(e, u, w);

	if (ret == 0)
		ret = st_eng_act_fwd_begin(e, u);
	if (ret < 0)
		return ret;
	st_compute_span_begin(e->cx, u ? "fwd" : "fwd embed");
	ret = st_model_fwd_save(e->model, u, &b, w, other_w(e, u), u ? act(e, u) : NULL,
				act(e, u + 1), NULL, e->act.saved[u], e->act.saved_bytes, e->work,
				e->work_bytes);
	st_compute_span_end(e->cx);
	if (ret == 0)
		ret = st_eng_act_fwd_end(e, u);
	return ret ? ret : st_compute_take_error(e->cx);
}

static const char *bwd_span(const struct st_engine *e, int u)
{
	return u == e->n_units - 1 ? "bwd head"
	       : u == 0 ? "bwd embed"
	       : e->act.saved[u] ? "bwd kept"
	       : "bwd";
}

/* The end of unit u's backward in either schedule, once its ops are
 * queued (ret: how that went): dW's event, the checkpoint's slot given
 * back, the activation gradients swapped for the unit below, the
 * compute's error. */
static int bwd_unit_end(struct st_engine *e, int u, const struct ubufs *ub, int ret,
			float **dy, float **dx)
{
	st_compute_record(e->cx, ub->ev_dw);
	if (ret == 0 && u > 0)
		ret = st_eng_act_bwd_end(e, u);
	if (u > 0) {
		float *tmp = *dy;

		*dy = *dx;
		*dx = tmp;
	}
	return ret ? ret : st_compute_take_error(e->cx);
}

/* Backward of unit u into its dW buffers: *dy is the gradient of its
 * output (none for the last unit, whose output is the loss), its input's
 * goes into *dx (none for the first unit), and the two swap. */
static int backward_unit(struct st_engine *e, int u, int mb, float **dy, float **dx)
{
	struct st_model_batch b = batch_of(e);
	struct ubufs *ub = bufs_of(e, u);
	bool last = u == e->n_units - 1, first = u == 0;
	int ret = 0;

	/* the head leaves micro-batch mb's losses with the step's scalars */
	if (last)
		b.losses = e->grad.dev_losses + (size_t)mb * (size_t)b.B * (size_t)b.T;
	/* a resident unit's W was widened in the forward and kept */
	if (!(unit_resident(e, u) && !last))
		ret = st_eng_acquire_w(e, u, ub->w_compute);
	if (ret < 0)
		return ret;
	if (!first)
		st_eng_act_bwd_begin(e, u);
	/* the span holds the zeroing too: the compute is busy then */
	st_compute_span_begin(e->cx, bwd_span(e, u));
	/* a shared dW held unit u+2's, in by now (grad_in waited for its copy);
	 * a resident unit's was zeroed at the start, as others may add to it */
	if (!unit_resident(e, u))
		st_compute_zero(e->cx, ub->dw, e->padded_elems[u] * sizeof(float));
	/* a unit that keeps its forward reads it from its saved extent (the
	 * same bits) instead of recomputing it */
	ret = st_model_bwd_saved(e->model, u, &b, ub->w_compute, other_w(e, u),
				 first ? NULL : act(e, u), last ? NULL : *dy, first ? NULL : *dx,
				 ub->dw, other_grad(e, u), NULL, e->act.saved[u],
				 e->act.saved_bytes, e->work, e->work_bytes);
	st_compute_span_end(e->cx);
	return bwd_unit_end(e, u, ub, ret, dy, dx);
}

/* Backward of every unit for micro-batch mb (its forward is queued). Unit
 * u's dW is taken in (grad_in) only after the backward of the next unit is
 * queued, so the device computes that one while the host adds u's into G. */
static int backward(struct st_engine *e, int mb)
{
	int ret = 0, pend = -1;
	float *dy = e->act.grad_a, *dx = e->act.grad_b;
	bool spec, early;

	for (int u = 0; u < e->n_units; u++)
		if (unit_resident(e, u))
			st_compute_zero(e->cx, e->unit_bufs[u].dw,
					e->padded_elems[u] * sizeof(float));
	for (int u = e->n_units - 1; ret == 0 && u >= 0; u--) {
		ret = backward_unit(e, u, mb, &dy, &dx);
		if (ret == 0 && pend >= 0)
			ret = st_eng_grad_in(e, pend, mb);
		/* the update's loads whose buffer was still going back */
		if (ret == 0 && mb == e->cfg.train.grad_accum - 1)
			ret = st_eng_update_poll(e);
		/* the update inside the backward: pend's G is final, and its
		 * tiles read it where it is: before u's dW d2h when that is
		 * the landing, else after it, which then overlaps them */
		spec = pend >= 0 && mb == e->cfg.train.grad_accum - 1;
		early = spec && st_eng_grad_in_landing(e, pend);
		if (ret == 0 && early)
			ret = st_eng_spec_advance(e, pend);
		if (ret == 0)
			ret = st_eng_grad_out(e, u, bufs_of(e, u));
		if (ret == 0 && spec && !early)
			ret = st_eng_spec_advance(e, pend);
		pend = u;
	}
	if (ret == 0)
		ret = st_eng_grad_in(e, pend, mb);
	return ret;
}

/* The gradient norm from the per-unit sums of squares, summed in unit order
 * (deterministic), then over the ranks (in rank order; at world 1 in place,
 * nothing queued); NAN when a gradient was not finite. */
static int grad_norm(struct st_engine *e, double *norm)
{
	double sumsq = 0;
	int ret;

	if (e->world > 1) {
		ret = st_eng_zero_norm(e, &sumsq);
		*norm = e->grad.nonfinite || !isfinite(sumsq) ? NAN : sqrt(sumsq);
		return ret;
	}
	for (int u = 0; u < e->n_units; u++)
		sumsq += e->grad.unit_sumsq[u];
	ret = st_comm_allreduce(e->comm, &sumsq, &sumsq, 1, ST_COMM_F64);
	if (ret == 0)
		ret = st_comm_sync(e->comm);
	*norm = e->grad.nonfinite || !isfinite(sumsq) ? NAN : sqrt(sumsq);
	return ret;
}

/* --- layer-first (docs/engine.md, "Schedules") --------------------------------
 * Each unit runs the forward of all N micro-batches while its W is in its
 * slot, then in the backward all N again: W is fetched once a step for
 * each pass (the fetch sequence of one micro-batch). The N checkpoints
 * of each boundary wait in vram (or go to the host as one block,
 * engine_act.c), and the N activation gradients in vram
 * (dA, dB hold N each). A unit's dW of micro-batch 0 is computed in its
 * shared dW buffer, each later one in dw_fold and added into it on the
 * compute, in micro-batch order: ((dW_0 + dW_1) + dW_2) ..., the same
 * fp32 adds in the same order as the host's fold (engine_grad.c,
 * fold_into: G = dW_0, then G += dW_a), so G is batch-first's bit for
 * bit and crosses PCIe (and the disk) once. A resident unit, which the
 * units that read it add into before its own backward, has a dW per
 * micro-batch, folded into the first the same way after its backwards. */

/* All N micro-batches drawn (micro-batch a into host pair a; the pair's
 * copies of the last step long done) and queued to vram at a * B*T, and
 * the fetch sequence started over. */
static int lf_begin(struct st_engine *e, struct st_loader *ld, int w_ready)
{
	const struct st_train_config *c = &e->cfg.train;
	size_t n = (size_t)c->batch * (size_t)c->seq, bytes = n * sizeof(int32_t);
	uint64_t t0 = st_now_ns();
	int ret = 0;

	step_count(e, ld);
	for (int a = 0; a < c->grad_accum && ret == 0; a++) {
		ret = st_event_sync(e->dev, e->batch.ev_copied[a]);
		if (ret < 0)
			break;
		for (int q = 0; q < e->world; q++)
			if (q == e->rank)
				st_loader_next_seg(ld, e->batch.tokens_buf[a], e->batch.targets_buf[a],
						   e->batch.seg_buf[a]);
			else
				st_loader_skip(ld);
		if (e->host_waits) {
			st_compute_from_host(e->cx, e->batch.tokens + a * n, e->batch.tokens_buf[a],
					     bytes);
			st_compute_from_host(e->cx, e->batch.targets + a * n,
					     e->batch.targets_buf[a], bytes);
			if (e->batch.seg)
				st_compute_from_host(e->cx, e->batch.seg + a * n,
						     e->batch.seg_buf[a], bytes);
		} else {
			st_compute_from_host_async(e->cx, e->batch.tokens + a * n,
						   e->batch.tokens_buf[a], bytes);
			st_compute_from_host_async(e->cx, e->batch.targets + a * n,
						   e->batch.targets_buf[a], bytes);
			if (e->batch.seg)
				st_compute_from_host_async(e->cx, e->batch.seg + a * n,
							   e->batch.seg_buf[a], bytes);
		}
		st_compute_record(e->cx, e->batch.ev_copied[a]);
	}
	st_eng_host_wait(e, "tokens h2d", t0);
	if (ret < 0)
		return ret;
	st_eng_fetch_restart(e, w_ready);
	return st_compute_take_error(e->cx);
}

/* The forward of unit u (0 <= u <= U-2) for every micro-batch, with its W
 * fetched once: x[u+1] of micro-batch a into its checkpoint. */
static int lf_forward_unit(struct st_engine *e, int u)
{
	void *w = bufs_of(e, u)->w_compute;
	int ret = st_eng_acquire_w(e, u, w);

	/* checkpoints on the host: x[u+1] of all N is one block */
	if (ret == 0)
		ret = st_eng_act_fwd_begin(e, u);
	for (int a = 0; ret == 0 && a < e->cfg.train.grad_accum; a++) {
		struct st_model_batch b = batch_mb(e, a);

		st_compute_span_begin(e->cx, u ? "fwd" : "fwd embed");
		ret = st_model_fwd_save(e->model, u, &b, w, other_w(e, u),
					u ? act_mb(e, u, a) : NULL, act_mb(e, u + 1, a), NULL,
					saved_mb(e, u, a), e->act.saved_bytes, e->work,
					e->work_bytes);
		st_compute_span_end(e->cx);
	}
	if (ret == 0)
		ret = st_eng_act_fwd_end(e, u);
	return ret ? ret : st_compute_take_error(e->cx);
}

/* The backward of unit u for every micro-batch, its W fetched once (a
 * resident unit's kept since the forward), its dW folded on the compute
 * in micro-batch order into its dW buffer (bufs_of), which records
 * ev_dw once: the d2h takes the unit's whole step. dy, dx: N activation
 * gradients each (micro-batch a at a * X), swapped after the unit.
 * At world > 1 the previous unit's G (pend, or -1) is taken in once
 * micro-batch 0's backward is queued and before its all-to-all: stage
 * 0's G gather may go through the comm scratch (the device path), which
 * this unit's all-to-alls and folds use. */
static int lf_backward_unit(struct st_engine *e, int u, int pend, float **dy, float **dx)
{
	const int N = e->cfg.train.grad_accum;
	const size_t x = e->act.ckpt_elems;
	struct ubufs *ub = bufs_of(e, u);
	bool last = u == e->n_units - 1, first = u == 0, res = unit_resident(e, u);
	int r = st_model_unit_layout(e->model, u)->reads_unit, ret = 0;

	if (!(res && !last))
		ret = st_eng_acquire_w(e, u, ub->w_compute);
	if (ret == 0 && !first)
		st_eng_act_bwd_begin(e, u);
	for (int a = 0; ret == 0 && a < N; a++) {
		struct st_model_batch b = batch_mb(e, a);
		/* world > 1: every micro-batch's dW goes to the ranks, and
		 * the rank's slots are folded into the first S of ub->dw */
		float *dw = res ? ub->dw_mb[a] : a == 0 && e->world == 1 ? ub->dw : e->dw_fold;

		b.losses = last ? e->grad.dev_losses + (size_t)a * (size_t)b.B * (size_t)b.T
				: NULL;
		st_compute_span_begin(e->cx, bwd_span(e, u));
		if (!res)
			st_compute_zero(e->cx, dw, e->padded_elems[u] * sizeof(float));
		ret = st_model_bwd_saved(e->model, u, &b, ub->w_compute, other_w(e, u),
					 first ? NULL : act_mb(e, u, a),
					 last ? NULL : *dy + (size_t)a * x,
					 first ? NULL : *dx + (size_t)a * x, dw, grad_mb(e, r, a),
					 NULL, saved_mb(e, u, a), e->act.saved_bytes, e->work,
					 e->work_bytes);
		/* the fold: the host's order and adds (fold_into) */
		if (ret == 0 && !res && a > 0 && e->world == 1)
			st_compute_residual_fwd(e->cx, ub->dw, ub->dw, dw, e->unit_elems[u]);
		st_compute_span_end(e->cx);
		if (ret == 0 && e->world > 1 && a == 0 && pend >= 0)
			ret = st_eng_grad_in_once(e, pend);
		if (ret == 0 && e->world > 1)
			ret = st_eng_grad_fold_ranks(e, u, dw, ub->dw, a);
	}
	if (ret == 0 && res && N > 1 && e->world == 1) {
		st_compute_span_begin(e->cx, "dW fold");
		for (int a = 1; a < N; a++)
			st_compute_residual_fwd(e->cx, ub->dw, ub->dw, ub->dw_mb[a],
						e->unit_elems[u]);
		st_compute_span_end(e->cx);
	}
	return bwd_unit_end(e, u, ub, ret, dy, dx);
}

/* The backward of every unit for all N micro-batches; unit u's folded dW
 * joins G once the next unit's backwards are queued (as batch-first's
 * last micro-batch), the update's loads overlap it. */
static int lf_backward(struct st_engine *e)
{
	int ret = 0, pend = -1;
	float *dy = e->act.grad_a, *dx = e->act.grad_b;
	bool early;

	for (int u = 0; u < e->n_units; u++)
		for (int a = 0; unit_resident(e, u) && a < e->cfg.train.grad_accum; a++)
			st_compute_zero(e->cx, e->unit_bufs[u].dw_mb[a],
					e->padded_elems[u] * sizeof(float));
	for (int u = e->n_units - 1; ret == 0 && u >= 0; u--) {
		ret = lf_backward_unit(e, u, pend, &dy, &dx);
		if (ret == 0 && pend >= 0 && e->world == 1)
			ret = st_eng_grad_in_once(e, pend);
		if (ret == 0)
			ret = st_eng_update_poll(e);
		/* pend's tiles read its G where it is (backward()) */
		early = pend >= 0 && st_eng_grad_in_landing(e, pend);
		if (ret == 0 && early)
			ret = st_eng_spec_advance(e, pend);
		if (ret == 0)
			ret = st_eng_grad_out_once(e, u, bufs_of(e, u));
		if (ret == 0 && pend >= 0 && !early)
			ret = st_eng_spec_advance(e, pend);
		pend = u;
	}
	if (ret == 0)
		ret = st_eng_grad_in_once(e, pend);
	return ret;
}

static int lf_micro_batches(struct st_engine *e, struct st_loader *ld)
{
	uint64_t t0 = st_now_ns();
	int ret = 0;

	if (!e->fwd_ready) {
		ret = lf_begin(e, ld, e->n_units);
		for (int u = 0; ret == 0 && u <= e->n_units - 2; u++)
			ret = lf_forward_unit(e, u);
		st_eng_phase(e, "forward", 0, t0);
		t0 = st_now_ns();
	}
	e->fwd_ready = false;
	st_eng_fetch_allow(e, e->n_units);
	if (ret == 0)
		ret = st_eng_update_prefetch(e);
	if (ret == 0)
		ret = lf_backward(e);
	st_eng_phase(e, "backward", 0, t0);
	return ret;
}

/* The next step's first forward, fused into the update sweep
 * (st_eng_update_sweep): the batch is drawn before the sweep starts, with
 * no W ready; once unit u's new W is home, it may be fetched, and the
 * forward of u runs (the last unit's runs in its backward). */
static int fused_begin(struct st_engine *e, const struct st_eng_fused_fwd *fwd)
{
	return e->layer_first ? lf_begin(e, fwd->ld, 0) : begin_micro_batch(e, fwd->ld, 0, true);
}

static int fused_unit_home(struct st_engine *e, int u)
{
	st_eng_fetch_allow(e, u + 1);
	if (u > e->n_units - 2)
		return 0;
	return e->layer_first ? lf_forward_unit(e, u) : forward_unit(e, u);
}

/* Every micro-batch's forward and backward; their losses stay on the
 * device until the step reads its scalars. */
static int micro_batches(struct st_engine *e, struct st_loader *ld)
{
	const struct st_train_config *c = &e->cfg.train;
	int ret = 0;

	for (int a = 0; a < c->grad_accum && ret == 0; a++) {
		uint64_t t0 = st_now_ns();

		if (a > 0 || !e->fwd_ready) {
			ret = begin_micro_batch(e, ld, e->n_units, a == 0);
			for (int u = 0; ret == 0 && u <= e->n_units - 2; u++)
				ret = forward_unit(e, u);
			st_eng_phase(e, "forward", a, t0);
			t0 = st_now_ns();
		}
		e->fwd_ready = false;
		st_eng_fetch_allow(e, e->n_units);
		/* the update's loads that need no G overlap the last backward */
		if (ret == 0 && a == c->grad_accum - 1)
			ret = st_eng_update_prefetch(e);
		if (ret == 0)
			ret = backward(e, a);
		st_eng_phase(e, "backward", a, t0);
	}
	return ret;
}

/* The step's forwards and backwards, then its losses' sum (loss_sum) and
 * its gradient norm. */
static int step_pass(struct st_engine *e, struct st_loader *ld, double *loss_sum, double *norm)
{
	const struct st_train_config *c = &e->cfg.train;
	uint64_t tp;
	int ret;

	*loss_sum = 0;
	e->grad.nonfinite = false;
	ret = e->layer_first ? lf_micro_batches(e, ld) : micro_batches(e, ld);
	e->step_end_cursor = ld->cur; /* before the update sweep draws the next batch */
	tp = st_now_ns();
	if (ret == 0)
		ret = st_eng_grad_quiet(e);
	if (ret == 0)
		ret = st_eng_act_drain(e);
	if (ret == 0)
		ret = st_eng_step_scalars(e, loss_sum,
					  e->world > 1 ? e->zero.losses +
							 (size_t)e->rank * c->grad_accum : NULL);
	if (ret == 0 && e->world > 1)
		ret = st_eng_zero_loss(e, loss_sum);
	if (ret == 0)
		ret = grad_norm(e, norm);
	st_eng_phase(e, "norm", c->grad_accum - 1, tp);
	return ret;
}

/* The clip applied to a step that speculated, which keeps no final G to
 * redo its update from: st_eng_spec_finish() put the speculated units' W
 * back, and the step's forwards and backwards run again from its first
 * batch (cur0), now speculating with the step's own AdamW constants,
 * which hold. The same operations in the same order give the same
 * losses and norm: checked. */
static int replay(struct st_engine *e, struct st_loader *ld, const struct st_cursor *cur0,
		  const struct st_adam_step *wd, const struct st_adam_step *nowd, double loss_sum,
		  double norm, bool *done)
{
	double loss2, norm2;
	int ret;

	ld->cur = *cur0;
	e->fwd_ready = false; /* the last sweep's forward of the first batch: again */
	e->update.spec_wd = *wd;
	e->update.spec_nowd = *nowd;
	ret = step_pass(e, ld, &loss2, &norm2);
	if (ret == 0 && (loss2 != loss_sum || norm2 != norm))
		return st_error_set(-EIO, "engine: step %d run again gave losses %.17g and norm "
				    "%.17g, not %.17g and %.17g", e->trace.step, loss2, norm2,
				    loss_sum, norm);
	if (ret == 0)
		ret = st_eng_spec_finish(e, wd, nowd, false, done);
	if (ret == 0 && !*done)
		return st_error_set(-EIO, "engine: step %d run again: its update in the "
				    "backward failed", e->trace.step);
	return ret;
}

int st_engine_step(struct st_engine *e, struct st_loader *ld, int step,
		   bool next_follows, struct st_step_result *res)
{
	const struct st_train_config *c = &e->cfg.train;
	/* the step's first batch: the last sweep may have drawn it already */
	const struct st_cursor cur0 = e->fwd_ready ? e->step_end_cursor : ld->cur;
	/* the update inside the backward speculates a clip factor of 1,
	 * unless the clip applied to the last step */
	const bool spec = e->update.spec_on &&
			  (!e->update.clipped || (step > 0 && step == e->cfg.test_speculate_step));
	struct st_adam_step with_wd, without_wd;
	double loss_sum = 0;
	uint64_t t0 = st_now_ns(), tp;
	bool spec_done = false;
	int ret;

	memset(res, 0, sizeof(*res));
	if (e->err)
		return st_error_set(e->err, "%s", e->errmsg);
	if (e->cfg.forward_only)
		return st_error_set(-EINVAL, "engine: the forward alone does not step");
	e->trace.step = step;
	st_eng_stats_begin(e);
	e->update.spec_now = spec;
	ret = spec ? st_train_adam_prep(c, step, 0.0, &e->update.spec_wd, &e->update.spec_nowd)
		   : 0;
	if (ret == 0)
		ret = step_pass(e, ld, &loss_sum, &res->grad_norm);
	if (ret < 0)
		goto fail;
	/* masked: the sums of the counted losses over their count */
	res->loss = !e->batch.masked ? loss_sum / (c->grad_accum * e->world)
		    : e->batch.count ? loss_sum / (double)e->batch.count : 0.0;
	res->lr = st_lr_at(c, step);
	tp = st_now_ns();
	/* a masked step without a counted target has nothing to learn: as a
	 * skipped one, it drops (or rolls back) the update */
	res->empty = e->batch.masked && !e->batch.count;
	if (isnan(res->grad_norm) || res->empty) {
		res->skipped = !res->empty;
		ret = spec ? st_eng_spec_finish(e, NULL, NULL, true, &spec_done)
			   : st_eng_update_drop(e);
		if (ret < 0)
			goto fail;
	} else {
		struct st_eng_fused_fwd fwd = { .begin = fused_begin,
						.unit_home = fused_unit_home, .ld = ld };

		ret = st_train_adam_prep(c, step, res->grad_norm, &with_wd, &without_wd);
		/* the speculation held: the update is done, the next forward
		 * runs in the next step; else the step runs again; without
		 * it, the sweep */
		if (ret == 0 && spec)
			ret = st_eng_spec_finish(e, &with_wd, &without_wd, false, &spec_done);
		if (ret == 0 && spec && !spec_done) {
			res->replayed = true;
			ret = replay(e, ld, &cur0, &with_wd, &without_wd, loss_sum, res->grad_norm,
				     &spec_done);
		}
		if (ret == 0 && spec_done) {
			next_follows = false;
			res->in_backward = true;
		}
		else if (ret == 0)
			ret = st_eng_update_sweep(e, &with_wd, &without_wd,
						  next_follows ? &fwd : NULL);
		if (ret < 0)
			goto fail;
		/* the sweep ran the next step's first forward */
		e->fwd_ready = next_follows;
		e->update.clipped = c->clip > 0 && res->grad_norm > c->clip;
	}
	st_eng_phase(e, "update", c->grad_accum - 1, tp);
	tp = st_now_ns();
	/* the fused forward may still be computing; the W stores it waited
	 * for on the device (ev_wstore) have landed then: reaped here */
	ret = st_eng_compute_drain(e);
	if (ret == 0)
		ret = st_eng_pump(e, false);
	if (ret == 0)
		ret = st_eng_act_drain(e);
	if (ret < 0)
		goto fail;
	st_eng_phase(e, "end", c->grad_accum - 1, tp);
	st_eng_zero_trace(e);
	st_eng_stats_end(e, t0);
	return 0;
fail:
	st_eng_fail(e, ret);
	return st_error_set(e->err, "%s", e->errmsg);
}
