/* The nccl backend's local sum on the GPU: the kernel of
 * nccl_sum_kernels.cuh, launched on the comm's stream. Built with
 * -fmad=false (src/comm/meson.build); the kernel only adds, so nothing is
 * fused anyway, and the result is the fold of strata/comm.h bit for bit,
 * as the cpu device's host sum. */
#include <cuda_runtime.h>

#include "nccl_cuda.h"
#include "nccl_sum_kernels.cuh"

#include <errno.h>

extern "C" {
#include "strata/common.h"
}

extern "C" int st_comm_cuda_fold(const void *in, void *out, size_t n, int terms,
				 size_t elem_bytes, cudaStream_t stream)
{
	cudaError_t e;

	if (elem_bytes == 4)
		k_comm_fold<float><<<st_comm_sum_grid(n), ST_COMM_SUM_BLOCK, 0, stream>>>(
			(const float *)in, (float *)out, n, terms);
	else
		k_comm_fold<double><<<st_comm_sum_grid(n), ST_COMM_SUM_BLOCK, 0, stream>>>(
			(const double *)in, (double *)out, n, terms);
	e = cudaGetLastError();
	if (e != cudaSuccess)
		return st_error_set(-EIO, "nccl: the local sum's launch: %s", cudaGetErrorString(e));
	return 0;
}
