/* --device auto: the cuda device when its probe finds a usable GPU (this
 * rank's, under a launcher), else cpu; the choice and its reason are said
 * (strata plan, strata train). The rule itself is st_device_choose()
 * (strata/device.h), held to fake probes in tests/device. */
#include "cli.h"
#include "strata/comm.h"
#include "strata/device.h"
#ifdef ST_HAVE_CUDA
#include "strata/cuda.h"
#endif

#include <errno.h>
#include <stdio.h>
#include <string.h>

#ifdef ST_HAVE_CUDA
/* The cuda device's probe: GPU ordinal is there and answers (a context
 * made on it: its free memory is what the arena may take). */
static void cuda_probe(int ordinal, struct st_device_probe *out)
{
	struct st_cuda_info ci;
	int ret = st_cuda_info(ordinal, &ci);

	if (ret == -ENODEV && ci.count > 0 && ordinal >= ci.count) /* more ranks than GPUs */
		ret = st_cuda_info(ordinal % ci.count, &ci);
	out->usable = ret == 0;
	if (ret < 0) {
		const char *msg = st_error_last();

		/* the runtime's reason, without the "cuda: no usable GPU: " the
		 * choice says already */
		if (strncmp(msg, "cuda: no usable GPU: ", 21) == 0)
			msg += 21;
		snprintf(out->what, sizeof(out->what), "%s", msg);
		return;
	}
	out->free_bytes = ci.free_bytes;
	out->total_bytes = ci.total_bytes;
	snprintf(out->what, sizeof(out->what), "%s", ci.name);
}
#endif

const char *st_cli_device(const char *asked, struct st_device_probe *p, char *why, size_t n)
{
	struct st_comm_launch l;
	int ordinal;

	memset(p, 0, sizeof(*p));
	why[0] = '\0';
	if (strcmp(asked, "auto") != 0 && strcmp(asked, "cuda") != 0)
		return asked;
	st_comm_launch(&l);
	ordinal = l.launcher && l.local_rank > 0 ? l.local_rank : 0;
#ifdef ST_HAVE_CUDA
	if (strcmp(asked, "cuda") == 0) { /* as asked: the probe for --gpu-mem auto */
		cuda_probe(ordinal, p);
		return asked;
	}
	return st_device_choose(true, cuda_probe, ordinal, p, why, n);
#else
	return strcmp(asked, "cuda") == 0 ? asked : st_device_choose(false, NULL, ordinal, p, why, n);
#endif
}
