/* Flash-style causal self-attention on the GPU, fp32, matching
 * st_cpu_attention_fwd/bwd (src/backend/kernels/cpu/kernels.c).
 *
 * Every kernel works on tiles of ATT_TILE (32) queries or keys of one
 * (batch, head) pair: blockIdx.x is b*NH + h, blockIdx.y the tile. A block
 * is ATT_WARPS (8) warps; a warp owns 4 rows of its block's tile. The other
 * side (keys for the forward and dQ, queries for dK/dV) is streamed through
 * shared memory one tile at a time, so no (T,T) score matrix exists. Inside a
 * warp, one lane is one key (or query) of the streamed tile when scores are
 * made, and one lane holds channels lane, lane+32, lane+64, lane+96 of a
 * head (hs <= 128) when rows are accumulated.
 *
 * The backward is deterministic (no atomics): one kernel owns a key tile and
 * sums dK, dV over every query that sees it; a second owns a query tile and
 * sums dQ over its keys. Each writes only its own rows of dqkv, adding to
 * what is there (backward accumulates). D_i = dout_i . out_i is recomputed
 * per tile from the saved out instead of living in a scratch buffer. */
#include <cuda_runtime.h>

#include <errno.h>
#include <math.h>

extern "C" {
#include "cuda_ops.h"
}
#include "cuda_internal.h"

#include "attention_kernels.cuh"

/* Shapes the kernels take, or -EINVAL with the reason. */
static int att_check(const char *op, int B, int T, int C, int NH)
{
	if (B < 0 || T < 0 || C <= 0 || NH <= 0 || C % NH != 0)
		return st_error_set(-EINVAL, "cuda %s: bad shape B=%d T=%d C=%d NH=%d", op, B,
				    T, C, NH);
	if (C / NH > ATT_HS_MAX)
		return st_error_set(-EINVAL, "cuda %s: head size %d over the %d supported",
				    op, C / NH, ATT_HS_MAX);
	if ((long long)B * NH > 0x7fffffffLL || (T + ATT_TILE - 1) / ATT_TILE > 65535)
		return st_error_set(-EINVAL, "cuda %s: B*NH=%lld or T=%d too large", op,
				    (long long)B * NH, T);
	return 0;
}

/* Launch kern with smem_bytes of dynamic shared memory (over 48 KiB needs
 * the opt-in attribute, every sm_80+ GPU allows the <= 67 KiB used here). */
template <typename K, typename... Args>
static int att_launch(const char *what, K kern, dim3 grid, size_t smem_bytes,
		      cudaStream_t stream, Args... args)
{
	cudaError_t e;

	if (smem_bytes > 48 * 1024) {
		e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
					 (int)smem_bytes);
		if (e != cudaSuccess)
			return st_cuda_err(e, what);
	}
	kern<<<grid, ATT_THREADS, smem_bytes, stream>>>(args...);
	e = cudaGetLastError();
	if (e != cudaSuccess)
		return st_cuda_err(e, what);
	return 0;
}

extern "C" int st_cuda_attention_fwd(struct st_cuda_ctx *ctx, float *out, float *lse,
				     const float *qkv, int B, int T, int C, int NH)
{
	return st_cuda_attention_fwd_seg(ctx, out, lse, qkv, B, T, C, NH, NULL);
}

extern "C" int st_cuda_attention_fwd_seg(struct st_cuda_ctx *ctx, float *out, float *lse,
					 const float *qkv, int B, int T, int C, int NH,
					 const int32_t *seg)
{
	int err = st_cuda_ctx_enter(ctx);

	if (err == 0)
		err = att_check("attention_fwd", B, T, C, NH);
	if (err)
		return err;
	if (B == 0 || T == 0)
		return 0;
	const int hs = C / NH;
	const float scale = 1.0f / sqrtf((float)hs);
	const dim3 grid = att_grid(B, NH, T);
	const size_t smem_bytes = att_fwd_smem_bytes(hs);
	return att_launch("attention_fwd kernel", att_fwd_kernel, grid, smem_bytes,
			  st_cuda_ctx_stream(ctx), out, lse, qkv, T, C, NH, hs, scale,
			  (const int *)seg);
}

extern "C" int st_cuda_attention_bwd(struct st_cuda_ctx *ctx, float *dqkv,
				     const float *dout, const float *qkv, const float *out,
				     const float *lse, int B, int T, int C, int NH)
{
	return st_cuda_attention_bwd_seg(ctx, dqkv, dout, qkv, out, lse, B, T, C, NH, NULL);
}

extern "C" int st_cuda_attention_bwd_seg(struct st_cuda_ctx *ctx, float *dqkv,
					 const float *dout, const float *qkv, const float *out,
					 const float *lse, int B, int T, int C, int NH,
					 const int32_t *seg)
{
	int err = st_cuda_ctx_enter(ctx);

	if (err == 0)
		err = att_check("attention_bwd", B, T, C, NH);
	if (err)
		return err;
	if (B == 0 || T == 0)
		return 0;
	const int hs = C / NH;
	const float scale = 1.0f / sqrtf((float)hs);
	const dim3 grid = att_grid(B, NH, T);
	const size_t smem_bytes = att_bwd_smem_bytes(hs); /* both kernels */
	cudaStream_t stream = st_cuda_ctx_stream(ctx);
	err = att_launch("attention_bwd dK/dV kernel", att_bwd_dkv_kernel, grid, smem_bytes,
			 stream, dqkv, dout, qkv, out, lse, T, C, NH, hs, scale, (const int *)seg);
	if (err)
		return err;
	return att_launch("attention_bwd dQ kernel", att_bwd_dq_kernel, grid, smem_bytes,
			  stream, dqkv, dout, qkv, out, lse, T, C, NH, hs, scale, (const int *)seg);
}

/* ---- grouped-query attention (LLaMA) ------------------------------------------------- */

static int gqa_check(const char *op, int B, int T, int NH, int NKV, int hd)
{
	if (B < 0 || T < 0 || NH <= 0 || NKV <= 0 || NH % NKV || hd <= 0)
		return st_error_set(-EINVAL, "cuda %s: bad shape B=%d T=%d NH=%d NKV=%d hd=%d",
				    op, B, T, NH, NKV, hd);
	if (hd > ATT_HS_MAX)
		return st_error_set(-EINVAL, "cuda %s: head size %d over the %d supported", op,
				    hd, ATT_HS_MAX);
	if ((long long)B * NH > 0x7fffffffLL || (T + ATT_TILE - 1) / ATT_TILE > 65535)
		return st_error_set(-EINVAL, "cuda %s: B*NH=%lld or T=%d too large", op,
				    (long long)B * NH, T);
	return 0;
}

extern "C" int st_cuda_gqa_attention_fwd(struct st_cuda_ctx *ctx, float *out, float *lse,
					 const float *q, const float *k, const float *v, int B,
					 int T, int NH, int NKV, int hd)
{
	return st_cuda_gqa_attention_fwd_seg(ctx, out, lse, q, k, v, B, T, NH, NKV, hd, NULL);
}

extern "C" int st_cuda_gqa_attention_fwd_seg(struct st_cuda_ctx *ctx, float *out, float *lse,
					     const float *q, const float *k, const float *v,
					     int B, int T, int NH, int NKV, int hd,
					     const int32_t *seg)
{
	int err = st_cuda_ctx_enter(ctx);

	if (err == 0)
		err = gqa_check("gqa_attention_fwd", B, T, NH, NKV, hd);
	if (err)
		return err;
	if (B == 0 || T == 0)
		return 0;
	const float scale = 1.0f / sqrtf((float)hd);
	return att_launch("gqa_attention_fwd kernel", gqa_fwd_kernel, att_grid(B, NH, T),
			  att_fwd_smem_bytes(hd), st_cuda_ctx_stream(ctx), out, lse, q, k, v, T,
			  NH, NKV, hd, scale, (const int *)seg);
}

extern "C" int st_cuda_gqa_attention_bwd(struct st_cuda_ctx *ctx, float *dq, float *dk,
					 float *dv, const float *dout, const float *q,
					 const float *k, const float *v, const float *out,
					 const float *lse, int B, int T, int NH, int NKV, int hd)
{
	return st_cuda_gqa_attention_bwd_seg(ctx, dq, dk, dv, dout, q, k, v, out, lse, B, T, NH,
					     NKV, hd, NULL);
}

extern "C" int st_cuda_gqa_attention_bwd_seg(struct st_cuda_ctx *ctx, float *dq, float *dk,
					     float *dv, const float *dout, const float *q,
					     const float *k, const float *v, const float *out,
					     const float *lse, int B, int T, int NH, int NKV,
					     int hd, const int32_t *seg)
{
	int err = st_cuda_ctx_enter(ctx);

	if (err == 0)
		err = gqa_check("gqa_attention_bwd", B, T, NH, NKV, hd);
	if (err)
		return err;
	if (B == 0 || T == 0)
		return 0;
	const float scale = 1.0f / sqrtf((float)hd);
	const size_t smem_bytes = att_bwd_smem_bytes(hd);
	cudaStream_t stream = st_cuda_ctx_stream(ctx);
	err = att_launch("gqa_attention_bwd dK/dV kernel", gqa_bwd_dkv_kernel,
			 gqa_kv_grid(B, NKV, T), smem_bytes, stream, dk, dv, dout, q, k, v, out,
			 lse, T, NH, NKV, hd, scale, (const int *)seg);
	if (err)
		return err;
	return att_launch("gqa_attention_bwd dQ kernel", gqa_bwd_dq_kernel, att_grid(B, NH, T),
			  smem_bytes, stream, dq, dout, q, k, v, out, lse, T, NH, NKV, hd, scale,
			  (const int *)seg);
}
