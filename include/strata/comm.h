/* strata: the communication seam (collectives between data-parallel ranks).
 *
 * A communicator is one rank of a world of N ranks, bound to one device.
 * Its collectives run on a queue of its own on that device (a CUDA stream;
 * on the cpu device a worker thread), ordered against the device's other
 * queues by the device's events exactly as the compute is:
 *   st_comm_record(c, e) marks the end of the collectives called so far, so
 *                        another queue can wait for e (st_queue_wait,
 *                        st_compute_wait, st_tier_io.after);
 *   st_comm_wait(c, e)   makes later collectives wait for an event recorded
 *                        on another queue (the compute's, after bwd(u));
 *   st_comm_sync(c)      returns when every collective called so far is done.
 * Collectives only queue work; the host may not reuse what they read or
 * read what they write before an event recorded after them is done.
 *
 * Buffers are device memory of the communicator's device (its arena; on
 * the cpu device, host pointers inside the arena) and are borrowed until
 * the collective is done. Counts are in elements of the call's dtype.
 * A buffer must be aligned to its element size. (An in-place collective
 * at world 1 touches no memory, so there a host buffer works too, as the
 * engine's host-side norm sum; at world > 1 only the mpi backend on the
 * cpu device takes host memory: nccl, and mpi through host staging,
 * take device memory.)
 *
 * The order promise. strata owns the reduction order, so the result is
 * bit-identical whatever the backend, the topology or the ZeRO stage:
 *   reduce_scatter: rank r's out[i] = fold(in_0[r*n + i], in_1[r*n + i], ...,
 *                   in_{N-1}[r*n + i]), n = slice_elems;
 *   allreduce:      every rank's out[i] = fold(in_0[i], ..., in_{N-1}[i]);
 * where fold(a_0, ..., a_{N-1}) = (((a_0 + a_1) + a_2) + ... + a_{N-1}),
 * left to right in rank order, starting from rank 0's term (not from +0),
 * each addition rounded to the dtype (no wider accumulator, no fused
 * multiply-add, no tree). At world 1 the result is the input, bit for bit.
 * So allreduce's element i equals reduce_scatter's (then allgather's).
 *
 * How a backend keeps it: its reduce_scatter and allreduce hooks are
 * Optional, and a backend supplies one only when it computes exactly that
 * fold (the local backend: one term; an mpi backend summing in rank order
 * itself). MPI_Reduce_scatter and ncclReduceScatter promise no order, so
 * mpi and nccl backends leave the hooks out and the core composes them:
 *   reduce_scatter = all-to-all of the slices into the scratch buffer
 *                    (N * slice_elems: slot q holds rank q's slice r), then
 *                    a local sum of the N slots in rank order into out;
 *   allreduce      = that reduce-scatter of the first m = N * (count / N)
 *                    elements into this rank's slice of out, an all-gather
 *                    of the slices in place in out, and for the last
 *                    count % N elements an all-gather into the scratch and
 *                    the local sum (scratch: max(m, N * (count % N))
 *                    elements). Each element is folded by one rank and
 *                    copied by the others, so it is still the fold; the
 *                    bytes moved are a ring allreduce's, 2 (N-1)/N.
 * The local sum is the backend's reduce_local hook (a device kernel), or,
 * on a device whose memory the host can read (the cpu device), a host
 * function on the comm's queue. The scratch is device memory given at
 * create (plan, then allocate once); a composed collective that needs more
 * than it fails with -ENOSPC.
 *
 * In place (nothing is copied at world 1):
 *   allreduce, broadcast, all-to-all: recv == send;
 *   reduce_scatter: recv == send + rank * slice_elems (the rank's slice);
 *   allgather:      send == recv + rank * slice_elems.
 * Otherwise the two buffers must not overlap. At world 1 an in-place
 * collective queues nothing and touches no memory; an out-of-place one is
 * one device-to-device copy on the comm's queue.
 *
 * Errors are sticky, as the compute's: a collective that fails (bad
 * arguments included: -EINVAL, detail in st_error_last()) keeps its -errno,
 * and every later collective, record and wait is skipped, returning that
 * error, until st_comm_take_error() or st_comm_sync() hands it back. So the
 * engine can queue a unit's collectives and check once.
 *
 * Lifetimes: the comm borrows its device and is destroyed before it; the
 * comm's queue belongs to the comm.
 *
 * The core never calls c->ops->hook directly: it calls the st_comm_*()
 * wrappers below, which check arguments, keep the sticky error and the
 * stats. All functions return 0 or -errno. */
#ifndef STRATA_COMM_H
#define STRATA_COMM_H

#include "strata/common.h"

#include <stdbool.h>

struct st_comm;
struct st_device;
struct st_queue;
struct st_event;

/* Element types. Reductions take F32 and F64 only; BF16 moves (allgather
 * of W slices at ZeRO stage 3, broadcast, all-to-all). */
enum st_comm_dtype {
	ST_COMM_F32,  /* the gradient */
	ST_COMM_F64,  /* the global norm's partial sums */
	ST_COMM_BF16, /* working weights; not reducible */
	ST_COMM_DTYPES
};

/* The collectives, for the stats. */
enum st_comm_kind {
	ST_COMM_ALLREDUCE,
	ST_COMM_REDUCE_SCATTER,
	ST_COMM_ALLGATHER,
	ST_COMM_ALLTOALL,
	ST_COMM_BROADCAST,
	ST_COMM_KINDS
};

/* Version of struct st_comm_ops; a table of another version is refused.
 * 2: the optional hooks async_error, host_allgather, local_rank, abort,
 * sync, set_timeout, library. */
#define ST_COMM_OPS_VERSION 2u

struct st_comm_config {
	/* Device scratch for the composed reduce_scatter / allreduce (see
	 * above): borrowed, unused by the local backend (may be NULL, 0). */
	void *scratch;
	size_t scratch_bytes;
	/* Seconds one collective (or host-side exchange) may wait for its
	 * peers before the backend ends the whole job, naming this rank (the
	 * mpi backend's watchdog: MPI_Abort). 0: $ST_COMM_TIMEOUT (0 there:
	 * none), else 300; st_comm_create() resolves it before the backend's
	 * open sees it. Negative: no watchdog. Unused at world 1. */
	double timeout_s;
	/* mpi: move every collective through a pinned host staging buffer
	 * (device -> host copy, the MPI call on host memory, host -> device,
	 * in pieces of at most 8 MiB a rank, all on the comm's queue). It is
	 * on by itself on a device the host cannot address (cuda: two ranks
	 * sharing one GPU, which NCCL refuses); set it to run that path on
	 * the cpu device (the tests). Other backends ignore it. */
	bool stage_host;
};

struct st_comm_ops {
	const char *name;  /* Required. "local", "mpi", "nccl". */
	unsigned version;  /* Required. ST_COMM_OPS_VERSION. */
	size_t priv_bytes; /* Private state the core allocates (may be 0). */

	/* Required. Join the world: write this rank and the world size
	 * (0 <= *rank < *world). The comm's queue and device are ready
	 * (st_comm_queue(), st_comm_device()). 0 or -errno. */
	int (*open)(struct st_comm *c, const struct st_comm_config *cfg, int *rank,
		    int *world);
	/* Required. Leave the world; the core has drained the queue. */
	void (*close)(struct st_comm *c);

	/* The collectives. Each only queues work on st_comm_queue(c) and
	 * returns 0 or -errno. The core has checked the arguments (counts > 0,
	 * buffers aligned, in place or disjoint, root in range, reductions on
	 * F32/F64) and counts the stats; a hook sees only valid calls. */

	/* Required. send and recv are world * slice_elems: slot q of recv
	 * gets rank q's slot `rank` of send. */
	int (*alltoall)(struct st_comm *c, const void *send, void *recv,
			size_t slice_elems, enum st_comm_dtype dt);
	/* Required. send is slice_elems, recv world * slice_elems: slot q of
	 * recv gets rank q's send. */
	int (*allgather)(struct st_comm *c, const void *send, void *recv,
			 size_t slice_elems, enum st_comm_dtype dt);
	/* Required. recv (count_elems) on every rank gets root's send; send
	 * is read on root only. */
	int (*broadcast)(struct st_comm *c, const void *send, void *recv,
			 size_t count_elems, enum st_comm_dtype dt, int root);
	/* Optional: only when it computes the fold above bit for bit.
	 * Absent: all-to-all into the scratch, then the local sum. send is
	 * world * slice_elems, recv slice_elems. */
	int (*reduce_scatter)(struct st_comm *c, const void *send, void *recv,
			      size_t slice_elems, enum st_comm_dtype dt);
	/* Optional: only when it computes the fold above bit for bit.
	 * Absent: all-gather into the scratch, then the local sum. */
	int (*allreduce)(struct st_comm *c, const void *send, void *recv,
			 size_t count_elems, enum st_comm_dtype dt);
	/* Optional. The local sum: out[i] = fold(in[0*n + i], ...,
	 * in[(terms-1)*n + i]) with n = count_elems, in device memory, on
	 * the comm's queue, for a device the host cannot address (cuda). On
	 * a unified device (cpu) the core always uses its host function on
	 * the queue instead; absent elsewhere, the composed collectives fail
	 * with -ENOTSUP. */
	int (*reduce_local)(struct st_comm *c, const void *in, void *out,
			    size_t count_elems, int terms, enum st_comm_dtype dt);

	/* Optional. An error the queue met after its call was queued (a
	 * failed MPI call on the queue's thread): returned once, as -errno
	 * with its detail put in st_error_last() of the calling thread; 0 when
	 * none. The core polls it at each call and at sync, so it turns
	 * sticky. Absent: hooks fail only when they queue. */
	int (*async_error)(struct st_comm *c);
	/* Optional (needed at world > 1 by st_comm_host_allgather and what is
	 * built on it). Blocking, host memory, off the queue: slot q (bytes)
	 * of recv (world * bytes) gets rank q's send. */
	int (*host_allgather)(struct st_comm *c, const void *send, void *recv,
			      size_t bytes);
	/* Optional. This rank's index among the ranks of its node (the GPU it
	 * takes). Absent: 0. */
	int (*local_rank)(struct st_comm *c);
	/* Optional. End every rank of the job now with code (MPI_Abort).
	 * Absent: exit(code) of this process. */
	void (*abort)(struct st_comm *c, int code);
	/* Optional. Wait for everything queued on the comm's queue, watching
	 * for the backend's errors and its timeout (nccl: polls the stream and
	 * ncclCommGetAsyncError, aborts the communicator on an error so the
	 * stream drains). 0 or -errno. Absent: st_queue_sync(). */
	int (*sync)(struct st_comm *c);
	/* Optional. A new timeout for the waits of st_comm_config.timeout_s
	 * (seconds; <= 0: none), from the next wait on. */
	void (*set_timeout)(struct st_comm *c, double timeout_s);
	/* Optional. One line naming the library behind the backend and its
	 * version into buf ("Open MPI v4.1.4, ...", "NCCL 2.28.9"); callable
	 * without a comm. 0 or -errno. Absent: the backend's name. */
	int (*library)(char *buf, size_t bytes);
};

/* Per collective kind: calls made (in place included), bytes of the
 * collective's full buffer (reduce_scatter's send, allgather's recv,
 * all-to-all's send, allreduce's and broadcast's count), and the time the
 * comm's queue spent running it (0 for what queued nothing: in place at
 * world 1). */
struct st_comm_stats {
	struct {
		uint64_t calls;
		uint64_t bytes;
		uint64_t busy_ns;
	} kind[ST_COMM_KINDS];
};

/* Backends built into this binary, by name ("local", "mpi", "nccl");
 * NULL when unknown or not built. */
const struct st_comm_ops *st_comm_find(const char *name);
/* Names of the built backends, comma-separated ("local,mpi,nccl"). */
const char *st_comm_list(void);

/* What the launcher says about this process, read from its environment
 * without starting any library: Open MPI's mpirun (OMPI_COMM_WORLD_*),
 * PMIx (PMIX_RANK, with Slurm's SLURM_STEP_NUM_TASKS or SLURM_NTASKS and
 * SLURM_LOCALID for srun --mpi=pmix), PMI (PMI_RANK, PMI_SIZE,
 * MPI_LOCALRANKID), and srun with no MPI plugin ("srun": a step of more
 * than one task, SLURM_STEP_NUM_TASKS > 1, SLURM_PROCID). */
struct st_comm_launch {
	const char *launcher; /* "mpirun", "pmix", "pmi", "srun"; NULL: none (one rank) */
	int rank;             /* -1 when the launcher does not say */
	int world;            /* -1 when the launcher does not say */
	int local_rank;       /* -1 when the launcher does not say */
	int nodes;            /* the job's nodes; -1 when the launcher does not say */
};
void st_comm_launch(struct st_comm_launch *out);
/* The backend for device_name ("cpu", "cuda") as launched: the one
 * $ST_COMM names ("local", "mpi", "nccl"; "auto" or unset: as follows),
 * else "local" when no launcher is seen; under one, "mpi" for the cpu
 * device and "nccl" for cuda. Returns 0; -ENOTSUP (detail set) when
 * $ST_COMM names a backend not built, or launched by a launcher but the
 * backend it needs is not built; -EINVAL (detail set) under srun with no
 * MPI plugin (launcher "srun"), whatever $ST_COMM says. */
int st_comm_auto(const char *device_name, const struct st_comm_ops **out);
/* The library line of ops (its library hook, else its name) into buf. */
int st_comm_library(const struct st_comm_ops *ops, char *buf, size_t bytes);
/* One line for `strata info`, starting no library: the built backends,
 * each one's library, and the launcher's world: "local,mpi,nccl; mpi:
 * Open MPI v4.1.4, ...; nccl: NCCL 2.28.9; launcher: mpirun, rank 0 of 2,
 * local rank 0, host vm, 1 node" (or "launcher: none, one rank"; the nodes
 * where the launcher says). Returns buf. */
const char *st_comm_describe(char *buf, size_t bytes);
/* The name of a collective kind ("allreduce", "reduce_scatter", ...). */
const char *st_comm_kind_name(enum st_comm_kind k);
/* Bytes of one element of dt (4, 8, 2). dt must be valid. */
size_t st_comm_dtype_bytes(enum st_comm_dtype dt);

/* Open a communicator of backend ops on device d (borrowed) with a queue
 * of its own on d. cfg may be NULL. *out goes back with st_comm_destroy(),
 * before d. Returns 0; -EINVAL for a table of another version or lacking a
 * required hook (nothing is opened); -ENOMEM; or the backend's -errno. */
int st_comm_create(const struct st_comm_ops *ops, struct st_device *d,
		   const struct st_comm_config *cfg, struct st_comm **out);
/* Drains the queue, leaves the world. NULL does nothing. */
void st_comm_destroy(struct st_comm *c);

const char *st_comm_name(const struct st_comm *c);
int st_comm_rank(const struct st_comm *c);
int st_comm_world(const struct st_comm *c);
/* This rank's index among the ranks of its node (the GPU to take): what
 * the backend found (MPI_Comm_split_type SHARED for mpi), 0 at world 1. */
int st_comm_local_rank(const struct st_comm *c);
/* Borrowed: the comm's device, its queue, the backend's private state. */
struct st_device *st_comm_device(struct st_comm *c);
struct st_queue *st_comm_queue(struct st_comm *c);
void *st_comm_priv(struct st_comm *c);

/* Reduce-scatter (sum, the fold above): send is world * slice_elems, rank
 * r's recv (slice_elems) gets the sum of every rank's slice r. In place:
 * recv == send + rank * slice_elems. F32, F64. ZeRO stage 2: a unit's flat
 * dW into this rank's 1/N slice. Returns 0 or the (sticky) -errno. */
int st_comm_reduce_scatter(struct st_comm *c, const void *send, void *recv,
			   size_t slice_elems, enum st_comm_dtype dt);
/* Allreduce (sum, the fold above): recv on every rank (count_elems) gets
 * the sum of every rank's send. In place: recv == send. F32, F64. The
 * global norm: one double. Returns 0 or the (sticky) -errno. */
int st_comm_allreduce(struct st_comm *c, const void *send, void *recv,
		      size_t count_elems, enum st_comm_dtype dt);
/* Allgather: send is slice_elems, recv world * slice_elems; slot q gets
 * rank q's send. In place: send == recv + rank * slice_elems. ZeRO stage
 * 3: W slices into a slot. Returns 0 or the (sticky) -errno. */
int st_comm_allgather(struct st_comm *c, const void *send, void *recv,
		      size_t slice_elems, enum st_comm_dtype dt);
/* All-to-all: send and recv are world * slice_elems; recv slot q gets rank
 * q's send slot `rank`. In place: recv == send (a backend that cannot do
 * that at world > 1 fails with -ENOTSUP). Returns 0 or the (sticky) -errno. */
int st_comm_alltoall(struct st_comm *c, const void *send, void *recv,
		     size_t slice_elems, enum st_comm_dtype dt);
/* Broadcast: recv (count_elems) on every rank gets root's send (read on
 * root only, but every rank passes one: recv itself for in place; NULL is
 * refused). In place: recv == send. Returns 0 or the (sticky) -errno. */
int st_comm_broadcast(struct st_comm *c, const void *send, void *recv,
		      size_t count_elems, enum st_comm_dtype dt, int root);

/* Events: e belongs to the comm's device. Record marks the end of the
 * collectives called so far; wait holds later collectives until e is done.
 * Skipped while an error is sticky. Return 0 or -errno. */
int st_comm_record(struct st_comm *c, struct st_event *e);
int st_comm_wait(struct st_comm *c, struct st_event *e);
/* Wait for every collective called so far; returns (and clears) the
 * sticky error, or what waiting found. */
int st_comm_sync(struct st_comm *c);
/* The sticky error, cleared; 0 when none. Does not wait. */
int st_comm_take_error(struct st_comm *c);

/* Stats so far. busy_ns is complete only after st_comm_sync(). */
void st_comm_get_stats(const struct st_comm *c, struct st_comm_stats *s);

/* ---- host-side agreement (start-up, checkpoints), off the queue ---- */

/* Blocking exchange of host memory, outside the comm's queue and its
 * sticky error: recv (world * bytes) slot q gets rank q's send (bytes).
 * Every rank calls it with the same bytes. At world 1 a copy. 0 or
 * -errno (-ENOTSUP: the backend has no host_allgather). */
int st_comm_host_allgather(struct st_comm *c, const void *send, void *recv, size_t bytes);
/* Every rank reaches it before any leaves. 0 or -errno. */
int st_comm_barrier(struct st_comm *c);
/* Change how long a wait for peers may last before the job ends
 * (st_comm_config.timeout_s; seconds, <= 0: no limit), from the next wait
 * on: e.g. raise it around a checkpoint, where ranks legitimately wait in
 * a barrier for the slowest writer. Returns the timeout it replaces (0:
 * none, or a backend without one). */
double st_comm_set_timeout(struct st_comm *c, double timeout_s);
/* Blocking broadcast of host memory, off the queue: every rank's buf
 * (bytes, the same on every rank) gets root's (the step to resume, a
 * checkpoint's name). Small buffers: it moves world * bytes. 0 or -errno. */
int st_comm_host_broadcast(struct st_comm *c, void *buf, size_t bytes, int root);

/* Bytes of each text kept by st_comm_agree() (longer lines are cut). */
#define ST_COMM_AGREE_TEXT 200

/* What st_comm_agree() found: the same on every rank. */
struct st_comm_disagreement {
	int line;      /* index of the first line where some rank differs */
	int rank;      /* the lowest rank whose line `line` differs from rank 0's */
	char rank0_text[ST_COMM_AGREE_TEXT]; /* rank 0's line ("(none)": it has fewer) */
	char rank_text[ST_COMM_AGREE_TEXT];  /* that rank's line, the same way */
};

/* Do all ranks hold the same n lines (a config, a data description)? Each
 * rank hashes each line (XXH3), the hashes are gathered, and every rank
 * finds the same first difference: the lowest line index, then the lowest
 * rank differing from rank 0 there, with both texts (so a CLI prints one
 * line naming it on every rank and exits 2). n may differ between ranks
 * (a missing line differs). Returns 0 when all agree, 1 when they differ
 * (*out filled, out may be NULL), -errno on failure. Collective: every
 * rank calls it. */
int st_comm_agree(struct st_comm *c, const char *const *lines, int n,
		  struct st_comm_disagreement *out);
/* The one line a CLI prints for d (no newline): "ranks disagree at line
 * 2: rank 0 has 'steps=400', rank 1 has 'steps=300'". Returns buf. */
const char *st_comm_disagreement_line(const struct st_comm_disagreement *d, char *buf,
				      size_t bytes);

/* Say that every rank will exit with the same status (a refusal all
 * ranks make alike, after an agreement): a non-zero exit then finishes
 * MPI, and mpirun exits with that status, instead of the exit handler
 * ending the job with MPI_Abort as it does for a rank that fails alone
 * (docs/comm.md, Faults). st_comm_agree() calls it when ranks differ. */
void st_comm_exit_together(void);

/* End every rank of the job now with exit code code (mpi: MPI_Abort, so
 * the launcher stops the others), after flushing stdio. For a rank that
 * fails alone while its peers may wait in a collective. */
_Noreturn void st_comm_abort(struct st_comm *c, int code);

/* The backends (mpi and nccl only where built: ST_HAVE_MPI, ST_HAVE_NCCL). */
extern const struct st_comm_ops st_comm_local_ops;
#ifdef ST_HAVE_MPI
extern const struct st_comm_ops st_comm_mpi_ops;
#endif
#ifdef ST_HAVE_NCCL
extern const struct st_comm_ops st_comm_nccl_ops;
#endif

#endif
