/* strata: what the cuda op files (the .cu files of src/backend/cuda) share
 * and nothing else sees. Only for inclusion from .cu files (C++ linkage). */
#ifndef STRATA_CUDA_INTERNAL_H
#define STRATA_CUDA_INTERNAL_H

#include <cuda_runtime.h>

struct st_cuda_ctx;

/* The stream every op of ctx is queued on. Defined next to struct
 * st_cuda_ctx (ops.cu); borrowed, valid until st_cuda_ctx_destroy(). */
cudaStream_t st_cuda_ctx_stream(struct st_cuda_ctx *ctx);

/* A CUDA status as -errno (-ENOMEM, -ENODEV, -EINVAL, else -EIO), with
 * "cuda: <what>: <message> (<name>)" kept in st_error_last() and the
 * non-sticky error state cleared. Defined in device_cuda.cu; every .cu file
 * of the cuda device maps its errors through it. */
int st_cuda_err(cudaError_t e, const char *what);

/* Return st_cuda_err() from the calling function when call fails. */
#define CU_CHECK(call, what)                              \
	do {                                              \
		cudaError_t e_ = (call);                  \
		if (e_ != cudaSuccess)                    \
			return st_cuda_err(e_, what);     \
	} while (0)

#endif
