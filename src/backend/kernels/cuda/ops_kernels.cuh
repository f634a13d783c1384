/* Device code of the cuda ops (ops.cu and matmul.cu hold the host code,
 * ops.cu the design comment), with the launch geometry the host code
 * uses. Kept apart so that tests/cuda/test_ops_emu.cpp can compile these
 * exact kernels with a host C++ compiler, one std::thread per CUDA thread,
 * and hold them to the cpu kernels on machines without a GPU. So: only what
 * nvcc and that emulation (tests/cuda/cuda_emu.h) both accept -- the CUDA
 * builtins used here are __syncthreads, __syncthreads_or, __shfl_xor_sync,
 * __ballot_sync, __popc, __float_as_uint, __uint_as_float, min,
 * threadIdx/blockIdx/blockDim/gridDim and static __shared__ arrays; a new one
 * needs a shim there. */
#ifndef ST_CUDA_OPS_KERNELS_CUH
#define ST_CUDA_OPS_KERNELS_CUH

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "strata/rope.h"

#define ST_CUDA_MAX_GRID 65535                      /* grid-stride loops beyond */
#define ST_CUDA_ELEM_BLOCK 256                      /* threads, elementwise ops */
#define ST_CUDA_ROW_BLOCK 256                       /* threads, warp-per-row ops */
#define ST_CUDA_CE_BLOCK 512                        /* threads, block-per-row ops */
#define ST_CUDA_COL_TILE 32                         /* columns per colsum block */
#define ST_CUDA_COL_LANES 8                         /* row lanes per colsum block */
#define ST_CUDA_COL_CHUNK 256                       /* rows per colsum partial */
#define ST_CUDA_EMB_BLOCK 256                       /* threads, embedding scatter */
#define ST_CUDA_DEC_WARPS 4                         /* warps, decoder attention block */
#define ST_CUDA_DEC_MAX_HD 256                      /* its widest head: 8 channels a lane */

/* ---- launch geometry (host), shared with the emulation test ----------------- */

/* Blocks of per_block threads for a grid-stride loop over n_items. */
static inline unsigned grid_for(size_t n_items, unsigned per_block)
{
	size_t g = (n_items + per_block - 1) / per_block;
	if (g > ST_CUDA_MAX_GRID)
		g = ST_CUDA_MAX_GRID;
	return (unsigned)(g ? g : 1);
}

/* Warp-per-row kernels (layernorm): ST_CUDA_ROW_BLOCK threads a block. */
static inline unsigned grid_warp_rows(int n_rows)
{
	return grid_for((size_t)n_rows, (unsigned)(ST_CUDA_ROW_BLOCK / 32));
}

/* Block-per-item kernels (cross-entropy rows, embedding positions). */
static inline unsigned grid_block_items(int n_items)
{
	return (unsigned)(n_items < ST_CUDA_MAX_GRID ? n_items : ST_CUDA_MAX_GRID);
}

/* Column sums: chunks of ST_CUDA_COL_CHUNK rows, each with a partial sum row
 * of C floats in scratch; k_colsum_partial runs on colsum_grid x
 * colsum_block, k_colsum_final on grid_for(C, ST_CUDA_ELEM_BLOCK). */
static inline int colsum_chunks(int N)
{
	return (N + ST_CUDA_COL_CHUNK - 1) / ST_CUDA_COL_CHUNK;
}

static inline dim3 colsum_block(void)
{
	return dim3(ST_CUDA_COL_TILE, ST_CUDA_COL_LANES);
}

static inline dim3 colsum_grid(int C, int n_chunks)
{
	return dim3((unsigned)((C + ST_CUDA_COL_TILE - 1) / ST_CUDA_COL_TILE),
		    (unsigned)(n_chunks < ST_CUDA_MAX_GRID ? n_chunks : ST_CUDA_MAX_GRID));
}

/* ---- reductions (device) ---------------------------------------------------- */

static __device__ __forceinline__ float warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* Sum (or max) over the block; every thread gets the result. blockDim.x is
 * a multiple of 32. `sh` holds 32 floats; the leading barrier makes it safe
 * to call back to back. */
static __device__ float block_reduce(float v, float *sh, bool is_max)
{
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	int n_warps = blockDim.x >> 5;

	v = is_max ? warp_max(v) : warp_sum(v);
	__syncthreads();
	if (lane == 0)
		sh[warp] = v;
	__syncthreads();
	float r = is_max ? -INFINITY : 0.0f;
	for (int w = 0; w < n_warps; w++) /* same order in every thread */
		r = is_max ? fmaxf(r, sh[w]) : r + sh[w];
	return r;
}

/* ---- casts ----------------------------------------------------------------- */

static __global__ void k_bf16_to_f32(float *out, const uint16_t *in, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		out[i] = __uint_as_float((uint32_t)in[i] << 16);
}

/* Bit for bit st_cpu_bf16_from_f32: RNE, quiet NaN with sign, no flush. */
static __device__ __forceinline__ uint16_t bf16_from_f32(float f)
{
	uint32_t u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x0040u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

/* The I/O types a kernel may be instantiated for (one body for fp32 and
 * bf16, bf16 held as its bits): a value of either as fp32, and an fp32
 * value stored as either (bf16 rounded once, to nearest even). */
static __device__ __forceinline__ float bf16_f(uint16_t h)
{
	return __uint_as_float((uint32_t)h << 16);
}

static __device__ __forceinline__ float ld_f(const float *p, size_t i)
{
	return p[i];
}

static __device__ __forceinline__ float ld_f(const uint16_t *p, size_t i)
{
	return bf16_f(p[i]);
}

static __device__ __forceinline__ void st_f(float *p, size_t i, float v)
{
	p[i] = v;
}

static __device__ __forceinline__ void st_f(uint16_t *p, size_t i, float v)
{
	p[i] = bf16_from_f32(v);
}

static __global__ void k_f32_to_bf16(uint16_t *out, const float *in, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		out[i] = bf16_from_f32(in[i]);
}

/* ---- small elementwise kernels ---------------------------------------------- */

/* out (N,OC) rows = bias, or 0 without bias. */
static __global__ void k_fill_rows(float *out, const float *bias, size_t N, int OC)
{
	size_t n = N * (size_t)OC;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		out[i] = bias ? bias[i % (size_t)OC] : 0.0f;
}

/* C (M,N) with leading dimension ldc *= beta; beta 0 writes zeros (BLAS:
 * C is then not read, so a NaN there does not survive). */
static __global__ void k_scale(float *C, float beta, int M, int N, int ldc)
{
	size_t n = (size_t)M * (size_t)N;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float *c = C + (i / (size_t)N) * (size_t)ldc + i % (size_t)N;
		*c = beta == 0.0f ? 0.0f : beta * *c;
	}
}

#define ST_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define ST_GELU_A 0.044715f

/* exp(2u) as in the cpu kernel: saturated above 88 so e/(e+1) stays 1
 * instead of inf/inf. */
static __device__ __forceinline__ float gelu_e(float x)
{
	float arg = 2.0f * ST_GELU_K * (x + ST_GELU_A * x * x * x);
	return expf(fminf(arg, 88.0f));
}

static __global__ void k_gelu_fwd(float *out, const float *inp, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float x = inp[i];
		float e = gelu_e(x);
		float a = 1.0f / (e + 1.0f);
		out[i] = x * (e * a);
	}
}

/* The GELU of a bare product plus its bias in one pass: v = acc + bias (of
 * the row's column), pre = v when pre is not NULL, out = GELU(v), in the
 * order and rounding of the bias then k_gelu_fwd (pre and out may be acc). */
static __global__ void k_bias_gelu_fwd(float *out, float *pre, const float *acc,
				       const float *bias, size_t N, int OC)
{
	size_t n = N * (size_t)OC;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float x = acc[i] + bias[i % (size_t)OC];
		float e = gelu_e(x);
		float a = 1.0f / (e + 1.0f);
		if (pre)
			pre[i] = x;
		out[i] = x * (e * a);
	}
}

static __global__ void k_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float x = inp[i];
		float e = gelu_e(x);
		float a = 1.0f / (e + 1.0f);
		float ea = e * a;
		float du = ST_GELU_K * (1.0f + 3.0f * ST_GELU_A * x * x);
		float g = ea + 2.0f * x * (ea * a) * du;
		dinp[i] = g * dout[i];
	}
}

static __global__ void k_residual_fwd(float *out, const float *a, const float *b, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		out[i] = a[i] + b[i];
}

/* da and db may be the same buffer (then it gets 2 dout): one thread does
 * both updates of an element, in order. */
static __global__ void k_residual_bwd(float *da, float *db, const float *dout, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float g = dout[i];
		da[i] += g;
		db[i] += g;
	}
}

/* ---- column sums (deterministic, two passes) --------------------------------
 * Pass 1: block (COL_TILE, COL_LANES) over a tile of columns and a chunk of
 * COL_CHUNK rows; partial[chunk][c] (and, for layernorm, the normalised
 * weighted sum in partial2). Pass 2: one thread per column adds the chunks
 * in order. With inp == NULL it is a plain column sum of g. g is fp32 or
 * bf16 (TG, read through ld_f): the fp32 ops' and the bf16 path's dbias and
 * norm dweight share one body, and the order of every sum is fixed by the
 * geometry alone (lane ty sums rows ty, ty + COL_LANES, ... of its chunk;
 * the lanes, then the chunks, are added in index order). */
template <typename TG>
static __global__ void k_colsum_partial(float *partial, float *partial2, const TG *g,
					const float *inp, const float *mean,
					const float *rstd, int N, int C, int n_chunks)
{
	__shared__ float sh[ST_CUDA_COL_LANES][ST_CUDA_COL_TILE + 1];
	__shared__ float sh2[ST_CUDA_COL_LANES][ST_CUDA_COL_TILE + 1];
	int tx = threadIdx.x, ty = threadIdx.y;
	int c = blockIdx.x * ST_CUDA_COL_TILE + tx;

	for (int chunk = blockIdx.y; chunk < n_chunks; chunk += gridDim.y) {
		int r0 = chunk * ST_CUDA_COL_CHUNK;
		int r1 = min(r0 + ST_CUDA_COL_CHUNK, N);
		float acc = 0.0f, acc2 = 0.0f;
		if (c < C) {
			for (int r = r0 + ty; r < r1; r += ST_CUDA_COL_LANES) {
				float gv = ld_f(g, (size_t)r * C + c);
				acc += gv;
				if (inp) /* mean NULL: RMSNorm's g * x * rstd */
					acc2 += gv * ((inp[(size_t)r * C + c] - (mean ? mean[r] : 0.0f)) *
						      rstd[r]);
			}
		}
		sh[ty][tx] = acc;
		sh2[ty][tx] = acc2;
		__syncthreads();
		if (ty == 0 && c < C) {
			float s = 0.0f, s2 = 0.0f;
			for (int l = 0; l < ST_CUDA_COL_LANES; l++) {
				s += sh[l][tx];
				s2 += sh2[l][tx];
			}
			partial[(size_t)chunk * C + c] = s;
			if (partial2)
				partial2[(size_t)chunk * C + c] = s2;
		}
		__syncthreads();
	}
}

static __global__ void k_colsum_final(float *out, const float *partial, int C, int n_chunks)
{
	for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
		float s = 0.0f;
		for (int k = 0; k < n_chunks; k++)
			s += partial[(size_t)k * C + c];
		out[c] += s;
	}
}

/* ---- layernorm (a warp per row) ---------------------------------------------- */

/* Row n of the layernorm by its warp. The fused residual + layernorm runs
 * the same code on the row its lanes have just written (each lane reads
 * back only its own elements), so both give the same bits. */
static __device__ __forceinline__ void layernorm_row(float *out, float *mean, float *rstd,
						     const float *x, const float *weight,
						     const float *bias, int n, int C, int lane)
{
	float *o = out + (size_t)n * C;
	float s = 0.0f;
	for (int c = lane; c < C; c += 32)
		s += x[c];
	float m = warp_sum(s) / (float)C;
	float v = 0.0f;
	for (int c = lane; c < C; c += 32) {
		float d = x[c] - m;
		v += d * d;
	}
	float r = 1.0f / sqrtf(warp_sum(v) / (float)C + 1e-5f);
	for (int c = lane; c < C; c += 32)
		o[c] = (x[c] - m) * r * weight[c] + bias[c];
	if (lane == 0) {
		mean[n] = m;
		rstd[n] = r;
	}
}

static __global__ void k_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp,
				       const float *weight, const float *bias, int N, int C)
{
	int lane = threadIdx.x & 31;
	int wpb = blockDim.x >> 5;
	for (int n = blockIdx.x * wpb + (threadIdx.x >> 5); n < N; n += gridDim.x * wpb)
		layernorm_row(out, mean, rstd, inp + (size_t)n * C, weight, bias, n, C, lane);
}

/* res = a + b (k_residual_fwd's add), then the layernorm of res's row. */
static __global__ void k_residual_layernorm_fwd(float *res, float *out, float *mean, float *rstd,
						const float *a, const float *b,
						const float *weight, const float *bias, int N, int C)
{
	int lane = threadIdx.x & 31;
	int wpb = blockDim.x >> 5;
	for (int n = blockIdx.x * wpb + (threadIdx.x >> 5); n < N; n += gridDim.x * wpb) {
		float *x = res + (size_t)n * C;
		const float *ar = a + (size_t)n * C, *br = b + (size_t)n * C;
		for (int c = lane; c < C; c += 32)
			x[c] = ar[c] + br[c];
		layernorm_row(out, mean, rstd, x, weight, bias, n, C, lane);
	}
}

static __global__ void k_layernorm_bwd_dinp(float *dinp, const float *dout, const float *inp,
					    const float *weight, const float *mean,
					    const float *rstd, int N, int C)
{
	int lane = threadIdx.x & 31;
	int wpb = blockDim.x >> 5;
	for (int n = blockIdx.x * wpb + (threadIdx.x >> 5); n < N; n += gridDim.x * wpb) {
		const float *x = inp + (size_t)n * C;
		const float *g = dout + (size_t)n * C;
		float *dx = dinp + (size_t)n * C;
		float m = mean[n], r = rstd[n];
		float s_dn = 0.0f, s_dnn = 0.0f;
		for (int c = lane; c < C; c += 32) {
			float norm = (x[c] - m) * r;
			float dnorm = weight[c] * g[c];
			s_dn += dnorm;
			s_dnn += dnorm * norm;
		}
		s_dn = warp_sum(s_dn) / (float)C;
		s_dnn = warp_sum(s_dnn) / (float)C;
		for (int c = lane; c < C; c += 32) {
			float norm = (x[c] - m) * r;
			float dnorm = weight[c] * g[c];
			dx[c] += (dnorm - s_dn - norm * s_dnn) * r;
		}
	}
}

/* ---- embedding ---------------------------------------------------------------- */

static __global__ void k_embedding_fwd(float *out, const int32_t *tokens, const float *wte,
				       const float *wpe, int T, int C, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		size_t bt = i / (size_t)C;
		int c = (int)(i % (size_t)C);
		int t = (int)(bt % (size_t)T);
		out[i] = wte[(size_t)tokens[bt] * C + c] + wpe[(size_t)t * C + c];
	}
}

/* dwte: block per position p (grid-stride). Only the first position of
 * each token (its leader) does work: it owns that token's row of dwte and
 * adds the rows of dout of all positions with that token, in position
 * order, so no two blocks touch the same row and the order is fixed.
 * blockDim.x == ST_CUDA_EMB_BLOCK (a multiple of 32). O(BT^2) token
 * compares, cached and coalesced. */
static __global__ void k_embedding_bwd_wte(float *dwte, const float *dout,
					   const int32_t *tokens, int BT, int C)
{
	__shared__ int list[ST_CUDA_EMB_BLOCK];
	__shared__ int warp_cnt[ST_CUDA_EMB_BLOCK / 32];
	int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	int n_warps = blockDim.x >> 5;

	for (int p = blockIdx.x; p < BT; p += gridDim.x) {
		int tok = tokens[p];
		int seen = 0;
		for (int q = tid; q < p && !seen; q += blockDim.x)
			seen = tokens[q] == tok;
		if (__syncthreads_or(seen))
			continue; /* uniform across the block */
		float *row = dwte + (size_t)tok * C;
		for (int q0 = p; q0 < BT; q0 += blockDim.x) {
			int q = q0 + tid;
			int flag = q < BT && tokens[q] == tok;
			unsigned m = __ballot_sync(0xffffffffu, flag);
			if (lane == 0)
				warp_cnt[warp] = __popc(m);
			__syncthreads();
			int off = 0, total = 0;
			for (int w = 0; w < n_warps; w++) {
				if (w < warp)
					off += warp_cnt[w];
				total += warp_cnt[w];
			}
			off += __popc(m & ((1u << lane) - 1u));
			if (flag)
				list[off] = q;
			__syncthreads();
			for (int k = 0; k < total; k++) {
				const float *g = dout + (size_t)list[k] * C;
				for (int c = tid; c < C; c += blockDim.x)
					row[c] += g[c];
			}
			__syncthreads(); /* list and warp_cnt are reused */
		}
	}
}

/* dwpe (T,C) += sum over b of dout (b,t,:), b in order. */
static __global__ void k_embedding_bwd_wpe(float *dwpe, const float *dout, int B, int T, int C)
{
	size_t n = (size_t)T * C;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float s = 0.0f;
		for (int b = 0; b < B; b++)
			s += dout[(size_t)b * n + i];
		dwpe[i] += s;
	}
}

/* ---- cross-entropy (a block per row) ------------------------------------------- */

static __global__ void k_crossentropy_fwd(float *losses, const float *logits,
					  const int32_t *targets, int N, int V)
{
	__shared__ float sh[32];
	for (int n = blockIdx.x; n < N; n += gridDim.x) {
		const float *x = logits + (size_t)n * V;
		if (targets[n] < 0) { /* ignored (masked out): no loss */
			if (threadIdx.x == 0)
				losses[n] = 0.0f;
			continue; /* the whole block: no barrier skipped by some */
		}
		float mx = -INFINITY;
		for (int i = threadIdx.x; i < V; i += blockDim.x)
			mx = fmaxf(mx, x[i]);
		mx = block_reduce(mx, sh, true);
		float s = 0.0f;
		for (int i = threadIdx.x; i < V; i += blockDim.x)
			s += expf(x[i] - mx);
		s = block_reduce(s, sh, false);
		if (threadIdx.x == 0)
			losses[n] = mx + logf(s) - x[targets[n]];
	}
}

/* dlogits may be logits (in place): every read of a row happens before the
 * barrier inside the first block_reduce, except x[i] in the exp pass, which
 * the same thread reads and then overwrites. */
static __global__ void k_crossentropy_bwd(float *dlogits, float *losses, const float *logits,
					  const int32_t *targets, float dloss, int N, int V)
{
	__shared__ float sh[32];
	__shared__ float xt_sh;
	for (int n = blockIdx.x; n < N; n += gridDim.x) {
		const float *x = logits + (size_t)n * V;
		float *dx = dlogits + (size_t)n * V;
		int t = targets[n];
		if (t < 0) { /* ignored (masked out): no loss, no gradient */
			if (losses && threadIdx.x == 0)
				losses[n] = 0.0f;
			for (int i = threadIdx.x; i < V; i += blockDim.x)
				dx[i] = 0.0f;
			continue; /* the whole block: no barrier skipped by some */
		}
		if (threadIdx.x == 0)
			xt_sh = x[t];
		float mx = -INFINITY;
		for (int i = threadIdx.x; i < V; i += blockDim.x)
			mx = fmaxf(mx, x[i]);
		mx = block_reduce(mx, sh, true); /* barrier: xt_sh is set */
		float xt = xt_sh;
		float s = 0.0f;
		for (int i = threadIdx.x; i < V; i += blockDim.x) {
			float e = expf(x[i] - mx);
			dx[i] = e;
			s += e;
		}
		s = block_reduce(s, sh, false);
		if (losses && threadIdx.x == 0)
			losses[n] = mx + logf(s) - xt;
		float scale = dloss / s;
		for (int i = threadIdx.x; i < V; i += blockDim.x) {
			float d = dx[i] * scale;
			dx[i] = i == t ? d - dloss : d;
		}
		__syncthreads(); /* xt_sh is rewritten for the next row */
	}
}

/* ---- LLaMA's ops -------------------------------------------------------------
 * Each templated over its I/O types (float, or uint16_t holding bf16): the
 * fp32 ops and the bf16 path's (docs/model.md, "bf16 compute") run one
 * body, the arithmetic fp32 either way. */

/* RMSNorm, a warp per row: out = weight * (x * rstd), x fp32. */
template <typename TO, typename TW>
static __device__ __forceinline__ void rmsnorm_row(TO *out, float *rstd, const float *x,
						   const TW *weight, float eps, int n, int C,
						   int lane)
{
	TO *o = out + (size_t)n * C;
	float s = 0.0f;
	for (int c = lane; c < C; c += 32)
		s += x[c] * x[c];
	float r = 1.0f / sqrtf(warp_sum(s) / (float)C + eps);
	for (int c = lane; c < C; c += 32)
		st_f(o, c, ld_f(weight, c) * (x[c] * r));
	if (lane == 0)
		rstd[n] = r;
}

template <typename TO, typename TW>
static __global__ void k_rmsnorm_fwd(TO *out, float *rstd, const float *inp, const TW *weight,
				     float eps, int N, int C)
{
	int lane = threadIdx.x & 31;
	int wpb = blockDim.x >> 5;
	for (int n = blockIdx.x * wpb + (threadIdx.x >> 5); n < N; n += gridDim.x * wpb)
		rmsnorm_row(out, rstd, inp + (size_t)n * C, weight, eps, n, C, lane);
}

/* res = a + b (fp32), then the RMSNorm of res's row (as
 * k_residual_layernorm_fwd). */
template <typename TO, typename TW>
static __global__ void k_residual_rmsnorm_fwd(float *res, TO *out, float *rstd, const float *a,
					      const float *b, const TW *weight, float eps,
					      int N, int C)
{
	int lane = threadIdx.x & 31;
	int wpb = blockDim.x >> 5;
	for (int n = blockIdx.x * wpb + (threadIdx.x >> 5); n < N; n += gridDim.x * wpb) {
		float *x = res + (size_t)n * C;
		const float *ar = a + (size_t)n * C, *br = b + (size_t)n * C;
		for (int c = lane; c < C; c += 32)
			x[c] = ar[c] + br[c];
		rmsnorm_row(out, rstd, x, weight, eps, n, C, lane);
	}
}

/* dinp (fp32) += r (w g) - x r^3 mean(w g x), a warp per row. */
template <typename TD, typename TW>
static __global__ void k_rmsnorm_bwd_dinp(float *dinp, const TD *dout, const float *inp,
					  const TW *weight, const float *rstd, int N, int C)
{
	int lane = threadIdx.x & 31;
	int wpb = blockDim.x >> 5;
	for (int n = blockIdx.x * wpb + (threadIdx.x >> 5); n < N; n += gridDim.x * wpb) {
		const float *x = inp + (size_t)n * C;
		const TD *g = dout + (size_t)n * C;
		float *dx = dinp + (size_t)n * C;
		float r = rstd[n], s = 0.0f;
		for (int c = lane; c < C; c += 32)
			s += ld_f(weight, c) * ld_f(g, c) * x[c];
		float k = warp_sum(s) / (float)C * r * r * r;
		for (int c = lane; c < C; c += 32)
			dx[c] += ld_f(weight, c) * ld_f(g, c) * r - x[c] * k;
	}
}

/* Rotary embeddings: a thread per (row, head, pair), row r at position
 * pos0 + r % T; sign -1 rotates back (the backward). out may be inp: a
 * thread reads its two channels before it writes them. */
template <typename TV>
static __global__ void k_rope(TV *out, const TV *inp, int T, int pos0, int NH, int hd,
			      int stride, size_t n_pairs, int type, int original_ctx, float theta,
			      float factor, float lo, float hi, float sign)
{
	const int half = hd / 2;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_pairs;
	     i += (size_t)gridDim.x * blockDim.x) {
		int j = (int)(i % (size_t)half);
		size_t rh = i / (size_t)half;
		int h = (int)(rh % (size_t)NH);
		size_t row = rh / (size_t)NH;
		float inv = st_rope_inv_freq(j, hd, theta, type, factor, lo, hi, original_ctx);
		float c, sn;
		st_rope_cos_sin(inv, pos0 + (int)(row % (size_t)T), &c, &sn);
		sn *= sign;
		size_t base = row * (size_t)stride + (size_t)h * hd;
		float x1 = ld_f(inp, base + j), x2 = ld_f(inp, base + j + half);
		st_f(out, base + j, x1 * c - x2 * sn);
		st_f(out, base + j + half, x2 * c + x1 * sn);
	}
}

template <typename T>
static __global__ void k_swiglu_fwd(T *out, const T *gate, const T *up, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float g = ld_f(gate, i);
		float s = 1.0f / (1.0f + expf(fminf(-g, 88.0f)));
		st_f(out, i, g * s * ld_f(up, i));
	}
}

/* Overwrites dgate and dup (either may be gate or up). */
template <typename T>
static __global__ void k_swiglu_bwd(T *dgate, T *dup, const T *dout, const T *gate,
				    const T *up, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float g = ld_f(gate, i), u = ld_f(up, i), d = ld_f(dout, i);
		float s = 1.0f / (1.0f + expf(fminf(-g, 88.0f)));
		float silu = g * s;
		st_f(dgate, i, d * u * (s * (1.0f + g * (1.0f - s))));
		st_f(dup, i, d * silu);
	}
}

/* out (N,C) fp32 = wte[tokens] (the scatter back is k_embedding_bwd_wte);
 * a bf16 table widens exactly. */
template <typename TW>
static __global__ void k_token_embed_fwd(float *out, const int32_t *tokens, const TW *wte,
					 int C, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		size_t r = i / (size_t)C;
		out[i] = ld_f(wte, (size_t)tokens[r] * C + i % (size_t)C);
	}
}

/* The decoder's attention (DECODE_ATTENTION): a block per (head h, row i),
 * grid (NH, n). Row i, at position pos + i, attends over cache rows
 * 0 .. pos + i. Warp w takes keys w, w + ST_CUDA_DEC_WARPS, ...; a lane holds
 * channels lane, lane + 32, ... of q and of its share of the output. Two
 * passes over the keys, as the cpu's: the max of the scores, then the sum of
 * exp(s - max) (in double) with the weighted values, the warps' parts added
 * in shared memory at the end. A warp's dot product ends in warp_sum(), whose
 * butterfly gives every lane the same bits. */
static __device__ __forceinline__ float dec_dot(const float *qv, const float *k, int hd)
{
	const int lane = threadIdx.x & 31;
	float s = 0.0f;

	for (int j = 0; j * 32 + lane < hd; j++)
		s += qv[j] * k[j * 32 + lane];
	return warp_sum(s);
}

static __global__ void k_decode_attention(float *out, const float *q, const float *kc,
					  const float *vc, int pos, int NH, int NKV, int hd,
					  int sq)
{
	__shared__ float s_max[ST_CUDA_DEC_WARPS];
	__shared__ double s_sum[ST_CUDA_DEC_WARPS];
	__shared__ float s_acc[ST_CUDA_DEC_WARPS][ST_CUDA_DEC_MAX_HD];
	const int h = (int)blockIdx.x, i = (int)blockIdx.y, T = pos + i + 1;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, skv = NKV * hd;
	const float scale = 1.0f / sqrtf((float)hd);
	const float *k = kc + (size_t)(h / (NH / NKV)) * hd, *v = vc + (size_t)(h / (NH / NKV)) * hd;
	float qv[ST_CUDA_DEC_MAX_HD / 32], acc[ST_CUDA_DEC_MAX_HD / 32], mx = -INFINITY;
	double sum = 0.0;

	for (int j = 0; j < ST_CUDA_DEC_MAX_HD / 32; j++) {
		int d = j * 32 + lane;
		qv[j] = d < hd ? q[(size_t)i * sq + (size_t)h * hd + d] : 0.0f;
		acc[j] = 0.0f;
	}
	for (int t = warp; t < T; t += ST_CUDA_DEC_WARPS)
		mx = fmaxf(mx, dec_dot(qv, k + (size_t)t * skv, hd) * scale);
	if (lane == 0)
		s_max[warp] = mx;
	__syncthreads();
	for (int w = 0; w < ST_CUDA_DEC_WARPS; w++)
		mx = fmaxf(mx, s_max[w]);
	for (int t = warp; t < T; t += ST_CUDA_DEC_WARPS) {
		float e = expf(dec_dot(qv, k + (size_t)t * skv, hd) * scale - mx);

		sum += (double)e;
		for (int j = 0; j * 32 + lane < hd; j++)
			acc[j] += e * v[(size_t)t * skv + j * 32 + lane];
	}
	for (int j = 0; j * 32 + lane < hd; j++)
		s_acc[warp][j * 32 + lane] = acc[j];
	if (lane == 0)
		s_sum[warp] = sum;
	__syncthreads();
	sum = 0.0;
	for (int w = 0; w < ST_CUDA_DEC_WARPS; w++)
		sum += s_sum[w];
	for (int d = threadIdx.x; d < hd; d += blockDim.x) {
		float o = 0.0f;

		for (int w = 0; w < ST_CUDA_DEC_WARPS; w++)
			o += s_acc[w][d];
		out[(size_t)i * NH * hd + (size_t)h * hd + d] = (float)((double)o / sum);
	}
}

#endif
