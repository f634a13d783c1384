/* Device tests on the cpu device: it must behave like a GPU stream (arena
 * budget, in-order queues, events, cross-queue waits, a bounded launch
 * queue) so the scheduler's asynchrony is tested on machines with no GPU.
 * The stream/event checks are shared with tests/cuda (device_checks.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "device_checks.h"
#include "strata/compute.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1024ull * 1024ull)

/* The cpu device's ring (CPU_QUEUE_SLOTS in src/backend/device/device_cpu.c). */
#define CPU_RING_SLOTS 1024u

/* A 16 MiB device of ops for a test's state. */
static int device_setup(void **state, const struct st_device_ops *ops)
{
	struct dc_ctx *c = calloc(1, sizeof(*c));
	struct st_device_config cfg = { .mem_bytes = 16 * MiB };

	if (!c)
		return -1;
	if (st_device_create(ops, &cfg, &c->dev) != 0) {
		free(c);
		return -1;
	}
	c->ring_slots = CPU_RING_SLOTS;
	*state = c;
	return 0;
}

static int cpu_setup(void **state)
{
	return device_setup(state, &st_device_cpu_ops);
}

static int strict_setup(void **state)
{
	return device_setup(state, &st_device_cpu_strict_ops);
}

static int cpu_teardown(void **state)
{
	struct dc_ctx *c = *state;

	st_device_destroy(c->dev);
	free(c);
	return 0;
}

static void test_find(void **state)
{
	const char *list = st_device_list();

	(void)state;
	assert_ptr_equal(st_device_find("cpu"), &st_device_cpu_ops);
	assert_string_equal(st_device_find("cpu")->name, "cpu");
	assert_null(st_device_find("nope"));
	assert_null(st_device_find(""));
	assert_null(st_device_find("CPU"));
	assert_null(st_device_find(NULL));
	assert_non_null(list);
	assert_true(strncmp(list, "cpu", 3) == 0 && (list[3] == '\0' || list[3] == ','));
#ifdef ST_HAVE_CUDA
	assert_non_null(st_device_find("cuda"));
	assert_string_equal(list, "cpu,cpu-strict,cuda");
#else
	assert_null(st_device_find("cuda"));
	assert_string_equal(list, "cpu,cpu-strict");
#endif
}

static void expect_refused(const struct st_device_ops *o, const char *what)
{
	struct st_device *d = (struct st_device *)(uintptr_t)1;
	struct st_device_config cfg = { .mem_bytes = MiB };
	int ret;

	st_error_clear();
	ret = st_device_create(o, &cfg, &d);
	if (ret != -EINVAL)
		fail_msg("table without %s: %d, want -EINVAL", what, ret);
	assert_null(d);
	assert_true(st_error_last()[0] != '\0');
}

/* fio-style registration: a table lacking any required hook is refused
 * before anything is opened; optional hooks may be absent. */
static void test_create_refuses_incomplete_table(void **state)
{
	struct st_device *d = NULL;

	(void)state;
	expect_refused(NULL, "anything (NULL table)");
#define REFUSE_WITHOUT(field)                                 \
	do {                                                  \
		struct st_device_ops o = st_device_cpu_ops;   \
		o.field = NULL;                               \
		expect_refused(&o, #field);                   \
	} while (0)
	REFUSE_WITHOUT(name);
	REFUSE_WITHOUT(open);
	REFUSE_WITHOUT(close);
	REFUSE_WITHOUT(arena_base);
	REFUSE_WITHOUT(queue_create);
	REFUSE_WITHOUT(queue_destroy);
	REFUSE_WITHOUT(event_create);
	REFUSE_WITHOUT(event_destroy);
	REFUSE_WITHOUT(memcpy_async);
	REFUSE_WITHOUT(host_fn);
	REFUSE_WITHOUT(event_record);
	REFUSE_WITHOUT(event_query);
	REFUSE_WITHOUT(event_sync);
	REFUSE_WITHOUT(queue_wait);
	REFUSE_WITHOUT(queue_sync);
#undef REFUSE_WITHOUT
	/* The complete table opens, with or without a config. */
	assert_int_equal(st_device_create(&st_device_cpu_ops, NULL, &d), 0);
	assert_non_null(d);
	st_device_destroy(d);
}

static void check_arena(uint64_t asked, uint64_t want)
{
	struct st_device_config cfg = { .mem_bytes = asked };
	struct st_device_stats s;
	struct st_device *d = NULL;
	uint64_t bytes = 0;
	char *a;

	assert_int_equal(st_device_create(&st_device_cpu_ops, &cfg, &d), 0);
	/* The caller's config is not written. */
	assert_true(cfg.mem_bytes == asked);
	a = st_device_arena(d, &bytes);
	assert_non_null(a);
	if (bytes != want)
		fail_msg("asked %llu: arena of %llu, want %llu", (unsigned long long)asked,
			 (unsigned long long)bytes, (unsigned long long)want);
	assert_int_equal((uintptr_t)a % ST_PAGE_BYTES, 0);
	assert_ptr_equal(st_device_arena(d, NULL), a);
	st_device_get_stats(d, &s);
	assert_true(s.arena_bytes == want);
	assert_true(s.h2d_bytes == 0 && s.d2h_bytes == 0 && s.d2d_bytes == 0 &&
		    s.copies == 0);
	/* The cpu arena is host memory (unified): its first and last bytes
	 * are there. Touch only two pages of a NORESERVE mapping. */
	a[0] = 1;
	a[bytes - 1] = 2;
	assert_int_equal(a[0] + a[bytes - 1], 3);
	st_device_destroy(d);
}

static void test_arena_budget(void **state)
{
	(void)state;
	check_arena(0, 256 * MiB);
	check_arena(1, ST_PAGE_BYTES);
	check_arena(ST_PAGE_BYTES, ST_PAGE_BYTES);
	check_arena(5000, 2 * ST_PAGE_BYTES);
	check_arena(MiB + 1, MiB + ST_PAGE_BYTES);
	check_arena(3 * MiB, 3 * MiB);
}

/* A budget the machine cannot map is -ENOMEM with a message, not a crash. */
static void test_arena_too_big(void **state)
{
	struct st_device_config cfg = { .mem_bytes = 1ull << 62 };
	struct st_device *d = (struct st_device *)(uintptr_t)1;

	(void)state;
	st_error_clear();
	assert_int_equal(st_device_create(&st_device_cpu_ops, &cfg, &d), -ENOMEM);
	assert_null(d);
	assert_true(st_error_last()[0] != '\0');
}

static void test_cpu_properties(void **state)
{
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;
	char buf[64];

	assert_string_equal(st_device_name(d), "cpu");
	assert_true(st_device_unified(d));
	assert_false(st_device_can_pin(d));
	assert_int_equal(st_device_numa_node(d), -1);
	assert_non_null(st_device_priv(d));
	/* No pin hook: pinning is a successful no-op. */
	assert_int_equal(st_device_pin_host(d, buf, sizeof(buf)), 0);
	st_device_unpin_host(d, buf);
	/* Destroying nothing is allowed. */
	st_device_destroy(NULL);
	st_queue_destroy(d, NULL);
	st_event_destroy(d, NULL);
}

/* Unified: what an H2D copy wrote is in the arena itself once done, and
 * what the host writes there a D2H copy reads. */
static void test_unified_arena(void **state)
{
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;
	const size_t n = 1 * MiB;
	uint64_t arena_bytes;
	char *arena = st_device_arena(d, &arena_bytes);
	char *at_end = arena + arena_bytes - n;
	uint8_t *src = malloc(n), *dst = malloc(n);
	struct st_queue *q;

	assert_non_null(src);
	assert_non_null(dst);
	dc_fill(src, n, 7);
	assert_int_equal(st_queue_create(d, &q), 0);
	/* The very end of the budget is usable. */
	assert_int_equal(st_device_memcpy_async(d, q, at_end, src, n, ST_COPY_H2D), 0);
	assert_int_equal(st_queue_sync(d, q), 0);
	assert_memory_equal(at_end, src, n);
	dc_fill(at_end, n, 8);
	assert_int_equal(st_device_memcpy_async(d, q, dst, at_end, n, ST_COPY_D2H), 0);
	assert_int_equal(st_queue_sync(d, q), 0);
	assert_memory_equal(dst, at_end, n);
	assert_memory_not_equal(dst, src, n);
	st_queue_destroy(d, q);
	free(src);
	free(dst);
}

/* Destroying a queue runs what was queued on it first (as
 * cudaStreamDestroy lets pending work finish): destroy is called while
 * the queue is held, and a helper opens the gate 100 ms later. */
static void test_queue_destroy_drains(void **state)
{
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;
	struct st_queue *q;
	struct dc_gate g;
	atomic_uint enqueued = 0;
	struct dc_releaser r = { .g = &g, .enqueued = &enqueued };
	atomic_int last = 0;
	pthread_t th;

	dc_gate_init(&g);
	assert_int_equal(st_queue_create(d, &q), 0);
	assert_int_equal(st_device_host_fn(d, q, dc_gate_fn, &g), 0);
	assert_int_equal(st_device_host_fn(d, q, dc_flag_fn, &last), 0);
	assert_int_equal(pthread_create(&th, NULL, dc_releaser_main, &r), 0);
	dc_gate_wait_entered(&g);
	st_queue_destroy(d, q);
	assert_int_equal(atomic_load(&r.opened), 1);
	assert_int_equal(atomic_load(&last), 1);
	assert_int_equal(pthread_join(th, NULL), 0);
	dc_gate_fini(&g);
}

/* cpu-strict (docs/gpu.md, "Strict mode"): a device whose arena the host
 * cannot touch, as a GPU's. Its properties, and copies both ways that the
 * host never reads in between. */
static void test_strict_properties(void **state)
{
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;
	const size_t n = 64 * 1024;
	uint64_t bytes;
	char *arena = st_device_arena(d, &bytes);
	uint8_t *src = malloc(n), *dst = malloc(n);
	struct st_queue *q;

	assert_ptr_equal(st_device_find("cpu-strict"), &st_device_cpu_strict_ops);
	assert_string_equal(st_device_name(d), "cpu-strict");
	assert_false(st_device_unified(d));
	assert_true(st_device_on_host("cpu-strict") && st_device_on_host("cpu") &&
		    st_device_on_host(NULL) && !st_device_on_host("cuda"));
	/* the address is not one the host can use: non-canonical on x86-64 */
	assert_true(((uintptr_t)arena >> 48) != 0);
	assert_non_null(src);
	assert_non_null(dst);
	dc_fill(src, n, 3);
	assert_int_equal(st_queue_create(d, &q), 0);
	assert_int_equal(st_device_memcpy_async(d, q, arena + bytes - n, src, n, ST_COPY_H2D), 0);
	assert_int_equal(st_device_memcpy_async(d, q, arena, arena + bytes - n, n, ST_COPY_D2D),
			 0);
	assert_int_equal(st_device_memcpy_async(d, q, dst, arena, n, ST_COPY_D2H), 0);
	assert_int_equal(st_queue_sync(d, q), 0);
	assert_memory_equal(dst, src, n);
	st_queue_destroy(d, q);
	free(src);
	free(dst);
}

/* What a child that does `what` on a cpu-strict device dies of, with its
 * stderr in err. */
enum strict_fault { SF_HOST_READ, SF_H2D_FROM_DEVICE, SF_OP_HOST_PTR, SF_TO_HOST_BACKWARDS };

static void strict_child(enum strict_fault what)
{
	struct st_device_config cfg = { .mem_bytes = MiB };
	struct st_device *d;
	struct st_compute *cx;
	struct st_queue *q;
	static float host[64];
	volatile float *arena;

	if (st_device_create(&st_device_cpu_strict_ops, &cfg, &d) != 0 ||
	    st_queue_create(d, &q) != 0 || st_compute_create(d, &cx) != 0)
		_exit(3);
	arena = st_device_arena(d, NULL);
	switch (what) {
	case SF_HOST_READ:
		host[0] = arena[5]; /* a GPU's address read by the host */
		break;
	case SF_H2D_FROM_DEVICE: /* the direction says host source */
		st_device_memcpy_async(d, q, (void *)(arena + 16), (void *)arena, 64, ST_COPY_H2D);
		break;
	case SF_OP_HOST_PTR: /* a kernel given host memory */
		st_compute_gelu_fwd(cx, (float *)arena, host, 64);
		break;
	case SF_TO_HOST_BACKWARDS: /* to_host with the sides swapped */
		st_compute_to_host(cx, (void *)arena, host, sizeof(host));
		break;
	}
	st_queue_sync(d, q);
	st_compute_sync(cx);
	_exit(0); /* not refused */
}

static void expect_strict_fault(enum strict_fault what, int sig, const char *msg)
{
	int fds[2], status;
	char err[8192];
	size_t got = 0;
	ssize_t r;
	pid_t pid;

	assert_int_equal(pipe(fds), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		signal(SIGABRT, SIG_DFL); /* cmocka's handlers would catch them */
		signal(SIGSEGV, SIG_DFL);
		dup2(fds[1], STDERR_FILENO);
		close(fds[0]);
		strict_child(what);
	}
	close(fds[1]);
	while (got < sizeof(err) - 1 && (r = read(fds[0], err + got, sizeof(err) - 1 - got)) > 0)
		got += (size_t)r;
	err[got] = '\0';
	close(fds[0]);
	assert_int_equal(waitpid(pid, &status, 0), pid);
#if defined(__SANITIZE_ADDRESS__)
	/* Under AddressSanitizer cpu-strict leaves the fault to ASan's handler,
	 * which the child put back to the default (cmocka's would catch it):
	 * the child dies of the fault, the message is the plain build's to
	 * check */
	if (sig == SIGSEGV) {
		if (!(WIFSIGNALED(status) &&
		      (WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGABRT)) &&
		    !(WIFEXITED(status) && WEXITSTATUS(status) != 0))
			fail_msg("fault %d: the child did not die of the fault (status %#x): %s",
				 (int)what, status, err);
		return;
	}
#endif
	if (!WIFSIGNALED(status) || WTERMSIG(status) != sig)
		fail_msg("fault %d: the child did not die of signal %d (status %#x): %s", (int)what,
			 sig, status, err);
	if (!strstr(err, msg) || !strstr(err, "stack"))
		fail_msg("fault %d: no \"%s\" and stack on stderr: %s", (int)what, msg, err);
}

/* Each host access a GPU would fault on (or garble) fails at once, loudly,
 * with a stack: a read of device memory, a copy whose direction lies, a
 * kernel given host memory, a d2h the wrong way round. */
static void test_strict_faults(void **state)
{
	(void)state;
	expect_strict_fault(SF_HOST_READ, SIGSEGV, "the host touched device memory");
	expect_strict_fault(SF_H2D_FROM_DEVICE, SIGABRT, "a h2d copy of 64 bytes from device");
	expect_strict_fault(SF_OP_HOST_PTR, SIGABRT, "op gelu_fwd is given the host address");
	expect_strict_fault(SF_TO_HOST_BACKWARDS, SIGABRT, "a to_host copy of 256 bytes");
}

/* --device auto with fake probes: what each finds decides, and the line
 * says which and why. */
static int probe_calls;

static void probe_gpu(int ordinal, struct st_device_probe *out)
{
	probe_calls++;
	assert_int_equal(ordinal, 1);
	out->usable = true;
	out->free_bytes = 3 * ST_GiB;
	out->total_bytes = 4 * ST_GiB;
	snprintf(out->what, sizeof(out->what), "Fake GPU");
}

static void probe_none(int ordinal, struct st_device_probe *out)
{
	(void)ordinal;
	probe_calls++;
	out->usable = false;
	snprintf(out->what, sizeof(out->what), "no CUDA-capable device is detected");
}

static void test_choose_auto(void **state)
{
	struct st_device_probe p;
	char why[512];

	(void)state;
	probe_calls = 0;
	assert_string_equal(st_device_choose(true, probe_gpu, 1, &p, why, sizeof(why)), "cuda");
	assert_true(p.usable && p.free_bytes == 3 * ST_GiB);
	assert_string_equal(why, "GPU 1, Fake GPU, 3.0 GiB free of 4.0 GiB");
	assert_string_equal(st_device_choose(true, probe_none, 0, &p, why, sizeof(why)), "cpu");
	assert_false(p.usable);
	assert_string_equal(why, "no usable GPU: no CUDA-capable device is detected");
	assert_int_equal(probe_calls, 2);
	/* without CUDA built in, no probe runs */
	assert_string_equal(st_device_choose(false, probe_gpu, 1, &p, why, sizeof(why)), "cpu");
	assert_int_equal(probe_calls, 2);
	assert_false(p.usable);
	assert_non_null(strstr(why, "built without CUDA"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_find),
		cmocka_unit_test(test_choose_auto),
		cmocka_unit_test(test_create_refuses_incomplete_table),
		cmocka_unit_test(test_arena_budget),
		cmocka_unit_test(test_arena_too_big),
		cmocka_unit_test_setup_teardown(test_cpu_properties, cpu_setup, cpu_teardown),
		cmocka_unit_test_setup_teardown(test_unified_arena, cpu_setup, cpu_teardown),
		cmocka_unit_test_setup_teardown(test_queue_destroy_drains, cpu_setup,
						cpu_teardown),
		DC_SEMANTICS_TESTS(cpu_setup, cpu_teardown),
		cmocka_unit_test_setup_teardown(test_strict_properties, strict_setup, cpu_teardown),
		cmocka_unit_test(test_strict_faults),
		/* the stream semantics hold on cpu-strict too */
		DC_SEMANTICS_TESTS(strict_setup, cpu_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
