/* strata: one launcher for the elementwise kernels of the cuda op files
 * (host side, nvcc only): enter the context, nothing to do for n == 0, a
 * grid-stride grid of ST_CUDA_ELEM_BLOCK threads on the context's stream,
 * the launch error mapped to -errno. Include after cuda_internal.h and
 * ops_kernels.cuh (grid_for). */
#ifndef STRATA_CUDA_LAUNCH_CUH
#define STRATA_CUDA_LAUNCH_CUH

template <typename... P, typename... A>
static int elem_launch(struct st_cuda_ctx *ctx, const char *what, size_t n, void (*k)(P...),
		       A... args)
{
	int rc = st_cuda_ctx_enter(ctx);
	if (rc || n == 0)
		return rc;
	k<<<grid_for(n, ST_CUDA_ELEM_BLOCK), ST_CUDA_ELEM_BLOCK, 0, st_cuda_ctx_stream(ctx)>>>(
		args...);
	CU_CHECK(cudaGetLastError(), what);
	return 0;
}

#endif
