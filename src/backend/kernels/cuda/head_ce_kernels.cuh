/* Device code of the bf16 head fused with the cross-entropy (head_ce_bf16.cu
 * holds the launches; docs/gpu.md the design), on mma_bf16.cuh's m16n8k16
 * MMA; compiled by nvcc and, unchanged, by tests/cuda/test_head_ce_emu.cpp
 * under the cpu emulation.
 *
 * x (N, C) bf16 is the head's normalised input, W (V, C) bf16 the tied
 * embedding; logits = x W^T (fp32 accumulation) exist only as MMA
 * accumulators, one 64 x 64 tile at a time:
 * - hc_fwd_kernel (block: 64 rows, one of S vocabulary splits): walks its
 *   split's vocab tiles, an online max and sum of exp per row (fp32), and
 *   the target's logit; writes (m, l, logit[target]) per (split, row).
 * - hc_lse_kernel (a thread a row): folds the S partials in split order:
 *   lse = m + log l, loss = lse - logit[target].
 * - hc_dx_kernel (block: 64 rows, 128 columns of C): per vocab tile the
 *   logits again, dS = dloss (softmax - onehot) rounded to bf16 (the
 *   unfused path rounds its dlogits so), packed straight into the A
 *   fragment of dS W; dx += at the end.
 * - hc_dw_kernel (block: 64 vocab rows, 128 columns of C): over every row
 *   tile in order, S^T = W x^T, dS^T likewise, dW += dS^T x; dW += at the
 *   end.
 * Each output element is written by one block that sums it in a fixed
 * order: no atomics, a rerun gives the same bits. The price is that both
 * backward kernels recompute the logits once per 128 columns of C (C/128
 * times the forward's product each; docs/gpu.md says what that costs).
 *
 * A block is HC_WARPS (4) warps; a warp owns 16 rows of the block's 64-row
 * side and holds its 16 x 64 strip of the tile as 8 accumulators; row r of
 * a strip lives in the four lanes of group r % 8. Any N, C, V: rows,
 * columns and vocab entries past the end load as zero and are masked; an
 * odd C is read a bf16 at a time (even C: two at a time, 4-byte aligned). */
#ifndef ST_CUDA_HEAD_CE_KERNELS_CUH
#define ST_CUDA_HEAD_CE_KERNELS_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "mma_bf16.cuh"

#define HC_WARPS 4
#define HC_THREADS (HC_WARPS * 32)
#define HC_TILE 64 /* rows (or vocab entries) a block's tile has: 16 a warp */
#define HC_KC 64   /* columns of C per shared-memory chunk of the logits */
#define HC_DC 128  /* columns of C a backward block owns */
#define HC_PAD 8   /* bf16 of padding per shared row (bank spread) */
#define HC_LD (HC_KC + HC_PAD)
#define HC_LDT (HC_TILE + HC_PAD)
#define HC_MAX_SPLITS 16

struct hc_params {
	const st_bf16 *x, *w; /* (N, C), (V, C) */
	const int32_t *targets;
	float *losses;        /* (N) */
	float *lse;           /* (N): hc_lse_kernel writes, the backward reads */
	float *part;          /* (S, N, 3): m, l, logit[target] */
	float *dx, *dw;       /* (N, C), (V, C) fp32, added into */
	float dloss;
	int N, C, V, S;
};

/* Shared memory of each kernel, bytes: the two logit chunks; the backward
 * also a transposed (128 columns x 64) tile and, for dW, lse and targets. */
static inline size_t hc_fwd_smem_bytes(void)
{
	return sizeof(st_bf16) * 2 * HC_TILE * HC_LD;
}

static inline size_t hc_bwd_smem_bytes(void)
{
	return sizeof(st_bf16) * ((size_t)2 * HC_TILE * HC_LD + (size_t)HC_DC * HC_LDT) +
	       sizeof(float) * 2 * HC_TILE;
}

/* The pair of bf16 (row, c), (row, c + 1) of a (rows, C) matrix, zero past
 * either end, as one register (c even). */
__device__ __forceinline__ uint32_t hc_pair(const st_bf16 *m, int rows, int C, int row, int c)
{
	if (row >= rows || c >= C)
		return 0u;
	const st_bf16 *p = m + (size_t)row * C + c;
	if ((C & 1) == 0)
		return mma_ld_u32(p);
	return (uint32_t)p[0] | (c + 1 < C ? (uint32_t)p[1] << 16 : 0u);
}

/* dst (HC_TILE x HC_KC, stride HC_LD) = rows [r0, r0+64), columns
 * [c0, c0+64) of m. */
__device__ __forceinline__ void hc_load_chunk(st_bf16 *dst, const st_bf16 *m, int rows, int C,
					      int r0, int c0)
{
	for (int e = threadIdx.x; e < HC_TILE * (HC_KC / 2); e += HC_THREADS) {
		const int r = e / (HC_KC / 2), c = 2 * (e - r * (HC_KC / 2));
		mma_st_u32(dst + r * HC_LD + c, hc_pair(m, rows, C, r0 + r, c0 + c));
	}
}

/* dst[c * HC_LDT + r] = m[r0 + r][c0 + c] for 64 rows and HC_DC columns:
 * the B operand whose k runs along m's rows. */
__device__ __forceinline__ void hc_load_t(st_bf16 *dst, const st_bf16 *m, int rows, int C,
					  int r0, int c0)
{
	for (int e = threadIdx.x; e < HC_TILE * (HC_DC / 2); e += HC_THREADS) {
		const int c = 2 * (e / HC_TILE), r = e - (c / 2) * HC_TILE;
		const uint32_t u = hc_pair(m, rows, C, r0 + r, c0 + c);
		dst[c * HC_LDT + r] = (st_bf16)(u & 0xffffu);
		dst[(c + 1) * HC_LDT + r] = (st_bf16)(u >> 16);
	}
}

/* acc (this warp's 16 x 64 strip) = A[a0 .. a0+64) B[b0 .. b0+64)^T over
 * all C: A rows are the strip's rows (x for logits, W for their transpose).
 * Starts and ends with a barrier, so the chunks' memory is free after. */
__device__ __forceinline__ void hc_product(float acc[8][4], st_bf16 *As, st_bf16 *Bs,
					   const st_bf16 *A, int arows, int a0, const st_bf16 *B,
					   int brows, int b0, int C)
{
	const int warp = threadIdx.x >> 5;

#pragma unroll
	for (int nt = 0; nt < 8; nt++)
		acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
	for (int c0 = 0; c0 < C; c0 += HC_KC) {
		__syncthreads(); /* the previous chunk (or the caller's tiles) consumed */
		hc_load_chunk(As, A, arows, C, a0, c0);
		hc_load_chunk(Bs, B, brows, C, b0, c0);
		__syncthreads();
#pragma unroll
		for (int kk = 0; kk < HC_KC / 16; kk++) {
			uint32_t a[4];
			mma_load_a(a, As + warp * 16 * HC_LD + kk * 16, HC_LD);
#pragma unroll
			for (int nt = 0; nt < 8; nt++) {
				uint32_t b[2];
				mma_load_b(b, Bs + nt * 8 * HC_LD + kk * 16, HC_LD);
				mma_bf16_16816(acc[nt], a, b);
			}
		}
	}
	__syncthreads();
}

/* ---- forward ------------------------------------------------------------------ */

/* grid (ceil(N/64), S) */
__global__ void __launch_bounds__(HC_THREADS) hc_fwd_kernel(hc_params p)
{
	extern __shared__ float smem[];
	st_bf16 *Xs = (st_bf16 *)smem, *Ws = Xs + HC_TILE * HC_LD;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
	const int r0 = blockIdx.x * HC_TILE, rw = r0 + warp * 16;
	const int rows[2] = { rw + g, rw + g + 8 };
	const int tgt[2] = { rows[0] < p.N ? p.targets[rows[0]] : -1,
			     rows[1] < p.N ? p.targets[rows[1]] : -1 };
	const int ntiles = (p.V + HC_TILE - 1) / HC_TILE, per = (ntiles + p.S - 1) / p.S;
	const int t0 = blockIdx.y * per, t1 = min(ntiles, t0 + per);
	float m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f }, tl[2] = { 0.0f, 0.0f };

	for (int vt = t0; vt < t1; vt++) {
		const int v0 = vt * HC_TILE;
		float acc[8][4];
		hc_product(acc, Xs, Ws, p.x, p.N, r0, p.w, p.V, v0, p.C);
		float mx[2] = { m[0], m[1] };
#pragma unroll
		for (int nt = 0; nt < 8; nt++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int col = v0 + nt * 8 + 2 * t + (e & 1), i = e >> 1;
				if (col < p.V) {
					mx[i] = fmaxf(mx[i], acc[nt][e]);
					if (col == tgt[i])
						tl[i] = acc[nt][e];
				}
			}
#pragma unroll
		for (int i = 0; i < 2; i++) {
			if (mx[i] == -INFINITY) /* no column of this lane yet */
				continue;
			float s = m[i] == -INFINITY ? 0.0f : l[i] * expf(m[i] - mx[i]);
#pragma unroll
			for (int nt = 0; nt < 8; nt++)
#pragma unroll
				for (int e = 2 * i; e < 2 * i + 2; e++)
					if (v0 + nt * 8 + 2 * t + (e & 1) < p.V)
						s += expf(acc[nt][e] - mx[i]);
			m[i] = mx[i];
			l[i] = s;
		}
	}
	/* the four lanes of a row: their max, their rescaled sums, in one order */
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const float M = mma_group_max(m[i]);
		const float L = mma_group_sum(m[i] == -INFINITY ? 0.0f : l[i] * expf(m[i] - M));
		const float T = mma_group_sum(tl[i]); /* one lane holds it, the others 0 */
		if (t == 0 && rows[i] < p.N) {
			float *q = p.part + ((size_t)blockIdx.y * p.N + rows[i]) * 3;
			q[0] = M;
			q[1] = L;
			q[2] = T;
		}
	}
}

/* grid ceil(N/128) blocks of 128: the splits' partials in split order. */
__global__ void hc_lse_kernel(hc_params p)
{
	const int row = blockIdx.x * blockDim.x + threadIdx.x;

	if (row >= p.N)
		return;
	float M = -INFINITY, L = 0.0f, T = 0.0f;
	for (int s = 0; s < p.S; s++)
		M = fmaxf(M, p.part[((size_t)s * p.N + row) * 3]);
	for (int s = 0; s < p.S; s++) {
		const float *q = p.part + ((size_t)s * p.N + row) * 3;
		if (q[0] != -INFINITY)
			L += q[1] * expf(q[0] - M);
		T += q[2];
	}
	const float lse = M + logf(L);
	p.lse[row] = lse;
	p.losses[row] = p.targets[row] < 0 ? 0.0f : lse - T; /* -1: ignored */
}

/* ---- backward ----------------------------------------------------------------- */

/* dS of one strip element: dloss (exp(s - lse) - [col == target]), 0 where
 * col or row is past its end or the target is ignored (-1, masked out). */
__device__ __forceinline__ float hc_dlogit(float s, float lse, int col, int tgt, bool live,
					   float dloss)
{
	if (!live || tgt < 0)
		return 0.0f;
	const float pr = expf(s - lse);
	return (col == tgt ? pr - 1.0f : pr) * dloss;
}

/* out[r][c] += acc over the warp's strip of 16 rows x HC_DC columns. */
__device__ __forceinline__ void hc_store_add(float *out, int rows, int C, int r_first, int c0,
					     const float acc[HC_DC / 8][4])
{
	const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;

#pragma unroll
	for (int nt = 0; nt < HC_DC / 8; nt++)
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const int r = r_first + g + (e >> 1) * 8, c = c0 + nt * 8 + 2 * t + (e & 1);
			if (r < rows && c < C)
				out[(size_t)r * C + c] += acc[nt][e];
		}
}

/* grid (ceil(N/64), ceil(C/128)) */
/* out += dS Bt over a warp's strip: its 16 x 64 dlogits in acc, rounded to
 * bf16 as the A fragments, times the 64 x HC_DC tile in shared memory at Bt
 * (element (k, n) at Bt[n * HC_LDT + k]). The two backward kernels' last
 * step: dx += dS W, dW += dS^T x. */
__device__ __forceinline__ void hc_dlogits_times(float out[HC_DC / 8][4], float acc[8][4],
						 const st_bf16 *Bt)
{
	uint32_t a[4][4];
#pragma unroll
	for (int kk = 0; kk < 4; kk++)
		mma_a_from_c(a[kk], acc[2 * kk], acc[2 * kk + 1]);
#pragma unroll
	for (int nt = 0; nt < HC_DC / 8; nt++)
#pragma unroll
		for (int kk = 0; kk < 4; kk++) {
			uint32_t b[2];
			mma_load_b(b, Bt + nt * 8 * HC_LDT + kk * 16, HC_LDT);
			mma_bf16_16816(out[nt], a[kk], b);
		}
}

__global__ void __launch_bounds__(HC_THREADS) hc_dx_kernel(hc_params p)
{
	extern __shared__ float smem[];
	st_bf16 *Xs = (st_bf16 *)smem, *Ws = Xs + HC_TILE * HC_LD, *Wt = Ws + HC_TILE * HC_LD;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
	const int r0 = blockIdx.x * HC_TILE, c0 = blockIdx.y * HC_DC, rw = r0 + warp * 16;
	const int rows[2] = { rw + g, rw + g + 8 };
	int tgt[2];
	float lse[2];
	for (int i = 0; i < 2; i++) {
		tgt[i] = rows[i] < p.N ? p.targets[rows[i]] : -1;
		lse[i] = rows[i] < p.N ? p.lse[rows[i]] : 0.0f;
	}
	float dx[HC_DC / 8][4];
#pragma unroll
	for (int nt = 0; nt < HC_DC / 8; nt++)
		dx[nt][0] = dx[nt][1] = dx[nt][2] = dx[nt][3] = 0.0f;

	for (int v0 = 0; v0 < p.V; v0 += HC_TILE) {
		float acc[8][4];
		hc_product(acc, Xs, Ws, p.x, p.N, r0, p.w, p.V, v0, p.C);
		hc_load_t(Wt, p.w, p.V, p.C, v0, c0); /* W^T: k = vocab, n = column */
#pragma unroll
		for (int nt = 0; nt < 8; nt++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int col = v0 + nt * 8 + 2 * t + (e & 1), i = e >> 1;
				acc[nt][e] = hc_dlogit(acc[nt][e], lse[i], col, tgt[i],
						       col < p.V && rows[i] < p.N, p.dloss);
			}
		__syncthreads(); /* Wt in place */
		hc_dlogits_times(dx, acc, Wt);
	}
	hc_store_add(p.dx, p.N, p.C, rw, c0, dx);
}

/* grid (ceil(V/64), ceil(C/128)): the row tiles in order */
__global__ void __launch_bounds__(HC_THREADS) hc_dw_kernel(hc_params p)
{
	extern __shared__ float smem[];
	st_bf16 *Ws = (st_bf16 *)smem, *Xs = Ws + HC_TILE * HC_LD, *Xt = Xs + HC_TILE * HC_LD;
	float *lse_s = (float *)(Xt + HC_DC * HC_LDT);
	int32_t *tgt_s = (int32_t *)(lse_s + HC_TILE);
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
	const int v0 = blockIdx.x * HC_TILE, c0 = blockIdx.y * HC_DC, vw = v0 + warp * 16;
	const int vocab[2] = { vw + g, vw + g + 8 };
	float dw[HC_DC / 8][4];
#pragma unroll
	for (int nt = 0; nt < HC_DC / 8; nt++)
		dw[nt][0] = dw[nt][1] = dw[nt][2] = dw[nt][3] = 0.0f;

	for (int r0 = 0; r0 < p.N; r0 += HC_TILE) {
		float acc[8][4];
		hc_product(acc, Ws, Xs, p.w, p.V, v0, p.x, p.N, r0, p.C); /* S^T */
		hc_load_t(Xt, p.x, p.N, p.C, r0, c0); /* x: k = row, n = column */
		for (int r = threadIdx.x; r < HC_TILE; r += HC_THREADS) {
			lse_s[r] = r0 + r < p.N ? p.lse[r0 + r] : 0.0f;
			tgt_s[r] = r0 + r < p.N ? p.targets[r0 + r] : -1;
		}
		__syncthreads();
#pragma unroll
		for (int nt = 0; nt < 8; nt++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int rr = nt * 8 + 2 * t + (e & 1), v = vocab[e >> 1];
				acc[nt][e] = hc_dlogit(acc[nt][e], lse_s[rr], v, tgt_s[rr],
						       v < p.V && r0 + rr < p.N, p.dloss);
			}
		hc_dlogits_times(dw, acc, Xt);
	}
	hc_store_add(p.dw, p.V, p.C, vw, c0, dw);
}

#endif /* ST_CUDA_HEAD_CE_KERNELS_CUH */
