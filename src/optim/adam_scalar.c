/* The scalar kernel: the reference recipe, and the path on non-x86 builds. */
#include "optim_internal.h"

static int scalar_supported(void)
{
	return 1;
}

static uint64_t scalar_adam(const struct st_adam_step *s, const struct st_adam_bufs *b,
			    size_t n, unsigned kflags)
{
	(void)kflags; /* plain stores: the reference path stays plain C */
	if (b->state == ST_OPTIM_STATE_Q8)
		return st_adam_q8_blocks(s, b, n);
	return st_adam_tail(s, b, 0, n);
}

static void scalar_gstat(const void *g, enum st_optim_dtype g_dtype, size_t n,
			 double lanes[ST_GSTAT_LANES], uint32_t *absmax_bits)
{
	st_gstat_tail(g, g_dtype, 0, n, lanes, absmax_bits);
}

const struct st_optim_kernel st_optim_kernel_scalar = {
	.name = "scalar",
	.path = ST_OPTIM_PATH_SCALAR,
	.supported = scalar_supported,
	.adam = scalar_adam,
	.gstat = scalar_gstat,
};
