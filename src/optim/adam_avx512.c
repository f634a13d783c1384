/* The AVX-512 kernels, 16 lanes, in two variants from one body
 * (adam_avx512_body.h): with VCVTNEPS2BF16 for CPUs that have AVX512_BF16,
 * and with integer rounding for those that do not. Per-function targets:
 * only called when cpuid (and the OS's saved state) says the CPU has them. */
#include "optim_internal.h"

#include "strata/common.h"

#if defined(ST_OPTIM_HAVE_X86)
#include <immintrin.h>
#include <string.h>

static int avx512_supported(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
	       __builtin_cpu_supports("fma") && st_cpu_has_f16c();
}

static int avx512bf16_supported(void)
{
	return avx512_supported() && __builtin_cpu_supports("avx512bf16");
}

#define ST_K_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define ST_K_BF16_INS 0
#define ST_K(name) avx512_##name
#include "adam_avx512_body.h"
#undef ST_K_TARGET
#undef ST_K_BF16_INS
#undef ST_K

#define ST_K_TARGET \
	__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")))
#define ST_K_BF16_INS 1
#define ST_K(name) avx512bf16_##name
#include "adam_avx512_body.h"
#undef ST_K_TARGET
#undef ST_K_BF16_INS
#undef ST_K

const struct st_optim_kernel st_optim_kernel_avx512 = {
	.name = "avx512",
	.path = ST_OPTIM_PATH_AVX512,
	.supported = avx512_supported,
	.adam = avx512_adam,
	.gstat = avx512_gstat,
};

const struct st_optim_kernel st_optim_kernel_avx512bf16 = {
	.name = "avx512bf16",
	.path = ST_OPTIM_PATH_AVX512,
	.supported = avx512bf16_supported,
	.adam = avx512bf16_adam,
	.gstat = avx512bf16_gstat,
};

#endif
