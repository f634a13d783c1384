/* Flash-style causal self-attention on the GPU, fp32, matching
 * st_cpu_attention_fwd/bwd (src/backend/cpu/kernels.c).
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
#include "strata/cuda_ops.h"
}
#include "cuda_internal.h"

#define ATT_TILE 32
#define ATT_WARPS 8
#define ATT_THREADS (ATT_WARPS * 32)
#define ATT_ROWS (ATT_TILE / ATT_WARPS) /* rows of the tile per warp */
#define ATT_HS_MAX 128
#define ATT_DPL (ATT_HS_MAX / 32)       /* channels per lane */
#define FULL_MASK 0xffffffffu

static int att_cuda_err(cudaError_t e, const char *what)
{
	int err;

	switch (e) {
	case cudaErrorMemoryAllocation: err = -ENOMEM; break;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorInvalidDevice: err = -ENODEV; break;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidConfiguration: err = -EINVAL; break;
	default: err = -EIO; break;
	}
	cudaGetLastError(); /* clear the sticky non-fatal state */
	return st_error_set(err, "cuda: %s: %s (%s)", what, cudaGetErrorString(e),
			    cudaGetErrorName(e));
}

__device__ __forceinline__ float warp_max(float x)
{
	for (int o = 16; o > 0; o >>= 1)
		x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, o));
	return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
	for (int o = 16; o > 0; o >>= 1)
		x += __shfl_xor_sync(FULL_MASK, x, o);
	return x;
}

/* Copy rows [r0, r0 + ATT_TILE) of one head's slice (row stride ld floats)
 * into a shared tile with row stride sld; rows at or past T become 0. */
__device__ __forceinline__ void load_tile(float *dst, int sld, const float *src, size_t ld,
					  int r0, int T, int hs)
{
	for (int e = threadIdx.x; e < ATT_TILE * hs; e += blockDim.x) {
		int r = e / hs, d = e - r * hs;
		int row = r0 + r;
		dst[r * sld + d] = row < T ? src[(size_t)row * ld + d] : 0.0f;
	}
}

/* For the rows [r0, r0 + ATT_TILE) of a tile: lse_s[r] = lse[row] and
 * d_s[r] = dout_row . out_row (the softmax backward's D), 0 past T. */
__device__ __forceinline__ void load_lse_d(float *lse_s, float *d_s, const float *lse_h,
					   const float *dout_h, const float *out_h, int C,
					   int r0, int T, int hs)
{
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
	for (int rr = 0; rr < ATT_ROWS; rr++) {
		int r = warp * ATT_ROWS + rr, row = r0 + r;
		float part = 0.0f;
		if (row < T) {
			const float *g = dout_h + (size_t)row * C;
			const float *o = out_h + (size_t)row * C;
			for (int d = lane; d < hs; d += 32)
				part += g[d] * o[d];
		}
		part = warp_sum(part);
		if (lane == 0) {
			d_s[r] = row < T ? part : 0.0f;
			lse_s[r] = row < T ? lse_h[row] : 0.0f;
		}
	}
}

// out is (B,T,C), lse is (B,NH,T), qkv is (B,T,3C). Block: one query tile.
__global__ void __launch_bounds__(ATT_THREADS)
	att_fwd_kernel(float *out, float *lse, const float *qkv, int T, int C, int NH,
		       int hs, float scale)
{
	extern __shared__ float smem[];
	float *Qs = smem;                   /* ATT_TILE x hs      */
	float *Ks = Qs + ATT_TILE * hs;     /* ATT_TILE x (hs+1): lane = key */
	float *Vs = Ks + ATT_TILE * (hs + 1); /* ATT_TILE x hs    */
	const int bh = blockIdx.x, b = bh / NH, h = bh - b * NH;
	const int i0 = blockIdx.y * ATT_TILE;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const size_t C3 = 3 * (size_t)C;
	const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs;
	const float *k = q + C, *v = q + 2 * C;

	float m[ATT_ROWS], l[ATT_ROWS], o[ATT_ROWS][ATT_DPL];
#pragma unroll
	for (int rr = 0; rr < ATT_ROWS; rr++) {
		m[rr] = -INFINITY;
		l[rr] = 0.0f;
#pragma unroll
		for (int c = 0; c < ATT_DPL; c++)
			o[rr][c] = 0.0f;
	}
	load_tile(Qs, hs, q, C3, i0, T, hs);
	const int kend = min(T, i0 + ATT_TILE);
	for (int j0 = 0; j0 < kend; j0 += ATT_TILE) {
		__syncthreads(); /* the previous key tile is consumed */
		load_tile(Ks, hs + 1, k, C3, j0, T, hs);
		load_tile(Vs, hs, v, C3, j0, T, hs);
		__syncthreads();
#pragma unroll
		for (int rr = 0; rr < ATT_ROWS; rr++) {
			const int r = warp * ATT_ROWS + rr, i = i0 + r;
			if (i >= T) /* warp-uniform */
				continue;
			/* keys j0 .. i are visible; j0 <= i0 <= i, so at least one */
			const int nvalid = min(ATT_TILE, i - j0 + 1);
			float s = -INFINITY;
			if (lane < nvalid) {
				const float *qr = Qs + r * hs, *kr = Ks + lane * (hs + 1);
				float dot = 0.0f;
				for (int d = 0; d < hs; d++)
					dot += qr[d] * kr[d];
				s = dot * scale;
			}
			const float mnew = fmaxf(m[rr], warp_max(s));
			const float p = lane < nvalid ? expf(s - mnew) : 0.0f;
			const float alpha = expf(m[rr] - mnew); /* 0 on the first tile */
			l[rr] = l[rr] * alpha + warp_sum(p);
			m[rr] = mnew;
#pragma unroll
			for (int c = 0; c < ATT_DPL; c++)
				o[rr][c] *= alpha;
			for (int j = 0; j < nvalid; j++) {
				const float pj = __shfl_sync(FULL_MASK, p, j);
				const float *vr = Vs + j * hs;
#pragma unroll
				for (int c = 0; c < ATT_DPL; c++) {
					int d = lane + 32 * c;
					if (d < hs)
						o[rr][c] += pj * vr[d];
				}
			}
		}
	}
#pragma unroll
	for (int rr = 0; rr < ATT_ROWS; rr++) {
		const int i = i0 + warp * ATT_ROWS + rr;
		if (i >= T)
			continue;
		const float inv = 1.0f / l[rr];
		float *orow = out + ((size_t)b * T + i) * C + (size_t)h * hs;
#pragma unroll
		for (int c = 0; c < ATT_DPL; c++) {
			int d = lane + 32 * c;
			if (d < hs)
				orow[d] = o[rr][c] * inv;
		}
		if (lane == 0)
			lse[(size_t)bh * T + i] = m[rr] + logf(l[rr]);
	}
}

// dK, dV of one key tile, summed over every query i >= j. Block: a key tile.
__global__ void __launch_bounds__(ATT_THREADS)
	att_bwd_dkv_kernel(float *dqkv, const float *dout, const float *qkv, const float *out,
			   const float *lse, int T, int C, int NH, int hs, float scale)
{
	extern __shared__ float smem[];
	float *Ks = smem;                    /* ATT_TILE x hs (broadcast reads) */
	float *Vs = Ks + ATT_TILE * hs;      /* ATT_TILE x hs */
	float *Qs = Vs + ATT_TILE * hs;      /* ATT_TILE x (hs+1): lane = query */
	float *Gs = Qs + ATT_TILE * (hs + 1); /* dout, ATT_TILE x (hs+1) */
	float *lse_s = Gs + ATT_TILE * (hs + 1);
	float *d_s = lse_s + ATT_TILE;
	const int bh = blockIdx.x, b = bh / NH, h = bh - b * NH;
	const int j0 = blockIdx.y * ATT_TILE;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const size_t C3 = 3 * (size_t)C;
	const size_t qoff = (size_t)b * T * C3 + (size_t)h * hs;
	const size_t ooff = (size_t)b * T * C + (size_t)h * hs;
	const float *q = qkv + qoff, *k = q + C, *v = q + 2 * C;
	const float *g = dout + ooff, *o = out + ooff;
	const float *lse_h = lse + (size_t)bh * T;

	float dk[ATT_ROWS][ATT_DPL], dv[ATT_ROWS][ATT_DPL];
#pragma unroll
	for (int kk = 0; kk < ATT_ROWS; kk++)
#pragma unroll
		for (int c = 0; c < ATT_DPL; c++)
			dk[kk][c] = dv[kk][c] = 0.0f;
	load_tile(Ks, hs, k, C3, j0, T, hs);
	load_tile(Vs, hs, v, C3, j0, T, hs);
	/* query tiles that see some key of this tile: those from j0 on */
	for (int i0 = j0; i0 < T; i0 += ATT_TILE) {
		__syncthreads();
		load_tile(Qs, hs + 1, q, C3, i0, T, hs);
		load_tile(Gs, hs + 1, g, C, i0, T, hs);
		load_lse_d(lse_s, d_s, lse_h, g, o, C, i0, T, hs);
		__syncthreads();
		const int nq = min(ATT_TILE, T - i0);
		const int i = i0 + lane; /* this lane's query */
#pragma unroll
		for (int kk = 0; kk < ATT_ROWS; kk++) {
			const int jr = warp * ATT_ROWS + kk, j = j0 + jr;
			if (j >= T) /* warp-uniform */
				continue;
			float p = 0.0f, ds = 0.0f;
			if (i < T && i >= j) {
				const float *qr = Qs + lane * (hs + 1), *gr = Gs + lane * (hs + 1);
				const float *kr = Ks + jr * hs, *vr = Vs + jr * hs;
				float s = 0.0f, dp = 0.0f;
				for (int d = 0; d < hs; d++) {
					s += qr[d] * kr[d];
					dp += gr[d] * vr[d];
				}
				p = expf(s * scale - lse_s[lane]);
				ds = p * (dp - d_s[lane]);
			}
			for (int ii = 0; ii < nq; ii++) {
				const float pi = __shfl_sync(FULL_MASK, p, ii);
				const float dsi = __shfl_sync(FULL_MASK, ds, ii);
				const float *qr = Qs + ii * (hs + 1), *gr = Gs + ii * (hs + 1);
#pragma unroll
				for (int c = 0; c < ATT_DPL; c++) {
					int d = lane + 32 * c;
					if (d < hs) {
						dv[kk][c] += pi * gr[d];
						dk[kk][c] += dsi * qr[d];
					}
				}
			}
		}
	}
	float *dk_h = dqkv + qoff + C, *dv_h = dqkv + qoff + 2 * C;
#pragma unroll
	for (int kk = 0; kk < ATT_ROWS; kk++) {
		const int j = j0 + warp * ATT_ROWS + kk;
		if (j >= T)
			continue;
#pragma unroll
		for (int c = 0; c < ATT_DPL; c++) {
			int d = lane + 32 * c;
			if (d < hs) {
				dk_h[(size_t)j * C3 + d] += scale * dk[kk][c];
				dv_h[(size_t)j * C3 + d] += dv[kk][c];
			}
		}
	}
}

// dQ of one query tile, summed over its keys j <= i. Block: a query tile.
__global__ void __launch_bounds__(ATT_THREADS)
	att_bwd_dq_kernel(float *dqkv, const float *dout, const float *qkv, const float *out,
			  const float *lse, int T, int C, int NH, int hs, float scale)
{
	extern __shared__ float smem[];
	float *Qs = smem;                    /* ATT_TILE x hs (broadcast reads) */
	float *Gs = Qs + ATT_TILE * hs;      /* dout, ATT_TILE x hs */
	float *Ks = Gs + ATT_TILE * hs;      /* ATT_TILE x (hs+1): lane = key */
	float *Vs = Ks + ATT_TILE * (hs + 1); /* ATT_TILE x (hs+1) */
	float *lse_s = Vs + ATT_TILE * (hs + 1);
	float *d_s = lse_s + ATT_TILE;
	const int bh = blockIdx.x, b = bh / NH, h = bh - b * NH;
	const int i0 = blockIdx.y * ATT_TILE;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const size_t C3 = 3 * (size_t)C;
	const size_t qoff = (size_t)b * T * C3 + (size_t)h * hs;
	const size_t ooff = (size_t)b * T * C + (size_t)h * hs;
	const float *q = qkv + qoff, *k = q + C, *v = q + 2 * C;
	const float *g = dout + ooff, *o = out + ooff;

	float dq[ATT_ROWS][ATT_DPL];
#pragma unroll
	for (int rr = 0; rr < ATT_ROWS; rr++)
#pragma unroll
		for (int c = 0; c < ATT_DPL; c++)
			dq[rr][c] = 0.0f;
	load_tile(Qs, hs, q, C3, i0, T, hs);
	load_tile(Gs, hs, g, C, i0, T, hs);
	load_lse_d(lse_s, d_s, lse + (size_t)bh * T, g, o, C, i0, T, hs);
	const int kend = min(T, i0 + ATT_TILE);
	for (int j0 = 0; j0 < kend; j0 += ATT_TILE) {
		__syncthreads();
		load_tile(Ks, hs + 1, k, C3, j0, T, hs);
		load_tile(Vs, hs + 1, v, C3, j0, T, hs);
		__syncthreads();
		const int j = j0 + lane; /* this lane's key */
#pragma unroll
		for (int rr = 0; rr < ATT_ROWS; rr++) {
			const int r = warp * ATT_ROWS + rr, i = i0 + r;
			if (i >= T) /* warp-uniform */
				continue;
			const int nvalid = min(ATT_TILE, i - j0 + 1); /* >= 1 */
			float ds = 0.0f;
			if (j <= i) {
				const float *qr = Qs + r * hs, *gr = Gs + r * hs;
				const float *kr = Ks + lane * (hs + 1), *vr = Vs + lane * (hs + 1);
				float s = 0.0f, dp = 0.0f;
				for (int d = 0; d < hs; d++) {
					s += qr[d] * kr[d];
					dp += gr[d] * vr[d];
				}
				const float p = expf(s * scale - lse_s[r]);
				ds = p * (dp - d_s[r]);
			}
			for (int jj = 0; jj < nvalid; jj++) {
				const float dsj = __shfl_sync(FULL_MASK, ds, jj);
				const float *kr = Ks + jj * (hs + 1);
#pragma unroll
				for (int c = 0; c < ATT_DPL; c++) {
					int d = lane + 32 * c;
					if (d < hs)
						dq[rr][c] += dsj * kr[d];
				}
			}
		}
	}
	float *dq_h = dqkv + qoff;
#pragma unroll
	for (int rr = 0; rr < ATT_ROWS; rr++) {
		const int i = i0 + warp * ATT_ROWS + rr;
		if (i >= T)
			continue;
#pragma unroll
		for (int c = 0; c < ATT_DPL; c++) {
			int d = lane + 32 * c;
			if (d < hs)
				dq_h[(size_t)i * C3 + d] += scale * dq[rr][c];
		}
	}
}

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
			return att_cuda_err(e, what);
	}
	kern<<<grid, ATT_THREADS, smem_bytes, stream>>>(args...);
	e = cudaGetLastError();
	if (e != cudaSuccess)
		return att_cuda_err(e, what);
	return 0;
}

extern "C" int st_cuda_attention_fwd(struct st_cuda_ctx *ctx, float *out, float *lse,
				     const float *qkv, int B, int T, int C, int NH)
{
	int err = att_check("attention_fwd", B, T, C, NH);

	if (err)
		return err;
	if (B == 0 || T == 0)
		return 0;
	const int hs = C / NH;
	const float scale = 1.0f / sqrtf((float)hs);
	const dim3 grid((unsigned)(B * NH), (unsigned)((T + ATT_TILE - 1) / ATT_TILE));
	const size_t smem_bytes = sizeof(float) * (size_t)ATT_TILE * (3 * hs + 1);
	return att_launch("attention_fwd kernel", att_fwd_kernel, grid, smem_bytes,
			  st_cuda_ctx_stream(ctx), out, lse, qkv, T, C, NH, hs, scale);
}

extern "C" int st_cuda_attention_bwd(struct st_cuda_ctx *ctx, float *dqkv,
				     const float *dout, const float *qkv, const float *out,
				     const float *lse, int B, int T, int C, int NH)
{
	int err = att_check("attention_bwd", B, T, C, NH);

	if (err)
		return err;
	if (B == 0 || T == 0)
		return 0;
	const int hs = C / NH;
	const float scale = 1.0f / sqrtf((float)hs);
	const dim3 grid((unsigned)(B * NH), (unsigned)((T + ATT_TILE - 1) / ATT_TILE));
	/* both kernels: two tiles of hs, two of hs+1, lse and D */
	const size_t smem_bytes = sizeof(float) * (size_t)ATT_TILE * (4 * hs + 4);
	cudaStream_t stream = st_cuda_ctx_stream(ctx);
	err = att_launch("attention_bwd dK/dV kernel", att_bwd_dkv_kernel, grid, smem_bytes,
			 stream, dqkv, dout, qkv, out, lse, T, C, NH, hs, scale);
	if (err)
		return err;
	return att_launch("attention_bwd dQ kernel", att_bwd_dq_kernel, grid, smem_bytes,
			  stream, dqkv, dout, qkv, out, lse, T, C, NH, hs, scale);
}
