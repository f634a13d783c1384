/* strata: the placement planner. See strata/plan.h for the pools and
 * docs/plan.md for the policy.
 *
 * The policy starts from the uniform placements (every unit's W in one
 * home, G, P, M, V of every unit in one home: at most 3 x 2 rows) and
 * improves each row that fits by the split of src/mem/plan_split.c, which
 * moves shards to faster tiers while the budgets hold; the row predicted
 * fastest wins. The same small set of rows keeps each tier's minimum
 * exact (st_cond_min). The pools are sized from per-(unit, state) homes,
 * so explicit homes (the input's `homes`: one candidate) and split ones go
 * through the same code. */
#include "strata/plan.h"
#include "plan_split.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Defaults for a 2-core VM without a GPU (docs/plan.md says how to give
 * measured ones). */
#define ST_PLAN_COMPUTE_FLOPS 50e9
#define ST_PLAN_COPY_BPS 8e9
#define ST_PLAN_NVME_READ_BPS 1.5e9
#define ST_PLAN_NVME_WRITE_BPS 1.2e9
#define ST_PLAN_ADAM_BPS 10e9
#define ST_PLAN_NET_BPS 10e9
/* CPU AdamW bytes per parameter: read G, P, M, V, write P, M, V and W. */
#define ST_PLAN_ADAM_BYTES_PER_PARAM 30.0

#define ST_PLAN_UNLIMITED UINT64_MAX

/* What the pools are made of; fixed by the model and the batch. */
struct st_shape {
	const struct st_model *model;
	int units, accum;
	uint64_t wb;           /* bytes per W element: 2 or 4 */
	uint64_t *elems;       /* [units] e_u */
	bool *resident;        /* [units] kept on the device for a micro-batch */
	int n_resident;
	uint64_t e_max;        /* E */
	uint64_t e_reg;        /* the largest unit that is not resident */
	uint64_t e_res;        /* the largest resident unit */
	uint64_t x_bytes;      /* X: the largest unit output (a checkpoint) */
	uint64_t bt_bytes;     /* B*T*4: tokens or targets */
	uint64_t work_bytes;   /* max_u st_model_work_bytes */
	uint64_t act_bytes;    /* rounded activation checkpoint pool */
	enum st_home *homes;   /* [units * ST_STATE_COUNT] scratch for a placement */
	/* ZeRO: world (>= 1), stage; per unit the slice S_u and the padded
	 * unit N * S_u (e_u at world 1); per (unit, state) the elements of
	 * this rank's shard */
	int world, zero;
	uint64_t *slice, *epad, *st_elems;
	uint64_t epad_max, epad_reg; /* the largest padded unit, and not resident */
	uint64_t tile;         /* the update tile (elements) */
	bool w_gather;         /* stages 1-2 at world > 1: W slices gathered */
	bool w_stream_all;     /* stage 3 at world > 1: every W goes through a slot */
	/* activation checkpoints: the candidate's home (scratch, set with
	 * homes by st_cand_homes()), and per checkpoint j (1..U-1) the bytes a
	 * copy of it moves (ST_PLAN_ACT_ALIGN-rounded), [units] */
	enum st_home *act_home;
	uint64_t *act_copy;
	/* recompute: per unit its saved-forward bytes (0: keeps nothing), its
	 * workspace when kept (scratch only) and when not, and whether it
	 * keeps in the placement being sized */
	uint64_t *saved, *work_kept, *work_full;
	bool *keep;
};

/* One placement: W's home and G, P, M, V's home. */
struct st_cand {
	enum st_home w, o;
	const enum st_home *explicit_homes; /* the input's, when it gives them */
	enum st_home a; /* the activation checkpoints: vram or host */
};

/* Pools of one placement at one prefetch depth: the list the engine
 * allocates, and the totals the budgets are held to. */
struct st_pools {
	uint64_t home[ST_HOME_COUNT];
	struct st_plan_pool list[ST_PLAN_MAX_POOLS];
	int n;
	uint64_t total[ST_HOME_COUNT];
};

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

static uint64_t st_pg(uint64_t bytes)
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
	[ST_POOL_LANDING] = { "grad landing", ST_HOME_HOST },
	[ST_POOL_GSTAGE] = { "grad staging", ST_HOME_HOST },
	[ST_POOL_UPD_W] = { "update staging W", ST_HOME_HOST },
	[ST_POOL_UPD_F32] = { "update staging G,P,M,V", ST_HOME_HOST },
	[ST_POOL_COMM_SCRATCH] = { "comm scratch", ST_HOME_VRAM },
	[ST_POOL_W_GATHER] = { "W gather", ST_HOME_HOST },
	[ST_POOL_ACT_SLOT] = { "checkpoint slots", ST_HOME_VRAM },
	[ST_POOL_ACT_HOME] = { "checkpoint homes", ST_HOME_HOST },
	[ST_POOL_SAVED] = { "saved forward", ST_HOME_VRAM },
	[ST_POOL_OPT_STAT] = { "optimizer stats", ST_HOME_VRAM },
};

const char *st_pool_name(enum st_pool_id id)
{
	return (unsigned)id < ST_POOL_KIND_COUNT ? st_pool_kinds[id].name : "?";
}

static void st_pool_add(struct st_pools *p, enum st_pool_id id, uint64_t bytes,
			uint32_t count, int unit)
{
	struct st_plan_pool *x;

	if (!count)
		return;
	x = &p->list[p->n++];
	*x = (struct st_plan_pool){ .id = id, .name = st_pool_kinds[id].name,
				    .tier = st_pool_kinds[id].tier, .bytes = bytes,
				    .count = count, .unit = unit };
	p->total[x->tier] += st_pg(bytes) * count;
}

static bool st_any(const struct st_shape *sh, const enum st_home *homes, enum st_state s0,
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
static int st_act_slots(const struct st_shape *sh)
{
	return ST_MIN(sh->units - 1, ST_PLAN_ACT_SLOTS);
}

static int st_act_offloaded(const struct st_shape *sh, enum st_home a)
{
	return a == ST_HOME_HOST ? sh->units - 1 - st_act_slots(sh) : 0;
}

static void st_act_pools(const struct st_shape *sh, struct st_pools *p);
static void st_act_traffic(const struct st_shape *sh, struct st_plan *p);
static int st_act_hint(const struct st_plan_input *in, int ret);
static uint64_t st_recomp_work(const struct st_shape *sh);
static void st_recomp_pool(const struct st_shape *sh, struct st_pools *p);
static void st_recomp_base(const struct st_plan_input *in, const struct st_shape *sh);

/* --- the optimizer on the device (docs/gpu.md) ----------------------------- */

/* Whether some unit's new W goes through update staging: its W is not in
 * host and its optimizer is not on the device (which writes W in place). */
static bool st_plan_upd_w(const struct st_shape *sh, const enum st_home *homes)
{
	for (int u = 0; u < sh->units; u++)
		if (homes[u * ST_STATE_COUNT + ST_STATE_W] != ST_HOME_HOST &&
		    homes[u * ST_STATE_COUNT + ST_STATE_G] != ST_HOME_VRAM)
			return true;
	return false;
}

/* ST_POOL_OPT_STAT: 16 B per unit (its sum of squares) and 16 B for the
 * AdamW count, then the sum's scratch for the largest unit. */
static uint64_t st_plan_opt_stat_bytes(const struct st_shape *sh)
{
	return 16 * ((uint64_t)sh->units + 1) +
	       16 * ((sh->epad_max + ST_PLAN_SLICE_ALIGN - 1) / ST_PLAN_SLICE_ALIGN);
}

/* A unit's G, P, M, V in vram: all four, with its W, at world 1. */
static int st_plan_vram_optim_check(const struct st_plan_input *in)
{
	int U = st_model_unit_count(in->model);

	if (in->optim == ST_OFFLOAD_VRAM && !in->homes) {
		if (in->world > 1)
			return st_error_set(-EINVAL, "--offload-optim vram: one rank only "
					    "(at world > 1 the optimizer state is sharded on the host)");
		if (in->params != ST_OFFLOAD_AUTO && in->params != ST_OFFLOAD_NONE)
			return st_error_set(-EINVAL, "--offload-optim vram needs W in vram "
					    "(--offload-params none or auto)");
	}
	for (int u = 0; in->homes && u < U; u++) {
		const enum st_home *h = &in->homes[u * ST_STATE_COUNT];
		int nv = 0;

		for (int s = ST_STATE_G; s <= ST_STATE_V; s++)
			nv += h[s] == ST_HOME_VRAM;
		if (nv == 0)
			continue;
		if (nv != 4 || h[ST_STATE_W] != ST_HOME_VRAM || in->world > 1)
			return st_error_set(-EINVAL, "plan: unit %d's G, P, M, V: in vram all "
					    "four go together, with W in vram, at world 1", u);
	}
	return 0;
}

/* The pools of placement `homes` (per unit and state) at prefetch k, in
 * the order the engine allocates them. This is the one place that knows
 * a pool's size. */
static void st_pools_compute(const struct st_shape *sh, const enum st_home *homes, int k,
			     struct st_pools *p)
{
	bool g_nvme = st_any(sh, homes, ST_STATE_G, ST_STATE_G, ST_HOME_NVME, true);
	/* update staging per state (st_plan_upd_staged()): W's when some W
	 * goes home through it (not in host, not gathered, not written in
	 * place by the optimizer on the device: st_plan_upd_w()), G, P, M,
	 * V's each when some unit's is on nvme */
	bool upd_w = !sh->w_gather && st_plan_upd_w(sh, homes);
	uint32_t upd_f = 0;
	bool g_vram = st_any(sh, homes, ST_STATE_G, ST_STATE_G, ST_HOME_VRAM, true);
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
		upd_f += st_any(sh, homes, (enum st_state)s, (enum st_state)s, ST_HOME_NVME, true);

	memset(p, 0, sizeof(*p));
	for (int u = 0; u < sh->units; u++)
		for (int s = 0; s < ST_STATE_COUNT; s++)
			p->home[homes[u * ST_STATE_COUNT + s]] +=
				sh->st_elems[u * ST_STATE_COUNT + s] * (s == ST_STATE_W ? sh->wb : 4);
	for (int t = 0; t < ST_HOME_COUNT; t++)
		p->total[t] = p->home[t];
	st_pool_add(p, ST_POOL_W_SLOT, slot_bytes, slots, -1);
	st_pool_add(p, ST_POOL_W_SLOT_RES, e_res * sh->wb, res_slot, -1);
	st_pool_add(p, ST_POOL_W_STAGE, slot_bytes, reg_nvme ? slots : 0, -1);
	st_pool_add(p, ST_POOL_W_STAGE_RES, e_res * sh->wb, res_nvme, -1);
	st_act_pools(sh, p);
	/* W widened to fp32 and dW (two: one is computed while the other is
	 * copied out) for the units that are not resident; each resident unit
	 * has its own for the micro-batch, so a large vocabulary is not paid
	 * for five times. dA and dB: the activation gradient in and out. */
	st_pool_add(p, ST_POOL_WF, sh->e_reg * 4, 1, -1);
	for (int u = 0; u < sh->units; u++)
		if (sh->resident[u])
			st_pool_add(p, ST_POOL_WF_RES, sh->elems[u] * 4, 1, u);
	/* dW is the padded unit: the reduce-scatter cuts it in N slices */
	st_pool_add(p, ST_POOL_DW, sh->epad_reg * 4, 2, -1);
	for (int u = 0; u < sh->units; u++)
		if (sh->resident[u])
			st_pool_add(p, ST_POOL_DW_RES, sh->epad[u] * 4, 1, u);
	st_pool_add(p, ST_POOL_DACT, sh->x_bytes, 2, -1);
	st_pool_add(p, ST_POOL_WORK, st_recomp_work(sh), 1, -1);
	st_pool_add(p, ST_POOL_TOKENS, sh->bt_bytes, 1, -1);
	st_pool_add(p, ST_POOL_TARGETS, sh->bt_bytes, 1, -1);
	st_pool_add(p, ST_POOL_LANDING, sh->epad_max * 4,
		    st_any(sh, homes, ST_STATE_G, ST_STATE_G, ST_HOME_VRAM, false), -1);
	st_pool_add(p, ST_POOL_GSTAGE, sh->epad_max * 4, g_nvme && sh->accum > 1, -1);
	/* the update sweep goes tile by tile, two sets of staging in turn:
	 * for G, P, M, V one buffer per staged state in each set */
	st_pool_add(p, ST_POOL_UPD_W, et * sh->wb, upd_w ? 2 : 0, -1);
	st_pool_add(p, ST_POOL_UPD_F32, et * 4, 2 * upd_f, -1);
	/* ZeRO at world > 1 (docs/zero.md) */
	st_pool_add(p, ST_POOL_COMM_SCRATCH, sh->epad_max * 4, sh->world > 1, -1);
	st_pool_add(p, ST_POOL_W_GATHER, sh->epad_max * sh->wb, sh->w_gather ? 2 : 0, -1);
	st_recomp_pool(sh, p);
	st_pool_add(p, ST_POOL_OPT_STAT, st_plan_opt_stat_bytes(sh), g_vram, -1);
}

static uint64_t st_pools_sum(const struct st_pools *p, enum st_pool_id a, enum st_pool_id b)
{
	uint64_t n = 0;

	for (int i = 0; i < p->n; i++)
		if (p->list[i].id >= a && p->list[i].id <= b)
			n += st_pg(p->list[i].bytes) * p->list[i].count;
	return n;
}

static const struct st_plan_pool *st_pools_find(const struct st_pools *p, enum st_pool_id id)
{
	for (int i = 0; i < p->n; i++)
		if (p->list[i].id == id)
			return &p->list[i];
	return NULL;
}

/* The homes of a uniform placement. */
static const enum st_home *st_cand_homes(const struct st_shape *sh, struct st_cand c)
{
	*sh->act_home = c.a;
	if (c.explicit_homes)
		return c.explicit_homes;
	for (int u = 0; u < sh->units; u++)
		for (int s = 0; s < ST_STATE_COUNT; s++)
			sh->homes[u * ST_STATE_COUNT + s] = s == ST_STATE_W ? c.w : c.o;
	return sh->homes;
}

static bool st_fits(const struct st_pools *p, const uint64_t *budget, int skip)
{
	for (int t = 0; t < ST_HOME_COUNT; t++)
		if (t != skip && p->total[t] > budget[t])
			return false;
	return true;
}

/* Bytes of unit u's output at (B, T): the next unit's input, kept as its
 * activation checkpoint. */
static uint64_t st_out_bytes(const struct st_model *m, int u, int B, int T)
{
	return st_model_act_bytes(m, u, B, T);
}

static void st_shape_fini(struct st_shape *sh)
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
static int st_shape_slices(const struct st_plan_input *in, struct st_shape *sh)
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
				st_plan_sharded(&tmp, s) ? sh->slice[u] : sh->epad[u];
	}
	/* both multiples of ST_PLAN_SLICE_ALIGN at world > 1: whole pages */
	sh->tile = ST_MIN(N > 1 ? s_max : sh->e_max, (uint64_t)ST_UPDATE_TILE_ELEMS);
	return 0;
}

static int st_shape_init(const struct st_plan_input *in, struct st_shape *sh)
{
	const struct st_model *m = in->model;

	memset(sh, 0, sizeof(*sh));
	sh->model = m;
	sh->world = in->world > 1 ? in->world : 1;
	sh->zero = in->zero;
	sh->units = st_model_unit_count(m);
	sh->accum = in->grad_accum;
	sh->wb = in->bf16 ? 2 : 4;
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
		sh->x_bytes = ST_MAX(sh->x_bytes, st_out_bytes(m, u, in->batch, in->seq));
	}
	if (sh->n_resident > ST_PLAN_MAX_RESIDENT) {
		st_shape_fini(sh);
		return st_error_set(-EINVAL, "plan: %d resident units (at most %d)",
				    sh->n_resident, ST_PLAN_MAX_RESIDENT);
	}
	sh->act_bytes = st_pg((uint64_t)(sh->units - 1) * sh->x_bytes);
	sh->bt_bytes = (uint64_t)in->batch * (uint64_t)in->seq * 4;
	sh->act_home = calloc(1, sizeof(*sh->act_home));
	sh->act_copy = calloc((size_t)sh->units, sizeof(*sh->act_copy));
	if (!sh->act_home || !sh->act_copy) {
		st_shape_fini(sh);
		return st_error_set(-ENOMEM, "plan: out of memory");
	}
	for (int j = 1; j < sh->units; j++)
		sh->act_copy[j] = st_align_up(st_out_bytes(m, j - 1, in->batch, in->seq),
					      ST_PLAN_ACT_ALIGN);
	return st_shape_slices(in, sh);
}

static int st_rates_fill(const struct st_plan_rates *r, struct st_plan_rates *out)
{
	static const double defaults[ST_RATE_COUNT] = {
		ST_PLAN_COMPUTE_FLOPS, ST_PLAN_COPY_BPS, ST_PLAN_NVME_READ_BPS,
		ST_PLAN_NVME_WRITE_BPS, ST_PLAN_ADAM_BPS, ST_PLAN_NET_BPS,
	};
	double *slots[ST_RATE_COUNT] = { &out->compute_flops, &out->copy_bps,
					 &out->nvme_read_bps, &out->nvme_write_bps,
					 &out->adam_bps, &out->net_bps };

	for (int i = 0; i < ST_RATE_COUNT; i++) {
		double v = st_plan_rate_get(r, (enum st_rate)i);

		if (!isfinite(v) || v < 0)
			return st_error_set(-EINVAL, "plan: rate %g is not a positive number", v);
	}
	for (int i = 0; i < ST_RATE_COUNT; i++) {
		double v = st_plan_rate_get(r, (enum st_rate)i);

		*slots[i] = v > 0 ? v : defaults[i];
		out->source[i] = !(v > 0) ? ST_RATE_SRC_DEFAULT
			       : r->source[i] ? r->source[i] : ST_RATE_SRC_FLAG;
	}
	return 0;
}

static int st_input_check(const struct st_plan_input *in)
{
	int seq_max;

	if (!in || !in->model)
		return st_error_set(-EINVAL, "plan: no model");
	seq_max = st_model_config(in->model)->ctx;
	if (in->batch < 1 || in->grad_accum < 1)
		return st_error_set(-EINVAL, "plan: batch %d and grad_accum %d must be >= 1",
				    in->batch, in->grad_accum);
	if (in->seq < 1 || in->seq > seq_max)
		return st_error_set(-EINVAL, "plan: seq %d is outside 1..%d (the model's context)",
				    in->seq, seq_max);
	if (in->prefetch < 0 || in->prefetch > st_model_unit_count(in->model))
		return st_error_set(-EINVAL, "plan: prefetch %d is outside 0..%d (the model's units)",
				    in->prefetch, st_model_unit_count(in->model));
	if (in->world < 0 || in->world > 4096 || in->rank < 0 ||
	    in->rank >= (in->world > 1 ? in->world : 1))
		return st_error_set(-EINVAL, "plan: rank %d outside world %d", in->rank, in->world);
	if (in->zero < 0 || in->zero > 3)
		return st_error_set(-EINVAL, "plan: --zero %d: the stages are 0, 1, 2 and 3",
				    in->zero);
	if ((unsigned)in->params > ST_OFFLOAD_NVME || (unsigned)in->optim > ST_OFFLOAD_VRAM)
		return st_error_set(-EINVAL, "plan: unknown offload choice");
	if ((unsigned)in->recompute > ST_RECOMPUTE_NONE)
		return st_error_set(-EINVAL, "plan: unknown recompute choice");
	if (in->params == ST_OFFLOAD_NVME && !in->have_nvme)
		return st_error_set(-EINVAL, "--offload-params nvme needs --nvme DIR");
	if (in->optim == ST_OFFLOAD_NVME && !in->have_nvme)
		return st_error_set(-EINVAL, "--offload-optim nvme needs --nvme DIR");
	for (int u = 0; in->homes && u < st_model_unit_count(in->model); u++)
		for (int s = 0; s < ST_STATE_COUNT; s++) {
			enum st_home h = in->homes[u * ST_STATE_COUNT + s];

			if ((unsigned)h >= ST_HOME_COUNT)
				return st_error_set(-EINVAL, "plan: unit %d's %s cannot live in "
						    "tier %d (vram, host or nvme)", u,
						    st_state_name((enum st_state)s), (int)h);
			if (h == ST_HOME_NVME && !in->have_nvme)
				return st_error_set(-EINVAL, "plan: unit %d's %s on nvme needs "
						    "--nvme DIR", u,
						    st_state_name((enum st_state)s));
		}
	if ((unsigned)in->activations > ST_OFFLOAD_HOST)
		return st_error_set(-EINVAL, "--offload-activations: the checkpoints live in "
				    "vram or host (auto, vram or host)");
	return st_plan_vram_optim_check(in);
}

/* The placements the options allow, most preferred first: W as close to
 * the device as possible, then the optimizer state in host. */
static int st_cands(const struct st_plan_input *in, struct st_cand *c)
{
	enum st_home ws[3], os[3];
	int nw = 0, no = 0, n = 0;

	if (in->homes) {
		c[0] = (struct st_cand){ .w = in->homes[ST_STATE_W], .o = in->homes[ST_STATE_G],
					 .explicit_homes = in->homes };
		return 1;
	}

	switch (in->params) {
	case ST_OFFLOAD_NONE: ws[nw++] = ST_HOME_VRAM; break;
	case ST_OFFLOAD_HOST: ws[nw++] = ST_HOME_HOST; break;
	case ST_OFFLOAD_NVME: ws[nw++] = ST_HOME_NVME; break;
	default:
		ws[nw++] = ST_HOME_VRAM;
		ws[nw++] = ST_HOME_HOST;
		if (in->have_nvme)
			ws[nw++] = ST_HOME_NVME;
	}
	switch (in->optim) {
	case ST_OFFLOAD_NVME: os[no++] = ST_HOME_NVME; break;
	case ST_OFFLOAD_VRAM: os[no++] = ST_HOME_VRAM; break;
	case ST_OFFLOAD_AUTO:
		if (in->optim_vram_auto && in->world <= 1)
			os[no++] = ST_HOME_VRAM;
		os[no++] = ST_HOME_HOST;
		if (in->have_nvme)
			os[no++] = ST_HOME_NVME;
		break;
	default: os[no++] = ST_HOME_HOST;
	}
	for (int i = 0; i < nw; i++)
		for (int j = 0; j < no; j++)
			if (os[j] != ST_HOME_VRAM || ws[i] == ST_HOME_VRAM) /* W with it */
				c[n++] = (struct st_cand){ .w = ws[i], .o = os[j] };
	return n;
}

/* Where the activation checkpoints may live, for each of the n placements
 * of W, G, P, M, V in c (whose .a is vram): forced, or (auto) every
 * placement with them in vram, then every one with them on the host (the
 * policy takes the fastest; a tie goes to the first, vram). Returns the
 * new count (at most 2n). */
static int st_act_cands(const struct st_plan_input *in, struct st_cand *c, int n)
{
	if (in->activations == ST_OFFLOAD_HOST)
		for (int i = 0; i < n; i++)
			c[i].a = ST_HOME_HOST;
	if (in->activations != ST_OFFLOAD_AUTO)
		return n;
	for (int i = 0; i < n; i++) {
		c[n + i] = c[i];
		c[n + i].a = ST_HOME_HOST;
	}
	return 2 * n;
}

/* The collectives of one step on one rank, as st_comm_stats counts them
 * (calls, and the full buffer of each: reduce-scatter's send, all-gather's
 * recv, allreduce's count): the engine's calls, docs/zero.md. */
static void st_predict_comm(const struct st_shape *sh, struct st_plan *p)
{
	uint64_t n = (uint64_t)sh->accum, N = (uint64_t)sh->world, parts = 0;
	enum { AR = 0, RS = 1, AG = 2, A2A = 3 }; /* strata/comm.h's order */

	memset(p->comm_bytes, 0, sizeof(p->comm_bytes));
	memset(p->comm_calls, 0, sizeof(p->comm_calls));
	for (int u = 0; u < sh->units; u++) {
		uint64_t fetches = (u < sh->units - 1) + !(sh->resident[u] && u < sh->units - 1);

		/* every micro-batch: dW's slices to their ranks (world 1: the
		 * reduce-scatter in place); stage 0 gathers the final G slices */
		p->comm_calls[N > 1 ? A2A : RS] += n;
		p->comm_bytes[N > 1 ? A2A : RS] += n * sh->epad[u] * 4;
		if (N > 1 && sh->zero == 0) {
			p->comm_calls[AG] += 1;
			p->comm_bytes[AG] += sh->epad[u] * 4;
		}
		/* stages 1-2: the updated W slices; stage 3: W before each use */
		if (sh->w_gather) {
			p->comm_calls[AG] += 1;
			p->comm_bytes[AG] += sh->epad[u] * sh->wb;
		}
		if (sh->w_stream_all) {
			p->comm_calls[AG] += n * fetches;
			p->comm_bytes[AG] += n * fetches * sh->epad[u] * sh->wb;
		}
		parts += sh->slice[u] / ST_PLAN_SLICE_ALIGN;
	}
	if (N == 1) { /* the norm's sum, in place */
		p->comm_calls[AR] += 1;
		p->comm_bytes[AR] += 8;
		return;
	}
	/* the micro-batches' losses and the norm's chunk sums */
	p->comm_calls[AG] += 2;
	p->comm_bytes[AG] += N * n * 8 + N * parts * 8;
}

static void st_predict_times(const struct st_plan_input *in, const struct st_shape *sh,
			     double host_adam_share, struct st_plan *p);
static double st_recomp_flops(const struct st_plan_input *in, const struct st_shape *sh);

/* The bytes of the first `tiles` staged tiles of state s: the engine's
 * update tiles (engine_update.c) cut each unit's range of P (the rank's
 * shard) at the tile and, at world > 1, at every slice; a state's tiles
 * are staged in the units where it lives on nvme. */
static uint64_t st_first_tiles_bytes(const struct st_shape *sh, const enum st_home *homes,
				     enum st_state s, int tiles)
{
	uint64_t bytes = 0;

	for (int u = 0; u < sh->units && tiles > 0; u++) {
		uint64_t n = sh->st_elems[u * ST_STATE_COUNT + ST_STATE_P];
		uint64_t seg = sh->world > 1 ? sh->slice[u] : n;

		if (homes[u * ST_STATE_COUNT + s] != ST_HOME_NVME || !n || !seg)
			continue;
		for (uint64_t t0 = 0; t0 < n && tiles > 0; tiles--) {
			uint64_t len = ST_MIN(sh->tile, ST_MIN(n - t0, seg - t0 % seg));

			bytes += len * 4;
			t0 += len;
		}
	}
	return bytes;
}

/* The update's loads the engine queues during the last micro-batch's
 * backward (st_eng_update_prefetch): P, M and V need no G, so each of
 * them loads its first two staged tiles, one into each of its two
 * staging buffers, before the sweep starts. */
static uint64_t st_predict_prefetch(const struct st_shape *sh, const enum st_home *homes)
{
	uint64_t bytes = 0;

	for (int s = ST_STATE_P; s <= ST_STATE_V; s++)
		bytes += st_first_tiles_bytes(sh, homes, (enum st_state)s, 2);
	return bytes;
}

static void st_predict(const struct st_plan_input *in, const struct st_shape *sh,
		       const enum st_home *homes, struct st_plan *p)
{
	uint64_t n = (uint64_t)sh->accum;
	uint64_t p_dev_elems = 0, p_all_elems = 0;

	p->h2d_bytes = p->d2h_bytes = p->nvme_read_bytes = p->nvme_write_bytes = 0;
	p->upd_h2d_bytes = p->upd_nvme_read_bytes = p->upd_nvme_write_bytes = 0;
	for (int u = 0; u < sh->units; u++) {
		const enum st_home *h = &homes[u * ST_STATE_COUNT];

		p_all_elems += sh->st_elems[u * ST_STATE_COUNT + ST_STATE_P];
		if (h[ST_STATE_P] == ST_HOME_VRAM)
			p_dev_elems += sh->st_elems[u * ST_STATE_COUNT + ST_STATE_P];
		const uint64_t *se = &sh->st_elems[u * ST_STATE_COUNT];
		/* W's home holds the unit (a slice at stage 3, world > 1); the
		 * update writes it whole, a fetch moves it whole */
		uint64_t w = se[ST_STATE_W] * sh->wb, pmv = se[ST_STATE_P] * 4;
		/* G: what a micro-batch adds (the rank's slice at world > 1) */
		uint64_t g = (sh->world > 1 ? sh->slice[u] : se[ST_STATE_G]) * 4;
		/* W comes into a slot for the forward of every unit but the
		 * last (whose backward computes its forward and the loss) and
		 * for the backward of every unit but a resident one fetched in
		 * the forward (kept widened), in every micro-batch. After the
		 * update the new W goes to its home. */
		uint64_t fetches = (u < sh->units - 1) + !(sh->resident[u] && u < sh->units - 1);

		if (h[ST_STATE_W] == ST_HOME_VRAM) {
			/* the optimizer on the device writes W in place */
			p->h2d_bytes += h[ST_STATE_P] == ST_HOME_VRAM ? 0 : w;
			p->upd_h2d_bytes += h[ST_STATE_P] == ST_HOME_VRAM ? 0 : w;
		} else {
			p->h2d_bytes += n * fetches * w;
		}
		if (h[ST_STATE_W] == ST_HOME_NVME) {
			p->nvme_read_bytes += n * fetches * w;
			p->nvme_write_bytes += w;
			p->upd_nvme_write_bytes += w;
		}
		/* dW to the host: at world > 1 the N slots of the rank's slice;
		 * none when G lives in vram */
		if (h[ST_STATE_G] != ST_HOME_VRAM)
			p->d2h_bytes += n * (sh->world > 1 ? sh->epad[u] * 4 : g);
		/* G: written each micro-batch, read to accumulate (n - 1) and
		 * once by the update; P, M, V read and written once. */
		if (h[ST_STATE_G] == ST_HOME_NVME) {
			p->nvme_read_bytes += n * g;
			p->nvme_write_bytes += n * g;
			p->upd_nvme_read_bytes += g; /* the update's load */
		}
		for (int s = ST_STATE_P; s <= ST_STATE_V; s++)
			if (h[s] == ST_HOME_NVME) {
				p->nvme_read_bytes += pmv;
				p->nvme_write_bytes += pmv;
				p->upd_nvme_read_bytes += pmv;
				p->upd_nvme_write_bytes += pmv;
			}
	}
	p->upd_prefetch_nvme_read_bytes = st_predict_prefetch(sh, homes);
	st_predict_comm(sh, p);
	st_act_traffic(sh, p);
	/* units whose optimizer runs on the device take no CPU AdamW time,
	 * unless the device is the host's cores (the cpu device) */
	st_predict_times(in, sh, p_dev_elems && !in->host_compute ?
				 1.0 - (double)p_dev_elems / (double)p_all_elems : 1.0, p);
}

/* The step's two phases (docs/plan.md, "The model of the step"): [0] the
 * forwards and backwards, [1] the update sweep with the next step's first
 * forward beside it. The update starts after the last backward (the clip
 * needs the whole gradient's norm) and the next step's backward after the
 * sweep, so the phases add; within a phase the lanes overlap. The update
 * phase has the update's traffic (G, P, M, V loads and P, M, V, W stores
 * on nvme, the new W to vram) but the P, M, V loads the engine queues
 * during the backward (st_predict_prefetch), AdamW, and one micro-batch's forward
 * FLOPs (a third of the model's, nothing recomputed); the rest of each
 * lane is the first phase's. The fill and drain: one unit's share of each
 * phase's lanes but its busiest, twice. t[] are the whole step's lanes. */
static void st_predict_phases(const struct st_plan_input *in, const struct st_shape *sh,
			      const double t[5], struct st_plan *p)
{
	static const char *names[] = { "compute", "copy", "nvme", "adam", "net" };
	const struct st_plan_rates *r = &p->rates;
	double fwd = st_model_flops_per_token(in->model, in->seq) * in->batch * in->seq / 3.0 /
		     r->compute_flops;
	double (*L)[5] = p->t_phase_lane_s, others = 0;

	fwd = ST_MIN(fwd, t[0]);
	L[1][0] = fwd;
	L[1][1] = (double)p->upd_h2d_bytes / r->copy_bps;
	L[1][2] = (double)(p->upd_nvme_read_bytes - p->upd_prefetch_nvme_read_bytes) /
			  r->nvme_read_bps +
		  (double)p->upd_nvme_write_bytes / r->nvme_write_bps;
	L[1][3] = t[3];
	L[1][4] = 0;
	for (int i = 0; i < 5; i++)
		L[0][i] = ST_MAX(t[i] - L[1][i], 0.0);
	for (int ph = 0; ph < 2; ph++) {
		int arg = 0;

		if (in->host_compute) { /* compute and AdamW take turns on the cores */
			L[ph][0] += L[ph][3];
			L[ph][3] = 0;
		}
		for (int i = 1; i < 5; i++)
			if (L[ph][i] > L[ph][arg])
				arg = i;
		for (int i = 0; i < 5; i++)
			if (i != arg)
				others += L[ph][i];
		p->t_phase_s[ph] = L[ph][arg];
		p->phase_bound[ph] = names[arg];
		if (arg == 0 && in->host_compute && ph == 1 && t[3] > fwd)
			p->phase_bound[ph] = names[3];
	}
	p->t_serial_s = 2.0 * others / sh->units;
	p->t_step_s = p->t_phase_s[0] + p->t_phase_s[1] + p->t_serial_s;
}

/* The times of the lanes from the traffic and the FLOPs, the busiest lane
 * of the step (on the cpu device compute and AdamW share the cores and are
 * added), and the step: its two phases plus the pipeline's fill and drain
 * (st_predict_phases(); docs/plan.md, "Predicted time per step"). */
static void st_predict_times(const struct st_plan_input *in, const struct st_shape *sh,
			     double host_adam_share, struct st_plan *p)
{
	const struct st_plan_rates *r = &p->rates;
	double tokens = (double)in->batch * in->seq * (double)sh->accum;
	double t[5], lane[5];
	uint64_t wire = 0;
	int arg = 0;
	static const char *names[] = { "compute", "copy", "nvme", "adam", "net" };

	for (int k = 0; k < 5; k++)
		wire += p->comm_bytes[k];
	/* the model's FLOPs, and a third more of each unit whose backward
	 * recomputes its forward (the forward is 1/3 of fwd + bwd) */
	p->recompute_flops = st_recomp_flops(in, sh) * tokens;
	p->compute_flops_step = st_model_flops_per_token(in->model, in->seq) * tokens +
				p->recompute_flops;
	t[0] = p->compute_flops_step / r->compute_flops;
	t[1] = (double)(p->h2d_bytes + p->d2h_bytes) / r->copy_bps;
	t[2] = (double)p->nvme_read_bytes / r->nvme_read_bps +
	       (double)p->nvme_write_bytes / r->nvme_write_bps;
	/* a rank updates its slice of P from stage 1 */
	p->adam_bytes = (uint64_t)((double)st_model_param_count(in->model) *
				   ST_PLAN_ADAM_BYTES_PER_PARAM /
				   (sh->world > 1 && sh->zero >= 1 ? sh->world : 1));
	/* host_adam_share: of the parameters, those AdamW updates on the host */
	if (host_adam_share < 1.0)
		p->adam_bytes = (uint64_t)((double)p->adam_bytes * host_adam_share);
	t[3] = (double)p->adam_bytes / r->adam_bps;
	/* a collective's buffer crosses the wire but for this rank's 1/N */
	t[4] = sh->world > 1 ? (double)wire * (double)(sh->world - 1) / sh->world / r->net_bps
			     : 0;
	p->t_compute_s = t[0];
	p->t_copy_s = t[1];
	p->t_nvme_s = t[2];
	p->t_adam_s = t[3];
	p->t_net_s = t[4];
	memcpy(lane, t, sizeof(lane));
	if (in->host_compute) { /* compute and AdamW take turns on the cores */
		lane[0] = t[0] + t[3];
		lane[3] = 0;
	}
	for (int i = 1; i < 5; i++)
		if (lane[i] > lane[arg])
			arg = i;
	/* the cores' lane is named by the larger of its two */
	p->bound = arg == 0 && in->host_compute && t[3] > t[0] ? names[3] : names[arg];
	st_predict_phases(in, sh, t, p);
}

/* The batch that hides the I/O: the step at every --grad-accum N up to
 * ST_PLAN_ACCUM_MAX with the same placement and k (as long as its pools
 * still fit), the first N where compute bounds it, and the N that
 * --grad-accum auto takes. */
static void st_predict_hide(const struct st_plan_input *in, const struct st_shape *sh,
			    const enum st_home *homes, int k, const uint64_t *budget,
			    struct st_plan *p)
{
	double best_tps = 0, tps[ST_PLAN_ACCUM_MAX + 1] = { 0 }, step[ST_PLAN_ACCUM_MAX + 1];
	const char *last_bound = p->bound;
	int n_max = 0;
	bool g_nvme = false, w_nvme = false;

	p->hide_accum = p->hide_best_accum = 0;
	p->hide_step_s = p->hide_best_step_s = 0;
	p->hide_why = "";
	for (int n = 1; n <= ST_PLAN_ACCUM_MAX; n++) {
		struct st_shape s2 = *sh;
		struct st_plan q = *p;
		struct st_pools pools;

		s2.accum = n;
		st_pools_compute(&s2, homes, k, &pools);
		if (!st_fits(&pools, budget, -1))
			break;
		st_predict(in, &s2, homes, &q);
		n_max = n;
		step[n] = q.t_step_s;
		tps[n] = (double)in->batch * in->seq * n / q.t_step_s;
		if (tps[n] > best_tps)
			best_tps = tps[n];
		last_bound = q.bound;
		if (!p->hide_accum && strcmp(q.bound, "compute") == 0) {
			p->hide_accum = n;
			p->hide_step_s = q.t_step_s;
		}
	}
	if (p->hide_accum) {
		p->hide_best_accum = p->hide_accum;
		p->hide_best_step_s = p->hide_step_s;
		return;
	}
	for (int n = 1; n <= n_max; n++)
		if (tps[n] >= 0.9 * best_tps) {
			p->hide_best_accum = n;
			p->hide_best_step_s = step[n];
			break;
		}
	for (int u = 0; u < sh->units; u++) {
		g_nvme |= homes[u * ST_STATE_COUNT + ST_STATE_G] == ST_HOME_NVME;
		w_nvme |= homes[u * ST_STATE_COUNT + ST_STATE_W] == ST_HOME_NVME;
	}
	if (n_max < ST_PLAN_ACCUM_MAX)
		p->hide_why = "a larger --grad-accum needs more host memory (G staging) than the "
			      "budget has";
	else if (strcmp(last_bound, "nvme") == 0 && g_nvme)
		p->hide_why = "G is on nvme: every micro-batch reads and writes it, so the nvme "
			      "traffic grows with --grad-accum as fast as compute";
	else if (strcmp(last_bound, "nvme") == 0 && w_nvme)
		p->hide_why = "W is on nvme: every micro-batch reads it, so the nvme traffic "
			      "grows with --grad-accum as fast as compute";
	else if (strcmp(last_bound, "copy") == 0)
		p->hide_why = "dW comes back to the host in every micro-batch (and a streamed W "
			      "goes to the device), so the copies grow with --grad-accum as fast "
			      "as compute";
	else if (strcmp(last_bound, "net") == 0)
		p->hide_why = "the collectives run in every micro-batch, so the network grows "
			      "with --grad-accum as fast as compute";
	else
		p->hide_why = "compute never becomes the bound";
}

/* --- the policy: the uniform table's rows, each improved by a split -------- */

/* One plan's policy: the candidates (the rows of the uniform table the
 * options allow, or the explicit homes), the prefetch k the placement is
 * chosen at, and the split policy's view of the planner (plan_split.c). */
struct st_policy {
	const struct st_plan_input *in;
	const struct st_shape *sh;
	const struct st_cand *c;
	int n, k;
	const uint64_t *budget;   /* the budgets being tried */
	struct st_plan scratch;   /* st_predict's output; only its rates are read */
	uint64_t *bytes;          /* [units * ST_STATE_COUNT] each shard's bytes */
	uint64_t all_bytes;       /* their sum */
	enum st_home *trial;      /* [units * ST_STATE_COUNT] */
	void *moves;              /* st_split_improve()'s scratch */
	struct st_split_ops ops;
};

/* The split's moves only take bytes off nvme, so the fill is held to the
 * vram and host budgets, and nvme is checked once, at the end. */
static bool st_policy_fits(void *ctx, const enum st_home *homes)
{
	struct st_policy *pol = ctx;
	struct st_pools p;

	st_pools_compute(pol->sh, homes, pol->k, &p);
	return st_fits(&p, pol->budget, ST_HOME_NVME);
}

static double st_policy_cost(void *ctx, const enum st_home *homes, double *step_s,
			     double *update_s)
{
	struct st_policy *pol = ctx;
	struct st_plan *p = &pol->scratch;

	/* the checkpoint copies of the candidate being sized count too */
	p->act_offloaded = st_act_offloaded(pol->sh, *pol->sh->act_home);
	st_predict(pol->in, pol->sh, homes, p);
	*step_s = p->t_step_s;
	if (update_s) {
		*update_s = 0;
		for (int i = 0; i < 5; i++)
			*update_s += p->t_phase_lane_s[1][i];
	}
	return p->t_compute_s + p->t_copy_s + p->t_nvme_s + p->t_adam_s + p->t_net_s;
}

static void st_policy_fini(struct st_policy *pol)
{
	free(pol->bytes);
	free(pol->trial);
	free(pol->moves);
}

static int st_policy_init(struct st_policy *pol, const struct st_plan_input *in,
			  const struct st_shape *sh, const struct st_cand *c, int n, int k,
			  const struct st_plan_rates *rates)
{
	size_t cells = (size_t)sh->units * ST_STATE_COUNT;

	*pol = (struct st_policy){ .in = in, .sh = sh, .c = c, .n = n, .k = k,
				   .scratch = { .rates = *rates } };
	pol->bytes = malloc(sizeof(*pol->bytes) * cells);
	pol->trial = malloc(sizeof(*pol->trial) * cells);
	pol->moves = malloc(st_split_scratch_bytes(sh->units));
	if (!pol->bytes || !pol->trial || !pol->moves) {
		st_policy_fini(pol);
		return st_error_set(-ENOMEM, "plan: out of memory");
	}
	for (size_t i = 0; i < cells; i++) {
		pol->bytes[i] = sh->st_elems[i] * (i % ST_STATE_COUNT == ST_STATE_W ? sh->wb : 4);
		pol->all_bytes += pol->bytes[i];
	}
	pol->ops = (struct st_split_ops){ .units = sh->units, .bytes = pol->bytes,
					  .fits = st_policy_fits, .cost = st_policy_cost,
					  .ctx = pol, .scratch = pol->moves };
	st_split_allowed(in, pol->ops.allowed);
	return 0;
}

/* Does candidate i work at `budget`? It must fit vram and host as it is;
 * improved by the split (explicit homes are not), it must then fit nvme
 * too. The improved homes are left in pol->trial; *moved counts the
 * shards the split moved. */
static bool st_policy_accept(struct st_policy *pol, int i, const uint64_t *budget, int *moved,
			     struct st_pools *p)
{
	size_t cells = (size_t)pol->sh->units * ST_STATE_COUNT;

	pol->budget = budget;
	*moved = 0;
	memcpy(pol->trial, st_cand_homes(pol->sh, pol->c[i]), sizeof(*pol->trial) * cells);
	if (!st_policy_fits(pol, pol->trial))
		return false;
	if (!pol->c[i].explicit_homes)
		*moved = st_split_improve(&pol->ops, pol->trial);
	st_pools_compute(pol->sh, pol->trial, pol->k, p);
	return st_fits(p, budget, -1);
}

static void st_recomp_auto(const struct st_shape *sh, const enum st_home *homes, int k,
			   const uint64_t *budget);

/* The prefetch depth of homes: the forced one, or (--prefetch 0) the
 * largest in 1..U that fits what the placement leaves. */
static int st_policy_depth(const struct st_policy *pol, const enum st_home *homes,
			   const uint64_t *budget)
{
	struct st_pools pools;
	int k = pol->k;

	if (pol->in->prefetch == 0)
		for (k = pol->sh->units; k > 1; k--) {
			st_pools_compute(pol->sh, homes, k, &pools);
			if (st_fits(&pools, budget, -1))
				break;
		}
	return k;
}

/* Choose the homes (out) at `budget`: of the candidates that work, the one
 * predicted fastest (the first on a tie). Under --recompute auto each
 * candidate is predicted with its own kept forwards (its depth, then the
 * keeps in what the depth leaves, as st_plan_make() does for the chosen
 * one), so a row that frees vram for keeps is credited with them.
 * Returns the candidate, or -1 when none works; *split says whether the
 * split moved a shard. */
static int st_policy_choose(struct st_policy *pol, const uint64_t *budget, enum st_home *out,
			    bool *split)
{
	double best_step = 0, best_sum = 0;
	int chosen = -1;
	struct st_pools p;

	*split = false;
	for (int i = 0; i < pol->n; i++) {
		double step, sum;
		int moved;

		if (!st_policy_accept(pol, i, budget, &moved, &p))
			continue;
		if (pol->in->recompute == ST_RECOMPUTE_AUTO)
			st_recomp_auto(pol->sh, pol->trial, st_policy_depth(pol, pol->trial, budget),
				       budget);
		sum = st_policy_cost(pol, pol->trial, &step, NULL);
		if (pol->in->recompute == ST_RECOMPUTE_AUTO)
			st_recomp_base(pol->in, pol->sh);
		if (chosen < 0 || st_split_better(step, sum, best_step, best_sum)) {
			chosen = i;
			best_step = step;
			best_sum = sum;
			*split = moved > 0;
			memcpy(out, pol->trial, sizeof(*out) * (size_t)pol->sh->units * ST_STATE_COUNT);
		}
	}
	return chosen;
}

/* The smallest budget of tier t that works with the other budgets as
 * given; UINT64_MAX when none does. A candidate cannot work with less of
 * vram or host than it takes as it is, and works with that much exactly
 * when st_policy_accept() says so; on nvme it needs what its improved
 * homes take (the split, held to vram and host only, does not depend on
 * the nvme budget). */
static uint64_t st_cond_min(struct st_policy *pol, const uint64_t *budget, int t)
{
	uint64_t best = ST_PLAN_UNLIMITED, b[ST_HOME_COUNT];
	struct st_pools p;
	int moved;

	for (int i = 0; i < pol->n; i++) {
		uint64_t lo, hi;

		memcpy(b, budget, sizeof(b));
		if (t == ST_HOME_NVME) {
			b[t] = ST_PLAN_UNLIMITED;
			if (st_policy_accept(pol, i, b, &moved, &p))
				best = ST_MIN(best, p.total[t]);
			continue;
		}
		st_pools_compute(pol->sh, st_cand_homes(pol->sh, pol->c[i]), pol->k, &p);
		b[t] = lo = p.total[t];
		if (st_policy_accept(pol, i, b, &moved, &p)) {
			best = ST_MIN(best, lo);
			continue;
		}
		/* With a finite nvme budget the row may need more of this tier
		 * than it takes as it is: room for the split to move enough
		 * off nvme. The split's moves only grow with the budget, so
		 * search the smallest one, in pages, up to the row with every
		 * shard moved here. */
		if (budget[ST_HOME_NVME] == ST_PLAN_UNLIMITED)
			continue;
		hi = lo + pol->all_bytes;
		b[t] = hi;
		if (!st_policy_accept(pol, i, b, &moved, &p))
			continue;
		lo /= 4096; /* refused at lo, accepted at hi */
		hi = (hi + 4095) / 4096;
		while (hi - lo > 1) {
			uint64_t mid = lo + (hi - lo) / 2;

			b[t] = mid * 4096;
			if (st_policy_accept(pol, i, b, &moved, &p))
				hi = mid;
			else
				lo = mid;
		}
		best = ST_MIN(best, hi * 4096);
	}
	return best;
}

static int st_refuse(int t, uint64_t budget, uint64_t need, const char *why)
{
	char b[32], m[32];

	return st_error_set(-ENOSPC, "%s budget %s (%llu B) is below the minimum of %s (%llu B) %s",
			    st_home_name(t), st_format_bytes(budget, b, sizeof(b)),
			    (unsigned long long)budget, st_format_bytes(need, m, sizeof(m)),
			    (unsigned long long)need, why);
}

/* No placement fits: name one tier whose budget must grow, and by how much. */
static int st_explain(struct st_policy *pol, const uint64_t *budget)
{
	const struct st_shape *sh = pol->sh;
	const struct st_cand *c = pol->c;
	int n = pol->n, k = pol->k;
	uint64_t need;
	struct st_pools p;
	int best_i = 0, best_fail = ST_HOME_COUNT + 1;

	/* Growing one tier alone would do: its exact minimum. When several
	 * would, name the one short by the smallest factor (the budget the
	 * user most likely meant to be enough). */
	int pick = -1;
	double pick_ratio = INFINITY;
	uint64_t pick_need = 0;

	for (int t = 0; t < ST_HOME_COUNT; t++) {
		double ratio;

		need = st_cond_min(pol, budget, t);
		if (need == ST_PLAN_UNLIMITED)
			continue;
		ratio = budget[t] ? (double)need / (double)budget[t] : INFINITY;
		if (pick < 0 || ratio < pick_ratio) {
			pick = t;
			pick_ratio = ratio;
			pick_need = need;
		}
	}
	if (pick >= 0)
		return st_refuse(pick, budget[pick], pick_need, "for this model and batch");
	/* Several do: the first tier too small for every placement. */
	for (int t = 0; t < ST_HOME_COUNT; t++) {
		need = ST_PLAN_UNLIMITED;
		for (int i = 0; i < n; i++) {
			st_pools_compute(sh, st_cand_homes(sh, c[i]), k, &p);
			need = ST_MIN(need, p.total[t]);
		}
		if (need > budget[t])
			return st_refuse(t, budget[t], need,
					 "for this model and batch (other budgets are short too)");
	}
	/* Each tier could fit, but never all at once: take the placement that
	 * misses the fewest budgets and name its first shortfall. */
	for (int i = 0; i < n; i++) {
		int fail = 0;

		st_pools_compute(sh, st_cand_homes(sh, c[i]), k, &p);
		for (int t = 0; t < ST_HOME_COUNT; t++)
			fail += p.total[t] > budget[t];
		if (fail < best_fail) {
			best_fail = fail;
			best_i = i;
		}
	}
	st_pools_compute(sh, st_cand_homes(sh, c[best_i]), k, &p);
	for (int t = 0; t < ST_HOME_COUNT; t++)
		if (p.total[t] > budget[t])
			return st_refuse(t, budget[t], p.total[t],
					 "with W in its placement (other budgets are short too)");
	return st_error_set(-ENOSPC, "plan: no placement fits the budgets");
}

/* --- recompute (st_recompute, docs/plan.md) ----------------------------------- */

const char *st_recompute_name(enum st_recompute r)
{
	static const char *names[] = { "all", "auto", "none" };

	return (unsigned)r <= ST_RECOMPUTE_NONE ? names[r] : "?";
}

/* The workspace: the largest a unit needs, a kept unit's scratch only. */
static uint64_t st_recomp_work(const struct st_shape *sh)
{
	uint64_t w = 0;

	for (int u = 0; u < sh->units; u++)
		w = ST_MAX(w, sh->keep[u] ? sh->work_kept[u] : sh->work_full[u]);
	return w ? w : 1;
}

/* One saved-forward extent per kept unit, of the largest kept unit's. */
static void st_recomp_pool(const struct st_shape *sh, struct st_pools *p)
{
	uint64_t each = 0;
	uint32_t n = 0;

	for (int u = 0; u < sh->units; u++)
		if (sh->keep[u]) {
			each = ST_MAX(each, sh->saved[u]);
			n++;
		}
	st_pool_add(p, ST_POOL_SAVED, each, n, -1);
}

/* The keeps the placement search and the minimums are made with: every
 * unit that can keep for NONE, none for ALL and AUTO (AUTO keeps only
 * what is left over after everything else). */
static void st_recomp_base(const struct st_plan_input *in, const struct st_shape *sh)
{
	for (int u = 0; u < sh->units; u++)
		sh->keep[u] = in->recompute == ST_RECOMPUTE_NONE && sh->saved[u] > 0;
}

/* AUTO: with the placement and k chosen, keep units while the budgets
 * still hold, the last block first: its backward is the first to run,
 * right after the forward, when nothing could have brought a checkpoint
 * back or overlapped a recompute; the blocks are of one size, so which
 * ones keep changes nothing else. Every unit is tried: the last one to
 * keep also shrinks the workspace to a kept unit's scratch. */
static void st_recomp_auto(const struct st_shape *sh, const enum st_home *homes, int k,
			   const uint64_t *budget)
{
	struct st_pools p;

	for (int u = sh->units - 1; u >= 0; u--) {
		if (!sh->saved[u])
			continue;
		sh->keep[u] = true;
		st_pools_compute(sh, homes, k, &p);
		if (!st_fits(&p, budget, -1))
			sh->keep[u] = false;
	}
}

static void st_recomp_fill(const struct st_plan_input *in, const struct st_shape *sh,
			   const struct st_pools *pools, struct st_plan *p)
{
	const struct st_plan_pool *x = st_pools_find(pools, ST_POOL_SAVED);

	p->recompute = in->recompute;
	p->n_keep = 0;
	for (int u = 0; u < sh->units; u++) {
		p->keep[u] = sh->keep[u];
		p->n_keep += sh->keep[u];
	}
	p->saved_each_bytes = x ? x->bytes : 0;
}

/* FLOPs per token the backward spends recomputing forwards: a third of
 * the share of every unit that could keep but does not. */
static double st_recomp_flops(const struct st_plan_input *in, const struct st_shape *sh)
{
	double f = 0;

	for (int u = 0; u < sh->units; u++)
		if (sh->saved[u] && !sh->keep[u])
			f += st_model_unit_flops_per_token(in->model, u, in->seq) / 3.0;
	return f;
}

/* NONE refused: say that the saved forwards are what does not fit. */
static int st_recomp_explain(const struct st_plan_input *in, const struct st_shape *sh, int ret)
{
	char why[512], b[32];
	uint64_t each = 0;
	int n = 0;

	if (in->recompute != ST_RECOMPUTE_NONE || ret != -ENOSPC)
		return ret;
	for (int u = 0; u < sh->units; u++)
		if (sh->keep[u]) {
			each = ST_MAX(each, sh->saved[u]);
			n++;
		}
	snprintf(why, sizeof(why), "%s", st_error_last());
	return st_error_set(ret, "%s; --recompute none keeps the forward of %d units, %s each "
			    "(--recompute auto keeps what fits)", why, n,
			    st_format_bytes(each, b, sizeof(b)));
}

int st_plan_make(const struct st_plan_input *in, struct st_plan *plan)
{
	struct st_shape sh;
	struct st_cand cands[18], c;
	struct st_pools pools;
	uint64_t budget[ST_HOME_COUNT];
	enum st_home *homes;
	const struct st_plan_pool *x;
	struct st_plan p;
	int n, k0, k, chosen, ret;
	bool split;
	struct st_policy pol;

	ret = st_input_check(in);
	if (ret < 0)
		return ret;
	memset(&p, 0, sizeof(p));
	ret = st_rates_fill(&in->rates, &p.rates);
	if (ret == 0)
		ret = st_shape_init(in, &sh);
	if (ret < 0)
		return ret;
	st_recomp_base(in, &sh);
	budget[ST_HOME_VRAM] = in->gpu_mem_bytes;
	budget[ST_HOME_HOST] = in->host_mem_bytes;
	budget[ST_HOME_NVME] = !in->have_nvme ? 0 :
			       in->nvme_mem_bytes ? in->nvme_mem_bytes : ST_PLAN_UNLIMITED;
	n = st_act_cands(in, cands, st_cands(in, cands));
	k0 = in->prefetch > 0 ? in->prefetch : 1;
	homes = malloc(sizeof(*homes) * (size_t)sh.units * ST_STATE_COUNT);
	ret = homes ? st_policy_init(&pol, in, &sh, cands, n, k0, &p.rates)
		    : st_error_set(-ENOMEM, "plan: out of memory");
	if (ret < 0) {
		free(homes);
		st_shape_fini(&sh);
		return ret;
	}
	chosen = st_policy_choose(&pol, budget, homes, &split);
	if (chosen < 0) {
		ret = st_recomp_explain(in, &sh, st_explain(&pol, budget));
		st_policy_fini(&pol);
		free(homes);
		st_shape_fini(&sh);
		return st_act_hint(in, ret);
	}
	c = cands[chosen];
	*sh.act_home = c.a; /* st_policy_choose() tried the others last */
	/* the placement first, then k in what it leaves (docs/plan.md) */
	k = st_policy_depth(&pol, homes, budget);
	if (in->recompute == ST_RECOMPUTE_AUTO)
		st_recomp_auto(&sh, homes, k, budget);
	st_pools_compute(&sh, homes, k, &pools);

	p.units = sh.units;
	p.prefetch = k;
	p.w_home = c.w;
	p.optim_home = c.o;
	p.home = malloc(sizeof(*p.home) * (size_t)sh.units * ST_STATE_COUNT);
	p.state_bytes = malloc(sizeof(*p.state_bytes) * (size_t)sh.units * ST_STATE_COUNT);
	p.pools = malloc(sizeof(*p.pools) * (size_t)pools.n);
	p.slice_elems = malloc(sizeof(*p.slice_elems) * (size_t)sh.units);
	p.world = sh.world;
	p.rank = in->rank;
	p.zero = in->zero;
	p.tile_elems = sh.tile;
	p.split = split;
	p.keep = calloc((size_t)sh.units, sizeof(*p.keep));
	if (!p.home || !p.state_bytes || !p.pools || !p.slice_elems || !p.keep) {
		st_plan_fini(&p);
		st_policy_fini(&pol);
		free(homes);
		st_shape_fini(&sh);
		return st_error_set(-ENOMEM, "plan: out of memory");
	}
	for (int u = 0; u < sh.units; u++)
		for (int s = 0; s < ST_STATE_COUNT; s++) {
			p.home[u * ST_STATE_COUNT + s] = homes[u * ST_STATE_COUNT + s];
			p.state_bytes[u * ST_STATE_COUNT + s] =
				sh.st_elems[u * ST_STATE_COUNT + s] * (s == ST_STATE_W ? sh.wb : 4);
		}
	for (int u = 0; u < sh.units; u++)
		p.slice_elems[u] = sh.slice[u];
	memcpy(p.pools, pools.list, sizeof(*p.pools) * (size_t)pools.n);
	p.n_pools = pools.n;
	/* the summary `strata plan` prints, from the same list */
	x = st_pools_find(&pools, ST_POOL_W_SLOT);
	p.w_slots = x ? x->count : 0;
	p.w_slot_bytes = x ? st_pg(x->bytes) : 0;
	x = st_pools_find(&pools, ST_POOL_W_SLOT_RES);
	p.embed_slot = x != NULL;
	p.embed_slot_bytes = x ? st_pg(x->bytes) : 0;
	p.act_bytes = st_pools_sum(&pools, ST_POOL_ACT, ST_POOL_ACT);
	p.act_each_bytes = sh.x_bytes;
	p.scratch_bytes = st_pools_sum(&pools, ST_POOL_WF, ST_POOL_TARGETS);
	x = st_pools_find(&pools, ST_POOL_WORK);
	p.work_bytes = x->bytes;
	/* the keeps chosen; the minimums are the mode's (AUTO: keeping none) */
	st_recomp_fill(in, &sh, &pools, &p);
	st_recomp_base(in, &sh);
	p.w_staging_bytes = st_pools_sum(&pools, ST_POOL_W_STAGE, ST_POOL_W_STAGE_RES);
	p.grad_landing_bytes = st_pools_sum(&pools, ST_POOL_LANDING, ST_POOL_GSTAGE);
	p.update_staging_bytes = st_pools_sum(&pools, ST_POOL_UPD_W, ST_POOL_UPD_F32);
	p.act_home = sh.units > 1 ? c.a : ST_HOME_VRAM; /* none to place */
	p.act_slots = c.a == ST_HOME_HOST ? st_act_slots(&sh) : 0;
	p.act_offloaded = st_act_offloaded(&sh, c.a);
	p.act_bytes += st_pools_sum(&pools, ST_POOL_ACT_SLOT, ST_POOL_ACT_SLOT);
	p.act_host_bytes = st_pools_sum(&pools, ST_POOL_ACT_HOME, ST_POOL_ACT_HOME);
	for (int t = 0; t < ST_HOME_COUNT; t++) {
		p.home_bytes[t] = pools.home[t];
		p.total_bytes[t] = pools.total[t];
		p.budget_bytes[t] = budget[t];
		p.min_bytes[t] = st_cond_min(&pol, budget, t);
	}
	if (budget[ST_HOME_NVME] == ST_PLAN_UNLIMITED)
		p.budget_bytes[ST_HOME_NVME] = pools.total[ST_HOME_NVME];
	/* st_cond_min() sized the other rows: back to the chosen one's */
	memcpy(sh.keep, p.keep, sizeof(*sh.keep) * (size_t)sh.units);
	*sh.act_home = c.a;
	st_predict(in, &sh, p.home, &p);
	st_predict_hide(in, &sh, p.home, k, budget, &p);
	st_policy_fini(&pol);
	free(homes);
	st_shape_fini(&sh);
	*plan = p;
	return 0;
}

/* A refusal with the checkpoints forced into vram says when the host
 * would hold them. */
static int st_act_hint(const struct st_plan_input *in, int ret)
{
	struct st_plan_input x = *in;
	struct st_plan p;
	char msg[512];

	if (ret != -ENOSPC || in->activations != ST_OFFLOAD_NONE)
		return ret;
	snprintf(msg, sizeof(msg), "%s", st_error_last());
	x.activations = ST_OFFLOAD_HOST;
	if (st_plan_make(&x, &p) < 0)
		return st_error_set(ret, "%s", msg);
	st_plan_fini(&p);
	return st_error_set(ret, "%s (it fits with the activation checkpoints on the host: "
			    "--offload-activations auto or host)", msg);
}

/* The checkpoint pools of the candidate's home (*sh->act_home). */
static void st_act_pools(const struct st_shape *sh, struct st_pools *p)
{
	uint64_t xa = st_align_up(sh->x_bytes, ST_PLAN_ACT_ALIGN);

	if (sh->units < 2)
		return;
	if (*sh->act_home != ST_HOME_HOST) {
		st_pool_add(p, ST_POOL_ACT, (uint64_t)(sh->units - 1) * sh->x_bytes, 1, -1);
		return;
	}
	st_pool_add(p, ST_POOL_ACT_SLOT, xa, (uint32_t)st_act_slots(sh), -1);
	st_pool_add(p, ST_POOL_ACT_HOME, xa, (uint32_t)st_act_offloaded(sh, ST_HOME_HOST), -1);
}

/* Checkpoints on the host: each of 1..act_offloaded goes d2h after the
 * forward and h2d before the backward, every micro-batch. */
static void st_act_traffic(const struct st_shape *sh, struct st_plan *p)
{
	uint64_t b = 0;

	for (int j = 1; j <= p->act_offloaded; j++)
		b += sh->act_copy[j];
	p->act_copy_bytes = b;
	p->h2d_bytes += (uint64_t)sh->accum * b;
	p->d2h_bytes += (uint64_t)sh->accum * b;
}

void st_plan_fini(struct st_plan *plan)
{
	if (!plan)
		return;
	free(plan->home);
	free(plan->state_bytes);
	free(plan->pools);
	free(plan->slice_elems);
	free(plan->keep);
	plan->keep = NULL;
	plan->slice_elems = NULL;
	plan->home = NULL;
	plan->state_bytes = NULL;
	plan->pools = NULL;
	plan->n_pools = 0;
}

/* --- output ------------------------------------------------------------------ */

static const char *st_fb(uint64_t bytes, char *buf)
{
	return st_format_bytes(bytes, buf, 32);
}

/* Units and bytes of state s in tier h. */
static void st_count(const struct st_plan *p, enum st_state s, enum st_home h,
		     int *units, uint64_t *bytes)
{
	*units = 0;
	*bytes = 0;
	for (int u = 0; u < p->units; u++)
		if (st_plan_home(p, u, s) == h) {
			(*units)++;
			*bytes += p->state_bytes[u * ST_STATE_COUNT + s];
		}
}

/* The units of state s in tier h as ranges ("0-19, 22"), or "" for none. */
static void st_unit_ranges(const struct st_plan *p, enum st_state s, enum st_home h, char *buf,
			   size_t n)
{
	size_t len = 0;

	buf[0] = 0;
	for (int u = 0; u < p->units; u++) {
		int v = u;

		if (st_plan_home(p, u, s) != h)
			continue;
		while (v + 1 < p->units && st_plan_home(p, v + 1, s) == h)
			v++;
		if (len < n)
			len += (size_t)snprintf(buf + len, n - len, "%s%d", len ? ", " : "", u);
		if (v > u && len < n)
			len += (size_t)snprintf(buf + len, n - len, "-%d", v);
		u = v;
	}
}

/* Does state s have a home in more than one tier? */
static bool st_state_split(const struct st_plan *p, enum st_state s)
{
	for (int u = 1; u < p->units; u++)
		if (st_plan_home(p, u, s) != st_plan_home(p, 0, s))
			return true;
	return false;
}

/* The split placement by unit, one line per group of states with the same
 * homes: "    G, P     host 0-19; nvme 20-47". */
static void st_print_split(const struct st_plan *p, FILE *f)
{
	bool done[ST_STATE_COUNT] = { false }, any = false;
	char r[512];

	for (int s = 0; s < ST_STATE_COUNT; s++)
		any |= st_state_split(p, (enum st_state)s);
	if (!any)
		return;
	fprintf(f, "  by unit (the split placement)\n");
	for (int s = 0; s < ST_STATE_COUNT; s++) {
		char names[32];
		size_t len;
		bool first = true;

		if (done[s] || !st_state_split(p, (enum st_state)s))
			continue;
		len = (size_t)snprintf(names, sizeof(names), "%s", st_state_name((enum st_state)s));
		for (int t = s + 1; t < ST_STATE_COUNT; t++) {
			bool same = true;

			for (int u = 0; u < p->units && same; u++)
				same = st_plan_home(p, u, (enum st_state)t) ==
				       st_plan_home(p, u, (enum st_state)s);
			if (same) {
				done[t] = true;
				len += (size_t)snprintf(names + len, sizeof(names) - len, ", %s",
							st_state_name((enum st_state)t));
			}
		}
		fprintf(f, "    %-11s", names);
		for (int h = 0; h < ST_HOME_COUNT; h++) {
			st_unit_ranges(p, (enum st_state)s, (enum st_home)h, r, sizeof(r));
			if (!r[0])
				continue;
			fprintf(f, "%s%s %s", first ? "" : "; ", st_home_name((enum st_home)h), r);
			first = false;
		}
		fputc('\n', f);
	}
}

static const char *st_fmt_s(double s, char *buf, size_t n)
{
	if (s < 1e-3)
		snprintf(buf, n, "%.1f us", s * 1e6);
	else if (s < 1)
		snprintf(buf, n, "%.2f ms", s * 1e3);
	else
		snprintf(buf, n, "%.3f s", s);
	return buf;
}

static const char *st_src(const struct st_plan *p, enum st_rate i)
{
	return st_rate_source_name((enum st_rate_source)p->rates.source[i]);
}

/* The vram checkpoint line of `strata plan`: where they live. */
static void st_act_print(const struct st_plan *p, FILE *f)
{
	char a[32], b[32], c[32];

	if (p->act_home != ST_HOME_HOST) {
		fprintf(f, "        checkpoints     %s (%d x %s; activations in vram)\n",
			st_fb(p->act_bytes, a), p->units - 1, st_fb(p->act_each_bytes, b));
		return;
	}
	fprintf(f, "        checkpoints     %s (%d slots of %s; activations on the host: "
		"%d of %d go there and back, %s each way per micro-batch)\n",
		st_fb(p->act_bytes, a), p->act_slots,
		st_fb(st_align_up(p->act_each_bytes, ST_PLAN_ACT_ALIGN), b), p->act_offloaded,
		p->units - 1, st_fb(p->act_copy_bytes, c));
}

/* The kept units as ranges ("9-12", "1,3-4"), or "none". */
static const char *st_recomp_units(const struct st_plan *p, char *buf, size_t n)
{
	size_t len = 0;

	buf[0] = '\0';
	for (int u = 0; u < p->units && len < n; u++) {
		int v = u;

		if (!p->keep[u])
			continue;
		while (v + 1 < p->units && p->keep[v + 1])
			v++;
		len += (size_t)snprintf(buf + len, n - len, v > u ? "%s%d-%d" : "%s%d",
					len ? "," : "", u, v);
		u = v;
	}
	if (!buf[0])
		snprintf(buf, n, "none");
	return buf;
}

/* `strata plan`'s line for the saved forwards. */
static void st_recomp_print(const struct st_plan *p, FILE *f)
{
	char a[32], b[32], units[256];
	fprintf(f, "        saved forwards  ");
	if (p->n_keep)
		fprintf(f, "%s (%d x %s: units %s keep their forward; recompute %s)\n",
			st_fb(st_pg(p->saved_each_bytes) * (uint64_t)p->n_keep, a), p->n_keep,
			st_fb(p->saved_each_bytes, b), st_recomp_units(p, units, sizeof(units)),
			st_recompute_name(p->recompute));
	else
		fprintf(f, "none (recompute %s: every backward recomputes its forward)\n",
			st_recompute_name(p->recompute));
}

void st_plan_print(const struct st_plan *p, const struct st_plan_input *in, FILE *f)
{
	const struct st_model_config *cfg = st_model_config(in->model);
	char a[32], b[32], c[32], d[32];

	fprintf(f, "model %.2fM params, %d layers, dim %d, %d heads, vocab %d, ctx %d | %d units\n",
		(double)st_model_param_count(in->model) / 1e6, cfg->n_layer, cfg->dim,
		cfg->n_head, cfg->vocab, cfg->ctx, p->units);
	fprintf(f, "batch B=%d T=%d accum %d | W %s | prefetch %d%s\n", in->batch, in->seq,
		in->grad_accum, in->bf16 ? "bf16" : "fp32", p->prefetch,
		!p->w_slots && !p->embed_slot ? " (W resident: nothing streamed)" : "");
	fprintf(f, "\nplacement       %-22s %-22s %s\n", "vram", "host", "nvme");
	for (int s = 0; s < ST_STATE_COUNT; s++) {
		fprintf(f, "  %s            ", st_state_name((enum st_state)s));
		for (int h = 0; h < ST_HOME_COUNT; h++) {
			int units;
			uint64_t bytes;
			char cell[64];

			st_count(p, (enum st_state)s, (enum st_home)h, &units, &bytes);
			if (units)
				snprintf(cell, sizeof(cell), "%d units %s", units, st_fb(bytes, a));
			else
				snprintf(cell, sizeof(cell), "-");
			fprintf(f, h + 1 < ST_HOME_COUNT ? " %-22s" : " %s", cell);
		}
		fputc('\n', f);
	}
	st_print_split(p, f);
	fprintf(f, "\npools\n");
	if (p->w_slots) {
		fprintf(f, "  vram  W slots         %llu x %s", (unsigned long long)p->w_slots,
			st_fb(p->w_slot_bytes, a));
		if (p->embed_slot)
			fprintf(f, " + embedding %s", st_fb(p->embed_slot_bytes, b));
		fputc('\n', f);
	} else {
		fprintf(f, "  vram  W slots         none (W resident)\n");
	}
	st_act_print(p, f);
	fprintf(f, "        scratch         %s (model workspace %s)\n", st_fb(p->scratch_bytes, a),
		st_fb(p->work_bytes, b));
	st_recomp_print(p, f);
	fprintf(f, "  host  W staging       %s\n", st_fb(p->w_staging_bytes, a));
	fprintf(f, "        grad landing    %s\n", st_fb(p->grad_landing_bytes, a));
	fprintf(f, "        update staging  %s\n", st_fb(p->update_staging_bytes, a));
	if (p->act_home == ST_HOME_HOST)
		fprintf(f, "        checkpoints     %s (%d x %s)\n", st_fb(p->act_host_bytes, a),
			p->act_offloaded, st_fb(st_align_up(p->act_each_bytes, ST_PLAN_ACT_ALIGN), b));
	fprintf(f, "\n  %-5s %-12s %-12s %-12s %s\n", "tier", "homes", "total", "budget",
		"minimum (with the other budgets as given)");
	for (int h = 0; h < ST_HOME_COUNT; h++) {
		if (h == ST_HOME_NVME && !in->have_nvme) {
			fprintf(f, "  nvme  (no --nvme)\n");
			continue;
		}
		fprintf(f, "  %-5s %-12s %-12s %-12s %s%s\n", st_home_name((enum st_home)h),
			st_fb(p->home_bytes[h], a), st_fb(p->total_bytes[h], b),
			st_fb(p->budget_bytes[h], c), st_fb(p->min_bytes[h], d),
			h == ST_HOME_NVME && !in->nvme_mem_bytes ? "  (budget: what the plan needs)" : "");
	}
	fprintf(f, "\ntraffic per step\n");
	fprintf(f, "  host -> vram  %s\n", st_fb(p->h2d_bytes, a));
	fprintf(f, "  vram -> host  %s\n", st_fb(p->d2h_bytes, a));
	fprintf(f, "  nvme -> host  %s\n", st_fb(p->nvme_read_bytes, a));
	fprintf(f, "  host -> nvme  %s\n", st_fb(p->nvme_write_bytes, a));
	if (p->world > 1) {
		static const char *stage_says[] = {
			"every rank holds every state", "P, M, V sharded",
			"G, P, M, V sharded", "W, G, P, M, V sharded" };

		fprintf(f, "\nZeRO stage %d at world %d (this is rank %d's plan; %s)\n", p->zero,
			p->world, p->rank, stage_says[p->zero]);
		fprintf(f, "  collectives per step (the comm's bytes: each call's full buffer)\n");
		for (int k = 0; k < 5; k++)
			if (p->comm_calls[k])
				fprintf(f, "    %-15s %6llu calls %s\n",
					k == 0 ? "allreduce" : k == 1 ? "reduce_scatter" : k == 2 ? "allgather"
					: k == 3 ? "alltoall" : "broadcast", (unsigned long long)p->comm_calls[k],
					st_fb(p->comm_bytes[k], a));
	}
	fprintf(f, "\ntime per step (predicted; the resources overlap)\n");
	fprintf(f, "  compute  %-10s at %.1f GFLOP/s (%s; recomputing %.3g GFLOP of it)\n",
		st_fmt_s(p->t_compute_s, a, 32), p->rates.compute_flops / 1e9,
		st_src(p, ST_RATE_COMPUTE), p->recompute_flops / 1e9);
	fprintf(f, "  copy     %-10s at %.2f GB/s (%s)\n", st_fmt_s(p->t_copy_s, a, 32),
		p->rates.copy_bps / 1e9, st_src(p, ST_RATE_COPY));
	fprintf(f, "  nvme     %-10s at %.2f / %.2f GB/s read / write (%s / %s)\n",
		st_fmt_s(p->t_nvme_s, a, 32), p->rates.nvme_read_bps / 1e9,
		p->rates.nvme_write_bps / 1e9, st_src(p, ST_RATE_NVME_READ),
		st_src(p, ST_RATE_NVME_WRITE));
	fprintf(f, "  adam     %-10s at %.2f GB/s (%s)\n", st_fmt_s(p->t_adam_s, a, 32),
		p->rates.adam_bps / 1e9, st_src(p, ST_RATE_ADAM));
	if (p->world > 1)
		fprintf(f, "  net      %-10s at %.2f GB/s (%s)\n", st_fmt_s(p->t_net_s, a, 32),
			p->rates.net_bps / 1e9, st_src(p, ST_RATE_NET));
	{
		char b2[32];

		fprintf(f, "  phases   backward %s (bound by %s) + update %s (bound by %s)\n",
			st_fmt_s(p->t_phase_s[0], a, 32), p->phase_bound[0],
			st_fmt_s(p->t_phase_s[1], b2, 32), p->phase_bound[1]);
	}
	fprintf(f, "  serial   %-10s fill and drain: one unit's share of the other lanes%s\n",
		st_fmt_s(p->t_serial_s, a, 32),
		in->host_compute ? "\n           (cpu device: compute and adam share the cores, so "
				   "they add)" : "");
	fprintf(f, "  step     %-10s bound by %s\n", st_fmt_s(p->t_step_s, a, 32), p->bound);
	if (strcmp(p->bound, "compute") == 0)
		;
	else if (p->hide_accum)
		fprintf(f, "  compute-bound from --grad-accum %d (B*T*N = %lld tokens): step %s, "
			"%.0f tok/s\n", p->hide_accum,
			(long long)in->batch * in->seq * p->hide_accum, st_fmt_s(p->hide_step_s, a, 32),
			(double)in->batch * in->seq * p->hide_accum / p->hide_step_s);
	else if (p->hide_best_accum)
		fprintf(f, "  never compute-bound up to --grad-accum %d: %s\n"
			"  tokens/s within 10%% of the best from --grad-accum %d (step %s, "
			"%.0f tok/s)\n", ST_PLAN_ACCUM_MAX, p->hide_why, p->hide_best_accum,
			st_fmt_s(p->hide_best_step_s, a, 32),
			(double)in->batch * in->seq * p->hide_best_accum / p->hide_best_step_s);
}

static const char *st_kind_name(enum st_unit_kind k)
{
	return k == ST_UNIT_EMBED ? "embed" : k == ST_UNIT_BLOCK ? "block" : "head";
}

void st_plan_print_units(const struct st_plan *p, const struct st_plan_input *in, FILE *f)
{
	char a[32];

	fprintf(f, "\nunit  kind    elems      ");
	for (int s = 0; s < ST_STATE_COUNT; s++)
		fprintf(f, s + 1 < ST_STATE_COUNT ? " %-18s" : " %s",
			st_state_name((enum st_state)s));
	fputc('\n', f);
	for (int u = 0; u < p->units; u++) {
		const struct st_unit_layout *l = st_model_unit_layout(in->model, u);

		fprintf(f, "  %-3d %-7s %-10llu", u, st_kind_name(l->kind),
			(unsigned long long)l->elems);
		for (int s = 0; s < ST_STATE_COUNT; s++) {
			char cell[48];

			snprintf(cell, sizeof(cell), "%s %s",
				 st_home_name(st_plan_home(p, u, (enum st_state)s)),
				 st_fb(p->state_bytes[u * ST_STATE_COUNT + s], a));
			fprintf(f, s + 1 < ST_STATE_COUNT ? " %-18s" : " %s", cell);
		}
		fputc('\n', f);
	}
}

static json_object *st_ju(uint64_t v)
{
	return json_object_new_int64((int64_t)v);
}

/* "activations": where the checkpoints live and what moving them costs. */
static json_object *st_act_json(const struct st_plan *p)
{
	json_object *o = json_object_new_object();

	json_object_object_add(o, "home", json_object_new_string(st_home_name(p->act_home)));
	json_object_object_add(o, "checkpoints", json_object_new_int(p->units - 1));
	json_object_object_add(o, "each_bytes", st_ju(p->act_each_bytes));
	json_object_object_add(o, "vram_bytes", st_ju(p->act_bytes));
	json_object_object_add(o, "slots", json_object_new_int(p->act_slots));
	json_object_object_add(o, "offloaded", json_object_new_int(p->act_offloaded));
	json_object_object_add(o, "host_bytes", st_ju(p->act_host_bytes));
	json_object_object_add(o, "copy_bytes_per_micro_batch", st_ju(p->act_copy_bytes));
	return o;
}

char *st_plan_json(const struct st_plan *p, const struct st_plan_input *in)
{
	const struct st_model_config *cfg = st_model_config(in->model);
	json_object *root = json_object_new_object(), *o, *o2, *arr;
	char *text;

	o = json_object_new_object();
	json_object_object_add(o, "layers", json_object_new_int(cfg->n_layer));
	json_object_object_add(o, "dim", json_object_new_int(cfg->dim));
	json_object_object_add(o, "heads", json_object_new_int(cfg->n_head));
	json_object_object_add(o, "vocab", json_object_new_int(cfg->vocab));
	json_object_object_add(o, "ctx", json_object_new_int(cfg->ctx));
	json_object_object_add(o, "params", st_ju(st_model_param_count(in->model)));
	json_object_object_add(o, "units", json_object_new_int(p->units));
	json_object_object_add(root, "model", o);
	json_object_object_add(root, "batch", json_object_new_int(in->batch));
	json_object_object_add(root, "seq", json_object_new_int(in->seq));
	json_object_object_add(root, "grad_accum", json_object_new_int(in->grad_accum));
	json_object_object_add(root, "precision", json_object_new_string(in->bf16 ? "bf16" : "fp32"));
	if (in->model && st_model_precision(in->model) != ST_PRECISION_FP32)
		json_object_object_add(root, "compute_dtype", json_object_new_string(
						     st_precision_name(st_model_precision(in->model))));
	json_object_object_add(root, "prefetch", json_object_new_int(p->prefetch));
	if (p->world > 1) {
		static const char *kinds[] = { "allreduce", "reduce_scatter", "allgather",
					       "alltoall", "broadcast" };

		o = json_object_new_object();
		json_object_object_add(o, "world", json_object_new_int(p->world));
		json_object_object_add(o, "rank", json_object_new_int(p->rank));
		json_object_object_add(o, "stage", json_object_new_int(p->zero));
		o2 = json_object_new_object();
		for (int k = 0; k < 5; k++) {
			json_object *cell;

			if (!p->comm_calls[k])
				continue;
			cell = json_object_new_object();
			json_object_object_add(cell, "calls", st_ju(p->comm_calls[k]));
			json_object_object_add(cell, "bytes", st_ju(p->comm_bytes[k]));
			json_object_object_add(o2, kinds[k], cell);
		}
		json_object_object_add(o, "comm", o2);
		json_object_object_add(o, "net_s", json_object_new_double(p->t_net_s));
		json_object_object_add(o, "net_bps", json_object_new_double(p->rates.net_bps));
		json_object_object_add(root, "zero", o);
	}

	/* placement: state -> tier -> {units, bytes} */
	o = json_object_new_object();
	for (int s = 0; s < ST_STATE_COUNT; s++) {
		o2 = json_object_new_object();
		for (int h = 0; h < ST_HOME_COUNT; h++) {
			int units;
			uint64_t bytes;
			json_object *cell = json_object_new_object();

			char r[1024];

			st_count(p, (enum st_state)s, (enum st_home)h, &units, &bytes);
			st_unit_ranges(p, (enum st_state)s, (enum st_home)h, r, sizeof(r));
			json_object_object_add(cell, "units", json_object_new_int(units));
			json_object_object_add(cell, "bytes", st_ju(bytes));
			json_object_object_add(cell, "unit_ranges", json_object_new_string(r));
			json_object_object_add(o2, st_home_name((enum st_home)h), cell);
		}
		json_object_object_add(o, st_state_name((enum st_state)s), o2);
	}
	json_object_object_add(root, "placement", o);
	json_object_object_add(root, "split", json_object_new_boolean(p->split));

	arr = json_object_new_array();
	for (int u = 0; u < p->units; u++) {
		const struct st_unit_layout *l = st_model_unit_layout(in->model, u);

		o = json_object_new_object();
		json_object_object_add(o, "unit", json_object_new_int(u));
		json_object_object_add(o, "kind", json_object_new_string(st_kind_name(l->kind)));
		json_object_object_add(o, "elems", st_ju(l->elems));
		json_object_object_add(o, "keep", json_object_new_boolean(p->keep[u]));
		for (int s = 0; s < ST_STATE_COUNT; s++) {
			o2 = json_object_new_object();
			json_object_object_add(o2, "tier", json_object_new_string(
				st_home_name(st_plan_home(p, u, (enum st_state)s))));
			json_object_object_add(o2, "bytes",
					       st_ju(p->state_bytes[u * ST_STATE_COUNT + s]));
			json_object_object_add(o, st_state_name((enum st_state)s), o2);
		}
		json_object_array_add(arr, o);
	}
	json_object_object_add(root, "units", arr);

	/* recompute: the mode, the units that keep their forward */
	o = json_object_new_object();
	json_object_object_add(o, "mode", json_object_new_string(st_recompute_name(p->recompute)));
	arr = json_object_new_array();
	for (int u = 0; u < p->units; u++)
		if (p->keep[u])
			json_object_array_add(arr, json_object_new_int(u));
	json_object_object_add(o, "keep", arr);
	json_object_object_add(o, "saved_each_bytes", st_ju(p->saved_each_bytes));
	json_object_object_add(o, "saved_bytes",
			       st_ju(st_pg(p->saved_each_bytes) * (uint64_t)p->n_keep));
	json_object_object_add(o, "recompute_flops", json_object_new_double(p->recompute_flops));
	json_object_object_add(root, "recompute", o);

	o = json_object_new_object();
	json_object_object_add(o, "w_slots", st_ju(p->w_slots));
	json_object_object_add(o, "w_slot_bytes", st_ju(p->w_slot_bytes));
	json_object_object_add(o, "embed_slot_bytes", st_ju(p->embed_slot_bytes));
	json_object_object_add(o, "act_bytes", st_ju(p->act_bytes));
	json_object_object_add(o, "scratch_bytes", st_ju(p->scratch_bytes));
	json_object_object_add(o, "w_staging_bytes", st_ju(p->w_staging_bytes));
	json_object_object_add(o, "grad_landing_bytes", st_ju(p->grad_landing_bytes));
	json_object_object_add(o, "update_staging_bytes", st_ju(p->update_staging_bytes));
	json_object_object_add(root, "pools", o);
	json_object_object_add(root, "activations", st_act_json(p));
	/* every pool the engine allocates, in its order */
	arr = json_object_new_array();
	for (int i = 0; i < p->n_pools; i++) {
		const struct st_plan_pool *x = &p->pools[i];

		o = json_object_new_object();
		json_object_object_add(o, "name", json_object_new_string(x->name));
		json_object_object_add(o, "tier", json_object_new_string(st_home_name(x->tier)));
		json_object_object_add(o, "bytes", st_ju(x->bytes));
		json_object_object_add(o, "count", json_object_new_int((int)x->count));
		if (x->unit >= 0)
			json_object_object_add(o, "unit", json_object_new_int(x->unit));
		json_object_array_add(arr, o);
	}
	json_object_object_add(root, "pool_list", arr);

	o = json_object_new_object();
	for (int h = 0; h < ST_HOME_COUNT; h++) {
		if (h == ST_HOME_NVME && !in->have_nvme)
			continue;
		o2 = json_object_new_object();
		json_object_object_add(o2, "home_bytes", st_ju(p->home_bytes[h]));
		json_object_object_add(o2, "total_bytes", st_ju(p->total_bytes[h]));
		json_object_object_add(o2, "budget_bytes", st_ju(p->budget_bytes[h]));
		json_object_object_add(o2, "min_bytes", st_ju(p->min_bytes[h]));
		if (h == ST_HOME_NVME)
			json_object_object_add(o2, "budget_unlimited",
					       json_object_new_boolean(!in->nvme_mem_bytes));
		json_object_object_add(o, st_home_name((enum st_home)h), o2);
	}
	json_object_object_add(root, "tiers", o);

	o = json_object_new_object();
	json_object_object_add(o, "h2d_bytes", st_ju(p->h2d_bytes));
	json_object_object_add(o, "d2h_bytes", st_ju(p->d2h_bytes));
	json_object_object_add(o, "nvme_read_bytes", st_ju(p->nvme_read_bytes));
	json_object_object_add(o, "nvme_write_bytes", st_ju(p->nvme_write_bytes));
	json_object_object_add(o, "update_h2d_bytes", st_ju(p->upd_h2d_bytes));
	json_object_object_add(o, "update_nvme_read_bytes", st_ju(p->upd_nvme_read_bytes));
	json_object_object_add(o, "update_prefetch_nvme_read_bytes",
			       st_ju(p->upd_prefetch_nvme_read_bytes));
	json_object_object_add(o, "update_nvme_write_bytes", st_ju(p->upd_nvme_write_bytes));
	json_object_object_add(root, "traffic", o);

	o = json_object_new_object();
	json_object_object_add(o, "compute_flops", json_object_new_double(p->rates.compute_flops));
	json_object_object_add(o, "copy_bps", json_object_new_double(p->rates.copy_bps));
	json_object_object_add(o, "nvme_read_bps", json_object_new_double(p->rates.nvme_read_bps));
	json_object_object_add(o, "nvme_write_bps", json_object_new_double(p->rates.nvme_write_bps));
	json_object_object_add(o, "adam_bps", json_object_new_double(p->rates.adam_bps));
	json_object_object_add(o, "net_bps", json_object_new_double(p->rates.net_bps));
	o2 = json_object_new_object();
	for (int i = 0; i < ST_RATE_COUNT; i++)
		json_object_object_add(o2, st_rate_key((enum st_rate)i),
				       json_object_new_string(st_src(p, (enum st_rate)i)));
	json_object_object_add(o, "source", o2);
	json_object_object_add(root, "rates", o);

	o = json_object_new_object();
	json_object_object_add(o, "compute_s", json_object_new_double(p->t_compute_s));
	json_object_object_add(o, "copy_s", json_object_new_double(p->t_copy_s));
	json_object_object_add(o, "nvme_s", json_object_new_double(p->t_nvme_s));
	json_object_object_add(o, "adam_s", json_object_new_double(p->t_adam_s));
	json_object_object_add(o, "net_s", json_object_new_double(p->t_net_s));
	json_object_object_add(o, "serial_s", json_object_new_double(p->t_serial_s));
	json_object_object_add(o, "step_s", json_object_new_double(p->t_step_s));
	json_object_object_add(o, "bound", json_object_new_string(p->bound));
	json_object_object_add(o, "host_compute", json_object_new_boolean(in->host_compute));
	json_object_object_add(o, "compute_flops", json_object_new_double(p->compute_flops_step));
	json_object_object_add(o, "adam_bytes", st_ju(p->adam_bytes));
	{
		static const char *ph_names[2] = { "backward", "update" };
		static const char *lane_keys[5] = { "compute_s", "copy_s", "nvme_s", "adam_s",
						    "net_s" };
		json_object *arr = json_object_new_array();

		for (int ph = 0; ph < 2; ph++) {
			json_object *q = json_object_new_object(), *l = json_object_new_object();

			json_object_object_add(q, "phase", json_object_new_string(ph_names[ph]));
			json_object_object_add(q, "s", json_object_new_double(p->t_phase_s[ph]));
			json_object_object_add(q, "bound", json_object_new_string(p->phase_bound[ph]));
			for (int i = 0; i < 5; i++)
				json_object_object_add(l, lane_keys[i],
						       json_object_new_double(p->t_phase_lane_s[ph][i]));
			json_object_object_add(q, "lanes", l);
			json_object_array_add(arr, q);
		}
		json_object_object_add(o, "phases", arr);
	}
	json_object_object_add(root, "time", o);

	/* the batch that hides the I/O */
	o = json_object_new_object();
	json_object_object_add(o, "accum_max", json_object_new_int(ST_PLAN_ACCUM_MAX));
	json_object_object_add(o, "compute_bound_accum", p->hide_accum ?
			       json_object_new_int(p->hide_accum) : NULL);
	json_object_object_add(o, "compute_bound_step_s", p->hide_accum ?
			       json_object_new_double(p->hide_step_s) : NULL);
	json_object_object_add(o, "auto_accum", json_object_new_int(p->hide_best_accum));
	json_object_object_add(o, "auto_step_s", json_object_new_double(p->hide_best_step_s));
	json_object_object_add(o, "why_not", p->hide_accum ? NULL :
			       json_object_new_string(p->hide_why));
	json_object_object_add(root, "hide", o);

	text = strdup(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
							     JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(root);
	return text;
}
