/* The gradient gather: after bwd(u), unit u's dW goes to the host landing
 * buffer (d2h, waiting on the device for the backward that wrote it), then
 * joins G[u]: the first micro-batch copies, later ones add (through host
 * staging when G lives on nvme). The final G's sum of squares is taken
 * there, per unit; the step sums them in unit order. */
#include "engine_internal.h"

#include <string.h>

static void add_into(float *dst, const float *src, size_t n)
{
#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++)
		dst[i] += src[i];
}

/* The gradient's collectives: this rank's slice of unit u's dW (the
 * padded unit, N slices) reduced over the ranks in rank order (the comm
 * seam's reduce-scatter), and at stages 0-1 the reduced slices gathered
 * back (an allreduce in two halves, 2 x the unit per rank, as a ring's).
 * At world 1 the slice is the whole dW and the collective is in place: it
 * queues nothing, so the d2h keeps waiting for the backward's own event.
 * At world > 1 the comm waits for ev_dw and records ev_red, and the d2h of
 * what this rank keeps waits for that. *after is the event the d2h waits
 * for. */
static int grad_reduce(struct st_engine *e, int u, const struct ubufs *b,
		       struct st_event **after)
{
	size_t S = e->slice[u];
	float *mine = b->dw + (size_t)e->rank * S;
	int ret = 0;

	*after = b->ev_dw;
	if (e->world > 1) {
		ret = st_comm_wait(e->comm, b->ev_dw);
		*after = b->ev_red;
	}
	if (ret == 0)
		ret = st_comm_reduce_scatter(e->comm, b->dw, mine, S, ST_COMM_F32);
	if (ret == 0 && e->world > 1 && !st_plan_sharded(&e->plan, ST_STATE_G))
		ret = st_comm_allgather(e->comm, mine, b->dw, S, ST_COMM_F32);
	if (ret == 0 && e->world > 1)
		ret = st_comm_record(e->comm, b->ev_red);
	return ret;
}

/* Elements of unit u's G this rank keeps: the whole unit at world 1, the
 * padded unit at stages 0-1, the rank's slice from stage 2. */
static uint64_t g_elems(const struct st_engine *e, int u)
{
	return e->world == 1 ? e->elems[u] : sh_elems(e, u, ST_STATE_G);
}

/* dW of unit u (in vram in b, written by the backward that recorded
 * b->ev_dw) starts for the host landing: the copy waits on the device. */
int st_eng_grad_out(struct st_engine *e, int u, const struct ubufs *b)
{
	uint64_t bytes = g_elems(e, u) * sizeof(float);
	uint64_t off = sh_lo(e, u, ST_STATE_G) * sizeof(float);
	struct st_extent part = b->dw_ext;
	struct st_event *after = NULL;
	struct hop h;
	int ret = st_eng_wait_until(e, &e->land_busy); /* the previous unit's write */

	if (ret == 0)
		ret = grad_reduce(e, u, b, &after);
	if (ret < 0)
		return ret;
	part.len_bytes = st_align_up(off + bytes, st_tier_align(e->tier[ST_HOME_VRAM]));
	h = st_eng_hop("dW d2h", ST_HOME_VRAM, ST_IO_READ, &part, off, e->landing, bytes);
	h.after = after;
	return st_eng_chain_start(e, &e->c_d2h, &h, 1, &e->land_busy, NULL);
}

static void final_sumsq(struct st_engine *e, int u, const float *g)
{
	if (st_plan_sharded(&e->plan, ST_STATE_G)) {
		st_eng_zero_parts(e, u, g);
		return;
	}
	if (st_grad_sumsq(g, ST_OPTIM_F32, e->elems[u], &e->unit_sumsq[u]) < 0)
		e->nonfinite = true;
}

/* G on nvme: write the landing buffer (first micro-batch), or read G into
 * staging, add, and write it back. */
static int grad_in_nvme(struct st_engine *e, int u, int mb, bool last)
{
	uint64_t bytes = g_elems(e, u) * sizeof(float);
	struct hop h;
	int ret;

	if (mb == 0) {
		if (last)
			final_sumsq(e, u, e->landing);
		h = st_eng_shard_hop(e, "G write", u, ST_STATE_G, ST_IO_WRITE, 0, e->landing, bytes);
		return st_eng_chain_start(e, &e->c_gwrite, &h, 1, &e->land_busy, NULL);
	}
	ret = st_eng_wait_until(e, &e->gstage_busy);
	if (ret < 0)
		return ret;
	h = st_eng_shard_hop(e, "G read", u, ST_STATE_G, ST_IO_READ, 0, e->gstage, bytes);
	ret = st_eng_chain_start(e, &e->c_gread, &h, 1, &e->gstage_busy, NULL);
	if (ret == 0)
		ret = st_eng_wait_until(e, &e->gstage_busy);
	if (ret < 0)
		return ret;
	add_into(e->gstage, e->landing, g_elems(e, u));
	if (last)
		final_sumsq(e, u, e->gstage);
	h = st_eng_shard_hop(e, "G write", u, ST_STATE_G, ST_IO_WRITE, 0, e->gstage, bytes);
	return st_eng_chain_start(e, &e->c_gwrite, &h, 1, &e->gstage_busy, NULL);
}

/* Once it has landed, unit u's dW joins G[u]; mb is the micro-batch. */
int st_eng_grad_in(struct st_engine *e, int u, int mb)
{
	struct shard *g = shard(e, u, ST_STATE_G);
	bool last = mb == e->cfg.train.grad_accum - 1;
	int ret = st_eng_wait_until(e, &e->land_busy);
	float *gp;

	if (ret < 0)
		return ret;
	if (g->home != ST_HOME_HOST)
		return grad_in_nvme(e, u, mb, last);
	gp = haddr(e, &g->ext);
	if (mb == 0)
		memcpy(gp, e->landing, g_elems(e, u) * sizeof(float));
	else
		add_into(gp, e->landing, g_elems(e, u));
	if (last)
		final_sumsq(e, u, gp);
	return 0;
}
