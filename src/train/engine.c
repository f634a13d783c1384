/* The tiered engine: the step of docs/design.md over shards in their homes.
 *
 * Queues: compute runs on the compute's own queue of the device (a CUDA
 * stream; a worker thread on the cpu device); CPU AdamW runs on the calling
 * thread (OpenMP inside); copies run on the device's h2d/d2h queues (the vram
 * tier); NVMe I/O runs in the kernel (io_uring, the nvme tier). pump() reaps
 * completions from both tiers and moves each pipeline on; waits are pump
 * loops, so transfers for the next units proceed while a unit computes.
 * The host queues a unit's compute and goes on; between the compute queue
 * and the copy queues, order goes through device events, never through the
 * host waiting for compute:
 *   copy -> compute  the compute waits for the event the h2d queue records
 *                    after a W copy (ev_h2d): the host queues the unit once
 *                    the copy is queued;
 *   compute -> copy  a W slot is free once its copy is reaped: the next copy
 *                    into it waits for the event recorded after the widen
 *                    (ev_slot); dW's d2h waits for the event recorded after
 *                    the backward that wrote it (ev_dw, ev_dwe), and dW has
 *                    two buffers, so the backward of unit u-1 runs while
 *                    unit u's dW is copied out and added into G on the CPU.
 * The step ends with the compute drained, its spans (device-timed) counted
 * as the compute lane's busy time.
 *
 * Pipelines:
 *   W fetch  the sequence 0..U-2 (forward), U-1..1 (backward) per micro-
 *            batch; up to k fetches ahead of the unit computing, each into
 *            one of k+1 vram slots: nvme -> host staging -> vram, or
 *            host -> vram. W homes in vram need no fetch. The embedding's W
 *            is widened once per micro-batch into wf_embed and kept for the
 *            head (the tie) and the embedding's backward.
 *   dW       after bwd(u), dW -> host landing (d2h), then accumulated into
 *            G[u]: first micro-batch a copy, later ones an add (through
 *            host staging when G lives on nvme). The final G's sum of squares
 *            is taken there, per unit, and summed in unit order.
 *   update   u = 0..U-1, loading unit u+1's G, P, M, V (nvme -> staging) while
 *            AdamW runs on u; P, M, V go back to nvme and the new W to its
 *            home (h2d for vram, nvme write, or in place in host).
 * The same operations happen in the same order whatever the homes: only the
 * memory they happen in differs, so the bits do not. */
#include "strata/engine.h"
#include "strata/compute.h"
#include "strata/device.h"
#include "strata/kernels.h"
#include "strata/optim.h"
#include "strata/trace.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum op_kind { OP_W_NVME, OP_W_H2D, OP_D2H, OP_G_WRITE, OP_G_READ, OP_UPD_READ,
	       OP_UPD_WRITE };

struct op {
	enum op_kind kind;
	int idx;        /* slot; update set; for G writes 0 landing, 1 staging */
	enum st_lane lane;
	uint64_t t0_ns; /* submitted, or seen free of its wait */
	struct st_event *waits; /* the compute event it waits for, until seen done */
	uint64_t vram_seq;      /* in flight on the vram tier: its submit number; else 0 */
};

struct shard {
	enum st_home home;
	struct st_extent ext;
};

struct wslot {
	int seq;        /* position in the fetch sequence, -1 when free */
	uint64_t len;   /* bytes of the unit being fetched */
	int pending;    /* transfers in flight */
	bool ready;     /* its h2d is queued: the compute may wait for ev_h2d */
	unsigned widens; /* W widened from it so far: picks the ev_slot pair's event */
	struct st_extent ext;   /* vram */
	struct st_extent stage; /* host staging (W on nvme) */
};

struct updset {
	int reads, writes; /* in flight */
	struct st_extent ext[ST_STATE_COUNT]; /* host staging for each state */
};

struct lane_busy {
	unsigned inflight;
	uint64_t since_ns, busy_ns, bytes;
	uint64_t requests; /* in the current busy interval */
};

struct st_engine {
	struct st_engine_config cfg;
	struct st_model *model;
	struct st_plan plan;
	int U, k, Wb;
	uint64_t *elems, E, E0;
	uint64_t E1;                  /* largest unit after the embedding: wf, dW */
	uint64_t tile;                /* update tile, elements */
	size_t X;                     /* B*T*C floats */
	struct st_device *dev;
	struct st_compute *cx;        /* the model's ops on dev */
	struct st_tier *tier[ST_HOME_COUNT];
	struct shard *sh;             /* [U * ST_STATE_COUNT] */

	/* vram pools */
	struct wslot *slots;
	int nslots;                   /* the plan's w_slots, and the embedding's */
	int eslot;                    /* the embedding's own slot, or -1 */
	struct st_extent act_ext, wf_ext, wfe_ext, dw_ext[2], dwe_ext, da_ext, db_ext,
		work_ext, tok_ext, tgt_ext;
	float *acts, *wf, *wf_embed, *dW[2], *dW_embed, *dA, *dB;
	/* device events recorded by the compute: after the widen from each W
	 * slot (two per slot, in turn: a copy still waiting for one must not
	 * see it recorded again), after the backward that wrote dW[i],
	 * dW_embed; and by the h2d queue after the copy into each slot */
	struct st_event **ev_slot, *ev_dw[2], *ev_dwe, **ev_h2d;
	void *work;
	size_t work_bytes;
	int32_t *tokens, *targets;    /* vram */
	int32_t *tok_host, *tgt_host; /* drawn here, then copied to vram */

	/* host pools */
	struct st_extent land_ext, gstage_ext;
	float *landing, *gstage;
	int land_busy, gstage_busy;   /* transfers in flight on them */
	struct updset upd[2];

	/* W fetch sequence */
	int *seq, nseq, issued, consumed;
	int w_ready;                  /* units whose W may be fetched */
	struct st_cursor end_cur;     /* st_engine_step_end_cursor() */
	bool fwd_ready;               /* the forward of the next step's first
					 micro-batch ran in the update sweep */

	struct op *ops;               /* slots*2 + 3 + 2*(reads+writes) */
	int nops;
	int nwaiting;                 /* ops whose compute wait is not seen over */
	uint64_t vram_submits;
	struct lane_busy lane[ST_LANE_COUNT];
	double *unit_sumsq;
	bool nonfinite;

	int err;
	char errmsg[512];
	struct st_engine_stats last;
	int trace_lane[ST_LANE_COUNT];
};

static const char *lane_names[ST_LANE_COUNT] = { "compute", "h2d", "d2h", "nvme read",
						 "nvme write", "cpu adam" };

const char *st_lane_name(enum st_lane l)
{
	return lane_names[l];
}

static struct shard *shard(struct st_engine *e, int u, enum st_state s)
{
	return &e->sh[u * ST_STATE_COUNT + s];
}

static void *haddr(struct st_engine *e, const struct st_extent *x)
{
	return st_tier_addr(e->tier[ST_HOME_HOST], x);
}

static void *vaddr(struct st_engine *e, const struct st_extent *x)
{
	return st_tier_addr(e->tier[ST_HOME_VRAM], x);
}

/* --- lanes: busy time and bytes per queue, and the trace ---------------------- */

static void lane_begin(struct st_engine *e, enum st_lane l)
{
	if (e->lane[l].inflight++ == 0)
		e->lane[l].since_ns = st_now_ns();
}

/* A transfer lane's trace shows its busy intervals (from the first request
 * in flight to the last one out), which never overlap on one track, with the
 * number of requests in each; compute and Adam show each call. */
static void lane_end(struct st_engine *e, enum st_lane l, uint64_t t0, uint64_t bytes,
		     const char *name)
{
	struct lane_busy *lb = &e->lane[l];
	uint64_t now = st_now_ns();

	lb->bytes += bytes;
	lb->requests++;
	if (--lb->inflight)
		return;
	lb->busy_ns += now - lb->since_ns;
	if (e->cfg.trace) {
		char args[64];

		if (l == ST_LANE_ADAM) {
			st_trace_span(e->cfg.trace, e->trace_lane[l], name, t0, now, NULL);
		} else {
			snprintf(args, sizeof(args), "{\"requests\":%llu}",
				 (unsigned long long)lb->requests);
			st_trace_span(e->cfg.trace, e->trace_lane[l], "busy", lb->since_ns, now, args);
		}
	}
	lb->requests = 0;
}

/* --- I/O ------------------------------------------------------------------------ */

static int io(struct st_engine *e, enum st_home h, enum st_io_op rw,
	      const struct st_extent *ext, uint64_t off, void *buf, uint64_t len,
	      struct op *op, struct st_event *after, struct st_event *done)
{
	struct st_tier_io r = { .op = rw, .ext = *ext, .ext_off_bytes = off, .len_bytes = len,
				.buf = buf, .user = op, .after = after, .done = done };
	int ret;

	/* A copy waiting for the compute is not moving bytes yet: its lane is
	 * busy from when the wait is seen over (see_waits()). */
	op->t0_ns = st_now_ns();
	op->waits = after;
	if (after && st_event_query(e->dev, after) == 1)
		op->waits = NULL;
	if (!op->waits)
		lane_begin(e, op->lane);
	else
		e->nwaiting++;
	op->vram_seq = h == ST_HOME_VRAM ? ++e->vram_submits : 0;
	ret = st_tier_submit(e->tier[h], &r, 1);
	if (ret < 0) {
		if (op->waits) {
			op->waits = NULL;
			e->nwaiting--;
			lane_begin(e, op->lane);
		}
		op->vram_seq = 0;
		lane_end(e, op->lane, op->t0_ns, 0, "failed");
		if (!e->err) {
			e->err = ret;
			snprintf(e->errmsg, sizeof(e->errmsg), "%s", st_error_last());
		}
	}
	return ret;
}

static int nvme_io_at(struct st_engine *e, enum st_io_op rw, const struct st_extent *ext,
		      uint64_t off, void *buf, uint64_t len, struct op *op)
{
	op->lane = rw == ST_IO_READ ? ST_LANE_NVME_READ : ST_LANE_NVME_WRITE;
	return io(e, ST_HOME_NVME, rw, ext, off, buf, len, op, NULL, NULL);
}

static int nvme_io(struct st_engine *e, enum st_io_op rw, const struct st_extent *ext,
		   void *buf, uint64_t len, struct op *op)
{
	return nvme_io_at(e, rw, ext, 0, buf, len, op);
}

/* h2d: host buffer -> vram extent (a write of the vram tier). */
static int h2d_at(struct st_engine *e, const struct st_extent *vext, uint64_t off,
		  const void *buf, uint64_t len, struct op *op)
{
	op->lane = ST_LANE_H2D;
	return io(e, ST_HOME_VRAM, ST_IO_WRITE, vext, off, (void *)buf, len, op, NULL, NULL);
}


static int d2h(struct st_engine *e, const struct st_extent *vext, void *buf, uint64_t len,
	       struct op *op, struct st_event *after)
{
	op->lane = ST_LANE_D2H;
	return io(e, ST_HOME_VRAM, ST_IO_READ, vext, 0, buf, len, op, after, NULL);
}

static struct op *op_w_nvme(struct st_engine *e, int i) { return &e->ops[2 * i]; }
static struct op *op_w_h2d(struct st_engine *e, int i) { return &e->ops[2 * i + 1]; }
static struct op *op_misc(struct st_engine *e, int j) { return &e->ops[2 * e->nslots + j]; }

/* The event recorded after the last widen from slot i (a slot used for the
 * first time has one never recorded, which is done). */
static struct st_event *slot_widened(struct st_engine *e, int i)
{
	return e->ev_slot[2 * i + (e->slots[i].widens + 1) % 2];
}

/* W into slot i: after the widen of its last W, recording ev_h2d[i]. */
static int h2d_slot(struct st_engine *e, int i, const void *buf)
{
	struct op *op = op_w_h2d(e, i);
	int ret;

	op->lane = ST_LANE_H2D;
	ret = io(e, ST_HOME_VRAM, ST_IO_WRITE, &e->slots[i].ext, 0, (void *)buf, e->slots[i].len,
		 op, slot_widened(e, i), e->ev_h2d[i]);
	if (ret == 0)
		e->slots[i].ready = true;
	return ret;
}
/* misc: 0 d2h, 1 G write, 2 G read; then per update set 2 x ST_STATE_COUNT
 * (reads, then writes) */
static struct op *op_upd(struct st_engine *e, int set, int write, enum st_state s)
{
	return op_misc(e, 3 + set * 2 * ST_STATE_COUNT + write * ST_STATE_COUNT + (int)s);
}

static void handle(struct st_engine *e, struct op *op, int64_t res, struct st_tier *t)
{
	const char *names[] = { "W nvme->host", "W h2d", "dW d2h", "G write", "G read",
				"load", "store" };
	int ret = 0;

	op->vram_seq = 0;
	if (op->waits) { /* done before its wait was seen over: no busy time */
		op->waits = NULL;
		e->nwaiting--;
		op->t0_ns = st_now_ns();
		lane_begin(e, op->lane);
	}
	lane_end(e, op->lane, op->t0_ns, res > 0 ? (uint64_t)res : 0, names[op->kind]);
	if (res < 0) {
		if (!e->err) {
			e->err = (int)res;
			snprintf(e->errmsg, sizeof(e->errmsg), "%s", st_tier_error(t));
		}
		/* The pipelines stop here; the step reports the error. */
	}
	switch (op->kind) {
	case OP_W_NVME: {
		struct wslot *s = &e->slots[op->idx];

		s->pending--;
		if (res >= 0)
			ret = h2d_slot(e, op->idx, haddr(e, &s->stage));
		if (ret == 0 && res >= 0)
			s->pending++;
		break;
	}
	case OP_W_H2D: /* the compute waited for it on the device (ev_h2d) */
		e->slots[op->idx].pending--;
		break;
	case OP_D2H:
		e->land_busy--;
		break;
	case OP_G_WRITE:
		if (op->idx == 0)
			e->land_busy--;
		else
			e->gstage_busy--;
		break;
	case OP_G_READ:
		e->gstage_busy--;
		break;
	case OP_UPD_READ:
		e->upd[op->idx].reads--;
		break;
	case OP_UPD_WRITE:
		e->upd[op->idx].writes--;
		break;
	}
}

/* Copies waiting for a compute event: start their lane's busy time once
 * the event is seen done. */
static void see_waits(struct st_engine *e)
{
	for (int i = 0; i < e->nops && e->nwaiting; i++) {
		struct op *op = &e->ops[i];

		if (!op->waits || st_event_query(e->dev, op->waits) != 1)
			continue;
		op->waits = NULL;
		e->nwaiting--;
		op->t0_ns = st_now_ns();
		lane_begin(e, op->lane);
	}
}

/* The engine's oldest copy in flight on the vram tier, or NULL. */
static struct op *oldest_vram(struct st_engine *e)
{
	struct op *old = NULL;

	for (int i = 0; i < e->nops; i++)
		if (e->ops[i].vram_seq && (!old || e->ops[i].vram_seq < old->vram_seq))
			old = &e->ops[i];
	return old;
}

/* Reap what has completed; with block, wait for at least one completion
 * when nothing had. Returns the engine's first I/O error, or 0. */
static int pump(struct st_engine *e, bool block)
{
	struct st_tier_cqe cqe[32];
	int progressed = 0;

	if (e->nwaiting)
		see_waits(e);

	for (int h = ST_HOME_VRAM; h <= ST_HOME_NVME; h += 2) {
		struct st_tier *t = e->tier[h];
		int n;

		if (!t || !st_tier_inflight(t))
			continue;
		n = st_tier_reap(t, cqe, 32, 0);
		for (int i = 0; i < n; i++)
			handle(e, cqe[i].user, cqe[i].res, t);
		progressed += n > 0 ? n : 0;
	}
	if (!progressed && block) {
		struct st_tier *v = e->tier[ST_HOME_VRAM], *n = e->tier[ST_HOME_NVME];
		unsigned vin = st_tier_inflight(v), nin = n ? st_tier_inflight(n) : 0;
		struct st_tier *only = vin && !nin ? v : nin && !vin ? n : NULL;

		/* The vram tier blocks on its oldest copy: when that one waits
		 * for the compute, block on the compute's event first, to see
		 * when the copy starts (the wait is no longer for it). */
		if (only == v && e->nwaiting) {
			struct op *old = oldest_vram(e);

			if (old && old->waits) {
				st_event_sync(e->dev, old->waits);
				see_waits(e);
			}
		}
		if (only) {
			int got = st_tier_reap(only, cqe, 32, 1);

			for (int i = 0; i < got; i++)
				handle(e, cqe[i].user, cqe[i].res, only);
		} else if (vin || nin) {
			struct timespec ts = { 0, 20000 };

			nanosleep(&ts, NULL);
		}
	}
	return e->err;
}

/* Drain every transfer and the compute (after an error, or before reading
 * states). */
static void drain(struct st_engine *e)
{
	if (e->cx)
		st_compute_sync(e->cx);
	for (int h = ST_HOME_VRAM; h <= ST_HOME_NVME; h += 2) {
		struct st_tier *t = e->tier[h];
		struct st_tier_cqe cqe[32];

		while (t && st_tier_inflight(t)) {
			int n = st_tier_reap(t, cqe, 32, 1);

			if (n < 0)
				break;
			for (int i = 0; i < n; i++)
				handle(e, cqe[i].user, cqe[i].res, t);
		}
	}
}

/* --- W fetch pipeline ----------------------------------------------------------- */

static int issue_fetches(struct st_engine *e)
{
	while (e->issued < e->nseq && e->issued - e->consumed <= e->k) {
		int u = e->seq[e->issued], slot = -1, ret;
		struct shard *w = shard(e, u, ST_STATE_W);

		if (u >= e->w_ready)
			return 0; /* its new W is still being written */

		if (w->home == ST_HOME_VRAM) {
			e->issued++;
			continue;
		}
		for (int i = 0; i < e->nslots; i++)
			if (e->slots[i].seq < 0 && e->slots[i].pending == 0 &&
			    (e->eslot < 0 || (i == e->eslot) == (u == 0))) {
				slot = i;
				break;
			}
		if (slot < 0)
			return 0;
		e->slots[slot].seq = e->issued;
		e->slots[slot].ready = false;
		e->slots[slot].len = w->ext.len_bytes;
		if (w->home == ST_HOME_NVME)
			ret = nvme_io(e, ST_IO_READ, &w->ext, haddr(e, &e->slots[slot].stage),
				      w->ext.len_bytes, op_w_nvme(e, slot));
		else
			ret = h2d_slot(e, slot, haddr(e, &w->ext));
		if (ret < 0)
			return ret;
		e->slots[slot].pending = 1;
		e->issued++;
	}
	return 0;
}

/* Wait for the next unit of the sequence to have its W copy queued, then
 * queue the widening of its W into dst, behind that copy on the device
 * (ev_h2d). Its slot is free again once the copy is reaped: the next copy
 * into it waits on the device for the widen (ev_slot). */
static int acquire_w(struct st_engine *e, int u, float *dst)
{
	struct shard *w = shard(e, u, ST_STATE_W);
	int idx = e->consumed, ret, slot = -1;
	const void *src;

	if (e->seq[idx] != u)
		return st_error_set(-EINVAL, "engine: fetch sequence out of order");
	for (;;) {
		ret = issue_fetches(e);
		if (ret < 0)
			return ret;
		if (w->home == ST_HOME_VRAM)
			break;
		for (int i = 0; i < e->nslots; i++)
			if (e->slots[i].seq == idx && e->slots[i].ready)
				slot = i;
		if (slot >= 0)
			break;
		ret = pump(e, true);
		if (ret < 0)
			return ret;
	}
	src = w->home == ST_HOME_VRAM ? vaddr(e, &w->ext) : vaddr(e, &e->slots[slot].ext);
	if (slot >= 0)
		st_compute_wait(e->cx, e->ev_h2d[slot]);
	if (e->Wb == 2)
		st_compute_bf16_to_f32(e->cx, dst, src, e->elems[u]);
	else
		st_compute_copy(e->cx, dst, src, e->elems[u] * sizeof(float));
	if (slot >= 0) {
		st_compute_record(e->cx, e->ev_slot[2 * slot + e->slots[slot].widens % 2]);
		e->slots[slot].widens++;
		e->slots[slot].seq = -1;
	}
	e->consumed++;
	return st_compute_take_error(e->cx);
}

/* --- dW -> G ----------------------------------------------------------------- */

static int wait_until(struct st_engine *e, const int *counter)
{
	while (*counter > 0) {
		int ret = pump(e, true);

		if (ret < 0)
			return ret;
	}
	return 0;
}

static void add_into(float *dst, const float *src, size_t n)
{
#pragma omp parallel for schedule(static)
	for (size_t i = 0; i < n; i++)
		dst[i] += src[i];
}

/* dW of unit u (in vram at src_ext, written by the backward that recorded
 * done) starts for the host landing: the copy waits on the device. */
static int grad_out(struct st_engine *e, int u, const struct st_extent *src_ext,
		    struct st_event *done)
{
	uint64_t bytes = e->elems[u] * sizeof(float);
	struct st_extent part = *src_ext;
	int ret = wait_until(e, &e->land_busy); /* the previous unit's write */

	if (ret < 0)
		return ret;
	part.len_bytes = st_align_up(bytes, st_tier_align(e->tier[ST_HOME_VRAM]));
	ret = d2h(e, &part, e->landing, bytes, op_misc(e, 0), done);
	if (ret < 0)
		return ret;
	e->land_busy = 1;
	return 0;
}

/* Once it has landed, unit u's dW joins G[u]; mb is the micro-batch. */
static int grad_in(struct st_engine *e, int u, int mb)
{
	struct shard *g = shard(e, u, ST_STATE_G);
	uint64_t bytes = e->elems[u] * sizeof(float);
	bool last = mb == e->cfg.train.grad_accum - 1;
	const float *final_g = NULL;
	int ret = wait_until(e, &e->land_busy);

	if (ret < 0)
		return ret;
	if (g->home == ST_HOME_HOST) {
		float *gp = haddr(e, &g->ext);

		if (mb == 0)
			memcpy(gp, e->landing, bytes);
		else
			add_into(gp, e->landing, e->elems[u]);
		final_g = gp;
	} else if (mb == 0) {
		final_g = e->landing;
		if (last && st_grad_sumsq(final_g, ST_OPTIM_F32, e->elems[u], &e->unit_sumsq[u]) < 0)
			e->nonfinite = true;
		final_g = NULL;
		op_misc(e, 1)->idx = 0;
		ret = nvme_io(e, ST_IO_WRITE, &g->ext, e->landing, bytes, op_misc(e, 1));
		if (ret < 0)
			return ret;
		e->land_busy = 1;
	} else {
		ret = wait_until(e, &e->gstage_busy);
		if (ret == 0)
			ret = nvme_io(e, ST_IO_READ, &g->ext, e->gstage, bytes, op_misc(e, 2));
		if (ret < 0)
			return ret;
		e->gstage_busy = 1;
		ret = wait_until(e, &e->gstage_busy);
		if (ret < 0)
			return ret;
		add_into(e->gstage, e->landing, e->elems[u]);
		if (last && st_grad_sumsq(e->gstage, ST_OPTIM_F32, e->elems[u], &e->unit_sumsq[u]) < 0)
			e->nonfinite = true;
		op_misc(e, 1)->idx = 1;
		ret = nvme_io(e, ST_IO_WRITE, &g->ext, e->gstage, bytes, op_misc(e, 1));
		if (ret < 0)
			return ret;
		e->gstage_busy = 1;
	}
	if (last && final_g &&
	    st_grad_sumsq(final_g, ST_OPTIM_F32, e->elems[u], &e->unit_sumsq[u]) < 0)
		e->nonfinite = true;
	return 0;
}

/* --- one micro-batch ------------------------------------------------------------ */

/* Wait for every op queued on the compute, then count its finished spans
 * as the compute lane's busy time (and trace them). Returns the compute's
 * error, or 0. */
static int compute_drain(struct st_engine *e)
{
	int ret = st_compute_sync(e->cx), n;
	struct st_compute_span sp[64];

	while ((n = st_compute_take_spans(e->cx, sp, (int)ST_ARRAY_LEN(sp))) > 0)
		for (int i = 0; i < n; i++) {
			e->lane[ST_LANE_COMPUTE].busy_ns += sp[i].t1_ns - sp[i].t0_ns;
			if (e->cfg.trace)
				st_trace_span(e->cfg.trace, e->trace_lane[ST_LANE_COMPUTE],
					      sp[i].name, sp[i].t0_ns, sp[i].t1_ns, NULL);
		}
	return ret;
}

static float *act(struct st_engine *e, int u)
{
	return e->acts + (size_t)(u - 1) * e->X;
}

static struct st_model_batch batch_of(const struct st_engine *e)
{
	const struct st_train_config *c = &e->cfg.train;

	return (struct st_model_batch){ .B = c->batch, .T = c->seq, .tokens = e->tokens,
					.targets = e->targets,
					.loss_scale = 1.0f / (float)c->grad_accum,
					.host_tokens = e->tok_host, .host_targets = e->tgt_host };
}

/* Draw the next batch and start the W fetch sequence over. w_ready is the
 * number of units (from 0) whose W may be fetched now: all of them, except
 * while the update sweep is still writing the new W (fused forward). */
static int begin_micro_batch(struct st_engine *e, struct st_loader *ld, int w_ready)
{
	size_t bytes = (size_t)e->cfg.train.batch * e->cfg.train.seq * sizeof(int32_t);

	st_loader_next(ld, e->tok_host, e->tgt_host);
	st_compute_from_host(e->cx, e->tokens, e->tok_host, bytes);
	st_compute_from_host(e->cx, e->targets, e->tgt_host, bytes);
	e->issued = e->consumed = 0;
	e->w_ready = w_ready;
	return st_compute_take_error(e->cx);
}

/* Queue the forward of unit u (0 <= u <= U-2); x[u+1] is kept for the
 * backward. */
static int forward_unit(struct st_engine *e, int u)
{
	struct st_model_batch b = batch_of(e);
	float *w = u == 0 ? e->wf_embed : e->wf;
	int ret = acquire_w(e, u, w);

	if (ret < 0)
		return ret;
	st_compute_span_begin(e->cx, u ? "fwd" : "fwd embed");
	ret = st_model_fwd(e->model, u, &b, w, NULL, u ? act(e, u) : NULL, act(e, u + 1), NULL,
			   e->work, e->work_bytes);
	st_compute_span_end(e->cx);
	return ret ? ret : st_compute_take_error(e->cx);
}

/* Backward of every unit for micro-batch mb (its forward is queued). Unit
 * u's dW goes into dW[u & 1]; it is taken in (grad_in) only after the
 * backward of the next unit is queued, so the device computes that one while
 * the host adds u's into G. */
static int backward(struct st_engine *e, int mb, double *loss)
{
	struct st_model_batch b = batch_of(e);
	int H = e->U - 1, ret = 0, pend = -1;
	float l = 0, *dy = e->dA, *dx = e->dB, *tmp;

	/* the head computes its forward and the loss itself */
	st_compute_zero(e->cx, e->dW_embed, e->E0 * sizeof(float));
	for (int u = H; ret == 0 && u >= 1; u--) {
		int i = u & 1;

		ret = acquire_w(e, u, e->wf);
		if (ret < 0)
			return ret;
		/* dW[i] held unit u+2's, in by now (grad_in waited for its copy) */
		st_compute_zero(e->cx, e->dW[i], e->elems[u] * sizeof(float));
		st_compute_span_begin(e->cx, u == H ? "bwd head" : "bwd");
		if (u == H)
			ret = st_model_bwd(e->model, H, &b, e->wf, e->wf_embed, act(e, H), NULL, dy,
					   e->dW[i], e->dW_embed, &l, e->work, e->work_bytes);
		else {
			ret = st_model_bwd(e->model, u, &b, e->wf, NULL, act(e, u), dy, dx, e->dW[i],
					   NULL, NULL, e->work, e->work_bytes);
			tmp = dy;
			dy = dx;
			dx = tmp;
		}
		st_compute_span_end(e->cx);
		st_compute_record(e->cx, e->ev_dw[i]);
		if (ret == 0)
			ret = st_compute_take_error(e->cx);
		if (ret == 0 && pend >= 0)
			ret = grad_in(e, pend, mb);
		if (ret == 0)
			ret = grad_out(e, u, &e->dw_ext[i], e->ev_dw[i]);
		pend = u;
	}
	if (ret < 0)
		return ret;
	st_compute_span_begin(e->cx, "bwd embed");
	ret = st_model_bwd(e->model, 0, &b, e->wf_embed, NULL, NULL, dy, NULL, e->dW_embed, NULL,
			   NULL, e->work, e->work_bytes);
	st_compute_span_end(e->cx);
	st_compute_record(e->cx, e->ev_dwe);
	if (ret == 0)
		ret = st_compute_take_error(e->cx);
	if (ret == 0 && pend >= 0)
		ret = grad_in(e, pend, mb);
	if (ret == 0)
		ret = grad_out(e, 0, &e->dwe_ext, e->ev_dwe);
	if (ret == 0)
		ret = grad_in(e, 0, mb);
	*loss = l;
	return ret;
}

/* --- the update sweep ----------------------------------------------------------- */

/* The update sweep goes tile by tile: [t0, t0 + n) elements of unit u,
 * t0 and n multiples of ST_UPDATE_TILE_ALIGN_ELEMS (whole pages in bf16 and
 * fp32) except where the unit ends, so staging is bounded by the tile, not
 * by the largest unit (the embedding of a 50k vocabulary). */
struct tile {
	int u;
	uint64_t t0, n;
};

static float *upd_ptr(struct st_engine *e, int set, const struct tile *t, enum st_state s)
{
	struct shard *x = shard(e, t->u, s);

	if (x->home == ST_HOME_HOST)
		return (float *)haddr(e, &x->ext) + t->t0;
	return haddr(e, &e->upd[set].ext[s]);
}

static int upd_load(struct st_engine *e, int set, const struct tile *t)
{
	struct updset *us = &e->upd[set];
	int ret = wait_until(e, &us->writes);

	if (ret < 0)
		return ret;
	for (enum st_state s = ST_STATE_G; s <= ST_STATE_V; s++) {
		struct shard *x = shard(e, t->u, s);

		if (x->home != ST_HOME_NVME)
			continue;
		op_upd(e, set, 0, s)->idx = set;
		ret = nvme_io_at(e, ST_IO_READ, &x->ext, t->t0 * 4, haddr(e, &us->ext[s]),
				 t->n * 4, op_upd(e, set, 0, s));
		if (ret < 0)
			return ret;
		us->reads++;
	}
	return 0;
}

static int upd_store(struct st_engine *e, int set, const struct tile *t)
{
	struct updset *us = &e->upd[set];
	struct shard *w = shard(e, t->u, ST_STATE_W);
	uint64_t woff = t->t0 * (uint64_t)e->Wb, wlen = t->n * (uint64_t)e->Wb;
	int ret;

	for (enum st_state s = ST_STATE_P; s <= ST_STATE_V; s++) {
		struct shard *x = shard(e, t->u, s);

		if (x->home != ST_HOME_NVME)
			continue;
		op_upd(e, set, 1, s)->idx = set;
		ret = nvme_io_at(e, ST_IO_WRITE, &x->ext, t->t0 * 4, haddr(e, &us->ext[s]),
				 t->n * 4, op_upd(e, set, 1, s));
		if (ret < 0)
			return ret;
		us->writes++;
	}
	op_upd(e, set, 1, ST_STATE_W)->idx = set;
	if (w->home == ST_HOME_NVME)
		ret = nvme_io_at(e, ST_IO_WRITE, &w->ext, woff, haddr(e, &us->ext[ST_STATE_W]),
				 wlen, op_upd(e, set, 1, ST_STATE_W));
	else if (w->home == ST_HOME_VRAM)
		ret = h2d_at(e, &w->ext, woff, haddr(e, &us->ext[ST_STATE_W]), wlen,
			     op_upd(e, set, 1, ST_STATE_W));
	else
		return 0;
	if (ret < 0)
		return ret;
	us->writes++;
	return 0;
}

/* AdamW over one tile: each tensor's part of it, with or without weight
 * decay; W's padding in the tile zeroed when W goes through staging (the
 * buffer served other tiles), so W's home holds the same bytes whatever the
 * placement. */
static int adam_tile(struct st_engine *e, int set, const struct tile *t,
		     const struct st_adam_step *wd, const struct st_adam_step *nowd)
{
	const struct st_unit_layout *ul = st_model_unit_layout(e->model, t->u);
	float *g = upd_ptr(e, set, t, ST_STATE_G), *p = upd_ptr(e, set, t, ST_STATE_P);
	float *m = upd_ptr(e, set, t, ST_STATE_M), *v = upd_ptr(e, set, t, ST_STATE_V);
	struct shard *w = shard(e, t->u, ST_STATE_W);
	char *wout = w->home == ST_HOME_HOST
			     ? (char *)haddr(e, &w->ext) + t->t0 * (uint64_t)e->Wb
			     : haddr(e, &e->upd[set].ext[ST_STATE_W]);
	uint64_t t1 = t->t0 + t->n, t0 = st_now_ns();
	int ret = 0;

	lane_begin(e, ST_LANE_ADAM);
	if (w->home != ST_HOME_HOST) {
		uint64_t end = t->t0;

		for (int i = 0; i <= ul->n_tensors; i++) {
			uint64_t start = i < ul->n_tensors ? ul->tensors[i].offset_elems : ul->elems;

			start = ST_MIN(ST_MAX(start, t->t0), t1);
			if (start > end)
				memset(wout + (end - t->t0) * (size_t)e->Wb, 0,
				       (start - end) * (size_t)e->Wb);
			if (i < ul->n_tensors)
				end = ST_MIN(ST_MAX(ul->tensors[i].offset_elems + ul->tensors[i].n_elems,
						    t->t0), t1);
		}
	}
	for (int i = 0; i < ul->n_tensors && ret == 0; i++) {
		const struct st_tensor_layout *tl = &ul->tensors[i];
		uint64_t a = ST_MAX(tl->offset_elems, t->t0);
		uint64_t b = ST_MIN(tl->offset_elems + tl->n_elems, t1);
		size_t o;
		struct st_adam_bufs bufs;

		if (a >= b)
			continue;
		o = a - t->t0;
		bufs = (struct st_adam_bufs){
			.g = g + o, .g_dtype = ST_OPTIM_F32, .p = p + o, .m = m + o, .v = v + o,
			.w = wout + o * (size_t)e->Wb,
			.w_dtype = e->Wb == 2 ? ST_OPTIM_BF16 : ST_OPTIM_F32,
		};
		ret = st_adam_apply(tl->decay ? wd : nowd, &bufs, b - a, ST_ADAM_GRAD_CHECKED, NULL);
	}
	lane_end(e, ST_LANE_ADAM, t0, 0, "adam");
	return ret;
}

static bool next_tile(const struct st_engine *e, struct tile *t)
{
	if (t->u >= 0 && t->t0 + t->n < e->elems[t->u]) {
		t->t0 += t->n;
	} else {
		if (++t->u >= e->U)
			return false;
		t->t0 = 0;
	}
	t->n = ST_MIN(e->tile, e->elems[t->u] - t->t0);
	return true;
}

/* The update sweep, tile by tile in unit order. With ld, it is fused with
 * the next step's first forward: once unit u's new W is home, fwd(u) runs
 * while the next tiles load and u's P, M, V go back -- the next step's
 * forward of u waits only on update(u). */
static int update_sweep(struct st_engine *e, const struct st_adam_step *wd,
			const struct st_adam_step *nowd, struct st_loader *ld)
{
	struct tile cur = { .u = -1 }, nxt;
	int set = 0, ret = 0;
	bool have = next_tile(e, &cur);

	if (ld)
		ret = begin_micro_batch(e, ld, 0);
	if (have && ret == 0)
		ret = upd_load(e, 0, &cur);
	while (have && ret == 0) {
		nxt = cur;
		have = next_tile(e, &nxt);
		if (have)
			ret = upd_load(e, set ^ 1, &nxt); /* overlaps this tile's Adam */
		if (ret == 0)
			ret = wait_until(e, &e->upd[set].reads);
		if (ret == 0)
			ret = adam_tile(e, set, &cur, wd, nowd);
		if (ret == 0)
			ret = upd_store(e, set, &cur);
		if (ret == 0 && ld && (!have || nxt.u != cur.u)) {
			/* unit cur.u is done once its stores land */
			ret = wait_until(e, &e->upd[set].writes);
			if (ret == 0)
				ret = wait_until(e, &e->upd[set ^ 1].writes);
			e->w_ready = cur.u + 1;
			if (ret == 0 && cur.u <= e->U - 2)
				ret = forward_unit(e, cur.u);
		}
		cur = nxt;
		set ^= 1;
	}
	for (int s = 0; ret == 0 && s < 2; s++)
		ret = wait_until(e, &e->upd[s].writes);
	if (ret == 0 && ld)
		e->fwd_ready = true;
	return ret;
}

/* --- the step --------------------------------------------------------------------- */

static void stats_begin(struct st_engine *e)
{
	for (int l = 0; l < ST_LANE_COUNT; l++) {
		e->lane[l].busy_ns = 0;
		e->lane[l].bytes = 0;
	}
}

int st_engine_step(struct st_engine *e, struct st_loader *ld, int step,
		   bool next_follows, struct st_step_result *res)
{
	const struct st_train_config *c = &e->cfg.train;
	struct st_adam_step with_wd, without_wd;
	double loss_sum = 0, sumsq = 0;
	uint64_t t0 = st_now_ns();
	int ret = 0;

	memset(res, 0, sizeof(*res));
	if (e->err)
		return st_error_set(e->err, "%s", e->errmsg);
	stats_begin(e);
	e->nonfinite = false;
	for (int a = 0; a < c->grad_accum && ret == 0; a++) {
		double l = 0;

		if (a > 0 || !e->fwd_ready) {
			ret = begin_micro_batch(e, ld, e->U);
			for (int u = 0; ret == 0 && u <= e->U - 2; u++)
				ret = forward_unit(e, u);
		}
		e->fwd_ready = false;
		e->w_ready = e->U;
		if (ret == 0)
			ret = backward(e, a, &l);
		loss_sum += l;
	}
	e->end_cur = ld->cur; /* before update_sweep() draws the next batch */
	if (ret == 0)
		ret = wait_until(e, &e->land_busy);
	if (ret == 0)
		ret = wait_until(e, &e->gstage_busy);
	if (ret < 0)
		goto fail;
	res->loss = loss_sum / c->grad_accum;
	res->lr = st_lr_at(c, step);
	for (int u = 0; u < e->U; u++)
		sumsq += e->unit_sumsq[u];
	if (e->nonfinite || !isfinite(sumsq)) {
		res->grad_norm = NAN;
		res->skipped = true;
		goto done;
	}
	res->grad_norm = sqrt(sumsq);
	ret = st_train_adam_prep(c, step, res->grad_norm, &with_wd, &without_wd);
	if (ret == 0)
		ret = update_sweep(e, &with_wd, &without_wd, next_follows ? ld : NULL);
	if (ret < 0)
		goto fail;
done:
	/* the fused forward may still be computing */
	ret = compute_drain(e);
	if (ret < 0)
		goto fail;
	e->last.step_ns = st_now_ns() - t0;
	for (int l = 0; l < ST_LANE_COUNT; l++) {
		e->last.busy_ns[l] = e->lane[l].busy_ns;
		e->last.bytes[l] = e->lane[l].bytes;
	}
	return 0;
fail:
	drain(e);
	if (!e->err)
		e->err = ret;
	if (!e->errmsg[0])
		snprintf(e->errmsg, sizeof(e->errmsg), "%s", st_error_last());
	return st_error_set(e->err, "%s", e->errmsg);
}

/* --- create / destroy --------------------------------------------------------------- */

static int alloc_in(struct st_engine *e, enum st_home h, uint64_t bytes, struct st_extent *x)
{
	int ret = st_tier_alloc(e->tier[h], bytes, x);

	if (ret < 0)
		return st_error_set(ret, "engine: the plan's %s pools do not fit: %s",
				    st_home_name(h), st_error_last());
	return 0;
}

void st_engine_destroy(struct st_engine *e)
{
	if (!e)
		return;
	if (e->tier[ST_HOME_VRAM])
		drain(e);
	else if (e->cx)
		st_compute_sync(e->cx);
	/* the events before the compute's queue they are recorded on */
	for (int i = 0; e->ev_slot && i < 2 * e->nslots; i++)
		if (e->ev_slot[i])
			st_event_destroy(e->dev, e->ev_slot[i]);
	for (int i = 0; e->ev_h2d && i < e->nslots; i++)
		if (e->ev_h2d[i])
			st_event_destroy(e->dev, e->ev_h2d[i]);
	free(e->ev_h2d);
	for (int i = 0; i < 2; i++)
		if (e->ev_dw[i])
			st_event_destroy(e->dev, e->ev_dw[i]);
	if (e->ev_dwe)
		st_event_destroy(e->dev, e->ev_dwe);
	free(e->ev_slot);
	for (int h = ST_HOME_NVME; h >= ST_HOME_VRAM; h--)
		st_tier_destroy(e->tier[h]);
	st_compute_destroy(e->cx);
	st_device_destroy(e->dev);
	st_plan_fini(&e->plan);
	st_model_destroy(e->model);
	free(e->sh);
	free(e->slots);
	free(e->seq);
	free(e->ops);
	free(e->elems);
	free(e->unit_sumsq);
	free(e->tok_host);
	free(e->tgt_host);
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
	return &e->end_cur;
}

const char *st_engine_io_error(const struct st_engine *e)
{
	return e->errmsg;
}

static int open_tiers(struct st_engine *e)
{
	struct st_device_config dc = { .mem_bytes = e->plan.total_bytes[ST_HOME_VRAM] };
	struct st_tier_config vc = { .budget_bytes = e->plan.total_bytes[ST_HOME_VRAM] };
	struct st_tier_config hc = { .budget_bytes = e->plan.total_bytes[ST_HOME_HOST] };
	int ret;

	const char *dev_name = e->cfg.device ? e->cfg.device : "cpu";
	const struct st_device_ops *dops = st_device_find(dev_name);

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
	vc.device = e->dev;
	hc.device = e->dev;
	ret = st_tier_create(&st_tier_vram_ops, &vc, &e->tier[ST_HOME_VRAM]);
	if (ret == 0)
		ret = st_tier_create(&st_tier_host_ops, &hc, &e->tier[ST_HOME_HOST]);
	if (ret == 0 && e->plan.total_bytes[ST_HOME_NVME]) {
		struct st_tier_config nc = {
			.budget_bytes = e->plan.total_bytes[ST_HOME_NVME],
			.dirs = e->cfg.nvme_dirs, .block_bytes = e->cfg.aio_block_bytes,
			.queue_depth = e->cfg.aio_depth, .fault = e->cfg.nvme_fault,
		};

		ret = st_tier_create(&st_tier_nvme_ops, &nc, &e->tier[ST_HOME_NVME]);
	}
	return ret;
}

static int alloc_pools(struct st_engine *e)
{
	const struct st_plan *p = &e->plan;
	const struct st_train_config *c = &e->cfg.train;
	uint64_t Ebytes = e->E * 4;
	int ret = 0;

	/* homes */
	for (int u = 0; u < e->U && ret == 0; u++)
		for (enum st_state s = 0; s < ST_STATE_COUNT && ret == 0; s++) {
			struct shard *x = shard(e, u, s);

			x->home = st_plan_home(p, u, s);
			ret = alloc_in(e, x->home, e->elems[u] * (s == ST_STATE_W ? e->Wb : 4),
				       &x->ext);
		}
	/* vram: W slots (the last the embedding's, with embed_slot), activations,
	 * scratch */
	e->slots = calloc((size_t)e->nslots + 1, sizeof(*e->slots));
	e->ev_slot = calloc(2 * (size_t)e->nslots + 1, sizeof(*e->ev_slot));
	e->ev_h2d = calloc((size_t)e->nslots + 1, sizeof(*e->ev_h2d));
	if (!e->slots || !e->ev_slot || !e->ev_h2d)
		return -ENOMEM;
	for (int i = 0; i < e->nslots && ret == 0; i++) {
		ret = st_event_create(e->dev, &e->ev_slot[2 * i]);
		if (ret == 0)
			ret = st_event_create(e->dev, &e->ev_slot[2 * i + 1]);
		if (ret == 0)
			ret = st_event_create(e->dev, &e->ev_h2d[i]);
	}
	for (int i = 0; i < 2 && ret == 0; i++)
		ret = st_event_create(e->dev, &e->ev_dw[i]);
	if (ret == 0)
		ret = st_event_create(e->dev, &e->ev_dwe);
	for (int i = 0; i < e->nslots && ret == 0; i++) {
		uint64_t bytes = i == e->eslot ? p->embed_slot_bytes : p->w_slot_bytes;

		e->slots[i].seq = -1;
		ret = alloc_in(e, ST_HOME_VRAM, bytes, &e->slots[i].ext);
		if (ret == 0 && p->w_staging_bytes)
			ret = alloc_in(e, ST_HOME_HOST, bytes, &e->slots[i].stage);
	}
	if (ret == 0 && e->U > 1)
		ret = alloc_in(e, ST_HOME_VRAM, (uint64_t)(e->U - 1) * e->X * 4, &e->act_ext);
	if (ret == 0)
		ret = alloc_in(e, ST_HOME_VRAM, e->E1 * 4, &e->wf_ext);
	if (ret == 0)
		ret = alloc_in(e, ST_HOME_VRAM, e->E0 * 4, &e->wfe_ext);
	if (ret == 0)
		ret = alloc_in(e, ST_HOME_VRAM, e->E1 * 4, &e->dw_ext[0]);
	if (ret == 0)
		ret = alloc_in(e, ST_HOME_VRAM, e->E1 * 4, &e->dw_ext[1]);
	if (ret == 0)
		ret = alloc_in(e, ST_HOME_VRAM, e->E0 * 4, &e->dwe_ext);
	if (ret == 0)
		ret = alloc_in(e, ST_HOME_VRAM, e->X * 4, &e->da_ext);
	if (ret == 0)
		ret = alloc_in(e, ST_HOME_VRAM, e->X * 4, &e->db_ext);
	if (ret == 0)
		ret = alloc_in(e, ST_HOME_VRAM, e->work_bytes ? e->work_bytes : 1, &e->work_ext);
	if (ret == 0)
		ret = alloc_in(e, ST_HOME_VRAM, (uint64_t)c->batch * c->seq * 4, &e->tok_ext);
	if (ret == 0)
		ret = alloc_in(e, ST_HOME_VRAM, (uint64_t)c->batch * c->seq * 4, &e->tgt_ext);
	/* host: gradient landing and staging, update staging */
	if (ret == 0)
		ret = alloc_in(e, ST_HOME_HOST, Ebytes, &e->land_ext);
	if (ret == 0 && p->grad_landing_bytes > Ebytes)
		ret = alloc_in(e, ST_HOME_HOST, Ebytes, &e->gstage_ext);
	for (int set = 0; set < 2 && ret == 0 && p->update_staging_bytes; set++)
		for (enum st_state s = 0; s < ST_STATE_COUNT && ret == 0; s++)
			ret = alloc_in(e, ST_HOME_HOST, e->tile * (s == ST_STATE_W ? e->Wb : 4),
				       &e->upd[set].ext[s]);
	if (ret < 0)
		return ret;
	e->acts = e->U > 1 ? vaddr(e, &e->act_ext) : NULL;
	e->wf = vaddr(e, &e->wf_ext);
	e->wf_embed = vaddr(e, &e->wfe_ext);
	e->dW[0] = vaddr(e, &e->dw_ext[0]);
	e->dW[1] = vaddr(e, &e->dw_ext[1]);
	e->dW_embed = vaddr(e, &e->dwe_ext);
	e->dA = vaddr(e, &e->da_ext);
	e->dB = vaddr(e, &e->db_ext);
	e->work = vaddr(e, &e->work_ext);
	e->tokens = vaddr(e, &e->tok_ext);
	e->targets = vaddr(e, &e->tgt_ext);
	e->landing = haddr(e, &e->land_ext);
	e->gstage = e->gstage_ext.len_bytes ? haddr(e, &e->gstage_ext) : NULL;
	/* Every host pool is nvme I/O memory: register it (fixed buffers). */
	if (e->tier[ST_HOME_NVME]) {
		struct st_extent all = { 0, e->plan.total_bytes[ST_HOME_HOST] };
		struct st_tier_buffer b = { haddr(e, &all), st_align_up(all.len_bytes, 4096) };

		ret = st_tier_register_buffers(e->tier[ST_HOME_NVME], &b, 1);
	}
	return ret;
}

int st_engine_create(const struct st_engine_config *cfg, struct st_engine **out)
{
	const struct st_train_config *c = &cfg->train;
	struct st_plan_input pin;
	struct st_engine *e;
	int ret;

	*out = NULL;
	if (c->batch <= 0 || c->seq <= 0 || c->grad_accum <= 0)
		return st_error_set(-EINVAL, "batch, seq and grad-accum must be positive");
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->cfg = *cfg;
	ret = st_model_create(&c->model, &e->model);
	if (ret < 0) {
		free(e);
		return ret;
	}
	if (c->seq > c->model.ctx) {
		st_engine_destroy(e);
		return st_error_set(-EINVAL, "--seq %d is longer than the model's context of %d",
				    c->seq, c->model.ctx);
	}
	pin = (struct st_plan_input){
		.model = e->model, .batch = c->batch, .seq = c->seq, .grad_accum = c->grad_accum,
		.bf16 = c->bf16, .gpu_mem_bytes = cfg->gpu_mem_bytes,
		.host_mem_bytes = cfg->host_mem_bytes, .nvme_mem_bytes = cfg->nvme_mem_bytes,
		.have_nvme = cfg->nvme_dirs != NULL, .params = cfg->params, .optim = cfg->optim,
		.prefetch = cfg->prefetch, .rates = cfg->rates,
	};
	if (cfg->device && strcmp(cfg->device, "cuda") == 0) {
		if (pin.rates.compute_flops <= 0)
			pin.rates.compute_flops = ST_PLAN_CUDA_COMPUTE_FLOPS;
		if (pin.rates.copy_bps <= 0)
			pin.rates.copy_bps = ST_PLAN_CUDA_COPY_BPS;
	}
	ret = st_plan_make(&pin, &e->plan);
	if (ret < 0) {
		st_model_destroy(e->model);
		free(e);
		return ret;
	}
	e->U = st_model_unit_count(e->model);
	e->k = e->plan.prefetch;
	e->Wb = c->bf16 ? 2 : 4;
	e->X = (size_t)c->batch * c->seq * c->model.dim;
	e->elems = calloc((size_t)e->U, sizeof(*e->elems));
	e->sh = calloc((size_t)e->U * ST_STATE_COUNT, sizeof(*e->sh));
	e->unit_sumsq = calloc((size_t)e->U, sizeof(double));
	e->nseq = 2 * e->U - 2;
	e->seq = calloc((size_t)e->nseq, sizeof(int));
	e->tok_host = calloc((size_t)c->batch * c->seq, sizeof(int32_t));
	e->tgt_host = calloc((size_t)c->batch * c->seq, sizeof(int32_t));
	if (!e->elems || !e->sh || !e->unit_sumsq || !e->seq || !e->tok_host || !e->tgt_host) {
		st_engine_destroy(e);
		return -ENOMEM;
	}
	for (int u = 0; u < e->U; u++) {
		e->elems[u] = st_model_unit_layout(e->model, u)->elems;
		e->E = ST_MAX(e->E, e->elems[u]);
		if (u > 0)
			e->E1 = ST_MAX(e->E1, e->elems[u]);
		e->work_bytes = ST_MAX(e->work_bytes, st_model_work_bytes(e->model, u, c->batch, c->seq));
	}
	e->E0 = e->elems[0];
	e->w_ready = e->U;
	e->tile = ST_MIN(e->E, ST_UPDATE_TILE_ELEMS);
	if (cfg->update_tile_elems && cfg->update_tile_elems % 2048 == 0)
		e->tile = ST_MIN(e->tile, cfg->update_tile_elems);
	for (int u = 0; u <= e->U - 2; u++)
		e->seq[u] = u;              /* forward: embed, blocks */
	for (int i = 0; i < e->U - 1; i++)
		e->seq[e->U - 1 + i] = e->U - 1 - i; /* backward: head, blocks */
	e->nslots = (int)e->plan.w_slots + (e->plan.embed_slot ? 1 : 0);
	e->eslot = e->plan.embed_slot ? (int)e->plan.w_slots : -1;
	ret = open_tiers(e);
	if (ret == 0) {
		e->nops = 2 * e->nslots + 3 + 4 * ST_STATE_COUNT;
		e->ops = calloc((size_t)e->nops, sizeof(*e->ops));
		if (!e->ops)
			ret = -ENOMEM;
	}
	if (ret == 0) {
		for (int i = 0; i < e->nslots; i++) {
			op_w_nvme(e, i)->kind = OP_W_NVME;
			op_w_nvme(e, i)->idx = i;
			op_w_h2d(e, i)->kind = OP_W_H2D;
			op_w_h2d(e, i)->idx = i;
		}
		op_misc(e, 0)->kind = OP_D2H;
		op_misc(e, 1)->kind = OP_G_WRITE;
		op_misc(e, 2)->kind = OP_G_READ;
		for (int set = 0; set < 2; set++)
			for (enum st_state s = 0; s < ST_STATE_COUNT; s++) {
				op_upd(e, set, 0, s)->kind = OP_UPD_READ;
				op_upd(e, set, 1, s)->kind = OP_UPD_WRITE;
			}
		ret = alloc_pools(e);
	}
	if (ret == 0 && cfg->trace)
		for (int l = 0; l < ST_LANE_COUNT; l++)
			e->trace_lane[l] = st_trace_lane(cfg->trace, lane_names[l]);
	/* Initialise: P from the seed, W = round(P), M = V = 0. */
	if (ret == 0) {
		float *p = NULL;

		if (posix_memalign((void **)&p, ST_PAGE_BYTES, e->E * sizeof(float)))
			ret = -ENOMEM;
		for (int u = 0; ret == 0 && u < e->U; u++) {
			ret = st_model_init_unit(e->model, u, c->seed, p);
			if (ret == 0)
				ret = st_engine_write_state(e, u, p, NULL, NULL);
		}
		free(p);
	}
	if (ret < 0) {
		st_engine_destroy(e);
		return ret;
	}
	*out = e;
	return 0;
}

/* --- state access (between steps) ------------------------------------------------ */

static int shard_read(struct st_engine *e, struct shard *x, void *buf)
{
	if (x->home == ST_HOME_HOST) {
		memcpy(buf, haddr(e, &x->ext), x->ext.len_bytes);
		return 0;
	}
	return st_tier_read_sync(e->tier[x->home], &x->ext, 0, buf, x->ext.len_bytes);
}

static int shard_write(struct st_engine *e, struct shard *x, const void *buf)
{
	if (x->home == ST_HOME_HOST) {
		memcpy(haddr(e, &x->ext), buf, x->ext.len_bytes);
		return 0;
	}
	return st_tier_write_sync(e->tier[x->home], &x->ext, 0, buf, x->ext.len_bytes);
}

int st_engine_read_state(struct st_engine *e, int u, enum st_state s, float *dst)
{
	struct shard *x = shard(e, u, s);
	void *tmp = NULL;
	int ret;

	if (u < 0 || u >= e->U)
		return -EINVAL;
	drain(e);
	if (posix_memalign(&tmp, ST_PAGE_BYTES, x->ext.len_bytes))
		return -ENOMEM;
	ret = shard_read(e, x, tmp);
	if (ret == 0) {
		if (s == ST_STATE_W && e->Wb == 2)
			st_cpu_bf16_to_f32(dst, tmp, e->elems[u]);
		else
			memcpy(dst, tmp, e->elems[u] * sizeof(float));
	}
	free(tmp);
	return ret;
}

int st_engine_write_state(struct st_engine *e, int u, const float *p, const float *m,
			  const float *v)
{
	void *buf = NULL;
	uint64_t bytes = e->elems[u] * sizeof(float);
	int ret;

	if (u < 0 || u >= e->U || !p)
		return -EINVAL;
	drain(e);
	if (posix_memalign(&buf, ST_PAGE_BYTES, bytes))
		return -ENOMEM;
	memcpy(buf, p, bytes);
	ret = shard_write(e, shard(e, u, ST_STATE_P), buf);
	for (enum st_state s = ST_STATE_M; ret == 0 && s <= ST_STATE_V; s++) {
		const float *src = s == ST_STATE_M ? m : v;

		if (src)
			memcpy(buf, src, bytes);
		else
			memset(buf, 0, bytes);
		ret = shard_write(e, shard(e, u, s), buf);
	}
	if (ret == 0) {
		if (e->Wb == 2)
			st_cpu_f32_to_bf16(buf, p, e->elems[u]);
		else
			memcpy(buf, p, bytes);
		ret = shard_write(e, shard(e, u, ST_STATE_W), buf);
	}
	free(buf);
	return ret;
}

void st_engine_get_stats(const struct st_engine *e, struct st_engine_stats *s)
{
	*s = e->last;
	for (int h = 0; h < ST_HOME_COUNT; h++) {
		struct st_tier_stats ts;

		s->has_tier[h] = e->tier[h] != NULL;
		if (!e->tier[h])
			continue;
		st_tier_get_stats(e->tier[h], &ts);
		s->used_bytes[h] = ts.used_bytes;
		s->peak_bytes[h] = ts.peak_bytes;
		s->budget_bytes[h] = h == ST_HOME_VRAM ? e->cfg.gpu_mem_bytes
				   : h == ST_HOME_HOST ? e->cfg.host_mem_bytes
				   : e->cfg.nvme_mem_bytes ? e->cfg.nvme_mem_bytes
							   : e->plan.total_bytes[h];
	}
}
