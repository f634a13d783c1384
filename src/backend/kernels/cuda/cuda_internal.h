/* strata: what the cuda op files (the .cu files of src/backend/kernels/cuda) share
 * and nothing else sees. Only for inclusion from .cu files (C++ linkage). */
#ifndef STRATA_CUDA_INTERNAL_H
#define STRATA_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "device_cuda.h" /* st_cuda_err(), CU_CHECK() */

struct st_cuda_ctx;

/* The stream every op of ctx is queued on. Defined next to struct
 * st_cuda_ctx (context.cu); borrowed, valid until st_cuda_ctx_destroy(). */
cudaStream_t st_cuda_ctx_stream(struct st_cuda_ctx *ctx);

/* context.cu's: select ctx's device (every op starts here); 0 or -errno. */
int st_cuda_ctx_enter(struct st_cuda_ctx *ctx);
/* Column-major D (m,n) = op(A) @ op(B) + beta * D through cuBLASLt with
 * fp32 accumulation (CUBLAS_COMPUTE_32F): A and B bf16 (ab_bf16) or fp32,
 * D bf16 (d_bf16) or fp32, bias (m, per column; NULL: none) bf16
 * (bias_bf16) or fp32 through the BIAS epilogue; with gelu the GELU(_AUX)
 * epilogue, aux (D's type) getting the pre-activation. -ENOTSUP when
 * cuBLASLt has no algorithm (the caller falls back), else 0 or -errno. */
int st_cuda_lt_matmul(struct st_cuda_ctx *ctx, int trans_a, int trans_b, uint64_t m,
		      uint64_t n, uint64_t k, const void *A, int64_t lda, const void *B,
		      int64_t ldb, int ab_bf16, void *D, int d_bf16, int64_t ldd, float beta,
		      const void *bias, int bias_bf16, int gelu, void *aux);

/* ops.cu's: out1 (C) += column sums of g (N,C), fp32 or bf16; out2 (C) +=
 * column sums of g * (inp - mean) * rstd when inp is given (mean NULL:
 * g * inp * rstd, RMSNorm's). Either output may be NULL. Two passes over
 * the context's scratch (k_colsum_partial, k_colsum_final): the partial
 * sums of row chunks in parallel, then the chunks in order, so the result
 * does not depend on timing. Queued on the context's stream (which it
 * does not enter: its callers have). 0 or -errno. */
int st_cuda_colsum(struct st_cuda_ctx *ctx, float *out1, float *out2, const float *g,
		   const float *inp, const float *mean, const float *rstd, int N, int C);
int st_cuda_colsum(struct st_cuda_ctx *ctx, float *out1, float *out2, const uint16_t *g,
		   const float *inp, const float *mean, const float *rstd, int N, int C);

#endif
