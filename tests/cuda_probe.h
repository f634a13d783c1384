/* The cuda device's probe for the GPU tests: 0 when a cuda device opens
 * here (*ops set), 77 (meson's skipped) when this build has none or the
 * machine has no GPU, 1 when opening it failed otherwise; it says which on
 * stdout/stderr. */
#ifndef STRATA_TESTS_CUDA_PROBE_H
#define STRATA_TESTS_CUDA_PROBE_H

#include "strata/device.h"

#include <errno.h>
#include <stdio.h>

static int st_test_cuda_probe(const struct st_device_ops **ops)
{
	struct st_device_config cfg = { .mem_bytes = 64ull << 20 };
	struct st_device *probe = NULL;
	int ret;

	*ops = st_device_find("cuda");
	if (!*ops) {
		printf("no cuda device in this build: skipped\n");
		return 77;
	}
	ret = st_device_create(*ops, &cfg, &probe);
	if (ret == -ENODEV) {
		printf("no GPU: skipped\n");
		return 77;
	}
	if (ret < 0) {
		fprintf(stderr, "cuda device: %d %s\n", ret, st_error_last());
		return 1;
	}
	st_device_destroy(probe);
	return 0;
}

#endif
