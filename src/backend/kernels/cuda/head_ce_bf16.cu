/* The bf16 head's matmul fused with the cross-entropy on tensor cores
 * (cuda_bf16.h's st_cuda_head_ce_bf16): the launches of
 * head_ce_kernels.cuh, whose comment and docs/gpu.md hold the design. The
 * forward is two kernels (per-split partials, then their fold in split
 * order); the backward two more (dx per row tile, dW per vocab tile), no
 * atomics, so a rerun gives the same bits. */
#include <cuda_runtime.h>

#include <errno.h>
#include <stdint.h>

extern "C" {
#include "cuda_bf16.h"
}
#include "cuda_internal.h"

#include "head_ce_kernels.cuh"

static int hc_launch_check(const char *what)
{
	cudaError_t e = cudaGetLastError();

	return e == cudaSuccess ? 0 : st_cuda_err(e, what);
}

extern "C" int st_cuda_head_ce_bf16(struct st_cuda_ctx *ctx, float *losses, float *dx,
				    float *dw, const uint16_t *x, const uint16_t *w,
				    const int32_t *targets, float *scratch, size_t scratch_elems,
				    float dloss, int N, int C, int V)
{
	int rc = st_cuda_ctx_enter(ctx);

	if (rc)
		return rc;
	cudaStream_t s = st_cuda_ctx_stream(ctx);
	if (N < 0 || C <= 0 || V <= 0 || (!dx) != (!dw))
		return st_error_set(-EINVAL,
				    "cuda head_crossentropy bf16: bad shape N=%d C=%d V=%d or only "
				    "one of dx, dw",
				    N, C, V);
	if (N == 0)
		return 0;
	if ((uintptr_t)x % 4 || (uintptr_t)w % 4)
		return st_error_set(-EINVAL, "cuda head_crossentropy bf16: x or w not 4-byte aligned");
	/* the forward's partials: as many splits of the vocabulary as the
	 * scratch holds, at most HC_MAX_SPLITS (a function of the shapes
	 * only, so the fold's order is too) */
	const size_t per_split = (size_t)3 * N, ntiles = ((size_t)V + HC_TILE - 1) / HC_TILE;
	if (scratch_elems < (size_t)N + per_split)
		return st_error_set(-EINVAL,
				    "cuda head_crossentropy bf16: scratch of %zu floats, %zu needed",
				    scratch_elems, (size_t)N + per_split);
	size_t S = (scratch_elems - (size_t)N) / per_split;
	S = S < HC_MAX_SPLITS ? S : HC_MAX_SPLITS;
	S = S < ntiles ? S : ntiles;
	const unsigned row_tiles = (unsigned)(((size_t)N + HC_TILE - 1) / HC_TILE);
	if (row_tiles > 0x7fffffffu || ntiles > 0x7fffffffu)
		return st_error_set(-EINVAL, "cuda head_crossentropy bf16: N=%d or V=%d too large", N,
				    V);

	hc_params p = {};
	p.x = x;
	p.w = w;
	p.targets = targets;
	p.losses = losses;
	p.lse = scratch;
	p.part = scratch + N;
	p.dx = dx;
	p.dw = dw;
	p.dloss = dloss;
	p.N = N;
	p.C = C;
	p.V = V;
	p.S = (int)S;

	hc_fwd_kernel<<<dim3(row_tiles, (unsigned)S), HC_THREADS, hc_fwd_smem_bytes(), s>>>(p);
	if ((rc = hc_launch_check("head_crossentropy bf16 fwd kernel")))
		return rc;
	hc_lse_kernel<<<(unsigned)(((size_t)N + 127) / 128), 128, 0, s>>>(p);
	if ((rc = hc_launch_check("head_crossentropy bf16 lse kernel")))
		return rc;
	if (!dx)
		return 0;
	const unsigned col_tiles = (unsigned)((C + HC_DC - 1) / HC_DC);
	hc_dx_kernel<<<dim3(row_tiles, col_tiles), HC_THREADS, hc_bwd_smem_bytes(), s>>>(p);
	if ((rc = hc_launch_check("head_crossentropy bf16 dx kernel")))
		return rc;
	hc_dw_kernel<<<dim3((unsigned)ntiles, col_tiles), HC_THREADS, hc_bwd_smem_bytes(), s>>>(p);
	return hc_launch_check("head_crossentropy bf16 dW kernel");
}
