/* strata: the split placement policy (src/mem/plan_split.c), internal to
 * src/mem. docs/plan.md ("Placement policy") explains it.
 *
 * The policy knows nothing of pools or rates: the planner (plan_policy.c)
 * hands it a fit test and a cost, both over a full placement (the home of every
 * (unit, state), [units * ST_STATE_COUNT]), so that every choice is judged
 * by the same pools and the same prediction the plan reports. */
#ifndef STRATA_PLAN_SPLIT_H
#define STRATA_PLAN_SPLIT_H

#include "strata/plan.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct st_split_ops {
	int units;
	/* Bytes of each shard in its home (the same in every tier),
	 * [units * ST_STATE_COUNT]. Borrowed. */
	const uint64_t *bytes;
	/* The tiers the split may move state s to, a mask of
	 * (1u << enum st_home); 0 for a forced class. */
	unsigned allowed[ST_STATE_COUNT];
	/* Required: do the pools of `homes` fit every budget (at the
	 * prefetch depth the placement is chosen at)? */
	bool (*fits)(void *ctx, const enum st_home *homes);
	/* Required: the predicted seconds of a step with `homes`: returns the
	 * sum over the resources (compute, copy, nvme, adam, net), puts the
	 * step (its two phases, each its busiest resource) in *step_s and,
	 * when update_s is not NULL, the sum over the resources of the
	 * update phase alone in *update_s. */
	double (*cost)(void *ctx, const enum st_home *homes, double *step_s, double *update_s);
	void *ctx;
	/* st_split_scratch_bytes(units) bytes the policy may use. Borrowed. */
	void *scratch;
};

size_t st_split_scratch_bytes(int units);

/* The tiers the split may move each state to: under auto, vram, host and
 * nvme for W, host and nvme for G, P, M, V (nvme only with
 * in->have_nvme); none for a class the options force (in->params for W,
 * in->optim for G, P, M, V), which keeps its row's tier. */
void st_split_allowed(const struct st_plan_input *in, unsigned allowed[ST_STATE_COUNT]);

/* Improve `homes`, which must fit, in place: fill the faster tiers (vram,
 * then host) with the shards whose move there saves the most predicted
 * time per byte, keeping only moves after which the placement still fits.
 * Deterministic. Returns the number of shards moved. */
int st_split_improve(const struct st_split_ops *ops, enum st_home *homes);

/* Is a placement predicted at (step_a, sum_a) seconds better than one at
 * (step_b, sum_b)? The step first, then the sum of the resources' times
 * (less traffic when both are bound by the same thing); within a relative
 * 1e-9 the two are equal and the answer is no. */
bool st_split_better(double step_a, double sum_a, double step_b, double sum_b);

#endif
