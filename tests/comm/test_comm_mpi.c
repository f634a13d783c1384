/* The mpi comm backend across ranks, run under mpirun (tests/mpi-run N):
 *
 *   test_comm_mpi --stage the same, every comm through the host staging
 *                         of a device the host cannot address (forced on
 *                         the cpu device), with slices of two pieces.
 *   test_comm_mpi [all]   every collective against a reference each rank
 *                         computes from every rank's inputs (each rank's
 *                         data is generated from its rank, so any rank can
 *                         make any other's): fp32, fp64, odd counts, in
 *                         place and out of place, bf16 moves, every root;
 *                         the reductions bit for bit against the rank-order
 *                         fold (with data where another order, or a fold
 *                         from +0, gives other bits); bad arguments and the
 *                         sticky error; events; stats; two comms at once;
 *                         the host-side exchange, barrier and agreement;
 *                         discovery (st_comm_auto, local rank, library).
 *   test_comm_mpi mismatch  rank world-1 holds a different line 2: every
 *                         rank must find the same first difference, print
 *                         one line naming it, and exit 2.
 *   test_comm_mpi kill    allreduces in a loop; rank world-1 SIGKILLs itself
 *                         at the 5th: mpirun must end the job, naming it.
 *   test_comm_mpi truncate  rank 0 gathers a count the others do not
 *                         send: MPI's error on the queue thread comes back
 *                         from st_comm_sync (-EIO, naming the call), later
 *                         calls fail, and the rank's exit ends the job.
 *   test_comm_mpi exit    rank world-1 returns 1 from main mid-run: its exit
 *                         handler ends the job at once.
 *   test_comm_mpi stuck   rank world-1 stops taking part (sleeps) while the
 *                         others wait in an allreduce: their watchdog
 *                         (ST_COMM_TIMEOUT) must end the job, naming them.
 *   test_comm_mpi stuck-start  rank world-1 starts MPI but never opens its
 *                         comm: the others wait in the comm's first
 *                         collective (MPI_Comm_dup), which the watchdog
 *                         must watch already (it started after it, once).
 *
 * tests/comm/mpi-expect checks the exit status, time and output of the last
 * three. A failed check prints the rank, the line and the detail, and ends
 * the whole job (st_comm_abort), so a failure never leaves peers hanging. */
#include "strata/comm.h"
#include "strata/device.h"

#include <errno.h>
#include <mpi.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK_PROG "test_comm_mpi"
#include "comm_ref.h"

#define MiB (1024ull * 1024ull)

static struct st_comm *g_comm; /* for CHECK's abort */
static int g_rank = -1;
static long g_checks;


struct world {
	struct st_device *dev;
	struct st_comm *comm;
	char *arena;
	uint64_t arena_bytes, used;
	void *scratch;
	size_t scratch_bytes;
	int rank, n;
};

static void *take(struct world *w, size_t bytes)
{
	char *p;

	w->used = st_align_up(w->used, 64);
	CHECK(w->used + bytes <= w->arena_bytes, "arena of %llu bytes is full",
	      (unsigned long long)w->arena_bytes);
	p = w->arena + w->used;
	w->used += bytes;
	return p;
}

static bool g_stage; /* --stage: every comm moves through host staging */

static void open_world(struct world *w, double timeout_s)
{
	struct st_device_config dcfg = { .mem_bytes = (g_stage ? 192 : 64) * MiB };
	struct st_comm_config cfg = { .timeout_s = timeout_s, .stage_host = g_stage };
	char *arena;

	memset(w, 0, sizeof(*w));
	if (st_device_create(&st_device_cpu_ops, &dcfg, &w->dev) != 0) {
		fprintf(stderr, "test_comm_mpi: cpu device: %s\n", st_error_last());
		exit(1);
	}
	arena = st_device_arena(w->dev, &w->arena_bytes);
	w->arena = arena;
	w->scratch_bytes = 16 * MiB;
	w->scratch = take(w, w->scratch_bytes);
	cfg.scratch = w->scratch;
	cfg.scratch_bytes = w->scratch_bytes;
	if (st_comm_create(&st_comm_mpi_ops, w->dev, &cfg, &w->comm) != 0) {
		fprintf(stderr, "test_comm_mpi: mpi comm: %s\n", st_error_last());
		exit(1);
	}
	w->rank = st_comm_rank(w->comm);
	w->n = st_comm_world(w->comm);
	g_comm = w->comm;
	g_rank = w->rank;
}

static void close_world(struct world *w)
{
	st_comm_destroy(w->comm);
	st_device_destroy(w->dev);
	g_comm = NULL;
}

static const char *dt_name(enum st_comm_dtype dt)
{
	return dt == ST_COMM_F32 ? "f32" : dt == ST_COMM_F64 ? "f64" : "bf16";
}

/* ---- the collectives against their references ---------------------------------- */

static void test_reduce_scatter(struct world *w, size_t n, enum st_comm_dtype dt, bool in_place,
				uint64_t salt)
{
	size_t eb = st_comm_dtype_bytes(dt), N = (size_t)w->n;
	char *send = take(w, N * n * eb);
	char *recv = in_place ? send + (size_t)w->rank * n * eb : take(w, n * eb);
	char *ref = malloc(n * eb), *rev = malloc(n * eb);

	gen(send, N * n, dt, w->rank, salt);
	CHECK(st_comm_reduce_scatter(w->comm, send, recv, n, dt) == 0, "reduce_scatter");
	CHECK(st_comm_sync(w->comm) == 0, "sync");
	CHECK(fold(ref, n, (size_t)w->rank * n, N * n, dt, w->n, salt, false) == 0, "oom");
	CHECK(memcmp(recv, ref, n * eb) == 0, "reduce_scatter %s n=%zu %s differs from the fold",
	      dt_name(dt), n, in_place ? "in place" : "out of place");
	/* The check can fail: element 0 is -0.0 on every rank (a fold from +0
	 * gives +0.0; it lands in rank 0's slice) and, at 3 ranks and more,
	 * another order gives other bits. */
	CHECK(w->rank != 0 || signbit(dt == ST_COMM_F32 ? (double)((float *)recv)[0] : ((double *)recv)[0]),
	      "element 0 lost the sign of -0.0");
	if (w->n >= 3 && n >= 64) {
		CHECK(fold(rev, n, (size_t)w->rank * n, N * n, dt, w->n, salt, true) == 0, "oom");
		CHECK(memcmp(rev, ref, n * eb) != 0, "the data does not tell orders apart");
	}
	free(ref);
	free(rev);
}

static void test_allreduce(struct world *w, size_t n, enum st_comm_dtype dt, bool in_place,
			   uint64_t salt)
{
	size_t eb = st_comm_dtype_bytes(dt);
	char *send = take(w, n * eb), *recv = in_place ? send : take(w, n * eb);
	char *ref = malloc(n * eb);

	gen(send, n, dt, w->rank, salt);
	CHECK(st_comm_allreduce(w->comm, send, recv, n, dt) == 0, "allreduce");
	CHECK(st_comm_sync(w->comm) == 0, "sync");
	CHECK(fold(ref, n, 0, n, dt, w->n, salt, false) == 0, "oom");
	CHECK(memcmp(recv, ref, n * eb) == 0, "allreduce %s n=%zu %s differs from the fold",
	      dt_name(dt), n, in_place ? "in place" : "out of place");
	free(ref);
}

static void test_allgather(struct world *w, size_t n, enum st_comm_dtype dt, bool in_place,
			   uint64_t salt)
{
	size_t eb = st_comm_dtype_bytes(dt), N = (size_t)w->n;
	char *recv = take(w, N * n * eb);
	char *send = in_place ? recv + (size_t)w->rank * n * eb : take(w, n * eb);
	char *ref = malloc(n * eb);

	memset(recv, 0xa5, N * n * eb);
	gen(send, n, dt, w->rank, salt);
	CHECK(st_comm_allgather(w->comm, send, recv, n, dt) == 0, "allgather");
	CHECK(st_comm_sync(w->comm) == 0, "sync");
	for (int q = 0; q < w->n; q++) {
		gen(ref, n, dt, q, salt);
		CHECK(memcmp(recv + (size_t)q * n * eb, ref, n * eb) == 0,
		      "allgather %s n=%zu %s: slot %d", dt_name(dt), n,
		      in_place ? "in place" : "out of place", q);
	}
	free(ref);
}

static void test_alltoall(struct world *w, size_t n, enum st_comm_dtype dt, bool in_place,
			  uint64_t salt)
{
	size_t eb = st_comm_dtype_bytes(dt), N = (size_t)w->n;
	char *send = take(w, N * n * eb), *recv = in_place ? send : take(w, N * n * eb);
	char *ref = malloc(N * n * eb);

	gen(send, N * n, dt, w->rank, salt);
	CHECK(st_comm_alltoall(w->comm, send, recv, n, dt) == 0, "alltoall");
	CHECK(st_comm_sync(w->comm) == 0, "sync");
	for (int q = 0; q < w->n; q++) {
		gen(ref, N * n, dt, q, salt); /* rank q's send; its slot `rank` is ours */
		CHECK(memcmp(recv + (size_t)q * n * eb, ref + (size_t)w->rank * n * eb, n * eb) == 0,
		      "alltoall %s n=%zu %s: slot %d", dt_name(dt), n,
		      in_place ? "in place" : "out of place", q);
	}
	free(ref);
}

static void test_broadcast(struct world *w, size_t n, enum st_comm_dtype dt, bool in_place,
			   int root, uint64_t salt)
{
	size_t eb = st_comm_dtype_bytes(dt);
	char *send = take(w, n * eb), *recv = in_place ? send : take(w, n * eb);
	char *ref = malloc(n * eb);

	/* Every rank fills send with its own data; only root's may arrive. */
	gen(send, n, dt, w->rank, salt);
	if (!in_place)
		memset(recv, 0x5a, n * eb);
	CHECK(st_comm_broadcast(w->comm, send, recv, n, dt, root) == 0, "broadcast");
	CHECK(st_comm_sync(w->comm) == 0, "sync");
	gen(ref, n, dt, root, salt);
	CHECK(memcmp(recv, ref, n * eb) == 0, "broadcast %s n=%zu root %d %s", dt_name(dt), n,
	      root, in_place ? "in place" : "out of place");
	free(ref);
}

static void test_collectives(struct world *w)
{
	static const size_t counts[] = { 1, 3, 7, 64, 1001, 4099 };
	static const enum st_comm_dtype dts[] = { ST_COMM_F32, ST_COMM_F64, ST_COMM_BF16 };
	uint64_t salt = 1;

	for (size_t di = 0; di < ST_ARRAY_LEN(dts); di++)
		for (size_t ci = 0; ci < ST_ARRAY_LEN(counts); ci++)
			for (int ip = 0; ip < 2; ip++) {
				enum st_comm_dtype dt = dts[di];
				size_t n = counts[ci];
				uint64_t mark = w->used;

				if (dt != ST_COMM_BF16) {
					test_reduce_scatter(w, n, dt, ip, salt++);
					test_allreduce(w, n, dt, ip, salt++);
				}
				test_allgather(w, n, dt, ip, salt++);
				test_alltoall(w, n, dt, ip, salt++);
				for (int root = 0; root < w->n; root++)
					test_broadcast(w, n, dt, ip, root, salt++);
				w->used = mark;
			}
}

/* Staging cuts each rank's part into pieces of 8 MiB (the tests set
 * ST_COMM_STAGE_PIECE smaller, so test_collectives' counts take many):
 * slices of two default pieces and a bit, in place and not. Run when
 * ST_COMM_STAGE_PIECE is unset (by hand: it takes ~30 s at 4 ranks). */
static void test_pieces(struct world *w)
{
	const size_t n = 2 * MiB + 12345; /* fp32 elements: 2 pieces */
	uint64_t mark = w->used;

	if (getenv("ST_COMM_STAGE_PIECE"))
		return;
	for (int ip = 0; ip < 2; ip++) {
		test_allgather(w, n, ST_COMM_F32, ip, 900 + (uint64_t)ip);
		w->used = mark;
		test_alltoall(w, n / (size_t)w->n + 3 * MiB, ST_COMM_F32, ip, 910 + (uint64_t)ip);
		w->used = mark;
		test_broadcast(w, n, ST_COMM_F32, ip, w->n - 1, 920 + (uint64_t)ip);
		w->used = mark;
		test_reduce_scatter(w, n / (size_t)w->n, ST_COMM_F32, ip, 930 + (uint64_t)ip);
		w->used = mark;
	}
}

/* Many collectives queued before one sync, ordered by an event against
 * another queue of the device (the compute's stand-in). */
static void fill_fn(void *arg)
{
	float *p = arg;

	for (int i = 0; i < 1000; i++)
		p[i] = (float)(g_rank + 1) * 0.5f + (float)i;
}

static void test_queued(struct world *w)
{
	struct st_queue *q;
	struct st_event *e, *done;
	float *a = take(w, 1000 * sizeof(float)), *b = take(w, 1000 * sizeof(float));
	double *norm = take(w, sizeof(double));

	CHECK(st_queue_create(w->dev, &q) == 0, "queue");
	CHECK(st_event_create(w->dev, &e) == 0 && st_event_create(w->dev, &done) == 0, "events");
	memset(a, 0, 1000 * sizeof(float));
	CHECK(st_device_host_fn(w->dev, q, fill_fn, a) == 0, "fill");
	CHECK(st_event_record(w->dev, e, q) == 0, "record");
	CHECK(st_comm_wait(w->comm, e) == 0, "wait");
	CHECK(st_comm_allreduce(w->comm, a, b, 1000, ST_COMM_F32) == 0, "allreduce");
	*norm = (double)w->rank;
	CHECK(st_comm_allreduce(w->comm, norm, norm, 1, ST_COMM_F64) == 0, "norm");
	CHECK(st_comm_record(w->comm, done) == 0, "record");
	CHECK(st_event_sync(w->dev, done) == 0, "event sync");
	for (int i = 0; i < 1000; i++) {
		float ref = 0.5f + (float)i;

		for (int r = 1; r < w->n; r++)
			ref += (float)(r + 1) * 0.5f + (float)i;
		CHECK(b[i] == ref, "queued allreduce element %d: %g, want %g", i, b[i], ref);
	}
	CHECK(*norm == (double)w->n * (w->n - 1) / 2, "norm %g", *norm);
	CHECK(st_comm_sync(w->comm) == 0, "sync");
	st_event_destroy(w->dev, e);
	st_event_destroy(w->dev, done);
	st_queue_destroy(w->dev, q);
}

/* Bad arguments are refused before anything moves, on every rank alike, and
 * stick until taken; the comm works after. */
static void test_errors(struct world *w)
{
	float *a = take(w, 64 * sizeof(float)), *b = take(w, 64 * sizeof(float));
	uint16_t *h = take(w, 64 * sizeof(uint16_t));
	size_t too_big = w->scratch_bytes / sizeof(float) / (size_t)w->n + 1;
	float *big = take(w, too_big * (size_t)w->n * sizeof(float));

	CHECK(st_comm_allreduce(w->comm, a, b, 0, ST_COMM_F32) == -EINVAL, "count 0");
	CHECK(st_comm_allgather(w->comm, a, b, 4, ST_COMM_F32) == -EINVAL, "sticky");
	CHECK(st_comm_sync(w->comm) == -EINVAL, "sync hands the error back");
	CHECK(st_comm_sync(w->comm) == 0, "and clears it");
	CHECK(st_comm_allreduce(w->comm, h, h, 64, ST_COMM_BF16) == -EINVAL, "bf16 reduced");
	CHECK(st_comm_take_error(w->comm) == -EINVAL, "take");
	CHECK(st_comm_broadcast(w->comm, a, b, 4, ST_COMM_F32, w->n) == -EINVAL, "root");
	CHECK(st_comm_take_error(w->comm) == -EINVAL, "take");
	CHECK(st_comm_allreduce(w->comm, a, a + 1, 8, ST_COMM_F32) == -EINVAL, "overlap");
	CHECK(st_comm_take_error(w->comm) == -EINVAL, "take");
	CHECK(st_comm_alltoall(w->comm, (char *)a + 1, b, 4, ST_COMM_F32) == -EINVAL, "align");
	CHECK(st_comm_take_error(w->comm) == -EINVAL, "take");
	/* The scratch is too small for this reduce-scatter: -ENOSPC, before
	 * any rank sends a byte. */
	CHECK(st_comm_reduce_scatter(w->comm, big, big + (size_t)w->rank * too_big, too_big,
				     ST_COMM_F32) == -ENOSPC, "scratch");
	CHECK(st_comm_sync(w->comm) == -ENOSPC, "sync");
	/* Still works. */
	for (int i = 0; i < 64; i++)
		a[i] = (float)(i + w->rank);
	CHECK(st_comm_allreduce(w->comm, a, b, 64, ST_COMM_F32) == 0, "after errors");
	CHECK(st_comm_sync(w->comm) == 0, "sync");
	for (int i = 0; i < 64; i++)
		CHECK(b[i] == (float)(w->n * i + w->n * (w->n - 1) / 2), "element %d: %g", i, b[i]);
}

static void test_stats(struct world *w)
{
	struct st_comm_stats s0, s1;
	double *x = take(w, 3 * sizeof(double)), *y = take(w, 3 * (size_t)w->n * sizeof(double));

	struct st_device_stats d0, d1;

	st_comm_get_stats(w->comm, &s0);
	st_device_get_stats(w->dev, &d0);
	x[0] = x[1] = x[2] = 1;
	CHECK(st_comm_allgather(w->comm, x, y, 3, ST_COMM_F64) == 0, "allgather");
	CHECK(st_comm_allreduce(w->comm, x, x, 3, ST_COMM_F64) == 0, "allreduce");
	CHECK(st_comm_sync(w->comm) == 0, "sync");
	st_comm_get_stats(w->comm, &s1);
	st_device_get_stats(w->dev, &d1);
	/* Staging moves through the device's copies; MPI on the arena none. */
	CHECK((d1.d2h_bytes > d0.d2h_bytes && d1.h2d_bytes > d0.h2d_bytes) == g_stage,
	      "device copies %llu/%llu -> %llu/%llu with staging %s",
	      (unsigned long long)d0.d2h_bytes, (unsigned long long)d0.h2d_bytes,
	      (unsigned long long)d1.d2h_bytes, (unsigned long long)d1.h2d_bytes,
	      g_stage ? "on" : "off");
	CHECK(s1.kind[ST_COMM_ALLGATHER].calls == s0.kind[ST_COMM_ALLGATHER].calls + 1, "calls");
	CHECK(s1.kind[ST_COMM_ALLGATHER].bytes ==
		      s0.kind[ST_COMM_ALLGATHER].bytes + 3 * sizeof(double) * (size_t)w->n,
	      "allgather bytes");
	CHECK(s1.kind[ST_COMM_ALLREDUCE].bytes == s0.kind[ST_COMM_ALLREDUCE].bytes + 24, "bytes");
	CHECK(s1.kind[ST_COMM_ALLREDUCE].busy_ns > s0.kind[ST_COMM_ALLREDUCE].busy_ns, "busy");
	CHECK(x[0] == w->n && x[2] == w->n, "allreduce of ones: %g", x[0]);
}

/* A second comm on the same device, used between the first's calls: its
 * own communicators and queue, no crossed messages. */
static void test_two_comms(struct world *w)
{
	struct st_comm_config cfg = { .scratch = take(w, 4 * MiB), .scratch_bytes = 4 * MiB,
				      .stage_host = g_stage };
	struct st_comm *c2;
	float *a = take(w, 100 * sizeof(float)), *b = take(w, 100 * sizeof(float));
	float *x = take(w, 100 * sizeof(float)), *y = take(w, 100 * sizeof(float));

	CHECK(st_comm_create(&st_comm_mpi_ops, w->dev, &cfg, &c2) == 0, "second comm");
	CHECK(st_comm_rank(c2) == w->rank && st_comm_world(c2) == w->n, "same world");
	for (int i = 0; i < 100; i++) {
		a[i] = (float)(w->rank * 100 + i);
		x[i] = -(float)(w->rank * 100 + i);
	}
	CHECK(st_comm_allreduce(w->comm, a, b, 100, ST_COMM_F32) == 0, "first");
	CHECK(st_comm_allreduce(c2, x, y, 100, ST_COMM_F32) == 0, "second");
	CHECK(st_comm_sync(c2) == 0 && st_comm_sync(w->comm) == 0, "syncs");
	for (int i = 0; i < 100; i++)
		CHECK(b[i] == -y[i] && b[i] == (float)(100 * w->n * (w->n - 1) / 2 + w->n * i),
		      "element %d: %g %g", i, b[i], y[i]);
	st_comm_destroy(c2);
}

static void test_host(struct world *w)
{
	int mine[2] = { w->rank, 1000 + w->rank }, *all = malloc(sizeof(mine) * (size_t)w->n);
	const char *lines[] = { "model=tiny", "steps=400", "data=/usr/share/common-licenses/GPL-3" };
	struct st_comm_disagreement d;

	CHECK(st_comm_host_allgather(w->comm, mine, all, sizeof(mine)) == 0, "host allgather");
	for (int q = 0; q < w->n; q++)
		CHECK(all[2 * q] == q && all[2 * q + 1] == 1000 + q, "host slot %d", q);
	CHECK(st_comm_barrier(w->comm) == 0, "barrier");
	for (int root = 0; root < w->n; root++) {
		long v[3] = { w->rank, 7 * w->rank, -w->rank };

		CHECK(st_comm_host_broadcast(w->comm, v, sizeof(v), root) == 0, "host broadcast");
		CHECK(v[0] == root && v[1] == 7 * root && v[2] == -root, "host broadcast root %d",
		      root);
	}
	CHECK(st_comm_host_broadcast(w->comm, mine, sizeof(mine), w->n) == -EINVAL, "bad root");
	CHECK(st_comm_agree(w->comm, lines, 3, &d) == 0, "the same lines agree");
	CHECK(st_comm_agree(w->comm, lines, 0, NULL) == 0, "no lines agree");
	/* The last rank has one line fewer: line 2 differs, "(none)". */
	CHECK(st_comm_agree(w->comm, lines, w->rank == w->n - 1 ? 2 : 3, &d) == 1, "fewer lines");
	CHECK(d.line == 2 && d.rank == w->n - 1, "line %d rank %d", d.line, d.rank);
	CHECK(strcmp(d.rank0_text, lines[2]) == 0 && strcmp(d.rank_text, "(none)") == 0,
	      "texts '%s' '%s'", d.rank0_text, d.rank_text);
	/* A line longer than ST_COMM_AGREE_TEXT is cut, with "...". */
	{
		char longline[3 * ST_COMM_AGREE_TEXT];
		const char *one[1] = { longline };

		memset(longline, 'a' + (w->rank == 1), sizeof(longline) - 1);
		longline[sizeof(longline) - 1] = 0;
		CHECK(st_comm_agree(w->comm, one, 1, &d) == 1 && d.rank == 1, "long lines differ");
		CHECK(strlen(d.rank_text) == ST_COMM_AGREE_TEXT - 1 &&
			      strcmp(d.rank_text + ST_COMM_AGREE_TEXT - 4, "...") == 0 &&
			      d.rank_text[0] == 'b' && d.rank0_text[0] == 'a',
		      "cut '%s'", d.rank_text);
	}
	free(all);
}

static void test_discovery(struct world *w)
{
	struct st_comm_launch l;
	const struct st_comm_ops *ops;
	char lib[256];
	const char *env = getenv("OMPI_COMM_WORLD_LOCAL_RANK");

	st_comm_launch(&l);
	CHECK(l.launcher && strcmp(l.launcher, "mpirun") == 0, "launcher %s",
	      l.launcher ? l.launcher : "(none)");
	CHECK(l.rank == w->rank && l.world == w->n, "launch says %d of %d", l.rank, l.world);
	CHECK(st_comm_auto("cpu", &ops) == 0 && ops == &st_comm_mpi_ops, "auto picks mpi");
	CHECK(env && st_comm_local_rank(w->comm) == atoi(env), "local rank %d, env %s",
	      st_comm_local_rank(w->comm), env ? env : "(unset)");
	CHECK(l.local_rank == st_comm_local_rank(w->comm), "launch's local rank");
	CHECK(st_comm_library(&st_comm_mpi_ops, lib, sizeof(lib)) == 0 &&
		      strncmp(lib, "Open MPI", 8) == 0,
	      "library '%s'", lib);
	CHECK(strstr(st_comm_list(), "mpi") != NULL, "list %s", st_comm_list());
	{
		char line[512], want[64];

		snprintf(want, sizeof(want), "launcher: mpirun, rank %d of %d, local rank %d",
			 w->rank, w->n, st_comm_local_rank(w->comm));
		st_comm_describe(line, sizeof(line));
		CHECK(strstr(line, want) && strstr(line, "mpi: Open MPI"), "describe '%s'", line);
		if (w->rank == 0)
			printf("test_comm_mpi: world %d: %s\n", w->n, line);
	}
}

/* ---- the fault modes ----------------------------------------------------------------- */

static int run_mismatch(void)
{
	struct world w;
	struct st_comm_disagreement d;
	const char *lines[] = { "model=tiny", "seed=1", "steps=400", "lr=0.001" };
	char text[2 * ST_COMM_AGREE_TEXT + 64];
	int ret;

	open_world(&w, 30);
	if (w.rank == w.n - 1)
		lines[2] = "steps=300";
	ret = st_comm_agree(w.comm, lines, 4, &d);
	CHECK(ret == 1, "agree returned %d", ret);
	CHECK(d.line == 2 && d.rank == w.n - 1 && strcmp(d.rank0_text, "steps=400") == 0 &&
		      strcmp(d.rank_text, "steps=300") == 0,
	      "found line %d rank %d '%s' '%s'", d.line, d.rank, d.rank0_text, d.rank_text);
	/* What a CLI does: one line, exit 2, on every rank. */
	fprintf(stderr, "test_comm_mpi: rank %d: %s\n", w.rank,
		st_comm_disagreement_line(&d, text, sizeof(text)));
	close_world(&w);
	return 2;
}

static int run_kill(void)
{
	struct world w;
	float *a;

	open_world(&w, 60);
	a = take(&w, 4096 * sizeof(float));
	for (int it = 0; it < 1000; it++) {
		for (int i = 0; i < 4096; i++)
			a[i] = 1.0f;
		if (it == 5 && w.rank == w.n - 1) {
			fprintf(stderr, "test_comm_mpi: rank %d kills itself (SIGKILL) at step %d\n",
				w.rank, it);
			raise(SIGKILL);
		}
		CHECK(st_comm_allreduce(w.comm, a, a, 4096, ST_COMM_F32) == 0, "allreduce");
		CHECK(st_comm_sync(w.comm) == 0, "sync");
		usleep(10000);
	}
	fprintf(stderr, "test_comm_mpi: rank %d: the job went on after a rank died\n", w.rank);
	close_world(&w);
	return 0;
}

/* Rank world-1 fails alone and returns 1 from main, as a CLI would after
 * an I/O error, while the others wait in an allreduce: exit runs
 * MPI_Finalize on it (not MPI_Abort: no comm error). */
static int run_exit(void)
{
	struct world w;
	float *a;

	open_world(&w, 0); /* $ST_COMM_TIMEOUT */
	a = take(&w, 1024 * sizeof(float));
	for (int it = 0; it < 1000; it++) {
		if (it == 3 && w.rank == w.n - 1) {
			fprintf(stderr, "test_comm_mpi: rank %d fails alone and exits 1 at step %d\n",
				w.rank, it);
			exit(1);
		}
		CHECK(st_comm_allreduce(w.comm, a, a, 1024, ST_COMM_F32) == 0, "allreduce");
		CHECK(st_comm_sync(w.comm) == 0, "sync");
	}
	close_world(&w);
	return 0;
}

/* The ranks disagree on a count (a bug in a caller): rank 0 gathers
 * slices one element longer than the others send. MPI reports the
 * truncation on the queue's thread (MPI_ERRORS_RETURN); the error must come
 * back from st_comm_sync as -EIO naming the call, stick, and the rank's
 * exit must end the job rather than leave it waiting. */
static int run_truncate(void)
{
	struct world w;
	float *a;
	size_t n = 256;
	int ret;

	open_world(&w, 0);
	a = take(&w, (size_t)w.n * (n + 1) * sizeof(float));
	memset(a, 0, (size_t)w.n * (n + 1) * sizeof(float));
	ret = st_comm_allgather(w.comm, a + 2 * n * (size_t)w.n, a, w.rank == 0 ? n : n + 1,
				ST_COMM_F32);
	if (ret == 0)
		ret = st_comm_sync(w.comm);
	fprintf(stderr, "test_comm_mpi: rank %d: allgather of mismatched counts: %d (%s)\n",
		w.rank, ret, ret ? st_error_last() : "no error");
	if (ret == 0)
		return 0;
	CHECK(ret == -EIO && strstr(st_error_last(), "MPI_Allgather"), "the error names the call");
	/* Handed back once, but the comm stays broken: every later call fails. */
	CHECK(st_comm_allgather(w.comm, a, a + n, 1, ST_COMM_F32) == -EIO &&
		      strstr(st_error_last(), "unusable"),
	      "a call after the error");
	CHECK(st_comm_sync(w.comm) == -EIO, "and it sticks");
	fprintf(stderr, "test_comm_mpi: rank %d: later calls fail: %s\n", w.rank, st_error_last());
	return 1; /* alone or not, the exit handler ends the job */
}

static int run_stuck(void)
{
	struct world w;
	float *a;

	double was;

	/* Open with no limit, then take $ST_COMM_TIMEOUT through
	 * st_comm_set_timeout (so a limit set while running is what fires). */
	open_world(&w, -1);
	was = st_comm_set_timeout(w.comm, atof(getenv("ST_COMM_TIMEOUT") ? getenv("ST_COMM_TIMEOUT")
									    : "300"));
	CHECK(was == 0, "the timeout was %g, opened with none", was);
	a = take(&w, 1024 * sizeof(float));
	for (int it = 0; it < 1000; it++) {
		if (it == 3 && w.rank == w.n - 1) {
			fprintf(stderr, "test_comm_mpi: rank %d stops taking part at step %d\n", w.rank,
				it);
			sleep(120);
			return 0;
		}
		CHECK(st_comm_allreduce(w.comm, a, a, 1024, ST_COMM_F32) == 0, "allreduce");
		CHECK(st_comm_sync(w.comm) == 0, "sync");
	}
	close_world(&w);
	return 0;
}

static int run_stuck_start(void)
{
	struct world w;
	int level = 0, rank = 0, n = 0;

	MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &level);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	if (rank == n - 1) {
		fprintf(stderr, "test_comm_mpi: rank %d never opens its comm\n", rank);
		sleep(120);
		return 0;
	}
	open_world(&w, atof(getenv("ST_COMM_TIMEOUT") ? getenv("ST_COMM_TIMEOUT") : "300"));
	close_world(&w);
	return 0;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "all";
	struct world w;

	if (strcmp(mode, "--help") == 0) {
		printf("usage: tests/mpi-run N test_comm_mpi [all|--stage|mismatch|kill|exit|truncate|stuck|stuck-start]\n"
		       "  the mpi comm backend across N ranks (see the top of test_comm_mpi.c)\n");
		return 0;
	}
	if (strcmp(mode, "mismatch") == 0)
		return run_mismatch();
	if (strcmp(mode, "kill") == 0)
		return run_kill();
	if (strcmp(mode, "stuck") == 0)
		return run_stuck();
	if (strcmp(mode, "stuck-start") == 0)
		return run_stuck_start();
	if (strcmp(mode, "exit") == 0)
		return run_exit();
	if (strcmp(mode, "truncate") == 0)
		return run_truncate();
	if (strcmp(mode, "--stage") == 0) {
		g_stage = true;
		mode = "all";
	}
	if (strcmp(mode, "all") != 0) {
		fprintf(stderr, "test_comm_mpi: unknown mode '%s' (all, --stage, mismatch, kill, exit, truncate, stuck, stuck-start)\n",
			mode);
		return 2;
	}
	open_world(&w, 60);
	CHECK(st_comm_set_timeout(w.comm, 90) == 60 && st_comm_set_timeout(w.comm, 60) == 90,
	      "set_timeout hands back the limit it replaces");
	test_discovery(&w);
	test_collectives(&w);
	if (g_stage)
		test_pieces(&w);
	test_queued(&w);
	test_errors(&w);
	test_stats(&w);
	test_two_comms(&w);
	test_host(&w);
	CHECK(st_comm_barrier(w.comm) == 0, "final barrier");
	if (w.rank == 0)
		printf("test_comm_mpi: %d ranks%s: %ld checks passed on rank 0\n", w.n,
		       g_stage ? ", through host staging" : "", g_checks);
	close_world(&w);
	return 0;
}
