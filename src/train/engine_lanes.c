/* The engine's lanes and transfer chains.
 *
 * A lane is a queue whose busy time and bytes the step reports: compute,
 * h2d, d2h, nvme read, nvme write, cpu adam. A transfer is a chain of hops
 * (strata/engine_internal.h): each hop is one request to a tier (the nvme
 * tier's io_uring, or the vram tier's copy queues), the next submitted when
 * the one before completes. pump() reaps both tiers' completions and moves
 * each chain on; every wait of the pipelines is a pump loop, so transfers
 * for the next units proceed while a unit computes. */
#include "engine_internal.h"
#include "strata/trace.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

void st_eng_lane_begin(struct st_engine *e, enum st_lane l)
{
	if (e->lanes.busy[l].inflight++ == 0)
		e->lanes.busy[l].since_ns = st_now_ns();
}

/* A transfer lane's trace shows its busy intervals (from the first request
 * in flight to the last one out), which never overlap on one track, with the
 * number of requests in each; compute and Adam show each call. */
void st_eng_lane_end(struct st_engine *e, enum st_lane l, uint64_t t0, uint64_t bytes,
		     const char *name)
{
	struct lane_busy *lb = &e->lanes.busy[l];
	uint64_t now = st_now_ns();

	lb->bytes += bytes;
	lb->requests++;
	if (--lb->inflight)
		return;
	lb->busy_ns += now - lb->since_ns;
	if (e->cfg.trace) {
		char args[64];

		if (l == ST_LANE_ADAM) {
			st_trace_span(e->cfg.trace, e->trace.lane[l], name, t0, now, NULL);
		} else {
			snprintf(args, sizeof(args), "{\"requests\":%llu}",
				 (unsigned long long)lb->requests);
			st_trace_span(e->cfg.trace, e->trace.lane[l], "busy", lb->since_ns, now,
				      args);
		}
	}
	lb->requests = 0;
}

static enum st_lane hop_lane(const struct hop *h)
{
	if (h->tier == ST_HOME_VRAM)
		return h->rw == ST_IO_WRITE ? ST_LANE_H2D : ST_LANE_D2H;
	return h->rw == ST_IO_READ ? ST_LANE_NVME_READ : ST_LANE_NVME_WRITE;
}

struct hop st_eng_hop(const char *name, enum st_home tier, enum st_io_op rw,
		      const struct st_extent *ext, uint64_t off_bytes, void *buf,
		      uint64_t len_bytes)
{
	return (struct hop){ .name = name, .tier = tier, .rw = rw, .ext = *ext,
			     .off_bytes = off_bytes, .buf = buf, .len_bytes = len_bytes,
			     .unit = -1 };
}

struct hop st_eng_shard_hop(struct st_engine *e, const char *name, int u, enum st_state s,
			    enum st_io_op rw, uint64_t off_bytes, void *buf, uint64_t len_bytes)
{
	struct shard *x = shard(e, u, s);
	struct hop h = st_eng_hop(name, x->home, rw, &x->ext, off_bytes, buf, len_bytes);

	h.unit = u;
	h.state = s;
	return h;
}

static void record_error(struct st_engine *e, int ret, const char *msg)
{
	if (!e->err) {
		e->err = ret;
		snprintf(e->errmsg, sizeof(e->errmsg), "%s", msg);
	}
}

/* Submit the chain's hop c->at. */
static int hop_submit(struct st_engine *e, struct chain *c)
{
	const struct hop *h = &c->hop[c->at];
	enum st_lane lane = hop_lane(h);
	struct st_tier_io r = { .op = h->rw, .ext = h->ext, .ext_off_bytes = h->off_bytes,
				.len_bytes = h->len_bytes, .buf = h->buf, .user = c,
				.after = h->after, .done = h->done };
	int ret;

	/* a shard's owner sees its bytes as they leave (the nvme sums) */
	if (h->rw == ST_IO_WRITE && h->unit >= 0 && e->lanes.hop_out)
		e->lanes.hop_out(e, h);
	/* A copy waiting for the compute is not moving bytes yet: its lane is
	 * busy from when the wait is seen over (see_waits()). */
	c->t0_ns = st_now_ns();
	c->waits = h->after;
	if (h->after && st_event_query(e->dev, h->after) == 1)
		c->waits = NULL;
	if (!c->waits)
		st_eng_lane_begin(e, lane);
	else
		e->lanes.n_waiting++;
	c->vram_seq = h->tier == ST_HOME_VRAM ? ++e->lanes.vram_submits : 0;
	ret = st_tier_submit(e->tier[h->tier], &r, 1);
	if (ret < 0) {
		if (c->waits) {
			c->waits = NULL;
			e->lanes.n_waiting--;
			st_eng_lane_begin(e, lane);
		}
		c->vram_seq = 0;
		st_eng_lane_end(e, lane, c->t0_ns, 0, "failed");
		record_error(e, ret, st_error_last());
		return ret;
	}
	/* A step's bytes are those it queued, so a store that lands during
	 * the next step (the update's last P, M, V) counts in its own. */
	e->lanes.busy[lane].bytes += h->len_bytes;
	if (c->at == c->nhops - 1 && c->queued)
		*c->queued = true;
	return 0;
}

int st_eng_chain_start(struct st_engine *e, struct chain *c, const struct hop *hops,
		       int nhops, int *busy, bool *queued)
{
	int ret;

	assert(nhops >= 1 && nhops <= ST_CHAIN_MAX_HOPS);
	memcpy(c->hop, hops, sizeof(*hops) * (size_t)nhops);
	c->nhops = nhops;
	c->at = 0;
	c->busy = busy;
	c->queued = queued;
	ret = hop_submit(e, c);
	if (ret == 0)
		(*busy)++;
	return ret;
}

/* Hop c->at completed with res (bytes or -errno) on tier t. */
static void hop_done(struct st_engine *e, struct chain *c, int64_t res, struct st_tier *t)
{
	const struct hop *h = &c->hop[c->at];
	enum st_lane lane = hop_lane(h);
	const char *msg = res < 0 ? st_tier_error(t) : NULL;

	c->vram_seq = 0;
	if (c->waits) { /* done before its wait was seen over: no busy time */
		c->waits = NULL;
		e->lanes.n_waiting--;
		c->t0_ns = st_now_ns();
		st_eng_lane_begin(e, lane);
	}
	st_eng_lane_end(e, lane, c->t0_ns, 0, h->name);
	/* a shard's owner sees what came back before anything uses it (the
	 * nvme sums check it) */
	if (res >= 0 && h->rw == ST_IO_READ && h->unit >= 0 && e->lanes.hop_in) {
		int ret = e->lanes.hop_in(e, h);

		if (ret < 0) {
			res = ret;
			msg = st_error_last();
		}
	}
	if (res < 0) /* the pipelines stop here; the step reports the error */
		record_error(e, (int)res, msg);
	else if (++c->at < c->nhops && hop_submit(e, c) == 0)
		return;
	(*c->busy)--;
}

/* Chains waiting for a compute event: start their lane's busy time once
 * the event is seen done. */
static void see_waits(struct st_engine *e)
{
	for (int i = 0; i < e->lanes.n_chains && e->lanes.n_waiting; i++) {
		struct chain *c = e->lanes.chains[i];

		if (!c->waits || st_event_query(e->dev, c->waits) != 1)
			continue;
		c->waits = NULL;
		e->lanes.n_waiting--;
		c->t0_ns = st_now_ns();
		st_eng_lane_begin(e, hop_lane(&c->hop[c->at]));
	}
}

/* The engine's oldest copy in flight on the vram tier, or NULL. */
static struct chain *oldest_vram(struct st_engine *e)
{
	struct chain *old = NULL;

	for (int i = 0; i < e->lanes.n_chains; i++) {
		struct chain *c = e->lanes.chains[i];

		if (c->vram_seq && (!old || c->vram_seq < old->vram_seq))
			old = c;
	}
	return old;
}

static int reap(struct st_engine *e, struct st_tier *t, int block)
{
	struct st_tier_cqe cqe[32];
	int n = st_tier_reap(t, cqe, 32, block);

	for (int i = 0; i < n; i++)
		hop_done(e, cqe[i].user, cqe[i].res, t);
	return n;
}

/* Reap what has completed; with block, wait for at least one completion
 * when nothing had. Returns the engine's first I/O error, or 0. */
int st_eng_pump(struct st_engine *e, bool block)
{
	int progressed = 0;

	if (e->lanes.n_waiting)
		see_waits(e);

	for (int h = ST_HOME_VRAM; h <= ST_HOME_NVME; h += 2) {
		struct st_tier *t = e->tier[h];
		int n;

		if (!t || !st_tier_inflight(t))
			continue;
		n = reap(e, t, 0);
		progressed += n > 0 ? n : 0;
	}
	if (!progressed && block) {
		struct st_tier *v = e->tier[ST_HOME_VRAM], *n = e->tier[ST_HOME_NVME];
		unsigned vin = st_tier_inflight(v), nin = n ? st_tier_inflight(n) : 0;
		struct st_tier *only = vin && !nin ? v : nin && !vin ? n : NULL;

		/* The vram tier blocks on its oldest copy: when that one waits
		 * for the compute, block on the compute's event first, to see
		 * when the copy starts (the wait is no longer for it). */
		if (only == v && e->lanes.n_waiting) {
			struct chain *old = oldest_vram(e);

			if (old && old->waits) {
				st_event_sync(e->dev, old->waits);
				see_waits(e);
			}
		}
		if (only) {
			reap(e, only, 1);
		} else if (vin || nin) {
			struct timespec ts = { 0, 20000 };

			nanosleep(&ts, NULL);
		}
	}
	return e->err;
}

void st_eng_host_wait(struct st_engine *e, const char *why, uint64_t t0_ns)
{
	if (e->cfg.trace)
		st_trace_span(e->cfg.trace, e->trace.host, why, t0_ns, st_now_ns(), NULL);
}

void st_eng_phase(struct st_engine *e, const char *name, int mb, uint64_t t0_ns)
{
	char args[64];

	if (!e->cfg.trace)
		return;
	snprintf(args, sizeof(args), "{\"step\":%d,\"mb\":%d}", e->trace.step, mb);
	st_trace_span(e->cfg.trace, e->trace.phase, name, t0_ns, st_now_ns(), args);
}

int st_eng_wait_until(struct st_engine *e, const int *counter, const char *why)
{
	uint64_t t0 = *counter > 0 ? st_now_ns() : 0;
	int ret = 0;

	while (*counter > 0 && ret == 0)
		ret = st_eng_pump(e, true);
	if (t0)
		st_eng_host_wait(e, why, t0);
	return ret;
}

/* Drain every transfer and the compute (after an error, or before reading
 * states). A chain whose nvme hop lands here submits its h2d hop, so both
 * tiers are drained until neither has anything in flight. */
void st_eng_drain(struct st_engine *e)
{
	bool busy = true;

	if (e->cx)
		st_compute_sync(e->cx);
	while (busy) {
		busy = false;
		for (int h = ST_HOME_VRAM; h <= ST_HOME_NVME; h += 2) {
			struct st_tier *t = e->tier[h];

			while (t && st_tier_inflight(t)) {
				if (reap(e, t, 1) < 0)
					break; /* the tier failed: leave it */
				busy = true;
			}
		}
	}
}

/* Wait for every op queued on the compute, then count its finished spans
 * as the compute lane's busy time (and trace them). Returns the compute's
 * error, or 0. */
int st_eng_compute_drain(struct st_engine *e)
{
	uint64_t t0 = st_now_ns();
	int ret = st_compute_sync(e->cx), n;
	struct st_compute_span sp[64];

	st_eng_host_wait(e, "compute drain", t0);
	while ((n = st_compute_take_spans(e->cx, sp, (int)ST_ARRAY_LEN(sp))) > 0)
		for (int i = 0; i < n; i++) {
			e->lanes.busy[ST_LANE_COMPUTE].busy_ns += sp[i].t1_ns - sp[i].t0_ns;
			if (e->cfg.trace) {
				/* when the host queued it, in the trace's
				 * microseconds (tools/trace-gaps) */
				uint64_t o = st_trace_origin_ns(e->cfg.trace);
				uint64_t q = sp[i].tq_ns > o ? sp[i].tq_ns - o : 0;
				char args[48];

				snprintf(args, sizeof(args), "{\"queued_us\":%llu.%03u}",
					 (unsigned long long)(q / 1000), (unsigned)(q % 1000));
				st_trace_span(e->cfg.trace, e->trace.lane[ST_LANE_COMPUTE],
					      sp[i].name, sp[i].t0_ns, sp[i].t1_ns, args);
			}
		}
	return ret;
}

/* The nvme tier's own busy time (reads and writes together) so far. */
static uint64_t nvme_busy(const struct st_engine *e)
{
	struct st_tier_stats ts;

	if (!e->tier[ST_HOME_NVME])
		return 0;
	st_tier_get_stats(e->tier[ST_HOME_NVME], &ts);
	return ts.busy_ns;
}

void st_eng_stats_begin(struct st_engine *e)
{
	uint64_t now = st_now_ns();

	for (int l = 0; l < ST_LANE_COUNT; l++) {
		e->lanes.busy[l].busy_ns = 0;
		e->lanes.busy[l].bytes = 0;
		/* the last update's stores may still be going back: their
		 * lane is this step's busy from its start */
		if (e->lanes.busy[l].inflight)
			e->lanes.busy[l].since_ns = now;
	}
	e->lanes.nvme_busy0_ns = nvme_busy(e);
}

void st_eng_stats_end(struct st_engine *e, uint64_t t0_ns)
{
	uint64_t now = st_now_ns();

	e->last_stats.step_ns = now - t0_ns;
	for (int l = 0; l < ST_LANE_COUNT; l++) {
		/* stores still going back (the sweep's last, landing in the next
		 * backward): their time so far is this step's, the rest the
		 * next one's (st_eng_stats_begin) */
		if (e->lanes.busy[l].inflight) {
			e->lanes.busy[l].busy_ns += now - e->lanes.busy[l].since_ns;
			if (e->cfg.trace && l != ST_LANE_ADAM)
				st_trace_span(e->cfg.trace, e->trace.lane[l], "busy",
					      e->lanes.busy[l].since_ns, now, NULL);
			e->lanes.busy[l].since_ns = now;
		}
		e->last_stats.busy_ns[l] = e->lanes.busy[l].busy_ns;
		e->last_stats.bytes[l] = e->lanes.busy[l].bytes;
	}
	e->last_stats.nvme_busy_ns = nvme_busy(e) - e->lanes.nvme_busy0_ns;
}

/* A step failed with ret: drain, keep the first error and its message. */
void st_eng_fail(struct st_engine *e, int ret)
{
	st_eng_drain(e);
	if (!e->err)
		e->err = ret;
	if (!e->errmsg[0])
		snprintf(e->errmsg, sizeof(e->errmsg), "%s", st_error_last());
}
