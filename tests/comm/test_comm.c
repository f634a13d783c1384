/* Comm tests on the cpu device: every collective of the local backend at
 * world 1, in place and out of place, fp32, fp64 (and bf16 where it
 * moves); the ordering against the device's other queues through events;
 * the sticky error and bad arguments; registration; the stats; and the
 * composed reductions (all-to-all / allgather + the rank-order sum) through
 * a fake world-3 backend, so the order promise of strata/comm.h is checked
 * where a real mpi or nccl backend will rely on it. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "strata/comm.h"
#include "strata/device.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MiB (1024ull * 1024ull)

struct ctx {
	struct st_device *dev;
	struct st_comm *comm;
	char *arena; /* device memory: the buffers are carved from it */
	uint64_t arena_bytes;
};

static int setup(void **state)
{
	struct ctx *c = calloc(1, sizeof(*c));
	struct st_device_config cfg = { .mem_bytes = 16 * MiB };

	if (!c || st_device_create(&st_device_cpu_ops, &cfg, &c->dev) != 0)
		return -1;
	if (st_comm_create(&st_comm_local_ops, c->dev, NULL, &c->comm) != 0)
		return -1;
	c->arena = st_device_arena(c->dev, &c->arena_bytes);
	*state = c;
	return 0;
}

static int teardown(void **state)
{
	struct ctx *c = *state;

	st_comm_destroy(c->comm);
	st_device_destroy(c->dev);
	free(c);
	return 0;
}

/* A pattern whose bits a fold from +0 or a lossy path would change: -0.0,
 * a subnormal, a value with every mantissa bit. */
static void fill_f32(float *p, size_t n, float salt)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (float)i * 0.37f + salt;
	if (n > 2) {
		p[0] = -0.0f;
		p[1] = 1e-40f;
		p[2] = 0.99999994f;
	}
}

static void fill_f64(double *p, size_t n, double salt)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (double)i * 0.37 + salt;
	if (n > 2) {
		p[0] = -0.0;
		p[1] = 4.9e-324;
		p[2] = 0.9999999999999999;
	}
}

static void fill(void *p, size_t n, enum st_comm_dtype dt, int salt)
{
	if (dt == ST_COMM_F32)
		fill_f32(p, n, (float)salt);
	else if (dt == ST_COMM_F64)
		fill_f64(p, n, (double)salt);
	else
		for (size_t i = 0; i < n; i++)
			((uint16_t *)p)[i] = (uint16_t)(0x3f80 + i + (size_t)salt);
}

/* Run kind k on (send, recv) of n elements (per slice or count: world 1
 * makes them the same). */
static int run_kind(struct st_comm *comm, enum st_comm_kind k, const void *send, void *recv,
		    size_t n, enum st_comm_dtype dt)
{
	switch (k) {
	case ST_COMM_ALLREDUCE:
		return st_comm_allreduce(comm, send, recv, n, dt);
	case ST_COMM_REDUCE_SCATTER:
		return st_comm_reduce_scatter(comm, send, recv, n, dt);
	case ST_COMM_ALLGATHER:
		return st_comm_allgather(comm, send, recv, n, dt);
	case ST_COMM_ALLTOALL:
		return st_comm_alltoall(comm, send, recv, n, dt);
	case ST_COMM_BROADCAST:
		return st_comm_broadcast(comm, send, recv, n, dt, 0);
	default:
		break;
	}
	fail();
	return -1;
}

static bool reducing(enum st_comm_kind k)
{
	return k == ST_COMM_ALLREDUCE || k == ST_COMM_REDUCE_SCATTER;
}

static void test_find(void **state)
{
	(void)state;
	assert_ptr_equal(st_comm_find("local"), &st_comm_local_ops);
	assert_null(st_comm_find("gloo"));
	/* mpi and nccl are there exactly when built */
	assert_true(strncmp(st_comm_list(), "local", 5) == 0);
	assert_int_equal(st_comm_find("mpi") != NULL, strstr(st_comm_list(), "mpi") != NULL);
	assert_int_equal(st_comm_find("nccl") != NULL, strstr(st_comm_list(), "nccl") != NULL);
#ifdef ST_HAVE_MPI
	assert_ptr_equal(st_comm_find("mpi"), &st_comm_mpi_ops);
#endif
	assert_null(st_comm_find(""));
	assert_null(st_comm_find(NULL));
	assert_string_equal(st_comm_kind_name(ST_COMM_REDUCE_SCATTER), "reduce_scatter");
	assert_string_equal(st_comm_kind_name(ST_COMM_BROADCAST), "broadcast");
	assert_int_equal(st_comm_dtype_bytes(ST_COMM_F32), 4);
	assert_int_equal(st_comm_dtype_bytes(ST_COMM_F64), 8);
	assert_int_equal(st_comm_dtype_bytes(ST_COMM_BF16), 2);
}

/* The launcher's environment, and the backend it picks. */
static void test_launch(void **state)
{
	static const char *const vars[] = { "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
					     "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_RANK",
					     "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
					     "SLURM_PROCID",
					     "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID" };
	struct st_comm_launch l;
	const struct st_comm_ops *ops;
	char lib[64];
	int ret;

	(void)state;
	for (size_t i = 0; i < ST_ARRAY_LEN(vars); i++)
		unsetenv(vars[i]);
	st_comm_launch(&l);
	assert_null(l.launcher);
	assert_int_equal(l.rank, -1);
	assert_int_equal(st_comm_auto("cpu", &ops), 0);
	assert_ptr_equal(ops, &st_comm_local_ops);

	setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
	setenv("OMPI_COMM_WORLD_RANK", "2", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
	st_comm_launch(&l);
	assert_string_equal(l.launcher, "mpirun");
	assert_int_equal(l.rank, 2);
	assert_int_equal(l.world, 4);
	assert_int_equal(l.local_rank, 1);
	ret = st_comm_auto("cpu", &ops);
	if (st_comm_find("mpi")) {
		assert_int_equal(ret, 0);
		assert_string_equal(ops->name, "mpi");
	} else {
		assert_int_equal(ret, -ENOTSUP);
		assert_non_null(strstr(st_error_last(), "without the mpi backend"));
		assert_ptr_equal(ops, &st_comm_local_ops);
	}
	ret = st_comm_auto("cuda", &ops);
	assert_int_equal(ret, st_comm_find("nccl") ? 0 : -ENOTSUP);
	unsetenv("OMPI_COMM_WORLD_SIZE");
	unsetenv("OMPI_COMM_WORLD_RANK");
	unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");

	setenv("PMIX_RANK", "3", 1);
	setenv("SLURM_NTASKS", "8", 1);
	setenv("SLURM_LOCALID", "0", 1);
	st_comm_launch(&l);
	assert_string_equal(l.launcher, "pmix");
	assert_int_equal(l.rank, 3);
	assert_int_equal(l.world, 8);
	assert_int_equal(l.local_rank, 0);
	setenv("SLURM_STEP_NUM_TASKS", "6", 1); /* srun's step, before the job's tasks */
	st_comm_launch(&l);
	assert_string_equal(l.launcher, "pmix");
	assert_int_equal(l.world, 6);
	unsetenv("PMIX_RANK");
	unsetenv("SLURM_NTASKS");

	/* srun with no MPI plugin: refused, whatever $ST_COMM says; a step
	 * of one task, or a batch script (no step variables), is one rank */
	setenv("SLURM_PROCID", "1", 1);
	setenv("SLURM_LOCALID", "1", 1);
	st_comm_launch(&l);
	assert_string_equal(l.launcher, "srun");
	assert_int_equal(l.rank, 1);
	assert_int_equal(l.world, 6);
	assert_int_equal(l.local_rank, 1);
	assert_int_equal(st_comm_auto("cpu", &ops), -EINVAL);
	assert_non_null(strstr(st_error_last(), "srun started 6 tasks with no MPI plugin"));
	assert_non_null(strstr(st_error_last(), "srun --mpi=pmix"));
	assert_ptr_equal(ops, &st_comm_local_ops);
	setenv("ST_COMM", "local", 1);
	assert_int_equal(st_comm_auto("cpu", &ops), -EINVAL);
	unsetenv("ST_COMM");
	setenv("SLURM_STEP_NUM_TASKS", "1", 1);
	st_comm_launch(&l);
	assert_null(l.launcher);
	unsetenv("SLURM_STEP_NUM_TASKS");
	st_comm_launch(&l);
	assert_null(l.launcher);
	unsetenv("SLURM_PROCID");
	unsetenv("SLURM_LOCALID");

	setenv("PMI_RANK", "1", 1);
	setenv("PMI_SIZE", "2", 1);
	setenv("MPI_LOCALRANKID", "x", 1); /* not a number: unknown */
	st_comm_launch(&l);
	assert_string_equal(l.launcher, "pmi");
	assert_int_equal(l.world, 2);
	assert_int_equal(l.local_rank, -1);
	unsetenv("PMI_RANK");
	unsetenv("PMI_SIZE");
	unsetenv("MPI_LOCALRANKID");

	assert_int_equal(st_comm_library(&st_comm_local_ops, lib, sizeof(lib)), 0);
	assert_string_equal(lib, "local");
	{
		char line[512];

		st_comm_describe(line, sizeof(line));
		assert_true(strncmp(line, st_comm_list(), strlen(st_comm_list())) == 0);
		assert_non_null(strstr(line, "launcher: none, one rank"));
		if (st_comm_find("mpi"))
			assert_non_null(strstr(line, "mpi: Open MPI"));
		if (st_comm_find("nccl"))
			assert_non_null(strstr(line, "nccl: NCCL 2."));
		/* cut short, still a string */
		st_comm_describe(line, 8);
		assert_int_equal(strlen(line), 7);
	}
}

/* World 1: the host exchange is a copy, the barrier nothing, and any lines
 * agree with themselves. */
static void test_local_host(void **state)
{
	struct ctx *c = *state;
	const char *lines[] = { "a=1", "b=2" };
	struct st_comm_disagreement d = { .line = -5 };
	int x = 42, y = 0;

	assert_int_equal(st_comm_local_rank(c->comm), 0);
	assert_true(st_comm_set_timeout(c->comm, 5) == 0); /* world 1: no limit to set */
	assert_int_equal(st_comm_host_allgather(c->comm, &x, &y, sizeof(x)), 0);
	assert_int_equal(y, 42);
	assert_int_equal(st_comm_barrier(c->comm), 0);
	assert_int_equal(st_comm_agree(c->comm, lines, 2, &d), 0);
	assert_int_equal(d.line, -5); /* untouched */
	assert_int_equal(st_comm_agree(c->comm, NULL, 0, NULL), 0);
}

static void test_local_world(void **state)
{
	struct ctx *c = *state;

	assert_string_equal(st_comm_name(c->comm), "local");
	assert_int_equal(st_comm_rank(c->comm), 0);
	assert_int_equal(st_comm_world(c->comm), 1);
	assert_ptr_equal(st_comm_device(c->comm), c->dev);
	assert_non_null(st_comm_queue(c->comm));
	st_comm_destroy(NULL);
}

/* Out of place: recv holds send's bits, the guard after recv is untouched,
 * send is unchanged, the device moved exactly the bytes. */
static void out_of_place(struct ctx *c, enum st_comm_dtype dt)
{
	const size_t n = 1000;
	size_t eb = st_comm_dtype_bytes(dt), bytes = n * eb;
	char *send = c->arena, *recv = c->arena + 64 * 1024;
	char *want = malloc(bytes);

	assert_non_null(want);
	for (int k = 0; k < ST_COMM_KINDS; k++) {
		struct st_device_stats d0, d1;

		if (dt == ST_COMM_BF16 && reducing((enum st_comm_kind)k))
			continue;
		fill(send, n, dt, k + 1);
		memcpy(want, send, bytes);
		memset(recv, 0x5a, bytes + 64);
		st_device_get_stats(c->dev, &d0);
		assert_int_equal(run_kind(c->comm, (enum st_comm_kind)k, send, recv, n, dt), 0);
		assert_int_equal(st_comm_sync(c->comm), 0);
		st_device_get_stats(c->dev, &d1);
		assert_memory_equal(recv, want, bytes);
		assert_memory_equal(send, want, bytes);
		for (size_t i = 0; i < 64; i++)
			assert_int_equal((unsigned char)recv[bytes + i], 0x5a);
		assert_int_equal(d1.d2d_bytes - d0.d2d_bytes, bytes);
		assert_int_equal(d1.copies - d0.copies, 1);
	}
	free(want);
}

static void test_out_of_place_f32(void **state)
{
	out_of_place(*state, ST_COMM_F32);
}

static void test_out_of_place_f64(void **state)
{
	out_of_place(*state, ST_COMM_F64);
}

static void test_out_of_place_bf16(void **state)
{
	out_of_place(*state, ST_COMM_BF16);
}

/* In place at world 1: the buffer keeps its bits, and nothing at all is
 * queued: no device copy, no busy time. */
static void in_place(struct ctx *c, enum st_comm_dtype dt)
{
	const size_t n = 777;
	size_t bytes = n * st_comm_dtype_bytes(dt);
	char *buf = c->arena + 4096;
	char *want = malloc(bytes);
	struct st_comm_stats s0, s1;
	struct st_device_stats d0, d1;

	assert_non_null(want);
	fill(buf, n, dt, 3);
	memcpy(want, buf, bytes);
	st_comm_get_stats(c->comm, &s0);
	st_device_get_stats(c->dev, &d0);
	for (int k = 0; k < ST_COMM_KINDS; k++)
		assert_int_equal(run_kind(c->comm, (enum st_comm_kind)k, buf, buf, n, dt), 0);
	assert_int_equal(st_comm_sync(c->comm), 0);
	st_device_get_stats(c->dev, &d1);
	st_comm_get_stats(c->comm, &s1);
	assert_memory_equal(buf, want, bytes);
	assert_int_equal(d1.copies, d0.copies);
	assert_int_equal(d1.d2d_bytes, d0.d2d_bytes);
	for (int k = 0; k < ST_COMM_KINDS; k++) {
		assert_int_equal(s1.kind[k].calls - s0.kind[k].calls, 1);
		assert_int_equal(s1.kind[k].bytes - s0.kind[k].bytes, bytes);
		assert_int_equal(s1.kind[k].busy_ns, s0.kind[k].busy_ns);
	}
	free(want);
}

static void test_in_place_f32(void **state)
{
	in_place(*state, ST_COMM_F32);
}

static void test_in_place_f64(void **state)
{
	in_place(*state, ST_COMM_F64);
}

/* The global norm's combine at world 1: one double, in place, stays. */
static void test_norm_double(void **state)
{
	struct ctx *c = *state;
	double *sumsq = (double *)(c->arena + 8192);

	*sumsq = 1234.5678901234567;
	assert_int_equal(st_comm_allreduce(c->comm, sumsq, sumsq, 1, ST_COMM_F64), 0);
	assert_int_equal(st_comm_sync(c->comm), 0);
	assert_true(*sumsq == 1234.5678901234567);

	/* in place at world 1 touches nothing: the engine's host-side sum */
	double host_sumsq = -0.0;

	assert_int_equal(st_comm_allreduce(c->comm, &host_sumsq, &host_sumsq, 1, ST_COMM_F64),
			 0);
	assert_int_equal(st_comm_sync(c->comm), 0);
	assert_true(host_sumsq == 0.0 && signbit(host_sumsq));
}

/* ---- ordering through events -------------------------------------------------- */

struct slow_write {
	float *p;
	size_t n;
	float v;
};

static void sleep_ms(int ms)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = ms * 1000000L };

	nanosleep(&ts, NULL);
}

/* On another queue: late, then the values the collective must see. */
static void slow_write_fn(void *arg)
{
	struct slow_write *w = arg;

	sleep_ms(50);
	for (size_t i = 0; i < w->n; i++)
		w->p[i] = w->v + (float)i;
}

struct snapshot {
	const float *src;
	float *dst;
	size_t n;
};

static void snapshot_fn(void *arg)
{
	struct snapshot *s = arg;

	memcpy(s->dst, s->src, s->n * sizeof(float));
}

static void test_event_order(void **state)
{
	struct ctx *c = *state;
	const size_t n = 4096;
	float *send = (float *)c->arena, *recv = (float *)(c->arena + MiB);
	float *seen = calloc(n, sizeof(float));
	struct st_queue *producer, *consumer;
	struct st_event *produced, *reduced;
	/* static: a failed assertion must not leave a queue pointing into a dead frame */
	static struct slow_write w;
	static struct snapshot s;

	assert_non_null(seen);
	w = (struct slow_write){ .p = send, .n = n, .v = 7.0f };
	s = (struct snapshot){ .src = recv, .dst = seen, .n = n };
	for (size_t i = 0; i < n; i++)
		send[i] = -1.0f, recv[i] = -2.0f;
	assert_int_equal(st_queue_create(c->dev, &producer), 0);
	assert_int_equal(st_queue_create(c->dev, &consumer), 0);
	assert_int_equal(st_event_create(c->dev, &produced), 0);
	assert_int_equal(st_event_create(c->dev, &reduced), 0);

	/* producer: 50 ms late, then writes send; the comm waits for it */
	assert_int_equal(st_device_host_fn(c->dev, producer, slow_write_fn, &w), 0);
	assert_int_equal(st_event_record(c->dev, produced, producer), 0);
	assert_int_equal(st_comm_wait(c->comm, produced), 0);
	assert_int_equal(st_comm_allreduce(c->comm, send, recv, n, ST_COMM_F32), 0);
	assert_int_equal(st_comm_record(c->comm, reduced), 0);
	/* consumer: waits for the comm's event, then reads recv */
	assert_int_equal(st_queue_wait(c->dev, consumer, reduced), 0);
	assert_int_equal(st_device_host_fn(c->dev, consumer, snapshot_fn, &s), 0);
	/* nothing has run yet: the producer is still asleep */
	assert_int_equal(st_event_query(c->dev, reduced), 0);

	assert_int_equal(st_queue_sync(c->dev, consumer), 0);
	for (size_t i = 0; i < n; i++) {
		assert_true(seen[i] == 7.0f + (float)i);
		assert_true(recv[i] == 7.0f + (float)i);
	}
	assert_int_equal(st_event_query(c->dev, reduced), 1);
	assert_int_equal(st_comm_sync(c->comm), 0);

	st_event_destroy(c->dev, reduced);
	st_event_destroy(c->dev, produced);
	st_queue_destroy(c->dev, consumer);
	st_queue_destroy(c->dev, producer);
	free(seen);
}

/* ---- errors --------------------------------------------------------------------- */

static void expect_einval(struct ctx *c, int ret)
{
	assert_int_equal(ret, -EINVAL);
	assert_true(strlen(st_error_last()) > 0);
	assert_int_equal(st_comm_take_error(c->comm), -EINVAL);
	assert_int_equal(st_comm_take_error(c->comm), 0);
}

static void test_bad_args(void **state)
{
	struct ctx *c = *state;
	struct st_comm *m = c->comm;
	float *f = (float *)c->arena;
	double *d = (double *)(c->arena + 65536);
	struct st_comm_stats s0, s1;

	st_comm_get_stats(m, &s0);
	/* count 0 */
	expect_einval(c, st_comm_allreduce(m, f, f, 0, ST_COMM_F32));
	expect_einval(c, st_comm_reduce_scatter(m, f, f + 64, 0, ST_COMM_F32));
	/* NULL buffers */
	expect_einval(c, st_comm_allgather(m, NULL, f, 4, ST_COMM_F32));
	expect_einval(c, st_comm_broadcast(m, f, NULL, 4, ST_COMM_F32, 0));
	/* a buffer not aligned to its elements */
	expect_einval(c, st_comm_allreduce(m, (char *)d + 4, d + 16, 4, ST_COMM_F64));
	expect_einval(c, st_comm_alltoall(m, f, (float *)((char *)f + 66), 4, ST_COMM_F32));
	/* misaligned slices: neither the rank's own slice nor disjoint */
	expect_einval(c, st_comm_reduce_scatter(m, f, f + 1, 8, ST_COMM_F32));
	expect_einval(c, st_comm_allgather(m, f + 3, f, 8, ST_COMM_F32));
	expect_einval(c, st_comm_allreduce(m, d, d + 7, 8, ST_COMM_F64));
	expect_einval(c, st_comm_alltoall(m, f + 2, f, 8, ST_COMM_F32));
	/* root outside the world, dtype out of range, bf16 reduced */
	expect_einval(c, st_comm_broadcast(m, f, f + 64, 4, ST_COMM_F32, 1));
	expect_einval(c, st_comm_broadcast(m, f, f + 64, 4, ST_COMM_F32, -1));
	expect_einval(c, st_comm_allreduce(m, f, f + 64, 4, (enum st_comm_dtype)7));
	expect_einval(c, st_comm_allreduce(m, f, f + 64, 4, ST_COMM_BF16));
	expect_einval(c, st_comm_reduce_scatter(m, f, f, 4, ST_COMM_BF16));
	/* a refused call is not counted */
	st_comm_get_stats(m, &s1);
	assert_memory_equal(&s0, &s1, sizeof(s0));
	/* adjacent, disjoint slices are fine */
	assert_int_equal(st_comm_allreduce(m, f, f + 8, 8, ST_COMM_F32), 0);
	assert_int_equal(st_comm_sync(m), 0);
}

static void test_sticky(void **state)
{
	struct ctx *c = *state;
	struct st_comm *m = c->comm;
	float *send = (float *)c->arena, *recv = (float *)(c->arena + 8192);
	struct st_event *e;
	struct st_comm_stats s0, s1;

	assert_int_equal(st_event_create(c->dev, &e), 0);
	for (int i = 0; i < 16; i++)
		send[i] = (float)i, recv[i] = -1.0f;
	assert_int_equal(st_comm_allreduce(m, send, recv, 0, ST_COMM_F32), -EINVAL);
	st_comm_get_stats(m, &s0);
	/* skipped while sticky: nothing copied, nothing counted */
	assert_int_equal(st_comm_allreduce(m, send, recv, 16, ST_COMM_F32), -EINVAL);
	assert_int_equal(st_comm_allgather(m, send, recv, 16, ST_COMM_F32), -EINVAL);
	assert_int_equal(st_comm_record(m, e), -EINVAL);
	assert_int_equal(st_comm_wait(m, e), -EINVAL);
	assert_int_equal(st_comm_sync(m), -EINVAL); /* hands it back, cleared */
	st_comm_get_stats(m, &s1);
	assert_memory_equal(&s0, &s1, sizeof(s0));
	for (int i = 0; i < 16; i++)
		assert_true(recv[i] == -1.0f);
	/* cleared: the next collective runs */
	assert_int_equal(st_comm_sync(m), 0);
	assert_int_equal(st_comm_allreduce(m, send, recv, 16, ST_COMM_F32), 0);
	assert_int_equal(st_comm_record(m, e), 0);
	assert_int_equal(st_event_sync(c->dev, e), 0);
	for (int i = 0; i < 16; i++)
		assert_true(recv[i] == (float)i);
	assert_int_equal(st_comm_sync(m), 0);
	st_event_destroy(c->dev, e);
}

/* ---- registration --------------------------------------------------------------- */

static int fail_open(struct st_comm *c, const struct st_comm_config *cfg, int *rank,
		     int *world)
{
	(void)c, (void)cfg, (void)rank, (void)world;
	return -ECONNREFUSED;
}

static void test_registration(void **state)
{
	struct ctx *c = *state;
	struct st_comm_ops ops = st_comm_local_ops;
	struct st_comm *m = (struct st_comm *)&ops; /* must come back NULL */

	/* the local table as it is opens */
	assert_int_equal(st_comm_create(&ops, c->dev, NULL, &m), 0);
	st_comm_destroy(m);

	ops.alltoall = NULL; /* a required hook */
	assert_int_equal(st_comm_create(&ops, c->dev, NULL, &m), -EINVAL);
	assert_null(m);
	ops = st_comm_local_ops;
	ops.open = NULL;
	assert_int_equal(st_comm_create(&ops, c->dev, NULL, &m), -EINVAL);
	ops = st_comm_local_ops;
	ops.broadcast = NULL;
	assert_int_equal(st_comm_create(&ops, c->dev, NULL, &m), -EINVAL);
	ops = st_comm_local_ops;
	ops.version = ST_COMM_OPS_VERSION + 1;
	assert_int_equal(st_comm_create(&ops, c->dev, NULL, &m), -EINVAL);
	ops = st_comm_local_ops;
	ops.name = NULL;
	assert_int_equal(st_comm_create(&ops, c->dev, NULL, &m), -EINVAL);
	assert_int_equal(st_comm_create(NULL, c->dev, NULL, &m), -EINVAL);
	/* optional hooks may be absent */
	ops = st_comm_local_ops;
	ops.reduce_scatter = NULL;
	ops.allreduce = NULL;
	ops.reduce_local = NULL;
	assert_int_equal(st_comm_create(&ops, c->dev, NULL, &m), 0);
	st_comm_destroy(m);
	/* the backend's own error comes back, nothing is left open */
	ops = st_comm_local_ops;
	ops.open = fail_open;
	assert_int_equal(st_comm_create(&ops, c->dev, NULL, &m), -ECONNREFUSED);
	assert_null(m);
}

/* ---- stats ---------------------------------------------------------------------- */

static void test_stats(void **state)
{
	struct ctx *c = *state;
	struct st_comm *m;
	struct st_comm_stats s;
	char *a = c->arena, *b = c->arena + 4 * MiB;

	/* a fresh comm, so the counts are this test's alone */
	assert_int_equal(st_comm_create(&st_comm_local_ops, c->dev, NULL, &m), 0);
	st_comm_get_stats(m, &s);
	for (int k = 0; k < ST_COMM_KINDS; k++)
		assert_true(s.kind[k].calls == 0 && s.kind[k].bytes == 0 && s.kind[k].busy_ns == 0);

	assert_int_equal(st_comm_reduce_scatter(m, a, b, 1000, ST_COMM_F32), 0);
	assert_int_equal(st_comm_reduce_scatter(m, a, a, 24, ST_COMM_F32), 0);
	assert_int_equal(st_comm_allreduce(m, a, a, 1, ST_COMM_F64), 0);
	assert_int_equal(st_comm_allgather(m, a, b, 2 * MiB / 2, ST_COMM_BF16), 0);
	assert_int_equal(st_comm_alltoall(m, a, b, 10, ST_COMM_F64), 0);
	assert_int_equal(st_comm_broadcast(m, a, b, 3, ST_COMM_F32, 0), 0);
	assert_int_equal(st_comm_broadcast(m, a, b, 5, ST_COMM_F32, 0), 0);
	assert_int_equal(st_comm_sync(m), 0);
	st_comm_get_stats(m, &s);

	assert_int_equal(s.kind[ST_COMM_REDUCE_SCATTER].calls, 2);
	assert_int_equal(s.kind[ST_COMM_REDUCE_SCATTER].bytes, 4000 + 96);
	assert_int_equal(s.kind[ST_COMM_ALLREDUCE].calls, 1);
	assert_int_equal(s.kind[ST_COMM_ALLREDUCE].bytes, 8);
	assert_int_equal(s.kind[ST_COMM_ALLREDUCE].busy_ns, 0); /* in place */
	assert_int_equal(s.kind[ST_COMM_ALLGATHER].calls, 1);
	assert_int_equal(s.kind[ST_COMM_ALLGATHER].bytes, 2 * MiB);
	/* 2 MiB copied: the queue was busy for some time */
	assert_true(s.kind[ST_COMM_ALLGATHER].busy_ns > 0);
	assert_int_equal(s.kind[ST_COMM_ALLTOALL].calls, 1);
	assert_int_equal(s.kind[ST_COMM_ALLTOALL].bytes, 80);
	assert_int_equal(s.kind[ST_COMM_BROADCAST].calls, 2);
	assert_int_equal(s.kind[ST_COMM_BROADCAST].bytes, 32);
	st_comm_destroy(m);
}

/* ---- the composed reductions: a fake world of 3 -------------------------------- */

/* A backend at world 3, rank 1, with no reduce_scatter, allreduce or
 * reduce_local hook, so the core composes them. Its "peers" hold fixed
 * data: peer q's element i is peer_value(q, i), chosen so that the sum
 * depends on the order of its terms; this rank's data is its own send. */
#define FAKE_WORLD 3
#define FAKE_RANK 1

static float peer_f32(int q, size_t i)
{
	return q == 0 ? 16777216.0f + (float)i : -16777216.0f;
}

static double peer_f64(int q, size_t i)
{
	return q == 0 ? 9007199254740992.0 + (double)i : -9007199254740992.0;
}

struct fake_move {
	const void *send;
	void *recv;
	size_t n;
	enum st_comm_dtype dt;
	bool gather; /* allgather: the send is the slice; alltoall: slot FAKE_RANK of it */
};

static void fake_move_fn(void *arg)
{
	struct fake_move *f = arg;
	size_t eb = st_comm_dtype_bytes(f->dt);
	const char *mine = (const char *)f->send + (f->gather ? 0 : FAKE_RANK * f->n * eb);

	for (int q = 0; q < FAKE_WORLD; q++) {
		char *slot = (char *)f->recv + (size_t)q * f->n * eb;

		if (q == FAKE_RANK) {
			memmove(slot, mine, f->n * eb);
			continue;
		}
		for (size_t i = 0; i < f->n; i++) {
			if (f->dt == ST_COMM_F32)
				((float *)slot)[i] = peer_f32(q, i);
			else
				((double *)slot)[i] = peer_f64(q, i);
		}
	}
	free(f);
}

static int fake_queue(struct st_comm *c, const void *send, void *recv, size_t n,
		      enum st_comm_dtype dt, bool gather)
{
	struct fake_move *f = malloc(sizeof(*f));

	if (!f)
		return -ENOMEM;
	*f = (struct fake_move){ send, recv, n, dt, gather };
	return st_device_host_fn(st_comm_device(c), st_comm_queue(c), fake_move_fn, f);
}

static int fake_open(struct st_comm *c, const struct st_comm_config *cfg, int *rank,
		     int *world)
{
	(void)c, (void)cfg;
	*rank = FAKE_RANK;
	*world = FAKE_WORLD;
	return 0;
}

static void fake_close(struct st_comm *c)
{
	(void)c;
}

static int fake_alltoall(struct st_comm *c, const void *send, void *recv, size_t n,
			 enum st_comm_dtype dt)
{
	return fake_queue(c, send, recv, n, dt, false);
}

static int fake_allgather(struct st_comm *c, const void *send, void *recv, size_t n,
			  enum st_comm_dtype dt)
{
	return fake_queue(c, send, recv, n, dt, true);
}

static int fake_broadcast(struct st_comm *c, const void *send, void *recv, size_t n,
			  enum st_comm_dtype dt, int root)
{
	(void)c, (void)send, (void)recv, (void)n, (void)dt, (void)root;
	return -ENOTSUP;
}

static const struct st_comm_ops fake_ops = {
	.name = "fake3",
	.version = ST_COMM_OPS_VERSION,
	.open = fake_open,
	.close = fake_close,
	.alltoall = fake_alltoall,
	.allgather = fake_allgather,
	.broadcast = fake_broadcast,
};

static void test_composed_order(void **state)
{
	struct ctx *c = *state;
	const size_t n = 512;
	float *fs = (float *)c->arena;                        /* 3n: the flat dW */
	float *fr = (float *)(c->arena + 1 * MiB);            /* n */
	double *ds = (double *)(c->arena + 2 * MiB);          /* n */
	double *dr = (double *)(c->arena + 3 * MiB);          /* n */
	struct st_comm_config cfg = { .scratch = c->arena + 8 * MiB,
				      .scratch_bytes = 3 * n * sizeof(double) };
	struct st_comm *m;
	int order_matters = 0;

	assert_int_equal(st_comm_create(&fake_ops, c->dev, &cfg, &m), 0);
	assert_int_equal(st_comm_rank(m), FAKE_RANK);
	assert_int_equal(st_comm_world(m), FAKE_WORLD);
	for (size_t i = 0; i < 3 * n; i++)
		fs[i] = 0.75f + (float)i * 0.125f;
	for (size_t i = 0; i < n; i++)
		ds[i] = 0.3 + (double)i * 0.7;

	/* out of place, then in place (recv = this rank's slice of send) */
	assert_int_equal(st_comm_reduce_scatter(m, fs, fr, n, ST_COMM_F32), 0);
	/* An allreduce of fewer elements than ranks is all tail: an
	 * allgather into the scratch and the local sum, which this fake
	 * world can show (longer ones reduce-scatter, then allgather the
	 * folded slices: the mpi tests check them across real ranks). */
	assert_int_equal(st_comm_allreduce(m, ds, dr, FAKE_WORLD - 1, ST_COMM_F64), 0);
	assert_int_equal(st_comm_sync(m), 0);
	for (size_t i = 0; i < n; i++) {
		float mine = 0.75f + (float)(FAKE_RANK * n + i) * 0.125f;
		float want = (peer_f32(0, i) + mine) + peer_f32(2, i);
		float other = peer_f32(0, i) + (mine + peer_f32(2, i));

		order_matters += want != other;
		assert_memory_equal(&fr[i], &want, sizeof(float));
	}
	for (size_t i = 0; i < FAKE_WORLD - 1; i++) {
		double dwant = (peer_f64(0, i) + ds[i]) + peer_f64(2, i);
		double dother = peer_f64(0, i) + (ds[i] + peer_f64(2, i));

		order_matters += dwant != dother;
		assert_memory_equal(&dr[i], &dwant, sizeof(double));
	}
	assert_true(order_matters > 0); /* the check could fail */

	assert_int_equal(st_comm_reduce_scatter(m, fs, fs + FAKE_RANK * n, n, ST_COMM_F32), 0);
	assert_int_equal(st_comm_sync(m), 0);
	assert_memory_equal(fs + FAKE_RANK * n, fr, n * sizeof(float));

	/* a scratch too small for 3 slices (reduce-scatter), or for the
	 * allreduce's first 3n + 3 elements */
	assert_int_equal(st_comm_reduce_scatter(m, ds, dr + n, n + 1, ST_COMM_F64), -ENOSPC);
	assert_int_equal(st_comm_sync(m), -ENOSPC);
	assert_int_equal(st_comm_allreduce(m, ds, dr, 3 * n + 3, ST_COMM_F64), -ENOSPC);
	assert_int_equal(st_comm_sync(m), -ENOSPC);
	/* the backend's failure is sticky too */
	assert_int_equal(st_comm_broadcast(m, ds, dr, n, ST_COMM_F64, 0), -ENOTSUP);
	assert_int_equal(st_comm_allreduce(m, ds, dr, n, ST_COMM_F64), -ENOTSUP);
	assert_int_equal(st_comm_sync(m), -ENOTSUP);
	st_comm_destroy(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_find),
		cmocka_unit_test(test_launch),
		cmocka_unit_test_setup_teardown(test_local_host, setup, teardown),
		cmocka_unit_test_setup_teardown(test_local_world, setup, teardown),
		cmocka_unit_test_setup_teardown(test_out_of_place_f32, setup, teardown),
		cmocka_unit_test_setup_teardown(test_out_of_place_f64, setup, teardown),
		cmocka_unit_test_setup_teardown(test_out_of_place_bf16, setup, teardown),
		cmocka_unit_test_setup_teardown(test_in_place_f32, setup, teardown),
		cmocka_unit_test_setup_teardown(test_in_place_f64, setup, teardown),
		cmocka_unit_test_setup_teardown(test_norm_double, setup, teardown),
		cmocka_unit_test_setup_teardown(test_event_order, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_args, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sticky, setup, teardown),
		cmocka_unit_test_setup_teardown(test_registration, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stats, setup, teardown),
		cmocka_unit_test_setup_teardown(test_composed_order, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
