/* The mpi comm backend: N ranks over MPI (Open MPI), for the cpu device.
 *
 * Each collective is one host function on the comm's queue (on the cpu
 * device, its worker thread), which makes the blocking MPI call there:
 * MPI_Alltoall, MPI_Allgather, MPI_Bcast (with MPI_IN_PLACE for the
 * in-place forms) on a communicator of the comm's own. The reductions are
 * left to the core, which composes them in rank order (all-to-all or
 * allgather into the scratch, then its local sum): MPI's reductions promise
 * no order, so this backend never calls one.
 *
 * The queue thread cannot return an error, so a failed call keeps the
 * first error here (MPI_ERRORS_RETURN on the comm's communicators), skips
 * every later call of the comm, and the core picks it up through the
 * async_error hook (sticky from then on).
 *
 * Faults. A rank that dies (SIGKILL) is seen by mpirun, which kills the
 * other ranks and names the dead one (Open MPI's default). What mpirun
 * cannot see, a rank alive but absent (stuck, or gone to MPI_Finalize
 * while its peers wait in a collective), the watchdog catches: a
 * collective or a host-side exchange that waits longer than the timeout
 * (st_comm_config.timeout_s, $ST_COMM_TIMEOUT, 300 s) prints one line
 * naming this rank and ends the job with MPI_Abort. */
#include "strata/comm.h"

#include "strata/device.h"

#include "comm_internal.h"
#include "mpi_world.h"
#ifdef ST_COMM_CUDA_FOLD
#include "nccl_cuda.h"
#endif

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- the process's MPI (shared with nccl.c) -------------------------------------- */

static pthread_mutex_t st_mpi_lock = PTHREAD_MUTEX_INITIALIZER;
static bool st_mpi_started; /* by st_mpi_start (by us or by the program) */
static atomic_bool st_mpi_bad; /* a comm failed: abort at exit */

/* At exit (on_exit: it sees the status). A clean exit, or one every rank
 * makes alike (a disagreement st_comm_agree found), finishes MPI. Any
 * other non-zero exit, or one after a comm error, aborts the whole job
 * at once: MPI_Finalize would wait for peers that wait in a collective
 * for this rank, until their watchdog fired (measured: the whole
 * timeout). */
static void mpi_on_exit(int status, void *arg)
{
	int fin = 0, rank = -1, world = 0;

	ST_UNUSED(arg);
	MPI_Finalized(&fin);
	if (fin)
		return;
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	if (world > 1 && (atomic_load(&st_mpi_bad) ||
			  (status != 0 && !atomic_load(&st_comm_exit_alike)))) {
		MPI_Comm_rank(MPI_COMM_WORLD, &rank);
		fprintf(stderr,
			"strata: rank %d of %d exits with status %d while its peers may wait for it: ending the job\n",
			rank, world, status);
		st_mpi_abort(status ? status : 1);
	}
	/* A peer that died, or aborted while mpirun could not end the job
	 * (seen under load: rank 0 aborted, this rank waited in MPI_Finalize's
	 * fence until the test's limit), would hold the fence forever: wait
	 * at most the comm's timeout, then SIGALRM's default action ends this
	 * rank, and with it the job. */
	double t = st_comm_env_timeout();

	signal(SIGALRM, SIG_DFL);
	alarm(t > 0 ? (unsigned)ceil(t) : 0);
	MPI_Finalize();
	alarm(0);
}

int st_mpi_err(int code, const char *what)
{
	char msg[MPI_MAX_ERROR_STRING];
	int len = 0;

	if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS)
		snprintf(msg, sizeof(msg), "error %d", code);
	return st_error_set(-EIO, "mpi: %s: %s", what, msg);
}

int st_mpi_library(char *buf, size_t bytes)
{
	char v[MPI_MAX_LIBRARY_VERSION_STRING];
	int len = 0;

	if (MPI_Get_library_version(v, &len) != MPI_SUCCESS)
		return st_error_set(-EIO, "mpi: MPI_Get_library_version failed");
	v[strcspn(v, "\n")] = 0;
	snprintf(buf, bytes, "%s", v);
	return 0;
}

void st_mpi_failed(void)
{
	atomic_store(&st_mpi_bad, true);
}

_Noreturn void st_mpi_abort(int code)
{
	fflush(stdout);
	fflush(stderr);
	/* If MPI_Abort itself stalls (a queue thread inside MPI after an
	 * error, a peer in MPI_Finalize's fence; seen once in CI: the job
	 * hung after "MPI_ABORT was invoked"), SIGALRM's default action ends
	 * this process, and mpirun ends a job whose rank died of a signal. */
	signal(SIGALRM, SIG_DFL);
	alarm(15);
	MPI_Abort(MPI_COMM_WORLD, code);
	_exit(code); /* MPI_Abort does not return; in case it does */
}

int st_mpi_start(void)
{
	struct st_comm_launch l;
	int inited = 0, fin = 0, level = 0, world = 0, ret = 0, rc;

	pthread_mutex_lock(&st_mpi_lock);
	MPI_Finalized(&fin);
	if (fin) {
		ret = st_error_set(-EINVAL, "mpi: MPI was finished already in this process");
		goto out;
	}
	MPI_Initialized(&inited);
	if (!inited) {
		rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &level);
		if (rc != MPI_SUCCESS) {
			ret = st_mpi_err(rc, "MPI_Init_thread");
			goto out;
		}
		on_exit(mpi_on_exit, NULL);
	} else {
		MPI_Query_thread(&level);
	}
	if (level < MPI_THREAD_MULTIPLE) {
		ret = st_error_set(-ENOTSUP,
				   "mpi: thread level %d, strata needs MPI_THREAD_MULTIPLE (%d): collectives run on the comm's queue thread",
				   level, MPI_THREAD_MULTIPLE);
		goto out;
	}
	if (!st_mpi_started) {
		MPI_Comm_size(MPI_COMM_WORLD, &world);
		st_comm_launch(&l);
		if (l.world > 0 && l.world != world) {
			ret = st_error_set(-EINVAL,
					   "mpi: %s launched %d ranks but MPI sees a world of %d (srun without --mpi=pmix?)",
					   l.launcher, l.world, world);
			goto out;
		}
		st_mpi_started = true;
	}
out:
	pthread_mutex_unlock(&st_mpi_lock);
	return ret;
}

int st_mpi_node_rank(MPI_Comm comm, int *out)
{
	MPI_Comm node;
	int rc;

	rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
	if (rc != MPI_SUCCESS)
		return st_mpi_err(rc, "MPI_Comm_split_type");
	MPI_Comm_rank(node, out);
	MPI_Comm_free(&node);
	return 0;
}

/* ---- the watchdog ----------------------------------------------------------------- */

double st_mpi_timeout(double cfg_timeout_s)
{
	/* st_comm_create() resolved 0 ($ST_COMM_TIMEOUT, 300) already. */
	return cfg_timeout_s != 0 ? cfg_timeout_s : 300.0;
}

static void *mpi_watch_main(void *arg)
{
	struct st_mpi_watch *w = arg;

	pthread_mutex_lock(&w->lock);
	while (!w->stop) {
		uint64_t limit_ns = atomic_load(&w->limit_ns);
		/* Look four times a timeout, at most every second. */
		uint64_t tick_ns = limit_ns ? ST_MIN(limit_ns / 4 + 1, 1000000000ull) : 1000000000ull;
		struct timespec ts;
		uint64_t now, at;

		clock_gettime(CLOCK_REALTIME, &ts);
		at = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + tick_ns;
		ts.tv_sec = (time_t)(at / 1000000000ull);
		ts.tv_nsec = (long)(at % 1000000000ull);
		pthread_cond_timedwait(&w->cond, &w->lock, &ts);
		if (w->stop)
			break;
		limit_ns = atomic_load(&w->limit_ns);
		if (!limit_ns)
			continue;
		now = st_now_ns();
		for (int s = 0; s < ST_MPI_WATCH_SLOTS; s++) {
			uint64_t since = atomic_load(&w->since_ns[s]);

			if (since && now > since && now - since > limit_ns) {
				fprintf(stderr,
					"strata: rank %d of %d: %s has waited %.1f s for its peers (timeout %g s, ST_COMM_TIMEOUT); a rank is stuck or gone: ending the job\n",
					w->rank, w->world, atomic_load(&w->what[s]),
					(double)(now - since) / 1e9, (double)limit_ns / 1e9);
				st_mpi_abort(1);
			}
		}
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

void st_mpi_watch_set(struct st_mpi_watch *w, double timeout_s)
{
	atomic_store(&w->limit_ns, timeout_s > 0 ? (uint64_t)(timeout_s * 1e9) : 0);
}

double st_mpi_watch_get(const struct st_mpi_watch *w)
{
	return (double)atomic_load(&w->limit_ns) / 1e9;
}

int st_mpi_watch_start(struct st_mpi_watch *w, const char *backend, int rank, int world,
		       double timeout_s)
{
	int rc;

	memset(w, 0, sizeof(*w));
	w->backend = backend;
	w->rank = rank;
	w->world = world;
	st_mpi_watch_set(w, timeout_s);
	if (world == 1)
		return 0;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	rc = pthread_create(&w->thread, NULL, mpi_watch_main, w);
	if (rc) {
		pthread_cond_destroy(&w->cond);
		pthread_mutex_destroy(&w->lock);
		return st_error_set(-rc, "%s: cannot start the watchdog thread", backend);
	}
	w->running = true;
	return 0;
}

void st_mpi_watch_stop(struct st_mpi_watch *w)
{
	if (!w->running)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->thread, NULL);
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
	w->running = false;
}

void st_mpi_watch_enter(struct st_mpi_watch *w, int slot, const char *what)
{
	atomic_store(&w->what[slot], what);
	atomic_store(&w->since_ns[slot], st_now_ns());
}

void st_mpi_watch_leave(struct st_mpi_watch *w, int slot)
{
	atomic_store(&w->since_ns[slot], 0);
}

int st_mpi_allgather_bytes(MPI_Comm comm, struct st_mpi_watch *w, const void *send,
			   void *recv, size_t bytes)
{
	int rc;

	if (bytes > INT_MAX)
		return st_error_set(-EOVERFLOW, "mpi: a host exchange of %zu bytes (at most %d)",
				    bytes, INT_MAX);
	if (w)
		st_mpi_watch_enter(w, ST_MPI_WATCH_HOST, "a host-side exchange (agree, barrier)");
	rc = MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, comm);
	if (w)
		st_mpi_watch_leave(w, ST_MPI_WATCH_HOST);
	if (rc != MPI_SUCCESS) {
		st_mpi_failed();
		return st_mpi_err(rc, "MPI_Allgather (host)");
	}
	return 0;
}

/* ---- the backend ------------------------------------------------------------------- */

/* The staging path: pieces of at most this many bytes a rank (the same on
 * every rank, so every rank cuts a collective alike). $ST_COMM_STAGE_PIECE
 * (bytes, 8 to 1 GiB) changes it for the tests, which cut small buffers
 * into many pieces; mpirun gives every rank the same environment. */
#define MPI_STAGE_BYTES (8u * 1024u * 1024u)

struct mpi_priv {
	/* Staging (cfg.stage_host, or a device the host cannot address):
	 * [0, world * piece_bytes) receives, then world * piece_bytes sends;
	 * pinned through the device. NULL: MPI reads device memory. */
	char *stage;
	size_t stage_bytes, piece_bytes;
	MPI_Comm coll; /* the collectives, on the queue's thread */
	MPI_Comm ctl;  /* host-side exchanges, on the caller's thread */
	int rank, world, local_rank;
	struct st_mpi_watch watch;
	/* The first error of a collective on the queue thread. */
	pthread_mutex_t lock;
	atomic_int failed;   /* set: later collectives are skipped */
	int err;             /* -errno, 0 once handed back */
	char msg[MPI_MAX_ERROR_STRING + 128];
};

/* One queued collective, freed by the queue's function. */
struct mpi_op {
	struct st_comm *c;
	enum st_comm_kind kind;
	const void *send; /* NULL: MPI_IN_PLACE */
	void *recv;
	int count; /* per rank (slice) or the whole (broadcast) */
	size_t bytes; /* broadcast's copy on root */
	MPI_Datatype type;
	int root;
};

static const char *const mpi_call_names[ST_COMM_KINDS] = {
	[ST_COMM_ALLGATHER] = "MPI_Allgather",
	[ST_COMM_ALLTOALL] = "MPI_Alltoall",
	[ST_COMM_BROADCAST] = "MPI_Bcast",
};

static MPI_Datatype mpi_type(enum st_comm_dtype dt)
{
	switch (dt) {
	case ST_COMM_F32:
		return MPI_FLOAT;
	case ST_COMM_F64:
		return MPI_DOUBLE;
	default:
		return MPI_UINT16_T; /* bf16 moves as its bits */
	}
}

static void mpi_fail(struct mpi_priv *p, int rc, const char *what)
{
	char msg[MPI_MAX_ERROR_STRING];
	int len = 0;

	if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
		snprintf(msg, sizeof(msg), "error %d", rc);
	pthread_mutex_lock(&p->lock);
	if (!atomic_load(&p->failed)) {
		p->err = -EIO;
		snprintf(p->msg, sizeof(p->msg), "mpi rank %d: %s: %s", p->rank, what, msg);
		atomic_store(&p->failed, 1);
	}
	pthread_mutex_unlock(&p->lock);
	st_mpi_failed();
}

static void mpi_op_run(void *arg)
{
	struct mpi_op *op = arg;
	struct mpi_priv *p = st_comm_priv(op->c);
	const void *send = op->send ? op->send : MPI_IN_PLACE;
	int rc = MPI_SUCCESS;

	if (atomic_load(&p->failed)) {
		free(op);
		return;
	}
	st_mpi_watch_enter(&p->watch, ST_MPI_WATCH_QUEUE, mpi_call_names[op->kind]);
	switch (op->kind) {
	case ST_COMM_ALLTOALL:
		rc = MPI_Alltoall(send, op->send ? op->count : 0, op->type, op->recv, op->count,
				  op->type, p->coll);
		break;
	case ST_COMM_ALLGATHER:
		rc = MPI_Allgather(send, op->send ? op->count : 0, op->type, op->recv, op->count,
				   op->type, p->coll);
		break;
	case ST_COMM_BROADCAST:
		if (op->send && p->rank == op->root)
			memcpy(op->recv, op->send, op->bytes);
		rc = MPI_Bcast(op->recv, op->count, op->type, op->root, p->coll);
		break;
	default:
		assert(0);
	}
	st_mpi_watch_leave(&p->watch, ST_MPI_WATCH_QUEUE);
	if (rc != MPI_SUCCESS)
		mpi_fail(p, rc, mpi_call_names[op->kind]);
	free(op);
}

/* One MPI call on the comm's queue: a whole collective on host memory, or
 * a piece between the staging areas (the copies around it are queued by
 * mpi_queue_staged). */
static int mpi_queue_piece(struct st_comm *c, enum st_comm_kind kind, const void *send,
			   void *recv, size_t count, enum st_comm_dtype dt, int root)
{
	struct mpi_op *op = malloc(sizeof(*op));
	int ret;

	if (!op)
		return st_error_set(-ENOMEM, "mpi: out of memory queueing a collective");
	*op = (struct mpi_op){ .c = c, .kind = kind, .send = send, .recv = recv,
			       .count = (int)count, .bytes = count * st_comm_dtype_bytes(dt),
			       .type = mpi_type(dt), .root = root };
	ret = st_device_host_fn(st_comm_device(c), st_comm_queue(c), mpi_op_run, op);
	if (ret < 0)
		free(op);
	return ret;
}

static int mpi_queue_staged(struct st_comm *c, enum st_comm_kind kind, const void *send,
			    void *recv, size_t count, enum st_comm_dtype dt, int root);

static int mpi_queue(struct st_comm *c, enum st_comm_kind kind, const void *send, void *recv,
		     size_t count, enum st_comm_dtype dt, int root)
{
	struct mpi_priv *p = st_comm_priv(c);

	/* After a failed call the ranks' collectives no longer pair up: every
	 * later one fails too (the first error was handed back once). */
	if (atomic_load(&p->failed)) {
		char msg[sizeof(p->msg)];

		pthread_mutex_lock(&p->lock);
		memcpy(msg, p->msg, sizeof(msg));
		pthread_mutex_unlock(&p->lock);
		return st_error_set(-EIO, "%s (earlier: this comm is unusable)", msg);
	}
	if (p->stage)
		return mpi_queue_staged(c, kind, send, recv, count, dt, root);
	if (count > INT_MAX)
		return st_error_set(-EOVERFLOW,
				    "mpi %s: %zu elements per rank, MPI counts stop at %d",
				    st_comm_kind_name(kind), count, INT_MAX);
	return mpi_queue_piece(c, kind, send, recv, count, dt, root);
}

/* ---- staging through host memory ------------------------------------------------ */

static int mpi_stage_open(struct st_comm *c, struct mpi_priv *p)
{
	const char *env = getenv("ST_COMM_STAGE_PIECE");
	int ret;

	p->piece_bytes = MPI_STAGE_BYTES;
	if (env && *env) {
		char *end;
		unsigned long long v = strtoull(env, &end, 10);

		if (*end || v < 8 || v > (1ull << 30))
			return st_error_set(-EINVAL,
					    "comm mpi: ST_COMM_STAGE_PIECE=%s is not a byte count in 8..1073741824",
					    env);
		p->piece_bytes = (size_t)v / 8 * 8;
	}
	p->stage_bytes = st_align_up(2 * (size_t)p->world * p->piece_bytes, ST_PAGE_BYTES);
	p->stage = aligned_alloc(ST_PAGE_BYTES, p->stage_bytes);
	if (!p->stage)
		return st_error_set(-ENOMEM, "comm mpi: out of memory for a %zu-byte staging buffer",
				    p->stage_bytes);
	ret = st_device_pin_host(st_comm_device(c), p->stage, p->stage_bytes);
	if (ret < 0) {
		free(p->stage);
		p->stage = NULL;
	}
	return ret;
}

static void mpi_stage_close(struct st_comm *c, struct mpi_priv *p)
{
	if (!p->stage)
		return;
	st_device_unpin_host(st_comm_device(c), p->stage);
	free(p->stage);
	p->stage = NULL;
}

static int mpi_d2h(struct st_comm *c, void *host, const void *dev, size_t bytes)
{
	return st_device_memcpy_async(st_comm_device(c), st_comm_queue(c), host, dev, bytes,
				      ST_COPY_D2H);
}

static int mpi_h2d(struct st_comm *c, void *dev, const void *host, size_t bytes)
{
	return st_device_memcpy_async(st_comm_device(c), st_comm_queue(c), dev, host, bytes,
				      ST_COPY_H2D);
}

/* A collective on device memory through the staging buffer: pieces of k
 * elements of each rank's slice (k from the count and the world only, so
 * every rank cuts alike); per piece, device -> stage copies of what this
 * rank sends, the MPI call between the stage's send and receive areas,
 * stage -> device copies of what it receives, all in queue order (so one
 * buffer serves every queued piece). In place works: a piece reads only
 * its own offsets of send before its copies back write the same offsets
 * of recv. */
static int mpi_queue_staged(struct st_comm *c, enum st_comm_kind kind, const void *send,
			    void *recv, size_t count, enum st_comm_dtype dt, int root)
{
	struct mpi_priv *p = st_comm_priv(c);
	size_t eb = st_comm_dtype_bytes(dt), w = (size_t)p->world;
	size_t k = p->piece_bytes / eb;
	char *srecv = p->stage, *ssend = p->stage + w * p->piece_bytes;
	const char *s = send ? send : NULL;
	int ret = 0;

	if (kind == ST_COMM_ALLGATHER && !send) /* in place: this rank's slot */
		s = (const char *)recv + (size_t)p->rank * count * eb;
	if (kind == ST_COMM_ALLTOALL && !send)
		s = recv;
	if (kind == ST_COMM_BROADCAST && !send)
		s = recv;
	for (size_t off = 0; off < count && ret == 0; off += k) {
		size_t m = ST_MIN(k, count - off), mb = m * eb;

		switch (kind) {
		case ST_COMM_ALLTOALL:
			for (size_t q = 0; q < w && ret == 0; q++)
				ret = mpi_d2h(c, ssend + q * mb, s + (q * count + off) * eb, mb);
			if (ret == 0)
				ret = mpi_queue_piece(c, kind, ssend, srecv, m, dt, 0);
			for (size_t q = 0; q < w && ret == 0; q++)
				ret = mpi_h2d(c, (char *)recv + (q * count + off) * eb, srecv + q * mb,
					      mb);
			break;
		case ST_COMM_ALLGATHER:
			ret = mpi_d2h(c, ssend, s + off * eb, mb);
			if (ret == 0)
				ret = mpi_queue_piece(c, kind, ssend, srecv, m, dt, 0);
			for (size_t q = 0; q < w && ret == 0; q++)
				ret = mpi_h2d(c, (char *)recv + (q * count + off) * eb, srecv + q * mb,
					      mb);
			break;
		default: /* broadcast: root's piece into the stage, then out */
			if (p->rank == root)
				ret = mpi_d2h(c, srecv, s + off * eb, mb);
			if (ret == 0)
				ret = mpi_queue_piece(c, kind, NULL, srecv, m, dt, root);
			if (ret == 0)
				ret = mpi_h2d(c, (char *)recv + off * eb, srecv, mb);
			break;
		}
	}
	return ret;
}

static int mpi_open(struct st_comm *c, const struct st_comm_config *cfg, int *rank,
		    int *world)
{
	struct mpi_priv *p = st_comm_priv(c);
	int ret, rc;

	ret = st_mpi_start();
	if (ret < 0)
		return ret;
	p->coll = p->ctl = MPI_COMM_NULL;
	/* The watchdog starts before the first collective: MPI_Comm_dup is
	 * one (every rank takes part), and the first a rank can hang in when
	 * a peer never comes (a node that cannot reach this one: Open MPI's
	 * TCP connect waits for ever). MPI_COMM_WORLD's rank and size are
	 * local calls. */
	MPI_Comm_rank(MPI_COMM_WORLD, &p->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &p->world);
	ret = st_mpi_watch_start(&p->watch, "comm mpi", p->rank, p->world,
				 st_mpi_timeout(cfg->timeout_s));
	if (ret < 0)
		return ret;
	st_mpi_watch_enter(&p->watch, ST_MPI_WATCH_HOST, "MPI_Comm_dup (the comm's start)");
	rc = MPI_Comm_dup(MPI_COMM_WORLD, &p->coll);
	if (rc == MPI_SUCCESS)
		rc = MPI_Comm_dup(MPI_COMM_WORLD, &p->ctl);
	if (rc != MPI_SUCCESS) {
		st_mpi_watch_leave(&p->watch, ST_MPI_WATCH_HOST);
		ret = st_mpi_err(rc, "MPI_Comm_dup");
		goto fail;
	}
	MPI_Comm_set_errhandler(p->coll, MPI_ERRORS_RETURN);
	MPI_Comm_set_errhandler(p->ctl, MPI_ERRORS_RETURN);
	ret = st_mpi_node_rank(p->ctl, &p->local_rank);
	st_mpi_watch_leave(&p->watch, ST_MPI_WATCH_HOST);
	if (ret < 0)
		goto fail;
	if (cfg->stage_host || !st_device_unified(st_comm_device(c))) {
		ret = mpi_stage_open(c, p);
		if (ret < 0)
			goto fail;
	}
	pthread_mutex_init(&p->lock, NULL);
	*rank = p->rank;
	*world = p->world;
	return 0;
fail:
	st_mpi_watch_stop(&p->watch);
	if (p->coll != MPI_COMM_NULL)
		MPI_Comm_free(&p->coll);
	if (p->ctl != MPI_COMM_NULL)
		MPI_Comm_free(&p->ctl);
	return ret;
}

static void mpi_close(struct st_comm *c)
{
	struct mpi_priv *p = st_comm_priv(c);

	st_mpi_watch_stop(&p->watch);
	mpi_stage_close(c, p);
	MPI_Comm_free(&p->coll);
	MPI_Comm_free(&p->ctl);
	pthread_mutex_destroy(&p->lock);
}

static int mpi_alltoall(struct st_comm *c, const void *send, void *recv, size_t slice_elems,
			enum st_comm_dtype dt)
{
	return mpi_queue(c, ST_COMM_ALLTOALL, send == recv ? NULL : send, recv, slice_elems, dt,
			 0);
}

static int mpi_allgather(struct st_comm *c, const void *send, void *recv, size_t slice_elems,
			 enum st_comm_dtype dt)
{
	struct mpi_priv *p = st_comm_priv(c);
	const char *mine = (const char *)recv +
			   (size_t)p->rank * slice_elems * st_comm_dtype_bytes(dt);

	return mpi_queue(c, ST_COMM_ALLGATHER, (const void *)mine == send ? NULL : send, recv,
			 slice_elems, dt, 0);
}

static int mpi_broadcast(struct st_comm *c, const void *send, void *recv, size_t count_elems,
			 enum st_comm_dtype dt, int root)
{
	return mpi_queue(c, ST_COMM_BROADCAST, send == recv ? NULL : send, recv, count_elems, dt,
			 root);
}

/* The local sum on a device the host cannot address (the core calls it
 * only there): the fold kernel on the comm's stream for cuda. */
static int mpi_reduce_local(struct st_comm *c, const void *in, void *out, size_t count_elems,
			    int terms, enum st_comm_dtype dt)
{
	struct st_device *d = st_comm_device(c);

#ifdef ST_COMM_CUDA_FOLD
	if (strcmp(st_device_name(d), "cuda") == 0)
		return st_comm_cuda_fold(in, out, count_elems, terms, st_comm_dtype_bytes(dt),
					 st_cuda_queue_stream(st_comm_queue(c)));
#else
	ST_UNUSED(in);
	ST_UNUSED(out);
	ST_UNUSED(count_elems);
	ST_UNUSED(terms);
	ST_UNUSED(dt);
#endif
	return st_error_set(-ENOTSUP, "comm mpi: no local sum for device '%s'",
			    st_device_name(d));
}

static int mpi_async_error(struct st_comm *c)
{
	struct mpi_priv *p = st_comm_priv(c);
	int err = 0;

	if (!atomic_load(&p->failed))
		return 0;
	pthread_mutex_lock(&p->lock);
	if (p->err) {
		err = st_error_set(p->err, "%s", p->msg);
		p->err = 0; /* handed back once; p->failed stays: the world is broken */
	}
	pthread_mutex_unlock(&p->lock);
	return err;
}

static int mpi_host_allgather(struct st_comm *c, const void *send, void *recv, size_t bytes)
{
	struct mpi_priv *p = st_comm_priv(c);

	return st_mpi_allgather_bytes(p->ctl, &p->watch, send, recv, bytes);
}

static int mpi_local_rank(struct st_comm *c)
{
	return ((struct mpi_priv *)st_comm_priv(c))->local_rank;
}

static void mpi_set_timeout(struct st_comm *c, double timeout_s)
{
	st_mpi_watch_set(&((struct mpi_priv *)st_comm_priv(c))->watch, timeout_s);
}

static void mpi_abort(struct st_comm *c, int code)
{
	ST_UNUSED(c);
	st_mpi_abort(code);
}

const struct st_comm_ops st_comm_mpi_ops = {
	.name = "mpi",
	.version = ST_COMM_OPS_VERSION,
	.priv_bytes = sizeof(struct mpi_priv),
	.open = mpi_open,
	.close = mpi_close,
	.alltoall = mpi_alltoall,
	.allgather = mpi_allgather,
	.broadcast = mpi_broadcast,
	/* reduce_scatter, allreduce: absent, the core composes them in rank
	 * order; the local sum is the core's host sum on the cpu device, the
	 * fold kernel on cuda. */
	.reduce_local = mpi_reduce_local,
	.async_error = mpi_async_error,
	.host_allgather = mpi_host_allgather,
	.local_rank = mpi_local_rank,
	.abort = mpi_abort,
	.set_timeout = mpi_set_timeout,
	.library = st_mpi_library,
};
