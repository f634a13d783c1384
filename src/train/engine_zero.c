/* ZeRO across ranks (docs/zero.md): the communicator and what only world
 * > 1 needs -- each rank's nvme directories, the updated W slices
 * gathered into the unit (stages 1-2), the gradient norm from the ranks'
 * chunk sums, the micro-batches' losses.
 *
 * Every collective is called in the same program order on every rank (the
 * comm's queue runs them in that order; an MPI or NCCL peer must see the
 * same sequence), and every sum over ranks is one that strata fixes: the
 * comm seam's left fold in rank order (strata/comm.h), or a fold here over
 * values gathered from every rank, in the order one rank alone would add
 * them. So the numbers do not depend on the stage, and N ranks at
 * grad_accum 1 equal one rank at grad_accum N bit for bit. */
#include "engine_internal.h"
#include "strata/trace.h"

#include <stdatomic.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Each rank's nvme files in DIR/rank-R of every --nvme DIR: one rank's
 * files never meet another's, and a crashed rank's are its own. */
int st_eng_zero_dirs(struct st_engine *e)
{
	const char *dirs = e->cfg.nvme_dirs;
	size_t cap = 1, at = 0;
	char *out;

	if (e->world == 1 || !dirs)
		return 0;
	for (const char *c = dirs; *c; c++)
		cap += *c == ',' ? 32 : 1;
	cap += 32;
	out = calloc(1, cap);
	if (!out)
		return -ENOMEM;
	for (const char *d = dirs; *d;) {
		const char *end = strchr(d, ',');
		size_t n = end ? (size_t)(end - d) : strlen(d), start = at + (at > 0);

		at += (size_t)snprintf(out + at, cap - at, "%s%.*s/rank-%d", at ? "," : "",
				       (int)n, d, e->rank);
		if (mkdir(out + start, 0700) < 0 && errno != EEXIST) {
			int err = -errno;

			st_error_set(err, "--nvme %s: %s", out + start, strerror(errno));
			free(out);
			return err;
		}
		d = end ? end + 1 : d + n;
	}
	e->nvme_dirs = out;
	return 0;
}

/* --trace at world > 1: each collective the engine queues is bracketed
 * by two host functions on the comm's queue that stamp its start and end
 * into a ring; the host moves the finished ones to the trace's "comm"
 * lane at each step's end, so the trace shows the collectives against
 * the compute. */
#define ST_CSPANS 4096u

struct comm_span {
	const char *name;
	uint64_t t0_ns, t1_ns;
	atomic_bool done;
};

static void span_begin(void *arg)
{
	struct comm_span *s = arg;

	s->t0_ns = st_now_ns();
}

static void span_end(void *arg)
{
	struct comm_span *s = arg;

	s->t1_ns = st_now_ns();
	atomic_store(&s->done, true);
}

void st_eng_zero_mark(struct st_engine *e, const char *name, bool end)
{
	struct comm_span *s;

	if (!e->cspan || e->cspan_head - e->cspan_tail >= ST_CSPANS - 1)
		return;
	s = &e->cspan[e->cspan_head % ST_CSPANS];
	if (!end) {
		s->name = name;
		atomic_store(&s->done, false);
		st_device_host_fn(e->dev, st_comm_queue(e->comm), span_begin, s);
		return;
	}
	st_device_host_fn(e->dev, st_comm_queue(e->comm), span_end, s);
	e->cspan_head++;
}

void st_eng_zero_trace(struct st_engine *e)
{
	while (e->cspan && e->cspan_tail != e->cspan_head) {
		struct comm_span *s = &e->cspan[e->cspan_tail % ST_CSPANS];

		if (!atomic_load(&s->done))
			break;
		st_trace_span(e->cfg.trace, e->comm_trace_lane, s->name, s->t0_ns, s->t1_ns, NULL);
		e->cspan_tail++;
	}
}

/* The communicator, with the plan's scratch; the buffers only world > 1
 * needs. */
int st_eng_zero_setup(struct st_engine *e)
{
	const struct st_comm_ops *ops = e->cfg.comm_ops ? e->cfg.comm_ops : &st_comm_local_ops;
	struct st_comm_config cc = { 0 };
	uint64_t nparts = 0;
	int ret;

	if (e->comm_scratch) {
		cc.scratch = e->comm_scratch;
		cc.scratch_bytes = e->epad[0] * 4;
		for (int u = 0; u < e->U; u++)
			cc.scratch_bytes = ST_MAX(cc.scratch_bytes, e->epad[u] * 4);
	}
	ret = st_comm_create(ops, e->dev, &cc, &e->comm);
	if (ret < 0)
		return ret;
	if (st_comm_world(e->comm) != e->world || st_comm_rank(e->comm) != e->rank)
		return st_error_set(-EINVAL, "engine: the plan is for rank %d of %d, but comm "
				    "'%s' is rank %d of %d", e->rank, e->world,
				    st_comm_name(e->comm), st_comm_rank(e->comm),
				    st_comm_world(e->comm));
	if (e->world == 1)
		return 0;
	/* the host-side collectives here (norm, losses, W gather) take host
	 * memory: a device the host cannot read (cuda) is not built yet */
	if (!st_device_unified(e->dev))
		return st_error_set(-ENOTSUP, "engine: %d ranks on device '%s': ZeRO across "
				    "ranks runs on the cpu device (cuda: not built yet)",
				    e->world, st_device_name(e->dev));
	e->part_off = calloc((size_t)e->U, sizeof(*e->part_off));
	if (!e->part_off)
		return -ENOMEM;
	for (int u = 0; u < e->U; u++) {
		e->part_off[u] = nparts;
		nparts += e->slice[u] / ST_PLAN_SLICE_ALIGN;
	}
	e->nparts = nparts;
	if (e->cfg.trace) {
		e->cspan = calloc(ST_CSPANS, sizeof(*e->cspan));
		e->comm_trace_lane = st_trace_lane(e->cfg.trace, "comm");
		if (!e->cspan || e->comm_trace_lane < 0)
			return -ENOMEM;
	}
	e->parts = calloc((size_t)e->world * nparts, sizeof(double));
	e->losses = calloc((size_t)e->world * (size_t)e->cfg.train.grad_accum, sizeof(double));
	if (!e->parts || !e->losses)
		return -ENOMEM;
	if (e->w_stream) {
		e->ev_gather = calloc((size_t)e->nslots + 1, sizeof(*e->ev_gather));
		if (!e->ev_gather)
			return -ENOMEM;
		for (int i = 0; i < e->nslots && ret == 0; i++)
			ret = st_event_create(e->dev, &e->ev_gather[i]);
	}
	return ret;
}

void st_eng_zero_fini(struct st_engine *e)
{
	free(e->cspan);
	e->cspan = NULL;
	free(e->parts);
	free(e->part_off);
	free(e->losses);
	e->parts = e->losses = NULL;
	e->part_off = NULL;
}

static enum st_comm_dtype w_dtype(const struct st_engine *e)
{
	return e->Wb == 2 ? ST_COMM_BF16 : ST_COMM_F32;
}

/* Stages 1-2: the rank's updated slice of unit u's W is in wgather at its
 * place; gather the others' around it, then the whole unit goes home. */
int st_eng_zero_wstore(struct st_engine *e, int u)
{
	struct shard *w = shard(e, u, ST_STATE_W);
	uint64_t S = e->slice[u];
	struct hop h;
	int ret;

	st_eng_zero_mark(e, "W gather", false);
	ret = st_comm_allgather(e->comm, e->wgather + (size_t)e->rank * S * (size_t)e->Wb,
				e->wgather, S, w_dtype(e));
	st_eng_zero_mark(e, "W gather", true);

	if (ret == 0)
		ret = st_comm_sync(e->comm);
	if (ret < 0)
		return ret;
	if (w->home == ST_HOME_HOST) {
		memcpy(haddr(e, &w->ext), e->wgather, w->ext.len_bytes);
		return 0;
	}
	/* nvme: a write of the nvme tier; vram: an h2d copy */
	h = st_eng_shard_hop(e, "W store", u, ST_STATE_W, ST_IO_WRITE, 0, e->wgather,
			     w->ext.len_bytes);
	return st_eng_chain_start(e, &e->c_wstore, &h, 1, &e->wg_busy, NULL);
}

/* This rank's chunk sums of its final G slice of unit u:
 * st_grad_sumsq() of each ST_PLAN_SLICE_ALIGN chunk, which is exactly the
 * partial sum the one-rank sum of the unit adds at that chunk (strata/
 * optim.h: chunks of 16384 elements, added in index order; a slice's
 * padding past the unit's end is zero and adds +0). */
void st_eng_zero_parts(struct st_engine *e, int u, const float *g)
{
	double *out = e->parts + (size_t)e->rank * e->nparts + e->part_off[u];

	for (uint64_t c = 0; c < e->slice[u] / ST_PLAN_SLICE_ALIGN; c++)
		if (st_grad_sumsq(g + c * ST_PLAN_SLICE_ALIGN, ST_OPTIM_F32, ST_PLAN_SLICE_ALIGN,
				  &out[c]) < 0 && isfinite(out[c]))
			out[c] = NAN;
}

/* The global sum of squares at world > 1: every rank's chunk sums of its
 * G slice gathered, each unit's folded in chunk order, rank after rank (a
 * unit's chunks in order), as one rank sums the unit; then the units in
 * unit order. */
int st_eng_zero_norm(struct st_engine *e, double *sumsq)
{
	double total = 0;
	int ret = 0;

	{
		ret = st_comm_allgather(e->comm, e->parts + (size_t)e->rank * e->nparts, e->parts,
					e->nparts, ST_COMM_F64);
		if (ret == 0)
			ret = st_comm_sync(e->comm);
		for (int u = 0; ret == 0 && u < e->U; u++) {
			double t = 0;
			uint64_t n = e->slice[u] / ST_PLAN_SLICE_ALIGN;

			for (int q = 0; q < e->world; q++)
				for (uint64_t c = 0; c < n; c++)
					t += e->parts[(size_t)q * e->nparts + e->part_off[u] + c];
			e->unit_sumsq[u] = t;
		}
	}
	for (int u = 0; u < e->U; u++)
		total += e->unit_sumsq[u];
	*sumsq = total;
	return ret;
}

/* The step's loss sum: every rank's micro-batch losses (this rank's a-th,
 * global micro-batch a * N + rank, is in losses[rank * A + a]) added in
 * global order, as one rank adds its N * A. */
int st_eng_zero_loss(struct st_engine *e, double *sum)
{
	int A = e->cfg.train.grad_accum, ret;
	double s = 0;

	ret = st_comm_allgather(e->comm, e->losses + (size_t)e->rank * (size_t)A, e->losses,
				(size_t)A, ST_COMM_F64);
	if (ret == 0)
		ret = st_comm_sync(e->comm);
	for (int a = 0; a < A; a++)
		for (int q = 0; q < e->world; q++)
			s += e->losses[(size_t)q * (size_t)A + (size_t)a];
	*sum = s;
	return ret;
}
