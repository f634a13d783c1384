/* strata: the MPI world of a process, shared by the mpi backend (its
 * collectives) and the nccl backend (its start-up: the ncclUniqueId goes
 * out over MPI, and its host-side exchanges). Only for src/comm/.
 *
 * MPI is started once per process (MPI_Init_thread, MPI_THREAD_MULTIPLE:
 * a comm's collectives run on its queue's thread while the host thread may
 * exchange on another communicator and a watchdog may abort), and finished
 * at exit (on_exit: MPI_Finalize after status 0 or a disagreement every
 * rank exits on; MPI_Abort after any other failure or a comm error, so a
 * rank that leaves alone does not wait in MPI_Finalize for peers stuck in
 * a collective). A comm holds communicators of its own
 * (MPI_Comm_dup of MPI_COMM_WORLD), so two comms never mix messages. */
#ifndef STRATA_COMM_MPI_WORLD_H
#define STRATA_COMM_MPI_WORLD_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Start MPI if nobody has, check its thread level, and check the world
 * against what the launcher said (st_comm_launch). 0 or -errno (set). */
int st_mpi_start(void);
/* Open MPI's library line (MPI_Get_library_version's first line); works
 * before MPI starts. */
int st_mpi_library(char *buf, size_t bytes);
/* An MPI error code as -EIO with "mpi: <what>: <MPI's message>" set. */
int st_mpi_err(int code, const char *what);
/* Mark that a comm met an error: exit then aborts the job instead of
 * finishing MPI. */
void st_mpi_failed(void);
/* MPI_Abort of the whole job with code, after flushing stdio. */
_Noreturn void st_mpi_abort(int code);

/* A watchdog: a thread that ends the job (st_mpi_abort(1)) when a wait
 * marked with st_mpi_watch_enter() lasts longer than timeout_s, printing
 * one line naming this rank and what it waited in. Two slots: the queue's
 * collective and the host thread's exchange. */
enum { ST_MPI_WATCH_QUEUE, ST_MPI_WATCH_HOST, ST_MPI_WATCH_SLOTS };

struct st_mpi_watch {
	int rank, world;
	_Atomic uint64_t limit_ns; /* 0: off (st_mpi_watch_set) */
	const char *backend;
	_Atomic uint64_t since_ns[ST_MPI_WATCH_SLOTS]; /* 0: not waiting */
	const char *_Atomic what[ST_MPI_WATCH_SLOTS];
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool running, stop;
};

/* timeout_s as st_comm_config says (st_comm_create resolved 0 already;
 * negative: off). */
double st_mpi_timeout(double cfg_timeout_s);
/* The thread runs at world > 1 even with the timeout off, so
 * st_mpi_watch_set() can turn it on later. */
int st_mpi_watch_start(struct st_mpi_watch *w, const char *backend, int rank, int world,
		       double timeout_s);
/* A new timeout (seconds; <= 0: off), from the next wait on. */
void st_mpi_watch_set(struct st_mpi_watch *w, double timeout_s);
/* The timeout now, in seconds (0: off). */
double st_mpi_watch_get(const struct st_mpi_watch *w);
void st_mpi_watch_stop(struct st_mpi_watch *w);
void st_mpi_watch_enter(struct st_mpi_watch *w, int slot, const char *what);
void st_mpi_watch_leave(struct st_mpi_watch *w, int slot);

/* This rank among the ranks of its node: MPI_Comm_split_type SHARED. */
int st_mpi_node_rank(MPI_Comm comm, int *out);
/* Blocking allgather of bytes (at most INT_MAX) of host memory on comm,
 * watched in the host slot of w (may be NULL). */
int st_mpi_allgather_bytes(MPI_Comm comm, struct st_mpi_watch *w, const void *send,
			   void *recv, size_t bytes);

#endif
