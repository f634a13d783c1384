/* The local comm backend on the cuda device: the same file as on the cpu
 * device, with buffers in device memory that the host never dereferences
 * (filled and read back with H2D/D2H copies). Out of place is one D2D copy
 * on the comm's stream, ordered by events against a copy stream; in place
 * queues nothing. Without a cuda build or a GPU it exits 77 (skipped). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cuda_probe.h"

#include "strata/comm.h"
#include "strata/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ull * 1024ull)

static const struct st_device_ops *cuda_ops;

static void test_cuda_local(void **state)
{
	const size_t n = 1 << 20; /* f32 elements: 4 MiB */
	struct st_device_config cfg = { .mem_bytes = 64 * MiB };
	struct st_device *dev;
	struct st_comm *comm;
	struct st_queue *copy;
	struct st_event *filled, *reduced;
	struct st_device_stats d0, d1;
	float *host = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
	char *arena;

	(void)state;
	assert_true(host && back);
	assert_int_equal(st_device_create(cuda_ops, &cfg, &dev), 0);
	arena = st_device_arena(dev, NULL);
	assert_int_equal(st_comm_create(&st_comm_local_ops, dev, NULL, &comm), 0);
	assert_int_equal(st_queue_create(dev, &copy), 0);
	assert_int_equal(st_event_create(dev, &filled), 0);
	assert_int_equal(st_event_create(dev, &reduced), 0);
	for (size_t i = 0; i < n; i++)
		host[i] = (float)i * 0.5f - 3.0f;

	/* copy stream fills send; the comm waits for it, reduces out of
	 * place; the copy stream waits for the comm and reads recv back */
	float *send = (float *)arena, *recv = (float *)(arena + 16 * MiB);
	assert_int_equal(st_device_memcpy_async(dev, copy, send, host, n * sizeof(float),
						ST_COPY_H2D), 0);
	assert_int_equal(st_event_record(dev, filled, copy), 0);
	assert_int_equal(st_comm_wait(comm, filled), 0);
	assert_int_equal(st_comm_allreduce(comm, send, recv, n, ST_COMM_F32), 0);
	assert_int_equal(st_comm_record(comm, reduced), 0);
	assert_int_equal(st_queue_wait(dev, copy, reduced), 0);
	assert_int_equal(st_device_memcpy_async(dev, copy, back, recv, n * sizeof(float),
						ST_COPY_D2H), 0);
	assert_int_equal(st_queue_sync(dev, copy), 0);
	assert_memory_equal(back, host, n * sizeof(float));

	/* in place: no copy at all */
	st_device_get_stats(dev, &d0);
	assert_int_equal(st_comm_reduce_scatter(comm, recv, recv, n, ST_COMM_F32), 0);
	assert_int_equal(st_comm_allgather(comm, recv, recv, n, ST_COMM_F32), 0);
	assert_int_equal(st_comm_sync(comm), 0);
	st_device_get_stats(dev, &d1);
	assert_int_equal(d1.copies, d0.copies);

	st_event_destroy(dev, reduced);
	st_event_destroy(dev, filled);
	st_queue_destroy(dev, copy);
	st_comm_destroy(comm);
	st_device_destroy(dev);
	free(back);
	free(host);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cuda_local),
	};
	int ret = st_test_cuda_probe(&cuda_ops);

	if (ret)
		return ret;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
