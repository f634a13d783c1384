/* strata: the planner's placement policy (src/mem, docs/plan.md): the
 * candidates the options allow (the rows of the uniform table, or the
 * explicit homes), each improved by the split of plan_split.c; the choice
 * of the one predicted fastest, its prefetch depth and (--recompute auto)
 * its kept forwards; each tier's exact minimum (st_plan_cond_min) and, when
 * nothing fits, the refusal that names the budget to grow. The planner's
 * other parts are listed in plan.c. */
#include "plan_internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The placements the options allow, most preferred first: W as close to
 * the device as possible, then the optimizer state in host. */
int st_plan_cands(const struct st_plan_input *in, struct st_cand *c)
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
int st_plan_act_cands(const struct st_plan_input *in, struct st_cand *c, int n)
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

/* --- the policy: the uniform table's rows, each improved by a split -------- */

/* The split's moves only take bytes off nvme, so the fill is held to the
 * vram and host budgets, and nvme is checked once, at the end. */
static bool policy_fits(void *ctx, const enum st_home *homes)
{
	struct st_policy *pol = ctx;
	struct st_pools p;

	st_pools_compute(pol->sh, homes, pol->k, &p);
	return st_plan_fits(&p, pol->budget, ST_HOME_NVME);
}

static double policy_cost(void *ctx, const enum st_home *homes, double *step_s,
			  double *update_s)
{
	struct st_policy *pol = ctx;
	struct st_plan *p = &pol->scratch;

	/* the checkpoint copies of the candidate being sized count too */
	p->act_offloaded = st_plan_act_offloaded(pol->sh, *pol->sh->act_home);
	p->prefetch = pol->k;
	st_plan_predict(pol->in, pol->sh, homes, p);
	*step_s = p->t_step_s;
	if (update_s) {
		*update_s = 0;
		for (int i = 0; i < 5; i++)
			*update_s += p->t_phase_lane_s[1][i];
	}
	return p->t_compute_s + p->t_copy_s + p->t_nvme_s + p->t_adam_s + p->t_net_s;
}

void st_policy_fini(struct st_policy *pol)
{
	free(pol->bytes);
	free(pol->trial);
	free(pol->moves);
}

int st_policy_init(struct st_policy *pol, const struct st_plan_input *in,
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
		pol->bytes[i] = st_shape_shard_bytes(sh, (int)(i % ST_STATE_COUNT), sh->st_elems[i]);
		pol->all_bytes += pol->bytes[i];
	}
	pol->ops = (struct st_split_ops){ .units = sh->units, .bytes = pol->bytes,
					  .fits = policy_fits, .cost = policy_cost,
					  .ctx = pol, .scratch = pol->moves };
	st_split_allowed(in, pol->ops.allowed);
	return 0;
}

/* Does candidate i work at `budget`? It must fit vram and host as it is;
 * improved by the split (explicit homes are not), it must then fit nvme
 * too. The improved homes are left in pol->trial; *moved counts the
 * shards the split moved. */
static bool policy_accept(struct st_policy *pol, int i, const uint64_t *budget, int *moved,
			  struct st_pools *p)
{
	size_t cells = (size_t)pol->sh->units * ST_STATE_COUNT;

	pol->budget = budget;
	*moved = 0;
	memcpy(pol->trial, st_plan_cand_homes(pol->sh, pol->c[i]), sizeof(*pol->trial) * cells);
	if (!policy_fits(pol, pol->trial))
		return false;
	if (!pol->c[i].explicit_homes)
		*moved = st_split_improve(&pol->ops, pol->trial);
	st_pools_compute(pol->sh, pol->trial, pol->k, p);
	return st_plan_fits(p, budget, -1);
}

/* --- recompute: the keeps a placement is sized with ------------------------- */

/* The keeps the placement search and the minimums are made with: every
 * unit that can keep for NONE, none for ALL and AUTO (AUTO keeps only
 * what is left over after everything else). */
void st_plan_recomp_base(const struct st_plan_input *in, const struct st_shape *sh)
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
void st_plan_recomp_auto(const struct st_shape *sh, const enum st_home *homes, int k,
		    const uint64_t *budget)
{
	struct st_pools p;

	for (int u = sh->units - 1; u >= 0; u--) {
		if (!sh->saved[u])
			continue;
		sh->keep[u] = true;
		st_pools_compute(sh, homes, k, &p);
		if (!st_plan_fits(&p, budget, -1))
			sh->keep[u] = false;
	}
}

/* The prefetch depth of homes: the forced one, or (--prefetch 0) the
 * largest in 1..U that fits what the placement leaves. */
int st_policy_depth(const struct st_policy *pol, const enum st_home *homes,
		    const uint64_t *budget)
{
	struct st_pools pools;
	int k = pol->k;

	if (pol->in->prefetch == 0)
		for (k = pol->sh->units; k > 1; k--) {
			st_pools_compute(pol->sh, homes, k, &pools);
			if (st_plan_fits(&pools, budget, -1))
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
int st_policy_choose(struct st_policy *pol, const uint64_t *budget, enum st_home *out,
		     bool *split)
{
	double best_step = 0, best_sum = 0;
	int chosen = -1;
	struct st_pools p;

	*split = false;
	for (int i = 0; i < pol->n; i++) {
		double step, sum;
		int moved;

		if (!policy_accept(pol, i, budget, &moved, &p))
			continue;
		if (pol->in->recompute == ST_RECOMPUTE_AUTO)
			st_plan_recomp_auto(pol->sh, pol->trial, st_policy_depth(pol, pol->trial, budget),
				       budget);
		sum = policy_cost(pol, pol->trial, &step, NULL);
		if (pol->in->recompute == ST_RECOMPUTE_AUTO)
			st_plan_recomp_base(pol->in, pol->sh);
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
 * when policy_accept() says so; on nvme it needs what its improved
 * homes take (the split, held to vram and host only, does not depend on
 * the nvme budget). */
uint64_t st_plan_cond_min(struct st_policy *pol, const uint64_t *budget, int t)
{
	uint64_t best = ST_PLAN_UNLIMITED, b[ST_HOME_COUNT];
	struct st_pools p;
	int moved;

	for (int i = 0; i < pol->n; i++) {
		uint64_t lo, hi;

		memcpy(b, budget, sizeof(b));
		if (t == ST_HOME_NVME) {
			b[t] = ST_PLAN_UNLIMITED;
			if (policy_accept(pol, i, b, &moved, &p))
				best = ST_MIN(best, p.total[t]);
			continue;
		}
		st_pools_compute(pol->sh, st_plan_cand_homes(pol->sh, pol->c[i]), pol->k, &p);
		b[t] = lo = p.total[t];
		if (policy_accept(pol, i, b, &moved, &p)) {
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
		if (!policy_accept(pol, i, b, &moved, &p))
			continue;
		lo /= 4096; /* refused at lo, accepted at hi */
		hi = (hi + 4095) / 4096;
		while (hi - lo > 1) {
			uint64_t mid = lo + (hi - lo) / 2;

			b[t] = mid * 4096;
			if (policy_accept(pol, i, b, &moved, &p))
				hi = mid;
			else
				lo = mid;
		}
		best = ST_MIN(best, hi * 4096);
	}
	return best;
}

/* The flag of tier t's budget. */
static const char *budget_flag(int t)
{
	return t == ST_HOME_VRAM ? "--gpu-mem" : t == ST_HOME_HOST ? "--host-mem" : "--nvme-mem";
}

static int refuse(int t, uint64_t budget, uint64_t need, const char *why)
{
	char b[32], m[32], d[32];

	return st_error_set(-ENOSPC, "%s budget %s (%llu B) is below the minimum of %s (%llu B) %s: "
			    "raise %s by %s",
			    st_home_name(t), st_format_bytes(budget, b, sizeof(b)),
			    (unsigned long long)budget, st_format_bytes(need, m, sizeof(m)),
			    (unsigned long long)need, why, budget_flag(t),
			    st_format_bytes(need - budget, d, sizeof(d)));
}

/* No placement fits: name one tier whose budget must grow, and by how much. */
int st_plan_explain(struct st_policy *pol, const uint64_t *budget)
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

		need = st_plan_cond_min(pol, budget, t);
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
		return refuse(pick, budget[pick], pick_need, "for this model and batch");
	/* Several do: the first tier too small for every placement. */
	for (int t = 0; t < ST_HOME_COUNT; t++) {
		need = ST_PLAN_UNLIMITED;
		for (int i = 0; i < n; i++) {
			st_pools_compute(sh, st_plan_cand_homes(sh, c[i]), k, &p);
			need = ST_MIN(need, p.total[t]);
		}
		if (need > budget[t])
			return refuse(t, budget[t], need,
				      "for this model and batch (other budgets are short too)");
	}
	/* Each tier could fit, but never all at once: take the placement that
	 * misses the fewest budgets and name its first shortfall. */
	for (int i = 0; i < n; i++) {
		int fail = 0;

		st_pools_compute(sh, st_plan_cand_homes(sh, c[i]), k, &p);
		for (int t = 0; t < ST_HOME_COUNT; t++)
			fail += p.total[t] > budget[t];
		if (fail < best_fail) {
			best_fail = fail;
			best_i = i;
		}
	}
	st_pools_compute(sh, st_plan_cand_homes(sh, c[best_i]), k, &p);
	for (int t = 0; t < ST_HOME_COUNT; t++)
		if (p.total[t] > budget[t])
			return refuse(t, budget[t], p.total[t],
				      "with W in its placement (other budgets are short too)");
	return st_error_set(-ENOSPC, "plan: no placement fits the budgets");
}
