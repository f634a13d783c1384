/* Device code of the bf16 flash-style causal attention on tensor cores
 * (attention_bf16.cu holds the launches; docs/gpu.md the design). Built on
 * mma_bf16.cuh's m16n8k16 MMA; compiled by nvcc and, unchanged, by
 * tests/cuda/test_attention_bf16_emu.cpp under the cpu emulation.
 *
 * One kernel set serves GPT-2's MHA (q, k, v interleaved in qkv) and
 * LLaMA's GQA (q, k, v apart, NKV kv heads): ab_params carries the base
 * pointers and row strides, query head h reads kv head h / (NH / NKV).
 * Head size HS is 64 or 128 (a template parameter: the fragments are
 * registers). Inputs and output bf16, lse fp32, every sum fp32.
 *
 * A block is AB_WARPS (4) warps; a warp owns 16 rows (queries, or keys in
 * dK/dV) of its block's 64-row tile, and holds that 16-row strip of every
 * product as MMA accumulators. Row r of a strip lives in the four lanes of
 * group r % 8, so a row's max and sum are two xor shuffles (1, 2).
 *
 * Forward (block: b, query head, 64 queries): Q tile in shared memory and
 * as A fragments in registers; key tiles of 64 streamed: S = Q K^T (K tile
 * row-major is B^T), mask, online softmax in fp32, P packed to bf16 as the
 * A fragment of P V (V tile stored transposed, so its B fragments are
 * 32-bit loads). lse = m + log(l) saved per query.
 *
 * Backward, deterministic (no atomics), FlashAttention-2's two passes:
 * - dK/dV (block: b, kv head, 64 keys): over the group's query heads in
 *   order, then the query tiles of 32 that see the keys: S^T = K Q^T,
 *   dP^T = V dO^T, P^T = exp(S^T scale - lse), dS^T = P^T (dP^T - D);
 *   dV += P^T dO, dK += dS^T Q (Q and dO also stored transposed).
 * - dQ (block: b, query head, 64 queries): key tiles of 32: S = Q K^T,
 *   dP = dO V^T, dS as above; dQ += dS K (K transposed).
 * D_i = dO_i . O_i (fp32, from the bf16 O) is recomputed per visited tile.
 * Each block writes only its own rows, adding to what is there (backward
 * accumulates): into fp32 gradients, or bf16 ones read, added in fp32 and
 * rounded. */
#ifndef ST_CUDA_ATTENTION_BF16_KERNELS_CUH
#define ST_CUDA_ATTENTION_BF16_KERNELS_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "mma_bf16.cuh"

#define AB_WARPS 4
#define AB_THREADS (AB_WARPS * 32)
#define AB_TILE 64 /* rows a block owns: 16 a warp */
#define AB_KF 64   /* keys per streamed tile in the forward */
#define AB_SUB 32  /* the streamed side's tile in the backward */
#define AB_PAD 8   /* bf16 of padding per shared row (bank spread) */

/* Pointers and strides of one launch; strides in elements, a batch is T
 * rows of its tensor. Gradients: dq has q's layout, dk and dv k's. */
struct ab_params {
	const st_bf16 *q, *k, *v; /* rows of ldq / ldk elements */
	const st_bf16 *o, *dout;  /* backward: the forward's out, its gradient */
	st_bf16 *out;             /* forward */
	float *lse;               /* (B, NH, T) */
	void *dq, *dk, *dv;       /* backward: fp32 or bf16 per the kernel */
	long long ldq, ldk, ldo;
	int T, NH, NKV;
	float scale;
	/* packed documents (B,T) int32, or NULL (causal over the whole row):
	 * query t attends to keys [seg[t], t] only */
	const int *seg;
};

/* The smallest segment start of rows [r0, r0 + n) below T of seg_b (T if
 * none): the same in every thread, so a block-wide skip keeps the
 * barriers matched. */
__device__ __forceinline__ int ab_seg_min(const int *seg_b, int r0, int n, int T)
{
	int m = T;

	for (int r = 0; r < n && r0 + r < T; r++)
		m = min(m, seg_b[r0 + r]);
	return m;
}

static inline dim3 ab_grid(int B, int heads, int T)
{
	return dim3((unsigned)(B * heads), (unsigned)((T + AB_TILE - 1) / AB_TILE));
}

static inline size_t ab_fwd_smem_bytes(int hs)
{
	return sizeof(st_bf16) * ((size_t)2 * AB_TILE * (hs + AB_PAD) +
				  (size_t)hs * (AB_KF + AB_PAD));
}

/* dK/dV: K, V tiles (64 rows), Q, dO (32 rows) and their transposes; lse, D. */
static inline size_t ab_dkv_smem_bytes(int hs)
{
	return sizeof(st_bf16) * ((size_t)2 * AB_TILE * (hs + AB_PAD) +
				  (size_t)2 * AB_SUB * (hs + AB_PAD) +
				  (size_t)2 * hs * (AB_SUB + AB_PAD)) +
	       sizeof(float) * 2 * AB_SUB;
}

/* dQ: Q, dO tiles (64 rows), K, V (32 rows), K^T; lse, D. */
static inline size_t ab_dq_smem_bytes(int hs)
{
	return sizeof(st_bf16) * ((size_t)2 * AB_TILE * (hs + AB_PAD) +
				  (size_t)2 * AB_SUB * (hs + AB_PAD) +
				  (size_t)hs * (AB_SUB + AB_PAD)) +
	       sizeof(float) * 2 * AB_TILE;
}

/* Rows [r0, r0 + n) of a slice (row stride ld) into dst (row stride sld),
 * rows at or past T zero; two bf16 a thread a step. */
template <int HS>
__device__ __forceinline__ void ab_load_rows(st_bf16 *dst, int sld, const st_bf16 *src,
					     long long ld, int r0, int n, int T)
{
	for (int e = threadIdx.x; e < n * (HS / 2); e += blockDim.x) {
		const int r = e / (HS / 2), d = 2 * (e - r * (HS / 2)), row = r0 + r;
		const uint32_t u = row < T ? mma_ld_u32(src + (size_t)row * ld + d) : 0u;
		mma_st_u32(dst + r * sld + d, u);
	}
}

/* The same rows transposed: dst[d * sld + r] = row r0 + r, channel d. */
template <int HS>
__device__ __forceinline__ void ab_load_rows_t(st_bf16 *dst, int sld, const st_bf16 *src,
					       long long ld, int r0, int n, int T)
{
	for (int e = threadIdx.x; e < n * (HS / 2); e += blockDim.x) {
		const int d = 2 * (e / n), r = e - (d / 2) * n, row = r0 + r;
		const uint32_t u = row < T ? mma_ld_u32(src + (size_t)row * ld + d) : 0u;
		dst[d * sld + r] = (st_bf16)(u & 0xffffu);
		dst[(d + 1) * sld + r] = (st_bf16)(u >> 16);
	}
}

/* lse_s[r] = lse[r0 + r], d_s[r] = dO_row . O_row in fp32, for n rows
 * (0 past T): four consecutive lanes a row, each over every fourth pair of
 * channels, then two xor shuffles (a fixed order: the same bits each run). */
template <int HS>
__device__ __forceinline__ void ab_load_lse_d(float *lse_s, float *d_s, const float *lse_h,
					      const st_bf16 *g, const st_bf16 *o, long long ld,
					      int r0, int n, int T)
{
	const int part = threadIdx.x & 3;

	for (int rb = 0; rb < n; rb += AB_THREADS / 4) { /* the same count in every lane */
		const int r = rb + (threadIdx.x >> 2), row = r0 + r;
		float x = 0.0f;
		if (r < n && row < T) {
			for (int d = 2 * part; d < HS; d += 8) {
				const uint32_t gu = mma_ld_u32(g + (size_t)row * ld + d);
				const uint32_t ou = mma_ld_u32(o + (size_t)row * ld + d);
				x += mma_bf16_to_f32((st_bf16)(gu & 0xffffu)) *
				     mma_bf16_to_f32((st_bf16)(ou & 0xffffu));
				x += mma_bf16_to_f32((st_bf16)(gu >> 16)) *
				     mma_bf16_to_f32((st_bf16)(ou >> 16));
			}
		}
		x = mma_group_sum(x);
		if (part == 0 && r < n) {
			d_s[r] = row < T ? x : 0.0f;
			lse_s[r] = row < T ? lse_h[row] : 0.0f;
		}
	}
}

/* A gradient pair at p += (x0, x1): fp32, or bf16 read, added, rounded. */
__device__ __forceinline__ void ab_acc2(float *p, float x0, float x1)
{
	p[0] += x0;
	p[1] += x1;
}

__device__ __forceinline__ void ab_acc2(st_bf16 *p, float x0, float x1)
{
	const uint32_t u = mma_ld_u32(p);
	mma_st_u32(p, mma_pack_bf16x2(mma_bf16_to_f32((st_bf16)(u & 0xffffu)) + x0,
				      mma_bf16_to_f32((st_bf16)(u >> 16)) + x1));
}

/* ---- forward ---------------------------------------------------------------- */

template <int HS>
__global__ void __launch_bounds__(AB_THREADS) ab_fwd_kernel(ab_params p)
{
	constexpr int LD = HS + AB_PAD, LDT = AB_KF + AB_PAD;
	extern __shared__ float smem[];
	st_bf16 *Qs = (st_bf16 *)smem;   /* AB_TILE x LD */
	st_bf16 *Ks = Qs + AB_TILE * LD; /* AB_KF x LD */
	st_bf16 *Vt = Ks + AB_KF * LD;   /* HS x LDT: V transposed */
	const int bh = blockIdx.x, b = bh / p.NH, h = bh - b * p.NH, kh = h / (p.NH / p.NKV);
	const int T = p.T, i0 = blockIdx.y * AB_TILE;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
	const st_bf16 *q = p.q + (size_t)b * T * p.ldq + (size_t)h * HS;
	const st_bf16 *k = p.k + (size_t)b * T * p.ldk + (size_t)kh * HS;
	const st_bf16 *v = p.v + (size_t)b * T * p.ldk + (size_t)kh * HS;
	const int rw = i0 + warp * 16;             /* the warp's first query */
	const int rows[2] = { rw + g, rw + g + 8 }; /* this lane's two */
	const int *seg_b = p.seg ? p.seg + (size_t)b * T : NULL;
	/* their first keys: their documents' starts (0 without) */
	const int lo[2] = { seg_b && rows[0] < T ? seg_b[rows[0]] : 0,
			    seg_b && rows[1] < T ? seg_b[rows[1]] : 0 };

	ab_load_rows<HS>(Qs, LD, q, p.ldq, i0, AB_TILE, T);
	__syncthreads();
	uint32_t qa[HS / 16][4];
#pragma unroll
	for (int kk = 0; kk < HS / 16; kk++)
		mma_load_a(qa[kk], Qs + warp * 16 * LD + kk * 16, LD);

	float o[HS / 8][4], m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };
#pragma unroll
	for (int dt = 0; dt < HS / 8; dt++)
		o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

	const int kend = min(T, i0 + AB_TILE);
	/* from the key tile of the block's first document start */
	const int jfirst = seg_b ? ab_seg_min(seg_b, i0, AB_TILE, T) / AB_KF * AB_KF : 0;
	for (int j0 = jfirst; j0 < kend; j0 += AB_KF) {
		__syncthreads(); /* the previous key tile is consumed */
		ab_load_rows<HS>(Ks, LD, k, p.ldk, j0, AB_KF, T);
		ab_load_rows_t<HS>(Vt, LDT, v, p.ldk, j0, AB_KF, T);
		__syncthreads();
		if (j0 > rw + 15) /* warp-uniform: every key after the warp's rows */
			continue;
		float s[AB_KF / 8][4];
#pragma unroll
		for (int nt = 0; nt < AB_KF / 8; nt++) {
			s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
			if (j0 + nt * 8 > rw + 15) /* warp-uniform; masked below */
				continue;
#pragma unroll
			for (int kk = 0; kk < HS / 16; kk++) {
				uint32_t bb[2];
				mma_load_b(bb, Ks + nt * 8 * LD + kk * 16, LD);
				mma_bf16_16816(s[nt], qa[kk], bb);
			}
		}
		/* scale, mask (key after query, or past T), online softmax */
		float mx[2] = { m[0], m[1] };
#pragma unroll
		for (int nt = 0; nt < AB_KF / 8; nt++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int col = j0 + nt * 8 + 2 * t + (e & 1), row = rows[e >> 1];
				const bool vis = col <= row && col < T && col >= lo[e >> 1];
				const float x = vis ? s[nt][e] * p.scale : -INFINITY;
				s[nt][e] = x;
				mx[e >> 1] = fmaxf(mx[e >> 1], x);
			}
		float alpha[2], mu[2], rs[2] = { 0.0f, 0.0f };
#pragma unroll
		for (int r = 0; r < 2; r++) {
			/* causal, key j0 <= i0 <= row is visible to every row: mx is
			 * finite; a packed row may see none of this tile yet (mx and
			 * m -inf): mu 0 keeps its p 0, alpha 0 and its l, o 0 */
			mx[r] = mma_group_max(mx[r]);
			mu[r] = mx[r] == -INFINITY ? 0.0f : mx[r];
			alpha[r] = expf(m[r] - mu[r]); /* 0 on the first tile */
			m[r] = mx[r];
		}
#pragma unroll
		for (int nt = 0; nt < AB_KF / 8; nt++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const float pe = expf(s[nt][e] - mu[e >> 1]);
				s[nt][e] = pe;
				rs[e >> 1] += pe;
			}
#pragma unroll
		for (int r = 0; r < 2; r++)
			l[r] = l[r] * alpha[r] + mma_group_sum(rs[r]);
#pragma unroll
		for (int dt = 0; dt < HS / 8; dt++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				o[dt][e] *= alpha[e >> 1];
		/* O += P V, P as bf16 A fragments straight from the accumulators */
#pragma unroll
		for (int kk = 0; kk < AB_KF / 16; kk++) {
			if (j0 + kk * 16 > rw + 15) /* warp-uniform: P is 0 there */
				continue;
			uint32_t pa[4];
			mma_a_from_c(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
			for (int dt = 0; dt < HS / 8; dt++) {
				uint32_t bb[2];
				mma_load_b(bb, Vt + dt * 8 * LDT + kk * 16, LDT);
				mma_bf16_16816(o[dt], pa, bb);
			}
		}
	}
	st_bf16 *out = p.out + (size_t)b * T * p.ldo + (size_t)h * HS;
#pragma unroll
	for (int r = 0; r < 2; r++) {
		const int row = rows[r];
		if (row >= T)
			continue;
		const float inv = 1.0f / l[r];
#pragma unroll
		for (int dt = 0; dt < HS / 8; dt++)
			mma_st_u32(out + (size_t)row * p.ldo + dt * 8 + 2 * t,
				   mma_pack_bf16x2(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv));
		if (t == 0)
			p.lse[(size_t)bh * T + row] = m[r] + logf(l[r]);
	}
}

/* ---- backward: dK, dV ---------------------------------------------------------- */

/* Both backward passes' two products over the head: with the warp's 16
 * rows of A1 and A2 and the AB_SUB rows of B1 and B2 (row stride ld),
 * s[nt] = A1 . B1[nt*8 ..]^T and dp[nt] = A2 . B2[nt*8 ..]^T, as 16x8 MMA
 * tiles from zero, k in steps of 16 over HS. */
template <int HS>
__device__ __forceinline__ void ab_mma_pair(float s[AB_SUB / 8][4], float dp[AB_SUB / 8][4],
					    const st_bf16 *A1, const st_bf16 *A2,
					    const st_bf16 *B1, const st_bf16 *B2, int ld)
{
#pragma unroll
	for (int nt = 0; nt < AB_SUB / 8; nt++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
	for (int kk = 0; kk < HS / 16; kk++) {
		uint32_t a1[4], a2[4];
		mma_load_a(a1, A1 + kk * 16, ld);
		mma_load_a(a2, A2 + kk * 16, ld);
#pragma unroll
		for (int nt = 0; nt < AB_SUB / 8; nt++) {
			uint32_t bb[2];
			mma_load_b(bb, B1 + nt * 8 * ld + kk * 16, ld);
			mma_bf16_16816(s[nt], a1, bb);
			mma_load_b(bb, B2 + nt * 8 * ld + kk * 16, ld);
			mma_bf16_16816(dp[nt], a2, bb);
		}
	}
}

template <int HS, typename G>
__global__ void __launch_bounds__(AB_THREADS) ab_bwd_dkv_kernel(ab_params p)
{
	constexpr int LD = HS + AB_PAD, LDT = AB_SUB + AB_PAD;
	extern __shared__ float smem[];
	st_bf16 *Ks = (st_bf16 *)smem;   /* AB_TILE x LD */
	st_bf16 *Vs = Ks + AB_TILE * LD; /* AB_TILE x LD */
	st_bf16 *Qs = Vs + AB_TILE * LD; /* AB_SUB x LD */
	st_bf16 *Gs = Qs + AB_SUB * LD;  /* dO, AB_SUB x LD */
	st_bf16 *Qt = Gs + AB_SUB * LD;  /* HS x LDT */
	st_bf16 *Gt = Qt + HS * LDT;     /* HS x LDT */
	float *lse_s = (float *)(Gt + HS * LDT);
	float *d_s = lse_s + AB_SUB;
	const int bk = blockIdx.x, b = bk / p.NKV, kh = bk - b * p.NKV, rep = p.NH / p.NKV;
	const int T = p.T, j0 = blockIdx.y * AB_TILE;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
	const size_t koff = (size_t)b * T * p.ldk + (size_t)kh * HS;
	const int jw = j0 + warp * 16;            /* the warp's first key */
	const int keys[2] = { jw + g, jw + g + 8 }; /* this lane's two */
	const int *seg_b = p.seg ? p.seg + (size_t)b * T : NULL;

	ab_load_rows<HS>(Ks, LD, p.k + koff, p.ldk, j0, AB_TILE, T);
	ab_load_rows<HS>(Vs, LD, p.v + koff, p.ldk, j0, AB_TILE, T);

	float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
	for (int dt = 0; dt < HS / 8; dt++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			dk[dt][e] = dv[dt][e] = 0.0f;

	for (int gi = 0; gi < rep; gi++) {
		const int h = kh * rep + gi;
		const size_t qoff = (size_t)b * T * p.ldq + (size_t)h * HS;
		const size_t ooff = (size_t)b * T * p.ldo + (size_t)h * HS;
		const st_bf16 *q = p.q + qoff, *gd = p.dout + ooff, *o = p.o + ooff;
		const float *lse_h = p.lse + ((size_t)b * p.NH + h) * T;
		/* query tiles that see a key of this tile: from j0 on */
		for (int i0 = j0; i0 < T; i0 += AB_SUB) {
			/* packed: no query of the tile sees a key of this one */
			if (seg_b && ab_seg_min(seg_b, i0, AB_SUB, T) >= j0 + AB_TILE)
				continue;
			__syncthreads(); /* the previous query tile is consumed */
			ab_load_rows<HS>(Qs, LD, q, p.ldq, i0, AB_SUB, T);
			ab_load_rows<HS>(Gs, LD, gd, p.ldo, i0, AB_SUB, T);
			ab_load_rows_t<HS>(Qt, LDT, q, p.ldq, i0, AB_SUB, T);
			ab_load_rows_t<HS>(Gt, LDT, gd, p.ldo, i0, AB_SUB, T);
			ab_load_lse_d<HS>(lse_s, d_s, lse_h, gd, o, p.ldo, i0, AB_SUB, T);
			__syncthreads();
			if (i0 + AB_SUB - 1 < jw) /* warp-uniform: no query sees these keys */
				continue;
			float s[AB_SUB / 8][4], dp[AB_SUB / 8][4];
			ab_mma_pair<HS>(s, dp, Ks + warp * 16 * LD, Vs + warp * 16 * LD, Qs, Gs, LD);
			/* P^T and dS^T: rows are keys, columns queries */
#pragma unroll
			for (int nt = 0; nt < AB_SUB / 8; nt++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const int ql = nt * 8 + 2 * t + (e & 1), qi = i0 + ql;
					const int key = keys[e >> 1];
					const bool vis = qi >= key && qi < T && key < T &&
							 (!seg_b || key >= seg_b[qi]);
					const float pe =
						vis ? expf(s[nt][e] * p.scale - lse_s[ql]) : 0.0f;
					s[nt][e] = pe;
					dp[nt][e] = pe * (dp[nt][e] - d_s[ql]);
				}
			/* dV += P^T dO, dK += dS^T Q (scale applied at the end) */
#pragma unroll
			for (int kk = 0; kk < AB_SUB / 16; kk++) {
				uint32_t pa[4], da[4];
				mma_a_from_c(pa, s[2 * kk], s[2 * kk + 1]);
				mma_a_from_c(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
				for (int dt = 0; dt < HS / 8; dt++) {
					uint32_t bb[2];
					mma_load_b(bb, Gt + dt * 8 * LDT + kk * 16, LDT);
					mma_bf16_16816(dv[dt], pa, bb);
					mma_load_b(bb, Qt + dt * 8 * LDT + kk * 16, LDT);
					mma_bf16_16816(dk[dt], da, bb);
				}
			}
		}
	}
	G *dk_h = (G *)p.dk + koff, *dv_h = (G *)p.dv + koff;
#pragma unroll
	for (int r = 0; r < 2; r++) {
		const int key = keys[r];
		if (key >= T)
			continue;
#pragma unroll
		for (int dt = 0; dt < HS / 8; dt++) {
			const size_t at = (size_t)key * p.ldk + dt * 8 + 2 * t;
			ab_acc2(dk_h + at, p.scale * dk[dt][2 * r], p.scale * dk[dt][2 * r + 1]);
			ab_acc2(dv_h + at, dv[dt][2 * r], dv[dt][2 * r + 1]);
		}
	}
}

/* ---- backward: dQ ------------------------------------------------------------- */

template <int HS, typename G>
__global__ void __launch_bounds__(AB_THREADS) ab_bwd_dq_kernel(ab_params p)
{
	constexpr int LD = HS + AB_PAD, LDT = AB_SUB + AB_PAD;
	extern __shared__ float smem[];
	st_bf16 *Qs = (st_bf16 *)smem;   /* AB_TILE x LD */
	st_bf16 *Gs = Qs + AB_TILE * LD; /* dO, AB_TILE x LD */
	st_bf16 *Ks = Gs + AB_TILE * LD; /* AB_SUB x LD */
	st_bf16 *Vs = Ks + AB_SUB * LD;  /* AB_SUB x LD */
	st_bf16 *Kt = Vs + AB_SUB * LD;  /* HS x LDT */
	float *lse_s = (float *)(Kt + HS * LDT);
	float *d_s = lse_s + AB_TILE;
	const int bh = blockIdx.x, b = bh / p.NH, h = bh - b * p.NH, kh = h / (p.NH / p.NKV);
	const int T = p.T, i0 = blockIdx.y * AB_TILE;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
	const size_t qoff = (size_t)b * T * p.ldq + (size_t)h * HS;
	const size_t ooff = (size_t)b * T * p.ldo + (size_t)h * HS;
	const size_t koff = (size_t)b * T * p.ldk + (size_t)kh * HS;
	const st_bf16 *k = p.k + koff, *v = p.v + koff;
	const int rw = i0 + warp * 16;
	const int rows[2] = { rw + g, rw + g + 8 };
	const int *seg_b = p.seg ? p.seg + (size_t)b * T : NULL;

	ab_load_rows<HS>(Qs, LD, p.q + qoff, p.ldq, i0, AB_TILE, T);
	ab_load_rows<HS>(Gs, LD, p.dout + ooff, p.ldo, i0, AB_TILE, T);
	ab_load_lse_d<HS>(lse_s, d_s, p.lse + (size_t)bh * T, p.dout + ooff, p.o + ooff, p.ldo, i0,
			  AB_TILE, T);

	float dq[HS / 8][4];
#pragma unroll
	for (int dt = 0; dt < HS / 8; dt++)
		dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;

	const int kend = min(T, i0 + AB_TILE);
	const int jfirst = seg_b ? ab_seg_min(seg_b, i0, AB_TILE, T) / AB_SUB * AB_SUB : 0;
	for (int j0 = jfirst; j0 < kend; j0 += AB_SUB) {
		__syncthreads();
		ab_load_rows<HS>(Ks, LD, k, p.ldk, j0, AB_SUB, T);
		ab_load_rows<HS>(Vs, LD, v, p.ldk, j0, AB_SUB, T);
		ab_load_rows_t<HS>(Kt, LDT, k, p.ldk, j0, AB_SUB, T);
		__syncthreads();
		if (j0 > rw + 15) /* warp-uniform */
			continue;
		float s[AB_SUB / 8][4], dp[AB_SUB / 8][4];
		ab_mma_pair<HS>(s, dp, Qs + warp * 16 * LD, Gs + warp * 16 * LD, Ks, Vs, LD);
#pragma unroll
		for (int nt = 0; nt < AB_SUB / 8; nt++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int col = j0 + nt * 8 + 2 * t + (e & 1), row = rows[e >> 1];
				const int rl = row - i0;
				const bool vis = col <= row && col < T && row < T &&
						 (!seg_b || col >= seg_b[row]);
				const float pe = vis ? expf(s[nt][e] * p.scale - lse_s[rl]) : 0.0f;
				dp[nt][e] = pe * (dp[nt][e] - d_s[rl]);
			}
#pragma unroll
		for (int kk = 0; kk < AB_SUB / 16; kk++) {
			uint32_t da[4];
			mma_a_from_c(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
			for (int dt = 0; dt < HS / 8; dt++) {
				uint32_t bb[2];
				mma_load_b(bb, Kt + dt * 8 * LDT + kk * 16, LDT);
				mma_bf16_16816(dq[dt], da, bb);
			}
		}
	}
	G *dq_h = (G *)p.dq + qoff;
#pragma unroll
	for (int r = 0; r < 2; r++) {
		const int row = rows[r];
		if (row >= T)
			continue;
#pragma unroll
		for (int dt = 0; dt < HS / 8; dt++)
			ab_acc2(dq_h + (size_t)row * p.ldq + dt * 8 + 2 * t, p.scale * dq[dt][2 * r],
				p.scale * dq[dt][2 * r + 1]);
	}
}

#endif /* ST_CUDA_ATTENTION_BF16_KERNELS_CUH */
