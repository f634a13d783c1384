/* The nccl comm backend: N ranks over NCCL, for the cuda device.
 *
 * The communicator: under a launcher (st_comm_launch) and with MPI built,
 * MPI gives rank and world, rank 0 makes the ncclUniqueId and MPI_Bcast
 * sends it to the others (on a communicator of the comm's own), and
 * ncclCommInitRank joins them. Without a launcher it is world 1 (its own
 * unique id), which runs the whole engine through NCCL on one GPU.
 *
 * The collectives go on the comm's own queue (its CUDA stream):
 * all-to-all as a group of ncclSend / ncclRecv (out of place only: a
 * backend that cannot do all-to-all in place at world > 1 says -ENOTSUP,
 * strata/comm.h), ncclAllGather (in place when send is the rank's slot of
 * recv), ncclBroadcast. Like mpi, it leaves the reductions to the core's
 * rank-order composition (ncclReduceScatter promises no order), and gives
 * the local sum as a kernel (nccl_sum_kernels.cuh), so the result is the
 * fold of strata/comm.h, the same bits as the mpi backend's.
 *
 * Errors: a failed enqueue is returned at once; an asynchronous one (a
 * peer gone, a network error) comes back through async_error
 * (ncclCommGetAsyncError). abort ends the job: ncclCommAbort, then
 * MPI_Abort when MPI started the world.
 *
 * NCCL refuses two ranks on one GPU, so a world > 1 needs a GPU a rank;
 * the rank takes the GPU of its local rank (st_comm_launch's, or MPI's
 * node rank), which the engine opens the cuda device on. */
#include "strata/comm.h"

#include "strata/device.h"

#include "nccl_cuda.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef ST_HAVE_MPI
#include "mpi_world.h"
#endif

/* libnccl is loaded on first use (nccl_load()), not linked, as cuBLASLt
 * is (src/backend/kernels/cuda/matmul.cu): it is 200 MB, every strata program would
 * map it and every bundle of a build's libraries (tools/gpu-check) would
 * carry it, while only a cuda run with this backend needs it. */
#define NCCL_FUNCS(X)                                                                   \
	X(GetVersion) X(GetUniqueId) X(CommInitRank) X(CommDestroy) X(CommAbort)         \
	X(CommGetAsyncError) X(GetErrorString) X(GetLastError) X(GroupStart) X(GroupEnd) \
	X(Send) X(Recv) X(AllGather) X(Broadcast)

static struct { /* nc.Send is ncclSend */
#define NCCL_MEMBER(f) __typeof__(&nccl##f) f;
	NCCL_FUNCS(NCCL_MEMBER)
#undef NCCL_MEMBER
} nc;
static pthread_once_t nc_once = PTHREAD_ONCE_INIT;
static int nc_err;
static char nc_error[512];

#define NCCL_SONAME "libnccl.so." ST_STR(NCCL_MAJOR)
#define ST_STR(x) ST_STR_(x)
#define ST_STR_(x) #x

static void nccl_load_once(void)
{
	/* The loader's paths first (LD_LIBRARY_PATH, ldconfig), then the
	 * toolkit's this build found it in. */
	static const char *const names[] = { NCCL_SONAME, ST_NCCL_DIR "/" NCCL_SONAME };
	void *h = NULL;

	for (size_t i = 0; i < ST_ARRAY_LEN(names) && !h; i++)
		h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		nc_err = -ENOENT;
		snprintf(nc_error, sizeof(nc_error), "nccl: cannot load %s: %s", NCCL_SONAME,
			 dlerror());
		return;
	}
#define NCCL_LOAD(f)                                                                  \
	if (!nc_err && !(nc.f = (__typeof__(nc.f))dlsym(h, "nccl" #f))) {             \
		nc_err = -ENOENT;                                                      \
		snprintf(nc_error, sizeof(nc_error), "nccl: %s has no nccl%s", NCCL_SONAME, #f); \
	}
	NCCL_FUNCS(NCCL_LOAD)
#undef NCCL_LOAD
}

/* 0 once every function of libnccl is there, else -ENOENT (detail set). */
static int nccl_load(void)
{
	pthread_once(&nc_once, nccl_load_once);
	if (nc_err)
		return st_error_set(nc_err, "%s", nc_error);
	return 0;
}

struct nccl_priv {
	ncclComm_t comm;
	cudaStream_t stream; /* the comm's queue */
	int ordinal;         /* its GPU: entered before a launch on it */
	int rank, world, local_rank;
#ifdef ST_HAVE_MPI
	bool mpi;     /* MPI made the world */
	MPI_Comm ctl; /* the unique id, the host-side exchanges */
	struct st_mpi_watch watch;
#endif
	bool async_reported;
	bool aborted;     /* ncclCommAbort was called: no destroy */
	double timeout_s; /* sync's watchdog; <= 0 (and at world 1): none */
};

static void nccl_abort(struct st_comm *c, int code);

static int nccl_err(ncclResult_t r, const char *what)
{
	const char *last = nc.GetLastError(NULL);

	return st_error_set(r == ncclInvalidArgument || r == ncclInvalidUsage ? -EINVAL : -EIO,
			    "nccl: %s: %s%s%s", what, nc.GetErrorString(r),
			    last && *last ? ": " : "", last ? last : "");
}

#define NCCL_CHECK(call, what)                          \
	do {                                            \
		ncclResult_t r_ = (call);               \
		if (r_ != ncclSuccess)                  \
			return nccl_err(r_, what);      \
	} while (0)

static ncclDataType_t nccl_type(enum st_comm_dtype dt)
{
	switch (dt) {
	case ST_COMM_F32:
		return ncclFloat32;
	case ST_COMM_F64:
		return ncclFloat64;
	default:
		return ncclBfloat16; /* moved, never reduced */
	}
}

static int nccl_library(char *buf, size_t bytes)
{
	int v = 0;

	if (nccl_load() < 0) {
		snprintf(buf, bytes, "not loadable (%s)", nc_error);
		return 0;
	}
	NCCL_CHECK(nc.GetVersion(&v), "ncclGetVersion");
	/* NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z since 2.9. */
	snprintf(buf, bytes, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
	return 0;
}

/* Rank, world, local rank and the unique id: MPI under a launcher, else
 * world 1. */
static int nccl_world(struct nccl_priv *p, const struct st_comm_config *cfg, ncclUniqueId *id)
{
	struct st_comm_launch l;

	st_comm_launch(&l);
	p->rank = 0;
	p->world = 1;
	p->local_rank = 0;
#ifdef ST_HAVE_MPI
	if (l.launcher) {
		int ret = st_mpi_start(), rc;

		if (ret < 0)
			return ret;
		/* the watchdog first: MPI_Comm_dup is the first collective (as
		 * in mpi.c) */
		MPI_Comm_rank(MPI_COMM_WORLD, &p->rank);
		MPI_Comm_size(MPI_COMM_WORLD, &p->world);
		p->timeout_s = st_mpi_timeout(cfg->timeout_s);
		ret = st_mpi_watch_start(&p->watch, "comm nccl", p->rank, p->world, p->timeout_s);
		if (ret < 0)
			return ret;
		st_mpi_watch_enter(&p->watch, ST_MPI_WATCH_HOST, "MPI_Comm_dup (the comm's start)");
		rc = MPI_Comm_dup(MPI_COMM_WORLD, &p->ctl);
		if (rc != MPI_SUCCESS) {
			st_mpi_watch_stop(&p->watch);
			return st_mpi_err(rc, "MPI_Comm_dup");
		}
		MPI_Comm_set_errhandler(p->ctl, MPI_ERRORS_RETURN);
		p->mpi = true;
		ret = st_mpi_node_rank(p->ctl, &p->local_rank);
		st_mpi_watch_leave(&p->watch, ST_MPI_WATCH_HOST);
		if (ret < 0)
			return ret;
		if (p->rank == 0)
			NCCL_CHECK(nc.GetUniqueId(id), "ncclGetUniqueId");
		st_mpi_watch_enter(&p->watch, ST_MPI_WATCH_HOST, "MPI_Bcast (ncclUniqueId)");
		rc = MPI_Bcast(id, (int)sizeof(*id), MPI_BYTE, 0, p->ctl);
		st_mpi_watch_leave(&p->watch, ST_MPI_WATCH_HOST);
		if (rc != MPI_SUCCESS)
			return st_mpi_err(rc, "MPI_Bcast (ncclUniqueId)");
		return 0;
	}
#else
	ST_UNUSED(cfg);
	if (l.launcher && l.world > 1)
		return st_error_set(-ENOTSUP,
				    "comm nccl: launched by %s as rank %d of %d, but this strata was built without MPI, which starts nccl's world",
				    l.launcher, l.rank, l.world);
#endif
	NCCL_CHECK(nc.GetUniqueId(id), "ncclGetUniqueId");
	return 0;
}

static void nccl_world_close(struct nccl_priv *p)
{
#ifdef ST_HAVE_MPI
	if (p->mpi) {
		st_mpi_watch_stop(&p->watch);
		MPI_Comm_free(&p->ctl);
		p->mpi = false;
	}
#else
	ST_UNUSED(p);
#endif
}

static int nccl_open(struct st_comm *c, const struct st_comm_config *cfg, int *rank, int *world)
{
	struct nccl_priv *p = st_comm_priv(c);
	struct st_device *d = st_comm_device(c);
	ncclUniqueId id;
	ncclResult_t r;
	cudaError_t e;
	int ret;

	if (strcmp(st_device_name(d), "cuda") != 0)
		return st_error_set(-ENOTSUP, "comm nccl: device '%s' is not cuda; use mpi",
				    st_device_name(d));
	ret = nccl_load();
	if (ret < 0)
		return ret;
	p->stream = st_cuda_queue_stream(st_comm_queue(c));
	p->ordinal = st_device_ordinal(d);
	e = cudaSetDevice(p->ordinal);
	if (e != cudaSuccess) {
		cudaGetLastError(); /* reported here, not by the next launch */
		return st_error_set(-ENODEV, "comm nccl: cudaSetDevice(%d): %s",
				    st_device_ordinal(d), cudaGetErrorString(e));
	}
	ret = nccl_world(p, cfg, &id);
	if (ret < 0) {
		nccl_world_close(p);
		return ret;
	}
	r = nc.CommInitRank(&p->comm, p->world, id, p->rank);
	if (r != ncclSuccess) {
		ret = nccl_err(r, "ncclCommInitRank");
		nccl_world_close(p);
		return ret;
	}
	*rank = p->rank;
	*world = p->world;
	return 0;
}

static void nccl_close(struct st_comm *c)
{
	struct nccl_priv *p = st_comm_priv(c);

	if (!p->aborted)
		nc.CommDestroy(p->comm);
	nccl_world_close(p);
}

/* After ncclCommAbort the communicator is freed: every later collective
 * fails here instead of handing it to NCCL (as the mpi backend fails every
 * call after an MPI error). */
static int nccl_gone(void)
{
	return st_error_set(-EIO, "comm nccl: the communicator was aborted after an earlier "
			    "error; this comm is unusable");
}

static int nccl_alltoall(struct st_comm *c, const void *send, void *recv, size_t slice_elems,
			 enum st_comm_dtype dt)
{
	struct nccl_priv *p = st_comm_priv(c);
	size_t slice_bytes = slice_elems * st_comm_dtype_bytes(dt);
	ncclDataType_t t = nccl_type(dt);

	if (p->aborted)
		return nccl_gone();
	if (send == recv)
		return st_error_set(-ENOTSUP,
				    "comm nccl: all-to-all in place at world %d (send and recv must differ)",
				    p->world);
	NCCL_CHECK(nc.GroupStart(), "ncclGroupStart");
	for (int q = 0; q < p->world; q++) {
		ncclResult_t r = nc.Send((const char *)send + (size_t)q * slice_bytes, slice_elems,
					  t, q, p->comm, p->stream);

		if (r == ncclSuccess)
			r = nc.Recv((char *)recv + (size_t)q * slice_bytes, slice_elems, t, q,
				     p->comm, p->stream);
		if (r != ncclSuccess) {
			nc.GroupEnd();
			return nccl_err(r, "ncclSend/ncclRecv");
		}
	}
	NCCL_CHECK(nc.GroupEnd(), "ncclGroupEnd (all-to-all)");
	return 0;
}

static int nccl_allgather(struct st_comm *c, const void *send, void *recv, size_t slice_elems,
			  enum st_comm_dtype dt)
{
	struct nccl_priv *p = st_comm_priv(c);

	if (p->aborted)
		return nccl_gone();

	NCCL_CHECK(nc.AllGather(send, recv, slice_elems, nccl_type(dt), p->comm, p->stream),
		   "ncclAllGather");
	return 0;
}

static int nccl_broadcast(struct st_comm *c, const void *send, void *recv, size_t count_elems,
			  enum st_comm_dtype dt, int root)
{
	struct nccl_priv *p = st_comm_priv(c);

	if (p->aborted)
		return nccl_gone();

	NCCL_CHECK(nc.Broadcast(send, recv, count_elems, nccl_type(dt), root, p->comm, p->stream),
		   "ncclBroadcast");
	return 0;
}

static int nccl_reduce_local(struct st_comm *c, const void *in, void *out, size_t count_elems,
			     int terms, enum st_comm_dtype dt)
{
	struct nccl_priv *p = st_comm_priv(c);

	cudaError_t e;

	if (p->aborted)
		return nccl_gone();
	/* a launch goes to the calling thread's current device: the stream's */
	e = cudaSetDevice(p->ordinal);
	if (e != cudaSuccess) {
		cudaGetLastError();
		return st_error_set(-ENODEV, "comm nccl: cudaSetDevice(%d): %s", p->ordinal,
				    cudaGetErrorString(e));
	}
	return st_comm_cuda_fold(in, out, count_elems, terms, st_comm_dtype_bytes(dt), p->stream);
}

static int nccl_async_error(struct st_comm *c)
{
	struct nccl_priv *p = st_comm_priv(c);
	ncclResult_t r = ncclSuccess;

	if (p->async_reported || p->aborted)
		return 0;
	if (nc.CommGetAsyncError(p->comm, &r) != ncclSuccess || r == ncclSuccess ||
	    r == ncclInProgress)
		return 0;
	p->async_reported = true;
#ifdef ST_HAVE_MPI
	st_mpi_failed();
#endif
	return nccl_err(r, "a collective (ncclCommGetAsyncError)");
}

/* Wait for the comm's stream by polling it, so a collective that never
 * ends (a peer stuck or gone without mpirun seeing it) or fails inside
 * NCCL is seen: an asynchronous error aborts the communicator (its kernels
 * end, the stream drains) and returns -EIO; past the timeout the job ends,
 * naming this rank, as the mpi backend's watchdog does. */
static int nccl_sync(struct st_comm *c)
{
	struct nccl_priv *p = st_comm_priv(c);
	uint64_t t0 = st_now_ns();
	unsigned nap_us = 1;

	for (;;) {
		cudaError_t e = cudaStreamQuery(p->stream);
		ncclResult_t r = ncclSuccess;

		if (e == cudaSuccess)
			return 0;
		/* NotReady is no error, and a failure is reported here: neither
		 * may stay in the last-error state, where the next launch check
		 * (cudaGetLastError() after every kernel) would take it for its
		 * own failure */
		cudaGetLastError();
		if (e != cudaErrorNotReady)
			return st_error_set(-EIO, "comm nccl: the comm's stream: %s",
					    cudaGetErrorString(e));
		if (!p->aborted && nc.CommGetAsyncError(p->comm, &r) == ncclSuccess &&
		    r != ncclSuccess && r != ncclInProgress) {
			int ret = nccl_err(r, "a collective (ncclCommGetAsyncError)");

			nc.CommAbort(p->comm);
			p->aborted = true;
			p->async_reported = true;
#ifdef ST_HAVE_MPI
			st_mpi_failed();
#endif
			return ret;
		}
		if (p->world > 1 && p->timeout_s > 0 &&
		    (double)(st_now_ns() - t0) > p->timeout_s * 1e9) {
			fprintf(stderr,
				"strata: rank %d of %d: nccl collectives have waited %.1f s for their peers (timeout %g s, ST_COMM_TIMEOUT); a rank is stuck or gone: ending the job\n",
				p->rank, p->world, (double)(st_now_ns() - t0) / 1e9, p->timeout_s);
			nccl_abort(c, 1);
		}
		usleep(nap_us);
		nap_us = nap_us < 1000 ? nap_us * 2 : 1000;
	}
}

static int nccl_host_allgather(struct st_comm *c, const void *send, void *recv, size_t bytes)
{
	struct nccl_priv *p = st_comm_priv(c);

#ifdef ST_HAVE_MPI
	if (p->mpi)
		return st_mpi_allgather_bytes(p->ctl, &p->watch, send, recv, bytes);
#else
	ST_UNUSED(send);
	ST_UNUSED(recv);
	ST_UNUSED(bytes);
#endif
	return st_error_set(-ENOTSUP, "comm nccl: no host-side exchange at world %d without MPI",
			    p->world);
}

static int nccl_local_rank(struct st_comm *c)
{
	return ((struct nccl_priv *)st_comm_priv(c))->local_rank;
}

static void nccl_set_timeout(struct st_comm *c, double timeout_s)
{
	struct nccl_priv *p = st_comm_priv(c);

	p->timeout_s = timeout_s;
#ifdef ST_HAVE_MPI
	if (p->mpi)
		st_mpi_watch_set(&p->watch, timeout_s);
#endif
}

static void nccl_abort(struct st_comm *c, int code)
{
	struct nccl_priv *p = st_comm_priv(c);

	if (!p->aborted)
		nc.CommAbort(p->comm);
	p->aborted = true;
#ifdef ST_HAVE_MPI
	if (p->mpi)
		st_mpi_abort(code);
#endif
	exit(code);
}

const struct st_comm_ops st_comm_nccl_ops = {
	.name = "nccl",
	.version = ST_COMM_OPS_VERSION,
	.priv_bytes = sizeof(struct nccl_priv),
	.open = nccl_open,
	.close = nccl_close,
	.alltoall = nccl_alltoall,
	.allgather = nccl_allgather,
	.broadcast = nccl_broadcast,
	/* reduce_scatter, allreduce: absent, the core composes them in rank
	 * order. */
	.reduce_local = nccl_reduce_local,
	.async_error = nccl_async_error,
	.host_allgather = nccl_host_allgather,
	.local_rank = nccl_local_rank,
	.abort = nccl_abort,
	.sync = nccl_sync,
	.set_timeout = nccl_set_timeout,
	.library = nccl_library,
};
