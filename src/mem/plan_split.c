/* strata: the split placement policy (docs/plan.md, "Placement policy").
 *
 * Starting from a placement that fits, fill the faster tiers, fastest
 * first, with the shards (unit x state) that save the most predicted time
 * per byte there. A shard's saving is what its move alone takes off the sum
 * of the resources' predicted times: that sum is linear in the traffic, so
 * the savings of different shards add up, and one ordering serves the whole
 * fill. W on nvme is read twice a step per micro-batch (N F) and written
 * once, so a byte of W saves the most; G is written and read by every
 * micro-batch (N each way), P, M and V once each way, so at N > 1 a byte of
 * G beats one of P, M or V. At N = 1 they tie, and what the move takes off
 * the update phase decides: G's write goes in the backward, beside all of
 * the step's compute, its load in the update, where only AdamW and one
 * forward are beside it; P's, M's and V's load and store are both the
 * update's (but for their first tiles' loads, which the engine issues in
 * the backward, and whose place the next unit's tiles then take). So P, M
 * and V go first, then G; equal savings go in unit order, which keeps the
 * units' P, M and V together. The fill goes down the ordered list taking every
 * move that still fits (first fit, by saving per byte), and goes over it
 * again while something moved: a move can free room for an earlier one
 * (the last W leaving the slots, the last shard of a state leaving nvme
 * takes its update staging with it). */
#include "plan_split.h"

#include <math.h>
#include <stdlib.h>

struct st_move {
	int u, s;
	double per_byte_s; /* predicted seconds saved per byte of the shard */
	double upd_per_byte_s; /* of them, the update phase's */
};

void st_split_allowed(const struct st_plan_input *in, unsigned allowed[ST_STATE_COUNT])
{
	unsigned nvme = in->have_nvme ? 1u << ST_HOME_NVME : 0;

	/* a forced class stays in its row's tier: no move at all, whatever
	 * the tier (so a forced home the split does not know is kept too) */
	allowed[ST_STATE_W] = in->params != ST_OFFLOAD_AUTO ? 0
			      : 1u << ST_HOME_VRAM | 1u << ST_HOME_HOST | nvme;
	for (int s = ST_STATE_G; s < ST_STATE_COUNT; s++)
		allowed[s] = in->optim != ST_OFFLOAD_AUTO ? 0 : 1u << ST_HOME_HOST | nvme;
}

/* x to 30 significant bits: the savings per byte of shards that differ
 * only in size (the embedding's G and a block's) differ in their last
 * bits by rounding alone, and should tie, so that the unit order decides. */
static double round30(double x)
{
	int e;
	double m = frexp(x, &e);

	return ldexp(nearbyint(m * 0x1p30) / 0x1p30, e);
}

/* The most saving per byte first; then the most of it off the update
 * phase; then unit, then state, so the order is total and the result the
 * same on every machine. */
static int move_cmp(const void *a, const void *b)
{
	const struct st_move *x = a, *y = b;

	if (x->per_byte_s != y->per_byte_s)
		return x->per_byte_s > y->per_byte_s ? -1 : 1;
	if (x->upd_per_byte_s != y->upd_per_byte_s)
		return x->upd_per_byte_s > y->upd_per_byte_s ? -1 : 1;
	if (x->u != y->u)
		return x->u < y->u ? -1 : 1;
	return (x->s > y->s) - (x->s < y->s);
}

/* Fill tier t: every shard that may live there and now lives in a slower
 * tier (a larger enum st_home) is a candidate. */
static int split_fill(const struct st_split_ops *ops, enum st_home *homes, enum st_home t,
		      struct st_move *mv)
{
	int n = 0, moved = 0;
	bool changed;
	double step, upd, base_upd, base = ops->cost(ops->ctx, homes, &step, &base_upd);

	for (int u = 0; u < ops->units; u++)
		for (int s = 0; s < ST_STATE_COUNT; s++) {
			enum st_home *h = &homes[u * ST_STATE_COUNT + s], was = *h;
			uint64_t bytes = ops->bytes[u * ST_STATE_COUNT + s];
			double saved;

			if (!(ops->allowed[s] & 1u << t) || was <= t || !bytes)
				continue;
			*h = t;
			saved = base - ops->cost(ops->ctx, homes, &step, &upd);
			*h = was;
			/* a move that saves nothing only takes room (the head's
			 * W, fetched once, costs as much h2d in vram) */
			if (saved > 0)
				mv[n++] = (struct st_move){
					.u = u, .s = s,
					.per_byte_s = round30(saved / (double)bytes),
					.upd_per_byte_s = round30((base_upd - upd) / (double)bytes),
				};
		}
	qsort(mv, (size_t)n, sizeof(*mv), move_cmp);
	do {
		changed = false;
		for (int i = 0; i < n; i++) {
			enum st_home *h = &homes[mv[i].u * ST_STATE_COUNT + mv[i].s], was = *h;

			if (was == t)
				continue;
			*h = t;
			if (ops->fits(ops->ctx, homes)) {
				changed = true;
				moved++;
			} else {
				*h = was;
			}
		}
	} while (changed);
	return moved;
}

size_t st_split_scratch_bytes(int units)
{
	return sizeof(struct st_move) * (size_t)units * ST_STATE_COUNT;
}

int st_split_improve(const struct st_split_ops *ops, enum st_home *homes)
{
	int moved = 0;

	/* vram first: W moved there also leaves host (or nvme) room for the
	 * fill of host that follows */
	for (int t = ST_HOME_VRAM; t < ST_HOME_NVME; t++)
		moved += split_fill(ops, homes, (enum st_home)t, ops->scratch);
	return moved;
}

bool st_split_better(double step_a, double sum_a, double step_b, double sum_b)
{
	const double eps = 1e-9;

	if (step_a < step_b * (1 - eps))
		return true;
	if (step_a > step_b * (1 + eps))
		return false;
	return sum_a < sum_b * (1 - eps);
}
