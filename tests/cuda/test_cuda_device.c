/* cuda device tests: the same stream/event semantics as the cpu device
 * (tests/device/device_checks.h), a vram tier round trip through the cuda
 * arena, the host tier pinned through the device, and no status the
 * device drops left behind in CUDA's last-error state.
 *
 * Without a GPU or driver, opening the device is -ENODEV and the program
 * exits 77 (skipped). The arena is device memory: nothing here dereferences
 * it; bytes come back with D2H copies and are compared on the host. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cuda_probe.h"

#include <cuda_runtime_api.h>
#include <stdio.h>

#include "device_checks.h"
#include "strata/tier.h"

#define MiB (1024ull * 1024ull)

static const struct st_device_ops *cuda_ops;

static int cuda_setup(void **state)
{
	struct dc_ctx *c = calloc(1, sizeof(*c));
	struct st_device_config cfg = { .mem_bytes = 64 * MiB, .ordinal = 0 };

	if (!c)
		return -1;
	if (st_device_create(cuda_ops, &cfg, &c->dev) != 0) {
		fprintf(stderr, "cuda device: %s\n", st_error_last());
		free(c);
		return -1;
	}
	c->ring_slots = 0; /* CUDA's launch queue has no size we can rely on */
	*state = c;
	return 0;
}

static int cuda_teardown(void **state)
{
	struct dc_ctx *c = *state;

	st_device_destroy(c->dev);
	free(c);
	return 0;
}

static void test_cuda_properties(void **state)
{
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;
	struct st_device_config cfg = { .mem_bytes = 5000 };
	struct st_device *small = NULL;
	uint64_t bytes = 0;

	assert_ptr_equal(st_device_find("cuda"), cuda_ops);
	assert_string_equal(st_device_name(d), "cuda");
	assert_false(st_device_unified(d));
	assert_true(st_device_can_pin(d));
	assert_true(st_device_numa_node(d) >= -1);
	assert_non_null(st_device_arena(d, &bytes));
	assert_true(bytes == 64 * MiB);
	/* The budget is rounded up to whole pages, as on the cpu device. */
	assert_int_equal(st_device_create(cuda_ops, &cfg, &small), 0);
	assert_non_null(st_device_arena(small, &bytes));
	assert_true(bytes == 2 * ST_PAGE_BYTES);
	st_device_destroy(small);
	/* A GPU that does not exist is -ENODEV. */
	cfg = (struct st_device_config){ .mem_bytes = MiB, .ordinal = 4096 };
	small = (struct st_device *)(uintptr_t)1;
	assert_int_equal(st_device_create(cuda_ops, &cfg, &small), -ENODEV);
	assert_null(small);
}

static void *xalign(size_t bytes)
{
	void *p = NULL;

	assert_int_equal(posix_memalign(&p, 4096, bytes), 0);
	return p;
}

/* Random aligned sizes and offsets in three extents, 24 writes in flight,
 * reaped, then read back 24 in flight (and some one at a time), compared
 * byte for byte. Odd rounds use pinned buffers, even rounds pageable ones:
 * the tier must work with both. */
static void test_vram_round_trip(void **state)
{
	enum { NREQ = 24, ROUNDS = 4 };
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;
	const size_t buf_bytes = 10 * MiB;
	struct st_tier_config tc = { .budget_bytes = 16 * MiB, .device = d };
	struct st_tier *t = NULL;
	struct st_extent ext[3];
	struct st_tier_io io[NREQ];
	struct st_tier_cqe cqe[NREQ];
	struct st_tier_stats ts;
	struct st_device_stats s0, s1;
	uint8_t *src[2], *dst[2];
	uint64_t a, s = 0x5eed, h2d = 0, d2h = 0;
	struct st_queue *q;

	assert_int_equal(st_tier_create(&st_tier_vram_ops, &tc, &t), 0);
	assert_non_null(strstr(st_tier_describe(t), "cuda"));
	a = st_tier_align(t);
	assert_true(st_is_pow2(a));
	for (int i = 0; i < 3; i++)
		assert_int_equal(st_tier_alloc(t, 4 * MiB + (dc_rand(&s) % 64) * a, &ext[i]), 0);
	src[0] = xalign(buf_bytes);
	dst[0] = xalign(buf_bytes);
	src[1] = dc_host_alloc(d, buf_bytes);
	dst[1] = dc_host_alloc(d, buf_bytes);
	assert_int_equal(st_queue_create(d, &q), 0);
	st_device_get_stats(d, &s0);

	for (int round = 0; round < ROUNDS; round++) {
		uint8_t *sb = src[round % 2], *db = dst[round % 2];
		uint64_t off[NREQ], len[NREQ], pos = 0;
		int inflight, n;

		dc_fill(sb, buf_bytes, dc_rand(&s));
		memset(db, 0xA5, buf_bytes);
		for (int i = 0; i < NREQ; i++) {
			int e = i % 3;

			off[i] = (uint64_t)(i / 3) * (448 * 1024) + (dc_rand(&s) % 16) * a;
			len[i] = a * (1 + dc_rand(&s) % ((400 * 1024) / a));
			assert_true(off[i] + len[i] <= ext[e].len_bytes);
			io[i] = (struct st_tier_io){ .op = ST_IO_WRITE, .ext = ext[e],
						     .ext_off_bytes = off[i], .len_bytes = len[i],
						     .buf = sb + pos, .user = (void *)(uintptr_t)(i + 1) };
			pos += st_align_up(len[i], 4096);
			assert_true(pos <= buf_bytes);
			h2d += len[i];
		}
		assert_int_equal(st_tier_submit(t, io, NREQ), 0);
		for (inflight = NREQ; inflight;) {
			n = st_tier_reap(t, cqe, NREQ, 1);
			assert_true(n > 0);
			for (int j = 0; j < n; j++) {
				int i = (int)(uintptr_t)cqe[j].user - 1;

				assert_true(i >= 0 && i < NREQ);
				assert_int_equal(cqe[j].res, (int64_t)len[i]);
			}
			inflight -= n;
		}
		/* The last quarter one at a time, the rest all in flight. */
		for (int i = 0; i < NREQ; i++) {
			io[i].op = ST_IO_READ;
			io[i].buf = db + ((uint8_t *)io[i].buf - sb);
			d2h += len[i];
		}
		for (int i = NREQ - 1; i >= 3 * NREQ / 4; i--)
			assert_int_equal(st_tier_read_sync(t, &io[i].ext, io[i].ext_off_bytes,
							   io[i].buf, io[i].len_bytes), 0);
		assert_int_equal(st_tier_submit(t, io, 3 * NREQ / 4), 0);
		for (inflight = 3 * NREQ / 4; inflight;) {
			n = st_tier_reap(t, cqe, NREQ, (unsigned)inflight);
			assert_true(n > 0);
			for (int j = 0; j < n; j++) {
				int i = (int)(uintptr_t)cqe[j].user - 1;

				assert_true(i >= 0 && i < NREQ);
				assert_int_equal(cqe[j].res, (int64_t)len[i]);
			}
			inflight -= n;
		}
		for (int i = 0; i < NREQ; i++)
			if (memcmp(sb + ((uint8_t *)io[i].buf - db), io[i].buf, len[i]))
				fail_msg("round %d: request %d (%llu bytes at %llu) differs", round, i,
					 (unsigned long long)len[i], (unsigned long long)off[i]);
		/* st_tier_addr is the device address of the extent: a plain
		 * device copy from it reads what the tier wrote. */
		{
			const struct st_tier_io *w = &io[NREQ / 2];
			char *dev = (char *)st_tier_addr(t, &w->ext) + w->ext_off_bytes;
			uint8_t *back = dst[1] == db ? dst[0] : dst[1];

			memset(back, 0, w->len_bytes);
			assert_int_equal(st_device_memcpy_async(d, q, back, dev, w->len_bytes,
								ST_COPY_D2H), 0);
			assert_int_equal(st_queue_sync(d, q), 0);
			assert_memory_equal(back, w->buf, w->len_bytes);
			d2h += w->len_bytes;
		}
	}
	st_tier_get_stats(t, &ts);
	assert_int_equal(ts.errors, 0);
	assert_int_equal(ts.writes, ROUNDS * NREQ);
	assert_int_equal(ts.reads, ROUNDS * NREQ);
	st_device_get_stats(d, &s1);
	assert_true(s1.h2d_bytes - s0.h2d_bytes == h2d);
	assert_true(s1.d2h_bytes - s0.d2h_bytes == d2h);

	for (int i = 0; i < 3; i++)
		st_tier_free(t, &ext[i]);
	st_tier_destroy(t);
	st_queue_destroy(d, q);
	free(src[0]);
	free(dst[0]);
	dc_host_free(d, src[1]);
	dc_host_free(d, dst[1]);
}

/* A vram budget larger than the arena is refused. */
static void test_vram_budget_over_arena(void **state)
{
	struct dc_ctx *c = *state;
	struct st_tier_config tc = { .budget_bytes = 128 * MiB, .device = c->dev };
	struct st_tier *t = NULL;

	assert_int_equal(st_tier_create(&st_tier_vram_ops, &tc, &t), -ENOMEM);
	assert_null(t);
}

/* The host tier pins its region through the cuda device; the region is
 * then a valid source and target for asynchronous device copies. */
static void test_host_tier_pinned(void **state)
{
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;
	const size_t n = 1 * MiB;
	struct st_tier_config tc = { .budget_bytes = 8 * MiB, .device = d };
	struct st_tier *t = NULL;
	struct st_extent e1, e2;
	struct st_queue *q;
	uint8_t *p1, *p2, *ref;
	char *arena = st_device_arena(d, NULL);

	assert_int_equal(st_tier_create(&st_tier_host_ops, &tc, &t), 0);
	if (!strstr(st_tier_describe(t), "pinned by the device"))
		fail_msg("host tier: \"%s\"", st_tier_describe(t));
	assert_int_equal(st_tier_alloc(t, n, &e1), 0);
	assert_int_equal(st_tier_alloc(t, n, &e2), 0);
	p1 = st_tier_addr(t, &e1);
	p2 = st_tier_addr(t, &e2);
	assert_non_null(p1);
	assert_non_null(p2);
	ref = malloc(n);
	assert_non_null(ref);
	dc_fill(ref, n, 606);
	memcpy(p1, ref, n);
	memset(p2, 0, n);
	assert_int_equal(st_queue_create(d, &q), 0);
	assert_int_equal(st_device_memcpy_async(d, q, arena, p1, n, ST_COPY_H2D), 0);
	assert_int_equal(st_device_memcpy_async(d, q, p2, arena, n, ST_COPY_D2H), 0);
	assert_int_equal(st_queue_sync(d, q), 0);
	assert_memory_equal(p2, ref, n);
	/* And the tier's own protocol on that memory. */
	{
		uint8_t *back = xalign(n);

		assert_int_equal(st_tier_read_sync(t, &e2, 0, back, n), 0);
		assert_memory_equal(back, ref, n);
		free(back);
	}
	st_queue_destroy(d, q);
	st_tier_free(t, &e1);
	st_tier_free(t, &e2);
	st_tier_destroy(t);
	free(ref);
}

/* A CUDA status the device drops (a pointer it never pinned, an event
 * not yet reached) leaves nothing in the thread's last-error state: every
 * launch check reads cudaGetLastError(), and would take it for its own. */
static void test_ignored_status_cleared(void **state)
{
	struct dc_ctx *c = *state;
	struct st_device *d = c->dev;
	void *never = xalign(ST_PAGE_BYTES);
	struct st_queue *q;
	struct st_event *e;

	assert_int_equal(cudaGetLastError(), cudaSuccess);
	/* cudaHostUnregister fails: cudaErrorHostMemoryNotRegistered */
	st_device_unpin_host(d, never);
	assert_int_equal(cudaPeekAtLastError(), cudaSuccess);
	/* a query, whether or not the copy is done (not timed: either way
	 * the state must be clean) */
	assert_int_equal(st_queue_create(d, &q), 0);
	assert_int_equal(st_event_create(d, &e), 0);
	assert_int_equal(st_device_memcpy_async(d, q, st_device_arena(d, NULL), never,
						ST_PAGE_BYTES, ST_COPY_H2D),
			 0);
	assert_int_equal(st_event_record(d, e, q), 0);
	assert_true(st_event_query(d, e) >= 0);
	assert_int_equal(cudaPeekAtLastError(), cudaSuccess);
	assert_int_equal(st_event_sync(d, e), 0);
	st_event_destroy(d, e);
	st_queue_destroy(d, q);
	free(never);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_cuda_properties, cuda_setup, cuda_teardown),
		DC_SEMANTICS_TESTS(cuda_setup, cuda_teardown),
		cmocka_unit_test_setup_teardown(test_vram_round_trip, cuda_setup, cuda_teardown),
		cmocka_unit_test_setup_teardown(test_vram_budget_over_arena, cuda_setup,
						cuda_teardown),
		cmocka_unit_test_setup_teardown(test_host_tier_pinned, cuda_setup, cuda_teardown),
		cmocka_unit_test_setup_teardown(test_ignored_status_cleared, cuda_setup,
						cuda_teardown),
	};
	int ret = st_test_cuda_probe(&cuda_ops);

	if (ret)
		return ret;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
