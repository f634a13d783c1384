/* The tiered engine: create and destroy, the pools from the plan, the
 * accessors. The step and its pipelines are in engine_step.c and the files
 * engine_internal.h lists. */
#include "engine_internal.h"
#include "strata/trace.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *lane_names[ST_LANE_COUNT] = { "compute", "h2d", "d2h", "nvme read",
						 "nvme write", "cpu adam" };

const char *st_lane_name(enum st_lane l)
{
	return lane_names[l];
}

static int alloc_in(struct st_engine *e, enum st_home h, uint64_t bytes, struct st_extent *x)
{
	int ret = st_tier_alloc(e->tier[h], bytes, x);

	if (ret < 0)
		return st_error_set(ret, "engine: the plan's %s pools do not fit: %s",
				    st_home_name(h), st_error_last());
	return 0;
}

static void destroy_event(struct st_engine *e, struct st_event *ev)
{
	if (ev)
		st_event_destroy(e->dev, ev);
}

void st_engine_destroy(struct st_engine *e)
{
	if (!e)
		return;
	if (e->tier[ST_HOME_VRAM])
		st_eng_drain(e);
	else if (e->cx)
		st_compute_sync(e->cx);
	/* the events before the compute's queue they are recorded on */
	for (int i = 0; e->fetch.ev_widen && i < 2 * e->fetch.n_slots; i++)
		destroy_event(e, e->fetch.ev_widen[i]);
	for (int i = 0; e->fetch.ev_h2d && i < e->fetch.n_slots; i++)
		destroy_event(e, e->fetch.ev_h2d[i]);
	destroy_event(e, e->update.ev_wstore);
	destroy_event(e, e->lf_ev_dw);
	destroy_event(e, e->lf_ev_red);
	for (int i = 0; i < 2; i++)
		destroy_event(e, e->shared_bufs[i].ev_dw);
	for (int i = 0; i < 2; i++)
		destroy_event(e, e->shared_bufs[i].ev_red);
	for (int u = 0; e->unit_bufs && u < e->n_units; u++) {
		destroy_event(e, e->unit_bufs[u].ev_dw);
		destroy_event(e, e->unit_bufs[u].ev_red);
	}
	for (int i = 0; e->fetch.ev_gather && i < e->fetch.n_slots; i++)
		destroy_event(e, e->fetch.ev_gather[i]);
	st_eng_act_fini(e);
	for (int i = 0; i < 2; i++)
		destroy_event(e, e->zero.ev_wgather[i]);
	for (int i = 0; e->batch.ev_copied && i < e->batch.n_pairs; i++)
		destroy_event(e, e->batch.ev_copied[i]);
	free(e->fetch.ev_gather);
	free(e->fetch.ev_h2d);
	free(e->fetch.ev_widen);
	for (int h = ST_HOME_NVME; h >= ST_HOME_VRAM; h--)
		st_tier_destroy(e->tier[h]);
	st_tier_destroy(e->nvme_inner);
	st_comm_destroy(e->comm);
	st_eng_zero_fini(e);
	st_compute_destroy(e->cx);
	if (e->batch.host_pinned)
		st_device_unpin_host(e->dev, e->batch.tokens_buf[0]);
	for (int u = 0; e->unit_bufs && u < e->n_units; u++)
		free(e->unit_bufs[u].dw_mb);
	st_device_destroy(e->dev);
	st_plan_fini(&e->plan);
	st_model_destroy(e->model);
	free(e->shards);
	free(e->fetch.slots);
	free(e->fetch.seq);
	free(e->lanes.chains);
	free(e->unit_bufs);
	free(e->act.saved);
	free(e->act.saved_mb);
	free(e->pool_ext);
	st_eng_sums_fini(e);
	st_eng_update_fini(e);
	free(e->pool_first);
	free(e->unit_elems);
	free(e->grad.unit_sumsq);
	free(e->grad.host_scalars);
	if (e->batch.tokens_buf)
		free(e->batch.tokens_buf[0]);
	free(e->batch.tokens_buf);
	free(e->batch.targets_buf);
	free(e->batch.seg_buf);
	free(e->batch.ev_copied);
	for (int k = 0; k < 2; k++)
		free(e->q8_scale[k]); /* the arrays are the host tier's */
	free(e->slice_elems);
	free(e->padded_elems);
	free(e->zero.nvme_dirs);
	free(e);
}

const struct st_plan *st_engine_plan(const struct st_engine *e)
{
	return &e->plan;
}

const struct st_model *st_engine_model(const struct st_engine *e)
{
	return e->model;
}

uint64_t st_engine_seed(const struct st_engine *e)
{
	return e->cfg.train.seed;
}

const struct st_cursor *st_engine_step_end_cursor(const struct st_engine *e)
{
	return &e->step_end_cursor;
}

struct st_comm *st_engine_comm(struct st_engine *e)
{
	return e->comm;
}

const char *st_engine_io_error(const struct st_engine *e)
{
	return e->errmsg;
}

static int open_tiers(struct st_engine *e)
{
	struct st_device_config dc = { .mem_bytes = e->plan.total_bytes[ST_HOME_VRAM],
					.ordinal = st_eng_zero_ordinal(&e->cfg) };
	struct st_tier_config vc = { .budget_bytes = e->plan.total_bytes[ST_HOME_VRAM] };
	/* a page at least: with the optimizer on the device a plan may put
	 * nothing in host */
	struct st_tier_config hc = { .budget_bytes = ST_MAX(e->plan.total_bytes[ST_HOME_HOST],
							     ST_PAGE_BYTES) };
	const char *dev_name = e->cfg.device ? e->cfg.device : "cpu";
	const struct st_device_ops *dops = st_device_find(dev_name);
	int ret;

	if (!dops)
		return st_error_set(-EINVAL, "device '%s' is not built into this binary (built: %s)",
				    dev_name, st_device_list());
	ret = st_device_create(dops, &dc, &e->dev);
	if (ret < 0)
		return ret;
	ret = st_compute_create(e->dev, &e->cx);
	if (ret < 0)
		return ret;
	st_model_set_compute(e->model, e->cx);
	/* every op of the precision's path on this device, before any pool
	 * (fp32 is every compute's reference: nothing to check) */
	if (st_model_precision(e->model) != ST_PRECISION_FP32) {
		ret = st_model_precision_check(e->model);
		if (ret < 0)
			return ret;
	}
	vc.device = e->dev;
	hc.device = e->dev;
	ret = st_tier_create(&st_tier_vram_ops, &vc, &e->tier[ST_HOME_VRAM]);
	if (ret == 0)
		ret = st_tier_create(&st_tier_host_ops, &hc, &e->tier[ST_HOME_HOST]);
	if (ret == 0 && e->plan.total_bytes[ST_HOME_NVME]) {
		struct st_tier_config nc = {
			.budget_bytes = e->plan.total_bytes[ST_HOME_NVME],
			.dirs = e->zero.nvme_dirs ? e->zero.nvme_dirs : e->cfg.nvme_dirs,
			.block_bytes = e->cfg.aio_block_bytes,
			.queue_depth = e->cfg.aio_depth,
		};

		ret = st_tier_create(&st_tier_nvme_ops, &nc, &e->tier[ST_HOME_NVME]);
	}
	/* Tests: the nvme tier inside the fault tier, the one place faults
	 * are injected (docs/reliability.md). */
	if (ret == 0 && (e->cfg.nvme_fault.kind != ST_FAULT_NONE ||
			 e->cfg.nvme_fault.corrupt.kind != ST_CORRUPT_NONE)) {
		struct st_tier_config fc = { .budget_bytes = e->plan.total_bytes[ST_HOME_NVME],
					     .inner = e->tier[ST_HOME_NVME],
					     .fault = e->cfg.nvme_fault };

		if (!fc.inner)
			return st_error_set(-EINVAL, "engine: a fault for the nvme tier, but "
					    "the plan puts nothing on nvme");
		e->nvme_inner = fc.inner;
		e->tier[ST_HOME_NVME] = NULL;
		ret = st_tier_create(&st_tier_fault_ops, &fc, &e->tier[ST_HOME_NVME]);
	}
	return ret;
}

/* Extent i of the plan's pool `id` (of the resident unit u, or -1), or
 * NULL when the plan has no such pool. */
static struct st_extent *pool(struct st_engine *e, enum st_pool_id id, int u, uint32_t i)
{
	for (int p = 0; p < e->plan.n_pools; p++) {
		const struct st_plan_pool *x = &e->plan.pools[p];

		if (x->id == id && x->unit == u && i < x->count)
			return &e->pool_ext[e->pool_first[p] + i];
	}
	return NULL;
}

static uint32_t pool_count(const struct st_engine *e, enum st_pool_id id)
{
	for (int p = 0; p < e->plan.n_pools; p++)
		if (e->plan.pools[p].id == id)
			return e->plan.pools[p].count;
	return 0;
}

static void *vpool(struct st_engine *e, enum st_pool_id id, int u, uint32_t i)
{
	struct st_extent *x = pool(e, id, u, i);

	return x ? vaddr(e, x) : NULL;
}

static void *hpool(struct st_engine *e, enum st_pool_id id, uint32_t i)
{
	struct st_extent *x = pool(e, id, -1, i);

	return x ? haddr(e, x) : NULL;
}

/* Every shard in its home, then every pool of the plan, in its order. */
static int alloc_all(struct st_engine *e)
{
	const struct st_plan *p = &e->plan;
	int ret = 0, n = 0;

	for (int u = 0; u < e->n_units && ret == 0; u++)
		for (enum st_state s = 0; s < ST_STATE_COUNT && ret == 0; s++) {
			struct shard *x = shard(e, u, s);

			x->home = st_plan_home(p, u, s);
			if (!p->state_bytes[u * ST_STATE_COUNT + s])
				continue; /* the forward alone: G, P, M, V */
			ret = alloc_in(e, x->home, p->state_bytes[u * ST_STATE_COUNT + s], &x->ext);
			if (ret == 0 && e->update.spec_on && s >= ST_STATE_P && s <= ST_STATE_V)
				ret = alloc_in(e, x->home, p->state_bytes[u * ST_STATE_COUNT + s],
					       &x->alt);
		}
	e->pool_first = calloc((size_t)p->n_pools + 1, sizeof(*e->pool_first));
	for (int i = 0; i < p->n_pools; i++)
		n += (int)p->pools[i].count;
	e->pool_ext = calloc((size_t)n + 1, sizeof(*e->pool_ext));
	if (!e->pool_first || !e->pool_ext)
		return -ENOMEM;
	n = 0;
	for (int i = 0; i < p->n_pools && ret == 0; i++) {
		e->pool_first[i] = n;
		for (uint32_t j = 0; j < p->pools[i].count && ret == 0; j++)
			ret = alloc_in(e, p->pools[i].tier, p->pools[i].bytes, &e->pool_ext[n++]);
	}
	return ret;
}

/* The W slots (the resident one last) and their events. */
static int setup_slots(struct st_engine *e)
{
	uint32_t n = pool_count(e, ST_POOL_W_SLOT), nres = pool_count(e, ST_POOL_W_SLOT_RES);
	int ret = 0;

	e->fetch.n_slots = (int)(n + nres);
	e->fetch.slots = calloc((size_t)e->fetch.n_slots + 1, sizeof(*e->fetch.slots));
	e->fetch.ev_widen = calloc(2 * (size_t)e->fetch.n_slots + 1, sizeof(*e->fetch.ev_widen));
	e->fetch.ev_h2d = calloc((size_t)e->fetch.n_slots + 1, sizeof(*e->fetch.ev_h2d));
	if (!e->fetch.slots || !e->fetch.ev_widen || !e->fetch.ev_h2d)
		return -ENOMEM;
	for (int i = 0; i < e->fetch.n_slots && ret == 0; i++) {
		struct wslot *s = &e->fetch.slots[i];
		bool res = (uint32_t)i >= n;
		struct st_extent *stage = pool(e, res ? ST_POOL_W_STAGE_RES : ST_POOL_W_STAGE, -1,
					       res ? 0 : (uint32_t)i);

		s->seq = -1;
		s->resident = res;
		s->ext = *pool(e, res ? ST_POOL_W_SLOT_RES : ST_POOL_W_SLOT, -1,
			       res ? 0 : (uint32_t)i);
		if (stage)
			s->stage = *stage;
		ret = st_event_create(e->dev, &e->fetch.ev_widen[2 * i]);
		if (ret == 0)
			ret = st_event_create(e->dev, &e->fetch.ev_widen[2 * i + 1]);
		if (ret == 0)
			ret = st_event_create(e->dev, &e->fetch.ev_h2d[i]);
	}
	return ret;
}

/* The fp32 W and dW buffers: shared, and each resident unit's own. */
static int setup_unit_bufs(struct st_engine *e)
{
	int ret = 0;

	e->unit_bufs = calloc((size_t)e->n_units, sizeof(*e->unit_bufs));
	if (!e->unit_bufs)
		return -ENOMEM;
	for (int i = 0; i < e->batch.n_pairs && ret == 0; i++)
		ret = st_event_create(e->dev, &e->batch.ev_copied[i]);
	if (ret == 0)
		ret = st_event_create(e->dev, &e->update.ev_wstore);
	if (ret == 0 && e->layer_first)
		ret = st_event_create(e->dev, &e->lf_ev_dw);
	if (ret == 0 && e->layer_first)
		ret = st_event_create(e->dev, &e->lf_ev_red);
	for (int i = 0; i < 2 && ret == 0; i++) {
		struct st_extent *dw = pool(e, ST_POOL_DW, -1, (uint32_t)i);

		e->shared_bufs[i].w_compute = vpool(e, ST_POOL_WF, -1, 0);
		if (dw) { /* none for the forward alone */
			e->shared_bufs[i].dw_ext = *dw;
			e->shared_bufs[i].dw = vaddr(e, dw);
		}
		ret = st_event_create(e->dev, &e->shared_bufs[i].ev_dw);
		if (ret == 0)
			ret = st_event_create(e->dev, &e->shared_bufs[i].ev_red);
	}
	for (int u = 0; u < e->n_units && ret == 0; u++) {
		const struct st_unit_layout *l = st_model_unit_layout(e->model, u);

		if (l->reads_unit >= 0 && (l->reads_unit >= u ||
					   !unit_resident(e, l->reads_unit)))
			return st_error_set(-EINVAL, "engine: unit %d reads unit %d, which is not "
					    "an earlier resident unit", u, l->reads_unit);
		if (!l->resident)
			continue;
		e->unit_bufs[u].w_compute = vpool(e, ST_POOL_WF_RES, u, 0);
		if (pool(e, ST_POOL_DW_RES, u, 0)) {
			e->unit_bufs[u].dw_ext = *pool(e, ST_POOL_DW_RES, u, 0);
			e->unit_bufs[u].dw = vaddr(e, &e->unit_bufs[u].dw_ext);
		}
		if (e->layer_first) {
			int n = e->cfg.train.grad_accum;

			e->unit_bufs[u].dw_mb = calloc((size_t)n, sizeof(float *));
			if (!e->unit_bufs[u].dw_mb)
				return -ENOMEM;
			for (int a = 0; a < n; a++) {
				struct st_extent *x = pool(e, ST_POOL_DW_RES, u, (uint32_t)a);

				if (!x)
					return st_error_set(-EINVAL, "engine: the plan has no dW "
							    "of micro-batch %d for unit %d", a, u);
				e->unit_bufs[u].dw_mb[a] = vaddr(e, x);
			}
		}
		ret = st_event_create(e->dev, &e->unit_bufs[u].ev_dw);
		if (ret == 0)
			ret = st_event_create(e->dev, &e->unit_bufs[u].ev_red);
	}
	return ret;
}

static void setup_chains(struct st_engine *e)
{
	int n = 0;

	for (int i = 0; i < e->fetch.n_slots; i++)
		e->lanes.chains[n++] = &e->fetch.slots[i].fetch;
	e->lanes.chains[n++] = &e->grad.chain_d2h;
	e->lanes.chains[n++] = &e->grad.chain_write;
	e->lanes.chains[n++] = &e->grad.chain_read;
	e->lanes.chains[n++] = &e->zero.chain_wstore[0];
	e->lanes.chains[n++] = &e->zero.chain_wstore[1];
	for (int set = 0; set < 2; set++)
		for (enum st_state s = 0; s < ST_STATE_COUNT; s++) {
			e->lanes.chains[n++] = &e->update.sets[set].load[s];
			e->lanes.chains[n++] = &e->update.sets[set].store[s];
		}
	n += st_eng_act_chains(e, e->lanes.chains + n);
	e->lanes.n_chains = n;
}

static int setup_pools(struct st_engine *e)
{
	int ret = alloc_all(e);

	if (ret == 0)
		ret = setup_slots(e);
	if (ret == 0)
		ret = setup_unit_bufs(e);
	if (ret == 0)
		ret = st_eng_act_setup(e, pool(e, ST_POOL_ACT_SLOT, -1, 0),
				       pool(e, ST_POOL_ACT_HOME, -1, 0));
	if (ret < 0)
		return ret;
	e->lanes.chains =
		calloc((size_t)e->fetch.n_slots + 5 + 4 * ST_STATE_COUNT + 2 * (size_t)e->n_units,
		       sizeof(*e->lanes.chains));
	if (!e->lanes.chains)
		return -ENOMEM;
	setup_chains(e);
	e->act.ckpt_elems = e->plan.act_each_bytes / sizeof(float);
	e->act.ckpt = vpool(e, ST_POOL_ACT, -1, 0);
	e->act.grad_a = vpool(e, ST_POOL_DACT, -1, 0);
	e->act.grad_b = vpool(e, ST_POOL_DACT, -1, 1);
	e->work = vpool(e, ST_POOL_WORK, -1, 0);
	e->work_bytes = e->plan.work_bytes;
	/* a unit that keeps its forward: the pool's next extent, in unit
	 * order (layer-first: the next N, micro-batch a's the a-th, in
	 * saved_mb[u * N + a]) */
	{
		int n = e->layer_first ? e->cfg.train.grad_accum : 1;

		e->act.saved = calloc((size_t)e->n_units, sizeof(*e->act.saved));
		e->act.saved_mb = calloc((size_t)e->n_units * (size_t)n, sizeof(*e->act.saved_mb));
		if (!e->act.saved || !e->act.saved_mb)
			return -ENOMEM;
		e->act.saved_bytes = e->plan.saved_each_bytes;
		for (int u = 0, i = 0; u < e->n_units; u++) {
			if (!e->plan.keep[u])
				continue;
			for (int a = 0; a < n; a++)
				e->act.saved_mb[(size_t)u * (size_t)n + (size_t)a] =
					vpool(e, ST_POOL_SAVED, -1, (uint32_t)i++);
			e->act.saved[u] = e->act.saved_mb[(size_t)u * (size_t)n];
		}
	}
	e->dw_fold = vpool(e, ST_POOL_DW, -1, 2);
	if (e->layer_first && (e->cfg.train.grad_accum > 1 || e->world > 1) && !e->dw_fold)
		return st_error_set(-EINVAL, "engine: the plan has no dW to fold in");
	/* q8: each unit's M and V scales, in turn, from the host pool */
	if (e->mv_state == ST_OPTIM_STATE_Q8) {
		float *q = hpool(e, ST_POOL_Q8_SCALES, 0);

		if (!q)
			return st_error_set(-EINVAL, "engine: the plan has no q8 scales pool");
		memset(q, 0, pool(e, ST_POOL_Q8_SCALES, -1, 0)->len_bytes);
		for (int u = 0; u < e->n_units; u++)
			for (int k = 0; k < 2; k++) {
				e->q8_scale[k][u] = q;
				q += st_plan_q8_scale_elems(sh_elems(e, u, ST_STATE_M));
			}
	}
	e->batch.tokens = vpool(e, ST_POOL_TOKENS, -1, 0);
	e->batch.targets = vpool(e, ST_POOL_TARGETS, -1, 0);
	e->batch.seg = e->cfg.train.isolate ? vpool(e, ST_POOL_SEG, -1, 0) : NULL;
	/* their host side pinned where the device pins (st_engine_destroy()
	 * unpins), as the host tier's memory: the copies are queued and not
	 * waited for (engine_step.c) */
	ret = st_device_pin_host(e->dev, e->batch.tokens_buf[0], e->batch.host_bytes);
	if (ret < 0)
		return st_error_set(ret, "engine: pinning the batch's host tokens: %s",
				    st_error_last());
	e->batch.host_pinned = true;
	e->grad.landing = hpool(e, ST_POOL_LANDING, 0);
	e->grad.stage = hpool(e, ST_POOL_GSTAGE, 0);
	e->grad.final_u = -1;
	e->zero.scratch = vpool(e, ST_POOL_COMM_SCRATCH, -1, 0);
	if (e->zero.scratch)
		e->zero.scratch_ext = *pool(e, ST_POOL_COMM_SCRATCH, -1, 0);
	/* what no rank's update writes (past the unit's end) stays zero */
	for (uint32_t i = 0; i < 2; i++) {
		e->zero.wgather[i] = hpool(e, ST_POOL_W_GATHER, i);
		e->zero.wgather_unit[i] = -1;
		if (e->zero.wgather[i])
			memset(e->zero.wgather[i], 0, pool(e, ST_POOL_W_GATHER, -1, i)->len_bytes);
	}
	/* the step scalars: the losses, then the norm's sums when some
	 * unit's optimizer is on the device */
	e->grad.dev_losses = vpool(e, ST_POOL_STEP_SCALARS, -1, 0);
	e->grad.losses_bytes = st_align_up((size_t)e->cfg.train.grad_accum *
					   (size_t)e->cfg.train.batch * (size_t)e->cfg.train.seq *
					   sizeof(float), 16);
	e->grad.scalars_bytes = e->grad.losses_bytes;
	for (int u = 0; u < e->n_units; u++)
		if (opt_on_dev(e, u)) {
			e->grad.dev_sumsq = (struct st_compute_sumsq *)(void *)
				((char *)e->grad.dev_losses + e->grad.losses_bytes);
			e->update.dev_adam_bad = (uint32_t *)(void *)(e->grad.dev_sumsq + e->n_units);
			e->grad.dev_sumsq_scratch = e->grad.dev_sumsq + e->n_units + 1;
			e->grad.scalars_bytes += (size_t)e->n_units * sizeof(*e->grad.dev_sumsq);
			break;
		}
	e->grad.host_scalars = malloc(e->grad.scalars_bytes);
	if (!e->grad.dev_losses || !e->grad.host_scalars)
		return -ENOMEM;
	/* update staging only for the states that go through it: W's when
	 * some W is not in host, each of G, P, M, V's when some unit has it
	 * on nvme (st_plan_upd_staged(), one buffer per staged state a set) */
	for (int set = 0; set < 2; set++) {
		uint32_t nf = pool_count(e, ST_POOL_UPD_F32) / 2, i = 0;

		if (pool_count(e, ST_POOL_UPD_W))
			e->update.sets[set].ext[ST_STATE_W] =
				*pool(e, ST_POOL_UPD_W, -1, (uint32_t)set);
		for (enum st_state s = ST_STATE_G; s <= ST_STATE_V; s++)
			if (st_plan_upd_staged(&e->plan, s)) {
				e->update.sets[set].ext[s] =
					*pool(e, ST_POOL_UPD_F32, -1, set * nf + i++);
				assert(e->update.sets[set].ext[s].len_bytes >=
				       e->update.tile_elems * 4);
			}
		assert(i == nf);
	}
	/* Every host pool is nvme I/O memory: register it (fixed buffers). */
	if (e->tier[ST_HOME_NVME]) {
		struct st_extent all = { 0, e->plan.total_bytes[ST_HOME_HOST] };
		struct st_tier_buffer b = { haddr(e, &all), st_align_up(all.len_bytes, 4096) };

		ret = st_tier_register_buffers(e->tier[ST_HOME_NVME], &b, 1);
	}
	return ret;
}

static int plan_of(struct st_engine *e)
{
	const struct st_engine_config *cfg = &e->cfg;
	const struct st_train_config *c = &cfg->train;
	struct st_plan_input pin = {
		.model = e->model, .batch = c->batch, .seq = c->seq, .grad_accum = c->grad_accum,
		.bf16 = c->bf16, .gpu_mem_bytes = cfg->gpu_mem_bytes,
		.host_mem_bytes = cfg->host_mem_bytes, .nvme_mem_bytes = cfg->nvme_mem_bytes,
		.have_nvme = cfg->nvme_dirs != NULL, .params = cfg->params, .optim = cfg->optim,
		.prefetch = cfg->prefetch, .rates = cfg->rates, .homes = cfg->homes,
		.world = cfg->world, .rank = cfg->rank, .zero = cfg->zero,
		.host_compute = st_device_on_host(cfg->device),
		.activations = cfg->activations,
		.recompute = cfg->recompute,
		.schedule = cfg->schedule,
		.update = cfg->update,
		.optim_state = cfg->optim_state,
		.seg = c->isolate,
		.forward_only = cfg->forward_only,
	};

	if (cfg->forward_only) { /* nothing is kept for a backward */
		pin.recompute = ST_RECOMPUTE_ALL;
		pin.activations = ST_OFFLOAD_NONE;
		pin.schedule = ST_SCHEDULE_BATCH_FIRST;
		pin.update = ST_UPDATE_AFTER;
		pin.optim = ST_OFFLOAD_HOST;
	}

	/* the cuda compute runs AdamW (docs/gpu.md): auto may home the
	 * optimizer in vram when it fits */
	pin.optim_vram_auto = cfg->device && strcmp(cfg->device, "cuda") == 0 &&
			      cfg->optim_state == ST_OPTIM_STATE_F32;
	if (cfg->device && strcmp(cfg->device, "cuda") == 0) {
		if (pin.rates.compute_flops <= 0) {
			pin.rates.compute_flops = ST_PLAN_CUDA_COMPUTE_FLOPS;
			pin.rates.source[ST_RATE_COMPUTE] = ST_RATE_SRC_DEVICE;
		}
		if (pin.rates.copy_bps <= 0) {
			pin.rates.copy_bps = ST_PLAN_CUDA_COPY_BPS;
			pin.rates.source[ST_RATE_COPY] = ST_RATE_SRC_DEVICE;
		}
	}
	return st_plan_make(&pin, &e->plan);
}

/* The units' sizes and the W fetch sequence: the forward's units 0..U-2,
 * then the backward's U-1..0 but the resident units fetched in the forward
 * (kept widened). */
static int setup_units(struct st_engine *e)
{
	const struct st_train_config *c = &e->cfg.train;

	e->n_units = st_model_unit_count(e->model);
	e->fetch.depth = e->plan.prefetch;
	e->w_elem_bytes = c->bf16 ? 2 : 4;
	e->mv_state = e->cfg.optim_state;
	e->mv_elem_bytes = e->mv_state == ST_OPTIM_STATE_Q8 ? 1
			   : e->mv_state == ST_OPTIM_STATE_BF16 ? 2 : 4;
	e->unit_elems = calloc((size_t)e->n_units, sizeof(*e->unit_elems));
	e->shards = calloc((size_t)e->n_units * ST_STATE_COUNT, sizeof(*e->shards));
	e->grad.unit_sumsq = calloc((size_t)e->n_units, sizeof(double));
	e->fetch.seq = calloc(2 * (size_t)e->n_units, sizeof(int));
	/* tokens and targets, a pair each: [tok0 | tgt0 | tok1 | tgt1 ...],
	 * whole pages (setup_pools() pins them); two pairs batch-first, one
	 * per micro-batch layer-first (at least two) */
	e->layer_first = e->plan.schedule == ST_SCHEDULE_LAYER_FIRST;
	e->batch.n_pairs = e->layer_first ? ST_MAX(2, c->grad_accum) : 2;
	/* --packing isolated: each pair's seg after all the pairs */
	e->batch.host_bytes = st_align_up((c->isolate ? 3 : 2) * (size_t)e->batch.n_pairs *
						  c->batch * c->seq * sizeof(int32_t),
					  ST_PAGE_BYTES);
	e->batch.tokens_buf = calloc((size_t)e->batch.n_pairs, sizeof(int32_t *));
	e->batch.targets_buf = calloc((size_t)e->batch.n_pairs, sizeof(int32_t *));
	e->batch.seg_buf = calloc((size_t)e->batch.n_pairs, sizeof(int32_t *));
	e->batch.ev_copied = calloc((size_t)e->batch.n_pairs, sizeof(struct st_event *));
	if (!e->batch.tokens_buf || !e->batch.targets_buf || !e->batch.seg_buf ||
	    !e->batch.ev_copied)
		return -ENOMEM;
	if (posix_memalign((void **)&e->batch.tokens_buf[0], ST_PAGE_BYTES, e->batch.host_bytes))
		e->batch.tokens_buf[0] = NULL;
	if (!e->unit_elems || !e->shards || !e->grad.unit_sumsq || !e->fetch.seq ||
	    !e->batch.tokens_buf[0])
		return -ENOMEM;
	memset(e->batch.tokens_buf[0], 0, e->batch.host_bytes);
	for (int i = 0; i < e->batch.n_pairs; i++) {
		e->batch.tokens_buf[i] = e->batch.tokens_buf[0] + (size_t)2 * i * c->batch * c->seq;
		e->batch.targets_buf[i] = e->batch.tokens_buf[i] + (size_t)c->batch * c->seq;
		e->batch.seg_buf[i] = !c->isolate ? NULL
			: e->batch.tokens_buf[0] + (size_t)(2 * e->batch.n_pairs + i) * c->batch *
							   c->seq;
	}
	e->batch.tokens_host = e->batch.tokens_buf[0];
	e->batch.targets_host = e->batch.targets_buf[0];
	e->batch.seg_host = e->batch.seg_buf[0];
	e->host_waits = getenv("ST_HOST_WAITS") && strcmp(getenv("ST_HOST_WAITS"), "1") == 0;
	for (int u = 0; u < e->n_units; u++) {
		e->unit_elems[u] = st_model_unit_layout(e->model, u)->elems;
		e->max_unit_elems = ST_MAX(e->max_unit_elems, e->unit_elems[u]);
	}
	e->fetch.w_ready = e->n_units;
	e->world = e->plan.world;
	e->rank = e->plan.rank;
	e->zero.stage = e->plan.zero;
	e->zero.w_gather = e->world > 1 && e->zero.stage >= 1 && e->zero.stage <= 2;
	e->zero.w_stream = e->world > 1 && e->zero.stage >= 3;
	e->slice_elems = calloc((size_t)e->n_units, sizeof(*e->slice_elems));
	e->padded_elems = calloc((size_t)e->n_units, sizeof(*e->padded_elems));
	if (!e->slice_elems || !e->padded_elems)
		return -ENOMEM;
	for (int u = 0; u < e->n_units; u++) {
		e->slice_elems[u] = e->plan.slice_elems[u];
		e->padded_elems[u] = e->slice_elems[u] * (uint64_t)e->world;
	}
	e->update.tile_elems = e->plan.tile_elems;
	/* a smaller tile for tests (whole pages of bf16 and fp32; of q8's
	 * bytes too with the q8 state) */
	if (e->cfg.update_tile_elems &&
	    e->cfg.update_tile_elems % (e->mv_elem_bytes == 1 ? 4096u : 2048u) == 0)
		e->update.tile_elems = ST_MIN(e->update.tile_elems, e->cfg.update_tile_elems);
	/* measurements only (tools/zero-bench --baseline-env): a smaller tile */
	{
		const char *v = getenv("ST_UPDATE_TILE");
		uint64_t t = v ? strtoull(v, NULL, 10) : 0;

		if (t && t % (e->mv_elem_bytes == 1 ? 4096u : 2048u) == 0)
			e->update.tile_elems = ST_MIN(e->update.tile_elems, t);
	}
	if (e->mv_state == ST_OPTIM_STATE_Q8) /* filled in setup_pools() */
		for (int k = 0; k < 2; k++) {
			e->q8_scale[k] = calloc((size_t)e->n_units, sizeof(float *));
			if (!e->q8_scale[k])
				return -ENOMEM;
		}
	e->fetch.n_seq = 0;
	for (int u = 0; u <= e->n_units - 2; u++)
		e->fetch.seq[e->fetch.n_seq++] = u;
	for (int u = e->n_units - 1; u >= 0; u--)
		if (!(unit_resident(e, u) && u <= e->n_units - 2))
			e->fetch.seq[e->fetch.n_seq++] = u;
	return 0;
}

/* Initialise: P from the seed, W = round(P), M = V = 0. */
static int init_params(struct st_engine *e)
{
	float *p = NULL;
	int ret = 0;

	if (posix_memalign((void **)&p, ST_PAGE_BYTES, e->max_unit_elems * sizeof(float)))
		return -ENOMEM;
	for (int u = 0; ret == 0 && u < e->n_units; u++) {
		ret = st_model_init_unit(e->model, u, e->cfg.train.seed, p);
		if (ret == 0)
			ret = st_engine_write_state(e, u, p, NULL, NULL);
	}
	free(p);
	return ret;
}

/* A compact M and V (--optim-state bf16 or q8) runs in the host's AdamW
 * at world 1 only: the device's ADAMW op and ZeRO's slices take fp32. */
static int check_optim_state(struct st_engine *e)
{
	enum st_optim_state st = e->cfg.optim_state;

	if (st == ST_OPTIM_STATE_F32)
		return 0;
	if ((unsigned)st > ST_OPTIM_STATE_Q8)
		return st_error_set(-EINVAL, "optim state %d: want fp32, bf16 or q8", (int)st);
	if (e->plan.world > 1)
		return st_error_set(-EINVAL, "--optim-state %s: not with ZeRO at world > 1 "
				    "(docs/optim.md); use fp32", st_optim_state_name(st));
	for (int u = 0; u < e->plan.units; u++)
		if (e->plan.home[u * ST_STATE_COUNT + ST_STATE_P] == ST_HOME_VRAM)
			return st_error_set(-EINVAL, "--optim-state %s: not with the optimizer in "
					    "vram (--offload-optim vram; docs/optim.md); use host "
					    "or nvme", st_optim_state_name(st));
	return 0;
}

int st_engine_create(const struct st_engine_config *cfg, struct st_engine **out)
{
	const struct st_train_config *c = &cfg->train;
	struct st_engine *e;
	int ret;

	*out = NULL;
	if (c->batch <= 0 || c->seq <= 0 || c->grad_accum <= 0)
		return st_error_set(-EINVAL, "batch, seq and grad-accum must be positive");
	if (cfg->forward_only && (cfg->world > 1 || c->grad_accum != 1 ||
				  cfg->optim_state != ST_OPTIM_STATE_F32))
		return st_error_set(-EINVAL, "engine: the forward alone is one rank, one "
				    "micro-batch, fp32 M and V");
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->cfg = *cfg;
	/* tests through the CLI (tests/zero): $ST_TEST_NAN_GRAD=UNIT:STEP */
	if (!e->cfg.test_nan_grad_unit && getenv("ST_TEST_NAN_GRAD") &&
	    sscanf(getenv("ST_TEST_NAN_GRAD"), "%d:%d", &e->cfg.test_nan_grad_unit,
		   &e->cfg.test_nan_grad_step) == 2)
		e->cfg.test_nan_grad_unit++;
	if (!e->cfg.test_speculate_step && getenv("ST_TEST_SPECULATE_STEP"))
		e->cfg.test_speculate_step = atoi(getenv("ST_TEST_SPECULATE_STEP"));
	ret = st_model_create(&c->model, &e->model);
	if (ret < 0) {
		free(e);
		return ret;
	}
	ret = st_model_set_precision(e->model, cfg->compute_dtype);
	if (ret < 0) {
		st_model_destroy(e->model);
		free(e);
		return ret;
	}
	if (c->seq > c->model.ctx) {
		st_engine_destroy(e);
		return st_error_set(-EINVAL, "--seq %d is longer than the model's context of %d",
				    c->seq, c->model.ctx);
	}
	ret = plan_of(e);
	if (ret < 0) {
		st_model_destroy(e->model);
		free(e);
		return ret;
	}
	ret = check_optim_state(e);
	/* the update inside the backward: the plan's alternates on nvme */
	e->update.spec_on = e->plan.in_backward;
	if (ret == 0)
		ret = setup_units(e);
	if (ret == 0)
		ret = st_eng_zero_dirs(e);
	if (ret == 0)
		ret = open_tiers(e);
	if (ret == 0)
		ret = setup_pools(e);
	if (ret == 0)
		ret = st_eng_zero_setup(e);
	if (ret == 0)
		ret = st_eng_sums_init(e);
	if (ret == 0)
		ret = st_eng_update_setup(e);
	if (ret == 0 && cfg->trace) {
		for (int l = 0; l < ST_LANE_COUNT; l++)
			e->trace.lane[l] = st_trace_lane(cfg->trace, lane_names[l]);
		e->trace.host = st_trace_lane(cfg->trace, "host");
		e->trace.phase = st_trace_lane(cfg->trace, "phase");
	}
	if (ret == 0)
		ret = init_params(e);
	if (ret < 0) {
		st_engine_destroy(e);
		return ret;
	}
	*out = e;
	return 0;
}
