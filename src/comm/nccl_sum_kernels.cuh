/* The nccl backend's local sum (strata/comm.h, "The order promise"):
 * out[i] = ((in[0*n + i] + in[1*n + i]) + ...) + in[(terms-1)*n + i], each
 * addition rounded to the type, in rank order, from rank 0's term. The very
 * code nvcc compiles for nccl_sum.cu (with -fmad=false) and
 * tests/comm/test_nccl_sum_emu.cpp runs on the cpu (tests/cuda/cuda_emu.h).
 * One thread an element, a grid-stride loop. */
#ifndef STRATA_COMM_NCCL_SUM_KERNELS_CUH
#define STRATA_COMM_NCCL_SUM_KERNELS_CUH

#include <stddef.h>

#define ST_COMM_SUM_BLOCK 256u
#define ST_COMM_SUM_MAX_GRID 4096u

template <typename T>
__global__ void k_comm_fold(const T *in, T *out, size_t n, int terms)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
		T acc = in[i];

		for (int q = 1; q < terms; q++)
			acc = acc + in[(size_t)q * n + i];
		out[i] = acc;
	}
}

/* Blocks for n elements. */
static inline unsigned st_comm_sum_grid(size_t n)
{
	size_t g = (n + ST_COMM_SUM_BLOCK - 1) / ST_COMM_SUM_BLOCK;

	return (unsigned)(g < ST_COMM_SUM_MAX_GRID ? (g ? g : 1) : ST_COMM_SUM_MAX_GRID);
}

#endif
