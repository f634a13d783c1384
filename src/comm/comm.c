/* Comm wrappers: the only place that calls a backend's hooks. They check
 * arguments, keep the sticky error and the stats, time what the comm's
 * queue runs, and compose reduce_scatter / allreduce from all-to-all /
 * allgather and a rank-order local sum when a backend leaves them out
 * (strata/comm.h, "The order promise"). */
#include "strata/comm.h"

#include "strata/device.h"

#include "comm_internal.h"

#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

/* A timing stamp's argument: host functions on the comm's queue take one
 * pointer, and these live in the comm, so timing allocates nothing. */
struct st_comm_stamp {
	struct st_comm *c;
	enum st_comm_kind kind;
};

struct st_comm {
	const struct st_comm_ops *ops;
	struct st_device *dev; /* borrowed */
	struct st_queue *q;
	struct st_comm_config cfg;
	double timeout_s; /* what set_timeout last set; the backend's start value */
	int rank, world, local_rank;
	int err; /* sticky */
	void *priv;
	uint64_t calls[ST_COMM_KINDS], bytes[ST_COMM_KINDS]; /* host only */
	_Atomic uint64_t busy_ns[ST_COMM_KINDS];             /* added by the queue */
	uint64_t t0_ns; /* the open collective's start; the queue's thread only */
	struct st_comm_stamp stamp[ST_COMM_KINDS];
};

atomic_bool st_comm_exit_alike;

static const struct st_comm_ops *const st_comms[] = {
	&st_comm_local_ops,
#ifdef ST_HAVE_MPI
	&st_comm_mpi_ops,
#endif
#ifdef ST_COMM_NCCL /* src/comm/meson.build: when nccl.c is built */
	&st_comm_nccl_ops,
#endif
};

static const char *const st_comm_kind_names[ST_COMM_KINDS] = {
	[ST_COMM_ALLREDUCE] = "allreduce",
	[ST_COMM_REDUCE_SCATTER] = "reduce_scatter",
	[ST_COMM_ALLGATHER] = "allgather",
	[ST_COMM_ALLTOALL] = "alltoall",
	[ST_COMM_BROADCAST] = "broadcast",
};

static const size_t st_comm_dtype_sizes[ST_COMM_DTYPES] = {
	[ST_COMM_F32] = 4,
	[ST_COMM_F64] = 8,
	[ST_COMM_BF16] = 2,
};

const struct st_comm_ops *st_comm_find(const char *name)
{
	for (size_t i = 0; i < ST_ARRAY_LEN(st_comms); i++)
		if (name && strcmp(st_comms[i]->name, name) == 0)
			return st_comms[i];
	return NULL;
}

const char *st_comm_list(void)
{
	static char list[64];

	if (!list[0]) {
		size_t at = 0;

		for (size_t i = 0; i < ST_ARRAY_LEN(st_comms); i++)
			at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%s",
					       i ? "," : "", st_comms[i]->name);
	}
	return list;
}

/* ---- the launcher ------------------------------------------------------------ */

static int comm_env_int(const char *name)
{
	const char *v = getenv(name);
	char *end;
	long x;

	if (!v || !*v)
		return -1;
	x = strtol(v, &end, 10);
	return (*end || x < 0 || x > 1 << 30) ? -1 : (int)x;
}

void st_comm_launch(struct st_comm_launch *out)
{
	*out = (struct st_comm_launch){ .rank = -1, .world = -1, .local_rank = -1, .nodes = -1 };
	if (comm_env_int("OMPI_COMM_WORLD_SIZE") >= 0) {
		out->launcher = "mpirun";
		out->rank = comm_env_int("OMPI_COMM_WORLD_RANK");
		out->world = comm_env_int("OMPI_COMM_WORLD_SIZE");
		out->local_rank = comm_env_int("OMPI_COMM_WORLD_LOCAL_RANK");
		/* the nodes the job's daemons run on (Open MPI 4.1) */
		out->nodes = comm_env_int("OMPI_MCA_orte_num_nodes");
		return;
	}
	out->nodes = comm_env_int("SLURM_STEP_NUM_NODES");
	if (out->nodes < 0)
		out->nodes = comm_env_int("SLURM_JOB_NUM_NODES");
	if (comm_env_int("PMIX_RANK") >= 0) {
		out->launcher = "pmix"; /* srun --mpi=pmix */
		out->rank = comm_env_int("PMIX_RANK");
		out->world = comm_env_int("SLURM_STEP_NUM_TASKS");
		if (out->world < 0)
			out->world = comm_env_int("SLURM_NTASKS");
		out->local_rank = comm_env_int("SLURM_LOCALID");
	} else if (comm_env_int("PMI_RANK") >= 0) {
		out->launcher = "pmi";
		out->rank = comm_env_int("PMI_RANK");
		out->world = comm_env_int("PMI_SIZE");
		out->local_rank = comm_env_int("MPI_LOCALRANKID");
		if (out->local_rank < 0)
			out->local_rank = comm_env_int("SLURM_LOCALID");
	} else if (comm_env_int("SLURM_STEP_NUM_TASKS") > 1) {
		/* srun with no MPI plugin (--mpi=none, Slurm's default): N
		 * tasks that no MPI can join into one world (Open MPI's
		 * MPI_Init fails there); st_comm_auto() refuses it, rather
		 * than N one-rank runs writing the same files */
		out->launcher = "srun";
		out->rank = comm_env_int("SLURM_PROCID");
		out->world = comm_env_int("SLURM_STEP_NUM_TASKS");
		out->local_rank = comm_env_int("SLURM_LOCALID");
	}
	if (!out->launcher)
		out->nodes = -1;
}

int st_comm_auto(const char *device_name, const struct st_comm_ops **out)
{
	struct st_comm_launch l;
	const char *want;

	const char *env = getenv("ST_COMM");

	st_comm_launch(&l);
	*out = &st_comm_local_ops;
	if (l.launcher && strcmp(l.launcher, "srun") == 0)
		return st_error_set(-EINVAL,
				    "comm: srun started %d tasks with no MPI plugin, so they cannot join "
				    "one world: run srun --mpi=pmix (srun --mpi=list names the plugins; "
				    "or set MpiDefault=pmix in slurm.conf)", l.world);
	/* $ST_COMM names the backend (mpi for 2 ranks sharing a GPU, nccl
	 * for one rank through nccl); else the device's, under a launcher */
	if (env && *env && strcmp(env, "auto") != 0) {
		*out = st_comm_find(env);
		if (*out)
			return 0;
		*out = &st_comm_local_ops;
		return st_error_set(-ENOTSUP, "comm: ST_COMM=%s: no such backend in this strata "
				    "(comm backends: %s)", env, st_comm_list());
	}
	if (!l.launcher)
		return 0;
	want = device_name && strcmp(device_name, "cuda") == 0 ? "nccl" : "mpi";
	*out = st_comm_find(want);
	if (!*out) {
		*out = &st_comm_local_ops;
		return st_error_set(-ENOTSUP,
				    "comm: launched by %s as rank %d of %d, but this strata was built without the %s backend (comm backends: %s)",
				    l.launcher, l.rank, l.world, want, st_comm_list());
	}
	return 0;
}

int st_comm_library(const struct st_comm_ops *ops, char *buf, size_t bytes)
{
	assert(ops && buf && bytes);
	if (ops->library)
		return ops->library(buf, bytes);
	snprintf(buf, bytes, "%s", ops->name);
	return 0;
}

const char *st_comm_describe(char *buf, size_t bytes)
{
	struct st_comm_launch l;
	size_t at;

	assert(buf && bytes);
	at = (size_t)snprintf(buf, bytes, "%s", st_comm_list());
	for (size_t i = 0; i < ST_ARRAY_LEN(st_comms) && at < bytes; i++) {
		char lib[160];

		if (!st_comms[i]->library || st_comms[i]->library(lib, sizeof(lib)) < 0)
			continue;
		at += (size_t)snprintf(buf + at, bytes - at, "; %s: %s", st_comms[i]->name, lib);
	}
	st_comm_launch(&l);
	if (at < bytes) {
		char host[64] = "?";

		gethostname(host, sizeof(host) - 1);
		if (l.launcher && l.nodes > 0)
			snprintf(buf + at, bytes - at,
				 "; launcher: %s, rank %d of %d, local rank %d, host %s, %d node%s",
				 l.launcher, l.rank, l.world, l.local_rank, host, l.nodes,
				 l.nodes == 1 ? "" : "s");
		else if (l.launcher)
			snprintf(buf + at, bytes - at, "; launcher: %s, rank %d of %d, local rank %d, host %s",
				 l.launcher, l.rank, l.world, l.local_rank, host);
		else
			snprintf(buf + at, bytes - at, "; launcher: none, one rank");
	}
	return buf;
}

const char *st_comm_kind_name(enum st_comm_kind k)
{
	assert((unsigned)k < ST_COMM_KINDS);
	return st_comm_kind_names[k];
}

size_t st_comm_dtype_bytes(enum st_comm_dtype dt)
{
	assert((unsigned)dt < ST_COMM_DTYPES);
	return st_comm_dtype_sizes[dt];
}

/* ---- registration ------------------------------------------------------------- */

static int comm_ops_check(const struct st_comm_ops *o)
{
	if (!o || !o->name)
		return st_error_set(-EINVAL, "comm ops table has no name");
	if (o->version != ST_COMM_OPS_VERSION)
		return st_error_set(-EINVAL, "comm '%s': ops version %u, this build takes %u",
				    o->name, o->version, ST_COMM_OPS_VERSION);
	if (!o->open || !o->close || !o->alltoall || !o->allgather || !o->broadcast)
		return st_error_set(-EINVAL, "comm '%s': ops table lacks a required hook",
				    o->name);
	return 0;
}

double st_comm_env_timeout(void)
{
	const char *v = getenv("ST_COMM_TIMEOUT");
	char *end;
	double t;

	if (!v || !*v)
		return 300;
	t = strtod(v, &end);
	if (*end || t != t) {
		fprintf(stderr, "strata: ST_COMM_TIMEOUT=%s is not a number of seconds; using 300\n",
			v);
		return 300;
	}
	return t == 0 ? -1 : t;
}

int st_comm_create(const struct st_comm_ops *ops, struct st_device *d,
		   const struct st_comm_config *cfg, struct st_comm **out)
{
	struct st_comm *c;
	int ret;

	assert(d && out);
	*out = NULL;
	ret = comm_ops_check(ops);
	if (ret < 0)
		return ret;
	c = calloc(1, sizeof(*c));
	if (!c)
		return st_error_set(-ENOMEM, "comm: out of memory");
	c->ops = ops;
	c->dev = d;
	if (cfg)
		c->cfg = *cfg;
	for (int k = 0; k < ST_COMM_KINDS; k++)
		c->stamp[k] = (struct st_comm_stamp){ .c = c, .kind = (enum st_comm_kind)k };
	if (ops->priv_bytes) {
		c->priv = calloc(1, ops->priv_bytes);
		if (!c->priv) {
			free(c);
			return st_error_set(-ENOMEM, "comm: out of memory");
		}
	}
	/* The wait limit, resolved once: the backends see seconds or < 0. */
	if (c->cfg.timeout_s == 0)
		c->cfg.timeout_s = st_comm_env_timeout();
	c->timeout_s = c->cfg.timeout_s > 0 ? c->cfg.timeout_s : 0;
	ret = st_queue_create(d, &c->q);
	if (ret < 0)
		goto fail;
	ret = ops->open(c, &c->cfg, &c->rank, &c->world);
	if (ret < 0) {
		st_queue_destroy(d, c->q);
		goto fail;
	}
	assert(c->world >= 1 && c->rank >= 0 && c->rank < c->world);
	c->local_rank = ops->local_rank ? ops->local_rank(c) : 0;
	*out = c;
	return 0;
fail:
	free(c->priv);
	free(c);
	return ret;
}

void st_comm_destroy(struct st_comm *c)
{
	if (!c)
		return;
	if (!c->ops->sync || c->ops->sync(c) < 0)
		st_queue_sync(c->dev, c->q);
	c->ops->close(c);
	st_queue_destroy(c->dev, c->q);
	free(c->priv);
	free(c);
}

const char *st_comm_name(const struct st_comm *c)
{
	return c->ops->name;
}

int st_comm_rank(const struct st_comm *c)
{
	return c->rank;
}

int st_comm_world(const struct st_comm *c)
{
	return c->world;
}

int st_comm_local_rank(const struct st_comm *c)
{
	return c->local_rank;
}

struct st_device *st_comm_device(struct st_comm *c)
{
	return c->dev;
}

struct st_queue *st_comm_queue(struct st_comm *c)
{
	return c->q;
}

void *st_comm_priv(struct st_comm *c)
{
	return c->priv;
}

/* ---- the local sum in rank order (unified devices) ------------------------------ */

/* Host-function record of one local sum; freed by the function. */
struct st_comm_sum {
	const void *in;
	void *out;
	size_t count_elems;
	int terms;
	enum st_comm_dtype dt;
};

/* out[i] = ((in[0][i] + in[1][i]) + ...) in the dtype's precision: the
 * fold of strata/comm.h. Built with -ffp-contract=off. */
static void comm_sum_run(void *arg)
{
	struct st_comm_sum *s = arg;
	size_t n = s->count_elems;

	if (s->dt == ST_COMM_F32) {
		const float *in = s->in;
		float *out = s->out;

		for (size_t i = 0; i < n; i++) {
			float acc = in[i];

			for (int q = 1; q < s->terms; q++)
				acc += in[(size_t)q * n + i];
			out[i] = acc;
		}
	} else {
		const double *in = s->in;
		double *out = s->out;

		for (size_t i = 0; i < n; i++) {
			double acc = in[i];

			for (int q = 1; q < s->terms; q++)
				acc += in[(size_t)q * n + i];
			out[i] = acc;
		}
	}
	free(s);
}

static int comm_reduce_local(struct st_comm *c, const void *in, void *out,
			     size_t count_elems, enum st_comm_dtype dt)
{
	struct st_comm_sum *s;
	int ret;

	/* The host sum wherever the host reads the device's memory, so every
	 * backend on the cpu device folds with the same code; a backend's
	 * kernel elsewhere. */
	if (c->ops->reduce_local && !st_device_unified(c->dev))
		return c->ops->reduce_local(c, in, out, count_elems, c->world, dt);
	if (!st_device_unified(c->dev))
		return st_error_set(-ENOTSUP,
				    "comm '%s': no local sum for device '%s' (reduce_local)",
				    c->ops->name, st_device_name(c->dev));
	s = malloc(sizeof(*s));
	if (!s)
		return st_error_set(-ENOMEM, "comm: out of memory queueing a sum");
	*s = (struct st_comm_sum){ .in = in, .out = out, .count_elems = count_elems,
				   .terms = c->world, .dt = dt };
	ret = st_device_host_fn(c->dev, c->q, comm_sum_run, s);
	if (ret < 0)
		free(s);
	return ret;
}

/* The scratch for a composed collective of world * elems elements. */
static int comm_scratch(struct st_comm *c, size_t elems, enum st_comm_dtype dt,
			void **out)
{
	size_t need_bytes = (size_t)c->world * elems * st_comm_dtype_bytes(dt);

	if (!c->cfg.scratch || c->cfg.scratch_bytes < need_bytes)
		return st_error_set(-ENOSPC,
				    "comm '%s': a composed reduction needs %zu bytes of scratch, has %zu",
				    c->ops->name, need_bytes, c->cfg.scratch_bytes);
	*out = c->cfg.scratch;
	return 0;
}

/* ---- timing ------------------------------------------------------------------- */

static void comm_stamp_begin(void *arg)
{
	struct st_comm_stamp *s = arg;

	s->c->t0_ns = st_now_ns();
}

static void comm_stamp_end(void *arg)
{
	struct st_comm_stamp *s = arg;

	atomic_fetch_add(&s->c->busy_ns[s->kind], st_now_ns() - s->c->t0_ns);
}

/* ---- argument checks ---------------------------------------------------------- */

/* One call, as the wrappers see it. elems is the per-call count of the API
 * (slice_elems or count_elems); send_elems and recv_elems the buffers'. */
struct comm_call {
	enum st_comm_kind kind;
	const void *send;
	void *recv;
	size_t elems, send_elems, recv_elems;
	enum st_comm_dtype dt;
	int root;
};

static bool comm_disjoint(const void *a, size_t a_bytes, const void *b, size_t b_bytes)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

	return x + a_bytes <= y || y + b_bytes <= x;
}

/* 1 when in place, 0 when out of place, -EINVAL (set) when the call is bad. */
static int comm_check(struct st_comm *c, struct comm_call *a)
{
	const char *kn = st_comm_kind_names[a->kind];
	size_t eb, w = (size_t)c->world;
	const char *in_place_at;

	if ((unsigned)a->dt >= ST_COMM_DTYPES)
		return st_error_set(-EINVAL, "comm %s: bad dtype %d", kn, (int)a->dt);
	if ((a->kind == ST_COMM_ALLREDUCE || a->kind == ST_COMM_REDUCE_SCATTER) &&
	    a->dt == ST_COMM_BF16)
		return st_error_set(-EINVAL, "comm %s: bf16 is not reducible", kn);
	if (a->elems == 0)
		return st_error_set(-EINVAL, "comm %s: count of 0 elements", kn);
	if (!a->send || !a->recv)
		return st_error_set(-EINVAL, "comm %s: NULL %s buffer", kn,
				    a->send ? "recv" : "send");
	eb = st_comm_dtype_sizes[a->dt];
	if (a->elems > SIZE_MAX / eb / w)
		return st_error_set(-EINVAL, "comm %s: %zu elements overflow", kn, a->elems);
	if ((uintptr_t)a->send % eb || (uintptr_t)a->recv % eb)
		return st_error_set(-EINVAL, "comm %s: buffer not aligned to its %zu-byte elements",
				    kn, eb);
	if (a->kind == ST_COMM_BROADCAST && (a->root < 0 || a->root >= c->world))
		return st_error_set(-EINVAL, "comm broadcast: root %d outside world %d", a->root,
				    c->world);

	switch (a->kind) {
	case ST_COMM_REDUCE_SCATTER:
		a->send_elems = w * a->elems;
		a->recv_elems = a->elems;
		in_place_at = (const char *)a->send + (size_t)c->rank * a->elems * eb;
		if ((const void *)in_place_at == a->recv)
			return 1;
		break;
	case ST_COMM_ALLGATHER:
		a->send_elems = a->elems;
		a->recv_elems = w * a->elems;
		in_place_at = (const char *)a->recv + (size_t)c->rank * a->elems * eb;
		if ((const void *)in_place_at == a->send)
			return 1;
		break;
	case ST_COMM_ALLTOALL:
		a->send_elems = a->recv_elems = w * a->elems;
		if (a->send == a->recv)
			return 1;
		break;
	default: /* allreduce, broadcast */
		a->send_elems = a->recv_elems = a->elems;
		if (a->send == a->recv)
			return 1;
		break;
	}
	if (!comm_disjoint(a->send, a->send_elems * eb, a->recv, a->recv_elems * eb))
		return st_error_set(-EINVAL,
				    "comm %s: send and recv overlap but the slice is not in place",
				    kn);
	return 0;
}

/* ---- the collectives ---------------------------------------------------------- */

/* Allreduce without a hook: a reduce-scatter of the first m = N * (n / N)
 * elements (all-to-all into the scratch, the local sum into this rank's
 * slice of recv), an allgather of the slices in place in recv, and the
 * last n % N elements by an allgather into the scratch and the local sum.
 * Each element is still the fold in rank order (one rank folds it, the
 * others copy its bits); each rank moves about 2 (N-1)/N of the buffer,
 * as a ring allreduce, and the scratch holds max(m, N * (n % N))
 * elements. In place (recv == send) works: the slice the sum writes is
 * read only by the all-to-all before it, the tail only by its allgather. */
static int comm_allreduce_composed(struct st_comm *c, const struct comm_call *a)
{
	size_t eb = st_comm_dtype_sizes[a->dt], w = (size_t)c->world;
	size_t slice = a->elems / w, m = slice * w, rest = a->elems - m;
	const char *send = a->send;
	char *recv = a->recv, *mine = recv + (size_t)c->rank * slice * eb;
	void *scratch = NULL;
	size_t need = ST_MAX(m, w * rest);
	int ret;

	if (!c->cfg.scratch || c->cfg.scratch_bytes < need * eb)
		return st_error_set(-ENOSPC,
				    "comm '%s': a composed allreduce of %zu elements needs %zu bytes of scratch, has %zu",
				    c->ops->name, a->elems, need * eb, c->cfg.scratch_bytes);
	scratch = c->cfg.scratch;
	if (slice) {
		ret = c->ops->alltoall(c, send, scratch, slice, a->dt);
		if (ret == 0)
			ret = comm_reduce_local(c, scratch, mine, slice, a->dt);
		if (ret == 0)
			ret = c->ops->allgather(c, mine, recv, slice, a->dt);
		if (ret < 0)
			return ret;
	}
	if (rest) {
		ret = c->ops->allgather(c, send + m * eb, scratch, rest, a->dt);
		if (ret == 0)
			ret = comm_reduce_local(c, scratch, recv + m * eb, rest, a->dt);
		if (ret < 0)
			return ret;
	}
	return 0;
}

static int comm_dispatch(struct st_comm *c, const struct comm_call *a)
{
	void *scratch = NULL;
	int ret;

	switch (a->kind) {
	case ST_COMM_ALLTOALL:
		return c->ops->alltoall(c, a->send, a->recv, a->elems, a->dt);
	case ST_COMM_ALLGATHER:
		return c->ops->allgather(c, a->send, a->recv, a->elems, a->dt);
	case ST_COMM_BROADCAST:
		return c->ops->broadcast(c, a->send, a->recv, a->elems, a->dt, a->root);
	case ST_COMM_REDUCE_SCATTER:
		if (c->ops->reduce_scatter)
			return c->ops->reduce_scatter(c, a->send, a->recv, a->elems, a->dt);
		ret = comm_scratch(c, a->elems, a->dt, &scratch);
		if (ret == 0)
			ret = c->ops->alltoall(c, a->send, scratch, a->elems, a->dt);
		if (ret == 0)
			ret = comm_reduce_local(c, scratch, a->recv, a->elems, a->dt);
		return ret;
	case ST_COMM_ALLREDUCE:
		if (c->ops->allreduce)
			return c->ops->allreduce(c, a->send, a->recv, a->elems, a->dt);
		return comm_allreduce_composed(c, a);
	case ST_COMM_KINDS:
		break;
	}
	assert(0);
	return -EINVAL;
}

static int comm_call(struct st_comm *c, struct comm_call *a)
{
	size_t eb;
	int in_place, ret;

	assert(c);
	if (!c->err && c->ops->async_error)
		c->err = c->ops->async_error(c);
	if (c->err)
		return c->err;
	in_place = comm_check(c, a);
	if (in_place < 0)
		return c->err = in_place;
	eb = st_comm_dtype_sizes[a->dt];
	c->calls[a->kind]++;
	c->bytes[a->kind] += ST_MAX(a->send_elems, a->recv_elems) * eb;
	/* At world 1 an in-place collective is the identity: no hook, no
	 * queue, no stamp. */
	if (in_place && c->world == 1)
		return 0;
	ret = st_device_host_fn(c->dev, c->q, comm_stamp_begin, &c->stamp[a->kind]);
	if (ret == 0)
		ret = comm_dispatch(c, a);
	if (ret == 0)
		ret = st_device_host_fn(c->dev, c->q, comm_stamp_end, &c->stamp[a->kind]);
	if (ret < 0)
		c->err = ret;
	return ret;
}

int st_comm_reduce_scatter(struct st_comm *c, const void *send, void *recv,
			   size_t slice_elems, enum st_comm_dtype dt)
{
	struct comm_call a = { .kind = ST_COMM_REDUCE_SCATTER, .send = send, .recv = recv,
				  .elems = slice_elems, .dt = dt };

	return comm_call(c, &a);
}

int st_comm_allreduce(struct st_comm *c, const void *send, void *recv,
		      size_t count_elems, enum st_comm_dtype dt)
{
	struct comm_call a = { .kind = ST_COMM_ALLREDUCE, .send = send, .recv = recv,
				  .elems = count_elems, .dt = dt };

	return comm_call(c, &a);
}

int st_comm_allgather(struct st_comm *c, const void *send, void *recv,
		      size_t slice_elems, enum st_comm_dtype dt)
{
	struct comm_call a = { .kind = ST_COMM_ALLGATHER, .send = send, .recv = recv,
				  .elems = slice_elems, .dt = dt };

	return comm_call(c, &a);
}

int st_comm_alltoall(struct st_comm *c, const void *send, void *recv,
		     size_t slice_elems, enum st_comm_dtype dt)
{
	struct comm_call a = { .kind = ST_COMM_ALLTOALL, .send = send, .recv = recv,
				  .elems = slice_elems, .dt = dt };

	return comm_call(c, &a);
}

int st_comm_broadcast(struct st_comm *c, const void *send, void *recv,
		      size_t count_elems, enum st_comm_dtype dt, int root)
{
	struct comm_call a = { .kind = ST_COMM_BROADCAST, .send = send, .recv = recv,
				  .elems = count_elems, .dt = dt, .root = root };

	return comm_call(c, &a);
}

/* ---- ordering ------------------------------------------------------------------ */

int st_comm_record(struct st_comm *c, struct st_event *e)
{
	int ret;

	assert(c && e);
	if (c->err)
		return c->err;
	ret = st_event_record(c->dev, e, c->q);
	if (ret < 0)
		c->err = ret;
	return ret;
}

int st_comm_wait(struct st_comm *c, struct st_event *e)
{
	int ret;

	assert(c && e);
	if (c->err)
		return c->err;
	ret = st_queue_wait(c->dev, c->q, e);
	if (ret < 0)
		c->err = ret;
	return ret;
}

int st_comm_sync(struct st_comm *c)
{
	int ret;

	assert(c);
	ret = c->ops->sync ? c->ops->sync(c) : st_queue_sync(c->dev, c->q);
	if (!c->err && c->ops->async_error)
		c->err = c->ops->async_error(c);
	if (c->err)
		ret = c->err;
	c->err = 0;
	return ret;
}

int st_comm_take_error(struct st_comm *c)
{
	int err;

	assert(c);
	if (!c->err && c->ops->async_error)
		c->err = c->ops->async_error(c);
	err = c->err;
	c->err = 0;
	return err;
}

void st_comm_get_stats(const struct st_comm *c, struct st_comm_stats *s)
{
	assert(c && s);
	memset(s, 0, sizeof(*s));
	for (int k = 0; k < ST_COMM_KINDS; k++) {
		s->kind[k].calls = c->calls[k];
		s->kind[k].bytes = c->bytes[k];
		s->kind[k].busy_ns = atomic_load(&c->busy_ns[k]);
	}
}

/* ---- host-side agreement -------------------------------------------------------- */

int st_comm_host_allgather(struct st_comm *c, const void *send, void *recv, size_t bytes)
{
	assert(c && (send || !bytes) && (recv || !bytes));
	if (c->world == 1) {
		if (bytes && send != recv)
			memmove(recv, send, bytes);
		return 0;
	}
	if (!c->ops->host_allgather)
		return st_error_set(-ENOTSUP, "comm '%s': no host-side exchange at world %d",
				    c->ops->name, c->world);
	return c->ops->host_allgather(c, send, recv, bytes);
}

double st_comm_set_timeout(struct st_comm *c, double timeout_s)
{
	double old = c->timeout_s;

	assert(c);
	if (!c->ops->set_timeout)
		return 0;
	c->ops->set_timeout(c, timeout_s);
	c->timeout_s = timeout_s > 0 ? timeout_s : 0;
	return old;
}

int st_comm_barrier(struct st_comm *c)
{
	unsigned char one = 1, *all;
	int ret;

	if (c->world == 1)
		return 0;
	all = malloc((size_t)c->world);
	if (!all)
		return st_error_set(-ENOMEM, "comm: out of memory for a barrier");
	ret = st_comm_host_allgather(c, &one, all, 1);
	free(all);
	return ret;
}

int st_comm_host_broadcast(struct st_comm *c, void *buf, size_t bytes, int root)
{
	char *all;
	int ret;

	assert(c && (buf || !bytes));
	if (root < 0 || root >= c->world)
		return st_error_set(-EINVAL, "comm host broadcast: root %d outside world %d", root,
				    c->world);
	if (c->world == 1 || bytes == 0)
		return 0;
	if (bytes > SIZE_MAX / (size_t)c->world)
		return st_error_set(-EOVERFLOW, "comm host broadcast: %zu bytes overflow", bytes);
	all = malloc(bytes * (size_t)c->world);
	if (!all)
		return st_error_set(-ENOMEM, "comm host broadcast: out of memory for %zu bytes",
				    bytes * (size_t)c->world);
	ret = st_comm_host_allgather(c, buf, all, bytes);
	if (ret == 0)
		memcpy(buf, all + (size_t)root * bytes, bytes);
	free(all);
	return ret;
}

/* Line i's text as st_comm_agree() reports it: cut to fit, "(none)" past n. */
static void comm_agree_text(char *dst, const char *const *lines, int n, int i)
{
	const char *t = i < n ? (lines[i] ? lines[i] : "") : "(none)";
	size_t len = strlen(t);

	if (len < ST_COMM_AGREE_TEXT) {
		memcpy(dst, t, len + 1);
		return;
	}
	memcpy(dst, t, ST_COMM_AGREE_TEXT - 4);
	memcpy(dst + ST_COMM_AGREE_TEXT - 4, "...", 4);
}

int st_comm_agree(struct st_comm *c, const char *const *lines, int n,
		  struct st_comm_disagreement *out)
{
	size_t w = (size_t)c->world;
	int64_t mine = n, *ns = NULL;
	uint64_t *h = NULL, *hs = NULL;
	char (*texts)[ST_COMM_AGREE_TEXT] = NULL;
	char text[ST_COMM_AGREE_TEXT];
	int max_n = n, line = -1, rank = -1, ret;

	assert(c && n >= 0 && (lines || n == 0));
	ns = calloc(w, sizeof(*ns));
	if (!ns)
		return st_error_set(-ENOMEM, "comm agree: out of memory");
	ret = st_comm_host_allgather(c, &mine, ns, sizeof(mine));
	if (ret < 0)
		goto out;
	for (size_t q = 0; q < w; q++)
		max_n = (int)ST_MAX((int64_t)max_n, ns[q]);
	/* One hash per line, 0 past this rank's n (the counts tell missing
	 * lines apart). */
	h = calloc((size_t)max_n + 1, sizeof(*h));
	hs = calloc(w * ((size_t)max_n + 1), sizeof(*hs));
	if (!h || !hs) {
		ret = st_error_set(-ENOMEM, "comm agree: out of memory for %d lines", max_n);
		goto out;
	}
	for (int i = 0; i < n; i++)
		h[i] = XXH3_64bits(lines[i] ? lines[i] : "", lines[i] ? strlen(lines[i]) : 0);
	ret = st_comm_host_allgather(c, h, hs, ((size_t)max_n + 1) * sizeof(*h));
	if (ret < 0)
		goto out;
	for (int i = 0; i < max_n && line < 0; i++)
		for (size_t q = 1; q < w && line < 0; q++) {
			bool have0 = i < ns[0], haveq = i < ns[q];
			const uint64_t *h0 = hs, *hq = hs + q * ((size_t)max_n + 1);

			if (have0 != haveq || (have0 && h0[i] != hq[i])) {
				line = i;
				rank = (int)q;
			}
		}
	if (line < 0)
		goto out; /* ret == 0: all agree */
	/* Every rank learns the texts of the line that differs. */
	texts = calloc(w, sizeof(*texts));
	if (!texts) {
		ret = st_error_set(-ENOMEM, "comm agree: out of memory");
		goto out;
	}
	comm_agree_text(text, lines, n, line);
	ret = st_comm_host_allgather(c, text, texts, sizeof(text));
	if (ret < 0)
		goto out;
	if (out) {
		out->line = line;
		out->rank = rank;
		memcpy(out->rank0_text, texts[0], ST_COMM_AGREE_TEXT);
		memcpy(out->rank_text, texts[rank], ST_COMM_AGREE_TEXT);
		out->rank0_text[ST_COMM_AGREE_TEXT - 1] = 0;
		out->rank_text[ST_COMM_AGREE_TEXT - 1] = 0;
	}
	st_comm_exit_together();
	ret = 1;
out:
	free(ns);
	free(h);
	free(hs);
	free(texts);
	return ret;
}

const char *st_comm_disagreement_line(const struct st_comm_disagreement *d, char *buf,
				      size_t bytes)
{
	snprintf(buf, bytes, "ranks disagree at line %d: rank 0 has '%s', rank %d has '%s'",
		 d->line, d->rank0_text, d->rank, d->rank_text);
	return buf;
}

void st_comm_exit_together(void)
{
	atomic_store(&st_comm_exit_alike, true);
}

_Noreturn void st_comm_abort(struct st_comm *c, int code)
{
	fflush(stdout);
	fflush(stderr);
	if (c && c->ops->abort)
		c->ops->abort(c, code);
	exit(code);
}
