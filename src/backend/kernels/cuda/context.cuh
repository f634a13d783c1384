/* strata: the cuda context's insides (struct st_cuda_ctx) and what the
 * three files that make it and queue on it share: context.cu (the context,
 * device memory, timers), matmul.cu (cuBLASLt) and ops.cu (the kernels'
 * ops). The other op files see the context only through cuda_internal.h.
 * Only for inclusion from .cu files (C++ linkage). */
#ifndef STRATA_CUDA_CONTEXT_CUH
#define STRATA_CUDA_CONTEXT_CUH

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "strata/common.h"
}
#include "cuda_internal.h"

struct st_cuda_ctx {
	int ordinal;
	cudaStream_t stream;
	cublasLtHandle_t lt;
	void *workspace;
	size_t workspace_bytes;
	void *scratch; /* partial sums of the two-pass reductions */
	size_t scratch_bytes;
	cudaEvent_t anchor; /* timers' zero: reached on the stream at anchor_ns */
	uint64_t anchor_ns;
	uint64_t gelu_fused, gelu_unfused; /* matmul_gelu_fwd calls, by path */
	int gelu_epilogue;                 /* 0 unchecked, 1 matches the kernel, -1 not used */
};

/* After a kernel launch: a bad configuration shows up here. */
#define LAUNCH_CHECK(what) CU_CHECK(cudaGetLastError(), what)

/* Every op starts here: a context, the right current device (a launch goes
 * to the current device, the stream belongs to the context's). */
static inline int ctx_enter(struct st_cuda_ctx *ctx)
{
	if (!ctx)
		return st_error_set(-EINVAL, "cuda: no context");
	CU_CHECK(cudaSetDevice(ctx->ordinal), "cudaSetDevice");
	return 0;
}

/* matmul.cu's: load cuBLASLt (st_cuda_blas_load()), then make the
 * context's cuBLASLt handle and workspace; 0 or -errno, with what was made
 * left in ctx for st_cuda_lt_close(), which frees the workspace and the
 * handle (either may be missing). */
int st_cuda_lt_open(struct st_cuda_ctx *ctx);
void st_cuda_lt_close(struct st_cuda_ctx *ctx);

#endif
