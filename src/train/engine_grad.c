/* The gradient gather: after bwd(u), unit u's dW goes to the host landing
 * buffer (d2h, waiting on the device for the backward that wrote it), then
 * joins G[u]: the first micro-batch copies, later ones add (through host
 * staging when G lives on nvme). The final G's sum of squares is taken
 * there, per unit; the step sums them in unit order. */
#include "engine_internal.h"
#include "strata/trace.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_into(float *dst, const float *src, size_t n)
{
#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++)
		dst[i] += src[i];
}

/* The gradient's collective at world > 1: every rank's slice r of unit
 * u's dW (the padded unit, N slices) goes to rank r (an all-to-all into
 * the comm scratch: slot q holds rank q's), and this rank adds the N
 * slots into its slice of G in rank order (grad_in). G's slice is thus
 * ((G + dW_0) + dW_1) + ..., micro-batch after micro-batch: the order one
 * rank adds N * A micro-batches in, so N ranks at grad_accum A are one
 * rank at N * A bit for bit, whatever A. The comm waits for the
 * backward's ev_dw and records ev_red, which the d2h of the slots waits
 * for. At world 1 the dW is the rank's slice: the reduce-scatter is in
 * place and queues nothing, and the d2h waits for the backward itself. */
static int grad_reduce(struct st_engine *e, int u, const struct ubufs *b,
		       struct st_event **after)
{
	int ret;

	*after = b->ev_dw;
	if (e->world == 1)
		return st_comm_reduce_scatter(e->comm, b->dw, b->dw, e->unit_elems[u], ST_COMM_F32);
	*after = b->ev_red;
	ret = st_comm_wait(e->comm, b->ev_dw);
	st_eng_zero_mark(e, "dW all-to-all", false);
	if (ret == 0)
		ret = st_comm_alltoall(e->comm, b->dw, e->zero.scratch, e->slice_elems[u],
				       ST_COMM_F32);
	st_eng_zero_mark(e, "dW all-to-all", true);
	if (ret == 0)
		ret = st_comm_record(e->comm, b->ev_red);
	return ret;
}

/* Whether unit u's final G is in the landing, where the next dW goes. */
bool st_eng_grad_in_landing(const struct st_engine *e, int u)
{
	return e->grad.final_u == u && e->grad.final_g == e->grad.landing;
}

/* buf (the landing or the G staging) is about to take another dW or G:
 * the final G it held is gone. */
static void final_gone(struct st_engine *e, const float *buf)
{
	if (e->grad.final_g == buf)
		e->grad.final_u = -1;
}

/* dW of unit u (in vram in b, written by the backward that recorded
 * b->ev_dw) starts for the host landing: the copy waits on the device. At
 * world > 1 what lands is the N slots of this rank's slice. */
int st_eng_grad_out(struct st_engine *e, int u, const struct ubufs *b)
{
	uint64_t bytes = (e->world == 1 ? e->unit_elems[u] : e->padded_elems[u]) * sizeof(float);
	struct st_extent part = e->world == 1 ? b->dw_ext : e->zero.scratch_ext;
	struct st_event *after = NULL;
	struct hop h;
	/* the previous unit's write */
	int ret = st_eng_wait_until(e, &e->grad.landing_busy, "G write");

	if (ret == 0)
		ret = grad_reduce(e, u, b, &after);
	if (ret < 0 || opt_on_dev(e, u)) /* G in vram: dW stays (grad_in) */
		return ret;
	final_gone(e, e->grad.landing);
	part.len_bytes = st_align_up(bytes, st_tier_align(e->tier[ST_HOME_VRAM]));
	h = st_eng_hop("dW d2h", ST_HOME_VRAM, ST_IO_READ, &part, 0, e->grad.landing, bytes);
	h.after = after;
	return st_eng_chain_start(e, &e->grad.chain_d2h, &h, 1, &e->grad.landing_busy, NULL);
}

/* Elements of unit u's G that this rank reduces: the unit at world 1, its
 * slice at world > 1 (at stage 0 the slices are gathered at the end). */
static uint64_t g_elems(const struct st_engine *e, int u)
{
	return e->world == 1 ? e->unit_elems[u] : e->slice_elems[u];
}

/* Where this rank's slice starts in its G shard, in elements. */
static uint64_t g_at(const struct st_engine *e, int u)
{
	return e->world == 1 ? 0 : (uint64_t)e->rank * e->slice_elems[u] - sh_lo(e, u, ST_STATE_G);
}

/* The landing's terms into dst (g_elems): at world 1 the one dW; at world
 * > 1 the N slots in rank order (layer-first: the one slice, folded on
 * the device). first: dst starts as the first term. */
static void fold_into(struct st_engine *e, int u, float *dst, bool first)
{
	uint64_t n = g_elems(e, u);
	int terms = e->layer_first ? 1 : e->world;

	for (int q = 0; q < terms; q++) {
		const float *src = e->grad.landing + (size_t)q * n;

		if (q == 0 && first) {
			if (dst != src)
				memcpy(dst, src, n * sizeof(float));
		} else {
			add_into(dst, src, n);
		}
	}
}

/* The rank's final G slice of unit u (g, g_elems): its sum of squares
 * (world 1: the unit's; world > 1: the chunk sums st_eng_zero_norm folds). */
static void final_sumsq(struct st_engine *e, int u, const float *g)
{
	if (e->world > 1) {
		st_eng_zero_parts(e, u, g);
		return;
	}
	if (st_grad_sumsq(g, ST_OPTIM_F32, e->unit_elems[u], &e->grad.unit_sumsq[u]) < 0)
		e->grad.nonfinite = true;
	if (st_eng_test_nan_grad(e, u))
		e->grad.unit_sumsq[u] = NAN;
}

/* Stage 0 at world > 1: every rank holds the whole G, so the reduced
 * slices are gathered once they are final (full: the padded unit, this
 * rank's slice at its place). */
static int gather_g(struct st_engine *e, int u, float *full)
{
	if (e->world == 1 || st_plan_sharded(&e->plan, ST_STATE_P))
		return 0;
	return st_eng_zero_gather_host(e, full, e->slice_elems[u], ST_COMM_F32);
}

/* (engine_internal.h) */
bool st_eng_final_g_written(const struct st_engine *e)
{
	return !e->update.spec_step;
}

/* G on nvme: the terms folded in the landing buffer (first micro-batch),
 * or G read into staging and the terms added there; then written back
 * (stage 0's last micro-batch: the gathered unit), but the final G that
 * no one will read back. */
static int grad_in_nvme(struct st_engine *e, int u, bool first, bool last)
{
	uint64_t bytes = g_elems(e, u) * sizeof(float), at = g_at(e, u) * sizeof(float);
	float *g = first ? e->grad.landing : e->grad.stage;
	int *busy = first ? &e->grad.landing_busy : &e->grad.stage_busy;
	struct hop h;
	int ret;

	if (!first) {
		ret = st_eng_wait_until(e, &e->grad.stage_busy, "G write");
		if (ret < 0)
			return ret;
		final_gone(e, e->grad.stage);
		h = st_eng_shard_hop(e, "G read", u, ST_STATE_G, ST_IO_READ, at, e->grad.stage,
				     bytes);
		ret = st_eng_chain_start(e, &e->grad.chain_read, &h, 1, &e->grad.stage_busy, NULL);
		if (ret == 0)
			ret = st_eng_wait_until(e, &e->grad.stage_busy, "G read");
		if (ret < 0)
			return ret;
	}
	fold_into(e, u, g, first);
	if (last) {
		final_sumsq(e, u, g);
		e->grad.final_g = g;
		e->grad.final_lo = (uint64_t)e->rank * e->slice_elems[u];
		e->grad.final_u = u;
	}
	if (last && e->world > 1 && !st_plan_sharded(&e->plan, ST_STATE_G) &&
	    !st_plan_sharded(&e->plan, ST_STATE_P)) {
		float *full = e->grad.landing;

		memmove(full + (size_t)e->rank * e->slice_elems[u], g, bytes);
		ret = gather_g(e, u, full);
		if (ret < 0)
			return ret;
		e->grad.final_g = full;
		e->grad.final_lo = 0;
		if (!st_eng_final_g_written(e))
			return 0;
		h = st_eng_shard_hop(e, "G write", u, ST_STATE_G, ST_IO_WRITE, 0, full,
				     e->padded_elems[u] * sizeof(float));
		return st_eng_chain_start(e, &e->grad.chain_write, &h, 1, &e->grad.landing_busy,
					  NULL);
	}
	if (last && !st_eng_final_g_written(e))
		return 0;
	h = st_eng_shard_hop(e, "G write", u, ST_STATE_G, ST_IO_WRITE, at, g, bytes);
	return st_eng_chain_start(e, &e->grad.chain_write, &h, 1, busy, NULL);
}

/* --- G in vram (the optimizer on the device, engine_update.c) ----------- */

/* Unit u's dW (in the device buffer dw) into its G in vram on the
 * compute's queue: copied at micro-batch 0, added later; after the last,
 * its sum of squares. */
static void dev_grad_in(struct st_engine *e, int u, const float *dw, bool first, bool last)
{
	float *g = vaddr(e, &shard(e, u, ST_STATE_G)->ext);

	/* the host's fold: the first micro-batch copies, later ones add */
	if (first)
		st_compute_copy(e->cx, g, dw, e->unit_elems[u] * sizeof(float));
	else
		st_compute_residual_fwd(e->cx, g, g, dw, e->unit_elems[u]);
	if (last)
		st_compute_grad_sumsq(e->cx, &e->grad.dev_sumsq[u], e->grad.dev_sumsq_scratch, g,
				      e->unit_elems[u]);
}

int st_eng_step_scalars(struct st_engine *e, double *loss_sum, double *mean)
{
	const struct st_train_config *c = &e->cfg.train;
	const size_t n = (size_t)c->batch * (size_t)c->seq;
	const float *losses = e->grad.host_scalars;
	const struct st_compute_sumsq *h = (const void *)((const char *)losses +
							  e->grad.losses_bytes);
	uint64_t t0 = st_now_ns();
	int ret;

	/* the one read of the device's scalars this step: on the host lane,
	 * with what it moved */
	st_compute_to_host(e->cx, e->grad.host_scalars, e->grad.dev_losses, e->grad.scalars_bytes);
	if (e->cfg.trace) {
		char args[64];

		snprintf(args, sizeof(args), "{\"step\":%d,\"bytes\":%zu}", e->trace.step,
			 e->grad.scalars_bytes);
		st_trace_span(e->cfg.trace, e->trace.host, "scalars d2h", t0, st_now_ns(), args);
	}
	ret = st_compute_take_error(e->cx);
	for (int a = 0; ret == 0 && a < c->grad_accum; a++) {
		/* masked: the sum, over the step's count later */
		double l = e->batch.masked ? st_model_sum_losses(losses + (size_t)a * n, n)
					   : st_model_mean_loss(losses + (size_t)a * n, n);

		*loss_sum += l;
		if (mean)
			mean[a] = l;
	}
	for (int u = 0; ret == 0 && e->grad.dev_sumsq && u < e->n_units; u++) {
		if (!opt_on_dev(e, u))
			continue;
		e->grad.unit_sumsq[u] = h[u].sumsq;
		if (h[u].nonfinite)
			e->grad.nonfinite = true;
	}
	return ret;
}

int st_eng_grad_quiet(struct st_engine *e)
{
	int ret = st_eng_wait_until(e, &e->grad.landing_busy, "G write");

	return ret ? ret : st_eng_wait_until(e, &e->grad.stage_busy, "G write");
}

/* Once it has landed, unit u's dW joins G[u]: first, it is G; last, G is
 * final (its sum of squares). */
static int grad_in(struct st_engine *e, int u, bool first, bool last)
{
	struct shard *g = shard(e, u, ST_STATE_G);
	int ret = st_eng_wait_until(e, &e->grad.landing_busy, "dW d2h");
	float *gp;

	if (ret < 0)
		return ret;
	if (g->home == ST_HOME_VRAM) {
		dev_grad_in(e, u,
			    (unit_resident(e, u) ? &e->unit_bufs[u] : &e->shared_bufs[u & 1])->dw,
			    first, last);
		return st_compute_take_error(e->cx);
	}
	if (g->home != ST_HOME_HOST)
		return grad_in_nvme(e, u, first, last);
	gp = (float *)haddr(e, &g->ext) + g_at(e, u);
	fold_into(e, u, gp, first);
	if (last) {
		final_sumsq(e, u, gp);
		ret = gather_g(e, u, haddr(e, &g->ext));
	}
	return ret;
}

/* Batch-first: micro-batch mb's dW of unit u joins G[u]. */
int st_eng_grad_in(struct st_engine *e, int u, int mb)
{
	return grad_in(e, u, mb == 0, mb == e->cfg.train.grad_accum - 1);
}

/* Layer-first: unit u's dW, its N micro-batches' already folded on the
 * device in micro-batch order (the order the host folds them in, with the
 * same fp32 adds), is G[u]: copied in once, final. */
int st_eng_grad_in_once(struct st_engine *e, int u)
{
	return grad_in(e, u, true, true);
}

int st_eng_grad_fold_ranks(struct st_engine *e, int u, float *dw, float *acc, int a)
{
	uint64_t S = e->slice_elems[u];
	const float *slots = e->zero.scratch;
	int ret;

	st_compute_record(e->cx, e->lf_ev_dw);
	ret = st_comm_wait(e->comm, e->lf_ev_dw);
	st_eng_zero_mark(e, "dW all-to-all", false);
	if (ret == 0)
		ret = st_comm_alltoall(e->comm, dw, e->zero.scratch, S, ST_COMM_F32);
	st_eng_zero_mark(e, "dW all-to-all", true);
	if (ret == 0)
		ret = st_comm_record(e->comm, e->lf_ev_red);
	if (ret < 0)
		return ret;
	/* the host's fold (fold_into), micro-batch after micro-batch, the
	 * slots in rank order: ((slot_0 + slot_1) + ...) of micro-batch 0,
	 * then + each slot of the next */
	st_compute_wait(e->cx, e->lf_ev_red);
	for (int q = 0; q < e->world; q++)
		if (a == 0 && q == 0)
			st_compute_copy(e->cx, acc, slots, S * sizeof(float));
		else
			st_compute_residual_fwd(e->cx, acc, acc, slots + (size_t)q * S, S);
	return st_compute_take_error(e->cx);
}

int st_eng_grad_out_once(struct st_engine *e, int u, const struct ubufs *b)
{
	uint64_t bytes = g_elems(e, u) * sizeof(float);
	struct st_extent part = b->dw_ext;
	struct hop h;
	int ret = st_eng_wait_until(e, &e->grad.landing_busy, "G write");

	/* world 1: the reduce-scatter in place, as batch-first's */
	if (ret == 0 && e->world == 1)
		ret = st_comm_reduce_scatter(e->comm, b->dw, b->dw, e->unit_elems[u], ST_COMM_F32);
	if (ret < 0 || opt_on_dev(e, u)) /* G in vram: dW stays (grad_in) */
		return ret;
	final_gone(e, e->grad.landing);
	part.len_bytes = st_align_up(bytes, st_tier_align(e->tier[ST_HOME_VRAM]));
	h = st_eng_hop("dW d2h", ST_HOME_VRAM, ST_IO_READ, &part, 0, e->grad.landing, bytes);
	h.after = b->ev_dw;
	return st_eng_chain_start(e, &e->grad.chain_d2h, &h, 1, &e->grad.landing_busy, NULL);
}
