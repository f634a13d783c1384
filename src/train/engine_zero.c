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
#include <time.h>

#ifdef ST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

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
	e->zero.nvme_dirs = out;
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

	if (!e->zero.spans || e->zero.span_head - e->zero.span_tail >= ST_CSPANS - 1)
		return;
	s = &e->zero.spans[e->zero.span_head % ST_CSPANS];
	if (!end) {
		s->name = name;
		atomic_store(&s->done, false);
		st_device_host_fn(e->dev, st_comm_queue(e->comm), span_begin, s);
		return;
	}
	st_device_host_fn(e->dev, st_comm_queue(e->comm), span_end, s);
	e->zero.span_head++;
}

void st_eng_zero_trace(struct st_engine *e)
{
	while (e->zero.spans && e->zero.span_tail != e->zero.span_head) {
		struct comm_span *s = &e->zero.spans[e->zero.span_tail % ST_CSPANS];

		if (!atomic_load(&s->done))
			break;
		st_trace_span(e->cfg.trace, e->zero.trace_lane, s->name, s->t0_ns, s->t1_ns, NULL);
		e->zero.span_tail++;
	}
}

/* The GPU of this rank: on the cuda device at world > 1, the launcher's
 * local rank, modulo the GPUs this process sees (so ranks share a GPU
 * when there are more ranks on the node than GPUs: 2 ranks on one GPU
 * with the mpi backend); else the first. */
int st_eng_zero_ordinal(const struct st_engine_config *cfg)
{
#ifdef ST_HAVE_CUDA
	struct st_comm_launch l;
	int count = 0;

	if (cfg->world <= 1 || !cfg->device || strcmp(cfg->device, "cuda") != 0)
		return 0;
	st_comm_launch(&l);
	if (l.local_rank <= 0 || cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
		cudaGetLastError();
		return 0;
	}
	return l.local_rank % count;
#else
	ST_UNUSED(cfg);
	return 0;
#endif
}

/* Host memory the comm's queue copies to or from on a device that is not
 * the host's: page-aligned, pinned where the device pins. */
static void *host_buf(struct st_engine *e, size_t bytes)
{
	void *p = NULL;

	bytes = st_align_up(bytes ? bytes : 1, ST_PAGE_BYTES);
	if (posix_memalign(&p, ST_PAGE_BYTES, bytes))
		return NULL;
	memset(p, 0, bytes);
	if (e->zero.via_device && st_device_pin_host(e->dev, p, bytes) < 0) {
		free(p);
		return NULL;
	}
	return p;
}

static void host_buf_free(struct st_engine *e, void *p)
{
	if (p && e->zero.via_device)
		st_device_unpin_host(e->dev, p);
	free(p);
}

static size_t scratch_bytes(const struct st_engine *e)
{
	uint64_t n = 0;

	for (int u = 0; u < e->n_units; u++)
		n = ST_MAX(n, e->padded_elems[u] * 4);
	return (size_t)n;
}

/* The communicator, with the plan's scratch; the buffers only world > 1
 * needs. */
int st_eng_zero_setup(struct st_engine *e)
{
	const struct st_comm_ops *ops = e->cfg.comm_ops ? e->cfg.comm_ops : &st_comm_local_ops;
	struct st_comm_config cc = { 0 };
	const char *force = getenv("ST_ZERO_DEVICE_PATH");
	uint64_t nparts = 0;
	int ret;

	e->zero.via_device =
		e->world > 1 && (!st_device_unified(e->dev) || (force && strcmp(force, "1") == 0));
	if (e->zero.scratch) {
		cc.scratch = e->zero.scratch;
		cc.scratch_bytes = scratch_bytes(e);
	}
	/* the cuda path's order on the cpu device: the mpi backend moves
	 * every collective through its host staging, as it does on cuda */
	cc.stage_host = e->zero.via_device;
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
	e->zero.part_off = calloc((size_t)e->n_units, sizeof(*e->zero.part_off));
	if (!e->zero.part_off)
		return -ENOMEM;
	for (int u = 0; u < e->n_units; u++) {
		e->zero.part_off[u] = nparts;
		nparts += e->slice_elems[u] / ST_PLAN_SLICE_ALIGN;
	}
	e->zero.n_parts = nparts;
	/* through the device, the norm's sums and the losses are gathered in
	 * the comm scratch (free between the backward and the update) */
	if (e->zero.via_device && ((size_t)e->world * nparts * 8 > scratch_bytes(e) ||
			(size_t)e->world * (size_t)e->cfg.train.grad_accum * 8 > scratch_bytes(e)))
		return st_error_set(-ENOSPC, "engine: %d ranks on device '%s': the norm's %llu "
				    "chunk sums or the %d losses of a rank do not fit the comm "
				    "scratch of %zu bytes", e->world, st_device_name(e->dev),
				    (unsigned long long)nparts, e->cfg.train.grad_accum,
				    scratch_bytes(e));
	if (e->cfg.trace) {
		e->zero.spans = calloc(ST_CSPANS, sizeof(*e->zero.spans));
		e->zero.trace_lane = st_trace_lane(e->cfg.trace, "comm");
		if (!e->zero.spans || e->zero.trace_lane < 0)
			return -ENOMEM;
	}
	e->zero.parts = host_buf(e, (size_t)e->world * nparts * sizeof(double));
	e->zero.losses = host_buf(e, (size_t)e->world * (size_t)e->cfg.train.grad_accum *
				       sizeof(double));
	if (!e->zero.parts || !e->zero.losses)
		return -ENOMEM;
	for (int i = 0; i < 2 && e->zero.w_gather && ret == 0; i++)
		ret = st_event_create(e->dev, &e->zero.ev_wgather[i]);
	if (e->zero.w_stream) {
		e->fetch.ev_gather =
			calloc((size_t)e->fetch.n_slots + 1, sizeof(*e->fetch.ev_gather));
		if (!e->fetch.ev_gather)
			return -ENOMEM;
		for (int i = 0; i < e->fetch.n_slots && ret == 0; i++)
			ret = st_event_create(e->dev, &e->fetch.ev_gather[i]);
	}
	return ret;
}

void st_eng_zero_fini(struct st_engine *e)
{
	free(e->zero.spans);
	e->zero.spans = NULL;
	host_buf_free(e, e->zero.parts);
	host_buf_free(e, e->zero.losses);
	free(e->zero.part_off);
	e->zero.parts = e->zero.losses = NULL;
	e->zero.part_off = NULL;
}

static enum st_comm_dtype w_dtype(const struct st_engine *e)
{
	return e->w_elem_bytes == 2 ? ST_COMM_BF16 : ST_COMM_F32;
}

static int comm_copy(struct st_engine *e, void *dst, const void *src, size_t bytes,
		     enum st_copy_dir dir)
{
	return st_device_memcpy_async(e->dev, st_comm_queue(e->comm), dst, src, bytes, dir);
}

/* Queue the all-gather of host memory: recv is world * slice_elems, this
 * rank's slot (at recv + rank * slice) already holds its part. On a
 * device the host can address, in place in recv; through the device
 * (zero.via_device), in the comm scratch: the rank's slot h2d, the all-gather in
 * place there, every slot d2h back into recv, all on the comm queue (the
 * scratch is reused only in that queue's order). The host may read recv
 * once an event recorded after it is done (st_comm_sync). */
static int gather_host_queue(struct st_engine *e, void *recv, size_t slice_elems,
			     enum st_comm_dtype dt)
{
	size_t slot = slice_elems * st_comm_dtype_bytes(dt), off = (size_t)e->rank * slot;
	char *r = recv, *s = e->zero.scratch;
	int ret;

	if (!e->zero.via_device)
		return st_comm_allgather(e->comm, r + off, r, slice_elems, dt);
	if ((size_t)e->world * slot > scratch_bytes(e))
		return st_error_set(-ENOSPC, "engine: a gather of %zu bytes through the device "
				    "passes the comm scratch (%zu bytes)", (size_t)e->world * slot,
				    scratch_bytes(e));
	ret = comm_copy(e, s + off, r + off, slot, ST_COPY_H2D);
	if (ret == 0)
		ret = st_comm_allgather(e->comm, s + off, s, slice_elems, dt);
	if (ret == 0)
		ret = comm_copy(e, r, s, (size_t)e->world * slot, ST_COPY_D2H);
	return ret;
}

/* The same, waited for: the norm's sums, the losses, stage 0's G, a
 * sharded state read between steps. */
int st_eng_zero_gather_host(struct st_engine *e, void *recv, size_t slice_elems,
			    enum st_comm_dtype dt)
{
	int ret = gather_host_queue(e, recv, slice_elems, dt);

	return ret ? ret : st_comm_sync(e->comm);
}

/* Stages 1-2: the rank's updated slice of unit u's W is in wgather[b] (b
 * = u & 1) at its place; queue the gather of the others' around it on
 * the comm queue, into W's home where the comm can write it, and record
 * ev_wgather[b]. Nothing waits here: the next unit's update runs meanwhile,
 * into the other buffer (st_eng_zero_wdone() waits, a unit later).
 *   home host, or vram:  cpu device: gathered from the buffer straight
 *                        into the home; via_device, vram: the slice h2d into
 *                        the home at its place, gathered in place there;
 *                        via_device, host: through the comm scratch, d2h home
 *   home nvme:           gathered into the buffer (via_device: through the
 *                        scratch), then a write of the nvme tier once
 *                        ev_wgather is seen done (st_eng_zero_wpoll()) */
int st_eng_zero_wstore(struct st_engine *e, int u)
{
	struct shard *w = shard(e, u, ST_STATE_W);
	int b = u & 1;
	size_t S = e->slice_elems[u], wb = (size_t)e->w_elem_bytes, off = (size_t)e->rank * S * wb;
	size_t all = (size_t)e->padded_elems[u] * wb;
	uint64_t lo = (uint64_t)e->rank * S;
	char *buf = e->zero.wgather[b];
	int ret = 0;

	assert(e->zero.wgather_unit[b] < 0);
	/* the slice past the unit's end is zero (what the buffer held for
	 * another unit is not sent) */
	if (lo + S > e->unit_elems[u]) {
		uint64_t z = ST_MAX(lo, e->unit_elems[u]);

		memset(buf + z * wb, 0, (lo + S - z) * wb);
	}
	e->zero.wgather_unit[b] = u;
	e->zero.wgather_store[b] = w->home == ST_HOME_NVME;
	e->zero.wgather_storing[b] = false;
	st_eng_zero_mark(e, "W gather", false);
	if (w->home == ST_HOME_NVME) {
		ret = gather_host_queue(e, buf, S, w_dtype(e));
	} else if (!e->zero.via_device) {
		void *home = w->home == ST_HOME_HOST ? haddr(e, &w->ext) : vaddr(e, &w->ext);

		ret = st_comm_allgather(e->comm, buf + off, home, S, w_dtype(e));
	} else if (w->home == ST_HOME_VRAM) {
		char *home = vaddr(e, &w->ext);

		ret = comm_copy(e, home + off, buf + off, S * wb, ST_COPY_H2D);
		if (ret == 0)
			ret = st_comm_allgather(e->comm, home + off, home, S, w_dtype(e));
	} else {
		char *s = e->zero.scratch;

		ret = comm_copy(e, s + off, buf + off, S * wb, ST_COPY_H2D);
		if (ret == 0)
			ret = st_comm_allgather(e->comm, s + off, s, S, w_dtype(e));
		if (ret == 0)
			ret = comm_copy(e, haddr(e, &w->ext), s, all, ST_COPY_D2H);
	}
	st_eng_zero_mark(e, "W gather", true);
	if (ret == 0)
		ret = st_comm_record(e->comm, e->zero.ev_wgather[b]);
	return ret;
}

/* Stages 1-2, the update inside the backward (engine_update.c): this
 * rank's slice of unit u's W between wgather[u & 1], at its place, and
 * W's home, at the same place. ST_IO_WRITE: the speculation's new slice
 * goes home alone, nothing gathered (not waited for: wgather_busy counts
 * it); ST_IO_READ: a commit takes it back, waited for, to gather it as
 * the sweep does (st_eng_zero_wstore()). A host home is copied. */
int st_eng_zero_wslice(struct st_engine *e, int u, enum st_io_op rw)
{
	struct shard *w = shard(e, u, ST_STATE_W);
	int b = u & 1;
	size_t S = e->slice_elems[u], wb = (size_t)e->w_elem_bytes, off = (size_t)e->rank * S * wb;
	uint64_t lo = (uint64_t)e->rank * S;
	char *buf = e->zero.wgather[b];
	struct hop h;
	int ret;

	/* the slice past the unit's end is zero, as the gather sends it */
	if (rw == ST_IO_WRITE && lo + S > e->unit_elems[u]) {
		uint64_t z = ST_MAX(lo, e->unit_elems[u]);

		memset(buf + z * wb, 0, (lo + S - z) * wb);
	}
	if (w->home == ST_HOME_HOST) {
		char *home = haddr(e, &w->ext);

		if (rw == ST_IO_READ)
			memcpy(buf + off, home + off, S * wb);
		else
			memcpy(home + off, buf + off, S * wb);
		return 0;
	}
	ret = st_eng_wait_until(e, &e->zero.wgather_busy[b], "W store");
	h = st_eng_shard_hop(e, rw == ST_IO_READ ? "W slice load" : "W slice store", u,
			     ST_STATE_W, rw, off, buf + off, S * wb);
	if (ret == 0)
		ret = st_eng_chain_start(e, &e->zero.chain_wstore[b], &h, 1,
					 &e->zero.wgather_busy[b], NULL);
	if (ret == 0 && rw == ST_IO_READ)
		ret = st_eng_wait_until(e, &e->zero.wgather_busy[b], "W slice load");
	return ret;
}

/* W on nvme: the write of the gathered unit (its home's whole extent, as
 * the stage-0 path writes it), once the gather is done. */
static int wstore_start(struct st_engine *e, int b)
{
	int u = e->zero.wgather_unit[b];
	struct shard *w = shard(e, u, ST_STATE_W);
	struct hop h = st_eng_shard_hop(e, "W store", u, ST_STATE_W, ST_IO_WRITE, 0,
					e->zero.wgather[b], w->ext.len_bytes);

	e->zero.wgather_storing[b] = true;
	return st_eng_chain_start(e, &e->zero.chain_wstore[b], &h, 1, &e->zero.wgather_busy[b],
				  NULL);
}

/* Between tiles: a gather seen done starts its nvme write at once,
 * without waiting (its unit's wdone waits). */
void st_eng_zero_wpoll(struct st_engine *e)
{
	for (int b = 0; b < 2; b++)
		if (e->zero.wgather_unit[b] >= 0 && e->zero.wgather_store[b] &&
		    !e->zero.wgather_storing[b] &&
		    st_event_query(e->dev, e->zero.ev_wgather[b]) == 1 && wstore_start(e, b) < 0)
			return; /* the engine's error; wdone returns it */
}

/* Unit u's new W is home: its gather done (the comm's error, if any,
 * returned), its nvme write landed. The buffer is then free for u + 2. */
int st_eng_zero_wdone(struct st_engine *e, int u)
{
	int b = u & 1, ret;

	if (e->zero.wgather_unit[b] != u)
		return 0;
	for (;;) { /* the engine's transfers go on while the gather runs */
		ret = st_event_query(e->dev, e->zero.ev_wgather[b]);
		if (ret != 0)
			break;
		ret = st_eng_pump(e, false);
		if (ret < 0)
			break;
		nanosleep(&(struct timespec){ 0, 20000 }, NULL);
	}
	if (ret >= 0)
		ret = st_comm_take_error(e->comm);
	if (ret == 0 && e->zero.wgather_store[b] && !e->zero.wgather_storing[b])
		ret = wstore_start(e, b);
	if (ret == 0)
		ret = st_eng_wait_until(e, &e->zero.wgather_busy[b], "W store");
	e->zero.wgather_unit[b] = -1;
	return ret;
}

/* This rank's chunk sums of its final G slice of unit u:
 * st_grad_sumsq() of each ST_PLAN_SLICE_ALIGN chunk, which is exactly the
 * partial sum the one-rank sum of the unit adds at that chunk (strata/
 * optim.h: chunks of 16384 elements, added in index order; a slice's
 * padding past the unit's end is zero and adds +0). */
void st_eng_zero_parts(struct st_engine *e, int u, const float *g)
{
	double *out = e->zero.parts + (size_t)e->rank * e->zero.n_parts + e->zero.part_off[u];

	for (uint64_t c = 0; c < e->slice_elems[u] / ST_PLAN_SLICE_ALIGN; c++)
		if (st_grad_sumsq(g + c * ST_PLAN_SLICE_ALIGN, ST_OPTIM_F32, ST_PLAN_SLICE_ALIGN,
				  &out[c]) < 0 && isfinite(out[c]))
			out[c] = NAN;
	/* tests: a G that counts as not finite (st_engine_config) */
	if (st_eng_test_nan_grad(e, u))
		out[0] = NAN;
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
		ret = st_eng_zero_gather_host(e, e->zero.parts, e->zero.n_parts, ST_COMM_F64);
		for (int u = 0; ret == 0 && u < e->n_units; u++) {
			double t = 0;
			uint64_t n = e->slice_elems[u] / ST_PLAN_SLICE_ALIGN;

			for (int q = 0; q < e->world; q++)
				for (uint64_t c = 0; c < n; c++)
					t += e->zero.parts[(size_t)q * e->zero.n_parts +
							   e->zero.part_off[u] + c];
			e->grad.unit_sumsq[u] = t;
		}
	}
	for (int u = 0; u < e->n_units; u++)
		total += e->grad.unit_sumsq[u];
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

	ret = st_eng_zero_gather_host(e, e->zero.losses, (size_t)A, ST_COMM_F64);
	for (int a = 0; a < A; a++)
		for (int q = 0; q < e->world; q++)
			s += e->zero.losses[(size_t)q * (size_t)A + (size_t)a];
	*sum = s;
	return ret;
}
