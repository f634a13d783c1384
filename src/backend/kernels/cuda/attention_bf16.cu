/* bf16 flash-style causal attention on tensor cores (mma.sync m16n8k16,
 * sm_80+): the launches of attention_bf16_kernels.cuh, whose comment and
 * docs/gpu.md hold the design. bf16 q, k, v, out and dout, fp32 lse, fp32
 * or bf16 gradients (accumulated into); every sum in fp32. The forward is
 * one kernel; the backward two (dK/dV per key tile, dQ per query tile), no
 * atomics, so a rerun gives the same bits. Head sizes 64 and 128. */
#include <cuda_runtime.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>

extern "C" {
#include "cuda_ops.h"
}
#include "cuda_internal.h"

#include "attention_bf16_kernels.cuh"

extern "C" int st_cuda_attention_bf16_head_ok(int hs)
{
	return hs == 64 || hs == 128;
}

/* Shapes and pointers the kernels take, or -EINVAL with the reason: head
 * size 64 or 128, 4-byte aligned tensors (the tiles move two bf16 at a
 * time). */
static int ab_check(const char *op, int B, int T, int NH, int NKV, int hs,
		    const void *const *ptrs, int nptrs)
{
	if (B < 0 || T < 0 || NH <= 0 || NKV <= 0 || NH % NKV)
		return st_error_set(-EINVAL, "cuda %s: bad shape B=%d T=%d NH=%d NKV=%d", op, B,
				    T, NH, NKV);
	if (!st_cuda_attention_bf16_head_ok(hs))
		return st_error_set(-EINVAL, "cuda %s: bf16 head size %d (64 or 128 supported)",
				    op, hs);
	if ((long long)B * NH > 0x7fffffffLL || (T + AB_TILE - 1) / AB_TILE > 65535)
		return st_error_set(-EINVAL, "cuda %s: B*NH=%lld or T=%d too large", op,
				    (long long)B * NH, T);
	for (int i = 0; i < nptrs; i++)
		if ((uintptr_t)ptrs[i] % 4)
			return st_error_set(-EINVAL, "cuda %s: tensor %d not 4-byte aligned", op,
					    i);
	return 0;
}

/* Launch kern with smem_bytes of dynamic shared memory (at most ~69 KiB,
 * the opt-in every sm_80+ GPU allows). */
template <typename K>
static int ab_launch(const char *what, K kern, dim3 grid, size_t smem_bytes,
		     cudaStream_t stream, const ab_params &p)
{
	cudaError_t e;

	if (smem_bytes > 48 * 1024) {
		e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
					 (int)smem_bytes);
		if (e != cudaSuccess)
			return st_cuda_err(e, what);
	}
	kern<<<grid, AB_THREADS, smem_bytes, stream>>>(p);
	e = cudaGetLastError();
	if (e != cudaSuccess)
		return st_cuda_err(e, what);
	return 0;
}

static int ab_fwd(struct st_cuda_ctx *ctx, int B, int hs, const ab_params &p)
{
	const dim3 grid = ab_grid(B, p.NH, p.T);
	cudaStream_t s = st_cuda_ctx_stream(ctx);

	if (hs == 64)
		return ab_launch("attention bf16 fwd kernel", ab_fwd_kernel<64>, grid,
				 ab_fwd_smem_bytes(64), s, p);
	return ab_launch("attention bf16 fwd kernel", ab_fwd_kernel<128>, grid,
			 ab_fwd_smem_bytes(128), s, p);
}

template <int HS, typename G>
static int ab_bwd_t(cudaStream_t s, int B, const ab_params &p)
{
	int err = ab_launch("attention bf16 dK/dV kernel", ab_bwd_dkv_kernel<HS, G>,
			    ab_grid(B, p.NKV, p.T), ab_dkv_smem_bytes(HS), s, p);
	if (err)
		return err;
	return ab_launch("attention bf16 dQ kernel", ab_bwd_dq_kernel<HS, G>,
			 ab_grid(B, p.NH, p.T), ab_dq_smem_bytes(HS), s, p);
}

static int ab_bwd(struct st_cuda_ctx *ctx, int B, int hs, int grad_bf16, const ab_params &p)
{
	cudaStream_t s = st_cuda_ctx_stream(ctx);

	if (hs == 64)
		return grad_bf16 ? ab_bwd_t<64, st_bf16>(s, B, p) : ab_bwd_t<64, float>(s, B, p);
	return grad_bf16 ? ab_bwd_t<128, st_bf16>(s, B, p) : ab_bwd_t<128, float>(s, B, p);
}

extern "C" int st_cuda_attention_fwd_bf16(struct st_cuda_ctx *ctx, uint16_t *out, float *lse,
					  const uint16_t *qkv, int B, int T, int C, int NH)
{
	return st_cuda_attention_fwd_bf16_seg(ctx, out, lse, qkv, B, T, C, NH, NULL);
}

extern "C" int st_cuda_attention_fwd_bf16_seg(struct st_cuda_ctx *ctx, uint16_t *out,
					      float *lse, const uint16_t *qkv, int B, int T,
					      int C, int NH, const int32_t *seg)
{
	const void *ptrs[] = { out, lse, qkv };
	const int hs = NH > 0 && C % NH == 0 ? C / NH : 0;
	int err = st_cuda_ctx_enter(ctx);

	if (err == 0)
		err = C > 0 ? ab_check("attention_fwd bf16", B, T, NH, NH, hs, ptrs, 3)
			    : st_error_set(-EINVAL, "cuda attention_fwd bf16: C=%d", C);
	if (err)
		return err;
	if (B == 0 || T == 0)
		return 0;
	ab_params p = {};
	p.q = qkv;
	p.k = qkv + C;
	p.v = qkv + 2 * C;
	p.out = out;
	p.lse = lse;
	p.ldq = p.ldk = 3LL * C;
	p.ldo = C;
	p.T = T;
	p.NH = p.NKV = NH;
	p.scale = 1.0f / sqrtf((float)hs);
	p.seg = (const int *)seg;
	return ab_fwd(ctx, B, hs, p);
}

extern "C" int st_cuda_attention_bwd_bf16(struct st_cuda_ctx *ctx, void *dqkv, int grad_bf16,
					  const uint16_t *dout, const uint16_t *qkv,
					  const uint16_t *out, const float *lse, int B, int T,
					  int C, int NH)
{
	return st_cuda_attention_bwd_bf16_seg(ctx, dqkv, grad_bf16, dout, qkv, out, lse, B, T, C,
					      NH, NULL);
}

extern "C" int st_cuda_attention_bwd_bf16_seg(struct st_cuda_ctx *ctx, void *dqkv,
					      int grad_bf16, const uint16_t *dout,
					      const uint16_t *qkv, const uint16_t *out,
					      const float *lse, int B, int T, int C, int NH,
					      const int32_t *seg)
{
	const void *ptrs[] = { dqkv, dout, qkv, out, lse };
	const int hs = NH > 0 && C % NH == 0 ? C / NH : 0;
	int err = st_cuda_ctx_enter(ctx);

	if (err == 0)
		err = C > 0 ? ab_check("attention_bwd bf16", B, T, NH, NH, hs, ptrs, 5)
			    : st_error_set(-EINVAL, "cuda attention_bwd bf16: C=%d", C);
	if (err)
		return err;
	if (B == 0 || T == 0)
		return 0;
	const size_t esz = grad_bf16 ? 2 : 4;
	ab_params p = {};
	p.q = qkv;
	p.k = qkv + C;
	p.v = qkv + 2 * C;
	p.o = out;
	p.dout = dout;
	p.lse = (float *)lse;
	p.dq = dqkv;
	p.dk = (char *)dqkv + esz * C;
	p.dv = (char *)dqkv + esz * 2 * C;
	p.ldq = p.ldk = 3LL * C;
	p.ldo = C;
	p.T = T;
	p.NH = p.NKV = NH;
	p.scale = 1.0f / sqrtf((float)hs);
	p.seg = (const int *)seg;
	return ab_bwd(ctx, B, hs, grad_bf16, p);
}

extern "C" int st_cuda_gqa_attention_fwd_bf16(struct st_cuda_ctx *ctx, uint16_t *out,
					      float *lse, const uint16_t *q, const uint16_t *k,
					      const uint16_t *v, int B, int T, int NH, int NKV,
					      int hd)
{
	return st_cuda_gqa_attention_fwd_bf16_seg(ctx, out, lse, q, k, v, B, T, NH, NKV, hd,
						  NULL);
}

extern "C" int st_cuda_gqa_attention_fwd_bf16_seg(struct st_cuda_ctx *ctx, uint16_t *out,
						  float *lse, const uint16_t *q,
						  const uint16_t *k, const uint16_t *v, int B,
						  int T, int NH, int NKV, int hd,
						  const int32_t *seg)
{
	const void *ptrs[] = { out, lse, q, k, v };
	int err = st_cuda_ctx_enter(ctx);

	if (err == 0)
		err = ab_check("gqa_attention_fwd bf16", B, T, NH, NKV, hd, ptrs, 5);
	if (err)
		return err;
	if (B == 0 || T == 0)
		return 0;
	ab_params p = {};
	p.q = q;
	p.k = k;
	p.v = v;
	p.out = out;
	p.lse = lse;
	p.ldq = p.ldo = (long long)NH * hd;
	p.ldk = (long long)NKV * hd;
	p.T = T;
	p.NH = NH;
	p.NKV = NKV;
	p.scale = 1.0f / sqrtf((float)hd);
	p.seg = (const int *)seg;
	return ab_fwd(ctx, B, hd, p);
}

extern "C" int st_cuda_gqa_attention_bwd_bf16(struct st_cuda_ctx *ctx, void *dq, void *dk,
					      void *dv, int grad_bf16, const uint16_t *dout,
					      const uint16_t *q, const uint16_t *k,
					      const uint16_t *v, const uint16_t *out,
					      const float *lse, int B, int T, int NH, int NKV,
					      int hd)
{
	return st_cuda_gqa_attention_bwd_bf16_seg(ctx, dq, dk, dv, grad_bf16, dout, q, k, v, out,
						  lse, B, T, NH, NKV, hd, NULL);
}

extern "C" int st_cuda_gqa_attention_bwd_bf16_seg(struct st_cuda_ctx *ctx, void *dq, void *dk,
						  void *dv, int grad_bf16,
						  const uint16_t *dout, const uint16_t *q,
						  const uint16_t *k, const uint16_t *v,
						  const uint16_t *out, const float *lse, int B,
						  int T, int NH, int NKV, int hd,
						  const int32_t *seg)
{
	const void *ptrs[] = { dq, dk, dv, dout, q, k, v, out, lse };
	int err = st_cuda_ctx_enter(ctx);

	if (err == 0)
		err = ab_check("gqa_attention_bwd bf16", B, T, NH, NKV, hd, ptrs, 9);
	if (err)
		return err;
	if (B == 0 || T == 0)
		return 0;
	ab_params p = {};
	p.q = q;
	p.k = k;
	p.v = v;
	p.o = out;
	p.dout = dout;
	p.lse = (float *)lse;
	p.dq = dq;
	p.dk = dk;
	p.dv = dv;
	p.ldq = p.ldo = (long long)NH * hd;
	p.ldk = (long long)NKV * hd;
	p.T = T;
	p.NH = NH;
	p.NKV = NKV;
	p.scale = 1.0f / sqrtf((float)hd);
	p.seg = (const int *)seg;
	return ab_bwd(ctx, B, hd, grad_bf16, p);
}
