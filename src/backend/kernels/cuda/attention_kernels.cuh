/* Device code of the flash-style causal attention (attention.cu holds the
 * host launch code and the design comment). Kept apart so that
 * tests/cuda/test_attention_emu.cpp can compile these exact kernels with a
 * host C++ compiler, one std::thread per CUDA thread, and hold them to
 * st_cpu_attention_fwd/bwd on machines without a GPU. So: only what nvcc and
 * that emulation both accept -- the CUDA builtins used here are __syncthreads,
 * __shfl_sync, __shfl_xor_sync, min, threadIdx/blockIdx/blockDim and one
 * extern __shared__ array per kernel; a new one needs a shim in the test. */
#ifndef ST_CUDA_ATTENTION_KERNELS_CUH
#define ST_CUDA_ATTENTION_KERNELS_CUH

#include <math.h>
#include <stddef.h>

#define ATT_TILE 32
#define ATT_WARPS 8
#define ATT_THREADS (ATT_WARPS * 32)
#define ATT_ROWS (ATT_TILE / ATT_WARPS) /* rows of the tile per warp */
#define ATT_HS_MAX 128
#define ATT_DPL (ATT_HS_MAX / 32)       /* channels per lane */
#define FULL_MASK 0xffffffffu

/* Launch geometry, shared with the emulation test so it cannot drift:
 * blockIdx.x is b*NH + h, blockIdx.y the tile of ATT_TILE rows. */
static inline dim3 att_grid(int B, int NH, int T)
{
	return dim3((unsigned)(B * NH), (unsigned)((T + ATT_TILE - 1) / ATT_TILE));
}

/* Dynamic shared memory of att_fwd_kernel: Q and V tiles of hs, K of hs+1. */
static inline size_t att_fwd_smem_bytes(int hs)
{
	return sizeof(float) * (size_t)ATT_TILE * (3 * hs + 1);
}

/* Both backward kernels: two tiles of hs, two of hs+1, lse and D. */
static inline size_t att_bwd_smem_bytes(int hs)
{
	return sizeof(float) * (size_t)ATT_TILE * (4 * hs + 4);
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

/* Packed documents (seg, (B,T) int32, or NULL: causal): the smallest
 * segment start of rows [r0, r0 + ATT_TILE) of batch row b's seg_b, T if
 * none; every thread computes the same, so a block-wide skip on it keeps
 * the barriers matched. */
__device__ __forceinline__ int tile_seg_min(const int *seg_b, int r0, int T)
{
	int m = T;

	for (int r = 0; r < ATT_TILE && r0 + r < T; r++)
		m = min(m, seg_b[r0 + r]);
	return m;
}

/* ---- the kernels' bodies ------------------------------------------------------
 * One body per kernel serves both layouts: q rows of stride sq, k and v
 * rows of stride sk, out and dout rows of stride so, query head h reading
 * key/value head h / (NH/NKV). GPT-2's packed qkv (B,T,3C) is q = qkv,
 * k = qkv + C, v = qkv + 2C with sq = sk = 3C, so = C and NKV = NH;
 * LLaMA's grouped-query attention (below) has q (B,T,NH*hs), k and v
 * (B,T,NKV*hs) apart and out (B,T,NH*hs). The forward and dQ run a block
 * per (b, query head, tile); dK/dV a block per (b, kv head, key tile) that
 * sums over the group's query heads in order, so the heads sharing a kv
 * head add up in a fixed order without atomics (one head for GPT-2). */
__device__ __forceinline__ void att_fwd_body(float *out, float *lse, const float *q_all,
					     const float *k_all, const float *v_all, int T,
					     int NH, int NKV, int hs, float scale, size_t sq,
					     size_t sk, size_t so, const int *seg)
{
	extern __shared__ float smem[];
	float *Qs = smem;
	float *Ks = Qs + ATT_TILE * hs;
	float *Vs = Ks + ATT_TILE * (hs + 1);
	const int bh = blockIdx.x, b = bh / NH, h = bh - b * NH, kh = h / (NH / NKV);
	const int i0 = blockIdx.y * ATT_TILE;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const float *q = q_all + (size_t)b * T * sq + (size_t)h * hs;
	const float *k = k_all + (size_t)b * T * sk + (size_t)kh * hs;
	const float *v = v_all + (size_t)b * T * sk + (size_t)kh * hs;

	float m[ATT_ROWS], l[ATT_ROWS], o[ATT_ROWS][ATT_DPL];
#pragma unroll
	for (int rr = 0; rr < ATT_ROWS; rr++) {
		m[rr] = -INFINITY;
		l[rr] = 0.0f;
#pragma unroll
		for (int c = 0; c < ATT_DPL; c++)
			o[rr][c] = 0.0f;
	}
	const int *seg_b = seg ? seg + (size_t)b * T : NULL;
	load_tile(Qs, hs, q, sq, i0, T, hs);
	const int kend = min(T, i0 + ATT_TILE);
	// key tiles from the one holding the rows' first segment start
	const int jfirst = seg_b ? tile_seg_min(seg_b, i0, T) / ATT_TILE * ATT_TILE : 0;
	for (int j0 = jfirst; j0 < kend; j0 += ATT_TILE) {
		__syncthreads();
		load_tile(Ks, hs + 1, k, sk, j0, T, hs);
		load_tile(Vs, hs, v, sk, j0, T, hs);
		__syncthreads();
#pragma unroll
		for (int rr = 0; rr < ATT_ROWS; rr++) {
			const int r = warp * ATT_ROWS + rr, i = i0 + r;
			if (i >= T)
				continue;
			const int nvalid = min(ATT_TILE, i - j0 + 1);
			// keys [lo, nvalid) of the tile: from the row's segment start
			const int lo = seg_b ? max(seg_b[i] - j0, 0) : 0;
			if (lo >= nvalid) /* none here: max, sum and o stay as they are */
				continue;
			const bool valid = lane < nvalid && lane >= lo;
			float s = -INFINITY;
			if (valid) {
				const float *qr = Qs + r * hs, *kr = Ks + lane * (hs + 1);
				float dot = 0.0f;
				for (int d = 0; d < hs; d++)
					dot += qr[d] * kr[d];
				s = dot * scale;
			}
			const float mnew = fmaxf(m[rr], warp_max(s));
			const float p = valid ? expf(s - mnew) : 0.0f;
			const float alpha = expf(m[rr] - mnew);
			l[rr] = l[rr] * alpha + warp_sum(p);
			m[rr] = mnew;
#pragma unroll
			for (int c = 0; c < ATT_DPL; c++)
				o[rr][c] *= alpha;
			for (int j = lo; j < nvalid; j++) {
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
		float *orow = out + ((size_t)b * T + i) * so + (size_t)h * hs;
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

__device__ __forceinline__ void att_bwd_dkv_body(float *dk_all, float *dv_all,
						 const float *dout, const float *q_all,
						 const float *k_all, const float *v_all,
						 const float *out, const float *lse, int T, int NH,
						 int NKV, int hs, float scale, size_t sq, size_t sk,
						 size_t so, const int *seg)
{
	extern __shared__ float smem[];
	float *Ks = smem;
	float *Vs = Ks + ATT_TILE * hs;
	float *Qs = Vs + ATT_TILE * hs;
	float *Gs = Qs + ATT_TILE * (hs + 1);
	float *lse_s = Gs + ATT_TILE * (hs + 1);
	float *d_s = lse_s + ATT_TILE;
	const int bk = blockIdx.x, b = bk / NKV, kh = bk - b * NKV, rep = NH / NKV;
	const int j0 = blockIdx.y * ATT_TILE;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const size_t koff = (size_t)b * T * sk + (size_t)kh * hs;
	const float *k = k_all + koff, *v = v_all + koff;
	const int *seg_b = seg ? seg + (size_t)b * T : NULL;

	float dk[ATT_ROWS][ATT_DPL], dv[ATT_ROWS][ATT_DPL];
#pragma unroll
	for (int kk = 0; kk < ATT_ROWS; kk++)
#pragma unroll
		for (int c = 0; c < ATT_DPL; c++)
			dk[kk][c] = dv[kk][c] = 0.0f;
	load_tile(Ks, hs, k, sk, j0, T, hs);
	load_tile(Vs, hs, v, sk, j0, T, hs);
	for (int gi = 0; gi < rep; gi++) {
		const int h = kh * rep + gi;
		const size_t qoff = (size_t)b * T * sq + (size_t)h * hs;
		const size_t ooff = (size_t)b * T * so + (size_t)h * hs;
		const float *q = q_all + qoff, *g = dout + ooff, *o = out + ooff;
		const float *lse_h = lse + ((size_t)b * NH + h) * T;
		for (int i0 = j0; i0 < T; i0 += ATT_TILE) {
			// no query of the tile sees a key of this one
			if (seg_b && tile_seg_min(seg_b, i0, T) >= j0 + ATT_TILE)
				continue;
			__syncthreads();
			load_tile(Qs, hs + 1, q, sq, i0, T, hs);
			load_tile(Gs, hs + 1, g, so, i0, T, hs);
			load_lse_d(lse_s, d_s, lse_h, g, o, (int)so, i0, T, hs);
			__syncthreads();
			const int nq = min(ATT_TILE, T - i0);
			const int i = i0 + lane;
#pragma unroll
			for (int kk = 0; kk < ATT_ROWS; kk++) {
				const int jr = warp * ATT_ROWS + kk, j = j0 + jr;
				if (j >= T)
					continue;
				float p = 0.0f, ds = 0.0f;
				if (i < T && i >= j && (!seg_b || j >= seg_b[i])) {
					const float *qr = Qs + lane * (hs + 1);
					const float *gr = Gs + lane * (hs + 1);
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
	}
	float *dk_h = dk_all + koff, *dv_h = dv_all + koff;
#pragma unroll
	for (int kk = 0; kk < ATT_ROWS; kk++) {
		const int j = j0 + warp * ATT_ROWS + kk;
		if (j >= T)
			continue;
#pragma unroll
		for (int c = 0; c < ATT_DPL; c++) {
			int d = lane + 32 * c;
			if (d < hs) {
				dk_h[(size_t)j * sk + d] += scale * dk[kk][c];
				dv_h[(size_t)j * sk + d] += dv[kk][c];
			}
		}
	}
}

__device__ __forceinline__ void att_bwd_dq_body(float *dq_all, const float *dout,
						const float *q_all, const float *k_all,
						const float *v_all, const float *out,
						const float *lse, int T, int NH, int NKV, int hs,
						float scale, size_t sq, size_t sk, size_t so,
						const int *seg)
{
	extern __shared__ float smem[];
	float *Qs = smem;
	float *Gs = Qs + ATT_TILE * hs;
	float *Ks = Gs + ATT_TILE * hs;
	float *Vs = Ks + ATT_TILE * (hs + 1);
	float *lse_s = Vs + ATT_TILE * (hs + 1);
	float *d_s = lse_s + ATT_TILE;
	const int bh = blockIdx.x, b = bh / NH, h = bh - b * NH, kh = h / (NH / NKV);
	const int i0 = blockIdx.y * ATT_TILE;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const size_t qoff = (size_t)b * T * sq + (size_t)h * hs;
	const size_t koff = (size_t)b * T * sk + (size_t)kh * hs;
	const size_t ooff = (size_t)b * T * so + (size_t)h * hs;
	const float *q = q_all + qoff, *k = k_all + koff, *v = v_all + koff;
	const float *g = dout + ooff, *o = out + ooff;

	float dq[ATT_ROWS][ATT_DPL];
#pragma unroll
	for (int rr = 0; rr < ATT_ROWS; rr++)
#pragma unroll
		for (int c = 0; c < ATT_DPL; c++)
			dq[rr][c] = 0.0f;
	load_tile(Qs, hs, q, sq, i0, T, hs);
	load_tile(Gs, hs, g, so, i0, T, hs);
	load_lse_d(lse_s, d_s, lse + (size_t)bh * T, g, o, (int)so, i0, T, hs);
	const int kend = min(T, i0 + ATT_TILE);
	const int *seg_b = seg ? seg + (size_t)b * T : NULL;
	const int jfirst = seg_b ? tile_seg_min(seg_b, i0, T) / ATT_TILE * ATT_TILE : 0;
	for (int j0 = jfirst; j0 < kend; j0 += ATT_TILE) {
		__syncthreads();
		load_tile(Ks, hs + 1, k, sk, j0, T, hs);
		load_tile(Vs, hs + 1, v, sk, j0, T, hs);
		__syncthreads();
		const int j = j0 + lane;
#pragma unroll
		for (int rr = 0; rr < ATT_ROWS; rr++) {
			const int r = warp * ATT_ROWS + rr, i = i0 + r;
			if (i >= T)
				continue;
			const int nvalid = min(ATT_TILE, i - j0 + 1);
			float ds = 0.0f;
			if (j <= i && (!seg_b || j >= seg_b[i])) {
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
	float *dq_h = dq_all + qoff;
#pragma unroll
	for (int rr = 0; rr < ATT_ROWS; rr++) {
		const int i = i0 + warp * ATT_ROWS + rr;
		if (i >= T)
			continue;
#pragma unroll
		for (int c = 0; c < ATT_DPL; c++) {
			int d = lane + 32 * c;
			if (d < hs)
				dq_h[(size_t)i * sq + d] += scale * dq[rr][c];
		}
	}
}


/* ---- GPT-2: packed qkv -------------------------------------------------------- */

// out is (B,T,C), lse is (B,NH,T), qkv is (B,T,3C). Block: one query tile.
__global__ void __launch_bounds__(ATT_THREADS)
	att_fwd_kernel(float *out, float *lse, const float *qkv, int T, int C, int NH,
		       int hs, float scale, const int *seg)
{
	const size_t C3 = 3 * (size_t)C;
	att_fwd_body(out, lse, qkv, qkv + C, qkv + 2 * C, T, NH, NH, hs, scale, C3, C3, C, seg);
}

// dK, dV of one key tile, summed over every query i >= j. Block: a key tile.
__global__ void __launch_bounds__(ATT_THREADS)
	att_bwd_dkv_kernel(float *dqkv, const float *dout, const float *qkv, const float *out,
			   const float *lse, int T, int C, int NH, int hs, float scale,
			   const int *seg)
{
	const size_t C3 = 3 * (size_t)C;
	att_bwd_dkv_body(dqkv + C, dqkv + 2 * C, dout, qkv, qkv + C, qkv + 2 * C, out, lse, T,
			 NH, NH, hs, scale, C3, C3, C, seg);
}

// dQ of one query tile, summed over its keys j <= i. Block: a query tile.
__global__ void __launch_bounds__(ATT_THREADS)
	att_bwd_dq_kernel(float *dqkv, const float *dout, const float *qkv, const float *out,
			  const float *lse, int T, int C, int NH, int hs, float scale,
			  const int *seg)
{
	const size_t C3 = 3 * (size_t)C;
	att_bwd_dq_body(dqkv, dout, qkv, qkv + C, qkv + 2 * C, out, lse, T, NH, NH, hs, scale,
			C3, C3, C, seg);
}

/* ---- grouped-query attention (LLaMA) -------------------------------------------
 * q (B,T,NH*hs), k and v (B,T,NKV*hs) apart, out (B,T,NH*hs). */
static inline dim3 gqa_kv_grid(int B, int NKV, int T)
{
	return dim3((unsigned)(B * NKV), (unsigned)((T + ATT_TILE - 1) / ATT_TILE));
}

__global__ void __launch_bounds__(ATT_THREADS)
	gqa_fwd_kernel(float *out, float *lse, const float *q_all, const float *k_all,
		       const float *v_all, int T, int NH, int NKV, int hs, float scale,
		       const int *seg)
{
	const size_t sq = (size_t)NH * hs, sk = (size_t)NKV * hs;
	att_fwd_body(out, lse, q_all, k_all, v_all, T, NH, NKV, hs, scale, sq, sk, sq, seg);
}

__global__ void __launch_bounds__(ATT_THREADS)
	gqa_bwd_dkv_kernel(float *dk_all, float *dv_all, const float *dout, const float *q_all,
			   const float *k_all, const float *v_all, const float *out,
			   const float *lse, int T, int NH, int NKV, int hs, float scale,
			   const int *seg)
{
	const size_t sq = (size_t)NH * hs, sk = (size_t)NKV * hs;
	att_bwd_dkv_body(dk_all, dv_all, dout, q_all, k_all, v_all, out, lse, T, NH, NKV, hs,
			 scale, sq, sk, sq, seg);
}

__global__ void __launch_bounds__(ATT_THREADS)
	gqa_bwd_dq_kernel(float *dq_all, const float *dout, const float *q_all, const float *k_all,
			  const float *v_all, const float *out, const float *lse, int T, int NH,
			  int NKV, int hs, float scale, const int *seg)
{
	const size_t sq = (size_t)NH * hs, sk = (size_t)NKV * hs;
	att_bwd_dq_body(dq_all, dout, q_all, k_all, v_all, out, lse, T, NH, NKV, hs, scale, sq,
			sk, sq, seg);
}

#endif /* ST_CUDA_ATTENTION_KERNELS_CUH */
