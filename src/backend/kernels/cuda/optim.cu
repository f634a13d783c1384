/* The optimizer on the GPU: AdamW and the gradient's sum of squares, the
 * host's bits (optim_kernels.cuh says how), queued on the context's stream.
 * Used by the engine when a unit's G, P, M, V live in vram (docs/gpu.md). */
#include <cuda_runtime.h>

#include <errno.h>

extern "C" {
#include "cuda_ops.h"
}
#include "cuda_internal.h"

#include "optim_kernels.cuh"

extern "C" int st_cuda_adamw(struct st_cuda_ctx *ctx, const float c[9], const float *g,
			     float *p, float *m, float *v, void *w, int w_bf16, uint32_t *bad,
			     size_t n)
{
	struct st_adamw_consts k = { c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8] };

	if (!ctx || !bad || (n && (!g || !p || !m || !v)))
		return st_error_set(-EINVAL, "cuda adamw: G, P, M, V and the count are needed");
	int rc = st_cuda_ctx_enter(ctx);
	if (rc || n == 0)
		return rc;
	k_adamw<<<opt_grid(n), ST_OPT_BLOCK, 0, st_cuda_ctx_stream(ctx)>>>(
		g, p, m, v, w_bf16 ? NULL : (float *)w, w_bf16 ? (uint16_t *)w : NULL,
		(unsigned *)bad, k, n);
	CU_CHECK(cudaGetLastError(), "adamw kernel");
	return 0;
}

extern "C" int st_cuda_grad_sumsq(struct st_cuda_ctx *ctx, void *out, void *scratch,
				  const float *g, size_t n)
{
	cudaStream_t s;

	if (!ctx || !out || (n && (!g || !scratch)))
		return st_error_set(-EINVAL, "cuda grad_sumsq: out, scratch and G are needed");
	int rc = st_cuda_ctx_enter(ctx);
	if (rc)
		return rc;
	s = st_cuda_ctx_stream(ctx);
	if (n) {
		k_gsq_parts<<<gsq_grid(n), ST_GSQ_BLOCK, 0, s>>>((struct st_gsq_part *)scratch, g,
								 n);
		CU_CHECK(cudaGetLastError(), "grad_sumsq parts kernel");
	}
	k_gsq_final<<<1, ST_GSQ_BLOCK, 0, s>>>((struct st_gsq_part *)out,
					       (const struct st_gsq_part *)scratch, n);
	CU_CHECK(cudaGetLastError(), "grad_sumsq final kernel");
	return 0;
}
