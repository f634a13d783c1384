/* The nccl comm backend on the cuda device, with buffers in device memory
 * (filled and read back through H2D / D2H copies):
 *
 *   test_comm_nccl         world 1 (no launcher): every collective through
 *                          NCCL out of place, the composed reductions
 *                          (all-to-all into the scratch + the local-sum
 *                          kernel), the kernel itself at 2-5 terms against
 *                          the host's rank-order fold bit for bit, in-place
 *                          all-to-all, sticky errors, library line.
 *   tests/mpi-run N test_comm_nccl
 *                          N ranks, one GPU a rank (the GPU of the local
 *                          rank): every collective against the reference
 *                          each rank computes from every rank's inputs,
 *                          reductions bit for bit; skipped (77 on every
 *                          rank) with fewer GPUs than ranks, since NCCL
 *                          refuses two ranks on one GPU.
 *
 * Exits 77 without a GPU. */
#include "strata/comm.h"
#include "strata/device.h"

#include "cuda_probe.h"
#define CHECK_PROG "test_comm_nccl"
#include "comm_ref.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ull * 1024ull)

static struct st_comm *g_comm;
static int g_rank;
static long g_checks;


struct world {
	struct st_device *dev;
	struct st_comm *comm;
	struct st_queue *copy;
	char *arena;
	uint64_t arena_bytes, used;
	int rank, n;
};

static void *take(struct world *w, size_t bytes)
{
	char *p;

	w->used = st_align_up(w->used, 256);
	CHECK(w->used + bytes <= w->arena_bytes, "arena full");
	p = w->arena + w->used;
	w->used += bytes;
	return p;
}

static void h2d(struct world *w, void *dev, const void *host, size_t bytes)
{
	CHECK(st_device_memcpy_async(w->dev, w->copy, dev, host, bytes, ST_COPY_H2D) == 0, "h2d");
	CHECK(st_queue_sync(w->dev, w->copy) == 0, "h2d sync");
}

static void d2h(struct world *w, void *host, const void *dev, size_t bytes)
{
	CHECK(st_comm_sync(w->comm) == 0, "comm sync");
	CHECK(st_device_memcpy_async(w->dev, w->copy, host, dev, bytes, ST_COPY_D2H) == 0, "d2h");
	CHECK(st_queue_sync(w->dev, w->copy) == 0, "d2h sync");
}

static void check_collectives(struct world *w, enum st_comm_dtype dt, size_t n, uint64_t salt)
{
	size_t eb = st_comm_dtype_bytes(dt), N = (size_t)w->n, mark = w->used;
	char *hsend = malloc(N * n * eb), *hrecv = malloc(N * n * eb), *ref = malloc(N * n * eb);
	char *send = take(w, N * n * eb), *recv = take(w, N * n * eb);

	CHECK(hsend && hrecv && ref, "oom");
	if (dt != ST_COMM_BF16) {
		/* reduce_scatter, out of place and in place */
		gen(hsend, N * n, dt, w->rank, salt);
		CHECK(fold(ref, n, (size_t)w->rank * n, N * n, dt, w->n, salt, false) == 0, "oom");
		h2d(w, send, hsend, N * n * eb);
		CHECK(st_comm_reduce_scatter(w->comm, send, recv, n, dt) == 0, "reduce_scatter");
		d2h(w, hrecv, recv, n * eb);
		CHECK(memcmp(hrecv, ref, n * eb) == 0, "reduce_scatter n=%zu", n);
		CHECK(st_comm_reduce_scatter(w->comm, send, send + (size_t)w->rank * n * eb, n, dt) ==
			      0,
		      "reduce_scatter in place");
		d2h(w, hrecv, send + (size_t)w->rank * n * eb, n * eb);
		CHECK(memcmp(hrecv, ref, n * eb) == 0, "reduce_scatter in place n=%zu", n);
		/* allreduce */
		gen(hsend, n, dt, w->rank, salt + 1);
		CHECK(fold(ref, n, 0, n, dt, w->n, salt + 1, false) == 0, "oom");
		h2d(w, send, hsend, n * eb);
		CHECK(st_comm_allreduce(w->comm, send, recv, n, dt) == 0, "allreduce");
		d2h(w, hrecv, recv, n * eb);
		CHECK(memcmp(hrecv, ref, n * eb) == 0, "allreduce n=%zu", n);
	}
	/* allgather, out of place */
	gen(hsend, n, dt, w->rank, salt + 2);
	h2d(w, send, hsend, n * eb);
	CHECK(st_comm_allgather(w->comm, send, recv, n, dt) == 0, "allgather");
	d2h(w, hrecv, recv, N * n * eb);
	for (int q = 0; q < w->n; q++) {
		gen(ref, n, dt, q, salt + 2);
		CHECK(memcmp(hrecv + (size_t)q * n * eb, ref, n * eb) == 0, "allgather slot %d", q);
	}
	/* all-to-all, out of place */
	gen(hsend, N * n, dt, w->rank, salt + 3);
	h2d(w, send, hsend, N * n * eb);
	CHECK(st_comm_alltoall(w->comm, send, recv, n, dt) == 0, "alltoall");
	d2h(w, hrecv, recv, N * n * eb);
	for (int q = 0; q < w->n; q++) {
		gen(ref, N * n, dt, q, salt + 3);
		CHECK(memcmp(hrecv + (size_t)q * n * eb, ref + (size_t)w->rank * n * eb, n * eb) == 0,
		      "alltoall slot %d", q);
	}
	/* broadcast from every root */
	for (int root = 0; root < w->n; root++) {
		gen(hsend, n, dt, w->rank, salt + 4 + (uint64_t)root);
		gen(ref, n, dt, root, salt + 4 + (uint64_t)root);
		h2d(w, send, hsend, n * eb);
		CHECK(st_comm_broadcast(w->comm, send, recv, n, dt, root) == 0, "broadcast");
		d2h(w, hrecv, recv, n * eb);
		CHECK(memcmp(hrecv, ref, n * eb) == 0, "broadcast root %d", root);
	}
	free(hsend);
	free(hrecv);
	free(ref);
	w->used = mark;
}

/* The local-sum kernel itself at 2-5 terms (as N ranks would feed it),
 * against the host's fold; the data tells orders apart. */
static void check_kernel(struct world *w)
{
	static const size_t counts[] = { 1, 3, 255, 257, 100003 };
	const struct st_comm_ops *ops = st_comm_find("nccl");

	for (int terms = 2; terms <= 5; terms++)
		for (size_t ci = 0; ci < ST_ARRAY_LEN(counts); ci++)
			for (int d = 0; d < 2; d++) {
				enum st_comm_dtype dt = d ? ST_COMM_F64 : ST_COMM_F32;
				size_t n = counts[ci], eb = st_comm_dtype_bytes(dt), mark = w->used;
				char *hin = malloc((size_t)terms * n * eb), *ref = malloc(n * eb);
				char *rev = malloc(n * eb), *got = malloc(n * eb);
				char *in = take(w, (size_t)terms * n * eb), *out = take(w, n * eb);

				CHECK(hin && ref && rev && got, "oom");
				for (int q = 0; q < terms; q++)
					gen(hin + (size_t)q * n * eb, n, dt, q, 99);
				CHECK(fold(ref, n, 0, n, dt, terms, 99, false) == 0, "oom");
				h2d(w, in, hin, (size_t)terms * n * eb);
				CHECK(ops->reduce_local(w->comm, in, out, n, terms, dt) == 0, "kernel");
				d2h(w, got, out, n * eb);
				CHECK(memcmp(got, ref, n * eb) == 0, "kernel %d terms n=%zu %s", terms, n,
				      d ? "f64" : "f32");
				if (terms >= 3 && n > 1000) {
					CHECK(fold(rev, n, 0, n, dt, terms, 99, true) == 0, "oom");
					CHECK(memcmp(rev, ref, n * eb) != 0, "data blind to order");
				}
				free(hin);
				free(ref);
				free(rev);
				free(got);
				w->used = mark;
			}
}

int main(int argc, char **argv)
{
	const struct st_device_ops *cuda;
	struct st_comm_launch l;
	struct st_device_config dcfg = { .mem_bytes = 256 * MiB };
	struct st_comm_config cfg = { .scratch_bytes = 32 * MiB };
	struct world w = { 0 };
	static const size_t counts[] = { 1, 7, 1001, 65537 };
	char lib[128];
	int ret, gpus = 0;

	if (argc > 1) {
		printf("usage: [tests/mpi-run N] test_comm_nccl\n"
		       "  the nccl comm backend at world 1, or N ranks with a GPU each\n");
		return strcmp(argv[1], "--help") == 0 ? 0 : 2;
	}
	ret = st_test_cuda_probe(&cuda);
	if (ret)
		return ret;
	/* libnccl is loaded on first use: a GPU machine without it skips. */
	st_comm_library(st_comm_find("nccl"), lib, sizeof(lib));
	if (strncmp(lib, "not loadable", 12) == 0) {
		printf("test_comm_nccl: libnccl %s: skipped\n", lib);
		return 77;
	}
	st_comm_launch(&l);
	/* NCCL takes one GPU a rank; every rank sees the same count. */
	if (l.world > 1 && cudaGetDeviceCount(&gpus) == cudaSuccess && gpus < l.world) {
		printf("test_comm_nccl: %d ranks but %d GPU(s) (NCCL takes one a rank): skipped\n",
		       l.world, gpus);
		return 77;
	}
	dcfg.ordinal = l.local_rank > 0 ? l.local_rank : 0;
	CHECK(st_device_create(cuda, &dcfg, &w.dev) == 0, "cuda device");
	w.arena = st_device_arena(w.dev, &w.arena_bytes);
	cfg.scratch = take(&w, cfg.scratch_bytes);
	CHECK(st_comm_create(st_comm_find("nccl"), w.dev, &cfg, &w.comm) == 0, "nccl comm");
	CHECK(st_queue_create(w.dev, &w.copy) == 0, "copy queue");
	g_comm = w.comm;
	w.rank = g_rank = st_comm_rank(w.comm);
	w.n = st_comm_world(w.comm);
	CHECK(l.world < 0 || w.n == l.world, "world %d, launcher %d", w.n, l.world);
	CHECK(st_comm_library(st_comm_find("nccl"), lib, sizeof(lib)) == 0 &&
		      strncmp(lib, "NCCL 2.", 7) == 0,
	      "library '%s'", lib);

	for (size_t ci = 0; ci < ST_ARRAY_LEN(counts); ci++) {
		check_collectives(&w, ST_COMM_F32, counts[ci], 10 + ci);
		check_collectives(&w, ST_COMM_F64, counts[ci], 20 + ci);
		check_collectives(&w, ST_COMM_BF16, counts[ci], 30 + ci);
	}
	check_kernel(&w);
	/* st_comm_sync() polls the stream: its cudaErrorNotReady must not be
	 * left for the next launch check to report */
	CHECK(cudaPeekAtLastError() == cudaSuccess, "a polled sync left %s behind",
	      cudaGetErrorName(cudaPeekAtLastError()));
	if (w.n > 1) {
		/* All-to-all in place is refused at world > 1, and sticks. */
		float *a = take(&w, (size_t)w.n * 16 * sizeof(float));

		CHECK(st_comm_alltoall(w.comm, a, a, 16, ST_COMM_F32) == -ENOTSUP, "in place");
		CHECK(st_comm_sync(w.comm) == -ENOTSUP, "sticky");
		CHECK(st_comm_barrier(w.comm) == 0, "barrier");
	}
	if (w.rank == 0)
		printf("test_comm_nccl: %d rank(s), %s: %ld checks passed on rank 0\n", w.n, lib,
		       g_checks);
	st_queue_destroy(w.dev, w.copy);
	st_comm_destroy(w.comm);
	st_device_destroy(w.dev);
	return 0;
}
