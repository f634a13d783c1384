/* strata: what the cuda op files (the .cu files of src/backend/cuda) share
 * and nothing else sees. Only for inclusion from .cu files (C++ linkage). */
#ifndef STRATA_CUDA_INTERNAL_H
#define STRATA_CUDA_INTERNAL_H

#include <cuda_runtime.h>

struct st_cuda_ctx;

/* The stream every op of ctx is queued on. Defined next to struct
 * st_cuda_ctx (ops.cu); borrowed, valid until st_cuda_ctx_destroy(). */
cudaStream_t st_cuda_ctx_stream(struct st_cuda_ctx *ctx);

#endif
