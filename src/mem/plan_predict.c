/* strata: the planner's prediction (src/mem, docs/plan.md "The model of
 * the step"): the rates (given or the defaults), the traffic and the
 * collectives of one step for a placement, the time of each lane and of
 * the step's two phases, and the --grad-accum that hides the I/O. The
 * planner's other parts are listed in plan.c. */
#include "plan_internal.h"

#include <errno.h>
#include <math.h>
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

int st_plan_rates_fill(const struct st_plan_rates *r, struct st_plan_rates *out)
{
	static const double defaults[ST_RATE_COUNT] = {
		ST_PLAN_COMPUTE_FLOPS, ST_PLAN_COPY_BPS, ST_PLAN_NVME_READ_BPS,
		ST_PLAN_NVME_WRITE_BPS, ST_PLAN_ADAM_BPS, ST_PLAN_NET_BPS,
		0, 0, /* the cores' passes: the copy rate (below) */
	};

	for (int i = 0; i < ST_RATE_COUNT; i++) {
		double v = st_plan_rate_get(r, (enum st_rate)i);

		if (!isfinite(v) || v < 0)
			return st_error_set(-EINVAL, "plan: rate %g is not a positive number", v);
	}
	for (int i = 0; i < ST_RATE_COUNT; i++) {
		double v = st_plan_rate_get(r, (enum st_rate)i);

		/* the copy rate is set before the cores' rates */
		st_plan_rate_set(out, (enum st_rate)i,
				 v > 0 ? v : defaults[i] > 0 ? defaults[i] : out->copy_bps);
		out->source[i] = !(v > 0) ? ST_RATE_SRC_DEFAULT
			       : r->source[i] ? r->source[i] : ST_RATE_SRC_FLAG;
	}
	return 0;
}

/* The fetches of unit u's W into a slot a pass of a micro-batch makes:
 * the forward's of every unit but the last (whose backward computes its
 * forward and the loss), and the backward's of every unit but a resident
 * one fetched in the forward (kept widened). */
static bool fwd_fetches(const struct st_shape *sh, int u)
{
	return u < sh->units - 1;
}

static bool bwd_fetches(const struct st_shape *sh, int u)
{
	return !(sh->resident[u] && u < sh->units - 1);
}

/* The collectives of one step on one rank, as st_comm_stats counts them
 * (calls, and the full buffer of each: reduce-scatter's send, all-gather's
 * recv, allreduce's count): the engine's calls, docs/zero.md. */
static void predict_comm(const struct st_shape *sh, struct st_plan *p)
{
	uint64_t n = (uint64_t)sh->accum, N = (uint64_t)sh->world, parts = 0;
	/* a unit's W crosses once a step layer-first, n times batch-first;
	 * its dW is reduced in place once at world 1, while at world > 1
	 * every micro-batch's goes to the ranks either way */
	uint64_t nx = sh->layer_first ? 1 : n, nr = sh->layer_first && N == 1 ? 1 : n;
	enum { AR = 0, RS = 1, AG = 2, A2A = 3 }; /* strata/comm.h's order */

	memset(p->comm_bytes, 0, sizeof(p->comm_bytes));
	memset(p->comm_calls, 0, sizeof(p->comm_calls));
	for (int u = 0; u < sh->units; u++) {
		uint64_t fetches = (uint64_t)fwd_fetches(sh, u) + bwd_fetches(sh, u);

		/* every micro-batch: dW's slices to their ranks (world 1: the
		 * reduce-scatter in place); stage 0 gathers the final G slices */
		p->comm_calls[N > 1 ? A2A : RS] += nr;
		p->comm_bytes[N > 1 ? A2A : RS] += nr * sh->epad[u] * 4;
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
			p->comm_calls[AG] += nx * fetches;
			p->comm_bytes[AG] += nx * fetches * sh->epad[u] * sh->wb;
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

/* Checkpoints on the host: each of 1..act_offloaded goes d2h after the
 * forward and h2d before the backward, every micro-batch; layer-first
 * once a step, the N micro-batches' block of it: (N-1) * Xa + its own. */
static void act_traffic(const struct st_shape *sh, struct st_plan *p)
{
	uint64_t b = 0, lf = 0, xa = st_align_up(sh->x_bytes, ST_PLAN_ACT_ALIGN);

	for (int j = 1; j <= p->act_offloaded; j++) {
		b += sh->act_copy[j];
		lf += (uint64_t)(sh->accum - 1) * xa + sh->act_copy[j];
	}
	p->act_copy_bytes = b;
	p->h2d_bytes += sh->layer_first ? lf : (uint64_t)sh->accum * b;
	p->d2h_bytes += sh->layer_first ? lf : (uint64_t)sh->accum * b;
}

/* FLOPs per token the backward spends recomputing forwards: a third of
 * the share of every unit that could keep but does not. */
static double recomp_flops(const struct st_plan_input *in, const struct st_shape *sh)
{
	double f = 0;

	for (int u = 0; u < sh->units; u++)
		if (sh->saved[u] && !sh->keep[u])
			f += st_model_unit_flops_per_token(in->model, u, in->seq) / 3.0;
	return f;
}

/* The bytes of the first `tiles` staged tiles of state s: the engine's
 * update tiles (engine_update.c) cut each unit's range of P (the rank's
 * shard) at the tile and, at world > 1, at every slice; a state's tiles
 * are staged in the units where it lives on nvme. */
static uint64_t first_tiles_bytes(const struct st_shape *sh, const enum st_home *homes,
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

			bytes += len * st_shape_eb(sh, s);
			t0 += len;
		}
	}
	return bytes;
}

/* The update's loads the engine queues during the last micro-batch's
 * backward (st_eng_update_prefetch): P, M and V need no G, so each of
 * them loads its first two staged tiles, one into each of its two
 * staging buffers, before the sweep starts. */
static uint64_t predict_prefetch(const struct st_shape *sh, const enum st_home *homes)
{
	uint64_t bytes = 0;

	for (int s = ST_STATE_P; s <= ST_STATE_V; s++)
		bytes += first_tiles_bytes(sh, homes, (enum st_state)s, 2);
	return bytes;
}

/* The update inside the backward: [0] the forwards and the backwards
 * before the last one, [1] the last backward with the whole update
 * beside it (its G, P, M, V loads, stores and AdamW; no fused forward:
 * the next step's forward runs in [0]). The share of the other lanes'
 * time in the last backward: of the compute, its share of the FLOPs, two
 * thirds of the step's at layer-first (every micro-batch's backward of a
 * unit runs before its update), two thirds of 1/N batch-first; of the
 * copies and the disk, whose work there is mostly W fetches, its share
 * of the passes, one of the step's 2 layer-first, one of 2N batch-first.
 * The backward's first W fetches (bwd_ahead_nvme_read_bytes) go ahead
 * into the first phase where its disk has time: the engine fetches k
 * units ahead, and the last forward's are the first backward's. host:
 * the cpu device, where compute, AdamW and the copies add. */
static void phases_in_backward(const struct st_shape *sh, const double t[5], bool host,
			       const struct st_plan *p, double (*L)[5])
{
	const struct st_plan_rates *r = &p->rates;
	double n = sh->layer_first ? 1 : sh->accum;
	double frac = 2.0 / 3.0 / n, frac_io = 0.5 / n, busiest = 0, idle, ahead;
	/* the cpu device: the update's sums on the cores (t_sums_s) */
	double sums = p->t_sums_s > 0 ? (double)(p->upd_nvme_read_bytes + p->upd_nvme_write_bytes) /
						r->sum_bps
				      : 0;
	double upd[5] = { sums, (double)p->upd_h2d_bytes / r->copy_bps,
			  (double)p->upd_nvme_read_bytes / r->nvme_read_bps +
				  (double)p->upd_nvme_write_bytes / r->nvme_write_bps,
			  t[3], 0 };

	for (int i = 0; i < 5; i++) {
		double rest = ST_MAX(t[i] - upd[i], 0.0), f = i == 1 || i == 2 ? frac_io : frac;

		L[0][i] = rest * (1 - f);
		L[1][i] = rest * f + upd[i];
	}
	for (int i = 0; i < 5; i++)
		if (i != 2)
			busiest = ST_MAX(busiest, L[0][i]);
	if (host) /* as predict_phases() adds the cores' lane */
		busiest = ST_MAX(busiest, L[0][0] + (L[0][3] + L[0][1]));
	idle = busiest - L[0][2];
	ahead = ST_MIN((double)p->bwd_ahead_nvme_read_bytes / r->nvme_read_bps,
		       ST_MIN(idle, L[1][2] - upd[2]));
	if (ahead > 0) {
		/* filled up to the busiest lane: as busy as it, exactly */
		L[0][2] = ahead == idle ? busiest : L[0][2] + ahead;
		L[1][2] -= ahead;
	}
}

/* The step's two phases (docs/plan.md, "The model of the step"): [0] the
 * forwards and backwards, [1] the update sweep with the next step's first
 * forward beside it (its FLOPs, W fetches and, on the cpu device, widens).
 * The update starts after the last backward (the clip
 * needs the whole gradient's norm) and the next step's backward after the
 * sweep, so the phases add; within a phase the lanes overlap. The update
 * phase has the update's traffic (G, P, M, V loads and P, M, V, W stores
 * on nvme, the new W to vram) but the P, M, V loads the engine queues
 * during the backward (predict_prefetch), AdamW, and one micro-batch's forward
 * FLOPs (a third of the model's, nothing recomputed); the rest of each
 * lane is the first phase's. The fill and drain: one unit's share of each
 * phase's lanes but its busiest, twice (in the backward: once, and none
 * in a phase the disk binds). t[] are the whole step's lanes. */
static void predict_phases(const struct st_plan_input *in, const struct st_shape *sh,
			   const double t[5], struct st_plan *p)
{
	static const char *names[] = { "compute", "copy", "nvme", "adam", "net" };
	const struct st_plan_rates *r = &p->rates;
	double fwd = st_model_flops_per_token(in->model, in->seq) * in->batch * in->seq / 3.0 /
		     r->compute_flops;
	double (*L)[5] = p->t_phase_lane_s, others = 0;

	/* layer-first: the sweep runs the next step's forward of all N */
	if (sh->layer_first)
		fwd *= sh->accum;
	/* the cpu device: its widens (t_widen_s), and the sums of the
	 * update's nvme bytes (t_sums_s) */
	if (p->t_widen_s > 0)
		fwd += (double)p->upd_widen_bytes / r->widen_bps;
	fwd = ST_MIN(fwd, t[0]);
	L[1][0] = fwd;
	if (p->t_sums_s > 0)
		L[1][0] += (double)(p->upd_nvme_read_bytes - p->upd_prefetch_nvme_read_bytes +
				    p->upd_fwd_nvme_read_bytes + p->upd_nvme_write_bytes) /
			   r->sum_bps;
	/* its W fetches: unit u's once u's new W is home (st_plan_predict) */
	L[1][1] = (double)(p->upd_h2d_bytes + p->upd_fwd_h2d_bytes) / r->copy_bps;
	L[1][2] = (double)(p->upd_nvme_read_bytes - p->upd_prefetch_nvme_read_bytes +
			   p->upd_fwd_nvme_read_bytes) / r->nvme_read_bps +
		  (double)p->upd_nvme_write_bytes / r->nvme_write_bps;
	L[1][3] = t[3];
	L[1][4] = 0;
	for (int i = 0; i < 5; i++)
		L[1][i] = ST_MIN(L[1][i], t[i]);
	for (int i = 0; i < 5; i++)
		L[0][i] = ST_MAX(t[i] - L[1][i], 0.0);
	if (p->in_backward)
		phases_in_backward(sh, t, in->host_compute, p, L);
	for (int ph = 0; ph < 2; ph++) {
		int arg = 0;

		if (in->host_compute) { /* compute, AdamW and the copies share the cores */
			L[ph][0] += L[ph][3] + L[ph][1];
			L[ph][1] = L[ph][3] = 0;
		}
		for (int i = 1; i < 5; i++)
			if (L[ph][i] > L[ph][arg])
				arg = i;
		/* in the backward, a disk as busy as the busiest lane binds
		 * (the read-ahead fills phase 0's disk up to that lane) */
		if (p->in_backward && arg != 2 && L[ph][2] >= L[ph][arg])
			arg = 2;
		/* the fill and drain: each phase both (the update after the
		 * backward: the clip's barrier between them); the update
		 * inside the backward has one barrier a step, at its end, so
		 * one fill (phase 0) and one drain (phase 1), and none where
		 * the disk binds the phase: that end of the chain is its own
		 * (the forward's first W read, the last unit's stores) */
		for (int i = 0; i < 5; i++)
			if (i != arg && (!p->in_backward || arg != 2))
				others += L[ph][i];
		p->t_phase_s[ph] = L[ph][arg];
		p->phase_bound[ph] = names[arg];
		if (arg == 0 && in->host_compute && ph == 1 && t[3] > fwd)
			p->phase_bound[ph] = names[3];
	}
	p->t_serial_s = (p->in_backward ? 1.0 : 2.0) * others / sh->units;
	p->t_step_s = p->t_phase_s[0] + p->t_phase_s[1] + p->t_serial_s;
}

/* The times of the lanes from the traffic and the FLOPs, the busiest lane
 * of the step (on the cpu device compute and AdamW share the cores and are
 * added), and the step: its two phases plus the pipeline's fill and drain
 * (predict_phases(); docs/plan.md, "Predicted time per step"). */
static void predict_times(const struct st_plan_input *in, const struct st_shape *sh,
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
	p->recompute_flops = recomp_flops(in, sh) * tokens;
	p->compute_flops_step = st_model_flops_per_token(in->model, in->seq) * tokens +
				p->recompute_flops;
	/* on the cpu device the widens are passes over host memory on the
	 * cores (their bytes read and written, at widen_bps) */
	p->t_widen_s = in->host_compute ? (double)p->widen_bytes / r->widen_bps : 0;
	/* and so are the sums of every nvme byte read and written (XXH3,
	 * engine_sums.c; at sum_bps) */
	p->t_sums_s = in->host_compute ? (double)(p->nvme_read_bytes + p->nvme_write_bytes) /
						 r->sum_bps
				       : 0;
	t[0] = p->compute_flops_step / r->compute_flops + p->t_widen_s + p->t_sums_s;
	t[1] = (double)(p->h2d_bytes + p->d2h_bytes) / r->copy_bps;
	t[2] = (double)p->nvme_read_bytes / r->nvme_read_bps +
	       (double)p->nvme_write_bytes / r->nvme_write_bps;
	/* a rank updates its slice of P from stage 1 */
	p->adam_bytes = (uint64_t)((double)st_model_param_count(in->model) *
				   (sh->mvb == 4 ? ST_PLAN_ADAM_BYTES_PER_PARAM
				    /* G, P, W as fp32's; M, V read and written in
				     * their format (q8: a scale per block) */
				    : 14.0 + 4.0 * (double)sh->mvb + (sh->mvb == 1 ? 0.0625 : 0.0)) /
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
	if (in->host_compute) { /* compute, AdamW and the copies share the cores */
		lane[0] = t[0] + t[3] + t[1];
		lane[1] = lane[3] = 0;
	}
	for (int i = 1; i < 5; i++)
		if (lane[i] > lane[arg])
			arg = i;
	/* the cores' lane is named by the larger of its two */
	p->bound = arg == 0 && in->host_compute && t[3] > t[0] ? names[3] : names[arg];
	predict_phases(in, sh, t, p);
}

/* A slice of ws bytes of W to its home and back (home host: copies in
 * memory, no link). */
static void w_slice_traffic(enum st_home home, uint64_t ws, struct st_plan *p)
{
	if (home == ST_HOME_NVME) {
		p->nvme_write_bytes += ws;
		p->nvme_read_bytes += ws;
		p->upd_nvme_write_bytes += ws;
		p->upd_nvme_read_bytes += ws;
	} else if (home == ST_HOME_VRAM) {
		p->h2d_bytes += ws;
		p->d2h_bytes += ws;
		p->upd_h2d_bytes += ws;
	}
}

bool st_plan_in_backward(const struct st_shape *sh, const enum st_home *homes)
{
	if (!sh->in_backward)
		return false;
	for (int u = 0; u < sh->units; u++)
		for (int s = ST_STATE_P; s <= ST_STATE_V; s++)
			if (homes[u * ST_STATE_COUNT + s] != ST_HOME_NVME)
				return false;
	return true;
}

void st_plan_predict(const struct st_plan_input *in, const struct st_shape *sh,
		const enum st_home *homes, struct st_plan *p)
{
	uint64_t n = (uint64_t)sh->accum;
	/* the times a step moves a unit's W for each pass and its dW:
	 * n batch-first, once layer-first (docs/plan.md, "Schedules") */
	uint64_t nx = sh->layer_first ? 1 : n;
	uint64_t p_dev_elems = 0, p_all_elems = 0;
	/* the compute's bytes per element of a widened W */
	uint64_t cb = st_model_precision(in->model) == ST_PRECISION_BF16 ? 2 : 4;
	bool fused;

	p->h2d_bytes = p->d2h_bytes = p->nvme_read_bytes = p->nvme_write_bytes = 0;
	p->upd_h2d_bytes = p->upd_nvme_read_bytes = p->upd_nvme_write_bytes = 0;
	p->upd_fwd_h2d_bytes = p->upd_fwd_nvme_read_bytes = 0;
	p->widen_bytes = p->upd_widen_bytes = 0;
	p->in_backward = st_plan_in_backward(sh, homes);
	/* the sweep runs the next step's first forward (not in the backward,
	 * where the next forward is the next step's own; nor without one) */
	fused = !p->in_backward && !sh->forward_only;
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
		/* W comes into a slot for each pass that fetches it, in every
		 * micro-batch. After the update the new W goes to its home. */
		uint64_t fetches = (uint64_t)fwd_fetches(sh, u) + bwd_fetches(sh, u);

		/* every use widens the whole unit (bf16 or fp32 W read, the
		 * compute's dtype written); the fused forward's, units 0..U-2
		 * once, go beside the sweep (the update after the backward) */
		uint64_t wid = sh->elems[u] * (sh->wb + cb);

		p->widen_bytes += nx * fetches * wid;
		if (fused && u < sh->units - 1) {
			p->upd_widen_bytes += wid;
			if (h[ST_STATE_W] != ST_HOME_VRAM)
				p->upd_fwd_h2d_bytes += w;
			if (h[ST_STATE_W] == ST_HOME_NVME)
				p->upd_fwd_nvme_read_bytes += w;
		}
		if (h[ST_STATE_W] == ST_HOME_VRAM) {
			/* the optimizer on the device writes W in place */
			p->h2d_bytes += h[ST_STATE_P] == ST_HOME_VRAM ? 0 : w;
			p->upd_h2d_bytes += h[ST_STATE_P] == ST_HOME_VRAM ? 0 : w;
		} else {
			p->h2d_bytes += nx * fetches * w;
		}
		if (h[ST_STATE_W] == ST_HOME_NVME) {
			p->nvme_read_bytes += nx * fetches * w;
			p->nvme_write_bytes += w;
			p->upd_nvme_write_bytes += w;
		}
		/* stages 1-2 in the backward: the rank's slice of the new W goes
		 * home alone in the backward, and back for the commit's gather */
		if (p->in_backward && sh->world > 1 && (sh->zero == 1 || sh->zero == 2))
			w_slice_traffic(h[ST_STATE_W], sh->slice[u] * sh->wb, p);
		/* dW to the host: at world > 1 the N slots of the rank's slice;
		 * none when G lives in vram */
		if (h[ST_STATE_G] != ST_HOME_VRAM)
			p->d2h_bytes += sh->layer_first ? g
					 : n * (sh->world > 1 ? sh->epad[u] * 4 : g);
		/* G: written each micro-batch, read to accumulate (n - 1) and
		 * once by the update (layer-first: written once, read by the
		 * update), but the update inside the backward reads it in
		 * host memory, where it became final, and does not write it
		 * either (a step the clip fails runs again, engine_step.c;
		 * the plan assumes the speculation holds). At stage 0 (world
		 * > 1) the final G is the whole padded unit, gathered: its
		 * write and the update's load move that. P, M, V read and
		 * written once. */
		if (h[ST_STATE_G] == ST_HOME_NVME) {
			uint64_t gf = sh->world > 1 && sh->zero == 0 ? sh->epad[u] * 4 : g;

			p->nvme_read_bytes += (nx - 1) * g;
			p->nvme_write_bytes += (nx - 1) * g;
			if (!p->in_backward) { /* the final G's write and load */
				p->nvme_write_bytes += gf;
				p->nvme_read_bytes += gf;
				p->upd_nvme_read_bytes += gf;
			}
		}
		for (int s = ST_STATE_P; s <= ST_STATE_V; s++)
			if (h[s] == ST_HOME_NVME) {
				/* M and V in their format (strata/optim.h) */
				uint64_t b = s == ST_STATE_P ? pmv : se[s] * sh->mvb;

				p->nvme_read_bytes += b;
				p->nvme_write_bytes += b;
				p->upd_nvme_read_bytes += b;
				p->upd_nvme_write_bytes += b;
			}
	}
	/* the last backward's first k W fetches from nvme (k the prefetch
	 * depth, or every unit) */
	p->bwd_ahead_nvme_read_bytes = 0;
	for (int u = sh->units - 1, k = p->prefetch > 0 ? p->prefetch : sh->units; u >= 0 && k > 0;
	     u--) {
		if (!bwd_fetches(sh, u))
			continue;
		k--;
		if (homes[u * ST_STATE_COUNT + ST_STATE_W] == ST_HOME_NVME)
			p->bwd_ahead_nvme_read_bytes +=
				sh->st_elems[u * ST_STATE_COUNT + ST_STATE_W] * sh->wb;
	}
	p->upd_prefetch_nvme_read_bytes = predict_prefetch(sh, homes);
	predict_comm(sh, p);
	act_traffic(sh, p);
	/* units whose optimizer runs on the device take no CPU AdamW time,
	 * unless the device is the host's cores (the cpu device) */
	predict_times(in, sh, p_dev_elems && !in->host_compute ?
				 1.0 - (double)p_dev_elems / (double)p_all_elems : 1.0, p);
}

/* The batch that hides the I/O: the step at every --grad-accum N up to
 * ST_PLAN_ACCUM_MAX with the same placement and k (as long as its pools
 * still fit), the first N where compute bounds it, and the N that
 * --grad-accum auto takes. */
void st_plan_predict_hide(const struct st_plan_input *in, const struct st_shape *sh,
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
		if (!st_plan_fits(&pools, budget, -1))
			break;
		st_plan_predict(in, &s2, homes, &q);
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
