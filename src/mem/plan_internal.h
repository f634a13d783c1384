/* strata: what the parts of the placement planner share, internal to
 * src/mem (plan.c lists the parts). Not a public header: the planner's API
 * is strata/plan.h. */
#ifndef STRATA_PLAN_INTERNAL_H
#define STRATA_PLAN_INTERNAL_H

#include "strata/plan.h"
#include "plan_split.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define ST_PLAN_UNLIMITED UINT64_MAX

/* What the pools are made of; fixed by the model and the batch. */
struct st_shape {
	const struct st_model *model;
	int units, accum;
	uint64_t wb;           /* bytes per W element: 2 or 4 */
	uint64_t mvb;          /* bytes per M or V element: 4, 2 (bf16) or 1 (q8) */
	uint64_t *elems;       /* [units] e_u */
	bool *resident;        /* [units] kept on the device for a micro-batch */
	int n_resident;
	uint64_t e_max;        /* E */
	uint64_t e_reg;        /* the largest unit that is not resident */
	uint64_t e_res;        /* the largest resident unit */
	uint64_t x_bytes;      /* X: the largest unit output (a checkpoint) */
	uint64_t bt_bytes;     /* B*T*4: tokens or targets */
	bool seg;              /* a seg pool too (st_plan_input.seg) */
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
	 * homes by st_plan_cand_homes()), and per checkpoint j (1..U-1) the bytes a
	 * copy of it moves (ST_PLAN_ACT_ALIGN-rounded), [units] */
	enum st_home *act_home;
	uint64_t *act_copy;
	/* recompute: per unit its saved-forward bytes (0: keeps nothing), its
	 * workspace when kept (scratch only) and when not, and whether it
	 * keeps in the placement being sized */
	uint64_t *saved, *work_kept, *work_full;
	bool *keep;
	/* --schedule layer-first (strata/plan.h): the pools hold N = accum
	 * micro-batches at each unit boundary, W and G cross once a step */
	bool layer_first;
	/* the update inside the backward is predicted where every P, M, V
	 * is on nvme (st_plan_in_backward) */
	bool in_backward;
	bool forward_only;     /* st_plan_input.forward_only: G, P, M, V 0 bytes */
};

/* Bytes per element of state s in its home. */
static inline uint64_t st_shape_eb(const struct st_shape *sh, int s)
{
	return s == ST_STATE_W ? sh->wb : s == ST_STATE_M || s == ST_STATE_V ? sh->mvb : 4;
}

/* Bytes of a shard of n elements of state s in its home: a compact M or
 * V (bf16, q8) in whole pages, as O_DIRECT moves them (fp32 shards are
 * whole pages already). */
static inline uint64_t st_shape_shard_bytes(const struct st_shape *sh, int s, uint64_t n)
{
	uint64_t b = n * st_shape_eb(sh, s);

	return (s == ST_STATE_M || s == ST_STATE_V) && sh->mvb != 4 ? st_align_up(b, ST_PAGE_BYTES) : b;
}

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

/* One plan's policy: the candidates (the rows of the uniform table the
 * options allow, or the explicit homes), the prefetch k the placement is
 * chosen at, and the split policy's view of the planner (plan_split.c). */
struct st_policy {
	const struct st_plan_input *in;
	const struct st_shape *sh;
	const struct st_cand *c;
	int n, k;
	const uint64_t *budget;   /* the budgets being tried */
	struct st_plan scratch;   /* st_plan_predict's output; of its inputs, the rates,
				     act_offloaded and prefetch (k: the placement's
				     read-ahead in the backward is k units') */
	uint64_t *bytes;          /* [units * ST_STATE_COUNT] each shard's bytes */
	uint64_t all_bytes;       /* their sum */
	enum st_home *trial;      /* [units * ST_STATE_COUNT] */
	void *moves;              /* st_split_improve()'s scratch */
	struct st_split_ops ops;
};

/* --- sizing (plan_pools.c) --- */

/* bytes rounded up to whole pages */
uint64_t st_plan_page_bytes(uint64_t bytes);
/* The activation checkpoints' vram slots (host home), and how many of
 * them go to the host (0 in vram). */
int st_plan_act_slots(const struct st_shape *sh);
int st_plan_act_offloaded(const struct st_shape *sh, enum st_home a);
/* The pools of placement homes at prefetch k, into *p (the engine's order). */
void st_pools_compute(const struct st_shape *sh, const enum st_home *homes, int k,
		      struct st_pools *p);
/* The paged bytes of the pools with ids a..b; the pool with id (or NULL). */
uint64_t st_pools_sum(const struct st_pools *p, enum st_pool_id a, enum st_pool_id b);
const struct st_plan_pool *st_pools_find(const struct st_pools *p, enum st_pool_id id);
/* The homes of candidate c (sets *sh->act_home); sh->homes or c's own. */
const enum st_home *st_plan_cand_homes(const struct st_shape *sh, struct st_cand c);
/* Do the pools fit every budget but tier skip (-1: none)? */
bool st_plan_fits(const struct st_pools *p, const uint64_t *budget, int skip);
/* The shape of in's model and batch; st_shape_fini() frees it (and
 * st_shape_init() on failure). Returns 0 or -errno. */
int st_shape_init(const struct st_plan_input *in, struct st_shape *sh);
void st_shape_fini(struct st_shape *sh);

/* --- prediction (plan_predict.c) --- */

/* The rates of r, the defaults for those not given, into *out; -EINVAL
 * for one that is not a positive number. */
int st_plan_rates_fill(const struct st_plan_rates *r, struct st_plan_rates *out);
/* The traffic, collectives and times of one step with homes, into *p
 * (at p->rates). */
/* Whether the update runs inside the backward with these homes: the
 * shape asks for it (sh->in_backward) and every P, M, V is on nvme. */
bool st_plan_in_backward(const struct st_shape *sh, const enum st_home *homes);
void st_plan_predict(const struct st_plan_input *in, const struct st_shape *sh,
		const enum st_home *homes, struct st_plan *p);
/* The --grad-accum that hides the I/O, into p->hide_*. */
void st_plan_predict_hide(const struct st_plan_input *in, const struct st_shape *sh,
		     const enum st_home *homes, int k, const uint64_t *budget,
		     struct st_plan *p);

/* --- placement policy (plan_policy.c) --- */

/* The placements the options allow into c (at most 9), then each with
 * its checkpoint homes (at most twice as many). Return the count. */
int st_plan_cands(const struct st_plan_input *in, struct st_cand *c);
int st_plan_act_cands(const struct st_plan_input *in, struct st_cand *c, int n);
/* The policy over candidates c[0..n) at prefetch k; 0 or -ENOMEM. */
int st_policy_init(struct st_policy *pol, const struct st_plan_input *in,
		   const struct st_shape *sh, const struct st_cand *c, int n, int k,
		   const struct st_plan_rates *rates);
void st_policy_fini(struct st_policy *pol);
/* The chosen candidate's homes into out, or -1 when none fits. */
int st_policy_choose(struct st_policy *pol, const uint64_t *budget, enum st_home *out,
		     bool *split);
/* The prefetch depth of homes at budget. */
int st_policy_depth(const struct st_policy *pol, const enum st_home *homes,
		    const uint64_t *budget);
/* The smallest budget of tier t that works with the others as given. */
uint64_t st_plan_cond_min(struct st_policy *pol, const uint64_t *budget, int t);
/* No placement fits: -ENOSPC naming the budget to grow. */
int st_plan_explain(struct st_policy *pol, const uint64_t *budget);
/* The keeps (--recompute) a placement is searched with; AUTO's keeps for
 * the chosen placement at k. */
void st_plan_recomp_base(const struct st_plan_input *in, const struct st_shape *sh);
void st_plan_recomp_auto(const struct st_shape *sh, const enum st_home *homes, int k,
		    const uint64_t *budget);

/* --- output (plan_print.c; plan_json.c uses them too) --- */

/* bytes as "1.5 MiB" in buf (32 bytes). */
const char *st_plan_fmt_bytes(uint64_t bytes, char *buf);
/* Units and bytes of state s in tier h; the units as ranges ("0-19, 22"). */
void st_plan_count(const struct st_plan *p, enum st_state s, enum st_home h,
	      int *units, uint64_t *bytes);
void st_plan_unit_ranges(const struct st_plan *p, enum st_state s, enum st_home h, char *buf,
		    size_t n);
/* Where rate i came from; a unit kind's name. */
const char *st_plan_rate_source(const struct st_plan *p, enum st_rate i);
const char *st_plan_kind_name(enum st_unit_kind k);

#endif
