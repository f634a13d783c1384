/* strata: what the nccl backend (nccl.c, C), and the mpi backend on the
 * cuda device, take from the cuda side. Only for src/comm/. */
#ifndef STRATA_COMM_NCCL_CUDA_H
#define STRATA_COMM_NCCL_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct st_queue;

/* The CUDA stream behind a queue of the cuda device (device_cuda.cu). */
cudaStream_t st_cuda_queue_stream(struct st_queue *q);

/* Queue the rank-order fold of nccl_sum_kernels.cuh on stream: elem_bytes
 * 4 (fp32) or 8 (fp64). 0 or -errno (detail set). nccl_sum.cu. */
int st_comm_cuda_fold(const void *in, void *out, size_t n, int terms, size_t elem_bytes,
		      cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
