/* strata: the placement planner. See strata/plan.h for the pools and
 * docs/plan.md for the policy.
 *
 * The policy starts from the uniform placements (every unit's W in one
 * home, G, P, M, V of every unit in one home: at most 3 x 2 rows) and
 * improves each row that fits by the split of src/mem/plan_split.c, which
 * moves shards to faster tiers while the budgets hold; the row predicted
 * fastest wins. The same small set of rows keeps each tier's minimum
 * exact (st_plan_cond_min). The pools are sized from per-(unit, state) homes,
 * so explicit homes (the input's `homes`: one candidate) and split ones go
 * through the same code.
 *
 * The planner in parts, internal to src/mem (plan_internal.h):
 *   plan.c          this: the input's checks, st_plan_make() and st_plan_fini()
 *   plan_pools.c    sizing: the model's shape, the pools of a placement
 *   plan_policy.c   placement policy: candidates, choice, minimums, refusals
 *   plan_split.c    the split placement the policy improves each row with
 *   plan_predict.c  prediction: traffic, lanes, phases, the step's time
 *   plan_print.c    `strata plan`'s text
 *   plan_json.c     `strata plan --json` */
#include "plan_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A unit's G, P, M, V in vram: all four, with its W, at world 1. */
static int plan_vram_optim_check(const struct st_plan_input *in)
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

static int input_check(const struct st_plan_input *in)
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
	if ((unsigned)in->schedule > ST_SCHEDULE_AUTO)
		return st_error_set(-EINVAL, "plan: unknown schedule");
	if (in->schedule == ST_SCHEDULE_LAYER_FIRST) {
		/* what layer-first does not do yet (docs/plan.md, "Schedules") */
	}
	return plan_vram_optim_check(in);
}

static void recomp_fill(const struct st_plan_input *in, const struct st_shape *sh,
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

/* NONE refused: say that the saved forwards are what does not fit. */
static int recomp_explain(const struct st_plan_input *in, const struct st_shape *sh, int ret)
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

/* A refusal with the checkpoints forced into vram says when the host
 * would hold them. */
static int act_hint(const struct st_plan_input *in, int ret)
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

/* A refusal without an nvme tier says when one would make it fit. */
static int nvme_hint(const struct st_plan_input *in, int ret)
{
	struct st_plan_input x = *in;
	struct st_plan p;
	char msg[1024];

	if (ret != -ENOSPC || in->have_nvme)
		return ret;
	snprintf(msg, sizeof(msg), "%s", st_error_last());
	x.have_nvme = true;
	x.nvme_mem_bytes = 0; /* unlimited */
	if (st_plan_make(&x, &p) < 0)
		return st_error_set(ret, "%s", msg);
	st_plan_fini(&p);
	return st_error_set(ret, "%s; or give an nvme tier, --nvme DIR: with one it fits", msg);
}

/* Layer-first refused for a budget: say what its N micro-batches hold. */
static int lf_explain(const struct st_plan_input *in, const struct st_shape *sh, int ret)
{
	char why[512], b[32];

	if (!sh->layer_first || ret != -ENOSPC)
		return ret;
	snprintf(why, sizeof(why), "%s", st_error_last());
	return st_error_set(ret, "%s; --schedule layer-first holds the checkpoints and "
			    "activation gradients of --grad-accum %d micro-batches in vram "
			    "(%s of checkpoints each, two boundaries' with them on the host): raise "
			    "--gpu-mem, lower --grad-accum or use --schedule batch-first", why,
			    in->grad_accum,
			    st_format_bytes((uint64_t)(sh->units - 1) * sh->x_bytes, b,
					    sizeof(b)));
}

static int plan_make(const struct st_plan_input *in, struct st_plan *plan);

/* Why the update cannot run inside the backward with the plan's homes
 * (into why), or NULL when it can. */
static const char *in_backward_blocker(const struct st_plan_input *in, const struct st_plan *p,
				       char *why, size_t len)
{
	if (in->optim_state == ST_OPTIM_STATE_Q8)
		return "not with --optim-state q8 (its scales are updated in place)";
	for (int u = 0; u < p->units; u++)
		for (int s = ST_STATE_P; s <= ST_STATE_V; s++)
			if (p->home[u * ST_STATE_COUNT + s] != ST_HOME_NVME) {
				snprintf(why, len, "%s of unit %d is in %s; it needs P, M and "
					 "V on nvme (--offload-optim nvme)",
					 st_state_name((enum st_state)s), u,
					 st_home_name(p->home[u * ST_STATE_COUNT + s]));
				return why;
			}
	return NULL;
}

/* The update inside the backward for the chosen homes (st_plan_predict()
 * predicted it where the shape asked and every P, M, V is on nvme):
 * refused when asked and impossible; AUTO keeps it when its alternates fit
 * the nvme budget and its step is predicted shorter. Its alternate P, M,
 * V extents are added to the nvme total. */
static int update_resolve(const struct st_plan_input *in, struct st_shape *sh,
			  uint64_t nvme_budget, struct st_plan *p)
{
	char why[160], a[32], b[32];
	const char *no = in->update == ST_UPDATE_AFTER ? NULL
			 : in_backward_blocker(in, p, why, sizeof(why));
	uint64_t alt = 0;

	if (in->update == ST_UPDATE_IN_BACKWARD && no)
		return st_error_set(-EINVAL, "--update in-backward: %s; or --update after", no);
	for (int u = 0; p->in_backward && u < p->units; u++)
		for (int s = ST_STATE_P; s <= ST_STATE_V; s++)
			alt += p->state_bytes[u * ST_STATE_COUNT + s];
	if (p->in_backward && p->total_bytes[ST_HOME_NVME] + alt > nvme_budget) {
		if (in->update == ST_UPDATE_IN_BACKWARD)
			return st_error_set(-EINVAL, "--update in-backward: the alternate P, M, "
					    "V extents need %s more on nvme than --nvme-mem's %s; "
					    "raise it or use --update after",
					    st_plan_fmt_bytes(alt, a),
					    st_plan_fmt_bytes(nvme_budget, b));
		no = "its alternate P, M, V extents do not fit --nvme-mem";
	}
	if (p->in_backward && !no && in->update == ST_UPDATE_AUTO) {
		struct st_plan q = *p;

		sh->in_backward = false;
		st_plan_predict(in, sh, p->home, &q);
		if (!(p->t_step_s < q.t_step_s))
			no = "auto: not predicted faster";
		sh->in_backward = true;
	}
	if (no && p->in_backward) {
		sh->in_backward = false;
		st_plan_predict(in, sh, p->home, p);
		alt = 0;
	}
	p->alt_bytes = alt;
	p->total_bytes[ST_HOME_NVME] += alt;
	if (nvme_budget == ST_PLAN_UNLIMITED)
		p->budget_bytes[ST_HOME_NVME] = p->total_bytes[ST_HOME_NVME];
	if (in->update == ST_UPDATE_AFTER)
		snprintf(p->update_why, sizeof(p->update_why), "--update after");
	else if (p->in_backward)
		snprintf(p->update_why, sizeof(p->update_why), "%s", in->update == ST_UPDATE_AUTO ?
			 "auto: every P, M, V on nvme, predicted faster" : "--update in-backward");
	else
		snprintf(p->update_why, sizeof(p->update_why), "%s", no ? no : "?");
	return 0;
}

/* --update AUTO: the plan sized for the update inside the backward (its
 * placement puts every P, M, V on nvme where that is predicted faster)
 * against the plan sized for the update after the backward, whose split
 * may put the P, M and V of some units in host, which the update inside
 * the backward cannot use (it speculates on the alternates on nvme); the
 * shorter predicted step. */
static int plan_make_update(const struct st_plan_input *in, struct st_plan *plan)
{
	struct st_plan_input x = *in;
	struct st_plan af;
	int ret = plan_make(in, plan);

	if (ret < 0 || in->update != ST_UPDATE_AUTO)
		return ret;
	x.update = ST_UPDATE_AFTER;
	if (plan_make(&x, &af) < 0)
		return 0;
	if (!(af.t_step_s < plan->t_step_s)) {
		st_plan_fini(&af);
		return 0;
	}
	if (plan->in_backward) {
		snprintf(af.update_why, sizeof(af.update_why), "auto: after it, with its own "
			 "placement, predicted %.4g s a step against %.4g s in it", af.t_step_s,
			 plan->t_step_s);
	} else { /* why not, on af's own homes */
		char why[160];
		const char *no = in_backward_blocker(in, &af, why, sizeof(why));

		snprintf(af.update_why, sizeof(af.update_why), "%s", no ? no : plan->update_why);
	}
	st_plan_fini(plan);
	*plan = af;
	return 0;
}

/* AUTO: layer-first where it pays (N > 1), fits the budgets and is
 * predicted faster; batch-first otherwise. The two schedules give the same bits,
 * so this only moves time and memory. */
int st_plan_make(const struct st_plan_input *in, struct st_plan *plan)
{
	struct st_plan_input x = *in;
	struct st_plan lf;
	int ret;

	if (in->schedule != ST_SCHEDULE_AUTO) {
		ret = plan_make_update(in, plan);
		if (ret == 0)
			snprintf(plan->schedule_why, sizeof(plan->schedule_why), "--schedule %s",
				 st_schedule_name(in->schedule));
		return ret;
	}
	x.schedule = ST_SCHEDULE_BATCH_FIRST;
	ret = plan_make_update(&x, plan);
	if (in->grad_accum < 2) {
		if (ret == 0)
			snprintf(plan->schedule_why, sizeof(plan->schedule_why),
				 "auto: at --grad-accum 1 the two are one");
		return ret;
	}
	x.schedule = ST_SCHEDULE_LAYER_FIRST;
	if (plan_make_update(&x, &lf) < 0) {
		if (ret == 0)
			snprintf(plan->schedule_why, sizeof(plan->schedule_why),
				 "auto: layer-first does not fit: %s", st_error_last());
		return ret < 0 ? ret : 0;
	}
	if (ret == 0 && !(lf.t_step_s < plan->t_step_s)) {
		snprintf(plan->schedule_why, sizeof(plan->schedule_why), "auto: layer-first "
			 "predicted %.4g s a step, not shorter", lf.t_step_s);
		st_plan_fini(&lf);
		return 0;
	}
	if (ret == 0) {
		snprintf(lf.schedule_why, sizeof(lf.schedule_why), "auto: predicted %.4g s a step "
			 "against batch-first's %.4g s", lf.t_step_s, plan->t_step_s);
		st_plan_fini(plan);
	} else {
		snprintf(lf.schedule_why, sizeof(lf.schedule_why), "auto: batch-first does not fit");
	}
	*plan = lf;
	return 0;
}

static int plan_make(const struct st_plan_input *in, struct st_plan *plan)
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

	ret = input_check(in);
	if (ret < 0)
		return ret;
	memset(&p, 0, sizeof(p));
	ret = st_plan_rates_fill(&in->rates, &p.rates);
	if (ret == 0)
		ret = st_shape_init(in, &sh);
	if (ret < 0)
		return ret;
	st_plan_recomp_base(in, &sh);
	budget[ST_HOME_VRAM] = in->gpu_mem_bytes;
	budget[ST_HOME_HOST] = in->host_mem_bytes;
	budget[ST_HOME_NVME] = !in->have_nvme ? 0 :
			       in->nvme_mem_bytes ? in->nvme_mem_bytes : ST_PLAN_UNLIMITED;
	n = st_plan_act_cands(in, cands, st_plan_cands(in, cands));
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
		ret = lf_explain(in, &sh, recomp_explain(in, &sh, st_plan_explain(&pol, budget)));
		st_policy_fini(&pol);
		free(homes);
		st_shape_fini(&sh);
		return nvme_hint(in, act_hint(in, ret));
	}
	c = cands[chosen];
	*sh.act_home = c.a; /* st_policy_choose() tried the others last */
	/* the placement first, then k in what it leaves (docs/plan.md) */
	k = st_policy_depth(&pol, homes, budget);
	if (in->recompute == ST_RECOMPUTE_AUTO)
		st_plan_recomp_auto(&sh, homes, k, budget);
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
	p.schedule = sh.layer_first ? ST_SCHEDULE_LAYER_FIRST : ST_SCHEDULE_BATCH_FIRST;
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
				st_shape_shard_bytes(&sh, s, sh.st_elems[u * ST_STATE_COUNT + s]);
		}
	for (int u = 0; u < sh.units; u++)
		p.slice_elems[u] = sh.slice[u];
	memcpy(p.pools, pools.list, sizeof(*p.pools) * (size_t)pools.n);
	p.n_pools = pools.n;
	/* the summary `strata plan` prints, from the same list */
	x = st_pools_find(&pools, ST_POOL_W_SLOT);
	p.w_slots = x ? x->count : 0;
	p.w_slot_bytes = x ? st_plan_page_bytes(x->bytes) : 0;
	x = st_pools_find(&pools, ST_POOL_W_SLOT_RES);
	p.embed_slot = x != NULL;
	p.embed_slot_bytes = x ? st_plan_page_bytes(x->bytes) : 0;
	p.act_bytes = st_pools_sum(&pools, ST_POOL_ACT, ST_POOL_ACT);
	p.act_each_bytes = sh.x_bytes;
	p.scratch_bytes = st_pools_sum(&pools, ST_POOL_WF, ST_POOL_SEG);
	x = st_pools_find(&pools, ST_POOL_WORK);
	p.work_bytes = x->bytes;
	/* the keeps chosen; the minimums are the mode's (AUTO: keeping none) */
	recomp_fill(in, &sh, &pools, &p);
	st_plan_recomp_base(in, &sh);
	p.w_staging_bytes = st_pools_sum(&pools, ST_POOL_W_STAGE, ST_POOL_W_STAGE_RES);
	p.grad_landing_bytes = st_pools_sum(&pools, ST_POOL_LANDING, ST_POOL_GSTAGE);
	p.update_staging_bytes = st_pools_sum(&pools, ST_POOL_UPD_W, ST_POOL_UPD_F32);
	p.act_home = sh.units > 1 ? c.a : ST_HOME_VRAM; /* none to place */
	p.act_slots = c.a == ST_HOME_HOST ? st_plan_act_slots(&sh) : 0;
	p.act_offloaded = st_plan_act_offloaded(&sh, c.a);
	p.act_bytes += st_pools_sum(&pools, ST_POOL_ACT_SLOT, ST_POOL_ACT_SLOT);
	p.act_host_bytes = st_pools_sum(&pools, ST_POOL_ACT_HOME, ST_POOL_ACT_HOME);
	for (int t = 0; t < ST_HOME_COUNT; t++) {
		p.home_bytes[t] = pools.home[t];
		p.total_bytes[t] = pools.total[t];
		p.budget_bytes[t] = budget[t];
		p.min_bytes[t] = st_plan_cond_min(&pol, budget, t);
	}
	if (budget[ST_HOME_NVME] == ST_PLAN_UNLIMITED)
		p.budget_bytes[ST_HOME_NVME] = pools.total[ST_HOME_NVME];
	/* st_plan_cond_min() sized the other rows: back to the chosen one's */
	memcpy(sh.keep, p.keep, sizeof(*sh.keep) * (size_t)sh.units);
	*sh.act_home = c.a;
	st_plan_predict(in, &sh, p.home, &p);
	ret = update_resolve(in, &sh, budget[ST_HOME_NVME], &p);
	if (ret < 0) {
		st_plan_fini(&p);
		st_policy_fini(&pol);
		free(homes);
		st_shape_fini(&sh);
		return ret;
	}
	st_plan_predict_hide(in, &sh, p.home, k, budget, &p);
	st_policy_fini(&pol);
	free(homes);
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
	free(plan->keep);
	plan->keep = NULL;
	plan->slice_elems = NULL;
	plan->home = NULL;
	plan->state_bytes = NULL;
	plan->pools = NULL;
	plan->n_pools = 0;
}
