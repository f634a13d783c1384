/* Activation checkpoints on the host (ZeRO-Infinity's activation offload;
 * docs/engine.md, docs/plan.md).
 *
 * In vram (the default when they fit) checkpoint j (1..U-1, unit j-1's
 * output and unit j's input) is x[j] in one extent of U-1. On the host
 * (plan.act_home), checkpoint j is in vram slot (j-1) mod A while it is in
 * vram: the forward of unit j-1 writes it there and unit j reads it there.
 * The last A stay in their slots until their backward; checkpoints
 * 1..act.n_off (= U-1-A) go to their host home after the forward and come
 * back into their slot before the backward:
 *   out  the compute records ev_fw[j] after the forward that wrote x[j];
 *        its d2h waits for it on the device and records ev_out[j]; the
 *        forward that next writes the slot (unit j+A-1, x[j+A]) waits for
 *        ev_out[j] on the compute;
 *   in   the compute records ev_bw[j+A] after the backward that read the
 *        slot's x[j+A]; the h2d of x[j] into it waits for that on the
 *        device and records ev_in[j]; the backward of unit j waits for
 *        ev_in[j] on the compute. Its host home holds x[j] by then: the
 *        forward that wrote x[j+A] waited for ev_out[j], and the backward
 *        of j+A came after it.
 * So the h2d of x[j] runs while units j+A-1..j+1 compute their backward:
 * prefetched A-1 units ahead. The host never waits for the compute: it
 * waits only to reuse a chain of the last micro-batch (long done), so an
 * event is never recorded again while a copy still waits for it. The bytes
 * are copied, never recomputed: the numbers are those of vram. */
#include "engine_internal.h"

#include <errno.h>
#include <stdlib.h>

static bool act_out(const struct st_engine *e, int j)
{
	return e->act.on_host && j >= 1 && j <= e->act.n_off;
}

static int slot_of(const struct st_engine *e, int j)
{
	return (j - 1) % e->act.n_slots;
}

float *st_eng_act(struct st_engine *e, int j)
{
	if (!e->act.on_host)
		return e->act.ckpt + (size_t)(j - 1) * e->act.ckpt_elems;
	return vaddr(e, &e->act.slot_ext[slot_of(e, j)]);
}

/* Layer-first: in vram checkpoint j of micro-batch a is the ((j-1) * N +
 * a)-th; on the host the a-th of its slot's block. */
float *st_eng_act_mb(struct st_engine *e, int j, int a)
{
	size_t n = (size_t)e->cfg.train.grad_accum;

	if (!e->act.on_host)
		return e->act.ckpt + ((size_t)(j - 1) * n + (size_t)a) * e->act.ckpt_elems;
	return (float *)(void *)((char *)vaddr(e, &e->act.slot_ext[slot_of(e, j)]) +
				 (size_t)a * e->act.mb_stride_bytes);
}

int st_eng_act_setup(struct st_engine *e, const struct st_extent *slots,
		     const struct st_extent *homes)
{
	const struct st_train_config *c = &e->cfg.train;
	const struct st_plan *p = &e->plan;
	size_t n = (size_t)e->n_units + 1;
	int ret = 0;

	e->act.on_host = p->act_home == ST_HOME_HOST;
	if (!e->act.on_host)
		return 0;
	/* layer-first: a block of N checkpoints, each at the largest's
	 * stride (Xa), copied as one: (N-1) * Xa + its own */
	e->act.n_mb = e->layer_first ? c->grad_accum : 1;
	e->act.mb_stride_bytes = st_align_up(p->act_each_bytes, ST_PLAN_ACT_ALIGN);
	e->act.n_slots = p->act_slots;
	e->act.n_off = p->act_offloaded;
	if (e->act.n_slots < 1 || !slots || (e->act.n_off && !homes))
		return st_error_set(-EINVAL, "engine: the plan has no checkpoint slots");
	e->act.slot_ext = slots;
	e->act.home_ext = homes;
	e->act.len_bytes = calloc(n, sizeof(*e->act.len_bytes));
	e->act.chain_out = calloc(n, sizeof(*e->act.chain_out));
	e->act.chain_in = calloc(n, sizeof(*e->act.chain_in));
	e->act.out_busy = calloc(n, sizeof(int));
	e->act.in_busy = calloc(n, sizeof(int));
	for (int k = 0; k < 4; k++)
		e->act.ev[k] = calloc(n, sizeof(struct st_event *));
	if (!e->act.len_bytes || !e->act.chain_out || !e->act.chain_in || !e->act.out_busy ||
	    !e->act.in_busy || !e->act.ev[0] || !e->act.ev[1] || !e->act.ev[2] || !e->act.ev[3])
		return st_error_set(-ENOMEM, "engine: out of memory (activation checkpoints)");
	for (int j = 1; j < e->n_units && ret == 0; j++) {
		e->act.len_bytes[j] = (uint64_t)(e->act.n_mb - 1) * e->act.mb_stride_bytes +
				      st_align_up(st_model_act_bytes(e->model, j - 1, c->batch, c->seq),
						  ST_PLAN_ACT_ALIGN);
		if (e->act.len_bytes[j] > slots[slot_of(e, j)].len_bytes ||
		    (act_out(e, j) && e->act.len_bytes[j] > homes[j - 1].len_bytes))
			return st_error_set(-EINVAL,
					    "engine: checkpoint %d is larger than its slot", j);
		for (int k = 0; k < 4 && ret == 0; k++)
			ret = st_event_create(e->dev, &e->act.ev[k][j]);
	}
	if (ret == 0 && ST_PLAN_ACT_ALIGN % st_tier_align(e->tier[ST_HOME_VRAM]))
		ret = st_error_set(-EINVAL, "engine: the vram tier's alignment does not divide %u",
				   ST_PLAN_ACT_ALIGN);
	return ret;
}

int st_eng_act_chains(struct st_engine *e, struct chain **list)
{
	int n = 0;

	for (int j = 1; act_out(e, j); j++) {
		list[n++] = &e->act.chain_out[j];
		list[n++] = &e->act.chain_in[j];
	}
	return n;
}

void st_eng_act_fini(struct st_engine *e)
{
	for (int k = 0; k < 4; k++) {
		for (int j = 0; e->act.ev[k] && j <= e->n_units; j++)
			if (e->act.ev[k][j])
				st_event_destroy(e->dev, e->act.ev[k][j]);
		free(e->act.ev[k]);
		e->act.ev[k] = NULL;
	}
	free(e->act.len_bytes);
	free(e->act.chain_out);
	free(e->act.chain_in);
	free(e->act.out_busy);
	free(e->act.in_busy);
}

/* Before the forward of unit u writes x[u+1] into its slot: the slot's
 * previous checkpoint, x[u+1-A], must be out (the compute waits for its
 * d2h), and x[u+1]'s chain of the last micro-batch reaped. */
int st_eng_act_fwd_begin(struct st_engine *e, int u)
{
	int j = u + 1, old = j - e->act.n_slots;

	if (!e->act.on_host)
		return 0;
	if (old >= 1)
		st_compute_wait(e->cx, e->act.ev[ACT_EV_OUT][old]);
	return act_out(e, j) ? st_eng_wait_until(e, &e->act.out_busy[j], "ckpt d2h") : 0;
}

/* After the forward of unit u is queued: x[u+1] to its host home. */
int st_eng_act_fwd_end(struct st_engine *e, int u)
{
	int j = u + 1;
	struct hop h;

	if (!act_out(e, j))
		return 0;
	st_compute_record(e->cx, e->act.ev[ACT_EV_FW][j]);
	h = st_eng_hop("ckpt d2h", ST_HOME_VRAM, ST_IO_READ, &e->act.slot_ext[slot_of(e, j)], 0,
		       haddr(e, &e->act.home_ext[j - 1]), e->act.len_bytes[j]);
	h.after = e->act.ev[ACT_EV_FW][j];
	h.done = e->act.ev[ACT_EV_OUT][j];
	return st_eng_chain_start(e, &e->act.chain_out[j], &h, 1, &e->act.out_busy[j], NULL);
}

/* Before the backward of unit j reads x[j]: back from the host, if it went. */
void st_eng_act_bwd_begin(struct st_engine *e, int j)
{
	if (act_out(e, j))
		st_compute_wait(e->cx, e->act.ev[ACT_EV_IN][j]);
}

/* After the backward of unit j is queued: its slot takes x[j-A] back. */
int st_eng_act_bwd_end(struct st_engine *e, int j)
{
	int nx = j - e->act.n_slots, ret;
	struct hop h;

	if (!e->act.on_host || nx < 1)
		return 0;
	ret = st_eng_wait_until(e, &e->act.in_busy[nx], "ckpt h2d");
	if (ret < 0)
		return ret;
	st_compute_record(e->cx, e->act.ev[ACT_EV_BW][j]);
	h = st_eng_hop("ckpt h2d", ST_HOME_VRAM, ST_IO_WRITE, &e->act.slot_ext[slot_of(e, nx)], 0,
		       haddr(e, &e->act.home_ext[nx - 1]), e->act.len_bytes[nx]);
	h.after = e->act.ev[ACT_EV_BW][j];
	h.done = e->act.ev[ACT_EV_IN][nx];
	return st_eng_chain_start(e, &e->act.chain_in[nx], &h, 1, &e->act.in_busy[nx], NULL);
}

/* Every checkpoint copy reaped (its bytes counted in this step). */
int st_eng_act_drain(struct st_engine *e)
{
	int ret = 0;

	for (int j = 1; act_out(e, j) && ret == 0; j++) {
		ret = st_eng_wait_until(e, &e->act.out_busy[j], "ckpt d2h");
		if (ret == 0)
			ret = st_eng_wait_until(e, &e->act.in_busy[j], "ckpt h2d");
	}
	return ret;
}
