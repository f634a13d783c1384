/* strata: the planner's sizing (src/mem, strata/plan.h): the shape of the
 * model and the batch (st_shape: every unit's elements, slices and
 * activation bytes) and the pools of one placement at one prefetch depth
 * (st_pools_compute(), the one place that knows a pool's size), with the
 * names of states, tiers, pools and recompute modes. The planner's other
 * parts are listed in plan.c. */
#include "plan_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char *st_state_name(enum st_state s)
{
	static const char *names[] = { "W", "G", "P", "M", "V" };

	return (unsigned)s < ST_STATE_COUNT ? names[s] : "?";
}

const char *st_home_name(enum st_home h)
{
	static const char *names[] = { "vram", "host", "nvme" };

	return (unsigned)h < ST_HOME_COUNT ? names[h] : "?";
}

const char *st_recompute_name(enum st_recompute r)
{
	static const char *names[] = { "all", "auto", "none" };

	return (unsigned)r <= ST_RECOMPUTE_NONE ? names[r] : "?";
}

const char *st_update_order_name(enum st_update_order u)
{
	static const char *names[] = { "after", "in-backward", "auto" };

	return (unsigned)u <= ST_UPDATE_AUTO ? names[u] : "?";
}

const char *st_schedule_name(enum st_schedule s)
{
	static const char *names[] = { "batch-first", "layer-first", "auto" };

	return (unsigned)s <= ST_SCHEDULE_AUTO ? names[s] : "?";
}

uint64_t st_plan_page_bytes(uint64_t bytes)
{
	return st_align_up(bytes, ST_PAGE_BYTES);
}

static const struct {
	const char *name;
	enum st_home tier;
} st_pool_kinds[ST_POOL_KIND_COUNT] = {
	[ST_POOL_W_SLOT] = { "W slot", ST_HOME_VRAM },
	[ST_POOL_W_SLOT_RES] = { "W slot (resident)", ST_HOME_VRAM },
	[ST_POOL_W_STAGE] = { "W staging", ST_HOME_HOST },
	[ST_POOL_W_STAGE_RES] = { "W staging (resident)", ST_HOME_HOST },
	[ST_POOL_ACT] = { "checkpoints", ST_HOME_VRAM },
	[ST_POOL_WF] = { "W fp32", ST_HOME_VRAM },
	[ST_POOL_WF_RES] = { "W fp32 (resident)", ST_HOME_VRAM },
	[ST_POOL_DW] = { "dW", ST_HOME_VRAM },
	[ST_POOL_DW_RES] = { "dW (resident)", ST_HOME_VRAM },
	[ST_POOL_DACT] = { "activation grad", ST_HOME_VRAM },
	[ST_POOL_WORK] = { "workspace", ST_HOME_VRAM },
	[ST_POOL_TOKENS] = { "tokens", ST_HOME_VRAM },
	[ST_POOL_TARGETS] = { "targets", ST_HOME_VRAM },
	[ST_POOL_SEG] = { "segment starts", ST_HOME_VRAM },
	[ST_POOL_LANDING] = { "grad landing", ST_HOME_HOST },
	[ST_POOL_GSTAGE] = { "grad staging", ST_HOME_HOST },
	[ST_POOL_UPD_W] = { "update staging W", ST_HOME_HOST },
	[ST_POOL_UPD_F32] = { "update staging G,P,M,V", ST_HOME_HOST },
	[ST_POOL_COMM_SCRATCH] = { "comm scratch", ST_HOME_VRAM },
	[ST_POOL_W_GATHER] = { "W gather", ST_HOME_HOST },
	[ST_POOL_ACT_SLOT] = { "checkpoint slots", ST_HOME_VRAM },
	[ST_POOL_ACT_HOME] = { "checkpoint homes", ST_HOME_HOST },
	[ST_POOL_SAVED] = { "saved forward", ST_HOME_VRAM },
	[ST_POOL_STEP_SCALARS] = { "step scalars", ST_HOME_VRAM },
	[ST_POOL_Q8_SCALES] = { "q8 scales M,V", ST_HOME_HOST },
};

const char *st_pool_name(enum st_pool_id id)
{
	return (unsigned)id < ST_POOL_KIND_COUNT ? st_pool_kinds[id].name : "?";
}

static void pool_add(struct st_pools *p, enum st_pool_id id, uint64_t bytes,
		     uint32_t count, int unit)
{
	struct st_plan_pool *x;

	if (!count)
		return;
	x = &p->list[p->n++];
	*x = (struct st_plan_pool){ .id = id, .name = st_pool_kinds[id].name,
				    .tier = st_pool_kinds[id].tier, .bytes = bytes,
				    .count = count, .unit = unit };
	p->total[x->tier] += st_plan_page_bytes(bytes) * count;
}

static bool any(const struct st_shape *sh, const enum st_home *homes, enum st_state s0,
		enum st_state s1, enum st_home h, bool equal)
{
	for (int u = 0; u < sh->units; u++)
		for (int s = s0; s <= (int)s1; s++)
			if ((homes[u * ST_STATE_COUNT + s] == h) == equal)
				return true;
	return false;
}

/* --- activation checkpoints (docs/plan.md) ------------------------------------
 * In vram, the U-1 checkpoints are one extent of (U-1) * X. On the host,
 * checkpoint j lives in vram slot (j-1) mod A while it is in vram; the
 * last A stay there from the forward to the backward, checkpoints
 * 1..U-1-A go to their host home after the forward and come back into
 * their slot before the backward. */
int st_plan_act_slots(const struct st_shape *sh)
{
	return ST_MIN(sh->units - 1, ST_PLAN_ACT_SLOTS);
}

int st_plan_act_offloaded(const struct st_shape *sh, enum st_home a)
{
	return a == ST_HOME_HOST ? sh->units - 1 - st_plan_act_slots(sh) : 0;
}

/* The micro-batches whose activations wait at a unit boundary at once:
 * N layer-first, one batch-first. */
static uint64_t mbs_held(const struct st_shape *sh)
{
	return sh->layer_first ? (uint64_t)sh->accum : 1;
}

/* The checkpoint pools of the candidate's home (*sh->act_home).
 * Layer-first: in vram checkpoint j of micro-batch a at ((j-1) * N + a) *
 * X; on the host each slot and home a block of N of Xa. */
static void act_pools(const struct st_shape *sh, struct st_pools *p)
{
	uint64_t xa = st_align_up(sh->x_bytes, ST_PLAN_ACT_ALIGN);

	if (sh->units < 2)
		return;
	if (*sh->act_home != ST_HOME_HOST) {
		pool_add(p, ST_POOL_ACT, (uint64_t)(sh->units - 1) * sh->x_bytes * mbs_held(sh), 1,
			 -1);
		return;
	}
	/* layer-first: each slot and home holds the N micro-batches' block */
	pool_add(p, ST_POOL_ACT_SLOT, xa * mbs_held(sh), (uint32_t)st_plan_act_slots(sh), -1);
	pool_add(p, ST_POOL_ACT_HOME, xa * mbs_held(sh),
		 (uint32_t)st_plan_act_offloaded(sh, ST_HOME_HOST), -1);
}

/* --- recompute (st_recompute, docs/plan.md) ----------------------------------- */

/* The workspace: the largest a unit needs, a kept unit's scratch only. */
static uint64_t recomp_work(const struct st_shape *sh)
{
	uint64_t w = 0;

	for (int u = 0; u < sh->units; u++)
		w = ST_MAX(w, sh->keep[u] ? sh->work_kept[u] : sh->work_full[u]);
	return w ? w : 1;
}

/* One saved-forward extent per kept unit, of the largest kept unit's. */
static void recomp_pool(const struct st_shape *sh, struct st_pools *p)
{
	uint64_t each = 0;
	uint32_t n = 0;

	for (int u = 0; u < sh->units; u++)
		if (sh->keep[u]) {
			each = ST_MAX(each, sh->saved[u]);
			n++;
		}
	/* layer-first: each of the N micro-batches' forward is kept */
	pool_add(p, ST_POOL_SAVED, each, n * (uint32_t)mbs_held(sh), -1);
}

/* --- the optimizer on the device (docs/gpu.md) ----------------------------- */

/* Whether some unit's new W goes through update staging: its W is not in
 * host and its optimizer is not on the device (which writes W in place). */
static bool plan_upd_w(const struct st_shape *sh, const enum st_home *homes)
{
	for (int u = 0; u < sh->units; u++)
		if (homes[u * ST_STATE_COUNT + ST_STATE_W] != ST_HOME_HOST &&
		    homes[u * ST_STATE_COUNT + ST_STATE_G] != ST_HOME_VRAM)
			return true;
	return false;
}

/* ST_POOL_STEP_SCALARS: the step's per-token losses, A micro-batches of
 * B*T floats (to 16 B); with some G in vram, 16 B per unit (its sum of
 * squares) and 16 B for the AdamW count, then the sum's scratch for the
 * largest unit. */
static uint64_t plan_step_scalar_bytes(const struct st_shape *sh, bool g_vram)
{
	uint64_t n = st_align_up((uint64_t)sh->accum * sh->bt_bytes, 16);

	if (g_vram)
		n += 16 * ((uint64_t)sh->units + 1) +
		     16 * ((sh->epad_max + ST_PLAN_SLICE_ALIGN - 1) / ST_PLAN_SLICE_ALIGN);
	return n;
}

/* --- the pools of a placement ------------------------------------------------ */

/* The pools of placement `homes` (per unit and state) at prefetch k, in
 * the order the engine allocates them. This is the one place that knows
 * a pool's size. */
void st_pools_compute(const struct st_shape *sh, const enum st_home *homes, int k,
		      struct st_pools *p)
{
	bool g_nvme = any(sh, homes, ST_STATE_G, ST_STATE_G, ST_HOME_NVME, true);
	/* the forward alone: W, its slots and staging, the forward's buffers */
	bool fo = sh->forward_only;
	/* update staging per state (st_plan_upd_staged()): W's when some W
	 * goes home through it (not in host, not gathered, not written in
	 * place by the optimizer on the device: plan_upd_w()), G, P, M,
	 * V's each when some unit's is on nvme */
	bool upd_w = !sh->w_gather && plan_upd_w(sh, homes);
	uint32_t upd_f = 0;
	bool g_vram = any(sh, homes, ST_STATE_G, ST_STATE_G, ST_HOME_VRAM, true);
	uint64_t e_reg = 0, e_res = 0; /* the largest streamed unit of each kind */
	bool res_slot, reg_nvme = false, res_nvme = false;
	uint64_t slot_bytes, et = sh->tile;
	uint32_t slots;

	for (int u = 0; u < sh->units; u++) {
		enum st_home w = homes[u * ST_STATE_COUNT + ST_STATE_W];

		/* stage 3 at world > 1 gathers every W into a slot, the full
		 * (padded) unit */
		if (w == ST_HOME_VRAM && !sh->w_stream_all)
			continue;
		if (sh->resident[u])
			e_res = ST_MAX(e_res, sh->epad[u]);
		else
			e_reg = ST_MAX(e_reg, sh->epad[u]);
	}
	/* A streamed resident unit larger than every other streamed unit
	 * (GPT-2's embedding with its vocabulary) gets a slot of its own, so
	 * the k + 1 slots need only fit the rest: it is fetched once per
	 * micro-batch and kept widened. */
	res_slot = e_res > e_reg;
	slot_bytes = res_slot ? e_reg : ST_MAX(e_reg, e_res);
	slots = slot_bytes ? (uint32_t)k + 1 : 0;
	slot_bytes *= sh->wb;
	/* one host staging buffer per slot that a unit on nvme goes through */
	for (int u = 0; u < sh->units; u++) {
		if (homes[u * ST_STATE_COUNT + ST_STATE_W] != ST_HOME_NVME)
			continue;
		if (sh->resident[u] && res_slot)
			res_nvme = true;
		else
			reg_nvme = true;
	}

	for (int s = ST_STATE_G; s <= ST_STATE_V; s++)
		upd_f += any(sh, homes, (enum st_state)s, (enum st_state)s, ST_HOME_NVME, true);

	memset(p, 0, sizeof(*p));
	for (int u = 0; u < sh->units; u++)
		for (int s = 0; s < ST_STATE_COUNT; s++)
			p->home[homes[u * ST_STATE_COUNT + s]] +=
				st_shape_shard_bytes(sh, s, sh->st_elems[u * ST_STATE_COUNT + s]);
	for (int t = 0; t < ST_HOME_COUNT; t++)
		p->total[t] = p->home[t];
	pool_add(p, ST_POOL_W_SLOT, slot_bytes, slots, -1);
	pool_add(p, ST_POOL_W_SLOT_RES, e_res * sh->wb, res_slot, -1);
	pool_add(p, ST_POOL_W_STAGE, slot_bytes, reg_nvme ? slots : 0, -1);
	pool_add(p, ST_POOL_W_STAGE_RES, e_res * sh->wb, res_nvme, -1);
	if (!fo)
		act_pools(sh, p);
	/* W widened to fp32 and dW (two: one is computed while the other is
	 * copied out) for the units that are not resident; each resident unit
	 * has its own for the micro-batch, so a large vocabulary is not paid
	 * for five times. dA and dB: the activation gradient in and out. */
	pool_add(p, ST_POOL_WF, sh->e_reg * 4, 1, -1);
	for (int u = 0; u < sh->units; u++)
		if (sh->resident[u])
			pool_add(p, ST_POOL_WF_RES, sh->elems[u] * 4, 1, u);
	/* dW is the padded unit: the reduce-scatter cuts it in N slices.
	 * Layer-first at N > 1: a third, each micro-batch's dW after the
	 * first, added into the unit's (the fold on the device); a resident
	 * unit has one per micro-batch (the head adds into it before the
	 * unit's own backward) */
	pool_add(p, ST_POOL_DW, sh->epad_reg * 4,
		 fo ? 0 : sh->layer_first && (sh->accum > 1 || sh->world > 1) ? 3 : 2, -1);
	for (int u = 0; u < sh->units; u++)
		if (sh->resident[u] && !fo)
			pool_add(p, ST_POOL_DW_RES, sh->epad[u] * 4, (uint32_t)mbs_held(sh), u);
	pool_add(p, ST_POOL_DACT, sh->x_bytes * mbs_held(sh), 2, -1);
	pool_add(p, ST_POOL_WORK, recomp_work(sh), 1, -1);
	pool_add(p, ST_POOL_TOKENS, sh->bt_bytes * mbs_held(sh), 1, -1);
	pool_add(p, ST_POOL_TARGETS, sh->bt_bytes * mbs_held(sh), 1, -1);
	pool_add(p, ST_POOL_SEG, sh->bt_bytes * mbs_held(sh), sh->seg, -1);
	pool_add(p, ST_POOL_LANDING, sh->epad_max * 4,
		 !fo && any(sh, homes, ST_STATE_G, ST_STATE_G, ST_HOME_VRAM, false), -1);
	/* layer-first: G is written once a step, never read back to add */
	pool_add(p, ST_POOL_GSTAGE, sh->epad_max * 4,
		 !fo && g_nvme && sh->accum > 1 && !sh->layer_first, -1);
	/* the update sweep goes tile by tile, two sets of staging in turn:
	 * for G, P, M, V one buffer per staged state in each set */
	pool_add(p, ST_POOL_UPD_W, et * sh->wb, upd_w && !fo ? 2 : 0, -1);
	pool_add(p, ST_POOL_UPD_F32, et * 4, fo ? 0 : 2 * upd_f, -1);
	/* ZeRO at world > 1 (docs/zero.md) */
	pool_add(p, ST_POOL_COMM_SCRATCH, sh->epad_max * 4, sh->world > 1, -1);
	pool_add(p, ST_POOL_W_GATHER, sh->epad_max * sh->wb, sh->w_gather ? 2 : 0, -1);
	recomp_pool(sh, p);
	pool_add(p, ST_POOL_STEP_SCALARS, plan_step_scalar_bytes(sh, g_vram), 1, -1);
	if (sh->mvb == 1) { /* q8: every unit's M and V scales, in one extent */
		uint64_t n = 0;

		for (int u = 0; u < sh->units; u++)
			n += 2 * st_plan_q8_scale_elems(sh->st_elems[u * ST_STATE_COUNT + ST_STATE_M]);
		pool_add(p, ST_POOL_Q8_SCALES, n * 4, 1, -1);
	}
}

uint64_t st_pools_sum(const struct st_pools *p, enum st_pool_id a, enum st_pool_id b)
{
	uint64_t n = 0;

	for (int i = 0; i < p->n; i++)
		if (p->list[i].id >= a && p->list[i].id <= b)
			n += st_plan_page_bytes(p->list[i].bytes) * p->list[i].count;
	return n;
}

const struct st_plan_pool *st_pools_find(const struct st_pools *p, enum st_pool_id id)
{
	for (int i = 0; i < p->n; i++)
		if (p->list[i].id == id)
			return &p->list[i];
	return NULL;
}

/* The homes of a uniform placement. */
const enum st_home *st_plan_cand_homes(const struct st_shape *sh, struct st_cand c)
{
	*sh->act_home = c.a;
	if (c.explicit_homes)
		return c.explicit_homes;
	for (int u = 0; u < sh->units; u++)
		for (int s = 0; s < ST_STATE_COUNT; s++)
			sh->homes[u * ST_STATE_COUNT + s] = s == ST_STATE_W ? c.w : c.o;
	return sh->homes;
}

bool st_plan_fits(const struct st_pools *p, const uint64_t *budget, int skip)
{
	for (int t = 0; t < ST_HOME_COUNT; t++)
		if (t != skip && p->total[t] > budget[t])
			return false;
	return true;
}

/* --- the shape of the model and the batch ------------------------------------ */

/* Bytes of unit u's output at (B, T): the next unit's input, kept as its
 * activation checkpoint. */
static uint64_t out_bytes(const struct st_model *m, int u, int B, int T)
{
	return st_model_act_bytes(m, u, B, T);
}

void st_shape_fini(struct st_shape *sh)
{
	free(sh->slice);
	free(sh->epad);
	free(sh->st_elems);
	free(sh->elems);
	free(sh->resident);
	free(sh->homes);
	free(sh->act_home);
	free(sh->act_copy);
	free(sh->saved);
	free(sh->work_kept);
	free(sh->work_full);
	free(sh->keep);
}

/* ZeRO's slices (docs/zero.md): S_u = ceil(e_u / N) rounded up to
 * ST_PLAN_SLICE_ALIGN at world > 1, the unit itself at world 1; a sharded
 * state holds S_u, an unsharded one the padded unit N * S_u. The update
 * tile is the largest slice, at most ST_UPDATE_TILE_ELEMS (at world 1 the
 * largest unit): a rank's tiles start at its slice and the last one ends
 * with it, and the nvme checksums cut every slice of a shard the same way
 * (engine_sums.c), so they line up with a rank's tiles whatever the
 * slices' sizes. */
static int shape_slices(const struct st_plan_input *in, struct st_shape *sh)
{
	int N = sh->world;
	uint64_t s_max = 0;
	struct st_plan tmp = { .world = N, .zero = sh->zero };

	sh->slice = calloc((size_t)sh->units, sizeof(*sh->slice));
	sh->epad = calloc((size_t)sh->units, sizeof(*sh->epad));
	sh->st_elems = calloc((size_t)sh->units * ST_STATE_COUNT, sizeof(*sh->st_elems));
	if (!sh->slice || !sh->epad || !sh->st_elems) {
		st_shape_fini(sh);
		return st_error_set(-ENOMEM, "plan: out of memory");
	}
	ST_UNUSED(in);
	sh->w_gather = N > 1 && sh->zero >= 1 && sh->zero <= 2;
	sh->w_stream_all = N > 1 && sh->zero >= 3;
	for (int u = 0; u < sh->units; u++) {
		uint64_t e = sh->elems[u];

		sh->slice[u] = N == 1 ? e
			       : st_align_up((e + (uint64_t)N - 1) / (uint64_t)N,
					     ST_PLAN_SLICE_ALIGN);
		sh->epad[u] = sh->slice[u] * (uint64_t)N;
		sh->epad_max = ST_MAX(sh->epad_max, sh->epad[u]);
		if (!sh->resident[u])
			sh->epad_reg = ST_MAX(sh->epad_reg, sh->epad[u]);
		s_max = ST_MAX(s_max, sh->slice[u]);
		for (int s = 0; s < ST_STATE_COUNT; s++)
			sh->st_elems[u * ST_STATE_COUNT + s] =
				sh->forward_only && s != ST_STATE_W ? 0
				: st_plan_sharded(&tmp, s) ? sh->slice[u] : sh->epad[u];
	}
	/* both multiples of ST_PLAN_SLICE_ALIGN at world > 1: whole pages */
	sh->tile = ST_MIN(N > 1 ? s_max : sh->e_max, (uint64_t)ST_UPDATE_TILE_ELEMS);
	return 0;
}

int st_shape_init(const struct st_plan_input *in, struct st_shape *sh)
{
	const struct st_model *m = in->model;

	memset(sh, 0, sizeof(*sh));
	sh->model = m;
	sh->world = in->world > 1 ? in->world : 1;
	sh->zero = in->zero;
	sh->units = st_model_unit_count(m);
	sh->accum = in->grad_accum;
	sh->layer_first = in->schedule == ST_SCHEDULE_LAYER_FIRST;
	sh->forward_only = in->forward_only;
	sh->in_backward = in->update != ST_UPDATE_AFTER && in->optim_state != ST_OPTIM_STATE_Q8;
	sh->wb = in->bf16 ? 2 : 4;
	sh->mvb = in->optim_state == ST_OPTIM_STATE_Q8 ? 1 : in->optim_state == ST_OPTIM_STATE_BF16 ? 2 : 4;
	sh->elems = calloc((size_t)sh->units, sizeof(*sh->elems));
	sh->resident = calloc((size_t)sh->units, sizeof(*sh->resident));
	sh->homes = calloc((size_t)sh->units * ST_STATE_COUNT, sizeof(*sh->homes));
	sh->saved = calloc((size_t)sh->units, sizeof(*sh->saved));
	sh->work_kept = calloc((size_t)sh->units, sizeof(*sh->work_kept));
	sh->work_full = calloc((size_t)sh->units, sizeof(*sh->work_full));
	sh->keep = calloc((size_t)sh->units, sizeof(*sh->keep));
	if (!sh->elems || !sh->resident || !sh->homes || !sh->saved || !sh->work_kept ||
	    !sh->work_full || !sh->keep) {
		st_shape_fini(sh);
		return st_error_set(-ENOMEM, "plan: out of memory");
	}
	for (int u = 0; u < sh->units; u++) {
		const struct st_unit_layout *l = st_model_unit_layout(m, u);
		size_t work = st_model_work_bytes(m, u, in->batch, in->seq), kept;

		sh->elems[u] = l->elems;
		sh->resident[u] = l->resident;
		sh->n_resident += l->resident;
		sh->e_max = ST_MAX(sh->e_max, l->elems);
		if (l->resident)
			sh->e_res = ST_MAX(sh->e_res, l->elems);
		else
			sh->e_reg = ST_MAX(sh->e_reg, l->elems);
		sh->work_bytes = ST_MAX(sh->work_bytes, (uint64_t)work);
		sh->work_full[u] = work;
		sh->saved[u] = st_model_saved_bytes(m, u, in->batch, in->seq, &kept);
		sh->work_kept[u] = kept;
		sh->x_bytes = ST_MAX(sh->x_bytes, out_bytes(m, u, in->batch, in->seq));
	}
	if (sh->n_resident > ST_PLAN_MAX_RESIDENT) {
		st_shape_fini(sh);
		return st_error_set(-EINVAL, "plan: %d resident units (at most %d)",
				    sh->n_resident, ST_PLAN_MAX_RESIDENT);
	}
	sh->act_bytes = st_plan_page_bytes((uint64_t)(sh->units - 1) * sh->x_bytes);
	sh->bt_bytes = (uint64_t)in->batch * (uint64_t)in->seq * 4;
	sh->seg = in->seg;
	sh->act_home = calloc(1, sizeof(*sh->act_home));
	sh->act_copy = calloc((size_t)sh->units, sizeof(*sh->act_copy));
	if (!sh->act_home || !sh->act_copy) {
		st_shape_fini(sh);
		return st_error_set(-ENOMEM, "plan: out of memory");
	}
	for (int j = 1; j < sh->units; j++)
		sh->act_copy[j] = st_align_up(out_bytes(m, j - 1, in->batch, in->seq),
					      ST_PLAN_ACT_ALIGN);
	return shape_slices(in, sh);
}
