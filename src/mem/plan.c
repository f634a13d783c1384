/* strata: the placement planner. See strata/plan.h for the pools and
 * docs/plan.md for the policy.
 *
 * The policy's homes are uniform per state class: every unit's W has one
 * home, and G, P, M, V of every unit share one home. That leaves at most
 * 3 x 2 placements, so the planner simply tries them in order of preference
 * and takes the first whose pools fit all three budgets. The same small set
 * makes each tier's minimum exact: it is the smallest total that tier takes
 * over the placements whose other two tiers fit their budgets. The pools
 * are sized from per-(unit, state) homes, so explicit homes (the input's
 * `homes`: one candidate) go through the same code. */
#include "strata/plan.h"

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
};

/* One placement: W's home and G, P, M, V's home. */
struct st_cand {
	enum st_home w, o;
	const enum st_home *explicit_homes; /* the input's, when it gives them */
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

/* The pools of placement `homes` (per unit and state) at prefetch k, in
 * the order the engine allocates them. This is the one place that knows
 * a pool's size. */
static void st_pools_compute(const struct st_shape *sh, const enum st_home *homes, int k,
			     struct st_pools *p)
{
	bool g_nvme = st_any(sh, homes, ST_STATE_G, ST_STATE_G, ST_HOME_NVME, true);
	bool upd = st_any(sh, homes, ST_STATE_G, ST_STATE_V, ST_HOME_NVME, true) ||
		   st_any(sh, homes, ST_STATE_W, ST_STATE_W, ST_HOME_HOST, false);
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
	if (sh->units > 1)
		st_pool_add(p, ST_POOL_ACT, (uint64_t)(sh->units - 1) * sh->x_bytes, 1, -1);
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
	st_pool_add(p, ST_POOL_WORK, sh->work_bytes ? sh->work_bytes : 1, 1, -1);
	st_pool_add(p, ST_POOL_TOKENS, sh->bt_bytes, 1, -1);
	st_pool_add(p, ST_POOL_TARGETS, sh->bt_bytes, 1, -1);
	st_pool_add(p, ST_POOL_LANDING, sh->epad_max * 4, 1, -1);
	st_pool_add(p, ST_POOL_GSTAGE, sh->epad_max * 4, g_nvme && sh->accum > 1, -1);
	/* the update sweep goes tile by tile, two sets of staging in turn */
	st_pool_add(p, ST_POOL_UPD_W, et * sh->wb, upd ? 2 : 0, -1);
	st_pool_add(p, ST_POOL_UPD_F32, et * 4, upd ? 2 * 4 : 0, -1);
	/* ZeRO at world > 1 (docs/zero.md) */
	st_pool_add(p, ST_POOL_COMM_SCRATCH, sh->epad_max * 4, sh->world > 1, -1);
	st_pool_add(p, ST_POOL_W_GATHER, sh->epad_max * sh->wb, sh->w_gather ? 2 : 0, -1);
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
	if (!sh->elems || !sh->resident || !sh->homes) {
		st_shape_fini(sh);
		return st_error_set(-ENOMEM, "plan: out of memory");
	}
	for (int u = 0; u < sh->units; u++) {
		const struct st_unit_layout *l = st_model_unit_layout(m, u);
		size_t work = st_model_work_bytes(m, u, in->batch, in->seq);

		sh->elems[u] = l->elems;
		sh->resident[u] = l->resident;
		sh->n_resident += l->resident;
		sh->e_max = ST_MAX(sh->e_max, l->elems);
		if (l->resident)
			sh->e_res = ST_MAX(sh->e_res, l->elems);
		else
			sh->e_reg = ST_MAX(sh->e_reg, l->elems);
		sh->work_bytes = ST_MAX(sh->work_bytes, (uint64_t)work);
		sh->x_bytes = ST_MAX(sh->x_bytes, st_out_bytes(m, u, in->batch, in->seq));
	}
	if (sh->n_resident > ST_PLAN_MAX_RESIDENT) {
		st_shape_fini(sh);
		return st_error_set(-EINVAL, "plan: %d resident units (at most %d)",
				    sh->n_resident, ST_PLAN_MAX_RESIDENT);
	}
	sh->act_bytes = st_pg((uint64_t)(sh->units - 1) * sh->x_bytes);
	sh->bt_bytes = (uint64_t)in->batch * (uint64_t)in->seq * 4;
	return st_shape_slices(in, sh);
}

static int st_rates_fill(const struct st_plan_rates *r, struct st_plan_rates *out)
{
	const double vals[] = { r->compute_flops, r->copy_bps, r->nvme_read_bps,
				r->nvme_write_bps, r->adam_bps, r->net_bps };

	for (unsigned i = 0; i < ST_ARRAY_LEN(vals); i++)
		if (!isfinite(vals[i]) || vals[i] < 0)
			return st_error_set(-EINVAL, "plan: rate %g is not a positive number",
					    vals[i]);
	out->compute_flops = r->compute_flops > 0 ? r->compute_flops : ST_PLAN_COMPUTE_FLOPS;
	out->copy_bps = r->copy_bps > 0 ? r->copy_bps : ST_PLAN_COPY_BPS;
	out->nvme_read_bps = r->nvme_read_bps > 0 ? r->nvme_read_bps : ST_PLAN_NVME_READ_BPS;
	out->nvme_write_bps = r->nvme_write_bps > 0 ? r->nvme_write_bps : ST_PLAN_NVME_WRITE_BPS;
	out->adam_bps = r->adam_bps > 0 ? r->adam_bps : ST_PLAN_ADAM_BPS;
	out->net_bps = r->net_bps > 0 ? r->net_bps : ST_PLAN_NET_BPS;
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
	if ((unsigned)in->params > ST_OFFLOAD_NVME || (unsigned)in->optim > ST_OFFLOAD_NVME)
		return st_error_set(-EINVAL, "plan: unknown offload choice");
	if (in->params == ST_OFFLOAD_NVME && !in->have_nvme)
		return st_error_set(-EINVAL, "--offload-params nvme needs --nvme DIR");
	if (in->optim == ST_OFFLOAD_NVME && !in->have_nvme)
		return st_error_set(-EINVAL, "--offload-optim nvme needs --nvme DIR");
	for (int u = 0; in->homes && u < st_model_unit_count(in->model); u++)
		for (int s = 0; s < ST_STATE_COUNT; s++) {
			enum st_home h = in->homes[u * ST_STATE_COUNT + s];

			if ((unsigned)h >= ST_HOME_COUNT ||
			    (s != ST_STATE_W && h == ST_HOME_VRAM))
				return st_error_set(-EINVAL, "plan: unit %d's %s cannot live in "
						    "tier %d (W: vram, host or nvme; G, P, M, V: "
						    "host or nvme)", u,
						    st_state_name((enum st_state)s), (int)h);
			if (h == ST_HOME_NVME && !in->have_nvme)
				return st_error_set(-EINVAL, "plan: unit %d's %s on nvme needs "
						    "--nvme DIR", u,
						    st_state_name((enum st_state)s));
		}
	return 0;
}

/* The placements the options allow, most preferred first: W as close to
 * the device as possible, then the optimizer state in host. */
static int st_cands(const struct st_plan_input *in, struct st_cand *c)
{
	enum st_home ws[3], os[2];
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
	case ST_OFFLOAD_AUTO:
		os[no++] = ST_HOME_HOST;
		if (in->have_nvme)
			os[no++] = ST_HOME_NVME;
		break;
	default: os[no++] = ST_HOME_HOST;
	}
	for (int i = 0; i < nw; i++)
		for (int j = 0; j < no; j++)
			c[n++] = (struct st_cand){ .w = ws[i], .o = os[j] };
	return n;
}

/* Smallest total of tier t over the placements whose other tiers fit; or
 * UINT64_MAX when none does. */
static uint64_t st_cond_min(const struct st_shape *sh, const struct st_cand *c, int n,
			    int k, const uint64_t *budget, int t)
{
	uint64_t best = ST_PLAN_UNLIMITED;
	struct st_pools p;

	for (int i = 0; i < n; i++) {
		st_pools_compute(sh, st_cand_homes(sh, c[i]), k, &p);
		if (st_fits(&p, budget, t))
			best = ST_MIN(best, p.total[t]);
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
static int st_explain(const struct st_shape *sh, const struct st_cand *c, int n, int k,
		      const uint64_t *budget)
{
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

		need = st_cond_min(sh, c, n, k, budget, t);
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

static void st_predict(const struct st_plan_input *in, const struct st_shape *sh,
		       const enum st_home *homes, struct st_plan *p)
{
	const struct st_plan_rates *r = &p->rates;
	uint64_t n = (uint64_t)sh->accum, wire = 0;
	double tokens = (double)in->batch * in->seq * (double)sh->accum;
	double t[5];
	static const char *names[] = { "compute", "copy", "nvme", "adam", "net" };

	p->h2d_bytes = p->d2h_bytes = p->nvme_read_bytes = p->nvme_write_bytes = 0;
	for (int u = 0; u < sh->units; u++) {
		const enum st_home *h = &homes[u * ST_STATE_COUNT];
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

		if (h[ST_STATE_W] == ST_HOME_VRAM)
			p->h2d_bytes += w;
		else
			p->h2d_bytes += n * fetches * w;
		if (h[ST_STATE_W] == ST_HOME_NVME) {
			p->nvme_read_bytes += n * fetches * w;
			p->nvme_write_bytes += w;
		}
		/* dW to the host: at world > 1 the N slots of the rank's slice */
		p->d2h_bytes += n * (sh->world > 1 ? sh->epad[u] * 4 : g);
		/* G: written each micro-batch, read to accumulate (n - 1) and
		 * once by the update; P, M, V read and written once. */
		if (h[ST_STATE_G] == ST_HOME_NVME) {
			p->nvme_read_bytes += n * g;
			p->nvme_write_bytes += n * g;
		}
		for (int s = ST_STATE_P; s <= ST_STATE_V; s++)
			if (h[s] == ST_HOME_NVME) {
				p->nvme_read_bytes += pmv;
				p->nvme_write_bytes += pmv;
			}
	}
	st_predict_comm(sh, p);
	for (int k = 0; k < 5; k++)
		wire += p->comm_bytes[k];
	/* 4/3: the backward recomputes the forward (1/3 of fwd + bwd). */
	t[0] = st_model_flops_per_token(in->model, in->seq) * tokens * 4.0 / 3.0 /
	       r->compute_flops;
	t[1] = (double)(p->h2d_bytes + p->d2h_bytes) / r->copy_bps;
	t[2] = (double)p->nvme_read_bytes / r->nvme_read_bps +
	       (double)p->nvme_write_bytes / r->nvme_write_bps;
	/* a rank updates its slice of P from stage 1 */
	t[3] = (double)st_model_param_count(in->model) * ST_PLAN_ADAM_BYTES_PER_PARAM /
	       r->adam_bps / (sh->world > 1 && sh->zero >= 1 ? sh->world : 1);
	/* a collective's buffer crosses the wire but for this rank's 1/N */
	t[4] = sh->world > 1 ? (double)wire * (double)(sh->world - 1) / sh->world / r->net_bps
			     : 0;
	p->t_compute_s = t[0];
	p->t_copy_s = t[1];
	p->t_nvme_s = t[2];
	p->t_adam_s = t[3];
	p->t_net_s = t[4];
	p->t_step_s = t[0];
	p->bound = names[0];
	for (int i = 1; i < 5; i++)
		if (t[i] > p->t_step_s) {
			p->t_step_s = t[i];
			p->bound = names[i];
		}
}

int st_plan_make(const struct st_plan_input *in, struct st_plan *plan)
{
	struct st_shape sh;
	struct st_cand cands[6], c;
	struct st_pools pools;
	uint64_t budget[ST_HOME_COUNT];
	const enum st_home *homes;
	const struct st_plan_pool *x;
	struct st_plan p;
	int n, k0, k, chosen = -1, ret;

	ret = st_input_check(in);
	if (ret < 0)
		return ret;
	memset(&p, 0, sizeof(p));
	ret = st_rates_fill(&in->rates, &p.rates);
	if (ret == 0)
		ret = st_shape_init(in, &sh);
	if (ret < 0)
		return ret;
	budget[ST_HOME_VRAM] = in->gpu_mem_bytes;
	budget[ST_HOME_HOST] = in->host_mem_bytes;
	budget[ST_HOME_NVME] = !in->have_nvme ? 0 :
			       in->nvme_mem_bytes ? in->nvme_mem_bytes : ST_PLAN_UNLIMITED;
	n = st_cands(in, cands);
	k0 = in->prefetch > 0 ? in->prefetch : 1;
	for (int i = 0; i < n && chosen < 0; i++) {
		st_pools_compute(&sh, st_cand_homes(&sh, cands[i]), k0, &pools);
		if (st_fits(&pools, budget, -1))
			chosen = i;
	}
	if (chosen < 0) {
		ret = st_explain(&sh, cands, n, k0, budget);
		st_shape_fini(&sh);
		return ret;
	}
	c = cands[chosen];
	k = k0;
	if (in->prefetch == 0)
		for (k = sh.units; k > 1; k--) {
			st_pools_compute(&sh, st_cand_homes(&sh, c), k, &pools);
			if (st_fits(&pools, budget, -1))
				break;
		}
	homes = st_cand_homes(&sh, c);
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
	if (!p.home || !p.state_bytes || !p.pools || !p.slice_elems) {
		st_plan_fini(&p);
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
	p.work_bytes = sh.work_bytes;
	p.w_staging_bytes = st_pools_sum(&pools, ST_POOL_W_STAGE, ST_POOL_W_STAGE_RES);
	p.grad_landing_bytes = st_pools_sum(&pools, ST_POOL_LANDING, ST_POOL_GSTAGE);
	p.update_staging_bytes = st_pools_sum(&pools, ST_POOL_UPD_W, ST_POOL_UPD_F32);
	for (int t = 0; t < ST_HOME_COUNT; t++) {
		p.home_bytes[t] = pools.home[t];
		p.total_bytes[t] = pools.total[t];
		p.budget_bytes[t] = budget[t];
		p.min_bytes[t] = st_cond_min(&sh, cands, n, k0, budget, t);
	}
	if (budget[ST_HOME_NVME] == ST_PLAN_UNLIMITED)
		p.budget_bytes[ST_HOME_NVME] = pools.total[ST_HOME_NVME];
	st_predict(in, &sh, p.home, &p);
	st_shape_fini(&sh);
	*plan = p;
	return 0;
}

void st_plan_fini(struct st_plan *plan)
{
	if (!plan)
		return;
	free(plan->home);
	free(plan->state_bytes);
	free(plan->pools);
	free(plan->slice_elems);
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
	fprintf(f, "        checkpoints     %s (%d x %s)\n", st_fb(p->act_bytes, a),
		p->units - 1, st_fb(p->act_each_bytes, b));
	fprintf(f, "        scratch         %s (model workspace %s)\n", st_fb(p->scratch_bytes, a),
		st_fb(p->work_bytes, b));
	fprintf(f, "  host  W staging       %s\n", st_fb(p->w_staging_bytes, a));
	fprintf(f, "        grad landing    %s\n", st_fb(p->grad_landing_bytes, a));
	fprintf(f, "        update staging  %s\n", st_fb(p->update_staging_bytes, a));
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
	fprintf(f, "  compute  %-10s at %.1f GFLOP/s\n", st_fmt_s(p->t_compute_s, a, 32),
		p->rates.compute_flops / 1e9);
	fprintf(f, "  copy     %-10s at %.2f GB/s\n", st_fmt_s(p->t_copy_s, a, 32),
		p->rates.copy_bps / 1e9);
	fprintf(f, "  nvme     %-10s at %.2f / %.2f GB/s read / write\n",
		st_fmt_s(p->t_nvme_s, a, 32), p->rates.nvme_read_bps / 1e9,
		p->rates.nvme_write_bps / 1e9);
	fprintf(f, "  adam     %-10s at %.2f GB/s\n", st_fmt_s(p->t_adam_s, a, 32),
		p->rates.adam_bps / 1e9);
	if (p->world > 1)
		fprintf(f, "  net      %-10s at %.2f GB/s\n", st_fmt_s(p->t_net_s, a, 32),
			p->rates.net_bps / 1e9);
	fprintf(f, "  step     %-10s bound by %s\n", st_fmt_s(p->t_step_s, a, 32), p->bound);
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

			st_count(p, (enum st_state)s, (enum st_home)h, &units, &bytes);
			json_object_object_add(cell, "units", json_object_new_int(units));
			json_object_object_add(cell, "bytes", st_ju(bytes));
			json_object_object_add(o2, st_home_name((enum st_home)h), cell);
		}
		json_object_object_add(o, st_state_name((enum st_state)s), o2);
	}
	json_object_object_add(root, "placement", o);

	arr = json_object_new_array();
	for (int u = 0; u < p->units; u++) {
		const struct st_unit_layout *l = st_model_unit_layout(in->model, u);

		o = json_object_new_object();
		json_object_object_add(o, "unit", json_object_new_int(u));
		json_object_object_add(o, "kind", json_object_new_string(st_kind_name(l->kind)));
		json_object_object_add(o, "elems", st_ju(l->elems));
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
	json_object_object_add(root, "traffic", o);

	o = json_object_new_object();
	json_object_object_add(o, "compute_flops", json_object_new_double(p->rates.compute_flops));
	json_object_object_add(o, "copy_bps", json_object_new_double(p->rates.copy_bps));
	json_object_object_add(o, "nvme_read_bps", json_object_new_double(p->rates.nvme_read_bps));
	json_object_object_add(o, "nvme_write_bps", json_object_new_double(p->rates.nvme_write_bps));
	json_object_object_add(o, "adam_bps", json_object_new_double(p->rates.adam_bps));
	json_object_object_add(root, "rates", o);

	o = json_object_new_object();
	json_object_object_add(o, "compute_s", json_object_new_double(p->t_compute_s));
	json_object_object_add(o, "copy_s", json_object_new_double(p->t_copy_s));
	json_object_object_add(o, "nvme_s", json_object_new_double(p->t_nvme_s));
	json_object_object_add(o, "adam_s", json_object_new_double(p->t_adam_s));
	json_object_object_add(o, "step_s", json_object_new_double(p->t_step_s));
	json_object_object_add(o, "bound", json_object_new_string(p->bound));
	json_object_object_add(root, "time", o);

	text = strdup(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
							     JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(root);
	return text;
}

int st_plan_rates_from_nvme_bench(const char *path, struct st_plan_rates *rates)
{
	json_object *root, *best, *v;
	double rd, wr;

	root = json_object_from_file(path);
	if (!root) {
		FILE *f = fopen(path, "r");

		if (!f)
			return st_error_set(-errno, "%s: %s", path, strerror(errno));
		fclose(f);
		return st_error_set(-EINVAL, "%s: not JSON (%s)", path, json_util_get_last_err());
	}
	if (!json_object_object_get_ex(root, "best", &best) ||
	    !json_object_is_type(best, json_type_object)) {
		json_object_put(root);
		return st_error_set(-EINVAL, "%s: no \"best\" object (write it with nvme-bench --json)",
				    path);
	}
	rd = wr = -1;
	if (json_object_object_get_ex(best, "read_gbps", &v) &&
	    (json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)))
		rd = json_object_get_double(v);
	if (json_object_object_get_ex(best, "write_gbps", &v) &&
	    (json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)))
		wr = json_object_get_double(v);
	json_object_put(root);
	if (!(rd > 0) || !(wr > 0) || !isfinite(rd) || !isfinite(wr))
		return st_error_set(-EINVAL, "%s: best.read_gbps and best.write_gbps must be positive "
				    "numbers (was the benchmark run with both read and write?)", path);
	rates->nvme_read_bps = rd * 1e9;
	rates->nvme_write_bps = wr * 1e9;
	return 0;
}
